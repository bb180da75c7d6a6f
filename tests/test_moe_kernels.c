/* Tests of the MoE kernels (src/kernels/cpu/moe_router.c, moe_permute.c, grouped_gemm.c,
 * moe_naive.c):
 *  1. router: exact top-k ids on crafted ties (descending, ties to the lower id), softmax and
 *     renormalisation values, row_idx, NaN rows; finite differences of router_topk_backward
 *     with and without renormalisation and the aux-gradient input.
 *  2. aux loss: perfect balance gives K, two-layer accumulation equals the direct formula,
 *     finite differences of moe_aux_backward → router_topk_backward.
 *  3. permute: tokens_per_expert sums to N·K, groups hold only their expert, stability,
 *     expanded_pos is the inverse map, gather exact, permute_backward is the adjoint and
 *     accumulates; unpermute forward against its formula and finite differences of its backward.
 *  4. grouped GEMM: forward/backward against a float64 per-expert reference (an idle expert,
 *     a group large enough to be split into column blocks, the serial path), dW accumulates,
 *     NULL outputs, OpenBLAS's thread count restored; finite differences of the backward.
 *  4b. gemm_tiled (moerl's GEMM kernel) against a float64 evaluation of its contract: row counts
 *     1, 5, 6, 7, 50, 300 and column counts 1..37, 130 around the 6×16 tile and the 8-lane SwiGLU
 *     halves, k = 0, 1, 13 and above one 320-deep block (321, 700), operands untransposed and
 *     transposed, gathered through an index with routing weights, accumulate or overwrite, the
 *     SwiGLU and SwiGLU-backward epilogues.
 *  4c. the production schedule's kernels (src/model/forward.c, fused: gather inside the gate_up
 *     GEMM with no permuted copy, SwiGLU epilogue, unpermute backward inside the down backward,
 *     x gathered for dW) on teams of 1-4 threads against the naive HF loop, on odd shapes (H 20,
 *     I 13, top-3; an idle expert and a one-row expert; decode-sized groups; ~700 rows per
 *     expert; H 333).
 *  5. the fused layer (router → permute → grouped GEMM gate_up → SwiGLU → grouped GEMM down →
 *     unpermute) equals the naive HF-style path forward and backward with an idle expert, and
 *     finite differences of the whole layer (x, router weight, both stacked expert weights,
 *     with the aux loss).
 *  6. PyTorch parity with $MOERL_TESTDATA/moe_kernels.safetensors (tests/ref/gen_moe_kernels.py):
 *     router logits/probs/top-k ids (exact)/weights, aux, layer output and the gradients wrt x,
 *     the router weight and the stacked expert weights, for norm_topk_prob true and false and an
 *     odd-shaped case (N 29, H 20, E 7, top-3, I 13, a one-token expert), through the stage-by-stage
 *     kernels and through the production schedule's fused kernels.
 */
#include "test.h"

#include "base/common.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "model/safetensors.h"

#include <cblas.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#undef I /* <complex.h> via cblas.h */

/* ---------------------------------------------------------------- helpers */

