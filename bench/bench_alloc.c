/* Allocation-trace replay: the caching pool (src/base/pool.c) against glibc malloc and jemalloc.
 *
 *   bench_alloc [--trace FILE]... [--synthetic STEPS] [--reps N] [--json OUT]
 *               [--min-block BYTES] [--reserve FRAC]     (the pool's settings; defaults of pool.h)
 *               [--write-synthetic FILE]                  (also write the synthetic trace as a trace file)
 *               [--resident]                              (also measure resident memory, below)
 *
 * A trace is the JSONL that MOERL_ALLOC_TRACE=FILE writes (src/base/pool.h): a header line, then
 * {"op":"alloc"|"free","id":n,"size":bytes,...}. --synthetic STEPS generates one modelled on a
 * training job with dynamic micro-batches (the 8×A100 practice of docs/benchmarks.md: 4–16 micro-batches a
 * step): long-lived buffers (KV cache, parameters' gradients' residual) plus, every step, activation
 * buffers whose size follows the micro-batch's token count, freed in mixed order, and now and then a
 * long-lived buffer reallocated larger. Deterministic (fixed seed).
 *
 * Every replay runs in its own child process (fork), so each starts from the same allocator state.
 * For each allocator: time of one replay (median over --reps, each on a fresh allocator; allocation
 * calls only, no stores to the memory, no statistics calls), and from one extra, untimed replay:
 *   peak requested — the most bytes live at once;
 *   peak footprint — the most memory the allocator held at once: pool = committed bytes; glibc =
 *     mallinfo2 arena + hblkhd, less what it held when the replay started; jemalloc = stats.active
 *     (pages of live extents; mapped-but-free retained memory is not counted, which favours jemalloc);
 *   frag_peak = 1 − requested / footprint at the footprint's peak (the most requested over the ops
 *     where the footprint is at its peak): issue 29's fragmentation, "1 − requested/reserved at the
 *     peak", for every allocator;
 *   overhead = 1 − peak requested / peak footprint (the two peaks may lie at different ops);
 *   ext_frag (pool only) = 1 − largest free block / free committed bytes (moerl_pool_stats.
 *     fragmentation), the mean and the maximum over the replay's ops.
 * The replay does not touch the memory, so footprint is what each allocator reserved, not resident.
 * --resident: the measuring replay also writes one byte in every page of every allocation (the pages
 * moerl_buf_alloc's zero fill makes resident) and reads VmRSS (/proc/self/statm) after every op:
 *   peak_rss — the most resident memory above the replay's start (the pool's own tables included);
 *   fp/glibc_rss — the allocator's peak footprint over glibc's peak resident memory: issue 29's "peak
 *     reserved ≤ glibc malloc's peak resident for the same trace" holds for the pool when it is ≤ 1.
 *   The touch costs page faults (the synthetic trace touches some 130 GiB per allocator in 200
 *   steps), so run the synthetic trace with --resident at fewer steps. Timed replays never touch.
 */
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "base/pool.h"
#include "bench_util.h"

typedef struct {
    int alloc; /* 1 alloc, 0 free */
    int64_t id;
    size_t size;
} op_t;

typedef struct {
    op_t *ops;
    size_t n, cap;
    int64_t max_id;
    char name[256];
} trace_t;

static void push(trace_t *t, int alloc, int64_t id, size_t size) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->ops = xrealloc(t->ops, t->cap * sizeof *t->ops);
    }
    t->ops[t->n++] = (op_t){alloc, id, size};
    if (id > t->max_id) t->max_id = id;
}

