/* moerl — chat templates (see chat_template.h). */
#include "data/chat_template.h"

#include <string.h>

#include "base/common.h"
#include "data/jinja.h"

/* Fingerprints (chat_tpl_fingerprint) of the Jinja sources moerl renders natively. */
static const struct {
    uint64_t fp;
    chat_tpl t;
    const char *what;
} k_known[] = {
    {0x2bfdb7aa9754484eULL, CHAT_TPL_QWEN3, "Qwen3 hybrid-thinking chat template (4116 bytes)"},
};

void chat_render_free(chat_render *r) {
    free(r->text);
    free(r->tpl);
    memset(r, 0, sizeof *r);
}

static void put(chat_render *r, const char *s, size_t n, uint8_t is_tpl) {
    if (r->len + n + 1 > r->cap) {
        r->cap = 2 * (r->len + n + 1) + 64;
        r->text = xrealloc(r->text, r->cap);
        r->tpl = xrealloc(r->tpl, r->cap);
    }
    memcpy(r->text + r->len, s, n);
    memset(r->tpl + r->len, is_tpl, n);
    r->len += n;
    r->text[r->len] = 0;
}

static void T(chat_render *r, const char *s) { put(r, s, strlen(s), 1); }
static void C(chat_render *r, const char *s, size_t n) { put(r, s, n, 0); }

int chat_tpl_from_name(const char *name, chat_tpl *out) {
    if (!strcmp(name, "chatml")) *out = CHAT_TPL_CHATML;
    else if (!strcmp(name, "qwen3")) *out = CHAT_TPL_QWEN3;
    else return moerl_errorf("chat template '%s' is not a built-in one (built-in: qwen3, chatml)", name);
    return MOERL_OK;
}

const char *chat_tpl_name(chat_tpl t) {
    return t == CHAT_TPL_CHATML ? "chatml" : t == CHAT_TPL_QWEN3 ? "qwen3" : t == CHAT_TPL_JINJA ? "jinja" : "none";
}

uint64_t chat_tpl_fingerprint(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return h;
}

chat_tpl chat_tpl_identify(const char *jinja, size_t len) {
    uint64_t fp = chat_tpl_fingerprint(jinja, len);
    for (size_t i = 0; i < sizeof k_known / sizeof k_known[0]; i++)
        if (k_known[i].fp == fp) return k_known[i].t;
    return CHAT_TPL_NONE;
}

const char *chat_tpl_end_of_turn(chat_tpl t) {
    (void)t;
    return "<|im_end|>";
}

const char *chat_msg_extra_key(const chat_msg *m) {
    if (!m->msg) return NULL;
    const char *k;
    json_t *v;
    json_object_foreach(m->msg, k, v) {
        if ((strcmp(k, "role") && strcmp(k, "content")) || !json_is_string(v)) return k;
    }
    return json_object_get(m->msg, "content") ? NULL : "content";
}

/* 1 when s starts with a character of JavaScript's whitespace set (String#trim). */
static int js_space_at(const unsigned char *s) {
    if (*s == ' ' || (*s >= '\t' && *s <= '\r')) return 1;
    uint32_t u = 0;
    if (s[0] == 0xc2 && s[1] == 0xa0) return 1; /* U+00A0 */
    if (s[0] >= 0xe1 && s[0] <= 0xef && (s[1] & 0xc0) == 0x80 && (s[2] & 0xc0) == 0x80)
        u = ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (uint32_t)(s[2] & 0x3f);
    return u == 0x1680 || (u >= 0x2000 && u <= 0x200a) || u == 0x2028 || u == 0x2029 || u == 0x202f ||
           u == 0x205f || u == 0x3000 || u == 0xfeff;
}

int chat_qwen3_native_exact(const char *c) {
    return !js_space_at((const unsigned char *)c) && !strstr(c, "</think>");
}

int chat_msgs_plain(const chat_msg *msgs, int n) {
    for (int i = 0; i < n; i++)
        if (chat_msg_extra_key(&msgs[i])) return 0;
    return 1;
}

