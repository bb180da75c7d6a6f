/* RL losses and advantages (contract and formulas: src/rl/losses.h, /work/shared/reference.md "Losses").
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
                      const float *adv, const float *w, int n, const ppo_config *cfg, ppo_stats *st) {
    MOERL_ASSERT(cfg != NULL);
    MOERL_ASSERT(!cfg->decoupled || behav_logp != NULL);
    const double lo = 1.0 - (double)cfg->clip_ratio_low;
    const double hi = 1.0 + (double)cfg->clip_ratio_high;
    const double c = cfg->clip_ratio_c;
    const int dual = c > 1.0;
    const double cap = cfg->behav_imp_weight_cap;

    double total = 0, loss_sum = 0, clip_sum = 0, kl_sum = 0, dual_sum = 0;
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
        /* Decoupled PPO (AReaL): the anchor is π_prox; the loss is scaled by the detached,
         * truncated behaviour importance weight min(π_prox/μ, C). */
        if (cfg->decoupled) {
            double bw = exp((double)old_logp[i] - (double)behav_logp[i]);
            if (bw > cap) bw = cap;
            L *= bw;
            dLdl *= bw;
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
