/* moerl — the environment client: runs the tool calls of multi-turn rollouts outside moerl, in the
 * environment programs (`command:`) and servers (`url:`) of the tool config (data/tool_calls.h),
 * over the transport the reward backends use (jsonl_pool.h). docs/multi-turn.md describes the
 * protocol for users.
 *
 * A call is {"trajectory_id": ID, "name": TOOL, "arguments": {...}}: one JSON line to a program (its
 * command line split into words as reward.command's, run without a shell)
 * (one call in flight per process, rollout.multi_turn.tool_num_workers processes per distinct
 * command) or one POST of that object to a server (at most rollout.multi_turn.tool_max_concurrency
 * in flight per distinct URL). The answer is an object {"content": "...", "done": bool?, "reward":
 * number?}. Tools that share a command or a URL share its processes or connections: one
 * environment may serve several tools.
 *
 * What the model sees when a tool fails (the call is answered, counted, and the run goes on):
 *   - an {"error": ...} answer, an answer that is not a JSON object, a "content" missing or not a
 *     string, a "done" not a bool, a "reward" not a finite number → "Error: ..." (a tool error);
 *   - no answer within rollout.multi_turn.tool_timeout_s → "Error: ... timed out" (a timeout; the
 *     process is killed and started again for the next call; the POST is abandoned).
 * What stops the run (env_poll returns MOERL_ERR, the message names the tool, the program or URL
 * and the trajectory): a program that dies on a call (exit, signal, closed pipes) more than
 * rollout.multi_turn.tool_max_retries times in a row for that call (each time restarted and the call
 * sent again), a program that cannot start, one that writes a line it was not asked for; a server
 * that refuses (connection refused or broken, HTTP 5xx/429) more than tool_max_retries times for a
 * call, or answers another non-2xx status.
 *
 * Layer: beside reward/ (above data, below rl). Not thread-safe: one thread submits and polls; the
 * calls make progress inside env_poll (poll with wait 0 between decode steps to keep them moving).
 */
#ifndef MOERL_ENV_H
#define MOERL_ENV_H

#include <stdint.h>

#include "base/config.h"
#include "data/tool_calls.h"

typedef struct {
    double timeout_s;    /* rollout.multi_turn.tool_timeout_s: seconds one call may take */
    int num_workers;     /* rollout.multi_turn.tool_num_workers: processes per environment program */
    int max_concurrency; /* rollout.multi_turn.tool_max_concurrency: POSTs in flight per server */
    int max_retries;     /* rollout.multi_turn.tool_max_retries: restarts/retries of one call */
} env_config;

/* Declare the rollout.multi_turn.tool_* keys above (with defaults and help) in c. */
void env_def_keys(cfg *c);
/* Read and check them (timeout > 0 and finite, counts ≥ 1, retries ≥ 0); errors name the key, its
 * origin and the value. */
int env_read_config(const cfg *c, env_config *out);

/* Check that every tool's command: splits into a program and its arguments (as reward.command: no
 * shell — quotes, $VAR and ~ expand; | & ; < > ( ) and command substitution are refused). Errors name
 * the tool. */
int env_check_tools(const tool_config *tc);

/* One finished call. content: the tool response the model sees (owned; free with
 * env_result_free). */
typedef struct {
    uint64_t tag;       /* as submitted */
    char *content;      /* the tool's "content", or "Error: ..." for a failed call */
    int done;           /* the environment ended the episode ("done": true) */
    int has_reward;     /* the environment gave a reward ... */
    double reward;      /* ... this one */
    int error;          /* 1: a tool error (see above) */
    int timed_out;      /* 1: no answer within the timeout */
    double latency_s;   /* seconds from env_submit to the answer */
} env_result;

void env_result_free(env_result *r);

/* Totals since env_create (metrics: tool calls, tool errors, tool latency). */
typedef struct {
    long calls;           /* finished calls */
    long errors;          /* of which tool errors */
    long timeouts;        /* of which timeouts */
    double latency_sum_s; /* over finished calls */
    double latency_max_s;
} env_stats;

typedef struct env_client env_client;

/* A client for the tools of tc (borrowed; must outlive the client): the environment programs are
 * started now. NULL with an error naming the tool and the program when one cannot start. */
env_client *env_create(const tool_config *tc, const env_config *c);
/* Send a call of tool `name` with `arguments` (a JSON object's text) for trajectory_id (copied), to
 * be answered under `tag`. Errors (nothing sent): an unknown tool name, arguments that are not a
 * JSON object (the hermes parser answers such calls itself; these are the caller's bugs). */
int env_submit(env_client *e, uint64_t tag, const char *trajectory_id, const char *name, const char *arguments);
/* Up to max finished calls into out (in the order they finished), waiting up to wait_s seconds for
 * the first (0: do not wait). Returns the count, or MOERL_ERR when the run must stop (above); after
 * that every call fails the same way. */
int env_poll(env_client *e, env_result *out, int max, double wait_s);
/* Calls submitted and not yet handed out by env_poll. */
int env_pending(const env_client *e);
void env_get_stats(const env_client *e, env_stats *out);
/* Kill and reap the programs, abandon the transfers, free. */
void env_free(env_client *e);

#endif
