/* MessageQueue: the bounded FIFO of finished prompt groups between rollouter and trainer
 * (verl fully_async_policy's MessageQueue). Capacity = max_required_samples; it never drops:
 * a put on a full queue is refused with an error (the staleness budget guarantees it cannot
 * happen, and the test suite checks that), a get waits. Thread-safe (mutex + condition
 * variables); close() wakes every waiter. */
#ifndef MOERL_QUEUE_H
#define MOERL_QUEUE_H

#include <pthread.h>
#include <stdint.h>

typedef struct rl_queue {
    void **items;
    int cap, head, count;
    int closed;
    int64_t total_put, total_got;
    pthread_mutex_t mu;
    pthread_cond_t not_empty;
} rl_queue;

void rl_queue_init(rl_queue *q, int capacity);
void rl_queue_destroy(rl_queue *q);
/* Append; MOERL_ERR if full or closed (message says which). */
int rl_queue_put(rl_queue *q, void *item);
/* Take exactly n items in FIFO order into out[], waiting until n are available. Returns n, or
 * 0 if the queue was closed before n arrived (nothing taken). timeout_s > 0 bounds the wait
 * (returns −1 on timeout, nothing taken). *waited_s gets the time spent waiting. */
int rl_queue_get_n(rl_queue *q, void **out, int n, double timeout_s, double *waited_s);
/* Non-blocking: take n if available (returns n) else 0. */
int rl_queue_try_get_n(rl_queue *q, void **out, int n);
int rl_queue_size(rl_queue *q);
/* Copy up to max item pointers (oldest first) without removing them; returns how many. */
int rl_queue_peek_all(rl_queue *q, void **out, int max);
void rl_queue_close(rl_queue *q);

#endif
