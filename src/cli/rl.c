/* moerl rl --config FILE [key=value ...] — the main job: (optional SFT warm start, then)
 * fully-asynchronous GRPO. Config keys follow verl's names (actor.*, rollout.*, async_training.*,
 * algorithm.*, trainer.*, data.*); see `moerl rl --help`.
 * One process (build/moerl, or build/moerl-mpi without mpirun): the embedded job (rl_run).
 * `mpirun -np N build/moerl-mpi rl ... trainer.n_ranks=T`: the last T ranks are the trainers (data
 * parallel, or the FSDP / expert / sequence / pipeline layout of the actor.* parallel keys,
 * src/parallel/grid.h), the other N−T rollout ranks (rl_run_dist); every rank builds the same model (random init
 * from model.seed, or model.path) and dataset, the SFT warm start runs on trainer rank 0 only, and
 * only trainer rank 0 writes the outputs and prints the result. An error on any rank after the
 * configuration is read ends every rank (dist_abort → MPI_Abort), naming the failing rank. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "dist/dist.h"
#include "rl/job_prepare.h"
#include "rl/rl.h"

/* The last line of `moerl rl` on stdout: one JSON object. "accuracy_sft" is null without a warm
 * start in this invocation; the held-out accuracies are null when trainer.val_n = 0 (not measured).
 * "tokens_per_s" = generated (rollout) tokens per second of wall time over the whole run. */
static json_t *rl_summary_json(const rl_config *rc, const rl_result *res, double sft_acc) {
    json_t *o = json_object();
    json_object_set_new(o, "accuracy_sft", cli_json_real(sft_acc));
    json_object_set_new(o, "accuracy_rl_start", rc->val_n != 0 ? cli_json_real(res->val_acc_start) : json_null());
    json_object_set_new(o, "accuracy_rl_end", rc->val_n != 0 ? cli_json_real(res->val_acc_end) : json_null());
    json_object_set_new(o, "steps", json_integer(res->steps));
    json_object_set_new(o, "final_version", json_integer(res->final_version));
    json_object_set_new(o, "wall_s", cli_json_real(res->wall_s));
    json_object_set_new(o, "prompts_per_s", cli_json_real(res->prompts_per_s));
    json_object_set_new(o, "tokens_per_s", cli_json_real(res->tokens_per_s));
    json_object_set_new(o, "tokens_generated", json_integer(res->tokens_generated));
    json_object_set_new(o, "max_staleness", json_integer(res->max_lag_seen));
    json_object_set_new(o, "trainer_idle_ratio", cli_json_real(res->trainer_idle_ratio));
    json_object_set_new(o, "rollouter_idle_ratio", cli_json_real(res->rollouter_idle_ratio));
    json_object_set_new(o, "output_dir", cli_json_text(rc->out_dir, strlen(rc->out_dir)));
    /* a run stopped by SIGINT/SIGTERM still prints its line: the signal and the step its checkpoint holds */
    json_object_set_new(o, "stopped_by_signal", res->stop_signal ? json_integer(res->stop_signal) : json_null());
    json_object_set_new(o, "checkpoint_step",
                        res->checkpoint_step >= 0 ? json_integer(res->checkpoint_step) : json_null());
    return o;
}

/* The last line under mpirun (world_size P), run finished or stopped by a signal: rl_summary_json's keys
 * and the ranks, the weight syncs (count; param_sync_s and weight_bcast_s the mean per sync) and the
 * gradient reduction not hidden behind backward (Σ over steps). */
static json_t *dist_summary_json(const rl_config *rc, const rl_result *res, double sft_acc, int P) {
    json_t *o = rl_summary_json(rc, res, sft_acc);
    json_object_set_new(o, "world_size", json_integer(P));
    json_object_set_new(o, "rollout_ranks", json_integer(res->rollout_ranks));
    json_object_set_new(o, "trainer_ranks", json_integer(res->trainer_ranks));
    json_object_set_new(o, "syncs", json_integer(res->syncs));
    json_object_set_new(o, "param_sync_s", cli_json_real(res->param_sync_s));
    json_object_set_new(o, "weight_bcast_s", cli_json_real(res->weight_bcast_s));
    json_object_set_new(o, "weight_bcast_bytes", json_integer(res->weight_bcast_bytes));
    json_object_set_new(o, "weight_bcast_GBps", cli_json_real(res->weight_bcast_gbps));
    json_object_set_new(o, "grad_reduce_exposed_s", cli_json_real(res->grad_reduce_exposed_s));
    return o;
}

