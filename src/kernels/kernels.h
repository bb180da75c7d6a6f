/* moerl kernels — the math of Qwen3-MoE, each op with forward and backward (fp32, CPU).
 *
 * Conventions (llm.c style):
 *  - Row-major, contiguous. Letters: N tokens (packed, all sequences of a batch), H hidden,
 *    nh query heads, nkv key/value heads, hd head_dim, E experts, K top-k, I expert
 *    intermediate size, V vocab, B sequences, M = N*K routed rows.
 *  - Linear weights are [out, in] as in PyTorch/HF: y = x · Wᵀ.
 *  - Backward functions ACCUMULATE (+=) into parameter gradients (dW, dw) so micro-batches
 *    sum; input gradients (dx) are OVERWRITTEN (=) unless the docstring says "accumulates".
 *  - Every kernel has a naive reference in the tests; fast paths are checked against it.
 * Threading: kernels use OpenMP over rows/heads/experts and OpenBLAS for GEMMs.
 */
#ifndef MOERL_KERNELS_H
#define MOERL_KERNELS_H

#include <stdint.h>

/* ---------------------------------------------------------------- linear (OpenBLAS) */

/* out[N,O] = x[N,I] · W[O,I]ᵀ   (accumulate: out += ... when accumulate != 0). */
void linear_forward(float *out, const float *x, const float *W, int N, int I, int O, int accumulate);
/* Skinny product for decode-sized row counts: out[r, o] (= or +=) Σ_i a[r, i]·W[o, i] for r < m,
 * o < O, with out's row stride ldo. Reads W once (one pass over its rows, each dotted with the m
 * rows of a, which stay in cache), so small batches run at memory bandwidth instead of paying
 * BLAS's packing of W per call. Each output element is the same fixed-order dot product whatever
 * m is (batch-invariant). Single-threaded; callers parallelise over experts/rows. */
void gemm_skinny_nt(float *out, int ldo, const float *a, const float *W, int m, int I, int O, int accumulate);
/* Row count up to which linear_forward and grouped_gemm_forward use gemm_skinny_nt. */
#define SKINNY_MAX_ROWS 16

/* dx[N,I] (= or += per accumulate_dx) = dout[N,O] · W[O,I];  dW[O,I] += doutᵀ · x.
 * dx or dW may be NULL to skip that product. */
void linear_backward(float *dx, float *dW, const float *dout, const float *x, const float *W,
                     int N, int I, int O, int accumulate_dx);

/* ---------------------------------------------------------------- RMSNorm (HF Qwen3RMSNorm) */

/* out[N,C] = w[C] * x / sqrt(mean(x²) + eps); rstd[N] = 1/sqrt(mean(x²)+eps) saved for backward.
 * out may alias x. Source: HF Qwen3MoeRMSNorm (no bias, no +1, fp32 statistics). */
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
/* dx[N,C] = (w∘dout)·rstd − x·rstd³·mean(w∘dout∘x)   (dx OVERWRITTEN unless accumulate_dx);
 * dw[C] += Σ_n dout∘x·rstd. dx may alias dout. */
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, int N, int C, int accumulate_dx);

/* ---------------------------------------------------------------- RoPE (NEOX / rotate_half) */

/* Precompute cos/sin tables [max_pos][hd/2]: inv_freq[i] = theta^(-2i/hd), angle = pos·inv_freq[i].
 * Source: HF Qwen3MoeRotaryEmbedding (default rope type). */
void rope_tables(float *cos_t, float *sin_t, int max_pos, int hd, float theta);
/* In place on x[N, nheads, hd]: for i < hd/2, (x_i, x_{i+hd/2}) rotated by the angle of
 * (pos[n], i): x_i' = x_i c − x_{i+d/2} s;  x_{i+d/2}' = x_{i+d/2} c + x_i s. */
void rope_forward(float *x, const int *pos, const float *cos_t, const float *sin_t, int N, int nheads, int hd);
/* In place on dx[N, nheads, hd]: the transpose (inverse) rotation. */
void rope_backward(float *dx, const int *pos, const float *cos_t, const float *sin_t, int N, int nheads, int hd);

/* ---------------------------------------------------------------- causal GQA attention, packed */

