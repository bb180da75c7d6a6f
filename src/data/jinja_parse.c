/* moerl — Jinja: the parser (tokens → jnode tree), with @huggingface/jinja's grammar:
 *   expr    := or ("if" or ("else" expr)?)?       (without else: a select, undefined when false)
 *   or      := and ("or" and)*      and := not ("and" not)*      not := "not" not | cmp
 *   cmp     := add (("in" | "not in" | == != < > <= >=) add)*
 *   add     := mul ((+ | - | ~) mul)*   mul := pow ((* / // %) pow)*   pow := test ("**" test)*
 *   test    := filter ("is" "not"? NAME args?)*   filter := unary ("|" NAME ("(" args ")")?)*
 *   unary   := (+|-) unary | primary (. NAME | [index or slice] | (args))*
 * Node fields per kind: E_MEMBER a=object b=index (computed) or s=name; E_SLICE a,b,c = start,
 * stop, step (NULL when left out); E_CALL a=callee list=args; E_BINARY a,b; E_UNARY a;
 * E_FILTER a=operand s=name list=args (op=1 when called with parentheses); E_TEST a=operand
 * s=name op=negate list=args; E_SELECT a=value b=condition; E_TERNARY a=cond b=then c=else;
 * E_DICT list=keys list2=values; E_KWARG sym/s=key a=value; N_IF a=test list=body list2=else;
 * N_FOR a=target b=iterable c=loop filter list=body list2=else; N_SET a=target b=value
 * (NULL: block set, list=body); N_MACRO s=name sym list2=params list=body; N_CALLBLOCK a=call
 * list2=caller params list=body; N_FILTERBLOCK b=filter (an E_FILTER without operand) list=body.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/jinja_internal.h"

typedef struct {
    jinja_tpl *t;
    jtok *tk;
    int n, i;
    int depth; /* nesting of expressions and blocks, bounded so that no input overflows the stack */
    jmp_buf jmp;
} parser;

#define MAX_NEST 100

static _Noreturn void perr(parser *P, const jtok *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static _Noreturn void perr(parser *P, const jtok *at, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    moerl_errorf("%s:%d: %s", P->t->name, at->line, msg);
    longjmp(P->jmp, 1);
}

int jinja_sym(jinja_tpl *t, const char *s, size_t n) {
    for (int i = 0; i < t->nsyms; i++)
        if (strlen(t->syms[i]) == n && !memcmp(t->syms[i], s, n)) return i;
    if (t->nsyms == t->capsyms) {
        t->capsyms = t->capsyms ? 2 * t->capsyms : 64;
        t->syms = xrealloc(t->syms, t->capsyms * sizeof *t->syms);
    }
    t->syms[t->nsyms] = ja_strdup(&t->arena, s, n);
    return t->nsyms++;
}

int jsym(const jinja_tpl *t, const char *s, size_t n) {
    for (int i = 0; i < t->nsyms; i++)
        if (strlen(t->syms[i]) == n && !memcmp(t->syms[i], s, n)) return i;
    MOERL_ASSERT(!"name not interned at parse time");
    return -1;
}

static jtok *cur(parser *P) { return &P->tk[P->i]; }
static bool is(parser *P, jtok_type ty) { return cur(P)->type == ty; }
static bool is_word(parser *P, int off, const char *w) {
    if (P->i + off >= P->n) return false;
    jtok *t = &P->tk[P->i + off];
    return t->type == TK_IDENT && !strcmp(t->s, w);
}
static const char *tok_desc(jtok_type t) {
    static const char *names[] = {"text", "number", "string", "name", "'='", "'('", "')'", "'{%'", "'%}'",
                                  "'{{'", "'}}'", "'['", "']'", "'{'", "'}'", "','", "'.'", "':'", "'|'",
                                  "operator", "operator", "'**'", "comparison", "sign", "comment", "end of template"};
    return names[t];
}
static jtok *expect(parser *P, jtok_type ty, const char *what) {
    jtok *t = cur(P);
    if (t->type != ty) perr(P, t, "expected %s %s, found %s '%s'", tok_desc(ty), what, tok_desc(t->type), t->s);
    P->i++;
    return t;
}
static void expect_word(parser *P, const char *w, const char *opened, int line) {
    jtok *t = cur(P);
    if (!is_word(P, 0, w)) {
        if (t->type == TK_EOF) perr(P, t, "'%s' opened on line %d is never closed: expected {%% %s %%}", opened, line, w);
        perr(P, t, "expected '%s', found '%s'", w, t->s);
    }
    P->i++;
}
static bool is_stmt(parser *P, const char *w) { return is(P, TK_OPEN_STMT) && is_word(P, 1, w); }

static jnode *node(parser *P, jnode_kind k, const jtok *at) {
    jnode *e = ja_alloc(&P->t->arena, sizeof *e);
    e->kind = k;
    e->line = at->line;
    return e;
}

/* A growing node list in the template's arena (nothing to free when an error longjmps). */
typedef struct {
    jnode **v;
    int n, cap;
    jarena *a;
} nvec;
static void nv_push_a(jarena *a, nvec *v, jnode *e) {
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 8;
        jnode **nw = ja_alloc(a, cap * sizeof *nw);
        if (v->n) memcpy(nw, v->v, v->n * sizeof *nw);
        v->v = nw;
        v->cap = cap;
    }
    v->v[v->n++] = e;
}
static jnode **nv_done(parser *P, nvec *v, int *n) {
    (void)P;
    *n = v->n;
    if (!v->v) return ja_alloc(&P->t->arena, sizeof(jnode *));
    return v->v;
}

