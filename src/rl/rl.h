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
 * The roles talk only through the MessageQueue and the synchroniser's handshake.
 *
 * Across processes (rl_run_dist, src/rl/job_dist.c, under mpirun with build/moerl-mpi): the LAST
 * trainer.n_ranks world ranks are data-parallel trainers, the others rollout ranks (dist_split_roles).
 * Trainer rank 0 owns the MessageQueue, the global staleness budget and the prompt feed (a server
 * thread grants prompt uids to rollout ranks and receives their finished groups, src/rl/wire.h),
 * runs the parameter sync (pause/drain → weight broadcast → resume) and splits every mini-batch
 * over the trainer ranks, which reduce gradients layer by layer while backward runs.
 */
#ifndef MOERL_RL_H
#define MOERL_RL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/config.h"
#include "base/rng.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "optim/adamw.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "reward/reward.h"
#include "rl/agent_loop.h"
#include "rl/losses.h"
#include "rl/multi_turn.h"
#include "rl/queue.h"
#include "rl/staleness.h"
#include "rl/validate.h"
#include "rollout/engine.h"

typedef enum { RL_MODE_ASYNC = 0, RL_MODE_LOCKSTEP, RL_MODE_SYNC } rl_mode;

/* *p += v on an atomic double (a compare-exchange loop: a plain `+=` on _Atomic double needs
 * libatomic's floating-point environment helpers). */
static inline void rl_atomic_add(_Atomic double *p, double v) {
    double old = atomic_load(p);
    while (!atomic_compare_exchange_weak(p, &old, old + v)) {}
}
/* algorithm.adv_estimator (verl names): grpo, rloo, reinforce_plus_plus_baseline */
typedef enum { RL_ADV_GRPO = 0, RL_ADV_RLOO, RL_ADV_REINFORCE_PP_BASELINE } rl_adv_estimator;

typedef struct {
    /* rollout.* */
    int n;                     /* responses per prompt (GRPO group size) */
    float temperature, top_p;
    int top_k;
    int max_response_length;
    int max_num_seqs, max_num_batched_tokens;
    /* rollout.block_size / kv_cache_bytes / gpu_memory_utilization / enable_prefix_caching: the engine's
     * paged KV cache (engine_config's fields of the same names; docs/engine.md) */
    int block_size, enable_prefix_caching;
    int64_t kv_cache_bytes;
    double gpu_memory_utilization;
    int bf16_weights;          /* rollout.dtype bf16: the engine computes from bf16 weights (engine.h) */
    int rollout_ep;            /* rollout.expert_parallel_size: the engine's experts over this many rollout ranks */
    int rollout_tp;            /* rollout.tensor_model_parallel_size: one engine replica over this many rollout ranks */
    int rollout_routing_replay; /* rollout.enable_rollout_routing_replay: the engine records every token's routes */
    int batch_invariant;       /* rollout.batch_invariant: engine and trainer compute bit-identical logprobs
                                  (moe_exec_opts.batch_invariant on both sides) */
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
    kl_type kl_loss_type;      /* actor.kl_loss_type (default low_var_kl = k3, verl's) */
    policy_loss_mode loss_mode; /* actor.policy_loss.loss_mode: vanilla | gspo */
    router_replay_mode router_replay; /* actor.router_replay.mode: disabled | R2 | R3 (losses.h) */
    /* algorithm.use_kl_in_reward: score − β·Σ_t kl_t with kl = algorithm.kl_penalty(π_old, π_ref) and
     * β from algorithm.kl_ctrl.* (losses.h kl_controller: its initial state; the trainer's evolves) */
    int use_kl_in_reward;
    kl_type kl_penalty;
    kl_controller kl_ctrl;
    int ppo_max_token_len;     /* tokens per micro-batch */
    loss_agg_mode loss_agg;    /* actor.loss_agg_mode */
    double loss_scale_factor;  /* actor.loss_scale_factor: H of seq-mean-token-sum-norm (0 = max_response_length) */
    int max_consecutive_skipped; /* trainer.max_consecutive_skipped_steps: stop after this many non-finite steps (0 = never) */
    /* algorithm.* */
    int norm_adv_by_std;
    rl_adv_estimator adv_estimator;
    /* algorithm.rollout_correction.*: recompute_old = !bypass_mode. 0 (bypass, the default) anchors
     * PPO on the behaviour logprobs; 1 recomputes π_old with the trainer's weights before the step,
     * and rollout_is (token | sequence) multiplies the loss by min(π_old/μ, rollout_is_threshold). */
    int recompute_old;
    rollout_is_level rollout_is;
    float rollout_is_threshold;
    /* algorithm.rollout_correction.rollout_rs / rollout_rs_threshold: rejection sampling (losses.h), n = 0 off;
     * needs recompute_old (the rejected tokens leave the loss mask before the advantages and weights) */
    rollout_rs_config rollout_rs;
    /* reward_model.overlong_buffer.* (DAPO shaping) and actor.overlong_filter (truncated responses masked out) */
    int overlong_enable, overlong_len;
    double overlong_penalty_factor;
    int overlong_filter;
    /* algorithm.filter_groups.* (DAPO dynamic sampling) */
    int filter_groups;
    int filter_max_num_gen_batches; /* 0 = unlimited: dropped groups per step before the step fails */
    /* async_training.*: the values in force (rl_config_set_mode: the sync mode's rule applied to
     * async_keys, the keys as the config gives them) */
    double staleness_threshold;
    int trigger_parameter_sync_step, require_batches, partial_rollout;
    rl_mode mode;
    struct {
        double staleness_threshold;
        int trigger_parameter_sync_step, partial_rollout;
    } async_keys;
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
    unsigned metrics_loggers; /* trainer.logger: METRICS_* flags (base/log.h); 0 (not read) = file only */
    /* across processes (rl_run_dist) */
    int n_trainer_ranks;       /* trainer.n_ranks: data-parallel trainer ranks (the last world ranks) */
    double sync_bucket_mb;     /* async_training.sync_bucket_mb: weight-broadcast bucket (MiB) */
    double grad_bucket_mb;     /* actor.grad_bucket_mb: gradient-reduction bucket (MiB, DDP's 25) */
    int grad_compression;      /* actor.grad_compression: grad_compression (dist/compress.h) */
    int grad_compression_warmup_steps, grad_compression_chunk;
    int optim_name;            /* actor.optim.name: optim_name (optim/onebit_adam.h), adamw or onebit_adam */
    int64_t optim_freeze_step; /* actor.optim.freeze_step: 1-bit Adam's exact-Adam warm-up (optimizer steps) */
    int64_t optim_var_update_interval; /* actor.optim.var_update_interval: exact step every n after the freeze (0 never) */
    par_config par;            /* actor.fsdp_config.fsdp_size, actor.expert_parallel_size, ... (parallel/grid.h) */
    int simulated;             /* moerl simulate: the rollouter's engine runs no model (engine_config.simulated) */
    /* debug.test_fail_rank / debug.test_fail_version (tests only): test_fail set = a deliberate error on
     * world rank test_fail_rank at startup (test_fail_version < 0) or once it reaches that version */
    int test_fail, test_fail_rank, test_fail_version;
    reward_config reward;      /* reward.*: where rewards come from (reward/reward.h) */
    val_kwargs val_kwargs;     /* rollout.val_kwargs.*: held-out validation sampling (rl/validate.h) */
    multi_turn_config multi_turn; /* rollout.multi_turn.*: trajectories with tools (rl/multi_turn.h) */
} rl_config;

