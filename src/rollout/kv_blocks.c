/* Block manager of the paged KV cache (contract: kv_blocks.h). */
#include "rollout/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

void kvb_init(kv_blocks *k, int n_blocks, int bs) {
    memset(k, 0, sizeof *k);
    k->n_blocks = n_blocks;
    k->bs = bs;
    const size_t n = (size_t)n_blocks;
    k->ref = xcalloc(n, sizeof(int));
    k->prv = xmalloc(n * sizeof(int));
    k->nxt = xmalloc(n * sizeof(int));
    k->tokens = xmalloc(n * (size_t)bs * sizeof(int));
    k->parent = xcalloc(n, sizeof(int));
    k->parent_gen = xcalloc(n, sizeof(int));
    k->gen = xcalloc(n, sizeof(int));
    k->ver = xcalloc(n, sizeof(int));
    k->reg = xcalloc(n, 1);
    k->filled = xcalloc(n, 1);
    k->hash = xcalloc(n, sizeof(uint64_t));
    k->hnext = xmalloc(n * sizeof(int));
    k->n_buckets = 1;
    while (k->n_buckets < 2 * n_blocks) k->n_buckets *= 2;
    k->bucket = xmalloc((size_t)k->n_buckets * sizeof(int));
    for (int i = 0; i < k->n_buckets; i++) k->bucket[i] = -1;
    for (int b = 0; b < n_blocks; b++) {
        k->prv[b] = b - 1;
        k->nxt[b] = b + 1 < n_blocks ? b + 1 : -1;
    }
    k->head = 0;
    k->tail = n_blocks - 1;
    k->n_free = n_blocks;
}

void kvb_free(kv_blocks *k) {
    void *p[] = {k->ref, k->prv, k->nxt, k->tokens, k->parent, k->parent_gen, k->gen, k->ver, k->reg, k->filled,
                 k->hash, k->hnext, k->bucket};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    memset(k, 0, sizeof *k);
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 31);
}

static uint64_t key_hash(const kv_blocks *k, int parent, int pgen, int version, const int *tokens) {
    uint64_t h = mix(mix(mix(0x84222325CBF29CE4ULL, (uint64_t)(int64_t)parent), (uint64_t)pgen), (uint64_t)version);
    for (int i = 0; i < k->bs; i++) h = mix(h, (uint64_t)(uint32_t)tokens[i]);
    return h;
}

static void unlink_free(kv_blocks *k, int b) {
    if (k->prv[b] >= 0) k->nxt[k->prv[b]] = k->nxt[b];
    else k->head = k->nxt[b];
    if (k->nxt[b] >= 0) k->prv[k->nxt[b]] = k->prv[b];
    else k->tail = k->prv[b];
    k->n_free--;
}

static void unregister(kv_blocks *k, int b) {
    if (!k->reg[b]) return;
    int *p = &k->bucket[k->hash[b] & (uint64_t)(k->n_buckets - 1)];
    while (*p != b) p = &k->hnext[*p];
    *p = k->hnext[b];
    k->reg[b] = k->filled[b] = 0;
}

int kvb_alloc(kv_blocks *k) {
    const int b = k->head;
    if (b < 0) return -1;
    unlink_free(k, b);
    unregister(k, b); /* evicting a cached block */
    k->ref[b] = 1;
    return b;
}

void kvb_ref(kv_blocks *k, int b) {
    if (k->ref[b]++ == 0) unlink_free(k, b);
}

void kvb_release(kv_blocks *k, int b) {
    MOERL_ASSERT(k->ref[b] > 0);
    if (--k->ref[b] > 0) return;
    if (k->reg[b] && !k->filled[b]) unregister(k, b); /* its rows were never all computed */
    if (k->reg[b]) { /* tail: evicted last */
        k->prv[b] = k->tail;
        k->nxt[b] = -1;
        if (k->tail >= 0) k->nxt[k->tail] = b;
        else k->head = b;
        k->tail = b;
    } else { /* head: taken first */
        k->nxt[b] = k->head;
        k->prv[b] = -1;
        if (k->head >= 0) k->prv[k->head] = b;
        else k->tail = b;
        k->head = b;
    }
    k->n_free++;
}

int kvb_lookup(const kv_blocks *k, int parent, int version, const int *tokens) {
    const int pgen = parent >= 0 ? k->gen[parent] : 0;
    if (parent >= 0 && !k->reg[parent]) return -1;
    const uint64_t h = key_hash(k, parent, pgen, version, tokens);
    for (int b = k->bucket[h & (uint64_t)(k->n_buckets - 1)]; b >= 0; b = k->hnext[b])
        if (k->hash[b] == h && k->parent[b] == parent && k->parent_gen[b] == pgen && k->ver[b] == version &&
            !memcmp(k->tokens + (size_t)b * k->bs, tokens, (size_t)k->bs * sizeof(int)))
            return b;
    return -1;
}

void kvb_register(kv_blocks *k, int b, int parent, int version, const int *tokens, int filled) {
    unregister(k, b);
    k->gen[b]++;
    k->parent[b] = parent;
    k->parent_gen[b] = parent >= 0 ? k->gen[parent] : 0;
    k->ver[b] = version;
    memcpy(k->tokens + (size_t)b * k->bs, tokens, (size_t)k->bs * sizeof(int));
    k->hash[b] = key_hash(k, parent, k->parent_gen[b], version, tokens);
    int *bk = &k->bucket[k->hash[b] & (uint64_t)(k->n_buckets - 1)];
    k->hnext[b] = *bk;
    *bk = b;
    k->reg[b] = 1;
    k->filled[b] = (unsigned char)(filled != 0);
}

void kvb_clear(kv_blocks *k) {
    for (int b = 0; b < k->n_blocks; b++) k->reg[b] = k->filled[b] = 0;
    for (int i = 0; i < k->n_buckets; i++) k->bucket[i] = -1;
}

int64_t kvb_seq_blocks(int64_t len, int bs) { return len <= 1 ? 0 : (len - 1 + bs - 1) / bs; }

int64_t kvb_prefix_blocks(int64_t len, int bs) { return len <= 1 ? 0 : (len - 1) / bs; }
