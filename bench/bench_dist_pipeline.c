/* Pipeline bubble: the 1F1B schedule, plain and interleaved (src/parallel/pipeline.c), measured against
 * its theory.
 * Run under mpirun -np P: one pipeline of P stages over the benchmark model (bench_util.h) with
 * --layers decoder layers, a batch of --seqs sequences of --seq-len tokens, SFT loss, aux loss on.
 * Configurations, each --reps timed steps after one warm-up step:
 *   fixed m       micro-batches of T/m tokens (m from --fixed, e.g. 2,4), look-ahead receives off
 *                 and on;
 *   dynamic       the count chosen from the token budget (pp_options: 4..16 micro-batches of at least
 *                 K tokens, for each K of --min-mb-tokens), look-ahead receives on.
 * With --vpp 1,2 the same rows again with the interleaved schedule (v chunks per stage, pp_options.
 *   virtual_stages; fixed m with look-ahead receives, and dynamic), in the same run.
 * Per configuration (medians over the reps): v, m, step time (train_accumulate: schedule + gradient
 * exchange), the idle share of the stages (perf/pipeline_bubble: mean over stages of 1 − busy / T,
 * T the slowest stage's schedule time), the receive-wait share, the 1F1B theory (P−1)/(m+P−1), the
 * interleaved theory (P−1)/(v·m+P−1), and
 * the speed-up over ONE rank running the same micro-batches (a one-stage pipeline: the same code,
 * threads and progress thread, the whole model; measured in the same run on rank 0 while the other
 * ranks wait; ideal P·(1 − bubble)).
 * Stage-owned with data-parallel pipelines (--owned D, -np D·pp): the stage's gradient sum after the
 *   schedule against overlapped with the cool-down (pp_options.overlap_grads), for each v of --vpp.
 * Memory (--memory): the model state per rank, replicated (every rank: fp32 parameters, gradients and
 * the two AdamW moments of the whole model, 16 B per parameter) against stage-owned (par_state_init:
 * each stage its own range, pipeline.h): after one training step through parallel.h's entry points,
 * the resident bytes of the sparse parameter and gradient maps (mincore) and the moments' bytes, per
 * stage. With --config-json F (a Hugging Face config.json) --pp a,b,...: the same arithmetic for
 * that model without allocating it (the FLOP-balanced cut for min(max_position_embeddings, 4096)
 * tokens, pp_stage_ranges): GiB per stage and the largest stage against replicated. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "bench_util.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "optim/adamw.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "train/train.h"

static double g_inv;

static double sft_cb(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                     float *dent) {
    (void)ctx, (void)seq_of, (void)dent;
    double loss = 0;
    for (int t = 0; t < a->N; t++)
        if (resp_index[t] >= 0) {
            dlogp[t] = (float)-g_inv;
            loss -= a->logp[t] * g_inv;
        }
    return loss;
}

/* Resident bytes of a mapping (mincore; 0 where it fails). */
static size_t resident_bytes(const void *p, size_t len) {
    const size_t ps = (size_t)sysconf(_SC_PAGESIZE), np = (len + ps - 1) / ps;
    unsigned char *v = xmalloc(np ? np : 1);
    size_t r = 0;
    if (mincore((void *)p, len, v) == 0)
        for (size_t i = 0; i < np; i++) r += (v[i] & 1) ? ps : 0;
    free(v);
    return r;
}

