/* Trainer grid construction (see grid.h for the layout and its sources). */
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "parallel/grid.h"

/* Tensor parallelism's keys (verl's Megatron names; tp.h). */
static void par_def_tp_keys(cfg *c) {
    cfg_def_int(c, "actor.megatron.tensor_model_parallel_size", 1,
                "tensor parallelism (Megatron's column/row split of q/k/v and o, the MLP and experts, the vocabulary): "
                "the model split over this many consecutive trainer ranks; 1 = off");
    cfg_def_int(c, "actor.megatron.expert_tensor_parallel_size", -1,
                "expert-TP: -1 = the tensor_model_parallel_size (every expert's intermediate split over the TP group); "
                "1 = every expert whole on each TP rank");
    cfg_def_bool(c, "actor.megatron.sequence_parallel", false,
                 "Megatron sequence parallelism: between the row-parallel outputs and the column-parallel inputs the "
                 "residual stream and the RMSNorms hold a 1/tp slice of each micro-batch's tokens (reduce-scatter and "
                 "all-gather instead of all-reduce); needs tensor_model_parallel_size ≥ 2; with expert_parallel_size > 1 "
                 "(experts whole) each TP rank's own tokens go to their experts over its EP group");
}

/* Read and check them (the sizes against the other strategies: par_check_tp). */
static int par_read_tp_keys(const cfg *c, par_config *pc) {
    pc->tensor_model_parallel_size = (int)cfg_int(c, "actor.megatron.tensor_model_parallel_size");
    pc->expert_tensor_parallel_size = (int)cfg_int(c, "actor.megatron.expert_tensor_parallel_size");
    pc->sequence_parallel = cfg_bool(c, "actor.megatron.sequence_parallel");
    const int tp = pc->tensor_model_parallel_size, etp = pc->expert_tensor_parallel_size;
    if (tp < 1) return moerl_errorf("actor.megatron.tensor_model_parallel_size must be ≥ 1, got %d", tp);
    if (etp != -1 && etp != 1 && etp != tp && tp == 1)
        return moerl_errorf("actor.megatron.expert_tensor_parallel_size=%d: expert-TP splits an expert's width over "
                            "the tensor-parallel group, so it must be 1 or equal "
                            "actor.megatron.tensor_model_parallel_size (-1 = equal), and that is 1 here (no TP): use 1 "
                            "or -1, or set actor.megatron.tensor_model_parallel_size=%d with it", etp, etp);
    if (etp != -1 && etp != 1 && etp != tp)
        return moerl_errorf("actor.megatron.expert_tensor_parallel_size=%d: expert-TP must be 1 (experts whole on "
                            "each TP rank) or equal actor.megatron.tensor_model_parallel_size=%d (each expert's width "
                            "split over the TP group; -1 = equal)", etp, tp);
    if (pc->sequence_parallel && tp < 2)
        return moerl_errorf("actor.megatron.sequence_parallel=true needs actor.megatron.tensor_model_parallel_size ≥ 2 "
                            "(got %d): it splits the tokens over the tensor-parallel group", tp);
    return MOERL_OK;
}

int par_check_tp_ep(const par_config *pc, int T) {
    const int tp = pc->tensor_model_parallel_size, ep = pc->expert_parallel_size;
    if (tp <= 1 || ep <= 1) return MOERL_OK;
    if (pc->expert_tensor_parallel_size != 1)
        return moerl_errorf("actor.megatron.tensor_model_parallel_size=%d with actor.expert_parallel_size (%d) needs "
                            "actor.megatron.expert_tensor_parallel_size=1 (every expert whole, the experts split over "
                            "EP), got %d: expert-TP under EP is not part of this build", tp, ep,
                            pc->expert_tensor_parallel_size);
    const int pp = pc->pipeline_parallel_size > 0 ? pc->pipeline_parallel_size : 1, D = T / pp;
    if ((D / tp) % ep)
        return moerl_errorf("actor.expert_parallel_size=%d must divide the %d data-parallel rank%s of a TP layout (%d "
                            "trainer ranks / actor.megatron.tensor_model_parallel_size %d): an EP group joins ranks "
                            "with the same TP rank", ep, D / tp, moerl_plural(D / tp), D, tp);
    return MOERL_OK;
}

/* TP × EP (grid.h): the EP groups join the ranks with the same tp_rank, ep consecutive data-parallel indices
 * (stride tp in d); ep_rank = dp_rank mod ep. Sets g->ep_rank and *ep_color (the ep_comm split's color). */
