/* The one step loop of the main job, shared by the embedded job (job.c) and trainer rank 0 of the
 * MPI job (job_dist.c); the transport (job_ops) is what differs. See job_internal.h.
 *
 *   start: validation (new run) or the accuracy the checkpoint recorded (resume)
 *   per step: take required_samples groups (filter_groups drops uniform-reward groups; replacements
 *             are admitted at once) → sample statistics → split each mini-batch over the trainer
 *             ranks (rl_split_minibatch; one rank embedded) → trainer_update → log
 *   every trigger_parameter_sync_step steps: version+1 → transport sync (checkpoint inside when due)
 *             → window metrics, validation every test_freq versions
 *   stop: after total steps, on SIGINT/SIGTERM (checkpoint, then the caller exits 128+signal), or
 *         on divergence (N consecutive non-finite optimizer steps: error, the last checkpoint kept)
 *   end: transport stop → last window → validation → checkpoint → plot.
 *   reward failure (the rollout side stopped on the reward backend's error): transport stop →
 *         checkpoint (groups waiting for rewards are in flight: redone on resume) → the error.
 * Sources: verl recipe/fully_async_policy (trainer loop, parameter synchroniser), DAPO (dynamic
 * sampling, Yu et al. 2025); docs/rl.md. */
#include <jansson.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "model/perf.h"
#include "base/trace.h"
#include "base/signals.h"
#include "rl/job_internal.h"
#include "rl/rl.h"

/* ------------------------------------------------------------------ plan */

int job_plan(job *J, staleness_budget *b) {
    const rl_config *cfg = J->cfg;
    if (rl_check_step_rows(cfg, dataset_count(J->train), b, &J->total_steps) != MOERL_OK) return MOERL_ERR;
    J->total_prompts = J->total_steps * b->required_samples;
    J->last_ckpt_step = -1;
    J->last_val_step = -1;
    J->resumed_val = NAN;
    J->last_val = NAN;
    return MOERL_OK;
}

/* ------------------------------------------------------------------ one step */

/* Groups taken from the queue but not trained yet (a stop while a filtered batch was being
 * filled): listed as unconsumed by the final checkpoint. */
typedef struct {
    rl_group **g;
    int n;
} held_groups;

static void log_dropped(job *J, const rl_group *g) {
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(J->T.step + 1)); /* the step it was taken for */
    json_object_set_new(o, "trainer_version", json_integer(J->T.version));
    json_object_set_new(o, "uid", json_integer(g->uid));
    json_object_set_new(o, "epoch", json_integer(g->epoch));
    json_object_set_new(o, "row", json_integer(g->row));
    json_object_set_new(o, "start_version", json_integer(g->start_version));
    json_object_set_new(o, "dropped", json_string("filter_groups: every response got the same reward"));
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    fprintf(J->samples, "%s\n", s);
    free(s);
    json_decref(o);
}

/* Take req groups for one step into held (DAPO dynamic sampling drops the uniform ones). Returns
 * 1 with held->n == req, 0 when a stop signal came first (held keeps what was taken), MOERL_ERR. */