/* Declare every key of `moerl rl` (src/rl/config.c): model.* (model_def_keys), data.* (data_def_keys),
 * the warm start's sft.* (sft_def_warm_start_keys), the layout (par_def_layout_keys), rollout.*,
 * actor.*, async_training.*, trainer.*, the algorithm's keys and debug.* (tests only). */
void rl_def_keys(cfg *c);
/* Declare trainer.allocator (malloc | pool | jemalloc, default malloc) and trainer.allocator_reserve (the
 * pool's reserve, default 0.3): part of rl_def_keys and of moerl sft's keys (sft_def_job_keys). */
void rl_def_allocator_keys(cfg *c);
/* Declare the paged KV cache's keys (part of rl_def_keys; moerl eval declares them too): rollout.block_size
 * (16 tokens), rollout.kv_cache_bytes (0), rollout.gpu_memory_utilization (0 = off),
 * rollout.enable_prefix_caching (true); docs/engine.md. */
void rollout_kv_def_keys(cfg *c);
/* Read and check them into r->block_size, kv_cache_bytes, gpu_memory_utilization, enable_prefix_caching
 * (nothing else of r is touched). Errors name the key and value: block_size outside [1, 65536], a negative
 * kv_cache_bytes, a utilization outside [0, 1], both budgets given. */
int rollout_kv_read(const cfg *c, rl_config *r);
/* Check them and select the process's buffer allocator (moerl_alloc_select, src/base/pool.h): call before
 * the job allocates any buffer, on every rank. A key given (in the file or as an override) wins over the
 * environment's MOERL_ALLOC / MOERL_POOL_RESERVE; a key left at its default lets the environment decide.
 * Errors name the key, its value and where it came from: an unknown allocator, a reserve outside [0, 1]
 * or given with an allocator other than the pool, an allocator already in use, a pool or jemalloc that
 * cannot be set up. */
int rl_select_allocator(const cfg *c);
/* Read and check them into r (the model.* and data.* keys are read by their modules): every value
 * against its range, the sync mode's rule (rl_config_set_mode) and the staleness budget's checks, the
 * layout keys (par_read_layout). Errors name the key, the value and what is accepted. */
int rl_read_config(const cfg *c, rl_config *r);
/* The keys that act only when a switch enables them (actor.kl_loss_type without actor.use_kl_loss,
 * algorithm.kl_ctrl.* without algorithm.use_kl_in_reward, actor.clip_ratio_c with GSPO, the rollout
 * correction's thresholds without their mode, ...; one table in src/rl/config.c): each one set in c to a
 * value other than its default while its switch in r (as rl_read_config read it) is off gets a warning
 * naming the key, its value and origin, and the switch (said once under mpirun: log_shared). Returns how many. */
int rl_warn_ignored_keys(const cfg *c, const rl_config *r);
/* Every check `moerl rl` makes on its keys before it starts the runtime, with its messages: rl_read_config
 * into r, then trainer.allocator / trainer.allocator_reserve (rl_select_allocator's checks, nothing
 * selected). moerl rl and moerl plan call it, so plan refuses what rl refuses, in rl's words. Errors:
 * as rl_read_config, or an unknown allocator / a reserve outside [0, 1], naming the key, value and origin. */