static int load_trace(const char *path, trace_t *t) {
    char *buf;
    size_t len;
    if (moerl_read_file(path, &buf, &len) != MOERL_OK) return MOERL_ERR;
    snprintf(t->name, sizeof t->name, "%s", path);
    int line = 0;
    for (char *s = buf, *nl; s && *s; s = nl ? nl + 1 : NULL) {
        nl = strchr(s, '\n');
        if (nl) *nl = 0;
        line++;
        if (!*s) continue;
        json_error_t err;
        json_t *o = json_loads(s, 0, &err);
        if (!o) {
            free(buf);
            return moerl_errorf("%s:%d: not JSON: %s", path, line, err.text);
        }
        if (line == 1) {
            if (!json_object_get(o, "moerl_alloc_trace")) {
                json_decref(o);
                free(buf);
                return moerl_errorf("%s: the first line is not a moerl_alloc_trace header", path);
            }
            json_decref(o);
            continue;
        }
        const char *op = json_string_value(json_object_get(o, "op"));
        json_t *id = json_object_get(o, "id"), *size = json_object_get(o, "size");
        if (!op || !json_is_integer(id) || !json_is_integer(size) || json_integer_value(size) < 0 ||
            (strcmp(op, "alloc") && strcmp(op, "free"))) {
            json_decref(o);
            free(buf);
            return moerl_errorf("%s:%d: expected {\"op\":\"alloc\"|\"free\",\"id\":int,\"size\":int}", path, line);
        }
        if (json_integer_value(id) > 0) /* id 0: a free of a pointer the trace never saw allocated */
            push(t, !strcmp(op, "alloc"), json_integer_value(id), (size_t)json_integer_value(size));
        json_decref(o);
    }
    free(buf);
    return MOERL_OK;
}

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Synthetic training trace (sizes in bytes; the scale is a ~1B-parameter job's host buffers /64). */
static void synth_trace(trace_t *t, int steps) {
    snprintf(t->name, sizeof t->name, "synthetic (%d steps)", steps);
    const size_t MiB = 1 << 20;
    int64_t id = 0;
    push(t, 1, ++id, 300 * MiB); /* KV cache k */
    push(t, 1, ++id, 300 * MiB); /* KV cache v */
    int64_t resid = ++id;
    size_t resid_sz = 64 * MiB;
    push(t, 1, resid, resid_sz); /* gradient residual */
    for (int s = 0; s < steps; s++) {
        const int mb = 4 + (int)(rnd() % 13); /* dynamic micro-batches: 4–16 */
        int64_t live[64];
        int n = 0;
        for (int m = 0; m < mb; m++) {
            const size_t tokens = 256 + rnd() % 3840;      /* tokens of this micro-batch */
            const size_t acts = tokens * 24 * 1024;          /* activation arena: ~24 KiB per token */
            const size_t logits = tokens * (4 * 1024 + rnd() % 4096); /* logits / scratch */
            live[n++] = ++id;
            push(t, 1, id, acts);
            live[n++] = ++id;
            push(t, 1, id, logits);
            if (rnd() % 2) { /* free the scratch early, keep the activations for backward */
                push(t, 0, live[n - 1], 0);
                n--;
            }
        }
        while (n > 0) { /* backward releases in mixed order */
            const int i = (int)(rnd() % (uint64_t)n);
            push(t, 0, live[i], 0);
            live[i] = live[--n];
        }
        if (s % 25 == 24) { /* a long-lived buffer reallocated larger (e.g. a grown bucket) */
            push(t, 0, resid, 0);
            resid_sz += 4 * MiB;
            resid = ++id;
            push(t, 1, resid, resid_sz);
        }
    }
    push(t, 0, 1, 0);
    push(t, 0, 2, 0);
    push(t, 0, resid, 0);
}

/* The trace as MOERL_ALLOC_TRACE writes it (no times; tag "synthetic"), so it replays with --trace. */
static int write_trace(const char *path, const trace_t *t) {
    size_t cap = 128 + t->n * 80, len = 0;
    char *buf = xmalloc(cap);
    len += (size_t)snprintf(buf, cap, "{\"moerl_alloc_trace\":1,\"allocator\":\"synthetic\",\"source\":\"%s\"}\n",
                            t->name);
    for (size_t i = 0; i < t->n; i++)
        len += (size_t)snprintf(buf + len, cap - len, "{\"op\":\"%s\",\"id\":%lld,\"size\":%zu,\"tag\":\"synthetic\"}\n",
                                t->ops[i].alloc ? "alloc" : "free", (long long)t->ops[i].id, t->ops[i].size);
    const int rc = moerl_write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}

enum { A_GLIBC, A_POOL, A_JEMALLOC, N_ALLOC }; /* glibc first: the others' footprints are given against it */
static const char *ANAME[N_ALLOC] = {"glibc", "pool", "jemalloc"};
static moerl_jemalloc_api JE;
static int have_je;

typedef struct {
    double time_med, time_min, peak_req, peak_fp, req_at_peak, frag_peak, overhead, frag_mean, frag_max;
    double peak_rss; /* bytes; --resident only: the most resident memory (VmRSS) above the replay's start */
    int failures, ran;
} result_t;

static moerl_pool_config POOL_CFG;
static int RESIDENT; /* --resident: the measuring replay writes every page it is given and samples VmRSS */
static size_t PAGE = 4096;

/* Resident bytes of this process: the second field of /proc/self/statm (pages) × the page size. */
static size_t resident_bytes(int fd) {
    char buf[128];
    const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) moerl_fatal("bench_alloc: cannot read /proc/self/statm");
    buf[n] = 0;
    unsigned long long size = 0, res = 0;
    if (sscanf(buf, "%llu %llu", &size, &res) != 2) moerl_fatal("bench_alloc: /proc/self/statm: '%s'", buf);
    return (size_t)res * PAGE;
}

