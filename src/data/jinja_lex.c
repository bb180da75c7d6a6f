/* moerl — Jinja: arena, preprocessing and tokens (see jinja_internal.h).
 *
 * Preprocessing as transformers configures Jinja2 for chat templates (and as @huggingface/jinja
 * reproduces it): one trailing newline dropped; lstrip_blocks (spaces and tabs before a block or
 * comment tag at the start of a line removed); trim_blocks (the newline after "%}", "#}" and
 * "-}" removed); {% generation %} / {% endgeneration %} tags removed. Each byte of the result
 * remembers its source offset, so messages name the template's own line.
 */
#include <stdarg.h>
#include <string.h>

#include "base/common.h"
#include "data/jinja_internal.h"

struct jblk {
    jblk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->used + n > a->head->cap) {
        size_t cap = n > 65536 ? n : 65536;
        jblk *b = xmalloc(sizeof(jblk) + cap);
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

char *ja_strdup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ja_free(jarena *a) {
    for (jblk *b = a->head; b;) {
        jblk *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
}

size_t jutf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static uint32_t utf8_cp(const unsigned char *s, size_t n, size_t *len) {
    size_t l = jutf8_len(s[0]);
    if (l > n) l = n;
    *len = l;
    if (l == 1) return s[0];
    if (l == 2) return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    if (l == 3) return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

/* JavaScript's \s and String#trim set: WhiteSpace and LineTerminator. */
static bool js_space_cp(uint32_t c) {
    return c == 9 || c == 10 || c == 11 || c == 12 || c == 13 || c == 32 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000 || c == 0xFEFF;
}

size_t jjs_space_len(const char *s, size_t n) {
    if (!n) return 0;
    size_t l;
    uint32_t c = utf8_cp((const unsigned char *)s, n, &l);
    return js_space_cp(c) ? l : 0;
}

size_t jjs_space_len_back(const char *s, size_t n) {
    if (!n) return 0;
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80 && n - i < 4) i--;
    size_t l;
    uint32_t c = utf8_cp((const unsigned char *)s + i, n - i, &l);
    return (l == n - i && js_space_cp(c)) ? l : 0;
}

size_t jutf16_len(const char *s, size_t n) {
    size_t u = 0;
    for (size_t i = 0; i < n;) {
        size_t l = jutf8_len((unsigned char)s[i]);
        u += l == 4 ? 2 : 1;
        i += l;
    }
    return u;
}

/* ---- preprocessing -------------------------------------------------------------------- */
typedef struct {
    char *s;
    int *off; /* source offset of each byte */
    size_t n;
} ptext;

static bool line_start(const char *s, size_t i) {
    if (i == 0) return true;
    if (s[i - 1] == '\n' || s[i - 1] == '\r') return true;
    return i >= 3 && (unsigned char)s[i - 3] == 0xE2 && (unsigned char)s[i - 2] == 0x80 &&
           ((unsigned char)s[i - 1] == 0xA8 || (unsigned char)s[i - 1] == 0xA9);
}

/* lstrip_blocks then trim_blocks, each a pass over the text as the two regular expressions. */
static void pre_strip(ptext *p) {
    size_t w = 0;
    for (size_t i = 0; i < p->n;) {
        if (line_start(p->s, w)) { /* the output so far ends as the source before i does */
            size_t j = i;
            while (j < p->n && (p->s[j] == ' ' || p->s[j] == '\t')) j++;
            if (j > i && j + 1 < p->n && p->s[j] == '{' && strchr("#%-", p->s[j + 1])) i = j;
        }
        p->s[w] = p->s[i];
        p->off[w++] = p->off[i++];
    }
    p->n = w;
    w = 0;
    for (size_t i = 0; i < p->n;) {
        if (i + 2 < p->n && strchr("#%-", p->s[i]) && p->s[i] && p->s[i + 1] == '}' && p->s[i + 2] == '\n') {
            p->s[w] = p->s[i], p->off[w++] = p->off[i];
            p->s[w] = p->s[i + 1], p->off[w++] = p->off[i + 1];
            i += 3;
            continue;
        }
        p->s[w] = p->s[i];
        p->off[w++] = p->off[i++];
    }
    p->n = w;
}

/* A {% generation %} / {% endgeneration %} tag at i: its end, whether it strips left/right. */
static size_t gen_tag(const ptext *p, size_t i, bool *lstrip, bool *rstrip) {
    const char *s = p->s;
    size_t n = p->n, j = i + 2, l;
    if (j > n || s[i] != '{' || s[i + 1] != '%') return 0;
    *lstrip = j < n && s[j] == '-';
    if (*lstrip) j++;
    while ((l = jjs_space_len(s + j, n - j))) j += l;
    if (n - j >= 3 && !memcmp(s + j, "end", 3)) j += 3;
    if (n - j < 10 || memcmp(s + j, "generation", 10)) return 0;
    j += 10;
    while ((l = jjs_space_len(s + j, n - j))) j += l;
    *rstrip = j < n && s[j] == '-';
    if (*rstrip) j++;
    if (n - j < 2 || s[j] != '%' || s[j + 1] != '}') return 0;
    return j + 2;
}

/* As the regular expression /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/g replaced by
 * (lstrip ? "" : before) + (rstrip ? "" : after): a tag's whitespace reaches back only to the
 * end of the previous tag's match, which includes the whitespace after it. */
static void pre_generation(ptext *p) {
    size_t w = 0, l, floor = 0;
    for (size_t i = 0; i < p->n;) {
        bool ls, rs;
        size_t e = gen_tag(p, i, &ls, &rs);
        if (!e) {
            p->s[w] = p->s[i];
            p->off[w++] = p->off[i++];
            continue;
        }
        if (ls)
            while (w > floor && (l = jjs_space_len_back(p->s + floor, w - floor))) w -= l;
        i = e;
        while ((l = jjs_space_len(p->s + i, p->n - i)))
            for (size_t k = 0; k < l; k++, i++)
                if (!rs) p->s[w] = p->s[i], p->off[w++] = p->off[i];
        floor = w;
    }
    p->n = w;
}

/* ---- tokens --------------------------------------------------------------------------- */
typedef struct {
    jarena *a;
    const char *name;
    int *lines; /* line number of each source offset */
    ptext p;
    size_t i;
    jtok *t;
    int n, cap;
    int brace_depth;
    char err[256];
} lexer;

static int line_of(const lexer *L, size_t pos) {
    int off = pos < L->p.n ? L->p.off[pos] : (L->p.n ? L->p.off[L->p.n - 1] : 0);
    return L->lines[off];
}

static int lex_err(lexer *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lex_err(lexer *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err, sizeof L->err, fmt, ap);
    va_end(ap);
    return moerl_errorf("%s:%d: %s", L->name, line_of(L, L->i), L->err);
}

static void push(lexer *L, jtok_type ty, const char *s, size_t n, size_t pos) {
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 256;
        jtok *t = ja_alloc(L->a, cap * sizeof *t);
        if (L->n) memcpy(t, L->t, L->n * sizeof *t);
        L->t = t;
        L->cap = cap;
    }
    jtok *t = &L->t[L->n++];
    t->type = ty;
    t->s = ja_strdup(L->a, s, n);
    t->n = n;
    t->line = line_of(L, pos);
}

static jtok_type last_type(const lexer *L) { return L->n ? L->t[L->n - 1].type : TK_EOF; }

static void strip_trailing(lexer *L) {
    if (!L->n || L->t[L->n - 1].type != TK_TEXT) return;
    jtok *t = &L->t[L->n - 1];
    size_t l;
    while ((l = jjs_space_len_back(t->s, t->n))) t->n -= l;
    ((char *)t->s)[t->n] = 0;
    if (!t->n) L->n--;
}

static void skip_space(lexer *L) {
    size_t l;
    while ((l = jjs_space_len(L->p.s + L->i, L->p.n - L->i))) L->i += l;
}

static void put_utf8(char *o, size_t *k, uint32_t c) {
    if (c < 0x80) o[(*k)++] = (char)c;
    else if (c < 0x800) o[(*k)++] = (char)(0xC0 | c >> 6), o[(*k)++] = (char)(0x80 | (c & 63));
    else o[(*k)++] = (char)(0xE0 | c >> 12), o[(*k)++] = (char)(0x80 | ((c >> 6) & 63)), o[(*k)++] = (char)(0x80 | (c & 63));
}

/* A quoted string at L->i (the opening quote). */
static int lex_string(lexer *L) {
    const char *s = L->p.s;
    size_t n = L->p.n, start = L->i;
    char q = s[L->i++];
    char *o = xmalloc(n - L->i + 1);
    size_t k = 0;
    while (L->i < n && s[L->i] != q) {
        char ch = s[L->i++];
        if (ch != '\\') { o[k++] = ch; continue; }
        if (L->i >= n) break;
        char e = s[L->i++];
        if (e == 'x' || e == 'u') {
            size_t hl = e == 'x' ? 2 : 4;
            unsigned v = 0;
            for (size_t h = 0; h < hl; h++) {
                char d = L->i + h < n ? s[L->i + h] : 0;
                int dv = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10 : d >= 'A' && d <= 'F' ? d - 'A' + 10 : -1;
                if (dv < 0) { free(o); return lex_err(L, "invalid hexadecimal escape sequence \\%c in a string literal", e); }
                v = v * 16 + (unsigned)dv;
            }
            L->i += hl;
            put_utf8(o, &k, v);
            continue;
        }
        const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
        const char *f = strchr(from, e);
        if (!e || !f) { free(o); return lex_err(L, "unexpected escaped character '\\%c' in a string literal", e); }
        o[k++] = to[f - from];
    }
    if (L->i >= n) { free(o); L->i = start; return lex_err(L, "unterminated string literal"); }
    L->i++;
    push(L, TK_STR, o, k, start);
    free(o);
    return MOERL_OK;
}

static bool isdig(char c) { return c >= '0' && c <= '9'; }
static bool isword(char c) { return isdig(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

static int lex_text_or_comment(lexer *L, bool *done) {
    const char *s = L->p.s;
    size_t n = L->p.n;
    *done = true;
    jtok_type lt = last_type(L);
    if (lt == TK_EOF || lt == TK_CLOSE_STMT || lt == TK_CLOSE_EXPR || lt == TK_COMMENT) {
        size_t j = L->i;
        while (j < n && !(s[j] == '{' && j + 1 < n && (s[j + 1] == '%' || s[j + 1] == '{' || s[j + 1] == '#'))) j++;
        if (j > L->i) {
            push(L, TK_TEXT, s + L->i, j - L->i, L->i);
            L->i = j;
            return MOERL_OK;
        }
    }
    if (L->i + 1 < n && s[L->i] == '{' && s[L->i + 1] == '#') {
        size_t start = L->i, j = L->i + 2;
        bool sb = j < n && s[j] == '-';
        if (sb) j++;
        size_t cs = j;
        while (!(j + 1 < n && s[j] == '#' && s[j + 1] == '}')) {
            if (j + 2 >= n) { L->i = start; return lex_err(L, "comment {# is never closed with #}"); }
            j++;
        }
        bool sa = j > cs && s[j - 1] == '-';
        if (sb) strip_trailing(L);
        push(L, TK_COMMENT, s + cs, j - cs - sa, start);
        L->i = j + 2;
        if (sa) skip_space(L);
        return MOERL_OK;
    }
    if (n - L->i >= 3 && (!memcmp(s + L->i, "{%-", 3) || !memcmp(s + L->i, "{{-", 3))) {
        strip_trailing(L);
        bool st = s[L->i + 1] == '%';
        push(L, st ? TK_OPEN_STMT : TK_OPEN_EXPR, st ? "{%" : "{{", 2, L->i);
        if (!st) L->brace_depth = 0;
        L->i += 3;
        return MOERL_OK;
    }
    skip_space(L);
    if (n - L->i >= 3 && (!memcmp(s + L->i, "-%}", 3) || !memcmp(s + L->i, "-}}", 3))) {
        bool st = s[L->i + 1] == '%';
        push(L, st ? TK_CLOSE_STMT : TK_CLOSE_EXPR, st ? "%}" : "}}", 2, L->i);
        L->i += 3;
        skip_space(L);
        return MOERL_OK;
    }
    *done = false;
    return MOERL_OK;
}

static const struct { const char *seq; jtok_type t; } SEQS[] = {
    {"{%", TK_OPEN_STMT}, {"%}", TK_CLOSE_STMT}, {"{{", TK_OPEN_EXPR}, {"}}", TK_CLOSE_EXPR}, {"(", TK_LPAREN},
    {")", TK_RPAREN}, {"{", TK_LBRACE}, {"}", TK_RBRACE}, {"[", TK_LBRACKET}, {"]", TK_RBRACKET},
    {",", TK_COMMA}, {".", TK_DOT}, {":", TK_COLON}, {"|", TK_PIPE}, {"<=", TK_CMP}, {">=", TK_CMP},
    {"==", TK_CMP}, {"!=", TK_CMP}, {"<", TK_CMP}, {">", TK_CMP}, {"+", TK_ADD}, {"-", TK_ADD}, {"~", TK_ADD},
    {"**", TK_POW}, {"*", TK_MUL}, {"//", TK_MUL}, {"/", TK_MUL}, {"%", TK_MUL}, {"=", TK_EQUALS},
};

/* A number, word, operator or string at L->i. */
static int lex_token(lexer *L) {
    const char *s = L->p.s;
    size_t n = L->p.n, st = L->i;
    if (L->i >= n) return MOERL_OK;
    char ch = s[L->i];
    jtok_type lt = last_type(L);
    if ((ch == '-' || ch == '+') && lt != TK_IDENT && lt != TK_NUM && lt != TK_STR && lt != TK_RPAREN && lt != TK_RBRACKET) {
        if (lt == TK_TEXT || lt == TK_EOF) return lex_err(L, "unexpected character '%c'", ch);
        size_t j = L->i + 1;
        while (j < n && isdig(s[j])) j++;
        if (j > L->i + 1 && j + 1 < n && s[j] == '.' && isdig(s[j + 1]))
            for (j++; j < n && isdig(s[j]);) j++;
        push(L, j > L->i + 1 ? TK_NUM : TK_UNARY, s + L->i, j - L->i, st);
        L->i = j;
        return MOERL_OK;
    }
    for (size_t k = 0; k < sizeof SEQS / sizeof SEQS[0]; k++) {
        size_t l = strlen(SEQS[k].seq);
        if (SEQS[k].t == TK_CLOSE_EXPR && L->brace_depth > 0) continue;
        if (n - L->i >= l && !memcmp(s + L->i, SEQS[k].seq, l)) {
            push(L, SEQS[k].t, SEQS[k].seq, l, st);
            if (SEQS[k].t == TK_OPEN_EXPR) L->brace_depth = 0;
            else if (SEQS[k].t == TK_LBRACE) L->brace_depth++;
            else if (SEQS[k].t == TK_RBRACE) L->brace_depth--;
            L->i += l;
            return MOERL_OK;
        }
    }
    if (ch == '\'' || ch == '"') return lex_string(L);
    if (isdig(ch)) {
        size_t j = L->i;
        while (j < n && isdig(s[j])) j++;
        if (lt != TK_DOT && j + 1 < n && s[j] == '.' && isdig(s[j + 1]))
            for (j++; j < n && isdig(s[j]);) j++;
        push(L, TK_NUM, s + L->i, j - L->i, st);
        L->i = j;
        return MOERL_OK;
    }
    if (isword(ch)) {
        size_t j = L->i;
        while (j < n && isword(s[j])) j++;
        push(L, TK_IDENT, s + L->i, j - L->i, st);
        L->i = j;
        return MOERL_OK;
    }
    return lex_err(L, "unexpected character '%.*s'", (int)jcp(s, L->i, n), s + L->i);
}

int jinja_lex(jarena *a, const char *src, size_t len, const char *name, jtok **toks, int *ntok) {
    lexer L = {.a = a, .name = name};
    L.lines = xmalloc((len + 1) * sizeof(int));
    for (size_t i = 0, line = 1; i <= len; i++) {
        L.lines[i] = (int)line;
        if (i < len && src[i] == '\n') line++;
    }
    if (len && src[len - 1] == '\n') len--;
    L.p.s = xmalloc(len + 1);
    L.p.off = xmalloc((len + 1) * sizeof(int));
    memcpy(L.p.s, src, len);
    L.p.s[len] = 0;
    for (size_t i = 0; i <= len; i++) L.p.off[i] = (int)i;
    L.p.n = len;
    pre_strip(&L.p);
    pre_generation(&L.p);
    int rc = MOERL_OK;
    while (L.i < L.p.n && rc == MOERL_OK) {
        bool done;
        rc = lex_text_or_comment(&L, &done);
        if (rc == MOERL_OK && !done) rc = lex_token(&L);
    }
    size_t end = L.p.n;
    push(&L, TK_EOF, "", 0, end ? end - 1 : 0);
    free(L.p.s);
    free(L.p.off);
    free(L.lines);
    *toks = L.t;
    *ntok = L.n;
    return rc;
}
