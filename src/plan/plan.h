/* moerl plan: memory per rank and communication per step of a Qwen3-MoE RL job, from the model's
 * config.json and the parallel layout alone (nothing is allocated; a 30B model plans in
 * microseconds). The formulas follow what moerl itself allocates and sends:
 *
 *  parameter layout   src/model/model.c: one fp32 buffer, every tensor padded to 16 floats;
 *                     gradients and both AdamW moments use the same layout (adamw.h);
 *  activations        src/model/forward.c's model_acts arena (layout(): every buffer rounded to
 *                     64 bytes), sized for one micro-batch of actor.ppo_max_token_len_per_gpu
 *                     tokens; plan_acts_bytes reproduces model_acts_bytes() byte for byte;
 *  KV cache           src/rollout/engine.c: K and V, [L][max_num_seqs][max_model_len][nkv·hd];
 *  traffic            src/dist: the gradient all-reduce sends 4·n_params bytes per update
 *                     (dist_reducer_last_bytes' raw/sent without compression), the weight
 *                     broadcast 4·n_params per sync (dist_xfer_stats.bytes).
 *
 * Parallel layouts moerl does not run yet (FSDP, EP, SP, PP) are planned from the standard
 * formulas, written beside each field below. The trainer world of n_trainer ranks factors as
 *     n_trainer = pp · sp · dp          (pipeline stages × Ulysses sequence ranks × data replicas)
 * FSDP shards dense parameters, gradients and optimizer state over fsdp ranks of a stage
 * (fsdp divides n_trainer/pp; 1 = plain DDP replication, moerl's trainer today); EP splits the
 * experts over ep ranks of a stage, and each expert's shard is further FSDP-sharded when
 * fsdp > ep, so a rank holds 1/max(ep, fsdp) of the expert parameters (Megatron's expert data
 * parallel = fsdp/ep). Sources: ZeRO (Rajbhandari et al. 2020) for the 2+2+12 / 4+4+8 bytes per
 * parameter and the ZeRO-3 all-gather/reduce-scatter volumes; DeepSpeed-Ulysses (Jacobs et al.
 * 2023) for the sequence all-to-alls; GShard/Megatron-Core for the expert dispatch/combine
 * all-to-alls; Megatron 1F1B (Narayanan et al. 2021) for the in-flight micro-batches of a stage.
 */
#ifndef MOERL_PLAN_H
#define MOERL_PLAN_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    /* trainer side */
    int n_trainer;          /* trainer.n_ranks: trainer devices */
    int fsdp;               /* actor.fsdp_config.fsdp_size: ≤ 0 = all ranks of a stage (n_trainer/pp), 1 = DDP */
    int ep;                 /* actor.expert_parallel_size */
    int sp;                 /* actor.ulysses_sequence_parallel_size */
    int pp;                 /* actor.pipeline_parallel_size */
    int dtype_bytes;        /* 4: fp32 everywhere (moerl today); 2: bf16 weights/grads/activations with fp32 master + moments */
    int64_t micro_tokens;   /* actor.ppo_max_token_len_per_gpu: tokens per micro-batch per rank (before sp) */
    int recompute;          /* activation recompute (full, per layer) */
    int micro_batches;      /* micro-batches per optimizer update on a rank (1F1B in-flight bound with pp) */
    int updates_per_step;   /* optimizer updates per trainer step: require_batches · ppo_epochs */
    int64_t step_tokens;    /* tokens (prompt + response) trained per trainer step, all ranks, one epoch */
    /* rollout side */
    int n_rollout;          /* rollout devices */
    int rollout_tp;         /* devices per engine replica (tensor parallel) */
    int max_num_seqs;       /* rollout.max_num_seqs per replica */
    int max_model_len;      /* prompt + response tokens per sequence (the engine's max_model_len) */
    int kv_dtype_bytes;     /* 4 (moerl's engine) or 2 */
    int sync_every;         /* trainer steps per weight sync (trigger_parameter_sync_step) */
} plan_input;

