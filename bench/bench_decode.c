/* bench_decode — rollout engine (src/rollout/engine.c) throughput: decode tokens/s at several
 * batch sizes, prefill tokens/s, and batch-1 decode against the memory-bandwidth bound measured
 * in the same run.
 *
 * Models (model_init_inference + model_init_random, untied LM head, every layer MoE):
 *   A  the benchmark model: H=256, 4 layers, 8 heads / 2 KV heads, head_dim 32, 16 experts top-4,
 *      expert I=128, vocab 512 (weights 28.9 MB)
 *   B  a larger one whose weights exceed the L2 cache (and, at 433 MB, a 300 MB L3): H=512,
 *      8 layers, 8 heads / 2 KV heads, head_dim 64, 32 experts top-4, expert I=256, vocab 2048
 *
 * Decode at batch b: b concurrent requests (prompt of --prompt-len tokens, temperature 1, no
 * top-k/top-p, ignore_eos, max_tokens = --max-tokens) in one engine per model whose
 * max_num_seqs is the largest batch and whose token budget admits every prompt in the first
 * step. That step prefills all prompts (and samples each request's first token); the clock runs
 * from then until every request has finished, so it covers only decode steps (b tokens each,
 * forward + sampling). tokens/s = b·(max_tokens − 1) / time. Each repetition runs every batch
 * size once, interleaved, after one warm-up repetition; reported: median (min–max) over --reps
 * repetitions, and ratios computed per repetition, so load from other processes hits the
 * numbers of a ratio alike. The share of decode time spent sampling (engine_stats.sample_s) is
 * printed. Prefill: --prefill-seqs prompts of --prefill-len tokens (max_tokens 1) in one
 * engine_step with a token budget that holds them all; tokens/s = seqs·len / time of that step.
 *
 * Memory-bandwidth bound for batch-1 decode. Bytes of weights read per decoded token, counted
 * from the model's tensor table at 4 bytes/float: every non-expert tensor in full (attention,
 * norms, router, LM head) except the embedding, of which one row (H floats) is read, plus
 * K/E of each stacked expert tensor (the K active experts' gate_up and down per MoE layer). The
 * KV cache read (2·L·pos·nkv·hd floats, < 1% here) is left out. Bandwidth comes from STREAM-style
 * kernels over arrays of 2× the L3 size each (≫ L3; at least 256 MB), measured in this run on one
 * thread and on all OpenMP threads: copy (c = a, 2 arrays of traffic), triad (a = b + s·c, 3) and
 * read (s += a, 1; a read-only reduction), bytes counted as STREAM does (no write-allocate).
 * The bound uses the ALL-THREAD READ bandwidth: batch-1 decode streams weights that it only
 * reads, using every thread, so a read-only stream on all threads is the same access pattern
 * (copy/triad add write traffic the decode does not have). One read pass is re-measured just
 * before the batch-1 run of every repetition; bound tokens/s = that bandwidth / bytes per token;
 * ratio = measured / bound per repetition (target ≥ 50%). Weights that stay cached can beat a
 * DRAM bound: model A fits in a large L3 entirely (its ratio then says little), and with a
 * 300 MB L3 the non-expert weights and part of model B's experts stay cached between tokens,
 * so model B's bound is loose there too (ratios above 100% were seen with GEMV kernels).
 * Every batch size also gets the same kind of bound for its step: weight bytes read per step =
 * non-expert weights once + the experts that at least one of the b tokens routes to (expected
 * share 1 − (1 − K/E)^b under uniform routing), and "% of their bandwidth bound" = measured /
 * (bandwidth · b / bytes per step); a large batch may instead be compute-bound.
 * Also printed: batch-32 aggregate tokens/s / batch-1 tokens/s (target ≥ 8×), next to the ratio
 * the two traffic bounds allow, 32·bytes(1)/bytes(32): with E = 32, top-4 a batch of 32 reads
 * nearly every expert, so that ratio is below 8 for model B.
 *
 * --bf16: a second engine on the same weights with engine_config.bf16_weights (rollout.dtype bf16)
 * decodes right after the fp32 one at every batch size of every repetition; printed: its tokens/s
 * and the median over repetitions of bf16 / fp32 tokens/s (each ratio from one back-to-back pair),
 * its bandwidth bound (the same formula with the bytes the bf16 engine reads: the q/k/v/o projections,
 * the experts and the LM head at 2 bytes a weight — the bf16 panels — and the rest, norms, router and
 * the embedding row, at 4; batch 1: "bf16 batch-1 ... of the bound"), and the bf16 engine's weight load: fp32 weights rounded on load (engine_load_weights) against bf16
 * weights loaded in place (engine_weight_buffer_bf16 + engine_set_version_bf16, what a rollout rank
 * does after a bf16 weight broadcast; the copy into the buffer, the broadcast's part, is not timed).
 *
 * Usage: bench_decode [--model A|B|all] [--reps N (≥ 3, default 5)] [--batches 1,8,32,64]
 *                     [--prompt-len 16] [--max-tokens 32] [--prefill-seqs 8] [--prefill-len 256]
 *                     [--stream-mb MB per array] [--bf16] [--json]
 * --json prints one JSON object on stdout (the human-readable lines then go to stderr).
 * Threads: OMP_NUM_THREADS (OpenBLAS is the OpenMP build and shares the pool).
 */
