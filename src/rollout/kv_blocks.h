/* The paged KV cache's block manager (vLLM's KV cache manager / block pool; issue 28): which block
 * of the pool is free, who references it, and the prefix cache that lets requests share full
 * blocks. It holds no K/V itself (the engine's pool does, [layer][block][block_size][nkv·hd]).
 *
 * Every block has a reference count. A block whose count drops to zero goes back to the free list:
 * at its head when it holds nothing reusable (taken first), at its tail when it is a cached block
 * (evicted last, least recently released first: an LRU of free cached blocks, vLLM's policy).
 * Allocation takes the head; taking a cached block evicts it from the prefix cache.
 *
 * Prefix cache: a full block is keyed by (its parent block and that block's generation, the policy
 * version, its block_size token ids): the parent chain makes the key name the whole prefix, the
 * generation (bumped at every registration) makes a key dead once its parent was evicted and reused,
 * and the version keeps KV computed under other weights from ever matching. Lookups compare the
 * whole key (a 64-bit hash only picks the bucket), so a match is exact. A registered block is
 * "filled" once its K/V rows are computed; an unfilled one (registered by the sequence computing it)
 * tells a request with the same prefix to wait for it rather than compute it again. */
#ifndef MOERL_KV_BLOCKS_H
#define MOERL_KV_BLOCKS_H

#include <stdint.h>

typedef struct {
    int n_blocks, bs;
    int *ref;             /* [n_blocks] reference counts */
    int *prv, *nxt;       /* free list links (−1 ends) */
    int head, tail, n_free;
    /* prefix cache */
    int *tokens;          /* [n_blocks][bs] token ids of a registered block */
    int *parent, *parent_gen, *gen, *ver;
    unsigned char *reg, *filled;
    uint64_t *hash;
    int *hnext, *bucket, n_buckets;
} kv_blocks;

/* n_blocks blocks of bs tokens, all free. Errors: n_blocks or bs < 1 (asserted by the caller). */
void kvb_init(kv_blocks *k, int n_blocks, int bs);
void kvb_free(kv_blocks *k);
/* A free block with reference count 1 (a cached one is evicted), or −1 when none is free. */
int kvb_alloc(kv_blocks *k);
/* One more reference to block b (a cache hit: a free cached block leaves the free list). */
void kvb_ref(kv_blocks *k, int b);
/* Drop one reference; at zero the block is freed (kept in the cache when filled, else unregistered). */
void kvb_release(kv_blocks *k, int b);
/* The registered block with this key (parent −1 for a sequence's first block), or −1. */
int kvb_lookup(const kv_blocks *k, int parent, int version, const int *tokens);
/* Register held block b under this key (its generation is bumped); filled: its rows are computed. */
void kvb_register(kv_blocks *k, int b, int parent, int version, const int *tokens, int filled);
/* Forget every key (a weight swap: no KV computed under the old weights is reused). */
void kvb_clear(kv_blocks *k);

/* The engine's block arithmetic, in one place for the engine (src/rollout/engine.c) and moerl plan
 * (src/plan/plan_kv.c), so that plan counts exactly what the engine allocates.
 *
 * kvb_seq_blocks: blocks of bs positions a sequence of len tokens (prompt ⊕ output, len ≥ 1) holds at
 * its longest, ⌈(len − 1)/bs⌉: the last sampled token is never forwarded, so its K/V is never written.
 * kvb_prefix_blocks: full blocks of a sequence of len tokens that it can take from the prefix cache,
 * ⌊(len − 1)/bs⌋: never the block of its last token, which is forwarded again to sample from (for a
 * P-token prompt, the blocks a GRPO group's samples share). Both return 0 for len ≤ 1; bs ≥ 1. */
int64_t kvb_seq_blocks(int64_t len, int bs);
int64_t kvb_prefix_blocks(int64_t len, int bs);

#endif
