/* Chat messages with tools through moerl: dataset rows with tools and full message objects
 * (round trip, errors), the object shape of apply_chat_template's arguments (chat_call, prompt
 * files), templates from .jinja files (errors, SFT targets), the native renderers refusing what
 * they would drop, and the native qwen3 fast path proven equal — text and template mask — to the
 * Jinja rendering of Qwen3's own template on the parity conversations. The Jinja renderings
 * themselves are compared with @huggingface/jinja in tests/e2e_chat.sh.
 * Needs $MOERL_TESTDATA/qwen3_tok (tests/ref/gen_tokenizer.py). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/jinja.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "test.h"

static char g_td[1024], g_tmp[1200];

static const char k_row_tools[] =
    "{\"data_source\": \"weather\", \"prompt\": ["
    "{\"role\": \"system\", \"content\": \"You are a weather bot.\"}, "
    "{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, "
    "{\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"call the tool\", \"tool_calls\": "
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, "
    "{\"role\": \"tool\", \"name\": \"get_weather\", \"tool_call_id\": \"c1\", \"content\": \"{\\\"temp\\\": 21}\"}, "
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"and tomorrow?\"}]}], "
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Current "
    "weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}], "
    "\"reward_model\": {\"style\": \"rule\", \"ground_truth\": \"21\"}}\n";

static char *write_file(const char *name, const char *text) {
    static char p[8][1400];
    static int k;
    char *path = p[k++ % 8];
    snprintf(path, sizeof p[0], "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

/* ---- dataset rows: full messages and tools survive load → write → load ---- */
static void test_dataset_tools(void) {
    dataset d;
    CHECK(dataset_load_string(&d, k_row_tools, strlen(k_row_tools), "tools.jsonl") == MOERL_OK && d.n == 1,
          "row with tools loads: %s", moerl_last_error());
    if (d.n != 1) return;
    const ds_row *r = dataset_row(&d, 0);
    CHECK(r->n_prompt == 5 && r->tools && json_array_size(r->tools) == 1, "5 messages and 1 tool");
    CHECK(!r->prompt[0].msg && !r->prompt[1].msg, "plain messages carry no object");
    CHECK(r->prompt[2].msg && !strcmp(r->prompt[2].content, "") &&
              json_is_null(json_object_get(r->prompt[2].msg, "content")) &&
              json_object_get(r->prompt[2].msg, "tool_calls") && json_object_get(r->prompt[2].msg, "reasoning_content"),
          "assistant tool call: content null kept, tool_calls and reasoning_content kept");
    CHECK(r->prompt[3].msg && !strcmp(json_string_value(json_object_get(r->prompt[3].msg, "tool_call_id")), "c1"),
          "tool message keeps tool_call_id");
    CHECK(r->prompt[4].msg && json_is_array(json_object_get(r->prompt[4].msg, "content")),
          "a content list is kept");
    CHECK(!strcmp(chat_msg_extra_key(&r->prompt[2]), "content") || !strcmp(chat_msg_extra_key(&r->prompt[2]),
                                                                              "reasoning_content") ||
              !strcmp(chat_msg_extra_key(&r->prompt[2]), "tool_calls"),
          "extra key of the tool call named: %s", chat_msg_extra_key(&r->prompt[2]));
    /* write → the same JSON object as the input line */
    char *buf = NULL;
    size_t bl = 0;
    FILE *f = open_memstream(&buf, &bl);
    CHECK(dataset_write_row(f, r) == MOERL_OK, "write row: %s", moerl_last_error());
    fclose(f);
    json_t *a = json_loads(k_row_tools, 0, NULL), *b = json_loads(buf, 0, NULL);
    CHECK(a && b && json_equal(a, b), "written row equals the input:\n%s", buf);
    dataset d2;
    CHECK(dataset_load_string(&d2, buf, bl, "again.jsonl") == MOERL_OK, "written row reloads");
    CHECK(dataset_fingerprint(&d) == dataset_fingerprint(&d2), "fingerprint survives the round trip");
    /* the fingerprint sees tools and message keys beyond role/content */
    json_object_set_new(json_array_get(json_object_get(b, "tools"), 0), "type", json_string("other"));
    char *s2 = json_dumps(b, JSON_COMPACT);
    dataset d3;
    dataset_load_string(&d3, s2, strlen(s2), "changed.jsonl");
    CHECK(dataset_fingerprint(&d3) != dataset_fingerprint(&d), "a changed tool changes the fingerprint");
    free(s2);
    dataset_free(&d3);
    dataset_free(&d2);
    json_decref(a);
    json_decref(b);
    free(buf);
    dataset_free(&d);
}

