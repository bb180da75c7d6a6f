/* moerl's own tiled GEMM for the MoE layer's expert products: a 6×16 register tile (AVX2 + FMA,
 * twelve 8-float accumulators), both operands packed per call into the tile's panel layout, the
 * packing reading rows through an index (the permute's gather fused into the pack) and the
 * epilogues of the MoE layer applied per tile (SwiGLU forward, SwiGLU backward).
 *
 * Why not OpenBLAS here: the expert products are small (a few hundred rows per expert, 128–2048
 * columns) and OpenBLAS's sgemm reached 45–55 GFLOP/s per thread on them on this project's
 * AVX2 machine (≈ 93 GFLOP/s FMA peak per core), spending its time in per-call packing and
 * edge handling; and it can neither gather rows nor run an epilogue, so the permuted copy and
 * the SwiGLU pass cost extra sweeps over memory.
 *
 * Layout (per call, single-threaded):
 *   k-blocks of TG_KC, column blocks of TG_NP panels, 6-row tiles.
 *   Packed B panel: Bp[p][l], p < kc, l < 16: lane l of row p (zero for missing columns).
 *     Plain: lane l = column j + l. SwiGLU: lanes 0..7 = gate columns c..c+7, lanes 8..15 = the
 *     up columns half + c..half + c + 7, so one tile holds both halves of 8 activations.
 *   Packed A tile: Ap[p][i], i < 6 (zero for missing rows).
 *   Microkernel: for p ascending, acc[i][l] += Ap[p][i]·Bp[p][l] (one fused multiply-add per
 *   element and k, k ascending within a k-block; k-blocks add to C in order). Results therefore
 *   differ from a different summation order (OpenBLAS, the naive loop) by fp32 rounding only.
 * Without AVX2/FMA at compile time (-march without them) the same loops run in plain C.
 * Source: the GotoBLAS/BLIS structure (Goto & van de Geijn 2008, "Anatomy of high-performance
 * matrix multiplication"; Van Zee & van de Geijn 2015, BLIS) — packed panels and a register
 * microkernel; the tile size follows from 16 ymm registers (12 accumulators, 2 B vectors, 1
 * broadcast).
 */
#include "base/common.h"
#include "kernels/kernels.h"

#include <string.h>

#include "kernels/cpu/vexp.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TG_SIMD 1
#else
#define TG_SIMD 0
#endif

#define TG_MR 6
#define TG_NR 16
#define TG_KC 320 /* most k per block (k is cut into equal blocks of at most this): a packed A
                   * tile of ≤ 7.5 KB, a B panel of ≤ 20 KB (L1) */
#define TG_NP 16  /* panels per packed B block: 256 B columns, ≤ 320 KB (L2) */
#define TG_MC 144  /* rows of a packed A chunk (8 tiles; only operands that are not read in place) */
#define TG_PF 24  /* rows ahead that the packing loops prefetch (the sources come from L3 or memory:
                   * strided rows that the hardware prefetchers do not follow) */

/* Per-thread packing buffers (static TLS: no allocation per call, no large stack frames). */
static _Thread_local float tg_bp[TG_KC * TG_NP * TG_NR] __attribute__((aligned(64)));
static _Thread_local float tg_ap[TG_KC * TG_MC] __attribute__((aligned(64)));

/* Storage row x of an operand (after the gather): base + phys(x)·ld. */
static inline const float *tg_srow(const tg_mat *M, int x) {
    const long px = M->idx ? (long)(M->idx[x] % M->mod) : (long)x;
    return M->p + px * M->ld;
}
/* The factor of storage row x: its routing weight, or 1. */
static inline float tg_sw(const tg_mat *M, int x) {
    if (!M->rw) return 1.0f;
    const int v = M->idx[x];
    return M->rw[(long)(v % M->mod) * M->rk + v / M->mod];
}

/* Pack rows [i0, i0 + mc) × k [k0, k0 + kc) of a transposed A (storage rows are k: the weight
 * gradient's doutᵀ) as consecutive 6-row tiles, tile t at Ap + t·kc·6 holding
 * Ap[p][i] = A(i0 + 6t + i, k0 + p) (zero past mc). Each k reads one contiguous run of mc
 * elements (scaled by the storage row's factor), so the source is swept row by row. */
