/* moerl plan: memory and traffic formulas. See plan.h. */
#include "plan/plan.h"
#include "plan/plan_pp_fsdp.h"
#include "plan/plan_replay.h"

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "model/perf.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "plan/plan_tp_pp.h"
#include "parallel/tp.h"
#include "parallel/tp_ep.h"
#include "rl/rl.h"
#include "train/train.h"

/* ------------------------------------------------------------------ activations */

/* One buffer of forward.c's arena: every carve starts 64-byte aligned and takes its size rounded
 * up to 64 bytes (carve()), so the arena is the sum of the rounded sizes. */
static double r64(double elems) {
    const uint64_t b = (uint64_t)elems * 4u; /* floats and ints are 4 bytes */
    return (double)((b + 63u) & ~(uint64_t)63u);
}

/* Rows of the residual stream's and the norms' per-row buffers at N tokens (forward.c sp_layout_rows): under
 * Megatron SP (c->exec.tp_sp on a TP slice) a TP rank's ⌈N/tp⌉, else N. */
static double sp_acts_rows(const moe_config *c, double N) {
    return c->exec.tp_sp && c->exec.tp_size > 1 ? ceil(N / c->exec.tp_size) : N;
}

/* Bytes layout() carves for decoder layer l at N tokens, split as forward.c's layer_carve does under
 * activation recompute rc (MODEL_RECOMPUTE_*): *kept stays for the whole pass, *shared lives in the one
 * scratch every layer's recomputed buffers alias (all of it kept without recompute). Each buffer's
 * class: 0 always kept (resid_in, topk_ids, tokens_per_expert), 1 kept by selective (the attention
 * block), 2 recomputed (post-attention norm, the MLP/MoE internals). */
static void layer_bytes(const moe_config *c, double N, int l, int rc, double *kept, double *shared) {
    const double H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim,
                 E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
                 Id = c->intermediate_size;
    const double M = N * (E > 0 ? K : 0), Ns = sp_acts_rows(c, N); /* Ns: resid_in, ln1/ln2_rstd, resid_mid */
    double b[3] = {0, 0, 0};
    b[0] = r64(Ns * H);
    b[1] = r64(N * H) + r64(Ns) + r64(N * nh * hd) + r64(N * nkv * hd) + r64(N * nh) + r64(N * nkv) +
           r64(N * nh * hd) + r64(N * nkv * hd) + r64(N * nkv * hd) + r64(N * nh * hd) + r64(N * nh) + r64(Ns * H);
    b[2] = r64(N * H) + r64(Ns);
    if (moe_config_layer_is_moe(c, l)) {
        b[0] += r64(N * K) + r64(E);
        b[2] += r64(N * E) + r64(N * E) + r64(N * K) + r64(N * K) + r64(M) + r64(M) + r64(E + 1) + r64(M * H) +
                r64(M * 2 * I) + r64(M * I) + r64(M * H);
        if (c->exec.per_expert_weights) b[2] += r64(E * 2 * I * H) + r64(E * H * I);
    } else {
        b[2] += r64(N * 2 * Id) + r64(N * Id);
    }
    *kept = b[0] + (rc == MODEL_RECOMPUTE_FULL ? 0 : b[1]) + (rc ? 0 : b[2]);
    *shared = b[0] + b[1] + b[2] - *kept;
}

double plan_acts_bytes(const moe_config *c, int64_t max_tokens, int l0, int l1, int recompute) {
    const double N = (double)max_tokens, H = c->hidden_size, nh = c->num_attention_heads,
                 nkv = c->num_key_value_heads, hd = c->head_dim, E = c->num_experts, K = c->num_experts_per_tok,
                 I = c->moe_intermediate_size, Id = c->intermediate_size, V = c->vocab_size;
    const double M = N * (E > 0 ? K : 0);
    const int mp = c->max_position_embeddings > 32768 ? 32768 : c->max_position_embeddings;
    const double rope = (double)(max_tokens > mp ? max_tokens : mp);
    double b = r64(N + 1) + r64(N) + r64(N) + 2 * r64(rope * hd / 2);
    if (c->exec.separate_permute) b += r64(M * H);
    double gu_max = 0, act_max = 0, kept = 0, scratch = 0;
    for (int l = l0; l < l1; l++) {
        double k, sh;
        layer_bytes(c, N, l, recompute, &k, &sh);
        kept += k;
        scratch = MOERL_MAX(scratch, sh); /* recompute: one layer's recomputed buffers live at a time */
        if (moe_config_layer_is_moe(c, l)) {
            gu_max = MOERL_MAX(gu_max, M * 2 * I);
            act_max = MOERL_MAX(act_max, M * I);
        } else {
            gu_max = MOERL_MAX(gu_max, N * 2 * Id);
            act_max = MOERL_MAX(act_max, N * Id);
        }
    }
    b += kept + scratch;
    /* the logits and their gradient only where the head is (layout(): a range ending at the last layer) */
    const double logits = l1 == c->num_hidden_layers ? r64(N * V) : 0;
    const double Ns = sp_acts_rows(c, N); /* resid_out, lnf_rstd */
    b += r64(Ns * H) + r64(N * H) + r64(Ns) + logits + r64(N) + r64(N) + r64(N) + 2 * r64(E > 0 ? E : 1);
    b += r64(E > 0 ? N * K : 1); /* route_native: routing replay's native top-k, the recompute's router scratch */
    b += 3 * r64(N * H) + r64(N * nh * hd) + 2 * r64(N * nkv * hd) + r64(N * nh * hd) + logits + 2 * r64(M * H) +
         r64(gu_max) + r64(act_max) + r64(N * K + 1) + 2 * r64(N * E + 1);
    if (c->exec.per_expert_weights && E > 0) b += r64(E * 2 * I * H) + r64(E * H * I);
    return b;
}

/* ------------------------------------------------------------------ parameters */

static int64_t pad16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* Padded floats of decoder layer l, split into non-expert and expert; HF count into *hf. */
static void layer_params(const moe_config *c, int l, int64_t *dense, int64_t *expert, int64_t *hf) {
    const int64_t H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim,
                  E = c->num_experts, I = c->moe_intermediate_size, Id = c->intermediate_size;
    const int64_t t[8] = {H, nh * hd * H, nkv * hd * H, nkv * hd * H, H * nh * hd, hd, hd, H};
    *dense = *expert = 0;
    for (int i = 0; i < 8; i++) {
        *dense += pad16(t[i]);
        *hf += t[i];
    }
    if (moe_config_layer_is_moe(c, l)) {
        *dense += pad16(E * H);
        *expert += pad16(E * 2 * I * H) + pad16(E * H * I);
        *hf += E * H + 3 * E * I * H;
    } else {
        *dense += pad16(2 * Id * H) + pad16(H * Id);
        *hf += 3 * Id * H;
    }
}

void plan_param_counts(const moe_config *c, int64_t *total, int64_t *dense, int64_t *expert, int64_t *hf) {
    const int64_t V = c->vocab_size, H = c->hidden_size;
    int64_t d = pad16(V * H) + pad16(H), e = 0, h = V * H + H;
    if (!c->tie_word_embeddings) {
        d += pad16(V * H);
        h += V * H;
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int64_t ld, le;
        layer_params(c, l, &ld, &le, &h);
        d += ld;
        e += le;
    }
    *total = d + e;
    *dense = d;
    *expert = e;
    *hf = h;
}

/* ------------------------------------------------------------------ pipeline memory model */

int plan_pp_inflight(int pp, int stage) { return pp > 1 ? pp - stage : 1; }

int plan_pp_stage_params(const moe_config *c, int pp, plan_pp_params layout, int stage, double *dense, double *expert,
                         int *l0, int *l1) {
    const int L = c->num_hidden_layers;
    if (pp < 1 || pp > L || stage < 0 || stage >= pp)
        return moerl_errorf("plan: pipeline stage %d of actor.pipeline_parallel_size %d for %d layer%s", stage, pp, L,
                            moerl_plural(L));
    int bounds[MOERL_MAX_LAYERS + 1];
    if (pp == 1) {
        bounds[0] = 0;
        bounds[1] = L;
    } else if (pp_partition(c, pp, MOERL_MAX(1, MOERL_MIN(c->max_position_embeddings, 4096)), bounds, NULL) != MOERL_OK) {
        return MOERL_ERR;
    }
    *l0 = bounds[stage];
    *l1 = bounds[stage + 1];
    if (layout == PLAN_PP_REPLICATED || pp == 1) {
        int64_t tot, d, e, hf;
        plan_param_counts(c, &tot, &d, &e, &hf);
        *dense = (double)d;
        *expert = (double)e;
        return MOERL_OK;
    }
    const int64_t V = c->vocab_size, H = c->hidden_size;
    int64_t d = 0, e = 0, hf = 0;
    if (stage == 0) d += pad16(V * H);
    if (stage == pp - 1) d += pad16(H) + (c->tie_word_embeddings ? 0 : pad16(V * H));
    for (int l = *l0; l < *l1; l++) {
        int64_t ld, le;
        layer_params(c, l, &ld, &le, &hf);
        d += ld;
        e += le;
    }
    *dense = (double)d;
    *expert = (double)e;
    return MOERL_OK;
}

double plan_pp_tied_copy(const moe_config *c, int pp, plan_pp_params layout, int stage) {
    if (pp <= 1 || layout != PLAN_PP_STAGE_LOCAL || !c->tie_word_embeddings || stage != pp - 1) return 0;
    return (double)pad16((int64_t)c->vocab_size * c->hidden_size);
}

int plan_pp_chunk_params(const moe_config *c, int pp, int v, plan_pp_params layout, int stage, int chunk,
                         double *dense, double *expert, int *l0, int *l1) {
    if (v < 1 || chunk < 0 || chunk >= v || stage < 0 || stage >= pp)
        return moerl_errorf("plan: chunk %d of actor.virtual_pipeline_parallel_size %d, stage %d of %d", chunk, v,
                            stage, pp);
    if (v > 1 && (int64_t)pp * v > c->num_hidden_layers)
        return moerl_errorf("plan: actor.virtual_pipeline_parallel_size %d × actor.pipeline_parallel_size %d model "
                            "chunks exceed the model's %d layer%s", v, pp, c->num_hidden_layers,
                            moerl_plural(c->num_hidden_layers));
    /* the cut into pp·v virtual stages is a pp·v-stage cut: the embedding on the first, the head on the last */
    return plan_pp_stage_params(c, pp * v, layout, chunk * pp + stage, dense, expert, l0, l1);
}

/* Stage `stage`'s parameters summed over its v chunks (v = 1: plan_pp_stage_params; a replicated
 * pipeline holds the whole model once), its decoder layers in *layers and chunk 0's range in l0, l1. */
static int stage_params_v(const moe_config *c, int pp, int v, plan_pp_params layout, int stage, double *dense,
                          double *expert, int *layers, int *l0, int *l1) {
    if (v <= 1 || layout == PLAN_PP_REPLICATED) {
        if (plan_pp_stage_params(c, pp, layout, stage, dense, expert, l0, l1) != MOERL_OK) return MOERL_ERR;
        *layers = *l1 - *l0;
        if (v > 1) { /* the replicated state holds everything; the layers it computes are its chunks' */
            double d, e;
            int a = 0, b = 0;
            *layers = 0;
            for (int k = 0; k < v; k++) {
                if (plan_pp_chunk_params(c, pp, v, PLAN_PP_STAGE_LOCAL, stage, k, &d, &e, &a, &b) != MOERL_OK)
                    return MOERL_ERR;
                *layers += b - a;
                if (k == 0) *l0 = a, *l1 = b;
            }
        }
        return MOERL_OK;
    }
    *dense = *expert = 0;
    *layers = 0;
    for (int k = 0; k < v; k++) {
        double d, e;
        int a, b;
        if (plan_pp_chunk_params(c, pp, v, layout, stage, k, &d, &e, &a, &b) != MOERL_OK) return MOERL_ERR;
        *dense += d;
        *expert += e;
        *layers += b - a;
        if (k == 0) *l0 = a, *l1 = b;
    }
    return MOERL_OK;
}

