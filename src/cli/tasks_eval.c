/* moerl tasks --task NAME --out DIR [--n-train N] [--n-test N] [--seed S] [--digits D] [--numbers K]
 *             [--format verl|gsm8k]
 *   writes DIR/train.jsonl and DIR/test.jsonl (verl schema; --format gsm8k: openai/gsm8k rows, for
 *   gsm8k-style) for a built-in task; prints one JSON object {"train", "test", "n_train",
 *   "n_test"}. An option of another task (--digits is arith's, --numbers countdown's) is an error,
 *   not silently ignored.
 * moerl tasks --from-gsm8k FILE.jsonl --out DIR
 *   openai/gsm8k rows → DIR/<name of FILE> in verl schema (tasks.h gsm8k_convert); prints {"out", "n"}.
 * moerl eval --model DIR --data FILE.jsonl [--n N] [--max-new-tokens N]
 *   greedy held-out accuracy with the row's reward function; prints one JSON object
 *   {"accuracy", "n", "mean_response_length", "data"}. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
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
    const char *task = NULL, *out = NULL, *format = "verl", *from = NULL;
    task_opts o;
    task_opts_default(&o);
    int64_t v;
    int digits_set = 0, numbers_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            int n;
            const char *const *f = task_families(&n);
            printf("usage: moerl tasks --task NAME --out DIR [--n-train N] [--n-test N] [--seed S] [--digits D] "
                   "[--numbers K]\n"
                   "  --n-train N   training rows (default 1000)\n"
                   "  --n-test N    held-out rows (default 100)\n"
                   "  --seed S      generator seed (default 1)\n"
                   "  --digits D    arith only: digits per operand, 1..18 (default 2)\n"
                   "  --numbers K   countdown only: numbers per problem, 2..6 (default 4)\n"
                   "  --format F    verl (default: moerl's rows) | gsm8k (gsm8k-style only: openai/gsm8k rows\n"
                   "                {\"question\", \"answer\"} with the final answer after \"####\")\n"
                   "usage: moerl tasks --from-gsm8k FILE.jsonl --out DIR\n"
                   "  convert openai/gsm8k rows to moerl's rows as verl's gsm8k preprocessing does\n"
                   "  (written to DIR/<name of FILE>; the split in extra_info is that name without .jsonl)\n"
                   "tasks:");
            for (int k = 0; k < n; k++) printf(" %s", f[k]);
            printf("\n");
            return 0;
        } else if (!strcmp(a, "--task") && has) task = argv[++i];
        else if (!strcmp(a, "--out") && has) out = argv[++i];
        else if (!strcmp(a, "--format") && has) format = argv[++i];
        else if (!strcmp(a, "--from-gsm8k") && has) from = argv[++i];
        else if (!strcmp(a, "--n-train") && has) { if (parse_i64("tasks", a, argv[++i], 1, 100000000, &v)) return 2; o.n_train = v; }
        else if (!strcmp(a, "--n-test") && has) { if (parse_i64("tasks", a, argv[++i], 1, 100000000, &v)) return 2; o.n_test = v; }
        else if (!strcmp(a, "--seed") && has) { if (parse_i64("tasks", a, argv[++i], 0, INT64_MAX, &v)) return 2; o.seed = (uint64_t)v; }
        else if (!strcmp(a, "--digits") && has) { if (parse_i64("tasks", a, argv[++i], 1, 18, &v)) return 2; o.arith_digits = (int)v; digits_set = 1; }
        else if (!strcmp(a, "--numbers") && has) { if (parse_i64("tasks", a, argv[++i], 2, 6, &v)) return 2; o.countdown_numbers = (int)v; numbers_set = 1; }
        else {
            fprintf(stderr, "moerl tasks: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (from) {
        if (task || !out) {
            fprintf(stderr, "moerl tasks: --from-gsm8k takes --out DIR and no --task\n");
            return 2;
        }
        const char *base = strrchr(from, '/') ? strrchr(from, '/') + 1 : from;
        char dst[4096], split[256];
        snprintf(dst, sizeof dst, "%s/%s", out, base);
        snprintf(split, sizeof split, "%s", base);
        char *dot = strstr(split, ".jsonl");
        if (dot) *dot = 0;
        int64_t n = 0;
        if (moerl_mkdirs(out) != MOERL_OK || gsm8k_convert(from, dst, split, &n) != MOERL_OK) {
            cli_print_error("tasks", moerl_last_error());
            return 1;
        }
        json_t *j = json_object();
        json_object_set_new(j, "out", cli_json_text(dst, strlen(dst)));
        json_object_set_new(j, "n", json_integer(n));
        cli_print_json(j, 0);
        return 0;
    }
    if (!task || !out) {
        fprintf(stderr, "moerl tasks: --task and --out are required\n");
        return 2;
    }
    const int raw = !strcmp(format, "gsm8k");
    if (!raw && strcmp(format, "verl")) {
        fprintf(stderr, "moerl tasks: --format '%s': expected verl or gsm8k\n", format);
        return 2;
    }
    if (raw && strcmp(task, "gsm8k-style")) {
        fprintf(stderr, "moerl tasks: --format gsm8k applies to the gsm8k-style task only, not '%s'\n", task);
        return 2;
    }
    if (digits_set && strcmp(task, "arith")) {
        fprintf(stderr, "moerl tasks: --digits applies to the arith task only, not '%s'%s\n", task,
                strcmp(task, "countdown") ? "" : " (countdown takes --numbers)");
        return 2;
    }
    if (numbers_set && strcmp(task, "countdown")) {
        fprintf(stderr, "moerl tasks: --numbers applies to the countdown task only, not '%s'\n", task);
        return 2;
    }
    char tr[4096], te[4096];
    snprintf(tr, sizeof tr, "%s/train.jsonl", out);
    snprintf(te, sizeof te, "%s/test.jsonl", out);
    if ((raw ? task_generate_gsm8k_raw(&o, tr, te) : task_generate(task, &o, tr, te)) != MOERL_OK) {
        cli_print_error("tasks", moerl_last_error());
        return 1;
    }
    json_t *j = json_object();
    json_object_set_new(j, "train", cli_json_text(tr, strlen(tr)));
    json_object_set_new(j, "test", cli_json_text(te, strlen(te)));
    json_object_set_new(j, "n_train", json_integer(o.n_train));
    json_object_set_new(j, "n_test", json_integer(o.n_test));
    cli_print_json(j, 0);
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
                   "                  [--chat-template auto|qwen3|chatml] [--no-thinking]\n"
                   "  --n N               evaluate the first N rows (0 = all; default 0)\n"
                   "  --max-new-tokens N  greedy response cap in tokens (default 16, data.max_response_length's\n"
                   "                      default; pass the run's data.max_response_length to score as it did)\n");
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
    moe_model m = {0};
    dataset ds = {0};
    int rc = 1;
    double acc, mlen;
    /* the data first (cheap, and its errors name file:line), then the model */
    if (dataset_load(&ds, data) != MOERL_OK || cli_check_data_sources(&ds) != MOERL_OK) goto fail;
    if (model_load_hf_inference(&m, model_dir) != MOERL_OK) goto fail;
    if (cli_use_tokenizer(model_dir, m.cfg.vocab_size, tpl, thinking, "--chat-template") != MOERL_OK) goto fail;
    for (int64_t i = 0; i < dataset_count(&ds); i++)
        if (tokenizer_chat_check(tok_current(), dataset_row(&ds, i)->prompt, dataset_row(&ds, i)->n_prompt)) {
            moerl_error_prefix("%s:%lld: prompt: ", data, (long long)dataset_row(&ds, i)->line);
            goto fail;
        }
    log_info("eval: greedy responses of at most %lld tokens (--max-new-tokens; a run's data.max_response_length "
             "should match)", (long long)max_new);
    if (eval_accuracy(&m, &ds, n, (int)max_new, 64, &acc, &mlen) != MOERL_OK) {
        /* a reward error names the row's line: say which file it is in */
        if (!strstr(moerl_last_error(), data)) moerl_error_prefix("%s: ", data);
        goto fail;
    }
    json_t *j = json_object();
    json_object_set_new(j, "accuracy", cli_json_real(acc));
    json_object_set_new(j, "n", json_integer(n > 0 && n < dataset_count(&ds) ? n : dataset_count(&ds)));
    json_object_set_new(j, "mean_response_length", cli_json_real(mlen));
    json_object_set_new(j, "max_new_tokens", json_integer(max_new));
    json_object_set_new(j, "data", cli_json_text(data, strlen(data)));
    cli_print_json(j, 6);
    rc = 0;
    goto out;
fail:
    cli_print_error("eval", moerl_last_error());
out:
    dataset_free(&ds);
    model_free(&m);
    return rc;
}
