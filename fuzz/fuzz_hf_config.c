/* Fuzz target: a Hugging Face config.json (src/model/moe_config.c, moe_config_load). A config that
 * loads passes moe_config_validate, and written back with moe_config_save it loads to a config
 * that saves to the same text. */
#include "fuzz_common.h"
#include "fuzz_tmpdir.h"
#include "model/model.h"

static char *slurp(const char *name) {
    char p[600], *t = NULL;
    size_t n = 0;
    snprintf(p, sizeof p, "%s/%s", fuzz_tmpdir(), name);
    if (moerl_read_file(p, &t, &n) != MOERL_OK) {
        fprintf(stderr, "%s\n", moerl_last_error());
        abort();
    }
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("config.json", data, size);
    char in[600], p1[600], p2[600];
    snprintf(in, sizeof in, "%s/config.json", fuzz_tmpdir());
    snprintf(p1, sizeof p1, "%s/saved1.json", fuzz_tmpdir());
    snprintf(p2, sizeof p2, "%s/saved2.json", fuzz_tmpdir());
    moe_config c, c2;
    if (moe_config_load(&c, in) != MOERL_OK) {
        fuzz_check_error();
        return 0;
    }
    FUZZ_ASSERT(moe_config_validate(&c) == MOERL_OK, "loaded config does not validate: %s", moerl_last_error());
    FUZZ_ASSERT(moe_config_save(&c, p1) == MOERL_OK, "save: %s", moerl_last_error());
    FUZZ_ASSERT(moe_config_load(&c2, p1) == MOERL_OK, "saved config does not load: %s", moerl_last_error());
    FUZZ_ASSERT(moe_config_save(&c2, p2) == MOERL_OK, "save 2: %s", moerl_last_error());
    char *t1 = slurp("saved1.json"), *t2 = slurp("saved2.json");
    FUZZ_ASSERT(strcmp(t1, t2) == 0, "config changes on save/load:\n%s\n---\n%s", t1, t2);
    free(t1);
    free(t2);
    return 0;
}