int rl_check_config_keys(const cfg *c, rl_config *r);
/* rollout.tensor_model_parallel_size (rc->rollout_tp) against n_rollout rollout ranks, the model mc and the
 * other rollout keys, as moerl rl checks it under mpirun (src/rl/job_prepare.c; moerl plan calls it with its
 * rollout.n_ranks' view): P must divide the rollout ranks and the model's heads, intermediate and expert widths
 * (kv heads: divide or be a multiple), and is not combined with rollout.expert_parallel_size > 1, multi-turn or
 * rollout.batch_invariant. Errors name the key, the value and the model field. */
int rl_check_rollout_tp(const rl_config *rc, const moe_config *mc, int n_rollout);
/* Why the run evaluates on the held-out split, written into buf ("trainer.val_n=N evaluates on them"), for
 * data_check_keys; NULL when it does not (trainer.val_n = 0). */
const char *rl_why_test(const rl_config *rc, char *buf, size_t cap);
/* The data-parallel shards the trainer ranks make (T / (pipeline × Ulysses × TP sizes), the grid's dp: each
 * trains its own share of a mini-batch), and a warning when there are more of them than a mini-batch's
 * actor.ppo_mini_batch_size GRPO groups, which go to the shards whole (rl_split_minibatch): the extra shards get
 * no data in any update. moerl rl runs such a layout (an empty shard adds nothing to the gradient), so moerl
 * rl and moerl plan warn alike, naming trainer.n_ranks, its value and the bound (the largest trainer.n_ranks
 * that feeds every shard). Returns the shard count. */
int rl_data_shards(const par_config *pc, int n_trainer_ranks);
void rl_warn_idle_shards(const par_config *pc, int n_trainer_ranks, int ppo_mini_batch_size);
/* The one place the sync mode's rule lives: r->mode = mode and the async_training.* values in force
 * from r->async_keys — in sync mode staleness 0, a weight sync every step and no partial rollout —
 * then the staleness budget's checks (rl_config_budget). moerl simulate's sweep runs each mode through
 * it. Errors: staleness_init's. */
int rl_config_set_mode(rl_config *r, rl_mode mode);
/* The staleness budget of r's values in force (staleness_init over the mini-batch, require_batches,
 * trigger_parameter_sync_step and staleness_threshold). Errors: staleness_init's. */
int rl_config_budget(const rl_config *r, staleness_budget *b);

/* One prompt with its n responses: the unit that moves through the queue (never split). */
typedef struct rl_group {
    int64_t uid;          /* epoch · n_rows + row: unique per (epoch, prompt) */
    int row, epoch;
    int start_version;
    int n, n_done;
    tok_seq prompt;
    gen_request *reqs;    /* [n] */
    /* [n] the reward program's answer per response (score before shaping, extra fields, pred), set
     * when the rollouter's reward pool has scored the whole group (NULL before). The trainer, the
     * DAPO filter and the samples log read these; nothing rescores. */
    reward_result *rewards;
    /* [n] what each trajectory did (rollout.multi_turn.enable: turns, tool calls, the environment's
     * reward); NULL for single-turn rollouts */
    agent_traj *traj;
    /* the shape of the responses' routing records (gen_request.out_routes; rollout.enable_rollout_routing_replay):
     * route_layers MoE layers × route_k experts per token, ids in [0, route_experts); all 0 when the
     * responses carry none (engine_route_width) */
    int route_layers, route_k, route_experts;
} rl_group;
void rl_group_free(rl_group *g);
/* The trainer's check of a finished group's routing records (rollout.enable_rollout_routing_replay) against
 * its model c: the route shape is c's (MoE layers in order, num_experts_per_tok, num_experts; all 0 when c
 * has no MoE layer) and every response has a route for every token the engine forwarded — n_routes =
 * prompt_len + n_out − 1 (the last sampled token is never forwarded). *tokens (optional) += Σ n_routes.
 * Errors name the uid, the response and the values: routes missing (the rollout side did not record),
 * another shape (another model), a count other than the forwarded tokens. */
int rl_group_check_routes(const rl_group *g, const moe_config *c, int64_t *tokens);
/* The reward requests of finished group g (a row of train): reqs[j] for response j with its decoded
 * text, the row's data_source, ground truth, extra_info, prompt messages (JSON) and "FILE:LINE".
 * The strings live in *store (free with rl_reward_store_free after the requests are used). */
typedef struct {
    char **texts;
    int n;
    char *prompt_json;
    char where[1100];
} rl_reward_store;
void rl_group_reward_requests(const rl_group *g, const dataset *train, reward_request *reqs, rl_reward_store *store);
void rl_reward_store_free(rl_reward_store *s);

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

/* A feed over n_rows prompts: epoch 0's order shuffled from seed (rng seeded with
 * seed·1000003 + epoch, Fisher–Yates), no redo list. */
void prompt_feed_init(prompt_feed *f, int64_t n_rows, uint64_t seed);
void prompt_feed_free(prompt_feed *f);
/* Next uid = epoch·n_rows + row: the redo list first, then the current epoch's order (a new epoch
 * reshuffles). */
int64_t prompt_feed_next(prompt_feed *f);
/* Position the feed at (epoch, pos) with that epoch's order (checkpoint restore). */
void prompt_feed_seek(prompt_feed *f, int epoch, int64_t pos);

