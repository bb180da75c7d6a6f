/* moerl plan: pipeline × FSDP's memory and traffic rows. See plan_pp_fsdp.h. */
#include "plan/plan_pp_fsdp.h"

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "parallel/pipeline.h"
#include "plan/plan_replay.h"

/* A stage's chunks: layers [lo[k], hi[k]) of chunk k (virtual stage k·pp + stage), its units on[L+2]. */
typedef struct {
    const moe_config *c;
    int L, pp, v, stage;
    int lo[PP_MAX_CHUNKS], hi[PP_MAX_CHUNKS];
    unsigned char on[MOERL_MAX_LAYERS + 2];
} stage_sched;

static int stage_sched_init(const moe_config *c, int pp, int v, int stage, stage_sched *z) {
    memset(z, 0, sizeof *z);
    z->c = c;
    z->L = c->num_hidden_layers;
    z->pp = pp;
    z->v = v < 1 ? 1 : v;
    z->stage = stage;
    if (z->v > PP_MAX_CHUNKS || z->L + 2 > MOERL_MAX_LAYERS + 2)
        return moerl_errorf("plan: %d chunks per stage, expected 1..%d", z->v, PP_MAX_CHUNKS);
    for (int k = 0; k < z->v; k++) { /* pp_stage_units' rule */
        double d, e;
        if (plan_pp_chunk_params(c, pp, z->v, PLAN_PP_STAGE_LOCAL, stage, k, &d, &e, &z->lo[k], &z->hi[k]) != MOERL_OK)
            return MOERL_ERR;
        for (int l = z->lo[k]; l < z->hi[k]; l++) z->on[l + 1] = 1;
        const int vs = k * pp + stage;
        if (vs == 0) z->on[0] = 1;
        if (vs == pp * z->v - 1) z->on[z->L + 1] = 1;
    }
    return MOERL_OK;
}

/* model_forward's layer events over chunk k's layers (forward.c: MODEL_FWD_LAYER lo − 1 .. hi − 1). */
static void fwd_pass(plan_replay *r, const stage_sched *z, int k) {
    for (int l = z->lo[k] - 1; l < z->hi[k]; l++) plan_replay_event(r, 0, l);
}

/* model_backward's: MODEL_BWD_LAYER hi, the head's gradients (GRAD_READY L: unit L+1) on the last layer, then
 * per layer l = hi − 1 .. lo its BWD event and GRAD_READY l (unit l+1), GRAD_READY −1 (unit 0) when lo = 0. */
static void bwd_pass(plan_replay *r, const stage_sched *z, int k) {
    const int lo = z->lo[k], hi = z->hi[k];
    plan_replay_event(r, 1, hi);
    if (hi == z->L) plan_replay_ready(r, z->L + 1);
    for (int l = hi - 1; l >= lo; l--) {
        plan_replay_event(r, 1, l);
        plan_replay_ready(r, l + 1);
    }
    if (lo == 0) plan_replay_ready(r, 0);
}

/* pipeline.c forward_only's order: groups of pp micro-batches, each through chunk 0, 1, … */
static void fwd_only(plan_replay *r, const stage_sched *z, int n) {
    for (int g0 = 0; g0 < n; g0 += z->pp)
        for (int k = 0; k < z->v; k++)
            for (int j = g0; j < MOERL_MIN(g0 + z->pp, n); j++) fwd_pass(r, z, k);
}

/* run_1f1b's order (pp_schedule) over m micro-batches. */
static int train_1f1b(plan_replay *r, const stage_sched *z, int m) {
    const int nops = 2 * m * z->v;
    int *kind = xmalloc(3 * (size_t)(nops ? nops : 1) * sizeof(int)), *chunk = kind + nops, *mbi = chunk + nops;
    const int rc = pp_schedule(z->pp, z->stage, z->v, m, kind, chunk, mbi) == nops ? MOERL_OK : MOERL_ERR;
    for (int i = 0; rc == MOERL_OK && i < nops; i++) (kind[i] ? bwd_pass : fwd_pass)(r, z, chunk[i]);
    free(kind);
    return rc == MOERL_OK ? MOERL_OK : moerl_error_prefix("plan: ");
}

