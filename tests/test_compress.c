/* Gradient compression codecs (src/dist/compress.h): the threshold τ = 2·median|x| against a
 * sort, exactly the elements above τ travel, each as ±2^e with e the nearest power of two in log
 * space (against a float64 reference), onebit's sign and per-chunk mean |x|, error feedback (what
 * is decompressed plus the new residual equals the gradient plus the old residual: bit for bit for
 * threshold, to fp32 rounding for onebit), error feedback over many steps (the sum of what was
 * applied trails the sum of the true gradients by exactly the last residual), payload sizes within
 * compress_max_bytes on randomized buckets (n = 0, none kept, the densest reachable, huge
 * exponents, denormals, inf/NaN), the payload bytes against tests/ref/gen_compress.py, and
 * malformed payloads (every truncation, bad header fields, indices outside the bucket) refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "dist/compress.h"
#include "model/safetensors.h"
#include "test.h"

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The reference rounding in float64: |x| = m·2^f, m ∈ [1, 2); e = f + 1 iff m² > 2 (m² is exact in
 * float64: 24-bit m), capped at 127; ±2^e with x's sign. */
static int ref_exp(float x) {
    int f;
    const double m = 2.0 * frexp(fabs((double)x), &f);
    const int e = (f - 1) + (m * m > 2.0);
    return e > 127 ? 127 : e;
}
static float ref_pow2(float x) { return (float)(x < 0 ? -ldexp(1.0, ref_exp(x)) : ldexp(1.0, ref_exp(x))); }

static float bits_f(uint32_t b) {
    float v;
    memcpy(&v, &b, 4);
    return v;
}

/* compress_exp_nearest against the float64 reference: every exponent field with fractions around
 * √2 (0x3504F3 is the last below, 0x3504F4 the first above), random floats, denormals, the cap. */
static void test_exponent(void) {
    size_t bad = 0, tried = 0;
    const uint32_t fracs[] = {0, 1, 0x3504F2, 0x3504F3, 0x3504F4, 0x3504F5, 0x7fffff, 0x400000};
    for (uint32_t field = 0; field < 255; field++)
        for (size_t j = 0; j < sizeof fracs / sizeof *fracs; j++) {
            const float a = bits_f(field << 23 | fracs[j]);
            if (a == 0.0f) continue;
            tried++;
            bad += compress_exp_nearest(a) != ref_exp(a);
        }
    rng_state r;
    rng_seed(&r, 5);
    for (int t = 0; t < 200000; t++) {
        const float a = bits_f((uint32_t)(rng_u64(&r) & 0x7f7fffffu) | 1u); /* finite, > 0 */
        tried++;
        bad += compress_exp_nearest(a) != ref_exp(a);
    }
    CHECK(bad == 0, "exponent rounding: %zu of %zu differ from the float64 reference", bad, tried);
    CHECK(compress_exp_nearest(bits_f(0x3FB504F3)) == 0 && compress_exp_nearest(bits_f(0x3FB504F4)) == 1 &&
              compress_exp_nearest(bits_f(1)) == -149 && compress_exp_nearest(3.4e38f) == 127,
          "exponent boundaries: √2 splits, 2^-149, the cap at 127");
}

/* One randomized bucket through C and D: bound, exact feedback, decoded values ±2^e or raw. */
static void bucket_check(const float *g, size_t n, const char *what) {
    float *e = xcalloc(n ? n : 1, sizeof(float)), *d = xcalloc(n ? n : 1, sizeof(float));
    unsigned char *buf = xmalloc(compress_max_bytes(GRAD_COMPRESSION_THRESHOLD, n, 1));
    int finite = 1;
    for (size_t i = 0; i < n; i++) finite &= isfinite(g[i]) != 0;
    const size_t len = compress_bucket(GRAD_COMPRESSION_THRESHOLD, g, e, n, 1, buf);
    CHECK(len <= compress_max_bytes(GRAD_COMPRESSION_THRESHOLD, n, 1), "%s n=%zu: %zu bytes over the bound", what, n, len);
    CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, len, d, n) == MOERL_OK, "%s n=%zu: %s", what, n,
          moerl_last_error());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!finite) { /* raw: every value as it is (NaN stays NaN), residual 0 */
            bad += !(isnan(g[i]) ? isnan(d[i]) : d[i] == g[i]) || e[i] != 0.0f;
            continue;
        }
        bad += d[i] + e[i] != g[i] || (d[i] != 0.0f && d[i] != ref_pow2(g[i]));
    }
    CHECK(bad == 0, "%s n=%zu: %zu elements break D + residual == x or ±2^e", what, n, bad);
    if (!finite) CHECK(len == 16 + 4 * n, "%s: a non-finite bucket travels raw (%zu bytes)", what, len);
    free(e); free(d); free(buf);
}

