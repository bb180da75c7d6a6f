/* The main job's driver: threads (async) or one thread (lockstep / sync), the parameter
 * synchroniser, metrics, validation, checkpoints with resume, watchdog, plot. See rl.h. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/log.h"
#include "model/safetensors.h"
#include "rl/job_internal.h"
#include "rl/rl.h"
#include "train/train.h"

void openblas_set_num_threads(int n);


/* ------------------------------------------------------------------ checkpoints */

static int save_optimizer(const job *J, const char *path) {
    st_writer *w = st_writer_new();
    int64_t shape[1] = {(int64_t)J->m->n_params};
    st_writer_add(w, "adam.m", J->T.opt.m, 1, shape, ST_F32);
    st_writer_add(w, "adam.v", J->T.opt.v, 1, shape, ST_F32);
    int rc = st_writer_finish(w, path);
    st_writer_free(w);
    return rc;
}

/* Remove a flat directory (files only). */
static void remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4200];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int write_checkpoint_files(job *J, const char *dir, const int64_t *inflight, int n_inflight);

/* Called with the rollouter paused (inside a sync): a consistent snapshot of both roles.
 * Written into checkpoint.tmp/, then swapped in by renames (checkpoint → checkpoint.old,
 * checkpoint.tmp → checkpoint), so a kill at any moment leaves one complete checkpoint. */
int job_save_checkpoint(job *J, const int64_t *inflight, int n_inflight) {
    char tmp[4200], cur[4200], old[4200];
    snprintf(tmp, sizeof tmp, "%s/checkpoint.tmp", J->cfg->out_dir);
    snprintf(cur, sizeof cur, "%s/checkpoint", J->cfg->out_dir);
    snprintf(old, sizeof old, "%s/checkpoint.old", J->cfg->out_dir);
    remove_flat_dir(tmp);
    if (write_checkpoint_files(J, tmp, inflight, n_inflight) != MOERL_OK) return MOERL_ERR;
    remove_flat_dir(old);
    if (rename(cur, old) != 0 && errno != ENOENT) return moerl_errorf("cannot rename %s: %s", cur, strerror(errno));
    if (rename(tmp, cur) != 0) return moerl_errorf("cannot rename %s to %s: %s", tmp, cur, strerror(errno));
    remove_flat_dir(old);
    log_info("checkpoint at version %d (step %lld) written to %s", J->T.version, (long long)J->T.step, cur);
    return MOERL_OK;
}

static int write_checkpoint_files(job *J, const char *dir, const int64_t *inflight, int n_inflight) {
    const rl_config *c = J->cfg;
    char p[4200];
    if (moerl_mkdirs(dir) != MOERL_OK) return MOERL_ERR;
    if (model_save_hf(J->m, dir, c->save_bf16, 0) != MOERL_OK) return MOERL_ERR;
    snprintf(p, sizeof p, "%s/tokenizer_moerl.json", dir);
    const char *tk = "{\"type\": \"moerl-byte\", \"vocab_size\": 259, \"bos_token_id\": 256, \"eos_token_id\": 258}\n";
    if (moerl_write_file_atomic(p, tk, strlen(tk)) != MOERL_OK) return MOERL_ERR;
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (save_optimizer(J, p) != MOERL_OK) return MOERL_ERR;
    json_t *s = json_object(), *redo = json_array();
    json_object_set_new(s, "format", json_string("moerl-rl-state"));
    json_object_set_new(s, "format_version", json_integer(1));
    json_object_set_new(s, "version", json_integer(J->T.version));
    json_object_set_new(s, "trainer_step", json_integer(J->T.step));
    json_object_set_new(s, "optimizer_step", json_integer(J->T.opt.step));
    json_object_set_new(s, "optimizer_skipped", json_integer(J->T.opt.skipped));
    json_object_set_new(s, "consumed_prompts", json_integer(J->consumed));
    const prompt_feed *f = J->feed;
    json_object_set_new(s, "feed_epoch", json_integer(f->epoch));
    json_object_set_new(s, "feed_pos", json_integer(f->pos));
    json_object_set_new(s, "seed", json_integer((json_int_t)c->seed));
    json_object_set_new(s, "n_rows", json_integer(f->n_rows));
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)dataset_fingerprint(J->train));
    json_object_set_new(s, "data_fingerprint", json_string(fp));
    /* unconsumed started prompts: redo list left over from an earlier resume, then in-flight, then queued */
    for (int i = f->redo_pos; i < f->n_redo; i++) json_array_append_new(redo, json_integer(f->redo[i]));
    for (int i = 0; i < n_inflight; i++) json_array_append_new(redo, json_integer(inflight[i]));
    const int qcap = J->queue.cap > 0 ? J->queue.cap : 1;
    void **q = xmalloc((size_t)qcap * sizeof(void *));
    int nq = rl_queue_peek_all(&J->queue, q, qcap);
    for (int i = 0; i < nq; i++) json_array_append_new(redo, json_integer(((rl_group *)q[i])->uid));
    free(q);
    json_object_set_new(s, "unconsumed_started", redo);
    fflush(J->samples);
    json_object_set_new(s, "samples_log_bytes", json_integer(ftell(J->samples)));
    char *txt = json_dumps(s, JSON_INDENT(1));
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    int rc = moerl_write_file_atomic(p, txt, strlen(txt));
    free(txt);
    json_decref(s);
    return rc;
}

