/* Reward worker processes: reward.num_workers copies of reward.command (or of the verl adapter
 * running reward.custom_reward_function.path), each speaking JSON lines (docs/rewards.md) through
 * the shared transport of jsonl_pool.h, with the reward's failure policy.
 *
 * Failures: a process that crashes (exit status ≠ 0 or a signal) or hangs past reward.timeout_s is
 * killed, restarted and its request retried, up to reward.max_retries times; an answer that is not
 * JSON, not a number/object with "score", not finite, or an error the program reports, is a bug in
 * the program and stops at once; so does a program that exits with status 0 before answering or
 * writes more lines than it was sent. Messages name the program, the row (reward_request.where)
 * and the cause, with the end of the program's stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "reward/jsonl_pool.h"
#include "reward/reward_internal.h"

/* The adapter's Python text (src/reward/verl_adapter.py, embedded by the Makefile). */
#include "reward/verl_adapter.h"

typedef struct {
    reward_backend base;
    char what[3400];
    int max_retries;
    jsonl_procs *procs;
} proc_backend;

/* One score call in progress. */
typedef struct {
    proc_backend *pb;
    const reward_request *reqs;
    reward_result *out;
} proc_run;

static const char *row_of(void *ctx, long i) {
    const proc_run *r = ctx;
    return i >= 0 && r->reqs[i].where ? r->reqs[i].where : "(no row)";
}

static int on_answer(void *ctx, long i, const char *text, size_t len) {
    proc_run *r = ctx;
    if (reward_parse_answer_text(text, len, &r->out[i]) == MOERL_OK) return MOERL_OK;
    char *why = xstrdup(moerl_last_error());
    moerl_errorf("%s: %s: its answer: %s", r->pb->what, row_of(r, i), why);
    free(why);
    return MOERL_ERR;
}

/* A crash or a hang: retried on a fresh process while reward.max_retries allows; a clean exit
 * without an answer stops at once. */
static int on_failure(void *ctx, long i, jsonl_failure kind, int tries, const char *how, const char *note) {
    proc_run *r = ctx;
    proc_backend *pb = r->pb;
    if (kind == JSONL_EXITED_0)
        return moerl_errorf("%s: %s: the program %s, without answering this request: it must answer every "
                            "request line with one line%s",
                            pb->what, row_of(r, i), how, note);
    if (tries > pb->max_retries)
        return moerl_errorf("%s: %s: the program %s (%d attempt%s, reward.max_retries=%d)%s", pb->what, row_of(r, i),
                            how, tries, tries > 1 ? "s" : "", pb->max_retries, note);
    log_warn("%s: %s: the program %s; restarting it (retry %d of reward.max_retries=%d)%s", pb->what, row_of(r, i),
             how, tries, pb->max_retries, note);
    return JSONL_RETRY;
}

static int proc_score(reward_backend *b, const reward_request *reqs, int n, reward_result *out) {
    proc_backend *pb = (proc_backend *)b;
    if (jsonl_procs_cancelled(pb->procs)) return moerl_errorf("%s: cancelled", pb->what);
    proc_run r = {pb, reqs, out};
    jsonl_proc_policy pol = {&r, on_answer, on_failure, row_of};
    int rc = jsonl_procs_check_extra(pb->procs, &pol);
    for (int i = 0; i < n && rc == MOERL_OK; i++) {
        json_t *j = reward_request_json(&reqs[i]);
        if (!j) {
            rc = moerl_error_prefix("%s: ", pb->what);
            break;
        }
        jsonl_procs_submit(pb->procs, i, json_dumps(j, JSON_COMPACT));
        json_decref(j);
    }
    while (rc == MOERL_OK && jsonl_procs_pending(pb->procs) > 0) rc = jsonl_procs_step(pb->procs, &pol, -1);
    if (rc == MOERL_OK) rc = jsonl_procs_check_extra(pb->procs, &pol);
    if (rc != MOERL_OK) {
        reward_results_clear(out, n);
        jsonl_procs_abort(pb->procs);
    }
    return rc;
}

static void proc_cancel(reward_backend *b) { jsonl_procs_cancel(((proc_backend *)b)->procs); }

static void proc_free(reward_backend *b) {
    proc_backend *pb = (proc_backend *)b;
    if (!pb) return;
    jsonl_procs_free(pb->procs);
    free(pb);
}

/* argv of the adapter: PYTHON -c <adapter text> PATH NAME. */
static char **adapter_argv(const reward_config *c, int *argc) {
    char **a = xcalloc(6, sizeof(char *));
    a[0] = xstrdup(c->python);
    a[1] = xstrdup("-c");
    a[2] = xstrdup(reward_verl_adapter_py);
    a[3] = xstrdup(c->function_path);
    a[4] = xstrdup(c->function_name);
    *argc = 5;
    return a;
}

reward_backend *reward_proc_create(const reward_config *c) {
    proc_backend *pb = xcalloc(1, sizeof *pb);
    pb->base.score = proc_score;
    pb->base.cancel = proc_cancel;
    pb->base.free = proc_free;
    pb->base.what = pb->what;
    pb->max_retries = c->max_retries;
    char **argv = NULL;
    int argc = 0;
    if (c->kind == REWARD_FUNCTION) {
        snprintf(pb->what, sizeof pb->what, "reward.custom_reward_function.path '%s' (function %s, run by %s)",
                 c->function_path, c->function_name, c->python);
        argv = adapter_argv(c, &argc);
    } else {
        snprintf(pb->what, sizeof pb->what, "reward.command '%s'", c->command);
        if (reward_split_command(c->command, &argv, &argc) != MOERL_OK) {
            moerl_error_prefix("reward.command: ");
            free(pb);
            return NULL;
        }
    }
    pb->procs = jsonl_procs_create(pb->what, argv, c->num_workers, c->timeout_s, "reward.timeout_s",
                                   c->kind == REWARD_FUNCTION);
    reward_free_argv(argv, argc);
    if (!pb->procs) {
        free(pb);
        return NULL;
    }
    return &pb->base;
}
