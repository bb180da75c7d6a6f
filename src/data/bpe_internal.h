/* moerl — internals shared by the byte-level BPE's encoder (bpe.c), loader (bpe_load.c) and split
 * regex (bpe_regex.c): the loaded tokenizer's tables and the small hashing and UTF-8 helpers. Not part of the
 * public API (data/bpe.h). */
#ifndef MOERL_BPE_INTERNAL_H
#define MOERL_BPE_INTERNAL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "data/bpe.h"

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

/* Length of the well-formed UTF-8 sequence at s (Unicode Table 3-7), or 0 with *bad set to the
 * length of its maximal ill-formed subpart (≥ 1), which becomes one U+FFFD. */
static inline size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
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
static inline uint32_t utf8_cp(const unsigned char *s, size_t *n) {
    unsigned c = s[0];
    if (c < 0x80) { *n = 1; return c; }
    if (c < 0xE0) { *n = 2; return (c & 31u) << 6 | (s[1] & 63u); }
    if (c < 0xF0) { *n = 3; return (c & 15u) << 12 | (s[1] & 63u) << 6 | (s[2] & 63u); }
    *n = 4;
    return (c & 7u) << 18 | (s[1] & 63u) << 12 | (s[2] & 63u) << 6 | (s[3] & 63u);
}

/* FNV-1a-style 64-bit hash of s[0..n) with a final mix (its start value is not FNV's published
 * offset basis; only the spread matters for these tables); never 0 (the empty-slot mark). */
static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    h ^= h >> 29;
    return h | 1; /* never 0 (the empty-slot mark) */
}

/* The key of the merge pair (l, r) in hf_bpe.merges, and its slot hash. */
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

/* Prepare the NFC stability table (once per process, thread-safe); the loader calls it for a
 * tokenizer whose normalizer is NFC, before any encode. */
void bpe_nfc_prepare(void);

/* Compile the pre-tokenizer's split pattern (Oniguruma syntax) into b->re with PCRE2 (UTF + UCP,
 * JIT when available: b->jit). \s and \S are first spelt out as Oniguruma's White_Space set, which
 * PCRE2's UCP \s does not match exactly (bpe_regex.c). `name` (the file) starts the messages.
 * Errors: \Q...\E quoting, \S inside a class, a pattern PCRE2 cannot compile (with its offset
 * and message). */
int bpe_compile_pattern(hf_bpe *b, const char *pattern, const char *name);

#endif
