/* moerl sft --config FILE [key=value ...]
 * Supervised fine-tuning on prompt/response pairs (train/sft.h), then an HF checkpoint under
 * trainer.default_local_dir/checkpoint; prints one JSON line {"accuracy_before", "accuracy_after",
 * "checkpoint"}. Also the SFT warm start of `moerl rl` (sft.* keys). Under mpirun (build/moerl-mpi)
 * every rank trains: each step's batch is split over the ranks (data parallel, or FSDP with
 * actor.fsdp_config.fsdp_size, src/parallel/), and rank 0 alone writes the folder, the metrics and
 * the checkpoints and prints the result. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "base/config.h"
#include "base/signals.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "rl/rl.h"
#include "dist/dist.h"
#include "parallel/parallel.h"
#include "train/sft.h"

static void sft_def_keys(cfg *c) {
    cli_def_model_keys(c);
    cli_def_data_keys(c);
    cfg_def_int(c, "data.train_batch_size", 32, "sequences per optimizer step");
    cfg_def_int(c, "data.max_token_len_per_micro_batch", 2048, "tokens per packed micro-batch");
    cfg_def_float(c, "optim.lr", 3e-3, "peak learning rate");
    cfg_def_float(c, "optim.weight_decay", 0.01, "AdamW decoupled weight decay");
    cfg_def_float(c, "optim.beta1", 0.9, "AdamW beta1");
    cfg_def_float(c, "optim.beta2", 0.95, "AdamW beta2");
    cfg_def_float(c, "optim.clip_grad", 1.0, "global gradient-norm clip");
    cfg_def_str(c, "optim.lr_scheduler", "cosine", "constant or cosine");
    cfg_def_float(c, "optim.lr_warmup_steps_ratio", 0.05, "warmup share of the steps");
    cfg_def_float(c, "optim.min_lr_ratio", 0.1, "cosine floor as a share of lr");
    cfg_def_int(c, "trainer.total_epochs", 1, "passes over the training data");
    cfg_def_int(c, "trainer.total_training_steps", 0, "stop after this many steps (0 = epochs decide)");
    cfg_def_str(c, "trainer.default_local_dir", "runs/sft", "output folder (config, metrics, checkpoint)");
    cfg_def_int(c, "trainer.test_freq", 0, "held-out eval every n steps (0 = only before and after)");
    cfg_def_int(c, "trainer.val_n", 200, "held-out rows evaluated");
    cfg_def_int(c, "trainer.seed", 1, "data shuffling seed");
    cfg_def_int(c, "trainer.n_threads", 0, "compute threads (0 = all cores)");
    cfg_def_bool(c, "trainer.save_bf16", false, "store the checkpoint in bf16");
    cfg_def_str(c, "trainer.resume_mode", "auto", "auto (continue from the folder's checkpoint) | disable (start anew)");
    cfg_def_int(c, "trainer.save_freq", 0, "checkpoint every n steps (0 = at the end and on Ctrl-C only)");
    cfg_def_bool(c, "trainer.overwrite_output_dir", false,
                 "with trainer.resume_mode=disable: replace the checkpoint a folder already holds");
    par_def_keys(c);
}

static int check_sched(const char *key, const char *s) {
    if (strcmp(s, "constant") && strcmp(s, "cosine"))
        return moerl_errorf("%s: '%s' is not constant or cosine", key, s);
    return MOERL_OK;
}

/* The output folder must not hold a `moerl rl` run (one stopped in its SFT warm start leaves only
 * sft_checkpoint/): moerl sft would write its checkpoint/ and config.yaml into it, and a later
 * `moerl rl` there would resume neither. Checked before anything is written. */
static int sft_check_not_rl_run(const char *out) {
    char sim[4200];
    snprintf(sim, sizeof sim, "%s/%s", out, CLI_SIMULATION_MARKER);
    if (access(sim, F_OK) == 0)
        return moerl_errorf("output folder '%s' holds a simulation (%s, written by moerl simulate), not a moerl sft "
                            "run: choose another trainer.default_local_dir", out, CLI_SIMULATION_MARKER);
    static const char *marks[] = {"sft_checkpoint", "checkpoint/trainer_state.json",
                                  "checkpoint.old/trainer_state.json", "samples.jsonl", "sft_metrics.jsonl"};
    char found[400] = "", p[4200];
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", out, marks[i]);
        if (access(p, F_OK) == 0)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", found[0] ? ", " : "", marks[i]);
    }
    if (!found[0]) return MOERL_OK;
    return moerl_errorf("output folder '%s' holds a moerl rl run (%s), not a moerl sft run: moerl sft would write its "
                        "checkpoint/ and config.yaml into it; choose another trainer.default_local_dir (or continue "
                        "that run with moerl rl)", out, found);
}

