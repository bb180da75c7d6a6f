/* Grouped GEMM throughput (src/kernels/cpu/grouped_gemm.c) against ONE cblas_sgemm of the same
 * total FLOPs, measured interleaved in the same run (each repetition times the peer and the
 * grouped GEMM back to back, so load from other processes hits both alike).
 *
 * Shapes (rows grouped by a real router: random logits → router_topk_forward → moe_permute_index):
 *   bench   the benchmark model: H=256, E=16, top-4, expert I=128, 1024 tokens → M=4096 rows;
 *           gate_up [M,256]·[256→256] and down [M,128]·[128→256]
 *   qwen3   a Qwen3-30B-A3B layer scaled to fit: H=2048 and expert I=768 as the real model, but
 *           E=32 experts, top-2 (the real 128/top-8 ratio, so N/16 rows per expert as in the real
 *           model), 2048 tokens by default → M=4096 rows, ~128 per expert;
 *           gate_up [M,2048]·[2048→1536] and down [M,768]·[768→2048]
 * Forward: out = a·W_gᵀ per group vs one sgemm [M,I]·[I,O]. Backward: da = dout·W_g and
 * dW_g += dout_gᵀ·a_g vs the same two products as single sgemms over all M rows.
 * Output per variant: median and best time and GFLOP/s, and the fraction of the single-sgemm
 * FLOP rate it reaches (target ≥ 70% for the grouped GEMM) as the median over repetitions of
 * (peer time / its time) and as best peer / best own (the best is less disturbed by other
 * processes on a shared machine; the median is the headline).
 *
 * The serial loop of per-expert sgemms (each using OpenBLAS's threads) is timed too, as the
 * ablation of the kernel's OpenMP-over-experts design, and the same grouped GEMM with its items
 * run through single-threaded OpenBLAS sgemm (grouped_fuse.blas) instead of moerl's tiled kernel
 * (gemm_tiled.c), the ablation of the kernel itself.
 *
 * Usage: build/bench/bench_grouped_gemm [repetitions (default 7, 5..64)] [bench|qwen3|all]
 *        [qwen3 tokens (default 2048)]
 * The OpenBLAS core in use is printed; main() first calls moerl_blas_coretype_init, so it is
 * the one the moerl CLI gets (OPENBLAS_CORETYPE, if set, wins).
 */
#include "base/common.h"
#include "base/rng.h"
#include "kernels/kernels.h"

#include <cblas.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#include "bench_util.h"
#endif
#undef I /* <complex.h> via cblas.h */

char *openblas_get_corename(void); /* OpenBLAS extension, not declared in every cblas.h */


/* Expert row groups from a real router over random logits: offsets[E+1]. */
static void route(int *offsets, int N, int E, int K, uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    float *logits = xmalloc((size_t)N * E * sizeof(float)), *probs = xmalloc((size_t)N * E * sizeof(float));
    float *w = xmalloc((size_t)N * K * sizeof(float));
    int *ids = xmalloc((size_t)N * K * sizeof(int)), *row_idx = xmalloc((size_t)N * K * sizeof(int));
    int *sorted = xmalloc((size_t)N * K * sizeof(int)), *pos = xmalloc((size_t)N * K * sizeof(int));
    int *tpe = xmalloc((size_t)E * sizeof(int));
    for (long i = 0; i < (long)N * E; i++) logits[i] = rng_normal(&r);
    router_topk_forward(probs, ids, w, row_idx, logits, N, E, K, 1);
    moe_permute_index(sorted, pos, tpe, offsets, ids, row_idx, N, E, K);
    free(logits); free(probs); free(w); free(ids); free(row_idx); free(sorted); free(pos); free(tpe);
}

/* Ablation: the plain alternative — experts one after another, each sgemm using OpenBLAS's own
 * threads (no OpenMP over experts, no column split). */
static void loop_forward(float *out, const float *a, const float *W, const int *off, int E, int I, int O) {
    for (int g = 0; g < E; g++) {
        const int m = off[g + 1] - off[g];
        if (m > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, O, I, 1.0f, a + (size_t)off[g] * I, I,
                        W + (size_t)g * O * I, I, 0.0f, out + (size_t)off[g] * O, O);
    }
}
static void loop_backward(float *da, float *dW, const float *dout, const float *a, const float *W, const int *off,
                          int E, int I, int O) {
    for (int g = 0; g < E; g++) {
        const int m = off[g + 1] - off[g];
        if (m == 0) continue;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, I, O, 1.0f, dout + (size_t)off[g] * O, O,
                    W + (size_t)g * O * I, I, 0.0f, da + (size_t)off[g] * I, I);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, m, 1.0f, dout + (size_t)off[g] * O, O,
                    a + (size_t)off[g] * I, I, 1.0f, dW + (size_t)g * O * I, I);
    }
}