static float *fnew(long n) { return xcalloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static int *inew(long n) { return xcalloc((size_t)(n > 0 ? n : 1), sizeof(int)); }

static void fill_normal(rng_state *r, float *a, long n, float std) {
    for (long i = 0; i < n; i++) a[i] = std * rng_normal(r);
}

static double dot_d(const float *a, const float *b, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Smallest gap between consecutive values among the K+1 largest of each row: the margin by which
 * neither the top-k set nor its order can change. */
static float min_topk_gap(const float *v, int N, int E, int K) {
    float gmin = INFINITY;
    float *s = fnew(E);
    for (int t = 0; t < N; t++) {
        memcpy(s, v + (size_t)t * E, (size_t)E * sizeof(float));
        for (int a = 0; a < E; a++) /* selection sort, descending (tiny E) */
            for (int b = a + 1; b < E; b++)
                if (s[b] > s[a]) { float x = s[a]; s[a] = s[b]; s[b] = x; }
        for (int j = 0; j < K && j + 1 < E; j++) gmin = fminf(gmin, s[j] - s[j + 1]);
    }
    free(s);
    return gmin;
}

/* ---------------------------------------------------------------- 1. router */

static void test_router_ties(void) {
    /* Crafted rows (E = 6, K = 3). Equal logits give bit-identical probabilities, so the order
     * among them is decided by the tie rule alone. */
    enum { N = 5, E = 6, K = 3 };
    const float logits[N * E] = {
        1, 3, 3, 0, 3, 2,   /* three-way tie at the top: 1, 2, 4 */
        0, 0, 0, 0, 0, 0,   /* all tied: 0, 1, 2 */
        5, 1, 5, 1, 1, 1,   /* tie at the top, then a 4-way tie for the last slot: 0, 2, 1 */
        2, 1, 1, 1, 0, 0,   /* tie across the K boundary: 0, 1, 2 */
        -1, -2, 7, 7, -3, 7 /* ties in the upper ids: 2, 3, 5 */
    };
    const int want[N * K] = {1, 2, 4, 0, 1, 2, 0, 2, 1, 0, 1, 2, 2, 3, 5};
    float probs[N * E], w[N * K];
    int ids[N * K], row_idx[N * K];
    for (int norm = 0; norm <= 1; norm++) {
        router_topk_forward(probs, ids, w, row_idx, logits, N, E, K, norm);
        int ok = 1;
        for (int i = 0; i < N * K; i++) ok &= ids[i] == want[i];
        CHECK(ok, "norm=%d: top-k ids on crafted ties differ from the lower-id rule", norm);
        for (int t = 0; t < N; t++) {
            double s = 0, ws = 0;
            for (int e = 0; e < E; e++) s += probs[t * E + e];
            for (int j = 0; j < K; j++) ws += w[t * K + j];
            /* fp32 softmax: E terms each rounded once, ~1e-7 relative each */
            CHECK(fabs(s - 1.0) < 1e-6, "row %d: probabilities sum to %.9g", t, s);
            if (norm) CHECK(fabs(ws - 1.0) < 1e-6, "row %d: renormalised weights sum to %.9g", t, ws);
            for (int j = 0; j < K; j++) {
                /* weights are the probabilities (or p / Σ p: one fp32 division, ≤ 1 ulp ≈ 1.2e-7 rel) */
                double want_w = probs[t * E + ids[t * K + j]];
                if (norm) {
                    double S = 0;
                    for (int jj = 0; jj < K; jj++) S += probs[t * E + ids[t * K + jj]];
                    want_w /= S;
                }
                CHECK(fabs(w[t * K + j] - want_w) <= 3e-7 * want_w, "row %d slot %d: weight %.9g want %.9g", t, j,
                      (double)w[t * K + j], want_w);
                CHECK(row_idx[t * K + j] == j * N + t, "row_idx[%d,%d] = %d, want %d", t, j, row_idx[t * K + j],
                      j * N + t);
                if (j > 0) CHECK(w[t * K + j] <= w[t * K + j - 1], "row %d: weights not descending", t);
            }
        }
    }
    /* softmax value of row 0, expert 1: e^3 / (e + 3e^3 + 1 + e^2); fp32 exp/divide ~ 1e-7 rel */
    const double e1 = exp(1.0), e2 = exp(2.0), e3 = exp(3.0);
    double p01 = e3 / (e1 + 3 * e3 + 1 + e2);
    router_topk_forward(probs, ids, w, row_idx, logits, N, E, K, 0);
    CHECK(fabs(probs[1] - p01) < 1e-6 * p01, "softmax value %.9g want %.9g", (double)probs[1], p01);

    /* A NaN logit row: probabilities are NaN, but the ids stay valid and distinct (no crash). */
    float nanrow[E] = {0, NAN, 1, 2, 3, 4};
    float pn[E], wn[K];
    int idn[K];
    router_topk_forward(pn, idn, wn, NULL, nanrow, 1, E, K, 1);
    int valid = 1;
    for (int j = 0; j < K; j++) {
        valid &= idn[j] >= 0 && idn[j] < E;
        for (int jj = 0; jj < j; jj++) valid &= idn[j] != idn[jj];
    }
    CHECK(valid, "NaN row: ids %d %d %d not valid and distinct", idn[0], idn[1], idn[2]);
}

/* Loss used by the router finite differences: Σ c·w + Σ d·p (double). */
static double router_loss(const float *logits, const float *c, const float *d, int N, int E, int K, int norm,
                          int *ids_out) {
    float *p = fnew((long)N * E), *w = fnew((long)N * K);
    router_topk_forward(p, ids_out, w, NULL, logits, N, E, K, norm);
    double L = dot_d(c, w, (long)N * K) + (d ? dot_d(d, p, (long)N * E) : 0.0);
    free(p); free(w);
    return L;
}

static void test_router_fd(int norm, int with_extra) {
    enum { N = 6, E = 7, K = 3 };
    rng_state r;
    rng_seed(&r, 100 + norm * 2 + with_extra);
    float logits[N * E], c[N * K], d[N * E], probs[N * E], w[N * K], dl[N * E];
    int ids[N * K], ids2[N * K];
    /* Redraw until consecutive logits among each row's K+1 largest differ by ≥ 0.05: a 1e-2 step
     * then changes neither the top-k set nor its order, so the loss is smooth where differenced. */
    do fill_normal(&r, logits, N * E, 1.5f);
    while (min_topk_gap(logits, N, E, K) < 0.05f);
    fill_normal(&r, c, N * K, 1.0f);
    fill_normal(&r, d, N * E, 1.0f);
    router_topk_forward(probs, ids, w, NULL, logits, N, E, K, norm);
    router_topk_backward(dl, c, with_extra ? d : NULL, probs, ids, N, E, K, norm);
    float num[N * E];
    const float eps = 1e-2f;
    int stable = 1;
    for (int i = 0; i < N * E; i++) {
        float keep = logits[i];
        logits[i] = keep + eps;
        double lp = router_loss(logits, c, with_extra ? d : NULL, N, E, K, norm, ids2);
        stable &= !memcmp(ids, ids2, sizeof ids);
        logits[i] = keep - eps;
        double lm = router_loss(logits, c, with_extra ? d : NULL, N, E, K, norm, ids2);
        stable &= !memcmp(ids, ids2, sizeof ids);
        logits[i] = keep;
        num[i] = (float)((lp - lm) / (2 * eps));
    }
    CHECK(stable, "top-k changed under a finite-difference step (margin too small)");
    char what[96];
    snprintf(what, sizeof what, "router backward vs finite differences (norm=%d, aux input=%d)", norm, with_extra);
    /* central difference, step 1e-2: truncation ≈ eps²/6·|f'''| ≲ 3e-5 for softmax outputs with
     * unit coefficients; fp32 rounding of the loss (~1e-6) / (2 eps) ≈ 5e-5 */
    t_close(what, dl, num, N * E, 3e-4f, 1e-3f);

    /* dtopk_w NULL: only the aux input flows (equals a call with zero dtopk_w) */
    if (with_extra) {
        float zero[N * K] = {0}, a1[N * E], a2[N * E];
        router_topk_backward(a1, NULL, d, probs, ids, N, E, K, norm);
        router_topk_backward(a2, zero, d, probs, ids, N, E, K, norm);
        CHECK(!memcmp(a1, a2, sizeof a1), "dtopk_w == NULL differs from zero dtopk_w");
    }
}

/* ---------------------------------------------------------------- 2. aux loss */

static void test_aux_balanced(void) {
    /* N = E tokens, token t picks experts t, t+1 (mod E): every expert is chosen K times; with
     * uniform probabilities f_e = K/N, P̄_e = 1/E, aux = E · E · (K/N)(1/E) = K. */
    enum { E = 8, N = 8, K = 2 };
    float probs[N * E], counts[E] = {0}, psum[E] = {0};
    int ids[N * K];
    for (int i = 0; i < N * E; i++) probs[i] = 1.0f / E;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) ids[t * K + j] = (t + j) % E;
    moe_aux_accumulate(counts, psum, probs, ids, N, E, K);
    float aux = moe_aux_loss(counts, psum, E, N);
    /* 1/E is exact in fp32; sums of 8 exact terms: exact up to the final double→float cast */
    CHECK(fabsf(aux - K) < 1e-6f, "perfect balance: aux %.9g, want K = %d", (double)aux, K);
}

static void test_aux_fd(void) {
    enum { L = 2, N = 6, E = 7, K = 3 };
    rng_state r;
    rng_seed(&r, 77);
    float logits[L][N * E], probs[L][N * E], w[L][N * K];
    int ids[L][N * K];
    for (int l = 0; l < L; l++) {
        do fill_normal(&r, logits[l], N * E, 1.5f);
        while (min_topk_gap(logits[l], N, E, K) < 0.15f); /* top-k fixed under the 5e-2 steps */
        router_topk_forward(probs[l], ids[l], w[l], NULL, logits[l], N, E, K, 1);
    }
    float counts[E] = {0}, psum[E] = {0};
    for (int l = 0; l < L; l++) moe_aux_accumulate(counts, psum, probs[l], ids[l], N, E, K);
    /* direct formula in double */
    double cnt[E] = {0}, ps[E] = {0};
    for (int l = 0; l < L; l++)
        for (int t = 0; t < N; t++) {
            for (int j = 0; j < K; j++) cnt[ids[l][t * K + j]] += 1;
            for (int e = 0; e < E; e++) ps[e] += probs[l][t * E + e];
        }
    double want = 0, csum = 0;
    for (int e = 0; e < E; e++) {
        want += (cnt[e] / (L * N)) * (ps[e] / (L * N));
        csum += counts[e];
    }
    want *= E;
    CHECK(csum == L * N * K, "counts sum to %g, want L·N·K = %d", csum, L * N * K);
    float aux = moe_aux_loss(counts, psum, E, (int64_t)L * N);
    /* psum is stored in fp32: ~1e-7 relative */
    CHECK(fabs(aux - want) < 1e-6 * want, "aux %.9g, direct formula %.9g", (double)aux, want);

    /* gradient of coef·aux wrt both layers' logits */
    const float coef = 1.0f;
    float dprobs[N * E], dl[L][N * E], num[L][N * E];
    for (int l = 0; l < L; l++) {
        moe_aux_backward(dprobs, counts, N, E, (int64_t)L * N, coef);
        router_topk_backward(dl[l], NULL, dprobs, probs[l], ids[l], N, E, K, 1);
    }
    /* a larger step than elsewhere: aux is returned in fp32, so its rounding (~2e-7) must stay
     * small next to the step times gradients of ~1e-2 */
    const float eps = 5e-2f;
    int stable = 1;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < N * E; i++) {
            double lv[2];
            for (int s = 0; s < 2; s++) {
                float keep = logits[l][i];
                logits[l][i] = keep + (s ? -eps : eps);
                float c2[E] = {0}, p2[E] = {0}, pp[N * E], ww[N * K];
                int ii[N * K];
                for (int m = 0; m < L; m++) {
                    router_topk_forward(pp, ii, ww, NULL, logits[m], N, E, K, 1);
                    stable &= !memcmp(ii, ids[m], sizeof ii);
                    moe_aux_accumulate(c2, p2, pp, ii, N, E, K);
                }
                lv[s] = coef * moe_aux_loss(c2, p2, E, (int64_t)L * N);
                logits[l][i] = keep;
            }
            num[l][i] = (float)((lv[0] - lv[1]) / (2 * eps));
        }
    CHECK(stable, "aux FD: top-k changed under a step");
    /* gradients are ~1e-2; aux is rounded to fp32 (~2e-7 absolute) → FD noise ≈ 2e-7/0.1 = 2e-6;
     * truncation ≈ eps²/6 · |f'''| ≈ 4e-4 · 1e-2 = 4e-6 → atol 2e-5, rtol 2e-3 */
    t_close("aux backward vs finite differences (layer 0)", dl[0], num[0], N * E, 2e-5f, 2e-3f);
    t_close("aux backward vs finite differences (layer 1)", dl[1], num[1], N * E, 2e-5f, 2e-3f);
}

/* ---------------------------------------------------------------- 3. permute / unpermute */

/* Random distinct top-k ids per token, never choosing expert `idle`. */
static void random_ids(rng_state *r, int *ids, int N, int E, int K, int idle) {
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = (int)rng_below(r, (uint64_t)E);
                dup = e == idle;
                for (int jj = 0; jj < j; jj++) dup |= ids[t * K + jj] == e;
            } while (dup);
            ids[t * K + j] = e;
        }
}

static void test_permute(void) {
    enum { N = 37, E = 7, K = 3, H = 5, M = N * K, IDLE = 5 };
    rng_state r;
    rng_seed(&r, 5);
    int ids[M], row_idx[M], sorted_row[M], pos[M], tpe[E], off[E + 1];
    random_ids(&r, ids, N, E, K, IDLE);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) row_idx[t * K + j] = j * N + t;
    moe_permute_index(sorted_row, pos, tpe, off, ids, row_idx, N, E, K);

    int cnt[E] = {0}, sum = 0;
    for (int i = 0; i < M; i++) cnt[ids[i]]++;
    int counts_ok = 1;
    for (int e = 0; e < E; e++) {
        sum += tpe[e];
        counts_ok &= tpe[e] == cnt[e] && off[e + 1] - off[e] == tpe[e];
    }
    CHECK(sum == M && off[0] == 0 && off[E] == M, "tokens_per_expert sums to %d (want %d), offsets [%d, %d]", sum,
          M, off[0], off[E]);
    CHECK(counts_ok, "tokens_per_expert / expert_offsets disagree with a direct count");
    CHECK(tpe[IDLE] == 0, "idle expert %d has %d rows", IDLE, tpe[IDLE]);
    int group_ok = 1, stable = 1, inverse = 1, perm = 1;
    int seen[M] = {0};
    for (int e = 0; e < E; e++)
        for (int i = off[e]; i < off[e + 1]; i++) {
            const int rr = sorted_row[i], t = rr % N, j = rr / N;
            group_ok &= ids[t * K + j] == e;
            if (i > off[e]) stable &= sorted_row[i - 1] < rr;
            perm &= rr >= 0 && rr < M && !seen[rr];
            if (rr >= 0 && rr < M) seen[rr] = 1;
        }
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) inverse &= sorted_row[pos[t * K + j]] == j * N + t;
    CHECK(group_ok, "a permuted row sits in a group that is not its expert's");
    CHECK(stable, "rows within an expert group are not in ascending expanded-row order (unstable)");
    CHECK(perm, "sorted_row is not a permutation of [0, N·K)");
    CHECK(inverse, "expanded_pos is not the inverse of sorted_row");

    /* gather */
    float x[N * H], xp[M * H];
    fill_normal(&r, x, N * H, 1.0f);
    moe_permute_forward(xp, x, sorted_row, N, M, H);
    int gather_ok = 1;
    for (int i = 0; i < M; i++) gather_ok &= !memcmp(xp + i * H, x + (sorted_row[i] % N) * H, H * sizeof(float));
    CHECK(gather_ok, "permuted rows are not exact copies of their tokens");

    /* backward: accumulates, and is the adjoint of the gather: <P x, g> = <x, Pᵀ g> */
    float g[M * H], dx[N * H], init[N * H];
    fill_normal(&r, g, M * H, 1.0f);
    fill_normal(&r, init, N * H, 1.0f);
    memcpy(dx, init, sizeof dx);
    moe_permute_backward(dx, g, sorted_row, N, M, H);
    float want[N * H];
    memcpy(want, init, sizeof want);
    for (int i = 0; i < M; i++)
        for (int h = 0; h < H; h++) want[(sorted_row[i] % N) * H + h] += g[i * H + h];
    /* same additions, possibly in another order: K+1 fp32 terms, ≤ ~4 ulp */
    t_close("permute_backward accumulates Σ over the token's rows", dx, want, N * H, 1e-6f, 1e-6f);
    for (int i = 0; i < N * H; i++) dx[i] -= init[i];
    double lhs = dot_d(xp, g, M * H), rhs = dot_d(x, dx, N * H);
    /* adjoint identity: both sides sum the same M·H products; fp32 dx rounding ~1e-7 relative */
    CHECK(fabs(lhs - rhs) < 1e-5 * (1 + fabs(lhs)), "adjoint: <Px,g> %.9g vs <x,Pᵀg> %.9g", lhs, rhs);
}