static void par_grid_tp_ep(par_grid *g, int *ep_color) {
    g->ep_rank = g->dp_rank % g->ep;
    *ep_color = (g->stage * (g->dp / g->ep) + g->dp_rank / g->ep) * g->tp + g->tp_rank;
}

int par_check_tp(const par_config *pc, int T) {
    const int tp = pc->tensor_model_parallel_size, pp = pc->pipeline_parallel_size > 0 ? pc->pipeline_parallel_size : 1;
    if (tp <= 1) return MOERL_OK;
    const int fsdp = pc->fsdp_size == -1 ? T / pp : pc->fsdp_size;
    if (fsdp > 1 || pc->ulysses_sequence_parallel_size > 1)
        return moerl_errorf("actor.megatron.tensor_model_parallel_size=%d combines only with data parallelism, the "
                            "pipeline and expert parallelism in this build: actor.fsdp_config.fsdp_size (%d) and "
                            "actor.ulysses_sequence_parallel_size (%d) must be 1 with it (expert parallelism, "
                            "actor.expert_parallel_size %d, combines with it when "
                            "actor.megatron.expert_tensor_parallel_size=1, without the pipeline)", tp, fsdp,
                            pc->ulysses_sequence_parallel_size, pc->expert_parallel_size);
    if (pc->sequence_parallel && pp > 1)
        return moerl_errorf("actor.megatron.sequence_parallel=true with actor.pipeline_parallel_size=%d: Megatron "
                            "sequence parallelism combines with TP × DP and TP × EP × DP only in this build (set "
                            "sequence_parallel=false for TP × pipeline)", pp);
    if (pp > 1 && par_check_tp_pp(pc, T) != MOERL_OK) return MOERL_ERR;
    if (T % tp)
        return moerl_errorf("actor.megatron.tensor_model_parallel_size=%d does not divide the %d trainer rank%s", tp, T,
                            moerl_plural(T));
    return par_check_tp_ep(pc, T);
}

int par_check_tp_pp(const par_config *pc, int T) {
    const int tp = pc->tensor_model_parallel_size, pp = pc->pipeline_parallel_size;
    const int vpp = pc->virtual_pipeline_parallel_size > 0 ? pc->virtual_pipeline_parallel_size : 1;
    if (tp <= 1 || pp <= 1) return MOERL_OK;
    if (pc->expert_parallel_size > 1)
        return moerl_errorf("actor.megatron.tensor_model_parallel_size=%d with actor.pipeline_parallel_size=%d: "
                            "actor.expert_parallel_size (%d) must be 1 with it (TP × pipeline × EP is not part of this "
                            "build)", tp, pp, pc->expert_parallel_size);
    if (vpp > 1)
        return moerl_errorf("actor.megatron.tensor_model_parallel_size=%d with actor.pipeline_parallel_size=%d runs the "
                            "plain 1F1B schedule only in this build: actor.virtual_pipeline_parallel_size (%d) must be 1",
                            tp, pp, vpp);
    if (T % pp || (T / pp) % tp)
        return moerl_errorf("actor.megatron.tensor_model_parallel_size=%d × actor.pipeline_parallel_size=%d does not "
                            "divide the %d trainer rank%s (each stage holds whole TP groups: %d ranks per stage)",
                            tp, pp, T, moerl_plural(T), T % pp ? 0 : T / pp);
    return MOERL_OK;
}

void par_def_keys(cfg *c) {
    cfg_def_int(c, "actor.fsdp_config.fsdp_size", 1,
                "FSDP (ZeRO-3) shard group size within a pipeline stage: 1 = off, -1 = all ranks of the stage");
    cfg_def_bool(c, "actor.fsdp_config.reshard_after_forward", true,
                 "FSDP: true = free each layer's gathered parameters after use and reduce-scatter gradients after "
                 "every backward pass (least memory); false = keep every gathered layer and the full gradients for "
                 "the whole mini-batch, one all-gather and one reduce-scatter per update (fewer collectives, the "
                 "whole model and gradient resident)");
    cfg_def_int(c, "actor.expert_parallel_size", 1, "experts of each MoE layer split over this many trainer ranks");
    cfg_def_int(c, "actor.ulysses_sequence_parallel_size", 1,
                "Ulysses sequence parallelism: tokens split over this many ranks, attention head-sharded");
    cfg_def_int(c, "actor.pipeline_parallel_size", 1, "pipeline stages (1F1B schedule over micro-batches)");
    cfg_def_int(c, "actor.virtual_pipeline_parallel_size", 1,
                "model chunks per pipeline stage (interleaved 1F1B, Megatron's virtual stages): 1 = the plain 1F1B; "
                "> 1 needs actor.pipeline_parallel_size ≥ 2 and a micro-batch count that is a multiple of it");
    par_def_tp_keys(c);
    cfg_def_str(c, "actor.moe.dispatcher", "auto",
                "expert-parallel token exchange: alltoall (fixed capacity) | alltoallv (exact counts) | auto");
    cfg_def_int(c, "actor.moe.alltoall_max_ep", 16, "dispatcher=auto: all-to-all up to this EP size, all-to-all-v above");
    cfg_def_float(c, "actor.moe.capacity_factor", 1.25,
                  "all-to-all capacity per expert and source rank: ceil(factor · tokens · top_k / experts)");
}

