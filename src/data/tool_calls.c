/* Hermes tool-call parsing and the tool config loader (data/tool_calls.h). */
#include "data/tool_calls.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/common.h"

/* ---------------------------------------------------------------- hermes parsing */

static const char OPEN_TAG[] = "<tool_call>", CLOSE_TAG[] = "</tool_call>";

static const char *find_sub(const char *s, const char *end, const char *pat) {
    const size_t m = strlen(pat);
    for (const char *p = s; p + m <= end; p++)
        if (!memcmp(p, pat, m)) return p;
    return NULL;
}

static char *fmt_alloc(const char *fmt, const char *a, const char *b) {
    const int n = snprintf(NULL, 0, fmt, a, b);
    char *s = xmalloc((size_t)n + 1);
    snprintf(s, (size_t)n + 1, fmt, a, b);
    return s;
}

/* The arguments of a parsed block as compact JSON object text, or NULL (error set). */
static char *call_arguments(json_t *args, char **error) {
    json_t *obj = args, *owned = NULL;
    if (!args || json_is_null(args)) return xstrdup("{}");
    if (json_is_string(args)) { /* some models write the arguments as a JSON string */
        json_error_t je;
        owned = obj = json_loadb(json_string_value(args), json_string_length(args), 0, &je);
    }
    if (!obj || !json_is_object(obj)) {
        *error = xstrdup("Error: the tool call's \"arguments\" must be a JSON object");
        json_decref(owned);
        return NULL;
    }
    char *s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(owned);
    return s;
}

/* Parse one block's inner text into c. */
static void parse_block(const char *s, size_t n, const tool_config *tools, tool_call *c) {
    json_error_t je;
    json_t *j = json_loadb(s, n, 0, &je);
    if (!j) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s (line %d column %d)", je.text, je.line, je.column);
        c->error = fmt_alloc("Error: the tool call is not valid JSON: %s%s", msg, "");
        return;
    }
    json_t *name = json_object_get(j, "name");
    if (!json_is_object(j)) c->error = xstrdup("Error: the tool call must be a JSON object {\"name\": ..., \"arguments\": {...}}");
    else if (!json_is_string(name) || !json_string_length(name))
        c->error = xstrdup("Error: the tool call has no \"name\" string");
    if (c->error) { json_decref(j); return; }
    c->name = xstrdup(json_string_value(name));
    if (tools && tool_config_find(tools, c->name) < 0) {
        char list[512] = "";
        for (int i = 0; i < tools->n && strlen(list) < sizeof list - 80; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", tools->tools[i].name);
        c->error = fmt_alloc("Error: unknown tool '%s'; the tools are: %s", c->name, list);
    } else {
        c->arguments = call_arguments(json_object_get(j, "arguments"), &c->error);
    }
    json_decref(j);
}