#include "base/common.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rollout/engine.h"
#include "bench_engine.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#include "bench_util.h"
#endif
#undef I /* <complex.h> via cblas.h */

char *openblas_get_corename(void); /* OpenBLAS extension, not declared in every cblas.h */

#define MAX_BATCHES 8


/* Median, min and max of v[n] (v is sorted in place). */
typedef struct { double med, lo, hi; } stat3;
static stat3 stats_of(double *v, int n) {
    bench_sort(v, n);
    stat3 s = {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[0], v[n - 1]};
    return s;
}

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ------------------------------------------------------------------ memory bandwidth */

typedef struct { stat3 copy, triad, read; } bw_result; /* GB/s (1e9 bytes/s) */

/* STREAM-style kernels on nt threads over n floats per array, reps timed passes after one
 * warm-up pass; bytes counted as STREAM does (no write-allocate traffic). */
static bw_result stream_bandwidth(float *a, float *b, float *c, size_t n, int nt, int reps) {
    double *tc = xmalloc(reps * sizeof(double)), *tt = xmalloc(reps * sizeof(double)),
           *tr = xmalloc(reps * sizeof(double));
    volatile float sink = 0;
    for (int rep = -1; rep < reps; rep++) {
        double t0 = moerl_now();
#pragma omp parallel for simd schedule(static) num_threads(nt)
        for (size_t i = 0; i < n; i++) c[i] = a[i];
        double t1 = moerl_now();
#pragma omp parallel for simd schedule(static) num_threads(nt)
        for (size_t i = 0; i < n; i++) a[i] = b[i] + 0.5f * c[i];
        double t2 = moerl_now();
        float s = 0;
#pragma omp parallel for simd schedule(static) num_threads(nt) reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += a[i];
        double t3 = moerl_now();
        sink += s;
        if (rep < 0) continue;
        const double B = (double)n * sizeof(float) * 1e-9;
        tc[rep] = 2 * B / (t1 - t0);
        tt[rep] = 3 * B / (t2 - t1);
        tr[rep] = 1 * B / (t3 - t2);
    }
    (void)sink;
    bw_result r = {stats_of(tc, reps), stats_of(tt, reps), stats_of(tr, reps)};
    free(tc); free(tt); free(tr);
    return r;
}

/* ------------------------------------------------------------------ models */

/* Model A (bench_model_config at 4096 positions) or B (bench_model_config_B), bench_util.h. */
static moe_config config_for(char which) { return which == 'B' ? bench_model_config_B() : bench_model_config(4096); }

/* Bytes of weights one decode step of b tokens reads (see the header comment; b = 1 is the
 * batch-1 bound's bytes per token): non-expert tensors once, b embedding rows, and of each
 * stacked expert tensor the expected share of experts that at least one of the b tokens routes
 * to, 1 − (1 − K/E)^b under uniform routing (b = 1: K/E). *total_bytes = all weights. */
static double decode_bytes_per_step(const moe_model *m, int b, double *total_bytes) {
    const moe_config *c = &m->cfg;
    const double active = c->num_experts ? 1.0 - pow(1.0 - (double)c->num_experts_per_tok / c->num_experts, b) : 0;
    double fl = 0, tot = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        tot += (double)t->numel;
        if (t->flags & TF_EXPERT) fl += (double)t->numel * active;
        else if (t->flags & TF_EMBED) fl += (double)b * c->hidden_size + (c->tie_word_embeddings ? (double)t->numel : 0);
        else fl += (double)t->numel;
    }
    if (total_bytes) *total_bytes = tot * sizeof(float);
    return fl * sizeof(float);
}

