/* Gradient compression codecs with error feedback (see dist/compress.h). */
#include "dist/compress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

int grad_compression_parse(const char *name, grad_compression *out) {
    if (name && !strcmp(name, "none")) *out = GRAD_COMPRESSION_NONE;
    else if (name && !strcmp(name, "onebit")) *out = GRAD_COMPRESSION_ONEBIT;
    else if (name && !strcmp(name, "threshold")) *out = GRAD_COMPRESSION_THRESHOLD;
    else return moerl_errorf("actor.grad_compression: '%s' is not one of none, onebit, threshold", name ? name : "");
    return MOERL_OK;
}

const char *grad_compression_name(grad_compression c) {
    return c == GRAD_COMPRESSION_ONEBIT ? "onebit" : c == GRAD_COMPRESSION_THRESHOLD ? "threshold" : "none";
}

size_t compress_max_bytes(grad_compression c, size_t n, int chunk) {
    if (c == GRAD_COMPRESSION_THRESHOLD) return 16 + n * 4; /* the raw form (header + n floats) ≥ any coded form */
    if (c == GRAD_COMPRESSION_ONEBIT) return 8 + ((n + (size_t)chunk - 1) / (size_t)chunk) * 4 + (n + 7) / 8;
    return n * 4;
}

/* τ by a two-pass radix select on the bit patterns of |x| (for non-negative floats the patterns
 * order as the values): a histogram of the upper 16 bits finds the bin of the wanted rank, a second
 * of the lower 16 bits within that bin finds the element. Exact, no copy of x, two streaming passes. */
float compress_threshold_tau(const float *x, size_t n) {
    size_t *h = xcalloc(65536, sizeof(size_t)), k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        b &= 0x7fffffffu;
        if (b) h[b >> 16]++, k++;
    }
    if (k == 0) {
        free(h);
        return 0.0f;
    }
    size_t want = (k - 1) / 2, hi = 0; /* the lower median's rank among the nonzero |x| */
    while (want >= h[hi]) want -= h[hi++];
    memset(h, 0, 65536 * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        b &= 0x7fffffffu;
        if (b && b >> 16 == hi) h[b & 0xffff]++;
    }
    size_t lo = 0;
    while (want >= h[lo]) want -= h[lo++];
    free(h);
    const uint32_t bits = (uint32_t)(hi << 16 | lo);
    float med;
    memcpy(&med, &bits, 4);
    return 2.0f * med;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- threshold: sign + exponent values, bitmap or Rice-coded indices (layout in compress.h) ---- */

enum { THR_HDR = 16, THR_BITMAP = 0, THR_RICE = 1, THR_RAW = 2, THR_EMIN = -149, THR_EMAX = 127 };

/* The exponent e of the power of two nearest to a (> 0, finite) in log space: a = m·2^f with
 * m ∈ [1, 2); e = f + 1 iff m > √2 (never a tie: √2 is irrational), capped at 127 (2^128 is not a
 * float). Denormal a get their true exponent (down to −149). Then a/2^e ∈ (1/√2, √2], or [1, 2)
 * at the cap, so a − 2^e is exact (Sterbenz). */
int compress_exp_nearest(float a) {
    uint32_t b;
    memcpy(&b, &a, 4);
    const uint32_t field = (b >> 23) & 0xff, mant = b & 0x7fffff;
    if (field == 0) { /* denormal: a = mant·2^−149 */
        const int hi = 31 - __builtin_clz(mant); /* mant ≥ 1 */
        const uint32_t m = mant << (23 - hi) & 0x7fffff; /* its significand's fraction, normalised */
        return THR_EMIN + hi + (m > 0x3504F3u);
    }
    const int e = (int)field - 127 + (mant > 0x3504F3u); /* 0x3504F3: the fraction of the float below √2 */
    return e > THR_EMAX ? THR_EMAX : e;
}

/* 2^e for e in [−149, 127], exactly. */
static float pow2f(int e) {
    uint32_t b = e >= -126 ? (uint32_t)(e + 127) << 23 : 1u << (e - THR_EMIN);
    float v;
    memcpy(&v, &b, 4);
    return v;
}

typedef struct { unsigned char *p; uint64_t acc; int nacc; } bitw;

/* A writer that ORs bits, least significant first, into zeroed memory from bit `pos` of base. */
static bitw bitw_at(unsigned char *base, size_t pos) { return (bitw){base + (pos >> 3), 0, (int)(pos & 7)}; }
static void bitw_put(bitw *w, uint32_t v, int nb) {
    w->acc |= (uint64_t)v << w->nacc;
    w->nacc += nb;
    while (w->nacc >= 8) {
        *w->p++ |= (unsigned char)w->acc;
        w->acc >>= 8;
        w->nacc -= 8;
    }
}
static void bitw_flush(bitw *w) {
    if (w->nacc > 0) *w->p |= (unsigned char)w->acc;
}

