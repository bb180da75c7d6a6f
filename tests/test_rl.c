/* Tests of the main job's core (fully-async GRPO, src/rl): the staleness budget's arithmetic and
 * counter rules (verl recipe/fully_async_policy/README.md; docs/rl.md), the rollouter driven
 * directly with a MessageQueue (admission within max_required_samples, counter re-basing at a
 * version change, partial rollout with interrupt/resume and per-token versions, drain-before-sync
 * without partial rollout), and the trainer with lr = 0 (weights unchanged, recomputed logprobs
 * equal the engine's behaviour logprobs across syncs: the train/rollout mismatch stays flat).
 * Uses a tiny random Qwen3-MoE and a small generated arith dataset written under
 * $MOERL_TESTDATA (or /tmp) in a mkdtemp folder. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "data/dataset.h"
#include "data/tasks.h"
#include "model/forward.h"
#include "model/model.h"
#include "rl/queue.h"
#include "rl/rl.h"
#include "rl/staleness.h"
#include "rollout/engine.h"
#include "rl_fixture.h"
#include "test.h"
#include "train/train.h"

/* ------------------------------------------------------------------ fixtures */

static char g_dir[4096], g_train_path[4200], g_test_path[4200];
static dataset g_train;

static void setup_data(void) {
    const char *base = getenv("MOERL_TESTDATA");
    if (!base || !base[0]) base = "/tmp";
    MOERL_ASSERT(moerl_mkdirs(base) == MOERL_OK);
    snprintf(g_dir, sizeof g_dir, "%s/test_rl_XXXXXX", base);
    MOERL_ASSERT(mkdtemp(g_dir) != NULL);
    snprintf(g_train_path, sizeof g_train_path, "%s/arith-train.jsonl", g_dir);
    snprintf(g_test_path, sizeof g_test_path, "%s/arith-test.jsonl", g_dir);
    task_opts o;
    task_opts_default(&o);
    o.n_train = 40;
    o.n_test = 4;
    o.seed = 7;
    o.arith_digits = 2;
    CHECK(task_generate("arith", &o, g_train_path, g_test_path) == MOERL_OK, "task_generate: %s", moerl_last_error());
    CHECK(dataset_load(&g_train, g_train_path) == MOERL_OK, "dataset_load: %s", moerl_last_error());
    CHECK(dataset_count(&g_train) == 40, "rows %lld", (long long)dataset_count(&g_train));
}

static void teardown_data(void) {
    dataset_free(&g_train);
    unlink(g_train_path);
    unlink(g_test_path);
    rmdir(g_dir);
}


static rl_config base_config(void) { return rl_test_config(); }

static int64_t started(const rollouter *R, int64_t total) { return total - R->prompts_left; }

/* ------------------------------------------------------------------ staleness arithmetic */

/* Every (mini-batch, require_batches, trigger, threshold) of a grid against an independent
 * integer computation: thresholds are pct/100, so max_required_samples = ⌊W·(100+pct)/100⌋
 * exactly in integers (this includes cases where W·(1+s) is an integer that binary floating
 * point lands just below, e.g. 90·(1+0.4) = 125.99999999999999 and 50·(1+1.3) = 114.99999999999999). */
static void test_staleness_init_grid(void) {
    const int mbs[] = {1, 2, 3, 4, 5, 7, 10, 16};
    const int rbs[] = {1, 2, 3};
    const int trigs[] = {1, 2, 3, 4, 10};
    const int pcts[] = {0, 1, 10, 20, 25, 29, 30, 33, 40, 50, 60, 70, 90, 99, 100, 110, 130, 170, 200, 300};
    int bad = 0;
    for (size_t a = 0; a < sizeof mbs / sizeof *mbs; a++)
        for (size_t b = 0; b < sizeof rbs / sizeof *rbs; b++)
            for (size_t t = 0; t < sizeof trigs / sizeof *trigs; t++)
                for (size_t p = 0; p < sizeof pcts / sizeof *pcts; p++) {
                    staleness_budget sb;
                    int mb = mbs[a], rb = rbs[b], tr = trigs[t], pct = pcts[p];
                    if (staleness_init(&sb, mb, rb, tr, pct / 100.0) != MOERL_OK) {
                        bad++;
                        continue;
                    }
                    int req = mb * rb, W = tr * req;
                    int maxr = (int)(((int64_t)W * (100 + pct)) / 100);
                    int lag = (maxr + W - 1) / W - 1;
                    if (sb.required_samples != req || sb.window != W || sb.max_required_samples != maxr ||
                        sb.lag_bound != lag || sb.counter != 0) {
                        if (bad++ < 10)
                            fprintf(stderr,
                                    "  staleness_init(%d,%d,%d,%.2f): req %d W %d max %d lag %d counter %lld; want "
                                    "%d %d %d %d 0\n",
                                    mb, rb, tr, pct / 100.0, sb.required_samples, sb.window,
                                    sb.max_required_samples, sb.lag_bound, (long long)sb.counter, req, W, maxr, lag);
                    }
                }
    CHECK(bad == 0, "%d staleness_init grid cases wrong", bad);
}

