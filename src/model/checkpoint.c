/* Hugging Face checkpoint directories ↔ the moerl parameter buffer.
 *
 * The map between the two namings (model.h): moerl stacks expert weights, HF keeps one tensor per
 * expert and projection:
 *   moerl "model.layers.{l}.mlp.experts.gate_up" [E][2I][H], expert e:
 *       rows [0, I)  ← HF "model.layers.{l}.mlp.experts.{e}.gate_proj.weight" [I, H]
 *       rows [I, 2I) ← HF "model.layers.{l}.mlp.experts.{e}.up_proj.weight"   [I, H]
 *   moerl "model.layers.{l}.mlp.experts.down" [E][H][I], expert e
 *                    ← HF "model.layers.{l}.mlp.experts.{e}.down_proj.weight" [H, I]
 *   moerl "model.layers.{l}.mlp.gate_up_proj" [2Id][H] ← HF mlp.gate_proj.weight, mlp.up_proj.weight
 *   moerl "model.layers.{l}.mlp.down_proj"    [H][Id]  ← HF mlp.down_proj.weight (".weight" added)
 *   every other tensor has the same name on both sides.
 * Each HF tensor is one contiguous block of its moerl tensor, so saving needs no copies and
 * loading converts straight into place.
 * Directory layout follows transformers' save_pretrained: config.json plus model.safetensors, or
 * model-0000k-of-0000N.safetensors shards with model.safetensors.index.json
 * ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}).
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"

/* One HF tensor and where it lives in the moerl buffer. */
typedef struct {
    char name[160];
    int ndim;
    int64_t shape[2];
    int64_t numel;
    size_t offset; /* floats into the parameter buffer */
} hf_tensor;

static void hf_push(hf_tensor **v, int *n, int *cap, const char *name, int ndim, int64_t d0, int64_t d1,
                    size_t offset) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        *v = xrealloc(*v, (size_t)*cap * sizeof **v);
    }
    hf_tensor *t = &(*v)[(*n)++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = ndim == 1 ? d0 : d0 * d1;
    t->offset = offset;
}

static int shape_is(const tensor_info *t, int ndim, int64_t a, int64_t b, int64_t c) {
    return t->ndim == ndim && t->shape[0] == a && (ndim < 2 || t->shape[1] == b) && (ndim < 3 || t->shape[2] == c);
}

/* The HF tensor list of model m, in the order of moerl's parameter buffer (offsets increasing:
 * per MoE layer every expert's gate_proj and up_proj, then every expert's down_proj). With
 * tie_word_embeddings there is no lm_head (the table has none). MOERL_ERR if the table does not
 * have the layout model.h promises (a moerl bug, reported rather than asserted). */
