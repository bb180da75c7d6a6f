/* Graceful stop (see signals.h). */
#include "base/signals.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop_signal;

/* Process groups of outside programs moerl runs (reward and tool workers): killed on the second
 * signal's immediate exit, which runs no cleanup. Slots are claimed with a compare-and-swap, so
 * the handler may read them at any time. */
#define MAX_CHILD_GROUPS 1024
static _Atomic pid_t g_child_groups[MAX_CHILD_GROUPS];

void moerl_child_group_add(pid_t pgid) {
    for (int i = 0; i < MAX_CHILD_GROUPS; i++) {
        pid_t zero = 0;
        if (atomic_compare_exchange_strong(&g_child_groups[i], &zero, pgid)) return;
    }
}

void moerl_child_group_remove(pid_t pgid) {
    for (int i = 0; i < MAX_CHILD_GROUPS; i++) {
        pid_t want = pgid;
        if (atomic_compare_exchange_strong(&g_child_groups[i], &want, 0)) return;
    }
}

static void on_stop_signal(int sig) {
    if (g_stop_signal) { /* the second signal: at once */
        static const char m2[] = "\nmoerl: second signal: exiting now, without a checkpoint\n";
        ssize_t w2 = write(2, m2, sizeof m2 - 1);
        (void)w2;
        for (int i = 0; i < MAX_CHILD_GROUPS; i++) { /* kill(2) is async-signal-safe */
            const pid_t g = atomic_load(&g_child_groups[i]);
            if (g > 0) kill(-g, SIGKILL);
        }
        _exit(128 + sig);
    }
    g_stop_signal = sig;
    static const char m[] = "\nmoerl: stopping at the next step boundary (rl and sft write their checkpoint there), "
                            "then exiting; signal again to exit at once\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
}

void moerl_install_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL); /* mpirun forwards SIGUSR1 to every rank without killing the job */
}

int moerl_stop_requested(void) { return g_stop_signal; }
