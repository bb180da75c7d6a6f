/* The reward pool: one backend driven by its own thread. Submissions (a tag and its requests,
 * copied) wait in a FIFO; the thread takes everything pending as ONE batch for backend->score,
 * then hands each submission's results back under its tag, in submission order. A backend
 * failure latches: the message is kept and every later poll, submit or score returns it.
 * reward_pool_score lets another thread (validation) use the same backend synchronously: the
 * backend is called by one thread at a time (score_mu). See reward.h. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/common.h"
#include "reward/reward.h"

void reward_result_free(reward_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_extra; i++) free(r->extra_keys[i]);
    free(r->extra_keys);
    free(r->extra_vals);
    free(r->pred);
    r->extra_keys = NULL;
    r->extra_vals = NULL;
    r->pred = NULL;
    r->n_extra = 0;
}

void reward_result_copy(reward_result *dst, const reward_result *src) {
    dst->score = src->score;
    dst->n_extra = src->n_extra;
    dst->extra_keys = NULL;
    dst->extra_vals = NULL;
    if (src->n_extra > 0) {
        dst->extra_keys = xmalloc((size_t)src->n_extra * sizeof(char *));
        dst->extra_vals = xmalloc((size_t)src->n_extra * sizeof(double));
        for (int i = 0; i < src->n_extra; i++) {
            dst->extra_keys[i] = xstrdup(src->extra_keys[i]);
            dst->extra_vals[i] = src->extra_vals[i];
        }
    }
    dst->pred = src->pred ? xstrdup(src->pred) : NULL;
}

typedef struct sub {
    uint64_t tag;
    int n;
    reward_request *reqs; /* owned copies of the strings */
    reward_result *results;
    struct sub *next;
} sub;

struct reward_pool {
    reward_backend *b;
    pthread_t thread;
    pthread_mutex_t mu;       /* everything below except the backend itself */
    pthread_cond_t cv;        /* work arrived / stop (to the thread); results / failure (to pollers) */
    pthread_mutex_t score_mu; /* held while backend->score runs: one caller at a time */
    sub *pend_head, *pend_tail; /* waiting to be scored */
    sub *done_head, *done_tail; /* scored, not handed out */
    int backlog;              /* requests submitted and not handed out */
    int busy, stop, failed;
    double busy_s;
    char err[2048];
};

static char *dup_or_null(const char *s) { return s ? xstrdup(s) : NULL; }

static void sub_free(sub *s) {
    for (int i = 0; i < s->n; i++) {
        reward_request *q = &s->reqs[i];
        free((char *)q->data_source);
        free((char *)q->solution_str);
        free((char *)q->ground_truth);
        free((char *)q->extra_info_json);
        free((char *)q->prompt_json);
        free((char *)q->where);
        if (s->results) reward_result_free(&s->results[i]);
    }
    free(s->reqs);
    free(s->results);
    free(s);
}

static void list_free(sub *s) {
    while (s) {
        sub *nx = s->next;
        sub_free(s);
        s = nx;
    }
}

static void append(sub **head, sub **tail, sub *s) {
    s->next = NULL;
    if (*tail) (*tail)->next = s;
    else *head = s;
    *tail = s;
}

/* Record the backend's failure (called with mu held): the first message wins. */
static void latch(reward_pool *p, const char *msg) {
    if (p->failed) return;
    p->failed = 1;
    snprintf(p->err, sizeof p->err, "%s", msg && msg[0] ? msg : "the reward backend failed without a message");
    pthread_cond_broadcast(&p->cv);
}

static int latched_error(const reward_pool *p) { return moerl_errorf("%s", p->err); }

/* Score the batch s (a list, with mu NOT held): the requests of every submission in one call. */
static int score_batch(reward_pool *p, sub *batch, double *secs) {
    int total = 0;
    for (sub *s = batch; s; s = s->next) total += s->n;
    reward_request *reqs = xmalloc((size_t)(total ? total : 1) * sizeof *reqs);
    reward_result *res = xcalloc((size_t)(total ? total : 1), sizeof *res);
    int o = 0;
    for (sub *s = batch; s; s = s->next) {
        memcpy(reqs + o, s->reqs, (size_t)s->n * sizeof *reqs);
        o += s->n;
    }
    pthread_mutex_lock(&p->score_mu);
    const double t0 = moerl_now();
    int rc = total > 0 ? p->b->score(p->b, reqs, total, res) : MOERL_OK;
    *secs = moerl_now() - t0;
    pthread_mutex_unlock(&p->score_mu);
    for (int i = 0; i < total && rc == MOERL_OK; i++) /* a backend that lies: refused, not trained on */
        if (!isfinite(res[i].score))
            rc = moerl_errorf("%s returned the score %g for row %s: a reward must be a finite number", p->b->what,
                              res[i].score, reqs[i].where ? reqs[i].where : "(unknown)");
    o = 0;
    for (sub *s = batch; s; s = s->next) {
        s->results = xcalloc((size_t)(s->n ? s->n : 1), sizeof(reward_result));
        memcpy(s->results, res + o, (size_t)s->n * sizeof *res); /* moved: res's pointers now belong to s */
        o += s->n;
    }
    free(reqs);
    free(res);
    return rc;
}

