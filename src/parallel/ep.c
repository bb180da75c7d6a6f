/* Expert parallelism: the MoE layers' token exchange (see ep.h for the layout, the dispatchers
 * and the overflow policy). */
#include "parallel/ep.h"

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "kernels/kernels.h"

/* Saved per MoE layer (forward → backward). Blocks are numbered b = peer·El + e (e: local expert
 * index of the owner). */
typedef struct {
    int *rcnt;        /* [P·El] rows from source p for local expert e */
    int *boff;        /* [P·El] expert-major row offset of block (p, e) */
    int *eoff;        /* [El+1] local expert offsets (the grouped GEMM's groups) */
    int rows;         /* Σ rcnt */
    float *x, *gu, *act; /* [rows, H], [rows, 2I], [rows, I]: the experts' inputs and activations */
    size_t cap;       /* rows allocated */
} ep_layer;

struct ep_state {
    model_par_head head; /* FIRST: the MoE hooks (ep_model_hooks), so an ep_state is a model_acts.par /
                          * engine_set_ep runtime */
    const par_grid *g;
    dist_comm *comm;
    int P, rank, E, El, lo, K, H, I, L;
    moe_dispatcher disp;
    int cap;          /* alltoall: rows per (peer, expert) block */
    ep_layer lay[MOERL_MAX_LAYERS];
    float *y, *dy, *dgu, *dact, *dx; /* expert-side scratch (not saved across layers) */
    size_t scr_cap;
    float *buf_a, *buf_b; /* send / receive staging */
    size_t buf_a_n, buf_b_n;
    float *red;       /* gradient packing */
    size_t red_n;
    moe_model *model; /* ep_state_attach's model (NULL with ep_state_new) */
    moe_model whole;  /* the unsliced model's tensor table (no buffers): ep_slice_vec / ep_gather_full */
    ep_stats st;
    ep_layer *bank;   /* ep_use_bank: [n_banks·L] the saved states of the banks not in use (cur's entries empty) */
    int n_banks, cur_bank;
};

/* Grow *p to at least n floats (contents not kept). */
static void ensure(float **p, size_t *cap, size_t n) {
    if (n <= *cap) return;
    free(*p);
    *cap = MOERL_MAX(n, *cap + *cap / 2);
    *p = xalloc_aligned((*cap + 1) * sizeof(float));
}

/* The model's MoE hooks (model/forward.h) with an ep_state as their runtime. */
static void hook_moe_forward(void *par, const moe_model *m, int l, const float *x, mlp_acts *s, int N) {
    ep_moe_forward_team(par, m, l, x, s, N);
}
static void hook_moe_backward(void *par, const moe_model *m, int l, const mlp_acts *s, const float *d_y,
                              float *d_permuted, float *dWgu, float *dWd) {
    ep_moe_backward_team(par, m, l, s, d_y, d_permuted, dWgu, dWd);
}
static void hook_moe_idle(void *par, moe_model *m, int backward) { ep_idle_pass(par, m, backward); }
const model_hooks ep_model_hooks = {
    .moe_forward = hook_moe_forward, .moe_backward = hook_moe_backward, .moe_idle = hook_moe_idle};

void ep_config_apply(const par_grid *g, moe_config *c) {
    if (g->ep <= 1) return;
    c->exec.ep_size = g->ep;
    c->exec.ep_rank = g->ep_rank;
}