/* Plain rows keep the fingerprint they had before messages carried objects: the FNV-1a of
 * data_source, role, content, ground truth with a 0xff separator after each, written out here. */
static uint64_t old_fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return (h ^ 0xff) * 0x100000001b3ULL;
}

static void test_plain_fingerprint(void) {
    const char *row = "{\"data_source\": \"arith\", \"prompt\": [{\"role\": \"user\", \"content\": \"2+2?\"}], "
                      "\"reward_model\": {\"style\": \"rule\", \"ground_truth\": \"4\"}}\n";
    dataset d;
    dataset_load_string(&d, row, strlen(row), "plain.jsonl");
    uint64_t h = 0xcbf29ce484222325ULL;
    h = old_fnv(old_fnv(old_fnv(old_fnv(h, "arith"), "user"), "2+2?"), "4");
    CHECK(d.n == 1 && dataset_fingerprint(&d) == h, "plain row fingerprint unchanged");
    dataset_free(&d);
}

static void expect_row_err(const char *what, const char *line, const char *want) {
    dataset d;
    int rc = dataset_load_string(&d, line, strlen(line), "bad.jsonl");
    CHECK(rc != MOERL_OK && strstr(moerl_last_error(), want), "%s: %s", what, moerl_last_error());
    if (rc == MOERL_OK) dataset_free(&d);
}

static void test_dataset_errors(void) {
    const char *head = "{\"data_source\": \"x\", \"reward_model\": {\"style\": \"rule\", \"ground_truth\": \"1\"}, ";
    char l[600];
    snprintf(l, sizeof l, "%s\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": {\"a\": 1}}", head);
    expect_row_err("tools not a list", l, "bad.jsonl:1: field 'tools': expected a list of tool specs");
    snprintf(l, sizeof l, "%s\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": [{}, 3]}", head);
    expect_row_err("a tool not an object", l, "field 'tools[1]': expected an object (a tool spec), got an integer");
    snprintf(l, sizeof l, "%s\"prompt\": [{\"role\": \"user\", \"content\": 5}]}", head);
    expect_row_err("content an integer", l, "field 'prompt[0].content': expected a string (or null, or a list");
    snprintf(l, sizeof l, "%s\"prompt\": [{\"role\": \"assistant\"}]}", head);
    expect_row_err("content missing without tool_calls", l, "field 'prompt[0].content'");
    snprintf(l, sizeof l, "%s\"prompt\": [{\"role\": \"assistant\", \"tool_calls\": []}], \"tools\": null}", head);
    dataset d;
    CHECK(dataset_load_string(&d, l, strlen(l), "ok.jsonl") == MOERL_OK && d.n == 1 && !d.rows[0].tools &&
              d.rows[0].prompt[0].msg,
          "content absent beside tool_calls, tools null: %s", moerl_last_error());
    dataset_free(&d);
}

/* ---- the apply_chat_template object (tokenize --chat, generate --prompts) ---- */
static void test_chat_call(void) {
    json_t *v = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                           "\"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": "
                           "\"f\", \"arguments\": {}}}]}], \"tools\": [{\"type\": \"function\"}], "
                           "\"add_generation_prompt\": false, \"enable_thinking\": false, \"date\": \"today\"}",
                           0, NULL);
    chat_call c;
    CHECK(chat_call_from_json(v, &c) == MOERL_OK, "object call: %s", moerl_last_error());
    CHECK(c.n == 2 && !c.msgs[0].msg && c.msgs[1].msg == json_array_get(json_object_get(v, "messages"), 1),
          "messages, the tool call's object carried");
    CHECK(c.x.tools == json_object_get(v, "tools") && c.add_generation_prompt == 0, "tools and add_generation_prompt");
    CHECK(c.x.vars && json_object_size(c.x.vars) == 2 && json_is_false(json_object_get(c.x.vars, "enable_thinking")) &&
              !strcmp(json_string_value(json_object_get(c.x.vars, "date")), "today"),
          "other keys are template variables");
    chat_call_free(&c);
    json_decref(v);
    const struct {
        const char *in, *err;
    } bad[] = {
        {"{\"tools\": []}", "messages: expected a non-empty list of messages, got nothing"},
        {"{\"messages\": []}", "got an empty list"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": 1}]}", "messages[1]: expected an object"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [1]}", "tools: expected a list"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"add_generation_prompt\": 1}",
         "add_generation_prompt: expected true or false"},
        {"3", "expected a list of messages or an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *b = json_loads(bad[i].in, JSON_DECODE_ANY, NULL);
        CHECK(chat_call_from_json(b, &c) != MOERL_OK && strstr(moerl_last_error(), bad[i].err), "%s: %s", bad[i].in,
              moerl_last_error());
        json_decref(b);
    }
}

