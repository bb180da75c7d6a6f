/* Qwen3-MoE parameter layout: the tensor table, views, random initialisation. */
#include "model/model.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "base/common.h"
#include "base/rng.h"
#include "kernels/cpu/kpar.h"
#include "kernels/kernels.h"

static void add_tensor(moe_model *m, int *cap, const char *name, int ndim, const int64_t *shape, int flags,
                       int layer) {
    if (m->n_tensors == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        m->tensors = xrealloc(m->tensors, (size_t)*cap * sizeof(tensor_info));
    }
    tensor_info *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    t->offset = m->n_params;
    /* keep every tensor 16-float (64-byte) aligned inside the buffer */
    m->n_params += ((size_t)t->numel + 15) & ~(size_t)15;
    t->flags = flags;
    t->layer = layer;
}

static int model_init_impl(moe_model *m, const moe_config *cfg, int with_grads, int with_params) {
    if (moe_config_validate(cfg) != MOERL_OK) return MOERL_ERR;
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    const moe_config *c = &m->cfg;
    int cap = 0;
    const int64_t H = c->hidden_size, V = c->vocab_size, hd = c->head_dim, nh = c->num_attention_heads,
                  nkv = c->num_key_value_heads, E = c->num_experts, I = c->moe_intermediate_size,
                  Id = c->intermediate_size;
    int e_lo;
    const int64_t El = moe_config_local_experts(c, &e_lo);
    char nm[96];
    add_tensor(m, &cap, "model.embed_tokens.weight", 2, (int64_t[]){V, H}, TF_DECAY | TF_EMBED, -1);
    for (int l = 0; l < c->num_hidden_layers; l++) {
#define T(suffix, nd, flags, ...) \
    (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), add_tensor(m, &cap, nm, nd, (int64_t[]){__VA_ARGS__}, flags, l))
        T("input_layernorm.weight", 1, TF_NORM, H);
        T("self_attn.q_proj.weight", 2, TF_DECAY, nh * hd, H);
        T("self_attn.k_proj.weight", 2, TF_DECAY, nkv * hd, H);
        T("self_attn.v_proj.weight", 2, TF_DECAY, nkv * hd, H);
        T("self_attn.o_proj.weight", 2, TF_DECAY, H, nh * hd);
        T("self_attn.q_norm.weight", 1, TF_NORM, hd);
        T("self_attn.k_norm.weight", 1, TF_NORM, hd);
        T("post_attention_layernorm.weight", 1, TF_NORM, H);
        if (moe_config_layer_is_moe(c, l)) {
            T("mlp.gate.weight", 2, TF_DECAY | TF_ROUTER, E, H);
            T("mlp.experts.gate_up", 3, TF_DECAY | TF_EXPERT, El, 2 * I, H); /* El: this rank's experts (EP) */
            T("mlp.experts.down", 3, TF_DECAY | TF_EXPERT, El, H, I);
        } else {
            T("mlp.gate_up_proj", 2, TF_DECAY, 2 * Id, H);
            T("mlp.down_proj", 2, TF_DECAY, H, Id);
        }
#undef T
    }
    add_tensor(m, &cap, "model.norm.weight", 1, (int64_t[]){H}, TF_NORM, -1);
    if (!c->tie_word_embeddings) add_tensor(m, &cap, "lm_head.weight", 2, (int64_t[]){V, H}, TF_DECAY, -1);
    if (with_params) {
        m->params = xalloc_aligned(m->n_params * sizeof(float));
        model_views_for(m, m->params, &m->p);
    }
    if (with_grads) m->grads = xalloc_aligned(m->n_params * sizeof(float));
    if (with_grads) model_views_for(m, m->grads, &m->g);
    return MOERL_OK;
}

int moe_config_vocab(const moe_config *c) { return c->exec.tp_size > 1 ? c->exec.tp_vocab : c->vocab_size; }

int model_init(moe_model *m, const moe_config *cfg) { return model_init_impl(m, cfg, 1, 1); }
int model_init_inference(moe_model *m, const moe_config *cfg) { return model_init_impl(m, cfg, 0, 1); }
int model_init_layout(moe_model *m, const moe_config *cfg, int with_grads) {
    return model_init_impl(m, cfg, with_grads, 0);
}

