/* Validation as verl reports it (src/rl/validate.h):
 *  1. numpy's generator: val_mt_below draws exactly the indices np.random.choice(n, k) draws after
 *     np.random.seed(42) ($MOERL_TESTDATA/val_metrics.json from tests/ref/gen_val_metrics.py).
 *  2. val_compute_metrics against the Python reference on fixed inputs (greedy, N = 4 with a response
 *     without pred, N = 5 over two data_sources one without pred, N = 16, an "acc" extra field as
 *     the core variable, constant rewards, responses of prompts and data_sources interleaved with a
 *     uid shared by two data_sources, an extra field one response lacks): every metric name, section,
 *     order and value.
 *  3. properties that hold whatever the generator: best@k of equal rewards is that reward (std 0),
 *     maj@k of a unanimous vote is its score, best@k ≥ mean@N ≥ worst@k, best@N with k = N ≥ ...,
 *     majority ties go to the first drawn pred.
 *  4. rollout.val_kwargs.* errors name the key.
 *  5. val_run on a tiny model: N = 1 greedy equals eval_accuracy (the val/accuracy before this
 *     change); N = 4 sampling scores through the callback (rows × N requests with the row's fields),
 *     is reproducible from the seed, and a failing / non-finite callback stops with the row.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/dataset.h"
#include "rl/validate.h"
#include "rl_fixture.h"
#include "test.h"
#include "train/train.h"

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

/* ------------------------------------------------------------------ 1. the generator */

static void test_draws(json_t *draws) {
    size_t i;
    json_t *d;
    json_array_foreach(draws, i, d) {
        const int n = (int)json_integer_value(json_object_get(d, "n"));
        const int k = (int)json_integer_value(json_object_get(d, "k"));
        const int rounds = (int)json_integer_value(json_object_get(d, "rounds"));
        json_t *idx = json_object_get(d, "idx");
        val_mt19937 g;
        val_mt_seed(&g, VAL_BOOTSTRAP_SEED);
        int bad = -1;
        for (int t = 0; t < rounds * k && bad < 0; t++)
            if ((int)val_mt_below(&g, (uint32_t)n) != (int)json_integer_value(json_array_get(idx, t))) bad = t;
        CHECK(bad < 0, "np.random.choice(%d, %d) after seed 42: draw %d differs", n, k, bad);
    }
}

/* ------------------------------------------------------------------ 2. the reference metrics */

/* The samples of a case (borrowing the JSON's strings); extra keys/values allocated per sample. */
static val_sample *read_samples(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    val_sample *s = xcalloc((size_t)*n, sizeof(val_sample));
    for (int i = 0; i < *n; i++) {
        json_t *o = json_array_get(arr, i), *ex = json_object_get(o, "extra"), *pred = json_object_get(o, "pred");
        s[i].data_source = json_string_value(json_object_get(o, "data_source"));
        s[i].uid = json_integer_value(json_object_get(o, "uid"));
        s[i].score = json_number_value(json_object_get(o, "score"));
        s[i].pred = json_is_string(pred) ? json_string_value(pred) : NULL;
        s[i].n_extra = (int)json_object_size(ex);
        char **keys = xcalloc((size_t)s[i].n_extra + 1, sizeof(char *));
        double *vals = xcalloc((size_t)s[i].n_extra + 1, sizeof(double));
        const char *key;
        json_t *v;
        int e = 0;
        json_object_foreach(ex, key, v) {
            keys[e] = (char *)key;
            vals[e++] = json_number_value(v);
        }
        s[i].extra_keys = keys;
        s[i].extra_vals = vals;
    }
    return s;
}

static void free_samples(val_sample *s, int n) {
    for (int i = 0; i < n; i++) {
        free((void *)s[i].extra_keys);
        free((void *)s[i].extra_vals);
    }
    free(s);
}

