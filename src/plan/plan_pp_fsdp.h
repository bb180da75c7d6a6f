/* moerl plan's rows for pipeline × FSDP (actor.pipeline_parallel_size > 1 with actor.fsdp_config.fsdp_size
 * > 1; parallel.c pp_fsdp_init): each stage's units — the decoder layers of its chunks, the embedding on the
 * first virtual stage, the final norm and LM head on the last (pp_stage_units) — are sharded over the
 * stage's FSDP group (fsdp_state_new_units), with HSDP replicas inside the stage when fsdp < n_trainer/pp.
 * The pipeline's 1F1B schedule (plain or interleaved, pp_schedule's order) fires each pass's layer events,
 * and FSDP gathers, prefetches, releases and reduce-scatters the stage's units as fsdp.c does: plan replays
 * fsdp.c's schedule (plan_replay.h) in the order the stage runs its passes — the forward-only passes in
 * pipeline.c forward_only's order (groups of pp micro-batches through the chunks), the training passes in
 * pp_schedule's — so the all-gather count depends on what stays gathered from one pass to the next.
 * Counts past a cap are extrapolated from two replays a period apart (the schedule repeats every
 * micro-batch, every pp micro-batches when interleaved; tests/test_plan_pp_fsdp.c checks it against the
 * whole replay). Floats are fp32 floats of moerl's layout; bytes scale by plan_input.dtype_bytes. Called by
 * plan.c; the public entry is plan_pp_fsdp_stage. */
#ifndef MOERL_PLAN_PP_FSDP_H
#define MOERL_PLAN_PP_FSDP_H

#include "plan/plan.h"

/* The run's rules for the layout (parallel.c pp_fsdp_init, par_check_pp_compose): a model with tied
 * embeddings is refused with the run's reason; EP and Ulysses with it are refused by par_check_pp_compose.
 * No-op unless pp > 1 and fsdp > 1. Errors name the keys and values. */
int plan_pp_fsdp_check(const moe_config *c, const plan_input *in, int fsdp);

/* Floats of stage `stage`'s FSDP shard (v chunks per stage, fsdp ranks): Σ over its units of ⌈n_u/fsdp⌉
 * rounded up to 16 (fsdp_stats.shard_floats). */
double plan_pp_fsdp_shard(const moe_config *c, int pp, int v, int stage, int fsdp);

/* The stage's peak of gathered units + live gradient units + bounce buffers over one update from a cold
 * start (the optimizer step released every unit): *hi when no reduce-scatter completes before it is waited
 * for, *lo when every one completes as it starts (fsdp_stats.peak_gathered_bytes lies between); floats.
 * mb: micro-batches per update. */
void plan_pp_fsdp_peak(const moe_config *c, const plan_input *in, int v, int mb, int stage, int fsdp, double *hi,
                       double *lo);

/* One update's FSDP rows of stage `stage` (plan_traffic, bytes): fsdp_allgather (cold start),
 * fsdp_allgather_warm (after a forward-only logprob pass), fsdp_reduce_scatter ((fsdp − 1)·S·dtype per backward
 * pass, once per update held), replica_allreduce (HSDP, R = S_ranks/fsdp replicas: 2(R−1)/R · S · 4) and
 * pp_norm_allreduce (the stages' squared-norm sum, 2(pp−1)/pp · 8). S_ranks: ranks of a stage; mb:
 * micro-batches per update. No pass-count all-gather: the pipeline agrees on its count over stage_comm. */
int plan_pp_fsdp_traffic(const moe_config *c, const plan_input *in, int fsdp, int v, int mb, int S_ranks, int stage,
                         plan_traffic *t);

/* Floats the stage all-gathers in a forward-only pass over n_mb micro-batches from a cold start (keep:
 * actor.fsdp_config.reshard_after_forward=false), in forward_only's order; *held (may be NULL): the floats
 * still gathered after it, *peak (may be NULL) its peak. */
double plan_pp_fsdp_fwd_only(const moe_config *c, int pp, int v, int stage, int fsdp, int keep, int n_mb,
                             double *held, double *peak);

/* The test hook of the extrapolation: one update's all-gathered floats and peak of stage `stage` (fo forward-
 * only passes per micro-batch, then the 1F1B training over m micro-batches; warm: after a one-micro-batch
 * forward-only pass), replayed whole up to cap micro-batches and extrapolated above (cap ≤ 0: the default,
 * 4·pp·(v + 1) + 16). Errors: the schedule's (m not a multiple of pp when v > 1). */
int plan_pp_fsdp_update(const moe_config *c, int pp, int v, int stage, int fsdp, int eager, int keep, int warm,
                        int fo, int m, int cap, double *gathered, double *peak);

/* plan_compute's per-rank rows for stage `stage` instead of the fullest stage (pipeline × FSDP): weights,
 * grads, moments, master, acts, acts_recompute, gathered, gathered_low, ref_weights, ref_acts, ref_held,
 * ref_gathered, stage_layers and fullest_stage (= stage); the other fields are plan_compute's. What
 * tests/test_dist_plan.c checks every stage's ranks against. Errors: as plan_compute; stage out of range;
 * a layout other than pipeline × FSDP. */
int plan_pp_fsdp_stage(const moe_config *c, const plan_input *in, int stage, plan_result *o);

#endif
