/* llamacpp_decode — moerl's rollout engine side by side with llama.cpp (its prebuilt CPU library,
 * from the npm package @node-llama-cpp/linux-x64) on the same weights, exported by
 * model_export_gguf (src/model/gguf.h). Built and run by bench/run_llamacpp.sh (bench mode) and
 * tests/e2e_llamacpp.sh (parity mode); not part of the Makefile build, since the library and its
 * headers come from scripts/setup.sh's npm step.
 *
 * bench mode (default):
 *   llamacpp_decode --lib-dir DIR [--reps N] [--batches 1,8,32] [--prompt-len 16] [--max-tokens 32]
 *                   [--gguf-dtype f32|bf16] [--moerl-bf16] [--tmp DIR]
 *   The benchmark model B of bench_decode (H 512, 8 layers, 8 heads / 2 KV heads, head_dim 64,
 *   32 experts top-4, expert I 256, vocab 2048, untied; 433 MB fp32; same seed), exported to a
 *   temporary GGUF. Decode at batch b: b sequences with distinct prompts of --prompt-len tokens,
 *   each generating --max-tokens tokens with temperature 1 (no top-k/top-p). Both sides sample
 *   with moerl's sample_token on their own logits, so the sampling work is the same; the clock
 *   runs from the end of the prefill (every sequence holds its first token) to the last token:
 *   b·(max_tokens − 1) decode tokens in max_tokens − 1 steps of b tokens. moerl: the rollout
 *   engine (engine_step), as bench_decode. llama.cpp: one llama_decode per step over a batch of
 *   b tokens (one per sequence, seq_id = sequence, every token an output), the same number of
 *   threads (OMP_NUM_THREADS; llama.cpp's n_threads = n_threads_batch), and otherwise llama.cpp
 *   at its defaults, never handicapped: its default KV cache type (f16, half the bytes of
 *   moerl's fp32 cache), its default KV layout (llama_context_default_params' kv_unified) and
 *   flash attention on its default (auto; MOERL_LLAMA_FLASH_ATTN=on|off overrides it). Parity
 *   mode keeps an fp32 cache in one stream per sequence, moerl's layout. Each repetition runs every batch size on both
 *   sides, interleaved, after one warm-up repetition; printed: medians (min–max) over --reps
 *   repetitions and the ratio moerl/llama.cpp taken per repetition (so load from other processes
 *   hits both numbers of a ratio alike). --moerl-bf16 adds a third engine on the same weights with
 *   engine_config.bf16_weights (rollout.dtype bf16), interleaved likewise, and prints its
 *   tokens/s, its ratio to fp32 moerl and to llama.cpp (whose GGUF --gguf-dtype chooses).
 *
 * parity mode:
 *   llamacpp_decode --lib-dir DIR --parity --model CKPT_DIR --gguf FILE --prompt 1,2,3 --steps N
 *                   [--tol X]
 *   moerl's engine decodes greedily N tokens after the prompt (raw logits kept per step);
 *   llama.cpp is fed the same prompt, then moerl's tokens one at a time (teacher forcing, so one
 *   near-tie cannot make the sequences diverge), and its logits at each step are compared with
 *   moerl's: max |Δlogit| / (1 + max |logit|) must be ≤ --tol, and llama.cpp's own greedy choice
 *   must equal moerl's token at every step. Prints one line per step and a JSON summary; exit 1
 *   on a mismatch.
 *
 * Threads: OMP_NUM_THREADS (moerl; OpenBLAS is the OpenMP build) = llama.cpp's n_threads.
 */
#include "base/common.h"
#include "base/rng.h"
#include "model/gguf.h"
#include "model/model.h"
#include "rollout/engine.h"

#include "bench_engine.h"
#include "llamacpp_common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_BATCHES 8

/* ------------------------------------------------------------------ llama.cpp side */

/* parity: an fp32 KV cache, one stream per sequence (moerl's layout, so the logits compare to 1e-5);
 * else (bench) llama.cpp's own defaults for the KV cache type (f16) and layout (kv_unified). */
