/* moerl — rewards from inside and outside moerl, computed beside generation.
 *
 * A reward request is one finished response with its row's fields, in the shape of verl's
 * `compute_score(data_source, solution_str, ground_truth, extra_info)` (verl/utils/reward_score/
 * __init__.py: default_compute_score; verl/workers/reward_manager/naive.py). A backend scores a
 * batch of requests: the built-in rule rewards (data/rewards.h), a pool of worker processes
 * speaking JSON lines (reward.custom_reward_function.path/.name through the Python adapter moerl
 * ships, or any reward.command), or an HTTP reward server (reward.url, libcurl). A reward pool
 * runs one backend on its own thread, so that the rollouter hands finished groups over and keeps
 * generating; a group enters the queue once all its rewards are in.
 *
 * Layer: reward sits above data (and base), below rl.
 */
#ifndef MOERL_REWARD_H
#define MOERL_REWARD_H

#include <stdint.h>

#include "base/config.h"

/* One response to score. Every string is borrowed for the duration of the call that takes it
 * (reward_pool_submit copies). */
typedef struct {
    const char *data_source;
    const char *solution_str;    /* the decoded response text */
    const char *ground_truth;    /* a string, or JSON text when ground_truth_json */
    int ground_truth_json;
    const char *extra_info_json; /* a JSON object's text, or NULL (sent as null) */
    const char *prompt_json;     /* the prompt's messages as a JSON list's text, or NULL */
    const char *where;           /* the row, "FILE:LINE" (dataset_where), for messages */
} reward_request;

/* The answer to one request: the score (finite) and any other numeric fields the reward program
 * returned (metrics reward/<key>/mean, as verl's reward managers report reward_extra_info), and
 * the extracted answer `pred` when the reward knows it (maj@N of validation; NULL if not). Free
 * with reward_result_free. */
typedef struct {
    double score;
    int n_extra;
    char **extra_keys;
    double *extra_vals;
    char *pred;
} reward_result;

void reward_result_free(reward_result *r);
/* Deep copy of src into *dst. */
void reward_result_copy(reward_result *dst, const reward_result *src);

/* ---- configuration (reward.* keys, read by src/reward/reward_config.c) ---- */

typedef enum { REWARD_BUILTIN = 0, REWARD_FUNCTION, REWARD_COMMAND, REWARD_URL } reward_kind;

typedef struct {
    reward_kind kind;        /* from which of the keys below is set (at most one) */
    char function_path[1024]; /* reward.custom_reward_function.path (a Python file) */
    char function_name[256];  /* reward.custom_reward_function.name (default compute_score) */
    char command[2048];       /* reward.command: a program speaking the JSON-lines protocol */
    char url[2048];           /* reward.url: an HTTP endpoint taking batched POSTs */
    char python[512];         /* reward.python: the interpreter for the adapter (default python3) */
    int num_workers;          /* reward.num_workers: processes (function/command) */
    int max_concurrency;      /* reward.max_concurrency: POSTs in flight (url) */
    int batch_size;           /* reward.batch_size: requests per POST (url) */
    double timeout_s;         /* reward.timeout_s: per request (process) or per POST (url) */
    int max_retries;          /* reward.max_retries: retries of a failed request before the run stops */
} reward_config;

/* Declare the reward.* keys (with defaults and help) in c. */
void reward_def_keys(cfg *c);
/* Read and check them. Errors name the key and the value expected (two sources set at once,
 * a missing file, a non-positive count, ...). */
int reward_read_config(const cfg *c, reward_config *out);

/* ---- backends ---- */

typedef struct reward_backend reward_backend;
struct reward_backend {
    const char *what; /* names the backend in messages: "reward.command 'X'", "reward.url X", "built-in" */
    /* Score reqs[0..n) into out[0..n) (zero-initialised by the caller). Blocking; called from one
     * thread at a time. Handles its own concurrency, timeouts and retries; MOERL_ERR: a failure
     * retrying did not cure, with a message naming `what`, the row (reqs[i].where) and the cause. */
    int (*score)(reward_backend *b, const reward_request *reqs, int n, reward_result *out);
    void (*free)(reward_backend *b);
    /* Optional (NULL: none). Called from ANOTHER thread while `score` may be running (reward_pool_free
     * stopping a busy pool): make that call return soon with MOERL_ERR (kill the worker processes,
     * abort the transfers) without freeing anything `score` still uses; `free` follows once it has
     * returned. Idempotent; a no-op when nothing runs. Without it, stopping a busy pool waits for the
     * batch to finish (bounded by the backend's own timeouts). */
    void (*cancel)(reward_backend *b);
};

/* The built-in rule rewards by data_source (data/rewards.h: reward_score). Never NULL. */
reward_backend *reward_backend_builtin(void);
/* The backend of c (built-in, worker processes or HTTP); NULL with an error when it cannot start
 * (the program does not run, the adapter cannot import the file or find the function, ...). */
reward_backend *reward_backend_create(const reward_config *c);

/* ---- the pool: a backend on its own thread ---- */

typedef struct reward_pool reward_pool;

/* A submission whose results are all in: its tag and results[0..n) (owned by the caller after
 * reward_pool_poll; free each with reward_result_free, then the array). */
typedef struct {
    uint64_t tag;
    int n;
    reward_result *results;
} reward_done;

/* Start a pool running backend b (the pool owns b). */
reward_pool *reward_pool_create(reward_backend *b);
/* Queue reqs[0..n) under `tag` (copied); never blocks on scoring. The thread takes everything
 * pending as one batch; results come back in submission order (an empty submission at once).
 * Error: the latched failure. */
int reward_pool_submit(reward_pool *p, uint64_t tag, const reward_request *reqs, int n);
/* Up to max finished submissions into out, waiting up to wait_s seconds for the first (0: do not
 * wait). Returns the count, or MOERL_ERR once the backend has failed (the message is the
 * backend's; every later call fails the same way). */
int reward_pool_poll(reward_pool *p, reward_done *out, int max, double wait_s);
/* Requests submitted and not yet handed out by reward_pool_poll. */
int reward_pool_backlog(reward_pool *p);
/* Score reqs[0..n) now and wait (validation; the rollouter in lockstep/sync mode): out[0..n) as
 * backend->score fills it, on the calling thread, never at the same time as the pool's thread (one
 * caller of backend->score at a time). A failure latches as the thread's does (out is released). */
int reward_pool_score(reward_pool *p, const reward_request *reqs, int n, reward_result *out);
/* Seconds the pool's thread has spent in backend->score since the pool started (metric
 * timing_s/reward: the job reports the difference per window). */
double reward_pool_busy_s(reward_pool *p);
/* The backend's name for messages (backend->what). */
const char *reward_pool_what(const reward_pool *p);
/* Stop the thread (a batch being scored is finished or, for processes, killed) and free. */
void reward_pool_free(reward_pool *p);

#endif
