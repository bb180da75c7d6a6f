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
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/config.h"
#include "base/log.h"
#include "base/signals.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "dist/dist.h"
#include "parallel/compress.h"
#include "parallel/grid.h"
#include "rl/rl.h"
#include "rl/state.h"

/* src/cli/sft.c: the warm start (val: its validation split, may be empty) and the split itself. */
int sft_split_validation(const cfg *c, dataset *train, dataset *val);
int sft_warm_start(const cfg *c, moe_model *m, const dataset *train, const dataset *val, const dataset *test,
                   const char *out_dir, double *acc_before, double *acc_after, int (*on_checked)(void *),
                   void *on_checked_arg); /* on_checked: called once the warm start's resume checks pass */
void sft_def_warm_start_keys(cfg *c);


/* On a resume the warm start is not rerun, but the frozen KL reference must still be the policy
 * RL started from: reload the warm start's checkpoint (when there was one) before the trainer
 * copies its reference; the RL checkpoint then replaces the live weights. */
static int restore_start_policy(const cfg *c, moe_model *m, const char *out_dir) {
    char dir[4200], f[4300];
    snprintf(dir, sizeof dir, "%s/sft_checkpoint", out_dir);
    snprintf(f, sizeof f, "%s/model.safetensors", dir);
    if (!cfg_bool(c, "actor.use_kl_loss") || access(f, R_OK) != 0) return MOERL_OK;
    return model_load_weights(m, dir);
}


/* What a run leaves in its output folder: folders, then files. */
static const char *k_run_dirs[] = {"checkpoint", "checkpoint.old", "checkpoint.tmp", "sft_checkpoint"};
static const char *k_run_files[] = {"metrics.jsonl", "samples.jsonl", "sft_metrics.jsonl", "plot.dat", "plot.gp",
                                    "reward_accuracy.png"};

/* Before any work (nothing is written): the output folder must not hold a file where moerl keeps
 * a folder, and resume_mode=disable must not silently replace a run that is there. */
static int rl_check_out_dir(const cfg *c, const rl_config *rc) {
    const int overwrite = cfg_bool(c, "trainer.overwrite_output_dir");
    if (overwrite && rc->resume_auto)
        return moerl_errorf("trainer.overwrite_output_dir=true starts anew, but trainer.resume_mode=auto continues "
                            "the folder's run: set trainer.resume_mode=disable to start anew, or drop "
                            "trainer.overwrite_output_dir to continue");
    if (cli_outdir_check_subdirs(rc->out_dir, k_run_dirs, 4) != MOERL_OK) return MOERL_ERR;
    char sim[4200];
    snprintf(sim, sizeof sim, "%s/%s", rc->out_dir, CLI_SIMULATION_MARKER);
    if (!overwrite && access(sim, F_OK) == 0)
        return moerl_errorf("output folder '%s' holds a simulation (%s, written by moerl simulate): a run would "
                            "overwrite its metrics.jsonl and samples.jsonl; choose another trainer.default_local_dir, "
                            "or replace it with trainer.resume_mode=disable trainer.overwrite_output_dir=true",
                            rc->out_dir, CLI_SIMULATION_MARKER);
    if (rc->resume_auto) { /* the resume reads checkpoint/: it must be an RL run's (job_load_checkpoint checks again) */
        char st[4200], st_old[4200], w[4200], idx[4200];
        snprintf(st, sizeof st, "%s/checkpoint/trainer_state.json", rc->out_dir);
        snprintf(st_old, sizeof st_old, "%s/checkpoint.old/trainer_state.json", rc->out_dir);
        snprintf(w, sizeof w, "%s/checkpoint/model.safetensors", rc->out_dir);
        snprintf(idx, sizeof idx, "%s/checkpoint/model.safetensors.index.json", rc->out_dir);
        if (access(st, F_OK) != 0 && access(st_old, F_OK) != 0 && (access(w, F_OK) == 0 || access(idx, F_OK) == 0))
            return moerl_errorf("%s/checkpoint holds a checkpoint without trainer_state.json (a moerl sft run, or a "
                                "copied model?), not an RL run to resume: use another trainer.default_local_dir "
                                "(model.path can point at that checkpoint), or set trainer.resume_mode=disable "
                                "trainer.overwrite_output_dir=true to replace it", rc->out_dir);
    }
    if (rc->resume_auto || overwrite) return MOERL_OK;
    char found[600] = "";
    for (int i = 0; i < 4 + 6; i++) {
        const char *name = i < 4 ? k_run_dirs[i] : k_run_files[i - 4];
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", rc->out_dir, name);
        if (access(p, F_OK) == 0 && strlen(found) + strlen(name) + 3 < sizeof found)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", found[0] ? ", " : "", name);
    }
    if (found[0])
        return moerl_errorf("output folder '%s' holds a run (%s) and trainer.resume_mode=disable would replace it: "
                            "continue it with trainer.resume_mode=auto, start anew there (deleting it) with "
                            "trainer.overwrite_output_dir=true, or choose another trainer.default_local_dir",
                            rc->out_dir, found);
    return MOERL_OK;
}

/* trainer.overwrite_output_dir=true (with the folder locked): delete the previous run's outputs, so
 * nothing of it (a checkpoint a later resume would pick up, its metrics) mixes with the new run.
 * The generated task data (data/) is kept: it depends only on the data.* options. */
static int rl_clear_previous_run(const char *dir) {
    char p[4200];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, k_run_dirs[i]);
        DIR *d = opendir(p);
        if (!d) continue;
        struct dirent *e;
        char f[4500];
        while ((e = readdir(d))) { /* checkpoints are flat folders */
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(f, sizeof f, "%s/%s", p, e->d_name);
            if (unlink(f) != 0) {
                closedir(d);
                return moerl_errorf("trainer.overwrite_output_dir: cannot delete '%s': %s", f, strerror(errno));
            }
        }
        closedir(d);
        if (rmdir(p) != 0) return moerl_errorf("trainer.overwrite_output_dir: cannot delete '%s': %s", p, strerror(errno));
    }
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, k_run_files[i]);
        if (unlink(p) != 0 && errno != ENOENT)
            return moerl_errorf("trainer.overwrite_output_dir: cannot delete '%s': %s", p, strerror(errno));
    }
    snprintf(p, sizeof p, "%s/%s", dir, CLI_SIMULATION_MARKER);
    if (access(p, F_OK) == 0 && cli_remove_sweep_outputs(dir) != MOERL_OK) return MOERL_ERR; /* a simulate --sweep's */
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, i ? CLI_SIMULATION_MARKER : "run.log");
        if (unlink(p) != 0 && errno != ENOENT)
            return moerl_errorf("trainer.overwrite_output_dir: cannot delete '%s': %s", p, strerror(errno));
    }
    log_info("trainer.overwrite_output_dir: deleted the previous run's checkpoints and logs in %s", dir);
    return MOERL_OK;
}