typedef struct { int max_batch, parity; } open_opts;
static void open_tweak(struct llama_context_params *cp, void *arg) {
    const open_opts *o = arg;
    cp->n_batch = cp->n_ubatch = (uint32_t)o->max_batch;
    if (o->parity) {
        cp->type_k = cp->type_v = GGML_TYPE_F32;
        cp->kv_unified = false;
    }
}
static void llama_open(llama_side *L, const char *gguf, int n_seq, int per_seq_ctx, int max_batch, int parity) {
    open_opts o = {max_batch, parity};
    llama_ctx_open(L, llama_load_gguf(gguf), n_seq, n_seq * per_seq_ctx, max_batch, open_tweak, &o);
    L->own_model = 1;
}

static double llama_decode_once(llama_side *L, int b, int plen, int max_tokens, uint64_t seed, int *prompts,
                                float *scratch) {
    const int V = L->n_vocab;
    llama_memory_clear(llama_get_memory(L->ctx), true);
    sampling_params sp = {.temperature = 1.0f, .top_p = 1.0f, .max_tokens = max_tokens, .ignore_eos = 1};
    rng_state *rng = xmalloc((size_t)b * sizeof *rng);
    int *last = xmalloc((size_t)b * sizeof(int));
    L->batch.n_tokens = 0;
    for (int i = 0; i < b; i++) {
        rng_seed(&rng[i], seed * 1000 + i);
        const int *p = prompts + (size_t)i * plen;
        for (int j = 0; j < plen; j++) batch_add(&L->batch, p[j], j, i, j == plen - 1);
    }
    llama_run(L);
    float lp;
    for (int i = 0; i < b; i++) last[i] = sample_token(llama_get_logits_ith(L->ctx, (i + 1) * plen - 1), V, &sp, &rng[i], &lp, scratch);
    const double t0 = moerl_now();
    for (int s = 1; s < max_tokens; s++) {
        L->batch.n_tokens = 0;
        for (int i = 0; i < b; i++) batch_add(&L->batch, last[i], plen + s - 1, i, 1);
        llama_run(L);
        for (int i = 0; i < b; i++) last[i] = sample_token(llama_get_logits_ith(L->ctx, i), V, &sp, &rng[i], &lp, scratch);
    }
    const double t = moerl_now() - t0;
    free(rng);
    free(last);
    return (double)b * (max_tokens - 1) / t;
}

/* ------------------------------------------------------------------ moerl side */

/* One decode repetition at batch b on moerl's engine (as bench_decode's decode_once). */
static double moerl_decode_once(engine *e, int b, int plen, int max_tokens, uint64_t seed, int *prompts,
                                gen_request *r, gen_request **done) {
    bench_add_decode_requests(e, r, prompts, b, plen, max_tokens, seed, "llamacpp_decode");
    for (;;) {
        int all = 1;
        for (int i = 0; i < b; i++) all &= r[i].n_out >= 1;
        if (all) break;
        if (engine_step(e, done, b) < 0) moerl_fatal("engine_step: %s", moerl_last_error());
    }
    const double t0 = moerl_now();
    while (engine_num_unfinished(e) > 0)
        if (engine_step(e, done, b) < 0) moerl_fatal("engine_step: %s", moerl_last_error());
    const double t = moerl_now() - t0;
    for (int i = 0; i < b; i++) {
        MOERL_ASSERT(r[i].n_out == max_tokens);
        gen_request_free_outputs(&r[i]);
    }
    return (double)b * (max_tokens - 1) / t;
}

/* ------------------------------------------------------------------ modes */

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || n == cap) return -1;
        out[n++] = (int)x;
        if (*end == ',') end++;
        else if (*end) return -1;
        s = end;
    }
    return n;
}

