/* Packed variable-length causal attention with grouped-query heads (GQA), fp32, CPU.
 *
 * Math (per sequence b, query head h reading kv head h/(nh/nkv), query i, key j ≤ i):
 *   s_ij = scale · q_i·k_j          lse_i = log Σ_{j≤i} e^{s_ij}        p_ij = e^{s_ij − lse_i}
 *   out_i = Σ_j p_ij v_j
 *   backward: D_i = dout_i·out_i,  dp_ij = dout_i·v_j,  ds_ij = p_ij (dp_ij − D_i)
 *             dv_j = Σ_i p_ij dout_i,  dk_j = scale Σ_i ds_ij q_i,  dq_i = scale Σ_j ds_ij k_j
 * Source: HF eager_attention_forward (softmax(q·kᵀ·scale + causal mask) in fp32, repeat_kv for
 * GQA); the blocked forward with a running max / running sum and the backward that recomputes
 * p from the saved lse and uses D_i = rowsum(dout∘out) follow FlashAttention-2 (Dao, 2023).
 *
 * Blocking and threads:
 *  - forward: one task per (sequence, query head, block of ATT_BQ queries). A task walks the
 *    key blocks up to its diagonal with the FlashAttention-2 online softmax (running max m,
 *    running sum l, output rescaled when m grows), so memory is O(block²), not O(L²).
 *  - backward: one task per (sequence, query head). Key blocks are the outer loop, the query
 *    blocks at or below the diagonal the inner loop; a task owns its dq rows and accumulates
 *    dk/dv of its key block in a local buffer. With GQA (nh > nkv) several query heads feed one
 *    kv head, so each task writes its dk/dv into a per-query-head scratch [N, nh, hd], summed
 *    over the group afterwards in a fixed order: results do not depend on the thread count or
 *    the schedule (bit-for-bit deterministic).
 *  - tasks are handed out largest first (dynamic schedule), since causal cost grows with
 *    position and sequences differ in length.
 *  - the forward transposes k once per call ([nkv·hd][N]) so tasks read kᵀ blocks in place; the
 *    backward packs kᵀ and vᵀ of a key block once and reuses them for every query block.
 *  - every block product is one small dense product C (=|+=) A·B done by att_matmul, a
 *    register-tiled kernel (8 rows × 32 columns of accumulators) written so that the compiler
 *    vectorises it. Blocking over queries with small cblas_sgemm calls instead was measured on
 *    one core of the development machine (64×64×128 blocks): the tile kernel ran at about the
 *    speed of OpenBLAS 0.3.21 with OPENBLAS_CORETYPE=SkylakeX (~150 GFLOP/s, both noisy) and
 *    about 6× faster than the generic Prescott kernels that OpenBLAS falls back to when it does
 *    not recognise the CPU (as it does not on that machine); calling sgemm from OpenMP workers
 *    would also nest OpenBLAS's own threads. So the kernel does not depend on BLAS.
 *    Whole-op speed: bench/bench_attention.c.
 * Contract and shapes: src/kernels/kernels.h.
 */
#include "base/common.h"
#include "kernels/kernels.h"
#include "kernels/cpu/kpar.h"
#include "kernels/cpu/vexp.h"

#include <math.h>
#include <string.h>

#define ATT_BQ 64 /* queries per block */
#define ATT_BK 64 /* keys per block */
/* Below this many score elements (Σ_b L_b²/2 · nh) the work is done on one thread. */
#define ATT_PAR_MIN_SCORES 65536

/* Fused multiply-add when the target has it (one rounding, and the vectorised loop uses vfmadd);
 * plain multiply-add otherwise (fmaf would be a slow library call there). */
#ifdef __FMA__
#define ATT_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define ATT_MADD(a, b, c) ((a) * (b) + (c))
#endif

/* ------------------------------------------------------------------ small dense products */

