/* Supervised fine-tuning on prompt/response rows (in the rl layer, above parallel/: the SFT job
 * runs data parallel, FSDP or pipelined over trainer ranks): loss on response tokens only (token-mean over
 * the global batch), packed micro-batches, AdamW with clipping and an LR schedule, held-out greedy
 * accuracy before and after, one log line per step and metrics JSONL. Used by `moerl sft` and by
 * the warm start of `moerl rl`. With the aux loss on and the batch in several micro-batches (or
 * ranks), the aux loss is the whole batch's (its routing counts are taken first, forward only). */
#ifndef MOERL_RL_SFT_H
#define MOERL_RL_SFT_H

#include <stdint.h>

#include "data/dataset.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "rl/validate.h"

typedef struct {
    int batch_size;            /* sequences per optimizer step */
    int max_tokens;            /* tokens per micro-batch */
    int64_t total_epochs;
    int64_t total_steps;       /* > 0: stop after this many steps */
    adamw_config optim;
    const char *lr_scheduler;  /* "constant" | "cosine" */
    float warmup_ratio, min_lr_ratio;
    int test_freq;             /* periodic eval every n steps (0 = before/after only) */
    double stop_accuracy;      /* > 0: stop at the first periodic eval reaching this accuracy */
    const dataset *validation; /* the periodic evals' split (NULL: the held-out test split); keep it
                                  apart from the held-out split whose accuracy is reported, so the
                                  stop decision does not select on it */
    int val_n;                 /* held-out rows evaluated (≤ 0: all) */
    int no_held_out_eval;      /* 1: no held-out (test split) evaluation at all — the warm start of an RL
                                  run with trainer.val_n = 0; the accuracies are then NaN. Periodic
                                  evals on `validation` still run. */
    const char *no_held_out_why; /* why no_held_out_eval, for the closing line (NULL: "trainer.val_n=0") */
    int max_response_length;   /* eval generation budget */
    val_score_fn score;        /* the evals' reward (NULL: the rows' built-in rewards); the warm start of
                                  `moerl rl` passes its reward.* backend here */
    void *score_ctx;
    /* rollout.multi_turn.* (NULL or enable 0: one turn): the evals run each response as a trajectory with
     * tools (val_run's multi_turn), so that a tool-use task's accuracy is measured as RL measures it */
    const multi_turn_config *multi_turn;
    /* the evals' engine: its paged KV cache (engine_config's block_size, kv_cache_bytes,
     * gpu_memory_utilization, enable_prefix_caching; docs/engine.md) — the warm start of `moerl rl` passes
     * the rollout.* keys; zero (moerl sft): the reservation without sharing */
    int eval_block_size, eval_prefix_caching;
    int64_t eval_kv_cache_bytes;
    double eval_gpu_memory_utilization;
    uint64_t seed;             /* shuffling */
    const char *metrics_path;  /* NULL: no metrics file */
    unsigned metrics_loggers;  /* trainer.logger: METRICS_* sinks of metrics_path (base/log.h); 0 = file only */
    const char *label;         /* progress label */
    const char *steps_key;     /* the key that sets the step count, named in messages (NULL: "the step count") */
    /* Resumable runs: state_dir (NULL: none) receives a checkpoint — HF weights,
     * optimizer.safetensors, sft_state.json (step, optimizer counters, data fingerprint, seed, batch
     * size, accuracy before) — every save_freq steps (0: only at the end and on a stop signal),
     * written into state_dir.tmp and swapped in. With resume set and a state file present, training
     * continues from it (the shuffled order of every epoch is replayed from the seed, so the same
     * rows follow); a state made from other data, seed or batch size is refused. On SIGINT/SIGTERM
     * (base/signals.h) the loop stops after the current step, writes the checkpoint and returns
     * MOERL_OK with *stop_signal_out set to the signal. */
    const char *state_dir;
    int save_freq;
    int resume;
    int *stop_signal_out;
    /* Several processes (moerl sft under mpirun; NULL / 0 trainers: one process). dist: the runtime
     * with roles split so that every rank trains (dist_split_roles(ctx, world_size)); par: its
     * model-parallel state (par_state_init; NULL = replicated). Each step's global batch (the same
     * shuffled rows on every rank) is split round-robin over the data shards (par_data_shard);
     * each rank's gradient uses the global response-token count, so the sum over ranks (the
     * bucketed reducer, or FSDP's reduce-scatter) is the single-process gradient; with the aux
     * loss on, the global batch's routing counts are summed first (as for several micro-batches in
     * one process). Trainer rank 0 alone writes the metrics, the checkpoints and runs the evals
     * (under FSDP the other ranks take part in gathering the model onto it). All ranks call
     * sft_train together. */
    struct dist_ctx *dist;
    struct par_state *par;
    /* NULL or set on error: 1 on a rank whose failure another trainer rank reports (a refusal every
     * rank reached alike — the pipeline schedule check at the start and before each step —, said by
     * one rank only), so the caller prints nothing there; 0 otherwise */
    int *quiet_error_out;
    /* NULL or called once on trainer rank 0 when the run's checks have passed (the resume's too:
     * state, data, seed, batch size, weights), before the first write of the run (metrics, evals,
     * steps): moerl sft writes its config.yaml and generated data here, so a refused resume leaves
     * the folder as it was. An error from it ends sft_train with that error on every rank. */
    int (*on_checked)(void *arg);
    /* NULL or set to 1 when a resumed run had nothing left to do (its step count reached, or
     * sft.stop_at_accuracy ended it): the weights are the checkpoint's, unchanged; *acc_after is then
     * the accuracy recorded at its end (sft_state.json "accuracy_after"; NaN when none is recorded),
     * 0 otherwise */
    int *nothing_left_out;
    void *on_checked_arg;
    /* tests only (debug.test_no_pp_share_check): skip the pipeline's batch-share check at the start,
     * so that a test reaches the in-step agreement instead */
    int skip_pp_share_check;
} sft_opts;

/* Train m in place. acc_before/acc_after (may be NULL) receive held-out greedy accuracy.
 * Errors: rows without 'response', tokens beyond the vocabulary, no steps, I/O; with pipeline
 * parallelism, a batch size some pipeline cannot schedule (checked at the start for the worst case —
 * every sequence as long as the longest row —, and for each step's shares before the step, agreed
 * over every trainer rank). */
int sft_train(moe_model *m, const dataset *train, const dataset *test, const sft_opts *o, double *acc_before,
              double *acc_after);

#endif
