/* llamacpp_grpo — rollout throughput on one GRPO workload (issue 28, "Measured"): moerl's rollout
 * engine with prefix caching (one prefill per group), the same engine without it (every sample
 * prefills its prompt), and llama.cpp (its prebuilt CPU library from the npm package
 * @node-llama-cpp/linux-x64) driven with its own prompt sharing, on the same weights, the same
 * threads and the same work. Built and run by bench/run_llamacpp_grpo.sh; docs/engine.md has the
 * command and the figures.
 *
 *   llamacpp_grpo --lib-dir DIR [--groups 8] [--n 8] [--prompt-min 256] [--prompt-max 512]
 *                 [--alpha 1.0] [--resp-min 4] [--resp-max 256] [--max-seqs G·n]
 *                 [--max-batched-tokens 2048] [--dtype f32|bf16] [--reps 3] [--seed 2026]
 *                 [--llama-kv default|unified|split|both] [--greedy] [--workload-out FILE] [--workload FILE] [--tmp DIR]
 *
 * Workload (drawn once from --seed; every repetition and every side runs exactly it): G prompts
 * of uniform length in [prompt-min, prompt-max] with uniform token ids in [0, 512), n samples each; every
 * sample's response length is forced (EOS ignored, the sequence stops at its drawn length), drawn
 * from the heavy tail of bench/run_async.sh (rollout.synthetic_length: min · u^(−1/alpha), rounded
 * up, capped at resp-max). Sampling: temperature 1 (--greedy: 0), no top-k/top-p, every sequence
 * with its own RNG seeded alike on every side, and every side samples with moerl's sample_token on
 * its own logits (so the sampling work is the same). The model: the benchmark model B of
 * bench_decode (llamacpp_common.h, 433 MB fp32, random weights, seed 1235), exported by
 * model_export_gguf to a temporary GGUF in --dtype; moerl computes from the same weights
 * (--dtype bf16: engine_config.bf16_weights, the same bf16 rounding).
 *
 * moerl: one engine per setting (max_num_seqs = --max-seqs, max_num_batched_tokens as given, the
 * default KV budget: room for every admitted sequence, so nothing is preempted); all requests are
 * added at once and stepped to the end. Before every run the weights are loaded again, which
 * forgets the prefix cache (blocks cached by the previous repetition are never reused).
 *
 * llama.cpp: a context of --max-seqs sequences at llama.cpp's defaults (f16 KV cache, flash
 * attention auto, n_batch 2048 / n_ubatch 512, llama_context_default_params' kv_unified unless
 * --llama-kv says otherwise; MOERL_LLAMA_FLASH_ATTN=on|off overrides flash attention), n_ctx room
 * for --max-seqs × (prompt-max + resp-max) cells. Continuous batching, as moerl's scheduler: a
 * group is admitted (FIFO) when n sequence ids are free; its prompt is prefilled ONCE in the
 * group's first sequence, in chunks within the step's token budget (the decode tokens of the
 * running sequences first, then prompt chunks, together at most --max-batched-tokens per
 * llama_decode); when the prompt is complete its KV is copied to the group's other sequences with
 * llama_memory_seq_cp (unified KV: the cells gain the sequence ids, no copy; split KV: the stream
 * is copied) and each of the n samples draws its first token from the prompt's last logits; then
 * one decode token per running sequence per step; a finished sequence gives its cells back
 * (llama_memory_seq_rm) and its id to the next group.
 *
 * Printed per repetition (the sides interleaved, their order rotated per repetition, after one
 * warm-up of the first group on every side): wall seconds, total tokens/s = (Σ over sequences of
 * prompt tokens + generated tokens) / wall, generated tokens/s, and the ratios moerl (caching on)
 * / the others; then medians (min–max) over --reps. The same numerator on every side, so a ratio
 * is a ratio of wall times. Checks that every side did the same work (exit 1 otherwise): the
 * generated tokens equal Σ drawn lengths on every side, every sequence's output length equals its
 * drawn length, moerl's prefilled + shared prompt tokens cover every sequence's prompt; and
 * reported: the prompt tokens each side forwarded, and per side pair the sequences whose first 8
 * tokens agree (same seeds: they agree until the two sides' logits differ enough to move a draw).
 * --workload-out writes the drawn workload to a file (bench/grpo_workload.h: the format), which
 * bench_paged --workload and llamacpp_grpo --workload read (then it replaces the draw).
 *
 * Threads: OMP_NUM_THREADS (moerl) = llama.cpp's n_threads = n_threads_batch.
 */