/* ---- a .jinja template on the byte tokenizer ---- */
static const char k_probe_tpl[] =
    "{%- for m in messages -%}\n"
    "{{ m.role }}:{{ m.content if m.content is string else '' }}"
    "{%- if m.tool_calls %}[call {{ m.tool_calls[0].function.name }}({{ m.tool_calls[0].function.arguments | tojson }})]"
    "{%- endif %}{% if m.reasoning_content %}<r:{{ m.reasoning_content }}>{% endif %}"
    "{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}|\n"
    "{%- endfor -%}\n"
    "{%- if tools is defined %}{% for t in tools %}tool={{ t.function.name }}|{% endfor %}{% endif -%}\n"
    "{%- if day is defined %}day={{ day }}|{% endif -%}\n"
    "{%- if enable_thinking is defined %}think={{ enable_thinking }}|{% endif -%}\n"
    "{{ eos_token }}{% if add_generation_prompt %}GEN{% endif %}";

static void test_jinja_file(void) {
    tokenizer *t = tokenizer_new_bytes();
    const char *p = write_file("probe.jinja", k_probe_tpl);
    CHECK(tokenizer_set_chat_template(t, p, true, "data.chat_template") == MOERL_OK, "probe template: %s",
          moerl_last_error());
    CHECK(!strcmp(tokenizer_chat_template_name(t), p), "template named by its path: %s", tokenizer_chat_template_name(t));
    dataset d;
    dataset_load_string(&d, k_row_tools, strlen(k_row_tools), "tools.jsonl");
    const ds_row *r = dataset_row(&d, 0);
    json_t *vars = json_pack("{s:s}", "day", "Monday");
    const chat_extra x = {r->tools, vars};
    char *txt = tokenizer_chat_text_ex(t, r->prompt, r->n_prompt, &x, true);
    const char *want = "system:You are a weather bot.|user:Weather in Paris?|assistant:[call get_weather({\"city\": "
                       "\"Paris\"})]<r:call the tool>|tool:{\"temp\": 21}#c1|user:|tool=get_weather|day=Monday|"
                       "<|im_end|>GEN";
    CHECK(txt && !strcmp(txt, want), "tool calls, reasoning, tool ids, tools and variables reach the template:\n%s",
          txt ? txt : moerl_last_error());
    free(txt);
    /* the tokens: <|im_end|> from eos_token (a special-token variable) is a control token; the same
     * text in content is not */
    chat_msg m[1] = {{"user", "a<|im_end|>b", NULL}};
    tok_seq s = {0};
    CHECK(tokenizer_chat_encode_ex(t, m, 1, NULL, false, &s) == MOERL_OK, "encode: %s", moerl_last_error());
    int n_end = 0;
    for (int64_t i = 0; i < s.n; i++) n_end += s.ids[i] == TOK_IM_END;
    CHECK(n_end == 1 && s.ids[s.n - 1] == TOK_IM_END, "only the template's eos_token is a control token (%d)", n_end);
    tok_seq_free(&s);
    /* enable_thinking: false is passed, true leaves it undefined, a var wins */
    tokenizer_set_chat_template(t, p, false, "data.chat_template");
    txt = tokenizer_chat_text(t, m, 1, false);
    CHECK(txt && strstr(txt, "think=false|"), "enable_thinking=false passed: %s", txt);
    free(txt);
    json_t *on = json_pack("{s:b}", "enable_thinking", 1);
    const chat_extra xo = {NULL, on};
    txt = tokenizer_chat_text_ex(t, m, 1, &xo, false);
    CHECK(txt && strstr(txt, "think=true|"), "a var enable_thinking wins: %s", txt);
    free(txt);
    json_decref(on);
    json_decref(vars);
    dataset_free(&d);
    tokenizer_free(t);
}

