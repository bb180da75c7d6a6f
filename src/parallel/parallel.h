/* The model-parallel runtime of one trainer rank: the grid (grid.h) and each strategy's state.
 * A NULL par_state (or NULL member) means that strategy is off; every code path with all of them
 * off is the single-rank / data-parallel path unchanged.
 *
 * Where each strategy hooks in (so that `moerl sft` and the trainer ranks of `moerl rl` run the
 * same code, through train_accumulate in src/train/train.c):
 *   fsdp  src/parallel/fsdp.c     parameter shards; all-gather before a layer's forward / backward
 *                                 (model_acts.par's layer_event hook → par_layer_hook), reduce-
 *                                 scatter of gradients, optimizer on the owned shard;
 *   ep    src/parallel/ep.c       the MoE layer's token exchange between permute and grouped GEMM
 *                                 (the model's MoE dispatch hooks), all-to-all or all-to-all-v;
 *   sp    src/parallel/ulysses.c  attention: sequence-sharded → head-sharded and back (the model's
 *                                 attention shard hooks);
 *   pp    src/parallel/pipeline.c the 1F1B schedule over micro-batches (replaces the micro-batch
 *                                 loop of train_accumulate: train.h's hooks), activations sent point-to-point; a
 *                                 stage holds only its layers' parameters, gradients and moments
 *                                 (Megatron), summed over grid.stage_comm by par_finish_grads;
 *                                 compute_logprobs / compute_router_counts run the stages forward
 *                                 only and return the pipeline's result on every stage.
 *
 * The caller's part (what a trainer does with these entry points, per strategy):
 *   data sharding   par_data_shard: every rank of a pipeline / Ulysses group gets the same sequences;
 *   gradient sum    none / plain DP: a dist reducer over all trainer ranks (dist_reducer_new);
 *                   SP (no FSDP): a reducer over grid.stage_comm; FSDP: none (par_finish_grads);
 *                   pp: NO reducer — par_finish_grads sums each stage over grid.stage_comm;
 *   losses, counts  summed over all trainer ranks (a pipeline's non-last stages report 0); router
 *                   counts from compute_router_counts are the pipeline's on every stage: divide the
 *                   all-trainer sum by grid.pp (or sum over stage_comm);
 *   every step      par_max_passes before the passes, train_accumulate, par_finish_grads,
 *                   par_adamw_step (collective under FSDP and pp: every trainer calls it);
 *   whole model     par_gather_full / par_release_full on every trainer rank (checkpoints, weight
 *                   sync, evaluation); after loading a whole model into m->params (resume),
 *                   par_take_full. */
#ifndef MOERL_PARALLEL_H
#define MOERL_PARALLEL_H

#include "base/config.h"
#include "model/forward.h"
#include "model/model.h"
#include "parallel/grid.h"
#include "train/train.h"

struct fsdp_state;
struct ep_state;
struct sp_state;
struct pp_state;
struct tp_state;
struct tp_ep_state;

typedef struct par_state {
    /* FIRST: the hook tables the model and the training loop call (model/forward.h, train/train.h),
     * so &ps is what model_acts.par / train_step_opts.par take; they point at model_tab / train_tab,
     * filled by par_state_init* for the strategies that are on (NULL in a zeroed par_state). */
    train_par_head head;
    model_hooks model_tab;
    train_par_hooks train_tab;
    dist_ctx *ctx;            /* the process's runtime (roles split); NULL only for a zeroed par_state */
    par_config cfg;           /* the keys as read (par_read_keys) */
    par_grid *grid;           /* NULL: one rank (or plain data parallel through the reducer) */
    struct fsdp_state *fsdp;  /* NULL: parameters replicated */
    struct ep_state *ep;      /* NULL: every rank holds every expert */
    struct sp_state *sp;      /* NULL: whole sequences per rank */
    struct pp_state *pp;      /* NULL: one stage */
    struct tp_state *tp;      /* NULL: no tensor parallelism (src/parallel/tp.h) */
    struct tp_ep_state *tpep; /* TP × EP: the MoE layers' token split over the TP group (tp_ep.h); else NULL */
    int grid_borrowed;        /* grid is another par_state's (par_state_init_like): not freed here */
} par_state;

