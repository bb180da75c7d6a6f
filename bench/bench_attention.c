/* bench_attention — packed causal GQA attention, forward + backward, fp32 on the CPU.
 *
 * Measures moerl's blocked kernel (src/kernels/cpu/attention.c: FlashAttention-2-style forward with
 * an online softmax, backward recomputing p from lse, OpenMP over tasks, register-tiled block
 * products) against a peer measured in the same run on the same inputs: "eager" attention as HF's
 * eager_attention_forward computes it, one (sequence, head) at a time with the full L×L score
 * matrix and OpenBLAS cblas_sgemm for every product (threads: OpenBLAS's own); its backward
 * recomputes the scores with one more sgemm instead of storing L×L probabilities per head.
 *
 * Reports, per implementation, the median (and min–max) over --reps repetitions of the forward
 * and backward times, tokens/s of forward+backward, and GFLOP/s of the causal useful work
 * (forward 4·Σ_b L_b²/2·hd·nh flops, backward 2.5× that, the FlashAttention accounting), then the
 * ratio moerl/eager. The two results are compared (max |Δ|) so the peer is known to do the same
 * computation.
 *
 * Usage: bench_attention [--lens 256,512,1024] [--nh 8] [--nkv 2] [--hd 128] [--reps 5]
 * Threads: OMP_NUM_THREADS for moerl, OPENBLAS_NUM_THREADS for the peer's sgemm.
 */
#include "base/common.h"
#include "base/rng.h"
#include "kernels/kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#include "bench_util.h"
#endif

#define MAX_SEQS 64

/* ------------------------------------------------------------------ eager peer */

/* Eager forward: for each (sequence, head) the full score matrix S [L, L] by sgemm, masked
 * softmax with expf, then p·v by sgemm. */
static void eager_forward(float *out, float *lse, const float *q, const float *k, const float *v, const int *cu,
                          int B, int N, int nh, int nkv, int hd, float scale, float *S) {
    const int G = nh / nkv, ldq = nh * hd, ldkv = nkv * hd;
    for (int b = 0; b < B; b++) {
        const int s0 = cu[b], L = cu[b + 1] - cu[b];
        if (L == 0) continue;
        for (int h = 0; h < nh; h++) {
            const int kvh = h / G;
            const float *Q = q + (long)s0 * ldq + h * hd, *K = k + (long)s0 * ldkv + kvh * hd;
            const float *Vv = v + (long)s0 * ldkv + kvh * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, hd, scale, Q, ldq, K, ldkv, 0.0f, S, L);
            for (int i = 0; i < L; i++) {
                float *row = S + (long)i * L, mx = -INFINITY, sum = 0.0f;
                for (int j = 0; j <= i; j++) mx = fmaxf(mx, row[j]);
                for (int j = 0; j <= i; j++) { row[j] = expf(row[j] - mx); sum += row[j]; }
                const float inv = 1.0f / sum;
                for (int j = 0; j <= i; j++) row[j] *= inv;
                for (int j = i + 1; j < L; j++) row[j] = 0.0f;
                lse[(long)h * N + s0 + i] = mx + logf(sum);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, hd, L, 1.0f, S, L, Vv, ldkv, 0.0f,
                        out + (long)s0 * ldq + h * hd, ldq);
        }
    }
}

/* Eager backward: recompute S by sgemm, p = exp(S − lse), dp = dout·vᵀ, ds = p(dp − D)·scale, then
 * dv += pᵀ·dout, dk += dsᵀ·q (summed over the GQA group), dq = ds·k, all by sgemm. P, dP: [L, L]. */
