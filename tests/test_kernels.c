/* Tests of the dense kernels of src/kernels/kernels.h: linear, RMSNorm, RoPE, packed causal GQA
 * attention, SwiGLU, logprob/entropy.
 *
 *  1. Naive references: each forward (and the attention backward) against a plain double-precision
 *     loop written from the formula in kernels.h, on odd sizes and on attention batches whose
 *     sequences cross the kernel's 64-row blocks.
 *  2. Finite differences: every backward against central differences of its own forward, with
 *     the scalar objective J = Σ dout·out accumulated in double.
 *  3. Contract details: accumulate flags, NULL outputs, in-place aliasing, masked logprob rows,
 *     and attention results that are bit-for-bit independent of the OpenMP thread count.
 *  4. PyTorch parity: $MOERL_TESTDATA/kernels.safetensors (tests/ref/gen_kernels.py, float64 torch
 *     ops written from the HF definitions) — inputs, outputs and autograd gradients. A missing file
 *     is a failure.
 */
#include "base/common.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "model/safetensors.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static rng_state g_rng;

static float *vec_randn(long n, float std) {
    float *p = xmalloc((size_t)MOERL_MAX(n, 1) * sizeof(float));
    for (long i = 0; i < n; i++) p[i] = std * rng_normal(&g_rng);
    return p;
}

static float *vec_copy(const float *a, long n) {
    float *p = xmalloc((size_t)MOERL_MAX(n, 1) * sizeof(float));
    memcpy(p, a, (size_t)n * sizeof(float));
    return p;
}

static float *vec_zeros(long n) { return xcalloc((size_t)MOERL_MAX(n, 1), sizeof(float)); }

static double dot_d(const float *a, const float *b, long n) {
    double s = 0.0;
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* ------------------------------------------------------------------ finite differences */

/* Runs a forward on the current inputs and returns J = Σ dout·out in double. */
typedef double (*objective_fn)(void *ctx);

/* Compares the analytic gradient g[n] of J with respect to p[n] against central differences
 * (J(p_i + h) − J(p_i − h)) / (actual step), on every coordinate when sample ≤ 0 or ≥ n,
 * otherwise on `sample` coordinates drawn at random. p is restored afterwards. */
static void fd_check(const char *what, objective_fn J, void *ctx, float *p, const float *g, long n, long sample,
                     float h, float atol, float rtol) {
    const long m = (sample <= 0 || sample >= n) ? n : sample;
    float *fd = xmalloc((size_t)m * sizeof(float)), *an = xmalloc((size_t)m * sizeof(float));
    for (long s = 0; s < m; s++) {
        const long i = m == n ? s : (long)rng_below(&g_rng, (uint64_t)n);
        const float v = p[i], vp = v + h, vm = v - h;
        p[i] = vp;
        const double jp = J(ctx);
        p[i] = vm;
        const double jm = J(ctx);
        p[i] = v;
        fd[s] = (float)((jp - jm) / ((double)vp - (double)vm));
        an[s] = g[i];
    }
    t_close(what, an, fd, m, atol, rtol);
    free(fd);
    free(an);
}

/* ------------------------------------------------------------------ linear */

typedef struct {
    float *x, *W, *dout, *out;
    int N, I, O;
} lin_ctx;

static double lin_J(void *p) {
    lin_ctx *c = p;
    linear_forward(c->out, c->x, c->W, c->N, c->I, c->O, 0);
    return dot_d(c->dout, c->out, (long)c->N * c->O);
}

static void test_linear(void) {
    const int N = 5, I = 13, O = 7;
    lin_ctx c = {vec_randn(N * I, 1.0f), vec_randn(O * I, 0.5f), vec_randn(N * O, 1.0f), vec_zeros(N * O), N, I, O};
    /* forward vs a double loop */
    float *ref = vec_zeros(N * O);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = 0;
            for (int i = 0; i < I; i++) s += (double)c.x[n * I + i] * c.W[o * I + i];
            ref[n * O + o] = (float)s;
        }
    linear_forward(c.out, c.x, c.W, N, I, O, 0);
    /* fp32 dot products of 13 terms of size ~0.5: rounding ≲ 13·6e-8·Σ|terms| ≈ 1e-6 */
    t_close("linear fwd vs naive", c.out, ref, N * O, 1e-5f, 1e-5f);
    float *acc = vec_randn(N * O, 1.0f), *acc_want = vec_zeros(N * O);
    for (int i = 0; i < N * O; i++) acc_want[i] = acc[i] + ref[i];
    linear_forward(acc, c.x, c.W, N, I, O, 1);
    /* same products plus one fp32 addition */
    t_close("linear fwd accumulate", acc, acc_want, N * O, 1e-5f, 1e-5f);

    /* backward: dx overwritten, dW accumulated onto a nonzero start */
    float *dx = vec_randn(N * I, 1.0f), *dW0 = vec_randn(O * I, 1.0f), *dW = vec_copy(dW0, O * I);
    linear_backward(dx, dW, c.dout, c.x, c.W, N, I, O, 0);
    float *dW_inc = vec_zeros(O * I);
    for (int i = 0; i < O * I; i++) dW_inc[i] = dW[i] - dW0[i];
    /* J is bilinear, so central differences are exact up to rounding: J has 35 terms of size ~1
     * (error ~1e-6) divided by a step of 2·0.25 → ~4e-6; the dW increment carries the
     * subtraction dW − dW0 of numbers ~1 (6e-8). */
    fd_check("linear dx (finite diff)", lin_J, &c, c.x, dx, N * I, 0, 0.25f, 5e-5f, 1e-4f);
    fd_check("linear dW (finite diff)", lin_J, &c, c.W, dW_inc, O * I, 0, 0.25f, 5e-5f, 1e-4f);
    /* accumulate_dx and NULL outputs */
    float *dx2 = vec_randn(N * I, 1.0f), *dx2_want = vec_zeros(N * I);
    for (int i = 0; i < N * I; i++) dx2_want[i] = dx2[i] + dx[i];
    linear_backward(dx2, NULL, c.dout, c.x, c.W, N, I, O, 1);
    /* one extra fp32 addition of numbers ~1 */
    t_close("linear dx accumulate", dx2, dx2_want, N * I, 1e-5f, 1e-5f);
    float *dW2 = vec_copy(dW0, O * I);
    linear_backward(NULL, dW2, c.dout, c.x, c.W, N, I, O, 0);
    CHECK(memcmp(dW2, dW, (size_t)O * I * sizeof(float)) == 0, "dW with dx == NULL differs");
    free(c.x); free(c.W); free(c.dout); free(c.out); free(ref); free(acc); free(acc_want);
    free(dx); free(dW0); free(dW); free(dW_inc); free(dx2); free(dx2_want); free(dW2);
}

