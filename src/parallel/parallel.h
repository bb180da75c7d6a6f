/* The model-parallel runtime of one trainer rank: the grid (grid.h) and each strategy's state.
 * A NULL par_state (or NULL member) means that strategy is off; every code path with all of them
 * off is the single-rank / data-parallel path unchanged.
 *
 * Where each strategy hooks in (so that `moerl sft` and the trainer ranks of `moerl rl` run the
 * same code, through train_accumulate in src/train/train.c):
 *   fsdp  src/parallel/fsdp.c     parameter shards; all-gather before a layer's forward / backward
 *                                 (model_acts.par → the layer hooks in forward.c), reduce-scatter of
 *                                 gradients, optimizer on the owned shard;
 *   ep    src/parallel/ep.c       the MoE layer's token exchange between permute and grouped GEMM
 *                                 (forward.c's MoE block), all-to-all or all-to-all-v;
 *   sp    src/parallel/ulysses.c  attention: sequence-sharded → head-sharded and back (forward.c);
 *   pp    src/parallel/pipeline.c the 1F1B schedule over micro-batches (replaces the micro-batch
 *                                 loop of train_accumulate), activations sent point-to-point. */
#ifndef MOERL_PARALLEL_H
#define MOERL_PARALLEL_H

#include "parallel/grid.h"

struct fsdp_state;
struct ep_state;
struct sp_state;
struct pp_state;

typedef struct par_state {
    par_grid *grid;           /* NULL: one rank (or plain data parallel through the reducer) */
    struct fsdp_state *fsdp;  /* NULL: parameters replicated */
    struct ep_state *ep;      /* NULL: every rank holds every expert */
    struct sp_state *sp;      /* NULL: whole sequences per rank */
    struct pp_state *pp;      /* NULL: one stage */
} par_state;

#endif