typedef struct {
    const rl_config *cfg;
    const dataset *train;
    engine *eng;
    staleness_budget budget;
    rl_queue *queue;
    prompt_feed feed;
    int64_t prompts_left;     /* new prompts still to start (run length) */
    _Atomic int64_t dropped_pending; /* groups the trainer dropped (filter_groups), applied at the next tick */
    rl_group **inflight;      /* started, not complete */
    _Atomic int n_inflight;   /* (read by the watchdog) */
    int cap_inflight;
    gen_request **done_buf;
    /* the reward pool (reward.*: built-in rules, worker processes or a server): finished groups are
     * submitted to it and stay in `inflight` (they count for the staleness budget and are in-flight
     * uids in checkpoints) until their rewards are in; then they go to the queue / on_group_done */
    reward_pool *pool;
    int n_scoring;            /* groups of inflight submitted to the pool */
    /* rollout.multi_turn.enable: the tools and the agent loop running the trajectories (NULL: single turn) */
    tool_config tools;
    agent_loop *agent;
    int env_failed;           /* the environment failed (its message is in moerl_last_error / error) */
    /* 1 (rollouter_init's default): every engine step waits until the groups it finished are scored,
     * so that groups reach the queue at the step that finished them, as with rewards computed in
     * line: lockstep / sync modes stay bit-reproducible, moerl simulate and direct users see a fixed
     * order. 0: rewards beside generation (the async job's rollouter thread and MPI rollout ranks set
     * it): the engine never waits for the pool. */
    int wait_rewards;
    int mirror;               /* a rollout TP follower (job_dist.c): its groups are not scored (zero rewards, handed to
                                 on_group_done at once); the replica's first rank scores and sends them */
    _Atomic double reward_wait_s; /* seconds spent scoring in line (wait_rewards), read and reset by the job */
    int reward_failed;        /* an outside program failed — the pool's reward backend, or (env_failed too)
                                 the tool environment: the job checkpoints and stops (the message is in
                                 moerl_last_error / error) */
    int draining;             /* partial rollout off: a sync waits for in-flight work */
    /* statistics (since the last version) */
    /* busy: added by the rollouter thread outside mu; both read and reset by the trainer: atomic */
    _Atomic double busy_s, idle_s;
    int64_t gen_tokens;
    engine_stats eng_stats; /* the engine's counters after its last step: written by the rollouter under mu,
                               read by the trainer under mu (job_emit_version's rollout/ metrics) */
    /* handshake with the trainer (async mode) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sync_requested, sync_done, stop;
    const float *sync_params;
    int sync_version;
    void (*on_paused)(void *ctx); /* called while paused, before the new weights load */
    void *on_paused_ctx;
    /* completed groups go here instead of the queue when set (a rollout rank sends them to trainer
     * rank 0); the callback owns the group. Returns MOERL_OK or MOERL_ERR. */
    int (*on_group_done)(void *ctx, rl_group *g);
    void *on_group_done_ctx;
    /* read by the watchdog thread while the role runs: atomic (C11 loads/stores) */
    _Atomic(const char *) stage;
    _Atomic double last_progress;
    char error[2048];
} rollouter;

/* Per-step training statistics (verl metric names in rl_job's output). */
typedef struct {
    double pg_loss, pg_clipfrac, ppo_kl, grad_norm, aux_loss, entropy, kl_loss;
    /* algorithm.use_kl_in_reward: verl's actor/reward_kl_penalty (mean over responses of the per-token
     * mean KL) and actor/reward_kl_penalty_coeff (the β applied this step, before the update) */
    double reward_kl_penalty, reward_kl_penalty_coeff;
    double reward_mean, reward_std, acc_mean, response_length_mean, response_length_max;
    double loss_tokens_mean;  /* model-sampled tokens per response (multi-turn: without the inserted tool turns) */
    int64_t n_samples, stale_samples, partial_samples, trained_tokens, resp_tokens;
    int max_lag, max_partial_span, min_version;
    double expert_load_max_over_mean; /* mean over MoE layers of max/mean tokens per expert */
    /* Routing agreement (rollout.enable_rollout_routing_replay; docs/rl.md "Routing replay"), counted in the
     * step's first trainer forward over the batch, summed over the trainer ranks: routing_count (token, MoE
     * layer) pairs with a rollout route, routing_agree those whose routes in the forward equal it as sets,
     * routing_agree_native those whose native top-k does; routing_agreement_min the worst layer's share
     * (NaN when nothing was counted). */
    double routing_count, routing_agree, routing_agree_native, routing_agreement_min;
    double update_s;
    double reduce_exposed_s;  /* data parallel: time blocked in dist_reducer_finish (exposed comm.) */
    double behav_dropped_frac;/* decoupled: share of loss tokens filtered out by behav_imp_weight_cap */
    double rollout_is_mean, rollout_is_std, rollout_is_truncated_frac, rollout_is_ess; /* rollout IS weights */
    /* verl training/rollout_probs_diff_max/_mean/_std, training/rollout_actor_probs_pearson_corr (losses.h
     * probs_mismatch_*): steps with recomputed old logprobs and a loss token count in mismatch_steps */
    double probs_diff_max, probs_diff_mean, probs_diff_std, probs_pearson;
    int64_t mismatch_steps;
    double offpolicy_vals[OFFPOLICY_N_METRICS]; /* verl's rollout_corr/kl ... chi2_seq (offpolicy_metrics' order) */
    /* rollout_rs: verl's rollout_corr/rollout_rs_* values in rollout_rs_metrics' order; rs_steps = steps
     * with a loss token (the others' values are NaN and left out of a window's means) */
    double rs_vals[ROLLOUT_RS_MAX_METRICS];
    int64_t rs_steps;
    double response_clip_ratio; /* responses stopped at max_response_length (finish_reason length) */
    int64_t dropped_groups;   /* DAPO filter_groups: groups dropped before this step (all rewards equal) */
    double grad_bytes_sent, grad_bytes_raw; /* data parallel: gradient payload this rank sent / exact all-reduce's */
    double train_flops;       /* model FLOPs of the step's updates, all trainer ranks (base/perf.h) */
    int64_t empty_steps;      /* steps without a single loss token (actor.overlong_filter masked every
                                 response, or all were empty): their pg_loss, pg_clipfrac, ppo_kl,
                                 entropy are NaN and left out of a window's means (actor/empty_steps) */
    pp_window pp;             /* pipeline (actor.pipeline_parallel_size > 1): the 1F1B schedules of the step's
                                 updates (every mini-batch of every PPO epoch) on this rank's pipeline, their
                                 times gathered from all its stages; none otherwise */
} train_stats;