/* ------------------------------------------------------------------ RMSNorm */

typedef struct {
    float *x, *w, *dout, *out, *rstd;
    int N, C;
    float eps;
} rms_ctx;

static double rms_J(void *p) {
    rms_ctx *c = p;
    rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->N, c->C, c->eps);
    return dot_d(c->dout, c->out, (long)c->N * c->C);
}

static void test_rmsnorm(void) {
    const int N = 6, C = 19;
    const float eps = 1e-6f;
    rms_ctx c = {vec_randn(N * C, 1.3f), vec_randn(C, 0.4f), vec_randn(N * C, 1.0f), vec_zeros(N * C),
                 vec_zeros(N), N, C, eps};
    for (int i = 0; i < C; i++) c.w[i] += 1.0f;
    float *ref = vec_zeros(N * C), *rref = vec_zeros(N);
    for (int n = 0; n < N; n++) {
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)c.x[n * C + i] * c.x[n * C + i];
        const double r = 1.0 / sqrt(ss / C + eps);
        rref[n] = (float)r;
        for (int i = 0; i < C; i++) ref[n * C + i] = (float)(c.w[i] * c.x[n * C + i] * r);
    }
    rmsnorm_forward(c.out, c.rstd, c.x, c.w, N, C, eps);
    /* a handful of fp32 roundings per element (sqrt, reciprocal, two products) */
    t_close("rmsnorm fwd vs naive", c.out, ref, N * C, 1e-6f, 1e-6f);
    t_close("rmsnorm rstd vs naive", c.rstd, rref, N, 1e-6f, 1e-6f);
    float *inplace = vec_copy(c.x, N * C), *rstd2 = vec_zeros(N);
    rmsnorm_forward(inplace, rstd2, inplace, c.w, N, C, eps);
    CHECK(memcmp(inplace, c.out, (size_t)N * C * sizeof(float)) == 0, "rmsnorm with out == x differs");

    float *dx = vec_zeros(N * C), *dw0 = vec_randn(C, 1.0f), *dw = vec_copy(dw0, C), *dw_inc = vec_zeros(C);
    rmsnorm_forward(c.out, c.rstd, c.x, c.w, N, C, eps);
    rmsnorm_backward(dx, dw, c.dout, c.x, c.w, c.rstd, N, C, 0);
    for (int i = 0; i < C; i++) dw_inc[i] = dw[i] - dw0[i];
    /* step 1e-2 on inputs ~1: truncation h²·J'''/6 ~ 1e-5; rounding of J (114 terms ~1, fp32)
     * ~1e-6 / 2e-2 ~ 5e-5 */
    fd_check("rmsnorm dx (finite diff)", rms_J, &c, c.x, dx, N * C, 0, 1e-2f, 5e-4f, 5e-3f);
    fd_check("rmsnorm dw (finite diff)", rms_J, &c, c.w, dw_inc, C, 0, 1e-2f, 5e-4f, 5e-3f);
    rmsnorm_forward(c.out, c.rstd, c.x, c.w, N, C, eps);
    /* dx in place over dout, and accumulate_dx */
    float *alias = vec_copy(c.dout, N * C), *dw2 = vec_copy(dw0, C);
    rmsnorm_backward(alias, dw2, alias, c.x, c.w, c.rstd, N, C, 0);
    CHECK(memcmp(alias, dx, (size_t)N * C * sizeof(float)) == 0, "rmsnorm backward with dx == dout differs");
    CHECK(memcmp(dw2, dw, (size_t)C * sizeof(float)) == 0, "rmsnorm dw with dx == dout differs");
    float *dxa = vec_randn(N * C, 1.0f), *dxa_want = vec_zeros(N * C);
    for (int i = 0; i < N * C; i++) dxa_want[i] = dxa[i] + dx[i];
    rmsnorm_backward(dxa, NULL, c.dout, c.x, c.w, c.rstd, N, C, 1);
    /* the accumulated form adds in a different order: a few ulp of numbers ~1 */
    t_close("rmsnorm dx accumulate", dxa, dxa_want, N * C, 1e-5f, 1e-5f);
    free(c.x); free(c.w); free(c.dout); free(c.out); free(c.rstd); free(ref); free(rref); free(inplace);
    free(rstd2); free(dx); free(dw0); free(dw); free(dw_inc); free(alias); free(dw2); free(dxa); free(dxa_want);
}

/* ------------------------------------------------------------------ RoPE */

typedef struct {
    float *x, *tmp, *dout, *cos_t, *sin_t;
    int *pos;
    int N, nh, hd;
} rope_ctx;

static double rope_J(void *p) {
    rope_ctx *c = p;
    const long n = (long)c->N * c->nh * c->hd;
    memcpy(c->tmp, c->x, (size_t)n * sizeof(float));
    rope_forward(c->tmp, c->pos, c->cos_t, c->sin_t, c->N, c->nh, c->hd);
    return dot_d(c->dout, c->tmp, n);
}

