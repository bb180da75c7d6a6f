/* Rollout rejection sampling (verl algorithm.rollout_correction.rollout_rs / rollout_rs_threshold)
 * and the training/rollout probability mismatch metrics (verl training/rollout_probs_diff_*,
 * training/rollout_actor_probs_pearson_corr). Declarations and formulas: rl/losses.h. Semantics
 * from verl's rollout_corr_helper.compute_rollout_rejection_mask / compute_rs_metrics and
 * utils/debug/metrics.calculate_debug_metrics; written here from those definitions. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "rl/losses.h"

#define RS_LOG_RATIO_CLAMP 20.0 /* verl SAFETY_BOUND */
#define RS_KEY_OPTS "algorithm.rollout_correction.rollout_rs"
#define RS_KEY_THR "algorithm.rollout_correction.rollout_rs_threshold"

static const struct {
    const char *name;
    rollout_rs_agg agg;
    int k;
} rs_known[ROLLOUT_RS_MAX_OPTIONS] = {
    {"token_k1", RS_AGG_TOKEN, 1},      {"token_k2", RS_AGG_TOKEN, 2},      {"token_k3", RS_AGG_TOKEN, 3},
    {"seq_sum_k1", RS_AGG_SEQ_SUM, 1},  {"seq_sum_k2", RS_AGG_SEQ_SUM, 2},  {"seq_sum_k3", RS_AGG_SEQ_SUM, 3},
    {"seq_mean_k1", RS_AGG_SEQ_MEAN, 1}, {"seq_mean_k2", RS_AGG_SEQ_MEAN, 2}, {"seq_mean_k3", RS_AGG_SEQ_MEAN, 3},
    {"seq_max_k2", RS_AGG_SEQ_MAX, 2},  {"seq_max_k3", RS_AGG_SEQ_MAX, 3},
};

static int is_null(const char *s) { return !s || !s[0] || !strcmp(s, "null") || !strcmp(s, "none"); }

/* Splits s at commas into trimmed parts (at most max, each < 64 chars); the count, −1 when there are
 * more parts or one is too long, −2 when a part is empty ("a,,b", a trailing comma). */
static int split_list(const char *s, char (*parts)[64], int max) {
    int n = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        if (!e) e = p + strlen(p);
        const char *a = p, *b = e;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (b == a) return -2;
        if (n >= max || b - a >= 64) return -1;
        memcpy(parts[n], a, (size_t)(b - a));
        parts[n][b - a] = 0;
        n++;
        p = *e ? e + 1 : e;
        if (!*p && e[0] == ',') return -2; /* a trailing comma */
    }
    return n;
}

/* A finite number > 0 spelling the whole of s. */
static int parse_positive(const char *s, double *out) {
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || !(v > 0) || strpbrk(s, "xX")) return MOERL_ERR; /* decimal only */
    *out = v;
    return MOERL_OK;
}

static int parse_threshold(rollout_rs_option *o, const char *spec, const char *whole) {
    const char *us = strchr(spec, '_');
    if (o->k != 1) {
        if (us)
            return moerl_errorf(RS_KEY_THR "='%s': option %s takes one upper bound without '_', got '%s'", whole,
                                o->name, spec);
        if (parse_positive(spec, &o->upper) != MOERL_OK)
            return moerl_errorf(RS_KEY_THR "='%s': '%s' (for %s) is not a finite number > 0", whole, spec, o->name);
        o->lower = 0.0;
        return MOERL_OK;
    }
    double lo, hi;
    if (us) {
        char a[64];
        snprintf(a, sizeof a, "%.*s", (int)(us - spec), spec);
        if (parse_positive(a, &lo) != MOERL_OK || parse_positive(us + 1, &hi) != MOERL_OK)
            return moerl_errorf(RS_KEY_THR "='%s': '%s' (for %s) is not lower_upper with two finite numbers > 0",
                                whole, spec, o->name);
        if (lo > hi)
            return moerl_errorf(RS_KEY_THR "='%s': '%s' (for %s) has lower %g above upper %g: every token would be "
                                "rejected", whole, spec, o->name, lo, hi);
    } else {
        if (parse_positive(spec, &hi) != MOERL_OK)
            return moerl_errorf(RS_KEY_THR "='%s': '%s' (for %s) is not a finite number > 0 nor lower_upper", whole,
                                spec, o->name);
        lo = 1.0 / hi; /* verl: a single k1 bound is the upper one, its reciprocal the lower */
        if (lo > hi)
            return moerl_errorf(RS_KEY_THR "='%s': a single k1 bound is the upper ratio bound (its reciprocal the "
                                "lower) and must be ≥ 1, got %s", whole, spec);
    }
    o->lower = log(lo);
    o->upper = log(hi);
    return MOERL_OK;
}

