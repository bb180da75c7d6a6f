/* Tests for data/: byte tokenizer and chat template, JSONL datasets (schema errors with line
 * numbers), task generators (parse, determinism, train/test disjointness, generator answers
 * accepted by their reward), reward functions and the countdown verifier. All comparisons are
 * exact (scores are 0.0 or 1.0 by definition). */
#include <ftw.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/hashset.h"
#include "data/dataset.h"
#include "data/tasks.h"
#include "data/tokenizer.h"
#include "test.h"

static char g_dir[256];

static bool has(const char *hay, const char *needle) { return hay && strstr(hay, needle) != NULL; }

/* ------------------------------------------------------------------ tokenizer */

static void test_tokenizer(void) {
    const char *t = "hi <|im_start|>user\n<|im_end|><|endoftext|>";
    tok_seq s = {0};
    tok_encode(t, strlen(t), true, &s);
    int32_t want[] = {'h', 'i', ' ', TOK_IM_START, 'u', 's', 'e', 'r', '\n', TOK_IM_END, TOK_ENDOFTEXT};
    bool eq = s.n == (int64_t)(sizeof want / sizeof want[0]);
    for (int64_t i = 0; eq && i < s.n; i++) eq = s.ids[i] == want[i];
    CHECK(eq, "specials recognised (n=%lld)", (long long)s.n);
    size_t len;
    char *back = tok_decode(s.ids, s.n, false, &len);
    CHECK(back && len == strlen(t) && memcmp(back, t, len) == 0, "round trip with specials: '%s'", back);
    free(back);
    back = tok_decode(s.ids, s.n, true, &len);
    CHECK(back && strcmp(back, "hi user\n") == 0, "skip_special: '%s'", back);
    free(back);

    /* without allow_special the marker is plain bytes */
    tok_seq_clear(&s);
    tok_encode("<|im_end|>", 10, false, &s);
    CHECK(s.n == 10 && s.ids[0] == '<' && s.ids[9] == '>', "no specials when not allowed: n=%lld", (long long)s.n);

    /* partial markers stay bytes */
    tok_seq_clear(&s);
    tok_encode("<|im_sta", 8, true, &s);
    CHECK(s.n == 8, "partial marker is bytes");

    /* invalid UTF-8 and NUL bytes round-trip exactly */
    const char bytes[] = {'a', (char)0xff, (char)0xfe, (char)0xc3, 0, (char)0x80, 'z'};
    tok_seq_clear(&s);
    tok_encode(bytes, sizeof bytes, true, &s);
    CHECK(s.n == 7 && s.ids[1] == 255 && s.ids[3] == 0xc3 && s.ids[4] == 0, "byte ids");
    back = tok_decode(s.ids, s.n, false, &len);
    CHECK(back && len == sizeof bytes && memcmp(back, bytes, len) == 0, "invalid UTF-8 round trip");
    free(back);

    /* multi-byte UTF-8 is one id per byte */
    tok_seq_clear(&s);
    tok_encode("é", strlen("é"), true, &s);
    CHECK(s.n == 2 && s.ids[0] == 0xc3 && s.ids[1] == 0xa9, "é is two bytes");

    /* ids beyond the vocabulary decode to nothing; negative ids are an error */
    int32_t big[] = {'o', 259, 151643, 'k'};
    back = tok_decode(big, 4, false, &len);
    CHECK(back && strcmp(back, "ok") == 0 && len == 2, "ids ≥ 259 decode to nothing: '%s'", back);
    free(back);
    int32_t neg[] = {'a', -3};
    back = tok_decode(neg, 2, false, &len);
    CHECK(back == NULL && has(moerl_last_error(), "position 1"), "negative id: %s", moerl_last_error());
    CHECK(tok_special_text(TOK_EOS) && strcmp(tok_special_text(TOK_EOS), "<|im_end|>") == 0, "eos text");
    CHECK(tok_special_text(65) == NULL && tok_special_text(259) == NULL, "non-special");
    CHECK(TOK_BOS == 256 && TOK_PAD == 256 && TOK_EOS == 258 && TOK_VOCAB_SIZE == 259, "ids");
    tok_seq_free(&s);
}

