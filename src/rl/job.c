/* The main job's driver: threads (async) or one thread (lockstep / sync), the parameter
 * synchroniser, metrics, validation, checkpoints with resume, watchdog, plot. See rl.h. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/log.h"
#include "base/plot.h"
#include "base/signals.h"
#include "base/pool.h"
#include "data/tokenizer.h"
#include "model/safetensors.h"
#include "optim/onebit_adam.h"
#include "rl/job_internal.h"
#include "rl/rl.h"
#include "rl/state.h"
#include "dist/onebit.h"
#include "rl/trainer_onebit.h"
#include "train/ckpt.h"
#include "train/train.h"

void openblas_set_num_threads(int n);


/* ------------------------------------------------------------------ checkpoints */

static int write_checkpoint_files(job *J, const char *dir, const int64_t *inflight, int n_inflight);
static int job_save_checkpoint_whole(job *J, const int64_t *inflight, int n_inflight);

/* Called with the rollouter paused (inside a sync): a consistent snapshot of both roles.
 * Written into checkpoint.tmp/, then swapped in by renames (checkpoint → checkpoint.old,
 * checkpoint.tmp → checkpoint), so a kill at any moment leaves one complete checkpoint. */
int job_whole_begin(job *J, int moments) {
    if (J->whole_depth > 0 && (J->whole_moments || !moments)) {
        J->whole_depth++;
        return MOERL_OK;
    }
    MOERL_ASSERT(J->whole_depth == 0); /* a nested request needs no more than the outer one gathered */
    if (!J->ops || !J->ops->whole) {
        J->whole_m = J->m;
        J->whole_opt = J->T.opt;
    } else if (J->ops->whole(J, moments) != MOERL_OK) {
        return MOERL_ERR;
    }
    J->whole_depth = 1;
    J->whole_moments = moments;
    return MOERL_OK;
}

void job_whole_end(job *J) {
    MOERL_ASSERT(J->whole_depth > 0);
    if (--J->whole_depth > 0) return;
    if (J->ops && J->ops->whole_done) J->ops->whole_done(J);
    J->whole_m = NULL;
    memset(&J->whole_opt, 0, sizeof J->whole_opt);
    free(J->onebit_rows);
    J->onebit_rows = NULL;
    J->onebit_n_rows = 0;
}

/* actor.optim.name=onebit_adam past its freeze: every trainer rank's error buffers into
 * dir/onebit_adam.safetensors (trainer_onebit.h) — gathered by job_ops.whole, or the rows the trainer
 * holds (after the end, or resumed and not stepped since), or this process's own (one trainer). */
static int save_onebit_rows(job *J, const char *dir) {
    if (!trainer_onebit_frozen(&J->T)) return MOERL_OK; /* the error buffers are still zero */
    char p[4200];
    snprintf(p, sizeof p, "%s/onebit_adam.safetensors", dir);
    if (J->onebit_rows) return trainer_onebit_save(J->onebit_rows, J->onebit_n_rows, J->T.m->n_params, p);
    if (!J->T.onebit && J->T.onebit_rows)
        return trainer_onebit_save(J->T.onebit_rows, J->T.onebit_n_rows, J->T.m->n_params, p);
    if (!J->T.onebit) { /* at the freeze, before the first compressed step: the buffers are still zero */
        const int W = J->T.dist ? J->T.dist->trainer_size : 1;
        const size_t n = J->T.m->n_params;
        float *z = xcalloc((size_t)W * (n + onebit_chunk(n, W)), sizeof(float));
        const int rc = trainer_onebit_save(z, W, n, p);
        free(z);
        return rc;
    }
    if (J->T.dist && J->T.dist->trainer_size > 1)
        return moerl_errorf("checkpoint: the 1-bit Adam error buffers of the other trainer ranks were not gathered");
    float *rows;
    int n_rows;
    if (trainer_onebit_gather(&J->T, &rows, &n_rows) != MOERL_OK) return MOERL_ERR;
    const int rc = trainer_onebit_save(rows, n_rows, J->T.m->n_params, p);
    free(rows);
    return rc;
}

/* Resume: the error buffers of a checkpoint past the freeze into J->T.onebit_rows (zeros, with a
 * warning, when the checkpoint has none: it was written by actor.optim.name=adamw). */
static int load_onebit_rows(job *J, const char *dir) {
    if (!trainer_onebit_frozen(&J->T)) return MOERL_OK;
    const int W = J->cfg->n_trainer_ranks > 0 ? J->cfg->n_trainer_ranks : 1;
    char p[4200];
    snprintf(p, sizeof p, "%s/onebit_adam.safetensors", dir);
    if (access(p, R_OK) == 0) return trainer_onebit_load(&J->T, p, W);
    log_warn("%s: not found; the checkpoint is past actor.optim.freeze_step=%lld but was not written by 1-bit Adam: "
             "its error feedback starts at zero",
             p, (long long)J->cfg->optim_freeze_step);
    const size_t n = J->T.m->n_params;
    J->T.onebit_n_rows = W;
    J->T.onebit_rows = xcalloc((size_t)W * (n + onebit_chunk(n, W)), sizeof(float));
    return MOERL_OK;
}

int job_save_checkpoint(job *J, const int64_t *inflight, int n_inflight) {
    if (job_whole_begin(J, 1) != MOERL_OK) return MOERL_ERR;
    const int rc = job_save_checkpoint_whole(J, inflight, n_inflight);
    job_whole_end(J);
    return rc;
}

static int job_save_checkpoint_whole(job *J, const int64_t *inflight, int n_inflight) {
    char tmp[4200], cur[4200], old[4200];
    snprintf(tmp, sizeof tmp, "%s/checkpoint.tmp", J->cfg->out_dir);
    snprintf(cur, sizeof cur, "%s/checkpoint", J->cfg->out_dir);
    snprintf(old, sizeof old, "%s/checkpoint.old", J->cfg->out_dir);
    ckpt_remove_flat_dir(tmp);
    if (write_checkpoint_files(J, tmp, inflight, n_inflight) != MOERL_OK) return MOERL_ERR;
    if (ckpt_swap_dir(tmp, cur) != MOERL_OK) return MOERL_ERR;
    log_info("checkpoint at version %d (step %lld) written to %s", J->T.version, (long long)J->T.step, cur);
    return MOERL_OK;
}

static int write_checkpoint_files(job *J, const char *dir, const int64_t *inflight, int n_inflight) {
    const rl_config *c = J->cfg;
    char p[4200];
    if (moerl_mkdirs(dir) != MOERL_OK) return MOERL_ERR;
    if (model_save_hf(J->whole_m, dir, c->save_bf16, 0) != MOERL_OK) return MOERL_ERR;
    if (tokenizer_save(tok_current(), dir) != MOERL_OK) return MOERL_ERR; /* the files the run started from */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (ckpt_save_optimizer(&J->whole_opt, p) != MOERL_OK || save_onebit_rows(J, dir) != MOERL_OK) return MOERL_ERR;
    const prompt_feed *f = J->feed;
    rl_state st = {.version = J->T.version, .trainer_step = J->T.step, .optimizer_step = J->whole_opt.step,
                   .optimizer_skipped = J->whole_opt.skipped, .consumed_prompts = J->consumed, .feed_epoch = f->epoch,
                   .feed_pos = f->pos, .seed = c->seed, .n_rows = f->n_rows,
                   .data_fingerprint = dataset_fingerprint(J->train), .dropped_prompts = J->dropped,
                   .last_val_accuracy = isfinite(J->last_val) ? J->last_val : NAN,
                   .kl_ctrl_value = c->use_kl_in_reward ? J->T.kl_ctrl.value : NAN,
                   .optimizer_freeze_step = c->optim_name == OPTIM_ONEBIT_ADAM ? c->optim_freeze_step : 0,
                   .optimizer_var_update_interval = c->optim_name == OPTIM_ONEBIT_ADAM ? c->optim_var_update_interval : 0};
    snprintf(st.optimizer, sizeof st.optimizer, "%s", optim_name_str((optim_name)c->optim_name));
    /* unconsumed started prompts: redo list left over from an earlier resume, then in-flight, then queued */
    const int qcap = J->queue.cap > 0 ? J->queue.cap : 1;
    void **q = xmalloc((size_t)qcap * sizeof(void *));
    const int nq = rl_queue_peek_all(&J->queue, q, qcap);
    st.unconsumed_started = xmalloc((size_t)(f->n_redo - f->redo_pos + n_inflight + nq + 1) * sizeof(int64_t));
    for (int i = f->redo_pos; i < f->n_redo; i++) st.unconsumed_started[st.n_unconsumed++] = f->redo[i];
    for (int i = 0; i < n_inflight; i++) st.unconsumed_started[st.n_unconsumed++] = inflight[i];
    for (int i = 0; i < nq; i++) st.unconsumed_started[st.n_unconsumed++] = ((rl_group *)q[i])->uid;
    free(q);
    fflush(J->samples);
    st.samples_log_bytes = ftell(J->samples);
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    const int rc = rl_state_write(p, &st); /* refuses (naming the field) a state its reader would refuse */
    rl_state_free(&st);
    return rc;
}

