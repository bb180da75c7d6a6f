/* Pipeline parallelism (src/parallel/pipeline.c) against one rank.
 *   Model: a small random Qwen3-MoE of 4 layers (three MoE, one dense), untied head, load-balancing
 *   aux loss ON (coefficient 0.02), so the aux statistics travel along the pipeline.
 *   Batch: 12 sequences (5..16 tokens), SFT loss (−logp of the response tokens / their global count),
 *   micro-batches of at most 24 tokens (fixed packing: pp_options.dynamic = 0, so one rank packs the
 *   same micro-batches and the per-micro-batch aux loss is the same function).
 *   Runs (each K = 4 AdamW steps from the same initial weights):
 *     pp = world size (2 or 4 ranks): one pipeline, train_accumulate through par_state.pp;
 *     dp 2 × pp 2 (4 ranks): two pipelines each on every other sequence;
 *     in both, the stages' gradients (each its own parameters) and losses (last stage) are summed over
 *     every trainer rank as data-parallel ranks' are (dist_reducer_new, dist_allreduce_sum);
 *     reference (every rank, alone): train_accumulate without par on the same shards (dp 2: shard by
 *       shard, gradients added in shard order, as the two-rank sum), same total_tokens.
 *     pp = world size again with the global load-balancing loss (opts.aux_counts: the whole batch's
 *       top-k counts, from compute_router_counts on the replicated model, given to every stage).
 *   Checks: losses and final weights match the reference (tolerances below); weights bit-identical on
 *   every rank; the per-step statistics (theory (p−1)/(m+p−1), idle shares in [0, 1]); the guard
 *   (fewer micro-batches than stages) refused on every stage with the count needed, both with the
 *   dynamic count and with fixed packing; the FLOP partition against brute force; the dynamic count
 *   reaching its target.
 *   Stage-owned (par_state_init_cfg, as `moerl sft` / `moerl rl` build it; fixed packing):
 *     forward-only passes (compute_logprobs, compute_router_counts through the stages) against one
 *       rank: logprobs bit-identical on EVERY stage, counts exact, a too-long sequence refused;
 *     K AdamW steps through parallel.h's entry points only (par_adamw_init, train_accumulate,
 *       par_finish_grads — no reducer —, par_adamw_step), global aux from the pipeline's counts,
 *       untied and tied embeddings, pp = world size and dp 2 x pp 2: losses, the weights and AdamW
 *       moments par_gather_full assembles on rank 0, and the weights par_state_free leaves on every
 *       rank, against one rank (tolerances below); resident pages of the sparse parameter and
 *       gradient maps (mincore) within the stage's range; par_adamw_shard. */
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/perf.h"
#include "optim/adamw.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "dist_test.h"
#include "fixture.h"
#include "test.h"
#include "train/train.h"

#define K_STEPS 4
#define N_SEQ 12
#define MAX_TOK 24
static const int seq_len[N_SEQ] = {11, 6, 9, 14, 5, 8, 12, 16, 7, 10, 13, 6};
static const int prompt_len[N_SEQ] = {3, 2, 4, 5, 1, 3, 4, 6, 2, 3, 5, 2};

static dist_ctx *g_ctx;
static int g_tied; /* pp_config: tie_word_embeddings */
static int g_layers = 4; /* pp_config: decoder layers (8 for pp 4 × 2 chunks) */
static int g_vpp = 1;    /* chunks per stage (actor.virtual_pipeline_parallel_size) of the pipeline runs */
static int g_max_tok = MAX_TOK; /* micro-batch token limit of the runs and their one-rank references */
static int g_overlap = 1; /* stage-owned runs: pp_options.overlap_grads */
static uint64_t g_owned_hash; /* test_owned: hash of the final weights */
static double g_ref_gn[K_STEPS]; /* the last reference run's gradient norms */
#define RANK g_ctx->world_rank
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)

static moe_config pp_config(void) {
    char layers[64];
    snprintf(layers, sizeof layers, "model.num_hidden_layers=%d", g_layers);
    const char *kv[] = {layers, "model.num_key_value_heads=2", "model.num_experts=4", "model.num_experts_per_tok=2",
                        "model.mlp_only_layers=[2]", "model.router_aux_loss_coef=0.02",
                        g_tied ? "model.tie_word_embeddings=true" : "model.tie_word_embeddings=false"};
    return fx_small_config(kv, FX_N(kv));
}

static int g_tokens[N_SEQ][16];

static void make_tokens(void) {
    rng_state r;
    rng_seed(&r, 77);
    for (int s = 0; s < N_SEQ; s++)
        for (int t = 0; t < seq_len[s]; t++) g_tokens[s][t] = (int)rng_below(&r, 64);
}

/* Sequences of shard `d` of `D` (every D-th, in order). Returns the count. */
static int shard(int d, int D, train_seq *out) {
    int k = 0;
    for (int s = d; s < N_SEQ; s += D)
        out[k++] = (train_seq){.tokens = g_tokens[s], .len = seq_len[s], .resp_start = prompt_len[s]};
    return k;
}

static double g_inv_resp; /* 1 / response tokens of the whole batch */

static double sft_cb(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                     float *dent) {
    (void)ctx, (void)seq_of, (void)dent;
    double loss = 0;
    for (int t = 0; t < a->N; t++)
        if (resp_index[t] >= 0) {
            dlogp[t] = (float)-g_inv_resp;
            loss -= a->logp[t] * g_inv_resp;
        }
    return loss;
}

static adamw_config opt_config(void) {
    return (adamw_config){.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .max_grad_norm = 1.0f};
}

static int64_t total_tokens(void) {
    int64_t t = 0;
    for (int s = 0; s < N_SEQ; s++) t += seq_len[s];
    return t;
}

/* One rank alone: D shards, each through train_accumulate, gradients added in shard order. */
static void run_reference_os(int D, int global_aux, float *losses, moe_model *m, adamw_state *os_out);
static void run_reference(int D, int global_aux, float *losses, moe_model *m) {
    run_reference_os(D, global_aux, losses, m, NULL);
}
static void run_reference_os(int D, int global_aux, float *losses, moe_model *m, adamw_state *os_out) {
    const moe_config c = pp_config();
    MOERL_ASSERT(model_init(m, &c) == MOERL_OK);
    model_init_random(m, 4242);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, g_max_tok) == MOERL_OK);
    float *sum = xcalloc(m->n_params, sizeof(float));
    train_seq seqs[N_SEQ];
    adamw_state os;
    adamw_init(&os, m, opt_config());
    train_step_opts to = {.max_tokens = g_max_tok, .temperature = 1.0f, .aux_coef = c.router_aux_loss_coef,
                          .total_tokens = total_tokens()};
    double counts[8];
    for (int k = 0; k < K_STEPS; k++) {
        double loss = 0;
        if (global_aux) { /* the whole batch's top-k counts (one rank: no sum needed) */
            memset(counts, 0, sizeof counts);
            train_seq all[N_SEQ];
            MOERL_ASSERT(compute_router_counts(m, &a, all, shard(0, 1, all), g_max_tok, counts) == MOERL_OK);
            to.aux_counts = counts;
        }
        for (int d = 0; d < D; d++) {
            const int n = shard(d, D, seqs);
            train_step_out so;
            MOERL_ASSERT(train_accumulate(m, &a, seqs, n, &to, sft_cb, NULL, &so) == MOERL_OK);
            loss += so.loss;
            for (size_t i = 0; i < m->n_params; i++) sum[i] = d ? sum[i] + m->grads[i] : m->grads[i];
        }
        memcpy(m->grads, sum, m->n_params * sizeof(float));
        losses[k] = (float)loss;
        double gn;
        MOERL_ASSERT(adamw_step(&os, m, os.cfg.lr, losses[k], &gn) == 1);
        g_ref_gn[k] = gn;
    }
    if (os_out) *os_out = os;
    else adamw_free(&os);
    model_acts_free(&a);
    free(sum);
}

