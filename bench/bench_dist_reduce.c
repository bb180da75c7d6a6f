/* bench_dist_reduce — data-parallel gradient reduction (dist_grad_reducer): the EXPOSED communication
 * time per step (the time dist_reducer_finish blocks) and its share of the step (backward + reduce),
 * overlap off vs on (communication thread; polling between layers), for several bucket caps.
 *
 * Model: the benchmark configuration (hidden 256, 4 layers, 8 heads, 2 kv heads, head_dim 32, 16 experts
 * top-4, moe_intermediate 128, vocab 512, untied; 7.2 M parameters = 28.9 MB of fp32 gradients). Every
 * rank is a trainer with its own batch of --batch × --seqlen random tokens.
 *
 * Two kinds of backward (model_backward has no per-layer hook yet):
 *   real      model_backward, then dist_reducer_layer_done for every group in backward order. All
 *             buckets become ready at once, so overlap can only pipeline buckets with each other.
 *   layered   the same compute split into per-layer slices: before the timed runs, model_backward's
 *             median time is measured and each of the L decoder layers is emulated by SGEMMs of
 *             256×256×256 (OpenBLAS, like the real backward) calibrated to 1/L of it; the reducer is told
 *             after each slice that the layer is done (head group with the first slice, embedding with
 *             the last). This is what the trainer gets once model_backward calls the reducer per layer.
 * The repetitions cycle through all configurations (one step each per round), so all of them see the
 * same machine load. Reported per configuration: medians over --reps steps (after one warm-up round;
 * each time the slowest rank's) of backward, exposed communication and step time, the step's excess
 * over the baseline without reduction ("none", same backward kind: vs_none_ms), the exposed share = exposed / step, and the plain allreduce time of the
 * whole gradient in one bucket (overlap off, no compute) as the communication peer.
 *
 * Reading it: exposed_ms alone flatters overlap when all cores already run backward — the
 * communication thread's shared-memory copies then slow backward down instead (compare step_ms and
 * vs_none_ms). On a machine shared with other jobs the compute time itself moves by up to 2× between
 * rounds; run it on a quiet machine and look at the medians.
 * Run: mpirun --oversubscribe -np 2 build/mpi/bench/bench_dist_reduce (bench/run_dist.sh).
 * Usage: bench_dist_reduce [--reps R] [--batch B] [--seqlen T] [--bucket-mb a,b,...]
 *                          [--backward real|layered|both] */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "model/model.h"
#include "bench_util.h"



/* Largest value over the trainer group (exact: each rank fills its slot, a sum assembles them). */
static double max_over_trainers(dist_ctx *ctx, double v) {
    double *s = xcalloc((size_t)ctx->trainer_size, sizeof(double));
    s[ctx->trainer_rank] = v;
    dist_allreduce_sum(ctx, DIST_TRAINERS, s, ctx->trainer_size);
    double m = 0;
    for (int i = 0; i < ctx->trainer_size; i++) m = fmax(m, s[i]);
    free(s);
    return m;
}