/* What moerl sft writes once its checks (the resume's too) have passed: sft_opts.on_checked. */
typedef struct {
    const cfg *c;
    const char *out;
    cli_staged_data *staged;
} sft_checked_arg;

static int sft_on_checked(void *arg) {
    const sft_checked_arg *a = arg;
    char path[4200];
    if (cli_staged_commit(a->staged) != MOERL_OK) return MOERL_ERR;
    snprintf(path, sizeof path, "%s/config.yaml", a->out);
    return cfg_dump_yaml(a->c, path);
}

/* Every trainer rank learns whether all of them got here with rc == MOERL_OK (one process: rc). */
/* Set by agree: this rank failed where others did not, so its message is its own to print (a failure
 * every rank reaches alike — a configuration, a layout — is printed by rank 0 alone). */
static int g_own_failure;

static int agree(dist_ctx *ctx, int rc) {
    if (ctx->trainer_size <= 1) return rc;
    double bad = rc != MOERL_OK;
    if (dist_allreduce_sum(ctx, DIST_TRAINERS, &bad, 1) != MOERL_OK) return MOERL_ERR;
    if (bad > 0 && rc == MOERL_OK) return moerl_errorf("another rank failed (its message is above)");
    g_own_failure = rc != MOERL_OK && bad < ctx->trainer_size;
    return rc;
}

/* One SFT run: every rank of ctx (roles split, all trainers) calls it. Returns the exit code (0 ok,
 * 1 error, printed by the rank that failed; rank 0 prints a failure it learns of too). */