static void test_reference_case(const char *name, json_t *c) {
    int n;
    val_sample *s = read_samples(json_object_get(c, "samples"), &n);
    val_metrics m = {0};
    CHECK(val_compute_metrics(s, n, &m) == MOERL_OK, "%s: %s", name, moerl_last_error());
    json_t *want = json_object_get(c, "metrics");
    CHECK(m.n == (int)json_object_size(want), "%s: %d metrics, the reference has %d", name, m.n,
          (int)json_object_size(want));
    /* the same names in the same order (verl's order: per variable mean, std, then per k best, worst, maj) */
    const char *key;
    json_t *v;
    int i = 0, order_ok = 1;
    double worst = 0;
    const char *worst_key = "";
    json_object_foreach(want, key, v) {
        if (i >= m.n || strcmp(m.keys[i], key) != 0) order_ok = 0;
        const double got = val_metrics_get(&m, key), ref = json_number_value(v);
        /* 1e-12: the reference sums with numpy's pairwise summation, moerl left to right — the same
         * draws and values, sums of ≤ 1000 terms of size ≤ 2 differ by a few ulps */
        const double err = isnan(got) ? INFINITY : fabs(got - ref);
        if (!(err <= worst)) {
            worst = err;
            worst_key = key;
        }
        i++;
    }
    CHECK(order_ok, "%s: metric names or order differ from the reference", name);
    CHECK(worst <= 1e-12, "%s: worst metric %s off by %g", name, worst_key, worst);
    val_metrics_free(&m);
    free_samples(s, n);
}

static void test_reference(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/val_metrics.json", testdata());
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL, "%s: %s (run tests/ref/gen_val_metrics.py first: bash tests/run.sh gen_val_metrics)", path,
          err.text);
    if (!root) return;
    CHECK(json_integer_value(json_object_get(root, "n_bootstrap")) == VAL_N_BOOTSTRAP &&
              json_integer_value(json_object_get(root, "seed")) == VAL_BOOTSTRAP_SEED,
          "the reference's n_bootstrap and seed are verl's");
    test_draws(json_object_get(root, "draws"));
    const char *name;
    json_t *c;
    json_object_foreach(json_object_get(root, "cases"), name, c) test_reference_case(name, c);
    json_decref(root);
}

/* ------------------------------------------------------------------ 3. properties */

