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
#include "kernels/cpu/kpar.h"
#include "kernels/cpu/vexp.h"

#include <math.h>
#include <string.h>

/* Below this many logits the work is done on one thread. */
#define LOGPROB_PAR_MIN_ELEMS 32768


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
            const float e = vexp_nonpos(d);
            s += e;
            sz += (double)(e * d);
        }
    } else {
        #pragma omp simd reduction(+ : s)
        for (int j = 0; j < V; j++) s += vexp_nonpos(l[j] / T - m);
    }
    *m_out = m;
    *s_out = s;
    if (sz_out) *sz_out = sz;
}

void logprob_forward(float *logp, float *entropy, float *lse_out, const float *logits, const int *target,
                     int N, int V, float temperature) {
    MOERL_ASSERT(N >= 0 && V > 0);
    MOERL_ASSERT(temperature > 0.0f);
    #pragma omp parallel for schedule(static) if (kpar((long)N * V, LOGPROB_PAR_MIN_ELEMS))
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
    #pragma omp parallel for schedule(static) if (kpar((long)N * V, LOGPROB_PAR_MIN_ELEMS))
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
            const float p = vexp_nonpos(d) * inv_s;
            g[j] = -p * (a + b * ((d - log_s) + H)) * inv_T;
        }
        if (t >= 0) g[t] += a * inv_T;
    }
}