/* Write one byte in every page of [q, q+sz), as moerl_buf_alloc's zero fill does to all of them, so the
 * pages become resident (one store per page: the same resident set as a full memset, fewer stores). */
static void touch_pages(void *q, size_t sz) {
    volatile char *c = q;
    for (size_t k = 0; k < sz; k += PAGE) c[k] = 1;
    if (sz) c[sz - 1] = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static size_t footprint(int a, moerl_pool *p) {
    if (a == A_POOL) {
        moerl_pool_stats st;
        moerl_pool_get_stats(p, &st);
        return st.committed;
    }
    if (a == A_GLIBC) {
        struct mallinfo2 mi = mallinfo2();
        return mi.arena + mi.hblkhd;
    }
    uint64_t epoch = 1;
    size_t sz = sizeof epoch, active = 0, asz = sizeof active;
    JE.mallctl("epoch", &epoch, &sz, &epoch, sz);
    JE.mallctl("stats.active", &active, &asz, NULL, 0);
    return active;
}

/* One replay; with measure=1 samples statistics after every op. Returns the seconds it took. */
static double replay(int a, const trace_t *t, int measure, result_t *r) {
    void **ptr = xcalloc((size_t)t->max_id + 1, sizeof(void *));
    size_t *szs = xcalloc((size_t)t->max_id + 1, sizeof(size_t));
    if (a == A_GLIBC) malloc_trim(0); /* glibc's footprint and resident memory count from its trimmed state */
    const int rss_fd = measure && RESIDENT ? open("/proc/self/statm", O_RDONLY) : -1;
    if (measure && RESIDENT && rss_fd < 0) moerl_fatal("bench_alloc: cannot open /proc/self/statm");
    const size_t rss0 = rss_fd >= 0 ? resident_bytes(rss_fd) : 0; /* the pool's own tables count as its memory */
    size_t peak_rss = 0;
    moerl_pool *p = NULL;
    if (a == A_POOL) {
        p = moerl_pool_create(&POOL_CFG);
        if (!p) moerl_fatal("%s", moerl_last_error());
    }
    size_t live = 0, peak_req = 0, peak_fp = 0, req_at_peak = 0;
    const size_t fp0 = measure && a == A_GLIBC ? footprint(a, p) : 0;
    double frag_sum = 0, frag_max = 0;
    long frag_n = 0;
    int fails = 0;
    const double t0 = now_s();
    for (size_t i = 0; i < t->n; i++) {
        const op_t *o = &t->ops[i];
        if (o->alloc) {
            const size_t sz = o->size ? (o->size + 63) & ~(size_t)63 : 64;
            void *q = a == A_POOL ? moerl_pool_alloc(p, sz)
                      : a == A_GLIBC ? aligned_alloc(64, sz)
                                     : JE.mallocx(sz, JE.flags_align64);
            if (!q) fails++;
            else if (rss_fd >= 0) touch_pages(q, sz);
            ptr[o->id] = q;
            szs[o->id] = sz;
            if (measure) live += sz;
        } else {
            void *q = ptr[o->id];
            if (!q) continue;
            if (a == A_POOL) moerl_pool_free(p, q);
            else if (a == A_GLIBC) free(q);
            else JE.dallocx(q, 0);
            ptr[o->id] = NULL;
            if (measure) live -= szs[o->id];
        }
        if (measure) {
            if (live > peak_req) peak_req = live;
            const size_t fp_now = footprint(a, p), fp = fp_now > fp0 ? fp_now - fp0 : 0;
            if (fp > peak_fp) peak_fp = fp, req_at_peak = live;
            else if (fp == peak_fp && live > req_at_peak) req_at_peak = live;
            if (rss_fd >= 0) {
                const size_t rss = resident_bytes(rss_fd);
                if (rss > rss0 && rss - rss0 > peak_rss) peak_rss = rss - rss0;
            }
            if (a == A_POOL) {
                moerl_pool_stats st;
                moerl_pool_get_stats(p, &st);
                frag_sum += st.fragmentation;
                frag_n++;
                if (st.fragmentation > frag_max) frag_max = st.fragmentation;
            }
        }
    }
    const double dt = now_s() - t0;
    for (int64_t id = 0; id <= t->max_id; id++) /* anything the trace left live */
        if (ptr[id]) {
            if (a == A_POOL) moerl_pool_free(p, ptr[id]);
            else if (a == A_GLIBC) free(ptr[id]);
            else JE.dallocx(ptr[id], 0);
        }
    free(ptr);
    free(szs);
    moerl_pool_destroy(p);
    if (rss_fd >= 0) close(rss_fd);
    if (measure) {
        r->peak_rss = (double)peak_rss;
        r->peak_req = (double)peak_req;
        r->peak_fp = (double)peak_fp;
        r->overhead = peak_fp ? 1.0 - (double)peak_req / (double)peak_fp : 0;
        r->req_at_peak = (double)req_at_peak;
        r->frag_peak = peak_fp ? 1.0 - (double)req_at_peak / (double)peak_fp : 0;
        r->frag_mean = frag_n ? frag_sum / frag_n : 0;
        r->frag_max = frag_max;
        r->failures = fails;
    }
    return dt;
}

/* replay() in a child process, so that every replay starts from the same allocator state (glibc's
 * dynamic mmap threshold and its cached heap, jemalloc's caches) whatever ran before it. */
static double replay_forked(int a, const trace_t *t, int measure, result_t *r) {
    int fd[2];
    if (pipe(fd) != 0) moerl_fatal("bench_alloc: pipe failed");
    fflush(NULL);
    const pid_t pid = fork();
    if (pid < 0) moerl_fatal("bench_alloc: fork failed");
    if (pid == 0) {
        close(fd[0]);
        struct { double dt; result_t r; } msg = {0};
        msg.r = *r;
        msg.dt = replay(a, t, measure, &msg.r);
        const ssize_t w = write(fd[1], &msg, sizeof msg);
        _exit(w == (ssize_t)sizeof msg ? 0 : 1);
    }
    close(fd[1]);
    struct { double dt; result_t r; } msg;
    ssize_t got = 0;
    while (got < (ssize_t)sizeof msg) {
        const ssize_t k = read(fd[0], (char *)&msg + got, sizeof msg - (size_t)got);
        if (k <= 0) break;
        got += k;
    }
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof msg || !WIFEXITED(status) || WEXITSTATUS(status))
        moerl_fatal("bench_alloc: the %s replay of %s failed in its child process", ANAME[a], t->name);
    *r = msg.r;
    return msg.dt;
}

