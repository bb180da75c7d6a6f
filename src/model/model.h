/* Qwen3-MoE (Hugging Face Qwen3MoeForCausalLM, model_type "qwen3_moe") in C.
 *
 * Parameters, gradients and AdamW moments each live in ONE contiguous fp32 buffer with the
 * same layout, described by a tensor table (name, shape, offset, flags). Expert weights are
 * stacked: "model.layers.{l}.mlp.experts.gate_up" [E][2I][H] (gate rows first, then up rows)
 * and "model.layers.{l}.mlp.experts.down" [E][H][I]. Dense MLP layers store
 * "model.layers.{l}.mlp.gate_up_proj" [2Id][H] and "...mlp.down_proj" [H][Id].
 * All other names are the HF names. Per-expert HF tensors exist only at the checkpoint
 * boundary (checkpoint.c splits on save and stacks on load).
 * Source: transformers/models/qwen3_moe/modeling_qwen3_moe.py.
 */
#ifndef MOERL_MODEL_H
#define MOERL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define MOERL_MAX_LAYERS 256

/* How the MoE layers execute: one switch per optimisation of the Ascend MoE practice, so each
 * can be ablated (config keys model.moe.*, src/model/model_config.c; README, "Ablation of the Ascend
 * practice's MoE optimisations"). Not part of config.json. Every field 0 = moerl's default,
 * the optimised path; 1 turns one off:
 *  per_expert_loop     the HF-style loop over experts (a scan of all selections per expert,
 *                      gather, the expert's GEMMs split over the threads, weighted scatter-add,
 *                      one expert after another) instead of the sorted permute + grouped GEMM;
 *  separate_permute    permute and unpermute as passes of their own (gather all rows, then the
 *                      GEMM; weight the expert outputs, then sum per token; backward likewise)
 *                      instead of the gather fused into the grouped GEMM's items and the
 *                      unpermute fused with the routing weights;
 *  per_expert_weights  expert weights handled as one buffer per expert: every forward stacks
 *                      them with one copy per expert matrix (torch.stack of per-expert
 *                      nn.Linear weights) and backward adds the stacked weight gradient back
 *                      per expert, instead of using the pre-stacked [E][2I][H]/[E][H][I] buffers;
 *  rebuild_row_idx     the permute's row_idx is rebuilt by a pass of its own instead of being
 *                      emitted by the router's top-k and handed on;
 *  no_pack             the rollout engine does not pre-pack expert weights into the skinny
 *                      kernel's 16-wide panel layout at weight load (the "NZ" switch,
 *                      src/kernels/cpu/gemm_packed.c). Training never packs (weights change
 *                      every step, and OpenBLAS offers no pre-packed sgemm).
 * per_expert_loop makes separate_permute and rebuild_row_idx moot (the loop has neither).
 *  ep_size, ep_rank    expert parallelism (src/parallel/ep.h), not a switch: the model holds only
 *                      experts [ep_rank·E/ep_size, (ep_rank+1)·E/ep_size) of each MoE layer (its
 *                      stacked expert tensors are [E/ep_size, ...]; the router stays [E, H]) and the
 *                      forward needs a runtime whose MoE dispatch hook is set (model_acts.par, forward.h's model_hooks;
 *                      src/parallel/ep.c fills it). ep_size 0 or 1 = every expert.
 *  batch_invariant     rollout.batch_invariant (not a switch of the practice): every kernel reduces each
 *                      output element in one fixed order whatever the batch's size, composition and split
 *                      (decode or full-sequence, chunked prefill, micro-batch, layout), so the rollout
 *                      engine's behaviour logprobs equal the trainer's recomputed ones bit for bit
 *                      (docs/rl.md, "Bit-for-bit on-policy"). 0 = the fastest kernels. */
