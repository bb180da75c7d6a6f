/* moerl — Jinja: string helpers, string/list/dict methods, tests and globals.
 * Semantics of @huggingface/jinja 0.5.11 where it has the method or test (including its
 * quirks: strip/lstrip/rstrip trim JavaScript whitespace whatever their argument, as it does);
 * Python's for methods it lacks (find, count, splitlines, isdigit, ...). Filters are in
 * jinja_filter.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/common.h"
#include "data/jinja_internal.h"

/* ---- strings -------------------------------------------------------------------------- */
jstr jjs_sub(jstr s, size_t a, size_t b) {
    jstr r = {.s = s.s + a, .n = b - a, .m = s.m ? s.m + a : NULL, .um = s.um};
    return r;
}

jstr jjs_trim(jstr s, bool left, bool right) {
    size_t a = 0, b = s.n, l;
    if (left)
        while (a < b && (l = jjs_space_len(s.s + a, b - a))) a += l;
    if (right)
        while (b > a && (l = jjs_space_len_back(s.s + a, b - a))) b -= l;
    return jjs_sub(s, a, b);
}

/* Python str.strip(chars): the code points of chars removed from the ends. */
jstr jpy_strip_chars(jstr s, jstr chars, bool left, bool right) {
    size_t a = 0, b = s.n;
    for (;;) {
        if (!left || a >= b) break;
        size_t l = jcp(s.s, a, s.n);
        if (!memmem(chars.s, chars.n, s.s + a, l)) break;
        a += l;
    }
    while (right && b > a) {
        size_t i = b - 1;
        while (i > a && ((unsigned char)s.s[i] & 0xC0) == 0x80) i--;
        if (!memmem(chars.s, chars.n, s.s + i, b - i)) break;
        b = i;
    }
    return jjs_sub(s, a, b);
}

/* Map every code point through f (upper/lower case), keeping each source byte's mask for the
 * first byte of its replacement. */
jv jjs_map_case(jctx *c, jstr s, int upper, bool first_only) {
    jbuf *b = jtmp_get(c);
    for (size_t i = 0; i < s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s.s + i, s.n - i, &cp);
        if (l <= 0) l = 1, cp = -1;
        uint8_t m = s.m ? s.m[i] : s.um;
        if (cp >= 0 && (!first_only || i == 0)) {
            utf8proc_int32_t o = upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            utf8proc_uint8_t enc[4];
            utf8proc_ssize_t el = utf8proc_encode_char(o, enc);
            jbuf_put(b, (const char *)enc, el, m);
        } else jbuf_put_str(b, jjs_sub(s, i, i + l));
        i += l;
    }
    jv r = jv_str(jbuf_take(c, b));
    jtmp_put(c);
    return r;
}

static bool wordc(char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }

/* value.replace(/\b\w/g, toUpperCase): ASCII word starts upper-cased. */
jv jjs_title(jctx *c, jstr s) {
    jbuf *b = jtmp_get(c);
    jbuf_put_str(b, s);
    for (size_t i = 0; i < s.n; i++)
        if (wordc(s.s[i]) && (i == 0 || !wordc(s.s[i - 1])) && s.s[i] >= 'a' && s.s[i] <= 'z') b->text[i] -= 32;
    jv r = jv_str(jbuf_take(c, b));
    jtmp_put(c);
    return r;
}

bool jjs_str_eq(jstr a, const char *b) { return a.n == strlen(b) && !memcmp(a.s, b, a.n); }

static bool starts(jstr s, jstr p) { return p.n <= s.n && !memcmp(s.s, p.s, p.n); }
static bool ends(jstr s, jstr p) { return p.n <= s.n && !memcmp(s.s + s.n - p.n, p.s, p.n); }

/* @huggingface/jinja's replace(): count < 0 or none = all; an empty `old` matches between
 * code points. */
