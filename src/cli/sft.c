/* moerl sft --config FILE [key=value ...]
 * Supervised fine-tuning on prompt/response pairs (rl/sft.h, the job in rl/sft_job.h), then an HF checkpoint under
 * trainer.default_local_dir/checkpoint; prints one JSON line {"accuracy_before", "accuracy_after",
 * "checkpoint", "stopped_by_signal"} (also after a SIGINT/SIGTERM, exit 128 + the signal). Also the SFT
 * warm start of `moerl rl` (sft.* keys). Under mpirun (build/moerl-mpi)
 * every rank trains: each step's batch is split over the ranks (data parallel, or FSDP with
 * actor.fsdp_config.fsdp_size, src/parallel/), and rank 0 alone writes the folder, the metrics and
 * the checkpoints and prints the result. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "dist/dist.h"
#include "rl/sft_job.h"

static void report_error(const char *msg) { cli_print_error("sft", msg); }

/* The last line of `moerl sft` on stdout, run finished or stopped by a signal: the held-out accuracies
 * before and after training (null when not measured: "accuracy_after" of a stopped run), the checkpoint's
 * folder and "stopped_by_signal" (the signal's number, null when the run finished; as moerl rl's line). */
static json_t *sft_summary_json(const sft_job_result *res) {
    json_t *j = json_object();
    json_object_set_new(j, "accuracy_before", cli_json_real(res->acc_before));
    json_object_set_new(j, "accuracy_after", cli_json_real(res->acc_after));
    json_object_set_new(j, "checkpoint", cli_json_text(res->checkpoint, strlen(res->checkpoint)));
    json_object_set_new(j, "stopped_by_signal", res->stop_signal ? json_integer(res->stop_signal) : json_null());
    return j;
}

int cmd_sft(int argc, char **argv) {
    cfg *c = cfg_new();
    sft_def_job_keys(c);
    int code = 1;
    if (cli_parse_config_args(c, argc, argv, "sft", &code)) {
        cfg_free(c);
        return code;
    }
    /* Under mpirun (build/moerl-mpi) every rank trains (a training-only job: no rollout ranks). */
    dist_ctx *ctx = dist_init(NULL, NULL);
    if (!ctx) {
        cli_print_error("sft", moerl_last_error());
        cfg_free(c);
        return 1;
    }
    sft_job_result res;
    if (dist_split_roles(ctx, ctx->world_size) != MOERL_OK) {
        cli_print_error("sft", moerl_last_error());
        code = 1;
    } else {
        cli_set_threads((int)cfg_int(c, "trainer.n_threads"));
        code = sft_job_run(c, ctx, &res, report_error) != MOERL_OK ? 1 : 0;
    }
    if (code == 0 && res.stop_signal && res.root)
        fprintf(stderr, "moerl sft: stopped by signal %d after a checkpoint in %s; resume with the same command "
                        "(trainer.resume_mode=auto)\n", res.stop_signal, res.checkpoint);
    if (code == 0 && res.root) /* finished or stopped by a signal: the same line (moerl rl prints its own alike) */
        cli_print_json(sft_summary_json(&res), 6);
    if (code == 0 && res.stop_signal) code = 128 + res.stop_signal;
    dist_finalize(ctx);
    cfg_free(c);
    return code;
}
