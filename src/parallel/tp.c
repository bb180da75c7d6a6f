/* Tensor parallelism of the trainer (see tp.h). Sources of the method (semantics only): Megatron-LM
 * megatron/core/tensor_parallel/layers.py (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding),
 * cross_entropy.py (vocab-parallel cross entropy). */
#include "parallel/tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/forward.h"

struct tp_state {
    const par_grid *g;
    dist_comm *comm; /* the TP group */
    dist_comm *dp;   /* the ranks holding the same slice (NULL or size 1: none) */
    int P, rank;
    int kv_rep; /* nkv < P: key/value heads replicated over P / nkv ranks each */
    dist_comm *expert_dp, *expert_ep; /* TP × EP (tp_set_expert_groups): the experts' gradient sum / norm groups */
    moe_model whole; /* the whole config's tensor table (no buffers) */
    moe_model *model;
};

/* How a tensor is split: kept whole, by rows (dim −2), by rows in two halves (gate / up), by columns (dim −1). */
enum { TP_REPL = 0, TP_ROWS, TP_ROWS2, TP_COLS, TP_KV };

static int ends_with(const char *s, const char *suf) {
    const size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* kv_rep: the key/value heads are replicated (nkv < P: each rank holds the one its query heads use, Megatron) */
static int tp_kind_kv(const tensor_info *t, int experts_split, int kv_rep) {
    const char *n = t->name;
    if (ends_with(n, "k_proj.weight") || ends_with(n, "v_proj.weight")) return kv_rep ? TP_KV : TP_ROWS;
    if (ends_with(n, "embed_tokens.weight") || !strcmp(n, "lm_head.weight") || ends_with(n, "q_proj.weight"))
        return TP_ROWS;
    if (ends_with(n, "o_proj.weight") || ends_with(n, "mlp.down_proj")) return TP_COLS;
    if (ends_with(n, "mlp.gate_up_proj")) return TP_ROWS2;
    if (ends_with(n, "mlp.experts.gate_up")) return experts_split ? TP_ROWS2 : TP_REPL;
    if (ends_with(n, "mlp.experts.down")) return experts_split ? TP_COLS : TP_REPL;
    return TP_REPL;
}

#define tp_kind(t, split) tp_kind_kv((t), (split), ts->kv_rep)

/* Copy between rank q's slice (local tensor lt of vector lv) and the whole tensor wt of wv: to_local 1 copies
 * whole → slice, 0 slice → whole. Shapes: [B][R][C] with B the leading dims (experts) of a 3-D tensor. */
static void tp_copy(const tensor_info *lt, float *lv, const tensor_info *wt, float *wv, int kind, int q, int P,
                    int to_local) {
    float *L = lv + lt->offset, *W = wv + wt->offset;
    if (kind == TP_REPL) {
        if (to_local) memcpy(L, W, (size_t)lt->numel * sizeof(float));
        else memcpy(W, L, (size_t)lt->numel * sizeof(float));
        return;
    }
    const int nd = lt->ndim;
    const int64_t C = wt->shape[nd - 1], R = wt->shape[nd - 2], B = wt->numel / (R * C);
    const int64_t Rl = lt->shape[nd - 2], Cl = lt->shape[nd - 1];
    if (kind == TP_ROWS && to_local) memset(L, 0, (size_t)lt->numel * sizeof(float)); /* the vocabulary's padding */
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < Rl; r++) {
            int64_t wr = r, wc = 0;
            if (kind == TP_ROWS) wr = q * Rl + r;
            else if (kind == TP_KV) wr = (int64_t)q * (R / Rl) / P * Rl + r; /* the kv head rank q's query heads use */
            else if (kind == TP_ROWS2) wr = r < Rl / 2 ? q * (Rl / 2) + r : R / 2 + q * (Rl / 2) + (r - Rl / 2);
            else wc = q * Cl;
            if (wr >= R) continue; /* a padding row of the vocabulary (V not a multiple of P) */
            float *l = L + (b * Rl + r) * Cl, *w = W + (b * R + wr) * C + wc;
            if (to_local) memcpy(l, w, (size_t)Cl * sizeof(float));
            else memcpy(w, l, (size_t)Cl * sizeof(float));
        }
}