static void test_bounds(void) {
    rng_state r;
    rng_seed(&r, 77);
    float *g = xmalloc(8192 * sizeof(float));
    bucket_check(g, 0, "n=0");
    for (int t = 0; t < 300; t++) {
        const size_t n = 1 + (size_t)(rng_u64(&r) % 8000);
        const int kind = t % 6;
        for (size_t i = 0; i < n; i++) {
            const double u = rng_uniform_double(&r) * 2 - 1;
            switch (kind) {
            case 0: g[i] = (float)u * 1e-3f; break;                                  /* uniform */
            case 1: g[i] = (float)(u / pow(fabs(u) + 1e-4, 2.0)) * 1e-6f; break;    /* heavy-tailed */
            case 2: g[i] = i % 2 ? 0.0f : (float)u; break;                          /* half exact zeros */
            case 3: g[i] = (float)u * 3.4e38f; break;                               /* huge: the cap */
            case 4: g[i] = bits_f((uint32_t)(rng_u64(&r) & 0x807fffffu));  break;  /* denormals, ±0 */
            default: g[i] = bits_f((uint32_t)rng_u64(&r)); if (!isfinite(g[i])) g[i] = 1.0f; /* any finite */
            }
        }
        bucket_check(g, n, "random");
    }
    for (size_t i = 0; i < 1000; i++) g[i] = 0.5f;
    bucket_check(g, 1000, "all equal (none kept)");
    for (size_t i = 0; i < 1000; i++) g[i] = 0.0f;
    bucket_check(g, 1000, "all zero (none kept)");
    /* densest reachable: τ = 2·median, so at most half the nonzero elements are kept */
    for (size_t i = 0; i < 1001; i++) g[i] = i % 2 ? 1e-30f : (i % 4 ? -3e30f : 3e-10f);
    bucket_check(g, 1001, "densest");
    g[7] = INFINITY;
    bucket_check(g, 1001, "inf");
    g[7] = NAN;
    bucket_check(g, 1001, "nan");
    free(g);
}

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

