/* moerl tasks --task NAME --out DIR [--n-train N] [--n-test N] [--seed S] [--digits D]
 *   writes DIR/train.jsonl and DIR/test.jsonl (verl schema) for a built-in task.
 * moerl eval --model DIR --data FILE.jsonl [--n N] [--max-new-tokens N]
 *   greedy held-out accuracy with the row's reward function; prints one JSON object. */
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "data/dataset.h"
#include "data/tasks.h"
#include "model/model.h"
#include "train/train.h"

static int parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "moerl %s: %s expects an integer in [%lld, %lld], got '%s'\n", cmd, opt, (long long)lo,
                (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cmd_tasks(int argc, char **argv) {
    const char *task = NULL, *out = NULL;
    task_opts o;
    task_opts_default(&o);
    int64_t v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            int n;
            const char *const *f = task_families(&n);
            printf("usage: moerl tasks --task NAME --out DIR [--n-train N] [--n-test N] [--seed S] [--digits D]\n"
                   "tasks:");
            for (int k = 0; k < n; k++) printf(" %s", f[k]);
            printf("\n");
            return 0;
        } else if (!strcmp(a, "--task") && has) task = argv[++i];
        else if (!strcmp(a, "--out") && has) out = argv[++i];
        else if (!strcmp(a, "--n-train") && has) { if (parse_i64("tasks", a, argv[++i], 1, 100000000, &v)) return 2; o.n_train = v; }
        else if (!strcmp(a, "--n-test") && has) { if (parse_i64("tasks", a, argv[++i], 1, 100000000, &v)) return 2; o.n_test = v; }
        else if (!strcmp(a, "--seed") && has) { if (parse_i64("tasks", a, argv[++i], 0, INT64_MAX, &v)) return 2; o.seed = (uint64_t)v; }
        else if (!strcmp(a, "--digits") && has) { if (parse_i64("tasks", a, argv[++i], 1, 18, &v)) return 2; o.arith_digits = (int)v; }
        else {
            fprintf(stderr, "moerl tasks: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!task || !out) {
        fprintf(stderr, "moerl tasks: --task and --out are required\n");
        return 2;
    }
    char tr[4096], te[4096];
    snprintf(tr, sizeof tr, "%s/train.jsonl", out);
    snprintf(te, sizeof te, "%s/test.jsonl", out);
    if (task_generate(task, &o, tr, te) != MOERL_OK) {
        fprintf(stderr, "moerl tasks: %s\n", moerl_last_error());
        return 1;
    }
    printf("{\"train\": \"%s\", \"test\": \"%s\", \"n_train\": %lld, \"n_test\": %lld}\n", tr, te,
           (long long)o.n_train, (long long)o.n_test);
    return 0;
}

int cmd_eval(int argc, char **argv) {
    const char *model_dir = NULL, *data = NULL;
    int64_t n = 0, max_new = 16;
    const char *tpl = "auto";
    int thinking = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: moerl eval --model DIR --data FILE.jsonl [--n N] [--max-new-tokens N]\n"
                   "                  [--chat-template auto|qwen3|chatml] [--no-thinking]\n");
            return 0;
        } else if (!strcmp(a, "--model") && has) model_dir = argv[++i];
        else if (!strcmp(a, "--data") && has) data = argv[++i];
        else if (!strcmp(a, "--chat-template") && has) tpl = argv[++i];
        else if (!strcmp(a, "--no-thinking")) thinking = 0;
        else if (!strcmp(a, "--n") && has) { if (parse_i64("eval", a, argv[++i], 0, 100000000, &n)) return 2; }
        else if (!strcmp(a, "--max-new-tokens") && has) { if (parse_i64("eval", a, argv[++i], 1, 1000000, &max_new)) return 2; }
        else {
            fprintf(stderr, "moerl eval: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!model_dir || !data) {
        fprintf(stderr, "moerl eval: --model and --data are required\n");
        return 2;
    }
    moe_model m;
    dataset ds = {0};
    if (model_load_hf(&m, model_dir) != MOERL_OK || dataset_load(&ds, data) != MOERL_OK ||
        cli_use_tokenizer(model_dir, m.cfg.vocab_size, tpl, thinking, "--chat-template") != MOERL_OK) {
        fprintf(stderr, "moerl eval: %s\n", moerl_last_error());
        return 1;
    }
    for (int64_t i = 0; i < dataset_count(&ds); i++)
        if (tokenizer_chat_check(tok_current(), dataset_row(&ds, i)->prompt, dataset_row(&ds, i)->n_prompt)) {
            fprintf(stderr, "moerl eval: %s:%lld: prompt: %s\n", data, (long long)dataset_row(&ds, i)->line,
                    moerl_last_error());
            return 1;
        }
    double acc, mlen;
    if (eval_accuracy(&m, &ds, n, (int)max_new, 64, &acc, &mlen) != MOERL_OK) {
        fprintf(stderr, "moerl eval: %s\n", moerl_last_error());
        return 1;
    }
    printf("{\"accuracy\": %.4f, \"n\": %lld, \"mean_response_length\": %.2f}\n", acc,
           (long long)(n > 0 && n < dataset_count(&ds) ? n : dataset_count(&ds)), mlen);
    dataset_free(&ds);
    model_free(&m);
    return 0;
}
