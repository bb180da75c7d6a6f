/* Qwen3-MoE configuration: HF config.json parsing, validation and writing.
 * Field names and defaults follow transformers' Qwen3MoeConfig (configuration_qwen3_moe.py);
 * the MoE-layer rule follows Qwen3MoeDecoderLayer. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "model/model.h"

int moe_config_layer_is_moe(const moe_config *c, int l) {
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == l) return 0;
    return c->num_experts > 0 && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
}

/* Qwen3MoeConfig defaults (head_dim and num_key_value_heads are derived when absent). */
static void config_defaults(moe_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 151936;
    c->hidden_size = 2048;
    c->intermediate_size = 6144;
    c->moe_intermediate_size = 768;
    c->num_hidden_layers = 24;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 4;
    c->head_dim = 0; /* derived */
    c->num_experts = 128;
    c->num_experts_per_tok = 8;
    c->decoder_sparse_step = 1;
    c->norm_topk_prob = 0;
    c->tie_word_embeddings = 0;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    c->router_aux_loss_coef = 0.001f;
    c->initializer_range = 0.02f;
    c->bos_token_id = -1;
    c->eos_token_id = -1;
    c->n_mlp_only_layers = 0;
}

static const char *jtype(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Integer field. Absent → keep *out. null → keep *out when nullable, else a type error. */
static int get_int(json_t *root, const char *path, const char *key, int *out, int nullable) {
    json_t *v = json_object_get(root, key);
    if (!v || (nullable && json_is_null(v))) return MOERL_OK;
    if (!json_is_integer(v))
        return moerl_errorf("config '%s': field '%s' must be an integer%s, found %s", path, key,
                            nullable ? " or null" : "", jtype(v));
    json_int_t x = json_integer_value(v);
    if (x < -2147483647LL || x > 2147483647LL)
        return moerl_errorf("config '%s': field '%s' = %lld is out of the 32-bit integer range", path, key,
                            (long long)x);
    *out = (int)x;
    return MOERL_OK;
}

static int get_float(json_t *root, const char *path, const char *key, float *out) {
    json_t *v = json_object_get(root, key);
    if (!v) return MOERL_OK;
    if (!json_is_number(v))
        return moerl_errorf("config '%s': field '%s' must be a number, found %s", path, key, jtype(v));
    *out = (float)json_number_value(v);
    return MOERL_OK;
}

static int get_bool(json_t *root, const char *path, const char *key, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v) return MOERL_OK;
    if (!json_is_boolean(v))
        return moerl_errorf("config '%s': field '%s' must be a boolean (true/false), found %s", path, key, jtype(v));
    *out = json_is_true(v);
    return MOERL_OK;
}

/* Fields whose non-default values change the model in ways moerl does not implement: reject them
 * instead of silently computing a different function. */
