/* Reward worker processes: reward.num_workers copies of reward.command (or of the verl adapter
 * running reward.custom_reward_function.path), each speaking JSON lines (docs/rewards.md): one
 * request line in, one answer line out, one request in flight per process. Started with
 * posix_spawn (fork/exec, no shell) in their own process group, stdin/stdout/stderr on pipes.
 *
 * Failures: a process that crashes (exit status ≠ 0 or a signal) or hangs past reward.timeout_s is
 * killed, restarted and its request retried, up to reward.max_retries times; an answer that is not
 * JSON, not a number/object with "score", not finite, or an error the program reports, is a bug in
 * the program and stops at once; so does a program that exits with status 0 before answering or
 * writes more lines than it was sent. Messages name the program, the row (reward_request.where)
 * and the cause, with the end of the program's stderr. SIGPIPE is blocked around writes (EPIPE
 * instead). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "reward/reward_internal.h"

extern char **environ;

/* The adapter's Python text (src/reward/verl_adapter.py, embedded by the Makefile). */
#include "reward/verl_adapter.h"

#define TAIL_CAP 1500
#define MAX_LINE (64u << 20) /* an answer line longer than this is an error, not memory without end */

typedef struct {
    pid_t pid;        /* 0: not running */
    int to, from, err; /* the child's stdin (we write), stdout and stderr (we read); -1 closed */
    int pidfd;         /* readable once the process has exited (pidfd_open; -1: not available) */
    char *in;          /* stdout bytes not yet consumed */
    size_t in_len, in_cap;
    char tail[TAIL_CAP]; /* the last bytes of stderr */
    size_t tail_len;
    int req;            /* the request in flight, -1: idle */
    char *out;          /* its line being written */
    size_t out_len, out_off;
    double deadline;    /* monotonic seconds */
    int n_answered;     /* answers since this process started */
} worker;

typedef struct {
    reward_backend base;
    char what[3400];
    char **argv;
    int argc, adapter, n_w, max_retries;
    double timeout_s;
    worker *w;
    int wake[2]; /* cancel → poll wakes up */
    atomic_int cancelled;
} proc_backend;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* write(2) with SIGPIPE blocked in this thread: a reader gone gives EPIPE, never the signal. */
static ssize_t write_nosig(int fd, const void *b, size_t n) {
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    ssize_t r = write(fd, b, n);
    int e = errno;
    if (r < 0 && e == EPIPE && !sigismember(&old, SIGPIPE)) {
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE)) {
            struct timespec zero = {0, 0};
            sigtimedwait(&pipe_set, NULL, &zero);
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return r;
}

/* Read what stderr has into the tail (the last TAIL_CAP bytes); closes it at EOF. */
static void drain_stderr(worker *w) {
    char b[4096];
    while (w->err >= 0) {
        ssize_t r = read(w->err, b, sizeof b);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) close_fd(&w->err);
            return;
        }
        size_t k = (size_t)r;
        if (k >= TAIL_CAP) {
            memcpy(w->tail, b + k - TAIL_CAP, TAIL_CAP);
            w->tail_len = TAIL_CAP;
        } else {
            if (w->tail_len + k > TAIL_CAP) {
                size_t drop = w->tail_len + k - TAIL_CAP;
                memmove(w->tail, w->tail + drop, w->tail_len - drop);
                w->tail_len -= drop;
            }
            memcpy(w->tail + w->tail_len, b, k);
            w->tail_len += k;
        }
    }
}

/* "; its stderr ends: ..." (or "" when it wrote none), for messages. */
static void stderr_note(worker *w, char *dst, size_t cap) {
    drain_stderr(w);
    size_t n = w->tail_len;
    while (n && (w->tail[n - 1] == '\n' || w->tail[n - 1] == '\r' || w->tail[n - 1] == ' ')) n--;
    if (!n) {
        dst[0] = 0;
        return;
    }
    char ex[TAIL_CAP * 2 + 8];
    size_t from = n > 600 ? n - 600 : 0;
    reward_excerpt(w->tail + from, n - from, ex, sizeof ex);
    snprintf(dst, cap, "; its stderr ends: %s%s", from ? "..." : "", ex);
}