void model_pack_experts(moe_model *m) {
    const moe_config *c = &m->cfg;
    if (c->exec.no_pack || c->num_experts == 0) {
        free(m->nz);
        m->nz = NULL;
        memset(m->nz_gate_up, 0, sizeof m->nz_gate_up);
        memset(m->nz_down, 0, sizeof m->nz_down);
        return;
    }
    /* E: the experts this rank holds (all of them, or its slice under expert parallelism) */
    int e_lo;
    const int E = moe_config_local_experts(c, &e_lo), H = c->hidden_size, I = c->moe_intermediate_size,
              L = c->num_hidden_layers;
    const size_t sgu = gemm_packed_size(2 * I, H), sd = gemm_packed_size(H, I);
    if (!m->nz) {
        int n_moe = 0;
        for (int l = 0; l < L; l++) n_moe += m->p.layers[l].router != NULL;
        m->nz = xalloc_aligned((size_t)n_moe * E * (sgu + sd) * sizeof(float));
        float *q = m->nz;
        for (int l = 0; l < L; l++) {
            if (!m->p.layers[l].router) continue;
            m->nz_gate_up[l] = q;
            q += (size_t)E * sgu;
            m->nz_down[l] = q;
            q += (size_t)E * sd;
        }
    }
    /* one (layer, expert) per iteration; a weight load is outside any parallel region */
#pragma omp parallel for schedule(dynamic, 1) collapse(2) if (kpar((long)L * E, 2))
    for (int l = 0; l < L; l++) {
        for (int e = 0; e < E; e++) {
            const layer_views *w = &m->p.layers[l];
            if (!w->router) continue;
            gemm_packed_pack((float *)m->nz_gate_up[l] + (size_t)e * sgu, w->experts_gate_up + (size_t)e * 2 * I * H,
                             2 * I, H);
            gemm_packed_pack((float *)m->nz_down[l] + (size_t)e * sd, w->experts_down + (size_t)e * H * I, H, I);
        }
    }
}

void model_free_params(moe_model *m) {
    if (m->params_map) munmap(m->params_map, m->params_map_len);
    else free(m->params);
    m->params = NULL;
    m->params_map = NULL;
    m->params_map_len = 0;
}

void model_free(moe_model *m) {
    free(m->nz);
    free(m->tensors);
    model_free_params(m);
    free(m->grads);
    memset(m, 0, sizeof *m);
}

const tensor_info *model_find_tensor(const moe_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

void model_views_for(const moe_model *m, float *base, model_views *v) {
    memset(v, 0, sizeof *v);
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        float *p = base + t->offset;
        if (t->layer < 0) {
            if (strcmp(t->name, "model.embed_tokens.weight") == 0) v->embed_tokens = p;
            else if (strcmp(t->name, "model.norm.weight") == 0) v->norm = p;
            else if (strcmp(t->name, "lm_head.weight") == 0) v->lm_head = p;
            continue;
        }
        layer_views *L = &v->layers[t->layer];
        const char *s = strchr(t->name + strlen("model.layers."), '.') + 1;
        if (!strcmp(s, "input_layernorm.weight")) L->input_layernorm = p;
        else if (!strcmp(s, "self_attn.q_proj.weight")) L->q_proj = p;
        else if (!strcmp(s, "self_attn.k_proj.weight")) L->k_proj = p;
        else if (!strcmp(s, "self_attn.v_proj.weight")) L->v_proj = p;
        else if (!strcmp(s, "self_attn.o_proj.weight")) L->o_proj = p;
        else if (!strcmp(s, "self_attn.q_norm.weight")) L->q_norm = p;
        else if (!strcmp(s, "self_attn.k_norm.weight")) L->k_norm = p;
        else if (!strcmp(s, "post_attention_layernorm.weight")) L->post_attention_layernorm = p;
        else if (!strcmp(s, "mlp.gate.weight")) L->router = p;
        else if (!strcmp(s, "mlp.experts.gate_up")) L->experts_gate_up = p;
        else if (!strcmp(s, "mlp.experts.down")) L->experts_down = p;
        else if (!strcmp(s, "mlp.gate_up_proj")) L->mlp_gate_up = p;
        else if (!strcmp(s, "mlp.down_proj")) L->mlp_down = p;
        else MOERL_ASSERT(!"unknown tensor in table");
    }
    if (m->cfg.tie_word_embeddings) v->lm_head = v->embed_tokens;
}

void model_zero_grad(moe_model *m) { MOERL_ASSERT(m->grads); memset(m->grads, 0, m->n_params * sizeof(float)); }

int64_t model_num_params(const moe_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_tensors; i++) n += m->tensors[i].numel;
    return n;
}

void model_init_random(moe_model *m, uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    float std = m->cfg.initializer_range > 0 ? m->cfg.initializer_range : 0.02f;
    memset(m->params, 0, m->n_params * sizeof(float));
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        float *p = m->params + t->offset;
        if (t->flags & TF_NORM)
            for (int64_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        else
            for (int64_t j = 0; j < t->numel; j++) p[j] = std * rng_normal(&r);
    }
}

/* ------------------------------------------------------------------ HF names */

/* HF tensors per layer: 8 attention/norm tensors, then MoE: gate + 3·E experts, dense: 3. */
static int layer_hf_count(const moe_config *c, int l) {
    return 8 + (moe_config_layer_is_moe(c, l) ? 1 + 3 * c->num_experts : 3);
}

