/* moerl — Jinja: filters. Those @huggingface/jinja 0.5.11 has behave as there (its output is the
 * reference, quirks included: `int`/`float` with arguments leave a number unchanged, `join`
 * without argument concatenates, booleans print true/false); the ones it lacks follow Jinja2
 * (select/reject, map with a filter name, sum, min, max, batch, wordcount, truncate, center,
 * format, round, escape, trim(chars), d, count, first/last/list/reverse on strings). An unknown
 * filter, or one applied to a type it does not take, is an error naming both. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/common.h"
#include "data/jinja_internal.h"

typedef struct {
    jctx *c;
    const jnode *at;
    const char *name;
    bool called;
    jv *a;
    int n;
    jobj *kw;
} fargs;

/* Argument i, else keyword `key`, else dflt. */
static jv arg(const fargs *f, int i, const char *key, jv dflt) {
    if (i >= 0 && i < f->n) return f->a[i];
    jv *k = f->kw && key ? jobj_get(f->kw, key, strlen(key)) : NULL;
    return k ? *k : dflt;
}

static _Noreturn void unknown(const fargs *f, jv x) {
    jfail(f->c, f->at, "unknown filter '%s' for %s (or not supported in this form)", f->name, jv_type_name(x));
}

static jv str_of_buf(jctx *c, jbuf *b) {
    jv r = jv_str(jbuf_take(c, b));
    jtmp_put(c);
    return r;
}

/* Python's str() for Jinja2-only filters: True/False/None as Python writes them. */
static void jpy_str(jctx *c, jbuf *b, jv v) {
    if (v.k == JV_BOOL) jbuf_put(b, v.u.b ? "True" : "False", v.u.b ? 4 : 5, 0);
    else if (v.k == JV_NONE) jbuf_put(b, "None", 4, 0);
    else if (v.k == JV_UNDEF) return;
    else jv_print(c, b, v);
}

static long cp_count(jstr s) {
    long k = 0;
    for (size_t i = 0; i < s.n; i += jcp(s.s, i, s.n)) k++;
    return k;
}
static size_t cp_byte(jstr s, long k) { /* byte offset of code point k */
    size_t i = 0;
    for (; k > 0 && i < s.n; k--) i += jcp(s.s, i, s.n);
    return i;
}

/* JavaScript parseInt(s, 10) / parseFloat(s); NaN when no number starts the text. */
static double jjs_parse_num(jstr s, bool integer) {
    jstr t = jjs_trim(s, true, false);
    char buf[400];
    size_t n = t.n < sizeof buf - 1 ? t.n : sizeof buf - 1, i = 0;
    memcpy(buf, t.s, n);
    buf[n] = 0;
    if (buf[i] == '+' || buf[i] == '-') i++;
    if (!integer && !strncmp(buf + i, "Infinity", 8)) return buf[0] == '-' ? -INFINITY : INFINITY;
    size_t d = i;
    while (buf[d] >= '0' && buf[d] <= '9') d++;
    if (integer) {
        if (d == i) return NAN;
        buf[d] = 0;
        return strtod(buf, NULL);
    }
    size_t e = d;
    if (buf[e] == '.') {
        e++;
        while (buf[e] >= '0' && buf[e] <= '9') e++;
    }
    if (e == i || (e == i + 1 && buf[i] == '.')) return NAN;
    if (buf[e] == 'e' || buf[e] == 'E') {
        size_t x = e + 1;
        if (buf[x] == '+' || buf[x] == '-') x++;
        if (buf[x] >= '0' && buf[x] <= '9') {
            while (buf[x] >= '0' && buf[x] <= '9') x++;
            e = x;
        }
    }
    buf[e] = 0;
    return strtod(buf, NULL);
}

