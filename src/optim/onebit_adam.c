/* 1-bit Adam's compression phase (see onebit_adam.h). */
#include "optim/onebit_adam.h"

/* no fused multiply-add: each operation rounds once, as in tests/ref/gen_onebit_adam.py */
#pragma GCC optimize("fp-contract=off")

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"

const char *optim_name_str(optim_name n) { return n == OPTIM_ONEBIT_ADAM ? "onebit_adam" : "adamw"; }

int optim_name_parse(const char *name, optim_name *out) {
    if (name && !strcmp(name, optim_name_str(OPTIM_ADAMW))) *out = OPTIM_ADAMW;
    else if (name && !strcmp(name, optim_name_str(OPTIM_ONEBIT_ADAM))) *out = OPTIM_ONEBIT_ADAM;
    else return moerl_errorf("actor.optim.name: unknown optimizer '%s' (expected adamw or onebit_adam)", name ? name : "");
    return MOERL_OK;
}

int onebit_adam_frozen(const adamw_state *s, int64_t freeze_step) { return s->step >= freeze_step; }

int onebit_adam_local(adamw_state *s, const float *g, float loss, double norm) {
    if (!isfinite(norm) || !isfinite(loss)) {
        s->skipped++;
        return 0;
    }
    float clip = 1.0f;
    if (s->cfg.max_grad_norm > 0) {
        const double coef = s->cfg.max_grad_norm / (norm + 1e-6);
        if (coef < 1.0) clip = (float)coef;
    }
    s->step++;
    const float b1 = s->cfg.beta1;
    float *m = s->m;
    const int64_t n = (int64_t)s->n;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) m[i] = b1 * m[i] + (1.0f - b1) * (g[i] * clip);
    return 1;
}

void onebit_adam_apply(const adamw_state *s, int64_t freeze_step, float *p, const adamw_range *r, int n_ranges,
                       float lr) {
    MOERL_ASSERT(freeze_step >= 1);
    const double tr = trace_begin();
    const float step_size = (float)(lr / (1.0 - pow(s->cfg.beta1, (double)s->step)));
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(s->cfg.beta2, (double)freeze_step)));
    const float eps = s->cfg.eps;
    for (int k = 0; k < n_ranges; k++) {
        const float decay = r[k].decay ? 1.0f - lr * s->cfg.weight_decay : 1.0f;
        float *pp = p + r[k].offset;
        const float *mm = s->m + r[k].offset, *vv = s->v + r[k].offset;
        const int64_t n = (int64_t)r[k].n;
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) {
            pp[i] *= decay;
            pp[i] -= step_size * mm[i] / (sqrtf(vv[i]) * inv_sqrt_bc2 + eps);
        }
    }
    trace_end("optimizer (1-bit Adam)", "optim", tr);
}

/* x[i] ← x[i] / d_i (divide) or x[i] · d_i, d_i = √v_i·1/√(1 − β2^T) + eps (as in onebit_adam_apply). */
static void scale_by_denominator(const adamw_state *s, int64_t freeze_step, float *x, int divide) {
    MOERL_ASSERT(freeze_step >= 1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(s->cfg.beta2, (double)freeze_step)));
    const float eps = s->cfg.eps;
    const float *v = s->v;
    const int64_t n = (int64_t)s->n;
    if (divide) {
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
    } else {
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) x[i] = x[i] * (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
    }
}

void onebit_adam_to_update(const adamw_state *s, int64_t freeze_step, float *x) {
    scale_by_denominator(s, freeze_step, x, 1);
}

void onebit_adam_from_update(const adamw_state *s, int64_t freeze_step, float *x) {
    scale_by_denominator(s, freeze_step, x, 0);
}

adamw_range *onebit_adam_model_ranges(const moe_model *m) {
    adamw_range *r = xmalloc((size_t)(m->n_tensors ? m->n_tensors : 1) * sizeof *r);
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const tensor_info *t = &m->tensors[ti];
        r[ti] = (adamw_range){.offset = t->offset, .n = (size_t)t->numel, .decay = (t->flags & TF_DECAY) != 0};
    }
    return r;
}
