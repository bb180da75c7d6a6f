/* moerl — logging, JSONL metrics, progress bar (see log.h). */
#include "base/log.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "base/config.h"
#include "base/outdir.h"
#include "base/tb_events.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static log_level g_level = LOG_INFO;
static FILE *g_stream; /* NULL: stderr */
static FILE *g_file;
static char g_prefix[64];
static FILE *g_bar_stream; /* stream on which a tty progress bar currently shows a partial line */
static int g_rank = -1;        /* log_set_rank: -1 = one process */
static bool g_rank_set;        /* log_set_rank was called (else the launcher's environment, read once) */
static bool g_speaker = true;  /* this process prints the lines every rank logs alike */
static _Thread_local int g_shared; /* depth of log_shared_begin on this thread */

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

void log_set_rank(int rank, bool speaker) {
    pthread_mutex_lock(&g_lock);
    g_rank_set = true;
    g_rank = rank < 0 ? -1 : rank;
    g_speaker = g_rank < 0 || speaker;
    pthread_mutex_unlock(&g_lock);
}

/* Before log_set_rank: the rank an MPI launcher gave this process (its environment; rank 0 speaks), so the
 * lines logged before dist_init (the configuration's) follow the same rule. Under g_lock. */
static void rank_default(void) {
    if (g_rank_set) return;
    g_rank_set = true;
    int r;
    if (moerl_launcher_world(&r) > 1) {
        g_rank = r;
        g_speaker = r == 0;
    }
}

int log_get_rank(bool *speaker) {
    pthread_mutex_lock(&g_lock);
    rank_default();
    const int r = g_rank;
    if (speaker) *speaker = g_speaker;
    pthread_mutex_unlock(&g_lock);
    return r;
}

void log_shared_begin(void) { g_shared++; }
void log_shared_end(void) {
    if (g_shared > 0) g_shared--;
}

void log_shared(log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_shared_begin();
    log_vmsg(level, fmt, ap);
    log_shared_end();
    va_end(ap);
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
    rank_default();
    if (g_rank >= 0 && !g_speaker && g_shared > 0 && level < LOG_ERROR) { /* the speaker prints it */
        pthread_mutex_unlock(&g_lock);
        return;
    }
    char who[80];
    if (*g_prefix || g_rank < 0 || g_speaker) snprintf(who, sizeof who, "%s", g_prefix);
    else snprintf(who, sizeof who, "rank %d", g_rank); /* a line about this rank, from a rank that does not speak */
    int n = snprintf(line, sizeof line, "[%s] %s %s%s%s\n", ts, level_name(level), who, *who ? ": " : "", msg);
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
    FILE *f;       /* METRICS_FILE, else NULL */
    tb_writer *tb; /* METRICS_TENSORBOARD, else NULL */
    bool console;
    char *path;
};

static const struct {
    const char *name;
    unsigned flag;
} k_loggers[] = {{"console", METRICS_CONSOLE}, {"file", METRICS_FILE}, {"tensorboard", METRICS_TENSORBOARD}};

int metrics_logger_flags(const char *key, const char *const *names, int n, unsigned *flags) {
    *flags = 0;
    if (n <= 0) return moerl_errorf("%s is empty: give at least one of console, file, tensorboard", key);
    for (int i = 0; i < n; i++) {
        unsigned f = 0;
        for (size_t k = 0; k < sizeof k_loggers / sizeof k_loggers[0]; k++)
            if (strcmp(names[i], k_loggers[k].name) == 0) f = k_loggers[k].flag;
        if (!f)
            return moerl_errorf("%s: '%s' is not a logger moerl has (supported: console, file, tensorboard)", key,
                                names[i]);
        if (*flags & f) return moerl_errorf("%s: '%s' is given twice", key, names[i]);
        *flags |= f;
    }
    return MOERL_OK;
}

void metrics_def_logger_key(cfg *c, const char *key) {
    static const char *const def[] = {"file"};
    cfg_def_str_list(c, key, def, 1,
                     "where metrics go: a list of console (a log line per step with every metric), file "
                     "(metrics.jsonl), tensorboard (event files in <output folder>/tensorboard); docs/logging.md");
}

