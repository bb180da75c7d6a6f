/* The HTTP transport of jsonl_pool.h (libcurl's multi interface): one POST per submitted body, at
 * most max_concurrency in flight, each with the timeout. A finished POST goes to the caller's
 * policy: a 2xx body to on_body, anything else to on_failure with whether it is worth another try
 * (a timeout, a connection that failed or broke, HTTP 5xx or 429), which the policy may answer with
 * a retry after a backoff (0.2 s, doubling, at most 10 s). */
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "reward/jsonl_pool.h"
#include "reward/reward_internal.h"

#define MAX_BODY (256u << 20)

typedef struct {
    long id;
    char *body; /* the POST's JSON */
    int tries;
    double not_before; /* monotonic seconds: the backoff before the next try */
    CURL *easy;        /* in flight when not NULL */
    struct curl_slist *headers;
    char *resp;
    size_t resp_len, resp_cap;
    int too_big;
    char curl_err[CURL_ERROR_SIZE];
} http_req;

struct jsonl_http {
    char what[2200];
    char url[2048];
    char timeout_key[128];
    int max_concurrency, in_flight;
    double timeout_s;
    CURLM *multi;
    atomic_int cancelled;
    http_req **reqs; /* pending: queued, backing off or in flight */
    int n, cap;
};

double jsonl_backoff_s(int tries) { return fmin(10.0, 0.2 * pow(2.0, tries - 1)); }

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_ALL); }

static size_t on_recv(char *data, size_t size, size_t nmemb, void *user) {
    http_req *b = user;
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

static void req_stop(jsonl_http *h, http_req *b) {
    if (b->easy) {
        curl_multi_remove_handle(h->multi, b->easy);
        curl_easy_cleanup(b->easy);
        b->easy = NULL;
        h->in_flight--;
    }
    curl_slist_free_all(b->headers);
    b->headers = NULL;
}

static int req_start(jsonl_http *h, http_req *b) {
    CURL *e = curl_easy_init();
    if (!e) return moerl_errorf("%s: curl_easy_init failed", h->what);
    b->resp_len = 0;
    b->too_big = 0;
    b->curl_err[0] = 0;
    b->headers = curl_slist_append(NULL, "Content-Type: application/json");
    /* no "Expect: 100-continue" on large bodies: a server that ignores it would cost a second each */
    b->headers = curl_slist_append(b->headers, "Expect:");
    curl_easy_setopt(e, CURLOPT_URL, h->url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, b->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, b->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(b->body));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)ceil(h->timeout_s * 1000));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_recv);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, b->curl_err);
    curl_easy_setopt(e, CURLOPT_PRIVATE, b);
    b->easy = e;
    h->in_flight++;
    if (curl_multi_add_handle(h->multi, e) != CURLM_OK) {
        req_stop(h, b);
        return moerl_errorf("%s: curl_multi_add_handle failed", h->what);
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

static void req_free(http_req *b) {
    free(b->body);
    free(b->resp);
    free(b);
}

/* Remove reqs[k] (done) from the pending list. */
static void req_remove(jsonl_http *h, http_req *b) {
    for (int k = 0; k < h->n; k++)
        if (h->reqs[k] == b) {
            memmove(h->reqs + k, h->reqs + k + 1, (size_t)(h->n - k - 1) * sizeof *h->reqs);
            h->n--;
            break;
        }
    req_free(b);
}

/* A finished POST: to the policy (its body, or the failure); a retry waits for its backoff. */
static int on_done(jsonl_http *h, const jsonl_http_policy *pol, http_req *b, CURLcode rc) {
    long status = 0;
    curl_easy_getinfo(b->easy, CURLINFO_RESPONSE_CODE, &status);
    req_stop(h, b);
    char why[600], ex[240];
    if (rc == CURLE_OK && status >= 200 && status < 300) {
        int r = pol->on_body(pol->ctx, b->id, b->resp ? b->resp : "", b->resp_len);
        req_remove(h, b);
        return r;
    }
    int retry, timed_out = rc == CURLE_OPERATION_TIMEDOUT;
    reward_excerpt(b->resp ? b->resp : "", b->resp_len, ex, sizeof ex);
    if (b->too_big) {
        retry = 0;
        snprintf(why, sizeof why, "the answer is larger than %u MiB", MAX_BODY >> 20);
    } else if (rc != CURLE_OK) {
        retry = transient(rc);
        if (timed_out) snprintf(why, sizeof why, "no answer within %s=%gs", h->timeout_key, h->timeout_s);
        else snprintf(why, sizeof why, "%s (%s)", curl_easy_strerror(rc), b->curl_err[0] ? b->curl_err : "no detail");
    } else {
        retry = status >= 500 || status == 429;
        snprintf(why, sizeof why, "HTTP %ld, body '%s'", status, ex);
    }
    int d = pol->on_failure(pol->ctx, b->id, ++b->tries, retry, timed_out, why);
    if (d == JSONL_RETRY) {
        b->not_before = jsonl_now_s() + jsonl_backoff_s(b->tries);
        return MOERL_OK;
    }
    req_remove(h, b);
    return d == JSONL_RESOLVED ? MOERL_OK : MOERL_ERR;
}

/* Start the requests that may go (not in flight, backoff over) up to max_concurrency; *wait_ms:
 * until the next backoff ends (-1: none waiting). */
static int start_ready(jsonl_http *h, long *wait_ms) {
    double t = jsonl_now_s(), next = INFINITY;
    for (int k = 0; k < h->n; k++) {
        http_req *b = h->reqs[k];
        if (b->easy) continue;
        if (b->not_before > t) {
            next = fmin(next, b->not_before);
            continue;
        }
        if (h->in_flight >= h->max_concurrency) continue;
        if (req_start(h, b) != MOERL_OK) return MOERL_ERR;
    }
    *wait_ms = isinf(next) ? -1 : (long)ceil((next - t) * 1000);
    return MOERL_OK;
}

void jsonl_http_submit(jsonl_http *h, long id, char *body) {
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 16;
        h->reqs = xrealloc(h->reqs, (size_t)h->cap * sizeof *h->reqs);
    }
    http_req *b = xcalloc(1, sizeof *b);
    b->id = id;
    b->body = body;
    h->reqs[h->n++] = b;
}

