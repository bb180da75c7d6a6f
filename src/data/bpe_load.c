/* moerl — Hugging Face tokenizer.json byte-level BPE: loading and validating the file (see bpe.h;
 * encoding is bpe.c). Field semantics follow the `tokenizers` library's serialisation
 * (tokenizers/src/models/bpe/serialization.rs, pre_tokenizers/byte_level.rs). */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/common.h"
#include "data/bpe_internal.h"

/* The GPT-2 split pattern, which ByteLevel applies itself when "use_regex" is true
 * (tokenizers/src/pre_tokenizers/byte_level.rs). */
static const char k_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- GPT-2 byte ↔ unicode map: printable Latin-1 bytes keep their code point, the other 68
 * bytes (0-32, 127-160, 173) take 256, 257, ... in byte order. ---- */
static uint32_t byte_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256u + (uint32_t)n;
}

static int g_cp_table[324];
static pthread_once_t g_cp_once = PTHREAD_ONCE_INIT;
static void cp_table_init(void) {
    for (int i = 0; i < 324; i++) g_cp_table[i] = -1;
    for (int b = 0; b < 256; b++) g_cp_table[byte_cp(b)] = b;
}
static int *bpe_cp_table_(void) {
    pthread_once(&g_cp_once, cp_table_init);
    return g_cp_table;
}

static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 63)); o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

static void vocab_insert(hf_bpe *b, int32_t id) {
    uint64_t h = hash_bytes(b->bytes + b->off[id], (size_t)b->len[id]);
    uint32_t i = (uint32_t)h & b->vocab_mask;
    while (b->vocab[i].h) i = (i + 1) & b->vocab_mask;
    b->vocab[i].h = h;
    b->vocab[i].id = id;
}

/* distinguishes each loaded tokenizer in the encoder's per-thread caches */
static atomic_uint_fast64_t g_serial = 1;

/* ---- loading ---- */
void hf_bpe_free(hf_bpe *b) {
    if (!b) return;
    free(b->bytes);
    free(b->off);
    free(b->len);
    free(b->special);
    free(b->vocab);
    free(b->merges);
    for (int i = 0; i < b->n_added; i++) free(b->added[i].text);
    free(b->added);
    if (b->re) pcre2_code_free(b->re);
    free(b);
}

static const char *jtype(const json_t *v) {
    if (!v) return "nothing (absent)";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Type name of a component object ("type" field), or NULL. */
static const char *ctype(const json_t *o) {
    const json_t *t = json_is_object(o) ? json_object_get(o, "type") : NULL;
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* true/false/absent boolean field; *v gets dflt when absent. Returns -1 for another type. */
static int jbool(const json_t *o, const char *k, int dflt, int *v) {
    const json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) { *v = dflt; return 0; }
    if (!json_is_boolean(x)) return -1;
    *v = json_is_true(x);
    return 0;
}

/* Raw bytes of a byte-level string (each character of the byte alphabet → its byte; any other
 * character is kept as its own UTF-8). Returns the byte count written to out (≤ n). */
static size_t bytelevel_decode(const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t bad = 0, k = utf8_seq((const unsigned char *)s + i, n - i, &bad);
        if (!k) { out[o++] = s[i++]; continue; }
        size_t cl;
        uint32_t cp = utf8_cp((const unsigned char *)s + i, &cl);
        int b = cp < 324 ? bpe_cp_table_()[cp] : -1;
        if (b >= 0) out[o++] = (char)b;
        else { memcpy(out + o, s + i, k); o += k; }
        i += k;
    }
    return o;
}

