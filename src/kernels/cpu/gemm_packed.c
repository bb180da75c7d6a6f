/* The "NZ" switch: weights pre-packed at load into the panel layout of a skinny (decode-sized)
 * product, and the kernel that reads them.
 *
 * Layout: W[O, I] (PyTorch [out, in]) → P[⌈O/16⌉][I][16], P[b][i][l] = W[16b + l, i], zero past
 * O. A panel holds 16 consecutive outputs; the kernel walks it once, i ascending, and for each i
 * multiplies the 16 weights by the broadcast input of every row: out[r, 16b + l] accumulates in
 * lane l of a vector register, so there is no horizontal sum and the weights are one contiguous
 * stream. OpenBLAS has no public packed-B sgemm (0.3.21's cblas.h declares none; MKL's
 * cblas_sgemm_pack is not available), so the packing is moerl's own and serves the skinny
 * kernel only; larger row counts use cblas_sgemm on the unpacked weights (which packs them
 * itself, per call). The analogue of Ascend's NZ (fractal) weight format, converted once at
 * weight load instead of per call.
 */
#include "base/common.h"
#include "kernels/kernels.h"

#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__SSE__)
#include <immintrin.h>
#endif

#define NZ_W 16 /* outputs per panel */

typedef float v8f __attribute__((vector_size(32)));

size_t gemm_packed_size(int O, int I) { return (size_t)((O + NZ_W - 1) / NZ_W) * NZ_W * (size_t)I; }

void gemm_packed_pack(float *P, const float *W, int O, int I) {
    MOERL_ASSERT(O >= 0 && I >= 0);
    const int nb = (O + NZ_W - 1) / NZ_W;
    for (int b = 0; b < nb; b++) {
        float *pb = P + (size_t)b * I * NZ_W;
        const int lanes = MOERL_MIN(NZ_W, O - b * NZ_W);
        for (int i = 0; i < I; i++) {
            float *d = pb + (size_t)i * NZ_W;
            for (int l = 0; l < lanes; l++) d[l] = W[(size_t)(b * NZ_W + l) * I + i];
            for (int l = lanes; l < NZ_W; l++) d[l] = 0.0f;
        }
    }
}

