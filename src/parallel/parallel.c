/* The model-parallel runtime of a trainer rank: one entry point that reads the keys, builds the
 * grid and each strategy's state (see parallel.h). */
#include "parallel/parallel.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "base/common.h"
#include "base/log.h"
#include "parallel/ep.h"
#include "parallel/fsdp.h"
#include "parallel/ulysses.h"
#include "parallel/pipeline.h"
#include "parallel/tp.h"
#include "parallel/tp_ep.h"
#include "parallel/tp_sp.h"

int par_active(const par_state *ps) { return ps && (ps->fsdp || ps->ep || ps->sp || ps->pp || ps->tp); }

static int par_strategies_init(par_state *ps, moe_model *m);

int par_state_init(par_state *ps, dist_ctx *ctx, const cfg *c, moe_model *m) {
    par_config pc;
    memset(ps, 0, sizeof *ps);
    if (par_read_keys(c, &pc) != MOERL_OK) return MOERL_ERR;
    /* EP and Ulysses size their buffers (and the all-to-all capacity) by the command's micro-batch limit */
    pc.max_tokens = cfg_has(c, "data.max_token_len_per_micro_batch")
                        ? (int)cfg_int(c, "data.max_token_len_per_micro_batch")
                    : cfg_has(c, "actor.ppo_max_token_len_per_gpu") ? (int)cfg_int(c, "actor.ppo_max_token_len_per_gpu")
                                                                   : 0;
    return par_state_init_cfg(ps, ctx, &pc, m);
}

int par_state_init_cfg(par_state *ps, dist_ctx *ctx, const par_config *pcfg, moe_model *m) {
    memset(ps, 0, sizeof *ps);
    ps->ctx = ctx;
    ps->cfg = *pcfg;
    const par_config *pc = &ps->cfg;
    const int T = ctx && ctx->trainer_size > 0 ? ctx->trainer_size : 1;
    const int fsdp = pc->fsdp_size == -1 ? T / pc->pipeline_parallel_size : pc->fsdp_size;
    const int any = fsdp > 1 || pc->expert_parallel_size > 1 || pc->ulysses_sequence_parallel_size > 1 ||
                    pc->pipeline_parallel_size > 1 || pc->tensor_model_parallel_size > 1;
    if (pc->fsdp_keep_gathered && fsdp <= 1)
        return moerl_errorf("actor.fsdp_config.reshard_after_forward=false keeps FSDP's gathered units: it needs FSDP "
                            "on (actor.fsdp_config.fsdp_size > 1), got fsdp_size=%d over %d trainer rank%s",
                            pc->fsdp_size, T, moerl_plural(T));
    if (!any) { /* replicated model: plain data parallel (or one rank) */
        par_bind_hooks(ps);
        return MOERL_OK;
    }
    if (!ctx || ctx->trainer_rank < 0)
        return moerl_errorf("model parallelism (actor.fsdp_config.fsdp_size, actor.expert_parallel_size, "
                            "actor.ulysses_sequence_parallel_size, actor.pipeline_parallel_size) needs trainer ranks");
    const moe_config *mc = &m->cfg;
    ps->grid = xcalloc(1, sizeof *ps->grid);
    if (par_grid_init(ps->grid, ctx, pc, mc->num_experts, mc->num_attention_heads, mc->num_key_value_heads,
                      mc->num_hidden_layers) != MOERL_OK) {
        free(ps->grid);
        memset(ps, 0, sizeof *ps);
        return MOERL_ERR;
    }
    if (par_strategies_init(ps, m) != MOERL_OK) goto fail;
    return MOERL_OK;
fail:
    par_state_free(ps);
    return MOERL_ERR;
}

int par_state_init_like(par_state *ps, const par_state *like, moe_model *m) {
    memset(ps, 0, sizeof *ps);
    if (!par_active(like)) return MOERL_OK; /* replicated: m stays whole */
    ps->ctx = like->ctx;
    ps->cfg = like->cfg;
    ps->grid = like->grid;
    ps->grid_borrowed = 1;
    if (par_strategies_init(ps, m) != MOERL_OK) {
        par_state_free(ps);
        return MOERL_ERR;
    }
    return MOERL_OK;
}

/* Pipeline × FSDP: the pipeline's state first (its cut names the stage's units), then FSDP over those
 * units only, on the stage's FSDP group (and HSDP replicas inside the stage); the gradient norm also
 * sums over pp_comm (the other stages' units). The forward-only passes run FSDP's gathers through
 * ps's hooks. Tied embeddings are refused: the last stage's copy of the embedding would need its shard
 * summed into stage 0's and sent back (the stage-owned pipeline does that unsharded). */
static int pp_fsdp_init(par_state *ps, moe_model *m) {
    const par_grid *g = ps->grid;
    if (m->cfg.tie_word_embeddings)
        return moerl_errorf("actor.pipeline_parallel_size=%d with actor.fsdp_config.fsdp_size=%d: a model with tied "
                            "embeddings (config.json tie_word_embeddings=true) is not supported with this layout: use "
                            "actor.fsdp_config.fsdp_size=1 (the pipeline alone holds the embedding's copy)",
                            g->pp, g->fsdp);
    pp_options po = pp_options_default();
    po.quiet = ps->grid_borrowed;
    if (!(ps->pp = pp_state_new(g, m, &po))) return MOERL_ERR;
    unsigned char *on = xmalloc((size_t)m->cfg.num_hidden_layers + 2);
    pp_stage_units(ps->pp, on);
    ps->fsdp = fsdp_state_new_units(m, g->fsdp_comm, g->replicas > 1 ? g->replica_comm : NULL, on);
    free(on);
    if (!ps->fsdp) return MOERL_ERR;
    fsdp_set_reshard_after_forward(ps->fsdp, !ps->cfg.fsdp_keep_gathered);
    fsdp_set_norm_group(ps->fsdp, g->pp_comm);
    pp_set_sharded(ps->pp, m, &ps->head);
    return MOERL_OK;
}

/* TP × pipeline: this stage's share of the squared gradient norm (pp_set_norm_squares): tp_norm_squares over
 * the stage's chunks' ranges of the slice's layout. */
static double tp_pp_norm_squares(void *ctx) {
    par_state *ps = ctx;
    size_t lo[PP_MAX_CHUNKS], hi[PP_MAX_CHUNKS];
    const int v = pp_chunks(ps->pp);
    for (int c = 0; c < v; c++) pp_own_chunk_range(ps->pp, c, &lo[c], &hi[c]);
    return tp_norm_squares(ps->tp, lo, hi, v);
}

