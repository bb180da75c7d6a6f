/* Expert parallelism against one rank (src/parallel/ep.h). Every world rank is a trainer; the grid
 * has actor.expert_parallel_size = --ep (default: the world size) and is otherwise data parallel:
 * the D ranks split the global batch of tests/par_fixture.h by sequences, the EP groups split the
 * experts (E = 8, top-2, two MoE layers and a dense one, aux loss on with the global counts).
 * Runs, each K = 4 AdamW steps from the reference's initial weights (sliced):
 *   alltoallv              exact counts;
 *   alltoall (factor 4)    padded blocks, capacity large enough that nothing overflows;
 *   alltoall (factor 0.05) capacity 2 rows per (expert, source): overflow → the spill round;
 *   alltoall, small micro-batches: the shards pack into different numbers of micro-batches and the
 *                          ranks with fewer run idle passes (ep_idle_pass).
 * Checks: CE and global aux losses and the assembled weights (ep_gather_model) match the one-rank
 * reference within written fp32 tolerances; the three runs give the same bits (losses and weights);
 * the small capacity did spill and the large one did not; weights bit-identical on every rank; the
 * EP group's all-to-all byte counter equals the formula from the rows moved; a checkpoint saved from
 * the assembled model loads back into each rank's slice bit for bit; a slice refuses to run without
 * its ep_state and to be saved; ep_state_new refuses the per-expert-loop schedule.
 * parallel.h's entry points (run_par: par_state_init_cfg, par_finish_grads, par_adamw_step,
 * par_gather_full with moments on trainer rank 0, par_adamw_shard) give the direct run's bits; with
 * --fsdp F also EP × FSDP (FSDP over the ranks holding the same experts; F·ep divides the ranks;
 * more ranks = HSDP blocks) against one rank, with idle passes at small micro-batches.
 * Usage: test_dist_ep [--ep N] [--fsdp F]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "dist/dist.h"
#include "parallel/ep.h"
#include "parallel/parallel.h"
#include "par_fixture.h"
#include "dist_test.h"
#include "test.h"

#define E_EXPERTS 8
#define TOP_K 2

static dist_ctx *g_ctx;
static int g_ep;
#define RANK g_ctx->world_rank
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)

typedef struct {
    float ce[FX_K_STEPS], aux[FX_K_STEPS];
    moe_model full;        /* assembled trained model */
    ep_stats st;
    double a2a_bytes;      /* ep_comm all-to-all bytes this rank sent */
    double formula_bytes;  /* the same from ep_stats and the dispatcher's message sizes */
    size_t local_params, full_params;
    int cap, idle_passes;
} ep_run;

/* mb_tokens: train_accumulate's micro-batch limit; below FX_MAX_TOKENS the ranks' shares pack into
 * different numbers of micro-batches and the ranks with fewer run idle passes (ep_idle_pass). */