/* A larger routing to exercise the parallel loops (above their thread thresholds). */
static void test_permute_large(void) {
    enum { N = 1000, E = 16, K = 4, H = 40, M = N * K };
    rng_state r;
    rng_seed(&r, 6);
    int *ids = inew(M), *row_idx = inew(M), *sorted_row = inew(M), *pos = inew(M), tpe[E], off[E + 1];
    random_ids(&r, ids, N, E, K, -1);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) row_idx[t * K + j] = j * N + t;
    moe_permute_index(sorted_row, pos, tpe, off, ids, row_idx, N, E, K);
    float *x = fnew(N * H), *xp = fnew((long)M * H), *dx = fnew(N * H), *want = fnew(N * H);
    fill_normal(&r, x, N * H, 1.0f);
    moe_permute_forward(xp, x, sorted_row, N, M, H);
    moe_permute_backward(dx, xp, sorted_row, N, M, H);
    /* Pᵀ P x = K · x (every token has K rows), exact up to K fp32 additions */
    for (int i = 0; i < N * H; i++) want[i] = K * x[i];
    t_close("permute_backward(permute_forward(x)) = K·x (parallel path)", dx, want, N * H, 1e-6f, 1e-6f);
    free(ids); free(row_idx); free(sorted_row); free(pos); free(x); free(xp); free(dx); free(want);
}

static double unpermute_loss(const float *y, const float *w, const int *pos, const float *c, int N, int K, int H) {
    float *out = fnew((long)N * H);
    moe_unpermute_forward(out, y, w, pos, N, K, H);
    double L = dot_d(out, c, (long)N * H);
    free(out);
    return L;
}

static void test_unpermute(void) {
    enum { N = 5, E = 4, K = 2, H = 6, M = N * K };
    rng_state r;
    rng_seed(&r, 9);
    int ids[M], row_idx[M], sorted_row[M], pos[M], tpe[E], off[E + 1];
    random_ids(&r, ids, N, E, K, -1);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) row_idx[t * K + j] = j * N + t;
    moe_permute_index(sorted_row, pos, tpe, off, ids, row_idx, N, E, K);
    float y[M * H], w[N * K], c[N * H], out[N * H], want[N * H];
    fill_normal(&r, y, M * H, 1.0f);
    fill_normal(&r, w, N * K, 1.0f);
    fill_normal(&r, c, N * H, 1.0f);
    moe_unpermute_forward(out, y, w, pos, N, K, H);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            double s = 0;
            for (int j = 0; j < K; j++) s += (double)w[t * K + j] * y[pos[t * K + j] * H + h];
            want[t * H + h] = (float)s;
        }
    /* K = 2 products summed in fp32: ≤ 2 roundings */
    t_close("unpermute_forward vs Σ_j w·y[pos]", out, want, N * H, 1e-6f, 1e-6f);

    float dy[M * H], dw[N * K], ny[M * H], nw[N * K];
    memset(dy, 0x7f, sizeof dy); /* garbage: every row must be overwritten */
    moe_unpermute_backward(dy, dw, c, y, w, pos, N, K, H);
    const float eps = 1e-2f;
    for (int i = 0; i < M * H; i++) {
        float k = y[i];
        y[i] = k + eps; double lp = unpermute_loss(y, w, pos, c, N, K, H);
        y[i] = k - eps; double lm = unpermute_loss(y, w, pos, c, N, K, H);
        y[i] = k;
        ny[i] = (float)((lp - lm) / (2 * eps));
    }
    for (int i = 0; i < N * K; i++) {
        float k = w[i];
        w[i] = k + eps; double lp = unpermute_loss(y, w, pos, c, N, K, H);
        w[i] = k - eps; double lm = unpermute_loss(y, w, pos, c, N, K, H);
        w[i] = k;
        nw[i] = (float)((lp - lm) / (2 * eps));
    }
    /* the loss is linear in y and in w: no truncation error; fp32 rounding of out (~1e-7 · |out|,
     * 30 terms) / (2 eps) ≈ 2e-5 */
    t_close("unpermute_backward dy vs finite differences", dy, ny, M * H, 1e-4f, 1e-3f);
    t_close("unpermute_backward dtopk_w vs finite differences", dw, nw, N * K, 1e-4f, 1e-3f);
}

/* ---------------------------------------------------------------- 4. grouped GEMM */

/* float64 reference: out_g = a_g W_gᵀ; da_g = dout_g W_g; dW_g = dout_gᵀ a_g (not accumulated). */
static void gg_reference(float *out, float *da, float *dW, const float *a, const float *W, const float *dout,
                         const int *off, int E, int I, int O) {
    for (int g = 0; g < E; g++) {
        const float *Wg = W + (size_t)g * O * I;
        for (int r = off[g]; r < off[g + 1]; r++) {
            for (int o = 0; o < O; o++) {
                double s = 0;
                for (int i = 0; i < I; i++) s += (double)a[(size_t)r * I + i] * Wg[(size_t)o * I + i];
                out[(size_t)r * O + o] = (float)s;
            }
            for (int i = 0; i < I; i++) {
                double s = 0;
                for (int o = 0; o < O; o++) s += (double)dout[(size_t)r * O + o] * Wg[(size_t)o * I + i];
                da[(size_t)r * I + i] = (float)s;
            }
        }
        for (int o = 0; o < O; o++)
            for (int i = 0; i < I; i++) {
                double s = 0;
                for (int r = off[g]; r < off[g + 1]; r++) s += (double)dout[(size_t)r * O + o] * a[(size_t)r * I + i];
                dW[(size_t)g * O * I + (size_t)o * I + i] = (float)s;
            }
    }
}

/* counts[E] rows per expert; checks forward, backward (dW accumulating onto a random start),
 * the NULL variants, an idle expert's dW untouched, and the OpenBLAS thread count restored. */
static void gg_check(const char *name, const int *counts, int E, int I, int O, uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    int *off = inew(E + 1);
    for (int g = 0; g < E; g++) off[g + 1] = off[g] + counts[g];
    const int M = off[E];
    float *a = fnew((long)M * I), *W = fnew((long)E * O * I), *dout = fnew((long)M * O);
    float *out = fnew((long)M * O), *da = fnew((long)M * I), *dW = fnew((long)E * O * I), *dW0 = fnew((long)E * O * I);
    float *ro = fnew((long)M * O), *rda = fnew((long)M * I), *rdW = fnew((long)E * O * I);
    fill_normal(&r, a, (long)M * I, 1.0f);
    fill_normal(&r, W, (long)E * O * I, 1.0f);
    fill_normal(&r, dout, (long)M * O, 1.0f);
    fill_normal(&r, dW0, (long)E * O * I, 1.0f);
    gg_reference(ro, rda, rdW, a, W, dout, off, E, I, O);
    for (long i = 0; i < (long)E * O * I; i++) rdW[i] += dW0[i];

    const int nb = openblas_get_num_threads();
    grouped_gemm_forward(out, a, W, off, E, I, O);
    memcpy(dW, dW0, (size_t)E * O * I * sizeof(float));
    grouped_gemm_backward(da, dW, dout, a, W, off, E, I, O);
    CHECK(openblas_get_num_threads() == nb, "%s: OpenBLAS threads %d after the call, %d before", name,
          openblas_get_num_threads(), nb);
    char what[128];
    /* fp32 sums of up to max(I, O, M) unit-variance products (BLAS blocking order): relative
     * error ~ sqrt(n)·6e-8 of a result of size ~sqrt(n) → 1e-5 absolute is >10× that */
    snprintf(what, sizeof what, "%s: forward vs float64 reference", name);
    t_close(what, out, ro, (long)M * O, 1e-4f, 1e-5f);
    snprintf(what, sizeof what, "%s: da vs float64 reference", name);
    t_close(what, da, rda, (long)M * I, 1e-4f, 1e-5f);
    snprintf(what, sizeof what, "%s: dW (accumulated) vs float64 reference", name);
    t_close(what, dW, rdW, (long)E * O * I, 1e-4f, 1e-5f);
    for (int g = 0; g < E; g++)
        if (counts[g] == 0)
            CHECK(!memcmp(dW + (size_t)g * O * I, dW0 + (size_t)g * O * I, (size_t)O * I * sizeof(float)),
                  "%s: idle expert %d's dW changed", name, g);

    /* NULL outputs: dW only, then da only */
    float *dW2 = fnew((long)E * O * I), *da2 = fnew((long)M * I);
    memcpy(dW2, dW0, (size_t)E * O * I * sizeof(float));
    grouped_gemm_backward(NULL, dW2, dout, a, W, off, E, I, O);
    CHECK(!memcmp(dW2, dW, (size_t)E * O * I * sizeof(float)), "%s: dW with da == NULL differs", name);
    grouped_gemm_backward(da2, NULL, dout, a, W, off, E, I, O);
    CHECK(!memcmp(da2, da, (size_t)M * I * sizeof(float)), "%s: da with dW == NULL differs", name);

#ifdef _OPENMP
    /* serial path (one OpenMP thread: the loop runs in order, OpenBLAS keeps its threads) */
    const int nth = omp_get_max_threads();
    omp_set_num_threads(1);
    float *out1 = fnew((long)M * O);
    grouped_gemm_forward(out1, a, W, off, E, I, O);
    omp_set_num_threads(nth);
    snprintf(what, sizeof what, "%s: forward, one OpenMP thread", name);
    t_close(what, out1, ro, (long)M * O, 1e-4f, 1e-5f);
    free(out1);
#endif
    free(off); free(a); free(W); free(dout); free(out); free(da); free(dW); free(dW0); free(ro); free(rda);
    free(rdW); free(dW2); free(da2);
}

