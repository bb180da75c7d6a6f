/* moerl — logging, JSONL metrics, progress bar (see log.h). */
#include "base/log.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static log_level g_level = LOG_INFO;
static FILE *g_stream; /* NULL: stderr */
static FILE *g_file;
static char g_prefix[64];
static FILE *g_bar_stream; /* stream on which a tty progress bar currently shows a partial line */

void log_set_level(log_level level) { g_level = level; }
log_level log_get_level(void) { return g_level; }

void log_set_stream(FILE *f) {
    pthread_mutex_lock(&g_lock);
    g_stream = f;
    pthread_mutex_unlock(&g_lock);
}

int log_set_file(const char *path) {
    FILE *f = NULL;
    if (path) {
        f = fopen(path, "a");
        if (!f) return moerl_errorf("cannot open log file '%s': %s", path, strerror(errno));
    }
    pthread_mutex_lock(&g_lock);
    if (g_file) fclose(g_file);
    g_file = f;
    pthread_mutex_unlock(&g_lock);
    return MOERL_OK;
}

void log_set_prefix(const char *prefix) {
    pthread_mutex_lock(&g_lock);
    snprintf(g_prefix, sizeof g_prefix, "%s", prefix ? prefix : "");
    pthread_mutex_unlock(&g_lock);
}

static const char *level_name(log_level l) {
    switch (l) {
    case LOG_DEBUG: return "DEBUG";
    case LOG_INFO: return "INFO ";
    case LOG_WARN: return "WARN ";
    case LOG_ERROR: return "ERROR";
    }
    return "?    ";
}

/* "2025-06-01 12:34:56.789" in local time. */
static void timestamp(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03ld", ts.tv_nsec / 1000000L);
}

void log_vmsg(log_level level, const char *fmt, va_list ap) {
    if (level < g_level) return;
    char ts[40], msg[4096], line[4400];
    timestamp(ts, sizeof ts);
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t ml = strlen(msg);
    while (ml > 0 && msg[ml - 1] == '\n') msg[--ml] = 0;
    pthread_mutex_lock(&g_lock);
    int n = snprintf(line, sizeof line, "[%s] %s %s%s%s\n", ts, level_name(level), g_prefix, *g_prefix ? ": " : "",
                     msg);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
    FILE *out = g_stream ? g_stream : stderr;
    if (g_bar_stream == out) {
        fputs("\r\033[K", out); /* wipe the partial progress line; the bar redraws on its next update */
        g_bar_stream = NULL;
    }
    fwrite(line, 1, (size_t)n, out);
    fflush(out);
    if (g_file) {
        fwrite(line, 1, (size_t)n, g_file);
        fflush(g_file);
    }
    pthread_mutex_unlock(&g_lock);
}

#define LOG_FN(name, lvl)                  \
    void name(const char *fmt, ...) {      \
        va_list ap;                        \
        va_start(ap, fmt);                 \
        log_vmsg(lvl, fmt, ap);            \
        va_end(ap);                        \
    }
LOG_FN(log_debug, LOG_DEBUG)
LOG_FN(log_info, LOG_INFO)
LOG_FN(log_warn, LOG_WARN)
LOG_FN(log_error, LOG_ERROR)

/* ------------------------------------------------------------------ metrics */

struct metrics_writer {
    FILE *f;
    char *path;
};

metrics_writer *metrics_open(const char *path) {
    char *dir = xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if (moerl_mkdirs(dir)) {
            free(dir);
            moerl_error_prefix("metrics file '%s': ", path);
            return NULL;
        }
    }
    free(dir);
    FILE *f = fopen(path, "a");
    if (!f) {
        moerl_errorf("cannot open metrics file '%s': %s", path, strerror(errno));
        return NULL;
    }
    metrics_writer *m = xcalloc(1, sizeof *m);
    m->f = f;
    m->path = xstrdup(path);
    return m;
}