int rollout_rs_parse(const char *options, const char *threshold, rollout_rs_config *out) {
    memset(out, 0, sizeof *out);
    if (is_null(options)) {
        if (!is_null(threshold))
            return moerl_errorf(RS_KEY_THR "='%s' is set but " RS_KEY_OPTS " is null: name the rejection options "
                                "too, or leave the threshold null", threshold);
        return MOERL_OK;
    }
    char parts[2 * ROLLOUT_RS_MAX_OPTIONS][64];
    const int np = split_list(options, parts, 2 * ROLLOUT_RS_MAX_OPTIONS);
    if (np <= 0)
        return moerl_errorf(RS_KEY_OPTS "='%s': %s", options,
                            np == 0    ? "no option"
                            : np == -2 ? "an empty entry (two commas in a row, or a trailing comma)"
                                       : "more than 22 entries, or an entry of 64 characters or more");
    for (int i = 0; i < np; i++) {
        int which = -1, dup = 0;
        for (int k = 0; k < ROLLOUT_RS_MAX_OPTIONS; k++)
            if (!strcmp(parts[i], rs_known[k].name)) which = k;
        if (which < 0)
            return moerl_errorf(RS_KEY_OPTS "='%s': '%s' is not one of token_k1, token_k2, token_k3, seq_sum_k1, "
                                "seq_sum_k2, seq_sum_k3, seq_mean_k1, seq_mean_k2, seq_mean_k3, seq_max_k2, seq_max_k3",
                                options, parts[i]);
        for (int j = 0; j < out->n; j++) dup |= !strcmp(out->opt[j].name, parts[i]);
        if (dup) continue; /* verl keeps the first of repeated options */
        rollout_rs_option *o = &out->opt[out->n++];
        snprintf(o->name, sizeof o->name, "%s", rs_known[which].name);
        o->agg = rs_known[which].agg;
        o->k = rs_known[which].k;
    }
    if (is_null(threshold))
        return moerl_errorf(RS_KEY_THR " is null but " RS_KEY_OPTS "='%s' needs it: k1 options take \"lower_upper\" "
                            "ratio bounds (e.g. 0.5_2.0), k2/k3 options one upper bound (e.g. 0.01)", options);
    char specs[2 * ROLLOUT_RS_MAX_OPTIONS][64];
    const int ns = split_list(threshold, specs, 2 * ROLLOUT_RS_MAX_OPTIONS);
    if (ns == -2)
        return moerl_errorf(RS_KEY_THR "='%s': an empty entry (two commas in a row, or a trailing comma)", threshold);
    if (ns != 1 && ns != out->n)
        return moerl_errorf(RS_KEY_THR "='%s': %d entries for %d options of " RS_KEY_OPTS "='%s' (give one for all, "
                            "or one per option, comma separated)", threshold, ns, out->n, options);
    for (int i = 0; i < out->n; i++)
        if (parse_threshold(&out->opt[i], specs[ns == 1 ? 0 : i], threshold) != MOERL_OK) return MOERL_ERR;
    return MOERL_OK;
}

void rollout_rs_stats_init(rollout_rs_stats *st) {
    memset(st->sum, 0, sizeof st->sum);
    for (int i = 0; i < RS_N_MAXS; i++) st->max[i] = -INFINITY;
}

static double rs_token_value(int k, float old_logp, float behav_logp) {
    double lr = (double)old_logp - (double)behav_logp;
    lr = lr < -RS_LOG_RATIO_CLAMP ? -RS_LOG_RATIO_CLAMP : (lr > RS_LOG_RATIO_CLAMP ? RS_LOG_RATIO_CLAMP : lr);
    if (k == 1) return -lr;
    if (k == 2) return 0.5 * lr * lr;
    return exp(lr) - 1.0 - lr;
}

static int rs_passes(const rollout_rs_option *o, double v) {
    return o->k == 1 ? (v >= o->lower && v <= o->upper) : v <= o->upper;
}

static void upd_max(double *m, double v) {
    if (v > *m) *m = v;
}