int tp_config_apply(moe_config *c, int P, int rank, int experts_split) {
    const int nkv = c->num_key_value_heads;
    struct {
        int v, bad; /* the model's value; whether P fails it */
        const char *field;
    } div[] = {{c->num_attention_heads, c->num_attention_heads % P, "num_attention_heads"},
               {nkv, nkv < P ? P % nkv : nkv % P, "num_key_value_heads"},
               {c->intermediate_size, c->intermediate_size % P, "intermediate_size"},
               {c->moe_intermediate_size, experts_split && c->num_experts > 0 && c->moe_intermediate_size % P,
                "moe_intermediate_size"}};
    for (size_t i = 0; i < sizeof div / sizeof *div; i++)
        if (div[i].bad)
            return moerl_errorf("actor.megatron.tensor_model_parallel_size=%d must divide the model's %s (%d)%s", P,
                                div[i].field, div[i].v,
                                i == 1 ? " or be a multiple of it (each key/value head then replicated over P / nkv ranks)"
                                : i == 3 ? " (or set actor.megatron.expert_tensor_parallel_size=1: experts whole)"
                                         : "");
    if (c->exec.per_expert_loop || c->exec.separate_permute)
        return moerl_errorf("actor.megatron.tensor_model_parallel_size=%d runs the fused MoE path only: set "
                            "model.moe.per_expert_loop and model.moe.separate_permute to false", P);
    if ((c->exec.ep_size > 1 && experts_split) || c->exec.tp_size > 1) /* TP × EP: experts whole only */
        return moerl_errorf("tp_config_apply: the config is already sliced (ep_size %d, tp_size %d)", c->exec.ep_size,
                            c->exec.tp_size);
    c->num_attention_heads /= P;
    c->num_key_value_heads = c->num_key_value_heads < P ? 1 : c->num_key_value_heads / P;
    c->intermediate_size /= P;
    c->exec.tp_vocab = c->vocab_size;
    c->vocab_size = (c->vocab_size + P - 1) / P; /* padded to a multiple of P (Megatron): tp_vocab marks the end */
    if (experts_split) c->moe_intermediate_size /= P;
    c->bos_token_id = c->eos_token_id = -1;
    c->exec.tp_size = P;
    c->exec.tp_rank = rank;
    c->exec.tp_experts = experts_split;
    return MOERL_OK;
}

static int experts_split(const tp_state *ts) { return ts->model->cfg.exec.tp_experts; }

void tp_slice_vec(const tp_state *ts, const float *whole_vec, float *local_vec) {
    const moe_model *m = ts->model;
    for (int i = 0; i < m->n_tensors; i++)
        tp_copy(&m->tensors[i], local_vec, &ts->whole.tensors[i], (float *)whole_vec,
                tp_kind(&m->tensors[i], experts_split(ts)), ts->rank, ts->P, 1);
}

size_t tp_whole_params(const tp_state *ts) { return ts->whole.n_params; }

int tp_check_recompute(const par_config *pc, const moe_config *c) {
    if (c->exec.recompute && pc->tensor_model_parallel_size > 1 && pc->sequence_parallel &&
        pc->expert_parallel_size > 1)
        return moerl_errorf("model.enable_gradient_checkpointing=true with actor.megatron.sequence_parallel=true and "
                            "actor.expert_parallel_size=%d: activation recompute does not combine with Megatron "
                            "sequence parallelism × EP in this build (it does with TP × EP, and with SP over TP × DP)",
                            pc->expert_parallel_size);
    return MOERL_OK;
}

tp_state *tp_state_attach(const par_grid *g, moe_model *m) {
    const int P = g->tp, split = g->cfg.expert_tensor_parallel_size != 1;
    if (tp_check_recompute(&g->cfg, &m->cfg) != MOERL_OK) return NULL;
    moe_config lc = m->cfg;
    if (tp_config_apply(&lc, P, g->tp_rank, split && m->cfg.num_experts > 0) != MOERL_OK) return NULL;
    lc.exec.tp_sp = g->cfg.sequence_parallel; /* Megatron SP: the slice's arena holds its rank's rows (forward.h) */
    tp_state *ts = xcalloc(1, sizeof *ts);
    ts->g = g;
    ts->comm = g->tp_comm;
    ts->dp = g->dp > 1 ? g->dp_comm : NULL;
    ts->P = P;
    ts->rank = g->tp_rank;
    ts->kv_rep = m->cfg.num_key_value_heads < P;
    moe_model loc;
    if (model_init_layout(&ts->whole, &m->cfg, 0) != MOERL_OK ||
        (m->grads ? model_init(&loc, &lc) : model_init_inference(&loc, &lc)) != MOERL_OK) {
        model_free(&ts->whole);
        free(ts);
        return NULL;
    }
    ts->model = &loc;
    tp_slice_vec(ts, m->params, loc.params);
    model_free(m);
    *m = loc; /* the views point into the heap buffers, so the struct moves as a whole */
    ts->model = m;
    return ts;
}