ep_state *ep_state_new(const par_grid *g, const moe_config *c, int max_tokens) {
    if (!g || g->ep <= 1 || !g->ep_comm) {
        moerl_errorf("ep_state_new: actor.expert_parallel_size is %d: expert parallelism needs ≥ 2 ranks and a grid",
                     g ? g->ep : 0);
        return NULL;
    }
    if (c->num_experts <= 0 || c->num_experts % g->ep) {
        moerl_errorf("ep_state_new: actor.expert_parallel_size=%d does not divide the model's %d experts", g->ep,
                     c->num_experts);
        return NULL;
    }
    if (c->exec.ep_size != g->ep || c->exec.ep_rank != g->ep_rank) {
        moerl_errorf("ep_state_new: the model holds the expert slice of rank %d of %d, the grid says rank %d of %d "
                     "(build the model from ep_config_apply's config)", c->exec.ep_rank, c->exec.ep_size, g->ep_rank,
                     g->ep);
        return NULL;
    }
    if (c->exec.per_expert_loop || c->exec.per_expert_weights) {
        moerl_errorf("ep_state_new: expert parallelism runs the grouped GEMM on stacked weights; "
                     "model.moe.grouped_gemm=false and model.moe.stacked_weights=false are not supported with it");
        return NULL;
    }
    if (max_tokens <= 0) {
        moerl_errorf("ep_state_new: max_tokens must be positive, got %d", max_tokens);
        return NULL;
    }
    ep_state *ep = xcalloc(1, sizeof *ep);
    ep->head.hooks = &ep_model_hooks;
    ep->g = g;
    ep->comm = g->ep_comm;
    ep->P = g->ep;
    ep->rank = g->ep_rank;
    ep->E = c->num_experts;
    ep->El = moe_config_local_experts(c, &ep->lo);
    ep->K = c->num_experts_per_tok;
    ep->H = c->hidden_size;
    ep->I = c->moe_intermediate_size;
    ep->L = c->num_hidden_layers;
    ep->disp = par_dispatcher(g);
    const double want = ceil(g->cfg.capacity_factor * (double)max_tokens * ep->K / ep->E);
    ep->cap = (int)MOERL_MAX(1.0, MOERL_MIN(want, (double)max_tokens));
    moe_config wc = *c;
    wc.exec.ep_size = 0;
    wc.exec.ep_rank = 0;
    if (model_init_layout(&ep->whole, &wc, 0) != MOERL_OK) {
        free(ep);
        return NULL;
    }
    for (int l = 0; l < ep->L; l++) {
        if (!moe_config_layer_is_moe(c, l)) continue;
        ep_layer *y = &ep->lay[l];
        y->rcnt = xcalloc((size_t)ep->P * ep->El, sizeof(int));
        y->boff = xcalloc((size_t)ep->P * ep->El, sizeof(int));
        y->eoff = xcalloc((size_t)ep->El + 1, sizeof(int));
    }
    return ep;
}

/* A layer's saved-state buffers. */
static void layer_free(ep_layer *y) {
    free(y->rcnt); free(y->boff); free(y->eoff); free(y->x); free(y->gu); free(y->act);
}

void ep_use_bank(ep_state *ep, int k, int n) {
    const int L = ep->L;
    if (n > ep->n_banks) { /* new banks: empty saved states of the MoE layers */
        const int old = ep->n_banks > 0 ? ep->n_banks : 1;
        ep->bank = xrealloc(ep->bank, (size_t)n * L * sizeof(ep_layer));
        memset(ep->bank + (size_t)(ep->n_banks > 0 ? ep->n_banks : 0) * L, 0,
               (size_t)(n - (ep->n_banks > 0 ? ep->n_banks : 0)) * L * sizeof(ep_layer));
        for (int b = old; b < n; b++)
            for (int l = 0; l < L; l++) {
                if (!moe_config_layer_is_moe(&ep->whole.cfg, l)) continue;
                ep_layer *y = &ep->bank[(size_t)b * L + l];
                y->rcnt = xcalloc((size_t)ep->P * ep->El, sizeof(int));
                y->boff = xcalloc((size_t)ep->P * ep->El, sizeof(int));
                y->eoff = xcalloc((size_t)ep->El + 1, sizeof(int));
            }
        ep->n_banks = n;
    }
    MOERL_ASSERT(k >= 0 && k < ep->n_banks);
    if (k == ep->cur_bank) return;
    for (int l = 0; l < L; l++) {
        ep->bank[(size_t)ep->cur_bank * L + l] = ep->lay[l];
        ep->lay[l] = ep->bank[(size_t)k * L + l];
        memset(&ep->bank[(size_t)k * L + l], 0, sizeof(ep_layer));
    }
    ep->cur_bank = k;
}

void ep_state_free(ep_state *ep) {
    if (!ep) return;
    for (int b = 0; b < ep->n_banks; b++)
        for (int l = 0; l < ep->L && b != ep->cur_bank; l++) layer_free(&ep->bank[(size_t)b * ep->L + l]);
    free(ep->bank);
    for (int l = 0; l < ep->L; l++) layer_free(&ep->lay[l]);
    free(ep->y); free(ep->dy); free(ep->dgu); free(ep->dact); free(ep->dx);
    free(ep->buf_a); free(ep->buf_b); free(ep->red);
    model_free(&ep->whole);
    free(ep);
}

moe_dispatcher ep_dispatcher(const ep_state *ep) { return ep->disp; }
int ep_capacity(const ep_state *ep) { return ep->cap; }
ep_stats ep_get_stats(const ep_state *ep) { return ep->st; }
void ep_reset_stats(ep_state *ep) { memset(&ep->st, 0, sizeof ep->st); }

/* ------------------------------------------------------------------ the row exchange
 *
 * Rows are H floats. The sender's block b = (peer, e) has scnt[b] rows at send + soff[b]·H; the
 * receiver places the rcnt[b] rows of block b = (source, e) at recv + roff[b]·H. */

static void note_sent(ep_state *ep, const int *scnt) {
    for (int b = 0; b < ep->P * ep->El; b++) {
        if (b / ep->El != ep->rank) ep->st.rows_sent += scnt[b];
        ep->st.max_block = MOERL_MAX(ep->st.max_block, (long)scnt[b]);
    }
    ep->st.exchanges++;
}