static void trim_append(char **buf, size_t *len, const char *s, size_t n) {
    *buf = xrealloc(*buf, *len + n + 1);
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

int tool_calls_parse_hermes(const char *text, size_t len, const tool_config *tools, tool_calls *out) {
    memset(out, 0, sizeof *out);
    if (!text) return moerl_errorf("tool_calls_parse_hermes: no text");
    const char *p = text, *end = text + len;
    char *content = xstrdup("");
    size_t clen = 0;
    int cap = 0;
    for (;;) {
        const char *o = find_sub(p, end, OPEN_TAG);
        const char *cl = o ? find_sub(o + strlen(OPEN_TAG), end, CLOSE_TAG) : NULL;
        if (!o || !cl) { /* no further (closed) block: the rest is text */
            trim_append(&content, &clen, p, (size_t)(end - p));
            break;
        }
        trim_append(&content, &clen, p, (size_t)(o - p));
        if (out->n == cap) {
            cap = cap ? 2 * cap : 4;
            out->calls = xrealloc(out->calls, cap * sizeof(tool_call));
        }
        tool_call *c = &out->calls[out->n++];
        memset(c, 0, sizeof *c);
        const char *in = o + strlen(OPEN_TAG);
        parse_block(in, (size_t)(cl - in), tools, c);
        out->n_errors += c->error != NULL;
        p = cl + strlen(CLOSE_TAG);
    }
    size_t a = 0, b = clen;
    while (a < b && isspace((unsigned char)content[a])) a++;
    while (b > a && isspace((unsigned char)content[b - 1])) b--;
    memmove(content, content + a, b - a);
    content[b - a] = 0;
    out->content = content;
    return MOERL_OK;
}

void tool_calls_free(tool_calls *tc) {
    for (int i = 0; i < tc->n; i++) {
        free(tc->calls[i].name);
        free(tc->calls[i].arguments);
        free(tc->calls[i].error);
    }
    free(tc->calls);
    free(tc->content);
    memset(tc, 0, sizeof *tc);
}

/* ---------------------------------------------------------------- tool config */

/* A plain scalar as YAML's core schema resolves it; quoted scalars are strings. */
static json_t *yaml_scalar_json(const yaml_node_t *nd) {
    const char *s = (const char *)nd->data.scalar.value;
    if (nd->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return json_stringn(s, nd->data.scalar.length);
    if (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL")) return json_null();
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) return json_true();
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) return json_false();
    char *e;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    if (!*e && errno == 0) return json_integer(v);
    double d = strtod(s, &e);
    if (!*e && isfinite(d) && strpbrk(s, "0123456789")) return json_real(d);
    return json_string(s);
}

static json_t *yaml_to_json(yaml_document_t *doc, yaml_node_t *nd, int depth) {
    if (!nd || depth > 64) return NULL;
    if (nd->type == YAML_SCALAR_NODE) return yaml_scalar_json(nd);
    if (nd->type == YAML_SEQUENCE_NODE) {
        json_t *a = json_array();
        for (yaml_node_item_t *it = nd->data.sequence.items.start; it < nd->data.sequence.items.top; it++) {
            json_t *v = yaml_to_json(doc, yaml_document_get_node(doc, *it), depth + 1);
            if (!v) { json_decref(a); return NULL; }
            json_array_append_new(a, v);
        }
        return a;
    }
    if (nd->type == YAML_MAPPING_NODE) {
        json_t *o = json_object();
        for (yaml_node_pair_t *pr = nd->data.mapping.pairs.start; pr < nd->data.mapping.pairs.top; pr++) {
            yaml_node_t *k = yaml_document_get_node(doc, pr->key);
            json_t *v = yaml_to_json(doc, yaml_document_get_node(doc, pr->value), depth + 1);
            if (!k || k->type != YAML_SCALAR_NODE || !v || json_object_get(o, (const char *)k->data.scalar.value)) {
                json_decref(v); /* a non-scalar or repeated key */
                json_decref(o);
                return NULL;
            }
            json_object_set_new(o, (const char *)k->data.scalar.value, v);
        }
        return o;
    }
    return NULL;
}

static int name_ok(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.') return 0;
    return 1;
}

/* One list entry → t. Errors name the file, the entry and the key. */
static int tool_from_json(json_t *j, const char *file, int idx, tool_def *t) {
    if (!json_is_object(j)) return moerl_errorf("%s: tool %d: expected a mapping (type/function/command|url)", file, idx);
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        if (strcmp(key, "type") && strcmp(key, "function") && strcmp(key, "command") && strcmp(key, "url"))
            return moerl_errorf("%s: tool %d: unknown key '%s' (expected type, function, command or url)%s", file, idx, key,
                                !strcmp(key, "class_name") || !strcmp(key, "config") || !strcmp(key, "tool_schema")
                                    ? "; verl's tool classes are Python objects moerl does not load: give the schema "
                                      "(tool_schema's function) under function: and run the tool as a program "
                                      "(command:) or a server (url:) speaking docs/multi-turn.md's protocol"
                                    : "");
    }
    json_t *type = json_object_get(j, "type"), *fn = json_object_get(j, "function");
    if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function")))
        return moerl_errorf("%s: tool %d: type must be \"function\"", file, idx);
    if (!json_is_object(fn))
        return moerl_errorf("%s: tool %d: 'function' must be a mapping with name/description/parameters", file, idx);
    json_object_foreach(fn, key, v) {
        if (strcmp(key, "name") && strcmp(key, "description") && strcmp(key, "parameters") && strcmp(key, "strict"))
            return moerl_errorf("%s: tool %d: function: unknown key '%s' (expected name, description, parameters, strict)",
                                file, idx, key);
    }
    json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
           *params = json_object_get(fn, "parameters");
    if (!name) return moerl_errorf("%s: tool %d: function.name is missing (every tool needs a name)", file, idx);
    if (!json_is_string(name) || !name_ok(json_string_value(name)))
        return moerl_errorf("%s: tool %d: function.name must be a name of letters, digits, '_', '-', '.'%s%s%s", file, idx,
                            json_is_string(name) ? ", got '" : "", json_is_string(name) ? json_string_value(name) : "",
                            json_is_string(name) ? "'" : "");
    const char *nm = json_string_value(name);
    if (desc && !json_is_string(desc)) return moerl_errorf("%s: tool %d (%s): function.description must be text", file, idx, nm);
    if (params && !json_is_object(params))
        return moerl_errorf("%s: tool %d (%s): function.parameters must be a mapping (a JSON schema)", file, idx, nm);
    json_t *cmd = json_object_get(j, "command"), *url = json_object_get(j, "url");
    if (!!cmd == !!url) return moerl_errorf("%s: tool %d (%s): give exactly one of command: or url:", file, idx, nm);
    json_t *run = cmd ? cmd : url;
    if (!json_is_string(run) || !json_string_length(run))
        return moerl_errorf("%s: tool %d (%s): %s must be a non-empty string", file, idx, nm, cmd ? "command" : "url");
    t->name = xstrdup(nm);
    t->command = cmd ? xstrdup(json_string_value(cmd)) : NULL;
    t->url = url ? xstrdup(json_string_value(url)) : NULL;
    t->schema = json_pack("{s:s, s:O}", "type", "function", "function", fn);
    return MOERL_OK;
}