static int hf_plan(const moe_model *m, hf_tensor **out, int *n_out) {
    const moe_config *c = &m->cfg;
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size, Id = c->intermediate_size;
    hf_tensor *v = NULL;
    int n = 0, cap = 0;
    int64_t covered = 0, total = 0;
    char nm[160];
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        total += t->numel;
        const char *suffix = NULL;
        if (t->layer >= 0) {
            char pre[48];
            int k = snprintf(pre, sizeof pre, "model.layers.%d.", t->layer);
            if (strncmp(t->name, pre, (size_t)k) == 0) suffix = t->name + k;
        }
        if (suffix && strcmp(suffix, "mlp.experts.gate_up") == 0) {
            char dn[96];
            snprintf(dn, sizeof dn, "model.layers.%d.mlp.experts.down", t->layer);
            const tensor_info *d = model_find_tensor(m, dn);
            int e_lo; /* expert parallelism: this model's experts are [e_lo, e_lo + El), HF names global */
            const int64_t El = moe_config_local_experts(c, &e_lo);
            if (!shape_is(t, 3, El, 2 * I, H) || !d || !shape_is(d, 3, El, H, I)) {
                free(v);
                return moerl_errorf("checkpoint: internal: layer %d expert tensors do not have the shapes "
                                    "[E,2I,H] / [E,H,I] of model.h", t->layer);
            }
            /* moerl's buffer order (all local experts' gate/up rows, then all their down), so a file
             * written from this plan holds the parameters in the buffer's own order */
            for (int64_t e = e_lo; e < e_lo + El; e++) {
                size_t gu = t->offset + (size_t)((e - e_lo) * 2 * I * H);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.gate_proj.weight", t->layer, (long long)e);
                hf_push(&v, &n, &cap, nm, 2, I, H, gu);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.up_proj.weight", t->layer, (long long)e);
                hf_push(&v, &n, &cap, nm, 2, I, H, gu + (size_t)(I * H));
            }
            for (int64_t e = e_lo; e < e_lo + El; e++) {
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.down_proj.weight", t->layer, (long long)e);
                hf_push(&v, &n, &cap, nm, 2, H, I, d->offset + (size_t)((e - e_lo) * H * I));
            }
            covered += t->numel + d->numel;
        } else if (suffix && strcmp(suffix, "mlp.experts.down") == 0) {
            continue; /* emitted together with gate_up */
        } else if (suffix && strcmp(suffix, "mlp.gate_up_proj") == 0) {
            if (!shape_is(t, 2, 2 * Id, H, 0)) {
                free(v);
                return moerl_errorf("checkpoint: internal: layer %d gate_up_proj is not [2Id, H]", t->layer);
            }
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate_proj.weight", t->layer);
            hf_push(&v, &n, &cap, nm, 2, Id, H, t->offset);
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.up_proj.weight", t->layer);
            hf_push(&v, &n, &cap, nm, 2, Id, H, t->offset + (size_t)(Id * H));
            covered += t->numel;
        } else if (suffix && strcmp(suffix, "mlp.down_proj") == 0) {
            if (!shape_is(t, 2, H, Id, 0)) {
                free(v);
                return moerl_errorf("checkpoint: internal: layer %d down_proj is not [H, Id]", t->layer);
            }
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.down_proj.weight", t->layer);
            hf_push(&v, &n, &cap, nm, 2, H, Id, t->offset);
            covered += t->numel;
        } else {
            if (t->ndim < 1 || t->ndim > 2) {
                free(v);
                return moerl_errorf("checkpoint: internal: tensor '%s' has %d dims, expected 1 or 2", t->name,
                                    t->ndim);
            }
            hf_push(&v, &n, &cap, t->name, t->ndim, t->shape[0], t->ndim == 2 ? t->shape[1] : 0, t->offset);
            covered += t->numel;
        }
    }
    if (covered != total) {
        free(v);
        return moerl_errorf("checkpoint: internal: HF tensors cover %lld of %lld parameters", (long long)covered,
                            (long long)total);
    }
    *out = v;
    *n_out = n;
    return MOERL_OK;
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    int k = snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < (int)cap - 24; i++) k += snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + k, cap - k, "]");
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ------------------------------------------------------------------------- loading */

typedef struct {
    int n_files;
    st_file *files;
    char **file_names;   /* as named in the index (or "model.safetensors") */
    json_t *where;       /* name → integer (file << 32 | tensor index) */
    json_t *index_map;   /* weight_map of the index, or NULL */
} ckpt_files;

static void ckpt_files_free(ckpt_files *cf) {
    for (int i = 0; i < cf->n_files; i++) {
        st_close(&cf->files[i]);
        free(cf->file_names[i]);
    }
    free(cf->files);
    free(cf->file_names);
    json_decref(cf->where);
    json_decref(cf->index_map);
    memset(cf, 0, sizeof *cf);
}

static int ckpt_add_file(ckpt_files *cf, const char *dir, const char *fname, st_load_how how) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    cf->files = xrealloc(cf->files, (size_t)(cf->n_files + 1) * sizeof *cf->files);
    cf->file_names = xrealloc(cf->file_names, (size_t)(cf->n_files + 1) * sizeof *cf->file_names);
    st_file *f = &cf->files[cf->n_files];
    if (st_open_with(f, path, how) != MOERL_OK) return MOERL_ERR;
    cf->file_names[cf->n_files] = xstrdup(fname);
    int fi = cf->n_files++;
    for (int t = 0; t < f->n_tensors; t++) {
        const char *name = f->tensors[t].name;
        json_t *prev = json_object_get(cf->where, name);
        if (prev) {
            int pf = (int)(json_integer_value(prev) >> 32);
            return moerl_errorf("checkpoint '%s': tensor '%s' appears in both '%s' and '%s' (each tensor must be "
                                "stored once)", dir, name, cf->file_names[pf], fname);
        }
        json_object_set_new(cf->where, name, json_integer(((json_int_t)fi << 32) | t));
    }
    return MOERL_OK;
}

