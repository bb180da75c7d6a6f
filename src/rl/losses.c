/* RL losses and advantages (contract and formulas: src/rl/losses.h; docs/rl.md, "Losses, advantages and their keys").
 *
 * Every function here is elementwise over tokens. Per-token arithmetic is done in double from the
 * fp32 inputs and the results are rounded to fp32 once; sums are accumulated in double, serially,
 * so results do not depend on the thread count.
 *
 * Gradient conventions follow PyTorch autograd on the reference formulas, branch by branch:
 *   clamp(x, lo, hi) passes the gradient for lo ≤ x ≤ hi (inclusive) and blocks it outside;
 *   max/min route the gradient to the branch that is strictly larger/smaller.
 * Exact ties between branches only occur when the branches have the same value and the same
 * derivative (ratio inside the clip range, or A = 0), so routing ties to either branch is exact.
 */
#include "rl/losses.h"

#include <math.h>
#include <string.h>

#include "base/common.h"

#define PPO_LOG_RATIO_CLAMP 20.0 /* verl compute_policy_loss: clamp(logπθ − logπold, −20, 20) */
#define K3_DELTA_CLAMP 20.0      /* verl kl_penalty("low_var_kl"): clamp(ref − logp, −20, 20) */
#define K3_VALUE_CLAMP 10.0      /* verl kl_penalty("low_var_kl"): clamp(kl, −10, 10) */

void grpo_advantages(float *adv, const float *rewards, const int *group_size, int n_groups, float eps) {
    MOERL_ASSERT(n_groups >= 0);
    int64_t off = 0;
    for (int g = 0; g < n_groups; g++) {
        const int n = group_size[g];
        MOERL_ASSERT(n >= 0);
        const float *r = rewards + off;
        float *a = adv + off;
        off += n;
        if (n == 0) continue;
        double mean, std;
        if (n == 1) {
            /* verl compute_grpo_outcome_advantage: a singleton group has mean 0 and std 1. */
            mean = 0.0;
            std = 1.0;
        } else {
            double s = 0;
            for (int i = 0; i < n; i++) s += r[i];
            mean = s / n;
            double ss = 0;
            for (int i = 0; i < n; i++) {
                double d = r[i] - mean;
                ss += d * d;
            }
            std = sqrt(ss / (n - 1)); /* unbiased, as torch.std */
        }
        const double inv = 1.0 / (std + (double)eps);
        for (int i = 0; i < n; i++) a[i] = (float)((r[i] - mean) * inv);
    }
}

