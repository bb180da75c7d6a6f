/* bench_moe_ablation — the Ascend MoE practice's ablation table, reproduced on moerl's production
 * code: each optimisation switched off on its own (model.h moe_exec_opts, the model.moe.* keys),
 * measured against the full configuration in the same run.
 *
 * Configurations (each differs from "full" in one switch):
 *   full                 everything on (moerl's default)
 *   loop                 per_expert_loop: HF-style loop over experts   (practice: sorted permute +
 *                        grouped GEMM cut training time by 60%)
 *   separate permute     separate_permute                               (fused: −15%)
 *   per-expert weights   per_expert_weights                             (pre-stacked: −15%)
 *   row_idx rebuilt      rebuild_row_idx                                (handed on: +2% rollout)
 *   not packed (NZ off)  no_pack                                        (NZ: ~1%)
 * Measurements, every configuration once per repetition, interleaved (load from other processes
 * hits all alike), medians over the repetitions:
 *   layer   one MoE layer forward + backward of the benchmark model's shape (N = 1024 tokens,
 *           H 256, 16 experts top-4, I 128): mlp_forward + mlp_backward, the code the trainer runs;
 *   step    the whole training step of the benchmark model (bench_train_step's: 4 × 256 tokens,
 *           forward, logprobs, backward with the aux loss, AdamW);
 *   decode  rollout-engine decode tokens/s at batch 1 and 32 (prompt 16, 32 new tokens, the
 *           first step — prefill — not timed), on the benchmark model (A) and, with --model B,
 *           the 433 MB model of bench_decode (H 512, 8 layers, 32 experts top-4).
 * Printed: each configuration's medians, and the change the optimisation makes, i.e. time
 * (full) / time (switched off) − 1 for the training measurements (negative = the optimisation
 * saves time, as the practice reports) and tokens/s (full) / tokens/s (off) − 1 for decode
 * (positive = the optimisation speeds rollout up), each as the median of the per-repetition
 * ratios, and as best / best (the least disturbed repetition of each); the practice's figure
 * beside it. Target: the MoE layer at least 2× faster fused than
 * with the per-expert loop (layer: loop / full ≥ 2).
 *
 * Also printed: the layer's forward and backward medians of the fused path and of the loop.
 * --profile FILE: after the measurements, R more layer runs of the full configuration alone with
 * a Chrome trace (Perfetto) written to FILE: the stage spans of the MoE driver
 * (src/model/forward.c: router, gate_up GEMM + SwiGLU, down GEMM, ..., thread 0's view, so a
 * stage's span is its wall time up to its closing barrier).
 *
 * --layer qwen3-30b-a3b: the layer measurements at Qwen3-30B-A3B's MoE shape instead (H 2048,
 * 128 experts top-8, I 768; ~10 GB of fp32 weights, gradients and scratch), N = --tokens (default
 * 1024); implies --no-step (the whole-model step is the benchmark model's). At that shape an
 * expert sees N·8/128 rows (64 at N 1024) where the benchmark model's sees N·4/16 (256).
 *
 * Usage: bench_moe_ablation [--reps R (≥ 3, default 5)] [--model A|B] [--no-decode] [--no-step]
 *                           [--layer bench|qwen3-30b-a3b] [--tokens N] [--profile TRACE.json]
 * Threads: OMP_NUM_THREADS (OpenBLAS is the OpenMP build and shares the pool).
 */
#include "base/common.h"
#include "base/rng.h"
#include "base/trace.h"
#include "model/forward.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "rollout/engine.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "bench_util.h"

char *openblas_get_corename(void);

static double bench_loadavg(void) {
    double l[3];
    return getloadavg(l, 3) < 1 ? -1.0 : l[0];
}

enum { C_FULL, C_LOOP, C_SEP, C_PEW, C_ROWIDX, C_NOPACK, N_CONF };
static const char *conf_name[N_CONF] = {"full", "loop over experts", "separate permute", "per-expert weights",
                                        "row_idx rebuilt", "not packed (NZ off)"};
