/* Batch-invariant kernels (rollout.batch_invariant; moe_exec_opts.batch_invariant).
 *
 * Each output element is reduced in ONE fixed order that depends only on the element's own
 * inputs — never on how many rows the call has, where the row sits in the batch, how the work
 * is split over threads, or whether the caller is the rollout engine (decode, chunked prefill
 * over the KV cache) or the trainer (full sequences, any micro-batch):
 *  - products: out[r, o] = bi_dot(x[r, :], W[o, :]) — eight interleaved partial sums over the
 *    inner dimension (lane l sums i ≡ l mod 8, ascending), combined in a fixed tree, then the
 *    remainder i ≥ 8·⌊I/8⌋ in ascending order; with accumulate, out + that sum. One function for
 *    the dense projections, the router, the LM head and every expert's GEMM (decode and training
 *    alike: the "one GEMM kernel family" of the issue). The project compiles with -std=c11
 *    (no floating-point contraction, no -ffast-math), so this C order is the order executed;
 *    no `omp simd reduction` (which lets the compiler pick the order) is used on these sums.
 *  - attention: one query row at a time over its keys 0..pos in ascending order, two passes
 *    (scores and their max; then Σ e^{s−max} in double and Σ p·v in float, both ascending),
 *    the same row function for the packed training layout and the KV cache (keys of one kv
 *    head are rows of stride nkv·hd in both).
 *  - the MoE combine stays moe_unpermute_forward (slot order j = 0..K−1 per token), the norms,
 *    RoPE and log-softmax are per-row kernels already.
 * The threads split rows / output columns / (token, head) pairs; an element is never split.
 * The price: no cache blocking of the products beyond 16 rows per pass over W, no BLAS
 * (bench/bench_batch_invariant.c; docs/rl.md "Bit-for-bit on-policy").
 * Source: the batch-invariance semantics of Thinking Machines' "Defeating Nondeterminism in LLM
 * Inference" (He et al. 2025): fixed reduction order per output, no split-K, fixed attention
 * key-block order for decode and prefill alike. Contract: src/kernels/kernels.h.
 */
#include "base/common.h"
#include "kernels/kernels.h"
#include "kernels/cpu/kpar.h"

#include <math.h>
#include <string.h>

/* Rows per pass over W (their inputs stay in cache while W's rows stream). */
#define BI_ROWS 16
/* Output columns per work item of a product opened outside a parallel region. */
#define BI_COLS 64
/* Below this many multiply-adds a product or attention call stays on the calling thread. */
#define BI_PAR_MIN_MACS 65536

/* Eight float lanes (GCC/Clang vector extension: lane-wise IEEE operations, the same in every
 * instruction set; loads through memcpy, so no alignment is assumed). */
typedef float bi_v8 __attribute__((vector_size(32)));
static inline bi_v8 bi_load(const float *p) {
    bi_v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* The fixed tree over the eight lanes. */
static inline float bi_lanes(bi_v8 c) { return ((c[0] + c[4]) + (c[1] + c[5])) + ((c[2] + c[6]) + (c[3] + c[7])); }

/* Σ_i a[i]·b[i] in the fixed order described above. */
static inline float bi_dot(const float *restrict a, const float *restrict b, int n) {
    bi_v8 c = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) c += bi_load(a + i) * bi_load(b + i);
    float s = bi_lanes(c);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* bi_dot of a with four rows of W at once (s[j] = bi_dot(a, w_j, n)): the same operations in the same
 * order for each output, interleaved so that four independent chains keep the adders busy. */
static inline void bi_dot4(float s[4], const float *restrict a, const float *restrict w0, const float *restrict w1,
                           const float *restrict w2, const float *restrict w3, int n) {
    bi_v8 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const bi_v8 x = bi_load(a + i);
        c0 += x * bi_load(w0 + i);
        c1 += x * bi_load(w1 + i);
        c2 += x * bi_load(w2 + i);
        c3 += x * bi_load(w3 + i);
    }
    float t0 = bi_lanes(c0), t1 = bi_lanes(c1), t2 = bi_lanes(c2), t3 = bi_lanes(c3);
    for (; i < n; i++) {
        t0 += a[i] * w0[i];
        t1 += a[i] * w1[i];
        t2 += a[i] * w2[i];
        t3 += a[i] * w3[i];
    }
    s[0] = t0, s[1] = t1, s[2] = t2, s[3] = t3;
}

/* bi_dot4 for two rows a and b at once (each W vector loaded once for both): sa[j] = bi_dot(a, w_j),
 * sb[j] = bi_dot(b, w_j), the same operations per output as bi_dot. */