int metrics_read_logger_key(const cfg *c, const char *key, unsigned *flags) {
    int n;
    const char *const *names = cfg_str_list(c, key, &n);
    return metrics_logger_flags(key, names, n, flags);
}

/* The tensorboard folder of a metrics path (heap): <dir>/tensorboard, or <dir>/tensorboard/<stem>
 * for a file other than metrics.jsonl. */
static char *tb_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dlen = slash ? (size_t)(slash - path) : 1;
    const char *dir = slash ? path : ".";
    size_t blen = strlen(base);
    if (blen > 6 && strcmp(base + blen - 6, ".jsonl") == 0) blen -= 6;
    size_t cap = dlen + blen + 32;
    char *out = xmalloc(cap);
    if (strcmp(base, "metrics.jsonl") == 0) snprintf(out, cap, "%.*s/tensorboard", (int)dlen, dir);
    else snprintf(out, cap, "%.*s/tensorboard/%.*s", (int)dlen, dir, (int)blen, base);
    return out;
}

/* A new run's record starts anew: remove the event files directly in dir (not its subfolders). */
static void remove_event_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0) continue;
        size_t cap = strlen(dir) + strlen(e->d_name) + 2;
        char *p = xmalloc(cap);
        snprintf(p, cap, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISREG(st.st_mode)) unlink(p);
        free(p);
    }
    closedir(d);
}

/* The JSONL file of a writer: parents created, opened for appending. */
static FILE *open_jsonl(const char *path) {
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
    if (!f) moerl_errorf("cannot open metrics file '%s': %s", path, strerror(errno));
    return f;
}

metrics_writer *metrics_open_loggers(const char *path, unsigned flags, int64_t resume_step) {
    metrics_writer *m = xcalloc(1, sizeof *m);
    m->path = xstrdup(path);
    m->console = (flags & METRICS_CONSOLE) != 0;
    if ((flags & METRICS_FILE) && !(m->f = open_jsonl(path))) {
        metrics_close(m);
        return NULL;
    }
    if (flags & METRICS_TENSORBOARD) {
        char *dir = tb_dir_of(path);
        if (resume_step < 0) remove_event_files(dir);
        m->tb = tb_open(dir, resume_step >= 0 ? resume_step + 1 : -1);
        free(dir);
        if (!m->tb) {
            metrics_close(m);
            return NULL;
        }
    }
    return m;
}

metrics_writer *metrics_open(const char *path) { return metrics_open_loggers(path, METRICS_FILE, -1); }

/* Seconds since the epoch (TensorBoard's wall_time). */
static double wall_seconds(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* The console sink's line: "step N: k=v k=v ..." through log_info. */
static void console_line(int64_t step, int n, const char *const keys[], const double values[]) {
    size_t cap = 64, len = 0;
    for (int i = 0; i < n; i++) cap += strlen(keys[i]) + 32;
    char *line = xmalloc(cap);
    len += (size_t)snprintf(line, cap, "step %lld:", (long long)step);
    for (int i = 0; i < n && len < cap; i++) len += (size_t)snprintf(line + len, cap - len, " %s=%.6g", keys[i], values[i]);
    log_info("%s", line);
    free(line);
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
    int bad = 0;
    if (m->f) {
        pthread_mutex_lock(&g_lock);
        bad = fputs(s, m->f) < 0 || fputc('\n', m->f) == EOF || fflush(m->f) != 0;
        pthread_mutex_unlock(&g_lock);
    }
    free(s);
    if (bad) return moerl_errorf("metrics '%s': write failed: %s", m->path, strerror(errno));
    if (m->tb && tb_write_scalars(m->tb, step, wall_seconds(), n, keys, values) != MOERL_OK) return MOERL_ERR;
    if (m->console) console_line(step, n, keys, values);
    return MOERL_OK;
}

void metrics_close(metrics_writer *m) {
    if (!m) return;
    if (m->f) fclose(m->f);
    tb_close(m->tb);
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
