/* Fuzz target: config YAML and `a.b=c` overrides (src/base/config.c). Input: YAML text up to the
 * first NUL byte, then NUL-separated override strings (the first 16 are applied). Keys of every
 * type are declared, nested like moerl's real ones. Properties: a failed load or override leaves
 * the registry as it was (all-or-nothing, config.h), and the resolved config written by
 * cfg_dump_yaml_string loads back into a fresh registry to the same dump (the run folder's
 * config.yaml reproduces the run). */
#include "base/config.h"
#include "fuzz_common.h"

static cfg *declare(void) {
    cfg *c = cfg_new();
    static const int64_t layers[] = {0, 3};
    cfg_def_int(c, "rollout.n", 8, "responses per prompt");
    cfg_def_int(c, "trainer.seed", 1, "seed (64-bit)");
    cfg_def_int(c, "actor.ppo_mini_batch_size", 4, "prompts per mini-batch");
    cfg_def_float(c, "actor.optim.lr", 1e-6, "learning rate");
    cfg_def_float(c, "actor.clip_ratio_low", 0.2, "clip below");
    cfg_def_float(c, "async_training.staleness_threshold", 0.5, "staleness");
    cfg_def_bool(c, "async_training.partial_rollout", true, "partial rollout");
    cfg_def_bool(c, "algorithm.norm_adv_by_std", false, "normalise");
    cfg_def_str(c, "trainer.default_local_dir", "runs/x", "output folder");
    cfg_def_str(c, "data.train_files", NULL, "train JSONL");
    cfg_def_str(c, "async_training.mode", "async", "mode");
    cfg_def_int_list(c, "model.mlp_only_layers", layers, 2, "dense layers");
    cfg_def_int_list(c, "model.empty_list", NULL, 0, "empty by default");
    cfg_def_int(c, "a-b.c_d.e-1", -1, "odd but valid key characters");
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t ylen = nul ? (size_t)(nul - data) : size;
    char *yaml = malloc(ylen ? ylen : 1); /* exact size, not NUL-terminated: the loader takes a length */
    if (ylen) memcpy(yaml, data, ylen);
    cfg *c = declare();
    char *before = cfg_dump_yaml_string(c);
    if (cfg_load_yaml_string(c, yaml, ylen, "fuzz.yaml") != MOERL_OK) {
        fuzz_check_error();
        char *after = cfg_dump_yaml_string(c);
        FUZZ_ASSERT(strcmp(before, after) == 0, "a failed YAML load changed the registry");
        free(after);
    }
    free(before);
    /* overrides: the rest of the input, NUL-separated */
    size_t pos = nul ? ylen + 1 : size;
    int n_ov = 0;
    while (pos < size && n_ov++ < 16) { /* each override costs two dumps: a bounded number per input */
        const uint8_t *end = memchr(data + pos, 0, size - pos);
        const size_t n = end ? (size_t)(end - (data + pos)) : size - pos;
        char *ov = fuzz_strndup(data + pos, n);
        char *b = cfg_dump_yaml_string(c);
        if (cfg_apply_override(c, ov) != MOERL_OK) {
            fuzz_check_error();
            char *a = cfg_dump_yaml_string(c);
            FUZZ_ASSERT(strcmp(a, b) == 0, "a failed override '%s' changed the registry", ov);
            free(a);
        }
        free(b);
        free(ov);
        pos += n + 1;
    }
    (void)cfg_check_int32(c, "seed");
    /* the dump loads back to the same values */
    char *dump = cfg_dump_yaml_string(c);
    cfg *c2 = declare();
    FUZZ_ASSERT(cfg_load_yaml_string(c2, dump, strlen(dump), "dump.yaml") == MOERL_OK,
                "the dump does not load back: %s\n--- dump:\n%s", moerl_last_error(), dump);
    char *dump2 = cfg_dump_yaml_string(c2);
    FUZZ_ASSERT(strcmp(dump, dump2) == 0, "the dump does not round-trip:\n--- first:\n%s\n--- second:\n%s", dump, dump2);
    free(dump2);
    free(dump);
    cfg_free(c2);
    cfg_free(c);
    free(yaml);
    return 0;
}
