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
