/* Checkpoint loading modes (model_load_opts, src/model/checkpoint.h): mmap (default; a moerl F32 file in
 * the buffer's layout is adopted as the parameter buffer with no copy, anything else converted
 * from the mapping in windows that are dropped behind), copy (mapped, converted, nothing dropped)
 * and read (read() into a heap buffer). Every mode must give bit-identical parameters for F32
 * single-file, F32 sharded and BF16 checkpoints, adoption must happen exactly when the layout
 * allows it, writes to an adopted buffer must never reach the file, and broken files must fail
 * with the same clear messages in every mode. All comparisons are exact (bits): loading only
 * copies F32 and widens BF16. */
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "fixture.h"
#include "test.h"

static char g_tmp[1024];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }
static void rm_rf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }
static int msg_has(const char *a) { return strstr(moerl_last_error(), a) != NULL; }

static moe_config small_config(int head_dim) {
    char hd[64];
    snprintf(hd, sizeof hd, "model.head_dim=%d", head_dim);
    const char *kv[] = {"model.hidden_size=64", "model.intermediate_size=96", "model.moe_intermediate_size=32",
                        "model.num_hidden_layers=3", "model.num_key_value_heads=2", hd, "model.num_experts=4",
                        "model.num_experts_per_tok=2",
                        "model.mlp_only_layers=[1]", /* one dense layer: its gate_up/down take the other naming path */
                        "model.router_aux_loss_coef=0"};
    return fx_small_config_vocab(272, kv, FX_N(kv));
}

/* Bits of every tensor equal (padding between tensors is not compared). */
static int same_params(const moe_model *a, const moe_model *b) {
    for (int i = 0; i < a->n_tensors; i++) {
        const tensor_info *t = &a->tensors[i];
        if (memcmp(a->params + t->offset, b->params + t->offset, (size_t)t->numel * sizeof(float)) != 0) return 0;
    }
    return 1;
}

static const char *MODES[] = {"mmap", "copy", "read"};
static const model_load_mode MODE_IDS[] = {MODEL_LOAD_MMAP, MODEL_LOAD_COPY, MODEL_LOAD_READ};

static model_load_opts opts_for(int k, size_t window_bytes) {
    model_load_opts o;
    model_load_opts_default(&o);
    o.mode = MODE_IDS[k];
    o.window_bytes = window_bytes;
    return o;
}

/* Load dir in each mode (and through model_load_weights, which never adopts); each result must
 * equal want bit for bit; adoption expected only in mmap mode when adopt_expected. window_bytes:
 * the conversion window (0: the default). */
static void check_modes(const moe_model *want, const char *dir, int adopt_expected, size_t window_bytes,
                        const char *what) {
    for (int k = 0; k < 3; k++) {
        const model_load_opts o = opts_for(k, window_bytes);
        moe_model m;
        int rc = model_load_hf_opts(&m, dir, 1, &o);
        CHECK(rc == MOERL_OK, "%s, mode %s: %s", what, MODES[k], moerl_last_error());
        if (rc != MOERL_OK) continue;
        CHECK(same_params(want, &m), "%s, mode %s: parameters differ", what, MODES[k]);
        const int adopted = m.params_map != NULL;
        CHECK(adopted == (adopt_expected && k == 0), "%s, mode %s: adopted the mapping = %d, expected %d",
              what, MODES[k], adopted, adopt_expected && k == 0);
        if (adopted) {
            CHECK(((uintptr_t)m.params & 63) == 0, "%s: adopted buffer is not 64-byte aligned", what);
            CHECK(m.p.embed_tokens == m.params, "%s: views not moved onto the adopted buffer", what);
        }
        moe_model inf;
        rc = model_load_hf_opts(&inf, dir, 0, &o);
        CHECK(rc == MOERL_OK && inf.grads == NULL && same_params(want, &inf) &&
                  (inf.params_map != NULL) == (adopt_expected && k == 0),
              "%s, mode %s: model_load_hf_inference: %s", what, MODES[k],
              rc == MOERL_OK ? "grads, parameters or adoption differ" : moerl_last_error());
        if (rc == MOERL_OK) model_free(&inf);
        moe_model w;
        MOERL_ASSERT(model_init(&w, &want->cfg) == MOERL_OK);
        CHECK(model_load_weights_opts(&w, dir, &o) == MOERL_OK && w.params_map == NULL && same_params(want, &w),
              "%s, mode %s: model_load_weights: %s", what, MODES[k], moerl_last_error());
        model_free(&w);
        model_free(&m);
    }
}