/* One option over one sequence: ANDs its decision into keep[], adds its statistics. */
static void rs_option_sequence(const rollout_rs_option *o, const float *old_logp, const float *behav_logp,
                               const unsigned char *mask, int n, unsigned char *keep, double *s, double *m) {
    double seq_sum = 0, seq_max = -INFINITY;
    int cnt = 0;
    for (int t = 0; t < n; t++)
        if (!mask || mask[t]) {
            const double v = rs_token_value(o->k, old_logp[t], behav_logp[t]);
            seq_sum += v;
            seq_max = fmax(seq_max, v);
            cnt++;
        }
    if (cnt == 0) return;
    const double seq_mean = seq_sum / ((double)cnt + 1e-8); /* verl masked_mean */
    const double seq_v = o->agg == RS_AGG_SEQ_SUM ? seq_sum : (o->agg == RS_AGG_SEQ_MAX ? seq_max : seq_mean);
    const int seq_keep = rs_passes(o, seq_v);
    /* the per-sequence value of the seq_* metrics: the statistic, or (token level) the token mean */
    const double sv = o->agg == RS_AGG_TOKEN ? seq_mean : seq_v;
    const double clo = o->k == 1 ? o->lower : 0.0;
    int masked = 0;
    for (int t = 0; t < n; t++) {
        if (mask && !mask[t]) continue;
        const double v = o->agg == RS_AGG_TOKEN ? rs_token_value(o->k, old_logp[t], behav_logp[t]) : seq_v;
        const int pass = o->agg == RS_AGG_TOKEN ? rs_passes(o, v) : seq_keep;
        if (!pass) {
            keep[t] = 0;
            masked++;
        }
        const double c = v < clo ? clo : (v > o->upper ? o->upper : v);
        s[RS_S_STAT] += v;
        s[RS_S_HIGH] += v > o->upper;
        s[RS_S_LOW] += o->k == 1 && v < o->lower;
        s[RS_S_CLAMP] += c;
        s[RS_S_CLAMP_SQ] += c * c;
        upd_max(&m[RS_M_TOK_MAX], v);
        upd_max(&m[RS_M_TOK_NEG_MIN], -v);
    }
    s[RS_S_SEQ] += sv;
    s[RS_S_SEQ_SQ] += sv * sv;
    s[RS_S_SEQ_HIGH] += sv > o->upper;
    s[RS_S_SEQ_LOW] += o->k == 1 && sv < o->lower;
    s[RS_S_MASKED_TOK] += masked;
    s[RS_S_MASKED_SEQ] += masked > 0;
    upd_max(&m[RS_M_SEQ_MAX], sv);
    upd_max(&m[RS_M_SEQ_NEG_MIN], -sv);
    upd_max(&m[RS_M_SEQ_ABS], fabs(sv));
}

int rollout_rs_sequence(const rollout_rs_config *c, const float *old_logp, const float *behav_logp,
                        const unsigned char *mask, int n, unsigned char *keep, rollout_rs_stats *st) {
    rollout_rs_stats scratch;
    if (!st) {
        rollout_rs_stats_init(&scratch);
        st = &scratch;
    }
    int valid = 0;
    for (int t = 0; t < n; t++) {
        keep[t] = (unsigned char)(!mask || mask[t]);
        valid += keep[t];
    }
    st->sum[RS_HEAD_SEQ] += 1;
    if (valid == 0) return 0;
    st->sum[RS_HEAD_TOK] += valid;
    st->sum[RS_HEAD_SEQ_VALID] += 1;
    for (int i = 0; i < c->n; i++)
        rs_option_sequence(&c->opt[i], old_logp, behav_logp, mask, n, keep, st->sum + RS_HEAD + i * RS_N_SUM,
                           st->max + i * RS_N_MAX);
    int rejected = 0;
    for (int t = 0; t < n; t++) rejected += (!mask || mask[t]) && !keep[t];
    st->sum[RS_HEAD_MASKED_TOK] += rejected;
    st->sum[RS_HEAD_MASKED_SEQ] += rejected > 0;
    return rejected;
}

static void put(char (*names)[ROLLOUT_RS_NAME_LEN], double *vals, int *k, const char *opt, const char *what,
                double v) {
    if (names) snprintf(names[*k], ROLLOUT_RS_NAME_LEN, "rollout_rs_%s%s%s", opt, opt[0] ? "_" : "", what);
    if (vals) vals[*k] = v;
    (*k)++;
}