static const char *opt_name[N_CONF] = {"", "sorted permute + grouped GEMM vs per-expert loop",
                                       "fused vs separate permute/unpermute",
                                       "pre-stacked vs per-expert weight buffers", "row_idx handed on vs rebuilt",
                                       "weights pre-packed (NZ) vs not"};
static const char *practice[N_CONF] = {"", "-60% train", "-15% train", "-15% train", "+2% rollout", "~1%"};

static moe_exec_opts conf_exec(int k) {
    moe_exec_opts e = {0};
    if (k == C_LOOP) e.per_expert_loop = 1;
    if (k == C_SEP) e.separate_permute = 1;
    if (k == C_PEW) e.per_expert_weights = 1;
    if (k == C_ROWIDX) e.rebuild_row_idx = 1;
    if (k == C_NOPACK) e.no_pack = 1;
    return e;
}

/* --------------------------------------------------------------- MoE layer / training step */

typedef struct {
    moe_model m;
    model_acts a[N_CONF];
    adamw_state opt;
    int N, B;
    int *tok, *tgt, *cu;
    float *x, *out, *dout, *dx, *dlogp;
} train_ctx;

/* The layer's shape: the benchmark model's, or (big) Qwen3-30B-A3B's MoE layer on a one-layer
 * model (attention and vocabulary only as large as the model needs to exist). */
static moe_config layer_config(int T, int big) {
    moe_config c = bench_model_config(T);
    if (big) {
        c.hidden_size = 2048;
        c.moe_intermediate_size = 768;
        c.num_experts = 128;
        c.num_experts_per_tok = 8;
        c.num_hidden_layers = 1;
        c.num_attention_heads = 4;
        c.num_key_value_heads = 4;
        c.head_dim = 128;
    }
    return c;
}

static void train_init(train_ctx *t, int B, int T, int big, int with_optimizer) {
    moe_config c = layer_config(T, big);
    MOERL_ASSERT(model_init(&t->m, &c) == MOERL_OK);
    model_init_random(&t->m, 1);
    t->N = B * T;
    t->B = B;
    const int N = t->N, H = c.hidden_size;
    for (int k = 0; k < N_CONF; k++) { /* activations laid out per configuration (switch scratch) */
        t->m.cfg.exec = conf_exec(k);
        MOERL_ASSERT(model_acts_init(&t->a[k], &t->m, N) == MOERL_OK);
    }
    t->m.cfg.exec = conf_exec(C_FULL);
    adamw_config oc = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                       .max_grad_norm = 1.0f};
    if (with_optimizer) adamw_init(&t->opt, &t->m, oc);
    t->tok = xmalloc(N * sizeof(int));
    t->tgt = xmalloc(N * sizeof(int));
    t->cu = xmalloc((B + 1) * sizeof(int));
    rng_state r;
    rng_seed(&r, 5);
    for (int i = 0; i < N; i++) {
        t->tok[i] = (int)rng_below(&r, (uint64_t)c.vocab_size);
        t->tgt[i] = (int)rng_below(&r, (uint64_t)c.vocab_size);
    }
    for (int b = 0; b <= B; b++) t->cu[b] = b * T;
    t->x = xmalloc((size_t)N * H * sizeof(float));
    t->out = xmalloc((size_t)N * H * sizeof(float));
    t->dout = xmalloc((size_t)N * H * sizeof(float));
    t->dx = xmalloc((size_t)N * H * sizeof(float));
    t->dlogp = xmalloc(N * sizeof(float));
    for (long i = 0; i < (long)N * H; i++) {
        t->x[i] = rng_normal(&r);
        t->dout[i] = rng_normal(&r);
    }
    for (int i = 0; i < N; i++) t->dlogp[i] = -1.0f / N;
}

/* One MoE layer (layer 0) forward + backward with configuration k; seconds (the forward's share
 * in *fwd). */
