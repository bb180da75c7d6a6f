/* moerl — Jinja: evaluation of statements and expressions, and the render entry point.
 * Scoping as @huggingface/jinja: `set` binds in the current scope; a for loop and a macro call
 * open a scope (a macro's parent scope is its caller's, a call block's caller() the block's);
 * break/continue drop the output of the unfinished iteration, and a loop whose iterations all
 * ended in continue also runs its else block. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "data/jinja_internal.h"

#define MAX_DEPTH 100

_Noreturn void jfail(jctx *c, const jnode *at, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) moerl_errorf("%s:%d: %s", c->t->name, at->line, msg);
    else moerl_errorf("%s: %s", c->t->name, msg);
    longjmp(c->jmp, 1);
}

jscope *jscope_new(jctx *c, jscope *parent) {
    jscope *s = ja_alloc(&c->arena, sizeof *s);
    s->parent = parent;
    return s;
}

void jscope_set(jctx *c, jscope *sc, int sym, jv v) {
    for (int i = 0; i < sc->n; i++)
        if (sc->syms[i] == sym) {
            sc->vals[i] = v;
            return;
        }
    if (sc->n == sc->cap) {
        int cap = sc->cap ? 2 * sc->cap : 8;
        int *s = ja_alloc(&c->arena, cap * sizeof *s);
        jv *v2 = ja_alloc(&c->arena, cap * sizeof *v2);
        if (sc->n) memcpy(s, sc->syms, sc->n * sizeof *s), memcpy(v2, sc->vals, sc->n * sizeof *v2);
        sc->syms = s, sc->vals = v2, sc->cap = cap;
    }
    sc->syms[sc->n] = sym;
    sc->vals[sc->n++] = v;
}

jv jscope_get(const jscope *sc, int sym) {
    for (; sc; sc = sc->parent)
        for (int i = 0; i < sc->n; i++)
            if (sc->syms[i] == sym) return sc->vals[i];
    return jv_undef();
}

/* Temporary text buffers, reused and freed when the render ends (also after an error). */
typedef struct jbufpool {
    jbuf **b;
    int n, cap;
} jbufpool;

jbuf *jtmp_get(jctx *c) {
    jbufpool *p = c->pool;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 8;
        p->b = xrealloc(p->b, p->cap * sizeof *p->b);
        for (int i = p->n; i < p->cap; i++) p->b[i] = xcalloc(1, sizeof(jbuf));
    }
    jbuf *b = p->b[p->n++];
    b->len = 0;
    return b;
}
void jtmp_put(jctx *c) { c->pool->n--; }

/* Render body into a string value (set blocks, macros, filter blocks). */
static jstr render_to_str(jctx *c, jnode *const *body, int n, jscope *sc) {
    jbuf *b = jtmp_get(c);
    jexec_block(c, body, n, sc, b);
    jstr s = jbuf_take(c, b);
    jtmp_put(c);
    return s;
}

static jv concat(jctx *c, jv a, jv b) {
    jbuf *t = jtmp_get(c);
    jv_jsstr(c, t, a);
    jv_jsstr(c, t, b);
    jv r = jv_str(jbuf_take(c, t));
    jtmp_put(c);
    return r;
}

static bool str_contains(jstr h, jstr n) {
    if (!n.n) return true;
    if (n.n > h.n) return false;
    return memmem(h.s, h.n, n.s, n.n) != NULL;
}

static jv arith(jctx *c, const jnode *e, jv l, jv r) {
    double a = l.u.num, b = r.u.num;
    bool fl = l.k == JV_FLOAT || r.k == JV_FLOAT;
    double res;
    switch (e->op) {
    case OP_ADD: res = a + b; break;
    case OP_SUB: res = a - b; break;
    case OP_MUL: res = a * b; break;
    case OP_DIV: return jv_float(a / b);
    case OP_FLOORDIV: res = floor(a / b); break;
    case OP_MOD: res = fmod(a, b); break;
    case OP_LT: return jv_bool(a < b);
    case OP_GT: return jv_bool(a > b);
    case OP_LE: return jv_bool(a <= b);
    case OP_GE: return jv_bool(a >= b);
    default: return jv_undef();
    }
    return fl ? jv_float(res) : jv_int(res);
}