/* Packed variable-length causal attention (no padding).
 * q[N, nh, hd], k[N, nkv, hd], v[N, nkv, hd]; sequences are token ranges
 * [cu_seqlens[b], cu_seqlens[b+1]) for b < B; a token attends to tokens of its own sequence
 * at positions ≤ its own. Query head h reads kv head h / (nh/nkv).
 * out[N, nh, hd] = softmax(q·kᵀ·scale + causal) · v, computed in fp32;
 * lse[nh, N] (log-sum-exp of the scaled scores per query row) saved for backward.
 * scale is 1/sqrt(hd) for Qwen3. Source: HF eager_attention_forward / flash-attn varlen. */
void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const int *cu_seqlens, int B, int N, int nh, int nkv, int hd, float scale);
/* Gradients dq[N,nh,hd], dk[N,nkv,hd], dv[N,nkv,hd] (all OVERWRITTEN) from dout[N,nh,hd],
 * recomputing probabilities from lse (FlashAttention-2 backward, Dao 2023). */
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                        const float *k, const float *v, const float *out, const float *lse,
                        const int *cu_seqlens, int B, int N, int nh, int nkv, int hd, float scale);

/* Attention of N new tokens against a paged-by-slot KV cache (the rollout engine's decode and
 * prefill). Cache layout for one layer: k_cache/v_cache [slots][max_len][nkv·hd]. Token n
 * (query q[n, nh, hd]) belongs to sequence slot[n] at position pos[n]; its own K/V must already
 * be written at pos[n]; it attends to positions 0..pos[n] of its slot (causal).
 * out[N, nh, hd] = softmax(q·kᵀ·scale) · v in fp32. Source: vLLM paged attention semantics
 * with one page per slot; equals attention_forward on the same sequence. */
void attention_kvcache_forward(float *out, const float *q, const float *k_cache, const float *v_cache,
                               const int *slot, const int *pos, int N, int nh, int nkv, int hd, int max_len,
                               float scale);
/* The same over a paged KV cache (the engine's; vLLM's PagedAttention): one layer's cache is
 * k_cache/v_cache [n_blocks][block_size][nkv·hd]; token n belongs to sequence seq[n], whose block
 * table is block_tables[seq[n]·max_blocks ..] (position p lives in block table[p / block_size], row
 * p mod block_size; entries up to pos[n] / block_size must be valid blocks). Same arithmetic in the
 * same order as the slot layout (a block's V rows are gathered when not contiguous), so equal K/V
 * values give the same bits. */
void attention_kvcache_paged_forward(float *out, const float *q, const float *k_cache, const float *v_cache,
                                     const int *block_tables, int max_blocks, const int *seq, const int *pos, int N,
                                     int nh, int nkv, int hd, int block_size, float scale);

/* ---------------------------------------------------------------- SwiGLU */

/* gate_up[N, 2I] holds gate in columns [0,I) and up in [I,2I) (the stacked expert layout);
 * out[N, I] = silu(gate) * up, silu(g) = g·sigmoid(g).  Source: HF Qwen3MoeMLP. */
void swiglu_forward(float *out, const float *gate_up, int N, int I);
/* dgate_up[N, 2I] (OVERWRITTEN) from dout[N, I]. */
void swiglu_backward(float *dgate_up, const float *dout, const float *gate_up, int N, int I);

/* ---------------------------------------------------------------- LM-head log-probabilities */

/* For each row n: z = logits[n,:] / temperature; logp[n] = z[target[n]] − logsumexp(z);
 * optional entropy[n] = logsumexp(z) − Σ softmax(z)·z (NULL to skip); lse_out[n] = logsumexp(z)
 * (NULL to skip). Rows with target < 0 get logp = 0, entropy = 0.
 * Errors: a target ≥ V is a bug (asserted). Source: verl logprobs_from_logits / entropy_from_logits. */
void logprob_forward(float *logp, float *entropy, float *lse_out, const float *logits, const int *target,
                     int N, int V, float temperature);
/* dlogits[N,V] (OVERWRITTEN) = dlogp[n]·(onehot(target) − softmax(z))/T
 *                             + dentropy[n]·(−p∘(log p + H))/T   (dentropy may be NULL).
 * Rows with target < 0 get zero gradient from dlogp (entropy term still applies if given). */
void logprob_backward(float *dlogits, const float *dlogp, const float *dentropy, const float *logits,
                      const int *target, int N, int V, float temperature);