jv jjs_replace(jctx *c, jstr s, jstr old, jstr nw, long count) {
    if (count == 0) return jv_str(s);
    jbuf *b = jtmp_get(c);
    long left = count < 0 ? -1 : count;
    size_t i = 0;
    if (!old.n) {
        for (;;) {
            if (left != 0) jbuf_put_str(b, nw), left -= left > 0;
            if (i >= s.n) break;
            size_t l = jcp(s.s, i, s.n);
            jbuf_put_str(b, jjs_sub(s, i, i + l));
            i += l;
        }
    } else {
        while (i < s.n) {
            const char *p = left != 0 ? memmem(s.s + i, s.n - i, old.s, old.n) : NULL;
            if (!p) break;
            size_t at = p - s.s;
            jbuf_put_str(b, jjs_sub(s, i, at));
            jbuf_put_str(b, nw);
            i = at + old.n;
            left -= left > 0;
        }
        jbuf_put_str(b, jjs_sub(s, i, s.n));
    }
    jv r = jv_str(jbuf_take(c, b));
    jtmp_put(c);
    return r;
}

/* ---- string methods ------------------------------------------------------------------- */
static jv need_str(jctx *c, const jnode *at, jv *args, int nargs, int i, const char *what) {
    if (i >= nargs || args[i].k != JV_STR) jfail(c, at, "%s: argument %d must be a string", what, i + 1);
    return args[i];
}

static jv m_split(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jstr s = self.u.str;
    jv sep = nargs > 0 ? args[0] : jv_none();
    if (kw && jobj_get(kw, "sep", 3)) sep = *jobj_get(kw, "sep", 3);
    jv mx = nargs > 1 ? args[1] : jv_int(-1);
    if (kw && jobj_get(kw, "maxsplit", 8)) mx = *jobj_get(kw, "maxsplit", 8);
    if (sep.k != JV_STR && sep.k != JV_NONE) jfail(c, at, "split: sep argument must be a string or none");
    if (mx.k != JV_INT) jfail(c, at, "split: maxsplit argument must be an integer");
    long maxs = (long)mx.u.num;
    jarr *r = jarr_new(c, 4);
    if (sep.k == JV_NONE) {
        s = jjs_trim(s, true, false);
        size_t i = 0, l;
        while (i < s.n) {
            size_t st = i;
            while (i < s.n && !jjs_space_len(s.s + i, s.n - i)) i++;
            if (maxs != -1 && r->n >= maxs) {
                jarr_push(c, r, jv_str(jjs_sub(s, st, s.n)));
                break;
            }
            jarr_push(c, r, jv_str(jjs_sub(s, st, i)));
            while (i < s.n && (l = jjs_space_len(s.s + i, s.n - i))) i += l;
        }
        return jv_arr(r);
    }
    jstr p = sep.u.str;
    if (!p.n) jfail(c, at, "split: empty separator");
    size_t i = 0;
    for (;;) {
        const char *f = (maxs == -1 || r->n < maxs) ? memmem(s.s + i, s.n - i, p.s, p.n) : NULL;
        if (!f) {
            jarr_push(c, r, jv_str(jjs_sub(s, i, s.n)));
            break;
        }
        jarr_push(c, r, jv_str(jjs_sub(s, i, f - s.s)));
        i = f - s.s + p.n;
    }
    return jv_arr(r);
}

static jv m_rsplit(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jstr s = self.u.str;
    long maxs = nargs > 1 && args[1].k == JV_INT ? (long)args[1].u.num : -1;
    if (nargs < 1 || args[0].k != JV_STR || maxs < 0) return m_split(c, at, self, args, nargs, kw);
    jstr p = args[0].u.str;
    if (!p.n) jfail(c, at, "rsplit: empty separator");
    jarr *tmp = jarr_new(c, 4);
    size_t end = s.n;
    while ((long)tmp->n < maxs) {
        const char *f = NULL;
        for (size_t k = end; k >= p.n && !f; k--)
            if (!memcmp(s.s + k - p.n, p.s, p.n)) f = s.s + k - p.n;
        if (!f) break;
        jarr_push(c, tmp, jv_str(jjs_sub(s, f - s.s + p.n, end)));
        end = f - s.s;
    }
    jarr *r = jarr_new(c, tmp->n + 1);
    jarr_push(c, r, jv_str(jjs_sub(s, 0, end)));
    for (int k = tmp->n - 1; k >= 0; k--) jarr_push(c, r, tmp->v[k]);
    return jv_arr(r);
}

