/* Qwen3-MoE forward/backward over a packed batch. See forward.h. */
#include "model/forward.h"

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "kernels/kernels.h"

/* ------------------------------------------------------------------ activation arena */

typedef struct {
    char *base;
    size_t used;
} arena_t;

static void *carve(arena_t *ar, size_t bytes) {
    size_t off = (ar->used + 63) & ~(size_t)63;
    ar->used = off + ((bytes + 63) & ~(size_t)63);
    return ar->base ? ar->base + off : NULL;
}
#define CF(n) ((float *)carve(ar, (size_t)(n) * sizeof(float)))
#define CI(n) ((int *)carve(ar, (size_t)(n) * sizeof(int)))

static void layout(const moe_model *m, model_acts *a, arena_t *ar, int Nmax) {
    const moe_config *c = &m->cfg;
    const size_t N = (size_t)Nmax, H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads,
                 hd = c->head_dim, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
                 Id = c->intermediate_size, V = c->vocab_size;
    const size_t M = N * (E > 0 ? K : 0);
    a->cu_seqlens = CI(N + 1);
    a->pos = CI(N);
    a->tokens_in = CI(N);
    a->rope_cos = CF((size_t)a->rope_max_pos * hd / 2);
    a->rope_sin = CF((size_t)a->rope_max_pos * hd / 2);
    size_t gu_max = 0, act_max = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        layer_acts *L = &a->layers[l];
        L->resid_in = CF(N * H);
        L->ln1 = CF(N * H);
        L->ln1_rstd = CF(N);
        L->q_raw = CF(N * nh * hd);
        L->k_raw = CF(N * nkv * hd);
        L->q_rstd = CF(N * nh);
        L->k_rstd = CF(N * nkv);
        L->q = CF(N * nh * hd);
        L->k = CF(N * nkv * hd);
        L->v = CF(N * nkv * hd);
        L->att = CF(N * nh * hd);
        L->lse = CF(N * nh);
        L->resid_mid = CF(N * H);
        L->ln2 = CF(N * H);
        L->ln2_rstd = CF(N);
        mlp_acts *s = &L->mlp;
        memset(s, 0, sizeof *s);
        if (moe_config_layer_is_moe(c, l)) {
            s->router_logits = CF(N * E);
            s->probs = CF(N * E);
            s->topk_ids = CI(N * K);
            s->row_idx = CI(N * K);
            s->topk_w = CF(N * K);
            s->sorted_row = CI(M);
            s->expanded_pos = CI(M);
            s->tokens_per_expert = CI(E);
            s->offsets = CI(E + 1);
            s->permuted = CF(M * H);
            s->gate_up = CF(M * 2 * I);
            s->act = CF(M * I);
            s->y = CF(M * H);
            gu_max = MOERL_MAX(gu_max, M * 2 * I);
            act_max = MOERL_MAX(act_max, M * I);
        } else {
            s->gate_up = CF(N * 2 * Id);
            s->act = CF(N * Id);
            gu_max = MOERL_MAX(gu_max, N * 2 * Id);
            act_max = MOERL_MAX(act_max, N * Id);
        }
    }
    a->resid_out = CF(N * H);
    a->lnf = CF(N * H);
    a->lnf_rstd = CF(N);
    a->logits = CF(N * V);
    a->logp = CF(N);
    a->entropy = CF(N);
    a->lse_head = CF(N);
    a->aux_counts = CF(E ? E : 1);
    a->aux_psum = CF(E ? E : 1);
    a->d_resid = CF(N * H);
    a->d_tmp = CF(N * H);
    a->d_tmp2 = CF(N * H);
    a->d_q = CF(N * nh * hd);
    a->d_k = CF(N * nkv * hd);
    a->d_v = CF(N * nkv * hd);
    a->d_att = CF(N * nh * hd);
    a->d_logits = CF(N * V);
    a->d_permuted = CF(M * H);
    a->d_y = CF(M * H);
    a->d_gate_up = CF(gu_max);
    a->d_act = CF(act_max);
    a->d_topk_w = CF(N * K + 1);
    a->d_router_logits = CF(N * E + 1);
    a->d_probs = CF(N * E + 1);
}

size_t model_acts_bytes(const moe_model *m, int max_tokens) {
    model_acts tmp;
    memset(&tmp, 0, sizeof tmp);
    int mp = m->cfg.max_position_embeddings > 32768 ? 32768 : m->cfg.max_position_embeddings;
    tmp.rope_max_pos = MOERL_MAX(max_tokens, mp);
    arena_t ar = {NULL, 0};
    layout(m, &tmp, &ar, max_tokens);
    return ar.used;
}

