/* GGUF export for llama.cpp (architecture "qwen3moe"). Format and names: gguf.h. */
#include "model/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "model/safetensors.h"

#define GGUF_ALIGN 32
enum { GT_U32 = 4, GT_F32 = 6, GT_STRING = 8 };   /* gguf_type */
enum { GGML_F32 = 0, GGML_BF16 = 30 };            /* ggml_type */

/* One output tensor: numel = n_blocks · block_len floats, block b read from
 * src + b·block_stride (strided blocks split moerl's stacked gate_up into gate and up). */
typedef struct {
    char name[64];
    int ndim;
    uint64_t ne[3];
    const float *src;
    size_t n_blocks, block_len, block_stride;
    int type;
    uint64_t offset;
} gg_tensor;

typedef struct {
    FILE *f;
    const char *path;
    int err;
} gg_out;

static void w_bytes(gg_out *o, const void *p, size_t n) {
    if (!o->err && n && fwrite(p, 1, n, o->f) != n) o->err = errno ? errno : EIO;
}
static void w_u32(gg_out *o, uint32_t v) { w_bytes(o, &v, 4); }
static void w_u64(gg_out *o, uint64_t v) { w_bytes(o, &v, 8); }
static void w_str(gg_out *o, const char *s) {
    w_u64(o, strlen(s));
    w_bytes(o, s, strlen(s));
}
static void kv_u32(gg_out *o, const char *k, uint32_t v) { w_str(o, k); w_u32(o, GT_U32); w_u32(o, v); }
static void kv_f32(gg_out *o, const char *k, float v) { w_str(o, k); w_u32(o, GT_F32); w_bytes(o, &v, 4); }
static void kv_str(gg_out *o, const char *k, const char *v) { w_str(o, k); w_u32(o, GT_STRING); w_str(o, v); }
static void w_pad(gg_out *o, uint64_t *pos) {
    static const char z[GGUF_ALIGN];
    const uint64_t p = (GGUF_ALIGN - *pos % GGUF_ALIGN) % GGUF_ALIGN;
    w_bytes(o, z, p);
    *pos += p;
}

static uint64_t gg_numel(const gg_tensor *t) { return (uint64_t)t->n_blocks * t->block_len; }
static uint64_t gg_bytes(const gg_tensor *t) { return gg_numel(t) * (t->type == GGML_BF16 ? 2 : 4); }