static void test_rope(void) {
    const int N = 9, nh = 3, hd = 10, max_pos = 64, half = hd / 2;
    const float theta = 10000.0f;
    const long n = (long)N * nh * hd;
    int pos[9] = {0, 1, 2, 3, 0, 1, 63, 17, 5};
    rope_ctx c = {vec_randn(n, 1.0f), vec_zeros(n), vec_randn(n, 1.0f), vec_zeros(max_pos * half),
                  vec_zeros(max_pos * half), pos, N, nh, hd};
    rope_tables(c.cos_t, c.sin_t, max_pos, hd, theta);
    float *cref = vec_zeros(max_pos * half), *sref = vec_zeros(max_pos * half);
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < half; i++) {
            const double ang = p * pow((double)theta, -2.0 * i / hd);
            cref[p * half + i] = (float)cos(ang);
            sref[p * half + i] = (float)sin(ang);
        }
    /* the kernel rounds inv_freq and the angle to fp32 as HF does: |Δangle| ≤ 63·2·6e-8 ≈ 1e-5 */
    t_close("rope cos table", c.cos_t, cref, max_pos * half, 2e-5f, 0.0f);
    t_close("rope sin table", c.sin_t, sref, max_pos * half, 2e-5f, 0.0f);
    /* forward vs the HF formula x·cos + rotate_half(x)·sin in double, with the kernel's tables */
    float *ref = vec_zeros(n);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < hd; i++) {
                const float *xr = c.x + ((long)t * nh + h) * hd;
                const int f = i % half;
                const double co = c.cos_t[pos[t] * half + f], si = c.sin_t[pos[t] * half + f];
                const double rot = i < half ? -(double)xr[i + half] : (double)xr[i - half];
                ref[((long)t * nh + h) * hd + i] = (float)(xr[i] * co + rot * si);
            }
    rope_J(&c);
    /* two fp32 products and a sum per element */
    t_close("rope fwd vs naive", c.tmp, ref, n, 1e-6f, 1e-6f);
    /* backward = transposed rotation: undoes the forward */
    rope_backward(c.tmp, pos, c.cos_t, c.sin_t, N, nh, hd);
    /* cos² + sin² = 1 up to fp32 table rounding (~1e-7) */
    t_close("rope backward inverts forward", c.tmp, c.x, n, 1e-6f, 1e-6f);
    float *dx = vec_copy(c.dout, n);
    rope_backward(dx, pos, c.cos_t, c.sin_t, N, nh, hd);
    /* J is linear in x: central differences exact up to rounding (270 terms ~1 → ~1e-6 / 0.5) */
    fd_check("rope dx (finite diff)", rope_J, &c, c.x, dx, n, 0, 0.25f, 5e-5f, 1e-4f);
    free(c.x); free(c.tmp); free(c.dout); free(c.cos_t); free(c.sin_t); free(cref); free(sref); free(ref); free(dx);
}

/* ------------------------------------------------------------------ attention */

/* Double-precision reference: per sequence, head and query, the softmax over keys j ≤ i, and the
 * backward written directly from the chain rule (no lse recomputation trick). Any output pointer
 * may be NULL. */
static void attention_ref(float *out, float *lse, float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, const int *cu, int B, int N, int nh, int nkv, int hd,
                          float scale) {
    const int G = nh / nkv;
    double *gq = calloc((size_t)N * nh * hd, sizeof(double)), *gk = calloc((size_t)N * nkv * hd, sizeof(double));
    double *gv = calloc((size_t)N * nkv * hd, sizeof(double));
    int maxL = 0;
    for (int b = 0; b < B; b++) maxL = MOERL_MAX(maxL, cu[b + 1] - cu[b]);
    double *p = malloc((size_t)(maxL + 1) * sizeof(double)), *o = malloc((size_t)hd * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const int kvh = h / G;
            for (int i = cu[b]; i < cu[b + 1]; i++) {
                const float *qi = q + ((long)i * nh + h) * hd;
                double mx = -INFINITY, sum = 0;
                for (int j = cu[b]; j <= i; j++) {
                    const float *kj = k + ((long)j * nkv + kvh) * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += (double)qi[d] * kj[d];
                    p[j - cu[b]] = s * scale;
                    mx = fmax(mx, s * scale);
                }
                for (int j = cu[b]; j <= i; j++) sum += exp(p[j - cu[b]] - mx);
                for (int j = cu[b]; j <= i; j++) p[j - cu[b]] = exp(p[j - cu[b]] - mx) / sum;
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int j = cu[b]; j <= i; j++)
                    for (int d = 0; d < hd; d++) o[d] += p[j - cu[b]] * v[((long)j * nkv + kvh) * hd + d];
                if (out)
                    for (int d = 0; d < hd; d++) out[((long)i * nh + h) * hd + d] = (float)o[d];
                if (lse) lse[(long)h * N + i] = (float)(mx + log(sum));
                if (!dout) continue;
                const float *gi = dout + ((long)i * nh + h) * hd;
                double Di = 0;
                for (int d = 0; d < hd; d++) Di += gi[d] * o[d];
                for (int j = cu[b]; j <= i; j++) {
                    const float *kj = k + ((long)j * nkv + kvh) * hd, *vj = v + ((long)j * nkv + kvh) * hd;
                    const double pij = p[j - cu[b]];
                    double dp = 0;
                    for (int d = 0; d < hd; d++) dp += (double)gi[d] * vj[d];
                    const double ds = pij * (dp - Di) * scale;
                    for (int d = 0; d < hd; d++) {
                        gq[((long)i * nh + h) * hd + d] += ds * kj[d];
                        gk[((long)j * nkv + kvh) * hd + d] += ds * qi[d];
                        gv[((long)j * nkv + kvh) * hd + d] += pij * gi[d];
                    }
                }
            }
        }
    for (long i = 0; i < (long)N * nh * hd; i++)
        if (dq) dq[i] = (float)gq[i];
    for (long i = 0; i < (long)N * nkv * hd; i++) {
        if (dk) dk[i] = (float)gk[i];
        if (dv) dv[i] = (float)gv[i];
    }
    free(gq); free(gk); free(gv); free(p); free(o);
}

