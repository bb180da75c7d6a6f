/* Expert parallelism (EP) for the MoE layers of the trainer: actor.expert_parallel_size.
 *
 * The ep ranks of an EP group (par_grid.ep_comm) split each MoE layer's E experts: ep_rank owns the
 * contiguous experts [ep_rank·E/ep, (ep_rank+1)·E/ep) and its model holds only their stacked
 * weights (moe_exec_opts.ep_size / ep_rank, src/model/model.h: the tensor table, the HF names and
 * checkpoint loading slice by it). The router, attention, norms, embedding and dense MLPs stay
 * replicated. Every rank routes its own tokens (router → top-k → permute, as without EP); then
 *   dispatch   each permuted row travels to the rank owning its expert (rows arrive grouped by
 *              source rank, and are placed expert-major: expert e's rows are source 0's, then
 *              source 1's, ... each in the source's permuted order);
 *   experts    grouped GEMM gate_up with SwiGLU fused, grouped GEMM down, on the local experts;
 *   combine    the expert outputs travel back to their source rank (in its permuted order), where
 *              the usual unpermute weights and sums them per token.
 * Backward runs the reverse: the output gradients of the rows are dispatched (the same layout as
 * the forward's dispatch), the grouped GEMM backward runs on the local experts (weight gradients
 * of the local experts only), and the input gradients of the rows are combined back.
 *
 * Two dispatchers move the rows, both exact (they produce the same buffers bit for bit, so the
 * training result does not depend on the choice):
 *   alltoall   one MPI_Alltoall of padded blocks, no size exchange: the block for (peer, expert)
 *              holds a two-float header (row count; "this source overflowed somewhere") and
 *              `capacity` rows, capacity = ⌈capacity_factor · max_tokens · K / E⌉ per expert and
 *              source rank (max_tokens: the micro-batch capacity, the same on every rank, so the
 *              block size is known without an exchange). Overflow policy: EXACT SPILL. Rows beyond
 *              the capacity are not dropped: when any source of the group flagged an overflow
 *              (every rank learns it from the headers, so all agree), a second exchange (all-to-all-v
 *              with the counts already known from the headers) carries the rows beyond capacity.
 *              The result is identical; the spill costs a second round and is counted
 *              (ep_stats.spill_rows / spill_rounds: a persistent spill means the factor is too
 *              small). Megatron drops such tokens instead; moerl keeps the training exact.
 *   alltoallv  exact counts: the row counts per (peer, expert) are exchanged first (one small
 *              MPI_Alltoall of ints, forward dispatch only: the other three exchanges reuse them),
 *              then one MPI_Alltoallv of the rows.
 * actor.moe.dispatcher=auto picks alltoall up to actor.moe.alltoall_max_ep ranks, alltoallv above
 * (par_dispatcher, src/parallel/grid.h).
 *
 * Communication runs on one thread of the OpenMP team (`omp single` between the team's barriers);
 * the copies around it too. Every rank of an EP group must run the same sequence of forward and
 * backward passes (the same number of micro-batches): each MoE layer's exchange is a collective.
 *
 * Gradients: replicated parameters are summed over the stage's ranks (par_grid.stage_comm), the
 * expert weights over par_grid.ep_dp_comm (the ranks holding the same experts): ep_reduce_grads.
 * The aux load-balancing loss is unchanged (every rank routes over all E experts; its counts are
 * summed over all ranks by the caller as without EP).
 * Sources: Megatron-LM MoEAlltoAllTokenDispatcher (dispatch → sort chunks by expert → grouped MLP →
 * unsort → combine), DeepSpeed-MoE / GShard (capacity factor), the Ascend MoE practice (all-to-all
 * vs all-to-all-v by EP size). */
#ifndef MOERL_PARALLEL_EP_H
#define MOERL_PARALLEL_EP_H

#include "model/forward.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/grid.h"

typedef struct ep_state ep_state;

typedef struct {
    long exchanges;     /* row exchanges (dispatch and combine, forward and backward) */
    long size_exchanges; /* alltoallv: count exchanges (one per forward dispatch) */
    long rows_sent;     /* rows this rank sent to OTHER ranks (payload rows, H floats each) */
    long spill_rounds;  /* alltoall exchanges that needed the spill round (any rank overflowed) */
    long spill_rows;    /* rows this rank sent in spill rounds */
    long max_block;     /* largest row count seen in one (source, expert) block */
    long idle_passes;   /* ep_idle_pass calls (forward or forward + backward) */
    double seconds;     /* wall time inside the exchanges (communication and the copies around it) */
} ep_stats;

/* Set c->exec.ep_size / ep_rank from the grid (g->ep, g->ep_rank): the model built from c then
 * holds only this rank's experts. No-op when g->ep == 1. */
void ep_config_apply(const par_grid *g, moe_config *c);