static void test_properties(void) {
    /* equal rewards: best@k = worst@k = the reward, std 0 */
    const double eq[6] = {0.75, 0.75, 0.75, 0.75, 0.75, 0.75};
    const char *p_unan[6] = {"42", "42", "42", "42", "42", "42"};
    val_bootstrap_result b;
    val_bootstrap(eq, p_unan, 6, 4, VAL_N_BOOTSTRAP, VAL_BOOTSTRAP_SEED, &b);
    CHECK(b.best_mean == 0.75 && b.best_std == 0 && b.worst_mean == 0.75 && b.maj_mean == 0.75 && b.maj_std == 0,
          "equal rewards: best %g±%g worst %g maj %g±%g", b.best_mean, b.best_std, b.worst_mean, b.maj_mean, b.maj_std);
    /* a unanimous vote: maj@k = the value of the first drawn response — all 1 here */
    const double v1[5] = {1, 1, 1, 1, 1};
    val_bootstrap(v1, p_unan, 5, 5, VAL_N_BOOTSTRAP, VAL_BOOTSTRAP_SEED, &b);
    CHECK(b.maj_mean == 1 && b.maj_std == 0, "unanimous: maj %g±%g", b.maj_mean, b.maj_std);
    /* majority: "7" drawn 3 times beats "3" drawn twice, worth its first drawn response's value */
    const double mv[5] = {0.1, 0.2, 0.3, 0.4, 0.5};
    const char *mp[5] = {"3", "7", "3", "7", "7"};
    const int idx[5] = {0, 1, 2, 3, 4};
    CHECK(val_majority(mv, mp, idx, 5) == 0.2, "majority 7 (first at 1): %g", val_majority(mv, mp, idx, 5));
    const int tie[4] = {2, 4, 0, 3}; /* "3" twice, "7" twice: the one drawn first ("3" at 2) */
    CHECK(val_majority(mv, mp, tie, 4) == 0.3, "tie to the first drawn: %g", val_majority(mv, mp, tie, 4));
    const char *np_[5] = {"3", NULL, "7", NULL, "3"}; /* no answer twice, first at 1, beats "3" drawn once */
    const int nidx[4] = {0, 1, 2, 3};
    CHECK(val_majority(mv, np_, nidx, 4) == 0.2, "no answer is a vote of its own: %g", val_majority(mv, np_, nidx, 4));
    const int one[1] = {4};
    CHECK(val_majority(mv, mp, one, 1) == 0.5, "one vote");
    /* best@k ≥ mean ≥ worst@k and best@k grows with k, on mixed rewards */
    const double mix[8] = {0, 1, 0, 0, 1, 0, 0.5, 0};
    double prev_best = -1;
    int ks[32];
    const int nk = val_subset_sizes(8, ks);
    CHECK(nk == 3 && ks[0] == 2 && ks[1] == 4 && ks[2] == 8, "subset sizes of 8: %d", nk);
    for (int t = 0; t < nk; t++) {
        val_bootstrap(mix, NULL, 8, ks[t], VAL_N_BOOTSTRAP, VAL_BOOTSTRAP_SEED, &b);
        CHECK(b.best_mean >= 0.3125 && b.worst_mean <= 0.3125 && b.best_mean > prev_best && isnan(b.maj_mean),
              "k=%d: best %g worst %g (mean 0.3125), maj without preds %g", ks[t], b.best_mean, b.worst_mean, b.maj_mean);
        prev_best = b.best_mean;
    }
    CHECK(val_subset_sizes(1, ks) == 0 && val_subset_sizes(2, ks) == 1 && ks[0] == 2, "subset sizes of 1, 2");
    CHECK(val_subset_sizes(5, ks) == 3 && ks[2] == 5 && val_subset_sizes(16, ks) == 4 && ks[3] == 16,
          "subset sizes of 5 and 16");
    /* N = 1: mean@1 only, in val-core; no pred: no maj */
    val_sample s[3] = {{.data_source = "arith", .uid = 0, .score = 1},
                       {.data_source = "arith", .uid = 1, .score = 0},
                       {.data_source = "arith", .uid = 2, .score = 1}};
    val_metrics m = {0};
    CHECK(val_compute_metrics(s, 3, &m) == MOERL_OK && m.n == 1 && strcmp(m.keys[0], "val-core/arith/reward/mean@1") == 0 &&
              fabs(m.vals[0] - 2.0 / 3) < 1e-15,
          "greedy: %d metrics, %s", m.n, m.n ? m.keys[0] : "-");
    val_metrics_free(&m);
    CHECK(val_compute_metrics(s, 0, &m) == MOERL_ERR, "no samples refused");
}

/* ------------------------------------------------------------------ 4. keys */

static void expect_kw_err(const char *const *kv, int n, const char *want, const char *what) {
    cfg *c = cfg_new();
    val_def_keys(c);
    for (int i = 0; i < n; i++) MOERL_ASSERT(cfg_apply_override(c, kv[i]) == MOERL_OK);
    val_kwargs k;
    const int rc = val_read_kwargs(c, &k);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), want), "%s: rc %d, message '%s' (want '%s')", what, rc,
          rc ? moerl_last_error() : "", want);
    cfg_free(c);
}

static void test_keys(void) {
    cfg *c = cfg_new();
    val_def_keys(c);
    val_kwargs k;
    CHECK(val_read_kwargs(c, &k) == MOERL_OK && k.n == 1 && k.temperature == 0 && k.top_p == 1 && k.top_k == -1 &&
              !k.do_sample,
          "verl's defaults: n 1, temperature 0, top_p 1, top_k -1, do_sample false");
    cfg_free(c);
    const char *n0[] = {"rollout.val_kwargs.n=0"};
    expect_kw_err(n0, 1, "rollout.val_kwargs.n must be ≥ 1", "n = 0");
    const char *neg[] = {"rollout.val_kwargs.temperature=-0.5", "rollout.val_kwargs.do_sample=true"};
    expect_kw_err(neg, 2, "rollout.val_kwargs.temperature must be a finite number ≥ 0, got -0.5", "negative temperature");
    const char *t0[] = {"rollout.val_kwargs.n=4", "rollout.val_kwargs.do_sample=true"};
    expect_kw_err(t0, 2, "do_sample=true with rollout.val_kwargs.temperature=0", "sampling at temperature 0");
    const char *greedy4[] = {"rollout.val_kwargs.n=4", "rollout.val_kwargs.temperature=1"};
    expect_kw_err(greedy4, 2, "rollout.val_kwargs.n=4 with rollout.val_kwargs.do_sample=false", "N greedy copies");
    const char *unused[] = {"rollout.val_kwargs.temperature=0.7"};
    expect_kw_err(unused, 1, "are unused with rollout.val_kwargs.do_sample=false", "temperature without do_sample");
    const char *tp[] = {"rollout.val_kwargs.top_p=0"};
    expect_kw_err(tp, 1, "rollout.val_kwargs.top_p must be in (0, 1]", "top_p 0");
    const char *tk[] = {"rollout.val_kwargs.top_k=-2"};
    expect_kw_err(tk, 1, "rollout.val_kwargs.top_k must be", "top_k -2");
}

