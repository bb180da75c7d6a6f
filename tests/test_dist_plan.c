/* moerl plan against moerl's own counters, under mpirun (run by tests/e2e_plan.sh):
 *   test_dist_plan [key=value ...]   the layout keys of `moerl sft` / `moerl rl`
 *                                    (actor.fsdp_config.fsdp_size, actor.ulysses_sequence_parallel_size,
 *                                    actor.pipeline_parallel_size, actor.expert_parallel_size,
 *                                    actor.moe.dispatcher, actor.moe.capacity_factor), plus
 *                                    model.tie_word_embeddings (the test model's, default false) and
 *                                    plan.pp_params=stage|replicated (default stage: the pipeline
 *                                    par_state_init builds; replicated: pp_release_stage after it, the
 *                                    layout of pp_state_new alone, summed by a reducer over all trainers)
 * Every trainer rank builds the model-parallel runtime from the keys (par_state_init, as `moerl sft`
 * does) and runs two optimizer steps the way src/rl/sft_train.c's sft_step runs them: the pass count
 * (par_max_passes), the global aux loss's router-count pre-pass, train_accumulate (the pipeline's
 * 1F1B schedule, FSDP's layer schedule, the EP and Ulysses exchanges inside the forward), the
 * gradient sum (par_finish_grads: FSDP's reduce-scatters and replica all-reduce, a stage-owned
 * pipeline's all-reduce over grid.stage_comm and tied-embedding exchange — no reducer —; EP's
 * gradient all-reduces; the bucketed reducer over the stage or all trainers for DP, SP and a
 * replicated pipeline) and the optimizer step (par_adamw_step). Every micro-batch is full
 * (sequences of exactly the micro-batch token limit), the case plan's formulas are for.
 * Each step opens with the RL trainer's proximal-logprob pass (compute_logprobs) and the KL reference's
 * pass (trainer_ref_logprobs, the reference sharded as the actor by trainer_shard_ref): its logprobs
 * equal the unsharded reference's (computed on each rank before the runtime exists), the floats it
 * holds are the actor's (par_held_floats) and plan's, its traffic one logprob pass's.
 * Checks on every rank and step, against plan_traffic_rank for the rank's stage, Ulysses and FSDP rank:
 *   the bytes each group counted per operation (dist_comm_bytes, the reducer's raw payload,
 *   pp_stats.bytes_sent, the whole step's point-to-point on pp_comm) equal plan's, exactly; those of
 *   the logprob pass equal plan_traffic_logprob's, exactly; and the
 *   memory moerl accounts: FSDP's owned shard (fsdp_stats.shard_floats) and peak of gathered
 *   parameters + live gradient units (peak_gathered_bytes), the EP-sliced parameter layout, a
 *   stage-owned pipeline's range (pp_own_range, pp_stage_ranges of every stage), held floats
 *   (pp_held_floats, with a tied last stage's embedding copy) and moments, each within 10% of plan's
 *   figure (the brief's bar; the shard and the pipeline's figures are in fact exact), the FSDP peak
 *   between plan's two replays (gathered_low..gathered) and the rank's FSDP state within 10%, and
 *   plan's stage cut is the pipeline's.
 * With actor.fsdp_config.reshard_after_forward=false (FSDP keeps its units for the mini-batch) the same
 * checks run against plan's held rows: the update's all-gathers are plan_traffic.fsdp_allgather_warm
 * (it follows the logprob pass, which left every unit gathered), the reference's pass is planned
 * resharding (it always reshards), and the peak is exact (plan's two bounds coincide).
 * Pipeline × FSDP (actor.pipeline_parallel_size with actor.fsdp_config.fsdp_size): every rank is checked against
 * its own stage's rows (plan_pp_fsdp_stage, equal to plan_compute's at the fullest stage): the shard, the peak
 * bounds, the activation slots, the micro-batches, the KL reference's held units and peak; the traffic rows
 * as above plus the gradient norm's sum over the stages (pp_comm's all-reduce in the optimizer step). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/model_config.h"
#include "optim/adamw.h"
#include "parallel/ep.h"
#include "parallel/fsdp.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tp_ep.h"
#include "parallel/ulysses.h"
#include "plan/plan.h"
#include "plan/plan_pp_fsdp.h"
#include "rl/rl.h"
#include "dist_test.h"
#include "fixture.h"
#include "test.h"
#include "train/train.h"

#define MT 16     /* tokens per micro-batch = per sequence */
#define N_SEQ 16  /* global batch: every data shard gets N_SEQ / dp full micro-batches */
#define K_STEPS 2

static dist_ctx *g_ctx;
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)
#define RANK g_ctx->world_rank

static moe_config model_config(void) {
    const char *kv[] = {"model.intermediate_size=48", "model.num_hidden_layers=6", "model.num_key_value_heads=2",
                        "model.num_experts=4", "model.num_experts_per_tok=2",
                        "model.mlp_only_layers=[2]", /* a dense layer among MoE ones */
                        "model.router_aux_loss_coef=0.05", "model.initializer_range=0.1"};
    return fx_small_config(kv, FX_N(kv));
}

static int g_tok[N_SEQ][MT];
static train_seq g_seqs[N_SEQ];
static int g_resp;

static double ce_grad(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                      float *dent) {
    (void)ctx;
    (void)seq_of;
    (void)dent;
    double loss = 0;
    for (int n = 0; n < a->N; n++) {
        if (resp_index[n] < 0) continue;
        loss -= a->logp[n] / g_resp;
        dlogp[n] = -1.0f / (float)g_resp;
    }
    return loss;
}

static void reducer_hook(void *ctx, int group) { MOERL_ASSERT(dist_reducer_layer_done(ctx, group) == MOERL_OK); }

static void reset_group_bytes(par_grid *g) {
    dist_comm *cs[] = {g->stage_comm, g->pp_comm, g->dp_comm, g->sp_comm, g->fsdp_comm, g->replica_comm, g->ep_comm,
                       g->ep_dp_comm, g->ep_replica_comm};
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
        if (cs[i]) dist_comm_reset_bytes(cs[i]);
}

/* relative difference, for the 10% memory bar */
static double rel(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-30); }

/* A forward-only logprob pass's bytes per group and operation (since the last reset_group_bytes) against
 * plan_traffic_logprob's lt: 1 when equal (exact; the all-reduce volumes 2(n−1)/n·x may differ in the
 * last bit). Prints the differences, and rank 0's rows at step 0. */
