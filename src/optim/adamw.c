#include "optim/adamw.h"

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"

adamw_config adamw_default_config(void) {
    adamw_config c = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f,
                      .max_grad_norm = 1.0f};
    return c;
}

void adamw_init(adamw_state *s, const moe_model *m, adamw_config cfg) {
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->n = m->n_params;
    s->m = xalloc_aligned(s->n * sizeof(float));
    s->v = xalloc_aligned(s->n * sizeof(float));
}

void adamw_free(adamw_state *s) {
    free(s->m);
    free(s->v);
    memset(s, 0, sizeof *s);
}

double grad_global_norm(const moe_model *m) {
    double ss = 0.0;
    const float *g = m->grads;
    const size_t n = m->n_params;
#pragma omp parallel for reduction(+ : ss) schedule(static)
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * (double)g[i];
    return sqrt(ss);
}

/* The AdamW update of one contiguous piece (see adamw.h for the order of operations). */
static void adamw_update(float *p, const float *g, float *mm, float *vv, int64_t n, float decay, float clip, float b1,
                         float b2, float eps, float step_size, float inv_sqrt_bc2) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * clip;
        p[i] *= decay;
        mm[i] = b1 * mm[i] + (1.0f - b1) * gi;
        vv[i] = b2 * vv[i] + (1.0f - b2) * gi * gi;
        p[i] -= step_size * mm[i] / (sqrtf(vv[i]) * inv_sqrt_bc2 + eps);
    }
}

/* Clip coefficient and bias-corrected step constants of the next step (s->step incremented). */
static float adamw_begin(adamw_state *s, float lr, double norm, float *step_size, float *inv_sqrt_bc2) {
    float clip = 1.0f;
    if (s->cfg.max_grad_norm > 0) {
        double coef = s->cfg.max_grad_norm / (norm + 1e-6);
        if (coef < 1.0) clip = (float)coef;
    }
    s->step++;
    const double bc1 = 1.0 - pow(s->cfg.beta1, (double)s->step), bc2 = 1.0 - pow(s->cfg.beta2, (double)s->step);
    *step_size = (float)(lr / bc1);
    *inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    return clip;
}

int adamw_step(adamw_state *s, moe_model *m, float lr, float loss, double *grad_norm) {
    double norm = grad_global_norm(m);
    if (grad_norm) *grad_norm = norm;
    /* the whole model is one shard: a range per tensor (the decay flag differs between tensors) */
    adamw_range *r = xmalloc((size_t)(m->n_tensors ? m->n_tensors : 1) * sizeof *r);
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const tensor_info *t = &m->tensors[ti];
        r[ti] = (adamw_range){.offset = t->offset, .n = (size_t)t->numel, .decay = (t->flags & TF_DECAY) != 0};
    }
    const int applied = adamw_step_ranges(s, m->params, m->grads, r, m->n_tensors, lr, loss, norm);
    free(r);
    return applied;
}

void adamw_init_shard(adamw_state *s, size_t n, adamw_config cfg) {
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->n = n;
    s->m = xalloc_aligned((n ? n : 1) * sizeof(float));
    s->v = xalloc_aligned((n ? n : 1) * sizeof(float)); /* zeroed */
}

int adamw_step_ranges(adamw_state *s, float *p, const float *g, const adamw_range *r, int n_ranges, float lr,
                      float loss, double norm) {
    const double tr = trace_begin();
    if (!isfinite(norm) || !isfinite(loss)) {
        s->skipped++;
        trace_end("optimizer (skipped)", "optim", tr);
        return 0;
    }
    float step_size, inv_sqrt_bc2;
    const float clip = adamw_begin(s, lr, norm, &step_size, &inv_sqrt_bc2);
    for (int i = 0; i < n_ranges; i++) {
        const float decay = r[i].decay ? 1.0f - lr * s->cfg.weight_decay : 1.0f;
        const size_t o = r[i].offset;
        adamw_update(p + o, g + o, s->m + o, s->v + o, (int64_t)r[i].n, decay, clip, s->cfg.beta1, s->cfg.beta2,
                     s->cfg.eps, step_size, inv_sqrt_bc2);
    }
    trace_end("optimizer", "optim", tr);
    return 1;
}
