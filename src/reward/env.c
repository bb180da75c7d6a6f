/* The environment client (env.h): tool calls to environment programs and servers over the
 * transport of jsonl_pool.h, with the tools' failure policy. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "reward/env.h"
#include "reward/jsonl_pool.h"
#include "reward/reward_internal.h"

/* One environment: the processes of a command or the connections to a URL, shared by the tools
 * that name it. */
typedef struct {
    char what[2400]; /* "tools 'calc', 'echo' (command 'python3 calc.py')": the tools sharing it */
    char where[2200]; /* "command 'python3 calc.py'" or "url http://..." */
    jsonl_procs *procs;
    jsonl_http *http;
} env_target;

typedef struct {
    uint64_t tag;
    char *trajectory_id;
    int tool;
    double t0;
} env_call;

struct env_client {
    const tool_config *tc;
    env_config cfg;
    env_target *targets;
    int n_targets;
    int *target_of; /* tool index → target */
    env_call **calls; /* by request id; NULL: free slot */
    int n_calls_cap, n_active;
    env_result *done; /* finished, not yet polled */
    int n_done, done_cap;
    env_stats stats;
    int failed;
    char *fail_msg;
};

void env_def_keys(cfg *c) {
    cfg_def_float(c, "rollout.multi_turn.tool_timeout_s", 30.0,
                  "seconds one tool call may take; then the model is answered 'Error: ... timed out'");
    cfg_def_int(c, "rollout.multi_turn.tool_num_workers", 4,
                "processes per environment program (a tool's command:), each one call at a time");
    cfg_def_int(c, "rollout.multi_turn.tool_max_concurrency", 8, "POSTs in flight per environment server (url:)");
    cfg_def_int(c, "rollout.multi_turn.tool_max_retries", 2,
                "restarts of an environment program that died on a call, or retries of a POST the server "
                "refused (connection, 5xx, 429), before the run stops");
}

int env_read_config(const cfg *c, env_config *o) {
    const char *k = "rollout.multi_turn.tool_timeout_s";
    o->timeout_s = cfg_float(c, k);
    if (!(o->timeout_s > 0) || !isfinite(o->timeout_s))
        return moerl_errorf("%s (from %s): %g; expected a positive number of seconds", k, cfg_origin(c, k),
                            o->timeout_s);
    const char *keys[3] = {"rollout.multi_turn.tool_num_workers", "rollout.multi_turn.tool_max_concurrency",
                           "rollout.multi_turn.tool_max_retries"};
    int *dst[3] = {&o->num_workers, &o->max_concurrency, &o->max_retries};
    for (int i = 0; i < 3; i++) {
        int64_t v = cfg_int(c, keys[i]), lo = i == 2 ? 0 : 1;
        if (v < lo || v > 100000)
            return moerl_errorf("%s (from %s): %lld; expected an integer in [%lld, 100000]", keys[i],
                                cfg_origin(c, keys[i]), (long long)v, (long long)lo);
        *dst[i] = (int)v;
    }
    return MOERL_OK;
}

void env_result_free(env_result *r) {
    if (!r) return;
    free(r->content);
    r->content = NULL;
}

static env_call *call_of(env_client *e, long id) { return id >= 0 && id < e->n_calls_cap ? e->calls[id] : NULL; }

static const char *traj_of(void *ctx, long id) {
    env_call *c = call_of(ctx, id);
    return c ? c->trajectory_id : NULL;
}

/* The call is answered: a result (content owned) joins the done list; the call's slot is freed. */
static void finish(env_client *e, long id, char *content, int error, int timed_out) {
    env_call *c = e->calls[id];
    if (e->n_done == e->done_cap) {
        e->done_cap = e->done_cap ? 2 * e->done_cap : 16;
        e->done = xrealloc(e->done, (size_t)e->done_cap * sizeof *e->done);
    }
    env_result *r = &e->done[e->n_done++];
    memset(r, 0, sizeof *r);
    r->tag = c->tag;
    r->content = content;
    r->error = error;
    r->timed_out = timed_out;
    r->latency_s = jsonl_now_s() - c->t0;
    e->stats.calls++;
    e->stats.errors += error;
    e->stats.timeouts += timed_out;
    e->stats.latency_sum_s += r->latency_s;
    if (r->latency_s > e->stats.latency_max_s) e->stats.latency_max_s = r->latency_s;
    free(c->trajectory_id);
    free(c);
    e->calls[id] = NULL;
    e->n_active--;
}

