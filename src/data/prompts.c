/* Prompts given as JSON (data/prompts.h). */
#include "data/prompts.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

/* A well-formed message (chat_msgs_from_json), into *m. */
static int msg_from_json(const json_t *e, chat_msg *m) {
    const json_t *r = json_object_get(e, "role"), *c = json_object_get(e, "content");
    if (!json_is_object(e) || !json_is_string(r)) return 0;
    if (c ? !(json_is_string(c) || json_is_null(c) || json_is_array(c)) : !json_object_get(e, "tool_calls")) return 0;
    m->role = (char *)json_string_value(r);
    m->content = json_is_string(c) ? (char *)json_string_value(c) : "";
    m->msg = json_object_size(e) != 2 || !json_is_string(c) ? (json_t *)e : NULL;
    return 1;
}

int chat_msgs_from_json(const json_t *list, chat_msg **msgs, int *n) {
    const int k = (int)json_array_size(list);
    chat_msg *m = xcalloc(k > 0 ? k : 1, sizeof *m);
    for (int i = 0; i < k; i++) {
        if (!msg_from_json(json_array_get(list, i), &m[i])) {
            free(m);
            *msgs = NULL;
            return i;
        }
    }
    *msgs = m;
    *n = k;
    return -1;
}

void chat_call_free(chat_call *c) {
    free(c->msgs);
    json_decref((json_t *)c->x.vars);
    memset(c, 0, sizeof *c);
}

#define MSG_EXPECT "an object with a string \"role\" and a \"content\" that is a string, null or a list of parts"

/* The messages list ml (key: how messages name it) → c->msgs. */
static int call_msgs(const json_t *ml, const char *key, chat_call *c) {
    if (!json_is_array(ml) || json_array_size(ml) == 0)
        return moerl_errorf("%s: expected a non-empty list of messages, got %s", key,
                            !ml ? "nothing" : json_is_array(ml) ? "an empty list" : "another JSON value");
    int bad = chat_msgs_from_json(ml, &c->msgs, &c->n);
    if (bad >= 0) return moerl_errorf("%s[%d]: expected %s (absent only beside \"tool_calls\")", key, bad, MSG_EXPECT);
    return MOERL_OK;
}

int chat_call_from_json(const json_t *v, chat_call *c) {
    memset(c, 0, sizeof *c);
    c->add_generation_prompt = -1;
    if (json_is_array(v)) return call_msgs(v, "messages", c);
    if (!json_is_object(v))
        return moerl_errorf("expected a list of messages or an object {\"messages\": [...], \"tools\": [...], ...}");
    if (call_msgs(json_object_get(v, "messages"), "messages", c) != MOERL_OK) return MOERL_ERR;
    const char *k;
    json_t *e;
    json_object_foreach((json_t *)v, k, e) {
        if (!strcmp(k, "messages")) continue;
        if (!strcmp(k, "tools")) {
            if (json_is_null(e)) continue;
            int ok = json_is_array(e);
            for (size_t i = 0; ok && i < json_array_size(e); i++) ok = json_is_object(json_array_get(e, i));
            if (!ok) {
                chat_call_free(c);
                return moerl_errorf("tools: expected a list of tool specs (objects {\"type\": \"function\", "
                                    "\"function\": {...}})");
            }
            c->x.tools = e;
        } else if (!strcmp(k, "add_generation_prompt")) {
            if (!json_is_boolean(e)) {
                chat_call_free(c);
                return moerl_errorf("add_generation_prompt: expected true or false");
            }
            c->add_generation_prompt = json_is_true(e);
        } else {
            if (!c->x.vars) c->x.vars = json_object();
            json_object_set((json_t *)c->x.vars, k, e);
        }
    }
    return MOERL_OK;
}

/* A prompt line's object o → *c (prompts.h: prompt_file_read). */
static int line_call(const json_t *o, chat_call *c) {
    json_t *p = json_object_get(o, "prompt"), *tools = json_object_get(o, "tools");
    memset(c, 0, sizeof *c);
    if (!p && json_object_get(o, "messages")) return chat_call_from_json(o, c);
    if (p && json_object_get(o, "messages"))
        return moerl_errorf("the line has both \"prompt\" and \"messages\": give one");
    if (!p) return moerl_errorf("field 'prompt': expected a list of messages, a string or an object "
                                "{\"messages\", ...}, got nothing (the field is missing)");
    if (json_is_string(p)) {
        c->msgs = xcalloc(1, sizeof *c->msgs);
        c->msgs[0].role = "user";
        c->msgs[0].content = (char *)json_string_value(p);
        c->n = 1;
        c->add_generation_prompt = -1;
    } else if (json_is_array(p) || json_is_object(p)) {
        if (chat_call_from_json(p, c) != MOERL_OK) return moerl_error_prefix("field 'prompt': ");
        if (json_is_object(p) && tools && !json_is_null(tools)) {
            chat_call_free(c);
            return moerl_errorf("field 'tools': the tools are given twice (in the row and in its \"prompt\" object)");
        }
    } else {
        return moerl_errorf("field 'prompt': expected a list of messages, a string or an object {\"messages\", ...}");
    }
    if (json_is_object(p) || !tools || json_is_null(tools)) return MOERL_OK;
    int ok = json_is_array(tools);
    for (size_t i = 0; ok && i < json_array_size(tools); i++) ok = json_is_object(json_array_get(tools, i));
    if (!ok) {
        chat_call_free(c);
        return moerl_errorf("field 'tools': expected a list of tool specs (objects {\"type\": \"function\", ...})");
    }
    c->x.tools = tools;
    return MOERL_OK;
}

/* One JSONL line (not blank) → its prompt's tokens in *seq. Errors name path:line. */
static int read_prompt_line(const char *path, long long line, const char *s, size_t len, tok_seq *seq) {
    json_error_t je;
    json_t *o = json_loadb(s, len, 0, &je);
    if (!o) return moerl_errorf("%s:%lld: invalid JSON at column %d: %s", path, line, je.column, je.text);
    chat_call c;
    int rc = MOERL_ERR;
    memset(seq, 0, sizeof *seq);
    if (!json_is_object(o)) moerl_errorf("%s:%lld: the line is not a JSON object", path, line);
    else if (line_call(o, &c) != MOERL_OK) moerl_error_prefix("%s:%lld: ", path, line);
    else if (!tokenizer_enable_thinking(tok_current()) && c.x.vars && json_object_get(c.x.vars, "enable_thinking")) {
        moerl_errorf("%s:%lld: the line sets \"enable_thinking\" and enable_thinking=false is set for every prompt "
                     "(--no-thinking): keep one", path, line);
        chat_call_free(&c);
    } else {
        rc = tokenizer_chat_encode_ex(tok_current(), c.msgs, c.n, &c.x, c.add_generation_prompt != 0, seq);
        if (rc != MOERL_OK) {
            moerl_error_prefix("%s:%lld: prompt: ", path, line);
            tok_seq_free(seq);
        }
        chat_call_free(&c);
    }
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
        const chat_extra x = {r->tools, NULL};
        if (tokenizer_chat_check_ex(tok_current(), r->prompt, r->n_prompt, &x) != MOERL_OK)
            return moerl_error_prefix("%s: prompt: ", dataset_where(ds, r->line, w, sizeof w));
    }
    return MOERL_OK;
}
