/* moerl — the math-answer verifier (see math_answer.h for the rules).
 *
 * Sources for the semantics (ideas only, no code taken): verl/utils/reward_score/math.py (Hendrycks
 * MATH: last_boxed_only_string, strip_string, is_equiv), verl/utils/reward_score/math_dapo.py.
 * Strings are byte strings (UTF-8 passes through; only ASCII characters have a meaning).
 */
#include "data/math_answer.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/strbuf.h"

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_dig(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* A copy of s[a, b) without surrounding whitespace; NULL when that is empty. */
static char *trimmed_or_null(const char *s, size_t a, size_t b) {
    while (a < b && is_ws(s[a])) a++;
    while (b > a && is_ws(s[b - 1])) b--;
    if (a == b) return NULL;
    char *r = xmalloc(b - a + 1);
    memcpy(r, s + a, b - a);
    r[b - a] = 0;
    return r;
}

/* Index of the '}' matching the '{' at s[open], or SIZE_MAX when unbalanced. */
static size_t match_brace(const char *s, size_t open) {
    int depth = 0;
    for (size_t i = open; s[i]; i++) {
        if (s[i] == '{') depth++;
        else if (s[i] == '}' && --depth == 0) return i;
    }
    return SIZE_MAX;
}

/* ------------------------------------------------------------------ extraction */

/* Rule 1: the last \boxed / \fbox followed by '{' or ' '. */
static char *extract_box(const char *s) {
    static const char *const cmds[] = {"\\boxed", "\\fbox"};
    size_t best = SIZE_MAX, best_len = 0;
    for (int c = 0; c < 2; c++) {
        size_t L = strlen(cmds[c]);
        for (const char *p = strstr(s, cmds[c]); p; p = strstr(p + 1, cmds[c])) {
            char nx = p[L];
            size_t at = (size_t)(p - s);
            if ((nx == '{' || nx == ' ') && (best == SIZE_MAX || at > best)) {
                best = at;
                best_len = L;
            }
        }
    }
    if (best == SIZE_MAX) return NULL;
    size_t i = best + best_len;
    while (s[i] == ' ') i++;
    if (s[i] == '{') {
        size_t j = match_brace(s, i);
        if (j == SIZE_MAX) return NULL;
        return trimmed_or_null(s, i + 1, j);
    }
    size_t j = i;
    while (s[j] && !is_ws(s[j]) && s[j] != '$') j++;
    return trimmed_or_null(s, i, j);
}

/* Rule 2: the rest of the line after the last "####". */
static char *extract_hashes(const char *s) {
    const char *last = NULL;
    for (const char *p = strstr(s, "####"); p; p = strstr(p + 1, "####")) last = p;
    if (!last) return NULL;
    size_t a = (size_t)(last - s) + 4, b = a;
    while (s[b] && s[b] != '\n') b++;
    return trimmed_or_null(s, a, b);
}

/* Rule 3: the rest of the line after the last "answer is" / "answer:" (any case), cut at ". ". */
static char *extract_answer_is(const char *s) {
    static const char *const pats[] = {"answer is", "answer:"};
    size_t best = SIZE_MAX, best_len = 0;
    for (size_t i = 0; s[i]; i++)
        for (int k = 0; k < 2; k++) {
            size_t L = strlen(pats[k]);
            if (strncasecmp(s + i, pats[k], L) == 0) {
                best = i;
                best_len = L;
            }
        }
    if (best == SIZE_MAX) return NULL;
    size_t a = best + best_len;
    while (s[a] == ' ' || s[a] == '\t' || s[a] == ':') a++;
    size_t b = a;
    while (s[b] && s[b] != '\n' && !(s[b] == '.' && s[b + 1] == ' ')) b++;
    return trimmed_or_null(s, a, b);
}

/* Rule 4: the last number: [-]digits(,ddd)*(.digits)?, the sign only when the '-' does not follow
 * a letter, digit or ')'. */
static char *extract_last_number(const char *s) {
    size_t best_a = SIZE_MAX, best_b = 0;
    size_t i = 0;
    while (s[i]) {
        if (!is_dig(s[i]) || (i > 0 && is_dig(s[i - 1]))) { i++; continue; }
        size_t j = i;
        while (is_dig(s[j])) j++;
        while (s[j] == ',' && is_dig(s[j + 1]) && is_dig(s[j + 2]) && is_dig(s[j + 3]) && !is_dig(s[j + 4])) j += 4;
        if (s[j] == '.' && is_dig(s[j + 1])) {
            j++;
            while (is_dig(s[j])) j++;
        }
        size_t a = i;
        if (i > 0 && s[i - 1] == '-' && (i < 2 || !(is_alpha(s[i - 2]) || is_dig(s[i - 2]) || s[i - 2] == ')'))) a = i - 1;
        best_a = a;
        best_b = j;
        i = j;
    }
    return best_a == SIZE_MAX ? NULL : trimmed_or_null(s, best_a, best_b);
}

char *math_answer_extract(const char *response) {
    char *r = extract_box(response);
    if (!r) r = extract_hashes(response);
    if (!r) r = extract_answer_is(response);
    if (!r) r = extract_last_number(response);
    return r;
}

/* ------------------------------------------------------------------ normalisation */

/* s with every occurrence of `from` replaced by `to`; when cmd is true, an occurrence followed by
 * a letter is kept (so "\left" does not match "\leftarrow"). Frees s. */
static char *replace_all(char *s, const char *from, const char *to, bool cmd) {
    strbuf b = {0};
    size_t L = strlen(from);
    for (size_t i = 0; s[i];) {
        if (strncmp(s + i, from, L) == 0 && !(cmd && is_alpha(s[i + L]))) {
            strbuf_puts(&b, to);
            i += L;
        } else {
            strbuf_putn(&b, s + i, 1);
            i++;
        }
    }
    free(s);
    return strbuf_take(&b);
}

/* The length of the \text{, \textbf{ or \mbox{ group starting at s[i] (through its '}'), or 0. */
static size_t text_group_at(const char *s, size_t i) {
    static const char *const cmds[] = {"\\text{", "\\textbf{", "\\mbox{"};
    for (int k = 0; k < 3; k++) {
        size_t L = strlen(cmds[k]);
        if (strncmp(s + i, cmds[k], L) != 0) continue;
        size_t j = match_brace(s, i + L - 1);
        return j == SIZE_MAX ? 0 : j + 1 - i;
    }
    return 0;
}

/* Units: while the answer ends with a text group that follows non-blank text, the group is cut;
 * then every remaining text group is unwrapped (replaced by its content). Frees s. */
static char *drop_text_groups(char *s) {
    for (bool cut = true; cut;) {
        cut = false;
        size_t end = strlen(s);
        while (end > 0 && (is_ws(s[end - 1]) || s[end - 1] == '.')) end--;
        for (size_t i = 0; i < end && !cut; i++) {
            size_t g = text_group_at(s, i);
            size_t k = 0;
            while (k < i && is_ws(s[k])) k++;
            if (g && i + g == end && k < i) {
                s[i] = 0;
                cut = true;
            }
        }
    }
    strbuf o = {0};
    for (size_t i = 0; s[i];) {
        size_t g = text_group_at(s, i);
        if (g) {
            const char *open = strchr(s + i, '{');
            strbuf_putn(&o, open + 1, (size_t)(s + i + g - 1 - (open + 1)));
            i += g;
        } else {
            strbuf_putn(&o, s + i, 1);
            i++;
        }
    }
    free(s);
    return strbuf_take(&o);
}

/* "A B/C" (integers, whitespace between A and B) → "A\frac{B}{C}"; else s. Frees s. */
static char *mixed_with_space(char *s) {
    size_t a = 0, b = strlen(s);
    while (a < b && is_ws(s[a])) a++;
    while (b > a && is_ws(s[b - 1])) b--;
    size_t i = a + (s[a] == '-'), i0 = i;
    while (i < b && is_dig(s[i])) i++;
    size_t int_end = i;
    if (i == i0 || i >= b || !is_ws(s[i])) return s;
    while (i < b && is_ws(s[i])) i++;
    size_t n0 = i;
    while (i < b && is_dig(s[i])) i++;
    size_t n1 = i;
    if (n1 == n0 || i >= b || s[i] != '/') return s;
    size_t d0 = ++i;
    while (i < b && is_dig(s[i])) i++;
    if (i == d0 || i != b) return s;
    size_t cap = (b - a) + 16;
    char *o = xmalloc(cap);
    snprintf(o, cap, "%.*s\\frac{%.*s}{%.*s}", (int)(int_end - a), s + a, (int)(n1 - n0), s + n0, (int)(b - d0), s + d0);
    free(s);
    return o;
}

/* Remove all whitespace. Frees s. */
static char *drop_ws(char *s) {
    size_t m = 0;
    for (size_t i = 0; s[i]; i++)
        if (!is_ws(s[i])) s[m++] = s[i];
    s[m] = 0;
    return s;
}

/* The whole of s is [-]ddd(,ddd)+(.d+)? with a first group of 1 to 3 digits: drop the commas. */
static void drop_thousands(char *s) {
    size_t i = s[0] == '-', g = 0;
    while (is_dig(s[i + g])) g++;
    if (g < 1 || g > 3) return;
    i += g;
    int groups = 0;
    while (s[i] == ',' && is_dig(s[i + 1]) && is_dig(s[i + 2]) && is_dig(s[i + 3])) {
        i += 4;
        groups++;
    }
    if (groups == 0) return;
    if (s[i] == '.' && is_dig(s[i + 1])) {
        i++;
        while (is_dig(s[i])) i++;
    }
    if (s[i]) return;
    size_t m = 0;
    for (size_t k = 0; s[k]; k++)
        if (s[k] != ',') s[m++] = s[k];
    s[m] = 0;
}

/* Bytes of the UTF-8 character starting at s (1 for ASCII or a stray byte). */
static size_t utf8_len(const char *s) {
    size_t n = 1;
    while (s[n] && ((unsigned char)s[n] & 0xC0) == 0x80) n++;
    return ((unsigned char)s[0] & 0x80) ? n : 1;
}

static void shorthand_into(strbuf *o, const char *s, size_t a, size_t b);

/* The arguments of a "\frac" whose name ends at s[i]: "{..}" groups (their text rewritten
 * recursively) or single characters (wrapped in braces). Returns the index after them. */
static size_t frac_args(strbuf *o, const char *s, size_t i, size_t b) {
    for (int k = 0; k < 2 && i < b; k++) {
        if (s[i] == '{') {
            size_t j = match_brace(s, i);
            if (j == SIZE_MAX || j >= b) break;
            strbuf_puts(o, "{");
            shorthand_into(o, s, i + 1, j);
            strbuf_puts(o, "}");
            i = j + 1;
        } else if (s[i] == '\\') {
            break;
        } else {
            size_t L = utf8_len(s + i);
            strbuf_puts(o, "{");
            strbuf_putn(o, s + i, L);
            strbuf_puts(o, "}");
            i += L;
        }
    }
    return i;
}

/* s[a, b) with "\frac12" → "\frac{1}{2}" and "\sqrt2" → "\sqrt{2}" into o. */
static void shorthand_into(strbuf *o, const char *s, size_t a, size_t b) {
    size_t i = a;
    while (i < b) {
        if (b - i >= 5 && strncmp(s + i, "\\frac", 5) == 0) {
            strbuf_puts(o, "\\frac");
            i = frac_args(o, s, i + 5, b);
        } else if (b - i >= 5 && strncmp(s + i, "\\sqrt", 5) == 0) {
            strbuf_puts(o, "\\sqrt");
            i += 5;
            if (i < b && s[i] != '{' && s[i] != '[' && s[i] != '\\') {
                size_t L = utf8_len(s + i);
                strbuf_puts(o, "{");
                strbuf_putn(o, s + i, L);
                strbuf_puts(o, "}");
                i += L;
            }
        } else {
            strbuf_putn(o, s + i, 1);
            i++;
        }
    }
}

char *math_answer_normalize(const char *answer) {
    static const char *const drops[] = {"\\!", "\\,", "\\;", "\\:", "\\ ", "\\%", "%", "\\$", "$", "^{\\circ}", "^\\circ"};
    char *s = xstrdup(answer);
    s = replace_all(s, "\\left", "", true);
    s = replace_all(s, "\\right", "", true);
    s = replace_all(s, "\\dfrac", "\\frac", false);
    s = replace_all(s, "\\tfrac", "\\frac", false);
    for (size_t k = 0; k < sizeof drops / sizeof drops[0]; k++) s = replace_all(s, drops[k], "", false);
    s = drop_text_groups(s);
    s = mixed_with_space(s);
    s = drop_ws(s);
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '.') s[--n] = 0;
    drop_thousands(s);
    char *eq = strchr(s, '=');
    int before = 0; /* characters (not bytes) before the '=' */
    for (const char *p = s; eq && p < eq; p++) before += ((unsigned char)*p & 0xC0) != 0x80;
    if (eq && !strchr(eq + 1, '=') && before <= 2) memmove(s, eq + 1, strlen(eq + 1) + 1);
    strbuf o = {0};
    shorthand_into(&o, s, 0, strlen(s));
    free(s);
    return strbuf_take(&o);
}

