/* RL losses and advantages: GRPO group advantages, PPO clipped policy loss (with dual clip,
 * behaviour-anchored or decoupled), GSPO's sequence-ratio loss, loss aggregation, entropy, the KL
 * estimators (k1, abs, k2, k3 and their straight-through '+' forms) and the KL-in-reward controller.
 *
 * Each token-level function returns the loss contribution and its derivative with respect to
 * the current policy's logprob logp (and entropy), so the model's backward (model_backward's
 * dlogp/dentropy) needs nothing else. Everything is elementwise over tokens, fp32 in/out, with
 * double accumulation for sums.
 * Sources: GRPO — Shao et al. 2024 (DeepSeekMath) and verl core_algos.compute_grpo_outcome_advantage;
 * PPO clip and dual clip — Schulman et al. 2017, Ye et al. 2020, verl core_algos.compute_policy_loss;
 * decoupled PPO — AReaL (Fu et al. 2025); k3 KL — Schulman 2020 "Approximating KL divergence",
 * verl core_algos.kl_penalty("low_var_kl"); entropy — verl entropy_from_logits.
 */
#ifndef MOERL_LOSSES_H
#define MOERL_LOSSES_H

#include <stdint.h>

/* GRPO outcome advantages for n_groups groups of sizes group_size[g] (rewards laid out group
 * after group): A_i = (r_i − mean_G r) / (std_G r + eps), std unbiased (N−1); a group of one has
 * mean 0 and std 1 as in verl, so A = r/(1 + eps). eps = 1e-6. adv[Σ sizes]. */
void grpo_advantages(float *adv, const float *rewards, const int *group_size, int n_groups, float eps);

typedef struct {
    float clip_ratio_low;   /* ε_low, default 0.2 */
    float clip_ratio_high;  /* ε_high, default 0.2 (0.28 with DAPO-style clip-higher) */
    float clip_ratio_c;     /* dual-clip constant c (> 1), default 3.0; ≤ 1 disables dual clip */
    int decoupled;          /* 0: ratio π_θ/μ (behaviour-anchored); 1: AReaL decoupled */
    float behav_imp_weight_cap; /* decoupled: tokens with π_prox/μ > C are filtered out (AReaL), default 2.0 */
} ppo_config;

typedef struct {
    double loss_sum;      /* Σ over tokens of the per-token loss (before token-mean) */
    double clipfrac_sum;  /* tokens where the clipped branch was taken */
    double kl_sum;        /* Σ (old − logp) (verl ppo_kl, old = anchor) */
    double dual_clip_sum; /* tokens where the dual clip bound applied */
    double behav_dropped_sum; /* decoupled: tokens filtered out because π_prox/μ > C */
    int64_t n_tokens;
} ppo_stats;

/* Per-token PPO loss for n tokens with weights w[i] (the aggregation weight, loss_agg_weight; 0
 * for tokens outside the loss). Inputs: logp (current policy), old_logp (the anchor: behaviour
 * logprob μ, or the proximal/recomputed old logprob), behav_logp (μ; used only when decoupled),
 * adv, is_w (detached rollout importance weights, rollout_is_weights; NULL = 1).
 * Ratio r = exp(clamp(logp − old, −20, 20)); L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high));
 * for A < 0, L = min(L, −A·c) (dual clip); decoupled: b = exp(old − μ), L ← L·b when b ≤ C and
 * L ← 0 when b > C (AReaL ppo_actor_loss_fn: the token is filtered out, the denominator is
 * unchanged); then L ← L·is_w[i].
 * Writes dlogp[i] = w[i]·∂L/∂logp (OVERWRITTEN) and accumulates w-free statistics into st over
 * tokens with w[i] > 0. Returns Σ w[i]·L_i. */
double ppo_token_loss(float *dlogp, const float *logp, const float *old_logp, const float *behav_logp,
                      const float *adv, const float *is_w, const float *w, int n, const ppo_config *cfg,
                      ppo_stats *st);