const char *moe_dispatcher_name(moe_dispatcher d) {
    return d == MOE_DISPATCH_ALLTOALL ? "alltoall" : d == MOE_DISPATCH_ALLTOALLV ? "alltoallv" : "auto";
}

int par_read_keys(const cfg *c, par_config *pc) {
    memset(pc, 0, sizeof *pc);
    pc->fsdp_size = (int)cfg_int(c, "actor.fsdp_config.fsdp_size");
    pc->fsdp_keep_gathered = !cfg_bool(c, "actor.fsdp_config.reshard_after_forward");
    pc->expert_parallel_size = (int)cfg_int(c, "actor.expert_parallel_size");
    pc->ulysses_sequence_parallel_size = (int)cfg_int(c, "actor.ulysses_sequence_parallel_size");
    pc->pipeline_parallel_size = (int)cfg_int(c, "actor.pipeline_parallel_size");
    pc->virtual_pipeline_parallel_size = (int)cfg_int(c, "actor.virtual_pipeline_parallel_size");
    if (pc->fsdp_size == 0 || pc->fsdp_size < -1)
        return moerl_errorf("actor.fsdp_config.fsdp_size must be -1 (all ranks of a stage) or ≥ 1, got %d", pc->fsdp_size);
    if (pc->expert_parallel_size < 1)
        return moerl_errorf("actor.expert_parallel_size must be ≥ 1, got %d", pc->expert_parallel_size);
    if (pc->ulysses_sequence_parallel_size < 1)
        return moerl_errorf("actor.ulysses_sequence_parallel_size must be ≥ 1, got %d",
                            pc->ulysses_sequence_parallel_size);
    if (pc->pipeline_parallel_size < 1)
        return moerl_errorf("actor.pipeline_parallel_size must be ≥ 1, got %d", pc->pipeline_parallel_size);
    if (pc->virtual_pipeline_parallel_size < 1)
        return moerl_errorf("actor.virtual_pipeline_parallel_size must be ≥ 1, got %d",
                            pc->virtual_pipeline_parallel_size);
    if (pc->virtual_pipeline_parallel_size > 1 && pc->pipeline_parallel_size < 2)
        return moerl_errorf("actor.virtual_pipeline_parallel_size=%d interleaves the chunks of a pipeline: it needs "
                            "actor.pipeline_parallel_size ≥ 2 (it is %d)", pc->virtual_pipeline_parallel_size,
                            pc->pipeline_parallel_size);
    if (par_read_tp_keys(c, pc) != MOERL_OK) return MOERL_ERR;
    const char *d = cfg_str(c, "actor.moe.dispatcher");
    if (!strcmp(d, "auto")) pc->dispatcher = MOE_DISPATCH_AUTO;
    else if (!strcmp(d, "alltoall")) pc->dispatcher = MOE_DISPATCH_ALLTOALL;
    else if (!strcmp(d, "alltoallv")) pc->dispatcher = MOE_DISPATCH_ALLTOALLV;
    else return moerl_errorf("actor.moe.dispatcher: '%s' is not one of alltoall, alltoallv, auto", d);
    pc->alltoall_max_ep = (int)cfg_int(c, "actor.moe.alltoall_max_ep");
    if (pc->alltoall_max_ep < 1)
        return moerl_errorf("actor.moe.alltoall_max_ep must be ≥ 1, got %d", pc->alltoall_max_ep);
    pc->capacity_factor = cfg_float(c, "actor.moe.capacity_factor");
    if (!(pc->capacity_factor > 0) || !isfinite(pc->capacity_factor))
        return moerl_errorf("actor.moe.capacity_factor must be a finite number > 0, got %g", pc->capacity_factor);
    return MOERL_OK;
}

