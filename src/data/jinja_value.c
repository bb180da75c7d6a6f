/* moerl — Jinja: runtime values (see jinja_internal.h): construction from JSON, truthiness,
 * equality, ordering, and the three ways a value becomes text as @huggingface/jinja writes it:
 * printing ({{ x }}: RuntimeValue#toString), concatenation (`+`/`~`: the JavaScript value's
 * toString) and tojson (Python json.dumps layout: ", " and ": " separators, or "," with indent).
 * Numbers are JavaScript doubles; an integer-valued JSON number is an integer, as JSON.parse
 * hands it over. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/jinja_internal.h"

void jbuf_put(jbuf *b, const char *s, size_t n, uint8_t m) {
    if (b->len + n + 1 > b->cap) {
        b->cap = 2 * (b->len + n + 1) + 64;
        b->text = xrealloc(b->text, b->cap);
        b->tpl = xrealloc(b->tpl, b->cap);
    }
    if (n) memcpy(b->text + b->len, s, n);
    if (n) memset(b->tpl + b->len, m, n);
    b->len += n;
    b->text[b->len] = 0;
}

void jbuf_put_str(jbuf *b, jstr s) {
    if (!s.m) {
        jbuf_put(b, s.s, s.n, s.um);
        return;
    }
    jbuf_put(b, s.s, s.n, 0);
    memcpy(b->tpl + b->len - s.n, s.m, s.n);
}

static void jbuf_puts(jbuf *b, const char *s, uint8_t m) { jbuf_put(b, s, strlen(s), m); }

jv jv_str(jstr s) {
    jv v = {.k = JV_STR};
    v.u.str = s;
    return v;
}

jv jv_strn(jctx *c, const char *s, size_t n, uint8_t m) {
    jstr t = {.s = ja_strdup(&c->arena, s, n), .n = n, .um = m};
    return jv_str(t);
}

jv jv_cstr(jctx *c, const char *s, uint8_t m) { return jv_strn(c, s, strlen(s), m); }

jstr jbuf_take(jctx *c, jbuf *b) {
    jstr s = {.s = ja_strdup(&c->arena, b->text ? b->text : "", b->len), .n = b->len, .um = 0};
    bool uni = true;
    for (size_t i = 1; i < b->len && uni; i++) uni = b->tpl[i] == b->tpl[0];
    if (b->len && uni) s.um = b->tpl[0];
    else if (b->len) {
        uint8_t *m = ja_alloc(&c->arena, b->len);
        memcpy(m, b->tpl, b->len);
        s.m = m;
    }
    b->len = 0;
    if (b->text) b->text[0] = 0;
    return s;
}

jarr *jarr_new(jctx *c, int cap) {
    jarr *a = ja_alloc(&c->arena, sizeof *a);
    a->cap = cap > 0 ? cap : 4;
    a->v = ja_alloc(&c->arena, a->cap * sizeof(jv));
    return a;
}

void jarr_push(jctx *c, jarr *a, jv v) {
    if (a->n == a->cap) {
        jv *nv = ja_alloc(&c->arena, 2 * a->cap * sizeof(jv));
        memcpy(nv, a->v, a->n * sizeof(jv));
        a->v = nv;
        a->cap *= 2;
    }
    a->v[a->n++] = v;
}

jv jv_arr(jarr *a) {
    jv v = {.k = JV_ARR};
    v.u.arr = a;
    return v;
}

jobj *jobj_new(jctx *c, jobj_kind k) {
    jobj *o = ja_alloc(&c->arena, sizeof *o);
    o->kind = k;
    return o;
}

jv *jobj_get(const jobj *o, const char *key, size_t n) {
    for (int i = 0; i < o->n; i++)
        if (o->keys[i].n == n && !memcmp(o->keys[i].s, key, n)) return &o->vals[i];
    return NULL;
}

void jobj_set(jctx *c, jobj *o, jstr key, jv v) {
    jv *p = jobj_get(o, key.s, key.n);
    if (p) {
        *p = v;
        return;
    }
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 8;
        jstr *k = ja_alloc(&c->arena, cap * sizeof *k);
        jv *vv = ja_alloc(&c->arena, cap * sizeof *vv);
        if (o->n) memcpy(k, o->keys, o->n * sizeof *k), memcpy(vv, o->vals, o->n * sizeof *vv);
        o->keys = k, o->vals = vv, o->cap = cap;
    }
    o->keys[o->n] = key;
    o->vals[o->n++] = v;
}

jv jv_obj(jobj *o) {
    jv v = {.k = JV_OBJ};
    v.u.obj = o;
    return v;
}

/* A JavaScript array index ("0", "17"; no sign or leading zero): such keys come first. */
static bool index_key(const char *k, double *v) {
    size_t n = strlen(k);
    if (!n || n > 10 || (n > 1 && k[0] == '0')) return false;
    for (size_t i = 0; i < n; i++)
        if (k[i] < '0' || k[i] > '9') return false;
    *v = strtod(k, NULL);
    return *v < 4294967295.0;
}