static inline v8f v8_load(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Up to 4 rows against one panel: acc[r] lanes 0..15 = Σ_i rows[r][i]·pb[i][0..15]. */
static inline void panel_rows(float out[4][NZ_W], const float *const *rows, int nr, const float *pb, int I) {
    v8f a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, c0 = {0}, c1 = {0}, d0 = {0}, d1 = {0};
    const float *x0 = rows[0], *x1 = nr > 1 ? rows[1] : rows[0], *x2 = nr > 2 ? rows[2] : rows[0],
                *x3 = nr > 3 ? rows[3] : rows[0];
    for (int i = 0; i < I; i++) {
        const v8f w0 = v8_load(pb + (size_t)i * NZ_W), w1 = v8_load(pb + (size_t)i * NZ_W + 8);
        a0 += x0[i] * w0;
        a1 += x0[i] * w1;
        if (nr > 1) { b0 += x1[i] * w0; b1 += x1[i] * w1; }
        if (nr > 2) { c0 += x2[i] * w0; c1 += x2[i] * w1; }
        if (nr > 3) { d0 += x3[i] * w0; d1 += x3[i] * w1; }
    }
    memcpy(out[0], &a0, sizeof a0); memcpy(out[0] + 8, &a1, sizeof a1);
    memcpy(out[1], &b0, sizeof b0); memcpy(out[1] + 8, &b1, sizeof b1);
    memcpy(out[2], &c0, sizeof c0); memcpy(out[2] + 8, &c1, sizeof c1);
    memcpy(out[3], &d0, sizeof d0); memcpy(out[3] + 8, &d1, sizeof d1);
}

/* out[r, o - o0] for o in [o0, o1): see kernels.h. The row-count branches inside the i loop are
 * loop-invariant (the compiler unswitches them); each lane's sum runs i ascending in one
 * accumulator whatever the number of rows, so results do not depend on the batch. */
void gemm_packed_nt_rows(float *out, int ldo, const float *const *rows, const float *P, int m, int I, int o0,
                         int o1) {
    MOERL_ASSERT(m >= 0 && I >= 0 && o0 >= 0 && o0 % NZ_W == 0 && o1 >= o0);
    float acc[4][NZ_W];
    for (int o = o0; o < o1; o += NZ_W) {
        const float *pb = P + (size_t)(o / NZ_W) * I * NZ_W;
        const int lanes = MOERL_MIN(NZ_W, o1 - o);
        for (int r0 = 0; r0 < m; r0 += 4) {
            const int nr = MOERL_MIN(4, m - r0);
            switch (nr) { /* one instantiation per row count keeps the accumulators in registers */
            case 1: panel_rows(acc, rows + r0, 1, pb, I); break;
            case 2: panel_rows(acc, rows + r0, 2, pb, I); break;
            case 3: panel_rows(acc, rows + r0, 3, pb, I); break;
            default: panel_rows(acc, rows + r0, 4, pb, I); break;
            }
            for (int r = 0; r < nr; r++) memcpy(out + (size_t)(r0 + r) * ldo + (o - o0), acc[r], (size_t)lanes * sizeof(float));
        }
    }
}

/* ------------------------------------------------------------------ bf16 panels
 * The same panel layout with bf16 elements (half the bytes per weight): the rollout engine's
 * bf16 weights (rollout.dtype bf16). Each weight is widened to fp32 exactly (bf16 → fp32 is the
 * 16 bits shifted up) inside the kernel, and the arithmetic is then the fp32 kernel's: an output
 * equals the fp32 kernel's on the bf16-rounded weights (each lane sums i ascending in one
 * accumulator, a multiply then an add, whatever the row count or the panels in flight).
 *
 * Within a panel's 16 weights of one input i the lanes are interleaved: stored element 2j holds
 * output lane j and element 2j + 1 lane 8 + j (j < 8). Read as eight 32-bit words, the low halves
 * shifted up 16 bits are lanes 0..7 as fp32 and the high halves with the low bits masked off are
 * lanes 8..15: two single-cycle integer operations per 16 weights and no cross-lane shuffle (a
 * zero-extension vpmovzxwd of each half needs a lane extract plus two shuffles, all on the one
 * shuffle port of many x86 cores). */

/* Stored position of output lane l (0..15) in a panel row. */
static inline int bf16_slot(int l) { return l < 8 ? 2 * l : 2 * (l - 8) + 1; }

static inline uint16_t bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

void gemm_packed16_pack(uint16_t *P, const float *W, int O, int I) {
    MOERL_ASSERT(O >= 0 && I >= 0);
    const int nb = (O + NZ_W - 1) / NZ_W;
    for (int b = 0; b < nb; b++) {
        uint16_t *pb = P + (size_t)b * I * NZ_W;
        const int lanes = MOERL_MIN(NZ_W, O - b * NZ_W);
        for (int i = 0; i < I; i++) {
            uint16_t *d = pb + (size_t)i * NZ_W;
            for (int l = 0; l < lanes; l++) d[bf16_slot(l)] = bf16_round(W[(size_t)(b * NZ_W + l) * I + i]);
            for (int l = lanes; l < NZ_W; l++) d[bf16_slot(l)] = 0;
        }
    }
}

void gemm_packed16_pack_bf16(uint16_t *P, const uint16_t *W, int O, int I) {
    MOERL_ASSERT(O >= 0 && I >= 0);
    const int nb = (O + NZ_W - 1) / NZ_W;
    for (int b = 0; b < nb; b++) {
        uint16_t *pb = P + (size_t)b * I * NZ_W;
        const int lanes = MOERL_MIN(NZ_W, O - b * NZ_W);
        for (int i = 0; i < I; i++) {
            uint16_t *d = pb + (size_t)i * NZ_W;
            for (int l = 0; l < lanes; l++) d[bf16_slot(l)] = W[(size_t)(b * NZ_W + l) * I + i];
            for (int l = lanes; l < NZ_W; l++) d[bf16_slot(l)] = 0;
        }
    }
}

uint16_t gemm_packed16_get(const uint16_t *P, int I, int o, int i) {
    return P[((size_t)(o / NZ_W) * I + i) * NZ_W + bf16_slot(o % NZ_W)];
}

/* 16 bf16 weights of one panel row → lanes 0..7 and 8..15 as fp32 (exact). */
static inline void bf16x16_load(const uint16_t *p, v8f *lo, v8f *hi) {
#ifdef __AVX2__
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    const __m256 b = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
    memcpy(lo, &a, sizeof *lo);
    memcpy(hi, &b, sizeof *hi);
#else
    float f[16];
    for (int l = 0; l < 16; l++) {
        const uint32_t u = (uint32_t)p[bf16_slot(l)] << 16;
        memcpy(&f[l], &u, 4);
    }
    memcpy(lo, f, sizeof *lo);
    memcpy(hi, f + 8, sizeof *hi);
#endif
}

/* Software prefetch of the panels a pass streams. A pass reads NP panels side by side, NP
 * streams of I · 32 bytes each (8–16 KB for an expert of model B): short streams that the
 * hardware prefetchers pick up late and, on 4 KB pages, drop at every page boundary, so a
 * decode step that reads each weight once waited on memory at the start of every stream.
 * Every second i (one 64-byte line of a panel holds two i) each stream prefetches the line
 * P16_PREFETCH i ahead; near the end of its panel it prefetches the same offset of panel k + NP
 * instead — the panel it reads in the next pass (the panels of a call are contiguous, pass after
 * pass), so the next pass starts warm. Past the last panel the prefetches fall outside the
 * matrix: a prefetch never faults, it only costs the read. Measured (bench/bench_decode_cpu,
 * docs/benchmarks.md): 64 i (2 KB per stream) beat 16, 32, 128 and 256. Only the timing changes:
 * the loads and the arithmetic are the same. */
#define P16_PREFETCH 64
static inline __attribute__((always_inline)) void p16_prefetch(const uint16_t *const *pb, const int NP, int i, int I) {
#ifdef __SSE__
    const int j = i + P16_PREFETCH;
    const size_t ahead = (size_t)j * NZ_W + (j >= I ? (size_t)(NP - 1) * I * NZ_W : 0);
    for (int k = 0; k < NP; k++) _mm_prefetch((const char *)(pb[k] + ahead), _MM_HINT_T0);
#else
    (void)pb; (void)NP; (void)i; (void)I;
#endif
}

#ifdef __AVX512F__
/* AVX-512: one panel row of 16 bf16 weights → one zmm of 16 fp32 lanes in output order, with no
 * shuffle: the 32 bytes are broadcast into both 256-bit halves (part of the load), the upper half
 * keeps the high 16 bits of each word (lanes 8..15), the lower half shifts the low 16 bits up
 * (lanes 0..7; a masked shift over the masked copy). */
static inline __m512 bf16x16_zmm(const uint16_t *p) {
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    const __m512i hi = _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u));
    return _mm512_castsi512_ps(_mm512_mask_slli_epi32(hi, (__mmask16)0x00ff, v, 16));
}

