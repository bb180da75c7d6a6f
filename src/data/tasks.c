/* moerl — built-in verifiable tasks and rule-based rewards (see tasks.h).
 *
 * Sources for the semantics (ideas only, no code taken):
 *   verl/utils/reward_score/gsm8k.py      "#### " extraction, last-300-character window, format_score 0
 *   verl/utils/reward_score/countdown.py  the countdown task (TinyZero): numbers + target, equation answer
 *   verl examples/data_preprocess/gsm8k.py  the row layout (data_source, prompt, reward_model, extra_info)
 */
#include "data/tasks.h"

#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"

/* ================================================================== countdown verifier */

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
    /* multiset check: each literal consumes one unused equal number */
    bool *used = xcalloc((size_t)(n_numbers > 0 ? n_numbers : 1), sizeof(bool));
    for (int i = 0; i < p.nlits && res == CD_VALID; i++) {
        int free_k = -1;
        bool seen = false;
        for (int k = 0; k < n_numbers; k++) {
            if (numbers[k] != p.lits[i]) continue;
            seen = true;
            if (!used[k]) { free_k = k; break; }
        }
        if (free_k >= 0) used[free_k] = true;
        else res = seen ? CD_NUMBER_REUSED : CD_NUMBER_NOT_GIVEN;
    }
    free(used);
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

/* ================================================================== rewards */

/* Exact decimal in canonical form: sign, integer digits without leading zeros, fraction
 * digits without trailing zeros; "-0" becomes "0". */
typedef struct {
    char text[130];
} decimal;

/* Parse a number at s[i] per the grammar in tasks.h (sign decided by the caller). Returns the
 * end index, or i if there is no number there. */
static size_t scan_number(const char *s, size_t i, char *digits, size_t cap, size_t *frac_at) {
    size_t j = i, m = 0;
    *frac_at = (size_t)-1;
    if (!isdigit((unsigned char)s[j])) return i;
    for (;;) {
        while (isdigit((unsigned char)s[j])) {
            if (m + 1 < cap) digits[m++] = s[j];
            j++;
        }
        /* thousands group: ',' followed by exactly three digits */
        if (s[j] == ',' && isdigit((unsigned char)s[j + 1]) && isdigit((unsigned char)s[j + 2]) &&
            isdigit((unsigned char)s[j + 3]) && !isdigit((unsigned char)s[j + 4])) {
            j++;
            continue;
        }
        break;
    }
    if (s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
        *frac_at = m;
        j++;
        while (isdigit((unsigned char)s[j])) {
            if (m + 1 < cap) digits[m++] = s[j];
            j++;
        }
    }
    digits[m] = 0;
    return j;
}

static void canon_decimal(bool neg, const char *digits, size_t frac_at, decimal *out) {
    size_t n = strlen(digits);
    size_t int_len = frac_at == (size_t)-1 ? n : frac_at;
    size_t a = 0;
    while (a + 1 < int_len && digits[a] == '0') a++;
    size_t fend = n;
    while (fend > int_len && digits[fend - 1] == '0') fend--;
    char buf[128];
    size_t m = 0;
    for (size_t k = a; k < int_len && m + 2 < sizeof buf; k++) buf[m++] = digits[k];
    if (int_len == 0) buf[m++] = '0';
    if (fend > int_len) {
        buf[m++] = '.';
        for (size_t k = int_len; k < fend && m + 1 < sizeof buf; k++) buf[m++] = digits[k];
    }
    buf[m] = 0;
    bool zero = strcmp(buf, "0") == 0;
    snprintf(out->text, sizeof out->text, "%s%s", neg && !zero ? "-" : "", buf);
}

static bool sign_allowed_before(const char *s, size_t i) {
    if (i == 0) return true;
    unsigned char c = (unsigned char)s[i - 1];
    return !(isalnum(c) || c == ')');
}

/* The last number in s; false if none. */
static bool last_number(const char *s, decimal *out) {
    bool found = false;
    size_t i = 0, n = strlen(s);
    char digits[100];
    while (i < n) {
        if (isdigit((unsigned char)s[i]) && (i == 0 || !isdigit((unsigned char)s[i - 1]))) {
            size_t fa;
            size_t j = scan_number(s, i, digits, sizeof digits, &fa);
            bool neg = i > 0 && s[i - 1] == '-' && sign_allowed_before(s, i - 1);
            canon_decimal(neg, digits, fa, out);
            found = true;
            i = j;
        } else {
            i++;
        }
    }
    return found;
}

