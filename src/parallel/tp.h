/* Tensor parallelism of the trainer (Megatron-LM's tensor_parallel layers; verl's
 * actor.megatron.tensor_model_parallel_size): the tp consecutive ranks of a TP group (par_grid.tp_comm) hold one
 * slice each of every matrix and compute the same tokens.
 *
 * The split (tp_rank r of P, the local config of tp_config_apply):
 *   q_proj, k_proj, v_proj  column-parallel: heads [r·nh/P, (r+1)·nh/P) and kv heads [r·nkv/P, ...) (rows);
 *                           nkv < P (P a multiple of nkv): each rank holds the one kv head its query heads use,
 *                           replicated over P / nkv ranks as Megatron does, whose k/v gradients tp_reduce_grads sums
 *                           over its holders (and the norm counts once);
 *   o_proj                  row-parallel: the same heads' columns; its output summed over the group;
 *   dense gate_up / down    column / row-parallel over the width Id (gate rows and up rows each split);
 *   experts gate_up / down  the same over each expert's I (expert-TP, actor.megatron.expert_tensor_parallel_size
 *                           -1 = P), or every expert whole on every rank (1); the router is replicated;
 *   embed_tokens, lm_head   vocab-parallel: rows [r·V/P, (r+1)·V/P); the embedding's output summed over the group,
 *                           the log-probabilities from statistics reduced over it (src/model/vocab_parallel.c);
 *   norms, q_norm, k_norm,  replicated; q_norm / k_norm's gradients are partial (each rank's heads) and summed
 *   router                  over the group by tp_reduce_grads, the others come out equal on every rank.
 * The model calls model_hooks.tp_allreduce / tp_allreduce_f32 at the collective points (forward.c): the
 * embedding, o_proj's and the MLP's outputs (forward), the input gradients of q/k/v, gate_up and the head, the
 * expert outputs' routing-weight gradient (backward).
 * Data parallelism on top: par_grid.dp_comm joins the ranks holding the same slice; tp_reduce_grads sums over it
 * (the caller runs no DDP reducer: par_grads_self_reduced). Checkpoints are whole (tp_gather_full) and load on
 * any TP size (tp_slice_vec of the whole model).
 * TP × EP × DP (actor.expert_parallel_size > 1 with expert_tensor_parallel_size=1; src/parallel/tp_ep.h): the
 * model is first cut to this rank's experts (ep_state_attach), then TP slices that; the MoE layers run through
 * tp_ep.h's token split.
 * TP × pipeline (parallel.c): the model is sliced first, then the pipeline makes the slice stage-owned; pp_comm
 * joins each TP rank to its counterparts (same tp_rank) in the other stages, so the hidden [N,H] each member of a
 * TP group holds whole travels between counterparts; the gradient sums are the pipeline's over grid.dp_comm plus
 * tp_reduce_layer_grads over the stage's layers; the norm is tp_norm_squares over the stage's ranges, summed
 * over the stages. This build: FSDP and Ulysses refused with TP, TP × pipeline × EP too (par_check_tp).
 * Activation recompute (model.enable_gradient_checkpointing) runs under every TP layout: the recomputed forward
 * (forward.c recompute_layer) repeats the layer's TP collectives on the same rows (docs/parallelism.md).
 * Megatron sequence parallelism (actor.megatron.sequence_parallel, TP × DP and TP × EP × DP): tp_sp.h. */
#ifndef MOERL_PARALLEL_TP_H
#define MOERL_PARALLEL_TP_H

#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/grid.h"

typedef struct tp_state tp_state;

/* The local config of TP rank `rank` of P from the whole one c (in place): heads, widths and vocabulary divided
 * (see above), exec.tp_size / tp_rank / tp_experts set, bos/eos unset (they index the whole vocabulary).
 * experts_split: expert-TP. Errors (c unchanged): a size P does not divide, naming the key and the model's
 * field; an MoE ablation switch that TP does not combine with. */
int tp_config_apply(moe_config *c, int P, int rank, int experts_split);
/* What TP does not combine with activation recompute (c->exec.recompute, model.enable_gradient_checkpointing):
 * Megatron sequence parallelism × EP (pc->sequence_parallel with pc->expert_parallel_size > 1), whose MoE on
 * the rank's own rows the recomputed forward does not yet repeat bit for bit. MOERL_OK, or moerl_errorf naming
 * the keys. Called where the layout is checked (rl's check_layout, tp_state_attach, moerl plan). */
int tp_check_recompute(const par_config *pc, const moe_config *c);
/* Replace the whole model m by this rank's slice (g->tp > 1) and return the state remembering m; the slice's
 * exec.tp_sp is g's actor.megatron.sequence_parallel (activation arenas laid out after this hold a rank's rows of
 * the residual stream, forward.h model_acts.sp_rows). NULL with moerl_errorf on error (m unchanged). Not
 * collective. */
