/* Ulysses sequence parallelism against one rank (src/parallel/ulysses.h), alone and combined with
 * data parallelism and expert parallelism. Every world rank is a trainer; the grid has
 * actor.ulysses_sequence_parallel_size = --sp, actor.expert_parallel_size = --ep (default 1), the
 * rest data parallel. The dp = D/sp data shards split the global batch of tests/par_fixture.h by
 * sequences; the sp ranks of a shard run the same micro-batch, each on its share of the tokens.
 * Model: nh = 4 query heads over --nkv key/value heads (GQA; nkv < sp replicates kv heads), E = 8
 * experts top-2, aux loss on with the global counts. K = 4 AdamW steps from the reference's weights.
 * Checks: CE and global aux losses and the weights (assembled over EP when ep > 1) match the one-rank
 * reference within written fp32 tolerances; weights bit-identical on every rank; the SP group's
 * all-to-all byte counter equals the formula from the token split; a micro-batch shorter than the
 * SP size is refused. Usage: test_dist_sp --sp S [--ep E] [--nkv N]. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"
#include "parallel/ep.h"
#include "parallel/parallel.h"
#include "parallel/ulysses.h"
#include "par_fixture.h"
#include "dist_test.h"
#include "test.h"

#define E_EXPERTS 8
#define TOP_K 2

static dist_ctx *g_ctx;
#define RANK g_ctx->world_rank
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)

/* Floats this rank sends to the other sp ranks per layer for a micro-batch of N tokens: forward
 * (q|k|v rows of its tokens to every other rank, then the attention output of the others' tokens
 * for its heads) and backward (d_out of its tokens, then dq|dk|dv of the others' tokens). */