int par_check_pp_alone(const par_config *pc, int T) {
    (void)T; /* plan models every layout the pipeline runs with (pipeline × FSDP: plan_pp_fsdp.h) */
    return par_check_pp_compose(pc);
}

int par_check_pp_compose(const par_config *pc) {
    const int pp = pc->pipeline_parallel_size, ep = pc->expert_parallel_size;
    if (pp > 1 && pc->ulysses_sequence_parallel_size > 1)
        return moerl_errorf("actor.pipeline_parallel_size=%d combines with data parallelism, FSDP "
                            "(actor.fsdp_config.fsdp_size) and expert parallelism only: "
                            "actor.ulysses_sequence_parallel_size (%d) must be 1 with it",
                            pp, pc->ulysses_sequence_parallel_size);
    if (pp > 1 && ep > 1 && pc->fsdp_size != 1)
        return moerl_errorf("actor.pipeline_parallel_size=%d with actor.expert_parallel_size (%d): the pipeline "
                            "combines with FSDP or with EP, not both: actor.fsdp_config.fsdp_size (%d) must be 1 "
                            "with them", pp, ep, pc->fsdp_size);
    return MOERL_OK;
}

int par_check(const par_config *pc, int T, int E, int nh, int nkv, int L) {
    const int pp = pc->pipeline_parallel_size;
    if (T % pp)
        return moerl_errorf("actor.pipeline_parallel_size=%d does not divide the %d trainer rank%s", pp, T,
                            moerl_plural(T));
    if (pp > L)
        return moerl_errorf("actor.pipeline_parallel_size=%d exceeds the model's %d layer%s (a stage needs ≥ 1 layer)",
                            pp, L, moerl_plural(L));
    const int vpp = pc->virtual_pipeline_parallel_size > 0 ? pc->virtual_pipeline_parallel_size : 1;
    if (vpp > 1 && pp < 2)
        return moerl_errorf("actor.virtual_pipeline_parallel_size=%d needs actor.pipeline_parallel_size ≥ 2 (it is %d)",
                            vpp, pp);
    if ((long)pp * vpp > L)
        return moerl_errorf("actor.virtual_pipeline_parallel_size=%d × actor.pipeline_parallel_size=%d = %ld model chunks "
                            "exceed the model's %d layer%s (a chunk needs ≥ 1 layer): use at most %d chunk%s per stage",
                            vpp, pp, (long)pp * vpp, L, moerl_plural(L), L / pp, moerl_plural(L / pp));
    if (par_check_tp(pc, T) != MOERL_OK) return MOERL_ERR;
    const int D = T / pp, sp = pc->ulysses_sequence_parallel_size, ep = pc->expert_parallel_size;
    const int fsdp = pc->fsdp_size == -1 ? D : pc->fsdp_size;
    char ranks[160]; /* the ranks a size must divide: a stage's with a pipeline, else every trainer rank */
    if (pp > 1)
        snprintf(ranks, sizeof ranks, "the %d rank%s of a pipeline stage (%d trainer ranks / "
                 "actor.pipeline_parallel_size=%d)", D, moerl_plural(D), T, pp);
    else snprintf(ranks, sizeof ranks, "the %d trainer rank%s", D, moerl_plural(D));
    if (D % sp) return moerl_errorf("actor.ulysses_sequence_parallel_size=%d does not divide %s", sp, ranks);
    if (D % fsdp) return moerl_errorf("actor.fsdp_config.fsdp_size=%d does not divide %s", fsdp, ranks);
    if (D % ep) return moerl_errorf("actor.expert_parallel_size=%d does not divide %s", ep, ranks);
    if (ep > 1 && (E <= 0 || E % ep))
        return moerl_errorf("actor.expert_parallel_size=%d does not divide the model's %d experts", ep, E);
    if (sp > 1 && (nh % sp || (nkv % sp && sp % nkv)))
        return moerl_errorf("actor.ulysses_sequence_parallel_size=%d: Ulysses needs it to divide the %d attention heads "
                            "and to divide or be a multiple of the %d key/value heads", sp, nh, nkv);
    return MOERL_OK;
}

moe_dispatcher par_dispatcher(const par_grid *g) {
    if (g->cfg.dispatcher != MOE_DISPATCH_AUTO) return g->cfg.dispatcher;
    return g->ep <= g->cfg.alltoall_max_ep ? MOE_DISPATCH_ALLTOALL : MOE_DISPATCH_ALLTOALLV;
}