/* Rewrite a metrics JSONL file keeping the records whose "step" is ≤ step (atomically). */
static int drop_metrics_after(const char *path, int64_t step) {
    char *txt;
    size_t len;
    if (access(path, F_OK) != 0) return MOERL_OK;
    if (moerl_read_file(path, &txt, &len) != MOERL_OK) return MOERL_ERR;
    char *out = xmalloc(len + 1);
    size_t o = 0;
    for (char *line = txt; line < txt + len;) {
        char *nl = memchr(line, '\n', (size_t)(txt + len - line));
        size_t ll = nl ? (size_t)(nl - line) + 1 : (size_t)(txt + len - line);
        json_t *j = json_loadb(line, ll, 0, NULL);
        json_t *st = j ? json_object_get(j, "step") : NULL;
        if (!st || json_integer_value(st) <= step) {
            memcpy(out + o, line, ll);
            o += ll;
        }
        json_decref(j);
        line += ll;
    }
    int rc = moerl_write_file_atomic(path, out, o);
    free(out);
    free(txt);
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
        if (access(p, R_OK) != 0) return MOERL_OK; /* nothing to resume from */
    }
    json_error_t err;
    json_t *s = json_load_file(p, 0, &err);
    if (!s) return moerl_errorf("%s:%d: %s", p, err.line, err.text);
    const char *fmt = json_string_value(json_object_get(s, "format"));
    if (!fmt || strcmp(fmt, "moerl-rl-state") || json_integer_value(json_object_get(s, "format_version")) != 1) {
        json_decref(s);
        return moerl_errorf("%s: not a moerl RL state file of format_version 1", p);
    }
    prompt_feed *fd = J->feed;
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)dataset_fingerprint(J->train));
    const char *sfp = json_string_value(json_object_get(s, "data_fingerprint"));
    if (json_integer_value(json_object_get(s, "n_rows")) != fd->n_rows ||
        (uint64_t)json_integer_value(json_object_get(s, "seed")) != c->seed || !sfp || strcmp(sfp, fp)) {
        json_decref(s);
        return moerl_errorf("%s: the checkpoint was made with other training data (size or content) or another "
                            "trainer.seed; use a new trainer.default_local_dir or trainer.resume_mode=disable", p);
    }
    {
        const json_int_t v = json_integer_value(json_object_get(s, "version")),
                         st = json_integer_value(json_object_get(s, "trainer_step")),
                         ep = json_integer_value(json_object_get(s, "feed_epoch")),
                         pos = json_integer_value(json_object_get(s, "feed_pos")),
                         cons = json_integer_value(json_object_get(s, "consumed_prompts"));
        json_t *rd = json_object_get(s, "unconsumed_started");
        int bad = v < 0 || st < 0 || ep < 0 || pos < 0 || pos > fd->n_rows || cons < 0 || !json_is_array(rd);
        for (size_t i = 0; !bad && i < json_array_size(rd); i++) {
            json_int_t u = json_integer_value(json_array_get(rd, i));
            bad = !json_is_integer(json_array_get(rd, i)) || u < 0 || u / fd->n_rows > ep + 1;
        }
        if (bad) {
            json_decref(s);
            return moerl_errorf("%s: version, trainer_step, feed_epoch, feed_pos (0..%lld), consumed_prompts or "
                                "unconsumed_started out of range: the file is damaged", p, (long long)fd->n_rows);
        }
    }
    if (model_load_weights(J->m, dir) != MOERL_OK) {
        json_decref(s);
        return MOERL_ERR;
    }
    st_file f;
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (st_open(&f, p) != MOERL_OK) {
        json_decref(s);
        return MOERL_ERR;
    }
    const st_tensor *tm = st_find(&f, "adam.m"), *tv = st_find(&f, "adam.v");
    if (!tm || !tv || tm->numel != (int64_t)J->m->n_params || tv->numel != (int64_t)J->m->n_params) {
        st_close(&f);
        json_decref(s);
        return moerl_errorf("%s: adam.m/adam.v missing or not %zu floats", p, J->m->n_params);
    }
    st_to_f32(tm, J->T.opt.m);
    st_to_f32(tv, J->T.opt.v);
    st_close(&f);
    J->T.version = (int)json_integer_value(json_object_get(s, "version"));
    J->T.step = json_integer_value(json_object_get(s, "trainer_step"));
    J->T.opt.step = json_integer_value(json_object_get(s, "optimizer_step"));
    J->T.opt.skipped = json_integer_value(json_object_get(s, "optimizer_skipped"));
    J->consumed = json_integer_value(json_object_get(s, "consumed_prompts"));
    /* the order of the checkpoint's epoch, at its position */
    prompt_feed_seek(fd, (int)json_integer_value(json_object_get(s, "feed_epoch")),
                     json_integer_value(json_object_get(s, "feed_pos")));
    json_t *redo = json_object_get(s, "unconsumed_started");
    free(fd->redo);
    fd->n_redo = (int)json_array_size(redo);
    fd->redo = xmalloc((fd->n_redo + 1) * sizeof(int64_t));
    for (int i = 0; i < fd->n_redo; i++) fd->redo[i] = json_integer_value(json_array_get(redo, i));
    fd->redo_pos = 0;
    long bytes = (long)json_integer_value(json_object_get(s, "samples_log_bytes"));
    json_decref(s);
    /* samples logged after the checkpoint belong to steps that are redone now */
    snprintf(p, sizeof p, "%s/samples.jsonl", c->out_dir);
    if (truncate(p, bytes) != 0 && errno != ENOENT) return moerl_errorf("cannot truncate %s: %s", p, strerror(errno));
    /* metrics of steps after the checkpoint are redone too: keep only records up to its step */
    snprintf(p, sizeof p, "%s/metrics.jsonl", c->out_dir);
    if (drop_metrics_after(p, (int64_t)J->T.step) != MOERL_OK) return MOERL_ERR;
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
    J->mw = metrics_open(p);
    snprintf(p, sizeof p, "%s/samples.jsonl", cfg->out_dir);
    J->samples = fopen(p, resumed ? "a" : "w");
    snprintf(p, sizeof p, "%s/plot.dat", cfg->out_dir);
    J->plotdata = fopen(p, resumed ? "a" : "w");
    if (!J->mw || !J->samples || !J->plotdata)
        return moerl_errorf("cannot open the run's output files under %s", cfg->out_dir);
    return MOERL_OK;
}