/* The matrices the bf16 engine reads as bf16 panels (engine.c bf16_pack_all): the attention
 * projections, the experts and the LM head. */
static int read_as_bf16(const tensor_info *t) {
    if (t->flags & TF_EXPERT) return 1;
    static const char *const names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "lm_head"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (strstr(t->name, names[k])) return 1;
    return 0;
}

/* decode_bytes_per_step for the bf16 engine: its panel matrices at 2 bytes a weight, the rest at 4. */
static double decode_bytes_per_step16(const moe_model *m, int b) {
    const moe_config *c = &m->cfg;
    const double active = c->num_experts ? 1.0 - pow(1.0 - (double)c->num_experts_per_tok / c->num_experts, b) : 0;
    double bytes = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        const double w = read_as_bf16(t) ? 2 : 4;
        if (t->flags & TF_EXPERT) bytes += w * (double)t->numel * active;
        else if (t->flags & TF_EMBED) bytes += w * ((double)b * c->hidden_size + (c->tie_word_embeddings ? (double)t->numel : 0));
        else bytes += w * (double)t->numel;
    }
    return bytes;
}

/* ------------------------------------------------------------------ engine runs */

static engine *engine_for(const moe_model *m, int seqs, int max_len, int budget, int bf16) {
    engine_config ec = {.max_num_seqs = seqs, .max_model_len = max_len, .max_num_batched_tokens = budget,
                        .bf16_weights = bf16};
    engine *e = engine_create(&m->cfg, ec);
    if (!e || engine_load_weights(e, m->params, m->n_params, 0) != MOERL_OK)
        moerl_fatal("bench_decode: engine: %s", moerl_last_error());
    return e;
}

/* Fill n requests with prompts of plen tokens (distinct per request) and add them. */
static void add_requests(engine *e, gen_request *r, int *prompts, int n, int plen, int V, int max_tokens,
                         uint64_t seed) {
    bench_make_prompts(prompts, n, plen, V, seed);
    bench_add_decode_requests(e, r, prompts, n, plen, max_tokens, seed, "bench_decode");
}

/* One decode repetition at batch b on engine e (max_num_seqs ≥ b, budget ≥ b·plen): prefill,
 * then the timed decode steps. Returns decode tokens/s; *sample_frac = share of the timed
 * time spent sampling, *step_ms = ms per decode step. r, done, prompts: capacity ≥ b. */
static double decode_once(engine *e, int V, int b, int plen, int max_tokens, uint64_t seed, gen_request *r,
                          gen_request **done, int *prompts, double *sample_frac, double *step_ms) {
    add_requests(e, r, prompts, b, plen, V, max_tokens, seed);
    int n_done = 0, steps = 0;
    /* prefill: until every request holds its first sampled token */
    for (;;) {
        int all = 1;
        for (int i = 0; i < b; i++) all &= r[i].n_out >= 1;
        if (all) break;
        int k = engine_step(e, done, b);
        if (k < 0) moerl_fatal("bench_decode: engine_step: %s", moerl_last_error());
        n_done += k;
    }
    engine_stats s0 = engine_get_stats(e);
    double t0 = moerl_now();
    while (engine_num_unfinished(e) > 0) {
        int k = engine_step(e, done, b);
        if (k < 0) moerl_fatal("bench_decode: engine_step: %s", moerl_last_error());
        n_done += k;
        steps++;
    }
    double t = moerl_now() - t0;
    engine_stats s1 = engine_get_stats(e);
    long decoded = 0;
    for (int i = 0; i < b; i++) {
        MOERL_ASSERT(r[i].n_out == max_tokens && r[i].finish == FINISH_LENGTH);
        decoded += r[i].n_out - 1;
        gen_request_free_outputs(&r[i]);
    }
    /* every timed token was a decode token (no prefill inside the window) */
    MOERL_ASSERT(n_done == b && s1.decode_tokens - s0.decode_tokens == decoded &&
                 s1.prefill_tokens == s0.prefill_tokens);
    *sample_frac = (s1.sample_s - s0.sample_s) / t;
    *step_ms = 1e3 * t / steps;
    return decoded / t;
}