/* alltoall: pack every block (header: count, any-overflow flag of this source; then up to cap
 * rows) and exchange them; after the call buf_b holds the received blocks. */
static void pad_exchange(ep_state *ep, const float *send, const int *soff, const int *scnt) {
    const int nb = ep->P * ep->El, H = ep->H;
    const size_t bs = 2 + (size_t)ep->cap * H;
    int any = 0;
    for (int b = 0; b < nb; b++) any |= scnt[b] > ep->cap;
    ensure(&ep->buf_a, &ep->buf_a_n, nb * bs);
    ensure(&ep->buf_b, &ep->buf_b_n, nb * bs);
    for (int b = 0; b < nb; b++) {
        float *blk = ep->buf_a + b * bs;
        blk[0] = (float)scnt[b]; /* exact: counts < 2^24 */
        blk[1] = (float)any;
        const int n = MOERL_MIN(scnt[b], ep->cap);
        memcpy(blk + 2, send + (size_t)soff[b] * H, (size_t)n * H * sizeof(float));
    }
    if (dist_comm_alltoall_f32(ep->comm, ep->buf_a, (size_t)ep->El * bs, ep->buf_b) != MOERL_OK)
        moerl_fatal("expert-parallel all-to-all: %s", moerl_last_error());
}

/* Counts of the received blocks into rcnt; returns 1 when any source flagged an overflow (the
 * same answer on every rank of the group: every source sends its flag to every rank). */
static int pad_counts(const ep_state *ep, int *rcnt) {
    const size_t bs = 2 + (size_t)ep->cap * ep->H;
    int any = 0;
    for (int b = 0; b < ep->P * ep->El; b++) {
        rcnt[b] = (int)ep->buf_b[b * bs];
        any |= ep->buf_b[b * bs + 1] != 0.0f;
    }
    return any;
}

static void pad_place(const ep_state *ep, float *recv, const int *roff, const int *rcnt) {
    const size_t bs = 2 + (size_t)ep->cap * ep->H;
    for (int b = 0; b < ep->P * ep->El; b++)
        memcpy(recv + (size_t)roff[b] * ep->H, ep->buf_b + b * bs + 2,
               (size_t)MOERL_MIN(rcnt[b], ep->cap) * ep->H * sizeof(float));
}

/* all-to-all-v of the rows [from, count) of every block (from = 0: all rows; from = cap: the
 * spill). Per peer, the blocks are sent from / received into place when they are contiguous there,
 * else through the staging buffers. */
static void v_move(ep_state *ep, const float *send, const int *soff, const int *scnt, float *recv, const int *roff,
                   const int *rcnt, int from) {
    const int P = ep->P, El = ep->El, H = ep->H;
    size_t *sc = xcalloc((size_t)4 * P, sizeof(size_t)), *sd = sc + P, *rc = sc + 2 * P, *rd = sc + 3 * P;
    int s_contig = from == 0, r_contig = from == 0;
    size_t ns = 0, nr = 0;
    for (int p = 0; p < P; p++)
        for (int e = 0; e < El; e++) {
            const int b = p * El + e;
            const int ks = MOERL_MAX(0, scnt[b] - from), kr = MOERL_MAX(0, rcnt[b] - from);
            sc[p] += (size_t)ks * H;
            rc[p] += (size_t)kr * H;
            ns += (size_t)ks * H;
            nr += (size_t)kr * H;
            if (e > 0 && soff[b] != soff[b - 1] + scnt[b - 1]) s_contig = 0;
            if (e > 0 && roff[b] != roff[b - 1] + rcnt[b - 1]) r_contig = 0;
        }
    const float *src = send;
    float *dst = recv;
    if (s_contig) {
        for (int p = 0; p < P; p++) sd[p] = (size_t)soff[p * El] * H;
    } else {
        ensure(&ep->buf_a, &ep->buf_a_n, ns);
        size_t o = 0;
        for (int p = 0; p < P; p++) {
            sd[p] = o;
            for (int e = 0; e < El; e++) {
                const int b = p * El + e, k = MOERL_MAX(0, scnt[b] - from);
                memcpy(ep->buf_a + o, send + ((size_t)soff[b] + from) * H, (size_t)k * H * sizeof(float));
                o += (size_t)k * H;
            }
        }
        src = ep->buf_a;
    }
    if (r_contig) {
        for (int p = 0; p < P; p++) rd[p] = (size_t)roff[p * El] * H;
    } else {
        ensure(&ep->buf_b, &ep->buf_b_n, nr);
        size_t o = 0;
        for (int p = 0; p < P; p++) {
            rd[p] = o;
            o += rc[p];
        }
        dst = ep->buf_b;
    }
    if (dist_comm_alltoallv_f32(ep->comm, src, sc, sd, dst, rc, rd) != MOERL_OK)
        moerl_fatal("expert-parallel all-to-all-v: %s", moerl_last_error());
    if (!r_contig) {
        size_t o = 0;
        for (int p = 0; p < P; p++)
            for (int e = 0; e < El; e++) {
                const int b = p * El + e, k = MOERL_MAX(0, rcnt[b] - from);
                memcpy(recv + ((size_t)roff[b] + from) * H, ep->buf_b + o, (size_t)k * H * sizeof(float));
                o += (size_t)k * H;
            }
    }
    free(sc);
}