static void eager_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const float *out, const float *lse, const int *cu, int B, int N, int nh,
                           int nkv, int hd, float scale, float *P, float *dP) {
    const int G = nh / nkv, ldq = nh * hd, ldkv = nkv * hd;
    memset(dk, 0, (size_t)N * ldkv * sizeof(float));
    memset(dv, 0, (size_t)N * ldkv * sizeof(float));
    for (int b = 0; b < B; b++) {
        const int s0 = cu[b], L = cu[b + 1] - cu[b];
        if (L == 0) continue;
        for (int h = 0; h < nh; h++) {
            const int kvh = h / G;
            const long qo = (long)s0 * ldq + h * hd, ko = (long)s0 * ldkv + kvh * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, hd, scale, q + qo, ldq, k + ko, ldkv, 0.0f,
                        P, L);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, hd, 1.0f, dout + qo, ldq, v + ko, ldkv, 0.0f,
                        dP, L);
            for (int i = 0; i < L; i++) {
                const float l = lse[(long)h * N + s0 + i];
                float D = 0.0f;
                for (int d = 0; d < hd; d++) D += dout[qo + (long)i * ldq + d] * out[qo + (long)i * ldq + d];
                float *pr = P + (long)i * L, *dr = dP + (long)i * L;
                for (int j = 0; j <= i; j++) {
                    pr[j] = expf(pr[j] - l);
                    dr[j] = pr[j] * (dr[j] - D) * scale;
                }
                for (int j = i + 1; j < L; j++) pr[j] = dr[j] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, hd, L, 1.0f, P, L, dout + qo, ldq, 1.0f, dv + ko,
                        ldkv);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, hd, L, 1.0f, dP, L, q + qo, ldq, 1.0f, dk + ko,
                        ldkv);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, hd, L, 1.0f, dP, L, k + ko, ldkv, 0.0f,
                        dq + qo, ldq);
        }
    }
}

/* ------------------------------------------------------------------ harness */