static jv f_tojson(const fargs *f, jv x) {
    jjson_opts o = {.indent = -1, .undef_null = true};
    jv ind = arg(f, -1, "indent", jv_none()), asc = arg(f, -1, "ensure_ascii", jv_bool(false));
    jv sk = arg(f, -1, "sort_keys", jv_bool(false)), sep = arg(f, -1, "separators", jv_none());
    if (ind.k != JV_INT && ind.k != JV_NONE) jfail(f->c, f->at, "tojson: if set, indent must be a number");
    if (asc.k != JV_BOOL) jfail(f->c, f->at, "tojson: if set, ensure_ascii must be a boolean");
    if (sk.k != JV_BOOL) jfail(f->c, f->at, "tojson: if set, sort_keys must be a boolean");
    if (ind.k == JV_INT) o.indent = (int)ind.u.num;
    o.ensure_ascii = asc.u.b, o.sort_keys = sk.u.b;
    char *seps[2] = {0};
    if (sep.k == JV_ARR) {
        if (sep.u.arr->n != 2 || sep.u.arr->v[0].k != JV_STR || sep.u.arr->v[1].k != JV_STR)
            jfail(f->c, f->at, "tojson: separators must be a tuple of two strings");
        for (int i = 0; i < 2; i++) seps[i] = ja_strdup(&f->c->arena, sep.u.arr->v[i].u.str.s, sep.u.arr->v[i].u.str.n);
        o.item_sep = seps[0], o.key_sep = seps[1];
    } else if (sep.k != JV_NONE) jfail(f->c, f->at, "tojson: if set, separators must be a tuple of two strings");
    jbuf *b = jtmp_get(f->c);
    jv_tojson(f->c, f->at, b, x, &o, 0);
    return str_of_buf(f->c, b);
}

/* join: raw JavaScript values joined (none/undefined as ""), masks kept. */
static jv f_join(const fargs *f, jv x) {
    jv sep = arg(f, 0, "separator", jv_undef());
    if (sep.k == JV_UNDEF) sep = jv_str((jstr){.s = "", .n = 0, .um = 1});
    if (sep.k != JV_STR) jfail(f->c, f->at, "join: separator must be a string");
    jv attr = arg(f, 1, "attribute", jv_none());
    jbuf *b = jtmp_get(f->c);
    if (x.k == JV_STR) {
        for (size_t i = 0; i < x.u.str.n;) {
            size_t l = jcp(x.u.str.s, i, x.u.str.n);
            if (i) jbuf_put_str(b, sep.u.str);
            jbuf_put_str(b, jjs_sub(x.u.str, i, i + l));
            i += l;
        }
        return str_of_buf(f->c, b);
    }
    for (int i = 0; i < x.u.arr->n; i++) {
        if (i) jbuf_put_str(b, sep.u.str);
        jv v = x.u.arr->v[i];
        if (attr.k == JV_STR && v.k == JV_OBJ) {
            jv *p = jobj_get(v.u.obj, attr.u.str.s, attr.u.str.n);
            v = p ? *p : jv_undef();
        }
        if (v.k != JV_NONE && v.k != JV_UNDEF) jv_jsstr(f->c, b, v);
    }
    return str_of_buf(f->c, b);
}

/* Dotted attribute path ("a.b", "items.0") as @huggingface/jinja's getAttributeValue. */
static jv attr_path(jv v, jstr path) {
    size_t i = 0;
    while (i <= path.n) {
        const char *dot = memchr(path.s + i, '.', path.n - i);
        size_t e = dot ? (size_t)(dot - path.s) : path.n;
        if (v.k == JV_OBJ) {
            jv *p = jobj_get(v.u.obj, path.s + i, e - i);
            v = p ? *p : jv_undef();
        } else if (v.k == JV_ARR) {
            char num[24];
            size_t l = e - i < 23 ? e - i : 23;
            memcpy(num, path.s + i, l);
            num[l] = 0;
            char *end;
            long k = strtol(num, &end, 10);
            if (end == num || k < 0 || k >= v.u.arr->n) return jv_undef();
            v = v.u.arr->v[k];
        } else return jv_undef();
        i = e + 1;
    }
    return v;
}

typedef struct {
    jctx *c;
    const jnode *at;
    jv attr;
    bool cs, rev;
} sortc;
static _Thread_local sortc *g_sc;
static int item_cmp(const void *x, const void *y) {
    jv a = *(const jv *)x, b = *(const jv *)y;
    if (g_sc->attr.k == JV_STR) a = attr_path(a, g_sc->attr.u.str), b = attr_path(b, g_sc->attr.u.str);
    int r = jv_compare(g_sc->c, g_sc->at, a, b, g_sc->cs);
    return g_sc->rev ? -r : r;
}