typedef struct {
    int P, eager, keep, warm, fo; /* fo: forward-only passes before the training (0: a logprob pass alone) */
    int train;                    /* 1: an update (fo pre-passes + 1F1B); 0: one forward-only pass of n */
} replay_args;

/* One replay of `count` micro-batches from a cold start: out = {floats gathered (an update: only the update's,
 * not the warm-up pass's), peak, floats held at the end}. */
static int replay_count(const stage_sched *z, const replay_args *a, int count, double out[3]) {
    plan_replay *r = plan_replay_new(z->c, z->on, a->P, a->eager, a->keep);
    double g0 = 0;
    int rc = MOERL_OK;
    if (a->train && a->warm) { /* the step's logprob pass just before (one micro-batch leaves the same state) */
        plan_replay_begin(r);
        fwd_only(r, z, 1);
        plan_replay_stats(r, &g0, NULL, NULL, NULL);
    }
    plan_replay_begin(r);
    if (a->train) {
        for (int p = 0; p < a->fo; p++) fwd_only(r, z, count);
        rc = train_1f1b(r, z, count);
    } else {
        fwd_only(r, z, count);
    }
    plan_replay_finish(r);
    plan_replay_stats(r, &out[0], &out[1], &out[2], NULL);
    out[0] -= g0;
    plan_replay_free(r);
    return rc;
}

static int default_cap(int pp, int v) { return 4 * pp * (v + 1) + 16; }

/* replay_count for any count: whole up to cap; above, from two replays c1 < c2 = c1 + step with c1 ≡ count
 * (mod step) — the schedule repeats every step micro-batches (1; interleaved: pp, for the 1F1B's steady
 * pairs and forward_only's groups alike), so the gathers grow by g(c2) − g(c1) per step, the peak is
 * reached and the end state is c2's. */
static int replay_extrapolated(const stage_sched *z, const replay_args *a, int count, int cap, double out[3]) {
    const int step = z->v > 1 ? z->pp : 1;
    if (cap <= 0) cap = default_cap(z->pp, z->v);
    cap = MOERL_MAX(cap, step);
    if (count <= cap) return replay_count(z, a, count, out);
    const int base = cap - step + 1, c1 = base + (count - base) % step, c2 = c1 + step;
    double o1[3], o2[3];
    if (replay_count(z, a, c1, o1) != MOERL_OK || replay_count(z, a, c2, o2) != MOERL_OK) return MOERL_ERR;
    out[0] = o1[0] + (double)((count - c1) / step) * (o2[0] - o1[0]);
    out[1] = MOERL_MAX(o1[1], o2[1]);
    out[2] = o2[2];
    return MOERL_OK;
}

static int moe_model_has_moe(const moe_config *c) {
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (moe_config_layer_is_moe(c, l)) return 1;
    return 0;
}

int plan_pp_fsdp_check(const moe_config *c, const plan_input *in, int fsdp) {
    if (in->pp <= 1 || fsdp <= 1) return MOERL_OK;
    if (c->tie_word_embeddings) /* parallel.c pp_fsdp_init's refusal */
        return moerl_errorf("plan: actor.pipeline_parallel_size=%d with actor.fsdp_config.fsdp_size=%d: a model with "
                            "tied embeddings (config.json tie_word_embeddings=true) is not supported with this layout, "
                            "as moerl sft and moerl rl refuse it: use actor.fsdp_config.fsdp_size=1 (the pipeline "
                            "alone holds the embedding's copy)", in->pp, fsdp);
    if (c->num_hidden_layers > MOERL_MAX_LAYERS)
        return moerl_errorf("plan: %d layers, at most %d", c->num_hidden_layers, MOERL_MAX_LAYERS);
    return MOERL_OK;
}

double plan_pp_fsdp_shard(const moe_config *c, int pp, int v, int stage, int fsdp) {
    stage_sched z;
    if (stage_sched_init(c, pp, v, stage, &z) != MOERL_OK) return 0;
    plan_replay *r = plan_replay_new(c, z.on, fsdp, 0, 0);
    double S;
    plan_replay_stats(r, NULL, NULL, NULL, &S);
    plan_replay_free(r);
    return S;
}