int job_load_checkpoint(job *J, int *resumed) {
    const rl_config *c = J->cfg;
    char dir[4096], p[4200];
    *resumed = 0;
    snprintf(dir, sizeof dir, "%s/checkpoint", c->out_dir);
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    if (access(p, R_OK) != 0) { /* a kill between the two renames of save_checkpoint leaves .old */
        snprintf(dir, sizeof dir, "%s/checkpoint.old", c->out_dir);
        snprintf(p, sizeof p, "%s/trainer_state.json", dir);
        if (access(p, R_OK) != 0) { /* nothing to resume from — unless the folder holds another kind of checkpoint */
            snprintf(dir, sizeof dir, "%s/checkpoint/model.safetensors", c->out_dir);
            char idx[4200];
            snprintf(idx, sizeof idx, "%s/checkpoint/model.safetensors.index.json", c->out_dir);
            if (access(dir, F_OK) == 0 || access(idx, F_OK) == 0)
                return moerl_errorf("%s/checkpoint holds a checkpoint without trainer_state.json (a moerl sft run, or "
                                    "a copied model?), not an RL run to resume: use another trainer.default_local_dir "
                                    "(model.path can point at that checkpoint), or set trainer.resume_mode=disable "
                                    "trainer.overwrite_output_dir=true to replace it", c->out_dir);
            return MOERL_OK;
        }
    }
    prompt_feed *fd = J->feed;
    rl_state st;
    const rl_state_expect want = {.n_rows = fd->n_rows, .seed = c->seed, .data_fingerprint = dataset_fingerprint(J->train)};
    if (rl_state_load(&st, p, &want) != MOERL_OK) {
        rl_state_free(&st);
        return MOERL_ERR;
    }
    if (model_load_weights(J->m, dir) != MOERL_OK) {
        rl_state_free(&st);
        return moerl_errorf("%s; resuming needs the checkpoint's model: keep its model.* values (or set model.path), or "
                            "use a new trainer.default_local_dir, or trainer.resume_mode=disable "
                            "trainer.overwrite_output_dir=true", moerl_last_error());
    }
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (ckpt_load_optimizer(&J->T.opt, p) != MOERL_OK) {
        rl_state_free(&st);
        return MOERL_ERR;
    }
    J->T.version = st.version;
    J->T.step = st.trainer_step;
    J->T.opt.step = st.optimizer_step;
    J->T.opt.skipped = st.optimizer_skipped;
    if (load_onebit_rows(J, dir) != MOERL_OK) {
        rl_state_free(&st);
        return MOERL_ERR;
    }
    J->consumed = st.consumed_prompts;
    J->dropped = st.dropped_prompts;
    J->resumed_val = st.last_val_accuracy;
    if (!isnan(st.kl_ctrl_value)) J->T.kl_ctrl.value = st.kl_ctrl_value; /* use_kl_in_reward's β, exact resume */
    J->last_ckpt_step = J->T.step;
    /* the order of the checkpoint's epoch, at its position */
    prompt_feed_seek(fd, st.feed_epoch, st.feed_pos);
    free(fd->redo);
    fd->n_redo = st.n_unconsumed;
    fd->redo = xmalloc((size_t)(fd->n_redo + 1) * sizeof(int64_t));
    for (int i = 0; i < fd->n_redo; i++) fd->redo[i] = st.unconsumed_started[i];
    fd->redo_pos = 0;
    const long bytes = (long)st.samples_log_bytes;
    rl_state_free(&st);
    /* samples logged after the checkpoint belong to steps that are redone now */
    snprintf(p, sizeof p, "%s/samples.jsonl", c->out_dir);
    if (truncate(p, bytes) != 0 && errno != ENOENT) return moerl_errorf("cannot truncate %s: %s", p, strerror(errno));
    /* metrics of steps after the checkpoint are redone too: keep only records up to its step */
    snprintf(p, sizeof p, "%s/metrics.jsonl", c->out_dir);
    if (ckpt_truncate_metrics(p, (int64_t)J->T.step) != MOERL_OK) return MOERL_ERR;
    *resumed = 1;
    log_info("resumed from %s: version %d, step %lld, %lld prompts consumed, %d started prompts to redo", dir,
             J->T.version, (long long)J->T.step, (long long)J->consumed, fd->n_redo);
    return MOERL_OK;
}

/* ------------------------------------------------------------------ metrics */

int job_open_outputs(job *J, int resumed) {
    const rl_config *cfg = J->cfg;
    char p[4200];
    snprintf(p, sizeof p, "%s/metrics.jsonl", cfg->out_dir);
    if (!resumed) unlink(p); /* a new run starts a new record; a resumed one appends */
    J->mw = metrics_open_loggers(p, cfg->metrics_loggers ? cfg->metrics_loggers : METRICS_FILE,
                                 resumed ? (int64_t)J->T.step : -1);
    snprintf(p, sizeof p, "%s/samples.jsonl", cfg->out_dir);
    J->samples = fopen(p, resumed ? "a" : "w");
    if (!J->mw) return moerl_error_prefix("cannot open the run's metrics under %s: ", cfg->out_dir);
    if (!J->samples) return moerl_errorf("cannot open the run's output files under %s", cfg->out_dir);
    return MOERL_OK;
}

/* Close the outputs and free the engine, trainer, queued groups and J itself (every transport's
 * teardown; parts that were never set up are skipped). */
void job_free(job *J) {
    job_close_outputs(J);
    reward_pool_free(J->val_pool);
    for (int k = 0; k < J->n_rx; k++) free(J->rx_keys[k]);
    free(J->rx_keys);
    free(J->rx_sum);
    free(J->rx_cnt);
    if (J->R.eng) rollouter_free(&J->R);
    if (J->T.m) trainer_free(&J->T);
    if (J->queue.items) {
        void *g;
        while (rl_queue_try_get_n(&J->queue, &g, 1) == 1) rl_group_free(g);
        rl_queue_destroy(&J->queue);
    }
    free(J);
}

void job_close_outputs(job *J) {
    if (J->mw) metrics_close(J->mw);
    if (J->samples) fclose(J->samples);
    J->mw = NULL;
    J->samples = NULL;
}

/* FNV-1a 64 over the routing record's bytes (samples.jsonl "routes_fnv1a": runs compare routes by it). */
static uint64_t routes_digest(const int16_t *p, size_t nb) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < nb; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