/* The run's log lines (of this process: trainer rank 0 under mpirun) are also appended to
 * out_dir/run.log, so a run's record survives a terminal or an mpirun that stops forwarding. */
static int rl_open_run_log(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/run.log", dir);
    return log_set_file(p);
}

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

void rl_def_keys(cfg *c); /* also src/cli/plan.c, src/cli/simulate.c */
void rl_def_keys(cfg *c) {
    cli_def_model_keys(c);
    cli_def_data_keys(c);
    sft_def_warm_start_keys(c);
    par_def_keys(c); /* actor.fsdp_config.fsdp_size, ... (src/parallel/grid.h) */
    cfg_def_int(c, "rollout.n", 8, "responses per prompt (the GRPO group)");
    cfg_def_float(c, "rollout.temperature", 1.0, "sampling temperature (behaviour logprobs use the same)");
    cfg_def_float(c, "rollout.top_p", 1.0, "nucleus sampling");
    cfg_def_int(c, "rollout.top_k", 0, "top-k sampling (0 = off)");
    cfg_def_int(c, "rollout.max_num_seqs", 64, "sequences in flight in the engine");
    cfg_def_int(c, "rollout.max_num_batched_tokens", 1024, "tokens per engine step");
    cfg_def_int(c, "rollout.expert_parallel_size", 1,
                "experts of the rollout engine split over this many rollout ranks (EP for inference; the "
                "routed rows go through actor.moe.dispatcher's all-to-all / all-to-all-v); 1 = every rollout "
                "rank holds every expert");
    cfg_def_str(c, "rollout.dtype", "fp32", "weights the rollout engine computes from: fp32 | bf16 (half the bytes per decoded token; the trainer keeps fp32)");
    cfg_def_float(c, "rollout.synthetic_length.alpha", 0.0, "benchmark workload: Pareto tail index of response lengths (0 = off; EOS ignored when on)");
    cfg_def_int(c, "rollout.synthetic_length.min", 8, "benchmark workload: shortest response");
    cfg_def_int(c, "actor.ppo_mini_batch_size", 8, "prompts per optimizer step");
    cfg_def_int(c, "actor.ppo_epochs", 1, "passes over each mini-batch");
    cfg_def_float(c, "actor.clip_ratio_low", 0.2, "PPO clip ε below 1");
    cfg_def_float(c, "actor.clip_ratio_high", 0.28, "PPO clip ε above 1 (clip-higher)");
    cfg_def_float(c, "actor.clip_ratio_c", 3.0, "dual-clip constant for negative advantages");
    cfg_def_bool(c, "actor.use_decoupled_loss", false, "AReaL decoupled PPO (proximal = trainer weights before the step)");
    cfg_def_float(c, "actor.behav_imp_weight_cap", 2.0, "cap of the behaviour importance weight (decoupled)");
    cfg_def_float(c, "actor.entropy_coeff", 0.0, "entropy bonus");
    cfg_def_bool(c, "actor.use_kl_loss", false, "k3 KL to the frozen starting policy");
    cfg_def_float(c, "actor.kl_loss_coef", 0.001, "KL loss weight");
    cfg_def_int(c, "actor.ppo_max_token_len_per_gpu", 4096, "tokens per packed micro-batch");
    cfg_def_float(c, "actor.optim.lr", 1e-4, "learning rate");
    cfg_def_float(c, "actor.optim.weight_decay", 0.0, "AdamW weight decay");
    cfg_def_float(c, "actor.optim.beta1", 0.9, "AdamW beta1");
    cfg_def_float(c, "actor.optim.beta2", 0.99, "AdamW beta2");
    cfg_def_float(c, "actor.optim.clip_grad", 1.0, "global gradient-norm clip");
    rl_def_algorithm_keys(c);
    cfg_def_float(c, "async_training.staleness_threshold", 0.3, "extra prompts allowed per version, as a share of W");
    cfg_def_int(c, "async_training.trigger_parameter_sync_step", 1, "trainer steps per weight sync");
    cfg_def_int(c, "async_training.require_batches", 1, "mini-batches per trainer step");
    cfg_def_bool(c, "async_training.partial_rollout", true, "interrupt and resume in-flight responses at a sync");
    cfg_def_str(c, "async_training.mode", "async", "async (threads) | lockstep (one thread, reproducible) | sync (baseline)");
    cfg_def_int(c, "async_training.rollout_threads", 1, "compute threads of the rollouter (async mode; every rollout rank under mpirun)");
    cfg_def_int(c, "async_training.trainer_threads", 1, "compute threads of the trainer (async mode; every trainer rank under mpirun)");
    cfg_def_float(c, "async_training.sync_bucket_mb", 64.0, "weight-broadcast bucket in MiB (under mpirun)");
    cfg_def_float(c, "actor.grad_bucket_mb", 25.0, "data-parallel gradient all-reduce bucket in MiB (DDP's 25; under mpirun)");
    cfg_def_int(c, "trainer.n_ranks", 1, "trainer ranks: under mpirun -np N the last n_ranks ranks train (in the layout the actor.* parallel keys give: data parallel, FSDP, expert / sequence / pipeline parallel), the other N-n_ranks roll out; 1 in one process");
    cfg_def_int(c, "trainer.total_training_steps", 0, "trainer steps (0 = from total_epochs)");
    cfg_def_int(c, "trainer.total_epochs", 1, "passes over the prompts");
    cfg_def_str(c, "trainer.default_local_dir", "runs/rl", "output folder");
    cfg_def_int(c, "trainer.test_freq", 5, "held-out eval every n versions (0 = start and end only)");
    cfg_def_int(c, "trainer.save_freq", 0, "checkpoint every n versions (0 = end only, -1 = never)");
    cfg_def_int(c, "trainer.val_n", 200, "held-out rows evaluated (0 = no eval)");
    cfg_def_str(c, "trainer.resume_mode", "auto", "auto (continue from the folder's checkpoint) | disable (start anew)");
    cfg_def_bool(c, "trainer.overwrite_output_dir", false, "with resume_mode=disable: start anew in a folder that holds a run, deleting its checkpoints and logs (else refused)");
    cfg_def_int(c, "trainer.seed", 1, "seed of prompt order and sampling");
    cfg_def_float(c, "trainer.watchdog_s", 600, "abort if no trainer step completes for this long (0 = off)");
    cfg_def_bool(c, "trainer.save_bf16", false, "store checkpoints in bf16");
    cfg_def_int(c, "trainer.n_threads", 0, "threads for lockstep/sync modes and the warm start (0 = all)");
}

