/* Tool calls written by the model in an assistant turn, and the tool configuration
 * (rollout.multi_turn.tool_config_path).
 *
 * Format "hermes" (Qwen3, Hermes/Nous): each call is a block
 *     <tool_call>{"name": "calc", "arguments": {"expr": "2+3"}}</tool_call>
 * anywhere in the turn's text, several per turn, in order. A block that opens but never closes is
 * not a call (the turn ended mid-block: it stays text). A block that closes but does not hold a
 * call — invalid JSON, not an object, no string "name", "arguments" neither an object nor a string
 * holding a JSON object, or a name the tool config does not declare — is kept as a call with an
 * error message: the rollout answers it with that message as the tool response (the model sees its
 * mistake, as verl's tool agent loop does) and counts it as a tool error; it is never sent to an
 * environment.
 *
 * Tool config: a YAML file holding a list of tools (or a mapping whose `tools:` key holds it).
 * Each tool is an OpenAI function schema plus how moerl runs it:
 *     - type: function            # optional; "function" if given
 *       function:
 *         name: calc              # [A-Za-z0-9_.-]+, unique in the file
 *         description: Evaluate an arithmetic expression.
 *         parameters: {type: object, properties: {expr: {type: string}}, required: [expr]}
 *       command: python3 calc_env.py     # a program speaking JSON lines, or
 *       url: http://127.0.0.1:8000/tool  # a server taking the same JSON by POST
 * Plain YAML scalars follow YAML's core schema in the schema (null/~, true/false, integers,
 * floats); quoted scalars are strings. The schema ({"type": "function", "function": {...}}) is
 * what the chat template renders into the prompt.
 */
#ifndef MOERL_TOOL_CALLS_H
#define MOERL_TOOL_CALLS_H

#include <stddef.h>

#include "data/tokenizer.h"

typedef struct json_t json_t;

typedef struct {
    char *name;    /* the tool's function name */
    json_t *schema; /* {"type": "function", "function": {name, description?, parameters?}} (owned) */
    char *command; /* a JSON-lines program (sh -c command line), or NULL */
    char *url;     /* an HTTP endpoint, or NULL; exactly one of command/url is set */
} tool_def;

typedef struct {
    tool_def *tools;
    int n;
} tool_config;

/* Load a tool config file (format above). Errors name the file, the tool (index and name) and the
 * key: not YAML, not a list of mappings, an unknown key, a missing or malformed function name, a
 * duplicate name, parameters not a mapping, neither or both of command/url, an empty file. */
int tool_config_load(const char *path, tool_config *out);
/* The same from YAML text; `name` stands for the file in messages. */
int tool_config_load_string(const char *text, size_t len, const char *name, tool_config *out);
void tool_config_free(tool_config *tc);
/* Index of the tool named `name`, or -1. */
int tool_config_find(const tool_config *tc, const char *name);
/* The schemas as a new JSON array (the `tools` a chat template renders). */
json_t *tool_config_schemas(const tool_config *tc);

typedef struct {
    char *name;      /* the called tool's name; NULL when the block has none */
    char *arguments; /* the arguments as compact JSON object text ("{}" when absent); NULL on error */
    char *error;     /* NULL for a well-formed call of a known tool; else the message the model is
                        shown as this call's tool response */
} tool_call;

typedef struct {
    tool_call *calls;
    int n;
    int n_errors;  /* calls with error != NULL */
    char *content; /* the turn's text outside the tool-call blocks, whitespace-trimmed */
} tool_calls;

/* Parse the hermes tool calls of a turn's text[0..len). tools: the known tools (an unknown name is
 * an error call), or NULL to accept any name. Never fails on the model's text: every malformed
 * block becomes an error call (see above); returns MOERL_OK, or MOERL_ERR only for a NULL text. */
int tool_calls_parse_hermes(const char *text, size_t len, const tool_config *tools, tool_calls *out);
void tool_calls_free(tool_calls *tc);

/* The ids of a tool turn's template text, so that the next assistant turn's input is the previous
 * ids, the sampled ids and these — nothing re-encoded. msgs[0..n_turn) is the conversation up to and
 * including the assistant turn just sampled (its content: the sampled text before its end-of-turn
 * token); msgs[n_turn..n) are the tool messages answering it (role "tool"). eot: the text of the
 * end-of-turn token the sampled ids end with ("<|im_end|>").
 * With P = render(msgs[0..n_turn)) and F = render(msgs[0..n), add_generation_prompt) under the
 * tokenizer's chat template (x: the tools and variables both renderings get, or NULL): k = the
 * template-written eots in P; the boundary b is the end of the
 * k-th template-written eot in F (the sampled turn's own); F[b..) must begin with what P has after
 * its last eot (e.g. the "\n" Qwen3 writes after <|im_end|>) and hold more; out gets the ids of
 * F[b..) encoded with F's template mask (control tokens only where the template wrote them, so a
 * tool response spelling "<|im_end|>" stays text). Errors (nothing appended): n_turn < 1, n ≤ n_turn,
 * msgs[n_turn − 1] not an assistant message, rendering errors, no template eot in P, F not
 * extending P at the boundary (the message shows both sides). */
int tool_turn_ids(const tokenizer *t, const chat_msg *msgs, int n_turn, int n, const chat_extra *x, const char *eot,
                  tok_seq *out);

#endif
