/* The MoE layer the way HF Qwen3MoeSparseMoeBlock computes it: a loop over experts, each
 * finding its tokens by scanning all N·K selections (HF: one_hot(selected_experts) and
 * torch.where per expert), gathering them, running the expert MLP
 * down(silu(gate(x)) · up(x)) and scatter-adding the result weighted by the routing weight.
 * This is the readable oracle the fused pipeline (permute → grouped GEMM → unpermute) is tested
 * against, and the ablation bench/bench_moe_layer.c measures it against.
 * Expert weights are the stacked moerl layout: gate_up_w[E, 2I, H] (gate rows, then up rows),
 * down_w[E, H, I]. Source: transformers/models/qwen3_moe/modeling_qwen3_moe.py.
 */
#include "base/common.h"
#include "kernels/kernels.h"

#include <string.h>

/* Scratch for one expert's rows (sized for the largest expert of the call). */
typedef struct {
    int *tok, *slot;   /* [m] token and top-k slot of each selected row */
    float *xs;         /* [m, H]  gathered inputs */
    float *gu;         /* [m, 2I] gate_up pre-activations */
    float *h;          /* [m, I]  SwiGLU output */
    float *y;          /* [m, H]  expert output */
    float *dy, *dh, *dgu, *dxs; /* backward counterparts */
} naive_scratch;

static void naive_scratch_alloc(naive_scratch *s, int mmax, int H, int I, int backward) {
    memset(s, 0, sizeof *s);
    size_t m = (size_t)MOERL_MAX(mmax, 1);
    s->tok = xmalloc(m * sizeof(int));
    s->slot = xmalloc(m * sizeof(int));
    s->xs = xmalloc(m * H * sizeof(float));
    s->gu = xmalloc(m * 2 * I * sizeof(float));
    s->h = xmalloc(m * I * sizeof(float));
    s->y = xmalloc(m * H * sizeof(float));
    if (backward) {
        s->dy = xmalloc(m * H * sizeof(float));
        s->dh = xmalloc(m * I * sizeof(float));
        s->dgu = xmalloc(m * 2 * I * sizeof(float));
        s->dxs = xmalloc(m * H * sizeof(float));
    }
}

static void naive_scratch_free(naive_scratch *s) {
    free(s->tok); free(s->slot); free(s->xs); free(s->gu); free(s->h); free(s->y);
    free(s->dy); free(s->dh); free(s->dgu); free(s->dxs);
}

/* Largest number of selections any expert receives (so scratch fits every expert). */
static int naive_max_rows(const int *topk_ids, int N, int E, int K) {
    int *cnt = xcalloc((size_t)E, sizeof(int));
    int mx = 0;
    for (long i = 0; i < (long)N * K; i++) {
        MOERL_ASSERT(topk_ids[i] >= 0 && topk_ids[i] < E);
        mx = MOERL_MAX(mx, ++cnt[topk_ids[i]]);
    }
    free(cnt);
    return mx;
}

/* HF's torch.where(expert_mask[e]): the (slot, token) pairs routed to e, slot-major. */
static int naive_select(int *tok, int *slot, const int *topk_ids, int e, int N, int K) {
    int m = 0;
    for (int j = 0; j < K; j++)
        for (int t = 0; t < N; t++)
            if (topk_ids[(size_t)t * K + j] == e) { tok[m] = t; slot[m] = j; m++; }
    return m;
}

/* Expert e's forward on its m gathered rows: xs → gu → h → y (all kept for backward). */
static void naive_expert_forward(naive_scratch *s, const float *x, const float *gate_up_w, const float *down_w,
                                 int e, int m, int H, int I) {
    for (int r = 0; r < m; r++) memcpy(s->xs + (size_t)r * H, x + (size_t)s->tok[r] * H, (size_t)H * sizeof(float));
    linear_forward(s->gu, s->xs, gate_up_w + (size_t)e * 2 * I * H, m, H, 2 * I, 0);
    swiglu_forward(s->h, s->gu, m, I);
    linear_forward(s->y, s->h, down_w + (size_t)e * H * I, m, I, H, 0);
}

