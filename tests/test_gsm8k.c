/* openai/gsm8k rows: the generator's raw layout (task_generate_gsm8k_raw), the conversion to
 * moerl's rows as verl's examples/data_preprocess/gsm8k.py does it (gsm8k_convert), and that the
 * gsm8k reward gives the converted ground truth full marks for the worked answer and 0 for a wrong
 * one. Error messages name the file, line and field. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "data/dataset.h"
#include "data/tasks.h"
#include "test.h"

static char g_tmp[1024];

static void write_text(const char *path, const char *text) {
    MOERL_ASSERT(moerl_write_file_atomic(path, text, strlen(text)) == MOERL_OK);
}

static int msg_has(const char *a) { return strstr(moerl_last_error(), a) != NULL; }

static void test_raw_and_convert(void) {
    char tr[1200], te[1200], out[1200];
    snprintf(tr, sizeof tr, "%s/raw/train.jsonl", g_tmp);
    snprintf(te, sizeof te, "%s/raw/test.jsonl", g_tmp);
    task_opts o;
    task_opts_default(&o);
    o.n_train = 40;
    o.n_test = 10;
    CHECK(task_generate_gsm8k_raw(&o, tr, te) == MOERL_OK, "raw: %s", moerl_last_error());
    /* the same draws as the verl-format generator: same questions, same answers */
    char vtr[1200], vte[1200];
    snprintf(vtr, sizeof vtr, "%s/verl/train.jsonl", g_tmp);
    snprintf(vte, sizeof vte, "%s/verl/test.jsonl", g_tmp);
    MOERL_ASSERT(task_generate("gsm8k-style", &o, vtr, vte) == MOERL_OK);
    dataset v;
    MOERL_ASSERT(dataset_load(&v, vtr) == MOERL_OK);
    char *text = NULL;
    size_t len = 0;
    MOERL_ASSERT(moerl_read_file(tr, &text, &len) == MOERL_OK);
    int lines = 0, same = 1, keys_ok = 1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        json_t *j = json_loads(line, 0, NULL);
        keys_ok &= json_is_object(j) && json_object_size(j) == 2 && json_is_string(json_object_get(j, "question")) &&
                   json_is_string(json_object_get(j, "answer"));
        if (keys_ok && lines < v.n) {
            const ds_row *r = dataset_row(&v, lines);
            const char *q = json_string_value(json_object_get(j, "question"));
            same &= strncmp(r->prompt[0].content, q, strlen(q)) == 0 &&
                    strcmp(r->response, json_string_value(json_object_get(j, "answer"))) == 0;
        }
        json_decref(j);
    }
    free(text);
    CHECK(lines == 40 && keys_ok, "raw train file: %d lines, keys as openai/gsm8k: %d", lines, keys_ok);
    CHECK(same, "raw rows differ from the verl-format generator's questions/answers");

    snprintf(out, sizeof out, "%s/train.jsonl", g_tmp);
    int64_t n = 0;
    CHECK(gsm8k_convert(tr, out, "train", &n) == MOERL_OK && n == 40, "convert: n %lld: %s", (long long)n,
          moerl_last_error());
    dataset c;
    MOERL_ASSERT(dataset_load(&c, out) == MOERL_OK);
    int ok = c.n == 40;
    for (int64_t i = 0; i < c.n && ok; i++) {
        const ds_row *r = dataset_row(&c, i), *w = dataset_row(&v, i);
        double s1 = -1, s0 = -1;
        char wrong[64];
        snprintf(wrong, sizeof wrong, "#### %lld", atoll(r->ground_truth) + 1);
        ok = !strcmp(r->data_source, "openai/gsm8k") && r->n_prompt == 1 && !strcmp(r->prompt[0].role, "user") &&
             strstr(r->prompt[0].content, "Let's think step by step and output the final answer after \"####\".") &&
             !strcmp(r->ground_truth, w->ground_truth) && !strcmp(r->response, w->response) &&
             reward_row(r, r->response, &s1) == MOERL_OK && s1 == 1.0 && reward_row(r, wrong, &s0) == MOERL_OK &&
             s0 == 0.0 && strstr(r->extra_info_json, "\"split\":\"train\"");
        if (!ok) fprintf(stderr, "row %lld: truth '%s' vs '%s', rewards %g %g\n", (long long)i, r->ground_truth,
                         w->ground_truth, s1, s0);
    }
    CHECK(ok, "converted rows: data_source, prompt, ground truth, response, rewards");
    dataset_free(&c);
    dataset_free(&v);
}

