/* The SFT jobs (above parallel/: they run over trainer ranks): `moerl sft`'s whole job (its keys,
 * checks, output folder, training and checkpoint) and the SFT warm start of `moerl rl` (its sft.*
 * keys, the validation split it may stop on, and the run). */
#ifndef MOERL_RL_SFT_JOB_H
#define MOERL_RL_SFT_JOB_H

#include "base/config.h"
#include "data/dataset.h"
#include "dist/dist.h"
#include "model/model.h"

/* Declare every key of `moerl sft`: model.*, data.* (their modules'), data.train_batch_size,
 * optim.*, trainer.*, the layout keys (par_def_keys) and debug.test_no_pp_share_check (tests only). */
void sft_def_job_keys(cfg *c);

/* What sft_job_run leaves for the command to print. */
typedef struct {
    int root;                  /* trainer rank 0: prints the result */
    double acc_before, acc_after;
    char checkpoint[4200];     /* <trainer.default_local_dir>/checkpoint */
    int stop_signal;           /* a SIGINT/SIGTERM stopped training after a checkpoint (0: none) */
} sft_job_result;

/* One `moerl sft` run on every rank of ctx (roles split: every rank a trainer). Checks that write
 * nothing come first (a bad configuration or model leaves no folder); rank 0 alone creates and fills
 * the folder (config.yaml and the generated data once the resume checks pass), writes the metrics and
 * the checkpoint. On error, report(msg) is called on the ranks that should print it (a failure every
 * rank reaches alike is printed by rank 0 alone; report NULL: nothing printed) before the folder is
 * removed and every rank leaves together. Returns MOERL_OK (stopped by a signal: res->stop_signal)
 * or MOERL_ERR. */
int sft_job_run(const cfg *c, dist_ctx *ctx, sft_job_result *res, void (*report)(const char *msg));

/* Declare the warm start's sft.* keys (part of rl_def_keys). */
void sft_def_warm_start_keys(cfg *c);
/* The warm start's validation split: the last sft.validation_rows rows of train move to *val (empty
 * when 0); checks sft.stop_at_accuracy against it and sft.test_freq. Errors name the keys. */
int sft_split_validation(const cfg *c, dataset *train, dataset *val);
/* The SFT warm start of `moerl rl` (nothing when sft.total_training_steps = 0): trains m on train
 * (val: its validation split, may be empty), evaluates on test, resumes from
 * out_dir/sft_checkpoint, and saves its weights there. on_checked(on_checked_arg) is called once the
 * warm start's resume checks pass. A stop signal ends it after a checkpoint with MOERL_OK (the caller
 * sees moerl_stop_requested()). Errors are prefixed "sft warm start: ". */
int sft_warm_start(const cfg *c, moe_model *m, const dataset *train, const dataset *val, const dataset *test,
                   const char *out_dir, double *acc_before, double *acc_after, int (*on_checked)(void *),
                   void *on_checked_arg);

#endif