static jarr *copy_arr(jctx *c, jarr *a) {
    jarr *r = jarr_new(c, a->n);
    memcpy(r->v, a->v, a->n * sizeof(jv));
    r->n = a->n;
    return r;
}

static jv f_sort(const fargs *f, jv x) {
    jv rev = arg(f, 0, "reverse", jv_bool(false)), cs = arg(f, 1, "case_sensitive", jv_bool(false));
    jv at = arg(f, 2, "attribute", jv_none());
    if (rev.k != JV_BOOL) jfail(f->c, f->at, "sort: reverse must be a boolean");
    if (cs.k != JV_BOOL) jfail(f->c, f->at, "sort: case_sensitive must be a boolean");
    if (at.k == JV_INT) {
        char buf[40];
        jjs_num(at.u.num, buf);
        at = jv_cstr(f->c, buf, 0);
    } else if (at.k != JV_STR && at.k != JV_NONE) jfail(f->c, f->at, "sort: attribute must be a string, integer, or none");
    jarr *r = copy_arr(f->c, x.u.arr);
    sortc sc = {f->c, f->at, at, cs.u.b, rev.u.b};
    sortc *saved = g_sc;
    g_sc = &sc;
    jv_stable_sort(f->c, r->v, r->n, item_cmp);
    g_sc = saved;
    return jv_arr(r);
}

static jv apply_filter(jctx *c, const jnode *at, jv x, const char *name, bool called, jv *a, int n, jobj *kw);

/* selectattr/rejectattr/select/reject: keep items whose test (or truthiness) holds. */
static jv f_select(const fargs *f, jv x, bool attr, bool keep) {
    int k = 0;
    jv name = jv_undef();
    if (attr) {
        name = arg(f, 0, NULL, jv_undef());
        if (name.k != JV_STR) jfail(f->c, f->at, "%s: the attribute name must be a string", f->name);
        k = 1;
    }
    jv test = arg(f, k, NULL, jv_undef());
    if (test.k != JV_UNDEF && test.k != JV_STR) jfail(f->c, f->at, "%s: the test name must be a string", f->name);
    char tname[64] = "";
    if (test.k == JV_STR) {
        snprintf(tname, sizeof tname, "%.*s", (int)test.u.str.n, test.u.str.s);
        if (!jtest_exists(tname)) jfail(f->c, f->at, "unknown test '%s'", tname);
    }
    jarr *r = jarr_new(f->c, x.u.arr->n);
    for (int i = 0; i < x.u.arr->n; i++) {
        jv item = x.u.arr->v[i], v = item;
        if (attr) {
            if (item.k != JV_OBJ) jfail(f->c, f->at, "`%s` can only be applied to an array of objects", f->name);
            jv *p = jobj_get(item.u.obj, name.u.str.s, name.u.str.n);
            if (!p) {
                if (!keep) jarr_push(f->c, r, item);
                continue;
            }
            v = *p;
        }
        bool ok = tname[0] ? jtest(f->c, f->at, v, tname, f->a + k + 1, f->n > k + 1 ? f->n - k - 1 : 0) : jv_truthy(v);
        if (ok == keep) jarr_push(f->c, r, item);
    }
    return jv_arr(r);
}

static jv f_map(const fargs *f, jv x) {
    jarr *r = jarr_new(f->c, x.u.arr->n);
    jv attr = arg(f, -1, "attribute", jv_undef());
    if (attr.k != JV_UNDEF) {
        if (attr.k != JV_STR) jfail(f->c, f->at, "map: attribute must be a string");
        jv *dflt = f->kw ? jobj_get(f->kw, "default", 7) : NULL;
        for (int i = 0; i < x.u.arr->n; i++) {
            jv item = x.u.arr->v[i];
            if (item.k != JV_OBJ) jfail(f->c, f->at, "map: items must be objects to take attribute '%.*s'", (int)attr.u.str.n, attr.u.str.s);
            jv v = attr_path(item, attr.u.str);
            jarr_push(f->c, r, v.k == JV_UNDEF && dflt ? *dflt : v);
        }
        return jv_arr(r);
    }
    if (f->n < 1 || f->a[0].k != JV_STR) jfail(f->c, f->at, "map: expected attribute= or a filter name");
    char *fname = ja_strdup(&f->c->arena, f->a[0].u.str.s, f->a[0].u.str.n);
    for (int i = 0; i < x.u.arr->n; i++)
        jarr_push(f->c, r, apply_filter(f->c, f->at, x.u.arr->v[i], fname, f->n > 1 || f->kw, f->a + 1, f->n - 1, f->kw));
    return jv_arr(r);
}

