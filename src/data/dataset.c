/* moerl — JSONL datasets in verl's schema (see dataset.h). Parsing with jansson. */
#include "data/dataset.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
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

static void msgs_free(chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        free(m[i].role);
        free(m[i].content);
        json_decref(m[i].msg);
    }
    free(m);
}

static void row_free(ds_row *r) {
    free(r->data_source);
    msgs_free(r->prompt, r->n_prompt);
    msgs_free(r->resp_msgs, r->n_resp_msgs);
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

/* list[i] (list: "prompt" or "response"): a message object with a non-empty string role and a content that is a string, null
 * or a list of parts (absent only beside tool_calls); a message with any other key, or a content
 * that is not a string, keeps the whole object in m->msg. */
static int parse_msg(const char *name, int64_t line, const char *list, json_t *o, size_t i, chat_msg *m) {
    char field[64];
    snprintf(field, sizeof field, "%s[%zu]", list, i);
    if (!json_is_object(o)) return FIELD_ERR(field, "an object {\"role\", \"content\"}", json_kind(o));
    snprintf(field, sizeof field, "%s[%zu].role", list, i);
    if (get_string(name, line, o, "role", field, false, &m->role)) return MOERL_ERR;
    if (!*m->role) return FIELD_ERR(field, "a non-empty string", "\"\"");
    snprintf(field, sizeof field, "%s[%zu].content", list, i);
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

/* The row's "response": absent/null, a string, or a non-empty list of messages ending with an
 * assistant message (verl's multi-turn SFT shape). */
static int parse_response(const char *name, int64_t line, json_t *resp, ds_row *r) {
    const char *expect = "a string, or a non-empty list of messages (assistant, tool, ..., assistant)";
    if (!resp || json_is_null(resp)) return MOERL_OK;
    if (json_is_string(resp)) {
        r->response = xstrdup(json_string_value(resp));
        return MOERL_OK;
    }
    if (!json_is_array(resp)) return FIELD_ERR("response", expect, json_kind(resp));
    const size_t n = json_array_size(resp);
    if (n == 0) return FIELD_ERR("response", expect, "an empty list");
    r->resp_msgs = xcalloc(n, sizeof(chat_msg));
    for (size_t i = 0; i < n; i++) {
        r->n_resp_msgs = (int)i + 1; /* so row_free frees what is set */
        if (parse_msg(name, line, "response", json_array_get(resp, i), i, &r->resp_msgs[i])) return MOERL_ERR;
    }
    if (strcmp(r->resp_msgs[0].role, "assistant")) {
        char got[200];
        snprintf(got, sizeof got, "\"%.100s\" (the response is what follows the prompt's generation prompt: an "
                 "assistant turn)", r->resp_msgs[0].role);
        return FIELD_ERR("response[0].role", "\"assistant\"", got);
    }
    const char *last = r->resp_msgs[n - 1].role;
    if (strcmp(last, "assistant")) {
        char field[64], got[200];
        snprintf(field, sizeof field, "response[%zu].role", n - 1);
        snprintf(got, sizeof got, "\"%.100s\" (the last message is what the model learns to end with)", last);
        return FIELD_ERR(field, "\"assistant\"", got);
    }
    return MOERL_OK;
}

static char *int_str(json_int_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, v);
    return xstrdup(buf);
}

/* Python's str(x) of a finite double (repr: the shortest digits that read back as x; positional for
 * decimal exponents -4 ≤ e < 16 with ".0" on whole numbers, else d.ddde±XX). jansson never holds
 * inf/nan (JSON has no such numbers). Returns a malloc'd string. */
static char *py_float_str(double x) {
    char digits[24];
    int exp10, neg;
    const int nd = moerl_shortest_digits(x, digits, &exp10, &neg);
    char out[96];
    int o = 0;
    if (neg) out[o++] = '-';
    if (exp10 < -4 || exp10 >= 16) {
        out[o++] = digits[0];
        if (nd > 1) o += snprintf(out + o, sizeof out - (size_t)o, ".%s", digits + 1);
        snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        o += snprintf(out + o, sizeof out - (size_t)o, "0.");
        for (int i = 0; i < -exp10 - 1; i++) out[o++] = '0';
        snprintf(out + o, sizeof out - (size_t)o, "%s", digits);
    } else {
        for (int i = 0; i <= exp10 || i < nd; i++) {
            if (i == exp10 + 1) out[o++] = '.';
            out[o++] = i < nd ? digits[i] : '0';
        }
        if (nd <= exp10 + 1) o += snprintf(out + o, sizeof out - (size_t)o, ".0");
        out[o] = 0;
    }
    return xstrdup(out);
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
        if (parse_msg(name, line, "prompt", json_array_get(p, i), i, &r->prompt[i])) return MOERL_ERR;
    }
    if (parse_tools(name, line, json_object_get(o, "tools"), &r->tools)) return MOERL_ERR;

    json_t *rm = json_object_get(o, "reward_model");
    if (!rm) return FIELD_ERR("reward_model", "an object {\"style\", \"ground_truth\"}", "nothing (the field is missing)");
    if (!json_is_object(rm)) return FIELD_ERR("reward_model", "an object {\"style\", \"ground_truth\"}", json_kind(rm));
    json_t *style = json_object_get(rm, "style"); /* absent: "rule" (verl reads no style for rule rewards) */
    if (style && !json_is_string(style)) return FIELD_ERR("reward_model.style", "\"rule\"", json_kind(style));
    if (style && strcmp(json_string_value(style), "rule") != 0) {
        char got[300];
        snprintf(got, sizeof got, "\"%.200s\" (only rule-based rewards are supported)", json_string_value(style));
        return FIELD_ERR("reward_model.style", "\"rule\"", got);
    }
    json_t *gt = json_object_get(rm, "ground_truth");
    const char *gt_expect = "a string, a number, or an object/list for structured tasks";
    if (!gt) return FIELD_ERR("reward_model.ground_truth", gt_expect, "nothing (the field is missing)");
    if (json_is_string(gt)) {
        r->ground_truth = xstrdup(json_string_value(gt));
    } else if (json_is_number(gt)) {
        /* Python's str() of the number: the built-in rewards' text, and valid JSON for a custom reward */
        r->ground_truth = json_is_integer(gt) ? int_str(json_integer_value(gt)) : py_float_str(json_real_value(gt));
        r->ground_truth_json = 1;
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
    return parse_response(name, line, json_object_get(o, "response"), r);
}

/* A file that is not JSONL at all (parquet, verl's usual format) is named as such, with the one-line
 * conversion; a UTF-8 byte order mark (Windows editors write one) is skipped: it carries no data. */
static int check_not_jsonl(const char *name, const char **text, size_t *len) {
    if (*len >= 4 && !memcmp(*text, "PAR1", 4))
        return moerl_errorf("%s is a parquet file (it starts with the parquet magic 'PAR1'): moerl reads JSONL "
                            "(one JSON object a line, the same fields), not parquet; convert it with: python3 -c "
                            "\"import pandas as pd; pd.read_parquet('%s').to_json('%s.jsonl', orient='records', "
                            "lines=True)\"", name, name, name);
    if (*len >= 3 && !memcmp(*text, "\xEF\xBB\xBF", 3)) {
        *text += 3;
        *len -= 3;
    }
    return MOERL_OK;
}

int dataset_load_string(dataset *ds, const char *text, size_t len, const char *name) {
    memset(ds, 0, sizeof *ds);
    if (check_not_jsonl(name, &text, &len) != MOERL_OK) return MOERL_ERR;
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

/* msgs[n] as the JSON list `key` of o. */
static int msgs_field(json_t *o, const char *key, const chat_msg *msgs, int n) {
    json_t *p = json_array();
    json_object_set_new(o, key, p);
    for (int i = 0; i < n; i++) {
        if (msgs[i].msg) {
            json_array_append(p, msgs[i].msg);
            continue;
        }
        json_t *m = json_object();
        json_array_append_new(p, m);
        if (str_field(m, "role", msgs[i].role) || str_field(m, "content", msgs[i].content)) return MOERL_ERR;
    }
    return MOERL_OK;
}

int dataset_write_row(FILE *f, const ds_row *r) {
    json_t *o = json_object();
    int rc = MOERL_ERR;
    if (str_field(o, "data_source", r->data_source)) goto done;
    if (msgs_field(o, "prompt", r->prompt, r->n_prompt)) goto done;
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
    if (!r->response && r->resp_msgs && msgs_field(o, "response", r->resp_msgs, r->n_resp_msgs)) goto done;
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

/* ---- SFT examples (ds_row_encode_sft) ---- */

/* The end of the earliest stop token text (tokenizer_stop_ids) the template wrote (tpl) at or after
 * `from` in text[0..len), or 0 when there is none. */
static size_t first_eot_end(const tokenizer *t, const char *text, const uint8_t *tpl, size_t len, size_t from) {
    int n_stop = 0;
    const int32_t *stop = tokenizer_stop_ids(t, &n_stop);
    size_t best = 0, best_at = len + 1;
    for (int k = 0; k < n_stop; k++) {
        size_t m = 0;
        char *st = tokenizer_decode(t, &stop[k], 1, false, &m);
        for (size_t i = from; st && m > 0 && i + m <= len && i < best_at; i++) {
            if (memcmp(text + i, st, m)) continue;
            size_t j = 0;
            while (j < m && tpl[i + j]) j++;
            if (j < m) continue;
            best_at = i;
            best = i + m;
        }
        free(st);
    }
    return best;
}

/* Encode text[a..b) with the template mask and append its ids to out and `flag` to mk for each. */
static int encode_piece(const tokenizer *t, const char *text, const uint8_t *tpl, size_t a, size_t b, uint8_t flag,
                        tok_seq *out, uint8_t **mk, size_t *mk_cap) {
    const int64_t n0 = out->n;
    if (b > a && tokenizer_encode_masked(t, text + a, b - a, tpl + a, out) != MOERL_OK) return MOERL_ERR;
    if ((size_t)out->n > *mk_cap) {
        *mk_cap = 2 * (size_t)out->n + 64;
        *mk = xrealloc(*mk, *mk_cap);
    }
    memset(*mk + n0, flag, (size_t)(out->n - n0));
    return MOERL_OK;
}

/* A short printable excerpt of s[0..n) (newlines as \n) for messages. */
static void excerpt(char *dst, size_t cap, const char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        if (s[i] == '\n') { dst[o++] = '\\'; dst[o++] = 'n'; }
        else dst[o++] = (unsigned char)s[i] < 32 ? '?' : s[i];
    }
    dst[o] = 0;
}

/* Assistant turn j of all[0..n) (rendered whole as ft/fm[fl], *pos bytes of it encoded so far): the
 * template text before it (flag 0), then the turn up to its end-of-turn token (flag 1). The rendering
 * of all[0..j) with the generation prompt must be a prefix of the whole one (the same text). */
static int encode_turn(const tokenizer *t, const ds_row *r, const chat_msg *all, int j, const chat_extra *x,
                       const char *where, const char *ft, const uint8_t *fm, size_t fl, size_t *pos, tok_seq *out,
                       uint8_t **mk, size_t *cap) {
    char *pt = NULL;
    uint8_t *pm = NULL;
    size_t pl = 0;
    const int ri = j - r->n_prompt;
    int rc = tokenizer_chat_render_masked(t, all, j, x, true, &pt, &pm, &pl);
    if (rc != MOERL_OK) {
        moerl_error_prefix("%s: response[%d]: rendering the conversation before this assistant turn: ", where, ri);
        goto done;
    }
    if (pl < *pos || pl > fl || memcmp(ft, pt, pl)) {
        size_t d = 0;
        while (d < pl && d < fl && ft[d] == pt[d]) d++;
        char got[64], want[64];
        excerpt(got, sizeof got, ft + d, MOERL_MIN(fl - d, (size_t)40));
        excerpt(want, sizeof want, pt + d, MOERL_MIN(pl - d, (size_t)40));
        rc = moerl_errorf("%s: response[%d]: the chat template's rendering of the whole conversation does not continue "
                          "the rendering of the messages before this assistant turn with the generation prompt: at "
                          "byte %zu it writes \"%s\" where that has \"%s\" (the turn's tokens cannot be placed)",
                          where, ri, d, got, want);
        goto done;
    }
    const size_t e = first_eot_end(t, ft, fm, fl, pl);
    if (e == 0) {
        rc = moerl_errorf("%s: response[%d]: the chat template writes no end-of-turn token after this assistant turn",
                          where, ri);
        goto done;
    }
    /* the text before the turn with the mask of its own rendering (where the generation prompt is
     * template text; in the whole rendering the role may be data), as the prompt and tool turns are
     * encoded in rollouts */
    rc = encode_piece(t, pt, pm, *pos, pl, 0, out, mk, cap);
    if (rc == MOERL_OK) rc = encode_piece(t, ft, fm, pl, e, 1, out, mk, cap);
    if (rc != MOERL_OK) moerl_error_prefix("%s: response[%d]: ", where, ri);
    *pos = e;
done:
    free(pt);
    free(pm);
    return rc;
}

/* A response of messages (ds_row_encode_sft). */
static int encode_conversation(const tokenizer *t, const ds_row *r, const chat_extra *x, const char *where,
                               tok_seq *out, int *resp_start, uint8_t **mask) {
    const int n = r->n_prompt + r->n_resp_msgs;
    chat_msg *all = xmalloc((size_t)n * sizeof *all);
    memcpy(all, r->prompt, (size_t)r->n_prompt * sizeof *all);
    memcpy(all + r->n_prompt, r->resp_msgs, (size_t)r->n_resp_msgs * sizeof *all);
    char *ft = NULL;
    uint8_t *fm = NULL, *mk = NULL;
    size_t fl = 0, pos = 0, cap = 0;
    int rc = tokenizer_chat_render_masked(t, all, n, x, false, &ft, &fm, &fl);
    if (rc != MOERL_OK) moerl_error_prefix("%s: response: rendering the conversation: ", where);
    int64_t start = -1;
    for (int j = r->n_prompt; j < n && rc == MOERL_OK; j++) {
        if (strcmp(all[j].role, "assistant")) continue;
        const int64_t n0 = out->n;
        rc = encode_turn(t, r, all, j, x, where, ft, fm, fl, &pos, out, &mk, &cap);
        if (start < 0 && rc == MOERL_OK) /* the first piece is the prompt with its generation prompt */
            for (start = n0; start < out->n && !mk[start];) start++;
    }
    if (rc == MOERL_OK) {
        *resp_start = (int)start;
        *mask = xmalloc((size_t)(out->n - start) + 1);
        memcpy(*mask, mk + start, (size_t)(out->n - start));
    } else {
        tok_seq_clear(out);
    }
    free(mk);
    free(ft);
    free(fm);
    free(all);
    return rc;
}

int ds_row_encode_sft(const ds_row *r, const char *where, tok_seq *out, int *resp_start, uint8_t **mask) {
    tokenizer *t = tok_current();
    const chat_extra x = {r->tools, NULL};
    *mask = NULL;
    *resp_start = 0;
    if (r->response) {
        if (tokenizer_chat_encode_ex(t, r->prompt, r->n_prompt, &x, true, out) != MOERL_OK)
            return moerl_error_prefix("%s: prompt: ", where);
        *resp_start = (int)out->n;
        if (tokenizer_encode_response(t, r->response, out) != MOERL_OK) {
            tok_seq_clear(out);
            return moerl_error_prefix("%s: response: ", where);
        }
        return MOERL_OK;
    }
    if (!r->resp_msgs) return moerl_errorf("%s: SFT needs a 'response' field", where);
    return encode_conversation(t, r, &x, where, out, resp_start, mask);
}