json_t *chat_msgs_json(const chat_msg *msgs, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        if (msgs[i].msg) {
            json_array_append(a, msgs[i].msg);
            continue;
        }
        json_t *r = json_string(msgs[i].role), *c = json_string(msgs[i].content), *o = json_object();
        json_array_append_new(a, o);
        if (!r || !c) {
            json_decref(r);
            json_decref(c);
            json_decref(a);
            return NULL;
        }
        json_object_set_new(o, "role", r);
        json_object_set_new(o, "content", c);
    }
    return a;
}

int chat_render_jinja(const jinja_tpl *jt, const chat_msg *msgs, int n, const chat_jinja_args *a, chat_render *out) {
    json_t *ms = chat_msgs_json(msgs, n);
    if (!ms) return moerl_errorf("chat template: a message's role or content is not valid UTF-8");
    json_t *vars = json_object();
    json_object_set_new(vars, "messages", ms);
    const chat_extra *x = a->x;
    if (x && x->tools) json_object_set(vars, "tools", (json_t *)x->tools);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(a->add_generation_prompt));
    if (a->enable_thinking >= 0) json_object_set_new(vars, "enable_thinking", json_boolean(a->enable_thinking));
    const char *names[16];
    int nn = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)a->specials, k, v) {
        json_object_set(vars, k, v);
        if (nn < 15) names[nn++] = k;
    }
    names[nn] = NULL;
    if (x && x->vars)
        json_object_foreach((json_t *)x->vars, k, v) {
            if (strcmp(k, "messages") && strcmp(k, "tools") && strcmp(k, "add_generation_prompt"))
                json_object_set(vars, k, v);
        }
    int rc = jinja_render(jt, vars, names, out);
    json_decref(vars);
    if (rc == MOERL_OK && !out->text) put(out, "", 0, 1);
    return rc;
}

int chat_check(chat_tpl t, const chat_msg *msgs, int n) {
    for (int i = 0; i < n; i++) {
        const char *k = chat_msg_extra_key(&msgs[i]);
        if (k)
            return moerl_errorf("message %d has '%s', which the native %s chat template does not render (it renders "
                                "each message's role and string content only): use the checkpoint's own template "
                                "or a .jinja file", i, k, chat_tpl_name(t));
    }
    if (t != CHAT_TPL_QWEN3) return MOERL_OK;
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
            return moerl_errorf("message %d has role '%s', which the qwen3 chat template does not render (it renders "
                                "system, user, assistant, tool)", i, r);
    }
    return MOERL_OK;
}

static int starts_with(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static int ends_with(const char *s, const char *p) {
    size_t n = strlen(s), m = strlen(p);
    return n >= m && !memcmp(s + n - m, p, m);
}

/* The last occurrence of needle in s[0..n), or NULL. */
static const char *last_occ(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m > n) return NULL;
    for (size_t i = n - m + 1; i-- > 0;)
        if (!memcmp(s + i, needle, m)) return s + i;
    return NULL;
}

/* Qwen3's split of an assistant message at "</think>": answer = the text after the last
 * "</think>" with leading newlines removed; reasoning = the text before the first "</think>",
 * trailing newlines removed, then what follows its last "<think>", leading newlines removed.
 * Without "</think>": answer = the whole content, reasoning empty. */
static void split_think(const char *content, const char **ans, size_t *ans_n, const char **rea, size_t *rea_n) {
    const char *first = strstr(content, "</think>");
    *rea = content;
    *rea_n = 0;
    if (!first) {
        *ans = content;
        *ans_n = strlen(content);
        return;
    }
    const char *last = last_occ(content, strlen(content), "</think>");
    const char *a = last + 8;
    while (*a == '\n') a++;
    *ans = a;
    *ans_n = strlen(a);
    size_t bn = (size_t)(first - content);
    while (bn > 0 && content[bn - 1] == '\n') bn--;
    const char *open = last_occ(content, bn, "<think>");
    const char *r = open ? open + 7 : content;
    size_t rn = bn - (size_t)(r - content);
    while (rn > 0 && *r == '\n') { r++; rn--; }
    *rea = r;
    *rea_n = rn;
}