static const char *op_name(int op) {
    static const char *n[] = {"?", "+", "-", "~", "*", "/", "//", "%", "**", "==", "!=", "<", ">", "<=", ">=",
                              "and", "or", "not", "in", "not in", "-", "+"};
    return op >= 0 && op < (int)(sizeof n / sizeof n[0]) ? n[op] : "?";
}

static jv eval_binary2(jctx *c, const jnode *e, jv l, jv r);

static jv eval_binary(jctx *c, const jnode *e, jscope *sc) {
    jv l = jeval(c, e->a, sc);
    if (e->op == OP_AND) return jv_truthy(l) ? jeval(c, e->b, sc) : l;
    if (e->op == OP_OR) return jv_truthy(l) ? l : jeval(c, e->b, sc);
    jv r = jeval(c, e->b, sc);
    if (e->op == OP_EQ) return jv_bool(jv_loose_eq(c, l, r));
    if (e->op == OP_NE) return jv_bool(!jv_loose_eq(c, l, r));
    if (l.k == JV_UNDEF || r.k == JV_UNDEF) {
        if (r.k == JV_UNDEF && (e->op == OP_IN || e->op == OP_NOTIN)) return jv_bool(e->op == OP_NOTIN);
        jfail(c, e, "cannot perform operation %s on undefined values", op_name(e->op));
    }
    if (l.k == JV_NONE || r.k == JV_NONE) jfail(c, e, "cannot perform operation %s on none values", op_name(e->op));
    if (e->op == OP_CONCAT) return concat(c, l, r);
    return eval_binary2(c, e, l, r);
}

static jv eval_binary2(jctx *c, const jnode *e, jv l, jv r) {
    bool ln = jv_isnum(l) || l.k == JV_BOOL, rn = jv_isnum(r) || r.k == JV_BOOL;
    if (e->op == OP_POW && ln && rn) {
        double a = l.k == JV_BOOL ? l.u.b : l.u.num, b = r.k == JV_BOOL ? r.u.b : r.u.num;
        if (a == 0 && b < 0) jfail(c, e, "0.0 cannot be raised to a negative power");
        double res = pow(a, b);
        if (!isfinite(res)) jfail(c, e, "exponentiation result is not a finite real number");
        return (l.k == JV_FLOAT || r.k == JV_FLOAT || b < 0) ? jv_float(res) : jv_int(res);
    }
    if (jv_isnum(l) && jv_isnum(r)) {
        jv v = arith(c, e, l, r);
        if (v.k != JV_UNDEF) return v;
    } else if (l.k == JV_ARR && r.k == JV_ARR && e->op == OP_ADD) {
        jarr *a = jarr_new(c, l.u.arr->n + r.u.arr->n);
        for (int i = 0; i < l.u.arr->n; i++) jarr_push(c, a, l.u.arr->v[i]);
        for (int i = 0; i < r.u.arr->n; i++) jarr_push(c, a, r.u.arr->v[i]);
        return jv_arr(a);
    } else if (l.k == JV_ARR && r.k == JV_ARR) {
        /* only + between two lists (@huggingface/jinja: a list `in` a list is an error) */
    } else if (r.k == JV_ARR && (e->op == OP_IN || e->op == OP_NOTIN)) {
        bool m = false;
        for (int i = 0; i < r.u.arr->n && !m; i++) m = jv_strict_eq(r.u.arr->v[i], l);
        return jv_bool(m == (e->op == OP_IN));
    }
    if ((l.k == JV_STR || r.k == JV_STR) && e->op == OP_ADD) return concat(c, l, r);
    if (l.k == JV_STR && r.k == JV_STR) {
        if (e->op == OP_IN || e->op == OP_NOTIN) return jv_bool(str_contains(r.u.str, l.u.str) == (e->op == OP_IN));
        if (e->op >= OP_LT && e->op <= OP_GE) { /* Jinja2: strings compare by code point */
            int k = jv_compare(c, e, l, r, true);
            return jv_bool(e->op == OP_LT ? k < 0 : e->op == OP_GT ? k > 0 : e->op == OP_LE ? k <= 0 : k >= 0);
        }
        if (e->op == OP_MUL) jfail(c, e, "unknown operator \"*\" between StringValue and StringValue");
    }
    if (l.k == JV_STR && r.k == JV_OBJ && r.u.obj->kind != OBJ_NAMESPACE && (e->op == OP_IN || e->op == OP_NOTIN))
        return jv_bool((jobj_get(r.u.obj, l.u.str.s, l.u.str.n) != NULL) == (e->op == OP_IN));
    jfail(c, e, "unknown operator \"%s\" between %s and %s", op_name(e->op), jv_type_name(l), jv_type_name(r));
}