static jnode *parse_expr(parser *P);
static jnode *parse_primary(parser *P);

static void enter(parser *P) {
    if (++P->depth > MAX_NEST) perr(P, cur(P), "expressions or blocks nested deeper than %d", MAX_NEST);
}
static jnode *parse_any(parser *P);

/* Statements until one of the words (as "{% word"). */
static jnode **parse_body(parser *P, int *n, const char *const *ends, const char *opened, int line) {
    nvec v = {0};
    for (;;) {
        if (is(P, TK_EOF)) {
           
            perr(P, cur(P), "'%s' opened on line %d is never closed: expected {%% %s %%}", opened, line, ends[0]);
        }
        bool end = false;
        for (int k = 0; ends[k]; k++) end |= is_stmt(P, ends[k]);
        if (end) break;
        nv_push_a(&P->t->arena, &v, parse_any(P));
    }
    return nv_done(P, &v, n);
}

/* ( args ) of a call (or the parameters of a macro / call block), with @huggingface/jinja's
 * rules: keyword arguments after positional ones, one *spread before any later positional
 * argument, **spread last; parameters are names with optional defaults, each name once. */
static jnode *parse_args_list(parser *P, bool params, int *n, jnode ***out) {
    expect(P, TK_LPAREN, "to open the argument list");
    nvec v = {0};
    bool saw_kw = false, saw_spread = false;
    while (!is(P, TK_RPAREN)) {
        jtok *at = cur(P);
        if (is(P, TK_EOF)) perr(P, at, "argument list is never closed with ')'");
        jnode *arg;
        bool kwspread = is(P, TK_POW), spread = is(P, TK_MUL) && !strcmp(at->s, "*");
        if (params && (kwspread || spread)) perr(P, at, "argument unpacking is not allowed in parameter declarations");
        if (kwspread) {
            P->i++;
            arg = node(P, E_KWSPREAD, at);
            arg->a = parse_expr(P);
            if (is(P, TK_COMMA)) P->i++;
            if (!is(P, TK_RPAREN)) perr(P, cur(P), "expected ')': ** must be applied to the last argument");
        } else if (spread) {
            if (saw_spread) perr(P, at, "only one * argument unpacking is allowed");
            saw_spread = true;
            P->i++;
            arg = node(P, E_SPREAD, at);
            arg->a = parse_expr(P);
        } else {
            arg = parse_expr(P);
            if (is(P, TK_EQUALS)) {
                P->i++;
                if (arg->kind != E_NAME) perr(P, at, "expected a name before '=' in an argument list");
                jnode *kw = node(P, E_KWARG, at);
                kw->s = arg->s, kw->n = arg->n, kw->sym = arg->sym;
                kw->a = parse_expr(P);
                arg = kw;
                saw_kw = true;
            } else if (saw_kw) {
                perr(P, at, params ? "non-default argument follows default argument" : "positional argument follows keyword argument");
            } else if (saw_spread) {
                perr(P, at, "positional arguments must not follow * argument unpacking");
            }
            if (params && arg->kind != E_NAME && arg->kind != E_KWARG) perr(P, at, "expected a parameter name");
            for (int k = 0; params && k < v.n; k++)
                if (!strcmp(v.v[k]->s, arg->s)) perr(P, at, "duplicate parameter name '%s'", arg->s);
        }
        nv_push_a(&P->t->arena, &v, arg);
        if (is(P, TK_COMMA)) P->i++;
        else if (!is(P, TK_RPAREN)) {
            jtok *t = cur(P);
            perr(P, t, "expected ',' or ')' in an argument list, found '%s'", t->s);
        }
    }
    P->i++;
    *out = nv_done(P, &v, n);
    return NULL;
}

