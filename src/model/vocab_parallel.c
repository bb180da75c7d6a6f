/* Vocab-parallel log-probabilities (see vocab_parallel.h). Source of the method: Megatron-LM's
 * vocab-parallel cross entropy (max all-reduce, then the sums); the formulas are logprob.c's. */
#include "model/vocab_parallel.h"

#include <math.h>
#include <stdlib.h>

#include "base/common.h"

/* The rows of this rank's vocabulary slice that are real tokens (the rest pads V to a multiple of tp). */
static int vp_valid(const moe_config *c, int v0) {
    const int v = c->exec.tp_vocab - v0;
    return v < 0 ? 0 : v < c->vocab_size ? v : c->vocab_size;
}

/* Per-row statistics of z = logits/T over the whole vocabulary: st[3n] = max z, st[3n+1] = Σ e^{z−max},
 * st[3n+2] = Σ e^{z−max}·(z−max); zt[n] = z[target] (0 when target < 0). Two all-reduces over the group. */
static void vp_stats(const moe_model *m, model_acts *a, int v0, double *st, double *zt) {
    const int N = a->N, V = m->cfg.vocab_size, Vv = vp_valid(&m->cfg, v0);
    const float T = a->temperature;
    void *par = a->par;
    const model_hooks *h = model_par_hooks(par);
    double *mx = xmalloc((size_t)N * sizeof(double));
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *l = a->logits + (size_t)n * V;
        float v = -INFINITY;
        for (int j = 0; j < Vv; j++) v = l[j] > v ? l[j] : v;
        mx[n] = v / T;
    }
    h->tp_allreduce(par, mx, (size_t)N, 1);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *l = a->logits + (size_t)n * V;
        const float M = (float)mx[n];
        double s = 0.0, sz = 0.0;
        for (int j = 0; j < Vv; j++) {
            const float d = l[j] / T - M;
            const float e = expf(d);
            s += e;
            sz += (double)(e * d);
        }
        const int t = a->targets[n] - v0;
        st[3 * (size_t)n] = 0.0; /* the max is summed below: only one rank adds it */
        st[3 * (size_t)n + 1] = s;
        st[3 * (size_t)n + 2] = sz;
        zt[n] = a->targets[n] >= 0 && t >= 0 && t < Vv ? (double)(l[t] / T) : 0.0;
    }
    /* one all-reduce of the sums: [st (3N) | zt (N)] laid out contiguously by the caller */
    h->tp_allreduce(par, st, (size_t)N * 4, 0);
    for (int n = 0; n < N; n++) st[3 * (size_t)n] = mx[n];
    free(mx);
}

void vp_logprob_forward(const moe_model *m, model_acts *a, int v0, int want_entropy) {
    const int N = a->N;
    double *st = xmalloc((size_t)N * 4 * sizeof(double)), *zt = st + (size_t)N * 3;
    vp_stats(m, a, v0, st, zt);
    for (int n = 0; n < N; n++) {
        const double M = st[3 * (size_t)n], s = st[3 * (size_t)n + 1], sz = st[3 * (size_t)n + 2];
        const float log_s = (float)log(s);
        a->lse_head[n] = (float)M + log_s;
        const int ok = a->targets[n] >= 0;
        a->logp[n] = ok ? ((float)zt[n] - (float)M) - log_s : 0.0f;
        if (want_entropy) a->entropy[n] = ok ? (float)(log(s) - sz / s) : 0.0f;
    }
    free(st);
}

void vp_logprob_backward(const moe_model *m, model_acts *a, int v0, const float *dlogp, const float *dentropy) {
    const int N = a->N, V = m->cfg.vocab_size, Vv = vp_valid(&m->cfg, v0);
    const float T = a->temperature, inv_T = 1.0f / T;
    double *st = xmalloc((size_t)N * 4 * sizeof(double)), *zt = st + (size_t)N * 3;
    vp_stats(m, a, v0, st, zt);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const int t = a->targets[n];
        const float *l = a->logits + (size_t)n * V;
        float *g = a->d_logits + (size_t)n * V;
        const float wa = t >= 0 ? dlogp[n] : 0.0f, wb = dentropy ? dentropy[n] : 0.0f;
        const double s = st[3 * (size_t)n + 1];
        const float M = (float)st[3 * (size_t)n], log_s = (float)log(s), inv_s = (float)(1.0 / s);
        const float Hn = (float)(log(s) - st[3 * (size_t)n + 2] / s);
        for (int j = 0; j < Vv; j++) {
            const float d = l[j] / T - M;
            const float p = expf(d) * inv_s;
            g[j] = -p * (wa + wb * ((d - log_s) + Hn)) * inv_T;
        }
        for (int j = Vv; j < V; j++) g[j] = 0.0f; /* padding rows: no logit, no gradient */
        if (t >= v0 && t - v0 < V) g[t - v0] += wa * inv_T;
    }
    free(st);
}