void job_close_outputs(job *J) {
    if (J->mw) metrics_close(J->mw);
    if (J->samples) fclose(J->samples);
    if (J->plotdata) fclose(J->plotdata);
    J->mw = NULL;
    J->samples = J->plotdata = NULL;
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
        fprintf(J->samples,
                "{\"step\": %lld, \"trainer_version\": %d, \"uid\": %lld, \"epoch\": %d, \"row\": %d, "
                "\"start_version\": %d, \"min_version\": %d, \"max_version\": %d, \"interrupted_responses\": %d}\n",
                (long long)J->T.step, J->T.version, (long long)g[i]->uid, g[i]->epoch, g[i]->row, g[i]->start_version,
                vmin, vmax, intr);
    }
}

void job_add_stats(train_stats *a, const train_stats *b, int first) {
    if (first) {
        *a = *b;
        return;
    }
    a->pg_loss += b->pg_loss; a->pg_clipfrac += b->pg_clipfrac; a->ppo_kl += b->ppo_kl; a->grad_norm += b->grad_norm;
    a->aux_loss += b->aux_loss; a->entropy += b->entropy; a->kl_loss += b->kl_loss; a->reward_mean += b->reward_mean;
    a->reward_std += b->reward_std; a->acc_mean += b->acc_mean; a->response_length_mean += b->response_length_mean;
    a->response_length_max = fmax(a->response_length_max, b->response_length_max);
    a->n_samples += b->n_samples; a->stale_samples += b->stale_samples; a->partial_samples += b->partial_samples;
    a->trained_tokens += b->trained_tokens; a->resp_tokens += b->resp_tokens;
    a->max_lag = MOERL_MAX(a->max_lag, b->max_lag);
    a->max_partial_span = MOERL_MAX(a->max_partial_span, b->max_partial_span);
    a->expert_load_max_over_mean += b->expert_load_max_over_mean;
    a->update_s += b->update_s;
    a->reduce_exposed_s += b->reduce_exposed_s;
}

