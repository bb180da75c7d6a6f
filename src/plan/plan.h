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
 * The parallel layouts follow moerl's own schedules (FSDP and HSDP, Ulysses SP, pipeline, EP and
 * EP × FSDP, pipeline × EP, pipeline × FSDP (plan_pp_fsdp.h), each alone or with data parallelism: plan_traffic_rank gives the bytes the dist_comm
 * counters count, checked byte for byte by tests/test_dist_plan.c under mpirun). The trainer world of n_trainer ranks factors as
 *     n_trainer = pp · sp · dp          (pipeline stages × Ulysses sequence ranks × data replicas)
 * FSDP shards dense parameters, gradients and optimizer state over fsdp ranks of a stage
 * (fsdp divides n_trainer/pp; 1 = plain DDP replication); EP splits the
 * experts over ep ranks of a stage; with both, ep · fsdp divides the stage and FSDP shards each
 * rank's expert slice over the fsdp ranks holding the same experts (grid.h), so a rank holds
 * 1/fsdp of the dense and 1/(ep · fsdp) of the expert parameters (Megatron's expert data
 * parallel). Sources: ZeRO (Rajbhandari et al. 2020) for the 2+2+12 / 4+4+8 bytes per
 * parameter and the ZeRO-3 all-gather/reduce-scatter volumes; DeepSpeed-Ulysses (Jacobs et al.
 * 2023) for the sequence all-to-alls; GShard/Megatron-Core for the expert dispatch/combine
 * all-to-alls; Megatron 1F1B (Narayanan et al. 2021) for the in-flight micro-batches of a stage.
 */
#ifndef MOERL_PLAN_H
#define MOERL_PLAN_H

#include <stdint.h>

#include "model/model.h"

typedef enum {
    PLAN_PP_STAGE_LOCAL = 0, /* a stage holds only its own layers' parameters, gradients and AdamW moments, and sums
                                the gradients over its dp ranks (grid.stage_comm): Megatron's layout, and what
                                par_state_init builds — the pipeline `moerl sft` and `moerl rl` run */
    PLAN_PP_REPLICATED       /* every rank holds every stage's parameters and optimizer state; the gradient sum runs
                                over all trainer ranks (a reducer over trainer_comm). Run only by pp_state_new
                                without pp_own_stage (bench/bench_dist_pipeline.c's bubble benchmark,
                                tests/test_dist_pp.c's replicated case); kept for those and checked by
                                tests/test_dist_plan.c with plan.pp_params=replicated */
} plan_pp_params;

/* The most tokens per step plan accepts: 2^53, where doubles stop counting every token. */
#define PLAN_MAX_STEP_TOKENS 9007199254740992.0