/* Open the single file or every shard named by the index and check the index agrees with them. */
static int ckpt_open(ckpt_files *cf, const char *dir, st_load_how how) {
    memset(cf, 0, sizeof *cf);
    cf->where = json_object();
    char single[4096], index[4096];
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    if (file_exists(single)) return ckpt_add_file(cf, dir, "model.safetensors", how); /* transformers' preference */
    if (!file_exists(index))
        return moerl_errorf("checkpoint '%s': found neither model.safetensors nor model.safetensors.index.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return moerl_errorf("checkpoint index '%s': not valid JSON: %s (line %d, column %d)", index, jerr.text,
                            jerr.line, jerr.column);
    json_t *wm = json_object_get(root, "weight_map"), *meta = json_object_get(root, "metadata");
    if (!json_is_object(root) || !wm || !json_is_object(wm)) {
        json_decref(root);
        return moerl_errorf("checkpoint index '%s': expected an object with a 'weight_map' object {tensor: file}",
                            index);
    }
    if (meta && !json_is_object(meta) && !json_is_null(meta)) {
        json_decref(root);
        return moerl_errorf("checkpoint index '%s': field 'metadata' must be an object", index);
    }
    cf->index_map = json_incref(wm);
    json_decref(root);
    const char *name;
    json_t *v;
    json_t *seen = json_object();
    int rc = MOERL_OK;
    json_object_foreach(cf->index_map, name, v) {
        if (!json_is_string(v)) {
            rc = moerl_errorf("checkpoint index '%s': weight_map['%s'] must be a file name string", index, name);
            break;
        }
        const char *fn = json_string_value(v);
        if (fn[0] == 0 || fn[0] == '/' || strstr(fn, "..")) {
            rc = moerl_errorf("checkpoint index '%s': weight_map['%s'] = '%s' is not a file name inside the "
                              "checkpoint directory", index, name, fn);
            break;
        }
        if (json_object_get(seen, fn)) continue;
        json_object_set_new(seen, fn, json_true());
        if ((rc = ckpt_add_file(cf, dir, fn, how)) != MOERL_OK) break;
    }
    json_decref(seen);
    if (rc != MOERL_OK) return rc;
    /* every index entry must be in its named shard, and every shard tensor must be indexed */
    json_object_foreach(cf->index_map, name, v) {
        json_t *w = json_object_get(cf->where, name);
        if (!w)
            return moerl_errorf("checkpoint index '%s': tensor '%s' is mapped to '%s' but that file does not "
                                "contain it", index, name, json_string_value(v));
        const char *actual = cf->file_names[json_integer_value(w) >> 32];
        if (strcmp(actual, json_string_value(v)) != 0)
            return moerl_errorf("checkpoint index '%s': tensor '%s' is mapped to '%s' but is stored in '%s'", index,
                                name, json_string_value(v), actual);
    }
    if (json_object_size(cf->where) != json_object_size(cf->index_map)) {
        json_t *w;
        json_object_foreach(cf->where, name, w) {
            if (!json_object_get(cf->index_map, name))
                return moerl_errorf("checkpoint index '%s': tensor '%s' stored in '%s' is missing from weight_map",
                                    index, name, cf->file_names[json_integer_value(w) >> 32]);
        }
    }
    return MOERL_OK;
}

static const st_tensor *ckpt_lookup(const ckpt_files *cf, const char *name, int *file) {
    json_t *w = json_object_get(cf->where, name);
    if (!w) return NULL;
    json_int_t x = json_integer_value(w);
    *file = (int)(x >> 32);
    return &cf->files[*file].tensors[x & 0xffffffff];
}

static int convertible(const st_tensor *t) { return t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16; }

/* The config fields that define the weights and the function they compute must agree. */
static int config_matches(const moe_config *a, const moe_config *file, const char *path) {
#define SAME_I(f)                                                                                            \
    if (a->f != file->f)                                                                                     \
        return moerl_errorf("checkpoint config '%s' does not match the model: field '" #f "' is %d in the " \
                            "file but %d in the model", path, file->f, a->f)
#define SAME_F(f)                                                                                            \
    if (a->f != file->f)                                                                                     \
        return moerl_errorf("checkpoint config '%s' does not match the model: field '" #f "' is %g in the " \
                            "file but %g in the model", path, (double)file->f, (double)a->f)
    SAME_I(vocab_size);
    SAME_I(hidden_size);
    SAME_I(num_hidden_layers);
    SAME_I(num_attention_heads);
    SAME_I(num_key_value_heads);
    SAME_I(head_dim);
    SAME_I(num_experts);
    SAME_I(num_experts_per_tok);
    SAME_I(moe_intermediate_size);
    SAME_I(tie_word_embeddings);
    SAME_I(norm_topk_prob);
    SAME_F(rms_norm_eps);
    SAME_F(rope_theta);
#undef SAME_I
#undef SAME_F
    for (int l = 0; l < a->num_hidden_layers; l++) {
        int ma = moe_config_layer_is_moe(a, l), mf = moe_config_layer_is_moe(file, l);
        if (ma != mf)
            return moerl_errorf("checkpoint config '%s' does not match the model: layer %d is %s in the file but %s "
                                "in the model (mlp_only_layers / decoder_sparse_step)", path, l,
                                mf ? "MoE" : "dense", ma ? "MoE" : "dense");
        if (!ma && a->intermediate_size != file->intermediate_size)
            return moerl_errorf("checkpoint config '%s' does not match the model: field 'intermediate_size' is %d in "
                                "the file but %d in the model", path, file->intermediate_size, a->intermediate_size);
    }
    return MOERL_OK;
}

