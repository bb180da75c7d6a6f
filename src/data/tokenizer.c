/* moerl — tokenizers: the byte tokenizer, the Hugging Face BPE handle, chat templates, stop ids
 * (see tokenizer.h). */
#include "data/tokenizer.h"

#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "data/bpe.h"
#include "data/chat_template.h"
#include "data/jinja.h"

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
    jinja_tpl *jt;        /* the chosen template, parsed (NULL: a native one only) */
    char *file_tpl;       /* the checkpoint's template text, or NULL */
    size_t file_tpl_len;
    char file_tpl_from[32]; /* the file it came from: tokenizer_config.json or chat_template.jinja */
    char *chosen_src;       /* the text of a template chosen from a .jinja file (tokenizer_save writes it) */
    size_t chosen_len;
    char tpl_label[1400]; /* a Jinja template's source: the .jinja path or DIR/tokenizer_config.json */
    json_t *specials;     /* special-token variables of the templates (bos_token, eos_token, ...) */
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
    jinja_free(t->jt);
    free(t->file_tpl);
    free(t->chosen_src);
    json_decref(t->specials);
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

/* The checkpoint's own template text tpl[0..len), from file `from`, kept for "auto". */
static void keep_file_tpl(tokenizer *t, const char *tpl, size_t len, const char *from) {
    t->has_file_tpl = 1;
    t->file_tpl = xmalloc(len + 1);
    memcpy(t->file_tpl, tpl, len);
    t->file_tpl[len] = 0;
    t->file_tpl_len = len;
    snprintf(t->file_tpl_from, sizeof t->file_tpl_from, "%s", from);
    t->tpl_fp = chat_tpl_fingerprint(tpl, len);
    t->tpl_file = chat_tpl_identify(tpl, len);
}

/* The special-token variables apply_chat_template passes to a template (its special_tokens_map):
 * bos_token, eos_token, ... from tokenizer_config.json (a string, or {"content": string}), else
 * special_tokens_map.json. */
static void load_specials(tokenizer *t, const json_t *cfg) {
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
    json_t *map = NULL;
    if (t->file_data[4]) map = json_loadb(t->file_data[4], t->file_len[4], 0, NULL);
    t->specials = json_object();
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        for (int src = 0; src < 2; src++) {
            const json_t *v = json_object_get(src ? map : cfg, keys[k]);
            if (json_is_object(v)) v = json_object_get(v, "content");
            if (json_is_string(v)) {
                json_object_set(t->specials, keys[k], (json_t *)v);
                break;
            }
        }
    }
    json_decref(map);
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
    const char *tpl_file = "tokenizer_config.json";
    if (t->file_data[3]) { /* chat_template.jinja wins over the config's, as in transformers */
        tpl = t->file_data[3];
        tpl_len = t->file_len[3];
        tpl_file = "chat_template.jinja";
    }
    load_specials(t, cfg);
    if (tpl) {
        keep_file_tpl(t, tpl, tpl_len, tpl_file);
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
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir); /* a template a run chose (tokenizer_save) */
        char *src;
        size_t len;
        if (file_exists(path)) {
            if (moerl_read_file(path, &src, &len) != MOERL_OK) {
                tokenizer_free(t);
                return NULL;
            }
            keep_file_tpl(t, src, len, "chat_template.jinja");
            free(src);
        }
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
        if (moerl_write_file_atomic(path, k_moerl_byte_json, strlen(k_moerl_byte_json)) != MOERL_OK) return MOERL_ERR;
    }
    for (int i = 0; t->kind == TK_BPE && i < N_TOK_FILES; i++) {
        if (!t->file_data[i]) continue;
        snprintf(path, sizeof path, "%s/%s", dir, k_tok_files[i]);
        if (moerl_write_file_atomic(path, t->file_data[i], t->file_len[i]) != MOERL_OK) return MOERL_ERR;
    }
    /* a template chosen from a .jinja file (or the byte tokenizer's own): the checkpoint renders as the run did */
    const char *src = t->chosen_src ? t->chosen_src : t->kind == TK_BYTES && t->has_file_tpl ? t->file_tpl : NULL;
    size_t len = t->chosen_src ? t->chosen_len : t->file_tpl_len;
    if (!src) return MOERL_OK;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    return moerl_write_file_atomic(path, src, len);
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
/* The special-token variables of the byte tokenizer (its ids' roles, tokenizer.h). */
static json_t *bytes_specials(void) {
    return json_pack("{s:s, s:s, s:s}", "bos_token", k_special[0], "eos_token", k_special[2], "pad_token",
                     k_special[0]);
}