/* Activation bytes (fp32 arena) of stage `stage` for m micro-batches of N tokens: v = 1, pp − stage
 * slots over its layers (1F1B); v > 1, Σ over chunks of pipeline.c's slots (pp_slots_needed, from
 * pp_schedule's order) × model_acts over the chunk's layers. */
static int stage_acts(const moe_config *c, int pp, int v, int stage, int m, int64_t N, int recompute, double *bytes) {
    int need[PP_MAX_CHUNKS];
    if (pp_slots_needed(pp, stage, v, m, need) != MOERL_OK) return MOERL_ERR;
    *bytes = 0;
    for (int k = 0; k < v; k++) {
        double d, e;
        int a, b;
        if (plan_pp_chunk_params(c, pp, v, PLAN_PP_STAGE_LOCAL, stage, k, &d, &e, &a, &b) != MOERL_OK) return MOERL_ERR;
        *bytes += need[k] * plan_acts_bytes(c, N, a, b, recompute);
    }
    return MOERL_OK;
}

/* ------------------------------------------------------------------ FSDP schedule replay */

/* The tensors of fsdp.c's unit u in model.c's table order (0 the embedding, l+1 decoder layer l, L+1
 * the final norm and the untied head) on a rank holding 1/ep of the experts: numel[] unpadded and
 * whether each is an expert tensor (TF_EXPERT); returns their count (≤ 16). */
static int unit_tensors(const moe_config *c, int ep, int u, int64_t *numel, char *is_expert) {
    const int L = c->num_hidden_layers;
    const int64_t H = c->hidden_size, V = c->vocab_size, hd = c->head_dim, nh = c->num_attention_heads,
                  nkv = c->num_key_value_heads, E = c->num_experts, I = c->moe_intermediate_size,
                  Id = c->intermediate_size;
    int k = 0;
#define TN(n, x) (numel[k] = (n), is_expert[k++] = (x))
    if (u == 0) {
        TN(V * H, 0);
    } else if (u == L + 1) {
        TN(H, 0);
        if (!c->tie_word_embeddings) TN(V * H, 0);
    } else {
        TN(H, 0), TN(nh * hd * H, 0), TN(nkv * hd * H, 0), TN(nkv * hd * H, 0), TN(H * nh * hd, 0), TN(hd, 0),
            TN(hd, 0), TN(H, 0);
        if (moe_config_layer_is_moe(c, u - 1)) {
            TN(E * H, 0), TN(E / ep * 2 * I * H, 1), TN(E / ep * H * I, 1);
        } else {
            TN(2 * Id * H, 0), TN(H * Id, 0);
        }
    }
#undef TN
    return k;
}

/* fsdp.c's units on a rank holding 1/ep of the experts: n[L+2] padded floats of each unit. */
static void fsdp_units(const moe_config *c, int ep, double *n) {
    for (int u = 0; u < c->num_hidden_layers + 2; u++) {
        int64_t numel[16];
        char x[16];
        const int k = unit_tensors(c, ep, u, numel, x);
        n[u] = 0;
        for (int i = 0; i < k; i++) n[u] += (double)pad16(numel[i]);
    }
}

static double fsdp_shard(double n, int P) { return (double)(((int64_t)((n + P - 1) / P) + 15) & ~(int64_t)15); }

/* Floats of replicated and of expert tensors in the piece of unit u that FSDP rank r of P owns
 * (fsdp.c's ranges: the span [r·s_u, (r+1)·s_u) of the unit against each tensor's unpadded extent):
 * what EP × FSDP sums over replica_comm and over ep_replica_comm. */
static void unit_owned(const moe_config *c, int ep, int u, int P, int r, double *dense, double *expert) {
    int64_t numel[16];
    char x[16];
    const int k = unit_tensors(c, ep, u, numel, x);
    double n = 0;
    for (int i = 0; i < k; i++) n += (double)pad16(numel[i]);
    const double s = fsdp_shard(n, P), own0 = r * s, own1 = own0 + s;
    double off = 0;
    for (int i = 0; i < k; i++) {
        const double a = MOERL_MAX(own0, off), b = MOERL_MIN(own1, off + (double)numel[i]);
        if (b > a) *(x[i] ? expert : dense) += b - a;
        off += (double)pad16(numel[i]);
    }
}

/* The parameter units a region reads (fsdp.c region_params). */
static int fsdp_region(int L, int tied, int bwd, int l, int *out) {
    int k = 0;
    if (!bwd) {
        if (l < 0) {
            out[k++] = 0;
            out[k++] = 1;
        } else if (l < L - 1) {
            out[k++] = l + 1;
            out[k++] = l + 2;
        } else {
            out[k++] = L;
            out[k++] = L + 1;
            if (tied) out[k++] = 0;
        }
    } else if (l >= L) {
        out[k++] = L + 1;
        out[k++] = L;
        if (tied) out[k++] = 0;
    } else {
        out[k++] = l + 1;
        if (l >= 1) out[k++] = l;
    }
    return k;
}

/* The replay of fsdp.c's schedule over one step: which units are gathered when (the all-gather
 * volume) and the accounting of peak_gathered_bytes: a gather in flight holds a bounce buffer of P·s_u
 * floats when P·s_u ≠ n_u (else the n_u layout floats), a gathered unit n_u, waiting copies the
 * bounce into the layout (both live for a moment); a gradient unit being written n_u; a finished one
 * is reduce-scattered from a bounce of P·s_u (the layout region given back) or in place, into a
 * receive buffer of s_u, and FSDP_RS_IN_FLIGHT (2) stay in flight. The replay assumes no reduce-
 * scatter completes early (fsdp.c polls between layers, so on a quiet machine they mostly do not):
 * the peak is then the schedule's upper bound; with `eager` every reduce-scatter completes the
 * moment it starts, the lower bound (what fsdp.c reaches when its polls always find them done). */
#define PLAN_RS_IN_FLIGHT 2
typedef struct {
    const double *n, *s;
    int L, tied, U, P;
    char *pst;          /* parameter unit: 0 absent, 1 gather in flight, 2 gathered */
    char *glive;        /* gradient unit being written */
    int rs[PLAN_RS_IN_FLIGHT + 2], n_rs; /* reduce-scatters in flight, oldest first */
    int eager;          /* every reduce-scatter completes as soon as it starts (the lower bound) */
    int keep;           /* actor.fsdp_config.reshard_after_forward=false (fsdp.h): nothing released, no
                           reduce-scatter until fsdp_finish_grads */
    int hold;           /* keep, until the step's fsdp_finish_grads runs */
    double gathered;    /* Σ s_u over the all-gathers started (with `skipped`: the passes fast-forwarded, kept
                           apart so that the replayed passes add exact small integers) */
    double skipped;
    double cur, peak;   /* floats as fsdp.c accounts them */
} fsdp_replay;

static int in_list(const int *a, int n, int k) {
    for (int i = 0; i < n; i++)
        if (a[i] == k) return 1;
    return 0;
}

static int bounced(const fsdp_replay *r, int u) { return (double)r->P * r->s[u] != r->n[u]; }
static void acc(fsdp_replay *r, double f) {
    r->cur += f;
    r->peak = MOERL_MAX(r->peak, r->cur);
}

static void g_start(fsdp_replay *r, int u) {
    if (r->pst[u] || r->n[u] <= 0) return;
    r->pst[u] = 1;
    r->gathered += r->s[u];
    acc(r, bounced(r, u) ? r->P * r->s[u] : r->n[u]);
}

static void g_wait(fsdp_replay *r, int u) {
    if (r->pst[u] != 1) return;
    r->pst[u] = 2;
    if (bounced(r, u)) {
        acc(r, r->n[u]);
        acc(r, -r->P * r->s[u]);
    }
}

static void g_release(fsdp_replay *r, int u) {
    if (!r->pst[u]) return;
    g_wait(r, u);
    acc(r, -r->n[u]);
    r->pst[u] = 0;
}

static void rs_complete(fsdp_replay *r, int u) {
    int j = 0, found = 0;
    for (int i = 0; i < r->n_rs; i++)
        if (r->rs[i] != u) r->rs[j++] = r->rs[i];
        else found = 1;
    r->n_rs = j;
    if (!found) return;
    acc(r, -r->s[u]);
    acc(r, bounced(r, u) ? -r->P * r->s[u] : -r->n[u]);
}

static void grad_touch_r(fsdp_replay *r, int u) {
    if (r->glive[u] || r->n[u] <= 0) return;
    rs_complete(r, u);
    acc(r, r->n[u]);
    r->glive[u] = 1;
}

static void replay_ready(fsdp_replay *r, int u) {
    if (!r->glive[u] || r->hold) return; /* held: the gradient accumulates until the mini-batch's end */
    r->glive[u] = 0;
    if (bounced(r, u)) {
        acc(r, r->P * r->s[u]);
        acc(r, -r->n[u]);
    }
    acc(r, r->s[u]);
    r->rs[r->n_rs++] = u;
    while (r->n_rs > (r->eager ? 0 : PLAN_RS_IN_FLIGHT)) rs_complete(r, r->rs[0]);
}

static void replay_event(fsdp_replay *r, int bwd, int l) {
    int need[3], next[3], nn = fsdp_region(r->L, r->tied, bwd, l, need), nx = 0;
    if (!bwd && l + 1 <= r->L - 1) nx = fsdp_region(r->L, r->tied, 0, l + 1, next);
    if (bwd && l - 1 >= 0) nx = fsdp_region(r->L, r->tied, 1, l >= r->L ? r->L - 1 : l - 1, next);
    for (int i = 0; i < nn; i++) g_start(r, need[i]);
    for (int i = 0; i < nx; i++) g_start(r, next[i]); /* prefetch */
    for (int u = 0; u < r->U && !r->hold; u++)
        if (!in_list(need, nn, u) && !in_list(next, nx, u)) g_release(r, u);
    if (bwd) { /* region_grads: the units whose gradients this region writes */
        const int g[3] = {l >= r->L ? r->L + 1 : l + 1, l >= r->L ? r->L : (l >= 1 ? l : 0), 0};
        const int ng = l >= r->L && r->tied ? 3 : 2;
        for (int i = 0; i < ng; i++) grad_touch_r(r, g[i]);
    }
    for (int i = 0; i < nn; i++) g_wait(r, need[i]);
}

/* One pass of the schedule: forward over every layer, then (train) the backward and its gradients. */
static void replay_pass(fsdp_replay *r, int train) {
    for (int l = -1; l < r->L; l++) replay_event(r, 0, l);
    if (!train) return;
    replay_event(r, 1, r->L);
    replay_ready(r, r->L + 1);
    for (int l = r->L - 1; l >= 0; l--) {
        replay_event(r, 1, l);
        replay_ready(r, l + 1);
    }
    replay_ready(r, 0);
}

/* The replay's state between passes: units gathered, gradients live, reduce-scatters in flight. */
typedef struct {
    char pst[MOERL_MAX_LAYERS + 2], glive[MOERL_MAX_LAYERS + 2];
    int rs[PLAN_RS_IN_FLIGHT + 2], n_rs;
    double cur;
} replay_snap;

static void snap_take(const fsdp_replay *r, replay_snap *s) {
    memset(s, 0, sizeof *s);
    memcpy(s->pst, r->pst, (size_t)r->U);
    memcpy(s->glive, r->glive, (size_t)r->U);
    memcpy(s->rs, r->rs, sizeof r->rs);
    s->n_rs = r->n_rs;
    s->cur = r->cur;
}

/* n passes of one kind. The schedule is deterministic, so once a pass ends in the state it started
 * from, every later pass repeats it exactly (the same gathers, the same peak): the rest is added as
 * that pass's gathers × the passes left, so a step of 10^9 micro-batches replays in a few passes. */
