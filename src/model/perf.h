/* Model FLOP counts and a measured matrix-multiply peak: the two halves of MFU (model FLOPs
 * utilisation = model FLOPs per second / peak FLOPs per second; PaLM, Chowdhery et al. 2022,
 * appendix B). perf/mfu = model_train_flops(...) / (step seconds · perf_sgemm_peak(...)). */
#ifndef MOERL_PERF_H
#define MOERL_PERF_H

#include <stdint.h>

#include "model/model.h"

/* Matrix-multiply weights one token passes through (the "active parameters" of an MoE): per
 * decoder layer q/k/v/o projections H·nh·hd + 2·H·nkv·hd + nh·hd·H; an MoE layer's router E·H
 * plus its K active experts K·3·H·I (gate, up, down); a dense layer 3·H·Id; plus the LM head
 * V·H. Left out: the embedding (a row lookup, no multiply), RMSNorm weights and the inactive
 * experts. */
int64_t model_active_matmul_params(const moe_config *c);

/* Causal attention score pairs of a packed batch: Σ_b T_b(T_b+1)/2 over the sequences
 * T_b = cu_seqlens[b+1] − cu_seqlens[b] (the query–key pairs the kernel computes). */
int64_t model_attention_pairs(const int *cu_seqlens, int B);

/* Training FLOPs (forward + backward) of `tokens` tokens whose causal attention covers `pairs`
 * score pairs:
 *     6 · P_active · tokens  +  12 · L · nh · hd · pairs
 * First term: 2 FLOPs (multiply + add) per weight per token forward, twice that backward (input
 * and weight gradients), P_active = model_active_matmul_params. Second term: per layer and
 * pair, q·k and p·v are 2·nh·hd FLOPs each forward (4·nh·hd), ×3 with backward; causal pairs
 * counted exactly rather than PaLM's 12·L·H·T per token for full (non-causal) attention.
 * Not counted: norms, softmax, SwiGLU, RoPE, the optimizer (elementwise, < 1% here) and
 * attention recomputation in the backward (FlashAttention-2 recomputes the scores: hardware
 * FLOPs, not model FLOPs). Forward-only (rollout/logprob) work is a third of each term. */
double model_train_flops(const moe_config *c, int64_t tokens, int64_t pairs);

/* One piece of model_train_flops: decoder layer l (0 ≤ l < L) — its projections, router and
 * K active experts (or dense MLP) and its attention pairs — or, for l = L, the LM head
 * (6·V·H·tokens). Σ over l = 0..L equals model_train_flops. The pipeline's stage balance
 * (src/parallel/pipeline.c) cuts the layers by these costs. */
double model_layer_train_flops(const moe_config *c, int l, int64_t tokens, int64_t pairs);

/* Measured single-precision matrix-multiply peak in FLOP/s of `threads` cores of this machine:
 * the best one-core rate of repeated cblas_sgemm calls on n×n matrices (n = 512; 2n³ FLOPs, a
 * few ms each) over about `seconds` (≥ 0.05; 0.3 is plenty), times `threads` (sgemm is compute
 * bound; the cores' FMA units add up). The best of short one-core calls is what a core reaches
 * between other processes' time slices, so contention at start does not lower it (a 0.3 s
 * two-thread measurement under load came out at half the machine's rate and put perf/mfu above
 * 1). OpenBLAS's thread count is restored. The MFU denominator: what this machine's BLAS
 * actually reaches, not a datasheet number; pass the threads the measured work runs on. */
double perf_sgemm_peak(double seconds, int threads);

#endif
