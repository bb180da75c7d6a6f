/* Chrome trace writer: spans of the training step and the rollout engine, written as a Chrome
 * trace-event JSON file (open it in Perfetto, ui.perfetto.dev, or chrome://tracing).
 *
 * Two-line use (any thread, any module):
 *     double t = trace_begin();
 *     ... work ...
 *     trace_end("allreduce bucket", "dist", t);
 * or TRACE_SPAN("weight sync", "rl") { ... } around a block. Off (the default) costs one
 * relaxed atomic load per call and no clock read. On, each span is one "X" (complete) event
 * with the OS thread id; the span list is guarded by a mutex (spans are per stage, not per
 * element: tens per layer). Recording stops at TRACE_MAX_EVENTS (the file says how many
 * were dropped).
 * File format: {"traceEvents": [{"name", "cat", "ph": "X", "ts" (µs since trace_open), "dur"
 * (µs), "pid", "tid"}, ...], "displayTimeUnit": "ms", "otherData": {...}}, written through
 * jansson, atomically (moerl_write_file_atomic). Source: the Trace Event Format document
 * (Google, "Trace Event Format", JSON Object Format and Complete Events).
 */
#ifndef MOERL_TRACE_H
#define MOERL_TRACE_H

#include <stddef.h>

#define TRACE_MAX_EVENTS 2000000

/* Start recording to `path` (written by trace_close, or at process exit if never closed).
 * Errors: already recording, or a path whose folder does not exist (checked now, so a typo
 * fails before hours of work). */
int trace_open(const char *path);
/* Stop recording and write the file. Returns MOERL_OK when nothing was open. */
int trace_close(void);
/* Nonzero while recording. */
int trace_enabled(void);
/* Start of a span: a timestamp in µs, or −1 when not recording. */
double trace_begin(void);
/* End of a span begun at t0 (ignored when t0 < 0 or not recording): records [t0, now) on the
 * calling thread. name and cat are copied (at most 63 and 15 bytes). */
void trace_end(const char *name, const char *cat, double t0);
/* Number of spans recorded so far (tests). */
size_t trace_count(void);

#define TRACE_CAT2(a, b) a##b
#define TRACE_CAT(a, b) TRACE_CAT2(a, b)
/* TRACE_SPAN(name, cat) { block }: a span around the block (do not leave it with break/goto/return). */
#define TRACE_SPAN(name, cat)                                                                                     \
    for (double TRACE_CAT(trace_t0_, __LINE__) = trace_begin(), TRACE_CAT(trace_once_, __LINE__) = 1;             \
         TRACE_CAT(trace_once_, __LINE__);                                                                        \
         TRACE_CAT(trace_once_, __LINE__) = 0, trace_end(name, cat, TRACE_CAT(trace_t0_, __LINE__)))

#endif
