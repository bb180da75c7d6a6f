/* moerl — typed configuration registry (see config.h for the contract).
 *
 * Storage: a flat array of declared entries, looked up by linear search on the dotted key
 * (configs hold a few hundred keys and are read outside the hot loops). Loading a YAML file
 * walks libyaml's event stream with a stack of key prefixes, collects (key, value, line)
 * into a staging list, validates everything, and only then commits, so a bad file leaves the
 * registry untouched.
 */
#include "base/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "base/common.h"
#include "base/strbuf.h"

typedef struct {
    int64_t i;
    double f;
    bool b;
    char *s;       /* CFG_STR: heap, never NULL once set */
    int64_t *list; /* CFG_INT_LIST: heap or NULL when empty */
    char **strs;   /* CFG_STR_LIST: heap strings, NULL when empty */
    int nlist;     /* items of list or strs */
} cfg_val;

typedef struct {
    char *key;
    char *help;
    cfg_type type;
    cfg_val val;
    cfg_val def;
    char *origin;    /* "default", "<path>:<line>", "override" */
    bool overridden; /* set by cfg_apply_override: files no longer change it */
} cfg_entry;

struct cfg {
    cfg_entry *e;
    int n, cap;
    cfg *other;                       /* another command's keys, for messages (cfg_set_other_command) */
    const char *name, *other_name;    /* the commands' names ("moerl sft", "moerl rl"), static */
    const char *const *spell;         /* from, to pairs: the other command's spelling → this one's, static */
    int n_spell;
};

static const char *type_name(cfg_type t) {
    switch (t) {
    case CFG_INT: return "int";
    case CFG_FLOAT: return "float";
    case CFG_BOOL: return "bool";
    case CFG_STR: return "string";
    case CFG_INT_LIST: return "int-list";
    case CFG_STR_LIST: return "string-list";
    }
    return "?";
}

static const char *type_expect(cfg_type t) {
    switch (t) {
    case CFG_INT: return "an integer such as 4";
    case CFG_FLOAT: return "a number such as 0.2, 3 or 1e-6";
    case CFG_BOOL: return "true or false";
    case CFG_STR: return "a string";
    case CFG_INT_LIST: return "a list of integers such as [1, 2, 3]";
    case CFG_STR_LIST: return "a list of strings such as [console, file] or console,file";
    }
    return "?";
}

static void val_free(cfg_val *v) {
    free(v->s);
    free(v->list);
    if (v->strs)
        for (int i = 0; i < v->nlist; i++) free(v->strs[i]);
    free(v->strs);
    v->strs = NULL;
    v->s = NULL;
    v->list = NULL;
    v->nlist = 0;
}

static cfg_val val_copy(const cfg_val *v) {
    cfg_val r = *v;
    r.s = v->s ? xstrdup(v->s) : NULL;
    r.list = NULL;
    r.strs = NULL;
    if (v->nlist > 0 && v->list) {
        r.list = xmalloc(sizeof(int64_t) * (size_t)v->nlist);
        memcpy(r.list, v->list, sizeof(int64_t) * (size_t)v->nlist);
    }
    if (v->nlist > 0 && v->strs) {
        r.strs = xmalloc(sizeof(char *) * (size_t)v->nlist);
        for (int i = 0; i < v->nlist; i++) r.strs[i] = xstrdup(v->strs[i]);
    }
    return r;
}

/* Strict UTF-8 validation (no overlongs, no surrogates, max U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return false;
        if (i + (size_t)len > n) return false;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return false;
        if (cp >= 0xD800 && cp <= 0xDFFF) return false;
        i += (size_t)len;
    }
    return true;
}

/* ---------------------------------------------------------------- registry */

cfg *cfg_new(void) { return xcalloc(1, sizeof(cfg)); }

void cfg_free(cfg *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].key);
        free(c->e[i].help);
        free(c->e[i].origin);
        val_free(&c->e[i].val);
        val_free(&c->e[i].def);
    }
    free(c->e);
    cfg_free(c->other);
    free(c);
}

static cfg_entry *find(const cfg *c, const char *key) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->e[i].key, key) == 0) return &c->e[i];
    return NULL;
}

bool cfg_has(const cfg *c, const char *key) { return find(c, key) != NULL; }

static bool key_valid(const char *key) {
    if (!key || !*key) return false;
    size_t comp = 0;
    for (const char *p = key;; p++) {
        if (*p == '.' || *p == 0) {
            if (comp == 0) return false;
            if (*p == 0) return true;
            comp = 0;
        } else if (isalnum((unsigned char)*p) || *p == '_' || *p == '-') {
            comp++;
        } else {
            return false;
        }
    }
}

/* True if `sec` followed by '.' is a prefix of `key`. */
static bool is_section_of(const char *sec, const char *key) {
    size_t n = strlen(sec);
    return strncmp(sec, key, n) == 0 && key[n] == '.';
}