static int logprob_pass_is_plans(par_grid *g, int pp, const plan_traffic *lt, const char *what, int k) {
    const double lg[6] = {dist_comm_bytes(g->fsdp_comm, DIST_OP_ALLGATHER), dist_comm_bytes(g->ep_comm, DIST_OP_ALLTOALL),
                          dist_comm_bytes(g->sp_comm, DIST_OP_ALLTOALL), dist_comm_bytes(g->sp_comm, DIST_OP_ALLREDUCE),
                          pp ? dist_comm_bytes(g->pp_comm, DIST_OP_P2P) : 0,
                          pp ? dist_comm_bytes(g->pp_comm, DIST_OP_ALLREDUCE) : 0};
    const double lw[6] = {lt->fsdp_allgather, lt->ep_alltoall, lt->sp_alltoall, lt->sp_logprob_allreduce,
                          lt->pp_p2p_fwd_only, lt->pp_logprob_allreduce};
    const char *ln[6] = {"FSDP all-gather", "EP all-to-all", "SP all-to-all", "SP logprob all-reduce", "PP p2p",
                         "PP all-reduce"};
    int ok = 1;
    for (int i = 0; i < 6; i++) {
        const int same = i == 3 || i == 5 ? rel(lg[i], lw[i]) < 1e-12 || lg[i] == lw[i] : lg[i] == lw[i];
        if (!same) {
            ok = 0;
            printf("[rank %d] step %d %s: %s counted %.0f B, plan %.0f B\n", RANK, k, what, ln[i], lg[i], lw[i]);
        }
        if (k == 0 && RANK == 0 && (lg[i] > 0 || lw[i] > 0))
            printf("  rank 0 %s %-21s counted %10.0f B  plan %10.0f B\n", what, ln[i], lg[i], lw[i]);
    }
    return ok;
}

/* Tensor parallelism (actor.megatron.tensor_model_parallel_size, TP × DP): K_STEPS steps of a logprob pass, the
 * router-count pre-pass, the training passes, the gradient sums and the optimizer step on the TP slice; the
 * bytes tp_comm and dp_comm counted per operation against plan's tp rows (plan_traffic_rank /
 * plan_traffic_logprob), and the slice's floats against plan's weights. Exact: every count is an integer
 * number of floats times a power-of-two factor. TP × EP (actor.expert_parallel_size > 1 with
 * expert_tensor_parallel_size=1): also ep_comm's all-to-alls against plan's ep_alltoall and the expert gradient
 * sum (ep_dp_comm) with the norm's double (ep_comm) against tp_ep_allreduce; the expert-row all-gathers are in
 * tp_comm's. Megatron sequence parallelism (actor.megatron.sequence_parallel=true): tp_comm's reduce-scatters
 * against plan's tp_reduce_scatter, its all-gathers (rows and vocabulary max) against tp_allgather, its
 * all-reduces (logprob statistics, expert-TP's [N,K], the norms' gradients) against tp_act_allreduce, and the
 * arena against plan's (under SP the residual stream and the norms' statistics on ⌈N/tp⌉ rows). TP × pipeline
 * (actor.pipeline_parallel_size > 1):
 * plan's rows for the rank's stage — tp_comm's as above (the stage's layers, the embedding's on the first stage,
 * the head's and the logprob statistics' on the last), dp_comm's all-reduce (the stage's range over the ranks
 * holding the same slice) against pp_grad_allreduce, pp_comm's point-to-point (the schedule's, pp_stats, and
 * the step's) and the logprob pass's pp_comm sums — and, instead of the slice's floats and arena, tp_pp_memory.
 * Activation recompute (model.enable_gradient_checkpointing,
 * the TP layouts only): the arena against plan's acts_recompute, the recomputed forward's collectives in the
 * same rows (tp_recompute_traffic, tp_ep_traffic's expert-row gathers and exchanges); under TP × pipeline the
 * stage's slots against acts_recompute and the stage's recomputed o_proj sums in tp_comm's all-reduce
 * (plan_tp_pp_update). */
static void tp_pp_memory(par_state *ps, const moe_model *m, const adamw_state *os, const plan_result *pr);

/* TP × EP's token-split scratch (tp_ep.c, after K_STEPS full micro-batches: its buffers at their largest) against
 * plan's tp_ep_scratch row, exactly (integers of bytes); 0 in plan where no tp_ep_state runs (no EP, SP × EP). */
static void tp_ep_scratch_check(const par_state *ps, const plan_result *pr) {
    const double held = ps->tpep ? tp_ep_scratch_held(ps->tpep) : 0;
    CHECK_R(held == pr->tp_ep_scratch && (!ps->tpep || held > 0),
            "TP x EP scratch: tp_ep_state holds %.0f B, plan %.0f B", RANK, held, pr->tp_ep_scratch);
    if (RANK == 0 && ps->tpep)
        printf("  TP x EP scratch: tp_ep_state holds %.0f B (plan %.0f B)\n", held, pr->tp_ep_scratch);
}