void tp_allreduce(tp_state *ts, double *x, size_t n, int max) {
    if (!max) {
        if (dist_comm_allreduce_f64(ts->comm, x, n) != MOERL_OK) moerl_fatal("tensor-parallel all-reduce: %s", moerl_last_error());
        return;
    }
    /* max: gather every member's values (n small: one per token) */
    float *f = xmalloc((size_t)ts->P * n * 2 * sizeof(float)), *mine = xmalloc(n * 2 * sizeof(float));
    for (size_t i = 0; i < n; i++) { /* a double as two floats: its high part and the remainder */
        mine[2 * i] = (float)x[i];
        mine[2 * i + 1] = (float)(x[i] - (double)(float)x[i]);
    }
    if (dist_comm_allgather_f32(ts->comm, mine, n * 2, f) != MOERL_OK)
        moerl_fatal("tensor-parallel all-gather: %s", moerl_last_error());
    for (size_t i = 0; i < n; i++) {
        double v = -INFINITY;
        for (int q = 0; q < ts->P; q++) {
            const double w = (double)f[(size_t)q * n * 2 + 2 * i] + (double)f[(size_t)q * n * 2 + 2 * i + 1];
            v = w > v ? w : v;
        }
        x[i] = v;
    }
    free(f);
    free(mine);
}

void tp_allreduce_f32(tp_state *ts, float *x, size_t n) {
    if (dist_comm_allreduce_f32(ts->comm, x, n) != MOERL_OK) moerl_fatal("tensor-parallel all-reduce: %s", moerl_last_error());
}

/* Replicated key/value heads (nkv < P): each holder's k/v gradient covers its own query heads; the sum over
 * the P / nkv ranks holding the same head (an all-gather over the group, then each adds its head's copies). */
static int tp_sum_kv_grads(tp_state *ts, int lo, int hi) {
    moe_model *m = ts->model;
    const int nkv = ts->whole.cfg.num_key_value_heads, rep = ts->P / nkv;
    const size_t n = (size_t)m->cfg.head_dim * m->cfg.hidden_size; /* one head of k_proj (and of v_proj) */
    float *mine = xmalloc(2 * n * sizeof(float)), *all = xmalloc((size_t)ts->P * 2 * n * sizeof(float));
    int rc = MOERL_OK;
    for (int l = lo; l < hi && rc == MOERL_OK; l++) {
        layer_views *g = &m->g.layers[l];
        memcpy(mine, g->k_proj, n * sizeof(float));
        memcpy(mine + n, g->v_proj, n * sizeof(float));
        if ((rc = dist_comm_allgather_f32(ts->comm, mine, 2 * n, all)) != MOERL_OK) break;
        memset(mine, 0, 2 * n * sizeof(float));
        for (int q = ts->rank / rep * rep; q < (ts->rank / rep + 1) * rep; q++) /* in rank order: the same sum */
            for (size_t i = 0; i < 2 * n; i++) mine[i] += all[(size_t)q * 2 * n + i];
        memcpy(g->k_proj, mine, n * sizeof(float));
        memcpy(g->v_proj, mine + n, n * sizeof(float));
    }
    free(mine);
    free(all);
    return rc == MOERL_OK ? MOERL_OK : moerl_error_prefix("tensor-parallel key/value gradient sum: ");
}

void tp_set_expert_groups(tp_state *ts, dist_comm *expert_dp, dist_comm *ep) {
    ts->expert_dp = expert_dp;
    ts->expert_ep = ep;
}

const moe_model *tp_whole_layout(const tp_state *ts) { return &ts->whole; }

/* Sum the gradients of the tensors with (flags & TF_EXPERT) == want_expert over c (packed in one buffer). */
static int tp_sum_kind(tp_state *ts, int want_expert, dist_comm *c) {
    moe_model *m = ts->model;
    if (!c || dist_comm_size(c) <= 1) return MOERL_OK;
    size_t n = 0, o = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (!!(m->tensors[i].flags & TF_EXPERT) == want_expert) n += (size_t)m->tensors[i].numel;
    float *buf = xalloc_aligned((n + 1) * sizeof(float));
    for (int pass = 0; pass < 2; pass++, o = 0) /* pass 0 packs, pass 1 unpacks after the sum */
        for (int i = 0; i < m->n_tensors; i++) {
            const tensor_info *t = &m->tensors[i];
            if (!!(t->flags & TF_EXPERT) != want_expert) continue;
            float *g = m->grads + t->offset;
            if (pass) memcpy(g, buf + o, (size_t)t->numel * sizeof(float));
            else memcpy(buf + o, g, (size_t)t->numel * sizeof(float));
            o += (size_t)t->numel;
            if (!pass && o == n && dist_comm_allreduce_f32(c, buf, n) != MOERL_OK) {
                free(buf);
                return MOERL_ERR;
            }
        }
    free(buf);
    return MOERL_OK;
}