void job_log_samples(job *J, rl_group **g, int n) {
    for (int i = 0; i < n; i++) {
        int vmin = 1 << 30, vmax = -1, intr = 0;
        for (int j = 0; j < g[i]->n; j++) {
            gen_request *r = &g[i]->reqs[j];
            for (int t = 0; t < r->n_out; t++) {
                vmin = MOERL_MIN(vmin, r->out_versions[t]);
                vmax = MOERL_MAX(vmax, r->out_versions[t]);
            }
            intr += r->n_interruptions > 0;
        }
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(J->T.step));
        json_object_set_new(o, "trainer_version", json_integer(J->T.version));
        json_object_set_new(o, "uid", json_integer(g[i]->uid));
        json_object_set_new(o, "epoch", json_integer(g[i]->epoch));
        json_object_set_new(o, "row", json_integer(g[i]->row));
        json_object_set_new(o, "start_version", json_integer(g[i]->start_version));
        json_object_set_new(o, "min_version", json_integer(vmin));
        json_object_set_new(o, "max_version", json_integer(vmax));
        json_object_set_new(o, "interrupted_responses", json_integer(intr));
        /* the exact ids rollout produced and training consumed, with the text and reward the
         * reward function saw (tests/e2e_text_task.sh checks them against `moerl tokenize`) */
        json_t *pids = json_array(), *resp = json_array();
        for (int64_t t = 0; t < g[i]->prompt.n; t++) json_array_append_new(pids, json_integer(g[i]->prompt.ids[t]));
        float *rw = xmalloc((size_t)(g[i]->n ? g[i]->n : 1) * sizeof(float));
        const int have_rw = trainer_group_rewards(&J->T, g[i], rw, NULL) == MOERL_OK;
        for (int j = 0; j < g[i]->n; j++) {
            const gen_request *r = &g[i]->reqs[j];
            json_t *ro = json_object(), *ids = json_array();
            for (int t = 0; t < r->n_out; t++) json_array_append_new(ids, json_integer(r->out_tokens[t]));
            json_object_set_new(ro, "ids", ids);
            size_t len = 0;
            char *txt = tok_decode(r->out_tokens, r->n_out, true, &len);
            json_t *js = txt ? json_stringn(txt, len) : NULL; /* NULL: not valid UTF-8 (a cut character) */
            json_object_set_new(ro, "text", js ? js : json_null());
            free(txt);
            json_object_set_new(ro, "reward", have_rw ? json_real(rw[j]) : json_null());
            const reward_result *x = g[i]->rewards ? &g[i]->rewards[j] : NULL;
            if (x && x->n_extra > 0) { /* the reward program's other numeric fields */
                json_t *ex = json_object();
                for (int e = 0; e < x->n_extra; e++)
                    json_object_set_new(ex, x->extra_keys[e], json_real(x->extra_vals[e]));
                json_object_set_new(ro, "reward_extra", ex);
            }
            if (x && x->pred) {
                json_t *ps = json_string(x->pred);
                if (ps) json_object_set_new(ro, "pred", ps);
            }
            if (g[i]->route_layers) { /* routing records: the tokens with a route and a digest of them */
                const size_t nb = (size_t)r->n_routes * g[i]->route_layers * g[i]->route_k * sizeof(int16_t);
                char hex[17];
                snprintf(hex, sizeof hex, "%016llx", (unsigned long long)routes_digest(r->out_routes, nb));
                json_object_set_new(ro, "n_routes", json_integer(r->n_routes));
                json_object_set_new(ro, "routes_fnv1a", json_string(hex));
            }
            if (g[i]->traj) { /* multi-turn: the loss mask (1 sampled, 0 inserted) and what the trajectory did */
                const agent_traj *t = &g[i]->traj[j];
                json_t *mk = json_array();
                for (int k = 0; k < r->n_out; k++) json_array_append_new(mk, json_integer(r->out_mask ? r->out_mask[k] : 1));
                json_object_set_new(ro, "loss_mask", mk);
                json_object_set_new(ro, "turns", json_integer(t->turns));
                json_object_set_new(ro, "tool_calls", json_integer(t->tool_calls));
                json_object_set_new(ro, "tool_errors", json_integer(t->tool_errors));
                json_object_set_new(ro, "finish", json_string(finish_reason_name(r->finish)));
                if (t->has_env_reward) json_object_set_new(ro, "env_reward", json_real(t->env_reward));
            }
            json_object_set_new(ro, "n_preemptions", json_integer(r->n_preemptions)); /* paged KV (docs/engine.md) */
            json_array_append_new(resp, ro);
        }
        free(rw);
        json_object_set_new(o, "prompt_ids", pids);
        json_object_set_new(o, "responses", resp);
        char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fprintf(J->samples, "%s\n", txt);
        free(txt);
        json_decref(o);
    }
    fflush(J->samples); /* whole lines at every step: tail -f and an abrupt end see parseable records */
}

int job_reward_score(void *ctx, const reward_request *reqs, int n, reward_result *out) {
    job *J = ctx;
    reward_pool *p = J->R.pool;
    if (!p) {
        if (!J->val_pool) {
            reward_backend *b = rl_reward_backend(J->cfg);
            J->val_pool = b ? reward_pool_create(b) : NULL;
            if (!J->val_pool) return moerl_error_prefix("validation rewards: ");
        }
        p = J->val_pool;
    }
    if (reward_pool_score(p, reqs, n, out) != MOERL_OK) {
        J->reward_failed = 1;
        return MOERL_ERR;
    }
    return MOERL_OK;
}

void job_add_reward_extras(job *J, rl_group *const *g, int n) {
    for (int i = 0; i < n; i++) /* multi-turn: what the trajectories did */
        for (int j = 0; g[i]->traj && j < g[i]->n; j++) {
            const agent_traj *t = &g[i]->traj[j];
            J->mt.n++;
            J->mt.turns += t->turns;
            J->mt.turns_max = MOERL_MAX(J->mt.turns_max, t->turns);
            J->mt.calls += t->tool_calls;
            J->mt.errors += t->tool_errors;
            J->mt.malformed += t->malformed_calls;
            J->mt.env_done += t->env_done;
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; g[i]->rewards && j < g[i]->n; j++) {
            const reward_result *x = &g[i]->rewards[j];
            for (int e = 0; e < x->n_extra; e++) {
                int k = 0;
                while (k < J->n_rx && strcmp(J->rx_keys[k], x->extra_keys[e]) != 0) k++;
                if (k == J->n_rx) {
                    if (J->n_rx == J->cap_rx) {
                        J->cap_rx = J->cap_rx ? 2 * J->cap_rx : 8;
                        J->rx_keys = xrealloc(J->rx_keys, (size_t)J->cap_rx * sizeof(char *));
                        J->rx_sum = xrealloc(J->rx_sum, (size_t)J->cap_rx * sizeof(double));
                        J->rx_cnt = xrealloc(J->rx_cnt, (size_t)J->cap_rx * sizeof(int64_t));
                    }
                    J->rx_keys[k] = xstrdup(x->extra_keys[e]);
                    J->rx_sum[k] = 0;
                    J->rx_cnt[k] = 0;
                    J->n_rx++;
                }
                J->rx_sum[k] += x->extra_vals[e];
                J->rx_cnt[k]++;
            }
        }
}

/* Multi-turn metrics of the window (rollout.multi_turn.enable) into keys/vals from n on: over the
 * trained trajectories num_turns/mean|max (assistant turns), tool_calls/mean, tool_errors/mean
 * (per trajectory), tool_calls/well_formed_rate (calls the parser accepted / calls written),
 * env/done_rate; and where the rollouter runs in this process (embedded job), over the calls answered
 * in the window: tool_latency/mean|max and timing_s/tool (seconds trajectories waited for tools,
 * summed). Resets the window. Returns n. */
