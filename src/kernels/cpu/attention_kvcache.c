/* Attention of new tokens against the KV cache (see kernels.h). One (token, head) pair per
 * OpenMP iteration; scores kept in a per-thread buffer of max_len floats. */
#include <math.h>
#include <stdlib.h>

#include "base/common.h"
#include "kernels/kernels.h"

void attention_kvcache_forward(float *out, const float *q, const float *k_cache, const float *v_cache,
                               const int *slot, const int *pos, int N, int nh, int nkv, int hd, int max_len,
                               float scale) {
    const int group = nh / nkv;
    const size_t row = (size_t)nkv * hd;
#pragma omp parallel
    {
        float *sc = xmalloc((size_t)max_len * sizeof(float));
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int n = 0; n < N; n++) {
            for (int h = 0; h < nh; h++) {
                const int P = pos[n] + 1, kvh = h / group;
                const float *qh = q + ((size_t)n * nh + h) * hd;
                const float *kb = k_cache + (size_t)slot[n] * max_len * row + (size_t)kvh * hd;
                const float *vb = v_cache + (size_t)slot[n] * max_len * row + (size_t)kvh * hd;
                float mx = -INFINITY;
                for (int j = 0; j < P; j++) {
                    const float *kj = kb + (size_t)j * row;
                    float s = 0;
#pragma omp simd reduction(+ : s)
                    for (int d = 0; d < hd; d++) s += qh[d] * kj[d];
                    s *= scale;
                    sc[j] = s;
                    if (s > mx) mx = s;
                }
                float sum = 0;
                for (int j = 0; j < P; j++) {
                    sc[j] = expf(sc[j] - mx);
                    sum += sc[j];
                }
                const float inv = 1.0f / sum;
                float *o = out + ((size_t)n * nh + h) * hd;
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int j = 0; j < P; j++) {
                    const float *vj = vb + (size_t)j * row;
                    const float p = sc[j] * inv;
#pragma omp simd
                    for (int d = 0; d < hd; d++) o[d] += p * vj[d];
                }
            }
        }
        free(sc);
    }
}