/* Named cases, written out by hand (the numbers a reader checks against verl's README). */
static void test_staleness_init_cases(void) {
    struct {
        int mb, rb, trig;
        double s;
        int req, W, maxr, lag;
    } cs[] = {
        {4, 1, 1, 0.5, 4, 4, 6, 1},    /* the smoke config */
        {4, 1, 1, 0.0, 4, 4, 4, 0},    /* on-policy streaming */
        {4, 1, 1, 1.0, 4, 4, 8, 1},    /* 2W, still one version of lag */
        {4, 1, 1, 1.25, 4, 4, 9, 2},
        {10, 1, 1, 0.3, 10, 10, 13, 1}, /* 0.3·10 = 3 extra prompts */
        {5, 2, 1, 0.3, 10, 10, 13, 1},  /* the same W through require_batches */
        {1, 1, 10, 0.3, 1, 10, 13, 1},  /* the same W through trigger_parameter_sync_step */
        {2, 1, 5, 0.3, 2, 10, 13, 1},
        {10, 1, 9, 0.4, 10, 90, 126, 1}, /* 90·(1+0.4) = 125.99999999999999 in doubles: must give 126 */
        {5, 1, 10, 1.3, 5, 50, 115, 2},  /* 50·(1+1.3) = 114.99999999999999 */
        {9, 5, 1, 0.4, 45, 45, 63, 1},   /* 45·(1+0.4) = 62.99999999999999 */
        {3, 1, 1, 0.3, 3, 3, 3, 0},     /* 3.9 floors to 3: no extra prompt */
        {7, 1, 3, 0.3, 7, 21, 27, 1},   /* 27.3 → 27 */
        {8, 2, 2, 2.0, 16, 32, 96, 2},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        staleness_budget b;
        int rc = staleness_init(&b, cs[i].mb, cs[i].rb, cs[i].trig, cs[i].s);
        CHECK(rc == MOERL_OK, "case %zu: %s", i, moerl_last_error());
        CHECK(b.required_samples == cs[i].req && b.window == cs[i].W && b.max_required_samples == cs[i].maxr &&
                  b.lag_bound == cs[i].lag,
              "case %zu (%d,%d,%d,%g): got req %d W %d max %d lag %d, want %d %d %d %d", i, cs[i].mb, cs[i].rb,
              cs[i].trig, cs[i].s, b.required_samples, b.window, b.max_required_samples, b.lag_bound, cs[i].req,
              cs[i].W, cs[i].maxr, cs[i].lag);
    }
}