int job_run_validation(job *J, double *acc) {
    double mlen;
    if (eval_accuracy(J->m, J->test, J->cfg->val_n, J->cfg->max_response_length, J->cfg->max_num_seqs, acc, &mlen) !=
        MOERL_OK)
        return MOERL_ERR;
    return MOERL_OK;
}

/* One console line and one JSONL record per version. */
void job_emit_version(job *J, double rollouter_busy, double rollouter_idle) {
    const int k = J->win_steps ? J->win_steps : 1;
    train_stats *w = &J->win;
    double wall = moerl_now() - J->win_t0;
    double t_idle = wall > 0 ? J->win_gen_wait / wall : 0;
    double r_idle = rollouter_busy + rollouter_idle > 0 ? rollouter_idle / (rollouter_busy + rollouter_idle) : 0;
    const char *keys[] = {"timing_s/gen", "timing_s/update", "timing_s/param_sync", "trainer/idle_ratio",
                          "rollouter/idle_ratio", "fully_async/count/stale_samples_processed",
                          "fully_async/count/current_param_version", "fully_async/partial/partial_ratio",
                          "fully_async/partial/max_partial_span", "perf/throughput", "critic/rewards/mean",
                          "critic/rewards/std", "response_length/mean", "response_length/max", "actor/pg_loss",
                          "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm", "moe/aux_loss",
                          "moe/expert_load_max_over_mean", "fully_async/max_staleness", "training/global_step",
                          "actor/entropy", "actor/kl_loss", "perf/prompts_per_s",
                          /* rl_run_dist only (written when J->is_dist) */
                          "timing_s/grad_reduce_exposed", "timing_s/weight_bcast", "perf/weight_bcast_bytes",
                          "perf/weight_bcast_GBps"};
    double vals[] = {J->win_gen_wait, J->win_update, J->win_sync, t_idle, r_idle, (double)w->stale_samples,
                     (double)J->T.version, w->n_samples ? (double)w->partial_samples / w->n_samples : 0,
                     (double)w->max_partial_span, wall > 0 ? w->trained_tokens / wall : 0, w->reward_mean / k,
                     w->reward_std / k, w->response_length_mean / k, w->response_length_max, w->pg_loss / k,
                     w->pg_clipfrac / k, w->ppo_kl / k, w->grad_norm / k, w->aux_loss / k,
                     w->expert_load_max_over_mean / k, (double)w->max_lag, (double)J->T.step, w->entropy / k,
                     w->kl_loss / k, wall > 0 ? (w->n_samples / (double)J->cfg->n) / wall : 0,
                     w->reduce_exposed_s, J->win_bcast_s, (double)J->bcast_bytes,
                     J->win_bcast_s > 0 ? J->bcast_bytes / J->win_bcast_s / 1e9 : 0};
    const int n_keys = (int)(sizeof vals / sizeof vals[0]) - (J->is_dist ? 0 : 4);
    metrics_write(J->mw, J->T.step, n_keys, keys, vals);
    log_info("v%-3d step %-4lld reward %.3f pg_loss %+.4f clip %.3f kl %+.4f gnorm %.3f | gen %.2fs upd %.2fs "
             "sync %.3fs | idle T %.2f R %.2f | stale %lld partial %.2f lag %d | %.0f tok/s",
             J->T.version, (long long)J->T.step, w->reward_mean / k, w->pg_loss / k, w->pg_clipfrac / k,
             w->ppo_kl / k, w->grad_norm / k, J->win_gen_wait, J->win_update, J->win_sync, t_idle, r_idle,
             (long long)w->stale_samples, w->n_samples ? (double)w->partial_samples / w->n_samples : 0, w->max_lag,
             wall > 0 ? w->trained_tokens / wall : 0);
    if (J->plotdata) fprintf(J->plotdata, "%d %g %s\n", J->T.version, w->reward_mean / k, "nan");
    J->win_t0 = moerl_now();
    J->win_gen_wait = J->win_update = J->win_sync = J->win_bcast_s = 0;
    J->win_steps = 0;
}