int rollout_rs_metrics(const rollout_rs_config *c, const rollout_rs_stats *st, char (*names)[ROLLOUT_RS_NAME_LEN],
                       double *vals) {
    int k = 0;
    if (c->n == 0) return 0;
    const double N = st ? st->sum[RS_HEAD_TOK] : 0, Sv = st ? st->sum[RS_HEAD_SEQ_VALID] : 0;
    const int ok = N > 0;
    for (int i = 0; i < c->n; i++) {
        const rollout_rs_option *o = &c->opt[i];
        const double *s = st ? st->sum + RS_HEAD + i * RS_N_SUM : NULL, *m = st ? st->max + i * RS_N_MAX : NULL;
        const int seq = o->agg != RS_AGG_TOKEN;
        double std = 0, sstd = 0;
        if (ok && N > 1) {
            const double mc = s[RS_S_CLAMP] / N;
            std = sqrt(fmax(0.0, s[RS_S_CLAMP_SQ] / N - mc * mc));
        }
        if (ok && Sv > 1)
            sstd = sqrt(fmax(0.0, (s[RS_S_SEQ_SQ] - s[RS_S_SEQ] * s[RS_S_SEQ] / Sv) / (Sv - 1)));
        put(names, vals, &k, o->name, "mean", ok ? s[RS_S_STAT] / N : NAN);
        put(names, vals, &k, o->name, "max", ok ? (seq ? m[RS_M_SEQ_MAX] : m[RS_M_TOK_MAX]) : NAN);
        put(names, vals, &k, o->name, "min", ok ? -(seq ? m[RS_M_SEQ_NEG_MIN] : m[RS_M_TOK_NEG_MIN]) : NAN);
        put(names, vals, &k, o->name, "std", ok ? std : NAN);
        put(names, vals, &k, o->name, "fraction_high", ok ? (seq ? s[RS_S_SEQ_HIGH] / Sv : s[RS_S_HIGH] / N) : NAN);
        put(names, vals, &k, o->name, "fraction_low", ok ? (seq ? s[RS_S_SEQ_LOW] / Sv : s[RS_S_LOW] / N) : NAN);
        put(names, vals, &k, o->name, "seq_mean", ok ? s[RS_S_SEQ] / Sv : NAN);
        put(names, vals, &k, o->name, "seq_std", ok ? sstd : NAN);
        put(names, vals, &k, o->name, "seq_max", ok ? m[RS_M_SEQ_MAX] : NAN);
        put(names, vals, &k, o->name, "seq_min", ok ? -m[RS_M_SEQ_NEG_MIN] : NAN);
        put(names, vals, &k, o->name, "seq_max_deviation", ok ? m[RS_M_SEQ_ABS] : NAN);
        put(names, vals, &k, o->name, "seq_fraction_high", ok ? s[RS_S_SEQ_HIGH] / Sv : NAN);
        if (o->k == 1) put(names, vals, &k, o->name, "seq_fraction_low", ok ? s[RS_S_SEQ_LOW] / Sv : NAN);
        put(names, vals, &k, o->name, "masked_fraction", ok ? s[RS_S_MASKED_TOK] / N : NAN);
        put(names, vals, &k, o->name, "seq_masked_fraction", ok ? s[RS_S_MASKED_SEQ] / Sv : NAN);
    }
    put(names, vals, &k, "", "masked_fraction", ok ? st->sum[RS_HEAD_MASKED_TOK] / N : NAN);
    put(names, vals, &k, "", "seq_masked_fraction", ok ? st->sum[RS_HEAD_MASKED_SEQ] / st->sum[RS_HEAD_SEQ] : NAN);
    return k;
}

/* ------------------------------------------------------------------ training/rollout mismatch */

void probs_mismatch_init(probs_mismatch_stats *st) {
    memset(st, 0, sizeof *st);
    st->dmax = -INFINITY;
}

void probs_mismatch_add(probs_mismatch_stats *st, const float *train_logp, const float *rollout_logp,
                        const unsigned char *mask, int n) {
    for (int t = 0; t < n; t++) {
        if (mask && !mask[t]) continue;
        const double x = exp((double)train_logp[t]), y = exp((double)rollout_logp[t]), d = fabs(x - y);
        st->n += 1;
        st->sx += x;
        st->sy += y;
        st->sxx += x * x;
        st->syy += y * y;
        st->sxy += x * y;
        st->sd += d;
        st->sdd += d * d;
        if (d > st->dmax) st->dmax = d;
    }
}

