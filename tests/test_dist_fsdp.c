/* FSDP (ZeRO-3, src/parallel/fsdp.c) against one process, under mpirun:
 *   test_dist_fsdp --fsdp F   every rank trains; FSDP groups of F ranks (world / F replicas: HSDP);
 *                             one process (tests/run.sh): FSDP over a group of one — the sparse
 *                             buffers, the layer schedule and the shard optimizer against the
 *                             plain path
 * A small random Qwen3-MoE (10 layers: MoE and dense, aux loss on; untied, then tied embeddings) is
 * trained K AdamW steps on a fixed global batch of 9 sequences, micro-batched (so the ranks run
 * different numbers of micro-batches and the idle passes of par_pad_passes are exercised), with the
 * global aux loss (routing counts of the whole batch summed over the ranks first) — the path of
 * `moerl sft` (src/rl/sft_train.c).
 *   Reference: every rank also trains a copy alone on the whole batch (train_accumulate,
 *              compute_router_counts, adamw_step).
 * Checks: the K losses and gradient norms match the reference; the final weights (gathered back by
 * par_state_free) match it and are bit-identical on every rank; the owned shard is ~1/F of the
 * layout; the peak of gathered parameters + live gradient units stays below the full parameter
 * buffer (the model is never whole on a rank during training); the all-gather and reduce-scatter
 * bytes of each step equal the formula of the schedule in fsdp.h. Each run twice: with
 * actor.fsdp_config.reshard_after_forward true (the per-layer schedule) and false (units kept and
 * gradients accumulated for the mini-batch: its bytes, its exact peak, and the same weights as true). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/fsdp.h"
#include "dist/compress.h"
#include "parallel/config.h"
#include "parallel/parallel.h"
#include "dist_test.h"
#include "fixture.h"
#include "test.h"
#include "train/train.h"

#define K_STEPS 4
#define N_SEQ 9
#define MAX_TOKENS 24
static const int seq_len[N_SEQ] = {11, 6, 9, 14, 5, 8, 12, 7, 10};
static const int prompt_len[N_SEQ] = {3, 2, 4, 5, 1, 3, 4, 2, 3};

static dist_ctx *g_ctx;
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)
#define RANK g_ctx->world_rank

static moe_config small_config(int tied) {
    const char *kv[] = {"model.num_hidden_layers=10", "model.num_key_value_heads=2", "model.num_experts=4",
                        "model.num_experts_per_tok=2", "model.mlp_only_layers=[2]", "model.router_aux_loss_coef=0.05",
                        "model.initializer_range=0.1",
                        tied ? "model.tie_word_embeddings=true" : "model.tie_word_embeddings=false"};
    return fx_small_config(kv, FX_N(kv));
}

static int g_tok[N_SEQ][16];
static train_seq g_seqs[N_SEQ];
static int g_resp, g_tokens;

static void make_batch(void) {
    rng_state r;
    rng_seed(&r, 77);
    g_resp = g_tokens = 0;
    for (int s = 0; s < N_SEQ; s++) {
        for (int t = 0; t < seq_len[s]; t++) g_tok[s][t] = (int)rng_below(&r, 64);
        g_seqs[s] = (train_seq){.tokens = g_tok[s], .len = seq_len[s], .resp_start = prompt_len[s]};
        g_resp += seq_len[s] - prompt_len[s];
        g_tokens += seq_len[s];
    }
}

/* Token-mean cross-entropy over the GLOBAL batch's response tokens (sft.c's sft_grad). */
static double ce_grad(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                      float *dent) {
    double loss = 0;
    for (int n = 0; n < a->N; n++) {
        if (resp_index[n] < 0) continue;
        loss -= a->logp[n] / g_resp;
        dlogp[n] = -1.0f / (float)g_resp;
    }
    return loss;
}

static int n_moe(const moe_config *c) {
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += moe_config_layer_is_moe(c, l);
    return n;
}

