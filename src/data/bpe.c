/* moerl — Hugging Face tokenizer.json byte-level BPE (see bpe.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bpe.h"

#include <jansson.h>
#include <limits.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <utf8proc.h>

#include "base/common.h"

/* The GPT-2 split pattern, which ByteLevel applies itself when "use_regex" is true
 * (tokenizers/src/pre_tokenizers/byte_level.rs). */
static const char k_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define CACHE_MAX_PIECE 64       /* pieces up to this many bytes go through the word cache */
#define CACHE_SLOTS (1u << 17)   /* per thread; cleared when half full */
#define CACHE_BYTES (1u << 22)   /* key + id storage per thread before a clear */

typedef struct {
    uint64_t key;  /* (left id << 32) | right id; 0 = empty slot (id pair (0,0) is stored as key ^ 1<<63) */
    int32_t rank, merged;
} merge_slot;

typedef struct {
    uint64_t h;    /* 0 = empty */
    int32_t id;
} vocab_slot;

typedef struct {
    char *text;
    size_t len;
    int32_t id;
    int special;
    int next; /* next candidate with the same first byte, longest first; -1 ends */
} added_tok;

struct hf_bpe {
    uint64_t serial;       /* distinguishes this tokenizer in the per-thread caches */
    int32_t n_ids;         /* one past the largest id */
    /* token bytes, by id */
    char *bytes;
    size_t *off;           /* [n_ids] */
    int32_t *len;          /* [n_ids], -1 = undefined id */
    uint8_t *special;      /* [n_ids] */
    /* bytes → id (vocab and added tokens) */
    vocab_slot *vocab;
    uint32_t vocab_mask;
    /* (left, right) → rank, merged id */
    merge_slot *merges;
    uint32_t merge_mask;
    int32_t byte_id[256];  /* vocab id of each byte's byte-level character */
    int ignore_merges;
    int nfc;
    added_tok *added;
    int n_added;
    int first[256];        /* first candidate for each first byte, -1 = none */
    pcre2_code *re;
    int jit;
};

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