/* One mini-batch of a trainer step as one (data-parallel) trainer rank sees it. */
typedef struct {
    int n_groups;          /* this rank's groups of the mini-batch */
    int64_t resp_tokens;   /* response tokens of the WHOLE mini-batch (all ranks): token-mean weight */
    int64_t tokens;        /* prompt + response tokens of the whole mini-batch: aux-loss share */
} rl_minibatch;

typedef struct {
    const rl_config *cfg;
    const dataset *train;
    moe_model *m;
    moe_model *ref;           /* frozen reference for the KL loss / KL in the reward, or NULL */
    kl_controller kl_ctrl;    /* algorithm.use_kl_in_reward: β now (adaptive: updated every step; checkpointed) */
    adamw_state opt;
    model_acts acts;
    int version;              /* current parameter version (syncs so far) */
    int64_t step;             /* trainer steps done */
    _Atomic(const char *) stage; /* read by the watchdog thread: atomic */
    _Atomic double last_progress;
    /* data parallel (rl_run_dist); NULL in the embedded job */
    dist_ctx *dist;
    dist_grad_reducer *reducer;
    struct par_state *par;    /* the trainer rank's model-parallel runtime (parallel/parallel.h); NULL: none */
    struct par_state *ref_par;/* the reference's strategies on par's grid (trainer_shard_ref): the reference is
                                 sharded as the actor is; NULL: whole on the rank (one rank, plain DP) */
    /* actor.optim.name=onebit_adam (src/rl/trainer_onebit.h): the error buffers of the compressed exchange
     * (made at the first step after the freeze), its group (trainer ranks; NULL in one process), and the
     * rows a checkpoint brought (onebit_n_rows rows of n + chunk floats: all trainer ranks' on trainer
     * rank 0, this rank's own elsewhere) until the exchange takes them */
    struct onebit_exchange *onebit;
    struct dist_comm *onebit_comm;
    float *onebit_rows;
    int onebit_n_rows;
    int replication;          /* trainer ranks holding the same sequences (Ulysses SP: sp; else 1): what is
                                 computed from whole sequences is divided by it after the sum over ranks */
    /* rollout.batch_invariant with rollout.dtype=bf16 (docs/rl.md, "Bit-for-bit on-policy"): during
     * trainer_update the parameter storage the forward reads (par_param_store) holds the bf16-rounded
     * values and masters[n_masters] the fp32 master weights, restored around every optimizer step */
    float *masters;
    size_t n_masters;
    int rounded;              /* 1 while the storage holds the rounded values */
} trainer;

/* The RL algorithm's keys (src/rl/config.c): definitions with defaults and help, and their reading
 * into r (after the rollout.* and data.* fields are read: the checks use max_response_length,
 * top_k, top_p and ppo.decoupled). Errors name the key, the value and what is accepted; top-k /
 * top-p sampling is refused (the behaviour policy would not be the sampling distribution). */
void rl_def_algorithm_keys(cfg *c);
int rl_read_algorithm_keys(const cfg *c, rl_config *r);

/* The update's sizes against the training data (src/rl/sizes.c), before any work. The tokens of a
 * sequence are its chat-encoded prompt + response; rl_prompt_lengths gives the shortest and longest
 * prompt of the rows (0, 0 for none). rl_check_update_sizes refuses, naming the keys, the values and
 * what would work: actor.ppo_max_token_len_per_gpu below the longest prompt + data.max_response_length
 * (a sequence is never split); and, when `pipeline` is set and actor.pipeline_parallel_size > 1, a
 * configuration where some update a pipeline can get has no micro-batch count the schedule allows
 * (pp_count_allowed at that length: ≥ pp, interleaved a multiple of pp). The groups a pipeline gets
 * of a mini-batch: all of them with one data shard; else rl_shard_groups' bounds. */
void rl_prompt_lengths(const dataset *train, int *shortest, int *longest);
int rl_check_update_sizes(const rl_config *r, const dataset *train, int pipeline);
/* The job's step count from rows training prompts: trainer.total_training_steps, or trainer.total_epochs
 * × rows / the prompts a step needs (b: the staleness budget, rl_config_budget). Refused, naming the
 * keys: no step at all, or a step that needs more prompts than there are rows. total_steps may be NULL. */
