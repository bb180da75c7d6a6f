/* Checkpoint I/O: config.json parsing (defaults, types, consistency), HF checkpoints written by
 * PyTorch (tests/ref/gen_checkpoint.py) loaded into the stacked moerl layout, save → load round
 * trips (single file and sharded, F32 and BF16), and malformed checkpoints rejected with messages
 * naming the tensor, the shapes and the file. All comparisons are exact: loading only widens
 * (bf16/f16 → f32 is exact) and saving F32 copies bits, BF16 rounds with f32_to_bf16. */
#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test.h"

static char g_tmp[1024];

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d && *d ? d : "build/testdata";
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) moerl_fatal("cannot create %s", path);
    fputs(text, f);
    fclose(f);
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* A fresh empty directory under the test's temporary root. */
static void fresh_dir(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_tmp, name);
    MOERL_ASSERT(moerl_mkdirs(out) == MOERL_OK);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }
static void rm_rf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static int count_matching(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, needle)) n++;
    if (d) closedir(d);
    return n;
}

static int msg_has(const char *a) { return strstr(moerl_last_error(), a) != NULL; }

/* ------------------------------------------------------------------------- config.json */

/* Write {"model_type": "qwen3_moe", <extra>} to DIR/name and load it. */
static int load_cfg_text(moe_config *c, const char *name, const char *body, char *path_out, size_t cap) {
    snprintf(path_out, cap, "%s/%s", g_tmp, name);
    write_text(path_out, body);
    return moe_config_load(c, path_out);
}

static void expect_cfg_error(const char *what, const char *body, const char *w1, const char *w2) {
    moe_config c;
    char p[2048];
    int rc = load_cfg_text(&c, "bad_config.json", body, p, sizeof p);
    CHECK(rc == MOERL_ERR, "%s: accepted", what);
    if (rc != MOERL_ERR) return;
    if (getenv("MOERL_TEST_VERBOSE")) printf("  %-32s -> %s\n", what, moerl_last_error());
    CHECK(msg_has(p), "%s: message does not name the file: %s", what, moerl_last_error());
    CHECK(msg_has(w1), "%s: message lacks '%s': %s", what, w1, moerl_last_error());
    if (w2) CHECK(msg_has(w2), "%s: message lacks '%s': %s", what, w2, moerl_last_error());
}

