/* Linear layer without bias, y = x · Wᵀ with W stored [out, in] as in PyTorch/HF nn.Linear,
 * forward and backward through OpenBLAS cblas_sgemm (row-major, fp32).
 *
 *   forward:   out[N,O]  (=|+=) x[N,I] · W[O,I]ᵀ
 *   backward:  dx[N,I]   (=|+=) dout[N,O] · W[O,I]
 *              dW[O,I]    +=    dout[N,O]ᵀ · x[N,I]
 * Contract and shapes: src/kernels/kernels.h. Source: torch.nn.functional.linear and its
 * autograd formulas (grad_input = grad·W, grad_weight = gradᵀ·input).
 */
#include "base/common.h"
#include "kernels/kernels.h"
#include "kernels/cpu/kpar.h"

#include <cblas.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I (the imaginary unit) would replace the
 * parameter named I (input features) below. */
#ifdef I
#undef I
#endif

/* Zero n floats (or leave them when accumulating): the result of a product with an empty
 * inner dimension, which BLAS must not be asked for (lda would be 0). */
static void linear_empty_product(float *c, size_t n, int accumulate) {
    if (!accumulate) memset(c, 0, n * sizeof(float));
}

void linear_forward(float *out, const float *x, const float *W, int N, int I, int O, int accumulate) {
    MOERL_ASSERT(N >= 0 && I >= 0 && O >= 0);
    if (N == 0 || O == 0) return;
    if (I == 0) { linear_empty_product(out, (size_t)N * O, accumulate); return; }
    if (N <= SKINNY_MAX_ROWS) {
        /* decode-sized batches: OpenBLAS's sgemm packs all of W for each call (measured 8x slower
         * than a matrix-vector product at one row, 256x256); the skinny kernel reads W once. Split
         * over output columns when called outside a parallel region. */
#ifdef _OPENMP
        const int nth = kpar(1, 1) ? omp_get_max_threads() : 1; /* never nest: an inner team would add threads to the cores */
#else
        const int nth = 1;
#endif
        const int chunks = (O >= 256 && nth > 1) ? nth : 1;
#pragma omp parallel for schedule(static) if (chunks > 1)
        for (int ch = 0; ch < chunks; ch++) {
            int o0 = (int)((long)O * ch / chunks), o1 = (int)((long)O * (ch + 1) / chunks);
            gemm_skinny_nt(out + o0, O, x, W + (size_t)o0 * I, N, I, o1 - o0, accumulate);
        }
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, I, 1.0f, x, I, W, I,
                accumulate ? 1.0f : 0.0f, out, O);
}

void linear_backward(float *dx, float *dW, const float *dout, const float *x, const float *W,
                     int N, int I, int O, int accumulate_dx) {
    MOERL_ASSERT(N >= 0 && I >= 0 && O >= 0);
    if (dx && N > 0 && I > 0) {
        if (O == 0) linear_empty_product(dx, (size_t)N * I, accumulate_dx);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, O, 1.0f, dout, O, W, I,
                        accumulate_dx ? 1.0f : 0.0f, dx, I);
    }
    /* dW += doutᵀ·x; with N == 0 the contribution is zero and dW is left as it is. */
    if (dW && N > 0 && I > 0 && O > 0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, N, 1.0f, dout, O, x, I, 1.0f, dW, I);
}

/* The skinny kernel over row pointers (gemm_skinny_nt builds them from a row-major a). Four rows
 * of W at a time: each a-row is loaded once per four dot products, which stay in registers. */
void gemm_skinny_nt_rows(float *out, int ldo, const float *const *rows, const float *W, int m, int I, int O,
                         int accumulate) {
    MOERL_ASSERT(m >= 0 && I >= 0 && O >= 0);
    int o = 0;
    for (; o + 4 <= O; o += 4) {
        const float *w0 = W + (size_t)o * I, *w1 = w0 + I, *w2 = w1 + I, *w3 = w2 + I;
        for (int r = 0; r < m; r++) {
            const float *x = rows[r];
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int i = 0; i < I; i++) {
                s0 += x[i] * w0[i];
                s1 += x[i] * w1[i];
                s2 += x[i] * w2[i];
                s3 += x[i] * w3[i];
            }
            float *y = out + (size_t)r * ldo + o;
            if (accumulate) { y[0] += s0; y[1] += s1; y[2] += s2; y[3] += s3; }
            else { y[0] = s0; y[1] = s1; y[2] = s2; y[3] = s3; }
        }
    }
    for (; o < O; o++) {
        const float *w0 = W + (size_t)o * I;
        for (int r = 0; r < m; r++) {
            const float *x = rows[r];
            float s0 = 0;
#pragma omp simd reduction(+ : s0)
            for (int i = 0; i < I; i++) s0 += x[i] * w0[i];
            float *y = out + (size_t)r * ldo + o;
            *y = accumulate ? *y + s0 : s0;
        }
    }
}

void gemm_skinny_nt(float *out, int ldo, const float *a, const float *W, int m, int I, int O, int accumulate) {
    MOERL_ASSERT(m >= 0 && I >= 0 && O >= 0);
    enum { CH = 16 };
    const float *rows[CH];
    for (int r0 = 0; r0 < m; r0 += CH) {
        const int n = MOERL_MIN(CH, m - r0);
        for (int r = 0; r < n; r++) rows[r] = a + (size_t)(r0 + r) * I;
        gemm_skinny_nt_rows(out + (size_t)r0 * ldo, ldo, rows, W, n, I, O, accumulate);
    }
}