/* Parse Jinja source src[0..len) named `label` as t's template (t->jt is NULL). */
static int use_jinja(tokenizer *t, const char *src, size_t len, const char *label, const char *key) {
    jinja_tpl *jt;
    if (jinja_parse(src, len, label, &jt) != MOERL_OK) return moerl_error_prefix("%s: ", key);
    t->jt = jt;
    snprintf(t->tpl_label, sizeof t->tpl_label, "%s", label);
    if (!t->specials) t->specials = t->kind == TK_BYTES ? bytes_specials() : json_object();
    return MOERL_OK;
}

/* name is the path of a template file (not a built-in name): ends in ".jinja", holds a '/', or
 * names an existing file. */
static int is_tpl_path(const char *name) {
    size_t n = strlen(name);
    return strchr(name, '/') || (n > 6 && !strcmp(name + n - 6, ".jinja")) || file_exists(name);
}

/* A .jinja file as t's template (native fast path when it is Qwen3's text). */
static int use_jinja_file(tokenizer *t, const char *path, const char *key, chat_tpl *c) {
    char *src;
    size_t len;
    if (!file_exists(path))
        return moerl_errorf("%s: the chat template file '%s' does not exist (give auto, qwen3, chatml or the path of "
                            "a .jinja file)", key, path);
    if (moerl_read_file(path, &src, &len) != MOERL_OK) return moerl_error_prefix("%s: chat template: ", key);
    int rc = use_jinja(t, src, len, path, key);
    chat_tpl native = chat_tpl_identify(src, len);
    if (rc == MOERL_OK) {
        t->chosen_src = src;
        t->chosen_len = len;
    } else {
        free(src);
    }
    *c = native != CHAT_TPL_NONE ? native : CHAT_TPL_JINJA;
    return rc;
}

/* "auto" for a hf-bpe tokenizer: the checkpoint's own template. */
static int use_file_tpl(tokenizer *t, const char *key, chat_tpl *c) {
    if (!t->has_file_tpl)
        return moerl_errorf("%s/tokenizer_config.json has no chat_template: set %s to the path of a .jinja file "
                            "(the model's template), or %s=qwen3 / %s=chatml for a built-in one", t->dir, key, key, key);
    char label[1400];
    snprintf(label, sizeof label, "%s/%s", t->dir, t->file_tpl_from);
    if (use_jinja(t, t->file_tpl, t->file_tpl_len, label, key) != MOERL_OK) return MOERL_ERR;
    *c = t->tpl_file != CHAT_TPL_NONE ? t->tpl_file : CHAT_TPL_JINJA;
    return MOERL_OK;
}

/* The template that name chooses (tokenizer_set_chat_template) into *c and t->jt / t->tpl_label. */
static int choose_tpl(tokenizer *t, const char *name, const char *key, chat_tpl *c) {
    if (!strcmp(name, "auto")) {
        if (t->kind == TK_BYTES && !t->has_file_tpl) *c = CHAT_TPL_CHATML;
        else if (use_file_tpl(t, key, c) != MOERL_OK) return MOERL_ERR;
    } else if (!strcmp(name, "qwen3") || !strcmp(name, "chatml")) {
        chat_tpl_from_name(name, c);
        /* the checkpoint's own Qwen3 template renders what the native one does not (tools, ...) */
        if (*c == CHAT_TPL_QWEN3 && t->tpl_file == CHAT_TPL_QWEN3 && t->kind == TK_BPE &&
            use_file_tpl(t, key, c) != MOERL_OK)
            return MOERL_ERR;
    } else if (is_tpl_path(name)) {
        if (use_jinja_file(t, name, key, c) != MOERL_OK) return MOERL_ERR;
    } else {
        return moerl_errorf("%s: '%s' is not a chat template moerl implements or a file; use auto (the "
                            "checkpoint's own), qwen3, chatml, or the path of a .jinja file", key, name);
    }
    if (t->kind == TK_BPE && *c != CHAT_TPL_JINJA) {
        const char *need[2] = {"<|im_start|>", "<|im_end|>"};
        for (int k = 0; k < 2; k++)
            if (tokenizer_token_id(t, need[k]) < 0)
                return moerl_errorf("%s: the %s chat template needs the token %s, which %s/tokenizer.json lacks", key,
                                    chat_tpl_name(*c), need[k], t->dir);
    }
    return MOERL_OK;
}