static int run_parity(const char *model_dir, const char *gguf, const int *prompt, int plen, int steps, double tol) {
    moe_model m;
    if (model_load_hf(&m, model_dir) != MOERL_OK) moerl_fatal("parity: %s", moerl_last_error());
    const int V = m.cfg.vocab_size;
    engine_config ec = {.max_num_seqs = 1, .max_model_len = plen + steps + 1, .max_num_batched_tokens = plen};
    engine *e = engine_create(&m.cfg, ec);
    if (!e || engine_load_weights(e, m.params, m.n_params, 0) != MOERL_OK) moerl_fatal("parity: %s", moerl_last_error());
    gen_request r;
    memset(&r, 0, sizeof r);
    r.prompt = (int *)prompt;
    r.prompt_len = plen;
    r.sp.temperature = 0.0f;
    r.sp.top_p = 1.0f;
    r.sp.max_tokens = steps;
    r.sp.ignore_eos = 1;
    r.out_logits = xmalloc((size_t)steps * V * sizeof(float));
    gen_request *done[1];
    if (engine_add(e, &r) != MOERL_OK) moerl_fatal("parity: %s", moerl_last_error());
    while (engine_num_unfinished(e) > 0)
        if (engine_step(e, done, 1) < 0) moerl_fatal("parity: %s", moerl_last_error());

    llama_side L;
    llama_open(&L, gguf, 1, plen + steps + 8, plen + 1, 1);
    if (L.n_vocab != V) moerl_fatal("parity: llama.cpp vocabulary %d, moerl %d", L.n_vocab, V);
    int bad = 0;
    double worst = 0;
    int pos = 0;
    L.batch.n_tokens = 0;
    for (int j = 0; j < plen; j++) batch_add(&L.batch, prompt[j], pos++, 0, j == plen - 1);
    for (int s = 0; s < steps; s++) {
        llama_run(&L);
        const float *lg = llama_get_logits_ith(L.ctx, L.batch.n_tokens - 1), *mg = r.out_logits + (size_t)s * V;
        double dmax = 0, amax = 0;
        int arg = 0;
        for (int v = 0; v < V; v++) {
            dmax = fmax(dmax, fabs((double)lg[v] - mg[v]));
            amax = fmax(amax, fabs((double)mg[v]));
            if (lg[v] > lg[arg]) arg = v;
        }
        const double rel = dmax / (1 + amax);
        worst = fmax(worst, rel);
        const int ok = rel <= tol && arg == r.out_tokens[s];
        bad += !ok;
        printf("step %2d: moerl token %5d, llama.cpp greedy %5d, max|dlogit| %.3g, max|logit| %.3g, relative %.3g%s\n",
               s, r.out_tokens[s], arg, dmax, amax, rel, ok ? "" : "  <-- MISMATCH");
        L.batch.n_tokens = 0;
        batch_add(&L.batch, r.out_tokens[s], pos++, 0, 1);
    }
    printf("{\"parity\":\"%s\",\"steps\":%d,\"worst_relative\":%.4g,\"tol\":%.3g}\n", bad ? "fail" : "ok", steps, worst, tol);
    llama_close(&L);
    free(r.out_logits);
    gen_request_free_outputs(&r);
    engine_free(e);
    model_free(&m);
    return bad ? 1 : 0;
}

