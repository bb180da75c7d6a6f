/* moerl — tokenizers: the byte tokenizer, the Hugging Face BPE handle, chat templates, stop ids
 * (see tokenizer.h). */
#include "data/tokenizer.h"

#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "data/bpe.h"
#include "data/chat_template.h"

enum { TK_BYTES = 1, TK_BPE = 2 };

/* Files a Hugging Face checkpoint keeps its tokenizer in; kept byte for byte so a checkpoint
 * moerl writes carries them (tokenizer_save). */
static const char *const k_tok_files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                          "chat_template.jinja", "special_tokens_map.json", "vocab.json",
                                          "merges.txt"};
#define N_TOK_FILES (int)(sizeof k_tok_files / sizeof k_tok_files[0])

struct tokenizer {
    int kind;
    hf_bpe *bpe;
    chat_tpl tpl;         /* chosen template (CHAT_TPL_NONE: none yet) */
    chat_tpl tpl_file;    /* the template of tokenizer_config.json, if moerl implements it */
    int has_file_tpl;     /* tokenizer_config.json (or chat_template.jinja) has a template */
    uint64_t tpl_fp;
    bool thinking;
    int32_t eot;          /* end-of-turn id (<|im_end|>) */
    int32_t stops[16];
    int n_stops;
    char dir[1024];
    char *file_data[N_TOK_FILES];
    size_t file_len[N_TOK_FILES];
};

static const char *const k_special[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
static const char k_moerl_byte_json[] =
    "{\"type\": \"moerl-byte\", \"vocab_size\": 259, \"bos_token_id\": 256, \"eos_token_id\": 258}\n";

static tokenizer g_bytes = {.kind = TK_BYTES, .tpl = CHAT_TPL_CHATML, .tpl_file = CHAT_TPL_CHATML,
                            .thinking = true, .eot = TOK_IM_END, .stops = {TOK_IM_END}, .n_stops = 1,
                            .dir = "(moerl byte tokenizer)"};
static tokenizer *g_current;

/* ---- tok_seq ---- */
void tok_seq_push(tok_seq *s, int32_t id) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->ids = xrealloc(s->ids, sizeof(int32_t) * (size_t)s->cap);
    }
    s->ids[s->n++] = id;
}

void tok_seq_clear(tok_seq *s) { s->n = 0; }

void tok_seq_free(tok_seq *s) {
    free(s->ids);
    s->ids = NULL;
    s->n = s->cap = 0;
}

const char *tok_special_text(int32_t id) {
    if (id >= TOK_ENDOFTEXT && id < TOK_VOCAB_SIZE) return k_special[id - TOK_ENDOFTEXT];
    return NULL;
}

/* ---- the byte tokenizer ---- */
static void bytes_encode(const char *text, size_t len, bool allow_special, const uint8_t *ok, tok_seq *out) {
    size_t i = 0;
    while (i < len) {
        if (text[i] == '<' && (ok ? ok[i] : allow_special)) {
            int hit = -1;
            size_t hl = 0;
            for (int k = 0; k < 3; k++) {
                size_t sl = strlen(k_special[k]);
                if (sl <= len - i && memcmp(text + i, k_special[k], sl) == 0) { hit = k; hl = sl; break; }
            }
            if (hit >= 0) {
                tok_seq_push(out, TOK_ENDOFTEXT + hit);
                i += hl;
                continue;
            }
        }
        tok_seq_push(out, (int32_t)(unsigned char)text[i]);
        i++;
    }
}

tokenizer *tokenizer_new_bytes(void) {
    tokenizer *t = xmalloc(sizeof *t);
    *t = g_bytes;
    return t;
}

void tokenizer_free(tokenizer *t) {
    if (!t || t == &g_bytes) return;
    if (g_current == t) g_current = NULL;
    hf_bpe_free(t->bpe);
    for (int i = 0; i < N_TOK_FILES; i++) free(t->file_data[i]);
    free(t);
}

const char *tokenizer_kind(const tokenizer *t) { return t->kind == TK_BPE ? "hf-bpe" : "bytes"; }

int32_t tokenizer_vocab_size(const tokenizer *t) { return t->kind == TK_BPE ? hf_bpe_vocab_size(t->bpe) : TOK_VOCAB_SIZE; }

