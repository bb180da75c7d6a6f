/* Ulysses sequence parallelism: the attention's layout switch (see ulysses.h). */
#include "parallel/ulysses.h"

#include <string.h>

#include "base/common.h"
#include "kernels/kernels.h"

typedef struct {
    float *q, *k, *v, *att, *lse; /* head-sharded: [N, nh_l, hd], [N, nkv_l, hd] ×2, [N, nh_l, hd], [nh_l, N] */
} sp_layer;

struct sp_state {
    dist_comm *comm;
    int P, rank, nh, nkv, hd, L, nh_l, nkv_l, max_tokens;
    int N, B;
    int batch_invariant; /* moe_exec_opts.batch_invariant at sp_state_new: attention_forward_bi */
    int *cu;          /* [max_tokens + 1] the packed micro-batch's cu_seqlens */
    sp_layer lay[MOERL_MAX_LAYERS];
    float *send, *recv; /* staging, max_tokens · (nh + 2·nkv_l·P) · hd floats each */
    float *dq, *dk, *dv, *datt; /* head-sharded backward scratch */
    size_t *sc, *sd, *rc, *rd;  /* [P] each */
    sp_stats st;
};

/* First kv head rank q's query heads read (ulysses.h: nkv_l = nkv/P of them, or 1 replicated). */
static int kv_lo(const sp_state *sp, int q) {
    return sp->nkv >= sp->P ? q * sp->nkv_l : q * sp->nkv / sp->P;
}

static void range_of(int N, int P, int r, int *t0, int *n) {
    *t0 = (int)((long)N * r / P);
    *n = (int)((long)N * (r + 1) / P) - *t0;
}

void sp_token_range(const sp_state *sp, int N, int *t0, int *n) { range_of(N, sp->P, sp->rank, t0, n); }

sp_state *sp_state_new(const par_grid *g, const moe_config *c, int max_tokens) {
    if (!g || g->sp <= 1 || !g->sp_comm) {
        moerl_errorf("sp_state_new: actor.ulysses_sequence_parallel_size is %d: Ulysses needs ≥ 2 ranks and a grid",
                     g ? g->sp : 0);
        return NULL;
    }
    const int P = g->sp, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    if (nh % P || (nkv % P && P % nkv)) {
        moerl_errorf("sp_state_new: actor.ulysses_sequence_parallel_size=%d must divide the %d attention heads and "
                     "divide or be a multiple of the %d key/value heads", P, nh, nkv);
        return NULL;
    }
    if (max_tokens < P) {
        moerl_errorf("sp_state_new: micro-batches of %d tokens cannot be split over %d Ulysses ranks", max_tokens, P);
        return NULL;
    }
    sp_state *sp = xcalloc(1, sizeof *sp);
    sp->comm = g->sp_comm;
    sp->P = P;
    sp->rank = g->sp_rank;
    sp->nh = nh;
    sp->nkv = nkv;
    sp->hd = c->head_dim;
    sp->L = c->num_hidden_layers;
    sp->nh_l = nh / P;
    sp->batch_invariant = c->exec.batch_invariant;
    sp->nkv_l = nkv >= P ? nkv / P : 1;
    sp->max_tokens = max_tokens;
    sp->cu = xcalloc((size_t)max_tokens + 1, sizeof(int));
    const size_t T = (size_t)max_tokens, hd = sp->hd, nq = T * sp->nh_l * hd, nk = T * sp->nkv_l * hd;
    for (int l = 0; l < sp->L; l++) {
        sp_layer *y = &sp->lay[l];
        y->q = xalloc_aligned(nq * sizeof(float));
        y->k = xalloc_aligned(nk * sizeof(float));
        y->v = xalloc_aligned(nk * sizeof(float));
        y->att = xalloc_aligned(nq * sizeof(float));
        y->lse = xalloc_aligned((T * sp->nh_l + 1) * sizeof(float));
    }
    /* the largest staging: the local tokens (at most ⌈T/P⌉, so P·n ≤ T + P) with every rank's query
     * heads plus the kv heads sent to each of the P ranks (replication sends a kv head more than once) */
    const size_t stage = (T + P) * hd * (size_t)(nh + 2 * sp->nkv_l * P) + 16;
    sp->send = xalloc_aligned(stage * sizeof(float));
    sp->recv = xalloc_aligned(stage * sizeof(float));
    sp->dq = xalloc_aligned(nq * sizeof(float));
    sp->dk = xalloc_aligned(nk * sizeof(float));
    sp->dv = xalloc_aligned(nk * sizeof(float));
    sp->datt = xalloc_aligned(nq * sizeof(float));
    sp->sc = xcalloc((size_t)4 * P, sizeof(size_t));
    sp->sd = sp->sc + P;
    sp->rc = sp->sc + 2 * P;
    sp->rd = sp->sc + 3 * P;
    return sp;
}