static void tp_case(par_state *ps, moe_model *m, const moe_config *mc) {
    par_grid *g = ps->grid;
    const int T = g_ctx->trainer_size, pp = g->pp, stage = g->stage;
    int me, nd;
    par_data_shard(ps, &me, &nd);
    plan_input in = {.n_trainer = T, .fsdp = 1, .ep = g->ep, .sp = 1, .pp = pp, .tp = g->tp,
                     .dispatcher = (int)ps->cfg.dispatcher, .alltoall_max_ep = ps->cfg.alltoall_max_ep,
                     .capacity_factor = ps->cfg.capacity_factor,
                     .tp_experts = g->cfg.expert_tensor_parallel_size != 1, .tp_sp = g->cfg.sequence_parallel,
                     .dtype_bytes = 4, .micro_tokens = MT,
                     .micro_batches = (N_SEQ + nd - 1) / nd, .updates_per_step = 1,
                     .step_tokens = (int64_t)N_SEQ * MT, .fwd_only_passes = 1, .n_rollout = 0, .rollout_tp = 1,
                     .max_num_seqs = 1, .max_model_len = MT, .kv_dtype_bytes = 4, .sync_every = 1,
                     .recompute = m->cfg.exec.recompute};
    train_seq mine[N_SEQ];
    float *lp_buf[N_SEQ];
    int n = 0;
    double resp_mine = 0; /* the response tokens whose logprobs a pipeline's last stage sums onto every stage */
    for (int s = 0; s < N_SEQ; s++)
        if (s % nd == me) mine[n++] = g_seqs[s];
    for (int i = 0; i < n; i++) {
        lp_buf[i] = xcalloc((size_t)(mine[i].len - mine[i].resp_start + 1), sizeof(float));
        resp_mine += mine[i].len - mine[i].resp_start;
    }
    plan_traffic pt, lt;
    plan_result pr;
    const int planned = plan_traffic_rank(mc, &in, stage, 0, 0, &pt) == MOERL_OK &&
                        plan_compute(mc, &in, &pr) == MOERL_OK &&
                        plan_traffic_logprob(mc, &in, stage, 0, 0, in.micro_batches, resp_mine, &lt) == MOERL_OK;
    CHECK_R(planned, "plan (tp %d, pp %d): %s", RANK, g->tp, pp, planned ? "" : moerl_last_error());
    if (!planned) return;
    model_acts acts;
    MOERL_ASSERT(model_acts_init(&acts, m, MT) == MOERL_OK);
    acts.par = ps;
    if (pp == 1) {
        CHECK_R((double)m->n_params * 4 == pr.weights, "TP slice: %zu floats, plan %.0f", RANK, m->n_params,
                pr.weights / 4);
        const double want_acts = in.recompute ? pr.acts_recompute : pr.acts;
        CHECK_R(acts.arena_bytes == want_acts, "TP slice's arena %zu B, plan %.0f (recompute %d)", RANK,
                acts.arena_bytes, want_acts, in.recompute);
    }
    adamw_config oc = adamw_default_config();
    oc.lr = 1e-3f;
    adamw_state os;
    par_adamw_init(ps, m, &os, oc);
    const int E = mc->num_experts;
    int pp_ok = 1; /* TP × pipeline: the pipeline's rows per step */
    for (int k = 0; k < K_STEPS; k++) {
        reset_group_bytes(g);
        dist_comm_reset_bytes(g->tp_comm);
        MOERL_ASSERT(compute_logprobs(m, &acts, mine, n, MT, 1.0f, lp_buf) == MOERL_OK);
        const double lg[4] = {dist_comm_bytes(g->tp_comm, DIST_OP_ALLREDUCE),
                              dist_comm_bytes(g->tp_comm, DIST_OP_ALLGATHER),
                              g->ep > 1 ? dist_comm_bytes(g->ep_comm, DIST_OP_ALLTOALL) : 0,
                              dist_comm_bytes(g->tp_comm, DIST_OP_REDUCE_SCATTER)};
        CHECK_R(lg[0] == lt.tp_act_allreduce && lg[1] == lt.tp_allgather && lg[2] == lt.ep_alltoall &&
                    lg[3] == lt.tp_reduce_scatter,
                "step %d logprob pass: TP all-reduce %.0f B (plan %.0f), all-gather %.0f B (plan %.0f), EP all-to-all "
                "%.0f B (plan %.0f), TP reduce-scatter %.0f B (plan %.0f)", RANK, k, lg[0], lt.tp_act_allreduce, lg[1],
                lt.tp_allgather, lg[2], lt.ep_alltoall, lg[3], lt.tp_reduce_scatter);
        if (pp > 1) /* the stages' p2p and sums over pp_comm (logprob_pass_is_plans' last two rows) */
            pp_ok &= logprob_pass_is_plans(g, 1, &lt, "TP x pipeline logprob pass", k);
        reset_group_bytes(g);
        dist_comm_reset_bytes(g->tp_comm);
        double counts[16] = {0}, psum[16] = {0};
        train_step_opts to = {.max_tokens = MT, .temperature = 1.0f, .aux_coef = mc->router_aux_loss_coef,
                              .total_tokens = (int64_t)N_SEQ * MT, .par = ps, .aux_counts = counts,
                              .aux_psum_out = psum};
        const int n_mb = count_microbatches(mine, n, MT);
        MOERL_ASSERT(compute_router_counts(m, &acts, mine, n, MT, counts) == MOERL_OK);
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, E) == MOERL_OK);
        for (int e = 0; e < E; e++) counts[e] /= g->tp * pp; /* every TP rank (and stage) counted the same tokens */
        train_step_out so;
        MOERL_ASSERT(train_accumulate(m, &acts, mine, n, &to, ce_grad, NULL, &so) == MOERL_OK);
        MOERL_ASSERT(par_finish_grads(ps, n_mb, n_mb) == MOERL_OK);
        double gn;
        MOERL_ASSERT(par_adamw_step(ps, m, &os, 1e-3f, (float)so.loss, &gn) == 1); /* 1: applied */
        if (pp > 1) { /* the schedule's sends (pp_stats) and the step's (+ the router pre-pass's, a tied embedding's) */
            const double sched = pp_last_stats(ps->pp)->bytes_sent, step = dist_comm_bytes(g->pp_comm, DIST_OP_P2P);
            const double want_step = pt.pp_p2p + pt.pp_p2p_fwd_only + pt.pp_p2p_emb;
            pp_ok &= sched == pt.pp_p2p && step == want_step;
            CHECK_R(sched == pt.pp_p2p && step == want_step, "step %d stage %d: PP 1F1B p2p %.0f B (plan %.0f), the "
                    "step's p2p %.0f B (plan %.0f)", RANK, k, stage, sched, pt.pp_p2p, step, want_step);
            if (k == 0 && g->tp_rank == 0 && g->dp_rank == 0)
                printf("  stage %d: PP p2p of the step %.0f B (plan %.0f), stage all-reduce over dp_comm %.0f B (plan "
                       "%.0f), TP all-reduce %.0f B (plan %.0f)\n", stage, step, want_step,
                       g->dp > 1 ? dist_comm_bytes(g->dp_comm, DIST_OP_ALLREDUCE) : 0, pt.pp_grad_allreduce,
                       dist_comm_bytes(g->tp_comm, DIST_OP_ALLREDUCE), pt.tp_act_allreduce);
        }
        const int tpep = g->ep > 1;
        const double got[6] = {dist_comm_bytes(g->tp_comm, DIST_OP_ALLREDUCE),
                               dist_comm_bytes(g->tp_comm, DIST_OP_ALLGATHER),
                               g->dp > 1 ? dist_comm_bytes(g->dp_comm, DIST_OP_ALLREDUCE) : 0,
                               tpep ? dist_comm_bytes(g->ep_comm, DIST_OP_ALLTOALL) : 0,
                               tpep ? dist_comm_bytes(g->ep_dp_comm, DIST_OP_ALLREDUCE) +
                                          dist_comm_bytes(g->ep_comm, DIST_OP_ALLREDUCE)
                                    : 0,
                               dist_comm_bytes(g->tp_comm, DIST_OP_REDUCE_SCATTER)};
        /* (TP × pipeline: the stage's range summed over dp_comm is the pipeline's row) */
        const double want[6] = {pt.tp_act_allreduce, pt.tp_allgather,
                                pp > 1 ? pt.pp_grad_allreduce : pt.tp_dp_allreduce, pt.ep_alltoall,
                                pt.tp_ep_allreduce, pt.tp_reduce_scatter};
        const char *what[6] = {"TP all-reduce", "TP all-gather", "DP all-reduce of the slice", "EP all-to-all",
                               "expert gradient and norm all-reduce", "TP reduce-scatter (Megatron SP)"};
        for (int i = 0; i < 6; i++) /* the all-reduce volumes 2(n−1)/n·x may differ in the last bit */
            CHECK_R(got[i] == want[i] || ((i == 3 || i == 4 || (pp > 1 && i == 2)) && rel(got[i], want[i]) < 1e-12),
                    "step %d %s: counted %.0f B, plan %.0f", RANK, k, what[i], got[i], want[i]);
        if (k == 0 && RANK == 0 && tpep)
            printf("tp %d x ep %d x dp %d: EP all-to-all %.0f B, expert all-reduce %.0f B per update (plan %.0f, %.0f)\n",
                   g->tp, g->ep, g->dp, got[3], got[4], want[3], want[4]);
        if (k == 0 && RANK == 0 && in.tp_sp)
            printf("tp %d x dp %d + SP: TP reduce-scatter %.0f B, all-gather %.0f B per update (plan %.0f, %.0f)\n",
                   g->tp, g->dp, got[5], got[1], want[5], want[1]);
        if (k == 0 && RANK == 0)
            printf("tp %d x dp %d: TP all-reduce %.0f B, all-gather %.0f B, DP all-reduce %.0f B per update (plan %.0f, "
                   "%.0f, %.0f)\n", g->tp, g->dp, got[0], got[1], got[2], want[0], want[1], want[2]);
    }
    tp_ep_scratch_check(ps, &pr);
    if (pp > 1) {
        CHECK_R(pp_ok, "TP x pipeline: the stage's p2p and pp_comm sums equal plan's", RANK);
        tp_pp_memory(ps, m, &os, &pr);
    }
    for (int i = 0; i < n; i++) free(lp_buf[i]);
    adamw_free(&os);
    model_acts_free(&acts);
}