typedef struct {
    /* trainer side */
    int n_trainer;          /* trainer.n_ranks: trainer devices */
    int fsdp;               /* actor.fsdp_config.fsdp_size: ≤ 0 = all ranks of a stage (n_trainer/pp), 1 = DDP */
    int ep;                 /* actor.expert_parallel_size */
    int sp;                 /* actor.ulysses_sequence_parallel_size */
    int pp;                 /* actor.pipeline_parallel_size */
    int tp;                 /* actor.megatron.tensor_model_parallel_size (≤ 1: off). TP × DP, TP × EP × DP with
                               tp_experts 0 (par_check_tp; the slice planned with EP over the dp ranks, tp_ep.h),
                               and TP × pipeline (× DP; plain 1F1B, no EP: the slice planned as pp stages over
                               n_trainer/tp ranks + each stage's TP rows, plan_tp_pp.h):
                               every rank holds tp_config_apply's slice (heads, kv heads — replicated when
                               nkv < tp —, the dense MLP width, the vocabulary padded to a multiple of tp, the
                               experts' I with tp_experts) and the TP group all-reduces activations (tp.h) */
    int tp_experts;         /* expert-TP: actor.megatron.expert_tensor_parallel_size ≠ 1 (each expert's I split);
                               0: every expert whole on every TP rank */
    int tp_sp;              /* Megatron sequence parallelism (actor.megatron.sequence_parallel; needs tp ≥ 2, TP × DP
                               or TP × EP × DP, as par_check_tp): the row all-reduces of [N,H] become reduce-scatters
                               and all-gathers over ⌈N/tp⌉ rows (tp_sp.h); the arena's residual stream and RMSNorm
                               statistics hold ⌈N/tp⌉ rows (forward.h model_acts.sp_rows; plan_acts_bytes of the
                               slice's config with exec.tp_sp) */
    int fsdp_keep_gathered; /* actor.fsdp_config.reshard_after_forward=false (fsdp.h): the training passes keep every
                               unit gathered and the gradients unreduced for the mini-batch — one all-gather of
                               the units the pre-pass left released, one reduce-scatter per unit and update; the
                               peak holds the whole (sliced) model and its gradient. 0: reshard (default) */
    int dtype_bytes;        /* 4: fp32 everywhere (moerl today); 2: bf16 weights/grads/activations with fp32 master + moments */
    int64_t micro_tokens;   /* actor.ppo_max_token_len_per_gpu: tokens per packed micro-batch (before sp); the
                               traffic assumes every micro-batch full */
    int recompute;          /* activation recompute: MODEL_RECOMPUTE_* (model.enable_gradient_checkpointing,
                               actor.recompute_granularity) */
    int micro_batches;      /* micro-batches per optimizer update on a rank (≤ 0: from step_tokens) */
    int updates_per_step;   /* optimizer updates per trainer step: require_batches · ppo_epochs */
    int64_t step_tokens;    /* tokens (prompt + response) trained per trainer step, all ranks, one epoch */
    int fwd_only_passes;    /* forward-only passes per micro-batch before the training pass (1: the router-count
                               pre-pass of the global aux loss, train.h compute_router_counts; 0: none) */
    int logprob_passes;     /* forward-only logprob passes per trainer step over the step's data (the RL trainer's
                               proximal logprobs, compute_logprobs: 1 with actor.use_decoupled_loss or recomputed
                               old logprobs; 0: none) */
    int64_t logprob_tokens; /* tokens (prompt + response) of the step's data, all ranks: step_tokens for one epoch */
    double resp_fraction;   /* response share of those tokens (the logprobs the pipeline sums onto every stage) */
    int ref_model;          /* actor.use_kl_loss: the frozen reference policy of the k3 KL loss (trainer_init's copy,
                               sharded as the actor by trainer_shard_ref under model parallelism, and a
                               forward-only logprob pass over the rank's data each step through its own
                               strategies, in the actor's arena: trainer_ref_logprobs) */
    plan_pp_params pp_params; /* pipeline parameter layout (plan_pp_stage_params) */
    int vpp;                /* actor.virtual_pipeline_parallel_size: model chunks per stage (interleaved 1F1B; ≤ 1 =
                               plain 1F1B). The cut is into pp·v virtual stages, stage s holds chunks c = virtual
                               stages c·pp + s (pipeline.h); micro-batches per update round up to a multiple of pp */
    int dispatcher;         /* EP token exchange: moe_dispatcher of parallel/grid.h (0 = auto) */
    int alltoall_max_ep;    /* auto: all-to-all up to this EP size (≤ 0: 16) */
    double capacity_factor; /* all-to-all block capacity factor (≤ 0: 1.25) */
    /* rollout side */
    int n_rollout;          /* rollout devices */
    int rollout_tp;         /* devices per engine replica (tensor parallel) */
    int max_num_seqs;       /* rollout.max_num_seqs per replica */
    int record_routes;      /* rollout.enable_rollout_routing_replay: the engine records every token's experts */
    int max_model_len;      /* prompt + response tokens per sequence (the engine's max_model_len) */
    int kv_dtype_bytes;     /* 4 (moerl's engine) or 2 */
    int sync_every;         /* trainer steps per weight sync (trigger_parameter_sync_step) */
    /* GRPO groups, for the pipeline's micro-batch count (pp > 1, micro_batches ≤ 0): a group's
     * group_size sequences never split across data-parallel pipelines (rl_split_minibatch). With
     * group_size ≤ 0 the update's sequences are split evenly, whole groups ignored. */
    int group_size;         /* rollout.n */
    int groups_per_update;  /* actor.ppo_mini_batch_size */
    int min_seq_len;        /* the fewest tokens a sequence can have (prompt, empty response) */
    const char *seq_len_src; /* where max_model_len comes from, for messages (NULL: "plan's sequence length") */
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
    int fullest_stage;           /* the pipeline stage the per-rank figures below are for (0 without pp) */
    /* per trainer rank (the fullest stage: the first when it holds the embedding), bytes */
    double weights;              /* params on the rank: FSDP alone: Σ over units of ⌈n_u/fsdp⌉ rounded up to 16
                                    (fsdp.c's shard); else dense/fsdp + expert/max(ep,fsdp); × dtype_bytes. A
                                    stage-local pipeline's last stage with tied embeddings also holds the
                                    embedding's copy (its LM head; pp_held_floats) */
    double grads;                /* same count × dtype_bytes */
    double master;               /* fp32 master copy of the owned parameters (bf16 only; 0 with fp32) */
    double moments;              /* AdamW m and v, fp32: 8 bytes per owned parameter (the tied copy has none:
                                    stage 0 steps the embedding) */
    double gathered;             /* FSDP: the peak of gathered units + live gradient units + bounce buffers over one
                                    update (fsdp.c's peak_gathered_bytes, from the schedule replay of the rank's
                                    expert slice) when no reduce-scatter completes before the schedule waits for
                                    it: the upper bound; 0 when fsdp = 1 */
    double gathered_low;         /* the same when every reduce-scatter completes as it starts (the lower bound:
                                    fsdp.c polls between layers, so a rank lands in [gathered_low, gathered]) */
    double acts;                 /* model_acts for ⌈micro_tokens/sp⌉ tokens over the stage's layers × in-flight
                                    micro-batches (pp − stage, plan_pp_inflight); interleaved: Σ over the stage's
                                    chunks of pp_slots_needed's slots (pp_schedule's order) × the chunk's layers */
    double acts_recompute;       /* same with activation recompute at plan_input.recompute's granularity (full when
                                    off): the kept tensors per layer + one layer's recomputed buffers */
    double ref_weights;          /* actor.use_kl_loss: the reference model, as trainer.c holds it: what the actor's
                                    parameters hold on the rank (FSDP's unit shards of the expert slice, the local
                                    experts, the stage's range + a tied last stage's copy; the whole padded layout
                                    with plain DP), in fp32 whatever dtype_bytes (× 4) */
    double ref_acts;             /* its pass's activations beyond the actor's arena (which it runs in): a pipeline's
                                    own slots, one per chunk (forward-only); 0 otherwise */
    double ref_held;             /* the actor's FSDP units still gathered when the reference pass runs (after the
                                    proximal pass of logprob_passes: the last forward region's; fsdp_stats.gathered_bytes) */
    double ref_gathered;         /* FSDP: the reference's own peak of gathered units over its forward-only pass
                                    (the replay of ⌈logprob_tokens/dp/micro_tokens⌉ passes from a cold start; fp32);
                                    released after the pass */
    double tp_ep_scratch;        /* TP × EP (experts whole, no Megatron SP): tp_ep.c's token-split scratch for
                                    micro_tokens tokens (tp_ep_scratch_bytes: the sub rows, their gradients, the
                                    TP all-gather's receive buffer, each MoE layer's index); else 0 */
    double total, total_recompute; /* weights + grads + master + moments + acts + ref_weights + tp_ep_scratch + the
                                    larger of gathered (the update's peak) and ref_acts + ref_held + ref_gathered
                                    (the reference pass) */
    /* per rollout device, bytes */
    double rollout_weights;      /* all parameters × dtype (fp32: the padded layout; bf16: the HF count); rollout TP:
                                    the tp_config_apply slice a replica rank holds (norms, routers, replicated kv
                                    heads whole) */
    double kv_cache;             /* 2 · L · max_num_seqs · max_model_len · nkv · hd · kv_dtype / min(tp, nkv) */
    double routing_record;       /* record_routes: max_num_seqs · max_model_len · MoE layers · K · 2 (int16; engine.h
                                    gen_request.out_routes), else 0 */
    double rollout_total;
    /* traffic per rank per optimizer update (the fullest rank: plan_traffic_rank of the first stage
     * holding the most bytes, the last Ulysses rank), in the convention of the counter moerl keeps for
     * it: the bucketed reducer's payload, every dist_comm collective as the bytes a rank sends */
    double allreduce;            /* gradient sums: reducer payload + HSDP replica all-reduce + EP gradient all-reduces
                                    + the pipeline stage's all-reduce over its dp ranks */
    double allgather;            /* FSDP parameter all-gathers (every pass, as moerl's schedule gathers; held: the
                                    training passes gather each unit once) */
    double reduce_scatter;       /* FSDP gradient reduce-scatters (every backward pass; held: once per update) */
    double alltoall_ep;          /* EP dispatch/combine, forward and backward */
    double alltoall_sp;          /* Ulysses q|k|v and output exchanges, forward and backward */
    double p2p_pp;               /* PP sends of the busiest stage: activations forward and their gradients back (+ the
                                    aux-loss statistics), the forward-only passes' activations, the tied embedding's
                                    exchange (pp_p2p + pp_p2p_fwd_only + pp_p2p_emb of plan_traffic) */
    double logprob_pass;         /* the forward-only logprob pass of a trainer step (plan_traffic_logprob over the
                                    rank's ⌈logprob_tokens/dp/micro_tokens⌉ micro-batches), all groups, × logprob_passes */
    double ref_pass;             /* actor.use_kl_loss: the reference logprob pass's traffic per step: the sharded
                                    reference runs the collectives of one forward-only logprob pass (those of
                                    logprob_pass / logprob_passes, as when resharding: the reference always
                                    reshards) on the actor's groups; 0 with plain DP */
    double per_step;             /* sum of the above × updates_per_step, + logprob_pass + ref_pass (fsdp_keep_gathered
                                    with a logprob pass: the step's first update gathers
                                    plan_traffic.fsdp_allgather_warm, not allgather) */
    double weight_bcast;         /* per sync, the root sends all parameters: n_params · 4 (moerl, fp32) or n_params_hf · 2 (bf16) */
    int micro_batches;           /* resolved micro-batches per update on a rank */
    int tp;                      /* actor.megatron.tensor_model_parallel_size (1: off). With TP the per-rank rows
                                    above are those of the rank's slice (tp_config_apply's config: weights, grads,
                                    moments and activations), allreduce holds the data-parallel gradient sum of the
                                    slice over dp_comm (tp_reduce_grads: 2(D−1)/D · n_slice · dtype) and the TP
                                    group's gradient sums, tp_allreduce the activation all-reduces. TP × pipeline:
                                    the fullest stage's range of the slice and its rows (allreduce: the stage's
                                    range over dp_comm; tp_allreduce: the stage's TP collectives) */
    double tp_allreduce;         /* TP: per update, the TP group's activation collectives of the training passes
                                    (plan_traffic tp_act_allreduce + tp_allgather + tp_reduce_scatter
                                    less the step's gradient part) */
    double tp_reduce_scatter;    /* Megatron SP (plan_input.tp_sp): the part of tp_allreduce moved by the TP group's
                                    reduce-scatters (plan_traffic tp_reduce_scatter); 0 without SP */
    int vpp;                     /* chunks per stage (resolved, ≥ 1) */
    double bubble_theory;        /* pp > 1: (pp − 1)/(v·m + pp − 1), m = micro_batches (pp_stats.theory_interleaved) */
} plan_result;

