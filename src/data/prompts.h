/* Prompts given as JSON (verl's schema): chat messages {"role", "content", ...}, the object shape of
 * apply_chat_template's arguments, and JSONL files of rows with a "prompt" field (moerl generate
 * --prompts; moerl tokenize --chat). */
#ifndef MOERL_DATA_PROMPTS_H
#define MOERL_DATA_PROMPTS_H

#include <jansson.h>

#include "data/dataset.h"
#include "data/tokenizer.h"

/* A JSON list of messages → *msgs (heap array of *n entries, at least one allocated; the strings
 * and msg objects point into list, valid while it lives). A message is an object with a string
 * "role" and a "content" that is a string, null or a list of parts (absent only beside
 * "tool_calls"); a message with other keys or a content that is not a string gets msg (the whole
 * object, borrowed). Returns -1 when every message is well formed, else the index of the first
 * one that is not (then *msgs is NULL). */
int chat_msgs_from_json(const json_t *list, chat_msg **msgs, int *n);

/* A conversation as apply_chat_template takes it. */
typedef struct {
    chat_msg *msgs;            /* [n], from chat_msgs_from_json (borrowed from the JSON read) */
    int n;
    chat_extra x;              /* tools (borrowed) and vars (owned: a new object), each may be NULL */
    int add_generation_prompt; /* -1 when not given, else 0/1 */
} chat_call;

/* v → *c: either a non-empty JSON list of messages, or an object {"messages": [...], "tools":
 * [...], "add_generation_prompt": bool, any other key → a template variable in c->x.vars (e.g.
 * "enable_thinking": false)}. Errors (MOERL_ERR, *c empty) name the key or message and what
 * was expected; v must outlive c. Free with chat_call_free. */
int chat_call_from_json(const json_t *v, chat_call *c);
void chat_call_free(chat_call *c);

/* The prompts of a JSONL file: every non-blank line an object with "prompt" — a non-empty list of
 * messages (chat_msgs_from_json) with the row's optional "tools" list beside it (the dataset
 * schema), a string (one user message), or the object shape of chat_call_from_json — or itself
 * in that object shape (a "messages" field; every other field is then a template variable). Other
 * fields of a "prompt" row are ignored. Each prompt is rendered by the current tokenizer's chat
 * template and encoded, with the generation prompt unless the object says
 * "add_generation_prompt": false. A line's "enable_thinking" while the tokenizer's is false (the
 * caller's --no-thinking) is an error: both were given. On success *out holds *n_out ≥ 1 token sequences (the
 * caller frees each with tok_seq_free, then the array). Errors name file:line and what was
 * expected ("field 'prompt': expected ..."), or the file when it has no prompts. */
int prompt_file_read(const char *path, tok_seq **out, int *n_out);
/* Every row's prompt of ds, with its tools, can be rendered by the current tokenizer's chat
 * template (tokenizer_chat_check_ex). The error names the row (dataset_where) and what is wrong. */
int dataset_check_prompts(const dataset *ds);

#endif