int tokenizer_set_chat_template(tokenizer *t, const char *name, bool enable_thinking, const char *key) {
    jinja_tpl *old = t->jt;
    char *old_src = t->chosen_src, old_label[sizeof t->tpl_label];
    size_t old_len = t->chosen_len;
    memcpy(old_label, t->tpl_label, sizeof old_label);
    t->jt = NULL;
    t->chosen_src = NULL;
    t->tpl_label[0] = 0;
    chat_tpl c;
    if (choose_tpl(t, name, key, &c) != MOERL_OK) { /* keep the template chosen before */
        jinja_free(t->jt);
        free(t->chosen_src);
        t->jt = old;
        t->chosen_src = old_src;
        t->chosen_len = old_len;
        memcpy(t->tpl_label, old_label, sizeof old_label);
        return MOERL_ERR;
    }
    jinja_free(old);
    free(old_src);
    t->tpl = c;
    t->thinking = enable_thinking;
    return MOERL_OK;
}

bool tokenizer_enable_thinking(const tokenizer *t) { return t->thinking; }

const char *tokenizer_chat_template_name(const tokenizer *t) {
    return t->tpl == CHAT_TPL_JINJA ? t->tpl_label : chat_tpl_name(t->tpl);
}

static int need_tpl(const tokenizer *t) {
    if (t->tpl != CHAT_TPL_NONE) return MOERL_OK;
    return moerl_errorf("no chat template chosen for the tokenizer of %s (tokenizer_set_chat_template)", t->dir);
}

/* Whether the native renderer of t renders this call exactly (plain messages, no tools, no
 * variable but a bool enable_thinking, which goes to *thinking). Else *why names what it lacks. */
static int native_fits(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x, bool *thinking,
                       char *why, size_t wn) {
    *thinking = t->thinking;
    for (int i = 0; i < n; i++) {
        const char *k = chat_msg_extra_key(&msgs[i]);
        if (k) return snprintf(why, wn, "message %d has '%s'", i, k), 0;
    }
    if (x && x->tools) return snprintf(why, wn, "the conversation has tools"), 0;
    /* whitespace around Qwen3's think block: only the Jinja rendering matches the reference's */
    for (int i = 0; t->tpl == CHAT_TPL_QWEN3 && t->jt && i < n; i++)
        if (!strcmp(msgs[i].role, "assistant") && !chat_qwen3_native_exact(msgs[i].content))
            return snprintf(why, wn, "message %d's think block or leading whitespace", i), 0;
    const char *k;
    json_t *v;
    if (x && x->vars)
        json_object_foreach((json_t *)x->vars, k, v) {
            if (!strcmp(k, "enable_thinking") && json_is_boolean(v)) *thinking = json_is_true(v);
            else return snprintf(why, wn, "the template variable '%s' is given", k), 0;
        }
    return 1;
}

/* The chosen template's rendering of the call into r: the native renderer where it fits, else
 * Jinja; a native template without Jinja source refuses what it would drop. */
static int chat_render_call(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x, bool gen,
                            chat_render *r) {
    if (need_tpl(t) != MOERL_OK) return MOERL_ERR;
    bool thinking;
    char why[300] = "";
    if (t->tpl != CHAT_TPL_JINJA && native_fits(t, msgs, n, x, &thinking, why, sizeof why))
        return chat_render_msgs(t->tpl, msgs, n, gen, thinking, r);
    if (!t->jt)
        return moerl_errorf("%s, which the native %s chat template does not render (it renders each message's role "
                            "and string content only): use the checkpoint's own template (auto) or a .jinja file",
                            why, chat_tpl_name(t->tpl));
    chat_jinja_args a = {x, gen, t->thinking ? -1 : 0, t->specials};
    return chat_render_jinja(t->jt, msgs, n, &a, r);
}

int tokenizer_chat_check_ex(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x) {
    if (need_tpl(t) != MOERL_OK) return MOERL_ERR;
    bool thinking;
    char why[300] = "";
    if (t->tpl != CHAT_TPL_JINJA && native_fits(t, msgs, n, x, &thinking, why, sizeof why))
        return chat_check(t->tpl, msgs, n);
    chat_render r = {0};
    int rc = chat_render_call(t, msgs, n, x, true, &r);
    chat_render_free(&r);
    return rc;
}

int tokenizer_chat_check(const tokenizer *t, const chat_msg *msgs, int n) {
    return tokenizer_chat_check_ex(t, msgs, n, NULL);
}

