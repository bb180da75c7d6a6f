/* moerl — what the reward backends share (src/reward/: backend.c, proc.c, http.c); not a public
 * interface. */
#ifndef MOERL_REWARD_INTERNAL_H
#define MOERL_REWARD_INTERNAL_H

#include <jansson.h>

#include "reward/reward.h"

/* Split reward.command into argv as a POSIX shell splits words (wordexp with WRDE_NOCMD|WRDE_UNDEF:
 * quotes and backslashes, $VAR, ~ and globs; no command substitution, no | & ; < > ( ) { }).
 * *argv: argc heap strings and a NULL (free with reward_free_argv). Errors say what is refused. */
int reward_split_command(const char *command, char ***argv, int *argc);
void reward_free_argv(char **argv, int argc);

/* The JSON object of one request (the protocol of docs/rewards.md): data_source, solution_str,
 * ground_truth (a string, or the JSON value when ground_truth_json), extra_info (object or null),
 * prompt (list or null). Invalid UTF-8 in the strings becomes U+FFFD, as Python's
 * decode(errors="replace") does. NULL with an error naming the row (r->where) when a JSON field
 * does not parse. */
json_t *reward_request_json(const reward_request *r);

/* Read one answer: a number, or an object with a number "score"; the object's other numeric (and
 * boolean, as 0/1) fields become out's extras, its string "pred" out->pred; other fields are
 * ignored. The score must be finite. Errors (no prefix; the caller names the program and row)
 * describe the value. */
int reward_parse_answer(const json_t *v, reward_result *out);
/* Parse one answer from text (a line or a list item): as reward_parse_answer, with NaN / Infinity
 * (which Python's json.dumps writes and JSON refuses) named as a non-finite score. */
int reward_parse_answer_text(const char *text, size_t len, reward_result *out);

/* Free the fields of out[0..n) and zero them (a failed score call leaves nothing allocated). */
void reward_results_clear(reward_result *out, int n);

/* At most max bytes of s, on one line (newlines shown as \n), with "..." when cut: for messages. */
void reward_excerpt(const char *s, size_t len, char *dst, size_t cap);

/* The backends of reward_backend_create. */
reward_backend *reward_proc_create(const reward_config *c);
reward_backend *reward_http_create(const reward_config *c);

#endif
