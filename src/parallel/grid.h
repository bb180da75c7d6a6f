/* The trainer ranks' model-parallel grid: pipeline (PP) × [data parallel (DP) × Ulysses sequence
 * parallel (SP)], with FSDP shard groups and expert-parallel (EP) groups carved from each stage's
 * ranks, as Megatron-LM and verl lay them out.
 *
 * T trainer ranks, pp stages, D = T / pp ranks per stage. Trainer rank t = stage · D + d, and inside
 * a stage d = dp_rank · sp + sp_rank: the sp ranks of one Ulysses group are consecutive and hold the
 * same sequences split along tokens; dp = D / sp batch shards. FSDP shard groups are the
 * consecutive blocks of fsdp ranks (d / fsdp) — sharding spans SP ranks as verl's FSDP does —
 * and replica groups (HSDP) join the ranks with the same position in their shard group. EP groups
 * are consecutive blocks of ep ranks (d / ep); ep divides E. Every size 1 gives a group of one.
 * EP × FSDP (ep > 1 and fsdp > 1 with ep·fsdp dividing D): the stage is cut into blocks of ep·fsdp
 * consecutive ranks; inside a block the EP groups stay consecutive (ep_rank = d mod ep) and an FSDP
 * group joins the fsdp ranks of the block with the same ep_rank (stride ep, fsdp_rank = (d mod
 * ep·fsdp) / ep), so FSDP shards identical expert slices, as the expert-data-parallel sharding of
 * Megatron-LM / torchtitan. replica_comm (same fsdp_rank: the ep ranks of a block and the other
 * blocks) then sums the replicated tensors' shards, ep_replica_comm (same fsdp_rank and ep_rank:
 * the other blocks) the expert shards (src/parallel/fsdp.c, fsdp_set_expert_groups). When ep·fsdp
 * does not divide D the groups are laid out as without EP (parallel.c refuses that combination).
 * TP × EP (tp > 1 and ep > 1, actor.megatron.expert_tensor_parallel_size=1; par_grid_tp_ep in grid.c, as
 * Megatron-LM's expert groups with expert_tensor_parallel_size 1): d = dp_rank · tp + tp_rank, the TP groups
 * consecutive as under TP × DP; an EP group joins the ep ranks with the same tp_rank and consecutive dp_rank
 * (stride tp in d: dp_rank / ep equal), ep_rank = dp_rank mod ep, so ep divides dp = D / tp. ep_dp_comm joins
 * every rank with the same ep_rank (every tp_rank, every EP block): the ranks holding the same experts, over
 * which the expert gradients are summed; dp_comm (same tp_rank) sums the other tensors' slices.
 *
 * Config keys (verl names): actor.fsdp_config.fsdp_size (−1 = all D ranks of a stage, verl's
 * default; 1 = off), actor.expert_parallel_size, actor.ulysses_sequence_parallel_size,
 * actor.pipeline_parallel_size, actor.virtual_pipeline_parallel_size (interleaved 1F1B: model chunks per
 * stage, Megatron-LM's virtual_pipeline_model_parallel_size), actor.moe.dispatcher (alltoall | alltoallv | auto),
 * actor.moe.alltoall_max_ep (auto picks all-to-all up to this EP size, all-to-all-v above: the
 * Ascend practice's switch at 16), actor.moe.capacity_factor (fixed-capacity all-to-all).
 * Sources: Megatron-LM parallel_state.initialize_model_parallel (rank order), verl
 * fsdp_workers (fsdp_size, ulysses_sequence_parallel_size), DeepSpeed-Ulysses. */
#ifndef MOERL_PARALLEL_GRID_H
#define MOERL_PARALLEL_GRID_H

#include "base/config.h"
#include "dist/dist.h"

typedef enum { MOE_DISPATCH_AUTO = 0, MOE_DISPATCH_ALLTOALL, MOE_DISPATCH_ALLTOALLV } moe_dispatcher;

typedef struct {
    int fsdp_size;            /* −1 = every rank of a stage */
    int expert_parallel_size;
    int ulysses_sequence_parallel_size;
    int pipeline_parallel_size;
    int virtual_pipeline_parallel_size; /* model chunks per stage (interleaved 1F1B); 0 or 1 = plain 1F1B */
    moe_dispatcher dispatcher;
    int alltoall_max_ep;      /* auto: all-to-all while ep ≤ this, all-to-all-v above */
    double capacity_factor;   /* all-to-all capacity per expert = ceil(factor · tokens · K / E) */
    int max_tokens;           /* micro-batch token limit (EP / SP buffers); set by par_state_init, 0 = unknown */
    int tensor_model_parallel_size;   /* actor.megatron.tensor_model_parallel_size: TP group size (tp.h); 1 = off */
    int expert_tensor_parallel_size;  /* actor.megatron.expert_tensor_parallel_size: 0 = the TP size (experts split
                                         I/tp), 1 = every expert whole on each TP rank */
    int sequence_parallel;            /* actor.megatron.sequence_parallel (needs tensor_model_parallel_size ≥ 2; tp_sp.h) */
    int fsdp_keep_gathered;   /* actor.fsdp_config.reshard_after_forward=false: FSDP keeps its units gathered and
                                 its gradients unreduced for a whole mini-batch (fsdp.h); 0 = reshard (default) */
} par_config;

