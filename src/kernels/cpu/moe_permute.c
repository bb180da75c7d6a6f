/* MoE token routing: permute the N·K routed (token, slot) rows into expert-contiguous groups,
 * and unpermute (weighted by the routing probabilities) back to tokens — forward and backward.
 *
 * Rows are named by their k-major expanded index r = j·N + t (row_idx from the router).
 * permute_index is a stable counting sort by expert id: O(N·K + E) time, no per-expert scan.
 * Unpermute is fused with the probability weighting (the Ascend practice: unpermute takes the
 * routing probabilities), so its backward yields both dy and dtopk_w.
 * Source: Megatron-LM moe_utils.permute/unpermute; Ascend npu_moe_init_routing /
 * npu_moe_token_unpermute. Contract and shapes: src/kernels/kernels.h.
 */
#include "base/common.h"
#include "kernels/kernels.h"
#include "kernels/cpu/kpar.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Elements (rows × H) below which a copy/add loop stays on one thread. */
#define PERMUTE_PAR_MIN_ELEMS 32768

/* Stable counting sort of the routed rows by expert id. Pass 1 counts each expert's rows,
 * the prefix sum gives expert_offsets, pass 2 walks the rows in expanded-row order
 * (j outer, t inner: r = j·N + t ascending) and drops each at its expert's cursor, so each
 * group is stable in r. Errors (caller bugs, asserted): an id outside [0, E), a row_idx entry
 * that is not the k-major index j·N + t router_topk_forward produces. */
void moe_permute_index(int *sorted_row, int *expanded_pos, int *tokens_per_expert, int *expert_offsets,
                       const int *topk_ids, const int *row_idx, int N, int E, int K) {
    MOERL_ASSERT(N >= 0 && E > 0 && K >= 1);
    memset(tokens_per_expert, 0, (size_t)E * sizeof(int));
    const long M = (long)N * K;
    for (long i = 0; i < M; i++) {
        int e = topk_ids[i];
        MOERL_ASSERT(e >= 0 && e < E);
        tokens_per_expert[e]++;
    }
    expert_offsets[0] = 0;
    for (int e = 0; e < E; e++) expert_offsets[e + 1] = expert_offsets[e] + tokens_per_expert[e];
    /* Pass 2, stable: tokens_per_expert[e] is re-counted from zero as expert e's cursor and
     * ends equal to its count again. */
    memset(tokens_per_expert, 0, (size_t)E * sizeof(int));
    for (int j = 0; j < K; j++) {
        for (int t = 0; t < N; t++) {
            const long i = (long)t * K + j;
            const int r = row_idx[i];
            MOERL_ASSERT(r == j * N + t);
            const int e = topk_ids[i];
            const int pos = expert_offsets[e] + tokens_per_expert[e]++;
            sorted_row[pos] = r;
            expanded_pos[i] = pos;
        }
    }
}

/* permuted[i,:] = x[sorted_row[i] mod N, :], i < M. Source: Megatron permute (index_select). */
void moe_permute_forward(float *permuted, const float *x, const int *sorted_row, int N, int M, int H) {
    MOERL_ASSERT(N > 0 || M == 0);
#pragma omp parallel for schedule(static) if (kpar((long)M * H, PERMUTE_PAR_MIN_ELEMS))
    for (int i = 0; i < M; i++) {
        const int t = sorted_row[i] % N;
        memcpy(permuted + (size_t)i * H, x + (size_t)t * H, (size_t)H * sizeof(float));
    }
}

/* dx[t,:] += Σ_{i : sorted_row[i] mod N = t} dpermuted[i,:] (ACCUMULATES). Rows of one token
 * may sit anywhere, so threads split the H columns (each thread owns a column slice of every
 * row: race-free without an inverse map). Source: the transpose of the gather above. */