static double gg_loss(const float *a, const float *W, const float *c, const int *off, int E, int I, int O) {
    const int M = off[E];
    float *out = fnew((long)M * O);
    grouped_gemm_forward(out, a, W, off, E, I, O);
    double L = dot_d(out, c, (long)M * O);
    free(out);
    return L;
}

static void test_grouped_gemm(void) {
    const int c1[4] = {5, 3, 0, 7};
    gg_check("small, expert 2 idle", c1, 4, 24, 40, 11);
    /* 300 rows in one group: split into column blocks across threads */
    const int c2[3] = {300, 0, 20};
    gg_check("one large group (column split)", c2, 3, 96, 256, 12);
    const int c3[16] = {40, 31, 0, 55, 12, 70, 1, 33, 47, 29, 0, 64, 18, 9, 51, 26};
    gg_check("16 experts, two idle", c3, 16, 64, 128, 13);
    const int c4[2] = {0, 0};
    gg_check("no rows at all", c4, 2, 16, 16, 14);

    /* finite differences of the backward (small) */
    enum { E = 3, I = 4, O = 5 };
    const int off[E + 1] = {0, 3, 3, 7};
    const int M = off[E];
    rng_state r;
    rng_seed(&r, 15);
    float a[7 * I], W[E * O * I], c[7 * O], da[7 * I], dW[E * O * I] = {0}, na[7 * I], nW[E * O * I];
    fill_normal(&r, a, M * I, 1.0f);
    fill_normal(&r, W, E * O * I, 1.0f);
    fill_normal(&r, c, M * O, 1.0f);
    grouped_gemm_backward(da, dW, c, a, W, off, E, I, O);
    const float eps = 1e-2f;
    for (int i = 0; i < M * I; i++) {
        float k = a[i];
        a[i] = k + eps; double lp = gg_loss(a, W, c, off, E, I, O);
        a[i] = k - eps; double lm = gg_loss(a, W, c, off, E, I, O);
        a[i] = k;
        na[i] = (float)((lp - lm) / (2 * eps));
    }
    for (int i = 0; i < E * O * I; i++) {
        float k = W[i];
        W[i] = k + eps; double lp = gg_loss(a, W, c, off, E, I, O);
        W[i] = k - eps; double lm = gg_loss(a, W, c, off, E, I, O);
        W[i] = k;
        nW[i] = (float)((lp - lm) / (2 * eps));
    }
    /* bilinear loss: no truncation error; fp32 rounding of out (~35 values of size ~2, 1e-7
     * relative) / (2 eps) ≈ 5e-5 */
    t_close("grouped GEMM da vs finite differences", da, na, M * I, 2e-4f, 1e-3f);
    t_close("grouped GEMM dW vs finite differences (idle expert 1: zero)", dW, nW, E * O * I, 2e-4f, 1e-3f);
}

/* ---------------------------------------------------------------- 4b. tiled GEMM */

/* Element (r, c) of a tg_mat, as the header defines it (the test's own reading). */
static double tm_at(const tg_mat *M, int r, int c) {
    const int x = M->trans ? c : r, y = M->trans ? r : c;
    const long px = M->idx ? M->idx[x] % M->mod : x;
    double w = 1.0;
    if (M->rw) w = M->rw[(long)(M->idx[x] % M->mod) * M->rk + M->idx[x] / M->mod];
    return w * M->p[px * M->ld + y];
}

static double t_silu(double g) { return g / (1.0 + exp(-g)); }

/* One gemm_tiled call against a float64 evaluation of its contract. A is m×k, B k×n (or k×2·half
 * for SwiGLU), each untransposed or transposed, gathered through an index with routing weights
 * or not; C accumulates onto random values or is overwritten; the epilogue as given. */
static void tiled_case(int m, int n, int k, int a_trans, int b_trans, int gather, int accumulate, int kind,
                       uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    const int half = n + 3; /* SwiGLU: the up columns start past the gate block (and a gap) */
    const int bn = kind == TG_EPI_SWIGLU ? half + n : n; /* B's columns */
    const int cn = kind == TG_EPI_SWIGLU ? half + n : n; /* C's columns */
    const int T = 11, KK = 3;                             /* gathered rows: tokens × slots */
    /* storage: rows of A are its k-index when transposed; gathered operands index T·KK rows */
    const int a_rows = gather ? T : (a_trans ? k : m), a_ld = (a_trans ? m : k) + 2;
    const int b_rows = b_trans ? bn : k, b_ld = (b_trans ? k : bn) + 1;
    float *As = fnew((long)a_rows * a_ld), *Bs = fnew((long)b_rows * b_ld), *rw = fnew((long)T * KK);
    int *idx = inew(MOERL_MAX(m, k) + 1);
    fill_normal(&r, As, (long)a_rows * a_ld, 1.0f);
    fill_normal(&r, Bs, (long)b_rows * b_ld, 1.0f);
    for (int i = 0; i < T * KK; i++) rw[i] = 0.25f + (float)rng_uniform(&r);
    const int gn = a_trans ? k : m; /* the gathered index runs over A's storage rows */
    for (int i = 0; i < gn; i++) idx[i] = (int)rng_below(&r, (uint64_t)(T * KK)); /* repeats allowed */
    tg_mat A = {.p = As, .ld = a_ld, .trans = a_trans};
    if (gather) { A.idx = idx; A.mod = T; A.rw = rw; A.rk = KK; }
    const tg_mat B = {.p = Bs, .ld = b_ld, .trans = b_trans};
    const int ldc = cn + 5;
    float *C = fnew((long)m * ldc), *C0 = fnew((long)m * ldc), *act = fnew((long)m * (n + 1));
    float *gu = fnew((long)m * 2 * (n + 2)), *dgu = fnew((long)m * 2 * (n + 2));
    fill_normal(&r, C0, (long)m * ldc, 1.0f);
    fill_normal(&r, gu, (long)m * 2 * (n + 2), 1.0f);
    memcpy(C, C0, (size_t)m * ldc * sizeof(float));
    tg_epi ep = {.kind = kind, .half = half, .act = act, .ld_act = n + 1};
    if (kind == TG_EPI_DSWIGLU) { ep.half = n + 2; ep.dgu = dgu; ep.gu = gu; ep.ld_gu = 2 * (n + 2); }
    gemm_tiled(C, ldc, accumulate, &A, &B, m, n, k, kind ? &ep : NULL);

    char what[160];
    snprintf(what, sizeof what, "tiled m%d n%d k%d A%s B%s%s%s epi %d", m, n, k, a_trans ? "T" : "N",
             b_trans ? "T" : "N", gather ? " gathered+weighted" : "", accumulate ? " accumulate" : "", kind);
    /* float64 reference of every column the call may write; untouched ones keep C0 */
    float *R = fnew((long)m * ldc), *Ract = fnew((long)m * (n + 1)), *Rdgu = fnew((long)m * 2 * (n + 2));
    memcpy(R, C0, (size_t)m * ldc * sizeof(float));
    for (int i = 0; i < m; i++) {
        for (int c = 0; c < n; c++) {
            const int nc = kind == TG_EPI_SWIGLU ? 2 : 1;
            double v[2] = {0, 0};
            for (int h = 0; h < nc; h++) {
                const int bc = c + h * half;
                double sum = 0;
                for (int p = 0; p < k; p++) sum += tm_at(&A, i, p) * tm_at(&B, p, bc);
                v[h] = sum + (accumulate ? C0[(long)i * ldc + bc] : 0.0);
                R[(long)i * ldc + bc] = (float)v[h];
            }
            if (kind == TG_EPI_SWIGLU) Ract[(long)i * (n + 1) + c] = (float)(t_silu(v[0]) * v[1]);
            if (kind == TG_EPI_DSWIGLU) {
                const long o = (long)i * 2 * (n + 2) + c;
                const double g = gu[o], u = gu[o + n + 2], sg = 1.0 / (1.0 + exp(-g));
                Rdgu[o] = (float)(v[0] * u * sg * (1.0 + g * (1.0 - sg)));
                Rdgu[o + n + 2] = (float)(v[0] * g * sg);
            }
        }
    }
    /* fp32 sums of k products of unit-variance values (weights ≤ 1.25) in another order than the
     * float64 reference: error ~ sqrt(k)·6e-8·sqrt(k) ≤ 5e-5 at k = 700; 2e-4 absolute + 1e-5
     * relative leaves room and still catches one wrong term (size ~1) */
    const float atol = 2e-4f, rtol = 1e-5f;
    t_close(what, C, R, (long)m * ldc, atol, rtol);
    if (kind == TG_EPI_SWIGLU) {
        snprintf(what + strlen(what), sizeof what - strlen(what), " (act)");
        /* silu·u of the C values: the C error times |silu'|·|u| ≲ 3·(size ~3 for k ~10..700) */
        t_close(what, act, Ract, (long)m * (n + 1), 10 * atol, 1e-5f);
    }
    if (kind == TG_EPI_DSWIGLU) {
        snprintf(what + strlen(what), sizeof what - strlen(what), " (dgate_up)");
        /* the swiglu backward's factors are ≤ ~1.1·|u| and |g|·σ ≤ |g| (unit normals, ≤ ~4) */
        t_close(what, dgu, Rdgu, (long)m * 2 * (n + 2), 10 * atol, 1e-5f);
    }
    free(As); free(Bs); free(rw); free(idx); free(C); free(C0); free(act); free(gu); free(dgu); free(R); free(Ract);
    free(Rdgu);
}

