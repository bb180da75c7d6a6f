/* moerl export-gguf --model DIR --out FILE.gguf [--dtype f32|bf16]
 * A checkpoint folder's weights as a GGUF file llama.cpp loads (architecture qwen3moe; names and
 * metadata: src/model/gguf.h). Used to run llama.cpp on exactly moerl's weights
 * (bench/run_llamacpp.sh, tests/e2e_llamacpp.sh). */
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "cli/options.h"
#include "model/gguf.h"
#include "model/model.h"

int cmd_export_gguf(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *dtype = "f32";
    int force = 0;
    const cli_opt opts[] = {
        CLI_OPT_STR("model", &model, "DIR", CLI_ONCE | CLI_REQUIRED, "a checkpoint folder (config.json + safetensors)"),
        CLI_OPT_STR("out", &out, "FILE", CLI_ONCE | CLI_REQUIRED, "the GGUF file to write (atomically)"),
        CLI_OPT_STR("dtype", &dtype, "T", 0, "f32 (fp32 is accepted too) or bf16 for the matrices (norm weights stay f32)"),
        CLI_OPT_FLAG("force", &force, "replace an existing --out file"),
    };
    const cli_spec spec = {.cmd = "export-gguf", .synopsis = "--model DIR --out FILE.gguf [--dtype f32|bf16] [--force]",
                           .about = "A checkpoint folder's weights as a GGUF file llama.cpp loads (architecture qwen3moe).",
                           .opts = opts, .n_opts = CLI_NOPTS(opts)};
    int code;
    if (cli_parse(&spec, argc, argv, &code)) return code;
    gguf_export_dtype dt;
    /* never write into the checkpoint being read; an existing file only with --force */
    char model_real[PATH_MAX], out_dir_real[PATH_MAX], out_copy[PATH_MAX];
    snprintf(out_copy, sizeof out_copy, "%s", out);
    if (realpath(model, model_real) && realpath(dirname(out_copy), out_dir_real) && !strcmp(model_real, out_dir_real)) {
        fprintf(stderr, "moerl export-gguf: --out %s is inside the checkpoint folder %s being exported; write the GGUF "
                        "elsewhere\n", out, model);
        return 2;
    }
    struct stat st;
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "moerl export-gguf: --out %s is a folder; give the GGUF file's path (e.g. %s/model.gguf)\n", out,
                out);
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
        cli_print_error("export-gguf", moerl_last_error());
        return 1;
    }
    int rc = model_export_gguf(&m, out, dt);
    if (rc != MOERL_OK) cli_print_error("export-gguf", moerl_last_error()); /* library errors start "export-gguf: " */
    else fprintf(stderr, "moerl export-gguf: wrote %s (%s)\n", out, dtype);
    model_free(&m);
    return rc == MOERL_OK ? 0 : 1;
}