/* All-thread read-only bandwidth of one pass over a[n] (GB/s). */
static double read_bandwidth_once(const float *a, size_t n) {
    float s = 0;
    double t0 = moerl_now();
#pragma omp parallel for simd schedule(static) reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += a[i];
    double t = moerl_now() - t0;
    volatile float sink = s;
    (void)sink;
    return (double)n * sizeof(float) * 1e-9 / t;
}

static stat3 bench_prefill(const moe_model *m, int seqs, int len, int reps) {
    const int V = m->cfg.vocab_size;
    engine *e = engine_for(m, seqs, len + 2, seqs * len, 0);
    gen_request *r = xcalloc(seqs, sizeof *r), **done = xmalloc(seqs * sizeof *done);
    int *prompts = xmalloc((size_t)seqs * len * sizeof(int));
    double *ts = xmalloc(reps * sizeof(double));
    for (int rep = -1; rep < reps; rep++) {
        add_requests(e, r, prompts, seqs, len, V, 1, 99 + rep);
        double t0 = moerl_now();
        int k = engine_step(e, done, seqs);
        double t = moerl_now() - t0;
        /* one step prefilled every prompt and finished every request (max_tokens 1) */
        MOERL_ASSERT(k == seqs && engine_num_unfinished(e) == 0);
        for (int i = 0; i < seqs; i++) gen_request_free_outputs(&r[i]);
        if (rep >= 0) ts[rep] = (double)seqs * len / t;
    }
    stat3 s = stats_of(ts, reps);
    free(ts); free(prompts); free(done); free(r);
    engine_free(e);
    return s;
}

/* ------------------------------------------------------------------ main */

static void usage(void) {
    fprintf(stderr, "usage: bench_decode [--model A|B|all] [--reps N (>= 3)] [--batches 1,8,32,64] [--prompt-len 16]\n"
                    "                    [--max-tokens 32] [--prefill-seqs 8] [--prefill-len 256] [--stream-mb MB]"
                    " [--bf16] [--json]\n");
    exit(2);
}

typedef struct {
    int batch;
    stat3 tok_s;        /* decode tokens/s */
    double sample_frac; /* median share of decode time in sampling */
    double step_ms;     /* median ms per decode step */
    double bytes_step;  /* weight bytes one step reads (uniform-routing expectation) */
    double of_traffic;  /* median of tokens/s ÷ (bandwidth · b / bytes_step), per repetition */
    stat3 tok_s16;      /* --bf16: decode tokens/s of the bf16-weight engine */
    stat3 ratio16;      /* --bf16: bf16 tokens/s ÷ fp32 tokens/s, per repetition */
    double bytes_step16, of_traffic16; /* --bf16: the bf16 engine's bytes per step and share of its bound */
    double step_ms16, sample_frac16;
} decode_result;

