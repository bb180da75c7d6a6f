/* moerl — logging, the JSONL metrics writer and a console progress bar.
 *
 * Log lines: "[2025-06-01 12:34:56.789] INFO  <prefix: >message" on stderr (or the stream set by
 * log_set_stream), optionally copied to a file. Each line is written with one call under a
 * mutex, so lines from different threads never interleave. A tty progress bar that is on screen
 * is wiped before a log line is printed and redrawn by its next update.
 *
 * Metrics: one JSON object per line (JSON Lines), {"step": N, "<key>": value, ...}, keys in the
 * order given, using verl's metric names (docs/rl.md "Metrics": `timing_s/gen`, `actor/pg_loss`, ...).
 * Appended (a resumed run continues the same file) and flushed after every line, so a crash loses
 * at most the line being written.
 */
#ifndef MOERL_LOG_H
#define MOERL_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 } log_level;

/* Lines below `level` are dropped (default LOG_INFO). */
void log_set_level(log_level level);
log_level log_get_level(void);
/* Where log lines go (default stderr; NULL restores stderr). The stream is not closed by moerl. */
void log_set_stream(FILE *f);
/* Also append every line to the file at `path` (NULL stops copying). Error: cannot open it. */
int log_set_file(const char *path);
/* A short tag put before every message, e.g. "rollout 2" (NULL or "" for none). Copied. */
void log_set_prefix(const char *prefix);

/* printf-style log lines with a local-time timestamp (millisecond resolution). A trailing
 * newline in the message is not doubled. */
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_vmsg(log_level level, const char *fmt, va_list ap);

/* ------------------------------------------------------------------ metrics (JSONL) */

typedef struct metrics_writer metrics_writer;

/* Open `path` for appending (creating it and its parent folders). NULL on error, with
 * moerl_last_error() naming the path and the reason. */
metrics_writer *metrics_open(const char *path);
/* Append {"step": step, keys[0]: values[0], ...} as one line and flush. Non-finite values
 * (NaN, ±inf; JSON has no such numbers) are written as null. Errors (nothing written): a NULL
 * or empty key, a key given twice, a key named "step", a write failure. */
int metrics_write(metrics_writer *m, int64_t step, int n, const char *const keys[], const double values[]);
/* Flush and close (NULL is fine). */
void metrics_close(metrics_writer *m);

/* ------------------------------------------------------------------ progress bar */

/* A progress bar. On a terminal it redraws one line in place ("\r", at most every 0.1 s);
 * otherwise (a log file, a pipe) it prints a plain line at most every period_s seconds, so
 * logs stay readable. Always prints a final line at progress_end. */
typedef struct {
    FILE *out;
    bool tty;
    double period_s;  /* non-tty: seconds between lines */
    char label[64];
    int64_t total;    /* 0: unknown */
    int64_t done;
    double t0;        /* moerl_now() at begin */
    double last_draw; /* moerl_now() of the last line drawn, -1 if none */
    bool on_screen;   /* tty: a partial line is on screen */
} progress;

/* A bar on stderr; tty detected with isatty; non-tty lines every 10 s. total 0 = unknown. */
void progress_begin(progress *p, const char *label, int64_t total);
/* Full control (for tests and for a log file): `tty` chooses the mode; period_s ≥ 0. */
void progress_begin_on(progress *p, FILE *out, bool tty, double period_s, const char *label, int64_t total);
/* Record `done` units (absolute, not an increment) and maybe draw; `extra` (may be NULL) is a
 * short text appended to the line, e.g. "loss 1.234". */
void progress_update(progress *p, int64_t done, const char *extra);
/* Draw the final state and end the line. */
void progress_end(progress *p, const char *extra);

#endif
