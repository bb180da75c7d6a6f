/* MoE router: softmax over experts, top-k selection, optional renormalisation, and the
 * load-balancing auxiliary loss — forward and backward, fp32 on the CPU.
 *
 * Semantics follow HF Qwen3MoeSparseMoeBlock (router) and HF load_balancing_loss_func (aux):
 *   p[t,:] = softmax(logits[t,:])                       (fp32, over all E experts)
 *   ids[t,:] = the K largest p[t,e], descending, ties to the lower expert id
 *   w[t,j]  = p[t,ids[t,j]]  (/ Σ_j p[t,ids[t,j]]  when norm_topk_prob)
 *   aux     = E · Σ_e f_e · P̄_e,  f_e = counts[e]/(L·N),  P̄_e = Σ_rows p[:,e]/(L·N)
 * row_idx is the k-major expanded row of each (token, slot), as the Ascend gating op
 * (npu_moe_gating_top_k_softmax) emits it for the routing stage to reuse.
 * Contract and shapes: src/kernels/kernels.h.
 */
#include "base/common.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/kpar.h"

/* Rows below this many probabilities are done on one thread (a parallel region costs more). */
#define ROUTER_PAR_MIN_ELEMS 16384

/* One row of softmax + top-k. vals is scratch for K ordering keys. */
static void router_row(float *p, int *ids, float *w, const float *l, int E, int K, int norm) {
    float mx = l[0];
    for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    float s = 0.0f;
    for (int e = 0; e < E; e++) {
        p[e] = expf(l[e] - mx);
        s += p[e];
    }
    const float inv = 1.0f / s;
    for (int e = 0; e < E; e++) p[e] *= inv;

    /* Insertion into a descending list of K (key, id). Keys: probabilities lie in [0, 1];
     * a NaN sorts below every number (key −0.5) and the empty slot is −1, so the K ids are
     * always valid and distinct. Strict comparisons keep the earlier (lower) id ahead on ties. */
    float *key = w; /* topk_w row doubles as key storage; overwritten with weights below */
    for (int j = 0; j < K; j++) { key[j] = -1.0f; ids[j] = -1; }
    for (int e = 0; e < E; e++) {
        float v = p[e];
        if (v != v) v = -0.5f;
        if (!(v > key[K - 1])) continue;
        int i = K - 1;
        while (i > 0 && key[i - 1] < v) {
            key[i] = key[i - 1];
            ids[i] = ids[i - 1];
            i--;
        }
        key[i] = v;
        ids[i] = e;
    }
    float ws = 0.0f;
    for (int j = 0; j < K; j++) {
        w[j] = p[ids[j]];
        ws += w[j];
    }
    if (norm)
        for (int j = 0; j < K; j++) w[j] /= ws;
}

/* Softmax + top-k + optional renormalisation. See kernels.h for shapes.
 * Source: HF Qwen3MoeSparseMoeBlock.forward (softmax in fp32, torch.topk, routing_weights /=
 * sum); row_idx as Ascend npu_moe_gating_top_k_softmax. Errors: K outside [1, E] is a
 * caller bug (asserted). A NaN logit row yields NaN probabilities and still K valid ids. */
void router_topk_forward(float *probs, int *topk_ids, float *topk_w, int *row_idx, const float *logits,
                         int N, int E, int K, int norm_topk_prob) {
    MOERL_ASSERT(N >= 0 && E > 0 && K >= 1 && K <= E);
#pragma omp parallel for schedule(static) if (kpar((long)N * E, ROUTER_PAR_MIN_ELEMS))
    for (int t = 0; t < N; t++) router_topk_rows(probs, topk_ids, topk_w, row_idx, logits, t, t + 1, N, E, K, norm_topk_prob);
}

/* Rows [t0, t1) of router_topk_forward; row_idx is emitted in the same pass over the rows
 * (the gating op hands it to the permute, as Ascend's npu_moe_gating_top_k_softmax does). */
void router_topk_rows(float *probs, int *topk_ids, float *topk_w, int *row_idx, const float *logits, int t0,
                      int t1, int N, int E, int K, int norm_topk_prob) {
    MOERL_ASSERT(t0 >= 0 && t1 <= N && E > 0 && K >= 1 && K <= E);
    for (int t = t0; t < t1; t++) {
        router_row(probs + (size_t)t * E, topk_ids + (size_t)t * K, topk_w + (size_t)t * K,
                   logits + (size_t)t * E, E, K, norm_topk_prob);
        if (row_idx)
            for (int j = 0; j < K; j++) row_idx[(size_t)t * K + j] = j * N + t;
    }
}