static void replay_passes(fsdp_replay *r, double n, int train) {
    replay_snap prev, now;
    snap_take(r, &prev);
    for (double p = 0; p < n; p++) {
        const double g0 = r->gathered;
        replay_pass(r, train);
        snap_take(r, &now);
        if (!memcmp(&now, &prev, sizeof now)) {
            r->skipped += (n - p - 1) * (r->gathered - g0);
            return;
        }
        memcpy(&prev, &now, sizeof prev);
    }
}

/* One step's passes from a cold start (the optimizer step releases every unit): fwd_only forward
 * passes, then train forward+backward passes, then fsdp_finish_grads. */
static void replay_step(fsdp_replay *r, double fwd_only, double train) {
    r->hold = r->keep;
    replay_passes(r, fwd_only, 0);
    replay_passes(r, train, 1);
    if (r->hold) { /* fsdp_finish_grads: each unit's accumulated gradient reduce-scattered, one at a time */
        r->hold = 0;
        for (int u = 0; u < r->U; u++) {
            replay_ready(r, u);
            rs_complete(r, u);
        }
    }
    while (r->n_rs > 0) rs_complete(r, r->rs[0]);
    r->gathered += r->skipped;
    r->skipped = 0;
}

/* One rank's replay from a cold start (units of the rank's expert slice under EP, shards over P):
 * fwd_only forward passes then train training passes; the all-gathered floats, the peak and the
 * floats still held at the end (the units the last region keeps gathered). */
static void replay_rank(const moe_config *c, int ep, int P, int eager, int keep, double fwd_only, double train,
                        double *gathered, double *peak, double *held) {
    const int L = c->num_hidden_layers;
    double n[MOERL_MAX_LAYERS + 2], sh[MOERL_MAX_LAYERS + 2];
    char pst[MOERL_MAX_LAYERS + 2] = {0}, glive[MOERL_MAX_LAYERS + 2] = {0};
    fsdp_units(c, ep, n);
    for (int u = 0; u < L + 2; u++) sh[u] = n[u] > 0 ? fsdp_shard(n[u], P) : 0;
    fsdp_replay r = {.n = n, .s = sh, .L = L, .tied = c->tie_word_embeddings, .U = L + 2, .P = P, .pst = pst,
                     .glive = glive, .eager = eager, .keep = keep};
    replay_step(&r, fwd_only, train);
    if (gathered) *gathered = r.gathered;
    if (peak) *peak = r.peak;
    if (held) *held = r.cur;
}

/* plan_replay.h: the replay driven by another schedule (the pipeline's stages, plan_pp_fsdp.c). */
struct plan_replay {
    fsdp_replay r;
    double n[MOERL_MAX_LAYERS + 2], s[MOERL_MAX_LAYERS + 2];
    char pst[MOERL_MAX_LAYERS + 2], glive[MOERL_MAX_LAYERS + 2];
};

plan_replay *plan_replay_new(const moe_config *c, const unsigned char *unit_on, int P, int eager, int keep) {
    plan_replay *p = xcalloc(1, sizeof *p);
    const int L = c->num_hidden_layers;
    fsdp_units(c, 1, p->n);
    for (int u = 0; u < L + 2; u++) {
        if (unit_on && !unit_on[u]) p->n[u] = 0;
        p->s[u] = p->n[u] > 0 ? fsdp_shard(p->n[u], P) : 0;
    }
    p->r = (fsdp_replay){.n = p->n, .s = p->s, .L = L, .tied = c->tie_word_embeddings, .U = L + 2, .P = P,
                         .pst = p->pst, .glive = p->glive, .eager = eager, .keep = keep};
    return p;
}
void plan_replay_free(plan_replay *p) { free(p); }
void plan_replay_event(plan_replay *p, int bwd, int l) { replay_event(&p->r, bwd, l); }
void plan_replay_ready(plan_replay *p, int u) { replay_ready(&p->r, u); }
void plan_replay_begin(plan_replay *p) { p->r.hold = p->r.keep; }
void plan_replay_finish(plan_replay *p) {
    fsdp_replay *r = &p->r;
    if (r->hold) { /* as replay_step's fsdp_finish_grads */
        r->hold = 0;
        for (int u = 0; u < r->U; u++) {
            replay_ready(r, u);
            rs_complete(r, u);
        }
    }
    while (r->n_rs > 0) rs_complete(r, r->rs[0]);
}
void plan_replay_stats(const plan_replay *p, double *gathered, double *peak, double *cur, double *shard) {
    double S = 0;
    for (int u = 0; u < p->r.U; u++) S += p->s[u];
    if (gathered) *gathered = p->r.gathered;
    if (peak) *peak = p->r.peak;
    if (cur) *cur = p->r.cur;
    if (shard) *shard = S;
}

/* ------------------------------------------------------------------ the plan */

typedef struct {
    int S, fsdp, mb, dispatcher, cap;
    int v; /* chunks per pipeline stage (actor.virtual_pipeline_parallel_size, ≥ 1) */
    int64_t N;
    double mb_tokens; /* tokens a pipeline micro-batch carries (what its p2p sends): N, or fewer when the
                         pipeline re-packs the update into more micro-batches (pp_plan_microbatches) */
} plan_ctx;

/* The layout and size checks of plan_check (x->S, x->fsdp set): every refusal names the key. */
static int check_layout(const moe_config *c, const plan_input *in, plan_ctx *x) {
    const int L = c->num_hidden_layers;
    if (in->n_trainer <= 0 || in->ep <= 0 || in->sp <= 0 || in->pp <= 0)
        return moerl_errorf("plan: trainer.n_ranks (%d), actor.expert_parallel_size (%d), "
                            "actor.ulysses_sequence_parallel_size (%d) and actor.pipeline_parallel_size (%d) must be "
                            "positive", in->n_trainer, in->ep, in->sp, in->pp);
    if (in->n_trainer % (in->pp * in->sp))
        return moerl_errorf("plan: trainer.n_ranks %d is not divisible by actor.pipeline_parallel_size × "
                            "actor.ulysses_sequence_parallel_size = %d × %d", in->n_trainer, in->pp, in->sp);
    if (in->pp > L)
        return moerl_errorf("plan: actor.pipeline_parallel_size %d exceeds the model's %d layer%s", in->pp, L,
                            moerl_plural(L));
    x->S = in->n_trainer / in->pp; /* ranks of one pipeline stage */
    x->fsdp = in->fsdp <= 0 ? x->S : in->fsdp;
    if (x->S % x->fsdp)
        return moerl_errorf("plan: actor.fsdp_config.fsdp_size %d does not divide the %d rank%s of a pipeline stage "
                            "(trainer.n_ranks / actor.pipeline_parallel_size)", x->fsdp, x->S, moerl_plural(x->S));
    if (in->fsdp_keep_gathered && x->fsdp <= 1)
        return moerl_errorf("plan: actor.fsdp_config.reshard_after_forward=false keeps FSDP's gathered units: it needs "
                            "FSDP on (actor.fsdp_config.fsdp_size > 1), got fsdp_size=%d", x->fsdp);
    const par_config pc = {.fsdp_size = x->fsdp, .expert_parallel_size = in->ep,
                           .ulysses_sequence_parallel_size = in->sp, .pipeline_parallel_size = in->pp,
                           .virtual_pipeline_parallel_size = in->vpp};
    if (par_check_pp_alone(&pc, in->n_trainer) != MOERL_OK) return moerl_error_prefix("plan: "); /* moerl's rule */
    if (plan_pp_fsdp_check(c, in, x->fsdp) != MOERL_OK) return MOERL_ERR; /* pipeline × FSDP: the run's refusals */
    if (x->S % in->ep)
        return moerl_errorf("plan: actor.expert_parallel_size %d does not divide the %d rank%s of a pipeline stage",
                            in->ep, x->S, moerl_plural(x->S));
    if (in->ep > 1 && x->fsdp > 1 && x->S % (in->ep * x->fsdp)) /* parallel.c's rule (grid.h's EP × FSDP blocks) */
        return moerl_errorf("plan: actor.expert_parallel_size %d × actor.fsdp_config.fsdp_size %d must divide the %d "
                            "ranks of a pipeline stage (FSDP shards each expert slice over ranks holding the same "
                            "experts)", in->ep, x->fsdp, x->S);
    if (c->num_experts > 0 && c->num_experts % in->ep)
        return moerl_errorf("plan: actor.expert_parallel_size %d does not divide the model's %d experts", in->ep,
                            c->num_experts);
    if (in->dtype_bytes != 2 && in->dtype_bytes != 4)
        return moerl_errorf("plan: dtype must be fp32 or bf16 (got %d bytes)", in->dtype_bytes);
    if (in->kv_dtype_bytes != 2 && in->kv_dtype_bytes != 4)
        return moerl_errorf("plan: rollout dtype must be fp32 or bf16 (got %d bytes)", in->kv_dtype_bytes);
    if (in->micro_tokens <= 0 || in->updates_per_step <= 0)
        return moerl_errorf("plan: actor.ppo_max_token_len_per_gpu (%lld) and the updates per step (%d) must be "
                            "positive", (long long)in->micro_tokens, in->updates_per_step);
    if (in->micro_tokens < in->sp)
        return moerl_errorf("plan: actor.ppo_max_token_len_per_gpu %lld is below actor.ulysses_sequence_parallel_size %d",
                            (long long)in->micro_tokens, in->sp);
    if (in->fwd_only_passes < 0)
        return moerl_errorf("plan: forward-only passes per micro-batch %d must be ≥ 0", in->fwd_only_passes);
    if (in->n_rollout < 0 || in->rollout_tp <= 0 || (in->n_rollout > 0 && in->n_rollout % in->rollout_tp))
        return moerl_errorf("plan: rollout.n_ranks %d must be a multiple of rollout.tensor_model_parallel_size %d",
                            in->n_rollout, in->rollout_tp);
    return MOERL_OK;
}

/* The micro-batch count a pipeline makes itself (pipeline.c's dynamic rule: 4..16 micro-batches of
 * ≥ 64 tokens, a multiple of pp when interleaved) for an update's sequences at full length, over dp
 * pipelines: x->mb and x->mb_tokens when the count is known; unchanged otherwise. */
static int pp_dynamic_count(const plan_input *in, int dp, plan_ctx *x) {
    double n_seq = floor((double)in->step_tokens / in->updates_per_step / dp / in->max_model_len);
    if (in->group_size > 0 && in->groups_per_update > 0) {
        /* whole groups per pipeline, as moerl rl splits and checks them (rl_check_pipeline_groups):
         * refused as rl refuses it; the count is that of the fullest pipeline at full length */
        const rl_pp_sizes z = {.groups = in->groups_per_update,
                               .group_size = in->group_size,
                               .pipelines = dp,
                               .pp = in->pp,
                               .vpp = in->vpp,
                               .min_seq_tokens = in->min_seq_len > 0 ? in->min_seq_len : in->max_model_len,
                               .seq_tokens = in->max_model_len,
                               .max_tokens = (int)MOERL_MIN(in->micro_tokens, (int64_t)INT32_MAX),
                               .seq_tokens_src = in->seq_len_src ? in->seq_len_src : "plan's sequence length"};
        if (rl_check_pipeline_groups(&z) != MOERL_OK) return moerl_error_prefix("plan: ");
        int k_lo, k_hi;
        rl_shard_groups(in->groups_per_update, dp, in->max_model_len, in->max_model_len, &k_lo, &k_hi);
        n_seq = (double)k_hi * in->group_size;
    }
    if (n_seq >= 1 && n_seq <= (double)(1 << 22)) {
        const int n = (int)n_seq;
        train_seq *seqs = xcalloc((size_t)n, sizeof *seqs);
        int *mbs = xmalloc((size_t)(n + 1) * sizeof(int));
        for (int i = 0; i < n; i++) seqs[i].len = in->max_model_len;
        pp_options o = pp_options_default();
        o.virtual_stages = in->vpp > 1 ? in->vpp : 1;
        o.quiet = 1;
        const int m = pp_plan_microbatches(seqs, n, (int)MOERL_MIN(in->micro_tokens, (int64_t)INT32_MAX), in->pp,
                                           &o, mbs);
        free(seqs);
        free(mbs);
        if (m < 0) return moerl_error_prefix("plan: ");
        x->mb = m;
        x->mb_tokens = n_seq * in->max_model_len / m;
    }
    return MOERL_OK;
}

