/* Grouped GEMM over stacked expert weights: each expert's contiguous row group of the
 * permuted activations times that expert's matrix, forward and backward.
 *
 * Work split: a group is one expert's rows, cut into parts (kernels.h, grouped_gemm_forward_team).
 * Items run in an OpenMP loop (dynamic schedule), each one calling moerl's tiled kernel
 * (gemm_tiled.c: a block of output columns for all the group's rows, with the permute's gather,
 * the SwiGLU epilogue and the unpermute backward's weighting fused), or the skinny/packed kernel
 * for decode-sized groups of the forward; grouped_fuse.blas runs them through single-threaded
 * cblas_sgemm instead (the per-expert loop's library GEMM, the ablation baseline). The team forms run inside
 * the caller's parallel region (the model driver, src/model/forward.c, calls them from its
 * layer teams, with the permute gather and SwiGLU fused in); grouped_gemm_forward/backward
 * open a team around them. bench/bench_grouped_gemm.c measures this against one sgemm of
 * equal FLOPs and against the plain serial loop of per-expert OpenBLAS-threaded sgemms.
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

#include "kernels/cpu/kpar.h"
#include "kernels/cpu/vexp.h"
#ifdef _OPENMP
#include <omp.h>
#endif
/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I would rename the I parameters. */
#undef I

/* Work items aimed at per thread (dynamic scheduling balances unequal groups). */
#define GG_ITEMS_PER_THREAD 4
/* Most parts one group is cut into. */
#define GG_MAX_PARTS 16

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

