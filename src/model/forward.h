/* Qwen3-MoE forward and backward on a packed batch of variable-length sequences.
 *
 * A batch is B sequences concatenated into N tokens; sequence b is tokens
 * [cu_seqlens[b], cu_seqlens[b+1]); positions restart at 0 in each sequence unless the caller
 * gives explicit positions. No padding anywhere.
 *
 * Usage (training):
 *   model_acts a; model_acts_init(&a, &m, max_tokens);
 *   model_forward(&m, &a, tokens, cu_seqlens, NULL, B, N);      // logits, router stats, aux
 *   model_logprobs(&m, &a, targets, 1.0f, want_entropy);         // a.logp[N], a.entropy[N]
 *   model_backward(&m, &a, dlogp, dentropy, aux_weight);         // m.grads += ...
 * Loss convention: the caller's loss is Σ_n f(logp[n], entropy[n]) + aux_weight·aux, and it passes
 * dlogp[n] = ∂loss/∂logp[n] (for token-mean CE: −mask[n]/Σmask), dentropy likewise (or NULL).
 * Source: HF Qwen3MoeForCausalLM (modeling_qwen3_moe.py), with the MoE block done as the
 * Ascend/Megatron fused pipeline (router top-k → permute → grouped GEMM → SwiGLU → grouped GEMM
 * → unpermute).
 */
#ifndef MOERL_FORWARD_H
#define MOERL_FORWARD_H

#include "model/model.h"

/* Saved activations of one MoE/dense MLP sub-layer. */
typedef struct {
    /* MoE */
    float *router_logits, *probs;  /* [N,E] */
    int *topk_ids, *row_idx;       /* [N,K] */
    float *topk_w;                 /* [N,K] */
    int *sorted_row, *expanded_pos;/* [M] */
    int *tokens_per_expert;        /* [E] */
    int *offsets;                  /* [E+1] */
    float *permuted;               /* [M,H] */
    float *gate_up;                /* [M,2I] (dense: [N,2Id]) */
    float *act;                    /* [M,I]  (dense: [N,Id]) */
    float *y;                      /* [M,H]  expert outputs before unpermute */
    float *yw;                     /* [M,H]  scratch of the separate_permute schedule (else NULL) */
    float *w_gu, *w_d;             /* per_expert_weights: the stacked copy [E,2I,H], [E,H,I] (else NULL) */
} mlp_acts;

typedef struct {
    float *resid_in;     /* [N,H] layer input */
    float *ln1, *ln1_rstd;
    float *q_raw, *k_raw;/* [N,nh*hd], [N,nkv*hd] projections before q/k norm */
    float *q_rstd, *k_rstd; /* [N*nh], [N*nkv] */
    float *q, *k, *v;    /* after norm + RoPE (v: projection) */
    float *att, *lse;    /* [N,nh*hd], [nh,N] */
    float *resid_mid;    /* [N,H] after attention residual */
    float *ln2, *ln2_rstd;
    mlp_acts mlp;
} layer_acts;

/* ---- Hooks of the model-parallel runtime (filled by src/parallel/; the model includes nothing of it) ----
 * model_forward / model_backward call these when model_acts.par is set, each with par as its first
 * argument; a NULL hook is the single-rank path. The rollout engine's expert parallelism uses the
 * MoE hooks through mlp_forward_par (engine_set_ep). */

/* Layer events: MODEL_FWD_LAYER l before the forward work of layer l (l = −1: the embedding and
 * layer 0's attention input), MODEL_BWD_LAYER l before the backward work of layer l (l = L: the LM
 * head and layer L−1's MLP), MODEL_GRAD_READY g when backward group g's gradients are final
 * (numbering of dist_tensor_group: L, L−1, ..., 0, −1). Every micro-batch, not only the last.
 * A pipeline stage's pass over layers [lo, hi) (model_acts.layer_lo / layer_hi): its forward starts
 * with MODEL_FWD_LAYER lo − 1 (layer lo's attention input), its backward with MODEL_BWD_LAYER hi
 * (layer hi − 1's MLP; hi = L: the LM head as above). */