/* Loss aggregation (verl actor.loss_agg_mode; verl core_algos.agg_loss, global-batch form). */
typedef enum {
    LOSS_AGG_TOKEN_MEAN = 0,          /* Σ_tokens L / T (T = loss tokens of the mini-batch) */
    LOSS_AGG_SEQ_MEAN_TOKEN_SUM,      /* Σ_seqs (Σ_t L) / S (S = sequences with ≥ 1 loss token) */
    LOSS_AGG_SEQ_MEAN_TOKEN_MEAN,     /* Σ_seqs (Σ_t L / len_s) / S */
    LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM, /* Σ_seqs (Σ_t L / H) / S, H = loss_scale_factor (Dr. GRPO) */
} loss_agg_mode;
/* Parse a verl mode name; −1 (MOERL_ERR) for an unknown one (message lists the accepted names). */
int loss_agg_mode_parse(const char *name, loss_agg_mode *out);
const char *loss_agg_mode_name(loss_agg_mode m);
/* The weight of each loss token of a sequence with seq_tokens loss tokens, in a mini-batch of
 * batch_tokens loss tokens over batch_seqs sequences with at least one (all data-parallel ranks
 * and micro-batches together), so that Σ weight·L over the mini-batch is the aggregated loss
 * whatever the split. scale = H for seq-mean-token-sum-norm. 0 for an empty sequence or batch. */
double loss_agg_weight(loss_agg_mode mode, int64_t seq_tokens, int64_t batch_tokens, int64_t batch_seqs,
                       double scale);

/* Rollout importance-sampling correction (verl algorithm.rollout_correction: rollout_is =
 * token | sequence, rollout_is_threshold; TIS = truncated importance sampling). For one
 * sequence's n response tokens with recomputed old logprobs (π_old) and behaviour logprobs (μ):
 * token:    w_t = min(exp(clamp(old_t − μ_t, ±20)), threshold)
 * sequence: w_t = min(exp(clamp(Σ_t (old_t − μ_t), ±20)), threshold) for every token.
 * Detached weights (no gradient); statistics of the truncated weights accumulate into st (may be NULL). */
typedef enum { ROLLOUT_IS_NONE = 0, ROLLOUT_IS_TOKEN, ROLLOUT_IS_SEQUENCE } rollout_is_level;
typedef struct {
    double w_sum, w_sq_sum;  /* Σ w, Σ w² over tokens (after truncation) */
    double truncated;        /* tokens whose weight was truncated at the threshold */
    int64_t n_tokens;
} rollout_is_stats;
void rollout_is_weights(float *w, const float *old_logp, const float *behav_logp, int n, rollout_is_level level,
                        float threshold, rollout_is_stats *st);
/* The same over a response with a loss mask (train_seq.resp_mask; NULL = every token): the sequence
 * level sums the log ratios of the mask-1 tokens only, mask-0 tokens (inserted between turns: no
 * behaviour logprob) get w = 0 and stay out of st. rollout_is_weights is this with mask NULL. */
void rollout_is_weights_masked(float *w, const float *old_logp, const float *behav_logp, const unsigned char *mask,
                               int n, rollout_is_level level, float threshold, rollout_is_stats *st);

/* ------------------------------------------------------------------ rollout rejection sampling
 * verl algorithm.rollout_correction.rollout_rs / rollout_rs_threshold (rollout_corr_helper's
 * compute_rollout_rejection_mask and compute_rs_metrics; the field's "Geo-RS" is seq_mean_k1, "Seq-MIS"
 * seq_sum_k1, IcePop's token masking token_k1). With the log ratio lr = clamp(old − μ, ±20) of each
 * loss token (old = the trainer's recomputed logprob, μ = the behaviour's):
 *   k1 = −lr, k2 = lr²/2, k3 = e^lr − 1 − lr;
 * token_kK rejects a token by its own value, seq_sum_kK / seq_mean_kK / seq_max_kK (max: k2, k3) a whole
 * sequence by the sum / mean (sum / (tokens + 1e-8)) / max of its tokens' values. k1 keeps
 * log(lower) ≤ value ≤ log(upper); k2/k3 keep value ≤ upper. Several options (comma separated) must
 * all pass. A rejected token leaves the loss as if its response mask were 0. */
#define ROLLOUT_RS_MAX_OPTIONS 11
typedef enum { RS_AGG_TOKEN = 0, RS_AGG_SEQ_SUM, RS_AGG_SEQ_MEAN, RS_AGG_SEQ_MAX } rollout_rs_agg;
typedef struct {
    char name[16];        /* verl's option name, e.g. "seq_mean_k1" */
    rollout_rs_agg agg;
    int k;                /* estimator 1, 2 or 3 */
    double lower, upper;  /* bounds on the statistic: k1 log(lower), log(upper); k2/k3 upper (lower 0) */
} rollout_rs_option;
typedef struct {
    int n;                /* 0: rejection sampling off */
    rollout_rs_option opt[ROLLOUT_RS_MAX_OPTIONS];
} rollout_rs_config;
/* Parse rollout_rs (null | none | "" = off, else comma-separated options, repeats dropped) and
 * rollout_rs_threshold (one entry for every option or one per option, comma separated; a k1 entry is
 * "lower_upper" or a single upper bound whose reciprocal is the lower one; k2/k3 entries are one upper
 * bound; every bound a finite number > 0, and lower ≤ upper). "null" thresholds only with rs off.
 * MOERL_ERR with a message naming the key and the value otherwise. */