/* ------------------------------------------------------------------ one trainer step */

static int do_train_step(job *J, rl_group **groups, double gen_wait) {
    const int req = J->R.budget.required_samples;
    train_stats st;
    if (trainer_step(&J->T, groups, req, &st) != MOERL_OK) return MOERL_ERR;
    J->consumed += req;
    job_log_samples(J, groups, req);
    for (int i = 0; i < req; i++) rl_group_free(groups[i]);
    J->max_lag = MOERL_MAX(J->max_lag, st.max_lag);
    job_add_stats(&J->win, &st, J->win_steps == 0);
    J->win_steps++;
    J->win_gen_wait += gen_wait;
    J->win_update += st.update_s;
    J->sum_gen_wait += gen_wait;
    J->sum_update += st.update_s;
    return MOERL_OK;
}

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
        if (job_run_validation(J, &acc) != MOERL_OK) return MOERL_ERR;
        J->last_val = acc;
        const char *k[] = {"val/accuracy"};
        double v[] = {acc};
        metrics_write(J->mw, J->T.step, 1, k, v);
        log_info("v%-3d held-out accuracy %.1f%%", J->T.version, 100 * acc);
        if (J->plotdata) fprintf(J->plotdata, "%d nan %g\n", J->T.version, acc);
    }
    return MOERL_OK;
}

int job_want_checkpoint(const job *J, int new_version) {
    return J->cfg->save_freq > 0 && new_version % J->cfg->save_freq == 0;
}

/* ------------------------------------------------------------------ lockstep / sync driver */

static int run_lockstep(job *J) {
    const rl_config *c = J->cfg;
    const int req = J->R.budget.required_samples;
    rl_group **groups = xmalloc(req * sizeof(rl_group *));
    while (J->T.step < J->total_steps) {
        /* generate until the trainer has a batch (or the rollouter cannot go on) */
        double t0 = moerl_now();
        while (rl_queue_size(&J->queue) < req) {
            int did = rollouter_tick(&J->R);
            if (did < 0) return MOERL_ERR;
            if (did == 0) return moerl_errorf("rollouter idle with %d of %d groups queued: staleness budget or data "
                                              "exhausted (a bug)", rl_queue_size(&J->queue), req);
        }
        double gen = moerl_now() - t0;
        J->R.busy_s += gen;
        MOERL_ASSERT(rl_queue_try_get_n(&J->queue, (void **)groups, req) == req);
        if (do_train_step(J, groups, gen) != MOERL_OK) return MOERL_ERR;
        if (J->T.step % c->trigger_parameter_sync_step == 0) {
            double ts = moerl_now();
            if (!c->partial_rollout) { /* let in-flight responses finish under the old weights */
                J->R.draining = 1;
                while (engine_num_unfinished(J->R.eng) > 0)
                    if (rollouter_tick(&J->R) < 0) return MOERL_ERR;
            }
            J->R.on_paused = job_want_checkpoint(J, J->T.version + 1) ? on_paused_checkpoint : NULL;
            J->R.on_paused_ctx = J;
            J->T.version++;
            if (rollouter_apply_sync(&J->R, J->m->params, J->m->n_params, J->T.version) != MOERL_OK) return MOERL_ERR;
            if (J->failed) return MOERL_ERR;
            double rb = J->R.busy_s, ri = J->R.idle_s;
            J->rollouter_busy_total += rb;
            J->rollouter_idle_total += ri;
            J->R.busy_s = J->R.idle_s = 0;
            if (job_after_sync(J, moerl_now() - ts, rb, ri) != MOERL_OK) return MOERL_ERR;
        }
    }
    free(groups);
    return MOERL_OK;
}