static jnode *parse_call(parser *P, jnode *callee);

/* [index] or [start:stop:step] after the '['. */
static jnode *parse_subscript(parser *P, jtok *at) {
    jnode *parts[3] = {0};
    int np = 0;
    bool slice = false;
    while (!is(P, TK_RBRACKET)) {
        if (np >= 3 || is(P, TK_EOF)) perr(P, at, "bad subscript: expected an index or at most 3 slice parts");
        if (is(P, TK_COLON)) {
            parts[np++] = NULL;
            P->i++;
            slice = true;
        } else {
            parts[np++] = parse_expr(P);
            if (is(P, TK_COLON)) P->i++, slice = true;
        }
    }
    P->i++;
    if (!np) perr(P, at, "empty subscript []");
    if (!slice) return parts[0];
    jnode *s = node(P, E_SLICE, at);
    s->a = parts[0], s->b = parts[1], s->c = parts[2];
    return s;
}

static jnode *parse_member(parser *P, jnode *obj) {
    while (is(P, TK_DOT) || is(P, TK_LBRACKET)) {
        jtok *at = cur(P);
        P->i++;
        jnode *m = node(P, E_MEMBER, at);
        m->a = obj;
        if (at->type == TK_LBRACKET) {
            m->op = 1;
            m->b = parse_subscript(P, at);
        } else {
            jtok *nt = cur(P);
            if (nt->type == TK_IDENT) {
                m->s = nt->s, m->n = nt->n;
            } else if (nt->type == TK_NUM && !strchr(nt->s, '.') && nt->s[0] != '-' && nt->s[0] != '+') {
                m->op = 1;
                m->b = node(P, E_INT, nt);
                m->b->num = strtod(nt->s, NULL);
            } else {
                perr(P, nt, "expected a name or an integer after '.', found '%s'", nt->s);
            }
            P->i++;
        }
        obj = m;
    }
    return obj;
}

static jnode *parse_call(parser *P, jnode *callee) {
    jnode *c = node(P, E_CALL, cur(P));
    c->a = callee;
    parse_args_list(P, false, &c->nlist, &c->list);
    jnode *e = parse_member(P, c);
    if (is(P, TK_LPAREN)) e = parse_call(P, e);
    return e;
}

static jnode *parse_call_member(parser *P) {
    jnode *m = parse_member(P, parse_primary(P));
    return is(P, TK_LPAREN) ? parse_call(P, m) : m;
}

static jnode *parse_unary(parser *P) {
    jtok *t = cur(P);
    if ((t->type == TK_UNARY || t->type == TK_ADD) && (!strcmp(t->s, "-") || !strcmp(t->s, "+"))) {
        P->i++;
        jnode *u = node(P, E_UNARY, t);
        u->op = t->s[0] == '-' ? OP_NEG : OP_POS;
        enter(P);
        u->a = parse_unary(P);
        P->depth--;
        return u;
    }
    return parse_call_member(P);
}

/* NAME or NAME(args) after '|' (or in a filter block). */
static jnode *parse_filter_ref(parser *P, jnode *operand) {
    jtok *nt = cur(P);
    if (nt->type != TK_IDENT) perr(P, nt, "expected a filter name, found '%s'", nt->s);
    P->i++;
    jnode *f = node(P, E_FILTER, nt);
    f->a = operand;
    f->s = nt->s, f->n = nt->n;
    if (is(P, TK_LPAREN)) {
        f->op = 1;
        parse_args_list(P, false, &f->nlist, &f->list);
    }
    return f;
}

static jnode *parse_filter(parser *P) {
    jnode *e = parse_unary(P);
    while (is(P, TK_PIPE)) {
        P->i++;
        e = parse_filter_ref(P, e);
    }
    return e;
}

