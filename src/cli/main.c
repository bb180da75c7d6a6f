/* moerl — entry point: dispatches subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "dist/dist.h"

#define MOERL_VERSION "0.1.0"

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
            "  plan      memory per rank and traffic per step        (moerl plan --model DIR|config.json [key=value ...])\n"
            "  simulate  the real scheduler on a virtual clock       (moerl simulate --config FILE [key=value ...])\n"
            "  export-gguf  weights as GGUF for llama.cpp         (moerl export-gguf --model DIR --out F.gguf)\n"
            "  init      write a new random checkpoint folder      (moerl init --out DIR [--tokenizer-from DIR])\n"
            "  help      this text, or a command's options        (moerl help rl)\n"
            "run 'moerl <command> --help' for a command's options; 'moerl --version' for the version.\n"
            "Under mpirun use build/moerl-mpi (rl: rollout and trainer ranks; sft: data parallel, with the actor.* parallel keys).\n");
}

typedef struct {
    const char *name;
    int (*fn)(int, char **);
} command;

static const command commands[] = {
    {"score", cmd_score}, {"sft", cmd_sft},   {"generate", cmd_generate},
    {"rl", cmd_rl},       {"eval", cmd_eval}, {"tasks", cmd_tasks},
    {"tokenize", cmd_tokenize}, {"plan", cmd_plan}, {"simulate", cmd_simulate}, {"export-gguf", cmd_export_gguf},
    {"init", cmd_init},
};

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        if (argc >= 3 && !strcmp(argv[1], "help") && (!strcmp(argv[2], "help") || argv[2][0] == '-')) {
            usage(stdout); /* moerl help help, moerl help --help */
            return 0;
        }
        if (argc >= 3 && !strcmp(argv[1], "help")) { /* moerl help CMD = moerl CMD --help */
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (!strcmp(argv[2], commands[i].name)) {
                    char *hv[] = {argv[2], "--help", NULL};
                    return commands[i].fn(2, hv);
                }
            fprintf(stderr, "moerl help: unknown command '%s'\n", argv[2]);
            usage(stderr);
            return 2;
        }
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("moerl %s (%s backend%s)\n", MOERL_VERSION, dist_backend_name(),
               strcmp(dist_backend_name(), "mpi") ? "; build/moerl-mpi is the MPI build" : ": run under mpirun");
        return 0;
    }
    /* Several processes of a binary without MPI would each run the whole command alone, racing
     * for one output folder: stop before any work, naming the binary that would work. */
    int lrank, lsize = cli_launcher_world(&lrank);
    if (lsize > 1 && strcmp(dist_backend_name(), "mpi")) {
        if (lrank == 0)
            fprintf(stderr, "moerl: launched by mpirun as %d processes, but %s is built without MPI (each process "
                            "would run the whole command alone): use build/moerl-mpi under mpirun (make builds it "
                            "when mpicc is installed), or run %s without mpirun\n", lsize, argv[0], argv[0]);
        return 2;
    }
    if (lsize > 1 && strcmp(argv[1], "rl") && strcmp(argv[1], "sft")) { /* the MPI build, a one-process command */
        if (lrank == 0)
            fprintf(stderr, "moerl %s: runs in one process, but mpirun started %d: run it without mpirun (only rl "
                            "and sft use several processes)\n", argv[1], lsize);
        return 2;
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
