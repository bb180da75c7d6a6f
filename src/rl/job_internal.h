/* Internal to src/rl: the job state and the pieces shared by the embedded driver (job.c, rl_run)
 * and the multi-process driver (job_dist.c, rl_run_dist) — checkpoints with resume, samples log,
 * per-version metrics, validation, plot. Not a public API. */
#ifndef MOERL_RL_JOB_INTERNAL_H
#define MOERL_RL_JOB_INTERNAL_H

#include <stdio.h>

#include "base/log.h"
#include "rl/rl.h"

typedef struct job job;

/* The transport of the one step loop (src/rl/schedule.c): how finished groups reach the trainer,
 * how a step's share reaches the other data-parallel trainer ranks and how new weights reach the
 * rollout side. Embedded (job.c: a rollouter thread or the same thread) and MPI (job_dist.c:
 * rollout ranks behind trainer rank 0's admission server) implement it; the loop is shared. */
typedef struct {
    /* Take exactly n finished groups from the queue (waiting at most timeout_s; 0 = forever):
     * returns n, 0 on timeout (nothing taken), MOERL_ERR when the rollout side failed. *waited_s
     * gets the seconds spent waiting. Lockstep: generates until n are there. */
    int (*get_groups)(job *J, rl_group **out, int n, double timeout_s, double *waited_s);
    /* Send trainer rank d ≥ 1 its share of the step (n_part groups, n_mb mini-batch descriptors). */
    int (*send_part)(job *J, int d, const rl_minibatch *mbs, int n_mb, rl_group **part, int n_part);
    /* Weight sync to `version` (the trainer's version is already set to it): pause admission,
     * interrupt or drain, checkpoint if job_want_checkpoint (with everything consistent), load the
     * weights on the rollout side, resume. *rb / *ri: rollout busy / idle seconds since the last sync. */
    int (*sync)(job *J, int version, double *rb, double *ri);
    /* k more new prompts for the rollout side (groups dropped by filter_groups are replaced). */
    void (*add_prompts)(job *J, int64_t k);
    /* uids of started prompts outside the queue (in flight), heap array; *n its length. */
    int64_t *(*inflight_uids)(job *J, int *n);
    /* Stop the rollout side (it abandons in-flight work, listed as unconsumed by the checkpoint)
     * and the other trainer ranks. Rollout busy/idle of the last window into *rb / *ri. */
    int (*stop)(job *J, double *rb, double *ri);
    /* The rollout side's state in a few words, for the watchdog. */
    void (*describe)(job *J, char *buf, size_t len);
    /* End the job at once with this message (watchdog): never returns. */
    void (*abort)(job *J, const char *msg);
    void *ctx;
    /* The PPO update of trainer rank 0's share (trainer_update's contract, T->step++ included);
     * NULL = trainer_update. moerl simulate (src/sim) times it on its virtual clock instead. */
    int (*update)(job *J, rl_group **part, const rl_minibatch *mbs, int n_mb, train_stats *st);
    /* The whole model (with moments: and the AdamW moments in the whole layout) on this process, for
     * a checkpoint, a validation or the weight broadcast, when the trainer ranks split it (model
     * parallelism): the other trainer ranks take part in the gathers. Sets J->whole_m / whole_opt
     * until whole_done. NULL: J->m and J->T.opt are whole already. */
    int (*whole)(job *J, int moments);
    void (*whole_done)(job *J);
    /* The clock (seconds) of the step loop's timings and rates (timing_s/update, timing_s/param_sync,
     * trainer/idle_ratio, perf/throughput, the run's wall time); NULL = moerl_now. moerl simulate
     * gives its virtual clock so that the per-step metrics read one clock. The watchdog keeps the
     * wall clock. */
    double (*clock)(job *J);
} job_ops;

