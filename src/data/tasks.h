/* moerl — built-in verifiable task families (generators), and the umbrella header of the task
 * API: it also brings in the rewards (data/rewards.h), the countdown checker (data/expr.h) and the
 * openai/gsm8k converter (data/gsm8k.h).
 *
 * Generators write train/test JSONL files in verl's schema (dataset.h), deterministic from a seed,
 * with no prompt in both files. data_source is the family name:
 *   "arith"        multi-digit addition/subtraction: prompt "Compute 47+85.", ground truth "132",
 *                  response (SFT) "132". Operands have `arith_digits` digits (1..18).
 *   "gsm8k-style"  word problems from templates (shopping, wages, travel, sharing, percentages,
 *                  ...); the response reasons in steps and ends with "#### <answer>" like GSM8K's
 *                  solutions; ground truth is the integer answer.
 *   "countdown"    numbers and a target (the TinyZero / verl countdown task): ground truth
 *                  {"target": 24, "numbers": [3, 4, 5, 2]} (a JSON object), response (SFT) an equation
 *                  such as "(5+3-2)*4"; the target is made by combining all the numbers at random
 *                  (positive integer intermediates), so every problem has a solution.
 *   "tool_arith"   multiplication needing a calculator (tool use, multi-turn rollouts): prompt
 *                  "Compute 1234*5678." with `arith_digits`-digit operands (1..9), the row's
 *                  "tools" the calc function schema, ground truth the product "7006652", response
 *                  (SFT) a demonstration as messages: an assistant turn calling the tool
 *                  (<tool_call>{"name":"calc","arguments":{"expr":"1234*5678"}}</tool_call>), the
 *                  tool's answer "7006652", and a final assistant turn "Answer: 7006652"; scored
 *                  on the final turn's answer only (reward_tool_answer). examples/tool_use.yaml.
 *
 * Each family's data_source has a reward function (reward_fn_for in data/rewards.h).
 * Sources: the countdown task of TinyZero (verl/utils/reward_score/countdown.py), GSM8K's
 * solution format (openai/gsm8k); ideas only, no code taken.
 */
#ifndef MOERL_TASKS_H
#define MOERL_TASKS_H

#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "data/expr.h"    /* countdown_verify: the countdown equation checker */
#include "data/gsm8k.h"   /* gsm8k_convert: openai/gsm8k rows → moerl rows */
#include "data/rewards.h" /* reward_fn, reward_fn_for, reward_row and the reward functions */

typedef struct {
    int64_t n_train, n_test;  /* rows per file */
    uint64_t seed;
    int arith_digits;         /* arith: digits per operand, 1..18; tool_arith: 1..9 */
    int countdown_numbers;    /* countdown: numbers given, 2..6 */
    int countdown_max_number; /* countdown: numbers drawn from 1..max, 1..1000 */
    int countdown_max_target; /* countdown: target in 1..max, 1..1000000 */
} task_opts;

/* n_train 1000, n_test 100, seed 1, arith_digits 2, countdown 4 numbers in 1..25, target ≤ 100. */
void task_opts_default(task_opts *o);

/* The family names ("arith", "gsm8k-style", "countdown", "tool_arith"); *n gets their count. */
const char *const *task_families(int *n);

/* Write n_train rows to train_path and n_test rows to test_path (atomically; parent folders
 * are created). The test prompts are drawn first, then train prompts not among them; no prompt
 * repeats within or across the files (countdown: the same numbers in another order with the same
 * target count as the same problem). The files are a pure function of (family, all options); the
 * test rows come first from the one random stream (base/rng.h seeded with `seed`), so changing
 * n_test changes the train rows too. Errors: unknown family (naming it and the known ones),
 * options out of range (naming the option), fewer distinct prompts possible than asked
 * (e.g. arith with 1 digit), I/O. */
int task_generate(const char *family, const task_opts *o, const char *train_path, const char *test_path);

/* The gsm8k-style problems of task_generate (same options, same draws, same split rule) written
 * in the openai/gsm8k layout instead: one {"question": ..., "answer": ...} object per line, the
 * answer a worked solution whose last line is "#### <integer>". Input for gsm8k_convert, and a
 * stand-in for the real dataset where it cannot be downloaded. */
int task_generate_gsm8k_raw(const task_opts *o, const char *train_path, const char *test_path);

#endif