static jv eval_unary(jctx *c, const jnode *e, jscope *sc) {
    jv v = jeval(c, e->a, sc);
    if (e->op == OP_NOT) return jv_bool(!jv_truthy(v));
    double s = e->op == OP_NEG ? -1 : 1;
    if (v.k == JV_BOOL) return jv_int(s * v.u.b);
    if (v.k == JV_INT) return jv_int(s * v.u.num);
    if (v.k == JV_FLOAT) return jv_float(s * v.u.num);
    jfail(c, e, "unknown operator \"%s\" for %s", e->op == OP_NEG ? "-" : "+", jv_type_name(v));
}

/* Python slice bounds over n items (as @huggingface/jinja's slice()). */
static void slice_bounds(long n, jv st, jv sp, long step, long *a, long *b) {
    if (step > 0) {
        long s = st.k == JV_UNDEF ? 0 : (long)st.u.num, e = sp.k == JV_UNDEF ? n : (long)sp.u.num;
        *a = s < 0 ? (n + s > 0 ? n + s : 0) : (s < n ? s : n);
        *b = e < 0 ? (n + e > 0 ? n + e : 0) : (e < n ? e : n);
    } else {
        long s = st.k == JV_UNDEF ? n - 1 : (long)st.u.num, e = sp.k == JV_UNDEF ? -1 : (long)sp.u.num;
        *a = s < 0 ? (n + s > -1 ? n + s : -1) : (s < n - 1 ? s : n - 1);
        *b = e < -1 ? (n + e > -1 ? n + e : -1) : (e < n - 1 ? e : n - 1);
    }
}

static jv eval_slice(jctx *c, const jnode *e, jv obj, jscope *sc) {
    if (obj.k != JV_ARR && obj.k != JV_STR) jfail(c, e, "slice object must be an array or string, got %s", jv_type_name(obj));
    jv st = jeval(c, e->a, sc), sp = jeval(c, e->b, sc), stp = jeval(c, e->c, sc);
    if ((st.k != JV_INT && st.k != JV_UNDEF) || (sp.k != JV_INT && sp.k != JV_UNDEF) || (stp.k != JV_INT && stp.k != JV_UNDEF))
        jfail(c, e, "slice start, stop and step must be integers or left out");
    long step = stp.k == JV_UNDEF ? 1 : (long)stp.u.num;
    if (step == 0) jfail(c, e, "slice step cannot be zero");
    if (obj.k == JV_ARR) {
        long a, b;
        slice_bounds(obj.u.arr->n, st, sp, step, &a, &b);
        jarr *r = jarr_new(c, 4);
        for (long i = a; step > 0 ? i < b : i > b; i += step) jarr_push(c, r, obj.u.arr->v[i]);
        return jv_arr(r);
    }
    jstr s = obj.u.str; /* by code point, as Array.from(string) */
    long ncp = 0;
    for (size_t i = 0; i < s.n; i += jcp(s.s, i, s.n)) ncp++;
    size_t *off = ja_alloc(&c->arena, (ncp + 1) * sizeof *off);
    long k = 0;
    for (size_t i = 0; i < s.n; i += jcp(s.s, i, s.n)) off[k++] = i;
    off[ncp] = s.n;
    long a, b;
    slice_bounds(ncp, st, sp, step, &a, &b);
    jbuf *t = jtmp_get(c);
    for (long i = a; step > 0 ? i < b : i > b; i += step) {
        jstr part = {.s = s.s + off[i], .n = off[i + 1] - off[i], .m = s.m ? s.m + off[i] : NULL, .um = s.um};
        jbuf_put_str(t, part);
    }
    jv r = jv_str(jbuf_take(c, t));
    jtmp_put(c);
    return r;
}

/* s[i] as JavaScript's String#at: i counts UTF-16 units (negative from the end). A unit inside
 * a character outside the BMP is half a surrogate pair, which UTF-8 cannot hold: U+FFFD, as
 * the reference's text reads once encoded. */