static bool test_takes_arg(const char *name) {
    static const char *const t[] = {"divisibleby", "eq", "equalto", "ne", "lt", "le", "gt", "ge", "sameas", "in",
                                    "startingwith", "greaterthan", "lessthan", NULL};
    for (int k = 0; t[k]; k++)
        if (!strcmp(t[k], name)) return true;
    return false;
}

static jnode *parse_test(parser *P) {
    jnode *e = parse_filter(P);
    while (is_word(P, 0, "is")) {
        jtok *at = cur(P);
        P->i++;
        jnode *t = node(P, E_TEST, at);
        t->a = e;
        if (is_word(P, 0, "not")) P->i++, t->op = 1;
        jtok *nt = cur(P);
        if (nt->type != TK_IDENT) perr(P, nt, "expected a test name after 'is', found '%s'", nt->s);
        P->i++;
        t->s = nt->s, t->n = nt->n;
        if (is(P, TK_LPAREN)) {
            parse_args_list(P, false, &t->nlist, &t->list);
        } else if (test_takes_arg(t->s) && (is(P, TK_NUM) || is(P, TK_STR) || is(P, TK_IDENT) || is(P, TK_LBRACKET))) {
            /* Jinja2's `x is divisibleby 3` form: one argument */
            t->list = ja_alloc(&P->t->arena, sizeof(jnode *));
            t->list[0] = parse_primary(P);
            t->nlist = 1;
        }
        e = t;
    }
    return e;
}

static jnode *binary(parser *P, jtok *at, int op, jnode *a, jnode *b) {
    jnode *e = node(P, E_BINARY, at);
    e->op = op, e->a = a, e->b = b;
    return e;
}

static jnode *parse_pow(parser *P) {
    jnode *e = parse_test(P);
    while (is(P, TK_POW)) {
        jtok *at = cur(P);
        P->i++;
        e = binary(P, at, OP_POW, e, parse_test(P));
    }
    return e;
}

static jnode *parse_mul(parser *P) {
    jnode *e = parse_pow(P);
    while (is(P, TK_MUL)) {
        jtok *at = cur(P);
        P->i++;
        int op = !strcmp(at->s, "*") ? OP_MUL : !strcmp(at->s, "/") ? OP_DIV : !strcmp(at->s, "//") ? OP_FLOORDIV : OP_MOD;
        e = binary(P, at, op, e, parse_pow(P));
    }
    return e;
}

static jnode *parse_add(parser *P) {
    jnode *e = parse_mul(P);
    while (is(P, TK_ADD)) {
        jtok *at = cur(P);
        P->i++;
        int op = at->s[0] == '+' ? OP_ADD : at->s[0] == '-' ? OP_SUB : OP_CONCAT;
        e = binary(P, at, op, e, parse_mul(P));
    }
    return e;
}

static jnode *parse_cmp(parser *P) {
    jnode *e = parse_add(P);
    for (;;) {
        jtok *at = cur(P);
        int op;
        if (is_word(P, 0, "not") && is_word(P, 1, "in")) op = OP_NOTIN, P->i += 2;
        else if (is_word(P, 0, "in")) op = OP_IN, P->i++;
        else if (is(P, TK_CMP)) {
            const char *s = at->s;
            op = !strcmp(s, "==") ? OP_EQ : !strcmp(s, "!=") ? OP_NE : !strcmp(s, "<") ? OP_LT : !strcmp(s, ">") ? OP_GT
                 : !strcmp(s, "<=") ? OP_LE : OP_GE;
            P->i++;
        } else break;
        e = binary(P, at, op, e, parse_add(P));
    }
    return e;
}

static jnode *parse_not(parser *P) {
    if (is_word(P, 0, "not")) {
        jtok *at = cur(P);
        P->i++;
        jnode *u = node(P, E_UNARY, at);
        u->op = OP_NOT;
        enter(P);
        u->a = parse_not(P);
        P->depth--;
        return u;
    }
    return parse_cmp(P);
}

static jnode *parse_and(parser *P) {
    jnode *e = parse_not(P);
    while (is_word(P, 0, "and")) {
        jtok *at = cur(P);
        P->i++;
        e = binary(P, at, OP_AND, e, parse_not(P));
    }
    return e;
}

static jnode *parse_or(parser *P) {
    jnode *e = parse_and(P);
    while (is_word(P, 0, "or")) {
        jtok *at = cur(P);
        P->i++;
        e = binary(P, at, OP_OR, e, parse_and(P));
    }
    return e;
}