int rollout_rs_parse(const char *options, const char *threshold, rollout_rs_config *out);

/* The statistics behind verl's rollout_corr/rollout_rs_* metrics, as sums (summed over trainer
 * ranks) and maxima (maxed over ranks; minima stored negated). sum[] starts with RS_HEAD entries:
 * valid tokens, sequences with a valid token, sequences, tokens rejected by any option, sequences
 * with a rejected token; then RS_N_SUM entries per option, max[] RS_N_MAX per option. */
enum { RS_HEAD_TOK = 0, RS_HEAD_SEQ_VALID, RS_HEAD_SEQ, RS_HEAD_MASKED_TOK, RS_HEAD_MASKED_SEQ, RS_HEAD };
enum { RS_S_STAT = 0, RS_S_HIGH, RS_S_LOW, RS_S_CLAMP, RS_S_CLAMP_SQ, RS_S_SEQ, RS_S_SEQ_SQ, RS_S_SEQ_HIGH,
       RS_S_SEQ_LOW, RS_S_MASKED_TOK, RS_S_MASKED_SEQ, RS_N_SUM };
enum { RS_M_TOK_MAX = 0, RS_M_TOK_NEG_MIN, RS_M_SEQ_MAX, RS_M_SEQ_NEG_MIN, RS_M_SEQ_ABS, RS_N_MAX };
#define RS_N_SUMS (RS_HEAD + ROLLOUT_RS_MAX_OPTIONS * RS_N_SUM)
#define RS_N_MAXS (ROLLOUT_RS_MAX_OPTIONS * RS_N_MAX)
typedef struct {
    double sum[RS_N_SUMS];
    double max[RS_N_MAXS];
} rollout_rs_stats;
/* Zero sums, −∞ maxima. */
void rollout_rs_stats_init(rollout_rs_stats *st);
/* One sequence's n response tokens: old/behav logprobs, mask (train_seq.resp_mask; NULL = every
 * token; mask-0 tokens are neither counted nor rejected). Writes keep[t] = 1 for a loss token every
 * option keeps, 0 otherwise (the sequence's new response mask), accumulates into st (may be NULL).
 * Returns the loss tokens rejected. n = 0 (an empty response) counts as a sequence and nothing else. */
int rollout_rs_sequence(const rollout_rs_config *c, const float *old_logp, const float *behav_logp,
                        const unsigned char *mask, int n, unsigned char *keep, rollout_rs_stats *st);
/* verl's metric names (without the "rollout_corr/" prefix) and values from reduced statistics, in one
 * order: per option _mean, _max, _min, _std, _fraction_high, _fraction_low, _seq_mean, _seq_std,
 * _seq_max, _seq_min, _seq_max_deviation, _seq_fraction_high, (k1 only) _seq_fraction_low,
 * _masked_fraction, _seq_masked_fraction; then rollout_rs_masked_fraction and
 * rollout_rs_seq_masked_fraction. names (ROLLOUT_RS_NAME_LEN each) and vals may be NULL. No valid token
 * at all gives NaN values (verl raises). Returns the metric count (≤ ROLLOUT_RS_MAX_METRICS). */
#define ROLLOUT_RS_MAX_METRICS (ROLLOUT_RS_MAX_OPTIONS * 15 + 2)
#define ROLLOUT_RS_NAME_LEN 64
int rollout_rs_metrics(const rollout_rs_config *c, const rollout_rs_stats *st, char (*names)[ROLLOUT_RS_NAME_LEN],
                       double *vals);

/* ------------------------------------------------------------------ training/rollout mismatch
 * verl utils/debug/metrics.calculate_debug_metrics on the loss tokens: p = exp(logp) under the
 * trainer's weights (x, the recomputed old logprobs) and the behaviour policy's (y):
 * training/rollout_probs_diff_max / _mean / _std (|x − y|; std unbiased, torch.std) and
 * training/rollout_actor_probs_pearson_corr (torch.corrcoef of x and y). Kept as sums so trainer
 * ranks add them before the ratios; dmax is maxed over ranks. */