static void test_staleness_errors(void) {
    staleness_budget b;
    struct {
        int mb, rb, trig;
        double s;
        const char *key;
    } cs[] = {
        {0, 1, 1, 0.3, "ppo_mini_batch_size"},
        {-2, 1, 1, 0.3, "ppo_mini_batch_size"},
        {4, 0, 1, 0.3, "require_batches"},
        {4, 1, 0, 0.3, "trigger_parameter_sync_step"},
        {4, 1, 1, -0.1, "staleness_threshold"},
        {4, 1, 1, NAN, "staleness_threshold"},
        {4, 1, 1, INFINITY, "staleness_threshold"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        int rc = staleness_init(&b, cs[i].mb, cs[i].rb, cs[i].trig, cs[i].s);
        CHECK(rc == MOERL_ERR, "case %zu accepted", i);
        CHECK(strstr(moerl_last_error(), cs[i].key) != NULL, "case %zu: message '%s' does not name %s", i,
              moerl_last_error(), cs[i].key);
    }
}

static void test_staleness_counter(void) {
    staleness_budget b;
    MOERL_ASSERT(staleness_init(&b, 4, 1, 1, 0.5) == MOERL_OK); /* max 6 */
    int n = 0;
    while (staleness_can_start(&b, 0) && n < 100) {
        staleness_on_start(&b);
        n++;
    }
    CHECK(n == 6 && b.counter == 6, "admitted %d prompts (counter %lld), want exactly 6", n, (long long)b.counter);
    /* a full queue blocks admission whatever the counter says */
    staleness_on_version(&b, 0, 0, 0);
    CHECK(b.counter == 0, "re-base to 0: %lld", (long long)b.counter);
    CHECK(staleness_can_start(&b, 5) && !staleness_can_start(&b, 6) && !staleness_can_start(&b, 7),
          "queue bound: can_start(5)=%d (6)=%d", staleness_can_start(&b, 5), staleness_can_start(&b, 6));
    /* version change: counter = in-flight + interrupted + queued */
    staleness_on_version(&b, 2, 1, 1);
    CHECK(b.counter == 4, "re-base 2+1+1: %lld", (long long)b.counter);
    staleness_on_start(&b);
    staleness_on_start(&b);
    CHECK(b.counter == 6 && !staleness_can_start(&b, 1), "after 2 starts: counter %lld", (long long)b.counter);
    staleness_on_version(&b, 3, 0, 3);
    CHECK(b.counter == 6 && !staleness_can_start(&b, 3), "carried-over 6 blocks admission");
    staleness_on_version(&b, 1, 0, 2);
    CHECK(b.counter == 3 && staleness_can_start(&b, 2), "carried-over 3 admits: counter %lld", (long long)b.counter);
    /* DAPO drops give slots back, never below what is held: 3 groups held, 2 dropped that the re-base did not
     * count (taken from the queue before it) leave the counter at 3, not 1 (the queue would outgrow 6) */
    staleness_on_drop(&b, 2, 3);
    CHECK(b.counter == 3, "a drop below the held groups: counter %lld, want 3", (long long)b.counter);
    staleness_on_start(&b);
    staleness_on_start(&b);
    staleness_on_start(&b);
    staleness_on_drop(&b, 2, 3); /* 6 counted, 3 held: the 2 dropped were counted, their slots come back */
    CHECK(b.counter == 4, "a drop of counted groups: counter %lld, want 4", (long long)b.counter);
    staleness_on_drop(&b, 9, 0);
    CHECK(b.counter == 0, "never below 0: %lld", (long long)b.counter);
    /* threshold 0: exactly W per version */
    MOERL_ASSERT(staleness_init(&b, 3, 1, 2, 0.0) == MOERL_OK);
    n = 0;
    while (staleness_can_start(&b, 0) && n < 100) {
        staleness_on_start(&b);
        n++;
    }
    CHECK(n == 6, "threshold 0, W 6: admitted %d", n);
}

/* ------------------------------------------------------------------ rollouter: admission */

/* Ticks without consuming: admission stops at exactly max_required_samples started groups; the
 * queue never exceeds its capacity; then a trainer-like consumer takes required_samples groups
 * and syncs at chosen points, and after every sync counter == in-flight + queued; at every point
 * started − consumed ≤ max_required_samples (the staleness invariant). */
static void test_rollouter_admission(void) {
    moe_model m;
    rl_tiny_model(&m, 11, 0.001f);
    rl_config c = base_config();
    c.max_num_seqs = 16; /* ≥ max_required_samples · n: the engine is never what stops admission */
    const int64_t total = 30;
    staleness_budget sb;
    MOERL_ASSERT(staleness_init(&sb, c.ppo_mini_batch_size, c.require_batches, c.trigger_parameter_sync_step,
                                c.staleness_threshold) == MOERL_OK);
    const int maxr = sb.max_required_samples, req = sb.required_samples; /* 3, 2 */
    rl_queue q;
    rl_queue_init(&q, maxr);
    rollouter R;
    CHECK(rollouter_init(&R, &c, fx_budget(&c), &g_train, &m, &q, total) == MOERL_OK, "rollouter_init: %s", moerl_last_error());
    CHECK(R.budget.max_required_samples == maxr, "budget %d", R.budget.max_required_samples);
    int ticks = 0, rc, over = 0;
    while ((rc = rollouter_tick(&R)) == 1 && ticks < 10000) {
        ticks++;
        over += started(&R, total) > maxr || rl_queue_size(&q) > maxr || R.budget.counter != started(&R, total);
    }
    CHECK(rc == 0, "tick returned %d: %s", rc, moerl_last_error());
    CHECK(over == 0, "%d ticks broke started ≤ %d, queue ≤ %d or counter == started", over, maxr, maxr);
    CHECK(started(&R, total) == maxr, "idle after starting %lld groups, want exactly %d", (long long)started(&R, total),
          maxr);
    CHECK(rl_queue_size(&q) == maxr && rollouter_in_flight(&R) == 0, "queue %d in flight %d", rl_queue_size(&q),
          rollouter_in_flight(&R));
    /* idle is stable: more ticks start nothing */
    for (int i = 0; i < 3; i++) CHECK(rollouter_tick(&R) == 0, "tick while the budget is spent did work");
    CHECK(started(&R, total) == maxr, "started %lld after idle ticks", (long long)started(&R, total));

    /* consumer: take req groups, sync at various in-flight points */
    int64_t consumed = 0;
    int version = 0, syncs = 0, rebase_bad = 0, inv_bad = 0, syncs_with_inflight = 0;
    const int64_t n_rows = dataset_count(&g_train);
    int64_t *seen = xcalloc(2 * n_rows, sizeof(int64_t)); /* uid = epoch · n_rows + row; total < n_rows */
    int dup = 0;
    rl_group *gs[8];
    for (int iter = 0; iter < 2000 && consumed < total; iter++) {
        if (rl_queue_try_get_n(&q, (void **)gs, req) == req) {
            for (int i = 0; i < req; i++) {
                dup += gs[i]->uid < 0 || gs[i]->uid >= 2 * n_rows || seen[gs[i]->uid]++ != 0;
                rl_group_free(gs[i]);
            }
            consumed += req;
            /* sync after a few more ticks so that syncs hit with work in flight */
            for (int k = 0; k < iter % 3; k++) CHECK(rollouter_tick(&R) >= 0, "tick: %s", moerl_last_error());
            syncs_with_inflight += rollouter_in_flight(&R) > 0;
            CHECK(rollouter_apply_sync(&R, m.params, m.n_params, ++version) == MOERL_OK, "apply_sync: %s",
                  moerl_last_error());
            syncs++;
            rebase_bad += R.budget.counter != rollouter_in_flight(&R) + rl_queue_size(&q);
        }
        if (rollouter_tick(&R) < 0) {
            CHECK(0, "tick: %s", moerl_last_error());
            break;
        }
        inv_bad += started(&R, total) - consumed > maxr || rl_queue_size(&q) > maxr ||
                   R.budget.counter > maxr;
    }
    CHECK(consumed == total, "consumed %lld of %lld", (long long)consumed, (long long)total);
    CHECK(dup == 0, "%d prompts delivered twice", dup);
    CHECK(rebase_bad == 0, "%d of %d syncs left counter ≠ in-flight + queued", rebase_bad, syncs);
    CHECK(inv_bad == 0, "%d ticks with started − consumed > %d, queue > cap or counter > max", inv_bad, maxr);
    CHECK(syncs_with_inflight >= 3, "only %d syncs hit with groups in flight", syncs_with_inflight);
    CHECK(R.prompts_left == 0 && rollouter_in_flight(&R) == 0, "left %lld in flight %d", (long long)R.prompts_left,
          rollouter_in_flight(&R));
    free(seen);
    rollouter_free(&R);
    rl_queue_destroy(&q);
    model_free(&m);
}

/* ------------------------------------------------------------------ rollouter: partial rollout */

/* What the test has seen of one response so far. */
typedef struct {
    int64_t id;
    int n;                  /* tokens seen */
    int tokens[64], versions[64];
    float logprobs[64];
    int full_at_sync;       /* it had reached max length (finished) when a sync hit */
    int intr_at_sync;       /* its n_interruptions then */
} resp_rec;

typedef struct {
    resp_rec *r;
    int n, cap;
    /* violations */
    int prefix_changed, new_wrong_version, decreasing, full_resumed;
    int n_full_at_sync;
} observer;

static resp_rec *obs_find(observer *o, int64_t id) {
    for (int i = 0; i < o->n; i++)
        if (o->r[i].id == id) return &o->r[i];
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 64;
        o->r = xrealloc(o->r, o->cap * sizeof(resp_rec));
    }
    resp_rec *r = &o->r[o->n++];
    memset(r, 0, sizeof *r);
    r->id = id;
    return r;
}