static int check_pretok(hf_bpe *b, const json_t *pt, const char *name, const char **pattern) {
    const char *ty = ctype(pt);
    if (!ty) return moerl_errorf("%s: pre_tokenizer: expected an object with a \"type\", got %s", name, jtype(pt));
    if (!strcmp(ty, "Sequence")) {
        const json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list))
            return moerl_errorf("%s: pre_tokenizer.pretokenizers: expected a list, got %s", name, jtype(list));
        size_t n = json_array_size(list);
        int seen_bl = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *p = json_array_get(list, i);
            const char *pty = ctype(p);
            if (pty && !strcmp(pty, "Split") && i == 0 && n > 1) {
                const json_t *pat = json_object_get(p, "pattern");
                const json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
                if (!json_is_string(rx))
                    return moerl_errorf("%s: pre_tokenizer Split: pattern %s is not supported (moerl supports "
                                        "{\"Regex\": ...})", name, json_is_object(pat) && json_object_get(pat, "String")
                                        ? "{\"String\": ...}" : jtype(pat));
                const json_t *beh = json_object_get(p, "behavior");
                if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"))
                    return moerl_errorf("%s: pre_tokenizer Split: behavior %s is not supported (moerl supports "
                                        "\"Isolated\")", name, json_is_string(beh) ? json_string_value(beh) : jtype(beh));
                int inv;
                if (jbool(p, "invert", 0, &inv) || inv)
                    return moerl_errorf("%s: pre_tokenizer Split: invert true is not supported", name);
                *pattern = json_string_value(rx);
            } else if (pty && !strcmp(pty, "ByteLevel") && i == n - 1) {
                int ap, ur;
                if (jbool(p, "add_prefix_space", 0, &ap) || ap)
                    return moerl_errorf("%s: pre_tokenizer ByteLevel: add_prefix_space true is not supported", name);
                if (jbool(p, "use_regex", 1, &ur) || (ur && *pattern))
                    return moerl_errorf("%s: pre_tokenizer ByteLevel: use_regex true after a Split is not supported",
                                        name);
                if (ur) *pattern = k_gpt2_pattern;
                seen_bl = 1;
            } else {
                return moerl_errorf("%s: pre_tokenizer.pretokenizers[%zu]: type %s is not supported here (moerl "
                                    "supports [Split(Regex), ByteLevel] or ByteLevel)", name, i, pty ? pty : jtype(p));
            }
        }
        if (!seen_bl) return moerl_errorf("%s: pre_tokenizer: a ByteLevel step is required (byte-level BPE)", name);
        if (!*pattern) return moerl_errorf("%s: pre_tokenizer: no split pattern", name);
        return MOERL_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        int ap, ur;
        if (jbool(pt, "add_prefix_space", 0, &ap) || ap)
            return moerl_errorf("%s: pre_tokenizer ByteLevel: add_prefix_space true is not supported", name);
        if (jbool(pt, "use_regex", 1, &ur) || !ur)
            return moerl_errorf("%s: pre_tokenizer ByteLevel with use_regex false and no Split is not supported", name);
        *pattern = k_gpt2_pattern;
        return MOERL_OK;
    }
    return moerl_errorf("%s: pre_tokenizer type %s is not supported (moerl supports byte-level BPE: ByteLevel, or "
                        "Sequence[Split, ByteLevel])", name, ty);
}

static int check_normalizer(hf_bpe *b, const json_t *nz, const char *name) {
    if (!nz || json_is_null(nz)) return MOERL_OK;
    const char *ty = ctype(nz);
    if (ty && !strcmp(ty, "NFC")) {
        b->nfc = 1;
        bpe_nfc_prepare();
        return MOERL_OK;
    }
    if (ty && !strcmp(ty, "Sequence")) {
        const json_t *list = json_object_get(nz, "normalizers");
        if (!json_is_array(list)) return moerl_errorf("%s: normalizer.normalizers: expected a list", name);
        for (size_t i = 0; i < json_array_size(list); i++) {
            const char *t2 = ctype(json_array_get(list, i));
            if (!t2 || strcmp(t2, "NFC"))
                return moerl_errorf("%s: normalizer.normalizers[%zu]: type %s is not supported (moerl supports NFC)",
                                    name, i, t2 ? t2 : "(none)");
            b->nfc = 1;
            bpe_nfc_prepare();
        }
        return MOERL_OK;
    }
    return moerl_errorf("%s: normalizer type %s is not supported (moerl supports none or NFC)", name,
                        ty ? ty : jtype(nz));
}