/* The whole (trimmed) string as one number. */
static bool whole_number(const char *s, decimal *out) {
    while (isspace((unsigned char)*s)) s++;
    bool neg = false;
    if (*s == '-' || *s == '+') { neg = *s == '-'; s++; }
    char digits[100];
    size_t fa;
    size_t j = scan_number(s, 0, digits, sizeof digits, &fa);
    if (j == 0) return false;
    while (isspace((unsigned char)s[j])) j++;
    if (s[j]) return false;
    canon_decimal(neg, digits, fa, out);
    return true;
}

int reward_exact_number(const char *response, const char *ground_truth, double *score) {
    decimal want, got;
    *score = 0.0;
    if (!whole_number(ground_truth, &want))
        return moerl_errorf("reward_exact_number: ground truth '%.100s' is not a number", ground_truth);
    if (last_number(response, &got) && strcmp(got.text, want.text) == 0) *score = 1.0;
    return MOERL_OK;
}

#define GSM8K_CLIP_CHARS 300 /* verl gsm8k.py _SOLUTION_CLIP_CHARS */

static bool gsm8k_class(char c) { return isdigit((unsigned char)c) || c == '.' || c == ','; }

int reward_gsm8k(const char *response, const char *ground_truth, double *score) {
    *score = 0.0;
    /* keep the last 300 characters (code points: skip UTF-8 continuation bytes when counting) */
    size_t n = strlen(response), start = n;
    int chars = 0;
    while (start > 0 && chars < GSM8K_CLIP_CHARS) {
        start--;
        if (((unsigned char)response[start] & 0xC0) != 0x80) chars++;
    }
    const char *s = response + start;
    size_t len = n - start, i = 0;
    const char *best = NULL;
    size_t best_len = 0;
    while (i + 5 <= len) {
        if (memcmp(s + i, "#### ", 5) != 0) { i++; continue; }
        size_t j = i + 5, k;
        if (j < len && s[j] == '-' && j + 1 < len && gsm8k_class(s[j + 1])) k = j + 1;
        else if (j < len && gsm8k_class(s[j])) k = j;
        else { i++; continue; }
        while (k < len && gsm8k_class(s[k])) k++;
        best = s + j;
        best_len = k - j;
        i = k; /* findall: matches do not overlap */
    }
    if (!best) return MOERL_OK;
    char *ans = xmalloc(best_len + 1);
    size_t m = 0;
    for (size_t t = 0; t < best_len; t++)
        if (best[t] != ',' && best[t] != '$') ans[m++] = best[t];
    ans[m] = 0;
    if (strcmp(ans, ground_truth) == 0) *score = 1.0;
    free(ans);
    return MOERL_OK;
}

/* Parse {"target": int, "numbers": [int, ...]}; numbers (≤ 64) into nums. */
static int countdown_truth(const char *gt, int64_t *target, int64_t *nums, int *n) {
    json_error_t e;
    json_t *o = json_loads(gt, 0, &e);
    const char *want = "expected {\"target\": int, \"numbers\": [int, ...]}";
    if (!o) return moerl_errorf("countdown ground truth '%.100s': not JSON (%s); %s", gt, e.text, want);
    int rc = MOERL_ERR;
    json_t *t = json_object_get(o, "target"), *ns = json_object_get(o, "numbers");
    if (!json_is_object(o) || !json_is_integer(t) || !json_is_array(ns) || json_array_size(ns) == 0 ||
        json_array_size(ns) > 64) {
        moerl_errorf("countdown ground truth '%.100s': %s (1 to 64 numbers)", gt, want);
        goto done;
    }
    *target = json_integer_value(t);
    *n = (int)json_array_size(ns);
    for (int i = 0; i < *n; i++) {
        json_t *x = json_array_get(ns, (size_t)i);
        if (!json_is_integer(x)) {
            moerl_errorf("countdown ground truth '%.100s': numbers[%d] is not an integer; %s", gt, i, want);
            goto done;
        }
        nums[i] = json_integer_value(x);
    }
    rc = MOERL_OK;
done:
    json_decref(o);
    return rc;
}