typedef struct {
    int per_expert_loop;
    int separate_permute;
    int per_expert_weights;
    int rebuild_row_idx;
    int no_pack;
    int ep_size, ep_rank;
    int batch_invariant;
    int recompute; /* activation recompute (model_acts' layout, model_backward): MODEL_RECOMPUTE_* */
    /* Tensor parallelism (src/parallel/tp.h, Megatron's column/row split): the config's sizes are this rank's
     * slice — num_attention_heads nh/tp, num_key_value_heads nkv/tp, intermediate_size Id/tp, vocab_size
     * Vl = ⌈V/tp⌉ (token ids [tp_rank·Vl, tp_rank·Vl + Vl), Megatron's vocabulary padded to a multiple of tp:
     * rows past tp_vocab are padding, zero and outside every softmax), moe_intermediate_size I/tp when
     * tp_experts (expert-TP; 0: every expert whole on every TP rank) — and the forward needs a runtime whose
     * model_hooks has tp_allreduce. tp_size 0 or 1 = no TP. tp_vocab: the whole vocabulary V. */
    int tp_size, tp_rank, tp_experts, tp_vocab;
    /* Megatron sequence parallelism on the TP group (actor.megatron.sequence_parallel; set with the slice by
     * tp_state_attach, src/parallel/tp_sp.h): model_acts_init lays the arena out for it (forward.h's
     * model_acts.sp_rows: the residual stream and the RMSNorms' per-row buffers hold ⌈N/tp_size⌉ rows) and the
     * forward needs a runtime whose model_hooks has tp_reduce_scatter / tp_all_gather. 0 = off. */
    int tp_sp;
} moe_exec_opts;

/* moe_exec_opts.recompute (model.enable_gradient_checkpointing + actor.recompute_granularity; docs/parallelism.md
 * "Activation recompute"): NONE keeps every layer's activations; FULL keeps each decoder layer's input (and the
 * routes it used) and recomputes the whole layer in the backward; SELECTIVE keeps the attention block's tensors
 * as well and recomputes the MLP/MoE sub-layer (post-attention norm, router, permute, expert GEMMs, SwiGLU). */
enum { MODEL_RECOMPUTE_NONE = 0, MODEL_RECOMPUTE_FULL = 1, MODEL_RECOMPUTE_SELECTIVE = 2 };

typedef struct {
    int vocab_size;
    int hidden_size;               /* H */
    int intermediate_size;         /* dense MLP width Id */
    int moe_intermediate_size;     /* expert width I */
    int num_hidden_layers;         /* L */
    int num_attention_heads;       /* nh */
    int num_key_value_heads;       /* nkv */
    int head_dim;                  /* hd (read from config.json; default H/nh) */
    int num_experts;               /* E (0 = no MoE layers) */
    int num_experts_per_tok;       /* K */
    int decoder_sparse_step;
    int norm_topk_prob;
    int tie_word_embeddings;
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    float router_aux_loss_coef;
    float initializer_range;
    int bos_token_id, eos_token_id; /* -1 when absent */
    int n_mlp_only_layers;
    int mlp_only_layers[MOERL_MAX_LAYERS];
    moe_exec_opts exec;            /* execution switches (not in config.json); zero = default */
} moe_config;

/* Experts this model holds (exec.ep_size / ep_rank): returns their count and sets *lo to the first
 * one's global index (E and 0 without expert parallelism). */
int moe_config_local_experts(const moe_config *c, int *lo);
/* The whole model's vocabulary size: vocab_size, or exec.tp_vocab for a tensor-parallel slice (token ids are
 * always whole-vocabulary ids). */
int moe_config_vocab(const moe_config *c);
/* Layer l is MoE iff l ∉ mlp_only_layers, num_experts > 0 and (l+1) % decoder_sparse_step == 0. */
int moe_config_layer_is_moe(const moe_config *c, int l);
/* Parse a HF config.json (model_type must be "qwen3_moe"). Missing optional fields take HF
 * defaults; a field of the wrong type, a missing required field, or an inconsistent value
 * (nh % nkv != 0, K > E, ...) → MOERL_ERR naming the file, the field and what was expected. */
int moe_config_load(moe_config *c, const char *config_json_path);
/* Validate invariants (same checks as load). */
int moe_config_validate(const moe_config *c);
/* Write config.json (HF field names, model_type qwen3_moe, architectures) atomically. */
int moe_config_save(const moe_config *c, const char *path);

