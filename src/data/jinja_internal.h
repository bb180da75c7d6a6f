/* moerl — the Jinja interpreter's internal types (data/jinja.h is the API).
 *
 * jinja_lex.c      preprocessing (trim_blocks, lstrip_blocks, generation tags) and tokens
 * jinja_parse.c    tokens → syntax tree (jnode), one arena per template
 * jinja_value.c    runtime values, strings with a per-byte template mask, printing, tojson
 * jinja_eval.c     statements, expressions, scopes, the render entry point
 * jinja_builtin.c  string helpers, string/list/dict methods, tests, globals
 * jinja_filter.c   filters, Python string formatting
 *
 * Semantics follow @huggingface/jinja 0.5.11 (what transformers.js renders chat templates with);
 * where it has no answer (a filter it lacks), Jinja2's. Errors longjmp to the entry point with
 * the message already recorded (moerl_errorf), so every allocation lives in an arena.
 */
#ifndef MOERL_JINJA_INTERNAL_H
#define MOERL_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/jinja.h"

/* ---- arena ---------------------------------------------------------------------------- */
typedef struct jblk jblk;
typedef struct {
    jblk *head;
} jarena;
void *ja_alloc(jarena *a, size_t n); /* zeroed, 16-byte aligned */
char *ja_strdup(jarena *a, const char *s, size_t n);
void ja_free(jarena *a);

/* ---- tokens --------------------------------------------------------------------------- */
typedef enum {
    TK_TEXT, TK_NUM, TK_STR, TK_IDENT, TK_EQUALS, TK_LPAREN, TK_RPAREN, TK_OPEN_STMT, TK_CLOSE_STMT,
    TK_OPEN_EXPR, TK_CLOSE_EXPR, TK_LBRACKET, TK_RBRACKET, TK_LBRACE, TK_RBRACE, TK_COMMA, TK_DOT,
    TK_COLON, TK_PIPE, TK_ADD, TK_MUL, TK_POW, TK_CMP, TK_UNARY, TK_COMMENT, TK_EOF
} jtok_type;

typedef struct {
    jtok_type type;
    const char *s; /* value (string literals unescaped), NUL-terminated, in the arena */
    size_t n;
    int line;
} jtok;

/* Tokenize src (preprocessed as transformers' Jinja environment: trim_blocks, lstrip_blocks,
 * the trailing newline dropped, {% generation %} tags removed). */
int jinja_lex(jarena *a, const char *src, size_t len, const char *name, jtok **toks, int *ntok);

/* ---- syntax tree ---------------------------------------------------------------------- */
typedef enum {
    /* statements */
    N_TEXT, N_IF, N_FOR, N_SET, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_COMMENT,
    /* expressions */
    E_STR, E_INT, E_FLOAT, E_NAME, E_ARRAY, E_TUPLE, E_DICT, E_MEMBER, E_SLICE, E_CALL, E_UNARY,
    E_BINARY, E_FILTER, E_TEST, E_SELECT, E_TERNARY, E_KWARG, E_SPREAD, E_KWSPREAD
} jnode_kind;

/* Binary/unary operators. */
enum { OP_ADD = 1, OP_SUB, OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT,
       OP_GT, OP_LE, OP_GE, OP_AND, OP_OR, OP_NOT, OP_IN, OP_NOTIN, OP_NEG, OP_POS };

typedef struct jnode jnode;
struct jnode {
    jnode_kind kind;
    int line;
    int op;           /* operator; E_TEST: negate; E_MEMBER: computed */
    int sym;          /* E_NAME / E_KWARG key: symbol id */
    const char *s;    /* E_STR/N_TEXT value, E_NAME name, E_MEMBER attribute name, filter/test name */
    size_t n;
    double num;
    jnode *a, *b, *c; /* children (see jinja_parse.c per kind) */
    jnode **list;     /* body / args / items / keys */
    int nlist;
    jnode **list2;    /* else body / dict values / macro params / filter args */
    int nlist2;
};

struct jinja_tpl {
    jarena arena;
    char *name;
    jnode **body;
    int nbody;
    char **syms; /* symbol id → name */
    int nsyms, capsyms;
};

