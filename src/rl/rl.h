/* The main job: fully-asynchronous GRPO (verl fully_async_policy / AReaL semantics).
 *
 *  dataset ──► Rollouter ──groups──► MessageQueue ──► Trainer
 *                 ▲ engine (continuous batching)        │ rewards → GRPO advantages → PPO loss
 *                 └──── ParameterSynchronizer ◄─────────┘ every trigger_parameter_sync_step steps
 *
 * Roles are plain structs with step functions (rollouter_tick, trainer_step, param_sync), driven
 * either by two threads (mode "async", the default; thread split configurable) or by one thread
 * in a fixed interleaving (mode "lockstep": bit-reproducible from the seed; mode "sync": the
 * synchronous baseline — generate a batch, then train on it — with the same code paths).
 * The roles talk only through the MessageQueue and the synchroniser's handshake, the interface a
 * later MPI transport implements.
 */
#ifndef MOERL_RL_H
#define MOERL_RL_H

#include <pthread.h>
#include <stdint.h>

#include "base/rng.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/forward.h"
#include "optim/adamw.h"
#include "rl/losses.h"
#include "rl/queue.h"
#include "rl/staleness.h"
#include "rollout/engine.h"

typedef enum { RL_MODE_ASYNC = 0, RL_MODE_LOCKSTEP, RL_MODE_SYNC } rl_mode;

typedef struct {
    /* rollout.* */
    int n;                     /* responses per prompt (GRPO group size) */
    float temperature, top_p;
    int top_k;
    int max_response_length;
    int max_num_seqs, max_num_batched_tokens;
    /* rollout.synthetic_length.*: a benchmark workload — each response's length is drawn from a
     * Pareto(alpha) tail above `min` tokens (capped at max_response_length) and EOS is ignored,
     * to reproduce the heavy-tailed response lengths of reasoning RL. alpha = 0: off. */
    double synth_alpha;
    int synth_min;
    /* actor.* */
    int ppo_mini_batch_size;   /* prompts per optimizer step */
    int ppo_epochs;
    ppo_config ppo;
    adamw_config optim;
    float entropy_coeff;
    int use_kl_loss;
    float kl_loss_coef;
    int ppo_max_token_len;     /* tokens per micro-batch */
    /* algorithm.* */
    int norm_adv_by_std;
    /* async_training.* */
    double staleness_threshold;
    int trigger_parameter_sync_step, require_batches, partial_rollout;
    rl_mode mode;
    int rollout_threads, trainer_threads;
    /* trainer.* */
    int64_t total_training_steps;
    int total_epochs;
    char out_dir[2048];
    int test_freq, save_freq, val_n;
    int resume_auto;
    uint64_t seed;
    double watchdog_s;
    int save_bf16;
} rl_config;

/* One prompt with its n responses: the unit that moves through the queue (never split). */
typedef struct rl_group {
    int64_t uid;          /* epoch · n_rows + row: unique per (epoch, prompt) */
    int row, epoch;
    int start_version;
    int n, n_done;
    tok_seq prompt;
    gen_request *reqs;    /* [n] */
} rl_group;
void rl_group_free(rl_group *g);

/* Which prompt comes next: per-epoch shuffled order (seeded), plus prompts to redo first
 * (unconsumed prompts restored by a resume). */
typedef struct {
    int64_t n_rows;
    int epoch;
    int64_t pos;          /* next index into order[] */
    int *order;
    uint64_t seed;
    int64_t *redo;        /* uids to start before anything new */
    int n_redo, redo_pos;
} prompt_feed;

typedef struct {
    const rl_config *cfg;
    const dataset *train;
    engine *eng;
    staleness_budget budget;
    rl_queue *queue;
    prompt_feed feed;
    int64_t prompts_left;     /* new prompts still to start (run length) */
    rl_group **inflight;      /* started, not complete */
    int n_inflight, cap_inflight;
    gen_request **done_buf;
    int draining;             /* partial rollout off: a sync waits for in-flight work */
    /* statistics (since the last version) */
    double busy_s, idle_s;
    int64_t gen_tokens;
    /* handshake with the trainer (async mode) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sync_requested, sync_done, stop;
    const float *sync_params;
    int sync_version;
    void (*on_paused)(void *ctx); /* called while paused, before the new weights load */
    void *on_paused_ctx;
    const char *stage;        /* for the watchdog */
    double last_progress;
    char error[512];
} rollouter;

/* Per-step training statistics (verl metric names in rl_job's output). */
typedef struct {
    double pg_loss, pg_clipfrac, ppo_kl, grad_norm, aux_loss, entropy, kl_loss;
    double reward_mean, reward_std, acc_mean, response_length_mean, response_length_max;
    int64_t n_samples, stale_samples, partial_samples, trained_tokens, resp_tokens;
    int max_lag, max_partial_span, min_version;
    double expert_load_max_over_mean; /* mean over MoE layers of max/mean tokens per expert */
    double update_s;
} train_stats;

typedef struct {
    const rl_config *cfg;
    const dataset *train;
    moe_model *m;
    moe_model *ref;           /* frozen reference for the KL loss, or NULL */
    adamw_state opt;
    model_acts acts;
    int version;              /* current parameter version (syncs so far) */
    int64_t step;             /* trainer steps done */
    const char *stage;
    double last_progress;
} trainer;

int rollouter_init(rollouter *R, const rl_config *cfg, const dataset *train, const moe_model *m, rl_queue *q,
                   int64_t total_prompts);
void rollouter_free(rollouter *R);
/* One unit of rollout work: admit new prompts within the staleness budget, then one engine
 * step; completed groups go to the queue. Returns 1 if it did work, 0 if idle, MOERL_ERR. */
int rollouter_tick(rollouter *R);
/* Apply a weight sync at a step boundary: interrupt (partial rollout) or expect a drained engine,
 * load the weights as `version`, re-base the staleness counter, resume interrupted first. */
int rollouter_apply_sync(rollouter *R, const float *params, size_t n_params, int version);
/* Groups in flight (started, not complete) and, among them, with an interrupted response. */
int rollouter_in_flight(const rollouter *R);

int trainer_init(trainer *T, const rl_config *cfg, const dataset *train, moe_model *m);
void trainer_free(trainer *T);
/* One trainer step over `n` groups (= required_samples): rewards, GRPO advantages, PPO
 * update(s) over require_batches mini-batches × ppo_epochs. */
int trainer_step(trainer *T, rl_group **groups, int n, train_stats *st);

/* Run the whole job (config already resolved; model initialised). Writes under cfg->out_dir:
 * metrics.jsonl, samples.jsonl, checkpoints, plot. Returns MOERL_OK or MOERL_ERR. */
typedef struct {
    double val_acc_start, val_acc_end;
    int64_t steps, prompts_trained, tokens_generated;
    double wall_s, prompts_per_s, tokens_per_s;
    int final_version;
    double trainer_idle_ratio, rollouter_idle_ratio;
    int max_lag_seen;
} rl_result;
int rl_run(const rl_config *cfg, moe_model *m, const dataset *train, const dataset *test, rl_result *res);

#endif
