/* Ulysses sequence parallelism (SP): actor.ulysses_sequence_parallel_size.
 *
 * The sp ranks of a Ulysses group (par_grid.sp_comm) hold the SAME packed micro-batch of N tokens
 * (every one packs it as without SP) and each computes only its contiguous share of the tokens:
 * rank r holds tokens [⌊N·r/sp⌋, ⌊N·(r+1)/sp⌋) (sp_token_range). Everything but attention is
 * token-local (embedding, norms, projections, MoE, LM head, logprobs, loss), so it runs on the
 * local tokens unchanged. Attention needs whole sequences, so around it the layout switches from
 * sequence-sharded to head-sharded and back:
 *   forward   q [n, nh, hd], k/v [n, nkv, hd] (local tokens, all heads) → one all-to-all →
 *             q [N, nh/sp, hd], k/v [N, nkv_l, hd] (all tokens, this rank's heads) → causal varlen
 *             attention over the packed micro-batch (the full cu_seqlens) → one all-to-all →
 *             out [n, nh, hd];
 *   backward  d_out [n, nh, hd] → all-to-all → [N, nh/sp, hd] → attention backward → dq/dk/dv
 *             head-sharded → all-to-all → dq [n, nh, hd], dk/dv [n, nkv, hd].
 * Rank q's query heads are [q·nh/sp, (q+1)·nh/sp). GQA: when sp divides nkv, rank q gets the kv heads
 * [q·nkv/sp, (q+1)·nkv/sp) (nkv_l = nkv/sp; its query heads read exactly those); when nkv < sp (sp a
 * multiple of nkv, par_check), each rank gets the ONE kv head its query heads read (kv head
 * q·nkv/sp, replicated on sp/nkv ranks), and the backward adds the replicas' dk/dv partial sums on the
 * token's owner. q, k and v travel in one all-to-all-v per layer (counts follow from N and the
 * split, known on every rank; no size exchange), as do dq, dk and dv.
 *
 * Gradients: every parameter's gradient is a sum over the stage's ranks (the SP ranks' token shares
 * are part of the data-parallel sum). The caller passes dlogp already divided by the global count
 * and the global router counts for the aux loss (train_accumulate does: model_acts.tok0 tells it
 * which tokens of the packed micro-batch are this rank's). Every rank of a Ulysses group must run
 * the same micro-batches (each layer's exchange is a collective). Micro-batches need N ≥ sp.
 * Source: DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509), verl ulysses_sequence_parallel
 * (gather along sequence / scatter along heads, kv-head repetition when nkv < sp). */
#ifndef MOERL_PARALLEL_ULYSSES_H
#define MOERL_PARALLEL_ULYSSES_H

#include "model/model.h"
#include "parallel/grid.h"

typedef struct sp_state sp_state;

typedef struct {
    long exchanges;  /* all-to-alls (two per layer forward, two backward) */
    double floats_sent; /* floats this rank sent to OTHER ranks */
    double seconds;  /* wall time in the exchanges and the packing around them */
} sp_stats;

/* SP runtime for trainer rank of grid g (g->sp > 1) and model config c, for packed micro-batches of
 * at most max_tokens tokens (the whole micro-batch, before the split). Not collective. The grid must
 * outlive it. Errors (NULL with a message): g->sp ≤ 1, heads not divisible as par_check requires,
 * max_tokens < sp. */
sp_state *sp_state_new(const par_grid *g, const moe_config *c, int max_tokens);
void sp_state_free(sp_state *sp);
/* This rank's token range [*t0, *t0 + *n) of a packed micro-batch of N tokens. */
void sp_token_range(const sp_state *sp, int N, int *t0, int *n);
/* Start a forward over a packed micro-batch: keeps its cu_seqlens[B+1] (attention needs the whole
 * sequences) and N. Errors: N < sp or N > max_tokens (naming both). */
int sp_begin(sp_state *sp, const int *cu_seqlens, int B, int N);
/* Attention of layer l on this rank's n tokens (sp_begin's range): q[n,nh,hd], k/v[n,nkv,hd] →
 * out[n,nh,hd] (OVERWRITTEN); saves the head-sharded tensors for sp_attention_backward. Collective
 * over sp_comm. Call outside OpenMP regions. */
void sp_attention_forward(sp_state *sp, int l, float *out, const float *q, const float *k, const float *v,
                          float scale);
/* Backward of layer l's attention: dout[n,nh,hd] → dq[n,nh,hd], dk/dv[n,nkv,hd] (OVERWRITTEN).
 * Collective over sp_comm. */
void sp_attention_backward(sp_state *sp, int l, float *dq, float *dk, float *dv, const float *dout, float scale);
sp_stats sp_get_stats(const sp_state *sp);
void sp_reset_stats(sp_state *sp);

#endif
