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
#include <unistd.h>
#include <sys/stat.h>

#include "base/common.h"
#include "base/config.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "cli/options.h"
#include "data/tokenizer.h"
#include "model/model.h"

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

/* data.chat_template / data.enable_thinking given to init would have no effect: a checkpoint keeps
 * its tokenizer's files, not a choice of template. */
static int init_refuse_chat_keys(const cfg *c) {
    static const char *const keys[] = {"data.chat_template", "data.enable_thinking"};
    for (int k = 0; k < 2; k++)
        if (strcmp(cfg_origin(c, keys[k]), "default"))
            return moerl_errorf("%s is set (%s), but init stores no chat template choice in a checkpoint (its template "
                                "is its tokenizer's own, --tokenizer-from): set %s where prompts are rendered (sft, "
                                "rl, generate --chat-template, eval --chat-template)",
                                keys[k], cfg_origin(c, keys[k]), keys[k]);
    return MOERL_OK;
}

int cmd_init(int argc, char **argv) {
    cfg *c = cfg_new();
    cli_def_model_keys(c);
    /* read by the model builder when it sets up the byte tokenizer; a checkpoint stores no template choice,
     * so init refuses them when set (init_refuse_chat_keys) */
    cfg_def_str(c, "data.chat_template", "auto",
                "not stored in a checkpoint (its template is its tokenizer's own): only the default auto is accepted; "
                "choose the template where prompts are rendered (sft, rl, generate, eval)");
    cfg_def_bool(c, "data.enable_thinking", true,
                 "not stored in a checkpoint: only the default is accepted; set it where prompts are rendered");
    const char *out = NULL, *config = NULL, *tok_from = NULL;
    int bf16 = 0, rc = 1, code;
    int64_t shard_mb = 0;
    cli_overrides ov = {0};
    const cli_opt opts[] = {
        CLI_OPT_STR("out", &out, "DIR", CLI_ONCE | CLI_REQUIRED, "the new checkpoint folder (must not exist or be empty)"),
        CLI_OPT_STR("config", &config, "FILE", CLI_ONCE, "YAML with model.* keys (the keys below), overridden by key=value"),
        CLI_OPT_STR("tokenizer-from", &tok_from, "DIR", CLI_ONCE,
                    "copy that folder's tokenizer files (tokenizer.json, ...); default: moerl's byte tokenizer"),
        CLI_OPT_FLAG("bf16", &bf16, "store the weights as BF16 (default F32)"),
        CLI_OPT_INT("shard-mb", &shard_mb, "N", 0, 1000000,
                    "shard the weights into files of at most N MB, with an index; 0 = one file"),
    };
    const cli_spec spec = {.cmd = "init", .opts = opts, .n_opts = CLI_NOPTS(opts), .overrides = &ov, .keys = c,
                           .synopsis = "--out DIR [--config FILE] [--tokenizer-from DIR] [--bf16] [--shard-mb N] "
                                       "[model.key=value ...]",
                           .about = "Writes a new, randomly initialised Qwen3-MoE checkpoint folder (Hugging Face "
                                    "layout) from the model.* keys and prints {\"out\", \"parameters\", "
                                    "\"vocab_size\", \"tokenizer\", \"files\"}."};
    tokenizer *tok = NULL;
    moe_model m;
    memset(&m, 0, sizeof m);
    if (cli_parse(&spec, argc, argv, &code)) {
        cfg_free(c);
        return code;
    }
    if ((config && cfg_load_yaml(c, config) != MOERL_OK) || cli_apply_overrides(c, &ov) != MOERL_OK) goto fail;
    if (init_refuse_chat_keys(c) != MOERL_OK) goto fail;
    if (cfg_str(c, "model.path")[0]) {
        moerl_errorf("model.path is set ('%s'): init makes a new model from the model.* keys", cfg_str(c, "model.path"));
        goto fail;
    }
    if (dir_has_files(out)) {
        moerl_errorf("--out '%s' already holds files; init writes a new folder (remove it or pick another)", out);
        goto fail;
    }
    if (tok_from) { /* the tokenizer first: it is cheap and its errors should not wait for the weights */
        char tj[4200];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", tok_from);
        if (access(tj, R_OK) != 0) { /* tokenizer_load would take a folder without one for the byte tokenizer */
            moerl_errorf("--tokenizer-from '%s': no readable tokenizer.json there (a Hugging Face checkpoint folder "
                         "with its tokenizer files is expected; leave the flag out for moerl's byte tokenizer)", tok_from);
            goto fail;
        }
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
    cli_overrides_free(&ov);
    cfg_free(c);
    return rc;
}
