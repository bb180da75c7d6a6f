/* moerl — typed configuration registry: declared keys, YAML files, `a.b.c=value` overrides.
 *
 * The program (cli/) declares every key it understands, with its type, default and a one-line
 * help, before reading anything:
 *
 *     cfg *c = cfg_new();
 *     cfg_def_int(c, "actor.ppo_mini_batch_size", 4, "prompts per mini-batch");
 *     cfg_def_float(c, "actor.clip_ratio_low", 0.2, "PPO clip epsilon below 1");
 *     if (cfg_load_yaml(c, "run.yaml") || cfg_apply_override(c, "rollout.n=8")) die(moerl_last_error());
 *     int64_t mb = cfg_int(c, "actor.ppo_mini_batch_size");
 *     cfg_dump_yaml(c, "out/config.yaml");       // every key, resolved, for the run record
 *
 * Keys are dotted paths ("actor.optim.lr"); a YAML file gives them as nested mappings
 * (`actor: {optim: {lr: 1e-6}}`), which are flattened to dotted keys, in the spirit of Hydra /
 * OmegaConf as verl uses them (key names follow verl's where one exists; see docs/configuration.md).
 * Precedence: default < YAML files (later files win) < overrides (always win, whatever the
 * order of the calls).
 *
 * Typing is strict: a key is never created by a file or an override; an unknown key is an
 * error naming the file/line (or the override) and suggesting the closest declared key
 * (Levenshtein distance, as git does for mistyped commands, with a key of the same last
 * component counted as distance 1, so "actor.lr" suggests "actor.optim.lr"); a value of the wrong type is an
 * error naming the key, the value and the expected type. A file or override is applied
 * all-or-nothing: on error the registry is unchanged.
 *
 * Scalar syntax (YAML plain scalars and override values alike):
 *   int      decimal with optional sign, fits int64 ("4", "-1"); not "4.0", not quoted in YAML
 *   float    decimal or exponent form ("1e-6", "0.2", "3"), "inf"/".inf" with optional sign; not nan
 *   bool     true/false, yes/no, on/off (any case, as YAML 1.1); not 0/1
 *   string   any scalar; YAML null (~, null, empty) gives ""; in an override, surrounding
 *            matching quotes are removed
 *   int-list a YAML sequence of ints (block or flow "[1, 2]"); an override "[1,2,3]", "1,2,3" or "[]"
 *   string-list a YAML sequence of non-empty strings ("[console, file]", block "- console"), or
 *            one scalar "console,file" / "[console, file]" split at commas (no comma inside an
 *            item), the same in an override ("trainer.logger=console,tensorboard"); items are
 *            trimmed, matching quotes around an item removed; "[]" or "" is the empty list
 *
 * Errors follow common.h: functions return MOERL_OK / MOERL_ERR and set moerl_last_error().
 * Asking a getter for an undeclared key, or for a key of another type, is a bug in moerl and
 * aborts with moerl_fatal (naming the key), as does declaring a key twice.
 */
#ifndef MOERL_CONFIG_H
#define MOERL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { CFG_INT, CFG_FLOAT, CFG_BOOL, CFG_STR, CFG_INT_LIST, CFG_STR_LIST } cfg_type;

typedef struct cfg cfg;

/* An empty registry. Free with cfg_free. */
cfg *cfg_new(void);
void cfg_free(cfg *c);

/* Declare a key. key: dot-separated components of [A-Za-z0-9_-]+; a key may not also be a
 * section of another key ("a.b" and "a.b.c" cannot both exist). help: one line, written as a
 * comment by cfg_dump_yaml. Declaring an invalid or duplicate key aborts (programming error). */
void cfg_def_int(cfg *c, const char *key, int64_t def, const char *help);
void cfg_def_float(cfg *c, const char *key, double def, const char *help);
void cfg_def_bool(cfg *c, const char *key, bool def, const char *help);
/* def may be NULL (stored as ""). The string is copied. */
void cfg_def_str(cfg *c, const char *key, const char *def, const char *help);
/* def: n values (n may be 0, def then may be NULL). Copied. */
void cfg_def_int_list(cfg *c, const char *key, const int64_t *def, int n, const char *help);
/* def: n non-empty UTF-8 strings (n may be 0, def then may be NULL). Copied. */
void cfg_def_str_list(cfg *c, const char *key, const char *const *def, int n, const char *help);

