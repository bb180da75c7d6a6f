/* TP × EP: the MoE layer's token split over the TP group around the EP exchange (see tp_ep.h). */
#include "parallel/tp_ep.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

/* This rank's share of one MoE layer's permuted rows, saved from the forward for the backward. */
typedef struct {
    int *sorted_row;  /* [n·K] the sub-problem's expanded rows j·n + (t − t0), in the full index's order */
    int *pos;         /* [n·K] each sub row's position in the full permuted order */
    int *tpe, *off;   /* [E], [E+1] the sub-problem's rows per expert and offsets */
    int N, t0, n;     /* the layer's tokens; this rank's range [t0, t0 + n) */
    size_t cap;       /* rows allocated in sorted_row / pos */
} tpe_layer;

struct tp_ep_state {
    const par_grid *g;
    ep_state *ep;
    dist_comm *tp;
    int T, rank, E, K, H, L;
    tpe_layer lay[MOERL_MAX_LAYERS];
    float *sub_a, *sub_b, *all; /* sub-problem rows (padded to the largest share) and the gathered rows */
    size_t sub_cap, all_cap;
    tp_ep_stats st;
};

/* The first token of TP rank q's share of N tokens. */
static int share_lo(int q, int T, int N) { return (int)((long)q * N / T); }

tp_ep_state *tp_ep_new(const par_grid *g, ep_state *ep, const moe_config *c) {
    if (!g || g->tp <= 1 || g->ep <= 1 || !ep || !g->tp_comm) {
        moerl_errorf("tp_ep_new: tensor × expert parallelism needs a grid with tp > 1 and ep > 1 (tp %d, ep %d)",
                     g ? g->tp : 0, g ? g->ep : 0);
        return NULL;
    }
    tp_ep_state *st = xcalloc(1, sizeof *st);
    st->g = g;
    st->ep = ep;
    st->tp = g->tp_comm;
    st->T = g->tp;
    st->rank = g->tp_rank;
    st->E = c->num_experts;
    st->K = c->num_experts_per_tok;
    st->H = c->hidden_size;
    st->L = c->num_hidden_layers;
    for (int l = 0; l < st->L; l++) {
        if (!moe_config_layer_is_moe(c, l)) continue;
        st->lay[l].tpe = xcalloc((size_t)st->E, sizeof(int));
        st->lay[l].off = xcalloc((size_t)st->E + 1, sizeof(int));
    }
    return st;
}

void tp_ep_free(tp_ep_state *st) {
    if (!st) return;
    for (int l = 0; l < st->L; l++) {
        tpe_layer *y = &st->lay[l];
        free(y->sorted_row); free(y->pos); free(y->tpe); free(y->off);
    }
    free(st->sub_a); free(st->sub_b); free(st->all);
    free(st);
}

tp_ep_stats tp_ep_get_stats(const tp_ep_state *st) { return st->st; }
void tp_ep_reset_stats(tp_ep_state *st) { memset(&st->st, 0, sizeof st->st); }

/* Rows of the largest share of N tokens over T ranks: ⌈N / T⌉ tokens · K. */
static size_t rows_of(int T, int K, int N) { return (size_t)((N + T - 1) / T) * K; }
static size_t share_rows(const tp_ep_state *st, int N) { return rows_of(st->T, st->K, N); }

/* The scratch one rank allocates for a given share of `rows` rows (the allocations below, element counts):
 * per MoE layer sorted_row and pos ((rows + 1) ints each); sub_a and sub_b (rows·H + 1 floats each); the gathered
 * rows `all` (T·rows·H + 1 floats). */
static size_t layer_index_ints(size_t rows) { return rows + 1; }
static size_t sub_floats(size_t rows, int H) { return rows * H + 1; }
static size_t all_floats(size_t rows, int T, int H) { return (size_t)T * rows * H + 1; }

double tp_ep_scratch_bytes(const moe_config *c, int tp, int max_tokens) {
    if (tp <= 1 || max_tokens <= 0) return 0;
    const size_t rows = rows_of(tp, c->num_experts_per_tok, max_tokens);
    const int H = c->hidden_size, E = c->num_experts;
    int n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_moe += moe_config_layer_is_moe(c, l);
    if (n_moe == 0) return 0;
    const double per_layer = (double)(2 * E + 1 + 2 * layer_index_ints(rows)) * sizeof(int); /* tpe, off, index */
    return n_moe * per_layer + (double)(2 * sub_floats(rows, H) + all_floats(rows, tp, H)) * sizeof(float);
}

double tp_ep_scratch_held(const tp_ep_state *st) {
    double b = 0;
    for (int l = 0; l < st->L; l++) {
        const tpe_layer *y = &st->lay[l];
        if (y->tpe) b += (double)(2 * st->E + 1) * sizeof(int);
        if (y->cap) b += 2.0 * (y->cap + 1) * sizeof(int);
    }
    if (st->sub_cap) b += 2.0 * (st->sub_cap + 1) * sizeof(float);
    if (st->all_cap) b += (st->all_cap + 1.0) * sizeof(float);
    return b;
}