/* out[N,H] (OVERWRITTEN) = Σ_{t,j} topk_w[t,j] · expert_{ids[t,j]}(x[t]), experts visited in
 * ascending id (HF index_add_ order). Errors: an expert id outside [0, E) is a caller bug
 * (asserted). Source: HF Qwen3MoeSparseMoeBlock.forward. */
void moe_naive_forward(float *out, const float *x, const float *gate_up_w, const float *down_w,
                       const int *topk_ids, const float *topk_w, int N, int H, int E, int K, int I) {
    MOERL_ASSERT(N >= 0 && H > 0 && E > 0 && K >= 1 && I > 0);
    memset(out, 0, (size_t)N * H * sizeof(float));
    naive_scratch s;
    naive_scratch_alloc(&s, naive_max_rows(topk_ids, N, E, K), H, I, 0);
    for (int e = 0; e < E; e++) {
        const int m = naive_select(s.tok, s.slot, topk_ids, e, N, K);
        if (m == 0) continue;
        naive_expert_forward(&s, x, gate_up_w, down_w, e, m, H, I);
        for (int r = 0; r < m; r++) {
            const int t = s.tok[r];
            const float w = topk_w[(size_t)t * K + s.slot[r]];
            float *o = out + (size_t)t * H;
            const float *y = s.y + (size_t)r * H;
            for (int h = 0; h < H; h++) o[h] += w * y[h];
        }
    }
    naive_scratch_free(&s);
}

/* Backward of moe_naive_forward, recomputing each expert's forward from x:
 *   dy_r = w_r · dout[t_r],  dtopk_w[t_r, j_r] = <dout[t_r], y_r>,
 *   dh = dy · down_e,  ddown_w[e] += dyᵀ · h,  dgu = SwiGLU′(dh),
 *   dxs = dgu · gate_up_e,  dgate_up_w[e] += dguᵀ · xs,  dx[t_r] += dxs_r.
 * dx and dtopk_w OVERWRITTEN, dgate_up_w / ddown_w ACCUMULATE (any of the four may be NULL).
 * Source: the chain rule through HF Qwen3MoeSparseMoeBlock (what autograd computes). */
void moe_naive_backward(float *dx, float *dgate_up_w, float *ddown_w, float *dtopk_w, const float *dout,
                        const float *x, const float *gate_up_w, const float *down_w, const int *topk_ids,
                        const float *topk_w, int N, int H, int E, int K, int I) {
    MOERL_ASSERT(N >= 0 && H > 0 && E > 0 && K >= 1 && I > 0);
    if (dx) memset(dx, 0, (size_t)N * H * sizeof(float));
    naive_scratch s;
    naive_scratch_alloc(&s, naive_max_rows(topk_ids, N, E, K), H, I, 1);
    for (int e = 0; e < E; e++) {
        const int m = naive_select(s.tok, s.slot, topk_ids, e, N, K);
        if (m == 0) continue;
        naive_expert_forward(&s, x, gate_up_w, down_w, e, m, H, I);
        for (int r = 0; r < m; r++) {
            const int t = s.tok[r];
            const size_t tj = (size_t)t * K + s.slot[r];
            const float *g = dout + (size_t)t * H, *y = s.y + (size_t)r * H;
            float *d = s.dy + (size_t)r * H;
            float dot = 0.0f;
            for (int h = 0; h < H; h++) {
                d[h] = topk_w[tj] * g[h];
                dot += g[h] * y[h];
            }
            if (dtopk_w) dtopk_w[tj] = dot;
        }
        const float *Wd = down_w + (size_t)e * H * I, *Wgu = gate_up_w + (size_t)e * 2 * I * H;
        linear_backward(s.dh, ddown_w ? ddown_w + (size_t)e * H * I : NULL, s.dy, s.h, Wd, m, I, H, 0);
        swiglu_backward(s.dgu, s.dh, s.gu, m, I);
        linear_backward(dx ? s.dxs : NULL, dgate_up_w ? dgate_up_w + (size_t)e * 2 * I * H : NULL, s.dgu, s.xs, Wgu,
                        m, H, 2 * I, 0);
        if (dx)
            for (int r = 0; r < m; r++) {
                float *o = dx + (size_t)s.tok[r] * H;
                const float *d = s.dxs + (size_t)r * H;
                for (int h = 0; h < H; h++) o[h] += d[h];
            }
    }
    naive_scratch_free(&s);
}