/* ---------------------------------------------------------------- MoE: router and top-k */

/* probs[N,E] = softmax(logits[N,E]) in fp32.
 * topk_ids[N,K]: the K largest probabilities per row, descending; ties go to the lower expert id.
 * topk_w[N,K]: their probabilities, divided by their sum when norm_topk_prob != 0.
 * row_idx[N,K]: row_idx[t*K + j] = j*N + t (k-major expanded row; made once, handed to permute).
 * Source: HF Qwen3MoeSparseMoeBlock; Ascend npu_moe_gating_top_k_softmax (row_idx). */
void router_topk_forward(float *probs, int *topk_ids, float *topk_w, int *row_idx, const float *logits,
                         int N, int E, int K, int norm_topk_prob);
/* router_topk_forward on rows [t0, t1) of an N-token batch (pointers are to the whole [N,·]
 * arrays; row_idx[t·K + j] = j·N + t with the batch's N; NULL skips it). Single-threaded: for
 * callers that split the tokens over an enclosing team. */
void router_topk_rows(float *probs, int *topk_ids, float *topk_w, int *row_idx, const float *logits, int t0,
                      int t1, int N, int E, int K, int norm_topk_prob);
/* dlogits[N,E] (OVERWRITTEN) from dtopk_w[N,K] (through renormalisation when norm_topk_prob)
 * plus dprobs_extra[N,E] (the aux-loss gradient on the full softmax; NULL if none),
 * through the softmax Jacobian. */
void router_topk_backward(float *dlogits, const float *dtopk_w, const float *dprobs_extra,
                          const float *probs, const int *topk_ids, int N, int E, int K, int norm_topk_prob);

/* HF load_balancing_loss_func for ONE layer's contribution, accumulated across layers:
 * counts[E] += number of top-k selections of e among N tokens; psum[E] += Σ_t probs[t,e].
 * After all L MoE layers: aux = E · Σ_e (counts[e]/(L·N)) · (psum[e]/(L·N)). */
void moe_aux_accumulate(float *counts, float *psum, const float *probs, const int *topk_ids, int N, int E, int K);
float moe_aux_loss(const float *counts, const float *psum, int E, int64_t total_rows /* L·N */);
/* d aux / d probs[t,e] = E · counts[e] / (L·N)² — the gradient flows through P only (counts
 * are not differentiable). Writes dprobs[N,E] = coef · that (OVERWRITTEN). */
void moe_aux_backward(float *dprobs, const float *counts, int N, int E, int64_t total_rows, float coef);

/* ---------------------------------------------------------------- MoE: permute / unpermute */

/* Stable counting sort of the N*K routed rows by expert id (no per-expert scans of all tokens).
 * Inputs: topk_ids[N,K], row_idx[N,K] (from router_topk_forward).
 * Outputs: sorted_row[M]    the k-major expanded row (j*N + t) at each permuted position,
 *                            grouped by expert ascending, stable in expanded-row order;
 *          expanded_pos[M]  inverse map, indexed by t*K + j: the permuted position of (t, j);
 *          tokens_per_expert[E], expert_offsets[E+1] (prefix sums; the group list).
 * Source: Megatron moe_utils.permute / Ascend npu_moe_init_routing. */
void moe_permute_index(int *sorted_row, int *expanded_pos, int *tokens_per_expert, int *expert_offsets,
                       const int *topk_ids, const int *row_idx, int N, int E, int K);
/* permuted[i, :] = x[sorted_row[i] % N, :] for i < M.  x[N,H] → permuted[M,H]. */
void moe_permute_forward(float *permuted, const float *x, const int *sorted_row, int N, int M, int H);
/* dx[N,H] (ACCUMULATES) += Σ over rows i of token t: dpermuted[i,:]. */
void moe_permute_backward(float *dx, const float *dpermuted, const int *sorted_row, int N, int M, int H);
/* out[t,:] = Σ_j topk_w[t,j] · y[expanded_pos[t*K+j], :]   (out OVERWRITTEN), y[M,H]. */
void moe_unpermute_forward(float *out, const float *y, const float *topk_w, const int *expanded_pos,
                           int N, int K, int H);