/* Build the model-parallel runtime of a trainer rank (collective over the trainer ranks, in the same
 * order everywhere): read the keys of par_def_keys from c, build the grid (par_grid_init) when any
 * size is > 1, then each strategy's state: FSDP (fsdp_state_new: m->params / m->grads become
 * sparse gather buffers, m keeps its tensor table) when the grid's fsdp > 1; expert parallel,
 * Ulysses and pipeline at their marked spots in parallel.c. ctx must have its roles split (this
 * rank a trainer, or embedded). A size > 1 whose strategy this build lacks is an error naming the
 * key. On error ps is left freed (zeroed) and m unchanged. */
int par_state_init(par_state *ps, dist_ctx *ctx, const cfg *c, moe_model *m);
/* The same from keys already read (par_read_keys), e.g. rl_config.par. */
int par_state_init_cfg(par_state *ps, dist_ctx *ctx, const par_config *pc, moe_model *m);
/* A second model on the grid of `like` (which must outlive ps): the same strategies as like's, built
 * for m — e.g. the frozen KL reference of the RL trainer, an inference model (no gradient buffer),
 * sharded as the actor is (verl's FSDP-sharded reference worker). m must hold the whole model (the
 * same on every trainer rank) with the config like's model had before par_state_init (no
 * exec.ep_size). Afterwards m holds what like's model holds per rank: FSDP its unit shards (gathered
 * layer by layer in a pass whose model_acts.par is ps), expert parallelism its local experts (the
 * model is re-made from the sliced config), a pipeline its stage's range; Ulysses SP has its own
 * head-exchange buffers. like inactive (one rank, plain data parallel): ps zeroed, m unchanged (the
 * whole model is right there). Collective over the trainer ranks like par_state_init, but opens no
 * communicator (the grid's are shared: the two models' passes run one after the other, in the same
 * order on every rank). Free with par_state_free BEFORE like. On error ps is left freed. */
int par_state_init_like(par_state *ps, const par_state *like, moe_model *m);
/* Parameter floats m holds on this rank under ps (FSDP: the owned unit shards, fsdp_stats.shard_floats;
 * a stage-owned pipeline: pp_held_floats; otherwise m->n_params — under expert parallelism the local
 * experts' layout). Not collective. */
size_t par_held_floats(const par_state *ps, const moe_model *m);
/* Give back the units a forward-only pass left gathered (FSDP: fsdp_release_all); no-op otherwise.
 * Not collective. */
void par_release_gathered(par_state *ps);
/* The storage of m's parameters that the optimizer updates and every forward reads (directly, or
 * through FSDP's gathers): FSDP's shard, else m->params (the whole layout; a pipeline stage or an
 * expert-parallel rank uses its own part of it). *n: its floats. ps NULL: m->params. */
float *par_param_store(par_state *ps, moe_model *m, size_t *n);
/* Free the strategies (FSDP first gathers the whole model back into ordinary buffers of m on EVERY
 * trainer rank, so m is a plain model afterwards) and the grid. Collective like par_state_init.
 * A zeroed par_state is a no-op. */
void par_state_free(par_state *ps);
/* Fill ps's hook tables (model_tab, train_tab) for the strategies ps holds now and point its head at
 * them, so that &ps can be given as model_acts.par / train_step_opts.par. par_state_init* call it;
 * call it again after building a par_state by hand or changing its strategy members (tests,
 * benchmarks). Not collective. */
void par_bind_hooks(par_state *ps);
/* Which share of a global batch this rank trains: shard *index of *count data-parallel shards
 * (grid: dp_rank of dp; otherwise trainer_rank of trainer_size; no ctx: 0 of 1). */