#define GE 256
static float *ga, *gb, *gc;
static void gemm_unit(void) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GE, GE, GE, 1.0f, ga, GE, gb, GE, 0.0f, gc, GE);
}

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    dist_ctx *ctx = dist_init(&argc, &argv);
    if (!ctx) {
        fprintf(stderr, "bench_dist_reduce: %s\n", moerl_last_error());
        return 1;
    }
    int reps = 7, B = 2, T = 128, kind_lo = 0, kind_hi = 1;
    double mbs[8] = {25, 4, 1};
    int n_mb = 3;
    for (int a = 1; a < argc; a++) {
        if (a + 1 >= argc) goto usage;
        if (!strcmp(argv[a], "--reps")) reps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--batch")) B = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--seqlen")) T = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--backward")) {
            const char *k = argv[++a];
            if (!strcmp(k, "real")) kind_lo = kind_hi = 0;
            else if (!strcmp(k, "layered")) kind_lo = kind_hi = 1;
            else if (strcmp(k, "both")) goto usage;
        }
        else if (!strcmp(argv[a], "--bucket-mb")) {
            const char *s = argv[++a];
            n_mb = 0;
            while (*s && n_mb < 8) {
                char *end;
                mbs[n_mb++] = strtod(s, &end);
                if (end == s || mbs[n_mb - 1] <= 0) goto usage;
                s = *end == ',' ? end + 1 : end;
            }
        } else goto usage;
    }
    if (reps < 1 || B < 1 || T < 1 || n_mb < 1) goto usage;
    if (ctx->world_size < 2) {
        printf("bench_dist_reduce: backend %s with %d rank: needs >= 2 ranks; run it under mpirun "
               "(bench/run_dist.sh)\n",
               dist_backend_name(), ctx->world_size);
        dist_finalize(ctx);
        return 0;
    }
    if (dist_split_roles(ctx, ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "bench_dist_reduce: %s\n", moerl_last_error());
        return 1;
    }
    const int me = ctx->trainer_rank;
    moe_config c = bench_model_config(T);
    const int L = c.num_hidden_layers;
    moe_model m;
    if (model_init(&m, &c) != MOERL_OK) {
        fprintf(stderr, "bench_dist_reduce: %s\n", moerl_last_error());
        return 1;
    }
    model_init_random(&m, 1234);
    const int N = B * T;
    model_acts a;
    if (model_acts_init(&a, &m, N) != MOERL_OK) {
        fprintf(stderr, "bench_dist_reduce: %s\n", moerl_last_error());
        return 1;
    }
    int *tok = xmalloc(N * sizeof(int)), *tgt = xmalloc(N * sizeof(int)), *cu = xmalloc((B + 1) * sizeof(int));
    float *dlogp = xmalloc(N * sizeof(float));
    rng_state rng;
    rng_seed(&rng, 99 + (uint64_t)me);
    for (int n = 0; n < N; n++) {
        tok[n] = (int)rng_below(&rng, c.vocab_size);
        tgt[n] = (int)rng_below(&rng, c.vocab_size);
        dlogp[n] = -1.0f / (N * ctx->trainer_size);
    }
    for (int b = 0; b <= B; b++) cu[b] = b * T;
    MOERL_ASSERT(model_forward(&m, &a, tok, cu, NULL, B, N) == MOERL_OK);
    model_logprobs(&m, &a, tgt, 1.0f, 0);

    /* calibrate: median model_backward time (max over ranks), then SGEMMs per emulated layer */
    double *tb = xmalloc((size_t)MOERL_MAX(reps, 5) * sizeof(double));
    for (int r = 0; r < 5; r++) {
        model_zero_grad(&m);
        const double t0 = moerl_now();
        model_backward(&m, &a, dlogp, NULL, c.router_aux_loss_coef);
        tb[r] = moerl_now() - t0;
    }
    const double t_bwd = max_over_trainers(ctx, bench_median_sorted(tb, 5));
    ga = xalloc_aligned(GE * GE * sizeof(float));
    gb = xalloc_aligned(GE * GE * sizeof(float));
    gc = xalloc_aligned(GE * GE * sizeof(float));
    for (int i = 0; i < GE * GE; i++) ga[i] = gb[i] = 0.001f * (float)(i % 97);
    for (int i = 0; i < 3; i++) gemm_unit();
    const double tg0 = moerl_now();
    for (int i = 0; i < 20; i++) gemm_unit();
    const double t_unit = (moerl_now() - tg0) / 20;
    double units_d = t_bwd / L / t_unit;
    dist_allreduce_sum(ctx, DIST_TRAINERS, &units_d, 1); /* the same count on every rank */
    const int units = MOERL_MAX(1, (int)lround(units_d / ctx->trainer_size));

    /* the communication peer: the whole gradient in one blocking allreduce, no compute */
    double peer;
    {
        dist_grad_reducer *r = dist_reducer_new(ctx, &m, 1e6, DIST_OVERLAP_OFF);
        double *t = xmalloc(reps * sizeof(double));
        for (int k = -1; k < reps; k++) {
            dist_barrier(ctx, DIST_TRAINERS);
            const double e = dist_reducer_finish(r);
            if (k >= 0) t[k] = max_over_trainers(ctx, e);
        }
        peer = bench_median_sorted(t, reps);
        free(t);
        dist_reducer_free(r);
    }
    if (me == 0) {
        int threads = 1;
#ifdef _OPENMP
        threads = omp_get_max_threads();
#endif
        printf("bench_dist_reduce: backend %s, %d trainer ranks, %d compute thread(s) each, batch %d x %d tokens "
               "per rank, %zu floats (%.1f MB) of gradients, %d reps (median)\n",
               dist_backend_name(), ctx->trainer_size, threads, B, T, m.n_params, m.n_params * 4 / 1e6, reps);
        printf("  model_backward %.2f ms; layered backward: %d SGEMM(%d^3) per layer (%.3f ms each)\n", 1e3 * t_bwd,
               units, GE, 1e3 * t_unit);
        printf("  peer: whole-gradient allreduce, no compute: %.2f ms (%.2f GB/s of gradient)\n", 1e3 * peer,
               m.n_params * 4 / peer / 1e9);
        printf("%9s %8s %7s %8s %12s %12s %10s %9s %10s\n", "backward", "overlap", "bucket", "buckets", "backward_ms",
               "exposed_ms", "step_ms", "exposed%", "vs_none_ms");
    }
    const char *mode_name[3] = {"off", "thread", "poll"};
    /* configurations: per backward kind a baseline without any reduction ("none": the step is the
     * backward alone), then every bucket cap × overlap mode. All reducers are made up front and the
     * repetitions cycle through the configurations (one step each per round), so all of them see the
     * same machine load (shared cores). */
    typedef struct { int layered, mode, mi; dist_grad_reducer *r; } bench_cfg;
    bench_cfg *cfg = xcalloc((size_t)2 * (1 + 3 * n_mb), sizeof *cfg);
    int n_cfg = 0;
    for (int layered = kind_lo; layered <= kind_hi; layered++) {
        cfg[n_cfg++] = (bench_cfg){layered, -1, 0, NULL};
        for (int mi = 0; mi < n_mb; mi++)
            for (int mode = DIST_OVERLAP_OFF; mode <= DIST_OVERLAP_POLL; mode++) {
                dist_grad_reducer *r = dist_reducer_new(ctx, &m, mbs[mi], (dist_overlap)mode);
                if (!r) {
                    fprintf(stderr, "bench_dist_reduce: %s\n", moerl_last_error());
                    dist_abort(ctx, "reducer");
                }
                cfg[n_cfg++] = (bench_cfg){layered, mode, mi, r};
            }
    }
    double *te = xcalloc((size_t)n_cfg * reps, sizeof(double)), *ts = xcalloc((size_t)n_cfg * reps, sizeof(double)),
           *tbk = xcalloc((size_t)n_cfg * reps, sizeof(double));
    for (int k = -1; k < reps; k++)
        for (int ci = 0; ci < n_cfg; ci++) {
            dist_grad_reducer *r = cfg[ci].r;
            model_zero_grad(&m);
            dist_barrier(ctx, DIST_TRAINERS);
            const double t0 = moerl_now();
            if (!cfg[ci].layered) {
                model_backward(&m, &a, dlogp, NULL, c.router_aux_loss_coef);
                for (int g = L; g >= -1 && r; g--) dist_reducer_layer_done(r, g);
            } else {
                if (r) dist_reducer_layer_done(r, L); /* head: before the first layer's compute */
                for (int l = L - 1; l >= 0; l--) {
                    for (int u = 0; u < units; u++) gemm_unit();
                    if (r) dist_reducer_layer_done(r, l);
                }
                if (r) dist_reducer_layer_done(r, -1);
            }
            const double t1 = moerl_now();
            const double e = r ? dist_reducer_finish(r) : 0.0;
            const double t2 = moerl_now();
            if (k >= 0) {
                te[ci * reps + k] = max_over_trainers(ctx, e);
                ts[ci * reps + k] = max_over_trainers(ctx, t2 - t0);
                tbk[ci * reps + k] = max_over_trainers(ctx, t1 - t0);
            }
        }
    double base_step = 0;
    for (int ci = 0; ci < n_cfg; ci++) {
        const double me_e = bench_median_sorted(te + ci * reps, reps), me_s = bench_median_sorted(ts + ci * reps, reps),
                     me_b = bench_median_sorted(tbk + ci * reps, reps);
        if (cfg[ci].mode < 0) base_step = me_s;
        char bucket[32] = "-", nbk[16] = "-";
        if (cfg[ci].r) {
            snprintf(bucket, sizeof bucket, "%gMB", mbs[cfg[ci].mi]);
            snprintf(nbk, sizeof nbk, "%d", dist_reducer_n_buckets(cfg[ci].r));
        }
        if (me == 0)
            printf("%9s %8s %7s %8s %12.2f %12.2f %10.2f %8.1f%% %+10.2f\n", cfg[ci].layered ? "layered" : "real",
                   cfg[ci].mode < 0 ? "none" : mode_name[cfg[ci].mode], bucket, nbk, 1e3 * me_b, 1e3 * me_e,
                   1e3 * me_s, 100 * me_e / me_s, 1e3 * (me_s - base_step));
        dist_reducer_free(cfg[ci].r);
    }
    free(cfg);
    free(te);
    free(ts);
    free(tbk);
    free(tb);
    free(tok);
    free(tgt);
    free(cu);
    free(dlogp);
    free(ga);
    free(gb);
    free(gc);
    model_acts_free(&a);
    model_free(&m);
    dist_finalize(ctx);
    return 0;
usage:
    if (ctx->world_rank == 0)
        fprintf(stderr, "usage: bench_dist_reduce [--reps R>=1] [--batch B] [--seqlen T] [--bucket-mb a,b,...] "
                        "[--backward real|layered|both]\n");
    dist_finalize(ctx);
    return 2;
}