static int grid_for(par_grid *g, int pp) {
    par_config pc;
    memset(&pc, 0, sizeof pc);
    pc.fsdp_size = pc.expert_parallel_size = pc.ulysses_sequence_parallel_size = 1;
    pc.pipeline_parallel_size = pp;
    pc.alltoall_max_ep = 16;
    pc.capacity_factor = 1.25;
    const moe_config c = pp_config();
    return par_grid_init(g, g_ctx, &pc, c.num_experts, c.num_attention_heads, c.num_key_value_heads,
                         c.num_hidden_layers);
}

static void reducer_hook(void *r, int group) { dist_reducer_layer_done(r, group); }

/* The pipeline run: pp stages, dp = T/pp pipelines. */
static void run_pipeline(int pp, int global_aux, float *losses, moe_model *m, pp_stats *last) {
    const moe_config c = pp_config();
    MOERL_ASSERT(model_init(m, &c) == MOERL_OK);
    model_init_random(m, 4242);
    par_grid g;
    CHECK_R(grid_for(&g, pp) == MOERL_OK, "grid pp %d: %s", RANK, pp, moerl_last_error());
    pp_options po = pp_options_default();
    po.dynamic = 0;
    po.quiet = RANK != 0;
    po.balance_seq_len = g_max_tok;
    po.virtual_stages = g_vpp;
    pp_state *ps = pp_state_new(&g, m, &po);
    CHECK_R(ps != NULL, "pp_state_new: %s", RANK, moerl_last_error());
    if (!ps) return;
    par_state par = {.grid = &g, .pp = ps};
    par_bind_hooks(&par);
    /* stages are summed like data-parallel ranks: one reducer over every trainer (pp stages × dp) */
    dist_grad_reducer *r = dist_reducer_new(g_ctx, m, 0.002, DIST_OVERLAP_THREAD); /* small buckets: many */
    CHECK_R(r != NULL, "reducer: %s", RANK, moerl_last_error());
    train_seq seqs[N_SEQ];
    const int n = shard(g.dp_rank, g.dp, seqs);
    adamw_state os;
    adamw_init(&os, m, opt_config());
    train_step_opts to = {.max_tokens = g_max_tok, .temperature = 1.0f, .aux_coef = c.router_aux_loss_coef,
                          .total_tokens = total_tokens(), .par = &par};
    if (r) {
        to.layer_hook = reducer_hook;
        to.layer_hook_ctx = r;
    }
    model_acts fa;
    MOERL_ASSERT(model_acts_init(&fa, m, g_max_tok) == MOERL_OK);
    double counts[8];
    for (int k = 0; k < K_STEPS; k++) {
        if (global_aux) { /* forward-only passes run the whole (replicated) model on each rank */
            memset(counts, 0, sizeof counts);
            train_seq all[N_SEQ];
            MOERL_ASSERT(compute_router_counts(m, &fa, all, shard(0, 1, all), g_max_tok, counts) == MOERL_OK);
            to.aux_counts = counts;
        }
        train_step_out so;
        int rc = train_accumulate(m, NULL, seqs, n, &to, sft_cb, NULL, &so);
        CHECK_R(rc == MOERL_OK, "pipeline step %d: %s", RANK, k, moerl_last_error());
        if (rc != MOERL_OK) break;
        double loss = so.loss; /* the last stage's; 0 on the others */
        CHECK_R(g.stage == pp - 1 || (so.loss == 0 && so.n_tokens == 0), "stage %d reports loss %g", RANK, g.stage,
                so.loss);
        if (r) dist_reducer_finish(r);
        dist_allreduce_sum(g_ctx, DIST_TRAINERS, &loss, 1);
        losses[k] = (float)loss;
        const pp_stats *st = pp_last_stats(ps);
        CHECK_R(st->microbatches == so.n_microbatches && st->stages == pp && st->virtual_stages == g_vpp &&
                    fabs(st->theory - (double)(pp - 1) / (so.n_microbatches + pp - 1)) < 1e-12 &&
                    fabs(st->theory_interleaved - (double)(pp - 1) / (g_vpp * so.n_microbatches + pp - 1)) < 1e-12 &&
                    (g_vpp == 1 || so.n_microbatches % pp == 0) && st->bubble >= 0 &&
                    st->bubble <= 1 && st->bubble_max <= 1 && st->bubble_mean <= st->bubble_max + 1e-12 &&
                    st->bytes_sent > 0,
                "stats: m %d p %d theory %g bubble %g mean %g max %g bytes %g", RANK, st->microbatches, st->stages,
                st->theory, st->bubble, st->bubble_mean, st->bubble_max, st->bytes_sent);
        *last = *st;
        double gn;
        CHECK_R(adamw_step(&os, m, os.cfg.lr, losses[k], &gn) == 1, "step %d skipped", RANK, k);
    }
    adamw_free(&os);
    model_acts_free(&fa);
    dist_reducer_free(r);
    pp_state_free(ps);
    par_grid_free(&g);
}