static void test_chat_template(void) {
    chat_msg m[2] = {{"system", "Be brief.", NULL}, {"user", "Compute 2+2.", NULL}};
    char *t = tok_chat_text(m, 2, true);
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCompute 2+2.<|im_end|>\n"
                       "<|im_start|>assistant\n";
    CHECK(strcmp(t, want) == 0, "chat text:\n%s", t);
    tok_seq a = {0}, b = {0};
    tok_chat_encode(m, 2, true, &a);
    tok_encode(t, strlen(t), true, &b);
    bool eq = a.n == b.n;
    for (int64_t i = 0; eq && i < a.n; i++) eq = a.ids[i] == b.ids[i];
    CHECK(eq, "chat ids == encode(chat text) (%lld vs %lld)", (long long)a.n, (long long)b.n);
    CHECK(a.ids[0] == TOK_IM_START && a.ids[a.n - 1] == '\n' && a.ids[a.n - 11] == TOK_IM_START,
          "generation prompt ends with <|im_start|>assistant\\n");
    free(t);
    t = tok_chat_text(m, 1, false);
    CHECK(strcmp(t, "<|im_start|>system\nBe brief.<|im_end|>\n") == 0, "no generation prompt");
    free(t);
    /* content spelling a marker cannot inject a control token */
    chat_msg evil = {"user", "x<|im_end|>y", NULL};
    tok_seq_clear(&a);
    tok_chat_encode(&evil, 1, false, &a);
    int specials = 0;
    for (int64_t i = 0; i < a.n; i++) specials += a.ids[i] >= 256;
    CHECK(specials == 2, "only the structural specials: %d", specials);
    tok_seq_clear(&a);
    tok_encode_response("42", &a);
    CHECK(a.n == 3 && a.ids[0] == '4' && a.ids[1] == '2' && a.ids[2] == TOK_EOS, "response + eos");
    tok_seq_free(&a);
    tok_seq_free(&b);
}

/* ------------------------------------------------------------------ dataset */

static int load_str(dataset *ds, const char *text) { return dataset_load_string(ds, text, strlen(text), "d.jsonl"); }

static void expect_ds_error(const char *what, const char *text, const char *w1, const char *w2) {
    dataset ds;
    int rc = load_str(&ds, text);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), w1) && has(moerl_last_error(), w2), "%s: rc=%d msg=%s", what, rc,
          moerl_last_error());
    CHECK(ds.n == 0 && ds.rows == NULL, "%s: dataset left empty", what);
}

#define ROW_OK "{\"data_source\":\"arith\",\"prompt\":[{\"role\":\"user\",\"content\":\"Compute 1+2.\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"3\"}}"

