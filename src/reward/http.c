/* The HTTP reward backend (reward.url, through the HTTP transport of jsonl_pool.h): the requests of
 * a score call go out as POSTs of JSON lists of at most reward.batch_size request objects
 * (docs/rewards.md), at most reward.max_concurrency POSTs in flight; each answer is a JSON list of as many answers, in
 * order. A POST that times out (reward.timeout_s), fails to connect or loses its connection, or
 * gets HTTP 5xx or 429, is sent again after a backoff (0.2 s, doubling, at most 10 s), up to
 * reward.max_retries times; any other status, a body that is not a JSON list of the batch's length,
 * or an answer that is not a finite score stops at once. Messages name the URL, the status and an
 * excerpt of the body, and the batch's first row. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "reward/jsonl_pool.h"
#include "reward/reward_internal.h"

typedef struct {
    reward_backend base;
    char what[2200];
    int batch_size, max_retries;
    jsonl_http *h;
} http_backend;

/* One score call in progress: batch k is reqs[k * batch_size ..][0..n_of(k)). */
typedef struct {
    http_backend *hb;
    const reward_request *reqs;
    int n;
    reward_result *out;
} http_run;

static const char *row_of(const reward_request *reqs, int i) { return reqs[i].where ? reqs[i].where : "(no row)"; }

static int batch_len(const http_run *r, long k) {
    int first = (int)k * r->hb->batch_size;
    return r->n - first < r->hb->batch_size ? r->n - first : r->hb->batch_size;
}

/* "reward.url X: POST of N requests from row R", for messages. */
static void batch_head(const http_run *r, long k, char *dst, size_t cap) {
    int nb = batch_len(r, k);
    snprintf(dst, cap, "%s: POST of %d request%s from row %s", r->hb->what, nb, nb == 1 ? "" : "s",
             row_of(r->reqs, (int)k * r->hb->batch_size));
}

/* The answers of batch k's 2xx body into out[first ..]. */
static int on_body(void *ctx, long k, const char *body, size_t len) {
    http_run *r = ctx;
    int first = (int)k * r->hb->batch_size, n = batch_len(r, k);
    char ex[240], head[2600];
    json_error_t je;
    batch_head(r, k, head, sizeof head);
    reward_excerpt(body, len, ex, sizeof ex);
    json_t *v = json_loadb(body, len, 0, &je);
    if (!v) {
        const char *nan = strstr(body, "NaN") || strstr(body, "Infinity") ? " (NaN or Infinity: scores must be finite)"
                                                                           : "";
        return moerl_errorf("%s: the body is not a JSON list (%s)%s: '%s'", head, je.text, nan, ex);
    }
    if (!json_is_array(v) || (int)json_array_size(v) != n) {
        int got = json_is_array(v) ? (int)json_array_size(v) : -1;
        json_decref(v);
        if (got < 0) return moerl_errorf("%s: the body is not a JSON list: '%s'", head, ex);
        return moerl_errorf("%s: %d answers for %d requests (the answer must be a list of the same length): '%s'",
                            head, got, n, ex);
    }
    for (int j = 0; j < n; j++)
        if (reward_parse_answer(json_array_get(v, (size_t)j), &r->out[first + j]) != MOERL_OK) {
            json_decref(v);
            return moerl_error_prefix("%s: answer %d (row %s): ", head, j, row_of(r->reqs, first + j));
        }
    json_decref(v);
    return MOERL_OK;
}

/* Retried after a backoff while reward.max_retries allows when worth it; else the error. */
static int on_failure(void *ctx, long k, int tries, int retryable, int timed_out, const char *why) {
    http_run *r = ctx;
    http_backend *hb = r->hb;
    char head[2600];
    batch_head(r, k, head, sizeof head);
    if (!retryable) return moerl_errorf("%s: %s", head, why);
    if (tries > hb->max_retries)
        return moerl_errorf("%s: %s (%d attempt%s, reward.max_retries=%d)", head, why, tries, tries > 1 ? "s" : "",
                            hb->max_retries);
    log_warn("%s: %s; trying again in %gs (retry %d of reward.max_retries=%d)", head, why, jsonl_backoff_s(tries),
             tries, hb->max_retries);
    return JSONL_RETRY;
}

static int http_score(reward_backend *base, const reward_request *reqs, int n, reward_result *out) {
    http_backend *hb = (http_backend *)base;
    if (jsonl_http_cancelled(hb->h)) return moerl_errorf("%s: cancelled", hb->what);
    http_run r = {hb, reqs, n, out};
    jsonl_http_policy pol = {&r, on_body, on_failure};
    int nb = (n + hb->batch_size - 1) / hb->batch_size, rc = MOERL_OK;
    for (int k = 0; k < nb && rc == MOERL_OK; k++) {
        json_t *list = json_array();
        for (int i = k * hb->batch_size; i < k * hb->batch_size + batch_len(&r, k); i++) {
            json_t *o = reward_request_json(&reqs[i]);
            if (!o) {
                rc = moerl_error_prefix("%s: ", hb->what);
                break;
            }
            json_array_append_new(list, o);
        }
        if (rc == MOERL_OK) jsonl_http_submit(hb->h, k, json_dumps(list, JSON_COMPACT));
        json_decref(list);
    }
    while (rc == MOERL_OK && jsonl_http_pending(hb->h) > 0) rc = jsonl_http_step(hb->h, &pol, -1);
    if (rc != MOERL_OK) {
        jsonl_http_abort(hb->h);
        reward_results_clear(out, n);
    }
    return rc;
}

static void http_cancel(reward_backend *base) { jsonl_http_cancel(((http_backend *)base)->h); }

static void http_free(reward_backend *base) {
    http_backend *hb = (http_backend *)base;
    if (!hb) return;
    jsonl_http_free(hb->h);
    free(hb);
}

reward_backend *reward_http_create(const reward_config *c) {
    http_backend *hb = xcalloc(1, sizeof *hb);
    snprintf(hb->what, sizeof hb->what, "reward.url %s", c->url);
    hb->base.what = hb->what;
    hb->base.score = http_score;
    hb->base.free = http_free;
    hb->base.cancel = http_cancel;
    hb->batch_size = c->batch_size > 0 ? c->batch_size : 1;
    hb->max_retries = c->max_retries;
    hb->h = jsonl_http_create(hb->what, c->url, c->max_concurrency, c->timeout_s, "reward.timeout_s");
    if (!hb->h) {
        free(hb);
        return NULL;
    }
    return &hb->base;
}
