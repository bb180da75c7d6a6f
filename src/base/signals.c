/* Graceful stop (see signals.h). */
#include "base/signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) {
    if (g_stop_signal) { /* the second signal: at once */
        static const char m2[] = "\nmoerl: second signal: exiting now, without a checkpoint\n";
        ssize_t w2 = write(2, m2, sizeof m2 - 1);
        (void)w2;
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