/* Tensor flags. */
enum {
    TF_DECAY = 1,      /* AdamW weight decay applies (matrices; not norms) */
    TF_EXPERT = 2,     /* stacked expert weight [E][...] */
    TF_ROUTER = 4,     /* router (mlp.gate) weight */
    TF_NORM = 8,       /* RMSNorm weight */
    TF_EMBED = 16,     /* embedding (and tied head) */
};

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[4];
    int64_t numel;
    size_t offset;     /* in floats, into params / grads / moments */
    int flags;
    int layer;         /* -1 for non-layer tensors */
} tensor_info;

/* Per-layer views (pointers into a parameter-layout buffer: params, grads, m or v). */
typedef struct {
    float *input_layernorm;          /* [H] */
    float *q_proj, *k_proj, *v_proj; /* [nh·hd, H], [nkv·hd, H], [nkv·hd, H] */
    float *o_proj;                   /* [H, nh·hd] */
    float *q_norm, *k_norm;          /* [hd] */
    float *post_attention_layernorm; /* [H] */
    float *router;                   /* [E, H]       (MoE layers) */
    float *experts_gate_up;          /* [E, 2I, H]   (MoE layers) */
    float *experts_down;             /* [E, H, I]    (MoE layers) */
    float *mlp_gate_up;              /* [2Id, H]     (dense layers) */
    float *mlp_down;                 /* [H, Id]      (dense layers) */
} layer_views;

typedef struct {
    float *embed_tokens;  /* [V, H] */
    float *norm;          /* [H] */
    float *lm_head;       /* [V, H] (== embed_tokens when tied) */
    layer_views layers[MOERL_MAX_LAYERS];
} model_views;

typedef struct {
    moe_config cfg;
    int n_tensors;
    tensor_info *tensors;
    size_t n_params;      /* floats in each buffer */
    float *params;        /* [n_params] */
    void *params_map;     /* when params lie in a mapped checkpoint file (checkpoint.c, zero-copy load):
                           * that mapping (private, copy on write), unmapped by model_free_params;
                           * NULL when params is a heap buffer */
    size_t params_map_len;
    float *grads;         /* [n_params], zeroed by model_zero_grad */
    model_views p, g;     /* views into params and grads */
    /* Expert weights pre-packed for the skinny kernel (model_pack_experts), NULL when not
     * packed; per MoE layer l: nz_gate_up[l] [E][gemm_packed_size(2I, H)],
     * nz_down[l] [E][gemm_packed_size(H, I)]. Valid only until params change. */
    float *nz;
    const float *nz_gate_up[MOERL_MAX_LAYERS], *nz_down[MOERL_MAX_LAYERS];
    /* bf16 weights of decode steps (the rollout engine's rollout.dtype bf16, built and owned by
     * src/rollout/engine.c), NULL = fp32. When set, params hold the same bf16-rounded values. */
    const struct moe_bf16_weights *bf16;
} moe_model;

/* bf16 copies, in the panel layout of gemm_packed16_pack, of the weights a decode step reads:
 * per layer the q, k, v and o projections and (MoE layers) every expert's gate_up
 * [E][gemm_packed_size(2I, H)] and down [E][gemm_packed_size(H, I)]; the LM head. */
typedef struct moe_bf16_weights {
    uint16_t *buf;
    const uint16_t *q[MOERL_MAX_LAYERS], *k[MOERL_MAX_LAYERS], *v[MOERL_MAX_LAYERS], *o[MOERL_MAX_LAYERS];
    const uint16_t *gate_up[MOERL_MAX_LAYERS], *down[MOERL_MAX_LAYERS];
    const uint16_t *lm_head;
} moe_bf16_weights;

/* Build the tensor table and allocate params+grads (zeroed). */
int model_init(moe_model *m, const moe_config *cfg);
/* Same layout without a gradient buffer (rollout engines: grads == NULL). */
int model_init_inference(moe_model *m, const moe_config *cfg);
/* The tensor table (and zeroed grads when with_grads) but no parameter buffer: params and the
 * views m->p stay NULL until the caller provides them (checkpoint.c: the loader allocates or maps
 * the buffer itself rather than zero-filling one it then overwrites). */