typedef struct {
    double n, sx, sy, sxx, syy, sxy, sd, sdd; /* summed over ranks */
    double dmax;                              /* maxed over ranks; −∞ when empty */
} probs_mismatch_stats;
void probs_mismatch_init(probs_mismatch_stats *st);
/* Adds the tokens of one response (mask NULL = all) to st. */
void probs_mismatch_add(probs_mismatch_stats *st, const float *train_logp, const float *rollout_logp,
                        const unsigned char *mask, int n);
/* The four metrics; NaN where undefined (no token; std and the correlation need 2 tokens and, for
 * the correlation, non-zero variance of both, as torch gives NaN there). */
void probs_mismatch_finish(const probs_mismatch_stats *st, double *diff_max, double *diff_mean, double *diff_std,
                           double *pearson);

/* verl rollout_corr_helper.compute_offpolicy_metrics (rollout_corr/ + name), over the loss tokens of
 * the sequences given, lr = old − μ per token, m_old / m_μ a sequence's masked means (Σ/(n + 1e-8)):
 * kl = token mean of (μ − old); k3_kl = token mean of e^lr − lr − 1 (unclamped);
 * training_ppl / rollout_ppl = sequence mean of exp(−m_old) / exp(−m_μ), training_log_ppl /
 * rollout_log_ppl of −m_old / −m_μ; with d = m_μ − m_old per sequence: log_ppl_diff (mean d),
 * log_ppl_abs_diff (mean |d|), log_ppl_diff_max / _min, ppl_ratio (mean e^d); chi2_token = token mean
 * of exp(clamp(lr, ±20))² − 1; chi2_seq = sequence mean of exp(2·clamp(Σ lr, ±20)) − 1. Sums (over
 * ranks) in sum[], max d and −min d in max[]. */
enum { OFFP_TOK = 0, OFFP_SEQ, OFFP_KL, OFFP_K3, OFFP_RHO2, OFFP_TPPL, OFFP_TLOG, OFFP_RPPL, OFFP_RLOG, OFFP_D,
       OFFP_ABS_D, OFFP_EXP_D, OFFP_CHI2_SEQ, OFFP_N_SUM };
#define OFFPOLICY_N_METRICS 13
typedef struct {
    double sum[OFFP_N_SUM];
    double max[2]; /* max d, −min d; −∞ when empty */
} offpolicy_stats;
void offpolicy_init(offpolicy_stats *st);
/* Adds one response (mask NULL = every token; a response without a loss token adds nothing). */
void offpolicy_add(offpolicy_stats *st, const float *old_logp, const float *behav_logp, const unsigned char *mask,
                   int n);
/* The 13 metrics in the order above (kl, k3_kl, training_ppl, training_log_ppl, rollout_ppl,
 * rollout_log_ppl, log_ppl_diff, log_ppl_abs_diff, log_ppl_diff_max, log_ppl_diff_min, ppl_ratio,
 * chi2_token, chi2_seq); names (may be NULL) without the prefix. NaN without a token. */
void offpolicy_metrics(const offpolicy_stats *st, const char **names, double *vals);

/* Advantage estimators (verl algorithm.adv_estimator), outcome rewards, one value per response.
 * rewards/adv laid out group after group with sizes group_size[g].
 * RLOO (verl compute_rloo_outcome_advantage; Ahmadian et al. 2024): A_i = r_i − mean of the
 *   other responses of the group = (r_i − mean_G)·n/(n−1); a group of one keeps A = r.
 * GRPO without std (algorithm.norm_adv_by_std_in_grpo=false, Dr. GRPO, Liu et al. 2025):
 *   A_i = r_i − mean_G (a group of one: mean 0, A = r). */
void rloo_advantages(float *adv, const float *rewards, const int *group_size, int n_groups);
void grpo_advantages_no_std(float *adv, const float *rewards, const int *group_size, int n_groups);
/* REINFORCE++ with baseline (verl compute_reinforce_plus_plus_baseline_outcome_advantage; Hu 2025):
 * s_i = r_i − mean_G (group of one: mean 0), then whitened over the response tokens of the whole
 * batch: A_i = (s_i − μ)/sqrt(σ² + 1e-8), μ and σ² the token-weighted mean and unbiased variance
 * (verl masked_whiten). Split in two so data-parallel ranks can sum the moments first:
 * reinforce_pp_moments adds Σ len·s, Σ len·s², Σ len into mom[3]; reinforce_pp_whiten applies them.
 * resp_len[i] = loss tokens of response i (its response tokens; multi-turn: the model-sampled ones,
 * inserted tool-turn tokens do not count, as verl's masked_whiten over the response mask). */
