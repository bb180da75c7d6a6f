/* moerl — Hugging Face tokenizer.json byte-level BPE: encoding and lookups (see bpe.h; loading is
 * bpe_load.c). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bpe_internal.h"

#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <utf8proc.h>

#include "base/common.h"

#define CACHE_MAX_PIECE 64       /* pieces up to this many bytes go through the word cache */
#define CACHE_SLOTS (1u << 17)   /* per thread; cleared when half full */
#define CACHE_BYTES (1u << 22)   /* key + id storage per thread before a clear */

/* ---- lookups ---- */
static int32_t vocab_find(const hf_bpe *b, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    for (uint32_t i = (uint32_t)h & b->vocab_mask;; i = (i + 1) & b->vocab_mask) {
        const vocab_slot *v = &b->vocab[i];
        if (!v->h) return -1;
        if (v->h == h && b->len[v->id] == (int32_t)n && !memcmp(b->bytes + b->off[v->id], s, n)) return v->id;
    }
}

/* Rank of merging (l, r) and the merged id; INT_MAX when no merge applies. */
static inline int32_t merge_find(const hf_bpe *b, int32_t l, int32_t r, int32_t *merged) {
    uint64_t k = pair_key(l, r);
    for (uint32_t i = pair_hash(k) & b->merge_mask;; i = (i + 1) & b->merge_mask) {
        const merge_slot *m = &b->merges[i];
        if (m->key == k) { *merged = m->merged; return m->rank; }
        if (!m->key) return INT_MAX;
    }
}

/* ---- per-thread state: word cache and PCRE2 match data ---- */
typedef struct {
    uint64_t h;
    uint32_t koff, klen, ioff, nids;
} cache_slot;

typedef struct {
    uint64_t serial;
    cache_slot *slots; /* [CACHE_SLOTS] */
    uint32_t used;
    char *kbuf;        /* [CACHE_BYTES] */
    uint32_t kused;
    int32_t *ibuf;     /* [CACHE_BYTES / 4] */
    uint32_t iused;
    pcre2_match_data *md;
    /* scratch */
    char *norm;
    size_t norm_cap;
    int32_t *sym;
    size_t sym_cap;
} thread_state;

static pthread_key_t g_ts_key;
static pthread_once_t g_ts_once = PTHREAD_ONCE_INIT;
static int g_linear_max = 48;

static void ts_free(void *p) {
    thread_state *t = p;
    if (!t) return;
    free(t->slots);
    free(t->kbuf);
    free(t->ibuf);
    if (t->md) pcre2_match_data_free(t->md);
    free(t->norm);
    free(t->sym);
    free(t);
}

static void ts_key_init(void) { pthread_key_create(&g_ts_key, ts_free); }

static void cache_clear(thread_state *t) {
    memset(t->slots, 0, sizeof(cache_slot) * CACHE_SLOTS);
    t->used = t->kused = t->iused = 0;
}

static thread_state *ts_get(const hf_bpe *b) {
    pthread_once(&g_ts_once, ts_key_init);
    thread_state *t = pthread_getspecific(g_ts_key);
    if (!t) {
        t = xcalloc(1, sizeof *t);
        t->slots = xcalloc(CACHE_SLOTS, sizeof(cache_slot));
        t->kbuf = xmalloc(CACHE_BYTES);
        t->ibuf = xmalloc(CACHE_BYTES);
        t->md = pcre2_match_data_create(1, NULL);
        if (!t->md) moerl_fatal("PCRE2: out of memory for match data");
        pthread_setspecific(g_ts_key, t);
    }
    if (t->serial != b->serial) {
        cache_clear(t);
        t->serial = b->serial;
    }
    return t;
}

int hf_bpe_set_linear_max(int n) {
    int old = g_linear_max;
    g_linear_max = n;
    return old;
}

/* ---- BPE of one piece ---- */

/* Quadratic loop for short pieces: sym[0..n) byte ids in, merged ids out; returns the new count.
 * rank[i] is the rank of the pair (sym[i], sym[i+1]). */