static void test_tiled_gemm(void) {
    uint64_t seed = 100;
    /* shapes around the 6×16 tile and the 8-lane SwiGLU halves: 1, tile−1, tile, tile+1, several
     * tiles with a remainder; k = 0, small, and above one 320-deep block (two and three blocks) */
    const int ms[] = {1, 5, 6, 7, 50}, ns[] = {1, 7, 8, 9, 16, 17, 37}, ks[] = {0, 1, 13, 321, 700};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 7; b++)
            for (int c = 0; c < 5; c++) {
                const int m = ms[a], n = ns[b], k = ks[c];
                const int v = (a + b + c) % 4; /* rotate the operand forms over the shapes */
                tiled_case(m, n, k, v & 1, (v >> 1) & 1, (a + c) % 2, (b + c) % 2, TG_EPI_NONE, seed++);
            }
    for (int b = 0; b < 7; b++)
        for (int v = 0; v < 4; v++) {
            tiled_case(ms[(b + v) % 5], ns[b], ks[(b + v) % 4 + 1], 0, 1, v & 1, 0, TG_EPI_SWIGLU, seed++);
            tiled_case(ms[(b + v + 2) % 5], ns[b], ks[(b + v) % 4 + 1], v & 1, 0, (v >> 1) & 1, 0, TG_EPI_DSWIGLU,
                       seed++);
        }
    /* the production forms at a larger size: 300 rows (50 tiles), 130 columns (8 panels + 2) */
    tiled_case(300, 130, 256, 0, 1, 1, 0, TG_EPI_SWIGLU, seed++);
    tiled_case(300, 130, 256, 1, 0, 1, 1, TG_EPI_NONE, seed++);
    tiled_case(300, 130, 256, 0, 0, 1, 0, TG_EPI_DSWIGLU, seed++);
}

/* ---------------------------------------------------------------- 4c. the production team pipeline */

/* The fused schedule of src/model/forward.c on given routing (ids, topk_w), on a team of nt
 * threads: gate_up grouped GEMM gathering x's rows in its packing (no permuted copy) with SwiGLU
 * as its epilogue, down grouped GEMM, unpermute; backward: dtopk_w per token, the down backward
 * reading the routing-weighted rows of dout in place with the SwiGLU backward as its epilogue,
 * the gate_up backward gathering x for dW, the permute backward as dx. Checked against the naive
 * HF loop (moe_naive_forward/backward). */
static void team_case(const char *name, int N, int H, int E, int K, int I, const int *ids, const float *topk_w, int nt,
                      uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    const int M = N * K;
    float *x = fnew((long)N * H), *Wgu = fnew((long)E * 2 * I * H), *Wd = fnew((long)E * H * I), *dout = fnew((long)N * H);
    fill_normal(&r, x, (long)N * H, 1.0f);
    fill_normal(&r, Wgu, (long)E * 2 * I * H, 1.0f / sqrtf((float)H));
    fill_normal(&r, Wd, (long)E * H * I, 1.0f / sqrtf((float)I));
    fill_normal(&r, dout, (long)N * H, 1.0f);
    int *row_idx = inew(M), *sorted = inew(M), *pos = inew(M), *tpe = inew(E), *off = inew(E + 1);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) row_idx[t * K + j] = j * N + t;
    moe_permute_index(sorted, pos, tpe, off, ids, row_idx, N, E, K);
    float *gu = fnew((long)M * 2 * I), *act = fnew((long)M * I), *y = fnew((long)M * H), *out = fnew((long)N * H);
    float *dact = fnew((long)M * I), *dgu = fnew((long)M * 2 * I), *dperm = fnew((long)M * H);
    float *dx = fnew((long)N * H), *dWgu = fnew((long)E * 2 * I * H), *dWd = fnew((long)E * H * I), *dtw = fnew(M);
    grouped_fuse ff = {0}, fb = {0}, fg = {0};
    ff.gather_x = x; ff.sorted_row = sorted; ff.n_tokens = N; ff.swiglu_act = act;
    fb.gather_dout = dout; fb.topk_w = topk_w; fb.topk_k = K; fb.sorted_row = sorted; fb.n_tokens = N;
    fb.swiglu_dgate_up = dgu; fb.swiglu_gate_up = gu;
    fg.gather_x = x; fg.sorted_row = sorted; fg.n_tokens = N;
#pragma omp parallel num_threads(nt)
    {
        grouped_gemm_forward_team(gu, NULL, Wgu, off, E, H, 2 * I, &ff);
        grouped_gemm_forward_team(y, act, Wd, off, E, I, H, NULL);
    }
    moe_unpermute_forward(out, y, topk_w, pos, N, K, H);
    moe_unpermute_backward(NULL, dtw, dout, y, topk_w, pos, N, K, H);
#pragma omp parallel num_threads(nt)
    {
        grouped_gemm_backward_team(dact, dWd, NULL, act, Wd, off, E, I, H, &fb);
        grouped_gemm_backward_team(dperm, dWgu, dgu, NULL, Wgu, off, E, H, 2 * I, &fg);
    }
    moe_permute_backward(dx, dperm, sorted, N, M, H);
    /* da NULL (the production schedule): the items keep ∂/∂act in a per-thread scratch, in row
     * chunks when a group is large; each row's arithmetic is the same, so the same bits */
    float *dgu2 = fnew((long)M * 2 * I);
    grouped_fuse fb2 = fb;
    fb2.swiglu_dgate_up = dgu2;
#pragma omp parallel num_threads(nt)
    grouped_gemm_backward_team(NULL, NULL, NULL, act, Wd, off, E, I, H, &fb2);
    CHECK(!memcmp(dgu2, dgu, (size_t)M * 2 * I * sizeof(float)),
          "%s, %d threads: SwiGLU backward without da differs from the one with da", name, nt);
    free(dgu2);

    float *o_n = fnew((long)N * H), *dx_n = fnew((long)N * H), *dWgu_n = fnew((long)E * 2 * I * H);
    float *dWd_n = fnew((long)E * H * I), *dtw_n = fnew(M);
    moe_naive_forward(o_n, x, Wgu, Wd, ids, topk_w, N, H, E, K, I);
    moe_naive_backward(dx_n, dWgu_n, dWd_n, dtw_n, dout, x, Wgu, Wd, ids, topk_w, N, H, E, K, I);
    char what[160];
    /* same products in another order (tiled k-ascending FMA sums vs OpenBLAS blocking; routing
     * weight applied to a row's sum instead of its input): fp32 with values of size ~1 and inner
     * sizes ≤ 700 → ≤ ~3e-6 relative; dW sums over up to ~700 routed rows of size ~1 */
    snprintf(what, sizeof what, "%s, %d threads: output == naive", name, nt);
    t_close(what, out, o_n, (long)N * H, 2e-5f, 1e-4f);
    snprintf(what, sizeof what, "%s, %d threads: dtopk_w == naive", name, nt);
    t_close(what, dtw, dtw_n, M, 2e-5f, 1e-4f);
    snprintf(what, sizeof what, "%s, %d threads: dx == naive", name, nt);
    t_close(what, dx, dx_n, (long)N * H, 2e-5f, 1e-4f);
    snprintf(what, sizeof what, "%s, %d threads: d gate_up == naive", name, nt);
    t_close(what, dWgu, dWgu_n, (long)E * 2 * I * H, 1e-4f, 1e-4f);
    snprintf(what, sizeof what, "%s, %d threads: d down == naive", name, nt);
    t_close(what, dWd, dWd_n, (long)E * H * I, 1e-4f, 1e-4f);
    for (int g = 0; g < E; g++)
        if (tpe[g] == 0) {
            int zero = 1;
            for (long i = 0; i < 2L * I * H; i++) zero &= dWgu[(size_t)g * 2 * I * H + i] == 0.0f;
            for (long i = 0; i < (long)H * I; i++) zero &= dWd[(size_t)g * H * I + i] == 0.0f;
            CHECK(zero, "%s, %d threads: idle expert %d received a nonzero weight gradient", name, nt, g);
        }
    free(x); free(Wgu); free(Wd); free(dout); free(row_idx); free(sorted); free(pos); free(tpe); free(off);
    free(gu); free(act); free(y); free(out); free(dact); free(dgu); free(dperm); free(dx); free(dWgu); free(dWd);
    free(dtw); free(o_n); free(dx_n); free(dWgu_n); free(dWd_n); free(dtw_n);
}

