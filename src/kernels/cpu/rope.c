/* Rotary position embedding, NEOX / rotate_half layout (element i pairs with i + hd/2).
 *
 *   inv_freq[i] = 1 / theta^(2i/hd)      (fp32, as HF computes it)
 *   angle       = (float)pos · inv_freq[i] (fp32 product, as HF's fp32 matmul of the two)
 *   x_i'        = x_i·cos − x_{i+hd/2}·sin
 *   x_{i+hd/2}' = x_{i+hd/2}·cos + x_i·sin
 * The backward applies the transposed rotation (angle → −angle).
 * Source: HF Qwen3MoeRotaryEmbedding (default rope type) and apply_rotary_pos_emb /
 * rotate_half in transformers/models/qwen3_moe/modeling_qwen3_moe.py.
 * Contract and shapes: src/kernels/kernels.h.
 */
#include "base/common.h"
#include "kernels/kernels.h"
#include "kernels/cpu/kpar.h"

#include <math.h>

/* Below this many elements the work is done on one thread. */
#define ROPE_PAR_MIN_ELEMS 32768

void rope_tables(float *cos_t, float *sin_t, int max_pos, int hd, float theta) {
    MOERL_ASSERT(max_pos >= 0 && hd > 0 && hd % 2 == 0 && theta > 0.0f);
    const int half = hd / 2;
    float inv_freq[half];
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
    #pragma omp parallel for schedule(static) if (kpar((long)max_pos * half, ROPE_PAR_MIN_ELEMS))
    for (int p = 0; p < max_pos; p++) {
        for (int i = 0; i < half; i++) {
            const float ang = (float)p * inv_freq[i];
            /* cos/sin of the fp32 angle, correctly rounded to fp32 via double. */
            cos_t[(size_t)p * half + i] = (float)cos((double)ang);
            sin_t[(size_t)p * half + i] = (float)sin((double)ang);
        }
    }
}

/* Rotate every head of every token by the angle of its position; sign = +1 forward, −1 for
 * the transposed (inverse) rotation. */
static void rope_apply(float *x, const int *pos, const float *cos_t, const float *sin_t, int N, int nheads,
                       int hd, float sign) {
    MOERL_ASSERT(N >= 0 && nheads >= 0 && hd > 0 && hd % 2 == 0);
    const int half = hd / 2;
    #pragma omp parallel for schedule(static) if (kpar((long)N * nheads * hd, ROPE_PAR_MIN_ELEMS))
    for (int n = 0; n < N; n++) {
        MOERL_ASSERT(pos[n] >= 0);
        const float *c = cos_t + (size_t)pos[n] * half;
        const float *s = sin_t + (size_t)pos[n] * half;
        for (int h = 0; h < nheads; h++) {
            float *lo = x + ((size_t)n * nheads + h) * hd, *hi = lo + half;
            #pragma omp simd
            for (int i = 0; i < half; i++) {
                const float a = lo[i], b = hi[i], si = sign * s[i];
                lo[i] = a * c[i] - b * si;
                hi[i] = b * c[i] + a * si;
            }
        }
    }
}

void rope_forward(float *x, const int *pos, const float *cos_t, const float *sin_t, int N, int nheads, int hd) {
    rope_apply(x, pos, cos_t, sin_t, N, nheads, hd, 1.0f);
}

void rope_backward(float *dx, const int *pos, const float *cos_t, const float *sin_t, int N, int nheads, int hd) {
    rope_apply(dx, pos, cos_t, sin_t, N, nheads, hd, -1.0f);
}
