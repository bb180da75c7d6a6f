/* Graceful stop on SIGINT / SIGTERM for the long-running commands (moerl rl, moerl sft): the first
 * signal sets a flag that the training loops read at step boundaries (they finish or abort the
 * current step, write a checkpoint and return, and the command exits 128 + signal with a line
 * saying how to resume); a second signal exits at once (_exit(128 + signal)). */
#ifndef MOERL_SIGNALS_H
#define MOERL_SIGNALS_H

/* Install the handlers (idempotent). */
void moerl_install_stop_signals(void);
/* The first stop signal received (SIGINT, SIGTERM), 0 when none. Async-signal-safe to read. */
int moerl_stop_requested(void);

#endif