/* Load the weights of DIR (single file or sharded, F32/BF16/F16 → fp32) into an initialised model.
 * Every HF tensor the model needs must be present exactly once with its shape; an unknown tensor
 * is an error (except lm_head.weight of a tied model, accepted when equal to the embedding).
 * DIR/config.json, when present, must agree with m->cfg. On error the parameters are unchanged
 * (all checks run before any data is converted). Source: transformers save_pretrained layout. */
int model_check_finite(const moe_model *m, const char *where, const char *verb) {
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        const float *p = m->params + t->offset;
        for (int64_t j = 0; j < t->numel; j++)
            if (!isfinite(p[j]))
                return moerl_errorf("tensor %s %s %s has a non-finite value (%g at element %lld): the weights "
                                    "diverged or the checkpoint is corrupt", t->name, verb, where, (double)p[j],
                                    (long long)j);
    }
    return MOERL_OK;
}

/* 1 if name is "model.layers.L.mlp.experts.E.<proj>.weight" of a MoE layer with an expert E that this
 * expert-parallel slice of the model does not hold (exec.ep_size > 1): loading skips it. */
static int is_other_ranks_expert(const moe_config *c, const char *name) {
    int l, e, nc = 0, lo;
    char part[32];
    const int El = moe_config_local_experts(c, &lo);
    if (El == c->num_experts) return 0;
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%31[a-z_].weight%n", &l, &e, part, &nc) != 3 || nc <= 0 ||
        name[nc] != 0)
        return 0;
    return l >= 0 && l < c->num_hidden_layers && moe_config_layer_is_moe(c, l) && e >= 0 && e < c->num_experts &&
           (e < lo || e >= lo + El) &&
           (!strcmp(part, "gate_proj") || !strcmp(part, "up_proj") || !strcmp(part, "down_proj"));
}

/* ------------------------------------------------------------------------- load options
 * (checkpoint.h: what each mode does) */

static model_load_opts g_load_opts = {MODEL_LOAD_MMAP, 0};

void model_load_opts_default(model_load_opts *o) {
    o->mode = MODEL_LOAD_MMAP;
    o->window_bytes = 0;
}

int model_load_mode_parse(const char *v, const char *what, model_load_mode *mode) {
    if (!v || !*v || !strcmp(v, "mmap")) *mode = MODEL_LOAD_MMAP;
    else if (!strcmp(v, "copy")) *mode = MODEL_LOAD_COPY;
    else if (!strcmp(v, "read")) *mode = MODEL_LOAD_READ;
    else return moerl_errorf("%s='%s': expected mmap (default), copy or read", what, v);
    return MOERL_OK;
}

const char *model_load_mode_name(model_load_mode mode) {
    return mode == MODEL_LOAD_COPY ? "copy" : mode == MODEL_LOAD_READ ? "read" : "mmap";
}

void model_set_load_opts(const model_load_opts *o) { g_load_opts = *o; }
void model_get_load_opts(model_load_opts *o) { *o = g_load_opts; }

/* One slice of a source tensor, converted by one thread: elements [a, a+n) of src into dst. */
typedef struct {
    int file;
    const st_tensor *src;
    int64_t a, n;
    float *dst;
} load_piece;

static int cmp_piece(const void *x, const void *y) {
    const load_piece *p = x, *q = y;
    if (p->file != q->file) return p->file < q->file ? -1 : 1;
    const char *a = (const char *)p->src->data + p->a * (int64_t)st_dtype_size(p->src->dtype),
               *b = (const char *)q->src->data + q->a * (int64_t)st_dtype_size(q->src->dtype);
    return a < b ? -1 : a > b;
}

/* Convert every planned tensor into the buffer: slices of ≤ 1 Mi elements in file order, run in
 * windows of ≤ window_bytes (default 64 MB) of file bytes (threads share a window); with release,
 * each window's pages are dropped from the resident set once converted (st_release). */