/* Spill round of the alltoall dispatcher: the rows beyond capacity, counts known from the headers. */
static void spill(ep_state *ep, const float *send, const int *soff, const int *scnt, float *recv, const int *roff,
                  const int *rcnt) {
    for (int b = 0; b < ep->P * ep->El; b++)
        if (b / ep->El != ep->rank) ep->st.spill_rows += MOERL_MAX(0, scnt[b] - ep->cap);
    ep->st.spill_rounds++;
    v_move(ep, send, soff, scnt, recv, roff, rcnt, ep->cap);
}

/* Exchange with the counts known on both sides (combine, and the backward's dispatch). */
static void exchange_known(ep_state *ep, const float *send, const int *soff, const int *scnt, float *recv,
                           const int *roff, const int *rcnt) {
    const double t0 = moerl_now();
    note_sent(ep, scnt);
    if (ep->disp == MOE_DISPATCH_ALLTOALLV) {
        v_move(ep, send, soff, scnt, recv, roff, rcnt, 0);
    } else {
        pad_exchange(ep, send, soff, scnt);
        int *chk = xmalloc((size_t)ep->P * ep->El * sizeof(int));
        const int any = pad_counts(ep, chk);
        for (int b = 0; b < ep->P * ep->El; b++)
            if (chk[b] != rcnt[b])
                moerl_fatal("expert-parallel exchange: block %d carries %d rows, %d expected (internal error)", b,
                            chk[b], rcnt[b]);
        free(chk);
        pad_place(ep, recv, roff, rcnt);
        if (any) spill(ep, send, soff, scnt, recv, roff, rcnt);
    }
    ep->st.seconds += moerl_now() - t0;
}

/* Expert-major placement of layer y's received blocks: expert e's rows are source 0's, source
 * 1's, ...; sets boff, eoff, rows and grows the layer's and the scratch buffers. */
static void place_expert_major(ep_state *ep, ep_layer *y) {
    const int P = ep->P, El = ep->El, H = ep->H, I = ep->I;
    int o = 0;
    for (int e = 0; e < El; e++) {
        y->eoff[e] = o;
        for (int p = 0; p < P; p++) {
            y->boff[p * El + e] = o;
            o += y->rcnt[p * El + e];
        }
    }
    y->eoff[El] = o;
    y->rows = o;
    if ((size_t)o > y->cap) {
        free(y->x); free(y->gu); free(y->act);
        y->cap = MOERL_MAX((size_t)o, y->cap + y->cap / 2);
        y->x = xalloc_aligned((y->cap * H + 1) * sizeof(float));
        y->gu = xalloc_aligned((y->cap * 2 * I + 1) * sizeof(float));
        y->act = xalloc_aligned((y->cap * I + 1) * sizeof(float));
    }
    if ((size_t)o > ep->scr_cap) { /* every scratch buffer holds the same number of rows */
        free(ep->y); free(ep->dy); free(ep->dx); free(ep->dgu); free(ep->dact);
        ep->scr_cap = MOERL_MAX((size_t)o, ep->scr_cap + ep->scr_cap / 2);
        const size_t r = ep->scr_cap;
        ep->y = xalloc_aligned((r * H + 1) * sizeof(float));
        ep->dy = xalloc_aligned((r * H + 1) * sizeof(float));
        ep->dx = xalloc_aligned((r * H + 1) * sizeof(float));
        ep->dgu = xalloc_aligned((r * 2 * I + 1) * sizeof(float));
        ep->dact = xalloc_aligned((r * I + 1) * sizeof(float));
    }
}

/* The forward dispatch of layer l: counts learned (size exchange or headers), then placed. */
static void dispatch_forward(ep_state *ep, int l, const float *send, const int *soff, const int *scnt) {
    const double t0 = moerl_now();
    ep_layer *y = &ep->lay[l];
    note_sent(ep, scnt);
    if (ep->disp == MOE_DISPATCH_ALLTOALLV) {
        ep->st.size_exchanges++;
        if (dist_comm_alltoall_i32(ep->comm, scnt, (size_t)ep->El, y->rcnt) != MOERL_OK)
            moerl_fatal("expert-parallel count exchange: %s", moerl_last_error());
        place_expert_major(ep, y);
        v_move(ep, send, soff, scnt, y->x, y->boff, y->rcnt, 0);
    } else {
        pad_exchange(ep, send, soff, scnt);
        const int any = pad_counts(ep, y->rcnt);
        place_expert_major(ep, y);
        pad_place(ep, y->x, y->boff, y->rcnt);
        if (any) spill(ep, send, soff, scnt, y->x, y->boff, y->rcnt);
    }
    ep->st.seconds += moerl_now() - t0;
}