static void obj_from_json(jctx *c, jobj *o, const json_t *j, uint8_t m) {
    const char *key;
    json_t *val;
    double iv, prev = -1;
    bool idx = false;
    json_object_foreach((json_t *)j, key, val) idx |= index_key(key, &iv);
    while (idx) { /* integer-like keys in ascending order, as Object.entries lists them */
        double best = INFINITY;
        const char *bk = NULL;
        json_object_foreach((json_t *)j, key, val)
            if (index_key(key, &iv) && iv > prev && iv < best) best = iv, bk = key;
        if (!bk) break;
        jstr ks = {.s = bk, .n = strlen(bk)};
        jobj_set(c, o, ks, jv_from_json(c, json_object_get(j, bk), 0));
        prev = best;
    }
    json_object_foreach((json_t *)j, key, val) {
        if (index_key(key, &iv)) continue;
        jstr ks = {.s = key, .n = strlen(key)};
        jobj_set(c, o, ks, jv_from_json(c, val, 0));
    }
    (void)m;
}

jv jv_from_json(jctx *c, const json_t *j, uint8_t m) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jobj *o = jobj_new(c, OBJ_DICT);
        obj_from_json(c, o, j, m);
        return jv_obj(o);
    }
    case JSON_ARRAY: {
        jarr *a = jarr_new(c, (int)json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) jarr_push(c, a, jv_from_json(c, json_array_get(j, i), 0));
        return jv_arr(a);
    }
    case JSON_STRING: {
        jstr s = {.s = json_string_value(j), .n = json_string_length(j), .um = m};
        return jv_str(s);
    }
    case JSON_INTEGER: return jv_int((double)json_integer_value(j));
    case JSON_REAL: {
        double x = json_real_value(j);
        return x == floor(x) && isfinite(x) ? jv_int(x) : jv_float(x);
    }
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_none();
    }
}

const char *jv_type_name(jv v) {
    switch (v.k) {
    case JV_UNDEF: return "UndefinedValue";
    case JV_NONE: return "NullValue";
    case JV_BOOL: return "BooleanValue";
    case JV_INT: return "IntegerValue";
    case JV_FLOAT: return "FloatValue";
    case JV_STR: return "StringValue";
    case JV_ARR: return v.u.arr->tuple ? "TupleValue" : "ArrayValue";
    case JV_OBJ: return v.u.obj->kind == OBJ_NAMESPACE ? "NamespaceValue" : v.u.obj->kind == OBJ_KWARGS ? "KeywordArgumentsValue" : "ObjectValue";
    case JV_FUNC: return "FunctionValue";
    }
    return "?";
}

bool jv_truthy(jv v) {
    switch (v.k) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT:
    case JV_FLOAT: return v.u.num != 0 && !isnan(v.u.num);
    case JV_STR: return v.u.str.n > 0;
    case JV_ARR: return v.u.arr->n > 0;
    case JV_OBJ: return v.u.obj->kind == OBJ_NAMESPACE || v.u.obj->n > 0;
    case JV_FUNC: return true;
    }
    return false;
}

