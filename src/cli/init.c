/* moerl init --out DIR [--config FILE] [--tokenizer-from DIR] [--bf16] [--shard-mb N] [model.key=value ...]
 *   writes a new, randomly initialised Qwen3-MoE checkpoint folder in Hugging Face's layout:
 *   config.json, model.safetensors (or model-0000k-of-0000N.safetensors shards with
 *   model.safetensors.index.json when the weights exceed --shard-mb) and the tokenizer files —
 *   those of --tokenizer-from DIR (tokenizer.json, tokenizer_config.json, ..., byte for byte; the
 *   folder's tokenizer must fit in model.vocab_size, and config.json's bos/eos ids are set from
 *   it: <|endoftext|> and the first stop token), else moerl's byte tokenizer. The architecture
 *   comes from the model.* keys (`moerl rl --help` lists them; model.seed seeds the init). The
 *   folder is what `model.path=DIR` and `--model DIR` read: scripts/make_qwen3_folder.sh uses it
 *   to make a small model with Qwen3's real tokenizer. Refuses a DIR that already holds files.
 *   Prints one JSON object {"out", "parameters", "vocab_size", "tokenizer", "files"}. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "base/config.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "data/tokenizer.h"
#include "model/model.h"

static void init_usage(FILE *f, const cfg *c) {
    fprintf(f, "usage: moerl init --out DIR [--config FILE] [--tokenizer-from DIR] [--bf16] [--shard-mb N] "
               "[model.key=value ...]\n"
               "  --out DIR             the new checkpoint folder (must not exist or be empty)\n"
               "  --config FILE         YAML with model.* keys (the keys below), overridden by key=value\n"
               "  --tokenizer-from DIR  copy that folder's tokenizer files (tokenizer.json, ...); default: moerl's\n"
               "                        byte tokenizer\n"
               "  --bf16                store the weights as BF16 (default F32)\n"
               "  --shard-mb N          shard the weights into files of at most N MB, with an index (default: one file)\n"
               "keys:\n");
    if (c) cfg_print_help(c, f);
}

static int dir_has_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n > 0;
}

int cmd_init(int argc, char **argv) {
    cfg *c = cfg_new();
    cli_def_model_keys(c);
    cfg_def_str(c, "data.chat_template", "auto", "chat template of the tokenizer (auto | qwen3 | chatml)");
    cfg_def_bool(c, "data.enable_thinking", true, "Qwen3 chat template's enable_thinking");
    const char *out = NULL, *config = NULL, *tok_from = NULL;
    int bf16 = 0, rc = 1;
    long long shard_mb = 0;
    tokenizer *tok = NULL;
    moe_model m;
    memset(&m, 0, sizeof m);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            init_usage(stdout, c);
            cfg_free(c);
            return 0;
        } else if (!strcmp(a, "--out") && has) out = argv[++i];
        else if (!strcmp(a, "--config") && has) config = argv[++i];
        else if (!strcmp(a, "--tokenizer-from") && has) tok_from = argv[++i];
        else if (!strcmp(a, "--bf16")) bf16 = 1;
        else if (!strcmp(a, "--shard-mb") && has) {
            char *end;
            shard_mb = strtoll(argv[++i], &end, 10);
            if (end == argv[i] || *end || shard_mb < 1 || shard_mb > 1000000) {
                fprintf(stderr, "moerl init: --shard-mb expects an integer in [1, 1000000], got '%s'\n", argv[i]);
                cfg_free(c);
                return 2;
            }
        } else if (a[0] != '-' && strchr(a, '=')) {
            continue; /* applied after the config file */
        } else {
            fprintf(stderr, "moerl init: unknown or incomplete option '%s' (see --help)\n", a);
            cfg_free(c);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "moerl init: --out DIR is required (see --help)\n");
        cfg_free(c);
        return 2;
    }
    if (config && cfg_load_yaml(c, config) != MOERL_OK) goto fail;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") || !strcmp(argv[i], "--config") || !strcmp(argv[i], "--tokenizer-from") ||
            !strcmp(argv[i], "--shard-mb")) {
            i++;
            continue;
        }
        if (argv[i][0] != '-' && strchr(argv[i], '=') && cfg_apply_override(c, argv[i]) != MOERL_OK) goto fail;
    }
    if (cfg_str(c, "model.path")[0]) {
        moerl_errorf("model.path is set ('%s'): init makes a new model from the model.* keys", cfg_str(c, "model.path"));
        goto fail;
    }
    if (dir_has_files(out)) {
        moerl_errorf("--out '%s' already holds files; init writes a new folder (remove it or pick another)", out);
        goto fail;
    }
    if (tok_from) { /* the tokenizer first: it is cheap and its errors should not wait for the weights */
        tok = tokenizer_load(tok_from, (int)cfg_int(c, "model.vocab_size"));
        if (!tok) goto fail;
    }
    if (cli_build_model(c, &m) != MOERL_OK) goto fail;
    if (tok) {
        const int32_t eot = tokenizer_token_id(tok, "<|endoftext|>");
        int n_stop = 0;
        const int32_t *stop = tokenizer_stop_ids(tok, &n_stop);
        m.cfg.bos_token_id = eot;
        m.cfg.eos_token_id = n_stop > 0 ? stop[0] : eot;
    }
    if (model_save_hf(&m, out, bf16, (uint64_t)shard_mb << 20) != MOERL_OK) goto fail;
    if (tokenizer_save(tok ? tok : tok_current(), out) != MOERL_OK) goto fail;
    {
        json_t *j = json_object(), *files = json_array();
        struct dirent **names = NULL;
        const int nn = scandir(out, &names, NULL, alphasort);
        for (int k = 0; k < nn; k++) {
            if (names[k]->d_name[0] != '.')
                json_array_append_new(files, cli_json_text(names[k]->d_name, strlen(names[k]->d_name)));
            free(names[k]);
        }
        free(names);
        json_object_set_new(j, "out", cli_json_text(out, strlen(out)));
        json_object_set_new(j, "parameters", json_integer(model_num_params(&m)));
        json_object_set_new(j, "vocab_size", json_integer(m.cfg.vocab_size));
        json_object_set_new(j, "tokenizer", json_string(tok ? tokenizer_kind(tok) : "bytes"));
        json_object_set_new(j, "files", files);
        cli_print_json(j, 0);
    }
    rc = 0;
fail:
    if (rc) cli_print_error("init", moerl_last_error());
    tokenizer_free(tok);
    model_free(&m);
    cfg_free(c);
    return rc;
}