static void test_config(void) {
    moe_config c;
    char p[2048];
    /* every field absent: Qwen3MoeConfig defaults */
    int rc = load_cfg_text(&c, "min.json", "{\"model_type\": \"qwen3_moe\"}", p, sizeof p);
    CHECK(rc == MOERL_OK, "minimal config: %s", moerl_last_error());
    if (rc == MOERL_OK) {
        CHECK(c.vocab_size == 151936 && c.hidden_size == 2048 && c.intermediate_size == 6144 &&
                  c.num_hidden_layers == 24 && c.num_attention_heads == 32 && c.num_key_value_heads == 4 &&
                  c.head_dim == 64 && c.decoder_sparse_step == 1 && c.moe_intermediate_size == 768 &&
                  c.num_experts_per_tok == 8 && c.num_experts == 128 && c.norm_topk_prob == 0 &&
                  c.n_mlp_only_layers == 0 && c.rms_norm_eps == 1e-6f && c.rope_theta == 10000.0f &&
                  c.tie_word_embeddings == 0 && c.router_aux_loss_coef == 0.001f && c.initializer_range == 0.02f &&
                  c.max_position_embeddings == 32768 && c.bos_token_id == -1 && c.eos_token_id == -1,
              "defaults differ from Qwen3MoeConfig");
    }
    /* null for the nullable fields: num_key_value_heads = num_attention_heads, head_dim = H/nh */
    rc = load_cfg_text(&c, "nulls.json",
                       "{\"model_type\": \"qwen3_moe\", \"num_attention_heads\": 8, \"hidden_size\": 256, "
                       "\"num_key_value_heads\": null, \"head_dim\": null, \"mlp_only_layers\": null, "
                       "\"eos_token_id\": null}", p, sizeof p);
    CHECK(rc == MOERL_OK && c.num_key_value_heads == 8 && c.head_dim == 32 && c.eos_token_id == -1,
          "null handling: %s", moerl_last_error());
    /* the Qwen3-30B-A3B config.json (values from the Hugging Face repository Qwen/Qwen3-30B-A3B's config.json) with HF's extra fields */
    rc = load_cfg_text(&c, "a3b.json",
                       "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false, "
                       "\"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"decoder_sparse_step\": 1, "
                       "\"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 2048, "
                       "\"initializer_range\": 0.02, \"intermediate_size\": 6144, \"max_position_embeddings\": 40960, "
                       "\"max_window_layers\": 48, \"mlp_only_layers\": [], \"model_type\": \"qwen3_moe\", "
                       "\"moe_intermediate_size\": 768, \"norm_topk_prob\": true, \"num_attention_heads\": 32, "
                       "\"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48, "
                       "\"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": 1e-06, "
                       "\"rope_scaling\": null, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001, "
                       "\"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
                       "\"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false, "
                       "\"vocab_size\": 151936}", p, sizeof p);
    CHECK(rc == MOERL_OK, "Qwen3-30B-A3B config: %s", moerl_last_error());
    if (rc == MOERL_OK) {
        CHECK(c.num_hidden_layers == 48 && c.head_dim == 128 && c.norm_topk_prob == 1 && c.rope_theta == 1e6f &&
                  c.bos_token_id == 151643 && c.eos_token_id == 151645 && c.max_position_embeddings == 40960,
              "A3B fields");
        int all_moe = 1;
        for (int l = 0; l < 48; l++) all_moe &= moe_config_layer_is_moe(&c, l);
        CHECK(all_moe, "every A3B layer is MoE");
        /* save → load gives the same struct */
        char sp[2048];
        snprintf(sp, sizeof sp, "%s/saved_config.json", g_tmp);
        moe_config d;
        CHECK(moe_config_save(&c, sp) == MOERL_OK && moe_config_load(&d, sp) == MOERL_OK &&
                  memcmp(&c, &d, sizeof c) == 0,
              "config save/load round trip: %s", moerl_last_error());
        char *text = NULL;
        if (moerl_read_file(sp, &text, NULL) == MOERL_OK) {
            CHECK(strstr(text, "\"model_type\": \"qwen3_moe\"") && strstr(text, "\"Qwen3MoeForCausalLM\"") &&
                      strstr(text, "\"rms_norm_eps\": 1e-6") && strstr(text, "\"head_dim\": 128"),
                  "saved config.json lacks HF fields:\n%s", text);
            free(text);
        }
        CHECK(count_matching(g_tmp, ".tmp.") == 0, "config save left a temporary file");
    }
    /* the MoE-layer rule: l ∉ mlp_only_layers, E > 0, (l+1) % step == 0 */
    rc = load_cfg_text(&c, "step.json",
                       "{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 6, \"decoder_sparse_step\": 2, "
                       "\"mlp_only_layers\": [3]}", p, sizeof p);
    CHECK(rc == MOERL_OK, "sparse-step config: %s", moerl_last_error());
    if (rc == MOERL_OK) {
        int want[6] = {0, 1, 0, 0, 0, 1}, ok = 1;
        for (int l = 0; l < 6; l++) ok &= moe_config_layer_is_moe(&c, l) == want[l];
        CHECK(ok, "moe_config_layer_is_moe with step 2 and mlp_only_layers [3]");
        c.num_experts = 0;
        CHECK(!moe_config_layer_is_moe(&c, 1), "no experts → dense");
    }

    expect_cfg_error("wrong type (string for int)", "{\"model_type\": \"qwen3_moe\", \"hidden_size\": \"2048\"}",
                     "'hidden_size' must be an integer", "found a string");
    expect_cfg_error("real for int", "{\"model_type\": \"qwen3_moe\", \"head_dim\": 2.5}", "'head_dim'", "integer");
    expect_cfg_error("string for float", "{\"model_type\": \"qwen3_moe\", \"rms_norm_eps\": \"1e-6\"}",
                     "'rms_norm_eps' must be a number", NULL);
    expect_cfg_error("int for bool", "{\"model_type\": \"qwen3_moe\", \"norm_topk_prob\": 1}",
                     "'norm_topk_prob' must be a boolean", "found an integer");
    expect_cfg_error("null for non-nullable", "{\"model_type\": \"qwen3_moe\", \"vocab_size\": null}", "'vocab_size'",
                     "found null");
    expect_cfg_error("mlp_only_layers not array", "{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": {}}",
                     "'mlp_only_layers'", "array");
    expect_cfg_error("mlp_only_layers out of range", "{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [0, 24]}",
                     "mlp_only_layers[1]", "out of range");
    expect_cfg_error("eos list", "{\"model_type\": \"qwen3_moe\", \"eos_token_id\": [1, 2]}", "'eos_token_id'",
                     "found an array");
    expect_cfg_error("heads not a multiple of kv heads", "{\"model_type\": \"qwen3_moe\", \"num_key_value_heads\": 5}",
                     "num_attention_heads", "multiple of 'num_key_value_heads'");
    expect_cfg_error("top-k above experts", "{\"model_type\": \"qwen3_moe\", \"num_experts\": 4}",
                     "'num_experts_per_tok' = 8 exceeds 'num_experts' = 4", NULL);
    expect_cfg_error("non-positive size", "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 0}", "'hidden_size'",
                     "positive");
    expect_cfg_error("too many layers", "{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 300}",
                     "'num_hidden_layers'", "256");
    expect_cfg_error("odd head_dim", "{\"model_type\": \"qwen3_moe\", \"head_dim\": 63}", "'head_dim'", "even");
    expect_cfg_error("wrong model_type", "{\"model_type\": \"qwen2_moe\"}", "\"qwen2_moe\"", "expected \"qwen3_moe\"");
    expect_cfg_error("missing model_type", "{\"hidden_size\": 64}", "'model_type'", "missing");
    expect_cfg_error("unsupported activation", "{\"model_type\": \"qwen3_moe\", \"hidden_act\": \"gelu\"}",
                     "'hidden_act'", "silu");
    expect_cfg_error("rope scaling", "{\"model_type\": \"qwen3_moe\", \"rope_scaling\": {\"type\": \"yarn\"}}",
                     "'rope_scaling'", NULL);
    expect_cfg_error("not JSON", "{\"model_type\": \"qwen3_moe\",", "not valid JSON", NULL);
    expect_cfg_error("not an object", "[1]", "JSON object", NULL);
    expect_cfg_error("duplicate key", "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 8, \"hidden_size\": 16}",
                     "duplicate", NULL);
    snprintf(p, sizeof p, "%s/no_such_config.json", g_tmp);
    CHECK(moe_config_load(&c, p) == MOERL_ERR && msg_has(p), "missing config file: %s", moerl_last_error());
    /* validate alone (hand-built configs) */
    moe_config v;
    CHECK(load_cfg_text(&v, "v.json", "{\"model_type\": \"qwen3_moe\"}", p, sizeof p) == MOERL_OK, "base config");
    v.num_key_value_heads = 3;
    CHECK(moe_config_validate(&v) == MOERL_ERR && msg_has("num_key_value_heads"), "validate nh %% nkv");
}