/* Build layer l's sub-problem from the full permuted index of s (one thread). */
static void tpe_index(tp_ep_state *st, int l, const mlp_acts *s, int N) {
    tpe_layer *y = &st->lay[l];
    const int K = st->K, E = st->E, t0 = share_lo(st->rank, st->T, N), t1 = share_lo(st->rank + 1, st->T, N);
    const size_t rows = share_rows(st, N);
    y->N = N, y->t0 = t0, y->n = t1 - t0;
    if (rows > y->cap) {
        free(y->sorted_row);
        free(y->pos);
        y->cap = rows;
        y->sorted_row = xmalloc(layer_index_ints(rows) * sizeof(int));
        y->pos = xmalloc(layer_index_ints(rows) * sizeof(int));
    }
    if (rows * st->H > st->sub_cap) {
        free(st->sub_a);
        free(st->sub_b);
        st->sub_cap = rows * st->H;
        st->sub_a = xalloc_aligned(sub_floats(rows, st->H) * sizeof(float));
        st->sub_b = xalloc_aligned(sub_floats(rows, st->H) * sizeof(float));
    }
    int k = 0;
    y->off[0] = 0;
    for (int e = 0; e < E; e++) { /* the full index is expert-major: keep its order, our tokens only */
        for (int i = s->offsets[e]; i < s->offsets[e + 1]; i++) {
            const int r = s->sorted_row[i], t = r % N, j = r / N;
            if (t < t0 || t >= t1) continue;
            y->sorted_row[k] = j * y->n + (t - t0);
            y->pos[k++] = i;
        }
        y->off[e + 1] = k;
        y->tpe[e] = k - y->off[e];
    }
    MOERL_ASSERT(k == y->n * K);
}

/* All-gather over the TP group of every rank's sub rows (sub [n·K, H], this rank's) and place them at their
 * full positions of out [N·K, H]: rank q's k-th row is the k-th full row whose token falls in q's share (one
 * thread). */
static void tpe_gather(tp_ep_state *st, const tpe_layer *y, const mlp_acts *s, const float *sub, float *out) {
    const int N = y->N, H = st->H, M = N * st->K;
    const size_t rows = share_rows(st, N), need = (size_t)st->T * rows * H;
    if (need > st->all_cap) {
        free(st->all);
        st->all_cap = need;
        st->all = xalloc_aligned(all_floats(rows, st->T, H) * sizeof(float));
    }
    if (dist_comm_allgather_f32(st->tp, sub, rows * H, st->all) != MOERL_OK)
        moerl_fatal("tensor × expert-parallel all-gather of the expert rows: %s", moerl_last_error());
    st->st.gathers++;
    st->st.floats_sent += (double)rows * H;
    int *next = xcalloc((size_t)st->T, sizeof(int)), q = 0; /* rows taken so far from each rank */
    for (int i = 0; i < M; i++) {
        const int t = s->sorted_row[i] % N;
        for (q = 0; q + 1 < st->T && t >= share_lo(q + 1, st->T, N);) q++;
        memcpy(out + (size_t)i * H, st->all + ((size_t)q * rows + (size_t)next[q]++) * H, (size_t)H * sizeof(float));
    }
    free(next);
}

/* The sub-problem of layer l as the mlp_acts ep.c reads (index, counts, offsets; permuted / y: scratch). */
static mlp_acts tpe_sub(const tp_ep_state *st, const tpe_layer *y) {
    mlp_acts sub;
    memset(&sub, 0, sizeof sub);
    sub.sorted_row = y->sorted_row;
    sub.tokens_per_expert = y->tpe;
    sub.offsets = y->off;
    sub.permuted = st->sub_a;
    sub.y = st->sub_b;
    return sub;
}

void tp_ep_moe_forward_team(tp_ep_state *st, const moe_model *m, int l, const float *x, mlp_acts *s, int N) {
    tpe_layer *y = &st->lay[l];
#pragma omp single
    tpe_index(st, l, s, N);
    mlp_acts sub = tpe_sub(st, y);
    ep_moe_forward_team(st->ep, m, l, x + (size_t)y->t0 * st->H, &sub, y->n);
#pragma omp single
    tpe_gather(st, y, s, st->sub_b, s->y);
}

void tp_ep_moe_backward_team(tp_ep_state *st, const moe_model *m, int l, const mlp_acts *s, const float *d_y,
                             float *d_permuted, float *dWgu, float *dWd) {
    const tpe_layer *y = &st->lay[l];
    const int H = st->H, R = y->n * st->K;
    float *sub_dy = st->sub_a, *sub_dp = st->sub_b;
#pragma omp for schedule(static)
    for (int k = 0; k < R; k++) /* this rank's rows of ∂y (replicated over the TP group) */
        memcpy(sub_dy + (size_t)k * H, d_y + (size_t)y->pos[k] * H, (size_t)H * sizeof(float));
    const mlp_acts sub = tpe_sub(st, y);
    ep_moe_backward_team(st->ep, m, l, &sub, sub_dy, sub_dp, dWgu, dWd);
#pragma omp single
    tpe_gather(st, y, s, sub_dp, d_permuted);
}
