/* Gradient compression codecs (src/dist/compress.h): the threshold τ = 2·median|x| against a
 * sort, exactly the elements above τ travel, onebit's sign and per-chunk mean |x|, error feedback
 * (what is decompressed plus the new residual equals the gradient plus the old residual, to fp32
 * rounding), error feedback over many steps (the sum of what was applied trails the sum of the true
 * gradients by exactly the last residual), payload sizes, and malformed payloads refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "dist/compress.h"
#include "test.h"

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void fill(float *x, size_t n, uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_uniform_double(&r) * 2 - 1) * (float)(i % 7 + 1) * 1e-3f;
}

static void test_tau(void) {
    const size_t ns[] = {1, 2, 3, 10, 257, 4096};
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
        const size_t n = ns[t];
        float *x = xmalloc(n * sizeof(float)), *a = xmalloc(n * sizeof(float));
        fill(x, n, 11 + n);
        for (size_t i = 0; i < n; i += 3) x[i] = 0.0f; /* exact zeros are left out of the median */
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (x[i] != 0.0f) a[k++] = fabsf(x[i]);
        qsort(a, k, sizeof(float), cmp_float);
        const float want = k ? 2.0f * a[(k - 1) / 2] : 0.0f;
        CHECK(compress_threshold_tau(x, n) == want, "n=%zu: tau %g, want %g", n, (double)compress_threshold_tau(x, n),
              (double)want);
        free(x);
        free(a);
    }
}

/* One round: D(C(g + e)) + e' == g + e within fp32 rounding of the subtraction. */
static void test_roundtrip(grad_compression c, size_t n, int chunk) {
    float *g = xmalloc(n * sizeof(float)), *e = xcalloc(n, sizeof(float)), *x = xmalloc(n * sizeof(float));
    float *d = xcalloc(n, sizeof(float));
    fill(g, n, 3);
    fill(e, n, 4);
    for (size_t i = 0; i < n; i++) e[i] *= 0.1f, x[i] = g[i] + e[i];
    const float tau = compress_threshold_tau(x, n);
    void *buf = xmalloc(compress_max_bytes(c, n, chunk));
    const size_t len = compress_bucket(c, g, e, n, chunk, buf);
    CHECK(len <= compress_max_bytes(c, n, chunk), "%s: payload %zu > bound", grad_compression_name(c), len);
    CHECK(decompress_add(c, buf, len, d, n) == MOERL_OK, "%s: decompress: %s", grad_compression_name(c),
          moerl_last_error());
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)d[i] + e[i] - x[i]));
    /* x − D(x) is one fp32 subtraction: |error| ≤ ulp of the larger operand (≤ 1e-9 at these scales) */
    CHECK(worst <= 1e-9, "%s n=%zu: D(C(x)) + residual differs from x by %g", grad_compression_name(c), n, worst);
    if (c == GRAD_COMPRESSION_THRESHOLD) {
        size_t kept = 0, wrong = 0;
        for (size_t i = 0; i < n; i++) {
            const int above = fabsf(x[i]) > tau;
            kept += above;
            wrong += above ? (d[i] != x[i] || e[i] != 0.0f) : (d[i] != 0.0f || e[i] != x[i]);
        }
        CHECK(wrong == 0 && len == 4 + kept * 8, "threshold: %zu elements misplaced, %zu kept, %zu bytes", wrong, kept,
              len);
        CHECK(kept > 0 && (double)kept < n / 2.0, "threshold keeps a minority (%zu of %zu)", kept, n);
    } else {
        size_t bad = 0;
        for (size_t a = 0; a < n; a += (size_t)chunk) {
            const size_t b = MOERL_MIN(n, a + (size_t)chunk);
            double s = 0;
            for (size_t i = a; i < b; i++) s += fabs((double)x[i]);
            const float scale = (float)(s / (double)(b - a));
            for (size_t i = a; i < b; i++) bad += d[i] != (x[i] < 0 ? -scale : scale);
        }
        CHECK(bad == 0, "onebit: %zu elements not ±(chunk mean |x|)", bad);
        CHECK(len == 8 + ((n + chunk - 1) / chunk) * 4 + (n + 7) / 8, "onebit payload %zu bytes", len);
    }
    free(g); free(e); free(x); free(d); free(buf);
}

/* Error feedback over K steps: Σ applied + e_K == Σ true gradients (nothing lost, only delayed). */
static void test_feedback(grad_compression c) {
    const size_t n = 1000;
    const int K = 20;
    float *g = xmalloc(n * sizeof(float)), *e = xcalloc(n, sizeof(float)), *applied = xcalloc(n, sizeof(float));
    double *truth = xcalloc(n, sizeof(double));
    void *buf = xmalloc(compress_max_bytes(c, n, 64));
    for (int k = 0; k < K; k++) {
        fill(g, n, 100 + k);
        for (size_t i = 0; i < n; i++) truth[i] += g[i];
        const size_t len = compress_bucket(c, g, e, n, 64, buf);
        MOERL_ASSERT(decompress_add(c, buf, len, applied, n) == MOERL_OK);
    }
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)applied[i] + e[i] - truth[i]));
        scale = fmax(scale, fabs(truth[i]));
    }
    /* K fp32 additions of values ≤ 7e-3: accumulated rounding ≤ K·ulp(0.1) ≈ 2e-7 */
    CHECK(worst <= 1e-6, "%s: after %d steps applied + residual differs from the true sum by %g (scale %g)",
          grad_compression_name(c), K, worst, scale);
    free(g); free(e); free(applied); free(truth); free(buf);
}

static void test_malformed(void) {
    float acc[8] = {0};
    unsigned char p[64] = {0};
    uint32_t k = 3;
    memcpy(p, &k, 4);
    CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, p, 12, acc, 8) == MOERL_ERR, "short threshold payload refused");
    k = 1;
    memcpy(p, &k, 4);
    uint32_t idx = 9;
    memcpy(p + 4, &idx, 4);
    CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, p, 12, acc, 8) == MOERL_ERR && strstr(moerl_last_error(), "index 9"),
          "index outside the bucket refused: %s", moerl_last_error());
    uint32_t hdr[2] = {8, 4};
    memcpy(p, hdr, 8);
    CHECK(decompress_add(GRAD_COMPRESSION_ONEBIT, p, 10, acc, 8) == MOERL_ERR, "onebit payload of the wrong size refused");
    hdr[0] = 9;
    memcpy(p, hdr, 8);
    CHECK(decompress_add(GRAD_COMPRESSION_ONEBIT, p, 8 + 12 + 2, acc, 8) == MOERL_ERR, "onebit for another n refused");
    grad_compression c;
    CHECK(grad_compression_parse("1bit", &c) == MOERL_ERR && strstr(moerl_last_error(), "threshold"),
          "unknown mode names the accepted ones");
}

int main(void) {
    test_tau();
    test_roundtrip(GRAD_COMPRESSION_THRESHOLD, 4096, 256);
    test_roundtrip(GRAD_COMPRESSION_THRESHOLD, 3, 256);
    test_roundtrip(GRAD_COMPRESSION_ONEBIT, 4096, 256);
    test_roundtrip(GRAD_COMPRESSION_ONEBIT, 1001, 64);
    test_feedback(GRAD_COMPRESSION_THRESHOLD);
    test_feedback(GRAD_COMPRESSION_ONEBIT);
    test_malformed();
    printf("%d passed, %d failed\n", t_passed, t_failed);
    return t_failed ? 1 : 0;
}