/* "<think>\n" + reasoning.strip('\n') + "\n</think>\n\n" + answer.lstrip('\n') */
static void think_block(chat_render *out, const char *rea, size_t rea_n, const char *ans, size_t ans_n) {
    while (rea_n > 0 && *rea == '\n') { rea++; rea_n--; }
    while (rea_n > 0 && rea[rea_n - 1] == '\n') rea_n--;
    while (ans_n > 0 && *ans == '\n') { ans++; ans_n--; }
    T(out, "<think>\n");
    C(out, rea, rea_n);
    T(out, "\n</think>\n\n");
    C(out, ans, ans_n);
}

static void render_qwen3(const chat_msg *msgs, int n, bool add_gen, bool thinking, chat_render *out) {
    if (n > 0 && !strcmp(msgs[0].role, "system")) {
        T(out, "<|im_start|>system\n");
        C(out, msgs[0].content, strlen(msgs[0].content));
        T(out, "<|im_end|>\n");
    }
    /* the last user message that is not a tool response (multi-step tool use) */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        const char *c = msgs[i].content;
        if (!strcmp(msgs[i].role, "user") && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        if (!strcmp(role, "user") || (!strcmp(role, "system") && i > 0)) {
            T(out, "<|im_start|>");
            C(out, role, strlen(role)); /* data, as in the Jinja rendering (message.role) */
            T(out, "\n");
            C(out, c, strlen(c));
            T(out, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            const char *ans, *rea;
            size_t ans_n, rea_n;
            split_think(c, &ans, &ans_n, &rea, &rea_n);
            T(out, "<|im_start|>");
            C(out, role, strlen(role)); /* message.role in the template: data */
            T(out, "\n");
            if (i > last_query && (i == n - 1 || rea_n > 0)) think_block(out, rea, rea_n, ans, ans_n);
            else C(out, ans, ans_n);
            T(out, "<|im_end|>\n");
        } else if (!strcmp(role, "tool")) {
            if (i == 0 || strcmp(msgs[i - 1].role, "tool")) T(out, "<|im_start|>user");
            T(out, "\n<tool_response>\n");
            C(out, c, strlen(c));
            T(out, "\n</tool_response>");
            if (i == n - 1 || strcmp(msgs[i + 1].role, "tool")) T(out, "<|im_end|>\n");
        }
    }
    if (add_gen) {
        T(out, "<|im_start|>assistant\n");
        if (!thinking) T(out, "<think>\n\n</think>\n\n");
    }
}

int chat_render_msgs(chat_tpl t, const chat_msg *msgs, int n, bool add_gen, bool thinking, chat_render *out) {
    if (chat_check(t, msgs, n) != MOERL_OK) return MOERL_ERR;
    if (t == CHAT_TPL_QWEN3) {
        render_qwen3(msgs, n, add_gen, thinking, out);
    } else if (t == CHAT_TPL_CHATML) {
        for (int i = 0; i < n; i++) {
            T(out, "<|im_start|>");
            C(out, msgs[i].role, strlen(msgs[i].role));
            T(out, "\n");
            C(out, msgs[i].content, strlen(msgs[i].content));
            T(out, "<|im_end|>\n");
        }
        if (add_gen) T(out, "<|im_start|>assistant\n");
    } else {
        return moerl_errorf("no chat template chosen");
    }
    if (!out->text) put(out, "", 0, 1); /* an empty rendering is still a string */
    return MOERL_OK;
}

int chat_render_response(chat_tpl t, const char *response, bool thinking, chat_render *out) {
    if (t == CHAT_TPL_QWEN3) {
        const char *ans, *rea;
        size_t ans_n, rea_n;
        split_think(response, &ans, &ans_n, &rea, &rea_n);
        if (thinking || rea_n > 0) {
            think_block(out, rea, rea_n, ans, ans_n);
        } else {
            while (ans_n > 0 && *ans == '\n') { ans++; ans_n--; }
            C(out, ans, ans_n);
        }
    } else if (t == CHAT_TPL_CHATML) {
        C(out, response, strlen(response));
    } else {
        return moerl_errorf("no chat template chosen");
    }
    if (!out->text) put(out, "", 0, 1);
    return MOERL_OK;
}