static jv m_affix(jctx *c, const jnode *at, jv self, jv *args, int nargs, bool start, const char *name) {
    if (!nargs) jfail(c, at, "%s() requires at least one argument", name);
    jv p = args[0];
    if (p.k == JV_STR) return jv_bool(start ? starts(self.u.str, p.u.str) : ends(self.u.str, p.u.str));
    if (p.k == JV_ARR) {
        for (int i = 0; i < p.u.arr->n; i++) {
            if (p.u.arr->v[i].k != JV_STR) jfail(c, at, "%s() tuple elements must be strings", name);
            jstr q = p.u.arr->v[i].u.str;
            if (start ? starts(self.u.str, q) : ends(self.u.str, q)) return jv_bool(true);
        }
        return jv_bool(false);
    }
    jfail(c, at, "%s() argument must be a string or tuple of strings", name);
}
static jv m_startswith(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_affix(c, at, self, args, nargs, true, "startswith"); }
static jv m_endswith(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_affix(c, at, self, args, nargs, false, "endswith"); }

static jv m_replace(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (nargs < 2) jfail(c, at, "replace() requires at least two arguments");
    if (args[0].k != JV_STR || args[1].k != JV_STR) jfail(c, at, "replace() arguments must be strings");
    jv cnt = nargs > 2 ? args[2] : jv_none();
    if (kw && jobj_get(kw, "count", 5)) cnt = *jobj_get(kw, "count", 5);
    if (cnt.k != JV_INT && cnt.k != JV_NONE) jfail(c, at, "replace() count argument must be a number or none");
    return jjs_replace(c, self.u.str, args[0].u.str, args[1].u.str, cnt.k == JV_NONE ? -1 : (long)cnt.u.num);
}

static jv m_upper(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jjs_map_case(c, self.u.str, 1, false); }
static jv m_lower(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jjs_map_case(c, self.u.str, 0, false); }
static jv m_capitalize(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jjs_map_case(c, self.u.str, 1, true); }
static jv m_title(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jjs_title(c, self.u.str); }
static jv m_strip(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jv_str(jjs_trim(self.u.str, true, true)); }
static jv m_lstrip(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jv_str(jjs_trim(self.u.str, true, false)); }
static jv m_rstrip(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jv_str(jjs_trim(self.u.str, false, true)); }

/* Python str.find/rfind/index/count, positions in code points. */
static long cp_index(jstr s, size_t byte) {
    long k = 0;
    for (size_t i = 0; i < byte; i += jcp(s.s, i, s.n)) k++;
    return k;
}
static long find_in(jstr s, jstr p, bool rev) {
    if (p.n > s.n) return -1;
    if (!rev) {
        const char *f = p.n ? memmem(s.s, s.n, p.s, p.n) : s.s;
        return f ? cp_index(s, f - s.s) : -1;
    }
    for (size_t k = s.n - p.n + 1; k-- > 0;)
        if (!memcmp(s.s + k, p.s, p.n)) return cp_index(s, k);
    return -1;
}
static jv m_find(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jv_int(find_in(self.u.str, need_str(c, at, args, nargs, 0, "find").u.str, false)); }
static jv m_rfind(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jv_int(find_in(self.u.str, need_str(c, at, args, nargs, 0, "rfind").u.str, true)); }
static jv m_sindex(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    long k = find_in(self.u.str, need_str(c, at, args, nargs, 0, "index").u.str, false);
    if (k < 0) jfail(c, at, "index(): substring not found");
    return jv_int(k);
}
static jv m_scount(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jstr s = self.u.str, p = need_str(c, at, args, nargs, 0, "count").u.str;
    if (!p.n) return jv_int(cp_index(s, s.n) + 1);
    long n = 0;
    for (const char *f = s.s; (f = memmem(f, s.s + s.n - f, p.s, p.n)); f += p.n) n++;
    return jv_int(n);
}

static jv m_sjoin(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (nargs < 1 || args[0].k != JV_ARR) jfail(c, at, "join() takes a list of strings");
    jbuf *b = jtmp_get(c);
    for (int i = 0; i < args[0].u.arr->n; i++) {
        if (i) jbuf_put_str(b, self.u.str);
        jv_print(c, b, args[0].u.arr->v[i]);
    }
    jv r = jv_str(jbuf_take(c, b));
    jtmp_put(c);
    return r;
}

