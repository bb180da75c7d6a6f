/* Chrome trace writer. See trace.h. */
#include "base/trace.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"

typedef struct {
    char name[64];
    char cat[16];
    double ts, dur; /* µs */
    int tid;
} trace_event;

static atomic_int g_on;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static trace_event *g_ev;
static size_t g_n, g_cap, g_dropped;
static char *g_path;
static double g_origin; /* seconds (CLOCK_MONOTONIC) at trace_open */
static int g_atexit;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int os_tid(void) {
    static _Thread_local int tid;
    if (!tid) tid = (int)syscall(SYS_gettid);
    return tid;
}

static void trace_atexit(void) {
    if (trace_close() != MOERL_OK) fprintf(stderr, "moerl: profile trace: %s\n", moerl_last_error());
}

int trace_open(const char *path) {
    if (!path || !*path) return moerl_errorf("trace: empty output path");
    pthread_mutex_lock(&g_mu);
    if (g_path) {
        pthread_mutex_unlock(&g_mu);
        return moerl_errorf("trace: already recording to '%s' (asked for '%s')", g_path, path);
    }
    /* the folder must exist now: the file itself is only written at the end */
    char *dir = strdup(path);
    char *slash = strrchr(dir, '/');
    struct stat st;
    int ok = 1;
    if (slash) {
        if (slash == dir) slash[1] = '\0';
        else *slash = '\0';
        ok = stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    }
    if (ok && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) ok = 0;
    if (!ok) {
        pthread_mutex_unlock(&g_mu);
        int rc = moerl_errorf("trace: cannot write '%s': %s", path,
                              slash ? "its folder does not exist" : "it is a folder");
        free(dir);
        return rc;
    }
    free(dir);
    g_path = strdup(path);
    g_n = g_dropped = 0;
    g_origin = mono_s();
    if (!g_atexit) {
        atexit(trace_atexit);
        g_atexit = 1;
    }
    atomic_store(&g_on, 1);
    pthread_mutex_unlock(&g_mu);
    return MOERL_OK;
}

int trace_enabled(void) { return atomic_load_explicit(&g_on, memory_order_relaxed); }

double trace_begin(void) {
    if (!atomic_load_explicit(&g_on, memory_order_relaxed)) return -1.0;
    return 1e6 * (mono_s() - g_origin);
}

void trace_end(const char *name, const char *cat, double t0) {
    if (t0 < 0 || !atomic_load_explicit(&g_on, memory_order_relaxed)) return;
    const double t1 = 1e6 * (mono_s() - g_origin);
    const int tid = os_tid();
    pthread_mutex_lock(&g_mu);
    if (!g_path) goto out; /* closed meanwhile */
    if (g_n == g_cap) {
        if (g_cap >= TRACE_MAX_EVENTS) {
            g_dropped++;
            goto out;
        }
        g_cap = g_cap ? MOERL_MIN(2 * g_cap, (size_t)TRACE_MAX_EVENTS) : 4096;
        g_ev = xrealloc(g_ev, g_cap * sizeof *g_ev);
    }
    trace_event *e = &g_ev[g_n++];
    snprintf(e->name, sizeof e->name, "%s", name ? name : "?");
    snprintf(e->cat, sizeof e->cat, "%s", cat ? cat : "moerl");
    e->ts = t0;
    e->dur = t1 > t0 ? t1 - t0 : 0.0;
    e->tid = tid;
out:
    pthread_mutex_unlock(&g_mu);
}

size_t trace_count(void) {
    pthread_mutex_lock(&g_mu);
    size_t n = g_n;
    pthread_mutex_unlock(&g_mu);
    return n;
}

int trace_close(void) {
    pthread_mutex_lock(&g_mu);
    atomic_store(&g_on, 0);
    char *path = g_path;
    g_path = NULL;
    if (!path) {
        pthread_mutex_unlock(&g_mu);
        return MOERL_OK;
    }
    const int pid = (int)getpid();
    json_t *events = json_array();
    for (size_t i = 0; i < g_n; i++) {
        const trace_event *e = &g_ev[i];
        json_array_append_new(events, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i}", "name", e->name, "cat", e->cat,
                                                "ph", "X", "ts", e->ts, "dur", e->dur, "pid", pid, "tid", e->tid));
    }
    json_t *root = json_pack("{s:o, s:s, s:{s:s, s:I, s:I}}", "traceEvents", events, "displayTimeUnit", "ms",
                             "otherData", "generator", "moerl", "events", (json_int_t)g_n, "dropped",
                             (json_int_t)g_dropped);
    g_n = 0;
    free(g_ev);
    g_ev = NULL;
    g_cap = 0;
    pthread_mutex_unlock(&g_mu);
    int rc = MOERL_OK;
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    if (!text) rc = moerl_errorf("trace: cannot encode the trace for '%s'", path);
    else if (moerl_write_file_atomic(path, text, strlen(text)) != MOERL_OK)
        rc = moerl_error_prefix("trace '%s': ", path);
    free(text);
    json_decref(root);
    free(path);
    return rc;
}