/* --config-json: per-stage model state of a real model, from its layout alone. */
static int memory_arithmetic(const char *path, const int *pps, int npp) {
    moe_config c;
    moe_model m;
    if (moe_config_load(&c, path) != MOERL_OK || model_init_layout(&m, &c, 0) != MOERL_OK) return MOERL_ERR;
    const int bal = MOERL_MAX(1, MOERL_MIN(c.max_position_embeddings, 4096));
    const double GiB = 1024.0 * 1024 * 1024, full = 16.0 * (double)m.n_params / GiB;
    printf("# %s: %d layers, %.2f G parameters (layout floats); model state fp32 (params, grads, AdamW m, v) = 16 "
           "B/param; cut balanced for %d-token sequences\n", path, c.num_hidden_layers, m.n_params / 1e9, bal);
    printf("%4s %14s %18s %10s  %s\n", "pp", "replicated_GiB", "largest_stage_GiB", "ratio", "per stage GiB");
    for (int k = 0; k < npp; k++) {
        const int pp = pps[k];
        int *b = xmalloc((pp + 1) * sizeof(int));
        size_t *lo = xmalloc(pp * sizeof(size_t)), *hi = xmalloc(pp * sizeof(size_t)), elo, ehi;
        if (pp_partition(&c, pp, bal, b, NULL) != MOERL_OK) return MOERL_ERR;
        pp_stage_ranges(&m, b, pp, lo, hi, &elo, &ehi);
        double mx = 0;
        char line[2048];
        int o = 0;
        for (int s = 0; s < pp; s++) {
            /* a tied last stage also holds the embedding's parameters and gradient (not its moments) */
            const double fl = 16.0 * (double)(hi[s] - lo[s]) +
                              (c.tie_word_embeddings && pp > 1 && s == pp - 1 ? 8.0 * (double)(ehi - elo) : 0);
            mx = fmax(mx, fl / GiB);
            if (o < (int)sizeof line - 40)
                o += snprintf(line + o, sizeof line - o, "%s%d:L%d-%d %.2f", s ? ", " : "", s, b[s], b[s + 1] - 1,
                              fl / GiB);
        }
        printf("%4d %14.2f %18.2f %9.2fx  %s\n", pp, full, mx, full / mx, line);
        free(b);
        free(lo);
        free(hi);
    }
    model_free(&m);
    return MOERL_OK;
}

