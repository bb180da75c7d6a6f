/* Attention of new tokens against the KV cache (contract: kernels.h).
 *
 * Work item = (chunk, KV head). A chunk is a run of up to qb consecutive tokens of one sequence
 * at consecutive positions (a prefill chunk; a decode token is a chunk of one). Its T tokens ×
 * the G = nh/nkv query heads that share the KV head form the R = T·G rows of small dense
 * products, so each cached K/V row is read once per item rather than once per query row (GQA,
 * and query blocking in prefill). Keys are visited in blocks of KV_BK with the online softmax
 * (running max m, running sum l, output rescaled by e^{m_old − m_new} when the max grows;
 * Milakov & Gimelshein 2018, as FlashAttention / flash-decoding use it), so the scratch is a
 * few block-sized stack buffers: no allocation per call, any context length. Per key block:
 * Kᵀ is packed once ([hd][KV_BK]), S[R, nb] = Q·Kᵀ and O[R, hd] += P·V are register-tiled
 * products (vertical FMAs only, no per-score horizontal sums), causal masking touches only the
 * chunk's last block(s), and e^x is a vectorisable polynomial.
 * Small calls (batch-1 decode) run on the calling thread: a parallel region costs more than
 * the work, and far more when other processes hold the cores.
 * Paged (attention_kvcache_paged_forward): keys are found through the sequence's block table;
 * the arithmetic and its order are those of the slot layout, so both give the same bits.
 * Source: vLLM PagedAttention semantics (Kwon et al. 2023), FlashAttention-2's blocked forward
 * (Dao 2023) for the block structure.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/common.h"
#include "kernels/kernels.h"
#include "kernels/cpu/kpar.h"

/* Keys per block of the online softmax (a multiple of 16, the AVX-512 float width). */
#define KV_BK 64
/* Query rows (tokens × heads of one KV head) per work item, and the cap on rows × head_dim
 * (the packed queries and outputs live on the stack: 2 × 32 KB at most). */
#define KV_MAX_ROWS 64
#define KV_MAX_ROW_FLOATS 8192
/* Below this many multiply-adds (Σ_n (pos[n]+1)·nh·hd, for q·k and p·v each) the call stays
 * on one thread. */
#define KV_PAR_MIN_MACS 65536

#include "kernels/cpu/vexp.h"

/* One register tile: C[MR, NC] (= or +=) A[MR, Kd]·B[Kd, NC], all row-major (lda, ldb, ldc).
 * MR ≤ 8 and NC ≤ 32 are constants at every (inlined) call site, so the accumulators stay in
 * vector registers. */