/* Bits of the Rice codes with parameters r0 .. r0 + 2 for the gaps between kept indices (gap =
 * index − previous − 1, the first index is its own gap): q = gap >> r one-bits, a zero, then the r
 * low bits. One pass for the three. */
static void rice_bits3(const float *x, size_t n, float tau, int r0, uint64_t out[3]) {
    uint64_t q0 = 0, q1 = 0, q2 = 0, k = 0;
    size_t prev = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > tau) {
            const size_t gap = i - prev;
            q0 += gap >> r0, q1 += gap >> (r0 + 1), q2 += gap >> (r0 + 2);
            k++;
            prev = i + 1;
        }
    out[0] = q0 + k * (uint64_t)(1 + r0);
    out[1] = q1 + k * (uint64_t)(2 + r0);
    out[2] = q2 + k * (uint64_t)(3 + r0);
}

typedef struct {
    uint32_t k;        /* kept elements */
    int mode, r, ebits, e0;
    uint64_t vbits, ibits; /* value stream, index stream */
} thr_plan;

/* Pass over x: what is kept, the exponent span, and the cheaper index code (bitmap or the best Rice
 * parameter near log2 of the mean gap, each sized exactly). */
static thr_plan thr_plan_of(const float *x, size_t n, float tau) {
    thr_plan pl = {0};
    int emin = THR_EMAX, emax = THR_EMIN;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > tau) {
            const int e = compress_exp_nearest(fabsf(x[i]));
            emin = MOERL_MIN(emin, e);
            emax = MOERL_MAX(emax, e);
            pl.k++;
        }
    pl.e0 = pl.k ? emin : 0;
    while (pl.k && (emax - emin) >> pl.ebits) pl.ebits++;
    pl.vbits = (uint64_t)pl.k * (uint64_t)(1 + pl.ebits);
    pl.mode = THR_BITMAP;
    pl.ibits = n;
    if (pl.k == 0) return pl;
    int r0 = 0;
    while (r0 < 30 && ((uint64_t)1 << (r0 + 1)) <= (n - pl.k) / pl.k) r0++; /* ≈ log2 of the mean gap */
    const int rlo = MOERL_MAX(0, r0 - 1);
    uint64_t b[3];
    rice_bits3(x, n, tau, rlo, b);
    for (int j = 0; j < 3 && rlo + j <= r0 + 1; j++)
        if (b[j] < pl.ibits) pl.ibits = b[j], pl.mode = THR_RICE, pl.r = rlo + j;
    return pl;
}

static void thr_header(unsigned char *o, uint32_t n, uint32_t k, int mode, int r, int ebits, int e0) {
    memset(o, 0, THR_HDR);
    put_u32(o, n);
    put_u32(o + 4, k);
    o[8] = (unsigned char)mode;
    o[9] = (unsigned char)r;
    o[10] = (unsigned char)ebits;
    const int32_t e = e0;
    memcpy(o + 12, &e, 4);
}

/* The threshold codec's C with error feedback on x = e (already g + e): see compress.h. */
static size_t compress_threshold(float *x, size_t n, unsigned char *o) {
    MOERL_ASSERT(n <= UINT32_MAX);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) { /* the bucket travels as it is, as the exact all-reduce would carry it */
            thr_header(o, (uint32_t)n, (uint32_t)n, THR_RAW, 0, 0, 0);
            memcpy(o + THR_HDR, x, n * 4);
            memset(x, 0, n * 4);
            return THR_HDR + n * 4;
        }
    const float tau = compress_threshold_tau(x, n);
    const thr_plan pl = thr_plan_of(x, n, tau);
    const size_t bytes = (size_t)((pl.vbits + pl.ibits + 7) / 8);
    thr_header(o, (uint32_t)n, pl.k, pl.mode, pl.r, pl.ebits, pl.e0);
    unsigned char *s = o + THR_HDR;
    memset(s, 0, bytes);
    bitw vw = bitw_at(s, 0), iw = bitw_at(s, pl.vbits);
    size_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        const int kept = fabsf(x[i]) > tau;
        if (pl.mode == THR_BITMAP) bitw_put(&iw, (uint32_t)kept, 1);
        if (!kept) continue;
        const int e = compress_exp_nearest(fabsf(x[i])), neg = x[i] < 0;
        bitw_put(&vw, (uint32_t)neg | (uint32_t)(e - pl.e0) << 1, 1 + pl.ebits);
        x[i] -= neg ? -pow2f(e) : pow2f(e); /* exact (Sterbenz): the residual keeps the mantissa */
        if (pl.mode == THR_RICE) {
            size_t q = (i - prev) >> pl.r;
            for (; q >= 31; q -= 31) bitw_put(&iw, 0x7fffffffu, 31);
            bitw_put(&iw, (1u << q) - 1, (int)q + 1); /* q ones, then the terminating zero */
            if (pl.r) bitw_put(&iw, (uint32_t)((i - prev) & ((1u << pl.r) - 1)), pl.r);
            prev = i + 1;
        }
    }
    bitw_flush(&vw);
    bitw_flush(&iw);
    return THR_HDR + bytes;
}

