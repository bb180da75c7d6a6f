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
    if (c == GRAD_COMPRESSION_THRESHOLD) return 4 + n * 8;
    if (c == GRAD_COMPRESSION_ONEBIT) return 8 + ((n + (size_t)chunk - 1) / (size_t)chunk) * 4 + (n + 7) / 8;
    return n * 4;
}

/* k-th smallest of a[n] (quickselect, Hoare partition; a is reordered). */
static float select_kth(float *a, size_t n, size_t k) {
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const float p = a[lo + (hi - lo) / 2];
        size_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < p) i++;
            while (a[j] > p) j--;
            if (i <= j) {
                const float t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                if (j == 0) break;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return a[k];
    }
    return a[k];
}

float compress_threshold_tau(const float *x, size_t n) {
    float *a = xmalloc((n ? n : 1) * sizeof(float));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) a[k++] = fabsf(x[i]);
    const float med = k ? select_kth(a, k, (k - 1) / 2) : 0.0f;
    free(a);
    return 2.0f * med;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

size_t compress_bucket(grad_compression c, const float *g, float *e, size_t n, int chunk, void *out) {
    unsigned char *o = out;
    for (size_t i = 0; i < n; i++) e[i] += g[i]; /* e now holds x = g + e */
    if (c == GRAD_COMPRESSION_THRESHOLD) {
        const float tau = compress_threshold_tau(e, n);
        uint32_t k = 0;
        unsigned char *p = o + 4;
        for (size_t i = 0; i < n; i++)
            if (fabsf(e[i]) > tau) {
                put_u32(p, (uint32_t)i);
                memcpy(p + 4, &e[i], 4);
                p += 8;
                k++;
                e[i] = 0.0f; /* sent exactly: nothing left behind */
            }
        put_u32(o, k);
        return 4 + (size_t)k * 8;
    }
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

int decompress_add(grad_compression c, const void *payload, size_t len, float *acc, size_t n) {
    const unsigned char *p = payload;
    if (c == GRAD_COMPRESSION_THRESHOLD) {
        if (len < 4) return moerl_errorf("threshold payload of %zu bytes (needs at least 4)", len);
        const uint32_t k = get_u32(p);
        if ((uint64_t)k * 8 + 4 != len)
            return moerl_errorf("threshold payload announces %u values but holds %zu bytes", k, len);
        for (uint32_t j = 0; j < k; j++) {
            const uint32_t idx = get_u32(p + 4 + 8 * (size_t)j);
            float v;
            memcpy(&v, p + 8 + 8 * (size_t)j, 4);
            if (idx >= n) return moerl_errorf("threshold payload: index %u outside the bucket of %zu", idx, n);
            acc[idx] += v;
        }
        return MOERL_OK;
    }
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