int model_init_layout(moe_model *m, const moe_config *cfg, int with_grads);
void model_free(moe_model *m);
/* Release the parameter buffer only (heap or mapped file, see params_map); params = NULL. */
void model_free_params(moe_model *m);
/* Random init as HF _init_weights: normal(0, initializer_range) for linear and embedding
 * weights, norms = 1. Deterministic from seed. */
void model_init_random(moe_model *m, uint64_t seed);
/* Look up a tensor by moerl name; NULL if absent. */
const tensor_info *model_find_tensor(const moe_model *m, const char *name);
/* Fill views for any buffer of the parameter layout (params, grads, moments). */
void model_views_for(const moe_model *m, float *base, model_views *out);
void model_zero_grad(moe_model *m);
/* Pack every MoE layer's expert weights from params into m->nz (allocated on first use), for
 * the decode-sized product of the forward (src/kernels/cpu/gemm_packed.c); with
 * cfg.exec.no_pack it frees m->nz instead. Call again after every change of params (the rollout
 * engine does at each weight load); model_forward/mlp_forward use m->nz whenever it is set. */
void model_pack_experts(moe_model *m);
/* Number of parameters as HF counts them (tied head counted once). */
int64_t model_num_params(const moe_model *m);

/* ---- Hugging Face names ----
 * Every HF tensor maps to ONE contiguous region of a parameter-layout buffer: expert e's
 * gate_proj is rows [0,I) of gate_up[e], up_proj rows [I,2I), down_proj is down[e]; a dense
 * layer's gate_proj/up_proj are rows [0,Id)/[Id,2Id) of mlp.gate_up_proj.
 * model_hf_count: number of HF tensors (lm_head omitted when tied).
 * model_hf_name: the i-th HF name (0 ≤ i < count) in HF order, written into buf.
 * model_hf_tensor: pointer into base for an HF name, its shape (ndim ≤ 2) and numel;
 * NULL if the name is not a tensor of this model. */
int model_hf_count(const moe_model *m);
void model_hf_name(const moe_model *m, int i, char *buf, size_t bufsize);
float *model_hf_tensor(const moe_model *m, float *base, const char *hf_name, int *ndim, int64_t shape[2],
                       int64_t *numel);

/* ---- checkpoints (checkpoint.c) ---- */
/* MOERL_ERR naming the first tensor with a NaN or infinite parameter (message: "tensor T <verb>
 * <where> has a non-finite value"). Loading and saving both refuse non-finite weights. */
int model_check_finite(const moe_model *m, const char *where, const char *verb);
/* Load DIR/config.json and DIR/model.safetensors or DIR/model.safetensors.index.json (sharded).
 * HF names; per-expert tensors stacked. Unknown or missing tensors and shape mismatches are
 * errors naming the tensor and both shapes. Builds the model (model_init_layout: params and
 * grads) and fills the buffer, or adopts the mapped file as the buffer (checkpoint.c; the mode: model_load_opts, model/checkpoint.h). */
int model_load_hf(moe_model *m, const char *dir);
/* model_load_hf without a gradient buffer (grads NULL): for generate, score and eval. */
int model_load_hf_inference(moe_model *m, const char *dir);
/* Load weights only into an initialised model (config must match). */
int model_load_weights(moe_model *m, const char *dir);
/* The checks of model_load_weights alone — DIR/config.json against m's config, every tensor present
 * with m's shape and a convertible dtype, none unknown — reading no tensor data and changing
 * nothing in m: the same verdict and message as the load would give (before anything is written). */
int model_check_weights(moe_model *m, const char *dir);
/* Save HF layout (experts split back), dtype ST_F32 or ST_BF16, config.json, sharded with an
 * index when the data exceeds shard_bytes (0 = never shard). Every file written atomically. */
int model_save_hf(const moe_model *m, const char *dir, int store_bf16, uint64_t shard_bytes);

#endif