void par_grid_free(par_grid *g) {
    dist_comm **all[] = {&g->tp_comm, &g->ep_replica_comm, &g->ep_dp_comm, &g->ep_comm, &g->replica_comm, &g->fsdp_comm,
                         &g->sp_comm,         &g->dp_comm,    &g->pp_comm, &g->stage_comm};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        dist_comm_free(*all[i]);
        *all[i] = NULL;
    }
}

int par_grid_init(par_grid *g, dist_ctx *ctx, const par_config *pc, int E, int nh, int nkv, int L) {
    memset(g, 0, sizeof *g);
    g->cfg = *pc;
    const int T = ctx->trainer_size > 0 ? ctx->trainer_size : 1, t = ctx->trainer_rank > 0 ? ctx->trainer_rank : 0;
    if (par_check(pc, T, E, nh, nkv, L) != MOERL_OK) return MOERL_ERR;
    g->T = T;
    g->pp = pc->pipeline_parallel_size;
    g->D = T / g->pp;
    g->sp = pc->ulysses_sequence_parallel_size;
    g->dp = g->D / g->sp;
    g->fsdp = pc->fsdp_size == -1 ? g->D : pc->fsdp_size;
    g->replicas = g->D / g->fsdp;
    g->ep = pc->expert_parallel_size;
    g->stage = t / g->D;
    g->d = t % g->D;
    g->dp_rank = g->d / g->sp;
    g->sp_rank = g->d % g->sp;
    g->fsdp_rank = g->d % g->fsdp;
    g->replica_rank = g->d / g->fsdp;
    g->ep_rank = g->d % g->ep;
    g->tp = pc->tensor_model_parallel_size > 1 ? pc->tensor_model_parallel_size : 1;
    g->tp_rank = g->d % g->tp;
    if (g->tp > 1) { /* TP × DP (par_check_tp): consecutive TP groups, the batch sharded over dp = D / tp */
        g->dp = g->D / g->tp;
        g->dp_rank = g->d / g->tp;
    }
    /* EP × FSDP (both > 1, ep·fsdp | D): blocks of ep·fsdp consecutive ranks; inside a block the EP
     * groups stay consecutive and each FSDP group joins the fsdp ranks holding the same experts
     * (stride ep), so FSDP shards identical expert slices (see grid.h) */
    int ep_color = g->stage * (g->D / g->ep) + g->d / g->ep;
    if (g->tp > 1 && g->ep > 1) par_grid_tp_ep(g, &ep_color);
    const int ep_fsdp = g->ep > 1 && g->fsdp > 1 && g->D % (g->ep * g->fsdp) == 0;
    int fsdp_color = g->stage * g->replicas + g->replica_rank;
    if (ep_fsdp) {
        const int blk = g->d / (g->ep * g->fsdp), j = g->d % (g->ep * g->fsdp);
        g->fsdp_rank = j / g->ep;
        g->replica_rank = blk * g->ep + g->ep_rank;
        fsdp_color = g->stage * g->replicas + g->replica_rank;
    }
    /* Colors are offset per group kind so that they never collide inside one split. */
    struct {
        dist_comm **out;
        int color, key;
    } splits[] = {
        {&g->stage_comm, g->stage, g->d},
        {&g->pp_comm, g->d, g->stage},
        {&g->dp_comm, (g->stage * g->sp + g->sp_rank) * g->tp + g->tp_rank, g->dp_rank},
        {&g->sp_comm, g->stage * g->dp + g->dp_rank, g->sp_rank},
        {&g->fsdp_comm, fsdp_color, g->fsdp_rank},
        {&g->replica_comm, g->stage * g->fsdp + g->fsdp_rank, g->replica_rank},
        {&g->ep_comm, ep_color, g->ep_rank},
        {&g->ep_dp_comm, g->stage * g->ep + g->ep_rank, g->d / g->ep},
        {&g->ep_replica_comm, (g->stage * g->fsdp + g->fsdp_rank) * g->ep + g->ep_rank, g->d},
        {&g->tp_comm, g->stage * (g->D / g->tp) + g->d / g->tp, g->tp_rank},
    };
    for (size_t i = 0; i < sizeof splits / sizeof *splits; i++) {
        *splits[i].out = dist_comm_split(ctx, splits[i].color, splits[i].key);
        if (!*splits[i].out) {
            par_grid_free(g);
            return MOERL_ERR;
        }
    }
    return MOERL_OK;
}