static uint64_t hash_floats(const float *x, size_t n) {
    const unsigned char *b = (const unsigned char *)x;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static void test_equivalence(int pp, int global_aux) {
    const int dp = g_ctx->world_size / pp;
    float ref_loss[K_STEPS], pp_loss[K_STEPS] = {0};
    moe_model ref, mp;
    run_reference(dp, global_aux, ref_loss, &ref);
    pp_stats st = {0};
    run_pipeline(pp, global_aux, pp_loss, &mp, &st);
    char what[96];
    /* losses: the stages' partial sums of the router probabilities are added in another order than one
     * rank's layer-by-layer sum (the aux VALUE only: its gradient uses the integer top-k counts, which
     * add exactly), a few fp32 ulps of the aux term; 1e-6 absolute + 1e-5 relative */
    snprintf(what, sizeof what, "dp %d x pp %d x v %d%s losses vs one rank", dp, pp, g_vpp, global_aux ? " global aux" : "");
    t_close(what, pp_loss, ref_loss, K_STEPS, 1e-6f, 1e-5f);
    /* weights: a stage runs the same kernels on the same micro-batches as one rank, the sum over the
     * ranks adds zeros for the other stages' parameters (exact) and the two shards as the reference
     * does (fp32 addition commutes), so the weights come out bit-identical in practice; the
     * written tolerance (1e-6 absolute on weights of scale 0.02, ≈ lr/3000) leaves room for an MPI
     * library that reduces in another order, while a wrong stage cut, a lost aux term or a missing
     * gradient moves weights by ~lr = 3e-3 per step and fails it */
    snprintf(what, sizeof what, "dp %d x pp %d x v %d%s weights vs one rank", dp, pp, g_vpp, global_aux ? " global aux" : "");
    t_close(what, mp.params, ref.params, (long)ref.n_params, 1e-6f, 0.0f);
    double worst = 0;
    for (size_t i = 0; i < ref.n_params; i++) worst = fmax(worst, fabs((double)mp.params[i] - ref.params[i]));
    if (RANK == 0) {
        for (int k = 0; k < K_STEPS; k++)
            printf("  dp %d x pp %d x v %d step %d loss %.8f  one rank %.8f\n", dp, pp, g_vpp, k, pp_loss[k],
                   ref_loss[k]);
        printf("  dp %d x pp %d x v %d: max |w − w_one_rank| = %.3g; last step m = %d, idle share mean %.3f (theory "
               "%.3f, interleaved %.3f), receive-wait share %.3f\n",
               dp, pp, g_vpp, worst, st.microbatches, st.bubble_mean, st.theory, st.theory_interleaved,
               st.wait_share_mean);
    }
    CHECK_R(dist_same_on_all_ranks(g_ctx, hash_floats(mp.params, mp.n_params)), "dp %d x pp %d: weights must be bit-identical "
            "on every rank", RANK, dp, pp);
    model_free(&ref);
    model_free(&mp);
}


/* ---------------------------------------------------------------- stage-owned pipeline (parallel.h) */

static par_config pp_par_config(int pp) {
    par_config pc;
    memset(&pc, 0, sizeof pc);
    pc.fsdp_size = pc.expert_parallel_size = pc.ulysses_sequence_parallel_size = 1;
    pc.pipeline_parallel_size = pp;
    pc.virtual_pipeline_parallel_size = g_vpp;
    pc.alltoall_max_ep = 16;
    pc.capacity_factor = 1.25;
    pc.max_tokens = g_max_tok;
    return pc;
}

/* The model-parallel runtime as `moerl sft` / `moerl rl` build it (par_state_init_cfg: stage-owned),
 * with the test's fixed packing so one rank runs the same micro-batches. */
static int owned_init(par_state *ps, moe_model *m, int pp) {
    const moe_config c = pp_config();
    MOERL_ASSERT(model_init(m, &c) == MOERL_OK);
    model_init_random(m, 4242);
    const par_config pc = pp_par_config(pp);
    if (par_state_init_cfg(ps, g_ctx, &pc, m) != MOERL_OK) return MOERL_ERR;
    pp_options po = pp_options_default();
    po.dynamic = 0;
    po.balance_seq_len = g_max_tok;
    po.overlap_grads = g_overlap;
    pp_set_options(ps->pp, &po);
    return MOERL_OK;
}

/* Resident bytes of a mapping (mincore). */
static size_t resident_bytes(const void *p, size_t len) {
    const size_t ps = (size_t)sysconf(_SC_PAGESIZE), np = (len + ps - 1) / ps;
    unsigned char *v = xmalloc(np ? np : 1);
    size_t r = 0;
    if (mincore((void *)p, len, v) == 0)
        for (size_t i = 0; i < np; i++) r += (v[i] & 1) ? ps : 0;
    free(v);
    return r;
}

/* Forward-only passes through the stages against one rank: compute_logprobs (every stage must hold
 * the last stage's values) and compute_router_counts (the pipeline's counts on every stage). */
static void test_forward_only(int pp) {
    const int dp = g_ctx->world_size / pp;
    moe_model ref, m;
    const moe_config c = pp_config();
    MOERL_ASSERT(model_init(&ref, &c) == MOERL_OK);
    model_init_random(&ref, 4242);
    par_state ps;
    CHECK_R(owned_init(&ps, &m, pp) == MOERL_OK, "par_state_init_cfg pp %d: %s", RANK, pp, moerl_last_error());
    if (!ps.pp) return;
    train_seq seqs[N_SEQ];
    const int n = shard(ps.grid->dp_rank, dp, seqs);
    float *lp_ref[N_SEQ], *lp[N_SEQ];
    for (int i = 0; i < n; i++) {
        lp_ref[i] = xcalloc(16, sizeof(float));
        lp[i] = xcalloc(16, sizeof(float));
        for (int k = 0; k < 16; k++) lp_ref[i][k] = lp[i][k] = -7.0f - k; /* entries not written stay */
    }
    model_acts ra, a;
    MOERL_ASSERT(model_acts_init(&ra, &ref, g_max_tok) == MOERL_OK);
    MOERL_ASSERT(model_acts_init(&a, &m, g_max_tok) == MOERL_OK);
    a.par = &ps;
    MOERL_ASSERT(compute_logprobs(&ref, &ra, seqs, n, g_max_tok, 0.7f, lp_ref) == MOERL_OK);
    int rc = compute_logprobs(&m, &a, seqs, n, g_max_tok, 0.7f, lp);
    CHECK_R(rc == MOERL_OK, "pipeline compute_logprobs: %s", RANK, moerl_last_error());
    /* bit-identical: the last stage runs the same kernels on the same micro-batches as one rank, and
     * the sum that hands its values to the other stages adds exact zeros */
    int same = 1;
    for (int i = 0; i < n; i++) same &= !memcmp(lp[i], lp_ref[i], 16 * sizeof(float));
    CHECK_R(same, "dp %d x pp %d stage %d: logprobs differ from one rank's", RANK, dp, pp, ps.grid->stage);
    /* multi-turn loss masks (train_seq.resp_mask): the masked entries hold 0 on every stage, the others
     * one rank's values */
    unsigned char mk[N_SEQ][16];
    int zero = 1;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 16; k++) {
            mk[i][k] = k % 4 != 2;
            lp_ref[i][k] = lp[i][k] = -7.0f - k;
        }
        seqs[i].resp_mask = mk[i];
    }
    MOERL_ASSERT(compute_logprobs(&ref, &ra, seqs, n, g_max_tok, 0.7f, lp_ref) == MOERL_OK);
    rc = compute_logprobs(&m, &a, seqs, n, g_max_tok, 0.7f, lp);
    same = rc == MOERL_OK;
    for (int i = 0; i < n; i++) {
        same &= !memcmp(lp[i], lp_ref[i], 16 * sizeof(float));
        for (int k = 0; k < seqs[i].len - seqs[i].resp_start; k++) zero &= mk[i][k] || lp[i][k] == 0.0f;
        seqs[i].resp_mask = NULL;
    }
    CHECK_R(same && zero, "dp %d x pp %d stage %d: with loss masks, logprobs differ from one rank's (%d) or a masked "
            "entry is not 0 (%d)", RANK, dp, pp, ps.grid->stage, same, zero);
    double cr[8] = {0}, cp[8] = {0};
    MOERL_ASSERT(compute_router_counts(&ref, &ra, seqs, n, g_max_tok, cr) == MOERL_OK);
    rc = compute_router_counts(&m, &a, seqs, n, g_max_tok, cp);
    CHECK_R(rc == MOERL_OK && !memcmp(cr, cp, sizeof cr), "dp %d x pp %d stage %d: router counts %g %g %g %g, one "
            "rank %g %g %g %g (integers: exact)", RANK, dp, pp, ps.grid->stage, cp[0], cp[1], cp[2], cp[3], cr[0], cr[1],
            cr[2], cr[3]);
    /* a sequence longer than the micro-batch limit: refused on every stage, none hangs */
    rc = compute_logprobs(&m, &a, seqs, n, 8, 1.0f, lp);
    CHECK_R(rc == MOERL_ERR && strstr(moerl_last_error(), "micro-batch"), "too long a sequence: rc %d, '%s'", RANK, rc,
            moerl_last_error());
    if (RANK == 0)
        printf("  forward-only dp %d x pp %d x v %d: logprobs bit-identical to one rank on every stage\n", dp, pp, g_vpp);
    for (int i = 0; i < n; i++) {
        free(lp[i]);
        free(lp_ref[i]);
    }
    model_acts_free(&ra);
    model_acts_free(&a);
    par_state_free(&ps);
    model_free(&ref);
    model_free(&m);
}

/* Training through parallel.h's entry points only (par_adamw_init / train_accumulate /
 * par_finish_grads / par_adamw_step / par_gather_full / par_state_free), stage-owned, no reducer:
 * what `moerl rl`'s trainer and `moerl sft` do with pp. */