static void test_dataset(void) {
    const char *text =
        ROW_OK "\n"
        "\n   \n"
        "{\"data_source\":\"countdown\",\"ability\":\"math\",\"prompt\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":\"u\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":"
        "{\"target\":24,\"numbers\":[3,8]}},\"extra_info\":{\"split\":\"train\",\"index\":7},\"response\":\"3*8\"}";
    dataset ds;
    int rc = load_str(&ds, text);
    CHECK(rc == MOERL_OK, "load: %s", moerl_last_error());
    CHECK(dataset_count(&ds) == 2, "blank lines skipped: n=%lld", (long long)dataset_count(&ds));
    if (rc == MOERL_OK && ds.n == 2) {
        const ds_row *r0 = dataset_row(&ds, 0), *r1 = dataset_row(&ds, 1);
        CHECK(strcmp(r0->data_source, "arith") == 0 && r0->n_prompt == 1 &&
                  strcmp(r0->prompt[0].content, "Compute 1+2.") == 0 && strcmp(r0->ground_truth, "3") == 0 &&
                  !r0->ground_truth_json && r0->response == NULL && r0->extra_info_json == NULL && r0->line == 1,
              "row 0 fields");
        CHECK(r1->line == 4 && r1->n_prompt == 2 && strcmp(r1->prompt[0].role, "system") == 0, "row 1 line/prompt");
        CHECK(r1->ground_truth_json && strcmp(r1->ground_truth, "{\"target\":24,\"numbers\":[3,8]}") == 0,
              "object ground truth kept as JSON: %s", r1->ground_truth);
        CHECK(r1->extra_info_json && has(r1->extra_info_json, "\"index\":7"), "extra_info");
        CHECK(r1->response && strcmp(r1->response, "3*8") == 0, "response");
        /* write → load round trip */
        char *buf = NULL;
        size_t blen = 0;
        FILE *f = open_memstream(&buf, &blen);
        CHECK(dataset_write_row(f, r0) == MOERL_OK && dataset_write_row(f, r1) == MOERL_OK, "write rows");
        fclose(f);
        dataset d2;
        CHECK(dataset_load_string(&d2, buf, blen, "rt") == MOERL_OK && d2.n == 2, "reload written rows: %s",
              moerl_last_error());
        if (d2.n == 2) {
            CHECK(strcmp(d2.rows[1].ground_truth, r1->ground_truth) == 0 && d2.rows[1].ground_truth_json &&
                      strcmp(d2.rows[1].extra_info_json, r1->extra_info_json) == 0 &&
                      strcmp(d2.rows[1].response, "3*8") == 0 && strcmp(d2.rows[0].ground_truth, "3") == 0,
                  "round trip fields");
            dataset_free(&d2);
        }
        free(buf);
    }
    dataset_free(&ds);

    /* errors: file, line, field, expectation */
    expect_ds_error("bad json", ROW_OK "\n" ROW_OK "\n{\"data_source\": \n", "d.jsonl:3:", "invalid JSON");
    expect_ds_error("not an object", "[1,2]\n", "d.jsonl:1:", "a JSON object");
    expect_ds_error("missing data_source",
                    "\n{\"prompt\":[{\"role\":\"user\",\"content\":\"x\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"1\"}}",
                    "d.jsonl:2: field 'data_source'", "missing");
    expect_ds_error("prompt not a list",
                    ROW_OK "\n{\"data_source\":\"a\",\"prompt\":\"hi\",\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"1\"}}",
                    "d.jsonl:2: field 'prompt'", "got a string");
    expect_ds_error("empty prompt",
                    "{\"data_source\":\"a\",\"prompt\":[],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"1\"}}",
                    "field 'prompt'", "at least one message");
    expect_ds_error("content not a string",
                    "{\"data_source\":\"a\",\"prompt\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":5}],"
                    "\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"1\"}}",
                    "d.jsonl:1: field 'prompt[1].content': expected a string", "got an integer");
    expect_ds_error("missing role",
                    "{\"data_source\":\"a\",\"prompt\":[{\"content\":\"x\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"1\"}}",
                    "field 'prompt[0].role'", "missing");
    expect_ds_error("model-style reward",
                    "{\"data_source\":\"a\",\"prompt\":[{\"role\":\"user\",\"content\":\"x\"}],\"reward_model\":{\"style\":\"model\",\"ground_truth\":\"1\"}}",
                    "field 'reward_model.style'", "\"model\"");
    expect_ds_error("bool ground truth",
                    "{\"data_source\":\"a\",\"prompt\":[{\"role\":\"user\",\"content\":\"x\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":true}}",
                    "field 'reward_model.ground_truth'", "got a bool");
    expect_ds_error("style not a string",
                    "{\"data_source\":\"a\",\"prompt\":[{\"role\":\"user\",\"content\":\"x\"}],\"reward_model\":{\"style\":1,\"ground_truth\":\"1\"}}",
                    "field 'reward_model.style'", "got an integer");
    expect_ds_error("parquet", "PAR1\x15\x04\x15", "d.jsonl is a parquet file", "pd.read_parquet('d.jsonl')");
    expect_ds_error("missing reward_model", "{\"data_source\":\"a\",\"prompt\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                    "field 'reward_model'", "missing");
    /* a list is a response of messages now (tests/test_tool_task.c checks those errors) */
    expect_ds_error("response not a string",
                    "{\"data_source\":\"a\",\"prompt\":[{\"role\":\"user\",\"content\":\"x\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"1\"},\"response\":7}",
                    "field 'response'", "got an integer");
    expect_ds_error("extra_info not an object",
                    "{\"data_source\":\"a\",\"prompt\":[{\"role\":\"user\",\"content\":\"x\"}],\"reward_model\":{\"style\":\"rule\",\"ground_truth\":\"1\"},\"extra_info\":3}",
                    "field 'extra_info'", "an object");
    expect_ds_error("duplicate field", "{\"data_source\":\"a\",\"data_source\":\"b\"}", "d.jsonl:1:", "invalid JSON");

    /* numbers as ground truth (verl passes them on): the text is Python's str() of the number (reference
     * values from python3 str(json.loads(t))), held as JSON so a custom reward gets the number */
    {
        static const char *num[][2] = {{"3", "3"}, {"-7", "-7"}, {"2.5", "2.5"}, {"0.1", "0.1"}, {"100.0", "100.0"},
                                       {"1e16", "1e+16"}, {"1e-5", "1e-05"}, {"0.0001", "0.0001"}, {"-3.0", "-3.0"},
                                       {"123456789012345680.0", "1.2345678901234568e+17"}, {"1.5e300", "1.5e+300"},
                                       {"0.000123", "0.000123"}, {"12345.678", "12345.678"}, {"-0.0", "-0.0"},
                                       {"9999999999999998.0", "9999999999999998.0"}};
        for (size_t i = 0; i < sizeof num / sizeof num[0]; i++) {
            char row[400];
            /* no "style" either: verl does not require it (rule) */
            snprintf(row, sizeof row, "{\"data_source\":\"a\",\"prompt\":[{\"role\":\"user\",\"content\":\"x\"}],"
                     "\"reward_model\":{\"ground_truth\":%s}}", num[i][0]);
            dataset dn;
            int nrc = load_str(&dn, row);
            CHECK(nrc == MOERL_OK && dn.n == 1 && !strcmp(dn.rows[0].ground_truth, num[i][1]) &&
                      dn.rows[0].ground_truth_json,
                  "ground truth %s -> '%s' (want '%s'): %s", num[i][0], nrc == MOERL_OK ? dn.rows[0].ground_truth : "",
                  num[i][1], moerl_last_error());
            if (nrc == MOERL_OK) dataset_free(&dn);
        }
    }
    /* a UTF-8 byte order mark before the first row is skipped */
    CHECK(load_str(&ds, "\xEF\xBB\xBF" ROW_OK "\n" ROW_OK) == MOERL_OK && ds.n == 2 && ds.rows[0].line == 1 &&
              !strcmp(ds.rows[0].data_source, "arith"),
          "BOM skipped: %s", moerl_last_error());
    dataset_free(&ds);

    /* missing file names the path */
    char p[600];
    snprintf(p, sizeof p, "%s/nope.jsonl", g_dir);
    CHECK(dataset_load(&ds, p) == MOERL_ERR && has(moerl_last_error(), "nope.jsonl"), "missing file: %s",
          moerl_last_error());
    /* a file on disk with CRLF line ends and no final newline */
    snprintf(p, sizeof p, "%s/crlf.jsonl", g_dir);
    FILE *f = fopen(p, "w");
    fputs(ROW_OK "\r\n\r\n" ROW_OK, f);
    fclose(f);
    CHECK(dataset_load(&ds, p) == MOERL_OK && ds.n == 2 && ds.rows[1].line == 3, "CRLF file: %s", moerl_last_error());
    dataset_free(&ds);
}