/* TP × pipeline (Megatron's layout: TP innermost, then DP, then the stages; grid.h): the model is sliced first
 * (tp_state_attach: this rank's TP slice, the local config), then the pipeline cuts the slice and keeps this
 * stage's range of it (pp_own_stage). Every member of a stage's TP group cuts the same local config alike, and
 * its pipeline (pp_comm) joins its counterparts with the same tp_rank, so each sends and receives the whole
 * hidden [N,H] its group computes. The TP collectives run inside the stage (the model hooks), the gradient sums
 * over grid.dp_comm (the pipeline's) and the TP group (tp_pp_finish_grads), the norm through
 * tp_pp_norm_squares. */
static int tp_pp_init(par_state *ps, moe_model *m) {
    const par_grid *g = ps->grid;
    if (par_check_tp_pp(&ps->cfg, g->T) != MOERL_OK) return MOERL_ERR;
    if (!(ps->tp = tp_state_attach(g, m))) return MOERL_ERR;
    pp_options po = pp_options_default();
    po.quiet = ps->grid_borrowed;
    if (!(ps->pp = pp_state_new(g, m, &po))) return MOERL_ERR;
    if (pp_own_stage(ps->pp, m) != MOERL_OK) return MOERL_ERR;
    pp_set_norm_squares(ps->pp, tp_pp_norm_squares, ps);
    pp_set_forward_par(ps->pp, &ps->head); /* the forward-only passes' TP all-reduces */
    return MOERL_OK;
}

/* Pipeline × EP: the expert side keeps a saved state per activation slot of the pipeline, and an empty
 * micro-batch's layers run the idle exchanges (under recompute each backward layer first repeats its
 * forward's, as model_backward does). */
static void pp_ep_slot(void *ctx, int slot, int n) { ep_use_bank(((par_state *)ctx)->ep, slot, n); }
static void pp_ep_idle(void *ctx, int l, int backward) {
    par_state *ps = ctx;
    if (backward && ep_recomputes(ps->ep)) ep_idle_layer(ps->ep, NULL, l, 0);
    ep_idle_layer(ps->ep, NULL, l, backward);
}

/* Pipeline × EP (par_check_pp_compose refused FSDP and SP with it): EP slices the
 * experts first (ep_state_attach), then the pipeline owns its stage of the sliced layout (pp_own_stage) and
 * sums / norms the expert tensors over the expert groups (pp_set_experts). */
static int pp_ep_init(par_state *ps, moe_model *m) {
    const par_grid *g = ps->grid;
    if (!(ps->ep = ep_state_attach(g, m, ps->cfg.max_tokens))) return MOERL_ERR;
    pp_options po = pp_options_default();
    po.quiet = ps->grid_borrowed;
    if (!(ps->pp = pp_state_new(g, m, &po)) || pp_own_stage(ps->pp, m) != MOERL_OK) return MOERL_ERR;
    const pp_expert_hooks h = {.ctx = ps, .use_slot = pp_ep_slot, .idle_layer = pp_ep_idle};
    return pp_set_experts(ps->pp, g->ep_dp_comm, g->ep_comm, &ps->head, &h);
}

/* TP × EP: the model is the TP slice of this rank's EP slice; the experts' gradients and norm go over the
 * ranks holding them (tp_set_expert_groups), the MoE layers through tp_ep.h's token split. */
static int tp_ep_attach(par_state *ps, const moe_model *m) {
    const par_grid *g = ps->grid;
    tp_set_expert_groups(ps->tp, g->ep_dp_comm, g->ep_comm);
    if (g->cfg.sequence_parallel) return MOERL_OK; /* SP × EP: SP's rows dispatched as they are (tp_sp.h) */
    return (ps->tpep = tp_ep_new(g, ps->ep, &m->cfg)) ? MOERL_OK : MOERL_ERR;
}

/* Each strategy's state over ps->grid for model m (a trainable model or an inference one): the body
 * shared by par_state_init_cfg and par_state_init_like. On error the states built so far stay in ps
 * for the caller's par_state_free. */
