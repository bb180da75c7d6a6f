/* The checked set-up of `moerl rl` for the embedded and the MPI job (see job_prepare.h). */
#include "parallel/tp.h"
#include "rl/job_prepare.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "base/signals.h"
#include "model/model_config.h"
#include "dist/compress.h"
#include "parallel/grid.h"
#include "rl/run_dir.h"
#include "rl/sft_job.h"
#include "rollout/engine.h"

/* A failure of this rank after the folder may exist: remove what the set-up made. Under mpirun the
 * caller then ends every rank. */
static rl_job_status job_fail(rl_job *J) {
    rl_job_abandon(J);
    return J->dist ? RL_JOB_ABORT : RL_JOB_FAILED;
}

/* The ranks against trainer.n_ranks (and, under mpirun, the roles split and named). */
static rl_job_status prepare_ranks(rl_job *J) {
    rl_config *rc = J->rc;
    dist_ctx *ctx = J->ctx;
    if (!J->dist) {
        J->leader = 1;
        if (rc->n_trainer_ranks != 1) {
            moerl_errorf("trainer.n_ranks=%d needs %d trainer processes plus rollout processes, but this is a single "
                         "process (%s backend): run under mpirun with build/moerl-mpi, e.g. `mpirun -np %d "
                         "build/moerl-mpi rl ... trainer.n_ranks=%d` for one rollout rank",
                         rc->n_trainer_ranks, rc->n_trainer_ranks, dist_backend_name(), rc->n_trainer_ranks + 1,
                         rc->n_trainer_ranks);
            return RL_JOB_FAILED;
        }
        if (rc->rollout_tp > 1) {
            moerl_errorf("rollout.tensor_model_parallel_size=%d splits one engine replica over rollout ranks, and one "
                         "process has none: run under mpirun with build/moerl-mpi and at least %d rollout ranks",
                         rc->rollout_tp, rc->rollout_tp);
            return RL_JOB_FAILED;
        }
        if (rc->rollout_ep > 1) {
            moerl_errorf("rollout.expert_parallel_size=%d splits the engine's experts over rollout ranks, and one "
                         "process has none: run under mpirun with build/moerl-mpi and at least %d rollout ranks",
                         rc->rollout_ep, rc->rollout_ep);
            return RL_JOB_FAILED;
        }
        return RL_JOB_READY;
    }
    const int P = ctx->world_size;
    if (rc->n_trainer_ranks > P - 1) { /* identical on every rank: rank 0 reports, all return */
        moerl_errorf("trainer.n_ranks=%d leaves no rollout rank in a world of %d processes (mpirun -np %d): use 1 ≤ "
                     "trainer.n_ranks ≤ %d", rc->n_trainer_ranks, P, P, P - 1);
        return RL_JOB_REFUSED;
    }
    if (rc->mode == RL_MODE_LOCKSTEP) {
        moerl_errorf("async_training.mode=lockstep runs in one process only; under mpirun use async or sync");
        return RL_JOB_REFUSED;
    }
    if (dist_split_roles(ctx, rc->n_trainer_ranks) != MOERL_OK) return RL_JOB_REFUSED;
    J->leader = J->speaker = ctx->trainer_rank == 0;
    log_set_rank(ctx->world_rank, J->leader); /* the leader prints the lines every rank logs alike */
    if (ctx->role == DIST_ROLE_ROLLOUT) snprintf(J->who, sizeof J->who, "rollout %d", ctx->world_rank);
    else snprintf(J->who, sizeof J->who, "trainer %d", ctx->trainer_rank);
    log_set_prefix(J->who);
    return RL_JOB_READY;
}

/* rollout.tensor_model_parallel_size = P against the rollout ranks, the model and the other rollout keys (the
 * engine's slice is tp_config_apply's with the experts split, engine_set_tp). */
