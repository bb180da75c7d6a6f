/* Tests of the Jinja interpreter (data/jinja.h).
 *
 * 1. Reference cases ($MOERL_TESTDATA/jinja_ref.json from tests/ref/gen_jinja.py): the chat
 *    templates of Qwen3, DeepSeek-V3, Llama 3.1 and Gemma 3 and two written for the tests,
 *    rendered with every conversation and option of tests/ref/jinja_conversations.json, its
 *    feature snippets and 4000 seeded random templates, by @huggingface/jinja. moerl's text must
 *    equal the reference byte for byte (no tolerance: text), and where the reference raises,
 *    moerl must raise too (random templates: except the named places moerl follows Jinja2).
 * 2. The per-byte template mask: template literals 1, message content 0, the named special-token
 *    variables 1, masks kept through concatenation, slicing, filters and tojson.
 * 3. Error messages: template name, line and the construct.
 * 4. Features @huggingface/jinja lacks, with Jinja2's results (expected values from Jinja2 3.1.6
 *    with trim_blocks and lstrip_blocks, as transformers renders).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/common.h"
#include "data/jinja.h"
#include "test.h"

static const char *const SPECIALS[] = {"bos_token", "eos_token", "pad_token", "unk_token", NULL};

/* Render src with vars (JSON text); returns MOERL_OK/ERR, out filled. */
static int render_src(const char *src, const char *vars_json, chat_render *out) {
    jinja_tpl *t;
    memset(out, 0, sizeof *out);
    if (jinja_parse(src, strlen(src), "t", &t) != MOERL_OK) return MOERL_ERR;
    json_error_t je;
    json_t *vars = json_loads(vars_json ? vars_json : "{}", 0, &je);
    if (!vars) {
        fprintf(stderr, "bad test vars: %s\n", je.text);
        jinja_free(t);
        return MOERL_ERR;
    }
    int rc = jinja_render(t, vars, SPECIALS, out);
    json_decref(vars);
    jinja_free(t);
    return rc;
}

/* Compare text with want; on a difference print the first differing offset and context. */
static int same_text(const char *name, const char *got, size_t gn, const char *want, size_t wn) {
    if (gn == wn && !memcmp(got, want, gn)) return 1;
    size_t i = 0;
    while (i < gn && i < wn && got[i] == want[i]) i++;
    size_t a = i > 40 ? i - 40 : 0;
    fprintf(stderr, "FAIL %s: first difference at byte %zu (got %zu bytes, want %zu)\n  got:  \"", name, i, gn, wn);
    for (size_t k = a; k < gn && k < i + 40; k++) fputc(got[k] == '\n' ? '|' : got[k], stderr);
    fprintf(stderr, "\"\n  want: \"");
    for (size_t k = a; k < wn && k < i + 40; k++) fputc(want[k] == '\n' ? '|' : want[k], stderr);
    fprintf(stderr, "\"\n");
    return 0;
}

/* Masks of a real template's rendering: every byte of every message's string content that
 * appears verbatim is data (0) at each of its occurrences that lies inside content, and the
 * bos_token the template writes is template (1). Checked where the content is distinctive. */
static void check_real_masks(const char *name, const chat_render *out, json_t *vars) {
    if (strstr(name, "/specials_in_content/")) {
        const char *needle = "Say <|im_end|> and <|eot_id|>";
        const char *p = memmem(out->text, out->len, needle, strlen(needle));
        if (!p) return; /* the template dropped or transformed it */
        size_t at = p - out->text, bad = 0;
        for (size_t i = 0; i < strlen(needle); i++) bad += out->tpl[at + i] != 0;
        CHECK(bad == 0, "%s: %zu bytes of message content marked template", name, bad);
        size_t tpl_bytes = 0;
        for (size_t i = 0; i < out->len; i++) tpl_bytes += out->tpl[i];
        CHECK(tpl_bytes > 0, "%s: no template bytes", name);
    }
    json_t *bos = json_object_get(vars, "bos_token");
    if (json_is_string(bos) && json_string_length(bos) && out->len >= json_string_length(bos) &&
        !memcmp(out->text, json_string_value(bos), json_string_length(bos))) {
        size_t bad = 0;
        for (size_t i = 0; i < json_string_length(bos); i++) bad += out->tpl[i] != 1;
        CHECK(bad == 0, "%s: the leading bos_token is not marked template", name);
    }
}

