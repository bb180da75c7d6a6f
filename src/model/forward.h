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
    /* Optional per-layer hook for data-parallel gradient reduction (NULL = none; model_acts_init
     * sets NULL). model_backward calls layer_hook(layer_hook_ctx, group) as soon as the gradients
     * of a backward group are final, in the order and numbering of dist_tensor_group (dist/dist.h):
     * group L = num_hidden_layers (final norm and untied LM head) after the head, group l after
     * decoder layer l, group −1 (embedding, incl. a tied head) after the embedding scatter. */
    void (*layer_hook)(void *ctx, int group);
    void *layer_hook_ctx;
    /* Model-parallel runtime (src/parallel/parallel.h); NULL = this rank computes the whole model on
     * its own tokens (model_acts_init sets NULL). */
    struct par_state *par;
    /* Pipeline stage (model_acts_init_range): decoder layers [layer_lo, layer_hi) only; model_acts_init
     * gives 0 and num_hidden_layers (the whole model). With layer_lo > 0 model_forward embeds nothing:
     * the caller fills layers[layer_lo].resid_in [N,H] (the previous stage's output) before the call.
     * With layer_hi < L there is no final norm or LM head (logits NULL): the forward's output is
     * resid_out [N,H], and model_backward starts from d_resid [N,H] = ∂loss/∂resid_out, which the
     * caller fills. With layer_lo > 0 model_backward ends with d_resid = ∂loss/∂layers[layer_lo].resid_in
     * (sent to the previous stage) instead of the embedding scatter. aux_counts / aux_psum then sum
     * this stage's MoE layers only (aux_loss is not the model's; n_moe_layers stays the model's). */
    int layer_lo, layer_hi;
} model_acts;

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
 * positions[N] or NULL (restart at 0 per sequence). Fills a->logits [N,V], a->aux_loss.
 * Errors: N > max_tokens, a token id outside [0,V), a position beyond the RoPE table. */
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
/* mlp_forward with expert parallelism (the rollout engine's EP, src/parallel/ep.h): m holds this
 * rank's slice of the experts, and layer l's routed rows travel through ep's dispatcher to the
 * experts' owners and back (every rank of ep's group must call it for the same layers, in order;
 * one without rows calls ep_idle_pass instead). ep NULL or a dense layer: mlp_forward. */
struct ep_state;
void mlp_forward_ep(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N,
                    struct ep_state *ep);
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
/* Bytes model_acts_init would allocate for max_tokens. */
size_t model_acts_bytes(const moe_model *m, int max_tokens);

#endif