void reinforce_pp_baseline(float *adv, const float *rewards, const int *group_size, int n_groups);
void reinforce_pp_moments(const float *s, const int *resp_len, int n, double mom[3]);
void reinforce_pp_whiten(float *adv, int n, const double mom[3]);

/* DAPO overlong reward shaping (verl reward_model.overlong_buffer; Yu et al. 2025): with
 * expected = max_response_length − buffer_len, a response of L tokens gets
 * min(0, −(L − expected)/buffer_len · penalty_factor) added to its reward. */
double overlong_penalty(int resp_len, int max_response_length, int buffer_len, double penalty_factor);

/* k3 KL to a reference (kl_token_loss with k3; kept for its callers): δ = ref − logp, kl = exp(δ) − δ − 1 (≥ 0), clamped as verl to [−10, 10].
 * Adds coef·w[i]·∂kl/∂logp into dlogp[i] (ACCUMULATES); returns Σ w[i]·kl_i. */
double kl_k3_token_loss(float *dlogp, const float *logp, const float *ref_logp, const float *w, int n, float coef);

/* ------------------------------------------------------------------ GSPO (actor.policy_loss.loss_mode=gspo)
 * Zheng et al. 2025 (arXiv 2507.18071), verl core_algos.compute_policy_loss_gspo. For sequence i with
 * loss tokens T_i: log s_i = (1/|T_i|) Σ_{t∈T_i} (logp_t − old_t) (unclamped); per token the detached
 * value is sg[log s_i] + logp_t − sg[logp_t], clamped above at 10 (verl), so
 *   s_i,t = exp(min(log s_i, 10)), ∂s_i,t/∂logp_t = s_i,t when log s_i ≤ 10, else 0;
 *   L = max(−A·s_i,t, −A·clip(s_i,t, 1−ε_low, 1+ε_high)) (no dual clip, no decoupled weight: verl has
 *   neither for GSPO), then L ← L·is_w[t] (rollout IS weights, detached; NULL = 1).
 * gspo_seq_log_ratio: for n tokens with sequence ids seq[t] ∈ [0, n_seq) and weights w[t] (tokens with
 * w[t] ≤ 0 are outside the loss and left out of the mean), writes out[t] = log s_{seq[t]} for every
 * token (0 for a sequence without a loss token). Needs every loss token of each sequence: the
 * trainer's micro-batches hold whole sequences (train.c pack_microbatches), and gspo is refused with
 * Ulysses SP (a sequence split over ranks). sum/cnt are scratch of n_seq entries.
 * gspo_token_loss: as ppo_token_loss (dlogp OVERWRITTEN with w[t]·∂L/∂logp_t; returns Σ w·L; st
 * gets loss, clipfrac — tokens where the clipped branch is strictly larger —, ppo_kl = Σ (old − logp)
 * unclamped as verl, token count; dual_clip_sum and behav_dropped_sum stay 0). cfg's clip_ratio_c,
 * decoupled and behav_imp_weight_cap are not used (the config refuses gspo with the decoupled loss). */
void gspo_seq_log_ratio(float *out, const float *logp, const float *old_logp, const int *seq, const float *w, int n,
                        int n_seq, double *sum, int *cnt);
double gspo_token_loss(float *dlogp, const float *logp, const float *old_logp, const float *seq_log_ratio,
                       const float *adv, const float *is_w, const float *w, int n, const ppo_config *cfg,
                       ppo_stats *st);

/* Policy loss modes (verl actor.policy_loss.loss_mode). */
typedef enum { POLICY_LOSS_VANILLA = 0, POLICY_LOSS_GSPO } policy_loss_mode;
/* actor.router_replay.mode (verl's): DISABLED; R2 = the old-logprob (proximal) pass records its routes and the
 * update replays them; R3 = the rollout engine's routes (rollout.enable_rollout_routing_replay) are replayed by
 * every trainer forward of the sample. */
