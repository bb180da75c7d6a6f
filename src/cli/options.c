/* The option tables of the commands: parsing, --help, usage errors (cli/options.h). */
#include "cli/options.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/trace.h"
#include "cli/common.h"

#define CLI_MAX_OPTS 48
#define CLI_DEF_LEN 96

/* A usage message on stderr: every rank of an mpirun parses the same arguments and fails alike, so
 * only the launcher's rank 0 prints it (one process: always). */
static void parse_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void parse_error(const char *fmt, ...) {
    int rank;
    cli_launcher_world(&rank);
    if (rank != 0) {
        /* every rank refuses the same command line; rank 0 alone says why. The others wait a moment
         * before they exit, so that mpirun (which ends the job at the first non-zero exit) does not
         * kill rank 0 before it has printed the message. */
        usleep(1500 * 1000);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

int cli_flag_once(const char *cmd, const char *flag, const char **slot, const char *value) {
    if (*slot) {
        parse_error("moerl %s: %s given twice ('%s' and '%s'): one per run%s\n", cmd, flag, *slot, value,
                    strcmp(flag, "--config") ? "" : " (override single keys with key=value)");
        return 1;
    }
    *slot = value;
    return 0;
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

/* ---- the table ---- */

/* "--name" (or "-x" for a short-only option), as messages name it */
static const char *opt_flag(const cli_opt *o, char *buf, size_t n) {
    if (o->name) snprintf(buf, n, "--%s", o->name);
    else snprintf(buf, n, "-%c", o->short_name);
    return buf;
}

/* The option an argument starting with '-' names, or NULL; *inline_value: the text after "--name="
 * or after "-x" (NULL when none). */
static const cli_opt *lookup(const cli_spec *s, const char *a, const char **inline_value) {
    *inline_value = NULL;
    if (a[1] == '-') {
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        for (int k = 0; k < s->n_opts; k++)
            if (s->opts[k].name && strlen(s->opts[k].name) == len && !strncmp(s->opts[k].name, name, len)) {
                if (eq) *inline_value = eq + 1;
                return &s->opts[k];
            }
        return NULL;
    }
    for (int k = 0; k < s->n_opts; k++)
        if (s->opts[k].short_name && s->opts[k].short_name == a[1]) {
            if (a[2]) *inline_value = a + 2;
            return &s->opts[k];
        }
    return NULL;
}

/* The text after an option's help in --help: "(required)", "(default X)", "(sets KEY)" or "". */
static void default_text(const cli_opt *o, char *buf, size_t n) {
    buf[0] = 0;
    if (o->flags & CLI_REQUIRED) snprintf(buf, n, " (required)");
    else if (!o->dest) {
        if (o->key) snprintf(buf, n, " (sets %s)", o->key);
    } else if (o->type == CLI_STR) {
        const char *v = *(const char *const *)o->dest;
        if (v && *v) snprintf(buf, n, " (default %s)", v);
    } else if (o->type == CLI_INT) snprintf(buf, n, " (default %lld)", (long long)*(const int64_t *)o->dest);
    else if (o->type == CLI_FLOAT) snprintf(buf, n, " (default %g)", *(const double *)o->dest);
    else if (o->type == CLI_BOOL) snprintf(buf, n, " (default %s)", *(const bool *)o->dest ? "true" : "false");
}

static void print_text(FILE *f, const char *t) {
    if (t && *t) fprintf(f, "%s%s", t, t[strlen(t) - 1] == '\n' ? "" : "\n");
}

static void print_help_with(const cli_spec *s, FILE *f, char defs[][CLI_DEF_LEN]) {
    char left[CLI_MAX_OPTS + 1][96];
    int w = 10; /* "-h, --help" */
    for (int k = 0; k < s->n_opts; k++) {
        const cli_opt *o = &s->opts[k];
        char sh[8] = "", lg[64] = "";
        if (o->short_name) snprintf(sh, sizeof sh, "-%c%s", o->short_name, o->name ? ", " : "");
        if (o->name) snprintf(lg, sizeof lg, "--%s", o->name);
        snprintf(left[k], sizeof left[k], "%s%s%s%s", sh, lg, o->meta ? " " : "", o->meta ? o->meta : "");
        int l = (int)strlen(left[k]);
        if (l > w && l <= 30) w = l;
    }
    fprintf(f, "usage: moerl %s %s\n", s->cmd, s->synopsis);
    print_text(f, s->about);
    fprintf(f, "options:\n");
    for (int k = 0; k < s->n_opts; k++)
        fprintf(f, "  %-*s  %s%s\n", w, left[k], s->opts[k].help, defs ? defs[k] : "");
    if (s->overrides) fprintf(f, "  %-*s  %s\n", w, "key=value", "set a config key (the keys below), after the config file");
    fprintf(f, "  %-*s  %s\n", w, "-h, --help", "this help");
    print_text(f, s->notes);
    if (s->keys) {
        fprintf(f, "keys:\n");
        cfg_print_help(s->keys, f);
    }
}

void cli_print_help(const cli_spec *s, FILE *f) {
    char defs[CLI_MAX_OPTS][CLI_DEF_LEN];
    for (int k = 0; k < s->n_opts && k < CLI_MAX_OPTS; k++) default_text(&s->opts[k], defs[k], CLI_DEF_LEN);
    print_help_with(s, f, defs);
}

/* "a|b|c" → "a, b or c" */
static void choices_text(const char *ch, char *buf, size_t n) {
    size_t bl = 0;
    buf[0] = 0;
    for (const char *p = ch; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        bl += snprintf(buf + bl, bl < n ? n - bl : 0, "%s%.*s", p == ch ? "" : bar ? ", " : " or ", (int)len, p);
        p += len + (bar ? 1 : 0);
    }
}

static int is_choice(const char *ch, const char *v) {
    size_t vl = strlen(v);
    for (const char *p = ch; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == vl && !strncmp(p, v, len)) return 1;
        p += len + (bar ? 1 : 0);
    }
    return 0;
}

/* Convert and store one value (checks above); 1 = a usage error, printed. */
static int store_value(const cli_spec *s, const cli_opt *o, const char *flag, const char *val) {
    char *end;
    errno = 0;
    switch (o->type) {
    case CLI_STR:
        if (o->choices && !is_choice(o->choices, val)) {
            char ex[256];
            choices_text(o->choices, ex, sizeof ex);
            parse_error("moerl %s: %s '%s': expected %s\n", s->cmd, flag, val, ex);
            return 1;
        }
        if (o->dest) *(const char **)o->dest = val;
        break;
    case CLI_INT: {
        long long v = strtoll(val, &end, 10);
        if (end == val || *end || errno || v < o->imin || v > o->imax) {
            parse_error("moerl %s: %s expects an integer in [%lld, %lld], got '%s'\n", s->cmd, flag,
                        (long long)o->imin, (long long)o->imax, val);
            return 1;
        }
        if (o->dest) *(int64_t *)o->dest = v;
        break;
    }
    case CLI_FLOAT: {
        double v = strtod(val, &end);
        if (end == val || *end || !isfinite(v) || v < o->fmin || v > o->fmax) {
            parse_error("moerl %s: %s expects a number in [%g, %g], got '%s'\n", s->cmd, flag, o->fmin, o->fmax, val);
            return 1;
        }
        if (o->dest) *(double *)o->dest = v;
        break;
    }
    case CLI_BOOL:
        if (strcmp(val, "true") && strcmp(val, "false")) {
            parse_error("moerl %s: %s expects true or false, got '%s'\n", s->cmd, flag, val);
            return 1;
        }
        if (o->dest) *(bool *)o->dest = !strcmp(val, "true");
        break;
    case CLI_INT_LIST: {
        cli_int_list *l = o->dest, nl;
        if (cli_parse_int_list(val, &nl.v, &nl.n) != MOERL_OK) {
            parse_error("moerl %s: %s: %s\n", s->cmd, flag, moerl_last_error());
            return 1;
        }
        if (l) {
            free(l->v);
            *l = nl;
        } else free(nl.v);
        break;
    }
    case CLI_FLAG: break;
    }
    if (o->key) s->overrides->v[s->overrides->n++] = (cli_override){o->key, val};
    return 0;
}

/* An argument that is not an option: a key=value override where the command takes them. */
static int positional(const cli_spec *s, const char *a) {
    if (s->overrides && strchr(a, '=')) {
        s->overrides->v[s->overrides->n++] = (cli_override){NULL, a};
        return 0;
    }
    parse_error("moerl %s: unexpected argument '%s' (%s)\n", s->cmd, a,
                s->overrides ? "expected an option or key=value; see --help" : "see --help");
    return 1;
}

/* Whether the argument after an option that needs a value is another option (a forgotten value). */
static int names_option(const cli_spec *s, const char *a) {
    const char *inl;
    return a[0] == '-' && a[1] == '-' && a[2] && (!strcmp(a, "--help") || lookup(s, a, &inl));
}

/* One option at argv[*i] (its value may be the next argument). 1 = a usage error, printed. */
static int parse_option(const cli_spec *s, int argc, char **argv, int *i, const char **seen) {
    const char *a = argv[*i], *val;
    const cli_opt *o = lookup(s, a, &val);
    char flag[80];
    if (!o) {
        parse_error("moerl %s: unknown option '%s' (see --help)\n", s->cmd, a);
        return 1;
    }
    opt_flag(o, flag, sizeof flag);
    if (o->given) *o->given = 1;
    const char **slot = &seen[o - s->opts];
    if (o->type == CLI_FLAG) {
        if (val) {
            parse_error("moerl %s: %s takes no value (got '%s')\n", s->cmd, flag, a);
            return 1;
        }
        if (o->dest) *(int *)o->dest = 1;
        if (o->key) s->overrides->v[s->overrides->n++] = (cli_override){o->key, "true"};
        *slot = "";
        return 0;
    }
    if (!val) {
        if (*i + 1 >= argc || names_option(s, argv[*i + 1])) {
            parse_error("moerl %s: %s needs a value (%s)%s%s%s\n", s->cmd, flag, o->meta ? o->meta : "a value",
                        *i + 1 < argc ? ", not the option '" : "", *i + 1 < argc ? argv[*i + 1] : "",
                        *i + 1 < argc ? "'" : "");
            return 1;
        }
        val = argv[++*i];
    }
    if (cli_flag_once(s->cmd, flag, slot, val)) return 1; /* every value once per run: the last would win silently */
    return store_value(s, o, flag, val);
}

/* After a stop: free what the parse allocated (int lists, overrides). */
static void parse_cleanup(const cli_spec *s) {
    for (int k = 0; k < s->n_opts; k++)
        if (s->opts[k].type == CLI_INT_LIST && s->opts[k].dest) {
            cli_int_list *l = s->opts[k].dest;
            free(l->v);
            l->v = NULL;
            l->n = 0;
        }
    if (s->overrides) cli_overrides_free(s->overrides);
}

int cli_parse(const cli_spec *s, int argc, char **argv, int *exit_code) {
    char defs[CLI_MAX_OPTS][CLI_DEF_LEN]; /* the defaults: the values before any argument */
    const char *seen[CLI_MAX_OPTS] = {0};
    if (s->n_opts > CLI_MAX_OPTS) moerl_fatal("moerl %s: %d options, at most %d", s->cmd, s->n_opts, CLI_MAX_OPTS);
    for (int k = 0; k < s->n_opts; k++) {
        if (s->opts[k].key && !s->overrides) moerl_fatal("moerl %s: an option with a key needs overrides", s->cmd);
        default_text(&s->opts[k], defs[k], CLI_DEF_LEN);
    }
    if (s->overrides) {
        s->overrides->v = xcalloc(argc > 0 ? argc : 1, sizeof(cli_override));
        s->overrides->n = 0;
    }
    *exit_code = 2;
    int only_args = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_args || a[0] != '-' || !a[1]) {
            if (positional(s, a)) goto stop;
        } else if (!strcmp(a, "--")) {
            only_args = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_help_with(s, stdout, defs);
            *exit_code = 0;
            goto stop;
        } else if (parse_option(s, argc, argv, &i, seen)) {
            goto stop;
        }
    }
    for (int k = 0; k < s->n_opts; k++)
        if ((s->opts[k].flags & CLI_REQUIRED) && !seen[k]) {
            char flag[80];
            parse_error("moerl %s: %s%s%s is required (see --help)\n", s->cmd, opt_flag(&s->opts[k], flag, sizeof flag),
                        s->opts[k].meta ? " " : "", s->opts[k].meta ? s->opts[k].meta : "");
            goto stop;
        }
    return 0;
stop:
    parse_cleanup(s);
    return 1;
}