/* --memory under mpirun: replicated against stage-owned, measured on the benchmark model. */
static int memory_measured(dist_ctx *ctx, int layers, int seq_len, int nseq) {
    const int P = ctx->world_size, rank = ctx->world_rank;
    moe_config c = bench_model_config(seq_len);
    c.num_hidden_layers = layers;
    moe_model m;
    if (model_init(&m, &c) != MOERL_OK) return MOERL_ERR;
    model_init_random(&m, 7);
    const size_t n = m.n_params;
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = P, .alltoall_max_ep = 16, .capacity_factor = 1.25,
                     .max_tokens = seq_len * 2};
    par_state ps;
    if (par_state_init_cfg(&ps, ctx, &pc, &m) != MOERL_OK) return MOERL_ERR;
    adamw_state os;
    par_adamw_init(&ps, &m, &os, adamw_default_config());
    int *tok = xmalloc((size_t)nseq * seq_len * sizeof(int));
    rng_state r;
    rng_seed(&r, 11);
    for (int i = 0; i < nseq * seq_len; i++) tok[i] = (int)rng_below(&r, c.vocab_size);
    train_seq *seqs = xmalloc(nseq * sizeof(train_seq));
    for (int i = 0; i < nseq; i++)
        seqs[i] = (train_seq){.tokens = tok + (size_t)i * seq_len, .len = seq_len, .resp_start = seq_len / 2};
    g_inv = 1.0 / ((double)nseq * (seq_len - seq_len / 2));
    train_step_opts to = {.max_tokens = seq_len * 2, .temperature = 1.0f, .aux_coef = c.router_aux_loss_coef,
                          .par = &ps};
    train_step_out so;
    double gn;
    if (train_accumulate(&m, NULL, seqs, nseq, &to, sft_cb, NULL, &so) != MOERL_OK ||
        par_finish_grads(&ps, so.n_microbatches, so.n_microbatches) != MOERL_OK)
        return MOERL_ERR;
    double loss = so.loss;
    dist_allreduce_sum(ctx, DIST_TRAINERS, &loss, 1);
    par_adamw_step(&ps, &m, &os, 1e-4f, (float)loss, &gn);
    /* per stage: held floats, resident params, resident grads, moment bytes */
    double *v = xcalloc(4 * (size_t)P, sizeof(double));
    v[rank] = (double)pp_held_floats(ps.pp);
    v[P + rank] = (double)resident_bytes(m.params, n * sizeof(float));
    v[2 * P + rank] = (double)resident_bytes(m.grads, n * sizeof(float));
    v[3 * P + rank] = 8.0 * (double)os.n;
    dist_allreduce_sum(ctx, DIST_TRAINERS, v, 4 * P);
    if (rank == 0) {
        const double MB = 1e6, repl = 16.0 * (double)n / MB;
        const int *b = pp_bounds(ps.pp);
        printf("# model state per rank: %d layers of the benchmark model (%.2f M layout floats), %d stages; "
               "replicated = fp32 params + grads + AdamW m, v of the whole model (%.2f MB on every rank)\n",
               layers, n / 1e6, P, repl);
        printf("%5s %8s %12s %12s %12s %12s %12s %8s\n", "stage", "layers", "held_floats", "params_MB", "grads_MB",
               "moments_MB", "total_MB", "vs_repl");
        double mx = 0;
        for (int s = 0; s < P; s++) {
            const double tot = (v[P + s] + v[2 * P + s] + v[3 * P + s]) / MB;
            mx = fmax(mx, tot);
            printf("%5d %4d-%-3d %12.0f %12.2f %12.2f %12.2f %12.2f %7.1f%%\n", s, b[s], b[s + 1] - 1, v[s],
                   v[P + s] / MB, v[2 * P + s] / MB, v[3 * P + s] / MB, tot, 100 * tot / repl);
        }
        printf("largest stage %.2f MB against %.2f MB replicated: %.2fx less (ideal %dx)\n", mx, repl, repl / mx, P);
    }
    free(v);
    free(seqs);
    free(tok);
    adamw_free(&os);
    par_state_free(&ps);
    model_free(&m);
    return MOERL_OK;
}

/* --owned D under mpirun -np P: the stage-owned pipeline as `moerl sft` runs it (par_state_init_cfg:
 * pp = P / D stages, D data-parallel pipelines, each on every D-th sequence), v chunks per stage for
 * each v of --vpp, the stage's gradient sum over its D ranks after the schedule (overlap off) and
 * overlapped with the cool-down (on), fixed m (the first of --fixed). Medians over the reps of the
 * step (train_accumulate + par_finish_grads), the exposed sum (par_finish_grads: what the optimizer
 * waits for), both means over the ranks, and the idle share. */