static void convert_all(const ckpt_files *cf, const hf_tensor *plan, const st_tensor *const *src,
                        const int *src_file, int n, float *params, int release, size_t window_bytes) {
    /* window_bytes (model_load_opts) shrinks the window, and the slices with it, so that tests
     * exercise many windows and slices on a small model; 0: 64 MB windows of 4 MB (1 Mi-element)
     * slices */
    const size_t WINDOW = window_bytes > 0 ? window_bytes : (size_t)64 << 20;
    const int64_t SLICE = MOERL_MAX((int64_t)1, MOERL_MIN((int64_t)1 << 20, (int64_t)(WINDOW / 4)));
    int np = 0, cap = 0;
    load_piece *pc = NULL;
    for (int i = 0; i < n; i++) {
        for (int64_t a = 0; a < src[i]->numel; a += SLICE) {
            if (np == cap) {
                cap = cap ? 2 * cap : 1024;
                pc = xrealloc(pc, (size_t)cap * sizeof *pc);
            }
            pc[np++] = (load_piece){src_file[i], src[i], a, MOERL_MIN(SLICE, src[i]->numel - a),
                                    params + plan[i].offset + a};
        }
    }
    qsort(pc, (size_t)np, sizeof *pc, cmp_piece);
    for (int w0 = 0; w0 < np;) {
        size_t bytes = 0;
        int w1 = w0;
        while (w1 < np && pc[w1].file == pc[w0].file && (w1 == w0 || bytes < WINDOW)) {
            bytes += (size_t)pc[w1].n * st_dtype_size(pc[w1].src->dtype);
            w1++;
        }
#pragma omp parallel for schedule(dynamic, 1)
        for (int k = w0; k < w1; k++) {
            st_tensor t = *pc[k].src;
            const size_t es = st_dtype_size(t.dtype);
            t.data = (const char *)t.data + pc[k].a * (int64_t)es;
            t.numel = pc[k].n;
            st_to_f32(&t, pc[k].dst);
        }
        if (release) {
            const load_piece *first = &pc[w0], *last = &pc[w1 - 1];
            const size_t es = st_dtype_size(last->src->dtype);
            st_release(&cf->files[first->file],
                       (const char *)first->src->data + first->a * (int64_t)st_dtype_size(first->src->dtype),
                       (const char *)last->src->data + (last->a + last->n) * (int64_t)es);
        }
        w0 = w1;
    }
    free(pc);
}

/* Whether the one mapped file holds the whole parameter buffer in place: F32 tensors at a constant
 * byte distance from their buffer offsets (so no padding between them), that distance a multiple
 * of 64 (the buffer's alignment), and the buffer's last byte inside the file. *delta gets it. */
static int adoptable(const ckpt_files *cf, const hf_tensor *plan, const st_tensor *const *src, int n,
                     size_t n_params, size_t *delta) {
    if (cf->n_files != 1 || !cf->files[0].map || n == 0) return 0;
    const char *base = cf->files[0].map;
    const ptrdiff_t d = (const char *)src[0]->data - base - (ptrdiff_t)(plan[0].offset * sizeof(float));
    if (d < 0 || d % 64) return 0;
    for (int i = 0; i < n; i++)
        if (src[i]->dtype != ST_F32 ||
            (const char *)src[i]->data - base - (ptrdiff_t)(plan[i].offset * sizeof(float)) != d)
            return 0;
    if ((size_t)d + n_params * sizeof(float) > cf->files[0].map_len) return 0;
    *delta = (size_t)d;
    return 1;
}

/* One load's state: the plan, the open files, each planned tensor's source and file, the names
 * matched so far, and the tied lm_head found in the file (if any). */
typedef struct {
    const char *dir;
    hf_tensor *plan;
    int n;
    ckpt_files cf;
    const st_tensor **src; /* [n] */
    int *src_file;         /* [n] */
    json_t *used;          /* names of the file's tensors taken so far */
    const st_tensor *tied_head;
} load_state;

static void load_state_free(load_state *s) {
    json_decref(s->used);
    free(s->src);
    free(s->src_file);
    ckpt_files_free(&s->cf);
    free(s->plan);
}

/* DIR/config.json (when present) must match m's config. */
static int check_config_file(const moe_model *m, const char *dir) {
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    if (!file_exists(cpath)) return MOERL_OK;
    moe_config fc;
    if (moe_config_load(&fc, cpath) != MOERL_OK || config_matches(&m->cfg, &fc, cpath) != MOERL_OK) return MOERL_ERR;
    return MOERL_OK;
}

