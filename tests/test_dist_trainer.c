/* The RL trainer's aggregation is split-invariant: trainer_update over a fixed step of GRPO groups
 * gives the same weights after K AdamW steps whether the mini-batch runs as one micro-batch on one
 * rank (the reference), as many small micro-batches, or split over the data-parallel trainer ranks
 * (under mpirun; in one process only the micro-batch split runs). Checked for every
 * actor.loss_agg_mode, for REINFORCE++'s batch whitening, with DAPO's overlong filter, with
 * multi-turn loss masks (inserted tool-turn tokens counted nowhere, recomputed old logprobs and
 * sequence-level rollout IS over the sampled tokens only), with rollout rejection sampling (the
 * rejected tokens leave every rank's normalisation alike; its metrics and the mismatch metrics, summed
 * and maxed over the ranks, equal DP=1's), and with a
 * large router_aux_loss_coef, and for GSPO (actor.policy_loss.loss_mode=gspo: each sequence's ratio is
 * the exp of the mean log ratio over its whole response, so a sequence must never be split; with
 * --fsdp F / --ep E / --pp P / --tp T under mpirun only the GSPO variants run, under that layout, against one
 * rank; the GSPO weights are required to differ from vanilla PPO's, so the checks can tell); HF's
 * load-balancing loss is defined over all tokens of the batch, so
 * the trainer sums routing counts over micro-batches and ranks before forming it (a loss formed per
 * micro-batch or per rank differs from the reference by far more than the tolerance — checked by hand
 * when this test was written).
 * Groups: generated once by a rollouter from a tiny random model (same seeds on every rank, so
 * every rank holds the same groups). Usage: test_dist_trainer [--fsdp F] [--ep E] [--pp P] [--tp T [--sp]] [--etp 1]
 * (every rank is a trainer; --tp 2 --ep 2 --etp 1: TP × EP with the experts whole). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "data/dataset.h"
#include "data/tasks.h"
#include "dist/dist.h"
#include "model/model.h"
#include "parallel/parallel.h"
#include "rl/queue.h"
#include "rl/rl.h"
#include "rl_fixture.h"
#include "test.h"

#define K_STEPS 3
#define N_GROUPS 6

static dist_ctx *g_ctx;
static char g_dir[4096];
static dataset g_train;
static train_stats g_st; /* the last step's statistics of the last train() */


static rl_config base_config(void) {
    rl_config c = rl_test_config();
    c.max_response_length = 12;
    c.max_num_seqs = 32;
    c.max_num_batched_tokens = 512;
    c.ppo_mini_batch_size = 3; /* two mini-batches of three groups per step */
    c.require_batches = 2;
    c.optim.lr = 3e-3f;
    c.optim.beta2 = 0.95f;
    c.staleness_threshold = 1.0;
    c.seed = 9;
    return c;
}

/* N_GROUPS groups sampled from the model (identical on every rank: same weights and seeds). */
static void make_groups(const moe_model *m, const rl_config *c, rl_group **gs) {
    rl_queue q;
    rl_queue_init(&q, 64);
    rollouter R;
    MOERL_ASSERT(rollouter_init(&R, c, fx_budget(c), &g_train, m, &q, N_GROUPS) == MOERL_OK);
    R.budget.max_required_samples = 64;
    while (rl_queue_size(&q) < N_GROUPS) MOERL_ASSERT(rollouter_tick(&R) >= 0);
    MOERL_ASSERT(rl_queue_try_get_n(&q, (void **)gs, N_GROUPS) == N_GROUPS);
    rollouter_free(&R);
    rl_queue_destroy(&q);
}

/* The trainer's model-parallel runtime as rl_run_dist's trainer_par_setup builds it (pc: the layout):
 * this rank's data shard *me of *D, and a DP reducer unless the strategy sums its gradients itself. */
