/* A vectorisable e^x for x ≤ 0, shared by the kernels (attention over the KV cache, SwiGLU).
 * Header-only: static inline so loops over it vectorise under `#pragma omp simd`. */
#ifndef MOERL_VEXP_H
#define MOERL_VEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __FMA__
#define KV_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define KV_MADD(a, b, c) ((a) * (b) + (c))
#endif

/* e^x for x ≤ 0 (and −inf → 0), written so that loops over it vectorise. Range reduction
 * x = k·ln2 + r with k = round(x/ln2), |r| ≤ ln2/2; ln2 = C1 + C2 with C1 = 0.693359375 (few
 * mantissa bits, so k·C1 is exact for |k| < 2^15); e^r by its degree-7 Taylor polynomial in
 * Horner form (truncation |r|^8/8! < 6e-9 relative). k is rounded by adding 1.5·2^23, after
 * which the float's low mantissa bits hold k; 2^k is assembled in the exponent field with
 * unsigned bit arithmetic (no float→int conversion, so NaN propagates without undefined
 * behaviour). Measured against double exp at every float in (−87.3, 0]: within 1 ulp. For
 * x ≤ −87.3 (results near 2^−126, the smallest normal float) it returns 0.
 * Source: the Cody–Waite reduction (Cody & Waite 1980) used by vector math libraries. */
/* Bitwise select: a where mask is all ones, b where it is zero (mask from vmask). Written with
 * integer operations because GCC 12 does not if-convert a float `c ? a : b` feeding further
 * arithmetic under -ftrapping-math (the default), which left these loops scalar on AVX2-only
 * CPUs (AVX-512 builds vectorised them through masked instructions). */
static inline float vsel(uint32_t mask, float a, float b) {
    uint32_t ua, ub;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    const uint32_t r = (ua & mask) | (ub & ~mask);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}
/* All ones when c is true, else zero. */
static inline uint32_t vmask(int c) { return -(uint32_t)(c != 0); }

static inline float vexp_nonpos(float x) {
    const uint32_t under = vmask(x <= -87.3f); /* also true for −inf; false for NaN */
    x = vsel(under, -87.3f, x);
    const float y = x * 1.44269504f + 12582912.0f;
    const float kf = y - 12582912.0f;
    const float r = (x - kf * 0.693359375f) + kf * 2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = KV_MADD(p, r, 1.0f / 720.0f);
    p = KV_MADD(p, r, 1.0f / 120.0f);
    p = KV_MADD(p, r, 1.0f / 24.0f);
    p = KV_MADD(p, r, 1.0f / 6.0f);
    p = KV_MADD(p, r, 0.5f);
    p = KV_MADD(p, r, 1.0f);
    p = KV_MADD(p, r, 1.0f);
    uint32_t yi;
    memcpy(&yi, &y, sizeof yi);
    const uint32_t bits = (yi - 0x4B400000u + 127u) << 23; /* (k + 127) in the exponent field */
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return vsel(under, 0.0f, p * two_k);
}

/* Logistic sigmoid σ(g) = 1/(1 + e^{−g}) through vexp_nonpos(−|g|): t = e^{−|g|} ∈ (0, 1],
 * σ = 1/(1+t) for g ≥ 0 and t/(1+t) for g < 0 (no overflow for any g; NaN stays NaN). */
static inline float vsigmoid(float g) {
    const float t = vexp_nonpos(-fabsf(g));
    const float inv = 1.0f / (1.0f + t);
    return vsel(vmask(g >= 0.0f), inv, t * inv);
}

#endif