/* Threads of the enclosing team (1 outside a region). */
static int gg_team_threads(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* Parts of a group of m rows out of M, for a team of nt threads: about GG_ITEMS_PER_THREAD·nt
 * items over all groups, in proportion to the rows. */
static int gg_parts(long m, long M, int nt) {
    if (m <= 0) return 0;
    const long target = (long)GG_ITEMS_PER_THREAD * nt;
    long r = (target * m + M - 1) / M;
    return (int)MOERL_MAX(1L, MOERL_MIN((long)GG_MAX_PARTS, r));
}

/* Work items aimed at per thread by the tiled kernel's items, and the narrowest column block
 * one of them gets (in 16-column units): an item packs its expert's rows once per call, so
 * blocks stay wide; dynamic scheduling balances the rest. */
#define GT_ITEMS_PER_THREAD 16
#define GT_MIN_UNITS 2

/* Parts of group g (m rows of M) cut into, for a team of nt threads: decode-sized groups of the
 * forward (fwd) and the OpenBLAS items as gg_parts; the tiled kernel's items by column blocks of `units`
 * 16-column units (at least GT_MIN_UNITS each). */
static int gg_group_parts(long m, long M, int nt, int blas, int units, int fwd) {
    if (m <= 0) return 0;
    if (blas || (fwd && m <= SKINNY_MAX_ROWS)) return gg_parts(m, M, nt);
    const long target = (long)GT_ITEMS_PER_THREAD * nt;
    const long r = (target * m + M - 1) / M;
    return (int)MOERL_MAX(1L, MOERL_MIN(MOERL_MAX(1L, (long)units / GT_MIN_UNITS), MOERL_MIN((long)GG_MAX_PARTS, r)));
}

/* Largest part count over the groups (the bound of the collapsed item loop; the same value on
 * every thread, as an orphaned `omp for` requires). */
static int gg_max_parts(const int *offsets, int E, int nt, int blas, int units, int fwd) {
    const long M = offsets[E] - offsets[0];
    int mx = 1;
    for (int g = 0; g < E; g++)
        mx = MOERL_MAX(mx, gg_group_parts(offsets[g + 1] - offsets[g], M, nt, blas, units, fwd));
    return mx;
}

/* Floats of the per-thread scratch that holds a backward item's block of da when the caller
 * wants only its SwiGLU backward (da NULL): 256 rows of a 128-column block, 128 KB (L2). */
#define GG_DA_SCRATCH (256 * 128)
static _Thread_local float gg_da_scratch[GG_DA_SCRATCH] __attribute__((aligned(64)));

/* Block `part` of `s` over n columns in units of `unit` columns: [c0, c1). */
static void gg_block_u(int part, int s, int n, int unit, int *c0, int *c1) {
    const int units = (n + unit - 1) / unit;
    *c0 = MOERL_MIN(n, (int)((long)units * part / s) * unit);
    *c1 = MOERL_MIN(n, (int)((long)units * (part + 1) / s) * unit);
}

/* Column range [c0, c1) of block `part` of `s` over n columns, in multiples of 16. */
static void gg_block(int part, int s, int n, int *c0, int *c1) {
    const int units = (n + 15) / 16;
    *c0 = MOERL_MIN(n, (int)((long)units * part / s) * 16);
    *c1 = MOERL_MIN(n, (int)((long)units * (part + 1) / s) * 16);
}

/* act[r, c] = silu(gu[r, c])·gu[r, half + c] for rows r < m, columns [c0, c1); strides lda/ldg.
 * Same formula and rounding as swiglu_forward. */
static void gg_swiglu_cols(float *act, int lda, const float *gu, int ldg, int half, int m, int c0, int c1) {
    for (int r = 0; r < m; r++) {
        const float *g = gu + (size_t)r * ldg, *u = g + half;
        float *o = act + (size_t)r * lda;
#pragma omp simd
        for (int c = c0; c < c1; c++) o[c] = g[c] * vsigmoid(g[c]) * u[c];
    }
}

void grouped_gemm_forward_team(float *out, float *a, const float *W, const int *offsets, int E, int I, int O,
                               const grouped_fuse *fuse) {
    MOERL_ASSERT(E > 0 && I > 0 && O > 0);
    const grouped_fuse none = {0};
    const grouped_fuse *f = fuse ? fuse : &none;
    if (f->invariant) { /* moe_exec_opts.batch_invariant: the fixed-order products (batch_invariant.c) */
        grouped_gemm_forward_bi_team(out, a, W, offsets, E, I, O, f);
        return;
    }
    MOERL_ASSERT(!f->swiglu_act || O % 2 == 0);
    const int nt = gg_team_threads();
    const long M = offsets[E] - offsets[0];
    const int half = O / 2;
    const int units = f->swiglu_act ? (half + 7) / 8 : (O + 15) / 16; /* tiled items' column units */
    const int R = gg_max_parts(offsets, E, nt, f->blas, units, 1);
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int g = 0; g < E; g++) {
        for (int p = 0; p < R; p++) {
            const int r0 = offsets[g], m = offsets[g + 1] - offsets[g];
            const int s = gg_group_parts(m, M, nt, f->blas, units, 1);
            if (p >= s) continue;
            const float *Wg = W + (size_t)g * O * I;
            if (m > SKINNY_MAX_ROWS && !f->blas) {
                /* moerl's tiled kernel on a block of output columns for all the group's rows:
                 * the gather inside its packing, SwiGLU as its epilogue (8 activations per tile) */
                int c0, c1;
                gg_block_u(p, s, f->swiglu_act ? half : O, f->swiglu_act ? 8 : 16, &c0, &c1);
                if (f->gather_x && a && p == 0) /* the permuted copy, for a backward that reads it */
                    for (int i = r0; i < r0 + m; i++)
                        memcpy(a + (size_t)i * I, f->gather_x + (size_t)(f->sorted_row[i] % f->n_tokens) * I,
                               (size_t)I * sizeof(float));
                if (c1 <= c0) continue;
                const tg_mat A = f->gather_x ? (tg_mat){.p = f->gather_x, .ld = I, .idx = f->sorted_row + r0,
                                                        .mod = f->n_tokens}
                                             : (tg_mat){.p = a + (size_t)r0 * I, .ld = I};
                const tg_mat B = {.p = Wg + (size_t)c0 * I, .ld = I, .trans = 1}; /* B(i, o) = W_g[o, i] */
                if (f->swiglu_act) {
                    const tg_epi ep = {.kind = TG_EPI_SWIGLU, .half = half,
                                       .act = f->swiglu_act + (size_t)r0 * half + c0, .ld_act = half};
                    gemm_tiled(out + (size_t)r0 * O + c0, O, 0, &A, &B, m, c1 - c0, I, &ep);
                } else {
                    gemm_tiled(out + (size_t)r0 * O + c0, O, 0, &A, &B, m, c1 - c0, I, NULL);
                }
                continue;
            }
            if (m > SKINNY_MAX_ROWS) {
                /* rows [ra, rb) of the group: (gather,) one sgemm over all O columns, (SwiGLU) */
                const int ra = r0 + (int)((long)m * p / s), rb = r0 + (int)((long)m * (p + 1) / s);
                if (rb <= ra) continue;
                if (f->gather_x)
                    for (int i = ra; i < rb; i++)
                        memcpy(a + (size_t)i * I, f->gather_x + (size_t)(f->sorted_row[i] % f->n_tokens) * I,
                               (size_t)I * sizeof(float));
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb - ra, O, I, 1.0f, a + (size_t)ra * I, I, Wg, I,
                            0.0f, out + (size_t)ra * O, O);
                if (f->swiglu_act)
                    gg_swiglu_cols(f->swiglu_act + (size_t)ra * half, half, out + (size_t)ra * O, O, half, rb - ra, 0,
                                   half);
                continue;
            }
            /* decode-sized group: a block of output columns for all its rows, W_g read once
             * (sgemm would pack W_g for a few rows: measured 3-8x slower than a matrix-vector
             * product at one row). With the SwiGLU epilogue the block is [c0, c1) of the gate
             * half and the same columns of the up half, so the item can finish act[:, c0:c1]. */
            int c0, c1;
            gg_block(p, s, f->swiglu_act ? half : O, &c0, &c1);
            const float *rows[SKINNY_MAX_ROWS];
            for (int r = 0; r < m; r++) {
                const int i = r0 + r;
                if (f->gather_x) {
                    rows[r] = f->gather_x + (size_t)(f->sorted_row[i] % f->n_tokens) * I;
                    /* the permuted copy backward needs: part 0 of every group writes it, even
                     * when its column block is empty (fewer 16-column units than parts) */
                    if (p == 0 && a) memcpy(a + (size_t)i * I, rows[r], (size_t)I * sizeof(float));
                } else {
                    rows[r] = a + (size_t)i * I;
                }
            }
            if (c1 <= c0) continue;
            const int nblk = f->swiglu_act ? 2 : 1;
            for (int h = 0; h < nblk; h++) {
                const int o0 = c0 + h * half, o1 = c1 + h * half;
                if (f->nz16 && o0 % 16 == 0)
                    gemm_packed16_nt_rows(out + (size_t)r0 * O + o0, O, rows, f->nz16 + (size_t)g * f->nz_stride, m, I,
                                          o0, o1);
                else if (f->nz && o0 % 16 == 0)
                    gemm_packed_nt_rows(out + (size_t)r0 * O + o0, O, rows, f->nz + (size_t)g * f->nz_stride, m, I, o0,
                                        o1);
                else
                    gemm_skinny_nt_rows(out + (size_t)r0 * O + o0, O, rows, Wg + (size_t)o0 * I, m, I, o1 - o0, 0);
            }
            if (f->swiglu_act)
                gg_swiglu_cols(f->swiglu_act + (size_t)r0 * half, half, out + (size_t)r0 * O, O, half, m, c0, c1);
        }
    }
}

