/* bench_train_step — one full fp32 training step of a small Qwen3-MoE on the CPU.
 *
 * The step is what the trainer does per micro-batch: model_forward on a packed batch
 * (B sequences of T tokens, cu_seqlens), model_logprobs of the targets, model_backward with
 * dlogp[n] = −1/N (token-mean cross-entropy) plus router_aux_loss_coef · aux (HF
 * load_balancing_loss_func), then one adamw_step (global-norm clipping at 1.0) and the gradient
 * reset for the next step. The peer is bench/torch_train_step.py (the same model and step in
 * PyTorch eager, HF Qwen3MoE style); bench/run_train_step.sh runs both and prints the ratio.
 *
 * Model (the benchmark configuration): hidden 256, 4 layers, 8 query heads, 2 kv heads,
 * head_dim 32, 16 experts top-4, moe_intermediate_size 128, vocab 512, intermediate_size 512
 * (unused: every layer is MoE), norm_topk_prob true, untied head, random init as HF
 * (normal(0, 0.02), norms 1). Batch: 4 × 256 tokens, random ids, random targets.
 *
 * Reports the median and min–max over --reps timed steps (after --warmup untimed ones) of the
 * whole step and of each phase (forward, logprobs, backward, optimizer = adamw_step + zero grad),
 * tokens/s of the median step, and the loss of the first step (≈ ln V at this init: a sanity
 * check that both implementations compute the same thing).
 *
 * Usage: bench_train_step [--threads N] [--reps R] [--warmup W] [--batch B] [--seqlen T] [--json]
 *                         [--recompute none|full|selective] [--demo]
 *   --threads sets omp_set_num_threads and openblas_set_num_threads (default: all cores).
 *   --recompute: activation recompute (model.enable_gradient_checkpointing + actor.recompute_granularity,
 *   moe_exec_opts.recompute); the report adds the activation arena's bytes (bench/run_recompute.sh).
 *   --demo: examples/demo.yaml's model (hidden 128, 2 layers, 4/2 heads of 32, 8 experts top-2, expert
 *   width 128, the byte vocabulary) instead of the benchmark configuration.
 *   --json prints one JSON line (fields shared with torch_train_step.py) instead of the text.
 */
#include "base/common.h"
#include "base/rng.h"
#include "data/tokenizer.h" /* TOK_VOCAB_SIZE: the demo model's byte vocabulary */
#include "model/forward.h"
#include "model/model.h"
#include "optim/adamw.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#include "bench_util.h"
#endif

enum { PH_FWD, PH_LOGP, PH_BWD, PH_OPT, PH_STEP, N_PH };
static const char *phase_names[N_PH] = {"forward", "logprobs", "backward", "optimizer", "step"};



static void usage(void) {
    fprintf(stderr, "usage: bench_train_step [--threads N] [--reps R (>= 1)] [--warmup W] [--batch B] "
                    "[--seqlen T] [--json] [--recompute none|full|selective] [--demo]\n");
    exit(2);
}