void par_data_shard(const par_state *ps, int *index, int *count);
/* 1 when any strategy is on (the model is not plainly replicated). */
int par_active(const par_state *ps);

/* Layer events of model_forward / model_backward (the layer_event hook of forward.h's model_hooks,
 * which model_acts.par's table points here; phases: model_layer_phase). FSDP gathers and releases
 * parameters and reduces gradients here. */
void par_layer_hook(par_state *ps, model_layer_phase phase, int l);

/* train_accumulate's start: zero the gradients (the owned shard under FSDP, m->grads otherwise). */
void par_zero_grad(par_state *ps, moe_model *m);
/* Every FSDP rank must run the same number of forward (and backward) passes, so a rank with fewer
 * micro-batches than the most in its group runs the missing ones as idle passes (the collectives
 * only, with zero gradients). par_max_passes: the most passes any member of this rank's FSDP group
 * runs — collective over the group, so call it BEFORE the passes (a member still inside a pass
 * would see another collective); without FSDP: passes. par_pad_passes: after this rank's `passes`
 * passes, run max − passes idle ones (backward 0: forward-only passes, as compute_router_counts);
 * not collective by itself; no-op without FSDP. With expert parallelism the same over the EP group
 * (ep_max_passes / ep_idle_pass: an idle rank's experts still serve the others' rows). */
int par_max_passes(par_state *ps, int passes);
int par_pad_passes(par_state *ps, int passes, int max, int backward);

/* ---- Strategy-agnostic entry points of a trainer: the optimizer over what this rank owns and the
 * whole model on one rank (weight sync, checkpoints, evaluation). `moerl sft` and the trainer ranks
 * of `moerl rl` call only these, so each strategy plugs in here (FSDP today; the others add theirs).
 * A NULL or inactive ps is the replicated model: plain adamw_* on m. */

#include "optim/adamw.h"

/* Who sums the gradients over the ranks. With FSDP, expert parallelism or a stage-owned pipeline, par_finish_grads does
 * (FSDP: reduce-scatter in the shard group + the HSDP replica sum; EP: ep_reduce_grads, the
 * replicated tensors over the stage's ranks and the expert slices over grid->ep_dp_comm, the ranks
 * holding the same experts; pp: the stage's range over grid->stage_comm): par_grads_self_reduced returns 1 and the caller must NOT run a DDP
 * reducer (dist_reducer_*) — one summing the expert slices of different ranks would add different
 * experts together. Otherwise (0) the caller sums m->grads with its DDP reducer over the trainer
 * ranks (over grid->stage_comm when a grid exists without pipeline stages, as `moerl sft` does). */
int par_grads_self_reduced(const par_state *ps);
/* Floats of the WHOLE model's layout (checkpoints, weight sync): m->n_params except under expert
 * parallelism, where m holds only this rank's experts. */
size_t par_whole_params(const par_state *ps, const moe_model *m);
/* This rank's part of a vector in the whole model's layout (whole [par_whole_params]) into local
 * (the layout par_adamw_init's moments use: FSDP the owned shard, EP the local experts, otherwise
 * a copy of all of it). Not collective. */
void par_slice_vec(par_state *ps, const moe_model *m, const float *whole, float *local);

/* AdamW state over this rank's parameters (FSDP: the owned shard; EP: m's local layout, the
 * replicated tensors and this rank's experts; pp: the stage's range, pipeline.h; otherwise all of m). */
void par_adamw_init(par_state *ps, const moe_model *m, adamw_state *os, adamw_config cfg);
/* os holds moments in the whole model's layout (os->n == par_whole_params), e.g. a checkpoint's, read
 * before par_state_init sharded m: replace them by this rank's part (par_slice_vec; not collective). */