static jv str_at(jctx *c, jstr s, long i) {
    long units = (long)jutf16_len(s.s, s.n);
    if (i < 0) i += units;
    if (i < 0 || i >= units) return jv_undef();
    size_t k = 0;
    long u = 0;
    for (;;) {
        size_t l = jcp(s.s, k, s.n);
        long w = l == 4 ? 2 : 1;
        if (i < u + w) {
            if (w == 2) return jv_strn(c, "\xEF\xBF\xBD", 3, s.m ? s.m[k] : s.um);
            jstr part = {.s = s.s + k, .n = l, .m = s.m ? s.m + k : NULL, .um = s.um};
            return jv_str(part);
        }
        u += w;
        k += l;
    }
}

static jv member_of(jctx *c, const jnode *e, jv obj, jscope *sc);
static jv eval_member(jctx *c, const jnode *e, jscope *sc) { return member_of(c, e, jeval(c, e->a, sc), sc); }

/* obj.name / obj[index] / obj[a:b:c] of the E_MEMBER node e. */
static jv member_of(jctx *c, const jnode *e, jv obj, jscope *sc) {
    jv prop;
    if (e->op && e->b->kind == E_SLICE) return eval_slice(c, e->b, obj, sc);
    if (e->op) prop = jeval(c, e->b, sc);
    else {
        jstr s = {.s = e->s, .n = e->n, .um = 1};
        prop = jv_str(s);
    }
    if (obj.k == JV_OBJ) {
        if (prop.k != JV_STR) jfail(c, e, "cannot access a property with a non-string key: got %s", jv_type_name(prop));
        jv *v = jobj_get(obj.u.obj, prop.u.str.s, prop.u.str.n);
        if (v) return *v;
        if (obj.u.obj->kind == OBJ_NAMESPACE) return jv_undef();
        return jmember_builtin(c, e, obj, prop.u.str.s, prop.u.str.n);
    }
    if (obj.k == JV_ARR || obj.k == JV_STR) {
        if (prop.k == JV_INT) {
            long i = (long)prop.u.num;
            if (obj.k == JV_STR) return str_at(c, obj.u.str, i);
            if (i < 0) i += obj.u.arr->n;
            return i >= 0 && i < obj.u.arr->n ? obj.u.arr->v[i] : jv_undef();
        }
        if (prop.k == JV_STR) return jmember_builtin(c, e, obj, prop.u.str.s, prop.u.str.n);
        jfail(c, e, "cannot access a property with a non-string/non-number key: got %s", jv_type_name(prop));
    }
    if (prop.k != JV_STR) jfail(c, e, "cannot access a property with a non-string key: got %s", jv_type_name(prop));
    return jmember_builtin(c, e, obj, prop.u.str.s, prop.u.str.n);
}

/* Positional arguments (with *spread) into pos, keyword arguments (with **spread) into *kw
 * (NULL when none). */
void jeval_args(jctx *c, jnode *const *args, int n, jscope *sc, jarr *pos, jobj **kw) {
    *kw = NULL;
    for (int i = 0; i < n; i++) {
        const jnode *a = args[i];
        if (a->kind == E_SPREAD) {
            jv v = jeval(c, a->a, sc);
            if (v.k != JV_ARR) jfail(c, a, "cannot unpack non-iterable type: %s", jv_type_name(v));
            for (int k = 0; k < v.u.arr->n; k++) jarr_push(c, pos, v.u.arr->v[k]);
        } else if (a->kind != E_KWARG && a->kind != E_KWSPREAD) jarr_push(c, pos, jeval(c, a, sc));
    }
    for (int i = 0; i < n; i++) {
        const jnode *a = args[i];
        if (a->kind != E_KWARG && a->kind != E_KWSPREAD) continue;
        if (!*kw) *kw = jobj_new(c, OBJ_KWARGS);
        if (a->kind == E_KWARG) {
            if (jobj_get(*kw, a->s, a->n)) jfail(c, a, "got multiple values for keyword argument '%s'", a->s);
            jstr k = {.s = a->s, .n = a->n, .um = 1};
            jobj_set(c, *kw, k, jeval(c, a->a, sc));
        } else {
            jv v = jeval(c, a->a, sc);
            if (v.k != JV_OBJ) jfail(c, a, "argument after ** must be a mapping, not %s", jv_type_name(v));
            for (int k = 0; k < v.u.obj->n; k++) {
                if (jobj_get(*kw, v.u.obj->keys[k].s, v.u.obj->keys[k].n))
                    jfail(c, a, "got multiple values for keyword argument '%.*s'", (int)v.u.obj->keys[k].n, v.u.obj->keys[k].s);
                jobj_set(c, *kw, v.u.obj->keys[k], v.u.obj->vals[k]);
            }
        }
    }
}