static void test_owned(int pp, int tied) {
    g_tied = tied;
    const int dp = g_ctx->world_size / pp;
    float ref_loss[K_STEPS], pp_loss[K_STEPS] = {0};
    moe_model ref, m;
    adamw_state ref_os;
    run_reference_os(dp, 1, ref_loss, &ref, &ref_os);
    par_state ps;
    CHECK_R(owned_init(&ps, &m, pp) == MOERL_OK, "par_state_init_cfg pp %d: %s", RANK, pp, moerl_last_error());
    if (!ps.pp) {
        g_tied = 0;
        return;
    }
    const moe_config c = pp_config();
    const int E = c.num_experts;
    size_t lo, hi, own = 0; /* the hull of the stage's chunks; own: the floats of its chunks */
    pp_own_range(ps.pp, &lo, &hi);
    CHECK_R(pp_chunks(ps.pp) == g_vpp, "chunks per stage %d, want %d", RANK, pp_chunks(ps.pp), g_vpp);
    for (int ch = 0; ch < pp_chunks(ps.pp); ch++) {
        size_t a0, a1;
        pp_own_chunk_range(ps.pp, ch, &a0, &a1);
        CHECK_R(a1 > a0 && a0 >= lo && a1 <= hi, "chunk %d range [%zu, %zu) outside [%zu, %zu)", RANK, ch, a0, a1, lo, hi);
        own += a1 - a0;
    }
    CHECK_R(g_vpp > 1 || own == hi - lo, "one chunk: its range is the stage's", RANK);
    const size_t held = pp_held_floats(ps.pp), ps_bytes = (size_t)sysconf(_SC_PAGESIZE);
    adamw_state os;
    par_adamw_init(&ps, &m, &os, opt_config());
    CHECK_R(os.n == own && own < m.n_params, "stage moments: %zu floats of %zu", RANK, os.n, m.n_params);
    train_seq seqs[N_SEQ];
    const int n = shard(ps.grid->dp_rank, dp, seqs);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, g_max_tok) == MOERL_OK);
    a.par = &ps;
    train_step_opts to = {.max_tokens = g_max_tok, .temperature = 1.0f, .aux_coef = c.router_aux_loss_coef,
                          .total_tokens = total_tokens(), .par = &ps};
    double counts[8];
    for (int k = 0; k < K_STEPS; k++) {
        memset(counts, 0, sizeof counts); /* the global aux: every pipeline's counts, each counted once */
        CHECK_R(compute_router_counts(&m, &a, seqs, n, g_max_tok, counts) == MOERL_OK, "router counts: %s", RANK,
                moerl_last_error());
        dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, E);
        for (int e = 0; e < E; e++) counts[e] /= pp;
        to.aux_counts = counts;
        train_step_out so;
        int rc = train_accumulate(&m, NULL, seqs, n, &to, sft_cb, NULL, &so);
        CHECK_R(rc == MOERL_OK, "owned step %d: %s", RANK, k, moerl_last_error());
        if (rc != MOERL_OK) break;
        if (g_vpp > 1) { /* a forward-only pass while the overlapped sums may still run: must not disturb them
                          * (nor make par_finish_grads sum twice) */
            double scratch[8] = {0};
            CHECK_R(compute_router_counts(&m, &a, seqs, n, g_max_tok, scratch) == MOERL_OK, "counts: %s", RANK,
                    moerl_last_error());
        }
        const int dpr = ps.grid->dp, started = pp_last_stats(ps.pp)->grad_sums_overlapped;
        const int want = dpr > 1 && g_overlap && g_vpp > 1 ? g_vpp : 0; /* v = 1: nothing to overlap */
        CHECK_R(started == want, "dp %d, overlap %d: %d chunks' gradient sums started during the schedule, want %d",
                RANK, dpr, g_overlap, started, want);
        CHECK_R(par_finish_grads(&ps, so.n_microbatches, so.n_microbatches) == MOERL_OK, "finish: %s", RANK,
                moerl_last_error());
        double loss = so.loss;
        dist_allreduce_sum(g_ctx, DIST_TRAINERS, &loss, 1);
        pp_loss[k] = (float)loss;
        double gn;
        CHECK_R(par_adamw_step(&ps, &m, &os, os.cfg.lr, pp_loss[k], &gn) == 1, "step %d skipped", RANK, k);
        /* the global gradient norm before clipping (AdamW with clipping would hide a gradient summed
         * twice or lost on a data-parallel rank: the norm shows it): the stages' squares are summed in
         * another order than one rank's pass, and the weights differ by the last bits of earlier
         * clip factors: 1e-5 relative */
        CHECK_R(fabs(gn - g_ref_gn[k]) <= 1e-5 * g_ref_gn[k], "owned dp %d x pp %d x v %d step %d: gradient norm %.9g, "
                "one rank %.9g", RANK, dp, pp, g_vpp, k, gn, g_ref_gn[k]);
    }
    /* memory: the stage's pages only (a page at each end of each chunk's range, and of a tied last
     * stage's embedding copy, may straddle a neighbour's) */
    const size_t rp = resident_bytes(m.params, m.n_params * 4), rg = resident_bytes(m.grads, m.n_params * 4);
    const size_t slack = (2 * (size_t)g_vpp + 2) * ps_bytes;
    CHECK_R(rp <= held * 4 + slack && rg <= held * 4 + slack,
            "stage %d holds %zu floats but %zu / %zu bytes of parameters / gradients are resident", RANK,
            ps.grid->stage, held, rp, rg);
    if (RANK == 0)
        printf("  owned%s dp %d x pp %d x v %d: stage 0 holds %zu of %zu floats (%.0f%%); resident params %zu B, grads %zu B\n",
               tied ? " tied" : "", dp, pp, g_vpp, held, m.n_params, 100.0 * held / m.n_params, rp, rg);
    char what[96];
    /* losses: as test_equivalence */
    snprintf(what, sizeof what, "owned%s dp %d x pp %d x v %d losses vs one rank", tied ? " tied" : "", dp, pp, g_vpp);
    t_close(what, pp_loss, ref_loss, K_STEPS, 1e-6f, 1e-5f);
    /* the whole model and moments on rank 0 */
    adamw_state mom;
    const moe_model *full = par_gather_full(&ps, &m, RANK == 0, &os, &mom);
    CHECK_R((RANK == 0) == (full != NULL), "gather: %s", RANK, moerl_last_error());
    if (full) {
        /* weights: the clipping norm is summed per stage, then over the stages (one rank sums the
         * layout in one pass), so the clip factor may differ in its last bit: ≈ 1e-7 relative on an
         * update of ≈ lr = 3e-3 per step; with tied embeddings the embedding gradient's two parts
         * are added in another order. 1e-6 absolute (weights of scale 0.02) keeps a lost gradient or
         * a wrong stage range (moves ~lr per step) out */
        snprintf(what, sizeof what, "owned%s dp %d x pp %d x v %d gathered weights vs one rank", tied ? " tied" : "", dp, pp,
                 g_vpp);
        t_close(what, full->params, ref.params, (long)ref.n_params, 1e-6f, 0.0f);
        /* moments: m ≈ 0.1·g and v ≈ 0.05·g² of gradients of ~1e-2: the same last-bit differences,
         * relative 1e-4; with tied embeddings the two parts of an embedding gradient can cancel to a
         * small sum whose rounding (~1e-9 absolute) is a large share of it, hence absolute floors of
         * 1e-8 on m (1e-5 of its scale ~1e-3) and 1e-11 on v (scale ~1e-6) */
        snprintf(what, sizeof what, "owned%s dp %d x pp %d x v %d gathered moments m", tied ? " tied" : "", dp, pp, g_vpp);
        t_close(what, mom.m, ref_os.m, (long)ref.n_params, 1e-8f, 1e-4f);
        snprintf(what, sizeof what, "owned%s dp %d x pp %d x v %d gathered moments v", tied ? " tied" : "", dp, pp, g_vpp);
        t_close(what, mom.v, ref_os.v, (long)ref.n_params, 1e-11f, 1e-4f);
        CHECK(mom.n == ref.n_params && mom.step == K_STEPS, "gathered moments: n %zu step %lld", mom.n,
              (long long)mom.step);
    }
    par_release_full(&ps, &m, full, &os, &mom);
    if (full) {
        const size_t r2 = resident_bytes(m.params, m.n_params * 4);
        CHECK(r2 <= held * 4 + slack, "after par_release_full the keeper still holds %zu bytes (stage: %zu)",
              r2, held * 4);
    }
    /* par_adamw_shard: a layout-sized state (a checkpoint's) cut to the stage, gathered back */
    adamw_state big;
    adamw_init(&big, &m, opt_config());
    for (size_t i = 0; i < big.n; i++) big.m[i] = (float)i, big.v[i] = (float)(2 * i);
    big.step = 9;
    par_adamw_shard(&ps, &m, &big);
    CHECK_R(big.n == own && big.m[0] == (float)lo && big.step == 9, "par_adamw_shard: n %zu m[0] %g", RANK, big.n,
            big.m[0]);
    adamw_free(&big);
    adamw_free(&os);
    model_acts_free(&a);
    par_state_free(&ps); /* the whole model back in m on every rank */
    snprintf(what, sizeof what, "owned%s dp %d x pp %d x v %d weights after par_state_free", tied ? " tied" : "", dp, pp,
             g_vpp);
    t_close(what, m.params, ref.params, (long)ref.n_params, 1e-6f, 0.0f);
    g_owned_hash = hash_floats(m.params, m.n_params);
    CHECK_R(dist_same_on_all_ranks(g_ctx, g_owned_hash),
            "owned dp %d x pp %d x v %d: weights must be bit-identical on every rank", RANK, dp, pp, g_vpp);
    if (RANK == 0)
        for (int k = 0; k < K_STEPS; k++)
            printf("  owned%s dp %d x pp %d x v %d step %d loss %.8f  one rank %.8f\n", tied ? " tied" : "", dp, pp, g_vpp, k,
                   pp_loss[k], ref_loss[k]);
    adamw_free(&ref_os);
    model_free(&ref);
    model_free(&m);
    g_tied = 0;
}