double ppo_token_loss(float *dlogp, const float *logp, const float *old_logp, const float *behav_logp,
                      const float *adv, const float *is_w, const float *w, int n, const ppo_config *cfg,
                      ppo_stats *st) {
    MOERL_ASSERT(cfg != NULL);
    MOERL_ASSERT(!cfg->decoupled || behav_logp != NULL);
    const double lo = 1.0 - (double)cfg->clip_ratio_low;
    const double hi = 1.0 + (double)cfg->clip_ratio_high;
    const double c = cfg->clip_ratio_c;
    const int dual = c > 1.0;
    const double cap = cfg->behav_imp_weight_cap;

    double total = 0, loss_sum = 0, clip_sum = 0, kl_sum = 0, dual_sum = 0, dropped_sum = 0;
    int64_t count = 0;
    for (int i = 0; i < n; i++) {
        const double wi = w[i];
        if (!(wi > 0)) {
            /* Outside the response: no loss, no gradient, no statistics. */
            dlogp[i] = 0.0f;
            continue;
        }
        const double A = adv[i];
        /* r = exp(clamp(logπθ − logπold, ±20)); dr/dlogp = r inside the clamp, 0 outside. */
        const double x = (double)logp[i] - (double)old_logp[i];
        const int x_in = x >= -PPO_LOG_RATIO_CLAMP && x <= PPO_LOG_RATIO_CLAMP;
        const double xc = x_in ? x : (x < 0 ? -PPO_LOG_RATIO_CLAMP : PPO_LOG_RATIO_CLAMP);
        const double r = exp(xc);
        const double drdl = x_in ? r : 0.0;

        /* L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)). When the clipped surrogate is strictly
         * larger, r lies strictly outside the clip range, where clip() has zero derivative. */
        const double l1 = -A * r;
        const double rc = r < lo ? lo : (r > hi ? hi : r);
        const double l2 = -A * rc;
        double L, dLdl;
        int clipped = l2 > l1;
        if (clipped) {
            L = l2;
            dLdl = 0.0;
        } else {
            L = l1;
            dLdl = -A * drdl;
        }
        /* Dual clip (Ye et al. 2020), only for A < 0: L = min(L, −A·c), constant branch. */
        int dual_hit = 0;
        if (dual && A < 0) {
            const double l3 = -A * c;
            if (L > l3) {
                L = l3;
                dLdl = 0.0;
                dual_hit = 1;
            }
        }
        /* Decoupled PPO (AReaL): the anchor is π_prox; the loss is scaled by the detached
         * behaviour importance weight π_prox/μ, and a token whose weight exceeds the cap C is
         * filtered out (weight 0; it still counts in the aggregation's denominator). */
        if (cfg->decoupled) {
            double bw = exp((double)old_logp[i] - (double)behav_logp[i]);
            if (!(bw <= cap)) {
                bw = 0.0;
                dropped_sum += 1;
            }
            L *= bw;
            dLdl *= bw;
        }
        if (is_w) { /* rollout importance-sampling correction: a detached per-token weight */
            L *= (double)is_w[i];
            dLdl *= (double)is_w[i];
        }
        dlogp[i] = (float)(wi * dLdl);
        total += wi * L;
        loss_sum += L;
        clip_sum += clipped;
        dual_sum += dual_hit;
        kl_sum += -xc; /* verl ppo_kl: mean of −clamp(logπθ − logπold) */
        count++;
    }
    if (st) {
        st->loss_sum += loss_sum;
        st->clipfrac_sum += clip_sum;
        st->kl_sum += kl_sum;
        st->dual_clip_sum += dual_sum;
        st->behav_dropped_sum += dropped_sum;
        st->n_tokens += count;
    }
    return total;
}

double kl_k3_token_loss(float *dlogp, const float *logp, const float *ref_logp, const float *w, int n, float coef) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        const double wi = w[i];
        if (!(wi > 0)) continue;
        /* δ = clamp(ref − logp, ±20); kl = exp(δ) − δ − 1; kl clamped to [−10, 10].
         * ∂kl/∂logp = −(exp(δ) − 1) = 1 − exp(δ) where neither clamp is active, else 0. */
        const double d = (double)ref_logp[i] - (double)logp[i];
        const int d_in = d >= -K3_DELTA_CLAMP && d <= K3_DELTA_CLAMP;
        const double dc = d_in ? d : (d < 0 ? -K3_DELTA_CLAMP : K3_DELTA_CLAMP);
        const double e = exp(dc);
        double kl = e - dc - 1.0;
        double g = d_in ? 1.0 - e : 0.0;
        if (kl > K3_VALUE_CLAMP) {
            kl = K3_VALUE_CLAMP;
            g = 0.0;
        } else if (kl < -K3_VALUE_CLAMP) { /* unreachable (kl ≥ 0), kept for the verl contract */
            kl = -K3_VALUE_CLAMP;
            g = 0.0;
        }
        dlogp[i] = (float)((double)dlogp[i] + (double)coef * wi * g);
        total += wi * kl;
    }
    return total;
}

double entropy_bonus(float *dentropy, const float *entropy, const float *w, int n, float coef) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        if (w[i] == 0.0f) {
            /* Outside the response: skipped, so a padded token's entropy (maybe NaN) cannot leak. */
            dentropy[i] = 0.0f;
            continue;
        }
        dentropy[i] = (float)(-(double)coef * (double)w[i]);
        total += (double)w[i] * (double)entropy[i];
    }
    return total;
}

/* ------------------------------------------------------------------ aggregation */

static const char *const AGG_NAMES[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                        "seq-mean-token-sum-norm"};

int loss_agg_mode_parse(const char *name, loss_agg_mode *out) {
    for (int i = 0; i < 4; i++)
        if (name && !strcmp(name, AGG_NAMES[i])) {
            *out = (loss_agg_mode)i;
            return MOERL_OK;
        }
    return moerl_errorf("actor.loss_agg_mode: '%s' is not one of token-mean, seq-mean-token-sum, "
                        "seq-mean-token-mean, seq-mean-token-sum-norm", name ? name : "(null)");
}