/* Traffic of one rank per optimizer update, per group and operation, in the units of the counter
 * moerl keeps for it (so a test can compare them byte for byte):
 *   reducer           dist_reducer_last_bytes' raw: the payload 4·n of the bucketed gradient all-reduce
 *                     (data parallel over trainer_comm, SP over stage_comm; a replicated pipeline's over
 *                     every trainer — a stage-local pipeline has no reducer);
 *   fsdp_allgather    dist_comm_bytes(fsdp_comm, ALLGATHER): (P−1)·s_u·dtype per gather of unit u (of the
 *                     rank's expert slice under EP), the gathers counted by replaying fsdp.c's schedule
 *                     (region, prefetch, release) over the passes, + the pass-count all-gather (one
 *                     float) of par_max_passes (EP × FSDP runs that one over stage_comm);
 *   fsdp_reduce_scatter (P−1)·Σ_u s_u·dtype per backward pass (fsdp_keep_gathered: once per update); s_u = ⌈n_u/P⌉ rounded up to 16 floats;
 *   replica_allreduce dist_comm_bytes(replica_comm, ALLREDUCE): 2(R−1)/R · Σ s_u · 4 (HSDP), R = D/fsdp;
 *                     EP × FSDP: 2(R−1)/R · 4 · the replicated tensors' floats in FSDP rank fsdp_rank's
 *                     pieces of the units (fsdp.c's ranges, unpadded tensor extents);
 *   ep_replica_allreduce  EP × FSDP: dist_comm_bytes(ep_replica_comm, ALLREDUCE), the same for the expert
 *                     tensors' floats over Rx = R/ep ranks;
 *   ep_alltoall       dist_comm_bytes(ep_comm, ALLTOALL): all-to-all: 4 exchanges per MoE layer and
 *                     training pass (2 per forward-only pass), each (ep−1)·E/ep blocks of 2 + cap·H floats,
 *                     cap = max(1, min(⌈factor·micro_tokens·K/E⌉, micro_tokens)), no spill; all-to-all-v:
 *                     the expectation under uniform routing, N·K·H·(ep−1)/ep rows' floats per exchange + the
 *                     counts (ep−1)·E/ep ints per forward dispatch;
 *   ep_grad_allreduce dist_comm_bytes over stage_comm + ep_dp_comm: the replicated (HF count) and local
 *                     expert gradients all-reduced, 2(n−1)/n · numel · 4 each;
 *   sp_alltoall       dist_comm_bytes(sp_comm, ALLTOALL) of Ulysses rank sp_rank: per layer and pass
 *                     forward hd·((sp−1)·n·W + (N−n)·nh_l), backward hd·((sp−1)·n·nh_l + (N−n)·W), with
 *                     n = the rank's token share ⌊N(r+1)/sp⌋ − ⌊Nr/sp⌋, nh_l = nh/sp,
 *                     nkv_l = nkv ≥ sp ? nkv/sp : 1, W = nh_l + 2·nkv_l (ulysses.h);
 *   pp_grad_allreduce dist_comm_bytes(stage_comm, ALLREDUCE) of a stage-local pipeline (pp_finish_grads):
 *                     2(D−1)/D · n_s · dtype, n_s = the stage's layout range (plan_pp_stage_params), D = its
 *                     dp ranks; a tied last stage adds 2(D−1)/D · e · dtype for its part of the embedding
 *                     gradient (e = the padded embedding), summed over D before it goes to stage 0;
 *   pp_p2p            pp_stats.bytes_sent of stage `stage` (the 1F1B schedule): per micro-batch N·H (+2E
 *                     aux statistics) forward unless last, N·H (+E) backward unless first (pipeline.h);
 *                     interleaved (v chunks): per chunk, forward unless the last virtual stage, backward
 *                     unless the first — v·(forward + backward) less the two ends;
 *   pp_p2p_fwd_only   the forward-only passes' sends on pp_comm (pp_compute_router_counts, only for a model
 *                     with MoE layers): N·H per micro-batch and pass unless last;
 *   pp_p2p_emb        a stage-local pipeline with tied embeddings: the last stage sends its embedding
 *                     gradient e·4 to stage 0 (pp_finish_grads), stage 0 the stepped embedding e·4 back
 *                     (pp_adamw_step, when the step is applied); dist_comm_bytes(pp_comm, P2P) of a step is
 *                     pp_p2p + pp_p2p_fwd_only + pp_p2p_emb.
 * Errors: as plan_compute; stage, sp_rank or fsdp_rank out of range. */