static int multi_turn_metrics(job *J, const char **keys, double *vals, int n) {
    if (!J->cfg->multi_turn.enable) return n;
    const double k = J->mt.n > 0 ? (double)J->mt.n : NAN;
    keys[n] = "num_turns/mean", vals[n++] = J->mt.turns / k;
    keys[n] = "num_turns/max", vals[n++] = J->mt.n > 0 ? J->mt.turns_max : NAN;
    keys[n] = "tool_calls/mean", vals[n++] = J->mt.calls / k;
    keys[n] = "tool_errors/mean", vals[n++] = J->mt.errors / k;
    keys[n] = "tool_calls/well_formed_rate",
    vals[n++] = J->mt.calls > 0 ? (double)(J->mt.calls - J->mt.malformed) / (double)J->mt.calls : NAN;
    keys[n] = "env/done_rate", vals[n++] = J->mt.env_done / k;
    memset(&J->mt, 0, sizeof J->mt);
    if (J->R.agent) {
        agent_stats st;
        agent_loop_take_stats(J->R.agent, &st);
        keys[n] = "tool_latency/mean", vals[n++] = st.answered > 0 ? st.tool_latency_sum_s / (double)st.answered : NAN;
        keys[n] = "tool_latency/max", vals[n++] = st.tool_latency_max_s;
        keys[n] = "timing_s/tool", vals[n++] = st.tool_wait_s;
    }
    return n;
}

/* The reward metrics of the window into keys/vals from n on (names in names[], each 300 bytes):
 * timing_s/reward, reward/backlog, then reward/<field>/mean per extra field seen (a field some
 * responses lacked is averaged over those that have it). Resets the window's sums. Returns n. */
static int reward_metrics(job *J, const char **keys, double *vals, int n, char (*names)[300]) {
    if (J->R.pool) { /* embedded: read the pool (MPI: the transport set the window's figures) */
        const double now = reward_pool_busy_s(J->R.pool); /* beside generation (async) */
        J->win_reward_s = now - J->reward_busy_snap + atomic_exchange(&J->R.reward_wait_s, 0.0); /* + in line */
        J->reward_busy_snap = now;
        J->reward_backlog = reward_pool_backlog(J->R.pool);
    }
    keys[n] = "timing_s/reward", vals[n++] = J->win_reward_s;
    keys[n] = "reward/backlog", vals[n++] = (double)J->reward_backlog;
    J->win_reward_s = 0;
    n = multi_turn_metrics(J, keys, vals, n);
    for (int k = 0; k < J->n_rx; k++) {
        snprintf(names[k], 300, "reward/%s/mean", J->rx_keys[k]);
        keys[n] = names[k];
        vals[n++] = J->rx_cnt[k] > 0 ? J->rx_sum[k] / (double)J->rx_cnt[k] : NAN;
        J->rx_sum[k] = 0;
        J->rx_cnt[k] = 0;
    }
    return n;
}

/* a += b for a statistic an empty step (no loss token) leaves NaN: summed over the other steps only */
static void add_loss_stat(double *a, double b) {
    if (isnan(*a)) *a = b;
    else if (!isnan(b)) *a += b;
}

void job_add_stats(train_stats *a, const train_stats *b, int first) {
    if (first) {
        *a = *b;
        return;
    }
    add_loss_stat(&a->pg_loss, b->pg_loss); add_loss_stat(&a->pg_clipfrac, b->pg_clipfrac);
    add_loss_stat(&a->ppo_kl, b->ppo_kl); add_loss_stat(&a->entropy, b->entropy);
    add_loss_stat(&a->behav_dropped_frac, b->behav_dropped_frac);
    a->empty_steps += b->empty_steps;
    /* rollout correction: NaN-free sums over the steps that have them, the max diff as a max */
    a->probs_diff_max = fmax(a->probs_diff_max, b->probs_diff_max);
    add_loss_stat(&a->probs_diff_mean, b->probs_diff_mean); add_loss_stat(&a->probs_diff_std, b->probs_diff_std);
    add_loss_stat(&a->probs_pearson, b->probs_pearson);
    a->mismatch_steps += b->mismatch_steps;
    for (int i = 0; i < OFFPOLICY_N_METRICS; i++) add_loss_stat(&a->offpolicy_vals[i], b->offpolicy_vals[i]);
    for (int i = 0; i < ROLLOUT_RS_MAX_METRICS; i++) add_loss_stat(&a->rs_vals[i], b->rs_vals[i]);
    a->rs_steps += b->rs_steps;
    a->grad_norm += b->grad_norm;
    a->aux_loss += b->aux_loss; a->kl_loss += b->kl_loss; a->reward_mean += b->reward_mean;
    a->reward_std += b->reward_std; a->acc_mean += b->acc_mean; a->response_length_mean += b->response_length_mean;
    a->loss_tokens_mean += b->loss_tokens_mean;
    a->reward_kl_penalty += b->reward_kl_penalty; a->reward_kl_penalty_coeff += b->reward_kl_penalty_coeff;
    a->response_length_max = fmax(a->response_length_max, b->response_length_max);
    a->n_samples += b->n_samples; a->stale_samples += b->stale_samples; a->partial_samples += b->partial_samples;
    a->trained_tokens += b->trained_tokens; a->resp_tokens += b->resp_tokens;
    a->max_lag = MOERL_MAX(a->max_lag, b->max_lag);
    a->max_partial_span = MOERL_MAX(a->max_partial_span, b->max_partial_span);
    a->expert_load_max_over_mean += b->expert_load_max_over_mean;
    a->routing_count += b->routing_count; a->routing_agree += b->routing_agree; /* routing replay: sums */
    a->routing_agree_native += b->routing_agree_native;
    if (!(a->routing_agreement_min <= b->routing_agreement_min)) /* the worst layer of the worst step; NaN: none */
        a->routing_agreement_min = isnan(b->routing_agreement_min) ? a->routing_agreement_min : b->routing_agreement_min;
    a->update_s += b->update_s;
    a->reduce_exposed_s += b->reduce_exposed_s;
    a->rollout_is_mean += b->rollout_is_mean; a->rollout_is_std += b->rollout_is_std;
    a->rollout_is_truncated_frac += b->rollout_is_truncated_frac; a->rollout_is_ess += b->rollout_is_ess;
    a->response_clip_ratio += b->response_clip_ratio;
    a->dropped_groups += b->dropped_groups;
    a->grad_bytes_sent += b->grad_bytes_sent;
    a->train_flops += b->train_flops;
    a->grad_bytes_raw += b->grad_bytes_raw;
    pp_window_merge(&a->pp, &b->pp);
}

double job_clock(job *J) { return J->ops && J->ops->clock ? J->ops->clock(J) : moerl_now(); }

/* The console line of one data_source of a validation at N > 1: its val-core metrics. */
static void log_validation_source(const job *J, const val_report *rep, const char *ds) {
    char line[1024];
    int len = snprintf(line, sizeof line, "v%-3d validation %s:", J->T.version, ds);
    const size_t pl = strlen("val-core/") + strlen(ds) + 1;
    for (int i = 0; i < rep->metrics.n && len < (int)sizeof line - 64; i++) {
        const char *k = rep->metrics.keys[i];
        if (strncmp(k, "val-core/", 9) || strncmp(k + 9, ds, strlen(ds)) || k[pl - 1] != '/') continue;
        const char *var_m = k + pl; /* "<var>/<metric>" */
        if (strstr(var_m, "/std")) continue;
        len += snprintf(line + len, sizeof line - len, " %s %.3f", var_m, rep->metrics.vals[i]);
    }
    log_info("%s", line);
}

/* The data_sources of a report (the second part of its val-core keys), each logged once. */
static void log_validation(const job *J, const val_report *rep) {
    if (J->cfg->val_kwargs.n <= 1) return; /* N = 1: the held-out accuracy line says it all */
    for (int i = 0; i < rep->metrics.n; i++) {
        const char *k = rep->metrics.keys[i];
        if (strncmp(k, "val-core/", 9) || !strstr(k, "/mean@")) continue;
        const char *end = strstr(k, "/mean@");
        const char *var = end; /* back to the '/' before "<var>" */
        while (var > k + 9 && var[-1] != '/') var--;
        if (var <= k + 9) continue;
        char ds[512];
        snprintf(ds, sizeof ds, "%.*s", (int)(var - 1 - (k + 9)), k + 9);
        log_validation_source(J, rep, ds);
    }
}