/* dy[M,H] (OVERWRITTEN): dy[pos(t,j)] = topk_w[t,j]·dout[t];  dtopk_w[N,K] (OVERWRITTEN):
 * dtopk_w[t,j] = <dout[t], y[pos(t,j)]>. Either may be NULL (skipped): the production path
 * passes dy = NULL and has the grouped GEMM read dout through grouped_fuse.gather_dout. */
void moe_unpermute_backward(float *dy, float *dtopk_w, const float *dout, const float *y, const float *topk_w,
                            const int *expanded_pos, int N, int K, int H);

/* One row of moe_unpermute_backward for schedules that walk permuted rows: dy[H] = w·g[H]
 * (OVERWRITTEN), *dtopk_w = <g, y> (skipped when NULL); bit-identical to the fused kernel. */
void moe_unpermute_backward_row(float *dy, float *dtopk_w, const float *g, const float *y, float w, int H);

/* ---------------------------------------------------------------- MoE: grouped GEMM */

/* For each expert g with rows [offsets[g], offsets[g+1]) of a[M,I]:
 *   out[rows,:] = a[rows,:] · W[g]ᵀ, W[E,O,I] stacked (expert g's matrix at W + g·O·I).
 * Experts with no rows are skipped. Opens its own OpenMP team (none inside a parallel region:
 * it then runs on the calling thread) around grouped_gemm_forward_team (same work split).
 * Source: Megatron GroupedMLP / grouped_gemm. */
void grouped_gemm_forward(float *out, const float *a, const float *W, const int *offsets, int E, int I, int O);
/* da[M,I] (OVERWRITTEN, may be NULL) = dout_g · W_g;  dW[E,O,I] (ACCUMULATES, may be NULL)
 * += dout_gᵀ · a_g (zero contribution for an expert with no rows). */
void grouped_gemm_backward(float *da, float *dW, const float *dout, const float *a, const float *W,
                           const int *offsets, int E, int I, int O);

/* What the team forms fuse into the grouped GEMM (NULL / zero fields = nothing fused). */
typedef struct {
    /* Fused permute. Forward: the items read their rows of a from gather_x,
     * a[i,:] = gather_x[sorted_row[i] mod n_tokens, :] (the tiled kernel inside its packing), so
     * no separate permute pass over all M rows is needed; a, when not NULL, still receives those
     * rows (once each) for a backward that reads them. Backward (not with blas): dW's product
     * reads a's rows the same way (a is then not read and may be NULL). */
    const float *gather_x;
    const int *sorted_row;
    int n_tokens;
    /* Fused unpermute backward (backward, not with blas): dout's rows are the routing-weighted
     * token gradients, dout[i,:] = topk_w[t·topk_k + j]·gather_dout[t,:] for the expanded row
     * sorted_row[i] = j·n_tokens + t, read in place (dout is then not read and may be NULL).
     * da's rows are the weighted sums (the weight applied to each row's sum), dW's operand is
     * scaled row by row while it is packed. */
    const float *gather_dout;
    const float *topk_w;
    int topk_k;
    /* Fused SwiGLU epilogue (forward, O even): act[i, c] = silu(out[i, c]) · out[i, O/2 + c]
     * for c < O/2, computed by the item that produced those columns of those rows. */
    float *swiglu_act;
    /* Fused SwiGLU backward epilogue (backward): da is ∂/∂act [M, I]; each item turns its rows
     * of da into swiglu_dgate_up[M, 2I] (OVERWRITTEN) using swiglu_gate_up[M, 2I]. da may then
     * be NULL (not with blas): each item keeps its block of da in a per-thread scratch that
     * stays in L2, and only swiglu_dgate_up is written (∂/∂act is consumed once, by the
     * epilogue, so its [M, I] never goes to memory). */
    float *swiglu_dgate_up;
    const float *swiglu_gate_up;
    /* Pre-packed weights (forward only): W in the panel layout of gemm_packed_pack (expert g's
     * panels at nz + g·nz_stride floats), used for groups of at most SKINNY_MAX_ROWS rows;
     * NULL = read W. */
    const float *nz;
    size_t nz_stride;
    /* The same with bf16 panels (gemm_packed16_pack; expert g's at nz16 + g·nz_stride elements);
     * takes precedence over nz. NULL = not used. */
    const uint16_t *nz16;
    /* Run every item through cblas_sgemm (single-threaded OpenBLAS) instead of moerl's tiled
     * kernel: the library GEMM of the HF-style per-expert loop (model.moe per_expert_loop), the
     * baseline the ablation measures against. Decode-sized groups are unaffected. */
    int blas;
    /* Batch-invariant forward (moe_exec_opts.batch_invariant): grouped_gemm_forward_team hands
     * the call to grouped_gemm_forward_bi_team (gather and SwiGLU as above; nz, nz16 and blas are
     * not used). Backward: ignored. */
    int invariant;
} grouped_fuse;