static int par_strategies_init(par_state *ps, moe_model *m) {
    const par_grid *g = ps->grid;
    /* expert parallel (src/parallel/ep.c) and Ulysses (src/parallel/ulysses.c) size their buffers (and
     * the all-to-all capacity) by the micro-batch token limit of the command */
    const int max_tokens = ps->cfg.max_tokens;
    /* what the pipeline does not compose with (SP; EP with FSDP) is refused before anything is built */
    if (g->pp > 1 && par_check_pp_compose(&ps->cfg) != MOERL_OK) goto fail;
    /* ---- EP × FSDP: the experts are sliced first, then FSDP shards the slice over the ranks holding
     * the same experts (grid.h); the replicated tensors' shards are summed over every replica ---- */
    if (g->ep > 1 && g->fsdp > 1) {
        if (g->D % (g->ep * g->fsdp)) {
            moerl_errorf("actor.expert_parallel_size=%d with actor.fsdp_config.fsdp_size=%d: their product must "
                         "divide the %d ranks of a pipeline stage (FSDP shards each expert slice over ranks that "
                         "hold the same experts): at most %d with these ranks, or run a multiple of %d ranks per stage",
                         g->ep, g->fsdp, g->D, g->D / g->ep, g->ep * g->fsdp);
            goto fail;
        }
        if (!(ps->ep = ep_state_attach(g, m, max_tokens))) goto fail;
    }
    /* ---- pipeline × FSDP: the stage's units sharded over its FSDP group (pp_fsdp_init) ---- */
    if (g->pp > 1 && g->fsdp > 1 && g->ep == 1 && g->sp == 1 && pp_fsdp_init(ps, m) != MOERL_OK) goto fail;
    /* ---- pipeline × EP: each stage's experts split over its expert groups (pp_ep_init) ---- */
    if (g->pp > 1 && g->ep > 1 && pp_ep_init(ps, m) != MOERL_OK) goto fail;
    /* ---- FSDP (src/parallel/fsdp.c) ---- */
    if (g->fsdp > 1 && !ps->fsdp) {
        ps->fsdp = fsdp_state_new(m, g->fsdp_comm, g->replicas > 1 ? g->replica_comm : NULL);
        if (!ps->fsdp) goto fail;
        fsdp_set_reshard_after_forward(ps->fsdp, !ps->cfg.fsdp_keep_gathered); /* a reference (no grads) reshards */
        if (ps->ep) fsdp_set_expert_groups(ps->fsdp, g->ep_replica_comm, g->ep_comm);
    }
    /* ---- expert parallel alone ---- */
    /* (TP × EP: each rank dispatches its 1/tp of a micro-batch's tokens, so the all-to-all's capacity is sized
     * by that share; tp_ep.h) */
    const int ep_tokens = g->tp > 1 ? (max_tokens + g->tp - 1) / g->tp : max_tokens;
    if (g->ep > 1 && !ps->ep && !(ps->ep = ep_state_attach(g, m, ep_tokens))) goto fail;
    if (g->sp > 1 && !(ps->sp = sp_state_new(g, &m->cfg, max_tokens))) goto fail;
    /* ---- TP × pipeline: the slice cut into stages (tp_pp_init) ---- */
    if (g->pp > 1 && g->tp > 1 && !ps->pp && tp_pp_init(ps, m) != MOERL_OK) goto fail;
    /* ---- pipeline parallel (src/parallel/pipeline.c) ---- */
    if (g->pp > 1 && !ps->pp) {
        pp_options po = pp_options_default();
        po.quiet = ps->grid_borrowed; /* a second state on the grid (a reference): the partition is logged once */
        ps->pp = pp_state_new(g, m, &po);
        if (!ps->pp) goto fail;
        /* Megatron's layout: a stage holds only its layers' parameters, gradients and moments */
        if (pp_own_stage(ps->pp, m) != MOERL_OK) goto fail;
    }
    /* ---- tensor parallel (src/parallel/tp.c; TP × DP, TP × EP with experts whole; TP × pipeline above) ---- */
    if (g->tp > 1 && !ps->tp && !(ps->tp = tp_state_attach(g, m))) goto fail;
    if (ps->tp && ps->ep && tp_ep_attach(ps, m) != MOERL_OK) goto fail; /* TP × EP (tp_ep.h) */
    if (ps->tp && !ps->grid_borrowed && g->stage == 0 && g->d == 0) { /* the layout, once (the pipeline logs its cut) */
        char ep[32] = "";
        if (g->ep > 1) snprintf(ep, sizeof ep, " (ep %d)", g->ep);
        log_info("tensor parallel: tp %d × dp %d%s%s, experts %s%s", g->tp, g->dp, ep, g->pp > 1 ? " per stage" : "",
                 g->cfg.expert_tensor_parallel_size == 1 ? "whole" : "split over TP",
                 g->cfg.sequence_parallel ? ", Megatron sequence parallel" : "");
    }
    if (g->ep > 1 && !ps->ep) {
        moerl_errorf("actor.expert_parallel_size=%d: expert parallelism is not part of this build", g->ep);
        goto fail;
    }
    if (g->sp > 1 && !ps->sp) {
        moerl_errorf("actor.ulysses_sequence_parallel_size=%d: Ulysses sequence parallelism is not part of this build",
                     g->sp);
        goto fail;
    }
    if (g->pp > 1 && !ps->pp) {
        moerl_errorf("actor.pipeline_parallel_size=%d: pipeline parallelism is not part of this build", g->pp);
        goto fail;
    }
    par_bind_hooks(ps);
    return MOERL_OK;
fail:
    return MOERL_ERR;
}

/* ------------------------------------------------------------------ the hook tables (forward.h, train.h) */

