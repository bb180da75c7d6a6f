/* moerl — built-in verifiable task families and their rule-based reward functions.
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
 *
 * Reward functions (reward_fn): score a response against a row's ground truth; they return
 * MOERL_OK with *score in [0, 1], or MOERL_ERR (with a message) only when the ground truth
 * itself is malformed — a malformed response scores 0.
 */
#ifndef MOERL_TASKS_H
#define MOERL_TASKS_H

#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"

typedef struct {
    int64_t n_train, n_test;  /* rows per file */
    uint64_t seed;
    int arith_digits;         /* arith: digits per operand, 1..18 */
    int countdown_numbers;    /* countdown: numbers given, 2..6 */
    int countdown_max_number; /* countdown: numbers drawn from 1..max, 1..1000 */
    int countdown_max_target; /* countdown: target in 1..max, 1..1000000 */
} task_opts;

/* n_train 1000, n_test 100, seed 1, arith_digits 2, countdown 4 numbers in 1..25, target ≤ 100. */
void task_opts_default(task_opts *o);

/* The family names ("arith", "gsm8k-style", "countdown"); *n gets their count. */
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

/* Convert openai/gsm8k JSONL (rows {"question", "answer"}, other fields ignored, blank lines
 * skipped) to moerl's rows the way verl's examples/data_preprocess/gsm8k.py does: data_source
 * "openai/gsm8k"; one user message = question + " Let's think step by step and output the final
 * answer after \"####\"."; ground truth = the first "#### <number>" of the answer (digits, '.', ',',
 * an optional '-'; commas removed); extra_info {split, index, answer, question}; plus "response" =
 * the whole answer (the SFT target). Written atomically to out_path; *n_rows (if not NULL) gets
 * the row count. Errors name in_path:line and the field: not JSON, question/answer missing or not
 * strings, an answer without "#### <number>", an empty file. */
int gsm8k_convert(const char *in_path, const char *out_path, const char *split, int64_t *n_rows);

/* ------------------------------------------------------------------ rewards */

typedef int (*reward_fn)(const char *response, const char *ground_truth, double *score);

/* The last number in the response compared numerically with the ground truth (a number).
 * A number: optional '-' (a sign only when not preceded by a digit, letter or ')'), digits with
 * optional thousands groups ",ddd", optional ".digits"; compared as exact decimals (so "132",
 * "132.0" and "0132" all equal 132). No number → 0. Follows the "flexible" extraction idea of
 * verl's reward_score/gsm8k.py (last number in the text) with numeric instead of string equality.
 * Error: the ground truth is not a number. */
int reward_exact_number(const char *response, const char *ground_truth, double *score);

/* verl's GSM8K rule (verl/utils/reward_score/gsm8k.py, method "strict", format_score 0): look only
 * at the last 300 characters; find every "#### " followed by an optional '-' and a run of digits,
 * '.' and ','; take the last; drop ',' and '$'; 1.0 if it equals the ground truth string exactly,
 * else 0.0 (no marker → 0.0). Never errors. */
int reward_gsm8k(const char *response, const char *ground_truth, double *score);

/* Countdown (task of TinyZero, verl/utils/reward_score/countdown.py, but verified exactly and
 * with the numbers usable at most once, not exactly once; no partial format score): the equation
 * is the text of the last <answer>...</answer> if present, else the last non-empty line; it may
 * end with "= <target>". 1.0 if countdown_verify says CD_VALID, else 0.0. Error: the ground truth
 * is not {"target": int, "numbers": [int, ...]}. */
int reward_countdown(const char *response, const char *ground_truth, double *score);

/* The reward function for a data_source: "arith" → reward_exact_number; "gsm8k-style", "gsm8k",
 * "openai/gsm8k" → reward_gsm8k; "countdown" → reward_countdown. NULL with an error naming the
 * unknown data_source and the known ones. */
reward_fn reward_fn_for(const char *data_source);

/* Score `response` for dataset row r (its data_source and ground truth); errors name the row's
 * line. */
int reward_row(const ds_row *r, const char *response, double *score);

/* ------------------------------------------------------------------ countdown verifier */

typedef enum {
    CD_VALID = 0,
    CD_SYNTAX,            /* not an expression of integers, + - * / and parentheses */
    CD_NUMBER_NOT_GIVEN,  /* a literal that is not among the numbers */
    CD_NUMBER_REUSED,     /* a number used more times than it is given */
    CD_DIV_BY_ZERO,
    CD_OVERFLOW,          /* an intermediate beyond 64-bit rationals */
    CD_WRONG_RESULT,      /* valid, but not equal to the target (or "= N" with N not the target) */
} cd_verdict;

/* Check `equation` (an expression, optionally followed by "= <target>") against the given numbers
 * (a multiset: each may be used at most as often as it appears) and target. Parsing is recursive
 * descent (expr := term {(+|-) term}, term := unary {(*|/) unary}, unary := -unary | primary,
 * primary := integer | (expr)); evaluation is exact rational arithmetic (int64 numerator and
 * denominator, reduced), so non-integer intermediates such as 8/3*3 are exact. Precedence of
 * verdicts: syntax, numbers, division by zero, overflow, result. */
cd_verdict countdown_verify(const char *equation, const int64_t *numbers, int n_numbers, int64_t target);
const char *cd_verdict_name(cd_verdict v);

#endif
