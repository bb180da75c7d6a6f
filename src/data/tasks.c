/* moerl — the built-in task generators' driver (see tasks.h): the family table, option checks,
 * the train/test split with no repeated problem, and the output files. The families themselves
 * are task_arith.c, task_gsm.c and task_countdown.c; the rewards rewards.c; the countdown
 * equation checker expr.c; the openai/gsm8k converter gsm8k.c.
 *
 * The row layout follows verl's examples/data_preprocess/gsm8k.py (data_source, prompt,
 * reward_model, extra_info); ideas only, no code taken. */
#include "data/tasks.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/hashset.h"
#include "base/rng.h"
#include "data/task_family.h"

int64_t task_rng_range(rng_state *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)rng_below(r, (uint64_t)(hi - lo) + 1);
}

static const struct {
    const char *name;
    task_gen_fn fn;
    const char *tools; /* the rows' "tools" (JSON text), or NULL */
} k_families[] = {
    {"arith", task_gen_arith, NULL},
    {"gsm8k-style", task_gen_gsm, NULL},
    {"countdown", task_gen_countdown, NULL},
    {"tool_arith", task_gen_tool_arith, task_tool_arith_tools},
};
#define FAMILIES_N (int)(sizeof k_families / sizeof k_families[0])

const char *const *task_families(int *n) {
    static const char *names[FAMILIES_N];
    for (int i = 0; i < FAMILIES_N; i++) names[i] = k_families[i].name;
    *n = FAMILIES_N;
    return names;
}

void task_opts_default(task_opts *o) {
    o->n_train = 1000;
    o->n_test = 100;
    o->seed = 1;
    o->arith_digits = 2;
    o->countdown_numbers = 4;
    o->countdown_max_number = 25;
    o->countdown_max_target = 100;
}

static int check_opts(const char *family, const task_opts *o) {
#define RANGE(field, lo, hi)                                                                               \
    if (o->field < (lo) || o->field > (hi))                                                                \
        return moerl_errorf("task '%s': option %s = %lld is out of range (expected %lld..%lld)", family, #field, \
                            (long long)o->field, (long long)(lo), (long long)(hi));
    RANGE(n_train, 0, 100000000)
    RANGE(n_test, 0, 100000000)
    if (strcmp(family, "arith") == 0) { RANGE(arith_digits, 1, 18) }
    if (strcmp(family, "tool_arith") == 0) { RANGE(arith_digits, 1, 9) } /* the product fits 18 digits */
    if (strcmp(family, "countdown") == 0) {
        RANGE(countdown_numbers, 2, 6)
        RANGE(countdown_max_number, 1, 1000)
        RANGE(countdown_max_target, 1, 1000000)
    }
#undef RANGE
    return MOERL_OK;
}

/* openai/gsm8k's row: the question alone (the instruction stripped), the worked answer ending
 * "#### N". */
static void write_raw_gsm8k_row(FILE *f, task_item *it) {
    size_t pl = strlen(it->prompt), il = strlen(task_gsm_instruction);
    if (pl >= il && !strcmp(it->prompt + pl - il, task_gsm_instruction)) it->prompt[pl - il] = 0;
    json_t *j = json_object();
    json_object_set_new(j, "question", json_string(it->prompt));
    json_object_set_new(j, "answer", json_string(it->response));
    char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(j);
    fprintf(f, "%s\n", line);
    free(line);
}

/* moerl's (verl's) row for item `index` of split `split`; tools: the family's (JSON text) or NULL. */
static int write_task_row(FILE *f, const char *family, const task_item *it, const char *tools, const char *split,
                          int64_t index) {
    chat_msg msg = {"user", (char *)it->prompt, NULL};
    char extra[128];
    snprintf(extra, sizeof extra, "{\"split\":\"%s\",\"index\":%lld}", split, (long long)index);
    ds_row row = {.data_source = (char *)family,
                  .prompt = &msg,
                  .n_prompt = 1,
                  .ground_truth = (char *)it->truth,
                  .ground_truth_json = it->truth_json,
                  .extra_info_json = extra,
                  .response = it->response_json ? NULL : (char *)it->response};
    json_error_t e;
    json_t *resp = it->response_json ? json_loads(it->response, 0, &e) : NULL;
    row.tools = tools ? json_loads(tools, 0, &e) : NULL;
    int rc = MOERL_OK;
    if ((it->response_json && !resp) || (tools && !row.tools)) /* the generators' own text: a bug here */
        rc = moerl_errorf("task '%s': generated JSON does not parse: %s", family, e.text);
    if (rc == MOERL_OK && resp) { /* the demonstration's messages, as the row carries them */
        row.n_resp_msgs = (int)json_array_size(resp);
        row.resp_msgs = xcalloc((size_t)row.n_resp_msgs, sizeof(chat_msg));
        for (int i = 0; i < row.n_resp_msgs; i++) row.resp_msgs[i].msg = json_array_get(resp, (size_t)i);
    }
    if (rc == MOERL_OK) rc = dataset_write_row(f, &row);
    free(row.resp_msgs);
    json_decref(resp);
    json_decref(row.tools);
    return rc;
}