static int bpe_linear(const hf_bpe *b, int32_t *sym, int n) {
    int32_t rank[CACHE_MAX_PIECE > 64 ? CACHE_MAX_PIECE : 64], mid[64];
    for (int i = 0; i + 1 < n; i++) rank[i] = merge_find(b, sym[i], sym[i + 1], &mid[i]);
    while (n > 1) {
        int best = -1;
        int32_t br = INT_MAX;
        for (int i = 0; i + 1 < n; i++)
            if (rank[i] < br) { br = rank[i]; best = i; }
        if (best < 0) break;
        sym[best] = mid[best];
        memmove(sym + best + 1, sym + best + 2, sizeof(int32_t) * (size_t)(n - best - 2));
        memmove(rank + best, rank + best + 1, sizeof(int32_t) * (size_t)(n - best - 2));
        memmove(mid + best, mid + best + 1, sizeof(int32_t) * (size_t)(n - best - 2));
        n--;
        if (best > 0) rank[best - 1] = merge_find(b, sym[best - 1], sym[best], &mid[best - 1]);
        if (best + 1 < n) rank[best] = merge_find(b, sym[best], sym[best + 1], &mid[best]);
    }
    return n;
}

typedef struct {
    int32_t rank, pos, merged;
} heap_ent;

static int heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_ent *h, int *n, heap_ent e) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, int *n) {
    heap_ent top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Heap of (rank, position) for long pieces: O(n log n). Same result as bpe_linear: the pair of
 * lowest rank is merged first, the leftmost one among equal ranks (tokenizers' BPE::merge_all). */
static int bpe_heap(const hf_bpe *b, int32_t *sym, int n) {
    int32_t *next = xmalloc(sizeof(int32_t) * (size_t)n * 2), *prev = next + n;
    heap_ent *h = xmalloc(sizeof(heap_ent) * (size_t)n * 2);
    int nh = 0;
    for (int i = 0; i < n; i++) {
        next[i] = i + 1 < n ? i + 1 : -1;
        prev[i] = i - 1;
    }
    for (int i = 0; i + 1 < n; i++) {
        heap_ent e = {0, i, 0};
        e.rank = merge_find(b, sym[i], sym[i + 1], &e.merged);
        if (e.rank != INT_MAX) heap_push(h, &nh, e);
    }
    while (nh > 0) {
        heap_ent e = heap_pop(h, &nh);
        int i = e.pos, j = sym[i] >= 0 ? next[i] : -1;
        if (j < 0) continue; /* left symbol gone, or no right neighbour */
        int32_t m = -1;
        if (merge_find(b, sym[i], sym[j], &m) != e.rank || m != e.merged) continue; /* stale */
        sym[i] = m;
        sym[j] = -1; /* removed */
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        if (prev[i] >= 0) {
            heap_ent f = {0, prev[i], 0};
            f.rank = merge_find(b, sym[prev[i]], sym[i], &f.merged);
            if (f.rank != INT_MAX) heap_push(h, &nh, f);
        }
        if (next[i] >= 0) {
            heap_ent f = {0, i, 0};
            f.rank = merge_find(b, sym[i], sym[next[i]], &f.merged);
            if (f.rank != INT_MAX) heap_push(h, &nh, f);
        }
    }
    int m = 0;
    for (int i = 0; i >= 0 && i < n; i = next[i]) sym[m++] = sym[i];
    free(next);
    free(h);
    return m;
}

static void bpe_piece(const hf_bpe *b, thread_state *t, const char *p, size_t n, tok_seq *out) {
    uint64_t h = 0;
    if (n <= CACHE_MAX_PIECE) {
        h = hash_bytes(p, n);
        for (uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
            const cache_slot *s = &t->slots[i];
            if (!s->h) break;
            if (s->h == h && s->klen == n && !memcmp(t->kbuf + s->koff, p, n)) {
                for (uint32_t k = 0; k < s->nids; k++) tok_seq_push(out, t->ibuf[s->ioff + k]);
                return;
            }
        }
    }
    if (b->ignore_merges) {
        int32_t id = vocab_find(b, p, n);
        if (id >= 0 && !b->special[id]) {
            tok_seq_push(out, id);
            return;
        }
    }
    if (t->sym_cap < n) {
        t->sym_cap = n + 64;
        t->sym = xrealloc(t->sym, sizeof(int32_t) * t->sym_cap);
    }
    int32_t *sym = t->sym;
    for (size_t i = 0; i < n; i++) sym[i] = b->byte_id[(unsigned char)p[i]];
    int m = (int)n <= g_linear_max && n <= 64 ? bpe_linear(b, sym, (int)n) : bpe_heap(b, sym, (int)n);
    for (int k = 0; k < m; k++) tok_seq_push(out, sym[k]);
    if (h) {
        if (t->used * 2 >= CACHE_SLOTS || t->kused + n > CACHE_BYTES || (t->iused + (uint32_t)m) * 4 > CACHE_BYTES)
            cache_clear(t);
        uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
        while (t->slots[i].h) i = (i + 1) & (CACHE_SLOTS - 1);
        cache_slot *s = &t->slots[i];
        s->h = h;
        s->koff = t->kused;
        s->klen = (uint32_t)n;
        s->ioff = t->iused;
        s->nids = (uint32_t)m;
        memcpy(t->kbuf + t->kused, p, n);
        memcpy(t->ibuf + t->iused, sym, sizeof(int32_t) * (size_t)m);
        t->kused += (uint32_t)n;
        t->iused += (uint32_t)m;
        t->used++;
    }
}

/* ---- NFC, only where it can change something ----
 * A code point is "stable" when NFC leaves it alone in any context: canonical combining class 0,
 * not the second part of any canonical composition (nor a Hangul vowel/trailing jamo), and
 * either without a canonical decomposition or its own NFC (precomposed letters such as é). Text
 * splits for NFC before any stable code point, so only each run of unstable code points, with
 * the one code point before it (which it may compose with), goes through utf8proc. */
#define NFC_CP_END 0x30000 /* no canonical decomposition or combining mark at or above this */
static uint8_t *g_nfc_unstable; /* bitmap over [0, NFC_CP_END) */
static pthread_once_t g_nfc_once = PTHREAD_ONCE_INIT;

static void nfc_init(void) {
    uint8_t *u = xcalloc(NFC_CP_END / 8, 1);
#define MARK(cp) (u[(cp) >> 3] |= (uint8_t)(1u << ((cp) & 7)))
    for (int32_t cp = 0; cp < NFC_CP_END; cp++) {
        const utf8proc_property_t *p = utf8proc_get_property(cp);
        if (p->combining_class) MARK(cp);
        if (p->decomp_type == 0 && p->decomp_seqindex != UINT16_MAX) {
            utf8proc_int32_t d[8];
            int lb = 0;
            utf8proc_ssize_t k = utf8proc_decompose_char(cp, d, 8, UTF8PROC_DECOMPOSE, &lb);
            for (utf8proc_ssize_t i = 1; i < k && i < 8; i++)
                if (d[i] >= 0 && d[i] < NFC_CP_END) MARK(d[i]); /* a possible composition second */
            utf8proc_uint8_t one[4], *nf = NULL;
            utf8proc_ssize_t l1 = utf8proc_encode_char(cp, one);
            utf8proc_ssize_t l2 = utf8proc_map(one, l1, &nf, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (l2 != l1 || memcmp(one, nf, (size_t)l1)) MARK(cp); /* singleton or excluded */
            free(nf);
        }
    }
    for (int32_t cp = 0x1161; cp <= 0x1175; cp++) MARK(cp); /* Hangul V and T jamo compose algorithmically */
    for (int32_t cp = 0x11A8; cp <= 0x11C2; cp++) MARK(cp);
#undef MARK
    g_nfc_unstable = u;
}

void bpe_nfc_prepare(void) { pthread_once(&g_nfc_once, nfc_init); }

static inline int nfc_unstable(uint32_t cp) {
    return cp < NFC_CP_END && (g_nfc_unstable[cp >> 3] >> (cp & 7) & 1);
}

/* NFC of valid UTF-8 s[0..n): NULL when it is already NFC, else a heap string (*out_n its length). */
static char *nfc_apply(const char *s, size_t n, size_t *out_n, int *err) {
    char *out = NULL;
    size_t o = 0, copied = 0, prev = 0, i = 0; /* prev: start of the last code point before i */
    *err = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0xCC) { /* below U+0300 (or a continuation byte of a longer one) */
            size_t cl;
            if ((unsigned char)s[i] < 0x80) { prev = i++; continue; }
            (void)utf8_cp((const unsigned char *)s + i, &cl);
            prev = i;
            i += cl;
            continue;
        }
        size_t cl;
        uint32_t cp = utf8_cp((const unsigned char *)s + i, &cl);
        if (!nfc_unstable(cp)) { prev = i; i += cl; continue; }
        /* an unstable run: from the code point before it to the next stable one */
        size_t rs = i > 0 ? prev : 0, re = i + cl;
        while (re < n) {
            size_t c2;
            uint32_t q = utf8_cp((const unsigned char *)s + re, &c2);
            if (!nfc_unstable(q)) break;
            re += c2;
        }
        utf8proc_uint8_t *nf = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + rs, (utf8proc_ssize_t)(re - rs), &nf,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0) {
            free(out);
            *err = (int)r;
            return NULL;
        }
        if (!out) out = xmalloc(n * 3 + 16); /* NFC grows UTF-8 by at most 3x */
        memcpy(out + o, s + copied, rs - copied);
        o += rs - copied;
        memcpy(out + o, nf, (size_t)r);
        o += (size_t)r;
        free(nf);
        copied = re;
        prev = re; /* not used before the next code point sets it */
        i = re;
    }
    if (!out) return NULL;
    memcpy(out + o, s + copied, n - copied);
    o += n - copied;
    *out_n = o;
    return out;
}