static void tg_pack_a(float *Ap, const tg_mat *A, const float *const *krow, const float *kw, int i0, int mc, int kc) {
    const int nt = (mc + TG_MR - 1) / TG_MR, full = mc / TG_MR, rest = mc % TG_MR;
    if (rest) memset(Ap + (size_t)(nt - 1) * kc * TG_MR, 0, (size_t)kc * TG_MR * sizeof(float));
    for (int p = 0; p < kc; p++) {
        const float *s = krow[p] + i0;
        if (p + TG_PF < kc)
            for (int o = 0; o < mc; o += 16) __builtin_prefetch(krow[p + TG_PF] + i0 + o);
        float *d = Ap + p * TG_MR;
        if (A->rw) {
            const float w = kw[p];
#if TG_SIMD
            const __m128 w4 = _mm_set1_ps(w);
            for (int t = 0; t < full; t++) { /* 4 + 2 lanes (the same products as the scalar loop) */
                const float *st = s + t * TG_MR;
                float *dt = d + (size_t)t * kc * TG_MR;
                _mm_storeu_ps(dt, _mm_mul_ps(w4, _mm_loadu_ps(st)));
                _mm_storel_pi((__m64 *)(dt + 4), _mm_mul_ps(w4, _mm_castpd_ps(_mm_load_sd((const double *)(st + 4)))));
            }
#else
            for (int t = 0; t < full; t++)
                for (int i = 0; i < TG_MR; i++) d[(size_t)t * kc * TG_MR + i] = w * s[t * TG_MR + i];
#endif
            for (int i = 0; i < rest; i++) d[(size_t)full * kc * TG_MR + i] = w * s[full * TG_MR + i];
            continue;
        }
        for (int t = 0; t < full; t++) memcpy(d + (size_t)t * kc * TG_MR, s + t * TG_MR, TG_MR * sizeof(float));
        if (rest) memcpy(d + (size_t)full * kc * TG_MR, s + full * TG_MR, (size_t)rest * sizeof(float));
    }
}

/* Transposed-B packing of lanes [l0, l1) of one panel, element by element: lane l takes the
 * storage row col[l] (< 0: zero), Bp[p][l] = w·row[k0 + p]. */
static void tg_pack_bt_lanes(float *d, const tg_mat *B, const int *col, int l0, int l1, int k0, int kc) {
    for (int l = l0; l < l1; l++) {
        const int c = col[l - l0];
        if (c < 0) {
            for (int p = 0; p < kc; p++) d[p * TG_NR + l] = 0.0f;
            continue;
        }
        const float *s = tg_srow(B, c) + k0, w = tg_sw(B, c);
        for (int p = 0; p < kc; p++) d[p * TG_NR + l] = w * s[p];
    }
}

#if TG_SIMD
/* In-register transpose of an 8×8 block: r[i] lane j ← r[j] lane i. */
static inline void tg_transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#endif

/* Pack np B panels: panel q's lane l takes column col[q][l] (< 0: zero), rows k [k0, k0 + kc);
 * panel q at Bp + q·kc·16 holding Bp[p][l]. Untransposed operands (storage rows are k:
 * activations, gathered or not, weights read [out, in] as [k, n]) are swept row by row, each
 * row read once for all panels; transposed ones (weights [out, in] as B(k, j) = W[j, k]) column
 * by column, each a contiguous run. */