/* Pipeline × FSDP: plan's per-rank rows are the fullest stage's; the rows of this rank's stage
 * (plan_pp_fsdp_stage) are checked to be plan_compute's at the fullest stage, exactly, then replace *pr so
 * that every memory check below runs against the rank's own stage. */
static void pp_fsdp_stage_rows(const moe_config *mc, const plan_input *in, int stage, plan_result *pr) {
    plan_result st;
    const int ok = plan_pp_fsdp_stage(mc, in, stage, &st) == MOERL_OK;
    CHECK_R(ok, "plan_pp_fsdp_stage: %s", RANK, ok ? "" : moerl_last_error());
    if (!ok) return;
    if (stage == pr->fullest_stage)
        CHECK_R(st.weights == pr->weights && st.grads == pr->grads && st.moments == pr->moments &&
                    st.acts == pr->acts && st.acts_recompute == pr->acts_recompute && st.gathered == pr->gathered &&
                    st.gathered_low == pr->gathered_low && st.ref_weights == pr->ref_weights &&
                    st.ref_acts == pr->ref_acts && st.ref_held == pr->ref_held &&
                    st.ref_gathered == pr->ref_gathered && st.total == pr->total &&
                    st.stage_layers == pr->stage_layers,
                "stage %d's rows (plan_pp_fsdp_stage) are plan_compute's fullest stage's", RANK, stage);
    *pr = st;
}

/* TP × pipeline's memory: every stage's range of the slice (pp_held_floats; its moments) is plan's stage of the
 * slice's model (plan_pp_stage_params on the local config m->cfg, tp_config_apply's), its layers plan's cut; on
 * the fullest stage plan_compute's weights, moments and activation slots (pp_slots_bytes) are the rank's, exactly
 * (integers of floats; the same arena layout), and the micro-batch count and bubble theory the schedule's. */
