/* The job's parallel layout keys: the trainer ranks (trainer.n_ranks), the model-parallel sizes
 * (par_def_keys, parallel/grid.h: actor.fsdp_config.fsdp_size, actor.expert_parallel_size,
 * actor.ulysses_sequence_parallel_size, actor.pipeline_parallel_size, ...) and the buckets of the
 * weight broadcast and of the data-parallel gradient reduction. */
#ifndef MOERL_PARALLEL_CONFIG_H
#define MOERL_PARALLEL_CONFIG_H

#include "base/config.h"
#include "parallel/grid.h"

typedef struct {
    int n_trainer_ranks;   /* trainer.n_ranks: under mpirun -np N, the last n ranks train */
    double sync_bucket_mb; /* async_training.sync_bucket_mb: weight-broadcast bucket (MiB) */
    double grad_bucket_mb; /* actor.grad_bucket_mb: gradient-reduction bucket (MiB, DDP's 25) */
    par_config par;        /* the model-parallel sizes (par_read_keys) */
} par_layout;

/* Declare trainer.n_ranks, async_training.sync_bucket_mb, actor.grad_bucket_mb and par_def_keys'. */
void par_def_layout_keys(cfg *c);
/* Read and check them, before any folder or model exists: trainer.n_ranks ≥ 1, buckets in
 * (0, 1024] MiB, par_read_keys' checks; model parallelism (any size above 1) needs trainer.n_ranks
 * ≥ 2; the pipeline combines with data parallelism, FSDP and EP (par_check_pp_compose); a gradient
 * compression (grad_compression, dist/compress.h: GRAD_COMPRESSION_NONE = off) needs the plain
 * data-parallel reducer (no FSDP, pipeline or EP). The sizes against the ranks and the model are
 * par_check's, once the model is known. Errors name the keys and their values. */
int par_read_layout(const cfg *c, int grad_compression, par_layout *L);
/* Model parallelism (any of pc's sizes above 1; fsdp_size -1 = all T) needs T ≥ 2 trainer ranks: else an
 * error naming every size, ending in `advice` (how this command gets more ranks: rl "run under mpirun with
 * trainer.n_ranks ≥ 2", sft "run under mpirun -np ≥ 2", plan "set trainer.n_ranks ≥ 2"). par_read_layout's
 * check; moerl sft and moerl plan call it with their own advice. */
int par_check_ranks(const par_config *pc, int T, const char *advice);

#endif