int job_run_validation(job *J, double *acc) {
    const rl_config *c = J->cfg;
    const val_options o = {.kw = c->val_kwargs, .n_rows = c->val_n, .max_new_tokens = c->max_response_length,
                           .max_num_seqs = c->max_num_seqs, .seed = c->seed, .multi_turn = &c->multi_turn,
                           .block_size = c->block_size, .kv_cache_bytes = c->kv_cache_bytes,
                           .gpu_memory_utilization = c->gpu_memory_utilization,
                           .enable_prefix_caching = c->enable_prefix_caching};
    /* The one place validation responses are scored: through the job's reward backend (reward.*:
     * built-in rules, a reward program or a server), the rollouter's pool or one of its own. */
    val_score_fn score_fn = job_reward_score;
    void *score_ctx = J;
    val_report rep;
    if (job_whole_begin(J, 0) != MOERL_OK) return MOERL_ERR;
    const int rc = val_run(J->whole_m, J->test, &o, score_fn, score_ctx, &rep);
    job_whole_end(J);
    if (rc != MOERL_OK) return MOERL_ERR;
    *acc = rep.accuracy;
    /* one record: val/accuracy (kept for continuity, the plot and the resume state), the version,
     * then verl's val-core/... and val-aux/... */
    const int n = 2 + rep.metrics.n;
    const char **keys = xmalloc((size_t)n * sizeof(char *));
    double *vals = xmalloc((size_t)n * sizeof(double));
    keys[0] = "val/accuracy";
    vals[0] = rep.accuracy;
    keys[1] = "fully_async/count/current_param_version";
    vals[1] = (double)J->T.version;
    for (int i = 0; i < rep.metrics.n; i++) {
        keys[2 + i] = rep.metrics.keys[i];
        vals[2 + i] = rep.metrics.vals[i];
    }
    const int wrc = metrics_write(J->mw, J->T.step, n, keys, vals);
    log_validation(J, &rep);
    free(keys);
    free(vals);
    val_report_free(&rep);
    return wrc;
}

/* The rollout-correction metrics of a version (docs/rl.md): verl's training/rollout_probs_diff_* and
 * rollout_actor_probs_pearson_corr and rollout_corr/kl ... chi2_seq (verl's off-policy diagnostics; mean
 * over the steps that had them; the max diff a max), and the
 * rollout_corr/rollout_rs_* of algorithm.rollout_correction.rollout_rs (mean over the steps with a loss
 * token, null when none had one). rs_names holds the composed names. Returns the new count. */
static int put_rollout_corr(const rl_config *cfg, const train_stats *w, const char **keys, double *vals, int n,
                            char (*rs_names)[ROLLOUT_RS_NAME_LEN + 16]) {
    if (w->mismatch_steps > 0) {
        keys[n] = "training/rollout_probs_diff_max", vals[n++] = w->probs_diff_max;
        keys[n] = "training/rollout_probs_diff_mean", vals[n++] = w->probs_diff_mean / w->mismatch_steps;
        keys[n] = "training/rollout_probs_diff_std", vals[n++] = w->probs_diff_std / w->mismatch_steps;
        keys[n] = "training/rollout_actor_probs_pearson_corr", vals[n++] = w->probs_pearson / w->mismatch_steps;
        const char *on[OFFPOLICY_N_METRICS];
        offpolicy_metrics(&(offpolicy_stats){0}, on, NULL);
        for (int i = 0; i < OFFPOLICY_N_METRICS; i++) {
            snprintf(rs_names[ROLLOUT_RS_MAX_METRICS + i], sizeof rs_names[0], "rollout_corr/%s", on[i]);
            keys[n] = rs_names[ROLLOUT_RS_MAX_METRICS + i], vals[n++] = w->offpolicy_vals[i] / w->mismatch_steps;
        }
    }
    if (cfg->rollout_rs.n > 0) {
        char rn[ROLLOUT_RS_MAX_METRICS][ROLLOUT_RS_NAME_LEN];
        const int nrs = rollout_rs_metrics(&cfg->rollout_rs, NULL, rn, NULL);
        for (int i = 0; i < nrs; i++) {
            snprintf(rs_names[i], sizeof rs_names[i], "rollout_corr/%s", rn[i]);
            keys[n] = rs_names[i], vals[n++] = w->rs_steps > 0 ? w->rs_vals[i] / w->rs_steps : NAN;
        }
    }
    return n;
}