static int plan_check(const moe_config *c, const plan_input *in, plan_ctx *x) {
    const int L = c->num_hidden_layers;
    if (check_layout(c, in, x) != MOERL_OK) return MOERL_ERR;
    x->N = in->micro_tokens;
    const int dp = in->n_trainer / (in->pp * in->sp);
    x->mb = in->micro_batches;
    if (in->step_tokens < 0 || (double)in->step_tokens > PLAN_MAX_STEP_TOKENS)
        return moerl_errorf("plan: %lld tokens per step is outside 0..2^53 (%.0f)", (long long)in->step_tokens,
                            PLAN_MAX_STEP_TOKENS);
    if (x->mb <= 0) { /* micro-batches per update on a rank: the update's tokens over the data shards */
        const double upd_tokens = (double)in->step_tokens / in->updates_per_step;
        const double mb = ceil(upd_tokens / dp / (double)in->micro_tokens);
        if (mb > INT32_MAX)
            return moerl_errorf("plan: %.4g micro-batches per update on a rank (%lld tokens per step over %d updates, "
                                "%d data shards, actor.ppo_max_token_len_per_gpu %lld) exceed 2^31 − 1: lower "
                                "actor.ppo_mini_batch_size or rollout.n, or raise actor.ppo_max_token_len_per_gpu",
                                mb, (long long)in->step_tokens, in->updates_per_step, dp, (long long)in->micro_tokens);
        x->mb = mb < 1 ? 1 : (int)mb;
    }
    x->mb_tokens = (double)x->N;
    if (in->pp > 1 && in->micro_batches <= 0 && in->max_model_len > 0 && in->max_model_len <= in->micro_tokens &&
        pp_dynamic_count(in, dp, x) != MOERL_OK)
        return MOERL_ERR;
    if (in->pp > 1 && x->mb < in->pp) x->mb = in->pp; /* 1F1B needs ≥ pp micro-batches (pipeline.h's guard) */
    x->v = in->vpp > 1 ? in->vpp : 1;
    if (x->v > 1) { /* interleaved: m a multiple of pp (pipeline.h; the dynamic count rounds its target up) */
        if (in->pp < 2 || x->v > PP_MAX_CHUNKS || (int64_t)in->pp * x->v > L)
            return moerl_errorf("plan: actor.virtual_pipeline_parallel_size %d needs actor.pipeline_parallel_size ≥ 2 "
                                "(it is %d), at most %d chunks per stage and pp × v ≤ the model's %d layer%s", x->v,
                                in->pp, PP_MAX_CHUNKS, L, moerl_plural(L));
        if (x->mb % in->pp) {
            if (x->mb > INT32_MAX - in->pp)
                return moerl_errorf("plan: %d micro-batches per update do not round up to a multiple of "
                                    "actor.pipeline_parallel_size %d below 2^31", x->mb, in->pp);
            x->mb += in->pp - x->mb % in->pp;
        }
    }
    x->dispatcher = in->dispatcher;
    if (x->dispatcher == MOE_DISPATCH_AUTO)
        x->dispatcher = in->ep <= (in->alltoall_max_ep > 0 ? in->alltoall_max_ep : 16) ? MOE_DISPATCH_ALLTOALL
                                                                                          : MOE_DISPATCH_ALLTOALLV;
    const double cf = in->capacity_factor > 0 ? in->capacity_factor : 1.25;
    x->cap = 0;
    if (c->num_experts > 0) {
        const double want = ceil(cf * (double)x->N * c->num_experts_per_tok / c->num_experts);
        x->cap = (int)MOERL_MAX(1.0, MOERL_MIN(want, (double)x->N));
    }
    return MOERL_OK;
}

static int n_moe_in(const moe_config *c, int l0, int l1) {
    int n = 0;
    for (int l = l0; l < l1; l++) n += moe_config_layer_is_moe(c, l);
    return n;
}

/* The MoE layers stage `stage` computes: chunk 0's [l0, l1), and with v > 1 chunks every chunk's (interleaved
 * pipeline × EP: each chunk's MoE layers run their all-to-alls). */
static int stage_n_moe(const moe_config *c, const plan_input *in, const plan_ctx *x, int stage, int l0, int l1) {
    if (x->v <= 1) return n_moe_in(c, l0, l1);
    int n = 0;
    for (int k = 0; k < x->v; k++) {
        double d, e;
        int a, b;
        if (plan_pp_chunk_params(c, in->pp, x->v, PLAN_PP_STAGE_LOCAL, stage, k, &d, &e, &a, &b) == MOERL_OK)
            n += n_moe_in(c, a, b);
    }
    return n;
}

static int traffic(const moe_config *c, const plan_input *in, const plan_ctx *x, int stage, int sp_rank,
                   int fsdp_rank, plan_traffic *t) {
    memset(t, 0, sizeof *t);
    if (stage < 0 || stage >= in->pp || sp_rank < 0 || sp_rank >= in->sp || fsdp_rank < 0 || fsdp_rank >= x->fsdp)
        return moerl_errorf("plan: stage %d of %d, Ulysses rank %d of %d or FSDP rank %d of %d out of range", stage,
                            in->pp, sp_rank, in->sp, fsdp_rank, x->fsdp);
    const int L = c->num_hidden_layers, fo = in->fwd_only_passes, mb = x->mb, fsdp = x->fsdp, ep = in->ep;
    const double db = in->dtype_bytes, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    const double N = (double)x->N;
    double dense, expert;
    int l0, l1;
    int layers;
    if (stage_params_v(c, in->pp, x->v, in->pp_params, stage, &dense, &expert, &layers, &l0, &l1) != MOERL_OK)
        return MOERL_ERR;
    const int pp_repl = in->pp > 1 && in->pp_params == PLAN_PP_REPLICATED,
              pp_local = in->pp > 1 && in->pp_params == PLAN_PP_STAGE_LOCAL;
    /* the reducer's group: the stage's D ranks (DP, SP); every trainer with a replicated pipeline */
    const int sum_group = pp_repl ? in->n_trainer : x->S;
    if (fsdp > 1 && in->pp > 1) { /* pipeline × FSDP: the stage's units in its passes' order (plan_pp_fsdp.h) */
        if (plan_pp_fsdp_traffic(c, in, fsdp, x->v, mb, x->S, stage, t) != MOERL_OK) return MOERL_ERR;
    } else if (fsdp > 1) { /* FSDP (EP × FSDP: of the rank's expert slice), fsdp.c's schedule replayed */
        const int U = L + 2;
        double n[MOERL_MAX_LAYERS + 2], s[MOERL_MAX_LAYERS + 2], S = 0;
        char pst[MOERL_MAX_LAYERS + 2] = {0}, glive[MOERL_MAX_LAYERS + 2] = {0};
        fsdp_units(c, ep, n);
        for (int u = 0; u < U; u++) {
            s[u] = n[u] > 0 ? fsdp_shard(n[u], fsdp) : 0;
            S += s[u];
        }
        fsdp_replay r = {.n = n, .s = s, .L = L, .tied = c->tie_word_embeddings, .U = U, .P = fsdp, .pst = pst,
                         .glive = glive, .keep = in->fsdp_keep_gathered};
        replay_step(&r, (double)fo * mb, mb);
        /* + par_max_passes' one-float all-gather, which EP × FSDP runs over the stage instead */
        t->fsdp_allgather = (fsdp - 1) * (r.gathered * db + (ep > 1 ? 0.0 : 4.0));
        /* the same update right after a forward-only logprob pass, from the state that pass leaves (keep:
         * every unit gathered, so only the pass count; resharding: the last region's units, which the
         * pre-pass's first forward then need not gather again) */
        char pst2[MOERL_MAX_LAYERS + 2] = {0}, glive2[MOERL_MAX_LAYERS + 2] = {0};
        fsdp_replay w = {.n = n, .s = s, .L = L, .tied = c->tie_word_embeddings, .U = U, .P = fsdp, .pst = pst2,
                         .glive = glive2, .keep = in->fsdp_keep_gathered, .hold = in->fsdp_keep_gathered};
        replay_passes(&w, 1, 0);
        const double g0 = w.gathered;
        replay_step(&w, (double)fo * mb, mb);
        t->fsdp_allgather_warm = (fsdp - 1) * ((w.gathered - g0) * db + (ep > 1 ? 0.0 : 4.0));
        /* one reduce-scatter per unit and backward pass; held: one per unit at the mini-batch's end */
        t->fsdp_reduce_scatter = (double)(fsdp - 1) * S * db * (in->fsdp_keep_gathered ? 1 : mb);
        const int R = x->S / fsdp; /* replica_comm: the stage's ranks with this fsdp_rank */
        if (ep > 1) {              /* fp32 sums of the owned pieces by kind (fsdp.c replica_sum_kind) */
            double od = 0, oe = 0;
            for (int u = 0; u < U; u++) unit_owned(c, ep, u, fsdp, fsdp_rank, &od, &oe);
            const int Rx = R / ep; /* ep_replica_comm: same fsdp_rank and experts, other blocks */
            if (R > 1) t->replica_allreduce = 2.0 * (R - 1) / R * od * 4;
            if (Rx > 1) t->ep_replica_allreduce = 2.0 * (Rx - 1) / Rx * oe * 4;
        } else if (R > 1) {
            t->replica_allreduce = 2.0 * (R - 1) / R * S * 4; /* fp32 gradient shard */
        }
    } else if (ep > 1 && pp_local) {
        /* pipeline × EP: pp_finish_grads sums the stage's replicated tensors over its D ranks and its expert
         * slices over the D/ep ranks holding the same experts (pipeline.c expert_runs: padded tensors) */
        const int D = x->S, Dx = x->S / ep;
        if (D > 1) {
            const double f = 2.0 * (D - 1) / D, tied = plan_pp_tied_copy(c, in->pp, in->pp_params, stage);
            t->pp_grad_allreduce = f * dense * db;
            if (tied > 0) t->pp_grad_allreduce += f * tied * db;
        }
        if (Dx > 1) t->ep_grad_allreduce = 2.0 * (Dx - 1) / Dx * (expert / ep) * db;
    } else if (ep > 1) {
        int64_t tot, dn, ex, hf;
        plan_param_counts(c, &tot, &dn, &ex, &hf);
        /* the all-reduces move unpadded tensors: the replicated ones (HF count less the experts') over
         * the stage, the local experts' over the ranks holding the same experts */
        const double hf_expert = (double)n_moe_in(c, 0, L) * 3.0 * E * c->moe_intermediate_size * H;
        const double hf_dense = (double)hf - hf_expert;
        const int D = x->S, Dx = x->S / ep;
        if (D > 1) t->ep_grad_allreduce += 2.0 * (D - 1) / D * hf_dense * db;
        if (Dx > 1) t->ep_grad_allreduce += 2.0 * (Dx - 1) / Dx * hf_expert / ep * db;
    } else if (pp_local) { /* no reducer: pp_finish_grads sums the stage's range over its D ranks */
        const int D = x->S;
        if (D > 1) {
            const double f = 2.0 * (D - 1) / D;
            t->pp_grad_allreduce = f * (dense + expert) * db;
            const double tied = plan_pp_tied_copy(c, in->pp, in->pp_params, stage);
            if (tied > 0) t->pp_grad_allreduce += f * tied * db;
        }
    } else if (sum_group > 1) {
        t->reducer = (dense + expert) * db;
    }
    const int n_moe = stage_n_moe(c, in, x, stage, l0, l1);
    if (ep > 1 && n_moe > 0) {
        /* fwd: 2, bwd: 2 per layer; activation recompute (either granularity) re-runs the MoE forward's 2
         * before each layer's backward (forward.c recompute_layer; tests/test_dist_recompute.c counts them) */
        const int rf = in->recompute ? 1 : 0;
        const double El = E / ep, exch = (double)n_moe * (2.0 * (fo + 1 + rf) + 2.0) * mb;
        if (x->dispatcher == MOE_DISPATCH_ALLTOALL)
            t->ep_alltoall = exch * (ep - 1) * El * (2.0 + x->cap * H) * db;
        else
            t->ep_alltoall =
                exch * N * K * (ep - 1) / ep * H * db + (double)n_moe * (fo + 1 + rf) * mb * (ep - 1) * El * 4.0;
    }
    if (in->sp > 1) {
        const int P = in->sp, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
        const double nr = floor(N * (sp_rank + 1) / P) - floor(N * sp_rank / P);
        const double nh_l = nh / P, nkv_l = nkv >= P ? nkv / P : 1, W = nh_l + 2 * nkv_l;
        const double fwd = hd * ((P - 1) * nr * W + (N - nr) * nh_l), bwd = hd * ((P - 1) * nr * nh_l + (N - nr) * W);
        const int rf = in->recompute == MODEL_RECOMPUTE_FULL; /* full recompute re-runs the attention's forward */
        t->sp_alltoall = (l1 - l0) * ((fo + 1 + rf) * fwd + bwd) * mb * db;
    }
    if (in->pp > 1) {
        const int aux = n_moe_in(c, 0, L) > 0;
        /* chunks sending on (all but the last virtual stage) and back (all but the first) */
        const double nf = x->v - (stage == in->pp - 1), nb = x->v - (stage == 0);
        const double Np = x->mb_tokens; /* a micro-batch's tokens (fewer than N when re-packed) */
        const double per = nf * (Np * H * db + (aux ? 2 * E * 4 : 0)) + nb * (Np * H * db + (aux ? E * 4 : 0));
        t->pp_p2p = per * mb;
        if (aux && nf > 0) t->pp_p2p_fwd_only = (double)fo * mb * nf * Np * H * db;
        if (pp_local && c->tie_word_embeddings && (stage == 0 || stage == in->pp - 1))
            t->pp_p2p_emb = (double)pad16((int64_t)c->vocab_size * c->hidden_size) * db; /* one way per stage */
    }
    return MOERL_OK;
}