int rl_read_config(const cfg *c, rl_config *r); /* also src/cli/simulate.c */
int rl_read_config(const cfg *c, rl_config *r) {
    memset(r, 0, sizeof *r);
    r->n = (int)cfg_int(c, "rollout.n");
    r->temperature = (float)cfg_float(c, "rollout.temperature");
    r->top_p = (float)cfg_float(c, "rollout.top_p");
    r->top_k = (int)cfg_int(c, "rollout.top_k");
    r->max_response_length = (int)cfg_int(c, "data.max_response_length");
    r->max_num_seqs = (int)cfg_int(c, "rollout.max_num_seqs");
    r->max_num_batched_tokens = (int)cfg_int(c, "rollout.max_num_batched_tokens");
    r->rollout_ep = (int)cfg_int(c, "rollout.expert_parallel_size");
    if (r->rollout_ep < 1)
        return moerl_errorf("rollout.expert_parallel_size must be ≥ 1, got %d", r->rollout_ep);
    const char *rdt = cfg_str(c, "rollout.dtype");
    if (strcmp(rdt, "fp32") && strcmp(rdt, "bf16"))
        return moerl_errorf("rollout.dtype: '%s' is not a weight type the engine computes from (expected fp32 or bf16)", rdt);
    r->bf16_weights = !strcmp(rdt, "bf16");
    r->synth_alpha = cfg_float(c, "rollout.synthetic_length.alpha");
    r->synth_min = (int)cfg_int(c, "rollout.synthetic_length.min");
    if (r->synth_alpha < 0 || r->synth_min <= 0)
        return moerl_errorf("rollout.synthetic_length: alpha must be ≥ 0 and min positive (got %g, %d)", r->synth_alpha, r->synth_min);
    r->ppo_mini_batch_size = (int)cfg_int(c, "actor.ppo_mini_batch_size");
    r->ppo_epochs = (int)cfg_int(c, "actor.ppo_epochs");
    r->ppo.clip_ratio_low = (float)cfg_float(c, "actor.clip_ratio_low");
    r->ppo.clip_ratio_high = (float)cfg_float(c, "actor.clip_ratio_high");
    r->ppo.clip_ratio_c = (float)cfg_float(c, "actor.clip_ratio_c");
    r->ppo.decoupled = cfg_bool(c, "actor.use_decoupled_loss");
    r->ppo.behav_imp_weight_cap = (float)cfg_float(c, "actor.behav_imp_weight_cap");
    r->entropy_coeff = (float)cfg_float(c, "actor.entropy_coeff");
    r->use_kl_loss = cfg_bool(c, "actor.use_kl_loss");
    r->kl_loss_coef = (float)cfg_float(c, "actor.kl_loss_coef");
    r->ppo_max_token_len = (int)cfg_int(c, "actor.ppo_max_token_len_per_gpu");
    r->optim.lr = (float)cfg_float(c, "actor.optim.lr");
    r->optim.weight_decay = (float)cfg_float(c, "actor.optim.weight_decay");
    r->optim.beta1 = (float)cfg_float(c, "actor.optim.beta1");
    r->optim.beta2 = (float)cfg_float(c, "actor.optim.beta2");
    r->optim.eps = 1e-8f;
    r->optim.max_grad_norm = (float)cfg_float(c, "actor.optim.clip_grad");
    r->staleness_threshold = cfg_float(c, "async_training.staleness_threshold");
    r->trigger_parameter_sync_step = (int)cfg_int(c, "async_training.trigger_parameter_sync_step");
    r->require_batches = (int)cfg_int(c, "async_training.require_batches");
    r->partial_rollout = cfg_bool(c, "async_training.partial_rollout");
    r->rollout_threads = (int)cfg_int(c, "async_training.rollout_threads");
    r->trainer_threads = (int)cfg_int(c, "async_training.trainer_threads");
    r->total_training_steps = cfg_int(c, "trainer.total_training_steps");
    r->total_epochs = (int)cfg_int(c, "trainer.total_epochs");
    snprintf(r->out_dir, sizeof r->out_dir, "%s", cfg_str(c, "trainer.default_local_dir"));
    r->test_freq = (int)cfg_int(c, "trainer.test_freq");
    r->save_freq = (int)cfg_int(c, "trainer.save_freq");
    r->val_n = (int)cfg_int(c, "trainer.val_n");
    r->seed = (uint64_t)cfg_int(c, "trainer.seed");
    r->watchdog_s = cfg_float(c, "trainer.watchdog_s");
    r->save_bf16 = cfg_bool(c, "trainer.save_bf16");
    r->n_trainer_ranks = (int)cfg_int(c, "trainer.n_ranks");
    r->sync_bucket_mb = cfg_float(c, "async_training.sync_bucket_mb");
    r->grad_bucket_mb = cfg_float(c, "actor.grad_bucket_mb");
    if (r->n_trainer_ranks < 1) return moerl_errorf("trainer.n_ranks must be ≥ 1, got %d", r->n_trainer_ranks);
    if (!(r->sync_bucket_mb > 0) || r->sync_bucket_mb > 1024)
        return moerl_errorf("async_training.sync_bucket_mb must be in (0, 1024] MiB, got %g", r->sync_bucket_mb);
    if (!(r->grad_bucket_mb > 0) || r->grad_bucket_mb > 1024)
        return moerl_errorf("actor.grad_bucket_mb must be in (0, 1024] MiB, got %g", r->grad_bucket_mb);
    const char *mode = cfg_str(c, "async_training.mode");
    if (!strcmp(mode, "async")) r->mode = RL_MODE_ASYNC;
    else if (!strcmp(mode, "lockstep")) r->mode = RL_MODE_LOCKSTEP;
    else if (!strcmp(mode, "sync")) r->mode = RL_MODE_SYNC;
    else return moerl_errorf("async_training.mode: '%s' is not one of async, lockstep, sync", mode);
    if (r->mode == RL_MODE_SYNC) { /* the synchronous baseline: generate a batch, then train on it */
        int lrank;
        cli_launcher_world(&lrank); /* every rank reads the configuration: rank 0 says it once */
        if (lrank == 0 && r->trigger_parameter_sync_step != 1 &&
            strcmp(cfg_origin(c, "async_training.trigger_parameter_sync_step"), "default") != 0)
            log_warn("async_training.trigger_parameter_sync_step=%d is not used: async_training.mode=sync syncs the "
                     "weights after every step (trigger_parameter_sync_step=1); use async_training.mode=async or "
                     "lockstep to sync every %d steps", r->trigger_parameter_sync_step, r->trigger_parameter_sync_step);
        r->staleness_threshold = 0;
        r->trigger_parameter_sync_step = 1;
        r->partial_rollout = 0;
    }
    const char *rm = cfg_str(c, "trainer.resume_mode");
    if (!strcmp(rm, "auto")) r->resume_auto = 1;
    else if (strcmp(rm, "disable")) return moerl_errorf("trainer.resume_mode: '%s' is not auto or disable", rm);
    if (r->n <= 0) return moerl_errorf("rollout.n must be positive, got %d", r->n);
    {
        staleness_budget b; /* the budget's own checks, before any work (e.g. a warm start) */
        if (staleness_init(&b, r->ppo_mini_batch_size, r->require_batches, r->trigger_parameter_sync_step,
                           r->staleness_threshold) != MOERL_OK)
            return MOERL_ERR;
    }
    if (r->top_k == -1) r->top_k = 0; /* verl/vLLM spell "off" as -1 */
    if (r->top_k < 0) return moerl_errorf("rollout.top_k must be ≥ 0 (or -1 for off), got %d", r->top_k);
    if (!(r->optim.lr >= 0) || !isfinite(r->optim.lr))
        return moerl_errorf("actor.optim.lr must be a finite number ≥ 0, got %g", (double)r->optim.lr);
    if (!(r->optim.weight_decay >= 0) || !isfinite(r->optim.weight_decay))
        return moerl_errorf("actor.optim.weight_decay must be a finite number ≥ 0, got %g", (double)r->optim.weight_decay);
    if (!(r->optim.beta1 >= 0 && r->optim.beta1 < 1) || !(r->optim.beta2 >= 0 && r->optim.beta2 < 1))
        return moerl_errorf("actor.optim.beta1/beta2 must be in [0, 1), got %g, %g", (double)r->optim.beta1, (double)r->optim.beta2);
    if (!(r->ppo.clip_ratio_low >= 0 && r->ppo.clip_ratio_low < 1))
        return moerl_errorf("actor.clip_ratio_low must be in [0, 1), got %g", (double)r->ppo.clip_ratio_low);
    if (!(r->ppo.clip_ratio_high >= 0) || !isfinite(r->ppo.clip_ratio_high))
        return moerl_errorf("actor.clip_ratio_high must be a finite number ≥ 0, got %g", (double)r->ppo.clip_ratio_high);
    if (!isfinite(r->ppo.clip_ratio_c)) return moerl_errorf("actor.clip_ratio_c must be finite");
    if (!(r->ppo.behav_imp_weight_cap > 0) || !isfinite(r->ppo.behav_imp_weight_cap))
        return moerl_errorf("actor.behav_imp_weight_cap must be a finite number > 0, got %g",
                            (double)r->ppo.behav_imp_weight_cap);
    if (!isfinite(r->entropy_coeff))
        return moerl_errorf("actor.entropy_coeff must be a finite number, got %g", (double)r->entropy_coeff);
    if (!(r->kl_loss_coef >= 0) || !isfinite(r->kl_loss_coef))
        return moerl_errorf("actor.kl_loss_coef must be a finite number ≥ 0, got %g", (double)r->kl_loss_coef);
    if (r->total_training_steps < 0) return moerl_errorf("trainer.total_training_steps must be ≥ 0 (0 = from total_epochs)");
    if (r->total_epochs < 1) return moerl_errorf("trainer.total_epochs must be ≥ 1, got %d", r->total_epochs);
    if (r->val_n < 0) return moerl_errorf("trainer.val_n must be ≥ 0 (0 = no eval), got %d", r->val_n);
    if (r->test_freq < 0) return moerl_errorf("trainer.test_freq must be ≥ 0, got %d", r->test_freq);
    if (r->save_freq < -1) return moerl_errorf("trainer.save_freq must be ≥ -1 (-1 = never), got %d", r->save_freq);
    if (!(r->watchdog_s >= 0)) return moerl_errorf("trainer.watchdog_s must be ≥ 0 (0 = off), got %g", r->watchdog_s);
    if (!(r->temperature > 0)) return moerl_errorf("rollout.temperature must be > 0 for RL, got %g", r->temperature);
    if (!(r->top_p > 0 && r->top_p <= 1)) return moerl_errorf("rollout.top_p must be in (0, 1], got %g", r->top_p);
    if (r->max_response_length <= 0) return moerl_errorf("data.max_response_length must be positive");
    if (r->max_num_seqs < r->n)
        return moerl_errorf("rollout.max_num_seqs (%d) must hold at least one group of rollout.n (%d)", r->max_num_seqs, r->n);
    if (r->ppo_epochs <= 0) return moerl_errorf("actor.ppo_epochs must be positive");
    if (r->ppo_max_token_len <= 0) return moerl_errorf("actor.ppo_max_token_len_per_gpu must be positive");
    if (r->rollout_threads <= 0 || r->trainer_threads <= 0)
        return moerl_errorf("async_training.rollout_threads and trainer_threads must be positive");
    if (par_read_keys(c, &r->par) != MOERL_OK) return MOERL_ERR;
    if (rl_read_algorithm_keys(c, r) != MOERL_OK) return MOERL_ERR;
    /* refused here, before any folder or model exists, in one process as under mpirun; the sizes
     * against the ranks and the model are checked by par_check once the model is known */
    const par_config *pc = &r->par;
    const int pp = pc->pipeline_parallel_size, fsdp = pc->fsdp_size == -1 ? r->n_trainer_ranks / pp : pc->fsdp_size;
    const int any = fsdp > 1 || pc->expert_parallel_size > 1 || pc->ulysses_sequence_parallel_size > 1 || pp > 1;
    if (any && r->n_trainer_ranks < 2)
        return moerl_errorf("model parallelism (actor.fsdp_config.fsdp_size=%d, actor.expert_parallel_size=%d, "
                            "actor.ulysses_sequence_parallel_size=%d, actor.pipeline_parallel_size=%d) splits the "
                            "model over trainer ranks: run under mpirun with trainer.n_ranks ≥ 2 (it is %d)",
                            pc->fsdp_size, pc->expert_parallel_size, pc->ulysses_sequence_parallel_size, pp,
                            r->n_trainer_ranks);
    if (par_check_pp_alone(pc, r->n_trainer_ranks) != MOERL_OK) return MOERL_ERR;
    if ((fsdp > 1 || pp > 1 || pc->expert_parallel_size > 1) && r->grad_compression != GRAD_COMPRESSION_NONE) {
        char key[96];
        if (fsdp > 1) snprintf(key, sizeof key, "actor.fsdp_config.fsdp_size=%d (FSDP reduce-scatters)", fsdp);
        else if (pp > 1) snprintf(key, sizeof key, "actor.pipeline_parallel_size=%d (each stage sums its own)", pp);
        else snprintf(key, sizeof key, "actor.expert_parallel_size=%d (EP sums its own)", pc->expert_parallel_size);
        return moerl_errorf("actor.grad_compression compresses the data-parallel reducer's all-reduce, which %s does "
                            "not use: set actor.grad_compression=none",
                            key);
    }
    /* the 1F1B guard (each stage needs ≥ pp micro-batches) is rl_check_update_sizes', before the warm
     * start: a data-parallel pipeline gets whole GRPO groups (rollout.n sequences) or none, which
     * mini-batch · n / dp sequences per shard does not model (1 group of 3 over 2 pipelines: 3 or 0) */
    return MOERL_OK;
}