/* ------------------------------------------------------------------ 5. val_run */

static const char ROWS[] =
    "{\"data_source\":\"arith\",\"prompt\":[{\"role\":\"user\",\"content\":\"2+3=\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"5\"}}\n"
    "{\"data_source\":\"arith\",\"prompt\":[{\"role\":\"user\",\"content\":\"1+1=\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"2\"}}\n"
    "{\"data_source\":\"arith\",\"prompt\":[{\"role\":\"user\",\"content\":\"9-4=\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"5\"}}\n"
    "{\"data_source\":\"countdown\",\"prompt\":[{\"role\":\"user\",\"content\":\"make 7 of 3 4\"}],"
    "\"reward_model\":{\"style\":\"rule\",\"ground_truth\":{\"target\":7,\"numbers\":[3,4]}},\"extra_info\":{\"i\":3}}\n";

/* A callback that records what it was asked and answers from the text: score = (length mod 3)/2,
 * pred = the first character, an "acc" field = score ≥ 0.5; or fails / answers NaN. */
typedef struct {
    int calls, n_reqs, fail, nan_at;
    char **texts;
    char *where0, *ds3, *gt3, *extra3, *prompt0;
    int gt3_json;
} recorder;

static int record_score(void *ctx, const reward_request *reqs, int n, reward_result *out) {
    recorder *r = ctx;
    r->calls++;
    r->n_reqs = n;
    if (r->fail) return moerl_errorf("reward.command 'x': row %s: exited with status 1", reqs[0].where);
    r->texts = xcalloc((size_t)n, sizeof(char *));
    for (int i = 0; i < n; i++) {
        r->texts[i] = xstrdup(reqs[i].solution_str);
        const size_t len = strlen(reqs[i].solution_str);
        out[i].score = i == r->nan_at ? NAN : (double)(len % 3) / 2;
        out[i].pred = xstrdup(len ? (char[]){reqs[i].solution_str[0], 0} : "");
        out[i].n_extra = 1;
        out[i].extra_keys = xmalloc(sizeof(char *));
        out[i].extra_keys[0] = xstrdup("acc");
        out[i].extra_vals = xmalloc(sizeof(double));
        out[i].extra_vals[0] = out[i].score >= 0.5;
    }
    r->where0 = xstrdup(reqs[0].where);
    r->prompt0 = xstrdup(reqs[0].prompt_json ? reqs[0].prompt_json : "");
    if (n > 12) {
        r->ds3 = xstrdup(reqs[12].data_source);
        r->gt3 = xstrdup(reqs[12].ground_truth);
        r->gt3_json = reqs[12].ground_truth_json;
        r->extra3 = xstrdup(reqs[12].extra_info_json ? reqs[12].extra_info_json : "");
    }
    return MOERL_OK;
}

static void recorder_free(recorder *r) {
    for (int i = 0; r->texts && i < r->n_reqs; i++) free(r->texts[i]);
    free(r->texts);
    free(r->where0);
    free(r->ds3);
    free(r->gt3);
    free(r->extra3);
    free(r->prompt0);
    memset(r, 0, sizeof *r);
    r->nan_at = -1;
}