static inline void bi_dot4x2(float sa[4], float sb[4], const float *restrict a, const float *restrict b,
                             const float *restrict w0, int ldw, int n) {
    const float *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
    bi_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const bi_v8 x = bi_load(a + i), y = bi_load(b + i), v0 = bi_load(w0 + i), v1 = bi_load(w1 + i),
                    v2 = bi_load(w2 + i), v3 = bi_load(w3 + i);
        a0 += x * v0, a1 += x * v1, a2 += x * v2, a3 += x * v3;
        b0 += y * v0, b1 += y * v1, b2 += y * v2, b3 += y * v3;
    }
    float ta[4] = {bi_lanes(a0), bi_lanes(a1), bi_lanes(a2), bi_lanes(a3)};
    float tb[4] = {bi_lanes(b0), bi_lanes(b1), bi_lanes(b2), bi_lanes(b3)};
    const float *w[4] = {w0, w1, w2, w3};
    for (; i < n; i++)
        for (int j = 0; j < 4; j++) {
            ta[j] += a[i] * w[j][i];
            tb[j] += b[i] * w[j][i];
        }
    memcpy(sa, ta, sizeof ta);
    memcpy(sb, tb, sizeof tb);
}

void gemm_bi_nt_rows(float *out, int ldo, const float *const *rows, const float *W, int m, int I, int o0, int o1,
                     int accumulate) {
    MOERL_ASSERT(m >= 0 && I >= 0 && o0 >= 0 && o1 >= o0);
    int o = o0;
    for (; o + 4 <= o1; o += 4) {
        const float *w = W + (size_t)o * I;
        int r = 0;
        for (; r + 2 <= m; r += 2) {
            float s0[4], s1[4];
            bi_dot4x2(s0, s1, rows[r], rows[r + 1], w, I, I);
            float *y0 = out + (size_t)r * ldo + (o - o0), *y1 = y0 + ldo;
            for (int j = 0; j < 4; j++) {
                y0[j] = accumulate ? y0[j] + s0[j] : s0[j];
                y1[j] = accumulate ? y1[j] + s1[j] : s1[j];
            }
        }
        for (; r < m; r++) {
            float s[4];
            bi_dot4(s, rows[r], w, w + I, w + 2 * (size_t)I, w + 3 * (size_t)I, I);
            float *y = out + (size_t)r * ldo + (o - o0);
            for (int j = 0; j < 4; j++) y[j] = accumulate ? y[j] + s[j] : s[j];
        }
    }
    for (; o < o1; o++) {
        const float *w = W + (size_t)o * I;
        for (int r = 0; r < m; r++) {
            const float s = bi_dot(rows[r], w, I);
            float *y = out + (size_t)r * ldo + (o - o0);
            *y = accumulate ? *y + s : s;
        }
    }
}

/* Rows [r0, r1) × columns [c0, c1) of linear_forward_bi. */
static void linear_bi_block(float *out, const float *x, const float *W, int I, int O, int r0, int r1, int c0, int c1,
                            int accumulate) {
    const float *rows[BI_ROWS];
    for (int b = r0; b < r1; b += BI_ROWS) {
        const int n = MOERL_MIN(BI_ROWS, r1 - b);
        for (int r = 0; r < n; r++) rows[r] = x + (size_t)(b + r) * I;
        gemm_bi_nt_rows(out + (size_t)b * O + c0, O, rows, W, n, I, c0, c1, accumulate);
    }
}

void linear_forward_bi(float *out, const float *x, const float *W, int N, int I, int O, int accumulate) {
    MOERL_ASSERT(N >= 0 && I >= 0 && O >= 0);
    if (N == 0 || O == 0) return;
    const int rb = (N + BI_ROWS - 1) / BI_ROWS, cb = (O + BI_COLS - 1) / BI_COLS;
#pragma omp parallel for schedule(dynamic, 1) if (kpar((long)N * I * O, BI_PAR_MIN_MACS))
    for (int it = 0; it < rb * cb; it++) {
        const int r0 = it / cb * BI_ROWS, c0 = it % cb * BI_COLS;
        linear_bi_block(out, x, W, I, O, r0, MOERL_MIN(N, r0 + BI_ROWS), c0, MOERL_MIN(O, c0 + BI_COLS), accumulate);
    }
}

/* silu(g)·u, the SwiGLU of one element (the batch-invariant path's own epilogue). */
static inline float bi_swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Work item `it` of grouped_gemm_forward_bi_team → group g, row block [r0, r1), column block
 * [c0, c1) (activation columns with SwiGLU). Returns 0 past the last item. */