/* Write buf[0..blen) to path atomically, creating its parent folders. */
static int write_split_file(const char *family, const char *path, const char *buf, size_t blen) {
    int rc = MOERL_OK;
    char *dir = xstrdup(path), *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        rc = moerl_mkdirs(dir);
    }
    free(dir);
    if (rc == MOERL_OK) rc = moerl_write_file_atomic(path, buf, blen);
    if (rc) moerl_error_prefix("task '%s': writing %s: ", family, path);
    return rc;
}

/* Draw `count` items not yet in `seen` as rows of split `split` into *buf[*blen] (heap; freed by the
 * caller, also on error). */
static int gen_split(const char *family, task_gen_fn fn, const char *tools, rng_state *r, const task_opts *o, strset *seen,
                     int64_t count, const char *split, char **buf, size_t *blen, int raw_gsm8k) {
    *buf = NULL;
    *blen = 0;
    FILE *f = open_memstream(buf, blen);
    if (!f) return moerl_errorf("task '%s': cannot allocate the output buffer", family);
    int64_t tries = 0, max_tries = 50 * (o->n_train + o->n_test) + 10000;
    int rc = MOERL_OK;
    task_item it;
    for (int64_t i = 0; i < count && rc == MOERL_OK;) {
        if (++tries > max_tries) {
            rc = moerl_errorf("task '%s': could only draw %zu distinct problems of the %lld asked (n_train + n_test); "
                              "with these options the problem space is too small",
                              family, seen->n, (long long)(o->n_train + o->n_test));
            break;
        }
        memset(&it, 0, sizeof it);
        fn(r, o, &it);
        if (!strset_add(seen, it.key[0] ? it.key : it.prompt)) continue;
        if (raw_gsm8k) write_raw_gsm8k_row(f, &it);
        else rc = write_task_row(f, family, &it, tools, split, i);
        i++;
    }
    fclose(f);
    return rc;
}

static int task_generate_impl(const char *family, const task_opts *o, const char *train_path, const char *test_path,
                              int raw_gsm8k) {
    task_gen_fn fn = NULL;
    const char *tools = NULL;
    for (int i = 0; i < FAMILIES_N; i++)
        if (strcmp(k_families[i].name, family) == 0) {
            fn = k_families[i].fn;
            tools = k_families[i].tools;
        }
    if (!fn) return moerl_errorf("unknown task family '%s' (known: arith, gsm8k-style, countdown, tool_arith)", family);
    if (check_opts(family, o)) return MOERL_ERR;
    rng_state r;
    rng_seed(&r, o->seed);
    strset seen;
    strset_init(&seen, (size_t)(o->n_train + o->n_test));
    /* both splits are drawn before either file is written: a refused task leaves no file behind */
    char *test_buf = NULL, *train_buf = NULL;
    size_t test_len = 0, train_len = 0;
    int rc = gen_split(family, fn, tools, &r, o, &seen, o->n_test, "test", &test_buf, &test_len, raw_gsm8k);
    if (rc == MOERL_OK) rc = gen_split(family, fn, tools, &r, o, &seen, o->n_train, "train", &train_buf, &train_len, raw_gsm8k);
    if (rc == MOERL_OK) rc = write_split_file(family, test_path, test_buf, test_len);
    if (rc == MOERL_OK) rc = write_split_file(family, train_path, train_buf, train_len);
    free(test_buf);
    free(train_buf);
    strset_free(&seen);
    return rc;
}

int task_generate(const char *family, const task_opts *o, const char *train_path, const char *test_path) {
    return task_generate_impl(family, o, train_path, test_path, 0);
}

int task_generate_gsm8k_raw(const task_opts *o, const char *train_path, const char *test_path) {
    return task_generate_impl("gsm8k-style", o, train_path, test_path, 1);
}
