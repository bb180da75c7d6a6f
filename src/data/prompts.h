/* Prompts given as JSON (verl's schema): chat messages {"role", "content"}, and JSONL files of rows
 * with a "prompt" field (moerl generate --prompts; moerl tokenize --chat). */
#ifndef MOERL_DATA_PROMPTS_H
#define MOERL_DATA_PROMPTS_H

#include <jansson.h>

#include "data/dataset.h"
#include "data/tokenizer.h"

/* A JSON list of {"role": string, "content": string} messages → *msgs (heap array of *n entries,
 * at least one allocated; the strings point into list, valid while it lives). Returns -1 when every
 * message is well formed, else the index of the first one that is not (then *msgs is NULL). */
int chat_msgs_from_json(const json_t *list, chat_msg **msgs, int *n);

/* The prompts of a JSONL file: every non-blank line an object with "prompt", either a non-empty
 * list of {"role", "content"} messages or a string (one user message); other fields are ignored.
 * Each prompt is checked against the current tokenizer's chat template and encoded with the
 * generation prompt (tok_chat_encode). On success *out holds *n_out ≥ 1 token sequences (the
 * caller frees each with tok_seq_free, then the array). Errors name file:line and what was
 * expected ("field 'prompt': expected ..."), or the file when it has no prompts. */
int prompt_file_read(const char *path, tok_seq **out, int *n_out);
/* Every row's prompt of ds can be rendered by the current tokenizer's chat template
 * (tokenizer_chat_check). The error names the row (dataset_where) and what is wrong. */
int dataset_check_prompts(const dataset *ds);

#endif
