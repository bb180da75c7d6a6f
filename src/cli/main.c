/* moerl — entry point: dispatches subcommands. */
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerl <command> [options]\n"
            "commands:\n"
            "  rl        fully-asynchronous GRPO post-training   (moerl rl --config FILE [key=value ...])\n"
            "  sft       supervised fine-tuning                  (moerl sft --config FILE [key=value ...])\n"
            "  generate  sample responses with the rollout engine (moerl generate --model DIR ...)\n"
            "  score     per-token logprobs, CE and aux loss     (moerl score --model DIR --tokens 1,5,9)\n"
            "  eval      accuracy of a model on a task file      (moerl eval --model DIR --data FILE.jsonl)\n"
            "  tasks     write a built-in task's train/test JSONL (moerl tasks --task arith --out DIR)\n"
            "  tokenize  a model's tokenizer on a text or chat      (moerl tokenize --model DIR --text S)\n"
            "run 'moerl <command> --help' for a command's options.\n");
}

typedef struct {
    const char *name;
    int (*fn)(int, char **);
} command;

static const command commands[] = {
    {"score", cmd_score}, {"sft", cmd_sft},   {"generate", cmd_generate},
    {"rl", cmd_rl},       {"eval", cmd_eval}, {"tasks", cmd_tasks},
    {"tokenize", cmd_tokenize},
};

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "moerl: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

int cli_parse_int_list(const char *s, int **out, int *n) {
    int cap = 16, k = 0;
    int *a = xmalloc(cap * sizeof(int));
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < -2147483647L || v > 2147483647L) {
            free(a);
            return moerl_errorf("expected a comma-separated list of integers, got '%s' (bad item at '%.20s')", s, p);
        }
        if (k == cap) a = xrealloc(a, (cap *= 2) * sizeof(int));
        a[k++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(a);
        return moerl_errorf("expected a non-empty comma-separated list of integers, got '%s'", s);
    }
    *out = a;
    *n = k;
    return MOERL_OK;
}