static char *errorf_content(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *errorf_content(const char *fmt, ...) {
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return xstrdup(buf);
}

/* The answer of call id (text[0..len), a line or a POST's body): its content, done and reward, or
 * an "Error: ..." tool response. Never stops the run. */
static int on_answer(void *ctx, long id, const char *text, size_t len) {
    env_client *e = ctx;
    const char *tool = e->tc->tools[e->calls[id]->tool].name;
    char ex[240];
    reward_excerpt(text, len, ex, sizeof ex);
    json_error_t je;
    json_t *v = json_loadb(text, len, 0, &je);
    if (!json_is_object(v)) {
        json_decref(v);
        finish(e, id, errorf_content("Error: the tool '%s' answered '%s', not a JSON object", tool, ex), 1, 0);
        return MOERL_OK;
    }
    json_t *err = json_object_get(v, "error"), *content = json_object_get(v, "content");
    json_t *done = json_object_get(v, "done"), *reward = json_object_get(v, "reward");
    char *msg = NULL;
    if (err) {
        char *s = json_is_string(err) ? xstrdup(json_string_value(err))
                                      : json_dumps(err, JSON_COMPACT | JSON_ENCODE_ANY);
        msg = errorf_content("Error: %s", s ? s : "(unprintable)");
        free(s);
    } else if (!json_is_string(content))
        msg = errorf_content("Error: the tool '%s' answered '%s' without a string \"content\"", tool, ex);
    else if (done && !json_is_boolean(done))
        msg = errorf_content("Error: the tool '%s' answered '%s': \"done\" must be true or false", tool, ex);
    else if (reward && !(json_is_number(reward) && isfinite(json_number_value(reward))))
        msg = errorf_content("Error: the tool '%s' answered '%s': \"reward\" must be a finite number", tool, ex);
    if (msg) {
        finish(e, id, msg, 1, 0);
        json_decref(v);
        return MOERL_OK;
    }
    finish(e, id, xstrdup(json_string_value(content)), 0, 0);
    env_result *r = &e->done[e->n_done - 1];
    r->done = json_is_true(done);
    r->has_reward = reward != NULL;
    r->reward = reward ? json_number_value(reward) : 0;
    json_decref(v);
    return MOERL_OK;
}

static char *timeout_content(env_client *e, long id) {
    return errorf_content("Error: the tool '%s' timed out (no answer within rollout.multi_turn.tool_timeout_s=%gs)",
                          e->tc->tools[e->calls[id]->tool].name, e->cfg.timeout_s);
}

/* A process that hung: the call is answered with a timeout; one that died: restarted and the call
 * sent again while tool_max_retries allows, else the run stops. */
/* "tool 'NAME' (command 'X')" for call c, in what[0..cap). */
static const char *call_what(const env_client *e, const env_call *c, char *what, size_t cap) {
    snprintf(what, cap, "tool '%s' (%s)", e->tc->tools[c->tool].name, e->targets[e->target_of[c->tool]].where);
    return what;
}

static int on_proc_failure(void *ctx, long id, jsonl_failure kind, int tries, const char *how, const char *note) {
    env_client *e = ctx;
    env_call *c = e->calls[id];
    char what[2600];
    call_what(e, c, what, sizeof what);
    if (kind == JSONL_HUNG) {
        log_warn("%s: trajectory %s: the program %s", what, c->trajectory_id, how);
        finish(e, id, timeout_content(e, id), 0, 1);
        return JSONL_RESOLVED;
    }
    if (tries > e->cfg.max_retries)
        return moerl_errorf("%s: trajectory %s: the environment program %s (%d attempt%s, "
                            "rollout.multi_turn.tool_max_retries=%d)%s",
                            what, c->trajectory_id, how, tries, tries > 1 ? "s" : "", e->cfg.max_retries, note);
    log_warn("%s: trajectory %s: the environment program %s; restarting it (retry %d of "
             "rollout.multi_turn.tool_max_retries=%d)%s",
             what, c->trajectory_id, how, tries, e->cfg.max_retries, note);
    return JSONL_RETRY;
}

static int on_body(void *ctx, long id, const char *body, size_t len) { return on_answer(ctx, id, body, len); }

/* A POST that timed out: answered with a timeout; one the server refused: retried while
 * tool_max_retries allows (when worth it), else the run stops. */
static int on_http_failure(void *ctx, long id, int tries, int retryable, int timed_out, const char *why) {
    env_client *e = ctx;
    env_call *c = e->calls[id];
    char what[2600];
    call_what(e, c, what, sizeof what);
    if (timed_out) {
        log_warn("%s: trajectory %s: %s", what, c->trajectory_id, why);
        finish(e, id, timeout_content(e, id), 0, 1);
        return JSONL_RESOLVED;
    }
    if (!retryable) return moerl_errorf("%s: trajectory %s: %s", what, c->trajectory_id, why);
    if (tries > e->cfg.max_retries)
        return moerl_errorf("%s: trajectory %s: %s (%d attempt%s, rollout.multi_turn.tool_max_retries=%d)", what,
                            c->trajectory_id, why, tries, tries > 1 ? "s" : "", e->cfg.max_retries);
    log_warn("%s: trajectory %s: %s; trying again in %gs (retry %d of rollout.multi_turn.tool_max_retries=%d)", what,
             c->trajectory_id, why, jsonl_backoff_s(tries), tries, e->cfg.max_retries);
    return JSONL_RETRY;
}

/* "tools 'a', 'b' (command 'X')": the tools sharing target g, for the transport's messages. */
static void target_what(const env_client *e, int g, char *dst, size_t cap) {
    int n = 0;
    for (int i = 0; i < e->tc->n; i++) n += e->target_of[i] == g;
    size_t len = (size_t)snprintf(dst, cap, "tool%s", n > 1 ? "s" : "");
    for (int i = 0, k = 0; i < e->tc->n && len < cap; i++)
        if (e->target_of[i] == g)
            len += (size_t)snprintf(dst + len, cap - len, "%s '%s'", k++ ? "," : "", e->tc->tools[i].name);
    if (len < cap) snprintf(dst + len, cap - len, " (%s)", e->targets[g].where);
}

/* The environments of e->tc: one per distinct command or URL, started now. */
static int make_targets(env_client *e) {
    const tool_config *tc = e->tc;
    e->targets = xcalloc((size_t)tc->n + 1, sizeof *e->targets);
    e->target_of = xcalloc((size_t)tc->n + 1, sizeof(int));
    for (int i = 0; i < tc->n; i++) {
        const tool_def *t = &tc->tools[i];
        if (!t->command && !t->url) return moerl_errorf("tool '%s': neither command: nor url: is set", t->name);
        int k = 0;
        for (; k < i; k++) {
            const tool_def *u = &tc->tools[k];
            if ((t->command && u->command && !strcmp(t->command, u->command)) ||
                (t->url && u->url && !strcmp(t->url, u->url)))
                break;
        }
        if (k < i) {
            e->target_of[i] = e->target_of[k];
            continue;
        }
        env_target *g = &e->targets[e->n_targets];
        e->target_of[i] = e->n_targets++;
        if (t->command) snprintf(g->where, sizeof g->where, "command '%s'", t->command);
        else snprintf(g->where, sizeof g->where, "url %s", t->url);
    }
    for (int k = 0; k < e->n_targets; k++) {
        env_target *g = &e->targets[k];
        const tool_def *t = NULL;
        for (int i = 0; i < tc->n && !t; i++)
            if (e->target_of[i] == k) t = &tc->tools[i];
        target_what(e, k, g->what, sizeof g->what);
        const char *key = "rollout.multi_turn.tool_timeout_s";
        if (t->command) { /* no shell: split as reward.command is (reward_split_command) */
            char **argv = NULL;
            int argc = 0;
            if (reward_split_command(t->command, &argv, &argc) != MOERL_OK)
                return moerl_error_prefix("tool '%s': command: ", t->name);
            g->procs = jsonl_procs_create(g->what, argv, e->cfg.num_workers, e->cfg.timeout_s, key, 0);
            reward_free_argv(argv, argc);
        } else
            g->http = jsonl_http_create(g->what, t->url, e->cfg.max_concurrency, e->cfg.timeout_s, key);
        if (!g->procs && !g->http) return MOERL_ERR;
    }
    return MOERL_OK;
}

int env_check_tools(const tool_config *tc) {
    for (int i = 0; tc && i < tc->n; i++) {
        if (!tc->tools[i].command) continue;
        char **argv = NULL;
        int argc = 0;
        if (reward_split_command(tc->tools[i].command, &argv, &argc) != MOERL_OK)
            return moerl_error_prefix("tool '%s': command: ", tc->tools[i].name);
        reward_free_argv(argv, argc);
    }
    return MOERL_OK;
}

env_client *env_create(const tool_config *tc, const env_config *c) {
    if (!tc || tc->n <= 0) {
        moerl_errorf("environment client: the tool config declares no tools");
        return NULL;
    }
    if (!(c->timeout_s > 0) || c->num_workers < 1 || c->max_concurrency < 1 || c->max_retries < 0) {
        moerl_errorf("environment client: timeout %g s, %d workers, %d concurrent POSTs, %d retries: expected a "
                     "positive timeout and counts, retries ≥ 0",
                     c->timeout_s, c->num_workers, c->max_concurrency, c->max_retries);
        return NULL;
    }
    env_client *e = xcalloc(1, sizeof *e);
    e->tc = tc;
    e->cfg = *c;
    if (make_targets(e) != MOERL_OK) {
        env_free(e);
        return NULL;
    }
    return e;
}

int env_submit(env_client *e, uint64_t tag, const char *trajectory_id, const char *name, const char *arguments) {
    if (e->failed) return moerl_errorf("%s", e->fail_msg);
    int t = name ? tool_config_find(e->tc, name) : -1;
    if (t < 0) return moerl_errorf("trajectory %s: no tool named '%s' in the tool config", trajectory_id, name);
    json_error_t je;
    json_t *args = json_loads(arguments ? arguments : "", 0, &je);
    if (!json_is_object(args)) {
        json_decref(args);
        return moerl_errorf("trajectory %s: tool '%s': the arguments '%.200s' are not a JSON object", trajectory_id,
                            name, arguments ? arguments : "(null)");
    }
    json_t *req = json_object();
    json_object_set_new(req, "trajectory_id", json_string(trajectory_id));
    json_object_set_new(req, "name", json_string(name));
    json_object_set_new(req, "arguments", args);
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!line) return moerl_errorf("trajectory %s: tool '%s': the call cannot be written as JSON", trajectory_id, name);
    long id = 0;
    while (id < e->n_calls_cap && e->calls[id]) id++;
    if (id == e->n_calls_cap) {
        int cap = e->n_calls_cap ? 2 * e->n_calls_cap : 16;
        e->calls = xrealloc(e->calls, (size_t)cap * sizeof *e->calls);
        memset(e->calls + e->n_calls_cap, 0, (size_t)(cap - e->n_calls_cap) * sizeof *e->calls);
        e->n_calls_cap = cap;
    }
    env_call *c = xcalloc(1, sizeof *c);
    *c = (env_call){tag, xstrdup(trajectory_id), t, jsonl_now_s()};
    e->calls[id] = c;
    e->n_active++;
    env_target *g = &e->targets[e->target_of[t]];
    if (g->procs) jsonl_procs_submit(g->procs, id, line);
    else jsonl_http_submit(g->http, id, line);
    return MOERL_OK;
}