/* Check one live response against what was seen: the old prefix is unchanged bit for bit
 * (tokens, behaviour logprobs, versions), tokens new since the last look carry `cur_version`
 * (the engine generated them under it), versions never decrease. */
static void obs_request(observer *o, const gen_request *q, int cur_version) {
    resp_rec *r = obs_find(o, q->id);
    MOERL_ASSERT(q->n_out <= 64);
    int upto = r->n < q->n_out ? r->n : q->n_out;
    if (q->n_out < r->n) o->prefix_changed++;
    for (int t = 0; t < upto; t++)
        if (q->out_tokens[t] != r->tokens[t] || q->out_versions[t] != r->versions[t] ||
            memcmp(&q->out_logprobs[t], &r->logprobs[t], sizeof(float)))
            o->prefix_changed++;
    for (int t = r->n; t < q->n_out; t++) o->new_wrong_version += q->out_versions[t] != cur_version;
    for (int t = 1; t < q->n_out; t++) o->decreasing += q->out_versions[t] < q->out_versions[t - 1];
    if (r->full_at_sync && (q->n_out != r->n || q->n_interruptions != r->intr_at_sync || q->finish != FINISH_LENGTH))
        o->full_resumed++;
    memcpy(r->tokens, q->out_tokens, q->n_out * sizeof(int));
    memcpy(r->versions, q->out_versions, q->n_out * sizeof(int));
    memcpy(r->logprobs, q->out_logprobs, q->n_out * sizeof(float));
    r->n = q->n_out;
}

static void obs_all(observer *o, rollouter *R, rl_queue *q, int cur_version) {
    for (int i = 0; i < R->n_inflight; i++)
        for (int j = 0; j < R->inflight[i]->n; j++) obs_request(o, &R->inflight[i]->reqs[j], cur_version);
    void *items[64];
    int nq = rl_queue_peek_all(q, items, 64);
    for (int i = 0; i < nq; i++) {
        rl_group *g = items[i];
        for (int j = 0; j < g->n; j++) obs_request(o, &g->reqs[j], cur_version);
    }
}