/* Find every planned tensor in the files, with the planned shape and a convertible dtype. */
static int match_plan(load_state *s) {
    for (int i = 0; i < s->n; i++) {
        const hf_tensor *h = &s->plan[i];
        int fi = -1;
        const st_tensor *t = ckpt_lookup(&s->cf, h->name, &fi);
        char want[96], got[96];
        fmt_shape(want, sizeof want, h->ndim, h->shape);
        if (!t)
            return moerl_errorf("checkpoint '%s': tensor '%s' is missing (expected shape %s)", s->dir, h->name, want);
        fmt_shape(got, sizeof got, t->ndim, t->shape);
        if (t->ndim != h->ndim || t->shape[0] != h->shape[0] || (h->ndim == 2 && t->shape[1] != h->shape[1]))
            return moerl_errorf("checkpoint '%s': tensor '%s' in '%s' has shape %s, expected %s", s->dir, h->name,
                                s->cf.file_names[fi], got, want);
        if (!convertible(t))
            return moerl_errorf("checkpoint '%s': tensor '%s' in '%s' has dtype %s, expected F32, BF16 or F16", s->dir,
                                h->name, s->cf.file_names[fi], st_dtype_name(t->dtype));
        s->src[i] = t;
        s->src_file[i] = fi;
        json_object_set_new(s->used, h->name, json_true());
    }
    return MOERL_OK;
}

/* The file's tensors outside the plan: a tied lm_head (checked, kept in s->tied_head), another
 * expert-parallel rank's experts (skipped); anything else is an unknown tensor. */
static int check_unplanned(const moe_model *m, load_state *s) {
    if (json_object_size(s->used) == json_object_size(s->cf.where)) return MOERL_OK;
    const char *name;
    json_t *w;
    int n_unknown = (int)(json_object_size(s->cf.where) - json_object_size(s->used));
    json_object_foreach(s->cf.where, name, w) {
        if (json_object_get(s->used, name)) continue;
        int fi = (int)(json_integer_value(w) >> 32);
        const st_tensor *t = &s->cf.files[fi].tensors[json_integer_value(w) & 0xffffffff];
        if (m->cfg.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) {
            const int64_t want[2] = {m->cfg.vocab_size, m->cfg.hidden_size};
            char ws[96], gs[96];
            fmt_shape(ws, sizeof ws, 2, want);
            fmt_shape(gs, sizeof gs, t->ndim, t->shape);
            if (t->ndim != 2 || t->shape[0] != want[0] || t->shape[1] != want[1] || !convertible(t))
                return moerl_errorf("checkpoint '%s': tensor 'lm_head.weight' (tied to the embedding) in '%s' has "
                                    "shape %s dtype %s, expected %s F32/BF16/F16", s->dir, s->cf.file_names[fi], gs,
                                    st_dtype_name(t->dtype), ws);
            s->tied_head = t;
            n_unknown--;
            continue;
        }
        if (is_other_ranks_expert(&m->cfg, name)) { /* expert parallelism: another rank's slice */
            n_unknown--;
            continue;
        }
        return moerl_errorf("checkpoint '%s': unknown tensor '%s' in '%s' (not part of a Qwen3-MoE model with this "
                            "config; %d unknown tensor(s) in all)", s->dir, name, s->cf.file_names[fi], n_unknown);
    }
    return MOERL_OK;
}

/* model_init_layout left no buffer: one of our own, not zero-filled first (only the padding
 * after each tensor is zeroed). */
static void alloc_params(moe_model *m) {
    const size_t bytes = m->n_params * sizeof(float);
    m->params = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!m->params) moerl_fatal("out of memory allocating %zu bytes of parameters", bytes);
    for (int i = 0; i < m->n_tensors; i++) { /* the padding after each tensor */
        const tensor_info *ti = &m->tensors[i];
        const size_t end = ti->offset + (size_t)ti->numel,
                     next = i + 1 < m->n_tensors ? m->tensors[i + 1].offset : m->n_params;
        memset(m->params + end, 0, (next - end) * sizeof(float));
    }
}

/* tie_word_embeddings: the file's lm_head (head, converted) must equal the loaded embedding bits. */
static int check_tied_head(const moe_model *m, const char *dir, const float *head, int64_t numel) {
    const tensor_info *emb = model_find_tensor(m, "model.embed_tokens.weight");
    const float *e = m->params + emb->offset;
    for (int64_t j = 0; j < numel; j++)
        if (memcmp(&e[j], &head[j], sizeof(float)) != 0)
            return moerl_errorf("checkpoint '%s': tie_word_embeddings is true but lm_head.weight differs from "
                                "model.embed_tokens.weight (element %lld: %g vs %g)", dir, (long long)j,
                                (double)head[j], (double)e[j]);
    return MOERL_OK;
}