typedef struct {
    /* whole model */
    int64_t n_params;            /* floats of moerl's parameter layout (16-float padding per tensor) */
    int64_t n_params_dense;      /* of which non-expert (padded) */
    int64_t n_params_expert;     /* stacked expert tensors (padded) */
    int64_t n_params_hf;         /* unpadded, HF's count */
    int64_t n_active;            /* matmul parameters a token passes through (model_active_matmul_params) */
    int dp;                      /* n_trainer / (pp · sp) */
    int fsdp;                    /* resolved */
    int stage_layers;            /* decoder layers of the fullest pipeline stage */
    /* per trainer rank (the fullest stage: the first when it holds the embedding), bytes */
    double weights;              /* params on the rank: dense/fsdp + expert/max(ep,fsdp), × dtype_bytes */
    double grads;                /* same count × dtype_bytes */
    double master;               /* fp32 master copy (bf16 only; 0 with fp32) */
    double moments;              /* AdamW m and v, fp32: 8 bytes per local parameter */
    double gathered;             /* FSDP: two layers' full parameters in flight (current + prefetched), 0 when fsdp = 1 */
    double acts;                 /* model_acts for micro_tokens/sp tokens over the stage's layers × in-flight micro-batches */
    double acts_recompute;       /* same with full per-layer recompute: layer inputs + one layer's buffers */
    double total, total_recompute;
    /* per rollout device, bytes */
    double rollout_weights;      /* all parameters × dtype / rollout_tp */
    double kv_cache;             /* 2 · L · max_num_seqs · max_model_len · nkv · hd · kv_dtype / min(tp, nkv) */
    double rollout_total;
    /* traffic per rank per optimizer update: the all-reduce as its payload (the bytes moerl's reducer
     * counts; a ring sends 2(n−1)/n of it), every other collective as the bytes a rank sends */
    double allreduce;            /* gradient all-reduce across replicas: local gradient bytes (fsdp=1: 4·n_params in fp32) */
    double allgather;            /* FSDP: params gathered twice (forward, backward): 2 · (fsdp−1)/fsdp · stage params · dtype */
    double reduce_scatter;       /* FSDP: (fsdp−1)/fsdp · stage gradient bytes */
    double alltoall_ep;          /* EP: 4 per MoE layer per micro-batch (dispatch+combine, fwd+bwd): tokens·K·H·dtype·(ep−1)/ep */
    double alltoall_sp;          /* Ulysses: 4 fwd + 4 bwd per layer: (N/sp)·(nh+2nkv+nh)·hd·dtype·(sp−1)/sp */
    double p2p_pp;               /* PP: per micro-batch an activation forward and its gradient back: 2·N·H·dtype (0 when pp = 1) */
    double per_step;             /* sum of the above × updates_per_step (micro-batch terms scale with step_tokens) */
    double weight_bcast;         /* per sync, the root sends all parameters: n_params · 4 (moerl, fp32) or n_params_hf · 2 (bf16) */
} plan_result;

/* Bytes of moerl's model_acts arena for max_tokens tokens (forward.c's layout(), with 64-byte
 * rounding of every buffer), restricted to decoder layers [l0, l1) with the head and backward
 * scratch included; with recompute only the layer inputs [N,H] of all but one layer are kept.
 * plan_acts_bytes(c, N, 0, L, 0) == model_acts_bytes(m, N) (tested). */
double plan_acts_bytes(const moe_config *c, int64_t max_tokens, int l0, int l1, int recompute);

/* Parameter counts of moerl's layout (padded) for c: total, non-expert, expert, HF (unpadded). */
void plan_param_counts(const moe_config *c, int64_t *total, int64_t *dense, int64_t *expert, int64_t *hf);

/* The plan. Errors (message names the field and value): sizes ≤ 0, n_trainer not divisible by
 * pp·sp, fsdp or ep not dividing n_trainer/pp, more stages than layers, dtype not 2 or 4,
 * n_rollout not divisible by rollout_tp. */
int plan_compute(const moe_config *c, const plan_input *in, plan_result *out);

#endif