int jinja_sym(jinja_tpl *t, const char *s, size_t n); /* intern (parsing only) */
/* The id of a name interned at parse time (jinja_parse interns every name the renderer binds,
 * so rendering never changes a template and threads may render one template at once). */
int jsym(const jinja_tpl *t, const char *s, size_t n);

/* ---- values --------------------------------------------------------------------------- */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_ARR, JV_OBJ, JV_FUNC } jv_kind;

/* A string: s[0..n); mask m[0..n) (1 = template byte), or m NULL and every byte's mask is um. */
typedef struct {
    const char *s;
    const uint8_t *m;
    size_t n;
    uint8_t um;
} jstr;

typedef struct jarr jarr;
typedef struct jobj jobj;
typedef struct jfunc jfunc;

typedef struct {
    jv_kind k;
    union {
        bool b;
        double num;
        jstr str;
        jarr *arr;
        jobj *obj;
        jfunc *fn;
    } u;
} jv;

struct jarr {
    jv *v;
    int n, cap;
    bool tuple;
};

typedef enum { OBJ_DICT, OBJ_NAMESPACE, OBJ_KWARGS } jobj_kind;
struct jobj {
    jobj_kind kind;
    bool is_loop;   /* a for loop's `loop`: also has cycle() (not a key, as in the reference) */
    int loop_index;
    jstr *keys;
    jv *vals;
    int n, cap;
};

typedef struct jscope jscope;
typedef struct jctx jctx;
typedef jv (*jbuiltin_fn)(jctx *c, const jnode *at, jv self, jv *args, int nargs, jobj *kw);
struct jfunc {
    const char *name;
    jbuiltin_fn fn; /* builtin: fn(self, args) */
    jv self;
    const jnode *macro; /* macro or call block: parameters list2, body list */
    jscope *closure;    /* call block's defining scope */
    bool is_caller;
};

struct jscope {
    jscope *parent;
    int *syms;
    jv *vals;
    int n, cap;
};

/* A growing text with its mask (same layout as chat_render, which is one). */
typedef chat_render jbuf;
void jbuf_put(jbuf *b, const char *s, size_t n, uint8_t m);
void jbuf_put_str(jbuf *b, jstr s);

struct jctx {
    const jinja_tpl *t;
    jarena arena;
    jmp_buf jmp;
    jscope *globals;
    int brk; /* 1 break, 2 continue pending */
    int depth;
    struct jbufpool *pool; /* scratch buffers (jtmp_get) */
};