#include "base/common.h"
#include "base/rng.h"
#include "model/gguf.h"
#include "model/model.h"
#include "rollout/engine.h"

#include "grpo_workload.h"
#include "llamacpp_common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define AGREE_K 8     /* leading tokens compared between sides */
#define MAX_SIDES 4   /* moerl on, moerl off, llama.cpp × (default | unified | split) up to two */

typedef struct {
    int G, n, pmin, pmax, rmin, rmax, max_seqs, max_batched, reps, greedy;
    double alpha;
    uint64_t seed;
} grpo_opts;

/* What one run did: wall seconds, the prompt tokens it forwarded, its generated tokens, the first
 * AGREE_K tokens of every sequence (−1 past its end), whether every length matched its draw. */
typedef struct {
    double wall;
    int64_t prefilled, shared, generated;
    int *head; /* [n_seq × AGREE_K] */
    int lengths_ok;
} run_result;

static uint64_t seq_seed(uint64_t seed, int i) { return seed * 1000003ULL + (uint64_t)i; }

static void sampling_of(sampling_params *sp, const grpo_opts *o, const workload *w, int i) {
    memset(sp, 0, sizeof *sp);
    sp->temperature = o->greedy ? 0.0f : 1.0f;
    sp->top_p = 1.0f;
    sp->seed = seq_seed(o->seed, i);
    sp->max_tokens = w->rlen[i];
    sp->ignore_eos = 1;
}

/* ------------------------------------------------------------------ moerl side */

static engine *moerl_engine(const moe_config *cfg, const moe_model *m, const grpo_opts *o, const workload *w,
                            int caching, int bf16) {
    engine_config ec = {.max_num_seqs = o->max_seqs, .max_model_len = w->max_plen + w->max_rlen + 1,
                        .max_num_batched_tokens = o->max_batched, .enable_prefix_caching = caching,
                        .bf16_weights = bf16};
    engine *e = engine_create(cfg, ec);
    if (!e || engine_load_weights(e, m->params, m->n_params, 0) != MOERL_OK) moerl_fatal("engine: %s", moerl_last_error());
    return e;
}

/* One run of w on e (prefix cache forgotten first); fills res. */
static void moerl_run(engine *e, const moe_model *m, const grpo_opts *o, const workload *w, run_result *res) {
    if (engine_load_weights(e, m->params, m->n_params, 0) != MOERL_OK) moerl_fatal("engine: %s", moerl_last_error());
    const engine_stats s0 = engine_get_stats(e);
    gen_request *r = xcalloc(w->n_seq, sizeof *r), **done = xmalloc((size_t)w->n_seq * sizeof *done);
    const double t0 = moerl_now();
    for (int i = 0; i < w->n_seq; i++) {
        r[i].id = i;
        r[i].prompt = w->prompt[i / w->n];
        r[i].prompt_len = w->plen[i / w->n];
        sampling_of(&r[i].sp, o, w, i);
        if (engine_add(e, &r[i]) != MOERL_OK) moerl_fatal("engine_add: %s", moerl_last_error());
    }
    while (engine_num_unfinished(e) > 0)
        if (engine_step(e, done, w->n_seq) < 0) moerl_fatal("engine_step: %s", moerl_last_error());
    res->wall = moerl_now() - t0;
    const engine_stats s1 = engine_get_stats(e);
    res->prefilled = s1.prefill_tokens - s0.prefill_tokens;
    res->shared = s1.prefix_hit_tokens - s0.prefix_hit_tokens;
    res->generated = s1.generated_tokens - s0.generated_tokens;
    res->lengths_ok = 1;
    for (int i = 0; i < w->n_seq; i++) {
        res->lengths_ok &= r[i].n_out == w->rlen[i] && r[i].finish == FINISH_LENGTH;
        for (int k = 0; k < AGREE_K; k++) res->head[i * AGREE_K + k] = k < r[i].n_out ? r[i].out_tokens[k] : -1;
        gen_request_free_outputs(&r[i]);
    }
    free(r); free(done);
}