int32_t tokenizer_token_id(const tokenizer *t, const char *text) {
    if (t->kind == TK_BPE) return hf_bpe_token_id(t->bpe, text, strlen(text));
    for (int k = 0; k < 3; k++)
        if (!strcmp(text, k_special[k])) return TOK_ENDOFTEXT + k;
    return strlen(text) == 1 ? (unsigned char)text[0] : -1;
}

/* ---- loading ---- */
static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* An id field: an integer, or (list_ok) a list of integers; each appended to stops. */
static int add_stop_ids(tokenizer *t, const json_t *v, const char *file, const char *field) {
    if (!v || json_is_null(v)) return MOERL_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(x))
            return moerl_errorf("%s: field '%s': expected a token id or a list of ids", file, field);
        int64_t id = json_integer_value(x);
        if (id < 0 || id >= tokenizer_vocab_size(t))
            return moerl_errorf("%s: field '%s': id %lld is not a token of the tokenizer (ids 0..%d)", file, field,
                                (long long)id, tokenizer_vocab_size(t) - 1);
        int seen = 0;
        for (int k = 0; k < t->n_stops; k++) seen |= t->stops[k] == (int32_t)id;
        if (seen) continue;
        if (t->n_stops == (int)(sizeof t->stops / sizeof t->stops[0]))
            return moerl_errorf("%s: field '%s': more than %d stop ids", file, field, t->n_stops);
        t->stops[t->n_stops++] = (int32_t)id;
    }
    return MOERL_OK;
}

/* The JSON object in dir/name, or NULL (absent: *absent = 1; unreadable/invalid: error). */
static json_t *load_json_obj(const tokenizer *t, int fi, const char *path, int *err) {
    *err = 0;
    if (!t->file_data[fi]) return NULL;
    json_error_t je;
    json_t *o = json_loadb(t->file_data[fi], t->file_len[fi], 0, &je);
    if (!o || !json_is_object(o)) {
        *err = 1;
        moerl_errorf("%s: not a JSON object (%s)", path, o ? "another JSON value" : je.text);
        json_decref(o);
        return NULL;
    }
    return o;
}

static tokenizer *load_hf(const char *dir, int vocab_size) {
    tokenizer *t = xcalloc(1, sizeof *t);
    t->kind = TK_BPE;
    t->thinking = true;
    t->eot = -1;
    snprintf(t->dir, sizeof t->dir, "%s", dir);
    char path[1400];
    json_t *cfg = NULL, *gen = NULL, *mcfg = NULL;
    int err;
    for (int i = 0; i < N_TOK_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, k_tok_files[i]);
        if (file_exists(path) && moerl_read_file(path, &t->file_data[i], &t->file_len[i]) != MOERL_OK) goto fail;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    t->bpe = hf_bpe_load(t->file_data[0], t->file_len[0], path);
    if (!t->bpe) goto fail;
    if (vocab_size > 0 && tokenizer_vocab_size(t) > vocab_size)
        {
            moerl_errorf("%s: the tokenizer has ids up to %d but the model's vocab_size is %d", path,
                         tokenizer_vocab_size(t) - 1, vocab_size);
            goto fail;
        }
    /* tokenizer_config.json: chat template, eos token */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cfg = load_json_obj(t, 1, path, &err);
    if (err) goto fail;
    const char *tpl = NULL;
    size_t tpl_len = 0;
    if (cfg) {
        const json_t *ct = json_object_get(cfg, "chat_template");
        if (json_is_string(ct)) {
            tpl = json_string_value(ct);
            tpl_len = json_string_length(ct);
        } else if (json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...] */
            for (size_t i = 0; i < json_array_size(ct); i++) {
                const json_t *e = json_array_get(ct, i), *nm = json_object_get(e, "name"),
                             *tx = json_object_get(e, "template");
                if (json_is_string(nm) && !strcmp(json_string_value(nm), "default") && json_is_string(tx)) {
                    tpl = json_string_value(tx);
                    tpl_len = json_string_length(tx);
                }
            }
        } else if (ct && !json_is_null(ct)) {
            moerl_errorf("%s: field 'chat_template': expected a string or a list of {name, template}", path);
            goto fail;
        }
        const json_t *eos = json_object_get(cfg, "eos_token");
        if (json_is_object(eos)) eos = json_object_get(eos, "content");
        if (json_is_string(eos)) {
            int32_t id = tokenizer_token_id(t, json_string_value(eos));
            if (id < 0) {
                moerl_errorf("%s: eos_token '%s' is not a token of tokenizer.json", path, json_string_value(eos));
                goto fail;
            }
            json_t *v = json_integer(id);
            int rc = add_stop_ids(t, v, path, "eos_token");
            json_decref(v);
            if (rc != MOERL_OK) goto fail;
        }
    }
    if (!tpl && t->file_data[3]) { /* chat_template.jinja */
        tpl = t->file_data[3];
        tpl_len = t->file_len[3];
    }
    if (tpl) {
        t->has_file_tpl = 1;
        t->tpl_fp = chat_tpl_fingerprint(tpl, tpl_len);
        t->tpl_file = chat_tpl_identify(tpl, tpl_len);
        t->tpl = t->tpl_file;
    }
    /* generation_config.json eos_token_id (all of them), else config.json's */
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    gen = load_json_obj(t, 2, path, &err);
    if (err) goto fail;
    const json_t *geos = gen ? json_object_get(gen, "eos_token_id") : NULL;
    if (geos && !json_is_null(geos)) {
        if (add_stop_ids(t, geos, path, "eos_token_id") != MOERL_OK) goto fail;
    } else {
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (file_exists(path)) {
            json_error_t je;
            mcfg = json_load_file(path, 0, &je);
            if (mcfg && add_stop_ids(t, json_object_get(mcfg, "eos_token_id"), path, "eos_token_id") != MOERL_OK)
                goto fail;
        }
    }
    t->eot = tokenizer_token_id(t, "<|im_end|>");
    json_decref(cfg);
    json_decref(gen);
    json_decref(mcfg);
    return t;