static bool uses_name(const jnode *e, const char *name) {
    if (!e) return false;
    if (e->kind == E_NAME && !strcmp(e->s, name)) return true;
    if (uses_name(e->a, name) || uses_name(e->b, name) || uses_name(e->c, name)) return true;
    for (int i = 0; i < e->nlist; i++)
        if (uses_name(e->list[i], name)) return true;
    for (int i = 0; i < e->nlist2; i++)
        if (uses_name(e->list2[i], name)) return true;
    return false;
}

static void bind_macro_args(jctx *c, const jnode *at, const jnode *m, const char *disp, jv *args, int nargs, jobj *kw, jscope *sc) {
    int nkw = kw ? kw->n : 0;
    bool *used = ja_alloc(&c->arena, nkw + 1); /* keyword arguments bound to a parameter */
    const jnode **pend = NULL;
    int npend = 0;
    if (m->nlist2) pend = ja_alloc(&c->arena, m->nlist2 * sizeof *pend);
    for (int i = 0; i < m->nlist2; i++) {
        const jnode *p = m->list2[i];
        jv v = jv_undef();
        bool have = i < nargs;
        if (have) v = args[i];
        else
            for (int k = 0; k < nkw && !have; k++)
                if (!used[k] && kw->keys[k].n == p->n && !memcmp(kw->keys[k].s, p->s, p->n)) v = kw->vals[k], have = used[k] = true;
        if (!have && p->kind == E_KWARG) pend[npend++] = p;
        jscope_set(c, sc, p->sym, v);
    }
    jobj *left = jobj_new(c, OBJ_DICT); /* the keyword arguments no parameter took */
    for (int k = 0; k < nkw; k++)
        if (!used[k]) jobj_set(c, left, kw->keys[k], kw->vals[k]);
    bool body_kwargs = false, body_varargs = false;
    for (int i = 0; i < m->nlist; i++) body_kwargs |= uses_name(m->list[i], "kwargs"), body_varargs |= uses_name(m->list[i], "varargs");
    if (body_kwargs) jscope_set(c, sc, jsym(c->t, "kwargs", 6), jv_obj(left));
    else if (left->n) jfail(c, at, "macro %s takes no keyword argument '%.*s'", disp, (int)left->keys[0].n, left->keys[0].s);
    if (body_varargs) {
        jarr *va = jarr_new(c, 4);
        for (int i = m->nlist2; i < nargs; i++) jarr_push(c, va, args[i]);
        jscope_set(c, sc, jsym(c->t, "varargs", 7), jv_arr(va));
    } else if (nargs > m->nlist2) jfail(c, at, "macro %s takes not more than %d argument(s)", disp, m->nlist2);
    for (int i = 0; i < npend; i++) jscope_set(c, sc, pend[i]->sym, jeval(c, pend[i]->a, sc));
}

jv jcall(jctx *c, const jnode *at, jv fn, jv *args, int nargs, jobj *kw, jscope *sc) {
    if (fn.k != JV_FUNC) jfail(c, at, "cannot call something that is not a function: got %s", jv_type_name(fn));
    jfunc *f = fn.u.fn;
    if (f->fn) return f->fn(c, at, f->self, args, nargs, kw);
    if (++c->depth > MAX_DEPTH) jfail(c, at, "macro calls nested deeper than %d", MAX_DEPTH);
    jscope *ms = jscope_new(c, f->is_caller ? f->closure : sc);
    char disp[128];
    snprintf(disp, sizeof disp, f->is_caller ? "None" : "'%s'", f->name);
    bind_macro_args(c, at, f->macro, disp, args, nargs, kw, ms);
    jstr s = render_to_str(c, f->macro->list, f->macro->nlist, ms);
    if (c->brk) jfail(c, at, "break or continue outside a for loop");
    c->depth--;
    return jv_str(s);
}