/* A copy of src's tensors in a heap model (to compare BF16 loads against one reference). */
static void load_reference(moe_model *ref, const char *dir) {
    const model_load_opts o = opts_for(2, 0); /* read */
    MOERL_ASSERT(model_load_hf_opts(ref, dir, 1, &o) == MOERL_OK);
}

static void test_round_trips(void) {
    /* head_dim 16: every tensor a multiple of 16 floats, so an F32 file is the buffer's layout;
     * head_dim 8: q_norm/k_norm are padded in the buffer, so the file cannot be adopted */
    const int hds[2] = {16, 8};
    for (int h = 0; h < 2; h++) {
        moe_config c = small_config(hds[h]);
        moe_model m;
        MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
        model_init_random(&m, 7 + h);
        char dir[1200], what[128];
        for (int variant = 0; variant < 3; variant++) { /* F32 single, F32 sharded, BF16 single */
            snprintf(dir, sizeof dir, "%s/hd%d_v%d", g_tmp, hds[h], variant);
            const int bf16 = variant == 2;
            MOERL_ASSERT(model_save_hf(&m, dir, bf16, variant == 1 ? 20000 : 0) == MOERL_OK);
            snprintf(what, sizeof what, "head_dim %d, %s", hds[h],
                     variant == 0 ? "F32 single file" : variant == 1 ? "F32 sharded" : "BF16");
            if (!bf16) {
                check_modes(&m, dir, hds[h] == 16 && variant == 0, 0, what);
            } else {
                moe_model ref;
                load_reference(&ref, dir);
                check_modes(&ref, dir, 0, 0, what);
                model_free(&ref);
            }
            /* tiny windows: many slices and dropped windows, same bits */
            snprintf(what + strlen(what), sizeof what - strlen(what), ", 4 KB windows");
            if (!bf16) {
                check_modes(&m, dir, hds[h] == 16 && variant == 0, 4096, what);
            } else {
                moe_model ref;
                load_reference(&ref, dir);
                check_modes(&ref, dir, 0, 4096, what);
                model_free(&ref);
            }
        }
        model_free(&m);
    }
}

/* Writes to an adopted buffer stay in the process (copy on write), and training-style use works. */
static void test_adopted_is_private(void) {
    moe_config c = small_config(16);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 3);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/private", g_tmp);
    MOERL_ASSERT(model_save_hf(&m, dir, 0, 0) == MOERL_OK);
    moe_model a;
    MOERL_ASSERT(model_load_hf(&a, dir) == MOERL_OK);
    CHECK(a.params_map != NULL, "the F32 file was not adopted");
    for (size_t i = 0; i < a.n_params; i++) a.params[i] += 1.0f; /* every page written */
    moe_model b;
    MOERL_ASSERT(model_load_hf(&b, dir) == MOERL_OK);
    CHECK(same_params(&m, &b), "a write to the adopted buffer reached the file");
    /* saving the adopted model over its own file: the mapping survives the atomic rename */
    MOERL_ASSERT(model_save_hf(&a, dir, 0, 0) == MOERL_OK);
    moe_model c2;
    MOERL_ASSERT(model_load_hf(&c2, dir) == MOERL_OK);
    CHECK(same_params(&a, &c2), "re-saving an adopted model over its own file");
    CHECK(same_params(&m, &b), "the older mapping changed when its file was replaced");
    model_free(&c2);
    model_free(&b);
    model_free(&a);
    model_free(&m);
}

static void corrupt_and_check(const char *dir, const char *expect, const char *what) {
    for (int k = 0; k < 3; k++) {
        const model_load_opts o = opts_for(k, 0);
        moe_model m;
        int rc = model_load_hf_opts(&m, dir, 1, &o);
        CHECK(rc == MOERL_ERR && msg_has(expect), "%s, mode %s: expected an error with '%s', got rc %d: %s",
              what, MODES[k], expect, rc, rc == MOERL_ERR ? moerl_last_error() : "(loaded)");
        if (rc == MOERL_OK) model_free(&m);
    }
}