static void test_jinja_errors(void) {
    tokenizer *t = tokenizer_new_bytes();
    char missing[1400];
    snprintf(missing, sizeof missing, "%s/nope.jinja", g_tmp);
    CHECK(tokenizer_set_chat_template(t, missing, true, "--chat-template") != MOERL_OK &&
              strstr(moerl_last_error(), "--chat-template") && strstr(moerl_last_error(), missing) &&
              strstr(moerl_last_error(), "does not exist"),
          "missing file: %s", moerl_last_error());
    const char *bad = write_file("bad.jinja", "line one\n{% if x %}\nunclosed\n");
    CHECK(tokenizer_set_chat_template(t, bad, true, "--chat-template") != MOERL_OK &&
              strstr(moerl_last_error(), "bad.jinja:"),
          "parse error names the file and line: %s", moerl_last_error());
    CHECK(tokenizer_set_chat_template(t, "llama3", true, "data.chat_template") != MOERL_OK &&
              strstr(moerl_last_error(), ".jinja") && strstr(moerl_last_error(), "'llama3'"),
          "unknown name: %s", moerl_last_error());
    const char *raise = write_file("raise.jinja", "{% for m in messages %}{% if m.role == 'tool' %}"
                                                  "{{ raise_exception('no tools here') }}{% endif %}{% endfor %}");
    CHECK(tokenizer_set_chat_template(t, raise, true, "data.chat_template") == MOERL_OK, "raise template parses");
    chat_msg m[2] = {{"user", "q", NULL}, {"tool", "r", NULL}};
    CHECK(tokenizer_chat_check(t, m, 2) != MOERL_OK && strstr(moerl_last_error(), "no tools here"),
          "check renders: raise_exception's message: %s", moerl_last_error());
    CHECK(tokenizer_chat_check(t, m, 1) == MOERL_OK, "a conversation it renders passes the check");
    /* the native chatml refuses what it would drop */
    tokenizer_set_chat_template(t, "auto", true, "data.chat_template");
    json_t *o = json_loads("{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": []}", 0, NULL);
    chat_msg tc = {"assistant", "", o};
    CHECK(tokenizer_chat_check(t, &tc, 1) != MOERL_OK && strstr(moerl_last_error(), "'tool_calls'") &&
              strstr(moerl_last_error(), "chatml") && strstr(moerl_last_error(), ".jinja"),
          "chatml refuses tool_calls: %s", moerl_last_error());
    json_t *tools = json_loads("[{\"type\": \"function\"}]", 0, NULL);
    const chat_extra x = {tools, NULL};
    CHECK(tokenizer_chat_check_ex(t, m, 1, &x) != MOERL_OK && strstr(moerl_last_error(), "tools"),
          "chatml refuses tools: %s", moerl_last_error());
    char *txt = tokenizer_chat_text_ex(t, m, 1, &x, true);
    CHECK(!txt, "no text without the tools");
    json_decref(tools);
    json_decref(o);
    tokenizer_free(t);
}

/* SFT targets from a Jinja template: a chatml written in Jinja (not the native one) gives the
 * native chatml's ids. */
