/* moerl plan's replay of fsdp.c's schedule (src/plan/plan.c), opened to other schedules than the whole
 * model's passes: a caller drives the layer events itself (the pipeline's stages, plan_pp_fsdp.c).
 * Internal to src/plan. */
#ifndef MOERL_PLAN_REPLAY_H
#define MOERL_PLAN_REPLAY_H

#include "model/model.h"

typedef struct plan_replay plan_replay;

/* A replay of fsdp.c's units of c (no EP) sharded over P ranks, only the units with unit_on[u] != 0
 * (unit_on[L+2]: 0 the embedding, l+1 decoder layer l, L+1 the final norm and head; NULL = every unit:
 * fsdp_state_new_units' rule, the others are never gathered). eager: every reduce-scatter completes as it
 * starts (the lower bound of the peak); keep: actor.fsdp_config.reshard_after_forward=false. Cold: nothing
 * gathered. Free with plan_replay_free. */
plan_replay *plan_replay_new(const moe_config *c, const unsigned char *unit_on, int P, int eager, int keep);
void plan_replay_free(plan_replay *p);
/* fsdp_layer_event(MODEL_FWD_LAYER l) (bwd 0) or (MODEL_BWD_LAYER l) (bwd 1): gathers, prefetch, releases,
 * the gradient units the backward region writes. */
void plan_replay_event(plan_replay *p, int bwd, int l);
/* fsdp_layer_event(MODEL_GRAD_READY) of unit u: its reduce-scatter starts (held: nothing). */
void plan_replay_ready(plan_replay *p, int u);
/* The start of a window of passes (keep: nothing released, no reduce-scatter until plan_replay_finish). */
void plan_replay_begin(plan_replay *p);
/* fsdp_finish_grads: a held window's units reduce-scattered one at a time, every reduce-scatter waited. */
void plan_replay_finish(plan_replay *p);
/* Floats all-gathered so far (Σ s_u per gather), the peak and the current floats as fsdp.c accounts them
 * (gathered units, live gradient units, bounce and receive buffers), Σ s_u over the units on. */
void plan_replay_stats(const plan_replay *p, double *gathered, double *peak, double *cur, double *shard);

#endif