static int take_batch(job *J, held_groups *held, int req, double *waited, int64_t *dropped_now) {
    const rl_config *cfg = J->cfg;
    float *rw = xmalloc((size_t)cfg->n * sizeof(float));
    int rc = 1;
    *waited = 0;
    *dropped_now = 0;
    while (held->n < req) {
        if (moerl_stop_requested()) {
            rc = 0;
            break;
        }
        double w = 0;
        const int k = req - held->n;
        const int got = J->ops->get_groups(J, held->g + held->n, k, 0.25, &w);
        *waited += w;
        if (got < 0) {
            rc = MOERL_ERR;
            break;
        }
        for (int i = 0; i < got; i++) {
            rl_group *g = held->g[held->n];
            if (cfg->filter_groups) {
                if (trainer_group_rewards(&J->T, g, rw, NULL) != MOERL_OK) {
                    rc = MOERL_ERR;
                    break;
                }
                if (rl_group_uniform_reward(rw, g->n)) {
                    log_dropped(J, g);
                    rl_group_free(g);
                    J->consumed++;
                    J->dropped++;
                    (*dropped_now)++;
                    J->ops->add_prompts(J, 1);
                    /* close the gap: the later groups of this batch move down */
                    memmove(held->g + held->n, held->g + held->n + 1, (size_t)(got - i - 1) * sizeof(rl_group *));
                    continue;
                }
            }
            held->n++;
        }
        if (rc != 1) break;
        if (cfg->filter_groups && cfg->filter_max_num_gen_batches > 0 &&
            *dropped_now > (int64_t)cfg->filter_max_num_gen_batches * req) {
            rc = moerl_errorf("algorithm.filter_groups dropped %lld group%s (every response with the same reward) "
                              "while filling step %lld, more than max_num_gen_batches=%d steps' worth: the task gives "
                              "no learning signal to this policy (all right or all wrong); raise "
                              "algorithm.filter_groups.max_num_gen_batches, rollout.n or the task's difficulty range",
                              (long long)*dropped_now, moerl_plural(*dropped_now), (long long)J->T.step + 1,
                              cfg->filter_max_num_gen_batches);
            break;
        }
    }
    free(rw);
    return rc;
}

/* One trainer step over n groups: statistics, the data-parallel split, the update, the log. */
static int train_step(job *J, rl_group **groups, int n, double waited, int64_t dropped_now) {
    const rl_config *cfg = J->cfg;
    trainer *T = &J->T;
    const double t0 = job_clock(J);
    train_stats st;
    memset(&st, 0, sizeof st);
    T->stage = "reward";
    for (int i = 0; cfg->rollout_routing_replay && i < n; i++) /* routing records: from the queue or the wire */
        if (rl_group_check_routes(groups[i], &T->m->cfg, NULL) != MOERL_OK) return MOERL_ERR;
    if (trainer_sample_stats(T, groups, n, &st) != MOERL_OK) return MOERL_ERR;
    job_add_reward_extras(J, groups, n);
    /* D data-parallel shards; trainer rank d trains shard shard_of[d] (the ranks of a Ulysses group
     * share one, src/parallel/grid.h) */
    const int D = J->n_shards > 0 ? J->n_shards : J->n_trainers, mb = cfg->ppo_mini_batch_size,
              nmb = (n + mb - 1) / mb;
    rl_minibatch *mbs = xcalloc((size_t)D * nmb, sizeof(rl_minibatch)); /* [shard][mini-batch] */
    rl_group ***part = xmalloc((size_t)D * sizeof(rl_group **));
    int *n_part = xcalloc((size_t)D, sizeof(int));
    for (int d = 0; d < D; d++) part[d] = xmalloc((size_t)(n ? n : 1) * sizeof(rl_group *));
    rl_plan_step(groups, n, mb, D, mbs, part, n_part);
    int rc = MOERL_OK;
    T->stage = "send_parts";
    for (int d = 1; d < J->n_trainers && rc == MOERL_OK; d++) {
        const int s = J->shard_of ? J->shard_of[d] : d;
        rc = J->ops->send_part(J, d, mbs + s * nmb, nmb, part[s], n_part[s]);
    }
    const int s0 = J->shard_of ? J->shard_of[0] : 0;
    const int64_t skipped0 = T->opt.skipped;
    if (rc == MOERL_OK)
        rc = J->ops->update ? J->ops->update(J, part[s0], mbs + s0 * nmb, nmb, &st)
                            : trainer_update(T, part[s0], mbs + s0 * nmb, nmb, &st);
    for (int d = 0; d < D; d++) free(part[d]);
    free(part);
    free(n_part);
    free(mbs);
    if (rc != MOERL_OK) return MOERL_ERR;
    J->consecutive_skipped = T->opt.skipped > skipped0 ? J->consecutive_skipped + 1 : 0;
    st.update_s = job_clock(J) - t0;
    st.dropped_groups = dropped_now;
    J->consumed += n;
    job_log_samples(J, groups, n);
    for (int i = 0; i < n; i++) rl_group_free(groups[i]);
    J->max_lag = MOERL_MAX(J->max_lag, st.max_lag);
    J->reduce_exposed_total += st.reduce_exposed_s;
    job_add_stats(&J->win, &st, J->win_steps == 0);
    J->win_steps++;
    J->win_gen_wait += waited;
    J->win_update += st.update_s;
    J->sum_gen_wait += waited;
    J->sum_update += st.update_s;
    if (cfg->max_consecutive_skipped > 0 && J->consecutive_skipped >= cfg->max_consecutive_skipped)
        return moerl_errorf("the run diverged: %d consecutive optimizer steps up to trainer step %lld were skipped "
                            "because the loss or the gradient norm was not finite "
                            "(trainer.max_consecutive_skipped_steps=%d); %s — lower actor.optim.lr or raise the "
                            "clipping%s",
                            J->consecutive_skipped, (long long)T->step, cfg->max_consecutive_skipped,
                            J->last_ckpt_step >= 0 ? "the last good checkpoint (before the skipped steps) is kept"
                                                   : "no checkpoint was written before it (trainer.save_freq)",
                            J->last_ckpt_step >= 0 ? ", then resume" : "");
    return MOERL_OK;
}