static int sft_main(cfg *c, dist_ctx *ctx) {
    const int root = ctx->trainer_rank <= 0;
    par_state ps = {0};
    cli_set_threads((int)cfg_int(c, "trainer.n_threads"));
    const char *out = cfg_str(c, "trainer.default_local_dir");
    char path[4200], mpath[4200];
    moe_model m = {0};
    dataset train = {0}, test = {0};
    cli_outdir od = {0};
    cli_staged_data staged = {0};
    int opened = 0, quiet_error = 0; /* quiet_error: another rank reports this rank's failure */
    int together = 1;                  /* a failure reaches every rank alike (config, agree) */
    static const char *subdirs[] = {"checkpoint"};
    /* checks that write nothing first: a bad configuration or model leaves no folder behind (every
     * rank checks; only rank 0 creates and fills the folder, the others then read its data) */
    static const char *why_test = "moerl sft evaluates on them before and after training";
    int rc = check_sched("optim.lr_scheduler", cfg_str(c, "optim.lr_scheduler"));
    if (rc == MOERL_OK) rc = cli_outdir_check_subdirs(out, subdirs, 1);
    if (rc == MOERL_OK) rc = sft_check_not_rl_run(out);
    if (rc == MOERL_OK) rc = cli_check_data_keys(c, why_test);
    if (rc == MOERL_OK) {
        par_config pc;
        rc = par_read_keys(c, &pc);
    }
    if (rc == MOERL_OK) rc = cli_build_model(c, &m);
    if (agree(ctx, rc) != MOERL_OK) goto fail;
    if (root) {
        rc = cli_outdir_open(&od, out);
        opened = rc == MOERL_OK;
        if (rc == MOERL_OK) rc = cli_prepare_data_staged(c, out, &train, &test, &staged);
        if (rc == MOERL_OK) rc = cli_check_held_out_rows(c, &test, why_test);
        /* config.yaml and the data are written once the resume checks pass (sft_on_checked) */
    }
    if (agree(ctx, rc) != MOERL_OK) goto fail;
    if (!root && cli_prepare_data_staged(c, out, &train, &test, &staged) != MOERL_OK) rc = MOERL_ERR;
    /* the held-out evaluation generates up to data.max_response_length tokens after a prompt: within the
     * model's context, checked before the folder changes (alike on every rank) */
    if (rc == MOERL_OK)
        rc = rl_check_context(&train, (int)cfg_int(c, "data.max_response_length"), m.cfg.max_position_embeddings, NULL);
    if (!root) { /* loaded: rank 0 alone keeps the files, once checked (data/ is its to remove) */
        staged.data_dir[0] = 0;
        cli_staged_discard(&staged);
    }
    if (agree(ctx, rc) != MOERL_OK) goto fail;
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", out);
    sft_opts o = {.batch_size = (int)cfg_int(c, "data.train_batch_size"),
                  .max_tokens = (int)cfg_int(c, "data.max_token_len_per_micro_batch"),
                  .total_epochs = cfg_int(c, "trainer.total_epochs"),
                  .total_steps = cfg_int(c, "trainer.total_training_steps"),
                  .optim = {.lr = (float)cfg_float(c, "optim.lr"), .beta1 = (float)cfg_float(c, "optim.beta1"),
                            .beta2 = (float)cfg_float(c, "optim.beta2"), .eps = 1e-8f,
                            .weight_decay = (float)cfg_float(c, "optim.weight_decay"),
                            .max_grad_norm = (float)cfg_float(c, "optim.clip_grad")},
                  .lr_scheduler = cfg_str(c, "optim.lr_scheduler"),
                  .warmup_ratio = (float)cfg_float(c, "optim.lr_warmup_steps_ratio"),
                  .min_lr_ratio = (float)cfg_float(c, "optim.min_lr_ratio"),
                  .test_freq = (int)cfg_int(c, "trainer.test_freq"),
                  .val_n = (int)cfg_int(c, "trainer.val_n"),
                  .max_response_length = (int)cfg_int(c, "data.max_response_length"),
                  .seed = (uint64_t)cfg_int(c, "trainer.seed"),
                  .metrics_path = mpath,
                  .label = "sft",
                  .steps_key = "trainer.total_training_steps (or trainer.total_epochs)"};
    const char *rm = cfg_str(c, "trainer.resume_mode");
    if (strcmp(rm, "auto") && strcmp(rm, "disable")) {
        moerl_errorf("trainer.resume_mode: '%s' is not auto or disable", rm);
        goto fail;
    }
    if (cfg_int(c, "trainer.save_freq") < 0) {
        moerl_errorf("trainer.save_freq must be ≥ 0 (0 = at the end only), got %lld",
                     (long long)cfg_int(c, "trainer.save_freq"));
        goto fail;
    }
    char state[4200];
    snprintf(state, sizeof state, "%s/checkpoint", out);
    {
        char mp2[4300];
        snprintf(mp2, sizeof mp2, "%s/model.safetensors", state);
        const int holds = access(mp2, F_OK) == 0;
        if (!strcmp(rm, "disable") && holds && !cfg_bool(c, "trainer.overwrite_output_dir")) {
            moerl_errorf("%s already holds a checkpoint and trainer.resume_mode=disable would replace it: set "
                         "trainer.overwrite_output_dir=true to do that, resume it (trainer.resume_mode=auto), or use "
                         "another trainer.default_local_dir", state);
            goto fail;
        }
        if (cfg_bool(c, "trainer.overwrite_output_dir") && strcmp(rm, "disable")) {
            moerl_errorf("trainer.overwrite_output_dir=true needs trainer.resume_mode=disable (with auto the run resumes)");
            goto fail;
        }
    }
    if (agree(ctx, par_state_init(&ps, ctx, c, &m)) != MOERL_OK) goto fail;
    o.dist = ctx;
    o.par = &ps;
    int stop_signal = 0;
    o.state_dir = state;
    o.save_freq = (int)cfg_int(c, "trainer.save_freq");
    o.resume = !strcmp(rm, "auto");
    o.stop_signal_out = &stop_signal;
    o.quiet_error_out = &quiet_error;
    sft_checked_arg checked = {.c = c, .out = out, .staged = &staged};
    o.on_checked = sft_on_checked;
    int nothing_left = 0;
    o.nothing_left_out = &nothing_left;
    o.on_checked_arg = &checked;
    moerl_install_stop_signals();
    double a0, a1;
    if (agree(ctx, sft_train(&m, &train, &test, &o, &a0, &a1)) != MOERL_OK) {
        g_own_failure = 1; /* sft_train says who reports (quiet_error) */
        if (strstr(moerl_last_error(), "made with other training data")) /* name the data.* keys that changed */
            cli_name_changed_data_keys(c, out);
        goto fail;
    }
    par_state_free(&ps); /* the whole model back in m on every rank (FSDP gathers it) */
    if (stop_signal) {
        if (root)
            fprintf(stderr, "moerl sft: stopped by signal %d after a checkpoint in %s; resume with the same command "
                        "(trainer.resume_mode=auto)\n", stop_signal, state);
        model_free(&m);
        dataset_free(&train);
        dataset_free(&test);
        return 128 + stop_signal;
    }
    if (!root) {
        model_free(&m);
        dataset_free(&train);
        dataset_free(&test);
        return 0;
    }
    together = 0; /* from here on rank 0 alone */
    snprintf(path, sizeof path, "%s/checkpoint", out);
    if (!nothing_left) { /* else the checkpoint stays as it is (a1: the accuracy recorded at its end) */
        if (cli_save_checkpoint(&m, path, cfg_bool(c, "trainer.save_bf16")) != MOERL_OK) goto fail;
        log_info("checkpoint written to %s", path);
    }
    json_t *j = json_object();
    json_object_set_new(j, "accuracy_before", cli_json_real(a0));
    json_object_set_new(j, "accuracy_after", cli_json_real(a1));
    json_object_set_new(j, "checkpoint", cli_json_text(path, strlen(path)));
    cli_print_json(j, 6);
    model_free(&m);
    dataset_free(&train);
    dataset_free(&test);
    return 0;
fail:
    /* while together, the ranks failed alike (checks every rank makes, agree) unless agree says otherwise */
    if (!quiet_error && (!together || root || g_own_failure)) cli_print_error("sft", moerl_last_error());
    par_state_free(&ps);
    cli_staged_discard(&staged);
    if (opened) cli_outdir_abandon(&od);
    /* the message is out and the folder gone before any rank exits (mpirun then ends the others) */
    if (together) dist_barrier(ctx, DIST_WORLD);
    model_free(&m);
    dataset_free(&train);
    dataset_free(&test);
    return 1;
}