/* One console line and one JSONL record per version. */
void job_emit_version(job *J, double rollouter_busy, double rollouter_idle) {
    const rl_config *cfg = J->cfg;
    const int k = J->win_steps ? J->win_steps : 1;
    train_stats *w = &J->win;
    /* the loss statistics: mean over the window's steps that had loss tokens (NaN when none had) */
    const double k_loss = J->win_steps - w->empty_steps > 0 ? (double)(J->win_steps - w->empty_steps) : NAN;
    double wall = job_clock(J) - J->win_t0;
    double t_idle = wall > 0 ? J->win_gen_wait / wall : 0;
    double r_idle = rollouter_busy + rollouter_idle > 0 ? rollouter_idle / (rollouter_busy + rollouter_idle) : 0;
    const int n_corr = ROLLOUT_RS_MAX_METRICS + OFFPOLICY_N_METRICS; /* put_rollout_corr's names */
    const char **keys = xmalloc((size_t)(112 + 4 + 8 + n_corr + J->n_rx) * sizeof(char *)); /* + training/rollout_*, rollout/ (paged KV) */
    double *vals = xmalloc((size_t)(112 + 4 + 8 + n_corr + J->n_rx) * sizeof(double));
    char(*rs_names)[ROLLOUT_RS_NAME_LEN + 16] = xmalloc((size_t)n_corr * (ROLLOUT_RS_NAME_LEN + 16));
    char(*names)[300] = xmalloc((size_t)(J->n_rx + 1) * 300);
    int n = 0;
#define PUT(key, v) (keys[n] = (key), vals[n] = (v), n++)
    PUT("timing_s/gen", J->win_gen_wait);
    PUT("timing_s/update", J->win_update);
    PUT("timing_s/param_sync", J->win_sync);
    PUT("trainer/idle_ratio", t_idle);
    PUT("rollouter/idle_ratio", r_idle);
    PUT("fully_async/count/stale_samples_processed", (double)w->stale_samples);
    PUT("fully_async/count/current_param_version", (double)J->T.version);
    PUT("fully_async/partial/partial_ratio", w->n_samples ? (double)w->partial_samples / w->n_samples : 0);
    PUT("fully_async/partial/max_partial_span", (double)w->max_partial_span);
    PUT("perf/throughput", wall > 0 ? w->trained_tokens / wall : 0); /* trained tokens / s of this window */
    PUT("critic/rewards/mean", w->reward_mean / k);
    PUT("critic/rewards/std", w->reward_std / k);
    PUT("response_length/mean", w->response_length_mean / k);
    if (J->cfg->multi_turn.enable) PUT("response/loss_tokens_mean", w->loss_tokens_mean / k); /* sampled tokens */
    PUT("response_length/max", w->response_length_max);
    PUT("response_length/clip_ratio", w->response_clip_ratio / k);
    PUT("actor/pg_loss", w->pg_loss / k_loss);
    PUT("actor/pg_clipfrac", w->pg_clipfrac / k_loss);
    PUT("actor/ppo_kl", w->ppo_kl / k_loss);
    PUT("actor/grad_norm", w->grad_norm / k);
    PUT("actor/entropy", w->entropy / k_loss);
    PUT("actor/kl_loss", w->kl_loss / k);
    PUT("actor/empty_steps", (double)w->empty_steps); /* steps of this version without a loss token */
    PUT("moe/aux_loss", w->aux_loss / k);
    PUT("moe/expert_load_max_over_mean", w->expert_load_max_over_mean / k);
    if (w->routing_count > 0) { /* the rollout's routes were recorded (rollout.enable_rollout_routing_replay) */
        PUT("moe/routing_agreement", w->routing_agree / w->routing_count);
        PUT("moe/routing_agreement_min", w->routing_agreement_min);
        PUT("moe/routing_agreement_native", w->routing_agree_native / w->routing_count);
    }
    PUT("fully_async/max_staleness", (double)w->max_lag);
    PUT("training/global_step", (double)J->T.step);
    PUT("perf/prompts_per_s", wall > 0 ? (w->n_samples / (double)cfg->n) / wall : 0);
    /* MFU of the trainer's updates: model FLOPs (base/perf.h) / (update seconds · measured sgemm peak) */
    /* train_flops sums every trainer rank's share (trainers_sum); the peak is one rank's team */
    PUT("perf/mfu", J->sgemm_peak > 0 && J->win_update > 0
                        ? w->train_flops / (J->win_update * J->sgemm_peak * MOERL_MAX(1, J->n_trainers))
                        : NAN);
    if (cfg->ppo.decoupled) PUT("actor/behav_imp_weight_dropped_frac", w->behav_dropped_frac / k_loss);
    if (cfg->use_kl_in_reward) { /* verl apply_kl_penalty's metrics, mean over the version's steps */
        PUT("actor/reward_kl_penalty", w->reward_kl_penalty / k);
        PUT("actor/reward_kl_penalty_coeff", w->reward_kl_penalty_coeff / k);
    }
    if (cfg->recompute_old && cfg->rollout_is != ROLLOUT_IS_NONE) {
        PUT("rollout_corr/rollout_is_mean", w->rollout_is_mean / k);
        PUT("rollout_corr/rollout_is_std", w->rollout_is_std / k);
        PUT("rollout_corr/rollout_is_truncated_frac", w->rollout_is_truncated_frac / k);
        PUT("rollout_corr/rollout_is_eff_sample_size", w->rollout_is_ess / k);
    }
    n = put_rollout_corr(cfg, w, keys, vals, n, rs_names);
    if (cfg->filter_groups) {
        const double kept = (double)w->n_samples / cfg->n;
        PUT("filter_groups/dropped_groups", (double)w->dropped_groups);
        PUT("filter_groups/dropped_ratio", kept + w->dropped_groups > 0 ? w->dropped_groups / (kept + w->dropped_groups) : 0);
    }
    if (J->is_dist) {
        PUT("timing_s/grad_reduce_exposed", w->reduce_exposed_s);
        PUT("perf/grad_bytes_sent", w->grad_bytes_sent);
        PUT("perf/grad_compression_ratio", w->grad_bytes_sent > 0 ? w->grad_bytes_raw / w->grad_bytes_sent : 1.0);
        PUT("timing_s/weight_bcast", J->win_bcast_s);
        PUT("perf/weight_bcast_bytes", (double)J->bcast_bytes);
        PUT("perf/weight_bcast_GBps", J->win_bcast_s > 0 ? J->bcast_bytes / J->win_bcast_s / 1e9 : 0);
    }
    n += pp_window_metrics(&w->pp, keys + n, vals + n); /* perf/pipeline_bubble, ...: the window's schedules */
    if (J->R.eng || J->has_rollout_kv) { /* the paged KV cache, since the start (docs/engine.md); MPI: summed */
        engine_stats es = J->rollout_kv;
        if (J->R.eng) { /* the rollouter thread's snapshot: the engine itself may be stepping (async mode) */
            pthread_mutex_lock(&J->R.mu);
            es = J->R.eng_stats;
            pthread_mutex_unlock(&J->R.mu);
        }
        PUT("rollout/preemptions", (double)es.preemptions);
        PUT("rollout/kv_blocks_total", (double)es.kv_blocks_total);
        PUT("rollout/kv_blocks_peak", (double)es.kv_blocks_peak);
        PUT("rollout/prefix_hit_tokens", (double)es.prefix_hit_tokens);
        PUT("rollout/prefix_cache_hit_rate", es.prefix_hit_tokens + es.prefill_tokens > 0
                                                 ? (double)es.prefix_hit_tokens / (es.prefix_hit_tokens + es.prefill_tokens)
                                                 : 0.0);
    }
    moerl_pool_stats ps; /* MOERL_ALLOC=pool only (src/base/pool.h) */
    if (moerl_alloc_pool_stats(&ps) == MOERL_OK) {
        PUT("memory/pool_reserved_bytes", (double)ps.reserved);
        PUT("memory/pool_committed_bytes", (double)ps.committed);
        PUT("memory/pool_in_use_bytes", (double)ps.in_use);
        PUT("memory/pool_peak_bytes", (double)ps.peak_in_use);
        PUT("memory/pool_fragmentation", ps.fragmentation);
    }
#undef PUT
    n = reward_metrics(J, keys, vals, n, names);
    metrics_write(J->mw, J->T.step, n, keys, vals);
    free(keys);
    free(vals);
    free(names);
    free(rs_names);
    log_info("v%-3d step %-4lld reward %.3f pg_loss %+.4f clip %.3f kl %+.4f ent %.3f gnorm %.3f | gen %.2fs upd %.2fs "
             "sync %.3fs | idle T %.2f R %.2f | stale samples %lld partial %.2f max staleness %d | %.0f trained tok/s",
             J->T.version, (long long)J->T.step, w->reward_mean / k, w->pg_loss / k_loss, w->pg_clipfrac / k_loss,
             w->ppo_kl / k_loss, w->entropy / k_loss, w->grad_norm / k, J->win_gen_wait, J->win_update, J->win_sync,
             t_idle, r_idle, (long long)w->stale_samples, w->n_samples ? (double)w->partial_samples / w->n_samples : 0,
             w->max_lag, wall > 0 ? w->trained_tokens / wall : 0);
    J->win_t0 = job_clock(J);
    J->win_gen_wait = J->win_update = J->win_sync = J->win_bcast_s = 0;
    J->win_steps = 0;
}

/* ------------------------------------------------------------------ embedded transport */

/* uids of the rollouter's in-flight groups (heap array; *n its length) */
static int64_t *inflight_uids(const rollouter *R, int *n) {
    int64_t *u = xmalloc((size_t)(R->n_inflight ? R->n_inflight : 1) * sizeof(int64_t));
    for (int i = 0; i < R->n_inflight; i++) u[i] = R->inflight[i]->uid;
    *n = R->n_inflight;
    return u;
}

static int save_checkpoint(job *J) {
    int n;
    int64_t *u = inflight_uids(&J->R, &n);
    int rc = job_save_checkpoint(J, u, n);
    free(u);
    return rc;
}

static void on_paused_checkpoint(void *ctx) {
    job *J = ctx;
    if (save_checkpoint(J) != MOERL_OK) {
        log_error("checkpoint failed: %s", moerl_last_error());
        J->failed = 1;
    }
}

/* After a sync: version bookkeeping, validation, metrics. */
int job_after_sync(job *J, double sync_s, double rb, double ri) {
    J->win_sync += sync_s;
    job_emit_version(J, rb, ri);
    if (J->cfg->val_n != 0 && J->cfg->test_freq > 0 && J->T.version % J->cfg->test_freq == 0) {
        double acc;
        if (job_run_validation(J, &acc) != MOERL_OK) return MOERL_ERR; /* writes the val record */
        J->last_val = acc;
        J->last_val_step = J->T.step;
        log_info("v%-3d held-out accuracy %.1f%%", J->T.version, 100 * acc);
    }
    return MOERL_OK;
}