static double layer_run(train_ctx *t, int k, double *fwd) {
    t->m.cfg.exec = conf_exec(k);
    const double t0 = moerl_now();
    mlp_forward(&t->m, 0, t->x, t->out, &t->a[k].layers[0].mlp, t->N, NULL, NULL);
    const double t1 = moerl_now();
    mlp_backward(&t->m, &t->a[k], 0, t->x, t->dout, t->dx, t->N);
    const double dt = moerl_now() - t0;
    model_zero_grad(&t->m);
    *fwd = t1 - t0;
    return dt;
}

/* One training step with configuration k (lr tiny: the weights barely move between steps); seconds. */
static double step_run(train_ctx *t, int k) {
    t->m.cfg.exec = conf_exec(k);
    model_acts *a = &t->a[k];
    const double t0 = moerl_now();
    MOERL_ASSERT(model_forward(&t->m, a, t->tok, t->cu, NULL, t->B, t->N) == MOERL_OK);
    model_logprobs(&t->m, a, t->tgt, 1.0f, 0);
    model_backward(&t->m, a, t->dlogp, NULL, t->m.cfg.router_aux_loss_coef);
    double gn;
    adamw_step(&t->opt, &t->m, 1e-6f, 1.0f, &gn);
    model_zero_grad(&t->m);
    return moerl_now() - t0;
}

/* --------------------------------------------------------------- decode */

static moe_config decode_config(const char *which) {
    moe_config c = bench_model_config(64);
    if (!strcmp(which, "B")) {
        c.vocab_size = 2048;
        c.hidden_size = 512;
        c.num_hidden_layers = 8;
        c.head_dim = 64;
        c.num_experts = 32;
        c.moe_intermediate_size = 256;
        c.intermediate_size = 1024;
    }
    return c;
}

/* Decode tokens/s of `batch` requests (prompt 16, max_tokens 32) in an engine with configuration
 * k's switches; the first step (prefill of every prompt + first tokens) is not timed. */
static double decode_run(const moe_model *m, int k, int batch) {
    moe_config c = m->cfg;
    c.exec = conf_exec(k);
    const int plen = 16, max_tokens = 32;
    engine_config ec = {.max_num_seqs = batch, .max_model_len = plen + max_tokens + 1,
                        .max_num_batched_tokens = batch * plen};
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m->params, m->n_params, 0) == MOERL_OK);
    int *prompt = xmalloc(plen * sizeof(int));
    for (int i = 0; i < plen; i++) prompt[i] = (i * 37 + 11) % c.vocab_size;
    gen_request *r = xcalloc((size_t)batch, sizeof *r);
    gen_request **done = xmalloc((size_t)batch * sizeof *done);
    for (int i = 0; i < batch; i++) {
        r[i].id = i;
        r[i].prompt = prompt;
        r[i].prompt_len = plen;
        r[i].sp = (sampling_params){.temperature = 1.0f, .top_p = 1.0f, .seed = (uint64_t)i + 1,
                                    .max_tokens = max_tokens, .ignore_eos = 1};
        MOERL_ASSERT(engine_add(e, &r[i]) == MOERL_OK);
    }
    int n_done = engine_step(e, done, batch); /* prefill */
    const double t0 = moerl_now();
    while (n_done < batch) n_done += engine_step(e, done + n_done, batch - n_done);
    const double dt = moerl_now() - t0;
    for (int i = 0; i < batch; i++) {
        gen_request_free_outputs(&r[i]);
    }
    free(r); free(done); free(prompt);
    engine_free(e);
    return (double)batch * (max_tokens - 1) / dt;
}

/* --------------------------------------------------------------- report */