/* ------------------------------------------------------------------ async driver */

static void set_role_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n > 0 ? n : 1);
#endif
}

static void *rollouter_main(void *arg) {
    job *J = arg;
    rollouter *R = &J->R;
    set_role_threads(J->cfg->rollout_threads);
    pthread_mutex_lock(&R->mu);
    while (!R->stop) {
        if (R->sync_requested) {
            if (J->cfg->partial_rollout || engine_num_unfinished(R->eng) == 0) {
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
            R->idle_s += moerl_now() - t0;
            R->last_progress = moerl_now();
        }
    }
    pthread_mutex_unlock(&R->mu);
    return NULL;
}

static void *watchdog_main(void *arg) {
    job *J = arg;
    const double limit = J->cfg->watchdog_s;
    while (!J->watchdog_stop) {
        usleep(200000);
        double now = moerl_now(), t_age = now - J->T.last_progress;
        if (limit > 0 && t_age > limit && !J->watchdog_stop) {
            fprintf(stderr,
                    "moerl rl: watchdog: no trainer progress for %.1f s (trainer.watchdog_s=%g): trainer in stage "
                    "'%s', rollouter in stage '%s' (last progress %.0f s ago), queue %d groups, %d in flight\n",
                    t_age, limit, J->T.stage, J->R.stage, now - J->R.last_progress, rl_queue_size(&J->queue),
                    J->R.n_inflight);
            fflush(stderr);
            _exit(3);
        }
    }
    return NULL;
}

static int run_async(job *J) {
    const rl_config *c = J->cfg;
    rollouter *R = &J->R;
    const int req = R->budget.required_samples;
    rl_group **groups = xmalloc(req * sizeof(rl_group *));
    openblas_set_num_threads(1); /* each role runs its own OpenMP team; BLAS stays single-threaded */
    pthread_t th;
    if (pthread_create(&th, NULL, rollouter_main, J) != 0) return moerl_errorf("cannot start the rollouter thread");
    set_role_threads(c->trainer_threads);
    int rc = MOERL_OK;
    while (J->T.step < J->total_steps) {
        J->T.stage = "wait_samples";
        double waited;
        int got = rl_queue_get_n(&J->queue, (void **)groups, req, 0, &waited);
        pthread_mutex_lock(&R->mu);
        pthread_cond_broadcast(&R->cv); /* queue space: the rollouter may admit again */
        pthread_mutex_unlock(&R->mu);
        if (got != req) {
            rc = moerl_errorf("rollouter stopped: %s", R->error[0] ? R->error : "queue closed");
            break;
        }
        if (do_train_step(J, groups, waited) != MOERL_OK) {
            rc = MOERL_ERR;
            break;
        }
        if (J->T.step % c->trigger_parameter_sync_step == 0) {
            J->T.stage = "param_sync";
            double ts = moerl_now();
            pthread_mutex_lock(&R->mu);
            R->on_paused = job_want_checkpoint(J, J->T.version + 1) ? on_paused_checkpoint : NULL;
            R->on_paused_ctx = J;
            J->T.version++;
            R->sync_params = J->m->params;
            R->sync_version = J->T.version;
            R->sync_done = 0;
            R->sync_requested = 1;
            pthread_cond_broadcast(&R->cv);
            while (!R->sync_done && !R->stop) pthread_cond_wait(&R->cv, &R->mu);
            double rb = R->busy_s, ri = R->idle_s;
            R->busy_s = R->idle_s = 0;
            int stopped = R->stop;
            pthread_mutex_unlock(&R->mu);
            if (stopped || J->failed) {
                rc = moerl_errorf("param sync failed: %s", R->error[0] ? R->error : moerl_last_error());
                break;
            }
            J->rollouter_busy_total += rb;
            J->rollouter_idle_total += ri;
            if (job_after_sync(J, moerl_now() - ts, rb, ri) != MOERL_OK) {
                rc = MOERL_ERR;
                break;
            }
        }
        J->T.last_progress = moerl_now();
    }
    pthread_mutex_lock(&R->mu);
    R->stop = 1;
    pthread_cond_broadcast(&R->cv);
    pthread_mutex_unlock(&R->mu);
    pthread_join(th, NULL);
    free(groups);
    return rc;
}

/* ------------------------------------------------------------------ plot */

void job_write_plot(const job *J) {
    char gp[4200], png[4200], dat[4200];
    snprintf(dat, sizeof dat, "%s/plot.dat", J->cfg->out_dir);
    snprintf(png, sizeof png, "%s/reward_accuracy.png", J->cfg->out_dir);
    snprintf(gp, sizeof gp, "%s/plot.gp", J->cfg->out_dir);
    FILE *f = fopen(gp, "w");
    if (!f) return;
    fprintf(f,
            "set terminal pngcairo size 900,500 noenhanced\nset output '%s'\nset xlabel 'parameter version'\n"
            "set ylabel 'reward / accuracy'\nset yrange [0:1.05]\nset key bottom right\nset grid\n"
            "set datafile missing 'nan'\n"
            "plot '%s' using 1:2 with linespoints title 'train reward (mean)', "
            "'' using 1:3 with linespoints pt 7 title 'held-out accuracy (greedy)'\n",
            png, dat);
    fclose(f);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "command -v gnuplot >/dev/null 2>&1 && gnuplot '%s' 2>/dev/null", gp);
    if (system(cmd) == 0) log_info("plot written to %s", png);
    else log_warn("gnuplot not available or failed: no plot (data in %s)", dat);
}