int metrics_write(metrics_writer *m, int64_t step, int n, const char *const keys[], const double values[]) {
    MOERL_ASSERT(m != NULL && n >= 0);
    json_t *obj = json_object();
    json_object_set_new(obj, "step", json_integer((json_int_t)step));
    for (int i = 0; i < n; i++) {
        const char *k = keys[i];
        if (!k || !*k) {
            json_decref(obj);
            return moerl_errorf("metrics '%s': key %d is empty", m->path, i);
        }
        if (json_object_get(obj, k)) {
            json_decref(obj);
            return moerl_errorf("metrics '%s': key '%s' given twice (or named 'step', which is reserved)", m->path, k);
        }
        json_t *v = isfinite(values[i]) ? json_real(values[i]) : json_null();
        if (json_object_set_new(obj, k, v)) {
            json_decref(obj);
            return moerl_errorf("metrics '%s': key %d is not valid UTF-8", m->path, i);
        }
    }
    char *s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(obj);
    if (!s) return moerl_errorf("metrics '%s': cannot encode the record", m->path);
    pthread_mutex_lock(&g_lock);
    int bad = fputs(s, m->f) < 0 || fputc('\n', m->f) == EOF || fflush(m->f) != 0;
    pthread_mutex_unlock(&g_lock);
    free(s);
    if (bad) return moerl_errorf("metrics '%s': write failed: %s", m->path, strerror(errno));
    return MOERL_OK;
}

void metrics_close(metrics_writer *m) {
    if (!m) return;
    fclose(m->f);
    free(m->path);
    free(m);
}

/* ------------------------------------------------------------------ progress bar */

#define BAR_WIDTH 30
#define TTY_REDRAW_S 0.1

void progress_begin_on(progress *p, FILE *out, bool tty, double period_s, const char *label, int64_t total) {
    memset(p, 0, sizeof *p);
    p->out = out;
    p->tty = tty;
    p->period_s = period_s < 0 ? 0 : period_s;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->total = total > 0 ? total : 0;
    p->t0 = moerl_now();
    p->last_draw = -1;
}

void progress_begin(progress *p, const char *label, int64_t total) {
    progress_begin_on(p, stderr, isatty(fileno(stderr)) == 1, 10.0, label, total);
}

static void fmt_hms(double s, char *buf, size_t cap) {
    if (!(s >= 0) || s > 1e8) { snprintf(buf, cap, "?"); return; }
    long t = (long)(s + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
}

/* Format the status text (without "\r" or newline). */
static void progress_text(const progress *p, double now, const char *extra, bool bar, char *buf, size_t cap) {
    double el = now - p->t0;
    double rate = el > 0 ? (double)p->done / el : 0;
    size_t n = 0;
#define PUT(...) do { int w_ = snprintf(buf + n, cap - n, __VA_ARGS__); if (w_ > 0) n += (size_t)w_; if (n >= cap) n = cap - 1; } while (0)
    PUT("%s", p->label);
    if (p->total > 0) {
        double frac = (double)p->done / (double)p->total;
        if (frac > 1) frac = 1;
        if (frac < 0) frac = 0;
        if (bar) {
            int fill = (int)(frac * BAR_WIDTH);
            PUT(" [");
            for (int i = 0; i < BAR_WIDTH; i++) PUT("%c", i < fill ? '#' : '.');
            PUT("]");
        }
        PUT(" %lld/%lld %3.0f%%", (long long)p->done, (long long)p->total, 100.0 * frac);
    } else {
        PUT(" %lld", (long long)p->done);
    }
    char t[32];
    fmt_hms(el, t, sizeof t);
    PUT(" elapsed %s", t);
    if (rate > 0) {
        PUT(" %.3g/s", rate);
        if (p->total > 0 && p->done < p->total) {
            fmt_hms((double)(p->total - p->done) / rate, t, sizeof t);
            PUT(" eta %s", t);
        }
    }
    if (extra && *extra) PUT(" %s", extra);
#undef PUT
}

static void progress_draw(progress *p, double now, const char *extra, bool final) {
    char text[512];
    progress_text(p, now, extra, p->tty, text, sizeof text);
    pthread_mutex_lock(&g_lock);
    if (p->tty) {
        fprintf(p->out, "\r%s\033[K%s", text, final ? "\n" : "");
        g_bar_stream = final ? NULL : p->out;
        p->on_screen = !final;
    } else {
        fprintf(p->out, "%s\n", text);
    }
    fflush(p->out);
    pthread_mutex_unlock(&g_lock);
    p->last_draw = now;
}

void progress_update(progress *p, int64_t done, const char *extra) {
    p->done = done;
    double now = moerl_now();
    double wait = p->tty ? TTY_REDRAW_S : p->period_s;
    if (p->last_draw < 0 || now - p->last_draw >= wait) progress_draw(p, now, extra, false);
}

void progress_end(progress *p, const char *extra) { progress_draw(p, moerl_now(), extra, true); }
