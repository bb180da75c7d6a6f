/* A GRPO rollout workload shared by bench/llamacpp_grpo.c (which draws it and writes it with
 * --workload-out) and bench/bench_paged.c (--workload FILE): G prompts (token ids) × n samples,
 * every sample with a forced response length (EOS ignored, the sequence stops at its length), so
 * two engines given the same workload do the same work. Header-only.
 *
 * File format (text, whitespace-separated): "grpo_workload G n", then for every group
 * "prompt P id_1 … id_P" and "lengths r_1 … r_n". */
#ifndef MOERL_BENCH_GRPO_WORKLOAD_H
#define MOERL_BENCH_GRPO_WORKLOAD_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"

typedef struct {
    int G, n, n_seq;   /* groups, samples per group, G·n sequences */
    int *plen;         /* [G] prompt lengths */
    int **prompt;      /* [G][plen[g]] token ids */
    int *rlen;         /* [n_seq] forced response lengths; sequence i belongs to group i / n */
    int max_plen, max_rlen;
    int64_t prompt_tokens, gen_tokens; /* Σ over sequences of plen and of rlen */
} workload;

/* rollout.synthetic_length's draw (src/rl/rollouter.c): min · u^(−1/alpha), u ∈ (0, 1], rounded up, capped. */
static inline int heavy_tail_len(rng_state *g, double alpha, int min, int cap) {
    const double u = 1.0 - rng_uniform_double(g);
    const double len = min * pow(u, -1.0 / alpha);
    return len >= cap ? cap : (int)ceil(len);
}

static inline void workload_alloc(workload *w, int G, int n) {
    memset(w, 0, sizeof *w);
    w->G = G;
    w->n = n;
    w->n_seq = G * n;
    w->plen = xcalloc(G, sizeof(int));
    w->prompt = xcalloc(G, sizeof(int *));
    w->rlen = xcalloc(w->n_seq, sizeof(int));
}

/* The longest prompt and response and the token totals, from plen and rlen. */
static inline void workload_totals(workload *w) {
    w->max_plen = w->max_rlen = 0;
    w->prompt_tokens = w->gen_tokens = 0;
    for (int k = 0; k < w->G; k++) w->max_plen = MOERL_MAX(w->max_plen, w->plen[k]);
    for (int i = 0; i < w->n_seq; i++) {
        w->max_rlen = MOERL_MAX(w->max_rlen, w->rlen[i]);
        w->prompt_tokens += w->plen[i / w->n];
        w->gen_tokens += w->rlen[i];
    }
}

/* Prompt ids are drawn in [0, GRPO_WORKLOAD_IDS): valid for both benchmark models (bench_util.h's,
 * vocabulary 512, and model B, 2048), so one file serves bench_paged and llamacpp_grpo. */
#define GRPO_WORKLOAD_IDS 512

/* Draw from `seed`: G prompts of uniform length in [pmin, pmax] with uniform ids in
 * [0, min(V, GRPO_WORKLOAD_IDS)), then G·n response lengths from heavy_tail_len(alpha, rmin, rmax). */
static inline workload workload_draw(int G, int n, int pmin, int pmax, double alpha, int rmin, int rmax, int V,
                                     uint64_t seed) {
    workload w;
    workload_alloc(&w, G, n);
    rng_state g;
    rng_seed(&g, seed);
    V = MOERL_MIN(V, GRPO_WORKLOAD_IDS);
    for (int k = 0; k < G; k++) {
        w.plen[k] = pmin + (int)(rng_uniform_double(&g) * (pmax - pmin + 1));
        w.prompt[k] = xmalloc((size_t)w.plen[k] * sizeof(int));
        for (int j = 0; j < w.plen[k]; j++) w.prompt[k][j] = (int)(rng_uniform_double(&g) * V) % V;
    }
    for (int i = 0; i < w.n_seq; i++) w.rlen[i] = heavy_tail_len(&g, alpha, rmin, rmax);
    workload_totals(&w);
    return w;
}

/* The first `groups` groups of w (a view on the same arrays: never freed). */
static inline workload workload_head(const workload *w, int groups) {
    workload h = *w;
    h.G = groups;
    h.n_seq = groups * w->n;
    workload_totals(&h);
    return h;
}

