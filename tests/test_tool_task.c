/* The worked agentic task (examples/tool_use.yaml): the tool_arith generator (deterministic, the
 * product checked by recomputing it from the prompt, the demonstration's tool call parsed by the
 * hermes parser and answered by the same product), its reward (the final assistant turn's answer
 * only: a tool response holding the number, or an answer given before the tool turn, earns 0), the
 * dataset's response-as-messages (round trip and the errors naming FILE:LINE and field), and the SFT
 * encoding of a tool-call demonstration (ds_row_encode_sft): the ids equal the whole conversation
 * rendered by the template and encoded in one go (byte tokenizer with the example's template; Qwen3's
 * tokenizer with its own template), the mask is 1 exactly on the assistant turns (their text and
 * end-of-turn token), and a tool response spelling <|im_end|> stays text. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "data/dataset.h"
#include "data/tasks.h"
#include "data/tokenizer.h"
#include "data/tool_calls.h"
#include "test.h"

static char g_dir[64];
static const char *k_tpl = "examples/tool_use/chat_template.jinja";

static char *slurp(const char *path) {
    char *s = NULL;
    size_t n = 0;
    if (moerl_read_file(path, &s, &n) != MOERL_OK) return NULL;
    return s;
}

/* ---- the generator ---- */

static void gen(const char *tag, uint64_t seed, int64_t n_train, char *tr, char *te) {
    task_opts o;
    task_opts_default(&o);
    o.n_train = n_train;
    o.n_test = 20;
    o.seed = seed;
    o.arith_digits = 4;
    snprintf(tr, 256, "%s/%s_train.jsonl", g_dir, tag);
    snprintf(te, 256, "%s/%s_test.jsonl", g_dir, tag);
    CHECK(task_generate("tool_arith", &o, tr, te) == MOERL_OK, "%s: %s", tag, moerl_last_error());
}

/* One generated row: its prompt "Compute A*B.", the product as ground truth (recomputed here), the
 * calc tool in "tools", and the demonstration call → tool answer → "Answer: N". */
static void check_row(const ds_row *r, int *bad) {
    long long a = 0, b = 0;
    char tail[8] = "";
    int ok = r->n_prompt == 1 && !strcmp(r->prompt[0].role, "user") &&
             sscanf(r->prompt[0].content, "Compute %lld*%lld%7s", &a, &b, tail) == 3 && !strcmp(tail, ".") &&
             a >= 1000 && a <= 9999 && b >= 1000 && b <= 9999;
    char want[32], call[160], fin[48];
    snprintf(want, sizeof want, "%lld", a * b);
    ok = ok && !strcmp(r->data_source, "tool_arith") && !strcmp(r->ground_truth, want) && !r->ground_truth_json;
    ok = ok && r->tools && json_array_size(r->tools) == 1 &&
         !strcmp(json_string_value(json_object_get(json_object_get(json_array_get(r->tools, 0), "function"), "name")),
                 "calc");
    snprintf(call, sizeof call, "{\"expr\":\"%lld*%lld\"}", a, b);
    snprintf(fin, sizeof fin, "Answer: %s", want);
    ok = ok && !r->response && r->n_resp_msgs == 3 && !strcmp(r->resp_msgs[0].role, "assistant") &&
         !strcmp(r->resp_msgs[1].role, "tool") && !strcmp(r->resp_msgs[1].content, want) &&
         !strcmp(r->resp_msgs[2].role, "assistant") && !strcmp(r->resp_msgs[2].content, fin);
    if (ok) { /* the demonstration's call is what the rollout's parser reads as a calc call */
        tool_calls tc;
        const char *c = r->resp_msgs[0].content;
        MOERL_ASSERT(tool_calls_parse_hermes(c, strlen(c), NULL, &tc) == MOERL_OK);
        ok = tc.n == 1 && !tc.calls[0].error && !strcmp(tc.calls[0].name, "calc") && !strcmp(tc.calls[0].arguments, call) &&
             !tc.content[0];
        tool_calls_free(&tc);
    }
    if (!ok && (*bad)++ < 3) fprintf(stderr, "row at line %lld is not as expected\n", (long long)r->line);
}