/* Backward of router_topk_forward. dlogits[N,E] is OVERWRITTEN.
 * With norm_topk_prob, w_j = p_j / S (S = Σ_sel p): ∂L/∂p_i = (dw_i − Σ_j dw_j w_j) / S for
 * selected i; without it ∂L/∂p_i = dw_i. dprobs_extra (may be NULL) is added to every p, and
 * the softmax Jacobian gives dlogits_e = p_e (dp_e − Σ_f p_f dp_f). dtopk_w may be NULL
 * (only the aux term then). Source: the chain rule through HF Qwen3MoeSparseMoeBlock. */
void router_topk_backward(float *dlogits, const float *dtopk_w, const float *dprobs_extra,
                          const float *probs, const int *topk_ids, int N, int E, int K, int norm_topk_prob) {
    MOERL_ASSERT(N >= 0 && E > 0 && K >= 1 && K <= E);
#pragma omp parallel for schedule(static) if (kpar((long)N * E, ROUTER_PAR_MIN_ELEMS))
    for (int t = 0; t < N; t++) {
        const float *p = probs + (size_t)t * E;
        const int *ids = topk_ids + (size_t)t * K;
        float *dp = dlogits + (size_t)t * E; /* holds dprobs, then becomes dlogits in place */
        if (dprobs_extra) memcpy(dp, dprobs_extra + (size_t)t * E, (size_t)E * sizeof(float));
        else memset(dp, 0, (size_t)E * sizeof(float));
        if (dtopk_w) {
            const float *dw = dtopk_w + (size_t)t * K;
            if (norm_topk_prob) {
                float S = 0.0f, g = 0.0f;
                for (int j = 0; j < K; j++) S += p[ids[j]];
                for (int j = 0; j < K; j++) g += dw[j] * (p[ids[j]] / S);
                for (int j = 0; j < K; j++) dp[ids[j]] += (dw[j] - g) / S;
            } else {
                for (int j = 0; j < K; j++) dp[ids[j]] += dw[j];
            }
        }
        float dot = 0.0f;
        for (int e = 0; e < E; e++) dot += p[e] * dp[e];
        for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - dot);
    }
}

/* Accumulates one layer's statistics for the aux loss: counts[E] += top-k selections of e,
 * psum[E] += Σ_t probs[t,e] (summed in double per call). Source: HF load_balancing_loss_func
 * (expert_mask mean and routing_weights mean, before their product). Errors: an expert id
 * outside [0, E) is a caller bug (asserted). */
void moe_aux_accumulate(float *counts, float *psum, const float *probs, const int *topk_ids, int N, int E, int K) {
    MOERL_ASSERT(N >= 0 && E > 0 && K >= 1);
    for (long i = 0; i < (long)N * K; i++) {
        int e = topk_ids[i];
        MOERL_ASSERT(e >= 0 && e < E);
        counts[e] += 1.0f;
    }
    enum { CHUNK = 256 };
    double acc[CHUNK];
    for (int e0 = 0; e0 < E; e0 += CHUNK) {
        int n = MOERL_MIN(CHUNK, E - e0);
        for (int i = 0; i < n; i++) acc[i] = 0.0;
        for (int t = 0; t < N; t++) {
            const float *p = probs + (size_t)t * E + e0;
            for (int i = 0; i < n; i++) acc[i] += p[i];
        }
        for (int i = 0; i < n; i++) psum[e0 + i] += (float)acc[i];
    }
}

/* aux = E · Σ_e (counts[e]/R) · (psum[e]/R), R = total_rows = L·N (all MoE layers' tokens).
 * Perfect balance gives K. Source: HF load_balancing_loss_func (no attention mask). Errors:
 * total_rows ≤ 0 is a caller bug (asserted). */
float moe_aux_loss(const float *counts, const float *psum, int E, int64_t total_rows) {
    MOERL_ASSERT(E > 0 && total_rows > 0);
    const double R = (double)total_rows;
    double s = 0.0;
    for (int e = 0; e < E; e++) s += ((double)counts[e] / R) * ((double)psum[e] / R);
    return (float)(E * s);
}

/* dprobs[t,e] = coef · E · counts[e] / R² (OVERWRITTEN), R = L·N, for every row t of one
 * layer: the aux gradient flows only through the mean probability (counts come from top-k
 * and carry none). counts must be the totals over all layers (call after every layer's
 * moe_aux_accumulate). Source: derivative of HF load_balancing_loss_func. */
void moe_aux_backward(float *dprobs, const float *counts, int N, int E, int64_t total_rows, float coef) {
    MOERL_ASSERT(N >= 0 && E > 0 && total_rows > 0);
    const double R = (double)total_rows;
    const double scale = (double)coef * E / (R * R);
    if (N == 0) return;
    for (int e = 0; e < E; e++) dprobs[e] = (float)(scale * counts[e]);
    for (int t = 1; t < N; t++) memcpy(dprobs + (size_t)t * E, dprobs, (size_t)E * sizeof(float));
}
