/* Token sampling: greedy, temperature, top-k, top-p, with the request's own RNG.
 * Semantics follow vLLM's sampler (temperature scaling, then top-k, then top-p over the
 * renormalised survivors); the returned behaviour logprob is taken from the full tempered
 * distribution (see engine.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rollout/engine.h"

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i; /* ties: lowest id */
    return b;
}

/* qsort_r comparator: descending by key, ties by lower id (reentrant: the key comes as argument). */
static int cmp_desc(const void *a, const void *b, void *key) {
    const float *k = key;
    float x = k[*(const int *)a], y = k[*(const int *)b];
    if (x > y) return -1;
    if (x < y) return 1;
    return *(const int *)a - *(const int *)b;
}

int sample_token(const float *logits, int V, const sampling_params *sp, rng_state *rng, float *logprob,
                 float *scratch) {
    const float T = sp->temperature > 0 ? sp->temperature : 1.0f;
    float *z = scratch; /* [V] tempered logits */
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        z[i] = logits[i] / T;
        if (z[i] > mx) mx = z[i];
    }
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)(z[i] - mx));
    const float lse = mx + (float)log(sum);
    int tok;
    if (sp->temperature == 0) {
        tok = argmax(z, V);
    } else if (sp->top_k <= 0 && sp->top_p >= 1.0f) {
        double u = rng_uniform_double(rng) * sum, c = 0;
        tok = V - 1;
        for (int i = 0; i < V; i++) {
            c += exp((double)(z[i] - mx));
            if (u < c) { tok = i; break; }
        }
    } else {
        int *idx = (int *)(scratch + V); /* [V] */
        for (int i = 0; i < V; i++) idx[i] = i;
        qsort_r(idx, V, sizeof(int), cmp_desc, z);
        int keep = V;
        if (sp->top_k > 0 && sp->top_k < keep) keep = sp->top_k;
        double tot = 0;
        for (int i = 0; i < keep; i++) tot += exp((double)(z[idx[i]] - mx));
        if (sp->top_p < 1.0f) {
            double c = 0;
            int k2 = keep;
            for (int i = 0; i < keep; i++) {
                c += exp((double)(z[idx[i]] - mx)) / tot;
                if (c >= sp->top_p) { k2 = i + 1; break; }
            }
            keep = k2;
            tot = 0;
            for (int i = 0; i < keep; i++) tot += exp((double)(z[idx[i]] - mx));
        }
        double u = rng_uniform_double(rng) * tot, c = 0;
        tok = idx[keep - 1];
        for (int i = 0; i < keep; i++) {
            c += exp((double)(z[idx[i]] - mx));
            if (u < c) { tok = idx[i]; break; }
        }
    }
    *logprob = z[tok] - lse;
    return tok;
}

float token_logprob(const float *logits, int V, float temperature, int tok) {
    const float T = temperature > 0 ? temperature : 1.0f;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmaxf(mx, logits[i] / T);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)(logits[i] / T - mx));
    return logits[tok] / T - (mx + (float)log(sum));
}