typedef struct {
    double fsdp_allgather_warm; /* fsdp_allgather of an update run right after the step's forward-only logprob
                                   pass (plan_traffic_rank), replayed from the state that pass leaves:
                                   fsdp_keep_gathered finds every unit gathered and sends only the pass count;
                                   resharding finds the last region's units (with tied embeddings the first
                                   forward then gathers the embedding once, not twice) */
    double reducer, fsdp_allgather, fsdp_reduce_scatter, replica_allreduce, ep_replica_allreduce, ep_alltoall,
        ep_grad_allreduce, sp_alltoall, pp_grad_allreduce, pp_p2p, pp_p2p_fwd_only, pp_p2p_emb;
    double sp_logprob_allreduce, pp_logprob_allreduce; /* plan_traffic_logprob only */
    double pp_norm_allreduce;   /* pipeline × FSDP (plan_pp_fsdp.h): dist_comm_bytes(pp_comm, ALLREDUCE) of the optimizer
                                   step, fsdp_grad_norm's squared-norm sum over the stages, 2(pp−1)/pp · 8; 0 otherwise */
    /* tensor parallelism (plan_input.tp > 1; the other fields are then those of the slice's model on the dp =
     * n_trainer/tp data replicas, reducer 0):
     *   tp_act_allreduce  dist_comm_bytes(tp_comm, ALLREDUCE) of the passes, 2(P−1)/P · bytes: per training pass
     *                     forward N·H (vocab-parallel embedding) + per layer N·H (o_proj) + N·H (the dense MLP's or
     *                     expert-TP's down projections), the logprob statistics 4N doubles (again in the backward, which
     *                     recomputes them: vp_logprob_backward); backward per layer N·H
     *                     (q/k/v input gradient) + N·H (dense gate_up, or expert-TP's experts) + N·K (expert-TP's
     *                     routing-weight gradient), N·H for the head; per forward-only pre-pass the forward's
     *                     [N,H] rows; per update the q/k-norm gradient sum (L · 2·head_dim floats) and the
     *                     clipping norm (2 doubles);
     *   tp_allgather      dist_comm_bytes(tp_comm, ALLGATHER): the vocabulary max, twice per training pass
     *                     (forward and backward) and once per forward-only logprob pass ((P−1)·2N floats: a
     *                     double as two floats) + with nkv < P the replicated k/v heads' gradient sum per
     *                     update ((P−1)·L·2·head_dim·H floats);
     *   tp_dp_allreduce   dist_comm_bytes(dp_comm, ALLREDUCE): the slice's gradient sum over the D = n_trainer/P
     *                     ranks holding it, 2(D−1)/D · n_slice · dtype (0 when D = 1).
     * plan_traffic_logprob under TP: per micro-batch the forward's rows and the logprob statistics.
     * TP × pipeline (pp > 1): the pipeline rows of the slice's stage (pp_grad_allreduce over dp_comm, p2p between
     * same-tp_rank ranks) and tp_* restricted to what the stage computes (plan_tp_pp.h); tp_dp_allreduce 0. */
    double tp_act_allreduce, tp_allgather, tp_dp_allreduce;
    /* Megatron sequence parallelism (plan_input.tp_sp; tp_sp.h), with c = ⌈N/P⌉ rows a rank and a row op costing
     * (P−1)·c·H·dtype (zero rows pad a short slice):
     *   tp_reduce_scatter dist_comm_bytes(tp_comm, REDUCE_SCATTER): per training pass 2 + 2L + 2·n_mlp row ops
     *                     (n_mlp: dense layers, and MoE layers under expert-TP), per forward-only pass 1 + L + n_mlp;
     *   tp_allgather      adds per training pass 4L + 2 row ops (ln1, ln2 and the final norm gathered, their
     *                     conjugates in backward), per forward-only pass (pre-pass, logprob pass) 2L + 1;
     *   tp_act_allreduce  keeps the logprob statistics, expert-TP's [N,K] and the q/k-norm and clipping sums
     *                     and adds the RMSNorm weights' gradient sum, 2(P−1)/P · (2L + 1)·H · dtype per update;
     *                     it has no [N,H] rows. 0 without SP. */
    double tp_reduce_scatter;
    /* TP × EP (ep > 1 with tp_experts 0: src/parallel/tp_ep.h): tp_allgather adds the expert rows, (P−1)·⌈N/P⌉·K·H
     * floats per MoE layer in every forward and backward pass (per logprob micro-batch: its forward's);
     * ep_alltoall is the slice's EP row with each rank dispatching its 1/P share of the tokens (the fixed-capacity
     * all-to-all's blocks sized by ⌈N/P⌉ tokens); tp_dp_allreduce covers the non-expert tensors only (HF counts, unpadded) and
     *   tp_ep_allreduce   dist_comm_bytes(ep_dp_comm, ALLREDUCE) + dist_comm_bytes(ep_comm, ALLREDUCE): the
     *                     E/ep whole experts' gradient over the Q = P·D/ep ranks holding them, 2(Q−1)/Q ·
     *                     n_expert/ep · dtype, and the clipping norm's double over the EP group, 2(ep−1)/ep · 8;
     *                     ep_grad_allreduce is 0.
     * SP × EP (tp_sp with ep > 1, experts whole: tp_sp.h): no expert-row all-gathers, and the MoE layers' ln2
     * gathers and their backward conjugates leave tp_allgather (per training pass 4L + 2 − 2·n_moe row ops, per
     * forward-only pass 2L + 1 − n_moe); tp_act_allreduce adds the aux-loss statistics, 2(P−1)/P · 2E · 4 bytes
     * per forward pass, and the routers' gradient sum, 2(P−1)/P · n_moe·E·H · dtype per update; ep_alltoall as
     * TP × EP. */
    double tp_ep_allreduce;
} plan_traffic;
int plan_traffic_rank(const moe_config *c, const plan_input *in, int stage, int sp_rank, int fsdp_rank,
                      plan_traffic *t);