/* The equation text of a countdown response (heap), see reward_countdown. */
static char *countdown_extract(const char *r) {
    const char *a = NULL, *b = NULL;
    for (const char *p = r; (p = strstr(p, "<answer>")) != NULL;) {
        const char *q = strstr(p + 8, "</answer>");
        if (!q) break;
        a = p + 8;
        b = q;
        p = q + 9;
    }
    if (!a) {
        /* last non-empty line */
        const char *end = r + strlen(r);
        for (;;) {
            while (end > r && isspace((unsigned char)end[-1])) end--;
            const char *st = end;
            while (st > r && st[-1] != '\n') st--;
            a = st;
            b = end;
            break;
        }
    }
    while (a < b && isspace((unsigned char)*a)) a++;
    while (b > a && (isspace((unsigned char)b[-1]) || b[-1] == '.')) b--;
    char *s = xmalloc((size_t)(b - a) + 1);
    memcpy(s, a, (size_t)(b - a));
    s[b - a] = 0;
    return s;
}

int reward_countdown(const char *response, const char *ground_truth, double *score) {
    int64_t target = 0, nums[64];
    int n = 0;
    *score = 0.0;
    if (countdown_truth(ground_truth, &target, nums, &n)) return MOERL_ERR;
    char *eq = countdown_extract(response);
    if (*eq && countdown_verify(eq, nums, n, target) == CD_VALID) *score = 1.0;
    free(eq);
    return MOERL_OK;
}

static const struct {
    const char *source;
    reward_fn fn;
} k_rewards[] = {
    {"arith", reward_exact_number},
    {"gsm8k-style", reward_gsm8k},
    {"gsm8k", reward_gsm8k},
    {"openai/gsm8k", reward_gsm8k},
    {"countdown", reward_countdown},
};

reward_fn reward_fn_for(const char *data_source) {
    size_t nk = sizeof k_rewards / sizeof k_rewards[0];
    for (size_t i = 0; i < nk; i++)
        if (strcmp(k_rewards[i].source, data_source) == 0) return k_rewards[i].fn;
    char known[256] = "";
    for (size_t i = 0; i < nk; i++) {
        strcat(known, i ? ", " : "");
        strcat(known, k_rewards[i].source);
    }
    moerl_errorf("no reward function for data_source '%s' (known: %s)", data_source, known);
    return NULL;
}

int reward_row(const ds_row *r, const char *response, double *score) {
    reward_fn fn = reward_fn_for(r->data_source);
    if (!fn) return moerl_error_prefix("row at line %lld: ", (long long)r->line);
    if (fn(response, r->ground_truth, score)) return moerl_error_prefix("row at line %lld: ", (long long)r->line);
    return MOERL_OK;
}

/* ================================================================== generators */

/* Uniform integer in [lo, hi] from the project generator (base/rng.h, unbiased). */
static int64_t rng_range(rng_state *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)rng_below(r, (uint64_t)(hi - lo) + 1);
}

/* A set of strings (open addressing, FNV-1a). */
typedef struct {
    char **slot;
    size_t cap, n;
} strset;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void strset_init(strset *t, size_t expect) {
    t->cap = 64;
    while (t->cap < 2 * expect + 2) t->cap *= 2;
    t->slot = xcalloc(t->cap, sizeof(char *));
    t->n = 0;
}

/* Insert; false if already present. */
static bool strset_add(strset *t, const char *s) {
    size_t i = fnv1a(s) & (t->cap - 1);
    while (t->slot[i]) {
        if (strcmp(t->slot[i], s) == 0) return false;
        i = (i + 1) & (t->cap - 1);
    }
    t->slot[i] = xstrdup(s);
    t->n++;
    return true;
}

static void strset_free(strset *t) {
    for (size_t i = 0; i < t->cap; i++) free(t->slot[i]);
    free(t->slot);
}

/* One generated problem. */
typedef struct {
    char prompt[1024];
    char key[256]; /* canonical form for the train/test disjointness check ("" = the prompt) */
    char truth[256];
    int truth_json;
    char response[1024];
} task_item;

typedef void (*gen_fn)(rng_state *r, const task_opts *o, task_item *it);

/* ---- arith */

