/* moerl plan: memory and traffic formulas. See plan.h. */
#include "plan/plan.h"

#include <string.h>

#include "base/common.h"
#include "model/perf.h"

/* ------------------------------------------------------------------ activations */

/* One buffer of forward.c's arena: every carve starts 64-byte aligned and takes its size rounded
 * up to 64 bytes (carve()), so the arena is the sum of the rounded sizes. */
static double r64(double elems) {
    const uint64_t b = (uint64_t)elems * 4u; /* floats and ints are 4 bytes */
    return (double)((b + 63u) & ~(uint64_t)63u);
}

/* Bytes layout() carves for decoder layer l at N tokens (resid_in first). */
static double layer_bytes(const moe_config *c, double N, int l) {
    const double H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim,
                 E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
                 Id = c->intermediate_size;
    const double M = N * (E > 0 ? K : 0);
    double b = r64(N * H) + r64(N * H) + r64(N) + r64(N * nh * hd) + r64(N * nkv * hd) + r64(N * nh) + r64(N * nkv) +
               r64(N * nh * hd) + r64(N * nkv * hd) + r64(N * nkv * hd) + r64(N * nh * hd) + r64(N * nh) +
               r64(N * H) + r64(N * H) + r64(N);
    if (moe_config_layer_is_moe(c, l)) {
        b += r64(N * E) + r64(N * E) + r64(N * K) + r64(N * K) + r64(N * K) + r64(M) + r64(M) + r64(E) + r64(E + 1) +
             r64(M * H) + r64(M * 2 * I) + r64(M * I) + r64(M * H);
        if (c->exec.per_expert_weights) b += r64(E * 2 * I * H) + r64(E * H * I);
    } else {
        b += r64(N * 2 * Id) + r64(N * Id);
    }
    return b;
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
    double gu_max = 0, act_max = 0, layers = 0, biggest = 0;
    for (int l = l0; l < l1; l++) {
        const double lb = layer_bytes(c, N, l);
        layers += lb;
        biggest = MOERL_MAX(biggest, lb);
        if (moe_config_layer_is_moe(c, l)) {
            gu_max = MOERL_MAX(gu_max, M * 2 * I);
            act_max = MOERL_MAX(act_max, M * I);
        } else {
            gu_max = MOERL_MAX(gu_max, N * 2 * Id);
            act_max = MOERL_MAX(act_max, N * Id);
        }
    }
    /* full recompute: every layer keeps only its input [N,H]; the layer being recomputed holds all */
    if (recompute && l1 > l0) layers = (l1 - l0) * r64(N * H) + (biggest - r64(N * H));
    b += layers;
    b += r64(N * H) + r64(N * H) + r64(N) + r64(N * V) + r64(N) + r64(N) + r64(N) + 2 * r64(E > 0 ? E : 1);
    b += 3 * r64(N * H) + r64(N * nh * hd) + 2 * r64(N * nkv * hd) + r64(N * nh * hd) + r64(N * V) + 2 * r64(M * H) +
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

/* ------------------------------------------------------------------ the plan */

int plan_compute(const moe_config *c, const plan_input *in, plan_result *o) {
    memset(o, 0, sizeof *o);
    const int L = c->num_hidden_layers;
    if (in->n_trainer <= 0 || in->ep <= 0 || in->sp <= 0 || in->pp <= 0)
        return moerl_errorf("plan: trainer.n_ranks (%d), actor.expert_parallel_size (%d), "
                            "actor.ulysses_sequence_parallel_size (%d) and actor.pipeline_parallel_size (%d) must be "
                            "positive", in->n_trainer, in->ep, in->sp, in->pp);
    if (in->n_trainer % (in->pp * in->sp))
        return moerl_errorf("plan: trainer.n_ranks %d is not divisible by actor.pipeline_parallel_size × "
                            "actor.ulysses_sequence_parallel_size = %d × %d", in->n_trainer, in->pp, in->sp);
    if (in->pp > L)
        return moerl_errorf("plan: actor.pipeline_parallel_size %d exceeds the model's %d layers", in->pp, L);
    const int S = in->n_trainer / in->pp; /* ranks of one pipeline stage */
    const int fsdp = in->fsdp <= 0 ? S : in->fsdp;
    if (S % fsdp)
        return moerl_errorf("plan: actor.fsdp_config.fsdp_size %d does not divide the %d ranks of a pipeline stage "
                            "(trainer.n_ranks / actor.pipeline_parallel_size)", fsdp, S);
    if (S % in->ep)
        return moerl_errorf("plan: actor.expert_parallel_size %d does not divide the %d ranks of a pipeline stage",
                            in->ep, S);
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
    if (in->n_rollout < 0 || in->rollout_tp <= 0 || (in->n_rollout > 0 && in->n_rollout % in->rollout_tp))
        return moerl_errorf("plan: rollout.n_ranks %d must be a multiple of rollout.tensor_model_parallel_size %d",
                            in->n_rollout, in->rollout_tp);
    plan_param_counts(c, &o->n_params, &o->n_params_dense, &o->n_params_expert, &o->n_params_hf);
    o->n_active = model_active_matmul_params(c);
    o->fsdp = fsdp;
    o->dp = in->n_trainer / (in->pp * in->sp);
    const double db = in->dtype_bytes, ep = in->ep, sp = in->sp;
    const double exp_div = MOERL_MAX(in->ep, fsdp);

    /* pipeline stages: contiguous blocks of ceil(L/pp) layers; the embedding on the first stage,
     * final norm and head on the last; the plan is for the stage with the most local bytes */
    const int per = (L + in->pp - 1) / in->pp;
    const int64_t V = c->vocab_size, H = c->hidden_size;
    double best = -1, st_dense = 0, st_expert = 0, max_layer = 0;
    int best_l0 = 0, best_l1 = 0;
    for (int s = 0; s < in->pp; s++) {
        const int l0 = MOERL_MIN(L, s * per), l1 = MOERL_MIN(L, (s + 1) * per);
        int64_t d = 0, e = 0, hf = 0;
        if (s == 0) d += pad16(V * H);
        if (s == in->pp - 1) d += pad16(H) + (c->tie_word_embeddings ? 0 : pad16(V * H));
        double ml = 0;
        for (int l = l0; l < l1; l++) {
            int64_t ld, le;
            layer_params(c, l, &ld, &le, &hf);
            d += ld;
            e += le;
            ml = MOERL_MAX(ml, (double)ld + (double)le / ep);
        }
        const double local = (double)d / fsdp + (double)e / exp_div;
        if (local > best) {
            best = local;
            st_dense = (double)d;
            st_expert = (double)e;
            best_l0 = l0;
            best_l1 = l1;
            max_layer = ml;
        }
    }
    o->stage_layers = best_l1 - best_l0;
    const double local = best;
    o->weights = local * db;
    o->grads = local * db;
    o->master = in->dtype_bytes == 2 ? local * 4 : 0;
    o->moments = local * 8;
    o->gathered = fsdp > 1 ? 2 * max_layer * db : 0;
    const int64_t N = (in->micro_tokens + in->sp - 1) / in->sp;
    int mb = in->micro_batches;
    if (mb <= 0) { /* micro-batches per update on a rank: the update's tokens over the replicas */
        const double upd_tokens = (double)in->step_tokens / in->updates_per_step * 1.0;
        mb = (int)((upd_tokens / o->dp + in->micro_tokens - 1) / in->micro_tokens);
        if (mb < 1) mb = 1;
    }
    const int inflight = in->pp > 1 ? MOERL_MIN(in->pp, mb) : 1; /* 1F1B: stage 0 holds up to pp micro-batches */
    const double act_scale = db / 4.0;                             /* moerl's arena is fp32 */
    o->acts = plan_acts_bytes(c, N, best_l0, best_l1, 0) * act_scale * inflight;
    o->acts_recompute = plan_acts_bytes(c, N, best_l0, best_l1, 1) * act_scale * inflight;
    o->total = o->weights + o->grads + o->master + o->moments + o->gathered + o->acts;
    o->total_recompute = o->total - o->acts + o->acts_recompute;

    /* rollout: moerl's engine keeps fp32 weights in its padded layout; bf16 engines the HF tensors */
    const double rdb = in->kv_dtype_bytes;
    o->rollout_weights = (in->kv_dtype_bytes == 4 ? (double)o->n_params : (double)o->n_params_hf) * rdb / in->rollout_tp;
    const int kv_split = MOERL_MIN(in->rollout_tp, c->num_key_value_heads);
    o->kv_cache = 2.0 * L * in->max_num_seqs * (double)in->max_model_len * c->num_key_value_heads * c->head_dim * rdb /
                  kv_split;
    o->rollout_total = o->rollout_weights + o->kv_cache;

    /* traffic per optimizer update: the all-reduce as its payload (what dist counts), the others as
     * the bytes a rank sends in a ring / pairwise exchange */
    const double dense_local = st_dense / fsdp, expert_local = st_expert / exp_div;
    if (S / fsdp > 1) o->allreduce += dense_local * db;
    if (S / exp_div > 1) o->allreduce += expert_local * db;
    if (fsdp > 1) {
        const double f = (double)(fsdp - 1) / fsdp; /* ring: a rank sends n−1 of n chunks */
        o->allgather = 2 * f * (st_dense + st_expert / ep) * db;
        o->reduce_scatter = f * (st_dense + st_expert / ep) * db;
    }
    int n_moe = 0;
    for (int l = best_l0; l < best_l1; l++) n_moe += moe_config_layer_is_moe(c, l);
    if (in->ep > 1)
        o->alltoall_ep = 4.0 * n_moe * (double)N * c->num_experts_per_tok * H * db * (ep - 1) / ep * mb;
    if (in->sp > 1)
        o->alltoall_sp = 2.0 * o->stage_layers * (double)N * (2.0 * c->num_attention_heads + 2.0 * c->num_key_value_heads) *
                         c->head_dim * db * (sp - 1) / sp * mb;
    if (in->pp > 1) o->p2p_pp = 2.0 * N * H * db * mb;
    o->per_step = (o->allreduce + o->allgather + o->reduce_scatter + o->alltoall_ep + o->alltoall_sp + o->p2p_pp) *
                  in->updates_per_step;
    o->weight_bcast = in->kv_dtype_bytes == 4 ? (double)o->n_params * 4 : (double)o->n_params_hf * 2;
    return MOERL_OK;
}