static void run_ep(const fx_batch *b, const moe_model *init, moe_dispatcher disp, double factor, int mb_tokens,
                   ep_run *out) {
    memset(out, 0, sizeof *out);
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = g_ep, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = 1, .dispatcher = disp, .alltoall_max_ep = 16,
                     .capacity_factor = factor};
    moe_config c = fx_config(E_EXPERTS, TOP_K, 2);
    par_grid g;
    MOERL_ASSERT(par_grid_init(&g, g_ctx, &pc, c.num_experts, c.num_attention_heads, c.num_key_value_heads,
                               c.num_hidden_layers) == MOERL_OK);
    ep_config_apply(&g, &c);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    MOERL_ASSERT(ep_slice_model(init, &m) == MOERL_OK);
    ep_state *ep = ep_state_new(&g, &c, FX_MAX_TOKENS);
    CHECK_R(ep != NULL, "ep_state_new: %s", RANK, moerl_last_error());
    if (!ep) exit(1);
    par_state ps = {.grid = &g, .ep = ep};
    par_bind_hooks(&ps);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, FX_MAX_TOKENS) == MOERL_OK);
    a.par = &ps; /* compute_router_counts runs the model too */
    adamw_state os;
    adamw_init(&os, &m, fx_opt());
    train_seq mine[FX_N_SEQ];
    const int n = fx_split(b, g.d, g.D, mine);
    const int E = c.num_experts;
    for (int k = 0; k < FX_K_STEPS; k++) {
        double counts[64] = {0}, sums[1 + 64] = {0};
        const int passes = count_microbatches(mine, n, mb_tokens), most = ep_max_passes(ep, passes);
        MOERL_ASSERT(compute_router_counts(&m, &a, mine, n, mb_tokens, counts) == MOERL_OK);
        for (int i = passes; i < most; i++) ep_idle_pass(ep, &m, 0);
        MOERL_ASSERT(dist_comm_allreduce_f64(g.stage_comm, counts, E) == MOERL_OK);
        fx_ce_ctx cc = {1.0f / (float)b->n_response, 0};
        train_step_opts o = {.max_tokens = mb_tokens, .temperature = 1.0f, .aux_coef = FX_AUX_COEF,
                             .total_tokens = b->n_tokens, .aux_counts = counts, .aux_psum_out = sums + 1, .par = &ps};
        train_step_out so;
        MOERL_ASSERT(train_accumulate(&m, &a, mine, n, &o, fx_ce, &cc, &so) == MOERL_OK);
        for (int i = passes; i < most; i++) ep_idle_pass(ep, &m, 1);
        out->idle_passes += most - passes;
        MOERL_ASSERT(ep_reduce_grads(ep, &m) == MOERL_OK);
        sums[0] = cc.ce;
        MOERL_ASSERT(dist_comm_allreduce_f64(g.stage_comm, sums, 1 + E) == MOERL_OK);
        out->ce[k] = (float)sums[0];
        out->aux[k] = fx_aux_value(counts, sums + 1, E, (int64_t)a.n_moe_layers * b->n_tokens);
        double gn;
        MOERL_ASSERT(ep_adamw_step(ep, &os, &m, os.cfg.lr, out->ce[k], &gn) == 1);
    }
    out->st = ep_get_stats(ep);
    out->cap = ep_capacity(ep);
    out->a2a_bytes = dist_comm_bytes(g.ep_comm, DIST_OP_ALLTOALL);
    const int El = E / g_ep;
    const double rest = (double)(g_ep - 1) * El; /* blocks sent to the other ranks per exchange */
    if (ep_dispatcher(ep) == MOE_DISPATCH_ALLTOALLV)
        out->formula_bytes = 4.0 * ((double)out->st.rows_sent * c.hidden_size + (double)out->st.size_exchanges * rest);
    else
        out->formula_bytes = 4.0 * ((double)out->st.exchanges * rest * (2.0 + (double)out->cap * c.hidden_size) +
                                    (double)out->st.spill_rows * c.hidden_size);
    out->local_params = m.n_params;
    memset(&out->full, 0, sizeof out->full);
    MOERL_ASSERT(ep_gather_model(ep, &m, &out->full) == MOERL_OK);
    out->full_params = out->full.n_params;

    if (disp == MOE_DISPATCH_ALLTOALLV && mb_tokens == FX_MAX_TOKENS) {
        /* checkpoint: the assembled model saved, loaded back into this rank's slice */
        char dir[256];
        snprintf(dir, sizeof dir, "/tmp/moerl_test_ep_%d_%d", (int)getpid(), RANK);
        CHECK_R(model_save_hf(&m, dir, 0, 0) == MOERL_ERR && strstr(moerl_last_error(), "ep_gather_model"),
                "saving a slice must be refused naming ep_gather_model: %s", RANK, moerl_last_error());
        CHECK_R(model_save_hf(&out->full, dir, 0, 4096) == MOERL_OK, "save: %s", RANK, moerl_last_error());
        moe_model back;
        MOERL_ASSERT(model_init(&back, &c) == MOERL_OK);
        CHECK_R(model_load_weights(&back, dir) == MOERL_OK, "load the slice: %s", RANK, moerl_last_error());
        CHECK_R(memcmp(back.params, m.params, m.n_params * sizeof(float)) == 0,
                "the slice loaded from the checkpoint differs from the trained slice", RANK);
        model_free(&back);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        MOERL_ASSERT(system(cmd) == 0);
        /* a slice without its ep_state refuses to run */
        model_acts a2;
        MOERL_ASSERT(model_acts_init(&a2, &m, 8) == MOERL_OK);
        const int cu[2] = {0, 3}, tk[3] = {1, 2, 3};
        CHECK_R(model_forward(&m, &a2, tk, cu, NULL, 1, 3) == MOERL_ERR && strstr(moerl_last_error(), "ep_state"),
                "forward of a slice without ep_state: %s", RANK, moerl_last_error());
        model_acts_free(&a2);
        moe_config bad = c;
        bad.exec.per_expert_loop = 1;
        ep_state *e2 = ep_state_new(&g, &bad, FX_MAX_TOKENS);
        CHECK_R(e2 == NULL && strstr(moerl_last_error(), "grouped_gemm"), "per-expert loop with EP: %s", RANK,
                moerl_last_error());
        ep_state_free(e2);
    }
    adamw_free(&os);
    model_acts_free(&a);
    ep_state_free(ep);
    model_free(&m);
    par_grid_free(&g);
}