/* Why the run evaluates on the held-out split (for cli_check_data_keys), or "" when it does not
 * (trainer.val_n = 0: neither the warm start nor RL evaluates there). */
static void rl_why_test(const rl_config *rc, char *buf, size_t cap) {
    if (rc->val_n == 0) buf[0] = 0;
    else snprintf(buf, cap, "trainer.val_n=%d evaluates on them", rc->val_n);
}

/* A resume (trainer.resume_mode=auto and a trainer_state.json in checkpoint/ or checkpoint.old/)
 * must be of this training data and seed and of this model's shapes: checked here, before config.yaml
 * or the generated data are written, with the same rules the job applies when it loads the checkpoint
 * (rl_state_load, model_load_weights). A folder holding a warm start (sft_checkpoint/) and no RL
 * checkpoint is refused when sft.total_training_steps=0 would leave it unused. */
static int rl_check_resume_state(const cfg *c, const rl_config *rc, const dataset *train, moe_model *m) {
    if (!rc->resume_auto) return MOERL_OK;
    char p[4200], dir[4200];
    snprintf(dir, sizeof dir, "%s/checkpoint", rc->out_dir);
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    if (access(p, R_OK) != 0) {
        snprintf(dir, sizeof dir, "%s/checkpoint.old", rc->out_dir);
        snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    }
    if (access(p, R_OK) != 0) { /* no RL checkpoint: RL starts anew, after the warm start */
        char ws[4200];
        snprintf(ws, sizeof ws, "%s/sft_checkpoint", rc->out_dir);
        if (cfg_int(c, "sft.total_training_steps") <= 0 && access(ws, F_OK) == 0)
            return moerl_errorf("output folder '%s' holds the SFT warm start of a moerl rl run (sft_checkpoint/) and no "
                                "RL checkpoint, but sft.total_training_steps=%lld would start RL from the new model and "
                                "leave that warm start unused: rerun with the run's sft.total_training_steps (its "
                                "config.yaml records it) to continue the warm start, or replace the run with "
                                "trainer.resume_mode=disable trainer.overwrite_output_dir=true",
                                rc->out_dir, (long long)cfg_int(c, "sft.total_training_steps"));
        return MOERL_OK;
    }
    const rl_state_expect want = {.n_rows = dataset_count(train), .seed = rc->seed,
                                  .data_fingerprint = dataset_fingerprint(train)};
    rl_state st;
    int r = rl_state_load(&st, p, &want);
    rl_state_free(&st);
    if (r != MOERL_OK) return cli_name_changed_data_keys(c, rc->out_dir);
    /* the job loads the checkpoint's weights into this model: the same checks, reading nothing */
    if (model_check_weights(m, dir) != MOERL_OK)
        return moerl_errorf("%s; resuming needs the checkpoint's model: keep its model.* values (or set model.path), or "
                            "use a new trainer.default_local_dir, or trainer.resume_mode=disable "
                            "trainer.overwrite_output_dir=true", moerl_last_error());
    return MOERL_OK;
}