/* Traffic of one rank in the RL trainer's forward-only logprob pass (train.h compute_logprobs, once
 * per trainer step for the proximal policy) over n_mb micro-batches of micro_tokens each (every
 * micro-batch full) whose sequences hold resp_tokens response tokens, in plan_traffic_rank's units:
 *   fsdp_allgather        fsdp.c's schedule replayed over n_mb forward-only passes from a cold start,
 *                         + the pass-count all-gather (not under EP × FSDP: stage_comm);
 *   ep_alltoall           2 exchanges per MoE layer of the stage and micro-batch (+ the counts, all-to-all-v);
 *   sp_alltoall           the forward exchanges of every layer of the stage per micro-batch;
 *   sp_logprob_allreduce  dist_comm_bytes(sp_comm, ALLREDUCE): each micro-batch's N logprobs summed onto
 *                         every Ulysses rank, 2(sp−1)/sp · N · 4;
 *   pp_p2p_fwd_only       N·H·dtype per micro-batch unless last stage;
 *   pp_logprob_allreduce  dist_comm_bytes(pp_comm, ALLREDUCE): the stages' batch check (8 doubles) and the last
 *                         stage's logprobs on every stage, 2(pp−1)/pp · (64 + 4 · resp_tokens).
 * Every other field 0. Errors: as plan_traffic_rank; n_mb < 0 or resp_tokens < 0. */