/* Override v's key (the text before '=' of a key=value argument, or an option's key) into buf, trimmed
 * of blanks as cfg_apply_override trims it; its value text in *val. */
static void override_parts(const cli_override *v, char *buf, size_t cap, const char **val) {
    const char *k = v->key ? v->key : v->value, *eq = v->key ? NULL : strchr(v->value, '=');
    size_t n = eq ? (size_t)(eq - k) : strlen(k);
    while (n > 0 && (*k == ' ' || *k == '\t')) k++, n--;
    while (n > 0 && (k[n - 1] == ' ' || k[n - 1] == '\t')) n--;
    snprintf(buf, cap, "%.*s", (int)MOERL_MIN(n, cap - 1), k);
    *val = v->key ? v->value : eq ? eq + 1 : "";
}

/* A key given again on the command line with another value: the last value is used (scripts build a command
 * from a shared list of keys and set one of them again after it), said as a warning naming the key and both
 * values (by the launcher's rank 0 only: every rank parses the same arguments). */
static void warn_repeated_key(const cli_overrides *o, int i) {
    char ki[256], kj[256];
    const char *vi, *vj;
    override_parts(&o->v[i], ki, sizeof ki, &vi);
    for (int j = i - 1; j >= 0; j--) {
        override_parts(&o->v[j], kj, sizeof kj, &vj);
        if (strcmp(ki, kj)) continue;
        if (!strcmp(vi, vj)) return; /* the same value again: nothing is lost */
        int rank;
        cli_launcher_world(&rank);
        if (rank == 0)
            log_warn("%s is given twice on the command line: %s=%s, then %s=%s; the last value (%s) is used", ki, kj,
                     vj, ki, vi, vi);
        return;
    }
}