/* The guard tests' fixture: the pp_config model (random weights), a grid of pp stages, the whole batch
 * (one shard), and the loss scale 0.01 (restored by guard_fix_free). */
typedef struct {
    moe_model m;
    par_grid g;
    train_seq seqs[N_SEQ];
    double inv_resp; /* g_inv_resp before */
} guard_fix;

static void guard_fix_init(guard_fix *f, int pp) {
    const moe_config c = pp_config();
    MOERL_ASSERT(model_init(&f->m, &c) == MOERL_OK);
    model_init_random(&f->m, 1);
    MOERL_ASSERT(grid_for(&f->g, pp) == MOERL_OK);
    shard(0, 1, f->seqs);
    f->inv_resp = g_inv_resp;
    g_inv_resp = 0.01;
}

/* A quiet pipeline state on the fixture's grid: dynamic micro-batch count or not, v chunks per stage. */
static pp_state *guard_state(guard_fix *f, int dyn, int v) {
    pp_options po = pp_options_default();
    po.dynamic = dyn;
    po.quiet = 1;
    po.virtual_stages = v;
    pp_state *ps = pp_state_new(&f->g, &f->m, &po);
    MOERL_ASSERT(ps != NULL);
    return ps;
}

static void guard_fix_free(guard_fix *f) {
    g_inv_resp = f->inv_resp;
    par_grid_free(&f->g);
    model_free(&f->m);
}

/* Fewer micro-batches than stages: refused on every stage (none hangs) with the count needed. */
static void test_guard(int pp) {
    guard_fix f;
    guard_fix_init(&f, pp);
    moe_model *m = &f.m;
    char need[64];
    snprintf(need, sizeof need, "need at least %d", pp);
    for (int dyn = 0; dyn <= 1; dyn++) {
        pp_state *ps = guard_state(&f, dyn, 0);
        par_state par = {.grid = &f.g, .pp = ps};
        par_bind_hooks(&par);
        /* dynamic: pp − 1 sequences can make at most pp − 1 micro-batches; fixed packing: 3 sequences
         * (30 tokens) fit one micro-batch of 64 tokens */
        const int n = dyn ? pp - 1 : 3;
        train_step_opts to = {.max_tokens = 64, .temperature = 1.0f, .aux_coef = 0.02f, .par = &par};
        train_step_out so;
        const int rc = train_accumulate(m, NULL, f.seqs, n, &to, sft_cb, NULL, &so);
        CHECK_R(rc == MOERL_ERR && strstr(moerl_last_error(), need), "guard (dynamic %d, %d sequences, pp %d): rc %d, "
                "message '%s'", RANK, dyn, n, pp, rc, moerl_last_error());
        if (RANK == 0 && dyn == 0) printf("  guard: %s\n", moerl_last_error());
        /* no sequences at all (a data-parallel pipeline without work this step): zero gradients, no error */
        m->grads[0] = 1.0f;
        CHECK_R(train_accumulate(m, NULL, f.seqs, 0, &to, sft_cb, NULL, &so) == MOERL_OK && m->grads[0] == 0.0f &&
                    so.n_microbatches == 0,
                "empty batch: %s", RANK, moerl_last_error());
        pp_state_free(ps);
    }
    guard_fix_free(&f);
}

/* Pure functions, checked on every rank: the FLOP partition against every cut, the dynamic count. */
static void test_plan(void) {
    moe_config c = pp_config();
    c.num_hidden_layers = 6;
    c.n_mlp_only_layers = 2;
    c.mlp_only_layers[0] = 1, c.mlp_only_layers[1] = 4;
    double tot = 0;
    for (int l = 0; l <= c.num_hidden_layers; l++) tot += model_layer_train_flops(&c, l, 100, 5050);
    CHECK(fabs(tot - model_train_flops(&c, 100, 5050)) <= 1e-9 * tot, "per-layer FLOPs add up to the model's");
    const int L = c.num_hidden_layers;
    for (int pp = 1; pp <= 3; pp++) {
        int b[4];
        double cost[3];
        CHECK(pp_partition(&c, pp, 40, b, cost) == MOERL_OK, "partition pp %d", pp);
        double mx = 0;
        for (int s = 0; s < pp; s++) mx = fmax(mx, cost[s]);
        CHECK(b[0] == 0 && b[pp] == L, "partition covers the layers");
        for (int s = 0; s < pp; s++) CHECK(b[s + 1] > b[s], "stage %d has a layer", s);
        /* brute force over every cut (pp ≤ 3) */
        double best = 1e300;
        const int64_t pr = 40 * 41 / 2;
        for (int i = 1; i < (pp >= 2 ? L : 2); i++)
            for (int j = i + 1; j < (pp == 3 ? L : i + 2); j++) {
                int cut[4] = {0, pp >= 2 ? i : L, pp == 3 ? j : L, L};
                double w = 0;
                for (int s = 0; s < pp; s++) {
                    double cs = s == pp - 1 ? model_layer_train_flops(&c, L, 40, pr) : 0;
                    for (int l = cut[s]; l < cut[s + 1]; l++) cs += model_layer_train_flops(&c, l, 40, pr);
                    w = fmax(w, cs);
                }
                best = fmin(best, w);
            }
        if (pp == 1) best = mx;
        CHECK(fabs(mx - best) <= 1e-9 * best, "pp %d: largest stage %g, brute force %g", pp, mx, best);
    }
    CHECK(pp_partition(&c, 7, 40, (int[8]){0}, NULL) == MOERL_ERR, "7 stages for 6 layers refused");
    /* dynamic count: 12 sequences (123 tokens) packed by 64 tokens make 2; the target with pp 2 is
     * clamp(123 / 16, 4, 16) = 7 micro-batches → re-packed with cap ceil(123/7) = 18 ≥ longest (16) */
    train_seq seqs[N_SEQ];
    shard(0, 1, seqs);
    int mb[N_SEQ + 1];
    pp_options po = pp_options_default();
    po.min_mb_tokens = 16;
    po.dynamic = 0;
    CHECK(pp_plan_microbatches(seqs, N_SEQ, 64, 2, &po, mb) == 2, "fixed packing: 2 micro-batches");
    po.dynamic = 1;
    const int m = pp_plan_microbatches(seqs, N_SEQ, 64, 2, &po, mb);
    CHECK(m >= 7 && m <= N_SEQ && mb[0] == 0 && mb[m] == N_SEQ, "dynamic: %d micro-batches, want ≥ 7", m);
    for (int j = 0; j < m; j++) {
        int tok = 0;
        for (int i = mb[j]; i < mb[j + 1]; i++) tok += seq_len[i];
        CHECK(tok <= 18, "dynamic micro-batch %d: %d tokens ≤ cap 18", j, tok);
    }
}

/* Does some packing of lens[0..n) into contiguous micro-batches (a sequence never split, each ≤ cap
 * tokens) have a count the schedule allows (≥ pp; v > 1: a multiple of pp)? Brute force over every
 * set of cuts (n ≤ 12). */
static int pack_oracle(const int *lens, int n, int cap, int pp, int v) {
    for (unsigned cuts = 0; cuts < (1u << (n > 0 ? n - 1 : 0)); cuts++) {
        int k = 1, tok = 0, ok = 1;
        for (int i = 0; i < n && ok; i++) {
            if (i > 0 && (cuts >> (i - 1) & 1)) k++, tok = 0;
            tok += lens[i];
            ok = tok <= cap;
        }
        if (ok && k >= pp && (v == 1 || k % pp == 0)) return 1;
    }
    return 0;
}

