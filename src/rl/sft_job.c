/* The SFT jobs: `moerl sft` and the warm start of `moerl rl` (see sft_job.h). */
#include "rl/sft_job.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/outdir.h"
#include "base/signals.h"
#include "data/data_config.h"
#include "data/tokenizer.h"
#include "model/model_config.h"
#include "parallel/config.h"
#include "parallel/parallel.h"
#include "reward/reward.h"
#include "rl/rl.h"
#include "rl/sft.h"

/* A checkpoint and, beside it, the files of the current tokenizer (tokenizer_save). */
static int sft_save_checkpoint(const moe_model *m, const char *dir, int bf16) {
    if (model_save_hf(m, dir, bf16, 0) != MOERL_OK) return MOERL_ERR;
    return tokenizer_save(tok_current(), dir);
}

/* moerl rl's spelling of moerl sft's keys (its actor's optimizer, its SFT warm start's sft.*), for the messages
 * of an rl key given to sft (cfg_set_other_command): pairs of (rl's, sft's); a prefix ends in '.'. */
static const char *const k_rl_spellings[] = {
    "actor.optim.", "optim.",
    "sft.total_training_steps", "trainer.total_training_steps",
    "sft.train_batch_size", "data.train_batch_size",
    "sft.lr", "optim.lr",
    "sft.lr_scheduler", "optim.lr_scheduler",
    "sft.lr_warmup_steps_ratio", "optim.lr_warmup_steps_ratio",
    "sft.weight_decay", "optim.weight_decay",
    "sft.test_freq", "trainer.test_freq",
};

void sft_def_job_keys(cfg *c) {
    model_def_keys(c);
    model_def_train_keys(c); /* model.enable_gradient_checkpointing, actor.recompute_granularity */
    rl_def_allocator_keys(c); /* trainer.allocator, trainer.allocator_reserve (src/rl/config.c) */
    data_def_keys(c);
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
    metrics_def_logger_key(c, "trainer.logger");
    cfg_def_bool(c, "trainer.overwrite_output_dir", false,
                 "with trainer.resume_mode=disable: replace the checkpoint a folder already holds");
    par_def_keys(c);
    reward_def_keys(c); /* reward.*: the held-out accuracy's reward, as moerl rl's (src/reward/reward_config.c) */
    cfg_def_bool(c, "debug.test_no_pp_share_check", false,
                 "test only: skip the pipeline's batch-share check at the start (the in-step check refuses instead)");
    cfg *rl = cfg_new(); /* moerl rl's keys, named in sft's unknown-key messages */
    rl_def_keys(rl);
    cfg_set_other_command(c, "moerl sft", rl, "moerl rl", k_rl_spellings,
                          (int)(sizeof k_rl_spellings / sizeof *k_rl_spellings / 2));
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
    snprintf(sim, sizeof sim, "%s/%s", out, MOERL_SIMULATION_MARKER);
    if (access(sim, F_OK) == 0)
        return moerl_errorf("output folder '%s' holds a simulation (%s, written by moerl simulate), not a moerl sft "
                            "run: choose another trainer.default_local_dir", out, MOERL_SIMULATION_MARKER);
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
    data_staged *staged;
} sft_checked_arg;