static int run_bench(int reps, const int *batches, int nb, int plen, int max_tokens, gguf_export_dtype gdt,
                     const char *tmpdir, int with_bf16) {
    moe_config cfg = config_B();
    moe_model m;
    if (model_init_inference(&m, &cfg) != MOERL_OK) moerl_fatal("model: %s", moerl_last_error());
    model_init_random(&m, 1235); /* bench_decode's model B seed (1234 + 1) */
    char gguf[4200];
    snprintf(gguf, sizeof gguf, "%s/moerl_bench_B.%d.gguf", tmpdir, (int)getpid());
    if (model_export_gguf(&m, gguf, gdt) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
    int maxb = 0;
    for (int i = 0; i < nb; i++) maxb = MOERL_MAX(maxb, batches[i]);
    const int V = cfg.vocab_size, per_seq = plen + max_tokens + 16;
    llama_side L;
    llama_open(&L, gguf, maxb, per_seq, maxb * plen, 0);
    const struct llama_context_params dp = llama_context_default_params();
    unlink(gguf);
    engine_config ec = {.max_num_seqs = maxb, .max_model_len = plen + max_tokens + 1, .max_num_batched_tokens = maxb * plen};
    engine *e = engine_create(&cfg, ec), *e16 = NULL;
    if (!e || engine_load_weights(e, m.params, m.n_params, 0) != MOERL_OK) moerl_fatal("engine: %s", moerl_last_error());
    if (with_bf16) { /* the same fp32 weights, loaded into an engine computing from bf16 */
        ec.bf16_weights = 1;
        e16 = engine_create(&cfg, ec);
        if (!e16 || engine_load_weights(e16, m.params, m.n_params, 0) != MOERL_OK)
            moerl_fatal("engine: %s", moerl_last_error());
    }
    gen_request *rq = xcalloc(maxb, sizeof *rq), **done = xmalloc(maxb * sizeof *done);
    int *prompts = xmalloc((size_t)maxb * plen * sizeof(int));
    float *scratch = xmalloc(2 * (size_t)V * sizeof(float));
    double *tm = xmalloc((size_t)nb * reps * sizeof(double)), *tl = xmalloc((size_t)nb * reps * sizeof(double)),
           *rt = xmalloc((size_t)nb * reps * sizeof(double)), *tb = xmalloc((size_t)nb * reps * sizeof(double)),
           *rb = xmalloc((size_t)nb * reps * sizeof(double)), *rbl = xmalloc((size_t)nb * reps * sizeof(double));
    double load0[3] = {0};
    if (getloadavg(load0, 3) < 1) load0[0] = -1;
    printf("llamacpp_decode: model B (H 512, 8 layers, 32 experts top-4, V 2048; %.0f MB fp32 in moerl, GGUF %s), "
           "%d threads, prompt %d, %d tokens per sequence, %d repetitions (median, min-max), load average %.2f at start; "
           "llama.cpp with its defaults: KV cache %s, kv_unified %d, flash attention %s\n",
           (double)m.n_params * 4 / 1e6, gdt == GGUF_EXPORT_BF16 ? "bf16" : "f32", n_threads(), plen, max_tokens, reps,
           load0[0], ggml_type_name(dp.type_k), (int)dp.kv_unified,
           getenv("MOERL_LLAMA_FLASH_ATTN") ? getenv("MOERL_LLAMA_FLASH_ATTN") : "auto");
    for (int rep = -1; rep < reps; rep++) {
        for (int i = 0; i < nb; i++) {
            const int b = batches[i];
            bench_make_prompts(prompts, b, plen, V, 17 + rep + 3);
            const double a = moerl_decode_once(e, b, plen, max_tokens, 17 + rep, prompts, rq, done);
            const double c = llama_decode_once(&L, b, plen, max_tokens, 17 + rep, prompts, scratch);
            const double d = e16 ? moerl_decode_once(e16, b, plen, max_tokens, 17 + rep, prompts, rq, done) : 0;
            if (rep < 0) continue;
            tm[(size_t)i * reps + rep] = a;
            tl[(size_t)i * reps + rep] = c;
            rt[(size_t)i * reps + rep] = a / c;
            tb[(size_t)i * reps + rep] = d;
            rb[(size_t)i * reps + rep] = d / a;
            rbl[(size_t)i * reps + rep] = d / c;
        }
    }
    printf("batch   moerl tokens/s        llama.cpp tokens/s     moerl / llama.cpp\n");
    for (int i = 0; i < nb; i++) {
        stat3 a = stats_of(tm + (size_t)i * reps, reps), c = stats_of(tl + (size_t)i * reps, reps),
              q = stats_of(rt + (size_t)i * reps, reps);
        printf("%5d  %8.1f (%.1f-%.1f)  %8.1f (%.1f-%.1f)  %5.2fx (%.2f-%.2f)\n", batches[i], a.med, a.lo, a.hi, c.med,
               c.lo, c.hi, q.med, q.lo, q.hi);
    }
    if (e16) {
        printf("moerl with bf16 weights (engine_config.bf16_weights; same weights rounded to bf16):\n"
               "batch   moerl bf16 tokens/s   bf16 / fp32 moerl     bf16 moerl / llama.cpp\n");
        for (int i = 0; i < nb; i++) {
            stat3 d = stats_of(tb + (size_t)i * reps, reps), q = stats_of(rb + (size_t)i * reps, reps),
                  ql = stats_of(rbl + (size_t)i * reps, reps);
            printf("%5d  %8.1f (%.1f-%.1f)  %5.2fx (%.2f-%.2f)     %5.2fx (%.2f-%.2f)\n", batches[i], d.med, d.lo, d.hi,
                   q.med, q.lo, q.hi, ql.med, ql.lo, ql.hi);
        }
    }
    double load1[3] = {0};
    if (getloadavg(load1, 3) < 1) load1[0] = -1;
    printf("load average %.2f at the end (other processes on the cores slow every number above)\n", load1[0]);
    free(tm); free(tl); free(rt); free(tb); free(rb); free(rbl); free(scratch);
    engine_free(e16); free(prompts); free(done); free(rq);
    engine_free(e);
    llama_close(&L);
    model_free(&m);
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: llamacpp_decode --lib-dir DIR [--reps N] [--batches 1,8,32] [--prompt-len 16] "
                    "[--max-tokens 32] [--gguf-dtype f32|bf16] [--moerl-bf16] [--tmp DIR]\n"
                    "       llamacpp_decode --lib-dir DIR --parity --model DIR --gguf FILE --prompt 1,2,3 --steps N "
                    "[--tol X]\n");
    exit(2);
}

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    const char *lib_dir = NULL, *model_dir = NULL, *gguf = NULL, *tmpdir = "/tmp";
    int parity = 0, with_bf16 = 0, reps = 5, plen = 16, max_tokens = 32, steps = 8, nb = 3, prompt[256], np = 0;
    int batches[MAX_BATCHES] = {1, 8, 32};
    double tol = 1e-4;
    gguf_export_dtype gdt = GGUF_EXPORT_F32;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--parity")) { parity = 1; continue; }
        if (!strcmp(argv[a], "--moerl-bf16")) { with_bf16 = 1; continue; }
        if (a + 1 >= argc) usage();
        const char *k = argv[a], *v = argv[++a];
        if (!strcmp(k, "--lib-dir")) lib_dir = v;
        else if (!strcmp(k, "--model")) model_dir = v;
        else if (!strcmp(k, "--gguf")) gguf = v;
        else if (!strcmp(k, "--tmp")) tmpdir = v;
        else if (!strcmp(k, "--reps")) reps = atoi(v);
        else if (!strcmp(k, "--prompt-len")) plen = atoi(v);
        else if (!strcmp(k, "--max-tokens")) max_tokens = atoi(v);
        else if (!strcmp(k, "--steps")) steps = atoi(v);
        else if (!strcmp(k, "--tol")) tol = atof(v);
        else if (!strcmp(k, "--gguf-dtype")) {
            if (!strcmp(v, "f32")) gdt = GGUF_EXPORT_F32;
            else if (!strcmp(v, "bf16")) gdt = GGUF_EXPORT_BF16;
            else usage();
        } else if (!strcmp(k, "--batches")) {
            if ((nb = parse_list(v, batches, MAX_BATCHES)) < 1) usage();
            for (int i = 0; i < nb; i++) if (batches[i] < 1 || batches[i] > 512) usage();
        } else if (!strcmp(k, "--prompt")) {
            if ((np = parse_list(v, prompt, 256)) < 1) usage();
        } else usage();
    }
    if (!lib_dir || reps < 1 || plen < 1 || max_tokens < 2 || steps < 1) usage();
    llama_log_set(quiet_log, NULL);
    ggml_backend_load_all_from_path(lib_dir);
    llama_backend_init();
    int rc;
    if (parity) {
        if (!model_dir || !gguf || np < 1) usage();
        rc = run_parity(model_dir, gguf, prompt, np, steps, tol);
    } else {
        rc = run_bench(reps, batches, nb, plen, max_tokens, gdt, tmpdir, with_bf16);
    }
    llama_backend_free();
    return rc;
}