int rl_check_step_rows(const rl_config *cfg, int64_t rows, staleness_budget *b, int64_t *total_steps);
/* The longest prompt of train + max_response_length against the model's context
 * (max_position_embeddings; ≤ 0 = unbounded): refused naming the data, both lengths and the ways out.
 * moerl rl (rollouter_init) and moerl simulate (against the simulated model) share it. *longest (may be
 * NULL) = the longest prompt's tokens (chat template applied), so a caller need not encode them again. */
int rl_check_context(const dataset *train, int max_response_length, int max_position_embeddings, int *longest);
/* The rule rl_check_context applies, on lengths alone (moerl plan has no data): prompt_tokens +
 * max_response_length against max_position_embeddings (≤ 0 = unbounded); prompt names the prompt in the
 * message ("the longest prompt of FILE", "data.max_prompt_length"). Errors name both lengths, the
 * context and the ways out. */
int rl_check_seq_len(const char *prompt, int64_t prompt_tokens, int64_t max_response_length,
                     int max_position_embeddings);
/* The pipeline's side of an update's sizes, shared by moerl rl (rl_check_update_sizes, from the data)
 * and moerl plan (plan_check, from the length keys). */
typedef struct {
    int groups;         /* GRPO groups (prompts) per optimizer update: actor.ppo_mini_batch_size */
    int group_size;     /* sequences per group: rollout.n; a group never splits across pipelines */
    int pipelines;      /* data-parallel pipelines the groups are split over (trainer.n_ranks / pp / sp) */
    int pp, vpp;        /* actor.pipeline_parallel_size, actor.virtual_pipeline_parallel_size (≤ 1: plain) */
    int min_seq_tokens; /* the fewest tokens a sequence can have (its prompt; a response may be short) */
    int seq_tokens;     /* the most tokens a sequence can have (prompt + data.max_response_length) */
    int max_tokens;     /* actor.ppo_max_token_len_per_gpu (≥ seq_tokens) */
    const char *seq_tokens_src; /* where seq_tokens comes from, for the message ("the longest prompt of …") */
} rl_pp_sizes;
/* Refuses (MOERL_ERR, naming the keys and values that would work) when some group count k a pipeline
 * can get — rl_shard_groups with group costs in [group_size·min_seq_tokens, group_size·seq_tokens] —
 * has k·group_size sequences of seq_tokens tokens the schedule cannot split into an allowed
 * micro-batch count (pp_count_allowed); MOERL_OK otherwise, and always with pp ≤ 1. */
int rl_check_pipeline_groups(const rl_pp_sizes *z);
/* Bounds [*k_lo, *k_hi] on the groups one of D shards gets when G groups, each costing between
 * cmin and cmax tokens, are dealt largest first onto the least-loaded shard (rl_split_minibatch).
 * When shard i took its last group (≤ cmax) it was the least loaded, so every shard ends with a load
 * ≥ (k_i − 1)·cmin; a shard with k groups has a load in [k·cmin, k·cmax], and of the other D − 1 one
 * has ≥ ⌈(G − k)/(D − 1)⌉ groups and one ≤ ⌊(G − k)/(D − 1)⌋: k is kept when
 * k·cmax ≥ (⌈(G − k)/(D − 1)⌉ − 1)·cmin and (k − 1)·cmin ≤ ⌊(G − k)/(D − 1)⌋·cmax, and
 * G − (D − 1)·k_hi ≤ k ≤ G − (D − 1)·k_lo. Every count the split makes for costs in [cmin, cmax]
 * lies in the range (tests/test_wire.c checks it against the split). D ≤ 1: exactly G. */
void rl_shard_groups(int G, int D, int64_t cmin, int64_t cmax, int *k_lo, int *k_hi);

/* The reward backend of cfg->reward (reward_backend_create; the built-in rules by default). NULL with
 * the backend's error when it cannot start. */
reward_backend *rl_reward_backend(const rl_config *cfg);
/* The rollout side of a job: its engine (from m's weights), the prompt feed over train, and the staleness
 * budget the job derived once (job_plan / rl_config_budget; copied: the rollouter keeps its own
 * counters), and its reward pool (rl_reward_backend(cfg) on its own thread). Scored groups go to q.
 * Errors: the context check (rl_check_context), engine creation, a reward backend that cannot start. */
int rollouter_init(rollouter *R, const rl_config *cfg, const staleness_budget *budget, const dataset *train,
                   const moe_model *m, rl_queue *q, int64_t total_prompts);
void rollouter_free(rollouter *R);
/* One unit of rollout work: admit new prompts within the staleness budget, then one engine
 * step; completed groups go to the queue. Returns 1 if it did work, 0 if idle, MOERL_ERR. */
int rollouter_tick(rollouter *R);
/* Start the group of prompt `uid` (= epoch·n_rows + row) now, under the engine's current version:
 * its n requests enter the engine; counts as a new prompt for the local budget. Errors: uid outside
 * the dataset, engine_add refusing a request. (Rollout ranks: uids granted by trainer rank 0.) */
int rollouter_start_uid(rollouter *R, int64_t uid);
/* One engine step without admitting anything; finished groups go to the reward pool, scored groups
 * to on_group_done (or the queue); multi-turn, the turns that ended go to the agent loop and answered
 * tool calls continue their trajectories. Never blocks on rewards or tools while the engine has work;
 * with an empty engine and trajectories waiting for tools or groups being scored it waits a few
 * milliseconds for them. Returns 1 if it did work or something is awaited, 0 if nothing is left,
 * MOERL_ERR (a backend failure sets R->reward_failed, an environment failure R->env_failed; the
 * message is theirs). */