static void test_jinja_response(void) {
    tokenizer *t = tokenizer_new_bytes(), *n = tokenizer_new_bytes();
    const char *p = write_file("chatml.jinja", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                                               "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                                               "assistant\n{% endif %}");
    CHECK(tokenizer_set_chat_template(t, p, true, "k") == MOERL_OK, "chatml.jinja: %s", moerl_last_error());
    chat_msg m[2] = {{"system", "be <|im_end|> brief", NULL}, {"user", "2+2?", NULL}};
    tok_seq a = {0}, b = {0};
    tokenizer_chat_encode(t, m, 2, true, &a);
    tokenizer_chat_encode(n, m, 2, true, &b);
    CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n), "Jinja chatml = native chatml ids");
    tok_seq_clear(&a);
    tok_seq_clear(&b);
    CHECK(tokenizer_encode_response(t, "four <|im_end|>", &a) == MOERL_OK, "response: %s", moerl_last_error());
    tokenizer_encode_response(n, "four <|im_end|>", &b);
    CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n) && a.ids[a.n - 1] == TOK_IM_END,
          "SFT target: the response then <|im_end|>, as the native chatml");
    const char *nostop = write_file("nostop.jinja", "{% for m in messages %}{{ m.content }};{% endfor %}");
    tokenizer_set_chat_template(t, nostop, true, "k");
    CHECK(tokenizer_encode_response(t, "x", &a) != MOERL_OK && strstr(moerl_last_error(), "stop"),
          "a template without an end of turn: %s", moerl_last_error());
    tok_seq_free(&a);
    tok_seq_free(&b);
    tokenizer_free(t);
    tokenizer_free(n);
}

/* ---- a chosen .jinja template travels with the checkpoint (chat_template.jinja) ---- */
static void test_save_template(const char *qdir) {
    tokenizer *t = tokenizer_new_bytes();
    const char *p = write_file("keep.jinja", k_probe_tpl);
    tokenizer_set_chat_template(t, p, true, "data.chat_template");
    char d[1400], f[1500];
    snprintf(d, sizeof d, "%s/saved_bytes", g_tmp);
    mkdir(d, 0755);
    CHECK(tokenizer_save(t, d) == MOERL_OK, "save: %s", moerl_last_error());
    snprintf(f, sizeof f, "%s/chat_template.jinja", d);
    char *txt = NULL;
    size_t len = 0;
    CHECK(moerl_read_file(f, &txt, &len) == MOERL_OK && len == strlen(k_probe_tpl) && !memcmp(txt, k_probe_tpl, len),
          "the chosen template is written as chat_template.jinja");
    free(txt);
    tokenizer *b = tokenizer_load(d, 0);
    CHECK(b && !strcmp(tokenizer_kind(b), "bytes") &&
              tokenizer_set_chat_template(b, "auto", true, "data.chat_template") == MOERL_OK &&
              strstr(tokenizer_chat_template_name(b), "saved_bytes/chat_template.jinja"),
          "the byte tokenizer's folder template is its auto: %s", b ? tokenizer_chat_template_name(b) : "");
    chat_msg m[1] = {{"user", "q", NULL}};
    char *x1 = tokenizer_chat_text(t, m, 1, true), *x2 = b ? tokenizer_chat_text(b, m, 1, true) : NULL;
    CHECK(x1 && x2 && !strcmp(x1, x2), "the reloaded checkpoint renders as the run did");
    free(x1);
    free(x2);
    tokenizer_free(b);
    tokenizer_free(t);
    if (!qdir) return;
    /* a Hugging Face folder: chat_template.jinja wins over tokenizer_config.json's, as in transformers */
    tokenizer *q = tokenizer_load(qdir, 151936);
    snprintf(d, sizeof d, "%s/saved_hf", g_tmp);
    mkdir(d, 0755);
    if (q) tokenizer_save(q, d);
    snprintf(f, sizeof f, "%s/chat_template.jinja", d);
    FILE *o = fopen(f, "w");
    fputs("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}", o);
    fclose(o);
    tokenizer *h = tokenizer_load(d, 151936);
    CHECK(h && tokenizer_set_chat_template(h, "auto", true, "data.chat_template") == MOERL_OK &&
              strstr(tokenizer_chat_template_name(h), "saved_hf/chat_template.jinja"),
          "chat_template.jinja is the checkpoint's template: %s", h ? tokenizer_chat_template_name(h) : moerl_last_error());
    x1 = h ? tokenizer_chat_text(h, m, 1, true) : NULL;
    CHECK(x1 && !strcmp(x1, "[user] q"), "rendered: %s", x1);
    free(x1);
    tokenizer_free(h);
    tokenizer_free(q);
}