void par_adamw_shard(par_state *ps, const moe_model *m, adamw_state *os);
/* One AdamW step (global gradient-norm clipping at os's max_grad_norm) over the owned parameters;
 * returns as adamw_step (1 applied, 0 skipped for a non-finite loss or norm). Collective under FSDP
 * (the norm is summed over the shard group), EP (the experts' squares summed over ep_comm) and pp
 * (over pp_comm; the tied embedding's copy). */
int par_adamw_step(par_state *ps, moe_model *m, adamw_state *os, float lr, float loss, double *grad_norm);
/* The end of a step's backward passes: `passes` micro-batches ran here, `max_passes` (from
 * par_max_passes before them) on the busiest member: run the idle backward passes, then finish the
 * gradient reduction (FSDP: wait for the reduce-scatters, sum over HSDP replicas; EP:
 * ep_reduce_grads, see par_grads_self_reduced; pp: sum the stage's range over grid.stage_comm, the
 * tied embedding's two parts onto stage 0 — collective over stage_comm and pp_comm). Without FSDP /
 * EP / pp: nothing (the caller's reducer). */
int par_finish_grads(par_state *ps, int passes, int max_passes);

/* The whole model on one rank. Collective over the trainer ranks (every one calls it, in the same
 * order as its other collectives). Returns, on the rank with keep = 1, a model holding every
 * parameter in m's layout — m itself (FSDP and pp gather into it) or an assembled copy — and NULL on
 * the others (pp: the keeper's pipeline sends its stages' ranges to the keeper; any trainer rank may
 * keep, at most one per call). With moments != NULL the AdamW moments of os come too: moments is set
 * on the keeping rank to a state whose m / v cover the whole layout (os itself when nothing is
 * sharded). Under expert parallelism the result is a new assembled inference model (no gradients,
 * exec.ep_size unset) built by point-to-point messages over the keeper's EP group (ep_gather_full):
 * only the keeper holds a whole-model buffer. Errors: NULL everywhere with moerl_errorf. Pair with
 * par_release_full on every rank. */
const moe_model *par_gather_full(par_state *ps, moe_model *m, int keep, const adamw_state *os,
                                 adamw_state *moments);
/* Undo par_gather_full (frees the assembled copies; FSDP drops the gathered units; pp: the keeper
 * gives back the other stages' pages). Not collective. full: what par_gather_full returned here. */
void par_release_full(par_state *ps, moe_model *m, const moe_model *full, const adamw_state *os,
                      adamw_state *moments);
/* Load DIR's whole checkpoint (model_load_weights) into m, whatever this rank holds of it: under tensor
 * parallelism its slice (tp_load_weights); otherwise model_load_weights (expert parallel: its experts), the
 * caller then giving FSDP / a pipeline their part (par_take_full). Not collective. */
int par_load_weights(par_state *ps, moe_model *m, const char *dir);
/* How many trainer ranks compute the same sequences' losses and router counts, so that a sum over all trainer
 * ranks counts each once after dividing by it: the TP size under tensor parallelism, else 1. */
int par_batch_copies(const par_state *ps);
/* m->params has been overwritten with the whole model on this rank (model_load_weights of a
 * checkpoint, any rank count): keep only what this rank owns (FSDP: its shard; pp: its stage's
 * range) and give the rest of the memory back. Not collective. No-op when nothing is sharded. */
void par_take_full(par_state *ps, moe_model *m);

/* Token rows a rank's model_acts arena needs for micro-batches of max_tokens tokens: its Ulysses
 * share ⌈max_tokens/sp⌉ under SP (model_forward computes sp_token_range's share; ulysses.c holds
 * the head-sharded attention buffers), 1 under the pipeline (its passes run on the stage's own slot
 * activations; model_acts only carries par there), max_tokens otherwise (ps NULL included). Use with
 * model_acts_init_rows(a, m, par_acts_rows(ps, max_tokens), max_tokens). */
int par_acts_rows(const par_state *ps, int max_tokens);

#endif