static void hook_layer_event(void *par, model_layer_phase phase, int l) { par_layer_hook(par, phase, l); }
static void hook_moe_forward(void *par, const moe_model *m, int l, const float *x, mlp_acts *s, int N) {
    if (((par_state *)par)->tpep) tp_ep_moe_forward_team(((par_state *)par)->tpep, m, l, x, s, N);
    else ep_model_hooks.moe_forward(((par_state *)par)->ep, m, l, x, s, N);
}
static void hook_moe_backward(void *par, const moe_model *m, int l, const mlp_acts *s, const float *d_y,
                              float *d_permuted, float *dWgu, float *dWd) {
    if (((par_state *)par)->tpep) tp_ep_moe_backward_team(((par_state *)par)->tpep, m, l, s, d_y, d_permuted, dWgu, dWd);
    else ep_model_hooks.moe_backward(((par_state *)par)->ep, m, l, s, d_y, d_permuted, dWgu, dWd);
}
static void hook_moe_idle(void *par, moe_model *m, int backward) { ep_idle_pass(((par_state *)par)->ep, m, backward); }
static void hook_attn_tokens(void *par, int N, int *t0, int *n) { sp_token_range(((par_state *)par)->sp, N, t0, n); }
static int hook_attn_begin(void *par, const int *cu_seqlens, int B, int N) {
    return sp_begin(((par_state *)par)->sp, cu_seqlens, B, N);
}
static void hook_attn_forward(void *par, int l, float *out, const float *q, const float *k, const float *v,
                              float scale) {
    sp_attention_forward(((par_state *)par)->sp, l, out, q, k, v, scale);
}
static void hook_attn_backward(void *par, int l, float *dq, float *dk, float *dv, const float *dout, float scale) {
    sp_attention_backward(((par_state *)par)->sp, l, dq, dk, dv, dout, scale);
}
static int hook_accumulate(void *par, moe_model *m, const train_seq *seqs, int n, const train_step_opts *o,
                           token_grad_fn fn, void *ctx, train_step_out *out) {
    par_state *ps = par;
    if (ps->fsdp) fsdp_zero_grad(ps->fsdp); /* pipeline × FSDP: the shard (pp_zero_grad leaves it) */
    return pp_train_accumulate(ps->pp, m, seqs, n, o, fn, ctx, out);
}
static int hook_logprobs(void *par, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                         float temperature, float **out_logp, const train_route_opts *ro) {
    return pp_compute_logprobs(((par_state *)par)->pp, m, seqs, n, max_tokens, temperature, out_logp, ro);
}
static int hook_router_counts(void *par, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                              double *counts) {
    return pp_compute_router_counts(((par_state *)par)->pp, m, seqs, n, max_tokens, counts);
}
static void hook_zero_grad(void *par, moe_model *m) { par_zero_grad(par, m); }
static int hook_max_passes(void *par, int passes) { return par_max_passes(par, passes); }
static int hook_pad_passes(void *par, int passes, int max, int backward) {
    return par_pad_passes(par, passes, max, backward);
}
static void hook_tp_allreduce(void *par, double *x, size_t n, int max) { tp_allreduce(((par_state *)par)->tp, x, n, max); }
static void hook_tp_allreduce_f32(void *par, float *x, size_t n) { tp_allreduce_f32(((par_state *)par)->tp, x, n); }
/* Megatron sequence parallelism's collectives over the TP group (tp_sp.h); an MPI failure aborts, as tp_allreduce. */
static void hook_tp_reduce_scatter(void *par, float *x, int N, int H) {
    if (tp_sp_reduce_scatter(((par_state *)par)->grid->tp_comm, x, N, H) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
}
static void hook_tp_all_gather(void *par, float *x, int N, int H) {
    if (tp_sp_all_gather(((par_state *)par)->grid->tp_comm, x, N, H) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
}
static int hook_seq_allreduce(void *par, float *x, size_t n) {
    return dist_comm_allreduce_f32(((par_state *)par)->grid->sp_comm, x, n);
}

/* The tables hold, for the strategies that are on: the layer events and the training loop's zero /
 * pass-count hooks always; the MoE dispatch with EP, the attention shard and the logprob sum with
 * Ulysses SP, the whole loop with the pipeline. */
void par_bind_hooks(par_state *ps) {
    model_hooks *mh = &ps->model_tab;
    train_par_hooks *th = &ps->train_tab;
    memset(mh, 0, sizeof *mh);
    memset(th, 0, sizeof *th);
    mh->layer_event = hook_layer_event;
    if (ps->ep) {
        mh->moe_forward = hook_moe_forward;
        mh->moe_backward = hook_moe_backward;
        mh->moe_idle = hook_moe_idle;
    }
    if (ps->sp) {
        mh->attn_tokens = hook_attn_tokens;
        mh->attn_begin = hook_attn_begin;
        mh->attn_forward = hook_attn_forward;
        mh->attn_backward = hook_attn_backward;
        if (ps->grid) th->seq_allreduce = hook_seq_allreduce;
    }
    if (ps->tp) {
        mh->tp_allreduce = hook_tp_allreduce;
        mh->tp_allreduce_f32 = hook_tp_allreduce_f32;
        if (ps->grid->cfg.sequence_parallel) mh->tp_reduce_scatter = hook_tp_reduce_scatter, mh->tp_all_gather = hook_tp_all_gather;
    }
    th->zero_grad = hook_zero_grad;
    th->max_passes = hook_max_passes;
    th->pad_passes = hook_pad_passes;
    if (ps->pp) {
        th->accumulate = hook_accumulate;
        th->logprobs = hook_logprobs;
        th->router_counts = hook_router_counts;
    }
    ps->head.model.hooks = mh;
    ps->head.train = th;
}

void par_state_free(par_state *ps) {
    if (!ps) return;
    if (ps->pp && ps->fsdp) { /* pipeline × FSDP: each stage's units back, then the stages to every rank */
        moe_model *m = pp_sharded_model(ps->pp);
        fsdp_state_free(ps->fsdp);
        ps->fsdp = NULL;
        if (m && pp_exchange_layout(ps->pp, m->params, -1) != MOERL_OK)
            moerl_fatal("par_state_free: assembling the pipeline's stages: %s", moerl_last_error());
    }
    /* the other strategies' destructors go here, in reverse order of construction */
    if (ps->tp && ps->pp) { /* TP × pipeline: the stages' ranges of the slice back first, then the slices */
        pp_state_free(ps->pp);
        ps->pp = NULL;
    }
    tp_ep_free(ps->tpep);
    ps->tpep = NULL;
    if (ps->tp && tp_state_detach(ps->tp) != MOERL_OK) /* the whole model back in m */
        moerl_fatal("par_state_free: assembling the tensor-parallel model: %s", moerl_last_error());
    ps->tp = NULL;
    sp_state_free(ps->sp);
    ps->sp = NULL;
    if (ps->pp && ps->ep && pp_release_stage(ps->pp) != MOERL_OK) /* pipeline × EP: the stages, then the experts */
        moerl_fatal("par_state_free: assembling the pipeline's stages: %s", moerl_last_error());
    if (ps->ep && ps->fsdp) { /* EP × FSDP: the slice back in plain buffers first, then the whole model */
        fsdp_state_free(ps->fsdp);
        ps->fsdp = NULL;
    }
    if (ps->ep && ep_state_detach(ps->ep) != MOERL_OK) /* the whole model back in m */
        moerl_fatal("par_state_free: assembling the expert-parallel model: %s", moerl_last_error());
    ps->ep = NULL;
    pp_state_free(ps->pp);
    ps->pp = NULL;
    fsdp_state_free(ps->fsdp);
    ps->fsdp = NULL;
    if (ps->grid && !ps->grid_borrowed) {
        par_grid_free(ps->grid);
        free(ps->grid);
    }
    memset(ps, 0, sizeof *ps);
}

size_t par_held_floats(const par_state *ps, const moe_model *m) {
    if (ps && ps->fsdp) {
        fsdp_stats st;
        fsdp_get_stats(ps->fsdp, &st);
        return st.shard_floats;
    }
    if (ps && ps->pp && pp_is_owned(ps->pp)) return pp_held_floats(ps->pp);
    return m->n_params;
}

void par_release_gathered(par_state *ps) {
    if (ps && ps->fsdp) fsdp_release_all(ps->fsdp);
}

float *par_param_store(par_state *ps, moe_model *m, size_t *n) {
    if (ps && ps->fsdp) return fsdp_param_shard(ps->fsdp, n);
    *n = m->n_params;
    return m->params;
}

int par_acts_rows(const par_state *ps, int max_tokens) {
    if (!ps) return max_tokens;
    if (ps->pp) return 1;
    if (ps->sp && ps->grid && ps->grid->sp > 1) return (max_tokens + ps->grid->sp - 1) / ps->grid->sp;
    return max_tokens;
}

void par_data_shard(const par_state *ps, int *index, int *count) {
    *index = 0;
    *count = 1;
    if (!ps) return;
    if (ps->grid) {
        *index = ps->grid->dp_rank;
        *count = ps->grid->dp;
    } else if (ps->ctx && ps->ctx->trainer_rank >= 0) {
        *index = ps->ctx->trainer_rank;
        *count = ps->ctx->trainer_size;
    }
}

void par_layer_hook(par_state *ps, model_layer_phase phase, int l) {
    if (ps->fsdp) fsdp_layer_event(ps->fsdp, phase, l);
}

void par_zero_grad(par_state *ps, moe_model *m) {
    if (ps && ps->fsdp) fsdp_zero_grad(ps->fsdp);
    else if (ps && ps->pp) pp_zero_grad(ps->pp, m);
    else model_zero_grad(m);
}

/* EP × FSDP idle pass: the FSDP layer events and the MoE layers' exchanges in the order of
 * model_forward / model_backward (forward.c): forward layer l's MoE runs after MODEL_FWD_LAYER l,
 * backward layer l−1's MoE between MODEL_BWD_LAYER l and MODEL_GRAD_READY l (l = L: the head's region).
 * Running all of one strategy's collectives before the other's could deadlock: an FSDP group and an
 * EP group of different ranks wait on each other. */
static void ep_fsdp_idle_pass(par_state *ps, int backward) {
    fsdp_stats st;
    fsdp_get_stats(ps->fsdp, &st);
    const int L = st.n_units - 2;
    ep_count_idle_pass(ps->ep);
    fsdp_layer_event(ps->fsdp, MODEL_FWD_LAYER, -1);
    for (int l = 0; l < L; l++) {
        fsdp_layer_event(ps->fsdp, MODEL_FWD_LAYER, l);
        ep_idle_layer(ps->ep, NULL, l, 0);
    }
    if (!backward) return;
    for (int l = L; l >= 0; l--) {
        fsdp_layer_event(ps->fsdp, MODEL_BWD_LAYER, l);
        if (l >= 1 && ep_recomputes(ps->ep)) ep_idle_layer(ps->ep, NULL, l - 1, 0); /* the recomputed forward */
        if (l >= 1) ep_idle_layer(ps->ep, NULL, l - 1, 1);
        fsdp_layer_event(ps->fsdp, MODEL_GRAD_READY, l);
    }
    fsdp_layer_event(ps->fsdp, MODEL_GRAD_READY, -1);
}

int par_max_passes(par_state *ps, int passes) {
    if (ps && ps->pp) return passes; /* the pipeline agrees on its own counts (pp_train_accumulate) */
    if (ps && ps->ep && !ps->fsdp) return ep_max_passes(ps->ep, passes);
    if (!ps || !ps->fsdp) return passes;
    /* EP × FSDP: the EP groups and the (strided) FSDP groups chain every rank of a block: the stage */
    dist_comm *c = ps->ep ? ps->grid->stage_comm : ps->grid->fsdp_comm;
    const int P = dist_comm_size(c);
    float mine = (float)passes, *all = xmalloc((size_t)P * sizeof(float));
    int rc = dist_comm_allgather_f32(c, &mine, 1, all), mx = passes;
    for (int i = 0; rc == MOERL_OK && i < P; i++) mx = MOERL_MAX(mx, (int)all[i]);
    free(all);
    return rc == MOERL_OK ? mx : -1;
}

int par_pad_passes(par_state *ps, int passes, int max, int backward) {
    if (!ps || ps->pp || (!ps->fsdp && !ps->ep)) return MOERL_OK;
    if (max < passes) return moerl_errorf("par_pad_passes: %d passes, more than the group's most %d", passes, max);
    if (ps->ep && ps->fsdp) {
        for (int i = passes; i < max; i++) ep_fsdp_idle_pass(ps, backward);
        return MOERL_OK;
    }
    if (ps->ep) {
        for (int i = passes; i < max; i++) ep_idle_pass(ps->ep, NULL, backward);
        return MOERL_OK;
    }
    for (int i = passes; i < max; i++) fsdp_idle_pass(ps->fsdp, backward);
    return MOERL_OK;
}

/* ------------------------------------------------------------------ optimizer and whole model */

void par_adamw_init(par_state *ps, const moe_model *m, adamw_state *os, adamw_config cfg) {
    if (ps && ps->fsdp) fsdp_adamw_init(ps->fsdp, os, cfg);
    else if (ps && ps->pp && pp_is_owned(ps->pp)) pp_adamw_init(ps->pp, os, cfg);
    else adamw_init(os, m, cfg);
}

size_t par_whole_params(const par_state *ps, const moe_model *m) {
    if (ps && ps->ep) return ep_whole_params(ps->ep); /* m holds this rank's experts only */
    if (ps && ps->tp) return tp_whole_params(ps->tp); /* m holds this rank's slice */
    return m->n_params;                               /* FSDP keeps the whole layout in m */
}

void par_slice_vec(par_state *ps, const moe_model *m, const float *whole, float *local) {
    if (ps && ps->pp && ps->ep) { /* pipeline × EP: the expert slice, then the stage's range of it */
        float *slice = xalloc_aligned((m->n_params + 1) * sizeof(float));
        ep_slice_vec(ps->ep, m, whole, slice);
        pp_slice_vec(ps->pp, slice, local);
        free(slice);
    } else if (ps && ps->ep && ps->fsdp) { /* EP × FSDP: the expert slice, then its FSDP shard */
        float *slice = xalloc_aligned((m->n_params + 1) * sizeof(float));
        ep_slice_vec(ps->ep, m, whole, slice);
        fsdp_slice_vec(ps->fsdp, slice, local);
        free(slice);
    } else if (ps && ps->tp && ps->pp && pp_is_owned(ps->pp)) { /* TP × pipeline: the TP slice, then the stage's */
        float *slice = xalloc_aligned((m->n_params + 1) * sizeof(float));
        tp_slice_vec(ps->tp, whole, slice);
        pp_slice_vec(ps->pp, slice, local);
        free(slice);
    } else if (ps && ps->ep && ps->tp) { /* TP × EP: the expert slice, then its TP slice */
        const moe_model *lay = tp_whole_layout(ps->tp);
        float *slice = xalloc_aligned((lay->n_params + 1) * sizeof(float));
        ep_slice_vec(ps->ep, lay, whole, slice);
        tp_slice_vec(ps->tp, slice, local);
        free(slice);
    } else if (ps && ps->fsdp) fsdp_slice_vec(ps->fsdp, whole, local);
    else if (ps && ps->ep) ep_slice_vec(ps->ep, m, whole, local);
    else if (ps && ps->tp) tp_slice_vec(ps->tp, whole, local);
    else if (ps && ps->pp && pp_is_owned(ps->pp)) pp_slice_vec(ps->pp, whole, local);
    else memcpy(local, whole, m->n_params * sizeof(float));
}

int par_grads_self_reduced(const par_state *ps) {
    return ps && (ps->fsdp || ps->ep || ps->tp || (ps->pp && pp_is_owned(ps->pp)));
}

void par_adamw_shard(par_state *ps, const moe_model *m, adamw_state *os) {
    if (ps && ps->pp && pp_is_owned(ps->pp) && !ps->ep && !ps->tp) { /* the stage's range (pipeline × EP, TP ×
                                                                      * pipeline: below) */
        MOERL_ASSERT(os->n == m->n_params);
        adamw_state sh;
        pp_adamw_init(ps->pp, &sh, os->cfg);
        sh.step = os->step;
        sh.skipped = os->skipped;
        pp_slice_vec(ps->pp, os->m, sh.m);
        pp_slice_vec(ps->pp, os->v, sh.v);
        adamw_free(os);
        *os = sh;
        return;
    }
    if (!ps || (!ps->fsdp && !ps->ep && !ps->tp)) return;
    MOERL_ASSERT(os->n == par_whole_params(ps, m));
    adamw_state sh;
    par_adamw_init(ps, m, &sh, os->cfg);
    sh.step = os->step;
    sh.skipped = os->skipped;
    par_slice_vec(ps, m, os->m, sh.m);
    par_slice_vec(ps, m, os->v, sh.v);
    adamw_free(os);
    *os = sh;
}

int par_adamw_step(par_state *ps, moe_model *m, adamw_state *os, float lr, float loss, double *grad_norm) {
    if (ps && ps->fsdp) return fsdp_adamw_step(ps->fsdp, os, lr, loss, grad_norm);
    if (ps && ps->pp && pp_is_owned(ps->pp)) return pp_adamw_step(ps->pp, os, lr, loss, grad_norm);
    if (ps && ps->tp) return tp_adamw_step(ps->tp, os, lr, loss, grad_norm); /* TP × EP too: tp_set_expert_groups */
    if (ps && ps->ep) return ep_adamw_step(ps->ep, os, m, lr, loss, grad_norm);
    return adamw_step(os, m, lr, loss, grad_norm);
}

static int tp_pp_finish_grads(par_state *ps);

int par_finish_grads(par_state *ps, int passes, int max_passes) {
    if (par_pad_passes(ps, passes, max_passes, 1) != MOERL_OK) return MOERL_ERR;
    if (ps && ps->fsdp) return fsdp_finish_grads(ps->fsdp);
    if (ps && ps->tp && ps->pp) return tp_pp_finish_grads(ps);
    if (ps && ps->pp && pp_is_owned(ps->pp)) return pp_finish_grads(ps->pp); /* sum over grid.stage_comm */
    if (ps && ps->tp) { /* TP × EP too (tp_set_expert_groups); with Megatron SP the norms' partial gradients
                         * (each rank's token rows) are summed over the TP group as well */
        if (tp_reduce_grads(ps->tp) != MOERL_OK) return MOERL_ERR;
        if (ps->grid->cfg.sequence_parallel && ps->ep && /* SP × EP: each rank's router saw its own rows */
            tp_sp_reduce_router_grads(ps->grid->tp_comm, tp_state_model(ps->tp)) != MOERL_OK)
            return MOERL_ERR;
        return ps->grid->cfg.sequence_parallel ? tp_sp_reduce_norm_grads(ps->grid->tp_comm, tp_state_model(ps->tp))
                                               : MOERL_OK;
    }
    if (ps && ps->ep) return ep_reduce_grads(ps->ep, NULL) /* the model of ep_state_attach */;
    return MOERL_OK;
}

/* TP × pipeline: the stage's range summed over its data-parallel ranks holding the same slice (the pipeline's
 * sum over grid.dp_comm, the tied embedding's parts), then the TP group's partial sums of the stage's layers. */
static int tp_pp_finish_grads(par_state *ps) {
    if (pp_finish_grads(ps->pp) != MOERL_OK) return MOERL_ERR;
    for (int c = 0; c < pp_chunks(ps->pp); c++) {
        int lo, hi;
        pp_chunk_layers(ps->pp, c, &lo, &hi);
        if (tp_reduce_layer_grads(ps->tp, lo, hi) != MOERL_OK) return MOERL_ERR;
    }
    return MOERL_OK;
}

/* The trainer rank that keeps the whole model, agreed over the trainers (one at most): 1 with *keeper set,
 * 0 when no rank keeps, MOERL_ERR on a failed exchange or more than one keeper. Zeroes *moments first. */
static int agree_keeper(par_state *ps, int keep, adamw_state *moments, int *keeper) {
    if (moments) memset(moments, 0, sizeof *moments);
    double v[2] = {keep ? 1 : 0, keep ? ps->ctx->trainer_rank : 0};
    if (dist_allreduce_sum(ps->ctx, DIST_TRAINERS, v, 2) != MOERL_OK) return MOERL_ERR;
    if (v[0] > 1)
        return moerl_errorf("par_gather_full: %d trainer ranks asked to keep the model, expected one", (int)v[0]);
    *keeper = (int)v[1];
    return v[0] > 0;
}

/* Pipeline: which trainer rank keeps (one at most, agreed over the trainers); then the keeper's
 * pipeline assembles the model on the keeper's stage. */
static const moe_model *pp_gather(par_state *ps, moe_model *m, int keep, const adamw_state *os,
                                  adamw_state *moments) {
    int keeper = 0;
    if (agree_keeper(ps, keep, moments, &keeper) != 1) return NULL;
    const par_grid *g = ps->grid;
    const int keep_d = keeper % g->D, keep_stage = keeper / g->D;
    if (g->d != keep_d) return NULL; /* another pipeline keeps it */
    if (pp_gather_full(ps->pp, keep_stage, os, moments) != MOERL_OK) return NULL;
    return keep ? m : NULL;
}

/* TP × pipeline: agree on the keeper; the pipelines of the keeper's TP group (d in its block of tp) assemble their
 * slices on the keeper's stage (pp_gather_full, with the moments in the slice's layout), whose TP group then
 * assembles the whole model and moments on the keeper (tp_gather_full: a new inference model, freed by
 * par_release_full); the stage pages are given back at once (pp_release_full). */
static const moe_model *tp_pp_gather(par_state *ps, moe_model *m, int keep, const adamw_state *os,
                                     adamw_state *moments) {
    (void)m;
    int keeper = 0;
    const int agreed = agree_keeper(ps, keep, moments, &keeper);
    const par_grid *g = ps->grid;
    const int keep_d = keeper % g->D, keep_stage = keeper / g->D;
    if (agreed != 1 || g->d / g->tp != keep_d / g->tp) return NULL; /* another TP group assembles it */
    adamw_state lm = {0}; /* the moments in the slice's layout, on the keeper's stage */
    int rc = pp_gather_full(ps->pp, keep_stage, os, moments ? &lm : NULL);
    moe_model *whole = keep ? xcalloc(1, sizeof *whole) : NULL;
    if (rc == MOERL_OK && g->stage == keep_stage) rc = tp_gather_full(ps->tp, &lm, keep, whole, moments);
    pp_release_full(ps->pp, g->stage == keep_stage, moments ? &lm : NULL);
    if (rc != MOERL_OK || !keep) {
        free(whole);
        return NULL;
    }
    return whole;
}

/* EP × FSDP: in the keeper's block, each FSDP group gathers its expert slice (weights and moments)
 * onto its member with the keeper's fsdp_rank — those members form the keeper's EP group — which
 * then assemble the whole model on the keeper (ep_gather_full). One keeper per stage. */
static const moe_model *ep_fsdp_gather_full(par_state *ps, moe_model *m, int keep, const adamw_state *os,
                                            adamw_state *moments) {
    const par_grid *g = ps->grid;
    if (moments) memset(moments, 0, sizeof *moments);
    float mine = keep ? 1.0f : 0.0f, *all = xmalloc((size_t)g->D * sizeof(float));
    if (dist_comm_allgather_f32(g->stage_comm, &mine, 1, all) != MOERL_OK) {
        free(all);
        return NULL;
    }
    int dk = -1, nk = 0;
    for (int d = 0; d < g->D; d++)
        if (all[d] != 0.0f) dk = d, nk++;
    free(all);
    if (nk > 1) {
        moerl_errorf("par_gather_full: %d keeping ranks in one pipeline stage; expert parallelism with FSDP "
                     "assembles the model on one", nk);
        return NULL;
    }
    const int B = g->ep * g->fsdp;
    if (nk == 0 || g->d / B != dk / B) return NULL; /* no keeper in this rank's block */
    const int helper = g->fsdp_rank == (dk % B) / g->ep;
    adamw_state lm = {0}; /* the slice's moments, whole on the helpers */
    if (moments) {
        lm = *os;
        lm.n = m->n_params;
        lm.m = helper ? xalloc_aligned((m->n_params + 1) * sizeof(float)) : NULL;
        lm.v = helper ? xalloc_aligned((m->n_params + 1) * sizeof(float)) : NULL;
    }
    int rc = MOERL_OK;
    if (moments && (fsdp_gather_vec(ps->fsdp, os->m, lm.m) != MOERL_OK ||
                    fsdp_gather_vec(ps->fsdp, os->v, lm.v) != MOERL_OK))
        rc = MOERL_ERR;
    if (rc == MOERL_OK) rc = fsdp_gather_full(ps->fsdp, helper);
    moe_model *whole = keep ? xcalloc(1, sizeof *whole) : NULL;
    if (rc == MOERL_OK && helper) rc = ep_gather_full(ps->ep, m, moments ? &lm : NULL, keep, whole, moments);
    fsdp_release_all(ps->fsdp);
    free(lm.m);
    free(lm.v);
    if (rc != MOERL_OK || !keep) {
        free(whole);
        return NULL;
    }
    return whole;
}

/* Pipeline × FSDP: agree on the keeper as pp_gather does; in every stage the FSDP group of the keeper's
 * pipeline (d in the keeper's block) gathers its stage's units (weights and moments) onto the member of
 * that pipeline, which sends them to the keeper's stage (pp_exchange_layout). */
static const moe_model *pp_fsdp_gather(par_state *ps, moe_model *m, int keep, const adamw_state *os,
                                       adamw_state *moments) {
    int keeper = 0;
    const int agreed = agree_keeper(ps, keep, moments, &keeper);
    if (agreed < 0) return NULL;
    const par_grid *g = ps->grid;
    const int keep_d = keeper % g->D, keep_stage = keeper / g->D;
    if (agreed == 0 || g->d / g->fsdp != keep_d / g->fsdp) return NULL; /* another FSDP group gathers */
    const int holder = g->d == keep_d; /* the keeper's pipeline */
    const size_t n = m->n_params, bytes = n * sizeof(float);
    float *mv[2] = {NULL, NULL};
    int rc = MOERL_OK;
    for (int k = 0; k < 2 && moments && holder; k++) {
        mv[k] = keep ? xcalloc(n ? n : 1, sizeof(float)) : moerl_map_sparse(bytes);
        if (!mv[k]) /* out of memory: ending the job beats a pipeline waiting on this stage's ranges */
            moerl_fatal("par_gather_full: out of memory mapping %zu bytes for a stage's moments", bytes);
    }
    if (moments && (fsdp_gather_vec(ps->fsdp, os->m, mv[0]) != MOERL_OK ||
                    fsdp_gather_vec(ps->fsdp, os->v, mv[1]) != MOERL_OK))
        rc = MOERL_ERR;
    if (fsdp_gather_full(ps->fsdp, holder) != MOERL_OK) rc = MOERL_ERR;
    for (int k = 0; k < 2 && rc == MOERL_OK && moments && holder; k++) rc = pp_exchange_layout(ps->pp, mv[k], keep_stage);
    if (rc == MOERL_OK && holder) rc = pp_exchange_layout(ps->pp, m->params, keep_stage);
    if (keep && moments && rc == MOERL_OK) {
        *moments = *os;
        moments->n = n;
        moments->m = mv[0];
        moments->v = mv[1];
        return m;
    }
    for (int k = 0; k < 2; k++) {
        if (keep) free(mv[k]);
        else if (mv[k]) munmap(mv[k], bytes);
    }
    return rc == MOERL_OK && keep ? m : NULL;
}

/* Pipeline × EP: agree on the keeper as pp_gather does; the pipelines of the keeper's expert group assemble
 * their (sliced) stages on the keeper's stage (pp_gather_full), whose expert group then assembles the whole
 * model on the keeper (ep_gather_full); the stages' pages and moments are given back at once. */
static const moe_model *pp_ep_gather(par_state *ps, moe_model *m, int keep, const adamw_state *os,
                                     adamw_state *moments) {
    int keeper = 0;
    if (agree_keeper(ps, keep, moments, &keeper) != 1) return NULL;
    const par_grid *g = ps->grid;
    const int keep_d = keeper % g->D, keep_stage = keeper / g->D, on = g->stage == keep_stage;
    if (g->d / g->ep != keep_d / g->ep) return NULL; /* another expert group's pipelines */
    adamw_state lm = {0};
    int rc = pp_gather_full(ps->pp, keep_stage, os, moments ? &lm : NULL);
    moe_model *whole = on && keep ? xcalloc(1, sizeof *whole) : NULL;
    if (on && rc == MOERL_OK) rc = ep_gather_full(ps->ep, m, moments ? &lm : NULL, keep, whole, moments);
    pp_release_full(ps->pp, on, moments ? &lm : NULL);
    if (rc != MOERL_OK || !keep) {
        free(whole);
        return NULL;
    }
    return whole;
}

/* TP × EP: in the keeper's block of ep · tp ranks (its EP group's data-parallel ranks, every TP rank), each TP
 * group assembles its EP slice (weights and moments) on its member with the keeper's tp_rank — those members
 * form the keeper's EP group — which then assemble the whole model on the keeper (ep_gather_full). One keeper
 * over the trainers (agree_keeper). */
static const moe_model *tp_ep_gather_full(par_state *ps, moe_model *m, int keep, const adamw_state *os,
                                          adamw_state *moments) {
    (void)m;
    int keeper = 0;
    if (agree_keeper(ps, keep, moments, &keeper) != 1) return NULL;
    const par_grid *g = ps->grid;
    const int kd = keeper % g->D, k_tp = kd % g->tp, k_blk = (kd / g->tp) / g->ep;
    if (keeper / g->D != g->stage || g->dp_rank / g->ep != k_blk) return NULL; /* not the keeper's block */
    const int helper = g->tp_rank == k_tp;
    moe_model slice = {0};
    adamw_state sm = {0};
    int rc = tp_gather_full(ps->tp, os, helper, &slice, moments ? &sm : NULL);
    moe_model *whole = keep ? xcalloc(1, sizeof *whole) : NULL;
    if (rc == MOERL_OK && helper) rc = ep_gather_full(ps->ep, &slice, moments ? &sm : NULL, keep, whole, moments);
    if (helper) {
        model_free(&slice);
        free(sm.m);
        free(sm.v);
    }
    if (rc != MOERL_OK || !keep) {
        free(whole);
        return NULL;
    }
    return whole;
}

const moe_model *par_gather_full(par_state *ps, moe_model *m, int keep, const adamw_state *os,
                                 adamw_state *moments) {
    if (ps && ps->pp && ps->ep) {
        if (!ps->ctx) return moerl_errorf("par_gather_full: a pipeline needs the trainer runtime (par_state.ctx)"), NULL;
        return pp_ep_gather(ps, m, keep, os, moments);
    }
    if (ps && ps->pp && ps->fsdp) {
        if (!ps->ctx) return moerl_errorf("par_gather_full: a pipeline needs the trainer runtime (par_state.ctx)"), NULL;
        return pp_fsdp_gather(ps, m, keep, os, moments);
    }
    if (ps && ps->pp && pp_is_owned(ps->pp)) {
        if (!ps->ctx) return moerl_errorf("par_gather_full: a pipeline needs the trainer runtime (par_state.ctx)"), NULL;
        if (ps->tp) return tp_pp_gather(ps, m, keep, os, moments);
        return pp_gather(ps, m, keep, os, moments);
    }
    if (ps && ps->ep && ps->fsdp) return ep_fsdp_gather_full(ps, m, keep, os, moments);
    if (ps && ps->ep && ps->tp) return tp_ep_gather_full(ps, m, keep, os, moments);
    if (ps && ps->tp) { /* tensor parallel: an assembled copy on the keeper (tp_gather_full) */
        moe_model *whole = keep ? xcalloc(1, sizeof *whole) : NULL;
        if (moments) memset(moments, 0, sizeof *moments);
        if (tp_gather_full(ps->tp, os, keep, whole, moments) != MOERL_OK) {
            free(whole);
            return NULL;
        }
        return whole;
    }
    if (ps && ps->ep) { /* expert parallel: an assembled copy on the keeper (ep_gather_full) */
        moe_model *whole = keep ? xcalloc(1, sizeof *whole) : NULL;
        if (moments) memset(moments, 0, sizeof *moments);
        if (ep_gather_full(ps->ep, m, os, keep, whole, moments) != MOERL_OK) {
            free(whole);
            return NULL;
        }
        return whole;
    }
    if (!ps || !ps->fsdp) { /* replicated: m and os are whole already */
        if (moments && keep) *moments = *os;
        return keep ? m : NULL;
    }
    if (moments) {
        memset(moments, 0, sizeof *moments);
        if (keep) {
            *moments = *os;
            moments->n = m->n_params;
            moments->m = xalloc_aligned(m->n_params * sizeof(float));
            moments->v = xalloc_aligned(m->n_params * sizeof(float));
        }
        if (fsdp_gather_vec(ps->fsdp, os->m, keep ? moments->m : NULL) != MOERL_OK ||
            fsdp_gather_vec(ps->fsdp, os->v, keep ? moments->v : NULL) != MOERL_OK) {
            if (keep) {
                free(moments->m);
                free(moments->v);
            }
            memset(moments, 0, sizeof *moments);
            return NULL;
        }
    }
    if (fsdp_gather_full(ps->fsdp, keep) != MOERL_OK) return NULL;
    return keep ? m : NULL;
}

void par_release_full(par_state *ps, moe_model *m, const moe_model *full, const adamw_state *os,
                      adamw_state *moments) {
    (void)m;
    if (ps && ps->pp && ps->ep) { /* pipeline × EP: the assembled copy and its moments (the stages gave theirs back) */
        if (full && full != m) {
            model_free((moe_model *)full);
            free((moe_model *)full);
        }
        if (moments && moments->m && (!os || moments->m != os->m)) {
            free(moments->m);
            free(moments->v);
        }
        if (moments) memset(moments, 0, sizeof *moments);
        return;
    }
    if (ps && ps->pp && !ps->tp && pp_is_owned(ps->pp)) { /* TP × pipeline: an assembled copy, freed below */
        pp_release_full(ps->pp, full != NULL, moments);
        return;
    }
    if (ps && ps->pp && ps->fsdp) { /* pipeline × FSDP: the units, the moments, the other stages' pages */
        fsdp_release_all(ps->fsdp);
        if (moments && moments->m && (!os || moments->m != os->m)) {
            free(moments->m);
            free(moments->v);
        }
        if (moments) memset(moments, 0, sizeof *moments);
        if (full == m) moerl_drop_pages(m->params, 0, m->n_params);
        return;
    }
    if (!ps || (!ps->fsdp && !ps->ep && !ps->tp)) return;
    if (full && full != m) { /* an assembled copy (expert parallel) */
        model_free((moe_model *)full);
        free((moe_model *)full);
    }
    if (ps->fsdp) fsdp_release_all(ps->fsdp);
    if (moments && os && moments->m && moments->m != os->m) {
        free(moments->m);
        free(moments->v);
    }
    if (moments) memset(moments, 0, sizeof *moments);
}

int par_load_weights(par_state *ps, moe_model *m, const char *dir) {
    if (ps && ps->tp) return tp_load_weights(ps->tp, dir);
    return model_load_weights(m, dir);
}

int par_batch_copies(const par_state *ps) { return ps && ps->tp && ps->grid ? ps->grid->tp : 1; }

void par_take_full(par_state *ps, moe_model *m) {
    (void)m;
    if (ps && ps->fsdp) fsdp_take_shard(ps->fsdp);
    else if (ps && ps->pp) pp_take_full(ps->pp);
}