/* Just before a sync: remember the responses of in-flight groups that are already at max length. */
static void obs_mark_full(observer *o, rollouter *R) {
    for (int i = 0; i < R->n_inflight; i++)
        for (int j = 0; j < R->inflight[i]->n; j++) {
            const gen_request *q = &R->inflight[i]->reqs[j];
            if (q->n_out == q->sp.max_tokens) {
                resp_rec *r = obs_find(o, q->id);
                r->full_at_sync = 1;
                r->intr_at_sync = q->n_interruptions;
                o->n_full_at_sync++;
            }
        }
}

typedef struct {
    int groups, responses, spanning, interrupted, multi_version_groups;
    int bad_group, bad_resp;
    int single_version_bad;
} group_stats;

/* A group as the trainer receives it. */
static void check_group(const rl_group *g, const observer *o, int cur_version, int max_tokens, group_stats *s) {
    s->groups++;
    if (g->n_done != g->n || g->n <= 0) s->bad_group++;
    int gmin = 1 << 30, gmax = -1;
    for (int j = 0; j < g->n; j++) {
        const gen_request *q = &g->reqs[j];
        s->responses++;
        int bad = q->finish == FINISH_NONE || q->finish == FINISH_ABORT || q->n_out < 1 ||
                  q->sp.max_tokens > max_tokens || q->n_out > q->sp.max_tokens || !q->out_tokens ||
                  !q->out_logprobs || !q->out_versions ||
                  (q->finish == FINISH_LENGTH && q->n_out != q->sp.max_tokens) || q->prompt != g->prompt.ids;
        /* the response the trainer sees is every token the observer saw, nothing more or less */
        for (int i = 0; i < o->n; i++)
            if (o->r[i].id == q->id) bad |= o->r[i].n != q->n_out;
        for (int t = 0; t < q->n_out && !bad; t++)
            bad |= q->out_versions[t] < g->start_version || q->out_versions[t] > cur_version ||
                   !(q->out_logprobs[t] <= 0.0f) || !isfinite(q->out_logprobs[t]) || q->out_tokens[t] < 0 ||
                   q->out_tokens[t] >= TOK_VOCAB_SIZE;
        if (bad) s->bad_resp++;
        if (q->n_out > 0) {
            int v0 = q->out_versions[0], v1 = q->out_versions[q->n_out - 1];
            s->spanning += v1 > v0;
            gmin = MOERL_MIN(gmin, v0);
            gmax = MOERL_MAX(gmax, v1);
            s->single_version_bad += v1 != v0;
        }
        s->interrupted += q->n_interruptions > 0;
    }
    s->multi_version_groups += gmax > gmin;
}

/* Partial rollout on, lockstep-like driver (generate until the trainer has a batch, take it,
 * sync with new weights). Each version's weights differ (perturbed), as after a real update. */
