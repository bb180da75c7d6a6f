/* Where gradient compression pays (see plan_xchg.h). */
#include "plan/plan_xchg.h"

#include <math.h>
#include <stdio.h>

#include "base/common.h"

static const char *const k_names[PLAN_XCHG_N] = {"none", "onebit", "threshold", "onebit_adam"};

const char *plan_xchg_name(plan_xchg_scheme s) { return s >= 0 && s < PLAN_XCHG_N ? k_names[s] : "?"; }

/* docs/parallelism.md, "Cost": bench_compress on a 25 MiB Gaussian bucket, one thread (onebit chunk 256:
 * 8.9 / 8.1 ns, threshold: 22.9 / 5.4 ns per element); onebit_adam runs the same sign + scale codec. */
static const double k_enc[PLAN_XCHG_N] = {0, 8.9, 22.9, 8.9}, k_dec[PLAN_XCHG_N] = {0, 8.1, 5.4, 8.1};

void plan_codec_def_keys(cfg *c, const char *prefix) {
    char key[96], help[200];
    for (int s = PLAN_XCHG_ONEBIT; s < PLAN_XCHG_N; s++) {
        snprintf(key, sizeof key, "%s.codec.%s.encode_ns", prefix, k_names[s]);
        snprintf(help, sizeof help, "%s codec: encode nanoseconds per gradient element on one core (docs/parallelism.md "
                 "'Cost')", k_names[s]);
        if (!cfg_has(c, key)) cfg_def_float(c, key, k_enc[s], help);
        snprintf(key, sizeof key, "%s.codec.%s.decode_ns", prefix, k_names[s]);
        snprintf(help, sizeof help, "%s codec: decode nanoseconds per gradient element and payload on one core",
                 k_names[s]);
        if (!cfg_has(c, key)) cfg_def_float(c, key, k_dec[s], help);
    }
    snprintf(key, sizeof key, "%s.codec.threshold.ratio", prefix);
    if (!cfg_has(c, key))
        cfg_def_float(c, key, 11.3, "threshold's gradient volume ratio (exact bytes / sent; measured 11.3 on the demo)");
}

int plan_codec_read(const cfg *c, const char *prefix, plan_codec *k) {
    char key[96];
    k->encode_ns[PLAN_XCHG_NONE] = k->decode_ns[PLAN_XCHG_NONE] = 0;
    for (int s = PLAN_XCHG_ONEBIT; s < PLAN_XCHG_N; s++)
        for (int d = 0; d < 2; d++) {
            snprintf(key, sizeof key, "%s.codec.%s.%s", prefix, k_names[s], d ? "decode_ns" : "encode_ns");
            const double v = cfg_float(c, key);
            if (!(v >= 0) || !isfinite(v))
                return moerl_errorf("%s must be ≥ 0 nanoseconds per element, got %g", key, v);
            (d ? k->decode_ns : k->encode_ns)[s] = v;
        }
    snprintf(key, sizeof key, "%s.codec.threshold.ratio", prefix);
    k->threshold_ratio = cfg_float(c, key);
    if (!(k->threshold_ratio > 1) || !isfinite(k->threshold_ratio))
        return moerl_errorf("%s must be > 1 (exact bytes / sent bytes), got %g", key, k->threshold_ratio);
    const int64_t ch = cfg_int(c, "actor.grad_compression_chunk");
    if (ch < 1 || ch > INT32_MAX) return moerl_errorf("actor.grad_compression_chunk must be ≥ 1, got %lld", (long long)ch);
    k->onebit_chunk = (int)ch;
    return MOERL_OK;
}

int plan_xchg_row_compute(const plan_xchg_input *in, const plan_codec *k, plan_xchg_scheme s, plan_xchg_row *row) {
    if (in->ranks < 1 || !(in->elements >= 0) || !(in->link_bw >= 0) || !(in->compute_s >= 0) ||
        !isfinite(in->elements) || !isfinite(in->link_bw) || !isfinite(in->compute_s) || s < 0 || s >= PLAN_XCHG_N)
        return moerl_errorf("gradient exchange: ranks %d (≥ 1), elements %g, link %g bytes/s and compute %g s (≥ 0)",
                            in->ranks, in->elements, in->link_bw, in->compute_s);
    const double D = in->ranks, b_none = 2 * (D - 1) / D * 4;
    double b = b_none, c_ns = 0;
    switch (s) {
    case PLAN_XCHG_NONE: break;
    case PLAN_XCHG_ONEBIT:
    case PLAN_XCHG_THRESHOLD:
        b = (D - 1) * (s == PLAN_XCHG_ONEBIT ? 1.0 / 8 + 4.0 / k->onebit_chunk : 4 / k->threshold_ratio);
        c_ns = k->encode_ns[s] + D * k->decode_ns[s];
        break;
    default: /* onebit_adam */
        b = 2 * (D - 1) / D / 8;
        c_ns = k->encode_ns[s] * (1 + 1 / D) + 2 * k->decode_ns[s];
    }
    plan_xchg_row r = {0};
    if (in->ranks == 1) b = 0, c_ns = 0; /* one rank exchanges nothing (moerl skips the reducer) */
    r.bytes_per_element = b;
    r.ratio = b > 0 ? b_none / b : 1;
    r.codec_s = in->elements * c_ns * 1e-9;
    r.exchange_s = in->link_bw > 0 ? r.codec_s + in->elements * b / in->link_bw : 0;
    if (s != PLAN_XCHG_NONE && b < b_none)
        r.crossover_bw = c_ns > 0 ? (b_none - b) / (c_ns * 1e-9) : INFINITY;
    r.shortens = in->link_bw > 0 && in->link_bw < r.crossover_bw;
    *row = r;
    return MOERL_OK;
}

int plan_xchg_rule(const plan_xchg_input *in, const plan_xchg_row *none) {
    if (in->elements * 4 <= PLAN_XCHG_RULE_BYTES || in->ranks < 2) return 0;
    if (!(in->link_bw > 0) || !(in->compute_s > 0)) return -1;
    return none->exchange_s > PLAN_XCHG_RULE_FRACTION * in->compute_s;
}

void plan_xchg_practice(plan_xchg_input *x) {
    x->ranks = 8;
    x->elements = PLAN_XCHG_PRACTICE_BYTES / 4;
    x->link_bw = 2.0 * 7 / 8 * PLAN_XCHG_PRACTICE_BYTES / PLAN_XCHG_PRACTICE_EXACT_S;
    x->compute_s = PLAN_XCHG_PRACTICE_STEP_S - PLAN_XCHG_PRACTICE_EXACT_S;
}
