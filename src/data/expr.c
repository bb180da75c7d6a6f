/* moerl — countdown equation checker: recursive-descent parser over exact rationals (see expr.h).
 *
 * The task's semantics follow verl/utils/reward_score/countdown.py (TinyZero's countdown task), ideas
 * only, no code taken; moerl verifies exactly instead of evaluating in floating point. */
#include "data/expr.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

typedef struct {
    int64_t n, d; /* d > 0, gcd(|n|, d) == 1 */
} rat;

/* Reduce n/d (d != 0) into *out; false if it does not fit int64. */
static bool rat_make(__int128 n, __int128 d, rat *out) {
    if (d < 0) { n = -n; d = -d; }
    __int128 a = n < 0 ? -n : n, b = d;
    while (b) { __int128 t = a % b; a = b; b = t; }
    if (a > 1) { n /= a; d /= a; }
    if (n > INT64_MAX || n < -INT64_MAX || d > INT64_MAX) return false;
    out->n = (int64_t)n;
    out->d = (int64_t)d;
    return true;
}

typedef struct {
    const char *s;
    size_t pos;
    int depth;
    bool syntax, div0, overflow;
    int64_t *lits;
    int nlits, caplits;
} cd_parser;

static void skip_ws(cd_parser *p) {
    while (p->s[p->pos] == ' ' || p->s[p->pos] == '\t') p->pos++;
}

static rat cd_expr(cd_parser *p);

static rat cd_binop(cd_parser *p, rat a, char op, rat b) {
    rat r = {0, 1};
    if (p->div0 || p->overflow) return r;
    __int128 an = a.n, ad = a.d, bn = b.n, bd = b.d;
    bool ok = true;
    switch (op) {
    case '+': ok = rat_make(an * bd + bn * ad, ad * bd, &r); break;
    case '-': ok = rat_make(an * bd - bn * ad, ad * bd, &r); break;
    case '*': ok = rat_make(an * bn, ad * bd, &r); break;
    case '/':
        if (b.n == 0) { p->div0 = true; return r; }
        ok = rat_make(an * bd, ad * bn, &r);
        break;
    }
    if (!ok) p->overflow = true;
    return r;
}

static rat cd_primary(cd_parser *p) {
    rat r = {0, 1};
    skip_ws(p);
    char c = p->s[p->pos];
    if (c == '(') {
        p->pos++;
        if (++p->depth > 200) { p->syntax = true; return r; }
        r = cd_expr(p);
        p->depth--;
        skip_ws(p);
        if (p->s[p->pos] != ')') { p->syntax = true; return r; }
        p->pos++;
        return r;
    }
    if (!isdigit((unsigned char)c)) { p->syntax = true; return r; }
    int64_t v = 0;
    bool big = false;
    while (isdigit((unsigned char)p->s[p->pos])) {
        if (v > 100000000000000LL) big = true; /* literals beyond 1e15 cannot be countdown numbers */
        else v = v * 10 + (p->s[p->pos] - '0');
        p->pos++;
    }
    if (p->s[p->pos] == '.') { p->syntax = true; return r; } /* decimals are not countdown numbers */
    if (big) { p->overflow = true; v = -1; }
    if (p->nlits == p->caplits) {
        p->caplits = p->caplits ? 2 * p->caplits : 8;
        p->lits = xrealloc(p->lits, sizeof(int64_t) * (size_t)p->caplits);
    }
    p->lits[p->nlits++] = v;
    r.n = big ? 0 : v;
    return r;
}

static rat cd_unary(cd_parser *p) {
    skip_ws(p);
    if (p->s[p->pos] == '-') {
        p->pos++;
        if (++p->depth > 200) { p->syntax = true; return (rat){0, 1}; }
        rat r = cd_unary(p);
        p->depth--;
        r.n = -r.n;
        return r;
    }
    return cd_primary(p);
}