static jv eval_call(jctx *c, const jnode *e, jscope *sc) {
    jarr *pos = jarr_new(c, e->nlist + 1);
    jobj *kw;
    jeval_args(c, e->list, e->nlist, sc, pos, &kw);
    const jnode *f = e->a;
    if (f->kind == E_MEMBER && !f->op) { /* obj.method(...): name the method when there is none */
        jv obj = jeval(c, f->a, sc);
        jv fn = member_of(c, f, obj, sc);
        if (fn.k != JV_FUNC)
            jfail(c, e, "cannot call '%s' of %s: not a method (unknown or unsupported), got %s", f->s, jv_type_name(obj), jv_type_name(fn));
        return jcall(c, e, fn, pos->v, pos->n, kw, sc);
    }
    jv fn = jeval(c, f, sc);
    if (fn.k != JV_FUNC && f->kind == E_NAME)
        jfail(c, e, "cannot call '%s': not a function or macro (unknown or unsupported), got %s", f->s, jv_type_name(fn));
    return jcall(c, e, fn, pos->v, pos->n, kw, sc);
}

static jv eval_test(jctx *c, const jnode *e, jscope *sc) {
    jv v = jeval(c, e->a, sc);
    jarr *pos = jarr_new(c, e->nlist + 1);
    jobj *kw;
    jeval_args(c, e->list, e->nlist, sc, pos, &kw);
    bool r = jtest(c, e, v, e->s, pos->v, pos->n);
    return jv_bool(e->op ? !r : r);
}

static jv eval_dict(jctx *c, const jnode *e, jscope *sc) {
    jobj *o = jobj_new(c, OBJ_DICT);
    for (int i = 0; i < e->nlist; i++) {
        jv k = jeval(c, e->list[i], sc);
        if (k.k != JV_STR) jfail(c, e->list[i], "dict keys must be strings: got %s", jv_type_name(k));
        jobj_set(c, o, k.u.str, jeval(c, e->list2[i], sc));
    }
    return jv_obj(o);
}

jv jeval(jctx *c, const jnode *e, jscope *sc) {
    if (!e) return jv_undef();
    switch (e->kind) {
    case E_STR: {
        jstr s = {.s = e->s, .n = e->n, .um = 1};
        return jv_str(s);
    }
    case E_INT: return jv_int(e->num);
    case E_FLOAT: return jv_float(e->num);
    case E_NAME: return jscope_get(sc, e->sym);
    case E_ARRAY:
    case E_TUPLE: {
        jarr *a = jarr_new(c, e->nlist);
        a->tuple = e->kind == E_TUPLE;
        for (int i = 0; i < e->nlist; i++) jarr_push(c, a, jeval(c, e->list[i], sc));
        return jv_arr(a);
    }
    case E_DICT: return eval_dict(c, e, sc);
    case E_MEMBER: return eval_member(c, e, sc);
    case E_CALL: return eval_call(c, e, sc);
    case E_UNARY: return eval_unary(c, e, sc);
    case E_BINARY: return eval_binary(c, e, sc);
    case E_FILTER: return jfilter(c, e, jeval(c, e->a, sc), e, sc);
    case E_TEST: return eval_test(c, e, sc);
    case E_SELECT: return jv_truthy(jeval(c, e->b, sc)) ? jeval(c, e->a, sc) : jv_undef();
    case E_TERNARY: return jv_truthy(jeval(c, e->a, sc)) ? jeval(c, e->b, sc) : jeval(c, e->c, sc);
    default: jfail(c, e, "this construct is not an expression");
    }
}

/* ---- statements ----------------------------------------------------------------------- */
static void assign(jctx *c, const jnode *target, jv v, jscope *sc, const char *what) {
    if (target->kind == E_NAME) {
        jscope_set(c, sc, target->sym, v);
        return;
    }
    if (target->kind == E_TUPLE) {
        if (v.k != JV_ARR) jfail(c, target, "cannot unpack non-iterable type %s in %s", jv_type_name(v), what);
        if (v.u.arr->n != target->nlist)
            jfail(c, target, "too %s items to unpack in %s (%d names, %d values)", target->nlist > v.u.arr->n ? "few" : "many", what,
                  target->nlist, v.u.arr->n);
        for (int i = 0; i < target->nlist; i++) {
            if (target->list[i]->kind != E_NAME) jfail(c, target, "cannot unpack to a non-name in %s", what);
            jscope_set(c, sc, target->list[i]->sym, v.u.arr->v[i]);
        }
        return;
    }
    if (target->kind == E_MEMBER && !target->op) {
        jv o = jeval(c, target->a, sc);
        if (o.k != JV_OBJ || o.u.obj->kind != OBJ_NAMESPACE)
            jfail(c, target, "cannot assign attribute '%s' on a non-namespace object (%s)", target->s, jv_type_name(o));
        jstr k = {.s = target->s, .n = target->n, .um = 1};
        jobj_set(c, o.u.obj, k, v);
        return;
    }
    jfail(c, target, "invalid target of %s", what);
}