/* ------------------------------------------------------------------ entry */

int rl_run(const rl_config *cfg, moe_model *m, const dataset *train, const dataset *test, rl_result *res) {
    job *J = xcalloc(1, sizeof *J);
    J->cfg = cfg;
    J->train = train;
    J->test = test;
    J->m = m;
    int rc = MOERL_ERR;
    memset(res, 0, sizeof *res);
    if (moerl_mkdirs(cfg->out_dir) != MOERL_OK) goto out0;
    staleness_budget b;
    if (staleness_init(&b, cfg->ppo_mini_batch_size, cfg->require_batches, cfg->trigger_parameter_sync_step,
                       cfg->staleness_threshold) != MOERL_OK)
        goto out0;
    J->total_steps = cfg->total_training_steps > 0
                         ? cfg->total_training_steps
                         : (int64_t)cfg->total_epochs * dataset_count(train) / b.required_samples;
    if (J->total_steps <= 0) {
        moerl_errorf("no trainer steps: %lld training rows, %d prompts per step (actor.ppo_mini_batch_size × "
                     "async_training.require_batches), trainer.total_epochs %d",
                     (long long)dataset_count(train), b.required_samples, cfg->total_epochs);
        goto out0;
    }
    if (b.required_samples > dataset_count(train)) {
        moerl_errorf("a trainer step needs %d prompts (actor.ppo_mini_batch_size × async_training.require_batches) "
                     "but the training data has only %lld rows", b.required_samples, (long long)dataset_count(train));
        goto out0;
    }
    J->total_prompts = J->total_steps * b.required_samples;
    rl_queue_init(&J->queue, b.max_required_samples);
    if (rollouter_init(&J->R, cfg, train, m, &J->queue, J->total_prompts) != MOERL_OK) goto out0;
    J->feed = &J->R.feed;
    if (trainer_init(&J->T, cfg, train, m) != MOERL_OK) goto out0;
    int resumed = 0;
    if (cfg->resume_auto && job_load_checkpoint(J, &resumed) != MOERL_OK) goto out0;
    if (resumed) {
        J->R.prompts_left = J->total_prompts - J->consumed;
        if (engine_load_weights(J->R.eng, J->m->params, J->m->n_params, J->T.version) != MOERL_OK) goto out0;
    }
    if (job_open_outputs(J, resumed) != MOERL_OK) goto out0;
    log_info("fully-async GRPO: %lld steps × %d prompts × %d responses; staleness_threshold %g → queue %d, "
             "lag bound %d (for in-order completion); trigger_parameter_sync_step %d; partial_rollout %s; mode %s",
             (long long)J->total_steps, b.required_samples, cfg->n, cfg->staleness_threshold, b.max_required_samples,
             b.lag_bound, cfg->trigger_parameter_sync_step, cfg->partial_rollout ? "on" : "off",
             cfg->mode == RL_MODE_ASYNC ? "async" : cfg->mode == RL_MODE_SYNC ? "sync" : "lockstep");
    if (!resumed && cfg->val_n != 0) {
        if (job_run_validation(J, &res->val_acc_start) != MOERL_OK) goto out0;
        log_info("held-out accuracy at start: %.1f%%", 100 * res->val_acc_start);
        const char *k[] = {"val/accuracy"};
        double v[] = {res->val_acc_start};
        metrics_write(J->mw, J->T.step, 1, k, v);
        fprintf(J->plotdata, "%d nan %g\n", J->T.version, res->val_acc_start);
    }
    pthread_t wd;
    J->T.last_progress = moerl_now();
    pthread_create(&wd, NULL, watchdog_main, J);
    J->run_t0 = J->win_t0 = moerl_now();
    int64_t step0 = J->T.step;
    int r = cfg->mode == RL_MODE_ASYNC ? run_async(J) : run_lockstep(J);
    double wall = moerl_now() - J->run_t0;
    J->watchdog_stop = 1;
    pthread_join(wd, NULL);
    if (r != MOERL_OK) goto out0;
    if (J->win_steps > 0) job_emit_version(J, J->R.busy_s, J->R.idle_s);
    engine_stats es = engine_get_stats(J->R.eng);
    res->steps = J->T.step;
    res->prompts_trained = (J->T.step - step0) * b.required_samples;
    res->tokens_generated = es.generated_tokens;
    res->wall_s = wall;
    res->prompts_per_s = res->prompts_trained / wall;
    res->tokens_per_s = es.generated_tokens / wall;
    res->final_version = J->T.version;
    res->max_lag_seen = J->max_lag;
    res->trainer_idle_ratio = wall > 0 ? J->sum_gen_wait / wall : 0;
    double rt = J->rollouter_busy_total + J->rollouter_idle_total;
    res->rollouter_idle_ratio = rt > 0 ? J->rollouter_idle_total / rt : 0;
    if (cfg->val_n != 0) {
        if (job_run_validation(J, &res->val_acc_end) != MOERL_OK) goto out0;
        const char *k[] = {"val/accuracy"};
        double v[] = {res->val_acc_end};
        metrics_write(J->mw, J->T.step, 1, k, v);
        fprintf(J->plotdata, "%d nan %g\n", J->T.version, res->val_acc_end);
    }
    /* final checkpoint: a consistent state with nothing in flight that matters */
    if (cfg->save_freq >= 0) {
        /* in-flight and queued groups are listed as unconsumed, so a resume redoes them */
        if (save_checkpoint(J) != MOERL_OK) goto out0;
    }
    fflush(J->plotdata);
    job_write_plot(J);
    rc = MOERL_OK;
out0:
    job_close_outputs(J);
    if (J->R.eng) rollouter_free(&J->R);
    if (J->T.m) trainer_free(&J->T);
    if (J->queue.items) {
        void *g;
        while (rl_queue_try_get_n(&J->queue, &g, 1) == 1) rl_group_free(g);
        rl_queue_destroy(&J->queue);
    }
    free(J);
    return rc;
}
