/* The checked set-up of `moerl rl`, one sequence for the embedded job (one process, rl_run) and the
 * job across processes (mpirun, rl_run_dist): ranks and roles → output folder checks → model →
 * layout → folder and generated data → held-out rows, validation split, update sizes, context →
 * resume checks → SFT warm start → the run's outputs written. Everything that can be checked without
 * writing comes first: a bad configuration, model or folder leaves no folder behind, and a failure
 * while setting up removes what it made (moerl_outdir_abandon). */
#ifndef MOERL_RL_JOB_PREPARE_H
#define MOERL_RL_JOB_PREPARE_H

#include "base/config.h"
#include "base/outdir.h"
#include "data/data_config.h"
#include "data/dataset.h"
#include "dist/dist.h"
#include "model/model.h"
#include "rl/rl.h"

/* How rl_job_prepare ended, and so how the caller reports it (the message: moerl_last_error()). */
typedef enum {
    RL_JOB_READY = 0, /* run it: rl_run (one process) or rl_run_dist (every rank) */
    RL_JOB_STOPPED,   /* a signal stopped the SFT warm start after its checkpoint (J->stop_signal; the
                         leader only; under mpirun the other ranks were told: rl_run_dist_cancel) */
    RL_JOB_REFUSED,   /* every rank reached the same verdict (configuration, layout, sizes, a resume the
                         leader refused and the ranks agreed on): said once (J->speaker; one process:
                         always), every rank returns; nothing left behind */
    RL_JOB_FAILED,    /* one process: the set-up failed (what it made is removed) */
    RL_JOB_FAILED_OWN,/* under mpirun, the leader's warm start failed: this rank says it ("moerl rl (WHO):
                         ..."); the other ranks were told (rl_run_dist_cancel) and exit 1 */
    RL_JOB_ABORT      /* under mpirun, this rank failed: end every rank (dist_abort, naming J->who) */
} rl_job_status;

typedef struct {
    const cfg *c;
    rl_config *rc;
    dist_ctx *ctx;
    int dist;                  /* world size > 1: the job across processes */
    int leader;                /* writes the folder: the one process, or trainer rank 0 */
    int speaker;               /* says a verdict every rank reached (RL_JOB_REFUSED) and the lines every rank
                                  logs alike (log_set_rank): world rank 0 until the roles are split, then
                                  the leader */
    char who[96];              /* "trainer T" / "rollout R" under mpirun (log prefix, messages) */
    moe_model m;
    dataset train, test, val;  /* val: the warm start's validation split (sft.validation_rows) */
    moerl_outdir od;
    int opened;                /* od was opened by this job */
    data_staged staged;
    int resuming;              /* RL resumes from the folder's checkpoint (no warm start) */
    double sft_before, sft_after; /* the warm start's held-out accuracies (NaN: not measured) */
    int stop_signal;           /* RL_JOB_STOPPED */
} rl_job;

/* The set-up above on this process (ctx: dist_init's, world size 1 = the embedded job; rc: read by
 * rl_read_config from c). Under mpirun every rank calls it: roles are split (trainer.n_ranks), each
 * rank builds the same model and data, the leader alone checks and writes the folder and runs the
 * warm start. Returns how it ended (rl_job_status); J is filled for the run. Free with rl_job_free. */
rl_job_status rl_job_prepare(rl_job *J, const cfg *c, rl_config *rc, dist_ctx *ctx);
/* After a failure of the run itself: remove staged files and the folder when it holds only set-up. */
void rl_job_abandon(rl_job *J);
/* Free the model and the data sets. */
void rl_job_free(rl_job *J);

#endif