static jv f_unique(const fargs *f, jv x) {
    jarr *r = jarr_new(f->c, x.u.arr->n);
    for (int i = 0; i < x.u.arr->n; i++) {
        bool seen = false;
        for (int k = 0; k < r->n && !seen; k++) seen = jv_strict_eq(r->v[k], x.u.arr->v[i]);
        if (!seen) jarr_push(f->c, r, x.u.arr->v[i]);
    }
    return jv_arr(r);
}

static jv f_sum_minmax(const fargs *f, jv x, int which) {
    jv attr = arg(f, which ? 1 : 0, "attribute", jv_none());
    jv cs = arg(f, which ? 0 : -1, "case_sensitive", jv_bool(false));
    jv best = jv_undef();
    jv sum = arg(f, 1, "start", jv_int(0));
    for (int i = 0; i < x.u.arr->n; i++) {
        jv v = attr.k == JV_STR ? attr_path(x.u.arr->v[i], attr.u.str) : x.u.arr->v[i];
        if (!which) {
            if (!jv_isnum(v) || !jv_isnum(sum)) jfail(f->c, f->at, "sum: cannot add %s", jv_type_name(v));
            sum = (sum.k == JV_FLOAT || v.k == JV_FLOAT) ? jv_float(sum.u.num + v.u.num) : jv_int(sum.u.num + v.u.num);
            continue;
        }
        if (best.k == JV_UNDEF) best = x.u.arr->v[i];
        else {
            jv bv = attr.k == JV_STR ? attr_path(best, attr.u.str) : best;
            int k = jv_compare(f->c, f->at, v, bv, cs.k == JV_BOOL && cs.u.b);
            if ((which == 1 && k < 0) || (which == 2 && k > 0)) best = x.u.arr->v[i];
        }
    }
    return which ? best : sum;
}

static jv f_batch(const fargs *f, jv x) {
    jv cnt = arg(f, 0, "linecount", jv_undef()), fill = arg(f, 1, "fill_with", jv_none());
    if (cnt.k != JV_INT || cnt.u.num < 1) jfail(f->c, f->at, "batch: linecount must be a positive integer");
    long k = (long)cnt.u.num;
    jarr *r = jarr_new(f->c, 4), *cur = NULL;
    for (int i = 0; i < x.u.arr->n; i++) {
        if (!cur || cur->n == k) cur = jarr_new(f->c, (int)k), jarr_push(f->c, r, jv_arr(cur));
        jarr_push(f->c, cur, x.u.arr->v[i]);
    }
    bool has_fill = (f->n > 1) || (f->kw && jobj_get(f->kw, "fill_with", 9));
    while (has_fill && cur && cur->n < k) jarr_push(f->c, cur, fill);
    return jv_arr(r);
}

static jv arr_filter(const fargs *f, jv x) {
    const char *n = f->name;
    jarr *a = x.u.arr;
    if (!strcmp(n, "list")) return x;
    if (!strcmp(n, "first")) return a->n ? a->v[0] : jv_undef();
    if (!strcmp(n, "last")) return a->n ? a->v[a->n - 1] : jv_undef();
    if (!strcmp(n, "length") || !strcmp(n, "count")) return jv_int(a->n);
    if (!strcmp(n, "reverse")) {
        jarr *r = jarr_new(f->c, a->n);
        for (int i = a->n - 1; i >= 0; i--) jarr_push(f->c, r, a->v[i]);
        return jv_arr(r);
    }
    if (!strcmp(n, "sort")) return f_sort(f, x);
    if (!strcmp(n, "join")) return f_join(f, x);
    if (!strcmp(n, "string")) {
        jbuf *b = jtmp_get(f->c);
        jv_print(f->c, b, x);
        return str_of_buf(f->c, b);
    }
    if (!strcmp(n, "unique")) return f_unique(f, x);
    if (!strcmp(n, "selectattr") || !strcmp(n, "rejectattr")) return f_select(f, x, true, n[0] == 's');
    if (!strcmp(n, "select") || !strcmp(n, "reject")) return f_select(f, x, false, n[0] == 's');
    if (!strcmp(n, "map")) return f_map(f, x);
    if (!strcmp(n, "sum")) return f_sum_minmax(f, x, 0);
    if (!strcmp(n, "min")) return f_sum_minmax(f, x, 1);
    if (!strcmp(n, "max")) return f_sum_minmax(f, x, 2);
    if (!strcmp(n, "batch")) return f_batch(f, x);
    unknown(f, x);
}

