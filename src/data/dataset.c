/* moerl — JSONL datasets in verl's schema (see dataset.h). Parsing with jansson. */
#include "data/dataset.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "base/common.h"
#include "data/tokenizer.h"

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a bool";
    case JSON_NULL: return "null";
    }
    return "?";
}

static void row_free(ds_row *r) {
    free(r->data_source);
    for (int i = 0; i < r->n_prompt; i++) {
        free(r->prompt[i].role);
        free(r->prompt[i].content);
        json_decref(r->prompt[i].msg);
    }
    free(r->prompt);
    json_decref(r->tools);
    free(r->ground_truth);
    free(r->extra_info_json);
    free(r->response);
    memset(r, 0, sizeof *r);
}

#define FIELD_ERR(field, expected, got) \
    moerl_errorf("%s:%lld: field '%s': expected %s, got %s", name, (long long)line, field, expected, got)

/* A required (or, with optional, possibly absent) string field of object o. */
static int get_string(const char *name, int64_t line, const json_t *o, const char *key, const char *field,
                      bool optional, char **out) {
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v) {
        if (optional) return MOERL_OK;
        return FIELD_ERR(field, "a string", "nothing (the field is missing)");
    }
    if (!json_is_string(v)) return FIELD_ERR(field, "a string", json_kind(v));
    *out = xstrdup(json_string_value(v));
    return MOERL_OK;
}

/* prompt[i]: a message object with a non-empty string role and a content that is a string, null
 * or a list of parts (absent only beside tool_calls); a message with any other key, or a content
 * that is not a string, keeps the whole object in m->msg. */
static int parse_msg(const char *name, int64_t line, json_t *o, size_t i, chat_msg *m) {
    char field[64];
    snprintf(field, sizeof field, "prompt[%zu]", i);
    if (!json_is_object(o)) return FIELD_ERR(field, "an object {\"role\", \"content\"}", json_kind(o));
    snprintf(field, sizeof field, "prompt[%zu].role", i);
    if (get_string(name, line, o, "role", field, false, &m->role)) return MOERL_ERR;
    if (!*m->role) return FIELD_ERR(field, "a non-empty string", "\"\"");
    snprintf(field, sizeof field, "prompt[%zu].content", i);
    json_t *c = json_object_get(o, "content");
    const char *expect = "a string (or null, or a list of content parts)";
    if (!c && !json_object_get(o, "tool_calls")) return FIELD_ERR(field, expect, "nothing (the field is missing)");
    if (c && !json_is_string(c) && !json_is_null(c) && !json_is_array(c)) return FIELD_ERR(field, expect, json_kind(c));
    m->content = xstrdup(json_is_string(c) ? json_string_value(c) : "");
    if (json_object_size(o) != 2 || !json_is_string(c)) m->msg = json_incref(o);
    return MOERL_OK;
}

/* The row's "tools": absent/null, or a list of objects. */
static int parse_tools(const char *name, int64_t line, json_t *v, json_t **out) {
    *out = NULL;
    if (!v || json_is_null(v)) return MOERL_OK;
    const char *expect = "a list of tool specs ({\"type\": \"function\", \"function\": {...}})";
    if (!json_is_array(v)) return FIELD_ERR("tools", expect, json_kind(v));
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_is_object(json_array_get(v, i))) {
            char field[64];
            snprintf(field, sizeof field, "tools[%zu]", i);
            return FIELD_ERR(field, "an object (a tool spec)", json_kind(json_array_get(v, i)));
        }
    *out = json_incref(v);
    return MOERL_OK;
}