/* One step on seqs[n] (this rank's share, or the whole batch with ps NULL). Returns the loss. */
static double step(moe_model *m, model_acts *a, adamw_state *os, par_state *ps, const train_seq *seqs, int n,
                   double *gnorm, int *mb_out) {
    const int E = m->cfg.num_experts;
    double counts[16] = {0}, psum[16] = {0};
    train_step_opts to = {.max_tokens = MAX_TOKENS, .temperature = 1.0f, .aux_coef = m->cfg.router_aux_loss_coef,
                          .total_tokens = g_tokens, .par = ps, .aux_counts = counts, .aux_psum_out = psum};
    const int n_mb = count_microbatches(seqs, n, MAX_TOKENS), max_mb = ps ? par_max_passes(ps, n_mb) : n_mb;
    *mb_out = max_mb;
    MOERL_ASSERT(compute_router_counts(m, a, seqs, n, MAX_TOKENS, counts) == MOERL_OK);
    if (ps) {
        MOERL_ASSERT(par_pad_passes(ps, n_mb, max_mb, 0) == MOERL_OK);
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, E) == MOERL_OK);
    }
    train_step_out so;
    MOERL_ASSERT(train_accumulate(m, a, seqs, n, &to, ce_grad, NULL, &so) == MOERL_OK);
    double sums[17];
    sums[0] = so.loss - to.aux_coef * so.aux_loss; /* the CE part */
    for (int e = 0; e < E; e++) sums[1 + e] = psum[e];
    if (ps) {
        MOERL_ASSERT(par_pad_passes(ps, n_mb, max_mb, 1) == MOERL_OK);
        MOERL_ASSERT(fsdp_finish_grads(ps->fsdp) == MOERL_OK);
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, sums, 1 + E) == MOERL_OK);
    }
    const double rows = (double)n_moe(&m->cfg) * g_tokens;
    double v = 0;
    for (int e = 0; e < E; e++) v += counts[e] * sums[1 + e];
    const double loss = sums[0] + to.aux_coef * E * v / (rows * rows);
    if (ps) fsdp_adamw_step(ps->fsdp, os, 1e-3f, (float)loss, gnorm);
    else adamw_step(os, m, 1e-3f, (float)loss, gnorm);
    return loss;
}

/* Σ over units of the shard floats (A), of layers 0..L−2 (B), and of layer 0 (s1). */
static void unit_sums(const fsdp_state *fs, int L, double *A, double *B, double *s1) {
    *A = *B = 0;
    for (int u = 0; u < L + 2; u++) *A += (double)fsdp_unit_shard(fs, u, NULL);
    for (int u = 1; u <= L - 1; u++) *B += (double)fsdp_unit_shard(fs, u, NULL);
    *s1 = (double)fsdp_unit_shard(fs, 1, NULL);
}

/* keep = actor.fsdp_config.reshard_after_forward=false (fsdp.h: units kept and gradients accumulated for
 * the mini-batch, one reduce-scatter per unit at its end). *final (when given) gets a copy of the
 * weights after the K steps. */