/* ------------------------------------------------------------------ llama.cpp side */

enum { LS_WAIT = 0, LS_PREFILL, LS_DECODE, LS_DONE };

/* The scheduler's state for one run: per sequence its llama.cpp sequence id (slot), state,
 * sampled tokens, RNG and batch index of its logits; per group the prompt tokens prefilled. */
typedef struct {
    const workload *w;
    int *slot, *state, *n_out, *last, *idx, *head;
    int *free_ids, n_free;
    int *group_done_prefill, *group_idx; /* per group: prompt tokens submitted; batch index of its last prompt token */
    rng_state *rng;
    sampling_params *sp;
    int next_group, n_done;
    int64_t generated;
    float *scratch;
} llama_sched;

static void sched_sample(llama_sched *S, llama_side *L, int i, int batch_i) {
    float lp;
    const int tok = sample_token(llama_get_logits_ith(L->ctx, batch_i), L->n_vocab, &S->sp[i], &S->rng[i], &lp, S->scratch);
    if (S->n_out[i] < AGREE_K) S->head[i * AGREE_K + S->n_out[i]] = tok;
    S->last[i] = tok;
    S->n_out[i]++;
    S->generated++;
    if (S->n_out[i] == S->w->rlen[i]) { /* finished: cells and id back */
        llama_memory_seq_rm(llama_get_memory(L->ctx), S->slot[i], -1, -1);
        S->free_ids[S->n_free++] = S->slot[i];
        S->state[i] = LS_DONE;
        S->n_done++;
    } else {
        S->state[i] = LS_DECODE;
    }
}

/* Admit groups FIFO while n ids are free; the group's sequence 0 prefills. */
static void sched_admit(llama_sched *S) {
    const workload *w = S->w;
    while (S->next_group < w->G && S->n_free >= w->n) {
        const int g = S->next_group++;
        for (int j = 0; j < w->n; j++) {
            const int i = g * w->n + j;
            S->slot[i] = S->free_ids[--S->n_free];
            S->state[i] = j == 0 ? LS_PREFILL : LS_WAIT;
        }
        S->group_done_prefill[g] = 0;
    }
}

