/* SwiGLU activation on the stacked gate/up layout: gate_up[n] = [gate (I) | up (I)].
 *
 *   forward:  out = silu(g)·u,  silu(g) = g·σ(g) = g / (1 + e^{−g})
 *   backward: dg = dout·u·σ(g)·(1 + g·(1 − σ(g))),   du = dout·silu(g)
 * Source: HF Qwen3MoeMLP (down_proj(act_fn(gate_proj(x)) * up_proj(x)), act_fn = SiLU) and
 * torch's silu_backward formula. Contract and shapes: src/kernels/kernels.h.
 */
#include "base/common.h"
#include "kernels/kernels.h"
#include "kernels/cpu/kpar.h"

#include <math.h>

#include "kernels/cpu/vexp.h"

/* Below this many elements the work is done on one thread. */
#define SWIGLU_PAR_MIN_ELEMS 32768

void swiglu_forward(float *out, const float *gate_up, int N, int I) {
    MOERL_ASSERT(N >= 0 && I >= 0);
    #pragma omp parallel for schedule(static) if (kpar((long)N * I, SWIGLU_PAR_MIN_ELEMS))
    for (int n = 0; n < N; n++) {
        const float *g = gate_up + (size_t)n * 2 * I, *u = g + I;
        float *o = out + (size_t)n * I;
        #pragma omp simd
        for (int i = 0; i < I; i++) o[i] = g[i] * vsigmoid(g[i]) * u[i];
    }
}

void swiglu_backward(float *dgate_up, const float *dout, const float *gate_up, int N, int I) {
    MOERL_ASSERT(N >= 0 && I >= 0);
    #pragma omp parallel for schedule(static) if (kpar((long)N * I, SWIGLU_PAR_MIN_ELEMS))
    for (int n = 0; n < N; n++) {
        const float *g = gate_up + (size_t)n * 2 * I, *u = g + I;
        const float *d = dout + (size_t)n * I;
        float *dg = dgate_up + (size_t)n * 2 * I, *du = dg + I;
        #pragma omp simd
        for (int i = 0; i < I; i++) {
            /* σ(g) via the vectorised exp (within 1 ulp of expf; 0 < σ ≤ 1 for every finite g) */
            const float sig = vsigmoid(g[i]);
            const float gi = g[i], ui = u[i], di = d[i];
            dg[i] = di * ui * (sig * (1.0f + gi * (1.0f - sig)));
            du[i] = di * (gi * sig);
        }
    }
}