static jv m_splitlines(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jstr s = self.u.str;
    jarr *r = jarr_new(c, 4);
    size_t st = 0;
    for (size_t i = 0; i < s.n;) {
        size_t l = (s.s[i] == '\r' && i + 1 < s.n && s.s[i + 1] == '\n') ? 2 : (s.s[i] == '\n' || s.s[i] == '\r') ? 1 : 0;
        if (l) {
            jarr_push(c, r, jv_str(jjs_sub(s, st, i)));
            i += l, st = i;
        } else i++;
    }
    if (st < s.n) jarr_push(c, r, jv_str(jjs_sub(s, st, s.n)));
    return jv_arr(r);
}

/* isdigit/isalpha/isalnum/isspace/isupper/islower by Unicode category. */
static jv m_is(jctx *c, jv self, int kind) {
    jstr s = self.u.str;
    if (!s.n) return jv_bool(false);
    bool cased = false;
    for (size_t i = 0; i < s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s.s + i, s.n - i, &cp);
        if (l <= 0) return jv_bool(false);
        utf8proc_category_t k = utf8proc_category(cp);
        bool letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO, digit = k == UTF8PROC_CATEGORY_ND;
        bool ok = kind == 0 ? digit : kind == 1 ? letter : kind == 2 ? letter || digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO
                : kind == 3 ? jjs_space_len(s.s + i, s.n - i) > 0 : true;
        if (kind == 4 && k == UTF8PROC_CATEGORY_LL) return jv_bool(false);
        if (kind == 5 && k == UTF8PROC_CATEGORY_LU) return jv_bool(false);
        cased |= k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL;
        if (!ok) return jv_bool(false);
        i += l;
    }
    return jv_bool(kind < 4 || cased);
}
static jv m_isdigit(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_is(c, self, 0); }
static jv m_isalpha(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_is(c, self, 1); }
static jv m_isalnum(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_is(c, self, 2); }
static jv m_isspace(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_is(c, self, 3); }
static jv m_isupper(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_is(c, self, 4); }
static jv m_islower(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_is(c, self, 5); }

static jv m_removeaffix(jctx *c, const jnode *at, jv self, jv *args, int nargs, bool prefix) {
    jstr s = self.u.str, p = need_str(c, at, args, nargs, 0, prefix ? "removeprefix" : "removesuffix").u.str;
    if (prefix) return starts(s, p) ? jv_str(jjs_sub(s, p.n, s.n)) : self;
    return ends(s, p) ? jv_str(jjs_sub(s, 0, s.n - p.n)) : self;
}
static jv m_removeprefix(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_removeaffix(c, at, self, args, nargs, true); }
static jv m_removesuffix(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return m_removeaffix(c, at, self, args, nargs, false); }

static jv m_format(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jpy_format_braces(c, at, self.u.str, args, nargs, kw); }

/* ---- list and dict methods ------------------------------------------------------------ */
static jv m_lindex(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (!nargs) jfail(c, at, "index() takes one argument");
    for (int i = 0; i < self.u.arr->n; i++)
        if (jv_strict_eq(self.u.arr->v[i], args[0])) return jv_int(i);
    jfail(c, at, "index(): value is not in the list");
}
static jv m_lcount(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (!nargs) jfail(c, at, "count() takes one argument");
    long n = 0;
    for (int i = 0; i < self.u.arr->n; i++) n += jv_strict_eq(self.u.arr->v[i], args[0]);
    return jv_int(n);
}
static jv m_append(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (nargs != 1) jfail(c, at, "append() takes exactly one argument");
    jarr_push(c, self.u.arr, args[0]);
    return jv_none();
}
static jv m_extend(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (nargs != 1 || args[0].k != JV_ARR) jfail(c, at, "extend() takes one list");
    jarr *src = args[0].u.arr;
    int n = src->n;
    for (int i = 0; i < n; i++) jarr_push(c, self.u.arr, src->v[i]);
    return jv_none();
}
static jv m_pop(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jarr *a = self.u.arr;
    long i = nargs && args[0].k == JV_INT ? (long)args[0].u.num : -1;
    if (i < 0) i += a->n;
    if (i < 0 || i >= a->n) jfail(c, at, "pop(): index out of range");
    jv v = a->v[i];
    memmove(a->v + i, a->v + i + 1, (a->n - i - 1) * sizeof(jv));
    a->n--;
    return v;
}