/* ---- prompt files: rows with tools, the object shape ---- */
static void test_prompt_files(void) {
    tokenizer *t = tokenizer_new_bytes();
    tokenizer_set_chat_template(t, write_file("probe2.jinja", k_probe_tpl), true, "data.chat_template");
    tok_set_current(t);
    const char *f = write_file(
        "p.jsonl",
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"function\": {\"name\": \"f\"}}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"b\"}], \"add_generation_prompt\": false, \"day\": \"d\"}\n"
        "{\"prompt\": {\"messages\": [{\"role\": \"user\", \"content\": \"c\"}], \"tools\": [{\"function\": "
        "{\"name\": \"g\"}}]}}\n"
        "{\"prompt\": \"d\"}\n");
    tok_seq *seqs = NULL;
    int n = 0;
    CHECK(prompt_file_read(f, &seqs, &n) == MOERL_OK && n == 4, "prompt file: %s", moerl_last_error());
    const char *want[4] = {"user:a|tool=f|<|im_end|>GEN", "user:b|day=d|<|im_end|>", "user:c|tool=g|<|im_end|>GEN",
                           "user:d|<|im_end|>GEN"};
    for (int i = 0; i < n && i < 4; i++) {
        char *txt = tokenizer_decode(t, seqs[i].ids, seqs[i].n, false, NULL);
        CHECK(!strcmp(txt, want[i]), "prompt %d: %s", i, txt);
        free(txt);
        tok_seq_free(&seqs[i]);
    }
    free(seqs);
    const struct {
        const char *line, *err;
    } bad[] = {
        {"{\"prompt\": \"a\", \"messages\": []}", "both \"prompt\" and \"messages\""},
        {"{\"prompt\": {\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": []}, \"tools\": []}",
         "given twice"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": 4}", "field 'tools': expected a list"},
        {"{\"prompt\": {\"messages\": 3}}", "field 'prompt': messages: expected a non-empty list"},
        {"{\"data_source\": \"x\"}", "field 'prompt'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[600];
        snprintf(line, sizeof line, "%s\n", bad[i].line);
        const char *bf = write_file("bad.jsonl", line);
        seqs = NULL;
        CHECK(prompt_file_read(bf, &seqs, &n) != MOERL_OK && strstr(moerl_last_error(), "bad.jsonl:1:") &&
                  strstr(moerl_last_error(), bad[i].err),
              "%s: %s", bad[i].line, moerl_last_error());
    }
    /* a dataset row: its tools go with its prompt (the rollout, SFT, eval and length checks encode so) */
    dataset d;
    dataset_load_string(&d, k_row_tools, strlen(k_row_tools), "tools.jsonl");
    tok_seq s = {0};
    ds_row_encode_prompt(dataset_row(&d, 0), &s);
    char *txt = tokenizer_decode(t, s.ids, s.n, false, NULL);
    CHECK(txt && strstr(txt, "[call get_weather(") && strstr(txt, "|tool=get_weather|<|im_end|>GEN"),
          "ds_row_encode_prompt: tools and tool calls: %s", txt);
    CHECK(dataset_check_prompts(&d) == MOERL_OK, "dataset_check_prompts with tools: %s", moerl_last_error());
    free(txt);
    tok_seq_free(&s);
    dataset_free(&d);
    tok_set_current(NULL);
    tokenizer_free(t);
}

/* ---- the native qwen3 fast path = Jinja rendering of Qwen3's template ---- */
static int same_render(const chat_render *a, const chat_render *b) {
    return a->len == b->len && !memcmp(a->text, b->text, a->len) && !memcmp(a->tpl, b->tpl, a->len);
}