void grouped_gemm_backward_team(float *da, float *dW, const float *dout, const float *a, const float *W,
                                const int *offsets, int E, int I, int O, const grouped_fuse *fuse) {
    MOERL_ASSERT(E > 0 && I > 0 && O > 0);
    const float *sgu = fuse ? fuse->swiglu_gate_up : NULL;
    float *sdgu = fuse ? fuse->swiglu_dgate_up : NULL;
    const int blas = fuse && fuse->blas;
    MOERL_ASSERT(!sdgu || (sgu && (da || !blas))); /* da NULL: the tiled items keep it in scratch */
    if (!da && !dW && !sdgu) return;
    MOERL_ASSERT(!blas || !(fuse->gather_x || fuse->gather_dout)); /* the library items read a and dout as given */
    const int nt = gg_team_threads();
    const long M = offsets[E] - offsets[0];
    const int units = MOERL_MIN((I + 15) / 16, (O + 15) / 16); /* tiled items: columns of da, rows of dW */
    const int R = gg_max_parts(offsets, E, nt, blas, units, 0);
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int g = 0; g < E; g++) {
        for (int p = 0; p < R; p++) {
            const int r0 = offsets[g], m = offsets[g + 1] - offsets[g];
            const int s = gg_group_parts(m, M, nt, blas, units, 0);
            if (p >= s) continue;
            const float *Wg = W + (size_t)g * O * I;
            if (!blas) {
                /* moerl's tiled kernel (any row count): column block p of da_g (SwiGLU backward as its epilogue)
                 * and row block p of dW_g */
                int c0, c1;
                const float *gd = fuse ? fuse->gather_dout : NULL;
                if (da || sdgu) {
                    gg_block_u(p, s, I, 16, &c0, &c1);
                    /* without da, the block goes to this thread's scratch (in L2) for the epilogue,
                     * in chunks of rows that fit it; with da, in place in one call */
                    const int w = c1 - c0, chunk = da ? m : MOERL_MAX(1, GG_DA_SCRATCH / MOERL_MAX(w, 1));
                    MOERL_ASSERT(da || w <= GG_DA_SCRATCH);
                    for (int q0 = 0; q0 < m && w > 0; q0 += chunk) {
                        const int rq = r0 + q0, mq = MOERL_MIN(chunk, m - q0);
                        const tg_mat A = gd ? (tg_mat){.p = gd, .ld = O, .idx = fuse->sorted_row + rq,
                                                       .mod = fuse->n_tokens, .rw = fuse->topk_w, .rk = fuse->topk_k}
                                            : (tg_mat){.p = dout + (size_t)rq * O, .ld = O};
                        const tg_mat B = {.p = Wg + c0, .ld = I}; /* B(o, i) = W_g[o, i] */
                        const tg_epi ep = {.kind = TG_EPI_DSWIGLU, .half = I, .dgu = sdgu + (size_t)rq * 2 * I + c0,
                                           .gu = sgu ? sgu + (size_t)rq * 2 * I + c0 : NULL, .ld_gu = 2 * I};
                        if (da) gemm_tiled(da + (size_t)rq * I + c0, I, 0, &A, &B, mq, w, O, sdgu ? &ep : NULL);
                        else gemm_tiled(gg_da_scratch, w, 0, &A, &B, mq, w, O, &ep);
                    }
                }
                if (dW) {
                    gg_block_u(p, s, O, 16, &c0, &c1);
                    if (c1 > c0) {
                        /* A(o, r) = dout[r, o]: dout's rows are the storage rows (transposed) */
                        const tg_mat A = gd ? (tg_mat){.p = gd + c0, .ld = O, .trans = 1, .idx = fuse->sorted_row + r0,
                                                       .mod = fuse->n_tokens, .rw = fuse->topk_w, .rk = fuse->topk_k}
                                            : (tg_mat){.p = dout + (size_t)r0 * O + c0, .ld = O, .trans = 1};
                        const tg_mat B = fuse && fuse->gather_x
                                             ? (tg_mat){.p = fuse->gather_x, .ld = I, .idx = fuse->sorted_row + r0,
                                                        .mod = fuse->n_tokens}
                                             : (tg_mat){.p = a + (size_t)r0 * I, .ld = I};
                        gemm_tiled(dW + (size_t)g * O * I + (size_t)c0 * I, I, 1, &A, &B, c1 - c0, I, m, NULL);
                    }
                }
                continue;
            }
            if (da) {
                /* rows [ra, rb): da = dout · W_g, then (fused) the SwiGLU backward of those rows */
                const int ra = r0 + (int)((long)m * p / s), rb = r0 + (int)((long)m * (p + 1) / s);
                if (rb > ra) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb - ra, I, O, 1.0f, dout + (size_t)ra * O, O,
                                Wg, I, 0.0f, da + (size_t)ra * I, I);
                    if (sdgu)
                        swiglu_backward(sdgu + (size_t)ra * 2 * I, da + (size_t)ra * I, sgu + (size_t)ra * 2 * I, rb - ra,
                                        I);
                }
            }
            if (dW) {
                /* dW_g[c0:c1, :] += dout_g[:, c0:c1]ᵀ · a_g */
                int c0, c1;
                gg_block(p, s, O, &c0, &c1);
                if (c1 > c0)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, I, m, 1.0f, dout + (size_t)r0 * O + c0,
                                O, a + (size_t)r0 * I, I, 1.0f, dW + (size_t)g * O * I + (size_t)c0 * I, I);
            }
        }
    }
}