static void report(const char *what, double v[N_CONF][64], int reps, int is_rate, const char *unit, double scale) {
    printf("\n%s (median over %d repetitions):\n", what, reps);
    double col[64];
    for (int k = 0; k < N_CONF; k++) {
        for (int r = 0; r < reps; r++) col[r] = v[k][r];
        const double med = bench_median(col, reps);
        if (k == C_FULL) {
            printf("  %-22s %10.2f %s\n", conf_name[k], med * scale, unit);
            continue;
        }
        /* per repetition: the optimisation's effect = full / off − 1 (time: negative saves) */
        for (int r = 0; r < reps; r++) col[r] = v[C_FULL][r] / v[k][r] - 1.0;
        const double eff = bench_median(col, reps);
        double lo = col[0], hi = col[0];
        for (int r = 1; r < reps; r++) { lo = fmin(lo, col[r]); hi = fmax(hi, col[r]); }
        /* best/best: interference from other processes only ever slows a run down, so on a shared
         * machine the best repetition of each configuration is the least disturbed figure */
        double bf = v[C_FULL][0], bk = v[k][0];
        for (int r = 1; r < reps; r++) {
            bf = is_rate ? fmax(bf, v[C_FULL][r]) : fmin(bf, v[C_FULL][r]);
            bk = is_rate ? fmax(bk, v[k][r]) : fmin(bk, v[k][r]);
        }
        printf("  %-22s %10.2f %s   %-46s median %+6.1f%% (range %+.1f..%+.1f), best/best %+6.1f%%  practice %s\n",
               conf_name[k], med * scale, unit, opt_name[k], 100 * eff, 100 * lo, 100 * hi, 100 * (bf / bk - 1.0),
               practice[k]);
    }
}