static void test_partial_rollout_on(void) {
    moe_model m;
    rl_tiny_model(&m, 21, 0.001f);
    rl_config c = base_config();
    c.max_response_length = 12;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 40; /* about one prompt's prefill per step: a group's responses start
                                      (and so finish) on different steps, and syncs hit mid-group */
    c.enable_prefix_caching = 0;   /* with it a group's samples wait for the shared prompt and start together */
    c.staleness_threshold = 1.0;   /* W 2, max 4: groups keep running across syncs */
    const int64_t total = 24;
    rl_queue q;
    rl_queue_init(&q, 4);
    rollouter R;
    CHECK(rollouter_init(&R, &c, fx_budget(&c), &g_train, &m, &q, total) == MOERL_OK, "rollouter_init: %s", moerl_last_error());
    float *w = xmalloc(m.n_params * sizeof(float));
    memcpy(w, m.params, m.n_params * sizeof(float));
    rng_state rng;
    rng_seed(&rng, 99);
    observer o = {0};
    group_stats s = {0};
    int version = 0, syncs = 0, rebase_bad = 0, count_bad = 0;
    int64_t consumed = 0, counter_at_sync = 0, started_at_sync = 0;
    rl_group *gs[8];
    for (int guard = 0; consumed < total && guard < 100000; guard++) {
        int t = rollouter_tick(&R);
        CHECK(t >= 0, "tick: %s", moerl_last_error());
        if (t < 0) break;
        obs_all(&o, &R, &q, version);
        /* between syncs the counter grows by exactly the NEW groups started: resumed
         * (interrupted) groups re-entering the engine do not count */
        count_bad += R.budget.counter != counter_at_sync + (started(&R, total) - started_at_sync);
        if (rl_queue_try_get_n(&q, (void **)gs, 2) == 2) {
            for (int i = 0; i < 2; i++) {
                check_group(gs[i], &o, version, c.max_response_length, &s);
                rl_group_free(gs[i]);
            }
            consumed += 2;
            /* the trainer takes a while: the sync comes 0–3 engine steps after the take, so it
             * hits groups in every state (some responses finished at max length, others running) */
            for (int k = 0; k < syncs % 4; k++) {
                CHECK(rollouter_tick(&R) >= 0, "tick: %s", moerl_last_error());
                obs_all(&o, &R, &q, version);
            }
            /* "training": new weights */
            for (size_t i = 0; i < m.n_params; i++) w[i] += 0.01f * (float)(rng_uniform(&rng) - 0.5);
            obs_mark_full(&o, &R);
            CHECK(rollouter_apply_sync(&R, w, m.n_params, ++version) == MOERL_OK, "sync: %s", moerl_last_error());
            syncs++;
            rebase_bad += R.budget.counter != rollouter_in_flight(&R) + rl_queue_size(&q);
            counter_at_sync = R.budget.counter;
            started_at_sync = started(&R, total);
            obs_all(&o, &R, &q, version);
        }
    }
    CHECK(count_bad == 0, "%d ticks where the counter ≠ counter at the sync + new groups started", count_bad);
    CHECK(consumed == total, "consumed %lld of %lld", (long long)consumed, (long long)total);
    CHECK(syncs >= 10, "only %d syncs", syncs);
    CHECK(rebase_bad == 0, "%d syncs left counter ≠ in-flight + queued", rebase_bad);
    CHECK(o.prefix_changed == 0, "%d tokens of a response changed after they were generated", o.prefix_changed);
    CHECK(o.new_wrong_version == 0, "%d tokens carry a version other than the engine's at generation",
          o.new_wrong_version);
    CHECK(o.decreasing == 0, "%d version decreases along a response", o.decreasing);
    CHECK(s.bad_group == 0 && s.bad_resp == 0, "%d bad groups, %d bad responses (of %d)", s.bad_group, s.bad_resp,
          s.responses);
    CHECK(s.interrupted >= 4, "only %d responses were interrupted", s.interrupted);
    CHECK(s.spanning >= 2, "only %d responses span ≥ 2 versions", s.spanning);
    /* the situation the "finished, not resumed" rule is about must have happened */
    CHECK(o.n_full_at_sync >= 1, "no sync hit a group with a response already at max length");
    CHECK(o.full_resumed == 0, "%d responses at max length when a sync hit were resumed or changed", o.full_resumed);
    fprintf(stderr, "  partial on: %d syncs, %d responses, %d interrupted, %d spanning, %d at max length at a sync\n",
            syncs, s.responses, s.interrupted, s.spanning, o.n_full_at_sync);
    free(o.r);
    free(w);
    rollouter_free(&R);
    rl_queue_destroy(&q);
    model_free(&m);
}

/* Partial rollout off: the driver drains in-flight work under the old weights before each sync
 * (as job.c does), so every response is generated by exactly one version and none is
 * interrupted; no new group starts while draining. */
static void test_partial_rollout_off(void) {
    moe_model m;
    rl_tiny_model(&m, 31, 0.001f);
    rl_config c = base_config();
    c.partial_rollout = 0;
    c.max_response_length = 12;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 40;
    c.staleness_threshold = 1.0;
    const int64_t total = 16;
    rl_queue q;
    rl_queue_init(&q, 4);
    rollouter R;
    CHECK(rollouter_init(&R, &c, fx_budget(&c), &g_train, &m, &q, total) == MOERL_OK, "rollouter_init: %s", moerl_last_error());
    float *w = xmalloc(m.n_params * sizeof(float));
    memcpy(w, m.params, m.n_params * sizeof(float));
    rng_state rng;
    rng_seed(&rng, 5);
    observer o = {0};
    group_stats s = {0};
    int version = 0, syncs = 0, started_in_drain = 0, drained_with_work = 0, rebase_bad = 0;
    int64_t consumed = 0;
    rl_group *gs[8];
    for (int guard = 0; consumed < total && guard < 100000; guard++) {
        int t = rollouter_tick(&R);
        if (t < 0) {
            CHECK(0, "tick: %s", moerl_last_error());
            break;
        }
        obs_all(&o, &R, &q, version);
        if (rl_queue_try_get_n(&q, (void **)gs, 2) != 2) continue;
        for (int i = 0; i < 2; i++) {
            check_group(gs[i], &o, version, c.max_response_length, &s);
            rl_group_free(gs[i]);
        }
        consumed += 2;
        drained_with_work += engine_num_unfinished(R.eng) > 0;
        R.draining = 1;
        int64_t st0 = started(&R, total);
        while (engine_num_unfinished(R.eng) > 0) {
            if (rollouter_tick(&R) < 0) break;
            obs_all(&o, &R, &q, version);
        }
        started_in_drain += started(&R, total) != st0;
        for (size_t i = 0; i < m.n_params; i++) w[i] += 0.01f * (float)(rng_uniform(&rng) - 0.5);
        CHECK(rollouter_apply_sync(&R, w, m.n_params, ++version) == MOERL_OK, "sync: %s", moerl_last_error());
        syncs++;
        rebase_bad += R.budget.counter != rollouter_in_flight(&R) + rl_queue_size(&q);
    }
    CHECK(consumed == total, "consumed %lld of %lld", (long long)consumed, (long long)total);
    CHECK(drained_with_work >= 2, "only %d syncs had in-flight work to drain", drained_with_work);
    CHECK(started_in_drain == 0, "%d drains started new groups", started_in_drain);
    CHECK(rebase_bad == 0, "%d syncs left counter ≠ in-flight + queued", rebase_bad);
    CHECK(s.single_version_bad == 0, "%d responses span more than one version without partial rollout",
          s.single_version_bad);
    CHECK(s.interrupted == 0, "%d responses interrupted without partial rollout", s.interrupted);
    CHECK(s.bad_group == 0 && s.bad_resp == 0, "%d bad groups, %d bad responses", s.bad_group, s.bad_resp);
    CHECK(o.prefix_changed == 0 && o.new_wrong_version == 0 && o.decreasing == 0, "token history broken: %d %d %d",
          o.prefix_changed, o.new_wrong_version, o.decreasing);
    free(o.r);
    free(w);
    rollouter_free(&R);
    rl_queue_destroy(&q);
    model_free(&m);
}