int model_acts_init(model_acts *a, const moe_model *m, int max_tokens) {
    if (max_tokens <= 0) return moerl_errorf("model_acts_init: max_tokens must be positive, got %d", max_tokens);
    memset(a, 0, sizeof *a);
    a->max_tokens = max_tokens;
    int mp = m->cfg.max_position_embeddings > 32768 ? 32768 : m->cfg.max_position_embeddings;
    a->rope_max_pos = MOERL_MAX(max_tokens, mp);
    arena_t ar = {NULL, 0};
    layout(m, a, &ar, max_tokens);
    ar.base = xalloc_aligned(ar.used);
    a->arena = ar.base;
    ar.used = 0;
    layout(m, a, &ar, max_tokens);
    rope_tables(a->rope_cos, a->rope_sin, a->rope_max_pos, m->cfg.head_dim, m->cfg.rope_theta);
    return MOERL_OK;
}

void model_acts_free(model_acts *a) {
    free(a->arena);
    memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------------------ layer pieces */

void qkv_forward(const moe_model *m, int l, const float *x, float *q_raw, float *k_raw, float *q_rstd,
                 float *k_rstd, float *q, float *k, float *v, const int *pos, const float *rope_cos,
                 const float *rope_sin, int N) {
    const moe_config *c = &m->cfg;
    const layer_views *w = &m->p.layers[l];
    const int H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
    linear_forward(q_raw, x, w->q_proj, N, H, nh * hd, 0);
    linear_forward(k_raw, x, w->k_proj, N, H, nkv * hd, 0);
    linear_forward(v, x, w->v_proj, N, H, nkv * hd, 0);
    rmsnorm_forward(q, q_rstd, q_raw, w->q_norm, N * nh, hd, c->rms_norm_eps);
    rmsnorm_forward(k, k_rstd, k_raw, w->k_norm, N * nkv, hd, c->rms_norm_eps);
    rope_forward(q, pos, rope_cos, rope_sin, N, nh, hd);
    rope_forward(k, pos, rope_cos, rope_sin, N, nkv, hd);
}

void mlp_forward(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N, float *counts,
                 float *psum) {
    const moe_config *c = &m->cfg;
    const layer_views *w = &m->p.layers[l];
    const int H = c->hidden_size;
    if (w->router) {
        const int E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size, M = N * K;
        linear_forward(s->router_logits, x, w->router, N, H, E, 0);
        router_topk_forward(s->probs, s->topk_ids, s->topk_w, s->row_idx, s->router_logits, N, E, K,
                            c->norm_topk_prob);
        if (counts) moe_aux_accumulate(counts, psum, s->probs, s->topk_ids, N, E, K);
        moe_permute_index(s->sorted_row, s->expanded_pos, s->tokens_per_expert, s->offsets, s->topk_ids,
                          s->row_idx, N, E, K);
        moe_permute_forward(s->permuted, x, s->sorted_row, N, M, H);
        grouped_gemm_forward(s->gate_up, s->permuted, w->experts_gate_up, s->offsets, E, H, 2 * I);
        swiglu_forward(s->act, s->gate_up, M, I);
        grouped_gemm_forward(s->y, s->act, w->experts_down, s->offsets, E, I, H);
        moe_unpermute_forward(out, s->y, s->topk_w, s->expanded_pos, N, K, H);
    } else {
        const int Id = c->intermediate_size;
        linear_forward(s->gate_up, x, w->mlp_gate_up, N, H, 2 * Id, 0);
        swiglu_forward(s->act, s->gate_up, N, Id);
        linear_forward(out, s->act, w->mlp_down, N, Id, H, 0);
    }
}

/* ------------------------------------------------------------------ forward */

int model_forward(const moe_model *m, model_acts *a, const int *tokens, const int *cu_seqlens,
                  const int *positions, int B, int N) {
    const moe_config *c = &m->cfg;
    const int H = c->hidden_size, V = c->vocab_size, hd = c->head_dim, nh = c->num_attention_heads,
              nkv = c->num_key_value_heads, E = c->num_experts;
    if (N <= 0 || N > a->max_tokens)
        return moerl_errorf("model_forward: batch of %d tokens, expected 1..%d (max_tokens)", N, a->max_tokens);
    if (B <= 0 || cu_seqlens[0] != 0 || cu_seqlens[B] != N)
        return moerl_errorf("model_forward: cu_seqlens must start at 0 and end at N=%d (B=%d)", N, B);
    for (int b = 0; b < B; b++)
        if (cu_seqlens[b + 1] < cu_seqlens[b])
            return moerl_errorf("model_forward: cu_seqlens decreases at sequence %d", b);
    for (int n = 0; n < N; n++)
        if (tokens[n] < 0 || tokens[n] >= V)
            return moerl_errorf("model_forward: token %d at position %d outside the vocabulary [0,%d)", tokens[n],
                                n, V);
    a->N = N;
    a->B = B;
    memcpy(a->cu_seqlens, cu_seqlens, (size_t)(B + 1) * sizeof(int));
    memcpy(a->tokens_in, tokens, (size_t)N * sizeof(int));
    if (positions) {
        for (int n = 0; n < N; n++) {
            if (positions[n] < 0 || positions[n] >= a->rope_max_pos)
                return moerl_errorf("model_forward: position %d outside [0,%d)", positions[n], a->rope_max_pos);
            a->pos[n] = positions[n];
        }
    } else {
        for (int b = 0; b < B; b++)
            for (int n = cu_seqlens[b]; n < cu_seqlens[b + 1]; n++) a->pos[n] = n - cu_seqlens[b];
    }
    float *x = a->layers[0].resid_in;
    for (int n = 0; n < N; n++) memcpy(x + (size_t)n * H, m->p.embed_tokens + (size_t)tokens[n] * H, H * sizeof(float));
    if (E > 0) {
        memset(a->aux_counts, 0, E * sizeof(float));
        memset(a->aux_psum, 0, E * sizeof(float));
    }
    a->n_moe_layers = 0;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        layer_acts *L = &a->layers[l];
        const layer_views *w = &m->p.layers[l];
        float *out = (l + 1 < c->num_hidden_layers) ? a->layers[l + 1].resid_in : a->resid_out;
        rmsnorm_forward(L->ln1, L->ln1_rstd, L->resid_in, w->input_layernorm, N, H, c->rms_norm_eps);
        qkv_forward(m, l, L->ln1, L->q_raw, L->k_raw, L->q_rstd, L->k_rstd, L->q, L->k, L->v, a->pos, a->rope_cos,
                    a->rope_sin, N);
        attention_forward(L->att, L->lse, L->q, L->k, L->v, a->cu_seqlens, B, N, nh, nkv, hd, scale);
        memcpy(L->resid_mid, L->resid_in, (size_t)N * H * sizeof(float));
        linear_forward(L->resid_mid, L->att, w->o_proj, N, nh * hd, H, 1);
        rmsnorm_forward(L->ln2, L->ln2_rstd, L->resid_mid, w->post_attention_layernorm, N, H, c->rms_norm_eps);
        mlp_forward(m, l, L->ln2, out, &L->mlp, N, w->router ? a->aux_counts : NULL, a->aux_psum);
        if (w->router) a->n_moe_layers++;
        const size_t NH = (size_t)N * H;
        const float *rm = L->resid_mid;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < NH; i++) out[i] += rm[i];
    }
    rmsnorm_forward(a->lnf, a->lnf_rstd, a->resid_out, m->p.norm, N, H, c->rms_norm_eps);
    linear_forward(a->logits, a->lnf, m->p.lm_head, N, H, V, 0);
    a->aux_loss = a->n_moe_layers ? moe_aux_loss(a->aux_counts, a->aux_psum, E, (int64_t)a->n_moe_layers * N) : 0.0f;
    return MOERL_OK;
}