static void test_generator(void) {
    char tr1[256], te1[256], tr2[256], te2[256], tr3[256], te3[256];
    gen("a", 7, 200, tr1, te1);
    gen("b", 7, 200, tr2, te2);
    gen("c", 8, 200, tr3, te3);
    char *a = slurp(tr1), *b = slurp(tr2), *c = slurp(tr3), *ta = slurp(te1), *tb = slurp(te2);
    CHECK(a && b && !strcmp(a, b) && ta && tb && !strcmp(ta, tb), "the same options give the same files");
    CHECK(a && c && strcmp(a, c), "another seed gives other rows");
    free(a); free(b); free(c); free(ta); free(tb);
    dataset tr, te;
    CHECK(dataset_load(&tr, tr1) == MOERL_OK && dataset_load(&te, te1) == MOERL_OK, "load: %s", moerl_last_error());
    CHECK(tr.n == 200 && te.n == 20, "rows %lld/%lld", (long long)tr.n, (long long)te.n);
    int bad = 0;
    for (int64_t i = 0; i < tr.n; i++) check_row(dataset_row(&tr, i), &bad);
    for (int64_t i = 0; i < te.n; i++) check_row(dataset_row(&te, i), &bad);
    CHECK(bad == 0, "%d rows differ from prompt/truth/tools/demonstration (above)", bad);
    int shared = 0; /* no held-out prompt among the training prompts */
    for (int64_t i = 0; i < te.n; i++)
        for (int64_t j = 0; j < tr.n; j++)
            shared += !strcmp(dataset_row(&te, i)->prompt[0].content, dataset_row(&tr, j)->prompt[0].content);
    CHECK(shared == 0, "%d held-out prompts are training prompts", shared);
    dataset_free(&tr);
    dataset_free(&te);
    task_opts o;
    task_opts_default(&o);
    o.arith_digits = 10;
    CHECK(task_generate("tool_arith", &o, tr1, te1) == MOERL_ERR && strstr(moerl_last_error(), "arith_digits = 10") &&
              strstr(moerl_last_error(), "1..9"),
          "10-digit operands refused (the product would pass 18 digits): %s", moerl_last_error());
    int nf = 0, found = 0;
    const char *const *fam = task_families(&nf);
    for (int i = 0; i < nf; i++) found |= !strcmp(fam[i], "tool_arith");
    CHECK(found, "tool_arith is among task_families()");
}

/* ---- the reward ---- */

static double score(const char *resp, const char *truth) {
    double s = -1;
    MOERL_ASSERT(reward_fn_for("tool_arith") == reward_tool_answer);
    MOERL_ASSERT(reward_tool_answer(resp, truth, &s) == MOERL_OK);
    return s;
}

static void test_reward(void) {
    /* whole decoded trajectories (special tokens skipped, as rollouts decode them) */
    const char *call = "<tool_call>{\"name\":\"calc\",\"arguments\":{\"expr\":\"1234*5678\"}}</tool_call>";
    char r[512];
    snprintf(r, sizeof r, "%s\nuser\n<tool_response>\n7006652\n</tool_response>\nassistant\nAnswer: 7006652", call);
    CHECK(score(r, "7006652") == 1.0, "the final turn's answer: 1");
    CHECK(score(r, "7006653") == 0.0, "a wrong final answer: 0");
    snprintf(r, sizeof r, "%s\nuser\n<tool_response>\n7006652\n</tool_response>\nassistant\n", call);
    CHECK(score(r, "7006652") == 0.0, "the number only in the tool response (an empty final turn): 0");
    snprintf(r, sizeof r, "%s\nuser\n<tool_response>\nAnswer: 7006652\n</tool_response>", call);
    CHECK(score(r, "7006652") == 0.0, "a tool response spelling \"Answer: N\" (no final turn): 0");
    snprintf(r, sizeof r, "Answer: 7006652 %s\nuser\n<tool_response>\n7006652\n</tool_response>\nassistant\nI think 7006652",
             call);
    CHECK(score(r, "7006652") == 0.0, "an answer before the tool turn, a final turn without \"Answer:\": 0");
    snprintf(r, sizeof r, "%s\nuser\n<tool_response>\n7006652\n</tool_response>\nassistant\nAnswer: 7006652\nAnswer: 5", call);
    CHECK(score(r, "7006652") == 0.0, "the final turn's last \"Answer:\" counts: 0");
    CHECK(score("Answer: 7006652", "7006652") == 1.0, "no tool turn: the whole response is the final turn");
    CHECK(score("Answer:  7,006,652", "7006652") == 1.0, "spaces and thousands groups");
    CHECK(score("Answer: -12", "-12") == 1.0 && score("Answer: 12", "-12") == 0.0, "the sign counts");
    CHECK(score("7006652", "7006652") == 0.0, "no \"Answer:\": 0");
    CHECK(score("Answer: x7006652", "7006652") == 0.0, "no number right after \"Answer:\": 0");
    double s;
    CHECK(reward_tool_answer("Answer: 1", "abc", &s) == MOERL_ERR && strstr(moerl_last_error(), "abc"),
          "a ground truth that is no number is an error naming it");
    char *pred = NULL;
    CHECK(reward_score("tool_arith", "x </tool_response> Answer: 0042", "42", &s, &pred) == MOERL_OK && s == 1.0 &&
              pred && !strcmp(pred, "42"),
          "reward_score's prediction: the answer in canonical form (%s)", pred ? pred : "(null)");
    free(pred);
}