static int check_unsupported(json_t *root, const char *path) {
    json_t *v;
    if ((v = json_object_get(root, "hidden_act")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return moerl_errorf("config '%s': field 'hidden_act' must be a string, found %s", path, jtype(v));
        if (strcmp(json_string_value(v), "silu") != 0)
            return moerl_errorf("config '%s': field 'hidden_act' is \"%s\"; moerl implements only \"silu\"", path,
                                json_string_value(v));
    }
    if ((v = json_object_get(root, "attention_bias")) && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return moerl_errorf("config '%s': field 'attention_bias' must be a boolean, found %s", path, jtype(v));
        if (json_is_true(v))
            return moerl_errorf("config '%s': field 'attention_bias' is true; moerl implements only false", path);
    }
    if ((v = json_object_get(root, "use_sliding_window")) && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return moerl_errorf("config '%s': field 'use_sliding_window' must be a boolean, found %s", path, jtype(v));
        if (json_is_true(v))
            return moerl_errorf("config '%s': field 'use_sliding_window' is true; moerl implements only full "
                                "causal attention (false)", path);
    }
    if ((v = json_object_get(root, "rope_scaling")) && !json_is_null(v))
        return moerl_errorf("config '%s': field 'rope_scaling' is %s; moerl implements only the default RoPE "
                            "(rope_scaling null)", path, jtype(v));
    return MOERL_OK;
}

/* Parse a HF config.json (model_type must be "qwen3_moe"). Missing fields take the
 * Qwen3MoeConfig defaults (head_dim = hidden_size / num_attention_heads when absent or null;
 * num_key_value_heads = 4 when absent, num_attention_heads when null, as HF); unknown fields are ignored;
 * a field of the wrong JSON type or an inconsistent value → MOERL_ERR naming the file and field.
 * Source: transformers configuration_qwen3_moe.py. */
int moe_config_load(moe_config *c, const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (moerl_read_file(path, &text, &len) != MOERL_OK) return moerl_error_prefix("loading model config: ");
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return moerl_errorf("config '%s': not valid JSON: %s (line %d, column %d)", path, jerr.text, jerr.line,
                            jerr.column);
    int rc = MOERL_ERR;
    moe_config t;
    config_defaults(&t);
    if (!json_is_object(root)) {
        moerl_errorf("config '%s': expected a JSON object, found %s", path, jtype(root));
        goto done;
    }
    json_t *mt = json_object_get(root, "model_type");
    if (!mt) {
        moerl_errorf("config '%s': required field 'model_type' is missing (expected \"qwen3_moe\")", path);
        goto done;
    }
    if (!json_is_string(mt)) {
        moerl_errorf("config '%s': field 'model_type' must be a string (\"qwen3_moe\"), found %s", path, jtype(mt));
        goto done;
    }
    if (strcmp(json_string_value(mt), "qwen3_moe") != 0) {
        moerl_errorf("config '%s': field 'model_type' is \"%s\", expected \"qwen3_moe\"", path, json_string_value(mt));
        goto done;
    }
    if (check_unsupported(root, path) != MOERL_OK) goto done;
    int nkv_null = 0, hd_set = 0;
    {
        json_t *v = json_object_get(root, "num_key_value_heads");
        nkv_null = v && json_is_null(v);
        v = json_object_get(root, "head_dim");
        hd_set = v && !json_is_null(v);
    }
    if (get_int(root, path, "vocab_size", &t.vocab_size, 0) || get_int(root, path, "hidden_size", &t.hidden_size, 0) ||
        get_int(root, path, "intermediate_size", &t.intermediate_size, 0) ||
        get_int(root, path, "moe_intermediate_size", &t.moe_intermediate_size, 0) ||
        get_int(root, path, "num_hidden_layers", &t.num_hidden_layers, 0) ||
        get_int(root, path, "num_attention_heads", &t.num_attention_heads, 0) ||
        get_int(root, path, "num_key_value_heads", &t.num_key_value_heads, 1) ||
        get_int(root, path, "head_dim", &t.head_dim, 1) || get_int(root, path, "num_experts", &t.num_experts, 0) ||
        get_int(root, path, "num_experts_per_tok", &t.num_experts_per_tok, 0) ||
        get_int(root, path, "decoder_sparse_step", &t.decoder_sparse_step, 0) ||
        get_int(root, path, "max_position_embeddings", &t.max_position_embeddings, 0) ||
        get_int(root, path, "bos_token_id", &t.bos_token_id, 1) ||
        get_int(root, path, "eos_token_id", &t.eos_token_id, 1) ||
        get_bool(root, path, "norm_topk_prob", &t.norm_topk_prob) ||
        get_bool(root, path, "tie_word_embeddings", &t.tie_word_embeddings) ||
        get_float(root, path, "rms_norm_eps", &t.rms_norm_eps) || get_float(root, path, "rope_theta", &t.rope_theta) ||
        get_float(root, path, "router_aux_loss_coef", &t.router_aux_loss_coef) ||
        get_float(root, path, "initializer_range", &t.initializer_range))
        goto done;
    if (nkv_null) t.num_key_value_heads = t.num_attention_heads; /* HF: None → num_attention_heads; absent → 4 */
    if (!hd_set) {
        if (t.num_attention_heads <= 0) {
            moerl_errorf("config '%s': field 'num_attention_heads' must be positive, found %d", path,
                         t.num_attention_heads);
            goto done;
        }
        t.head_dim = t.hidden_size / t.num_attention_heads; /* HF: hidden_size // num_attention_heads */
    }
    json_t *mlo = json_object_get(root, "mlp_only_layers");
    if (mlo && !json_is_null(mlo)) {
        if (!json_is_array(mlo)) {
            moerl_errorf("config '%s': field 'mlp_only_layers' must be an array of layer indices, found %s", path,
                         jtype(mlo));
            goto done;
        }
        if (json_array_size(mlo) > MOERL_MAX_LAYERS) {
            moerl_errorf("config '%s': field 'mlp_only_layers' has %zu entries, at most %d supported", path,
                         json_array_size(mlo), MOERL_MAX_LAYERS);
            goto done;
        }
        for (size_t i = 0; i < json_array_size(mlo); i++) {
            json_t *x = json_array_get(mlo, i);
            if (!json_is_integer(x)) {
                moerl_errorf("config '%s': field 'mlp_only_layers[%zu]' must be an integer layer index, found %s", path,
                             i, jtype(x));
                goto done;
            }
            json_int_t l = json_integer_value(x);
            if (l < 0 || l >= t.num_hidden_layers) {
                moerl_errorf("config '%s': field 'mlp_only_layers[%zu]' = %lld is out of range [0, %d) "
                             "(num_hidden_layers = %d)", path, i, (long long)l, t.num_hidden_layers,
                             t.num_hidden_layers);
                goto done;
            }
            t.mlp_only_layers[t.n_mlp_only_layers++] = (int)l;
        }
    }
    if (moe_config_validate(&t) != MOERL_OK) {
        moerl_error_prefix("config '%s': ", path);
        goto done;
    }
    *c = t;
    rc = MOERL_OK;
done:
    json_decref(root);
    return rc;
}

/* Invariants every loaded or hand-built config must satisfy (the checks of moe_config_load). */
int moe_config_validate(const moe_config *c) {
#define POS(f)                                                                                        \
    if (c->f <= 0) return moerl_errorf("field '" #f "' must be positive, found %d", c->f)
    POS(vocab_size);
    POS(hidden_size);
    POS(num_hidden_layers);
    POS(num_attention_heads);
    POS(num_key_value_heads);
    POS(head_dim);
    POS(decoder_sparse_step);
    POS(max_position_embeddings);
#undef POS
    if (c->num_hidden_layers > MOERL_MAX_LAYERS)
        return moerl_errorf("field 'num_hidden_layers' = %d exceeds the supported maximum %d", c->num_hidden_layers,
                            MOERL_MAX_LAYERS);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return moerl_errorf("field 'num_attention_heads' = %d must be a multiple of 'num_key_value_heads' = %d "
                            "(grouped-query attention)", c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim % 2 != 0)
        return moerl_errorf("field 'head_dim' = %d must be even (RoPE rotates pairs i, i + head_dim/2)", c->head_dim);
    if (c->num_experts < 0)
        return moerl_errorf("field 'num_experts' must be non-negative, found %d", c->num_experts);
    if (c->n_mlp_only_layers < 0 || c->n_mlp_only_layers > MOERL_MAX_LAYERS)
        return moerl_errorf("'mlp_only_layers' has %d entries, expected 0..%d", c->n_mlp_only_layers,
                            MOERL_MAX_LAYERS);
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] < 0 || c->mlp_only_layers[i] >= c->num_hidden_layers)
            return moerl_errorf("field 'mlp_only_layers[%d]' = %d is out of range [0, %d)", i, c->mlp_only_layers[i],
                                c->num_hidden_layers);
    int n_moe = 0, n_dense = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (moe_config_layer_is_moe(c, l)) n_moe++;
        else n_dense++;
    }
    if (c->num_experts > 0 || n_moe > 0) {
        if (c->num_experts_per_tok <= 0)
            return moerl_errorf("field 'num_experts_per_tok' must be positive, found %d", c->num_experts_per_tok);
        if (c->num_experts_per_tok > c->num_experts)
            return moerl_errorf("field 'num_experts_per_tok' = %d exceeds 'num_experts' = %d",
                                c->num_experts_per_tok, c->num_experts);
        if (c->moe_intermediate_size <= 0)
            return moerl_errorf("field 'moe_intermediate_size' must be positive, found %d", c->moe_intermediate_size);
    }
    if (n_dense > 0 && c->intermediate_size <= 0)
        return moerl_errorf("field 'intermediate_size' must be positive (the model has %d dense MLP layers), found %d",
                            n_dense, c->intermediate_size);
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
        return moerl_errorf("field 'rms_norm_eps' must be a positive finite number, found %g", (double)c->rms_norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return moerl_errorf("field 'rope_theta' must be a positive finite number, found %g", (double)c->rope_theta);
    if (!(c->router_aux_loss_coef >= 0) || !isfinite(c->router_aux_loss_coef))
        return moerl_errorf("field 'router_aux_loss_coef' must be a non-negative finite number, found %g",
                            (double)c->router_aux_loss_coef);
    if (!(c->initializer_range >= 0) || !isfinite(c->initializer_range))
        return moerl_errorf("field 'initializer_range' must be a non-negative finite number, found %g",
                            (double)c->initializer_range);
    if (c->bos_token_id < -1 || c->bos_token_id >= c->vocab_size)
        return moerl_errorf("field 'bos_token_id' = %d is out of range [0, %d) (or absent)", c->bos_token_id,
                            c->vocab_size);
    if (c->eos_token_id < -1 || c->eos_token_id >= c->vocab_size)
        return moerl_errorf("field 'eos_token_id' = %d is out of range [0, %d) (or absent)", c->eos_token_id,
                            c->vocab_size);
    const int sw[] = {c->exec.per_expert_loop, c->exec.separate_permute, c->exec.per_expert_weights,
                      c->exec.rebuild_row_idx, c->exec.no_pack};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        if (sw[i] != 0 && sw[i] != 1)
            return moerl_errorf("MoE execution switch %zu = %d, expected 0 or 1 (model.moe.* keys)", i, sw[i]);
    const int ep = c->exec.ep_size;
    if (ep > 1 && (c->num_experts % ep || c->exec.ep_rank < 0 || c->exec.ep_rank >= ep))
        return moerl_errorf("expert parallel size %d (rank %d) must divide num_experts = %d (actor.expert_parallel_size)",
                            ep, c->exec.ep_rank, c->num_experts);
    return MOERL_OK;
}

