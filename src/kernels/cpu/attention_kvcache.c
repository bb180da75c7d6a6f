/* Attention of new tokens against the KV cache (contract: kernels.h).
 *
 * One work item = one (token, KV head): the `group` = nh/nkv query heads that share a KV head
 * are processed together, so each cached K/V row is read once per group rather than once per
 * query head (GQA). Keys are visited in blocks of ATTN_KV_BLOCK with an online softmax
 * (running max m, running sum l, output rescaled by e^{m_old − m_new} when the max grows;
 * Milakov & Gimelshein 2018, as FlashAttention/flash-decoding use it), so the scores need only
 * a block-sized stack buffer: no allocation per call, any context length.
 * The output rows of one item's heads are contiguous in out[n, nh, hd] and serve as the
 * accumulator. Small calls (batch-1 decode) run on the calling thread: a parallel region
 * costs more than the work, and far more when other processes hold the cores.
 */
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "kernels/kernels.h"

/* Keys per block of the online softmax (scores kept on the stack: group × block floats). */
#define ATTN_KV_BLOCK 64
/* Below this many multiply-adds (Σ_n (pos[n]+1)·nh·hd, for q·k and p·v each) the call stays
 * on one thread. */
#define ATTN_KV_PAR_MIN_MACS 65536

/* One item: token n's query heads h0 .. h0+G−1 (all of KV head kvh) against positions 0..P−1
 * of its slot. kb/vb point at position 0 of KV head kvh; rows are `row` floats apart. */
static void attend_group(float *o, const float *qh, const float *kb, const float *vb, size_t row, int P, int G,
                         int hd, float scale) {
    float sc[G][ATTN_KV_BLOCK];
    float m[G], l[G];
    for (int g = 0; g < G; g++) { m[g] = -INFINITY; l[g] = 0.0f; }
    memset(o, 0, (size_t)G * hd * sizeof(float));
    for (int j0 = 0; j0 < P; j0 += ATTN_KV_BLOCK) {
        const int nb = MOERL_MIN(ATTN_KV_BLOCK, P - j0);
        for (int g = 0; g < G; g++) {
            const float *qg = qh + (size_t)g * hd;
            float bmax = -INFINITY;
            for (int j = 0; j < nb; j++) {
                const float *kj = kb + (size_t)(j0 + j) * row;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int d = 0; d < hd; d++) s += qg[d] * kj[d];
                s *= scale;
                sc[g][j] = s;
                bmax = s > bmax ? s : bmax;
            }
            /* rescale what was accumulated so far when the running max grows */
            if (bmax > m[g]) {
                const float corr = expf(m[g] - bmax); /* 0 on the first block (m = −inf) */
                l[g] *= corr;
                float *og = o + (size_t)g * hd;
                if (corr != 1.0f)
#pragma omp simd
                    for (int d = 0; d < hd; d++) og[d] *= corr;
                m[g] = bmax;
            }
            float bs = 0.0f;
            for (int j = 0; j < nb; j++) {
                sc[g][j] = expf(sc[g][j] - m[g]);
                bs += sc[g][j];
            }
            l[g] += bs;
        }
        /* o_g += Σ_j p[g][j] · v_j: each V row read once for all G heads */
        for (int j = 0; j < nb; j++) {
            const float *vj = vb + (size_t)(j0 + j) * row;
            for (int g = 0; g < G; g++) {
                const float p = sc[g][j];
                float *og = o + (size_t)g * hd;
#pragma omp simd
                for (int d = 0; d < hd; d++) og[d] += p * vj[d];
            }
        }
    }
    for (int g = 0; g < G; g++) {
        const float inv = 1.0f / l[g];
        float *og = o + (size_t)g * hd;
#pragma omp simd
        for (int d = 0; d < hd; d++) og[d] *= inv;
    }
}

void attention_kvcache_forward(float *out, const float *q, const float *k_cache, const float *v_cache,
                               const int *slot, const int *pos, int N, int nh, int nkv, int hd, int max_len,
                               float scale) {
    MOERL_ASSERT(N >= 0 && nkv > 0 && nh % nkv == 0 && hd > 0);
    const int G = nh / nkv;
    const size_t row = (size_t)nkv * hd;
    long macs = 0;
    for (int n = 0; n < N; n++) {
        MOERL_ASSERT(pos[n] >= 0 && pos[n] < max_len);
        macs += (long)(pos[n] + 1) * nh * hd;
    }
#pragma omp parallel for schedule(dynamic, 1) collapse(2) if (macs >= ATTN_KV_PAR_MIN_MACS)
    for (int n = 0; n < N; n++) {
        for (int kvh = 0; kvh < nkv; kvh++) {
            const size_t base = (size_t)slot[n] * max_len * row + (size_t)kvh * hd;
            attend_group(out + ((size_t)n * nh + (size_t)kvh * G) * hd, q + ((size_t)n * nh + (size_t)kvh * G) * hd,
                         k_cache + base, v_cache + base, row, pos[n] + 1, G, hd, scale);
        }
    }
}