typedef struct {
    float *q, *k, *v, *dout, *out, *lse;
    const int *cu;
    int B, N, nh, nkv, hd;
    float scale;
} att_ctx;

static double att_J(void *p) {
    att_ctx *c = p;
    attention_forward(c->out, c->lse, c->q, c->k, c->v, c->cu, c->B, c->N, c->nh, c->nkv, c->hd, c->scale);
    return dot_d(c->dout, c->out, (long)c->N * c->nh * c->hd);
}

/* One attention case: kernel vs the double reference (forward, lse, backward), then finite
 * differences on fd_sample coordinates of each of q, k, v (all when fd_sample ≤ 0). */
static void attention_case(const char *name, const int *lens, int B, int nh, int nkv, int hd, long fd_sample) {
    int cu[16];
    cu[0] = 0;
    for (int b = 0; b < B; b++) cu[b + 1] = cu[b] + lens[b];
    const int N = cu[B];
    const long nq = (long)N * nh * hd, nk = (long)N * nkv * hd;
    att_ctx c = {vec_randn(nq, 1.0f), vec_randn(nk, 1.0f), vec_randn(nk, 1.0f), vec_randn(nq, 1.0f),
                 vec_zeros(nq), vec_zeros((long)nh * N), cu, B, N, nh, nkv, hd, 1.0f / sqrtf((float)hd)};
    float *o_ref = vec_zeros(nq), *l_ref = vec_zeros((long)nh * N);
    float *dq_ref = vec_zeros(nq), *dk_ref = vec_zeros(nk), *dv_ref = vec_zeros(nk);
    attention_ref(o_ref, l_ref, dq_ref, dk_ref, dv_ref, c.dout, c.q, c.k, c.v, cu, B, N, nh, nkv, hd, c.scale);
    float *dq = vec_randn(nq, 1.0f), *dk = vec_randn(nk, 1.0f), *dv = vec_randn(nk, 1.0f); /* overwritten */
    att_J(&c);
    attention_backward(dq, dk, dv, c.dout, c.q, c.k, c.v, c.out, c.lse, cu, B, N, nh, nkv, hd, c.scale);
    char what[160];
    /* fp32 against double. Scores are fp32 dot products of hd ≤ 32 terms ~1 (rounding ≲ 1e-6,
     * typically ~2e-7), which shift the outputs (~0.3) and lse (~1–6) by about as much; the
     * kernel's exp adds ≤ 2 ulp and the sums over ≤ 200 keys a few ulp. Gradients (~0.1–3) are
     * fp32 sums over up to 4·200 (query, key) pairs, so they get 10× more room. */
    snprintf(what, sizeof what, "attention %s out vs naive", name);
    t_close(what, c.out, o_ref, nq, 5e-6f, 2e-5f);
    snprintf(what, sizeof what, "attention %s lse vs naive", name);
    t_close(what, c.lse, l_ref, (long)nh * N, 2e-6f, 2e-6f);
    snprintf(what, sizeof what, "attention %s dq vs naive", name);
    t_close(what, dq, dq_ref, nq, 1e-5f, 1e-4f);
    snprintf(what, sizeof what, "attention %s dk vs naive", name);
    t_close(what, dk, dk_ref, nk, 1e-5f, 1e-4f);
    snprintf(what, sizeof what, "attention %s dv vs naive", name);
    t_close(what, dv, dv_ref, nk, 1e-5f, 1e-4f);
    /* Step 1e-2 on inputs ~1: truncation h²·J'''/6 ~ 1e-5·|J'''|; rounding of J (N·nh·hd fp32
     * outputs ~0.3 times dout ~1, random signs: ~sqrt(n)·3e-8 ≲ 1e-5) / 2e-2 ≲ 5e-4. */
    snprintf(what, sizeof what, "attention %s dq (finite diff)", name);
    fd_check(what, att_J, &c, c.q, dq, nq, fd_sample, 1e-2f, 2e-3f, 1e-2f);
    snprintf(what, sizeof what, "attention %s dk (finite diff)", name);
    fd_check(what, att_J, &c, c.k, dk, nk, fd_sample, 1e-2f, 2e-3f, 1e-2f);
    snprintf(what, sizeof what, "attention %s dv (finite diff)", name);
    fd_check(what, att_J, &c, c.v, dv, nk, fd_sample, 1e-2f, 2e-3f, 1e-2f);

#ifdef _OPENMP
    /* Results must not depend on the number of threads (fixed-order GQA reduction, tasks own
     * their outputs): 1 thread vs 2 threads, bit for bit. */
    const int nthr = omp_get_max_threads();
    float *o1 = vec_zeros(nq), *l1 = vec_zeros((long)nh * N), *dq1 = vec_zeros(nq), *dk1 = vec_zeros(nk),
          *dv1 = vec_zeros(nk);
    float *o2 = vec_zeros(nq), *l2 = vec_zeros((long)nh * N), *dq2 = vec_zeros(nq), *dk2 = vec_zeros(nk),
          *dv2 = vec_zeros(nk);
    omp_set_num_threads(1);
    attention_forward(o1, l1, c.q, c.k, c.v, cu, B, N, nh, nkv, hd, c.scale);
    attention_backward(dq1, dk1, dv1, c.dout, c.q, c.k, c.v, o1, l1, cu, B, N, nh, nkv, hd, c.scale);
    omp_set_num_threads(2);
    attention_forward(o2, l2, c.q, c.k, c.v, cu, B, N, nh, nkv, hd, c.scale);
    attention_backward(dq2, dk2, dv2, c.dout, c.q, c.k, c.v, o2, l2, cu, B, N, nh, nkv, hd, c.scale);
    omp_set_num_threads(nthr);
    CHECK(memcmp(o1, o2, nq * sizeof(float)) == 0 && memcmp(l1, l2, (size_t)nh * N * sizeof(float)) == 0,
          "attention %s forward differs between 1 and 2 threads", name);
    CHECK(memcmp(dq1, dq2, nq * sizeof(float)) == 0 && memcmp(dk1, dk2, nk * sizeof(float)) == 0 &&
              memcmp(dv1, dv2, nk * sizeof(float)) == 0,
          "attention %s backward differs between 1 and 2 threads", name);
    free(o1); free(l1); free(dq1); free(dk1); free(dv1); free(o2); free(l2); free(dq2); free(dk2); free(dv2);
#endif
    free(c.q); free(c.k); free(c.v); free(c.dout); free(c.out); free(c.lse);
    free(o_ref); free(l_ref); free(dq_ref); free(dk_ref); free(dv_ref); free(dq); free(dk); free(dv);
}