/* Number(str) of JavaScript: trimmed, "" → 0, decimal/hex/Infinity, else NaN. */
static double jjs_to_number(jstr s) {
    size_t a = 0, b = s.n, l;
    while (a < b && (l = jjs_space_len(s.s + a, b - a))) a += l;
    while (b > a && (l = jjs_space_len_back(s.s + a, b - a))) b -= l;
    if (a == b) return 0;
    char buf[64];
    if (b - a >= sizeof buf) return NAN;
    memcpy(buf, s.s + a, b - a);
    buf[b - a] = 0;
    if (!strcmp(buf, "Infinity") || !strcmp(buf, "+Infinity")) return INFINITY;
    if (!strcmp(buf, "-Infinity")) return -INFINITY;
    for (char *p = buf; *p; p++)
        if (!strchr("0123456789+-.eExXabcdefABCDEF", *p)) return NAN;
    char *end;
    double x = (buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X')) ? (double)strtoull(buf + 2, &end, 16) : strtod(buf, &end);
    return *end ? NAN : x;
}

static double num_of(jv v) { return v.k == JV_BOOL ? (v.u.b ? 1 : 0) : v.k == JV_STR ? jjs_to_number(v.u.str) : v.u.num; }

/* A list or dict compared with a string, number or boolean: JavaScript turns it into its
 * string first (a list: its items' text joined by ","; a dict: "[object Map]"). */
static bool eq_as_text(jctx *c, jv obj, jv prim) {
    jbuf *b = jtmp_get(c);
    jv_jsstr(c, b, obj);
    jstr t = {.s = b->text ? b->text : "", .n = b->len};
    bool r = jv_loose_eq(c, jv_str(t), prim);
    jtmp_put(c);
    return r;
}

bool jv_loose_eq(jctx *c, jv a, jv b) {
    bool an = a.k == JV_UNDEF || a.k == JV_NONE, bn = b.k == JV_UNDEF || b.k == JV_NONE;
    if (an || bn) return an && bn;
    if (a.k == JV_STR && b.k == JV_STR) return a.u.str.n == b.u.str.n && !memcmp(a.u.str.s, b.u.str.s, a.u.str.n);
    bool ap = a.k == JV_BOOL || jv_isnum(a) || a.k == JV_STR, bp = b.k == JV_BOOL || jv_isnum(b) || b.k == JV_STR;
    if (ap && bp) return num_of(a) == num_of(b);
    if (ap && (b.k == JV_ARR || b.k == JV_OBJ)) return eq_as_text(c, b, a);
    if (bp && (a.k == JV_ARR || a.k == JV_OBJ)) return eq_as_text(c, a, b);
    if (ap || bp) return false;
    if (a.k != b.k) return false;
    return a.k == JV_ARR ? a.u.arr == b.u.arr : a.k == JV_OBJ ? a.u.obj == b.u.obj : a.u.fn == b.u.fn;
}

bool jv_strict_eq(jv a, jv b) {
    bool an = jv_isnum(a), bn = jv_isnum(b);
    if (an || bn) return an && bn && a.u.num == b.u.num;
    if (a.k != b.k) return false;
    switch (a.k) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_BOOL: return a.u.b == b.u.b;
    case JV_STR: return a.u.str.n == b.u.str.n && !memcmp(a.u.str.s, b.u.str.s, a.u.str.n);
    case JV_ARR: return a.u.arr == b.u.arr;
    case JV_OBJ: return a.u.obj == b.u.obj;
    default: return a.u.fn == b.u.fn;
    }
}

static int str_cmp(jstr a, jstr b, bool cs) {
    size_t n = a.n < b.n ? a.n : b.n;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = (unsigned char)a.s[i], y = (unsigned char)b.s[i];
        if (!cs) {
            if (x >= 'A' && x <= 'Z') x += 32;
            if (y >= 'A' && y <= 'Z') y += 32;
        }
        if (x != y) return x < y ? -1 : 1;
    }
    return a.n < b.n ? -1 : a.n > b.n;
}

int jv_compare(jctx *c, const jnode *at, jv a, jv b, bool cs) {
    if (a.k == JV_NONE && b.k == JV_NONE) return 0;
    if (a.k == JV_NONE || b.k == JV_NONE || a.k == JV_UNDEF || b.k == JV_UNDEF) {
        if (a.k == JV_UNDEF && b.k == JV_UNDEF) return 0;
        jfail(c, at, "cannot compare %s with %s", jv_type_name(a), jv_type_name(b));
    }
    bool an = jv_isnum(a) || a.k == JV_BOOL, bn = jv_isnum(b) || b.k == JV_BOOL;
    if (an && bn) {
        double x = num_of(a), y = num_of(b);
        return x < y ? -1 : x > y;
    }
    if (a.k != b.k) jfail(c, at, "cannot compare different types: %s and %s", jv_type_name(a), jv_type_name(b));
    if (a.k != JV_STR) jfail(c, at, "cannot compare values of type %s", jv_type_name(a));
    return str_cmp(a.u.str, b.u.str, cs);
}