/* One reference case: returns 1 when it matches. */
static int ref_case(const char *name, jinja_tpl *t, json_t *c, int *printed_err) {
    json_t *vars = json_object_get(c, "vars");
    json_t *text = json_object_get(c, "text"), *err = json_object_get(c, "error");
    chat_render out = {0};
    int rc = jinja_render(t, vars, SPECIALS, &out);
    int ok;
    if (err) {
        ok = rc != MOERL_OK;
        if (!ok) fprintf(stderr, "FAIL %s: the reference raises \"%s\", moerl rendered\n", name, json_string_value(err));
        else if (!*printed_err) {
            printf("  %s: reference raises \"%s\"; moerl: %s\n", name, json_string_value(err), moerl_last_error());
            *printed_err = 1;
        }
    } else if (rc != MOERL_OK) {
        fprintf(stderr, "FAIL %s: %s\n", name, moerl_last_error());
        ok = 0;
    } else {
        ok = same_text(name, out.text ? out.text : "", out.len, json_string_value(text), json_string_length(text));
        if (ok) check_real_masks(name, &out, vars);
    }
    chat_render_free(&out);
    return ok;
}

/* Where the reference raises but moerl renders on purpose: string ordering (Jinja2 compares
 * strings), filters it lacks or refuses for a type (Jinja2's), and its own crash on an empty
 * list's first/last (Jinja2: undefined). Anything else must match. */
static int known_extension(const char *ref_error) {
    static const char *const pat[] = {"between StringValue and StringValue", "Value filter: ", "Cannot apply filter \"d\"",
                                      "Cannot apply filter \"string\" to type: NullValue", "Cannot read properties of undefined", NULL};
    for (int i = 0; pat[i]; i++)
        if (strstr(ref_error, pat[i])) return 1;
    return 0;
}

/* The seeded random templates: same text, or both raise, or a known extension. */
static void test_fuzz(json_t *fuzz) {
    int same = 0, raise = 0, ext = 0, bad = 0;
    size_t i;
    json_t *s;
    json_array_foreach(fuzz, i, s) {
        const char *name = json_string_value(json_object_get(s, "name"));
        const char *src = json_string_value(json_object_get(s, "template"));
        json_t *text = json_object_get(s, "text"), *err = json_object_get(s, "error");
        jinja_tpl *t;
        chat_render out = {0};
        int rc = jinja_parse(src, strlen(src), name, &t);
        if (rc == MOERL_OK) {
            rc = jinja_render(t, json_object_get(s, "vars"), NULL, &out);
            jinja_free(t);
        }
        if (err && rc != MOERL_OK) raise++;
        else if (err && known_extension(json_string_value(err))) ext++;
        else if (!err && rc == MOERL_OK && same_text(name, out.text ? out.text : "", out.len, json_string_value(text), json_string_length(text))) same++;
        else {
            bad++;
            fprintf(stderr, "FAIL random template %s: %s\n  reference: %s\n  moerl: %s\n", name, src, err ? json_string_value(err) : "renders",
                    rc ? moerl_last_error() : "renders");
        }
        chat_render_free(&out);
    }
    CHECK(bad == 0 && json_array_size(fuzz) > 0, "%d of %zu random templates differ from @huggingface/jinja", bad, json_array_size(fuzz));
    printf("random templates: %d identical, %d raise in both, %d reference raises where moerl follows Jinja2, %d differ\n", same, raise, ext, bad);
}