static cfg_entry *define(cfg *c, const char *key, cfg_type t, const char *help) {
    if (!key_valid(key))
        moerl_fatal("config key '%s' is not a dotted path of [A-Za-z0-9_-] components", key ? key : "(null)");
    for (int i = 0; i < c->n; i++) {
        const char *k = c->e[i].key;
        if (strcmp(k, key) == 0) moerl_fatal("config key '%s' declared twice", key);
        if (is_section_of(k, key) || is_section_of(key, k))
            moerl_fatal("config key '%s' conflicts with '%s' (a key cannot also be a section)", key, k);
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->e = xrealloc(c->e, sizeof(cfg_entry) * (size_t)c->cap);
    }
    cfg_entry *e = &c->e[c->n++];
    memset(e, 0, sizeof *e);
    e->key = xstrdup(key);
    e->help = xstrdup(help ? help : "");
    for (char *p = e->help; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    e->type = t;
    e->origin = xstrdup("default");
    return e;
}

static void set_default(cfg_entry *e) { e->val = val_copy(&e->def); }

void cfg_def_int(cfg *c, const char *key, int64_t def, const char *help) {
    cfg_entry *e = define(c, key, CFG_INT, help);
    e->def.i = def;
    set_default(e);
}

void cfg_def_float(cfg *c, const char *key, double def, const char *help) {
    if (isnan(def)) moerl_fatal("config key '%s': default is NaN", key);
    cfg_entry *e = define(c, key, CFG_FLOAT, help);
    e->def.f = def;
    set_default(e);
}

void cfg_def_bool(cfg *c, const char *key, bool def, const char *help) {
    cfg_entry *e = define(c, key, CFG_BOOL, help);
    e->def.b = def;
    set_default(e);
}

void cfg_def_str(cfg *c, const char *key, const char *def, const char *help) {
    if (def && !utf8_valid((const unsigned char *)def, strlen(def)))
        moerl_fatal("config key '%s': default is not valid UTF-8", key);
    cfg_entry *e = define(c, key, CFG_STR, help);
    e->def.s = xstrdup(def ? def : "");
    set_default(e);
}

void cfg_def_int_list(cfg *c, const char *key, const int64_t *def, int n, const char *help) {
    MOERL_ASSERT(n >= 0 && (n == 0 || def != NULL));
    cfg_entry *e = define(c, key, CFG_INT_LIST, help);
    e->def.nlist = n;
    if (n > 0) {
        e->def.list = xmalloc(sizeof(int64_t) * (size_t)n);
        memcpy(e->def.list, def, sizeof(int64_t) * (size_t)n);
    }
    set_default(e);
}

void cfg_def_str_list(cfg *c, const char *key, const char *const *def, int n, const char *help) {
    MOERL_ASSERT(n >= 0 && (n == 0 || def != NULL));
    cfg_entry *e = define(c, key, CFG_STR_LIST, help);
    e->def.nlist = n;
    if (n > 0) {
        e->def.strs = xmalloc(sizeof(char *) * (size_t)n);
        for (int i = 0; i < n; i++) {
            if (!def[i] || !def[i][0] || !utf8_valid((const unsigned char *)def[i], strlen(def[i])))
                moerl_fatal("config key '%s': default item %d is empty or not valid UTF-8", key, i);
            e->def.strs[i] = xstrdup(def[i]);
        }
    }
    set_default(e);
}

/* ---------------------------------------------------------------- getters */

static const cfg_entry *get(const cfg *c, const char *key, cfg_type t) {
    const cfg_entry *e = find(c, key);
    if (!e) moerl_fatal("config key '%s' read but never declared", key);
    if (e->type != t)
        moerl_fatal("config key '%s' is declared %s but read as %s", key, type_name(e->type), type_name(t));
    return e;
}

int64_t cfg_int(const cfg *c, const char *key) { return get(c, key, CFG_INT)->val.i; }
double cfg_float(const cfg *c, const char *key) { return get(c, key, CFG_FLOAT)->val.f; }
bool cfg_bool(const cfg *c, const char *key) { return get(c, key, CFG_BOOL)->val.b; }
const char *cfg_str(const cfg *c, const char *key) { return get(c, key, CFG_STR)->val.s; }

const int64_t *cfg_int_list(const cfg *c, const char *key, int *n) {
    const cfg_entry *e = get(c, key, CFG_INT_LIST);
    if (n) *n = e->val.nlist;
    return e->val.nlist > 0 ? e->val.list : NULL;
}

const char *const *cfg_str_list(const cfg *c, const char *key, int *n) {
    const cfg_entry *e = get(c, key, CFG_STR_LIST);
    if (n) *n = e->val.nlist;
    return e->val.nlist > 0 ? (const char *const *)e->val.strs : NULL;
}

const char *cfg_origin(const cfg *c, const char *key) {
    const cfg_entry *e = find(c, key);
    if (!e) moerl_fatal("config key '%s' read but never declared", key);
    return e->origin;
}

/* ---------------------------------------------------------------- suggestions */

int cfg_edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    int *prev = xmalloc(sizeof(int) * (nb + 1)), *cur = xmalloc(sizeof(int) * (nb + 1));
    for (size_t j = 0; j <= nb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            int m = sub < del ? sub : del;
            cur[j] = m < ins ? m : ins;
        }
        int *t = prev; prev = cur; cur = t;
    }
    int d = prev[nb];
    free(prev);
    free(cur);
    return d;
}