static void gen_arith(rng_state *r, const task_opts *o, task_item *it) {
    int64_t lo = 1, hi;
    for (int i = 1; i < o->arith_digits; i++) lo *= 10;
    hi = lo * 10 - 1;
    if (o->arith_digits == 1) lo = 0;
    int64_t a = rng_range(r, lo, hi), b = rng_range(r, lo, hi);
    bool add = rng_u64(r) & 1;
    int64_t c = add ? a + b : a - b;
    snprintf(it->prompt, sizeof it->prompt, "Compute %lld%c%lld.", (long long)a, add ? '+' : '-', (long long)b);
    snprintf(it->truth, sizeof it->truth, "%lld", (long long)c);
    snprintf(it->response, sizeof it->response, "%lld", (long long)c);
}

/* ---- gsm8k-style word problems */

static const char *const k_names[] = {"Ava",  "Ben",   "Chloe", "Dev",  "Emma", "Farid", "Grace", "Hiro",
                                      "Isla", "Jamal", "Kira",  "Liam", "Maya", "Noah",  "Olga",  "Priya"};
static const char k_he[] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0}; /* 1: he, 0: she */
static const char *const k_items[] = {"apples", "marbles", "stickers", "pencils", "cards", "shells", "coins", "beads"};

#define NAMES_N (int)(sizeof k_names / sizeof k_names[0])
#define ITEMS_N (int)(sizeof k_items / sizeof k_items[0])

/* "1 apple" / "3 apples": k_items are plurals in 's', so the singular drops that letter. */
static const char *noun_n(char *buf, size_t cap, long long n, const char *plural) {
    size_t len = strlen(plural);
    if (n == 1 && len > 1 && plural[len - 1] == 's') snprintf(buf, cap, "%.*s", (int)(len - 1), plural);
    else snprintf(buf, cap, "%s", plural);
    return buf;
}

static const char *k_gsm_instruction = " Think step by step and write the final answer after \"####\".";

