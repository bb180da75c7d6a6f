/* moerl — openai/gsm8k rows → verl rows (see gsm8k.h; verl examples/data_preprocess/gsm8k.py). */
#include "data/gsm8k.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/dataset.h"

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

/* Write the verl row of one parsed openai/gsm8k object (question jq, answer ja, both strings,
 * final answer sol) as row `index` of `split`. */
static int write_verl_row(FILE *f, json_t *jq, json_t *ja, const char *sol, const char *split, int64_t index) {
    const char *question = json_string_value(jq);
    size_t ql = strlen(question) + strlen(k_verl_gsm8k_instruction) + 2;
    char *content = xmalloc(ql);
    snprintf(content, ql, "%s %s", question, k_verl_gsm8k_instruction);
    chat_msg msg = {"user", content, NULL};
    json_t *ex = json_object();
    json_object_set_new(ex, "split", json_string(split));
    json_object_set_new(ex, "index", json_integer(index));
    json_object_set_new(ex, "answer", json_incref(ja));
    json_object_set_new(ex, "question", json_incref(jq));
    char *extra = json_dumps(ex, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(ex);
    ds_row row = {.data_source = "openai/gsm8k",
                  .prompt = &msg,
                  .n_prompt = 1,
                  .ground_truth = (char *)sol,
                  .extra_info_json = extra,
                  .response = (char *)json_string_value(ja)};
    int rc = dataset_write_row(f, &row);
    free(extra);
    free(content);
    return rc;
}

/* Convert one non-blank input line (line[0..ll), line number line_no) into row *n of f; *n is
 * advanced when a row is written. Errors name in_path:line_no and the field. */
static int convert_line(FILE *f, const char *line, size_t ll, const char *in_path, int64_t line_no,
                        const char *split, int64_t *n) {
    json_error_t jerr;
    json_t *j = json_loadb(line, ll, 0, &jerr);
    if (!j || !json_is_object(j)) {
        int rc = moerl_errorf("%s:%lld: not a JSON object%s%s", in_path, (long long)line_no, j ? "" : ": ",
                              j ? "" : jerr.text);
        json_decref(j);
        return rc;
    }
    json_t *jq = json_object_get(j, "question"), *ja = json_object_get(j, "answer");
    char sol[64];
    int rc;
    if (!json_is_string(jq) || !json_is_string(ja)) {
        rc = moerl_errorf("%s:%lld: field '%s': expected a string (openai/gsm8k rows are {\"question\": ..., "
                          "\"answer\": ...})", in_path, (long long)line_no,
                          json_is_string(jq) ? "answer" : "question");
    } else if (!gsm8k_solution(json_string_value(ja), sol, sizeof sol)) {
        rc = moerl_errorf("%s:%lld: field 'answer': no final answer after \"#### \" (expected the solution to end "
                          "with \"#### <number>\")", in_path, (long long)line_no);
    } else {
        rc = write_verl_row(f, jq, ja, sol, split, *n);
        if (rc) moerl_error_prefix("%s:%lld: ", in_path, (long long)line_no);
        (*n)++;
    }
    json_decref(j);
    return rc;
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
        size_t blank = 0;
        while (blank < ll && isspace((unsigned char)line[blank])) blank++;
        if (blank < ll) rc = convert_line(f, line, ll, in_path, line_no, split, &n);
        line = nl ? nl + 1 : NULL;
    }
    fclose(f);
    free(text);
    if (rc == MOERL_OK && n == 0) rc = moerl_errorf("gsm8k '%s': no rows", in_path);
    if (rc == MOERL_OK) rc = moerl_write_file_atomic(out_path, buf, blen);
    free(buf);
    if (rc == MOERL_OK && n_rows) *n_rows = n;
    return rc;
}
