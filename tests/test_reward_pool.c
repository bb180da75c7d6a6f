/* The reward pool (src/reward/pool.c) and the built-in backend (src/reward/builtin.c):
 *   - the built-in backend through the pool gives exactly reward_score's score and pred, row by row,
 *     on generated datasets of every built-in family (right, wrong and empty responses);
 *   - results come back under their tags in submission order (an empty one is done at once), the backlog
 *     counts requests not handed out, and whatever is pending while the backend is busy is scored
 *     as ONE batch next;
 *   - a failing backend latches: the poll after the failure and every later poll, submit and
 *     synchronous score return the backend's message; a non-finite score is refused naming the row;
 *   - reward_pool_score uses the same backend, never concurrently with the pool's thread;
 *   - free while the backend is busy: with cancel (returns once cancelled) and without (waits);
 *   - reward_result_copy / reward_result_free deep-copy and release extras and pred;
 *   - the rollouter with rewards beside generation (wait_rewards = 0, as the async job runs it): while
 *     the backend holds every batch, the engine still generates every admitted group to the end and
 *     nothing reaches the queue (the finished groups stay in flight: the staleness counter equals
 *     in-flight + queued at every tick); once released every group arrives exactly once with the
 *     rewards reward_score gives its decoded responses; a backend failure makes the tick fail with
 *     the backend's message and R.reward_failed; the default (wait_rewards = 1) queues each group at
 *     the engine step that finished it.
 * Exact comparisons: the scores are the same function of the same strings on both paths. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "data/dataset.h"
#include "data/rewards.h"
#include "data/tasks.h"
#include "reward/reward.h"
#include "rl/rl.h"
#include "rl_fixture.h"
#include "test.h"

static char g_dir[512];

/* Poll until `want` submissions are in (each poll waits up to a second for the first). */
static int collect(reward_pool *p, reward_done *out, int want) {
    int got = 0;
    for (int guard = 0; got < want && guard < 10000; guard++) {
        const int k = reward_pool_poll(p, out + got, want - got, 1.0);
        if (k < 0) return k;
        got += k;
    }
    return got;
}

static void free_done(reward_done *d, int n) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < d[i].n; j++) reward_result_free(&d[i].results[j]);
        free(d[i].results);
    }
}