/* model.*: a BPE model without dropout, byte fallback or subword affixes; sets ignore_merges. */
static int check_model(hf_bpe *b, const json_t *model, const char *name) {
    const char *mty = ctype(model);
    if (!json_is_object(model)) return moerl_errorf("%s: model: expected an object, got %s", name, jtype(model));
    if (mty && strcmp(mty, "BPE"))
        return moerl_errorf("%s: model.type %s is not supported (moerl supports byte-level BPE)", name, mty);
    const json_t *d = json_object_get(model, "dropout");
    if (d && !json_is_null(d) && !(json_is_number(d) && json_number_value(d) == 0))
        return moerl_errorf("%s: model.dropout %g is not supported (BPE dropout is for training)", name,
                            json_number_value(d));
    int bf, im;
    if (jbool(model, "byte_fallback", 0, &bf) || bf)
        return moerl_errorf("%s: model.byte_fallback true is not supported", name);
    if (jbool(model, "ignore_merges", 0, &im))
        return moerl_errorf("%s: model.ignore_merges: expected true/false", name);
    b->ignore_merges = im;
    const char *strs[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const json_t *x = json_object_get(model, strs[k]);
        if (x && !json_is_null(x) && !(json_is_string(x) && !json_string_length(x)))
            return moerl_errorf("%s: model.%s %s is not supported (byte-level BPE has none)", name, strs[k],
                                json_is_string(x) ? json_string_value(x) : jtype(x));
    }
    return MOERL_OK;
}

/* decoder and post_processor null or ByteLevel; truncation and padding null. */
static int check_post(const json_t *root, const char *name) {
    const char *keys[2] = {"decoder", "post_processor"};
    for (int k = 0; k < 2; k++) {
        const json_t *x = json_object_get(root, keys[k]);
        if (!x || json_is_null(x)) continue;
        const char *ty = ctype(x);
        if (!ty || strcmp(ty, "ByteLevel"))
            return moerl_errorf("%s: %s type %s is not supported (moerl supports null or ByteLevel)", name, keys[k],
                                ty ? ty : jtype(x));
    }
    const char *nulls[2] = {"truncation", "padding"};
    for (int k = 0; k < 2; k++) {
        const json_t *x = json_object_get(root, nulls[k]);
        if (x && !json_is_null(x))
            return moerl_errorf("%s: %s is set; moerl does not truncate or pad inside the tokenizer (set it to null)",
                                name, nulls[k]);
    }
    return MOERL_OK;
}

/* Check every vocab and added-token id; *max_id gets the largest, *total_bytes an upper bound on
 * the token bytes (byte-level decoding only shrinks a string). */
static int count_ids(const json_t *vocab, const json_t *added, const char *name, int64_t *max_id,
                     size_t *total_bytes) {
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= (1 << 30))
            return moerl_errorf("%s: model.vocab[\"%.40s\"]: expected an id in [0, 2^30), got %s", name, key,
                                jtype(val));
        *max_id = MOERL_MAX(*max_id, json_integer_value(val));
        *total_bytes += strlen(key);
    }
    size_t n_added = added ? json_array_size(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *id = json_object_get(a, "id"), *ct = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 30) ||
            !json_is_string(ct) || !json_string_length(ct))
            return moerl_errorf("%s: added_tokens[%zu]: expected {\"id\": id ≥ 0, \"content\": non-empty string, "
                                "...}", name, i);
        *max_id = MOERL_MAX(*max_id, json_integer_value(id));
        *total_bytes += json_string_length(ct);
    }
    return MOERL_OK;
}

/* The vocab's tokens as bytes (byte-level decoded) at b->bytes + *used, by id. */
static int fill_vocab(hf_bpe *b, const json_t *vocab, const char *name, size_t *used) {
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (b->len[id] >= 0) return moerl_errorf("%s: model.vocab: id %d is given to two tokens", name, id);
        size_t k = bytelevel_decode(key, strlen(key), b->bytes + *used);
        b->off[id] = *used;
        b->len[id] = (int32_t)k;
        *used += k;
    }
    return MOERL_OK;
}

/* The added tokens (their flags checked; their literal text is what their id decodes to), then
 * the per-first-byte candidate lists, longest first (leftmost-longest matching). */