static const char *leaf(const char *key) {
    const char *d = strrchr(key, '.');
    return d ? d + 1 : key;
}

/* " (did you mean 'x'?)" for the declared key closest to `key`, or a pointer to --help when no declared key
 * is close. Closeness: the edit distance of the whole key, except that a key with the same last component
 * (a setting put in the wrong section, "actor.lr" for "actor.optim.lr") counts as distance 1; ties go to
 * the smaller whole-key distance, then to the key declared first. A key is close when that distance is at
 * most max(2, len(key)/4) — a typo, not another command's key ("rollout.n" given to moerl sft is not
 * "model.path"). */
static void suggestion(const cfg *c, const char *key, char *buf, size_t cap);

void cfg_set_other_command(cfg *c, const char *name, cfg *other, const char *other_name, const char *const *spell,
                           int n_spell) {
    cfg_free(c->other);
    c->other = other;
    c->name = name;
    c->other_name = other_name;
    c->spell = spell;
    c->n_spell = n_spell;
}

/* The other command's spelling of a key of this one (a "from" pair: a whole key, or a prefix ending in '.'),
 * or a key only the other command has: the message says so. False when neither applies. */
static bool other_command_hint(const cfg *c, const char *key, char *buf, size_t cap) {
    if (!c->other) return false;
    for (int i = 0; i < c->n_spell; i++) {
        const char *from = c->spell[2 * i], *to = c->spell[2 * i + 1];
        const size_t n = strlen(from);
        const bool prefix = n > 0 && from[n - 1] == '.';
        if (prefix ? strncmp(key, from, n) != 0 : strcmp(key, from) != 0) continue;
        char mapped[512], sug[600];
        snprintf(mapped, sizeof mapped, "%s%s", to, prefix ? key + n : "");
        if (find(c, mapped)) {
            snprintf(buf, cap, " ('%s' is %s's spelling; %s's key is '%s')", key, c->other_name, c->name, mapped);
            return true;
        }
        const cfg plain = {.e = c->e, .n = c->n}; /* this command's keys alone */
        suggestion(&plain, mapped, sug, sizeof sug);
        if (strncmp(sug, " (did you mean", 14) != 0) continue;
        snprintf(buf, cap, "%.*s %s spells %s's %s%s as %s%s)", (int)strlen(sug) - 1, sug, c->name, c->other_name,
                 from, prefix ? "*" : "", to, prefix ? "*" : "");
        return true;
    }
    if (!find(c->other, key)) return false;
    snprintf(buf, cap, " ('%s' is a key of %s, not of %s; --help lists %s's keys)", key, c->other_name, c->name,
             c->name);
    return true;
}

static void suggestion(const cfg *c, const char *key, char *buf, size_t cap) {
    buf[0] = 0;
    if (other_command_hint(c, key, buf, cap)) return;
    int best = -1, bd = 0, bfull = 0;
    for (int i = 0; i < c->n; i++) {
        int full = cfg_edit_distance(key, c->e[i].key);
        int d = full;
        if (d > 1 && strcmp(leaf(key), leaf(c->e[i].key)) == 0) d = 1;
        if (best < 0 || d < bd || (d == bd && full < bfull)) { best = i; bd = d; bfull = full; }
    }
    const int len = (int)strlen(key), close = len / 4 > 2 ? len / 4 : 2;
    if (best >= 0 && bd <= close) snprintf(buf, cap, " (did you mean '%s'?)", c->e[best].key);
    else snprintf(buf, cap, " (no key of this command is close to it; --help lists the keys it reads)");
}

/* When `key` is a section of declared keys ("rollout" of rollout.n, ...) given a value: " ('rollout' is a
 * section (a mapping of keys such as 'rollout.n'), not a value: ...)" into buf and true; else false. */
static bool section_hint(const cfg *c, const char *key, char *buf, size_t cap) {
    const size_t n = strlen(key);
    for (int i = 0; i < c->n; i++)
        if (n > 0 && !strncmp(c->e[i].key, key, n) && c->e[i].key[n] == '.') {
            snprintf(buf, cap, " ('%s' is a section, a mapping of keys such as '%s', not a value: give its keys, "
                     "e.g. YAML '%s: {%s: ...}' or the override %s=...)", key, c->e[i].key, key, c->e[i].key + n + 1,
                     c->e[i].key);
            return true;
        }
    return false;
}

/* ---------------------------------------------------------------- scalar parsing */

static bool parse_i64(const char *s, int64_t *out) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) return false;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE || *end) return false;
    *out = (int64_t)v;
    return true;
}