int rl_check_rollout_tp(const rl_config *rc, const moe_config *mc, int n_rollout) {
    const int P = rc->rollout_tp, nkv = mc->num_key_value_heads;
    if (P <= 1) return MOERL_OK;
    if (n_rollout % P)
        return moerl_errorf("rollout.tensor_model_parallel_size=%d does not divide the %d rollout rank%s (mpirun -np "
                            "minus trainer.n_ranks)", P, n_rollout, moerl_plural(n_rollout));
    if (rc->rollout_ep > 1)
        return moerl_errorf("rollout.tensor_model_parallel_size=%d with rollout.expert_parallel_size=%d: a rollout "
                            "replica is either tensor- or expert-parallel in this build (set one of them to 1)", P,
                            rc->rollout_ep);
    if (rc->multi_turn.enable || rc->batch_invariant)
        return moerl_errorf("rollout.tensor_model_parallel_size=%d with %s: not combined in this build", P,
                            rc->multi_turn.enable ? "rollout.multi_turn.enable=true (every rank of a replica would "
                                                    "need the same tool answers)"
                                                  : "rollout.batch_invariant=true (the group's sums change the order)");
    const struct {
        int v, bad;
        const char *field;
    } div[] = {{mc->num_attention_heads, mc->num_attention_heads % P, "num_attention_heads"},
               {nkv, nkv < P ? P % nkv : nkv % P, "num_key_value_heads"},
               {mc->intermediate_size, mc->intermediate_size % P, "intermediate_size"},
               {mc->moe_intermediate_size, mc->num_experts > 0 && mc->moe_intermediate_size % P, "moe_intermediate_size"}};
    for (size_t i = 0; i < sizeof div / sizeof *div; i++)
        if (div[i].bad)
            return moerl_errorf("rollout.tensor_model_parallel_size=%d must divide the model's %s (%d)%s", P,
                                div[i].field, div[i].v,
                                i == 1 ? " or be a multiple of it (each key/value head then held by P / nkv ranks)" : "");
    moe_config lc = *mc; /* the model's execution switches (tp_config_apply refuses the MoE ablations) */
    if (tp_config_apply(&lc, P, 0, mc->num_experts > 0) != MOERL_OK)
        return moerl_error_prefix("rollout.tensor_model_parallel_size=%d: ", P);
    return MOERL_OK;
}

/* The layout against the ranks and the model: the same verdict on every rank (config, world size and
 * model shape only) — before any folder exists. */
static int check_layout(const rl_job *J) {
    const rl_config *rc = J->rc;
    const moe_config *mc = &J->m.cfg;
    const int n_rollout = J->ctx->n_rollout;
    if (par_check(&rc->par, rc->n_trainer_ranks, mc->num_experts, mc->num_attention_heads, mc->num_key_value_heads,
                  mc->num_hidden_layers) != MOERL_OK)
        return MOERL_ERR;
    const int tp = rc->par.tensor_model_parallel_size;
    if (tp > 1) { /* the model's sizes and switches against TP, as tp_state_attach checks them after the warm start */
        moe_config lc = *mc;
        if (tp_config_apply(&lc, tp, 0, rc->par.expert_tensor_parallel_size != 1 && mc->num_experts > 0) != MOERL_OK ||
            tp_check_recompute(&rc->par, mc) != MOERL_OK)
            return MOERL_ERR;
    }
    if (rc->rollout_ep > 1 && n_rollout % rc->rollout_ep)
        return moerl_errorf("rollout.expert_parallel_size=%d does not divide the %d rollout rank%s (mpirun -np "
                            "minus trainer.n_ranks)", rc->rollout_ep, n_rollout, moerl_plural(n_rollout));
    if (rc->rollout_ep > 1 && mc->num_experts % rc->rollout_ep)
        return moerl_errorf("rollout.expert_parallel_size=%d does not divide the model's %d experts", rc->rollout_ep,
                            mc->num_experts);
    return rl_check_rollout_tp(rc, mc, n_rollout);
}

/* Why the run evaluates on the held-out split (for data_check_keys), or NULL when it does not
 * (trainer.val_n = 0: neither the warm start nor RL evaluates there). */
const char *rl_why_test(const rl_config *rc, char *buf, size_t cap) {
    if (rc->val_n == 0) return NULL;
    snprintf(buf, cap, "trainer.val_n=%d evaluates on them", rc->val_n);
    return buf;
}