void sp_state_free(sp_state *sp) {
    if (!sp) return;
    for (int l = 0; l < sp->L; l++) {
        sp_layer *y = &sp->lay[l];
        free(y->q); free(y->k); free(y->v); free(y->att); free(y->lse);
    }
    free(sp->cu); free(sp->send); free(sp->recv); free(sp->dq); free(sp->dk); free(sp->dv); free(sp->datt);
    free(sp->sc);
    free(sp);
}

sp_stats sp_get_stats(const sp_state *sp) { return sp->st; }
void sp_reset_stats(sp_state *sp) { memset(&sp->st, 0, sizeof sp->st); }

int sp_begin(sp_state *sp, const int *cu_seqlens, int B, int N) {
    if (N < sp->P || N > sp->max_tokens)
        return moerl_errorf("Ulysses: a packed micro-batch of %d tokens, expected %d (the SP size) to %d (max tokens)",
                            N, sp->P, sp->max_tokens);
    memcpy(sp->cu, cu_seqlens, (size_t)(B + 1) * sizeof(int));
    sp->N = N;
    sp->B = B;
    return MOERL_OK;
}

/* One all-to-all-v with the staging buffers: sc[q] floats to q, rc[q] from q (displacements packed). */
static void xchg(sp_state *sp) {
    size_t o = 0, p = 0;
    for (int q = 0; q < sp->P; q++) {
        sp->sd[q] = o;
        sp->rd[q] = p;
        o += sp->sc[q];
        p += sp->rc[q];
        if (q != sp->rank) sp->st.floats_sent += (double)sp->sc[q];
    }
    if (dist_comm_alltoallv_f32(sp->comm, sp->send, sp->sc, sp->sd, sp->recv, sp->rc, sp->rd) != MOERL_OK)
        moerl_fatal("Ulysses all-to-all: %s", moerl_last_error());
    sp->st.exchanges++;
}

void sp_attention_forward(sp_state *sp, int l, float *out, const float *q, const float *k, const float *v,
                          float scale) {
    const double t0 = moerl_now();
    const int P = sp->P, N = sp->N, hd = sp->hd, nh = sp->nh, nkv = sp->nkv, nh_l = sp->nh_l, nkv_l = sp->nkv_l;
    const int W = nh_l + 2 * nkv_l; /* heads per token row in the exchange: q, then k, then v */
    sp_layer *y = &sp->lay[l];
    int my0, n;
    range_of(N, P, sp->rank, &my0, &n);
    /* pack: for each destination q, the local tokens' [q heads | k heads | v heads] */
    float *s = sp->send;
    for (int d = 0; d < P; d++) {
        const int kl = kv_lo(sp, d);
        for (int t = 0; t < n; t++) {
            memcpy(s, q + ((size_t)t * nh + (size_t)d * nh_l) * hd, (size_t)nh_l * hd * sizeof(float));
            s += (size_t)nh_l * hd;
            memcpy(s, k + ((size_t)t * nkv + kl) * hd, (size_t)nkv_l * hd * sizeof(float));
            s += (size_t)nkv_l * hd;
            memcpy(s, v + ((size_t)t * nkv + kl) * hd, (size_t)nkv_l * hd * sizeof(float));
            s += (size_t)nkv_l * hd;
        }
        int s0, ns;
        range_of(N, P, d, &s0, &ns);
        sp->sc[d] = (size_t)n * W * hd;
        sp->rc[d] = (size_t)ns * W * hd;
    }
    xchg(sp);
    const float *r = sp->recv; /* sources in rank order = tokens in order */
    for (int t = 0; t < N; t++) {
        memcpy(y->q + (size_t)t * nh_l * hd, r, (size_t)nh_l * hd * sizeof(float));
        r += (size_t)nh_l * hd;
        memcpy(y->k + (size_t)t * nkv_l * hd, r, (size_t)nkv_l * hd * sizeof(float));
        r += (size_t)nkv_l * hd;
        memcpy(y->v + (size_t)t * nkv_l * hd, r, (size_t)nkv_l * hd * sizeof(float));
        r += (size_t)nkv_l * hd;
    }
    sp->st.seconds += moerl_now() - t0;
    if (sp->batch_invariant) attention_forward_bi(y->att, y->lse, y->q, y->k, y->v, sp->cu, sp->B, N, nh_l, nkv_l, hd, scale);
    else attention_forward(y->att, y->lse, y->q, y->k, y->v, sp->cu, sp->B, N, nh_l, nkv_l, hd, scale);
    const double t1 = moerl_now();
    /* head-sharded → sequence-sharded: rank d's tokens of my heads are one contiguous stretch */
    for (int d = 0; d < P; d++) {
        int s0, ns;
        range_of(N, P, d, &s0, &ns);
        memcpy(sp->send + (size_t)s0 * nh_l * hd, y->att + (size_t)s0 * nh_l * hd, (size_t)ns * nh_l * hd * sizeof(float));
        sp->sc[d] = (size_t)ns * nh_l * hd;
        sp->rc[d] = (size_t)n * nh_l * hd;
    }
    xchg(sp);
    for (int d = 0; d < P; d++)
        for (int t = 0; t < n; t++)
            memcpy(out + ((size_t)t * nh + (size_t)d * nh_l) * hd, sp->recv + ((size_t)d * n + t) * nh_l * hd,
                   (size_t)nh_l * hd * sizeof(float));
    sp->st.seconds += moerl_now() - t1;
}

