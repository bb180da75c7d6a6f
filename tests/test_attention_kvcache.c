/* attention_kvcache_forward (src/kernels/cpu/attention_kvcache.c): the rollout engine's attention
 * against a slot-per-sequence KV cache, checked against
 *   (1) a naive double-precision softmax(q·kᵀ·scale)·v written here,
 *   (2) attention_forward (the training kernel) on the same packed sequences — the contract says
 *       the two are equal,
 * and (3) its own results one token per call (the single-thread path) vs all tokens in one call
 * (the parallel path): the same per-item code, so bit-identical.
 * Lengths straddle the 64-key block of the online softmax (1, 63, 64, 65, 200) and the keys grow
 * with position so that later blocks raise the running maximum (the rescaling path). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "test.h"

/* Naive reference: out[n,h,:] for query row n at position p of sequence b (double). */
static void naive(float *out, const float *q, const float *k, const float *v, const int *cu, int B, int nh,
                  int nkv, int hd, float scale) {
    const int G = nh / nkv;
    for (int b = 0; b < B; b++)
        for (int n = cu[b]; n < cu[b + 1]; n++)
            for (int h = 0; h < nh; h++) {
                const int P = n - cu[b] + 1, kvh = h / G;
                double *s = malloc(P * sizeof(double)), mx = -INFINITY, sum = 0;
                for (int j = 0; j < P; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++)
                        d += (double)q[((size_t)n * nh + h) * hd + c] * k[((size_t)(cu[b] + j) * nkv + kvh) * hd + c];
                    s[j] = d * scale;
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j < P; j++) sum += (s[j] = exp(s[j] - mx));
                for (int c = 0; c < hd; c++) {
                    double o = 0;
                    for (int j = 0; j < P; j++) o += s[j] * v[((size_t)(cu[b] + j) * nkv + kvh) * hd + c];
                    out[((size_t)n * nh + h) * hd + c] = (float)(o / sum);
                }
                free(s);
            }
}

static void run_case(int nh, int nkv, int hd, float qscale) {
    enum { B = 5 };
    const int lens[B] = {1, 63, 64, 65, 200};
    const int slot_of_seq[B] = {3, 0, 4, 1, 2}; /* sequences live in shuffled slots */
    const int S = B, max_len = 256;
    int cu[B + 1] = {0};
    for (int b = 0; b < B; b++) cu[b + 1] = cu[b] + lens[b];
    const int N = cu[B];
    const size_t row = (size_t)nkv * hd;
    rng_state r;
    rng_seed(&r, (uint64_t)nh * 1000 + hd);
    float *q = xmalloc((size_t)N * nh * hd * sizeof(float)), *k = xmalloc((size_t)N * row * sizeof(float)),
          *v = xmalloc((size_t)N * row * sizeof(float));
    for (long i = 0; i < (long)N * nh * hd; i++) q[i] = qscale * rng_normal(&r);
    for (int b = 0; b < B; b++)
        for (int n = cu[b]; n < cu[b + 1]; n++) {
            const float grow = 1.0f + 2.0f * (n - cu[b]) / 200.0f; /* later keys → larger scores */
            for (size_t c = 0; c < row; c++) {
                k[(size_t)n * row + c] = grow * rng_normal(&r);
                v[(size_t)n * row + c] = rng_normal(&r);
            }
        }
    /* the cache, filled past each sequence's end with garbage that must never be read */
    float *kc = xmalloc((size_t)S * max_len * row * sizeof(float)), *vc = xmalloc((size_t)S * max_len * row * sizeof(float));
    for (size_t i = 0; i < (size_t)S * max_len * row; i++) kc[i] = vc[i] = NAN;
    int *slot = xmalloc(N * sizeof(int)), *pos = xmalloc(N * sizeof(int));
    for (int b = 0; b < B; b++)
        for (int n = cu[b]; n < cu[b + 1]; n++) {
            slot[n] = slot_of_seq[b];
            pos[n] = n - cu[b];
            memcpy(kc + ((size_t)slot[n] * max_len + pos[n]) * row, k + (size_t)n * row, row * sizeof(float));
            memcpy(vc + ((size_t)slot[n] * max_len + pos[n]) * row, v + (size_t)n * row, row * sizeof(float));
        }
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t no = (size_t)N * nh * hd;
    float *o_all = xmalloc(no * sizeof(float)), *o_one = xmalloc(no * sizeof(float)),
          *o_ref = xmalloc(no * sizeof(float)), *o_fa = xmalloc(no * sizeof(float)),
          *lse = xmalloc((size_t)N * nh * sizeof(float));
    attention_kvcache_forward(o_all, q, kc, vc, slot, pos, N, nh, nkv, hd, max_len, scale);
    for (int n = 0; n < N; n++)
        attention_kvcache_forward(o_one + (size_t)n * nh * hd, q + (size_t)n * nh * hd, kc, vc, slot + n, pos + n, 1, nh,
                                  nkv, hd, max_len, scale);
    naive(o_ref, q, k, v, cu, B, nh, nkv, hd, scale);
    attention_forward(o_fa, lse, q, k, v, cu, B, N, nh, nkv, hd, scale);
    /* Tolerance: an fp32 score s is off by a few eps·|s| (rounding of a hd-term dot product),
     * which becomes the same relative error of its probability; the output, a convex combination
     * of v rows, inherits about eps·smax, smax = the case's largest |score| (≈ 11 for qscale 1,
     * ≈ 40 for 4). Measured: 0.7–0.9·eps·smax against the double reference (attention_forward
     * itself: up to 1.4·eps·smax), so 3·eps·(1 + smax) leaves > 3× headroom; 1e-5 relative covers
     * the last-ulp differences of large outputs. */
    double smax = 0;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh; h++)
            for (int j = 0; j <= pos[n]; j++) {
                double d = 0;
                for (int c = 0; c < hd; c++)
                    d += (double)q[((size_t)n * nh + h) * hd + c] *
                         k[((size_t)(n - pos[n] + j) * nkv + h / (nh / nkv)) * hd + c];
                smax = fmax(smax, fabs(d * scale));
            }
    const float atol = (float)(3 * 1.19e-7 * (1.0 + smax)); /* FLT_EPSILON = 1.19e-7 */
    char what[160];
    snprintf(what, sizeof what, "kvcache vs naive double (nh %d nkv %d hd %d qscale %g, max |score| %.1f)", nh, nkv,
             hd, (double)qscale, smax);
    t_close(what, o_all, o_ref, (long)no, atol, 1e-5f);
    /* two fp32 kernels, each within the bound above of the exact result: twice the margin */
    snprintf(what, sizeof what, "kvcache vs attention_forward (nh %d nkv %d hd %d qscale %g)", nh, nkv, hd, (double)qscale);
    t_close(what, o_all, o_fa, (long)no, 2 * atol, 2e-5f);
    CHECK(!memcmp(o_all, o_one, no * sizeof(float)), "nh %d hd %d: one call of %d tokens differs from %d calls of one",
          nh, hd, N, N);
    free(q); free(k); free(v); free(kc); free(vc); free(slot); free(pos);
    free(o_all); free(o_one); free(o_ref); free(o_fa); free(lse);
}

int main(void) {
    run_case(8, 2, 32, 1.0f);  /* the benchmark model's attention shape, GQA group 4 */
    run_case(4, 4, 12, 1.0f);  /* MHA, head_dim not a multiple of the SIMD width */
    run_case(6, 2, 64, 4.0f);  /* peaky softmax: the running max moves a lot between blocks */
    TEST_MAIN_END();
}