/* Team forms: called by EVERY thread of an enclosing OpenMP parallel region (orphaned
 * `omp for` over work items, dynamic scheduling, ending in the loop's implicit barrier);
 * outside a parallel region they run every item on the calling thread. They never open a
 * parallel region. OpenBLAS must be single-threaded meanwhile (OpenMP builds are, inside a
 * region; grouped_gemm.c).
 * Work items: group g with m_g > SKINNY_MAX_ROWS rows is cut into
 * R_g = clamp(⌈16·threads·m_g/M⌉, 1, min(16, column units / 2)) parts, each a block of
 * 16-multiple output columns (8-multiple activations with the SwiGLU epilogue) for all the
 * group's rows, computed by gemm_tiled (moerl's kernel; fuse->blas: blocks of rows through
 * cblas_sgemm, R_g = clamp(⌈4·threads·m_g/M⌉, 1, 16), the previous split). Decode-sized groups:
 * R_g = clamp(⌈4·threads·m_g/M⌉, 1, 16) blocks of 16-multiple output columns (skinny or packed
 * kernel, W read once). Backward: part p computes column block p of da (row block p with
 * fuse->blas) and row block p of dW_g, so no two items write the same memory; da may be NULL
 * with fuse->swiglu_dgate_up (the block then lives in a per-thread scratch, see grouped_fuse).
 * a is non-const in the forward because the fused gather writes it. fuse may be NULL.
 * Source: as grouped_gemm_forward/backward. */
void grouped_gemm_forward_team(float *out, float *a, const float *W, const int *offsets, int E, int I, int O,
                               const grouped_fuse *fuse);
void grouped_gemm_backward_team(float *da, float *dW, const float *dout, const float *a, const float *W,
                                const int *offsets, int E, int I, int O, const grouped_fuse *fuse);

/* ---------------------------------------------------------------- batch-invariant forward kernels
 * (batch_invariant.c; moe_exec_opts.batch_invariant, rollout.batch_invariant). Every output
 * element is reduced in one fixed order that depends only on its own inputs: the same bits
 * whatever the row count, the row's place in the batch, the thread count and the column split,
 * for decode, chunked prefill and full-sequence forwards alike (docs/rl.md, "Bit-for-bit
 * on-policy"). Products: out[r, o] = Σ_i a[r, i]·W[o, i] as eight interleaved partial sums
 * (lane l: i ≡ l mod 8, ascending), a fixed tree over the lanes, then the tail ascending;
 * accumulate adds that sum to out. Source: the batch-invariance semantics of He et al., "Defeating
 * Nondeterminism in LLM Inference" (Thinking Machines, 2025). */

/* out[r, o − o0] (row stride ldo; = or += per accumulate) = Σ_i rows[r][i]·W[o, i] for r < m,
 * o in [o0, o1); W[O, I] row-major (only rows [o0, o1) are read). Single-threaded. */
void gemm_bi_nt_rows(float *out, int ldo, const float *const *rows, const float *W, int m, int I, int o0, int o1,
                     int accumulate);
/* linear_forward's contract (out[N,O] (= or +=) x[N,I]·W[O,I]ᵀ) with the fixed-order products.
 * Opens its own team (blocks of 16 rows × 64 columns) outside any parallel region when the call is
 * large enough; inside one it runs on the calling thread. */
void linear_forward_bi(float *out, const float *x, const float *W, int N, int I, int O, int accumulate);
/* grouped_gemm_forward_team's contract (team form; fuse's gather_x/sorted_row/n_tokens, the copy
 * into a, and swiglu_act, whose act = silu(gate)·up is computed by the item of those columns) with
 * the fixed-order products: items of up to 16 rows of one group × 64 output columns (32 activations
 * with SwiGLU), dynamic schedule. fuse must not be NULL (pass a zero one). */
