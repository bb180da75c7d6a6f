/* Prompts given as JSON (data/prompts.h). */
#include "data/prompts.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

int chat_msgs_from_json(const json_t *list, chat_msg **msgs, int *n) {
    const int k = (int)json_array_size(list);
    chat_msg *m = xcalloc(k > 0 ? k : 1, sizeof *m);
    for (int i = 0; i < k; i++) {
        const json_t *e = json_array_get(list, i), *r = json_object_get(e, "role"), *c = json_object_get(e, "content");
        if (!json_is_string(r) || !json_is_string(c)) {
            free(m);
            *msgs = NULL;
            return i;
        }
        m[i].role = (char *)json_string_value(r);
        m[i].content = (char *)json_string_value(c);
    }
    *msgs = m;
    *n = k;
    return -1;
}

/* One JSONL line (not blank) → its prompt's tokens appended to seqs. Errors name path:line. */
static int read_prompt_line(const char *path, long long line, const char *s, size_t len, tok_seq *seq) {
    json_error_t je;
    json_t *o = json_loadb(s, len, 0, &je);
    if (!o) return moerl_errorf("%s:%lld: invalid JSON at column %d: %s", path, line, je.column, je.text);
    json_t *p = json_is_object(o) ? json_object_get(o, "prompt") : NULL;
    chat_msg *msgs = NULL;
    int nm = 0, rc = MOERL_ERR;
    const char *bad = NULL;
    if (!p) bad = json_is_object(o) ? "the field is missing" : "the line is not a JSON object";
    else if (json_is_string(p)) {
        msgs = xcalloc(1, sizeof *msgs);
        msgs[0].role = "user";
        msgs[0].content = (char *)json_string_value(p);
        nm = 1;
    } else if (json_is_array(p) && json_array_size(p) > 0) {
        if (chat_msgs_from_json(p, &msgs, &nm) >= 0) bad = "a message without string role and content";
    } else bad = "neither a string nor a non-empty list of messages";
    if (bad)
        moerl_errorf("%s:%lld: field 'prompt': expected a list of {\"role\", \"content\"} messages or a string, got %s",
                     path, line, bad);
    else if (tokenizer_chat_check(tok_current(), msgs, nm) != MOERL_OK)
        moerl_error_prefix("%s:%lld: prompt: ", path, line);
    else {
        memset(seq, 0, sizeof *seq);
        tok_chat_encode(msgs, nm, true, seq);
        rc = MOERL_OK;
    }
    free(msgs);
    json_decref(o);
    return rc;
}

int prompt_file_read(const char *path, tok_seq **out, int *n_out) {
    char *text;
    size_t len;
    if (moerl_read_file(path, &text, &len) != MOERL_OK) return MOERL_ERR;
    tok_seq *seqs = NULL;
    int n = 0, cap = 0, rc = MOERL_OK;
    long long line = 0;
    for (size_t pos = 0; pos < len && rc == MOERL_OK;) {
        line++;
        const char *s = text + pos, *nl = memchr(s, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - s) : len - pos, k = 0;
        pos += ll + (nl ? 1 : 0);
        while (k < ll && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
        if (k == ll) continue;
        if (n == cap) seqs = xrealloc(seqs, (cap = cap ? 2 * cap : 64) * sizeof *seqs);
        rc = read_prompt_line(path, line, s, ll, &seqs[n]);
        if (rc == MOERL_OK) n++;
    }
    if (rc == MOERL_OK && n == 0) rc = moerl_errorf("%s: no prompts (every line is blank)", path);
    free(text);
    if (rc != MOERL_OK) {
        for (int i = 0; i < n; i++) tok_seq_free(&seqs[i]);
        free(seqs);
        return rc;
    }
    *out = seqs;
    *n_out = n;
    return MOERL_OK;
}

int dataset_check_prompts(const dataset *ds) {
    for (int64_t i = 0; i < dataset_count(ds); i++) {
        const ds_row *r = dataset_row(ds, i);
        char w[4300];
        if (tokenizer_chat_check(tok_current(), r->prompt, r->n_prompt) != MOERL_OK)
            return moerl_error_prefix("%s: prompt: ", dataset_where(ds, r->line, w, sizeof w));
    }
    return MOERL_OK;
}
