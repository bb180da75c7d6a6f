/* Megatron sequence parallelism over the tensor-parallel group (actor.megatron.sequence_parallel; tp.h for the
 * tensor split). Between a row-parallel output and the next column-parallel input the residual stream and the
 * RMSNorms of TP rank r cover only its rows [s0, s1) of each micro-batch's N tokens (model_sp_rows: ⌈N/P⌉ rows a
 * rank, the last ones short; the collectives pad to P·⌈N/P⌉ rows with zeros): the row-parallel outputs (o_proj,
 * the MLP's down projections, the vocab-parallel embedding) are REDUCE-SCATTERED over the tokens instead of
 * all-reduced, and the column-parallel inputs (q/k/v, the MLP and the LM head read ln1, ln2, the final norm)
 * are ALL-GATHERED. Backward runs the conjugates: the gradient entering a column-parallel input is
 * reduce-scattered, the one leaving a row-parallel output all-gathered. The norms' weights stay replicated;
 * their gradients cover this rank's rows only and are summed over the TP group (tp_sp_reduce_norm_grads,
 * Megatron's all-reduce of the sequence-parallel parameters' gradients).
 * The MoE: ln2 is gathered first and every TP rank routes all N tokens (as without SP); with expert-TP its
 * partial output is reduce-scattered, with experts whole (expert_tensor_parallel_size 1) the output is
 * complete on every rank and the rank keeps its rows (no collective).
 * SP × EP (actor.expert_parallel_size > 1, experts whole; Megatron's token dispatcher under sequence_parallel):
 * an MoE layer takes the rank's own ⌈N/P⌉ rows of ln2 as they are (no gather), routes them and dispatches them
 * over the rank's EP group (ep.h's all-to-all with n = s1 − s0 tokens), and the combined rows are added to the
 * rank's residual rows (no reduce-scatter); the backward mirrors it (∂out's rows not gathered, ∂ln2's rows
 * stay the rank's). N not a multiple of P: the last ranks route fewer rows (model_sp_rows; a rank may route
 * none and still joins the EP exchange). The router's gradient covers the rank's rows and is summed over the
 * TP group (tp_sp_reduce_router_grads), the aux-loss statistics after every forward (one all-reduce of 2·E
 * floats, forward.c), the experts over their holders as TP × EP (tp_set_expert_groups). No tp_ep.h state:
 * the split of the tokens over the TP group is SP's own. Source (semantics only): Megatron-LM
 * megatron/core/transformer/moe/token_dispatcher.py (with sequence parallelism the MoE input is already split
 * over the TP ranks; no all-gather before the permutation when expert-TP is 1).
 * Source of the method (semantics only): Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
 * Transformer Models" §4.2.2; Megatron-LM megatron/core/tensor_parallel/mappings.py
 * (gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region). */
#ifndef MOERL_PARALLEL_TP_SP_H
#define MOERL_PARALLEL_TP_SP_H

#include "dist/dist.h"
#include "model/model.h"

/* x[N,H] holds this rank's partial sums of every row; on return rows [s0, s1) (model_sp_rows of this rank of
 * comm) hold the sums over comm, the other rows unchanged. One reduce-scatter of ⌈N/P⌉·H floats per rank.
 * Collective over comm. Errors: MPI (as dist.h). */
int tp_sp_reduce_scatter(dist_comm *comm, float *x, int N, int H);
/* Rows [s0, s1) of x[N,H] are this rank's; on return every row holds its owner's values. One all-gather of
 * ⌈N/P⌉·H floats per rank. Collective over comm. */
int tp_sp_all_gather(dist_comm *comm, float *x, int N, int H);
/* The RMSNorm weights' gradients of m (input_layernorm, post_attention_layernorm of every layer, the final
 * norm) summed over comm in place: under SP each rank's cover its own token rows. Collective over comm. */
int tp_sp_reduce_norm_grads(dist_comm *comm, moe_model *m);
/* SP × EP (the MoE on each rank's own rows, see below): the routers' weight gradients of m (every MoE layer's,
 * E·H floats each) summed over comm in place — each rank's cover its own token rows (Megatron marks the router
 * a sequence-parallel parameter). One all-reduce; nothing without MoE layers. Collective over comm. */
int tp_sp_reduce_router_grads(dist_comm *comm, moe_model *m);

#endif
