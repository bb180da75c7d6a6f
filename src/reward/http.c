/* The HTTP reward backend (reward.url, libcurl's multi interface): the requests of a score call go
 * out as POSTs of JSON lists of at most reward.batch_size request objects (docs/rewards.md), at
 * most reward.max_concurrency POSTs in flight; each answer is a JSON list of as many answers, in
 * order. A POST that times out (reward.timeout_s), fails to connect or loses its connection, or
 * gets HTTP 5xx or 429, is sent again after a backoff (0.2 s, doubling, at most 10 s), up to
 * reward.max_retries times; any other status, a body that is not a JSON list of the batch's length,
 * or an answer that is not a finite score stops at once. Messages name the URL, the status and an
 * excerpt of the body, and the batch's first row. */
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/common.h"
#include "base/log.h"
#include "reward/reward_internal.h"

#define MAX_BODY (256u << 20)

typedef struct {
    reward_backend base;
    char what[2200];
    char url[2048];
    int batch_size, max_concurrency, max_retries;
    double timeout_s;
    CURLM *multi;
    atomic_int cancelled;
} http_backend;

typedef struct {
    int first, n; /* reqs[first .. first + n) */
    char *body;   /* the POST's JSON */
    int tries;
    double not_before; /* monotonic seconds: the backoff before the next try */
    CURL *easy;        /* in flight when not NULL */
    struct curl_slist *headers;
    char *resp;
    size_t resp_len, resp_cap;
    int too_big, done;
    char curl_err[CURL_ERROR_SIZE];
} http_batch;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_ALL); }

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
    http_batch *b = user;
    size_t n = size * nmemb;
    if (b->resp_len + n + 1 > MAX_BODY) {
        b->too_big = 1;
        return 0; /* aborts the transfer (CURLE_WRITE_ERROR) */
    }
    if (b->resp_len + n + 1 > b->resp_cap) {
        b->resp_cap = 2 * (b->resp_len + n + 1);
        b->resp = xrealloc(b->resp, b->resp_cap);
    }
    memcpy(b->resp + b->resp_len, data, n);
    b->resp_len += n;
    b->resp[b->resp_len] = 0;
    return n;
}

static void batch_stop(http_backend *hb, http_batch *b) {
    if (b->easy) {
        curl_multi_remove_handle(hb->multi, b->easy);
        curl_easy_cleanup(b->easy);
        b->easy = NULL;
    }
    curl_slist_free_all(b->headers);
    b->headers = NULL;
}

static int batch_start(http_backend *hb, http_batch *b) {
    CURL *e = curl_easy_init();
    if (!e) return moerl_errorf("%s: curl_easy_init failed", hb->what);
    b->resp_len = 0;
    b->too_big = 0;
    b->curl_err[0] = 0;
    b->headers = curl_slist_append(NULL, "Content-Type: application/json");
    /* no "Expect: 100-continue" on large bodies: a server that ignores it would cost a second each */
    b->headers = curl_slist_append(b->headers, "Expect:");
    curl_easy_setopt(e, CURLOPT_URL, hb->url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, b->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, b->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(b->body));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)ceil(hb->timeout_s * 1000));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, b->curl_err);
    curl_easy_setopt(e, CURLOPT_PRIVATE, b);
    b->easy = e;
    if (curl_multi_add_handle(hb->multi, e) != CURLM_OK) {
        batch_stop(hb, b);
        return moerl_errorf("%s: curl_multi_add_handle failed", hb->what);
    }
    return MOERL_OK;
}

/* Failures worth another try: the server or the network, not the request. */
static int transient(CURLcode rc) {
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR: return 1;
    default: return 0;
    }
}

static const char *row_of(const reward_request *reqs, int i) { return reqs[i].where ? reqs[i].where : "(no row)"; }