static void *pool_main(void *arg) {
    reward_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->failed && !p->pend_head) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop || p->failed) break;
        sub *batch = p->pend_head; /* everything pending, as one batch */
        p->pend_head = p->pend_tail = NULL;
        p->busy = 1;
        pthread_mutex_unlock(&p->mu);
        double secs = 0;
        const int rc = score_batch(p, batch, &secs);
        pthread_mutex_lock(&p->mu);
        p->busy = 0;
        p->busy_s += secs;
        if (rc != MOERL_OK) {
            latch(p, p->stop ? "the reward pool was stopped while scoring" : moerl_last_error());
            list_free(batch);
            break;
        }
        while (batch) {
            sub *nx = batch->next;
            append(&p->done_head, &p->done_tail, batch);
            batch = nx;
        }
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

reward_pool *reward_pool_create(reward_backend *b) {
    if (!b) {
        moerl_errorf("reward pool: no backend");
        return NULL;
    }
    reward_pool *p = xcalloc(1, sizeof *p);
    p->b = b;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->score_mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, pool_main, p) != 0) {
        moerl_errorf("reward pool (%s): cannot start its thread", b->what);
        pthread_mutex_destroy(&p->mu);
        pthread_mutex_destroy(&p->score_mu);
        pthread_cond_destroy(&p->cv);
        b->free(b);
        free(p);
        return NULL;
    }
    return p;
}

int reward_pool_submit(reward_pool *p, uint64_t tag, const reward_request *reqs, int n) {
    if (n < 0) return moerl_errorf("reward pool: %d requests submitted under tag %llu", n, (unsigned long long)tag);
    sub *s = xcalloc(1, sizeof *s);
    s->tag = tag;
    s->n = n;
    s->reqs = xcalloc((size_t)(n ? n : 1), sizeof *s->reqs);
    for (int i = 0; i < n; i++) {
        const reward_request *q = &reqs[i];
        reward_request *c = &s->reqs[i];
        c->data_source = dup_or_null(q->data_source);
        c->solution_str = dup_or_null(q->solution_str);
        c->ground_truth = dup_or_null(q->ground_truth);
        c->ground_truth_json = q->ground_truth_json;
        c->extra_info_json = dup_or_null(q->extra_info_json);
        c->prompt_json = dup_or_null(q->prompt_json);
        c->where = dup_or_null(q->where);
    }
    pthread_mutex_lock(&p->mu);
    if (p->failed) {
        pthread_mutex_unlock(&p->mu);
        sub_free(s);
        return latched_error(p); /* p->err is stable once failed */
    }
    p->backlog += n;
    if (n == 0) {
        s->results = xcalloc(1, sizeof(reward_result));
        append(&p->done_head, &p->done_tail, s);
    } else {
        append(&p->pend_head, &p->pend_tail, s);
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return MOERL_OK;
}

static void deadline_after(struct timespec *ts, double s) {
    clock_gettime(CLOCK_REALTIME, ts);
    const double ns = ts->tv_nsec + s * 1e9;
    ts->tv_sec += (time_t)(ns / 1e9);
    ts->tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int reward_pool_poll(reward_pool *p, reward_done *out, int max, double wait_s) {
    pthread_mutex_lock(&p->mu);
    if (wait_s > 0 && !p->done_head && !p->failed) {
        struct timespec dl;
        deadline_after(&dl, wait_s);
        while (!p->done_head && !p->failed && !p->stop)
            if (pthread_cond_timedwait(&p->cv, &p->mu, &dl) != 0) break;
    }
    if (p->failed) {
        pthread_mutex_unlock(&p->mu);
        return latched_error(p);
    }
    int k = 0;
    while (k < max && p->done_head) {
        sub *s = p->done_head;
        p->done_head = s->next;
        if (!p->done_head) p->done_tail = NULL;
        p->backlog -= s->n;
        out[k].tag = s->tag;
        out[k].n = s->n;
        out[k].results = s->results;
        s->results = NULL;
        sub_free(s);
        k++;
    }
    pthread_mutex_unlock(&p->mu);
    return k;
}

int reward_pool_backlog(reward_pool *p) {
    pthread_mutex_lock(&p->mu);
    const int n = p->backlog;
    pthread_mutex_unlock(&p->mu);
    return n;
}

double reward_pool_busy_s(reward_pool *p) {
    pthread_mutex_lock(&p->mu);
    const double s = p->busy_s;
    pthread_mutex_unlock(&p->mu);
    return s;
}

const char *reward_pool_what(const reward_pool *p) { return p->b->what; }

int reward_pool_score(reward_pool *p, const reward_request *reqs, int n, reward_result *out) {
    pthread_mutex_lock(&p->mu);
    const int failed = p->failed;
    pthread_mutex_unlock(&p->mu);
    if (failed) return latched_error(p);
    if (n <= 0) return MOERL_OK;
    pthread_mutex_lock(&p->score_mu);
    const int rc = p->b->score(p->b, reqs, n, out);
    pthread_mutex_unlock(&p->score_mu);
    if (rc != MOERL_OK) {
        pthread_mutex_lock(&p->mu);
        latch(p, moerl_last_error());
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < n; i++) reward_result_free(&out[i]);
        return latched_error(p);
    }
    return MOERL_OK;
}

void reward_pool_free(reward_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    const int busy = p->busy;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (busy && p->b->cancel) p->b->cancel(p->b); /* the batch being scored returns soon */
    pthread_join(p->thread, NULL);
    list_free(p->pend_head);
    list_free(p->done_head);
    p->b->free(p->b);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->score_mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