/* The tiny model (seed 11) and the ROWS dataset of the run tests; 0 (checked, nothing held) when the rows fail. */
static int load_fixture(moe_model *m, dataset *ds) {
    rl_tiny_model(m, 11, 0);
    if (dataset_load_string(ds, ROWS, strlen(ROWS), "val.jsonl") == MOERL_OK) return 1;
    CHECK(0, "dataset: %s", moerl_last_error());
    model_free(m);
    return 0;
}

static void test_run(void) {
    moe_model m;
    dataset ds;
    if (!load_fixture(&m, &ds)) return;
    /* N = 1 greedy: the old held-out accuracy and length */
    val_options o = {.kw = {.n = 1, .temperature = 0, .top_p = 1, .top_k = -1, .do_sample = 0}, .n_rows = 3,
                     .max_new_tokens = 12, .max_num_seqs = 8, .seed = 5};
    val_report rep;
    double acc = -1, mlen = -1;
    CHECK(eval_accuracy(&m, &ds, 3, 12, 8, &acc, &mlen) == MOERL_OK, "eval_accuracy: %s", moerl_last_error());
    CHECK(val_run(&m, &ds, &o, NULL, NULL, &rep) == MOERL_OK, "greedy val_run: %s", moerl_last_error());
    CHECK(rep.accuracy == acc && rep.mean_len == mlen && rep.n_responses == 3,
          "greedy = eval_accuracy: accuracy %g vs %g, length %g vs %g", rep.accuracy, acc, rep.mean_len, mlen);
    CHECK(rep.metrics.n == 1 && val_metrics_get(&rep.metrics, "val-core/arith/reward/mean@1") == acc,
          "greedy metrics: %d, mean@1 %g", rep.metrics.n, val_metrics_get(&rep.metrics, "val-core/arith/reward/mean@1"));
    val_report_free(&rep);
    /* N = 4 sampling through the callback: every row's requests, reproducible, seed-dependent */
    o.kw = (val_kwargs){.n = 4, .temperature = 1, .top_p = 1, .top_k = -1, .do_sample = 1};
    o.n_rows = 0;
    recorder a = {.nan_at = -1}, b = {.nan_at = -1}, c = {.nan_at = -1};
    CHECK(val_run(&m, &ds, &o, record_score, &a, &rep) == MOERL_OK, "sampled val_run: %s", moerl_last_error());
    CHECK(a.calls == 1 && a.n_reqs == 16, "one call with rows × N = 16 requests: %d calls, %d", a.calls, a.n_reqs);
    CHECK(has(a.where0, "val.jsonl:1") && a.ds3 && !strcmp(a.ds3, "countdown") && a.gt3_json &&
              has(a.gt3, "\"target\"") && has(a.extra3, "\"i\"") && has(a.prompt0, "2+3="),
          "the row's fields: where %s, data_source %s, ground truth %s, extra %s, prompt %s", a.where0, a.ds3,
          a.gt3, a.extra3, a.prompt0);
    int distinct = 0;
    for (int j = 1; j < 4; j++) distinct += strcmp(a.texts[0], a.texts[j]) != 0;
    CHECK(distinct > 0, "N sampled responses of one prompt differ");
    /* the report is val_compute_metrics of what the callback answered */
    val_sample smp[16];
    char *akey[1] = {"acc"};
    double aval[16];
    for (int t = 0; t < 16; t++) {
        const size_t len = strlen(a.texts[t]);
        aval[t] = (double)(len % 3) / 2 >= 0.5;
        smp[t] = (val_sample){.data_source = t < 12 ? "arith" : "countdown", .uid = t / 4,
                              .score = (double)(len % 3) / 2, .pred = NULL, .n_extra = 1, .extra_keys = akey,
                              .extra_vals = &aval[t]};
    }
    char preds[16][2];
    for (int t = 0; t < 16; t++) {
        preds[t][0] = a.texts[t][0];
        preds[t][1] = 0;
        smp[t].pred = preds[t];
    }
    val_metrics want = {0};
    MOERL_ASSERT(val_compute_metrics(smp, 16, &want) == MOERL_OK);
    int same = want.n == rep.metrics.n;
    for (int i = 0; same && i < want.n; i++)
        same = !strcmp(want.keys[i], rep.metrics.keys[i]) && want.vals[i] == rep.metrics.vals[i];
    CHECK(same, "val_run's metrics are those of the callback's answers (%d vs %d)", rep.metrics.n, want.n);
    CHECK(!isnan(val_metrics_get(&rep.metrics, "val-core/arith/acc/maj@4/mean")) &&
              !isnan(val_metrics_get(&rep.metrics, "val-aux/countdown/reward/std@4")),
          "acc is the core variable; countdown has its own metrics");
    val_metrics_free(&want);
    val_report_free(&rep);
    CHECK(val_run(&m, &ds, &o, record_score, &b, &rep) == MOERL_OK, "second run");
    int equal = 1;
    for (int t = 0; t < 16; t++) equal &= !strcmp(a.texts[t], b.texts[t]);
    CHECK(equal, "the same seed gives the same responses");
    val_report_free(&rep);
    o.seed = 6;
    CHECK(val_run(&m, &ds, &o, record_score, &c, &rep) == MOERL_OK, "other seed");
    int differ = 0;
    for (int t = 0; t < 16; t++) differ += strcmp(a.texts[t], c.texts[t]) != 0;
    CHECK(differ > 0, "another run seed gives other responses");
    val_report_free(&rep);
    recorder_free(&a);
    recorder_free(&b);
    recorder_free(&c);
    /* a failing scorer and a NaN score stop with the row */
    recorder f = {.fail = 1, .nan_at = -1};
    CHECK(val_run(&m, &ds, &o, record_score, &f, &rep) == MOERL_ERR && has(moerl_last_error(), "exited with status 1") &&
              has(moerl_last_error(), "val.jsonl:1"),
          "failing scorer: %s", moerl_last_error());
    recorder_free(&f);
    recorder nn = {.nan_at = 13};
    CHECK(val_run(&m, &ds, &o, record_score, &nn, &rep) == MOERL_ERR && has(moerl_last_error(), "val.jsonl:4") &&
              has(moerl_last_error(), "finite"),
          "NaN score: %s", moerl_last_error());
    recorder_free(&nn);
    /* built-in rewards at N = 4 */
    CHECK(val_run(&m, &ds, &o, NULL, NULL, &rep) == MOERL_OK &&
              !isnan(val_metrics_get(&rep.metrics, "val-core/arith/reward/best@4/mean")) &&
              !isnan(val_metrics_get(&rep.metrics, "val-core/countdown/reward/mean@4")),
          "built-in rewards at N = 4: %s", moerl_last_error());
    val_report_free(&rep);
    /* a prompt longer than the context */
    o.max_new_tokens = 300;
    CHECK(val_run(&m, &ds, &o, NULL, NULL, &rep) == MOERL_ERR && has(moerl_last_error(), "max_position_embeddings"),
          "context: %s", moerl_last_error());
    dataset_free(&ds);
    model_free(&m);
}