struct job {
    const rl_config *cfg;
    const dataset *train, *test;
    moe_model *m;
    rollouter R;              /* embedded job only (rl_run_dist: rollout ranks own theirs) */
    trainer T;
    rl_queue queue;
    prompt_feed *feed;        /* the feed the checkpoint saves: R.feed (embedded) or the admission
                                 server's (trainer rank 0 of rl_run_dist) */
    metrics_writer *mw;
    FILE *samples;
    int64_t total_steps, total_prompts, consumed;
    /* window statistics (since the last version change) */
    double win_t0, win_gen_wait, win_update, win_sync;
    train_stats win;
    int win_steps;
    int64_t win_tokens;
    double rollouter_busy_snap, rollouter_idle_snap;
    /* run totals */
    double run_t0;
    int max_lag;
    int64_t tokens_generated;
    double sum_gen_wait, sum_update;
    double rollouter_busy_total, rollouter_idle_total;
    /* validation history for the plot */
    double last_val;
    int failed;
    _Atomic int watchdog_stop;
    int resumed;              /* resumed from a checkpoint */
    int64_t last_val_step;    /* trainer step of the last held-out validation (−1: none) */
    /* rl_run_dist: extra metrics per version (emitted only when is_dist) */
    int is_dist;
    double win_bcast_s;       /* weight broadcast seconds in this window */
    int64_t bcast_bytes;      /* payload bytes of the last broadcast */
    /* the shared step loop (schedule.c) */
    const job_ops *ops;
    int n_trainers;           /* data-parallel trainer ranks (1 embedded) */
    int64_t dropped;          /* groups dropped by filter_groups (consumed, replaced by new prompts) */
    int consecutive_skipped;  /* optimizer steps skipped in a row (non-finite) */
    int64_t last_ckpt_step;   /* trainer step of the last checkpoint written (−1: none) */
    double resumed_val;       /* held-out accuracy recorded in the checkpoint resumed from (NaN: none) */
    int stop_signal;          /* the signal that stopped the run (0: none) */
    double reduce_exposed_total; /* Σ over steps of exposed gradient-reduction seconds */
    double sgemm_peak;        /* measured matrix-multiply peak (FLOP/s) at start: the MFU denominator */
    int prepared;             /* job_schedule_prepare done */
    /* job_whole_begin / job_whole_end: the whole model and moments (J->m, J->T.opt, or gathered) */
    const moe_model *whole_m;
    adamw_state whole_opt;
    int whole_depth, whole_moments;
    float *onebit_rows;       /* actor.optim.name=onebit_adam: every trainer rank's error buffers, gathered for a
                                 checkpoint by job_ops.whole (trainer_onebit_gather); freed by job_whole_end */
    int onebit_n_rows;
    int n_shards;             /* data-parallel shards of a step over the trainer ranks (0: n_trainers) */
    int *shard_of;            /* [n_trainers] the shard trainer rank d trains (NULL: d) */
    double ls_mark;           /* lockstep / sync: when the rollout side last stopped generating (0: not yet);
                                 from then until it generates again it is idle (the trainer's turn) */
    /* rewards beside generation: the window's seconds of the reward pool(s) in backend->score and the
     * requests waiting (set by the transport before job_emit_version: embedded from J->R.pool, MPI
     * from the rollout ranks' acknowledgements), and the reward programs' extra numeric fields summed
     * over the window's responses (reward/<field>/mean) */
    double win_reward_s, reward_busy_snap;
    int reward_backlog;
    /* MPI: the rollout ranks' paged-KV counters summed (engine_stats' preemptions, kv_blocks_total,
     * kv_blocks_peak, prefix_hit_tokens, prefill_tokens), set with the reward figures; the embedded job
     * reads J->R.eng's */
    engine_stats rollout_kv;
    int has_rollout_kv;
    int n_rx, cap_rx;
    char **rx_keys;
    double *rx_sum;
    int64_t *rx_cnt;
    /* multi-turn (rollout.multi_turn.enable): the window's trained trajectories (their agent_traj
     * records, summed by job_add_reward_extras) and the embedded rollouter's tool figures */
    struct {
        int64_t n, turns, calls, errors, malformed, env_done;
        int turns_max;
    } mt;
    int reward_failed;        /* the rollout side stopped because the reward backend or the tool environment failed */
    reward_pool *val_pool;    /* job_reward_score's pool where the job has no rollouter (MPI trainer rank 0) */
};

/* The whole model on this process until job_whole_end (nests; moments: the AdamW moments too), then
 * J->whole_m and J->whole_opt hold it (job_ops.whole). */
int job_whole_begin(job *J, int moments);
/* Seconds on the step loop's clock (job_ops.clock, else moerl_now). */
double job_clock(job *J);
void job_whole_end(job *J);