typedef enum { ROUTER_REPLAY_DISABLED = 0, ROUTER_REPLAY_R2, ROUTER_REPLAY_R3 } router_replay_mode;
/* Parse "vanilla" | "gspo"; MOERL_ERR (message names actor.policy_loss.loss_mode) otherwise. */
int policy_loss_mode_parse(const char *name, policy_loss_mode *out);

/* ------------------------------------------------------------------ KL estimators
 * verl core_algos.kl_penalty / kl_penalty_forward (Schulman 2020, "Approximating KL divergence"),
 * d = logp − ref:
 *   k1 ("kl"):          kl = d                                     ∂/∂logp = 1
 *   abs:                kl = |d|                                   ∂ = sign(d) (0 at d = 0, torch)
 *   k2 ("mse"):         kl = d²/2                                  ∂ = d
 *   k3 ("low_var_kl"):  δ = clamp(−d, ±20), kl = clamp(e^δ − δ − 1, ±10)   ∂ = 1 − e^δ inside both clamps, else 0
 *   "<name>+" (k1+, kl+, abs+, k3+, low_var_kl+): straight-through — the value of <name>, the gradient of
 *   k2 (d, never clamped): k2's gradient is the unbiased one (verl's docstring). k2+ / mse+ are k2.
 * (verl's kl_penalty passes the name with its '+' on to kl_penalty_forward, which raises for it: the
 * documented intent — value of the base estimator, gradient of k2 — is what is implemented here.)
 * "full" (the whole-vocabulary KL) is not offered. */
typedef enum { KL_K1 = 0, KL_ABS, KL_K2, KL_K3 } kl_estimator;
typedef struct {
    kl_estimator est;
    int straight_through; /* the '+' variants: value of est, gradient of k2 */
} kl_type;
/* Parse one of kl, k1, abs, mse, k2, low_var_kl, k3, each with an optional '+'. key names the config
 * key in the error (actor.kl_loss_type or algorithm.kl_penalty). */
int kl_type_parse(const char *key, const char *name, kl_type *out);
/* The estimator's value at one token and its derivative with respect to logp (*grad). */
double kl_value(kl_type t, float logp, float ref_logp, double *grad);
/* Σ w[i]·kl_i over tokens with w[i] > 0; adds coef·w[i]·∂kl_i/∂logp into dlogp[i] (ACCUMULATES). */
double kl_token_loss(float *dlogp, const float *logp, const float *ref_logp, const float *w, int n, float coef,
                     kl_type t);

/* ------------------------------------------------------------------ KL in the reward (algorithm.use_kl_in_reward)
 * verl ray_trainer.apply_kl_penalty with core_algos' Fixed/AdaptiveKLController (Ziegler et al. 2019,
 * arXiv 1909.08593): per response, kl_t = kl_value(algorithm.kl_penalty, old_t, ref_t) over its loss
 * tokens, token rewards r_t − β·kl_t; GRPO-family estimators sum the token rewards into the outcome
 * score (verl compute_grpo_outcome_advantage: scores = token_level_rewards.sum(-1)), so the score
 * becomes r − β·Σ_t kl_t. current_kl = mean over responses of (mean over its loss tokens of kl_t).
 * Adaptive update after each step: e = clip(current_kl/target_kl − 1, −0.2, 0.2),
 * β ← β·(1 + e·n_steps/horizon), n_steps = the step's responses (verl: batch_size). Fixed: β constant. */
typedef struct {
    int adaptive;     /* algorithm.kl_ctrl.type: 0 fixed, 1 adaptive */
    double value;     /* β, starts at algorithm.kl_ctrl.kl_coef */
    double target;    /* algorithm.kl_ctrl.target_kl */
    double horizon;   /* algorithm.kl_ctrl.horizon (> 0 for adaptive) */
} kl_controller;
void kl_controller_update(kl_controller *k, double current_kl, int64_t n_steps);
/* Σ over the loss tokens (mask NULL = every token) of kl_value(t, old_t, ref_t): the response's
 * summed KL; *mean (may be NULL) gets it divided by (loss tokens + 1e-8), verl masked_mean (0 for none). */
double kl_response_sum(kl_type t, const float *old_logp, const float *ref_logp, const unsigned char *mask, int n,
                       double *mean);

/* Entropy bonus: loss −= coef·Σ w[i]·H_i. Writes dentropy[i] = −coef·w[i]; returns Σ w[i]·H_i. */
double entropy_bonus(float *dentropy, const float *entropy, const float *w, int n, float coef);

#endif