static int parse_int(const char *flag, const char *s, int lo) {
    char *end;
    const long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > 1000000) {
        fprintf(stderr, "bench_train_step: %s expects an integer >= %d, got '%s'\n", flag, lo, s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    int threads = 0, reps = 10, warmup = 2, B = 4, T = 256, json = 0, rc = MODEL_RECOMPUTE_NONE, demo = 0;
    const char *rc_name = "none";
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--json")) { json = 1; continue; }
        if (!strcmp(argv[a], "--demo")) { demo = 1; continue; }
        if (a + 1 >= argc) usage();
        if (!strcmp(argv[a], "--threads")) threads = parse_int("--threads", argv[++a], 1);
        else if (!strcmp(argv[a], "--reps")) reps = parse_int("--reps", argv[++a], 1);
        else if (!strcmp(argv[a], "--warmup")) warmup = parse_int("--warmup", argv[++a], 0);
        else if (!strcmp(argv[a], "--batch")) B = parse_int("--batch", argv[++a], 1);
        else if (!strcmp(argv[a], "--seqlen")) T = parse_int("--seqlen", argv[++a], 1);
        else if (!strcmp(argv[a], "--recompute")) {
            rc_name = argv[++a];
            if (!strcmp(rc_name, "none")) rc = MODEL_RECOMPUTE_NONE;
            else if (!strcmp(rc_name, "full")) rc = MODEL_RECOMPUTE_FULL;
            else if (!strcmp(rc_name, "selective")) rc = MODEL_RECOMPUTE_SELECTIVE;
            else {
                fprintf(stderr, "bench_train_step: --recompute expects none, full or selective, got '%s'\n", rc_name);
                return 2;
            }
        } else usage();
    }
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
    threads = omp_get_max_threads();
#else
    threads = 1;
#endif
    openblas_set_num_threads(threads);

    moe_config c = bench_model_config(T);
    if (demo) { /* examples/demo.yaml */
        c.vocab_size = TOK_VOCAB_SIZE;
        c.hidden_size = 128;
        c.intermediate_size = 256;
        c.num_hidden_layers = 2;
        c.num_attention_heads = 4;
        c.num_experts = 8;
        c.num_experts_per_tok = 2;
        c.rope_theta = 10000.0f;
    }
    c.exec.recompute = rc;

    moe_model m;
    if (model_init(&m, &c) != MOERL_OK) {
        fprintf(stderr, "bench_train_step: model_init: %s\n", moerl_last_error());
        return 1;
    }
    model_init_random(&m, 1234);
    const int N = B * T, V = c.vocab_size;
    model_acts a;
    if (model_acts_init(&a, &m, N) != MOERL_OK) {
        fprintf(stderr, "bench_train_step: model_acts_init: %s\n", moerl_last_error());
        return 1;
    }
    int *tokens = xmalloc(N * sizeof(int)), *targets = xmalloc(N * sizeof(int)), *cu = xmalloc((B + 1) * sizeof(int));
    float *dlogp = xmalloc(N * sizeof(float));
    rng_state rng;
    rng_seed(&rng, 99);
    for (int n = 0; n < N; n++) {
        tokens[n] = (int)rng_below(&rng, V);
        targets[n] = (int)rng_below(&rng, V);
        dlogp[n] = -1.0f / N;
    }
    for (int b = 0; b <= B; b++) cu[b] = b * T;
    adamw_config oc = adamw_default_config();
    oc.lr = 1e-4f;
    oc.weight_decay = 0.01f;
    oc.max_grad_norm = 1.0f;
    adamw_state os;
    adamw_init(&os, &m, oc);
    model_zero_grad(&m);

    double *t[N_PH];
    for (int p = 0; p < N_PH; p++) t[p] = xmalloc(reps * sizeof(double));
    double first_loss = NAN;
    for (int r = -warmup; r < reps; r++) {
        const double t0 = moerl_now();
        if (model_forward(&m, &a, tokens, cu, NULL, B, N) != MOERL_OK) {
            fprintf(stderr, "bench_train_step: forward: %s\n", moerl_last_error());
            return 1;
        }
        const double t1 = moerl_now();
        model_logprobs(&m, &a, targets, 1.0f, 0);
        double ce = 0;
        for (int n = 0; n < N; n++) ce -= a.logp[n];
        const float loss = (float)(ce / N + c.router_aux_loss_coef * a.aux_loss);
        const double t2 = moerl_now();
        model_backward(&m, &a, dlogp, NULL, c.router_aux_loss_coef);
        const double t3 = moerl_now();
        double gn;
        if (adamw_step(&os, &m, oc.lr, loss, &gn) != 1) {
            fprintf(stderr, "bench_train_step: step skipped (loss %g, grad norm %g)\n", loss, gn);
            return 1;
        }
        model_zero_grad(&m);
        const double t4 = moerl_now();
        if (r == -warmup) first_loss = loss;
        if (r >= 0) {
            t[PH_FWD][r] = t1 - t0;
            t[PH_LOGP][r] = t2 - t1;
            t[PH_BWD][r] = t3 - t2;
            t[PH_OPT][r] = t4 - t3;
            t[PH_STEP][r] = t4 - t0;
        }
    }
    double med[N_PH], lo[N_PH], hi[N_PH];
    for (int p = 0; p < N_PH; p++) {
        med[p] = bench_median_sorted(t[p], reps);
        lo[p] = t[p][0];
        hi[p] = t[p][reps - 1];
    }
    const double tps = N / med[PH_STEP];
    if (json) {
        printf("{\"impl\":\"moerl\",\"threads\":%d,\"reps\":%d,\"warmup\":%d,\"batch\":%d,\"seqlen\":%d,"
               "\"tokens\":%d,\"params\":%lld,\"first_loss\":%.6f,\"step_ms_median\":%.3f,\"step_ms_min\":%.3f,"
               "\"step_ms_max\":%.3f,\"tokens_per_s\":%.1f,\"recompute\":\"%s\",\"arena_bytes\":%zu",
               threads, reps, warmup, B, T, N, (long long)model_num_params(&m), first_loss, 1e3 * med[PH_STEP],
               1e3 * lo[PH_STEP], 1e3 * hi[PH_STEP], tps, rc_name, a.arena_bytes);
        for (int p = 0; p < PH_STEP; p++) printf(",\"%s_ms\":%.3f", phase_names[p], 1e3 * med[p]);
        printf("}\n");
    } else {
        printf("bench_train_step: moerl, %d threads (OpenMP + OpenBLAS %s), batch %d x %d = %d tokens, "
               "%lld params, %d reps after %d warm-up, first loss %.4f (ln V = %.4f)\n",
               threads, openblas_get_corename(), B, T, N, (long long)model_num_params(&m), reps, warmup, first_loss,
               log((double)V));
        for (int p = 0; p < N_PH; p++)
            printf("  %-9s median %8.2f ms  [min %8.2f  max %8.2f]\n", phase_names[p], 1e3 * med[p], 1e3 * lo[p],
                   1e3 * hi[p]);
        printf("  tokens/s (median step): %.0f\n  recompute %s: activation arena %.2f MiB\n", tps, rc_name,
               a.arena_bytes / 1048576.0);
    }
    for (int p = 0; p < N_PH; p++) free(t[p]);
    free(tokens);
    free(targets);
    free(cu);
    free(dlogp);
    adamw_free(&os);
    model_acts_free(&a);
    model_free(&m);
    return 0;
}