static void test_attention(void) {
    /* small: 4 sequences incl. length 1, GQA nh/nkv = 4, hd 12; every coordinate by finite diff */
    const int small[] = {5, 1, 9, 4};
    attention_case("small-gqa4", small, 4, 8, 2, 12, 0);
    /* multi-block: lengths crossing the 64-query/64-key blocks, hd 16, GQA 4 */
    const int blocks[] = {70, 3, 130};
    attention_case("blocks-gqa4", blocks, 3, 4, 1, 16, 40);
    /* no GQA (dk/dv written directly), an empty sequence, exact block-size lengths, hd 20 */
    const int mha[] = {65, 0, 64, 2};
    attention_case("mha", mha, 4, 3, 3, 20, 30);
    /* large enough for the threaded path; hd 32 takes the full-width tiles */
    const int par[] = {200, 150, 90};
    attention_case("threaded-gqa4", par, 3, 8, 2, 32, 20);
}

/* ------------------------------------------------------------------ SwiGLU */

typedef struct {
    float *gu, *dout, *out;
    int N, I;
} swiglu_ctx;

static double swiglu_J(void *p) {
    swiglu_ctx *c = p;
    swiglu_forward(c->out, c->gu, c->N, c->I);
    return dot_d(c->dout, c->out, (long)c->N * c->I);
}

static void test_swiglu(void) {
    const int N = 4, I = 11;
    swiglu_ctx c = {vec_randn(2L * N * I, 2.0f), vec_randn((long)N * I, 1.0f), vec_zeros((long)N * I), N, I};
    c.gu[0] = -30.0f; /* saturated gates: silu → 0 and → g, no NaN */
    c.gu[1] = 30.0f;
    c.gu[2] = -100.0f;
    c.gu[3] = 0.0f;
    float *ref = vec_zeros((long)N * I);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            const double g = c.gu[n * 2 * I + i], u = c.gu[n * 2 * I + I + i];
            ref[n * I + i] = (float)(g / (1.0 + exp(-g)) * u);
        }
    swiglu_J(&c);
    /* expf and three fp32 operations: a few ulp */
    t_close("swiglu fwd vs naive", c.out, ref, (long)N * I, 1e-6f, 1e-6f);
    float *dgu = vec_zeros(2L * N * I);
    swiglu_backward(dgu, c.dout, c.gu, N, I);
    int finite = 1;
    for (long i = 0; i < 2L * N * I; i++) finite &= isfinite(dgu[i]) != 0;
    CHECK(finite, "swiglu backward produced a non-finite gradient");
    /* step 1e-2 on gates ~2: truncation h²·silu'''/6 ≲ 2e-5; rounding of J (44 terms) / 2e-2 ~ 1e-5 */
    fd_check("swiglu dgate_up (finite diff)", swiglu_J, &c, c.gu, dgu, 2L * N * I, 0, 1e-2f, 2e-4f, 2e-3f);
    free(c.gu); free(c.dout); free(c.out); free(ref); free(dgu);
}

/* ------------------------------------------------------------------ logprob */

typedef struct {
    float *logits, *dlogp, *dent, *logp, *ent;
    int *target;
    int N, V;
    float T;
} lp_ctx;

static double lp_J(void *p) {
    lp_ctx *c = p;
    logprob_forward(c->logp, c->ent, NULL, c->logits, c->target, c->N, c->V, c->T);
    return dot_d(c->dlogp, c->logp, c->N) + dot_d(c->dent, c->ent, c->N);
}

