/* RMSNorm forward and backward (fp32 data, statistics accumulated in double).
 *
 *   forward:  r[n] = 1/sqrt(mean_c x[n,c]² + eps);   out[n,c] = w[c] · (x[n,c] · r[n])
 *   backward: g = w∘dout;  dx = g·r − x·r³·mean(g∘x);  dw[c] += Σ_n dout[n,c]·x[n,c]·r[n]
 * Source: HF Qwen3MoeRMSNorm (no bias, no +1 on the weight); the backward is the derivative of
 * that formula (the same expression llm.c's layernorm backward reduces to without the mean).
 * Contract and shapes: src/kernels/kernels.h.
 */
#include "base/common.h"
#include "kernels/kernels.h"
#include "kernels/cpu/kpar.h"

#include <math.h>
#include <string.h>

/* Below this many elements the work is done on one thread (a parallel region costs more). */
#define RMSNORM_PAR_MIN_ELEMS 32768
/* Columns of dw owned by one task in the weight-gradient pass. */
#define RMSNORM_DW_COLS 64

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    MOERL_ASSERT(N >= 0 && C > 0);
    #pragma omp parallel for schedule(static) if (kpar((long)N * C, RMSNORM_PAR_MIN_ELEMS))
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *yr = out + (size_t)n * C;
        double ss = 0.0;
        #pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        const float r = 1.0f / sqrtf((float)(ss / C) + eps);
        rstd[n] = r;
        /* out may alias x: each element is read once before it is written. */
        #pragma omp simd
        for (int c = 0; c < C; c++) yr[c] = w[c] * (xr[c] * r);
    }
}

void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, int N, int C, int accumulate_dx) {
    MOERL_ASSERT(N >= 0 && C > 0);
    const int par = kpar((long)N * C, RMSNORM_PAR_MIN_ELEMS);
    (void)par; /* read only by the OpenMP pragmas (unused in NO_OPENMP builds) */
    /* 1. dw first, because dx may alias dout. Each task owns a block of columns, so the sum
     *    over rows has a fixed order (deterministic) and needs no reduction between threads. */
    if (dw) {
        const int nblk = (C + RMSNORM_DW_COLS - 1) / RMSNORM_DW_COLS;
        #pragma omp parallel for schedule(static) if (par)
        for (int blk = 0; blk < nblk; blk++) {
            const int c0 = blk * RMSNORM_DW_COLS;
            const int nc = MOERL_MIN(RMSNORM_DW_COLS, C - c0);
            double acc[RMSNORM_DW_COLS] = {0};
            for (int n = 0; n < N; n++) {
                const float *dr = dout + (size_t)n * C + c0, *xr = x + (size_t)n * C + c0;
                const float r = rstd[n];
                #pragma omp simd
                for (int c = 0; c < nc; c++) acc[c] += (double)(dr[c] * (xr[c] * r));
            }
            for (int c = 0; c < nc; c++) dw[c0 + c] += (float)acc[c];
        }
    }
    if (!dx) return;
    /* 2. dx row by row. */
    #pragma omp parallel for schedule(static) if (par)
    for (int n = 0; n < N; n++) {
        const float *dr = dout + (size_t)n * C, *xr = x + (size_t)n * C;
        float *dxr = dx + (size_t)n * C;
        const float r = rstd[n];
        double s = 0.0;
        #pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++) s += (double)(w[c] * dr[c]) * xr[c];
        const float k = (float)(s / C) * r * r * r;
        if (accumulate_dx) {
            #pragma omp simd
            for (int c = 0; c < C; c++) dxr[c] += w[c] * dr[c] * r - xr[c] * k;
        } else {
            #pragma omp simd
            for (int c = 0; c < C; c++) dxr[c] = w[c] * dr[c] * r - xr[c] * k;
        }
    }
}