/* Routing with expert 0 idle and expert 1 chosen by token 0 only (one row); the others at
 * random (distinct per token), weights in [0.1, 1). Needs E − 2 ≥ K. */
static void team_routing(rng_state *r, int *ids, float *w, int N, int E, int K) {
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = t == 0 && j == 0 ? 1 : 2 + (int)rng_below(r, (uint64_t)(E - 2));
                dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[t * K + q] == e;
            } while (dup);
            ids[t * K + j] = e;
            w[t * K + j] = 0.1f + 0.9f * (float)rng_uniform(r);
        }
}

static void test_team_vs_naive(void) {
    /* odd shapes: H and I not multiples of 8 or 16; groups of 1 row, decode-sized (≤ 16) and
     * larger with row counts that are not multiples of the 6-row tile; many routed rows per
     * expert (dW deeper than one 320-row block); H above one block (the forward's k-blocks) */
    const struct { const char *name; int N, H, E, K, I; } cs[] = {
        {"odd small (H 20, I 13, E 7, top-3)", 29, 20, 7, 3, 13},
        {"decode-sized groups (N 9, H 24, I 16)", 9, 24, 6, 2, 16},
        {"mid (N 200, H 40, I 24, E 5)", 200, 40, 5, 2, 24},
        {"deep dW (N 700, E 4: ~700 rows per expert)", 700, 36, 4, 2, 20},
        {"wide H (H 333 > one k-block, I 40)", 60, 333, 6, 2, 40},
        /* one expert with ~600 rows of a 136-wide da block: the da scratch in several row chunks */
        {"da scratch chunks (N 600, E 3, top-1, I 136)", 600, 24, 3, 1, 136},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        rng_state r;
        rng_seed(&r, 300 + c);
        const int N = cs[c].N, E = cs[c].E, K = cs[c].K;
        int *ids = inew((long)N * K);
        float *w = fnew((long)N * K);
        team_routing(&r, ids, w, N, E, K);
        for (int nt = 1; nt <= 4; nt++) team_case(cs[c].name, N, cs[c].H, E, K, cs[c].I, ids, w, nt, 400 + c);
        free(ids); free(w);
    }
}

/* ---------------------------------------------------------------- 5. fused MoE layer */

/* One MoE layer's parameters and the activations the fused pipeline keeps for backward. */
typedef struct {
    int N, H, E, K, I, norm;
    const float *x, *Wr, *Wgu, *Wd; /* [N,H], [E,H], [E,2I,H], [E,H,I] */
    float *logits, *probs, *topk_w, *permuted, *gate_up, *act, *y, *out;
    int *ids, *row_idx, *sorted_row, *pos, *tpe, *off;
} fused_layer;

static void fused_alloc(fused_layer *f, int N, int H, int E, int K, int I, int norm) {
    memset(f, 0, sizeof *f);
    f->N = N; f->H = H; f->E = E; f->K = K; f->I = I; f->norm = norm;
    const long M = (long)N * K;
    f->logits = fnew((long)N * E); f->probs = fnew((long)N * E); f->topk_w = fnew(M);
    f->permuted = fnew(M * H); f->gate_up = fnew(M * 2 * I); f->act = fnew(M * I); f->y = fnew(M * H);
    f->out = fnew((long)N * H);
    f->ids = inew(M); f->row_idx = inew(M); f->sorted_row = inew(M); f->pos = inew(M); f->tpe = inew(E);
    f->off = inew(E + 1);
}

static void fused_free(fused_layer *f) {
    free(f->logits); free(f->probs); free(f->topk_w); free(f->permuted); free(f->gate_up); free(f->act);
    free(f->y); free(f->out); free(f->ids); free(f->row_idx); free(f->sorted_row); free(f->pos); free(f->tpe);
    free(f->off);
}

/* router → top-k → permute → grouped GEMM gate_up → SwiGLU → grouped GEMM down → unpermute */
static void fused_forward(fused_layer *f) {
    const int N = f->N, H = f->H, E = f->E, K = f->K, I = f->I, M = N * K;
    linear_forward(f->logits, f->x, f->Wr, N, H, E, 0);
    router_topk_forward(f->probs, f->ids, f->topk_w, f->row_idx, f->logits, N, E, K, f->norm);
    moe_permute_index(f->sorted_row, f->pos, f->tpe, f->off, f->ids, f->row_idx, N, E, K);
    moe_permute_forward(f->permuted, f->x, f->sorted_row, N, M, H);
    grouped_gemm_forward(f->gate_up, f->permuted, f->Wgu, f->off, E, H, 2 * I);
    swiglu_forward(f->act, f->gate_up, M, I);
    grouped_gemm_forward(f->y, f->act, f->Wd, f->off, E, I, H);
    moe_unpermute_forward(f->out, f->y, f->topk_w, f->pos, N, K, H);
}

/* Backward of fused_forward given dout and an optional aux gradient on the probabilities.
 * dx OVERWRITTEN; dWr, dWgu, dWd ACCUMULATE; dtopk_w_out (optional) receives dtopk_w. */
static void fused_backward(fused_layer *f, float *dx, float *dWr, float *dWgu, float *dWd, float *dtopk_w_out,
                           const float *dout, const float *dprobs_aux) {
    const int N = f->N, H = f->H, E = f->E, K = f->K, I = f->I, M = N * K;
    float *dy = fnew((long)M * H), *dtw = fnew(M), *dact = fnew((long)M * I), *dgu = fnew((long)M * 2 * I);
    float *dperm = fnew((long)M * H), *dlog = fnew((long)N * E);
    moe_unpermute_backward(dy, dtw, dout, f->y, f->topk_w, f->pos, N, K, H);
    grouped_gemm_backward(dact, dWd, dy, f->act, f->Wd, f->off, E, I, H);
    swiglu_backward(dgu, dact, f->gate_up, M, I);
    grouped_gemm_backward(dperm, dWgu, dgu, f->permuted, f->Wgu, f->off, E, H, 2 * I);
    memset(dx, 0, (size_t)N * H * sizeof(float));
    moe_permute_backward(dx, dperm, f->sorted_row, N, M, H);
    router_topk_backward(dlog, dtw, dprobs_aux, f->probs, f->ids, N, E, K, f->norm);
    linear_backward(dx, dWr, dlog, f->x, f->Wr, N, H, E, 1);
    if (dtopk_w_out) memcpy(dtopk_w_out, dtw, (size_t)M * sizeof(float));
    free(dy); free(dtw); free(dact); free(dgu); free(dperm); free(dlog);
}

static void test_fused_vs_naive(void) {
    enum { N = 40, H = 48, E = 6, K = 2, I = 24, IDLE = 3 };
    rng_state r;
    rng_seed(&r, 21);
    float *x = fnew(N * H), *Wr = fnew(E * H), *Wgu = fnew(E * 2 * I * H), *Wd = fnew(E * H * I);
    fill_normal(&r, x, N * H, 1.0f);
    fill_normal(&r, Wr, E * H, 0.3f);
    fill_normal(&r, Wgu, E * 2 * I * H, 0.15f);
    fill_normal(&r, Wd, E * H * I, 0.2f);
    /* expert IDLE never chosen: its logit is pushed far below the rest through a constant input */
    for (int t = 0; t < N; t++) x[t * H] = fabsf(x[t * H]) + 2.0f;
    Wr[IDLE * H] = -10.0f;
    fused_layer f;
    fused_alloc(&f, N, H, E, K, I, 1);
    f.x = x; f.Wr = Wr; f.Wgu = Wgu; f.Wd = Wd;
    fused_forward(&f);
    CHECK(f.tpe[IDLE] == 0, "expert %d was meant to be idle, got %d rows", IDLE, f.tpe[IDLE]);
    float *out_n = fnew(N * H);
    moe_naive_forward(out_n, x, Wgu, Wd, f.ids, f.topk_w, N, H, E, K, I);
    /* same products, different summation order (grouped vs per-expert GEMM blocking, index_add
     * vs slot order): fp32, outputs of size ~1 → 1e-5 absolute */
    t_close("fused forward == naive forward", f.out, out_n, N * H, 1e-5f, 1e-5f);

    float *dout = fnew(N * H);
    fill_normal(&r, dout, N * H, 1.0f);
    float *dx = fnew(N * H), *dWgu = fnew(E * 2 * I * H), *dWd = fnew(E * H * I), *dtw = fnew(N * K);
    float *dx_n = fnew(N * H), *dWgu_n = fnew(E * 2 * I * H), *dWd_n = fnew(E * H * I), *dtw_n = fnew(N * K);
    float *dWr = fnew(E * H);
    fused_backward(&f, dx, dWr, dWgu, dWd, dtw, dout, NULL);
    moe_naive_backward(dx_n, dWgu_n, dWd_n, dtw_n, dout, x, Wgu, Wd, f.ids, f.topk_w, N, H, E, K, I);
    /* the naive path covers the experts only: add the router's share of dx (through dtopk_w)
     * with the same router backward the fused path uses */
    float *dlog = fnew(N * E);
    router_topk_backward(dlog, dtw_n, NULL, f.probs, f.ids, N, E, K, 1);
    linear_backward(dx_n, NULL, dlog, x, Wr, N, H, E, 1);
    t_close("fused dtopk_w == naive dtopk_w", dtw, dtw_n, N * K, 1e-5f, 1e-5f);
    t_close("fused dx == naive dx (+ router path)", dx, dx_n, N * H, 1e-5f, 1e-5f);
    t_close("fused dgate_up_w == naive dgate_up_w", dWgu, dWgu_n, E * 2 * I * H, 1e-5f, 1e-5f);
    t_close("fused ddown_w == naive ddown_w", dWd, dWd_n, E * H * I, 1e-5f, 1e-5f);
    int idle_zero = 1;
    for (long i = 0; i < 2L * I * H; i++) idle_zero &= dWgu[(size_t)IDLE * 2 * I * H + i] == 0.0f;
    for (long i = 0; i < (long)H * I; i++) idle_zero &= dWd[(size_t)IDLE * H * I + i] == 0.0f;
    CHECK(idle_zero, "idle expert %d received a nonzero weight gradient", IDLE);
    fused_free(&f);
    free(x); free(Wr); free(Wgu); free(Wd); free(out_n); free(dout); free(dx); free(dWgu); free(dWd); free(dtw);
    free(dx_n); free(dWgu_n); free(dWd_n); free(dtw_n); free(dWr); free(dlog);
}