static void par_setup(trainer *T, moe_model *m, const rl_config *c, const par_config *layout, int *D, int *me) {
    T->dist = g_ctx;
    T->par = xcalloc(1, sizeof *T->par);
    par_config pc = *layout;
    pc.max_tokens = c->ppo_max_token_len;
    CHECK(par_state_init_cfg(T->par, g_ctx, &pc, m) == MOERL_OK, "par_state_init_cfg: %s", moerl_last_error());
    par_adamw_shard(T->par, m, &T->opt);
    const int rows = par_acts_rows(T->par, c->ppo_max_token_len);
    if (rows != c->ppo_max_token_len || m->cfg.exec.tp_sp) { /* Megatron SP: the arena holds a rank's rows */
        model_acts_free(&T->acts);
        MOERL_ASSERT(model_acts_init_rows(&T->acts, m, rows, c->ppo_max_token_len) == MOERL_OK);
    }
    T->acts.par = par_active(T->par) ? T->par : NULL;
    par_data_shard(T->par, me, D);
    T->replication = g_ctx->trainer_size / *D;
    if (!par_grads_self_reduced(T->par)) {
        const par_grid *g = T->par->grid;
        T->reducer = g ? dist_reducer_new_on(g_ctx, g->stage_comm, m, 0.01, DIST_OVERLAP_THREAD)
                       : dist_reducer_new(g_ctx, m, 0.01, DIST_OVERLAP_THREAD);
        MOERL_ASSERT(T->reducer != NULL);
    }
}

/* K steps of trainer_update on the groups; with ranks > 1 each mini-batch is split as the job
 * splits it and only this rank's share is passed. layout (NULL: none) runs the steps under that
 * model-parallel layout; afterwards m holds the whole model on every rank. */
static void train_on(moe_model *m, const rl_config *c, rl_group **gs, int data_parallel, const par_config *layout,
                     double *loss) {
    trainer T;
    MOERL_ASSERT(trainer_init(&T, c, &g_train, m) == MOERL_OK);
    int D = data_parallel ? g_ctx->trainer_size : 1, me = data_parallel ? g_ctx->trainer_rank : 0;
    if (layout) par_setup(&T, m, c, layout, &D, &me);
    else if (data_parallel) {
        T.dist = g_ctx;
        T.reducer = dist_reducer_new(g_ctx, m, 0.01, DIST_OVERLAP_THREAD);
        MOERL_ASSERT(T.reducer != NULL);
    }
    const int mb = c->ppo_mini_batch_size, nmb = N_GROUPS / mb;
    for (int k = 0; k < K_STEPS; k++) {
        rl_minibatch mbs[N_GROUPS];
        rl_group *mine[N_GROUPS];
        int n_mine = 0;
        for (int b = 0; b < nmb; b++) {
            int owner[N_GROUPS];
            rl_split_minibatch(gs + b * mb, mb, D, owner);
            mbs[b] = (rl_minibatch){0};
            for (int g = b * mb; g < (b + 1) * mb; g++) {
                mbs[b].resp_tokens += rl_group_resp_tokens(gs[g]);
                mbs[b].tokens += rl_group_tokens(gs[g]);
                if (owner[g - b * mb] == me) {
                    mine[n_mine++] = gs[g];
                    mbs[b].n_groups++;
                }
            }
        }
        train_stats st;
        memset(&st, 0, sizeof st);
        CHECK(trainer_update(&T, mine, mbs, nmb, &st) == MOERL_OK, "trainer_update: %s", moerl_last_error());
        loss[k] = st.pg_loss + st.aux_loss;
        g_st = st;
    }
    if (T.reducer) dist_reducer_free(T.reducer);
    T.reducer = NULL;
    if (T.par) {
        trainer_unshard_ref(&T);
        par_state_free(T.par); /* the whole model back in m */
        free(T.par);
        T.par = NULL;
    }
    trainer_free(&T);
}

static void train(moe_model *m, const rl_config *c, rl_group **gs, int data_parallel, double *loss) {
    train_on(m, c, gs, data_parallel, NULL, loss);
}

typedef struct {
    const char *name;
    loss_agg_mode agg;
    rl_adv_estimator est;
    int overlong_filter;
    int multi_turn; /* out_mask with inserted runs (logprob 0), recompute_old and sequence-level rollout IS */
    const char *rs, *rs_threshold; /* rollout_rs (recompute_old, behaviour logprobs perturbed), or NULL */
    int gspo;                      /* actor.policy_loss.loss_mode=gspo (the sequence ratio); 2: every third
                                      response cut to 5 tokens (stopped) */
} variant;

/* Responses as multi-turn trajectories: tokens 2..4 of every response of 3 or more tokens inserted
 * (out_mask 0, behaviour logprob 0, as engine_continue writes them), every third response without a
 * mask (built outside the engine: all sampled). */
