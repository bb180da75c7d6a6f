/* actor.optim.name=onebit_adam in the RL trainer (1-bit Adam, src/optim/onebit_adam.h; the exchange
 * src/dist/onebit.h). Layouts: one process, or data-parallel trainer ranks holding whole replicas
 * (rl_read_config refuses FSDP, EP, pipeline and Ulysses SP with it).
 * Steps 1..freeze_step: the exact path (the DP reducer's all-reduce, AdamW). After: no gradient
 * all-reduce at all; each rank's local gradient is scaled by the number of trainer ranks W (the
 * reducer SUMS the ranks' gradients of the global-token-normalised loss, so W·g_r is rank r's
 * estimate of the full gradient, whose mean over ranks is the exact sum), clipped by its own norm
 * (each worker clips its local gradient, as DeepSpeed's workers do after the freeze), folded into
 * the momentum, exchanged at 1 bit per value, and applied with the frozen variance.
 * actor.optim.var_update_interval = K > 0: steps freeze_step + j·K (j ≥ 1) run the exact path again
 * (the all-reduce and AdamW move m and v); the compressed steps after one use its variance (and its
 * bias correction) and restart the error buffers and the mask (trainer_onebit_var_step). K = 0: never.
 * MOERL_ONEBIT_DIAG=1: trainer rank 0 logs per compressed step the 1-bit update against the exact
 * average of the ranks' momenta and against a shadow exact AdamW fed the all-reduced gradient (two extra
 * fp32 all-reduces on copies; the run itself does not change), the error-buffer norms, and the value
 * with the largest worker error (docs/parallelism.md "1-bit Adam").
 * The skip rule stays global: the ranks sum their ‖W·g_r‖² and the loss; a non-finite sum skips the
 * step on every rank. grad_norm reported: √(mean_r ‖W·g_r‖²).
 * Checkpoints: onebit_adam.safetensors beside optimizer.safetensors, "onebit.worker_err" [W, n] and
 * "onebit.server_err" [W, chunk] (row r: trainer rank r's), written once the freeze has passed; a
 * resume needs the same trainer.n_ranks (the rows are per rank). */
#ifndef MOERL_RL_TRAINER_ONEBIT_H
#define MOERL_RL_TRAINER_ONEBIT_H

#include "rl/rl.h"

/* 1 when the trainer is past 1-bit Adam's freeze (onebit_adam, step ≥ freeze_step): its error
 * buffers exist (checkpoints carry them). */
int trainer_onebit_frozen(const trainer *T);
/* 1 when the trainer's next optimizer step is a compressed one: past the freeze, and not one of the
 * exact variance-update steps of actor.optim.var_update_interval = K > 0 (steps freeze_step + j·K,
 * j ≥ 1, run as exact AdamW: the full-precision all-reduce moves m and v). */
int trainer_onebit_compress_next(const trainer *T);
/* The step at which the variance was last updated, as seen after `step` applied optimizer steps:
 * freeze_step while step ≤ freeze_step or interval ≤ 0, else freeze_step + ⌊(step − freeze_step)/interval⌋·interval.
 * The compressed steps use this step's bias correction for v (its √(1 − β2^T)). */
int64_t trainer_onebit_var_step(int64_t step, int64_t freeze_step, int64_t interval);
/* The compressed step after the backward passes (instead of the reducer and AdamW): *loss in: this
 * rank's loss, out: the sum over the trainer ranks; *grad_norm as above; *applied 1 or 0 (skipped);
 * st gets the bytes sent (perf/grad_compression_ratio). Collective over the trainer ranks. */
int trainer_onebit_step(trainer *T, double *loss, double *grad_norm, int *applied, train_stats *st);
/* Every trainer rank's error buffers to all (collective over the trainer ranks, only when
 * trainer_onebit_frozen holds on all of them): *rows [W·(n + chunk)] (caller frees). */
int trainer_onebit_gather(trainer *T, float **rows, int *n_rows);
/* Write rows (n_rows × (n + chunk(n, n_rows))) to path. */
int trainer_onebit_save(const float *rows, int n_rows, size_t n, const char *path);
/* Read path into T->onebit_rows (all rows); errors: missing tensors, wrong shapes, rows ≠ n_ranks
 * (named, with trainer.n_ranks). */
int trainer_onebit_load(trainer *T, const char *path, int n_ranks);
/* trainer_onebit_load's checks alone, reading no buffer into a trainer (a resume's checks before the run
 * folder changes, rl_check_resume_state): n = the model's parameter count. */
int trainer_onebit_check(const char *path, size_t n, int n_ranks);
/* Free the exchange and its group (collective over the trainer ranks when a group exists). */
void trainer_onebit_free(trainer *T);

#endif