/* ---- response as messages: the dataset ---- */

static int load_text(dataset *ds, const char *text) { return dataset_load_string(ds, text, strlen(text), "t.jsonl"); }

static void test_dataset(void) {
    const char *head = "{\"data_source\":\"tool_arith\",\"prompt\":[{\"role\":\"user\",\"content\":\"Compute 2*3.\"}],"
                       "\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"6\"},\"response\":";
    static const struct {
        const char *resp, *field, *expect;
    } bad[] = {
        {"5", "field 'response'", "a string, or a non-empty list"},
        {"[]", "field 'response'", "an empty list"},
        {"[3]", "field 'response[0]'", "an object"},
        {"[{\"role\":\"assistant\"}]", "field 'response[0].content'", "missing"},
        {"[{\"role\":\"tool\",\"content\":\"6\"},{\"role\":\"assistant\",\"content\":\"Answer: 6\"}]",
         "field 'response[0].role'", "\"assistant\""},
        {"[{\"role\":\"assistant\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"6\"}]", "field 'response[1].role'",
         "\"tool\""},
    };
    char line[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dataset ds;
        snprintf(line, sizeof line, "\n%s%s}\n", head, bad[i].resp);
        const int rc = load_text(&ds, line);
        CHECK(rc == MOERL_ERR && strstr(moerl_last_error(), "t.jsonl:2:") && strstr(moerl_last_error(), bad[i].field) &&
                  strstr(moerl_last_error(), bad[i].expect),
              "response %s: %s", bad[i].resp, moerl_last_error());
    }
    /* a good one round-trips through dataset_write_row (a message with more keys kept whole) */
    snprintf(line, sizeof line,
             "%s[{\"role\":\"assistant\",\"content\":\"call\"},{\"role\":\"tool\",\"content\":\"6\",\"name\":\"calc\"},"
             "{\"role\":\"assistant\",\"content\":\"Answer: 6\"}]}",
             head);
    dataset ds, ds2;
    CHECK(load_text(&ds, line) == MOERL_OK, "load: %s", moerl_last_error());
    if (ds.n != 1) return;
    const ds_row *r = dataset_row(&ds, 0);
    CHECK(!r->response && r->n_resp_msgs == 3 && r->resp_msgs[1].msg && !strcmp(r->resp_msgs[2].content, "Answer: 6"),
          "response messages parsed");
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    MOERL_ASSERT(dataset_write_row(f, r) == MOERL_OK);
    fclose(f);
    CHECK(load_text(&ds2, buf) == MOERL_OK && ds2.n == 1 && dataset_row(&ds2, 0)->n_resp_msgs == 3 &&
              !strcmp(dataset_row(&ds2, 0)->resp_msgs[1].content, "6") &&
              json_equal(dataset_row(&ds2, 0)->resp_msgs[1].msg, r->resp_msgs[1].msg),
          "round trip: %s", buf);
    free(buf);
    dataset_free(&ds2);
    dataset_free(&ds);
}

/* ---- the SFT encoding ---- */

/* ds_row_encode_sft on row r against the template's whole rendering: ids = the conversation rendered
 * (no generation prompt) and encoded in one go, cut after the last assistant turn's end-of-turn id;
 * resp_start = the prompt's ids (with the generation prompt); the mask's 1-runs decode to each
 * assistant turn's text + eot, its 0-runs to the tool turns' template text. want_text[k]: the k-th
 * run (1, 0, 1, ... alternating), NULL-terminated. */