static jnode *parse_expr2(parser *P);
static jnode *parse_expr(parser *P) {
    enter(P);
    jnode *e = parse_expr2(P);
    P->depth--;
    return e;
}

static jnode *parse_expr2(parser *P) {
    jnode *a = parse_or(P);
    if (is_word(P, 0, "if")) {
        jtok *at = cur(P);
        P->i++;
        jnode *test = parse_or(P);
        if (is_word(P, 0, "else")) {
            P->i++;
            jnode *t = node(P, E_TERNARY, at);
            t->a = test, t->b = a, t->c = parse_expr(P);
            return t;
        }
        jnode *s = node(P, E_SELECT, at);
        s->a = a, s->b = test;
        return s;
    }
    return a;
}

/* expr (, expr)* as a tuple when there is a comma; primary items for loop targets. */
static jnode *parse_seq(parser *P, bool primary) {
    jtok *at = cur(P);
    jnode *first = primary ? parse_primary(P) : parse_expr(P);
    if (!is(P, TK_COMMA)) return first;
    nvec v = {0};
    nv_push_a(&P->t->arena, &v, first);
    while (is(P, TK_COMMA)) {
        P->i++;
        nv_push_a(&P->t->arena, &v, primary ? parse_primary(P) : parse_expr(P));
        if (!is(P, TK_COMMA)) break;
    }
    jnode *t = node(P, E_TUPLE, at);
    t->list = nv_done(P, &v, &t->nlist);
    return t;
}

static jnode *parse_list_lit(parser *P, jtok *at) {
    nvec v = {0};
    while (!is(P, TK_RBRACKET)) {
        if (is(P, TK_EOF)) { perr(P, at, "list literal is never closed with ']'"); }
        nv_push_a(&P->t->arena, &v, parse_expr(P));
        if (is(P, TK_COMMA)) P->i++;
    }
    P->i++;
    jnode *e = node(P, E_ARRAY, at);
    e->list = nv_done(P, &v, &e->nlist);
    return e;
}

static jnode *parse_dict_lit(parser *P, jtok *at) {
    nvec k = {0}, v = {0};
    while (!is(P, TK_RBRACE)) {
        if (is(P, TK_EOF)) { perr(P, at, "dict literal is never closed with '}'"); }
        nv_push_a(&P->t->arena, &k, parse_expr(P));
        if (!is(P, TK_COLON)) { jtok *t = cur(P); perr(P, t, "expected ':' between key and value in a dict literal, found '%s'", t->s); }
        P->i++;
        nv_push_a(&P->t->arena, &v, parse_expr(P));
        if (is(P, TK_COMMA)) P->i++;
    }
    P->i++;
    jnode *e = node(P, E_DICT, at);
    e->list = nv_done(P, &k, &e->nlist);
    e->list2 = nv_done(P, &v, &e->nlist2);
    return e;
}

static jnode *parse_primary(parser *P) {
    jtok *t = cur(P);
    P->i++;
    switch (t->type) {
    case TK_NUM: {
        jnode *e = node(P, strchr(t->s, '.') ? E_FLOAT : E_INT, t);
        e->num = strtod(t->s, NULL);
        return e;
    }
    case TK_STR: {
        size_t n = t->n;
        int j = P->i;
        while (P->tk[j].type == TK_STR) n += P->tk[j++].n;
        char *s = ja_alloc(&P->t->arena, n + 1);
        memcpy(s, t->s, t->n);
        for (size_t k = t->n; P->i < j; P->i++) memcpy(s + k, P->tk[P->i].s, P->tk[P->i].n), k += P->tk[P->i].n;
        jnode *e = node(P, E_STR, t);
        e->s = s, e->n = n;
        return e;
    }
    case TK_IDENT: {
        jnode *e = node(P, E_NAME, t);
        e->s = t->s, e->n = t->n;
        e->sym = jinja_sym(P->t, t->s, t->n);
        return e;
    }
    case TK_LPAREN: {
        jnode *e = parse_seq(P, false);
        expect(P, TK_RPAREN, "to close '('");
        return e;
    }
    case TK_LBRACKET: return parse_list_lit(P, t);
    case TK_LBRACE: return parse_dict_lit(P, t);
    default: perr(P, t, "unexpected %s '%s' in an expression", tok_desc(t->type), t->s);
    }
}