typedef enum { MODEL_FWD_LAYER = 0, MODEL_BWD_LAYER, MODEL_GRAD_READY } model_layer_phase;

typedef struct model_hooks {
    /* Layer events (FSDP gathers parameters before a layer and reduces its gradients after;
     * src/parallel/parallel.c). Called outside OpenMP regions. */
    void (*layer_event)(void *par, model_layer_phase phase, int l);
    /* The MoE dispatch (expert parallelism, src/parallel/ep.c), replacing the local experts
     * stage of an MoE layer. Called by EVERY thread of a driver team. moe_forward: after the permute
     * index of s (sorted_row, tokens_per_expert, offsets over the E global experts) is complete,
     * fills s->y [N·K, H] (the expert outputs in permuted order) from x[N,H]; ends with a team
     * barrier. moe_backward: d_y[N·K, H] → d_permuted[N·K, H] (OVERWRITTEN), weight gradients of
     * the local experts ACCUMULATED into dWgu / dWd; ends with a team barrier. moe_idle: a pass
     * without rows of this rank's own (every MoE layer's exchange in order; backward 1 also the
     * backward's), for a rank of the group with no work (the rollout engine's idle step). When
     * moe_forward is set the model may hold an expert slice (moe_exec_opts.ep_size). */
    void (*moe_forward)(void *par, const moe_model *m, int l, const float *x, mlp_acts *s, int N);
    void (*moe_backward)(void *par, const moe_model *m, int l, const mlp_acts *s, const float *d_y,
                         float *d_permuted, float *dWgu, float *dWd);
    void (*moe_idle)(void *par, moe_model *m, int backward);
    /* The attention shard (Ulysses sequence parallelism, src/parallel/ulysses.c), all set or all
     * NULL. attn_tokens: this rank's token range [*t0, *t0 + *n) of a packed micro-batch of N
     * tokens; attn_begin: the micro-batch's cu_seqlens[B+1] and N are kept (the model does not copy
     * them into model_acts), MOERL_ERR with a message on bad sizes; attn_forward: q[n,nh,hd],
     * k/v[n,nkv,hd] of this rank's n tokens → out[n,nh,hd] (OVERWRITTEN); attn_backward: dout[n,nh,hd]
     * → dq, dk, dv (OVERWRITTEN). Collective over the sequence-parallel group; outside OpenMP regions. */
    void (*attn_tokens)(void *par, int N, int *t0, int *n);
    int (*attn_begin)(void *par, const int *cu_seqlens, int B, int N);
    void (*attn_forward)(void *par, int l, float *out, const float *q, const float *k, const float *v, float scale);
    void (*attn_backward)(void *par, int l, float *dq, float *dk, float *dv, const float *dout, float scale);
    /* Tensor parallelism (src/parallel/tp.c; the model holds a TP slice, moe_exec_opts.tp_size): x[n] summed
     * (max = 0) or maximised (max = 1) over the TP group, in place. Called by ONE thread (forward.c brackets it
     * with team barriers) or outside any team; every rank of the group calls it at the same points. */
    void (*tp_allreduce)(void *par, double *x, size_t n, int max);
    void (*tp_allreduce_f32)(void *par, float *x, size_t n);
    /* Megatron sequence parallelism over the TP group (actor.megatron.sequence_parallel; src/parallel/tp_sp.c),
     * both set or both NULL: the residual stream and the RMSNorms live on this rank's rows [s0, s1) of the N
     * tokens (model_sp_rows). tp_reduce_scatter: x[N,H] holds this rank's partial sums of every row; on return
     * rows [s0, s1) hold the sums over the group (the other rows are left as they are). tp_all_gather: rows
     * [s0, s1) of x[N,H] are this rank's; on return every row holds its owner's values. Called as tp_allreduce
     * (one thread, every rank of the group at the same points). */
    void (*tp_reduce_scatter)(void *par, float *x, int N, int H);
    void (*tp_all_gather)(void *par, float *x, int N, int H);
} model_hooks;