/* ------------------------------------------------------------------ the MoE block's hooks */

void ep_moe_forward_team(ep_state *ep, const moe_model *m, int l, const float *x, mlp_acts *s, int N) {
    const int H = ep->H, I = ep->I, M = N * ep->K;
    const layer_views *w = &m->p.layers[l];
    ep_layer *y = &ep->lay[l];
#pragma omp for schedule(static)
    for (int i = 0; i < M; i++)
        memcpy(s->permuted + (size_t)i * H, x + (size_t)(s->sorted_row[i] % N) * H, (size_t)H * sizeof(float));
    /* the permuted rows are ordered by global expert, so peer q's rows (its experts
     * [q·El, (q+1)·El)) are one stretch: block (q, e) is global expert q·El + e */
#pragma omp single
    dispatch_forward(ep, l, s->permuted, s->offsets, s->tokens_per_expert);
    grouped_fuse fz = {.invariant = m->cfg.exec.batch_invariant}, fd = {.invariant = m->cfg.exec.batch_invariant};
    fz.swiglu_act = y->act;
    grouped_gemm_forward_team(y->gu, y->x, w->experts_gate_up, y->eoff, ep->El, H, 2 * I, &fz);
    grouped_gemm_forward_team(ep->y, y->act, w->experts_down, y->eoff, ep->El, I, H, &fd);
#pragma omp single
    exchange_known(ep, ep->y, y->boff, y->rcnt, s->y, s->offsets, s->tokens_per_expert);
}

void ep_moe_backward_team(ep_state *ep, const moe_model *m, int l, const mlp_acts *s, const float *d_y,
                          float *d_permuted, float *dWgu, float *dWd) {
    const int H = ep->H, I = ep->I;
    const layer_views *w = &m->p.layers[l];
    ep_layer *y = &ep->lay[l];
#pragma omp single
    exchange_known(ep, d_y, s->offsets, s->tokens_per_expert, ep->dy, y->boff, y->rcnt);
    grouped_fuse fz = {0};
    fz.swiglu_dgate_up = ep->dgu;
    fz.swiglu_gate_up = y->gu;
    grouped_gemm_backward_team(ep->dact, dWd, ep->dy, y->act, w->experts_down, y->eoff, ep->El, I, H, &fz);
    grouped_gemm_backward_team(ep->dx, dWgu, ep->dgu, y->x, w->experts_gate_up, y->eoff, ep->El, H, 2 * I, NULL);
#pragma omp single
    exchange_known(ep, ep->dx, y->boff, y->rcnt, d_permuted, s->offsets, s->tokens_per_expert);
}

/* ------------------------------------------------------------------ gradients, optimizer */

/* Sum the tensors with (flags & TF_EXPERT) == want_expert over group c, packed into one buffer. */
static int reduce_kind(ep_state *ep, moe_model *m, int want_expert, dist_comm *c) {
    if (!c || dist_comm_size(c) <= 1) return MOERL_OK;
    size_t n = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (!!(m->tensors[i].flags & TF_EXPERT) == want_expert) n += (size_t)m->tensors[i].numel;
    ensure(&ep->red, &ep->red_n, n);
    size_t o = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        if (!!(t->flags & TF_EXPERT) != want_expert) continue;
        memcpy(ep->red + o, m->grads + t->offset, (size_t)t->numel * sizeof(float));
        o += (size_t)t->numel;
    }
    if (dist_comm_allreduce_f32(c, ep->red, n) != MOERL_OK) return MOERL_ERR;
    o = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        if (!!(t->flags & TF_EXPERT) != want_expert) continue;
        memcpy(m->grads + t->offset, ep->red + o, (size_t)t->numel * sizeof(float));
        o += (size_t)t->numel;
    }
    return MOERL_OK;
}

int ep_reduce_grads(ep_state *ep, moe_model *m) {
    if (!m) m = ep->model;
    MOERL_ASSERT(m);
    if (reduce_kind(ep, m, 0, ep->g->stage_comm) != MOERL_OK || reduce_kind(ep, m, 1, ep->g->ep_dp_comm) != MOERL_OK)
        return moerl_error_prefix("expert-parallel gradient sum: ");
    return MOERL_OK;
}

