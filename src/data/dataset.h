/* moerl — JSONL datasets in verl's schema.
 *
 * One JSON object per line, with the fields verl's RLHFDataset reads from its parquet files
 * (verl/utils/dataset/rl_dataset.py; examples/data_preprocess/gsm8k.py writes them):
 *     "data_source":  string, selects the reward function (tasks.h: reward_fn_for)
 *     "prompt":       non-empty list of messages {"role": string, "content": string, ...}: content
 *                     may also be null or a list of parts, and be absent when the message has
 *                     "tool_calls"; every other key (tool_calls, reasoning_content, name,
 *                     tool_call_id, ...) is kept and reaches the chat template (chat_msg.msg)
 *     "tools":        list of tool specs (optional; objects, e.g. {"type": "function",
 *                     "function": {"name", "description", "parameters"}}), given to the chat
 *                     template with the prompt (as apply_chat_template's tools)
 *     "reward_model": {"style": "rule" (optional: absent means "rule"; another value is refused),
 *                      "ground_truth": string | number | object | list}
 *     "extra_info":   object (optional, kept as compact JSON text)
 *     "response":     string (optional; the SFT target), or a non-empty list of messages (verl's
 *                     multi-turn SFT shape: the conversation after the prompt, e.g. assistant,
 *                     tool, assistant, ...; each message as in "prompt"; the last one an
 *                     assistant message): the loss falls on the assistant turns only
 *                     (ds_row_encode_sft)
 * Other fields (verl's "ability", ...) are ignored. A ground truth given as a JSON object or list
 * (TinyZero/verl countdown: {"target": 24, "numbers": [...]}) is kept as its compact JSON text; a
 * number as Python's str() of it (2 → "2", 2.0 → "2.0", 1e16 → "1e+16": the built-in rewards' text),
 * also marked JSON so that a custom reward receives the number. Empty (all-whitespace) lines are
 * skipped, and so is a UTF-8 byte order mark at the start; a parquet file (magic "PAR1") is refused
 * with the command that converts it to JSONL. Any other departure is an error
 * "<path>:<line>: field '<name>': expected ..., got ..." and nothing is loaded.
 */
#ifndef MOERL_DATASET_H
#define MOERL_DATASET_H

#include <stdint.h>
#include <stdio.h>

#include "data/tokenizer.h"

typedef struct {
    char *data_source;
    chat_msg *prompt; /* [n_prompt]; a message's msg (a reference the row owns) when it is not plain */
    int n_prompt;
    json_t *tools;    /* the row's "tools" list (owned), or NULL */
    char *ground_truth;    /* a string, or the compact JSON text of an object/list */
    int ground_truth_json; /* 1: ground_truth is JSON text (an object, list or number in the file) */
    char *extra_info_json; /* compact JSON object text, or NULL when absent */
    char *response;        /* a string response; NULL when absent or a list of messages */
    chat_msg *resp_msgs;   /* [n_resp_msgs]: a response given as messages (as prompt), else NULL */
    int n_resp_msgs;
    int64_t line;          /* 1-based line in the source file */
} ds_row;

typedef struct {
    char *path;    /* the file, or for generated data a label naming what made it (generated = 1) */
    ds_row *rows;
    int64_t n;
    int generated; /* 1: the rows were generated (data.task), path is a label, not a file */
} dataset;

/* Read every row of the JSONL file at `path` into memory. On error *ds is left empty (n = 0)
 * and moerl_last_error() names the file, line, field and what was expected. */
int dataset_load(dataset *ds, const char *path);
/* Parse JSONL text held in memory; `name` stands for the path in messages. */
int dataset_load_string(dataset *ds, const char *text, size_t len, const char *name);
int64_t dataset_count(const dataset *ds);
/* How a message names row `line` of ds (line > 0) or the whole data (line 0), into buf[n]: "FILE:LINE"
 * / "'FILE'" for a file, "line LINE of LABEL" / "LABEL" for generated data (ds->generated: the file
 * they were written to may be gone by the time the message is read — a refused start removes the
 * output folder it made). Returns buf. */
const char *dataset_where(const dataset *ds, int64_t line, char *buf, size_t n);
/* Row i, 0 ≤ i < count (out of range aborts: a bug in the caller). */
const ds_row *dataset_row(const dataset *ds, int64_t i);
void dataset_free(dataset *ds);
/* Keep the rows i with keep[i] != 0 (keep: [count]), in order, freeing the others; returns how
 * many were dropped. Row line numbers stay those of the file. */
int64_t dataset_keep_rows(dataset *ds, const uint8_t *keep);
/* 64-bit FNV-1a fingerprint of every row's data_source, prompt messages (the whole message objects
 * when not plain), tools and ground truth, in order: two datasets with the same rows give the same
 * value (used to refuse resuming a run on different data); rows of plain messages without tools
 * give the value they gave before messages carried tools. */
uint64_t dataset_fingerprint(const dataset *ds);

/* The row's prompt through the current tokenizer's chat template, with its tools, the generation
 * prompt appended (tok_chat_encode_ex: an error ends the program — check rows first with
 * dataset_check_prompts). Appends to out. */
void ds_row_encode_prompt(const ds_row *row, tok_seq *out);

/* An SFT example of the row under the current tokenizer's chat template, appended to out (which
 * must be empty): the prompt with its generation prompt (ds_row_encode_prompt's ids), then the
 * response. *resp_start gets the prompt's length in ids. A string response is tok_encode_response's
 * ids (*mask NULL: every response id is a loss id). A response of messages: the chat template's
 * rendering of prompt + messages (with the row's tools) cut into pieces at each assistant turn —
 * the turn starts where the rendering of the conversation before it with the generation prompt
 * ends, and ends after the first end-of-turn (stop) token the template writes after that — each
 * piece encoded on its own with the template's mask (as a multi-turn rollout joins sampled and
 * inserted ids: nothing re-encoded across a boundary); what follows the last assistant turn's
 * end-of-turn token is dropped. *mask (heap, [out->n − *resp_start], the caller frees it) is 1 on the
 * assistant turns' ids (content and end-of-turn token) and 0 on the ids between them (tool turns
 * and template text). Errors (nothing to free; message "WHERE: response ...", where = how the
 * caller names the row, e.g. dataset_where): no response, a rendering error, a rendering of the
 * conversation that does not extend the prompt rendering before an assistant turn, no end-of-turn
 * token after an assistant turn, and for a string response a template error. */
int ds_row_encode_sft(const ds_row *row, const char *where, tok_seq *out, int *resp_start, uint8_t **mask);

/* Append one row as a single JSON line (in the schema above) to `f`: ground_truth is written as
 * the JSON value it holds when ground_truth_json is set, else as a string; extra_info_json,
 * response (or resp_msgs, as a list) and tools only when not NULL; a message with msg as that whole object. Used by the task generators and by tests. Errors: a string that
 * is not valid UTF-8, ground_truth_json/extra_info_json that are not valid JSON, a write error. */
int dataset_write_row(FILE *f, const ds_row *row);

#endif
