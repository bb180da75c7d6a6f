/* Graceful stop on SIGINT / SIGTERM / SIGUSR1 for the long-running commands (moerl rl, moerl sft): the first
 * signal sets a flag that the training loops read at step boundaries (they finish or abort the
 * current step, write a checkpoint and return, and the command exits 128 + signal with a line
 * saying how to resume); a second signal exits at once (_exit(128 + signal)). SIGUSR1 is the one to
 * send to mpirun: Open MPI forwards it to every rank as it is, while SIGTERM to mpirun starts its own
 * kill sequence (SIGCONT, then SIGTERM and SIGKILL, odls_base_sigkill_timeout apart: 1 s). */
#ifndef MOERL_SIGNALS_H
#define MOERL_SIGNALS_H

#include <sys/types.h>

/* Install the handlers (idempotent). */
void moerl_install_stop_signals(void);
/* The first stop signal received (SIGINT, SIGTERM, SIGUSR1), 0 when none. Async-signal-safe to read. */
int moerl_stop_requested(void);

/* Register / forget the process group `pgid` of an outside program moerl started (a reward or tool
 * worker spawned as a group leader): the second signal's immediate exit kills every registered group
 * (SIGKILL), so nothing a worker started outlives moerl. At most 1024 groups are tracked (more are
 * silently not tracked: they are still killed on every normal exit path). Thread-safe and
 * async-signal-safe. */
void moerl_child_group_add(pid_t pgid);
void moerl_child_group_remove(pid_t pgid);

#endif