/* The paged KV cache's keys reach validation's engine (val_options.block_size, kv_cache_bytes,
 * enable_prefix_caching): with prefix caching the N = 4 samples of a prompt prefill its full blocks once —
 * exactly (N − 1) × block_size × floor((P − 1) / block_size) positions per prompt of P tokens, and the
 * N − 1 followers copy the rest (the tail) from the sample that forwarded it: (N − 1) × P in all
 * (docs/engine.md), plus the leading blocks a prompt shares with an earlier row's (the chat template's) — and a budget too small for the 16 requests preempts; the responses stay those of
 * the default reservation (the re-prefill recomputes the same KV; a different batch shape moves fp32
 * logits by ~1e-6 at most, far from flipping a seeded sample on this model: the texts are compared
 * exactly, as test_paged_engine compares tokens). */
static void test_run_paged(void) {
    moe_model m;
    dataset ds;
    if (!load_fixture(&m, &ds)) return;
    val_options o = {.kw = {.n = 4, .temperature = 1, .top_p = 1, .top_k = -1, .do_sample = 1}, .max_new_tokens = 12,
                     .max_num_seqs = 16, .seed = 5};
    recorder ref = {.nan_at = -1}, shared = {.nan_at = -1}, tight = {.nan_at = -1};
    val_report rep;
    CHECK(val_run(&m, &ds, &o, record_score, &ref, &rep) == MOERL_OK, "default engine: %s", moerl_last_error());
    CHECK(rep.preemptions == 0 && rep.prefix_hit_tokens == 0, "the reservation without sharing: %lld preemptions, "
          "%lld shared", (long long)rep.preemptions, (long long)rep.prefix_hit_tokens);
    val_report_free(&rep);
    const int bs = 4, rows = (int)dataset_count(&ds);
    int64_t want_hits = 0, max_len = 0;
    tok_seq p[8] = {{0}};
    MOERL_ASSERT(rows <= 8);
    for (int i = 0; i < rows; i++) {
        ds_row_encode_prompt(dataset_row(&ds, i), &p[i]);
        max_len = MOERL_MAX(max_len, p[i].n + o.max_new_tokens);
        for (int64_t b = 0; b < (p[i].n - 1) / bs; b++) { /* the leading full blocks, never the last token's */
            int earlier = 0; /* an earlier row's prompt has the same first (b + 1) blocks: chat-template prefix */
            for (int k = 0; k < i && !earlier; k++)
                earlier = (p[k].n - 1) / bs > b && !memcmp(p[k].ids, p[i].ids, (size_t)(b + 1) * bs * sizeof(int32_t));
            want_hits += (int64_t)bs * (o.kw.n - 1 + earlier);
        }
        want_hits += (o.kw.n - 1) * (p[i].n - (p[i].n - 1) / bs * bs); /* the tail, copied from the group's leader */
    }
    for (int i = 0; i < rows; i++) tok_seq_free(&p[i]);
    o.block_size = bs;
    o.enable_prefix_caching = 1;
    CHECK(val_run(&m, &ds, &o, record_score, &shared, &rep) == MOERL_OK, "prefix caching: %s", moerl_last_error());
    CHECK(rep.prefix_hit_tokens == want_hits && want_hits > 0 && rep.preemptions == 0,
          "prefix caching: %lld positions from shared blocks, want %lld; %lld preemptions",
          (long long)rep.prefix_hit_tokens, (long long)want_hits, (long long)rep.preemptions);
    val_report_free(&rep);
    /* room for two of the longest sequences: the 16 requests cannot all run */
    const int64_t block_bytes = 2LL * m.cfg.num_hidden_layers * bs * m.cfg.num_key_value_heads * m.cfg.head_dim * 4;
    o.kv_cache_bytes = block_bytes * 2 * ((max_len + bs - 1) / bs);
    CHECK(val_run(&m, &ds, &o, record_score, &tight, &rep) == MOERL_OK, "tight budget: %s", moerl_last_error());
    CHECK(rep.preemptions > 0 && rep.kv_blocks_total == 2 * ((max_len + bs - 1) / bs) &&
              rep.kv_blocks_peak <= rep.kv_blocks_total,
          "tight budget: %lld preemptions, %lld blocks (peak %lld)", (long long)rep.preemptions,
          (long long)rep.kv_blocks_total, (long long)rep.kv_blocks_peak);
    val_report_free(&rep);
    int same = ref.n_reqs == 16 && shared.n_reqs == 16 && tight.n_reqs == 16;
    for (int t = 0; same && t < 16; t++) same = !strcmp(ref.texts[t], shared.texts[t]) && !strcmp(ref.texts[t], tight.texts[t]);
    CHECK(same, "the responses do not depend on the KV cache's layout");
    /* a budget below one sequence is refused, naming the blocks */
    o.kv_cache_bytes = block_bytes;
    CHECK(val_run(&m, &ds, &o, NULL, NULL, &rep) == MOERL_ERR && has(moerl_last_error(), "val.jsonl:1") &&
              has(moerl_last_error(), "block"),
          "a budget of one block: %s", moerl_last_error());
    recorder_free(&ref);
    recorder_free(&shared);
    recorder_free(&tight);
    dataset_free(&ds);
    model_free(&m);
}

int main(void) {
    test_reference();
    test_properties();
    test_keys();
    test_run();
    test_run_paged();
    TEST_MAIN_END();
}