static void test_reference(void) {
    const char *dir = getenv("MOERL_TESTDATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/jinja_ref.json", dir ? dir : "build/testdata");
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    CHECK(ref != NULL, "%s: %s (run tests/ref/gen_jinja.py first: bash tests/run.sh gen_jinja test_jinja)", path, je.text);
    if (!ref) return;
    json_t *epoch = json_object_get(ref, "epoch"); /* strftime_now's clock, as the reference ran */
    if (json_is_string(epoch)) setenv("SOURCE_DATE_EPOCH", json_string_value(epoch), 1);
    setenv("TZ", "UTC", 1);
    tzset();
    json_t *tpls = json_object_get(ref, "templates");
    const char *tname;
    json_t *src;
    json_object_foreach(tpls, tname, src) {
        jinja_tpl *t;
        int rc = jinja_parse(json_string_value(src), json_string_length(src), tname, &t);
        CHECK(rc == MOERL_OK, "parse %s: %s", tname, moerl_last_error());
        if (rc) continue;
        int pass = 0, total = 0, printed = 0;
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(ref, "cases"), i, c) {
            if (strcmp(json_string_value(json_object_get(c, "template")), tname)) continue;
            total++;
            int ok = ref_case(json_string_value(json_object_get(c, "name")), t, c, &printed);
            pass += ok;
            CHECK(ok, "reference case %s", json_string_value(json_object_get(c, "name")));
        }
        printf("%s: %d/%d template x conversation x option cases byte-identical to @huggingface/jinja\n", tname, pass, total);
        jinja_free(t);
    }
    int pass = 0, total = 0;
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(ref, "snippets"), i, s) {
        const char *name = json_string_value(json_object_get(s, "name"));
        const char *src2 = json_string_value(json_object_get(s, "template"));
        jinja_tpl *t;
        int printed = 1, ok;
        total++;
        if (jinja_parse(src2, strlen(src2), name, &t) != MOERL_OK) {
            ok = json_object_get(s, "error") != NULL;
            if (!ok) fprintf(stderr, "FAIL snippet %s: parse: %s\n", name, moerl_last_error());
        } else {
            ok = ref_case(name, t, s, &printed);
            jinja_free(t);
        }
        pass += ok;
        CHECK(ok, "snippet %s", name);
    }
    printf("snippets: %d/%d byte-identical to @huggingface/jinja\n", pass, total);
    test_fuzz(json_object_get(ref, "fuzz"));
    json_decref(ref);
}

/* ---- masks ---------------------------------------------------------------------------- */
static void check_mask(const char *tpl, const char *vars, const char *const *names, const char *want_text, const char *want_mask) {
    chat_render out = {0};
    jinja_tpl *t;
    int rc = jinja_parse(tpl, strlen(tpl), "t", &t);
    CHECK(rc == MOERL_OK, "parse: %s", moerl_last_error());
    if (rc) return;
    json_t *v = json_loads(vars, 0, NULL);
    rc = jinja_render(t, v, names, &out);
    CHECK(rc == MOERL_OK, "render: %s", moerl_last_error());
    if (!rc) {
        CHECK(out.len == strlen(want_text) && !memcmp(out.text, want_text, out.len), "text \"%s\" want \"%s\"", out.text, want_text);
        char *m = xmalloc(out.len + 1);
        for (size_t i = 0; i < out.len; i++) m[i] = out.tpl[i] ? '1' : '0';
        m[out.len] = 0;
        CHECK(!strcmp(m, want_mask), "mask of \"%s\":\n  got  %s\n  want %s", out.text, m, want_mask);
        free(m);
    }
    json_decref(v);
    chat_render_free(&out);
    jinja_free(t);
}