/* Length of the well-formed UTF-8 sequence at s (Unicode Table 3-7), or 0 with *bad set to the
 * length of its maximal ill-formed subpart (≥ 1), which becomes one U+FFFD. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    int need;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else { *bad = 1; return 0; }
    size_t i = 1;
    for (int k = 0; k < need; k++, i++) {
        if (i >= n || s[i] < lo || s[i] > hi) { *bad = i; return 0; }
        lo = 0x80;
        hi = 0xBF;
    }
    return i;
}

/* Decode one code point of well-formed UTF-8 at s; *n gets its length. */
static uint32_t utf8_cp(const unsigned char *s, size_t *n) {
    unsigned c = s[0];
    if (c < 0x80) { *n = 1; return c; }
    if (c < 0xE0) { *n = 2; return (c & 31u) << 6 | (s[1] & 63u); }
    if (c < 0xF0) { *n = 3; return (c & 15u) << 12 | (s[1] & 63u) << 6 | (s[2] & 63u); }
    *n = 4;
    return (c & 7u) << 18 | (s[1] & 63u) << 12 | (s[2] & 63u) << 6 | (s[3] & 63u);
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    h ^= h >> 29;
    return h | 1; /* never 0 (the empty-slot mark) */
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

/* ---- lookups ---- */
static int32_t vocab_find(const hf_bpe *b, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    for (uint32_t i = (uint32_t)h & b->vocab_mask;; i = (i + 1) & b->vocab_mask) {
        const vocab_slot *v = &b->vocab[i];
        if (!v->h) return -1;
        if (v->h == h && b->len[v->id] == (int32_t)n && !memcmp(b->bytes + b->off[v->id], s, n)) return v->id;
    }
}

static void vocab_insert(hf_bpe *b, int32_t id) {
    uint64_t h = hash_bytes(b->bytes + b->off[id], (size_t)b->len[id]);
    uint32_t i = (uint32_t)h & b->vocab_mask;
    while (b->vocab[i].h) i = (i + 1) & b->vocab_mask;
    b->vocab[i].h = h;
    b->vocab[i].id = id;
}

static inline uint64_t pair_key(int32_t l, int32_t r) {
    uint64_t k = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    return k ? k : 1ULL << 63;
}

static inline uint32_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k;
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
static atomic_uint_fast64_t g_serial = 1;
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
static int encode_span(const hf_bpe *b, thread_state *t, const char *s, size_t n, tok_seq *out) {
    if (n == 0) return MOERL_OK;
    /* 1. invalid UTF-8 → U+FFFD per maximal subpart; note whether NFC can change anything */
    char *fixed = NULL;
    size_t fn = 0, i = 0;
    int maybe_not_nfc = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xCC) maybe_not_nfc = 1; /* every code point below U+0300 is NFC-stable */
        size_t bad = 0, k = utf8_seq((const unsigned char *)s + i, n - i, &bad);
        if (k) { i += k; continue; }
        if (!fixed) {
            fixed = xmalloc(n * 3 + 4);
            memcpy(fixed, s, i);
            fn = i;
        }
        memcpy(fixed + fn, "\xEF\xBF\xBD", 3);
        fn += 3;
        maybe_not_nfc = 1;
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
    int rc = MOERL_OK;
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
            rc = moerl_errorf("pre-tokenizer regex failed at byte %zu of a %zu-byte text: %s", off, tn, (char *)msg);
            break;
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

/* Hugging Face's `tokenizers` runs the split regex with Oniguruma, whose Unicode \s is the
 * White_Space property (tab..CR, space, U+0085, and the Z categories); PCRE2's UCP \s adds U+180E
 * (MONGOLIAN VOWEL SEPARATOR, a format character since Unicode 6.3). So \s is spelt out as that
 * set: inside a class as its members, outside as a class, and \S outside a class as the negated
 * class. Returns a heap pattern, or NULL (error set) for what this rewrite does not handle. */
#define WS_SET "\\t-\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
static char *oniguruma_ws(const char *pat, const char *name) {
    size_t n = strlen(pat), o = 0;
    char *out = xmalloc(n * 64 + 1);
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char d = pat[++i];
            if (d == 'Q') {
                free(out);
                moerl_errorf("%s: pre_tokenizer regex: \\Q...\\E quoting is not supported", name);
                return NULL;
            }
            if (d == 's' || (d == 'S' && !in_class)) {
                const char *rep = in_class ? WS_SET : d == 's' ? "[" WS_SET "]" : "[^" WS_SET "]";
                memcpy(out + o, rep, strlen(rep));
                o += strlen(rep);
                continue;
            }
            if (d == 'S') {
                free(out);
                moerl_errorf("%s: pre_tokenizer regex: \\S inside a character class is not supported", name);
                return NULL;
            }
            out[o++] = c;
            out[o++] = d;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            out[o++] = c;
            if (i + 1 < n && pat[i + 1] == '^') out[o++] = pat[++i];
            if (i + 1 < n && pat[i + 1] == ']') out[o++] = pat[++i]; /* a leading ] is a member */
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') { /* [:alpha:] */
            const char *e = strstr(pat + i + 2, ":]");
            size_t k = e ? (size_t)(e - (pat + i)) + 2 : 1;
            memcpy(out + o, pat + i, k);
            o += k;
            i += k - 1;
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

#define LOAD_ERR(...) do { moerl_errorf(__VA_ARGS__); goto fail; } while (0)

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
        pthread_once(&g_nfc_once, nfc_init);
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
            pthread_once(&g_nfc_once, nfc_init);
        }
        return MOERL_OK;
    }
    return moerl_errorf("%s: normalizer type %s is not supported (moerl supports none or NFC)", name,
                        ty ? ty : jtype(nz));
}

