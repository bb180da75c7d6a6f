/* moerl — rule-based reward functions for the built-in and verl-style datasets.
 *
 * A reward function (reward_fn) scores a response against a row's ground truth (data/dataset.h:
 * reward_model.ground_truth); it returns MOERL_OK with *score in [0, 1], or MOERL_ERR (with a
 * message) only when the ground truth itself is malformed — a malformed response scores 0.
 * Sources: verl/utils/reward_score/gsm8k.py (GSM8K), verl/utils/reward_score/countdown.py
 * (TinyZero's countdown task), verl/utils/reward_score/math.py (MATH); ideas only, the
 * differences are stated per function.
 */
#ifndef MOERL_REWARDS_H
#define MOERL_REWARDS_H

#include "data/dataset.h"

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
 * end with "= <target>". 1.0 if countdown_verify (data/expr.h) says CD_VALID, else 0.0. Error: the ground truth
 * is not {"target": int, "numbers": [int, ...]}. */
int reward_countdown(const char *response, const char *ground_truth, double *score);

/* The math-answer verifier (data/math_answer.h: \boxed{} / "####" / "answer is" / last-number
 * extraction, LaTeX and number normalisation, exact rational comparison). 1.0 or 0.0. Error: the
 * ground truth is empty after normalisation. */
int reward_math(const char *response, const char *ground_truth, double *score);

/* Tool use ("tool_arith", tasks.h): the answer of the FINAL assistant turn of a multi-turn response
 * (the whole decoded trajectory: sampled turns and the tool turns between them). The final turn is
 * the text after the last "</tool_response>" (where Qwen3's chat template, and the one of
 * examples/tool_use, close a tool turn; the whole response when there is none); its answer is the
 * number right after its last "Answer:" (spaces allowed; optional '-', digits, thousands groups and
 * a fraction as in reward_exact_number), compared as an exact decimal. 1.0 or 0.0: no final turn, no
 * "Answer:", or a number only in a tool response (the environment's result the model did not
 * restate) score 0. Error: the ground truth is not a number. */
int reward_tool_answer(const char *response, const char *ground_truth, double *score);

/* The reward function for a data_source: "arith" → reward_exact_number; "tool_arith" →
 * reward_tool_answer; "gsm8k-style", "gsm8k",
 * "openai/gsm8k" → reward_gsm8k; "countdown" → reward_countdown; the sources verl's
 * default_compute_score sends to its math scorers — "math", "lighteval/MATH",
 * "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math_dapo",
 * "math_dapo_reasoning" and any source starting with "aime" → reward_math. NULL with an error
 * naming the unknown data_source and the known ones. */
reward_fn reward_fn_for(const char *data_source);

/* Score `response` for dataset row r (its data_source and ground truth); errors name the row's
 * line. */
int reward_row(const ds_row *r, const char *response, double *score);

/* Score `response` with the built-in reward of data_source (reward_fn_for). When pred is not
 * NULL, *pred gets the answer the reward extracted from the response (heap string; NULL when it
 * found none): validation's maj@N votes on it. arith: the last number in canonical decimal form
 * ("1,234.50" → "1234.5"); gsm8k: the last "#### " answer without ',' and '$' (as compared);
 * countdown: the equation text; tool_arith: the final turn's "Answer:" number; math: math_answer_canonical of the normalised answer ("0.5" and
 * "\frac{1}{2}" both → "1/2"). Errors: those of reward_fn_for and of the reward function
 * (*pred is then NULL). */
int reward_score(const char *data_source, const char *response, const char *ground_truth, double *score, char **pred);

#endif
