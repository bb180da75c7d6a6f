/* Fuzz target: trainer_state.json (src/rl/state.c, rl_state_parse), checked on its own and against
 * an expected run (n_rows 96, seed 1, a fixed fingerprint — the seed corpus uses them). A state
 * that parses is written back (rl_state_to_json, which refuses what the reader refuses) and must
 * read back to the same values. */
#include "fuzz_common.h"
#include "rl/state.h"

static int same(const rl_state *a, const rl_state *b) {
    if (a->version != b->version || a->trainer_step != b->trainer_step || a->optimizer_step != b->optimizer_step ||
        a->optimizer_skipped != b->optimizer_skipped || a->consumed_prompts != b->consumed_prompts ||
        a->feed_epoch != b->feed_epoch || a->feed_pos != b->feed_pos || a->seed != b->seed ||
        a->n_rows != b->n_rows || a->data_fingerprint != b->data_fingerprint || a->n_unconsumed != b->n_unconsumed ||
        a->samples_log_bytes != b->samples_log_bytes)
        return 0;
    for (int i = 0; i < a->n_unconsumed; i++)
        if (a->unconsumed_started[i] != b->unconsumed_started[i]) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1); /* not NUL-terminated: the parser takes a length */
    if (size) memcpy(text, data, size);
    static const rl_state_expect ex = {.n_rows = 96, .seed = 1, .data_fingerprint = 0x9a3b0c2d4e5f6071ULL};
    for (int k = 0; k < 2; k++) {
        rl_state s;
        if (rl_state_parse(&s, text, size, "ckpt/trainer_state.json", k ? &ex : NULL) != MOERL_OK) {
            fuzz_check_error();
            FUZZ_ASSERT(s.unconsumed_started == NULL, "failed parse left a list");
            continue;
        }
        if (k) FUZZ_ASSERT(s.n_rows == ex.n_rows && s.seed == ex.seed, "expectation not enforced");
        char *out = rl_state_to_json(&s);
        FUZZ_ASSERT(out != NULL, "writer refused a state the reader accepted: %s", moerl_last_error());
        rl_state back;
        FUZZ_ASSERT(rl_state_parse(&back, out, strlen(out), "again", NULL) == MOERL_OK,
                    "written state does not read back: %s", moerl_last_error());
        FUZZ_ASSERT(same(&s, &back), "round trip changed the state");
        rl_state_free(&back);
        free(out);
        rl_state_free(&s);
    }
    free(text);
    return 0;
}