/* NR rows (1..8) against NP consecutive panels (1, 2, 4 or 8; NP·NR ≤ 16) at once, pb[k] =
 * panel k: out[k][r][0..15] = Σ_i rows[r][i]·panel_k[i][0..15], one zmm accumulator per (panel,
 * row), a multiply then an add (no FMA: the same rounding as the fp32 panel kernel). NP and NR
 * are compile-time constants at every call (always inlined): the accumulators live in registers. */
static inline __attribute__((always_inline)) void panels16_rows(float out[8][8][NZ_W], const float *const *rows,
                                                                const int NR, const uint16_t *const *pb,
                                                                const int NP, int I) {
    __m512 acc[8][8];
    for (int k = 0; k < NP; k++)
        for (int r = 0; r < NR; r++) acc[k][r] = _mm512_setzero_ps();
    for (int i = 0; i < I; i++) {
        __m512 w[8];
        if (!(i & 1)) p16_prefetch(pb, NP, i, I);
        for (int k = 0; k < NP; k++) w[k] = bf16x16_zmm(pb[k] + (size_t)i * NZ_W);
        for (int r = 0; r < NR; r++) {
            const __m512 x = _mm512_set1_ps(rows[r][i]);
            for (int k = 0; k < NP; k++) acc[k][r] = _mm512_add_ps(acc[k][r], _mm512_mul_ps(x, w[k]));
        }
    }
    for (int k = 0; k < NP; k++)
        for (int r = 0; r < NR; r++) _mm512_storeu_ps(out[k][r], acc[k][r]);
}
#define P16_MAX_ROWS 8   /* rows per pass */
#define P16_MAX_PANELS 8 /* panels per pass */
/* Panels per pass for nr rows: 8 for one row, 4 for 2..4, 2 for 5..8 (8 to 16 accumulators of
 * the 32 zmm registers; several panels in flight give one row independent add chains). */