/* A check only the leader makes (the folder it alone writes: rl_check_out_dir, rl_check_resume_state) and
 * `refused` its verdict there. Under mpirun the ranks then agree on it (a sum over the world), so a refusal
 * is said once (by the leader, J->speaker) and every rank returns RL_JOB_REFUSED: exit 1 through
 * MPI_Finalize, no MPI_Abort and no rank's own copy of the message. One process: job_fail's. */
static rl_job_status leader_verdict(rl_job *J, int refused) {
    if (!J->dist) return refused ? job_fail(J) : RL_JOB_READY;
    double verdict = refused;
    if (dist_allreduce_sum(J->ctx, DIST_WORLD, &verdict, 1) != MOERL_OK) return job_fail(J);
    if (verdict == 0) return RL_JOB_READY;
    if (J->leader) { /* the others hold no staged data by then (prepare_data discards theirs) */
        char *msg = xstrdup(moerl_last_error());
        rl_job_abandon(J);
        moerl_errorf("%s", msg);
        free(msg);
    }
    return RL_JOB_REFUSED;
}

int rl_data_shards(const par_config *pc, int n_trainer_ranks) {
    const int per = MOERL_MAX(pc->pipeline_parallel_size, 1) * MOERL_MAX(pc->ulysses_sequence_parallel_size, 1) *
                    MOERL_MAX(pc->tensor_model_parallel_size, 1);
    return MOERL_MAX(n_trainer_ranks / per, 1);
}

void rl_warn_idle_shards(const par_config *pc, int n_trainer_ranks, int ppo_mini_batch_size) {
    const int D = rl_data_shards(pc, n_trainer_ranks), G = ppo_mini_batch_size;
    if (G < 1 || D <= G) return;
    const int64_t per = (int64_t)(n_trainer_ranks / D), bound = per * G; /* trainer ranks per shard */
    log_warn("trainer.n_ranks=%d makes %d data-parallel shard%s (%lld trainer rank%s each: "
             "actor.pipeline_parallel_size × actor.ulysses_sequence_parallel_size × "
             "actor.megatron.tensor_model_parallel_size), but a mini-batch has actor.ppo_mini_batch_size=%d GRPO group%s, each trained whole by one shard: %d shard%s "
             "get no data in any update; trainer.n_ranks ≤ %lld feeds every shard",
             n_trainer_ranks, D, moerl_plural(D), (long long)per, moerl_plural(per), G, moerl_plural(G), D - G, moerl_plural(D - G),
             (long long)bound);
}

/* Checks that write nothing, then the model. */
static rl_job_status prepare_checks(rl_job *J, const char *why) {
    const cfg *c = J->c;
    rl_config *rc = J->rc;
    rl_job_status s = leader_verdict(J, J->leader && rl_check_out_dir(c, rc) != MOERL_OK);
    if (s != RL_JOB_READY) return s;
    if (data_check_keys(c, why) != MOERL_OK) return job_fail(J);
    if (rc->grad_compression != GRAD_COMPRESSION_NONE && !J->dist)
        log_warn("actor.grad_compression=%s compresses the data-parallel gradient all-reduce, and a single-process "
                 "run has none: it has no effect here (it applies under mpirun with trainer.n_ranks ≥ 2)",
                 cfg_str(c, "actor.grad_compression"));
    else if (rc->grad_compression != GRAD_COMPRESSION_NONE && rc->n_trainer_ranks < 2 && J->leader)
        log_warn("actor.grad_compression=%s compresses the data-parallel gradient all-reduce, and trainer.n_ranks=1 "
                 "has none: it has no effect here", cfg_str(c, "actor.grad_compression"));
    if (model_build_from_keys(c, &J->m) != MOERL_OK || data_use_model_tokenizer(c, J->m.cfg.vocab_size) != MOERL_OK)
        return job_fail(J);
    if (J->dist && check_layout(J) != MOERL_OK) return RL_JOB_REFUSED;
    if (J->dist && J->leader) rl_warn_idle_shards(&rc->par, rc->n_trainer_ranks, rc->ppo_mini_batch_size);
    return RL_JOB_READY;
}

