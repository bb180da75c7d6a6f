/* trainer_state.json: the scalar state of an RL checkpoint (src/rl/job.c writes it next to the
 * weights and optimizer moments) — which version and step the run reached, where the prompt feed
 * stands, and which started prompts must be redone on resume.
 *
 * File (JSON object, written with jansson; unknown keys are ignored on reading):
 *   "format": "moerl-rl-state"        "format_version": 1
 *   "version": policy version (int ≥ 0)            "trainer_step": trainer steps done (≥ 0)
 *   "optimizer_step": AdamW steps applied (≥ 0)    "optimizer_skipped": non-finite steps skipped (≥ 0)
 *   "consumed_prompts": prompts trained on (≥ 0)
 *   "feed_epoch": epoch of the prompt feed (0 ≤ e < INT_MAX)  "feed_pos": index into it (0..n_rows)
 *   "seed": trainer.seed (a uint64 stored as the int64 of the same bits, as jansson holds int64)
 *   "n_rows": training rows (≥ 1)     "data_fingerprint": dataset_fingerprint, "%016llx" hex
 *   "unconsumed_started": [uid...], uid = epoch·n_rows + row, 0 ≤ uid, uid / n_rows ≤ feed_epoch + 1
 *   "samples_log_bytes": length of samples.jsonl at the checkpoint (≥ 0)
 *   optional: "dropped_prompts": groups dropped by filter_groups among the consumed (0..consumed,
 *   default 0); "last_val_accuracy": the last held-out accuracy (0..1, or null = none; default null);
 *   "kl_ctrl_value": algorithm.use_kl_in_reward's β (kl_controller.value) after the last step, a finite
 *   number ≥ 0 or null = none (default null: the run starts from algorithm.kl_ctrl.kl_coef);
 *   "optimizer": actor.optim.name (absent in older files: not checked); "optimizer_freeze_step":
 *   onebit_adam's actor.optim.freeze_step (≥ 1; absent for adamw); "optimizer_var_update_interval": onebit_adam's
 *   actor.optim.var_update_interval (≥ 1; absent when 0, 1-bit Adam as published)
 * Every field is required and must have its type and range; a file that breaks a rule is
 * "damaged" and the message names the file and the field, the value and what was expected, and
 * says what to do. Source: moerl's own format. */
#ifndef MOERL_RL_STATE_H
#define MOERL_RL_STATE_H

#include <stddef.h>
#include <stdint.h>

#define RL_STATE_FORMAT "moerl-rl-state"
#define RL_STATE_FORMAT_VERSION 1

typedef struct {
    int version;
    int64_t trainer_step;
    int64_t optimizer_step, optimizer_skipped;
    int64_t consumed_prompts;
    int feed_epoch;
    int64_t feed_pos;
    uint64_t seed;
    int64_t n_rows;
    uint64_t data_fingerprint;
    int64_t *unconsumed_started; /* [n_unconsumed], heap (NULL when empty); rl_state_free frees it */
    int n_unconsumed;
    int64_t samples_log_bytes;
    int64_t dropped_prompts;     /* optional, default 0 */
    double last_val_accuracy;    /* optional, NaN = none */
    double kl_ctrl_value;        /* optional, NaN = none: the KL-in-reward controller's β (exact resume) */
    char optimizer[32];          /* optional, "" = not recorded (older files): actor.optim.name */
    int64_t optimizer_freeze_step; /* optional, 0 = none: actor.optim.freeze_step of onebit_adam */
    int64_t optimizer_var_update_interval; /* optional, 0 = none: actor.optim.var_update_interval of onebit_adam */
} rl_state;

/* What the resuming run has: a state file made for other data or another seed is refused. */
typedef struct {
    int64_t n_rows;
    uint64_t seed;
    uint64_t data_fingerprint;
    /* actor.optim.name and (onebit_adam) actor.optim.freeze_step of the resuming run; NULL = not checked. A file
     * that records another optimizer or freeze step is refused (its moments, frozen variance and error feedback
     * belong to that optimizer), except adamw continued as onebit_adam (AdamW's moments are its warm-up's). */
    const char *optimizer;
    int64_t optimizer_freeze_step;
    int64_t optimizer_var_update_interval; /* onebit_adam's actor.optim.var_update_interval (0: none), as the freeze step */
} rl_state_expect;

/* Parse and validate the JSON text of a trainer_state.json (len bytes, no NUL needed) into *out
 * (zeroed first; free with rl_state_free, also after an error). `path` names the file in messages.
 * expect: the run's training data and seed, or NULL to check the file on its own.
 * Errors (MOERL_ERR, message "<path>: ..."): invalid JSON, not an object, another format or
 * format_version, a field missing or of the wrong type or out of range (named, with its value;
 * "the file is damaged: move the checkpoint folder away or set trainer.resume_mode=disable"),
 * n_rows or data_fingerprint other than expected ("... made with other training data ..."), another
 * seed ("... another trainer.seed ..."). */
int rl_state_parse(rl_state *out, const char *text, size_t len, const char *path, const rl_state_expect *expect);
/* rl_state_parse on the file at path (read errors name the path). */
int rl_state_load(rl_state *out, const char *path, const rl_state_expect *expect);
/* The JSON text of *s (indented, ends with a newline; free() it): what rl_state_parse reads back to
 * the same struct. NULL with an error naming the field when *s breaks a rule above (so a file the
 * reader would refuse is never written). */
char *rl_state_to_json(const rl_state *s);
/* rl_state_to_json written atomically to path (moerl_write_file_atomic). */
int rl_state_write(const char *path, const rl_state *s);
/* Free the uid list; *s is zeroed. */
void rl_state_free(rl_state *s);

#endif