typedef struct {
    char name;
    double bytes_tok, total_bytes;
    int n_batches;
    decode_result dec[MAX_BATCHES];
    stat3 prefill;
    stat3 bound_tok_s, ratio, b32_over_b1; /* medians of per-repetition values (zero if not measured) */
    stat3 bound16, ratio16;                /* --bf16: the bf16 engine's batch-1 bound and share of it */
} model_result;

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    const char *which = "all";
    int reps = 5, plen = 16, max_tokens = 32, pf_seqs = 8, pf_len = 256, json = 0, stream_mb = 0, bf16 = 0;
    int batches[MAX_BATCHES] = {1, 8, 32, 64}, nb = 4;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--json")) { json = 1; continue; }
        if (!strcmp(argv[a], "--bf16")) { bf16 = 1; continue; }
        if (a + 1 >= argc) usage();
        const char *k = argv[a], *v = argv[++a];
        if (!strcmp(k, "--model")) which = v;
        else if (!strcmp(k, "--reps")) reps = atoi(v);
        else if (!strcmp(k, "--prompt-len")) plen = atoi(v);
        else if (!strcmp(k, "--max-tokens")) max_tokens = atoi(v);
        else if (!strcmp(k, "--prefill-seqs")) pf_seqs = atoi(v);
        else if (!strcmp(k, "--prefill-len")) pf_len = atoi(v);
        else if (!strcmp(k, "--stream-mb")) stream_mb = atoi(v);
        else if (!strcmp(k, "--batches")) {
            nb = 0;
            for (const char *s = v; *s;) {
                char *end;
                long x = strtol(s, &end, 10);
                if (end == s || x < 1 || x > 4096 || nb == MAX_BATCHES) usage();
                batches[nb++] = (int)x;
                s = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') usage();
            }
        } else usage();
    }
    if (reps < 3 || plen < 1 || max_tokens < 2 || pf_seqs < 1 || pf_len < 1 || nb < 1 || stream_mb < 0) usage();
    if (strcmp(which, "A") && strcmp(which, "B") && strcmp(which, "all")) usage();
    const int nt = max_threads();
    FILE *o = json ? stderr : stdout; /* human lines go to stderr under --json */

    /* 1. memory bandwidth, before the models take memory; array a stays for the per-repetition
     *    read bandwidth of the bound */
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t arr_bytes = stream_mb > 0 ? (size_t)stream_mb << 20
                                     : MOERL_MAX((size_t)256 << 20, l3 > 0 ? 2 * (size_t)l3 : 0);
    const size_t n = arr_bytes / sizeof(float);
    float *a = xalloc_aligned(n * sizeof(float)), *b = xalloc_aligned(n * sizeof(float)),
          *c = xalloc_aligned(n * sizeof(float));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { a[i] = 1.0f; b[i] = 2.0f; c[i] = 0.0f; } /* first touch, all threads */
    bw_result bw1 = stream_bandwidth(a, b, c, n, 1, reps), bwn = stream_bandwidth(a, b, c, n, nt, reps);
    free(b); free(c);
    double load0[3] = {0, 0, 0};
    if (getloadavg(load0, 3) < 1) load0[0] = -1;

    fprintf(o, "bench_decode: OpenBLAS core %s, %d OpenMP threads, %d repetitions (median, min-max), load average "
               "%.2f at start\n",
            openblas_get_corename(), nt, reps, load0[0]);
    fprintf(o, "memory bandwidth, GB/s, arrays of %.0f MB (L3 %.0f MB):\n", arr_bytes / 1048576.0,
            l3 > 0 ? l3 / 1048576.0 : 0.0);
    fprintf(o, "  1 thread : copy %6.1f  triad %6.1f  read %6.1f\n", bw1.copy.med, bw1.triad.med, bw1.read.med);
    fprintf(o, "  %d threads: copy %6.1f  triad %6.1f  read %6.1f   <- the bound uses the all-thread read, re-measured "
               "before every batch-1 repetition\n",
            nt, bwn.copy.med, bwn.triad.med, bwn.read.med);

    int i1 = -1, i32 = -1, maxb = 0;
    for (int i = 0; i < nb; i++) {
        if (batches[i] == 1) i1 = i;
        if (batches[i] == 32) i32 = i;
        maxb = MOERL_MAX(maxb, batches[i]);
    }
    model_result res[2];
    int nres = 0;
    for (int mi = 0; mi < 2; mi++) {
        char name = mi ? 'B' : 'A';
        if (strcmp(which, "all") && which[0] != name) continue;
        moe_config cfg = config_for(name);
        moe_model m;
        /* model_init's layout without the gradient buffer (the benchmark never trains) */
        if (model_init_inference(&m, &cfg) != MOERL_OK)
            moerl_fatal("bench_decode: model %c: %s", name, moerl_last_error());
        model_init_random(&m, 1234 + mi);
        model_result *R = &res[nres++];
        memset(R, 0, sizeof *R);
        R->name = name;
        R->bytes_tok = decode_bytes_per_step(&m, 1, &R->total_bytes);
        fprintf(o, "model %c: H=%d L=%d nh=%d nkv=%d hd=%d E=%d top-%d I=%d V=%d; weights %.1f MB, read per decoded "
                   "token %.2f MB\n",
                name, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                cfg.head_dim, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.vocab_size,
                R->total_bytes / 1e6, R->bytes_tok / 1e6);
        /* Decode: one engine with max_num_seqs = the largest batch serves every batch size; the
         * batch sizes are interleaved within each repetition so that load from other processes
         * hits them alike, and the ratios are taken per repetition. */
        engine *e = engine_for(&m, maxb, plen + max_tokens + 1, maxb * plen, 0);
        /* --bf16: a second engine on the same weights computing from bf16 (rollout.dtype bf16), run
         * right after the fp32 one at every batch size of every repetition */
        engine *e16 = bf16 ? engine_for(&m, maxb, plen + max_tokens + 1, maxb * plen, 1) : NULL;
        double *ts16 = xcalloc((size_t)nb * reps, sizeof(double)), *rt16 = xcalloc((size_t)nb * reps, sizeof(double)),
               *sm16 = xcalloc((size_t)nb * reps, sizeof(double)), *sf16 = xcalloc((size_t)nb * reps, sizeof(double)),
               *oft16 = xcalloc((size_t)nb * reps, sizeof(double)), *bound16 = xcalloc(reps, sizeof(double)),
               *ratio16 = xcalloc(reps, sizeof(double));
        gen_request *rq = xcalloc(maxb, sizeof *rq), **done = xmalloc(maxb * sizeof *done);
        int *prompts = xmalloc((size_t)maxb * plen * sizeof(int));
        double *ts = xmalloc((size_t)nb * reps * sizeof(double)), *sf = xmalloc((size_t)nb * reps * sizeof(double)),
               *sm = xmalloc((size_t)nb * reps * sizeof(double)), *bound = xmalloc(reps * sizeof(double)),
               *ratio = xmalloc(reps * sizeof(double)), *r32 = xmalloc(reps * sizeof(double)),
               *oft = xmalloc((size_t)nb * reps * sizeof(double));
        double bytes_step[MAX_BATCHES];
        double bytes_step16[MAX_BATCHES];
        for (int i = 0; i < nb; i++) bytes_step[i] = decode_bytes_per_step(&m, batches[i], NULL);
        for (int i = 0; i < nb; i++) bytes_step16[i] = decode_bytes_per_step16(&m, batches[i]);
        for (int rep = -1; rep < reps; rep++) { /* rep −1 warms caches and thread pools */
            const double bw = read_bandwidth_once(a, n); /* GB/s */
            for (int i = 0; i < nb; i++) {
                double f, st;
                const double tok = decode_once(e, cfg.vocab_size, batches[i], plen, max_tokens, 17 + rep, rq, done,
                                               prompts, &f, &st);
                if (rep < 0) continue;
                ts[(size_t)i * reps + rep] = tok;
                sf[(size_t)i * reps + rep] = f;
                sm[(size_t)i * reps + rep] = st;
                oft[(size_t)i * reps + rep] = tok / (bw * 1e9 * batches[i] / bytes_step[i]);
                if (e16) {
                    const double tok16 = decode_once(e16, cfg.vocab_size, batches[i], plen, max_tokens, 17 + rep, rq,
                                                     done, prompts, &f, &st);
                    ts16[(size_t)i * reps + rep] = tok16;
                    rt16[(size_t)i * reps + rep] = tok16 / tok;
                    sm16[(size_t)i * reps + rep] = st;
                    sf16[(size_t)i * reps + rep] = f;
                    oft16[(size_t)i * reps + rep] = tok16 / (bw * 1e9 * batches[i] / bytes_step16[i]);
                }
            }
            if (rep < 0) continue;
            if (i1 >= 0) {
                bound[rep] = bw * 1e9 / R->bytes_tok;
                ratio[rep] = ts[(size_t)i1 * reps + rep] / bound[rep];
                bound16[rep] = bw * 1e9 / bytes_step16[i1];
                ratio16[rep] = ts16[(size_t)i1 * reps + rep] / bound16[rep];
            }
            if (i1 >= 0 && i32 >= 0) r32[rep] = ts[(size_t)i32 * reps + rep] / ts[(size_t)i1 * reps + rep];
        }
        R->n_batches = nb;
        for (int i = 0; i < nb; i++) {
            decode_result *d = &R->dec[i];
            d->batch = batches[i];
            d->tok_s = stats_of(ts + (size_t)i * reps, reps);
            d->sample_frac = stats_of(sf + (size_t)i * reps, reps).med;
            d->step_ms = stats_of(sm + (size_t)i * reps, reps).med;
            d->bytes_step = bytes_step[i];
            d->of_traffic = stats_of(oft + (size_t)i * reps, reps).med;
            fprintf(o, "  decode batch %3d: %9.1f tokens/s (%.1f-%.1f), %.3f ms/step, sampling %4.1f%%, weights/step "
                       "%.1f MB, %5.1f%% of their bandwidth bound\n",
                    d->batch, d->tok_s.med, d->tok_s.lo, d->tok_s.hi, d->step_ms, 100 * d->sample_frac,
                    d->bytes_step / 1e6, 100 * d->of_traffic);
            if (e16) {
                d->tok_s16 = stats_of(ts16 + (size_t)i * reps, reps);
                d->ratio16 = stats_of(rt16 + (size_t)i * reps, reps);
                d->step_ms16 = stats_of(sm16 + (size_t)i * reps, reps).med;
                d->sample_frac16 = stats_of(sf16 + (size_t)i * reps, reps).med;
                d->bytes_step16 = bytes_step16[i];
                d->of_traffic16 = stats_of(oft16 + (size_t)i * reps, reps).med;
                fprintf(o, "     bf16 weights %3d: %9.1f tokens/s (%.1f-%.1f), %.3f ms/step, sampling %4.1f%%; bf16 / "
                           "fp32 %.2fx (%.2f-%.2f, per repetition); weights/step %.1f MB, %5.1f%% of their bound\n",
                        d->batch, d->tok_s16.med, d->tok_s16.lo, d->tok_s16.hi, d->step_ms16, 100 * d->sample_frac16,
                        d->ratio16.med, d->ratio16.lo, d->ratio16.hi, d->bytes_step16 / 1e6, 100 * d->of_traffic16);
            }
        }
        if (e16) { /* weight load: fp32 weights rounded on load vs bf16 weights loaded directly */
            double *tl = xmalloc(reps * sizeof(double)), *tl16 = xmalloc(reps * sizeof(double));
            uint16_t *w16 = xmalloc(m.n_params * sizeof(uint16_t));
            for (size_t k = 0; k < m.n_params; k++) w16[k] = f32_to_bf16(m.params[k]);
            for (int rep = -1; rep < reps; rep++) {
                double t0 = moerl_now();
                if (engine_load_weights(e16, m.params, m.n_params, 1) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
                double t1 = moerl_now();
                uint16_t *dst = engine_weight_buffer_bf16(e16);
                memcpy(dst, w16, m.n_params * sizeof(uint16_t)); /* what a broadcast writes (not timed) */
                double t2 = moerl_now();
                if (engine_set_version_bf16(e16, 1) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
                double t3 = moerl_now();
                if (rep >= 0) tl[rep] = 1e3 * (t1 - t0), tl16[rep] = 1e3 * (t3 - t2);
            }
            const stat3 a32 = stats_of(tl, reps), a16 = stats_of(tl16, reps);
            fprintf(o, "  bf16 engine weight load: fp32 weights (copy, round, pack) %.1f ms (%.1f-%.1f); bf16 weights in "
                       "place (pack, widen) %.1f ms (%.1f-%.1f)\n",
                    a32.med, a32.lo, a32.hi, a16.med, a16.lo, a16.hi);
            free(tl); free(tl16); free(w16);
        }
        if (e16 && i1 >= 0) {
            R->bound16 = stats_of(bound16, reps);
            R->ratio16 = stats_of(ratio16, reps);
        }
        engine_free(e16);
        free(ts16); free(rt16); free(sm16); free(sf16); free(oft16); free(bound16); free(ratio16);
        if (i1 >= 0) {
            R->bound_tok_s = stats_of(bound, reps);
            R->ratio = stats_of(ratio, reps);
        }
        if (i1 >= 0 && i32 >= 0) R->b32_over_b1 = stats_of(r32, reps);
        free(ts); free(sf); free(sm); free(bound); free(ratio); free(r32); free(oft); free(prompts); free(done); free(rq);
        engine_free(e);

        R->prefill = bench_prefill(&m, pf_seqs, pf_len, reps);
        fprintf(o, "  prefill %d x %d: %9.1f tokens/s (%.1f-%.1f)\n", pf_seqs, pf_len, R->prefill.med, R->prefill.lo,
                R->prefill.hi);
        if (i1 >= 0)
            fprintf(o, "  batch-1: %.1f tokens/s, bandwidth bound %.1f tokens/s (%.1f-%.1f), ratio %.1f%% (%.1f-%.1f; "
                       "target >= 50%%)%s\n",
                    R->dec[i1].tok_s.med, R->bound_tok_s.med, R->bound_tok_s.lo, R->bound_tok_s.hi, 100 * R->ratio.med,
                    100 * R->ratio.lo, 100 * R->ratio.hi,
                    l3 > 0 && R->total_bytes < (double)l3 ? "\n    note: the weights fit in L3, so the DRAM bound does "
                                                            "not bind and the ratio can exceed 100%"
                                                          : "");
        if (i1 >= 0 && bf16)
            fprintf(o, "  bf16 batch-1: %.1f tokens/s, bandwidth bound %.1f tokens/s (%.1f-%.1f; %.2f MB per token), "
                       "%.1f%% of the bound (%.1f-%.1f)\n",
                    R->dec[i1].tok_s16.med, R->bound16.med, R->bound16.lo, R->bound16.hi, R->dec[i1].bytes_step16 / 1e6,
                    100 * R->ratio16.med, 100 * R->ratio16.lo, 100 * R->ratio16.hi);
        if (i1 >= 0 && i32 >= 0)
            fprintf(o, "  batch-32 aggregate / batch-1: %.2fx (%.2f-%.2f; target >= 8x); if both were at their "
                       "bandwidth bound: %.2fx\n",
                    R->b32_over_b1.med, R->b32_over_b1.lo, R->b32_over_b1.hi,
                    32 * R->dec[i1].bytes_step / R->dec[i32].bytes_step);
        model_free(&m);
    }
    free(a);
    double load1[3] = {0, 0, 0};
    if (getloadavg(load1, 3) < 1) load1[0] = -1;
    fprintf(o, "load average %.2f at the end (other processes on the cores slow every number above)\n", load1[0]);

    if (json) {
        printf("{\"bench\":\"decode\",\"openblas_core\":\"%s\",\"threads\":%d,\"reps\":%d,\"prompt_len\":%d,"
               "\"max_tokens\":%d,\"l3_bytes\":%ld,\"stream_array_bytes\":%zu,\"loadavg_start\":%.2f,"
               "\"loadavg_end\":%.2f,\n",
               openblas_get_corename(), nt, reps, plen, max_tokens, l3, arr_bytes, load0[0], load1[0]);
        printf(" \"bandwidth_gbs\":{\"1\":{\"copy\":%.3f,\"triad\":%.3f,\"read\":%.3f},\"%d\":{\"copy\":%.3f,\"triad\":%.3f,"
               "\"read\":%.3f},\"bound_uses\":\"all_threads_read\"},\n",
               bw1.copy.med, bw1.triad.med, bw1.read.med, nt, bwn.copy.med, bwn.triad.med, bwn.read.med);
        printf(" \"models\":[");
        for (int r = 0; r < nres; r++) {
            const model_result *R = &res[r];
            printf("%s\n  {\"model\":\"%c\",\"weight_bytes\":%.0f,\"bytes_per_token\":%.0f,\"decode\":[", r ? "," : "",
                   R->name, R->total_bytes, R->bytes_tok);
            for (int i = 0; i < R->n_batches; i++) {
                const decode_result *d = &R->dec[i];
                printf("%s{\"batch\":%d,\"tokens_per_s\":%.3f,\"min\":%.3f,\"max\":%.3f,\"ms_per_step\":%.4f,"
                       "\"sample_frac\":%.4f,\"weight_bytes_per_step\":%.0f,\"of_bandwidth_bound\":%.4f}",
                       i ? "," : "", d->batch, d->tok_s.med, d->tok_s.lo, d->tok_s.hi, d->step_ms, d->sample_frac,
                       d->bytes_step, d->of_traffic);
            }
            printf("],\n   \"prefill\":{\"seqs\":%d,\"len\":%d,\"tokens_per_s\":%.3f,\"min\":%.3f,\"max\":%.3f},\n", pf_seqs,
                   pf_len, R->prefill.med, R->prefill.lo, R->prefill.hi);
            printf("   \"bound_tokens_per_s\":%.3f,\"batch1_over_bound\":%.4f,\"batch32_over_batch1\":%.4f",
                   R->bound_tok_s.med, R->ratio.med, R->b32_over_b1.med);
            if (bf16)
                printf(",\n   \"bf16_bound_tokens_per_s\":%.3f,\"bf16_batch1_over_bound\":%.4f", R->bound16.med,
                       R->ratio16.med);
            printf("}");
        }
        printf("]}\n");
    }
    return 0;
}