static int fill_added(hf_bpe *b, const json_t *added, size_t n_added, const char *name, size_t *used) {
    b->n_added = (int)n_added;
    b->added = xcalloc(n_added ? n_added : 1, sizeof(added_tok));
    for (int c = 0; c < 256; c++) b->first[c] = -1;
    for (size_t i = 0; i < n_added; i++) {
        const json_t *a = json_array_get(added, i);
        added_tok *t = &b->added[i];
        t->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->len = json_string_length(json_object_get(a, "content"));
        t->text = xmalloc(t->len + 1);
        memcpy(t->text, json_string_value(json_object_get(a, "content")), t->len + 1);
        int sp, ls, rs, sw, nz;
        if (jbool(a, "special", 0, &sp) || jbool(a, "lstrip", 0, &ls) || jbool(a, "rstrip", 0, &rs) ||
            jbool(a, "single_word", 0, &sw) || jbool(a, "normalized", 0, &nz))
            return moerl_errorf("%s: added_tokens[%zu] (%s): special/lstrip/rstrip/single_word/normalized must be "
                                "true or false", name, i, t->text);
        if (ls || rs || sw)
            return moerl_errorf("%s: added_tokens[%zu] (%s): %s true is not supported", name, i, t->text,
                                ls ? "lstrip" : rs ? "rstrip" : "single_word");
        if (nz && b->nfc)
            return moerl_errorf("%s: added_tokens[%zu] (%s): normalized true with a normalizer is not supported",
                                name, i, t->text);
        t->special = sp;
        b->special[t->id] = (uint8_t)sp;
        /* the added token's own text is what it decodes to (it replaces a vocab entry of that id) */
        memcpy(b->bytes + *used, t->text, t->len);
        b->off[t->id] = *used;
        b->len[t->id] = (int32_t)t->len;
        *used += t->len;
    }
    for (int i = 0; i < b->n_added; i++) {
        int c = (unsigned char)b->added[i].text[0], *pp = &b->first[c];
        while (*pp >= 0 && b->added[*pp].len >= b->added[i].len) pp = &b->added[*pp].next;
        b->added[i].next = *pp;
        *pp = i;
    }
    return MOERL_OK;
}

/* Every id's bytes (vocab, then added tokens over them), the bytes → id table, and each byte's id. */
static int build_ids(hf_bpe *b, const json_t *vocab, const json_t *added, const char *name) {
    int64_t max_id = -1;
    size_t total_bytes = 0;
    if (count_ids(vocab, added, name, &max_id, &total_bytes) != MOERL_OK) return MOERL_ERR;
    if (max_id < 0) return moerl_errorf("%s: model.vocab is empty", name);
    size_t n_added = added ? json_array_size(added) : 0;
    b->n_ids = (int32_t)(max_id + 1);
    b->bytes = xmalloc(total_bytes + 1);
    b->off = xcalloc((size_t)b->n_ids, sizeof(size_t));
    b->len = xmalloc(sizeof(int32_t) * (size_t)b->n_ids);
    b->special = xcalloc((size_t)b->n_ids, 1);
    for (int32_t i = 0; i < b->n_ids; i++) b->len[i] = -1;
    size_t used = 0;
    if (fill_vocab(b, vocab, name, &used) != MOERL_OK || fill_added(b, added, n_added, name, &used) != MOERL_OK)
        return MOERL_ERR;
    /* bytes → id */
    b->vocab_mask = pow2_at_least((uint64_t)b->n_ids * 2) - 1;
    b->vocab = xcalloc((size_t)b->vocab_mask + 1, sizeof(vocab_slot));
    for (int32_t id = 0; id < b->n_ids; id++)
        if (b->len[id] >= 0) vocab_insert(b, id);
    for (int c = 0; c < 256; c++) {
        char s[4];
        size_t n = utf8_put(s, byte_cp(c));
        int32_t id = -1;
        /* the vocab entry whose byte-level spelling is this byte's character */
        json_t *v = json_object_getn(vocab, s, n);
        if (json_is_integer(v)) id = (int32_t)json_integer_value(v);
        if (id < 0)
            return moerl_errorf("%s: model.vocab has no token for byte 0x%02X (byte-level character U+%04X)", name, c,
                                (unsigned)byte_cp(c));
        b->byte_id[c] = id;
    }
    return MOERL_OK;
}

/* The two token strings of merge r ("a b" or ["a", "b"]). */
static int merge_parts(const json_t *m, size_t r, const char *name, const char **l, size_t *ll, const char **rr,
                       size_t *rl) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return moerl_errorf("%s: model.merges[%zu] \"%.60s\": expected two tokens separated by one space", name, r,
                                s);
        *l = s;
        *ll = (size_t)(sp - s);
        *rr = sp + 1;
        *rl = strlen(*rr);
        return MOERL_OK;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *l = json_string_value(json_array_get(m, 0));
        *ll = json_string_length(json_array_get(m, 0));
        *rr = json_string_value(json_array_get(m, 1));
        *rl = json_string_length(json_array_get(m, 1));
        return MOERL_OK;
    }
    return moerl_errorf("%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"], got %s", name, r, jtype(m));
}