static void logprob_case(float T) {
    const int N = 5, V = 50;
    int target[5] = {3, -1, 49, 0, 7};
    lp_ctx c = {vec_randn((long)N * V, 2.0f), vec_randn(N, 1.0f), vec_randn(N, 1.0f), vec_zeros(N), vec_zeros(N),
                target, N, V, T};
    c.logits[3 * V + 0] = 25.0f; /* a peaked row whose target is the argmax */
    float *lse = vec_zeros(N), *lref = vec_zeros(N), *eref = vec_zeros(N), *lseref = vec_zeros(N);
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0, sz = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, (double)c.logits[n * V + j] / T);
        for (int j = 0; j < V; j++) s += exp((double)c.logits[n * V + j] / T - mx);
        const double l = mx + log(s);
        for (int j = 0; j < V; j++) {
            const double z = (double)c.logits[n * V + j] / T;
            sz += exp(z - l) * z;
        }
        lseref[n] = (float)l;
        lref[n] = target[n] >= 0 ? (float)((double)c.logits[n * V + target[n]] / T - l) : 0.0f;
        eref[n] = target[n] >= 0 ? (float)(l - sz) : 0.0f;
    }
    logprob_forward(c.logp, c.ent, lse, c.logits, target, N, V, T);
    char what[96];
    /* fp32 z = l/T (half an ulp of ~35), sums in double, the kernel's exp within 2 ulp */
    snprintf(what, sizeof what, "logprob T=%g logp vs naive", (double)T);
    t_close(what, c.logp, lref, N, 1e-5f, 1e-5f);
    snprintf(what, sizeof what, "logprob T=%g entropy vs naive", (double)T);
    t_close(what, c.ent, eref, N, 1e-5f, 1e-5f);
    snprintf(what, sizeof what, "logprob T=%g lse vs naive", (double)T);
    t_close(what, lse, lseref, N, 1e-5f, 1e-5f);
    CHECK(c.logp[1] == 0.0f && c.ent[1] == 0.0f, "masked row: logp %g entropy %g, want 0 0", (double)c.logp[1],
          (double)c.ent[1]);

    /* Finite differences of J = Σ dlogp·logp + Σ dentropy·entropy. The forward reports entropy 0
     * on masked rows while the backward still applies the entropy term there (kernels.h), so the
     * masked row's dentropy is 0 here and that term is checked separately below. */
    c.dent[1] = 0.0f;
    float *dl = vec_zeros((long)N * V);
    logprob_backward(dl, c.dlogp, c.dent, c.logits, target, N, V, T);
    /* step 1e-2 on logits ~2 (z ~ 3): truncation h²/T³·|J'''| ~ 1e-4·0.3; J rounding (fp32 logp up
     * to ~20 → 1e-6) / 2e-2 ~ 5e-5 */
    snprintf(what, sizeof what, "logprob T=%g dlogits (finite diff)", (double)T);
    fd_check(what, lp_J, &c, c.logits, dl, (long)N * V, 0, 1e-2f, 3e-4f, 3e-3f);

    /* masked row with dentropy: the same gradient as an unmasked row with dlogp = 0 */
    int t2[5];
    memcpy(t2, target, sizeof t2);
    t2[1] = 0;
    float dlogp2[5], dent2[5] = {0, 0.75f, 0, 0, 0}, dlogp_m[5];
    memcpy(dlogp2, c.dlogp, sizeof dlogp2);
    memcpy(dlogp_m, c.dlogp, sizeof dlogp_m);
    dlogp2[1] = 0.0f;
    float *g_masked = vec_zeros((long)N * V), *g_valid = vec_zeros((long)N * V);
    logprob_backward(g_masked, dlogp_m, dent2, c.logits, target, N, V, T);
    logprob_backward(g_valid, dlogp2, dent2, c.logits, t2, N, V, T);
    CHECK(memcmp(g_masked + V, g_valid + V, (size_t)V * sizeof(float)) == 0,
          "masked row: entropy gradient differs from the unmasked one");
    double nz = 0;
    for (int j = 0; j < V; j++) nz += fabs(g_masked[V + j]);
    CHECK(nz > 1e-3, "masked row with dentropy got no entropy gradient (Σ|g| = %g)", nz);
    /* NULL dentropy: masked rows get exactly zero */
    logprob_backward(g_masked, c.dlogp, NULL, c.logits, target, N, V, T);
    double z1 = 0;
    for (int j = 0; j < V; j++) z1 += fabs(g_masked[V + j]);
    CHECK(z1 == 0.0, "masked row without dentropy: Σ|g| = %g, want 0", z1);
    free(c.logits); free(c.dlogp); free(c.dent); free(c.logp); free(c.ent); free(lse); free(lref); free(eref);
    free(lseref); free(dl); free(g_masked); free(g_valid);
}

static void test_logprob(void) {
    logprob_case(0.7f);
    logprob_case(1.3f);
}

/* ------------------------------------------------------------------ PyTorch parity */

/* Reads tensor `name` as fp32, checking its element count; NULL (and a failed check) otherwise. */
static float *ref_f32(const st_file *f, const char *name, long numel) {
    const st_tensor *t = st_find(f, name);
    CHECK(t != NULL, "%s: tensor %s missing (regenerate with tests/ref/gen_kernels.py)", f->path, name);
    if (!t) return NULL;
    CHECK(t->numel == numel, "%s: %s has %lld elements, want %ld", f->path, name, (long long)t->numel, numel);
    if (t->numel != numel) return NULL;
    float *p = xmalloc((size_t)MOERL_MAX(numel, 1) * sizeof(float));
    const int rc = st_to_f32(t, p);
    CHECK(rc == MOERL_OK, "%s: %s", name, moerl_last_error());
    if (rc != MOERL_OK) { free(p); return NULL; }
    return p;
}

/* Reads an I32 tensor; returns its element count through numel. */
static int *ref_i32(const st_file *f, const char *name, long *numel) {
    const st_tensor *t = st_find(f, name);
    CHECK(t != NULL && t->dtype == ST_I32, "%s: tensor %s missing or not I32", f->path, name);
    if (!t || t->dtype != ST_I32) return NULL;
    int *p = xmalloc((size_t)MOERL_MAX(t->numel, 1) * sizeof(int));
    memcpy(p, t->data, (size_t)t->numel * sizeof(int32_t));
    *numel = t->numel;
    return p;
}

#define REF(name, n) ref_f32(&f, name, (long)(n))