int main(int argc, char **argv) {
    const char *traces[16];
    int n_traces = 0, synth = 0, reps = 21;
    const char *json_out = NULL;
    static const struct option opts[] = {{"trace", required_argument, 0, 't'},
                                         {"synthetic", required_argument, 0, 's'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"json", required_argument, 0, 'j'},
                                         {"min-block", required_argument, 0, 'm'},
                                         {"reserve", required_argument, 0, 'R'},
                                         {"write-synthetic", required_argument, 0, 'w'},
                                         {"resident", no_argument, 0, 'e'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    POOL_CFG = moerl_pool_default_config();
    const long pg = sysconf(_SC_PAGESIZE);
    if (pg > 0) PAGE = (size_t)pg;
    const char *write_synth = NULL;
    while ((c = getopt_long(argc, argv, "t:s:r:j:m:R:w:eh", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (n_traces < 16) traces[n_traces++] = optarg;
            break;
        case 's': synth = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'j': json_out = optarg; break;
        case 'w': write_synth = optarg; break;
        case 'e': RESIDENT = 1; break;
        case 'm':
            if (moerl_parse_bytes(optarg, "--min-block", &POOL_CFG.min_block) != MOERL_OK) {
                fprintf(stderr, "bench_alloc: %s\n", moerl_last_error());
                return 2;
            }
            break;
        case 'R': {
            char *end;
            POOL_CFG.reserve_frac = strtod(optarg, &end);
            if (end == optarg || *end || !(POOL_CFG.reserve_frac >= 0 && POOL_CFG.reserve_frac <= 1)) {
                fprintf(stderr, "bench_alloc: --reserve '%s': expected a fraction in [0, 1]\n", optarg);
                return 2;
            }
            break;
        }
        default:
            fprintf(stderr,
                    "usage: %s [--trace FILE]... [--synthetic STEPS] [--reps N] [--json OUT] [--min-block BYTES] "
                    "[--reserve FRAC] [--write-synthetic FILE] [--resident]\n",
                    argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    if (reps < 1 || synth < 0 || (!n_traces && !synth)) {
        fprintf(stderr, "bench_alloc: give --trace FILE and/or --synthetic STEPS (> 0), and --reps ≥ 1\n");
        return 2;
    }
    {
        moerl_pool *probe = moerl_pool_create(&POOL_CFG); /* a bad --min-block: the pool's own message */
        if (!probe) {
            fprintf(stderr, "bench_alloc: %s\n", moerl_last_error());
            return 2;
        }
        moerl_pool_destroy(probe);
    }
    printf("pool: min_block %zu bytes, reserve %.2f\n", POOL_CFG.min_block, POOL_CFG.reserve_frac);
    have_je = moerl_jemalloc_load(&JE) == MOERL_OK;
    if (!have_je) fprintf(stderr, "bench_alloc: jemalloc skipped: %s\n", moerl_last_error());
    const int n_sets = n_traces + (synth > 0);
    json_t *jout = json_array();
    for (int ti = 0; ti < n_sets; ti++) {
        trace_t t = {0};
        if (ti < n_traces) {
            if (load_trace(traces[ti], &t) != MOERL_OK) {
                fprintf(stderr, "bench_alloc: %s\n", moerl_last_error());
                return 1;
            }
        } else {
            synth_trace(&t, synth);
            if (write_synth && write_trace(write_synth, &t) != MOERL_OK) {
                fprintf(stderr, "bench_alloc: %s\n", moerl_last_error());
                return 1;
            }
        }
        size_t n_alloc = 0;
        for (size_t i = 0; i < t.n; i++) n_alloc += t.ops[i].alloc;
        printf("trace %s: %zu ops (%zu allocations), %d reps\n", t.name, t.n, n_alloc, reps);
        printf("  %-9s %12s %10s %13s %13s %10s %9s %9s %9s %9s %12s %14s\n", "allocator", "time_ms_med", "us_per_op",
               "peak_req_MiB", "peak_fp_MiB", "fp/glibc", "frag_peak", "overhead", "ext_mean", "ext_max", "peak_rss_MiB",
               "fp/glibc_rss");
        double glibc_fp = 0, glibc_rss = 0;
        json_t *jt = json_object();
        json_object_set_new(jt, "trace", json_string(t.name));
        json_object_set_new(jt, "ops", json_integer((json_int_t)t.n));
        json_object_set_new(jt, "reps", json_integer(reps));
        for (int a = 0; a < N_ALLOC; a++) {
            if (a == A_JEMALLOC && !have_je) continue;
            result_t r = {0};
            replay_forked(a, &t, 1, &r);
            double *ts = xmalloc((size_t)reps * sizeof(double));
            /* each replay in a fresh child (replay_forked); interleaving with the other allocators would
             * be fairer to machine noise */
            for (int k = 0; k < reps; k++) ts[k] = replay_forked(a, &t, 0, &r);
            r.time_med = bench_median(ts, reps);
            free(ts);
            const double MiB = 1048576.0;
            char fm[16] = "-", fx[16] = "-";
            if (a == A_POOL) {
                snprintf(fm, sizeof fm, "%.4f", r.frag_mean);
                snprintf(fx, sizeof fx, "%.4f", r.frag_max);
            }
            if (a == A_GLIBC) glibc_fp = r.peak_fp, glibc_rss = r.peak_rss;
            char ratio[16] = "-", rss[24] = "-", rratio[16] = "-";
            if (a != A_GLIBC && glibc_fp > 0) snprintf(ratio, sizeof ratio, "%.4f", r.peak_fp / glibc_fp);
            if (RESIDENT) snprintf(rss, sizeof rss, "%.2f", r.peak_rss / MiB);
            if (RESIDENT && glibc_rss > 0) snprintf(rratio, sizeof rratio, "%.4f", r.peak_fp / glibc_rss);
            printf("  %-9s %12.3f %10.3f %13.2f %13.2f %10s %9.4f %9.4f %9s %9s %12s %14s%s\n", ANAME[a],
                   1e3 * r.time_med, 1e6 * r.time_med / (double)t.n, r.peak_req / MiB, r.peak_fp / MiB, ratio,
                   r.frag_peak, r.overhead, fm, fx, rss, rratio, r.failures ? "  (failures!)" : "");
            json_t *ja = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:i}", "time_s_median", r.time_med,
                                   "peak_requested_bytes", r.peak_req, "peak_footprint_bytes", r.peak_fp,
                                   "requested_at_peak_bytes", r.req_at_peak, "fragmentation_at_peak", r.frag_peak,
                                   "overhead", r.overhead, "failures", r.failures);
            if (RESIDENT) {
                json_object_set_new(ja, "peak_resident_bytes", json_real(r.peak_rss));
                if (glibc_rss > 0)
                    json_object_set_new(ja, "footprint_over_glibc_resident", json_real(r.peak_fp / glibc_rss));
            }
            if (a == A_POOL) {
                json_object_set_new(ja, "ext_fragmentation_mean", json_real(r.frag_mean));
                json_object_set_new(ja, "ext_fragmentation_max", json_real(r.frag_max));
            }
            json_object_set_new(jt, ANAME[a], ja);
        }
        json_array_append_new(jout, jt);
        free(t.ops);
    }
    if (json_out) {
        char *s = json_dumps(jout, JSON_INDENT(1));
        const int rc = moerl_write_file_atomic(json_out, s, strlen(s));
        free(s);
        if (rc != MOERL_OK) {
            fprintf(stderr, "bench_alloc: %s\n", moerl_last_error());
            return 1;
        }
    }
    json_decref(jout);
    return 0;
}