/* One step: the decode tokens, then prompt chunks within the budget; llama_decode; sampling. */
static void sched_step(llama_sched *S, llama_side *L, int budget) {
    const workload *w = S->w;
    struct llama_batch *b = &L->batch;
    b->n_tokens = 0;
    for (int i = 0; i < w->n_seq; i++)
        if (S->state[i] == LS_DECODE) {
            S->idx[i] = b->n_tokens;
            batch_add(b, S->last[i], w->plen[i / w->n] + S->n_out[i] - 1, S->slot[i], 1);
        }
    for (int g = 0; g < S->next_group && b->n_tokens < budget; g++) {
        const int lead = g * w->n;
        if (S->state[lead] != LS_PREFILL) continue;
        const int from = S->group_done_prefill[g], k = MOERL_MIN(w->plen[g] - from, budget - b->n_tokens);
        for (int j = from; j < from + k; j++) batch_add(b, w->prompt[g][j], j, S->slot[lead], j == w->plen[g] - 1);
        S->group_done_prefill[g] += k;
        S->group_idx[g] = b->n_tokens - 1;
    }
    if (b->n_tokens == 0) moerl_fatal("llama.cpp scheduler: an empty step (%d of %d sequences done)", S->n_done, w->n_seq);
    llama_run(L);
    llama_memory_t mem = llama_get_memory(L->ctx);
    for (int g = 0; g < S->next_group; g++) {
        const int lead = g * w->n;
        if (S->state[lead] != LS_PREFILL || S->group_done_prefill[g] < w->plen[g]) continue;
        for (int j = 1; j < w->n; j++) llama_memory_seq_cp(mem, S->slot[lead], S->slot[lead + j], -1, -1);
        for (int j = 0; j < w->n; j++) sched_sample(S, L, lead + j, S->group_idx[g]);
    }
    for (int i = 0; i < w->n_seq; i++)
        if (S->state[i] == LS_DECODE && S->idx[i] >= 0) sched_sample(S, L, i, S->idx[i]);
}

/* One run of w on llama.cpp (memory cleared first); fills res. */
static void llama_grpo_run(llama_side *L, const grpo_opts *o, const workload *w, run_result *res) {
    llama_memory_clear(llama_get_memory(L->ctx), true);
    const int N = w->n_seq;
    llama_sched S = {.w = w, .head = res->head};
    S.slot = xmalloc((size_t)N * sizeof(int)); S.state = xcalloc(N, sizeof(int)); S.n_out = xcalloc(N, sizeof(int));
    S.last = xcalloc(N, sizeof(int)); S.idx = xmalloc((size_t)N * sizeof(int));
    S.group_done_prefill = xcalloc(w->G, sizeof(int)); S.group_idx = xcalloc(w->G, sizeof(int));
    S.free_ids = xmalloc((size_t)L->n_seq * sizeof(int));
    S.rng = xmalloc((size_t)N * sizeof *S.rng); S.sp = xmalloc((size_t)N * sizeof *S.sp);
    S.scratch = xmalloc(2 * (size_t)L->n_vocab * sizeof(float));
    for (int s = L->n_seq - 1; s >= 0; s--) S.free_ids[S.n_free++] = s;
    for (int i = 0; i < N; i++) {
        sampling_of(&S.sp[i], o, w, i);
        rng_seed(&S.rng[i], S.sp[i].seed); /* as engine_add seeds a turn-0 request */
        for (int k = 0; k < AGREE_K; k++) res->head[i * AGREE_K + k] = -1;
    }
    int64_t prefilled = 0;
    for (int g = 0; g < w->G; g++) prefilled += w->plen[g];
    const double t0 = moerl_now();
    while (S.n_done < N) {
        sched_admit(&S);
        for (int i = 0; i < N; i++) S.idx[i] = -1;
        sched_step(&S, L, o->max_batched);
    }
    res->wall = moerl_now() - t0;
    res->prefilled = prefilled;
    res->shared = w->prompt_tokens - prefilled;
    res->generated = S.generated;
    res->lengths_ok = 1;
    for (int i = 0; i < N; i++) res->lengths_ok &= S.n_out[i] == w->rlen[i];
    free(S.slot); free(S.state); free(S.n_out); free(S.last); free(S.idx); free(S.group_done_prefill);
    free(S.group_idx); free(S.free_ids); free(S.rng); free(S.sp); free(S.scratch);
}

/* ------------------------------------------------------------------ the benchmark */

typedef struct {
    const char *name;
    engine *e;     /* moerl side, or NULL */
    llama_side L;  /* llama.cpp side when e is NULL */
    double *wall;  /* [reps] */
    run_result last;
} side;

static void side_run(side *s, const moe_model *m, const grpo_opts *o, const workload *w, run_result *res) {
    if (s->e) moerl_run(s->e, m, o, w, res);
    else llama_grpo_run(&s->L, o, w, res);
}

