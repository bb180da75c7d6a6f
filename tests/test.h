/* Minimal test harness: CHECK counts, each test binary ends with "N passed, N failed"
 * (TEST_MAIN_END) and exits non-zero on any failure. tests/run.sh reads that line: a binary that
 * exits 0 without printing it counts as failed, so every path out of main goes through
 * TEST_MAIN_END. */
#ifndef MOERL_TEST_H
#define MOERL_TEST_H
#include <math.h>
#include <stdio.h>
#include <string.h>

static int t_passed, t_failed;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (cond) {                                                            \
            t_passed++;                                                        \
        } else {                                                               \
            t_failed++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
        }                                                                      \
    } while (0)

/* max |a-b| / (atol + rtol·|b|) over n elements must be ≤ 1. Prints the worst element. */
static inline int t_close(const char *what, const float *a, const float *b, long n, float atol, float rtol) {
    double worst = 0; long wi = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double lim = atol + rtol * fabs((double)b[i]);
        double r = d / lim;
        if (!(r <= worst) ) { worst = r; wi = i; }
        if (isnan(a[i]) != isnan(b[i])) { worst = INFINITY; wi = i; break; }
    }
    int ok = worst <= 1.0;
    if (ok) t_passed++;
    else {
        t_failed++;
        fprintf(stderr, "FAIL %s: worst element %ld: got %.8g want %.8g (atol %g rtol %g)\n", what, wi,
                (double)a[wi], (double)b[wi], (double)atol, (double)rtol);
    }
    return ok;
}

#define TEST_MAIN_END()                                               \
    do {                                                              \
        printf("%d passed, %d failed\n", t_passed, t_failed);         \
        return t_failed ? 1 : 0;                                      \
    } while (0)
#endif