int rollouter_step(rollouter *R);
/* Deliver the groups whose rewards are in (waiting up to wait_s for the first when some are being
 * scored). Returns the number delivered or MOERL_ERR (as rollouter_step). */
int rollouter_collect_rewards(rollouter *R, double wait_s);
/* Multi-turn: collect the tool answers that came in (waiting up to wait_s for the first when
 * trajectories wait): trajectories continue in the engine or end (a group whose n ended goes to
 * the reward pool). Returns the trajectories ended, 0 without multi-turn, or MOERL_ERR (the
 * environment failed: R->env_failed set, the message names the tool and the trajectory). */
int rollouter_poll_tools(rollouter *R, double wait_s);
/* Trajectories not finished: the engine's unfinished requests + those waiting for tool answers. */
int rollouter_unfinished(const rollouter *R);
/* Whole groups that may start now without queueing behind the engine's slots (rollouter_tick's
 * admission rule: an empty engine takes one group even when n > free slots). */
int rollouter_room(const rollouter *R);
/* Resume after new weights were loaded into the engine (partial rollout: interrupted requests go
 * first; ones already at their length limit finish). Completed groups are delivered. */
int rollouter_resume(rollouter *R);
/* Apply a weight sync at a step boundary: interrupt (partial rollout) or expect a drained engine,
 * load the weights as `version`, re-base the staleness counter, resume interrupted first. */
int rollouter_apply_sync(rollouter *R, const float *params, size_t n_params, int version);
/* Groups in flight: started, and not yet in the queue (generating, or waiting for rewards). */
int rollouter_in_flight(const rollouter *R);

int trainer_init(trainer *T, const rl_config *cfg, const dataset *train, moe_model *m);
void trainer_free(trainer *T);
/* actor.use_kl_loss under model parallelism: shard the reference (whole on every rank so far: trainer_init's
 * copy, or the state a follower received) as T->par shards the actor (par_state_init_like: FSDP unit
 * shards gathered layer by layer in its pass, a pipeline stage's range, the local experts; Ulysses as the
 * actor) — verl's reference worker is FSDP-sharded like the actor. Call after T->par is built, on every
 * trainer rank (collective over them in par_state_init's order). No reference, or T->par inactive (one
 * rank, plain data parallel): nothing to do, the whole model is the right layout there. */
int trainer_shard_ref(trainer *T);
/* Undo trainer_shard_ref: the whole reference back on every trainer rank (par_state_free; collective).
 * Call before par_state_free(T->par). No-op without a sharded reference. */
void trainer_unshard_ref(trainer *T);
/* The reference's logprobs of the sequences' response tokens (out[i][k], as compute_logprobs) at the
 * rollout temperature: a forward-only pass of T->ref in the actor's activation arena T->acts (the same
 * config and rows; nothing of it is live between the trainer's passes), through T->ref_par when sharded
 * (collective over its groups, as the actor's logprob pass), the FSDP units it gathered released after. */
int trainer_ref_logprobs(trainer *T, const train_seq *seqs, int n, float **out);
/* One trainer step over `n` groups (= required_samples): rewards, GRPO advantages, PPO
 * update(s) over require_batches mini-batches × ppo_epochs. = trainer_sample_stats + trainer_update
 * with each mini-batch (ppo_mini_batch_size consecutive groups) whole on this rank. */
int trainer_step(trainer *T, rl_group **groups, int n, train_stats *st);
/* Sample-level statistics of a step's groups (all of them, before any data-parallel split): rewards
 * (mean, std, accuracy), response lengths, staleness (lag = T->version − oldest token version),
 * partial-rollout counts, n_samples, resp_tokens. Errors: an unknown data_source (reward). */
int trainer_sample_stats(const trainer *T, rl_group **groups, int n, train_stats *st);
/* The PPO update on this rank's share of a step: groups[] holds mbs[0].n_groups groups of
 * mini-batch 0, then mini-batch 1's, ...; every response token is weighted 1/mbs[b].resp_tokens (the
 * GLOBAL count: token-mean over the whole mini-batch), the aux loss by tokens/mbs[b].tokens. With
 * T->reducer set (data parallel), every update reduces the gradients over the trainer ranks (the
 * last micro-batch's backward signals each finished layer to the reducer), sums the loss over the
 * ranks for AdamW's finiteness check and steps AdamW identically on every rank; loss statistics
 * (pg_loss, clipfrac, ppo_kl, entropy, kl_loss, aux_loss, trained_tokens) are summed over the ranks.
 * A rank with no groups in a mini-batch still takes part with zero gradients. Every trainer rank
 * must call it with the same n_mb (collective over the trainer group). Fills the loss fields of st
 * (sample fields untouched), st->reduce_exposed_s; T->step++. */
int trainer_update(trainer *T, rl_group **groups, const rl_minibatch *mbs, int n_mb, train_stats *st);
/* Forward-only passes over the whole step that trainer_update runs besides its ppo_epochs updates:
 * the recomputed old / proximal logprobs (actor.use_decoupled_loss, or rollout correction without
 * bypass: recompute_old) and the KL reference's logprobs (actor.use_kl_loss), 0 to 2. Each costs a
 * third of model_train_flops over the step's tokens (model/perf.h); perf/mfu and moerl simulate's
 * update time count them. */