static void add_tool_turns(rl_group **gs) {
    for (int g = 0; g < N_GROUPS; g++)
        for (int j = 0; j < gs[g]->n; j++) {
            gen_request *r = &gs[g]->reqs[j];
            if ((g * gs[g]->n + j) % 3 == 2) { /* no mask: all sampled */
                free(r->out_mask);
                r->out_mask = NULL;
                continue;
            }
            if (!r->out_mask) r->out_mask = xmalloc((size_t)r->n_out + 1); /* else the engine's (≥ n_out) */
            for (int t = 0; t < r->n_out; t++) {
                r->out_mask[t] = !(r->n_out >= 3 && t >= 2 && t <= 4);
                if (!r->out_mask[t]) r->out_logprobs[t] = 0.0f;
            }
        }
}

/* GSPO at the clip range of the PPO tests (0.2 / 0.28) rather than its own 3e-4 / 4e-4, so that few
 * sequences are clipped and the updates move the weights: the comparisons below then see the whole
 * sequence-ratio gradient, not mostly zeros. */
static void gspo_config(rl_config *c) {
    c->loss_mode = POLICY_LOSS_GSPO;
    c->ppo.clip_ratio_low = 0.2f;
    c->ppo.clip_ratio_high = 0.28f;
}

/* --fsdp F --ep E --pp P --tp T [--sp] (mpirun): the layout under which the GSPO variants run against DP=1
 * (--sp: actor.megatron.sequence_parallel on the TP group). */