static void exec_set(jctx *c, const jnode *n, jscope *sc) {
    jv v = n->b ? jeval(c, n->b, sc) : jv_str(render_to_str(c, n->list, n->nlist, sc));
    assign(c, n->a, v, sc, "set");
}

static jv loop_obj(jctx *c, jv *items, int i, int n) {
    jobj *o = jobj_new(c, OBJ_DICT);
    static const char *k[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"};
    jv v[9] = {jv_int(i + 1), jv_int(i), jv_int(n - i), jv_int(n - i - 1), jv_bool(i == 0), jv_bool(i == n - 1), jv_int(n),
               i > 0 ? items[i - 1] : jv_undef(), i < n - 1 ? items[i + 1] : jv_undef()};
    o->keys = ja_alloc(&c->arena, 9 * sizeof(jstr));
    o->vals = ja_alloc(&c->arena, 9 * sizeof(jv));
    o->cap = 9;
    for (int j = 0; j < 9; j++) {
        jstr ks = {.s = k[j], .n = strlen(k[j]), .um = 1};
        o->keys[j] = ks, o->vals[j] = v[j];
    }
    o->n = 9;
    o->is_loop = true;
    o->loop_index = i;
    return jv_obj(o);
}

static jarr *for_items(jctx *c, const jnode *n, jscope *scope) {
    jv it = jeval(c, n->b, scope);
    if (it.k == JV_OBJ && it.u.obj->kind != OBJ_NAMESPACE) {
        jarr *a = jarr_new(c, it.u.obj->n);
        for (int i = 0; i < it.u.obj->n; i++) jarr_push(c, a, jv_str(it.u.obj->keys[i]));
        return a;
    }
    if (it.k == JV_STR) { /* Jinja2 iterates characters (@huggingface/jinja refuses) */
        jarr *a = jarr_new(c, 4);
        for (size_t i = 0; i < it.u.str.n;) {
            size_t l = jcp(it.u.str.s, i, it.u.str.n);
            jstr part = {.s = it.u.str.s + i, .n = l, .m = it.u.str.m ? it.u.str.m + i : NULL, .um = it.u.str.um};
            jarr_push(c, a, jv_str(part));
            i += l;
        }
        return a;
    }
    if (it.k != JV_ARR) jfail(c, n->b, "expected an iterable or object in the for loop: got %s", jv_type_name(it));
    if (!n->c) return it.u.arr;
    jarr *a = jarr_new(c, it.u.arr->n);
    for (int i = 0; i < it.u.arr->n; i++) {
        jscope *ls = jscope_new(c, scope);
        assign(c, n->a, it.u.arr->v[i], ls, "the for loop");
        if (jv_truthy(jeval(c, n->c, ls))) jarr_push(c, a, it.u.arr->v[i]);
    }
    return a;
}

static void exec_for(jctx *c, const jnode *n, jscope *sc, jbuf *out) {
    jscope *scope = jscope_new(c, sc);
    jarr *items = for_items(c, n, scope);
    int loop_sym = jsym(c->t, "loop", 4);
    bool none = true;
    for (int i = 0; i < items->n; i++) {
        jscope_set(c, scope, loop_sym, loop_obj(c, items->v, i, items->n));
        assign(c, n->a, items->v[i], scope, "the for loop");
        size_t mark = out->len;
        jexec_block(c, n->list, n->nlist, scope, out);
        if (c->brk) {
            int b = c->brk;
            c->brk = 0;
            out->len = mark;
            if (out->text) out->text[mark] = 0;
            if (b == 1) break;
            continue;
        }
        none = false;
    }
    if (none) jexec_block(c, n->list2, n->nlist2, scope, out);
}

static void exec_callblock(jctx *c, const jnode *n, jscope *sc, jbuf *out) {
    jfunc *caller = ja_alloc(&c->arena, sizeof *caller);
    caller->name = "caller", caller->macro = n, caller->closure = sc, caller->is_caller = true;
    jarr *pos = jarr_new(c, n->a->nlist + 1);
    jobj *kw;
    jeval_args(c, n->a->list, n->a->nlist, sc, pos, &kw);
    jv fn = jeval(c, n->a->a, sc);
    jscope *env = jscope_new(c, sc);
    jv cv = {.k = JV_FUNC};
    cv.u.fn = caller;
    jscope_set(c, env, jsym(c->t, "caller", 6), cv);
    jv r = jcall(c, n, fn, pos->v, pos->n, kw, env);
    if (r.k != JV_NONE && r.k != JV_UNDEF) jv_print(c, out, r);
}

static void exec_stmt(jctx *c, const jnode *n, jscope *sc, jbuf *out) {
    switch (n->kind) {
    case N_TEXT: jbuf_put(out, n->s, n->n, 1); return;
    case N_COMMENT: return;
    case N_IF:
        if (jv_truthy(jeval(c, n->a, sc))) jexec_block(c, n->list, n->nlist, sc, out);
        else jexec_block(c, n->list2, n->nlist2, sc, out);
        return;
    case N_FOR: exec_for(c, n, sc, out); return;
    case N_SET: exec_set(c, n, sc); return;
    case N_MACRO: {
        jfunc *f = ja_alloc(&c->arena, sizeof *f);
        f->name = n->s, f->macro = n;
        jv v = {.k = JV_FUNC};
        v.u.fn = f;
        jscope_set(c, sc, n->sym, v);
        return;
    }
    case N_CALLBLOCK: exec_callblock(c, n, sc, out); return;
    case N_FILTERBLOCK: {
        jv body = jv_str(render_to_str(c, n->list, n->nlist, sc));
        jv r = jfilter(c, n->b, body, n->b, sc);
        if (r.k != JV_NONE && r.k != JV_UNDEF) jv_print(c, out, r);
        return;
    }
    case N_BREAK: c->brk = 1; return;
    case N_CONTINUE: c->brk = 2; return;
    default: {
        jv v = jeval(c, n, sc);
        if (v.k != JV_NONE && v.k != JV_UNDEF) jv_print(c, out, v);
    }
    }
}

void jexec_block(jctx *c, jnode *const *body, int n, jscope *sc, jbuf *out) {
    if (++c->depth > MAX_DEPTH) jfail(c, n ? body[0] : NULL, "template nested deeper than %d", MAX_DEPTH);
    for (int i = 0; i < n && !c->brk; i++) exec_stmt(c, body[i], sc, out);
    c->depth--;
}

static bool named(const char *const *names, const char *k) {
    for (int i = 0; names && names[i]; i++)
        if (!strcmp(names[i], k)) return true;
    return false;
}

int jinja_render(const jinja_tpl *t, const json_t *vars, const char *const *template_vars, chat_render *out) {
    if (vars && !json_is_object(vars)) return moerl_errorf("%s: the variables must be a JSON object", t->name);
    jctx *c = xcalloc(1, sizeof *c); /* on the heap: what changes after setjmp is not a local */
    c->pool = xcalloc(1, sizeof *c->pool);
    c->t = t;
    volatile int rc = MOERL_OK;
    if (setjmp(c->jmp)) {
        rc = MOERL_ERR;
    } else {
        jscope *g = jscope_new(c, NULL);
        c->globals = g;
        jglobals_init(c, g);
        const char *key;
        json_t *val;
        if (vars) json_object_foreach((json_t *)vars, key, val) {
            for (int s = 0; s < t->nsyms; s++) {
                if (strcmp(t->syms[s], key)) continue;
                for (int i = 0; i < g->n; i++)
                    if (g->syms[i] == s) jfail(c, NULL, "variable already declared: %s (a built-in global)", key);
                uint8_t m = json_is_string(val) && named(template_vars, key);
                jscope_set(c, g, s, jv_from_json(c, val, m));
            }
        }
        jscope *top = jscope_new(c, g);
        jexec_block(c, t->body, t->nbody, top, out);
        if (c->brk) jfail(c, NULL, "break or continue outside a for loop");
        jbuf_put(out, "", 0, 0); /* out->text is a string even when nothing was rendered */
    }
    for (int i = 0; i < c->pool->cap; i++) {
        chat_render_free(c->pool->b[i]);
        free(c->pool->b[i]);
    }
    free(c->pool->b);
    free(c->pool);
    ja_free(&c->arena);
    free(c);
    return rc;
}