/* The grouped GEMM with its items run through single-threaded cblas_sgemm (grouped_fuse.blas:
 * the per-expert loop's library GEMM) instead of moerl's tiled kernel: the kernel's ablation, same
 * work split as before the kernel existed. OpenBLAS's OpenMP build (what the Makefile links) runs
 * single-threaded inside the region by itself. */
static void blas_items_forward(float *out, const float *a, const float *W, const int *off, int E, int I, int O) {
    const grouped_fuse f = {.blas = 1};
#pragma omp parallel
    grouped_gemm_forward_team(out, (float *)a, W, off, E, I, O, &f);
}
static void blas_items_backward(float *da, float *dW, const float *dout, const float *a, const float *W,
                                const int *off, int E, int I, int O) {
    const grouped_fuse f = {.blas = 1};
#pragma omp parallel
    grouped_gemm_backward_team(da, dW, dout, a, W, off, E, I, O, &f);
}

typedef struct {
    const char *name;
    int M, E, I, O; /* rows, experts, in, out */
    const int *off;
} gg_case;

enum { T_PEER_F, T_GG_F, T_LOOP_F, T_BLAS_F, T_PEER_B, T_GG_B, T_LOOP_B, T_BLAS_B, T_COUNT };

static double vmin(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

/* One line: median and best time and GFLOP/s of `what`, and its ratio to the peer two ways:
 * the median over repetitions of (peer / what) and best peer / best what. */
static void report(const char *label, double flop, double *t_what, double *t_peer, int reps) {
    double *ratio = xmalloc((size_t)reps * sizeof(double));
    for (int i = 0; i < reps; i++) ratio[i] = t_peer[i] / t_what[i];
    const double best = vmin(t_what, reps), best_peer = vmin(t_peer, reps);
    const double med = bench_median(t_what, reps), mr = bench_median(ratio, reps);
    printf("    %-22s median %9.3f ms %7.1f GFLOP/s | best %9.3f ms %7.1f GFLOP/s | vs one sgemm: median ratio %.2f, "
           "best/best %.2f\n",
           label, 1e3 * med, flop / med * 1e-9, 1e3 * best, flop / best * 1e-9, mr, best_peer / best);
    free(ratio);
}

static void run_case(const gg_case *c, int reps) {
    const int M = c->M, E = c->E, I = c->I, O = c->O;
    rng_state r;
    rng_seed(&r, 42);
    float *a = xalloc_aligned((size_t)M * I * sizeof(float)), *W = xalloc_aligned((size_t)E * O * I * sizeof(float));
    float *out = xalloc_aligned((size_t)M * O * sizeof(float)), *dout = xalloc_aligned((size_t)M * O * sizeof(float));
    float *da = xalloc_aligned((size_t)M * I * sizeof(float)), *dW = xalloc_aligned((size_t)E * O * I * sizeof(float));
    for (long i = 0; i < (long)M * I; i++) a[i] = rng_normal(&r);
    for (long i = 0; i < (long)E * O * I; i++) W[i] = 0.02f * rng_normal(&r);
    for (long i = 0; i < (long)M * O; i++) dout[i] = rng_normal(&r);
    int mn = M, mx = 0, idle = 0;
    for (int g = 0; g < E; g++) {
        int m = c->off[g + 1] - c->off[g];
        mn = MOERL_MIN(mn, m); mx = MOERL_MAX(mx, m); idle += m == 0;
    }
    const double flop_f = 2.0 * M * O * I, flop_b = 2 * flop_f;
    double *t[T_COUNT];
    for (int k = 0; k < T_COUNT; k++) t[k] = xmalloc((size_t)reps * sizeof(double));
    /* The peer: one sgemm over all M rows with ONE [O, I] weight (expert 0's slice of W) — the same
     * FLOPs but 1/E of the weight memory traffic; that difference is inherent to MoE and is part
     * of what the ratio measures (it dominates when groups are small and weights large). */
    for (int rep = -1; rep < reps; rep++) { /* rep −1 warms caches and thread pools */
        double s[T_COUNT + 1];
        s[0] = moerl_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, O, I, 1.0f, a, I, W, I, 0.0f, out, O);
        s[1] = moerl_now();
        grouped_gemm_forward(out, a, W, c->off, E, I, O);
        s[2] = moerl_now();
        loop_forward(out, a, W, c->off, E, I, O);
        s[3] = moerl_now();
        blas_items_forward(out, a, W, c->off, E, I, O);
        s[4] = moerl_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, I, O, 1.0f, dout, O, W, I, 0.0f, da, I);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, M, 1.0f, dout, O, a, I, 1.0f, dW, I);
        s[5] = moerl_now();
        grouped_gemm_backward(da, dW, dout, a, W, c->off, E, I, O);
        s[6] = moerl_now();
        loop_backward(da, dW, dout, a, W, c->off, E, I, O);
        s[7] = moerl_now();
        blas_items_backward(da, dW, dout, a, W, c->off, E, I, O);
        s[8] = moerl_now();
        if (rep >= 0)
            for (int k = 0; k < T_COUNT; k++) t[k][rep] = s[k + 1] - s[k];
    }
    printf("%-14s M=%d E=%d in=%d out=%d, rows per expert min %d max %d, idle experts %d\n", c->name, M, E, I, O, mn,
           mx, idle);
    report("forward  one sgemm", flop_f, t[T_PEER_F], t[T_PEER_F], reps);
    report("forward  grouped GEMM", flop_f, t[T_GG_F], t[T_PEER_F], reps);
    report("forward  serial loop", flop_f, t[T_LOOP_F], t[T_PEER_F], reps);
    report("forward  OpenBLAS items", flop_f, t[T_BLAS_F], t[T_PEER_F], reps);
    report("backward one sgemm", flop_b, t[T_PEER_B], t[T_PEER_B], reps);
    report("backward grouped GEMM", flop_b, t[T_GG_B], t[T_PEER_B], reps);
    report("backward serial loop", flop_b, t[T_LOOP_B], t[T_PEER_B], reps);
    report("backward OpenBLAS items", flop_b, t[T_BLAS_B], t[T_PEER_B], reps);
    for (int k = 0; k < T_COUNT; k++) free(t[k]);
    free(a); free(W); free(out); free(dout); free(da); free(dW);
}

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv); /* OpenBLAS kernels as the moerl CLI gets them (common.h) */
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    const char *which = argc > 2 ? argv[2] : "all";
    const int qwen_tokens = argc > 3 ? atoi(argv[3]) : 2048;
    if (qwen_tokens < 16 || qwen_tokens > 16384) {
        fprintf(stderr, "bench_grouped_gemm: qwen3 tokens must be in [16, 16384] (got %s)\n", argv[3]);
        return 2;
    }
    if (reps < 5 || reps > 64) {
        fprintf(stderr, "bench_grouped_gemm: repetitions must be in [5, 64] (got %s)\n", argv[1]);
        return 2;
    }
    if (strcmp(which, "all") && strcmp(which, "bench") && strcmp(which, "qwen3")) {
        fprintf(stderr, "bench_grouped_gemm: shape must be bench, qwen3 or all (got %s)\n", which);
        return 2;
    }
    int omp = 1;