static bool parse_f64(const char *s, double *out) {
    const char *p = s;
    int sign = 1;
    if (*p == '+' || *p == '-') { if (*p == '-') sign = -1; p++; }
    if (strcasecmp(p, "inf") == 0 || strcasecmp(p, ".inf") == 0 || strcasecmp(p, "infinity") == 0) {
        *out = sign * INFINITY;
        return true;
    }
    bool digit = false;
    for (const char *q = s; *q; q++) {
        if (isdigit((unsigned char)*q)) digit = true;
        else if (!strchr("+-.eE", *q)) return false;
    }
    if (!digit) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || isinf(v) || isnan(v)) return false;
    *out = v;
    return true;
}

static int parse_bool(const char *s, bool *out) {
    static const char *t[] = {"true", "yes", "on"}, *f[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(s, t[i]) == 0) { *out = true; return 1; }
        if (strcasecmp(s, f[i]) == 0) { *out = false; return 1; }
    }
    return 0;
}

static bool is_yaml_null(const char *s) {
    return !*s || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 ||
           strcmp(s, "NULL") == 0;
}

static char *trim_dup(const char *s, size_t n) {
    while (n > 0 && isspace((unsigned char)*s)) { s++; n--; }
    while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
    char *r = xmalloc(n + 1);
    memcpy(r, s, n);
    r[n] = 0;
    return r;
}

/* "[1, 2]", "1,2", "[]", "" → list. Returns false on a bad element. */
static bool parse_list_text(const char *s, cfg_val *out) {
    char *t = trim_dup(s, strlen(s));
    char *body = t;
    size_t n = strlen(t);
    if (n > 0 && t[0] == '[') {
        if (t[n - 1] != ']') { free(t); return false; }
        t[n - 1] = 0;
        body = t + 1;
    }
    int cap = 8, cnt = 0;
    int64_t *v = xmalloc(sizeof(int64_t) * (size_t)cap);
    char *inner = trim_dup(body, strlen(body));
    bool ok = true;
    if (*inner) {
        char *p = inner;
        for (;;) {
            char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            char *item = trim_dup(p, len);
            int64_t x;
            if (!parse_i64(item, &x)) ok = false;
            free(item);
            if (!ok) break;
            if (cnt == cap) { cap *= 2; v = xrealloc(v, sizeof(int64_t) * (size_t)cap); }
            v[cnt++] = x;
            if (!comma) break;
            p = comma + 1;
        }
    }
    free(inner);
    free(t);
    if (!ok) { free(v); return false; }
    if (cnt == 0) { free(v); v = NULL; }
    out->list = v;
    out->nlist = cnt;
    return true;
}

/* Append item (copied) to a string list; false (with why) when it is empty or not UTF-8. */
static bool str_list_push(cfg_val *v, const char *item, char *why, size_t wcap) {
    if (!*item) {
        snprintf(why, wcap, "item %d is empty", v->nlist + 1);
        return false;
    }
    if (!utf8_valid((const unsigned char *)item, strlen(item))) {
        snprintf(why, wcap, "item %d is not valid UTF-8", v->nlist + 1);
        return false;
    }
    v->strs = xrealloc(v->strs, sizeof(char *) * (size_t)(v->nlist + 1));
    v->strs[v->nlist++] = xstrdup(item);
    return true;
}

/* "[a, b]", "a,b", "[]", "" → a string list; items trimmed, matching quotes around an item
 * removed. false (with why) on an empty item. */
static bool parse_str_list_text(const char *s, cfg_val *out, char *why, size_t wcap) {
    char *t = trim_dup(s, strlen(s));
    char *body = t;
    size_t n = strlen(t);
    if (n > 0 && t[0] == '[') {
        if (t[n - 1] != ']') {
            snprintf(why, wcap, "'[' without a closing ']'");
            free(t);
            return false;
        }
        t[n - 1] = 0;
        body = t + 1;
    }
    char *inner = trim_dup(body, strlen(body));
    bool ok = true;
    for (char *p = inner; *inner && ok;) {
        char *comma = strchr(p, ',');
        char *item = trim_dup(p, comma ? (size_t)(comma - p) : strlen(p));
        size_t m = strlen(item);
        if (m >= 2 && (item[0] == '"' || item[0] == '\'') && item[m - 1] == item[0]) {
            memmove(item, item + 1, m - 2);
            item[m - 2] = 0;
        }
        ok = str_list_push(out, item, why, wcap);
        free(item);
        if (!comma) break;
        p = comma + 1;
    }
    free(inner);
    free(t);
    if (!ok) val_free(out);
    return ok;
}

/* Parse a scalar's text for entry e. `plain`: a YAML plain scalar or an override value (type
 * resolution applies); false: a quoted/literal YAML scalar (a string). On failure fills `why`
 * with the reason and returns MOERL_ERR without setting a global message. */
