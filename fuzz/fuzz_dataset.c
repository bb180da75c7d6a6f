/* Fuzz target: dataset JSONL rows in verl's schema (src/data/dataset.c, dataset_load_string) and
 * the rule-based rewards that read their ground truth (src/data/rewards.c, reward_row), scored
 * against each row's "response" (or its last prompt message): both come from outside (the data
 * file and the model's output). A loaded row written back with dataset_write_row and read again
 * must be the same row (same fields, same fingerprint). */
#include <stdbool.h>

#include "data/dataset.h"
#include "data/tasks.h"
#include "fuzz_common.h"

static bool str_eq(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1); /* exact size, not NUL-terminated: the loader takes a length */
    if (size) memcpy(text, data, size);
    dataset ds;
    if (dataset_load_string(&ds, text, size, "fuzz.jsonl") != MOERL_OK) {
        fuzz_check_error();
        FUZZ_ASSERT(ds.n == 0 && ds.rows == NULL, "failed load left rows");
        free(text);
        return 0;
    }
    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    for (int64_t i = 0; i < dataset_count(&ds); i++) {
        const ds_row *r = dataset_row(&ds, i);
        FUZZ_ASSERT(dataset_write_row(f, r) == MOERL_OK, "row %lld does not write back: %s", (long long)i,
                    moerl_last_error());
        double score = -1;
        const char *resp = r->response ? r->response : r->prompt[r->n_prompt - 1].content;
        if (reward_row(r, resp, &score) == MOERL_OK)
            FUZZ_ASSERT(score >= 0.0 && score <= 1.0, "reward %g outside [0, 1]", score);
        else
            fuzz_check_error();
    }
    fclose(f);
    dataset back;
    FUZZ_ASSERT(dataset_load_string(&back, out, out_len, "back.jsonl") == MOERL_OK, "written rows do not load: %s",
                moerl_last_error());
    FUZZ_ASSERT(back.n == ds.n, "%lld rows written, %lld read back", (long long)ds.n, (long long)back.n);
    for (int64_t i = 0; i < ds.n; i++) {
        const ds_row *a = &ds.rows[i], *b = &back.rows[i];
        bool same = str_eq(a->data_source, b->data_source) && a->n_prompt == b->n_prompt &&
                    str_eq(a->ground_truth, b->ground_truth) && a->ground_truth_json == b->ground_truth_json &&
                    str_eq(a->extra_info_json, b->extra_info_json) && str_eq(a->response, b->response);
        for (int k = 0; same && k < a->n_prompt; k++)
            same = str_eq(a->prompt[k].role, b->prompt[k].role) && str_eq(a->prompt[k].content, b->prompt[k].content);
        FUZZ_ASSERT(same, "row %lld changed on the way out and back", (long long)i);
    }
    FUZZ_ASSERT(dataset_fingerprint(&ds) == dataset_fingerprint(&back), "fingerprint changed");
    dataset_free(&back);
    free(out);
    dataset_free(&ds);
    free(text);
    return 0;
}