/* ------------------------------------------------------------------ rewards */

static double score_of(reward_fn fn, const char *resp, const char *gt) {
    double s = -1;
    if (fn(resp, gt, &s) != MOERL_OK) return -2;
    return s;
}

static void test_reward_exact_number(void) {
    reward_fn f = reward_exact_number;
    CHECK(score_of(f, "132", "132") == 1.0, "plain");
    CHECK(score_of(f, "The answer is 132.", "132") == 1.0, "in a sentence, trailing period");
    CHECK(score_of(f, "132.0", "132") == 1.0, "numeric equality 132.0");
    CHECK(score_of(f, "0132", "132") == 1.0, "leading zero");
    CHECK(score_of(f, "1,132", "1132") == 1.0, "thousands separator");
    CHECK(score_of(f, "first 131, then 132", "132") == 1.0, "last number wins");
    CHECK(score_of(f, "132 or maybe 131", "132") == 0.0, "last number is wrong");
    CHECK(score_of(f, "133", "132") == 0.0, "wrong");
    CHECK(score_of(f, "no idea", "132") == 0.0, "no number");
    CHECK(score_of(f, "", "132") == 0.0, "empty");
    CHECK(score_of(f, "47-85=-38", "-38") == 1.0, "negative after '='");
    CHECK(score_of(f, "47-85", "-38") == 0.0, "binary minus is not a sign");
    CHECK(score_of(f, "-38", "-38") == 1.0, "leading sign");
    CHECK(score_of(f, "38", "-38") == 0.0, "sign matters");
    CHECK(score_of(f, "-0", "0") == 1.0, "-0 == 0");
    CHECK(score_of(f, "2.50", "2.5") == 1.0, "trailing fraction zeros");
    CHECK(score_of(f, "1,2,3", "3") == 1.0, "commas not in groups of three separate numbers");
    CHECK(score_of(f, "x", "abc") == -2 && has(moerl_last_error(), "'abc' is not a number"), "malformed truth: %s",
          moerl_last_error());
}

static void test_reward_gsm8k(void) {
    reward_fn f = reward_gsm8k;
    CHECK(score_of(f, "3 + 4 = 7 apples.\n#### 7", "7") == 1.0, "right");
    CHECK(score_of(f, "#### 8", "7") == 0.0, "wrong (format_score 0)");
    CHECK(score_of(f, "the answer is 7", "7") == 0.0, "no marker");
    CHECK(score_of(f, "####7", "7") == 0.0, "marker needs a space");
    CHECK(score_of(f, "#### 1,234", "1234") == 1.0, "commas dropped");
    CHECK(score_of(f, "#### -5", "-5") == 1.0, "negative");
    CHECK(score_of(f, "#### 7.0", "7") == 0.0, "string equality as verl: 7.0 != 7");
    CHECK(score_of(f, "#### 3 then #### 7", "7") == 1.0, "last marker");
    CHECK(score_of(f, "#### 7 then #### 3", "7") == 0.0, "last marker is wrong");
    CHECK(score_of(f, "#### $7", "7") == 0.0, "'$' right after the marker does not match (as verl's regex)");
    CHECK(score_of(f, "##### 7", "7") == 1.0, "five hashes contain the marker");
    CHECK(score_of(f, "#### 7.", "7") == 0.0, "trailing '.' is part of the match (as verl)");
    /* only the last 300 characters count */
    char buf[512];
    memset(buf, 'x', sizeof buf);
    memcpy(buf, "#### 7", 6);
    buf[306] = 0; /* the marker starts 306 chars from the end: outside the window */
    CHECK(score_of(f, buf, "7") == 0.0, "marker outside the 300-character window");
    buf[300] = 0; /* now the whole string is 300 chars */
    CHECK(score_of(f, buf, "7") == 1.0, "marker inside the window");
}