/* ------------------------------------------------------------------------- helpers on models */

static moe_config small_config(int tie) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 29;
    c.hidden_size = 16;
    c.intermediate_size = 20;
    c.moe_intermediate_size = 6;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 6;
    c.num_experts = 5;
    c.num_experts_per_tok = 2;
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = 1;
    c.tie_word_embeddings = tie;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 5e5f;
    c.router_aux_loss_coef = 0.01f;
    c.initializer_range = 0.5f; /* wide values so bf16 rounding changes most of them */
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.n_mlp_only_layers = 1;
    c.mlp_only_layers[0] = 2;
    return c;
}

/* Every tensor of b equals a (bf16: a rounded through bf16), bit for bit. Returns mismatches. */
static int compare_models(const moe_model *a, const moe_model *b, int bf16, const char *what) {
    int bad = 0;
    if (a->n_tensors != b->n_tensors || memcmp(&a->cfg, &b->cfg, sizeof a->cfg) != 0) {
        fprintf(stderr, "%s: config or tensor table differs\n", what);
        return 1;
    }
    for (int i = 0; i < a->n_tensors; i++) {
        const tensor_info *t = &a->tensors[i];
        const tensor_info *u = model_find_tensor(b, t->name);
        if (!u || u->numel != t->numel) {
            bad++;
            continue;
        }
        const float *x = a->params + t->offset, *y = b->params + u->offset;
        for (int64_t j = 0; j < t->numel; j++) {
            float want = bf16 ? bf16_to_f32(f32_to_bf16(x[j])) : x[j];
            if (memcmp(&want, &y[j], 4) != 0) {
                if (bad++ < 3)
                    fprintf(stderr, "%s: %s[%lld] = %.9g, want %.9g\n", what, t->name, (long long)j, (double)y[j],
                            (double)want);
                break;
            }
        }
    }
    return bad;
}