static int parse_text(const cfg_entry *e, const char *s, bool plain, cfg_val *out, char *why, size_t wcap) {
    memset(out, 0, sizeof *out);
    why[0] = 0;
    if (e->type != CFG_STR && e->type != CFG_STR_LIST && !plain) {
        snprintf(why, wcap, "quoted, so a string");
        return MOERL_ERR;
    }
    switch (e->type) {
    case CFG_INT:
        if (parse_i64(s, &out->i)) return MOERL_OK;
        break;
    case CFG_FLOAT:
        if (parse_f64(s, &out->f)) return MOERL_OK;
        break;
    case CFG_BOOL:
        if (parse_bool(s, &out->b)) return MOERL_OK;
        break;
    case CFG_STR:
        if (!utf8_valid((const unsigned char *)s, strlen(s))) {
            snprintf(why, wcap, "not valid UTF-8");
            return MOERL_ERR;
        }
        out->s = xstrdup(plain && is_yaml_null(s) ? "" : s);
        return MOERL_OK;
    case CFG_INT_LIST:
        if (parse_list_text(s, out)) return MOERL_OK;
        break;
    case CFG_STR_LIST:
        if (plain && is_yaml_null(s)) return MOERL_OK; /* "key:" or "key: ~": the empty list */
        if (parse_str_list_text(s, out, why, wcap)) return MOERL_OK;
        break;
    }
    return MOERL_ERR;
}

static int type_error(const char *where, const cfg_entry *e, const char *value, const char *why) {
    return moerl_errorf("%skey '%s': value '%s'%s%s%s is not a valid %s (expected %s)", where, e->key, value,
                        *why ? " (" : "", why, *why ? ")" : "", type_name(e->type), type_expect(e->type));
}

/* ---------------------------------------------------------------- overrides */

int cfg_apply_override(cfg *c, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq) return moerl_errorf("override '%s': expected key=value (e.g. actor.optim.lr=1e-6)", assignment);
    char *key = trim_dup(assignment, (size_t)(eq - assignment));
    char *val = trim_dup(eq + 1, strlen(eq + 1));
    int rc = MOERL_OK;
    if (!*key) {
        rc = moerl_errorf("override '%s': the key is empty (expected section.key=value; --help lists the keys)", assignment);
        goto done;
    }
    cfg_entry *e = find(c, key);
    if (!e) {
        char sug[512];
        if (!section_hint(c, key, sug, sizeof sug)) suggestion(c, key, sug, sizeof sug);
        rc = moerl_errorf("override '%s': unknown key '%s'%s", assignment, key, sug);
        goto done;
    }
    size_t n = strlen(val);
    bool quoted = n >= 2 && (val[0] == '"' || val[0] == '\'') && val[n - 1] == val[0];
    if (quoted && (e->type == CFG_STR || e->type == CFG_STR_LIST)) {
        memmove(val, val + 1, n - 2);
        val[n - 2] = 0;
    }
    cfg_val v;
    char why[128], where[1024];
    if (parse_text(e, val, !quoted, &v, why, sizeof why) != MOERL_OK) {
        snprintf(where, sizeof where, "override '%s': ", assignment);
        rc = type_error(where, e, val, why);
        goto done;
    }
    val_free(&e->val);
    e->val = v;
    e->overridden = true;
    free(e->origin);
    e->origin = xstrdup("override");
done:
    free(key);
    free(val);
    return rc;
}

/* ---------------------------------------------------------------- YAML loading */

typedef struct {
    cfg_entry *e;
    cfg_val v;
    int line;
} staged;

typedef struct {
    cfg *c;
    const char *name;
    yaml_parser_t p;
    staged *st;
    int nst, cap;
} yload;

static int yaml_syntax_error(yload *L) {
    yaml_parser_t *p = &L->p;
    const char *prob = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR)
        return moerl_errorf("%s: byte offset %zu: YAML input error: %s", L->name, p->problem_offset, prob);
    if (p->context)
        return moerl_errorf("%s:%zu:%zu: YAML syntax error: %s (%s at line %zu)", L->name, p->problem_mark.line + 1,
                            p->problem_mark.column + 1, prob, p->context, p->context_mark.line + 1);
    return moerl_errorf("%s:%zu:%zu: YAML syntax error: %s", L->name, p->problem_mark.line + 1,
                        p->problem_mark.column + 1, prob);
}

static int next_event(yload *L, yaml_event_t *ev) {
    if (!yaml_parser_parse(&L->p, ev)) return yaml_syntax_error(L);
    return MOERL_OK;
}

static int ev_line(const yaml_event_t *ev) { return (int)ev->start_mark.line + 1; }

static bool ev_plain(const yaml_event_t *ev) { return ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE; }

static int unknown_key(yload *L, int line, const char *key) {
    char sug[512];
    if (!section_hint(L->c, key, sug, sizeof sug)) suggestion(L->c, key, sug, sizeof sug);
    return moerl_errorf("%s:%d: unknown key '%s'%s", L->name, line, key, sug);
}

static int stage(yload *L, cfg_entry *e, cfg_val v, int line) {
    for (int i = 0; i < L->nst; i++) {
        if (L->st[i].e == e) {
            cfg_val tmp = v;
            val_free(&tmp);
            return moerl_errorf("%s:%d: key '%s' given twice (first at line %d)", L->name, line, e->key,
                                L->st[i].line);
        }
    }
    if (L->nst == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 32;
        L->st = xrealloc(L->st, sizeof(staged) * (size_t)L->cap);
    }
    L->st[L->nst++] = (staged){e, v, line};
    return MOERL_OK;
}