void sp_attention_backward(sp_state *sp, int l, float *dq, float *dk, float *dv, const float *dout, float scale) {
    const double t0 = moerl_now();
    const int P = sp->P, N = sp->N, hd = sp->hd, nh = sp->nh, nkv = sp->nkv, nh_l = sp->nh_l, nkv_l = sp->nkv_l;
    const int W = nh_l + 2 * nkv_l;
    sp_layer *y = &sp->lay[l];
    int my0, n;
    range_of(N, P, sp->rank, &my0, &n);
    /* dout: sequence-sharded → head-sharded (as q in the forward) */
    float *s = sp->send;
    for (int d = 0; d < P; d++) {
        for (int t = 0; t < n; t++) {
            memcpy(s, dout + ((size_t)t * nh + (size_t)d * nh_l) * hd, (size_t)nh_l * hd * sizeof(float));
            s += (size_t)nh_l * hd;
        }
        int s0, ns;
        range_of(N, P, d, &s0, &ns);
        sp->sc[d] = (size_t)n * nh_l * hd;
        sp->rc[d] = (size_t)ns * nh_l * hd;
    }
    xchg(sp);
    memcpy(sp->datt, sp->recv, (size_t)N * nh_l * hd * sizeof(float));
    sp->st.seconds += moerl_now() - t0;
    attention_backward(sp->dq, sp->dk, sp->dv, sp->datt, y->q, y->k, y->v, y->att, y->lse, sp->cu, sp->B, N, nh_l,
                       nkv_l, hd, scale);
    const double t1 = moerl_now();
    /* dq, dk, dv: head-sharded → sequence-sharded, rank d's tokens as [dq | dk | dv] rows */
    s = sp->send;
    for (int d = 0; d < P; d++) {
        int s0, ns;
        range_of(N, P, d, &s0, &ns);
        for (int t = s0; t < s0 + ns; t++) {
            memcpy(s, sp->dq + (size_t)t * nh_l * hd, (size_t)nh_l * hd * sizeof(float));
            s += (size_t)nh_l * hd;
            memcpy(s, sp->dk + (size_t)t * nkv_l * hd, (size_t)nkv_l * hd * sizeof(float));
            s += (size_t)nkv_l * hd;
            memcpy(s, sp->dv + (size_t)t * nkv_l * hd, (size_t)nkv_l * hd * sizeof(float));
            s += (size_t)nkv_l * hd;
        }
        sp->sc[d] = (size_t)ns * W * hd;
        sp->rc[d] = (size_t)n * W * hd;
    }
    xchg(sp);
    memset(dk, 0, (size_t)n * nkv * hd * sizeof(float));
    memset(dv, 0, (size_t)n * nkv * hd * sizeof(float));
    const float *r = sp->recv;
    for (int d = 0; d < P; d++) {
        const int kl = kv_lo(sp, d);
        for (int t = 0; t < n; t++) {
            memcpy(dq + ((size_t)t * nh + (size_t)d * nh_l) * hd, r, (size_t)nh_l * hd * sizeof(float));
            r += (size_t)nh_l * hd;
            /* kv heads replicated over ranks (nkv < sp): the replicas' partial gradients add up */
            float *gk = dk + ((size_t)t * nkv + kl) * hd, *gv = dv + ((size_t)t * nkv + kl) * hd;
            for (int i = 0; i < nkv_l * hd; i++) gk[i] += r[i];
            r += (size_t)nkv_l * hd;
            for (int i = 0; i < nkv_l * hd; i++) gv[i] += r[i];
            r += (size_t)nkv_l * hd;
        }
    }
    sp->st.seconds += moerl_now() - t1;
}