typedef struct {
    par_config cfg;
    int T, D;                 /* trainer ranks; ranks per pipeline stage */
    int pp, dp, sp, fsdp, ep, replicas; /* sizes; replicas = D / fsdp */
    int stage, dp_rank, sp_rank, fsdp_rank, ep_rank, replica_rank, d;
    /* Groups (NULL when the grid has not been built, i.e. one process without roles). */
    dist_comm *stage_comm;    /* the D ranks of this stage (gradient sum of replicated params) */
    dist_comm *pp_comm;       /* the pp ranks with the same d (one pipeline), ranked by stage */
    dist_comm *dp_comm;       /* the dp ranks of this stage with the same sp_rank */
    dist_comm *sp_comm;       /* this rank's Ulysses group */
    dist_comm *fsdp_comm;     /* this rank's FSDP shard group */
    dist_comm *replica_comm;  /* ranks of this stage with the same fsdp_rank (HSDP replicas) */
    dist_comm *ep_comm;       /* this rank's expert-parallel group */
    dist_comm *ep_dp_comm;    /* ranks of this stage with the same ep_rank (gradient sum of experts) */
    /* Tensor parallelism (TP × DP, TP × EP × DP and TP × pipeline × DP; tp.h): the tp consecutive ranks of d / tp
     * form a TP group
     * (tp_comm), dp = D / tp, dp_rank = d / tp; dp_comm then joins the ranks with the same tp_rank (the
     * gradient sum of one slice). */
    int tp, tp_rank;
    dist_comm *tp_comm;
    dist_comm *ep_replica_comm; /* ranks of this stage with the same fsdp_rank and ep_rank (EP × FSDP:
                                 * the expert shards' sum over HSDP replicas) */
} par_grid;

/* Define / read the keys above on a config (defaults: every size 1, dispatcher auto, max ep 16,
 * capacity factor 1.25). Errors name the key and the expected range. */
void par_def_keys(cfg *c);
int par_read_keys(const cfg *c, par_config *pc);
/* Check the sizes against T trainer ranks and the model (E experts, nh/nkv heads, L layers):
 * pp·D = T, sp | D, fsdp | D, ep | D, ep | E, sp | nkv or nkv | sp with sp | nh (Ulysses with
 * GQA), pp ≤ L. The message names the key, its value and what would fit. */
int par_check(const par_config *pc, int T, int E, int nh, int nkv, int L);
/* The layouts `moerl plan` models with the pipeline: those moerl runs (par_check_pp_compose: data
 * parallelism, FSDP with HSDP replicas, EP; Ulysses SP 1, EP without FSDP). Kept as plan's entry point
 * (src/plan/plan.c, plan_config.c). T: trainer ranks (unused). Errors name every key with its value. */
int par_check_pp_alone(const par_config *pc, int T);
/* The layouts the pipeline combines with in this build (par_state_init builds them; `moerl rl` refuses
 * the rest with this before any work): data parallelism, FSDP (each stage's units sharded over its
 * FSDP group, parallel.c) and EP (each stage's experts split over its expert groups, plain or interleaved
 * 1F1B, without FSDP); actor.ulysses_sequence_parallel_size must be 1 with actor.pipeline_parallel_size > 1,
 * and with actor.expert_parallel_size > 1 actor.fsdp_config.fsdp_size must be 1. Errors name the keys with
 * their values. */
int par_check_pp_compose(const par_config *pc);
/* Tensor parallelism's sizes against T trainer ranks: actor.megatron.tensor_model_parallel_size divides T and,
 * when > 1, FSDP and Ulysses are 1 (TP × DP, TP × EP × DP: par_check_tp_ep, TP × pipeline × DP: par_check_tp_pp).
 * The model's sizes (heads, widths, vocabulary) are checked by tp_state_attach. Part of par_check. */
int par_check_tp(const par_config *pc, int T);
/* TP × EP's rule (part of par_check_tp): with tensor_model_parallel_size > 1 and expert_parallel_size > 1,
 * actor.megatron.expert_tensor_parallel_size must be 1 (experts whole, split over EP) and the EP size must
 * divide the T / pp / tp data-parallel ranks. Errors name the keys and their values. */
int par_check_tp_ep(const par_config *pc, int T);
/* TP × pipeline (Megatron's layout: TP innermost, then DP, then the stages; par_grid_init): each stage's D = T / pp
 * ranks hold D / tp whole TP groups, and a TP rank's pipeline (pp_comm) joins the ranks with its tp_rank and dp
 * position in every stage. Checked: tp · pp divides T, EP 1, and the plain 1F1B only
 * (actor.virtual_pipeline_parallel_size 1). Part of par_check_tp. Errors name the keys with their values. */
int par_check_tp_pp(const par_config *pc, int T);
/* Build the grid on trainer rank t of T (collective over the trainers: every group is made by
 * dist_comm_split in one fixed order). On error nothing is left allocated. */
int par_grid_init(par_grid *g, dist_ctx *ctx, const par_config *pc, int E, int nh, int nkv, int L);
void par_grid_free(par_grid *g);
/* The dispatcher the grid's EP size selects (auto resolved). */
moe_dispatcher par_dispatcher(const par_grid *g);
const char *moe_dispatcher_name(moe_dispatcher d);

#endif