/* EP runtime for one trainer rank of grid g (g->ep > 1) and a model of config c (whose exec.ep_size
 * / ep_rank must equal the grid's: ep_config_apply) with micro-batches of at most max_tokens
 * tokens. The dispatcher is par_dispatcher(g), the capacity factor g->cfg.capacity_factor. Not
 * collective. The grid must outlive the state. Errors (NULL with a message): g->ep ≤ 1, E not
 * divisible by ep, c's expert slice differs from the grid's, model.moe.grouped_gemm=false or
 * model.moe.stacked_weights=false (the per-expert loop and per-expert weight schedules are not
 * implemented with EP), max_tokens ≤ 0. */
ep_state *ep_state_new(const par_grid *g, const moe_config *c, int max_tokens);
void ep_state_free(ep_state *ep);
/* The dispatcher in use (alltoall or alltoallv) and the alltoall block capacity in rows. */
moe_dispatcher ep_dispatcher(const ep_state *ep);
int ep_capacity(const ep_state *ep);
/* Counters since creation / the last reset. */
ep_stats ep_get_stats(const ep_state *ep);
void ep_reset_stats(ep_state *ep);

/* The model's MoE hooks (model/forward.h's model_hooks: moe_forward, moe_backward, moe_idle) with an
 * ep_state as their runtime: ep_moe_forward_team, ep_moe_backward_team, ep_idle_pass. Every ep_state
 * begins with a model_par_head pointing here, so an ep_state can be given to engine_set_ep (the
 * rollout engine's expert parallelism) or as model_acts.par; par_state's table delegates to these. */
extern const model_hooks ep_model_hooks;

/* ---- the MoE block's hooks (src/model/forward.c), called by EVERY thread of a driver team ---- */
/* Forward experts stage of MoE layer l on x[N,H]: after the permute index of s (sorted_row,
 * tokens_per_expert, offsets over the E global experts) is complete and visible to the team,
 * gathers the permuted rows into s->permuted, dispatches them, runs the local experts and combines
 * the outputs into s->y [N·K, H] in permuted order (what the unpermute reads). Saves what the
 * backward needs per layer. Ends with a team barrier. */
void ep_moe_forward_team(ep_state *ep, const moe_model *m, int l, const float *x, mlp_acts *s, int N);
/* Backward experts stage of layer l: d_y[N·K, H] (∂loss/∂ the expert output rows, permuted order,
 * complete and visible to the team) → d_permuted[N·K, H] (OVERWRITTEN, ∂loss/∂ the permuted input
 * rows); the local experts' weight gradients are ACCUMULATED into dWgu [E/ep, 2I, H] and dWd
 * [E/ep, H, I]. Ends with a team barrier. */
void ep_moe_backward_team(ep_state *ep, const moe_model *m, int l, const mlp_acts *s, const float *d_y,
                          float *d_permuted, float *dWgu, float *dWd);

/* ---- gradients, optimizer, checkpoints ---- */
/* Sum m->grads: tensors flagged TF_EXPERT over the grid's ep_dp_comm, every other tensor over
 * stage_comm (the caller's dlogp already divides by the global token count, so sums are the full
 * gradient). m NULL: the model of ep_state_attach. Collective over the stage. */
int ep_reduce_grads(ep_state *ep, moe_model *m);
/* Global L2 norm of the gradient of the whole (unsliced) model after ep_reduce_grads: the
 * replicated tensors' squares (the same on every rank) plus the expert squares summed over the EP
 * group. Collective over ep_comm. */
double ep_grad_norm(ep_state *ep, const moe_model *m);
/* adamw_step with its clipping on the global norm (ep_grad_norm): the gradients are scaled by the
 * clip coefficient here and adamw_step runs with clipping off, which applies the same factor
 * g·clip. Skips (returns 0, s->skipped++) when the loss or the global norm is not finite, on every
 * rank alike. Collective over ep_comm. */
int ep_adamw_step(ep_state *ep, adamw_state *s, moe_model *m, float lr, float loss, double *grad_norm);
/* Assemble the whole model on every rank of the EP group: full (uninitialised, or a model_init of
 * the config without exec.ep_size) gets the replicated tensors from local and every expert from its
 * owner (all-gather over ep_comm). Used to save HF checkpoints (model_save_hf refuses a slice) and
 * to compare against one rank. Collective over ep_comm. Errors: full's layout is not local's model
 * unsliced. */
int ep_gather_model(ep_state *ep, const moe_model *local, moe_model *full);
/* Copy this rank's slice of a whole model (same config without exec.ep_size) into local's params:
 * replicated tensors whole, expert tensors the rows of local's experts. Not collective. Errors:
 * full is not the unsliced model of local's config. */