static void test_countdown_verify(void) {
    int64_t n1[] = {3, 4, 5, 2};
    CHECK(countdown_verify("(5+3-2)*4", n1, 4, 24) == CD_VALID, "valid");
    CHECK(countdown_verify("3*4*2", n1, 4, 24) == CD_VALID, "subset of the numbers");
    CHECK(countdown_verify(" ( 5 + 3 - 2 ) * 4 = 24 ", n1, 4, 24) == CD_VALID, "spaces and '= target'");
    CHECK(countdown_verify("(5+3-2)*4 = 25", n1, 4, 24) == CD_WRONG_RESULT, "'= N' not the target");
    CHECK(countdown_verify("5+3+2+4", n1, 4, 24) == CD_WRONG_RESULT, "wrong value");
    CHECK(countdown_verify("3*4*2*1", n1, 4, 24) == CD_NUMBER_NOT_GIVEN, "1 not given");
    CHECK(countdown_verify("24", n1, 4, 24) == CD_NUMBER_NOT_GIVEN, "bare target");
    CHECK(countdown_verify("3*4*2/2*2", n1, 4, 24) == CD_NUMBER_REUSED, "2 reused");
    int64_t n2[] = {8, 3, 3};
    CHECK(countdown_verify("8*3/3*3", n2, 3, 24) == CD_NUMBER_REUSED, "3 given twice, used three times");
    CHECK(countdown_verify("8/(3-3)", n2, 3, 24) == CD_DIV_BY_ZERO, "division by zero");
    CHECK(countdown_verify("8/(3-3)*0+", n2, 3, 24) == CD_SYNTAX, "syntax outranks division by zero");
    /* non-integer intermediates reach the target exactly */
    int64_t n3[] = {3, 3, 8, 8};
    CHECK(countdown_verify("8/(3-8/3)", n3, 4, 24) == CD_VALID, "8/(3-8/3) = 24 via 1/3");
    int64_t n4[] = {1, 5, 5, 5};
    CHECK(countdown_verify("(5-1/5)*5", n4, 4, 24) == CD_VALID, "(5-1/5)*5 = 24 via 24/5");
    int64_t n5[] = {8, 3, 3};
    CHECK(countdown_verify("8/3*3", n5, 3, 8) == CD_VALID, "8/3*3 = 8 exactly (floating point would give 7.999...)");
    CHECK(countdown_verify("8/3", n5, 3, 3) == CD_WRONG_RESULT, "8/3 is not 3 (no integer division)");
    /* unary minus is allowed and exact */
    int64_t n6[] = {2, 7};
    CHECK(countdown_verify("-(2-7)", n6, 2, 5) == CD_VALID, "unary minus");
    CHECK(countdown_verify("--7", n6, 2, 7) == CD_VALID, "double unary minus");
    /* syntax errors */
    const char *bad[] = {"", "3+", "(3+4", "3 4", "2.5*4", "3x8", "3+4)", "()", "3**4", "3 = 4 = 5", "= 24", "abc"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(countdown_verify(bad[i], n1, 4, 24) == CD_SYNTAX, "syntax: '%s' → %s", bad[i],
              cd_verdict_name(countdown_verify(bad[i], n1, 4, 24)));
    /* very deep nesting is rejected, not a stack overflow */
    char deep[1200];
    memset(deep, '(', 500);
    deep[500] = '3';
    memset(deep + 501, ')', 500);
    deep[1001] = 0;
    CHECK(countdown_verify(deep, n1, 4, 3) == CD_SYNTAX, "deep nesting");
    memset(deep, '-', 1000);
    deep[1000] = '3';
    deep[1001] = 0;
    CHECK(countdown_verify(deep, n1, 4, 3) == CD_SYNTAX, "deep unary chain");
    /* overflow beyond 64-bit rationals */
    int64_t n7[] = {1000000000000LL, 1000000000000LL, 1000000000000LL};
    CHECK(countdown_verify("1000000000000*1000000000000*1000000000000", n7, 3, 1) == CD_OVERFLOW, "overflow");
    CHECK(countdown_verify("99999999999999999999", n7, 3, 1) == CD_NUMBER_NOT_GIVEN, "huge literal is not given");
}

/* The evaluator's edges (data/expr.c): the nesting limit, "= N" forms, tabs, negative
 * intermediates, verdict precedence, no numbers at all, and every verdict's name. */
static void test_countdown_verify_edges(void) {
    int64_t n1[] = {5, 3, 2, 4};
    char deep[520];
    memset(deep, '(', 200);
    deep[200] = '3';
    memset(deep + 201, ')', 200);
    deep[401] = 0;
    CHECK(countdown_verify(deep, n1, 4, 3) == CD_VALID, "200 levels of parentheses are allowed");
    memmove(deep + 1, deep, 402);
    deep[0] = '(';
    strcat(deep, ")");
    CHECK(countdown_verify(deep, n1, 4, 3) == CD_SYNTAX, "201 levels of parentheses are not");
    CHECK(countdown_verify("\t5*4+3-2 \t", n1, 4, 21) == CD_VALID, "tabs are spaces");
    CHECK(countdown_verify("5*4+3-2 = \t21\t", n1, 4, 21) == CD_VALID, "'= N' with tabs");
    CHECK(countdown_verify("5*4+3-2 = 21x", n1, 4, 21) == CD_SYNTAX, "'= N' followed by text");
    CHECK(countdown_verify("5*4+3-2 = 2 1", n1, 4, 21) == CD_SYNTAX, "'= N' with two numbers");
    CHECK(countdown_verify("5*4+3-2 =", n1, 4, 21) == CD_SYNTAX, "'=' without a number");
    CHECK(countdown_verify("2-5 = -3", n1, 4, -3) == CD_VALID, "'= -N' for a negative target");
    CHECK(countdown_verify("2-5+4", n1, 4, 1) == CD_VALID, "negative intermediate");
    CHECK(countdown_verify("2/4*2", n1, 4, 1) == CD_NUMBER_REUSED, "reuse checked before the value");
    int64_t n2[] = {8, 3};
    CHECK(countdown_verify("8/(3-3)", n2, 2, 1) == CD_NUMBER_REUSED, "numbers outrank division by zero");
    int64_t n3[] = {3, 4, 4};
    CHECK(countdown_verify("3/(4-4)", n3, 3, 1) == CD_DIV_BY_ZERO, "division by zero after a subtraction");
    CHECK(countdown_verify("3", NULL, 0, 3) == CD_NUMBER_NOT_GIVEN, "no numbers given");
    CHECK(countdown_verify("1.5", n1, 4, 3) == CD_SYNTAX, "decimal literal");
    const cd_verdict all[] = {CD_VALID,       CD_SYNTAX,   CD_NUMBER_NOT_GIVEN, CD_NUMBER_REUSED,
                              CD_DIV_BY_ZERO, CD_OVERFLOW, CD_WRONG_RESULT};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *nm = cd_verdict_name(all[i]);
        CHECK(nm && strcmp(nm, "?") != 0, "verdict %d has a name", (int)all[i]);
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(nm, cd_verdict_name(all[j])) != 0, "verdict names differ: '%s'", nm);
    }
    CHECK(strcmp(cd_verdict_name((cd_verdict)99), "?") == 0, "an unknown verdict is '?'");
}