/* Megatron sequence parallelism's token slice of TP rank r of P over N tokens: rows [*s0, *s1) with
 * ⌈N/P⌉ rows per rank, the last ranks short (N not a multiple of P: the collectives pad to P·⌈N/P⌉ rows;
 * a rank may hold none). */
static inline void model_sp_rows(int N, int P, int r, int *s0, int *s1) {
    const int c = (N + P - 1) / P;
    *s0 = r * c < N ? r * c : N;
    *s1 = (r + 1) * c < N ? (r + 1) * c : N;
}

/* What model_acts.par points to begins with this: the runtime's hook table (NULL: none). */
typedef struct model_par_head {
    const model_hooks *hooks;
} model_par_head;

/* The hook table of a runtime object par (a model_acts.par): NULL when par or its table is NULL. */
static inline const model_hooks *model_par_hooks(const void *par) {
    return par ? ((const model_par_head *)par)->hooks : NULL;
}

typedef struct {
    int max_tokens;      /* capacity N */
    int N, B;            /* current batch (N: this rank's tokens) */
    int tok0;            /* Ulysses SP: this rank's tokens are [tok0, tok0 + N) of the packed micro-batch
                            given to model_forward (0 without SP; src/parallel/ulysses.h) */
    int *cu_seqlens;     /* [max_tokens+1] copy */
    int *pos;            /* [N] positions */
    int *tokens_in;      /* [N] copy of the input tokens (embedding backward) */
    const int *targets;  /* last targets given to model_logprobs */
    float temperature;
    float *rope_cos, *rope_sin; /* [max_pos, hd/2] */
    int rope_max_pos;
    layer_acts layers[MOERL_MAX_LAYERS];
    float *resid_out;    /* [N,H] final residual stream */
    float *lnf, *lnf_rstd;
    float *logits;       /* [N,V] */
    float *logp, *entropy, *lse_head; /* [N] */
    /* router statistics for the aux loss (HF load_balancing_loss_func) */
    float *aux_counts, *aux_psum;     /* [E] summed over MoE layers */
    int n_moe_layers;
    float aux_loss;
    /* backward scratch */
    float *d_resid, *d_tmp, *d_tmp2;  /* [N,H] */
    float *d_q, *d_k, *d_v, *d_att;   /* [N,nh*hd] / [N,nkv*hd] */
    float *d_logits;                  /* [N,V] */
    float *d_permuted, *d_y;          /* [M,H] */
    float *d_gate_up, *d_act;         /* [max(M·2I, N·2Id)], [max(M·I, N·Id)] */
    float *d_topk_w;                  /* [N,K] */
    float *d_router_logits, *d_probs; /* [N,E] */
    float *dw_gu, *dw_d;              /* per_expert_weights: stacked weight-gradient scratch (else NULL) */
    void *arena;
    size_t arena_bytes;               /* its size (model_acts_bytes for the arena's tokens and layers) */
    /* Megatron sequence parallelism's layout (moe_exec_opts.tp_sp at model_acts_init; 0: off, every buffer holds
     * max_tokens rows). Under it the buffers of the residual stream and the RMSNorms' per-row statistics — each
     * layer's resid_in, ln1_rstd, resid_mid, ln2_rstd, and resid_out, lnf_rstd — hold only this TP rank's rows
     * [s0, s1) of a micro-batch (model_sp_rows of a->N): their row i is token s0 + i, sp_rows = ⌈max_tokens/tp⌉
     * rows each (Korthikanti et al. 2022: the activations outside the tensor-parallel region shrink by tp). The
     * norms' outputs ln1, ln2, lnf (all-gathered: the column-parallel inputs), the attention and MLP buffers and
     * the backward's scratch keep max_tokens rows; a row-parallel output's partial sums of every row are formed in
     * d_tmp2 (free in the forward) and reduce-scattered from there. */
    int sp_rows;
    /* Optional per-layer hook for data-parallel gradient reduction (NULL = none; model_acts_init
     * sets NULL). model_backward calls layer_hook(layer_hook_ctx, group) as soon as the gradients
     * of a backward group are final, in the order and numbering of dist_tensor_group (dist/dist.h):
     * group L = num_hidden_layers (final norm and untied LM head) after the head, group l after
     * decoder layer l, group −1 (embedding, incl. a tied head) after the embedding scatter. */
    void (*layer_hook)(void *ctx, int group);
    void *layer_hook_ctx;
    /* Model-parallel runtime, opaque to the model: NULL (model_acts_init sets NULL) = this rank
     * computes the whole model on its own tokens; otherwise an object whose FIRST member is a
     * model_par_head (below; src/parallel's par_state is one): forward.c calls the hooks of its
     * table with par as their first argument. */
    void *par;
    /* Pipeline stage (model_acts_init_range): decoder layers [layer_lo, layer_hi) only; model_acts_init
     * gives 0 and num_hidden_layers (the whole model). With layer_lo > 0 model_forward embeds nothing:
     * the caller fills layers[layer_lo].resid_in [N,H] (the previous stage's output) before the call.
     * With layer_hi < L there is no final norm or LM head (logits NULL): the forward's output is
     * resid_out [N,H], and model_backward starts from d_resid [N,H] = ∂loss/∂resid_out, which the
     * caller fills. With layer_lo > 0 model_backward ends with d_resid = ∂loss/∂layers[layer_lo].resid_in
     * (sent to the previous stage) instead of the embedding scatter. aux_counts / aux_psum then sum
     * this stage's MoE layers only (aux_loss is not the model's; n_moe_layers stays the model's). */
    int layer_lo, layer_hi;
    /* Routing replay (actor.router_replay; R3 = rollout routing replay, arXiv 2510.11370; R2 = the old-logprob
     * pass's routes replayed by the update). Both NULL by default (model_acts_init); the caller sets them per
     * micro-batch. Layout of both: [tokens of the micro-batch given to model_forward, n_moe_layers, K] int16,
     * MoE layers numbered in order (model_moe_layer_index); under Ulysses SP this rank's tokens are
     * tok0 .. tok0 + N − 1 of that micro-batch.
     * replay_routes: the experts each MoE layer uses for each token instead of the router's own top-k; the
     *   gate weights are the CURRENT router probabilities of those experts (renormalised over the K when
     *   norm_topk_prob), so the router still learns; the load-balancing loss counts the router's native top-k.
     *   A token whose entries are −1 (no recorded route) uses its native top-k.
     * routes_out: where the forward writes the router's native top-k of this rank's tokens (before any
     *   replay): R2's recording and the routing-agreement metrics. */
    const int16_t *replay_routes;
    int16_t *routes_out;
    int *route_native;   /* [N,K] scratch: the native top-k of the layer being replayed (its aux-loss counts) */
} model_acts;