static void tg_pack_b(float *Bp, const tg_mat *B, const float *const *krow, const float *kw, int col[][TG_NR], int np,
                      int k0, int kc) {
    if (!B->trans) {
        for (int p = 0; p < kc; p++) {
            const float *r = krow[p];
            const float w = kw[p];
            if (p + TG_PF < kc) {
                const float *f = krow[p + TG_PF];
                for (int q = 0; q < np; q++)
                    for (int h = 0; h < TG_NR; h += 8)
                        if (col[q][h] >= 0) __builtin_prefetch(f + col[q][h]);
            }
            for (int q = 0; q < np; q++) {
                float *d = Bp + (size_t)q * kc * TG_NR + p * TG_NR;
                for (int h = 0; h < TG_NR; h += 8) {
                    const int *c = col[q] + h;
                    if (!B->rw && c[0] >= 0 && c[7] == c[0] + 7) { /* a full run of 8 (columns ascend within a half) */
                        memcpy(d + h, r + c[0], 8 * sizeof(float));
                    } else {
                        for (int l = 0; l < 8; l++) d[h + l] = c[l] < 0 ? 0.0f : w * r[c[l]];
                    }
                }
            }
        }
        return;
    }
    for (int q = 0; q < np; q++) {
        float *d = Bp + (size_t)q * kc * TG_NR;
#if TG_SIMD
        for (int h = 0; h < TG_NR; h += 8) { /* 8 complete lanes: 8×8 blocks transposed in registers */
            const int *c = col[q] + h;
            int full = 1;
            for (int l = 0; l < 8; l++) full &= c[l] >= 0;
            if (!full) {
                tg_pack_bt_lanes(d, B, c, h, h + 8, k0, kc);
                continue;
            }
            const float *s[8];
            float w[8];
            for (int l = 0; l < 8; l++) {
                s[l] = tg_srow(B, c[l]) + k0;
                w[l] = tg_sw(B, c[l]);
            }
            const __m256 wv = _mm256_loadu_ps(w);
            int p = 0;
            for (; p + 8 <= kc; p += 8) {
                __m256 r[8];
                for (int l = 0; l < 8; l++) r[l] = _mm256_loadu_ps(s[l] + p);
                tg_transpose8(r);
                for (int i = 0; i < 8; i++) _mm256_store_ps(d + (p + i) * TG_NR + h, _mm256_mul_ps(wv, r[i]));
            }
            for (; p < kc; p++)
                for (int l = 0; l < 8; l++) d[p * TG_NR + h + l] = w[l] * s[l][p];
        }
#else
        tg_pack_bt_lanes(d, B, col[q], 0, TG_NR, k0, kc);
#endif
    }
}
/* Where a kernel's tile goes: row i's lanes 0..7 to lo + i·ldc and lanes 8..15 to hi + i·ldc, each
 * row first multiplied by scale[i] (scale may be NULL), added to C (add) or stored; rows ≥ mr are
 * dropped. A tile with missing columns (full = 0) goes to t[6][16] instead, for tg_put. */
typedef struct {
    float *lo, *hi;
    long ldc;
    int add, full, mr;
    const float *scale;
    float *t;
} tg_out;

#if TG_SIMD
static inline __attribute__((always_inline)) void tg_out8(const tg_out *o, int i, __m256 v0, __m256 v1) {
    if (o->scale) {
        const __m256 w = _mm256_set1_ps(o->scale[i]);
        v0 = _mm256_mul_ps(v0, w);
        v1 = _mm256_mul_ps(v1, w);
    }
    if (!o->full) {
        _mm256_store_ps(o->t + i * TG_NR, v0);
        _mm256_store_ps(o->t + i * TG_NR + 8, v1);
        return;
    }
    if (i >= o->mr) return;
    float *d0 = o->lo + i * o->ldc, *d1 = o->hi + i * o->ldc;
    if (o->add) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(d0));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(d1));
    }
    _mm256_storeu_ps(d0, v0);
    _mm256_storeu_ps(d1, v1);
}
#endif

/* The 6×16 microkernel: tile[i][l] = Σ_p A(i, p)·Bp[p][l], p ascending (one fused multiply-add
 * per term), written out as o says. A(i, p) is AP(i, p): the packed tile (Ap[p·6 + i]) or six row pointers (rows[i][p],
 * the activations read in place — no packing, the gather is the choice of pointers). */
#if TG_SIMD
/* One row of the tile at step p: broadcast A(i, p), two fused multiply-adds into row i's accumulators. */
#define TG_FMA_ROW(AP, i)                                                                                         \
    a = _mm256_broadcast_ss(AP(i, p));                                                                           \
    c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);                                                                   \
    c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);
#define TG_KERNEL_BODY(AP)                                                                                        \
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00, \
           c40 = c00, c41 = c00, c50 = c00, c51 = c00;                                                          \
    _Pragma("GCC unroll 4") for (int p = 0; p < kc; p++) {                                                      \
        const __m256 b0 = _mm256_load_ps(Bp + p * TG_NR), b1 = _mm256_load_ps(Bp + p * TG_NR + 8);              \
        __m256 a;                                                                                              \
        TG_FMA_ROW(AP, 0) TG_FMA_ROW(AP, 1) TG_FMA_ROW(AP, 2) TG_FMA_ROW(AP, 3) TG_FMA_ROW(AP, 4) TG_FMA_ROW(AP, 5) \
    }                                                                                                           \
    tg_out8(o, 0, c00, c01);                                                                                  \
    tg_out8(o, 1, c10, c11);                                                                                  \
    tg_out8(o, 2, c20, c21);                                                                                  \
    tg_out8(o, 3, c30, c31);                                                                                  \
    tg_out8(o, 4, c40, c41);                                                                                  \
    tg_out8(o, 5, c50, c51);