/* What a run writes into its folder once every check has passed — the generated data, config.yaml and
 * run.log — once (done), so that a refused resume leaves the folder as it was. A warm start being
 * resumed has checks of its own (sft_checkpoint/'s data, seed and batch size, inside sft_train): the
 * writes then wait for them (sft_warm_start's on_checked). */
typedef struct {
    const cfg *c;
    const char *out_dir;
    cli_staged_data *staged;
    int done;
} rl_outputs;

static int rl_write_outputs(void *arg) {
    rl_outputs *w = arg;
    if (w->done) return MOERL_OK;
    char path[4200];
    if (cli_staged_commit(w->staged) != MOERL_OK) return MOERL_ERR;
    snprintf(path, sizeof path, "%s/config.yaml", w->out_dir);
    if (cfg_dump_yaml(w->c, path) != MOERL_OK || rl_open_run_log(w->out_dir) != MOERL_OK) return MOERL_ERR;
    w->done = 1;
    return MOERL_OK;
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

/* The job across processes (world size > 1). Errors after the role split end every rank. */
static int run_distributed(cfg *c, rl_config *rc, dist_ctx *ctx) {
    const int P = ctx->world_size;
    if (rc->n_trainer_ranks > P - 1) { /* identical on every rank: rank 0 reports, all return */
        if (ctx->world_rank == 0)
            fprintf(stderr,
                    "moerl rl: trainer.n_ranks=%d leaves no rollout rank in a world of %d processes (mpirun -np %d): "
                    "use 1 ≤ trainer.n_ranks ≤ %d\n",
                    rc->n_trainer_ranks, P, P, P - 1);
        return 1;
    }
    if (rc->mode == RL_MODE_LOCKSTEP) {
        if (ctx->world_rank == 0)
            fprintf(stderr, "moerl rl: async_training.mode=lockstep runs in one process only; under mpirun use async "
                            "or sync\n");
        return 1;
    }
    char who[96], err[1400];
    if (dist_split_roles(ctx, rc->n_trainer_ranks) != MOERL_OK) {
        if (ctx->world_rank == 0) fprintf(stderr, "moerl rl: %s\n", moerl_last_error());
        return 1;
    }
    const int leader = ctx->trainer_rank == 0;
    if (ctx->role == DIST_ROLE_ROLLOUT) snprintf(who, sizeof who, "rollout %d", ctx->world_rank);
    else snprintf(who, sizeof who, "trainer %d", ctx->trainer_rank);
    log_set_prefix(who);
    moe_model m = {0};
    dataset train = {0}, test = {0}, val = {0};
    char path[4200];
    cli_outdir od = {0};
    cli_staged_data staged = {0};
    int opened = 0;
    char why_test[96];
    rl_why_test(rc, why_test, sizeof why_test);
    if (leader && rl_check_out_dir(c, rc) != MOERL_OK) goto fail;
    if (cli_check_data_keys(c, why_test[0] ? why_test : NULL) != MOERL_OK) goto fail;
    if (rc->grad_compression != GRAD_COMPRESSION_NONE && rc->n_trainer_ranks < 2 && leader)
        log_warn("actor.grad_compression=%s compresses the data-parallel gradient all-reduce, and trainer.n_ranks=1 "
                 "has none: it has no effect here", cfg_str(c, "actor.grad_compression"));
    if (cli_build_model(c, &m) != MOERL_OK) goto fail;
    /* the layout against the ranks and the model: the same verdict on every rank (config, world size
     * and model shape only), so rank 0 reports it once and every rank returns (no MPI_Abort) — before
     * any folder exists */
    int layout_rc = par_check(&rc->par, rc->n_trainer_ranks, m.cfg.num_experts, m.cfg.num_attention_heads,
                              m.cfg.num_key_value_heads, m.cfg.num_hidden_layers);
    if (layout_rc == MOERL_OK && rc->rollout_ep > 1 && ctx->n_rollout % rc->rollout_ep)
        layout_rc = moerl_errorf("rollout.expert_parallel_size=%d does not divide the %d rollout rank%s (mpirun -np "
                                 "minus trainer.n_ranks)",
                                 rc->rollout_ep, ctx->n_rollout, moerl_plural(ctx->n_rollout));
    if (layout_rc == MOERL_OK && rc->rollout_ep > 1 && m.cfg.num_experts % rc->rollout_ep)
        layout_rc = moerl_errorf("rollout.expert_parallel_size=%d does not divide the model's %d experts",
                                 rc->rollout_ep, m.cfg.num_experts);
    if (layout_rc != MOERL_OK) {
        if (ctx->world_rank == 0) fprintf(stderr, "moerl rl: %s\n", moerl_last_error());
        model_free(&m);
        return 1;
    }
    if (leader) {
        if (cli_outdir_open(&od, rc->out_dir) != MOERL_OK) goto fail;
        opened = 1;
        if (cfg_bool(c, "trainer.overwrite_output_dir") && rl_clear_previous_run(rc->out_dir) != MOERL_OK) goto fail;
    }
    /* the leader made the folder before any rank writes data into it: cli_outdir_abandon removes only
     * a folder this run created */
    if (dist_barrier(ctx, DIST_WORLD) != MOERL_OK) goto fail;
    if (cli_prepare_data_staged(c, rc->out_dir, &train, &test, &staged) != MOERL_OK) goto fail;
    if (!leader) { /* loaded: the leader alone keeps the files, once checked (data/ is the leader's to remove) */
        staged.data_dir[0] = 0;
        cli_staged_discard(&staged);
    }
    if (cli_check_held_out_rows(c, &test, why_test[0] ? why_test : NULL) != MOERL_OK) goto fail;
    if (sft_split_validation(c, &train, &val) != MOERL_OK) goto fail;
    if (rl_check_update_sizes(rc, &train, 1) != MOERL_OK || /* before the warm start; the same verdict on every */
        rl_check_context(&train, rc->max_response_length, m.cfg.max_position_embeddings, NULL) != MOERL_OK) {
        /* rank (config and data): rank 0 says it once, no abort; the context is the rollout's (rollouter_init) */
        if (ctx->world_rank == 0) fprintf(stderr, "moerl rl: %s\n", moerl_last_error());
        dist_barrier(ctx, DIST_WORLD); /* every rank is done writing the data before the folder goes, */
        cli_staged_discard(&staged);
        if (opened) cli_outdir_abandon(&od);
        dist_barrier(ctx, DIST_WORLD); /* and it is gone before a rank exits (mpirun then ends the others) */
        model_free(&m);
        dataset_free(&train);
        dataset_free(&test);
        dataset_free(&val);
        return 1;
    }
    if (leader && rl_check_resume_state(c, rc, &train, &m) != MOERL_OK) goto fail;
    /* every rank is done writing the data: a warm start that fails can remove the folder */
    if (dist_barrier(ctx, DIST_WORLD) != MOERL_OK) goto fail;
    double sft0 = NAN, sft1 = NAN;
    /* every rank: a forwarded SIGTERM must not kill a rank before trainer rank 0 stops the job */
    moerl_install_stop_signals();
    if (leader) { /* the warm start runs here only; rl_run_dist hands its weights to every rank */
        /* every check passed: only now does the folder change (data, config.yaml, run.log) — after the
         * warm start's own resume checks when it runs (rl_write_outputs) */
        rl_outputs w = {.c = c, .out_dir = rc->out_dir, .staged = &staged};
        snprintf(path, sizeof path, "%s/checkpoint/trainer_state.json", rc->out_dir);
        int resuming = rc->resume_auto && access(path, R_OK) == 0;
        snprintf(path, sizeof path, "%s/checkpoint.old/trainer_state.json", rc->out_dir);
        resuming |= rc->resume_auto && access(path, R_OK) == 0;
        if (resuming && rl_write_outputs(&w) != MOERL_OK) goto fail;
        if (!resuming && (sft_warm_start(c, &m, &train, &val, &test, rc->out_dir, &sft0, &sft1, rl_write_outputs, &w) !=
                              MOERL_OK ||
                          rl_write_outputs(&w) != MOERL_OK)) {
            /* the other ranks wait in rl_run_dist for RL's START: BYE instead, then exit 1 (one message) */
            fprintf(stderr, "moerl rl (%s): %s\n", who, moerl_last_error());
            cli_outdir_abandon(&od);
            opened = 0;
            if (rl_run_dist_cancel(ctx) != MOERL_OK) goto fail;
            model_free(&m);
            dataset_free(&train);
            dataset_free(&test);
            dataset_free(&val);
            return 1;
        }
        if (moerl_stop_requested()) {
            fprintf(stderr, "moerl rl: stopped by signal %d in the SFT warm start (its checkpoint is in %s/sft_checkpoint); "
                            "rerun the same command to continue\n", moerl_stop_requested(), rc->out_dir);
            cli_print_json(rl_warm_start_stop_json(rc, moerl_stop_requested(), sft1), 6);
            /* the other ranks wait in rl_run_dist for a START that will not come: BYE instead */
            if (rl_run_dist_cancel(ctx) != MOERL_OK) goto fail;
            const int sig = moerl_stop_requested();
            model_free(&m);
            dataset_free(&train);
            dataset_free(&test);
            dataset_free(&val);
            return 128 + sig;
        }
        if (resuming && restore_start_policy(c, &m, rc->out_dir) != MOERL_OK) goto fail;
    }
    rl_result res;
    if (rl_run_dist(rc, ctx, &m, &train, &test, &res) != MOERL_OK) goto fail;
    if (leader && res.stop_signal) {
        rl_report_stop(&res, rc->out_dir);
        cli_print_json(dist_summary_json(rc, &res, sft1, P), 6);
        return 128 + res.stop_signal;
    }
    if (leader) {
        log_info("RL done on %d processes (%d rollout, %d trainer): %lld step%s, version %d, %.1f s, %.2f prompts/s, "
                 "%.0f generated tokens/s (rollout output over the run), param sync %.4f s (broadcast %.4f s, "
                 "%.3f GB/s), exposed gradient reduction %.3f s, trainer idle %.2f, rollouter idle %.2f, max "
                 "staleness %d",
                 P, res.rollout_ranks, res.trainer_ranks, (long long)res.steps, moerl_plural(res.steps), res.final_version, res.wall_s,
                 res.prompts_per_s, res.tokens_per_s, res.param_sync_s, res.weight_bcast_s, res.weight_bcast_gbps,
                 res.grad_reduce_exposed_s, res.trainer_idle_ratio, res.rollouter_idle_ratio, res.max_lag_seen);
        cli_print_json(dist_summary_json(rc, &res, sft1, P), 6);
    }
    model_free(&m);
    dataset_free(&train);
    dataset_free(&test);
    dataset_free(&val);
    return 0;
fail:
    snprintf(err, sizeof err, "moerl rl (%s): %s", who, moerl_last_error());
    cli_staged_discard(&staged);
    if (opened) cli_outdir_abandon(&od);
    dist_abort(ctx, err);
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
    moe_model m = {0};
    dataset train = {0}, test = {0}, val = {0};
    char path[4200];
    cli_outdir od = {0};
    cli_staged_data staged = {0};
    int opened = 0;
    if (rl_read_config(c, &rc) != MOERL_OK) goto fail;
    cli_set_threads((int)cfg_int(c, "trainer.n_threads"));
    /* after the configuration (identical on every rank, so a config error fails every rank alike) */
    ctx = dist_init(NULL, NULL);
    if (!ctx) goto fail;
    if (ctx->world_size > 1) {
        int code = run_distributed(c, &rc, ctx);
        dist_finalize(ctx);
        cfg_free(c);
        return code;
    }
    if (rc.n_trainer_ranks != 1) {
        moerl_errorf("trainer.n_ranks=%d needs %d trainer processes plus rollout processes, but this is a single "
                     "process (%s backend): run under mpirun with build/moerl-mpi, e.g. `mpirun -np %d build/moerl-mpi "
                     "rl ... trainer.n_ranks=%d` for one rollout rank",
                     rc.n_trainer_ranks, rc.n_trainer_ranks, dist_backend_name(), rc.n_trainer_ranks + 1,
                     rc.n_trainer_ranks);
        goto fail;
    }
    if (rc.rollout_ep > 1) {
        moerl_errorf("rollout.expert_parallel_size=%d splits the engine's experts over rollout ranks, and one "
                     "process has none: run under mpirun with build/moerl-mpi and at least %d rollout ranks",
                     rc.rollout_ep, rc.rollout_ep);
        goto fail;
    }
    /* everything that can be checked without writing comes first: a bad configuration, model or
     * output folder leaves no folder behind (and a failure while setting up removes what it made) */
    char why_test[96];
    rl_why_test(&rc, why_test, sizeof why_test);
    if (rl_check_out_dir(c, &rc) != MOERL_OK) goto fail;
    if (cli_check_data_keys(c, why_test[0] ? why_test : NULL) != MOERL_OK) goto fail;
    if (rc.grad_compression != GRAD_COMPRESSION_NONE)
        log_warn("actor.grad_compression=%s compresses the data-parallel gradient all-reduce, and a single-process "
                 "run has none: it has no effect here (it applies under mpirun with trainer.n_ranks ≥ 2)",
                 cfg_str(c, "actor.grad_compression"));
    if (cli_build_model(c, &m) != MOERL_OK) goto fail;
    if (cli_outdir_open(&od, rc.out_dir) != MOERL_OK) goto fail;
    opened = 1;
    if (cfg_bool(c, "trainer.overwrite_output_dir") && rl_clear_previous_run(rc.out_dir) != MOERL_OK) goto fail;
    if (cli_prepare_data_staged(c, rc.out_dir, &train, &test, &staged) != MOERL_OK) goto fail;
    if (cli_check_held_out_rows(c, &test, why_test[0] ? why_test : NULL) != MOERL_OK) goto fail;
    if (sft_split_validation(c, &train, &val) != MOERL_OK) goto fail;
    if (rl_check_update_sizes(&rc, &train, 1) != MOERL_OK) goto fail; /* before the warm start */
    /* the rollout's context, before the folder changes (rollouter_init checks it again) */
    if (rl_check_context(&train, rc.max_response_length, m.cfg.max_position_embeddings, NULL) != MOERL_OK) goto fail;
    if (rl_check_resume_state(c, &rc, &train, &m) != MOERL_OK) goto fail;
    /* every check passed: only now does the folder change (data, config.yaml, run.log) — after the warm
     * start's own resume checks when it runs (rl_write_outputs) */
    rl_outputs w = {.c = c, .out_dir = rc.out_dir, .staged = &staged};
    double sft0 = NAN, sft1 = NAN;
    int exit_code = 0; /* 128 + signal when one stopped the run */
    snprintf(path, sizeof path, "%s/checkpoint/trainer_state.json", rc.out_dir);
    int resuming = rc.resume_auto && access(path, R_OK) == 0;
    snprintf(path, sizeof path, "%s/checkpoint.old/trainer_state.json", rc.out_dir);
    resuming |= rc.resume_auto && access(path, R_OK) == 0;
    if (resuming && rl_write_outputs(&w) != MOERL_OK) goto fail;
    moerl_install_stop_signals(); /* Ctrl-C from here on: a checkpoint (warm start or RL), then exit */
    if (!resuming && sft_warm_start(c, &m, &train, &val, &test, rc.out_dir, &sft0, &sft1, rl_write_outputs, &w) != MOERL_OK)
        goto fail;
    if (rl_write_outputs(&w) != MOERL_OK) goto fail; /* no warm start: now */
    if (moerl_stop_requested()) {
        const int sig = moerl_stop_requested();
        fprintf(stderr, "moerl rl: stopped by signal %d in the SFT warm start (its checkpoint is in %s/sft_checkpoint); "
                        "rerun the same command to continue\n", sig, rc.out_dir);
        cli_print_json(rl_warm_start_stop_json(&rc, sig, sft1), 6);
        exit_code = 128 + sig;
        goto done;
    }
    if (resuming && restore_start_policy(c, &m, rc.out_dir) != MOERL_OK) goto fail;
    rl_result res;
    if (rl_run(&rc, &m, &train, &test, &res) != MOERL_OK) goto fail;
    if (res.stop_signal) {
        rl_report_stop(&res, rc.out_dir);
        cli_print_json(rl_summary_json(&rc, &res, sft1), 6);
        exit_code = 128 + res.stop_signal;
        goto done;
    }
    log_info("RL done: %lld step%s, version %d, %.1f s, %.2f prompts/s, %.0f generated tokens/s (rollout output over "
             "the run), trainer idle %.2f, rollouter idle %.2f, max staleness %d",
             (long long)res.steps, moerl_plural(res.steps), res.final_version, res.wall_s, res.prompts_per_s,
             res.tokens_per_s, res.trainer_idle_ratio, res.rollouter_idle_ratio, res.max_lag_seen);
    if (isfinite(sft0) && isfinite(sft1) && rc.val_n != 0)
        log_info("held-out accuracy: start %.1f%% → SFT %.1f%% → RL %.1f%% (RL adds %+.1f points)", 100 * sft0,
                 100 * sft1, 100 * res.val_acc_end, 100 * (res.val_acc_end - sft1));
    else if (isfinite(sft0) && rc.val_n != 0) /* the warm start had nothing left to do: not measured now */
        log_info("held-out accuracy: start %.1f%% → RL %.1f%% (the SFT warm start's accuracy was not measured in this "
                 "run: it had already reached sft.total_training_steps)", 100 * sft0, 100 * res.val_acc_end);
    else if (rc.val_n != 0 && !resuming)
        log_info("held-out accuracy: %.1f%% → %.1f%% (%+.1f points)", 100 * res.val_acc_start, 100 * res.val_acc_end,
                 100 * (res.val_acc_end - res.val_acc_start));
    else if (rc.val_n != 0 && isfinite(res.val_acc_start))
        log_info("held-out accuracy: %.1f%% when resumed → %.1f%%", 100 * res.val_acc_start, 100 * res.val_acc_end);
    else if (rc.val_n != 0)
        log_info("held-out accuracy at the end: %.1f%%", 100 * res.val_acc_end);
    cli_print_json(rl_summary_json(&rc, &res, sft1), 6);
done:
    model_free(&m);
    dataset_free(&train);
    dataset_free(&test);
    dataset_free(&val);
    cfg_free(c);
    dist_finalize(ctx);
    return exit_code;
fail:
    { /* before the role split every rank fails alike (the configuration): rank 0 says it once */
        int lrank;
        cli_launcher_world(&lrank);
        if (ctx || lrank == 0) cli_print_error("rl", moerl_last_error());
    }
    cli_staged_discard(&staged);
    if (opened) cli_outdir_abandon(&od);
    model_free(&m);
    dataset_free(&train);
    dataset_free(&test);
    dataset_free(&val);
    cfg_free(c);
    dist_finalize(ctx); /* NULL: no-op */
    return 1;
}