int plan_pp_fsdp_update(const moe_config *c, int pp, int v, int stage, int fsdp, int eager, int keep, int warm,
                        int fo, int m, int cap, double *gathered, double *peak) {
    stage_sched z;
    if (stage_sched_init(c, pp, v, stage, &z) != MOERL_OK) return MOERL_ERR;
    const replay_args a = {.P = fsdp, .eager = eager, .keep = keep, .warm = warm, .fo = fo, .train = 1};
    double o[3];
    if (replay_extrapolated(&z, &a, m, cap, o) != MOERL_OK) return MOERL_ERR;
    if (gathered) *gathered = o[0];
    if (peak) *peak = o[1];
    return MOERL_OK;
}

/* The pre-passes an update runs: pp_compute_router_counts runs its forward-only pass only for a model with
 * MoE layers (the pipeline's aux statistics). */
static int pre_passes(const moe_config *c, const plan_input *in) {
    return moe_model_has_moe(c) ? MOERL_MAX(0, in->fwd_only_passes) : 0;
}

void plan_pp_fsdp_peak(const moe_config *c, const plan_input *in, int v, int mb, int stage, int fsdp, double *hi,
                       double *lo) {
    const int fo = pre_passes(c, in), keep = in->fsdp_keep_gathered;
    *hi = *lo = 0;
    plan_pp_fsdp_update(c, in->pp, v, stage, fsdp, 0, keep, 0, fo, mb, 0, NULL, hi);
    plan_pp_fsdp_update(c, in->pp, v, stage, fsdp, 1, keep, 0, fo, mb, 0, NULL, lo);
}

int plan_pp_fsdp_traffic(const moe_config *c, const plan_input *in, int fsdp, int v, int mb, int S_ranks, int stage,
                         plan_traffic *t) {
    const int fo = pre_passes(c, in), keep = in->fsdp_keep_gathered, pp = in->pp;
    const double db = in->dtype_bytes;
    double cold, warm;
    if (plan_pp_fsdp_update(c, pp, v, stage, fsdp, 0, keep, 0, fo, mb, 0, &cold, NULL) != MOERL_OK ||
        plan_pp_fsdp_update(c, pp, v, stage, fsdp, 0, keep, 1, fo, mb, 0, &warm, NULL) != MOERL_OK)
        return MOERL_ERR;
    t->fsdp_allgather = (fsdp - 1) * (cold * db);
    t->fsdp_allgather_warm = (fsdp - 1) * (warm * db);
    const double S = plan_pp_fsdp_shard(c, pp, v, stage, fsdp);
    /* one reduce-scatter per unit and backward pass; held: one per unit at the mini-batch's end */
    t->fsdp_reduce_scatter = (double)(fsdp - 1) * S * db * (keep ? 1 : mb);
    const int R = S_ranks / fsdp; /* replica_comm: the stage's ranks with this fsdp_rank */
    if (R > 1) t->replica_allreduce = 2.0 * (R - 1) / R * S * 4; /* fp32 gradient shard */
    t->pp_norm_allreduce = 2.0 * (pp - 1) / pp * 8; /* fsdp_grad_norm's sum over pp_comm (one double) */
    return MOERL_OK;
}

double plan_pp_fsdp_fwd_only(const moe_config *c, int pp, int v, int stage, int fsdp, int keep, int n_mb,
                             double *held, double *peak) {
    stage_sched z;
    double o[3] = {0, 0, 0};
    const replay_args a = {.P = fsdp, .keep = keep};
    if (stage_sched_init(c, pp, v, stage, &z) != MOERL_OK || replay_extrapolated(&z, &a, n_mb, 0, o) != MOERL_OK)
        o[0] = o[1] = o[2] = 0;
    if (held) *held = o[2];
    if (peak) *peak = o[1];
    return o[0];
}