static int same_pred(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

/* ---- built-in through the pool == reward_score, on every family */
static void test_builtin_equals_direct(const char *family) {
    char tr[700], te[700];
    snprintf(tr, sizeof tr, "%s/%s/train.jsonl", g_dir, family);
    snprintf(te, sizeof te, "%s/%s/test.jsonl", g_dir, family);
    task_opts o;
    task_opts_default(&o);
    o.n_train = 60;
    o.n_test = 5;
    CHECK(task_generate(family, &o, tr, te) == MOERL_OK, "%s: generate: %s", family, moerl_last_error());
    dataset d;
    if (dataset_load(&d, tr) != MOERL_OK) {
        CHECK(0, "%s: load: %s", family, moerl_last_error());
        return;
    }
    enum { V = 4 }; /* per row: the SFT response (right), a wrong one, an empty one, a boxed/marked one */
    const int n = (int)d.n * V;
    reward_request *reqs = xcalloc((size_t)n, sizeof *reqs);
    char **texts = xcalloc((size_t)n, sizeof(char *)), **wheres = xcalloc((size_t)n, sizeof(char *));
    for (int i = 0; i < (int)d.n; i++) {
        const ds_row *r = dataset_row(&d, i);
        /* a response given as messages (tool_arith's demonstrations): the text its trajectory decodes to
         * (special tokens skipped), tool turns as Qwen3's template writes them */
        char traj[4096] = "";
        for (int k = 0, o = 0; k < r->n_resp_msgs; k++)
            o += snprintf(traj + o, sizeof traj - (size_t)o,
                          strcmp(r->resp_msgs[k].role, "tool") ? "%s"
                                                               : "\nuser\n<tool_response>\n%s\n</tool_response>\nassistant\n",
                          r->resp_msgs[k].content);
        const char *right = r->n_resp_msgs > 0 ? traj : r->response ? r->response : "";
        const char *resp[V] = {right, "the answer is 7\n#### 7", "", "= 12345"};
        for (int v = 0; v < V; v++) {
            reward_request *q = &reqs[i * V + v];
            texts[i * V + v] = xstrdup(resp[v]);
            char w[64];
            snprintf(w, sizeof w, "train.jsonl:%lld", (long long)r->line);
            wheres[i * V + v] = xstrdup(w);
            *q = (reward_request){.data_source = r->data_source, .solution_str = texts[i * V + v],
                                  .ground_truth = r->ground_truth, .ground_truth_json = r->ground_truth_json,
                                  .extra_info_json = r->extra_info_json, .where = wheres[i * V + v]};
        }
    }
    reward_pool *p = reward_pool_create(reward_backend_builtin());
    CHECK(p != NULL && !strcmp(reward_pool_what(p), "built-in"), "%s: pool", family);
    /* submissions of varied sizes (a row's V responses, like a GRPO group), tagged by first index */
    int n_sub = 0;
    for (int at = 0; at < n; at += V) {
        CHECK(reward_pool_submit(p, (uint64_t)at, reqs + at, V) == MOERL_OK, "submit: %s", moerl_last_error());
        n_sub++;
    }
    reward_done *done = xcalloc((size_t)n_sub, sizeof *done);
    const int got = collect(p, done, n_sub);
    CHECK(got == n_sub, "%s: %d of %d submissions back (%s)", family, got, n_sub, got < 0 ? moerl_last_error() : "");
    int bad = 0, bad_pred = 0, ones = 0, order = 0;
    for (int s = 0; s < (got > 0 ? got : 0); s++) {
        order += done[s].tag != (uint64_t)(s * V) || done[s].n != V;
        for (int j = 0; j < done[s].n && done[s].tag + j < (uint64_t)n; j++) {
            const reward_request *q = &reqs[done[s].tag + j];
            double want = -1;
            char *pred = NULL;
            CHECK(reward_score(q->data_source, q->solution_str, q->ground_truth, &want, &pred) == MOERL_OK,
                  "direct: %s", moerl_last_error());
            bad += done[s].results[j].score != want;
            bad_pred += !same_pred(done[s].results[j].pred, pred);
            ones += want == 1.0;
            free(pred);
        }
    }
    CHECK(bad == 0 && bad_pred == 0 && order == 0, "%s: %d scores, %d preds differ, %d out of order", family, bad,
          bad_pred, order);
    CHECK(ones >= (int)d.n, "%s: only %d responses right (every SFT response earns 1)", family, ones);
    CHECK(reward_pool_backlog(p) == 0, "%s: backlog %d after all were handed out", family, reward_pool_backlog(p));
    CHECK(reward_pool_busy_s(p) >= 0, "busy seconds");
    /* the synchronous path gives the same */
    reward_result *out = xcalloc((size_t)n, sizeof *out);
    CHECK(reward_pool_score(p, reqs, n, out) == MOERL_OK, "score: %s", moerl_last_error());
    int bad_sync = 0;
    for (int s = 0; s < got; s++)
        for (int j = 0; j < done[s].n; j++) bad_sync += out[done[s].tag + j].score != done[s].results[j].score;
    CHECK(bad_sync == 0, "%s: %d synchronous scores differ", family, bad_sync);
    for (int i = 0; i < n; i++) reward_result_free(&out[i]);
    free(out);
    free_done(done, got > 0 ? got : 0);
    free(done);
    reward_pool_free(p);
    for (int i = 0; i < n; i++) {
        free(texts[i]);
        free(wheres[i]);
    }
    free(texts);
    free(wheres);
    free(reqs);
    dataset_free(&d);
}

/* ---- a scriptable test backend */
typedef struct {
    reward_backend b;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;            /* score calls so far */
    int fail_at;          /* the call (1-based) that fails; 0 never */
    int nan_at;           /* the call whose first score is NaN; 0 never */
    int hold;             /* 1: score waits until released or cancelled */
    int inside, cancelled, released;
    int batch_sizes[64];
    atomic_int concurrent, overlap;
} test_backend;

static int tb_score(reward_backend *b, const reward_request *reqs, int n, reward_result *out) {
    test_backend *t = (test_backend *)b;
    if (atomic_fetch_add(&t->concurrent, 1) != 0) atomic_store(&t->overlap, 1);
    pthread_mutex_lock(&t->mu);
    const int call = ++t->calls;
    if (call <= 64) t->batch_sizes[call - 1] = n;
    t->inside = 1;
    pthread_cond_broadcast(&t->cv);
    while (t->hold && !t->released && !t->cancelled) pthread_cond_wait(&t->cv, &t->mu);
    const int cancelled = t->cancelled;
    t->inside = 0;
    pthread_mutex_unlock(&t->mu);
    int rc = MOERL_OK;
    if (cancelled) rc = moerl_errorf("test backend: cancelled");
    else if (call == t->fail_at)
        rc = moerl_errorf("reward.command 'crashy': row %s: the program exited with status 3", reqs[0].where);
    for (int i = 0; i < n && rc == MOERL_OK; i++) {
        out[i].score = (double)strlen(reqs[i].solution_str);
        if (call == t->nan_at && i == 0) out[i].score = NAN;
        out[i].n_extra = 1;
        out[i].extra_keys = xmalloc(sizeof(char *));
        out[i].extra_vals = xmalloc(sizeof(double));
        out[i].extra_keys[0] = xstrdup("len2");
        out[i].extra_vals[0] = 2.0 * out[i].score;
        out[i].pred = xstrdup(reqs[i].solution_str);
    }
    atomic_fetch_sub(&t->concurrent, 1);
    return rc;
}

static void tb_cancel(reward_backend *b) {
    test_backend *t = (test_backend *)b;
    pthread_mutex_lock(&t->mu);
    t->cancelled = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static int g_freed;
static void tb_free(reward_backend *b) {
    test_backend *t = (test_backend *)b;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    g_freed++;
    free(t);
}

static test_backend *tb_new(int with_cancel) {
    test_backend *t = xcalloc(1, sizeof *t);
    t->b.what = "reward.command 'crashy'";
    t->b.score = tb_score;
    t->b.free = tb_free;
    t->b.cancel = with_cancel ? tb_cancel : NULL;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    return t;
}

static void tb_wait_inside(test_backend *t) {
    pthread_mutex_lock(&t->mu);
    while (!t->inside) pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

static void tb_release(test_backend *t) {
    pthread_mutex_lock(&t->mu);
    t->released = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static reward_request req_of(const char *text, const char *where) {
    return (reward_request){.data_source = "x", .solution_str = text, .ground_truth = "1", .where = where};
}

/* ---- order, tags, batching, backlog, extras */
static void test_order_and_batches(void) {
    test_backend *t = tb_new(1);
    t->hold = 1;
    reward_pool *p = reward_pool_create(&t->b);
    reward_request a[3] = {req_of("a", "d:1"), req_of("bb", "d:2"), req_of("ccc", "d:3")};
    CHECK(reward_pool_submit(p, 10, a, 1) == MOERL_OK, "submit");
    tb_wait_inside(t); /* the thread is scoring submission 10 alone */
    CHECK(reward_pool_submit(p, 11, a, 3) == MOERL_OK && reward_pool_submit(p, 12, a, 0) == MOERL_OK &&
              reward_pool_submit(p, 13, a + 1, 2) == MOERL_OK,
          "submit while busy");
    CHECK(reward_pool_backlog(p) == 6, "backlog %d, want 6 (1 + 3 + 0 + 2)", reward_pool_backlog(p));
    reward_done d[8];
    /* the empty submission 12 is done at once; nothing else is */
    int k = reward_pool_poll(p, d, 8, 0);
    CHECK(k == 1 && d[0].tag == 12 && d[0].n == 0, "empty submission first: k %d tag %llu", k,
          k > 0 ? (unsigned long long)d[0].tag : 0ULL);
    free_done(d, k > 0 ? k : 0);
    tb_release(t);
    k = collect(p, d, 3);
    CHECK(k == 3 && d[0].tag == 10 && d[1].tag == 11 && d[2].tag == 13, "tags in submission order");
    CHECK(t->calls == 2 && t->batch_sizes[0] == 1 && t->batch_sizes[1] == 5,
          "the pending submissions were one batch: calls %d, sizes %d %d", t->calls, t->batch_sizes[0],
          t->batch_sizes[1]);
    if (k == 3) {
        CHECK(d[1].n == 3 && d[1].results[2].score == 3 && d[2].n == 2 && d[2].results[0].score == 2 &&
                  d[2].results[1].score == 3,
              "results belong to their submission");
        CHECK(d[1].results[1].n_extra == 1 && !strcmp(d[1].results[1].extra_keys[0], "len2") &&
                  d[1].results[1].extra_vals[0] == 4 && !strcmp(d[1].results[1].pred, "bb"),
              "extras and pred travel");
        reward_result c;
        reward_result_copy(&c, &d[1].results[1]);
        CHECK(c.extra_keys != d[1].results[1].extra_keys && !strcmp(c.extra_keys[0], "len2") && c.extra_vals[0] == 4 &&
                  c.pred != d[1].results[1].pred && !strcmp(c.pred, "bb") && c.score == 2,
              "deep copy");
        reward_result_free(&c);
        CHECK(c.n_extra == 0 && !c.pred && !c.extra_keys, "free clears");
    }
    free_done(d, k > 0 ? k : 0);
    CHECK(reward_pool_backlog(p) == 0, "backlog %d", reward_pool_backlog(p));
    CHECK(reward_pool_poll(p, d, 8, 0) == 0, "nothing left");
    reward_pool_free(p);
}

/* ---- a failure latches */
static void test_failure_latches(void) {
    test_backend *t = tb_new(1);
    t->fail_at = 2;
    reward_pool *p = reward_pool_create(&t->b);
    reward_request a[2] = {req_of("a", "data/train.jsonl:7"), req_of("b", "data/train.jsonl:8")};
    reward_done d[4];
    CHECK(reward_pool_submit(p, 1, a, 2) == MOERL_OK && collect(p, d, 1) == 1, "first call fine");
    free_done(d, 1);
    CHECK(reward_pool_submit(p, 2, a + 1, 1) == MOERL_OK, "submit");
    int k = collect(p, d, 1);
    CHECK(k == MOERL_ERR && strstr(moerl_last_error(), "crashy") && strstr(moerl_last_error(), "data/train.jsonl:8") &&
              strstr(moerl_last_error(), "status 3"),
          "poll after the failure: %d %s", k, moerl_last_error());
    for (int i = 0; i < 3; i++) {
        moerl_errorf("something else");
        CHECK(reward_pool_poll(p, d, 4, 0) == MOERL_ERR && strstr(moerl_last_error(), "data/train.jsonl:8"),
              "later poll %d: %s", i, moerl_last_error());
    }
    CHECK(reward_pool_submit(p, 3, a, 1) == MOERL_ERR && strstr(moerl_last_error(), "status 3"), "submit after: %s",
          moerl_last_error());
    reward_result r[2] = {{0}};
    CHECK(reward_pool_score(p, a, 1, r) == MOERL_ERR && strstr(moerl_last_error(), "status 3"), "score after: %s",
          moerl_last_error());
    CHECK(t->calls == 2, "the backend is not called after it failed (%d calls)", t->calls);
    reward_pool_free(p);

    /* a lying backend: NaN is refused, naming the backend and the row */
    t = tb_new(1);
    t->nan_at = 1;
    p = reward_pool_create(&t->b);
    CHECK(reward_pool_submit(p, 1, a, 2) == MOERL_OK, "submit");
    k = collect(p, d, 1);
    CHECK(k == MOERL_ERR && strstr(moerl_last_error(), "crashy") && strstr(moerl_last_error(), "data/train.jsonl:7") &&
              strstr(moerl_last_error(), "finite"),
          "NaN refused: %s", moerl_last_error());
    reward_pool_free(p);

    /* the synchronous path latches too */
    t = tb_new(1);
    t->fail_at = 1;
    p = reward_pool_create(&t->b);
    CHECK(reward_pool_score(p, a, 2, r) == MOERL_ERR && strstr(moerl_last_error(), "data/train.jsonl:7"), "score: %s",
          moerl_last_error());
    CHECK(reward_pool_poll(p, d, 4, 0) == MOERL_ERR && strstr(moerl_last_error(), "status 3"), "poll after score: %s",
          moerl_last_error());
    reward_pool_free(p);
}

/* ---- reward_pool_score from another thread never overlaps the pool's thread */
typedef struct {
    reward_pool *p;
    int bad;
} sync_arg;

static void *sync_main(void *arg) {
    sync_arg *s = arg;
    reward_request a[2] = {req_of("abcd", "v:1"), req_of("ef", "v:2")};
    for (int i = 0; i < 200; i++) {
        reward_result r[2] = {{0}};
        if (reward_pool_score(s->p, a, 2, r) != MOERL_OK || r[0].score != 4 || r[1].score != 2) s->bad++;
        reward_result_free(&r[0]);
        reward_result_free(&r[1]);
    }
    return NULL;
}

static void test_sync_score(void) {
    test_backend *t = tb_new(1);
    reward_pool *p = reward_pool_create(&t->b);
    sync_arg s = {p, 0};
    pthread_t th;
    pthread_create(&th, NULL, sync_main, &s);
    reward_request a[1] = {req_of("xyz", "t:1")};
    int got = 0, bad = 0;
    for (int i = 0; i < 200; i++) CHECK(reward_pool_submit(p, (uint64_t)i, a, 1) == MOERL_OK, "submit");
    while (got < 200) {
        reward_done d[16];
        const int k = reward_pool_poll(p, d, 16, 1.0);
        if (k < 0) break;
        for (int i = 0; i < k; i++) bad += d[i].tag != (uint64_t)(got + i) || d[i].results[0].score != 3;
        free_done(d, k);
        got += k;
    }
    pthread_join(th, NULL);
    CHECK(got == 200 && bad == 0 && s.bad == 0, "async %d back, %d bad; sync %d bad", got, bad, s.bad);
    CHECK(atomic_load(&t->overlap) == 0, "backend->score ran on two threads at once");
    reward_pool_free(p);
}

static void *free_main(void *p) {
    reward_pool_free(p);
    return NULL;
}

/* ---- free while the backend is busy */
static void test_free_while_busy(void) {
    const int freed0 = g_freed;
    test_backend *t = tb_new(1);
    t->hold = 1; /* would never return without cancel */
    reward_pool *p = reward_pool_create(&t->b);
    reward_request a[2] = {req_of("a", "d:1"), req_of("b", "d:2")};
    reward_pool_submit(p, 1, a, 2);
    tb_wait_inside(t);
    reward_pool_submit(p, 2, a, 1); /* pending, never scored: freed with the pool */
    reward_pool_free(p);            /* returns: cancel ended the blocked call */
    CHECK(g_freed == freed0 + 1, "cancelled pool freed its backend");

    /* no cancel: free waits for the batch to end (released from here after the pool saw stop) */
    t = tb_new(0);
    t->hold = 1;
    p = reward_pool_create(&t->b);
    reward_pool_submit(p, 1, a, 2);
    tb_wait_inside(t);
    pthread_t th;
    pthread_create(&th, NULL, free_main, p);
    usleep(20000); /* let free reach the join (the order does not matter for the assertion) */
    tb_release(t);
    pthread_join(th, NULL);
    CHECK(g_freed == freed0 + 2, "pool without cancel freed after the batch");

    /* free of an idle pool with results never polled */
    t = tb_new(1);
    p = reward_pool_create(&t->b);
    reward_pool_submit(p, 1, a, 2);
    reward_done d[1];
    CHECK(collect(p, d, 1) == 1, "scored");
    free_done(d, 1);
    reward_pool_submit(p, 2, a, 2);
    reward_pool_free(p);
    CHECK(g_freed == freed0 + 3, "idle pool freed");
}

/* ---- the rollouter: rewards beside generation */
static dataset g_arith;

/* Every response's stored reward equals reward_score of its decoded text. */
static int group_rewards_right(const rl_group *g) {
    if (!g->rewards) return 0;
    const ds_row *row = dataset_row(&g_arith, g->row);
    for (int j = 0; j < g->n; j++) {
        size_t len = 0;
        char *txt = tok_decode(g->reqs[j].out_tokens, g->reqs[j].n_out, true, &len);
        double want = -1;
        char *pred = NULL;
        const int rc = reward_score(row->data_source, txt ? txt : "", row->ground_truth, &want, &pred);
        const int same = rc == MOERL_OK && g->rewards[j].score == want && same_pred(g->rewards[j].pred, pred);
        free(txt);
        free(pred);
        if (!same) return 0;
    }
    return 1;
}

static void test_rollouter_beside_generation(void) {
    char tr[700], te[700];
    snprintf(tr, sizeof tr, "%s/rl/train.jsonl", g_dir);
    snprintf(te, sizeof te, "%s/rl/test.jsonl", g_dir);
    task_opts o;
    task_opts_default(&o);
    o.n_train = 40;
    o.n_test = 4;
    MOERL_ASSERT(task_generate("arith", &o, tr, te) == MOERL_OK);
    MOERL_ASSERT(dataset_load(&g_arith, tr) == MOERL_OK);
    moe_model m;
    rl_tiny_model(&m, 11, 0.001f);
    rl_config c = rl_test_config();
    c.max_num_seqs = 64; /* the engine is never what stops admission */
    c.staleness_threshold = 2.0;
    const int64_t total = 6;
    rl_queue q;
    rl_queue_init(&q, 64);
    rollouter R;
    CHECK(rollouter_init(&R, &c, fx_budget(&c), &g_arith, &m, &q, total) == MOERL_OK, "init: %s", moerl_last_error());
    CHECK(R.wait_rewards == 1 && R.pool && !strcmp(reward_pool_what(R.pool), "built-in"), "defaults");
    /* the scoring is held: generation goes on to the end, nothing is queued */
    reward_pool_free(R.pool);
    test_backend *t = tb_new(1);
    t->hold = 1;
    R.pool = reward_pool_create(&t->b);
    R.wait_rewards = 0;
    int ticks = 0, counter_bad = 0, queued_early = 0;
    while (engine_num_unfinished(R.eng) > 0 || R.prompts_left > 0) {
        if (rollouter_tick(&R) < 0 || ++ticks > 100000) break;
        counter_bad += R.budget.counter != rollouter_in_flight(&R) + rl_queue_size(&q);
        queued_early += rl_queue_size(&q) > 0;
    }
    const int admitted = (int)(total - R.prompts_left);
    CHECK(admitted >= 2 && engine_num_unfinished(R.eng) == 0 && R.n_scoring == admitted &&
              rollouter_in_flight(&R) == admitted && queued_early == 0,
          "engine done with %d groups admitted, %d unfinished, %d scoring, %d in flight, queued %d times", admitted,
          engine_num_unfinished(R.eng), R.n_scoring, rollouter_in_flight(&R), queued_early);
    CHECK(rollouter_tick(&R) == 1, "a tick with groups waiting for rewards is not idle");
    tb_release(t);
    int guard = 0;
    while (rl_queue_size(&q) < admitted && guard++ < 100000) {
        const int did = rollouter_tick(&R);
        if (did < 0) break;
        counter_bad += R.budget.counter != rollouter_in_flight(&R) + rl_queue_size(&q);
    }
    CHECK(counter_bad == 0, "staleness counter ≠ in flight + queued at %d ticks", counter_bad);
    CHECK(rl_queue_size(&q) == admitted && rollouter_in_flight(&R) == 0 && R.n_scoring == 0, "queued %d of %d",
          rl_queue_size(&q), admitted);
    /* every group once, with test_backend's scores (the length of each decoded response) */
    rl_group *gs[64];
    const int k = rl_queue_try_get_n(&q, (void **)gs, admitted);
    int dup = 0, bad = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < i; j++) dup += gs[j]->uid == gs[i]->uid;
    for (int i = 0; i < k; i++) {
        for (int r = 0; r < gs[i]->n; r++) {
            size_t len = 0;
            char *txt = tok_decode(gs[i]->reqs[r].out_tokens, gs[i]->reqs[r].n_out, true, &len);
            bad += !gs[i]->rewards || gs[i]->rewards[r].score != (double)strlen(txt ? txt : "");
            free(txt);
        }
        rl_group_free(gs[i]);
    }
    CHECK(k == admitted && dup == 0 && bad == 0, "%d groups, %d duplicates, %d wrong rewards", k, dup, bad);
    /* the rest of the run with the built-in backend, beside generation: rewards are reward_score's */
    reward_pool_free(R.pool);
    R.pool = reward_pool_create(reward_backend_builtin());
    int got = 0, wrong = 0;
    for (guard = 0; (R.prompts_left > 0 || rollouter_in_flight(&R) > 0) && guard < 100000; guard++) {
        if (rollouter_tick(&R) < 0) break;
        rl_group *g;
        while (rl_queue_try_get_n(&q, (void **)&g, 1) == 1) {
            wrong += !group_rewards_right(g);
            got++;
            rl_group_free(g);
        }
    }
    CHECK(got == total - admitted && wrong == 0, "%d more groups, %d with wrong rewards", got, wrong);
    rollouter_free(&R);
    rl_queue_destroy(&q);

    /* the default: every group is queued at the engine step that finished it, with its rewards */
    rl_queue_init(&q, 64);
    CHECK(rollouter_init(&R, &c, fx_budget(&c), &g_arith, &m, &q, total) == MOERL_OK, "init: %s", moerl_last_error());
    int scoring_seen = 0;
    got = wrong = 0;
    for (guard = 0; (R.prompts_left > 0 || rollouter_in_flight(&R) > 0) && guard < 100000; guard++) {
        if (rollouter_tick(&R) < 0) break;
        scoring_seen += R.n_scoring != 0;
        rl_group *g;
        while (rl_queue_try_get_n(&q, (void **)&g, 1) == 1) {
            wrong += !group_rewards_right(g);
            got++;
            rl_group_free(g);
        }
    }
    CHECK(scoring_seen == 0 && got == total && wrong == 0, "wait_rewards: %d ticks with groups scoring, %d groups, "
          "%d wrong", scoring_seen, got, wrong);
    rollouter_free(&R);
    rl_queue_destroy(&q);

    /* a backend failure stops the rollouter with its message (scored in line, and beside generation) */
    for (int beside = 0; beside < 2; beside++) {
        rl_queue_init(&q, 64);
        CHECK(rollouter_init(&R, &c, fx_budget(&c), &g_arith, &m, &q, total) == MOERL_OK, "init: %s",
              moerl_last_error());
        reward_pool_free(R.pool);
        t = tb_new(1);
        t->fail_at = 1;
        R.pool = reward_pool_create(&t->b);
        R.wait_rewards = !beside;
        int rc = 0;
        for (guard = 0; guard < 100000 && (rc = rollouter_tick(&R)) >= 0; guard++) {}
        CHECK(rc == MOERL_ERR && R.reward_failed && strstr(moerl_last_error(), "crashy") &&
                  strstr(moerl_last_error(), "train.jsonl:") && strstr(R.error, "status 3"),
              "failure: rc %d, reward_failed %d, %s", rc, R.reward_failed, moerl_last_error());
        rollouter_free(&R);
        void *left;
        while (rl_queue_try_get_n(&q, &left, 1) == 1) rl_group_free(left);
        rl_queue_destroy(&q);
    }
    model_free(&m);
    dataset_free(&g_arith);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/moerl_test_reward_pool_%d", (int)getpid());
    int nf = 0;
    const char *const *fam = task_families(&nf);
    for (int i = 0; i < nf; i++) test_builtin_equals_direct(fam[i]);
    test_order_and_batches();
    test_failure_latches();
    test_sync_score();
    test_free_while_busy();
    test_rollouter_beside_generation();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
    TEST_MAIN_END();
}