static void gen_gsm(rng_state *r, const task_opts *o, task_item *it) {
    (void)o;
    int ni = (int)rng_range(r, 0, NAMES_N - 1);
    const char *N = k_names[ni], *p = k_he[ni] ? "he" : "she", *P = k_he[ni] ? "He" : "She";
    const char *item = k_items[rng_range(r, 0, ITEMS_N - 1)];
    char q[700], s[900], w1[32], w2[32];
    long long ans = 0;
    switch (rng_range(r, 0, 7)) {
    case 0: { /* buy then give away */
        long long a = rng_range(r, 5, 60), b = rng_range(r, 2, 40), sum = a + b, c = rng_range(r, 1, sum);
        ans = sum - c;
        snprintf(q, sizeof q, "%s has %lld %s. %s buys %lld more and then gives %lld to a friend. How many %s does %s have now?",
                 N, a, item, P, b, c, item, N);
        snprintf(s, sizeof s, "%s starts with %lld %s. After buying %lld more, %s has %lld + %lld = %lld %s. After giving away %lld, %s has %lld - %lld = %lld %s.",
                 N, a, item, b, p, a, b, sum, item, c, p, sum, c, ans, noun_n(w1, sizeof w1, ans, item));
        break;
    }
    case 1: { /* full boxes plus loose items */
        long long a = rng_range(r, 3, 48), b = rng_range(r, 2, 25), c = rng_range(r, 1, a - 1), m = a * b;
        ans = m + c;
        snprintf(q, sizeof q, "A box holds %lld %s. %s has %lld full boxes and %lld loose %s. How many %s does %s have in total?",
                 a, item, N, b, c, noun_n(w1, sizeof w1, c, item), item, N);
        snprintf(s, sizeof s, "The %lld boxes hold %lld * %lld = %lld %s. Adding the %lld loose %s gives %lld + %lld = %lld %s.",
                 b, b, a, m, item, c, c == 1 ? "one" : "ones", m, c, ans, item);
        break;
    }
    case 2: { /* wages */
        long long a = rng_range(r, 8, 40), b = rng_range(r, 2, 10), c = rng_range(r, 2, 7), d = a * b;
        ans = d * c;
        snprintf(q, sizeof q, "%s earns $%lld per hour. %s works %lld hours a day for %lld days. How many dollars does %s earn in total?",
                 N, a, P, b, c, N);
        snprintf(s, sizeof s, "Each day %s earns %lld * %lld = %lld dollars. Over %lld days that is %lld * %lld = %lld dollars.",
                 N, a, b, d, c, d, c, ans);
        break;
    }
    case 3: { /* sharing equally */
        long long b = rng_range(r, 2, 12), qq = rng_range(r, 2, 20), k = rng_range(r, 1, 15), rest = b * qq, a = rest + k;
        ans = qq;
        snprintf(q, sizeof q, "%s bakes %lld cookies, keeps %lld and shares the rest equally among %lld friends. How many cookies does each friend get?",
                 N, a, k, b);
        snprintf(s, sizeof s, "%s shares %lld - %lld = %lld cookies. Each of the %lld friends gets %lld / %lld = %lld cookies.",
                 N, a, k, rest, b, rest, b, ans);
        break;
    }
    case 4: { /* two-leg trip */
        long long a = rng_range(r, 20, 90), b = rng_range(r, 1, 6), c = rng_range(r, 20, 90), d = rng_range(r, 1, 6);
        long long x = a * b, y = c * d;
        ans = x + y;
        snprintf(q, sizeof q, "A train travels at %lld miles per hour for %lld %s, then at %lld miles per hour for %lld %s. How many miles does it travel in total?",
                 a, b, noun_n(w1, sizeof w1, b, "hours"), c, d, noun_n(w2, sizeof w2, d, "hours"));
        snprintf(s, sizeof s, "The first part is %lld * %lld = %lld miles. The second part is %lld * %lld = %lld miles. In total it travels %lld + %lld = %lld miles.",
                 a, b, x, c, d, y, x, y, ans);
        break;
    }
    case 5: { /* change from a bill */
        long long a = rng_range(r, 2, 12), b = rng_range(r, 1, 15), t = a * b;
        static const long long bills[] = {20, 50, 100, 200};
        int first = 0;
        while (bills[first] <= t) first++;
        long long c = bills[rng_range(r, first, 3)];
        ans = c - t;
        snprintf(q, sizeof q, "%s buys %lld notebooks at $%lld each and pays with a $%lld bill. How much change, in dollars, does %s get?",
                 N, a, b, c, N);
        snprintf(s, sizeof s, "The notebooks cost %lld * %lld = %lld dollars. The change is %lld - %lld = %lld %s.",
                 a, b, t, c, t, ans, noun_n(w1, sizeof w1, ans, "dollars"));
        break;
    }
    case 6: { /* percentages */
        long long k = rng_range(r, 1, 10), a = 20 * k, pc = 5 * rng_range(r, 1, 19), g = a * pc / 100;
        ans = a - g;
        snprintf(q, sizeof q, "There are %lld students in a class and %lld%% of them are girls. How many boys are in the class?",
                 a, pc);
        snprintf(s, sizeof s, "There are %lld * %lld / 100 = %lld %s, so there are %lld - %lld = %lld %s.",
                 a, pc, g, noun_n(w1, sizeof w1, g, "girls"), a, g, ans, noun_n(w2, sizeof w2, ans, "boys"));
        break;
    }
    default: { /* pages left */
        long long a = rng_range(r, 5, 40), t = 2 * a, sum = a + t, c = sum + rng_range(r, 1, 200);
        ans = c - sum;
        snprintf(q, sizeof q, "%s reads %lld pages of a %lld-page book on Monday and twice as many pages on Tuesday. How many pages are left to read?",
                 N, a, c);
        snprintf(s, sizeof s, "On Tuesday %s reads 2 * %lld = %lld pages. So far %s has read %lld + %lld = %lld pages, so %lld - %lld = %lld %s left.",
                 p, a, t, p, a, t, sum, c, sum, ans, ans == 1 ? "page is" : "pages are");
        break;
    }
    }
    snprintf(it->prompt, sizeof it->prompt, "%s%s", q, k_gsm_instruction);
    snprintf(it->truth, sizeof it->truth, "%lld", ans);
    snprintf(it->response, sizeof it->response, "%s\n#### %lld", s, ans);
}

/* ---- countdown */

typedef struct {
    int64_t v;
    char s[256];
    int prec; /* 3 atom, 2 * /, 1 + - */
} cd_node;

static int op_prec(char op) { return op == '+' || op == '-' ? 1 : 2; }

