/* The paged KV cache (issue 28), two measurements (docs/engine.md has the command and figures).
 *
 * 1. Concurrency at a fixed KV budget on a long-tail length distribution: the scheduling runs in the
 *    engine's simulated mode (engine_config.simulated: block accounting as in a real run, no forward),
 *    so it is exact and fast. 512 requests, prompts uniform in [256, 1024], responses Pareto (α 1.5,
 *    minimum 64, capped at 8192); budget = the slot reservation of S_OLD sequences of max_model_len
 *    tokens. Per step while requests wait (the engine is saturated; the long tail's last steps, with
 *    a few sequences left whatever the cache, are not counted): sequences in flight, and KV waste = (allocated − used) / allocated, where used
 *    is the positions cached and allocated is the reservation (old) or the blocks held × block_size.
 * 2. Rollout throughput on a GRPO workload with prefix caching on vs off: the benchmark model
 *    (bench_util.h, random weights), G prompts of 256–1024 tokens × n = 8, heavy-tailed response
 *    lengths (as 1., capped at --max-new), EOS ignored.
 *    --workload FILE (bench/grpo_workload.h's format; bench/llamacpp_grpo.c --workload-out writes one):
 *    part 2 runs that workload instead of its draw: its prompts, its n and its forced response
 *    lengths (with llamacpp_grpo's per-sequence seeds), prefix caching off then on.
 * Usage: bench_paged [--groups G] [--max-new N] [--threads T] [--workload FILE] */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "bench_util.h"
#include "grpo_workload.h"
#include "rollout/engine.h"

#define S_OLD 16
#define MAX_NEW_TAIL 8192

static int pareto_len(rng_state *g, int min, int cap) {
    const double u = 1.0 - rng_uniform_double(g);
    const double x = min / pow(u, 1.0 / 1.5);
    return x > cap ? cap : (int)x;
}

/* Part 1: one simulated run; mean sequences in flight and mean KV waste over the steps. */
static void concurrency(const moe_config *c, int paged, int64_t budget, int max_len, int n, const int *plen,
                        const int *rlen, double *inflight, double *waste) {
    engine_config ec = {.max_num_seqs = paged ? 4096 : S_OLD, .max_model_len = max_len,
                        .max_num_batched_tokens = 8192, .simulated = 1, .block_size = 16,
                        .kv_cache_bytes = paged ? budget : 0};
    engine *e = engine_create(c, ec);
    MOERL_ASSERT(e);
    gen_request *r = xcalloc(n, sizeof *r), **done = xmalloc((size_t)(n + 4096) * sizeof *done);
    int *prompt = xcalloc(1024, sizeof(int));
    for (int i = 0; i < n; i++) {
        r[i].id = i; r[i].prompt = prompt; r[i].prompt_len = plen[i];
        r[i].sp.top_p = 1; r[i].sp.max_tokens = rlen[i]; r[i].sp.ignore_eos = 1;
        MOERL_ASSERT(engine_add(e, &r[i]) == MOERL_OK);
    }
    double sum_run = 0, sum_waste = 0;
    int steps = 0;
    while (engine_num_unfinished(e) > 0) {
        MOERL_ASSERT(engine_step(e, done, n + 4096) >= 0);
        int64_t held, used;
        engine_kv_usage(e, &held, &used);
        const double alloc = paged ? (double)held * 16 : (double)S_OLD * max_len;
        if (alloc > 0 && engine_num_unfinished(e) > engine_num_running(e)) { /* saturated: requests wait */
            sum_run += engine_num_running(e);
            sum_waste += 1.0 - used / alloc;
            steps++;
        }
    }
    *inflight = sum_run / steps;
    *waste = sum_waste / steps;
    if (paged) printf("  paged: %lld preemptions, %lld blocks (peak %lld in use)\n", (long long)engine_get_stats(e).preemptions,
                      (long long)engine_get_stats(e).kv_blocks_total, (long long)engine_get_stats(e).kv_blocks_peak);
    for (int i = 0; i < n; i++) gen_request_free_outputs(&r[i]);
    free(r); free(done); free(prompt);
    engine_free(e);
}