const char *loss_agg_mode_name(loss_agg_mode m) { return (unsigned)m < 4 ? AGG_NAMES[m] : "?"; }

double loss_agg_weight(loss_agg_mode mode, int64_t seq_tokens, int64_t batch_tokens, int64_t batch_seqs,
                       double scale) {
    if (seq_tokens <= 0) return 0.0;
    switch (mode) {
    case LOSS_AGG_TOKEN_MEAN: return batch_tokens > 0 ? 1.0 / (double)batch_tokens : 0.0;
    case LOSS_AGG_SEQ_MEAN_TOKEN_SUM: return batch_seqs > 0 ? 1.0 / (double)batch_seqs : 0.0;
    case LOSS_AGG_SEQ_MEAN_TOKEN_MEAN:
        return batch_seqs > 0 ? 1.0 / ((double)batch_seqs * (double)seq_tokens) : 0.0;
    case LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM:
        return batch_seqs > 0 && scale > 0 ? 1.0 / ((double)batch_seqs * scale) : 0.0;
    }
    return 0.0;
}

/* ------------------------------------------------------------------ rollout importance sampling */

void rollout_is_weights(float *w, const float *old_logp, const float *behav_logp, int n, rollout_is_level level,
                        float threshold, rollout_is_stats *st) {
    rollout_is_weights_masked(w, old_logp, behav_logp, NULL, n, level, threshold, st);
}

void rollout_is_weights_masked(float *w, const float *old_logp, const float *behav_logp, const unsigned char *mask,
                               int n, rollout_is_level level, float threshold, rollout_is_stats *st) {
    const double thr = threshold;
    double seq = 0;
    if (level == ROLLOUT_IS_SEQUENCE) { /* the log ratios of the loss tokens only (verl: masked sum) */
        for (int i = 0; i < n; i++)
            if (!mask || mask[i]) seq += (double)old_logp[i] - (double)behav_logp[i];
        seq = seq < -PPO_LOG_RATIO_CLAMP ? -PPO_LOG_RATIO_CLAMP : (seq > PPO_LOG_RATIO_CLAMP ? PPO_LOG_RATIO_CLAMP : seq);
    }
    for (int i = 0; i < n; i++) {
        double x;
        if (mask && !mask[i]) { /* an inserted token: no loss, no weight, not in the statistics */
            w[i] = 0.0f;
            continue;
        }
        if (level == ROLLOUT_IS_NONE) {
            w[i] = 1.0f;
            continue;
        } else if (level == ROLLOUT_IS_TOKEN) {
            x = (double)old_logp[i] - (double)behav_logp[i];
            x = x < -PPO_LOG_RATIO_CLAMP ? -PPO_LOG_RATIO_CLAMP : (x > PPO_LOG_RATIO_CLAMP ? PPO_LOG_RATIO_CLAMP : x);
        } else {
            x = seq;
        }
        double v = exp(x);
        int trunc = v > thr;
        if (trunc) v = thr;
        w[i] = (float)v;
        if (st) {
            st->w_sum += (double)w[i];
            st->w_sq_sum += (double)w[i] * (double)w[i];
            st->truncated += trunc;
            st->n_tokens++;
        }
    }
}

/* ------------------------------------------------------------------ other advantage estimators */

static double group_mean(const float *r, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += r[i];
    return n > 0 ? s / n : 0.0;
}

void rloo_advantages(float *adv, const float *rewards, const int *group_size, int n_groups) {
    int64_t off = 0;
    for (int g = 0; g < n_groups; g++) {
        const int n = group_size[g];
        const float *r = rewards + off;
        float *a = adv + off;
        off += n;
        if (n == 1) {
            a[0] = r[0];
            continue;
        }
        const double m = group_mean(r, n), f = (double)n / (double)(n - 1);
        for (int i = 0; i < n; i++) a[i] = (float)(((double)r[i] - m) * f);
    }
}

void grpo_advantages_no_std(float *adv, const float *rewards, const int *group_size, int n_groups) {
    int64_t off = 0;
    for (int g = 0; g < n_groups; g++) {
        const int n = group_size[g];
        const double m = n > 1 ? group_mean(rewards + off, n) : 0.0; /* verl: a group of one has mean 0 */
        for (int i = 0; i < n; i++) adv[off + i] = (float)((double)rewards[off + i] - m);
        off += n;
    }
}