static int owned_overlap(dist_ctx *ctx, int layers, int seq_len, int nseq, int D, const int *vpps, int nvpp, int mfix,
                         int reps) {
    const int P = ctx->world_size, rank = ctx->world_rank;
    if (D < 1 || P % D || P / D < 2)
        return moerl_errorf("--owned %d: needs -np a multiple of it with at least 2 stages (-np %d)", D, P);
    moe_config c = bench_model_config(seq_len);
    c.num_hidden_layers = layers;
    int *tok = xmalloc((size_t)nseq * seq_len * sizeof(int));
    rng_state r;
    rng_seed(&r, 11);
    for (int i = 0; i < nseq * seq_len; i++) tok[i] = (int)rng_below(&r, c.vocab_size);
    train_seq *seqs = xmalloc(nseq * sizeof(train_seq));
    int n = 0;
    for (int i = 0; i < nseq; i++) /* this rank's data-parallel shard: set below once d is known */
        seqs[i] = (train_seq){.tokens = tok + (size_t)i * seq_len, .len = seq_len, .resp_start = seq_len / 2};
    g_inv = 1.0 / ((double)nseq * (seq_len - seq_len / 2));
    const int per = nseq / D, cap = MOERL_MAX(seq_len, (per * seq_len / mfix / seq_len) * seq_len);
    double *t_step = xmalloc(reps * sizeof(double)), *t_fin = xmalloc(reps * sizeof(double)),
           *idle = xmalloc(reps * sizeof(double));
    if (rank == 0) {
        printf("# stage-owned: dp %d x pp %d, %d layers, %d sequences x %d tokens per pipeline, micro-batches of %d "
               "tokens, %d reps; sum_ms = par_finish_grads (the stage's gradient sum the optimizer waits for)\n",
               D, P / D, layers, per, seq_len, cap, reps);
        printf("%2s %8s %4s %10s %10s %8s %8s %6s\n", "v", "overlap", "m", "step_ms", "sum_ms", "idle", "interl.",
               "early");
    }
    for (int iv = 0; iv < nvpp; iv++)
        for (int ov = 0; ov <= (vpps[iv] > 1); ov++) { /* v = 1 has nothing to overlap */
            moe_model m;
            if (model_init(&m, &c) != MOERL_OK) return MOERL_ERR;
            model_init_random(&m, 7);
            par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                             .pipeline_parallel_size = P / D, .virtual_pipeline_parallel_size = MOERL_MAX(1, vpps[iv]),
                             .alltoall_max_ep = 16, .capacity_factor = 1.25, .max_tokens = cap};
            par_state ps;
            if (par_state_init_cfg(&ps, ctx, &pc, &m) != MOERL_OK) return MOERL_ERR;
            pp_options po = pp_options_default();
            po.dynamic = 0;
            po.overlap_grads = ov;
            po.balance_seq_len = seq_len;
            pp_set_options(ps.pp, &po);
            n = 0;
            for (int i = ps.grid->dp_rank; i < nseq; i += D) seqs[n++] = (train_seq){
                .tokens = tok + (size_t)i * seq_len, .len = seq_len, .resp_start = seq_len / 2};
            train_step_opts to = {.max_tokens = cap, .temperature = 1.0f, .aux_coef = c.router_aux_loss_coef,
                                  .total_tokens = (int64_t)nseq * seq_len, .par = &ps};
            int mbs = 0, early = 0;
            for (int rep = -1; rep < reps; rep++) {
                train_step_out so;
                dist_barrier(ctx, DIST_WORLD);
                const double t0 = moerl_now();
                if (train_accumulate(&m, NULL, seqs, n, &to, sft_cb, NULL, &so) != MOERL_OK) return MOERL_ERR;
                const double t1 = moerl_now();
                if (par_finish_grads(&ps, so.n_microbatches, so.n_microbatches) != MOERL_OK) return MOERL_ERR;
                const double t2 = moerl_now();
                const pp_stats *st = pp_last_stats(ps.pp);
                mbs = st->microbatches;
                early = st->grad_sums_overlapped;
                double v[2] = {(t2 - t0) / P, (t2 - t1) / P}; /* means over the ranks */
                dist_allreduce_sum(ctx, DIST_TRAINERS, v, 2);
                if (rep >= 0) {
                    t_step[rep] = v[0];
                    t_fin[rep] = v[1];
                    idle[rep] = st->bubble_mean;
                }
            }
            if (rank == 0)
                printf("%2d %8s %4d %10.1f %10.2f %7.1f%% %7.1f%% %6d\n", pc.virtual_pipeline_parallel_size,
                       ov ? "on" : "off", mbs, 1e3 * bench_median(t_step, reps), 1e3 * bench_median(t_fin, reps),
                       100 * bench_median(idle, reps),
                       100.0 * (P / D - 1) / ((double)pc.virtual_pipeline_parallel_size * mbs + P / D - 1), early);
            fflush(stdout);
            par_state_free(&ps);
            model_free(&m);
        }
    free(t_step);
    free(t_fin);
    free(idle);
    free(seqs);
    free(tok);
    return MOERL_OK;
}

