/* reward_backend_create and what the outside-world backends (proc.c, http.c) share: the request's
 * JSON, the reading of answers, reward.command's words. The protocol is docs/rewards.md's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wordexp.h>

#include "base/common.h"
#include "base/utf8.h"
#include "reward/reward_internal.h"

reward_backend *reward_backend_create(const reward_config *c) {
    switch (c->kind) {
    case REWARD_BUILTIN: return reward_backend_builtin();
    case REWARD_FUNCTION:
    case REWARD_COMMAND: return reward_proc_create(c);
    case REWARD_URL: return reward_http_create(c);
    }
    moerl_errorf("reward backend: unknown kind %d", (int)c->kind);
    return NULL;
}

int reward_split_command(const char *command, char ***argv, int *argc) {
    wordexp_t we;
    int rc = wordexp(command, &we, WRDE_NOCMD | WRDE_UNDEF);
    switch (rc) {
    case 0: break;
    case WRDE_BADCHAR:
        return moerl_errorf("'%s' has one of | & ; < > ( ) { } or a newline outside quotes: the command runs one "
                            "program without a shell (quote the character, or run sh -c '...')", command);
    case WRDE_CMDSUB:
        return moerl_errorf("'%s' has a command substitution ($(...) or `...`), which is not run", command);
    case WRDE_BADVAL: return moerl_errorf("'%s' uses an undefined environment variable", command);
    case WRDE_SYNTAX: return moerl_errorf("'%s' has unbalanced quotes or parentheses", command);
    default: return moerl_errorf("'%s' cannot be split into words (wordexp error %d)", command, rc);
    }
    if (we.we_wordc == 0) {
        wordfree(&we);
        return moerl_errorf("'%s' names no program", command);
    }
    *argc = (int)we.we_wordc;
    *argv = xcalloc(we.we_wordc + 1, sizeof(char *));
    for (size_t i = 0; i < we.we_wordc; i++) (*argv)[i] = xstrdup(we.we_wordv[i]);
    wordfree(&we);
    return MOERL_OK;
}

void reward_free_argv(char **argv, int argc) {
    if (!argv) return;
    for (int i = 0; i < argc; i++) free(argv[i]);
    free(argv);
}

/* A JSON string of s with each invalid UTF-8 byte replaced by U+FFFD. */
static json_t *json_text(const char *s) {
    if (!s) s = "";
    size_t o = 0;
    char *b = moerl_utf8_repair(s, strlen(s), 1, &o);
    json_t *j = json_stringn(b, o);
    free(b);
    return j;
}

static json_t *json_field(const reward_request *r, const char *name, const char *text, int want_type) {
    if (!text) return json_null();
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &e);
    if (!v) {
        moerl_errorf("%s: %s is not valid JSON (%s): %.80s", r->where ? r->where : "?", name, e.text, text);
        return NULL;
    }
    if (want_type >= 0 && json_typeof(v) != (json_type)want_type && !json_is_null(v)) {
        json_decref(v);
        moerl_errorf("%s: %s must be a JSON %s or null: %.80s", r->where ? r->where : "?", name,
                     want_type == JSON_OBJECT ? "object" : "list", text);
        return NULL;
    }
    return v;
}

json_t *reward_request_json(const reward_request *r) {
    json_t *gt = r->ground_truth_json ? json_field(r, "ground_truth", r->ground_truth ? r->ground_truth : "null", -1)
                                      : json_text(r->ground_truth);
    json_t *ei = gt ? json_field(r, "extra_info", r->extra_info_json, JSON_OBJECT) : NULL;
    json_t *pr = ei ? json_field(r, "prompt", r->prompt_json, JSON_ARRAY) : NULL;
    if (!pr) {
        json_decref(gt);
        json_decref(ei);
        return NULL;
    }
    json_t *o = json_object();
    json_object_set_new(o, "data_source", json_text(r->data_source));
    json_object_set_new(o, "solution_str", json_text(r->solution_str));
    json_object_set_new(o, "ground_truth", gt);
    json_object_set_new(o, "extra_info", ei);
    json_object_set_new(o, "prompt", pr);
    return o;
}