static void cd_combine(const cd_node *a, char op, const cd_node *b, int64_t v, cd_node *out) {
    int pr = op_prec(op);
    bool pa = a->prec < pr, pb = b->prec < pr || (b->prec == pr && (op == '-' || op == '/'));
    snprintf(out->s, sizeof out->s, "%s%.120s%s%c%s%.120s%s", pa ? "(" : "", a->s, pa ? ")" : "", op, pb ? "(" : "", b->s,
             pb ? ")" : "");
    out->v = v;
    out->prec = pr;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static void gen_countdown(rng_state *r, const task_opts *o, task_item *it) {
    int n = o->countdown_numbers;
    int64_t nums[8];
    cd_node nodes[8];
    memset(nodes, 0, sizeof nodes);
    for (;;) {
        for (int i = 0; i < n; i++) {
            nums[i] = rng_range(r, 1, o->countdown_max_number);
            nodes[i].v = nums[i];
            snprintf(nodes[i].s, sizeof nodes[i].s, "%lld", (long long)nums[i]);
            nodes[i].prec = 3;
        }
        int m = n;
        while (m > 1) {
            int i = (int)rng_range(r, 0, m - 1), j = (int)rng_range(r, 0, m - 2);
            if (j >= i) j++;
            cd_node a = nodes[i], b = nodes[j], c;
            char op = "+-*/"[rng_range(r, 0, 3)];
            if (op == '-' && a.v < b.v) { cd_node t = a; a = b; b = t; }
            if (op == '-' && a.v == b.v) op = '+';
            if (op == '/' && (b.v == 1 || a.v % b.v != 0)) op = '*';
            int64_t v = op == '+' ? a.v + b.v : op == '-' ? a.v - b.v : op == '*' ? a.v * b.v : a.v / b.v;
            cd_combine(&a, op, &b, v, &c);
            /* remove i and j, append c */
            int hi = i > j ? i : j, lo = i > j ? j : i;
            nodes[hi] = nodes[m - 1];
            nodes[lo] = nodes[m - 2];
            nodes[m - 2] = c;
            m--;
        }
        if (nodes[0].v >= 1 && nodes[0].v <= o->countdown_max_target) break;
    }
    int64_t target = nodes[0].v;
    MOERL_ASSERT(countdown_verify(nodes[0].s, nums, n, target) == CD_VALID);
    char list[128];
    size_t m = 0;
    for (int i = 0; i < n; i++) m += (size_t)snprintf(list + m, sizeof list - m, "%s%lld", i ? ", " : "", (long long)nums[i]);
    snprintf(it->prompt, sizeof it->prompt,
             "Using the numbers [%s], write an equation that equals %lld. You may use +, -, *, / and parentheses, "
             "and each number at most once. Answer with the equation only.",
             list, (long long)target);
    snprintf(it->truth, sizeof it->truth, "{\"target\":%lld,\"numbers\":[%s]}", (long long)target, list);
    it->truth_json = 1;
    snprintf(it->response, sizeof it->response, "%s", nodes[0].s);
    /* the same multiset of numbers with the same target is the same problem in any order */
    int64_t sorted[8];
    memcpy(sorted, nums, sizeof(int64_t) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(int64_t), cmp_i64);
    m = (size_t)snprintf(it->key, sizeof it->key, "%lld:", (long long)target);
    for (int i = 0; i < n; i++) m += (size_t)snprintf(it->key + m, sizeof it->key - m, "%lld,", (long long)sorted[i]);
}

/* ---- driver */

static const struct {
    const char *name;
    gen_fn fn;
} k_families[] = {
    {"arith", gen_arith},
    {"gsm8k-style", gen_gsm},
    {"countdown", gen_countdown},
};
#define FAMILIES_N (int)(sizeof k_families / sizeof k_families[0])

const char *const *task_families(int *n) {
    static const char *names[FAMILIES_N];
    for (int i = 0; i < FAMILIES_N; i++) names[i] = k_families[i].name;
    *n = FAMILIES_N;
    return names;
}

void task_opts_default(task_opts *o) {
    o->n_train = 1000;
    o->n_test = 100;
    o->seed = 1;
    o->arith_digits = 2;
    o->countdown_numbers = 4;
    o->countdown_max_number = 25;
    o->countdown_max_target = 100;
}

static int check_opts(const char *family, const task_opts *o) {
#define RANGE(field, lo, hi)                                                                               \
    if (o->field < (lo) || o->field > (hi))                                                                \
        return moerl_errorf("task '%s': option %s = %lld is out of range (expected %lld..%lld)", family, #field, \
                            (long long)o->field, (long long)(lo), (long long)(hi));
    RANGE(n_train, 0, 100000000)
    RANGE(n_test, 0, 100000000)
    if (strcmp(family, "arith") == 0) { RANGE(arith_digits, 1, 18) }
    if (strcmp(family, "countdown") == 0) {
        RANGE(countdown_numbers, 2, 6)
        RANGE(countdown_max_number, 1, 1000)
        RANGE(countdown_max_target, 1, 1000000)
    }
#undef RANGE
    return MOERL_OK;
}

/* Draw `count` items not yet in `seen` and write them as rows of split `split`. */
static int gen_split(const char *family, gen_fn fn, rng_state *r, const task_opts *o, strset *seen, int64_t count,
                     const char *split, const char *path, int raw_gsm8k) {
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f) return moerl_errorf("task '%s': cannot allocate the output buffer", family);
    int64_t tries = 0, max_tries = 50 * (o->n_train + o->n_test) + 10000;
    int rc = MOERL_OK;
    task_item it;
    for (int64_t i = 0; i < count && rc == MOERL_OK;) {
        if (++tries > max_tries) {
            rc = moerl_errorf("task '%s': could only draw %zu distinct problems of the %lld asked (n_train + n_test); "
                              "with these options the problem space is too small",
                              family, seen->n, (long long)(o->n_train + o->n_test));
            break;
        }
        memset(&it, 0, sizeof it);
        fn(r, o, &it);
        if (!strset_add(seen, it.key[0] ? it.key : it.prompt)) continue;
        if (raw_gsm8k) { /* openai/gsm8k's row: the question alone, the worked answer ending "#### N" */
            size_t pl = strlen(it.prompt), il = strlen(k_gsm_instruction);
            if (pl >= il && !strcmp(it.prompt + pl - il, k_gsm_instruction)) it.prompt[pl - il] = 0;
            json_t *j = json_object();
            json_object_set_new(j, "question", json_string(it.prompt));
            json_object_set_new(j, "answer", json_string(it.response));
            char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
            json_decref(j);
            fprintf(f, "%s\n", line);
            free(line);
            i++;
            continue;
        }
        chat_msg msg = {"user", it.prompt};
        char extra[128];
        snprintf(extra, sizeof extra, "{\"split\":\"%s\",\"index\":%lld}", split, (long long)i);
        ds_row row = {.data_source = (char *)family,
                      .prompt = &msg,
                      .n_prompt = 1,
                      .ground_truth = it.truth,
                      .ground_truth_json = it.truth_json,
                      .extra_info_json = extra,
                      .response = it.response};
        rc = dataset_write_row(f, &row);
        i++;
    }
    fclose(f);
    if (rc == MOERL_OK) {
        char *dir = xstrdup(path), *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
            *slash = 0;
            rc = moerl_mkdirs(dir);
        }
        free(dir);
        if (rc == MOERL_OK) rc = moerl_write_file_atomic(path, buf, blen);
        if (rc) moerl_error_prefix("task '%s': writing %s: ", family, path);
    }
    free(buf);
    return rc;
}

