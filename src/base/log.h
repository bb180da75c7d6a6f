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
 * at most the line being written. The same records can also go to the log (console) and to
 * TensorBoard event files (metrics_open_loggers, docs/logging.md).
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

/* Several processes (mpirun): a line every rank logs alike (a configuration warning or note, the model's
 * summary) is printed once, by the rank that speaks for the job; a line about one rank (its own state,
 * its own failure) is printed by that rank with the rank named. The layers that know the ranks fill this
 * in (the torchrun / Megatron convention: print_rank_0 for the job, a rank prefix for the rest):
 *   log_set_rank(rank, speaker)  this process's world rank and whether it speaks for the job. dist_init
 *                                sets (world rank, rank 0 speaks) when the world has more than one
 *                                process; a job may hand the speaking to another rank (moerl rl: trainer
 *                                rank 0, which writes the run's folder and summary). rank < 0: one
 *                                process, every line printed as is. Until it is called: the rank an
 *                                MPI launcher's environment gives (moerl_launcher_world; rank 0 speaks),
 *                                so the lines logged while the configuration is read follow the rule.
 *   log_shared_begin/end         the lines this thread logs in between are the same on every rank: under
 *                                several processes only the speaker prints them (DEBUG, INFO, WARN;
 *                                ERROR lines print on every rank). Nested pairs are fine.
 *   log_shared(level, fmt, ...)  one such line.
 * A line that is not shared, from a rank that does not speak, carries the rank: the prefix set by
 * log_set_prefix (e.g. "rollout 2"), or "rank R" when none is set. The speaker's lines carry only the
 * prefix that was set. */
void log_set_rank(int rank, bool speaker);
/* The rank set by log_set_rank (-1: one process) and whether this process speaks for the job. */
int log_get_rank(bool *speaker);
void log_shared_begin(void);
void log_shared_end(void);
void log_shared(log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* printf-style log lines with a local-time timestamp (millisecond resolution). A trailing
 * newline in the message is not doubled. */
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_vmsg(log_level level, const char *fmt, va_list ap);

/* ------------------------------------------------------------------ metrics (JSONL, console, TensorBoard) */

typedef struct metrics_writer metrics_writer;

/* The sinks of a metrics writer, verl's `trainer.logger` names (docs/logging.md):
 *   file        the JSONL file at the writer's path (what metrics_open writes)
 *   console     one log line per record (log_info): "step N: key=value key=value ..." (%.6g),
 *               as verl's console logger prints each step's metrics
 *   tensorboard TensorBoard event files (base/tb_events.h) in <folder of path>/tensorboard for
 *               "metrics.jsonl", <folder>/tensorboard/<stem> for another "<stem>.jsonl" (the SFT
 *               warm start's sft_metrics.jsonl: its own TensorBoard run) */
enum { METRICS_FILE = 1, METRICS_CONSOLE = 2, METRICS_TENSORBOARD = 4 };

/* The METRICS_* flags of a list of logger names (trainer.logger). Errors name `key`, the
 * offending item and the supported names: an unknown name (verl's wandb, swanlab, mlflow, ... are
 * not supported), a name given twice, an empty list. */
int metrics_logger_flags(const char *key, const char *const *names, int n, unsigned *flags);

struct cfg;
/* Declare the logger-list key `key` (verl's "trainer.logger"): a string list, default [file]
 * (today's output: metrics.jsonl, and the per-step summary line every run logs anyway). */
void metrics_def_logger_key(struct cfg *c, const char *key);
/* Read it into METRICS_* flags (metrics_logger_flags' errors). */
int metrics_read_logger_key(const struct cfg *c, const char *key, unsigned *flags);

/* Open `path` for appending (creating it and its parent folders). NULL on error, with
 * moerl_last_error() naming the path and the reason. The same as metrics_open_loggers(path,
 * METRICS_FILE, -1). */
metrics_writer *metrics_open(const char *path);
/* A writer with the sinks in `flags` (METRICS_*; 0 writes nothing and is allowed). `path` names
 * the JSONL file (written with METRICS_FILE; it also places the tensorboard folder). With
 * METRICS_TENSORBOARD a new event file is started; a new run (resume_step < 0) first removes the
 * event files an earlier run left directly in that folder, as its caller starts the JSONL anew;
 * resume_step ≥ 0 (a resumed run whose records up
 * to that step are kept) adds TensorBoard's restart marker at resume_step + 1 (tb_open), so the
 * steps the stopped run wrote after its checkpoint are dropped by TensorBoard and the redone ones
 * shown. NULL on error (the sink that failed, its path, the reason). */
metrics_writer *metrics_open_loggers(const char *path, unsigned flags, int64_t resume_step);
/* Write one record {"step": step, keys[0]: values[0], ...} to every sink and flush. JSONL:
 * non-finite values (NaN, ±inf; JSON has no such numbers) are written as null; TensorBoard keeps
 * them (float32 simple_value). Errors (nothing written): a NULL or empty key, a key given twice,
 * a key named "step", a write failure. */
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