/* Loss of the whole layer: Σ c·out + coef·aux (one layer, R = N). ids_out receives the top-k. */
static double layer_loss(fused_layer *f, const float *c, float coef, int *ids_out) {
    fused_forward(f);
    float *counts = fnew(f->E), *psum = fnew(f->E);
    moe_aux_accumulate(counts, psum, f->probs, f->ids, f->N, f->E, f->K);
    double L = dot_d(f->out, c, (long)f->N * f->H) + coef * (double)moe_aux_loss(counts, psum, f->E, f->N);
    memcpy(ids_out, f->ids, (size_t)f->N * f->K * sizeof(int));
    free(counts); free(psum);
    return L;
}

/* Central differences of layer_loss over every element of p[n] (p is one of f's inputs). */
static void layer_fd(fused_layer *f, float *p, long n, const float *c, float coef, const int *ids0, float *num,
                     int *stable) {
    const float eps = 1e-2f;
    int *ids = inew((long)f->N * f->K);
    for (long i = 0; i < n; i++) {
        float k = p[i];
        p[i] = k + eps; double lp = layer_loss(f, c, coef, ids);
        *stable &= !memcmp(ids, ids0, (size_t)f->N * f->K * sizeof(int));
        p[i] = k - eps; double lm = layer_loss(f, c, coef, ids);
        *stable &= !memcmp(ids, ids0, (size_t)f->N * f->K * sizeof(int));
        p[i] = k;
        num[i] = (float)((lp - lm) / (2 * eps));
    }
    free(ids);
}

static void test_layer_fd(int norm) {
    enum { N = 8, H = 12, E = 5, K = 2, I = 6, IDLE = 4 };
    rng_state r;
    rng_seed(&r, 31 + norm);
    float x[N * H], Wr[E * H], Wgu[E * 2 * I * H], Wd[E * H * I], c[N * H];
    fused_layer f;
    fused_alloc(&f, N, H, E, K, I, norm);
    f.x = x; f.Wr = Wr; f.Wgu = Wgu; f.Wd = Wd;
    /* Redraw until the top-k margin (min_topk_gap) of the router logits is ≥ 0.1: a 1e-2 step of
     * one input moves each logit by at most 1e-2·max(|x|, |Wr|) ≲ 0.04, so the selection and its
     * order are fixed. */
    for (;;) {
        fill_normal(&r, x, N * H, 1.0f);
        fill_normal(&r, Wr, E * H, 0.5f);
        for (int t = 0; t < N; t++) x[t * H] = fabsf(x[t * H]) + 1.0f;
        Wr[IDLE * H] = -6.0f; /* expert IDLE receives no token */
        linear_forward(f.logits, x, Wr, N, H, E, 0);
        if (min_topk_gap(f.logits, N, E, K) >= 0.1f) break;
    }
    fill_normal(&r, Wgu, E * 2 * I * H, 0.4f);
    fill_normal(&r, Wd, E * H * I, 0.4f);
    fill_normal(&r, c, N * H, 1.0f);
    const float coef = 0.5f;
    int ids0[N * K];
    layer_loss(&f, c, coef, ids0);
    CHECK(f.tpe[IDLE] == 0, "layer FD: expert %d not idle (%d rows)", IDLE, f.tpe[IDLE]);
    float counts[E] = {0}, psum[E] = {0}, dprobs[N * E];
    moe_aux_accumulate(counts, psum, f.probs, f.ids, N, E, K);
    moe_aux_backward(dprobs, counts, N, E, N, coef);
    float dx[N * H], dWr[E * H] = {0}, dWgu[E * 2 * I * H] = {0}, dWd[E * H * I] = {0};
    fused_backward(&f, dx, dWr, dWgu, dWd, NULL, c, dprobs);

    float nx[N * H], nWr[E * H], nWgu[E * 2 * I * H], nWd[E * H * I];
    int stable = 1;
    layer_fd(&f, x, N * H, c, coef, ids0, nx, &stable);
    layer_fd(&f, Wr, E * H, c, coef, ids0, nWr, &stable);
    layer_fd(&f, Wgu, E * 2 * I * H, c, coef, ids0, nWgu, &stable);
    layer_fd(&f, Wd, E * H * I, c, coef, ids0, nWd, &stable);
    CHECK(stable, "layer FD (norm=%d): top-k changed under a step", norm);
    char what[96];
    /* central differences with step 1e-2 of an fp32 layer: loss rounding (~1e-6 over 96 outputs)
     * / 2e-2 ≈ 5e-5; truncation eps²/6·|f'''| with SwiGLU/softmax third derivatives of order
     * one times weights ~0.5 ≲ 5e-5 → atol 5e-4, rtol 5e-3 */
    snprintf(what, sizeof what, "fused layer dx vs finite differences (norm=%d)", norm);
    t_close(what, dx, nx, N * H, 5e-4f, 5e-3f);
    snprintf(what, sizeof what, "fused layer d router weight vs finite differences (norm=%d)", norm);
    t_close(what, dWr, nWr, E * H, 5e-4f, 5e-3f);
    snprintf(what, sizeof what, "fused layer d gate_up vs finite differences (norm=%d)", norm);
    t_close(what, dWgu, nWgu, E * 2 * I * H, 5e-4f, 5e-3f);
    snprintf(what, sizeof what, "fused layer d down vs finite differences (norm=%d)", norm);
    t_close(what, dWd, nWd, E * H * I, 5e-4f, 5e-3f);
    fused_free(&f);
}

/* ---------------------------------------------------------------- 6. PyTorch parity */

/* Read tensor `name` as fp32 with the expected element count; NULL (and a failed check) if absent. */
static float *st_get(const st_file *sf, const char *name, long numel) {
    const st_tensor *t = st_find(sf, name);
    CHECK(t != NULL, "reference tensor %s missing", name);
    if (!t) return NULL;
    CHECK(t->numel == numel, "reference tensor %s has %lld elements, expected %ld", name, (long long)t->numel, numel);
    if (t->numel != numel) return NULL;
    float *d = fnew(numel);
    int rc = st_to_f32(t, d);
    CHECK(rc == MOERL_OK, "st_to_f32(%s): %s", name, moerl_last_error());
    return d;
}

static const st_tensor *st_get_shape(const st_file *sf, const char *name, int ndim) {
    const st_tensor *t = st_find(sf, name);
    CHECK(t && t->ndim == ndim, "reference tensor %s missing or not %d-D", name, ndim);
    return t && t->ndim == ndim ? t : NULL;
}

/* The layer's four gradients (dx [N,H], router [E,H], gate_up [E,2I,H], down [E,H,I]) against
 * PyTorch's, labelled "<label>: ... vs PyTorch". Tolerances: the forward's fp32 error carried
 * through the two GEMMs backward plus the router path; values of size ~1, reference float64. */
static void parity_grads(const char *label, const float *dx, const float *r_dx, const float *dWr, const float *r_dWr,
                         const float *dWgu, const float *r_dWgu, const float *dWd, const float *r_dWd, int N, int H,
                         int E, int I) {
    const struct {
        const char *what;
        const float *got, *ref;
        long n;
    } g[4] = {{"dx", dx, r_dx, (long)N * H},
              {"d router weight", dWr, r_dWr, (long)E * H},
              {"d gate_up (stacked)", dWgu, r_dWgu, (long)E * 2 * I * H},
              {"d down (stacked)", dWd, r_dWd, (long)E * H * I}};
    for (int i = 0; i < 4; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s: %s vs PyTorch", label, g[i].what);
        t_close(what, g[i].got, g[i].ref, g[i].n, 3e-5f, 1e-4f);
    }
}