/* The payload bytes, decoded values and residuals against tests/ref/gen_compress.py, bit for bit. */
static void test_reference(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/compress.safetensors", testdata());
    st_file f;
    if (st_open(&f, path) != MOERL_OK) {
        CHECK(0, "cannot open reference %s (run tests/ref/gen_compress.py %s): %s", path, testdata(), moerl_last_error());
        return;
    }
    const char *cases[] = {"normal", "heavy", "sparse", "extremes", "equal", "empty", "nonfinite"};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char nm[5][64];
        const char *sfx[5] = {"g", "e", "payload", "decoded", "residual"};
        const st_tensor *t[5];
        int ok = 1;
        for (int j = 0; j < 5; j++) {
            snprintf(nm[j], sizeof nm[j], "%s.%s", cases[c], sfx[j]);
            t[j] = st_find(&f, nm[j]);
            ok &= t[j] != NULL;
        }
        CHECK(ok, "%s: a reference tensor of case %s is missing", path, cases[c]);
        if (!ok) continue;
        const size_t n = (size_t)t[0]->numel, pl = (size_t)t[2]->numel;
        float *v[5];
        for (int j = 0; j < 5; j++) {
            v[j] = xmalloc(((size_t)t[j]->numel + 1) * sizeof(float));
            if (t[j]->dtype == ST_I32) { /* the payload: one int32 per byte */
                for (int64_t i = 0; i < t[j]->numel; i++) v[j][i] = (float)((const int32_t *)t[j]->data)[i];
            } else {
                MOERL_ASSERT(t[j]->dtype == ST_F32);
                memcpy(v[j], t[j]->data, (size_t)t[j]->numel * 4); /* bit for bit (NaN included) */
            }
        }
        unsigned char *buf = xmalloc(compress_max_bytes(GRAD_COMPRESSION_THRESHOLD, n, 1));
        float *d = xcalloc(n + 1, sizeof(float));
        const size_t len = compress_bucket(GRAD_COMPRESSION_THRESHOLD, v[0], v[1], n, 1, buf);
        size_t diff = len == pl ? 0 : 1;
        for (size_t i = 0; i < pl && i < len; i++) diff += buf[i] != (unsigned char)v[2][i];
        CHECK(diff == 0, "%s: payload %zu bytes, reference %zu; %zu bytes differ", cases[c], len, pl, diff);
        CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, len, d, n) == MOERL_OK, "%s: %s", cases[c], moerl_last_error());
        /* bit for bit (NaN: the same bits, it travels raw) */
        CHECK(!memcmp(d, v[3], n * 4) && !memcmp(v[1], v[4], n * 4), "%s: decoded or residual differ from the reference",
              cases[c]);
        for (int j = 0; j < 5; j++) free(v[j]);
        free(buf); free(d);
    }
    st_close(&f);
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
    if (c == GRAD_COMPRESSION_THRESHOLD) {
        /* x − (±2^e) with |x|/2^e ∈ (1/√2, √2] is exact (Sterbenz): no tolerance */
        CHECK(worst == 0, "threshold n=%zu: D(C(x)) + residual differs from x by %g", n, worst);
        size_t kept = 0, wrong = 0;
        for (size_t i = 0; i < n; i++) {
            const int above = fabsf(x[i]) > tau;
            kept += above;
            wrong += above ? d[i] != ref_pow2(x[i]) : (d[i] != 0.0f || e[i] != x[i]);
        }
        CHECK(wrong == 0, "threshold: %zu elements misplaced or not ±2^e (%zu kept)", wrong, kept);
        CHECK(len <= 16 + (kept * 9 + n + 7) / 8 + (n + 7) / 8, "threshold: %zu bytes for %zu kept of %zu", len, kept, n);
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
        /* x − D(x) is one fp32 subtraction: |error| ≤ ulp of the larger operand (≤ 1e-9 at these scales) */
        CHECK(worst <= 1e-9, "onebit n=%zu: D(C(x)) + residual differs from x by %g", n, worst);
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

static uint32_t get_k(const unsigned char *p) {
    uint32_t k;
    memcpy(&k, p + 4, 4);
    return k;
}

/* A valid threshold payload of x[n] into buf (capacity 16 + 4n); its length. */
static size_t thr_payload(float *x, size_t n, unsigned char *buf) {
    float *e = xcalloc(n, sizeof(float));
    const size_t len = compress_bucket(GRAD_COMPRESSION_THRESHOLD, x, e, n, 1, buf);
    free(e);
    return len;
}

static void test_malformed(void) {
    float acc[8] = {0};
    unsigned char p[64] = {0};
    CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, p, 12, acc, 8) == MOERL_ERR && strstr(moerl_last_error(), "16"),
          "short threshold payload refused: %s", moerl_last_error());
    /* valid payloads (bitmap, Rice) refused at every truncation and extension, acc untouched */
    float x[600], big[600];
    for (size_t i = 0; i < 600; i++) x[i] = (i % 2 ? (i % 3 ? 1.0f : -3.0f) : 1e-3f), big[i] = i % 97 ? 1e-6f : 5.0f;
    /* every odd element kept: each Rice code costs ≥ the n-bit bitmap, which wins ties */
    unsigned char *buf = xmalloc(16 + 4 * 600 + 8);
    float *acc2 = xcalloc(600, sizeof(float));
    for (int which = 0; which < 2; which++) {
        const size_t len = thr_payload(which ? big : x, 600, buf);
        CHECK(buf[8] == (which ? 1 : 0) && get_k(buf) > 0, "case %d uses index code %d, keeps %u", which, buf[8], get_k(buf));
        size_t accepted = 0;
        for (size_t l = 0; l < len; l++) accepted += decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, l, acc2, 600) == MOERL_OK;
        buf[len] = 0;
        accepted += decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, len + 1, acc2, 600) == MOERL_OK;
        size_t touched = 0;
        for (size_t i = 0; i < 600; i++) touched += acc2[i] != 0.0f;
        CHECK(accepted == 0 && touched == 0, "code %d: %zu truncated/extended payloads accepted, %zu values written", which,
              accepted, touched);
        CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, len, acc2, 500) == MOERL_ERR, "payload for another n refused");
        unsigned char save = buf[10];
        buf[10] = 10;
        CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, len, acc2, 600) == MOERL_ERR &&
                  strstr(moerl_last_error(), "exponent bits"), "10 exponent bits refused: %s", moerl_last_error());
        buf[10] = save;
        save = buf[8];
        buf[8] = 3;
        CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, len, acc2, 600) == MOERL_ERR, "index code 3 refused");
        buf[8] = save;
        int32_t e0 = 128;
        memcpy(buf + 12, &e0, 4);
        CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, len, acc2, 600) == MOERL_ERR &&
                  strstr(moerl_last_error(), "exponent"), "exponent past 127 refused: %s", moerl_last_error());
    }
    /* a Rice gap pointing past the bucket: n = 8, k = 1, r = 3, no exponent bits, gap 9 = 1·2^3 + 1 */
    uint32_t hdr4[2] = {8, 1};
    memset(p, 0, sizeof p);
    memcpy(p, hdr4, 8);
    p[8] = 1, p[9] = 3;
    p[16] = 0 | 1 << 1 | 0 << 2 | 1 << 3; /* value bit (sign 0), then q = 1: '1', '0', then low bits 001 */
    CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, p, 17, acc, 8) == MOERL_ERR && strstr(moerl_last_error(), "outside"),
          "index outside the bucket refused: %s", moerl_last_error());
    p[16] = 0 | 1 << 1 | 0 << 2 | 0 << 3; /* gap 8: still outside */
    CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, p, 17, acc, 8) == MOERL_ERR, "gap 8 in a bucket of 8 refused");
    p[16] = 0 | 0 << 1 | 1 << 2 | 1 << 3 | 1 << 4; /* q = 0, low bits 111: index 7, accepted */
    CHECK(decompress_add(GRAD_COMPRESSION_THRESHOLD, p, 17, acc, 8) == MOERL_OK && acc[7] == 1.0f,
          "index 7, e = 0: +1 (%s)", moerl_last_error());
    free(buf);
    free(acc2);
    /* the coded worst case, which τ never produces: every element kept, bitmap, 9 exponent bits, all
     * at the cap — 16 + (100·10 + 100)/8 bytes, within compress_max_bytes, decodes to 2^127 each */
    unsigned char w[16 + 138] = {0};
    const uint32_t wh[2] = {100, 100};
    const int32_t we0 = -149;
    memcpy(w, wh, 8);
    w[10] = 9;
    memcpy(w + 12, &we0, 4);
    for (int j = 0; j < 100; j++) /* value j: sign 0, e − e0 = 276, at bits 10j .. 10j+9; then 100 bitmap ones */
        for (int b = 0; b < 9; b++)
            if (276 >> b & 1) w[16 + (10 * j + 1 + b) / 8] |= (unsigned char)(1u << ((10 * j + 1 + b) % 8));
    for (int i = 0; i < 100; i++) w[16 + (1000 + i) / 8] |= (unsigned char)(1u << ((1000 + i) % 8));
    float *wa = xcalloc(100, sizeof(float));
    CHECK(sizeof w <= compress_max_bytes(GRAD_COMPRESSION_THRESHOLD, 100, 1) &&
              decompress_add(GRAD_COMPRESSION_THRESHOLD, w, sizeof w, wa, 100) == MOERL_OK && wa[0] == 0x1p127f &&
              wa[99] == 0x1p127f, "all kept at 10 bits each: %zu bytes decode (%s)", sizeof w, moerl_last_error());
    free(wa);
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
    test_exponent();
    test_bounds();
    test_reference();
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