fail:
    json_decref(cfg);
    json_decref(gen);
    json_decref(mcfg);
    tokenizer_free(t);
    return NULL;
}

tokenizer *tokenizer_load(const char *dir, int vocab_size) {
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (file_exists(path)) return load_hf(dir, vocab_size);
    snprintf(path, sizeof path, "%s/tokenizer_moerl.json", dir);
    int marker = file_exists(path);
    if (marker) {
        json_error_t je;
        json_t *o = json_load_file(path, 0, &je);
        const json_t *ty = o ? json_object_get(o, "type") : NULL;
        int ok = json_is_string(ty) && !strcmp(json_string_value(ty), "moerl-byte");
        json_decref(o);
        if (!ok) {
            moerl_errorf("%s: expected {\"type\": \"moerl-byte\", ...} (moerl's byte tokenizer marker)", path);
            return NULL;
        }
    }
    if (marker || vocab_size == TOK_VOCAB_SIZE) {
        if (vocab_size > 0 && vocab_size < TOK_VOCAB_SIZE) {
            moerl_errorf("model '%s' has vocab_size %d, fewer than the %d ids of moerl's byte tokenizer", dir,
                         vocab_size, TOK_VOCAB_SIZE);
            return NULL;
        }
        tokenizer *t = tokenizer_new_bytes();
        snprintf(t->dir, sizeof t->dir, "%s", dir);
        return t;
    }
    if (vocab_size > 0 && vocab_size < TOK_VOCAB_SIZE)
        moerl_errorf("model '%s' has no tokenizer (no tokenizer.json or tokenizer_moerl.json) and its vocab_size %d "
                     "is too small for moerl's byte tokenizer (%d ids)", dir, vocab_size, TOK_VOCAB_SIZE);
    else
        moerl_errorf("model '%s' has no tokenizer: no tokenizer.json (Hugging Face) or tokenizer_moerl.json (moerl's "
                     "byte tokenizer), and its vocab_size %d is not the byte tokenizer's %d — copy the checkpoint's "
                     "tokenizer files (tokenizer.json, tokenizer_config.json, generation_config.json) into the folder",
                     dir, vocab_size, TOK_VOCAB_SIZE);
    return NULL;
}

int tokenizer_save(const tokenizer *t, const char *dir) {
    char path[1200];
    if (t->kind == TK_BYTES) {
        snprintf(path, sizeof path, "%s/tokenizer_moerl.json", dir);
        return moerl_write_file_atomic(path, k_moerl_byte_json, strlen(k_moerl_byte_json));
    }
    for (int i = 0; i < N_TOK_FILES; i++) {
        if (!t->file_data[i]) continue;
        snprintf(path, sizeof path, "%s/%s", dir, k_tok_files[i]);
        if (moerl_write_file_atomic(path, t->file_data[i], t->file_len[i]) != MOERL_OK) return MOERL_ERR;
    }
    return MOERL_OK;
}