void probs_mismatch_finish(const probs_mismatch_stats *st, double *diff_max, double *diff_mean, double *diff_std,
                           double *pearson) {
    const double n = st->n;
    *diff_max = n > 0 ? st->dmax : NAN;
    *diff_mean = n > 0 ? st->sd / n : NAN;
    *diff_std = n > 1 ? sqrt(fmax(0.0, (st->sdd - st->sd * st->sd / n) / (n - 1))) : NAN;
    const double vx = st->sxx - st->sx * st->sx / n, vy = st->syy - st->sy * st->sy / n,
                 cxy = st->sxy - st->sx * st->sy / n;
    *pearson = n > 1 && vx > 0 && vy > 0 ? cxy / sqrt(vx * vy) : NAN;
    if (isfinite(*pearson)) *pearson = fmax(-1.0, fmin(1.0, *pearson)); /* torch.corrcoef clips to [−1, 1] */
}

/* ------------------------------------------------------------------ off-policy diagnostics */

void offpolicy_init(offpolicy_stats *st) {
    memset(st, 0, sizeof *st);
    st->max[0] = st->max[1] = -INFINITY;
}

void offpolicy_add(offpolicy_stats *st, const float *old_logp, const float *behav_logp, const unsigned char *mask,
                   int n) {
    double so = 0, sb = 0, slr = 0, cnt = 0, *s = st->sum;
    for (int t = 0; t < n; t++) {
        if (mask && !mask[t]) continue;
        const double o = old_logp[t], b = behav_logp[t], lr = o - b;
        const double lrc = lr < -RS_LOG_RATIO_CLAMP ? -RS_LOG_RATIO_CLAMP : (lr > RS_LOG_RATIO_CLAMP ? RS_LOG_RATIO_CLAMP : lr);
        so += o;
        sb += b;
        slr += lr;
        cnt += 1;
        s[OFFP_KL] += b - o;
        s[OFFP_K3] += exp(lr) - lr - 1.0;
        s[OFFP_RHO2] += exp(2.0 * lrc);
    }
    if (cnt == 0) return;
    const double mo = so / (cnt + 1e-8), mb = sb / (cnt + 1e-8), d = mb - mo;
    const double sc = slr < -RS_LOG_RATIO_CLAMP ? -RS_LOG_RATIO_CLAMP : (slr > RS_LOG_RATIO_CLAMP ? RS_LOG_RATIO_CLAMP : slr);
    s[OFFP_TOK] += cnt;
    s[OFFP_SEQ] += 1;
    s[OFFP_TPPL] += exp(-mo);
    s[OFFP_TLOG] += -mo;
    s[OFFP_RPPL] += exp(-mb);
    s[OFFP_RLOG] += -mb;
    s[OFFP_D] += d;
    s[OFFP_ABS_D] += fabs(d);
    s[OFFP_EXP_D] += exp(d);
    s[OFFP_CHI2_SEQ] += exp(2.0 * sc);
    if (d > st->max[0]) st->max[0] = d;
    if (-d > st->max[1]) st->max[1] = -d;
}

void offpolicy_metrics(const offpolicy_stats *st, const char **names, double *vals) {
    static const char *nm[OFFPOLICY_N_METRICS] = {"kl", "k3_kl", "training_ppl", "training_log_ppl", "rollout_ppl",
                                                   "rollout_log_ppl", "log_ppl_diff", "log_ppl_abs_diff",
                                                   "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token",
                                                   "chi2_seq"};
    const double *s = st->sum, N = s[OFFP_TOK], S = s[OFFP_SEQ];
    const int ok = N > 0 && S > 0;
    const double v[OFFPOLICY_N_METRICS] = {
        s[OFFP_KL] / N,      s[OFFP_K3] / N,      s[OFFP_TPPL] / S,      s[OFFP_TLOG] / S,  s[OFFP_RPPL] / S,
        s[OFFP_RLOG] / S,    s[OFFP_D] / S,       s[OFFP_ABS_D] / S,     st->max[0],        -st->max[1],
        s[OFFP_EXP_D] / S,   s[OFFP_RHO2] / N - 1.0, s[OFFP_CHI2_SEQ] / S - 1.0};
    for (int i = 0; i < OFFPOLICY_N_METRICS; i++) {
        if (names) names[i] = nm[i];
        if (vals) vals[i] = ok ? v[i] : NAN;
    }
}