/* The step loop shared by the embedded and the MPI job (src/rl/schedule.c), run on the process
 * that owns the queue (the embedded job, trainer rank 0): start validation (a new run) or the
 * resumed accuracy, trainer steps (take groups — dropping uniform-reward groups under
 * filter_groups —, split every mini-batch over the trainer ranks, update, log) with a weight sync
 * every trigger_parameter_sync_step steps, a stop on SIGINT/SIGTERM or on divergence, then the
 * final metrics, validation, checkpoint and plot. Fills res's common fields. The watchdog runs
 * beside it. Returns MOERL_OK (also for a signal stop: J->stop_signal says which) or MOERL_ERR. */
int job_schedule_run(job *J, rl_result *res);
/* The trainer's work before the first step, called by a transport BEFORE it lets the rollout side
 * generate (job_schedule_run calls it when the transport did not): the start validation (or the
 * resumed accuracy) and the measured sgemm peak (perf/mfu's denominator, on quiet cores). The run's
 * clock then starts with generation, so step 1's timing_s/gen and trainer/idle_ratio hold the wait
 * for the first batch. MOERL_OK or MOERL_ERR (nothing started to stop). */
int job_schedule_prepare(job *J, rl_result *res);
/* Checks and derived sizes shared by both jobs: required_samples, total steps and prompts (errors
 * name the keys). */
int job_plan(job *J, staleness_budget *b);
/* Rewrite plot.dat from metrics.jsonl (train reward and held-out accuracy per version) and draw it. */
void job_plot_from_metrics(const job *J);

/* Write <out_dir>/checkpoint atomically (checkpoint.tmp, then renames): model, optimizer, and
 * trainer_state.json with the feed position and the unconsumed started prompts = the feed's pending
 * redo list, then inflight[n_inflight] (started, not yet finished), then the queued groups. */
int job_save_checkpoint(job *J, const int64_t *inflight, int n_inflight);
/* Load <out_dir>/checkpoint (or checkpoint.old) if present: weights into J->m, optimizer into J->T,
 * version/step/consumed, feed position and redo list into *J->feed; truncates samples.jsonl to the
 * checkpoint's length. *resumed = 0 when there is nothing to resume. Errors: a foreign or
 * mismatching state file (message names it), unreadable tensors. */
int job_load_checkpoint(job *J, int *resumed);
/* Open metrics.jsonl / samples.jsonl / plot.dat under out_dir (appending when resumed). */
int job_open_outputs(job *J, int resumed);
void job_close_outputs(job *J);
/* Close the outputs, free the rollouter, trainer, the groups still queued and J (embedded and
 * simulated transports' teardown). */
void job_free(job *J);
/* One samples.jsonl line per group (trainer_version, uid, epoch, row, versions of its tokens). */
void job_log_samples(job *J, rl_group **g, int n);
/* Score reqs[0..n) through the job's reward backend (reward.*), synchronously: the validation's
 * scoring callback (rl/validate.h val_score_fn, ctx = J). The embedded job uses its rollouter's pool
 * (reward_pool_score: never at the same time as the pool's thread); trainer rank 0 of the MPI job a
 * pool of its own, made on first use. A failure latches the pool (the run stops) and sets
 * J->reward_failed, so the stop writes a checkpoint first. */
int job_reward_score(void *ctx, const reward_request *reqs, int n, reward_result *out);
/* Add the extra reward fields of the groups' responses to the window (reward/<field>/mean). */
void job_add_reward_extras(job *J, rl_group *const *g, int n);
/* Window accumulation of per-step statistics (first: overwrite). */
void job_add_stats(train_stats *a, const train_stats *b, int first);
/* Held-out validation of the whole model (rl/validate.h: rollout.val_kwargs.n responses for each of
 * the first val_n test rows): writes one metrics record at the current step (val/accuracy, the
 * param version, verl's val-core/... and val-aux/...), logs the val-core values per data_source when
 * N > 1; *acc = val/accuracy (the fraction of responses scoring ≥ 1; N = 1 greedy: as before). */
int job_run_validation(job *J, double *acc);
/* One console line and one metrics record for the window ending at this version. */
void job_emit_version(job *J, double rollouter_busy, double rollouter_idle);
/* After a sync: window metrics, then validation every test_freq versions. */
int job_after_sync(job *J, double sync_s, double rb, double ri);
/* Is a checkpoint due at new_version (trainer.save_freq)? */
int job_want_checkpoint(const job *J, int new_version);

#endif
