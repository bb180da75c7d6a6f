/* Activation recompute under model parallelism (model.enable_gradient_checkpointing,
 * actor.recompute_granularity; docs/parallelism.md "Activation recompute"): the layout given
 * (--fsdp F --ep E --sp S --pp P) trains K AdamW steps through parallel.h's entry points (as
 * tests/test_dist_replay.c) without recompute, with full and with selective recompute — each with
 * native routing and with replayed routes — and the recompute runs' CE losses and final weights are
 * BIT-identical to the same layout's run without recompute (the same collectives in the same order
 * sum the same bits: recompute changes only which buffers the arena keeps). FSDP: the all-gather
 * and reduce-scatter bytes are the same too (a layer's recompute runs inside the backward region
 * that gathers it anyway: no extra gathers). EP: ranks with fewer micro-batches run idle passes
 * that mirror the recomputed forward's exchanges (ep_idle_pass). Pipeline: each in-flight slot's
 * arena shrinks to plan_acts_bytes' recompute rows. Tensor parallelism (--tp T, actor.megatron.
 * tensor_model_parallel_size; with --etp 1 the experts whole, --tpsp Megatron sequence parallelism): the
 * recomputed forward repeats the layer's TP collectives on the same rows, and the TP group's bytes grow by
 * exactly tp_extra's count (full: o_proj's all-reduce — SP: its reduce-scatter and the ln1 / ln2 all-gathers;
 * selective: SP's ln2 all-gather; TP × EP: the expert rows' all-gather, both granularities; the MLP's output
 * is not needed again, so its sum is not repeated). Usage: test_dist_recompute [--fsdp F] [--ep E] [--sp S]
 * [--pp P] [--tp T [--etp 1] [--tpsp]] [--mb TOKENS]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"
#include "parallel/ep.h"
#include "parallel/grid.h"
#include "parallel/fsdp.h"
#include "parallel/ulysses.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "par_fixture.h"
#include "dist_test.h"
#include "test.h"

#define E_EXPERTS 8
#define TOP_K 2
#define RANK g_ctx->world_rank
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)
static int MB_TOKENS = 24; /* --mb: ≥ the longest sequence (14); several micro-batches per shard (1F1B); 14 gives
                              the EP ranks different micro-batch counts, so one runs idle passes */

static dist_ctx *g_ctx;

static int ps_ep(const par_config *pc) { return pc->expert_parallel_size > 1; }

/* Σ over this rank's training passes of N (tokens) and of ⌈N/P⌉ (Megatron SP's slice rows): the micro-batches
 * pack_microbatches makes of the rank's sequences, every TP rank of a group the same. */
static void pass_tokens(const train_seq *mine, int n, int P, double *tok, double *tok_ceil) {
    int mb[FX_N_SEQ + 1];
    const int n_mb = pack_microbatches(mine, n, MB_TOKENS, mb);
    for (int i = 0; i < n_mb; i++) {
        int N = 0;
        for (int j = mb[i]; j < mb[i + 1]; j++) N += mine[j].len;
        *tok += N;
        *tok_ceil += (N + P - 1) / P;
    }
}

/* The TP bytes (all-reduce, all-gather, reduce-scatter: mpi_dist.c's per-rank counts) recompute rc adds over
 * passes of tok / tok_ceil tokens (pass_tokens) through n_layers decoder layers, n_moe of them MoE, tp P. */
static void tp_extra(const par_config *pc, int rc, double tok, double tok_ceil, double n_layers, double n_moe,
                     int H, int K, double out[3]) {
    const int P = pc->tensor_model_parallel_size, sp = pc->sequence_parallel, full = rc == MODEL_RECOMPUTE_FULL;
    const double row = (P - 1.0) * tok_ceil * H * 4; /* one SP row collective over every pass */
    out[0] = full && !sp ? n_layers * 2.0 * (P - 1) / P * tok * H * 4 : 0; /* o_proj's all-reduce */
    out[1] = sp ? (full ? 2 : 1) * n_layers * row : 0;                    /* ln1 (full), ln2 gathered */
    if (pc->expert_parallel_size > 1) out[1] += n_moe * (P - 1.0) * tok_ceil * K * H * 4; /* expert rows */
    out[2] = full && sp ? n_layers * row : 0; /* o_proj's reduce-scatter */
}
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

