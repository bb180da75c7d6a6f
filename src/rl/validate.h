/* moerl — held-out validation as verl reports it.
 *
 * Every held-out prompt (the first trainer.val_n rows of the test set) is answered N times
 * (rollout.val_kwargs.n) with the validation sampling parameters (rollout.val_kwargs.*), each
 * response is scored (a scoring callback: the job's reward pool, or the built-in rewards), and the
 * scores become verl's validation metrics (semantics of verl/trainer/ppo/metric_utils.py
 * process_validation_metrics and ray_trainer.py _validate, learnt from their source, not copied):
 *
 *   per prompt, for every numeric variable ("reward" = the score, plus every numeric extra field
 *   the reward returned for every response):
 *     mean@N                  the mean over the prompt's N responses
 *     std@N                   their population standard deviation (N > 1)
 *     best@k/mean, best@k/std, worst@k/mean, worst@k/std (N > 1): bootstrap of max / min over k
 *                             responses drawn with replacement, n_bootstrap = 1000 rounds, for
 *                             k = 2, 4, 8, ... below N and k = N
 *     maj@k/mean, maj@k/std   (when the data_source's reward extracts answers `pred`): the same
 *                             bootstrap of the majority vote — the most frequent pred of the k
 *                             drawn responses (ties: the one drawn first; a response without a
 *                             pred votes "no answer"), worth the value of its first drawn response
 *   then each metric is averaged over the prompts of a data_source, and named
 *     val-core/<data_source>/<var>/<metric>   var the core one ("acc" if the reward returned an
 *                                             "acc" field, else "reward"), metric mean@/maj@/best@
 *                                             at the largest k (both /mean and /std)
 *     val-aux/<data_source>/<var>/<metric>    every other one (std@N, worst@, smaller k, ...)
 *
 * The bootstrap draws its indices exactly as numpy's legacy np.random.choice(N, k) does after
 * np.random.seed(42) — MT19937 seeded with 42, reseeded before every (prompt, k) as verl reseeds
 * before every bootstrap_metric call — so the values equal verl's, not merely in expectation.
 *
 * Layer: rl (uses model, rollout, data, reward).
 */
#ifndef MOERL_RL_VALIDATE_H
#define MOERL_RL_VALIDATE_H

#include <stdint.h>

#include "base/config.h"
#include "data/dataset.h"
#include "model/model.h"
#include "reward/reward.h"
#include "rl/multi_turn.h"

/* rollout.val_kwargs.* (verl's keys and defaults). */
typedef struct {
    int n;             /* responses per held-out prompt (≥ 1) */
    float temperature; /* ≥ 0; > 0 when do_sample */
    float top_p;       /* (0, 1] */
    int top_k;         /* -1 or 0 = off, else the k most likely tokens */
    int do_sample;     /* 0: greedy (temperature, top_p, top_k unused; n must be 1) */
} val_kwargs;

/* Declare the rollout.val_kwargs.* keys (defaults: n 1, temperature 0, top_p 1, top_k -1,
 * do_sample false — verl's). */
void val_def_keys(cfg *c);
/* Read and check them into *k. Errors name the key, the value and what is accepted: n < 1, a
 * negative or non-finite temperature, top_p outside (0, 1], top_k < -1, do_sample with temperature
 * 0, n > 1 without do_sample (N identical greedy responses). */
int val_read_kwargs(const cfg *c, val_kwargs *k);
/* The checks of val_read_kwargs on values already read. */
int val_check_kwargs(const val_kwargs *k);

/* Score reqs[0..n) into out[0..n) (zero-initialised by the caller): the contract of
 * reward_backend.score (reward/reward.h). MOERL_OK or MOERL_ERR with a message. */
typedef int (*val_score_fn)(void *ctx, const reward_request *reqs, int n, reward_result *out);

/* ---- the statistics (pure functions, tests/test_validate.c) ---- */

/* Bootstrap rounds and seed of verl's bootstrap_metric as process_validation_metrics calls it. */
#define VAL_N_BOOTSTRAP 1000
#define VAL_BOOTSTRAP_SEED 42

/* The subset sizes verl bootstraps for a prompt with n responses (n ≥ 2): 2, 4, 8, ... while < n,
 * then n. Writes them to out (room for 32) and returns the count; 0 for n < 2. */
int val_subset_sizes(int n, int *out);

/* The MT19937 generator (Matsumoto & Nishimura 1998) as numpy's legacy RandomState uses it. */
typedef struct {
    uint32_t mt[624];
    int i;
} val_mt19937;
/* init_genrand(seed): np.random.seed(seed) for a seed in [0, 2^32). */
void val_mt_seed(val_mt19937 *g, uint32_t seed);
uint32_t val_mt_next(val_mt19937 *g);
/* A uniform index in [0, n) (n ≥ 1) as numpy's legacy randint draws it (and so choice(n) with
 * replacement): the 32-bit output masked to the next power of two minus one, redrawn while above
 * n - 1; n = 1 draws nothing and gives 0. */