void grouped_gemm_forward_bi_team(float *out, float *a, const float *W, const int *offsets, int E, int I, int O,
                                  const grouped_fuse *fuse);
/* attention_forward's contract (packed causal GQA; lse[nh, N], may be NULL) and
 * attention_kvcache_forward's (paged by slot), both reducing one query row at a time over its
 * keys 0..pos ascending with the same row function: scores q·k·scale (the fixed-order dot over
 * hd), their max, then Σ e^{s−max} (double) and Σ e^{s−max}·v (float) in key order, out = the
 * latter / the former. So a token's attention output is the same bits in the engine (any decode
 * or prefill chunk) and in the trainer (any micro-batch). Open their own team outside a parallel
 * region over (token, head) rows; a row's scratch is its key count in floats. */
void attention_forward_bi(float *out, float *lse, const float *q, const float *k, const float *v,
                          const int *cu_seqlens, int B, int N, int nh, int nkv, int hd, float scale);
void attention_kvcache_forward_bi(float *out, const float *q, const float *k_cache, const float *v_cache,
                                  const int *slot, const int *pos, int N, int nh, int nkv, int hd, int max_len,
                                  float scale);
/* attention_kvcache_paged_forward's contract with attention_kvcache_forward_bi's row function (a
 * token's K/V rows gathered into contiguous scratch first): the same bits as the slot layout. */
void attention_kvcache_paged_forward_bi(float *out, const float *q, const float *k_cache, const float *v_cache,
                                        const int *block_tables, int max_blocks, const int *seq, const int *pos,
                                        int N, int nh, int nkv, int hd, int block_size, float scale);

/* ---------------------------------------------------------------- tiled GEMM (gemm_tiled.c) */

/* An operand of gemm_tiled, described by its storage rows: storage row x is
 * p + phys(x)·ld (contiguous), phys(x) = idx[x] mod mod when idx is given (rows gathered through
 * an index: the MoE permute fused into the GEMM), else x; with rw (needs idx) each storage row
 * is multiplied by its routing weight rw[(v mod mod)·rk + v / mod], v = idx[x] (the expanded
 * row v = j·mod + t of token t's slot j: the unpermute's weighting fused in).
 * trans = 0: element (r, c) = row r's element c; trans = 1: element (r, c) = row c's element r. */
typedef struct {
    const float *p;
    long ld;
    int trans;
    const int *idx;
    int mod;
    const float *rw;
    int rk;
} tg_mat;

enum { TG_EPI_NONE = 0, TG_EPI_SWIGLU, TG_EPI_DSWIGLU };
/* Epilogue of gemm_tiled, applied per tile once its sums are complete.
 *  TG_EPI_SWIGLU: n counts activations; B has gate columns [0, n) and up columns
 *    [half, half + n) (relative to B.p), C receives both (gate at column c, up at half + c) and
 *    act[i, c] = silu(C[i, c])·C[i, half + c] (row stride ld_act). One tile holds 8 gate and the
 *    8 matching up columns.
 *  TG_EPI_DSWIGLU: C is ∂/∂act; dgu[i, c] and dgu[i, half + c] (row stride ld_gu) receive the
 *    SwiGLU backward of it, from gu (same layout): swiglu_backward's formula. */
typedef struct {
    int kind;
    int half;
    float *act;
    long ld_act;
    float *dgu;
    const float *gu;
    long ld_gu;
} tg_epi;

/* C[m, n] (row stride ldc) = A[m, k]·B[k, n] (accumulate = 0) or += (accumulate = 1), then the
 * epilogue (NULL = none). Single-threaded; moerl's own 6×16 register-tile kernel (AVX2 + FMA
 * when compiled for it, plain C otherwise) with both operands packed per call, k summed in
 * ascending order in blocks of at most 320. k = 0 gives C = 0 (or C unchanged). Shapes are the
 * caller's contract (asserted non-negative). Source: GotoBLAS/BLIS (gemm_tiled.c). */
void gemm_tiled(float *C, long ldc, int accumulate, const tg_mat *A, const tg_mat *B, int m, int n, int k,
                const tg_epi *epi);

/* Skinny product over row pointers: out[r, o] (= or +=) Σ_i rows[r][i]·W[o, i], r < m, o < O
 * (out's row stride ldo). Same arithmetic and order as gemm_skinny_nt. Single-threaded. */