static jv m_get(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (nargs < 1 || args[0].k != JV_STR) jfail(c, at, "get(): object key must be a string: got %s", nargs ? jv_type_name(args[0]) : "nothing");
    jv *v = jobj_get(self.u.obj, args[0].u.str.s, args[0].u.str.n);
    return v ? *v : nargs > 1 ? args[1] : jv_none();
}
jv jdict_items(jctx *c, jobj *o) {
    jarr *r = jarr_new(c, o->n);
    for (int i = 0; i < o->n; i++) {
        jarr *p = jarr_new(c, 2);
        jarr_push(c, p, jv_str(o->keys[i]));
        jarr_push(c, p, o->vals[i]);
        jarr_push(c, r, jv_arr(p));
    }
    return jv_arr(r);
}
static jv m_items(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jdict_items(c, self.u.obj); }
static jv m_keys(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jarr *r = jarr_new(c, self.u.obj->n);
    for (int i = 0; i < self.u.obj->n; i++) jarr_push(c, r, jv_str(self.u.obj->keys[i]));
    return jv_arr(r);
}
static jv m_values(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jarr *r = jarr_new(c, self.u.obj->n);
    for (int i = 0; i < self.u.obj->n; i++) jarr_push(c, r, self.u.obj->vals[i]);
    return jv_arr(r);
}

typedef struct {
    jctx *c;
    const jnode *at;
    int by;
    bool cs, rev;
} sort_ctx;
static _Thread_local sort_ctx *g_sort; /* the comparison's context (the sort takes a plain comparator) */

static int pair_cmp(const void *x, const void *y) {
    const jv *a = x, *b = y;
    int r = jv_compare(g_sort->c, g_sort->at, a->u.arr->v[g_sort->by], b->u.arr->v[g_sort->by], g_sort->cs);
    return g_sort->rev ? -r : r;
}

jv jdict_sort(jctx *c, const jnode *at, jobj *o, jv *args, int nargs, jobj *kw) {
    jv cs = nargs > 0 ? args[0] : kw && jobj_get(kw, "case_sensitive", 14) ? *jobj_get(kw, "case_sensitive", 14) : jv_bool(false);
    jv by = nargs > 1 ? args[1] : kw && jobj_get(kw, "by", 2) ? *jobj_get(kw, "by", 2) : jv_undef();
    jv rev = nargs > 2 ? args[2] : kw && jobj_get(kw, "reverse", 7) ? *jobj_get(kw, "reverse", 7) : jv_bool(false);
    if (cs.k != JV_BOOL) jfail(c, at, "dictsort: case_sensitive must be a boolean");
    if (by.k != JV_UNDEF && (by.k != JV_STR || (!jjs_str_eq(by.u.str, "key") && !jjs_str_eq(by.u.str, "value"))))
        jfail(c, at, "dictsort: by must be either 'key' or 'value'");
    if (rev.k != JV_BOOL) jfail(c, at, "dictsort: reverse must be a boolean");
    jv items = jdict_items(c, o);
    sort_ctx sc = {c, at, by.k == JV_STR && jjs_str_eq(by.u.str, "value"), cs.u.b, rev.u.b};
    sort_ctx *saved = g_sort;
    g_sort = &sc;
    jv_stable_sort(c, items.u.arr->v, items.u.arr->n, pair_cmp);
    g_sort = saved;
    return items;
}
static jv m_dictsort(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) { return jdict_sort(c, at, self.u.obj, args, nargs, kw); }

/* Stable merge sort (JavaScript's Array#sort is stable). */
void jv_stable_sort(jctx *c, jv *v, int n, int (*cmp)(const void *, const void *)) {
    if (n < 2) return;
    jv *tmp = ja_alloc(&c->arena, n * sizeof *tmp); /* arena: a failing comparison unwinds past here */
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = cmp(&v[j], &v[i]) < 0 ? v[j++] : v[i++];
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof *v);
    }
}

static jv m_cycle(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (!nargs) jfail(c, at, "loop.cycle() needs at least one argument");
    return args[self.u.obj->loop_index % nargs];
}

typedef struct {
    const char *name;
    jbuiltin_fn fn;
} method;