static void test_masks(void) {
    const char *vars = "{\"bos_token\": \"<s>\", \"m\": \"abc\", \"d\": {\"k\": \"v\"}, \"n\": 5}";
    /* literals 1, named special token 1, content 0; concatenation and slices keep each byte's
     * mask; filters and methods keep the mask of the bytes they copy; tojson's own punctuation
     * and numbers are 0 (never control tokens), a literal key inside it stays 1 */
    check_mask("A{{ bos_token }}{{ m }}|{{ 'x' ~ m ~ 'y' }}|{{ m[1:3] }}|{{ m | upper }}|{{ d | tojson }}|{{ m.split('b')[1] }}{{ n }}",
               vars, SPECIALS, "A<s>abc|xabcy|bc|ABC|{\"k\": \"v\"}|c5",
               "1111000110001100100010000000000100");
    check_mask("{{ {'a': m} | tojson }}{{ ('<' + m + '>') | replace('b', '[B]') }}", vars, SPECIALS,
               "{\"a\": \"abc\"}<a[B]c>", "0010000000001011101");
    /* without template_vars, bos_token is data like any other variable */
    check_mask("{{ bos_token }}x", vars, NULL, "<s>x", "0001");
    /* a set block, a macro and a filter block keep the masks of what they rendered */
    check_mask("{% set b %}[{{ m }}]{% endset %}{% macro f(x) %}<{{ x }}>{% endmacro %}{{ b }}{{ f(m) }}{% filter upper %}q{{ m }}{% endfilter %}",
               vars, SPECIALS, "[abc]<abc>QABC", "10001100011000");
}

/* ---- errors --------------------------------------------------------------------------- */
static void check_error(const char *tpl, const char *vars, const char *want1, const char *want2) {
    chat_render out = {0};
    int rc = render_src(tpl, vars, &out);
    const char *msg = moerl_last_error();
    CHECK(rc != MOERL_OK, "template \"%s\" should fail", tpl);
    CHECK(strstr(msg, want1) && (!want2 || strstr(msg, want2)), "error of \"%s\": \"%s\" lacks \"%s\" / \"%s\"", tpl, msg, want1,
          want2 ? want2 : "");
    chat_render_free(&out);
}

static void test_errors(void) {
    check_error("{{ 'x' }}\n{{ 'x' | frobnicate }}", NULL, "t:2:", "unknown filter 'frobnicate'");
    check_error("{{ 'x' is frobnicated }}", NULL, "t:1:", "unknown test 'frobnicated'");
    check_error("a\n{% if true %}\nb\n{% for x in y %}\n", NULL, "'for' opened on line 4 is never closed", "endfor");
    check_error("{% if true %}\nb", NULL, "'if' opened on line 1 is never closed", "t:");
    check_error("line 1\n\n{{ raise_exception('boom: ' ~ 42) }}", NULL, "t:3: raise_exception: boom: 42", NULL);
    check_error("{% include 'other.jinja' %}", NULL, "t:1:", "unknown or unsupported statement 'include'");
    check_error("{% endif %}", NULL, "t:1:", "'endif' without a matching opening block");
    check_error("{{ 1 + }}", NULL, "t:1:", "unexpected");
    check_error("{{ 'abc }}", NULL, "t:1:", "unterminated string literal");
    check_error("{{ x", NULL, "t:1:", NULL);
    check_error("{% break %}", NULL, "break or continue outside a for loop", NULL);
    check_error("\n{{ [1] - 1 }}", NULL, "t:2:", "unknown operator \"-\" between ArrayValue and IntegerValue");
    check_error("{{ u + 1 }}", NULL, "cannot perform operation + on undefined values", NULL);
    check_error("{{ x.y() }}", "{\"x\": {}}", "t:1:", "cannot call 'y' of ObjectValue: not a method");
    check_error("\n{{ 'abc'.zfill(5) }}", NULL, "t:2:", "cannot call 'zfill' of StringValue: not a method (unknown or unsupported)");
    check_error("{{ cycler(1, 2) }}", NULL, "t:1:", "cannot call 'cycler': not a function or macro");
    check_error("{{ (1)(2) }}", NULL, "t:1:", "cannot call something that is not a function: got IntegerValue");
    check_error("{{ range }}", "{\"range\": 1}", "variable already declared: range", NULL);
    check_error("{% macro f(a) %}{% endmacro %}{{ f(b=1) }}", NULL, "macro 'f' takes no keyword argument 'b'", NULL);
    check_error("{# never closed", NULL, "comment {# is never closed", NULL);
    check_error("{{ f(**d, 1) }}", NULL, "t:1:", "** must be applied to the last argument");
    check_error("{{ f(*a, 1) }}", NULL, "t:1:", "positional arguments must not follow * argument unpacking");
    check_error("{{ f(*a, *b) }}", NULL, "t:1:", "only one * argument unpacking is allowed");
    check_error("{{ f(a=1, 2) }}", NULL, "t:1:", "positional argument follows keyword argument");
    check_error("{% macro m(a, a) %}{% endmacro %}", NULL, "t:1:", "duplicate parameter name 'a'");
    check_error("{% macro m(a=1, b) %}{% endmacro %}", NULL, "t:1:", "non-default argument follows default argument");
    check_error("{{ f(a=1, a=2) }}", "{\"f\": 1}", "t:1:", "got multiple values for keyword argument 'a'");
    check_error("{{ 'x' | int | length }}", NULL, "unknown filter 'length' for IntegerValue", NULL);
    char deep[4000];
    memset(deep, '(', sizeof deep);
    memcpy(deep, "{{ ", 3), deep[sizeof deep - 1] = 0;
    check_error(deep, NULL, "nested deeper than", NULL);
    check_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "nested deeper than", NULL);
    chat_render out = {0};
    jinja_tpl *t;
    CHECK(jinja_parse("x", 1, "t", &t) == MOERL_OK, "parse");
    json_t *arr = json_array();
    CHECK(jinja_render(t, arr, NULL, &out) != MOERL_OK && strstr(moerl_last_error(), "must be a JSON object"), "vars not an object");
    json_decref(arr);
    jinja_free(t);
}