/* The answers of a 2xx body into out[b->first ..]. */
static int read_answers(http_backend *hb, const http_batch *b, const reward_request *reqs, reward_result *out,
                        const char *head) {
    char ex[240];
    json_error_t je;
    reward_excerpt(b->resp ? b->resp : "", b->resp_len, ex, sizeof ex);
    json_t *v = json_loadb(b->resp ? b->resp : "", b->resp_len, 0, &je);
    if (!v) {
        const char *nan = b->resp && (strstr(b->resp, "NaN") || strstr(b->resp, "Infinity"))
                              ? " (NaN or Infinity: scores must be finite)" : "";
        return moerl_errorf("%s: the body is not a JSON list (%s)%s: '%s'", head, je.text, nan, ex);
    }
    if (!json_is_array(v) || (int)json_array_size(v) != b->n) {
        int got = json_is_array(v) ? (int)json_array_size(v) : -1;
        json_decref(v);
        if (got < 0) return moerl_errorf("%s: the body is not a JSON list: '%s'", head, ex);
        return moerl_errorf("%s: %d answers for %d requests (the answer must be a list of the same length): '%s'",
                            head, got, b->n, ex);
    }
    for (int k = 0; k < b->n; k++)
        if (reward_parse_answer(json_array_get(v, (size_t)k), &out[b->first + k]) != MOERL_OK) {
            json_decref(v);
            return moerl_error_prefix("%s: answer %d (row %s): ", head, k, row_of(reqs, b->first + k));
        }
    json_decref(v);
    return MOERL_OK;
}

/* A finished POST: its answers, a retry after a backoff, or the error. */
static int on_done(http_backend *hb, http_batch *b, CURLcode rc, const reward_request *reqs, reward_result *out) {
    long status = 0;
    curl_easy_getinfo(b->easy, CURLINFO_RESPONSE_CODE, &status);
    batch_stop(hb, b);
    char head[2600], why[600], ex[240];
    snprintf(head, sizeof head, "%s: POST of %d request%s from row %s", hb->what, b->n, b->n == 1 ? "" : "s",
             row_of(reqs, b->first));
    reward_excerpt(b->resp ? b->resp : "", b->resp_len, ex, sizeof ex);
    if (rc == CURLE_OK && status >= 200 && status < 300) {
        if (read_answers(hb, b, reqs, out, head) != MOERL_OK) return MOERL_ERR;
        b->done = 1;
        return MOERL_OK;
    }
    if (b->too_big) return moerl_errorf("%s: the answer is larger than %u MiB", head, MAX_BODY >> 20);
    int retry;
    if (rc != CURLE_OK) {
        retry = transient(rc);
        if (rc == CURLE_OPERATION_TIMEDOUT)
            snprintf(why, sizeof why, "no answer within reward.timeout_s=%gs", hb->timeout_s);
        else
            snprintf(why, sizeof why, "%s (%s)", curl_easy_strerror(rc), b->curl_err[0] ? b->curl_err : "no detail");
    } else {
        retry = status >= 500 || status == 429;
        snprintf(why, sizeof why, "HTTP %ld, body '%s'", status, ex);
    }
    if (!retry) return moerl_errorf("%s: %s", head, why);
    if (++b->tries > hb->max_retries)
        return moerl_errorf("%s: %s (%d attempt%s, reward.max_retries=%d)", head, why, b->tries,
                            b->tries > 1 ? "s" : "", hb->max_retries);
    double wait = fmin(10.0, 0.2 * pow(2.0, b->tries - 1));
    log_warn("%s: %s; trying again in %gs (retry %d of reward.max_retries=%d)", head, why, wait, b->tries,
             hb->max_retries);
    b->not_before = now_s() + wait;
    return MOERL_OK;
}

/* The batches of reqs[0..n): their POST bodies. NULL with the error of a request that has no JSON. */
static http_batch *make_batches(http_backend *hb, const reward_request *reqs, int n, int *n_batches) {
    int nb = (n + hb->batch_size - 1) / hb->batch_size;
    http_batch *bs = xcalloc((size_t)nb + 1, sizeof *bs);
    for (int k = 0; k < nb; k++) {
        bs[k].first = k * hb->batch_size;
        bs[k].n = n - bs[k].first < hb->batch_size ? n - bs[k].first : hb->batch_size;
        json_t *list = json_array();
        for (int i = bs[k].first; i < bs[k].first + bs[k].n; i++) {
            json_t *o = reward_request_json(&reqs[i]);
            if (!o) {
                json_decref(list);
                for (int j = 0; j < k; j++) free(bs[j].body);
                free(bs);
                moerl_error_prefix("%s: ", hb->what);
                return NULL;
            }
            json_array_append_new(list, o);
        }
        bs[k].body = json_dumps(list, JSON_COMPACT);
        json_decref(list);
    }
    *n_batches = nb;
    return bs;
}