/* Every side did the same work: the generated tokens and every length as drawn; moerl's prompt
 * tokens (prefilled + served from shared blocks) cover every sequence's prompt. Returns 0 if so. */
static int check_work(const side *s, const workload *w) {
    const run_result *r = &s->last;
    int bad = 0;
    if (r->generated != w->gen_tokens || !r->lengths_ok) {
        fprintf(stderr, "%s: %lld generated tokens, %lld drawn; every length as drawn: %s\n", s->name,
                (long long)r->generated, (long long)w->gen_tokens, r->lengths_ok ? "yes" : "NO");
        bad = 1;
    }
    if (s->e && r->prefilled + r->shared < w->prompt_tokens) {
        fprintf(stderr, "%s: %lld prompt tokens prefilled + %lld shared < %lld prompt tokens of the workload\n", s->name,
                (long long)r->prefilled, (long long)r->shared, (long long)w->prompt_tokens);
        bad = 1;
    }
    return bad;
}

/* Sequences whose first min(AGREE_K, length) tokens agree between two runs. */
static int agree(const run_result *a, const run_result *b, int n_seq) {
    int same = 0;
    for (int i = 0; i < n_seq; i++) same += !memcmp(a->head + i * AGREE_K, b->head + i * AGREE_K, AGREE_K * sizeof(int));
    return same;
}

static void report(side *sd, int ns, const grpo_opts *o, const workload *w) {
    const double tot = (double)(w->prompt_tokens + w->gen_tokens), gen = (double)w->gen_tokens;
    double *v = xmalloc((size_t)o->reps * sizeof(double));
    printf("\nside                       wall s (median, min-max)   total tokens/s   generated tokens/s   "
           "%s / side (per repetition)\n", sd[0].name);
    for (int s = 0; s < ns; s++) {
        memcpy(v, sd[s].wall, (size_t)o->reps * sizeof(double));
        const stat3 t = stats_of(v, o->reps);
        for (int r = 0; r < o->reps; r++) v[r] = sd[s].wall[r] / sd[0].wall[r];
        const stat3 q = stats_of(v, o->reps);
        printf("%-26s %7.2f (%.2f-%.2f)        %8.1f         %8.1f           %5.2fx (%.2f-%.2f)\n", sd[s].name, t.med,
               t.lo, t.hi, tot / t.med, gen / t.med, q.med, q.lo, q.hi);
    }
    free(v);
    printf("\nwork per run (identical on every side: %lld prompt tokens over %d sequences, %lld generated):\n",
           (long long)w->prompt_tokens, w->n_seq, (long long)w->gen_tokens);
    for (int s = 0; s < ns; s++)
        printf("  %-26s prompt tokens forwarded %lld, shared %lld, generated %lld, every length as drawn: %s\n",
               sd[s].name, (long long)sd[s].last.prefilled, (long long)sd[s].last.shared,
               (long long)sd[s].last.generated, sd[s].last.lengths_ok ? "yes" : "NO");
    printf("sequences whose first %d tokens agree (same seeds; %s):\n", AGREE_K, o->greedy ? "greedy" : "temperature 1");
    for (int s = 1; s < ns; s++)
        printf("  %s vs %s: %d / %d\n", sd[0].name, sd[s].name, agree(&sd[0].last, &sd[s].last, w->n_seq), w->n_seq);
}

typedef struct { int kv, max_batched; } llama_opts;
static void llama_tweak(struct llama_context_params *cp, void *arg) {
    const llama_opts *k = arg;
    if (k->kv >= 0) cp->kv_unified = k->kv == 1;
    if ((uint32_t)k->max_batched > cp->n_batch) cp->n_batch = (uint32_t)k->max_batched;
}