int plan_traffic_logprob(const moe_config *c, const plan_input *in, int stage, int sp_rank, int fsdp_rank, int n_mb,
                         double resp_tokens, plan_traffic *t);

/* The pipeline's memory model, kept apart so that both layouts can be checked: floats of the
 * parameters stage `stage` owns before any FSDP / EP division (dense, expert), and its layer range
 * [*l0, *l1). PLAN_PP_STAGE_LOCAL: its own layers (+ the embedding on the first stage, the final
 * norm and untied head on the last) — dense + expert is pp_stage_ranges' hi − lo; PLAN_PP_REPLICATED:
 * the whole model on every stage. The stage bounds are moerl's FLOP-balanced cut (pp_partition at the
 * balance length min(max_position_embeddings, 4096)). Errors: pp out of 1..L. */
int plan_pp_stage_params(const moe_config *c, int pp, plan_pp_params layout, int stage, double *dense, double *expert,
                         int *l0, int *l1);

/* The interleaved pipeline (v chunks per stage): floats of chunk `chunk` of stage `stage` — virtual
 * stage chunk·pp + stage of the pp·v-stage cut (the embedding on virtual stage 0, the final norm and
 * untied head on the last) — and its layers [*l0, *l1): pp_own_chunk_range's range. v = 1, chunk 0:
 * plan_pp_stage_params. Errors: chunk outside 0..v−1, pp·v above the layers. */