/* MoE index of decoder layer l (0, 1, ... over the MoE layers in order, the numbering of
 * model_acts.replay_routes / routes_out and gen_request.out_routes), −1 for a dense layer or an l
 * outside [0, num_hidden_layers). */
int model_moe_layer_index(const moe_config *c, int l);
/* Number of MoE layers of c (the n_moe_layers of a routes array). */
int model_moe_layer_count(const moe_config *c);

/* Allocate activations for up to max_tokens tokens per batch (one allocation). */
int model_acts_init(model_acts *a, const moe_model *m, int max_tokens);
/* The same for a pipeline stage: decoder layers [lo, hi) only (0 ≤ lo < hi ≤ L), the LM head's
 * buffers only when hi = L (see model_acts.layer_lo). Errors: max_tokens ≤ 0, a bad range. */
int model_acts_init_range(model_acts *a, const moe_model *m, int max_tokens, int lo, int hi);
/* The same for all layers with buffers for `rows` tokens per pass and rotary tables for positions up
 * to max_positions: a Ulysses rank computes only its share of a micro-batch of max_positions tokens
 * (par_acts_rows; ulysses.c holds the head-sharded attention buffers), so its arena is ~1/sp of the
 * whole micro-batch's. Errors: rows ≤ 0. */
int model_acts_init_rows(model_acts *a, const moe_model *m, int rows, int max_positions);
void model_acts_free(model_acts *a);

