/* Fuzz target: the compressed-gradient payloads of the data-parallel all-reduce (src/dist/compress.c)
 * as another trainer rank could send them. Each input is offered to decompress_add as a threshold
 * payload and as a onebit payload, for the bucket size its own header names (capped at 2^16
 * elements): it must be accepted or refused with a message, never read past the input; a refused
 * threshold payload leaves the accumulator untouched; an accepted coded one adds exactly k values,
 * each ±2^e, at k distinct indices (raw: the floats as they are). Then the same bytes, read as
 * floats, go through compress_bucket + decompress_add: the payload stays within compress_max_bytes
 * and, for finite input, decoded + residual == input bit for bit.
 * Seeds (fuzz/corpus/compress/): payloads written by tests/ref/gen_compress.py's encoder. */
#include <math.h>

#include "dist/compress.h"
#include "fuzz_common.h"

static int is_pow2(float v) {
    int e;
    const float m = frexpf(fabsf(v), &e);
    return v != 0.0f && m == 0.5f;
}

static void offer_threshold(const uint8_t *msg, size_t size) {
    uint32_t n = 0, k = 0;
    if (size >= 8) memcpy(&n, msg, 4), memcpy(&k, msg + 4, 4);
    if (n > (1u << 16)) n = 1u << 16;
    float *acc = calloc((size_t)n + 1, sizeof(float));
    if (decompress_add(GRAD_COMPRESSION_THRESHOLD, msg, size, acc, n) != MOERL_OK) {
        fuzz_check_error();
        for (uint32_t i = 0; i < n; i++) FUZZ_ASSERT(acc[i] == 0.0f, "refused payload wrote acc[%u]", i);
    } else if (msg[8] != 2) { /* coded: k values ±2^e at distinct indices */
        uint32_t nz = 0;
        for (uint32_t i = 0; i < n; i++)
            if (acc[i] != 0.0f) {
                FUZZ_ASSERT(is_pow2(acc[i]), "acc[%u] = %a is not ±2^e", i, (double)acc[i]);
                nz++;
            }
        FUZZ_ASSERT(nz == k, "%u values decoded, header says %u", nz, k);
    } else { /* raw: 0 + x, each float as sent (NaN stays NaN) */
        for (uint32_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, msg + 16 + 4 * (size_t)i, 4);
            FUZZ_ASSERT(isnan(x) ? isnan(acc[i]) : acc[i] == x, "raw element %u", i);
        }
    }
    free(acc);
}

static void offer_onebit(const uint8_t *msg, size_t size) {
    uint32_t n = 0;
    if (size >= 4) memcpy(&n, msg, 4);
    if (n > (1u << 16)) n = 1u << 16;
    float *acc = calloc((size_t)n + 1, sizeof(float));
    if (decompress_add(GRAD_COMPRESSION_ONEBIT, msg, size, acc, n) != MOERL_OK) fuzz_check_error();
    free(acc);
}

static void roundtrip(const uint8_t *data, size_t size) {
    const size_t n = size / 4;
    float *x = malloc((n + 1) * 4), *e = calloc(n + 1, 4), *d = calloc(n + 1, 4);
    if (n) memcpy(x, data, n * 4);
    int finite = 1;
    for (size_t i = 0; i < n; i++) finite &= isfinite(x[i]) != 0;
    const size_t cap = compress_max_bytes(GRAD_COMPRESSION_THRESHOLD, n, 1);
    unsigned char *buf = malloc(cap);
    const size_t len = compress_bucket(GRAD_COMPRESSION_THRESHOLD, x, e, n, 1, buf);
    FUZZ_ASSERT(len <= cap, "payload %zu bytes over the bound %zu", len, cap);
    FUZZ_ASSERT(decompress_add(GRAD_COMPRESSION_THRESHOLD, buf, len, d, n) == MOERL_OK, "own payload refused: %s",
                moerl_last_error());
    for (size_t i = 0; finite && i < n; i++)
        FUZZ_ASSERT(d[i] + e[i] == x[i] && (d[i] == 0.0f || is_pow2(d[i])), "element %zu: %a + %a != %a", i,
                    (double)d[i], (double)e[i], (double)x[i]);
    free(x); free(e); free(d); free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *msg = malloc(size ? size : 1); /* exact size: an over-read is caught */
    if (size) memcpy(msg, data, size);
    offer_threshold(msg, size);
    offer_onebit(msg, size);
    roundtrip(msg, size);
    free(msg);
    return 0;
}