void model_logprobs(const moe_model *m, model_acts *a, const int *targets, float temperature, int want_entropy) {
    a->targets = targets;
    a->temperature = temperature;
    logprob_forward(a->logp, want_entropy ? a->entropy : NULL, a->lse_head, a->logits, targets, a->N,
                    m->cfg.vocab_size, temperature);
}

/* ------------------------------------------------------------------ backward */

/* dout[N,H] = ∂loss/∂(mlp output); writes dx[N,H] = ∂loss/∂(mlp input) (OVERWRITTEN). */
static void mlp_backward(moe_model *m, model_acts *a, int l, const float *x, const float *dout, float *dx,
                         float aux_weight) {
    const moe_config *c = &m->cfg;
    const layer_views *w = &m->p.layers[l];
    layer_views *gw = &m->g.layers[l];
    mlp_acts *s = &a->layers[l].mlp;
    const int N = a->N, H = c->hidden_size;
    if (w->router) {
        const int E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size, M = N * K;
        moe_unpermute_backward(a->d_y, a->d_topk_w, dout, s->y, s->topk_w, s->expanded_pos, N, K, H);
        grouped_gemm_backward(a->d_act, gw->experts_down, a->d_y, s->act, w->experts_down, s->offsets, E, I, H);
        swiglu_backward(a->d_gate_up, a->d_act, s->gate_up, M, I);
        grouped_gemm_backward(a->d_permuted, gw->experts_gate_up, a->d_gate_up, s->permuted, w->experts_gate_up,
                              s->offsets, E, H, 2 * I);
        memset(dx, 0, (size_t)N * H * sizeof(float));
        moe_permute_backward(dx, a->d_permuted, s->sorted_row, N, M, H);
        const float *dprobs = NULL;
        if (aux_weight != 0.0f) {
            moe_aux_backward(a->d_probs, a->aux_counts, N, E, (int64_t)a->n_moe_layers * N, aux_weight);
            dprobs = a->d_probs;
        }
        router_topk_backward(a->d_router_logits, a->d_topk_w, dprobs, s->probs, s->topk_ids, N, E, K,
                             c->norm_topk_prob);
        linear_backward(dx, gw->router, a->d_router_logits, x, w->router, N, H, E, 1);
    } else {
        const int Id = c->intermediate_size;
        linear_backward(a->d_act, gw->mlp_down, dout, s->act, w->mlp_down, N, Id, H, 0);
        swiglu_backward(a->d_gate_up, a->d_act, s->gate_up, N, Id);
        linear_backward(dx, gw->mlp_gate_up, a->d_gate_up, x, w->mlp_gate_up, N, H, 2 * Id, 0);
    }
}