static int tools_from_json(json_t *root, const char *file, tool_config *out) {
    json_t *list = json_is_object(root) ? json_object_get(root, "tools") : root;
    if (json_is_object(root) && json_object_size(root) != 1)
        return moerl_errorf("%s: expected a list of tools, or a mapping with only the key 'tools'", file);
    if (!json_is_array(list) || json_array_size(list) == 0)
        return moerl_errorf("%s: expected a non-empty list of tools", file);
    out->tools = xcalloc(json_array_size(list), sizeof(tool_def));
    for (size_t i = 0; i < json_array_size(list); i++) {
        if (tool_from_json(json_array_get(list, i), file, (int)i, &out->tools[i]) != MOERL_OK) return MOERL_ERR;
        out->n++;
        if (tool_config_find(out, out->tools[i].name) != (int)i)
            return moerl_errorf("%s: tool %zu: the name '%s' is used twice", file, i, out->tools[i].name);
    }
    return MOERL_OK;
}

int tool_config_load_string(const char *text, size_t len, const char *name, tool_config *out) {
    memset(out, 0, sizeof *out);
    yaml_parser_t p;
    yaml_document_t doc;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    if (!yaml_parser_load(&p, &doc)) {
        int rc = moerl_errorf("%s: line %d: YAML error: %s", name, (int)p.problem_mark.line + 1,
                              p.problem ? p.problem : "unknown");
        yaml_parser_delete(&p);
        return rc;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    json_t *j = root ? yaml_to_json(&doc, root, 0) : NULL;
    yaml_document_delete(&doc);
    yaml_parser_delete(&p);
    int rc = j ? tools_from_json(j, name, out)
               : moerl_errorf("%s: %s", name,
                              root ? "mapping keys must be distinct scalars (and nesting below 64 levels)"
                                   : "empty file; expected a list of tools");
    json_decref(j);
    if (rc != MOERL_OK) tool_config_free(out);
    return rc;
}

int tool_config_load(const char *path, tool_config *out) {
    char *buf;
    size_t len;
    memset(out, 0, sizeof *out);
    if (moerl_read_file(path, &buf, &len) != MOERL_OK)
        return moerl_error_prefix("rollout.multi_turn.tool_config_path: ");
    int rc = tool_config_load_string(buf, len, path, out);
    free(buf);
    return rc;
}

void tool_config_free(tool_config *tc) {
    for (int i = 0; i < tc->n; i++) {
        free(tc->tools[i].name);
        free(tc->tools[i].command);
        free(tc->tools[i].url);
        json_decref(tc->tools[i].schema);
    }
    free(tc->tools);
    memset(tc, 0, sizeof *tc);
}

int tool_config_find(const tool_config *tc, const char *name) {
    for (int i = 0; tc && i < tc->n; i++)
        if (!strcmp(tc->tools[i].name, name)) return i;
    return -1;
}

json_t *tool_config_schemas(const tool_config *tc) {
    json_t *a = json_array();
    for (int i = 0; i < tc->n; i++) json_array_append(a, tc->tools[i].schema);
    return a;
}
