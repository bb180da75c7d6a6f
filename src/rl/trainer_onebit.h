/* actor.optim.name=onebit_adam in the RL trainer (1-bit Adam, src/optim/onebit_adam.h; the exchange
 * src/dist/onebit.h). Layouts: one process, or data-parallel trainer ranks holding whole replicas
 * (rl_read_config refuses FSDP, EP, pipeline and Ulysses SP with it).
 * Steps 1..freeze_step: the exact path (the DP reducer's all-reduce, AdamW). After: no gradient
 * all-reduce at all; each rank's local gradient is scaled by the number of trainer ranks W (the
 * reducer SUMS the ranks' gradients of the global-token-normalised loss, so W·g_r is rank r's
 * estimate of the full gradient, whose mean over ranks is the exact sum), clipped by its own norm
 * (each worker clips its local gradient, as DeepSpeed's workers do after the freeze), folded into
 * the momentum, exchanged at 1 bit per value, and applied with the frozen variance.
 * The skip rule stays global: the ranks sum their ‖W·g_r‖² and the loss; a non-finite sum skips the
 * step on every rank. grad_norm reported: √(mean_r ‖W·g_r‖²).
 * Checkpoints: onebit_adam.safetensors beside optimizer.safetensors, "onebit.worker_err" [W, n] and
 * "onebit.server_err" [W, chunk] (row r: trainer rank r's), written once the freeze has passed; a
 * resume needs the same trainer.n_ranks (the rows are per rank). */
#ifndef MOERL_RL_TRAINER_ONEBIT_H
#define MOERL_RL_TRAINER_ONEBIT_H

#include "rl/rl.h"

/* 1 when the trainer's next optimizer step is a compressed one (onebit_adam, past freeze_step). */
int trainer_onebit_frozen(const trainer *T);
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