static void add_extra(reward_result *out, const char *key, double v) {
    out->extra_keys = xrealloc(out->extra_keys, (size_t)(out->n_extra + 1) * sizeof(char *));
    out->extra_vals = xrealloc(out->extra_vals, (size_t)(out->n_extra + 1) * sizeof(double));
    out->extra_keys[out->n_extra] = xstrdup(key);
    out->extra_vals[out->n_extra++] = v;
}

static void describe(const json_t *v, char *dst, size_t cap) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    reward_excerpt(s ? s : "?", s ? strlen(s) : 1, dst, cap);
    free(s);
}

int reward_parse_answer(const json_t *v, reward_result *out) {
    char d[200];
    memset(out, 0, sizeof *out);
    if (json_is_number(v)) {
        out->score = json_number_value(v);
    } else if (json_is_object(v)) {
        const json_t *s = json_object_get(v, "score"), *err = json_object_get(v, "error");
        describe(v, d, sizeof d);
        if (json_is_string(err)) return moerl_errorf("the program reported an error: %s", json_string_value(err));
        if (!s) return moerl_errorf("the answer %s has no \"score\"", d);
        if (!json_is_number(s)) return moerl_errorf("the answer %s: \"score\" is not a number", d);
        out->score = json_number_value(s);
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            if (!strcmp(k, "score")) continue;
            if (!strcmp(k, "pred") && json_is_string(x)) out->pred = xstrdup(json_string_value(x));
            else if (json_is_number(x) || json_is_boolean(x)) {
                double e = json_is_boolean(x) ? (double)json_is_true(x) : json_number_value(x);
                if (!isfinite(e)) {
                    reward_results_clear(out, 1);
                    return moerl_errorf("the answer %s: \"%s\" is not finite", d, k);
                }
                add_extra(out, k, e);
            }
        }
    } else {
        describe(v, d, sizeof d);
        return moerl_errorf("the answer %s is neither a number nor an object with \"score\"", d);
    }
    if (!isfinite(out->score)) {
        reward_results_clear(out, 1);
        return moerl_errorf("the score is not finite");
    }
    return MOERL_OK;
}

int reward_parse_answer_text(const char *text, size_t len, reward_result *out) {
    json_error_t e;
    char d[200];
    memset(out, 0, sizeof *out);
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    reward_excerpt(text, len, d, sizeof d);
    if (!v) {
        if (memmem(text, len, "NaN", 3) || memmem(text, len, "Infinity", 8))
            return moerl_errorf("the score is not finite (NaN or Infinity): %s", d);
        return moerl_errorf("not JSON (%s): '%s'", e.text, d);
    }
    int rc = reward_parse_answer(v, out);
    json_decref(v);
    return rc;
}

void reward_results_clear(reward_result *out, int n) {
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < out[i].n_extra; k++) free(out[i].extra_keys[k]);
        free(out[i].extra_keys);
        free(out[i].extra_vals);
        free(out[i].pred);
        memset(&out[i], 0, sizeof out[i]);
    }
}

void reward_excerpt(const char *s, size_t len, char *dst, size_t cap) {
    if (!cap) return;
    size_t o = 0, i = 0, max = cap > 8 ? cap - 4 : cap - 1;
    for (; i < len; i++) {
        int nl = s[i] == '\n' || s[i] == '\r';
        if (o + (nl ? 2 : 1) > max) break;
        if (nl) {
            dst[o++] = '\\';
            dst[o++] = s[i] == '\n' ? 'n' : 'r';
        } else dst[o++] = s[i] ? s[i] : ' ';
    }
    if (i < len && cap > 8) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = 0;
}