static int parse_row(const char *name, int64_t line, const json_t *o, ds_row *r) {
    memset(r, 0, sizeof *r);
    r->line = line;
    if (!json_is_object(o)) return FIELD_ERR("(line)", "a JSON object", json_kind(o));
    if (get_string(name, line, o, "data_source", "data_source", false, &r->data_source)) return MOERL_ERR;
    if (!*r->data_source) return FIELD_ERR("data_source", "a non-empty string", "\"\"");

    json_t *p = json_object_get(o, "prompt");
    if (!p) return FIELD_ERR("prompt", "a list of {\"role\", \"content\"} messages", "nothing (the field is missing)");
    if (!json_is_array(p)) return FIELD_ERR("prompt", "a list of {\"role\", \"content\"} messages", json_kind(p));
    size_t np = json_array_size(p);
    if (np == 0) return FIELD_ERR("prompt", "at least one message", "an empty list");
    r->prompt = xcalloc(np, sizeof(chat_msg));
    for (size_t i = 0; i < np; i++) {
        r->n_prompt = (int)i + 1; /* so row_free frees what is set */
        if (parse_msg(name, line, json_array_get(p, i), i, &r->prompt[i])) return MOERL_ERR;
    }
    if (parse_tools(name, line, json_object_get(o, "tools"), &r->tools)) return MOERL_ERR;

    json_t *rm = json_object_get(o, "reward_model");
    if (!rm) return FIELD_ERR("reward_model", "an object {\"style\", \"ground_truth\"}", "nothing (the field is missing)");
    if (!json_is_object(rm)) return FIELD_ERR("reward_model", "an object {\"style\", \"ground_truth\"}", json_kind(rm));
    json_t *style = json_object_get(rm, "style");
    if (!style) return FIELD_ERR("reward_model.style", "\"rule\"", "nothing (the field is missing)");
    if (!json_is_string(style)) return FIELD_ERR("reward_model.style", "\"rule\"", json_kind(style));
    if (strcmp(json_string_value(style), "rule") != 0) {
        char got[300];
        snprintf(got, sizeof got, "\"%.200s\" (only rule-based rewards are supported)", json_string_value(style));
        return FIELD_ERR("reward_model.style", "\"rule\"", got);
    }
    json_t *gt = json_object_get(rm, "ground_truth");
    const char *gt_expect = "a string, or an object/list for structured tasks";
    if (!gt) return FIELD_ERR("reward_model.ground_truth", gt_expect, "nothing (the field is missing)");
    if (json_is_string(gt)) {
        r->ground_truth = xstrdup(json_string_value(gt));
    } else if (json_is_object(gt) || json_is_array(gt)) {
        r->ground_truth = json_dumps(gt, JSON_COMPACT | JSON_PRESERVE_ORDER);
        r->ground_truth_json = 1;
        if (!r->ground_truth) return FIELD_ERR("reward_model.ground_truth", gt_expect, "an unencodable value");
    } else {
        return FIELD_ERR("reward_model.ground_truth", gt_expect, json_kind(gt));
    }

    json_t *ei = json_object_get(o, "extra_info");
    if (ei && !json_is_null(ei)) {
        if (!json_is_object(ei)) return FIELD_ERR("extra_info", "an object", json_kind(ei));
        r->extra_info_json = json_dumps(ei, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    json_t *resp = json_object_get(o, "response");
    if (resp && !json_is_null(resp)) {
        if (!json_is_string(resp)) return FIELD_ERR("response", "a string", json_kind(resp));
        r->response = xstrdup(json_string_value(resp));
    }
    return MOERL_OK;
}

int dataset_load_string(dataset *ds, const char *text, size_t len, const char *name) {
    memset(ds, 0, sizeof *ds);
    ds_row *rows = NULL;
    int64_t n = 0, cap = 0, line = 0;
    size_t pos = 0;
    while (pos < len) {
        line++;
        const char *s = text + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - s) : len - pos;
        pos += ll + (nl ? 1 : 0);
        bool blank = true;
        for (size_t i = 0; i < ll && blank; i++) blank = isspace((unsigned char)s[i]) != 0;
        if (blank) continue;
        json_error_t jerr;
        json_t *o = json_loadb(s, ll, JSON_REJECT_DUPLICATES, &jerr);
        if (!o) {
            moerl_errorf("%s:%lld: invalid JSON at column %d: %s", name, (long long)line, jerr.column, jerr.text);
            goto fail;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            rows = xrealloc(rows, sizeof(ds_row) * (size_t)cap);
        }
        int rc = parse_row(name, line, o, &rows[n]);
        json_decref(o);
        if (rc) {
            row_free(&rows[n]);
            goto fail;
        }
        n++;
    }
    ds->path = xstrdup(name);
    ds->rows = rows;
    ds->n = n;
    return MOERL_OK;
fail:
    for (int64_t i = 0; i < n; i++) row_free(&rows[i]);
    free(rows);
    return MOERL_ERR;
}

int dataset_load(dataset *ds, const char *path) {
    char *text;
    size_t len;
    memset(ds, 0, sizeof *ds);
    if (moerl_read_file(path, &text, &len)) return moerl_error_prefix("dataset: ");
    int rc = dataset_load_string(ds, text, len, path);
    free(text);
    return rc;
}

int64_t dataset_count(const dataset *ds) { return ds->n; }

const char *dataset_where(const dataset *ds, int64_t line, char *buf, size_t n) {
    if (ds->generated && line > 0) snprintf(buf, n, "line %lld of %s", (long long)line, ds->path);
    else if (ds->generated) snprintf(buf, n, "%s", ds->path);
    else if (line > 0) snprintf(buf, n, "%s:%lld", ds->path, (long long)line);
    else snprintf(buf, n, "'%s'", ds->path);
    return buf;
}

const ds_row *dataset_row(const dataset *ds, int64_t i) {
    MOERL_ASSERT(i >= 0 && i < ds->n);
    return &ds->rows[i];
}

void dataset_free(dataset *ds) {
    for (int64_t i = 0; i < ds->n; i++) row_free(&ds->rows[i]);
    free(ds->rows);
    free(ds->path);
    memset(ds, 0, sizeof *ds);
}

/* json_string() that reports invalid UTF-8 instead of returning NULL silently. */
static int str_field(json_t *obj, const char *key, const char *val) {
    json_t *s = json_string(val);
    if (!s) return moerl_errorf("dataset row: field '%s' is not valid UTF-8", key);
    json_object_set_new(obj, key, s);
    return MOERL_OK;
}

int dataset_write_row(FILE *f, const ds_row *r) {
    json_t *o = json_object();
    int rc = MOERL_ERR;
    if (str_field(o, "data_source", r->data_source)) goto done;
    json_t *p = json_array();
    json_object_set_new(o, "prompt", p);
    for (int i = 0; i < r->n_prompt; i++) {
        if (r->prompt[i].msg) {
            json_array_append(p, r->prompt[i].msg);
            continue;
        }
        json_t *m = json_object();
        json_array_append_new(p, m);
        if (str_field(m, "role", r->prompt[i].role) || str_field(m, "content", r->prompt[i].content)) goto done;
    }
    if (r->tools) json_object_set(o, "tools", r->tools);
    json_t *rm = json_object();
    json_object_set_new(o, "reward_model", rm);
    json_object_set_new(rm, "style", json_string("rule"));
    if (r->ground_truth_json) {
        json_error_t e;
        json_t *gt = json_loads(r->ground_truth, 0, &e);
        if (!gt) {
            moerl_errorf("dataset row: ground_truth is marked JSON but does not parse: %s", e.text);
            goto done;
        }
        json_object_set_new(rm, "ground_truth", gt);
    } else if (str_field(rm, "ground_truth", r->ground_truth)) {
        goto done;
    }
    if (r->extra_info_json) {
        json_error_t e;
        json_t *ei = json_loads(r->extra_info_json, 0, &e);
        if (!ei || !json_is_object(ei)) {
            json_decref(ei);
            moerl_errorf("dataset row: extra_info is not a JSON object: %s", ei ? "" : e.text);
            goto done;
        }
        json_object_set_new(o, "extra_info", ei);
    }
    if (r->response && str_field(o, "response", r->response)) goto done;
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s) { moerl_errorf("dataset row: cannot encode"); goto done; }
    int bad = fputs(s, f) < 0 || fputc('\n', f) == EOF;
    free(s);
    if (bad) { moerl_errorf("dataset row: write failed: %s", strerror(errno)); goto done; }
    rc = MOERL_OK;
done:
    json_decref(o);
    return rc;
}