void moe_permute_backward(float *dx, const float *dpermuted, const int *sorted_row, int N, int M, int H) {
    MOERL_ASSERT(N > 0 || M == 0);
#pragma omp parallel if (kpar((long)M * H, PERMUTE_PAR_MIN_ELEMS))
    {
        int nth = 1, tid = 0;
#ifdef _OPENMP
        nth = omp_get_num_threads();
        tid = omp_get_thread_num();
#endif
        /* column slices in multiples of 16 floats (one 64-byte line) */
        const int lines = (H + 15) / 16;
        const int h0 = MOERL_MIN(H, (int)((long)lines * tid / nth) * 16);
        const int h1 = MOERL_MIN(H, (int)((long)lines * (tid + 1) / nth) * 16);
        for (int i = 0; i < M; i++) {
            const int t = sorted_row[i] % N;
            float *d = dx + (size_t)t * H;
            const float *s = dpermuted + (size_t)i * H;
            for (int h = h0; h < h1; h++) d[h] += s[h];
        }
    }
}

/* <a, b> over n floats with 16 partial sums (vectorisable without reassociation flags). */
static float dot_f32(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int h = 0;
    for (; h + 16 <= n; h += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[h + l] * b[h + l];
    float s = 0.0f;
    for (; h < n; h++) s += a[h] * b[h];
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

/* out[t,:] = Σ_j topk_w[t,j] · y[expanded_pos[t·K+j], :] (OVERWRITTEN). Slots are summed in
 * order j = 0..K−1. Source: Megatron unpermute with probs / Ascend npu_moe_token_unpermute. */
void moe_unpermute_forward(float *out, const float *y, const float *topk_w, const int *expanded_pos,
                           int N, int K, int H) {
#pragma omp parallel for schedule(static) if (kpar((long)N * K * H, PERMUTE_PAR_MIN_ELEMS))
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * H;
        const float w0 = topk_w[(size_t)t * K];
        const float *y0 = y + (size_t)expanded_pos[(size_t)t * K] * H;
        for (int h = 0; h < H; h++) o[h] = w0 * y0[h];
        for (int j = 1; j < K; j++) {
            const float w = topk_w[(size_t)t * K + j];
            const float *yj = y + (size_t)expanded_pos[(size_t)t * K + j] * H;
            for (int h = 0; h < H; h++) o[h] += w * yj[h];
        }
    }
}

/* dy[pos(t,j),:] = topk_w[t,j] · dout[t,:] and dtopk_w[t,j] = <dout[t,:], y[pos(t,j),:]>, both
 * OVERWRITTEN (every row of dy is written since expanded_pos is a bijection onto [0, M)).
 * dtopk_w may be NULL. Source: the chain rule of the fused unpermute above (unpermute in Megatron-LM's megatron/core/transformer/moe/moe_utils.py). */
void moe_unpermute_backward(float *dy, float *dtopk_w, const float *dout, const float *y, const float *topk_w,
                            const int *expanded_pos, int N, int K, int H) {
#pragma omp parallel for schedule(static) if (kpar((long)N * K * H, PERMUTE_PAR_MIN_ELEMS))
    for (int t = 0; t < N; t++) {
        const float *g = dout + (size_t)t * H;
        for (int j = 0; j < K; j++) {
            const size_t pos = (size_t)expanded_pos[(size_t)t * K + j];
            const float w = topk_w[(size_t)t * K + j];
            if (dy) {
                float *d = dy + pos * H;
                for (int h = 0; h < H; h++) d[h] = w * g[h];
            }
            if (dtopk_w) {
                const float *yr = y + pos * H;
                dtopk_w[(size_t)t * K + j] = dot_f32(g, yr, H);
            }
        }
    }
}

/* One permuted row of moe_unpermute_backward: dy[h] = w·g[h] (OVERWRITTEN) and *dtopk_w = <g, y>
 * with the same arithmetic (and so the same bits) as the fused kernel above. */
void moe_unpermute_backward_row(float *dy, float *dtopk_w, const float *g, const float *y, float w, int H) {
    for (int h = 0; h < H; h++) dy[h] = w * g[h];
    if (dtopk_w) *dtopk_w = dot_f32(g, y, H);
}