/* Forward: tokens[N], cu_seqlens[B+1] (cu_seqlens[0]=0, cu_seqlens[B]=N, non-decreasing),
 * positions[N] or NULL (restart at 0 per sequence). Fills a->logits [N,V], a->aux_loss, and
 * a->routes_out when set; replays a->replay_routes when set (see model_acts).
 * Errors: N > max_tokens, a token id outside [0,V), a position beyond the RoPE table, a replayed
 * route naming an expert outside [0,E), an expert twice, or mixing −1 with experts (message names
 * the token and MoE layer). */
int model_forward(const moe_model *m, model_acts *a, const int *tokens, const int *cu_seqlens,
                  const int *positions, int B, int N);
/* logp[n] = log softmax(logits[n]/T)[targets[n]] (0 where targets[n] < 0); entropy when asked.
 * targets must stay valid until model_backward. */
void model_logprobs(const moe_model *m, model_acts *a, const int *targets, float temperature, int want_entropy);
/* Backward of loss = Σ_n (dlogp[n]·logp[n] + dentropy[n]·entropy[n]) + aux_weight·aux_loss
 * (linearised): accumulates into m->grads. dentropy may be NULL. Calls a->layer_hook (if set) after
 * each backward group's gradients are final (see model_acts). */
void model_backward(moe_model *m, model_acts *a, const float *dlogp, const float *dentropy, float aux_weight);

/* --- layer pieces shared with the rollout engine (same code for training and decoding) --- */
/* MoE or dense MLP of layer l on x[N,H] → out[N,H] (out OVERWRITTEN), saving into s.
 * For MoE layers also accumulates router statistics into counts/psum when non-NULL. */
void mlp_forward(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N, float *counts,
                 float *psum);
/* mlp_forward under a runtime's MoE dispatch (the rollout engine's expert parallelism,
 * engine_set_ep): m may hold this rank's slice of the experts, and layer l's routed rows go
 * through model_par_hooks(par)->moe_forward to the experts' owners and back (every rank of the
 * group must call it for the same layers, in order; one without rows calls the table's moe_idle
 * instead). par NULL, a table without moe_forward, or a dense layer: mlp_forward. */
void mlp_forward_par(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N, void *par);
/* Attention input side: x[N,H] → q[N,nh,hd], k[N,nkv,hd], v[N,nkv,hd] (q/k normed and rotated).
 * q_raw/k_raw/q_rstd/k_rstd receive what backward needs (they may be scratch for inference). */
void qkv_forward(const moe_model *m, int l, const float *x, float *q_raw, float *k_raw, float *q_rstd,
                 float *k_rstd, float *q, float *k, float *v, const int *pos, const float *rope_cos,
                 const float *rope_sin, int N);
/* Buffers of one mlp_acts for up to T tokens (the rollout engine's: one set reused by every
 * layer), sized for m's MoE or dense layers and its execution switches (cfg.exec); freed with
 * mlp_acts_free. */
void mlp_acts_alloc(mlp_acts *s, const moe_model *m, int T);
void mlp_acts_free(mlp_acts *s);
/* The MLP sub-layer l alone, backward (benchmarks and tests of the production MoE path): after
 * mlp_forward(m, l, x, out, &a->layers[l].mlp, N, NULL, NULL) with a->layers[l].mlp from
 * model_acts_init, dx[N,H] (OVERWRITTEN) = ∂/∂x of Σ dout·out, weight gradients accumulated
 * into m->grads (no aux loss). N ≤ a->max_tokens. */
void mlp_backward(moe_model *m, model_acts *a, int l, const float *x, const float *dout, float *dx, int N);
/* Bytes model_acts_init would allocate for max_tokens (every layer; the layout of m's recompute and
 * Megatron SP switches, moe_exec_opts). */
size_t model_acts_bytes(const moe_model *m, int max_tokens);

#endif
