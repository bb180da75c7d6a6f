/* Checkpoint folder metadata (model/ckpt_meta.h). */
#include "model/ckpt_meta.h"

#include <jansson.h>
#include <stdio.h>
#include <unistd.h>

#include "base/common.h"

int checkpoint_policy_version(const char *dir, int *version) {
    char p[4200];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    *version = 0;
    if (access(p, F_OK) != 0) return MOERL_OK;
    json_error_t je;
    json_t *s = json_load_file(p, 0, &je);
    if (!s) return moerl_errorf("%s:%d: invalid JSON: %s", p, je.line, je.text);
    json_t *v = json_object_get(s, "version");
    int ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 2147483647;
    if (ok) *version = (int)json_integer_value(v);
    json_decref(s);
    if (!ok) return moerl_errorf("%s: field 'version': expected an integer ≥ 0 (the policy version)", p);
    return MOERL_OK;
}

int checkpoint_vocab_size(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t je;
    json_t *o = json_load_file(p, 0, &je);
    const json_t *v = o ? json_object_get(o, "vocab_size") : NULL;
    int n = json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30)
                ? (int)json_integer_value(v) : 0;
    json_decref(o);
    return n;
}