int ep_slice_model(const moe_model *full, moe_model *local);
/* The streaming form of ep_slice_model, for a weight broadcast received bucket by bucket
 * (dist_recv_weights_stream): copies the part of a whole-model vector that falls in [off, off + cnt)
 * — vals, values of esz bytes (4 fp32, 2 bf16) at whole-layout offsets off.. — to local_vec in
 * local's layout (local->n_params values of esz bytes): replicated tensors where they lie, expert
 * tensors only the rows of local's experts; the padding between tensors is skipped. Handing every
 * range of [0, full->n_params) once fills local_vec exactly as ep_slice_model. Not collective.
 * Errors: full is not the unsliced model of local's config, the range past full->n_params, esz not
 * 2 or 4. */
int ep_slice_range(const moe_model *full, const moe_model *local, size_t off, const void *vals, size_t cnt, size_t esz,
                   void *local_vec);

/* Floats of the whole (unsliced) model's layout of ep's config. */
size_t ep_whole_params(const ep_state *ep);
/* This rank's part of a vector in the whole model's layout (weights, AdamW moments): replicated
 * tensors whole, expert tensors the rows of local's experts, into local_vec [local->n_params].
 * Not collective. */
void ep_slice_vec(const ep_state *ep, const moe_model *local, const float *whole_vec, float *local_vec);
/* The whole model (and with moments != NULL the whole AdamW moments of os, os being in local's
 * layout) on the EP ranks with keep = 1: whole := a new inference model (model_init_inference of
 * the unsliced config; model_free it) holding the replicated tensors of the keeper's own copy and
 * every expert from its owner; *moments := os's scalars with m / v of the whole layout (free
 * both). Members with keep = 0 only send (no whole-model buffer anywhere but on the keeper:
 * point-to-point messages per expert tensor, not an all-gather). Several keepers in one group are
 * served in turn. Collective over ep_comm. Errors: the allocation or the transport failing
 * (nothing left allocated). */
int ep_gather_full(ep_state *ep, const moe_model *local, const adamw_state *os, int keep, moe_model *whole,
                   adamw_state *moments);

/* Replace the whole model m (exec.ep_size unset) by this rank's slice of it (g->ep > 1; a no-op at
 * ep 1): the model par_state_init receives becomes the one ep_state_new expects, and the full
 * expert weights are freed. Gradients are allocated when m had them. Not collective. */
int ep_slice_in_place(const par_grid *g, moe_model *m);

/* Every rank of an EP group must run the same passes: a rank with fewer micro-batches than its
 * group (uneven data shards) runs the missing ones as idle passes — no tokens of its own, but its
 * experts still compute the rows the others send and accumulate their weight gradients.
 * ep_max_passes: the largest `passes` over the EP group (collective over ep_comm; −1 on error).
 * ep_idle_pass: one idle forward (every MoE layer in order) and, with backward, the idle backward
 * (in reverse) — matching one micro-batch's model_forward (+ model_backward) on the other ranks;
 * under activation recompute (the model's exec.recompute) each backward layer is preceded by its
 * recomputed forward's exchange, as model_backward does; m NULL: the model of ep_state_attach.
 * Call outside OpenMP regions. Collective over ep_comm. */
int ep_max_passes(ep_state *ep, int passes);
void ep_idle_pass(ep_state *ep, moe_model *m, int backward);
/* One MoE layer l of an idle pass (forward, or with backward = 1 its backward), for callers that
 * interleave it with other strategies' layer events (EP × FSDP: parallel.c puts each layer's
 * exchange where forward.c's pass has it between the FSDP events). No-op for a dense layer.
 * ep_count_idle_pass: count such a pass in ep_stats.idle_passes. */
void ep_idle_layer(ep_state *ep, moe_model *m, int l, int backward);
void ep_count_idle_pass(ep_state *ep);
/* Whether the model of ep_state_attach recomputes activations (exec.recompute): its backward layers
 * then begin with the recomputed forward's exchange (an idle rank runs ep_idle_layer(l, 0) first). */
int ep_recomputes(const ep_state *ep);

/* Several passes in flight (pipeline × EP: a stage's 1F1B keeps up to pp − stage micro-batches between their
 * forward and backward): the expert side's saved state of every MoE layer (the rows received, their counts and
 * activations, which the backward reuses) is kept per bank; ep_use_bank makes bank k of n the one the next
 * passes use (banks [old n, n) are created empty; k < n). Bank 0 is the state's own. Not collective. */
void ep_use_bank(ep_state *ep, int k, int n);

/* par_state_init's form: ep_slice_in_place(g, m) then ep_state_new(g, &m->cfg, max_tokens), the
 * state remembering m (ep_idle_pass may then take m = NULL). ep_state_detach: the inverse, for
 * par_state_free — the whole model assembled back into m on every rank of the EP group (collective
 * over ep_comm; the gradients are zero, the expert weights are the owners'), then the state freed.
 * NULL is a no-op. */
ep_state *ep_state_attach(const par_grid *g, moe_model *m, int max_tokens);
int ep_state_detach(ep_state *ep);

#endif