/* rollout.kv_cache_bytes against the longest request of each engine the run builds — the rollout's (the
 * training prompts), the SFT warm start's evals (its validation split, and the held-out split) and
 * validation's (the held-out split, when trainer.val_n evaluates) — each with data.max_response_length new
 * tokens: before the warm start or any rollout, the refusal engine_add would make later, with the numbers. */
static int check_kv_budgets(const rl_job *J) {
    const rl_config *rc = J->rc;
    const dataset *sets[3] = {&J->train, &J->val, rc->val_n != 0 ? &J->test : NULL};
    const char *engines[3] = {"the rollout engine", "the SFT warm start's evaluation",
                              "the held-out evaluation (validation, and the warm start's)"},
               *names[3] = {"the training data", "the warm start's validation split", "the held-out data"};
    for (int i = 0; i < 3; i++) {
        if (!sets[i] || dataset_count(sets[i]) == 0) continue;
        int longest;
        rl_prompt_lengths(sets[i], NULL, &longest);
        char what[800];
        snprintf(what, sizeof what, "%s, longest request: the longest prompt of %s (%d tokens) + data.max_response_length %d",
                 engines[i], sets[i]->path ? sets[i]->path : names[i], longest, rc->max_response_length);
        if (engine_check_kv_budget(&J->m.cfg, rc->block_size, rc->kv_cache_bytes,
                                   (int64_t)longest + rc->max_response_length, "rollout.kv_cache_bytes",
                                   what) != MOERL_OK)
            return MOERL_ERR;
    }
    return MOERL_OK;
}

/* The folder (the leader makes it before any rank writes data into it: moerl_outdir_abandon removes
 * only a folder this run created), the data and the checks on them. */
static rl_job_status prepare_data(rl_job *J, const char *why) {
    const cfg *c = J->c;
    rl_config *rc = J->rc;
    if (J->leader) {
        if (moerl_outdir_open(&J->od, rc->out_dir) != MOERL_OK) return job_fail(J);
        J->opened = 1; /* overwrite_output_dir: the previous run goes once every check passed (rl_write_outputs) */
    }
    if (J->dist && dist_barrier(J->ctx, DIST_WORLD) != MOERL_OK) return job_fail(J);
    if (data_prepare_staged(c, rc->out_dir, &J->train, &J->test, &J->staged) != MOERL_OK) return job_fail(J);
    if (!J->leader) { /* loaded: the leader alone keeps the files, once checked (data/ is the leader's to remove) */
        J->staged.data_dir[0] = 0;
        data_staged_discard(&J->staged);
    }
    if (data_check_held_out_rows(c, &J->test, why) != MOERL_OK) return job_fail(J);
    if (J->leader && rc->val_n > 0 && rc->val_n > dataset_count(&J->test))
        log_warn("trainer.val_n=%d, but the held-out split (%s) has %lld row%s: each evaluation uses all %lld",
                 rc->val_n, J->test.path ? J->test.path : "data.val_files", (long long)dataset_count(&J->test),
                 moerl_plural((int)dataset_count(&J->test)), (long long)dataset_count(&J->test));
    if (multi_turn_attach_tools(&rc->multi_turn, &J->train) != MOERL_OK ||
        multi_turn_attach_tools(&rc->multi_turn, &J->test) != MOERL_OK)
        return job_fail(J);
    if (sft_split_validation(c, &J->train, &J->val) != MOERL_OK) return job_fail(J);
    /* before the warm start; the same verdict on every rank (config and data); the context is the
     * rollout's (rollouter_init checks it again) */
    if (rl_check_update_sizes(rc, &J->train, 1) != MOERL_OK ||
        rl_check_context(&J->train, rc->max_response_length, J->m.cfg.max_position_embeddings, NULL) != MOERL_OK ||
        check_kv_budgets(J) != MOERL_OK) {
        if (!J->dist) return job_fail(J);
        char *msg = xstrdup(moerl_last_error()); /* said once by rank 0 after the folder is gone */
        dist_barrier(J->ctx, DIST_WORLD);         /* every rank is done writing the data before the folder goes, */
        rl_job_abandon(J);
        dist_barrier(J->ctx, DIST_WORLD); /* and it is gone before a rank exits (mpirun then ends the others) */
        moerl_errorf("%s", msg);
        free(msg);
        return RL_JOB_REFUSED;
    }
    /* every rank is done writing (and, but for the leader, removing) its staged data: a refused resume or a
     * warm start that fails can remove the folder, and the ranks the leader's abort ends leave no file behind */
    if (J->dist && dist_barrier(J->ctx, DIST_WORLD) != MOERL_OK) return job_fail(J);
    return leader_verdict(J, J->leader && rl_check_resume_state(c, rc, &J->train, &J->m) != MOERL_OK);
}