void reinforce_pp_baseline(float *adv, const float *rewards, const int *group_size, int n_groups) {
    grpo_advantages_no_std(adv, rewards, group_size, n_groups); /* s = r − group mean (singleton: 0) */
}

void reinforce_pp_moments(const float *s, const int *resp_len, int n, double mom[3]) {
    for (int i = 0; i < n; i++) {
        const double l = resp_len[i];
        mom[0] += l * s[i];
        mom[1] += l * (double)s[i] * (double)s[i];
        mom[2] += l;
    }
}

void reinforce_pp_whiten(float *adv, int n, const double mom[3]) {
    const double N = mom[2];
    if (!(N > 1)) return; /* fewer than two tokens: no variance (verl would divide by zero) */
    const double mean = mom[0] / N;
    double var = (mom[1] - N * mean * mean) / N; /* masked_var: mean of squared deviations ... */
    if (var < 0) var = 0;
    var *= N / (N - 1); /* ... with Bessel's correction over the token count */
    const double inv = 1.0 / sqrt(var + 1e-8);
    for (int i = 0; i < n; i++) adv[i] = (float)(((double)adv[i] - mean) * inv);
}

double overlong_penalty(int resp_len, int max_response_length, int buffer_len, double penalty_factor) {
    if (buffer_len <= 0) return 0.0;
    const double expected = (double)max_response_length - buffer_len;
    const double exceed = (double)resp_len - expected;
    const double p = -exceed / buffer_len * penalty_factor;
    return p < 0 ? p : 0.0;
}

/* ------------------------------------------------------------------ GSPO */

#define GSPO_LOG_RATIO_MAX 10.0 /* verl compute_policy_loss_gspo: clamp(log s_i,t, max=10) */

void gspo_seq_log_ratio(float *out, const float *logp, const float *old_logp, const int *seq, const float *w, int n,
                        int n_seq, double *sum, int *cnt) {
    for (int s = 0; s < n_seq; s++) {
        sum[s] = 0;
        cnt[s] = 0;
    }
    for (int t = 0; t < n; t++) {
        MOERL_ASSERT(seq[t] >= 0 && seq[t] < n_seq);
        if (!(w[t] > 0)) continue;
        sum[seq[t]] += (double)logp[t] - (double)old_logp[t];
        cnt[seq[t]]++;
    }
    for (int t = 0; t < n; t++) out[t] = cnt[seq[t]] > 0 ? (float)(sum[seq[t]] / cnt[seq[t]]) : 0.0f;
}

double gspo_token_loss(float *dlogp, const float *logp, const float *old_logp, const float *seq_log_ratio,
                       const float *adv, const float *is_w, const float *w, int n, const ppo_config *cfg,
                       ppo_stats *st) {
    MOERL_ASSERT(cfg != NULL);
    const double lo = 1.0 - (double)cfg->clip_ratio_low, hi = 1.0 + (double)cfg->clip_ratio_high;
    double total = 0, loss_sum = 0, clip_sum = 0, kl_sum = 0;
    int64_t count = 0;
    for (int i = 0; i < n; i++) {
        const double wi = w[i];
        if (!(wi > 0)) {
            dlogp[i] = 0.0f;
            continue;
        }
        const double A = adv[i], x = seq_log_ratio[i];
        /* log s_i,t = sg[log s_i] + logp − sg[logp]: its value is log s_i, its derivative 1;
         * clamp(max = 10) passes the gradient at and below 10 (torch clamp). */
        const int x_in = x <= GSPO_LOG_RATIO_MAX;
        const double r = exp(x_in ? x : GSPO_LOG_RATIO_MAX), drdl = x_in ? r : 0.0;
        const double l1 = -A * r, rc = r < lo ? lo : (r > hi ? hi : r), l2 = -A * rc;
        const int clipped = l2 > l1; /* then r is strictly outside [lo, hi]: clip() passes no gradient */
        double L = clipped ? l2 : l1, dLdl = clipped ? 0.0 : -A * drdl;
        if (is_w) {
            L *= (double)is_w[i];
            dLdl *= (double)is_w[i];
        }
        dlogp[i] = (float)(wi * dLdl);
        total += wi * L;
        loss_sum += L;
        clip_sum += clipped;
        kl_sum += (double)old_logp[i] - (double)logp[i]; /* verl: masked_mean(−(logp − old)), unclamped */
        count++;
    }
    if (st) {
        st->loss_sum += loss_sum;
        st->clipfrac_sum += clip_sum;
        st->kl_sum += kl_sum;
        st->n_tokens += count;
    }
    return total;
}