#ifdef _OPENMP
    omp = omp_get_max_threads();
#endif
    printf("bench_grouped_gemm: OpenBLAS core %s (%s build), %d OpenBLAS threads, %d OpenMP threads, %d repetitions "
           "(ratio = one-sgemm time / this time)\n",
           openblas_get_corename(),
           openblas_get_parallel() == 2 ? "OpenMP" : openblas_get_parallel() == 1 ? "pthread" : "serial",
           openblas_get_num_threads(), omp, reps);
    if (!strcmp(openblas_get_corename(), "Prescott") || !strcmp(openblas_get_corename(), "Core2"))
        printf("  note: OpenBLAS did not recognise this CPU and uses a generic SSE3 core; "
               "OPENBLAS_CORETYPE=SkylakeX (AVX-512) or Haswell (AVX2) is several times faster\n");
    if (!strcmp(which, "all") || !strcmp(which, "bench")) {
        enum { N = 1024, H = 256, E = 16, K = 4, I = 128 };
        int off[E + 1];
        route(off, N, E, K, 1);
        gg_case up = {"bench gate_up", N * K, E, H, 2 * I, off};
        gg_case down = {"bench down", N * K, E, I, H, off};
        run_case(&up, reps);
        run_case(&down, reps);
    }
    if (!strcmp(which, "all") || !strcmp(which, "qwen3")) {
        enum { H = 2048, E = 32, K = 2, I = 768 };
        const int N = qwen_tokens;
        int off[E + 1];
        route(off, N, E, K, 2);
        gg_case up = {"qwen3 gate_up", N * K, E, H, 2 * I, off};
        gg_case down = {"qwen3 down", N * K, E, I, H, off};
        run_case(&up, reps);
        run_case(&down, reps);
    }
    return 0;
}
