/* Held-out validation as verl reports it (rl/validate.h). */
#include "rl/validate.h"
#include "rl/agent_loop.h"

#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/rewards.h"
#include "data/tokenizer.h"
#include "rollout/engine.h"

/* ------------------------------------------------------------------ keys */

void val_def_keys(cfg *c) {
    cfg_def_int(c, "rollout.val_kwargs.n", 1,
                "validation: responses per held-out prompt (metrics val-core/<data_source>/reward/mean@N, best@N, maj@N; "
                "N > 1 needs do_sample)");
    cfg_def_float(c, "rollout.val_kwargs.temperature", 0.0,
                  "validation: sampling temperature (> 0 with do_sample; unused when greedy)");
    cfg_def_float(c, "rollout.val_kwargs.top_p", 1.0, "validation: nucleus sampling, in (0, 1] (1 = off)");
    cfg_def_int(c, "rollout.val_kwargs.top_k", -1, "validation: top-k sampling (-1 or 0 = off)");
    cfg_def_bool(c, "rollout.val_kwargs.do_sample", false,
                 "validation: sample (true) or decode greedily (false: N = 1, today's held-out accuracy)");
}

int val_check_kwargs(const val_kwargs *k) {
    if (k->n < 1)
        return moerl_errorf("rollout.val_kwargs.n must be ≥ 1 (responses per held-out prompt), got %d", k->n);
    if (!(isfinite(k->temperature) && k->temperature >= 0))
        return moerl_errorf("rollout.val_kwargs.temperature must be a finite number ≥ 0, got %g", k->temperature);
    if (!(k->top_p > 0 && k->top_p <= 1))
        return moerl_errorf("rollout.val_kwargs.top_p must be in (0, 1] (1 = off), got %g", k->top_p);
    if (k->top_k < -1)
        return moerl_errorf("rollout.val_kwargs.top_k must be -1 or 0 (off) or a positive count, got %d", k->top_k);
    if (k->do_sample && k->temperature == 0)
        return moerl_errorf("rollout.val_kwargs.do_sample=true with rollout.val_kwargs.temperature=0: sampling needs a "
                            "temperature > 0 (e.g. rollout.val_kwargs.temperature=1.0); or set do_sample=false for "
                            "greedy decoding");
    if (!k->do_sample && k->n > 1)
        return moerl_errorf("rollout.val_kwargs.n=%d with rollout.val_kwargs.do_sample=false: greedy decoding gives %d "
                            "identical responses; set rollout.val_kwargs.do_sample=true (and a temperature > 0) or n=1",
                            k->n, k->n);
    if (!k->do_sample && (k->temperature != 0 || k->top_p != 1 || k->top_k > 0))
        return moerl_errorf("rollout.val_kwargs.temperature=%g, top_p=%g, top_k=%d are unused with "
                            "rollout.val_kwargs.do_sample=false (greedy decoding): set do_sample=true to sample with "
                            "them, or leave them at their defaults (0, 1, -1)",
                            k->temperature, k->top_p, k->top_k);
    return MOERL_OK;
}

int val_read_kwargs(const cfg *c, val_kwargs *k) {
    k->n = (int)cfg_int(c, "rollout.val_kwargs.n");
    k->temperature = (float)cfg_float(c, "rollout.val_kwargs.temperature");
    k->top_p = (float)cfg_float(c, "rollout.val_kwargs.top_p");
    k->top_k = (int)cfg_int(c, "rollout.val_kwargs.top_k");
    k->do_sample = cfg_bool(c, "rollout.val_kwargs.do_sample");
    return val_check_kwargs(k);
}

/* ------------------------------------------------------------------ MT19937 */

void val_mt_seed(val_mt19937 *g, uint32_t seed) {
    g->mt[0] = seed;
    for (int i = 1; i < 624; i++) g->mt[i] = 1812433253u * (g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) + (uint32_t)i;
    g->i = 624;
}

