/* The tests' shared fixture: configurations built by the real config readers, as the commands build
 * them — the keys declared by the library (model_def_keys, rl_def_keys), the test's values applied as
 * key=value overrides, then read and checked (model_config_from_keys, rl_read_config). A test states
 * only what differs from moerl's defaults; a default changed in the library reaches it. */
#ifndef MOERL_TEST_FIXTURE_H
#define MOERL_TEST_FIXTURE_H

#include <stdio.h>

#include "base/common.h"
#include "base/config.h"
#include "model/model.h"
#include "model/model_config.h"
#include "rl/rl.h"

/* Apply n "key=value" overrides to c; a refused one aborts the test (naming it). */
static inline void fx_apply(cfg *c, const char *const *kv, int n) {
    for (int i = 0; i < n; i++)
        if (cfg_apply_override(c, kv[i]) != MOERL_OK) {
            fprintf(stderr, "fixture: %s: %s\n", kv[i], moerl_last_error());
            MOERL_ASSERT(0);
        }
}

/* The architecture model.* keys give with these overrides (model_config_from_keys: validated, the
 * byte tokenizer's vocabulary at least, its bos/eos ids). */
static inline moe_config fx_model_config(const char *const *kv, int n) {
    cfg *c = cfg_new();
    model_def_keys(c);
    fx_apply(c, kv, n);
    moe_config mc;
    if (model_config_from_keys(c, NULL, &mc) != MOERL_OK) {
        fprintf(stderr, "fixture: model config: %s\n", moerl_last_error());
        MOERL_ASSERT(0);
    }
    cfg_free(c);
    return mc;
}

/* The rl_config `moerl rl` reads (rl_read_config) from its defaults and these overrides. */
static inline rl_config fx_rl_config(const char *const *kv, int n) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    fx_apply(c, kv, n);
    rl_config r;
    if (rl_read_config(c, &r) != MOERL_OK) {
        fprintf(stderr, "fixture: rl config: %s\n", moerl_last_error());
        MOERL_ASSERT(0);
    }
    cfg_free(c);
    return r;
}

#define FX_N(a) ((int)(sizeof(a) / sizeof *(a)))

/* The small model of the parallel and kernel tests: hidden 32, dense MLP 32, experts of width 16,
 * 4 heads of 8, 64 positions, moerl's other defaults (model_def_keys), then the test's overrides kv[n]
 * (later ones win), read by model_config_from_keys; the vocabulary (64 tokens, or `vocab`: below the
 * byte tokenizer's, so set after the reader's check) carries no special ids (bos = eos = -1). */
static inline moe_config fx_small_config_vocab(int vocab, const char *const *kv, int n) {
    cfg *c = cfg_new();
    model_def_keys(c);
    const char *base[] = {"model.hidden_size=32", "model.intermediate_size=32", "model.moe_intermediate_size=16",
                          "model.num_attention_heads=4", "model.head_dim=8", "model.max_position_embeddings=64"};
    fx_apply(c, base, FX_N(base));
    fx_apply(c, kv, n);
    moe_config mc;
    if (model_config_from_keys(c, NULL, &mc) != MOERL_OK) {
        fprintf(stderr, "fixture: small model config: %s\n", moerl_last_error());
        MOERL_ASSERT(0);
    }
    cfg_free(c);
    mc.vocab_size = vocab;
    mc.bos_token_id = mc.eos_token_id = -1;
    return mc;
}
static inline moe_config fx_small_config(const char *const *kv, int n) { return fx_small_config_vocab(64, kv, n); }

#endif