/* Read a YAML file whose top level is a mapping (an empty file is fine) and set every key it
 * gives; nested mappings flatten to dotted keys. Keys already set by cfg_apply_override keep
 * their override value. Errors (registry unchanged): cannot read; YAML syntax ("path:L:C: YAML
 * syntax error: ..." with libyaml's line/column); top level not a mapping; unknown key
 * ("path:L: unknown key 'k' (did you mean 'k2'?)"); wrong type ("path:L: key 'k': value 'v'
 * is not a valid int (expected ...)"); a key given twice in the file; aliases/anchors; more than
 * one document. */
int cfg_load_yaml(cfg *c, const char *path);
/* As cfg_load_yaml on in-memory text; `name` stands for the path in messages. */
int cfg_load_yaml_string(cfg *c, const char *text, size_t len, const char *name);

/* Apply one command-line override "a.b.c=value" (the key may not contain '='; the value runs to
 * the end of the string). Errors: no '='; unknown key (with suggestion); wrong type. A later
 * override of the same key replaces an earlier one. */
int cfg_apply_override(cfg *c, const char *assignment);

/* Getters: the resolved value. Undeclared key or wrong type: moerl_fatal (programming error). */
int64_t cfg_int(const cfg *c, const char *key);
double cfg_float(const cfg *c, const char *key);
bool cfg_bool(const cfg *c, const char *key);
/* Pointer owned by the registry, valid until the key is set again or cfg_free. */
const char *cfg_str(const cfg *c, const char *key);
/* Returns the values (NULL when empty) and stores their count in *n. Owned by the registry. */
const int64_t *cfg_int_list(const cfg *c, const char *key, int *n);
/* The items (NULL when empty), their count in *n. Owned by the registry. */
const char *const *cfg_str_list(const cfg *c, const char *key, int *n);

/* Every int (and int-list item) must fit 32 bits, except keys ending in one of the comma-separated
 * suffixes of exempt_suffix (e.g. "seed,_bytes": seeds and byte budgets are 64-bit); the error names the
 * key, where its value came from, and the value. */
int cfg_check_int32(const cfg *c, const char *exempt_suffix);

/* Whether `key` is declared. */
bool cfg_has(const cfg *c, const char *key);
/* Where the current value of `key` came from: "default", "<path>:<line>" or "override".
 * Undeclared key: moerl_fatal. */
const char *cfg_origin(const cfg *c, const char *key);

/* Write every declared key with its resolved value as nested YAML (keys sorted component by
 * component, each with its help as a trailing comment), atomically (temp file + rename, see
 * moerl_write_file_atomic). The file loads back with cfg_load_yaml to the same values (floats
 * are written with the shortest %g form that reads back to the same double). */
int cfg_dump_yaml(const cfg *c, const char *path);
/* The same text as cfg_dump_yaml into a heap string (caller frees). */
char *cfg_dump_yaml_string(const cfg *c);

/* A help table: one line per key (key, type, default, help), sorted, to `out`. */
void cfg_print_help(const cfg *c, FILE *out);

/* Levenshtein edit distance between two strings (insert, delete, substitute each cost 1).
 * Exposed for tests and for other "did you mean" messages. */
int cfg_edit_distance(const char *a, const char *b);

/* Name another command's keys in this one's unknown-key messages (messages only: nothing is declared). c takes
 * `other` (freed by cfg_free); name, other_name ("moerl sft", "moerl rl") and spell stay the caller's (static).
 * spell: n_spell (from, to) pairs, the other command's spelling of this one's keys, each a whole key or a prefix
 * ending in '.' ("actor.optim." → "optim."). An unknown key that a pair maps onto a key of c is named: "('k' is
 * moerl rl's spelling; moerl sft's key is 'k2')"; onto a typo of one, the usual "did you mean" plus the spelling
 * rule; a key only `other` declares: "('k' is a key of moerl rl, not of moerl sft; ...)". Else the usual
 * suggestion. */
void cfg_set_other_command(cfg *c, const char *name, cfg *other, const char *other_name, const char *const *spell,
                           int n_spell);

#endif