hf_bpe *hf_bpe_load(const char *text, size_t tlen, const char *name) {
    json_error_t je;
    json_t *root = json_loadb(text, tlen, JSON_ALLOW_NUL, &je);
    hf_bpe *b = xcalloc(1, sizeof *b);
    b->serial = atomic_fetch_add(&g_serial, 1);
    char *scratch = NULL;
    if (!root) LOAD_ERR("%s: not valid JSON (line %d: %s)", name, je.line, je.text);
    if (!json_is_object(root)) LOAD_ERR("%s: expected a JSON object at the top", name);
    const json_t *model = json_object_get(root, "model");
    const char *mty = ctype(model);
    if (!json_is_object(model)) LOAD_ERR("%s: model: expected an object, got %s", name, jtype(model));
    if (mty && strcmp(mty, "BPE"))
        LOAD_ERR("%s: model.type %s is not supported (moerl supports byte-level BPE)", name, mty);
    {
        const json_t *d = json_object_get(model, "dropout");
        if (d && !json_is_null(d) && !(json_is_number(d) && json_number_value(d) == 0))
            LOAD_ERR("%s: model.dropout %g is not supported (BPE dropout is for training)", name, json_number_value(d));
        int bf, im;
        if (jbool(model, "byte_fallback", 0, &bf) || bf) LOAD_ERR("%s: model.byte_fallback true is not supported", name);
        if (jbool(model, "ignore_merges", 0, &im)) LOAD_ERR("%s: model.ignore_merges: expected true/false", name);
        b->ignore_merges = im;
        const char *strs[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
        for (int k = 0; k < 2; k++) {
            const json_t *x = json_object_get(model, strs[k]);
            if (x && !json_is_null(x) && !(json_is_string(x) && !json_string_length(x)))
                LOAD_ERR("%s: model.%s %s is not supported (byte-level BPE has none)", name, strs[k],
                         json_is_string(x) ? json_string_value(x) : jtype(x));
        }
    }
    /* components */
    if (check_normalizer(b, json_object_get(root, "normalizer"), name) != MOERL_OK) goto fail;
    const char *pattern = NULL;
    if (check_pretok(b, json_object_get(root, "pre_tokenizer"), name, &pattern) != MOERL_OK) goto fail;
    {
        const char *keys[2] = {"decoder", "post_processor"};
        for (int k = 0; k < 2; k++) {
            const json_t *x = json_object_get(root, keys[k]);
            if (!x || json_is_null(x)) continue;
            const char *ty = ctype(x);
            if (!ty || strcmp(ty, "ByteLevel"))
                LOAD_ERR("%s: %s type %s is not supported (moerl supports null or ByteLevel)", name, keys[k],
                         ty ? ty : jtype(x));
        }
        const char *nulls[2] = {"truncation", "padding"};
        for (int k = 0; k < 2; k++) {
            const json_t *x = json_object_get(root, nulls[k]);
            if (x && !json_is_null(x))
                LOAD_ERR("%s: %s is set; moerl does not truncate or pad inside the tokenizer (set it to null)", name,
                         nulls[k]);
        }
    }
    /* ids */
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) LOAD_ERR("%s: model.vocab: expected an object {token: id}, got %s", name, jtype(vocab));
    if (added && !json_is_null(added) && !json_is_array(added))
        LOAD_ERR("%s: added_tokens: expected a list, got %s", name, jtype(added));
    int64_t max_id = -1;
    size_t total_bytes = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= (1 << 30))
            LOAD_ERR("%s: model.vocab[\"%.40s\"]: expected an id in [0, 2^30), got %s", name, key, jtype(val));
        max_id = MOERL_MAX(max_id, json_integer_value(val));
        total_bytes += strlen(key);
    }
    size_t n_added = added ? json_array_size(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *id = json_object_get(a, "id"), *ct = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 30) ||
            !json_is_string(ct) || !json_string_length(ct))
            LOAD_ERR("%s: added_tokens[%zu]: expected {\"id\": id ≥ 0, \"content\": non-empty string, ...}", name, i);
        max_id = MOERL_MAX(max_id, json_integer_value(id));
        total_bytes += json_string_length(ct);
    }
    if (max_id < 0) LOAD_ERR("%s: model.vocab is empty", name);
    b->n_ids = (int32_t)(max_id + 1);
    b->bytes = xmalloc(total_bytes + 1);
    b->off = xcalloc((size_t)b->n_ids, sizeof(size_t));
    b->len = xmalloc(sizeof(int32_t) * (size_t)b->n_ids);
    b->special = xcalloc((size_t)b->n_ids, 1);
    for (int32_t i = 0; i < b->n_ids; i++) b->len[i] = -1;
    size_t used = 0;
    json_object_foreach((json_t *)vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (b->len[id] >= 0) LOAD_ERR("%s: model.vocab: id %d is given to two tokens", name, id);
        size_t k = bytelevel_decode(key, strlen(key), b->bytes + used);
        b->off[id] = used;
        b->len[id] = (int32_t)k;
        used += k;
    }
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
            LOAD_ERR("%s: added_tokens[%zu] (%s): special/lstrip/rstrip/single_word/normalized must be true or false",
                     name, i, t->text);
        if (ls || rs || sw)
            LOAD_ERR("%s: added_tokens[%zu] (%s): %s true is not supported", name, i, t->text,
                     ls ? "lstrip" : rs ? "rstrip" : "single_word");
        if (nz && b->nfc)
            LOAD_ERR("%s: added_tokens[%zu] (%s): normalized true with a normalizer is not supported", name, i,
                     t->text);
        t->special = sp;
        b->special[t->id] = (uint8_t)sp;
        /* the added token's own text is what it decodes to (it replaces a vocab entry of that id) */
        memcpy(b->bytes + used, t->text, t->len);
        b->off[t->id] = used;
        b->len[t->id] = (int32_t)t->len;
        used += t->len;
    }
    /* candidates per first byte, longest first (leftmost-longest matching) */
    for (int i = 0; i < b->n_added; i++) {
        int c = (unsigned char)b->added[i].text[0], *pp = &b->first[c];
        while (*pp >= 0 && b->added[*pp].len >= b->added[i].len) pp = &b->added[*pp].next;
        b->added[i].next = *pp;
        *pp = i;
    }
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
        if (id < 0) LOAD_ERR("%s: model.vocab has no token for byte 0x%02X (byte-level character U+%04X)", name, c,
                             (unsigned)byte_cp(c));
        b->byte_id[c] = id;
    }
    /* merges */
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) LOAD_ERR("%s: model.merges: expected a list, got %s", name, jtype(merges));
    size_t nm = json_array_size(merges);
    b->merge_mask = pow2_at_least((uint64_t)nm * 2 + 16) - 1;
    b->merges = xcalloc((size_t)b->merge_mask + 1, sizeof(merge_slot));
    size_t scap = 256;
    scratch = xmalloc(scap);
    for (size_t r = 0; r < nm; r++) {
        const json_t *m = json_array_get(merges, r);
        const char *l, *rr;
        size_t ll, rl;
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                LOAD_ERR("%s: model.merges[%zu] \"%.60s\": expected two tokens separated by one space", name, r, s);
            l = s;
            ll = (size_t)(sp - s);
            rr = sp + 1;
            rl = strlen(rr);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            l = json_string_value(json_array_get(m, 0));
            ll = json_string_length(json_array_get(m, 0));
            rr = json_string_value(json_array_get(m, 1));
            rl = json_string_length(json_array_get(m, 1));
        } else {
            LOAD_ERR("%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"], got %s", name, r, jtype(m));
        }
        if (ll + rl + 1 > scap) {
            scap = 2 * (ll + rl + 1);
            scratch = xrealloc(scratch, scap);
        }
        memcpy(scratch, l, ll);
        memcpy(scratch + ll, rr, rl);
        json_t *a = json_object_getn(vocab, l, ll), *c = json_object_getn(vocab, rr, rl),
               *ab = json_object_getn(vocab, scratch, ll + rl);
        if (!a || !c || !ab)
            LOAD_ERR("%s: model.merges[%zu] (\"%.*s\" + \"%.*s\"): %s is not in model.vocab", name, r, (int)ll, l,
                     (int)rl, rr, !a ? "the left token" : !c ? "the right token" : "the merged token");
        uint64_t k = pair_key((int32_t)json_integer_value(a), (int32_t)json_integer_value(c));
        uint32_t i = pair_hash(k) & b->merge_mask;
        while (b->merges[i].key && b->merges[i].key != k) i = (i + 1) & b->merge_mask;
        if (b->merges[i].key) continue; /* a repeated merge keeps its first (lowest) rank */
        b->merges[i].key = k;
        b->merges[i].rank = (int32_t)r;
        b->merges[i].merged = (int32_t)json_integer_value(ab);
    }
    /* regex */
    {
        int err;
        PCRE2_SIZE eoff;
        char *pat = oniguruma_ws(pattern, name);
        if (!pat) goto fail;
        b->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
        free(pat);
        if (!b->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            LOAD_ERR("%s: pre_tokenizer regex does not compile with PCRE2 (offset %zu after spelling out \\s): %s",
                     name, (size_t)eoff, (char *)msg);
        }
        b->jit = pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE) == 0;
    }
    free(scratch);
    json_decref(root);
    return b;
fail:
    free(scratch);
    json_decref(root);
    hf_bpe_free(b);
    return NULL;
}