int job_want_checkpoint(const job *J, int new_version) {
    return J->cfg->save_freq > 0 && new_version % J->cfg->save_freq == 0;
}

static void set_role_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n > 0 ? n : 1);
#endif
}

static int64_t *emb_inflight_uids(job *J, int *n) { return inflight_uids(&J->R, n); }

static void emb_describe(job *J, char *buf, size_t len) {
    snprintf(buf, len, "rollouter in stage '%s' (last progress %.0f s ago), %d group%s in flight (%d waiting for "
             "rewards from %s)", (const char *)J->R.stage, moerl_now() - J->R.last_progress, (int)J->R.n_inflight,
             moerl_plural(J->R.n_inflight), J->R.n_scoring, J->R.pool ? reward_pool_what(J->R.pool) : "no pool");
}

static void emb_abort(job *J, const char *msg) {
    fprintf(stderr, "moerl rl: %s\n", msg);
    fflush(stderr);
    _exit(3);
}

static int emb_send_part(job *J, int d, const rl_minibatch *mbs, int n_mb, rl_group **part, int n_part) {
    return moerl_errorf("internal: the embedded job has one trainer rank (asked to send to rank %d)", d);
}

/* --- lockstep / sync: one thread, a fixed interleaving */

/* Lockstep / sync: the rollout side idles from ls_mark (when it last stopped generating) until t —
 * the trainer's updates and syncs; the idle time is charged to the version whose sync reads it. */
static void ls_idle_until(job *J, double t) {
    if (J->ls_mark > 0 && t > J->ls_mark) rl_atomic_add(&J->R.idle_s, t - J->ls_mark);
    J->ls_mark = t;
}

/* ... and it worked from t0 until now. */
static void ls_account(job *J, double t0) {
    ls_idle_until(J, t0);
    J->ls_mark = moerl_now();
}

static int ls_get_groups(job *J, rl_group **out, int n, double timeout_s, double *waited) {
    const double t0 = moerl_now();
    while (rl_queue_size(&J->queue) < n) { /* generate until the trainer has its groups */
        if (moerl_stop_requested()) {
            *waited = moerl_now() - t0;
            return 0;
        }
        const int did = rollouter_tick(&J->R);
        if (did < 0) {
            J->reward_failed = J->R.reward_failed;
            return MOERL_ERR;
        }
        if (did == 0)
            return moerl_errorf("rollouter idle with %d of %d groups queued: staleness budget or data exhausted (a bug)",
                                rl_queue_size(&J->queue), n);
    }
    *waited = moerl_now() - t0;
    rl_atomic_add(&J->R.busy_s, *waited);
    ls_account(J, t0);
    MOERL_ASSERT(rl_queue_try_get_n(&J->queue, (void **)out, n) == n);
    return n;
}

static int ls_sync(job *J, int version, double *rb, double *ri) {
    if (!J->cfg->partial_rollout && rollouter_unfinished(&J->R) > 0) { /* let in-flight trajectories
                                                                         finish under the old weights */
        const double t0 = moerl_now();
        J->R.draining = 1;
        while (rollouter_unfinished(&J->R) > 0)
            if (rollouter_tick(&J->R) < 0) {
                J->reward_failed = J->R.reward_failed;
                return MOERL_ERR;
            }
        rl_atomic_add(&J->R.busy_s, moerl_now() - t0);
        ls_account(J, t0);
    }
    J->R.on_paused = job_want_checkpoint(J, version) ? on_paused_checkpoint : NULL;
    J->R.on_paused_ctx = J;
    if (rollouter_apply_sync(&J->R, J->m->params, J->m->n_params, version) != MOERL_OK) return MOERL_ERR;
    if (J->failed) return moerl_errorf("param sync: checkpoint failed");
    ls_idle_until(J, moerl_now()); /* this version's updates and this sync */
    *rb = atomic_exchange(&J->R.busy_s, 0.0);
    *ri = atomic_exchange(&J->R.idle_s, 0.0);
    return MOERL_OK;
}

static void ls_add_prompts(job *J, int64_t k) { atomic_fetch_add(&J->R.dropped_pending, k); }

static int ls_stop(job *J, double *rb, double *ri) {
    ls_idle_until(J, moerl_now()); /* the last update */
    *rb = J->R.busy_s;
    *ri = J->R.idle_s;
    return MOERL_OK;
}

/* --- async: the rollouter in its own thread */

static void *rollouter_main(void *arg) {
    job *J = arg;
    rollouter *R = &J->R;
    set_role_threads(J->cfg->rollout_threads);
    pthread_mutex_lock(&R->mu);
    while (!R->stop) {
        if (R->sync_requested) {
            if (J->cfg->partial_rollout || rollouter_unfinished(R) == 0) {
                const float *params = R->sync_params;
                int version = R->sync_version;
                pthread_mutex_unlock(&R->mu);
                int rc = rollouter_apply_sync(R, params, J->m->n_params, version);
                pthread_mutex_lock(&R->mu);
                if (rc != MOERL_OK) {
                    snprintf(R->error, sizeof R->error, "%s", moerl_last_error());
                    R->stop = 1;
                }
                R->sync_requested = 0;
                R->sync_done = 1;
                pthread_cond_broadcast(&R->cv);
                continue;
            }
            R->draining = 1;
        }
        pthread_mutex_unlock(&R->mu);
        int did = rollouter_tick(R);
        pthread_mutex_lock(&R->mu);
        if (did < 0) {
            snprintf(R->error, sizeof R->error, "%s", moerl_last_error());
            R->stop = 1;
            pthread_cond_broadcast(&R->cv);
            rl_queue_close(&J->queue);
            break;
        }
        if (did == 0 && !R->sync_requested && !R->stop) {
            double t0 = moerl_now();
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_nsec += 5 * 1000000;
            if (dl.tv_nsec >= 1000000000) { dl.tv_sec++; dl.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&R->cv, &R->mu, &dl);
            rl_atomic_add(&R->idle_s, moerl_now() - t0);
            R->last_progress = moerl_now();
        }
    }
    pthread_mutex_unlock(&R->mu);
    return NULL;
}

static void wake_rollouter(rollouter *R) {
    pthread_mutex_lock(&R->mu);
    pthread_cond_broadcast(&R->cv);
    pthread_mutex_unlock(&R->mu);
}

static int as_get_groups(job *J, rl_group **out, int n, double timeout_s, double *waited) {
    rollouter *R = &J->R;
    const int got = rl_queue_get_n(&J->queue, (void **)out, n, timeout_s, waited);
    wake_rollouter(R); /* queue space: the rollouter may admit again */
    if (got == n) return n;
    if (got < 0) return 0; /* timeout */
    pthread_mutex_lock(&R->mu);
    moerl_errorf("rollouter stopped: %s", R->error[0] ? R->error : "queue closed");
    J->reward_failed = R->reward_failed;
    pthread_mutex_unlock(&R->mu);
    return MOERL_ERR;
}

static int as_sync(job *J, int version, double *rb, double *ri) {
    rollouter *R = &J->R;
    pthread_mutex_lock(&R->mu);
    R->on_paused = job_want_checkpoint(J, version) ? on_paused_checkpoint : NULL;
    R->on_paused_ctx = J;
    R->sync_params = J->m->params;
    R->sync_version = version;
    R->sync_done = 0;
    R->sync_requested = 1;
    pthread_cond_broadcast(&R->cv);
    while (!R->sync_done && !R->stop) pthread_cond_wait(&R->cv, &R->mu);
    *rb = atomic_exchange(&R->busy_s, 0.0);
    *ri = atomic_exchange(&R->idle_s, 0.0);
    const int stopped = R->stop;
    char err[2048];
    snprintf(err, sizeof err, "%s", R->error);
    J->reward_failed = R->reward_failed;
    pthread_mutex_unlock(&R->mu);
    if (stopped || J->failed) return moerl_errorf("param sync failed: %s", err[0] ? err : "checkpoint failed");
    return MOERL_OK;
}