static void test_broken_files(void) {
    moe_config c = small_config(16);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 5);
    char dir[1200], st[1300];
    snprintf(dir, sizeof dir, "%s/broken", g_tmp);
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    /* truncated by 4 bytes */
    MOERL_ASSERT(model_save_hf(&m, dir, 0, 0) == MOERL_OK);
    struct stat sb;
    MOERL_ASSERT(stat(st, &sb) == 0);
    MOERL_ASSERT(truncate(st, sb.st_size - 4) == 0);
    corrupt_and_check(dir, "file is truncated", "truncated by 4 bytes");
    /* cut inside the header */
    MOERL_ASSERT(truncate(st, 100) == 0);
    corrupt_and_check(dir, "is beyond the file", "cut inside the header");
    /* shorter than the length field */
    MOERL_ASSERT(truncate(st, 5) == 0);
    corrupt_and_check(dir, "need at least 8", "5-byte file");
    /* header bytes overwritten */
    MOERL_ASSERT(model_save_hf(&m, dir, 0, 0) == MOERL_OK);
    FILE *f = fopen(st, "r+b");
    MOERL_ASSERT(f && fseek(f, 8, SEEK_SET) == 0 && fwrite("#!", 1, 2, f) == 2);
    fclose(f);
    corrupt_and_check(dir, "header is not valid JSON", "corrupt header");
    /* a bad mode name names its source (the CLI passes "environment variable MOERL_LOAD") */
    model_load_mode mode = MODEL_LOAD_COPY;
    CHECK(model_load_mode_parse("fast", "environment variable MOERL_LOAD", &mode) == MOERL_ERR &&
              msg_has("MOERL_LOAD='fast'") && msg_has("mmap") && mode == MODEL_LOAD_COPY,
          "bad MOERL_LOAD: %s", moerl_last_error());
    model_free(&m);
}

/* Mode names, and the process-wide options the plain loaders (model_load_hf, ...) use. */
static void test_load_options(void) {
    for (int k = 0; k < 3; k++) {
        model_load_mode mode = (model_load_mode)-1;
        CHECK(model_load_mode_parse(MODES[k], "mode", &mode) == MOERL_OK && mode == MODE_IDS[k] &&
                  !strcmp(model_load_mode_name(mode), MODES[k]),
              "mode '%s' parses and prints back", MODES[k]);
    }
    model_load_mode mode = MODEL_LOAD_READ;
    CHECK(model_load_mode_parse(NULL, "mode", &mode) == MOERL_OK && mode == MODEL_LOAD_MMAP, "no mode: mmap");
    mode = MODEL_LOAD_READ;
    CHECK(model_load_mode_parse("", "mode", &mode) == MOERL_OK && mode == MODEL_LOAD_MMAP, "empty mode: mmap");
    model_load_opts o;
    model_get_load_opts(&o);
    CHECK(o.mode == MODEL_LOAD_MMAP && o.window_bytes == 0, "process default: mmap, default window");
    /* an adoptable F32 file: adopted under the default, not under "read" set process-wide */
    moe_config c = small_config(16);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 9);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/options", g_tmp);
    MOERL_ASSERT(model_save_hf(&m, dir, 0, 0) == MOERL_OK);
    moe_model a;
    MOERL_ASSERT(model_load_hf(&a, dir) == MOERL_OK);
    CHECK(a.params_map != NULL && same_params(&m, &a), "default options adopt the mapping");
    model_free(&a);
    const model_load_opts rd = opts_for(2, 4096);
    model_set_load_opts(&rd);
    MOERL_ASSERT(model_load_hf(&a, dir) == MOERL_OK);
    CHECK(a.params_map == NULL && same_params(&m, &a), "process-wide read mode: no adoption, same bits");
    model_free(&a);
    MOERL_ASSERT(model_load_hf_inference(&a, dir) == MOERL_OK);
    CHECK(a.params_map == NULL && a.grads == NULL && same_params(&m, &a), "process-wide read mode (inference)");
    model_free(&a);
    model_get_load_opts(&o);
    CHECK(o.mode == MODEL_LOAD_READ && o.window_bytes == 4096, "model_get_load_opts returns what was set");
    model_load_opts_default(&o);
    model_set_load_opts(&o);
    MOERL_ASSERT(model_load_hf(&a, dir) == MOERL_OK);
    CHECK(a.params_map != NULL, "restored default adopts again");
    model_free(&a);
    model_free(&m);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "%s/moerl_test_load_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    MOERL_ASSERT(moerl_mkdirs(g_tmp) == MOERL_OK);
    test_round_trips();
    test_adopted_is_private();
    test_broken_files();
    test_load_options();
    rm_rf(g_tmp);
    TEST_MAIN_END();
}