/* ---- Jinja2-only features ------------------------------------------------------------- */
/* Expected values: Jinja2 3.1.6 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks),
 * with booleans written true/false as @huggingface/jinja prints them. */
static const struct {
    const char *tpl, *vars, *want;
} EXT[] = {
    {"{{ [1,2,3,4] | select('odd') | join(',') }}|{{ [1,2,3,4] | reject('even') | join(',') }}|{{ [0,1,''] | select | list | length }}", "{}", "1,3|1,3|1"},
    {"{{ ['a','b'] | map('upper') | join }}|{{ [1.5, 2] | map('string') | join(';') }}|{{ ['x,y'] | map('replace', ',', '-') | join }}", "{}", "AB|1.5;2|x-y"},
    {"{{ [1,2,3] | sum }} {{ [1,2.5] | sum }} {{ xs | sum(attribute='n') }} {{ [3,1,2] | min }} {{ [3,1,2] | max }} {{ ['b','A','c'] | max }} {{ (xs | max(attribute='n')).n }}",
     "{\"xs\":[{\"n\":1},{\"n\":5},{\"n\":2}]}", "6 3.5 8 1 3 c 5"},
    {"{% for row in [1,2,3,4,5] | batch(2) %}{{ row | join(',') }};{% endfor %}|{% for row in [1,2,3] | batch(2, 0) %}{{ row | join(',') }};{% endfor %}", "{}", "1,2;3,4;5;|1,2;3,0;"},
    {"{{ 'Hello big wide_world, 42 times!' | wordcount }}|{{ 'The quick brown fox jumps' | truncate(12) }}|{{ 'The quick brown fox jumps' | truncate(12, true) }}|{{ 'short' | truncate(10) }}|{{ 'The quick brown fox' | truncate(9, false, '~', 0) }}",
     "{}", "5|The...|The quick...|short|The~"},
    {"[{{ 'ab' | center(7) }}][{{ 'abc' | center(8) }}][{{ 'abc' | center(2) }}]|{{ '%s is %d years, %.2f%%' | format('Al', 42.9, 3.14159) }}", "{}", "[   ab  ][  abc   ][abc]|Al is 42 years, 3.14%"},
    {"{{ 2.5 | round }} {{ 3.5 | round }} {{ 3.14159 | round(2) }} {{ 3.1 | round(0, 'ceil') }} {{ 3.9 | round(method='floor') }} {{ 4 | round }}", "{}", "2.0 4.0 3.14 4.0 3.0 4"},
    {"{{ '<a href=\"x\">&\\'</a>' | e }}|{{ '<b>' | escape }}", "{}", "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;|&lt;b&gt;"},
    {"[{{ '--x--' | trim('-') }}][{{ 'xxhixx' | trim('x') }}]|{{ u | d('dflt') }}|{{ [1,2] | count }}|{{ 'abc' | count }}|{{ 'abc' | first }}{{ 'abc' | last }}|{{ 'abc' | list | join('.') }}|{{ 'abc' | reverse }}",
     "{}", "[x][hi]|dflt|2|3|ac|a.b.c|cba"},
    {"{% for x in ['a','b','c'] %}{{ loop.cycle('odd','even') }},{% endfor %}", "{}", "odd,even,odd,"},
    {"{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 3 is eq 3 }}{{ 3 is ne 3 }}{{ 2 is lt 3 }}{{ 2 is gt 3 }}{{ 2 is in [1,2] }}{{ 1.5 is float }}{{ 1 is float }}{{ 3 is ge 3 }}{{ 'a' is in 'cat' }}",
     "{}", "truefalsetruefalsetruefalsetruetruefalsetruetrue"},
    {"{{ s.find('lo') }} {{ s.rfind('l') }} {{ s.find('zz') }} {{ s.index('e') }} {{ s.count('l') }} {{ '-'.join(['a','b']) }} {{ '{} and {x}'.format(1, x='y') }} {{ 'a\\nb\\r\\nc'.splitlines() | length }} {{ '123'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'a1'.isalpha() }}{{ 'a1'.isalnum() }}{{ ' '.isspace() }}{{ 'AB'.isupper() }}{{ 'ab'.islower() }} {{ 'a,b,c'.rsplit(',', 1) | join('|') }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.py'.removesuffix('.py') }}",
     "{\"s\":\"hello world\"}", "3 9 -1 1 3 a-b 1 and y 3 truetruefalsetruetruetruetrue a,b|c x x"},
    {"{{ [1,2,1].index(2) }} {{ [1,2,1].count(1) }} {{ dict(a=1, b=2).b }}", "{}", "1 2 2"},
    {"{{ 'a' < 'b' }}{{ 'b' <= 'a' }}{{ 'abc' > 'abd' }}|{% for ch in 'h\xc3\xa9!' %}[{{ ch }}]{% endfor %}", "{}", "truefalsefalse|[h][\xc3\xa9][!]"},
};