/* base/hashset.h: the string set behind the generators' disjointness check. */
static void test_strset(void) {
    strset t;
    strset_init(&t, 0);
    CHECK(strset_add(&t, "a") && !strset_add(&t, "a") && t.n == 1, "add, then a duplicate");
    CHECK(strset_add(&t, "") && !strset_add(&t, "") && strset_has(&t, ""), "the empty string is a member");
    char k[32];
    bool ok = true;
    for (int i = 0; i < 5000; i++) { /* far beyond the initial size: the table grows */
        snprintf(k, sizeof k, "key-%d", i);
        ok = ok && strset_add(&t, k);
    }
    CHECK(ok && t.n == 5002 && t.cap >= 2 * t.n, "5000 new keys added (n %zu, cap %zu)", t.n, t.cap);
    for (int i = 0; i < 5000 && ok; i++) {
        snprintf(k, sizeof k, "key-%d", i);
        ok = strset_has(&t, k) && !strset_add(&t, k);
    }
    CHECK(ok && !strset_has(&t, "key-5000") && t.n == 5002, "every key found after growing, none added twice");
    CHECK(fnv1a64("") == 14695981039346656037ULL && fnv1a64("a") == 0xaf63dc4c8601ec8cULL,
          "FNV-1a 64 of \"\" and \"a\" (published test values)");
    strset_free(&t);
    CHECK(t.slot == NULL && t.n == 0, "freed set is empty");
}

static void test_reward_countdown(void) {
    reward_fn f = reward_countdown;
    const char *gt = "{\"target\":24,\"numbers\":[3,4,5,2]}";
    CHECK(score_of(f, "(5+3-2)*4", gt) == 1.0, "bare equation");
    CHECK(score_of(f, "Let me think.\n3*4 = 12, 12*2 = 24.\n<answer>3*4*2</answer>", gt) == 1.0, "answer tag");
    CHECK(score_of(f, "<answer>3*4</answer> ... <answer>3*4*2</answer>", gt) == 1.0, "last answer tag");
    CHECK(score_of(f, "<answer>3*4*2</answer> ... <answer>3*4</answer>", gt) == 0.0, "last answer tag wrong");
    CHECK(score_of(f, "I try this:\n(5+3-2)*4 = 24.\n\n", gt) == 1.0, "last non-empty line with '= 24.'");
    CHECK(score_of(f, "(5+3-2)*4\nsomething else", gt) == 0.0, "last line is not the equation");
    CHECK(score_of(f, "5*5-1", gt) == 0.0, "5 reused and 1 not given");
    CHECK(score_of(f, "", gt) == 0.0, "empty response");
    CHECK(score_of(f, "<answer></answer>", gt) == 0.0, "empty answer");
    CHECK(score_of(f, "x", "{\"target\":24}") == -2 && has(moerl_last_error(), "countdown ground truth"),
          "malformed truth: %s", moerl_last_error());
    CHECK(score_of(f, "x", "24") == -2, "truth not an object");
    CHECK(score_of(f, "x", "{\"target\":24,\"numbers\":[1,\"2\"]}") == -2 && has(moerl_last_error(), "numbers[1]"),
          "non-integer number: %s", moerl_last_error());
    CHECK(score_of(f, "x", "{not json") == -2 && has(moerl_last_error(), "not JSON"), "bad JSON truth");
}

