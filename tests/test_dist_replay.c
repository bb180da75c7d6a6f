/* Routing replay under model parallelism (actor.router_replay; src/parallel/): the global batch of
 * tests/par_fixture.h carries replayed routes (random distinct experts for most (token, MoE layer),
 * −1 — native routing — for every fifth token) and trains K AdamW steps through parallel.h's entry
 * points under the layout given (--fsdp F --ep E --sp S --pp P), against the one-rank replayed run
 * (fx_reference on the same sequences). Also the routes' record and agreement counts of a
 * forward-only pass (compute_logprobs_routes, R2's recording and the metrics) equal the one-rank
 * pass's: every (token, MoE layer) is recorded by exactly one rank, with the same experts.
 * Under the local backend (one process, tests/run.sh) the layout is one rank: the entry points with
 * replay equal the reference bit for bit. Under mpirun (tests/e2e_mpi.sh) the tolerances are those of
 * tests/test_dist_ep.c (fp32 summation order only). Usage: test_dist_replay [--fsdp F] [--ep E]
 * [--sp S] [--pp P]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"
#include "parallel/parallel.h"
#include "par_fixture.h"
#include "dist_test.h"
#include "test.h"

#define E_EXPERTS 8
#define TOP_K 2
#define RANK g_ctx->world_rank
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)
#define MB_TOKENS 24 /* ≥ the longest sequence (14); several micro-batches per shard (the pipeline's 1F1B) */

static dist_ctx *g_ctx;
static int16_t g_routes[FX_N_SEQ * 16 * 2 * TOP_K]; /* [token, 2 MoE layers, K] over the batch */

/* Replayed routes: K distinct experts drawn per (token, MoE layer), every fifth token −1. */
static void attach_routes(fx_batch *b) {
    rng_state r;
    rng_seed(&r, 77);
    const int per = 2 * TOP_K;
    for (int t = 0; t < b->n_tokens; t++)
        for (int mi = 0; mi < 2; mi++) {
            int16_t *x = g_routes + (size_t)t * per + mi * TOP_K;
            if (t % 5 == 4) {
                x[0] = x[1] = -1;
                continue;
            }
            x[0] = (int16_t)rng_below(&r, E_EXPERTS);
            do x[1] = (int16_t)rng_below(&r, E_EXPERTS);
            while (x[1] == x[0]);
        }
    for (int s = 0, o = 0; s < FX_N_SEQ; o += b->seqs[s].len, s++) b->seqs[s].routes = g_routes + (size_t)o * per;
}

typedef struct {
    int16_t *rec[FX_N_SEQ]; /* per sequence [len, 2, K], −1 where this rank computed nothing */
    double cnt[6];          /* count, agree, agree_native per MoE layer */
} route_pass;

/* A forward-only pass over seqs[0..n) recording the native routes and comparing with the replayed ones. */
static void record_pass(const moe_model *m, model_acts *a, const train_seq *seqs, int n, int mb_tokens,
                        route_pass *rp) {
    float *lp[FX_N_SEQ];
    const int16_t *cmp[FX_N_SEQ];
    memset(rp->cnt, 0, sizeof rp->cnt);
    for (int s = 0; s < n; s++) {
        lp[s] = xmalloc((size_t)seqs[s].len * sizeof(float));
        rp->rec[s] = xmalloc((size_t)seqs[s].len * 2 * TOP_K * sizeof(int16_t));
        for (int k = 0; k < seqs[s].len * 2 * TOP_K; k++) rp->rec[s][k] = -1;
        cmp[s] = seqs[s].routes;
    }
    train_route_opts ro = {.record = rp->rec, .compare = cmp, .count = rp->cnt, .agree = rp->cnt + 2,
                           .agree_native = rp->cnt + 4};
    MOERL_ASSERT(compute_logprobs_routes(m, a, seqs, n, mb_tokens, 1.0f, lp, &ro) == MOERL_OK);
    for (int s = 0; s < n; s++) free(lp[s]);
}

/* The layout's K steps with replay (parallel.h's entry points, as test_dist_ep.c's run_par) and a recording
 * pass; CE losses, the whole model on trainer rank 0 (*whole), the record compared with the one-rank one. */
