#include "rl/queue.h"

#include <errno.h>
#include <math.h>
#include <time.h>

#include "base/common.h"

void rl_queue_init(rl_queue *q, int capacity) {
    q->items = xcalloc(capacity > 0 ? capacity : 1, sizeof(void *));
    q->cap = capacity;
    q->head = q->count = q->closed = 0;
    q->total_put = q->total_got = 0;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->not_empty, NULL);
}

void rl_queue_destroy(rl_queue *q) {
    free(q->items);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->not_empty);
}

int rl_queue_put(rl_queue *q, void *item) {
    pthread_mutex_lock(&q->mu);
    if (q->closed || q->count == q->cap) {
        int closed = q->closed;
        pthread_mutex_unlock(&q->mu);
        return moerl_errorf(closed ? "message queue: put after close"
                                   : "message queue: full (capacity %d) — the staleness budget was violated", q->cap);
    }
    q->items[(q->head + q->count) % q->cap] = item;
    q->count++;
    q->total_put++;
    pthread_cond_broadcast(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
    return MOERL_OK;
}

static void take(rl_queue *q, void **out, int n) {
    for (int i = 0; i < n; i++) {
        out[i] = q->items[q->head];
        q->head = (q->head + 1) % q->cap;
    }
    q->count -= n;
    q->total_got += n;
}

int rl_queue_get_n(rl_queue *q, void **out, int n, double timeout_s, double *waited_s) {
    double t0 = moerl_now();
    struct timespec dl;
    if (timeout_s > 0) {
        clock_gettime(CLOCK_REALTIME, &dl);
        double s = dl.tv_sec + dl.tv_nsec * 1e-9 + timeout_s;
        dl.tv_sec = (time_t)s;
        dl.tv_nsec = (long)((s - floor(s)) * 1e9);
    }
    int rc = n;
    pthread_mutex_lock(&q->mu);
    while (q->count < n && !q->closed) {
        if (timeout_s > 0) {
            if (pthread_cond_timedwait(&q->not_empty, &q->mu, &dl) == ETIMEDOUT && q->count < n) {
                rc = -1;
                break;
            }
        } else {
            pthread_cond_wait(&q->not_empty, &q->mu);
        }
    }
    if (rc > 0) {
        if (q->count >= n) take(q, out, n);
        else rc = 0;
    }
    pthread_mutex_unlock(&q->mu);
    if (waited_s) *waited_s = moerl_now() - t0;
    return rc;
}

int rl_queue_try_get_n(rl_queue *q, void **out, int n) {
    pthread_mutex_lock(&q->mu);
    int ok = q->count >= n;
    if (ok) take(q, out, n);
    pthread_mutex_unlock(&q->mu);
    return ok ? n : 0;
}

int rl_queue_size(rl_queue *q) {
    pthread_mutex_lock(&q->mu);
    int n = q->count;
    pthread_mutex_unlock(&q->mu);
    return n;
}

int rl_queue_peek_all(rl_queue *q, void **out, int max) {
    pthread_mutex_lock(&q->mu);
    int n = q->count < max ? q->count : max;
    for (int i = 0; i < n; i++) out[i] = q->items[(q->head + i) % q->cap];
    pthread_mutex_unlock(&q->mu);
    return n;
}

void rl_queue_close(rl_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
}