/* The RL trainer's forward-only logprob pass over n_mb micro-batches (plan.h plan_traffic_logprob). */
static int logprob_traffic(const moe_config *c, const plan_input *in, const plan_ctx *x, int stage, int sp_rank,
                           int fsdp_rank, int n_mb, double resp_tokens, plan_traffic *t) {
    memset(t, 0, sizeof *t);
    if (stage < 0 || stage >= in->pp || sp_rank < 0 || sp_rank >= in->sp || fsdp_rank < 0 || fsdp_rank >= x->fsdp ||
        n_mb < 0 || !(resp_tokens >= 0))
        return moerl_errorf("plan: logprob pass of stage %d of %d, Ulysses rank %d of %d, FSDP rank %d of %d, %d "
                            "micro-batches, %g response tokens out of range", stage, in->pp, sp_rank, in->sp,
                            fsdp_rank, x->fsdp, n_mb, resp_tokens);
    const int fsdp = x->fsdp, ep = in->ep;
    const double db = in->dtype_bytes, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    const double N = (double)x->N;
    double dense, expert;
    int l0, l1;
    int layers;
    if (stage_params_v(c, in->pp, x->v, in->pp_params, stage, &dense, &expert, &layers, &l0, &l1) != MOERL_OK)
        return MOERL_ERR;
    if (fsdp > 1 && in->pp > 1) { /* pipeline × FSDP: the stage's units, forward_only's order */
        t->fsdp_allgather = (fsdp - 1) * (plan_pp_fsdp_fwd_only(c, in->pp, x->v, stage, fsdp, in->fsdp_keep_gathered,
                                                                n_mb, NULL, NULL) * db);
    } else if (fsdp > 1) { /* every pass regathers (keep: each unit once): n_mb forward-only passes from a cold start */
        double gathered;
        replay_rank(c, ep, fsdp, 0, in->fsdp_keep_gathered, n_mb, 0, &gathered, NULL, NULL);
        t->fsdp_allgather = (fsdp - 1) * (gathered * db + (ep > 1 ? 0.0 : 4.0));
    }
    const int n_moe = stage_n_moe(c, in, x, stage, l0, l1);
    if (ep > 1 && n_moe > 0) { /* dispatch and combine per MoE layer and micro-batch */
        const double El = E / ep, exch = 2.0 * n_moe * n_mb;
        if (x->dispatcher == MOE_DISPATCH_ALLTOALL)
            t->ep_alltoall = exch * (ep - 1) * El * (2.0 + x->cap * H) * db;
        else
            t->ep_alltoall = exch * N * K * (ep - 1) / ep * H * db + (double)n_moe * n_mb * (ep - 1) * El * 4.0;
    }
    if (in->sp > 1) {
        const int P = in->sp, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
        const double nr = floor(N * (sp_rank + 1) / P) - floor(N * sp_rank / P);
        const double nh_l = nh / P, nkv_l = nkv >= P ? nkv / P : 1, W = nh_l + 2 * nkv_l;
        t->sp_alltoall = (l1 - l0) * hd * ((P - 1) * nr * W + (N - nr) * nh_l) * n_mb * db;
        t->sp_logprob_allreduce = 2.0 * (P - 1) / P * N * 4 * n_mb; /* every rank gets the micro-batch's logprobs */
    }
    if (in->pp > 1) {
        const double nf = x->v - (stage == in->pp - 1); /* chunks whose output goes on */
        t->pp_p2p_fwd_only = (double)n_mb * nf * N * H * db;
        /* the stages' batch check (8 doubles), then the last stage's logprobs summed onto every stage */
        const double f = 2.0 * (in->pp - 1) / in->pp;
        t->pp_logprob_allreduce = f * 8 * 8 + f * resp_tokens * 4;
    }
    return MOERL_OK;
}

static int tp_local(const moe_config *c, const plan_input *in, moe_config *lc, plan_input *li);
static void tp_update_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int kv_rep,
                              int sp, plan_traffic *t);
static void tp_logprob_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int n_mb,
                               int sp, plan_traffic *t);
static void tp_ep_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int n_mb,
                          int update, int sp, plan_traffic *t);
static int tp_pp_traffic(const moe_config *c, const plan_input *in, int stage, int n_mb, double resp_tokens,
                         plan_traffic *t);

int plan_traffic_logprob(const moe_config *c, const plan_input *in, int stage, int sp_rank, int fsdp_rank, int n_mb,
                         double resp_tokens, plan_traffic *t) {
    plan_ctx x;
    if (in->tp > 1 && in->pp > 1) return tp_pp_traffic(c, in, stage, n_mb, resp_tokens, t); /* TP × pipeline */
    if (in->tp > 1) { /* the slice's model on the dp replicas, + the TP group's collectives */
        moe_config lc;
        plan_input li;
        if (tp_local(c, in, &lc, &li) != MOERL_OK || plan_check(&lc, &li, &x) != MOERL_OK ||
            logprob_traffic(&lc, &li, &x, stage, sp_rank, fsdp_rank, n_mb, resp_tokens, t) != MOERL_OK)
            return MOERL_ERR;
        tp_logprob_traffic(&lc, &li, &x, in->tp, n_mb, in->tp_sp, t);
        tp_ep_traffic(&lc, &li, &x, in->tp, n_mb, 0, in->tp_sp, t);
        return MOERL_OK;
    }
    if (plan_check(c, in, &x) != MOERL_OK) return MOERL_ERR;
    return logprob_traffic(c, in, &x, stage, sp_rank, fsdp_rank, n_mb, resp_tokens, t);
}

int plan_traffic_rank(const moe_config *c, const plan_input *in, int stage, int sp_rank, int fsdp_rank,
                      plan_traffic *t) {
    plan_ctx x;
    if (in->tp > 1 && in->pp > 1) return tp_pp_traffic(c, in, stage, -1, 0, t); /* TP × pipeline: an update */
    if (in->tp > 1) {
        moe_config lc;
        plan_input li;
        if (tp_local(c, in, &lc, &li) != MOERL_OK || plan_check(&lc, &li, &x) != MOERL_OK ||
            traffic(&lc, &li, &x, stage, sp_rank, fsdp_rank, t) != MOERL_OK)
            return MOERL_ERR;
        tp_update_traffic(&lc, &li, &x, in->tp, c->num_key_value_heads < in->tp, in->tp_sp, t);
        tp_ep_traffic(&lc, &li, &x, in->tp, 0, 1, in->tp_sp, t);
        return MOERL_OK;
    }
    if (plan_check(c, in, &x) != MOERL_OK) return MOERL_ERR;
    return traffic(c, in, &x, stage, sp_rank, fsdp_rank, t);
}

/* plan_compute's memory of the fullest stage (the most bytes per rank: parameters, their state and
 * activations of N tokens, scaled by act_scale): o->fullest_stage, weights, moments, master,
 * stage_layers, acts, acts_recompute, gathered(_low); *best_s the stage, *ref_local the floats the
 * KL reference holds there. */
static int fullest_stage(const moe_config *c, const plan_input *in, const plan_ctx *x, int64_t N, double act_scale,
                         plan_result *o, int *best_s, double *ref_local) {
    const int L = c->num_hidden_layers, fsdp = x->fsdp;
    const double db = in->dtype_bytes, ep = in->ep;
    double best = -1;
    for (int s = 0; s < in->pp; s++) {
        double d, e;
        int l0, l1;
        int layers;
        if (stage_params_v(c, in->pp, x->v, in->pp_params, s, &d, &e, &layers, &l0, &l1) != MOERL_OK) return MOERL_ERR;
        double local, copy = plan_pp_tied_copy(c, in->pp, in->pp_params, s);
        if (fsdp > 1 && in->pp > 1) { /* pipeline × FSDP: every chunk's units */
            local = plan_pp_fsdp_shard(c, in->pp, x->v, s, fsdp);
        } else if (fsdp > 1) { /* moerl's unit shards (padding per unit) of the rank's expert slice */
            double n[MOERL_MAX_LAYERS + 2];
            fsdp_units(c, in->ep, n);
            local = 0;
            for (int u = 0; u < L + 2; u++) {
                const int in_stage = in->pp == 1 || in->pp_params == PLAN_PP_REPLICATED ||
                                     (u == 0 && s == 0) || (u == L + 1 && s == in->pp - 1) ||
                                     (u >= l0 + 1 && u <= l1);
                if (in_stage && n[u] > 0) local += fsdp_shard(n[u], fsdp);
            }
        } else {
            local = d + e / ep;
        }
        const int rc = in->recompute ? in->recompute : MODEL_RECOMPUTE_FULL; /* the recompute row's granularity */
        double acts0 = plan_acts_bytes(c, N, l0, l1, 0), acts1 = plan_acts_bytes(c, N, l0, l1, rc);
        if (in->pp > 1) { /* the schedule's in-flight slots per chunk */
            if (stage_acts(c, in->pp, x->v, s, x->mb, N, 0, &acts0) != MOERL_OK ||
                stage_acts(c, in->pp, x->v, s, x->mb, N, rc, &acts1) != MOERL_OK)
                return MOERL_ERR;
        }
        const double acts = (in->recompute ? acts1 : acts0) * act_scale;
        /* held (owned + a tied last stage's embedding copy): weights and gradients; owned: master and moments */
        const double bytes = (local + copy) * 2 * db + local * (8 + (in->dtype_bytes == 2 ? 4 : 0)) + acts;
        if (bytes > best) {
            best = bytes;
            *best_s = s;
            o->fullest_stage = s;
            o->weights = (local + copy) * db;
            *ref_local = local + copy; /* the KL reference holds what the actor holds (par_state_init_like) */
            o->moments = local * 8;
            o->master = in->dtype_bytes == 2 ? local * 4 : 0;
            o->stage_layers = layers;
            o->acts = acts0 * act_scale;
            o->acts_recompute = acts1 * act_scale;
            o->gathered = 0;
            if (fsdp > 1 && in->pp > 1) { /* pipeline × FSDP: the stage's schedule */
                plan_pp_fsdp_peak(c, in, x->v, x->mb, s, fsdp, &o->gathered, &o->gathered_low);
                o->gathered *= db;
                o->gathered_low *= db;
            } else if (fsdp > 1) { /* the schedule's peak of gathered parameters + live gradient units: both bounds */
                double hi, lo;
                const int keep = in->fsdp_keep_gathered; /* held: nothing completes early, lo == hi */
                replay_rank(c, in->ep, fsdp, 0, keep, (double)in->fwd_only_passes * x->mb, x->mb, NULL, &hi, NULL);
                replay_rank(c, in->ep, fsdp, 1, keep, (double)in->fwd_only_passes * x->mb, x->mb, NULL, &lo, NULL);
                o->gathered = hi * db;
                o->gathered_low = lo * db;
            }
        }
    }
    return MOERL_OK;
}

