/* Glue shared by the commands: the key=value command line, printing (JSON lines, errors) and the
 * process's thread count. Config keys, data, models and output folders are library code
 * (model/model_config.h, data/data_config.h, parallel/config.h, rl/, base/outdir.h). */
#ifndef MOERL_CLI_COMMON_H
#define MOERL_CLI_COMMON_H

#include <jansson.h>
#include <stdbool.h>

#include "base/config.h"
#include "base/outdir.h"
#include "data/data_config.h"
#include "data/dataset.h"
#include "model/model.h"
#include "model/model_config.h"

/* Parse "--config FILE [key=value ...]" (also "--help"): loads the YAML, applies overrides.
 * Returns 0 ok, 1 error (printed), 2 usage printed / --help (exit 0 when help). */
int cli_parse_config_args(cfg *c, int argc, char **argv, const char *cmd, int *exit_code);
/* Set OpenMP/OpenBLAS threads for this process (0 = all cores). */
void cli_set_threads(int n);

/* The library's names under the ones the other commands call (model/model_config.h,
 * data/data_config.h): model.* keys, the model they build with its tokenizer, the reward check. */
static inline void cli_def_model_keys(cfg *c) { model_def_keys(c); }
static inline int cli_build_model(const cfg *c, moe_model *m) {
    if (model_build_from_keys(c, m) != 0) return -1;
    return data_use_model_tokenizer(c, m->cfg.vocab_size);
}
static inline int cli_use_tokenizer(const char *model_dir, int vocab_size, const char *chat_template,
                                    bool enable_thinking, const char *key) {
    return data_use_tokenizer(model_dir, vocab_size, chat_template, enable_thinking, key);
}
static inline int cli_check_data_sources(const dataset *ds) { return data_check_sources(ds); }

/* Print one JSON value as a line on stdout (compact, ASCII-escaped, reals with 6 significant
 * digits unless real_precision > 0) and free it. */
void cli_print_json(json_t *j, int real_precision);
/* "moerl <cmd>: <message>" on stderr, where a message that already starts with "<cmd>: " (an
 * error made by the library for that command) does not repeat it. */
void cli_print_error(const char *cmd, const char *msg);
/* The world size an MPI launcher gave this process and its rank in *rank (moerl_launcher_world,
 * base/outdir.h); size 1 and rank 0 when not launched by one. */
int cli_launcher_world(int *rank);
/* A flag that takes one value per run (--config, --model): stores value in *slot, or, when *slot is
 * already set, prints "moerl CMD: FLAG given twice ('A' and 'B') ..." to stderr and returns 1 (the last
 * one would otherwise win silently). */
int cli_flag_once(const char *cmd, const char *flag, const char **slot, const char *value);

/* JSON values for command output (jansson): a non-finite number becomes null (JSON has no NaN,
 * and jansson would drop the value); text that is not valid UTF-8 has each invalid byte
 * replaced by U+FFFD, so the field is never silently missing. */
json_t *cli_json_real(double x);
json_t *cli_json_text(const char *s, size_t len);

#endif