double ep_grad_norm(ep_state *ep, const moe_model *m) {
    double ss[2] = {0, 0}; /* replicated, local experts */
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        const float *g = m->grads + t->offset;
        double s = 0;
        for (int64_t j = 0; j < t->numel; j++) s += (double)g[j] * (double)g[j];
        ss[!!(t->flags & TF_EXPERT)] += s;
    }
    if (dist_comm_allreduce_f64(ep->comm, &ss[1], 1) != MOERL_OK)
        moerl_fatal("expert-parallel gradient norm: %s", moerl_last_error());
    return sqrt(ss[0] + ss[1]);
}

int ep_adamw_step(ep_state *ep, adamw_state *s, moe_model *m, float lr, float loss, double *grad_norm) {
    const double norm = ep_grad_norm(ep, m);
    if (grad_norm) *grad_norm = norm;
    if (!isfinite(norm) || !isfinite(loss)) {
        s->skipped++;
        return 0;
    }
    const float max_norm = s->cfg.max_grad_norm;
    if (max_norm > 0) {
        const double coef = max_norm / (norm + 1e-6); /* torch clip_grad_norm_, as adamw_step */
        if (coef < 1.0) {
            const float clip = (float)coef;
            for (size_t i = 0; i < m->n_params; i++) m->grads[i] *= clip;
        }
    }
    s->cfg.max_grad_norm = 0;
    const int r = adamw_step(s, m, lr, loss, NULL);
    s->cfg.max_grad_norm = max_norm;
    return r;
}

int ep_gather_model(ep_state *ep, const moe_model *local, moe_model *full) {
    moe_config fc = local->cfg;
    fc.exec.ep_size = 0;
    fc.exec.ep_rank = 0;
    if (!full->params && model_init_inference(full, &fc) != MOERL_OK) return MOERL_ERR;
    if (full->n_tensors != local->n_tensors)
        return moerl_errorf("ep_gather_model: the target has %d tensors, the slice %d", full->n_tensors,
                            local->n_tensors);
    for (int i = 0; i < local->n_tensors; i++) {
        const tensor_info *t = &local->tensors[i], *f = &full->tensors[i];
        if (strcmp(t->name, f->name) || ((t->flags & TF_EXPERT) ? f->numel != t->numel * ep->P : f->numel != t->numel))
            return moerl_errorf("ep_gather_model: tensor %d is '%s' (%lld values) in the target, '%s' (%lld) in the slice",
                                i, f->name, (long long)f->numel, t->name, (long long)t->numel);
        if (t->flags & TF_EXPERT) {
            /* [El, ...] per rank, in rank order = experts in global order */
            if (dist_comm_allgather_f32(ep->comm, local->params + t->offset, (size_t)t->numel,
                                        full->params + f->offset) != MOERL_OK)
                return MOERL_ERR;
        } else {
            memcpy(full->params + f->offset, local->params + t->offset, (size_t)t->numel * sizeof(float));
        }
    }
    return MOERL_OK;
}

/* The rows of local's experts of a vector in full's layout (both tensor tables in the same order). */
static void slice_vec(const moe_model *full, const moe_model *local, const float *full_vec, float *local_vec) {
    int lo;
    const int El = moe_config_local_experts(&local->cfg, &lo);
    for (int i = 0; i < local->n_tensors; i++) {
        const tensor_info *t = &local->tensors[i], *f = &full->tensors[i];
        const size_t per = (t->flags & TF_EXPERT) ? (size_t)(t->numel / El) : 0;
        memcpy(local_vec + t->offset, full_vec + f->offset + per * lo, (size_t)t->numel * sizeof(float));
    }
}

int ep_slice_model(const moe_model *full, moe_model *local) {
    if (full->n_tensors != local->n_tensors || full->cfg.num_experts != local->cfg.num_experts ||
        moe_config_local_experts(&full->cfg, &(int){0}) != full->cfg.num_experts)
        return moerl_errorf("ep_slice_model: the source is not the whole model of the slice's config");
    slice_vec(full, local, full->params, local->params);
    return MOERL_OK;
}

