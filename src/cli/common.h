/* Glue shared by the training commands: declaring and reading the model.* and data.* keys,
 * building or loading the model, preparing task files, thread settings. */
#ifndef MOERL_CLI_COMMON_H
#define MOERL_CLI_COMMON_H

#include <jansson.h>
#include <stdbool.h>

#include "base/config.h"
#include "data/dataset.h"
#include "model/model.h"

/* Declare model.* keys (model.path or an architecture for random init). */
void cli_def_model_keys(cfg *c);
/* Declare data.* keys for built-in tasks / JSONL files. */
void cli_def_data_keys(cfg *c);
/* Parse "--config FILE [key=value ...]" (also "--help"): loads the YAML, applies overrides.
 * Returns 0 ok, 1 error (printed), 2 usage printed / --help (exit 0 when help). */
int cli_parse_config_args(cfg *c, int argc, char **argv, const char *cmd, int *exit_code);
/* Load model.path, or create a new model from the model.* architecture keys (random init
 * with model.seed). Prints what it did. */
int cli_build_model(const cfg *c, moe_model *m);
/* The architecture without weights: from `model` (a folder holding config.json, or the file) when
 * non-empty, else from model.path when set, else from the model.* keys (validated; errors name the
 * file or "model.*"). model NULL = use model.path / the keys. */
int cli_model_config(const cfg *c, const char *model, moe_config *mc);
/* Resolve train/test files: with data.task set, generate them under <out_dir>/data (unless they
 * exist with the same options); else data.train_files / data.val_files. Loads both; an empty
 * data.val_files leaves *test empty (path NULL): cli_check_held_out_rows refuses that where held-out
 * rows are evaluated. Prompts longer than data.max_prompt_length (when > 0) are an error naming the
 * file, line and length, or dropped from either split with data.filter_overlong_prompts=true. */
int cli_prepare_data(const cfg *c, const char *out_dir, dataset *train, dataset *test);
/* The data.* keys, before anything is read or written: data.task (generated data) and
 * data.train_files / data.val_files (files) exclude each other — a file given beside a task would be
 * silently unused — and with a task, data.n_test must be ≥ 1 when the command evaluates on the
 * held-out split (why_test: the key or reason that evaluates, named in the error; NULL = no held-out
 * evaluation, n_test = 0 allowed); data.filter_overlong_prompts=true needs data.max_prompt_length > 0
 * (with no limit it would drop nothing). Errors name the keys, their values and the way out. */
int cli_check_data_keys(const cfg *c, const char *why_test);
/* After cli_prepare_data: a held-out split without rows is refused when why_test (as above) is set;
 * the error names data.val_files or data.n_test. */
int cli_check_held_out_rows(const cfg *c, const dataset *test, const char *why_test);
/* Set OpenMP/OpenBLAS threads for this process (0 = all cores). */
void cli_set_threads(int n);
/* Write a checkpoint and, beside it, the files of the current tokenizer (tokenizer_save: the
 * checkpoint's own tokenizer files, or moerl's byte-tokenizer marker). */
int cli_save_checkpoint(const moe_model *m, const char *dir, int bf16);
/* Load the tokenizer of model_dir (NULL: moerl's byte tokenizer, for a new model), choose its chat
 * template (chat_template: auto | qwen3 | chatml, NULL: none, for token-only use; errors name
 * `key`) and make it the process's
 * current tokenizer (tok_set_current), replacing the one set before. */
int cli_use_tokenizer(const char *model_dir, int vocab_size, const char *chat_template, bool enable_thinking,
                      const char *key);

/* ---- the output folder of a run (rl, sft) ---- */

/* The file `moerl simulate` leaves in every folder it writes (metrics.jsonl, samples.jsonl and plots
 * like a run's): `moerl rl` refuses such a folder unless told to overwrite it, and simulate refuses a
 * folder holding a real run (its checkpoints or its run.log, which a simulation never writes). */
#define CLI_SIMULATION_MARKER "SIMULATION"


typedef struct {
    char dir[4096];
    char top[4096]; /* the highest folder this run created ("" when dir existed already) */
} cli_outdir;

/* Each `names[i]` (n of them) inside dir must be a folder when it exists: a file there (e.g. a
 * stray file named `checkpoint`) is an error naming it and what to do, found before any work. */
int cli_outdir_check_subdirs(const char *dir, const char *const *names, int n);
/* Create dir (with parents) and lock it for this process (moerl_lock_dir), remembering which
 * folders this call created. Errors: as moerl_mkdirs / moerl_lock_dir. */
int cli_outdir_open(cli_outdir *o, const char *dir);
/* After a failure before the run produced anything: when cli_outdir_open created the folder and
 * it holds nothing but what setting up wrote (.moerl.lock, config.yaml, generated data/), remove it
 * and the parents it created, so a failed start leaves nothing behind. Otherwise leave it alone. */
void cli_outdir_abandon(const cli_outdir *o);

/* Print one JSON value as a line on stdout (compact, ASCII-escaped, reals with 6 significant
 * digits unless real_precision > 0) and free it. */
void cli_print_json(json_t *j, int real_precision);
/* "moerl <cmd>: <message>" on stderr, where a message that already starts with "<cmd>: " (an
 * error made by the library for that command) does not repeat it. */
void cli_print_error(const char *cmd, const char *msg);
/* The world size an MPI launcher gave this process (Open MPI, MPICH/Intel MPI hydra, MVAPICH) and
 * its rank in *rank, read from the launcher's environment (no MPI call: usable before MPI_Init);
 * size 1 and rank 0 when not launched by one. */
int cli_launcher_world(int *rank);
/* Check every row's data_source names a reward function; the error names file:line and the value. */
int cli_check_data_sources(const dataset *ds);

/* JSON values for command output (jansson): a non-finite number becomes null (JSON has no NaN,
 * and jansson would drop the value); text that is not valid UTF-8 has each invalid byte
 * replaced by U+FFFD, so the field is never silently missing. */
json_t *cli_json_real(double x);
json_t *cli_json_text(const char *s, size_t len);

#endif