static jv f_indent(const fargs *f, jv x) {
    jv w = arg(f, 0, "width", jv_int(4)), first = arg(f, 1, "first", jv_bool(false)), blank = arg(f, 2, "blank", jv_bool(false));
    if (w.k != JV_INT) jfail(f->c, f->at, "indent: width must be a number");
    jstr s = x.u.str;
    jbuf *b = jtmp_get(f->c);
    size_t st = 0;
    for (int line = 0;; line++) {
        const char *nl = memchr(s.s + st, '\n', s.n - st);
        size_t e = nl ? (size_t)(nl - s.s) : s.n;
        if (line) jbuf_put(b, "\n", 1, s.m ? s.m[st - 1] : s.um);
        bool pad = !((!jv_truthy(first) && line == 0) || (!jv_truthy(blank) && e == st));
        for (long k = 0; pad && k < (long)w.u.num; k++) jbuf_put(b, " ", 1, 0);
        jbuf_put_str(b, jjs_sub(s, st, e));
        if (!nl) break;
        st = e + 1;
    }
    return str_of_buf(f->c, b);
}

static jv f_truncate(const fargs *f, jv x) {
    jv len = arg(f, 0, "length", jv_int(255)), kill = arg(f, 1, "killwords", jv_bool(false));
    jv end = arg(f, 2, "end", jv_cstr(f->c, "...", 1)), lee = arg(f, 3, "leeway", jv_int(5));
    if (len.k != JV_INT || lee.k != JV_INT || end.k != JV_STR) jfail(f->c, f->at, "truncate: bad arguments");
    jstr s = x.u.str;
    long n = cp_count(s), L = (long)len.u.num, el = cp_count(end.u.str);
    if (n <= L + (long)lee.u.num) return x;
    long keep = L - el > 0 ? L - el : 0;
    jstr head = jjs_sub(s, 0, cp_byte(s, keep));
    if (!jv_truthy(kill)) {
        const char *sp = NULL;
        for (size_t i = head.n; i-- > 0;)
            if (head.s[i] == ' ') { sp = head.s + i; break; }
        if (sp) head = jjs_sub(head, 0, sp - head.s);
    }
    jbuf *b = jtmp_get(f->c);
    jbuf_put_str(b, head);
    jbuf_put_str(b, end.u.str);
    return str_of_buf(f->c, b);
}

static jv f_wordcount(const fargs *f, jv x) {
    jstr s = x.u.str;
    long words = 0;
    bool in = false;
    for (size_t i = 0; i < s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s.s + i, s.n - i, &cp);
        if (l <= 0) l = 1, cp = 0;
        utf8proc_category_t k = utf8proc_category(cp);
        bool w = cp == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_NO);
        if (w && !in) words++;
        in = w;
        i += l;
    }
    return jv_int(words);
}

static jv f_center(const fargs *f, jv x) {
    jv w = arg(f, 0, "width", jv_int(80));
    if (w.k != JV_INT) jfail(f->c, f->at, "center: width must be an integer");
    long n = cp_count(x.u.str), pad = (long)w.u.num - n;
    if (pad <= 0) return x;
    long left = pad / 2 + (pad & (long)w.u.num & 1);
    jbuf *b = jtmp_get(f->c);
    for (long i = 0; i < left; i++) jbuf_put(b, " ", 1, 0);
    jbuf_put_str(b, x.u.str);
    for (long i = 0; i < pad - left; i++) jbuf_put(b, " ", 1, 0);
    return str_of_buf(f->c, b);
}