/* One conversation file's plain conversations, native vs Jinja; counts into *n and *bad. */
static void parity_file(const jinja_tpl *jt, const json_t *specials, const char *path, int *n, int *bad, int *n_rich) {
    json_t *file = json_load_file(path, 0, NULL), *convs = json_is_object(file) ? json_object_get(file, "conversations")
                                                                                : file;
    CHECK(json_is_array(convs), "%s is a JSON list of conversations (or {\"conversations\": [...]})", path);
    for (size_t c = 0; c < json_array_size(convs); c++) {
        const json_t *conv = json_array_get(convs, c);
        chat_call call;
        if (chat_call_from_json(json_object_get(conv, "messages"), &call) != MOERL_OK) continue;
        int exact = 1; /* what the tokenizer renders natively (tokenizer.c: native_fits) */
        for (int i = 0; i < call.n; i++)
            exact &= strcmp(call.msgs[i].role, "assistant") || chat_qwen3_native_exact(call.msgs[i].content);
        if (!chat_msgs_plain(call.msgs, call.n) || json_object_get(conv, "tools") || !exact ||
            chat_check(CHAT_TPL_QWEN3, call.msgs, call.n) != MOERL_OK) {
            (*n_rich)++;
            chat_call_free(&call);
            continue;
        }
        for (int gen = 0; gen < 2; gen++)
            for (int think = -1; think <= 0; think++) { /* absent (the template's default) and false */
                chat_render a = {0}, b = {0};
                chat_render_msgs(CHAT_TPL_QWEN3, call.msgs, call.n, gen, think != 0, &a);
                chat_jinja_args ja = {NULL, gen, think, specials};
                int rc = chat_render_jinja(jt, call.msgs, call.n, &ja, &b);
                (*n)++;
                if (rc != MOERL_OK || !same_render(&a, &b)) {
                    (*bad)++;
                    size_t at = 0;
                    while (rc == MOERL_OK && at < a.len && at < b.len && a.text[at] == b.text[at] && a.tpl[at] == b.tpl[at])
                        at++;
                    fprintf(stderr, "first difference at byte %zu: native '%c' mask %d, jinja '%c' mask %d\n", at,
                            at < a.len ? a.text[at] : '$', at < a.len ? a.tpl[at] : -1, at < b.len ? b.text[at] : '$',
                            at < b.len ? b.tpl[at] : -1);
                    fprintf(stderr, "parity '%s' (gen %d, thinking %d): native and Jinja differ (%s)\n--- native\n%s\n"
                                    "--- jinja\n%s\n", json_string_value(json_object_get(conv, "name")), gen, think,
                            rc ? moerl_last_error() : "text or template mask", a.text, b.text);
                }
                chat_render_free(&a);
                chat_render_free(&b);
            }
        chat_call_free(&call);
    }
    json_decref(file);
}