static int bi_item(int it, const int *offsets, int E, int cb, int cw, int ncols, int *g, int *r0, int *r1, int *c0,
                   int *c1) {
    for (int e = 0; e < E; e++) {
        const int m = offsets[e + 1] - offsets[e], n = (m + BI_ROWS - 1) / BI_ROWS * cb;
        if (it < n) {
            *g = e;
            *r0 = offsets[e] + it / cb * BI_ROWS;
            *r1 = MOERL_MIN(offsets[e + 1], *r0 + BI_ROWS);
            *c0 = it % cb * cw;
            *c1 = MOERL_MIN(ncols, *c0 + cw);
            return 1;
        }
        it -= n;
    }
    return 0;
}

void grouped_gemm_forward_bi_team(float *out, float *a, const float *W, const int *offsets, int E, int I, int O,
                                  const grouped_fuse *f) {
    MOERL_ASSERT(E > 0 && I > 0 && O > 0);
    MOERL_ASSERT(!f->swiglu_act || O % 2 == 0);
    const int half = O / 2, ncols = f->swiglu_act ? half : O, cw = f->swiglu_act ? BI_COLS / 2 : BI_COLS;
    const int cb = (ncols + cw - 1) / cw;
    int items = 0;
    for (int e = 0; e < E; e++) items += (offsets[e + 1] - offsets[e] + BI_ROWS - 1) / BI_ROWS * cb;
#pragma omp for schedule(dynamic, 1)
    for (int it = 0; it < items; it++) {
        int g, r0, r1, c0, c1;
        if (!bi_item(it, offsets, E, cb, cw, ncols, &g, &r0, &r1, &c0, &c1)) continue;
        const float *rows[BI_ROWS];
        for (int i = r0; i < r1; i++) {
            const float *src = f->gather_x ? f->gather_x + (size_t)(f->sorted_row[i] % f->n_tokens) * I
                                           : a + (size_t)i * I;
            rows[i - r0] = src;
            if (f->gather_x && a && c0 == 0) memcpy(a + (size_t)i * I, src, (size_t)I * sizeof(float));
        }
        const float *Wg = W + (size_t)g * O * I;
        float *o = out + (size_t)r0 * O;
        gemm_bi_nt_rows(o + c0, O, rows, Wg, r1 - r0, I, c0, c1, 0);
        if (!f->swiglu_act) continue;
        gemm_bi_nt_rows(o + half + c0, O, rows, Wg, r1 - r0, I, half + c0, half + c1, 0);
        for (int i = r0; i < r1; i++) {
            const float *gu = out + (size_t)i * O;
            float *act = f->swiglu_act + (size_t)i * half;
            for (int c = c0; c < c1; c++) act[c] = bi_swiglu(gu[c], gu[half + c]);
        }
    }
}

/* One query row against n keys (key j at k + j·ld, value j at v + j·ld): out[hd] (OVERWRITTEN)
 * and the row's log-sum-exp; s: scratch of n floats. */
static float bi_attend_row(float *out, const float *q, const float *k, const float *v, long ld, int n, int hd,
                           float scale, float *s) {
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        s[j] = bi_dot(q, k + (size_t)j * ld, hd) * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    double sum = 0.0;
    for (int d = 0; d < hd; d++) out[d] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float p = expf(s[j] - mx);
        sum += p;
        const float *vj = v + (size_t)j * ld;
        for (int d = 0; d < hd; d++) out[d] += p * vj[d];
    }
    const float inv = (float)(1.0 / sum);
    for (int d = 0; d < hd; d++) out[d] *= inv;
    return mx + (float)log(sum);
}

void attention_forward_bi(float *out, float *lse, const float *q, const float *k, const float *v,
                          const int *cu_seqlens, int B, int N, int nh, int nkv, int hd, float scale) {
    MOERL_ASSERT(B >= 0 && N >= 0 && nkv > 0 && nh % nkv == 0 && hd > 0 && scale > 0.0f);
    MOERL_ASSERT(cu_seqlens[0] == 0 && cu_seqlens[B] == N);
    if (N == 0) return;
    const int G = nh / nkv;
    const long ld = (long)nkv * hd;
    long macs = 0;
    int maxlen = 0;
    for (int b = 0; b < B; b++) {
        const long L = cu_seqlens[b + 1] - cu_seqlens[b];
        macs += L * (L + 1) / 2 * nh * hd;
        maxlen = MOERL_MAX(maxlen, (int)L);
    }
#pragma omp parallel if (kpar(macs, BI_PAR_MIN_MACS))
    {
        float *s = xmalloc((size_t)MOERL_MAX(maxlen, 1) * sizeof(float));
        int b = 0;
#pragma omp for schedule(dynamic, 16)
        for (long rh = 0; rh < (long)N * nh; rh++) {
            const int n = (int)(rh / nh), h = (int)(rh % nh);
            while (cu_seqlens[b + 1] <= n) b++;
            while (cu_seqlens[b] > n) b--;
            const int s0 = cu_seqlens[b], g = h / G;
            const float l = bi_attend_row(out + ((size_t)n * nh + h) * hd, q + ((size_t)n * nh + h) * hd,
                                          k + (size_t)s0 * ld + (size_t)g * hd, v + (size_t)s0 * ld + (size_t)g * hd,
                                          ld, n - s0 + 1, hd, scale, s);
            if (lse) lse[(size_t)h * N + n] = l;
        }
        free(s);
    }
}

