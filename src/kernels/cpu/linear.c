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

#include <cblas.h>
#include <string.h>

/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I (the imaginary unit) would replace the
 * parameter named I (input features) below. */
#ifdef I
#undef I
#endif

/* Row count up to which the forward uses one sgemv per row instead of sgemm. */
#define LINEAR_GEMV_MAX_ROWS 4

/* Zero n floats (or leave them when accumulating): the result of a product with an empty
 * inner dimension, which BLAS must not be asked for (lda would be 0). */
static void linear_empty_product(float *c, size_t n, int accumulate) {
    if (!accumulate) memset(c, 0, n * sizeof(float));
}

void linear_forward(float *out, const float *x, const float *W, int N, int I, int O, int accumulate) {
    MOERL_ASSERT(N >= 0 && I >= 0 && O >= 0);
    if (N == 0 || O == 0) return;
    if (I == 0) { linear_empty_product(out, (size_t)N * O, accumulate); return; }
    if (N <= LINEAR_GEMV_MAX_ROWS) {
        /* decode-sized batches: OpenBLAS's sgemm packs all of W for each call (measured 8x slower
         * than sgemv at one row, 256x256); one matrix-vector product per row reads W once each. */
        for (int n = 0; n < N; n++)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, O, I, 1.0f, W, I, x + (size_t)n * I, 1,
                        accumulate ? 1.0f : 0.0f, out + (size_t)n * O, 1);
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