static inline int p16_want(int nr) { return nr == 1 ? 8 : nr <= 4 ? 4 : 2; }
#define P16_CASE(NR, NP) case (NP) * 16 + (NR): panels16_rows(acc, rr, NR, pb, NP, I); break
static void panels16_dispatch(float acc[8][8][NZ_W], const float *const *rr, int nr, const uint16_t *const *pb, int np,
                              int I) {
    switch (np * 16 + nr) { /* one instantiation per shape */
    P16_CASE(1, 1); P16_CASE(2, 1); P16_CASE(3, 1); P16_CASE(4, 1);
    P16_CASE(5, 1); P16_CASE(6, 1); P16_CASE(7, 1); P16_CASE(8, 1);
    P16_CASE(1, 2); P16_CASE(2, 2); P16_CASE(3, 2); P16_CASE(4, 2);
    P16_CASE(5, 2); P16_CASE(6, 2); P16_CASE(7, 2); P16_CASE(8, 2);
    P16_CASE(1, 4); P16_CASE(2, 4); P16_CASE(3, 4); P16_CASE(4, 4);
    P16_CASE(1, 8);
    default: MOERL_ASSERT(0 && "panels16: unexpected shape");
    }
}
#else
/* NR rows (1..4) against NP consecutive panels (1, 2 or 4; NP·NR ≤ 4) at once, pb[k] = panel k:
 * out[k][r][0..15] = Σ_i rows[r][i]·panel_k[i][0..15]. Several panels in flight give one row
 * 2·NP independent accumulators instead of 2 (a single row's two dependency chains of adds
 * otherwise bound the loop at one 16-weight row per add latency, below what the caches deliver
 * at half the bytes). NP and NR are compile-time constants at every call (always inlined), so
 * the accumulator array lives in registers. */