int cmd_sft(int argc, char **argv) {
    cfg *c = cfg_new();
    sft_def_keys(c);
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
    if (dist_split_roles(ctx, ctx->world_size) != MOERL_OK) {
        cli_print_error("sft", moerl_last_error());
        code = 1;
    } else {
        code = sft_main(c, ctx);
    }
    dist_finalize(ctx);
    cfg_free(c);
    return code;
}

void sft_def_warm_start_keys(cfg *c) {
    cfg_def_int(c, "sft.total_training_steps", 0, "SFT warm-start steps before RL (0 = none)");
    cfg_def_int(c, "sft.train_batch_size", 32, "warm start: sequences per step");
    cfg_def_float(c, "sft.lr", 3e-3, "warm start: peak learning rate");
    cfg_def_str(c, "sft.lr_scheduler", "cosine", "warm start: constant or cosine");
    cfg_def_float(c, "sft.lr_warmup_steps_ratio", 0.05, "warm start: warmup share");
    cfg_def_float(c, "sft.weight_decay", 0.01, "warm start: AdamW weight decay");
    cfg_def_int(c, "sft.test_freq", 0, "warm start: held-out eval every n steps (0 = before/after only)");
    cfg_def_float(c, "sft.stop_at_accuracy", 0.0,
                  "warm start: stop once a periodic eval on the validation split reaches this accuracy (0 = off)");
    cfg_def_int(c, "sft.validation_rows", 0,
                "warm start: the last n training rows form a validation split for the periodic evals and the stop "
                "(trained on by neither SFT nor RL); required by stop_at_accuracy");
}