tp_state *tp_state_attach(const par_grid *g, moe_model *m);
/* Assemble the whole model back into m on every rank of the TP group (collective) and free ts. */
int tp_state_detach(tp_state *ts);
/* The TP group's all-reduce of the model hooks (model_hooks.tp_allreduce: doubles, sum or max; _f32: sum). */
void tp_allreduce(tp_state *ts, double *x, size_t n, int max);
void tp_allreduce_f32(tp_state *ts, float *x, size_t n);
/* The gradient sums of a step: every tensor over dp_comm (the ranks holding the same slice), the partial
 * replicated ones (q_norm, k_norm) over tp_comm. Collective over the stage. */
int tp_reduce_grads(tp_state *ts);
/* The q/k-norm gradient sums over tp_comm and (replicated key/value heads) the k/v sums over their holders, for
 * decoder layers [lo, hi) only (TP × pipeline: the stage's layers; tp_reduce_grads runs it over all of them after
 * its data-parallel sum). Collective over tp_comm. */
int tp_reduce_layer_grads(tp_state *ts, int lo, int hi);
/* The squared gradient norm of the tensors whose layout offset lies in one of the nr ranges [lo[r], hi[r]) of the
 * slice (TP × pipeline: a stage's ranges): the split tensors' squares summed over the TP group, each replicated
 * tensor once, a replicated kv head once over its holders — the same value on every member. Collective over
 * tp_comm (an MPI failure is fatal: the members would otherwise disagree on the step). */
double tp_norm_squares(tp_state *ts, const size_t *lo, const size_t *hi, int nr);
/* TP × EP (grid.h): the expert tensors (TF_EXPERT, whole experts of this rank's EP slice) sum their gradients
 * over expert_dp (grid.ep_dp_comm: every rank holding the same experts) instead of dp_comm, and their squares in
 * the global norm over ep (grid.ep_comm: the EP group's other experts) instead of once. Not collective. */
void tp_set_expert_groups(tp_state *ts, dist_comm *expert_dp, dist_comm *ep);
/* The tensor table (no buffers) of the model the slices are cut from: the whole model, or under TP × EP this
 * rank's EP slice (its experts whole). */
const moe_model *tp_whole_layout(const tp_state *ts);
/* adamw_step with global-norm clipping over the whole model: the split tensors' squares summed over the TP
 * group, each replicated tensor counted once. Collective over tp_comm. */
int tp_adamw_step(tp_state *ts, adamw_state *s, float lr, float loss, double *grad_norm);
/* Floats of the whole model's layout. */
size_t tp_whole_params(const tp_state *ts);
/* This rank's slice of a vector in the whole layout (weights, AdamW moments) into local_vec [n_params]. */
void tp_slice_vec(const tp_state *ts, const float *whole_vec, float *local_vec);
/* The whole model (and, moments != NULL, os's moments in the whole layout) on the member with keep = 1 of each
 * TP group: *whole := a new inference model of the whole config (free with model_free). Members with keep = 0
 * only send; a group without a keeper does nothing. Collective over tp_comm. Errors: two keepers in a group. */
int tp_gather_full(tp_state *ts, const adamw_state *os, int keep, moe_model *whole, adamw_state *moments);
/* Load DIR's whole checkpoint (any TP size wrote it: it is whole) into the slice m (model_load_weights on a
 * whole model of the same config, then tp_slice_vec). Not collective. */
int tp_load_weights(tp_state *ts, const char *dir);
/* The slice model ts works on (the m of tp_state_attach). */
moe_model *tp_state_model(tp_state *ts);

/* Free ts without reassembling (the model keeps its slice). Not collective. */
void tp_state_free(tp_state *ts);
/* The streaming form of tp_slice_vec, for a weight broadcast received bucket by bucket (rollout TP:
 * dist_recv_weights_stream): the part of a whole-model vector in [off, off + cnt) — vals, values of esz bytes
 * (4 fp32, 2 bf16) at whole-layout offsets — copied to local_vec in local's layout wherever local (a slice of
 * tp_config_apply, exec.tp_size / tp_rank / tp_experts) holds it; the vocabulary's padding rows are not
 * written (the caller zeroes them once). Handing every range of [0, full->n_params) once fills local_vec as
 * tp_slice_vec does. Not collective. Errors: full is not the whole model of local's config, the range past
 * full->n_params, esz not 2 or 4. */
int tp_slice_range(const moe_model *full, const moe_model *local, size_t off, const void *vals, size_t cnt, size_t esz,
                   void *local_vec);

#endif