/* Collect the items of a sequence (SEQUENCE_START already consumed) for list entry e. */
static int walk_sequence(yload *L, cfg_entry *e, int line) {
    cfg_val v = {0};
    int cap = 0;
    int rc = MOERL_OK;
    for (;;) {
        yaml_event_t ev;
        if (next_event(L, &ev)) { rc = MOERL_ERR; break; }
        if (ev.type == YAML_SEQUENCE_END_EVENT) { yaml_event_delete(&ev); break; }
        if (ev.type != YAML_SCALAR_EVENT) {
            rc = moerl_errorf("%s:%d: key '%s': list items must be %s, got a %s", L->name, ev_line(&ev), e->key,
                              e->type == CFG_STR_LIST ? "strings" : "integers",
                              ev.type == YAML_MAPPING_START_EVENT    ? "mapping"
                              : ev.type == YAML_SEQUENCE_START_EVENT ? "nested list"
                                                                     : "alias");
            yaml_event_delete(&ev);
            break;
        }
        const char *s = (const char *)ev.data.scalar.value;
        if (e->type == CFG_STR_LIST) {
            char why[128];
            bool ok = str_list_push(&v, s, why, sizeof why);
            if (!ok) rc = moerl_errorf("%s:%d: key '%s': list %s (expected %s)", L->name, ev_line(&ev), e->key, why,
                                       type_expect(e->type));
            yaml_event_delete(&ev);
            if (!ok) break;
            continue;
        }
        int64_t x;
        if (!ev_plain(&ev) || !parse_i64(s, &x)) {
            rc = moerl_errorf("%s:%d: key '%s': list item '%s' is not a valid int (expected %s)", L->name,
                              ev_line(&ev), e->key, s, type_expect(e->type));
            yaml_event_delete(&ev);
            break;
        }
        yaml_event_delete(&ev);
        if (v.nlist == cap) {
            cap = cap ? 2 * cap : 8;
            v.list = xrealloc(v.list, sizeof(int64_t) * (size_t)cap);
        }
        v.list[v.nlist++] = x;
    }
    if (rc != MOERL_OK) { val_free(&v); return rc; }
    return stage(L, e, v, line);
}

/* Walk a mapping whose MAPPING_START was consumed; keys are prefixed with `prefix.`. */
static int walk_mapping(yload *L, const char *prefix, int depth) {
    if (depth > 64) return moerl_errorf("%s: mappings nested deeper than 64 levels", L->name);
    for (;;) {
        yaml_event_t kev, vev;
        if (next_event(L, &kev)) return MOERL_ERR;
        if (kev.type == YAML_MAPPING_END_EVENT) { yaml_event_delete(&kev); return MOERL_OK; }
        int line = ev_line(&kev);
        if (kev.type != YAML_SCALAR_EVENT) {
            yaml_event_delete(&kev);
            return moerl_errorf("%s:%d: mapping keys must be plain names, not lists or mappings", L->name, line);
        }
        if (kev.data.scalar.length == 0) {
            yaml_event_delete(&kev);
            return moerl_errorf("%s:%d: empty key", L->name, line);
        }
        size_t plen = prefix ? strlen(prefix) + 1 : 0;
        char *full = xmalloc(plen + kev.data.scalar.length + 1);
        if (prefix) { memcpy(full, prefix, plen - 1); full[plen - 1] = '.'; }
        memcpy(full + plen, kev.data.scalar.value, kev.data.scalar.length + 1);
        yaml_event_delete(&kev);

        int rc = MOERL_OK;
        if (next_event(L, &vev)) { free(full); return MOERL_ERR; }
        cfg_entry *e = find(L->c, full);
        switch (vev.type) {
        case YAML_MAPPING_START_EVENT:
            if (e) rc = moerl_errorf("%s:%d: key '%s': got a mapping, expected %s (%s)", L->name, line, full,
                                     type_name(e->type), type_expect(e->type));
            else rc = walk_mapping(L, full, depth + 1);
            break;
        case YAML_SEQUENCE_START_EVENT:
            if (!e) rc = unknown_key(L, line, full);
            else if (e->type != CFG_INT_LIST && e->type != CFG_STR_LIST)
                rc = moerl_errorf("%s:%d: key '%s': got a list, expected %s (%s)", L->name, line, full,
                                  type_name(e->type), type_expect(e->type));
            else rc = walk_sequence(L, e, line);
            break;
        case YAML_SCALAR_EVENT: {
            if (!e) { rc = unknown_key(L, line, full); break; }
            cfg_val v;
            char why[128], where[1024];
            const char *s = (const char *)vev.data.scalar.value;
            if (parse_text(e, s, ev_plain(&vev), &v, why, sizeof why) != MOERL_OK) {
                snprintf(where, sizeof where, "%s:%d: ", L->name, line);
                rc = type_error(where, e, s, why);
            } else {
                rc = stage(L, e, v, line);
            }
            break;
        }
        case YAML_ALIAS_EVENT:
            rc = moerl_errorf("%s:%d: key '%s': YAML aliases (*%s) are not supported", L->name, line, full,
                              (const char *)vev.data.alias.anchor);
            break;
        default:
            rc = moerl_errorf("%s:%d: key '%s': unexpected YAML event", L->name, line, full);
        }
        yaml_event_delete(&vev);
        free(full);
        if (rc != MOERL_OK) return rc;
    }
}