static void check_sft(tokenizer *t, const ds_row *r, int32_t eot, const char *const *want_runs, const char *tag) {
    tok_set_current(t);
    tok_seq ids = {0}, whole = {0}, prompt = {0};
    int rs = -1;
    uint8_t *mask = NULL;
    CHECK(ds_row_encode_sft(r, "ROW", &ids, &rs, &mask) == MOERL_OK, "%s: %s", tag, moerl_last_error());
    const int n = r->n_prompt + r->n_resp_msgs;
    chat_msg *all = xmalloc((size_t)n * sizeof *all);
    memcpy(all, r->prompt, (size_t)r->n_prompt * sizeof *all);
    memcpy(all + r->n_prompt, r->resp_msgs, (size_t)r->n_resp_msgs * sizeof *all);
    const chat_extra x = {r->tools, NULL};
    MOERL_ASSERT(tokenizer_chat_encode_ex(t, all, n, &x, false, &whole) == MOERL_OK);
    MOERL_ASSERT(tokenizer_chat_encode_ex(t, r->prompt, r->n_prompt, &x, true, &prompt) == MOERL_OK);
    int64_t last = -1;
    for (int64_t i = 0; i < whole.n; i++)
        if (whole.ids[i] == eot) last = i;
    CHECK(ids.n == last + 1 && !memcmp(ids.ids, whole.ids, (size_t)ids.n * sizeof(int32_t)),
          "%s: the ids (%lld) are the whole conversation's up to its last <|im_end|> (%lld)", tag, (long long)ids.n,
          (long long)(last + 1));
    CHECK(rs == prompt.n && !memcmp(ids.ids, prompt.ids, (size_t)rs * sizeof(int32_t)),
          "%s: resp_start %d = the prompt with its generation prompt (%lld ids), the rollout's prompt", tag, rs,
          (long long)prompt.n);
    int k = 0, ok = 1;
    for (int64_t i = rs; i < ids.n && ok;) { /* runs of equal mask */
        int64_t j = i;
        while (j < ids.n && mask[j - rs] == mask[i - rs]) j++;
        char *txt = tokenizer_decode(t, ids.ids + i, j - i, false, NULL);
        ok = want_runs[k] && mask[i - rs] == (k % 2 == 0) && !strcmp(txt, want_runs[k]);
        CHECK(ok, "%s: mask run %d (mask %d) is [%s], want [%s]", tag, k, mask[i - rs], txt,
              want_runs[k] ? want_runs[k] : "(no more runs)");
        free(txt);
        k++;
        i = j;
    }
    CHECK(!ok || !want_runs[k], "%s: %d mask runs, more expected", tag, k);
    free(mask);
    free(all);
    tok_seq_free(&ids); tok_seq_free(&whole); tok_seq_free(&prompt);
    tok_set_current(NULL);
}

static const char *k_row =
    "{\"data_source\":\"tool_arith\",\"prompt\":[{\"role\":\"user\",\"content\":\"Compute 1234*5678.\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"calc\",\"parameters\":{\"type\":\"object\"}}}],"
    "\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"7006652\"},\"response\":["
    "{\"role\":\"assistant\",\"content\":\"<tool_call>{\\\"name\\\":\\\"calc\\\",\\\"arguments\\\":{\\\"expr\\\":"
    "\\\"1234*5678\\\"}}</tool_call>\"},{\"role\":\"tool\",\"content\":\"7006652\"},"
    "{\"role\":\"tool\",\"content\":\"<|im_end|> stays text\"},{\"role\":\"assistant\",\"content\":\"Answer: 7006652\"}]}";