static const method STR_METHODS[] = {
    {"upper", m_upper}, {"lower", m_lower}, {"strip", m_strip}, {"title", m_title}, {"capitalize", m_capitalize},
    {"rstrip", m_rstrip}, {"lstrip", m_lstrip}, {"startswith", m_startswith}, {"endswith", m_endswith},
    {"split", m_split}, {"replace", m_replace}, {"rsplit", m_rsplit}, {"find", m_find}, {"rfind", m_rfind},
    {"index", m_sindex}, {"count", m_scount}, {"join", m_sjoin}, {"splitlines", m_splitlines},
    {"isdigit", m_isdigit}, {"isalpha", m_isalpha}, {"isalnum", m_isalnum}, {"isspace", m_isspace},
    {"isupper", m_isupper}, {"islower", m_islower}, {"removeprefix", m_removeprefix},
    {"removesuffix", m_removesuffix}, {"format", m_format}, {NULL, NULL}};
static const method ARR_METHODS[] = {{"index", m_lindex}, {"count", m_lcount}, {"append", m_append},
                                     {"extend", m_extend}, {"pop", m_pop}, {NULL, NULL}};
static const method OBJ_METHODS[] = {{"get", m_get}, {"items", m_items}, {"keys", m_keys}, {"values", m_values},
                                     {"dictsort", m_dictsort}, {NULL, NULL}};

static jv bind(jctx *c, const char *name, jbuiltin_fn fn, jv self) {
    jfunc *f = ja_alloc(&c->arena, sizeof *f);
    f->name = name, f->fn = fn, f->self = self;
    jv v = {.k = JV_FUNC};
    v.u.fn = f;
    return v;
}

jv jmember_builtin(jctx *c, const jnode *at, jv obj, const char *name, size_t n) {
    const method *t = obj.k == JV_STR ? STR_METHODS : obj.k == JV_ARR ? ARR_METHODS
                    : (obj.k == JV_OBJ && obj.u.obj->kind != OBJ_NAMESPACE) ? OBJ_METHODS : NULL;
    if (obj.k == JV_OBJ && obj.u.obj->is_loop && n == 5 && !memcmp(name, "cycle", 5)) return bind(c, "cycle", m_cycle, obj);
    if ((obj.k == JV_STR || obj.k == JV_ARR) && n == 6 && !memcmp(name, "length", 6))
        return jv_int(obj.k == JV_STR ? (double)jutf16_len(obj.u.str.s, obj.u.str.n) : obj.u.arr->n);
    for (int i = 0; t && t[i].name; i++)
        if (strlen(t[i].name) == n && !memcmp(t[i].name, name, n)) return bind(c, t[i].name, t[i].fn, obj);
    return jv_undef();
}

/* ---- tests ---------------------------------------------------------------------------- */
static const char *const TESTS[] = {"boolean", "callable", "odd", "even", "false", "true", "none", "string", "number",
                                    "integer", "float", "iterable", "mapping", "sequence", "lower", "upper", "defined",
                                    "undefined", "equalto", "eq", "ne", "lt", "le", "gt", "ge", "greaterthan", "lessthan",
                                    "divisibleby", "in", "sameas", "startingwith", NULL};

bool jtest_exists(const char *name) {
    for (int i = 0; TESTS[i]; i++)
        if (!strcmp(TESTS[i], name)) return true;
    return false;
}

static bool test_cmp(jctx *c, const jnode *at, const char *name, jv v, jv *args, int nargs) {
    if (nargs < 1) jfail(c, at, "test '%s' needs an argument", name);
    jv a = args[0];
    if (!strcmp(name, "eq") || !strcmp(name, "equalto")) return jv_strict_eq(v, a);
    if (!strcmp(name, "ne")) return !jv_strict_eq(v, a);
    if (!strcmp(name, "sameas")) return jv_strict_eq(v, a);
    if (!strcmp(name, "in")) {
        if (a.k == JV_ARR) {
            for (int i = 0; i < a.u.arr->n; i++)
                if (jv_strict_eq(a.u.arr->v[i], v)) return true;
            return false;
        }
        if (a.k == JV_STR && v.k == JV_STR) return v.u.str.n <= a.u.str.n && memmem(a.u.str.s, a.u.str.n, v.u.str.s, v.u.str.n);
        if (a.k == JV_OBJ && v.k == JV_STR) return jobj_get(a.u.obj, v.u.str.s, v.u.str.n) != NULL;
        jfail(c, at, "test 'in': cannot look for %s in %s", jv_type_name(v), jv_type_name(a));
    }
    if (!strcmp(name, "startingwith")) {
        if (v.k != JV_STR || a.k != JV_STR) return false;
        return starts(v.u.str, a.u.str);
    }
    if (!strcmp(name, "divisibleby")) {
        if (!jv_isnum(v) || !jv_isnum(a)) jfail(c, at, "test 'divisibleby' needs numbers, got %s and %s", jv_type_name(v), jv_type_name(a));
        if (a.u.num == 0) jfail(c, at, "test 'divisibleby': division by zero");
        return fmod(v.u.num, a.u.num) == 0;
    }
    int k = jv_compare(c, at, v, a, true);
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan")) return k < 0;
    if (!strcmp(name, "le")) return k <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan")) return k > 0;
    return k >= 0;
}