static uint64_t fnv1a(uint64_t h, const char *s) {
    if (!s) s = "";
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return (h ^ 0xff) * 0x100000001b3ULL; /* field separator */
}

/* fnv1a of v's compact JSON text (keys in the file's order). */
static uint64_t fnv1a_json(uint64_t h, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    h = fnv1a(h, s);
    free(s);
    return h;
}

int64_t dataset_keep_rows(dataset *ds, const uint8_t *keep) {
    int64_t o = 0;
    for (int64_t i = 0; i < ds->n; i++) {
        if (keep[i]) ds->rows[o++] = ds->rows[i];
        else row_free(&ds->rows[i]);
    }
    const int64_t dropped = ds->n - o;
    ds->n = o;
    return dropped;
}

uint64_t dataset_fingerprint(const dataset *ds) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int64_t i = 0; i < ds->n; i++) {
        const ds_row *r = &ds->rows[i];
        h = fnv1a(h, r->data_source);
        for (int k = 0; k < r->n_prompt; k++) {
            h = fnv1a(h, r->prompt[k].role);
            h = fnv1a(h, r->prompt[k].content);
            if (r->prompt[k].msg) h = fnv1a_json(h, r->prompt[k].msg);
        }
        if (r->tools) h = fnv1a_json(h, r->tools);
        h = fnv1a(h, r->ground_truth);
    }
    return h;
}

void ds_row_encode_prompt(const ds_row *r, tok_seq *out) {
    const chat_extra x = {r->tools, NULL};
    tok_chat_encode_ex(r->prompt, r->n_prompt, &x, true, out);
}