/* The last line when a signal stopped the SFT warm start (RL did not start): the same keys, the RL
 * ones null or 0, "stopped_by_signal" set, "checkpoint_step" null (no RL checkpoint) and
 * "stopped_in": "sft_warm_start" (the warm start's checkpoint is in output_dir/sft_checkpoint). */
static json_t *rl_warm_start_stop_json(const rl_config *rc, int sig, double sft_acc) {
    rl_result res;
    memset(&res, 0, sizeof res);
    res.val_acc_start = res.val_acc_end = res.wall_s = res.prompts_per_s = res.tokens_per_s = NAN;
    res.trainer_idle_ratio = res.rollouter_idle_ratio = NAN;
    res.stop_signal = sig;
    res.checkpoint_step = -1;
    json_t *o = rl_summary_json(rc, &res, sft_acc);
    json_object_set_new(o, "stopped_in", json_string("sft_warm_start"));
    return o;
}

/* The line a run stopped by a signal leaves: how to resume, or that it cannot. */
static void rl_report_stop(const rl_result *res, const char *out_dir) {
    if (res->checkpoint_step >= 0)
        fprintf(stderr, "moerl rl: stopped by signal %d at step %lld; the checkpoint of step %lld is in %s/checkpoint: "
                        "rerun the same command (trainer.resume_mode=auto) to continue\n",
                res->stop_signal, (long long)res->steps, (long long)res->checkpoint_step, out_dir);
    else
        fprintf(stderr, "moerl rl: stopped by signal %d at step %lld; no checkpoint was written (trainer.save_freq=-1), "
                        "so this run cannot be resumed\n", res->stop_signal, (long long)res->steps);
}

/* The warm start was stopped by a signal (RL did not start): say how to continue, print the last line. */
static int report_warm_start_stop(const rl_job *J) {
    fprintf(stderr, "moerl rl: stopped by signal %d in the SFT warm start (its checkpoint is in %s/sft_checkpoint); "
                    "rerun the same command to continue\n", J->stop_signal, J->rc->out_dir);
    cli_print_json(rl_warm_start_stop_json(J->rc, J->stop_signal, J->sft_after), 6);
    return 128 + J->stop_signal;
}

/* The held-out accuracies of the embedded run, in one log line. */
static void log_accuracies(const rl_job *J, const rl_result *res) {
    const double sft0 = J->sft_before, sft1 = J->sft_after;
    if (J->rc->val_n == 0) return;
    if (!isfinite(res->val_acc_end)) { /* trainer.test_freq=-1: measured at the start only */
        if (isfinite(res->val_acc_start))
            log_info("held-out accuracy at the start: %.1f%% (trainer.test_freq=-1: not measured after it)",
                     100 * res->val_acc_start);
        return;
    }
    if (isfinite(sft0) && isfinite(sft1))
        log_info("held-out accuracy: start %.1f%% → SFT %.1f%% → RL %.1f%% (RL adds %+.1f points)", 100 * sft0,
                 100 * sft1, 100 * res->val_acc_end, 100 * (res->val_acc_end - sft1));
    else if (isfinite(sft0)) /* the warm start had nothing left to do: not measured now */
        log_info("held-out accuracy: start %.1f%% → RL %.1f%% (the SFT warm start's accuracy was not measured in this "
                 "run: it had already reached sft.total_training_steps)", 100 * sft0, 100 * res->val_acc_end);
    else if (!J->resuming)
        log_info("held-out accuracy: %.1f%% → %.1f%% (%+.1f points)", 100 * res->val_acc_start, 100 * res->val_acc_end,
                 100 * (res->val_acc_end - res->val_acc_start));
    else if (isfinite(res->val_acc_start))
        log_info("held-out accuracy: %.1f%% when resumed → %.1f%%", 100 * res->val_acc_start, 100 * res->val_acc_end);
    else
        log_info("held-out accuracy at the end: %.1f%%", 100 * res->val_acc_end);
}

/* The embedded job (one process): rl_run after the set-up. Returns the exit code. */
static int run_embedded(rl_job *J) {
    const rl_config *rc = J->rc;
    rl_result res;
    if (rl_run(rc, &J->m, &J->train, &J->test, &res) != MOERL_OK) {
        cli_print_error("rl", moerl_last_error());
        rl_job_abandon(J);
        return 1;
    }
    if (res.stop_signal) {
        rl_report_stop(&res, rc->out_dir);
        cli_print_json(rl_summary_json(rc, &res, J->sft_after), 6);
        return 128 + res.stop_signal;
    }
    log_info("RL done: %lld step%s, version %d, %.1f s, %.2f prompts/s, %.0f generated tokens/s (rollout output over "
             "the run), trainer idle %.2f, rollouter idle %.2f, max staleness %d",
             (long long)res.steps, moerl_plural(res.steps), res.final_version, res.wall_s, res.prompts_per_s,
             res.tokens_per_s, res.trainer_idle_ratio, res.rollouter_idle_ratio, res.max_lag_seen);
    log_accuracies(J, &res);
    cli_print_json(rl_summary_json(rc, &res, J->sft_after), 6);
    return 0;
}