static bool case_same(jctx *c, jstr s, int upper) {
    jv m = jjs_map_case(c, s, upper, false);
    return m.u.str.n == s.n && !memcmp(m.u.str.s, s.s, s.n);
}

bool jtest(jctx *c, const jnode *at, jv v, const char *name, jv *args, int nargs) {
    if (!strcmp(name, "defined")) return v.k != JV_UNDEF;
    if (!strcmp(name, "undefined")) return v.k == JV_UNDEF;
    if (!strcmp(name, "none")) return v.k == JV_NONE;
    if (!strcmp(name, "boolean")) return v.k == JV_BOOL;
    if (!strcmp(name, "true")) return v.k == JV_BOOL && v.u.b;
    if (!strcmp(name, "false")) return v.k == JV_BOOL && !v.u.b;
    if (!strcmp(name, "string")) return v.k == JV_STR;
    if (!strcmp(name, "number")) return jv_isnum(v);
    if (!strcmp(name, "integer")) return v.k == JV_INT;
    if (!strcmp(name, "float")) return v.k == JV_FLOAT;
    if (!strcmp(name, "callable")) return v.k == JV_FUNC;
    if (!strcmp(name, "iterable")) return (v.k == JV_ARR && !v.u.arr->tuple) || v.k == JV_STR;
    if (!strcmp(name, "mapping")) return v.k == JV_OBJ && v.u.obj->kind != OBJ_NAMESPACE;
    if (!strcmp(name, "sequence")) return v.k == JV_ARR || v.k == JV_STR || (v.k == JV_OBJ && v.u.obj->kind != OBJ_NAMESPACE);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) return v.k == JV_STR && case_same(c, v.u.str, name[0] == 'u');
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v.k != JV_INT) jfail(c, at, "cannot %s on %s", name, jv_type_name(v));
        return (fmod(v.u.num, 2) != 0) == (name[0] == 'o');
    }
    if (jtest_exists(name)) return test_cmp(c, at, name, v, args, nargs);
    jfail(c, at, "unknown test '%s'", name);
}

/* ---- globals -------------------------------------------------------------------------- */
static jv g_raise(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jbuf *b = jtmp_get(c);
    if (nargs) jv_jsstr(c, b, args[0]);
    jfail(c, at, "raise_exception: %s", b->text ? b->text : "");
}

static jv g_range(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    for (int i = 0; i < nargs; i++)
        if (!jv_isnum(args[i])) jfail(c, at, "range() arguments must be numbers, got %s", jv_type_name(args[i]));
    if (nargs < 1 || nargs > 3) jfail(c, at, "range() takes 1 to 3 arguments, got %d", nargs);
    double a = nargs > 1 ? args[0].u.num : 0, b = nargs > 1 ? args[1].u.num : args[0].u.num, st = nargs > 2 ? args[2].u.num : 1;
    if (st == 0) jfail(c, at, "range() step must not be zero");
    jarr *r = jarr_new(c, 8);
    for (double x = a; st > 0 ? x < b : x > b; x += st) {
        if (r->n >= 1000000) jfail(c, at, "range() of more than 1000000 items");
        jarr_push(c, r, x == floor(x) ? jv_int(x) : jv_float(x));
    }
    return jv_arr(r);
}