static void sp_formula(int N, int P, int r, int nh, int nkv, int hd, double *fwd, double *bwd) {
    const int t0 = (int)((long)N * r / P), n = (int)((long)N * (r + 1) / P) - t0;
    const int nh_l = nh / P, nkv_l = nkv >= P ? nkv / P : 1, W = nh_l + 2 * nkv_l;
    *fwd = (double)hd * ((double)(P - 1) * n * W + (double)(N - n) * nh_l);
    *bwd = (double)hd * ((double)(P - 1) * n * nh_l + (double)(N - n) * W);
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_sp: %s\n", moerl_last_error());
        return 1;
    }
    if (g_ctx->world_size == 1) { /* one process (tests/run.sh): the refusals only */
        const moe_config c1 = fx_config(E_EXPERTS, TOP_K, 2);
        par_config p1 = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                         .pipeline_parallel_size = 1, .alltoall_max_ep = 16, .capacity_factor = 1.25};
        par_grid g1;
        MOERL_ASSERT(par_grid_init(&g1, g_ctx, &p1, 8, 4, 2, 3) == MOERL_OK);
        CHECK(sp_state_new(&g1, &c1, 64) == NULL && strstr(moerl_last_error(), "ulysses_sequence_parallel_size"),
              "sp_state_new at sp 1: %s", moerl_last_error());
        par_grid_free(&g1);
        p1.ulysses_sequence_parallel_size = 3; /* does not divide 4 heads; checked before any rank count */
        CHECK(par_check(&p1, 3, 8, 4, 2, 3) == MOERL_ERR && strstr(moerl_last_error(), "heads"),
              "sp 3 with 4 heads: %s", moerl_last_error());
        printf("test_dist_sp: one process: refusals only; the exchanges run under mpirun (tests/e2e_mpi.sh)\n");
        dist_finalize(g_ctx);
        TEST_MAIN_END();
    }
    int sp_size = 2, ep_size = 1, nkv = 2;
    static const struct option lo[] = {{"sp", 1, 0, 's'}, {"ep", 1, 0, 'e'}, {"nkv", 1, 0, 'k'}, {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (o == 's') sp_size = atoi(optarg);
        else if (o == 'e') ep_size = atoi(optarg);
        else if (o == 'k') nkv = atoi(optarg);
        else {
            fprintf(stderr, "usage: test_dist_sp --sp S [--ep E] [--nkv N]\n");
            return 1;
        }
    }
    fx_batch b;
    fx_make_batch(&b);
    moe_config c = fx_config(E_EXPERTS, TOP_K, nkv);
    moe_model init, ref;
    MOERL_ASSERT(model_init(&init, &c) == MOERL_OK);
    model_init_random(&init, 4242);
    float ref_ce[FX_K_STEPS], ref_aux[FX_K_STEPS];
    fx_reference(&c, &b, ref_ce, ref_aux, &ref);

    par_config pc = {.fsdp_size = 1, .expert_parallel_size = ep_size, .ulysses_sequence_parallel_size = sp_size,
                     .pipeline_parallel_size = 1, .dispatcher = MOE_DISPATCH_AUTO, .alltoall_max_ep = 16,
                     .capacity_factor = 1.25};
    par_grid g;
    if (par_grid_init(&g, g_ctx, &pc, c.num_experts, c.num_attention_heads, c.num_key_value_heads,
                      c.num_hidden_layers) != MOERL_OK) {
        fprintf(stderr, "test_dist_sp: grid: %s\n", moerl_last_error());
        dist_finalize(g_ctx);
        return 1;
    }
    if (RANK == 0)
        printf("test_dist_sp: backend %s, %d ranks: sp %d x dp %d, ep %d; nh %d nkv %d; %d tokens\n",
               dist_backend_name(), g_ctx->world_size, g.sp, g.dp, g.ep, c.num_attention_heads, nkv, b.n_tokens);
    moe_config cl = c;
    ep_config_apply(&g, &cl);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &cl) == MOERL_OK);
    MOERL_ASSERT(ep_slice_model(&init, &m) == MOERL_OK);
    par_state ps = {.grid = &g};
    ps.sp = sp_state_new(&g, &cl, FX_MAX_TOKENS);
    CHECK_R(ps.sp != NULL, "sp_state_new: %s", RANK, moerl_last_error());
    if (!ps.sp) return 1;
    if (g.ep > 1) {
        ps.ep = ep_state_new(&g, &cl, FX_MAX_TOKENS);
        CHECK_R(ps.ep != NULL, "ep_state_new: %s", RANK, moerl_last_error());
        if (!ps.ep) return 1;
    }
    par_bind_hooks(&ps);
    model_acts a;
    /* activations for this rank's share of a micro-batch only: the point of SP */
    MOERL_ASSERT(model_acts_init(&a, &m, (FX_MAX_TOKENS + g.sp - 1) / g.sp) == MOERL_OK);
    a.par = &ps;
    adamw_state os;
    adamw_init(&os, &m, fx_opt());
    train_seq mine[FX_N_SEQ];
    const int n = fx_split(&b, g.dp_rank, g.dp, mine);
    int N_mb = 0;
    for (int i = 0; i < n; i++) N_mb += mine[i].len;
    const int E = c.num_experts;
    float ce[FX_K_STEPS], aux[FX_K_STEPS];
    for (int k = 0; k < FX_K_STEPS; k++) {
        double counts[64] = {0}, sums[1 + 64] = {0};
        MOERL_ASSERT(compute_router_counts(&m, &a, mine, n, FX_MAX_TOKENS, counts) == MOERL_OK);
        MOERL_ASSERT(dist_comm_allreduce_f64(g.stage_comm, counts, E) == MOERL_OK);
        fx_ce_ctx cc = {1.0f / (float)b.n_response, 0};
        train_step_opts o = {.max_tokens = FX_MAX_TOKENS, .temperature = 1.0f, .aux_coef = FX_AUX_COEF,
                             .total_tokens = b.n_tokens, .aux_counts = counts, .aux_psum_out = sums + 1, .par = &ps};
        train_step_out so;
        MOERL_ASSERT(train_accumulate(&m, &a, mine, n, &o, fx_ce, &cc, &so) == MOERL_OK);
        if (ps.ep) MOERL_ASSERT(ep_reduce_grads(ps.ep, &m) == MOERL_OK);
        else MOERL_ASSERT(dist_comm_allreduce_f32(g.stage_comm, m.grads, m.n_params) == MOERL_OK);
        sums[0] = cc.ce;
        MOERL_ASSERT(dist_comm_allreduce_f64(g.stage_comm, sums, 1 + E) == MOERL_OK);
        ce[k] = (float)sums[0];
        aux[k] = fx_aux_value(counts, sums + 1, E, (int64_t)a.n_moe_layers * b.n_tokens);
        double gn;
        if (ps.ep) MOERL_ASSERT(ep_adamw_step(ps.ep, &os, &m, os.cfg.lr, ce[k], &gn) == 1);
        else MOERL_ASSERT(adamw_step(&os, &m, os.cfg.lr, ce[k], &gn) == 1);
    }
    /* two forwards (router counts, training) and one backward per step, one micro-batch each */
    double fwd, bwd;
    sp_formula(N_mb, g.sp, g.sp_rank, c.num_attention_heads, nkv, c.head_dim, &fwd, &bwd);
    const double want = 4.0 * c.num_hidden_layers * FX_K_STEPS * (2 * fwd + bwd);
    const double got = dist_comm_bytes(g.sp_comm, DIST_OP_ALLTOALL);
    const sp_stats st = sp_get_stats(ps.sp);
    CHECK_R(got == want && 4.0 * st.floats_sent == want, "SP all-to-all bytes %.0f (stats %.0f), formula %.0f", RANK,
            got, 4.0 * st.floats_sent, want);
    printf("  rank %d (dp %d sp %d): micro-batch %d tokens, %ld all-to-alls, %.0f B sent (formula %.0f), %.2f ms\n",
           RANK, g.dp_rank, g.sp_rank, N_mb, st.exchanges, got, want, 1e3 * st.seconds);

    moe_model full;
    memset(&full, 0, sizeof full);
    const moe_model *cmp = &m;
    if (ps.ep) {
        MOERL_ASSERT(ep_gather_model(ps.ep, &m, &full) == MOERL_OK);
        cmp = &full;
    }
    MOERL_ASSERT(cmp->n_params == ref.n_params);
    /* losses: partial sums over ranks in another fp32 order, at weights drifting by the rounding of
     * earlier steps (as tests/test_dist_dp.c): 1e-6 absolute + 1e-5 relative */
    t_close("SP CE losses vs one rank", ce, ref_ce, FX_K_STEPS, 1e-6f, 1e-5f);
    t_close("SP aux losses vs one rank", aux, ref_aux, FX_K_STEPS, 1e-6f, 1e-5f);
    /* weights: weight gradients summed over token shares and ranks (and replicated kv heads' partial
     * gradients added) in another fp32 order; Adam passes the rounding on to elements whose
     * gradient is mostly noise. Same bound and reasoning as tests/test_dist_dp.c: atol 5e-5
     * (≈ lr/60) + rtol 1e-4; a wrong exchange or a missing sum moves weights by ~lr per step */
    t_close("SP weights vs one rank", cmp->params, ref.params, (long)ref.n_params, 5e-5f, 1e-4f);
    double worst = 0;
    for (size_t i = 0; i < ref.n_params; i++) worst = fmax(worst, fabs((double)cmp->params[i] - ref.params[i]));
    CHECK_R(dist_same_on_all_ranks(g_ctx, fx_hash(cmp->params, cmp->n_params)), "weights must be bit-identical on every rank",
            RANK);
    if (RANK == 0) {
        for (int k = 0; k < FX_K_STEPS; k++)
            printf("  step %d  CE SP %.7f one rank %.7f  aux SP %.7f one rank %.7f\n", k, ce[k], ref_ce[k], aux[k],
                   ref_aux[k]);
        printf("  max |w_SP − w_one rank| = %.3g; activations per rank %zu B (one rank: %zu B)\n", worst,
               model_acts_bytes(&m, (FX_MAX_TOKENS + g.sp - 1) / g.sp), model_acts_bytes(&ref, FX_MAX_TOKENS));
    }
    /* multi-turn loss masks (train_seq.resp_mask) under SP: compute_logprobs gives every rank of the
     * group the loss tokens' logprobs of the model on one rank (attention sums in another order: 1e-5
     * absolute + relative on logprobs of size ~5) and 0 at the masked entries */
    {
        unsigned char mk[FX_N_SEQ][16];
        float lp_sp[FX_N_SEQ][16], lp_one[FX_N_SEQ][16], *o_sp[FX_N_SEQ], *o_one[FX_N_SEQ];
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < 16; k++) {
                mk[i][k] = k % 3 != 1;
                lp_sp[i][k] = lp_one[i][k] = -7.0f - k;
            }
            mine[i].resp_mask = mk[i];
            o_sp[i] = lp_sp[i];
            o_one[i] = lp_one[i];
        }
        model_acts ra;
        MOERL_ASSERT(model_acts_init(&ra, cmp, FX_MAX_TOKENS) == MOERL_OK);
        MOERL_ASSERT(compute_logprobs(cmp, &ra, mine, n, FX_MAX_TOKENS, 1.0f, o_one) == MOERL_OK);
        CHECK_R(compute_logprobs(&m, &a, mine, n, FX_MAX_TOKENS, 1.0f, o_sp) == MOERL_OK, "SP compute_logprobs: %s",
                RANK, moerl_last_error());
        int zero = 1;
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < mine[i].len - mine[i].resp_start; k++) zero &= mk[i][k] || lp_sp[i][k] == 0.0f;
            t_close("SP logprobs with loss masks vs one rank", lp_sp[i], lp_one[i], 16, 1e-5f, 1e-5f);
            mine[i].resp_mask = NULL;
        }
        CHECK_R(zero, "SP compute_logprobs: a masked entry is not 0", RANK);
        model_acts_free(&ra);
    }
    /* a micro-batch shorter than the SP size is refused on every rank */
    const int tk[1] = {5}, cu[2] = {0, 1};
    CHECK_R(model_forward(&m, &a, tk, cu, NULL, 1, 1) == MOERL_ERR && strstr(moerl_last_error(), "SP size"),
            "a 1-token micro-batch under SP: %s", RANK, moerl_last_error());

    model_free(&full);
    adamw_free(&os);
    model_acts_free(&a);
    ep_state_free(ps.ep);
    sp_state_free(ps.sp);
    model_free(&m);
    par_grid_free(&g);
    model_free(&init);
    model_free(&ref);
    return dist_test_finish(g_ctx);
}