static void test_reward_lookup(void) {
    CHECK(reward_fn_for("arith") == reward_exact_number, "arith");
    CHECK(reward_fn_for("gsm8k-style") == reward_gsm8k && reward_fn_for("openai/gsm8k") == reward_gsm8k, "gsm8k");
    CHECK(reward_fn_for("countdown") == reward_countdown, "countdown");
    CHECK(reward_fn_for("allenai/no-such-task") == NULL && has(moerl_last_error(), "'allenai/no-such-task'") &&
              has(moerl_last_error(), "countdown"),
          "unknown data_source: %s", moerl_last_error());
    ds_row r = {.data_source = "nope", .ground_truth = "1", .line = 17};
    double s;
    CHECK(reward_row(&r, "1", &s) == MOERL_ERR && has(moerl_last_error(), "line 17") && has(moerl_last_error(), "'nope'"),
          "reward_row error names the line: %s", moerl_last_error());
    r.data_source = "arith";
    CHECK(reward_row(&r, "= 1", &s) == MOERL_OK && s == 1.0, "reward_row ok");
}

/* ------------------------------------------------------------------ task generators */

static char *read_all(const char *p) {
    char *t = NULL;
    size_t n;
    if (moerl_read_file(p, &t, &n)) return NULL;
    return t;
}

static void check_family(const char *family, const task_opts *o) {
    char tr[600], te[600];
    snprintf(tr, sizeof tr, "%s/%s/train.jsonl", g_dir, family);
    snprintf(te, sizeof te, "%s/%s/test.jsonl", g_dir, family);
    int rc = task_generate(family, o, tr, te);
    CHECK(rc == MOERL_OK, "%s: generate: %s", family, moerl_last_error());
    if (rc) return;
    dataset a, b;
    CHECK(dataset_load(&a, tr) == MOERL_OK, "%s: train parses: %s", family, moerl_last_error());
    CHECK(dataset_load(&b, te) == MOERL_OK, "%s: test parses: %s", family, moerl_last_error());
    CHECK(a.n == o->n_train && b.n == o->n_test, "%s: counts %lld/%lld", family, (long long)a.n, (long long)b.n);
    reward_fn fn = reward_fn_for(family);
    CHECK(fn != NULL, "%s: has a reward", family);
    /* every prompt distinct across both files; every SFT response earns reward 1 */
    int dup = 0, bad_reward = 0, bad_schema = 0;
    for (int split = 0; split < 2; split++) {
        dataset *d = split ? &b : &a;
        for (int64_t i = 0; i < d->n; i++) {
            const ds_row *r = &d->rows[i];
            if (strcmp(r->data_source, family) || r->n_prompt != 1 || strcmp(r->prompt[0].role, "user") ||
                !r->response || !r->extra_info_json)
                bad_schema++;
            double s = 0;
            if (!fn || fn(r->response ? r->response : "", r->ground_truth, &s) || s != 1.0) {
                if (bad_reward++ < 3)
                    fprintf(stderr, "  %s: response '%s' vs truth '%s' scored %g\n", family, r->response,
                            r->ground_truth, s);
            }
            /* a wrong answer scores 0 (the reward can fail) */
            if (strcmp(family, "countdown") != 0) {
                char wrong[1100];
                snprintf(wrong, sizeof wrong, "%s1", r->response);
                if (fn && (fn(wrong, r->ground_truth, &s) || s != 0.0)) bad_reward++;
            }
        }
    }
    for (int64_t i = 0; i < b.n; i++)
        for (int64_t j = 0; j < a.n; j++)
            if (strcmp(b.rows[i].prompt[0].content, a.rows[j].prompt[0].content) == 0) dup++;
    for (int64_t i = 0; i < a.n; i++)
        for (int64_t j = i + 1; j < a.n; j++)
            if (strcmp(a.rows[i].prompt[0].content, a.rows[j].prompt[0].content) == 0) dup++;
    CHECK(bad_schema == 0, "%s: %d rows with wrong schema", family, bad_schema);
    CHECK(bad_reward == 0, "%s: %d responses not scored as expected", family, bad_reward);
    CHECK(dup == 0, "%s: %d prompts repeated (train/test must be disjoint)", family, dup);

    /* family-specific checks, computed independently of the generator */
    int bad = 0;
    for (int64_t i = 0; i < a.n; i++) {
        const ds_row *r = &a.rows[i];
        if (strcmp(family, "arith") == 0) {
            long long x, y;
            char op, dot;
            if (sscanf(r->prompt[0].content, "Compute %lld%c%lld%c", &x, &op, &y, &dot) != 4 || dot != '.') { bad++; continue; }
            char want[64];
            snprintf(want, sizeof want, "%lld", op == '+' ? x + y : x - y);
            long long lo = 1;
            for (int k = 1; k < o->arith_digits; k++) lo *= 10;
            if (strcmp(want, r->ground_truth) || x < lo || x >= lo * 10 || y < lo || y >= lo * 10) bad++;
        } else if (strcmp(family, "gsm8k-style") == 0) {
            const char *m = strstr(r->response, "\n#### ");
            if (!m || strcmp(m + 6, r->ground_truth) != 0 || !has(r->prompt[0].content, "####")) bad++;
        } else {
            json_error_t e;
            json_t *g = json_loads(r->ground_truth, 0, &e);
            json_t *ns = json_object_get(g, "numbers");
            long long t = json_integer_value(json_object_get(g, "target"));
            if (!ns || (int)json_array_size(ns) != o->countdown_numbers || t < 1 || t > o->countdown_max_target) bad++;
            for (size_t k = 0; ns && k < json_array_size(ns); k++) {
                long long v = json_integer_value(json_array_get(ns, k));
                if (v < 1 || v > o->countdown_max_number) bad++;
            }
            json_decref(g);
        }
    }
    CHECK(bad == 0, "%s: %d rows fail the family checks", family, bad);

    /* deterministic: same seed → same bytes; another seed → different */
    char tr2[600], te2[600];
    snprintf(tr2, sizeof tr2, "%s/%s/train2.jsonl", g_dir, family);
    snprintf(te2, sizeof te2, "%s/%s/test2.jsonl", g_dir, family);
    CHECK(task_generate(family, o, tr2, te2) == MOERL_OK, "%s: regenerate", family);
    char *x1 = read_all(tr), *x2 = read_all(tr2);
    CHECK(x1 && x2 && strcmp(x1, x2) == 0, "%s: same seed, same file", family);
    free(x2);
    task_opts o2 = *o;
    o2.seed = o->seed + 1;
    CHECK(task_generate(family, &o2, tr2, te2) == MOERL_OK, "%s: other seed", family);
    x2 = read_all(tr2);
    CHECK(x1 && x2 && strcmp(x1, x2) != 0, "%s: other seed, other file", family);
    free(x1);
    free(x2);
    dataset_free(&a);
    dataset_free(&b);
}

