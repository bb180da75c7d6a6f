/* Grouped GEMM over stacked expert weights: each expert's contiguous row group of the
 * permuted activations times that expert's matrix, forward and backward.
 *
 * Work split: a group is one expert's rows; a large group is further split into column
 * blocks of its output, so that there are about GG_ITEMS_PER_THREAD work items per OpenMP
 * thread. Items run in an OpenMP loop (dynamic schedule), each one calling a single-threaded
 * cblas_sgemm; bench/bench_grouped_gemm.c measures this against one sgemm of equal FLOPs and
 * against the plain serial loop of per-expert OpenBLAS-threaded sgemms.
 * OpenBLAS must run single-threaded inside the loop (two OpenMP threads each driving a
 * multi-threaded OpenBLAS oversubscribe the cores; measured several times slower):
 *  - OpenMP builds of OpenBLAS (openblas_get_parallel() == 2, what the Makefile links) do so
 *    by themselves inside a parallel region, and nothing is changed;
 *  - pthread builds get openblas_set_num_threads(1) for the duration of the loop, restored
 *    after. Side effect there: BLAS calls made meanwhile by OTHER threads of the process run
 *    single-threaded (results unaffected, only their speed).
 * (In OpenMP builds openblas_set_num_threads calls omp_set_num_threads, which would shrink
 * this very loop to one thread — hence the distinction.)
 * Source: Megatron-LM GroupedMLP / the grouped_gemm package (semantics); the layout is
 * W[E,O,I], expert g's [O,I] matrix at W + g·O·I (PyTorch [out, in]).
 */
#include "base/common.h"
#include "kernels/kernels.h"

#include <cblas.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I would rename the I parameters. */
#undef I

/* Work items aimed at per thread (dynamic scheduling balances unequal groups). */
#define GG_ITEMS_PER_THREAD 4
/* Narrowest column block a group is split into (a multiple of the 16-float AVX-512 width). */
#define GG_MIN_COLS 64

/* Make OpenBLAS single-threaded for an OpenMP loop of sgemm calls; returns what to restore.
 * OpenBLAS thread controls are declared in its cblas.h (every build). */
static int gg_begin_parallel(void) {
    if (openblas_get_parallel() == 2) return 1; /* OpenMP build: single-threaded in parallel regions */
    int nb = openblas_get_num_threads();
    if (nb != 1) openblas_set_num_threads(1);
    return nb;
}
static void gg_end_parallel(int nb) {
    if (nb != 1) openblas_set_num_threads(nb);
}

/* OpenMP threads to use; 1 when already inside a parallel region (then the loop runs on the
 * calling thread and OpenBLAS's thread count is left alone). */
static int gg_threads(void) {
#ifdef _OPENMP
    return omp_get_level() > 0 ? 1 : omp_get_max_threads(); /* never nest, even inside an inactive region */
#else
    return 1;
#endif
}

/* How many column blocks each group is cut into (uniform cap; per group it is
 * min(cap, ceil(rows / target_rows))), chosen so the items number ≈ GG_ITEMS_PER_THREAD·threads. */
static int gg_max_splits(const int *offsets, int E, int ncols, int nth, int *target_rows) {
    const long M = offsets[E] - offsets[0];
    long tr = (M + (long)GG_ITEMS_PER_THREAD * nth - 1) / ((long)GG_ITEMS_PER_THREAD * nth);
    if (tr < 1) tr = 1;
    *target_rows = (int)tr;
    int cap = ncols / GG_MIN_COLS;
    if (cap < 1) cap = 1;
    int smax = 1;
    for (int g = 0; g < E; g++) {
        long m = offsets[g + 1] - offsets[g];
        int s = (int)MOERL_MIN((long)cap, (m + tr - 1) / tr);
        smax = MOERL_MAX(smax, s);
    }
    return smax;
}

/* Column range [c0, c1) of block `part` of `s` over n columns, in multiples of 16. */
static void gg_block(int part, int s, int n, int *c0, int *c1) {
    const int units = (n + 15) / 16;
    *c0 = MOERL_MIN(n, (int)((long)units * part / s) * 16);
    *c1 = MOERL_MIN(n, (int)((long)units * (part + 1) / s) * 16);
}

/* out[rows of g, :] = a[rows of g, :] · W[g]ᵀ for every expert g (OVERWRITTEN; rows outside
 * [offsets[0], offsets[E]) are not touched). a[M,I], W[E,O,I], out[M,O], offsets[E+1]
 * non-decreasing (expert_offsets from moe_permute_index). Errors: decreasing offsets are a
 * caller bug (asserted). Source: Megatron GroupedMLP forward (grouped_gemm.ops.gmm). */