static jv f_escape(const fargs *f, jv x) {
    jstr s = x.u.str;
    jbuf *b = jtmp_get(f->c);
    for (size_t i = 0; i < s.n; i++) {
        const char *e = s.s[i] == '&' ? "&amp;" : s.s[i] == '<' ? "&lt;" : s.s[i] == '>' ? "&gt;" : s.s[i] == '"' ? "&#34;" : s.s[i] == '\'' ? "&#39;" : NULL;
        if (e) jbuf_put(b, e, strlen(e), s.m ? s.m[i] : s.um);
        else jbuf_put_str(b, jjs_sub(s, i, i + 1));
    }
    return str_of_buf(f->c, b);
}

static jv str_filter2(const fargs *f, jv x);

static jv str_filter(const fargs *f, jv x) {
    const char *n = f->name;
    jstr s = x.u.str;
    if (!strcmp(n, "length") || !strcmp(n, "count")) return jv_int((double)jutf16_len(s.s, s.n));
    if (!strcmp(n, "upper")) return jjs_map_case(f->c, s, 1, false);
    if (!strcmp(n, "lower")) return jjs_map_case(f->c, s, 0, false);
    if (!strcmp(n, "title")) return jjs_title(f->c, s);
    if (!strcmp(n, "capitalize")) return jjs_map_case(f->c, s, 1, true);
    if (!strcmp(n, "trim")) {
        jv chars = arg(f, 0, "chars", jv_none());
        if (chars.k == JV_STR) return jv_str(jpy_strip_chars(s, chars.u.str, true, true));
        return jv_str(jjs_trim(s, true, true));
    }
    if (!strcmp(n, "indent")) return f_indent(f, x);
    if (!strcmp(n, "join")) return f->called ? f_join(f, x) : x;
    if (!strcmp(n, "string")) return x;
    if (!strcmp(n, "int") || !strcmp(n, "float")) {
        bool in = n[0] == 'i';
        double v = jjs_parse_num(s, in);
        if (isnan(v)) return f->called ? arg(f, 0, "default", in ? jv_int(0) : jv_float(0)) : in ? jv_int(0) : jv_float(0);
        return in ? jv_int(v) : jv_float(v);
    }
    if (!strcmp(n, "replace")) {
        if (f->n < 2 || f->a[0].k != JV_STR || f->a[1].k != JV_STR) jfail(f->c, f->at, "replace() arguments must be strings");
        jv cnt = arg(f, 2, "count", jv_none());
        if (cnt.k != JV_INT && cnt.k != JV_NONE) jfail(f->c, f->at, "replace() count argument must be a number or none");
        return jjs_replace(f->c, s, f->a[0].u.str, f->a[1].u.str, cnt.k == JV_NONE ? -1 : (long)cnt.u.num);
    }
    return str_filter2(f, x);
}

static jv str_filter2(const fargs *f, jv x) {
    const char *n = f->name;
    jstr s = x.u.str;
    if (!strcmp(n, "first") || !strcmp(n, "last")) {
        if (!s.n) return jv_undef();
        if (n[0] == 'f') return jv_str(jjs_sub(s, 0, jcp(s.s, 0, s.n)));
        size_t i = s.n - 1;
        while (i > 0 && ((unsigned char)s.s[i] & 0xC0) == 0x80) i--;
        return jv_str(jjs_sub(s, i, s.n));
    }
    if (!strcmp(n, "list") || !strcmp(n, "reverse")) {
        jarr *r = jarr_new(f->c, 8);
        for (size_t i = 0; i < s.n;) {
            size_t l = jcp(s.s, i, s.n);
            jarr_push(f->c, r, jv_str(jjs_sub(s, i, i + l)));
            i += l;
        }
        if (n[0] == 'l') return jv_arr(r);
        jbuf *b = jtmp_get(f->c);
        for (int i = r->n - 1; i >= 0; i--) jbuf_put_str(b, r->v[i].u.str);
        return str_of_buf(f->c, b);
    }
    if (!strcmp(n, "wordcount")) return f_wordcount(f, x);
    if (!strcmp(n, "truncate")) return f_truncate(f, x);
    if (!strcmp(n, "center")) return f_center(f, x);
    if (!strcmp(n, "e") || !strcmp(n, "escape")) return f_escape(f, x);
    if (!strcmp(n, "format")) return jpy_format_percent(f->c, f->at, s, f->a, f->n);
    unknown(f, x);
}