int plan_pp_chunk_params(const moe_config *c, int pp, int v, plan_pp_params layout, int stage, int chunk,
                         double *dense, double *expert, int *l0, int *l1);

/* Floats of the embedding copy a stage holds besides the ones it owns: the padded embedding on the
 * last stage of a stage-local pipeline (pp > 1) with tied embeddings, else 0. Owned + this is
 * pp_held_floats. */
double plan_pp_tied_copy(const moe_config *c, int pp, plan_pp_params layout, int stage);

/* In-flight activation slots of a pipeline stage: pp − stage (1F1B, pipeline.c), 1 without pp. */
int plan_pp_inflight(int pp, int stage);

/* Bytes of moerl's model_acts arena for max_tokens tokens (forward.c's layout(), with 64-byte
 * rounding of every buffer), restricted to decoder layers [l0, l1) with the backward scratch
 * included and the logits [N,V] and their gradient only when l1 is the last layer (a pipeline
 * stage's arena, model_acts_init_range). recompute (MODEL_RECOMPUTE_*, model.h): FULL keeps per layer
 * its input [N,H] and, for MoE layers, the routes it used [N,K] and its per-expert counts [E], plus ONE
 * scratch as large as the largest layer's other buffers (every layer's recomputed buffers alias it);
 * SELECTIVE keeps the attention block's buffers per layer too and shares the MLP/MoE sub-layer's.
 * Equals model_acts_init's arena_bytes byte for byte for every granularity (tests/test_recompute.c,
 * tests/test_plan.c). */