/* plan_compute's traffic per step: one optimizer update's collectives on the fullest stage best_s
 * (its last Ulysses rank, the largest token share; under EP × FSDP the FSDP rank whose owned pieces
 * sum the most floats) times the updates, plus the forward-only logprob passes (n_mb_lp
 * micro-batches of rank_tokens tokens). */
static int plan_step_traffic(const moe_config *c, const plan_input *in, const plan_ctx *x, int best_s, int n_mb_lp,
                             double rank_tokens, plan_result *o) {
    const int fsdp = x->fsdp;
    plan_traffic t = {0};
    double sums = -1;
    for (int r = 0; r < (in->ep > 1 ? fsdp : 1); r++) {
        plan_traffic tr;
        if (traffic(c, in, x, best_s, in->sp - 1, r, &tr) != MOERL_OK) return MOERL_ERR;
        const double v = tr.replica_allreduce + tr.ep_replica_allreduce;
        if (v > sums) {
            sums = v;
            t = tr;
        }
    }
    o->allreduce = t.reducer + t.replica_allreduce + t.ep_replica_allreduce + t.ep_grad_allreduce + t.pp_grad_allreduce +
                   t.pp_norm_allreduce;
    o->allgather = t.fsdp_allgather;
    o->reduce_scatter = t.fsdp_reduce_scatter;
    o->alltoall_ep = t.ep_alltoall;
    o->alltoall_sp = t.sp_alltoall;
    if (in->pp > 1) { /* a middle stage sends both ways; report the busiest */
        for (int s = 0; s < in->pp; s++) {
            plan_traffic ts;
            if (traffic(c, in, x, s, in->sp - 1, 0, &ts) != MOERL_OK) return MOERL_ERR;
            o->p2p_pp = MOERL_MAX(o->p2p_pp, ts.pp_p2p + ts.pp_p2p_fwd_only + ts.pp_p2p_emb);
        }
    }
    o->per_step = (o->allreduce + o->allgather + o->reduce_scatter + o->alltoall_ep + o->alltoall_sp + o->p2p_pp) *
                  in->updates_per_step;
    if (in->logprob_passes > 0) /* keep: the step's first update finds the logprob pass's units gathered */
        o->per_step -= t.fsdp_allgather - t.fsdp_allgather_warm;
    if (in->logprob_passes > 0 || in->ref_model) { /* forward-only passes over the step's data: the proximal
                                                    * logprobs (logprob_passes) and the sharded reference's */
        plan_traffic tl;
        if (logprob_traffic(c, in, x, best_s, in->sp - 1, 0, n_mb_lp, rank_tokens * in->resp_fraction, &tl) !=
            MOERL_OK)
            return MOERL_ERR;
        const double one = tl.fsdp_allgather + tl.ep_alltoall + tl.sp_alltoall + tl.sp_logprob_allreduce +
                           tl.pp_p2p_fwd_only + tl.pp_logprob_allreduce;
        o->logprob_pass = in->logprob_passes * one;
        /* the same collectives on the same groups (test_dist_plan), but the reference always reshards (it
         * has no optimizer step to end a kept window): its gathers are those of resharding */
        plan_input rin = *in;
        rin.fsdp_keep_gathered = 0;
        if (in->fsdp_keep_gathered &&
            logprob_traffic(c, &rin, x, best_s, in->sp - 1, 0, n_mb_lp, rank_tokens * in->resp_fraction, &tl) !=
                MOERL_OK)
            return MOERL_ERR;
        const double ref_one = tl.fsdp_allgather + tl.ep_alltoall + tl.sp_alltoall + tl.sp_logprob_allreduce +
                               tl.pp_p2p_fwd_only + tl.pp_logprob_allreduce;
        o->ref_pass = in->ref_model ? ref_one : 0;
        o->per_step += o->logprob_pass + o->ref_pass;
    }
    return MOERL_OK;
}

/* The rollout rows of plan_compute (the whole model c: TP of the trainer does not change the engine). */
static int plan_rollout(const moe_config *c, const plan_input *in, plan_result *o) {
    /* rollout: moerl's engine keeps fp32 weights in its padded layout; bf16 engines the HF tensors. Under rollout
     * TP (rollout.tensor_model_parallel_size = P) a device holds the slice src/rl/job_dist.c's rollout_tp_setup
     * builds its engine from: tp_config_apply of rank 0 (every rank's sizes are the same), experts split — the
     * heads, widths and the padded vocabulary divided by P, the norms, routers and replicated kv heads whole */
    const double rdb = in->kv_dtype_bytes;
    int64_t tot = o->n_params, d, e, hf = o->n_params_hf;
    if (in->rollout_tp > 1) {
        moe_config rc = *c;
        if (tp_config_apply(&rc, in->rollout_tp, 0, c->num_experts > 0) != MOERL_OK)
            return moerl_error_prefix("plan: rollout.tensor_model_parallel_size: ");
        plan_param_counts(&rc, &tot, &d, &e, &hf);
    }
    o->rollout_weights = (in->kv_dtype_bytes == 4 ? (double)tot : (double)hf) * rdb;
    const int kv_split = MOERL_MIN(in->rollout_tp, c->num_key_value_heads);
    o->kv_cache = 2.0 * c->num_hidden_layers * in->max_num_seqs * (double)in->max_model_len * c->num_key_value_heads *
                  c->head_dim * rdb / kv_split;
    o->routing_record = in->record_routes ? (double)in->max_num_seqs * in->max_model_len * model_moe_layer_count(c) *
                                                c->num_experts_per_tok * 2.0
                                          : 0.0;
    o->rollout_total = o->rollout_weights + o->kv_cache + o->routing_record;
    o->weight_bcast = in->kv_dtype_bytes == 4 ? (double)o->n_params * 4 : (double)o->n_params_hf * 2;
    return MOERL_OK;
}

static int plan_compute_tp(const moe_config *c, const plan_input *in, plan_result *o);

int plan_compute(const moe_config *c, const plan_input *in, plan_result *o) {
    memset(o, 0, sizeof *o);
    if (in->tp_sp && in->tp <= 1) /* as par_read_keys refuses it */
        return moerl_errorf("plan: actor.megatron.sequence_parallel=true needs actor.megatron.tensor_model_parallel_size "
                            "≥ 2, got %d", in->tp);
    if (in->tp > 1) return plan_compute_tp(c, in, o);
    plan_ctx x;
    if (plan_check(c, in, &x) != MOERL_OK) return MOERL_ERR;
    const int fsdp = x.fsdp;
    plan_param_counts(c, &o->n_params, &o->n_params_dense, &o->n_params_expert, &o->n_params_hf);
    o->n_active = model_active_matmul_params(c);
    o->fsdp = fsdp;
    o->dp = in->n_trainer / (in->pp * in->sp);
    o->micro_batches = x.mb;
    o->vpp = x.v;
    if (in->pp > 1) /* Narayanan et al. 2021 §2.2.2 (pp_stats.theory_interleaved; = 1F1B's at v = 1) */
        o->bubble_theory = (in->pp - 1.0) / ((double)x.v * x.mb + in->pp - 1.0);
    const double db = in->dtype_bytes;
    const int64_t N = (x.N + in->sp - 1) / in->sp; /* tokens a Ulysses rank holds (the largest share) */
    const double act_scale = db / 4.0;             /* moerl's arena is fp32 */

    /* the stage with the most bytes per rank (parameters, their state and activations) */
    int best_s = 0;
    double ref_local = 0;
    if (fullest_stage(c, in, &x, N, act_scale, o, &best_s, &ref_local) != MOERL_OK) return MOERL_ERR;
    o->grads = o->weights;
    /* micro-batches of a forward-only pass over the step's data on a rank (the proximal and reference passes) */
    const int dp_lp = in->n_trainer / (in->pp * in->sp);
    const double rank_tokens = (double)in->logprob_tokens / dp_lp, n_lp = ceil(rank_tokens / (double)in->micro_tokens);
    if ((in->logprob_passes > 0 || in->ref_model) && n_lp > INT32_MAX)
        return moerl_errorf("plan: the logprob pass's %.4g micro-batches on a rank (%lld tokens over %d data "
                            "shards, actor.ppo_max_token_len_per_gpu %lld) exceed 2^31 − 1: lower "
                            "actor.ppo_mini_batch_size, rollout.n or async_training.require_batches",
                            n_lp, (long long)in->logprob_tokens, dp_lp, (long long)in->micro_tokens);
    const int n_mb_lp = MOERL_MAX(1, (int)n_lp);
    if (in->ref_model) { /* trainer.c's reference, sharded as the actor (trainer_shard_ref); its pass runs in the
                          * actor's arena (trainer_ref_logprobs) */
        o->ref_weights = ref_local * sizeof(float); /* fp32 whatever actor.dtype: a copy of params */
        if (in->pp > 1) { /* its own pipeline's slots: one per chunk (a forward-only pass) */
            double a1;
            if (stage_acts(c, in->pp, x.v, best_s, 0, N, 0, &a1) != MOERL_OK) return MOERL_ERR;
            o->ref_acts = a1 * act_scale;
        }
        if (fsdp > 1 && in->pp > 1) { /* pipeline × FSDP: the stage's forward-only passes */
            double held = 0, peak = 0;
            if (in->logprob_passes > 0)
                plan_pp_fsdp_fwd_only(c, in->pp, x.v, best_s, fsdp, in->fsdp_keep_gathered, n_mb_lp, &held, NULL);
            plan_pp_fsdp_fwd_only(c, in->pp, x.v, best_s, fsdp, 0, n_mb_lp, NULL, &peak);
            o->ref_held = held * db;
            o->ref_gathered = peak * sizeof(float);
        } else if (fsdp > 1) {
            double held = 0, peak;
            if (in->logprob_passes > 0) /* the proximal pass ran just before: its last region stays (keep: all) */
                replay_rank(c, in->ep, fsdp, 0, in->fsdp_keep_gathered, n_mb_lp, 0, NULL, NULL, &held);
            o->ref_held = held * db;
            replay_rank(c, in->ep, fsdp, 0, 0, n_mb_lp, 0, NULL, &peak, NULL); /* the reference's own units */
            o->ref_gathered = peak * sizeof(float);
        }
    }
    const double live = MOERL_MAX(o->gathered, in->ref_model ? o->ref_acts + o->ref_held + o->ref_gathered : 0);
    o->total = o->weights + o->grads + o->master + o->moments + o->ref_weights + live + o->acts;
    o->total_recompute = o->total - o->acts + o->acts_recompute;

    if (plan_rollout(c, in, o) != MOERL_OK) return MOERL_ERR;
    return plan_step_traffic(c, in, &x, best_s, n_mb_lp, rank_tokens, o);
}