/* ------------------------------------------------------------------ exact rationals */

typedef __int128 i128;
#define DEC_MAX 1000000000000000000LL /* 10^18: decimals have at most 18 digits */

/* A decimal D at s[*i]: digits ('.' digits)? or '.' digits; value p / q. At most 18 digits once
 * the fraction's trailing zeros are dropped. */
static bool parse_dec(const char *s, size_t *i, i128 *p, i128 *q) {
    size_t j = *i, i0 = *i, i1, f0 = 0, f1 = 0;
    while (is_dig(s[j])) j++;
    i1 = j;
    if (s[j] == '.') {
        f0 = ++j;
        while (is_dig(s[j])) j++;
        f1 = j;
    }
    if (i1 == i0 && f1 == f0) return false;
    while (f1 > f0 && s[f1 - 1] == '0') f1--;
    i128 v = 0, d = 1;
    for (size_t k = i0; k < i1; k++)
        if ((v = v * 10 + (s[k] - '0')) >= DEC_MAX) return false;
    for (size_t k = f0; k < f1; k++) {
        v = v * 10 + (s[k] - '0');
        d *= 10;
        if (v >= DEC_MAX || k - f0 >= 18) return false;
    }
    *p = v;
    *q = d;
    *i = j;
    return true;
}

/* An integer I at s[*i]. */
static bool parse_int(const char *s, size_t *i, i128 *v) {
    size_t j = *i;
    *v = 0;
    while (is_dig(s[j])) {
        *v = *v * 10 + (s[j++] - '0');
        if (*v >= DEC_MAX) return false;
    }
    if (j == *i) return false;
    *i = j;
    return true;
}