/* ---- one text span between added tokens: UTF-8 repair, NFC, split, BPE ---- */

/* Step 1: each maximal ill-formed subpart of s[0..n) becomes U+FFFD. Returns a heap copy with the
 * replacements (*fn its length), or NULL when s is well-formed UTF-8. *maybe_not_nfc is set when
 * NFC could change something (a code point at or above U+0300, or a replacement). */
static char *repair_utf8(const char *s, size_t n, size_t *fn_out, int *maybe_not_nfc) {
    char *fixed = NULL;
    size_t fn = 0, i = 0;
    *maybe_not_nfc = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xCC) *maybe_not_nfc = 1; /* every code point below U+0300 is NFC-stable */
        size_t bad = 0, k = utf8_seq((const unsigned char *)s + i, n - i, &bad);
        if (k) { i += k; continue; }
        if (!fixed) {
            fixed = xmalloc(n * 3 + 4);
            memcpy(fixed, s, i);
            fn = i;
        }
        memcpy(fixed + fn, "\xEF\xBF\xBD", 3);
        fn += 3;
        *maybe_not_nfc = 1;
        i += bad;
        /* copy the valid run that follows in the loop below */
        while (i < n) {
            unsigned char d = (unsigned char)s[i];
            size_t bad2 = 0, k2 = d < 0x80 ? 1 : utf8_seq((const unsigned char *)s + i, n - i, &bad2);
            if (!k2) break;
            memcpy(fixed + fn, s + i, k2);
            fn += k2;
            i += k2;
        }
    }
    *fn_out = fn;
    return fixed;
}