static void parity_case(const st_file *sf, const char *prefix, int norm) {
    char nm[64];
#define NAME(s) (snprintf(nm, sizeof nm, "%s%s", prefix, s), nm)
    const st_tensor *tx = st_get_shape(sf, NAME("x"), 2), *tdn = st_get_shape(sf, NAME("down_w"), 3),
                    *tid = st_get_shape(sf, NAME("topk_ids"), 2), *twr = st_get_shape(sf, NAME("router_w"), 2);
    if (!tx || !tdn || !tid || !twr) return;
    const int N = (int)tx->shape[0], H = (int)tx->shape[1], E = (int)twr->shape[0], I = (int)tdn->shape[2],
              K = (int)tid->shape[1];
    CHECK(tid->dtype == ST_I32, "%stopk_ids dtype %s, expected I32", prefix, st_dtype_name(tid->dtype));
    if (tid->dtype != ST_I32) return;
    float *x = st_get(sf, NAME("x"), (long)N * H), *Wr = st_get(sf, NAME("router_w"), (long)E * H),
          *Wgu = st_get(sf, NAME("gate_up_w"), (long)E * 2 * I * H), *Wd = st_get(sf, NAME("down_w"), (long)E * H * I),
          *dout = st_get(sf, NAME("dout"), (long)N * H), *l2 = st_get(sf, NAME("logits_l2"), (long)N * E),
          *coef = st_get(sf, NAME("coef"), 1), *r_logits = st_get(sf, NAME("router_logits"), (long)N * E),
          *r_probs = st_get(sf, NAME("probs"), (long)N * E), *r_w = st_get(sf, NAME("topk_w"), (long)N * K),
          *r_out = st_get(sf, NAME("out"), (long)N * H), *r_aux = st_get(sf, NAME("aux"), 1),
          *r_dx = st_get(sf, NAME("dx"), (long)N * H), *r_dWr = st_get(sf, NAME("drouter_w"), (long)E * H),
          *r_dWgu = st_get(sf, NAME("dgate_up_w"), (long)E * 2 * I * H),
          *r_dWd = st_get(sf, NAME("ddown_w"), (long)E * H * I);
    const int *r_ids = (const int *)tid->data;
    if (!x || !Wr || !Wgu || !Wd || !dout || !l2 || !coef || !r_logits || !r_probs || !r_w || !r_out || !r_aux ||
        !r_dx || !r_dWr || !r_dWgu || !r_dWd)
        goto done;
    {
        fused_layer f;
        fused_alloc(&f, N, H, E, K, I, norm);
        f.x = x; f.Wr = Wr; f.Wgu = Wgu; f.Wd = Wd;
        fused_forward(&f);
        int ids_equal = !memcmp(f.ids, r_ids, (size_t)N * K * sizeof(int));
        CHECK(ids_equal, "%s: top-k ids differ from torch.topk", prefix);
        char what[96];
        /* reference in float64 from the same fp32 inputs: logits are fp32 dots of H=64 terms of size
         * ~0.3 (error ~1e-6); probs/weights inherit it through softmax */
        snprintf(what, sizeof what, "%s: router logits vs PyTorch", prefix);
        t_close(what, f.logits, r_logits, (long)N * E, 1e-5f, 1e-5f);
        snprintf(what, sizeof what, "%s: router probs vs PyTorch", prefix);
        t_close(what, f.probs, r_probs, (long)N * E, 1e-6f, 1e-5f);
        snprintf(what, sizeof what, "%s: top-k weights vs PyTorch", prefix);
        t_close(what, f.topk_w, r_w, (long)N * K, 1e-6f, 1e-5f);
        /* layer output: two chained fp32 GEMMs (inner sizes 64 and 32) on values of size ~1 */
        snprintf(what, sizeof what, "%s: MoE output vs PyTorch", prefix);
        t_close(what, f.out, r_out, (long)N * H, 2e-5f, 1e-4f);

        /* aux over two layers: this one and the given second-layer logits */
        float *p2 = fnew((long)N * E), *w2 = fnew((long)N * K), *counts = fnew(E), *psum = fnew(E);
        int *ids2 = inew((long)N * K);
        router_topk_forward(p2, ids2, w2, NULL, l2, N, E, K, norm);
        moe_aux_accumulate(counts, psum, f.probs, f.ids, N, E, K);
        moe_aux_accumulate(counts, psum, p2, ids2, N, E, K);
        float aux = moe_aux_loss(counts, psum, E, 2 * (int64_t)N);
        /* fp32 probabilities summed over 64 rows: ~1e-6 relative */
        CHECK(fabsf(aux - r_aux[0]) <= 1e-5f * fabsf(r_aux[0]), "%s: aux %.9g, PyTorch %.9g", prefix, (double)aux,
              (double)r_aux[0]);

        float *dprobs = fnew((long)N * E), *dx = fnew((long)N * H), *dWr = fnew((long)E * H);
        float *dWgu = fnew((long)E * 2 * I * H), *dWd = fnew((long)E * H * I);
        moe_aux_backward(dprobs, counts, N, E, 2 * (int64_t)N, coef[0]);
        fused_backward(&f, dx, dWr, dWgu, dWd, NULL, dout, dprobs);
        {
            /* the production schedule's kernels on the same routing (team of 2 threads): gather
             * fused into the gate_up GEMM, unpermute backward into the down backward */
            const int M = N * K;
            float *gu = fnew((long)M * 2 * I), *act = fnew((long)M * I), *y = fnew((long)M * H), *out = fnew((long)N * H);
            float *dact = fnew((long)M * I), *dgu = fnew((long)M * 2 * I), *dperm = fnew((long)M * H);
            float *pdx = fnew((long)N * H), *pdWgu = fnew((long)E * 2 * I * H), *pdWd = fnew((long)E * H * I);
            float *dtw = fnew(M), *dlog = fnew((long)N * E), *pdWr = fnew((long)E * H);
            grouped_fuse ff = {0}, fb = {0}, fg = {0};
            ff.gather_x = x; ff.sorted_row = f.sorted_row; ff.n_tokens = N; ff.swiglu_act = act;
            fb.gather_dout = dout; fb.topk_w = f.topk_w; fb.topk_k = K; fb.sorted_row = f.sorted_row; fb.n_tokens = N;
            fb.swiglu_dgate_up = dgu; fb.swiglu_gate_up = gu;
            fg.gather_x = x; fg.sorted_row = f.sorted_row; fg.n_tokens = N;
#pragma omp parallel num_threads(2)
            {
                grouped_gemm_forward_team(gu, NULL, Wgu, f.off, E, H, 2 * I, &ff);
                grouped_gemm_forward_team(y, act, Wd, f.off, E, I, H, NULL);
            }
            moe_unpermute_forward(out, y, f.topk_w, f.pos, N, K, H);
            moe_unpermute_backward(NULL, dtw, dout, y, f.topk_w, f.pos, N, K, H);
#pragma omp parallel num_threads(2)
            {
                grouped_gemm_backward_team(dact, pdWd, NULL, act, Wd, f.off, E, I, H, &fb);
                grouped_gemm_backward_team(dperm, pdWgu, dgu, NULL, Wgu, f.off, E, H, 2 * I, &fg);
            }
            moe_permute_backward(pdx, dperm, f.sorted_row, N, M, H);
            router_topk_backward(dlog, dtw, dprobs, f.probs, f.ids, N, E, K, norm);
            linear_backward(pdx, pdWr, dlog, x, Wr, N, H, E, 1);
            /* tolerances as for the stage-by-stage pipeline above (same products, other order) */
            snprintf(what, sizeof what, "%s: production kernels: output vs PyTorch", prefix);
            t_close(what, out, r_out, (long)N * H, 2e-5f, 1e-4f);
            snprintf(what, sizeof what, "%s: production kernels", prefix);
            parity_grads(what, pdx, r_dx, pdWr, r_dWr, pdWgu, r_dWgu, pdWd, r_dWd, N, H, E, I);
            free(gu); free(act); free(y); free(out); free(dact); free(dgu); free(dperm); free(pdx); free(pdWgu);
            free(pdWd); free(dtw); free(dlog); free(pdWr);
        }
        parity_grads(prefix, dx, r_dx, dWr, r_dWr, dWgu, r_dWgu, dWd, r_dWd, N, H, E, I);
        free(p2); free(w2); free(counts); free(psum); free(ids2); free(dprobs); free(dx); free(dWr); free(dWgu);
        free(dWd);
        fused_free(&f);
    }
done:
    free(x); free(Wr); free(Wgu); free(Wd); free(dout); free(l2); free(coef); free(r_logits); free(r_probs); free(r_w);
    free(r_out); free(r_aux); free(r_dx); free(r_dWr); free(r_dWgu); free(r_dWd);
#undef NAME
}

static void test_pytorch_parity(void) {
    const char *dir = getenv("MOERL_TESTDATA");
    if (!dir || !*dir) dir = "build/testdata";
    char path[1024];
    snprintf(path, sizeof path, "%s/moe_kernels.safetensors", dir);
    st_file sf;
    int rc = st_open(&sf, path);
    CHECK(rc == MOERL_OK, "cannot open the PyTorch reference (run tests/ref/gen_moe_kernels.py %s): %s", dir,
          moerl_last_error());
    if (rc != MOERL_OK) return;
    parity_case(&sf, "norm1/", 1);
    parity_case(&sf, "norm0/", 0);
    parity_case(&sf, "odd/", 1);
    st_close(&sf);
}

int main(void) {
    test_router_ties();
    for (int norm = 0; norm <= 1; norm++)
        for (int extra = 0; extra <= 1; extra++) test_router_fd(norm, extra);
    test_aux_balanced();
    test_aux_fd();
    test_permute();
    test_permute_large();
    test_unpermute();
    test_grouped_gemm();
    test_tiled_gemm();
    test_team_vs_naive();
    test_fused_vs_naive();
    test_layer_fd(1);
    test_layer_fd(0);
    test_pytorch_parity();
    TEST_MAIN_END();
}
