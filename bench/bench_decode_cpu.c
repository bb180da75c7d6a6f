/* bench_decode_cpu — CPU time per decoded token of the rollout engine's decode steps, a measure
 * that a shared, loaded machine does not distort the way it distorts wall-clock tokens/s.
 *
 * The engine is bench_decode's model B (H=512, 8 layers, 32 experts top-4, vocab 2048; 433 MB of
 * fp32 weights), random weights, with engine_config.bf16_weights (rollout.dtype bf16) unless
 * --fp32. At every batch size b of --batches, every repetition adds b requests (prompt of
 * --prompt-len distinct tokens, temperature 1, ignore_eos, max_tokens = --max-tokens), runs the
 * prefill steps unmeasured, then measures the decode steps only: user CPU time of the process
 * (getrusage, every thread summed) and, where the kernel exposes hardware counters to this
 * process, user-mode cycles and instructions (perf_event_open on every OpenMP thread). Printed
 * per batch: median (min–max) over --reps repetitions of µs of user CPU, and cycles, per decoded
 * token, after one unmeasured warm-up repetition.
 *
 * What it measures: the work of a step (the kernels, the engine's bookkeeping, the OpenMP
 * fork/join) — not the time a thread waits descheduled, which is what load adds to wall-clock
 * figures. Waiting threads of an OpenMP barrier spin by default and that spin is user time: run
 * with OMP_NUM_THREADS=1, or with OMP_WAIT_POLICY=passive for several threads, so the figure is
 * the work. It is not a throughput and says nothing about imbalance between threads.
 *
 * Profiling only the measured steps: with BENCH_PERF_CTL_FD=N the driver writes "enable" and
 * "disable" around them to file descriptor N, perf's control descriptor:
 *   mkfifo ctl; exec 9<>ctl; BENCH_PERF_CTL_FD=9 perf record -D -1 --control fd:9 -- bench_decode_cpu ...
 *
 * Usage: bench_decode_cpu [--batches 1,8,32] [--reps N (>= 3)] [--prompt-len 16]
 *                         [--max-tokens 32] [--fp32]
 */
#include "base/common.h"
#include "model/model.h"
#include "rollout/engine.h"

#include <linux/perf_event.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "bench_engine.h"
#include "bench_util.h"

#define MAX_BATCHES 8
#define MAX_THREADS 256

/* ------------------------------------------------------------------ counters */

typedef struct {
    int fd[MAX_THREADS][2]; /* cycles:u, instructions:u per OpenMP thread; -1 where unavailable */
    int nt, ok;
} hw_counters;

static int perf_open(uint64_t config) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_HARDWARE;
    a.config = config;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0); /* this thread, any CPU */
}

/* One counter pair per thread of the OpenMP pool (the engine's teams run on the same pool). */
static void hw_open(hw_counters *h) {
    h->nt = 1;
#ifdef _OPENMP
    h->nt = MOERL_MIN(omp_get_max_threads(), MAX_THREADS);
#endif
    int bad = 0;
#pragma omp parallel num_threads(h->nt) reduction(+ : bad)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        h->fd[t][0] = perf_open(PERF_COUNT_HW_CPU_CYCLES);
        h->fd[t][1] = perf_open(PERF_COUNT_HW_INSTRUCTIONS);
        bad += h->fd[t][0] < 0 || h->fd[t][1] < 0;
    }
    h->ok = !bad;
}

/* Sum over threads of counter k (0 cycles, 1 instructions); 0 if unavailable. */
static double hw_read(const hw_counters *h, int k) {
    if (!h->ok) return 0;
    double s = 0;
    for (int t = 0; t < h->nt; t++) {
        uint64_t v = 0;
        if (read(h->fd[t][k], &v, sizeof v) == (ssize_t)sizeof v) s += (double)v;
    }
    return s;
}

/* perf's control descriptor (BENCH_PERF_CTL_FD), or -1: "enable"/"disable" around the measured steps. */
static int perf_ctl_fd = -1;
static void perf_ctl(const char *cmd) {
    if (perf_ctl_fd >= 0 && write(perf_ctl_fd, cmd, strlen(cmd)) < 0) perf_ctl_fd = -1;
}

static double user_cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec;
}

/* ------------------------------------------------------------------ one repetition */

typedef struct { double us_tok, cyc_tok, ins_tok; } step_cost;

/* b requests, prefill unmeasured, then the decode steps measured (see the header comment). */
static step_cost decode_cost(engine *e, const hw_counters *h, int V, int b, int plen, int max_tokens, uint64_t seed,
                             gen_request *r, gen_request **done, int *prompts) {
    bench_make_prompts(prompts, b, plen, V, seed);
    bench_add_decode_requests(e, r, prompts, b, plen, max_tokens, seed, "bench_decode_cpu");
    for (;;) { /* prefill: until every request holds its first token */
        int all = 1;
        for (int i = 0; i < b; i++) all &= r[i].n_out >= 1;
        if (all) break;
        if (engine_step(e, done, b) < 0) moerl_fatal("bench_decode_cpu: engine_step: %s", moerl_last_error());
    }
    const engine_stats s0 = engine_get_stats(e);
    perf_ctl("enable\n");
    const double u0 = user_cpu_s(), c0 = hw_read(h, 0), i0 = hw_read(h, 1);
    while (engine_num_unfinished(e) > 0)
        if (engine_step(e, done, b) < 0) moerl_fatal("bench_decode_cpu: engine_step: %s", moerl_last_error());
    const double u1 = user_cpu_s(), c1 = hw_read(h, 0), i1 = hw_read(h, 1);
    perf_ctl("disable\n");
    const engine_stats s1 = engine_get_stats(e);
    long decoded = 0;
    for (int i = 0; i < b; i++) {
        MOERL_ASSERT(r[i].n_out == max_tokens && r[i].finish == FINISH_LENGTH);
        decoded += r[i].n_out - 1;
        gen_request_free_outputs(&r[i]);
    }
    MOERL_ASSERT(s1.decode_tokens - s0.decode_tokens == decoded && s1.prefill_tokens == s0.prefill_tokens);
    return (step_cost){1e6 * (u1 - u0) / decoded, (c1 - c0) / decoded, (i1 - i0) / decoded};
}