static int walk_stream(yload *L) {
    yaml_event_t ev;
    if (next_event(L, &ev)) return MOERL_ERR;
    MOERL_ASSERT(ev.type == YAML_STREAM_START_EVENT);
    yaml_event_delete(&ev);
    if (next_event(L, &ev)) return MOERL_ERR;
    if (ev.type == YAML_STREAM_END_EVENT) { yaml_event_delete(&ev); return MOERL_OK; } /* empty file */
    MOERL_ASSERT(ev.type == YAML_DOCUMENT_START_EVENT);
    yaml_event_delete(&ev);
    if (next_event(L, &ev)) return MOERL_ERR;
    int line = ev_line(&ev);
    if (ev.type == YAML_MAPPING_START_EVENT) {
        yaml_event_delete(&ev);
        if (walk_mapping(L, NULL, 0)) return MOERL_ERR;
    } else if (ev.type == YAML_SCALAR_EVENT && ev_plain(&ev) && is_yaml_null((const char *)ev.data.scalar.value)) {
        yaml_event_delete(&ev); /* a document holding only null: nothing to set */
    } else {
        yaml_event_delete(&ev);
        return moerl_errorf("%s:%d: the top level must be a mapping of keys (key: value)", L->name, line);
    }
    if (next_event(L, &ev)) return MOERL_ERR;
    MOERL_ASSERT(ev.type == YAML_DOCUMENT_END_EVENT);
    yaml_event_delete(&ev);
    if (next_event(L, &ev)) return MOERL_ERR;
    line = ev_line(&ev);
    int type = ev.type;
    yaml_event_delete(&ev);
    if (type != YAML_STREAM_END_EVENT)
        return moerl_errorf("%s:%d: more than one YAML document; a config file holds one", L->name, line);
    return MOERL_OK;
}

int cfg_load_yaml_string(cfg *c, const char *text, size_t len, const char *name) {
    yload L = {.c = c, .name = name};
    if (!yaml_parser_initialize(&L.p)) return moerl_errorf("%s: cannot initialise the YAML parser", name);
    yaml_parser_set_input_string(&L.p, (const unsigned char *)text, len);
    int rc = walk_stream(&L);
    yaml_parser_delete(&L.p);
    for (int i = 0; i < L.nst; i++) {
        staged *s = &L.st[i];
        if (rc == MOERL_OK && !s->e->overridden) {
            val_free(&s->e->val);
            s->e->val = s->v;
            free(s->e->origin);
            char buf[1200];
            snprintf(buf, sizeof buf, "%s:%d", name, s->line);
            s->e->origin = xstrdup(buf);
        } else {
            val_free(&s->v);
        }
    }
    free(L.st);
    return rc;
}