/* ---- encode / decode ---- */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool allow_special, tok_seq *out) {
    if (t->kind == TK_BPE) return hf_bpe_encode(t->bpe, text, len, allow_special, NULL, out);
    bytes_encode(text, len, allow_special, NULL, out);
    return MOERL_OK;
}

char *tokenizer_decode(const tokenizer *t, const int32_t *ids, int64_t n, bool skip_special, size_t *len) {
    size_t cap = (size_t)n * 4 + 16, m = 0;
    char *s = xmalloc(cap);
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        const char *piece = NULL;
        size_t pl = 0;
        char byte;
        if (id < 0) {
            free(s);
            moerl_errorf("decode: id %d at position %lld is negative", (int)id, (long long)i);
            return NULL;
        }
        if (t->kind == TK_BPE) {
            if (skip_special && hf_bpe_is_special(t->bpe, id)) continue;
            piece = hf_bpe_piece(t->bpe, id, &pl);
            if (!piece) continue; /* beyond the tokenizer's ids: nothing */
        } else if (id < 256) {
            byte = (char)(unsigned char)id;
            piece = &byte;
            pl = 1;
        } else if (id < TOK_VOCAB_SIZE) {
            if (skip_special) continue;
            piece = k_special[id - TOK_ENDOFTEXT];
            pl = strlen(piece);
        } else {
            continue; /* beyond the byte vocabulary: decodes to nothing */
        }
        if (m + pl + 1 > cap) {
            cap = 2 * (m + pl + 1);
            s = xrealloc(s, cap);
        }
        memcpy(s + m, piece, pl);
        m += pl;
    }
    s[m] = 0;
    if (len) *len = m;
    return s;
}

/* Encode a rendering: control tokens only where the template wrote them. */
static int encode_render(const tokenizer *t, const chat_render *r, tok_seq *out) {
    if (t->kind == TK_BPE) return hf_bpe_encode(t->bpe, r->text, r->len, false, r->tpl, out);
    bytes_encode(r->text, r->len, false, r->tpl, out);
    return MOERL_OK;
}

/* ---- chat ---- */
int tokenizer_set_chat_template(tokenizer *t, const char *name, bool enable_thinking, const char *key) {
    chat_tpl c;
    if (!strcmp(name, "auto")) {
        if (t->kind == TK_BYTES) c = CHAT_TPL_CHATML;
        else if (!t->has_file_tpl)
            return moerl_errorf("%s/tokenizer_config.json has no chat_template: set %s=qwen3 or %s=chatml to use a "
                                "built-in template", t->dir, key, key);
        else if (t->tpl_file == CHAT_TPL_NONE)
            return moerl_errorf("the chat template in %s/tokenizer_config.json (fingerprint %016llx) is not one moerl "
                                "implements (Qwen3's): set %s=qwen3 or %s=chatml to use a built-in template, after "
                                "checking that it renders conversations as the checkpoint's own does",
                                t->dir, (unsigned long long)t->tpl_fp, key, key);
        else c = t->tpl_file;
    } else if (chat_tpl_from_name(name, &c) != MOERL_OK) {
        return moerl_errorf("%s: '%s' is not a chat template moerl implements; use auto (the checkpoint's own), "
                            "qwen3 or chatml", key, name);
    }
    if (t->kind == TK_BPE) {
        const char *need[2] = {"<|im_start|>", "<|im_end|>"};
        for (int k = 0; k < 2; k++)
            if (tokenizer_token_id(t, need[k]) < 0)
                return moerl_errorf("%s: the %s chat template needs the token %s, which %s/tokenizer.json lacks", key,
                                    chat_tpl_name(c), need[k], t->dir);
    }
    t->tpl = c;
    t->thinking = enable_thinking;
    return MOERL_OK;
}

const char *tokenizer_chat_template_name(const tokenizer *t) { return chat_tpl_name(t->tpl); }

static int need_tpl(const tokenizer *t) {
    if (t->tpl != CHAT_TPL_NONE) return MOERL_OK;
    return moerl_errorf("no chat template chosen for the tokenizer of %s (tokenizer_set_chat_template)", t->dir);
}

