/* The "NZ" switch: weights pre-packed at load into the panel layout of a skinny (decode-sized)
 * product, and the kernel that reads them.
 *
 * Layout: W[O, I] (PyTorch [out, in]) → P[⌈O/16⌉][I][16], P[b][i][l] = W[16b + l, i], zero past
 * O. A panel holds 16 consecutive outputs; the kernel walks it once, i ascending, and for each i
 * multiplies the 16 weights by the broadcast input of every row: out[r, 16b + l] accumulates in
 * lane l of a vector register, so there is no horizontal sum and the weights are one contiguous
 * stream. OpenBLAS has no public packed-B sgemm (0.3.21's cblas.h declares none; MKL's
 * cblas_sgemm_pack is not available), so the packing is moerl's own and serves the skinny
 * kernel only; larger row counts use cblas_sgemm on the unpacked weights (which packs them
 * itself, per call). The analogue of Ascend's NZ (fractal) weight format, converted once at
 * weight load instead of per call.
 */
#include "base/common.h"
#include "kernels/kernels.h"

#include <string.h>

#define NZ_W 16 /* outputs per panel */

typedef float v8f __attribute__((vector_size(32)));

size_t gemm_packed_size(int O, int I) { return (size_t)((O + NZ_W - 1) / NZ_W) * NZ_W * (size_t)I; }

void gemm_packed_pack(float *P, const float *W, int O, int I) {
    MOERL_ASSERT(O >= 0 && I >= 0);
    const int nb = (O + NZ_W - 1) / NZ_W;
    for (int b = 0; b < nb; b++) {
        float *pb = P + (size_t)b * I * NZ_W;
        const int lanes = MOERL_MIN(NZ_W, O - b * NZ_W);
        for (int i = 0; i < I; i++) {
            float *d = pb + (size_t)i * NZ_W;
            for (int l = 0; l < lanes; l++) d[l] = W[(size_t)(b * NZ_W + l) * I + i];
            for (int l = lanes; l < NZ_W; l++) d[l] = 0.0f;
        }
    }
}

static inline v8f v8_load(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Up to 4 rows against one panel: acc[r] lanes 0..15 = Σ_i rows[r][i]·pb[i][0..15]. */
static inline void panel_rows(float out[4][NZ_W], const float *const *rows, int nr, const float *pb, int I) {
    v8f a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, c0 = {0}, c1 = {0}, d0 = {0}, d1 = {0};
    const float *x0 = rows[0], *x1 = nr > 1 ? rows[1] : rows[0], *x2 = nr > 2 ? rows[2] : rows[0],
                *x3 = nr > 3 ? rows[3] : rows[0];
    for (int i = 0; i < I; i++) {
        const v8f w0 = v8_load(pb + (size_t)i * NZ_W), w1 = v8_load(pb + (size_t)i * NZ_W + 8);
        a0 += x0[i] * w0;
        a1 += x0[i] * w1;
        if (nr > 1) { b0 += x1[i] * w0; b1 += x1[i] * w1; }
        if (nr > 2) { c0 += x2[i] * w0; c1 += x2[i] * w1; }
        if (nr > 3) { d0 += x3[i] * w0; d1 += x3[i] * w1; }
    }
    memcpy(out[0], &a0, sizeof a0); memcpy(out[0] + 8, &a1, sizeof a1);
    memcpy(out[1], &b0, sizeof b0); memcpy(out[1] + 8, &b1, sizeof b1);
    memcpy(out[2], &c0, sizeof c0); memcpy(out[2] + 8, &c1, sizeof c1);
    memcpy(out[3], &d0, sizeof d0); memcpy(out[3] + 8, &d1, sizeof d1);
}

/* out[r, o - o0] for o in [o0, o1): see kernels.h. The row-count branches inside the i loop are
 * loop-invariant (the compiler unswitches them); each lane's sum runs i ascending in one
 * accumulator whatever the number of rows, so results do not depend on the batch. */
void gemm_packed_nt_rows(float *out, int ldo, const float *const *rows, const float *P, int m, int I, int o0,
                         int o1) {
    MOERL_ASSERT(m >= 0 && I >= 0 && o0 >= 0 && o0 % NZ_W == 0 && o1 >= o0);
    float acc[4][NZ_W];
    for (int o = o0; o < o1; o += NZ_W) {
        const float *pb = P + (size_t)(o / NZ_W) * I * NZ_W;
        const int lanes = MOERL_MIN(NZ_W, o1 - o);
        for (int r0 = 0; r0 < m; r0 += 4) {
            const int nr = MOERL_MIN(4, m - r0);
            switch (nr) { /* one instantiation per row count keeps the accumulators in registers */
            case 1: panel_rows(acc, rows + r0, 1, pb, I); break;
            case 2: panel_rows(acc, rows + r0, 2, pb, I); break;
            case 3: panel_rows(acc, rows + r0, 3, pb, I); break;
            default: panel_rows(acc, rows + r0, 4, pb, I); break;
            }
            for (int r = 0; r < nr; r++) memcpy(out + (size_t)(r0 + r) * ldo + (o - o0), acc[r], (size_t)lanes * sizeof(float));
        }
    }
}