/* Start the batches that may go (not done, not in flight, backoff over) up to max_concurrency;
 * *wait_ms: until the next backoff ends (-1: none waiting). */
static int start_ready(http_backend *hb, http_batch *bs, int nb, int *in_flight, long *wait_ms) {
    double t = now_s(), next = INFINITY;
    for (int k = 0; k < nb; k++) {
        http_batch *b = &bs[k];
        if (b->done || b->easy) continue;
        if (b->not_before > t) {
            next = fmin(next, b->not_before);
            continue;
        }
        if (*in_flight >= hb->max_concurrency) continue;
        if (batch_start(hb, b) != MOERL_OK) return MOERL_ERR;
        ++*in_flight;
    }
    *wait_ms = isinf(next) ? -1 : (long)ceil((next - t) * 1000);
    return MOERL_OK;
}

static int http_score(reward_backend *base, const reward_request *reqs, int n, reward_result *out) {
    http_backend *hb = (http_backend *)base;
    if (atomic_load(&hb->cancelled)) return moerl_errorf("%s: cancelled", hb->what);
    int nb = 0, in_flight = 0, done = 0, rc = MOERL_OK;
    http_batch *bs = make_batches(hb, reqs, n, &nb);
    if (!bs) return MOERL_ERR;
    while (rc == MOERL_OK && done < nb) {
        long wait_ms;
        rc = start_ready(hb, bs, nb, &in_flight, &wait_ms);
        if (rc != MOERL_OK) break;
        int running;
        curl_multi_perform(hb->multi, &running);
        CURLMsg *m;
        int left;
        while (rc == MOERL_OK && (m = curl_multi_info_read(hb->multi, &left)))
            if (m->msg == CURLMSG_DONE) {
                http_batch *b;
                curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&b);
                in_flight--;
                rc = on_done(hb, b, m->data.result, reqs, out);
                done += b->done;
            }
        if (rc != MOERL_OK || done == nb) break;
        int timeout = in_flight ? 1000 : (int)(wait_ms < 0 ? 1000 : wait_ms);
        if (wait_ms >= 0 && wait_ms < timeout) timeout = (int)wait_ms;
        curl_multi_poll(hb->multi, NULL, 0, timeout, NULL);
        if (atomic_load(&hb->cancelled)) rc = moerl_errorf("%s: cancelled", hb->what);
    }
    for (int k = 0; k < nb; k++) {
        batch_stop(hb, &bs[k]);
        free(bs[k].body);
        free(bs[k].resp);
    }
    free(bs);
    if (rc != MOERL_OK) reward_results_clear(out, n);
    return rc;
}

static void http_cancel(reward_backend *base) {
    http_backend *hb = (http_backend *)base;
    atomic_store(&hb->cancelled, 1);
    curl_multi_wakeup(hb->multi);
}

static void http_free(reward_backend *base) {
    http_backend *hb = (http_backend *)base;
    if (!hb) return;
    if (hb->multi) curl_multi_cleanup(hb->multi);
    free(hb);
}

reward_backend *reward_http_create(const reward_config *c) {
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        moerl_errorf("reward.url %s: curl_global_init failed: %s", c->url, curl_easy_strerror(curl_init_rc));
        return NULL;
    }
    http_backend *hb = xcalloc(1, sizeof *hb);
    snprintf(hb->what, sizeof hb->what, "reward.url %s", c->url);
    snprintf(hb->url, sizeof hb->url, "%s", c->url);
    hb->base.what = hb->what;
    hb->base.score = http_score;
    hb->base.free = http_free;
    hb->base.cancel = http_cancel;
    hb->batch_size = c->batch_size > 0 ? c->batch_size : 1;
    hb->max_concurrency = c->max_concurrency > 0 ? c->max_concurrency : 1;
    hb->max_retries = c->max_retries;
    hb->timeout_s = c->timeout_s;
    hb->multi = curl_multi_init();
    if (!hb->multi) {
        moerl_errorf("%s: curl_multi_init failed", hb->what);
        free(hb);
        return NULL;
    }
    return &hb->base;
}