static void describe_status(int st, char *dst, size_t cap) {
    if (WIFEXITED(st)) snprintf(dst, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) snprintf(dst, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else snprintf(dst, cap, "stopped (wait status %d)", st);
}

/* Kill the process group and reap the child; closes the pipes. */
static void worker_kill(worker *w) {
    if (w->pid > 0) {
        kill(-w->pid, SIGKILL);
        kill(w->pid, SIGKILL);
        while (waitpid(w->pid, NULL, 0) < 0 && errno == EINTR) {}
    }
    w->pid = 0;
    close_fd(&w->to);
    close_fd(&w->from);
    close_fd(&w->err);
    close_fd(&w->pidfd);
    free(w->out);
    w->out = NULL;
    w->out_len = w->out_off = 0;
    w->in_len = 0;
    w->req = -1;
}

/* Whether w's process has exited (not reaped: worker_reap reads its status). */
static int has_exited(worker *w) {
    if (w->pidfd >= 0) {
        struct pollfd p = {w->pidfd, POLLIN, 0};
        return poll(&p, 1, 0) == 1;
    }
    siginfo_t si;
    memset(&si, 0, sizeof si);
    return waitid(P_PID, (id_t)w->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == w->pid;
}

/* The process closed its stdout (or its stdin): reap it, waiting up to timeout_s for it to exit
 * (then it is killed), reading its stderr meanwhile (what it wrote before exiting stays readable
 * even when a child of its own keeps the pipe open). *st gets its wait status; returns 0 with *st
 * unset when it had to be killed. */
static int worker_reap(proc_backend *pb, worker *w, int *st) {
    close_fd(&w->to);
    double until = now_s() + pb->timeout_s;
    for (;;) {
        if (has_exited(w)) { /* still a zombie: its group id cannot be reused yet */
            drain_stderr(w);
            kill(-w->pid, SIGKILL); /* what it started itself */
            pid_t r;
            while ((r = waitpid(w->pid, st, 0)) < 0 && errno == EINTR) {}
            w->pid = 0;
            worker_kill(w);
            return r > 0;
        }
        double left = until - now_s();
        if (left <= 0) break;
        struct pollfd p = {w->err, POLLIN, 0}; /* a negative fd (stderr at EOF) only waits */
        poll(&p, 1, left < 0.02 ? (int)ceil(left * 1000) : 20);
        drain_stderr(w);
    }
    worker_kill(w);
    return 0;
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Start w's process (posix_spawnp: PATH lookup; the child gets default signal handling and an
 * empty signal mask, its own process group). Errors name the program. */
static int worker_spawn(proc_backend *pb, worker *w) {
    int p[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    for (int i = 0; i < 3; i++)
        if (pipe2(p[i], O_CLOEXEC) != 0) {
            for (int j = 0; j < i; j++) close(p[j][0]), close(p[j][1]);
            return moerl_errorf("%s: cannot make a pipe: %s", pb->what, strerror(errno));
        }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[0][0], 0);
    posix_spawn_file_actions_adddup2(&fa, p[1][1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[2][1], 2);
    posix_spawnattr_init(&at);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    pid_t pid;
    int rc = posix_spawnp(&pid, pb->argv[0], &fa, &at, pb->argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(p[0][0]);
    close(p[1][1]);
    close(p[2][1]);
    if (rc != 0) {
        close(p[0][1]);
        close(p[1][0]);
        close(p[2][0]);
        return moerl_errorf("%s: cannot start '%s': %s", pb->what, pb->argv[0], strerror(rc));
    }
    w->pid = pid;
    /* its exit seen even when a child of its own keeps stdout open (else: polled every 100 ms) */
    w->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    w->to = p[0][1];
    w->from = p[1][0];
    w->err = p[2][0];
    set_nonblock(w->to);
    set_nonblock(w->from);
    set_nonblock(w->err);
    w->tail_len = w->in_len = 0;
    w->req = -1;
    w->n_answered = 0;
    return MOERL_OK;
}

#define GOT_DATA 1
#define GOT_EOF 2
/* Read what stdout has: GOT_DATA when bytes came, | GOT_EOF at end of file (or a read error). */
static int read_stdout(worker *w) {
    int got = 0;
    for (;;) {
        if (w->in_cap - w->in_len < 4096) {
            w->in_cap = w->in_cap ? 2 * w->in_cap : 8192;
            w->in = xrealloc(w->in, w->in_cap);
        }
        ssize_t r = read(w->from, w->in + w->in_len, w->in_cap - w->in_len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r > 0) {
            w->in_len += (size_t)r;
            got = GOT_DATA;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return got;
        return got | GOT_EOF;
    }
}

/* The first complete line in w->in (without its '\n'), or NULL; *len its length. */
static char *first_line(worker *w, size_t *len) {
    char *nl = w->in_len ? memchr(w->in, '\n', w->in_len) : NULL;
    if (!nl) return NULL;
    *len = (size_t)(nl - w->in);
    return w->in;
}

static void consume_line(worker *w, size_t len) {
    memmove(w->in, w->in + len + 1, w->in_len - len - 1);
    w->in_len -= len + 1;
}

/* The adapter's first line, {"ready": true}: it imported the file and found the function. Waits up
 * to reward.timeout_s. Errors say why it did not start, with its stderr. */
static int wait_ready(proc_backend *pb, worker *w) {
    double until = now_s() + pb->timeout_s;
    char note[1800], how[160];
    for (;;) {
        size_t n0;
        char *line = first_line(w, &n0);
        if (line) {
            size_t len = n0;
            int ok = len >= 5 && memmem(line, len, "\"ready\"", 7) != NULL;
            char ex[200];
            reward_excerpt(line, len, ex, sizeof ex);
            consume_line(w, len);
            if (ok) return MOERL_OK;
            stderr_note(w, note, sizeof note);
            worker_kill(w);
            return moerl_errorf("%s: the adapter said '%s' instead of being ready%s", pb->what, ex, note);
        }
        struct pollfd p[3] = {{w->from, POLLIN, 0}, {w->pidfd, POLLIN, 0}, {w->err, POLLIN, 0}};
        size_t len;
        int ms = (int)ceil((until - now_s()) * 1000);
        if (w->pidfd < 0 && ms > 100) ms = 100;
        if (ms <= 0) {
            stderr_note(w, note, sizeof note);
            worker_kill(w);
            return moerl_errorf("%s: not ready within reward.timeout_s=%gs (importing the file took too long?)%s",
                                pb->what, pb->timeout_s, note);
        }
        if (poll(p, 3, ms) < 0 && errno != EINTR) return moerl_errorf("poll: %s", strerror(errno));
        drain_stderr(w);
        int exited = has_exited(w);
        if (((read_stdout(w) & GOT_EOF) || exited) && !first_line(w, &len)) {
            int st;
            int reaped = worker_reap(pb, w, &st);
            if (reaped) describe_status(st, how, sizeof how);
            else snprintf(how, sizeof how, "closed its stdout");
            stderr_note(w, note, sizeof note);
            return moerl_errorf("%s: the program %s before it was ready%s", pb->what, how, note);
        }
    }
}

static int worker_start(proc_backend *pb, worker *w) {
    if (worker_spawn(pb, w) != MOERL_OK) return MOERL_ERR;
    return pb->adapter ? wait_ready(pb, w) : MOERL_OK;
}

/* One score call in progress. */
typedef struct {
    proc_backend *pb;
    const reward_request *reqs;
    int n, next, done;
    reward_result *out;
    int *tries;
} proc_run;

static const char *row_of(const proc_run *r, int i) {
    return i >= 0 && r->reqs[i].where ? r->reqs[i].where : "(no row)";
}

/* Send request i to w (starting its process when it is not running). */
static int assign(proc_run *r, worker *w, int i) {
    proc_backend *pb = r->pb;
    if (!w->pid && worker_start(pb, w) != MOERL_OK) return moerl_error_prefix("%s: ", row_of(r, i));
    json_t *j = reward_request_json(&r->reqs[i]);
    if (!j) return moerl_error_prefix("%s: ", pb->what);
    char *line = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    size_t len = strlen(line);
    free(w->out);
    w->out = xmalloc(len + 2);
    memcpy(w->out, line, len);
    w->out[len] = '\n';
    w->out_len = len + 1;
    w->out_off = 0;
    free(line);
    w->req = i;
    w->deadline = now_s() + pb->timeout_s;
    return MOERL_OK;
}

/* Write what w's pipe takes of its request line; -1: the reader is gone (EPIPE). */
static int write_more(worker *w) {
    while (w->out_off < w->out_len) {
        ssize_t k = write_nosig(w->to, w->out + w->out_off, w->out_len - w->out_off);
        if (k > 0) w->out_off += (size_t)k;
        else if (k < 0 && errno == EINTR) continue;
        else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        else return -1;
    }
    return 0;
}

/* w's process failed on its request (died: how = its exit; or hung): retry the request on a fresh
 * process while reward.max_retries allows, else the error. */
static int retry_or_fail(proc_run *r, worker *w, const char *how, const char *note) {
    proc_backend *pb = r->pb;
    int i = w->req;
    worker_kill(w);
    if (++r->tries[i] > pb->max_retries)
        return moerl_errorf("%s: %s: the program %s (%d attempt%s, reward.max_retries=%d)%s", pb->what, row_of(r, i),
                            how, r->tries[i], r->tries[i] > 1 ? "s" : "", pb->max_retries, note);
    log_warn("%s: %s: the program %s; restarting it (retry %d of reward.max_retries=%d)%s", pb->what, row_of(r, i),
             how, r->tries[i], pb->max_retries, note);
    return assign(r, w, i);
}

/* w's stdout closed (or its stdin: EPIPE): the process ended. */
static int on_exit_of(proc_run *r, worker *w) {
    proc_backend *pb = r->pb;
    int st = 0, i = w->req, answered = w->n_answered;
    char how[200], note[1800];
    int reaped = worker_reap(pb, w, &st);
    stderr_note(w, note, sizeof note);
    if (i < 0) return MOERL_OK; /* ended between requests: started again when it gets one */
    if (!reaped)
        snprintf(how, sizeof how, "closed its stdin or stdout and did not exit within reward.timeout_s=%gs (killed)",
                 pb->timeout_s);
    else describe_status(st, how, sizeof how);
    if (reaped && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return moerl_errorf("%s: %s: the program exited with status 0 after %d answer%s, without answering this "
                            "request: it must answer every request line with one line%s",
                            pb->what, row_of(r, i), answered, answered == 1 ? "" : "s", note);
    w->req = i;
    return retry_or_fail(r, w, how, note);
}

/* Answer lines that came on w: each one is its request's (an extra line is an error). */
static int on_lines(proc_run *r, worker *w) {
    proc_backend *pb = r->pb;
    size_t len;
    char *line;
    while ((line = first_line(w, &len))) {
        char ex[200], note[1800];
        if (w->req < 0) {
            reward_excerpt(line, len, ex, sizeof ex);
            stderr_note(w, note, sizeof note);
            return moerl_errorf("%s: the program wrote a line it was not asked for, '%s' (after %d answer%s; it must "
                                "write exactly one line per request)%s",
                                pb->what, ex, w->n_answered, w->n_answered == 1 ? "" : "s", note);
        }
        int i = w->req;
        if (reward_parse_answer_text(line, len, &r->out[i]) != MOERL_OK) {
            stderr_note(w, note, sizeof note);
            char *why = xstrdup(moerl_last_error());
            moerl_errorf("%s: %s: its answer: %s%s", pb->what, row_of(r, i), why, note);
            free(why);
            return MOERL_ERR;
        }
        consume_line(w, len);
        w->req = -1;
        w->n_answered++;
        r->done++;
    }
    return MOERL_OK;
}

/* One poll over every running worker (and the cancel pipe), then what came: stderr, writable
 * stdin, answers, ends, timeouts. */
static int poll_once(proc_run *r) {
    proc_backend *pb = r->pb;
    struct pollfd *p = xcalloc((size_t)(4 * pb->n_w + 1), sizeof *p);
    int *at = xcalloc((size_t)pb->n_w, sizeof(int)); /* index of worker k's first pollfd, -1: none */
    int np = 0, rc = MOERL_OK;
    double t = now_s(), first = INFINITY;
    p[np++] = (struct pollfd){pb->wake[0], POLLIN, 0};
    for (int k = 0; k < pb->n_w; k++) {
        worker *w = &pb->w[k];
        at[k] = -1;
        if (!w->pid) continue;
        at[k] = np;
        p[np++] = (struct pollfd){w->from, POLLIN, 0};
        p[np++] = (struct pollfd){w->err, w->err >= 0 ? POLLIN : 0, 0};
        p[np++] = (struct pollfd){w->to, w->out_off < w->out_len ? POLLOUT : 0, 0};
        p[np++] = (struct pollfd){w->pidfd, POLLIN, 0};
        if (w->req >= 0 && w->deadline < first) first = w->deadline;
        if (w->pidfd < 0 && t + 0.1 < first) first = t + 0.1;
    }
    int ms = isinf(first) ? -1 : first <= t ? 0 : (int)ceil((first - t) * 1000);
    if (poll(p, (nfds_t)np, ms) < 0 && errno != EINTR) rc = moerl_errorf("%s: poll: %s", pb->what, strerror(errno));
    if (atomic_load(&pb->cancelled)) rc = moerl_errorf("%s: cancelled", pb->what);
    for (int k = 0; k < pb->n_w && rc == MOERL_OK; k++) {
        worker *w = &pb->w[k];
        if (at[k] < 0 || !w->pid) continue;
        if (p[at[k] + 1].revents) drain_stderr(w);
        if (p[at[k] + 2].revents && write_more(w) < 0) {
            rc = on_exit_of(r, w); /* EPIPE: it closed its stdin; its stdout says the rest */
            continue;
        }
        int exited = p[at[k] + 3].revents != 0 || (w->pidfd < 0 && has_exited(w));
        int got = p[at[k]].revents || exited ? read_stdout(w) : 0;
        if (got) rc = on_lines(r, w);
        if (rc == MOERL_OK && w->in_len > MAX_LINE)
            rc = moerl_errorf("%s: %s: the program wrote more than %u MiB without ending the line", pb->what,
                              row_of(r, w->req), MAX_LINE >> 20);
        if (rc == MOERL_OK && ((got & GOT_EOF) || exited)) rc = on_exit_of(r, w);
        if (rc == MOERL_OK && w->req >= 0 && now_s() >= w->deadline) {
            char how[200], note[1800];
            snprintf(how, sizeof how, "gave no answer within reward.timeout_s=%gs and was killed", pb->timeout_s);
            stderr_note(w, note, sizeof note);
            rc = retry_or_fail(r, w, how, note);
        }
    }
    free(p);
    free(at);
    return rc;
}

/* After the last answer: a line already waiting on an idle worker is one too many. */
static int check_extra(proc_run *r) {
    for (int k = 0; k < r->pb->n_w; k++) {
        worker *w = &r->pb->w[k];
        if (!w->pid) continue;
        int exited = has_exited(w), got = read_stdout(w);
        if (on_lines(r, w) != MOERL_OK) return MOERL_ERR;
        if ((got & GOT_EOF) || exited) on_exit_of(r, w);
    }
    return MOERL_OK;
}

static int proc_score(reward_backend *b, const reward_request *reqs, int n, reward_result *out) {
    proc_backend *pb = (proc_backend *)b;
    if (atomic_load(&pb->cancelled)) return moerl_errorf("%s: cancelled", pb->what);
    proc_run r = {pb, reqs, n, 0, 0, out, xcalloc((size_t)n + 1, sizeof(int))};
    int rc = check_extra(&r);
    while (rc == MOERL_OK && r.done < n) {
        for (int k = 0; k < pb->n_w && r.next < n && rc == MOERL_OK; k++)
            if (pb->w[k].req < 0) rc = assign(&r, &pb->w[k], r.next++);
        if (rc == MOERL_OK) rc = poll_once(&r);
    }
    if (rc == MOERL_OK) rc = check_extra(&r);
    if (rc != MOERL_OK) {
        reward_results_clear(out, n);
        for (int k = 0; k < pb->n_w; k++) /* a process with a request in flight would answer it next time */
            if (pb->w[k].req >= 0 || pb->w[k].in_len || atomic_load(&pb->cancelled)) worker_kill(&pb->w[k]);
    }
    free(r.tries);
    return rc;
}

static void proc_cancel(reward_backend *b) {
    proc_backend *pb = (proc_backend *)b;
    atomic_store(&pb->cancelled, 1);
    char c = 1;
    if (write_nosig(pb->wake[1], &c, 1) < 0) {} /* full pipe: already woken */
}

static void proc_free(reward_backend *b) {
    proc_backend *pb = (proc_backend *)b;
    if (!pb) return;
    for (int k = 0; k < pb->n_w; k++) {
        worker_kill(&pb->w[k]);
        free(pb->w[k].in);
    }
    free(pb->w);
    reward_free_argv(pb->argv, pb->argc);
    close_fd(&pb->wake[0]);
    close_fd(&pb->wake[1]);
    free(pb);
}

/* argv of the adapter: PYTHON -c <adapter text> PATH NAME. */
static char **adapter_argv(const reward_config *c, int *argc) {
    char **a = xcalloc(6, sizeof(char *));
    a[0] = xstrdup(c->python);
    a[1] = xstrdup("-c");
    a[2] = xstrdup(reward_verl_adapter_py);
    a[3] = xstrdup(c->function_path);
    a[4] = xstrdup(c->function_name);
    *argc = 5;
    return a;
}

reward_backend *reward_proc_create(const reward_config *c) {
    proc_backend *pb = xcalloc(1, sizeof *pb);
    pb->base.score = proc_score;
    pb->base.cancel = proc_cancel;
    pb->base.free = proc_free;
    pb->base.what = pb->what;
    pb->wake[0] = pb->wake[1] = -1;
    pb->timeout_s = c->timeout_s;
    pb->max_retries = c->max_retries;
    pb->n_w = c->num_workers > 0 ? c->num_workers : 1;
    pb->w = xcalloc((size_t)pb->n_w, sizeof(worker));
    for (int k = 0; k < pb->n_w; k++) pb->w[k] = (worker){.to = -1, .from = -1, .err = -1, .pidfd = -1, .req = -1};
    if (c->kind == REWARD_FUNCTION) {
        pb->adapter = 1;
        snprintf(pb->what, sizeof pb->what, "reward.custom_reward_function.path '%s' (function %s, run by %s)",
                 c->function_path, c->function_name, c->python);
        pb->argv = adapter_argv(c, &pb->argc);
    } else {
        snprintf(pb->what, sizeof pb->what, "reward.command '%s'", c->command);
        if (reward_split_command(c->command, &pb->argv, &pb->argc) != MOERL_OK) {
            moerl_error_prefix("reward.command: ");
            proc_free(&pb->base);
            return NULL;
        }
    }
    if (pipe2(pb->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        moerl_errorf("%s: cannot make a pipe: %s", pb->what, strerror(errno));
        proc_free(&pb->base);
        return NULL;
    }
    for (int k = 0; k < pb->n_w; k++) /* every process started before any is waited for */
        if (worker_spawn(pb, &pb->w[k]) != MOERL_OK) {
            proc_free(&pb->base);
            return NULL;
        }
    for (int k = 0; k < pb->n_w && pb->adapter; k++)
        if (wait_ready(pb, &pb->w[k]) != MOERL_OK) {
            proc_free(&pb->base);
            return NULL;
        }
    return &pb->base;
}