/* model.merges → the (left, right) → (rank, merged id) table; a repeated merge keeps its first rank. */
static int build_merges(hf_bpe *b, const json_t *model, const json_t *vocab, const char *name) {
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) return moerl_errorf("%s: model.merges: expected a list, got %s", name, jtype(merges));
    size_t nm = json_array_size(merges);
    b->merge_mask = pow2_at_least((uint64_t)nm * 2 + 16) - 1;
    b->merges = xcalloc((size_t)b->merge_mask + 1, sizeof(merge_slot));
    size_t scap = 256;
    char *scratch = xmalloc(scap);
    int rc = MOERL_OK;
    for (size_t r = 0; r < nm && rc == MOERL_OK; r++) {
        const char *l = NULL, *rr = NULL;
        size_t ll = 0, rl = 0;
        if ((rc = merge_parts(json_array_get(merges, r), r, name, &l, &ll, &rr, &rl)) != MOERL_OK) break;
        if (ll + rl + 1 > scap) {
            scap = 2 * (ll + rl + 1);
            scratch = xrealloc(scratch, scap);
        }
        memcpy(scratch, l, ll);
        memcpy(scratch + ll, rr, rl);
        json_t *a = json_object_getn(vocab, l, ll), *c = json_object_getn(vocab, rr, rl),
               *ab = json_object_getn(vocab, scratch, ll + rl);
        if (!a || !c || !ab) {
            rc = moerl_errorf("%s: model.merges[%zu] (\"%.*s\" + \"%.*s\"): %s is not in model.vocab", name, r,
                              (int)ll, l, (int)rl, rr,
                              !a ? "the left token" : !c ? "the right token" : "the merged token");
            break;
        }
        uint64_t k = pair_key((int32_t)json_integer_value(a), (int32_t)json_integer_value(c));
        uint32_t i = pair_hash(k) & b->merge_mask;
        while (b->merges[i].key && b->merges[i].key != k) i = (i + 1) & b->merge_mask;
        if (b->merges[i].key) continue; /* a repeated merge keeps its first (lowest) rank */
        b->merges[i].key = k;
        b->merges[i].rank = (int32_t)r;
        b->merges[i].merged = (int32_t)json_integer_value(ab);
    }
    free(scratch);
    return rc;
}

/* Every check and table of hf_bpe_load on the parsed root object. */
static int load_root(hf_bpe *b, const json_t *root, const char *name) {
    if (!json_is_object(root)) return moerl_errorf("%s: expected a JSON object at the top", name);
    const json_t *model = json_object_get(root, "model");
    if (check_model(b, model, name) != MOERL_OK) return MOERL_ERR;
    if (check_normalizer(b, json_object_get(root, "normalizer"), name) != MOERL_OK) return MOERL_ERR;
    const char *pattern = NULL;
    if (check_pretok(b, json_object_get(root, "pre_tokenizer"), name, &pattern) != MOERL_OK) return MOERL_ERR;
    if (check_post(root, name) != MOERL_OK) return MOERL_ERR;
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab))
        return moerl_errorf("%s: model.vocab: expected an object {token: id}, got %s", name, jtype(vocab));
    if (added && !json_is_null(added) && !json_is_array(added))
        return moerl_errorf("%s: added_tokens: expected a list, got %s", name, jtype(added));
    if (json_is_null(added)) added = NULL;
    if (build_ids(b, vocab, added, name) != MOERL_OK || build_merges(b, model, vocab, name) != MOERL_OK)
        return MOERL_ERR;
    return bpe_compile_pattern(b, pattern, name);
}

hf_bpe *hf_bpe_load(const char *text, size_t tlen, const char *name) {
    json_error_t je;
    json_t *root = json_loadb(text, tlen, JSON_ALLOW_NUL, &je);
    hf_bpe *b = xcalloc(1, sizeof *b);
    b->serial = atomic_fetch_add(&g_serial, 1);
    int rc = root ? load_root(b, root, name)
                  : moerl_errorf("%s: not valid JSON (line %d: %s)", name, je.line, je.text);
    json_decref(root);
    if (rc != MOERL_OK) {
        hf_bpe_free(b);
        return NULL;
    }
    return b;
}