int jsonl_http_pending(const jsonl_http *h) { return h->n; }

/* Hand the finished transfers to the policy; *n_done counts them. */
static int read_done(jsonl_http *h, const jsonl_http_policy *pol, int *n_done) {
    CURLMsg *m;
    int left, rc = MOERL_OK;
    while (rc == MOERL_OK && (m = curl_multi_info_read(h->multi, &left)))
        if (m->msg == CURLMSG_DONE) {
            http_req *b;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&b);
            rc = on_done(h, pol, b, m->data.result);
            ++*n_done;
        }
    return rc;
}

int jsonl_http_step(jsonl_http *h, const jsonl_http_policy *pol, double wait_s) {
    if (atomic_load(&h->cancelled)) return moerl_errorf("%s: cancelled", h->what);
    long wait_ms;
    int running, n_done = 0;
    if (start_ready(h, &wait_ms) != MOERL_OK) return MOERL_ERR;
    curl_multi_perform(h->multi, &running);
    int rc = read_done(h, pol, &n_done);
    if (rc != MOERL_OK || n_done || !h->n) return rc;
    int timeout = h->in_flight ? 1000 : (int)(wait_ms < 0 ? 1000 : wait_ms);
    if (wait_ms >= 0 && wait_ms < timeout) timeout = (int)wait_ms;
    if (wait_s >= 0 && wait_s * 1000 < timeout) timeout = (int)ceil(wait_s * 1000);
    curl_multi_poll(h->multi, NULL, 0, timeout, NULL);
    if (atomic_load(&h->cancelled)) return moerl_errorf("%s: cancelled", h->what);
    curl_multi_perform(h->multi, &running);
    return read_done(h, pol, &n_done);
}

void jsonl_http_abort(jsonl_http *h) {
    for (int k = 0; k < h->n; k++) {
        req_stop(h, h->reqs[k]);
        req_free(h->reqs[k]);
    }
    h->n = 0;
}

void jsonl_http_cancel(jsonl_http *h) {
    atomic_store(&h->cancelled, 1);
    curl_multi_wakeup(h->multi);
}

int jsonl_http_cancelled(const jsonl_http *h) { return atomic_load(&h->cancelled); }

void jsonl_http_free(jsonl_http *h) {
    if (!h) return;
    jsonl_http_abort(h);
    if (h->multi) curl_multi_cleanup(h->multi);
    free(h->reqs);
    free(h);
}

jsonl_http *jsonl_http_create(const char *what, const char *url, int max_concurrency, double timeout_s,
                              const char *timeout_key) {
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        moerl_errorf("%s: curl_global_init failed: %s", what, curl_easy_strerror(curl_init_rc));
        return NULL;
    }
    jsonl_http *h = xcalloc(1, sizeof *h);
    snprintf(h->what, sizeof h->what, "%s", what);
    snprintf(h->url, sizeof h->url, "%s", url);
    snprintf(h->timeout_key, sizeof h->timeout_key, "%s", timeout_key);
    h->max_concurrency = max_concurrency > 0 ? max_concurrency : 1;
    h->timeout_s = timeout_s;
    h->multi = curl_multi_init();
    if (!h->multi) {
        moerl_errorf("%s: curl_multi_init failed", what);
        free(h);
        return NULL;
    }
    return h;
}
