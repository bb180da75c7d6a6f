/* FSDP with ZeRO-3 semantics (actor.fsdp_config.fsdp_size): every rank of an FSDP group owns 1/P of
 * every parameter, of its gradient and of its AdamW moments; parameters are all-gathered layer by
 * layer just before use and released after; gradients are reduce-scattered per layer as backward
 * finishes them; the optimizer steps on the owned shard. With several FSDP groups (HSDP) the
 * shard gradients are then summed over the replicas (grid.replica_comm).
 *
 * Units. The parameter layout (model.h) is cut into L+2 contiguous units: the embedding (unit 0),
 * decoder layer l (unit l+1), the final norm and untied LM head (unit L+1). Unit u spans floats
 * [off_u, off_u + n_u) of the layout; rank r of P owns floats [off_u + r·s_u, off_u + (r+1)·s_u) of it,
 * s_u = ⌈n_u / P⌉ rounded up to 16 floats (the tail past n_u is zero padding on the last ranks).
 * The owned shards of all units are concatenated into one shard buffer of S = Σ s_u floats
 * (parameters, gradients, the two moments: 4·S floats per rank instead of 4·n_params).
 *
 * Memory design. m->params and m->grads stay buffers of the full layout, so every view (m->p,
 * m->g) and every kernel is unchanged, but they become sparse anonymous mappings (MAP_NORESERVE):
 * only the units currently gathered are backed by memory; releasing a unit returns its pages with
 * madvise(MADV_DONTNEED) (pages straddling two units, at most two per unit, stay). The schedule
 * (par_layer_hook, the model's layer_event hook) keeps the units of the current layer pair plus one prefetched
 * unit gathered: forward layer l needs units {l, l+1} (layer l's rest and layer l+1's attention
 * input run in one team), backward layer l needs {l, l−1}; so the resident full-parameter memory is
 * ~3 layers, never the model. The next unit's all-gather is started (dist_comm_iallgather_f32)
 * before this one's compute; gradients of a finished unit are reduce-scattered with
 * dist_comm_ireduce_scatter_f32 and added to the owned gradient shard when complete.
 * Source: PyTorch FSDP (FULL_SHARD: all-gather before forward and backward, reduce-scatter after
 * backward, prefetch of the next unit); ZeRO (Rajbhandari et al., 2020), stage 3.
 *
 * Keeping the units for a mini-batch (actor.fsdp_config.reshard_after_forward=false, FSDP2's name;
 * fsdp_set_reshard_after_forward): the schedule releases nothing — each unit is all-gathered once,
 * when first needed, and stays for every later pass (the router-count pre-pass, every micro-batch's
 * forward and backward) until the optimizer step (fsdp_adamw_step) or fsdp_release_all gives the
 * units back — and the gradient units are not reduce-scattered as each backward finishes them: they
 * stay live in m->grads, accumulate over the micro-batches, and fsdp_finish_grads reduce-scatters
 * each unit once, one at a time from unit 0. Fewer collectives (one all-gather and one
 * reduce-scatter per unit and update instead of one per pass) for more memory: the whole model and
 * its whole gradient resident at the end of the mini-batch. A forward-only pass before the update
 * (the RL trainer's proximal logprobs) leaves the whole model gathered, which the update then uses.
 * Source: PyTorch FSDP2 fully_shard(reshard_after_forward=False) with gradient accumulation without
 * per-micro-batch reduce-scatter (FSDP's no_sync).
 *
 * Every function below is collective over the FSDP group unless said otherwise, and must be
 * called in the same order by its members. */
#ifndef MOERL_FSDP_H
#define MOERL_FSDP_H

#include <stddef.h>

#include "dist/dist.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/parallel.h"

typedef struct fsdp_state fsdp_state;

/* Shard m over the group `shard` (size P ≥ 1; its rank = this rank's shard index) with optional
 * HSDP replicas (`replicas`, NULL or size 1 = none): copies this rank's shard out of m->params
 * (which must hold the whole model, identical on every rank), frees m's full buffers and puts
 * the sparse mappings in their place (views refreshed). The model, the groups and the state must
 * outlive each other until fsdp_state_free. An inference model (m->grads NULL, e.g. the KL
 * reference of par_state_init_like) gets no gradient shard and runs forward passes only.
 * Errors: mmap failing. */
fsdp_state *fsdp_state_new(moe_model *m, dist_comm *shard, dist_comm *replicas);
/* Pipeline × FSDP: the same over the units with unit_on[u] != 0 only (unit_on[L+2]: 0 the embedding,
 * l+1 decoder layer l, L+1 the final norm and LM head; NULL = every unit, fsdp_state_new): a pipeline
 * stage shards only its own units over its FSDP group; the other units get no shard (zero floats), are
 * never gathered and their layout region is never touched, so a layer event of another stage's unit
 * is a no-op. fsdp_gather_vec / fsdp_state_free fill only the units on (the rest of the layout stays
 * zero: the pipeline assembles the stages, pp_exchange_layout). Errors as fsdp_state_new. */