/* A whole decimal int argument, or −1 (rejected by the range checks): "4x", "" and overflow are not counts. */
static int parse_count(const char *s) {
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    return errno || end == s || *end || v < INT_MIN || v > INT_MAX ? -1 : (int)v;
}

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    int reps = 5, do_decode = 1, do_step = 1, big = 0, tokens = 1024, tokens_set = 0;
    const char *which = "A", *profile = NULL, *layer = "bench";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = parse_count(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) which = argv[++i];
        else if (!strcmp(argv[i], "--no-decode")) do_decode = 0;
        else if (!strcmp(argv[i], "--no-step")) do_step = 0;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc) profile = argv[++i];
        else if (!strcmp(argv[i], "--layer") && i + 1 < argc) layer = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = parse_count(argv[++i]), tokens_set = 1;
        else {
            fprintf(stderr, "usage: bench_moe_ablation [--reps R (3..64)] [--model A|B] [--no-decode] [--no-step] "
                            "[--layer bench|qwen3-30b-a3b] [--tokens N] [--profile TRACE.json]\n");
            return 2;
        }
    }
    if (reps < 3 || reps > 64 || (strcmp(which, "A") && strcmp(which, "B"))) {
        fprintf(stderr, "bench_moe_ablation: --reps must be in [3, 64] and --model A or B\n");
        return 2;
    }
    if ((strcmp(layer, "bench") && strcmp(layer, "qwen3-30b-a3b")) || tokens < 4 || tokens % 4 || tokens > 65536) {
        fprintf(stderr, "bench_moe_ablation: --layer must be bench or qwen3-30b-a3b and --tokens a multiple of 4 "
                        "in [4, 65536]\n");
        return 2;
    }
    big = !strcmp(layer, "qwen3-30b-a3b");
    if (tokens_set && !big && tokens != 1024) {
        fprintf(stderr, "bench_moe_ablation: --tokens applies to --layer qwen3-30b-a3b (the benchmark shape is 1024 "
                        "tokens: its training step uses the same activations)\n");
        return 2;
    }
    if (big) do_step = 0;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("bench_moe_ablation: OpenBLAS core %s, %d threads, %d repetitions, load average %.2f at start\n",
           openblas_get_corename(), threads, reps, bench_loadavg());
    static double lay[N_CONF][64], fwd[N_CONF][64], stp[N_CONF][64], d1[N_CONF][64], d32[N_CONF][64];
    train_ctx t;
    train_init(&t, 4, tokens / 4, big, do_step);
    for (int k = 0; k < N_CONF; k++) { /* warm-up */
        layer_run(&t, k, &fwd[k][0]);
        if (do_step) step_run(&t, k);
    }
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < N_CONF; k++) {
            lay[k][r] = layer_run(&t, k, &fwd[k][r]);
            if (do_step) stp[k][r] = step_run(&t, k);
        }
    if (profile) { /* extra repetitions of the full configuration alone, traced */
        if (trace_open(profile) != MOERL_OK) {
            fprintf(stderr, "bench_moe_ablation: --profile: %s\n", moerl_last_error());
            return 1;
        }
        for (int r = 0; r < reps; r++) {
            double f;
            layer_run(&t, C_FULL, &f);
        }
        if (trace_close() != MOERL_OK) {
            fprintf(stderr, "bench_moe_ablation: --profile: %s\n", moerl_last_error());
            return 1;
        }
        printf("bench_moe_ablation: trace of %d more layer runs of the full configuration in %s\n", reps, profile);
    }
    {
        const moe_config *c = &t.m.cfg;
        char title[200];
        snprintf(title, sizeof title,
                 "MoE layer forward + backward (N %d, H %d, E %d top-%d, I %d), production mlp_forward/mlp_backward",
                 t.N, c->hidden_size, c->num_experts, c->num_experts_per_tok, c->moe_intermediate_size);
        report(title, lay, reps, 0, "ms", 1e3);
        const double gflop = 6.0 * t.N * c->num_experts_per_tok * 3.0 * c->hidden_size * c->moe_intermediate_size / 1e9;
        double col[64];
        for (int r = 0; r < reps; r++) col[r] = lay[C_FULL][r];
        printf("  expert GEMMs: %.2f GFLOP per forward + backward, full path at %.1f GFLOP/s (median)\n", gflop,
               gflop / bench_median(col, reps));
    }
    {
        double col[64];
        for (int r = 0; r < reps; r++) col[r] = lay[C_LOOP][r] / lay[C_FULL][r];
        double bf = lay[C_FULL][0], bl = lay[C_LOOP][0];
        for (int r = 1; r < reps; r++) { bf = fmin(bf, lay[C_FULL][r]); bl = fmin(bl, lay[C_LOOP][r]); }
        printf("  loop / full on the MoE layer: median %.2fx, best/best %.2fx (target >= 2x)\n", bench_median(col, reps),
               bl / bf);
        for (int k = C_FULL; k <= C_LOOP; k++) { /* forward / backward split */
            double cf[64], cb[64];
            for (int r = 0; r < reps; r++) {
                cf[r] = fwd[k][r];
                cb[r] = lay[k][r] - fwd[k][r];
            }
            printf("  %-22s forward %.2f ms, backward %.2f ms (medians)\n", conf_name[k], 1e3 * bench_median(cf, reps),
                   1e3 * bench_median(cb, reps));
        }
    }
    if (do_step) {
        report("training step (benchmark model, 4 x 256 tokens: forward, backward, AdamW)", stp, reps, 0, "ms", 1e3);
        double col[64];
        for (int r = 0; r < reps; r++) col[r] = stp[C_LOOP][r] / stp[C_FULL][r];
        printf("  loop / full on the training step: %.2fx\n", bench_median(col, reps));
    }
    if (do_decode) {
        moe_config c = decode_config(which);
        moe_model m;
        MOERL_ASSERT(model_init_inference(&m, &c) == MOERL_OK);
        model_init_random(&m, 2);
        for (int k = 0; k < N_CONF; k++) decode_run(&m, k, 1); /* warm-up */
        for (int r = 0; r < reps; r++)
            for (int k = 0; k < N_CONF; k++) {
                d1[k][r] = decode_run(&m, k, 1);
                d32[k][r] = decode_run(&m, k, 32);
            }
        char title[160];
        snprintf(title, sizeof title, "decode batch 1, model %s (tokens/s; effect = rate full / rate off - 1)", which);
        report(title, d1, reps, 1, "tok/s", 1.0);
        snprintf(title, sizeof title, "decode batch 32, model %s (tokens/s; effect = rate full / rate off - 1)", which);
        report(title, d32, reps, 1, "tok/s", 1.0);
        model_free(&m);
    }
    printf("\nload average %.2f at the end\n", bench_loadavg());
    return 0;
}
