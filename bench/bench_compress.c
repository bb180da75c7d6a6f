/* Cost of the gradient codecs (src/dist/compress.h) on one all-reduce bucket: compress_bucket
 * (encode with error feedback) and decompress_add (decode into an accumulator), medians over
 * repetitions, for onebit and threshold on two synthetic gradient shapes — Gaussian and Student-t
 * with 3 degrees of freedom (heavy-tailed, like real gradients: more elements above 2·median) —
 * plus the payload ratio (raw 4n bytes / payload). Each repetition starts from the same residual.
 * Then 1-bit Adam's codec (src/dist/onebit.h) on the same buffers, as `moerl plan` prices it
 * (plan.codec.onebit_adam.*: t_enc·(1 + 1/D) + 2·t_dec per element): the worker stage
 * (onebit_worker_compress: error feedback, scale, signs of all n values) as encode, onebit_decode of
 * the gathered messages as decode, and the server stage of one rank (onebit_server_reduce: D messages
 * of its n/D-value chunk averaged, error feedback, re-encoded), for D = 8 ranks (the practice's), one
 * segment. The exchange itself runs in one process: the messages of the other ranks are copies.
 * Usage: bench_compress [N_FLOATS (default 6553600 = a 25 MiB bucket)] [REPS (default 7)]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "bench_util.h"
#include "dist/compress.h"
#include "dist/onebit.h"

static double gauss(rng_state *r) {
    const double u = rng_uniform_double(r) + 1e-12, v = rng_uniform_double(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void fill(float *g, size_t n, int heavy, uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        double z = gauss(&r);
        if (heavy) { /* t(3) = z / sqrt(χ²₃ / 3) */
            double c = 0;
            for (int j = 0; j < 3; j++) {
                const double w = gauss(&r);
                c += w * w;
            }
            z /= sqrt(c / 3.0);
        }
        g[i] = (float)(z * 1e-4);
    }
}

/* 1-bit Adam's two-stage codec on g[n] (the header's method; te, td: reps scratch). */
static void bench_onebit_adam(size_t n, int reps, const float *g, double *te, double *td) {
    const int W = 8;
    onebit_exchange x;
    onebit_exchange_init(&x, n, W, 0);
    const size_t words = onebit_exchange_words(&x);
    int32_t *send = xmalloc((size_t)W * words * 4), *recv = xmalloc((size_t)W * words * 4);
    int32_t *out = xmalloc(words * 4), *gathered = xmalloc((size_t)W * words * 4);
    float *v = xmalloc(n * 4);
    double *ts = xmalloc((size_t)reps * sizeof(double));
    for (int r = 0; r < reps; r++) {
        memset(x.worker_err, 0, n * 4);
        memset(x.server_err, 0, x.chunk * 4);
        double t0 = moerl_now();
        onebit_worker_compress(&x, g, send);
        te[r] = moerl_now() - t0;
        for (int q = 0; q < W; q++) memcpy(recv + (size_t)q * words, send, words * 4); /* rank q's chunk-0 message */
        t0 = moerl_now();
        MOERL_ASSERT(onebit_server_reduce(&x, recv, out) == MOERL_OK);
        ts[r] = moerl_now() - t0;
        for (int q = 0; q < W; q++) memcpy(gathered + (size_t)q * words, send + (size_t)q * words, words * 4);
        t0 = moerl_now();
        MOERL_ASSERT(onebit_decode(&x, gathered, v) == MOERL_OK);
        td[r] = moerl_now() - t0;
    }
    const double me = bench_median(te, reps), ms = bench_median(ts, reps), md = bench_median(td, reps);
    printf("onebit_adam (D = %d, Student-t3 buffer): worker encode %.1f ms (%.2f ns/elem), server stage of one rank "
           "%.1f ms (%.2f ns per value of the whole buffer), decode %.1f ms (%.2f ns/elem), ratio %.2f "
           "(raw 4n bytes / 2·(D−1) messages)\n",
           W, me * 1e3, me * 1e9 / (double)n, ms * 1e3, ms * 1e9 / (double)n, md * 1e3, md * 1e9 / (double)n,
           4.0 * (double)n / onebit_exchange_bytes(&x));
    onebit_exchange_free(&x);
    free(send); free(recv); free(out); free(gathered); free(v); free(ts);
}

int main(int argc, char **argv) {
    const size_t n = argc > 1 ? (size_t)atoll(argv[1]) : 6553600;
    const int reps = argc > 2 ? atoi(argv[2]) : 7;
    float *g = xmalloc(n * 4), *e0 = xmalloc(n * 4), *e = xmalloc(n * 4), *acc = xmalloc(n * 4);
    const grad_compression modes[2] = {GRAD_COMPRESSION_ONEBIT, GRAD_COMPRESSION_THRESHOLD};
    void *buf = xmalloc(compress_max_bytes(GRAD_COMPRESSION_THRESHOLD, n, 256));
    double *te = xmalloc((size_t)reps * sizeof(double)), *td = xmalloc((size_t)reps * sizeof(double));
    printf("codec      gradients  n=%zu  encode ms (ns/elem)  decode ms (ns/elem)  ratio   (medians of %d)\n", n, reps);
    for (int heavy = 0; heavy < 2; heavy++) {
        fill(g, n, heavy, 1);
        fill(e0, n, heavy, 2);
        for (size_t i = 0; i < n; i++) e0[i] *= 0.5f; /* a residual from earlier steps */
        for (int m = 0; m < 2; m++) {
            size_t len = 0;
            for (int r = 0; r < reps; r++) {
                memcpy(e, e0, n * 4);
                memset(acc, 0, n * 4);
                double t0 = moerl_now();
                len = compress_bucket(modes[m], g, e, n, 256, buf);
                te[r] = moerl_now() - t0;
                t0 = moerl_now();
                MOERL_ASSERT(decompress_add(modes[m], buf, len, acc, n) == MOERL_OK);
                td[r] = moerl_now() - t0;
            }
            const double me = bench_median(te, reps), md = bench_median(td, reps);
            printf("%-10s %-10s %21.1f (%5.2f) %15.1f (%5.2f) %7.2f\n", grad_compression_name(modes[m]),
                   heavy ? "student-t3" : "gaussian", me * 1e3, me * 1e9 / (double)n, md * 1e3, md * 1e9 / (double)n,
                   4.0 * (double)n / (double)len);
        }
    }
    bench_onebit_adam(n, reps, g, te, td);
    free(g); free(e0); free(e); free(acc); free(buf); free(te); free(td);
    return 0;
}