void grouped_gemm_forward(float *out, const float *a, const float *W, const int *offsets, int E, int I, int O) {
    MOERL_ASSERT(E > 0 && I > 0 && O > 0);
    for (int g = 0; g < E; g++) MOERL_ASSERT(offsets[g + 1] >= offsets[g]);
    const int nth = gg_threads();
    int tr;
    const int smax = gg_max_splits(offsets, E, O, nth, &tr);
    const int cap = MOERL_MAX(1, O / GG_MIN_COLS);
    const int nb = nth > 1 ? gg_begin_parallel() : 1;
#pragma omp parallel for schedule(dynamic, 1) collapse(2) if (nth > 1)
    for (int g = 0; g < E; g++) {
        for (int part = 0; part < smax; part++) {
            const int r0 = offsets[g], m = offsets[g + 1] - offsets[g];
            const int s = (int)MOERL_MIN((long)cap, ((long)m + tr - 1) / tr);
            if (m == 0 || part >= s) continue;
            int c0, c1;
            gg_block(part, s, O, &c0, &c1);
            if (c1 <= c0) continue;
            /* out[r0.., c0:c1] = a_g · W_g[c0:c1, :]ᵀ */
            if (m <= SKINNY_MAX_ROWS) {
                /* decode-sized groups: sgemm would pack W_g for a few rows (measured 3-8x slower
                 * than a matrix-vector product at one row); the skinny kernel reads W_g once */
                gemm_skinny_nt(out + (size_t)r0 * O + c0, O, a + (size_t)r0 * I, W + (size_t)g * O * I + (size_t)c0 * I,
                               m, I, c1 - c0, 0);
                continue;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, c1 - c0, I, 1.0f, a + (size_t)r0 * I, I,
                        W + (size_t)g * O * I + (size_t)c0 * I, I, 0.0f, out + (size_t)r0 * O + c0, O);
        }
    }
    if (nth > 1) gg_end_parallel(nb);
}

/* da[rows of g] = dout_g · W_g (OVERWRITTEN; NULL skips) and dW[g] += dout_gᵀ · a_g
 * (ACCUMULATES; NULL skips; an expert with no rows gets nothing added). Shapes as in the
 * forward: dout[M,O], a[M,I], W and dW [E,O,I]. Each work item owns a column block of da_g
 * and a row block of dW_g, so items never write the same memory.
 * Source: Megatron GroupedMLP backward (dA_g = dY_g·W_g, dW_g = dY_gᵀ·A_g, reference.md). */
void grouped_gemm_backward(float *da, float *dW, const float *dout, const float *a, const float *W,
                           const int *offsets, int E, int I, int O) {
    MOERL_ASSERT(E > 0 && I > 0 && O > 0);
    for (int g = 0; g < E; g++) MOERL_ASSERT(offsets[g + 1] >= offsets[g]);
    if (!da && !dW) return;
    const int nth = gg_threads();
    int tr;
    const int ncols = MOERL_MIN(I, O); /* both da (over I) and dW (over O) are split s ways */
    const int smax = gg_max_splits(offsets, E, ncols, nth, &tr);
    const int cap = MOERL_MAX(1, ncols / GG_MIN_COLS);
    const int nb = nth > 1 ? gg_begin_parallel() : 1;
#pragma omp parallel for schedule(dynamic, 1) collapse(2) if (nth > 1)
    for (int g = 0; g < E; g++) {
        for (int part = 0; part < smax; part++) {
            const int r0 = offsets[g], m = offsets[g + 1] - offsets[g];
            const int s = (int)MOERL_MIN((long)cap, ((long)m + tr - 1) / tr);
            if (m == 0 || part >= s) continue;
            const float *Wg = W + (size_t)g * O * I;
            const float *dy = dout + (size_t)r0 * O;
            const float *ag = a + (size_t)r0 * I;
            int c0, c1;
            if (da) {
                /* da_g[:, c0:c1] = dout_g · W_g[:, c0:c1] */
                gg_block(part, s, I, &c0, &c1);
                if (c1 > c0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, c1 - c0, O, 1.0f, dy, O, Wg + c0, I,
                                0.0f, da + (size_t)r0 * I + c0, I);
            }
            if (dW) {
                /* dW_g[c0:c1, :] += dout_g[:, c0:c1]ᵀ · a_g */
                gg_block(part, s, O, &c0, &c1);
                if (c1 > c0)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, I, m, 1.0f, dy + c0, O, ag, I,
                                1.0f, dW + (size_t)g * O * I + (size_t)c0 * I, I);
            }
        }
    }
    if (nth > 1) gg_end_parallel(nb);
}