static void print_stat(const char *what, double *v, int n) {
    bench_sort(v, n);
    printf("  %s %.4g (%.4g-%.4g)", what, v[n / 2], v[0], v[n - 1]);
}

static void usage(void) {
    fprintf(stderr, "usage: bench_decode_cpu [--batches 1,8,32] [--reps N (>= 3)] [--prompt-len 16] "
                    "[--max-tokens 32] [--fp32]\n");
    exit(2);
}

static int parse_batches(const char *v, int *batches) {
    int nb = 0;
    for (const char *s = v; *s;) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > 4096 || nb == MAX_BATCHES || (*end && *end != ',')) usage();
        batches[nb++] = (int)x;
        s = *end == ',' ? end + 1 : end;
    }
    return nb;
}

int main(int argc, char **argv) {
    int reps = 5, plen = 16, max_tokens = 32, bf16 = 1, batches[MAX_BATCHES] = {1, 8, 32}, nb = 3;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--fp32")) { bf16 = 0; continue; }
        if (a + 1 >= argc) usage();
        const char *k = argv[a], *v = argv[++a];
        if (!strcmp(k, "--reps")) reps = atoi(v);
        else if (!strcmp(k, "--prompt-len")) plen = atoi(v);
        else if (!strcmp(k, "--max-tokens")) max_tokens = atoi(v);
        else if (!strcmp(k, "--batches")) nb = parse_batches(v, batches);
        else usage();
    }
    if (reps < 3 || plen < 1 || max_tokens < 2) usage();
    const char *ctl = getenv("BENCH_PERF_CTL_FD");
    if (ctl && *ctl) perf_ctl_fd = atoi(ctl);
    int maxb = 0;
    for (int i = 0; i < nb; i++) maxb = MOERL_MAX(maxb, batches[i]);
    moe_config cfg = bench_model_config_B();
    moe_model m;
    if (model_init_inference(&m, &cfg) != MOERL_OK) moerl_fatal("bench_decode_cpu: model: %s", moerl_last_error());
    model_init_random(&m, 1235); /* bench_decode's model B */
    engine_config ec = {.max_num_seqs = maxb, .max_model_len = plen + max_tokens + 1,
                        .max_num_batched_tokens = maxb * plen, .bf16_weights = bf16};
    engine *e = engine_create(&m.cfg, ec);
    if (!e || engine_load_weights(e, m.params, m.n_params, 0) != MOERL_OK)
        moerl_fatal("bench_decode_cpu: engine: %s", moerl_last_error());
    hw_counters h;
    hw_open(&h);
    double load[3] = {-1, -1, -1};
    if (getloadavg(load, 3) < 1) load[0] = -1;
    printf("bench_decode_cpu: model B, %s weights, %d OpenMP threads, %d repetitions (median, min-max), "
           "hardware counters %s, load average %.2f\n",
           bf16 ? "bf16" : "fp32", h.nt, reps, h.ok ? "on" : "unavailable (user CPU time only)", load[0]);
    gen_request *r = xcalloc(maxb, sizeof *r), **done = xmalloc(maxb * sizeof *done);
    int *prompts = xmalloc((size_t)maxb * plen * sizeof(int));
    step_cost *c = xcalloc((size_t)nb * reps, sizeof *c);
    for (int rep = -1; rep < reps; rep++) /* rep -1: warm-up */
        for (int bi = 0; bi < nb; bi++) {
            step_cost s = decode_cost(e, &h, cfg.vocab_size, batches[bi], plen, max_tokens, 77 + rep, r, done, prompts);
            if (rep >= 0) c[(size_t)bi * reps + rep] = s;
        }
    double *v = xmalloc(reps * sizeof *v);
    for (int bi = 0; bi < nb; bi++) {
        printf("batch %2d:", batches[bi]);
        for (int k = 0; k < reps; k++) v[k] = c[(size_t)bi * reps + k].us_tok;
        print_stat("user CPU us/token", v, reps);
        if (h.ok) {
            for (int k = 0; k < reps; k++) v[k] = c[(size_t)bi * reps + k].cyc_tok / 1e6;
            print_stat("Mcycles:u/token", v, reps);
            for (int k = 0; k < reps; k++) v[k] = c[(size_t)bi * reps + k].ins_tok / 1e6;
            print_stat("Minstr:u/token", v, reps);
        }
        printf("\n");
    }
    if (getloadavg(load, 3) >= 1) printf("load average at the end %.2f\n", load[0]);
    free(v); free(c); free(prompts); free(done); free(r);
    engine_free(e);
    model_free(&m);
    return 0;
}