/* JavaScript's Number#toString: the shortest decimal that reads back as x. */
void jjs_num(double x, char buf[40]) {
    if (isnan(x)) { strcpy(buf, "NaN"); return; }
    if (isinf(x)) { strcpy(buf, x > 0 ? "Infinity" : "-Infinity"); return; }
    if (x == 0) { strcpy(buf, "0"); return; }
    char digits[24];
    int e, neg;
    const int nd = moerl_shortest_digits(x, digits, &e, &neg), n = e + 1; /* value = 0.digits × 10^n */
    char *o = buf;
    if (neg) *o++ = '-';
    if (nd <= n && n <= 21) {
        memcpy(o, digits, nd), o += nd;
        for (int i = nd; i < n; i++) *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, digits, n), o += n;
        *o++ = '.';
        memcpy(o, digits + n, nd - n), o += nd - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0', *o++ = '.';
        for (int i = 0; i < -n; i++) *o++ = '0';
        memcpy(o, digits, nd), o += nd;
    } else {
        *o++ = digits[0];
        if (nd > 1) *o++ = '.', memcpy(o, digits + 1, nd - 1), o += nd - 1;
        o += sprintf(o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
    *o = 0;
}

static void float_str(double x, char buf[48]) {
    if (x == 0 && signbit(x)) strcpy(buf, "-0.0");
    else if (isfinite(x) && x == floor(x) && fabs(x) < 1e21) {
        jjs_num(x, buf);
        strcat(buf, ".0");
    } else jjs_num(x, buf);
}

static const jjson_opts PRINT_JSON = {.indent = -1, .undef_null = false};

void jv_print(jctx *c, jbuf *b, jv v) {
    char buf[48];
    switch (v.k) {
    case JV_UNDEF: jbuf_puts(b, "undefined", 0); return;
    case JV_NONE: jbuf_puts(b, "null", 0); return;
    case JV_BOOL: jbuf_puts(b, v.u.b ? "true" : "false", 0); return;
    case JV_INT: jjs_num(v.u.num, buf), jbuf_puts(b, buf, 0); return;
    case JV_FLOAT: float_str(v.u.num, buf), jbuf_puts(b, buf, 0); return;
    case JV_STR: jbuf_put_str(b, v.u.str); return;
    case JV_ARR:
    case JV_OBJ: jv_tojson(c, NULL, b, v, &PRINT_JSON, 0); return;
    case JV_FUNC: jfail(c, NULL, "cannot print the function '%s' (call it)", v.u.fn->name ? v.u.fn->name : "?");
    }
}

void jv_jsstr(jctx *c, jbuf *b, jv v) {
    char buf[48];
    switch (v.k) {
    case JV_INT:
    case JV_FLOAT: jjs_num(v.u.num, buf), jbuf_puts(b, buf, 0); return;
    case JV_ARR:
        for (int i = 0; i < v.u.arr->n; i++) {
            if (i) jbuf_put(b, ",", 1, 0);
            jv_print(c, b, v.u.arr->v[i]);
        }
        return;
    case JV_OBJ: jbuf_puts(b, "[object Map]", 0); return;
    default: jv_print(c, b, v);
    }
}

/* JSON.stringify of a string, then (ensure_ascii) every UTF-16 unit ≥ 0x7F as \uXXXX. */
static void jsn_string(jbuf *b, jstr s, bool ascii) {
    jbuf_put(b, "\"", 1, 0);
    for (size_t i = 0; i < s.n;) {
        unsigned char ch = (unsigned char)s.s[i];
        uint8_t m = s.m ? s.m[i] : s.um;
        char esc[16];
        const char *e = NULL;
        switch (ch) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (ch < 0x20) snprintf(esc, sizeof esc, "\\u%04x", ch), e = esc;
        }
        if (e) {
            jbuf_put(b, e, strlen(e), m);
            i++;
            continue;
        }
        size_t l = jutf8_len(ch);
        if (l > s.n - i) l = s.n - i;
        if (ascii && (ch >= 0x7F)) {
            uint32_t cp = ch;
            if (l == 2) cp = ((ch & 0x1Fu) << 6) | (s.s[i + 1] & 0x3F);
            else if (l == 3) cp = ((ch & 0x0Fu) << 12) | ((s.s[i + 1] & 0x3Fu) << 6) | (s.s[i + 2] & 0x3F);
            else if (l == 4) cp = ((ch & 0x07u) << 18) | ((s.s[i + 1] & 0x3Fu) << 12) | ((s.s[i + 2] & 0x3Fu) << 6) | (s.s[i + 3] & 0x3F);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else snprintf(esc, sizeof esc, "\\u%04x", cp);
            jbuf_put(b, esc, strlen(esc), m);
        } else {
            jstr part = {.s = s.s + i, .n = l, .m = s.m ? s.m + i : NULL, .um = s.um};
            jbuf_put_str(b, part);
        }
        i += l;
    }
    jbuf_put(b, "\"", 1, 0);
}