static int task_generate_impl(const char *family, const task_opts *o, const char *train_path, const char *test_path,
                              int raw_gsm8k) {
    gen_fn fn = NULL;
    for (int i = 0; i < FAMILIES_N; i++)
        if (strcmp(k_families[i].name, family) == 0) fn = k_families[i].fn;
    if (!fn) return moerl_errorf("unknown task family '%s' (known: arith, gsm8k-style, countdown)", family);
    if (check_opts(family, o)) return MOERL_ERR;
    rng_state r;
    rng_seed(&r, o->seed);
    strset seen;
    strset_init(&seen, (size_t)(o->n_train + o->n_test));
    int rc = gen_split(family, fn, &r, o, &seen, o->n_test, "test", test_path, raw_gsm8k);
    if (rc == MOERL_OK) rc = gen_split(family, fn, &r, o, &seen, o->n_train, "train", train_path, raw_gsm8k);
    strset_free(&seen);
    return rc;
}

int task_generate(const char *family, const task_opts *o, const char *train_path, const char *test_path) {
    return task_generate_impl(family, o, train_path, test_path, 0);
}

int task_generate_gsm8k_raw(const task_opts *o, const char *train_path, const char *test_path) {
    return task_generate_impl("gsm8k-style", o, train_path, test_path, 1);
}

/* ---- openai/gsm8k rows → verl rows (verl examples/data_preprocess/gsm8k.py) */