/* All checks passed: take the mapping over as the buffer (adopt, mmap mode, one file in the
 * buffer's layout, no tied head), or convert each tensor straight into its block of the buffer;
 * then the views, and the tied head's check. */
static int fill_params(moe_model *m, load_state *s, int adopt, const model_load_opts *o) {
    float *head = NULL;
    if (s->tied_head) {
        head = xmalloc((size_t)s->tied_head->numel * sizeof(float));
        st_to_f32(s->tied_head, head);
    }
    size_t delta = 0;
    if (adopt && o->mode == MODEL_LOAD_MMAP && !s->tied_head &&
        adoptable(&s->cf, s->plan, s->src, s->n, m->n_params, &delta)) {
        model_free_params(m);
        m->params_map = s->cf.files[0].map;
        m->params_map_len = s->cf.files[0].map_len;
        m->params = (float *)((char *)s->cf.files[0].map + delta);
        s->cf.files[0].map = NULL; /* ours now: st_close leaves it mapped */
        (void)madvise(m->params_map, m->params_map_len, MADV_NORMAL);
    } else {
        if (!m->params) alloc_params(m);
        convert_all(&s->cf, s->plan, s->src, s->src_file, s->n, m->params, o->mode == MODEL_LOAD_MMAP,
                    o->window_bytes);
    }
    model_views_for(m, m->params, &m->p);
    if (m->grads) model_views_for(m, m->grads, &m->g);
    int rc = head ? check_tied_head(m, s->dir, head, s->tied_head->numel) : MOERL_OK;
    free(head);
    return rc;
}

/* check_only: the checks alone (config.json, every tensor's presence, shape and dtype, no unknown
 * tensor); nothing is read into m. o: the load options (never NULL here). */
static int load_weights(moe_model *m, const char *dir, int adopt, int check_only, const model_load_opts *o) {
    if (check_config_file(m, dir) != MOERL_OK) return MOERL_ERR;
    load_state s = {.dir = dir};
    if (hf_plan(m, &s.plan, &s.n) != MOERL_OK) return MOERL_ERR;
    int rc = ckpt_open(&s.cf, dir, o->mode == MODEL_LOAD_READ ? ST_LOAD_READ : ST_LOAD_MMAP);
    s.src = xcalloc((size_t)(s.n ? s.n : 1), sizeof *s.src);
    s.src_file = xcalloc((size_t)(s.n ? s.n : 1), sizeof *s.src_file);
    s.used = json_object();
    if (rc == MOERL_OK) rc = match_plan(&s);
    if (rc == MOERL_OK) rc = check_unplanned(m, &s);
    if (check_only) {
        load_state_free(&s);
        return rc;
    }
    if (rc == MOERL_OK) rc = fill_params(m, &s, adopt, o);
    load_state_free(&s);
    if (rc == MOERL_OK) rc = model_check_finite(m, dir, "loaded from");
    return rc;
}

static const model_load_opts *opts_or_default(const model_load_opts *o) { return o ? o : &g_load_opts; }

int model_load_weights(moe_model *m, const char *dir) { return load_weights(m, dir, 0, 0, &g_load_opts); }
int model_check_weights(moe_model *m, const char *dir) { return load_weights(m, dir, 0, 1, &g_load_opts); }
int model_load_weights_opts(moe_model *m, const char *dir, const model_load_opts *o) {
    return load_weights(m, dir, 0, 0, opts_or_default(o));
}

/* Load DIR/config.json, build the model (model_init) and load its weights; the buffer may be the
 * mapped file itself (load_weights, model_load_opts.mode). On error the model is left freed (zeroed). */
int model_load_hf_opts(moe_model *m, const char *dir, int with_grads, const model_load_opts *o) {
    moe_config c;
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    memset(m, 0, sizeof *m);
    if (moe_config_load(&c, cpath) != MOERL_OK) return MOERL_ERR;
    if (model_init_layout(m, &c, with_grads) != MOERL_OK) return moerl_error_prefix("checkpoint '%s': ", dir);
    if (load_weights(m, dir, 1, 0, opts_or_default(o)) != MOERL_OK) {
        model_free(m);
        return MOERL_ERR;
    }
    return MOERL_OK;
}

int model_load_hf(moe_model *m, const char *dir) { return model_load_hf_opts(m, dir, 1, NULL); }
int model_load_hf_inference(moe_model *m, const char *dir) { return model_load_hf_opts(m, dir, 0, NULL); }

/* ------------------------------------------------------------------------- saving */

static int is_shard_name(const char *s) {
    int a, b, k = -1;
    return sscanf(s, "model-%5d-of-%5d.safetensors%n", &a, &b, &k) == 2 && k > 0 && s[k] == 0;
}