/* ------------------------------------------------------------------ tensor parallelism (TP × DP) */

/* plan_compute under TP × DP: the slice's model (tp_config_apply) planned on the dp replicas gives the per-rank
 * memory and the data-parallel rows; the TP group's collectives are added (tp_update_traffic), the whole model's
 * counts and the rollout rows (TP of the trainer leaves the engine as it is) put back. */
static int plan_compute_tp_pp(const moe_config *c, const plan_input *in, plan_result *o);
static int plan_compute_tp(const moe_config *c, const plan_input *in, plan_result *o) {
    if (in->pp > 1) return plan_compute_tp_pp(c, in, o);
    moe_config lc;
    plan_input li = {0}; /* set by tp_local (zeroed: the compiler cannot see it through the recursion) */
    plan_ctx x;
    if (tp_local(c, in, &lc, &li) != MOERL_OK || plan_compute(&lc, &li, o) != MOERL_OK ||
        plan_check(&lc, &li, &x) != MOERL_OK)
        return MOERL_ERR;
    plan_traffic t, tl = {0}; /* tl: tp_logprob_traffic sets only its rows (tp_reduce_scatter, ep_alltoall are read) */
    if (traffic(&lc, &li, &x, 0, 0, 0, &t) != MOERL_OK) return MOERL_ERR;
    tp_update_traffic(&lc, &li, &x, in->tp, c->num_key_value_heads < in->tp, in->tp_sp, &t);
    tp_ep_traffic(&lc, &li, &x, in->tp, 0, 1, in->tp_sp, &t);
    const double n_lp = ceil((double)in->logprob_tokens / li.n_trainer / (double)in->micro_tokens);
    tp_logprob_traffic(&lc, &li, &x, in->tp, MOERL_MAX(1, (int)n_lp), in->tp_sp, &tl);
    tp_ep_traffic(&lc, &li, &x, in->tp, MOERL_MAX(1, (int)n_lp), 0, in->tp_sp, &tl);
    o->tp = in->tp;
    /* the reducer's row of the tp = 1 plan is replaced by tp_reduce_grads' sums (TP × EP: the experts' too) */
    o->allreduce = t.tp_dp_allreduce + t.tp_ep_allreduce;
    o->tp_allreduce = t.tp_act_allreduce + t.tp_allgather + t.tp_reduce_scatter;
    o->tp_reduce_scatter = t.tp_reduce_scatter;
    o->alltoall_ep = t.ep_alltoall;
    const double one = tl.tp_act_allreduce + tl.tp_allgather + tl.tp_reduce_scatter + tl.ep_alltoall;
    o->logprob_pass = in->logprob_passes * one;
    o->ref_pass = in->ref_model ? one : 0;
    o->per_step = (o->allreduce + o->tp_allreduce) * in->updates_per_step + o->logprob_pass + o->ref_pass;
    /* o->acts / acts_recompute: the slice's arena without / with recompute (plan_compute of lc; under Megatron SP
     * the residual stream's and the norms' per-row buffers hold ⌈N/tp⌉ rows, lc.exec.tp_sp); TP × EP adds
     * tp_ep.c's scratch for a micro-batch (none under SP × EP: no tp_ep_state) */
    o->tp_ep_scratch = in->ep > 1 && !in->tp_sp ? tp_ep_scratch_bytes(c, in->tp, (int)x.N) : 0;
    o->total += o->tp_ep_scratch;
    o->total_recompute += o->tp_ep_scratch;
    plan_param_counts(c, &o->n_params, &o->n_params_dense, &o->n_params_expert, &o->n_params_hf);
    o->n_active = model_active_matmul_params(c);
    return plan_rollout(c, in, o);
}


/* The slice a TP rank holds and the layout it runs on: *lc = tp_config_apply's config of rank 0 (every rank's
 * slice has the same sizes), *li = in over the dp = n_trainer/tp data replicas, tp off. Refuses what moerl rl
 * refuses (par_check_tp: TP with DP, with the plain pipeline, and with EP only with the experts whole;
 * tp_config_apply's divisibility), naming the key; activation recompute is planned (li keeps in->recompute: the
 * slice's arena rows and tp_recompute_traffic). Under TP × EP *li keeps the EP size over the dp ranks
 * (tp_ep_traffic); under TP × pipeline the stages over n_trainer/tp ranks (plan_compute_tp_pp). */
static int tp_local(const moe_config *c, const plan_input *in, moe_config *lc, plan_input *li) {
    const par_config pc = {.fsdp_size = in->fsdp <= 0 ? -1 : in->fsdp, .expert_parallel_size = in->ep,
                           .ulysses_sequence_parallel_size = in->sp, .pipeline_parallel_size = in->pp,
                           .tensor_model_parallel_size = in->tp, .sequence_parallel = in->tp_sp,
                           .expert_tensor_parallel_size = in->tp_experts ? -1 : 1,
                           .virtual_pipeline_parallel_size = in->vpp}; /* TP × pipeline: plain 1F1B only */
    if (in->n_trainer <= 0)
        return moerl_errorf("plan: trainer.n_ranks must be positive, got %d", in->n_trainer);
    if (par_check_tp(&pc, in->n_trainer) != MOERL_OK) return moerl_error_prefix("plan: ");
    moe_config rc = *c;
    rc.exec.recompute = in->recompute;
    if (tp_check_recompute(&pc, &rc) != MOERL_OK) return moerl_error_prefix("plan: ");
    *lc = *c;
    lc->exec.recompute = 0;
    if (tp_config_apply(lc, in->tp, 0, in->tp_experts && c->num_experts > 0) != MOERL_OK)
        return moerl_error_prefix("plan: ");
    lc->exec.tp_sp = in->tp_sp; /* as tp_state_attach: the slice's arena under Megatron SP (plan_acts_bytes) */
    *li = *in;
    li->tp = 1;
    li->tp_experts = 0;
    li->tp_sp = 0;
    li->n_trainer = in->n_trainer / in->tp;
    li->fsdp = 1;
    return MOERL_OK;
}

/* Floats the TP group all-reduces in one forward pass of N tokens over the slice lc (forward.c's tp_sum_team
 * calls): the vocab-parallel embedding, each layer's o_proj, each dense MLP's (and expert-TP's) down
 * projections. */
static double tp_fwd_floats(const moe_config *lc, double N) {
    const double H = lc->hidden_size;
    double f = N * H;
    for (int l = 0; l < lc->num_hidden_layers; l++)
        f += N * H + (!moe_config_layer_is_moe(lc, l) || lc->exec.tp_experts ? N * H : 0);
    return f;
}

/* The same for one backward pass: per layer q/k/v's input gradient, the dense gate_up's (or expert-TP's
 * experts' input gradient and routing-weight gradient [N,K]); the vocab-parallel head's input gradient. */
static double tp_bwd_floats(const moe_config *lc, double N) {
    const double H = lc->hidden_size, K = lc->num_experts_per_tok;
    double f = N * H;
    for (int l = 0; l < lc->num_hidden_layers; l++) {
        f += N * H;
        if (!moe_config_layer_is_moe(lc, l)) f += N * H;
        else if (lc->exec.tp_experts) f += N * H + N * K;
    }
    return f;
}

/* expert-TP's routing-weight gradient [N,K] per MoE layer, all-reduced in every backward pass (floats). */
static double tp_topk_floats(const moe_config *lc, double N) {
    return lc->exec.tp_experts ? N * lc->num_experts_per_tok * n_moe_in(lc, 0, lc->num_hidden_layers) : 0;
}

/* Megatron sequence parallelism's row collectives (plan.h plan_traffic tp_reduce_scatter, tp_allgather; tp_sp.h)
 * over the slice lc, N tokens a micro-batch, P ranks: n_train training passes (forward and backward) and n_fwd
 * forward-only passes (the router-count pre-pass and the logprob pass: both run the head, so both gather the
 * final norm). Each op moves (P−1)·⌈N/P⌉·H·db bytes a rank; adds to *t. */
static void tp_sp_rows(const moe_config *lc, double N, int P, double db, double n_train, double n_fwd,
                       plan_traffic *t) {
    const int L = lc->num_hidden_layers;
    int n_mlp = 0; /* row-parallel MLP outputs: dense layers, and MoE layers under expert-TP */
    for (int l = 0; l < L; l++) n_mlp += !moe_config_layer_is_moe(lc, l) || lc->exec.tp_experts;
    const double row = (P - 1.0) * ceil(N / P) * lc->hidden_size * db;
    /* forward: the embedding, o_proj and row-parallel MLP outputs scattered; ln1, ln2 and the final norm
     * gathered (ln2 also before a MoE layer with experts whole). Backward: the conjugates, as many again. */
    const double rs_fwd = 1.0 + L + n_mlp, ag_fwd = 2.0 * L + 1;
    t->tp_reduce_scatter += row * (2 * n_train + n_fwd) * rs_fwd;
    t->tp_allgather += row * (2 * n_train + n_fwd) * ag_fwd;
}

/* The TP collectives activation recompute (li->recompute) adds to one update's training passes (mb micro-batches of
 * N tokens over the slice lc, P ranks; forward.c recompute_layer repeats the layer's forward collectives that
 * rebuild a kept-for-backward buffer, not the MLP output's sum: the next layer's input is kept). Full: per layer
 * o_proj's all-reduce of N·H (Megatron SP: its reduce-scatter and the ln1 / ln2 all-gathers of ⌈N/P⌉·H rows);
 * selective: SP's ln2 all-gather only. TP × EP's expert-row all-gathers: tp_ep_traffic. Adds to *t. */
static void tp_recompute_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int sp,
                                 plan_traffic *t) {
    if (!li->recompute) return;
    const double db = li->dtype_bytes, N = (double)x->N, mb = x->mb, L = lc->num_hidden_layers, H = lc->hidden_size;
    const int full = li->recompute == MODEL_RECOMPUTE_FULL;
    const double row = (P - 1.0) * ceil(N / P) * H * db;
    if (sp) {
        t->tp_allgather += mb * L * row * (full ? 2 : 1);
        if (full) t->tp_reduce_scatter += mb * L * row;
    } else if (full) {
        t->tp_act_allreduce += mb * L * 2.0 * (P - 1) / P * N * H * db;
    }
}

/* One update's TP collectives (plan.h plan_traffic tp_*) on top of traffic()'s rows of the slice: the data-
 * parallel gradient sum moves from the reducer to tp_reduce_grads' all-reduce over dp_comm. */
static void tp_update_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int kv_rep,
                              int sp, plan_traffic *t) {
    const double db = li->dtype_bytes, N = (double)x->N, mb = x->mb, fo = li->fwd_only_passes, f = 2.0 * (P - 1) / P;
    const int L = lc->num_hidden_layers, D = li->n_trainer;
    const double hd = lc->head_dim, H = lc->hidden_size;
    if (sp) /* Megatron SP: the [N,H] rows move by reduce-scatter / all-gather (tp_sp_rows); expert-TP's [N,K] stays */
        t->tp_act_allreduce = f * db * mb * tp_topk_floats(lc, N) + f * (2.0 * L + 1) * H * db; /* + the norms' sum */
    else
        t->tp_act_allreduce =
            f * db * (mb * (tp_fwd_floats(lc, N) + tp_bwd_floats(lc, N)) + fo * mb * tp_fwd_floats(lc, N));
    /* the logprob statistics (4N doubles) and the vocabulary max, twice per training pass: vp_logprob_backward
     * recomputes them (vocab_parallel.c) rather than keeping them */
    t->tp_act_allreduce += f * mb * 2 * 4 * N * 8;
    t->tp_act_allreduce += f * L * 2 * hd * db + f * 2 * 8; /* q/k-norm gradients; the clipping norm's 2 doubles */
    t->tp_allgather = (P - 1) * mb * 2 * (2 * N * 4); /* the vocabulary max: each double as two floats */
    if (sp) tp_sp_rows(lc, N, P, db, mb, fo * mb, t);
    tp_recompute_traffic(lc, li, x, P, sp, t);
    if (kv_rep) /* nkv < P: each rank's one kv head; its holders sum k/v gradients by an all-gather per layer */
        t->tp_allgather += (P - 1.0) * L * 2 * hd * H * db;
    t->reducer = 0;
    int64_t tot, d, e, hf;
    plan_param_counts(lc, &tot, &d, &e, &hf);
    t->tp_dp_allreduce = D > 1 ? 2.0 * (D - 1) / D * (double)tot * db : 0;
}