static void run(int fsdp, int tied, int keep, float **final) {
    const moe_config mc = small_config(tied);
    moe_model ref, m;
    MOERL_ASSERT(model_init(&ref, &mc) == MOERL_OK && model_init(&m, &mc) == MOERL_OK);
    model_init_random(&ref, 5);
    model_init_random(&m, 5);
    const size_t n_params = m.n_params;
    par_state ps;
    par_grid solo;
    const int one = g_ctx->world_size == 1;
    if (one) { /* one process: FSDP over a group of one (the sparse buffers, schedule and shard step) */
        memset(&ps, 0, sizeof ps);
        memset(&solo, 0, sizeof solo);
        solo.fsdp_comm = dist_comm_split(g_ctx, 0, 0);
        MOERL_ASSERT(solo.fsdp_comm);
        solo.T = solo.D = solo.dp = solo.sp = solo.pp = solo.ep = solo.fsdp = solo.replicas = 1;
        ps.ctx = g_ctx;
        ps.grid = &solo;
        ps.fsdp = fsdp_state_new(&m, solo.fsdp_comm, NULL);
        fsdp_set_reshard_after_forward(ps.fsdp, !keep);
        par_bind_hooks(&ps);
    } else {
        cfg *c = cfg_new();
        par_def_keys(c);
        char kv[64];
        snprintf(kv, sizeof kv, "actor.fsdp_config.fsdp_size=%d", fsdp);
        MOERL_ASSERT(cfg_apply_override(c, kv) == MOERL_OK);
        if (keep) MOERL_ASSERT(cfg_apply_override(c, "actor.fsdp_config.reshard_after_forward=false") == MOERL_OK);
        CHECK_R(par_state_init(&ps, g_ctx, c, &m) == MOERL_OK, "par_state_init: %s", RANK, moerl_last_error());
        cfg_free(c);
    }
    CHECK_R(ps.fsdp != NULL, "fsdp %d: FSDP is on", RANK, fsdp);
    if (!ps.fsdp) return;
    fsdp_stats st;
    fsdp_get_stats(ps.fsdp, &st);
    const int L = mc.num_hidden_layers, P = st.P;
    /* owned floats: ⌈n_u/P⌉ rounded to 16 per unit, so at most n_params/P + 16 per unit */
    CHECK_R(st.shard_floats <= n_params / P + 16 * (size_t)(L + 2) && st.shard_floats * P >= n_params,
            "shard of %zu floats for %zu params over %d ranks", RANK, st.shard_floats, n_params, P);
    model_acts ra, fa;
    MOERL_ASSERT(model_acts_init(&ra, &ref, MAX_TOKENS) == MOERL_OK && model_acts_init(&fa, &m, MAX_TOKENS) == MOERL_OK);
    fa.par = &ps;
    adamw_config oc = adamw_default_config();
    oc.lr = 1e-3f;
    adamw_state ro, fo;
    adamw_init(&ro, &ref, oc);
    fsdp_adamw_init(ps.fsdp, &fo, oc);
    int me, nd;
    par_data_shard(&ps, &me, &nd);
    CHECK_R(nd == g_ctx->trainer_size, "data shards %d = ranks %d", RANK, nd, g_ctx->trainer_size);
    train_seq mine[N_SEQ];
    int n = 0;
    for (int s = 0; s < N_SEQ; s++)
        if (s % nd == me) mine[n++] = g_seqs[s];
    double A, B, s1;
    unit_sums(ps.fsdp, L, &A, &B, &s1);
    double max_loss_rel = 0, max_gn_rel = 0, ag_prev = 0, rs_prev = 0, rep_prev = 0;
    int bytes_ok = 1;
    for (int k = 0; k < K_STEPS; k++) {
        double gr, gf;
        int mb_r, mb_f;
        const double lr_ = step(&ref, &ra, &ro, NULL, g_seqs, N_SEQ, &gr, &mb_r);
        const double lf = step(&m, &fa, &fo, &ps, mine, n, &gf, &mb_f);
        max_loss_rel = fmax(max_loss_rel, fabs(lf - lr_) / fabs(lr_));
        max_gn_rel = fmax(max_gn_rel, fabs(gf - gr) / gr);
        /* bytes of this step (untied: the schedule in fsdp.h): passes b = the group's most
         * micro-batches; forward-only pre-pass ×b then fwd+bwd ×b; + the one-float pass count */
        fsdp_get_stats(ps.fsdp, &st);
        const int b = mb_f;
        const double ag = st.allgather_bytes - ag_prev, rs = st.reduce_scatter_bytes - rs_prev;
        /* keep: every unit once (the pre-pass's first forward gathers them; nothing is released until the
         * optimizer step), one reduce-scatter per unit at the end of the mini-batch, however many
         * micro-batches */
        const double ag_formula = keep ? 4.0 * (P - 1) * (A + 1)
                                       : 4.0 * (P - 1) * (b * A + (A + B) + (b - 1) * (A - s1 + B) + 1);
        const double rs_formula = keep ? 4.0 * (P - 1) * A : 4.0 * (P - 1) * b * A;
        if ((keep || !tied) && (ag != ag_formula || rs != rs_formula)) {
            bytes_ok = 0;
            printf("[rank %d] step %d: all-gather %.0f B (formula %.0f), reduce-scatter %.0f B (formula %.0f)\n", RANK,
                   k, ag, ag_formula, rs, rs_formula);
        }
        if (st.replicas > 1) {
            const double rep = st.replica_bytes - rep_prev, rf = 2.0 * (st.replicas - 1) / st.replicas * st.shard_floats * 4;
            if (fabs(rep - rf) > 1e-6 * rf) {
                bytes_ok = 0;
                printf("[rank %d] step %d: replica all-reduce %.0f B, formula %.0f\n", RANK, k, rep, rf);
            }
            rep_prev = st.replica_bytes;
        }
        ag_prev = st.allgather_bytes;
        rs_prev = st.reduce_scatter_bytes;
    }
    fsdp_get_stats(ps.fsdp, &st);
    /* fp32: the ranks' partial sums are added in another order than the one-process accumulation
     * (reduce-scatter and all-reduce trees vs one running sum); measured ≤ 1e-7 relative */
    CHECK_R(max_loss_rel < 1e-5, "fsdp %d tied %d keep %d: losses match one process (max rel diff %.3g)", RANK, fsdp,
            tied, keep, max_loss_rel);
    CHECK_R(max_gn_rel < 1e-4, "fsdp %d tied %d keep %d: gradient norms match (max rel diff %.3g)", RANK, fsdp, tied,
            keep, max_gn_rel);
    CHECK_R(bytes_ok, "fsdp %d tied %d keep %d: bytes per step equal the formula", RANK, fsdp, tied, keep);
    if (keep) {
        /* held: the whole model's parameters and gradients resident at the end of the mini-batch, then
         * fsdp_finish_grads sends the units one at a time from unit 0: unit k's buffers (a bounce of P·s_k
         * floats when P·s_k ≠ n_k, else the receive buffer of s_k) while units 0..k−1 have given their
         * gradient pages back. Exact: fsdp.c accounts whole floats and nothing completes out of order
         * in a held mini-batch */
        double extra = 0, sent = 0;
        for (int u = 0; u < L + 2; u++) {
            size_t nu, su = fsdp_unit_shard(ps.fsdp, u, &nu);
            if (nu == 0) continue;
            extra = fmax(extra, ((size_t)P * su != nu ? (double)P * su : (double)su) - sent);
            sent += (double)nu;
        }
        const double want = 8.0 * (double)n_params + 4.0 * extra;
        CHECK_R(st.peak_gathered_bytes == want, "fsdp %d tied %d keep: peak gathered %.0f B = whole parameters + "
                "gradients + the reduce-scatter buffers %.0f B", RANK, fsdp, tied, st.peak_gathered_bytes, want);
    }
    /* memory: gathered parameters (the layer pair + one prefetched unit, with a bounce buffer while
     * in flight) + gradient units (two being written + two reduce-scatters in flight) + receive
     * buffers stay within 9 units whatever the depth — not the model: below the full parameter
     * buffer of this 10-layer model */
    const double unit_b = (double)st.unit_floats_max * 4;
    CHECK_R(keep || (st.peak_gathered_bytes <= 9 * unit_b && st.peak_gathered_bytes < (double)n_params * 4),
            "fsdp %d tied %d: peak gathered %.0f B ≤ 9 units (%.0f B) and < the parameters (%zu B)", RANK, fsdp, tied,
            st.peak_gathered_bytes, 9 * unit_b, n_params * 4);
    if (RANK == 0)
        printf("fsdp %d tied %d keep %d (P=%d, replicas %d): loss rel diff %.2g, peak gathered %.0f KiB of %.0f KiB "
               "params, shard %zu of %zu floats\n", fsdp, tied, keep, P, st.replicas, max_loss_rel, st.peak_gathered_bytes / 1024,
               n_params * 4 / 1024.0, st.shard_floats, n_params);
    model_acts_free(&fa);
    adamw_free(&fo);
    if (one) { /* m whole again */
        fsdp_state_free(ps.fsdp);
        dist_comm_free(solo.fsdp_comm);
    } else {
        par_state_free(&ps); /* m whole again on every rank */
    }
    double md = 0;
    for (size_t i = 0; i < n_params; i++) md = fmax(md, fabs((double)m.params[i] - ref.params[i]));
    /* Adam normalises each update to ~lr = 1e-3: a gradient differing by fp32 rounding (above)
     * moves a weight by ~1e-7·lr per step, except where a gradient is tiny against its rounding,
     * where the normalised update can differ by up to lr; measured ≤ 4e-6 after 4 steps with
     * OpenBLAS's expert GEMMs, 2.04e-5 (one q_proj weight) with moerl's tiled kernel (gemm_tiled.c:
     * another fp32 summation order in the MoE layers) */
    CHECK_R(md < 5e-5, "fsdp %d tied %d: weights after %d steps match one process (max |diff| %.3g)", RANK, fsdp, tied,
            K_STEPS, md);
    /* every rank holds the same bits */
    float h = 0;
    for (size_t i = 0; i < n_params; i++) h += m.params[i] * (float)((i % 97) + 1);
    double hs[2] = {h, (double)h * h};
    MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, hs, 2) == MOERL_OK);
    const int T = g_ctx->trainer_size;
    CHECK_R(fabs(hs[0] * hs[0] / T - hs[1]) <= 1e-9 * fabs(hs[1]) + 1e-30, "weights identical on every rank", RANK);
    if (final) {
        *final = xmalloc(n_params * sizeof(float));
        memcpy(*final, m.params, n_params * sizeof(float));
    }
    model_acts_free(&ra);
    adamw_free(&ro);
    model_free(&ref);
    model_free(&m);
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    MOERL_ASSERT(g_ctx);
    int fsdp = 2;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--fsdp")) fsdp = atoi(argv[i + 1]);
    MOERL_ASSERT(dist_split_roles(g_ctx, g_ctx->world_size) == MOERL_OK);
    if (g_ctx->world_size == 1) { /* one process (tests/run.sh): sharding needs ranks; the refusal names the key */
        const moe_config mc = small_config(0);
        moe_model m;
        MOERL_ASSERT(model_init(&m, &mc) == MOERL_OK);
        cfg *c = cfg_new();
        par_def_keys(c);
        MOERL_ASSERT(cfg_apply_override(c, "actor.fsdp_config.fsdp_size=2") == MOERL_OK);
        par_state ps;
        CHECK(par_state_init(&ps, g_ctx, c, &m) == MOERL_ERR && strstr(moerl_last_error(), "fsdp_size=2"),
              "fsdp 2 in one process must be refused naming the key: %s", moerl_last_error());
        /* keeping FSDP's units needs FSDP: the key is refused, not ignored, with FSDP off */
        MOERL_ASSERT(cfg_apply_override(c, "actor.fsdp_config.fsdp_size=1") == MOERL_OK);
        MOERL_ASSERT(cfg_apply_override(c, "actor.fsdp_config.reshard_after_forward=false") == MOERL_OK);
        CHECK(par_state_init(&ps, g_ctx, c, &m) == MOERL_ERR &&
                  strstr(moerl_last_error(), "reshard_after_forward=false") && strstr(moerl_last_error(), "fsdp_size=1"),
              "reshard_after_forward=false without FSDP must be refused naming both keys: %s", moerl_last_error());
        {   /* and before any folder or model exists (par_read_layout, what moerl sft / rl check first) */
            cfg *lc = cfg_new();
            par_def_layout_keys(lc);
            MOERL_ASSERT(cfg_apply_override(lc, "actor.fsdp_config.reshard_after_forward=false") == MOERL_OK);
            par_layout pl;
            CHECK(par_read_layout(lc, GRAD_COMPRESSION_NONE, &pl) == MOERL_ERR &&
                      strstr(moerl_last_error(), "reshard_after_forward=false"),
                  "par_read_layout refuses reshard_after_forward=false without FSDP: %s", moerl_last_error());
            MOERL_ASSERT(cfg_apply_override(lc, "trainer.n_ranks=2") == MOERL_OK);
            MOERL_ASSERT(cfg_apply_override(lc, "actor.fsdp_config.fsdp_size=2") == MOERL_OK);
            CHECK(par_read_layout(lc, GRAD_COMPRESSION_NONE, &pl) == MOERL_OK && pl.par.fsdp_keep_gathered == 1,
                  "par_read_layout accepts it with FSDP 2 and reads it: %s", moerl_last_error());
            cfg_free(lc);
        }
        cfg_free(c);
        model_free(&m);
        printf("test_dist_fsdp: one process: the refusal only; the sharding runs under mpirun (tests/e2e_mpi.sh)\n");
        dist_finalize(g_ctx);
        TEST_MAIN_END();
    }
    make_batch();
    for (int tied = 0; tied <= 1; tied++) {
        float *w_reshard = NULL, *w_keep = NULL;
        run(fsdp, tied, 0, &w_reshard);
        run(fsdp, tied, 1, &w_keep);
        /* reshard_after_forward=false against true after K steps: the same gradients summed in another
         * order (each rank's micro-batches first, then one reduce-scatter of the sum, instead of one
         * reduce-scatter per micro-batch added into the shard) — fp32 rounding of the sums, amplified
         * where Adam normalises a tiny gradient, as against one process above: the same 5e-5 */
        const moe_config mc = small_config(tied);
        moe_model shape;
        MOERL_ASSERT(model_init(&shape, &mc) == MOERL_OK);
        double md = 0;
        for (size_t i = 0; w_reshard && w_keep && i < shape.n_params; i++)
            md = fmax(md, fabs((double)w_keep[i] - w_reshard[i]));
        CHECK_R(w_reshard && w_keep && md < 5e-5, "fsdp %d tied %d: reshard_after_forward=false matches true after %d "
                "steps (max |diff| %.3g)", RANK, fsdp, tied, K_STEPS, md);
        if (RANK == 0) printf("fsdp %d tied %d: reshard_after_forward false vs true: max |diff| %.3g\n", fsdp, tied, md);
        model_free(&shape);
        free(w_reshard);
        free(w_keep);
    }
    return dist_test_finish(g_ctx);
}