#else
#define TG_KERNEL_BODY(AP)                                                                                        \
    float *t = o->t;                                                                                            \
    for (int e = 0; e < TG_MR * TG_NR; e++) t[e] = 0.0f;                                                          \
    for (int p = 0; p < kc; p++)                                                                                \
        for (int i = 0; i < TG_MR; i++) {                                                                       \
            const float a = *AP(i, p);                                                                          \
            for (int l = 0; l < TG_NR; l++) t[i * TG_NR + l] = KV_MADD(a, Bp[p * TG_NR + l], t[i * TG_NR + l]); \
        }                                                                                                       \
    if (o->scale)                                                                                               \
        for (int i = 0; i < TG_MR; i++)                                                                         \
            for (int l = 0; l < TG_NR; l++) t[i * TG_NR + l] *= o->scale[i];                                     \
    if (o->full)                                                                                                \
        for (int i = 0; i < o->mr; i++)                                                                         \
            for (int l = 0; l < 8; l++) {                                                                       \
                float *d0 = o->lo + i * o->ldc + l, *d1 = o->hi + i * o->ldc + l;                               \
                *d0 = o->add ? *d0 + t[i * TG_NR + l] : t[i * TG_NR + l];                                       \
                *d1 = o->add ? *d1 + t[i * TG_NR + 8 + l] : t[i * TG_NR + 8 + l];                               \
            }
#endif

static void tg_kernel_packed(const tg_out *o, const float *restrict Ap, const float *restrict Bp, int kc) {
#define TG_AP_PACKED(i, p) (Ap + (p) * TG_MR + (i))
    TG_KERNEL_BODY(TG_AP_PACKED)
#undef TG_AP_PACKED
}

static void tg_kernel_rows(const tg_out *o, const float *const *rows, const float *restrict Bp, int kc) {
    const float *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3], *r4 = rows[4], *r5 = rows[5];
#if TG_SIMD
#define TG_AP_ROWS(i, p) (r##i + (p))
#else
#define TG_AP_ROWS(i, p) (rows[i] + (p))
    (void)r0, (void)r1, (void)r2, (void)r3, (void)r4, (void)r5;
#endif
    TG_KERNEL_BODY(TG_AP_ROWS)
#undef TG_AP_ROWS
}

/* Write a tile into C: lanes 0..7 to row i at lo + i·ldc (n_lo of them), lanes 8..15 at
 * hi + i·ldc (n_hi); add to what is there, or store. */
static inline void tg_put(const float *t, float *lo, float *hi, long ldc, int mr, int n_lo, int n_hi, int add) {
#if TG_SIMD
    if (n_lo == 8 && n_hi == 8) {
        for (int i = 0; i < mr; i++) {
            __m256 v0 = _mm256_load_ps(t + i * TG_NR), v1 = _mm256_load_ps(t + i * TG_NR + 8);
            float *o0 = lo + i * ldc, *o1 = hi + i * ldc;
            if (add) {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(o0));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(o1));
            }
            _mm256_storeu_ps(o0, v0);
            _mm256_storeu_ps(o1, v1);
        }
        return;
    }
#endif
    for (int i = 0; i < mr; i++) {
        float *o0 = lo + i * ldc, *o1 = hi + i * ldc;
        for (int l = 0; l < n_lo; l++) o0[l] = add ? o0[l] + t[i * TG_NR + l] : t[i * TG_NR + l];
        for (int l = 0; l < n_hi; l++) o1[l] = add ? o1[l] + t[i * TG_NR + 8 + l] : t[i * TG_NR + 8 + l];
    }
}

#if TG_SIMD
/* vexp_nonpos and vsigmoid (vexp.h) on 8 lanes, the same operations in the same order (so the
 * same results as the scalar forms the SwiGLU kernels vectorise). */
static inline __m256 tg_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f), shift = _mm256_set1_ps(12582912.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LE_OQ);
    x = _mm256_blendv_ps(x, lo, under);
    const __m256 y = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), shift);
    const __m256 kf = _mm256_sub_ps(y, shift);
    const __m256 r = _mm256_add_ps(_mm256_sub_ps(x, _mm256_mul_ps(kf, _mm256_set1_ps(0.693359375f))),
                                   _mm256_mul_ps(kf, _mm256_set1_ps(2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x4B400000)),
                         _mm256_set1_epi32(127)),
        23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}