int model_hf_count(const moe_model *m) {
    const moe_config *c = &m->cfg;
    int n = 2 + (c->tie_word_embeddings ? 0 : 1);
    for (int l = 0; l < c->num_hidden_layers; l++) n += layer_hf_count(c, l);
    return n;
}

void model_hf_name(const moe_model *m, int i, char *buf, size_t bs) {
    const moe_config *c = &m->cfg;
    if (i == 0) { snprintf(buf, bs, "model.embed_tokens.weight"); return; }
    i--;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int n = layer_hf_count(c, l);
        if (i >= n) { i -= n; continue; }
        static const char *attn[8] = {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                                      "self_attn.k_norm.weight", "post_attention_layernorm.weight"};
        if (i < 8) { snprintf(buf, bs, "model.layers.%d.%s", l, attn[i]); return; }
        i -= 8;
        if (moe_config_layer_is_moe(c, l)) {
            if (i == 0) { snprintf(buf, bs, "model.layers.%d.mlp.gate.weight", l); return; }
            i--;
            static const char *ex[3] = {"gate_proj", "up_proj", "down_proj"};
            snprintf(buf, bs, "model.layers.%d.mlp.experts.%d.%s.weight", l, i / 3, ex[i % 3]);
        } else {
            static const char *dn[3] = {"gate_proj", "up_proj", "down_proj"};
            snprintf(buf, bs, "model.layers.%d.mlp.%s.weight", l, dn[i]);
        }
        return;
    }
    if (i == 0) { snprintf(buf, bs, "model.norm.weight"); return; }
    snprintf(buf, bs, "lm_head.weight");
}

float *model_hf_tensor(const moe_model *m, float *base, const char *name, int *ndim, int64_t shape[2],
                       int64_t *numel) {
    const moe_config *c = &m->cfg;
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size, Id = c->intermediate_size;
    int l, e, nc = 0;
    char part[32];
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%31[a-z_].weight%n", &l, &e, part, &nc) == 3 && nc > 0 &&
        name[nc] == 0) {
        int e_lo;
        const int El = moe_config_local_experts(c, &e_lo);
        if (l < 0 || l >= c->num_hidden_layers || !moe_config_layer_is_moe(c, l) || e < e_lo || e >= e_lo + El)
            return NULL; /* not an expert, or one another expert-parallel rank holds */
        e -= e_lo;
        char nm[96];
        int is_down = !strcmp(part, "down_proj");
        if (!is_down && strcmp(part, "gate_proj") && strcmp(part, "up_proj")) return NULL;
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%s", l, is_down ? "down" : "gate_up");
        const tensor_info *t = model_find_tensor(m, nm);
        if (!t) return NULL;
        *ndim = 2;
        if (is_down) {
            shape[0] = H; shape[1] = I; *numel = H * I;
            return base + t->offset + (size_t)e * H * I;
        }
        shape[0] = I; shape[1] = H; *numel = I * H;
        return base + t->offset + (size_t)e * 2 * I * H + (!strcmp(part, "up_proj") ? (size_t)I * H : 0);
    }
    nc = 0;
    if (sscanf(name, "model.layers.%d.mlp.%31[a-z_].weight%n", &l, part, &nc) == 2 && nc > 0 && name[nc] == 0 &&
        (!strcmp(part, "gate_proj") || !strcmp(part, "up_proj"))) {
        if (l < 0 || l >= c->num_hidden_layers || moe_config_layer_is_moe(c, l)) return NULL;
        char nm[96];
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate_up_proj", l);
        const tensor_info *t = model_find_tensor(m, nm);
        if (!t) return NULL;
        *ndim = 2; shape[0] = Id; shape[1] = H; *numel = Id * H;
        return base + t->offset + (!strcmp(part, "up_proj") ? (size_t)Id * H : 0);
    }
    nc = 0;
    if (sscanf(name, "model.layers.%d.mlp.down_proj.weight%n", &l, &nc) == 1 && nc > 0 && name[nc] == 0) {
        char nm[96];
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.down_proj", l);
        const tensor_info *t = model_find_tensor(m, nm);
        if (!t) return NULL;
        *ndim = 2; shape[0] = t->shape[0]; shape[1] = t->shape[1]; *numel = t->numel;
        return base + t->offset;
    }
    if (c->tie_word_embeddings && !strcmp(name, "lm_head.weight")) return NULL;
    const tensor_info *t = model_find_tensor(m, name);
    if (!t || (t->flags & TF_EXPERT) || strstr(name, "gate_up_proj")) return NULL;
    *ndim = t->ndim;
    shape[0] = t->shape[0]; shape[1] = t->ndim > 1 ? t->shape[1] : 0;
    *numel = t->numel;
    return base + t->offset;
}
