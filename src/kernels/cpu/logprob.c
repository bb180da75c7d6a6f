/* Token log-probabilities and entropies from LM-head logits with a sampling temperature.
 *
 * Per row n, z = logits[n,:] / T (a division, as verl's logits.div_(temperature)):
 *   lse     = max(z) + log Σ_j exp(z_j − max(z))
 *   logp    = z[target] − lse
 *   entropy = lse − Σ_j softmax(z)_j·z_j  =  log s − Σ_j e^{z_j−m}(z_j−m) / s   (s = Σ_j e^{z_j−m})
 *   backward: dlogits = dlogp·(onehot(target) − p)/T + dentropy·(−p∘(log p + H))/T
 * The second form of the entropy has no cancellation between two large terms. Sums over the
 * vocabulary are accumulated in double.
 * Source: verl logprobs_from_logits (log_softmax + gather) and entropy_from_logits.
 * Contract and shapes: src/kernels/kernels.h.
 */
#include "base/common.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

/* Below this many logits the work is done on one thread. */
#define LOGPROB_PAR_MIN_ELEMS 32768

/* e^x for x ≤ 0 (also accurate for 0 < x < 88), written so that loops over it vectorise:
 * x = k·ln2 + r with k = round(x·log2 e) and |r| ≤ ln2/2 (ln2 split into an exact 9-bit head
 * and a tail so k·ln2_hi is exact), e^r by its degree-7 Taylor polynomial (truncation error
 * r^8/8! < 3e-9 relative), 2^k assembled in the exponent bits. Measured against double exp:
 * ≤ 2 ulp on [−87.3, 0]. Results below 2^−126 (x < −87.3) flush to 0; e^−inf = 0; NaN stays NaN. */
static inline float logprob_exp(float x) {
    const float t = x * 1.44269504088896341f;
    const float y = t + 12582912.0f; /* 1.5·2^23: y's low mantissa bits now hold round(t) */
    const float kf = y - 12582912.0f;
    uint32_t yi; /* unsigned: the bit arithmetic below wraps instead of overflowing */
    memcpy(&yi, &y, sizeof yi);
    const uint32_t ebits = (yi - 0x4B400000u + 127u) << 23;
    float two_k;
    memcpy(&two_k, &ebits, sizeof two_k);
    const float r = (x - kf * 0.693359375f) - kf * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return x < -87.3f ? 0.0f : p * two_k;
}

/* Row statistics of z = l/T: m = max z, s = Σ e^{z−m}, and (when want_sz) sz = Σ e^{z−m}(z−m). */
static void logprob_row_stats(const float *l, int V, float T, float *m_out, double *s_out, double *sz_out) {
    float mx = -INFINITY;
    #pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; j++) mx = l[j] > mx ? l[j] : mx;
    const float m = mx / T; /* T > 0: max(l)/T == max(l/T) exactly */
    double s = 0.0, sz = 0.0;
    if (sz_out) {
        #pragma omp simd reduction(+ : s, sz)
        for (int j = 0; j < V; j++) {
            const float d = l[j] / T - m;
            const float e = logprob_exp(d);
            s += e;
            sz += (double)(e * d);
        }
    } else {
        #pragma omp simd reduction(+ : s)
        for (int j = 0; j < V; j++) s += logprob_exp(l[j] / T - m);
    }
    *m_out = m;
    *s_out = s;
    if (sz_out) *sz_out = sz;
}

void logprob_forward(float *logp, float *entropy, float *lse_out, const float *logits, const int *target,
                     int N, int V, float temperature) {
    MOERL_ASSERT(N >= 0 && V > 0);
    MOERL_ASSERT(temperature > 0.0f);
    #pragma omp parallel for schedule(static) if ((long)N * V >= LOGPROB_PAR_MIN_ELEMS)
    for (int n = 0; n < N; n++) {
        const int t = target[n];
        MOERL_ASSERT(t < V);
        const float *l = logits + (size_t)n * V;
        const int need_entropy = entropy && t >= 0;
        float m;
        double s, sz = 0.0;
        if (t < 0 && !lse_out) { /* masked row, nothing else asked for */
            logp[n] = 0.0f;
            if (entropy) entropy[n] = 0.0f;
            continue;
        }
        logprob_row_stats(l, V, temperature, &m, &s, need_entropy ? &sz : NULL);
        const float log_s = (float)log(s);
        if (lse_out) lse_out[n] = m + log_s;
        logp[n] = t >= 0 ? (l[t] / temperature - m) - log_s : 0.0f;
        if (entropy) entropy[n] = need_entropy ? (float)(log(s) - sz / s) : 0.0f;
    }
}

void logprob_backward(float *dlogits, const float *dlogp, const float *dentropy, const float *logits,
                      const int *target, int N, int V, float temperature) {
    MOERL_ASSERT(N >= 0 && V > 0);
    MOERL_ASSERT(temperature > 0.0f);
    const float T = temperature;
    #pragma omp parallel for schedule(static) if ((long)N * V >= LOGPROB_PAR_MIN_ELEMS)
    for (int n = 0; n < N; n++) {
        const int t = target[n];
        MOERL_ASSERT(t < V);
        const float *l = logits + (size_t)n * V;
        float *g = dlogits + (size_t)n * V;
        const float a = t >= 0 ? dlogp[n] : 0.0f; /* weight of the logp term */
        const float b = dentropy ? dentropy[n] : 0.0f;
        if (a == 0.0f && b == 0.0f) {
            memset(g, 0, (size_t)V * sizeof(float));
            continue;
        }
        float m;
        double s, sz = 0.0;
        logprob_row_stats(l, V, T, &m, &s, b != 0.0f ? &sz : NULL);
        const float log_s = (float)log(s);
        const float H = (float)(log(s) - sz / s);
        const float inv_s = (float)(1.0 / s), inv_T = 1.0f / T;
        /* p_j = e^{z_j−m}/s, log p_j = (z_j − m) − log s;
         * g_j = (−a·p_j − b·p_j·(log p_j + H)) / T, plus a/T at the target. */
        #pragma omp simd
        for (int j = 0; j < V; j++) {
            const float d = l[j] / T - m;
            const float p = logprob_exp(d) * inv_s;
            g[j] = -p * (a + b * ((d - log_s) + H)) * inv_T;
        }
        if (t >= 0) g[t] += a * inv_T;
    }
}