static jv num_filter(const fargs *f, jv x) {
    const char *n = f->name;
    if (!strcmp(n, "abs")) return x.k == JV_INT ? jv_int(fabs(x.u.num)) : jv_float(fabs(x.u.num));
    if (!strcmp(n, "int")) return f->called ? x : jv_int(floor(x.u.num));
    if (!strcmp(n, "float")) return f->called ? x : jv_float(x.u.num);
    if (!strcmp(n, "string")) {
        jbuf *b = jtmp_get(f->c);
        jv_print(f->c, b, x);
        return str_of_buf(f->c, b);
    }
    if (!strcmp(n, "round")) {
        jv prec = arg(f, 0, "precision", jv_int(0)), meth = arg(f, 1, "method", jv_undef());
        if (prec.k != JV_INT) jfail(f->c, f->at, "round: precision must be an integer");
        double p = pow(10, prec.u.num), v = x.u.num * p;
        if (meth.k == JV_STR && jjs_str_eq(meth.u.str, "floor")) v = floor(v);
        else if (meth.k == JV_STR && jjs_str_eq(meth.u.str, "ceil")) v = ceil(v);
        else if (meth.k == JV_UNDEF || (meth.k == JV_STR && jjs_str_eq(meth.u.str, "common"))) v = nearbyint(v);
        else jfail(f->c, f->at, "round: method must be 'common', 'ceil' or 'floor'");
        return x.k == JV_INT && prec.u.num <= 0 ? jv_int(v / p) : jv_float(v / p);
    }
    unknown(f, x);
}

static jv obj_filter(const fargs *f, jv x) {
    const char *n = f->name;
    if (!strcmp(n, "items")) return jdict_items(f->c, x.u.obj);
    if (!strcmp(n, "length") || !strcmp(n, "count")) return jv_int(x.u.obj->n);
    if (!strcmp(n, "string")) {
        jbuf *b = jtmp_get(f->c);
        jv_print(f->c, b, x);
        return str_of_buf(f->c, b);
    }
    if (!strcmp(n, "dictsort")) return jdict_sort(f->c, f->at, x.u.obj, f->a, f->n, f->kw);
    jv m = jmember_builtin(f->c, f->at, x, n, strlen(n));
    if (m.k == JV_FUNC) return jcall(f->c, f->at, m, f->a, f->n, f->kw, NULL);
    if (!strcmp(n, "list")) return jmember_builtin(f->c, f->at, x, "keys", 4).k == JV_FUNC ? jcall(f->c, f->at, jmember_builtin(f->c, f->at, x, "keys", 4), NULL, 0, NULL, NULL) : x;
    unknown(f, x);
}

static jv apply_filter(jctx *c, const jnode *at, jv x, const char *name, bool called, jv *a, int n, jobj *kw) {
    fargs f = {c, at, name, called, a, n, kw};
    if (!strcmp(name, "safe")) return x;
    if (!strcmp(name, "tojson")) return f_tojson(&f, x);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv dflt = arg(&f, 0, "default_value", jv_str((jstr){.s = "", .n = 0, .um = 1}));
        jv boolean = arg(&f, 1, "boolean", jv_bool(false));
        if (boolean.k != JV_BOOL) jfail(c, at, "`default` filter flag must be a boolean");
        return x.k == JV_UNDEF || (boolean.u.b && !jv_truthy(x)) ? dflt : x;
    }
    switch (x.k) {
    case JV_ARR: return arr_filter(&f, x);
    case JV_STR: return str_filter(&f, x);
    case JV_INT:
    case JV_FLOAT: return num_filter(&f, x);
    case JV_OBJ:
        if (x.u.obj->kind != OBJ_NAMESPACE) return obj_filter(&f, x);
        break;
    case JV_BOOL:
        if (!strcmp(name, "bool")) return x;
        if (!strcmp(name, "int")) return jv_int(x.u.b);
        if (!strcmp(name, "float")) return jv_float(x.u.b);
        if (!strcmp(name, "string")) return jv_cstr(c, x.u.b ? "true" : "false", 0);
        break;
    case JV_NONE:
        if (!strcmp(name, "string")) return jv_cstr(c, "None", 0);
        break;
    default: break;
    }
    jfail(c, at, "cannot apply filter '%s' to %s", name, jv_type_name(x));
}