static void test_tasks(void) {
    task_opts o;
    task_opts_default(&o);
    o.n_train = 300;
    o.n_test = 60;
    o.seed = 42;
    int nf;
    const char *const *fam = task_families(&nf);
    CHECK(nf == 4, "four families");
    for (int i = 0; i < nf; i++) /* tool_arith's rows (messages responses, a final-turn reward): test_tool_task */
        if (strcmp(fam[i], "tool_arith")) check_family(fam[i], &o);
    o.arith_digits = 5;
    check_family("arith", &o);
    o.countdown_numbers = 3;
    o.countdown_max_number = 10;
    o.countdown_max_target = 30;
    check_family("countdown", &o);

    /* errors */
    char tr[600], te[600];
    snprintf(tr, sizeof tr, "%s/e/train.jsonl", g_dir);
    snprintf(te, sizeof te, "%s/e/test.jsonl", g_dir);
    task_opts_default(&o);
    CHECK(task_generate("sudoku", &o, tr, te) == MOERL_ERR && has(moerl_last_error(), "'sudoku'"), "unknown family: %s",
          moerl_last_error());
    o.arith_digits = 1; /* 2 · 10 · 10 = 200 distinct prompts < 1100 asked */
    CHECK(task_generate("arith", &o, tr, te) == MOERL_ERR && has(moerl_last_error(), "too small"),
          "exhausted problem space: %s", moerl_last_error());
    CHECK(access(te, F_OK) != 0 && access(tr, F_OK) != 0, "a refused task left a file behind (%s or %s)", te, tr);
    o.n_train = 100; /* 200 distinct: the 32 test rows fit, the train rows do not — still no file */
    o.n_test = 150;
    CHECK(task_generate("arith", &o, tr, te) == MOERL_ERR && access(te, F_OK) != 0,
          "a task refused after its test split left %s behind", te);
    task_opts_default(&o);
    o.arith_digits = 19;
    CHECK(task_generate("arith", &o, tr, te) == MOERL_ERR && has(moerl_last_error(), "arith_digits = 19"),
          "digits out of range: %s", moerl_last_error());
    task_opts_default(&o);
    o.countdown_numbers = 9;
    CHECK(task_generate("countdown", &o, tr, te) == MOERL_ERR && has(moerl_last_error(), "countdown_numbers"),
          "countdown numbers out of range: %s", moerl_last_error());
    /* a small arith space that just fits: 1 digit, 150 of 200 prompts */
    task_opts_default(&o);
    o.arith_digits = 1;
    o.n_train = 120;
    o.n_test = 30;
    CHECK(task_generate("arith", &o, tr, te) == MOERL_OK, "150 of 200 possible prompts: %s", moerl_last_error());
}

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/moerl_test_data_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_tokenizer();
    test_chat_template();
    test_dataset();
    test_reward_exact_number();
    test_reward_gsm8k();
    test_countdown_verify();
    test_countdown_verify_edges();
    test_strset();
    test_reward_countdown();
    test_reward_lookup();
    test_tasks();
    nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    TEST_MAIN_END();
}