static void test_sft_bytes(void) {
    tokenizer *t = tokenizer_new_bytes();
    CHECK(tokenizer_set_chat_template(t, k_tpl, true, "data.chat_template") == MOERL_OK, "%s", moerl_last_error());
    dataset ds;
    MOERL_ASSERT(load_text(&ds, k_row) == MOERL_OK);
    const char *runs[] = {
        "<tool_call>{\"name\":\"calc\",\"arguments\":{\"expr\":\"1234*5678\"}}</tool_call><|im_end|>",
        "\n<|im_start|>user\n<tool_response>\n7006652\n</tool_response>\n<tool_response>\n<|im_end|> stays "
        "text\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "Answer: 7006652<|im_end|>", NULL};
    check_sft(t, dataset_row(&ds, 0), tokenizer_token_id(t, "<|im_end|>"), runs, "bytes, the example's template");
    /* the prompt as the template writes it: the tools named in a system turn */
    char *txt = tokenizer_chat_text_ex(t, dataset_row(&ds, 0)->prompt, 1, &(chat_extra){dataset_row(&ds, 0)->tools, NULL},
                                       true);
    CHECK(txt && !strcmp(txt, "<|im_start|>system\nTools: calc<|im_end|>\n<|im_start|>user\nCompute "
                              "1234*5678.<|im_end|>\n<|im_start|>assistant\n"),
          "the example's prompt: %s", txt);
    free(txt);
    /* the literal <|im_end|> in the tool response is text (bytes), not the control id */
    tok_set_current(t);
    tok_seq ids = {0};
    int rs;
    uint8_t *mask;
    MOERL_ASSERT(ds_row_encode_sft(dataset_row(&ds, 0), "ROW", &ids, &rs, &mask) == MOERL_OK);
    int n_eot = 0;
    for (int64_t i = 0; i < ids.n; i++) n_eot += ids.ids[i] == tokenizer_token_id(t, "<|im_end|>");
    CHECK(n_eot == 5, "5 <|im_end|> ids (system and user turns, two assistant turns, the tool turn), got %d", n_eot);
    free(mask);
    tok_seq_free(&ids);
    /* a string response: tok_encode_response's ids, no mask */
    ds_row r = *dataset_row(&ds, 0);
    r.response = "Answer: 7006652";
    tok_seq want = {0};
    ids.n = 0;
    MOERL_ASSERT(tokenizer_chat_encode_ex(t, r.prompt, 1, &(chat_extra){r.tools, NULL}, true, &want) == MOERL_OK);
    tok_encode_response("Answer: 7006652", &want);
    CHECK(ds_row_encode_sft(&r, "ROW", &ids, &rs, &mask) == MOERL_OK && !mask && ids.n == want.n &&
              !memcmp(ids.ids, want.ids, (size_t)ids.n * sizeof(int32_t)),
          "a string response: the prompt and tok_encode_response's ids, mask NULL");
    r.response = NULL;
    r.resp_msgs = NULL;
    CHECK(ds_row_encode_sft(&r, "ROW", &ids, &rs, &mask) == MOERL_ERR && strstr(moerl_last_error(), "ROW: SFT needs a "
                                                                                                     "'response'"),
          "no response: %s", moerl_last_error());
    tok_seq_free(&ids); tok_seq_free(&want);
    /* the native chatml template cannot render the tools: an error naming the row */
    MOERL_ASSERT(tokenizer_set_chat_template(t, "chatml", true, "data.chat_template") == MOERL_OK);
    ids = (tok_seq){0};
    CHECK(ds_row_encode_sft(dataset_row(&ds, 0), "FILE:3", &ids, &rs, &mask) == MOERL_ERR &&
              strstr(moerl_last_error(), "FILE:3: "),
          "a template that cannot render the conversation: %s", moerl_last_error());
    tok_seq_free(&ids);
    tok_set_current(NULL);
    dataset_free(&ds);
    tokenizer_free(t);
}

/* Qwen3's tokenizer with its own template (through the Jinja interpreter, thinking on: the think block
 * Qwen3 writes into the last assistant turn is part of that turn). */
static void test_sft_qwen3(void) {
    const char *d = getenv("MOERL_TESTDATA");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3_tok", d ? d : "build/testdata");
    tokenizer *t = tokenizer_load(dir, 151936);
    CHECK(t != NULL, "load %s: %s (run tests/ref/gen_tokenizer.py first)", dir, moerl_last_error());
    if (!t) return;
    MOERL_ASSERT(tokenizer_set_chat_template(t, "qwen3", true, "data.chat_template") == MOERL_OK);
    const char *row = "{\"data_source\":\"tool_arith\",\"prompt\":[{\"role\":\"user\",\"content\":\"What is 12*34?\"}],"
                      "\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"408\"},\"response\":["
                      "{\"role\":\"assistant\",\"content\":\"<tool_call>\\n{\\\"name\\\": \\\"calc\\\"}\\n</tool_call>\"},"
                      "{\"role\":\"tool\",\"content\":\"408\"},{\"role\":\"assistant\",\"content\":\"Answer: 408\"}]}";
    dataset ds;
    MOERL_ASSERT(load_text(&ds, row) == MOERL_OK);
    const char *runs[] = {"<tool_call>\n{\"name\": \"calc\"}\n</tool_call><|im_end|>",
                          "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                          "<think>\n\n</think>\n\nAnswer: 408<|im_end|>", NULL};
    check_sft(t, dataset_row(&ds, 0), tokenizer_token_id(t, "<|im_end|>"), runs, "qwen3");
    dataset_free(&ds);
    tokenizer_free(t);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/moerl_test_tool_task_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_generator();
    test_reward();
    test_dataset();
    test_sft_bytes();
    test_sft_qwen3();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_MAIN_END();
}
