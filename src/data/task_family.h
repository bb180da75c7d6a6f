/* moerl — internal interface between the task-generator driver (task_gen.c) and the generators of
 * each family (task_arith.c, task_gsm.c, task_countdown.c,
 * task_tool_arith.c). Not part of the public API: callers
 * use data/tasks.h. */
#ifndef MOERL_TASK_FAMILY_H
#define MOERL_TASK_FAMILY_H

#include <stdint.h>

#include "base/rng.h"
#include "data/tasks.h"

/* One generated problem (NUL-terminated strings, truncated to their buffers). */
typedef struct {
    char prompt[1024];   /* the user message */
    char key[256];       /* canonical form for the train/test disjointness check ("" = the prompt) */
    char truth[256];     /* the ground truth: a string, or JSON text when truth_json */
    int truth_json;
    char response[1024]; /* a correct response (the SFT target): text, or JSON text when response_json */
    int response_json;   /* 1: response is a JSON list of messages (a multi-turn demonstration) */
} task_item;

/* Draw one problem of a family from r with options o (already range-checked) into *it (zeroed by
 * the caller). Deterministic given r's state. */
typedef void (*task_gen_fn)(rng_state *r, const task_opts *o, task_item *it);

/* Uniform integer in [lo, hi] (lo ≤ hi) from the project generator (base/rng.h, unbiased). */
int64_t task_rng_range(rng_state *r, int64_t lo, int64_t hi);

/* "arith": "Compute a±b." with arith_digits-digit operands; truth and response the integer result. */
void task_gen_arith(rng_state *r, const task_opts *o, task_item *it);
/* "gsm8k-style": a templated word problem; response the worked steps then "#### <answer>". */
void task_gen_gsm(rng_state *r, const task_opts *o, task_item *it);
/* "countdown": numbers and a reachable target; truth {"target":T,"numbers":[...]} (JSON). */
void task_gen_countdown(rng_state *r, const task_opts *o, task_item *it);

/* "tool_arith": "Compute a*b." with arith_digits-digit operands; truth the product; response (JSON
 * messages) a calc tool call, the tool's answer and "Answer: <product>". */
void task_gen_tool_arith(rng_state *r, const task_opts *o, task_item *it);
/* The "tools" list (JSON text) of every tool_arith row: the calc function. */
extern const char task_tool_arith_tools[];

/* The instruction task_gen_gsm appends to every question (a leading space included); the raw
 * openai/gsm8k layout (task_generate_gsm8k_raw) strips it again. */
extern const char task_gsm_instruction[];

#endif