/* Both KV-cache entry points: tables NULL = the slot layout (sequence s's rows start at s·span);
 * paged, a (token, KV head) item gathers its keys' K and V rows into contiguous scratch first (the
 * same values in the same order, so the same bits) and attends its G query heads from there. */
static void kvcache_bi(float *out, const float *q, const float *k_cache, const float *v_cache, const int *tables,
                       int max_blocks, const int *seq, const int *pos, int N, int nh, int nkv, int hd, int bs,
                       int span, float scale) {
    MOERL_ASSERT(N >= 0 && nkv > 0 && nh % nkv == 0 && hd > 0);
    if (N == 0) return;
    const int G = nh / nkv, max_pos = tables ? max_blocks * bs : span;
    const long ld = (long)nkv * hd;
    long macs = 0;
    int keys = 1; /* the most keys a token of this call attends */
    for (int n = 0; n < N; n++) {
        MOERL_ASSERT(pos[n] >= 0 && pos[n] < max_pos);
        macs += (long)(pos[n] + 1) * nh * hd;
        keys = MOERL_MAX(keys, pos[n] + 1);
    }
    if (!tables) {
#pragma omp parallel if (kpar(macs, BI_PAR_MIN_MACS))
        {
            float *s = xmalloc((size_t)span * sizeof(float));
#pragma omp for schedule(dynamic, 16)
            for (long rh = 0; rh < (long)N * nh; rh++) {
                const int n = (int)(rh / nh), h = (int)(rh % nh);
                const size_t base = (size_t)seq[n] * span * ld + (size_t)(h / G) * hd;
                bi_attend_row(out + ((size_t)n * nh + h) * hd, q + ((size_t)n * nh + h) * hd, k_cache + base,
                              v_cache + base, ld, pos[n] + 1, hd, scale, s);
            }
            free(s);
        }
        return;
    }
#pragma omp parallel if (kpar(macs, BI_PAR_MIN_MACS))
    {
        float *s = xmalloc((size_t)keys * (1 + 2 * (size_t)hd) * sizeof(float));
        float *kg = s + keys, *vg = kg + (size_t)keys * hd;
#pragma omp for schedule(dynamic, 4)
        for (long it = 0; it < (long)N * nkv; it++) {
            const int n = (int)(it / nkv), g = (int)(it % nkv), P = pos[n] + 1;
            const int *tbl = tables + (size_t)seq[n] * max_blocks;
            for (int j = 0; j < P; j++) {
                const size_t o = ((size_t)tbl[j / bs] * bs + j % bs) * ld + (size_t)g * hd;
                memcpy(kg + (size_t)j * hd, k_cache + o, (size_t)hd * sizeof(float));
                memcpy(vg + (size_t)j * hd, v_cache + o, (size_t)hd * sizeof(float));
            }
            for (int h = g * G; h < (g + 1) * G; h++)
                bi_attend_row(out + ((size_t)n * nh + h) * hd, q + ((size_t)n * nh + h) * hd, kg, vg, hd, P, hd,
                              scale, s);
        }
        free(s);
    }
}

void attention_kvcache_forward_bi(float *out, const float *q, const float *k_cache, const float *v_cache,
                                  const int *slot, const int *pos, int N, int nh, int nkv, int hd, int max_len,
                                  float scale) {
    kvcache_bi(out, q, k_cache, v_cache, NULL, 0, slot, pos, N, nh, nkv, hd, max_len, max_len, scale);
}

void attention_kvcache_paged_forward_bi(float *out, const float *q, const float *k_cache, const float *v_cache,
                                        const int *block_tables, int max_blocks, const int *seq, const int *pos,
                                        int N, int nh, int nkv, int hd, int block_size, float scale) {
    MOERL_ASSERT(block_tables && block_size > 0 && max_blocks > 0);
    kvcache_bi(out, q, k_cache, v_cache, block_tables, max_blocks, seq, pos, N, nh, nkv, hd, block_size, 0, scale);
}