/* One step of every environment with calls pending, each waiting up to wait_s. */
static int step_all(env_client *e, double wait_s) {
    jsonl_proc_policy pp = {e, on_answer, on_proc_failure, traj_of};
    jsonl_http_policy hp = {e, on_body, on_http_failure};
    for (int k = 0; k < e->n_targets; k++) {
        env_target *g = &e->targets[k];
        int rc = MOERL_OK;
        if (g->procs && jsonl_procs_pending(g->procs)) rc = jsonl_procs_step(g->procs, &pp, wait_s);
        else if (g->procs) rc = jsonl_procs_step(g->procs, &pp, 0); /* a line nobody asked for, an exit */
        else if (g->http && jsonl_http_pending(g->http)) rc = jsonl_http_step(g->http, &hp, wait_s);
        if (rc != MOERL_OK) return MOERL_ERR;
    }
    return MOERL_OK;
}

int env_poll(env_client *e, env_result *out, int max, double wait_s) {
    if (e->failed) return moerl_errorf("%s", e->fail_msg);
    double until = jsonl_now_s() + (wait_s > 0 ? wait_s : 0);
    int busy = 0;
    for (int k = 0; k < e->n_targets; k++)
        busy += e->targets[k].procs ? jsonl_procs_pending(e->targets[k].procs) > 0
                                    : jsonl_http_pending(e->targets[k].http) > 0;
    for (;;) {
        double left = until - jsonl_now_s();
        /* several environments busy: short waits, so that none waits behind another */
        double w = left <= 0 ? 0 : busy > 1 ? fmin(left, 0.01) : left;
        if (step_all(e, w) != MOERL_OK) {
            e->failed = 1;
            e->fail_msg = xstrdup(moerl_last_error());
            return MOERL_ERR;
        }
        if (e->n_done > 0 || jsonl_now_s() >= until || e->n_active == 0) break;
    }
    int n = e->n_done < max ? e->n_done : max;
    if (n <= 0) return 0;
    memcpy(out, e->done, (size_t)n * sizeof *out);
    memmove(e->done, e->done + n, (size_t)(e->n_done - n) * sizeof *e->done);
    e->n_done -= n;
    return n;
}

int env_pending(const env_client *e) { return e->n_active + e->n_done; }

void env_get_stats(const env_client *e, env_stats *out) { *out = e->stats; }

void env_free(env_client *e) {
    if (!e) return;
    for (int k = 0; k < e->n_targets; k++) {
        jsonl_procs_free(e->targets[k].procs);
        jsonl_http_free(e->targets[k].http);
    }
    for (int i = 0; i < e->n_calls_cap; i++)
        if (e->calls[i]) {
            free(e->calls[i]->trajectory_id);
            free(e->calls[i]);
        }
    for (int i = 0; i < e->n_done; i++) env_result_free(&e->done[i]);
    free(e->calls);
    free(e->done);
    free(e->targets);
    free(e->target_of);
    free(e->fail_msg);
    free(e);
}