/* Step 3: split txt[0..tn) with the pre-tokenizer regex (every match and every gap is a piece)
 * and BPE each piece into out. */
static int split_and_merge(const hf_bpe *b, thread_state *t, const char *txt, size_t tn, tok_seq *out) {
    size_t off = 0;
    while (off < tn) {
        int m = b->jit ? pcre2_jit_match(b->re, (PCRE2_SPTR)txt, tn, off, 0, t->md, NULL)
                       : PCRE2_ERROR_JIT_BADOPTION;
        if (m < 0 && m != PCRE2_ERROR_NOMATCH) /* JIT stack exhausted (or no JIT): the interpreter */
            m = pcre2_match(b->re, (PCRE2_SPTR)txt, tn, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, t->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH) {
            bpe_piece(b, t, txt + off, tn - off, out);
            break;
        }
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return moerl_errorf("pre-tokenizer regex failed at byte %zu of a %zu-byte text: %s", off, tn, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > off) bpe_piece(b, t, txt + off, ms - off, out);
        if (me == ms) { /* an empty match (possible with a custom pattern): step one character */
            size_t cl = 1;
            if (me < tn) (void)utf8_cp((const unsigned char *)txt + me, &cl);
            if (me + cl > tn) cl = tn - me;
            bpe_piece(b, t, txt + me, cl, out);
            off = me + cl;
            continue;
        }
        bpe_piece(b, t, txt + ms, me - ms, out);
        off = me;
    }
    return MOERL_OK;
}