jv jfilter(jctx *c, const jnode *at, jv x, const jnode *f, jscope *sc) {
    jarr *pos = jarr_new(c, f->nlist + 1);
    jobj *kw = NULL;
    if (f->op) jeval_args(c, f->list, f->nlist, sc, pos, &kw);
    return apply_filter(c, f, x, f->s, f->op != 0, pos->v, pos->n, kw);
}

/* ---- Python string formatting (Jinja2's format filter and str.format) ------------------ */
jv jpy_format_percent(jctx *c, const jnode *at, jstr fmt, jv *args, int nargs) {
    jbuf *b = jtmp_get(c);
    int k = 0;
    for (size_t i = 0; i < fmt.n; i++) {
        if (fmt.s[i] != '%') {
            jbuf_put_str(b, jjs_sub(fmt, i, i + 1));
            continue;
        }
        size_t j = i + 1;
        char spec[32] = "%";
        size_t sl = 1;
        while (j < fmt.n && strchr("-+ #0123456789.", fmt.s[j]) && sl < 20) spec[sl++] = fmt.s[j++];
        if (j >= fmt.n) jfail(c, at, "format: incomplete format");
        char conv = fmt.s[j];
        if (conv == '%') {
            jbuf_put(b, "%", 1, 0);
            i = j;
            continue;
        }
        if (k >= nargs) jfail(c, at, "format: not enough arguments for format string");
        jv v = args[k++];
        char out[128];
        if (conv == 's' || conv == 'r') jpy_str(c, b, v);
        else if (strchr("dif", conv) && (jv_isnum(v) || v.k == JV_BOOL)) {
            double x = v.k == JV_BOOL ? v.u.b : v.u.num;
            if (conv == 'f') spec[sl++] = 'f', spec[sl] = 0, snprintf(out, sizeof out, spec, x);
            else spec[sl++] = 'l', spec[sl++] = 'd', spec[sl] = 0, snprintf(out, sizeof out, spec, (long)trunc(x));
            jbuf_put(b, out, strlen(out), 0);
        } else jfail(c, at, "format: %%%c does not take %s", conv, jv_type_name(v));
        i = j;
    }
    jv r = jv_str(jbuf_take(c, b));
    jtmp_put(c);
    return r;
}

jv jpy_format_braces(jctx *c, const jnode *at, jstr fmt, jv *args, int nargs, jobj *kw) {
    jbuf *b = jtmp_get(c);
    int auto_i = 0;
    for (size_t i = 0; i < fmt.n; i++) {
        char ch = fmt.s[i];
        if ((ch == '{' || ch == '}') && i + 1 < fmt.n && fmt.s[i + 1] == ch) {
            jbuf_put_str(b, jjs_sub(fmt, i, i + 1));
            i++;
            continue;
        }
        if (ch != '{') {
            if (ch == '}') jfail(c, at, "format(): single '}' encountered in format string");
            jbuf_put_str(b, jjs_sub(fmt, i, i + 1));
            continue;
        }
        const char *e = memchr(fmt.s + i, '}', fmt.n - i);
        if (!e) jfail(c, at, "format(): single '{' encountered in format string");
        size_t a = i + 1, z = e - fmt.s;
        jv v;
        if (a == z) v = auto_i < nargs ? args[auto_i++] : jv_undef();
        else if (fmt.s[a] >= '0' && fmt.s[a] <= '9') {
            long idx = strtol(fmt.s + a, NULL, 10);
            v = idx < nargs ? args[idx] : jv_undef();
        } else {
            jv *p = kw ? jobj_get(kw, fmt.s + a, z - a) : NULL;
            v = p ? *p : jv_undef();
        }
        if (v.k == JV_UNDEF) jfail(c, at, "format(): no argument for {%.*s}", (int)(z - a), fmt.s + a);
        jpy_str(c, b, v);
        i = z;
    }
    jv r = jv_str(jbuf_take(c, b));
    jtmp_put(c);
    return r;
}