void model_backward(moe_model *m, model_acts *a, const float *dlogp, const float *dentropy, float aux_weight) {
    const moe_config *c = &m->cfg;
    const int N = a->N, B = a->B, H = c->hidden_size, V = c->vocab_size, hd = c->head_dim,
              nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    logprob_backward(a->d_logits, dlogp, dentropy, a->logits, a->targets, N, V, a->temperature);
    linear_backward(a->d_tmp, m->g.lm_head, a->d_logits, a->lnf, m->p.lm_head, N, H, V, 0);
    rmsnorm_backward(a->d_resid, m->g.norm, a->d_tmp, a->resid_out, m->p.norm, a->lnf_rstd, N, H, 0);
    for (int l = c->num_hidden_layers - 1; l >= 0; l--) {
        layer_acts *L = &a->layers[l];
        const layer_views *w = &m->p.layers[l];
        layer_views *gw = &m->g.layers[l];
        /* MLP branch: out = resid_mid + mlp(rmsnorm(resid_mid)) */
        mlp_backward(m, a, l, L->ln2, a->d_resid, a->d_tmp, aux_weight);
        rmsnorm_backward(a->d_resid, gw->post_attention_layernorm, a->d_tmp, L->resid_mid,
                         w->post_attention_layernorm, L->ln2_rstd, N, H, 1);
        /* attention branch: resid_mid = resid_in + o_proj(att) */
        linear_backward(a->d_att, gw->o_proj, a->d_resid, L->att, w->o_proj, N, nh * hd, H, 0);
        attention_backward(a->d_q, a->d_k, a->d_v, a->d_att, L->q, L->k, L->v, L->att, L->lse, a->cu_seqlens, B, N,
                           nh, nkv, hd, scale);
        rope_backward(a->d_q, a->pos, a->rope_cos, a->rope_sin, N, nh, hd);
        rope_backward(a->d_k, a->pos, a->rope_cos, a->rope_sin, N, nkv, hd);
        rmsnorm_backward(a->d_q, gw->q_norm, a->d_q, L->q_raw, w->q_norm, L->q_rstd, N * nh, hd, 0);
        rmsnorm_backward(a->d_k, gw->k_norm, a->d_k, L->k_raw, w->k_norm, L->k_rstd, N * nkv, hd, 0);
        linear_backward(a->d_tmp, gw->q_proj, a->d_q, L->ln1, w->q_proj, N, H, nh * hd, 0);
        linear_backward(a->d_tmp, gw->k_proj, a->d_k, L->ln1, w->k_proj, N, H, nkv * hd, 1);
        linear_backward(a->d_tmp, gw->v_proj, a->d_v, L->ln1, w->v_proj, N, H, nkv * hd, 1);
        rmsnorm_backward(a->d_resid, gw->input_layernorm, a->d_tmp, L->resid_in, w->input_layernorm, L->ln1_rstd, N,
                         H, 1);
    }
    /* embedding: scatter-add rows (serial over tokens: two tokens may share an id) */
    float *gE = m->g.embed_tokens;
    const float *dr = a->d_resid;
    const int *tokens = a->tokens_in;
    for (int n = 0; n < N; n++) {
        float *row = gE + (size_t)tokens[n] * H;
        const float *d = dr + (size_t)n * H;
        for (int h = 0; h < H; h++) row[h] += d[h];
    }
}