static int encode_span(const hf_bpe *b, thread_state *t, const char *s, size_t n, tok_seq *out) {
    if (n == 0) return MOERL_OK;
    /* 1. invalid UTF-8 → U+FFFD per maximal subpart; note whether NFC can change anything */
    size_t fn = 0;
    int maybe_not_nfc = 0;
    char *fixed = repair_utf8(s, n, &fn, &maybe_not_nfc);
    const char *txt = fixed ? fixed : s;
    size_t tn = fixed ? fn : n;
    /* 2. NFC */
    char *nfc = NULL;
    if (b->nfc && maybe_not_nfc) {
        size_t nn;
        int err;
        nfc = nfc_apply(txt, tn, &nn, &err);
        if (err) {
            free(fixed);
            return moerl_errorf("NFC normalization failed: %s", utf8proc_errmsg(err));
        }
        if (nfc) {
            txt = nfc;
            tn = nn;
        }
    }
    /* 3. split: every match and every gap is a piece */
    int rc = split_and_merge(b, t, txt, tn, out);
    free(fixed);
    free(nfc);
    return rc;
}

int hf_bpe_encode(const hf_bpe *b, const char *text, size_t len, bool allow_special, const uint8_t *special_ok,
                  tok_seq *out) {
    thread_state *t = ts_get(b);
    size_t seg = 0, i = 0;
    while (i < len) {
        int c = b->first[(unsigned char)text[i]];
        int hit = -1;
        for (; c >= 0; c = b->added[c].next) {
            const added_tok *a = &b->added[c];
            if (a->len > len - i || memcmp(text + i, a->text, a->len)) continue;
            if (a->special && !(special_ok ? special_ok[i] : allow_special)) continue;
            hit = c;
            break;
        }
        if (hit < 0) {
            i++;
            continue;
        }
        if (encode_span(b, t, text + seg, i - seg, out) != MOERL_OK) return MOERL_ERR;
        tok_seq_push(out, b->added[hit].id);
        i += b->added[hit].len;
        seg = i;
    }
    return encode_span(b, t, text + seg, len - seg, out);
}

const char *hf_bpe_piece(const hf_bpe *b, int32_t id, size_t *len) {
    if (id < 0 || id >= b->n_ids || b->len[id] < 0) return NULL;
    *len = (size_t)b->len[id];
    return b->bytes + b->off[id];
}

int hf_bpe_is_special(const hf_bpe *b, int32_t id) { return id >= 0 && id < b->n_ids && b->special[id]; }

int32_t hf_bpe_token_id(const hf_bpe *b, const char *text, size_t len) { return vocab_find(b, text, len); }

int32_t hf_bpe_vocab_size(const hf_bpe *b) { return b->n_ids; }