static void test_qwen3_fast_path(const char *qdir) {
    char p[1400];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", qdir);
    json_t *cfg = json_load_file(p, 0, NULL);
    const char *src = json_string_value(json_object_get(cfg, "chat_template"));
    CHECK(src && chat_tpl_identify(src, strlen(src)) == CHAT_TPL_QWEN3, "Qwen3's template text recognised");
    jinja_tpl *jt = NULL;
    CHECK(src && jinja_parse(src, strlen(src), p, &jt) == MOERL_OK, "Qwen3's template parses: %s", moerl_last_error());
    if (!jt) {
        json_decref(cfg);
        return;
    }
    json_t *specials = json_pack("{s:O, s:O}", "eos_token", json_object_get(cfg, "eos_token"), "pad_token",
                                 json_object_get(cfg, "pad_token"));
    int n = 0, bad = 0, n_rich = 0;
    parity_file(jt, specials, "tests/ref/chat_conversations.json", &n, &bad, &n_rich);
    struct stat st;
    if (stat("tests/ref/jinja_conversations.json", &st) == 0)
        parity_file(jt, specials, "tests/ref/jinja_conversations.json", &n, &bad, &n_rich);
    CHECK(n >= 40 && bad == 0, "%d of %d plain renderings: native qwen3 differs from Jinja (text or mask)", bad, n);
    fprintf(stderr, "qwen3 fast path: %d plain renderings equal; %d conversations need Jinja\n", n - bad, n_rich);
    /* the tokenizer sends what the native renderer would drop through Jinja */
    tokenizer *t = tokenizer_load(qdir, 151936);
    CHECK(t && tokenizer_set_chat_template(t, "auto", true, "data.chat_template") == MOERL_OK &&
              !strcmp(tokenizer_chat_template_name(t), "qwen3"),
          "auto: qwen3 (%s)", moerl_last_error());
    dataset d;
    dataset_load_string(&d, k_row_tools, strlen(k_row_tools), "tools.jsonl");
    const ds_row *r = dataset_row(&d, 0);
    const chat_extra x = {r->tools, NULL};
    /* Qwen3's template calls string methods on contents: a list (startswith) or null (lstrip) is its
     * error, as in @huggingface/jinja and Jinja2 */
    char *txt = t ? tokenizer_chat_text_ex(t, r->prompt, r->n_prompt, &x, true) : NULL;
    CHECK(!txt && strstr(moerl_last_error(), "tokenizer_config.json:20:"), "a list content in Qwen3's template: %s",
          moerl_last_error());
    free(txt);
    txt = t ? tokenizer_chat_text_ex(t, r->prompt, r->n_prompt - 1, &x, true) : NULL;
    CHECK(!txt && strstr(moerl_last_error(), "tokenizer_config.json:41:"), "a null content in Qwen3's template: %s",
          moerl_last_error());
    free(txt);
    json_object_set_new(r->prompt[2].msg, "content", json_string("")); /* as Qwen3's tool-call turns have it */
    txt = t ? tokenizer_chat_text_ex(t, r->prompt, r->n_prompt - 1, &x, true) : NULL;
    CHECK(txt && strstr(txt, "<tools>\n{\"type\": \"function\"") && strstr(txt, "\"name\": \"get_weather\"") &&
              strstr(txt, "<tool_response>\n{\"temp\": 21}\n</tool_response>"),
          "tools and tool calls rendered by Qwen3's own template: %s", txt ? txt : moerl_last_error());
    free(txt);
    /* SFT targets: a response with leading whitespace goes through Jinja, whose strip removes it (as the
     * reference's); the native target of the stripped text is the same */
    tok_seq s1 = {0}, s2 = {0};
    CHECK(t && tokenizer_encode_response(t, " \u3000#### 42", &s1) == MOERL_OK &&
              tokenizer_encode_response(t, "#### 42", &s2) == MOERL_OK && s1.n == s2.n &&
              !memcmp(s1.ids, s2.ids, sizeof(int32_t) * (size_t)s1.n) && s2.ids[s2.n - 1] == 151645,
          "SFT target through Jinja = native on the stripped text: %s", moerl_last_error());
    tok_seq_free(&s1);
    tok_seq_free(&s2);
    /* the built-in name on a tokenizer without Qwen3's template: refused, not dropped */
    tokenizer *b = tokenizer_new_bytes();
    tokenizer_set_chat_template(b, "qwen3", true, "data.chat_template");
    CHECK(tokenizer_chat_check_ex(b, r->prompt, r->n_prompt, &x) != MOERL_OK &&
              strstr(moerl_last_error(), "native qwen3"),
          "native qwen3 refuses tool calls: %s", moerl_last_error());
    tokenizer_free(b);
    dataset_free(&d);
    tokenizer_free(t);
    json_decref(specials);
    jinja_free(jt);
    json_decref(cfg);
}

int main(void) {
    const char *td = getenv("MOERL_TESTDATA");
    snprintf(g_td, sizeof g_td, "%s", td && *td ? td : "build/testdata");
    snprintf(g_tmp, sizeof g_tmp, "%s/test_chat", g_td);
    mkdir(g_td, 0755);
    mkdir(g_tmp, 0755);
    test_dataset_tools();
    test_plain_fingerprint();
    test_dataset_errors();
    test_chat_call();
    test_jinja_file();
    test_jinja_errors();
    test_jinja_response();
    test_prompt_files();
    char q[1200], p[1300];
    snprintf(q, sizeof q, "%s/qwen3_tok", g_td);
    snprintf(p, sizeof p, "%s/tokenizer.json", q);
    struct stat st;
    CHECK(stat(p, &st) == 0, "%s exists (tests/ref/gen_tokenizer.py makes it)", p);
    if (stat(p, &st) == 0) test_qwen3_fast_path(q);
    test_save_template(stat(p, &st) == 0 ? q : NULL);
    TEST_MAIN_END();
}
