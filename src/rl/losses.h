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
    float behav_imp_weight_cap; /* decoupled: cap C of min(π_prox/μ, C), default 2.0 */
} ppo_config;

typedef struct {
    double loss_sum;      /* Σ over tokens of the per-token loss (before token-mean) */
    double clipfrac_sum;  /* tokens where the clipped branch was taken */
    double kl_sum;        /* Σ (old − logp) (verl ppo_kl, old = anchor) */
    double dual_clip_sum; /* tokens where the dual clip bound applied */
    int64_t n_tokens;
} ppo_stats;

/* Per-token PPO loss for n tokens with weights w[i] (1/token-count of the global batch for
 * token-mean; 0 for tokens outside the response). Inputs: logp (current policy), old_logp (the
 * anchor: behaviour logprob μ, or the proximal logprob in decoupled mode), behav_logp (μ; used
 * only when decoupled), adv. Ratio r = exp(clamp(logp − old, −20, 20));
 * L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); for A < 0, L = min(L, −A·c) (dual clip);
 * decoupled: L ← L · min(exp(old − μ), C) (detached weight).
 * Writes dlogp[i] = w[i]·∂L/∂logp (OVERWRITTEN) and accumulates w-free statistics into st over
 * tokens with w[i] > 0. Returns Σ w[i]·L_i. */
double ppo_token_loss(float *dlogp, const float *logp, const float *old_logp, const float *behav_logp,
                      const float *adv, const float *w, int n, const ppo_config *cfg, ppo_stats *st);

/* k3 KL to a reference: δ = ref − logp, kl = exp(δ) − δ − 1 (≥ 0), clamped as verl to [−10, 10].
 * Adds coef·w[i]·∂kl/∂logp into dlogp[i] (ACCUMULATES); returns Σ w[i]·kl_i. */
double kl_k3_token_loss(float *dlogp, const float *logp, const float *ref_logp, const float *w, int n, float coef);

/* Entropy bonus: loss −= coef·Σ w[i]·H_i. Writes dentropy[i] = −coef·w[i]; returns Σ w[i]·H_i. */
double entropy_bonus(float *dentropy, const float *entropy, const float *w, int n, float coef);

#endif