static bool expect(const char *s, size_t *i, const char *lit) {
    size_t L = strlen(lit);
    if (strncmp(s + *i, lit, L) != 0) return false;
    *i += L;
    return true;
}

static i128 gcd128(i128 a, i128 b) {
    if (a < 0) a = -a;
    if (b < 0) b = -b;
    while (b) {
        i128 t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* [-]D, [-]D/D, [-]\frac{[-]D}{[-]D}, [-]I\frac{I}{I} as a reduced p/q (q > 0) fitting int64. */
static bool parse_rational(const char *s, int64_t *pn, int64_t *qn) {
    size_t i = 0;
    bool neg = s[0] == '-';
    i += neg;
    i128 p, q, a, b, c, d;
    size_t j = i;
    bool ok = false;
    if (parse_int(s, &j, &a) && expect(s, &j, "\\frac{") && parse_int(s, &j, &b) && expect(s, &j, "}{") &&
        parse_int(s, &j, &c) && expect(s, &j, "}") && !s[j]) {
        p = a * c + b, q = c, ok = true;
    }
    if (!ok && (j = i, expect(s, &j, "\\frac{"))) {
        bool na = s[j] == '-';
        j += na;
        if (parse_dec(s, &j, &a, &b) && expect(s, &j, "}{")) {
            bool nb = s[j] == '-';
            j += nb;
            if (parse_dec(s, &j, &c, &d) && expect(s, &j, "}") && !s[j]) {
                p = a * d * (na != nb ? -1 : 1), q = b * c, ok = true;
            }
        }
    }
    if (!ok && (j = i, parse_dec(s, &j, &a, &b))) {
        if (!s[j]) p = a, q = b, ok = true;
        else if (s[j] == '/' && (j++, parse_dec(s, &j, &c, &d)) && !s[j]) p = a * d, q = b * c, ok = true;
    }
    if (!ok || q == 0) return false;
    if (q < 0) p = -p, q = -q;
    if (neg) p = -p;
    i128 g = gcd128(p, q);
    if (g > 1) p /= g, q /= g;
    const i128 lim = INT64_MAX;
    if (p > lim || p < -lim || q > lim) return false;
    *pn = (int64_t)p;
    *qn = (int64_t)q;
    return true;
}

/* ------------------------------------------------------------------ equivalence */

/* Split a list ("(a,b]", "[a,b]", "a,b"): brackets (0 when none) and the elements' bounds
 * (at most cap; returns their count, ≥ 2 for a list, else 0). */
static int split_list(const char *s, char *open, char *close, size_t *st, size_t *en, int cap) {
    size_t n = strlen(s), a = 0, b = n;
    *open = *close = 0;
    if (n >= 2 && (s[0] == '(' || s[0] == '[') && (s[n - 1] == ')' || s[n - 1] == ']')) {
        *open = s[0];
        *close = s[n - 1];
        a = 1;
        b = n - 1;
    }
    int depth = 0, k = 0;
    size_t from = a;
    for (size_t i = a; i < b; i++) {
        char c = s[i];
        if (c == '(' || c == '[' || c == '{') depth++;
        else if (c == ')' || c == ']' || c == '}') depth--;
        else if (c == ',' && depth == 0) {
            if (k + 1 >= cap) return 0;
            st[k] = from, en[k++] = i;
            from = i + 1;
        }
    }
    if (k == 0) return 0;
    st[k] = from, en[k++] = b;
    return k;
}

#define LIST_CAP 64

static bool lists_equal(const char *a, const char *b) {
    size_t sa[LIST_CAP], ea[LIST_CAP], sb[LIST_CAP], eb[LIST_CAP];
    char oa, ca, ob, cb;
    int na = split_list(a, &oa, &ca, sa, ea, LIST_CAP), nb = split_list(b, &ob, &cb, sb, eb, LIST_CAP);
    if (na == 0 || nb == 0 || na != nb || oa != ob || ca != cb) return false;
    for (int k = 0; k < na; k++) {
        char *x = trimmed_or_null(a, sa[k], ea[k]), *y = trimmed_or_null(b, sb[k], eb[k]);
        bool eq = x && y ? math_answer_equal(x, y) : (!x && !y);
        free(x);
        free(y);
        if (!eq) return false;
    }
    return true;
}

bool math_answer_equal(const char *a, const char *b) {
    if (strcmp(a, b) == 0) return true;
    int64_t pa, qa, pb, qb;
    bool ra = parse_rational(a, &pa, &qa), rb = parse_rational(b, &pb, &qb);
    if (ra && rb) return pa == pb && qa == qb;
    if (ra || rb) return false;
    return lists_equal(a, b);
}

char *math_answer_canonical(const char *normalized) {
    int64_t p, q;
    if (!parse_rational(normalized, &p, &q)) return xstrdup(normalized);
    char buf[64];
    if (q == 1) snprintf(buf, sizeof buf, "%lld", (long long)p);
    else snprintf(buf, sizeof buf, "%lld/%lld", (long long)p, (long long)q);
    return xstrdup(buf);
}

int math_answer_score(const char *response, const char *ground_truth, double *score, char **pred) {
    *score = 0.0;
    if (pred) *pred = NULL;
    char *gbox = extract_box(ground_truth);
    char *gt = math_answer_normalize(gbox ? gbox : ground_truth);
    free(gbox);
    if (!gt[0]) {
        free(gt);
        return moerl_errorf("math ground truth '%.100s' is empty after normalisation (expected an answer such as "
                            "\"\\frac{1}{2}\" or \"42\")", ground_truth);
    }
    char *ans = math_answer_extract(response);
    char *n = ans ? math_answer_normalize(ans) : NULL;
    free(ans);
    if (n && n[0]) {
        if (math_answer_equal(n, gt)) *score = 1.0;
        if (pred) *pred = math_answer_canonical(n);
    }
    free(n);
    free(gt);
    return MOERL_OK;
}