/* The job across processes (world size > 1): rl_run_dist on every rank after the set-up; only trainer
 * rank 0 prints the result. Errors after the role split end every rank (dist_abort). */
static int run_distributed(rl_job *J) {
    const rl_config *rc = J->rc;
    dist_ctx *ctx = J->ctx;
    const int P = ctx->world_size;
    char err[1400];
    rl_result res;
    if (rl_run_dist(rc, ctx, &J->m, &J->train, &J->test, &res) != MOERL_OK) {
        snprintf(err, sizeof err, "moerl rl (%s): %s", J->who, moerl_last_error());
        rl_job_abandon(J);
        dist_abort(ctx, err);
    }
    if (!J->leader) return 0;
    if (res.stop_signal) {
        rl_report_stop(&res, rc->out_dir);
        cli_print_json(dist_summary_json(rc, &res, J->sft_after, P), 6);
        return 128 + res.stop_signal;
    }
    log_info("RL done on %d processes (%d rollout, %d trainer): %lld step%s, version %d, %.1f s, %.2f prompts/s, "
             "%.0f generated tokens/s (rollout output over the run), param sync %.4f s (broadcast %.4f s, "
             "%.3f GB/s), exposed gradient reduction %.3f s, trainer idle %.2f, rollouter idle %.2f, max "
             "staleness %d",
             P, res.rollout_ranks, res.trainer_ranks, (long long)res.steps, moerl_plural(res.steps), res.final_version,
             res.wall_s, res.prompts_per_s, res.tokens_per_s, res.param_sync_s, res.weight_bcast_s,
             res.weight_bcast_gbps, res.grad_reduce_exposed_s, res.trainer_idle_ratio, res.rollouter_idle_ratio,
             res.max_lag_seen);
    cli_print_json(dist_summary_json(rc, &res, J->sft_after, P), 6);
    return 0;
}

/* rl_job_prepare's failures, said as each needs (job_prepare.h); returns the exit code. */
static int report_prepare(rl_job *J, rl_job_status s) {
    char err[1400];
    switch (s) {
    case RL_JOB_STOPPED: return report_warm_start_stop(J);
    case RL_JOB_REFUSED:
        if (!J->dist) cli_print_error("rl", moerl_last_error());
        else if (J->speaker) fprintf(stderr, "moerl rl: %s\n", moerl_last_error());
        return 1;
    case RL_JOB_FAILED: cli_print_error("rl", moerl_last_error()); return 1;
    case RL_JOB_FAILED_OWN: fprintf(stderr, "moerl rl (%s): %s\n", J->who, moerl_last_error()); return 1;
    case RL_JOB_ABORT:
        snprintf(err, sizeof err, "moerl rl (%s): %s", J->who, moerl_last_error());
        dist_abort(J->ctx, err);
    case RL_JOB_READY: break;
    }
    return 0;
}

int cmd_rl(int argc, char **argv) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    int code = 1;
    if (cli_parse_config_args(c, argc, argv, "rl", &code)) {
        cfg_free(c);
        return code;
    }
    rl_config rc;
    dist_ctx *ctx = NULL;
    /* the configuration first (identical on every rank, so a config error fails every rank alike: the
     * launcher's rank 0 says it once), then the runtime */
    if (rl_check_config_keys(c, &rc) != MOERL_OK || rl_select_allocator(c) != MOERL_OK || (cli_set_threads((int)cfg_int(c, "trainer.n_threads")),
                                               !(ctx = dist_init(NULL, NULL)))) {
        int lrank;
        cli_launcher_world(&lrank);
        if (lrank == 0) cli_print_error("rl", moerl_last_error());
        cfg_free(c);
        return 1;
    }
    rl_job J;
    rl_job_status s = rl_job_prepare(&J, c, &rc, ctx);
    if (s != RL_JOB_READY) code = report_prepare(&J, s);
    else code = J.dist ? run_distributed(&J) : run_embedded(&J);
    rl_job_free(&J);
    cfg_free(c);
    dist_finalize(ctx);
    return code;
}