int rl_fwd_only_passes(const rl_config *cfg);
/* Rewards of a group's n responses: the scores the reward pool stored in g->rewards (computed beside
 * generation, never here), plus DAPO's overlong penalty when reward_model.overlong_buffer.enable.
 * raw_scores[n] (may be NULL) gets the scores before shaping (accuracy counts score ≥ 1). Error: a
 * group without stored rewards (a bug: every group is scored before it is queued). */
int trainer_group_rewards(const trainer *T, const rl_group *g, float *rewards, float *raw_scores);
/* DAPO dynamic sampling: 1 when every response of the group got the same reward (no gradient). */
int rl_group_uniform_reward(const float *rewards, int n);
/* Prompt + response tokens of a group (its training cost) and its response tokens. */
int64_t rl_group_tokens(const rl_group *g);
int64_t rl_group_resp_tokens(const rl_group *g);
/* Data-parallel split of one mini-batch: groups (whole) largest first (by rl_group_tokens, ties by
 * index) onto the rank with the fewest tokens so far (ties to the lower rank). owner[i] ∈ [0, n_ranks).
 * Source: greedy longest-processing-time scheduling, as verl's seqlen-balanced partitioning. */
void rl_split_minibatch(rl_group *const *groups, int n, int n_ranks, int *owner);
/* A step's plan over n_ranks trainer ranks: every mini-batch (mini_batch consecutive groups) split
 * with rl_split_minibatch; rank d's groups go to part[d][0..n_part[d]) in mini-batch order and its
 * descriptors to mbs[d·n_mb + b] (n_groups of that rank, the whole mini-batch's token counts).
 * part[d] holds n pointers, mbs n_ranks·n_mb. Returns n_mb = ceil(n / mini_batch). */
int rl_plan_step(rl_group *const *groups, int n, int mini_batch, int n_ranks, rl_minibatch *mbs, rl_group ***part,
                 int *n_part);

/* Run the whole job (config already resolved; model initialised). Writes under cfg->out_dir:
 * metrics.jsonl, samples.jsonl, checkpoints, plot. Returns MOERL_OK or MOERL_ERR. */
typedef struct {
    double val_acc_start, val_acc_end;
    int64_t steps, prompts_trained, tokens_generated;
    double wall_s, prompts_per_s, tokens_per_s;
    int final_version;
    double trainer_idle_ratio, rollouter_idle_ratio;
    int max_lag_seen;
    /* rl_run_dist only (0 in the embedded job) */
    int rollout_ranks, trainer_ranks;
    int syncs;                    /* weight syncs done in this run */
    double param_sync_s;          /* mean wall time of a sync on trainer rank 0 (pause → resume) */
    double weight_bcast_s;        /* mean time of the weight broadcast itself */
    double weight_bcast_gbps;     /* payload GB/s of the broadcast (bytes / its mean time) */
    int64_t weight_bcast_bytes;   /* payload bytes per broadcast */
    double grad_reduce_exposed_s; /* Σ over steps of exposed gradient-reduction time (rank 0) */
    int stop_signal;              /* SIGINT/SIGTERM stopped the run (0: ran to the end) */
    int64_t checkpoint_step;      /* trainer step of the last checkpoint on disk (−1: none, trainer.save_freq=-1) */
} rl_result;
/* Stopping: with base/signals.h's handlers installed, the first SIGINT/SIGTERM makes rl_run /
 * rl_run_dist stop at the next step boundary, write a checkpoint (unless trainer.save_freq=-1) and
 * return with res->stop_signal set (the command then exits 128 + signal). */
int rl_run(const rl_config *cfg, moe_model *m, const dataset *train, const dataset *test, rl_result *res);

/* The job across processes (world size > 1, roles already split with cfg->n_trainer_ranks
 * trainers; every rank calls it with the same config, an identically built model and dataset; the
 * SFT warm start, if any, already ran on trainer rank 0 only). Trainer rank 0 resumes from
 * cfg->out_dir's checkpoint (resume_mode auto), sends its weights and optimizer state to the other
 * trainer ranks and broadcasts the weights to the rollout ranks, then runs the job as described in
 * the header; it alone writes the outputs (metrics.jsonl, samples.jsonl, checkpoints, plot) and
 * fills res (other ranks' res is zero). An error on any rank ends the whole job via dist_abort
 * (the message names the rank); so this returns only MOERL_OK, or MOERL_ERR for a bad configuration
 * detected identically on every rank before any communication. */
int rl_run_dist(const rl_config *cfg, dist_ctx *ctx, moe_model *m, const dataset *train, const dataset *test,
                rl_result *res);

/* Trainer rank 0, in place of rl_run_dist, when RL does not start (the SFT warm start was stopped by
 * a signal): sends BYE to every other rank, whose rl_run_dist then returns MOERL_OK with a zero res
 * (the rollout ranks before their first START, the other trainer ranks before the trainer state).
 * MOERL_ERR when called elsewhere or a send fails. */
int rl_run_dist_cancel(dist_ctx *ctx);

/* The optimizer keys (actor.optim.name, actor.optim.freeze_step) against actor.grad_compression and the
 * layout pc over n_trainer_ranks, exactly as moerl rl checks them (moerl plan and simulate refuse the same).
 * Errors name the keys and values. */
int rl_check_optim_keys(const cfg *c, int n_trainer_ranks, const par_config *pc);

#endif