/* The forward-only logprob pass's TP collectives over n_mb micro-batches: the forward's rows and the logprob
 * statistics per micro-batch. */
static void tp_logprob_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int n_mb,
                               int sp, plan_traffic *t) {
    const double db = li->dtype_bytes, N = (double)x->N, f = 2.0 * (P - 1) / P;
    t->tp_act_allreduce = n_mb * ((sp ? 0 : f * db * tp_fwd_floats(lc, N)) + f * 4 * N * 8);
    t->tp_allgather = (double)(P - 1) * n_mb * 2 * N * 4;
    if (sp) tp_sp_rows(lc, N, P, db, 0, n_mb, t);
}

/* TP × EP (li->ep > 1, experts whole: tp_ep.h) on top of the TP rows of the slice planned over the dp replicas
 * with EP: each TP rank dispatches only its ⌊N/P⌋–⌈N/P⌉ tokens (the all-to-all-v rows scale by 1/P) and the
 * TP group all-gathers the expert rows, ⌈N/P⌉·K·H
 * per rank and MoE layer in every forward and backward pass; the all-to-all's capacity is sized by ⌈N/P⌉ tokens
 * (ceil(capacity_factor · ⌈N/P⌉ · K / E) rows per block, at most ⌈N/P⌉). update = 1: one update's passes (the forward-only
 * pre-passes, the training passes) and the gradient sums — the slice's non-expert tensors over dp_comm
 * (tp_dp_allreduce), its E/ep whole experts over ep_dp_comm (tp·D/ep ranks) with the clipping norm's double
 * over ep_comm (tp_ep_allreduce); update = 0: n_mb forward-only logprob passes. sp: Megatron SP × EP
 * (tp_sp_ep_traffic: no expert-row gathers). No-op without EP. */
static void tp_sp_ep_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int n_mb,
                             int update, plan_traffic *t);
static void tp_ep_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int n_mb,
                          int update, int sp, plan_traffic *t) {
    const int ep = li->ep, L = lc->num_hidden_layers, n_moe = n_moe_in(lc, 0, L);
    if (ep <= 1 || n_moe == 0) return;
    const double db = li->dtype_bytes, N = (double)x->N, K = lc->num_experts_per_tok, H = lc->hidden_size;
    const double fo = li->fwd_only_passes, mb = x->mb, share = ceil(N / P) * K * H;
    const double rf = update && li->recompute ? 1 : 0; /* recompute: the MoE forward again before its backward */
    const double gathers = update ? (fo + 2.0 + rf) * mb : (double)n_mb,
                 exch = update ? (2.0 * (fo + 1 + rf) + 2.0) * mb : 2.0 * n_mb;
    if (sp) tp_sp_ep_traffic(lc, li, x, P, n_mb, update, t);
    else t->tp_allgather += gathers * n_moe * (P - 1.0) * share * db;
    if (x->dispatcher != MOE_DISPATCH_ALLTOALL) { /* all-to-all-v: the rows are this rank's share of the tokens */
        t->ep_alltoall -= n_moe * exch * N * K * (ep - 1) / ep * H * db * (1.0 - 1.0 / P);
    } else { /* the fixed capacity sized by the share ⌈N/P⌉ (parallel.c: ep_state_attach's max_tokens) */
        const double Nt = ceil(N / P), E = lc->num_experts;
        const double cf = li->capacity_factor > 0 ? li->capacity_factor : 1.25; /* plan_check's default */
        const double cap = MOERL_MAX(1.0, MOERL_MIN(ceil(cf * Nt * K / E), Nt));
        t->ep_alltoall = n_moe * exch * (ep - 1) * (E / ep) * (2.0 + cap * H) * db;
    }
    if (!update) return;
    int64_t tot, dn, ex, hf;
    plan_param_counts(lc, &tot, &dn, &ex, &hf);
    const double hf_expert = (double)n_moe * 3.0 * lc->num_experts * lc->moe_intermediate_size * H;
    const int D = li->n_trainer, Q = P * D / ep; /* dp_comm; ep_dp_comm: every rank holding the same experts */
    t->ep_grad_allreduce = 0;
    t->tp_dp_allreduce = D > 1 ? 2.0 * (D - 1) / D * ((double)hf - hf_expert) * db : 0;
    t->tp_ep_allreduce = (Q > 1 ? 2.0 * (Q - 1) / Q * hf_expert / ep * db : 0) + 2.0 * (ep - 1) / ep * 8;
}

/* Megatron SP × EP (tp_sp.h; li->ep > 1, experts whole) on top of tp_sp_rows' rows: an MoE layer takes the
 * rank's ⌈N/P⌉ rows as they are, so tp_sp_rows' gather of ln2 before it (forward) and of ∂out (its backward
 * conjugate) does not happen, nor TP × EP's expert-row gathers; every forward all-reduces the aux-loss statistics
 * (2·E fp32 counts and probability sums), every update the routers' gradients (n_moe·E·H). The all-to-all rows
 * are TP × EP's (each rank dispatches ⌈N/P⌉ tokens at most, the capacity sized by them). update and n_mb as
 * tp_ep_traffic. */
static void tp_sp_ep_traffic(const moe_config *lc, const plan_input *li, const plan_ctx *x, int P, int n_mb,
                             int update, plan_traffic *t) {
    const int n_moe = n_moe_in(lc, 0, lc->num_hidden_layers);
    const double db = li->dtype_bytes, N = (double)x->N, f = 2.0 * (P - 1) / P, E = lc->num_experts;
    const double H = lc->hidden_size, fo = li->fwd_only_passes, mb = x->mb;
    const double gathers = update ? (fo + 2.0) * mb : (double)n_mb, fwds = update ? (fo + 1.0) * mb : (double)n_mb;
    t->tp_allgather -= gathers * n_moe * (P - 1.0) * ceil(N / P) * H * db;
    t->tp_act_allreduce += fwds * f * 2 * E * 4;
    if (update) t->tp_act_allreduce += f * n_moe * E * H * db;
}

/* ------------------------------------------------------------------ TP × pipeline */

/* Stage `stage` of the slice lc (tp_local's) as plan_tp_pp.h describes it: its layers, ends and the TP group. */
static int tp_pp_stage(const moe_config *c, const moe_config *lc, const plan_input *in, int stage, plan_tp_stage *s) {
    double d, e;
    if (plan_pp_stage_params(lc, in->pp, in->pp_params, stage, &d, &e, &s->l0, &s->l1) != MOERL_OK) return MOERL_ERR;
    s->P = in->tp;
    s->first = stage == 0;
    s->last = stage == in->pp - 1;
    s->kv_rep = c->num_key_value_heads < in->tp;
    s->db = in->dtype_bytes;
    s->recompute = in->recompute;
    return MOERL_OK;
}

/* The rows a TP plan of the slice gives for the whole model c: its parameter counts and the rollout's (TP of
 * the trainer leaves the engine as it is). */
static int tp_whole_model_rows(const moe_config *c, const plan_input *in, plan_result *o) {
    plan_param_counts(c, &o->n_params, &o->n_params_dense, &o->n_params_expert, &o->n_params_hf);
    o->n_active = model_active_matmul_params(c);
    return plan_rollout(c, in, o);
}

/* plan_traffic_rank (n_mb < 0: one update) and plan_traffic_logprob (n_mb micro-batches, resp_tokens response
 * tokens) under TP × pipeline: the pipeline's rows of the slice's model on its stages of dp = n_trainer/(tp·pp)
 * ranks (p2p between same-tp_rank ranks, the stage's gradient sum over the dp ranks holding the same slice,
 * the logprob sums over pp_comm), + the stage's TP rows (plan_tp_pp.h). An update's TP rows follow the
 * pipeline's micro-batches (x.mb of x.mb_tokens tokens, as its p2p); the logprob pass's micro-batches are full. */
static int tp_pp_traffic(const moe_config *c, const plan_input *in, int stage, int n_mb, double resp_tokens,
                         plan_traffic *t) {
    moe_config lc;
    plan_input li;
    plan_ctx x;
    plan_tp_stage s;
    if (tp_local(c, in, &lc, &li) != MOERL_OK || plan_check(&lc, &li, &x) != MOERL_OK)
        return MOERL_ERR;
    const int rc = n_mb < 0 ? traffic(&lc, &li, &x, stage, 0, 0, t)
                            : logprob_traffic(&lc, &li, &x, stage, 0, 0, n_mb, resp_tokens, t);
    if (rc != MOERL_OK || tp_pp_stage(c, &lc, in, stage, &s) != MOERL_OK) return MOERL_ERR;
    if (n_mb < 0) plan_tp_pp_update(&lc, &s, x.mb_tokens, x.mb, li.fwd_only_passes, t);
    else plan_tp_pp_logprob(&lc, &s, (double)x.N, n_mb, t);
    return MOERL_OK;
}

/* plan_compute under TP × pipeline (× DP): the slice's model (tp_local) planned as a pipeline of pp stages over
 * n_trainer/tp ranks gives the fullest stage's memory (its range of the slice: the vocabulary slice of the
 * embedding on the first stage, of the head on the last; gradients, moments, the in-flight activation slots of
 * the slice's arena) and the pipeline's rows (the stage's all-reduce over the ranks holding its slice, the busiest
 * stage's p2p, the logprob passes' p2p and sums); the fullest stage's TP rows are added (tp_allreduce, and the
 * logprob and reference passes' TP collectives), the whole model's counts and the rollout rows put back. */
static int plan_compute_tp_pp(const moe_config *c, const plan_input *in, plan_result *o) {
    moe_config lc;
    plan_input li = {0}; /* set by tp_local */
    plan_ctx x;
    plan_tp_stage s;
    if (tp_local(c, in, &lc, &li) != MOERL_OK || plan_compute(&lc, &li, o) != MOERL_OK ||
        plan_check(&lc, &li, &x) != MOERL_OK || tp_pp_stage(c, &lc, in, o->fullest_stage, &s) != MOERL_OK)
        return MOERL_ERR;
    plan_traffic t = {0}, tl = {0};
    plan_tp_pp_update(&lc, &s, x.mb_tokens, x.mb, li.fwd_only_passes, &t);
    /* the logprob pass's micro-batches on a rank, as plan_compute counts them for the slice's pipeline */
    const double n_lp = ceil((double)li.logprob_tokens / (li.n_trainer / li.pp) / (double)li.micro_tokens);
    plan_tp_pp_logprob(&lc, &s, (double)x.N, MOERL_MAX(1.0, n_lp), &tl);
    const double one = tl.tp_act_allreduce + tl.tp_allgather;
    o->tp = in->tp;
    o->tp_allreduce = t.tp_act_allreduce + t.tp_allgather;
    o->logprob_pass += in->logprob_passes * one;
    o->ref_pass += in->ref_model ? one : 0;
    o->per_step += o->tp_allreduce * in->updates_per_step + in->logprob_passes * one + (in->ref_model ? one : 0);
    /* o->acts / acts_recompute (and the totals): the stage's in-flight slots of the slice's arena without / with
     * recompute, as plan_compute of the slice's pipeline sets them */
    return tp_whole_model_rows(c, in, o);
}

int plan_check_rollout_tp(int tp, int n_heads) {
    if (tp < 1 || n_heads % tp)
        return moerl_errorf("rollout.tensor_model_parallel_size=%d does not divide the %d attention heads", tp, n_heads);
    return MOERL_OK;
}