/* Part 2: G groups × 8 with prefix caching on/off; wall seconds and prefill tokens. */
static void grpo(const moe_config *c, const moe_model *m, int G, int max_new, int caching, rng_state *g0) {
    rng_state g = *g0;
    const int n = G * 8;
    int **prompts = xmalloc((size_t)G * sizeof(int *)), *plen = xmalloc((size_t)G * sizeof(int)), max_plen = 0;
    for (int i = 0; i < G; i++) {
        plen[i] = 256 + (int)(rng_uniform(&g) * 769);
        prompts[i] = xmalloc((size_t)plen[i] * sizeof(int));
        for (int j = 0; j < plen[i]; j++) prompts[i][j] = (int)(rng_uniform(&g) * c->vocab_size) % c->vocab_size;
        max_plen = MOERL_MAX(max_plen, plen[i]);
    }
    engine_config ec = {.max_num_seqs = n, .max_model_len = max_plen + max_new, .max_num_batched_tokens = 2048,
                        .enable_prefix_caching = caching};
    engine *e = engine_create(c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m->params, m->n_params, 0) == MOERL_OK);
    gen_request *r = xcalloc(n, sizeof *r), **done = xmalloc((size_t)n * sizeof *done);
    for (int i = 0; i < n; i++) {
        r[i].id = i; r[i].prompt = prompts[i / 8]; r[i].prompt_len = plen[i / 8];
        r[i].sp.temperature = 1; r[i].sp.top_p = 1; r[i].sp.seed = i; r[i].sp.ignore_eos = 1;
        r[i].sp.max_tokens = pareto_len(&g, 8, max_new);
        MOERL_ASSERT(engine_add(e, &r[i]) == MOERL_OK);
    }
    const double t0 = moerl_now();
    while (engine_num_unfinished(e) > 0) MOERL_ASSERT(engine_step(e, done, n) >= 0);
    const double dt = moerl_now() - t0;
    const engine_stats st = engine_get_stats(e);
    printf("  prefix caching %-3s: %.2f s, %lld generated tokens (%.1f tokens/s), %lld prefill tokens, %lld from shared blocks\n",
           caching ? "on" : "off", dt, (long long)st.generated_tokens, st.generated_tokens / dt,
           (long long)st.prefill_tokens, (long long)st.prefix_hit_tokens);
    for (int i = 0; i < n; i++) gen_request_free_outputs(&r[i]);
    for (int i = 0; i < G; i++) free(prompts[i]);
    free(prompts); free(plen); free(r); free(done);
    engine_free(e);
}