int policy_loss_mode_parse(const char *name, policy_loss_mode *out) {
    if (name && !strcmp(name, "vanilla")) *out = POLICY_LOSS_VANILLA;
    else if (name && !strcmp(name, "gspo")) *out = POLICY_LOSS_GSPO;
    else
        return moerl_errorf("actor.policy_loss.loss_mode: '%s' is not one of vanilla, gspo", name ? name : "(null)");
    return MOERL_OK;
}

/* ------------------------------------------------------------------ KL estimators */

int kl_type_parse(const char *key, const char *name, kl_type *out) {
    static const struct { const char *name; kl_estimator est; } NAMES[] = {
        {"kl", KL_K1}, {"k1", KL_K1}, {"abs", KL_ABS}, {"mse", KL_K2}, {"k2", KL_K2}, {"low_var_kl", KL_K3}, {"k3", KL_K3}};
    const size_t len = name ? strlen(name) : 0;
    const int plus = len > 1 && name[len - 1] == '+';
    for (size_t i = 0; name && i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (strlen(NAMES[i].name) == len - (size_t)plus && !strncmp(name, NAMES[i].name, len - (size_t)plus)) {
            out->est = NAMES[i].est;
            out->straight_through = plus && NAMES[i].est != KL_K2;
            return MOERL_OK;
        }
    return moerl_errorf("%s: '%s' is not one of kl (k1), abs, mse (k2), low_var_kl (k3), each optionally with '+' "
                        "(straight-through: its value, k2's gradient); 'full' is not offered",
                        key, name ? name : "(null)");
}

double kl_value(kl_type t, float logp, float ref_logp, double *grad) {
    const double d = (double)logp - (double)ref_logp;
    double v, g;
    switch (t.est) {
    case KL_K1: v = d; g = 1.0; break;
    case KL_ABS: v = fabs(d); g = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0); break;
    case KL_K2: v = 0.5 * d * d; g = d; break;
    default: { /* k3, verl low_var_kl: δ = clamp(ref − logp, ±20), kl = clamp(e^δ − δ − 1, ±10) */
        const double x = -d;
        const int x_in = x >= -K3_DELTA_CLAMP && x <= K3_DELTA_CLAMP;
        const double dc = x_in ? x : (x < 0 ? -K3_DELTA_CLAMP : K3_DELTA_CLAMP), e = exp(dc);
        v = e - dc - 1.0;
        g = x_in ? 1.0 - e : 0.0;
        if (v > K3_VALUE_CLAMP) {
            v = K3_VALUE_CLAMP;
            g = 0.0;
        }
        break;
    }
    }
    if (t.straight_through) g = d; /* the gradient of k2 = d²/2 */
    if (grad) *grad = g;
    return v;
}

double kl_token_loss(float *dlogp, const float *logp, const float *ref_logp, const float *w, int n, float coef,
                     kl_type t) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        const double wi = w[i];
        if (!(wi > 0)) continue;
        double g;
        const double kl = kl_value(t, logp[i], ref_logp[i], &g);
        dlogp[i] = (float)((double)dlogp[i] + (double)coef * wi * g);
        total += wi * kl;
    }
    return total;
}

/* ------------------------------------------------------------------ KL in the reward */

void kl_controller_update(kl_controller *k, double current_kl, int64_t n_steps) {
    if (!k->adaptive) return;
    double e = current_kl / k->target - 1.0;
    e = e < -0.2 ? -0.2 : (e > 0.2 ? 0.2 : e);
    k->value *= 1.0 + e * (double)n_steps / k->horizon;
}

double kl_response_sum(kl_type t, const float *old_logp, const float *ref_logp, const unsigned char *mask, int n,
                       double *mean) {
    double s = 0;
    int cnt = 0;
    for (int i = 0; i < n; i++)
        if (!mask || mask[i]) {
            s += kl_value(t, old_logp[i], ref_logp[i], NULL);
            cnt++;
        }
    if (mean) *mean = s / ((double)cnt + 1e-8); /* verl masked_mean: Σ/(Σ mask + 1e-8) */
    return s;
}