size_t compress_bucket(grad_compression c, const float *g, float *e, size_t n, int chunk, void *out) {
    unsigned char *o = out;
    for (size_t i = 0; i < n; i++) e[i] += g[i]; /* e now holds x = g + e */
    if (c == GRAD_COMPRESSION_THRESHOLD) return compress_threshold(e, n, o);
    MOERL_ASSERT(c == GRAD_COMPRESSION_ONEBIT && chunk > 0);
    const size_t nc = (n + (size_t)chunk - 1) / (size_t)chunk;
    put_u32(o, (uint32_t)n);
    put_u32(o + 4, (uint32_t)chunk);
    unsigned char *scales = o + 8, *bits = o + 8 + nc * 4;
    memset(bits, 0, (n + 7) / 8);
    for (size_t ci = 0; ci < nc; ci++) {
        const size_t a = ci * (size_t)chunk, b = MOERL_MIN(n, a + (size_t)chunk);
        double s = 0;
        for (size_t i = a; i < b; i++) s += fabs((double)e[i]);
        const float scale = (float)(s / (double)(b - a));
        memcpy(scales + ci * 4, &scale, 4);
        for (size_t i = a; i < b; i++) {
            const int neg = e[i] < 0;
            if (neg) bits[i >> 3] |= (unsigned char)(1u << (i & 7));
            e[i] -= neg ? -scale : scale; /* residual: x − D(x) */
        }
    }
    return 8 + nc * 4 + (n + 7) / 8;
}

typedef struct { const unsigned char *p; uint64_t pos, end; } bitr; /* end: bits available */

/* nb ≤ 32 bits at the cursor, least significant first; the caller checks pos + nb ≤ end. */
static uint32_t bitr_peek(const bitr *r, int nb) {
    const size_t byte = (size_t)(r->pos >> 3), have = (size_t)((r->end + 7) >> 3) - byte;
    uint64_t w = 0;
    memcpy(&w, r->p + byte, MOERL_MIN(have, (size_t)8));
    w >>= r->pos & 7;
    return nb >= 32 ? (uint32_t)w : (uint32_t)(w & ((1ull << nb) - 1));
}

/* One Rice-coded gap; −1 past the stream's end or beyond limit. */
static int64_t rice_get(bitr *r, int rp, uint64_t limit) {
    uint64_t q = 0;
    for (;;) {
        const int avail = (int)MOERL_MIN((uint64_t)32, r->end - r->pos);
        if (avail == 0) return -1;
        const uint32_t w = bitr_peek(r, avail);
        const int ones = w == 0xffffffffu ? 32 : __builtin_ctz(~w);
        if (ones >= avail) { /* no terminating zero in this window */
            q += (uint64_t)avail;
            r->pos += (uint64_t)avail;
        } else {
            q += (uint64_t)ones;
            r->pos += (uint64_t)ones + 1;
            break;
        }
        if (q > limit) return -1;
    }
    if (q > limit || r->end - r->pos < (uint64_t)rp) return -1;
    const uint64_t gap = q << rp | (rp ? bitr_peek(r, rp) : 0);
    r->pos += (uint64_t)rp;
    return gap > limit ? -1 : (int64_t)gap;
}