static void parity_linear(const st_file *pf) {
    const st_file f = *pf;
    const st_tensor *tx = st_find(&f, "linear.x"), *tw = st_find(&f, "linear.W");
    CHECK(tx && tw && tx->ndim == 2 && tw->ndim == 2, "linear.x / linear.W missing or not 2-D");
    if (!tx || !tw || tx->ndim != 2 || tw->ndim != 2) return;
    const int N = (int)tx->shape[0], I = (int)tx->shape[1], O = (int)tw->shape[0];
    float *x = REF("linear.x", N * I), *W = REF("linear.W", O * I), *out = REF("linear.out", N * O),
          *dout = REF("linear.dout", N * O), *dx = REF("linear.dx", N * I), *dW = REF("linear.dW", O * I);
    if (x && W && out && dout && dx && dW) {
        float *y = vec_zeros(N * O), *gx = vec_zeros(N * I), *gW = vec_zeros(O * I);
        linear_forward(y, x, W, N, I, O, 0);
        linear_backward(gx, gW, dout, x, W, N, I, O, 0);
        /* reference is exact (float64); fp32 sums of ≤ 40 products of size ≲ 1: ≲ 1e-6 */
        t_close("torch linear out", y, out, N * O, 1e-5f, 1e-5f);
        t_close("torch linear dx", gx, dx, N * I, 1e-5f, 1e-5f);
        t_close("torch linear dW", gW, dW, O * I, 1e-5f, 1e-5f);
        free(y); free(gx); free(gW);
    }
    free(x); free(W); free(out); free(dout); free(dx); free(dW);
}

static void parity_rmsnorm(const st_file *pf) {
    const st_file f = *pf;
    const st_tensor *tx = st_find(&f, "rmsnorm.x");
    CHECK(tx && tx->ndim == 2, "rmsnorm.x missing or not 2-D");
    if (!tx || tx->ndim != 2) return;
    const int N = (int)tx->shape[0], C = (int)tx->shape[1];
    float *x = REF("rmsnorm.x", N * C), *w = REF("rmsnorm.w", C), *eps = REF("rmsnorm.eps", 1),
          *out = REF("rmsnorm.out", N * C), *dout = REF("rmsnorm.dout", N * C), *dx = REF("rmsnorm.dx", N * C),
          *dw = REF("rmsnorm.dw", C);
    if (x && w && eps && out && dout && dx && dw) {
        float *y = vec_zeros(N * C), *r = vec_zeros(N), *gx = vec_zeros(N * C), *gw = vec_zeros(C);
        rmsnorm_forward(y, r, x, w, N, C, eps[0]);
        rmsnorm_backward(gx, gw, dout, x, w, r, N, C, 0);
        /* a few fp32 roundings per element; the row scaled by 1e-3 has rstd ~ 700, so its dx is
         * ~1e3 and only a relative tolerance is meaningful there */
        t_close("torch rmsnorm out", y, out, N * C, 1e-5f, 1e-5f);
        t_close("torch rmsnorm dx", gx, dx, N * C, 1e-5f, 1e-5f);
        t_close("torch rmsnorm dw", gw, dw, C, 1e-5f, 1e-5f);
        free(y); free(r); free(gx); free(gw);
    }
    free(x); free(w); free(eps); free(out); free(dout); free(dx); free(dw);
}

static void parity_rope(const st_file *pf) {
    const st_file f = *pf;
    const st_tensor *tx = st_find(&f, "rope.x");
    CHECK(tx && tx->ndim == 3, "rope.x missing or not 3-D");
    if (!tx || tx->ndim != 3) return;
    const int N = (int)tx->shape[0], nh = (int)tx->shape[1], hd = (int)tx->shape[2];
    const long n = (long)N * nh * hd;
    long npos = 0;
    int *pos = ref_i32(&f, "rope.pos", &npos);
    float *x = REF("rope.x", n), *theta = REF("rope.theta", 1), *out = REF("rope.out", n),
          *dout = REF("rope.dout", n), *dx = REF("rope.dx", n);
    if (pos && npos == N && x && theta && out && dout && dx) {
        int max_pos = 0;
        for (int i = 0; i < N; i++) max_pos = MOERL_MAX(max_pos, pos[i] + 1);
        float *ct = vec_zeros((long)max_pos * hd / 2), *stb = vec_zeros((long)max_pos * hd / 2);
        rope_tables(ct, stb, max_pos, hd, theta[0]);
        float *y = vec_copy(x, n), *g = vec_copy(dout, n);
        rope_forward(y, pos, ct, stb, N, nh, hd);
        rope_backward(g, pos, ct, stb, N, nh, hd);
        /* cos/sin of the same fp32 angle as HF, ≤ 1 ulp apart (torch's fp32 cos vs correctly
         * rounded); a different angle rounding would be off by ~pos·1e-7 ≈ 4e-4 at pos 4000 */
        t_close("torch rope out", y, out, n, 1e-5f, 1e-5f);
        t_close("torch rope dx", g, dx, n, 1e-5f, 1e-5f);
        free(ct); free(stb); free(y); free(g);
    }
    free(pos); free(x); free(theta); free(out); free(dout); free(dx);
}

static void parity_attention(const st_file *pf) {
    const st_file f = *pf;
    const st_tensor *tq = st_find(&f, "attention.q"), *tk = st_find(&f, "attention.k");
    CHECK(tq && tk && tq->ndim == 3 && tk->ndim == 3, "attention.q / attention.k missing or not 3-D");
    if (!tq || !tk || tq->ndim != 3 || tk->ndim != 3) return;
    const int N = (int)tq->shape[0], nh = (int)tq->shape[1], hd = (int)tq->shape[2], nkv = (int)tk->shape[1];
    const long nq = (long)N * nh * hd, nk = (long)N * nkv * hd;
    long ncu = 0;
    int *cu = ref_i32(&f, "attention.cu_seqlens", &ncu);
    float *q = REF("attention.q", nq), *k = REF("attention.k", nk), *v = REF("attention.v", nk),
          *out = REF("attention.out", nq), *lse = REF("attention.lse", (long)nh * N),
          *dout = REF("attention.dout", nq), *dq = REF("attention.dq", nq), *dk = REF("attention.dk", nk),
          *dv = REF("attention.dv", nk);
    CHECK(cu && ncu >= 4 && nh / nkv == 4, "parity data should hold >= 3 sequences and GQA nh/nkv = 4");
    if (cu && ncu >= 2 && q && k && v && out && lse && dout && dq && dk && dv) {
        const int B = (int)ncu - 1;
        const float scale = 1.0f / sqrtf((float)hd);
        float *o = vec_zeros(nq), *l = vec_zeros((long)nh * N), *gq = vec_zeros(nq), *gk = vec_zeros(nk),
              *gv = vec_zeros(nk);
        attention_forward(o, l, q, k, v, cu, B, N, nh, nkv, hd, scale);
        attention_backward(gq, gk, gv, dout, q, k, v, o, l, cu, B, N, nh, nkv, hd, scale);
        /* exact float64 reference; inputs ~1.5 so scores reach ~10 over hd 24: fp32 scores err
         * ≲ 1e-6, softmax sums over ≤ 130 keys (a few ulp), gradients ~1 are fp32 sums over
         * ≤ 4·130 (query, key) pairs, so they get 10× more room */
        t_close("torch attention out", o, out, nq, 5e-6f, 2e-5f);
        t_close("torch attention lse", l, lse, (long)nh * N, 2e-6f, 2e-6f);
        t_close("torch attention dq", gq, dq, nq, 1e-5f, 1e-4f);
        t_close("torch attention dk", gk, dk, nk, 1e-5f, 1e-4f);
        t_close("torch attention dv", gv, dv, nk, 1e-5f, 1e-4f);
        free(o); free(l); free(gq); free(gk); free(gv);
    }
    free(cu); free(q); free(k); free(v); free(out); free(lse); free(dout); free(dq); free(dk); free(dv);
}