/* The loaded model equals the moerl-layout tensors PyTorch stacked (exact). */
static void check_against_expected(const moe_model *m, const char *expected_path, const char *what) {
    st_file f;
    int rc = st_open(&f, expected_path);
    CHECK(rc == MOERL_OK, "%s: reference missing (run tests/ref/gen_checkpoint.py): %s", what, moerl_last_error());
    if (rc != MOERL_OK) return;
    CHECK(f.n_tensors == m->n_tensors, "%s: reference has %d tensors, model %d", what, f.n_tensors, m->n_tensors);
    int bad = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const st_tensor *t = &f.tensors[i];
        const tensor_info *u = model_find_tensor(m, t->name);
        int shape_ok = u && u->ndim == t->ndim;
        for (int d = 0; shape_ok && d < t->ndim; d++) shape_ok = u->shape[d] == t->shape[d];
        if (!shape_ok) {
            if (bad++ < 3) fprintf(stderr, "%s: tensor %s absent or shaped differently in the model\n", what, t->name);
            continue;
        }
        float *x = xmalloc((size_t)t->numel * sizeof(float) + 4);
        st_to_f32(t, x);
        if (memcmp(x, m->params + u->offset, (size_t)t->numel * sizeof(float)) != 0 && bad++ < 3)
            fprintf(stderr, "%s: tensor %s differs from the torch-stacked reference\n", what, t->name);
        free(x);
    }
    CHECK(bad == 0, "%s: %d tensors differ from the PyTorch reference", what, bad);
    st_close(&f);
}

/* ------------------------------------------------------------------------- PyTorch checkpoints */

static void test_torch_checkpoints(void) {
    char dir[2048], exp[2048];
    moe_model m;
    snprintf(dir, sizeof dir, "%s/ckpt_hf", testdata());
    snprintf(exp, sizeof exp, "%s/ckpt_hf_expected.safetensors", testdata());
    int rc = model_load_hf(&m, dir);
    CHECK(rc == MOERL_OK, "loading the PyTorch checkpoint %s: %s", dir, moerl_last_error());
    if (rc == MOERL_OK) {
        CHECK(m.cfg.head_dim == 12 && m.cfg.tie_word_embeddings && m.cfg.n_mlp_only_layers == 1 &&
                  m.cfg.mlp_only_layers[0] == 1 && !moe_config_layer_is_moe(&m.cfg, 1) &&
                  moe_config_layer_is_moe(&m.cfg, 2) && m.cfg.num_experts == 4,
              "ckpt_hf config");
        check_against_expected(&m, exp, "ckpt_hf (tied, F32, shuffled order)");

        /* save in HF layout again: every HF tensor is bit-identical to the one PyTorch wrote */
        char out[2048];
        fresh_dir(out, sizeof out, "resaved");
        CHECK(model_save_hf(&m, out, 0, 0) == MOERL_OK, "re-save: %s", moerl_last_error());
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/model.safetensors", dir);
        snprintf(b, sizeof b, "%s/model.safetensors", out);
        st_file fa, fb;
        if (st_open(&fa, a) == MOERL_OK) {
            if (st_open(&fb, b) == MOERL_OK) {
                int bad = fa.n_tensors != fb.n_tensors;
                for (int i = 0; i < fa.n_tensors; i++) {
                    const st_tensor *x = &fa.tensors[i], *y = st_find(&fb, x->name);
                    if (!y || y->dtype != ST_F32 || y->ndim != x->ndim || y->numel != x->numel ||
                        memcmp(x->data, y->data, (size_t)x->numel * 4) != 0) {
                        if (bad++ < 3) fprintf(stderr, "re-saved tensor %s differs\n", x->name);
                    }
                }
                CHECK(bad == 0, "re-saved HF tensors differ from PyTorch's (%d)", bad);
                CHECK(st_find(&fb, "lm_head.weight") == NULL, "tied model saved an lm_head");
                st_close(&fb);
            }
            st_close(&fa);
        }
        model_free(&m);
    }

    snprintf(dir, sizeof dir, "%s/ckpt_hf_sharded", testdata());
    snprintf(exp, sizeof exp, "%s/ckpt_hf_sharded_expected.safetensors", testdata());
    rc = model_load_hf(&m, dir);
    CHECK(rc == MOERL_OK, "loading the sharded PyTorch checkpoint %s: %s", dir, moerl_last_error());
    if (rc == MOERL_OK) {
        CHECK(!m.cfg.tie_word_embeddings && m.cfg.decoder_sparse_step == 2 && moe_config_layer_is_moe(&m.cfg, 1) &&
                  !moe_config_layer_is_moe(&m.cfg, 2),
              "ckpt_hf_sharded config");
        check_against_expected(&m, exp, "ckpt_hf_sharded (untied, BF16 + F16, 3 shards)");
        /* BF16 re-save: the BF16 tensors keep PyTorch's bits (bf16 → f32 → bf16 is the identity), the F16
         * norms are rounded to bf16 */
        char out[2048];
        fresh_dir(out, sizeof out, "resaved_bf16");
        CHECK(model_save_hf(&m, out, 1, 4096) == MOERL_OK, "re-save bf16: %s", moerl_last_error());
        moe_model m2;
        CHECK(model_load_hf(&m2, out) == MOERL_OK && compare_models(&m, &m2, 1, "bf16 re-save") == 0,
              "bf16 re-save of a bf16/f16 checkpoint");
        model_free(&m2);
        model_free(&m);
    }
}