/* The strategy-agnostic trainer entry points (parallel.h) with expert parallelism, as `moerl sft`
 * and the RL trainer ranks use them: par_state_init_cfg slices a whole model in place, the step is
 * par_max_passes / train_accumulate / par_finish_grads / par_adamw_step (no DDP reducer:
 * par_grads_self_reduced), par_gather_full assembles the whole model and moments on trainer rank 0
 * only. Outputs: the CE losses, the assembled weights (*whole, rank 0 only) and checks of the
 * moments' round trip (par_adamw_shard of the gathered moments gives back every rank's own). */
static void run_par(const fx_batch *b, const moe_model *init, int fsdp, int mb_tokens, float *ce, moe_model *whole,
                    long *idle) {
    const moe_config c = fx_config(E_EXPERTS, TOP_K, 2);
    par_config pc = {.fsdp_size = fsdp, .expert_parallel_size = g_ep, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = 1, .dispatcher = MOE_DISPATCH_ALLTOALLV, .alltoall_max_ep = 16,
                     .capacity_factor = 1.25, .max_tokens = FX_MAX_TOKENS};
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    memcpy(m.params, init->params, init->n_params * sizeof(float));
    par_state ps;
    CHECK_R(par_state_init_cfg(&ps, g_ctx, &pc, &m) == MOERL_OK && ps.ep && (fsdp > 1) == (ps.fsdp != NULL),
            "par_state_init_cfg: %s", RANK, moerl_last_error());
    CHECK_R(par_grads_self_reduced(&ps) && par_whole_params(&ps, &m) == init->n_params && m.n_params < init->n_params,
            "EP: par_grads_self_reduced %d, whole params %zu (want %zu), local %zu", RANK, par_grads_self_reduced(&ps),
            par_whole_params(&ps, &m), init->n_params, m.n_params);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, FX_MAX_TOKENS) == MOERL_OK);
    a.par = &ps;
    adamw_state os;
    par_adamw_init(&ps, &m, &os, fx_opt());
    train_seq mine[FX_N_SEQ];
    int idx, cnt;
    par_data_shard(&ps, &idx, &cnt);
    const int n = fx_split(b, idx, cnt, mine), E = c.num_experts;
    for (int k = 0; k < FX_K_STEPS; k++) {
        double counts[64] = {0}, sums[1 + 64] = {0};
        const int passes = count_microbatches(mine, n, mb_tokens), most = par_max_passes(&ps, passes);
        MOERL_ASSERT(compute_router_counts(&m, &a, mine, n, mb_tokens, counts) == MOERL_OK);
        MOERL_ASSERT(par_pad_passes(&ps, passes, most, 0) == MOERL_OK);
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, E) == MOERL_OK);
        fx_ce_ctx cc = {1.0f / (float)b->n_response, 0};
        train_step_opts o = {.max_tokens = mb_tokens, .temperature = 1.0f, .aux_coef = FX_AUX_COEF,
                             .total_tokens = b->n_tokens, .aux_counts = counts, .aux_psum_out = sums + 1, .par = &ps};
        train_step_out so;
        par_zero_grad(&ps, &m);
        MOERL_ASSERT(train_accumulate(&m, &a, mine, n, &o, fx_ce, &cc, &so) == MOERL_OK);
        MOERL_ASSERT(par_finish_grads(&ps, passes, most) == MOERL_OK);
        sums[0] = cc.ce;
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, sums, 1) == MOERL_OK);
        ce[k] = (float)sums[0];
        double gn;
        MOERL_ASSERT(par_adamw_step(&ps, &m, &os, os.cfg.lr, ce[k], &gn) == 1);
    }
    /* the whole model and moments on trainer rank 0 only */
    const int keep = g_ctx->trainer_rank == 0;
    adamw_state mo;
    const moe_model *full = par_gather_full(&ps, &m, keep, &os, &mo);
    CHECK_R(keep ? full != NULL && full->n_params == init->n_params && mo.n == init->n_params : full == NULL,
            "par_gather_full (keep %d): %s", RANK, keep, full ? "wrong size" : moerl_last_error());
    /* every rank's own moments come back from the keeper's whole ones: broadcast them (rank 0's
     * whole vectors, summed over the trainers with zeros elsewhere) and slice */
    const size_t W = init->n_params;
    float *wm = xcalloc(2 * W, sizeof(float));
    if (keep && full) {
        memcpy(wm, mo.m, W * sizeof(float));
        memcpy(wm + W, mo.v, W * sizeof(float));
        MOERL_ASSERT(model_init(whole, &c) == MOERL_OK);
        memcpy(whole->params, full->params, W * sizeof(float));
    }
    double *dm = xmalloc(2 * W * sizeof(double));
    for (size_t i = 0; i < 2 * W; i++) dm[i] = wm[i];
    MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, dm, (int)(2 * W)) == MOERL_OK);
    for (size_t i = 0; i < 2 * W; i++) wm[i] = (float)dm[i]; /* exact: one non-zero term per element */
    free(dm);
    adamw_state back = os;
    back.n = W;
    back.m = xalloc_aligned(W * sizeof(float));
    back.v = xalloc_aligned(W * sizeof(float));
    memcpy(back.m, wm, W * sizeof(float));
    memcpy(back.v, wm + W, W * sizeof(float));
    par_adamw_shard(&ps, &m, &back);
    CHECK_R(back.n == os.n && back.step == os.step && memcmp(back.m, os.m, os.n * sizeof(float)) == 0 &&
                memcmp(back.v, os.v, os.n * sizeof(float)) == 0,
            "par_adamw_shard of the gathered moments must give back this rank's own bit for bit", RANK);
    adamw_free(&back);
    free(wm);
    par_release_full(&ps, &m, full, &os, &mo);
    *idle = ep_get_stats(ps.ep).idle_passes;
    adamw_free(&os);
    model_acts_free(&a);
    par_state_free(&ps);
    CHECK_R(m.n_params == init->n_params, "par_state_free must give back the whole model", RANK);
    model_free(&m);
}

