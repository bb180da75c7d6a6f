/* One MoE layer forward + backward: the fused pipeline against the naive HF-style path, same
 * inputs, measured interleaved in the same run (each repetition runs both back to back).
 *
 * fused : router logits (linear) → top-k (router_topk_forward) → permute (moe_permute_index +
 *         moe_permute_forward) → grouped GEMM gate_up → SwiGLU → grouped GEMM down → unpermute
 *         (weighted); backward through the same stages in reverse, then the router.
 * naive : router logits → top-k → moe_naive_forward (loop over experts, scan the selections,
 *         gather, per-expert GEMMs, scatter-add); backward moe_naive_backward (which recomputes
 *         each expert's forward, as HF's path keeps no grouped activations) → top-k backward →
 *         router backward. Both paths produce dx, d router weight, d gate_up, d down.
 * Output: median and best times over the repetitions, the speed-up naive / fused (target ≥ 2×)
 * as the median of the per-repetition ratios and as best / best, and each fused stage's median
 * and best time and share of the fused time (median stage time / median fused total).
 *
 * Shapes: bench = the benchmark model (N=1024 tokens, H=256, E=16, top-4, I=128);
 *         qwen3 = Qwen3-30B-A3B H=2048 and I=768 with E=32, top-2, N=1024 (scaled to fit).
 * Usage: build/bench/bench_moe_layer [repetitions (default 7, minimum 5)] [bench|qwen3|all]
 *        (default bench)
 */
#include "base/common.h"
#include "base/rng.h"
#include "kernels/kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#include "bench_util.h"
#endif
#undef I /* <complex.h> via cblas.h */

char *openblas_get_corename(void); /* OpenBLAS extension, not declared in every cblas.h */


static double vmin(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}
static double vmax(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

enum {
    ST_ROUTER, ST_TOPK, ST_PERMUTE, ST_GATE_UP, ST_SWIGLU, ST_DOWN, ST_UNPERMUTE,
    ST_B_UNPERMUTE, ST_B_DOWN, ST_B_SWIGLU, ST_B_GATE_UP, ST_B_PERMUTE, ST_B_TOPK, ST_B_ROUTER, ST_COUNT
};
static const char *stage_name[ST_COUNT] = {
    "router logits", "top-k", "permute", "gate_up GEMM", "swiglu", "down GEMM", "unpermute",
    "bwd unpermute", "bwd down GEMM", "bwd swiglu", "bwd gate_up GEMM", "bwd permute", "bwd top-k",
    "bwd router"};

typedef struct {
    int N, H, E, K, I;
    /* parameters and upstream gradient */
    float *x, *Wr, *Wgu, *Wd, *dout;
    /* activations (fused) */
    float *logits, *probs, *topk_w, *permuted, *gate_up, *act, *y, *out;
    int *ids, *row_idx, *sorted_row, *pos, *tpe, *off;
    /* gradients and scratch */
    float *dx, *dWr, *dWgu, *dWd, *dy, *dtw, *dact, *dgu, *dperm, *dlog;
} layer;

static float *falloc(size_t n) { return xalloc_aligned(n * sizeof(float)); }
static int *ialloc(size_t n) { return xalloc_aligned(n * sizeof(int)); }

static void layer_init(layer *L, int N, int H, int E, int K, int I, uint64_t seed) {
    memset(L, 0, sizeof *L);
    L->N = N; L->H = H; L->E = E; L->K = K; L->I = I;
    const size_t M = (size_t)N * K;
    L->x = falloc((size_t)N * H); L->Wr = falloc((size_t)E * H); L->Wgu = falloc((size_t)E * 2 * I * H);
    L->Wd = falloc((size_t)E * H * I); L->dout = falloc((size_t)N * H);
    L->logits = falloc((size_t)N * E); L->probs = falloc((size_t)N * E); L->topk_w = falloc(M);
    L->permuted = falloc(M * H); L->gate_up = falloc(M * 2 * I); L->act = falloc(M * I); L->y = falloc(M * H);
    L->out = falloc((size_t)N * H);
    L->ids = ialloc(M); L->row_idx = ialloc(M); L->sorted_row = ialloc(M); L->pos = ialloc(M);
    L->tpe = ialloc(E); L->off = ialloc(E + 1);
    L->dx = falloc((size_t)N * H); L->dWr = falloc((size_t)E * H); L->dWgu = falloc((size_t)E * 2 * I * H);
    L->dWd = falloc((size_t)E * H * I); L->dy = falloc(M * H); L->dtw = falloc(M); L->dact = falloc(M * I);
    L->dgu = falloc(M * 2 * I); L->dperm = falloc(M * H); L->dlog = falloc((size_t)N * E);
    rng_state r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < (size_t)N * H; i++) L->x[i] = rng_normal(&r);
    for (size_t i = 0; i < (size_t)E * H; i++) L->Wr[i] = 0.02f * rng_normal(&r);
    for (size_t i = 0; i < (size_t)E * 2 * I * H; i++) L->Wgu[i] = 0.02f * rng_normal(&r);
    for (size_t i = 0; i < (size_t)E * H * I; i++) L->Wd[i] = 0.02f * rng_normal(&r);
    for (size_t i = 0; i < (size_t)N * H; i++) L->dout[i] = rng_normal(&r);
}