uint32_t val_mt_below(val_mt19937 *g, uint32_t n);

/* The majority vote of verl's calc_maj_val over the k responses idx[0..k) (indices into
 * vals/preds): the pred drawn most often (ties: the one that first appears in idx; NULL preds are
 * one vote, "no answer"), worth the value of its first appearance. */
double val_majority(const double *vals, const char *const *preds, const int *idx, int k);

/* The bootstrap of one prompt's n values at subset size k: n_boot rounds of k indices drawn with
 * replacement (val_mt_below after val_mt_seed(seed)); mean and population std over the rounds of
 * the max (best), the min (worst) and, when preds is not NULL, the majority vote (maj; NULL entries
 * vote "no answer"). */
typedef struct {
    double best_mean, best_std, worst_mean, worst_std, maj_mean, maj_std;
} val_bootstrap_result;
void val_bootstrap(const double *vals, const char *const *preds, int n, int k, int n_boot, uint32_t seed,
                   val_bootstrap_result *out);

/* One scored response. */
typedef struct {
    const char *data_source;
    int64_t uid;              /* the prompt (responses of one prompt share it) */
    double score;
    const char *pred;         /* the extracted answer, or NULL */
    int n_extra;              /* numeric extra fields the reward returned */
    char *const *extra_keys;
    const double *extra_vals;
} val_sample;

/* Named metric values, in the order they were first produced. */
typedef struct {
    int n, cap;
    char **keys;
    double *vals;
} val_metrics;
void val_metrics_free(val_metrics *m);
/* The value of key, or NaN when absent. */
double val_metrics_get(const val_metrics *m, const char *key);

/* verl's validation metrics of samples[0..n) (grouped by data_source, then uid; every grouping in
 * order of first appearance) into *out (which must be zeroed): the names of the header. An extra
 * field becomes a variable only when every sample of its data_source has it (verl refuses lists of
 * unequal length); extra fields named "reward" or "pred" are skipped (the score and the vote are
 * those). maj@ when some sample of the data_source has a pred (verl: when the reward returns
 * "pred"); a sample without one then votes "no answer". Error: n = 0. */
int val_compute_metrics(const val_sample *samples, int n, val_metrics *out);

/* ---- a validation run ---- */

typedef struct {
    val_kwargs kw;
    int64_t n_rows;     /* the first n_rows rows of the data (≤ 0 or more than it has: every row) */
    int max_new_tokens; /* per response */
    int max_num_seqs;   /* the engine's sequences in flight */
    uint64_t seed;      /* the run seed: response j of row i samples with a seed from (seed, i, j) */
    /* rollout.multi_turn.*: with enable set, each response is a trajectory with tools, run by an agent
     * loop of its own (rl/agent_loop.h: its own environment programs), the environment's reward being
     * its score where it gives one; NULL or enable 0: one turn */
    const multi_turn_config *multi_turn;
    /* the engine's paged KV cache (engine_config's fields, docs/engine.md): rollout.block_size (0 = 16),
     * rollout.kv_cache_bytes (0 = gpu_memory_utilization's budget, or when that is 0 room for
     * max_num_seqs × the longest prompt + max_new_tokens: never preempts), rollout.gpu_memory_utilization,
     * rollout.enable_prefix_caching (the val_kwargs.n responses of a prompt prefill its full blocks once) */
    int block_size;
    int64_t kv_cache_bytes;
    double gpu_memory_utilization;
    int enable_prefix_caching;
} val_options;

typedef struct {
    double accuracy;     /* the fraction of correct responses: the reward's numeric "acc" field when it returns
                            one, else score ≥ 1 (N = 1 greedy with the built-in rules: today's val/accuracy) */
    double mean_len;     /* mean response length in tokens */
    /* multi-turn (val_options.multi_turn): assistant turns per trajectory, and the share of the tool calls
     * written that were well-formed (NaN without calls); 0 / NaN otherwise */
    double mean_turns, well_formed_rate;
    int64_t n_responses;
    /* the engine's paged KV cache over the run (engine_stats): sequences preempted, prompt positions served
     * from shared blocks, blocks in the pool and the most held at once */
    int64_t preemptions, prefix_hit_tokens, kv_blocks_total, kv_blocks_peak;
    val_metrics metrics; /* val-core/..., val-aux/... */
} val_report;
void val_report_free(val_report *r);

/* Generate o->kw.n responses for each of the first o->n_rows rows of ds with model m on an engine
 * of its own, score them all with score(ctx, ...) in one call (score NULL: the built-in rewards,
 * reward_score of data/rewards.h, with its pred) and fill *out. Errors: an empty dataset, a prompt
 * longer than the model's context, the engine's and the scorer's errors (the row's file:line). */
int val_run(const moe_model *m, const dataset *ds, const val_options *o, val_score_fn score, void *ctx,
            val_report *out);

#endif