static int parse_list(const char *s, int *v, int max) {
    int n = 0;
    char *dup = strdup(s), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save)) v[n++] = atoi(t);
    free(dup);
    return n;
}

int main(int argc, char **argv) {
    dist_ctx *ctx = dist_init(&argc, &argv);
    if (!ctx || dist_split_roles(ctx, ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "bench_dist_pipeline: %s\n", moerl_last_error());
        return 1;
    }
    int layers = 8, nseq = 16, seq_len = 64, reps = 5, min_mb[8] = {64}, nmin = 1, fixed[8] = {0}, nfixed = 0;
    int memory = 0, pps[8] = {2, 4, 8}, npp = 3, vpps[8] = {1}, nvpp = 1, owned = 0;
    int progress_us = pp_options_default().progress_us; /* --progress-us: the MPI progress thread's period, 0 = off */
    const char *config_json = NULL;
    static const struct option lo[] = {{"layers", 1, 0, 'l'}, {"seqs", 1, 0, 's'}, {"seq-len", 1, 0, 'n'},
                                       {"reps", 1, 0, 'r'},   {"fixed", 1, 0, 'f'}, {"min-mb-tokens", 1, 0, 'm'},
                                       {"memory", 0, 0, 'M'}, {"config-json", 1, 0, 'c'}, {"pp", 1, 0, 'p'},
                                       {"vpp", 1, 0, 'v'},    {"owned", 1, 0, 'o'},     {"progress-us", 1, 0, 'u'},
                                       {0, 0, 0, 0}};
    for (int ch; (ch = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (ch == 'l') layers = atoi(optarg);
        else if (ch == 's') nseq = atoi(optarg);
        else if (ch == 'n') seq_len = atoi(optarg);
        else if (ch == 'r') reps = atoi(optarg);
        else if (ch == 'f') nfixed = parse_list(optarg, fixed, 8);
        else if (ch == 'm') nmin = parse_list(optarg, min_mb, 8);
        else if (ch == 'M') memory = 1;
        else if (ch == 'c') config_json = optarg;
        else if (ch == 'p') npp = parse_list(optarg, pps, 8);
        else if (ch == 'v') nvpp = parse_list(optarg, vpps, 8);
        else if (ch == 'o') owned = atoi(optarg);
        else if (ch == 'u') progress_us = atoi(optarg);
        else {
            fprintf(stderr, "usage: bench_dist_pipeline [--layers L] [--seqs N] [--seq-len T] [--reps R] "
                            "[--fixed m1,m2] [--min-mb-tokens K1,K2] [--vpp v1,v2] [--owned D] [--progress-us U] | --memory | --config-json F [--pp a,b]\n");
            return 2;
        }
    }
    if (config_json || memory) {
        int rc = MOERL_OK;
        if (config_json && ctx->world_rank == 0) rc = memory_arithmetic(config_json, pps, npp);
        if (rc == MOERL_OK && memory) rc = memory_measured(ctx, layers, seq_len, nseq);
        if (rc != MOERL_OK) fprintf(stderr, "bench_dist_pipeline: %s\n", moerl_last_error());
        dist_finalize(ctx);
        return rc == MOERL_OK ? 0 : 1;
    }
    const int P = ctx->world_size, rank = ctx->world_rank;
    if (nfixed == 0) fixed[nfixed++] = P;
    if (owned) {
        const int rc = owned_overlap(ctx, layers, seq_len, nseq, owned, vpps, nvpp, fixed[0], reps);
        if (rc != MOERL_OK) fprintf(stderr, "bench_dist_pipeline: %s\n", moerl_last_error());
        dist_finalize(ctx);
        return rc == MOERL_OK ? 0 : 1;
    }
    moe_config c = bench_model_config(seq_len);
    c.num_hidden_layers = layers;
    moe_model m;
    if (model_init(&m, &c) != MOERL_OK) {
        fprintf(stderr, "bench_dist_pipeline: %s\n", moerl_last_error());
        return 1;
    }
    model_init_random(&m, 7);
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = P, .alltoall_max_ep = 16, .capacity_factor = 1.25};
    par_grid g;
    if (par_grid_init(&g, ctx, &pc, c.num_experts, c.num_attention_heads, c.num_key_value_heads, layers) != MOERL_OK) {
        fprintf(stderr, "bench_dist_pipeline: %s\n", moerl_last_error());
        return 1;
    }
    /* the batch: nseq sequences of seq_len tokens, the second half of each the response */
    int *tok = xmalloc((size_t)nseq * seq_len * sizeof(int));
    rng_state r;
    rng_seed(&r, 11);
    for (int i = 0; i < nseq * seq_len; i++) tok[i] = (int)rng_below(&r, c.vocab_size);
    train_seq *seqs = xmalloc(nseq * sizeof(train_seq));
    for (int i = 0; i < nseq; i++) seqs[i] = (train_seq){.tokens = tok + (size_t)i * seq_len, .len = seq_len,
                                                          .resp_start = seq_len / 2};
    g_inv = 1.0 / ((double)nseq * (seq_len - seq_len / 2));
    const int T = nseq * seq_len;
    int cap_max = seq_len;
    for (int k = 0; k < nfixed; k++) cap_max = MOERL_MAX(cap_max, (T / fixed[k] / seq_len) * seq_len);
    if (rank == 0)
        printf("# bench_dist_pipeline: %d stages, %d layers (hidden %d, %d experts top-%d), %d sequences x %d tokens "
               "= %d tokens per step, %d reps, OMP threads per rank %s\n",
               P, layers, c.hidden_size, c.num_experts, c.num_experts_per_tok, nseq, seq_len, T, reps,
               getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "(unset)");
    /* the one-rank peer: a pipeline of ONE stage (the whole model, the same code and threads, no
     * messages) on a grid where every rank is its own pipeline */
    par_config pc1 = pc;
    pc1.pipeline_parallel_size = 1;
    par_grid g1;
    if (par_grid_init(&g1, ctx, &pc1, c.num_experts, c.num_attention_heads, c.num_key_value_heads, layers) !=
        MOERL_OK) {
        fprintf(stderr, "bench_dist_pipeline: %s\n", moerl_last_error());
        return 1;
    }
    if (rank == 0)
        printf("%-26s %2s %4s %10s %10s %8s %8s %8s %8s %9s %9s\n", "configuration", "v", "m", "step_ms", "one_rank_ms",
               "speedup", "idle", "1F1B", "interl.", "recv_wait", "MB_sent");
    typedef struct {
        const char *name;
        int fixed_m, dynamic, prefetch, min_mb, v;
    } config;
    config cf[160];
    int ncf = 0;
    for (int iv = 0; iv < nvpp; iv++) { /* v = 1: with and without look-ahead; interleaved: with */
        const int v = MOERL_MAX(1, vpps[iv]);
        for (int k = 0; k < nfixed; k++) {
            if (v == 1) cf[ncf++] = (config){"fixed, no look-ahead", fixed[k], 0, 0, 0, v};
            cf[ncf++] = (config){"fixed, look-ahead", fixed[k], 0, 1, 0, v};
        }
        for (int k = 0; k < nmin; k++) cf[ncf++] = (config){"dynamic", 0, 1, 1, min_mb[k], v};
    }
    double *t_pp = xmalloc(reps * sizeof(double)), *t_one = xmalloc(reps * sizeof(double)),
           *idle = xmalloc(reps * sizeof(double)), *wait = xmalloc(reps * sizeof(double));
    for (int k = 0; k < ncf; k++) {
        pp_options po = pp_options_default();
        po.dynamic = cf[k].dynamic;
        po.prefetch = cf[k].prefetch;
        po.min_mb_tokens = cf[k].dynamic ? cf[k].min_mb : 64;
        po.balance_seq_len = seq_len;
        po.quiet = (k > 0 && cf[k].v == cf[k - 1].v) || rank != 0;
        po.virtual_stages = cf[k].v;
        po.progress_us = progress_us;
        const int cap = cf[k].fixed_m ? MOERL_MAX(seq_len, (T / cf[k].fixed_m / seq_len) * seq_len) : cap_max;
        pp_state *ps = pp_state_new(&g, &m, &po);
        if (!ps) {
            fprintf(stderr, "bench_dist_pipeline: %s\n", moerl_last_error());
            return 1;
        }
        par_state par = {.grid = &g, .pp = ps};
        par_bind_hooks(&par);
        train_step_opts to = {.max_tokens = cap, .temperature = 1.0f, .aux_coef = c.router_aux_loss_coef, .par = &par};
        po.quiet = 1;
        po.virtual_stages = 1; /* the one-stage peer */
        pp_state *ps1 = pp_state_new(&g1, &m, &po);
        par_state par1 = {.grid = &g1, .pp = ps1};
        par_bind_hooks(&par1);
        train_step_opts t1 = to;
        t1.par = &par1;
        int mbs = 0;
        double bytes = 0;
        for (int rep = -1; rep < reps; rep++) {
            train_step_out so;
            dist_barrier(ctx, DIST_WORLD);
            double t0 = moerl_now();
            if (train_accumulate(&m, NULL, seqs, nseq, &to, sft_cb, NULL, &so) != MOERL_OK) {
                fprintf(stderr, "bench_dist_pipeline: %s\n", moerl_last_error());
                return 1;
            }
            const double dt = moerl_now() - t0;
            const pp_stats *st = pp_last_stats(ps);
            mbs = st->microbatches;
            bytes = st->bytes_sent;
            /* the same micro-batches on one rank (rank 0; the others wait in the barrier) */
            double d1 = 0;
            dist_barrier(ctx, DIST_WORLD);
            if (rank == 0) { /* the same plan: its dynamic count is pp-independent once ≥ 4 */
                const double t2 = moerl_now();
                train_accumulate(&m, NULL, seqs, nseq, &t1, sft_cb, NULL, &so);
                d1 = moerl_now() - t2;
                if (so.n_microbatches != mbs) fprintf(stderr, "peer: %d micro-batches, not %d\n", so.n_microbatches, mbs);
            }
            dist_barrier(ctx, DIST_WORLD);
            if (rep >= 0) {
                t_pp[rep] = dt;
                t_one[rep] = d1;
                idle[rep] = st->bubble_mean;
                wait[rep] = st->wait_share_mean;
            }
        }
        const double mpp = bench_median(t_pp, reps), m1 = bench_median(t_one, reps);
        if (rank == 0) {
            char name[64];
            if (cf[k].fixed_m) snprintf(name, sizeof name, "m=%d %s", cf[k].fixed_m, cf[k].name + 7);
            else snprintf(name, sizeof name, "dynamic, >= %d tok/mb", cf[k].min_mb);
            printf("%-26s %2d %4d %10.1f %10.1f %8.2f %7.1f%% %7.1f%% %7.1f%% %8.1f%% %9.2f\n", name, cf[k].v, mbs,
                   1e3 * mpp, 1e3 * m1, m1 / mpp, 100 * bench_median(idle, reps), 100.0 * (P - 1) / (mbs + P - 1),
                   100.0 * (P - 1) / ((double)cf[k].v * mbs + P - 1), 100 * bench_median(wait, reps), bytes / 1e6);
            fflush(stdout);
        }
        pp_state_free(ps);
        pp_state_free(ps1);
    }
    free(t_pp); free(t_one); free(idle); free(wait);
    par_grid_free(&g1);
    free(seqs);
    free(tok);
    par_grid_free(&g);
    model_free(&m);
    dist_finalize(ctx);
    return 0;
}