static inline __attribute__((always_inline)) void panels16_rows(float out[8][8][NZ_W], const float *const *rows,
                                                                const int NR, const uint16_t *const *pb,
                                                                const int NP, int I) {
    v8f acc[4][4][2];
    for (int k = 0; k < NP; k++)
        for (int r = 0; r < NR; r++) acc[k][r][0] = acc[k][r][1] = (v8f){0};
    for (int i = 0; i < I; i++) {
        v8f w[4][2];
        if (!(i & 1)) p16_prefetch(pb, NP, i, I);
        for (int k = 0; k < NP; k++) bf16x16_load(pb[k] + (size_t)i * NZ_W, &w[k][0], &w[k][1]);
        for (int r = 0; r < NR; r++) {
            const float x = rows[r][i];
            for (int k = 0; k < NP; k++) {
                acc[k][r][0] += x * w[k][0];
                acc[k][r][1] += x * w[k][1];
            }
        }
    }
    for (int k = 0; k < NP; k++)
        for (int r = 0; r < NR; r++) {
            memcpy(out[k][r], &acc[k][r][0], sizeof acc[k][r][0]);
            memcpy(out[k][r] + 8, &acc[k][r][1], sizeof acc[k][r][1]);
        }
}
#define P16_MAX_ROWS 4
#define P16_MAX_PANELS 4
/* panels per pass: 4 for one row, 2 for two, else 1 (≤ 8 accumulators, no spills) */
static inline int p16_want(int nr) { return nr == 1 ? 4 : nr == 2 ? 2 : 1; }
static void panels16_dispatch(float acc[8][8][NZ_W], const float *const *rr, int nr, const uint16_t *const *pb, int np,
                              int I) {
    switch (np * 8 + nr) { /* one instantiation per shape keeps the accumulators in registers */
    case 8 + 1: panels16_rows(acc, rr, 1, pb, 1, I); break;
    case 8 + 2: panels16_rows(acc, rr, 2, pb, 1, I); break;
    case 8 + 3: panels16_rows(acc, rr, 3, pb, 1, I); break;
    case 8 + 4: panels16_rows(acc, rr, 4, pb, 1, I); break;
    case 16 + 1: panels16_rows(acc, rr, 1, pb, 2, I); break;
    case 16 + 2: panels16_rows(acc, rr, 2, pb, 2, I); break;
    default: panels16_rows(acc, rr, 1, pb, 4, I); break; /* 32 + 1 */
    }
}
#endif

/* Panel groups of P16_GROUP panels are the outer loop and row blocks the inner one, so a group's
 * weights (P16_GROUP · I · 32 bytes: 256 KB at I = 1,024) come from memory once per call and
 * from the cache for every further row block. */
#define P16_GROUP 8

void gemm_packed16_nt_rows(float *out, int ldo, const float *const *rows, const uint16_t *P, int m, int I, int o0,
                           int o1) {
    MOERL_ASSERT(m >= 0 && I >= 0 && o0 >= 0 && o0 % NZ_W == 0 && o1 >= o0);
    float acc[8][8][NZ_W] __attribute__((aligned(64)));
    const size_t pstride = (size_t)I * NZ_W;
    for (int g0 = o0; g0 < o1; g0 += P16_GROUP * NZ_W) {
        const int g1 = MOERL_MIN(o1, g0 + P16_GROUP * NZ_W);
        for (int r0 = 0; r0 < m; r0 += P16_MAX_ROWS) {
            const int nr = MOERL_MIN(P16_MAX_ROWS, m - r0), want = p16_want(nr);
            for (int o = g0; o < g1;) {
                const int left = (g1 - o + NZ_W - 1) / NZ_W;
                int np = 1;
                while (np * 2 <= want && np * 2 <= left) np *= 2;
                const uint16_t *pb[P16_MAX_PANELS];
                for (int k = 0; k < np; k++) pb[k] = P + (size_t)(o / NZ_W + k) * pstride;
                panels16_dispatch(acc, rows + r0, nr, pb, np, I);
                for (int k = 0; k < np; k++) {
                    const int ok = o + k * NZ_W, lanes = MOERL_MIN(NZ_W, o1 - ok);
                    for (int r = 0; r < nr; r++)
                        memcpy(out + (size_t)(r0 + r) * ldo + (ok - o0), acc[k][r], (size_t)lanes * sizeof(float));
                }
                o += np * NZ_W;
            }
        }
    }
}

void gemm_packed16_nt(float *out, int ldo, const float *a, const uint16_t *P, int m, int I, int o0, int o1) {
    enum { CH = 64 };
    const float *rows[CH];
    for (int r0 = 0; r0 < m; r0 += CH) {
        const int n = MOERL_MIN(CH, m - r0);
        for (int r = 0; r < n; r++) rows[r] = a + (size_t)(r0 + r) * I;
        gemm_packed16_nt_rows(out + (size_t)r0 * ldo, ldo, rows, P, n, I, o0, o1);
    }
}