/* ------------------------------------------------------------------ watchdog */

static void *watchdog_main(void *arg) {
    job *J = arg;
    const double limit = J->cfg->watchdog_s;
    while (!atomic_load(&J->watchdog_stop)) {
        usleep(200000);
        const double age = moerl_now() - J->T.last_progress;
        if (limit > 0 && age > limit && !atomic_load(&J->watchdog_stop)) {
            char side[512] = "";
            J->ops->describe(J, side, sizeof side);
            char msg[1024];
            const int queued = rl_queue_size(&J->queue);
            snprintf(msg, sizeof msg,
                     "watchdog: no trainer progress for %.1f s (trainer.watchdog_s=%g): trainer in stage '%s'; %s; "
                     "queue %d group%s",
                     age, limit, (const char *)J->T.stage, side, queued, moerl_plural(queued));
            J->ops->abort(J, msg);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ the loop */

static int do_sync(job *J) {
    J->T.stage = "param_sync";
    const double ts = job_clock(J);
    const int version = J->T.version + 1;
    J->T.version = version;
    double rb = 0, ri = 0;
    const double tr = trace_begin();
    const int rc = J->ops->sync(J, version, &rb, &ri);
    trace_end("param_sync", "rl", tr);
    if (rc != MOERL_OK) return MOERL_ERR;
    if (job_want_checkpoint(J, version)) J->last_ckpt_step = J->T.step;
    J->rollouter_busy_total += rb;
    J->rollouter_idle_total += ri;
    return job_after_sync(J, job_clock(J) - ts, rb, ri);
}

/* After job_run_validation (which wrote the val/accuracy, val-core/... record): the accuracy the
 * plot, the final result and the checkpoint's state keep. */
static void record_validation(job *J, double acc) {
    J->last_val = acc;
    J->last_val_step = J->T.step;
}

/* Start of a run: the held-out accuracy (measured for a new run, the checkpoint's for a resume). */
static int schedule_start(job *J, rl_result *res) {
    const rl_config *cfg = J->cfg;
    if (!J->resumed && cfg->val_n != 0) {
        if (job_run_validation(J, &res->val_acc_start) != MOERL_OK) return MOERL_ERR;
        log_info("held-out accuracy at start: %.1f%%", 100 * res->val_acc_start);
        record_validation(J, res->val_acc_start);
    } else if (J->resumed) {
        res->val_acc_start = J->resumed_val;
        J->last_val = J->resumed_val;
        if (J->T.step >= J->total_steps)
            log_info("nothing left to do: the run in %s finished at step %lld (version %d) of %lld; raise "
                     "trainer.total_training_steps (or trainer.total_epochs) to continue it",
                     cfg->out_dir, (long long)J->T.step, J->T.version, (long long)J->total_steps);
    }
    return MOERL_OK;
}

/* The steps: take a batch, train, sync every trigger_parameter_sync_step steps; stops early on a
 * signal (held keeps groups taken but not trained). */
static int schedule_steps(job *J, held_groups *held, int req) {
    while (J->T.step < J->total_steps) {
        J->T.stage = "wait_samples";
        double waited;
        int64_t dropped_now;
        const int t = take_batch(J, held, req, &waited, &dropped_now);
        if (t < 0) return MOERL_ERR;
        if (t == 0) break; /* a stop signal */
        held->n = 0;
        if (train_step(J, held->g, req, waited, dropped_now) != MOERL_OK) return MOERL_ERR;
        if (J->T.step % J->cfg->trigger_parameter_sync_step == 0 && do_sync(J) != MOERL_OK) return MOERL_ERR;
        J->T.last_progress = moerl_now();
        if (moerl_stop_requested()) break;
    }
    return MOERL_OK;
}

/* End of a run (the rollout side already stopped): the last window, the result, the final
 * validation and checkpoint (not repeated when the last sync wrote this step's), the plot. */
static int schedule_finish(job *J, rl_result *res, held_groups *held, int64_t step0, int req, double wall, double rb,
                           double ri) {
    const rl_config *cfg = J->cfg;
    int rc = MOERL_OK;
    J->rollouter_busy_total += rb;
    J->rollouter_idle_total += ri;
    if (J->win_steps > 0) job_emit_version(J, rb, ri);
    res->steps = J->T.step;
    res->prompts_trained = (J->T.step - step0) * req;
    res->wall_s = wall;
    res->prompts_per_s = wall > 0 ? res->prompts_trained / wall : 0;
    res->final_version = J->T.version;
    res->max_lag_seen = J->max_lag;
    res->trainer_idle_ratio = wall > 0 ? J->sum_gen_wait / wall : 0;
    const double rt = J->rollouter_busy_total + J->rollouter_idle_total;
    res->rollouter_idle_ratio = rt > 0 ? J->rollouter_idle_total / rt : 0;
    /* trainer.test_freq = -1 (verl): no validation after the start's, so no accuracy at the end (NaN: JSON null) */
    res->val_acc_end = cfg->test_freq < 0 ? NAN : J->last_val;
    if (cfg->val_n != 0 && cfg->test_freq >= 0 && J->T.step > step0 && !J->stop_signal && J->last_val_step != J->T.step) {
        if (job_run_validation(J, &res->val_acc_end) != MOERL_OK) return MOERL_ERR;
        record_validation(J, res->val_acc_end);
    }
    /* in-flight, held and queued groups are listed as unconsumed (a resume redoes them) */
    if (cfg->save_freq >= 0 && (J->last_ckpt_step != J->T.step || held->n > 0)) {
        int n_in;
        int64_t *in = J->ops->inflight_uids(J, &n_in);
        in = xrealloc(in, (size_t)(n_in + held->n + 1) * sizeof(int64_t));
        for (int i = 0; i < held->n; i++) in[n_in++] = held->g[i]->uid;
        const int c = job_save_checkpoint(J, in, n_in);
        free(in);
        if (c != MOERL_OK) rc = MOERL_ERR;
        else J->last_ckpt_step = J->T.step;
    }
    if (J->T.step > step0) job_plot_from_metrics(J); /* a resume with nothing left to do changes nothing */
    res->checkpoint_step = J->last_ckpt_step;
    if (J->stop_signal && rc == MOERL_OK && J->last_ckpt_step >= 0)
        log_info("stopped by signal %d at step %lld (version %d): checkpoint at step %lld in %s/checkpoint",
                 J->stop_signal, (long long)J->T.step, J->T.version, (long long)J->last_ckpt_step, cfg->out_dir);
    return rc;
}

/* The reward backend failed (the rollout side already stopped): a checkpoint (unless
 * trainer.save_freq=-1) listing the in-flight groups — those waiting for rewards among them — and the
 * held ones as unconsumed, then the backend's message with what to do. Always MOERL_ERR. */
static int reward_failure_stop(job *J, held_groups *held, const char *msg) {
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", msg);
    char where[4400] = "no checkpoint was written (trainer.save_freq=-1)";
    if (J->cfg->save_freq >= 0) {
        int n_in;
        int64_t *in = J->ops->inflight_uids(J, &n_in);
        in = xrealloc(in, (size_t)(n_in + held->n + 1) * sizeof(int64_t));
        for (int i = 0; i < held->n; i++) in[n_in++] = held->g[i]->uid;
        const int c = job_save_checkpoint(J, in, n_in);
        free(in);
        if (c == MOERL_OK) {
            J->last_ckpt_step = J->T.step;
            snprintf(where, sizeof where, "checkpoint at step %lld in %s/checkpoint (the prompts in flight — those "
                     "waiting for rewards among them — and queued are redone on resume)", (long long)J->T.step,
                     J->cfg->out_dir);
        } else {
            snprintf(where, sizeof where, "the checkpoint could not be written (%s); the last one on disk is kept",
                     moerl_last_error());
        }
    }
    return moerl_errorf("%s\n%s failed: %s; fix it and run the same command again (trainer.resume_mode=auto "
                        "resumes)", saved, J->cfg->multi_turn.enable ? "the reward or the tool environment (named above)"
                                                                     : "the reward", where);
}

int job_schedule_prepare(job *J, rl_result *res) {
    if (schedule_start(J, res) != MOERL_OK) return MOERL_ERR;
    /* the peak of the cores the trainer's team runs on (this thread's OpenMP team: trainer_threads in
     * async mode, trainer.n_threads on an MPI rank); none on a virtual clock (moerl simulate:
     * perf/mfu is NaN, the simulated device is not this host) */
#ifdef _OPENMP
    const int team = omp_get_max_threads();
#else
    const int team = 1;
#endif
    J->sgemm_peak = J->ops->clock ? 0 : perf_sgemm_peak(0.3, team);
    J->prepared = 1;
    return MOERL_OK;
}

int job_schedule_run(job *J, rl_result *res) {
    const int req = J->cfg->ppo_mini_batch_size * J->cfg->require_batches;
    double rb = 0, ri = 0;
    if (!J->prepared && job_schedule_prepare(J, res) != MOERL_OK) {
        J->ops->stop(J, &rb, &ri);
        return MOERL_ERR;
    }
    held_groups held = {xmalloc((size_t)req * sizeof(rl_group *)), 0};
    pthread_t wd;
    J->T.last_progress = moerl_now();
    atomic_store(&J->watchdog_stop, 0);
    if (pthread_create(&wd, NULL, watchdog_main, J) != 0) {
        J->ops->stop(J, &rb, &ri);
        free(held.g);
        return moerl_errorf("cannot start the watchdog thread");
    }
    /* the run's clock starts here, with generation (the transports prepare first): step 1's wait for
     * its first batch is timing_s/gen and trainer idle time of the first window */
    J->run_t0 = J->win_t0 = job_clock(J);
    const int64_t step0 = J->T.step;
    int rc = schedule_steps(J, &held, req);
    char msg[2048] = "";
    if (rc != MOERL_OK) snprintf(msg, sizeof msg, "%s", moerl_last_error());
    J->stop_signal = moerl_stop_requested();
    J->T.stage = "stop";
    const int stop_rc = J->ops->stop(J, &rb, &ri);
    const double wall = job_clock(J) - J->run_t0;
    atomic_store(&J->watchdog_stop, 1);
    pthread_join(wd, NULL);
    if (rc == MOERL_OK && stop_rc == MOERL_OK) rc = schedule_finish(J, res, &held, step0, req, wall, rb, ri);
    else if (rc != MOERL_OK && J->reward_failed && stop_rc == MOERL_OK) rc = reward_failure_stop(J, &held, msg);
    else if (rc != MOERL_OK) rc = moerl_errorf("%s", msg); /* stop's own messages do not replace the cause */
    else rc = MOERL_ERR;
    for (int i = 0; i < held.n; i++) rl_group_free(held.g[i]);
    free(held.g);
    return rc;
}