static jnode *parse_if(parser *P, jtok *at) {
    jnode *n = node(P, N_IF, at);
    n->a = parse_expr(P);
    expect(P, TK_CLOSE_STMT, "after the if condition");
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    n->list = parse_body(P, &n->nlist, ends, "if", at->line);
    if (is_stmt(P, "elif")) {
        P->i += 2;
        n->list2 = ja_alloc(&P->t->arena, sizeof(jnode *));
        n->list2[0] = parse_if(P, &P->tk[P->i - 1]);
        n->nlist2 = 1;
    } else if (is_stmt(P, "else")) {
        P->i += 2;
        expect(P, TK_CLOSE_STMT, "after else");
        static const char *const e2[] = {"endif", NULL};
        n->list2 = parse_body(P, &n->nlist2, e2, "if", at->line);
    }
    return n;
}

static jnode *parse_for(parser *P, jtok *at) {
    jnode *n = node(P, N_FOR, at);
    n->a = parse_seq(P, true);
    if (n->a->kind != E_NAME && n->a->kind != E_TUPLE) perr(P, at, "expected a name or names as the for loop's target");
    if (!is_word(P, 0, "in")) perr(P, cur(P), "expected 'in' after the for loop's target, found '%s'", cur(P)->s);
    P->i++;
    jnode *it = parse_expr(P);
    if (it->kind == E_SELECT) n->b = it->a, n->c = it->b;
    else n->b = it;
    expect(P, TK_CLOSE_STMT, "after the for loop's iterable");
    static const char *const ends[] = {"endfor", "else", NULL};
    n->list = parse_body(P, &n->nlist, ends, "for", at->line);
    if (is_stmt(P, "else")) {
        P->i += 2;
        expect(P, TK_CLOSE_STMT, "after else");
        static const char *const e2[] = {"endfor", NULL};
        n->list2 = parse_body(P, &n->nlist2, e2, "for", at->line);
    }
    return n;
}

static jnode *parse_set(parser *P, jtok *at) {
    jnode *n = node(P, N_SET, at);
    n->a = parse_seq(P, false);
    if (n->a->kind != E_NAME && n->a->kind != E_TUPLE && n->a->kind != E_MEMBER)
        perr(P, at, "set: expected a name, names or NAME.ATTRIBUTE before '='");
    if (is(P, TK_EQUALS)) {
        P->i++;
        n->b = parse_seq(P, false);
    } else {
        expect(P, TK_CLOSE_STMT, "or '=' after set's target");
        static const char *const ends[] = {"endset", NULL};
        n->list = parse_body(P, &n->nlist, ends, "set", at->line);
        P->i += 2;
    }
    expect(P, TK_CLOSE_STMT, "to close set");
    return n;
}

static jnode *parse_macro(parser *P, jtok *at) {
    jnode *n = node(P, N_MACRO, at);
    jtok *nt = cur(P);
    if (nt->type != TK_IDENT) perr(P, nt, "expected the macro's name, found '%s'", nt->s);
    P->i++;
    n->s = nt->s, n->n = nt->n, n->sym = jinja_sym(P->t, nt->s, nt->n);
    parse_args_list(P, true, &n->nlist2, &n->list2);
    expect(P, TK_CLOSE_STMT, "after the macro's parameters");
    static const char *const ends[] = {"endmacro", NULL};
    n->list = parse_body(P, &n->nlist, ends, "macro", at->line);
    return n;
}

static jnode *parse_callblock(parser *P, jtok *at) {
    jnode *n = node(P, N_CALLBLOCK, at);
    if (is(P, TK_LPAREN)) parse_args_list(P, true, &n->nlist2, &n->list2);
    jtok *ct = cur(P);
    jnode *callee = parse_primary(P);
    if (callee->kind != E_NAME) perr(P, ct, "expected a macro name after call");
    n->a = node(P, E_CALL, ct);
    n->a->a = callee;
    parse_args_list(P, false, &n->a->nlist, &n->a->list);
    expect(P, TK_CLOSE_STMT, "after the call");
    static const char *const ends[] = {"endcall", NULL};
    n->list = parse_body(P, &n->nlist, ends, "call", at->line);
    P->i += 2;
    expect(P, TK_CLOSE_STMT, "after endcall");
    return n;
}

