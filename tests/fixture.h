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

#endif