void gemm_skinny_nt_rows(float *out, int ldo, const float *const *rows, const float *W, int m, int I, int O,
                         int accumulate);

/* Panel ("NZ") layout for the skinny product: W[O, I] → P[⌈O/16⌉][I][16] with
 * P[b][i][l] = W[16b + l, i] (zero past O); gemm_packed_size(O, I) floats. The analogue of
 * Ascend's NZ (fractal) weight format: one contiguous stream per 16 outputs, accumulated
 * vertically (no horizontal sums). */
size_t gemm_packed_size(int O, int I);
void gemm_packed_pack(float *P, const float *W, int O, int I);
/* out[r, o - o0] = Σ_i rows[r][i]·W[o, i] for r < m and o in [o0, o1) (o0 a multiple of 16),
 * reading the packed P of the whole W. Each output is the sum over i ascending in one lane,
 * whatever m is (batch-invariant). Single-threaded. */
void gemm_packed_nt_rows(float *out, int ldo, const float *const *rows, const float *P, int m, int I, int o0,
                         int o1);
/* bf16 panels (the rollout engine's bf16 weights): the same panels with each weight rounded to
 * bf16 (nearest, ties to even; gemm_packed_size(O, I) uint16 elements; within a panel row the 16
 * lanes are interleaved, lane j < 8 at element 2j and lane 8 + j at 2j + 1, so two integer
 * operations widen them — use gemm_packed16_get to read one), and the same product with each
 * weight widened to fp32 in the kernel — an output equals gemm_packed_nt_rows on the bf16-rounded
 * weights (same per-lane order, batch-invariant). gemm_packed16_nt takes a row-major a[m, I]
 * instead of row pointers. Single-threaded. */
void gemm_packed16_pack(uint16_t *P, const float *W, int O, int I);
/* The same panels from weights already in bf16 (W[O, I] bf16 bits, e.g. a bf16 weight broadcast): a
 * copy into the layout, no rounding; equals gemm_packed16_pack of their fp32 widening. */
void gemm_packed16_pack_bf16(uint16_t *P, const uint16_t *W, int O, int I);
/* The bf16 bits of W[o, i] in panels P of a W[O, I] (tests, debugging). */
uint16_t gemm_packed16_get(const uint16_t *P, int I, int o, int i);
void gemm_packed16_nt_rows(float *out, int ldo, const float *const *rows, const uint16_t *P, int m, int I, int o0,
                           int o1);
void gemm_packed16_nt(float *out, int ldo, const float *a, const uint16_t *P, int m, int I, int o0, int o1);
/* Row count up to which the rollout engine's bf16 mode reads the bf16 panels for q/k/v, o_proj and
 * the LM head (beyond: the fp32 product on the same bf16-rounded values). Above SKINNY_MAX_ROWS
 * because the panel kernel re-reads a group of panels from the cache for every block of rows
 * (gemm_packed.c), so a batch of 32 decode tokens still streams half the bytes of the fp32 sgemm. */
#define BF16_PANEL_MAX_ROWS 64

/* ---------------------------------------------------------------- MoE layer, naive oracle */

/* The HF reference path: loop over experts, select the tokens routed to each (a scan of all
 * N·K selections per expert, as HF's one_hot/where does), gather, gate_up GEMM, SwiGLU,
 * down GEMM, scatter-add weighted by topk_w. x[N,H], gate_up_w[E,2I,H], down_w[E,H,I] → out[N,H].
 * Used by tests as the oracle and by bench/ as the ablation. */
void moe_naive_forward(float *out, const float *x, const float *gate_up_w, const float *down_w,
                       const int *topk_ids, const float *topk_w, int N, int H, int E, int K, int I);
/* Backward of the naive path: dx[N,H] (OVERWRITTEN), dgate_up_w/ddown_w (ACCUMULATE),
 * dtopk_w[N,K] (OVERWRITTEN). Recomputes what it needs from x. */
void moe_naive_backward(float *dx, float *dgate_up_w, float *ddown_w, float *dtopk_w, const float *dout,
                        const float *x, const float *gate_up_w, const float *down_w, const int *topk_ids,
                        const float *topk_w, int N, int H, int E, int K, int I);

#endif