/* ------------------------------------------------------------------ trainer with lr = 0 */

/* Largest |recomputed − behaviour| logprob over the groups' response tokens, under m. */
static double max_logprob_mismatch(const moe_model *m, rl_group **gs, int n, float temperature, int max_tokens,
                                   int64_t *n_tokens) {
    int G = gs[0]->n, R = n * G;
    train_seq *seqs = xmalloc(R * sizeof(train_seq));
    int **toks = xmalloc(R * sizeof(int *));
    float **lp = xmalloc(R * sizeof(float *));
    for (int g = 0; g < n; g++)
        for (int j = 0; j < G; j++) {
            const gen_request *q = &gs[g]->reqs[j];
            int s = g * G + j, L = q->prompt_len + q->n_out;
            toks[s] = xmalloc(L * sizeof(int));
            memcpy(toks[s], q->prompt, q->prompt_len * sizeof(int));
            memcpy(toks[s] + q->prompt_len, q->out_tokens, q->n_out * sizeof(int));
            seqs[s] = (train_seq){.tokens = toks[s], .len = L, .resp_start = q->prompt_len};
            lp[s] = xmalloc((q->n_out + 1) * sizeof(float));
        }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, max_tokens) == MOERL_OK);
    int rc = compute_logprobs(m, &a, seqs, R, max_tokens, temperature, lp);
    CHECK(rc == MOERL_OK, "compute_logprobs: %s", moerl_last_error());
    double worst = 0;
    *n_tokens = 0;
    for (int g = 0; g < n; g++)
        for (int j = 0; j < G; j++) {
            const gen_request *q = &gs[g]->reqs[j];
            int s = g * G + j;
            for (int t = 0; t < q->n_out; t++) {
                double d = fabs((double)lp[s][t] - (double)q->out_logprobs[t]);
                if (!(d <= worst)) worst = d;
                (*n_tokens)++;
            }
        }
    model_acts_free(&a);
    for (int s = 0; s < R; s++) {
        free(toks[s]);
        free(lp[s]);
    }
    free(toks);
    free(lp);
    free(seqs);
    return worst;
}

/* trainer_step with lr = 0 over groups generated across several syncs (partial rollout on):
 * the weights stay bit-identical, and because the engine then always holds the trainer's
 * weights, the trainer's recomputed logprobs equal the behaviour logprobs at every version —
 * ppo_kl stays ≈ 0 instead of drifting with the version count. Then a control: lr > 0 changes
 * the weights (so the bit-identity check can fail). */