/* verl's extract_solution: first "#### <number>", commas removed, sign kept; fields read by name. */
static void test_convert_edge_cases(void) {
    char in[1200], out[1200];
    snprintf(in, sizeof in, "%s/edge.jsonl", g_tmp);
    snprintf(out, sizeof out, "%s/edge_out.jsonl", g_tmp);
    write_text(in, "{\"answer\": \"x <<2*3=6>>6 ... \\n#### 1,234\", \"question\": \"Q1\", \"extra\": 1}\n"
                   "\n"
                   "{\"question\": \"Q2\", \"answer\": \"owes\\n#### -5\"}\n"
                   "{\"question\": \"Q3\", \"answer\": \"#### x then #### 7.5\"}\n");
    int64_t n = 0;
    CHECK(gsm8k_convert(in, out, "test", &n) == MOERL_OK && n == 3, "edge cases: %s", moerl_last_error());
    dataset d;
    if (dataset_load(&d, out) == MOERL_OK && d.n == 3) {
        CHECK(!strcmp(dataset_row(&d, 0)->ground_truth, "1234"), "commas removed: '%s'", dataset_row(&d, 0)->ground_truth);
        CHECK(!strcmp(dataset_row(&d, 1)->ground_truth, "-5"), "sign kept: '%s'", dataset_row(&d, 1)->ground_truth);
        CHECK(!strcmp(dataset_row(&d, 2)->ground_truth, "7.5"), "first well-formed match: '%s'",
              dataset_row(&d, 2)->ground_truth);
        CHECK(!strcmp(dataset_row(&d, 0)->prompt[0].content,
                      "Q1 Let's think step by step and output the final answer after \"####\"."),
              "prompt: '%s'", dataset_row(&d, 0)->prompt[0].content);
        double s = -1;
        CHECK(reward_row(dataset_row(&d, 0), "so the total is\n#### 1,234", &s) == MOERL_OK && s == 1.0,
              "the reward reads the answer with its thousands comma: %g", s);
        dataset_free(&d);
    } else {
        CHECK(0, "edge output did not load: %s", moerl_last_error());
    }
    static const struct {
        const char *text, *expect;
    } bad[] = {
        {"{\"question\": \"Q\", \"answer\": \"no final line\"}\n", ":1: field 'answer': no final answer after"},
        {"{\"question\": \"Q\", \"answer\": \"#### 1\"}\n{\"question\": 5, \"answer\": \"#### 1\"}\n",
         ":2: field 'question': expected a string"},
        {"{\"question\": \"Q\"}\n", ":1: field 'answer': expected a string"},
        {"[1, 2]\n", ":1: not a JSON object"},
        {"{\"question\": \"Q\", \"answer\": \"#### 1\"\n", ":1: not a JSON object"},
        {"\n\n", "no rows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(in, bad[i].text);
        CHECK(gsm8k_convert(in, out, "x", NULL) == MOERL_ERR && msg_has(bad[i].expect) && msg_has("edge.jsonl"),
              "bad input %zu: expected '%s', got: %s", i, bad[i].expect, moerl_last_error());
    }
    CHECK(gsm8k_convert("/nonexistent/gsm8k.jsonl", out, "x", NULL) == MOERL_ERR && msg_has("/nonexistent/gsm8k.jsonl"),
          "missing file: %s", moerl_last_error());
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "%s/moerl_test_gsm8k_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    MOERL_ASSERT(moerl_mkdirs(g_tmp) == MOERL_OK);
    test_raw_and_convert();
    test_convert_edge_cases();
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    TEST_MAIN_END();
}
