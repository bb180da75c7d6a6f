/* Tensor parallelism × expert parallelism (× data parallelism) on the trainer ranks: Megatron-LM's MoE layer
 * with TP and EP and expert_tensor_parallel_size = 1 (actor.megatron.tensor_model_parallel_size > 1,
 * actor.expert_parallel_size > 1, actor.megatron.expert_tensor_parallel_size=1).
 *
 * Layout (grid.h, par_grid_tp_ep): TP groups of tp consecutive ranks; an EP group joins ep ranks with the same
 * tp_rank. Attention, the dense MLPs and the vocabulary are split over the TP group as under TP × DP (tp.h);
 * each rank holds its EP group's share of the experts (E / ep, each expert whole) and a replicated router.
 *
 * An MoE layer (every thread of the driver team calls these hooks, as ep.h's): the TP group's ranks hold the
 * same N tokens and route them identically (the router is replicated). TP rank q takes its own tokens
 * [q·N/tp, (q+1)·N/tp) — their rows of the permuted index, in the same expert-major order — and runs them
 * through its EP group's dispatch / experts / combine (ep_moe_forward_team); the TP group then all-gathers
 * the expert output rows (each rank's rows padded to ⌈N/tp⌉·K), so every rank holds the whole s->y and the
 * unpermute, the routing-weight gradient and the residual stay replicated as without EP.
 * Backward mirrors it: each rank takes its own tokens' rows of ∂y (no communication: ∂y is replicated),
 * runs the EP backward (the local experts' weight gradients accumulate over the rank's share of the tokens),
 * and the TP group all-gathers the rows of ∂permuted.
 * Gradients: the experts summed over grid.ep_dp_comm (every rank holding the same experts: tp · dp / ep of
 * them, each having seen other tokens), the rest over grid.dp_comm as under TP × DP (tp_set_expert_groups).
 * With Megatron sequence parallelism (actor.megatron.sequence_parallel) no tp_ep_state is built: each TP rank
 * already holds its own rows and dispatches them as they are (SP × EP, tp_sp.h).
 * Sources (semantics only): Megatron-LM megatron/core/parallel_state.py (expert-model-parallel groups over
 * the tp × dp ranks), megatron/core/transformer/moe/token_dispatcher.py (the MoE input split over the TP
 * ranks before the all-to-all, gathered after). */
#ifndef MOERL_PARALLEL_TP_EP_H
#define MOERL_PARALLEL_TP_EP_H

#include "model/forward.h"
#include "parallel/ep.h"
#include "parallel/grid.h"

typedef struct tp_ep_state tp_ep_state;

typedef struct {
    long gathers;        /* TP all-gathers of expert rows (forward outputs and backward input gradients) */
    double floats_sent;  /* Σ over them of the padded rows this rank contributes, in floats (⌈N/tp⌉·K·H each) */
} tp_ep_stats;

/* The runtime of grid g (g->tp > 1, g->ep > 1) over ep (the rank's EP state, its model already EP-sliced)
 * for a model of config c. Not collective. NULL with moerl_errorf when the grid is not TP × EP. */
tp_ep_state *tp_ep_new(const par_grid *g, ep_state *ep, const moe_config *c);
void tp_ep_free(tp_ep_state *st);
tp_ep_stats tp_ep_get_stats(const tp_ep_state *st);

/* Bytes of scratch one rank's tp_ep_state holds once an MoE pass of max_tokens tokens has run, for the whole
 * model's config c over a TP group of tp ranks (moerl plan's TP × EP scratch row): per MoE layer the
 * sub-problem's counts and offsets (2E + 1 ints) and index (2·(⌈N/tp⌉·K + 1) ints); the sub rows and their
 * gradients (2·(⌈N/tp⌉·K·H + 1) floats) and the TP all-gather's receive buffer (tp·⌈N/tp⌉·K·H + 1 floats), shared
 * by the layers. The allocations in tp_ep.c are sized by the same helpers. 0 when tp ≤ 1 or no layer is MoE. */
double tp_ep_scratch_bytes(const moe_config *c, int tp, int max_tokens);

/* Bytes of that scratch st holds now (its buffers grow to the largest N seen; the same count as
 * tp_ep_scratch_bytes once a pass of max_tokens tokens has run). */
double tp_ep_scratch_held(const tp_ep_state *st);
void tp_ep_reset_stats(tp_ep_state *st);

/* The MoE hooks (model_hooks.moe_forward / moe_backward, forward.h), with ep.h's contracts on s, d_y,
 * d_permuted, dWgu and dWd (N tokens, replicated over the TP group): forward fills s->y [N·K, H] whole on every
 * TP rank; backward overwrites d_permuted [N·K, H] whole and ACCUMULATES this rank's tokens' share of the local
 * experts' weight gradients. Collective over the TP group and each rank's EP group; end with a team barrier. */
void tp_ep_moe_forward_team(tp_ep_state *st, const moe_model *m, int l, const float *x, mlp_acts *s, int N);
void tp_ep_moe_backward_team(tp_ep_state *st, const moe_model *m, int l, const mlp_acts *s, const float *d_y,
                             float *d_permuted, float *dWgu, float *dWd);

#endif