int cfg_load_yaml(cfg *c, const char *path) {
    char *text;
    size_t len;
    if (moerl_read_file(path, &text, &len)) return moerl_error_prefix("config: ");
    int rc = cfg_load_yaml_string(c, text, len, path);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- dumping */

/* Shortest "%.*g" form that strtod reads back to exactly x; ".0" added to integral values. */
static void format_float(double x, char *buf, size_t cap) {
    if (isinf(x)) { snprintf(buf, cap, "%s", x > 0 ? ".inf" : "-.inf"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (!strpbrk(buf, ".eE")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

static void put_yaml_string(strbuf *b, const char *s) {
    strbuf_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': strbuf_puts(b, "\\\""); break;
        case '\\': strbuf_puts(b, "\\\\"); break;
        case '\n': strbuf_puts(b, "\\n"); break;
        case '\t': strbuf_puts(b, "\\t"); break;
        case '\r': strbuf_puts(b, "\\r"); break;
        default:
            if (*p < 0x20 || *p == 0x7f) strbuf_printf(b, "\\x%02X", *p);
            else strbuf_putn(b, (const char *)p, 1);
        }
    }
    strbuf_puts(b, "\"");
}

static void put_value(strbuf *b, const cfg_entry *e, const cfg_val *v) {
    char buf[64];
    switch (e->type) {
    case CFG_INT: strbuf_printf(b, "%lld", (long long)v->i); break;
    case CFG_FLOAT: format_float(v->f, buf, sizeof buf); strbuf_puts(b, buf); break;
    case CFG_BOOL: strbuf_puts(b, v->b ? "true" : "false"); break;
    case CFG_STR: put_yaml_string(b, v->s); break;
    case CFG_INT_LIST:
        strbuf_puts(b, "[");
        for (int i = 0; i < v->nlist; i++) strbuf_printf(b, "%s%lld", i ? ", " : "", (long long)v->list[i]);
        strbuf_puts(b, "]");
        break;
    case CFG_STR_LIST:
        strbuf_puts(b, "[");
        for (int i = 0; i < v->nlist; i++) {
            if (i) strbuf_puts(b, ", ");
            put_yaml_string(b, v->strs[i]);
        }
        strbuf_puts(b, "]");
        break;
    }
}

/* Compare dotted keys component by component, so that keys of one section stay together. */
static int key_cmp(const char *a, const char *b) {
    for (;;) {
        size_t la = strcspn(a, "."), lb = strcspn(b, ".");
        size_t m = la < lb ? la : lb;
        int r = strncmp(a, b, m);
        if (r) return r;
        if (la != lb) return la < lb ? -1 : 1;
        a += la;
        b += lb;
        if (!*a || !*b) return (*a != 0) - (*b != 0);
        a++;
        b++;
    }
}

static int *sorted_order(const cfg *c) {
    int *ord = xmalloc(sizeof(int) * (size_t)(c->n ? c->n : 1));
    for (int i = 0; i < c->n; i++) ord[i] = i;
    /* insertion sort: no global comparator state (qsort has no context argument); n is a few hundred */
    for (int i = 1; i < c->n; i++) {
        int x = ord[i], j = i - 1;
        while (j >= 0 && key_cmp(c->e[ord[j]].key, c->e[x].key) > 0) { ord[j + 1] = ord[j]; j--; }
        ord[j + 1] = x;
    }
    return ord;
}

char *cfg_dump_yaml_string(const cfg *c) {
    strbuf b = {0};
    strbuf_puts(&b, "# moerl resolved configuration: every declared key with its value after defaults,\n"
                "# files and overrides. Loads back with cfg_load_yaml.\n");
    int *ord = sorted_order(c);
    const char *prev = NULL;
    for (int k = 0; k < c->n; k++) {
        const cfg_entry *e = &c->e[ord[k]];
        const char *key = e->key;
        /* number of leading section components shared with the previous key */
        int shared = 0;
        if (prev) {
            const char *a = prev, *p = key;
            for (;;) {
                const char *da = strchr(a, '.'), *dp = strchr(p, '.');
                if (!da || !dp) break;
                if (da - a != dp - p || strncmp(a, p, (size_t)(da - a)) != 0) break;
                shared++;
                a = da + 1;
                p = dp + 1;
            }
        }
        int depth = 0;
        const char *p = key;
        for (;;) {
            const char *dot = strchr(p, '.');
            if (!dot) break;
            if (depth >= shared) {
                for (int i = 0; i < depth; i++) strbuf_puts(&b, "  ");
                strbuf_putn(&b, p, (size_t)(dot - p));
                strbuf_puts(&b, ":\n");
            }
            depth++;
            p = dot + 1;
        }
        for (int i = 0; i < depth; i++) strbuf_puts(&b, "  ");
        strbuf_printf(&b, "%s: ", p);
        put_value(&b, e, &e->val);
        if (*e->help) strbuf_printf(&b, "  # %s", e->help);
        strbuf_puts(&b, "\n");
        prev = key;
    }
    free(ord);
    if (!b.p) strbuf_puts(&b, "");
    return b.p;
}

int cfg_dump_yaml(const cfg *c, const char *path) {
    char *s = cfg_dump_yaml_string(c);
    int rc = moerl_write_file_atomic(path, s, strlen(s));
    free(s);
    if (rc) return moerl_error_prefix("writing config dump: ");
    return MOERL_OK;
}

void cfg_print_help(const cfg *c, FILE *out) {
    int *ord = sorted_order(c);
    for (int k = 0; k < c->n; k++) {
        const cfg_entry *e = &c->e[ord[k]];
        strbuf b = {0};
        put_value(&b, e, &e->def);
        fprintf(out, "  %-44s %-8s %-14s %s\n", e->key, type_name(e->type), b.p, e->help);
        free(b.p);
    }
    free(ord);
}

/* Whether key ends in one of the comma-separated suffixes of list (NULL: none). */
static bool key_has_suffix(const char *key, const char *list) {
    const size_t kl = strlen(key);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        const size_t sl = end ? (size_t)(end - p) : strlen(p);
        if (sl && kl >= sl && !strncmp(key + kl - sl, p, sl)) return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

int cfg_check_int32(const cfg *c, const char *exempt_suffix) {
    for (int i = 0; i < c->n; i++) {
        const cfg_entry *e = &c->e[i];
        if (key_has_suffix(e->key, exempt_suffix)) continue;
        if (e->type == CFG_INT && (e->val.i < INT32_MIN || e->val.i > INT32_MAX))
            return moerl_errorf("key '%s' (from %s): value %lld does not fit a 32-bit integer", e->key, e->origin,
                                (long long)e->val.i);
        if (e->type == CFG_INT_LIST)
            for (int k = 0; k < e->val.nlist; k++)
                if (e->val.list[k] < INT32_MIN || e->val.list[k] > INT32_MAX)
                    return moerl_errorf("key '%s' (from %s): item %lld does not fit a 32-bit integer", e->key,
                                        e->origin, (long long)e->val.list[k]);
    }
    return MOERL_OK;
}