static jnode *parse_stmt(parser *P) {
    jtok *open = expect(P, TK_OPEN_STMT, "");
    jtok *at = cur(P);
    if (at->type != TK_IDENT) perr(P, at, "expected a statement name after {%%, found '%s'", at->s);
    P->i++;
    const char *w = at->s;
    jnode *n;
    (void)open;
    if (!strcmp(w, "set")) return parse_set(P, at);
    if (!strcmp(w, "if")) n = parse_if(P, at), P->i++, expect_word(P, "endif", "if", at->line);
    else if (!strcmp(w, "for")) n = parse_for(P, at), P->i++, expect_word(P, "endfor", "for", at->line);
    else if (!strcmp(w, "macro")) n = parse_macro(P, at), P->i++, expect_word(P, "endmacro", "macro", at->line);
    else if (!strcmp(w, "call")) return parse_callblock(P, at);
    else if (!strcmp(w, "break") || !strcmp(w, "continue")) n = node(P, w[0] == 'b' ? N_BREAK : N_CONTINUE, at);
    else if (!strcmp(w, "filter")) {
        n = node(P, N_FILTERBLOCK, at);
        n->b = parse_filter_ref(P, NULL);
        expect(P, TK_CLOSE_STMT, "after the filter");
        static const char *const ends[] = {"endfilter", NULL};
        n->list = parse_body(P, &n->nlist, ends, "filter", at->line);
        P->i += 2;
    } else perr(P, at, "unknown or unsupported statement '%s'", w);
    expect(P, TK_CLOSE_STMT, "to close the statement");
    return n;
}

static jnode *parse_any2(parser *P);
static jnode *parse_any(parser *P) {
    enter(P);
    jnode *n = parse_any2(P);
    P->depth--;
    return n;
}

static jnode *parse_any2(parser *P) {
    jtok *t = cur(P);
    switch (t->type) {
    case TK_COMMENT: P->i++; return node(P, N_COMMENT, t);
    case TK_TEXT: {
        P->i++;
        jnode *n = node(P, N_TEXT, t);
        n->s = t->s, n->n = t->n;
        return n;
    }
    case TK_OPEN_STMT: return parse_stmt(P);
    case TK_OPEN_EXPR: {
        P->i++;
        jnode *e = parse_expr(P);
        expect(P, TK_CLOSE_EXPR, "to close the expression");
        return e;
    }
    default: perr(P, t, "unexpected %s '%s' outside a tag", tok_desc(t->type), t->s);
    }
}

int jinja_parse(const char *src, size_t len, const char *name, jinja_tpl **out) {
    *out = NULL;
    jinja_tpl *t = xcalloc(1, sizeof *t);
    t->name = xstrdup(name ? name : "template");
    /* names the renderer binds itself, interned now so rendering never changes the template */
    static const char *const pre[] = {"loop", "caller", "kwargs", "varargs", "namespace", "range", "raise_exception",
                                      "strftime_now", "dict", "true", "false", "none", "True", "False", "None", NULL};
    for (int k = 0; pre[k]; k++) jinja_sym(t, pre[k], strlen(pre[k]));
    jtok *toks;
    int ntok;
    if (jinja_lex(&t->arena, src, len, t->name, &toks, &ntok) != MOERL_OK) {
        jinja_free(t);
        return MOERL_ERR;
    }
    parser *P = xcalloc(1, sizeof *P);
    P->t = t, P->tk = toks, P->n = ntok;
    if (setjmp(P->jmp)) {
        free(P);
        jinja_free(t);
        return MOERL_ERR;
    }
    nvec v = {0};
    while (!is(P, TK_EOF)) {
        if (is(P, TK_OPEN_STMT) && P->tk[P->i + 1].type == TK_IDENT) {
            const char *w = P->tk[P->i + 1].s;
            static const char *const stray[] = {"endif", "endfor", "endmacro", "endset", "endcall", "endfilter", "else", "elif", NULL};
            for (int k = 0; stray[k]; k++)
                if (!strcmp(w, stray[k])) { perr(P, &P->tk[P->i + 1], "'%s' without a matching opening block", w); }
        }
        nv_push_a(&P->t->arena, &v, parse_any(P));
    }
    t->body = nv_done(P, &v, &t->nbody);
    free(P);
    *out = t;
    return MOERL_OK;
}

void jinja_free(jinja_tpl *t) {
    if (!t) return;
    ja_free(&t->arena);
    free(t->syms);
    free(t->name);
    free(t);
}