static void gg_add(gg_tensor *ts, int *n, const char *name, int ndim, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                   const float *src, size_t n_blocks, size_t block_len, size_t block_stride, int type) {
    gg_tensor *t = &ts[(*n)++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = ne2;
    t->src = src;
    t->n_blocks = n_blocks; t->block_len = block_len; t->block_stride = block_stride;
    t->type = ndim == 1 ? GGML_F32 : type; /* norm weights stay F32 */
}

/* What llama.cpp's qwen3moe cannot express: a dense layer, norm_topk_prob false. */
static int check_exportable(const moe_config *c) {
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (!moe_config_layer_is_moe(c, l))
            return moerl_errorf("export-gguf: layer %d is a dense MLP layer (num_experts %d, decoder_sparse_step %d, "
                                "mlp_only_layers): llama.cpp's qwen3moe needs every layer MoE",
                                l, c->num_experts, c->decoder_sparse_step);
    if (!c->norm_topk_prob)
        return moerl_errorf("export-gguf: norm_topk_prob is false; llama.cpp's qwen3moe always renormalises the "
                            "top-k routing weights (expected norm_topk_prob true)");
    return MOERL_OK;
}

/* Layer l's 12 tensors (llama.cpp's blk.l.* names) appended to ts. */
static void plan_layer(const moe_model *m, int l, int ty, gg_tensor *ts, int *n) {
    const moe_config *c = &m->cfg;
    const int H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim,
              E = c->num_experts, I = c->moe_intermediate_size;
    const layer_views *w = &m->p.layers[l];
    char nm[64];
#define T1(suffix, ptr, len) (snprintf(nm, sizeof nm, "blk.%d." suffix ".weight", l), gg_add(ts, n, nm, 1, len, 1, 1, ptr, 1, len, 0, ty))
#define T2(suffix, ptr, in, out) (snprintf(nm, sizeof nm, "blk.%d." suffix ".weight", l), gg_add(ts, n, nm, 2, in, out, 1, ptr, 1, (size_t)(in) * (out), 0, ty))
    T1("attn_norm", w->input_layernorm, H);
    T2("attn_q", w->q_proj, H, nh * hd);
    T2("attn_k", w->k_proj, H, nkv * hd);
    T2("attn_v", w->v_proj, H, nkv * hd);
    T2("attn_output", w->o_proj, nh * hd, H);
    T1("attn_q_norm", w->q_norm, hd);
    T1("attn_k_norm", w->k_norm, hd);
    T1("ffn_norm", w->post_attention_layernorm, H);
    T2("ffn_gate_inp", w->router, H, E);
#undef T1
#undef T2
    const size_t ih = (size_t)I * H;
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.weight", l);
    gg_add(ts, n, nm, 3, H, I, E, w->experts_gate_up, E, ih, 2 * ih, ty);
    snprintf(nm, sizeof nm, "blk.%d.ffn_up_exps.weight", l);
    gg_add(ts, n, nm, 3, H, I, E, w->experts_gate_up + ih, E, ih, 2 * ih, ty);
    snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.weight", l);
    gg_add(ts, n, nm, 3, I, H, E, w->experts_down, 1, (size_t)E * ih, 0, ty);
}

/* Every output tensor in file order, with its aligned data offset; *n gets the count (heap array). */
static gg_tensor *plan_tensors(const moe_model *m, int ty, int *n) {
    const moe_config *c = &m->cfg;
    const int H = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    gg_tensor *ts = xcalloc(3 + 12 * L, sizeof *ts);
    *n = 0;
    gg_add(ts, n, "token_embd.weight", 2, H, V, 1, m->p.embed_tokens, 1, (size_t)V * H, 0, ty);
    gg_add(ts, n, "output_norm.weight", 1, H, 1, 1, m->p.norm, 1, H, 0, ty);
    if (!c->tie_word_embeddings) gg_add(ts, n, "output.weight", 2, H, V, 1, m->p.lm_head, 1, (size_t)V * H, 0, ty);
    for (int l = 0; l < L; l++) plan_layer(m, l, ty, ts, n);
    uint64_t off = 0;
    for (int i = 0; i < *n; i++) {
        ts[i].offset = off;
        off += gg_bytes(&ts[i]);
        off += (GGUF_ALIGN - off % GGUF_ALIGN) % GGUF_ALIGN;
    }
    return ts;
}

/* The header: magic, version 3, counts, the 18 key-value pairs, the tensor infos, padding. */
static void write_header(gg_out *o, const moe_config *c, const gg_tensor *ts, int n) {
    const char *A = "qwen3moe.";
    char k[128];
#define K(s) (snprintf(k, sizeof k, "%s%s", A, s), k)
    const int n_kv = 18; /* the pairs written below */
    w_bytes(o, "GGUF", 4);
    w_u32(o, 3);
    w_u64(o, (uint64_t)n);
    w_u64(o, n_kv);
    kv_str(o, "general.architecture", "qwen3moe");
    kv_str(o, "general.name", "moerl export");
    kv_u32(o, "general.alignment", GGUF_ALIGN);
    kv_u32(o, K("context_length"), (uint32_t)c->max_position_embeddings);
    kv_u32(o, K("embedding_length"), (uint32_t)c->hidden_size);
    kv_u32(o, K("feed_forward_length"), (uint32_t)c->intermediate_size);
    kv_u32(o, K("block_count"), (uint32_t)c->num_hidden_layers);
    kv_u32(o, K("attention.head_count"), (uint32_t)c->num_attention_heads);
    kv_u32(o, K("attention.head_count_kv"), (uint32_t)c->num_key_value_heads);
    kv_u32(o, K("attention.key_length"), (uint32_t)c->head_dim);
    kv_u32(o, K("attention.value_length"), (uint32_t)c->head_dim);
    kv_f32(o, K("attention.layer_norm_rms_epsilon"), c->rms_norm_eps);
    kv_f32(o, K("rope.freq_base"), c->rope_theta);
    kv_u32(o, K("expert_count"), (uint32_t)c->num_experts);
    kv_u32(o, K("expert_used_count"), (uint32_t)c->num_experts_per_tok);
    kv_u32(o, K("expert_feed_forward_length"), (uint32_t)c->moe_intermediate_size);
    kv_u32(o, K("vocab_size"), (uint32_t)c->vocab_size);
    kv_str(o, "tokenizer.ggml.model", "none");
#undef K
    for (int i = 0; i < n; i++) {
        w_str(o, ts[i].name);
        w_u32(o, (uint32_t)ts[i].ndim);
        for (int d = 0; d < ts[i].ndim; d++) w_u64(o, ts[i].ne[d]);
        w_u32(o, (uint32_t)ts[i].type);
        w_u64(o, ts[i].offset);
    }
    long hdr = ftell(o->f);
    uint64_t pos = hdr < 0 ? 0 : (uint64_t)hdr;
    w_pad(o, &pos);
}

/* Each tensor's data at its aligned offset: F32 as is, BF16 rounded in chunks. */
static void write_data(gg_out *o, const gg_tensor *ts, int n) {
    enum { CHUNK = 1 << 16 };
    uint16_t *bb = xmalloc(CHUNK * sizeof *bb);
    uint64_t data_pos = 0;
    for (int i = 0; i < n && !o->err; i++) {
        const gg_tensor *t = &ts[i];
        w_pad(o, &data_pos);
        for (size_t b = 0; b < t->n_blocks; b++) {
            const float *s = t->src + b * t->block_stride;
            if (t->type == GGML_F32) {
                w_bytes(o, s, t->block_len * 4);
                continue;
            }
            for (size_t j0 = 0; j0 < t->block_len; j0 += CHUNK) {
                const size_t m0 = MOERL_MIN((size_t)CHUNK, t->block_len - j0);
                for (size_t j = 0; j < m0; j++) bb[j] = f32_to_bf16(s[j0 + j]);
                w_bytes(o, bb, m0 * 2);
            }
        }
        data_pos += gg_bytes(t);
    }
    free(bb);
}

/* Flush, fsync and close the temporary file, then rename it over path (removed on any error). */
static int finish_file(gg_out *o, const char *tmp, const char *path) {
    int rc = MOERL_OK;
    if (o->err) rc = moerl_errorf("export-gguf: cannot write '%s': %s", tmp, strerror(o->err));
    if (fflush(o->f) != 0 && rc == MOERL_OK) rc = moerl_errorf("export-gguf: cannot write '%s': %s", tmp, strerror(errno));
    if (rc == MOERL_OK && fsync(fileno(o->f)) != 0)
        rc = moerl_errorf("export-gguf: cannot fsync '%s': %s", tmp, strerror(errno));
    if (fclose(o->f) != 0 && rc == MOERL_OK) rc = moerl_errorf("export-gguf: cannot close '%s': %s", tmp, strerror(errno));
    if (rc == MOERL_OK && rename(tmp, path) != 0)
        rc = moerl_errorf("export-gguf: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (rc != MOERL_OK) unlink(tmp);
    return rc;
}

int model_export_gguf(const moe_model *m, const char *path, gguf_export_dtype dtype) {
    if (check_exportable(&m->cfg) != MOERL_OK) return MOERL_ERR;
    int n = 0;
    gg_tensor *ts = plan_tensors(m, dtype == GGUF_EXPORT_BF16 ? GGML_BF16 : GGML_F32, &n);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    gg_out o = {fopen(tmp, "wb"), tmp, 0};
    if (!o.f) {
        free(ts);
        return moerl_errorf("export-gguf: cannot create '%s': %s", tmp, strerror(errno));
    }
    static char fbuf[1 << 20];
    setvbuf(o.f, fbuf, _IOFBF, sizeof fbuf);
    write_header(&o, &m->cfg, ts, n);
    write_data(&o, ts, n);
    free(ts);
    return finish_file(&o, tmp, path);
}