static void print_header(const grpo_opts *o, const workload *w, const moe_model *m, int bf16, const char *file) {
    const struct llama_context_params dp = llama_context_default_params();
    double load[3] = {0};
    if (getloadavg(load, 3) < 1) load[0] = -1;
    printf("llamacpp_grpo: model B (H 512, 8 layers, 32 experts top-4, V 2048; %.0f MB fp32), %s weights on both sides, "
           "%d threads, load average %.2f at start\n", (double)m->n_params * 4 / 1e6, bf16 ? "bf16" : "f32", n_threads(),
           load[0]);
    if (file)
        printf("workload from %s: %d prompts (mean %.0f tokens, longest %d) x n = %d; ", file, w->G,
               (double)w->prompt_tokens / w->n_seq, w->max_plen, w->n);
    else
        printf("workload: %d prompts of %d-%d tokens (mean %.0f) x n = %d; responses min*u^(-1/%.2g), min %d, cap %d, ",
               w->G, o->pmin, o->pmax, (double)w->prompt_tokens / w->n_seq, w->n, o->alpha, o->rmin, o->rmax);
    printf("responses mean %.1f, longest %d, EOS ignored; %s; %lld prompt + %lld generated tokens per run\n",
           (double)w->gen_tokens / w->n_seq, w->max_rlen, o->greedy ? "greedy" : "temperature 1",
           (long long)w->prompt_tokens, (long long)w->gen_tokens);
    printf("max concurrent sequences %d, %d tokens per step; %d repetitions after one warm-up (group 1) per side; "
           "llama.cpp defaults: KV cache %s, kv_unified %d, flash attention %s, n_batch %u, n_ubatch %u\n",
           o->max_seqs, o->max_batched, o->reps, ggml_type_name(dp.type_k), (int)dp.kv_unified,
           getenv("MOERL_LLAMA_FLASH_ATTN") ? getenv("MOERL_LLAMA_FLASH_ATTN") : "auto", dp.n_batch, dp.n_ubatch);
}