static void tp_pp_memory(par_state *ps, const moe_model *m, const adamw_state *os, const plan_result *pr) {
    const par_grid *g = ps->grid;
    double d, e;
    int l0, l1, lo, hi;
    MOERL_ASSERT(plan_pp_stage_params(&m->cfg, g->pp, PLAN_PP_STAGE_LOCAL, g->stage, &d, &e, &l0, &l1) == MOERL_OK);
    pp_stage_layers(ps->pp, &lo, &hi);
    const double held = (double)pp_held_floats(ps->pp), copy = plan_pp_tied_copy(&m->cfg, g->pp, PLAN_PP_STAGE_LOCAL,
                                                                                   g->stage);
    CHECK_R(l0 == lo && l1 == hi && held == d + e + copy && (double)os->n == d + e,
            "stage %d: layers [%d, %d) (plan [%d, %d)), holds %.0f floats of the slice (plan %.0f + tied copy %.0f), "
            "moments over %zu", RANK, g->stage, lo, hi, l0, l1, held, d + e, copy, os->n);
    if (g->stage == pr->fullest_stage) {
        /* activation recompute: the slots hold the recompute arena (plan's acts_recompute, smaller than acts) */
        const int rc = m->cfg.exec.recompute;
        const double slots = pp_slots_bytes(ps->pp), want = rc ? pr->acts_recompute : pr->acts;
        CHECK_R(held * 4 == pr->weights && pr->grads == pr->weights && (double)os->n * 8 == pr->moments &&
                    slots == want && (!rc || pr->acts_recompute < pr->acts),
                "fullest stage %d: held %.0f B (plan %.0f), moments %.0f B (plan %.0f), activation slots %.0f B "
                "(plan %.0f, recompute %d; without recompute %.0f)", RANK, g->stage, held * 4, pr->weights,
                (double)os->n * 8, pr->moments, slots, want, rc, pr->acts);
        if (g->tp_rank == 0 && g->dp_rank == 0)
            printf("  tp %d x pp %d x dp %d, fullest stage %d: slice held %.0f B (plan %.0f), moments %.0f B (plan "
                   "%.0f), activation slots %.0f B (plan %.0f, recompute %d)\n", g->tp, g->pp, g->dp, g->stage,
                   held * 4, pr->weights, (double)os->n * 8, pr->moments, slots, want, rc);
    }
    const pp_stats *pst = pp_last_stats(ps->pp);
    CHECK_R(pst->microbatches == pr->micro_batches && rel(pst->theory_interleaved, pr->bubble_theory) < 1e-12,
            "pipeline: %d micro-batches (plan %d), bubble theory %.4f (plan %.4f)", RANK, pst->microbatches,
            pr->micro_batches, pst->theory_interleaved, pr->bubble_theory);
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_plan: %s\n", moerl_last_error());
        return 1;
    }
    cfg *kc = cfg_new();
    par_def_keys(kc);
    cfg_def_int(kc, "actor.ppo_max_token_len_per_gpu", MT, "micro-batch token limit");
    cfg_def_bool(kc, "model.tie_word_embeddings", false, "the test model ties its LM head to the embedding");
    cfg_def_str(kc, "plan.pp_params", "stage", "stage (par_state_init's stage-owned pipeline) | replicated");
    model_def_train_keys(kc); /* model.enable_gradient_checkpointing, actor.recompute_granularity: the TP case */
    MOERL_ASSERT(cfg_apply_override(kc, "actor.fsdp_config.fsdp_size=1") == MOERL_OK); /* moerl sft's default: off */
    for (int i = 1; i < argc; i++)
        if (cfg_apply_override(kc, argv[i]) != MOERL_OK) {
            fprintf(stderr, "test_dist_plan: %s\n", moerl_last_error());
            return 2;
        }
    rng_state r;
    rng_seed(&r, 99);
    g_resp = 0;
    for (int s = 0; s < N_SEQ; s++) {
        for (int t = 0; t < MT; t++) g_tok[s][t] = (int)rng_below(&r, 64);
        g_seqs[s] = (train_seq){.tokens = g_tok[s], .len = MT, .resp_start = 1 + s % 5};
        g_resp += MT - g_seqs[s].resp_start;
    }
    moe_config mc = model_config();
    mc.tie_word_embeddings = cfg_bool(kc, "model.tie_word_embeddings");
    const char *ppl = cfg_str(kc, "plan.pp_params");
    const int pp_repl = !strcmp(ppl, "replicated");
    if (!pp_repl && strcmp(ppl, "stage")) {
        fprintf(stderr, "test_dist_plan: plan.pp_params '%s' is not stage or replicated\n", ppl);
        return 2;
    }
    moe_model m;
    MOERL_ASSERT(model_init(&m, &mc) == MOERL_OK);
    model_init_random(&m, 7);
    if (model_check_train_keys(kc) != MOERL_OK) {
        fprintf(stderr, "test_dist_plan: %s\n", moerl_last_error());
        return 2;
    }
    m.cfg.exec.recompute = model_recompute_mode(kc); /* before par_state_init: the slices copy the config */
    /* the KL reference as `moerl rl` makes it with actor.use_kl_loss: trainer_init copies the whole
     * model before the model-parallel runtime exists (src/rl/job_dist.c) */
    rl_config rcfg;
    memset(&rcfg, 0, sizeof rcfg);
    rcfg.use_kl_loss = 1;
    rcfg.ppo_max_token_len = MT;
    rcfg.optim = adamw_default_config();
    rcfg.temperature = 1.0f;
    trainer kl_T;
    MOERL_ASSERT(trainer_init(&kl_T, &rcfg, NULL, &m) == MOERL_OK && kl_T.ref);
    /* the unsharded reference's logprobs of every sequence (the whole model on this rank, no runtime): what
     * the sharded reference must give */
    float *want_ref[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) want_ref[s] = xcalloc((size_t)(MT - g_seqs[s].resp_start + 1), sizeof(float));
    MOERL_ASSERT(compute_logprobs(kl_T.ref, &kl_T.acts, g_seqs, N_SEQ, MT, 1.0f, want_ref) == MOERL_OK);
    par_state ps;
    const int ok = par_state_init(&ps, g_ctx, kc, &m) == MOERL_OK;
    CHECK_R(ok, "par_state_init: %s", RANK, ok ? "" : moerl_last_error());
    if (!ok) return dist_test_finish(g_ctx);
    if (ps.tp) { /* TP × DP: its own steps and rows (tp_case) */
        tp_case(&ps, &m, &mc);
        return dist_test_finish(g_ctx);
    }
    if (m.cfg.exec.recompute) { /* the other layouts' recompute rows: tests/test_dist_recompute.c, test_recompute.c */
        fprintf(stderr, "test_dist_plan: model.enable_gradient_checkpointing is checked here with TP only\n");
        return 2;
    }
    /* the reference sharded as the actor, as src/rl/job_dist.c's trainer_par_setup does */
    kl_T.par = &ps;
    CHECK_R(trainer_shard_ref(&kl_T) == MOERL_OK, "trainer_shard_ref: %s", RANK, moerl_last_error());
    if (pp_repl && ps.pp) MOERL_ASSERT(pp_release_stage(ps.pp) == MOERL_OK); /* the whole model on every rank */
    if (pp_repl && kl_T.ref_par && kl_T.ref_par->pp) MOERL_ASSERT(pp_release_stage(kl_T.ref_par->pp) == MOERL_OK);
    const int pp_owned = ps.pp && pp_is_owned(ps.pp);
    /* pipeline × FSDP: FSDP owns the stage's memory (pp_set_sharded), the pipeline owns none */
    CHECK_R(!ps.pp || (ps.fsdp ? !pp_owned && !pp_repl : pp_owned == !pp_repl),
            "par_state_init builds a stage-owned pipeline", RANK);
    par_grid *g = ps.grid;
    const int T = g_ctx->trainer_size;
    const int gfsdp = g ? g->fsdp : 1, gep = g ? g->ep : 1, gsp = g ? g->sp : 1, gpp = g ? g->pp : 1;
    const int stage = g ? g->stage : 0, sp_rank = g ? g->sp_rank : 0;

    /* the plan of this layout (the pipeline as par_state_init builds it: stage-local, unless replicated) */
    int me, nd;
    par_data_shard(&ps, &me, &nd);
    plan_input in = {.n_trainer = T, .fsdp = gfsdp, .ep = gep, .sp = gsp, .pp = gpp, .dtype_bytes = 4,
                     .micro_tokens = MT, .micro_batches = (N_SEQ + nd - 1) / nd, /* FSDP/EP pad to the most */ .updates_per_step = 1,
                     .step_tokens = (int64_t)N_SEQ * MT, .fwd_only_passes = 1,
                     .pp_params = pp_repl ? PLAN_PP_REPLICATED : PLAN_PP_STAGE_LOCAL,
                     .dispatcher = (int)ps.cfg.dispatcher, .alltoall_max_ep = ps.cfg.alltoall_max_ep,
                     .capacity_factor = ps.cfg.capacity_factor, .n_rollout = 0, .rollout_tp = 1, .max_num_seqs = 1,
                     .max_model_len = MT, .kv_dtype_bytes = 4, .sync_every = 1, .ref_model = 1,
                     .logprob_passes = 1, .logprob_tokens = (int64_t)N_SEQ * MT, /* the reference pass's count */
                     .vpp = ps.pp ? pp_chunks(ps.pp) : 1,
                     .fsdp_keep_gathered = ps.cfg.fsdp_keep_gathered}; /* actor.fsdp_config.reshard_after_forward */
    /* the KL reference always reshards (fsdp.h: an inference state): its pass is planned so */
    plan_input rin = in;
    rin.fsdp_keep_gathered = 0;
    const int gv = in.vpp;
    plan_traffic pt;
    plan_result pr;
    CHECK_R(plan_traffic_rank(&mc, &in, stage, sp_rank, g ? g->fsdp_rank : 0, &pt) == MOERL_OK && plan_compute(&mc, &in, &pr) == MOERL_OK,
            "plan: %s", RANK, moerl_last_error());
    if (ps.pp && ps.fsdp) pp_fsdp_stage_rows(&mc, &in, stage, &pr);

    /* sft_step's pieces */
    model_acts acts;
    MOERL_ASSERT(model_acts_init(&acts, &m, MT) == MOERL_OK);
    acts.par = &ps;
    model_acts_free(&kl_T.acts); /* the trainer's arena is the actor's: the reference pass runs in it */
    kl_T.acts = acts;
    adamw_config oc = adamw_default_config();
    oc.lr = 1e-3f;
    adamw_state os;
    par_adamw_init(&ps, &m, &os, oc); /* FSDP: the shard; stage-owned pp: the stage's range; else all of m */
    dist_grad_reducer *red = NULL;
    if (T > 1 && !ps.fsdp && !ps.ep && !pp_owned) /* sft's rule: a stage-owned pipeline has no reducer */
        red = g && !ps.pp ? dist_reducer_new_on(g_ctx, g->stage_comm, &m, 25.0, DIST_OVERLAP_THREAD)
                          : dist_reducer_new(g_ctx, &m, 25.0, DIST_OVERLAP_THREAD);
    train_seq mine[N_SEQ];
    int n = 0;
    for (int s = 0; s < N_SEQ; s++)
        if (s % nd == me) mine[n++] = g_seqs[s];
    const int E = mc.num_experts;
    int traffic_ok = 1;
    double worst_mem = 0;
    /* the RL trainer's proximal-logprob pass (compute_logprobs, once per step before the training
     * passes): its traffic per group against plan_traffic_logprob */
    int lp_ok = 1, ref_ok = 1;
    double ref_diff = 0; /* largest |sharded − unsharded| reference logprob on this rank */
    double resp_mine = 0;
    float *lp_buf[N_SEQ];
    for (int i = 0; i < n; i++) {
        resp_mine += mine[i].len - mine[i].resp_start;
        lp_buf[i] = xcalloc((size_t)(mine[i].len - mine[i].resp_start + 1), sizeof(float));
    }
    for (int k = 0; k < K_STEPS; k++) {
        if (g) {
            reset_group_bytes(g);
            plan_traffic lt;
            CHECK_R(plan_traffic_logprob(&mc, &in, stage, sp_rank, g->fsdp_rank, in.micro_batches, resp_mine, &lt) ==
                        MOERL_OK, "plan_traffic_logprob: %s", RANK, moerl_last_error());
            MOERL_ASSERT(compute_logprobs(&m, &acts, mine, n, MT, 1.0f, lp_buf) == MOERL_OK);
            lp_ok &= logprob_pass_is_plans(g, ps.pp != NULL, &lt, "logprob pass", k);
        }
        /* the KL reference pass right after it, as step_data_logprobs runs it (trainer_ref_logprobs): the
         * sharded reference in the actor's arena, the collectives of one logprob pass on the same groups
         * (plan's ref_pass), the FSDP units the proximal pass left gathered are plan's ref_held */
        double held = 0;
        if (ps.fsdp) {
            fsdp_stats st;
            fsdp_get_stats(ps.fsdp, &st);
            held = st.gathered_bytes;
        }
        if (g) reset_group_bytes(g);
        for (int i = 0; i < n; i++) memset(lp_buf[i], 0, (size_t)(mine[i].len - mine[i].resp_start) * sizeof(float));
        MOERL_ASSERT(trainer_ref_logprobs(&kl_T, mine, n, lp_buf) == MOERL_OK);
        /* the sharded reference's logprobs against the unsharded reference's (the same frozen weights) */
        for (int i = 0, si = 0; i < n; i++) {
            while (g_seqs[si].tokens != mine[i].tokens) si++;
            for (int t = 0; t < mine[i].len - mine[i].resp_start; t++)
                ref_diff = fmax(ref_diff, fabs((double)lp_buf[i][t] - (double)want_ref[si][t]));
        }
        /* its traffic: the proximal pass's counters and plan_traffic_logprob, per group and operation */
        int traffic_same = 1;
        if (g) {
            plan_traffic lt;
            MOERL_ASSERT(plan_traffic_logprob(&mc, &rin, stage, sp_rank, g->fsdp_rank, in.micro_batches, resp_mine,
                                              &lt) == MOERL_OK);
            traffic_same = logprob_pass_is_plans(g, ps.pp != NULL, &lt, "KL reference pass", k);
        }
        /* exact: the floats a rank holds are integers; the reference's FSDP units are all released after
         * its pass (par_release_gathered) */
        const double ref_w = (double)par_held_floats(kl_T.ref_par, kl_T.ref) * 4,
                     act_w = (double)par_held_floats(&ps, &m) * 4,
                     ref_a = kl_T.ref_par && kl_T.ref_par->pp ? pp_slots_bytes(kl_T.ref_par->pp) : 0;
        double ref_peak = 0, ref_now = 0;
        if (kl_T.ref_par && kl_T.ref_par->fsdp) {
            fsdp_stats st;
            fsdp_get_stats(kl_T.ref_par->fsdp, &st);
            ref_peak = st.peak_gathered_bytes;
            ref_now = st.gathered_bytes;
        }
        /* plan's per-rank figures are the fullest stage's (pipeline), every rank's otherwise; the EP slice
         * is plan's within the 10% bar, as the actor's parameters (its padding per local tensor) */
        const int plan_rank = !ps.pp || stage == pr.fullest_stage;
        const int w_same = ps.ep && !ps.fsdp ? rel(ref_w, pr.ref_weights) < 0.10 : ref_w == pr.ref_weights;
        if (!traffic_same || ref_w != act_w || (plan_rank && (!w_same || ref_a != pr.ref_acts)) ||
            held != pr.ref_held || ref_peak != pr.ref_gathered || ref_now != 0 ||
            (!in.fsdp_keep_gathered && fabs(pr.ref_pass - pr.logprob_pass / in.logprob_passes) > 0)) {
            ref_ok = 0;
            printf("[rank %d] step %d KL reference: traffic %s plan's, weights %.0f B (actor %.0f, plan %.0f), "
                   "slots %.0f B (plan %.0f), actor's FSDP units held %.0f B (plan %.0f), own peak gathered %.0f B "
                   "(plan %.0f), still gathered %.0f B\n", RANK, k, traffic_same ? "=" : "!=", ref_w, act_w,
                   pr.ref_weights, ref_a, pr.ref_acts, held, pr.ref_held, ref_peak, pr.ref_gathered, ref_now);
        }
        if (k == 0 && RANK == 0)
            printf("  rank 0 KL reference: weights %.0f B of %.0f whole (plan %.0f), slots %.0f B (plan %.0f), FSDP "
                   "held %.0f B (plan %.0f), own peak %.0f B (plan %.0f)\n", ref_w,
                   (double)par_whole_params(kl_T.ref_par, kl_T.ref) * 4, pr.ref_weights, ref_a, pr.ref_acts, held,
                   pr.ref_held, ref_peak, pr.ref_gathered);
        if (g) reset_group_bytes(g);
        double counts[16] = {0}, psum[16] = {0};
        train_step_opts to = {.max_tokens = MT, .temperature = 1.0f, .aux_coef = mc.router_aux_loss_coef,
                              .total_tokens = (int64_t)N_SEQ * MT, .par = &ps, .aux_counts = counts,
                              .aux_psum_out = psum};
        if (red) {
            to.layer_hook = reducer_hook;
            to.layer_hook_ctx = red;
        }
        const int n_mb = count_microbatches(mine, n, MT), max_mb = par_max_passes(&ps, n_mb);
        MOERL_ASSERT(compute_router_counts(&m, &acts, mine, n, MT, counts) == MOERL_OK);
        MOERL_ASSERT(par_pad_passes(&ps, n_mb, max_mb, 0) == MOERL_OK);
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, E) == MOERL_OK);
        if (ps.pp)
            for (int e = 0; e < E; e++) counts[e] /= gpp;
        train_step_out so;
        MOERL_ASSERT(train_accumulate(&m, &acts, mine, n, &to, ce_grad, NULL, &so) == MOERL_OK);
        /* idle passes, then FSDP's reduce-scatters / the stage-owned pipeline's sum over stage_comm */
        MOERL_ASSERT(par_finish_grads(&ps, n_mb, max_mb) == MOERL_OK); /* EP: ep_reduce_grads inside */
        if (red) dist_reducer_finish(red);
        double gn;
        /* the collectives of the passes and the gradient sums (the optimizer step comes after) */
