/* RL losses and advantages: GRPO group advantages, PPO clipped policy loss (with dual clip,
 * behaviour-anchored or decoupled), token-mean aggregation, entropy and k3 KL.
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

/* k3 KL to a reference: δ = ref − logp, kl = exp(δ) − δ − 1 (≥ 0), clamped as verl to [−10, 10].
 * Adds coef·w[i]·∂kl/∂logp into dlogp[i] (ACCUMULATES); returns Σ w[i]·kl_i. */
double kl_k3_token_loss(float *dlogp, const float *logp, const float *ref_logp, const float *w, int n, float coef);

/* Entropy bonus: loss −= coef·Σ w[i]·H_i. Writes dentropy[i] = −coef·w[i]; returns Σ w[i]·H_i. */
double entropy_bonus(float *dentropy, const float *entropy, const float *w, int n, float coef);

#endif