/* OpenMP threads for the standalone forms: all of them, or 1 inside any parallel region. */
static int gg_threads(void) {
#ifdef _OPENMP
    return kpar(1, 1) ? omp_get_max_threads() : 1; /* never nest, even inside an inactive region */
#else
    return 1;
#endif
}

/* out[rows of g, :] = a[rows of g, :] · W[g]ᵀ for every expert g (OVERWRITTEN; rows outside
 * [offsets[0], offsets[E]) are not touched). a[M,I], W[E,O,I], out[M,O], offsets[E+1]
 * non-decreasing (expert_offsets from moe_permute_index). Errors: decreasing offsets are a
 * caller bug (asserted). Source: Megatron GroupedMLP forward (grouped_gemm.ops.gmm). */
void grouped_gemm_forward(float *out, const float *a, const float *W, const int *offsets, int E, int I, int O) {
    MOERL_ASSERT(E > 0 && I > 0 && O > 0);
    for (int g = 0; g < E; g++) MOERL_ASSERT(offsets[g + 1] >= offsets[g]);
    const int nth = gg_threads();
    const int nb = nth > 1 ? gg_begin_parallel() : 1;
    /* a is only read: no gather is fused here */
#pragma omp parallel num_threads(nth) if (nth > 1)
    grouped_gemm_forward_team(out, (float *)a, W, offsets, E, I, O, NULL);
    if (nth > 1) gg_end_parallel(nb);
}

/* da[rows of g] = dout_g · W_g (OVERWRITTEN; NULL skips) and dW[g] += dout_gᵀ · a_g
 * (ACCUMULATES; NULL skips; an expert with no rows gets nothing added). Shapes as in the
 * forward: dout[M,O], a[M,I], W and dW [E,O,I].
 * Source: Megatron-LM GroupedMLP backward (dA_g = dY_g·W_g, dW_g = dY_gᵀ·A_g; megatron/core/transformer/moe/experts.py). */
void grouped_gemm_backward(float *da, float *dW, const float *dout, const float *a, const float *W,
                           const int *offsets, int E, int I, int O) {
    MOERL_ASSERT(E > 0 && I > 0 && O > 0);
    for (int g = 0; g < E; g++) MOERL_ASSERT(offsets[g + 1] >= offsets[g]);
    if (!da && !dW) return;
    const int nth = gg_threads();
    const int nb = nth > 1 ? gg_begin_parallel() : 1;
#pragma omp parallel num_threads(nth) if (nth > 1)
    grouped_gemm_backward_team(da, dW, dout, a, W, offsets, E, I, O, NULL);
    if (nth > 1) gg_end_parallel(nb);
}