int sft_split_validation(const cfg *c, dataset *train, dataset *val) {
    memset(val, 0, sizeof *val);
    const int64_t n = cfg_int(c, "sft.validation_rows");
    if (cfg_float(c, "sft.stop_at_accuracy") > 0 && cfg_int(c, "sft.total_training_steps") > 0 && n <= 0)
        return moerl_errorf("sft.stop_at_accuracy needs a validation split (sft.validation_rows > 0): stopping on the "
                            "held-out split would select on the accuracy the run reports");
    const double stop = cfg_float(c, "sft.stop_at_accuracy");
    if (!(stop >= 0 && stop <= 1))
        return moerl_errorf("sft.stop_at_accuracy must be an accuracy in [0, 1] (0 = off), got %g", stop);
    if (stop > 0 && cfg_int(c, "sft.total_training_steps") > 0 && cfg_int(c, "sft.test_freq") <= 0)
        return moerl_errorf("sft.stop_at_accuracy=%g needs periodic evaluations: set sft.test_freq > 0", stop);
    if (n < 0) return moerl_errorf("sft.validation_rows must be ≥ 0 (0 = no validation split), got %lld", (long long)n);
    if (n == 0) return MOERL_OK;
    if (n >= dataset_count(train))
        return moerl_errorf("sft.validation_rows=%lld leaves no training rows (the training data has %lld)",
                            (long long)n, (long long)dataset_count(train));
    /* move the last n rows (their contents now owned by val) */
    val->rows = xmalloc((size_t)n * sizeof(ds_row));
    memcpy(val->rows, train->rows + (train->n - n), (size_t)n * sizeof(ds_row));
    val->n = n;
    char p[4200];
    snprintf(p, sizeof p, "%s (last %lld rows: validation)", train->path, (long long)n);
    val->path = xstrdup(p);
    train->n -= n;
    return MOERL_OK;
}

int sft_warm_start(const cfg *c, moe_model *m, const dataset *train, const dataset *val, const dataset *test,
                   const char *out_dir, double *acc_before, double *acc_after, int (*on_checked)(void *),
                   void *on_checked_arg) {
    int64_t steps = cfg_int(c, "sft.total_training_steps");
    if (steps <= 0) return MOERL_OK;
    if (check_sched("sft.lr_scheduler", cfg_str(c, "sft.lr_scheduler")) != MOERL_OK) return MOERL_ERR;
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/sft_metrics.jsonl", out_dir);
    sft_opts o = {.batch_size = (int)cfg_int(c, "sft.train_batch_size"),
                  .max_tokens = (int)cfg_int(c, "actor.ppo_max_token_len_per_gpu"),
                  .total_epochs = 1000000,
                  .total_steps = steps,
                  .optim = {.lr = (float)cfg_float(c, "sft.lr"), .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                            .weight_decay = (float)cfg_float(c, "sft.weight_decay"), .max_grad_norm = 1.0f},
                  .lr_scheduler = cfg_str(c, "sft.lr_scheduler"),
                  .warmup_ratio = (float)cfg_float(c, "sft.lr_warmup_steps_ratio"),
                  .min_lr_ratio = 0.1f,
                  .test_freq = (int)cfg_int(c, "sft.test_freq"),
                  .stop_accuracy = cfg_float(c, "sft.stop_at_accuracy"),
                  .validation = val && dataset_count(val) > 0 ? val : NULL,
                  .val_n = (int)cfg_int(c, "trainer.val_n"),
                  /* RL's trainer.val_n = 0 means no held-out evaluation (SFT's val_n ≤ 0: every row) */
                  .no_held_out_eval = cfg_int(c, "trainer.val_n") == 0,
                  .max_response_length = (int)cfg_int(c, "data.max_response_length"),
                  .seed = (uint64_t)cfg_int(c, "trainer.seed"),
                  .metrics_path = mpath,
                  .label = "sft warm start",
                  .steps_key = "sft.total_training_steps",
                  .state_dir = NULL};
    char state[4200];
    snprintf(state, sizeof state, "%s/sft_checkpoint", out_dir);
    o.state_dir = state; /* a warm start stopped by a signal (or killed) resumes from here */
    o.resume = !strcmp(cfg_str(c, "trainer.resume_mode"), "auto");
    o.on_checked = on_checked; /* the caller's writes, once the warm start's resume checks have passed */
    o.on_checked_arg = on_checked_arg;
    int stop_signal = 0;
    o.stop_signal_out = &stop_signal;
    if (sft_train(m, train, test, &o, acc_before, acc_after) != MOERL_OK) return moerl_error_prefix("sft warm start: ");
    if (stop_signal) return MOERL_OK; /* the caller sees moerl_stop_requested() and exits */
    char path[4200];
    snprintf(path, sizeof path, "%s/sft_checkpoint", out_dir);
    return cli_save_checkpoint(m, path, 0);
}