/* ------------------------------------------------------------------------- round trips */

static void test_roundtrip(void) {
    for (int tie = 0; tie <= 1; tie++) {
        moe_config c = small_config(tie);
        moe_model m;
        if (model_init(&m, &c) != MOERL_OK) {
            CHECK(0, "model_init: %s", moerl_last_error());
            return;
        }
        model_init_random(&m, 1234 + tie);
        for (int bf16 = 0; bf16 <= 1; bf16++) {
            for (int sharded = 0; sharded <= 1; sharded++) {
                char dir[2048], what[128];
                snprintf(what, sizeof what, "round trip tie=%d bf16=%d sharded=%d", tie, bf16, sharded);
                snprintf(dir, sizeof dir, "%s/rt_%d_%d_%d/nested", g_tmp, tie, bf16, sharded); /* created */
                const uint64_t shard_bytes = sharded ? 3000 : 0;
                int rc = model_save_hf(&m, dir, bf16, shard_bytes);
                CHECK(rc == MOERL_OK, "%s: save: %s", what, moerl_last_error());
                if (rc != MOERL_OK) continue;
                char p[4096];
                snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
                int has_index = exists(p);
                snprintf(p, sizeof p, "%s/model.safetensors", dir);
                int has_single = exists(p);
                int n_shards = count_matching(dir, "-of-");
                CHECK(sharded ? (has_index && !has_single && n_shards > 2) : (!has_index && has_single && n_shards == 0),
                      "%s: layout index=%d single=%d shards=%d", what, has_index, has_single, n_shards);
                CHECK(count_matching(dir, ".tmp.") == 0, "%s: temporary files left", what);
                if (sharded) {
                    /* each shard holds at most shard_bytes of data unless one tensor alone is larger */
                    DIR *d = opendir(dir);
                    struct dirent *e;
                    int over = 0;
                    while (d && (e = readdir(d))) {
                        if (!strstr(e->d_name, "-of-")) continue;
                        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                        st_file f;
                        if (st_open(&f, p) != MOERL_OK) {
                            over++;
                            continue;
                        }
                        uint64_t data = 0;
                        for (int i = 0; i < f.n_tensors; i++) data += f.tensors[i].end - f.tensors[i].begin;
                        if (data > shard_bytes && f.n_tensors > 1) over++;
                        st_close(&f);
                    }
                    if (d) closedir(d);
                    CHECK(over == 0, "%s: %d shards over the size limit", what, over);
                }
                moe_model m2;
                rc = model_load_hf(&m2, dir);
                CHECK(rc == MOERL_OK, "%s: load: %s", what, moerl_last_error());
                if (rc == MOERL_OK) {
                    CHECK(compare_models(&m, &m2, bf16, what) == 0, "%s: parameters differ", what);
                    CHECK(m2.cfg.tie_word_embeddings == tie && m2.p.lm_head &&
                              (tie ? m2.p.lm_head == m2.p.embed_tokens : m2.p.lm_head != m2.p.embed_tokens),
                          "%s: tie flag", what);
                    model_free(&m2);
                }
                /* load_weights into an existing model of the same config */
                moe_model m3;
                model_init(&m3, &c);
                CHECK(model_load_weights(&m3, dir) == MOERL_OK && compare_models(&m, &m3, bf16, what) == 0,
                      "%s: model_load_weights: %s", what, moerl_last_error());
                model_free(&m3);
            }
        }
        /* switching layouts in one directory removes the other layout's files */
        char dir[2048];
        fresh_dir(dir, sizeof dir, tie ? "switch_tied" : "switch");
        char p[4096];
        CHECK(model_save_hf(&m, dir, 0, 0) == MOERL_OK, "switch: single");
        CHECK(model_save_hf(&m, dir, 0, 2000) == MOERL_OK, "switch: sharded");
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        CHECK(!exists(p), "stale model.safetensors kept after a sharded save");
        int many = count_matching(dir, "-of-");
        CHECK(model_save_hf(&m, dir, 1, 6000) == MOERL_OK, "switch: fewer shards");
        int fewer = count_matching(dir, "-of-");
        CHECK(fewer < many && fewer > 1, "stale shards kept (%d before, %d after)", many, fewer);
        moe_model m2;
        CHECK(model_load_hf(&m2, dir) == MOERL_OK && compare_models(&m, &m2, 1, "after switch") == 0,
              "load after shard-count change: %s", moerl_last_error());
        model_free(&m2);
        CHECK(model_save_hf(&m, dir, 0, 0) == MOERL_OK, "switch: back to single");
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        CHECK(!exists(p) && count_matching(dir, "-of-") == 0, "stale index or shards kept after a single-file save");
        model_free(&m);
    }
}