/* Remove files of an earlier save that the new one does not use, so a reader cannot pick them up:
 * the other layout's entry point and any model-*-of-*.safetensors shard not written now. */
static int remove_stale(const char *dir, int n_shards) {
    char p[4096];
    if (n_shards == 1) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    } else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
    }
    if (unlink(p) != 0 && errno != ENOENT) return moerl_errorf("cannot remove stale '%s': %s", p, strerror(errno));
    DIR *d = opendir(dir);
    if (!d) return moerl_errorf("cannot list '%s': %s", dir, strerror(errno));
    struct dirent *ent;
    int rc = MOERL_OK;
    while ((ent = readdir(d))) {
        if (!is_shard_name(ent->d_name)) continue;
        int a = 0, b = 0;
        sscanf(ent->d_name, "model-%5d-of-%5d", &a, &b);
        if (n_shards > 1 && b == n_shards && a >= 1 && a <= n_shards) continue; /* one of ours */
        snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
        if (unlink(p) != 0 && errno != ENOENT) rc = moerl_errorf("cannot remove stale '%s': %s", p, strerror(errno));
    }
    closedir(d);
    return rc;
}

/* Save m in the HF layout to DIR (created if needed): experts split back into per-expert tensors,
 * F32 or BF16 (round to nearest even), metadata {"format": "pt"}; one model.safetensors when the
 * tensor data fits in shard_bytes (or shard_bytes == 0), else model-0000k-of-0000N.safetensors
 * shards filled greedily in HF order (a new shard starts when the next tensor would overflow the
 * current one, as transformers' shard_checkpoint does) plus model.safetensors.index.json; then
 * config.json. Every file is written atomically; stale files of an earlier save are removed. */
int model_save_hf(const moe_model *m, const char *dir, int store_bf16, uint64_t shard_bytes) {
    int e_lo;
    if (moe_config_local_experts(&m->cfg, &e_lo) != m->cfg.num_experts)
        return moerl_errorf("saving checkpoint '%s': this model holds experts %d..%d of %d only (expert parallel); "
                            "assemble the whole model first (ep_gather_model, src/parallel/ep.h)", dir, e_lo,
                            e_lo + moe_config_local_experts(&m->cfg, &e_lo) - 1, m->cfg.num_experts);
    if (model_check_finite(m, dir, "to be saved in") != MOERL_OK) return MOERL_ERR;
    if (moerl_mkdirs(dir) != MOERL_OK) return moerl_error_prefix("saving checkpoint: ");
    hf_tensor *plan = NULL;
    int n = 0;
    if (hf_plan(m, &plan, &n) != MOERL_OK) return MOERL_ERR;
    const st_dtype dt = store_bf16 ? ST_BF16 : ST_F32;
    const uint64_t es = st_dtype_size(dt);
    int *shard = xmalloc((size_t)(n ? n : 1) * sizeof *shard);
    int n_shards = 1;
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = (uint64_t)plan[i].numel * es;
        if (shard_bytes > 0 && cur > 0 && cur + b > shard_bytes) {
            n_shards++;
            cur = 0;
        }
        shard[i] = n_shards - 1;
        cur += b;
        total += b;
    }
    int rc = MOERL_OK;
    char path[4096], fname[64];
    json_t *wm = json_object();
    for (int s = 0; s < n_shards && rc == MOERL_OK; s++) {
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        st_writer *w = st_writer_new();
        st_writer_add_metadata(w, "format", "pt");
        for (int i = 0; i < n; i++) {
            if (shard[i] != s) continue;
            st_writer_add(w, plan[i].name, m->params + plan[i].offset, plan[i].ndim, plan[i].shape, dt);
            json_object_set_new(wm, plan[i].name, json_string(fname));
        }
        rc = st_writer_finish(w, path);
        st_writer_free(w);
    }
    if (rc == MOERL_OK && n_shards > 1) {
        json_t *idx = json_object(), *meta = json_object();
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        json_object_set_new(idx, "metadata", meta);
        json_object_set(idx, "weight_map", wm);
        char *s = json_dumps(idx, JSON_INDENT(2));
        json_decref(idx);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        rc = moerl_write_file_atomic(path, s, strlen(s));
        free(s);
    }
    json_decref(wm);
    if (rc == MOERL_OK) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        rc = moe_config_save(&m->cfg, path);
    }
    if (rc == MOERL_OK) rc = remove_stale(dir, n_shards);
    free(shard);
    free(plan);
    if (rc != MOERL_OK) moerl_error_prefix("saving checkpoint '%s': ", dir);
    return rc;
}
