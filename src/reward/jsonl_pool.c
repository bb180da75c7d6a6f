/* The worker processes of jsonl_pool.h: copies of one program speaking JSON lines, one request
 * line in, one answer line out, one request in flight per process; started with posix_spawn
 * (fork/exec, no shell) in their own process group, stdin/stdout/stderr on pipes. A process that
 * crashes, closes its pipes or hangs past the timeout is killed and reaped, and the caller's policy
 * says what becomes of its request; a line nobody asked for, or one over 64 MiB, stops. SIGPIPE is
 * blocked around writes (EPIPE instead). */
#include <errno.h>
#include <jansson.h>
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
#include "base/signals.h"
#include "reward/jsonl_pool.h"
#include "reward/reward_internal.h"

extern char **environ;

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
    int graced;         /* this worker's first request got the start-up grace (only once) */
    long id;            /* the caller's id of the request in flight */
    char *line;         /* its line (owned), kept for a retry */
    int tries;          /* its failed attempts */
} worker;

typedef struct {
    long id;
    char *line;
} queued;

struct jsonl_procs {
    char what[3400];
    char timeout_key[128];
    char **argv;
    int argc, ready_line, n_w;
    double timeout_s;
    worker *w;
    int wake[2]; /* cancel → poll wakes up */
    atomic_int cancelled;
    queued *q; /* submitted, not yet sent: q[q_head .. q_len) */
    int q_head, q_len, q_cap;
    int n_pending; /* queued + in flight */
};

double jsonl_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#define now_s jsonl_now_s

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

/* "; its stderr ends: ..." (or "" when it wrote none), for messages; several lines each on its own
 * line, indented by four spaces. */