/* ------------------------------------------------------------------------- malformed checkpoints */

typedef struct {
    const char *drop;      /* tensor to leave out */
    const char *add;       /* extra tensor to add (shape [2, 3]) */
    const char *transpose; /* tensor stored with its two dims swapped */
    const char *perturb;   /* tensor with one value changed */
    const char *copy_to;   /* add a copy of model.embed_tokens.weight under this name */
} rewrite_opts;

/* Rewrite SRC/model.safetensors into DST/model.safetensors with the edits in o; copy config.json. */
static void rewrite(const char *src, const char *dst, rewrite_opts o) {
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    st_file f;
    MOERL_ASSERT(st_open(&f, p) == MOERL_OK);
    MOERL_ASSERT(moerl_mkdirs(dst) == MOERL_OK);
    float **bufs = xcalloc((size_t)f.n_tensors + 1, sizeof *bufs);
    static float extra[6] = {1, 2, 3, 4, 5, 6};
    st_writer *w = st_writer_new();
    for (int i = 0; i < f.n_tensors; i++) {
        const st_tensor *t = &f.tensors[i];
        if (o.drop && !strcmp(t->name, o.drop)) continue;
        bufs[i] = xmalloc((size_t)t->numel * sizeof(float) + 4);
        st_to_f32(t, bufs[i]);
        int64_t shape[ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (o.transpose && !strcmp(t->name, o.transpose)) {
            int64_t s = shape[0];
            shape[0] = shape[1];
            shape[1] = s;
        }
        if (o.perturb && !strcmp(t->name, o.perturb)) bufs[i][0] += 1.0f;
        st_writer_add(w, t->name, bufs[i], t->ndim, shape, ST_F32);
        if (o.copy_to && !strcmp(t->name, "model.embed_tokens.weight"))
            st_writer_add(w, o.copy_to, bufs[i], t->ndim, t->shape, ST_F32);
    }
    if (o.add) st_writer_add(w, o.add, extra, 2, (int64_t[]){2, 3}, ST_F32);
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    MOERL_ASSERT(st_writer_finish(w, p) == MOERL_OK);
    st_writer_free(w);
    for (int i = 0; i < f.n_tensors; i++) free(bufs[i]);
    free(bufs);
    st_close(&f);
    char *cfg = NULL;
    size_t len = 0;
    snprintf(p, sizeof p, "%s/config.json", src);
    MOERL_ASSERT(moerl_read_file(p, &cfg, &len) == MOERL_OK);
    snprintf(p, sizeof p, "%s/config.json", dst);
    write_text(p, cfg);
    free(cfg);
}

/* Load must fail with a message containing the words (NULL words skipped). */
static void expect_load_error(const char *what, const char *dir, const char *w1, const char *w2, const char *w3) {
    moe_model m;
    int rc = model_load_hf(&m, dir);
    CHECK(rc == MOERL_ERR, "%s: loaded a bad checkpoint", what);
    if (rc != MOERL_ERR) {
        model_free(&m);
        return;
    }
    if (getenv("MOERL_TEST_VERBOSE")) printf("  %-32s -> %s\n", what, moerl_last_error());
    CHECK(m.params == NULL && m.tensors == NULL, "%s: failed load left the model allocated", what);
    const char *w[3] = {w1, w2, w3};
    for (int i = 0; i < 3; i++)
        if (w[i]) CHECK(msg_has(w[i]), "%s: message lacks '%s': %s", what, w[i], moerl_last_error());
}

/* Rewrite config.json of dir with field set to the JSON value text. */
static void set_config_field(const char *dir, const char *field, const char *json_value) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t e;
    json_t *root = json_load_file(p, 0, &e);
    MOERL_ASSERT(root);
    json_t *v = json_loads(json_value, JSON_DECODE_ANY, &e);
    MOERL_ASSERT(v);
    json_object_set_new(root, field, v);
    MOERL_ASSERT(json_dump_file(root, p, JSON_INDENT(1)) == 0);
    json_decref(root);
}