/* Walk a threshold payload's streams: validate every field (acc NULL) or add ±2^e into acc. */
static int thr_walk(const unsigned char *p, size_t len, float *acc, size_t n) {
    const uint32_t k = get_u32(p + 4);
    const int mode = p[8], rp = p[9], ebits = p[10];
    int32_t e0;
    memcpy(&e0, p + 12, 4);
    const uint64_t vbits = (uint64_t)k * (uint64_t)(1 + ebits), total = (uint64_t)(len - THR_HDR) * 8;
    if (vbits > total) return moerl_errorf("threshold payload: %u values of %d bits overrun %zu bytes", k, 1 + ebits, len);
    bitr v = {p + THR_HDR, 0, vbits}, ix = {p + THR_HDR, vbits, total};
    uint64_t next = 0; /* smallest index the next kept element may have */
    for (uint32_t j = 0; j < k; j++) {
        uint64_t idx;
        if (mode == THR_BITMAP) {
            while (ix.pos < total && next < n && !bitr_peek(&ix, 1)) ix.pos++, next++;
            if (ix.pos >= total || next >= n) return moerl_errorf("threshold payload: the bitmap holds fewer than %u kept elements", k);
            idx = next;
            ix.pos++;
        } else {
            const int64_t gap = rice_get(&ix, rp, n);
            if (gap < 0 || next + (uint64_t)gap >= n)
                return moerl_errorf("threshold payload: Rice-coded index %u is cut off or lies outside the bucket of %zu", j, n);
            idx = next + (uint64_t)gap;
        }
        next = idx + 1;
        const uint32_t c = bitr_peek(&v, 1 + ebits);
        v.pos += (uint64_t)(1 + ebits);
        const int64_t e = (int64_t)e0 + (c >> 1);
        if (e < THR_EMIN || e > THR_EMAX) return moerl_errorf("threshold payload: exponent %lld outside [-149, 127]", (long long)e);
        if (acc) acc[idx] += c & 1 ? -pow2f((int)e) : pow2f((int)e);
    }
    if (mode == THR_BITMAP) { /* the rest of the bitmap must be empty */
        while (ix.pos < total && next < n && !bitr_peek(&ix, 1)) ix.pos++, next++;
        if (next != n) return moerl_errorf("threshold payload: the bitmap holds more than %u kept elements or is short of %zu bits", k, n);
    }
    if (total - ix.pos >= 8 || (ix.pos < total && bitr_peek(&ix, (int)(total - ix.pos))))
        return moerl_errorf("threshold payload of %zu bytes holds %llu bits past its streams", len, (unsigned long long)(total - ix.pos));
    return MOERL_OK;
}

static int decompress_threshold(const unsigned char *p, size_t len, float *acc, size_t n) {
    if (len < THR_HDR) return moerl_errorf("threshold payload of %zu bytes (needs at least %d)", len, THR_HDR);
    const uint32_t pn = get_u32(p), k = get_u32(p + 4);
    const int mode = p[8], rp = p[9], ebits = p[10];
    if (pn != n || k > n) return moerl_errorf("threshold payload for %u elements (%u kept), bucket has %zu", pn, k, n);
    if (mode == THR_RAW) {
        if (len != THR_HDR + n * 4 || k != n) return moerl_errorf("threshold raw payload of %zu bytes for %zu elements", len, n);
        for (size_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, p + THR_HDR + 4 * i, 4);
            acc[i] += x;
        }
        return MOERL_OK;
    }
    if (mode > THR_RICE || rp > 31 || (mode == THR_BITMAP && rp) || ebits > 9 || p[11])
        return moerl_errorf("threshold payload header: index code %d, Rice parameter %d, %d exponent bits "
                            "(expected code 0 or 1, parameter ≤ 31, ≤ 9 bits)", mode, rp, ebits);
    if (thr_walk(p, len, NULL, n) != MOERL_OK) return MOERL_ERR;
    return thr_walk(p, len, acc, n);
}

int decompress_add(grad_compression c, const void *payload, size_t len, float *acc, size_t n) {
    const unsigned char *p = payload;
    if (c == GRAD_COMPRESSION_THRESHOLD) return decompress_threshold(p, len, acc, n);
    if (c != GRAD_COMPRESSION_ONEBIT) return moerl_errorf("decompress_add: not a compressed mode");
    if (len < 8) return moerl_errorf("onebit payload of %zu bytes (needs at least 8)", len);
    const uint32_t pn = get_u32(p), chunk = get_u32(p + 4);
    if (pn != n || chunk == 0) return moerl_errorf("onebit payload for %u elements in chunks of %u, bucket has %zu", pn, chunk, n);
    const size_t nc = (n + chunk - 1) / chunk;
    if (len != 8 + nc * 4 + (n + 7) / 8) return moerl_errorf("onebit payload of %zu bytes for %zu elements", len, n);
    const unsigned char *scales = p + 8, *bits = p + 8 + nc * 4;
    for (size_t ci = 0; ci < nc; ci++) {
        float s;
        memcpy(&s, scales + ci * 4, 4);
        const size_t a = ci * chunk, b = MOERL_MIN(n, a + chunk);
        for (size_t i = a; i < b; i++) acc[i] += (bits[i >> 3] >> (i & 7)) & 1 ? -s : s;
    }
    return MOERL_OK;
}