/* One register tile: C[MR, NC] (= or +=) A[MR, Kd] · B[Kd, NC]. A element (r, k) is at
 * A[r·ars + k·acs] (so A may be a transposed view); B and C are row-major with leading
 * dimensions ldb, ldc. MR ≤ 8 and NC ≤ 32 are compile-time constants at every call site, so
 * the accumulators live in vector registers. */
static inline __attribute__((always_inline)) void att_tile(const int MR, const int NC, int Kd,
                                                           const float *restrict A, long ars, long acs,
                                                           const float *restrict B, long ldb,
                                                           float *restrict C, long ldc, int accumulate) {
    float c[8][32];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NC; j++) c[r][j] = accumulate ? C[r * ldc + j] : 0.0f;
    for (int k = 0; k < Kd; k++) {
        const float *b = B + k * ldb;
        for (int r = 0; r < MR; r++) {
            const float a = A[r * ars + k * acs];
            for (int j = 0; j < NC; j++) c[r][j] = ATT_MADD(a, b[j], c[r][j]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NC; j++) C[r * ldc + j] = c[r][j];
}

/* C[M, Nc] (= or += when accumulate) A[M, Kd] · B[Kd, Nc]; A element (i, k) at A[i·ars + k·acs],
 * B row-major (ldb), C row-major (ldc). Full 8×32 tiles, then 8×16, then whatever is left
 * one row at a time. */
static void att_matmul(int M, int Nc, int Kd, const float *A, long ars, long acs, const float *B, long ldb,
                       float *C, long ldc, int accumulate) {
    int j = 0;
    for (; j + 32 <= Nc; j += 32) {
        int i = 0;
        for (; i + 8 <= M; i += 8) att_tile(8, 32, Kd, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc, accumulate);
        for (; i < M; i++) att_tile(1, 32, Kd, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc, accumulate);
    }
    for (; j + 16 <= Nc; j += 16) {
        int i = 0;
        for (; i + 8 <= M; i += 8) att_tile(8, 16, Kd, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc, accumulate);
        for (; i < M; i++) att_tile(1, 16, Kd, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc, accumulate);
    }
    if (j == Nc) return;
    const int nrem = Nc - j;
    for (int i = 0; i < M; i++) {
        float c[16];
        float *crow = C + i * ldc + j;
        for (int jj = 0; jj < nrem; jj++) c[jj] = accumulate ? crow[jj] : 0.0f;
        for (int k = 0; k < Kd; k++) {
            const float a = A[i * ars + k * acs];
            const float *b = B + k * ldb + j;
            for (int jj = 0; jj < nrem; jj++) c[jj] = ATT_MADD(a, b[jj], c[jj]);
        }
        for (int jj = 0; jj < nrem; jj++) crow[jj] = c[jj];
    }
}


/* Copy rows [0, nk) of a strided [., hd] block (row stride ld) into dst[hd][ldd], transposed:
 * dst[d·ldd + j] = src[j·ld + d]. */
static void att_pack_transposed(float *restrict dst, long ldd, const float *restrict src, long ld, int nk, int hd) {
    for (int jj = 0; jj < nk; jj++) {
        const float *row = src + jj * ld;
        for (int d = 0; d < hd; d++) dst[d * ldd + jj] = row[d];
    }
}

/* Leading dimension of the transposed key matrix [nkv·hd][ldkt]: N rounded up to 16 floats, plus
 * 16 so that consecutive rows do not fall on the same cache sets when N is a power of two. */
static long att_ldkt(int N) { return ((long)N + 15) / 16 * 16 + 16; }

/* ------------------------------------------------------------------ task lists */

typedef struct {
    int b, h, blk; /* sequence, query head, query block (forward only) */
    long cost;     /* work estimate; tasks run largest first */
} att_task;

static int att_task_cmp(const void *pa, const void *pb) {
    const att_task *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    if (a->b != b->b) return a->b - b->b;
    if (a->h != b->h) return a->h - b->h;
    return a->blk - b->blk;
}

/* Internal invariants of the arguments (a packed batch from moerl's batch builder). Returns the
 * longest sequence and Σ_b L_b·(L_b+1)/2 (causal score count of one head). */
static int att_check_args(const int *cu_seqlens, int B, int N, int nh, int nkv, int hd, long *scores) {
    MOERL_ASSERT(B >= 0 && N >= 0 && nh > 0 && nkv > 0 && hd > 0);
    MOERL_ASSERT(nh % nkv == 0);
    MOERL_ASSERT(cu_seqlens[0] == 0 && cu_seqlens[B] == N);
    int maxL = 0;
    long s = 0;
    for (int b = 0; b < B; b++) {
        const int L = cu_seqlens[b + 1] - cu_seqlens[b];
        MOERL_ASSERT(L >= 0);
        maxL = MOERL_MAX(maxL, L);
        s += (long)L * (L + 1) / 2;
    }
    *scores = s;
    return maxL;
}

/* ------------------------------------------------------------------ forward */

/* Per-thread scratch of the forward. */
typedef struct {
    float *s;  /* [ATT_BQ][ATT_BK]  scores, then probabilities */
    float *o;  /* [ATT_BQ][hd]  unnormalised output accumulator */
    float m[ATT_BQ], l[ATT_BQ]; /* running max and running sum per query row */
} att_fwd_scratch;

/* One forward task. kt is k transposed once for all tasks: [nkv·hd][ldkt], column = token. */
static void att_forward_block(att_fwd_scratch *ws, float *out, float *lse, const float *q, const float *kt, long ldkt,
                              const float *v, const int *cu_seqlens, int N, int nh, int nkv, int hd, float scale,
                              const att_task *t) {
    const int s0 = cu_seqlens[t->b], L = cu_seqlens[t->b + 1] - s0;
    const int i0 = t->blk * ATT_BQ, nq = MOERL_MIN(ATT_BQ, L - i0);
    const int kvh = t->h / (nh / nkv);
    const long ldq = (long)nh * hd, ldkv = (long)nkv * hd;
    const float *Q = q + (s0 + i0) * ldq + (long)t->h * hd;
    float *S = ws->s, *O = ws->o, *m = ws->m, *l = ws->l;

    memset(O, 0, (size_t)nq * hd * sizeof(float));
    for (int r = 0; r < nq; r++) { m[r] = -INFINITY; l[r] = 0.0f; }

    const int kend = i0 + nq; /* keys [0, kend) are visible to some row of this block */
    for (int j0 = 0; j0 < kend; j0 += ATT_BK) {
        const int nk = MOERL_MIN(ATT_BK, kend - j0);
        const float *KTj = kt + (long)kvh * hd * ldkt + s0 + j0;
        const float *Vj = v + (s0 + j0) * ldkv + (long)kvh * hd;
        att_matmul(nq, nk, hd, Q, ldq, 1, KTj, ldkt, S, ATT_BK, 0); /* S = q·kᵀ (unscaled) */
        for (int r = 0; r < nq; r++) {
            float *row = S + r * ATT_BK;
            const int lim = MOERL_MAX(0, MOERL_MIN(nk, i0 + r - j0 + 1)); /* causal: keys j ≤ i */
            if (lim == 0) { memset(row, 0, (size_t)nk * sizeof(float)); continue; }
            float mx = -INFINITY;
            #pragma omp simd reduction(max : mx)
            for (int jj = 0; jj < lim; jj++) mx = row[jj] > mx ? row[jj] : mx;
            const float mnew = fmaxf(m[r], mx * scale); /* scale > 0: max(s·scale) = max(s)·scale */
            const float alpha = vexp_nonpos(m[r] - mnew);    /* 0 on the first block (m = −inf) */
            float sum = 0.0f;
            #pragma omp simd reduction(+ : sum)
            for (int jj = 0; jj < lim; jj++) {
                const float p = vexp_nonpos(row[jj] * scale - mnew);
                row[jj] = p;
                sum += p;
            }
            for (int jj = lim; jj < nk; jj++) row[jj] = 0.0f;
            l[r] = l[r] * alpha + sum;
            if (alpha != 1.0f) {
                float *orow = O + r * hd;
                for (int d = 0; d < hd; d++) orow[d] *= alpha;
            }
            m[r] = mnew;
        }
        att_matmul(nq, hd, nk, S, ATT_BK, 1, Vj, ldkv, O, hd, 1); /* O += p·v */
    }
    for (int r = 0; r < nq; r++) {
        const float inv = 1.0f / l[r];
        float *orow = out + (s0 + i0 + r) * ldq + (long)t->h * hd;
        for (int d = 0; d < hd; d++) orow[d] = O[r * hd + d] * inv;
        lse[(long)t->h * N + s0 + i0 + r] = m[r] + logf(l[r]);
    }
}

void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const int *cu_seqlens, int B, int N, int nh, int nkv, int hd, float scale) {
    long scores;
    att_check_args(cu_seqlens, B, N, nh, nkv, hd, &scores);
    MOERL_ASSERT(scale > 0.0f);
    int ntask = 0;
    for (int b = 0; b < B; b++) ntask += (cu_seqlens[b + 1] - cu_seqlens[b] + ATT_BQ - 1) / ATT_BQ * nh;
    if (ntask == 0) return;
    att_task *tasks = xmalloc((size_t)ntask * sizeof *tasks);
    int nt = 0;
    for (int b = 0; b < B; b++) {
        const int L = cu_seqlens[b + 1] - cu_seqlens[b];
        for (int blk = 0; blk * ATT_BQ < L; blk++)
            for (int h = 0; h < nh; h++) {
                const long nq = MOERL_MIN(ATT_BQ, L - blk * ATT_BQ);
                tasks[nt++] = (att_task){b, h, blk, nq * (blk * ATT_BQ + nq)};
            }
    }
    qsort(tasks, ntask, sizeof *tasks, att_task_cmp);
    /* Keys transposed once ([nkv·hd][ldkt]) so that every task reads kᵀ blocks in place. */
    const long ldkt = att_ldkt(N), ldkv = (long)nkv * hd;
    float *kt = xalloc_aligned((size_t)nkv * hd * ldkt * sizeof(float));
    const int ntb = (N + ATT_BK - 1) / ATT_BK;

    #pragma omp parallel if (kpar(scores * nh, ATT_PAR_MIN_SCORES))
    {
        #pragma omp for schedule(static)
        for (int tb = 0; tb < ntb * nkv; tb++) {
            const int n0 = tb / nkv * ATT_BK, g = tb % nkv;
            att_pack_transposed(kt + (long)g * hd * ldkt + n0, ldkt, k + n0 * ldkv + (long)g * hd, ldkv,
                                MOERL_MIN(ATT_BK, N - n0), hd);
        }
        att_fwd_scratch ws;
        ws.s = xalloc_aligned((size_t)ATT_BQ * ATT_BK * sizeof(float));
        ws.o = xalloc_aligned((size_t)ATT_BQ * hd * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        for (int ti = 0; ti < ntask; ti++)
            att_forward_block(&ws, out, lse, q, kt, ldkt, v, cu_seqlens, N, nh, nkv, hd, scale, &tasks[ti]);
        free(ws.s);
        free(ws.o);
    }
    free(kt);
    free(tasks);
}

/* ------------------------------------------------------------------ backward */

/* Per-thread scratch of the backward. */
typedef struct {
    float *kt, *vt;  /* [hd][ATT_BK]  keys and values of the block, transposed */
    float *p, *ds;   /* [ATT_BQ][ATT_BK]  probabilities; dp, then ds·scale */
    float *dk, *dv;  /* [ATT_BK][hd]  gradient accumulators of the key block */
    float *D;        /* [maxL]  D_i = dout_i·out_i of the task's sequence and head */
} att_bwd_scratch;

static void att_backward_head(att_bwd_scratch *ws, float *dq, float *dk_dst, float *dv_dst, long lddst,
                              const float *dout, const float *q, const float *k, const float *v, const float *out,
                              const float *lse, const int *cu_seqlens, int N, int nh, int nkv, int hd, float scale,
                              const att_task *t) {
    const int s0 = cu_seqlens[t->b], L = cu_seqlens[t->b + 1] - s0, h = t->h;
    const int kvh = h / (nh / nkv);
    const long ldq = (long)nh * hd, ldkv = (long)nkv * hd;
    const long qoff = s0 * ldq + (long)h * hd; /* first row of this sequence and head in q/dq/out/dout */
    const float *lse_h = lse + (long)h * N + s0;
    float *P = ws->p, *dS = ws->ds, *D = ws->D;

    for (int i = 0; i < L; i++) {
        const float *o = out + qoff + i * ldq, *g = dout + qoff + i * ldq;
        float s = 0.0f;
        #pragma omp simd reduction(+ : s)
        for (int d = 0; d < hd; d++) s += o[d] * g[d];
        D[i] = s;
        memset(dq + qoff + i * ldq, 0, (size_t)hd * sizeof(float));
    }

    for (int j0 = 0; j0 < L; j0 += ATT_BK) {
        const int nk = MOERL_MIN(ATT_BK, L - j0);
        const float *Kj = k + (s0 + j0) * ldkv + (long)kvh * hd;
        const float *Vj = v + (s0 + j0) * ldkv + (long)kvh * hd;
        att_pack_transposed(ws->kt, ATT_BK, Kj, ldkv, nk, hd);
        att_pack_transposed(ws->vt, ATT_BK, Vj, ldkv, nk, hd);
        memset(ws->dk, 0, (size_t)nk * hd * sizeof(float));
        memset(ws->dv, 0, (size_t)nk * hd * sizeof(float));
        for (int i0 = j0 / ATT_BQ * ATT_BQ; i0 < L; i0 += ATT_BQ) {
            const int nq = MOERL_MIN(ATT_BQ, L - i0);
            const float *Qi = q + qoff + i0 * ldq, *dOi = dout + qoff + i0 * ldq;
            att_matmul(nq, nk, hd, Qi, ldq, 1, ws->kt, ATT_BK, P, ATT_BK, 0);   /* q·kᵀ */
            att_matmul(nq, nk, hd, dOi, ldq, 1, ws->vt, ATT_BK, dS, ATT_BK, 0); /* dp = dout·vᵀ */
            for (int r = 0; r < nq; r++) {
                float *prow = P + r * ATT_BK, *srow = dS + r * ATT_BK;
                const int lim = MOERL_MAX(0, MOERL_MIN(nk, i0 + r - j0 + 1));
                const float lse_i = lse_h[i0 + r], D_i = D[i0 + r];
                #pragma omp simd
                for (int jj = 0; jj < lim; jj++) {
                    const float p = vexp_nonpos(prow[jj] * scale - lse_i);
                    prow[jj] = p;
                    srow[jj] = p * (srow[jj] - D_i) * scale;
                }
                for (int jj = lim; jj < nk; jj++) { prow[jj] = 0.0f; srow[jj] = 0.0f; }
            }
            att_matmul(nk, hd, nq, P, 1, ATT_BK, dOi, ldq, ws->dv, hd, 1);   /* dv += pᵀ·dout */
            att_matmul(nk, hd, nq, dS, 1, ATT_BK, Qi, ldq, ws->dk, hd, 1);   /* dk += dsᵀ·q */
            att_matmul(nq, hd, nk, dS, ATT_BK, 1, Kj, ldkv, dq + qoff + i0 * ldq, ldq, 1); /* dq += ds·k */
        }
        for (int jj = 0; jj < nk; jj++) {
            memcpy(dk_dst + (s0 + j0 + jj) * lddst, ws->dk + jj * hd, (size_t)hd * sizeof(float));
            memcpy(dv_dst + (s0 + j0 + jj) * lddst, ws->dv + jj * hd, (size_t)hd * sizeof(float));
        }
    }
}

void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                        const float *k, const float *v, const float *out, const float *lse,
                        const int *cu_seqlens, int B, int N, int nh, int nkv, int hd, float scale) {
    long scores;
    const int maxL = att_check_args(cu_seqlens, B, N, nh, nkv, hd, &scores);
    MOERL_ASSERT(scale > 0.0f);
    const int G = nh / nkv;
    /* dk/dv of each task go to a per-query-head scratch when G > 1, straight to dk/dv otherwise. */
    float *dkh = dk, *dvh = dv;
    if (G > 1 && N > 0) {
        dkh = xmalloc((size_t)N * nh * hd * sizeof(float));
        dvh = xmalloc((size_t)N * nh * hd * sizeof(float));
    }
    int ntask = 0;
    att_task *tasks = xmalloc((size_t)MOERL_MAX(1, B * nh) * sizeof *tasks);
    for (int b = 0; b < B; b++) {
        const long L = cu_seqlens[b + 1] - cu_seqlens[b];
        if (L == 0) continue;
        for (int h = 0; h < nh; h++) tasks[ntask++] = (att_task){b, h, 0, L * L};
    }
    qsort(tasks, ntask, sizeof *tasks, att_task_cmp);
    const int par = kpar(scores * nh, ATT_PAR_MIN_SCORES);
    (void)par; /* read only by the OpenMP pragmas (unused in NO_OPENMP builds) */

    #pragma omp parallel if (par)
    {
        att_bwd_scratch ws;
        ws.kt = xalloc_aligned((size_t)hd * ATT_BK * sizeof(float));
        ws.vt = xalloc_aligned((size_t)hd * ATT_BK * sizeof(float));
        ws.p = xalloc_aligned((size_t)ATT_BQ * ATT_BK * sizeof(float));
        ws.ds = xalloc_aligned((size_t)ATT_BQ * ATT_BK * sizeof(float));
        ws.dk = xalloc_aligned((size_t)ATT_BK * hd * sizeof(float));
        ws.dv = xalloc_aligned((size_t)ATT_BK * hd * sizeof(float));
        ws.D = xalloc_aligned((size_t)MOERL_MAX(1, maxL) * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        for (int ti = 0; ti < ntask; ti++) {
            const att_task *t = &tasks[ti];
            /* destination rows: column block of head h in the scratch, or of kv head h (G == 1) */
            const long lddst = G > 1 ? (long)nh * hd : (long)nkv * hd;
            float *dkd = dkh + (long)t->h * hd, *dvd = dvh + (long)t->h * hd;
            att_backward_head(&ws, dq, dkd, dvd, lddst, dout, q, k, v, out, lse, cu_seqlens, N, nh, nkv, hd,
                              scale, t);
        }
        free(ws.kt);
        free(ws.vt);
        free(ws.p);
        free(ws.ds);
        free(ws.dk);
        free(ws.dv);
        free(ws.D);

        if (G > 1) {
            /* dk[n, g] = Σ_{h in group g} dkh[n, h], summed in head order. */
            #pragma omp for schedule(static)
            for (int n = 0; n < N; n++)
                for (int g = 0; g < nkv; g++) {
                    float *dkr = dk + ((long)n * nkv + g) * hd, *dvr = dv + ((long)n * nkv + g) * hd;
                    const float *sk = dkh + ((long)n * nh + (long)g * G) * hd;
                    const float *sv = dvh + ((long)n * nh + (long)g * G) * hd;
                    memcpy(dkr, sk, (size_t)hd * sizeof(float));
                    memcpy(dvr, sv, (size_t)hd * sizeof(float));
                    for (int r = 1; r < G; r++)
                        for (int d = 0; d < hd; d++) {
                            dkr[d] += sk[(long)r * hd + d];
                            dvr[d] += sv[(long)r * hd + d];
                        }
                }
        }
    }
    free(tasks);
    if (dkh != dk) {
        free(dkh);
        free(dvh);
    }
}