int tp_reduce_grads(tp_state *ts) {
    moe_model *m = ts->model;
    if (ts->expert_dp) { /* TP × EP: the experts over the ranks holding them, the rest over dp */
        if (tp_sum_kind(ts, 0, ts->dp) != MOERL_OK || tp_sum_kind(ts, 1, ts->expert_dp) != MOERL_OK)
            return moerl_error_prefix("tensor × expert-parallel gradient sum: ");
    } else if (ts->dp && dist_comm_size(ts->dp) > 1 &&
               dist_comm_allreduce_f32(ts->dp, m->grads, m->n_params) != MOERL_OK)
        return moerl_error_prefix("tensor-parallel data-parallel gradient sum: ");
    return tp_reduce_layer_grads(ts, 0, m->cfg.num_hidden_layers);
}

int tp_reduce_layer_grads(tp_state *ts, int lo, int hi) {
    moe_model *m = ts->model;
    if (ts->kv_rep && tp_sum_kv_grads(ts, lo, hi) != MOERL_OK) return MOERL_ERR;
    for (int l = lo; l < hi; l++) { /* each rank's heads' share of the q/k norms */
        const int hd = m->cfg.head_dim;
        float buf[2 * 1024];
        if (hd > 1024) return moerl_errorf("tp_reduce_grads: head_dim %d above 1024", hd);
        memcpy(buf, m->g.layers[l].q_norm, hd * sizeof(float));
        memcpy(buf + hd, m->g.layers[l].k_norm, hd * sizeof(float));
        if (dist_comm_allreduce_f32(ts->comm, buf, 2 * (size_t)hd) != MOERL_OK)
            return moerl_error_prefix("tensor-parallel q/k-norm gradient sum: ");
        memcpy(m->g.layers[l].q_norm, buf, hd * sizeof(float));
        memcpy(m->g.layers[l].k_norm, buf + hd, hd * sizeof(float));
    }
    return MOERL_OK;
}

double tp_norm_squares(tp_state *ts, const size_t *lo, const size_t *hi, int nr) {
    const moe_model *m = ts->model;
    double ss[3] = {0, 0, 0}; /* replicated (counted once), split, replicated kv heads: as tp_adamw_step */
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        int in = 0;
        for (int r = 0; r < nr && !in; r++) in = t->offset >= lo[r] && t->offset < hi[r];
        if (!in) continue;
        const float *g = m->grads + t->offset;
        double v = 0;
        for (int64_t j = 0; j < t->numel; j++) v += (double)g[j] * (double)g[j];
        const int k = tp_kind(t, experts_split(ts));
        ss[k == TP_KV ? 2 : k != TP_REPL] += v;
    }
    if (dist_comm_allreduce_f64(ts->comm, &ss[1], 2) != MOERL_OK)
        moerl_fatal("tensor-parallel norm: %s", moerl_last_error());
    return ss[0] + ss[1] + ss[2] * ts->whole.cfg.num_key_value_heads / ts->P;
}

