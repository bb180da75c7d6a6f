/* bench_batch_invariant — the cost of rollout.batch_invariant (moe_exec_opts.batch_invariant): rollout
 * engine decode tokens/s and one training step's time, batch-invariant kernels against the default
 * ones, on the benchmark model of bench_util.h (hidden 256, 4 layers, 8 heads / 2 KV heads, head_dim 32,
 * 16 experts top-4, expert size 128, vocab 512, all layers MoE; random init, seed 1).
 *
 * Decode at batch b: b requests (prompts of 16 tokens, temperature 1, ignore_eos, --max-tokens new
 * tokens) in a fresh engine; the first engine_step prefills every prompt; the clock runs from then
 * until every request has finished (decode steps only). tokens/s = b·(max_tokens − 1) / time.
 * Training step: model_forward on --batch sequences of --seqlen random tokens, model_logprobs,
 * model_backward (token-mean cross-entropy plus the aux loss), adamw_step — what the trainer does per
 * micro-batch (bench_train_step's step). Each repetition runs default then invariant for every
 * measurement back to back (after one warm-up repetition), so load from other processes hits both
 * alike; reported: median (min–max) over --reps repetitions, and the median of the per-repetition
 * ratios invariant / default.
 *
 * Usage: bench_batch_invariant [--reps N (≥ 3, default 5)] [--batches 1,8,32] [--max-tokens 32]
 *                              [--batch 4] [--seqlen 128]
 * Threads: OMP_NUM_THREADS.
 */
#include "base/common.h"
#include "base/rng.h"
#include "model/forward.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "rollout/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench_util.h"

#define MAX_B 8

static int bench_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

typedef struct { double med, lo, hi; } stat3;
static stat3 stats_of(double *v, int n) {
    bench_sort(v, n);
    return (stat3){n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[0], v[n - 1]};
}

/* Decode tokens/s of b concurrent requests (see the header). */
static double decode_tps(const moe_model *m, int b, int max_tokens, int seed) {
    enum { PLEN = 16 };
    engine_config ec = {.max_num_seqs = b, .max_model_len = PLEN + max_tokens + 1,
                        .max_num_batched_tokens = b * PLEN};
    engine *e = engine_create(&m->cfg, ec);
    if (!e || engine_load_weights(e, m->params, m->n_params, 0) != MOERL_OK)
        moerl_fatal("bench_batch_invariant: engine: %s", moerl_last_error());
    gen_request *r = xcalloc(b, sizeof *r), **done = xcalloc(b, sizeof *done);
    int *prompts = xmalloc((size_t)b * PLEN * sizeof(int));
    for (int i = 0; i < b; i++) {
        for (int j = 0; j < PLEN; j++) prompts[i * PLEN + j] = (seed * 7919 + i * 131 + j * 17) % m->cfg.vocab_size;
        r[i].id = i;
        r[i].prompt = prompts + i * PLEN;
        r[i].prompt_len = PLEN;
        r[i].sp.temperature = 1.0f;
        r[i].sp.top_p = 1.0f;
        r[i].sp.seed = (uint64_t)seed * 1000 + i;
        r[i].sp.max_tokens = max_tokens;
        r[i].sp.ignore_eos = 1;
        if (engine_add(e, &r[i]) != MOERL_OK) moerl_fatal("bench_batch_invariant: %s", moerl_last_error());
    }
    MOERL_ASSERT(engine_step(e, done, b) >= 0); /* prefill of every prompt + each first token */
    const double t0 = moerl_now();
    while (engine_num_unfinished(e) > 0) MOERL_ASSERT(engine_step(e, done, b) >= 0);
    const double dt = moerl_now() - t0;
    for (int i = 0; i < b; i++) gen_request_free_outputs(&r[i]);
    free(r), free(done), free(prompts);
    engine_free(e);
    return (double)b * (max_tokens - 1) / dt;
}

typedef struct {
    int *tok, *tgt, *cu;
    float *dlogp;
    int B, T, N;
} step_batch;

static step_batch make_batch(int B, int T, int V) {
    step_batch s = {.B = B, .T = T, .N = B * T};
    s.tok = xmalloc(s.N * sizeof(int));
    s.tgt = xmalloc(s.N * sizeof(int));
    s.cu = xmalloc((B + 1) * sizeof(int));
    s.dlogp = xmalloc(s.N * sizeof(float));
    rng_state r;
    rng_seed(&r, 7);
    for (int n = 0; n < s.N; n++) {
        s.tok[n] = (int)rng_below(&r, V);
        s.tgt[n] = (int)rng_below(&r, V);
        s.dlogp[n] = -1.0f / s.N;
    }
    for (int b = 0; b <= B; b++) s.cu[b] = b * T;
    return s;
}