static const char *k_verl_gsm8k_instruction = "Let's think step by step and output the final answer after \"####\".";

/* verl's extract_solution: the first match of "#### (\-?[0-9\.\,]+)", commas removed. */
static int gsm8k_solution(const char *answer, char *out, size_t cap) {
    for (const char *p = strstr(answer, "#### "); p; p = strstr(p + 1, "#### ")) {
        const char *q = p + 5;
        size_t k = 0, n = 0;
        if (*q == '-') out[k++] = *q++, n++;
        for (; *q && (isdigit((unsigned char)*q) || *q == '.' || *q == ','); q++, n++)
            if (*q != ',' && k + 1 < cap) out[k++] = *q;
        if (n > (size_t)(p[5] == '-')) {
            out[k] = 0;
            return 1;
        }
        k = 0;
    }
    return 0;
}

int gsm8k_convert(const char *in_path, const char *out_path, const char *split, int64_t *n_rows) {
    char *text = NULL;
    size_t len = 0;
    if (moerl_read_file(in_path, &text, &len) != MOERL_OK) return MOERL_ERR;
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f) {
        free(text);
        return moerl_errorf("gsm8k '%s': cannot allocate the output buffer", in_path);
    }
    int rc = MOERL_OK;
    int64_t line_no = 0, n = 0;
    for (char *line = text; line && *line && rc == MOERL_OK;) {
        char *nl = memchr(line, '\n', len - (size_t)(line - text));
        size_t ll = nl ? (size_t)(nl - line) : len - (size_t)(line - text);
        line_no++;
        char *next = nl ? nl + 1 : NULL;
        size_t blank = 0;
        while (blank < ll && isspace((unsigned char)line[blank])) blank++;
        if (blank == ll) {
            line = next;
            continue;
        }
        json_error_t jerr;
        json_t *j = json_loadb(line, ll, 0, &jerr);
        if (!j || !json_is_object(j)) {
            rc = moerl_errorf("%s:%lld: not a JSON object%s%s", in_path, (long long)line_no, j ? "" : ": ",
                              j ? "" : jerr.text);
            json_decref(j);
            break;
        }
        json_t *jq = json_object_get(j, "question"), *ja = json_object_get(j, "answer");
        char sol[64];
        if (!json_is_string(jq) || !json_is_string(ja)) {
            rc = moerl_errorf("%s:%lld: field '%s': expected a string (openai/gsm8k rows are {\"question\": ..., "
                              "\"answer\": ...})", in_path, (long long)line_no,
                              json_is_string(jq) ? "answer" : "question");
        } else if (!gsm8k_solution(json_string_value(ja), sol, sizeof sol)) {
            rc = moerl_errorf("%s:%lld: field 'answer': no final answer after \"#### \" (expected the solution to end "
                              "with \"#### <number>\")", in_path, (long long)line_no);
        } else {
            const char *question = json_string_value(jq);
            size_t ql = strlen(question) + strlen(k_verl_gsm8k_instruction) + 2;
            char *content = xmalloc(ql);
            snprintf(content, ql, "%s %s", question, k_verl_gsm8k_instruction);
            chat_msg msg = {"user", content};
            json_t *ex = json_object();
            json_object_set_new(ex, "split", json_string(split));
            json_object_set_new(ex, "index", json_integer(n));
            json_object_set_new(ex, "answer", json_incref(ja));
            json_object_set_new(ex, "question", json_incref(jq));
            char *extra = json_dumps(ex, JSON_COMPACT | JSON_PRESERVE_ORDER);
            json_decref(ex);
            ds_row row = {.data_source = "openai/gsm8k",
                          .prompt = &msg,
                          .n_prompt = 1,
                          .ground_truth = sol,
                          .extra_info_json = extra,
                          .response = (char *)json_string_value(ja)};
            rc = dataset_write_row(f, &row);
            if (rc) moerl_error_prefix("%s:%lld: ", in_path, (long long)line_no);
            free(extra);
            free(content);
            n++;
        }
        json_decref(j);
        line = next;
    }
    fclose(f);
    free(text);
    if (rc == MOERL_OK && n == 0) rc = moerl_errorf("gsm8k '%s': no rows", in_path);
    if (rc == MOERL_OK) rc = moerl_write_file_atomic(out_path, buf, blen);
    free(buf);
    if (rc == MOERL_OK && n_rows) *n_rows = n;
    return rc;
}