static void test_trainer_lr0(void) {
    moe_model m;
    rl_tiny_model(&m, 41, 0.001f);
    rl_config c = base_config();
    c.optim.lr = 0.0f;
    c.temperature = 0.8f; /* ≠ 1: engine and trainer must both divide the logits by it */
    c.max_response_length = 10;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 40;
    c.staleness_threshold = 1.0;
    const int n_versions = 6, req = 2;
    const int64_t total = (int64_t)n_versions * req;
    rl_queue q;
    rl_queue_init(&q, 4);
    rollouter R;
    trainer T;
    CHECK(rollouter_init(&R, &c, fx_budget(&c), &g_train, &m, &q, total) == MOERL_OK, "rollouter_init: %s", moerl_last_error());
    CHECK(trainer_init(&T, &c, &g_train, &m) == MOERL_OK, "trainer_init: %s", moerl_last_error());
    float *before = xmalloc(m.n_params * sizeof(float));
    rl_group *gs[8];
    int steps = 0, spanning = 0;
    double worst_kl = 0, worst_tok = 0;
    while (steps < n_versions) {
        int t = rollouter_tick(&R);
        if (t < 0) {
            CHECK(0, "tick: %s", moerl_last_error());
            break;
        }
        if (t == 0 && rl_queue_size(&q) < req) {
            CHECK(0, "rollouter idle with %d groups queued", rl_queue_size(&q));
            break;
        }
        if (rl_queue_try_get_n(&q, (void **)gs, req) != req) continue;
        for (int g = 0; g < req; g++)
            for (int j = 0; j < gs[g]->n; j++) {
                const gen_request *r = &gs[g]->reqs[j];
                spanning += r->n_out > 0 && r->out_versions[r->n_out - 1] > r->out_versions[0];
            }
        int64_t ntok;
        double mis = max_logprob_mismatch(&m, gs, req, c.temperature, c.ppo_max_token_len, &ntok);
        memcpy(before, m.params, m.n_params * sizeof(float));
        train_stats st;
        CHECK(trainer_step(&T, gs, req, &st) == MOERL_OK, "trainer_step: %s", moerl_last_error());
        CHECK(!memcmp(before, m.params, m.n_params * sizeof(float)), "version %d: lr = 0 changed the weights",
              T.version);
        /* engine decode (KV cache, batch of live sequences) vs the trainer's packed full forward:
         * the same fp32 math in other batch shapes and summation orders; test_engine measures
         * ≤ 1e-5 per token for this kind of model, so 2e-5 per token (and for ppo_kl, a mean of
         * such differences) is the rounding margin, while any real policy change (lr 1e-4 in
         * the smoke run) moves ppo_kl by ≥ 1e-4. */
        CHECK(mis <= 2e-5, "version %d: recomputed vs behaviour logprob differs by %.3g over %lld tokens", T.version,
              mis, (long long)ntok);
        CHECK(fabs(st.ppo_kl) <= 2e-5, "version %d: ppo_kl %.3g with unchanged weights", T.version, st.ppo_kl);
        CHECK(st.n_samples == req * c.n && st.trained_tokens > 0, "step stats: %lld samples %lld tokens",
              (long long)st.n_samples, (long long)st.trained_tokens);
        worst_kl = fmax(worst_kl, fabs(st.ppo_kl));
        worst_tok = fmax(worst_tok, mis);
        for (int g = 0; g < req; g++) rl_group_free(gs[g]);
        steps++;
        T.version++;
        CHECK(rollouter_apply_sync(&R, m.params, m.n_params, T.version) == MOERL_OK, "sync: %s", moerl_last_error());
    }
    CHECK(steps == n_versions, "only %d trainer steps", steps);
    CHECK(spanning >= 1, "no trained response spans two versions (partial rollout not exercised)");
    fprintf(stderr, "  lr 0: %d versions, max |ppo_kl| %.3g, max token |Δlogprob| %.3g, %d spanning responses\n",
            steps, worst_kl, worst_tok, spanning);
    trainer_free(&T);

    /* control: the same step with lr > 0 does change the weights */
    rl_config c2 = c;
    c2.optim.lr = 1e-3f;
    trainer T2;
    CHECK(trainer_init(&T2, &c2, &g_train, &m) == MOERL_OK, "trainer_init: %s", moerl_last_error());
    rollouter R2;
    rl_queue q2;
    rl_queue_init(&q2, 4);
    CHECK(rollouter_init(&R2, &c2, fx_budget(&c2), &g_train, &m, &q2, 2) == MOERL_OK, "rollouter_init: %s", moerl_last_error());
    while (rl_queue_size(&q2) < 2 && rollouter_tick(&R2) == 1) {
    }
    if (rl_queue_try_get_n(&q2, (void **)gs, 2) == 2) {
        memcpy(before, m.params, m.n_params * sizeof(float));
        train_stats st;
        CHECK(trainer_step(&T2, gs, 2, &st) == MOERL_OK, "trainer_step: %s", moerl_last_error());
        CHECK(memcmp(before, m.params, m.n_params * sizeof(float)) != 0, "lr 1e-3 left the weights unchanged");
        for (int g = 0; g < 2; g++) rl_group_free(gs[g]);
    } else {
        CHECK(0, "control: no groups generated");
    }
    rollouter_free(&R2);
    rl_queue_destroy(&q2);
    trainer_free(&T2);
    free(before);
    rollouter_free(&R);
    rl_queue_destroy(&q);
    model_free(&m);
}

int main(void) {
    setup_data();
    test_staleness_init_grid();
    test_staleness_init_cases();
    test_staleness_errors();
    test_staleness_counter();
    if (dataset_count(&g_train) > 0) {
        test_rollouter_admission();
        test_partial_rollout_on();
        test_partial_rollout_off();
        test_trainer_lr0();
    }
    teardown_data();
    TEST_MAIN_END();
}