/* Is mb[0..m] a packing of n sequences the schedule can run (contiguous, non-empty, ≤ cap tokens, the
 * count rule)? */
static int pack_valid(const int *lens, int n, int cap, int pp, int v, const int *mb, int m) {
    if (m < pp || (v > 1 && m % pp) || mb[0] != 0 || mb[m] != n) return 0;
    for (int j = 0; j < m; j++) {
        if (mb[j + 1] <= mb[j]) return 0;
        int tok = 0;
        for (int i = mb[j]; i < mb[j + 1]; i++) tok += lens[i];
        if (tok > cap) return 0;
    }
    return 1;
}

/* The dynamic micro-batch count under the schedule's rule: equal lengths (7 sequences of 10 tokens,
 * two per micro-batch fit: interleaved pp 2 needs an even count, and 2+2+2+1 = 4 is one), mixed
 * lengths, and a brute-force oracle over small batches: pp_plan_microbatches must find a packing
 * exactly when one exists, and what it returns must be one. */
static void test_pack_rule(void) {
    pp_options po = pp_options_default();
    po.quiet = 1;
    int lens[12], mb[13];
    train_seq seqs[12];
    for (int i = 0; i < 12; i++) seqs[i] = (train_seq){.tokens = NULL, .len = 10, .resp_start = 0};
    for (int i = 0; i < 12; i++) lens[i] = 10;
    po.virtual_stages = 2;
    int m = pp_plan_microbatches(seqs, 7, 20, 2, &po, mb);
    CHECK(m == 4 && pack_valid(lens, 7, 20, 2, 2, mb, m), "7 equal sequences, 2 fit, pp 2 v 2: %d micro-batches, "
          "want 4 (2+2+2+1)", m);
    m = pp_plan_microbatches(seqs, 7, 1000, 2, &po, mb); /* all fit in one: the target 4 (mb_min) */
    CHECK(m == 4 && pack_valid(lens, 7, 1000, 2, 2, mb, m), "7 equal sequences, any cap, pp 2 v 2: %d, want 4", m);
    m = pp_plan_microbatches(seqs, 7, 30, 4, &po, mb); /* 3 fit: counts 3..7, 4 allowed */
    CHECK(m == 4 && pack_valid(lens, 7, 30, 4, 2, mb, m), "7 equal sequences, pp 4 v 2: %d, want 4", m);
    m = pp_plan_microbatches(seqs, 7, 10, 2, &po, mb); /* one per micro-batch: 7 only, odd */
    CHECK(m == MOERL_ERR && strstr(moerl_last_error(), "multiple of actor.pipeline_parallel_size=2"),
          "7 sequences one per micro-batch, pp 2 v 2: refused (%d: %s)", m, moerl_last_error());
    m = pp_plan_microbatches(seqs, 3, 1000, 4, &po, mb); /* 3 sequences, 4 stages */
    CHECK(m == MOERL_ERR && strstr(moerl_last_error(), "need at least 4"), "3 sequences, pp 4: refused (%s)",
          moerl_last_error());
    po.virtual_stages = 1;
    m = pp_plan_microbatches(seqs, 7, 20, 4, &po, mb);
    CHECK(m >= 4 && pack_valid(lens, 7, 20, 4, 1, mb, m), "7 equal sequences, pp 4 v 1: %d", m);
    /* mixed: 4 short then one long (the target's cap packs the short ones into one) */
    const int mix[5] = {1, 1, 1, 1, 100};
    for (int i = 0; i < 5; i++) seqs[i].len = lens[i] = mix[i];
    m = pp_plan_microbatches(seqs, 5, 200, 4, &po, mb);
    CHECK(m >= 4 && pack_valid(lens, 5, 200, 4, 1, mb, m), "1,1,1,1,100 over pp 4 v 1: %d micro-batches", m);
    po.virtual_stages = 2;
    m = pp_plan_microbatches(seqs, 5, 200, 2, &po, mb);
    CHECK(m >= 2 && pack_valid(lens, 5, 200, 2, 2, mb, m), "1,1,1,1,100 over pp 2 v 2: %d micro-batches", m);
    const int mix2[7] = {30, 5, 5, 30, 5, 5, 30}; /* 110 tokens, cap 40 */
    for (int i = 0; i < 7; i++) seqs[i].len = lens[i] = mix2[i];
    m = pp_plan_microbatches(seqs, 7, 40, 2, &po, mb);
    CHECK(m >= 4 && pack_valid(lens, 7, 40, 2, 2, mb, m), "30,5,5,30,5,5,30 cap 40 pp 2 v 2: %d", m);
    /* the oracle: 3000 random small batches (n 1..10, lengths 1..40, caps 1..120, pp 1..4, v 1..3) */
    uint64_t st = 12345;
    int agree = 0, feasible = 0, n_cases = 3000;
    for (int t = 0; t < n_cases; t++) {
#define RND(k) ((int)((st = st * 6364136223846793005ULL + 1442695040888963407ULL) >> 33) % (k))
        const int n = 1 + RND(10), pp = 1 + RND(4), v = pp > 1 ? 1 + RND(3) : 1, kind = RND(3);
        for (int i = 0; i < n; i++) {
            lens[i] = kind == 0 ? 10 : kind == 1 ? 1 + RND(40) : (RND(4) ? 1 + RND(5) : 30 + RND(10));
            seqs[i].len = lens[i];
        }
        const int cap = 1 + RND(120);
        po.virtual_stages = v;
        po.min_mb_tokens = RND(2) ? 64 : 4;
        const int want = pack_oracle(lens, n, cap, pp, v);
        m = pp_plan_microbatches(seqs, n, cap, pp, &po, mb);
        const int got = m >= 0;
        const int ok = got == want && (!got || pack_valid(lens, n, cap, pp, v, mb, m));
        agree += ok;
        feasible += want;
        if (!ok && t + 1 - agree <= 10) { /* the first 10 disagreements */
            fprintf(stderr, "  case %d: n %d cap %d pp %d v %d lengths", t, n, cap, pp, v);
            for (int i = 0; i < n; i++) fprintf(stderr, " %d", lens[i]);
            fprintf(stderr, ": oracle %s, pp_plan_microbatches %d (%s)\n", want ? "feasible" : "infeasible", m,
                    got ? "" : moerl_last_error());
        }
#undef RND
    }
    CHECK(agree == n_cases, "pp_plan_microbatches agrees with the brute-force oracle on %d of %d batches", agree,
          n_cases);
    /* pp_count_allowed: every batch of n sequences of L tokens — the worst case of lengths ≤ L —
     * against the oracle, and against pp_plan_microbatches with shorter sequences mixed in */
    int wrong = 0, checked = 0;
    for (int n = 1; n <= 10; n++)
        for (int L = 1; L <= 12; L += 5)
            for (int cap = L; cap <= 4 * L; cap += 2)
                for (int pp = 1; pp <= 4; pp++)
                    for (int v = 1; v <= (pp > 1 ? 2 : 1); v++) {
                        for (int i = 0; i < n; i++) lens[i] = L;
                        const int allowed = pp_count_allowed(n, L, cap, pp, v);
                        wrong += allowed != pack_oracle(lens, n, cap, pp, v);
                        for (int i = 0; i < n; i++) seqs[i].len = lens[i] = i % 3 ? L : 1 + (L - 1) / 2;
                        po.virtual_stages = v;
                        wrong += allowed && pp_plan_microbatches(seqs, n, cap, pp, &po, mb) < 0;
                        checked++;
                    }
    CHECK(wrong == 0, "pp_count_allowed: %d of %d (n, L, cap, pp, v) disagree with the oracle or a shorter batch "
          "is refused", wrong, checked);
    CHECK(pp_count_allowed(0, 10, 5, 2, 2) == 1 && pp_count_allowed(1, 10, 5, 1, 1) == 0,
          "no sequences: nothing to schedule; a sequence over the limit: refused");
    CHECK(feasible > n_cases / 4 && feasible < n_cases - n_cases / 10,
          "the oracle's cases mix feasible (%d) and infeasible ones", feasible);
    if (RANK == 0) printf("  packing: oracle agrees on %d batches (%d feasible)\n", n_cases, feasible);
}