fsdp_state *fsdp_state_new_units(moe_model *m, dist_comm *shard, dist_comm *replicas, const unsigned char *unit_on);
/* Pipeline × FSDP: fsdp_grad_norm also sums the squares over `stages` (grid.pp_comm: the ranks with the
 * same position in the other stages, which own the other units' same shards), so the norm is the whole
 * model's. NULL: off. Not collective. */
void fsdp_set_norm_group(fsdp_state *fs, dist_comm *stages);
/* EP × FSDP (src/parallel/grid.h): m is one rank's expert slice (exec.ep_size), the shard group
 * holds the same experts. After this call fsdp_finish_grads sums the owned pieces of replicated
 * tensors over `replicas` (fsdp_state_new's: every rank with this fsdp_rank, across the EP group
 * and the HSDP blocks) and those of expert tensors (TF_EXPERT) over expert_replicas (the ranks with
 * the same fsdp_rank and the same experts); fsdp_grad_norm adds the expert squares over ep (the
 * EP group) so that the norm is the whole model's. Not collective. */
void fsdp_set_expert_groups(fsdp_state *fs, dist_comm *expert_replicas, dist_comm *ep);
/* Gather the whole model into ordinary heap buffers of m on every member (m->params full, m->grads
 * zeroed, views refreshed) and free the state. NULL is a no-op. */
void fsdp_state_free(fsdp_state *fs);

/* The layer events of par_layer_hook (parallel.h). Not collective by itself, but every member
 * must see the same sequence of events (par_pad_passes makes it so). */
void fsdp_layer_event(fsdp_state *fs, model_layer_phase phase, int l);
/* Zero the owned gradient shard (start of a step). */
void fsdp_zero_grad(fsdp_state *fs);
/* actor.fsdp_config.reshard_after_forward: 1 (default) = release units after each region and reduce-scatter
 * per backward pass; 0 = keep units gathered and gradients accumulated for the mini-batch (above). An
 * inference state (no gradient shard) always reshards. Not collective, but every member must set the
 * same value. */
void fsdp_set_reshard_after_forward(fsdp_state *fs, int reshard);
/* One pass with no tokens: the events of a forward (and with backward, of a backward) with zero
 * gradients, so the collectives match a member that runs one more micro-batch. */
void fsdp_idle_pass(fsdp_state *fs, int backward);
/* End of a step's backward passes: wait for every reduce-scatter, add into the gradient shard, then
 * sum the shard over the HSDP replicas. Collective over the group and the replicas. */
int fsdp_finish_grads(fsdp_state *fs);
/* The global L2 gradient norm (Σ over the owned shards, summed over the group; double). */
double fsdp_grad_norm(fsdp_state *fs);
/* adamw_step on the owned shard: the global norm, clip, update of the owned parameters (in
 * moments os made by fsdp_adamw_init), then every gathered unit is released (it is stale).
 * Returns as adamw_step. */
void fsdp_adamw_init(fsdp_state *fs, adamw_state *os, adamw_config cfg);
int fsdp_adamw_step(fsdp_state *fs, adamw_state *os, float lr, float loss, double *grad_norm);

/* Gather every unit into m->params; members with keep = 0 release each unit right after (so the
 * group's collectives run, but only the keeping rank holds the whole model). The units stay
 * gathered until fsdp_release_all or the next optimizer step. */
int fsdp_gather_full(fsdp_state *fs, int keep);
void fsdp_release_all(fsdp_state *fs);
/* The rank's parameter shard (what the optimizer updates and the gathers read): p_shard[*n]. */
float *fsdp_param_shard(fsdp_state *fs, size_t *n);
/* m->params has been overwritten with a whole model on this rank (e.g. model_load_weights): take
 * this rank's shard from it and release every page. Not collective. */
void fsdp_take_shard(fsdp_state *fs);
/* A layout-sized vector from shards: full[n_params] (on members with full != NULL) = the group's
 * shards of shard_vec (S floats) in layout order; one unit at a time. */
int fsdp_gather_vec(fsdp_state *fs, const float *shard_vec, float *full);
/* This rank's shard (S floats) of a layout-sized vector (not collective). */
void fsdp_slice_vec(const fsdp_state *fs, const float *full, float *shard_vec);

typedef struct {
    int P, rank, replicas;
    size_t shard_floats;       /* S: owned floats per buffer (parameters, gradients, m, v alike) */
    size_t n_params;           /* the layout's floats */
    double peak_gathered_bytes;/* most bytes of gathered parameters + live gradient units + bounce
                                  buffers at one time since the state was made (or reset) */
    double gathered_bytes;     /* the same, now */
    double allgather_bytes, reduce_scatter_bytes, replica_bytes; /* sent through the groups (dist_comm_bytes) */
    int n_units;
    size_t unit_floats_max;    /* the largest unit */
} fsdp_stats;
void fsdp_get_stats(const fsdp_state *fs, fsdp_stats *st);
void fsdp_reset_peak(fsdp_state *fs);
/* Shard floats of unit u (0 ≤ u < L+2) and its layout size (formulas of the bench). */
size_t fsdp_unit_shard(const fsdp_state *fs, int u, size_t *unit_floats);

#endif
