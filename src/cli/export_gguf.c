/* moerl export-gguf --model DIR --out FILE.gguf [--dtype f32|bf16]
 * A checkpoint folder's weights as a GGUF file llama.cpp loads (architecture qwen3moe; names and
 * metadata: src/model/gguf.h). Used to run llama.cpp on exactly moerl's weights
 * (bench/run_llamacpp.sh, tests/e2e_llamacpp.sh). */
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "cli/cli.h"
#include "model/gguf.h"
#include "model/model.h"

static void eg_usage(FILE *f) {
    fprintf(f, "usage: moerl export-gguf --model DIR --out FILE.gguf [--dtype f32|bf16] [--force]\n"
               "  --model DIR     a checkpoint folder (config.json + safetensors)\n"
               "  --out FILE      the GGUF file to write (atomically)\n"
               "  --dtype T       f32 (default; fp32 is accepted too) or bf16 for the matrices (norm weights stay f32)\n"
               "  --force         replace an existing --out file\n");
}

int cmd_export_gguf(int argc, char **argv) {
    enum { O_MODEL = 1, O_OUT, O_DTYPE, O_FORCE, O_HELP };
    static const struct option opts[] = {{"model", required_argument, 0, O_MODEL},
                                         {"out", required_argument, 0, O_OUT},
                                         {"dtype", required_argument, 0, O_DTYPE},
                                         {"force", no_argument, 0, O_FORCE},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *out = NULL, *dtype = "f32";
    int o, force = 0;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case O_MODEL: model = optarg; break;
        case O_OUT: out = optarg; break;
        case O_DTYPE: dtype = optarg; break;
        case O_FORCE: force = 1; break;
        case 'h':
        case O_HELP: eg_usage(stdout); return 0;
        default:
            fprintf(stderr, "moerl export-gguf: unknown or incomplete option '%s'\n", argv[optind - 1]);
            eg_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "moerl export-gguf: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model || !out) {
        fprintf(stderr, "moerl export-gguf: --model DIR and --out FILE are required\n");
        eg_usage(stderr);
        return 2;
    }
    gguf_export_dtype dt;
    /* never write into the checkpoint being read; an existing file only with --force */
    char model_real[PATH_MAX], out_dir_real[PATH_MAX], out_copy[PATH_MAX];
    snprintf(out_copy, sizeof out_copy, "%s", out);
    if (realpath(model, model_real) && realpath(dirname(out_copy), out_dir_real) && !strcmp(model_real, out_dir_real)) {
        fprintf(stderr, "moerl export-gguf: --out %s is inside the checkpoint folder %s being exported; write the GGUF "
                        "elsewhere\n", out, model);
        return 2;
    }
    if (!force && access(out, F_OK) == 0) {
        fprintf(stderr, "moerl export-gguf: --out %s exists; pass --force to replace it\n", out);
        return 2;
    }
    if (!strcmp(dtype, "f32") || !strcmp(dtype, "fp32")) dt = GGUF_EXPORT_F32;
    else if (!strcmp(dtype, "bf16")) dt = GGUF_EXPORT_BF16;
    else {
        fprintf(stderr, "moerl export-gguf: --dtype '%s': expected f32 or bf16\n", dtype);
        return 2;
    }
    moe_model m;
    if (model_load_hf(&m, model) != MOERL_OK) {
        fprintf(stderr, "moerl export-gguf: %s\n", moerl_last_error());
        return 1;
    }
    int rc = model_export_gguf(&m, out, dt);
    if (rc != MOERL_OK) fprintf(stderr, "moerl export-gguf: %s\n", moerl_last_error());
    else fprintf(stderr, "moerl export-gguf: wrote %s (%s)\n", out, dtype);
    model_free(&m);
    return rc == MOERL_OK ? 0 : 1;
}