static int parse_layout(int argc, char **argv, par_config *pc) {
    *pc = (par_config){.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                       .pipeline_parallel_size = 1, .dispatcher = MOE_DISPATCH_AUTO, .alltoall_max_ep = 16,
                       .capacity_factor = 1.25};
    int on = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sp")) { /* Megatron sequence parallelism on the TP group (with --tp) */
            pc->sequence_parallel = 1;
            continue;
        }
        const int v = i + 1 < argc ? atoi(argv[i + 1]) : 0;
        if (!strcmp(argv[i], "--fsdp")) pc->fsdp_size = v;
        else if (!strcmp(argv[i], "--ep")) pc->expert_parallel_size = v;
        else if (!strcmp(argv[i], "--pp")) pc->pipeline_parallel_size = v;
        else if (!strcmp(argv[i], "--tp")) pc->tensor_model_parallel_size = v;
        else if (!strcmp(argv[i], "--etp")) pc->expert_tensor_parallel_size = v; /* 1: experts whole (TP × EP) */
        else {
            fprintf(stderr, "usage: test_dist_trainer [--fsdp F] [--ep E] [--pp P] [--tp T [--sp]] [--etp 1]\n");
            exit(2);
        }
        if (v < 1) {
            fprintf(stderr, "test_dist_trainer: %s %s: expected a size >= 1\n", argv[i], argv[i + 1]);
            exit(2);
        }
        on |= v > 1;
        i++;
    }
    return on;
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_trainer: %s\n", moerl_last_error());
        return 1;
    }
    par_config layout;
    const int layout_on = parse_layout(argc, argv, &layout);
    const char *base = getenv("MOERL_TESTDATA");
    if (!base || !base[0]) base = "/tmp";
    MOERL_ASSERT(moerl_mkdirs(base) == MOERL_OK);
    snprintf(g_dir, sizeof g_dir, "%s/test_dist_trainer_XXXXXX", base);
    MOERL_ASSERT(mkdtemp(g_dir) != NULL);
    char tr[4200], te[4200];
    snprintf(tr, sizeof tr, "%s/train.jsonl", g_dir);
    snprintf(te, sizeof te, "%s/test.jsonl", g_dir);
    task_opts o;
    task_opts_default(&o);
    o.n_train = 16;
    o.n_test = 2;
    o.seed = 3;
    MOERL_ASSERT(task_generate("arith", &o, tr, te) == MOERL_OK);
    MOERL_ASSERT(dataset_load(&g_train, tr) == MOERL_OK);
    const variant vs[] = {{"token-mean", LOSS_AGG_TOKEN_MEAN, RL_ADV_GRPO, 0, 0, NULL, NULL, 0},
                          {"seq-mean-token-sum", LOSS_AGG_SEQ_MEAN_TOKEN_SUM, RL_ADV_GRPO, 0, 0, NULL, NULL, 0},
                          {"seq-mean-token-mean", LOSS_AGG_SEQ_MEAN_TOKEN_MEAN, RL_ADV_GRPO, 0, 0, NULL, NULL, 0},
                          {"seq-mean-token-sum-norm", LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM, RL_ADV_GRPO, 0, 0, NULL, NULL, 0},
                          {"reinforce++ baseline", LOSS_AGG_TOKEN_MEAN, RL_ADV_REINFORCE_PP_BASELINE, 0, 0, NULL, NULL, 0},
                          {"overlong filter", LOSS_AGG_SEQ_MEAN_TOKEN_MEAN, RL_ADV_GRPO, 1, 0, NULL, NULL, 0},
                          {"multi-turn mask, token-mean", LOSS_AGG_TOKEN_MEAN, RL_ADV_GRPO, 0, 1, NULL, NULL, 0},
                          {"multi-turn mask, seq-mean-token-mean + reinforce++", LOSS_AGG_SEQ_MEAN_TOKEN_MEAN,
                           RL_ADV_REINFORCE_PP_BASELINE, 0, 1, NULL, NULL, 0},
                          {"rollout_rs token_k1 + seq_max_k2, multi-turn, seq-mean-token-mean",
                           LOSS_AGG_SEQ_MEAN_TOKEN_MEAN, RL_ADV_GRPO, 0, 1, "token_k1,seq_max_k2", "0.8_1.25,0.1", 0},
                          {"rollout_rs seq_mean_k1 (geometric), token-mean + reinforce++", LOSS_AGG_TOKEN_MEAN,
                           RL_ADV_REINFORCE_PP_BASELINE, 0, 0, "seq_mean_k1", "0.95_1.05", 0},
                          {"gspo", LOSS_AGG_TOKEN_MEAN, RL_ADV_GRPO, 0, 0, NULL, NULL, 1},
                          {"gspo, responses of unequal lengths", LOSS_AGG_TOKEN_MEAN, RL_ADV_GRPO, 0, 0, NULL, NULL, 2}};
    const int D = g_ctx->trainer_size;
    for (size_t v = 0; v < sizeof vs / sizeof *vs; v++) {
        if (layout_on && !vs[v].gspo) continue; /* a layout run checks GSPO (the other modes: their own tests) */
        /* a large aux coefficient, so that a per-micro-batch or per-rank aux would show */
        moe_model m0;
        rl_tiny_model(&m0, 23, 0.5f);
        rl_config c = base_config();
        c.loss_agg = vs[v].agg;
        c.adv_estimator = vs[v].est;
        c.overlong_filter = vs[v].overlong_filter;
        if (vs[v].gspo) gspo_config(&c);
        rl_group *gs[N_GROUPS];
        if (vs[v].multi_turn) {
            c.recompute_old = 1;
            c.rollout_is = ROLLOUT_IS_SEQUENCE;
            c.rollout_is_threshold = 2.0f;
        }
        if (vs[v].rs) {
            c.recompute_old = 1;
            MOERL_ASSERT(rollout_rs_parse(vs[v].rs, vs[v].rs_threshold, &c.rollout_rs) == MOERL_OK);
        }
        make_groups(&m0, &c, gs);
        if (vs[v].multi_turn) add_tool_turns(gs);
        if (vs[v].rs) /* a deterministic mismatch (the same on every rank), so that some tokens are rejected */
            for (int g = 0; g < N_GROUPS; g++)
                for (int j = 0; j < gs[g]->n; j++)
                    for (int t = 0; t < gs[g]->reqs[j].n_out; t++)
                        gs[g]->reqs[j].out_logprobs[t] += 0.3f * sinf((float)(7 * g + 3 * j + 5 * t));
        /* scores that differ within each group (a random model answers nothing right: all 0, so every
         * advantage would be 0 and only the aux loss would move the weights) */
        for (int g = 0; g < N_GROUPS; g++)
            for (int j = 0; j < gs[g]->n; j++) gs[g]->rewards[j].score = (double)((g + 2 * j) % 3);
        if (vs[v].gspo) /* behaviour logprobs off the policy's (the same on every rank): ratios away from 1, so
                         * the sequence ratio (GSPO) and the token ratios (vanilla) give other updates */
            for (int g = 0; g < N_GROUPS; g++)
                for (int j = 0; j < gs[g]->n; j++) {
                    gen_request *r = &gs[g]->reqs[j];
                    for (int t = 0; t < r->n_out; t++) r->out_logprobs[t] += 0.3f * sinf((float)(5 * g + 3 * j + 7 * t));
                    if (vs[v].gspo == 2 && (g * gs[g]->n + j) % 3 == 0 && r->n_out > 5) {
                        r->n_out = 5;
                        r->finish = FINISH_STOP;
                    }
                }
        if (c.overlong_filter) /* random weights rarely stop early: let every other response have stopped */
            for (int g = 0; g < N_GROUPS; g++)
                for (int j = 1; j < gs[g]->n; j += 2) gs[g]->reqs[j].finish = FINISH_STOP;
        moe_model ref, mic, dp;
        double l_ref[K_STEPS], l_mic[K_STEPS], l_dp[K_STEPS];
        MOERL_ASSERT(model_init(&ref, &m0.cfg) == MOERL_OK && model_init(&mic, &m0.cfg) == MOERL_OK &&
                     model_init(&dp, &m0.cfg) == MOERL_OK);
        memcpy(ref.params, m0.params, m0.n_params * sizeof(float));
        memcpy(mic.params, m0.params, m0.n_params * sizeof(float));
        memcpy(dp.params, m0.params, m0.n_params * sizeof(float));
        train(&ref, &c, gs, 0, l_ref);
        const train_stats st_ref = g_st;
        const int n_rs = rollout_rs_metrics(&c.rollout_rs, NULL, NULL, NULL);
        if (vs[v].rs)
            CHECK(st_ref.rs_steps == 1 && st_ref.rs_vals[n_rs - 2] > 0.02 && st_ref.rs_vals[n_rs - 2] < 0.9,
                  "%s: rejected share %g (the fixture must reject some tokens, not all)", vs[v].name,
                  st_ref.rs_vals[n_rs - 2]);
        if (layout_on) { /* GSPO under the layout: every sequence's ratio from its whole response */
            train_on(&dp, &c, gs, 1, &layout, l_dp);
            char what[200];
            snprintf(what, sizeof what, "%s: fsdp %d ep %d pp %d tp %d (%d ranks) weights vs one rank", vs[v].name,
                     layout.fsdp_size, layout.expert_parallel_size, layout.pipeline_parallel_size,
                     layout.tensor_model_parallel_size, D);
            t_close(what, dp.params, ref.params, (long)ref.n_params, 5e-5f, 1e-4f); /* as the DP check below */
            float d_moved = 0;
            for (size_t i = 0; i < m0.n_params; i++) d_moved = fmaxf(d_moved, fabsf(ref.params[i] - m0.params[i]));
            CHECK(d_moved > 1e-3f, "%s: the updates moved the weights by at most %g: the comparison is vacuous",
                  vs[v].name, (double)d_moved);
            goto next;
        }
        if (vs[v].gspo) { /* the sequence ratio matters: the token ratio (vanilla) ends elsewhere */
            moe_model van;
            double l_van[K_STEPS];
            MOERL_ASSERT(model_init(&van, &m0.cfg) == MOERL_OK);
            memcpy(van.params, m0.params, m0.n_params * sizeof(float));
            rl_config cv = c;
            cv.loss_mode = POLICY_LOSS_VANILLA;
            train(&van, &cv, gs, 0, l_van);
            float dv = 0, dm = 0;
            for (size_t i = 0; i < m0.n_params; i++) dv = fmaxf(dv, fabsf(van.params[i] - ref.params[i]));
            for (size_t i = 0; i < m0.n_params; i++) dm = fmaxf(dm, fabsf(m0.params[i] - ref.params[i]));
            printf("%s: max |weight change| %.3g, max |GSPO - vanilla| %.3g\n", vs[v].name, (double)dm, (double)dv);
            CHECK(dv > 1e-3f, "%s: vanilla PPO ends within %g of GSPO: the equivalence checks could not tell them apart",
                  vs[v].name, (double)dv);
            model_free(&van);
        }
        { /* the policy gradient takes part: every score negated (advantages flipped) ends elsewhere */
            moe_model flip;
            double l_flip[K_STEPS];
            MOERL_ASSERT(model_init(&flip, &m0.cfg) == MOERL_OK);
            memcpy(flip.params, m0.params, m0.n_params * sizeof(float));
            for (int g = 0; g < N_GROUPS; g++)
                for (int j = 0; j < gs[g]->n; j++) gs[g]->rewards[j].score = -gs[g]->rewards[j].score;
            train(&flip, &c, gs, 0, l_flip);
            for (int g = 0; g < N_GROUPS; g++)
                for (int j = 0; j < gs[g]->n; j++) gs[g]->rewards[j].score = -gs[g]->rewards[j].score;
            float df = 0;
            for (size_t i = 0; i < m0.n_params; i++) df = fmaxf(df, fabsf(flip.params[i] - ref.params[i]));
            CHECK(df > 1e-3f, "%s: negated scores end within %g of the run: the advantages do not reach the update",
                  vs[v].name, (double)df);
            model_free(&flip);
        }
        rl_config cm = c;
        cm.ppo_max_token_len = 64; /* one or two sequences per micro-batch */
        train(&mic, &cm, gs, 0, l_mic);
        /* fp32 sums in another order (micro-batches, ranks) change gradients by ~1e-7 relative; AdamW
         * turns that into weight differences far below lr (observed ≤ 3e-6 after 3 steps at lr 3e-3).
         * atol 5e-5 (≈ lr/60) + rtol 1e-4 on weights of scale 0.02 leaves a margin; an aux loss formed
         * per micro-batch moves router weights by ~lr, well beyond it. */
        char what[160];
        snprintf(what, sizeof what, "%s: micro-batched weights vs one micro-batch", vs[v].name);
        t_close(what, mic.params, ref.params, (long)ref.n_params, 5e-5f, 1e-4f);
        float lr32[K_STEPS], lm32[K_STEPS], ld32[K_STEPS];
        for (int k = 0; k < K_STEPS; k++) {
            lr32[k] = (float)l_ref[k];
            lm32[k] = (float)l_mic[k];
        }
        snprintf(what, sizeof what, "%s: micro-batched pg_loss + aux vs one micro-batch", vs[v].name);
        t_close(what, lm32, lr32, K_STEPS, 1e-6f, 1e-5f); /* summation order only */
        if (D > 1) {
            train(&dp, &c, gs, 1, l_dp);
            for (int k = 0; k < K_STEPS; k++) ld32[k] = (float)l_dp[k];
            snprintf(what, sizeof what, "%s: DP=%d weights vs DP=1", vs[v].name, D);
            t_close(what, dp.params, ref.params, (long)ref.n_params, 5e-5f, 1e-4f); /* as above */
            snprintf(what, sizeof what, "%s: DP=%d pg_loss + aux vs DP=1", vs[v].name, D);
            t_close(what, ld32, lr32, K_STEPS, 1e-6f, 1e-5f);
            if (c.recompute_old) { /* the last step's rollout-correction metrics, reduced over the ranks */
                float got[4 + ROLLOUT_RS_MAX_METRICS + OFFPOLICY_N_METRICS],
                    want[4 + ROLLOUT_RS_MAX_METRICS + OFFPOLICY_N_METRICS];
                const double g4[4] = {g_st.probs_diff_max, g_st.probs_diff_mean, g_st.probs_diff_std, g_st.probs_pearson},
                             w4[4] = {st_ref.probs_diff_max, st_ref.probs_diff_mean, st_ref.probs_diff_std,
                                      st_ref.probs_pearson};
                for (int k = 0; k < 4; k++) {
                    got[k] = (float)g4[k];
                    want[k] = (float)w4[k];
                }
                for (int k = 0; k < n_rs; k++) {
                    got[4 + k] = (float)g_st.rs_vals[k];
                    want[4 + k] = (float)st_ref.rs_vals[k];
                }
                for (int k = 0; k < OFFPOLICY_N_METRICS; k++) {
                    got[4 + n_rs + k] = (float)g_st.offpolicy_vals[k];
                    want[4 + n_rs + k] = (float)st_ref.offpolicy_vals[k];
                }
                /* weights agree to ~1e-6 after two AdamW steps (above), so the recomputed logprobs of the
                 * last step do too: 1e-4 relative + 1e-5; counts and shares are exact unless a token sits
                 * on a bound (the fixture's perturbation keeps them ≥ 0.01 away) */
                snprintf(what, sizeof what, "%s: DP=%d mismatch and rollout_rs metrics vs DP=1", vs[v].name, D);
                t_close(what, got, want, 4 + n_rs + OFFPOLICY_N_METRICS, 1e-5f, 1e-4f);
            }
        }
    next:
        for (int g = 0; g < N_GROUPS; g++) rl_group_free(gs[g]);
        model_free(&ref);
        model_free(&mic);
        model_free(&dp);
        model_free(&m0);
    }
    dataset_free(&g_train);
    unlink(tr);
    unlink(te);
    rmdir(g_dir);
    /* one count for the job: failures summed over the ranks, checks counted on rank 0 */
    double f = t_failed;
    MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, &f, 1) == MOERL_OK);
    if (g_ctx->trainer_rank == 0) printf("%d passed, %d failed\n", t_passed, (int)f);
    const int rc = f > 0;
    dist_finalize(g_ctx);
    return rc;
}