int ep_slice_range(const moe_model *full, const moe_model *local, size_t off, const void *vals, size_t cnt, size_t esz,
                   void *local_vec) {
    if (full->n_tensors != local->n_tensors || full->cfg.num_experts != local->cfg.num_experts ||
        moe_config_local_experts(&full->cfg, &(int){0}) != full->cfg.num_experts)
        return moerl_errorf("ep_slice_range: the source is not the whole model of the slice's config");
    if (esz != 2 && esz != 4) return moerl_errorf("ep_slice_range: values of %zu bytes (fp32: 4, bf16: 2)", esz);
    if (off > full->n_params || cnt > full->n_params - off)
        return moerl_errorf("ep_slice_range: values [%zu, %zu) past the model's %zu", off, off + cnt, full->n_params);
    int lo;
    const int El = moe_config_local_experts(&local->cfg, &lo);
    const char *src = vals;
    char *dst = local_vec;
    for (int i = 0; i < local->n_tensors; i++) { /* tensors in layout order: stop past the range */
        const tensor_info *t = &local->tensors[i], *f = &full->tensors[i];
        const size_t per = (t->flags & TF_EXPERT) ? (size_t)(t->numel / El) : 0;
        const size_t s0 = f->offset + per * lo, s1 = s0 + (size_t)t->numel; /* the rows this rank keeps */
        if (f->offset >= off + cnt) break;
        const size_t a = MOERL_MAX(s0, off), b = MOERL_MIN(s1, off + cnt);
        if (b > a) memcpy(dst + (t->offset + (a - s0)) * esz, src + (a - off) * esz, (b - a) * esz);
    }
    return MOERL_OK;
}

size_t ep_whole_params(const ep_state *ep) { return ep->whole.n_params; }

void ep_slice_vec(const ep_state *ep, const moe_model *local, const float *whole_vec, float *local_vec) {
    MOERL_ASSERT(local->n_tensors == ep->whole.n_tensors);
    slice_vec(&ep->whole, local, whole_vec, local_vec);
}

/* whole_vec (on EP rank `root` only) = the group's local_vec assembled in the whole layout: the
 * replicated tensors from root's own copy, every expert tensor's rows from their owner (one
 * point-to-point message per expert tensor and owner). Collective over ep_comm. */
static int gather_vec_to(ep_state *ep, const moe_model *local, const float *local_vec, float *whole_vec, int root,
                         int tag) {
    const moe_model *w = &ep->whole;
    int n_exp = 0;
    for (int i = 0; i < local->n_tensors; i++) n_exp += !!(local->tensors[i].flags & TF_EXPERT);
    dist_req **rq = xcalloc((size_t)n_exp * ep->P + 1, sizeof *rq);
    int nr = 0, rc = MOERL_OK;
    for (int i = 0; i < local->n_tensors; i++) {
        const tensor_info *t = &local->tensors[i], *f = &w->tensors[i];
        if (!(t->flags & TF_EXPERT)) {
            if (ep->rank == root) memcpy(whole_vec + f->offset, local_vec + t->offset, (size_t)t->numel * sizeof(float));
            continue;
        }
        if (ep->rank != root) {
            rq[nr++] = dist_comm_isend_f32(ep->comm, root, tag, local_vec + t->offset, (size_t)t->numel);
            continue;
        }
        for (int q = 0; q < ep->P; q++) {
            float *dst = whole_vec + f->offset + (size_t)t->numel * q; /* [El, ...] per rank, in rank order */
            if (q == root) memcpy(dst, local_vec + t->offset, (size_t)t->numel * sizeof(float));
            else rq[nr++] = dist_comm_irecv_f32(ep->comm, q, tag, dst, (size_t)t->numel);
        }
    }
    for (int k = 0; k < nr; k++) /* the messages of one pair arrive in posting order (MPI non-overtaking) */
        if (dist_wait(rq[k]) != MOERL_OK) rc = MOERL_ERR;
    free(rq);
    return rc;
}