double plan_acts_bytes(const moe_config *c, int64_t max_tokens, int l0, int l1, int recompute);

/* The rollout engine's tensor parallelism against the model: tp must divide the n_heads attention
 * heads. Errors name rollout.tensor_model_parallel_size and both numbers (moerl plan, moerl simulate). */
int plan_check_rollout_tp(int tp, int n_heads);

/* Parameter counts of moerl's layout (padded) for c: total, non-expert, expert, HF (unpadded). */
void plan_param_counts(const moe_config *c, int64_t *total, int64_t *dense, int64_t *expert, int64_t *hf);

/* The plan. Errors (message names the field and value): sizes ≤ 0, n_trainer not divisible by
 * pp·sp, fsdp or ep not dividing n_trainer/pp, step_tokens outside 0..PLAN_MAX_STEP_TOKENS, more
 * than 2^31 − 1 micro-batches per update or per logprob pass on a rank, more stages than layers, pp > 1 with sp above 1
 * or with ep and fsdp both above 1 (moerl's par_check_pp_compose, through par_check_pp_alone), pp × fsdp with tied
 * embeddings (as parallel.c refuses it; plan_pp_fsdp.h plans the layout), dtype not
 * 2 or 4, n_rollout not divisible by rollout_tp. */
int plan_compute(const moe_config *c, const plan_input *in, plan_result *out);

#endif