uint32_t val_mt_next(val_mt19937 *g) {
    if (g->i >= 624) {
        for (int k = 0; k < 624; k++) {
            const uint32_t y = (g->mt[k] & 0x80000000u) | (g->mt[(k + 1) % 624] & 0x7fffffffu);
            g->mt[k] = g->mt[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        g->i = 0;
    }
    uint32_t y = g->mt[g->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint32_t val_mt_below(val_mt19937 *g, uint32_t n) {
    const uint32_t r = n - 1;
    if (r == 0) return 0;
    uint32_t mask = r;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    for (;;) {
        const uint32_t v = val_mt_next(g) & mask;
        if (v <= r) return v;
    }
}

/* ------------------------------------------------------------------ statistics */

int val_subset_sizes(int n, int *out) {
    if (n < 2) return 0;
    int c = 0;
    for (int k = 2; k < n; k *= 2) out[c++] = k;
    out[c++] = n;
    return c;
}

/* Two votes are the same: equal preds, or both NULL (no answer extracted: a vote of its own). */
static int pred_eq(const char *a, const char *b) { return a && b ? strcmp(a, b) == 0 : a == b; }

/* mean and population standard deviation of x[0..n) (two passes, as np.mean / np.std) */
static void mean_std(const double *x, int n, double *mean, double *std) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    const double m = s / n;
    double v = 0;
    for (int i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    *mean = m;
    if (std) *std = sqrt(v / n);
}

/* pid[i] = the index of the first of preds[0..n) equal to preds[i]: an id per distinct pred. */
static void pred_ids(const char *const *preds, int n, int *pid) {
    for (int i = 0; i < n; i++) {
        pid[i] = i;
        for (int j = 0; j < i; j++)
            if (pred_eq(preds[j], preds[i])) {
                pid[i] = j;
                break;
            }
    }
}

/* The majority vote of the k drawn responses idx[0..k) by pred id (pid[i] in [0, n): the index of
 * the first response with the same pred), as val_majority; count[n] zeroed, left zeroed. O(k). */
static double majority_ids(const double *vals, const int *pid, const int *idx, int k, int *count) {
    int best = -1;
    for (int j = 0; j < k; j++) count[pid[idx[j]]]++;
    for (int j = 0; j < k; j++) /* in draw order: the first pred reaching the top count wins ties */
        if (best < 0 || count[pid[idx[j]]] > count[pid[idx[best]]]) best = j;
    const double v = vals[idx[best]];
    for (int j = 0; j < k; j++) count[pid[idx[j]]] = 0;
    return v;
}

void val_bootstrap(const double *vals, const char *const *preds, int n, int k, int n_boot, uint32_t seed,
                   val_bootstrap_result *out) {
    double *best = xmalloc((size_t)n_boot * sizeof(double)), *worst = xmalloc((size_t)n_boot * sizeof(double));
    double *maj = preds ? xmalloc((size_t)n_boot * sizeof(double)) : NULL;
    int *idx = xmalloc((size_t)k * sizeof(int)), *pid = xmalloc((size_t)n * sizeof(int));
    int *count = xcalloc((size_t)n, sizeof(int));
    if (preds) pred_ids(preds, n, pid);
    val_mt19937 g;
    val_mt_seed(&g, seed);
    for (int r = 0; r < n_boot; r++) {
        for (int j = 0; j < k; j++) idx[j] = (int)val_mt_below(&g, (uint32_t)n);
        double hi = vals[idx[0]], lo = vals[idx[0]];
        for (int j = 1; j < k; j++) {
            hi = fmax(hi, vals[idx[j]]);
            lo = fmin(lo, vals[idx[j]]);
        }
        best[r] = hi;
        worst[r] = lo;
        if (maj) maj[r] = majority_ids(vals, pid, idx, k, count);
    }
    memset(out, 0, sizeof *out);
    mean_std(best, n_boot, &out->best_mean, &out->best_std);
    mean_std(worst, n_boot, &out->worst_mean, &out->worst_std);
    if (maj) mean_std(maj, n_boot, &out->maj_mean, &out->maj_std);
    else out->maj_mean = out->maj_std = NAN;
    free(best);
    free(worst);
    free(maj);
    free(idx);
    free(pid);
    free(count);
}

double val_majority(const double *vals, const char *const *preds, const int *idx, int k) {
    int n = 0;
    for (int j = 0; j < k; j++) n = MOERL_MAX(n, idx[j] + 1);
    int *pid = xmalloc((size_t)n * sizeof(int)), *count = xcalloc((size_t)n, sizeof(int));
    pred_ids(preds, n, pid);
    const double v = majority_ids(vals, pid, idx, k, count);
    free(pid);
    free(count);
    return v;
}

/* ------------------------------------------------------------------ named metrics */

void val_metrics_free(val_metrics *m) {
    for (int i = 0; i < m->n; i++) free(m->keys[i]);
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static int metrics_find(const val_metrics *m, const char *key) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) return i;
    return -1;
}

double val_metrics_get(const val_metrics *m, const char *key) {
    const int i = metrics_find(m, key);
    return i < 0 ? NAN : m->vals[i];
}

static void metrics_put(val_metrics *m, const char *key, double v) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 32;
        m->keys = xrealloc(m->keys, (size_t)m->cap * sizeof(char *));
        m->vals = xrealloc(m->vals, (size_t)m->cap * sizeof(double));
    }
    m->keys[m->n] = xstrdup(key);
    m->vals[m->n++] = v;
}

/* Per-metric sums over the prompts of one (data_source, variable): the mean over the prompts
 * that have the metric (verl: np.mean of the per-prompt values). */
typedef struct {
    val_metrics sum;
    int *count;
} metric_acc;

static void acc_add(metric_acc *a, const char *name, double v) {
    int i = metrics_find(&a->sum, name);
    if (i < 0) {
        metrics_put(&a->sum, name, 0);
        i = a->sum.n - 1;
        a->count = xrealloc(a->count, (size_t)a->sum.cap * sizeof(int));
        a->count[i] = 0;
    }
    a->sum.vals[i] += v;
    a->count[i]++;
}

/* One prompt's metrics of one variable (vals[0..n), preds or NULL) into a. */
static void prompt_metrics(metric_acc *a, const double *vals, const char *const *preds, int n) {
    char name[64];
    double mean, std;
    mean_std(vals, n, &mean, &std);
    snprintf(name, sizeof name, "mean@%d", n);
    acc_add(a, name, mean);
    if (n < 2) return;
    snprintf(name, sizeof name, "std@%d", n);
    acc_add(a, name, std);
    int ks[32];
    const int nk = val_subset_sizes(n, ks);
    for (int t = 0; t < nk; t++) {
        val_bootstrap_result b;
        val_bootstrap(vals, preds, n, ks[t], VAL_N_BOOTSTRAP, VAL_BOOTSTRAP_SEED, &b);
        const struct { const char *what; double v; } put[] = {
            {"best@%d/mean", b.best_mean}, {"best@%d/std", b.best_std}, {"worst@%d/mean", b.worst_mean},
            {"worst@%d/std", b.worst_std}, {"maj@%d/mean", b.maj_mean}, {"maj@%d/std", b.maj_std}};
        for (int p = 0; p < (preds ? 6 : 4); p++) {
            snprintf(name, sizeof name, put[p].what, ks[t]);
            acc_add(a, name, put[p].v);
        }
    }
}

/* The k of a metric name "<stat>@k[/...]" (0 if none). */
static int metric_k(const char *name) {
    const char *at = strchr(name, '@');
    return at ? atoi(at + 1) : 0;
}

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* Name one (data_source, variable)'s averaged metrics into out: val-core for the core variable's
 * mean@/maj@/best@ at the largest k, val-aux for the rest. */
static void name_metrics(val_metrics *out, const char *ds, const char *var, int is_core_var, const metric_acc *a) {
    int k_max = 0;
    for (int i = 0; i < a->sum.n; i++) k_max = MOERL_MAX(k_max, metric_k(a->sum.keys[i]));
    for (int i = 0; i < a->sum.n; i++) {
        const char *m = a->sum.keys[i];
        const int core = is_core_var && metric_k(m) == k_max &&
                         (starts_with(m, "mean") || starts_with(m, "maj") || starts_with(m, "best"));
        const size_t len = strlen(ds) + strlen(var) + strlen(m) + 16;
        char *key = xmalloc(len);
        snprintf(key, len, "%s/%s/%s/%s", core ? "val-core" : "val-aux", ds, var, m);
        metrics_put(out, key, a->sum.vals[i] / a->count[i]);
        free(key);
    }
}

/* The value of variable `var` of sample s into *v ("reward": the score, else the extra field var):
 * 1, or 0 when s lacks it. */
static int sample_var(const val_sample *s, const char *var, double *v) {
    if (strcmp(var, "reward") == 0) {
        *v = s->score;
        return 1;
    }
    for (int e = 0; e < s->n_extra; e++)
        if (strcmp(s->extra_keys[e], var) == 0) {
            *v = s->extra_vals[e];
            return 1;
        }
    return 0;
}

/* The samples grouped by prompt: order[] lists the sample indices prompt by prompt (by index
 * within one), groups in order of their first sample; ds_of[i] is sample i's data_source id (in
 * order of first appearance, names in ds_names). */
typedef struct {
    int n_ds, n_groups;
    const char **ds_names;
    int *ds_of, *order;
    struct val_group { int ds, first, start, len; } *groups;
} val_grouping;

typedef struct {
    int ds;
    int64_t uid;
    int i;
} group_key;

static int group_key_cmp(const void *pa, const void *pb) {
    const group_key *a = pa, *b = pb;
    if (a->ds != b->ds) return a->ds < b->ds ? -1 : 1;
    if (a->uid != b->uid) return a->uid < b->uid ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

static int group_first_cmp(const void *pa, const void *pb) {
    const struct val_group *a = pa, *b = pb;
    return (a->first > b->first) - (a->first < b->first);
}

static void group_samples(const val_sample *samples, int n, val_grouping *G) {
    memset(G, 0, sizeof *G);
    G->ds_names = xmalloc((size_t)n * sizeof(char *));
    G->ds_of = xmalloc((size_t)n * sizeof(int));
    G->order = xmalloc((size_t)n * sizeof(int));
    G->groups = xmalloc((size_t)n * sizeof(struct val_group));
    group_key *k = xmalloc((size_t)n * sizeof(group_key));
    for (int i = 0; i < n; i++) {
        /* consecutive samples mostly share one: the previous sample's first */
        int d = i > 0 && strcmp(G->ds_names[G->ds_of[i - 1]], samples[i].data_source) == 0 ? G->ds_of[i - 1] : -1;
        if (d < 0) {
            for (d = 0; d < G->n_ds && strcmp(G->ds_names[d], samples[i].data_source) != 0; d++) {}
            if (d == G->n_ds) G->ds_names[G->n_ds++] = samples[i].data_source;
        }
        G->ds_of[i] = d;
        k[i] = (group_key){.ds = d, .uid = samples[i].uid, .i = i};
    }
    qsort(k, (size_t)n, sizeof *k, group_key_cmp);
    for (int i = 0; i < n; i++) {
        G->order[i] = k[i].i;
        if (i == 0 || k[i].ds != k[i - 1].ds || k[i].uid != k[i - 1].uid)
            G->groups[G->n_groups++] = (struct val_group){.ds = k[i].ds, .first = k[i].i, .start = i, .len = 0};
        G->groups[G->n_groups - 1].len++;
    }
    qsort(G->groups, (size_t)G->n_groups, sizeof *G->groups, group_first_cmp);
    free(k);
}

static void grouping_free(val_grouping *G) {
    free(G->ds_names);
    free(G->ds_of);
    free(G->order);
    free(G->groups);
}

/* The variables of data_source d: "reward", then every extra field of its first sample that every
 * sample of d has (a field named "reward" or "pred" is skipped: the score and the vote have them). */
static int ds_variables(const val_sample *samples, int n, const val_grouping *G, int d, const char **vars, int cap) {
    int nv = 0, first = -1;
    vars[nv++] = "reward";
    for (int i = 0; i < n && first < 0; i++)
        if (G->ds_of[i] == d) first = i;
    for (int e = 0; first >= 0 && e < samples[first].n_extra && nv < cap; e++) {
        const char *key = samples[first].extra_keys[e];
        if (strcmp(key, "reward") == 0 || strcmp(key, "pred") == 0) continue;
        int everywhere = 1;
        double v;
        for (int i = 0; i < n && everywhere; i++)
            if (G->ds_of[i] == d) everywhere = sample_var(&samples[i], key, &v);
        if (everywhere) vars[nv++] = key;
    }
    return nv;
}

/* Every prompt of data_source d, for variable var, into a: with majority votes when some response
 * of d has a pred (a response without one votes "no answer"). */
static void ds_var_metrics(const val_sample *samples, int n, const val_grouping *G, int d, const char *var,
                           metric_acc *a, double *vals, const char **preds) {
    int any_pred = 0;
    for (int i = 0; i < n && !any_pred; i++) any_pred = G->ds_of[i] == d && samples[i].pred != NULL;
    for (int g = 0; g < G->n_groups; g++) {
        const struct val_group *gr = &G->groups[g];
        if (gr->ds != d) continue;
        for (int j = 0; j < gr->len; j++) {
            const val_sample *s = &samples[G->order[gr->start + j]];
            sample_var(s, var, &vals[j]);
            preds[j] = s->pred;
        }
        prompt_metrics(a, vals, any_pred ? preds : NULL, gr->len);
    }
}

int val_compute_metrics(const val_sample *samples, int n, val_metrics *out) {
    if (n <= 0) return moerl_errorf("validation: no scored responses to compute metrics from");
    val_grouping G;
    group_samples(samples, n, &G);
    double *vals = xmalloc((size_t)n * sizeof(double));
    const char **preds = xmalloc((size_t)n * sizeof(char *));
    for (int d = 0; d < G.n_ds; d++) {
        const char *vars[64];
        const int nv = ds_variables(samples, n, &G, d, vars, 64);
        int has_acc = 0;
        for (int v = 0; v < nv; v++) has_acc |= strcmp(vars[v], "acc") == 0;
        const char *core = has_acc ? "acc" : "reward";
        for (int v = 0; v < nv; v++) {
            metric_acc a = {0};
            ds_var_metrics(samples, n, &G, d, vars[v], &a, vals, preds);
            name_metrics(out, G.ds_names[d], vars[v], strcmp(vars[v], core) == 0, &a);
            val_metrics_free(&a.sum);
            free(a.count);
        }
    }
    free(vals);
    free(preds);
    grouping_free(&G);
    return MOERL_OK;
}

/* ------------------------------------------------------------------ a validation run */

void val_report_free(val_report *r) { val_metrics_free(&r->metrics); }

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* The seed of response j of row i: from the run seed, the row and j only (reproducible, the same at
 * every validation of a run, independent of batching). */
static uint64_t response_seed(uint64_t seed, int64_t row, int j) {
    return mix64(mix64(seed ^ 0x76616c6964617465ULL) ^ ((uint64_t)row * 1000003ULL + (uint64_t)j));
}

static void free_result(reward_result *r) {
    for (int i = 0; i < r->n_extra; i++) free(r->extra_keys[i]);
    free(r->extra_keys);
    free(r->extra_vals);
    free(r->pred);
    memset(r, 0, sizeof *r);
}

/* The built-in rewards (reward_score) with their extracted answers. */
static int builtin_score(const reward_request *reqs, int n, reward_result *out) {
    for (int i = 0; i < n; i++) {
        const reward_request *q = &reqs[i];
        if (reward_score(q->data_source, q->solution_str, q->ground_truth, &out[i].score, &out[i].pred) != MOERL_OK)
            return moerl_error_prefix("validation, row %s: ", q->where ? q->where : "?");
    }
    return MOERL_OK;
}

/* The prompt's messages as a JSON list's text (heap). */
static char *prompt_json(const ds_row *r) {
    json_t *a = json_array();
    for (int i = 0; i < r->n_prompt; i++)
        json_array_append_new(a, json_pack("{s:s, s:s}", "role", r->prompt[i].role ? r->prompt[i].role : "",
                                           "content", r->prompt[i].content ? r->prompt[i].content : ""));
    char *s = json_dumps(a, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(a);
    return s;
}

/* Generation: the responses' texts and lengths, response j of row i at [i·N + j]. */
typedef struct {
    int64_t rows;
    int N;
    char **text;
    int *len;
    agent_traj *traj; /* multi-turn: what each trajectory did; NULL: one turn */
    int round;        /* this process's validation count (trajectory ids "valROUND-ID") */
    int64_t preemptions, prefix_hit_tokens, kv_blocks_total, kv_blocks_peak; /* the engine's, at the end */
} val_gen;

static void val_gen_free(val_gen *g) {
    for (int64_t i = 0; g->text && i < g->rows * g->N; i++) free(g->text[i]);
    free(g->text);
    free(g->len);
    free(g->traj);
}

/* Multi-turn: the agent loop of a validation run (its own environment programs). */
typedef struct {
    tool_config tools;
    agent_loop *A;
} val_agent;

static int val_agent_open(val_agent *v, const multi_turn_config *mt) {
    memset(v, 0, sizeof *v);
    if (!mt || !mt->enable) return MOERL_OK;
    if (tool_config_load(mt->tool_config_path, &v->tools) != MOERL_OK) return MOERL_ERR;
    v->A = agent_loop_create(mt, &v->tools, &mt->env);
    return v->A ? MOERL_OK : moerl_error_prefix("validation: ");
}

static void val_agent_close(val_agent *v) {
    agent_loop_free(v->A);
    tool_config_free(&v->tools);
}

/* A request the engine returned ended a turn: 1 if its trajectory ended (always, in one turn), 0 if it
 * goes on, MOERL_ERR. */
static int val_turn_end(val_agent *v, engine *e, gen_request *r, const dataset *ds, val_gen *g) {
    if (!v->A) return 1;
    char id[64]; /* unique over the run's validations: an environment may key episodes by it */
    snprintf(id, sizeof id, "val%d-%lld", g->round, (long long)r->id);
    const int64_t i = r->id / g->N;
    return agent_loop_turn_end(v->A, e, r, &g->traj[r->id], dataset_row(ds, i), id);
}

static void val_record(val_gen *g, const gen_request *r) {
    size_t tl;
    g->text[r->id] = tok_decode(r->out_tokens, r->n_out, true, &tl);
    if (!g->text[r->id]) g->text[r->id] = xstrdup("");
    g->len[r->id] = r->n_out;
}

/* The requests of rows [0, rows) of ds into the engine and run it to the end. */
static int generate(engine *e, const dataset *ds, tok_seq *prompts, const val_options *o, val_gen *g) {
    const int64_t total = g->rows * g->N;
    gen_request *reqs = xcalloc((size_t)total, sizeof(gen_request));
    gen_request **done = xmalloc((size_t)(total + 1) * sizeof(gen_request *));
    int rc = MOERL_OK;
    int64_t added = 0, finished = 0;
    for (int64_t i = 0; i < g->rows && rc == MOERL_OK; i++)
        for (int j = 0; j < g->N && rc == MOERL_OK; j++) {
            gen_request *r = &reqs[i * g->N + j];
            r->id = i * g->N + j;
            r->prompt = prompts[i].ids;
            r->prompt_len = (int)prompts[i].n;
            r->sp.temperature = o->kw.do_sample ? o->kw.temperature : 0;
            r->sp.top_p = o->kw.do_sample ? o->kw.top_p : 1;
            r->sp.top_k = o->kw.do_sample && o->kw.top_k > 0 ? o->kw.top_k : 0;
            r->sp.seed = response_seed(o->seed, i, j);
            r->sp.max_tokens = o->max_new_tokens;
            if (engine_add(e, r) != MOERL_OK) {
                char where[512];
                moerl_error_prefix("validation, row %s: ", dataset_where(ds, dataset_row(ds, i)->line, where, sizeof where));
                rc = MOERL_ERR;
            } else {
                added++;
            }
        }
    val_agent v = {0}; /* zero when a request was refused above: nothing to open or close */
    if (rc == MOERL_OK && val_agent_open(&v, o->multi_turn) != MOERL_OK) {
        rc = MOERL_ERR;
        v.A = NULL;
        v.tools = (tool_config){0};
    }
    if (v.A) {
        static _Atomic int rounds;
        g->traj = xcalloc((size_t)total, sizeof(agent_traj));
        g->round = atomic_fetch_add(&rounds, 1);
    }
    while (rc == MOERL_OK && finished < total) {
        const int k = engine_num_unfinished(e) > 0 ? engine_step(e, done, (int)total + 1) : 0;
        if (k < 0) rc = MOERL_ERR;
        for (int d = 0; d < k && rc == MOERL_OK; d++) {
            const int ended = val_turn_end(&v, e, done[d], ds, g);
            if (ended < 0) rc = MOERL_ERR;
            else if (ended) {
                val_record(g, done[d]);
                finished++;
            }
        }
        if (rc == MOERL_OK && v.A && agent_loop_waiting(v.A) > 0) { /* tool answers: wait only when idle */
            const int p = agent_loop_poll(v.A, e, done, (int)total + 1, engine_num_unfinished(e) > 0 ? 0 : 0.005);
            if (p < 0) rc = MOERL_ERR;
            for (int d = 0; d < p; d++, finished++) val_record(g, done[d]);
        }
    }
    val_agent_close(&v);
    if (rc != MOERL_OK && added > finished) engine_abort(e, done, (int)total + 1);
    for (int64_t i = 0; i < total; i++) gen_request_free_outputs(&reqs[i]);
    free(reqs);
    free(done);
    return rc;
}

/* Prompts through the chat template; the engine; the responses into g. */
static int run_engine(const moe_model *m, const dataset *ds, const val_options *o, val_gen *g) {
    tok_seq *prompts = xcalloc((size_t)g->rows, sizeof(tok_seq));
    int max_plen = 0, rc = MOERL_ERR;
    for (int64_t i = 0; i < g->rows; i++) {
        const ds_row *r = dataset_row(ds, i);
        ds_row_encode_prompt(r, &prompts[i]); /* with the row's tools, as the rollouts' prompts */
        max_plen = MOERL_MAX(max_plen, (int)prompts[i].n);
    }
    engine *e = NULL;
    if (m->cfg.max_position_embeddings > 0 && max_plen + o->max_new_tokens > m->cfg.max_position_embeddings) {
        moerl_errorf("validation: the longest prompt of %s (%d tokens) + %d new tokens exceeds the model's context "
                     "max_position_embeddings %d", ds->path ? ds->path : "the data", max_plen, o->max_new_tokens,
                     m->cfg.max_position_embeddings);
        goto out;
    }
    engine_config ec = {.max_num_seqs = o->max_num_seqs, .max_model_len = max_plen + o->max_new_tokens,
                        .max_num_batched_tokens = MOERL_MAX(512, o->max_num_seqs), .block_size = o->block_size,
                        .kv_cache_bytes = o->kv_cache_bytes, .gpu_memory_utilization = o->gpu_memory_utilization,
                        .enable_prefix_caching = o->enable_prefix_caching};
    e = engine_create(&m->cfg, ec);
    if (!e) {
        moerl_error_prefix("validation: ");
        goto out;
    }
    if (engine_load_weights(e, m->params, m->n_params, 0) != MOERL_OK) goto out;
    rc = generate(e, ds, prompts, o, g);
    const engine_stats es = engine_get_stats(e);
    g->preemptions = es.preemptions;
    g->prefix_hit_tokens = es.prefix_hit_tokens;
    g->kv_blocks_total = es.kv_blocks_total;
    g->kv_blocks_peak = es.kv_blocks_peak;
out:
    for (int64_t i = 0; i < g->rows; i++) tok_seq_free(&prompts[i]);
    free(prompts);
    engine_free(e);
    return rc;
}

/* Score every response (one call) and fill out. */
/* Whether a response counts as correct for val/accuracy: the reward's own numeric "acc" field when
 * it returns one (verl's reward programs report correctness there; the score may be shaped, e.g.
 * 0.5 for a right answer), else score ≥ 1 (the built-in rules score 1 for a right answer). */
static int response_correct(const reward_result *r) {
    for (int k = 0; k < r->n_extra; k++)
        if (!strcmp(r->extra_keys[k], "acc")) return r->extra_vals[k] != 0;
    return r->score >= 1.0;
}

static int score_all(const dataset *ds, const val_gen *g, val_score_fn score, void *ctx, val_report *out) {
    const int total = (int)(g->rows * g->N);
    reward_request *reqs = xcalloc((size_t)total, sizeof(reward_request));
    reward_result *res = xcalloc((size_t)total, sizeof(reward_result));
    val_sample *smp = xcalloc((size_t)total, sizeof(val_sample));
    char **where = xcalloc((size_t)g->rows, sizeof(char *)), **pj = xcalloc((size_t)g->rows, sizeof(char *));
    for (int64_t i = 0; i < g->rows; i++) {
        const ds_row *r = dataset_row(ds, i);
        char buf[1024];
        where[i] = xstrdup(dataset_where(ds, r->line, buf, sizeof buf));
        pj[i] = prompt_json(r);
        for (int j = 0; j < g->N; j++)
            reqs[i * g->N + j] = (reward_request){.data_source = r->data_source, .solution_str = g->text[i * g->N + j],
                                                  .ground_truth = r->ground_truth,
                                                  .ground_truth_json = r->ground_truth_json,
                                                  .extra_info_json = r->extra_info_json, .prompt_json = pj[i],
                                                  .where = where[i]};
    }
    /* the environment's reward is the score of its trajectories: the others are scored (in order) */
    int m = 0;
    for (int t = 0; t < total; t++)
        if (!(g->traj && g->traj[t].has_env_reward)) reqs[m++] = reqs[t];
    int rc = m == 0 ? MOERL_OK : score ? score(ctx, reqs, m, res) : builtin_score(reqs, m, res);
    for (int t = total - 1, k = m - 1; rc == MOERL_OK && m < total && t >= 0; t--) { /* back into place */
        if (g->traj[t].has_env_reward) {
            res[t] = (reward_result){.score = g->traj[t].env_reward};
            const ds_row *r = dataset_row(ds, t / g->N);
            reqs[t] = (reward_request){.data_source = r->data_source, .where = where[t / g->N]};
        } else {
            res[t] = res[k];
            reqs[t] = reqs[k--];
        }
    }
    double correct = 0, len_sum = 0, turns = 0, calls = 0, malformed = 0;
    for (int t = 0; rc == MOERL_OK && t < total; t++) {
        if (!isfinite(res[t].score)) {
            rc = moerl_errorf("validation, row %s: the reward is %g, expected a finite number", reqs[t].where,
                              res[t].score);
            break;
        }
        smp[t] = (val_sample){.data_source = reqs[t].data_source, .uid = t / g->N, .score = res[t].score,
                              .pred = res[t].pred, .n_extra = res[t].n_extra, .extra_keys = res[t].extra_keys,
                              .extra_vals = res[t].extra_vals};
        correct += response_correct(&res[t]);
        len_sum += g->len[t];
        if (g->traj) {
            turns += g->traj[t].turns;
            calls += g->traj[t].tool_calls;
            malformed += g->traj[t].malformed_calls;
        }
    }
    if (rc == MOERL_OK) rc = val_compute_metrics(smp, total, &out->metrics);
    out->n_responses = total;
    out->accuracy = correct / total;
    out->mean_len = len_sum / total;
    out->mean_turns = g->traj ? turns / total : 0;
    out->well_formed_rate = calls > 0 ? (calls - malformed) / calls : NAN;
    if (rc == MOERL_OK && g->traj) { /* beside verl's metrics, for every data source together */
        metrics_put(&out->metrics, "val-aux/num_turns/mean", out->mean_turns);
        metrics_put(&out->metrics, "val-aux/tool_calls/well_formed_rate", out->well_formed_rate);
    }
    for (int t = 0; t < total; t++) free_result(&res[t]);
    for (int64_t i = 0; i < g->rows; i++) {
        free(where[i]);
        free(pj[i]);
    }
    free(where);
    free(pj);
    free(reqs);
    free(res);
    free(smp);
    return rc;
}

int val_run(const moe_model *m, const dataset *ds, const val_options *o, val_score_fn score, void *ctx,
            val_report *out) {
    memset(out, 0, sizeof *out);
    if (val_check_kwargs(&o->kw) != MOERL_OK) return MOERL_ERR;
    int64_t rows = dataset_count(ds);
    if (o->n_rows > 0 && o->n_rows < rows) rows = o->n_rows;
    if (rows == 0) return moerl_errorf("validation: dataset '%s' is empty", ds->path ? ds->path : "?");
    val_gen g = {.rows = rows, .N = o->kw.n};
    g.text = xcalloc((size_t)(rows * g.N), sizeof(char *));
    g.len = xcalloc((size_t)(rows * g.N), sizeof(int));
    int rc = run_engine(m, ds, o, &g);
    if (rc == MOERL_OK) rc = score_all(ds, &g, score, ctx, out);
    out->preemptions = g.preemptions;
    out->prefix_hit_tokens = g.prefix_hit_tokens;
    out->kv_blocks_total = g.kv_blocks_total;
    out->kv_blocks_peak = g.kv_blocks_peak;
    val_gen_free(&g);
    if (rc != MOERL_OK) val_report_free(out);
    return rc;
}