int ep_gather_full(ep_state *ep, const moe_model *local, const adamw_state *os, int keep, moe_model *whole,
                   adamw_state *moments) {
    float mine = keep ? 1.0f : 0.0f, *all = xmalloc((size_t)ep->P * sizeof(float));
    if (dist_comm_allgather_f32(ep->comm, &mine, 1, all) != MOERL_OK) {
        free(all);
        return MOERL_ERR;
    }
    if (keep) {
        memset(whole, 0, sizeof *whole);
        if (model_init_inference(whole, &ep->whole.cfg) != MOERL_OK) {
            free(all);
            return MOERL_ERR;
        }
        if (moments) {
            *moments = *os;
            moments->n = whole->n_params;
            moments->m = xalloc_aligned((whole->n_params + 1) * sizeof(float));
            moments->v = xalloc_aligned((whole->n_params + 1) * sizeof(float));
        }
    }
    int rc = MOERL_OK;
    for (int root = 0; root < ep->P && rc == MOERL_OK; root++) { /* every keeper of the group in turn */
        if (all[root] == 0.0f) continue;
        const int me = ep->rank == root;
        rc = gather_vec_to(ep, local, local->params, me ? whole->params : NULL, root, 7301);
        if (rc == MOERL_OK && moments) rc = gather_vec_to(ep, local, os->m, me ? moments->m : NULL, root, 7302);
        if (rc == MOERL_OK && moments) rc = gather_vec_to(ep, local, os->v, me ? moments->v : NULL, root, 7303);
    }
    free(all);
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

int ep_slice_in_place(const par_grid *g, moe_model *m) {
    if (g->ep <= 1) return MOERL_OK;
    moe_config lc = m->cfg;
    ep_config_apply(g, &lc);
    moe_model loc;
    if ((m->grads ? model_init(&loc, &lc) : model_init_inference(&loc, &lc)) != MOERL_OK) return MOERL_ERR;
    if (ep_slice_model(m, &loc) != MOERL_OK) {
        model_free(&loc);
        return MOERL_ERR;
    }
    model_free(m);
    *m = loc; /* the views point into the heap buffers, so the struct moves as a whole */
    return MOERL_OK;
}

int ep_max_passes(ep_state *ep, int passes) {
    float mine = (float)passes, *all = xmalloc((size_t)ep->P * sizeof(float));
    int mx = passes;
    if (dist_comm_allgather_f32(ep->comm, &mine, 1, all) != MOERL_OK) mx = -1;
    for (int i = 0; mx >= 0 && i < ep->P; i++) mx = MOERL_MAX(mx, (int)all[i]);
    free(all);
    return mx;
}

void ep_idle_layer(ep_state *ep, moe_model *m, int l, int backward) {
    if (!m) m = ep->model;
    MOERL_ASSERT(m && l >= 0 && l < ep->L);
    ep_layer *y = &ep->lay[l];
    if (!y->rcnt) return; /* a dense layer */
    const int H = ep->H, I = ep->I, El = ep->El;
    int *zero = xcalloc((size_t)ep->E + 1, sizeof(int));
    float dummy[1] = {0};
    const layer_views *w = &m->p.layers[l];
    if (!backward) { /* forward: no rows of our own */
        dispatch_forward(ep, l, dummy, zero, zero);
        grouped_fuse fz = {.invariant = m->cfg.exec.batch_invariant}, fd = {.invariant = m->cfg.exec.batch_invariant};
        fz.swiglu_act = y->act;
        grouped_gemm_forward_team(y->gu, y->x, w->experts_gate_up, y->eoff, El, H, 2 * I, &fz);
        grouped_gemm_forward_team(ep->y, y->act, w->experts_down, y->eoff, El, I, H, &fd);
        exchange_known(ep, ep->y, y->boff, y->rcnt, dummy, zero, zero);
    } else { /* backward: the local experts' weight gradients accumulate */
        layer_views *gw = &m->g.layers[l];
        exchange_known(ep, dummy, zero, zero, ep->dy, y->boff, y->rcnt);
        grouped_fuse fz = {0};
        fz.swiglu_dgate_up = ep->dgu;
        fz.swiglu_gate_up = y->gu;
        grouped_gemm_backward_team(ep->dact, gw->experts_down, ep->dy, y->act, w->experts_down, y->eoff, El, I, H, &fz);
        grouped_gemm_backward_team(ep->dx, gw->experts_gate_up, ep->dgu, y->x, w->experts_gate_up, y->eoff, El, H,
                                   2 * I, NULL);
        exchange_known(ep, ep->dx, y->boff, y->rcnt, dummy, zero, zero);
    }
    free(zero);
}

void ep_idle_pass(ep_state *ep, moe_model *m, int backward) {
    ep->st.idle_passes++;
    for (int l = 0; l < ep->L; l++) ep_idle_layer(ep, m, l, 0);  /* forward: the MoE layers in order */
    const moe_model *mm = m ? m : ep->model;
    for (int l = ep->L - 1; backward && l >= 0; l--) { /* backward: in reverse (recompute: its forward first) */
        if (mm && mm->cfg.exec.recompute) ep_idle_layer(ep, m, l, 0);
        ep_idle_layer(ep, m, l, 1);
    }
}

int ep_recomputes(const ep_state *ep) { return ep->model && ep->model->cfg.exec.recompute; }

void ep_count_idle_pass(ep_state *ep) { ep->st.idle_passes++; }

ep_state *ep_state_attach(const par_grid *g, moe_model *m, int max_tokens) {
    if (ep_slice_in_place(g, m) != MOERL_OK) return NULL;
    ep_state *ep = ep_state_new(g, &m->cfg, max_tokens);
    if (ep) ep->model = m;
    return ep;
}

int ep_state_detach(ep_state *ep) {
    if (!ep) return MOERL_OK;
    int rc = MOERL_OK;
    moe_model *m = ep->model;
    if (m) {
        moe_config fc = m->cfg;
        fc.exec.ep_size = 0;
        fc.exec.ep_rank = 0;
        moe_model full;
        rc = m->grads ? model_init(&full, &fc) : model_init_inference(&full, &fc);
        if (rc == MOERL_OK) rc = ep_gather_model(ep, m, &full);
        if (rc == MOERL_OK) {
            model_free(m);
            *m = full;
        } else if (full.params) {
            model_free(&full);
        }
    }
    ep_state_free(ep);
    return rc;
}