/* localeCompare's order for plain keys: case-insensitive, lower case first on a tie. */
static int key_cmp(const void *x, const void *y) {
    const jstr *a = *(const jstr *const *)x, *b = *(const jstr *const *)y;
    int r = str_cmp(*a, *b, false);
    if (r) return r;
    return -str_cmp(*a, *b, true);
}

static void json_pad(jbuf *b, const jjson_opts *o, int depth) {
    jbuf_put(b, "\n", 1, 0);
    for (int i = 0; i < o->indent * depth; i++) jbuf_put(b, " ", 1, 0);
}

static void jsn_object(jctx *c, const jnode *at, jbuf *b, const jobj *ob, const jjson_opts *o, int depth) {
    int n = ob->n;
    int *ord = ja_alloc(&c->arena, (n + 1) * sizeof *ord); /* arena: an error inside unwinds past here */
    for (int i = 0; i < n; i++) ord[i] = i;
    if (o->sort_keys && n > 1) {
        const jstr **ks = ja_alloc(&c->arena, n * sizeof *ks);
        for (int i = 0; i < n; i++) ks[i] = &ob->keys[i];
        qsort(ks, n, sizeof *ks, key_cmp);
        for (int i = 0; i < n; i++) ord[i] = (int)(ks[i] - ob->keys);
    }
    jbuf_put(b, "{", 1, 0);
    for (int k = 0; k < n; k++) {
        int i = ord[k];
        if (k) jbuf_put(b, o->item_sep, strlen(o->item_sep), 0);
        if (o->indent > 0) json_pad(b, o, depth + 1);
        jsn_string(b, ob->keys[i], o->ensure_ascii);
        jbuf_put(b, o->key_sep, strlen(o->key_sep), 0);
        jv_tojson(c, at, b, ob->vals[i], o, depth + 1);
    }
    if (o->indent > 0 && n) json_pad(b, o, depth);
    jbuf_put(b, "}", 1, 0);
}

void jv_tojson(jctx *c, const jnode *at, jbuf *b, jv v, const jjson_opts *o0, int depth) {
    jjson_opts o = *o0;
    if (!o.item_sep) o.item_sep = o.indent > 0 ? "," : ", ";
    if (!o.key_sep) o.key_sep = ": ";
    char buf[48];
    switch (v.k) {
    case JV_NONE: jbuf_puts(b, "null", 0); return;
    case JV_UNDEF: jbuf_puts(b, o.undef_null ? "null" : "undefined", 0); return;
    case JV_BOOL: jbuf_puts(b, v.u.b ? "true" : "false", 0); return;
    case JV_INT:
    case JV_FLOAT:
        if (isfinite(v.u.num)) jjs_num(v.u.num, buf);
        else strcpy(buf, "null");
        jbuf_puts(b, buf, 0);
        return;
    case JV_STR: jsn_string(b, v.u.str, o.ensure_ascii); return;
    case JV_ARR: {
        jarr *a = v.u.arr;
        if (a->tuple) jfail(c, at, "cannot convert a tuple to JSON or print it (as @huggingface/jinja)");
        jbuf_put(b, "[", 1, 0);
        for (int i = 0; i < a->n; i++) {
            if (i) jbuf_put(b, o.item_sep, strlen(o.item_sep), 0);
            if (o.indent > 0) json_pad(b, &o, depth + 1);
            jv_tojson(c, at, b, a->v[i], &o, depth + 1);
        }
        if (o.indent > 0 && a->n) json_pad(b, &o, depth);
        jbuf_put(b, "]", 1, 0);
        return;
    }
    case JV_OBJ: jsn_object(c, at, b, v.u.obj, &o, depth); return;
    case JV_FUNC: jfail(c, at, "cannot convert a function to JSON");
    }
}