static int sft_on_checked(void *arg) {
    const sft_checked_arg *a = arg;
    char path[4200];
    if (data_staged_commit(a->staged) != MOERL_OK) return MOERL_ERR;
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

/* The state of one sft_job_run on this rank. */
typedef struct {
    const cfg *c;
    dist_ctx *ctx;
    int root;
    const char *out;
    moe_model m;
    dataset train, test;
    par_state ps;
    moerl_outdir od;
    data_staged staged;
    int opened, quiet_error;
    int together; /* a failure reaches every rank alike (config, agree) */
} sft_job;

static const char *k_sft_why_test = "moerl sft evaluates on them before and after training";

/* Checks that write nothing (every rank), then rank 0 makes the folder and stages the data, then the
 * other ranks read it. */
static int sft_job_setup(sft_job *J) {
    const cfg *c = J->c;
    static const char *subdirs[] = {"checkpoint"};
    int rc = rl_select_allocator(c); /* trainer.allocator: before any buffer */
    if (rc == MOERL_OK) rc = check_sched("optim.lr_scheduler", cfg_str(c, "optim.lr_scheduler"));
    if (rc == MOERL_OK) rc = moerl_outdir_check_subdirs(J->out, subdirs, 1);
    if (rc == MOERL_OK) rc = sft_check_not_rl_run(J->out);
    if (rc == MOERL_OK) rc = data_check_keys(c, k_sft_why_test);
    if (rc == MOERL_OK) {
        par_config pc;
        rc = par_read_keys(c, &pc);
        char advice[160]; /* every process of moerl sft trains: the ranks are mpirun's */
        const int T = J->ctx->trainer_size > 1 ? J->ctx->trainer_size : 1;
        snprintf(advice, sizeof advice, "run under mpirun with build/moerl-mpi and ≥ 2 processes, e.g. `mpirun -np 2 "
                 "build/moerl-mpi sft ...` (every process of moerl sft trains; it has %d)", T);
        if (rc == MOERL_OK) rc = par_check_ranks(&pc, T, advice); /* before the model is built, as moerl rl */
    }
    if (rc == MOERL_OK) rc = model_build_from_keys(c, &J->m);
    if (rc == MOERL_OK) rc = data_use_model_tokenizer(c, J->m.cfg.vocab_size);
    if (agree(J->ctx, rc) != MOERL_OK) return MOERL_ERR;
    if (J->root) {
        rc = moerl_outdir_open(&J->od, J->out);
        J->opened = rc == MOERL_OK;
        if (rc == MOERL_OK) rc = data_prepare_staged_any_source(c, J->out, &J->train, &J->test, &J->staged);
        if (rc == MOERL_OK) rc = data_check_held_out_rows(c, &J->test, k_sft_why_test);
        /* config.yaml and the data are written once the resume checks pass (sft_on_checked) */
    }
    if (agree(J->ctx, rc) != MOERL_OK) return MOERL_ERR;
    if (!J->root && data_prepare_staged_any_source(c, J->out, &J->train, &J->test, &J->staged) != MOERL_OK)
        rc = MOERL_ERR;
    /* the held-out evaluation generates up to data.max_response_length tokens after a prompt: within the
     * model's context, checked before the folder changes (alike on every rank) */
    if (rc == MOERL_OK)
        rc = rl_check_context(&J->train, (int)cfg_int(c, "data.max_response_length"),
                              J->m.cfg.max_position_embeddings, NULL);
    if (!J->root) { /* loaded: rank 0 alone keeps the files, once checked (data/ is its to remove) */
        J->staged.data_dir[0] = 0;
        data_staged_discard(&J->staged);
    }
    return agree(J->ctx, rc);
}

/* The training options from the keys (paths into the caller's buffers). */
static sft_opts sft_job_opts(const cfg *c, const char *mpath, const char *state) {
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
    o.state_dir = state;
    o.save_freq = (int)cfg_int(c, "trainer.save_freq");
    o.resume = !strcmp(cfg_str(c, "trainer.resume_mode"), "auto");
    o.skip_pp_share_check = cfg_bool(c, "debug.test_no_pp_share_check");
    return o;
}

/* trainer.resume_mode, trainer.save_freq and trainer.overwrite_output_dir against the folder's
 * checkpoint (state). */
static int sft_check_resume_keys(const cfg *c, const char *state) {
    const char *rm = cfg_str(c, "trainer.resume_mode");
    if (strcmp(rm, "auto") && strcmp(rm, "disable"))
        return moerl_errorf("trainer.resume_mode: '%s' is not auto or disable", rm);
    if (cfg_int(c, "trainer.save_freq") < 0)
        return moerl_errorf("trainer.save_freq must be ≥ 0 (0 = at the end only), got %lld",
                            (long long)cfg_int(c, "trainer.save_freq"));
    char mp2[4300];
    snprintf(mp2, sizeof mp2, "%s/model.safetensors", state);
    const int holds = access(mp2, F_OK) == 0;
    if (!strcmp(rm, "disable") && holds && !cfg_bool(c, "trainer.overwrite_output_dir"))
        return moerl_errorf("%s already holds a checkpoint and trainer.resume_mode=disable would replace it: set "
                            "trainer.overwrite_output_dir=true to do that, resume it (trainer.resume_mode=auto), or use "
                            "another trainer.default_local_dir", state);
    if (cfg_bool(c, "trainer.overwrite_output_dir") && strcmp(rm, "disable"))
        return moerl_errorf("trainer.overwrite_output_dir=true needs trainer.resume_mode=disable (with auto the run resumes)");
    return MOERL_OK;
}

/* The evals scored by the run's reward pool (val_score_fn). */
static int warm_start_score(void *ctx, const reward_request *reqs, int n, reward_result *out) {
    return reward_pool_score(ctx, reqs, n, out);
}

static int sft_job_train_with(sft_job *J, sft_job_result *res, sft_opts *op);

/* The held-out accuracy's reward (reward.*, as moerl rl's): a reward.* source gives *pool (on rank 0,
 * which evaluates; o->score); with the built-in rewards, held-out rows whose data_source has none are
 * evaluated by nobody: training needs no reward, so the run goes on without held-out accuracy and
 * says so once. */
static int sft_job_reward(sft_job *J, sft_opts *o, reward_pool **pool) {
    reward_config rc;
    *pool = NULL;
    if (reward_read_config(J->c, &rc) != MOERL_OK) return MOERL_ERR;
    if (rc.kind != REWARD_BUILTIN) {
        if (!J->root) return MOERL_OK;
        reward_backend *b = reward_backend_create(&rc);
        *pool = b ? reward_pool_create(b) : NULL;
        if (!*pool) return MOERL_ERR;
        o->score = warm_start_score;
        o->score_ctx = *pool;
        return MOERL_OK;
    }
    const char *src = data_source_without_reward(&J->test);
    if (!src || o->no_held_out_eval) return MOERL_OK;
    o->no_held_out_eval = 1;
    o->no_held_out_why = "no reward for the held-out rows' data_source";
    if (J->root)
        log_warn("held-out rows of data_source '%s' (%s) have no built-in reward: no held-out accuracy is measured, "
                 "the training loss is the measure; set reward.custom_reward_function.path (or reward.command, "
                 "reward.url) to score them (docs/rewards.md)", src, J->test.path ? J->test.path : "data.val_files");
    return MOERL_OK;
}

/* Train (every rank), then rank 0 saves the checkpoint. */
static int sft_job_train(sft_job *J, sft_job_result *res) {
    const cfg *c = J->c;
    char mpath[4200], state[4200];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", J->out);
    snprintf(state, sizeof state, "%s/checkpoint", J->out);
    if (sft_check_resume_keys(c, state) != MOERL_OK) return MOERL_ERR;
    sft_opts o = sft_job_opts(c, mpath, state);
    if (metrics_read_logger_key(c, "trainer.logger", &o.metrics_loggers) != MOERL_OK) return MOERL_ERR;
    reward_pool *pool = NULL;
    if (agree(J->ctx, sft_job_reward(J, &o, &pool)) != MOERL_OK) return MOERL_ERR;
    const int trc = sft_job_train_with(J, res, &o);
    reward_pool_free(pool);
    return trc;
}

/* sft_job_train with its options made. */
static int sft_job_train_with(sft_job *J, sft_job_result *res, sft_opts *op) {
    const cfg *c = J->c;
    sft_opts o = *op;
    char state[4200];
    snprintf(state, sizeof state, "%s/checkpoint", J->out);
    if (agree(J->ctx, par_state_init(&J->ps, J->ctx, c, &J->m)) != MOERL_OK) return MOERL_ERR;
    o.dist = J->ctx;
    o.par = &J->ps;
    o.stop_signal_out = &res->stop_signal;
    o.quiet_error_out = &J->quiet_error;
    sft_checked_arg checked = {.c = c, .out = J->out, .staged = &J->staged};
    o.on_checked = sft_on_checked;
    o.on_checked_arg = &checked;
    int nothing_left = 0;
    o.nothing_left_out = &nothing_left;
    moerl_install_stop_signals();
    if (agree(J->ctx, sft_train(&J->m, &J->train, &J->test, &o, &res->acc_before, &res->acc_after)) != MOERL_OK) {
        g_own_failure = 1; /* sft_train says who reports (quiet_error) */
        if (strstr(moerl_last_error(), "made with other training data")) /* name the data.* keys that changed */
            data_name_changed_keys(c, J->out);
        return MOERL_ERR;
    }
    par_state_free(&J->ps); /* the whole model back in m on every rank (FSDP gathers it) */
    snprintf(res->checkpoint, sizeof res->checkpoint, "%s", state);
    if (res->stop_signal || !J->root) return MOERL_OK;
    J->together = 0; /* from here on rank 0 alone */
    if (!nothing_left) { /* else the checkpoint stays as it is (acc_after: the accuracy recorded at its end) */
        if (sft_save_checkpoint(&J->m, state, cfg_bool(c, "trainer.save_bf16")) != MOERL_OK) return MOERL_ERR;
        log_info("checkpoint written to %s", state);
    }
    return MOERL_OK;
}

int sft_job_run(const cfg *c, dist_ctx *ctx, sft_job_result *res, void (*report)(const char *msg)) {
    sft_job J;
    memset(&J, 0, sizeof J);
    memset(res, 0, sizeof *res);
    J.c = c;
    J.ctx = ctx;
    J.root = res->root = ctx->trainer_rank <= 0;
    J.out = cfg_str(c, "trainer.default_local_dir");
    J.together = 1;
    g_own_failure = 0;
    log_shared_begin(); /* every rank checks and builds the same: its notes and warnings said once (rank 0) */
    int rc = sft_job_setup(&J);
    log_shared_end();
    if (rc == MOERL_OK) rc = sft_job_train(&J, res);
    if (rc != MOERL_OK) {
        /* while together, the ranks failed alike (checks every rank makes, agree) unless agree says otherwise */
        if (report && !J.quiet_error && (!J.together || J.root || g_own_failure)) report(moerl_last_error());
        par_state_free(&J.ps);
        data_staged_discard(&J.staged);
        if (J.opened) moerl_outdir_abandon(&J.od);
        /* the message is out and the folder gone before any rank exits (mpirun then ends the others) */
        if (J.together) dist_barrier(ctx, DIST_WORLD);
    }
    model_free(&J.m);
    dataset_free(&J.train);
    dataset_free(&J.test);
    return rc;
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
                  /* the rollout.* paged-KV keys (checked by rl_read_config) size the evals' engine too */
                  .eval_block_size = (int)cfg_int(c, "rollout.block_size"),
                  .eval_prefix_caching = cfg_bool(c, "rollout.enable_prefix_caching"),
                  .eval_kv_cache_bytes = cfg_int(c, "rollout.kv_cache_bytes"),
                  .eval_gpu_memory_utilization = cfg_float(c, "rollout.gpu_memory_utilization"),
                  .state_dir = NULL};
    char state[4200];
    snprintf(state, sizeof state, "%s/sft_checkpoint", out_dir);
    o.state_dir = state; /* a warm start stopped by a signal (or killed) resumes from here */
    o.resume = !strcmp(cfg_str(c, "trainer.resume_mode"), "auto");
    if (metrics_read_logger_key(c, "trainer.logger", &o.metrics_loggers) != MOERL_OK) return MOERL_ERR;
    o.on_checked = on_checked; /* the caller's writes, once the warm start's resume checks have passed */
    o.on_checked_arg = on_checked_arg;
    int stop_signal = 0;
    o.stop_signal_out = &stop_signal;
    /* the evals score with the run's reward (reward.*): a reward program's data_source has no built-in rule */
    reward_config rc;
    if (reward_read_config(c, &rc) != MOERL_OK) return MOERL_ERR;
    reward_pool *pool = NULL;
    if (rc.kind != REWARD_BUILTIN) {
        reward_backend *b = reward_backend_create(&rc);
        pool = b ? reward_pool_create(b) : NULL;
        if (!pool) return moerl_error_prefix("sft warm start: ");
        o.score = warm_start_score;
        o.score_ctx = pool;
    }
    multi_turn_config mt; /* a tool-use task's evals run trajectories with its tools, as RL's validation */
    if (cfg_has(c, "rollout.multi_turn.enable")) {
        if (multi_turn_read_config(c, &mt) != MOERL_OK) {
            reward_pool_free(pool);
            return MOERL_ERR;
        }
        o.multi_turn = &mt;
    }
    const int trc = sft_train(m, train, test, &o, acc_before, acc_after);
    reward_pool_free(pool);
    if (trc != MOERL_OK) return moerl_error_prefix("sft warm start: ");
    if (stop_signal) return MOERL_OK; /* the caller sees moerl_stop_requested() and exits */
    char path[4200];
    snprintf(path, sizeof path, "%s/sft_checkpoint", out_dir);
    return sft_save_checkpoint(m, path, 0);
}