/* pp_slots_needed walks the schedule only up to a capped micro-batch count (moerl plan asks about up to
 * 2^31 − 1): against the peaks counted over the whole schedule (pp_schedule, every pass) for pp 1..8,
 * v 1..4, every stage and m up to 12·pp·v + 40 — far past the cap —, and a huge count answered at once
 * (the count is only a loop bound after the cap: no 2^31-entry schedule is built). */
static void test_slots_cap(void) {
    int wrong = 0, checked = 0;
    for (int p = 1; p <= 8; p++)
        for (int v = 1; v <= (p > 1 ? 4 : 1); v++)
            for (int r = 0; r < p; r++)
                for (int m = 1; m <= 12 * p * v + 40; m++) {
                    if (v > 1 && m % p) continue;
                    const int nops = 2 * m * v;
                    int *kind = xmalloc(3 * (size_t)nops * sizeof(int)), *chunk = kind + nops, *mbi = chunk + nops;
                    int want[PP_MAX_CHUNKS], in[PP_MAX_CHUNKS] = {0}, got[PP_MAX_CHUNKS];
                    for (int c = 0; c < v; c++) want[c] = 1;
                    wrong += pp_schedule(p, r, v, m, kind, chunk, mbi) != nops;
                    for (int i = 0; i < nops; i++) {
                        in[chunk[i]] += kind[i] ? -1 : 1;
                        want[chunk[i]] = MOERL_MAX(want[chunk[i]], in[chunk[i]]);
                    }
                    if (v == 1) want[0] = MOERL_MAX(want[0], p - r);
                    free(kind);
                    wrong += pp_slots_needed(p, r, v, m, got) != MOERL_OK;
                    for (int c = 0; c < v; c++) wrong += got[c] != want[c];
                    checked++;
                }
    CHECK(wrong == 0, "pp_slots_needed: %d mismatches against the whole schedule over %d (pp, v, stage, m)", wrong,
          checked);
    int big[PP_MAX_CHUNKS], small[PP_MAX_CHUNKS];
    CHECK(pp_slots_needed(8, 0, 2, 2147483640, big) == MOERL_OK && pp_slots_needed(8, 0, 2, 800, small) == MOERL_OK &&
              big[0] == small[0] && big[1] == small[1],
          "2^31 − 8 micro-batches: the steady-state peaks (%d, %d)", big[0], big[1]);
    CHECK(pp_slots_needed(4, 0, 2, 2147483647, big) == MOERL_ERR, "interleaved, a count not a multiple of pp: refused");
}

/* The schedule's order, pure, for pp 2..4, v 1..3, m = pp..4·pp (v > 1: multiples of pp): every pass
 * once, each chunk's forwards and backwards in micro-batch order with a micro-batch's backward after
 * its forward, the chunks' last backwards in the order v − 1 … 0 (what the overlapped gradient sum
 * relies on); then the stages run as an event simulation (forward 1 time unit, backward 2, messages
 * free; a pass waits for its input from the previous virtual stage): it must finish (no stage waits
 * on a pass that waits on it) and its idle share must be the theory (p − 1)/(v·m + p − 1) — exact
 * arithmetic on small integers, compared within 1e-12. */
static void test_schedule(void) {
    enum { MAXN = 2 * 16 * 3 };
    int kind[4][MAXN], chunk[4][MAXN], mbi[4][MAXN];
    int checked = 0;
    for (int p = 2; p <= 4; p++)
        for (int v = 1; v <= 3; v++)
            for (int m = p; m <= 4 * p; m++) {
                if (v > 1 && m % p) continue;
                const int nops = 2 * m * v, nv = p * v;
                int ok = 1;
                for (int r = 0; r < p; r++) {
                    ok &= pp_schedule(p, r, v, m, kind[r], chunk[r], mbi[r]) == nops;
                    int nf[3] = {0}, nb[3] = {0}, order[3], no = 0;
                    for (int i = 0; i < nops; i++) {
                        const int c = chunk[r][i], j = mbi[r][i];
                        if (c < 0 || c >= v) { ok = 0; break; }
                        if (kind[r][i] == 0) ok &= j == nf[c]++;
                        else ok &= j == nb[c]++ && j < nf[c];
                        if (kind[r][i] && nb[c] == m) order[no++] = c;
                    }
                    for (int c = 0; c < v; c++) ok &= nf[c] == m && nb[c] == m && order[c] == v - 1 - c;
                }
                /* event simulation: done[vs][j] time of a pass, −1 not yet */
                double fdone[12][16], bdone[12][16], clock[4] = {0}, busy[4] = {0};
                for (int k = 0; k < nv; k++)
                    for (int j = 0; j < m; j++) fdone[k][j] = bdone[k][j] = -1;
                int pos[4] = {0}, progress = 1;
                while (progress) {
                    progress = 0;
                    for (int r = 0; r < p; r++)
                        while (pos[r] < nops) {
                            const int i = pos[r], c = chunk[r][i], j = mbi[r][i], vs = c * p + r;
                            const double dep = kind[r][i] == 0 ? (vs > 0 ? fdone[vs - 1][j] : 0)
                                                               : (vs < nv - 1 ? bdone[vs + 1][j] : fdone[vs][j]);
                            if (dep < 0) break;
                            const double d = kind[r][i] ? 2 : 1;
                            clock[r] = fmax(clock[r], dep) + d;
                            busy[r] += d;
                            (kind[r][i] ? bdone : fdone)[vs][j] = clock[r];
                            pos[r]++;
                            progress = 1;
                        }
                }
                double T = 0, idle = 0;
                for (int r = 0; r < p; r++) {
                    ok &= pos[r] == nops;
                    T = fmax(T, clock[r]);
                }
                for (int r = 0; r < p; r++) idle += (1 - busy[r] / T) / p;
                const double theory = (double)(p - 1) / (v * m + p - 1);
                CHECK(ok && fabs(idle - theory) < 1e-12, "schedule pp %d v %d m %d: order %s, simulated idle share %.6f, "
                      "theory %.6f", p, v, m, ok ? "valid" : "INVALID or stuck", idle, theory);
                checked++;
            }
    CHECK(pp_schedule(2, 0, 2, 3, kind[0], chunk[0], mbi[0]) == MOERL_ERR && strstr(moerl_last_error(), "multiple"),
          "interleaved schedule of 3 micro-batches on 2 stages refused: '%s'", moerl_last_error());
    if (RANK == 0) printf("  schedule: %d (pp, v, m) orders valid, simulated bubble = (p-1)/(v*m+p-1)\n", checked);
}

/* pp_window over two schedules (pure): perf/pipeline_bubble = Σ idle·T / Σ T, the wait share likewise,
 * _max the largest, the theory at the mean micro-batch count; a schedule-less stats adds nothing; one
 * schedule gives pp_stats' own values. Inputs are exact binary fractions, so the sums are compared
 * within 1e-15 (one rounding of a division). */
static void test_window(void) {
    const pp_stats a = {.stages = 2, .virtual_stages = 2, .microbatches = 4, .step_s = 1.0, .bubble_mean = 0.25,
                        .bubble_max = 0.375, .wait_share_mean = 0.125},
                   b = {.stages = 2, .virtual_stages = 2, .microbatches = 8, .step_s = 3.0, .bubble_mean = 0.125,
                        .bubble_max = 0.25, .wait_share_mean = 0.0625},
                   none = {0};
    pp_window w = {0}, one = {0};
    const char *k[PP_N_METRICS];
    double v[PP_N_METRICS];
    CHECK(pp_window_metrics(&w, k, v) == 0 && pp_metrics(NULL, k, v) == 0, "an empty window writes no metric");
    pp_window_add(&one, &a);
    pp_window_add(&w, &none);
    pp_window_merge(&w, &one);
    pp_window_add(&w, &b);
    const int n = pp_window_metrics(&w, k, v);
    /* idle (0.25·1 + 0.125·3) / 4 = 0.15625, wait (0.125 + 0.1875) / 4 = 0.078125, m̄ = 6 */
    const double want[PP_N_METRICS] = {0.15625, 0.375, 1.0 / 7, 1.0 / 13, 0.078125, 6, 2};
    int ok = n == PP_N_METRICS && w.schedules == 2 && !strcmp(k[0], "perf/pipeline_bubble") &&
             !strcmp(k[6], "perf/pipeline_virtual_stages");
    for (int i = 0; i < n && ok; i++) ok = fabs(v[i] - want[i]) <= 1e-15;
    CHECK(ok, "window of 2 schedules: %d metrics, bubble %g max %g theory %g / %g wait %g m %g v %g", n, v[0], v[1],
          v[2], v[3], v[4], v[5], v[6]);
    pp_window_metrics(&one, k, v);
    CHECK(v[0] == a.bubble_mean && v[1] == a.bubble_max && v[4] == a.wait_share_mean && v[5] == 4 &&
              fabs(v[2] - 1.0 / 5) <= 1e-15 && fabs(v[3] - 1.0 / 9) <= 1e-15,
          "window of 1 schedule: bubble %g max %g wait %g m %g theory %g / %g", v[0], v[1], v[4], v[5], v[2], v[3]);
}