int moe_config_local_experts(const moe_config *c, int *lo) {
    const int ep = c->exec.ep_size > 1 ? c->exec.ep_size : 1, n = c->num_experts / ep;
    *lo = ep > 1 ? c->exec.ep_rank * n : 0;
    return n;
}

/* A float as the shortest decimal that reads back to the same float (1e-06, not 9.99999997e-07). */
static json_t *json_float(float x) {
    char buf[64];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)x);
        if (strtof(buf, NULL) == x) break;
    }
    return json_real(strtod(buf, NULL));
}

/* Write config.json with HF field names (model_type "qwen3_moe", architectures
 * ["Qwen3MoeForCausalLM"]) atomically (temp file + fsync + rename). */
int moe_config_save(const moe_config *c, const char *path) {
    if (moe_config_validate(c) != MOERL_OK) return moerl_error_prefix("saving config '%s': ", path);
    json_t *o = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("Qwen3MoeForCausalLM"));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string("qwen3_moe"));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(o, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "num_experts", json_integer(c->num_experts));
    json_object_set_new(o, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
    json_object_set_new(o, "decoder_sparse_step", json_integer(c->decoder_sparse_step));
    json_t *mlo = json_array();
    for (int i = 0; i < c->n_mlp_only_layers; i++) json_array_append_new(mlo, json_integer(c->mlp_only_layers[i]));
    json_object_set_new(o, "mlp_only_layers", mlo);
    json_object_set_new(o, "norm_topk_prob", json_boolean(c->norm_topk_prob));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "rms_norm_eps", json_float(c->rms_norm_eps));
    json_object_set_new(o, "rope_theta", json_float(c->rope_theta));
    json_object_set_new(o, "router_aux_loss_coef", json_float(c->router_aux_loss_coef));
    json_object_set_new(o, "initializer_range", json_float(c->initializer_range));
    if (c->bos_token_id >= 0) json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
    if (c->eos_token_id >= 0) json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "use_sliding_window", json_false());
    json_object_set_new(o, "rope_scaling", json_null());
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(o);
    size_t n = strlen(s);
    s = xrealloc(s, n + 2);
    s[n] = '\n';
    s[n + 1] = 0;
    int rc = moerl_write_file_atomic(path, s, n + 1);
    free(s);
    return rc;
}