/* The leader: the run's outputs and the SFT warm start (rl_run_dist hands its weights to every rank).
 * Every check passed: only now does the folder change (data, config.yaml, run.log) — after the warm
 * start's own resume checks when it runs (rl_write_outputs). */
static rl_job_status prepare_warm_start(rl_job *J) {
    const cfg *c = J->c;
    rl_config *rc = J->rc;
    rl_outputs w = {.c = c, .out_dir = rc->out_dir, .staged = &J->staged,
                    .overwrite = cfg_bool(c, "trainer.overwrite_output_dir")};
    J->resuming = rl_run_dir_resuming(rc);
    if (J->resuming && rl_write_outputs(&w) != MOERL_OK) return job_fail(J);
    if (!J->resuming && (sft_warm_start(c, &J->m, &J->train, &J->val, &J->test, rc->out_dir, &J->sft_before,
                                        &J->sft_after, rl_write_outputs, &w) != MOERL_OK ||
                         rl_write_outputs(&w) != MOERL_OK)) {
        if (!J->dist) return job_fail(J);
        /* the other ranks wait in rl_run_dist for RL's START: BYE instead, then exit 1 (one message) */
        char *msg = xstrdup(moerl_last_error());
        rl_job_abandon(J);
        J->opened = 0;
        const int cancel = rl_run_dist_cancel(J->ctx);
        if (cancel == MOERL_OK) moerl_errorf("%s", msg);
        free(msg);
        return cancel == MOERL_OK ? RL_JOB_FAILED_OWN : RL_JOB_ABORT;
    }
    if (moerl_stop_requested()) {
        J->stop_signal = moerl_stop_requested();
        /* the other ranks wait in rl_run_dist for a START that will not come: BYE instead */
        if (J->dist && rl_run_dist_cancel(J->ctx) != MOERL_OK) return job_fail(J);
        return RL_JOB_STOPPED;
    }
    if (J->resuming && rl_restore_start_policy(c, &J->m, rc->out_dir) != MOERL_OK) return job_fail(J);
    return RL_JOB_READY;
}

rl_job_status rl_job_prepare(rl_job *J, const cfg *c, rl_config *rc, dist_ctx *ctx) {
    memset(J, 0, sizeof *J);
    J->c = c;
    J->rc = rc;
    J->ctx = ctx;
    J->dist = ctx && ctx->world_size > 1;
    J->sft_before = J->sft_after = NAN;
    J->speaker = !J->dist || ctx->world_rank == 0;
    char buf[96];
    const char *why = rl_why_test(rc, buf, sizeof buf);
    rl_job_status s = prepare_ranks(J);
    log_shared_begin(); /* every rank builds the same model and data: their notes and warnings said once */
    if (s == RL_JOB_READY) s = prepare_checks(J, why);
    if (s == RL_JOB_READY) s = prepare_data(J, why);
    log_shared_end();
    if (s != RL_JOB_READY) return s;
    /* every rank: a forwarded SIGTERM must not kill a rank before trainer rank 0 stops the job; Ctrl-C
     * from here on: a checkpoint (warm start or RL), then exit */
    moerl_install_stop_signals();
    return J->leader ? prepare_warm_start(J) : RL_JOB_READY;
}

void rl_job_abandon(rl_job *J) {
    data_staged_discard(&J->staged);
    if (J->opened) moerl_outdir_abandon(&J->od);
}

void rl_job_free(rl_job *J) {
    model_free(&J->m);
    dataset_free(&J->train);
    dataset_free(&J->test);
    dataset_free(&J->val);
}