/* Activation bytes (fp32 arena) of the stage's slots: pp_slots_needed's count per chunk (m micro-batches; 0:
 * one slot per chunk, a forward-only pass) × the chunk's arena (plan.c stage_acts). */
static int slot_acts(const moe_config *c, const stage_sched *z, int m, int64_t N, int recompute, double *bytes) {
    int need[PP_MAX_CHUNKS];
    if (pp_slots_needed(z->pp, z->stage, z->v, m, need) != MOERL_OK) return moerl_error_prefix("plan: ");
    *bytes = 0;
    for (int k = 0; k < z->v; k++) *bytes += need[k] * plan_acts_bytes(c, N, z->lo[k], z->hi[k], recompute);
    return MOERL_OK;
}

int plan_pp_fsdp_stage(const moe_config *c, const plan_input *in, int stage, plan_result *o) {
    if (plan_compute(c, in, o) != MOERL_OK) return MOERL_ERR;
    if (in->pp <= 1 || o->fsdp <= 1 || in->tp > 1)
        return moerl_errorf("plan_pp_fsdp_stage: not a pipeline × FSDP layout (pp %d, fsdp %d)", in->pp, o->fsdp);
    if (stage < 0 || stage >= in->pp)
        return moerl_errorf("plan_pp_fsdp_stage: stage %d of actor.pipeline_parallel_size %d", stage, in->pp);
    const int v = o->vpp, fsdp = o->fsdp, mb = o->micro_batches, keep = in->fsdp_keep_gathered;
    stage_sched z;
    if (stage_sched_init(c, in->pp, v, stage, &z) != MOERL_OK) return MOERL_ERR;
    const double db = in->dtype_bytes, S = plan_pp_fsdp_shard(c, in->pp, v, stage, fsdp);
    const int64_t N = in->micro_tokens; /* Ulysses is refused with the pipeline */
    const int rc = in->recompute ? in->recompute : MODEL_RECOMPUTE_FULL;
    double a0 = 0, a1 = 0, aref = 0;
    if (slot_acts(c, &z, mb, N, 0, &a0) != MOERL_OK || slot_acts(c, &z, mb, N, rc, &a1) != MOERL_OK ||
        slot_acts(c, &z, 0, N, 0, &aref) != MOERL_OK)
        return MOERL_ERR;
    o->fullest_stage = stage;
    o->stage_layers = 0;
    for (int k = 0; k < v; k++) o->stage_layers += z.hi[k] - z.lo[k];
    o->weights = o->grads = S * db;
    o->moments = S * 8;
    o->master = in->dtype_bytes == 2 ? S * 4 : 0;
    o->acts = a0 * db / 4;
    o->acts_recompute = a1 * db / 4;
    plan_pp_fsdp_peak(c, in, v, mb, stage, fsdp, &o->gathered, &o->gathered_low);
    o->gathered *= db;
    o->gathered_low *= db;
    o->ref_weights = o->ref_acts = o->ref_held = o->ref_gathered = 0;
    if (in->ref_model) {
        const int dp = in->n_trainer / in->pp;
        const double n_lp = ceil((double)in->logprob_tokens / dp / (double)in->micro_tokens);
        const int n_mb_lp = MOERL_MAX(1, (int)MOERL_MIN(n_lp, (double)INT32_MAX));
        double held = 0, peak = 0;
        if (in->logprob_passes > 0) plan_pp_fsdp_fwd_only(c, in->pp, v, stage, fsdp, keep, n_mb_lp, &held, NULL);
        plan_pp_fsdp_fwd_only(c, in->pp, v, stage, fsdp, 0, n_mb_lp, NULL, &peak);
        o->ref_weights = S * sizeof(float);
        o->ref_acts = aref * db / 4;
        o->ref_held = held * db;
        o->ref_gathered = peak * sizeof(float);
    }
    const double live = MOERL_MAX(o->gathered, in->ref_model ? o->ref_acts + o->ref_held + o->ref_gathered : 0);
    o->total = o->weights + o->grads + o->master + o->moments + o->ref_weights + live + o->acts;
    o->total_recompute = o->total - o->acts + o->acts_recompute;
    return MOERL_OK;
}