static inline __attribute__((always_inline)) void kv_tile(const int MR, const int NC, int Kd,
                                                          const float *restrict A, long lda,
                                                          const float *restrict B, long ldb,
                                                          float *restrict C, long ldc, int accumulate) {
    float c[8][32];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NC; j++) c[r][j] = accumulate ? C[r * ldc + j] : 0.0f;
    for (int k = 0; k < Kd; k++) {
        const float *b = B + k * ldb;
        for (int r = 0; r < MR; r++) {
            const float a = A[r * lda + k];
            for (int j = 0; j < NC; j++) c[r][j] = KV_MADD(a, b[j], c[r][j]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NC; j++) C[r * ldc + j] = c[r][j];
}

/* MR rows of C[., Nc] (= or +=) A·B: 32- and 16-column tiles, then single columns. */
static inline __attribute__((always_inline)) void kv_rows(const int MR, int Nc, int Kd, const float *A, long lda,
                                                          const float *B, long ldb, float *C, long ldc,
                                                          int accumulate) {
    int j = 0;
    for (; j + 32 <= Nc; j += 32) kv_tile(MR, 32, Kd, A, lda, B + j, ldb, C + j, ldc, accumulate);
    for (; j + 16 <= Nc; j += 16) kv_tile(MR, 16, Kd, A, lda, B + j, ldb, C + j, ldc, accumulate);
    for (; j < Nc; j++)
        for (int r = 0; r < MR; r++) {
            float s = accumulate ? C[r * ldc + j] : 0.0f;
            for (int k = 0; k < Kd; k++) s = KV_MADD(A[r * lda + k], B[k * ldb + j], s);
            C[r * ldc + j] = s;
        }
}

/* C[M, Nc] (= or +=) A[M, Kd]·B[Kd, Nc], row-major: rows in groups of 8, 4, 2, 1. */
static void kv_matmul(int M, int Nc, int Kd, const float *A, long lda, const float *B, long ldb, float *C, long ldc,
                      int accumulate) {
    int i = 0;
    for (; i + 8 <= M; i += 8) kv_rows(8, Nc, Kd, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate);
    if (M - i >= 4) { kv_rows(4, Nc, Kd, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); i += 4; }
    if (M - i >= 2) { kv_rows(2, Nc, Kd, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); i += 2; }
    if (M - i >= 1) kv_rows(1, Nc, Kd, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate);
}

/* Where the K/V rows of one sequence and KV head live: position p at
 * base + (tbl[p / bs]·bs + p mod bs)·row (paged), or base + p·row when tbl is NULL (one
 * contiguous run, the slot layout). */
typedef struct {
    const float *k, *v; /* block 0 (paged) or the sequence's position 0 (contiguous), at this KV head */
    const int *tbl;
    int bs;
    long row;
} kv_view;

static inline long kv_off(const kv_view *w, int p) {
    return w->tbl ? ((long)w->tbl[p / w->bs] * w->bs + p % w->bs) * w->row : (long)p * w->row;
}

/* Whether positions p .. p+n−1 are consecutive rows in memory (contiguous layout, or their
 * blocks are adjacent ones in order). */
static inline int kv_contiguous(const kv_view *w, int p, int n) {
    if (!w->tbl) return 1;
    for (int b = p / w->bs + 1; b <= (p + n - 1) / w->bs; b++)
        if (w->tbl[b] != w->tbl[b - 1] + 1) return 0;
    return 1;
}

/* One work item: a chunk of T consecutive tokens of one sequence (positions p0 .. p0+T−1) and
 * one KV head, i.e. R = T·G query rows. Row r = t·G + g is token t's query head g; q/out point
 * at token 0's first head of this KV head, tokens tq floats apart. Token t sees keys 0 .. p0+t
 * (causal), so only the chunk's last key block(s) need masking. With T = 1 (decode) q and out
 * are used in place; otherwise the rows are packed into qp/op first. A key block's V rows are
 * read in place when they are contiguous in memory, else gathered into vg first: the same
 * values in the same order, so the result does not depend on the paging. */
static void attend_chunk(float *out, const float *q, long tq, const kv_view *w, int p0, int T, int G, int hd,
                         float scale) {
    const int R = T * G, P = p0 + T;
    const long row = w->row;
    float kt[hd * KV_BK]; /* Kᵀ of the block: [hd][KV_BK] */
    float s[R * KV_BK];   /* scores, then probabilities: [R][KV_BK] */
    float m[R], l[R];
    float qp[T > 1 ? R * hd : 1], op[T > 1 ? R * hd : 1];
    float vg[w->tbl ? KV_BK * hd : 1];
    const float *Q = q;
    float *O = out;
    if (T > 1) {
        for (int t = 0; t < T; t++) memcpy(qp + (long)t * G * hd, q + t * tq, (size_t)G * hd * sizeof(float));
        Q = qp;
        O = op;
    }
    for (int r = 0; r < R; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    memset(O, 0, (size_t)R * hd * sizeof(float));
    for (int j0 = 0; j0 < P; j0 += KV_BK) {
        const int nb = MOERL_MIN(KV_BK, P - j0), nbp = (nb + 15) & ~15;
        for (int j = 0; j < nb; j++) {
            const float *kj = w->k + kv_off(w, j0 + j);
            for (int d = 0; d < hd; d++) kt[d * KV_BK + j] = kj[d];
        }
        for (int d = 0; d < hd; d++)
            for (int j = nb; j < nbp; j++) kt[d * KV_BK + j] = 0.0f;
        kv_matmul(R, nbp, hd, Q, hd, kt, KV_BK, s, KV_BK, 0);
        for (int r = 0; r < R; r++) {
            float *sr = s + r * KV_BK;
            const int vis = MOERL_MIN(nb, p0 + r / G + 1 - j0); /* keys of this block row r sees */
            for (int j = MOERL_MAX(vis, 0); j < nb; j++) sr[j] = 0.0f;
            if (vis <= 0) continue;
            float mx = m[r];
#pragma omp simd reduction(max : mx)
            for (int j = 0; j < vis; j++) {
                sr[j] *= scale;
                mx = sr[j] > mx ? sr[j] : mx;
            }
            const float alpha = vexp_nonpos(m[r] - mx); /* 0 on the first block (m = −inf) */
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < vis; j++) {
                sr[j] = vexp_nonpos(sr[j] - mx);
                sum += sr[j];
            }
            l[r] = l[r] * alpha + sum;
            if (alpha != 1.0f) {
                float *orow = O + (long)r * hd;
#pragma omp simd
                for (int d = 0; d < hd; d++) orow[d] *= alpha;
            }
            m[r] = mx;
        }
        const long o0 = kv_off(w, j0);
        if (kv_contiguous(w, j0, nb)) {
            kv_matmul(R, hd, nb, s, KV_BK, w->v + o0, row, O, hd, 1);
        } else {
            for (int j = 0; j < nb; j++) memcpy(vg + (long)j * hd, w->v + kv_off(w, j0 + j), (size_t)hd * sizeof(float));
            kv_matmul(R, hd, nb, s, KV_BK, vg, hd, O, hd, 1);
        }
    }
    for (int r = 0; r < R; r++) {
        const float inv = 1.0f / l[r];
        float *orow = O + (long)r * hd;
#pragma omp simd
        for (int d = 0; d < hd; d++) orow[d] *= inv;
    }
    if (T > 1)
        for (int t = 0; t < T; t++) memcpy(out + t * tq, op + (long)t * G * hd, (size_t)G * hd * sizeof(float));
}

/* Both entry points: tables NULL = the slot layout (sequence s's run starts at s·span rows). */
static void kvcache_forward(float *out, const float *q, const float *k_cache, const float *v_cache,
                            const int *tables, int max_blocks, const int *seq, const int *pos, int N, int nh,
                            int nkv, int hd, int bs, int span, float scale) {
    MOERL_ASSERT(N >= 0 && nkv > 0 && nh % nkv == 0 && hd > 0);
    if (N == 0) return;
    const int G = nh / nkv;
    const long row = (long)nkv * hd;
    const int max_pos = tables ? max_blocks * bs : span;
    /* tokens per chunk: at most KV_MAX_ROWS query rows, and R·hd ≤ KV_MAX_ROW_FLOATS */
    const int qb = MOERL_MAX(1, MOERL_MIN(KV_MAX_ROWS, KV_MAX_ROW_FLOATS / hd) / G);
    /* Chunks: maximal runs of tokens of one sequence at consecutive positions, cut every qb tokens;
     * chunk c covers tokens start[c] .. start[c+1]−1 (N + 1 ints on the stack: N is one engine
     * step's token budget). */
    int start[N + 1], nc = 0;
    long macs = 0;
    for (int n = 0; n < N; n++) {
        MOERL_ASSERT(pos[n] >= 0 && pos[n] < max_pos);
        macs += (long)(pos[n] + 1) * nh * hd;
        const int cont = n > 0 && seq[n] == seq[n - 1] && pos[n] == pos[n - 1] + 1 && n - start[nc - 1] < qb;
        if (!cont) start[nc++] = n;
    }
    start[nc] = N;
    (void)macs; /* read only by the OpenMP pragma (unused in NO_OPENMP builds) */
#pragma omp parallel for schedule(dynamic, 1) collapse(2) if (kpar(macs, KV_PAR_MIN_MACS))
    for (int c = 0; c < nc; c++) {
        for (int kvh = 0; kvh < nkv; kvh++) {
            const int n0 = start[c];
            const long base = (tables ? 0 : (long)seq[n0] * span * row) + (long)kvh * hd;
            const kv_view w = {k_cache + base, v_cache + base, tables ? tables + (long)seq[n0] * max_blocks : NULL,
                               bs, row};
            const long qo = ((long)n0 * nh + (long)kvh * G) * hd;
            attend_chunk(out + qo, q + qo, (long)nh * hd, &w, pos[n0], start[c + 1] - n0, G, hd, scale);
        }
    }
}

void attention_kvcache_forward(float *out, const float *q, const float *k_cache, const float *v_cache,
                               const int *slot, const int *pos, int N, int nh, int nkv, int hd, int max_len,
                               float scale) {
    kvcache_forward(out, q, k_cache, v_cache, NULL, 0, slot, pos, N, nh, nkv, hd, max_len, max_len, scale);
}

void attention_kvcache_paged_forward(float *out, const float *q, const float *k_cache, const float *v_cache,
                                     const int *block_tables, int max_blocks, const int *seq, const int *pos, int N,
                                     int nh, int nkv, int hd, int block_size, float scale) {
    MOERL_ASSERT(block_tables && block_size > 0 && max_blocks > 0);
    kvcache_forward(out, q, k_cache, v_cache, block_tables, max_blocks, seq, pos, N, nh, nkv, hd, block_size, 0,
                    scale);
}