static void as_add_prompts(job *J, int64_t k) {
    atomic_fetch_add(&J->R.dropped_pending, k);
    wake_rollouter(&J->R);
}

static pthread_t g_rollouter_thread; /* the embedded job runs once per process */

static int as_stop(job *J, double *rb, double *ri) {
    rollouter *R = &J->R;
    pthread_mutex_lock(&R->mu);
    R->stop = 1;
    pthread_cond_broadcast(&R->cv);
    pthread_mutex_unlock(&R->mu);
    pthread_join(g_rollouter_thread, NULL);
    *rb = R->busy_s;
    *ri = R->idle_s;
    return MOERL_OK;
}

static const job_ops LOCKSTEP_OPS = {ls_get_groups, emb_send_part, ls_sync, ls_add_prompts, emb_inflight_uids,
                                     ls_stop, emb_describe, emb_abort, NULL, NULL, NULL, NULL, NULL};
static const job_ops ASYNC_OPS = {as_get_groups, emb_send_part, as_sync, as_add_prompts, emb_inflight_uids,
                                  as_stop, emb_describe, emb_abort, NULL, NULL, NULL, NULL, NULL};

/* ------------------------------------------------------------------ plot */

/* Draw plot.dat with gnuplot, without a shell (base/plot.h; a warning without gnuplot). */
static void draw_plot(const job *J, const char *dat) {
    char png[4200];
    snprintf(png, sizeof png, "%s/reward_accuracy.png", J->cfg->out_dir);
    moerl_plot_reward_accuracy(J->cfg->out_dir, dat, png);
}

void job_plot_from_metrics(const job *J) {
    char mp[4200], dat[4200];
    snprintf(mp, sizeof mp, "%s/metrics.jsonl", J->cfg->out_dir);
    snprintf(dat, sizeof dat, "%s/plot.dat", J->cfg->out_dir);
    char *txt;
    size_t len;
    if (J->cfg->metrics_loggers && !(J->cfg->metrics_loggers & METRICS_FILE)) {
        log_info("no reward/accuracy plot: it is drawn from metrics.jsonl, which trainer.logger without 'file' does "
                 "not write");
        return;
    }
    if (moerl_read_file(mp, &txt, &len) != MOERL_OK) {
        log_warn("no plot: %s", moerl_last_error());
        return;
    }
    size_t cap = 4096, o = 0;
    char *out = xmalloc(cap);
    for (char *line = txt; line < txt + len;) {
        char *nl = memchr(line, '\n', (size_t)(txt + len - line));
        const size_t ll = nl ? (size_t)(nl - line) + 1 : (size_t)(txt + len - line);
        json_t *j = json_loadb(line, ll, 0, NULL);
        json_t *ver = j ? json_object_get(j, "fully_async/count/current_param_version") : NULL;
        json_t *rw = j ? json_object_get(j, "critic/rewards/mean") : NULL;
        json_t *acc = j ? json_object_get(j, "val/accuracy") : NULL;
        if (ver && (rw || acc)) {
            if (cap - o < 128) out = xrealloc(out, cap *= 2);
            o += (size_t)snprintf(out + o, cap - o, "%lld %.9g %.9g\n", (long long)json_number_value(ver),
                                  rw ? json_number_value(rw) : NAN, acc ? json_number_value(acc) : NAN);
        }
        json_decref(j);
        line += ll;
    }
    free(txt);
    const int rc = moerl_write_file_atomic(dat, out, o);
    free(out);
    if (rc != MOERL_OK) {
        log_warn("no plot: %s", moerl_last_error());
        return;
    }
    draw_plot(J, dat);
}

/* ------------------------------------------------------------------ entry */

int rl_run(const rl_config *cfg, moe_model *m, const dataset *train, const dataset *test, rl_result *res) {
    job *J = xcalloc(1, sizeof *J);
    J->cfg = cfg;
    J->train = train;
    J->test = test;
    J->m = m;
    m->cfg.exec.batch_invariant = cfg->batch_invariant; /* rollout.batch_invariant: the engine's model is made from m's config */
    J->n_trainers = 1;
    J->ops = cfg->mode == RL_MODE_ASYNC ? &ASYNC_OPS : &LOCKSTEP_OPS;
    int rc = MOERL_ERR, thread_started = 0;
    memset(res, 0, sizeof *res);
    staleness_budget b;
    if (job_plan(J, &b) != MOERL_OK) goto out0;
    if (moerl_mkdirs(cfg->out_dir) != MOERL_OK) goto out0;
    rl_queue_init(&J->queue, b.max_required_samples);
    if (rollouter_init(&J->R, cfg, &b, train, m, &J->queue, J->total_prompts) != MOERL_OK) goto out0;
    J->feed = &J->R.feed;
    J->R.wait_rewards = cfg->mode != RL_MODE_ASYNC; /* async: rewards beside generation; else reproducible */
    if (trainer_init(&J->T, cfg, train, m) != MOERL_OK) goto out0;
    if (cfg->resume_auto && job_load_checkpoint(J, &J->resumed) != MOERL_OK) goto out0;
    if (J->resumed) {
        /* new prompts still to start: what the remaining steps consume (the redo list first); dropped
         * groups add their replacements as they happen. Not total − consumed: a resume may change
         * the steps or the prompts per step. */
        J->R.prompts_left = (J->total_steps - J->T.step) * (int64_t)J->cfg->ppo_mini_batch_size * J->cfg->require_batches;
        if (J->R.prompts_left < 0) J->R.prompts_left = 0;
        if (engine_load_weights(J->R.eng, J->m->params, J->m->n_params, J->T.version) != MOERL_OK) goto out0;
    }
    if (job_open_outputs(J, J->resumed) != MOERL_OK) goto out0;
    /* actor.grad_compression in one process: moerl rl warned before building the model (no all-reduce here) */
    log_info("fully-async GRPO: %lld step%s × %d prompts × %d responses; staleness_threshold %g → queue %d, "
             "lag bound %d (for in-order completion); trigger_parameter_sync_step %d; partial_rollout %s; mode %s",
             (long long)J->total_steps, moerl_plural(J->total_steps), b.required_samples, cfg->n,
             cfg->staleness_threshold, b.max_required_samples, b.lag_bound, cfg->trigger_parameter_sync_step, cfg->partial_rollout ? "on" : "off",
             cfg->mode == RL_MODE_ASYNC ? "async" : cfg->mode == RL_MODE_SYNC ? "sync" : "lockstep");
    if (cfg->mode == RL_MODE_ASYNC) {
        openblas_set_num_threads(1); /* each role runs its own OpenMP team; BLAS stays single-threaded */
        set_role_threads(cfg->trainer_threads); /* this thread's team (the rollouter thread sets its own) */
        /* the start validation and the peak measurement before the rollouter generates: step 1 then
         * shows the trainer's wait for its first batch */
        if (job_schedule_prepare(J, res) != MOERL_OK) goto out0;
        if (pthread_create(&g_rollouter_thread, NULL, rollouter_main, J) != 0) {
            moerl_errorf("cannot start the rollouter thread");
            goto out0;
        }
        thread_started = 1;
    }
    thread_started = 0; /* from here the transport's stop joins it */
    rc = job_schedule_run(J, res);
    res->tokens_generated = engine_get_stats(J->R.eng).generated_tokens;
    res->tokens_per_s = res->wall_s > 0 ? res->tokens_generated / res->wall_s : 0;
    res->stop_signal = J->stop_signal;
out0:
    if (thread_started) {
        double rb, ri;
        as_stop(J, &rb, &ri);
    }
    job_free(J);
    return rc;
}