static inline __m256 tg_sigmoid8(__m256 g) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 t = tg_exp8(_mm256_or_ps(g, _mm256_set1_ps(-0.0f))); /* e^{−|g|} */
    const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, t));
    return _mm256_blendv_ps(_mm256_mul_ps(t, inv), inv, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ));
}
#endif

/* SwiGLU forward of rows i0.. i0 + mr, activations c .. c + nv: act[i, c + l] =
 * silu(C[i, c + l])·C[i, half + c + l]. Same formula and rounding as swiglu_forward. */
static void tg_epi_swiglu(const tg_epi *e, const float *C, long ldc, int i0, int mr, int c, int nv) {
    for (int i = 0; i < mr; i++) {
        const float *g = C + (long)(i0 + i) * ldc + c, *u = g + e->half;
        float *o = e->act + (long)(i0 + i) * e->ld_act + c;
        int l = 0;
#if TG_SIMD
        for (; l + 8 <= nv; l += 8) {
            const __m256 gv = _mm256_loadu_ps(g + l);
            _mm256_storeu_ps(o + l, _mm256_mul_ps(_mm256_mul_ps(gv, tg_sigmoid8(gv)), _mm256_loadu_ps(u + l)));
        }
#endif
        for (; l < nv; l++) o[l] = g[l] * vsigmoid(g[l]) * u[l];
    }
}

/* SwiGLU backward of dact (C) on rows i0 .. i0 + mr, columns c .. c + nv: the dgate/dup columns
 * (same formula and rounding as swiglu_backward). */
static void tg_epi_dswiglu(const tg_epi *e, const float *C, long ldc, int i0, int mr, int c, int nv) {
    for (int i = 0; i < mr; i++) {
        const float *d = C + (long)(i0 + i) * ldc + c;
        const float *g = e->gu + (long)(i0 + i) * e->ld_gu + c, *u = g + e->half;
        float *dg = e->dgu + (long)(i0 + i) * e->ld_gu + c, *du = dg + e->half;
        int l = 0;
#if TG_SIMD
        const __m256 one = _mm256_set1_ps(1.0f);
        for (; l + 8 <= nv; l += 8) {
            const __m256 gv = _mm256_loadu_ps(g + l), uv = _mm256_loadu_ps(u + l), dv = _mm256_loadu_ps(d + l);
            const __m256 sig = tg_sigmoid8(gv);
            const __m256 f = _mm256_mul_ps(sig, _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, sig))));
            _mm256_storeu_ps(dg + l, _mm256_mul_ps(_mm256_mul_ps(dv, uv), f));
            _mm256_storeu_ps(du + l, _mm256_mul_ps(dv, _mm256_mul_ps(gv, sig)));
        }
#endif
        for (; l < nv; l++) {
            const float sig = vsigmoid(g[l]);
            const float gi = g[l], ui = u[l], di = d[l];
            dg[l] = di * ui * (sig * (1.0f + gi * (1.0f - sig)));
            du[l] = di * (gi * sig);
        }
    }
}