static int run_grpo(const grpo_opts *opts, int bf16, const int *llama_kv, int n_llama, const char *tmpdir,
                    const char *workload_in, const char *workload_out) {
    moe_config cfg = config_B();
    moe_model m;
    if (model_init_inference(&m, &cfg) != MOERL_OK) moerl_fatal("model: %s", moerl_last_error());
    model_init_random(&m, 1235); /* bench_decode's model B seed (1234 + 1) */
    workload w;
    grpo_opts oo = *opts; /* --max-seqs 0: every sequence of the workload (at most llama.cpp's 256) */
    const grpo_opts *o = &oo;
    if (workload_in) {
        if (workload_read(&w, workload_in, cfg.vocab_size, cfg.max_position_embeddings - 1) != MOERL_OK)
            moerl_fatal("%s", moerl_last_error());
    } else {
        w = workload_draw(o->G, o->n, o->pmin, o->pmax, o->alpha, o->rmin, o->rmax, cfg.vocab_size, o->seed);
    }
    if (w.max_plen + w.max_rlen + 1 > cfg.max_position_embeddings)
        moerl_fatal("--prompt-max %d + --resp-max %d exceed model B's %d positions", o->pmax, o->rmax, cfg.max_position_embeddings);
    if (!oo.max_seqs) oo.max_seqs = MOERL_MIN(w.n_seq, 256);
    if (oo.max_seqs < w.n || oo.max_batched < oo.max_seqs)
        moerl_fatal("--max-seqs %d must hold a group (n %d) and fit in --max-batched-tokens %d", oo.max_seqs, w.n, oo.max_batched);
    if (workload_out && workload_write(&w, workload_out) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
    char gguf[4200];
    snprintf(gguf, sizeof gguf, "%s/moerl_grpo_B.%d.gguf", tmpdir, (int)getpid());
    if (model_export_gguf(&m, gguf, bf16 ? GGUF_EXPORT_BF16 : GGUF_EXPORT_F32) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
    struct llama_model *lm = llama_load_gguf(gguf);
    unlink(gguf);
    side sd[MAX_SIDES];
    memset(sd, 0, sizeof sd);
    int ns = 0;
    sd[ns].name = "moerl, prefix caching on";
    sd[ns++].e = moerl_engine(&cfg, &m, o, &w, 1, bf16);
    sd[ns].name = "moerl, prefix caching off";
    sd[ns++].e = moerl_engine(&cfg, &m, o, &w, 0, bf16);
    const int per = (w.max_plen + w.max_rlen + 1 + 255) / 256 * 256;
    for (int k = 0; k < n_llama; k++) {
        llama_opts lo = {llama_kv[k], o->max_batched};
        sd[ns].name = llama_kv[k] < 0 ? "llama.cpp, seq_cp" : llama_kv[k] ? "llama.cpp, seq_cp, unified KV" : "llama.cpp, seq_cp, split KV";
        llama_ctx_open(&sd[ns++].L, lm, o->max_seqs, o->max_seqs * per, MOERL_MAX(o->max_batched, o->max_seqs), llama_tweak, &lo);
    }
    print_header(o, &w, &m, bf16, workload_in);
    const workload warm = workload_head(&w, 1);
    for (int s = 0; s < ns; s++) {
        sd[s].wall = xmalloc((size_t)o->reps * sizeof(double));
        sd[s].last.head = xmalloc((size_t)w.n_seq * AGREE_K * sizeof(int));
        side_run(&sd[s], &m, o, &warm, &sd[s].last);
    }
    int bad = 0;
    for (int rep = 0; rep < o->reps; rep++) {
        printf("rep %d:", rep + 1);
        for (int k = 0; k < ns; k++) {
            const int s = (k + rep) % ns; /* rotated order */
            side_run(&sd[s], &m, o, &w, &sd[s].last);
            sd[s].wall[rep] = sd[s].last.wall;
            bad |= check_work(&sd[s], &w);
        }
        for (int s = 0; s < ns; s++) printf("  %s %.2f s (%.1f tok/s)", sd[s].name, sd[s].wall[rep],
                                            (double)(w.prompt_tokens + w.gen_tokens) / sd[s].wall[rep]);
        printf("\n");
        fflush(stdout);
    }
    report(sd, ns, o, &w);
    double load[3] = {0};
    if (getloadavg(load, 3) < 1) load[0] = -1;
    printf("load average %.2f at the end (other processes on the cores slow every number above)\n", load[0]);
    if (bad) printf("WORK MISMATCH: the sides did not do the same work (stderr says how)\n");
    for (int s = 0; s < ns; s++) {
        if (sd[s].e) engine_free(sd[s].e);
        else llama_close(&sd[s].L);
        free(sd[s].wall);
        free(sd[s].last.head);
    }
    llama_model_free(lm);
    workload_free(&w);
    model_free(&m);
    return bad;
}

static void usage(void) {
    fprintf(stderr, "usage: llamacpp_grpo --lib-dir DIR [--groups 8] [--n 8] [--prompt-min 256] [--prompt-max 512] "
                    "[--alpha 1.0] [--resp-min 4] [--resp-max 256] [--max-seqs G*n] [--max-batched-tokens 2048] "
                    "[--dtype f32|bf16] [--reps 3] [--seed 2026] [--llama-kv default|unified|split|both] [--greedy] "
                    "[--workload-out FILE] [--workload FILE] [--tmp DIR]\n");
    exit(2);
}

static int int_arg(const char *k, const char *v, int lo, int hi) {
    char *end;
    const long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "llamacpp_grpo: %s '%s': expected an integer in [%d, %d]\n", k, v, lo, hi);
        exit(2);
    }
    return (int)x;
}

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    const char *lib_dir = NULL, *tmpdir = "/tmp", *wout = NULL, *win = NULL;
    grpo_opts o = {.G = 8, .n = 8, .pmin = 256, .pmax = 512, .rmin = 4, .rmax = 256, .max_seqs = 0, .max_batched = 2048,
                   .reps = 3, .alpha = 1.0, .seed = 2026};
    int bf16 = 0, kv[2] = {-1}, n_kv = 1;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--greedy")) { o.greedy = 1; continue; }
        if (a + 1 >= argc) usage();
        const char *k = argv[a], *v = argv[++a];
        if (!strcmp(k, "--lib-dir")) lib_dir = v;
        else if (!strcmp(k, "--tmp")) tmpdir = v;
        else if (!strcmp(k, "--workload-out")) wout = v;
        else if (!strcmp(k, "--workload")) win = v;
        else if (!strcmp(k, "--groups")) o.G = int_arg(k, v, 1, 4096);
        else if (!strcmp(k, "--n")) o.n = int_arg(k, v, 1, 256);
        else if (!strcmp(k, "--prompt-min")) o.pmin = int_arg(k, v, 1, 4000);
        else if (!strcmp(k, "--prompt-max")) o.pmax = int_arg(k, v, 1, 4000);
        else if (!strcmp(k, "--resp-min")) o.rmin = int_arg(k, v, 1, 4000);
        else if (!strcmp(k, "--resp-max")) o.rmax = int_arg(k, v, 1, 4000);
        else if (!strcmp(k, "--max-seqs")) o.max_seqs = int_arg(k, v, 1, 256);
        else if (!strcmp(k, "--max-batched-tokens")) o.max_batched = int_arg(k, v, 1, 1 << 16);
        else if (!strcmp(k, "--reps")) o.reps = int_arg(k, v, 1, 1000);
        else if (!strcmp(k, "--seed")) o.seed = (uint64_t)int_arg(k, v, 0, 1 << 30);
        else if (!strcmp(k, "--alpha")) {
            o.alpha = atof(v);
            if (!(o.alpha > 0) || !isfinite(o.alpha)) { fprintf(stderr, "llamacpp_grpo: --alpha '%s': expected > 0\n", v); exit(2); }
        } else if (!strcmp(k, "--dtype")) {
            if (!strcmp(v, "f32")) bf16 = 0;
            else if (!strcmp(v, "bf16")) bf16 = 1;
            else { fprintf(stderr, "llamacpp_grpo: --dtype '%s': expected f32 or bf16\n", v); exit(2); }
        } else if (!strcmp(k, "--llama-kv")) {
            if (!strcmp(v, "default")) { kv[0] = -1; n_kv = 1; }
            else if (!strcmp(v, "unified")) { kv[0] = 1; n_kv = 1; }
            else if (!strcmp(v, "split")) { kv[0] = 0; n_kv = 1; }
            else if (!strcmp(v, "both")) { kv[0] = 1; kv[1] = 0; n_kv = 2; }
            else { fprintf(stderr, "llamacpp_grpo: --llama-kv '%s': expected default, unified, split or both\n", v); exit(2); }
        } else usage();
    }
    if (!lib_dir) usage();
    if (o.pmin > o.pmax || o.rmin > o.rmax) {
        fprintf(stderr, "llamacpp_grpo: need --prompt-min ≤ --prompt-max and --resp-min ≤ --resp-max (got %d > %d or %d > %d)\n",
                o.pmin, o.pmax, o.rmin, o.rmax);
        return 2;
    }
    if ((!win && o.max_seqs && o.max_seqs < o.n) || o.max_batched < o.max_seqs) {
        fprintf(stderr, "llamacpp_grpo: --max-seqs %d must hold a group (--n %d) and fit in --max-batched-tokens %d "
                        "(one decode token per sequence per step)\n", o.max_seqs, o.n, o.max_batched);
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    ggml_backend_load_all_from_path(lib_dir);
    llama_backend_init();
    const int rc = run_grpo(&o, bf16, kv, n_kv, tmpdir, win, wout);
    llama_backend_free();
    return rc;
}