static void stderr_note(worker *w, char *dst, size_t cap) {
    drain_stderr(w);
    size_t n = w->tail_len;
    while (n && (w->tail[n - 1] == '\n' || w->tail[n - 1] == '\r' || w->tail[n - 1] == ' ')) n--;
    if (!n) {
        dst[0] = 0;
        return;
    }
    size_t from = n > 600 ? n - 600 : 0;
    const char *t = w->tail + from;
    const size_t tn = n - from;
    if (!memchr(t, '\n', tn)) {
        char ex[TAIL_CAP * 2 + 8];
        reward_excerpt(t, tn, ex, sizeof ex);
        snprintf(dst, cap, "; its stderr ends: %s%s", from ? "..." : "", ex);
        return;
    }
    /* several lines (a Python traceback): each on its own line, indented under the message */
    size_t o = (size_t)snprintf(dst, cap, "; its stderr ends:%s", from ? "\n    ..." : "");
    for (size_t i = 0; i < tn && o + 8 < cap;) {
        const char *nl = memchr(t + i, '\n', tn - i);
        size_t ll = nl ? (size_t)(nl - (t + i)) : tn - i, keep = ll;
        while (keep && t[i + keep - 1] == '\r') keep--;
        char ex[TAIL_CAP * 2 + 8];
        reward_excerpt(t + i, keep, ex, sizeof ex);
        o += (size_t)snprintf(dst + o, cap - o, "\n    %s", ex);
        i += ll + 1;
    }
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
        moerl_child_group_remove(w->pid);
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
static int worker_reap(jsonl_procs *pb, worker *w, int *st) {
    close_fd(&w->to);
    double until = now_s() + pb->timeout_s;
    for (;;) {
        if (has_exited(w)) { /* still a zombie: its group id cannot be reused yet */
            drain_stderr(w);
            kill(-w->pid, SIGKILL); /* what it started itself */
            pid_t r;
            while ((r = waitpid(w->pid, st, 0)) < 0 && errno == EINTR) {}
            moerl_child_group_remove(w->pid);
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
static int worker_spawn(jsonl_procs *pb, worker *w) {
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
    moerl_child_group_add(pid); /* killed on a second stop signal's immediate exit (base/signals.h) */
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

/* Start-up of a ready_line program: imports (torch, sympy, ...) on a loaded machine take far longer
 * than scoring one response, so the wait is at least this long whatever the per-request timeout. */
#define READY_MIN_S 120.0

/* The first line of a ready_line program (the verl adapter), {"ready": true}: it imported the file
 * and found the function. Waits up to max(timeout_s, READY_MIN_S). Errors say why it did not start,
 * with its stderr. */
static int wait_ready(jsonl_procs *pb, worker *w) {
    const double limit = pb->timeout_s > READY_MIN_S ? pb->timeout_s : READY_MIN_S;
    double until = now_s() + limit;
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
            return moerl_errorf("%s: not ready within %gs (max(%s, %gs); importing the file took too long?)%s",
                                pb->what, limit, pb->timeout_key, READY_MIN_S, note);
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

static int worker_start(jsonl_procs *pb, worker *w) {
    if (worker_spawn(pb, w) != MOERL_OK) return MOERL_ERR;
    return pb->ready_line ? wait_ready(pb, w) : MOERL_OK;
}

static const char *where_of(const jsonl_proc_policy *pol, long id) {
    const char *s = pol && pol->where ? pol->where(pol->ctx, id) : NULL;
    return s ? s : "(no row)";
}

#define STARTUP_GRACE_S 10.0

/* Send line (owned) of request id to w, starting its process when it is not running. */
static int assign(jsonl_procs *pb, const jsonl_proc_policy *pol, worker *w, long id, char *line, int tries) {
    if (!w->pid && worker_start(pb, w) != MOERL_OK) {
        free(line);
        pb->n_pending--;
        return moerl_error_prefix("%s: ", where_of(pol, id));
    }
    size_t len = strlen(line);
    free(w->out);
    w->out = xmalloc(len + 2);
    memcpy(w->out, line, len);
    w->out[len] = '\n';
    w->out_len = len + 1;
    w->out_off = 0;
    free(w->line);
    w->line = line;
    w->req = 1;
    w->id = id;
    w->tries = tries;
    /* a worker's first request also waits for its process's start-up (imports, loading a model): it gets
     * STARTUP_GRACE_S or timeout_s more, whichever is larger — else a program slower to start than
     * the timeout would be killed and restarted for ever, never answering */
    const double grace =
        w->n_answered == 0 && !w->graced ? (pb->timeout_s > STARTUP_GRACE_S ? pb->timeout_s : STARTUP_GRACE_S) : 0;
    w->graced |= grace > 0; /* once per worker: a replacement of a timed-out process gets no grace (a hanging tool
                               would otherwise get grace + timeout on every call) */
    w->deadline = now_s() + pb->timeout_s + grace;
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

/* w's process failed on its request (already killed): the policy decides. */
static int failed(jsonl_procs *pb, const jsonl_proc_policy *pol, worker *w, long id, char *line, int tries,
                  jsonl_failure kind, const char *how, const char *note) {
    int d = pol->on_failure(pol->ctx, id, kind, tries, how, note);
    if (d == JSONL_RETRY) return assign(pb, pol, w, id, line, tries);
    free(line);
    pb->n_pending--;
    return d == JSONL_RESOLVED ? MOERL_OK : MOERL_ERR;
}

/* Take w's request off it (the process is being killed): *line owned by the caller. */
static void take_request(worker *w, long *id, char **line, int *tries) {
    *id = w->id;
    *line = w->line;
    *tries = w->tries + 1;
    w->line = NULL;
}

/* w's stdout closed (or its stdin: EPIPE): the process ended. */
static int on_exit_of(jsonl_procs *pb, const jsonl_proc_policy *pol, worker *w) {
    int st = 0, busy = w->req >= 0, tries, answered = w->n_answered;
    long id;
    char *line;
    char how[200], note[1800];
    take_request(w, &id, &line, &tries);
    int reaped = worker_reap(pb, w, &st);
    stderr_note(w, note, sizeof note);
    if (!busy) { /* ended between requests: started again when it gets one */
        free(line);
        return MOERL_OK;
    }
    if (!reaped)
        snprintf(how, sizeof how, "closed its stdin or stdout and did not exit within %s=%gs (killed)",
                 pb->timeout_key, pb->timeout_s);
    else describe_status(st, how, sizeof how);
    jsonl_failure kind = reaped && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? JSONL_EXITED_0 : JSONL_DIED;
    if (kind == JSONL_EXITED_0)
        snprintf(how, sizeof how, "exited with status 0 after %d answer%s", answered, answered == 1 ? "" : "s");
    return failed(pb, pol, w, id, line, tries, kind, how, note);
}

/* The hint for a process's first stdout line that is not an answer: a start-up banner ("Loading
 * model...") printed to stdout, where only answers belong. Given only for a line that is not JSON at
 * all and does not start as one: an answer that is wrong (NaN, no score, None from a verl function) is
 * the answer's own error, named without it. */
static const char k_banner_hint[] =
    " (this is the first line the program wrote: it looks like output before the first request, such as a "
    "start-up banner; stdout carries one answer line per request only — print diagnostics to stderr)";

static const char *banner_hint(const char *line, size_t len) {
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    /* an answer's shape (an object, a list, a string or a number: Python writes {"score": NaN} too) */
    if (i < len && strchr("{[\"-0123456789", line[i])) return "";
    if ((len - i >= 3 && !memcmp(line + i, "NaN", 3)) || (len - i >= 8 && !memcmp(line + i, "Infinity", 8)))
        return ""; /* Python's json.dumps of a non-finite float */
    json_t *j = json_loadb(line, len, JSON_DECODE_ANY, NULL);
    json_decref(j);
    return j ? "" : k_banner_hint;
}

/* Answer lines that came on w: each one is its request's (an extra line is an error). */
static int on_lines(jsonl_procs *pb, const jsonl_proc_policy *pol, worker *w) {
    size_t len;
    char *line;
    while ((line = first_line(w, &len))) {
        char ex[200], note[1800];
        if (w->req < 0) {
            reward_excerpt(line, len, ex, sizeof ex);
            stderr_note(w, note, sizeof note);
            return moerl_errorf("%s: the program wrote a line it was not asked for, '%s' (after %d answer%s; it must "
                                "write exactly one line per request)%s%s",
                                pb->what, ex, w->n_answered, w->n_answered == 1 ? "" : "s",
                                w->n_answered == 0 ? banner_hint(line, len) : "", note);
        }
        /* a line before the request was wholly written cannot answer it */
        const int early = w->n_answered == 0 && w->out_off < w->out_len;
        int rc = pol->on_answer(pol->ctx, w->id, line, len);
        if (rc != MOERL_OK && w->n_answered == 0 && *banner_hint(line, len)) {
            char *why = xstrdup(moerl_last_error());
            moerl_errorf("%s%s%s", why, early ? " (it came before the request was written)" : "", k_banner_hint);
            free(why);
        }
        consume_line(w, len);
        w->req = -1;
        free(w->line);
        w->line = NULL;
        w->n_answered++;
        pb->n_pending--;
        if (rc != MOERL_OK) return MOERL_ERR;
    }
    return MOERL_OK;
}

/* What came on worker w (its pollfds p[0..4)): stderr, writable stdin, answers, its end, its timeout. */
static int handle_worker(jsonl_procs *pb, const jsonl_proc_policy *pol, worker *w, const struct pollfd *p) {
    if (p[1].revents) drain_stderr(w);
    if (p[2].revents && write_more(w) < 0) return on_exit_of(pb, pol, w); /* EPIPE: it closed its stdin */
    int exited = p[3].revents != 0 || (w->pidfd < 0 && has_exited(w));
    int got = p[0].revents || exited ? read_stdout(w) : 0, rc = MOERL_OK;
    if (got) rc = on_lines(pb, pol, w);
    if (rc == MOERL_OK && w->in_len > MAX_LINE)
        rc = moerl_errorf("%s: %s: the program wrote more than %u MiB without ending the line", pb->what,
                          w->req >= 0 ? where_of(pol, w->id) : "(no row)", MAX_LINE >> 20);
    if (rc == MOERL_OK && ((got & GOT_EOF) || exited)) rc = on_exit_of(pb, pol, w);
    if (rc == MOERL_OK && w->req >= 0 && now_s() >= w->deadline) {
        char how[200], note[1800];
        long id;
        char *line;
        int tries;
        snprintf(how, sizeof how, "gave no answer within %s=%gs and was killed", pb->timeout_key, pb->timeout_s);
        stderr_note(w, note, sizeof note);
        take_request(w, &id, &line, &tries);
        worker_kill(w);
        rc = failed(pb, pol, w, id, line, tries, JSONL_HUNG, how, note);
    }
    return rc;
}

/* One poll over every running worker (and the cancel pipe), up to wait_s (< 0: the next deadline). */
static int poll_once(jsonl_procs *pb, const jsonl_proc_policy *pol, double wait_s) {
    struct pollfd *p = xcalloc((size_t)(4 * pb->n_w + 1), sizeof *p);
    int *at = xcalloc((size_t)pb->n_w, sizeof(int)); /* index of worker k's first pollfd, -1: none */
    int np = 0, rc = MOERL_OK;
    double t = now_s(), first = wait_s >= 0 ? t + wait_s : INFINITY;
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
    for (int k = 0; k < pb->n_w && rc == MOERL_OK; k++)
        if (at[k] >= 0 && pb->w[k].pid) rc = handle_worker(pb, pol, &pb->w[k], &p[at[k]]);
    free(p);
    free(at);
    return rc;
}

void jsonl_procs_submit(jsonl_procs *pb, long id, char *line) {
    if (pb->q_head > 0 && pb->q_head == pb->q_len) pb->q_head = pb->q_len = 0;
    if (pb->q_len == pb->q_cap) {
        if (pb->q_head > 0) {
            memmove(pb->q, pb->q + pb->q_head, (size_t)(pb->q_len - pb->q_head) * sizeof *pb->q);
            pb->q_len -= pb->q_head;
            pb->q_head = 0;
        } else {
            pb->q_cap = pb->q_cap ? 2 * pb->q_cap : 16;
            pb->q = xrealloc(pb->q, (size_t)pb->q_cap * sizeof *pb->q);
        }
    }
    pb->q[pb->q_len++] = (queued){id, line};
    pb->n_pending++;
}

int jsonl_procs_pending(const jsonl_procs *pb) { return pb->n_pending; }

int jsonl_procs_step(jsonl_procs *pb, const jsonl_proc_policy *pol, double wait_s) {
    if (atomic_load(&pb->cancelled)) return moerl_errorf("%s: cancelled", pb->what);
    for (int k = 0; k < pb->n_w && pb->q_head < pb->q_len; k++)
        if (pb->w[k].req < 0) {
            queued q = pb->q[pb->q_head++];
            if (assign(pb, pol, &pb->w[k], q.id, q.line, 0) != MOERL_OK) return MOERL_ERR;
        }
    return poll_once(pb, pol, wait_s);
}

int jsonl_procs_check_extra(jsonl_procs *pb, const jsonl_proc_policy *pol) {
    for (int k = 0; k < pb->n_w; k++) {
        worker *w = &pb->w[k];
        if (!w->pid) continue;
        int exited = has_exited(w), got = read_stdout(w);
        if (on_lines(pb, pol, w) != MOERL_OK) return MOERL_ERR;
        if ((got & GOT_EOF) || exited) on_exit_of(pb, pol, w);
    }
    return MOERL_OK;
}

void jsonl_procs_abort(jsonl_procs *pb) {
    for (int i = pb->q_head; i < pb->q_len; i++) free(pb->q[i].line);
    pb->q_head = pb->q_len = 0;
    for (int k = 0; k < pb->n_w; k++) { /* a process with a request in flight would answer it next time */
        worker *w = &pb->w[k];
        if (w->req >= 0 || w->in_len || atomic_load(&pb->cancelled)) worker_kill(w);
        free(w->line);
        w->line = NULL;
    }
    pb->n_pending = 0;
}

void jsonl_procs_cancel(jsonl_procs *pb) {
    atomic_store(&pb->cancelled, 1);
    char c = 1;
    if (write_nosig(pb->wake[1], &c, 1) < 0) {} /* full pipe: already woken */
}

int jsonl_procs_cancelled(const jsonl_procs *pb) { return atomic_load(&pb->cancelled); }

void jsonl_procs_free(jsonl_procs *pb) {
    if (!pb) return;
    jsonl_procs_abort(pb);
    for (int k = 0; k < pb->n_w; k++) {
        worker_kill(&pb->w[k]);
        free(pb->w[k].in);
    }
    free(pb->w);
    free(pb->q);
    for (int i = 0; i < pb->argc; i++) free(pb->argv[i]);
    free(pb->argv);
    close_fd(&pb->wake[0]);
    close_fd(&pb->wake[1]);
    free(pb);
}

jsonl_procs *jsonl_procs_create(const char *what, char *const *argv, int n_workers, double timeout_s,
                                const char *timeout_key, int ready_line) {
    jsonl_procs *pb = xcalloc(1, sizeof *pb);
    snprintf(pb->what, sizeof pb->what, "%s", what);
    snprintf(pb->timeout_key, sizeof pb->timeout_key, "%s", timeout_key);
    pb->wake[0] = pb->wake[1] = -1;
    pb->timeout_s = timeout_s;
    pb->ready_line = ready_line;
    while (argv[pb->argc]) pb->argc++;
    pb->argv = xcalloc((size_t)pb->argc + 1, sizeof(char *));
    for (int i = 0; i < pb->argc; i++) pb->argv[i] = xstrdup(argv[i]);
    pb->n_w = n_workers > 0 ? n_workers : 1;
    pb->w = xcalloc((size_t)pb->n_w, sizeof(worker));
    for (int k = 0; k < pb->n_w; k++) pb->w[k] = (worker){.to = -1, .from = -1, .err = -1, .pidfd = -1, .req = -1};
    if (pipe2(pb->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        moerl_errorf("%s: cannot make a pipe: %s", pb->what, strerror(errno));
        jsonl_procs_free(pb);
        return NULL;
    }
    for (int k = 0; k < pb->n_w; k++) /* every process started before any is waited for */
        if (worker_spawn(pb, &pb->w[k]) != MOERL_OK) {
            jsonl_procs_free(pb);
            return NULL;
        }
    for (int k = 0; k < pb->n_w && pb->ready_line; k++)
        if (wait_ready(pb, &pb->w[k]) != MOERL_OK) {
            jsonl_procs_free(pb);
            return NULL;
        }
    return pb;
}