void gemm_tiled(float *C, long ldc, int accumulate, const tg_mat *A, const tg_mat *B, int m, int n, int k,
                const tg_epi *epi) {
    MOERL_ASSERT(m >= 0 && n >= 0 && k >= 0);
    if (m == 0 || n == 0) return;
    const int kind = epi ? epi->kind : TG_EPI_NONE;
    const int swg = kind == TG_EPI_SWIGLU;
    const int unit = swg ? 8 : 16; /* logical columns per panel */
    float t[TG_MR * TG_NR] __attribute__((aligned(32)));
    float *Bp = tg_bp, *Ap = tg_ap;
    const int nkb = MOERL_MAX(1, (k + TG_KC - 1) / TG_KC), kb = (k + nkb - 1) / nkb; /* equal k-blocks */
    int k0 = 0;
    do {
        const int kc = MOERL_MIN(kb, k - k0);
        const int add = k0 > 0 || accumulate, last = k0 + kc >= k;
        /* the storage rows along k of the operands stored k-major (B untransposed, A transposed),
         * looked up once per k-block */
        const float *brow[TG_KC], *akrow[TG_KC];
        float bw[TG_KC], akw[TG_KC];
        for (int p = 0; p < kc; p++) {
            if (!B->trans) {
                brow[p] = tg_srow(B, k0 + p);
                bw[p] = tg_sw(B, k0 + p);
            }
            if (A->trans) {
                akrow[p] = tg_srow(A, k0 + p);
                akw[p] = tg_sw(A, k0 + p);
            }
        }
        for (int j0 = 0; j0 < n; j0 += TG_NP * unit) {
            const int nc = MOERL_MIN(TG_NP * unit, n - j0), np = (nc + unit - 1) / unit;
            int col[TG_NP][TG_NR];
            for (int q = 0; q < np; q++) {
                const int c = j0 + q * unit, nv = MOERL_MIN(unit, n - c);
                for (int l = 0; l < TG_NR; l++) {
                    if (swg) col[q][l] = l < 8 ? (l < nv ? c + l : -1) : (l - 8 < nv ? epi->half + c + l - 8 : -1);
                    else col[q][l] = l < nv ? c + l : -1;
                }
            }
            tg_pack_b(Bp, B, brow, bw, col, np, k0, kc);
            const int inplace = !A->trans; /* rows read in place (the gather is the choice of rows) */
            for (int ic = 0; ic < m; ic += TG_MC) {
                const int mc = MOERL_MIN(TG_MC, m - ic);
                /* the chunk's row pointers and factors, looked up once (the gather's index, its
                 * modulo and the routing weight) */
                const float *arow[TG_MC + TG_MR];
                float aw[TG_MC + TG_MR];
                if (inplace) {
                    for (int i = 0; i < mc; i++) {
                        arow[i] = tg_srow(A, ic + i) + k0;
                        aw[i] = tg_sw(A, ic + i);
                    }
                    for (int i = mc; i < mc + TG_MR; i++) { /* missing rows repeat the first (results dropped) */
                        arow[i] = arow[0];
                        aw[i] = 0.0f;
                    }
                } else {
                    tg_pack_a(Ap, A, akrow, akw, ic, mc, kc);
                }
                /* the B panel stays in L1 while the chunk's row tiles pass under it */
                for (int q = 0; q < np; q++) {
                    const int c = j0 + q * unit, nv = MOERL_MIN(unit, n - c);
                    const float *bq = Bp + (size_t)q * kc * TG_NR;
                    for (int i0 = ic; i0 < ic + mc; i0 += TG_MR) {
                        const int mr = MOERL_MIN(TG_MR, ic + mc - i0);
                        float *row = C + (long)i0 * ldc;
                        for (int i = 0; i < mr; i++) { /* the lines the tile's output touches after the kernel */
                            __builtin_prefetch(row + i * ldc + c, 1);
                            __builtin_prefetch(row + i * ldc + (swg ? epi->half + c : c + 8), 1);
                        }
                        const int lo_n = swg ? nv : MOERL_MIN(8, nv), hi_n = swg ? nv : MOERL_MAX(0, nv - 8);

                        tg_out o = {.lo = row + c, .hi = row + (swg ? epi->half + c : c + 8), .ldc = ldc, .add = add,
                                    .full = lo_n == 8 && hi_n == 8, .mr = mr, .t = t};
                        if (inplace) {
                            if (q == 0 && i0 + TG_MR < ic + mc) /* the next tile's rows (first pass: from L3 or memory) */
                                for (int i = i0 + TG_MR; i < MOERL_MIN(i0 + 2 * TG_MR, ic + mc); i++)
                                    for (int p = 0; p < kc; p += 16) __builtin_prefetch(arow[i - ic] + p);
                            if (A->rw) o.scale = aw + (i0 - ic); /* the rows' factors, applied to their sums */
                            tg_kernel_rows(&o, arow + (i0 - ic), bq, kc);
                        } else {
                            tg_kernel_packed(&o, Ap + (size_t)((i0 - ic) / TG_MR) * kc * TG_MR, bq, kc);
                        }
                        if (!o.full) tg_put(t, o.lo, o.hi, ldc, mr, lo_n, hi_n, add);
                    }
                }
                /* the epilogue over the chunk's rows and the block's columns once their sums are
                 * complete: row by row (C still in L2, the other operands read sequentially) */
                if (last && swg) tg_epi_swiglu(epi, C, ldc, ic, mc, j0, nc);
                else if (last && kind == TG_EPI_DSWIGLU) tg_epi_dswiglu(epi, C, ldc, ic, mc, j0, nc);
            }
        }
        k0 += kc;
    } while (k0 < k);
}