#define N_ROW 12
        double got[N_ROW] = {0}, want[N_ROW] = {0};
        const char *what[N_ROW] = {"reducer payload", "FSDP all-gather", "FSDP reduce-scatter",
                                   "HSDP replica all-reduce", "EP all-to-all", "EP gradient all-reduce",
                                   "SP all-to-all", "PP stage all-reduce", "PP 1F1B schedule p2p", "PP p2p of the step",
                                   "EP x FSDP expert replicas", "PP x FSDP norm all-reduce"};
        if (red) {
            double sent;
            dist_reducer_last_bytes(red, &sent, &got[0]);
        }
        if (g) {
            got[1] = dist_comm_bytes(g->fsdp_comm, DIST_OP_ALLGATHER);
            got[2] = dist_comm_bytes(g->fsdp_comm, DIST_OP_REDUCE_SCATTER);
            got[3] = g->replicas > 1 ? dist_comm_bytes(g->replica_comm, DIST_OP_ALLREDUCE) : 0;
            got[4] = dist_comm_bytes(g->ep_comm, DIST_OP_ALLTOALL);
            got[10] = ps.ep && ps.fsdp && g->ep_replica_comm ? dist_comm_bytes(g->ep_replica_comm, DIST_OP_ALLREDUCE) : 0;
            /* (pipeline × EP: the stage's all-reduce is row 7's, the expert slices' over ep_dp_comm row 5's) */
            got[5] = ps.ep && !ps.fsdp ? (pp_owned ? 0 : dist_comm_bytes(g->stage_comm, DIST_OP_ALLREDUCE)) +
                                 (g->ep_dp_comm != g->stage_comm ? dist_comm_bytes(g->ep_dp_comm, DIST_OP_ALLREDUCE) : 0)
                           : 0;
            got[6] = dist_comm_bytes(g->sp_comm, DIST_OP_ALLTOALL);
            got[7] = pp_owned ? dist_comm_bytes(g->stage_comm, DIST_OP_ALLREDUCE) : 0;
            got[8] = ps.pp ? pp_last_stats(ps.pp)->bytes_sent : 0;
        }
        /* the optimizer step: its norm all-reduces are scalars plan leaves out; a tied pipeline's stage 0
         * sends the stepped embedding to the last stage in it (point-to-point, counted below) */
        const double norm0 = ps.pp && ps.fsdp ? dist_comm_bytes(g->pp_comm, DIST_OP_ALLREDUCE) : 0;
        const int applied = par_adamw_step(&ps, &m, &os, oc.lr, (float)so.loss, &gn);
        /* pipeline × FSDP: the gradient norm's sum over the stages (fsdp_set_norm_group) */
        if (ps.pp && ps.fsdp) got[11] = dist_comm_bytes(g->pp_comm, DIST_OP_ALLREDUCE) - norm0;
        CHECK_R(applied == 1, "step %d applied (loss %g)", RANK, k, so.loss);
        if (ps.pp) got[9] = dist_comm_bytes(g->pp_comm, DIST_OP_P2P);
        /* the update runs right after the step's logprob passes: plan's warm all-gathers (resharding: the
         * same as a cold update's; reshard_after_forward=false: only the pass count, every unit is still
         * gathered) */
        const double w[N_ROW] = {pt.reducer, pt.fsdp_allgather_warm, pt.fsdp_reduce_scatter, pt.replica_allreduce,
                                 pt.ep_alltoall, pt.ep_grad_allreduce, pt.sp_alltoall, pt.pp_grad_allreduce,
                                 pt.pp_p2p, pt.pp_p2p + pt.pp_p2p_fwd_only + pt.pp_p2p_emb, pt.ep_replica_allreduce,
                                 pt.pp_norm_allreduce};
        memcpy(want, w, sizeof want);
        for (int i = 0; i < N_ROW; i++) {
            /* exact: both are sums of integers of bytes below 2^53; the all-reduce volumes 2(n−1)/n·x
             * are formed in the same order of operations (rounding differs at most in the last bit; a
             * tied last stage's two all-reduces are added in the same order as pp_finish_grads') */
            const int same = i == 3 || i == 5 || i == 7 || i >= 10 ? rel(got[i], want[i]) < 1e-12 || got[i] == want[i]
                                                        : got[i] == want[i];
            if (!same) {
                traffic_ok = 0;
                printf("[rank %d] step %d: %s counted %.0f B, plan %.0f B\n", RANK, k, what[i], got[i], want[i]);
            }
            if (k == 0 && RANK == 0 && (got[i] > 0 || want[i] > 0))
                printf("  rank 0 %-26s counted %10.0f B  plan %10.0f B\n", what[i], got[i], want[i]);
        }
    }
    CHECK_R(traffic_ok, "traffic per step equals plan's per group and operation (fsdp %d ep %d sp %d pp %d)", RANK,
            gfsdp, gep, gsp, gpp);
    CHECK_R(lp_ok, "the logprob pass's traffic equals plan's per group and operation", RANK);
    CHECK_R(ref_ok, "the KL reference (actor.use_kl_loss): held floats are the actor's and plan's, its slots, FSDP "
            "units and traffic are plan's", RANK);
    /* Tolerance: the sharded reference gathers (FSDP), exchanges (EP, Ulysses) and sends (pipeline) its fp32
     * values unchanged, but the kernels run on other shapes than the whole model's on one rank — the grouped
     * GEMM over the local experts' rows, attention over the local heads, a micro-batch's rows split — so
     * the blocking and the order of fp32 sums differ: ~1e-7 relative per sum over H = 32 terms, compounded
     * over 6 layers and the log-softmax over 64 logits. 1e-5 on logprobs of magnitude ~4 is ~20× that
     * (observed: 0 with FSDP, Ulysses and the pipeline, 9.5e-7 with EP). */
    {
        double *all = xcalloc((size_t)T, sizeof(double)), worst = 0;
        all[g_ctx->trainer_rank] = ref_diff;
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, all, T) == MOERL_OK);
        for (int r = 0; r < T; r++) worst = fmax(worst, all[r]);
        free(all);
        CHECK_R(worst <= 1e-5, "the sharded KL reference's logprobs equal the unsharded reference's (max |diff| "
                "%.3g over all ranks and both steps, tolerance 1e-5)", RANK, worst);
        if (RANK == 0) printf("  KL reference: sharded vs unsharded logprobs max |diff| %.3g\n", worst);
    }
    {   /* the reference holds the sharded number of floats: the actor's (checked above), fewer than the whole
         * model's whenever the layout shards parameters (FSDP, EP, pipeline) */
        const size_t held = par_held_floats(kl_T.ref_par, kl_T.ref), whole = par_whole_params(kl_T.ref_par, kl_T.ref);
        const int shards = ps.fsdp || ps.ep || (ps.pp && !pp_repl);
        CHECK_R(shards ? held < whole : held == whole && !kl_T.ref_par == !par_active(&ps),
                "the KL reference holds %zu of the whole model's %zu floats on this rank (sharded: %d)", RANK, held,
                whole, shards);
    }
    for (int s = 0; s < N_SEQ; s++) free(want_ref[s]);
    for (int i = 0; i < n; i++) free(lp_buf[i]);

    /* memory: moerl's own accounting against plan's per-rank figures (the 10% bar of the brief) */
    if (ps.fsdp) {
        fsdp_stats st;
        fsdp_get_stats(ps.fsdp, &st);
        /* the shard exactly; the peak of gathered units between the schedule's bounds (whether a
         * reduce-scatter has completed when fsdp.c polls is timing: plan_result.gathered_low/gathered).
         * Both checks are exact and hold on any machine. The rank's FSDP state (parameter and gradient
         * shards, moments, peak gathered) against plan's figure (its upper bound) is reported, not asserted:
         * where the bounds differ its distance is timing — with the smoke model's tiny shards, pp 2 × fsdp 2
         * × v 3 spans 20% of the state between them (a CI run under load measured 12%, a quiet one 9%);
         * reshard_after_forward=false has equal bounds, so there the state equals plan's exactly. */
        const double shard = (double)st.shard_floats * 4, peak = st.peak_gathered_bytes;
        const double mine = 4 * shard + peak, planned = pr.weights + pr.grads + pr.moments + pr.gathered;
        worst_mem = rel(mine, planned);
        CHECK_R(shard == pr.weights && pr.gathered_low <= peak && peak <= pr.gathered &&
                    (pr.gathered_low < pr.gathered || mine == planned),
                "FSDP shard %.0f B (plan %.0f), peak gathered %.0f B (plan %.0f..%.0f), state %.0f B (plan %.0f)",
                RANK, shard, pr.weights, peak, pr.gathered_low, pr.gathered, mine, planned);
        if (RANK == 0)
            printf("  FSDP shard %.0f B (plan %.0f), peak gathered + live gradients %.0f B (plan %.0f..%.0f)\n", shard,
                   pr.weights, peak, pr.gathered_low, pr.gathered);
        if (ps.pp) { /* pipeline × FSDP: the stage's activation slots (exact: the same arena layout), the
                      * schedule's micro-batches and bubble theory are plan's */
            const pp_stats *pst = pp_last_stats(ps.pp);
            const double slots = pp_slots_bytes(ps.pp);
            CHECK_R(slots == pr.acts && pst->microbatches == pr.micro_batches &&
                        rel(pst->theory_interleaved, pr.bubble_theory) < 1e-12,
                    "stage %d: activation slots %.0f B (plan %.0f), %d micro-batches (plan %d), bubble theory %.4f "
                    "(plan %.4f)", RANK, stage, slots, pr.acts, pst->microbatches, pr.micro_batches,
                    pst->theory_interleaved, pr.bubble_theory);
            if (g->fsdp_rank == 0 && g->replica_rank == 0)
                printf("  stage %d: FSDP shard %.0f B, peak %.0f B (plan %.0f..%.0f), activation slots %.0f B (plan "
                       "%.0f)\n", stage, shard, peak, pr.gathered_low, pr.gathered, slots, pr.acts);
        }
    } else if (pp_owned) { /* the stage's chunk ranges, held floats and moments against plan's stage-local model */
        const int nv = gpp * gv;
        size_t slo[MOERL_MAX_LAYERS + 1], shi[MOERL_MAX_LAYERS + 1];
        pp_stage_ranges(&m, pp_bounds(ps.pp), nv, slo, shi, NULL, NULL);
        int ranges_ok = 1;
        double own = 0; /* this stage's floats: Σ over its chunks */
        for (int vs = 0; vs < nv; vs++) { /* every virtual stage's range (pure), not only this rank's */
            double d, e;
            int l0, l1;
            MOERL_ASSERT(plan_pp_chunk_params(&mc, gpp, gv, PLAN_PP_STAGE_LOCAL, vs % gpp, vs / gpp, &d, &e, &l0, &l1) ==
                         MOERL_OK);
            /* pipeline × EP: the stage of the sliced layout holds 1/ep of the experts (plan's e / ep: exact here,
             * the test model's expert tensors being multiples of 16·ep floats, so each slice pads as its share) */
            e /= gep;
            if ((double)(shi[vs] - slo[vs]) != d + e) {
                ranges_ok = 0;
                printf("[rank %d] virtual stage %d: pp_stage_ranges %zu floats, plan %.0f\n", RANK, vs,
                       shi[vs] - slo[vs], d + e);
            }
            if (vs % gpp == stage) {
                size_t lo, hi;
                pp_own_chunk_range(ps.pp, vs / gpp, &lo, &hi);
                ranges_ok &= lo == slo[vs] && hi == shi[vs];
                own += d + e;
            }
        }
        CHECK_R(ranges_ok, "plan's stage (chunk) ranges are pp_stage_ranges' and pp_own_chunk_range's", RANK);
        const double held = (double)pp_held_floats(ps.pp), copy = plan_pp_tied_copy(&mc, gpp, PLAN_PP_STAGE_LOCAL, stage);
        CHECK_R(held == own + copy && (double)os.n == own,
                "stage %d holds %.0f floats (plan %.0f + tied copy %.0f), moments over %zu (plan %.0f)", RANK, stage,
                held, own, copy, os.n, own);
        CHECK_R(!mc.tie_word_embeddings || stage != gpp - 1 || copy > 0, "a tied last stage holds the copy", RANK);
        if (stage == pr.fullest_stage) { /* plan_compute's per-rank figures are this stage's */
            /* the activation slots the schedule allocated (pp_slots_needed's count per chunk × the
             * chunk's arena) against plan's: exact, the same arena layout */
            const double slots = pp_slots_bytes(ps.pp);
            const double e1 = rel(held * 4, pr.weights), e2 = rel((double)os.n * 8, pr.moments);
            worst_mem = fmax(e1, e2);
            CHECK_R(e1 < 0.10 && e2 < 0.10 && pr.grads == pr.weights && slots == pr.acts,
                    "fullest stage %d: held %.0f B (plan %.0f), moments %.0f B (plan %.0f), activation slots %.0f B "
                    "(plan %.0f)", RANK, stage, held * 4, pr.weights, (double)os.n * 8, pr.moments, slots, pr.acts);
            if (sp_rank == 0 && g->dp_rank == 0)
                printf("  fullest stage %d: parameters held %.0f B (plan %.0f), moments %.0f B (plan %.0f), "
                       "activation slots %.0f B (plan %.0f)\n", stage, held * 4, pr.weights, (double)os.n * 8,
                       pr.moments, slots, pr.acts);
        }
        /* the schedule's micro-batches and bubble theory are plan's */
        const pp_stats *pst = pp_last_stats(ps.pp);
        CHECK_R(pst->microbatches == pr.micro_batches && rel(pst->theory_interleaved, pr.bubble_theory) < 1e-12,
                "pipeline: %d micro-batches (plan %d), bubble theory %.4f (plan %.4f)", RANK, pst->microbatches,
                pr.micro_batches, pst->theory_interleaved, pr.bubble_theory);
    } else {
        const double e1 = rel((double)m.n_params * 4, pr.weights);
        worst_mem = e1;
        CHECK_R(e1 < 0.10, "parameters on the rank %.0f B, plan %.0f B", RANK, (double)m.n_params * 4, pr.weights);
        if (RANK == 0) printf("  parameters on rank 0: %.0f B (plan %.0f)\n", (double)m.n_params * 4, pr.weights);
    }
    if (ps.pp) { /* plan's stage cut is moerl's */
        double d, e;
        int l0, l1, lo, hi;
        MOERL_ASSERT(plan_pp_chunk_params(&mc, gpp, gv, PLAN_PP_STAGE_LOCAL, stage, 0, &d, &e, &l0, &l1) == MOERL_OK);
        pp_stage_layers(ps.pp, &lo, &hi); /* chunk 0's */
        CHECK_R(l0 == lo && l1 == hi, "stage %d: plan's layers [%d, %d), the pipeline's [%d, %d)", RANK, stage, l0, l1,
                lo, hi);
    }
    if (RANK == 0) printf("fsdp %d ep %d sp %d pp %d (v %d) over %d ranks: traffic %s, memory within %.1f%%\n", gfsdp,
                          gep, gsp, gpp, gv, T, traffic_ok ? "equal" : "DIFFERENT", 100 * worst_mem);
    dist_reducer_free(red);
    model_acts_free(&acts);
    memset(&kl_T.acts, 0, sizeof kl_T.acts); /* the actor's arena, freed just above */
    trainer_unshard_ref(&kl_T); /* before the actor's runtime: its strategies borrow ps's grid */
    trainer_free(&kl_T);
    adamw_free(&os);
    par_state_free(&ps);
    model_free(&m);
    cfg_free(kc);
    return dist_test_finish(g_ctx);
}
