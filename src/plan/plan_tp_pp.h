/* moerl plan's rows for tensor parallelism × the pipeline (actor.megatron.tensor_model_parallel_size with
 * actor.pipeline_parallel_size; src/parallel/parallel.c tp_pp_init): what a TP rank of one pipeline stage sends
 * over its TP group (grid.tp_comm), on top of the pipeline rows plan.c computes for the TP slice's model.
 *
 * The layout (docs/parallelism.md "TP × pipeline"): the model is sliced first (tp_config_apply), then the
 * pipeline cuts the slice into stages; a stage's decoder layers [l0, l1) run TP-split, the vocab-parallel
 * embedding on the first stage, the final norm, vocab-parallel LM head and its logprob statistics on the last.
 * So a stage's TP collectives are TP × DP's (plan.h plan_traffic tp_*) restricted to what the stage computes:
 *   forward, per micro-batch of N tokens: N·H floats for the embedding (first stage), per layer N·H (o_proj)
 *            + N·H (a dense MLP's, or expert-TP's, down projection);
 *   backward: N·H for the head's input gradient (last stage), per layer N·H (q/k/v input gradient) + N·H
 *            (dense gate_up) or, under expert-TP, N·H + N·K (the experts' input and routing-weight gradients);
 *   last stage: the logprob statistics, 4N doubles all-reduced twice per training pass (forward, and again in
 *            vp_logprob_backward) and once per logprob micro-batch; the vocabulary max all-gathered as many
 *            times ((P−1)·2N floats each);
 *   per update: the stage's q/k-norm gradients (tp_reduce_layer_grads over its layers, 2·head_dim floats
 *            a layer), with nkv < P the replicated k/v heads' all-gather over its layers, and the clipping
 *            norm's 2 doubles (every stage's tp_norm_squares, before the stages' sum over pp_comm);
 *   activation recompute (model.enable_gradient_checkpointing): full recompute re-runs each layer's forward
 *            before its backward (forward.c recompute_layer), repeating o_proj's all-reduce of N·H per layer and
 *            micro-batch of the training pass; the MLP output's sum is not repeated (the next layer's input is
 *            kept), nor is anything under selective recompute (the post-attention norm and the MLP / MoE
 *            internals are local to the rank). The stage's activation slots hold the recompute arena
 *            (plan_acts_bytes of the stage's layers, as without the pipeline).
 * All-reduces count 2(P−1)/P of their bytes, all-gathers (P−1) × a rank's part (dist_comm_bytes). */
#ifndef MOERL_PLAN_TP_PP_H
#define MOERL_PLAN_TP_PP_H

#include "model/model.h"
#include "plan/plan.h"

/* One TP rank's stage in plan_tp_pp_update / plan_tp_pp_logprob. */
typedef struct {
    int P;        /* the TP group's size (≥ 2) */
    int l0, l1;   /* the stage's decoder layers [l0, l1) of the slice's model */
    int first;    /* the stage holds the embedding (stage 0) */
    int last;     /* the stage holds the final norm and LM head (stage pp − 1) */
    int kv_rep;   /* the whole model's nkv < P: each rank holds one replicated kv head (tp_config_apply) */
    double db;    /* bytes per activation / gradient element (plan_input.dtype_bytes) */
    int recompute; /* activation recompute: MODEL_RECOMPUTE_* (plan_input.recompute); full repeats each layer's
                      o_proj all-reduce before its backward, selective no TP collective */
} plan_tp_stage;

/* Floats the stage's TP group all-reduces in one forward pass of N tokens over the slice lc (the embedding
 * if first, every layer's o_proj and row-parallel MLP output in [l0, l1)). */
double plan_tp_stage_fwd_floats(const moe_config *lc, const plan_tp_stage *s, double N);

/* The same for one backward pass (each layer's q/k/v and column-parallel MLP input gradients, expert-TP's
 * routing-weight gradient [N,K]; the head's input gradient if last). */
double plan_tp_stage_bwd_floats(const moe_config *lc, const plan_tp_stage *s, double N);

/* One optimizer update's TP rows of the stage, set in *t (tp_act_allreduce, tp_allgather; tp_dp_allreduce,
 * tp_reduce_scatter and tp_ep_allreduce 0: the data-parallel sum of the stage's range is the pipeline's
 * pp_grad_allreduce over grid.dp_comm): mb micro-batches of N tokens, each through fo forward-only pre-passes
 * and one training pass (forward + backward), then the per-update sums above. */
void plan_tp_pp_update(const moe_config *lc, const plan_tp_stage *s, double N, double mb, double fo,
                       plan_traffic *t);

/* A forward-only logprob pass's TP rows of the stage over n_mb micro-batches of N tokens, set in *t
 * (tp_act_allreduce, tp_allgather; tp_reduce_scatter 0). */
void plan_tp_pp_logprob(const moe_config *lc, const plan_tp_stage *s, double N, double n_mb, plan_traffic *t);

#endif