/* Part 2 on a workload file: the file's groups × n with its forced lengths, caching off then on. */
static void grpo_from_file(moe_config c, workload w, const char *path, int threads) {
    c.max_position_embeddings = MOERL_MAX(c.max_position_embeddings, w.max_plen + w.max_rlen + 16);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 1);
    printf("2. GRPO from %s: %d prompts (longest %d) x n = %d, %lld prompt + %lld generated tokens, %d threads\n", path,
           w.G, w.max_plen, w.n, (long long)w.prompt_tokens, (long long)w.gen_tokens, threads);
    for (int caching = 0; caching <= 1; caching++) {
        engine_config ec = {.max_num_seqs = w.n_seq, .max_model_len = w.max_plen + w.max_rlen + 1,
                            .max_num_batched_tokens = 2048, .enable_prefix_caching = caching};
        engine *e = engine_create(&c, ec);
        MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
        gen_request *r = xcalloc(w.n_seq, sizeof *r), **done = xmalloc((size_t)w.n_seq * sizeof *done);
        const double t0 = moerl_now();
        for (int i = 0; i < w.n_seq; i++) {
            r[i].id = i; r[i].prompt = w.prompt[i / w.n]; r[i].prompt_len = w.plen[i / w.n];
            r[i].sp.temperature = 1; r[i].sp.top_p = 1; r[i].sp.ignore_eos = 1; r[i].sp.max_tokens = w.rlen[i];
            r[i].sp.seed = 2026 * 1000003ULL + (uint64_t)i; /* llamacpp_grpo's seq_seed at its default --seed */
            MOERL_ASSERT(engine_add(e, &r[i]) == MOERL_OK);
        }
        while (engine_num_unfinished(e) > 0) MOERL_ASSERT(engine_step(e, done, w.n_seq) >= 0);
        const double dt = moerl_now() - t0;
        const engine_stats st = engine_get_stats(e);
        MOERL_ASSERT(st.generated_tokens == w.gen_tokens);
        printf("  prefix caching %-3s: %.2f s, %.1f tokens/s (prompt + generated), %lld generated tokens, %lld prefill "
               "tokens, %lld from shared blocks\n", caching ? "on" : "off", dt, (w.prompt_tokens + w.gen_tokens) / dt,
               (long long)st.generated_tokens, (long long)st.prefill_tokens, (long long)st.prefix_hit_tokens);
        for (int i = 0; i < w.n_seq; i++) gen_request_free_outputs(&r[i]);
        free(r); free(done);
        engine_free(e);
    }
    model_free(&m);
    workload_free(&w);
}

int main(int argc, char **argv) {
    int G = 8, max_new = 256, threads = 2;
    const char *wfile = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--workload")) wfile = argv[i + 1];
        else if (!strcmp(argv[i], "--groups")) G = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-new")) max_new = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    omp_set_num_threads(threads);
    moe_config c = bench_model_config(1024 + MAX_NEW_TAIL + 16);
    workload w = {0};
    if (wfile && workload_read(&w, wfile, c.vocab_size, 8192) != MOERL_OK) { /* before part 1: a bad file fails at once */
        fprintf(stderr, "bench_paged --workload: %s\n", moerl_last_error());
        return 2;
    }
    rng_state g;
    rng_seed(&g, 2026);
    enum { N = 512 };
    static int plen[N], rlen[N];
    for (int i = 0; i < N; i++) {
        plen[i] = 256 + (int)(rng_uniform(&g) * 769);
        rlen[i] = pareto_len(&g, 64, MAX_NEW_TAIL);
    }
    const int max_len = 1024 + MAX_NEW_TAIL;
    const int64_t tok_bytes = 2LL * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4;
    const int64_t budget = (int64_t)S_OLD * ((max_len + 15) / 16) * 16 * tok_bytes;
    double in_old, w_old, in_new, w_new;
    printf("1. fixed KV budget %.1f MiB (%d sequences × %d tokens reserved), %d requests: prompts 256-1024, "
           "responses Pareto(1.5, min 64, cap %d)\n", budget / 1048576.0, S_OLD, max_len, N, MAX_NEW_TAIL);
    concurrency(&c, 0, budget, max_len, N, plen, rlen, &in_old, &w_old);
    concurrency(&c, 1, budget, max_len, N, plen, rlen, &in_new, &w_new);
    printf("  reservation: %.1f sequences in flight, KV waste %.1f%%\n", in_old, 100 * w_old);
    printf("  paged:       %.1f sequences in flight (%.2fx), KV waste %.1f%%\n", in_new, in_new / in_old, 100 * w_new);
    if (wfile) {
        grpo_from_file(c, w, wfile, threads);
        return 0;
    }
    moe_model m;
    c.max_position_embeddings = 1024 + max_new + 16;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 1);
    printf("2. GRPO: %d prompts of 256-1024 tokens x n = 8, responses Pareto(1.5, min 8, cap %d), %d threads\n", G,
           max_new, threads);
    grpo(&c, &m, G, max_new, 0, &g);
    grpo(&c, &m, G, max_new, 1, &g);
    model_free(&m);
    return 0;
}