static rat cd_term(cd_parser *p) {
    rat a = cd_unary(p);
    for (;;) {
        if (p->syntax) return a;
        skip_ws(p);
        char op = p->s[p->pos];
        if (op != '*' && op != '/') return a;
        p->pos++;
        rat b = cd_unary(p);
        a = cd_binop(p, a, op, b);
    }
}

static rat cd_expr(cd_parser *p) {
    rat a = cd_term(p);
    for (;;) {
        if (p->syntax) return a;
        skip_ws(p);
        char op = p->s[p->pos];
        if (op != '+' && op != '-') return a;
        p->pos++;
        rat b = cd_term(p);
        a = cd_binop(p, a, op, b);
    }
}

static bool parse_int_text(const char *s, int64_t *out) {
    while (*s == ' ' || *s == '\t') s++;
    const char *p = s;
    if (*p == '-') p++;
    if (!isdigit((unsigned char)*p)) return false;
    int64_t v = 0;
    while (isdigit((unsigned char)*p)) {
        if (v > 100000000000000LL) return false;
        v = v * 10 + (*p - '0');
        p++;
    }
    while (*p == ' ' || *p == '\t') p++;
    if (*p) return false;
    *out = *s == '-' ? -v : v;
    return true;
}

/* Multiset check: each literal consumes one unused equal number. CD_VALID, CD_NUMBER_REUSED or
 * CD_NUMBER_NOT_GIVEN (for the first literal that fails). */
static cd_verdict check_literals(const int64_t *lits, int nlits, const int64_t *numbers, int n_numbers) {
    cd_verdict res = CD_VALID;
    bool *used = xcalloc((size_t)(n_numbers > 0 ? n_numbers : 1), sizeof(bool));
    for (int i = 0; i < nlits && res == CD_VALID; i++) {
        int free_k = -1;
        bool seen = false;
        for (int k = 0; k < n_numbers; k++) {
            if (numbers[k] != lits[i]) continue;
            seen = true;
            if (!used[k]) { free_k = k; break; }
        }
        if (free_k >= 0) used[free_k] = true;
        else res = seen ? CD_NUMBER_REUSED : CD_NUMBER_NOT_GIVEN;
    }
    free(used);
    return res;
}

cd_verdict countdown_verify(const char *equation, const int64_t *numbers, int n_numbers, int64_t target) {
    /* split "expr = N" */
    const char *eq = strchr(equation, '=');
    if (eq && strchr(eq + 1, '=')) return CD_SYNTAX;
    size_t elen = eq ? (size_t)(eq - equation) : strlen(equation);
    char *expr = xmalloc(elen + 1);
    memcpy(expr, equation, elen);
    expr[elen] = 0;
    int64_t claimed = 0;
    if (eq && !parse_int_text(eq + 1, &claimed)) { free(expr); return CD_SYNTAX; }

    cd_parser p = {.s = expr};
    rat v = cd_expr(&p);
    skip_ws(&p);
    if (p.s[p.pos] != 0) p.syntax = true;
    cd_verdict res = CD_VALID;
    if (p.syntax) { res = CD_SYNTAX; goto done; }
    res = check_literals(p.lits, p.nlits, numbers, n_numbers);
    if (res != CD_VALID) goto done;
    if (p.div0) { res = CD_DIV_BY_ZERO; goto done; }
    if (p.overflow) { res = CD_OVERFLOW; goto done; }
    if (!(v.d == 1 && v.n == target)) res = CD_WRONG_RESULT;
    else if (eq && claimed != target) res = CD_WRONG_RESULT;
done:
    free(p.lits);
    free(expr);
    return res;
}

const char *cd_verdict_name(cd_verdict v) {
    switch (v) {
    case CD_VALID: return "valid";
    case CD_SYNTAX: return "syntax error";
    case CD_NUMBER_NOT_GIVEN: return "number not given";
    case CD_NUMBER_REUSED: return "number reused";
    case CD_DIV_BY_ZERO: return "division by zero";
    case CD_OVERFLOW: return "overflow";
    case CD_WRONG_RESULT: return "wrong result";
    }
    return "?";
}