static void run_layout(const fx_batch *b, const moe_model *init, const par_config *pc, const route_pass *ref_rp,
                       float *ce, moe_model *whole, double *rec_stats) {
    const moe_config c = fx_config(E_EXPERTS, TOP_K, 2);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    memcpy(m.params, init->params, init->n_params * sizeof(float));
    par_state ps;
    CHECK_R(par_state_init_cfg(&ps, g_ctx, pc, &m) == MOERL_OK, "par_state_init_cfg: %s", RANK, moerl_last_error());
    model_acts a;
    MOERL_ASSERT(model_acts_init_rows(&a, &m, par_acts_rows(&ps, MB_TOKENS), MB_TOKENS) == MOERL_OK);
    a.par = &ps;
    adamw_state os;
    par_adamw_init(&ps, &m, &os, fx_opt());
    train_seq mine[FX_N_SEQ];
    int idx, cnt;
    par_data_shard(&ps, &idx, &cnt);
    const int n = fx_split(b, idx, cnt, mine), E = c.num_experts;
    int first[FX_N_SEQ]; /* each of mine's index in the batch */
    for (int s = 0, k = 0; s < FX_N_SEQ && k < n; s++)
        if (b->seqs[s].tokens == mine[k].tokens) first[k++] = s;
    /* the record of a forward-only pass at the initial weights: this rank's entries equal the one-rank ones */
    route_pass rp;
    record_pass(&m, &a, mine, n, MB_TOKENS, &rp);
    double written = 0, wrong = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < mine[k].len * 2 * TOP_K; i++)
            if (rp.rec[k][i] != -1) {
                written++;
                wrong += rp.rec[k][i] != ref_rp->rec[first[k]][i];
            }
    for (int k = 0; k < n; k++) free(rp.rec[k]);
    rec_stats[0] = written;
    rec_stats[1] = wrong;
    for (int i = 0; i < 6; i++) rec_stats[2 + i] = rp.cnt[i];
    MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, rec_stats, 8) == MOERL_OK);
    for (int k = 0; k < FX_K_STEPS; k++) {
        double counts[64] = {0}, sums[1 + 64] = {0};
        const int passes = count_microbatches(mine, n, MB_TOKENS), most = par_max_passes(&ps, passes);
        MOERL_ASSERT(compute_router_counts(&m, &a, mine, n, MB_TOKENS, counts) == MOERL_OK);
        MOERL_ASSERT(par_pad_passes(&ps, passes, most, 0) == MOERL_OK);
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, E) == MOERL_OK);
        for (int e = 0; e < E && ps.grid && ps.grid->pp > 1; e++) counts[e] /= ps.grid->pp; /* as the trainer */
        fx_ce_ctx cc = {1.0f / (float)b->n_response, 0};
        train_step_opts o = {.max_tokens = MB_TOKENS, .temperature = 1.0f, .aux_coef = FX_AUX_COEF,
                             .total_tokens = b->n_tokens, .aux_counts = counts, .aux_psum_out = sums + 1, .par = &ps};
        train_step_out so;
        par_zero_grad(&ps, &m);
        MOERL_ASSERT(train_accumulate(&m, &a, mine, n, &o, fx_ce, &cc, &so) == MOERL_OK);
        MOERL_ASSERT(par_finish_grads(&ps, passes, most) == MOERL_OK);
        if (ps.grid && !par_grads_self_reduced(&ps)) /* Ulysses SP: the caller's reducer sums over stage_comm */
            MOERL_ASSERT(dist_comm_allreduce_f32(ps.grid->stage_comm, m.grads, m.n_params) == MOERL_OK);
        sums[0] = cc.ce;
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, sums, 1) == MOERL_OK);
        ce[k] = (float)sums[0]; /* SP: each rank its tokens; pipeline: the last stage's */
        double gn;
        MOERL_ASSERT(par_adamw_step(&ps, &m, &os, os.cfg.lr, ce[k], &gn) == 1);
    }
    const int keep = g_ctx->trainer_rank == 0;
    const moe_model *full = par_gather_full(&ps, &m, keep, NULL, NULL);
    if (keep && full) {
        MOERL_ASSERT(model_init(whole, &c) == MOERL_OK);
        memcpy(whole->params, full->params, init->n_params * sizeof(float));
    }
    par_release_full(&ps, &m, full, NULL, NULL);
    adamw_free(&os);
    model_acts_free(&a);
    par_state_free(&ps);
    model_free(&m);
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_replay: %s\n", moerl_last_error());
        return 1;
    }
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = 1, .dispatcher = MOE_DISPATCH_AUTO, .alltoall_max_ep = 16,
                     .capacity_factor = 1.25, .max_tokens = MB_TOKENS};
    for (int i = 1; i + 1 < argc; i += 2) {
        const int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--fsdp")) pc.fsdp_size = v;
        else if (!strcmp(argv[i], "--ep")) pc.expert_parallel_size = v;
        else if (!strcmp(argv[i], "--sp")) pc.ulysses_sequence_parallel_size = v;
        else if (!strcmp(argv[i], "--pp")) pc.pipeline_parallel_size = v;
        else {
            fprintf(stderr, "usage: test_dist_replay [--fsdp F] [--ep E] [--sp S] [--pp P]\n");
            return 1;
        }
    }
    fx_batch b;
    fx_make_batch(&b);
    attach_routes(&b);
    const moe_config c = fx_config(E_EXPERTS, TOP_K, 2);
    moe_model init, ref;
    MOERL_ASSERT(model_init(&init, &c) == MOERL_OK);
    model_init_random(&init, 4242);
    /* one rank: the record of the whole batch at the initial weights, then K replayed steps */
    route_pass ref_rp;
    {
        model_acts a;
        MOERL_ASSERT(model_acts_init(&a, &init, FX_MAX_TOKENS) == MOERL_OK);
        record_pass(&init, &a, b.seqs, FX_N_SEQ, FX_MAX_TOKENS, &ref_rp);
        model_acts_free(&a);
    }
    float ref_ce[FX_K_STEPS], ref_aux[FX_K_STEPS];
    fx_reference(&c, &b, ref_ce, ref_aux, &ref);
    /* the replay mattered: the replayed run's losses differ from the native run's */
    {
        fx_batch nb = b;
        for (int s = 0; s < FX_N_SEQ; s++) nb.seqs[s].routes = NULL;
        float nce[FX_K_STEPS], naux[FX_K_STEPS];
        moe_model nm;
        fx_reference(&c, &nb, nce, naux, &nm);
        CHECK_R(fabsf(nce[0] - ref_ce[0]) > 1e-3f, "replayed CE %g equals the native %g: the replay did nothing", RANK,
                ref_ce[0], nce[0]);
        model_free(&nm);
    }
    if (RANK == 0)
        printf("test_dist_replay: backend %s, %d ranks: fsdp %d ep %d sp %d pp %d\n", dist_backend_name(),
               g_ctx->world_size, pc.fsdp_size, pc.expert_parallel_size, pc.ulysses_sequence_parallel_size,
               pc.pipeline_parallel_size);
    float ce[FX_K_STEPS];
    moe_model whole = {0};
    double rs[8];
    run_layout(&b, &init, &pc, &ref_rp, ce, &whole, rs);
    /* the record: every (token, MoE layer) of the batch written by exactly one rank, as one rank routes it */
    const double total = (double)b.n_tokens * 2 * TOP_K;
    CHECK_R(rs[0] == total && rs[1] == 0, "record: %.0f entries written (want %.0f), %.0f differ from one rank", RANK,
            rs[0], total, rs[1]);
    for (int i = 0; i < 6; i++)
        CHECK_R(rs[2 + i] == ref_rp.cnt[i], "agreement count %d: %.0f over the ranks, %.0f on one rank", RANK, i,
                rs[2 + i], ref_rp.cnt[i]);
    /* replayed routes are used: agreement with them is total where they exist, the native one is not */
    CHECK_R(ref_rp.cnt[2] == ref_rp.cnt[0] && ref_rp.cnt[3] == ref_rp.cnt[1] && ref_rp.cnt[4] < ref_rp.cnt[0],
            "one rank: agree %.0f/%.0f %.0f/%.0f, native %.0f", RANK, ref_rp.cnt[2], ref_rp.cnt[0], ref_rp.cnt[3],
            ref_rp.cnt[1], ref_rp.cnt[4]);
    CHECK_R(dist_same_on_all_ranks(g_ctx, fx_hash(ce, FX_K_STEPS)), "CE losses must be the same on every rank", RANK);
    const int one = g_ctx->world_size == 1;
    /* one process: the same micro-batches of MB_TOKENS need not be the reference's single one, so the bits
     * differ by fp32 summation order; the tolerances of test_dist_ep.c (losses 1e-6 + 1e-5 relative;
     * weights 5e-5 ≈ lr/60 + 1e-4 relative, what summation order moves an Adam step by) */
    t_close(one ? "one rank, micro-batches of 24: CE vs one micro-batch" : "layout CE losses vs one rank", ce, ref_ce,
            FX_K_STEPS, 1e-6f, 1e-5f);
    if (g_ctx->trainer_rank == 0) t_close("weights vs one rank", whole.params, ref.params, (long)ref.n_params, 5e-5f, 1e-4f);
    for (int s = 0; s < FX_N_SEQ; s++) free(ref_rp.rec[s]);
    model_free(&whole);
    model_free(&ref);
    model_free(&init);
    return dist_test_finish(g_ctx);
}