int tp_adamw_step(tp_state *ts, adamw_state *s, float lr, float loss, double *grad_norm) {
    moe_model *m = ts->model;
    double ss[3] = {0, 0, 0}, sse = 0; /* replicated (counted once), split, replicated kv heads; TP × EP's experts */
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        const float *g = m->grads + t->offset;
        double v = 0;
        for (int64_t j = 0; j < t->numel; j++) v += (double)g[j] * (double)g[j];
        const int k = tp_kind(t, experts_split(ts));
        if (ts->expert_ep && (t->flags & TF_EXPERT)) sse += v;
        else ss[k == TP_KV ? 2 : k != TP_REPL] += v;
    }
    if (dist_comm_allreduce_f64(ts->comm, &ss[1], 2) != MOERL_OK) return moerl_error_prefix("tensor-parallel norm: ");
    if (ts->expert_ep && dist_comm_allreduce_f64(ts->expert_ep, &sse, 1) != MOERL_OK) /* each EP rank's experts */
        return moerl_error_prefix("tensor × expert-parallel norm: ");
    ss[0] += sse;
    /* each kv head is held by P / nkv members: counted once */
    const double norm = sqrt(ss[0] + ss[1] + ss[2] * ts->whole.cfg.num_key_value_heads / ts->P);
    if (grad_norm) *grad_norm = norm;
    if (!isfinite(norm) || !isfinite(loss)) {
        s->skipped++;
        return 0;
    }
    const float max_norm = s->cfg.max_grad_norm;
    if (max_norm > 0) {
        const double coef = max_norm / (norm + 1e-6); /* torch clip_grad_norm_, as adamw_step */
        if (coef < 1.0)
            for (size_t i = 0; i < m->n_params; i++) m->grads[i] *= (float)coef;
    }
    s->cfg.max_grad_norm = 0;
    const int r = adamw_step(s, m, lr, loss, NULL);
    s->cfg.max_grad_norm = max_norm;
    return r;
}

/* The whole vector on the member `root` from every member's slice (an all-gather of the slices). */
static int gather_vec(tp_state *ts, const float *local_vec, float *whole_vec, int root) {
    const moe_model *m = ts->model;
    float *all = xalloc_aligned(((size_t)ts->P * m->n_params + 1) * sizeof(float));
    int rc = dist_comm_allgather_f32(ts->comm, local_vec, m->n_params, all);
    if (rc == MOERL_OK && ts->rank == root)
        for (int q = 0; q < ts->P; q++)
            for (int i = 0; i < m->n_tensors; i++) {
                const int kind = tp_kind(&m->tensors[i], experts_split(ts));
                if (kind == TP_REPL && q != root) continue;
                tp_copy(&m->tensors[i], all + (size_t)q * m->n_params, &ts->whole.tensors[i], whole_vec, kind, q,
                        ts->P, 0);
            }
    free(all);
    return rc;
}

int tp_gather_full(tp_state *ts, const adamw_state *os, int keep, moe_model *whole, adamw_state *moments) {
    float mine = keep ? 1.0f : 0.0f, *all = xmalloc((size_t)ts->P * sizeof(float));
    if (dist_comm_allgather_f32(ts->comm, &mine, 1, all) != MOERL_OK) {
        free(all);
        return MOERL_ERR;
    }
    int root = -1, nk = 0;
    for (int q = 0; q < ts->P; q++)
        if (all[q] != 0.0f) root = q, nk++;
    free(all);
    if (nk > 1) return moerl_errorf("tp_gather_full: %d members of a TP group asked to keep the model, expected one", nk);
    if (nk == 0) return MOERL_OK;
    if (keep) {
        memset(whole, 0, sizeof *whole);
        if (model_init_inference(whole, &ts->whole.cfg) != MOERL_OK) return MOERL_ERR;
        if (moments) {
            *moments = *os;
            moments->n = whole->n_params;
            moments->m = xalloc_aligned((whole->n_params + 1) * sizeof(float));
            moments->v = xalloc_aligned((whole->n_params + 1) * sizeof(float));
        }
    }
    int rc = gather_vec(ts, ts->model->params, keep ? whole->params : NULL, root);
    if (rc == MOERL_OK && moments) rc = gather_vec(ts, os->m, keep ? moments->m : NULL, root);
    if (rc == MOERL_OK && moments) rc = gather_vec(ts, os->v, keep ? moments->v : NULL, root);
    if (rc != MOERL_OK && keep) {
        model_free(whole);
        if (moments) {
            free(moments->m);
            free(moments->v);
            memset(moments, 0, sizeof *moments);
        }
    }
    return rc;
}

int tp_load_weights(tp_state *ts, const char *dir) {
    moe_model w;
    if (model_init_inference(&w, &ts->whole.cfg) != MOERL_OK) return MOERL_ERR;
    if (model_load_weights(&w, dir) != MOERL_OK) {
        model_free(&w);
        return MOERL_ERR;
    }
    tp_slice_vec(ts, w.params, ts->model->params);
    model_free(&w);
    return MOERL_OK;
}