static float max_abs_diff(const float *a, const float *b, long n) {
    float m = 0.0f;
    for (long i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

typedef struct {
    double fwd_med, bwd_med, fwd_min, fwd_max, bwd_min, bwd_max;
} timing;

static void usage(void) {
    fprintf(stderr, "usage: bench_attention [--lens 256,512,1024] [--nh 8] [--nkv 2] [--hd 128] [--reps 5]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int lens[MAX_SEQS] = {256, 512, 1024}, B = 3, nh = 8, nkv = 2, hd = 128, reps = 5;
    for (int a = 1; a < argc; a++) {
        if (a + 1 >= argc) usage();
        if (!strcmp(argv[a], "--lens")) {
            B = 0;
            for (char *s = argv[++a]; *s && B < MAX_SEQS;) {
                char *end;
                const long L = strtol(s, &end, 10);
                if (end == s || L < 0 || L > 1000000) usage();
                lens[B++] = (int)L;
                s = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') usage();
            }
        } else if (!strcmp(argv[a], "--nh")) nh = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--nkv")) nkv = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--hd")) hd = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--reps")) reps = atoi(argv[++a]);
        else usage();
    }
    if (B < 1 || nh < 1 || nkv < 1 || nh % nkv || hd < 1 || reps < 1) usage();
    int cu[MAX_SEQS + 1] = {0};
    int maxL = 0;
    double causal = 0; /* Σ_b L_b²/2 */
    for (int b = 0; b < B; b++) {
        cu[b + 1] = cu[b] + lens[b];
        maxL = MOERL_MAX(maxL, lens[b]);
        causal += 0.5 * (double)lens[b] * lens[b];
    }
    const int N = cu[B];
    const long nq = (long)N * nh * hd, nk = (long)N * nkv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    rng_state rng;
    rng_seed(&rng, 7);
    float *q = xalloc_aligned(nq * sizeof(float)), *k = xalloc_aligned(nk * sizeof(float));
    float *v = xalloc_aligned(nk * sizeof(float)), *dout = xalloc_aligned(nq * sizeof(float));
    for (long i = 0; i < nq; i++) { q[i] = rng_normal(&rng); dout[i] = rng_normal(&rng); }
    for (long i = 0; i < nk; i++) { k[i] = rng_normal(&rng); v[i] = rng_normal(&rng); }
    float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int m = 0; m < 2; m++) {
        out[m] = xalloc_aligned(nq * sizeof(float));
        lse[m] = xalloc_aligned((size_t)nh * N * sizeof(float));
        dq[m] = xalloc_aligned(nq * sizeof(float));
        dk[m] = xalloc_aligned(nk * sizeof(float));
        dv[m] = xalloc_aligned(nk * sizeof(float));
    }
    float *S = xalloc_aligned((size_t)maxL * maxL * sizeof(float));
    float *S2 = xalloc_aligned((size_t)maxL * maxL * sizeof(float));

    int omp_threads = 1;
#ifdef _OPENMP
    omp_threads = omp_get_max_threads();
#endif
    printf("bench_attention: B=%d lens=", B);
    for (int b = 0; b < B; b++) printf("%s%d", b ? "," : "", lens[b]);
    printf(" N=%d nh=%d nkv=%d hd=%d reps=%d | moerl: %d OpenMP threads; eager: OpenBLAS sgemm, %d threads\n", N, nh,
           nkv, hd, reps, omp_threads, openblas_get_num_threads());

    const char *names[2] = {"moerl", "eager"};
    timing tm[2];
    double *tf = xmalloc(reps * sizeof(double)), *tb = xmalloc(reps * sizeof(double));
    for (int m = 0; m < 2; m++) {
        for (int r = -1; r < reps; r++) { /* r = −1: warm-up, not timed */
            const double t0 = moerl_now();
            if (m == 0) attention_forward(out[m], lse[m], q, k, v, cu, B, N, nh, nkv, hd, scale);
            else eager_forward(out[m], lse[m], q, k, v, cu, B, N, nh, nkv, hd, scale, S);
            const double t1 = moerl_now();
            if (m == 0)
                attention_backward(dq[m], dk[m], dv[m], dout, q, k, v, out[m], lse[m], cu, B, N, nh, nkv, hd, scale);
            else
                eager_backward(dq[m], dk[m], dv[m], dout, q, k, v, out[m], lse[m], cu, B, N, nh, nkv, hd, scale, S,
                               S2);
            const double t2 = moerl_now();
            if (r >= 0) { tf[r] = t1 - t0; tb[r] = t2 - t1; }
        }
        tm[m].fwd_med = bench_median_sorted(tf, reps);
        tm[m].fwd_min = tf[0];
        tm[m].fwd_max = tf[reps - 1];
        tm[m].bwd_med = bench_median_sorted(tb, reps);
        tm[m].bwd_min = tb[0];
        tm[m].bwd_max = tb[reps - 1];
    }
    const double fwd_flop = 4.0 * causal * hd * nh, bwd_flop = 2.5 * fwd_flop;
    for (int m = 0; m < 2; m++) {
        const double tot = tm[m].fwd_med + tm[m].bwd_med;
        printf("%-6s fwd %8.2f ms [%.2f–%.2f]  bwd %8.2f ms [%.2f–%.2f]  fwd+bwd %9.0f tok/s  "
               "fwd %6.1f GFLOP/s  bwd %6.1f GFLOP/s\n",
               names[m], 1e3 * tm[m].fwd_med, 1e3 * tm[m].fwd_min, 1e3 * tm[m].fwd_max, 1e3 * tm[m].bwd_med,
               1e3 * tm[m].bwd_min, 1e3 * tm[m].bwd_max, N / tot, fwd_flop / tm[m].fwd_med / 1e9,
               bwd_flop / tm[m].bwd_med / 1e9);
    }
    printf("ratio moerl/eager (fwd+bwd tokens/s, medians): %.2fx   fwd %.2fx   bwd %.2fx\n",
           (tm[1].fwd_med + tm[1].bwd_med) / (tm[0].fwd_med + tm[0].bwd_med), tm[1].fwd_med / tm[0].fwd_med,
           tm[1].bwd_med / tm[0].bwd_med);
    printf("agreement max|Δ|: out %.2e  lse %.2e  dq %.2e  dk %.2e  dv %.2e\n", (double)max_abs_diff(out[0], out[1], nq),
           (double)max_abs_diff(lse[0], lse[1], (long)nh * N), (double)max_abs_diff(dq[0], dq[1], nq),
           (double)max_abs_diff(dk[0], dk[1], nk), (double)max_abs_diff(dv[0], dv[1], nk));
    free(q); free(k); free(v); free(dout); free(S); free(S2); free(tf); free(tb);
    for (int m = 0; m < 2; m++) { free(out[m]); free(lse[m]); free(dq[m]); free(dk[m]); free(dv[m]); }
    return 0;
}
