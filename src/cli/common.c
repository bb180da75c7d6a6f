#include "cli/common.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/outdir.h"
#include "base/trace.h"

void openblas_set_num_threads(int n);

/* A message of cli_parse_config_args on stderr: every rank of an mpirun parses the same arguments and
 * fails alike, so only the launcher's rank 0 prints it (one process: always). */
static void parse_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void parse_error(const char *fmt, ...) {
    int rank;
    cli_launcher_world(&rank);
    if (rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

int cli_flag_once(const char *cmd, const char *flag, const char **slot, const char *value) {
    if (*slot) {
        fprintf(stderr, "moerl %s: %s given twice ('%s' and '%s'): one per run%s\n", cmd, flag, *slot, value,
                strcmp(flag, "--config") ? "" : " (override single keys with key=value)");
        return 1;
    }
    *slot = value;
    return 0;
}

int cli_parse_config_args(cfg *c, int argc, char **argv, const char *cmd, int *exit_code) {
    const char *path = NULL, *profile = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: moerl %s --config FILE [--profile TRACE.json] [key=value ...]\nkeys:\n", cmd);
            cfg_print_help(c, stdout);
            *exit_code = 0;
            return 2;
        }
        if (!strcmp(argv[i], "--config") || !strcmp(argv[i], "--profile")) {
            if (i + 1 >= argc) {
                parse_error("moerl %s: %s needs a file\n", cmd, argv[i]);
                *exit_code = 2;
                return 2;
            }
            if (!strcmp(argv[i], "--profile")) {
                profile = argv[++i];
                continue;
            }
            if (path) {
                parse_error("moerl %s: --config given twice ('%s' and '%s'): one config file per run (override "
                                "single keys with key=value)\n", cmd, path, argv[i + 1]);
                *exit_code = 2;
                return 2;
            }
            path = argv[++i];
            continue;
        }
        if (!strncmp(argv[i], "--config=", 9)) {
            if (path) {
                parse_error("moerl %s: --config given twice ('%s' and '%s'): one config file per run (override "
                                "single keys with key=value)\n", cmd, path, argv[i] + 9);
                *exit_code = 2;
                return 2;
            }
            path = argv[i] + 9;
            continue;
        }
        if (argv[i][0] == '-') { /* e.g. --n-train 8: a flag of another command, or a typo */
            parse_error("moerl %s: unknown option '%s' (this command takes --config FILE and key=value "
                            "overrides; see --help)\n", cmd, argv[i]);
            *exit_code = 2;
            return 2;
        }
    }
    if (!path) {
        parse_error("moerl %s: --config FILE is required (see --help; examples/ has configs)\n", cmd);
        *exit_code = 2;
        return 2;
    }
    if (path && cfg_load_yaml(c, path) != MOERL_OK) {
        parse_error("moerl %s: %s\n", cmd, moerl_last_error());
        *exit_code = 1;
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") || !strcmp(argv[i], "--profile")) { i++; continue; }
        if (!strncmp(argv[i], "--config=", 9)) continue;
        if (!strchr(argv[i], '=')) {
            parse_error("moerl %s: unexpected argument '%s' (expected --config FILE or key=value)\n", cmd, argv[i]);
            *exit_code = 2;
            return 2;
        }
        if (cfg_apply_override(c, argv[i]) != MOERL_OK) {
            parse_error("moerl %s: %s\n", cmd, moerl_last_error());
            *exit_code = 1;
            return 1;
        }
    }
    if (cfg_check_int32(c, "seed") != MOERL_OK) {
        parse_error("moerl %s: %s\n", cmd, moerl_last_error());
        *exit_code = 1;
        return 1;
    }
    if (profile && trace_open(profile) != MOERL_OK) { /* Chrome trace, written at exit (base/trace.h) */
        parse_error("moerl %s: --profile: %s\n", cmd, moerl_last_error());
        *exit_code = 1;
        return 1;
    }
    return 0;
}

void cli_print_json(json_t *j, int real_precision) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER |
                                JSON_REAL_PRECISION(real_precision > 0 ? real_precision : 6));
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(j);
}

int cli_launcher_world(int *rank) { return moerl_launcher_world(rank); }

void cli_print_error(const char *cmd, const char *msg) {
    size_t n = strlen(cmd);
    if (!strncmp(msg, cmd, n) && msg[n] == ':' && msg[n + 1] == ' ') msg += n + 2;
    fprintf(stderr, "moerl %s: %s\n", cmd, msg);
}

void cli_set_threads(int n) {
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
}

json_t *cli_json_real(double x) { return isfinite(x) ? json_real(x) : json_null(); }

json_t *cli_json_text(const char *s, size_t len) {
    json_t *j = json_stringn(s, len);
    if (j) return j;
    /* not valid UTF-8: keep valid sequences, replace every other byte with U+FFFD */
    char *out = xmalloc(len * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = n > 0 && i + n <= len && c != 0;
        for (int k = 1; ok && k < n; k++) ok = ((unsigned char)s[i + k] >> 6) == 2;
        if (ok && n > 1) {
            json_t *t = json_stringn(s + i, n); /* rejects overlongs and surrogates */
            ok = t != NULL;
            json_decref(t);
        }
        if (ok) {
            memcpy(out + o, s + i, n);
            o += n;
            i += n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(out, o);
    free(out);
    return j ? j : json_string("");
}