/* K steps of the layout at recompute rc: CE losses, the whole model on trainer rank 0 (*whole),
 * the FSDP traffic (all-gather, reduce-scatter bytes; 0 without FSDP). */
static void run_layout(const fx_batch *b, const moe_model *init, const par_config *pc, int rc, float *ce,
                       moe_model *whole, double *traffic) { /* traffic[7..9]: TP bytes, [10..11]: pass_tokens */
    moe_config c = fx_config(E_EXPERTS, TOP_K, 2);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    memcpy(m.params, init->params, init->n_params * sizeof(float));
    m.cfg.exec.recompute = rc; /* before par_state_init_cfg: EP slices copy the config */
    par_state ps;
    CHECK_R(par_state_init_cfg(&ps, g_ctx, pc, &m) == MOERL_OK, "par_state_init_cfg: %s", RANK, moerl_last_error());
    CHECK_R(m.cfg.exec.recompute == rc, "the runtime kept exec.recompute %d (got %d)", RANK, rc, m.cfg.exec.recompute);
    model_acts a;
    MOERL_ASSERT(model_acts_init_rows(&a, &m, par_acts_rows(&ps, MB_TOKENS), MB_TOKENS) == MOERL_OK);
    a.par = &ps;
    adamw_state os;
    par_adamw_init(&ps, &m, &os, fx_opt());
    train_seq mine[FX_N_SEQ];
    int idx, cnt;
    par_data_shard(&ps, &idx, &cnt);
    const int n = fx_split(b, idx, cnt, mine), E = c.num_experts;
    dist_comm *tpc = ps.grid && ps.grid->tp > 1 ? ps.grid->tp_comm : NULL;
    if (tpc) dist_comm_reset_bytes(tpc);
    for (int k = 0; k < FX_K_STEPS; k++) {
        double counts[64] = {0}, sums[1 + 64] = {0};
        const int passes = count_microbatches(mine, n, MB_TOKENS), most = par_max_passes(&ps, passes);
        traffic[2] += most - passes; /* idle passes this rank runs */
        traffic[3] += most;          /* training passes (model_backward or an idle pass) this rank runs */
        MOERL_ASSERT(compute_router_counts(&m, &a, mine, n, MB_TOKENS, counts) == MOERL_OK);
        MOERL_ASSERT(par_pad_passes(&ps, passes, most, 0) == MOERL_OK);
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, E) == MOERL_OK);
        for (int e = 0; e < E && ps.grid && ps.grid->pp > 1; e++) counts[e] /= ps.grid->pp; /* as the trainer */
        if (tpc) pass_tokens(mine, n, ps.grid->tp, &traffic[10], &traffic[11]);
        fx_ce_ctx cc = {1.0f / (float)b->n_response, 0};
        train_step_opts o = {.max_tokens = MB_TOKENS, .temperature = 1.0f, .aux_coef = FX_AUX_COEF,
                             .total_tokens = b->n_tokens, .aux_counts = counts, .aux_psum_out = sums + 1, .par = &ps};
        train_step_out so;
        par_zero_grad(&ps, &m);
        MOERL_ASSERT(train_accumulate(&m, &a, mine, n, &o, fx_ce, &cc, &so) == MOERL_OK);
        if (ps.pp) traffic[3] += pp_last_stats(ps.pp)->microbatches - most; /* the pipeline's own (agreed) count */
        MOERL_ASSERT(par_finish_grads(&ps, passes, most) == MOERL_OK);
        if (ps.grid && !par_grads_self_reduced(&ps)) /* Ulysses SP: the caller's reducer sums over stage_comm */
            MOERL_ASSERT(dist_comm_allreduce_f32(ps.grid->stage_comm, m.grads, m.n_params) == MOERL_OK);
        sums[0] = cc.ce;
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, sums, 1) == MOERL_OK);
        ce[k] = (float)sums[0];
        double gn;
        MOERL_ASSERT(par_adamw_step(&ps, &m, &os, os.cfg.lr, ce[k], &gn) == 1);
    }
    traffic[0] = traffic[1] = 0;
    const dist_op tp_ops[3] = {DIST_OP_ALLREDUCE, DIST_OP_ALLGATHER, DIST_OP_REDUCE_SCATTER};
    for (int i = 0; i < 3; i++) traffic[7 + i] = tpc ? dist_comm_bytes(tpc, tp_ops[i]) : 0;
    MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, traffic + 2, 1) == MOERL_OK);
    traffic[4] = ps.ep ? (double)ep_get_stats(ps.ep).exchanges : 0;
    traffic[5] = ps.sp ? (double)sp_get_stats(ps.sp).exchanges : 0;
    traffic[6] = traffic[12] = 0; /* the MoE layers / all layers this rank's passes run: its stage's under a pipeline */
    for (int k = 0; k < (ps.pp ? pp_chunks(ps.pp) : 1); k++) {
        int lo = 0, hi = c.num_hidden_layers;
        if (ps.pp) pp_chunk_layers(ps.pp, k, &lo, &hi);
        for (int l = lo; l < hi; l++) traffic[6] += moe_config_layer_is_moe(&c, l);
        traffic[12] += hi - lo;
    }
    if (ps.fsdp) {
        fsdp_stats st;
        fsdp_get_stats(ps.fsdp, &st);
        traffic[0] = st.allgather_bytes;
        traffic[1] = st.reduce_scatter_bytes;
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
        fprintf(stderr, "test_dist_recompute: %s\n", moerl_last_error());
        return 1;
    }
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = 1, .dispatcher = MOE_DISPATCH_AUTO, .alltoall_max_ep = 16,
                     .capacity_factor = 1.25, .max_tokens = MB_TOKENS, .tensor_model_parallel_size = 1};
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--tpsp")) { /* a flag: no value */
            pc.sequence_parallel = 1;
            i--;
            continue;
        }
        const int v = i + 1 < argc ? atoi(argv[i + 1]) : -1;
        if (v < 0) argv[i] = "?"; /* a value missing: the usage below */
        if (!strcmp(argv[i], "--fsdp")) pc.fsdp_size = v;
        else if (!strcmp(argv[i], "--ep")) pc.expert_parallel_size = v;
        else if (!strcmp(argv[i], "--sp")) pc.ulysses_sequence_parallel_size = v;
        else if (!strcmp(argv[i], "--pp")) pc.pipeline_parallel_size = v;
        else if (!strcmp(argv[i], "--tp")) pc.tensor_model_parallel_size = v;
        else if (!strcmp(argv[i], "--etp")) pc.expert_tensor_parallel_size = v;
        else if (!strcmp(argv[i], "--mb") && v >= 14) pc.max_tokens = MB_TOKENS = v;
        else {
            fprintf(stderr, "usage: test_dist_recompute [--fsdp F] [--ep E] [--sp S] [--pp P] [--tp T [--etp 1] "
                            "[--tpsp]] [--mb TOKENS ≥ 14]\n");
            return 1;
        }
    }
    if (RANK == 0)
        printf("test_dist_recompute: backend %s, %d ranks: fsdp %d ep %d sp %d pp %d tp %d%s\n", dist_backend_name(),
               g_ctx->world_size, pc.fsdp_size, pc.expert_parallel_size, pc.ulysses_sequence_parallel_size,
               pc.pipeline_parallel_size, pc.tensor_model_parallel_size,
               pc.sequence_parallel ? " (Megatron SP)" : "");
    (void)fx_hash; /* par_fixture.h's helpers this test does not need */
    (void)fx_reference;
    const moe_config c = fx_config(E_EXPERTS, TOP_K, 2);
    moe_model init;
    MOERL_ASSERT(model_init(&init, &c) == MOERL_OK);
    model_init_random(&init, 4242);
    const char *gran[] = {"none", "full", "selective"};
    for (int replay = 0; replay < 2; replay++) {
        fx_batch b;
        fx_make_batch(&b);
        if (replay) attach_routes(&b);
        float ce[3][FX_K_STEPS];
        moe_model whole[3];
        double tr[3][13] = {{0}};
        memset(whole, 0, sizeof whole);
        for (int rc = 0; rc < 3; rc++) run_layout(&b, &init, &pc, rc, ce[rc], &whole[rc], tr[rc]);
        for (int rc = 1; rc < 3; rc++) {
            const char *r = replay ? "replayed routes" : "native routes";
            CHECK_R(!memcmp(ce[rc], ce[0], sizeof ce[0]), "%s recompute, %s: CE losses %.9g.. vs %.9g.. without", RANK,
                    gran[rc], r, (double)ce[rc][0], (double)ce[0][0]);
            CHECK_R(tr[rc][0] == tr[0][0] && tr[rc][1] == tr[0][1],
                    "%s recompute, %s: FSDP all-gather %.0f B / reduce-scatter %.0f B vs %.0f / %.0f without", RANK,
                    gran[rc], r, tr[rc][0], tr[rc][1], tr[0][0], tr[0][1]);
            if (g_ctx->trainer_rank == 0)
                CHECK_R(!memcmp(whole[rc].params, whole[0].params, init.n_params * sizeof(float)),
                        "%s recompute, %s: the weights after %d steps differ from the run without", RANK, gran[rc], r,
                        FX_K_STEPS);
        }
        CHECK_R(fabsf(ce[0][FX_K_STEPS - 1] - ce[0][0]) > 0, "the run trained nothing (CE constant)", RANK);
        /* the exchanges recompute adds (what moerl plan counts): EP, the MoE forward's dispatch + combine again
         * before each MoE layer's backward (both granularities); Ulysses, the attention's two all-to-alls again
         * (full only). Per training pass of this rank (tr[.][3], local: traffic[2] was summed, [3] was not). */
        const double passes = tr[0][3], n_moe = tr[0][6], n_layers = c.num_hidden_layers;
        CHECK_R(tr[1][4] - tr[0][4] == (ps_ep(&pc) ? 2 * n_moe * passes : 0) && tr[2][4] == tr[1][4],
                "EP exchanges: none %.0f, full %.0f, selective %.0f over %.0f training passes", RANK, tr[0][4],
                tr[1][4], tr[2][4], passes);
        CHECK_R(tr[1][5] - tr[0][5] == (pc.ulysses_sequence_parallel_size > 1 ? 2 * n_layers * passes : 0) &&
                    tr[2][5] == tr[0][5],
                "SP all-to-alls: none %.0f, full %.0f, selective %.0f over %.0f training passes", RANK, tr[0][5],
                tr[1][5], tr[2][5], passes);
        for (int rc = 1; rc < 3 && pc.tensor_model_parallel_size > 1; rc++) {
            double want[3];
            tp_extra(&pc, rc, tr[0][10], tr[0][11], tr[0][12], n_moe, c.hidden_size, TOP_K, want);
            const char *op[3] = {"all-reduce", "all-gather", "reduce-scatter"};
            for (int i = 0; i < 3; i++) /* integers summed in doubles (2(P−1)/P = 1 at P = 2): exact */
                CHECK_R(tr[rc][7 + i] - tr[0][7 + i] == want[i],
                        "%s recompute: TP %s %.0f B vs %.0f B without (+%.0f, expected +%.0f)", RANK, gran[rc], op[i],
                        tr[rc][7 + i], tr[0][7 + i], tr[rc][7 + i] - tr[0][7 + i], want[i]);
            if (RANK == 0 && !replay)
                printf("tp %d, %s recompute: TP bytes +%.0f all-reduce, +%.0f all-gather, +%.0f reduce-scatter\n",
                       pc.tensor_model_parallel_size, gran[rc], want[0], want[1], want[2]);
        }
        if (RANK == 0 && !replay) printf("idle passes over the ranks: %.0f per run\n", tr[0][2]);
        if (pc.expert_parallel_size == g_ctx->world_size && MB_TOKENS == 14) /* EP alone: uneven shards */
            CHECK_R(tr[0][2] > 0, "--mb 14 under EP: no rank ran an idle pass (the case this run is for)", RANK);
        for (int rc = 0; rc < 3; rc++) model_free(&whole[rc]);
    }
    model_free(&init);
    return dist_test_finish(g_ctx);
}
