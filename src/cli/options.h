/* The command-line options of the moerl commands: one table per command (cli_opt[]), from which
 * cli_parse reads argv and prints --help. Every command parses the same way:
 *   --name VALUE, --name=VALUE, -x VALUE, -xVALUE   an option with a value
 *   --name, -x                                       a flag
 *   key=value                                        a config override (commands with cfg keys only)
 *   --                                               the rest are arguments, not options
 *   -h, --help                                       the generated help on stdout, exit 0
 * Usage errors print "moerl CMD: ..." on stderr (on the launcher's rank 0 only) and exit 2:
 *   unknown option '--x' (see --help)                 an option not in the table
 *   --x needs a value (N)                             no value, or the next argument is another option
 *   --x takes no value (got '--x=v')                  a value given to a flag
 *   --x expects an integer in [lo, hi], got 'v'       CLI_INT; "a number" for CLI_FLOAT
 *   --x 'v': expected a or b                          CLI_STR with choices
 *   --x: <list error>                                 CLI_INT_LIST
 *   --x given twice ('a' and 'b'): one per run        any option with a value (cli_flag_once)
 *   --x N is required (see --help)                    CLI_REQUIRED
 *   unexpected argument 'v' (...)                     an argument that is not key=value
 * A table points at the command's own variables (dest), whose values before cli_parse are the
 * defaults --help prints: the default lives in one place. */
#ifndef MOERL_CLI_OPTIONS_H
#define MOERL_CLI_OPTIONS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>

#include "base/config.h"

typedef enum {
    CLI_FLAG,     /* no value: int *dest becomes 1 */
    CLI_STR,      /* const char **dest: the argument itself (argv's storage) */
    CLI_INT,      /* int64_t *dest, in [imin, imax] */
    CLI_FLOAT,    /* double *dest, finite, in [fmin, fmax] */
    CLI_BOOL,     /* bool *dest: true | false */
    CLI_INT_LIST, /* cli_int_list *dest: "1,5,9" (the caller frees v) */
} cli_opt_type;

enum {
    CLI_ONCE = 1,     /* documents the rule every option with a value follows: a second occurrence is an error naming both values */
    CLI_REQUIRED = 2, /* the command cannot run without it */
};

typedef struct {
    int *v;
    int n;
} cli_int_list;

/* One option. name: the long flag without "--" (NULL: short flag only); short_name: 'n' for -n
 * (0: none); dest: the variable it sets (type above; NULL: only key); given: when non-NULL, set to
 * 1 when the option appears (an option that applies in one mode only); key: the config key it sets,
 * collected as a key=value override (cli_spec.overrides) in command-line order (a CLI_FLAG's as
 * key=true); meta: the value's name in --help ("DIR", "N"); help: one line; imin..imax, fmin..fmax:
 * CLI_INT's and CLI_FLOAT's range; choices: CLI_STR's allowed values "a|b" (NULL: any); flags:
 * CLI_ONCE, CLI_REQUIRED. A CLI_FLAG takes no value; every other type takes one. */
typedef struct {
    const char *name;
    char short_name;
    cli_opt_type type;
    void *dest;
    int *given;
    const char *key;
    const char *meta;
    const char *help;
    int64_t imin, imax;
    double fmin, fmax;
    const char *choices;
    unsigned flags;
} cli_opt;

/* Table rows (designated initializers; every other field 0). */
#define CLI_OPT_FLAG(nm, d, hl) {.name = (nm), .type = CLI_FLAG, .dest = (d), .help = (hl)}
#define CLI_OPT_STR(nm, d, mt, fl, hl) {.name = (nm), .type = CLI_STR, .dest = (d), .meta = (mt), .help = (hl), .flags = (fl)}
#define CLI_OPT_CHOICE(nm, d, mt, ch, hl) {.name = (nm), .type = CLI_STR, .dest = (d), .meta = (mt), .help = (hl), .choices = (ch)}
#define CLI_OPT_INT(nm, d, mt, lo, hi, hl) {.name = (nm), .type = CLI_INT, .dest = (d), .meta = (mt), .help = (hl), .imin = (lo), .imax = (hi)}
#define CLI_OPT_FLOAT(nm, d, mt, lo, hi, hl) {.name = (nm), .type = CLI_FLOAT, .dest = (d), .meta = (mt), .help = (hl), .fmin = (lo), .fmax = (hi)}
#define CLI_OPT_LIST(nm, d, mt, fl, hl) {.name = (nm), .type = CLI_INT_LIST, .dest = (d), .meta = (mt), .help = (hl), .flags = (fl)}
/* An option that sets a config key and nothing else: --name VALUE = key=VALUE. */
#define CLI_OPT_KEY(nm, k, mt, hl) {.name = (nm), .type = CLI_STR, .key = (k), .meta = (mt), .help = (hl)}
#define CLI_NOPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* A key=value argument, or an option with a key (key set: value is the option's value). */
typedef struct {
    const char *key;
    const char *value;
} cli_override;
typedef struct {
    cli_override *v;
    int n;
} cli_overrides;

/* A command: cmd its name ("moerl CMD: ..." in messages); synopsis the usage line after
 * "usage: moerl CMD " (may hold "\n   or: moerl CMD ..." lines); about the text under it; opts
 * its table; overrides: non-NULL = the command takes key=value arguments (collected there, with
 * the options that have a key); keys: non-NULL = --help ends with these config keys; notes: text
 * after the options (NULL: none). */
typedef struct {
    const char *cmd;
    const char *synopsis;
    const char *about;
    const cli_opt *opts;
    int n_opts;
    cli_overrides *overrides;
    const cfg *keys;
    const char *notes;
} cli_spec;

/* Parse argv[1..argc-1] by the table: sets each option's dest (and spec->overrides). Returns 0:
 * go on; 1: stop and exit with *exit_code (0 after --help, printed on stdout; 2 after a usage
 * error, printed on stderr as listed at the top). On a stop nothing needs freeing (the lists and
 * overrides it made are freed). */
int cli_parse(const cli_spec *s, int argc, char **argv, int *exit_code);
/* The generated help: usage line, about, one line per option (with its default: the dest's value
 * now), notes, then the config keys. */
void cli_print_help(const cli_spec *s, FILE *f);
/* Apply the overrides in order (cfg_apply_override; origin "override" = the command line). A key given
 * twice with two values: the last one is used, with a warning naming the key and both values.
 * Errors: as cfg_apply_override (unknown key with a suggestion, wrong type), naming the key. */
int cli_apply_overrides(cfg *c, const cli_overrides *o);
void cli_overrides_free(cli_overrides *o);

/* Parse "--config FILE [--profile TRACE.json] [key=value ...]" (also "--help"): loads the YAML,
 * applies the overrides, checks int keys fit 32 bits (except *seed), opens the --profile trace.
 * Returns 0 ok; 1 error (printed; *exit_code 1); 2 usage printed or --help (*exit_code 2 or 0). */
int cli_parse_config_args(cfg *c, int argc, char **argv, const char *cmd, int *exit_code);
/* A flag that takes one value per run (--config, --model): stores value in *slot, or, when *slot is
 * already set, prints "moerl CMD: FLAG given twice ('A' and 'B'): one per run" to stderr and
 * returns 1 (the last one would otherwise win silently). */
int cli_flag_once(const char *cmd, const char *flag, const char **slot, const char *value);
/* Parse "1,5,9" into a heap array of ints (*out, *n ≥ 1). Errors name the offending item. */
int cli_parse_int_list(const char *s, int **out, int *n);

#endif