int tp_state_detach(tp_state *ts) {
    if (!ts) return MOERL_OK;
    moe_model *m = ts->model;
    const int with_grads = m->grads != NULL;
    /* every member assembles the whole model (each is its own root in turn: P gathers) */
    moe_model full = {0};
    int rc = MOERL_OK;
    for (int q = 0; q < ts->P && rc == MOERL_OK; q++) {
        const int me = q == ts->rank;
        if (me) rc = with_grads ? model_init(&full, &ts->whole.cfg) : model_init_inference(&full, &ts->whole.cfg);
        if (rc == MOERL_OK) rc = gather_vec(ts, m->params, me ? full.params : NULL, q);
    }
    if (rc == MOERL_OK) {
        model_free(m);
        *m = full;
    } else if (full.params) {
        model_free(&full);
    }
    model_free(&ts->whole);
    free(ts);
    return rc;
}

/* ---- The streaming slice (rollout TP's weight sync) ---- */

/* Whole row wr of a tensor of R rows → the local row of rank q (kind as tp_kind_kv; Rl local rows), −1 when
 * q does not hold it. */
static int64_t tp_local_row(int kind, int64_t wr, int64_t R, int64_t Rl, int q, int P) {
    if (kind == TP_REPL || kind == TP_COLS) return wr;
    if (kind == TP_ROWS) return wr / Rl == q ? wr - (int64_t)q * Rl : -1;
    if (kind == TP_KV) return wr / Rl == (int64_t)q * (R / Rl) / P ? wr % Rl : -1;
    const int64_t h = Rl / 2, w2 = wr < R / 2 ? wr : wr - R / 2; /* TP_ROWS2: gate rows, then up rows */
    if (w2 / h != q) return -1;
    return (wr < R / 2 ? 0 : h) + w2 - (int64_t)q * h;
}

int tp_slice_range(const moe_model *full, const moe_model *local, size_t off, const void *vals, size_t cnt, size_t esz,
                   void *local_vec) {
    const moe_config *lc = &local->cfg;
    const int P = lc->exec.tp_size, q = lc->exec.tp_rank, split = lc->exec.tp_experts;
    if (P <= 1 || full->n_tensors != local->n_tensors || full->cfg.exec.tp_size > 1 ||
        lc->exec.tp_vocab != full->cfg.vocab_size)
        return moerl_errorf("tp_slice_range: the source is not the whole model of the slice's config");
    if (esz != 2 && esz != 4) return moerl_errorf("tp_slice_range: values of %zu bytes (fp32: 4, bf16: 2)", esz);
    if (off > full->n_params || cnt > full->n_params - off)
        return moerl_errorf("tp_slice_range: values [%zu, %zu) past the model's %zu", off, off + cnt, full->n_params);
    const int kv_rep = full->cfg.num_key_value_heads < P;
    const char *src = vals;
    char *dst = local_vec;
    for (int i = 0; i < local->n_tensors; i++) { /* tensors in layout order: stop past the range */
        const tensor_info *t = &local->tensors[i], *f = &full->tensors[i];
        if ((size_t)f->offset >= off + cnt) break;
        if ((size_t)(f->offset + f->numel) <= off) continue;
        const int kind = tp_kind_kv(t, split, kv_rep), nd = t->ndim;
        const int64_t C = f->shape[nd - 1], R = nd > 1 ? f->shape[nd - 2] : 1;
        const int64_t Rl = nd > 1 ? t->shape[nd - 2] : 1, Cl = t->shape[nd - 1];
        const int64_t c0 = kind == TP_COLS ? (int64_t)q * Cl : 0; /* the columns this rank keeps */
        const int64_t r_lo = ((int64_t)MOERL_MAX(off, (size_t)f->offset) - f->offset) / C,
                      r_hi = ((int64_t)MOERL_MIN(off + cnt, (size_t)(f->offset + f->numel)) - f->offset + C - 1) / C;
        for (int64_t br = r_lo; br < r_hi; br++) { /* whole rows (b, wr) = br over every leading index b */
            const int64_t b = br / R, wr = br % R, lr = tp_local_row(kind, wr, R, Rl, q, P);
            if (lr < 0) continue;
            const size_t w0 = f->offset + (size_t)(br * C + c0), a = MOERL_MAX(w0, off),
                         z = MOERL_MIN(w0 + (size_t)Cl, off + cnt);
            if (z <= a) continue;
            const size_t l0 = t->offset + (size_t)((b * Rl + lr) * Cl) + (a - w0);
            memcpy(dst + l0 * esz, src + (a - off) * esz, (z - a) * esz);
        }
    }
    return MOERL_OK;
}

void tp_state_free(tp_state *ts) {
    if (!ts) return;
    model_free(&ts->whole);
    free(ts);
}

moe_model *tp_state_model(tp_state *ts) { return ts->model; }