/* Seconds of one training step (forward, logprobs, backward, AdamW) of m on s. */
static double train_step_s(moe_model *m, model_acts *a, adamw_state *os, const step_batch *s) {
    const double t0 = moerl_now();
    if (model_forward(m, a, s->tok, s->cu, NULL, s->B, s->N) != MOERL_OK)
        moerl_fatal("bench_batch_invariant: %s", moerl_last_error());
    model_logprobs(m, a, s->tgt, 1.0f, 0);
    model_backward(m, a, s->dlogp, NULL, m->cfg.router_aux_loss_coef);
    double gn;
    adamw_step(os, m, 1e-6f, 1.0f, &gn);
    memset(m->grads, 0, m->n_params * sizeof(float));
    return moerl_now() - t0;
}

static int parse_list(const char *s, int *v, int cap) {
    int n = 0;
    for (char *p = (char *)s; *p && n < cap;) {
        v[n++] = (int)strtol(p, &p, 10);
        if (*p == ',') p++;
        else if (*p) moerl_fatal("bench_batch_invariant: --batches '%s': expected numbers separated by commas", s);
    }
    return n;
}

static void print_pair(const char *what, const char *unit, double *def, double *inv, int reps) {
    double *ratio = xmalloc(reps * sizeof(double));
    for (int i = 0; i < reps; i++) ratio[i] = inv[i] / def[i];
    const stat3 d = stats_of(def, reps), v = stats_of(inv, reps), q = stats_of(ratio, reps);
    printf("%-22s default %9.1f (%.1f–%.1f) %s   invariant %9.1f (%.1f–%.1f) %s   invariant/default %.3f\n", what,
           d.med, d.lo, d.hi, unit, v.med, v.lo, v.hi, unit, q.med);
    free(ratio);
}

int main(int argc, char **argv) {
    int reps = 5, max_tokens = 32, B = 4, T = 128, batches[MAX_B] = {1, 8, 32}, nb = 3;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--reps")) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--max-tokens")) max_tokens = atoi(v), i++;
        else if (!strcmp(argv[i], "--batch")) B = atoi(v), i++;
        else if (!strcmp(argv[i], "--seqlen")) T = atoi(v), i++;
        else if (!strcmp(argv[i], "--batches")) nb = parse_list(v, batches, MAX_B), i++;
        else moerl_fatal("usage: bench_batch_invariant [--reps N] [--batches 1,8,32] [--max-tokens N] [--batch B] "
                         "[--seqlen T]; got '%s'", argv[i]);
    }
    if (reps < 3 || max_tokens < 2 || B < 1 || T < 2 || nb < 1)
        moerl_fatal("bench_batch_invariant: --reps ≥ 3, --max-tokens ≥ 2, --batch ≥ 1, --seqlen ≥ 2 (got %d %d %d %d)",
                    reps, max_tokens, B, T);
    moe_model m[2];
    model_acts a[2];
    adamw_state os[2];
    const step_batch s = make_batch(B, T, 512);
    for (int k = 0; k < 2; k++) {
        moe_config c = bench_model_config(T + 64);
        c.exec.batch_invariant = k;
        MOERL_ASSERT(model_init(&m[k], &c) == MOERL_OK);
        model_init_random(&m[k], 1);
        MOERL_ASSERT(model_acts_init(&a[k], &m[k], s.N) == MOERL_OK);
        adamw_config oc = {.lr = 1e-6f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f,
                           .max_grad_norm = 1.0f};
        adamw_init(&os[k], &m[k], oc);
    }
    double *dec[2][MAX_B], *step[2];
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < nb; j++) dec[k][j] = xmalloc(reps * sizeof(double));
        step[k] = xmalloc(reps * sizeof(double));
    }
    for (int rep = -1; rep < reps; rep++)
        for (int k = 0; k < 2; k++) {
            for (int j = 0; j < nb; j++) {
                const double tps = decode_tps(&m[k], batches[j], max_tokens, rep + 2);
                if (rep >= 0) dec[k][j][rep] = tps;
            }
            const double st = train_step_s(&m[k], &a[k], &os[k], &s);
            if (rep >= 0) step[k][rep] = 1e3 * st;
        }
    printf("bench_batch_invariant: %d threads, %d repetitions, medians (min–max)\n", bench_threads(), reps);
    for (int j = 0; j < nb; j++) {
        char what[64];
        snprintf(what, sizeof what, "decode batch %d", batches[j]);
        print_pair(what, "tok/s", dec[0][j], dec[1][j], reps);
    }
    char what[64];
    snprintf(what, sizeof what, "train step %dx%d", B, T);
    print_pair(what, "ms", step[0], step[1], reps);
    return 0;
}