int cli_apply_overrides(cfg *c, const cli_overrides *o) {
    for (int i = 0; i < o->n; i++) {
        warn_repeated_key(o, i);
        if (!o->v[i].key) {
            if (cfg_apply_override(c, o->v[i].value) != MOERL_OK) return MOERL_ERR;
            continue;
        }
        size_t n = strlen(o->v[i].key) + strlen(o->v[i].value) + 2;
        char *kv = xmalloc(n);
        snprintf(kv, n, "%s=%s", o->v[i].key, o->v[i].value);
        int rc = cfg_apply_override(c, kv);
        free(kv);
        if (rc != MOERL_OK) return rc;
    }
    return MOERL_OK;
}

void cli_overrides_free(cli_overrides *o) {
    free(o->v);
    o->v = NULL;
    o->n = 0;
}

int cli_parse_config_args(cfg *c, int argc, char **argv, const char *cmd, int *exit_code) {
    const char *path = NULL, *profile = NULL;
    cli_overrides ov = {0};
    const cli_opt opts[] = {
        CLI_OPT_STR("config", &path, "FILE", CLI_ONCE, "the run's YAML configuration (required; examples/ has some)"),
        CLI_OPT_STR("profile", &profile, "TRACE.json", 0, "write a Chrome trace (Perfetto) of the run, at exit"),
    };
    const cli_spec s = {.cmd = cmd, .synopsis = "--config FILE [--profile TRACE.json] [key=value ...]", .opts = opts,
                        .n_opts = CLI_NOPTS(opts), .overrides = &ov, .keys = c};
    if (cli_parse(&s, argc, argv, exit_code)) return 2;
    int rc = 1;
    if (!path) {
        parse_error("moerl %s: --config FILE is required (see --help; examples/ has configs)\n", cmd);
        rc = *exit_code = 2;
    } else if (cfg_load_yaml(c, path) != MOERL_OK || cli_apply_overrides(c, &ov) != MOERL_OK ||
               cfg_check_int32(c, "seed,_bytes") != MOERL_OK) {
        parse_error("moerl %s: %s\n", cmd, moerl_last_error());
    } else if (profile && trace_open(profile) != MOERL_OK) { /* Chrome trace, written at exit (base/trace.h) */
        parse_error("moerl %s: --profile: %s\n", cmd, moerl_last_error());
    } else {
        rc = 0;
    }
    if (rc == 1) *exit_code = 1;
    cli_overrides_free(&ov);
    return rc;
}