static void layer_free(layer *L) {
    float *f[] = {L->x, L->Wr, L->Wgu, L->Wd, L->dout, L->logits, L->probs, L->topk_w, L->permuted, L->gate_up,
                  L->act, L->y, L->out, L->dx, L->dWr, L->dWgu, L->dWd, L->dy, L->dtw, L->dact, L->dgu, L->dperm,
                  L->dlog};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    int *p[] = {L->ids, L->row_idx, L->sorted_row, L->pos, L->tpe, L->off};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* Fused forward + backward; st[ST_COUNT] receives each stage's seconds. Returns the total. */
static double fused_step(layer *L, double *st) {
    const int N = L->N, H = L->H, E = L->E, K = L->K, I = L->I, M = N * K;
    double t[ST_COUNT + 1];
    t[0] = moerl_now();
    linear_forward(L->logits, L->x, L->Wr, N, H, E, 0);
    t[1] = moerl_now();
    router_topk_forward(L->probs, L->ids, L->topk_w, L->row_idx, L->logits, N, E, K, 1);
    t[2] = moerl_now();
    moe_permute_index(L->sorted_row, L->pos, L->tpe, L->off, L->ids, L->row_idx, N, E, K);
    moe_permute_forward(L->permuted, L->x, L->sorted_row, N, M, H);
    t[3] = moerl_now();
    grouped_gemm_forward(L->gate_up, L->permuted, L->Wgu, L->off, E, H, 2 * I);
    t[4] = moerl_now();
    swiglu_forward(L->act, L->gate_up, M, I);
    t[5] = moerl_now();
    grouped_gemm_forward(L->y, L->act, L->Wd, L->off, E, I, H);
    t[6] = moerl_now();
    moe_unpermute_forward(L->out, L->y, L->topk_w, L->pos, N, K, H);
    t[7] = moerl_now();
    moe_unpermute_backward(L->dy, L->dtw, L->dout, L->y, L->topk_w, L->pos, N, K, H);
    t[8] = moerl_now();
    grouped_gemm_backward(L->dact, L->dWd, L->dy, L->act, L->Wd, L->off, E, I, H);
    t[9] = moerl_now();
    swiglu_backward(L->dgu, L->dact, L->gate_up, M, I);
    t[10] = moerl_now();
    grouped_gemm_backward(L->dperm, L->dWgu, L->dgu, L->permuted, L->Wgu, L->off, E, H, 2 * I);
    t[11] = moerl_now();
    memset(L->dx, 0, (size_t)N * H * sizeof(float));
    moe_permute_backward(L->dx, L->dperm, L->sorted_row, N, M, H);
    t[12] = moerl_now();
    router_topk_backward(L->dlog, L->dtw, NULL, L->probs, L->ids, N, E, K, 1);
    t[13] = moerl_now();
    linear_backward(L->dx, L->dWr, L->dlog, L->x, L->Wr, N, H, E, 1);
    t[14] = moerl_now();
    for (int s = 0; s < ST_COUNT; s++) st[s] = t[s + 1] - t[s];
    return t[ST_COUNT] - t[0];
}

/* Naive forward + backward (same router, HF expert loop). Returns seconds. */
static double naive_step(layer *L) {
    const int N = L->N, H = L->H, E = L->E, K = L->K, I = L->I;
    double t0 = moerl_now();
    linear_forward(L->logits, L->x, L->Wr, N, H, E, 0);
    router_topk_forward(L->probs, L->ids, L->topk_w, L->row_idx, L->logits, N, E, K, 1);
    moe_naive_forward(L->out, L->x, L->Wgu, L->Wd, L->ids, L->topk_w, N, H, E, K, I);
    moe_naive_backward(L->dx, L->dWgu, L->dWd, L->dtw, L->dout, L->x, L->Wgu, L->Wd, L->ids, L->topk_w, N, H, E, K,
                       I);
    router_topk_backward(L->dlog, L->dtw, NULL, L->probs, L->ids, N, E, K, 1);
    linear_backward(L->dx, L->dWr, L->dlog, L->x, L->Wr, N, H, E, 1);
    return moerl_now() - t0;
}

static void run_shape(const char *name, int N, int H, int E, int K, int I, int reps) {
    layer L;
    layer_init(&L, N, H, E, K, I, 7);
    double *tf = xmalloc((size_t)reps * sizeof(double)), *tn = xmalloc((size_t)reps * sizeof(double));
    double *sp = xmalloc((size_t)reps * sizeof(double)), *st = xmalloc((size_t)reps * ST_COUNT * sizeof(double));
    double one[ST_COUNT];
    /* check once that the two paths agree (a bench of wrong code is meaningless) */
    fused_step(&L, one);
    float *out_f = falloc((size_t)N * H), *dx_f = falloc((size_t)N * H);
    memcpy(out_f, L.out, (size_t)N * H * sizeof(float));
    memcpy(dx_f, L.dx, (size_t)N * H * sizeof(float));
    naive_step(&L);
    double dmax = 0, ref = 0;
    for (size_t i = 0; i < (size_t)N * H; i++) {
        dmax = fmax(dmax, fabs(out_f[i] - L.out[i]) + fabs(dx_f[i] - L.dx[i]));
        ref = fmax(ref, fabs(L.out[i]) + fabs(L.dx[i]));
    }
    free(out_f); free(dx_f);
    for (int rep = 0; rep < reps; rep++) {
        tf[rep] = fused_step(&L, st + (size_t)rep * ST_COUNT);
        tn[rep] = naive_step(&L);
        sp[rep] = tn[rep] / tf[rep];
    }
    const double mf = bench_median(tf, reps), mn = bench_median(tn, reps), msp = bench_median(sp, reps);
    const double bf = vmin(tf, reps), bn = vmin(tn, reps);
    printf("%s: N=%d H=%d E=%d K=%d I=%d (max |fused − naive| of out and dx: %.2e, scale %.2e)\n", name, N, H, E, K, I,
           dmax, ref);
    printf("  fused fwd+bwd median %8.3f ms (best %8.3f) | naive fwd+bwd median %8.3f ms (best %8.3f)\n", 1e3 * mf,
           1e3 * bf, 1e3 * mn, 1e3 * bn);
    printf("  speed-up naive/fused: median over repetitions %.2fx (range %.2f-%.2f), best/best %.2fx\n", msp,
           vmin(sp, reps), vmax(sp, reps), bn / bf);
    printf("  fused stages: median ms, best ms, share = median stage / median fused total:\n");
    double col[64], fsum = 0, bsum = 0;
    for (int s = 0; s < ST_COUNT; s++) {
        for (int r = 0; r < reps; r++) col[r] = st[(size_t)r * ST_COUNT + s];
        double m = bench_median(col, reps);
        if (s < ST_B_UNPERMUTE) fsum += m;
        else bsum += m;
        printf("    %-18s %8.3f %8.3f %5.1f%%\n", stage_name[s], 1e3 * m, 1e3 * vmin(col, reps), 100 * m / mf);
    }
    printf("    (sum of stage medians: forward %.1f%%, backward %.1f%% of the median total)\n", 100 * fsum / mf,
           100 * bsum / mf);
    free(tf); free(tn); free(sp); free(st);
    layer_free(&L);
}

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv); /* OpenBLAS kernels as the moerl CLI gets them (common.h) */
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    const char *which = argc > 2 ? argv[2] : "bench";
    if (reps < 5 || reps > 64) {
        fprintf(stderr, "bench_moe_layer: repetitions must be in [5, 64] (got %s)\n", argv[1]);
        return 2;
    }
    if (strcmp(which, "all") && strcmp(which, "bench") && strcmp(which, "qwen3")) {
        fprintf(stderr, "bench_moe_layer: shape must be bench, qwen3 or all (got %s)\n", which);
        return 2;
    }
    int omp = 1;
#ifdef _OPENMP
    omp = omp_get_max_threads();
#endif
    printf("bench_moe_layer: OpenBLAS core %s (%s build), %d OpenBLAS threads, %d OpenMP threads, %d repetitions\n",
           openblas_get_corename(),
           openblas_get_parallel() == 2 ? "OpenMP" : openblas_get_parallel() == 1 ? "pthread" : "serial",
           openblas_get_num_threads(), omp, reps);
    if (!strcmp(which, "all") || !strcmp(which, "bench")) run_shape("bench", 1024, 256, 16, 4, 128, reps);
    if (!strcmp(which, "all") || !strcmp(which, "qwen3")) run_shape("qwen3", 1024, 2048, 32, 2, 768, reps);
    return 0;
}
