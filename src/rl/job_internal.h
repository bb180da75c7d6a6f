/* Internal to src/rl: the job state and the pieces shared by the embedded driver (job.c, rl_run)
 * and the multi-process driver (job_dist.c, rl_run_dist) — checkpoints with resume, samples log,
 * per-version metrics, validation, plot. Not a public API. */
#ifndef MOERL_RL_JOB_INTERNAL_H
#define MOERL_RL_JOB_INTERNAL_H

#include <stdio.h>

#include "base/log.h"
#include "rl/rl.h"

typedef struct {
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
    FILE *plotdata;
    double last_val;
    int failed;
    int watchdog_stop;
    /* rl_run_dist: extra metrics per version (emitted only when is_dist) */
    int is_dist;
    double win_bcast_s;       /* weight broadcast seconds in this window */
    int64_t bcast_bytes;      /* payload bytes of the last broadcast */
} job;

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
/* One samples.jsonl line per group (trainer_version, uid, epoch, row, versions of its tokens). */
void job_log_samples(job *J, rl_group **g, int n);
/* Window accumulation of per-step statistics (first: overwrite). */
void job_add_stats(train_stats *a, const train_stats *b, int first);
/* Greedy held-out accuracy of J->m on val_n rows. */
int job_run_validation(job *J, double *acc);
/* One console line and one metrics record for the window ending at this version. */
void job_emit_version(job *J, double rollouter_busy, double rollouter_idle);
/* After a sync: window metrics, then validation every test_freq versions. */
int job_after_sync(job *J, double sync_s, double rb, double ri);
/* Is a checkpoint due at new_version (trainer.save_freq)? */
int job_want_checkpoint(const job *J, int new_version);
/* gnuplot of reward and accuracy per version (skipped with a warning without gnuplot). */
void job_write_plot(const job *J);

#endif