static inline void workload_free(workload *w) {
    if (w->prompt)
        for (int k = 0; k < w->G; k++) free(w->prompt[k]);
    free(w->prompt); free(w->plen); free(w->rlen);
    memset(w, 0, sizeof *w);
}

/* Write w to path (the format above). Errors: the file cannot be written. */
static inline int workload_write(const workload *w, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return moerl_errorf("workload '%s': cannot open for writing", path);
    fprintf(f, "grpo_workload %d %d\n", w->G, w->n);
    for (int k = 0; k < w->G; k++) {
        fprintf(f, "prompt %d", w->plen[k]);
        for (int j = 0; j < w->plen[k]; j++) fprintf(f, " %d", w->prompt[k][j]);
        fprintf(f, "\nlengths");
        for (int j = 0; j < w->n; j++) fprintf(f, " %d", w->rlen[k * w->n + j]);
        fputc('\n', f);
    }
    return fclose(f) == 0 ? MOERL_OK : moerl_errorf("workload '%s': write error", path);
}

/* Read one integer in [lo, hi] after the keyword `what` of group k (k < 0: the header). */
static inline int workload_int(FILE *f, const char *path, const char *what, int k, int lo, int hi, int *out) {
    long x;
    if (fscanf(f, "%ld", &x) != 1)
        return moerl_errorf("workload '%s': group %d: %s: expected an integer in [%d, %d], found none", path, k + 1, what, lo, hi);
    if (x < lo || x > hi)
        return moerl_errorf("workload '%s': group %d: %s %ld: expected an integer in [%d, %d]", path, k + 1, what, x, lo, hi);
    *out = (int)x;
    return MOERL_OK;
}

static inline int workload_keyword(FILE *f, const char *path, const char *kw, int k) {
    char word[32] = "";
    if (fscanf(f, "%31s", word) != 1 || strcmp(word, kw))
        return moerl_errorf("workload '%s': group %d: expected '%s', found '%s'", path, k + 1, kw, word[0] ? word : "end of file");
    return MOERL_OK;
}

/* Read a workload file: token ids must be in [0, V), prompt lengths in [1, max_len − 1], response
 * lengths in [1, max_len]. Errors name the file, the group, the value and what was expected. */
static inline int workload_read(workload *w, const char *path, int V, int max_len) {
    memset(w, 0, sizeof *w);
    FILE *f = fopen(path, "r");
    if (!f) return moerl_errorf("workload '%s': cannot open", path);
    int G, n, rc = workload_keyword(f, path, "grpo_workload", -1);
    if (rc == MOERL_OK) rc = workload_int(f, path, "number of groups", -1, 1, 1 << 20, &G);
    if (rc == MOERL_OK) rc = workload_int(f, path, "samples per group", -1, 1, 4096, &n);
    if (rc != MOERL_OK) { fclose(f); return rc; }
    workload_alloc(w, G, n);
    for (int k = 0; k < G && rc == MOERL_OK; k++) {
        rc = workload_keyword(f, path, "prompt", k);
        if (rc == MOERL_OK) rc = workload_int(f, path, "prompt length", k, 1, max_len - 1, &w->plen[k]);
        if (rc != MOERL_OK) break;
        w->prompt[k] = xmalloc((size_t)w->plen[k] * sizeof(int));
        for (int j = 0; j < w->plen[k] && rc == MOERL_OK; j++) rc = workload_int(f, path, "token id", k, 0, V - 1, &w->prompt[k][j]);
        if (rc == MOERL_OK) rc = workload_keyword(f, path, "lengths", k);
        for (int j = 0; j < n && rc == MOERL_OK; j++) rc = workload_int(f, path, "response length", k, 1, max_len, &w->rlen[k * n + j]);
    }
    fclose(f);
    if (rc != MOERL_OK) { workload_free(w); return rc; }
    workload_totals(w);
    if (w->max_plen + w->max_rlen > max_len) {
        const int a = w->max_plen, b = w->max_rlen;
        workload_free(w);
        return moerl_errorf("workload '%s': longest prompt %d + longest response %d exceed %d positions", path, a, b, max_len);
    }
    return MOERL_OK;
}

#endif