/* Errors: record "NAME:LINE: msg" and longjmp out of the render. */
_Noreturn void jfail(jctx *c, const jnode *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Constructors. */
static inline jv jv_undef(void) { jv v = {.k = JV_UNDEF}; return v; }
static inline jv jv_none(void) { jv v = {.k = JV_NONE}; return v; }
static inline jv jv_bool(bool b) { jv v = {.k = JV_BOOL}; v.u.b = b; return v; }
static inline jv jv_int(double x) { jv v = {.k = JV_INT}; v.u.num = x; return v; }
static inline jv jv_float(double x) { jv v = {.k = JV_FLOAT}; v.u.num = x; return v; }
static inline bool jv_isnum(jv v) { return v.k == JV_INT || v.k == JV_FLOAT; }
jv jv_str(jstr s);
jv jv_cstr(jctx *c, const char *s, uint8_t m);       /* copies */
jv jv_strn(jctx *c, const char *s, size_t n, uint8_t m); /* copies */
jstr jbuf_take(jctx *c, jbuf *b);                     /* arena copy of b, b reset */
jarr *jarr_new(jctx *c, int cap);
void jarr_push(jctx *c, jarr *a, jv v);
jv jv_arr(jarr *a);
jobj *jobj_new(jctx *c, jobj_kind k);
jv *jobj_get(const jobj *o, const char *key, size_t n);
void jobj_set(jctx *c, jobj *o, jstr key, jv v);
jv jv_obj(jobj *o);
jv jv_from_json(jctx *c, const json_t *j, uint8_t m);

const char *jv_type_name(jv v); /* "StringValue", ... as @huggingface/jinja names them */
bool jv_truthy(jv v);
bool jv_loose_eq(jctx *c, jv a, jv b); /* == as JavaScript's == on the values */
bool jv_strict_eq(jv a, jv b);  /* `in` membership */
int jv_compare(jctx *c, const jnode *at, jv a, jv b, bool case_sensitive); /* sorting */
void jjs_num(double x, char buf[40]);                                        /* JS Number#toString */
void jv_print(jctx *c, jbuf *b, jv v);   /* RuntimeValue#toString: how {{ }} prints */
void jv_jsstr(jctx *c, jbuf *b, jv v);   /* value.toString() as `+` and `~` concatenate */
typedef struct {
    int indent; /* < 0 none */
    bool ensure_ascii, sort_keys, undef_null;
    const char *item_sep, *key_sep;
} jjson_opts;
void jv_tojson(jctx *c, const jnode *at, jbuf *b, jv v, const jjson_opts *o, int depth);

/* UTF-8 helpers. */
size_t jjs_space_len(const char *s, size_t n);  /* length of a JS whitespace char at s, or 0 */
size_t jjs_space_len_back(const char *s, size_t n); /* one ending at s+n, or 0 */
size_t jutf8_len(unsigned char c);
/* Length of the UTF-8 sequence at s[i] within s[0..n) (clamped: template text may be invalid). */
static inline size_t jcp(const char *s, size_t i, size_t n) {
    size_t l = jutf8_len((unsigned char)s[i]);
    return l < n - i ? l : n - i;
}
size_t jutf16_len(const char *s, size_t n);

/* ---- evaluation ----------------------------------------------------------------------- */
jv jeval(jctx *c, const jnode *e, jscope *sc);
void jexec_block(jctx *c, jnode *const *body, int n, jscope *sc, jbuf *out);
jscope *jscope_new(jctx *c, jscope *parent);
void jscope_set(jctx *c, jscope *sc, int sym, jv v);
jv jscope_get(const jscope *sc, int sym);
jv jcall(jctx *c, const jnode *at, jv fn, jv *args, int nargs, jobj *kw, jscope *sc);

/* Scratch buffers: get one, use it, put it back (LIFO); freed when the render ends. */
jbuf *jtmp_get(jctx *c);
void jtmp_put(jctx *c);

/* String helpers (jinja_builtin.c). */
jstr jjs_sub(jstr s, size_t a, size_t b);
jstr jjs_trim(jstr s, bool left, bool right);                        /* JavaScript trim */
jstr jpy_strip_chars(jstr s, jstr chars, bool left, bool right);     /* Python strip(chars) */
jv jjs_map_case(jctx *c, jstr s, int upper, bool first_only);
jv jjs_title(jctx *c, jstr s);
bool jjs_str_eq(jstr a, const char *b);
jv jjs_replace(jctx *c, jstr s, jstr old, jstr nw, long count);
jv jdict_items(jctx *c, jobj *o);
jv jdict_sort(jctx *c, const jnode *at, jobj *o, jv *args, int nargs, jobj *kw);
void jv_stable_sort(jctx *c, jv *v, int n, int (*cmp)(const void *, const void *));
jv jpy_format_braces(jctx *c, const jnode *at, jstr fmt, jv *args, int nargs, jobj *kw); /* str.format */
jv jpy_format_percent(jctx *c, const jnode *at, jstr fmt, jv *args, int nargs);          /* "%s" % args */

/* Builtins (jinja_builtin.c, jinja_filter.c). */
jv jfilter(jctx *c, const jnode *at, jv operand, const jnode *filter, jscope *sc);
bool jtest(jctx *c, const jnode *at, jv operand, const char *name, jv *args, int nargs);
bool jtest_exists(const char *name);
jv jmember_builtin(jctx *c, const jnode *at, jv obj, const char *name, size_t n); /* method or undefined */
void jglobals_init(jctx *c, jscope *g);
void jeval_args(jctx *c, jnode *const *args, int n, jscope *sc, jarr *pos, jobj **kw);

#endif
