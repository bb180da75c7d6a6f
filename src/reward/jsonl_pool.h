/* moerl — the transport the reward backends (proc.c, http.c) and the tool environment client
 * (env.c) share; not a public interface.
 *
 * Processes: a pool of worker processes, each a copy of one program speaking JSON lines (one
 * request line in, one answer line out, one request in flight per process), started with
 * posix_spawn in their own process group. HTTP: POSTs of JSON bodies to one URL (libcurl's multi
 * interface), at most max_concurrency in flight.
 *
 * Requests are submitted by id (the caller's number) and progress only inside jsonl_*_step, which
 * hands answers and failures to the caller's policy (callbacks): what a failure means — try again,
 * an answer of the caller's own (the request is then resolved), or a run-stopping error — is the
 * caller's. The transport itself stops (MOERL_ERR) only on what no policy can cure: a line the
 * program was not asked for, an answer line over 64 MiB, a program that cannot be started.
 */
#ifndef MOERL_JSONL_POOL_H
#define MOERL_JSONL_POOL_H

#include <stddef.h>

/* What a policy's on_failure returns (or MOERL_ERR with its message set: the run stops). */
enum {
    JSONL_RETRY = 1,   /* send the request again (processes: on a fresh process; HTTP: after jsonl_backoff_s) */
    JSONL_RESOLVED = 2 /* the policy gave the request its own answer: it is done */
};

/* How a process failed on its request. */
typedef enum {
    JSONL_DIED = 1,     /* exited with a status ≠ 0, was killed by a signal, or closed its pipes and hung */
    JSONL_EXITED_0 = 2, /* exited with status 0 without answering */
    JSONL_HUNG = 3      /* no answer within the timeout: killed */
} jsonl_failure;

/* ---- worker processes ---- */

typedef struct {
    void *ctx;
    /* Request id's answer line text[0..len) (without '\n'). MOERL_ERR stops with the policy's message. */
    int (*on_answer)(void *ctx, long id, const char *text, size_t len);
    /* The process running request id failed (kind); tries: failed attempts so far (≥ 1); how: what
     * happened ("exited with status 3", ...); note: "; its stderr ends: ..." or "". The process is
     * already killed and reaped. Returns JSONL_RETRY, JSONL_RESOLVED or MOERL_ERR. */
    int (*on_failure)(void *ctx, long id, jsonl_failure kind, int tries, const char *how, const char *note);
    /* The request's place for messages (a row "FILE:LINE", a trajectory), or NULL. */
    const char *(*where)(void *ctx, long id);
} jsonl_proc_policy;

typedef struct jsonl_procs jsonl_procs;

/* n_workers processes of argv (copied; argv[0] looked up in PATH), all started now. what: names
 * the program in messages ("reward.command 'X'"); timeout_s: per request (each worker's very first
 * request gets max(10 s, timeout_s) more, for its start-up; not again after a restart), and for a process to exit once
 * its pipes close; timeout_key: the key timeout_s came from, for messages. ready_line:
 * each process first writes a line holding "ready" (the verl adapter); waited for up to
 * timeout_s. NULL with an error naming the program when one cannot start. */
jsonl_procs *jsonl_procs_create(const char *what, char *const *argv, int n_workers, double timeout_s,
                                const char *timeout_key, int ready_line);
/* Queue request id's line (JSON text without '\n'; owned by the pool from now). */
void jsonl_procs_submit(jsonl_procs *p, long id, char *line);
/* Requests submitted and not yet answered or resolved. */
int jsonl_procs_pending(const jsonl_procs *p);
/* Hand queued requests to idle processes (starting those not running), wait up to wait_s seconds
 * (< 0: until the next request deadline) for something to happen, and handle what came: answers,
 * process ends, timeouts, through pol. MOERL_ERR: the policy's or the transport's error. */
int jsonl_procs_step(jsonl_procs *p, const jsonl_proc_policy *pol, double wait_s);
/* An idle process with a line waiting is one line too many (an error); one that ended is reaped. */
int jsonl_procs_check_extra(jsonl_procs *p, const jsonl_proc_policy *pol);
/* After an error: drop the queue and kill the processes with a request in flight or unread output
 * (all of them once cancelled), so that nothing stale answers the next request. */
void jsonl_procs_abort(jsonl_procs *p);
/* From another thread: make a running step return MOERL_ERR ("WHAT: cancelled") soon. */
void jsonl_procs_cancel(jsonl_procs *p);
int jsonl_procs_cancelled(const jsonl_procs *p);
/* Kill and reap every process, free. */
void jsonl_procs_free(jsonl_procs *p);

/* ---- HTTP ---- */

typedef struct {
    void *ctx;
    /* A 2xx answer's body[0..len) for request id. MOERL_ERR stops with the policy's message. */
    int (*on_body)(void *ctx, long id, const char *body, size_t len);
    /* Request id's POST failed; tries: failed attempts so far (≥ 1); retryable: a timeout, a
     * connection that failed or broke, HTTP 5xx or 429 (else another status, or a body over 256 MiB);
     * timed_out: no answer within the timeout; why: the cause ("HTTP 400, body '...'"). Returns
     * JSONL_RETRY (after jsonl_backoff_s(tries)), JSONL_RESOLVED or MOERL_ERR. */
    int (*on_failure)(void *ctx, long id, int tries, int retryable, int timed_out, const char *why);
} jsonl_http_policy;

typedef struct jsonl_http jsonl_http;

/* POSTs to url (Content-Type: application/json), each with a timeout of timeout_s (named
 * timeout_key in messages), at most max_concurrency at once. NULL with an error naming `what`
 * when libcurl cannot start. */
jsonl_http *jsonl_http_create(const char *what, const char *url, int max_concurrency, double timeout_s,
                              const char *timeout_key);
/* Queue request id's body (owned by the transport from now). */
void jsonl_http_submit(jsonl_http *h, long id, char *body);
int jsonl_http_pending(const jsonl_http *h);
/* Start what may go, wait up to wait_s seconds (< 0: up to 1 s) for a transfer, and hand finished
 * ones to pol. */
int jsonl_http_step(jsonl_http *h, const jsonl_http_policy *pol, double wait_s);
/* Drop every request (transfers in flight are aborted). */
void jsonl_http_abort(jsonl_http *h);
void jsonl_http_cancel(jsonl_http *h);
int jsonl_http_cancelled(const jsonl_http *h);
void jsonl_http_free(jsonl_http *h);

/* The wait before retry number `tries` (1, 2, ...): 0.2 s doubling, at most 10 s. */
double jsonl_backoff_s(int tries);

/* Monotonic seconds. */
double jsonl_now_s(void);

#endif