char *tokenizer_chat_text_ex(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x,
                             bool add_generation_prompt) {
    chat_render r = {0};
    if (chat_render_call(t, msgs, n, x, add_generation_prompt, &r) != MOERL_OK) {
        chat_render_free(&r);
        return NULL;
    }
    free(r.tpl);
    return r.text;
}

char *tokenizer_chat_text(const tokenizer *t, const chat_msg *msgs, int n, bool add_generation_prompt) {
    return tokenizer_chat_text_ex(t, msgs, n, NULL, add_generation_prompt);
}

int tokenizer_chat_encode_ex(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x,
                             bool add_generation_prompt, tok_seq *out) {
    chat_render r = {0};
    int rc = chat_render_call(t, msgs, n, x, add_generation_prompt, &r);
    if (rc == MOERL_OK) rc = encode_render(t, &r, out);
    chat_render_free(&r);
    return rc;
}

int tokenizer_chat_render_masked(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x,
                                 bool add_generation_prompt, char **text, uint8_t **tpl, size_t *len) {
    chat_render r = {0};
    int rc = chat_render_call(t, msgs, n, x, add_generation_prompt, &r);
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

int tokenizer_chat_encode(const tokenizer *t, const chat_msg *msgs, int n, bool add_generation_prompt, tok_seq *out) {
    return tokenizer_chat_encode_ex(t, msgs, n, NULL, add_generation_prompt, out);
}

/* SFT target of a Jinja template (tokenizer_encode_response): what [user "", assistant text]
 * adds to [user ""] + generation prompt, up to the first stop id the template wrote. */
static int jinja_response(const tokenizer *t, const char *text, tok_seq *out) {
    chat_msg m[2] = {{"user", "", NULL}, {"assistant", (char *)text, NULL}};
    chat_render p = {0}, f = {0};
    chat_jinja_args a = {NULL, true, t->thinking ? -1 : 0, t->specials};
    int rc = chat_render_jinja(t->jt, m, 1, &a, &p);
    a.add_generation_prompt = false;
    if (rc == MOERL_OK) rc = chat_render_jinja(t->jt, m, 2, &a, &f);
    if (rc == MOERL_OK && (f.len < p.len || memcmp(f.text, p.text, p.len)))
        rc = moerl_errorf("chat template %s: a conversation ending with an assistant message does not render as its "
                          "generation prompt followed by the response, so SFT targets cannot be cut from it",
                          t->tpl_label);
    tok_seq s = {0};
    if (rc == MOERL_OK) {
        chat_render tail = {f.text + p.len, f.tpl + p.len, f.len - p.len, 0};
        rc = encode_render(t, &tail, &s);
    }
    int64_t end = -1;
    for (int64_t i = 0; rc == MOERL_OK && end < 0 && i < s.n; i++)
        for (int k = 0; k < t->n_stops && end < 0; k++)
            if (s.ids[i] == t->stops[k]) end = i;
    if (rc == MOERL_OK && end < 0)
        rc = moerl_errorf("chat template %s: the rendering of an assistant turn holds none of the tokenizer's stop "
                          "ids (generation_config.json eos_token_id), so a response would never end", t->tpl_label);
    for (int64_t i = 0; rc == MOERL_OK && i <= end; i++) tok_seq_push(out, s.ids[i]);
    tok_seq_free(&s);
    chat_render_free(&p);
    chat_render_free(&f);
    return rc;
}

int tokenizer_encode_response(const tokenizer *t, const char *text, tok_seq *out) {
    if (need_tpl(t) != MOERL_OK) return MOERL_ERR;
    if (t->tpl == CHAT_TPL_JINJA || (t->tpl == CHAT_TPL_QWEN3 && t->jt && !chat_qwen3_native_exact(text)))
        return jinja_response(t, text, out);
    chat_render r = {0};
    int rc = chat_render_response(t->tpl, text, t->thinking, &r);
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
    tok_chat_encode_ex(msgs, n, NULL, add_generation_prompt, out);
}

void tok_chat_encode_ex(const chat_msg *msgs, int n, const chat_extra *x, bool add_generation_prompt, tok_seq *out) {
    if (tokenizer_chat_encode_ex(tok_current(), msgs, n, x, add_generation_prompt, out) != MOERL_OK)
        moerl_fatal("chat template: %s", moerl_last_error());
}

void tok_encode_response(const char *text, tok_seq *out) {
    if (tokenizer_encode_response(tok_current(), text, out) != MOERL_OK)
        moerl_fatal("chat template: %s", moerl_last_error());
}
