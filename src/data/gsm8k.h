/* moerl — openai/gsm8k rows → moerl's (verl's) dataset rows.
 *
 * Follows verl's examples/data_preprocess/gsm8k.py (the row layout: data_source, prompt,
 * reward_model, extra_info; the instruction appended to the question; extract_solution's
 * "#### (\-?[0-9\.\,]+)" with commas removed). Ideas only, no code taken. */
#ifndef MOERL_GSM8K_H
#define MOERL_GSM8K_H

#include <stdint.h>

/* Convert openai/gsm8k JSONL (rows {"question", "answer"}, other fields ignored, blank lines
 * skipped) to moerl's rows the way verl's examples/data_preprocess/gsm8k.py does: data_source
 * "openai/gsm8k"; one user message = question + " Let's think step by step and output the final
 * answer after \"####\"."; ground truth = the first "#### <number>" of the answer (digits, '.', ',',
 * an optional '-'; commas removed); extra_info {split, index, answer, question}; plus "response" =
 * the whole answer (the SFT target). Written atomically to out_path; *n_rows (if not NULL) gets
 * the row count. Errors name in_path:line and the field: not JSON, question/answer missing or not
 * strings, an answer without "#### <number>", an empty file. */
int gsm8k_convert(const char *in_path, const char *out_path, const char *split, int64_t *n_rows);

#endif