static void test_extensions(void) {
    for (size_t i = 0; i < sizeof EXT / sizeof EXT[0]; i++) {
        chat_render out = {0};
        int rc = render_src(EXT[i].tpl, EXT[i].vars, &out);
        CHECK(rc == MOERL_OK, "ext %zu: %s", i, moerl_last_error());
        if (!rc) {
            char name[32];
            snprintf(name, sizeof name, "ext %zu", i);
            CHECK(same_text(name, out.text, out.len, EXT[i].want, strlen(EXT[i].want)), "ext %zu: %s", i, EXT[i].tpl);
        }
        chat_render_free(&out);
    }
    /* an empty rendering is an empty string */
    chat_render e = {0};
    CHECK(render_src("{% if false %}x{% endif %}", NULL, &e) == MOERL_OK && e.text && e.len == 0 && !e.text[0], "empty render");
    chat_render_free(&e);
    /* a parsed template renders any number of times, each time the same */
    jinja_tpl *t;
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m }}{% endfor %}{{ ns.n }}";
    CHECK(jinja_parse(src, strlen(src), "t", &t) == MOERL_OK, "parse");
    json_t *v = json_loads("{\"messages\": [\"a\", \"b\"]}", 0, NULL);
    for (int k = 0; k < 3; k++) {
        chat_render out = {0};
        CHECK(jinja_render(t, v, NULL, &out) == MOERL_OK && !strcmp(out.text, "ab2"), "render %d: %s", k, out.text ? out.text : moerl_last_error());
        chat_render_free(&out);
    }
    json_decref(v);
    jinja_free(t);
}

int main(void) {
    test_masks();
    test_errors();
    test_extensions();
    test_reference();
    TEST_MAIN_END();
}