static void test_errors(void) {
    moe_config c = small_config(0);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 99);
    char good[2048], d[2048];
    fresh_dir(good, sizeof good, "good");
    CHECK(model_save_hf(&m, good, 0, 0) == MOERL_OK, "save good: %s", moerl_last_error());

    snprintf(d, sizeof d, "%s/missing", g_tmp);
    rewrite(good, d, (rewrite_opts){.drop = "model.layers.0.mlp.experts.3.up_proj.weight"});
    expect_load_error("missing tensor", d, "'model.layers.0.mlp.experts.3.up_proj.weight' is missing", "[6, 16]", d);

    snprintf(d, sizeof d, "%s/unknown", g_tmp);
    rewrite(good, d, (rewrite_opts){.add = "model.layers.0.mlp.experts.5.gate_proj.weight"});
    expect_load_error("unknown tensor", d, "unknown tensor 'model.layers.0.mlp.experts.5.gate_proj.weight'",
                      "model.safetensors", NULL);

    snprintf(d, sizeof d, "%s/shape", g_tmp);
    rewrite(good, d, (rewrite_opts){.transpose = "model.layers.1.self_attn.o_proj.weight"});
    expect_load_error("wrong shape", d, "'model.layers.1.self_attn.o_proj.weight'", "has shape [24, 16], expected [16, 24]",
                      "model.safetensors");

    snprintf(d, sizeof d, "%s/badcfg", g_tmp);
    rewrite(good, d, (rewrite_opts){0});
    {
        moe_model ok;
        CHECK(model_load_hf(&ok, d) == MOERL_OK, "unmodified rewrite loads: %s", moerl_last_error());
        if (ok.params) model_free(&ok);
    }
    set_config_field(d, "num_experts", "\"5\"");
    expect_load_error("bad config.json field", d, "config.json", "'num_experts' must be an integer", "found a string");
    set_config_field(d, "num_experts", "5");
    set_config_field(d, "num_key_value_heads", "3");
    expect_load_error("inconsistent config.json", d, "config.json", "num_key_value_heads", NULL);

    /* a config whose tensors differ: the first mismatching tensor is named with both shapes */
    snprintf(d, sizeof d, "%s/othercfg", g_tmp);
    rewrite(good, d, (rewrite_opts){0});
    set_config_field(d, "moe_intermediate_size", "7");
    expect_load_error("config/weights mismatch", d, "model.layers.0.mlp.experts.0.gate_proj.weight",
                      "has shape [6, 16], expected [7, 16]", NULL);
    /* model_load_weights checks DIR/config.json against the model, and leaves params unchanged */
    {
        float *before = xmalloc(m.n_params * sizeof(float));
        memcpy(before, m.params, m.n_params * sizeof(float));
        CHECK(model_load_weights(&m, d) == MOERL_ERR && msg_has("'moe_intermediate_size' is 7 in the file but 6"),
              "load_weights config mismatch: %s", moerl_last_error());
        snprintf(d, sizeof d, "%s/missing", g_tmp);
        CHECK(model_load_weights(&m, d) == MOERL_ERR && msg_has("missing"), "load_weights missing tensor");
        CHECK(memcmp(before, m.params, m.n_params * sizeof(float)) == 0, "failed load changed the parameters");
        free(before);
    }

    /* no weights at all */
    snprintf(d, sizeof d, "%s/noweights", g_tmp);
    rewrite(good, d, (rewrite_opts){0});
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    unlink(p);
    expect_load_error("no weight files", d, "neither model.safetensors nor model.safetensors.index.json", d, NULL);
    /* a corrupt weight file: the safetensors message comes through */
    write_text(p, "garbage");
    expect_load_error("corrupt weight file", d, "truncated", p, NULL);

    /* tied: an lm_head equal to the embedding is accepted, a different one is not */
    moe_config ct = small_config(1);
    moe_model mt;
    MOERL_ASSERT(model_init(&mt, &ct) == MOERL_OK);
    model_init_random(&mt, 5);
    char tied[2048];
    fresh_dir(tied, sizeof tied, "tied");
    CHECK(model_save_hf(&mt, tied, 0, 0) == MOERL_OK, "save tied");
    snprintf(d, sizeof d, "%s/tied_head", g_tmp);
    rewrite(tied, d, (rewrite_opts){.copy_to = "lm_head.weight"});
    moe_model m2;
    CHECK(model_load_hf(&m2, d) == MOERL_OK && compare_models(&mt, &m2, 0, "tied with lm_head") == 0,
          "tied checkpoint with an equal lm_head.weight: %s", moerl_last_error());
    if (m2.params) model_free(&m2);
    snprintf(d, sizeof d, "%s/tied_head_diff", g_tmp);
    rewrite(tied, d, (rewrite_opts){.copy_to = "lm_head.weight"});
    {
        /* perturb the copied head: rewrite again from the copy, changing lm_head only */
        char d2[2048];
        snprintf(d2, sizeof d2, "%s/tied_head_diff2", g_tmp);
        rewrite(d, d2, (rewrite_opts){.perturb = "lm_head.weight"});
        expect_load_error("tied lm_head differs", d2, "lm_head.weight differs from model.embed_tokens.weight", NULL,
                          NULL);
    }
    model_free(&mt);

    /* sharded: index inconsistencies */
    char sh[2048];
    fresh_dir(sh, sizeof sh, "sharded");
    CHECK(model_save_hf(&m, sh, 0, 4000) == MOERL_OK, "save sharded");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", sh);
    json_error_t je;
    json_t *idx = json_load_file(p, 0, &je);
    MOERL_ASSERT(idx);
    json_t *wm = json_object_get(idx, "weight_map");
    json_object_set_new(wm, "model.norm.weight", json_string("model-00001-of-99999.safetensors"));
    MOERL_ASSERT(json_dump_file(idx, p, 0) == 0);
    expect_load_error("index names a missing shard", sh, "model-00001-of-99999.safetensors", "cannot open", NULL);
    const char *first_file = NULL;
    json_t *v;
    const char *k;
    json_object_foreach(wm, k, v) {
        if (!first_file) first_file = json_string_value(v);
    }
    char ff[256];
    snprintf(ff, sizeof ff, "%s", first_file);
    json_object_set_new(wm, "model.norm.weight", json_string(ff)); /* wrong shard (norm is in the last one) */
    MOERL_ASSERT(json_dump_file(idx, p, 0) == 0);
    expect_load_error("index maps to the wrong shard", sh, "'model.norm.weight' is mapped to", "but is stored in",
                      NULL);
    json_object_del(wm, "model.norm.weight");
    MOERL_ASSERT(json_dump_file(idx, p, 0) == 0);
    expect_load_error("shard tensor missing from index", sh, "'model.norm.weight'", "missing from weight_map", NULL);
    json_object_set_new(wm, "model.norm.weight", json_string("../evil.safetensors"));
    MOERL_ASSERT(json_dump_file(idx, p, 0) == 0);
    expect_load_error("index escapes the directory", sh, "not a file name inside", NULL, NULL);
    json_decref(idx);
    write_text(p, "{\"weight_map\": []}");
    expect_load_error("index without a weight_map object", sh, "weight_map", p, NULL);

    model_free(&m);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "%s/ckpt_tmp_XXXXXX", testdata());
    if (moerl_mkdirs(testdata()) != MOERL_OK || !mkdtemp(g_tmp)) {
        fprintf(stderr, "cannot create a temporary directory under %s\n", testdata());
        return 1;
    }
    test_config();
    test_torch_checkpoints();
    test_roundtrip();
    test_errors();
    rm_rf(g_tmp);
    TEST_MAIN_END();
}