static void parity_swiglu(const st_file *pf) {
    const st_file f = *pf;
    const st_tensor *t = st_find(&f, "swiglu.gate_up");
    CHECK(t && t->ndim == 2, "swiglu.gate_up missing or not 2-D");
    if (!t || t->ndim != 2) return;
    const int N = (int)t->shape[0], I = (int)t->shape[1] / 2;
    float *gu = REF("swiglu.gate_up", 2L * N * I), *out = REF("swiglu.out", (long)N * I),
          *dout = REF("swiglu.dout", (long)N * I), *dgu = REF("swiglu.dgate_up", 2L * N * I);
    if (gu && out && dout && dgu) {
        float *y = vec_zeros((long)N * I), *g = vec_zeros(2L * N * I);
        swiglu_forward(y, gu, N, I);
        swiglu_backward(g, dout, gu, N, I);
        /* expf plus three fp32 operations; outputs up to ~30 (saturated gate) */
        t_close("torch swiglu out", y, out, (long)N * I, 1e-5f, 1e-5f);
        t_close("torch swiglu dgate_up", g, dgu, 2L * N * I, 1e-5f, 1e-5f);
        free(y); free(g);
    }
    free(gu); free(out); free(dout); free(dgu);
}

static void parity_logprob(const st_file *pf) {
    const st_file f = *pf;
    const st_tensor *t = st_find(&f, "logprob.logits");
    CHECK(t && t->ndim == 2, "logprob.logits missing or not 2-D");
    if (!t || t->ndim != 2) return;
    const int N = (int)t->shape[0], V = (int)t->shape[1];
    long nt = 0;
    int *target = ref_i32(&f, "logprob.target", &nt);
    float *logits = REF("logprob.logits", (long)N * V), *temp = REF("logprob.temperature", 1),
          *logp = REF("logprob.logp", N), *ent = REF("logprob.entropy", N), *lse = REF("logprob.lse", N),
          *dlogp = REF("logprob.dlogp", N), *dent = REF("logprob.dentropy", N),
          *dlogits = REF("logprob.dlogits", (long)N * V);
    int masked = 0;
    for (long i = 0; target && i < nt; i++) masked += target[i] < 0;
    CHECK(masked > 0 && temp && temp[0] != 1.0f, "parity data should have masked rows and temperature != 1");
    if (target && nt == N && logits && temp && logp && ent && lse && dlogp && dent && dlogits) {
        float *lp = vec_zeros(N), *e = vec_zeros(N), *l = vec_zeros(N), *g = vec_zeros((long)N * V);
        logprob_forward(lp, e, l, logits, target, N, V, temp[0]);
        logprob_backward(g, dlogp, dent, logits, target, N, V, temp[0]);
        /* logits/T up to ~57 rounded to fp32 (half an ulp ~2e-6), sums in double */
        t_close("torch logprob logp", lp, logp, N, 1e-5f, 1e-5f);
        t_close("torch logprob entropy", e, ent, N, 1e-5f, 1e-5f);
        t_close("torch logprob lse", l, lse, N, 1e-5f, 1e-5f);
        /* gradients are p·(…)/T with p ≤ 1: absolute error ~1e-7 per logit */
        t_close("torch logprob dlogits", g, dlogits, (long)N * V, 1e-6f, 1e-4f);
        free(lp); free(e); free(l); free(g);
    }
    free(target); free(logits); free(temp); free(logp); free(ent); free(lse); free(dlogp); free(dent); free(dlogits);
}

static void test_torch_parity(void) {
    const char *dir = getenv("MOERL_TESTDATA");
    if (!dir || !*dir) dir = "build/testdata";
    char path[1024];
    snprintf(path, sizeof path, "%s/kernels.safetensors", dir);
    st_file f;
    const int rc = st_open(&f, path);
    CHECK(rc == MOERL_OK, "cannot open PyTorch reference (run /usr/bin/python3 tests/ref/gen_kernels.py %s): %s",
          dir, moerl_last_error());
    if (rc != MOERL_OK) return;
    parity_linear(&f);
    parity_rmsnorm(&f);
    parity_rope(&f);
    parity_attention(&f);
    parity_swiglu(&f);
    parity_logprob(&f);
    st_close(&f);
}

int main(void) {
    rng_seed(&g_rng, 20240611);
    test_linear();
    test_rmsnorm();
    test_rope();
    test_attention();
    test_swiglu();
    test_logprob();
    test_torch_parity();
    TEST_MAIN_END();
}