/* One process (the local backend, run by tests/run.sh): what needs no exchange — slices of a
 * hand-made expert split: tensor shapes, slicing, the checkpoint round trip of every slice, the
 * refusals; ep_state_new refuses a grid without expert parallelism. */
static void local_checks(void) {
    const moe_config c = fx_config(E_EXPERTS, TOP_K, 2);
    moe_model full;
    MOERL_ASSERT(model_init(&full, &c) == MOERL_OK);
    model_init_random(&full, 4242);
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/moerl_test_ep_local_%d", (int)getpid());
    CHECK(model_save_hf(&full, dir, 0, 4096) == MOERL_OK, "save: %s", moerl_last_error());
    for (int ep = 2; ep <= 4; ep *= 2)
        for (int r = 0; r < ep; r++) {
            moe_config lc = c;
            lc.exec.ep_size = ep;
            lc.exec.ep_rank = r;
            moe_model s, back;
            MOERL_ASSERT(model_init(&s, &lc) == MOERL_OK && model_init(&back, &lc) == MOERL_OK);
            const tensor_info *t = model_find_tensor(&s, "model.layers.0.mlp.experts.gate_up");
            CHECK(t && t->shape[0] == E_EXPERTS / ep, "ep %d: expert tensor holds %lld experts", ep,
                  t ? (long long)t->shape[0] : -1LL);
            CHECK(ep_slice_model(&full, &s) == MOERL_OK, "slice: %s", moerl_last_error());
            const tensor_info *tf = model_find_tensor(&full, "model.layers.0.mlp.experts.gate_up");
            CHECK(memcmp(s.params + t->offset, full.params + tf->offset + (size_t)t->numel * r,
                         (size_t)t->numel * sizeof(float)) == 0, "ep %d rank %d: slice rows", ep, r);
            CHECK(model_load_weights(&back, dir) == MOERL_OK, "load slice ep %d rank %d: %s", ep, r,
                  moerl_last_error());
            CHECK(memcmp(back.params, s.params, s.n_params * sizeof(float)) == 0,
                  "ep %d rank %d: the slice loaded from the whole checkpoint differs", ep, r);
            CHECK(model_save_hf(&s, dir, 0, 0) == MOERL_ERR && strstr(moerl_last_error(), "ep_gather_model"),
                  "saving a slice: %s", moerl_last_error());
            model_acts a;
            MOERL_ASSERT(model_acts_init(&a, &s, 8) == MOERL_OK);
            const int cu[2] = {0, 3}, tk[3] = {1, 2, 3};
            CHECK(model_forward(&s, &a, tk, cu, NULL, 1, 3) == MOERL_ERR && strstr(moerl_last_error(), "ep_state"),
                  "forward of a slice without ep_state: %s", moerl_last_error());
            model_acts_free(&a);
            model_free(&s);
            model_free(&back);
        }
    moe_config bad = c;
    bad.exec.ep_size = 3; /* does not divide 8 experts */
    CHECK(moe_config_validate(&bad) == MOERL_ERR && strstr(moerl_last_error(), "expert_parallel_size"),
          "ep 3 of 8 experts: %s", moerl_last_error());
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = 1, .alltoall_max_ep = 16, .capacity_factor = 1.25};
    par_grid g;
    MOERL_ASSERT(par_grid_init(&g, g_ctx, &pc, c.num_experts, 4, 2, c.num_hidden_layers) == MOERL_OK);
    CHECK(ep_state_new(&g, &c, 64) == NULL && strstr(moerl_last_error(), "expert_parallel_size"),
          "ep_state_new at ep 1: %s", moerl_last_error());
    par_grid_free(&g);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    MOERL_ASSERT(system(cmd) == 0);
    model_free(&full);
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_ep: %s\n", moerl_last_error());
        return 1;
    }
    if (g_ctx->world_size == 1) {
        printf("test_dist_ep: one process (%s backend): slices and checkpoints only; the exchanges run under "
               "mpirun (tests/e2e_mpi.sh)\n", dist_backend_name());
        local_checks();
        dist_finalize(g_ctx);
        TEST_MAIN_END();
    }
    g_ep = g_ctx->world_size;
    int fsdp = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ep")) g_ep = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--fsdp")) fsdp = atoi(argv[i + 1]);
    }
    if (fsdp < 1 || g_ctx->world_size % (g_ep * fsdp)) {
        fprintf(stderr, "test_dist_ep: --fsdp %d × --ep %d must divide the %d ranks\n", fsdp, g_ep, g_ctx->world_size);
        dist_finalize(g_ctx);
        return 1;
    }
    if (g_ep < 2 || g_ctx->world_size % g_ep) {
        fprintf(stderr, "test_dist_ep: --ep %d must be ≥ 2 and divide the %d ranks\n", g_ep, g_ctx->world_size);
        dist_finalize(g_ctx);
        return 1;
    }
    fx_batch b;
    fx_make_batch(&b);
    const moe_config c = fx_config(E_EXPERTS, TOP_K, 2);
    moe_model init, ref;
    MOERL_ASSERT(model_init(&init, &c) == MOERL_OK);
    model_init_random(&init, 4242);
    float ref_ce[FX_K_STEPS], ref_aux[FX_K_STEPS];
    fx_reference(&c, &b, ref_ce, ref_aux, &ref);
    if (RANK == 0)
        printf("test_dist_ep: backend %s, %d ranks, ep %d (data-parallel groups of %d), %d tokens\n",
               dist_backend_name(), g_ctx->world_size, g_ep, g_ctx->world_size / g_ep, b.n_tokens);

    { /* par_state_init's form: attach slices the whole model in place, detach assembles it back */
        par_config pc = {.fsdp_size = 1, .expert_parallel_size = g_ep, .ulysses_sequence_parallel_size = 1,
                         .pipeline_parallel_size = 1, .alltoall_max_ep = 16, .capacity_factor = 1.25};
        par_grid g;
        MOERL_ASSERT(par_grid_init(&g, g_ctx, &pc, c.num_experts, 4, 2, c.num_hidden_layers) == MOERL_OK);
        moe_model rt;
        MOERL_ASSERT(model_init(&rt, &c) == MOERL_OK);
        memcpy(rt.params, init.params, init.n_params * sizeof(float));
        ep_state *e = ep_state_attach(&g, &rt, FX_MAX_TOKENS);
        CHECK_R(e && rt.cfg.exec.ep_size == g_ep && rt.n_params < init.n_params, "ep_state_attach: %s", RANK,
                e ? "not sliced" : moerl_last_error());
        CHECK_R(ep_state_detach(e) == MOERL_OK && rt.n_params == init.n_params && rt.grads &&
                    memcmp(rt.params, init.params, init.n_params * sizeof(float)) == 0,
                "ep_state_detach must give back the whole model bit for bit", RANK);
        model_free(&rt);
        par_grid_free(&g);
    }
    ep_run v, a4, a0, u;
    run_ep(&b, &init, MOE_DISPATCH_ALLTOALLV, 1.0, FX_MAX_TOKENS, &v);
    run_ep(&b, &init, MOE_DISPATCH_ALLTOALL, 4.0, FX_MAX_TOKENS, &a4);
    run_ep(&b, &init, MOE_DISPATCH_ALLTOALL, 0.05, FX_MAX_TOKENS, &a0);
    /* micro-batch limits under which the shards of tests/par_fixture.h pack into different numbers of
     * micro-batches (2 shards: 4 and 3; 4 shards: 2, 1, 2, 2), so that idle passes run */
    const int mb_uneven = g_ctx->world_size == 2 ? 16 : 18;
    run_ep(&b, &init, MOE_DISPATCH_ALLTOALL, 1.25, mb_uneven, &u);
    const size_t n = ref.n_params;
    MOERL_ASSERT(v.full_params == n);
    { /* parallel.h's entry points: the same bits as the direct run above (same dispatcher and sums) */
        float pce[FX_K_STEPS];
        moe_model pw = {0};
        long idle;
        run_par(&b, &init, 1, FX_MAX_TOKENS, pce, &pw, &idle);
        CHECK_R(memcmp(pce, v.ce, sizeof pce) == 0, "par_* entry points: CE losses differ from the direct EP run",
                RANK);
        if (RANK == 0)
            CHECK_R(pw.params && memcmp(pw.params, v.full.params, n * sizeof(float)) == 0,
                    "par_gather_full's whole model differs from ep_gather_model's after the same steps", RANK);
        model_free(&pw);
    }
    if (fsdp > 1) { /* EP × FSDP through the same entry points (grid.h: FSDP over the ranks holding the same
                     * experts), with micro-batches small enough that some ranks run idle passes */
        const int mbs[2] = {FX_MAX_TOKENS, g_ctx->world_size == 4 ? 18 : 16};
        for (int r = 0; r < 2; r++) {
            float pce[FX_K_STEPS];
            moe_model pw = {0};
            long idle = 0;
            run_par(&b, &init, fsdp, mbs[r], pce, &pw, &idle);
            /* the tolerances of the EP run above: FSDP's reduce-scatter adds one more fp32 reordering of
             * the same sums */
            char what[96];
            snprintf(what, sizeof what, "EP x FSDP %d (micro-batch %d) CE vs one rank", fsdp, mbs[r]);
            t_close(what, pce, ref_ce, FX_K_STEPS, 1e-6f, 1e-5f);
            if (RANK == 0) {
                snprintf(what, sizeof what, "EP x FSDP %d (micro-batch %d) weights vs one rank", fsdp, mbs[r]);
                t_close(what, pw.params, ref.params, (long)n, 5e-5f, 1e-4f);
            }
            double id = (double)idle;
            MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_WORLD, &id, 1) == MOERL_OK);
            if (r == 1 && g_ctx->world_size <= 4) /* 8 ranks: one sequence each, never uneven */
                CHECK_R(id > 0, "EP x FSDP: micro-batch %d gave every rank the same count: idle passes untested", RANK,
                        mbs[r]);
            if (RANK == 0) printf("  EP x FSDP %d, micro-batch %d: %.0f idle passes over the ranks\n", fsdp, mbs[r], id);
            model_free(&pw);
        }
    }
    /* losses: the ranks' partial sums in another fp32 order, at weights that drift by the rounding of
     * the earlier steps (as tests/test_dist_dp.c): 1e-6 absolute + 1e-5 relative */
    t_close("EP CE losses vs one rank", v.ce, ref_ce, FX_K_STEPS, 1e-6f, 1e-5f);
    t_close("EP aux losses vs one rank", v.aux, ref_aux, FX_K_STEPS, 1e-6f, 1e-5f);
    /* weights: the expert GEMMs see each expert's rows in another order (source rank by source
     * rank) and the gradient sums run over ranks, so gradients differ by fp32 summation order only;
     * Adam passes that on to elements whose gradient is mostly rounding noise. Same bound and
     * reasoning as tests/test_dist_dp.c: atol 5e-5 (≈ lr/60) + rtol 1e-4; a missing or wrong
     * exchange or reduction moves weights by ~lr per step */
    t_close("EP weights vs one rank", v.full.params, ref.params, (long)n, 5e-5f, 1e-4f);
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)v.full.params[i] - ref.params[i]));
    /* small micro-batches: the global aux makes the split exact, so the same tolerances */
    t_close("EP (small micro-batches, idle passes) CE vs one rank", u.ce, ref_ce, FX_K_STEPS, 1e-6f, 1e-5f);
    t_close("EP (small micro-batches, idle passes) weights vs one rank", u.full.params, ref.params, (long)n, 5e-5f,
            1e-4f);
    double idle = u.idle_passes;
    MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_WORLD, &idle, 1) == MOERL_OK);
    if (g_ctx->world_size <= 4) /* 8 ranks: one sequence each, the counts are never uneven */
        CHECK_R(idle > 0, "the small micro-batches gave every rank the same count: the idle passes went untested",
                RANK);
    CHECK_R(memcmp(v.ce, a4.ce, sizeof v.ce) == 0 && memcmp(v.aux, a4.aux, sizeof v.aux) == 0 &&
                memcmp(v.full.params, a4.full.params, n * sizeof(float)) == 0,
            "alltoall (no overflow) and alltoallv must give the same bits", RANK);
    CHECK_R(memcmp(v.ce, a0.ce, sizeof v.ce) == 0 && memcmp(v.full.params, a0.full.params, n * sizeof(float)) == 0,
            "alltoall with spills and alltoallv must give the same bits", RANK);
    CHECK_R(a4.st.spill_rounds == 0, "factor 4 (capacity %d) spilled %ld times", RANK, a4.cap, a4.st.spill_rounds);
    CHECK_R(a0.st.spill_rounds > 0 && a0.cap == 2, "factor 0.05 (capacity %d) never spilled", RANK, a0.cap);
    CHECK_R(v.st.spill_rounds == 0 && v.st.size_exchanges > 0, "alltoallv: %ld spills, %ld count exchanges", RANK,
            v.st.spill_rounds, v.st.size_exchanges);
    const ep_run *runs[3] = {&v, &a4, &a0};
    const char *names[3] = {"alltoallv", "alltoall f=4", "alltoall f=0.05"};
    for (int r = 0; r < 3; r++)
        CHECK_R(runs[r]->a2a_bytes == runs[r]->formula_bytes && runs[r]->a2a_bytes > 0,
                "%s: all-to-all bytes %.0f, formula %.0f", RANK, names[r], runs[r]->a2a_bytes,
                runs[r]->formula_bytes);
    CHECK_R(dist_same_on_all_ranks(g_ctx, fx_hash(v.full.params, n)), "assembled weights must be bit-identical on every rank",
            RANK);
    CHECK_R(v.local_params < v.full_params, "a slice holds %zu floats, the whole model %zu", RANK, v.local_params,
            v.full_params);
    for (int r = 0; r < 3; r++)
        printf("  rank %d %-16s capacity %3d  exchanges %4ld  rows sent %6ld  spills %3ld (%ld rows)  "
               "all-to-all %8.0f B (formula %8.0f)  %.2f ms in exchanges\n",
               RANK, names[r], runs[r]->cap, runs[r]->st.exchanges, runs[r]->st.rows_sent, runs[r]->st.spill_rounds,
               runs[r]->st.spill_rows, runs[r]->a2a_bytes, runs[r]->formula_bytes, 1e3 * runs[r]->st.seconds);
    if (RANK == 0) {
        for (int k = 0; k < FX_K_STEPS; k++)
            printf("  step %d  CE EP %.7f one rank %.7f  aux EP %.7f one rank %.7f\n", k, v.ce[k], ref_ce[k], v.aux[k],
                   ref_aux[k]);
        printf("  max |w_EP − w_one rank| = %.3g; params per rank %zu of %zu\n", worst, v.local_params,
               v.full_params);
    }
    model_free(&v.full);
    model_free(&a4.full);
    model_free(&a0.full);
    model_free(&u.full);
    model_free(&init);
    model_free(&ref);
    return dist_test_finish(g_ctx);
}