static jv g_namespace(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jobj *o = jobj_new(c, OBJ_NAMESPACE);
    if (nargs > 1) jfail(c, at, "namespace expected at most 1 argument, got %d", nargs);
    if (nargs == 1) {
        jv s = args[0];
        if (s.k == JV_OBJ)
            for (int i = 0; i < s.u.obj->n; i++) jobj_set(c, o, s.u.obj->keys[i], s.u.obj->vals[i]);
        else if (s.k == JV_ARR)
            for (int i = 0; i < s.u.arr->n; i++) {
                jv p = s.u.arr->v[i];
                if (p.k != JV_ARR || p.u.arr->n != 2 || p.u.arr->v[0].k != JV_STR)
                    jfail(c, at, "namespace expected an object or an iterable of [key, value] pairs");
                jobj_set(c, o, p.u.arr->v[0].u.str, p.u.arr->v[1]);
            }
        else jfail(c, at, "'%s' object is not iterable", jv_type_name(s));
    }
    for (int i = 0; kw && i < kw->n; i++) jobj_set(c, o, kw->keys[i], kw->vals[i]);
    return jv_obj(o);
}

static jv g_dict(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    jobj *o = jobj_new(c, OBJ_DICT);
    if (nargs == 1 && args[0].k == JV_OBJ)
        for (int i = 0; i < args[0].u.obj->n; i++) jobj_set(c, o, args[0].u.obj->keys[i], args[0].u.obj->vals[i]);
    else if (nargs) jfail(c, at, "dict() takes keyword arguments or one mapping");
    for (int i = 0; kw && i < kw->n; i++) jobj_set(c, o, kw->keys[i], kw->vals[i]);
    return jv_obj(o);
}

/* strftime_now(format): %Y %m %d %b %B %H %M %% in local time (others kept as written), at
 * $SOURCE_DATE_EPOCH when set (reproducible renders), else now. */
static jv g_strftime(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw) {
    if (nargs < 1 || args[0].k != JV_STR) jfail(c, at, "strftime_now() takes a format string");
    static const char *mon[] = {"January", "February", "March", "April", "May", "June", "July", "August", "September",
                                "October", "November", "December"};
    const char *env = getenv("SOURCE_DATE_EPOCH");
    time_t now = env && *env ? (time_t)strtoll(env, NULL, 10) : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    jstr f = args[0].u.str;
    jbuf *b = jtmp_get(c);
    char tmp[32];
    for (size_t i = 0; i < f.n; i++) {
        char k = i + 1 < f.n && f.s[i] == '%' ? f.s[i + 1] : 0;
        const char *o = NULL;
        switch (k) {
        case 'Y': snprintf(tmp, sizeof tmp, "%d", tm.tm_year + 1900), o = tmp; break;
        case 'm': snprintf(tmp, sizeof tmp, "%02d", tm.tm_mon + 1), o = tmp; break;
        case 'd': snprintf(tmp, sizeof tmp, "%02d", tm.tm_mday), o = tmp; break;
        case 'b': snprintf(tmp, sizeof tmp, "%.3s", mon[tm.tm_mon]), o = tmp; break;
        case 'B': o = mon[tm.tm_mon]; break;
        case 'H': snprintf(tmp, sizeof tmp, "%02d", tm.tm_hour), o = tmp; break;
        case 'M': snprintf(tmp, sizeof tmp, "%02d", tm.tm_min), o = tmp; break;
        case '%': o = "%"; break;
        }
        if (o) jbuf_put(b, o, strlen(o), 0), i++;
        else jbuf_put(b, f.s + i, 1, f.m ? f.m[i] : f.um);
    }
    jv r = jv_str(jbuf_take(c, b));
    jtmp_put(c);
    return r;
}

void jglobals_init(jctx *c, jscope *g) {
    const jinja_tpl *t = c->t;
    static const struct {
        const char *name;
        jbuiltin_fn fn;
    } fns[] = {{"raise_exception", g_raise}, {"range", g_range}, {"namespace", g_namespace}, {"dict", g_dict},
               {"strftime_now", g_strftime}};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        jscope_set(c, g, jsym(t, fns[i].name, strlen(fns[i].name)), bind(c, fns[i].name, fns[i].fn, jv_none()));
    static const char *const consts[] = {"true", "false", "none", "True", "False", "None"};
    for (int i = 0; i < 6; i++) {
        jv v = consts[i][0] == 'n' || consts[i][0] == 'N' ? jv_none() : jv_bool(consts[i][0] == 't' || consts[i][0] == 'T');
        jscope_set(c, g, jsym(t, consts[i], strlen(consts[i])), v);
    }
}