int tokenizer_chat_check(const tokenizer *t, const chat_msg *msgs, int n) {
    if (need_tpl(t) != MOERL_OK) return MOERL_ERR;
    return chat_check(t->tpl, msgs, n);
}

char *tokenizer_chat_text(const tokenizer *t, const chat_msg *msgs, int n, bool add_generation_prompt) {
    chat_render r = {0};
    if (need_tpl(t) != MOERL_OK || chat_render_msgs(t->tpl, msgs, n, add_generation_prompt, t->thinking, &r)) {
        chat_render_free(&r);
        return NULL;
    }
    free(r.tpl);
    return r.text;
}

int tokenizer_chat_encode(const tokenizer *t, const chat_msg *msgs, int n, bool add_generation_prompt, tok_seq *out) {
    chat_render r = {0};
    int rc = need_tpl(t);
    if (rc == MOERL_OK) rc = chat_render_msgs(t->tpl, msgs, n, add_generation_prompt, t->thinking, &r);
    if (rc == MOERL_OK) rc = encode_render(t, &r, out);
    chat_render_free(&r);
    return rc;
}

int tokenizer_chat_render_masked(const tokenizer *t, const chat_msg *msgs, int n, bool add_generation_prompt, char **text,
                                 uint8_t **tpl, size_t *len) {
    chat_render r = {0};
    int rc = need_tpl(t);
    if (rc == MOERL_OK) rc = chat_render_msgs(t->tpl, msgs, n, add_generation_prompt, t->thinking, &r);
    if (rc != MOERL_OK) {
        chat_render_free(&r);
        return rc;
    }
    *text = r.text;
    *tpl = r.tpl;
    *len = r.len;
    return MOERL_OK;
}

int tokenizer_encode_masked(const tokenizer *t, const char *text, size_t len, const uint8_t *tpl, tok_seq *out) {
    const chat_render r = {(char *)text, (uint8_t *)tpl, len, len};
    return encode_render(t, &r, out);
}

int tokenizer_encode_response(const tokenizer *t, const char *text, tok_seq *out) {
    chat_render r = {0};
    int rc = need_tpl(t);
    if (rc == MOERL_OK) rc = chat_render_response(t->tpl, text, t->thinking, &r);
    if (rc == MOERL_OK) rc = encode_render(t, &r, out);
    chat_render_free(&r);
    if (rc != MOERL_OK) return rc;
    if (t->eot < 0) return moerl_errorf("the tokenizer of %s has no <|im_end|> token to end a response", t->dir);
    tok_seq_push(out, t->eot);
    return MOERL_OK;
}

const int32_t *tokenizer_stop_ids(const tokenizer *t, int *n) {
    *n = t->n_stops;
    return t->stops;
}

/* ---- the current tokenizer ---- */
void tok_set_current(tokenizer *t) { g_current = t; }

tokenizer *tok_current(void) { return g_current ? g_current : &g_bytes; }

int tok_is_stop(int32_t tok) {
    const tokenizer *t = g_current;
    if (!t) return 0;
    for (int i = 0; i < t->n_stops; i++)
        if (t->stops[i] == tok) return 1;
    return 0;
}

void tok_encode(const char *text, size_t len, bool allow_special, tok_seq *out) {
    if (tokenizer_encode(tok_current(), text, len, allow_special, out) != MOERL_OK)
        moerl_fatal("tokenizer: %s", moerl_last_error());
}

char *tok_decode(const int32_t *ids, int64_t n, bool skip_special, size_t *len) {
    return tokenizer_decode(tok_current(), ids, n, skip_special, len);
}

char *tok_chat_text(const chat_msg *msgs, int n, bool add_generation_prompt) {
    char *s = tokenizer_chat_text(tok_current(), msgs, n, add_generation_prompt);
    if (!s) moerl_fatal("chat template: %s", moerl_last_error());
    return s;
}

void tok_chat_encode(const chat_msg *msgs, int n, bool add_generation_prompt, tok_seq *out) {
    if (tokenizer_chat_encode(tok_current(), msgs, n, add_generation_prompt, out) != MOERL_OK)
        moerl_fatal("chat template: %s", moerl_last_error());
}

void tok_encode_response(const char *text, tok_seq *out) {
    if (tokenizer_encode_response(tok_current(), text, out) != MOERL_OK)
        moerl_fatal("chat template: %s", moerl_last_error());
}