/* pp_window_over_replicas on dp 2 × pp 2 (4 ranks): replica d's window (1 schedule, T = 1 + d s, idle
 * share 1/4, wait 1/8 s, 4 + 4d micro-batches, bubble_max 1/4 + d/8) summed over the stage's replicas
 * on every rank — 2 schedules, T 3 s, idle 3/4 s, wait 1/4 s, 12 micro-batches, max 3/8 — exact binary
 * fractions, compared exactly; with one pipeline (pp = world size) the window is unchanged. */
static void test_window_replicas(int pp) {
    par_grid g;
    MOERL_ASSERT(grid_for(&g, pp) == MOERL_OK);
    const int d = g.dp_rank;
    pp_window w = {.schedules = 1, .stages = pp, .virtual_stages = 1, .step_s = 1.0 + d, .idle_s = 0.25 * (1.0 + d),
                   .wait_s = 0.125, .bubble_max = 0.25 + 0.125 * d, .microbatches = 4 + 4 * d};
    const pp_window before = w;
    const int rc = pp_window_over_replicas(&w, g.stage_comm);
    int ok = rc == MOERL_OK;
    if (g.dp > 1)
        ok = ok && w.schedules == 2 && w.step_s == 3.0 && w.idle_s == 0.75 && w.wait_s == 0.25 &&
             w.microbatches == 12 && w.bubble_max == 0.375 && w.stages == pp;
    else
        ok = ok && !memcmp(&w, &before, sizeof w);
    double all = ok;
    dist_allreduce_sum(g_ctx, DIST_TRAINERS, &all, 1);
    CHECK(all == g_ctx->world_size, "pipeline windows over %d replicas: schedules %d T %g idle %g wait %g m %g max %g",
          g.dp, w.schedules, w.step_s, w.idle_s, w.wait_s, w.microbatches, w.bubble_max);
    par_grid_free(&g);
}

/* Interleaved: a micro-batch count that is not a multiple of pp is refused on every stage, naming the
 * key, pp and the count needed; the dynamic count finds a multiple. */
static void test_guard_interleaved(int pp) {
    guard_fix f;
    guard_fix_init(&f, pp);
    for (int dyn = 0; dyn <= 1; dyn++) {
        pp_state *ps = guard_state(&f, dyn, 2);
        par_state par = {.grid = &f.g, .pp = ps};
        par_bind_hooks(&par);
        /* 12 sequences packed by 20 tokens make 7 micro-batches */
        train_step_opts to = {.max_tokens = 20, .temperature = 1.0f, .aux_coef = 0.02f, .par = &par};
        train_step_out so;
        const int rc = train_accumulate(&f.m, NULL, f.seqs, N_SEQ, &to, sft_cb, NULL, &so);
        char need[96];
        snprintf(need, sizeof need, "multiple of actor.pipeline_parallel_size=%d", pp);
        if (!dyn) {
            CHECK_R(rc == MOERL_ERR && strstr(moerl_last_error(), need) &&
                        strstr(moerl_last_error(), "actor.virtual_pipeline_parallel_size=2") &&
                        strstr(moerl_last_error(), pp == 2 ? "needs 8" : "needs 8"),
                    "interleaved guard pp %d: rc %d, message '%s'", RANK, pp, rc, moerl_last_error());
            if (RANK == 0) printf("  interleaved guard: %s\n", moerl_last_error());
        } else {
            CHECK_R(rc == MOERL_OK && so.n_microbatches % pp == 0 && so.n_microbatches >= 4,
                    "interleaved dynamic count pp %d: rc %d, %d micro-batches (%s)", RANK, pp, rc, so.n_microbatches,
                    rc ? moerl_last_error() : "");
        }
        pp_state_free(ps);
    }
    guard_fix_free(&f);
}

/* Interleaved runs (v = 2 chunks per stage). The token limits are picked so that the fixed packing
 * gives a micro-batch count that is a multiple of pp (the lengths of this batch: 19 tokens → 8
 * micro-batches of the whole batch; 16 → 10; 32 → 2 per data-parallel shard; 35 → 4). */
static void test_interleaved(int P) {
    g_vpp = 2;
    if (P == 2) { /* pp 2 × v 2: 4 chunks of one layer */
        g_max_tok = 16; /* m = 10 */
        test_equivalence(2, 0);
        test_owned(2, 0);
        g_max_tok = 19; /* m = 8 */
        test_equivalence(2, 1);
        test_owned(2, 1);
        g_max_tok = 20; /* forward-only has no count rule: m = 7 */
        test_forward_only(2);
        test_guard_interleaved(2);
    }
    if (P == 4) {
        /* dp 2 × pp 2 × v 2: m = 2 = pp per shard (every stage runs all forwards first) */
        g_max_tok = 32;
        test_equivalence(2, 0);
        test_forward_only(2);
        test_owned(2, 1);
        /* the overlapped gradient sum against the blocking one: bit-identical weights */
        g_overlap = 0;
        test_owned(2, 0);
        const uint64_t h_block = g_owned_hash;
        g_overlap = 1;
        test_owned(2, 0);
        CHECK_R(h_block == g_owned_hash, "dp 2 x pp 2 x v 2: weights with the overlapped gradient sum differ from the "
                "blocking sum's", RANK);
        if (RANK == 0) printf("  dp 2 x pp 2 x v 2: overlapped gradient sum bit-identical to the blocking one\n");
        /* pp 4 × v 2 on 8 layers */
        g_layers = 8;
        g_max_tok = 19; /* m = 8 */
        test_equivalence(4, 1);
        test_forward_only(4);
        g_max_tok = 35; /* m = 4 = pp */
        test_owned(4, 0);
        test_owned(4, 1);
        g_layers = 4;
    }
    g_vpp = 1;
    g_max_tok = MAX_TOK;
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_pp: %s\n", moerl_last_error());
        return 1;
    }
    make_tokens();
    int resp = 0;
    for (int s = 0; s < N_SEQ; s++) resp += seq_len[s] - prompt_len[s];
    g_inv_resp = 1.0 / resp;
    const int P = g_ctx->world_size;
    if (RANK == 0) printf("test_dist_pp: backend %s, %d ranks\n", dist_backend_name(), P);
    test_plan();
    test_pack_rule();
    test_slots_cap();
    test_schedule();
    test_window();
    if (P >= 2) {
        test_equivalence(P, 0); /* pp = world size */
        test_equivalence(P, 1); /* the same with the global load-balancing loss (counts given) */
        if (P == 4) test_equivalence(2, 0); /* dp 2 × pp 2 */
        test_guard(P);
        test_forward_only(P);
        test_owned(P, 0);
        test_owned(P, 1); /* tied embeddings: the first and last stage share the embedding */
        test_window_replicas(P); /* one pipeline: unchanged */
        if (P == 4) {
            test_window_replicas(2); /* dp 2 × pp 2 */
            test_forward_only(2);
            test_owned(2, 0);
        }
        test_interleaved(P);
    }
    return dist_test_finish(g_ctx);
}
