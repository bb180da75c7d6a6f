/* moerl plan's TP rows of one pipeline stage under TP × pipeline (see plan_tp_pp.h). */
#include "plan/plan_tp_pp.h"

/* Row-parallel outputs of layer l besides o_proj: a dense MLP's down projection, or the experts' under
 * expert-TP (the MoE output of whole experts needs no all-reduce). */
static int row_parallel_mlp(const moe_config *lc, int l) { return !moe_config_layer_is_moe(lc, l) || lc->exec.tp_experts; }

double plan_tp_stage_fwd_floats(const moe_config *lc, const plan_tp_stage *s, double N) {
    const double H = lc->hidden_size;
    double f = s->first ? N * H : 0; /* the vocab-parallel embedding */
    for (int l = s->l0; l < s->l1; l++) f += N * H * (1 + row_parallel_mlp(lc, l));
    return f;
}

double plan_tp_stage_bwd_floats(const moe_config *lc, const plan_tp_stage *s, double N) {
    const double H = lc->hidden_size, K = lc->num_experts_per_tok;
    double f = s->last ? N * H : 0; /* the vocab-parallel head's input gradient */
    for (int l = s->l0; l < s->l1; l++) {
        f += N * H; /* q/k/v's input gradient */
        if (!moe_config_layer_is_moe(lc, l)) f += N * H;     /* the dense gate_up's */
        else if (lc->exec.tp_experts) f += N * H + N * K;    /* expert-TP: the experts' and the routing weights' */
    }
    return f;
}

void plan_tp_pp_update(const moe_config *lc, const plan_tp_stage *s, double N, double mb, double fo,
                       plan_traffic *t) {
    const int P = s->P, layers = s->l1 - s->l0;
    const double f = 2.0 * (P - 1) / P, db = s->db, hd = lc->head_dim, H = lc->hidden_size;
    const double fwd = plan_tp_stage_fwd_floats(lc, s, N), bwd = plan_tp_stage_bwd_floats(lc, s, N);
    t->tp_act_allreduce = f * db * (mb * (fwd + bwd) + fo * mb * fwd);
    if (s->recompute == MODEL_RECOMPUTE_FULL) /* the recomputed forward's o_proj sum, per layer and micro-batch */
        t->tp_act_allreduce += f * db * mb * layers * N * H;
    if (s->last) /* the logprob statistics (4N doubles), in the forward and again in vp_logprob_backward */
        t->tp_act_allreduce += f * mb * 2 * 4 * N * 8;
    t->tp_act_allreduce += f * layers * 2 * hd * db; /* the stage's q/k-norm gradients */
    t->tp_act_allreduce += f * 2 * 8;                /* the stage's clipping-norm squares (tp_norm_squares) */
    t->tp_allgather = s->last ? (P - 1.0) * mb * 2 * (2 * N * 4) : 0; /* the vocabulary max: a double as 2 floats */
    if (s->kv_rep) /* each replicated kv head's holders sum its k/v gradients: an all-gather per layer */
        t->tp_allgather += (P - 1.0) * layers * 2 * hd * H * db;
    t->tp_reduce_scatter = 0;
    t->tp_dp_allreduce = 0;
    t->tp_ep_allreduce = 0;
}

void plan_tp_pp_logprob(const moe_config *lc, const plan_tp_stage *s, double N, double n_mb, plan_traffic *t) {
    const int P = s->P;
    const double f = 2.0 * (P - 1) / P;
    t->tp_act_allreduce = n_mb * (f * s->db * plan_tp_stage_fwd_floats(lc, s, N) + (s->last ? f * 4 * N * 8 : 0));
    t->tp_allgather = s->last ? (P - 1.0) * n_mb * 2 * N * 4 : 0;
    t->tp_reduce_scatter = 0;
}
