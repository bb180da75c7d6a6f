/* moerl — entry point: dispatches subcommands (the table below; `moerl help` is made from it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "cli/options.h"
#include "model/checkpoint.h"
#include "dist/dist.h"

#define MOERL_VERSION "0.1.0"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary; /* one line */
    const char *example; /* a typical invocation */
} command;

static const command commands[] = {
    {"rl", cmd_rl, "fully-asynchronous GRPO post-training", "moerl rl --config FILE [key=value ...]"},
    {"sft", cmd_sft, "supervised fine-tuning", "moerl sft --config FILE [key=value ...]"},
    {"generate", cmd_generate, "sample responses with the rollout engine", "moerl generate --model DIR --prompt TEXT"},
    {"score", cmd_score, "per-token logprobs, CE and aux loss", "moerl score --model DIR --tokens 1,5,9"},
    {"eval", cmd_eval, "accuracy of a model on a task file", "moerl eval --model DIR --data FILE.jsonl"},
    {"tasks", cmd_tasks, "write a built-in task's train/test JSONL", "moerl tasks --task arith --out DIR"},
    {"tokenize", cmd_tokenize, "a model's tokenizer on a text or chat", "moerl tokenize --model DIR --text S"},
    {"plan", cmd_plan, "memory per rank and traffic per step", "moerl plan --model DIR|config.json [key=value ...]"},
    {"simulate", cmd_simulate, "the real scheduler on a virtual clock", "moerl simulate --config FILE [key=value ...]"},
    {"export-gguf", cmd_export_gguf, "weights as GGUF for llama.cpp", "moerl export-gguf --model DIR --out F.gguf"},
    {"init", cmd_init, "write a new random checkpoint folder", "moerl init --out DIR [--tokenizer-from DIR]"},
    {"help", NULL, "this text, or a command's options", "moerl help rl"},
};
#define N_COMMANDS CLI_NOPTS(commands)

static void usage(FILE *f) {
    fprintf(f, "usage: moerl <command> [options]\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-12s %-42s (%s)\n", commands[i].name, commands[i].summary, commands[i].example);
    fprintf(f, "options:\n  -h, --help   this text\n  --version    the version and the distributed backend\n"
               "run 'moerl <command> --help' or 'moerl help <command>' for a command's options.\n"
               "Under mpirun use build/moerl-mpi (rl: rollout and trainer ranks; sft: data parallel, with the "
               "actor.* parallel keys).\n");
}

static const command *find_command(const char *name) {
    for (int i = 0; i < N_COMMANDS; i++)
        if (commands[i].fn && !strcmp(name, commands[i].name)) return &commands[i];
    return NULL;
}

/* moerl help [COMMAND]: this text, or COMMAND --help */
static int help(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "help") || argv[2][0] == '-') {
        usage(stdout);
        return 0;
    }
    const command *c = find_command(argv[2]);
    if (!c) {
        fprintf(stderr, "moerl help: unknown command '%s'\n", argv[2]);
        usage(stderr);
        return 2;
    }
    char *hv[] = {argv[2], "--help", NULL};
    return c->fn(2, hv);
}

/* Several processes of a binary without MPI would each run the whole command alone, racing for one
 * output folder; a one-process command under mpirun likewise: stop before any work, naming the way
 * out. 0 = go on. */
static int check_launcher(const char *cmd, const char *self) {
    int lrank, lsize = cli_launcher_world(&lrank);
    if (lsize > 1 && strcmp(dist_backend_name(), "mpi")) {
        if (lrank == 0)
            fprintf(stderr, "moerl: launched by mpirun as %d processes, but %s is built without MPI (each process "
                            "would run the whole command alone): use build/moerl-mpi under mpirun (make builds it "
                            "when mpicc is installed), or run %s without mpirun\n", lsize, self, self);
        return 2;
    }
    if (lsize > 1 && strcmp(cmd, "rl") && strcmp(cmd, "sft")) { /* the MPI build, a one-process command */
        if (lrank == 0)
            fprintf(stderr, "moerl %s: runs in one process, but mpirun started %d: run it without mpirun (only rl "
                            "and sft use several processes)\n", cmd, lsize);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    moerl_blas_coretype_init(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "help")) return help(argc, argv);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("moerl %s (%s backend%s)\n", MOERL_VERSION, dist_backend_name(),
               strcmp(dist_backend_name(), "mpi") ? "; build/moerl-mpi is the MPI build" : ": run under mpirun");
        return 0;
    }
    if (check_launcher(argv[1], argv[0])) return 2;
    /* MOERL_LOAD=mmap|copy|read: how every command reads checkpoints (model/checkpoint.h) */
    model_load_opts lo;
    model_load_opts_default(&lo);
    if (model_load_mode_parse(getenv("MOERL_LOAD"), "environment variable MOERL_LOAD", &lo.mode) != MOERL_OK) {
        fprintf(stderr, "moerl: %s\n", moerl_last_error());
        return 2;
    }
    model_set_load_opts(&lo);
    const command *c = find_command(argv[1]);
    if (c) return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "moerl: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
