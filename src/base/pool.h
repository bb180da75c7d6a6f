/* moerl — memory pool for large, long-lived buffers, and the job-wide buffer allocator switch.
 *
 * Two layers:
 *
 * 1. moerl_pool: a binary buddy allocator (Knuth, TAOCP vol. 1, §2.5 "Dynamic storage allocation",
 *    the buddy system: blocks of 2^k units, a block of order k splits into two buddies of order
 *    k−1 whose addresses differ only in bit k, and a freed block merges with its buddy while the
 *    buddy is free and of the same order). Blocks run from min_block (4 MiB default) to max_block
 *    (2 GiB default), as in the 8×A100 practice of docs/benchmarks.md ("memory pool: 30% reserved
 *    buffer, buddy allocator with 4 MB minimum and 2 GB maximum blocks"; their fragmentation
 *    went 15% → 3.2%).
 *
 *    Expandable segment: the pool reserves its whole virtual address range once (mmap PROT_NONE,
 *    MAP_NORESERVE: no memory, no commit charge) and commits min_block units with mprotect when
 *    a block handed out covers them, so it grows in place and never needs a second, larger copy
 *    (the practice: 45 → 40 GB per device). Units of freed blocks stay committed as long as the
 *    free committed memory is at most reserve_frac × peak bytes in use (30% default: headroom
 *    kept for bursts); beyond that they are decommitted (madvise MADV_DONTNEED + PROT_NONE).
 *
 *    Errors (no fallback inside the pool): a request above max_block, or one no free block can
 *    serve (the reservation is exhausted), returns NULL with a moerl_errorf message naming the
 *    size and the limit, and counts a failure. The buffer layer below documents its fallback.
 *
 * 2. moerl_buf_alloc / moerl_buf_free: where moerl's large long-lived buffers come from (the
 *    activation arena, the engine's KV cache, the gradient reducer's compression buffers and
 *    residual). The environment variable MOERL_ALLOC picks the allocator for the whole process:
 *      malloc   (default) glibc aligned_alloc + zero fill — exactly xalloc_aligned;
 *      pool     the buddy pool above (one per process, created on first use);
 *      jemalloc Debian's libjemalloc, mallocx/dallocx; needs a build that found jemalloc/jemalloc.h
 *               (Makefile prints "jemalloc found"). The library needs more static TLS than glibc
 *               leaves for loading it after start, so start the process one of two ways:
 *                 LD_PRELOAD=libjemalloc.so.2 MOERL_ALLOC=jemalloc moerl ...
 *                   jemalloc is loaded at exec and also replaces glibc's malloc for the whole process
 *                   (Debian builds it without a symbol prefix);
 *                 GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 MOERL_ALLOC=jemalloc moerl ...
 *                   moerl loads it with dlopen(RTLD_LOCAL) on first use and only the buffers use it;
 *                   the rest of the process keeps glibc's malloc.
 *               Without either, the first buffer allocation stops the process with a message naming
 *               both (the process is never re-executed behind the user's back).
 *    Pool settings: MOERL_POOL_MIN_BLOCK, MOERL_POOL_MAX_BLOCK, MOERL_POOL_CAPACITY (bytes, with an
 *    optional K/M/G suffix, powers of 1024; capacity default = physical RAM), MOERL_POOL_RESERVE
 *    (fraction in [0, 1]). Bad values stop the process with a message naming the variable.
 *    Fallback: a request the pool refuses (above max_block, or exhausted) is served by the malloc
 *    path with one warning on stderr and counted in moerl_pool_stats.fallbacks, so switching the
 *    pool on never makes a run fail that would run under malloc.
 *    MOERL_ALLOC_TRACE=FILE records every call (any allocator) and writes FILE as JSONL at exit
 *    (moerl_write_file_atomic; under mpirun FILE.rank<N>): a header line
 *    {"moerl_alloc_trace":1,"allocator":...} then one {"t":seconds,"op":"alloc"|"free","id":n,
 *    "size":bytes,"tag":"..."} per call. bench/bench_alloc replays it.
 *    With the pool on, its statistics are printed to stderr at exit.
 */
#ifndef MOERL_POOL_H
#define MOERL_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct moerl_pool moerl_pool;

typedef struct {
    size_t min_block;    /* bytes; power of two, ≥ the page size (default 4 MiB) */
    size_t max_block;    /* bytes; power of two, ≥ min_block, ≤ 2^30 · min_block (default 2 GiB) */
    size_t capacity;     /* bytes of address space to reserve; rounded up to a multiple of max_block;
                            0 = physical RAM */
    double reserve_frac; /* free memory kept committed, as a share of peak bytes in use; [0, 1] (0.3) */
} moerl_pool_config;

typedef struct {
    size_t reserved;       /* virtual address space reserved (bytes), fixed at creation */
    size_t committed;      /* bytes currently committed (accessible) */
    size_t peak_committed; /* high-water mark of committed */
    size_t in_use;         /* bytes in allocated blocks (block sizes, powers of two) */
    size_t peak_in_use;    /* high-water mark of in_use */
    size_t requested;      /* bytes asked for by the live allocations (≤ in_use; the gap is rounding) */
    size_t free_committed; /* committed − in_use: the cached free memory */
    size_t largest_free;   /* largest free block lying wholly in committed memory */
    double fragmentation;  /* 1 − largest_free / free_committed (0 when nothing is free) */
    uint64_t allocs, frees, failures; /* successful pool_alloc / pool_free calls; refused requests */
    uint64_t commits, decommits;      /* mprotect calls that committed / released memory */
    uint64_t fallbacks;               /* buffer-layer requests served by malloc after a refusal */
} moerl_pool_stats;

/* Defaults of the practice: 4 MiB / 2 GiB blocks, 30% reserve, capacity = physical RAM. */
moerl_pool_config moerl_pool_default_config(void);

/* Create a pool: reserves cfg->capacity bytes of address space (no memory yet). NULL with a
 * message on a bad configuration (naming the field and value) or when mmap fails. */
moerl_pool *moerl_pool_create(const moerl_pool_config *cfg);

/* Destroy the pool and unmap its range; live blocks become invalid. NULL is a no-op. */
void moerl_pool_destroy(moerl_pool *p);

/* A block of at least `bytes` (0 counts as 1), aligned to the page size, committed; contents
 * undefined (zero if never used before). NULL with a message when bytes > max_block or no free
 * block is large enough. Thread-safe. Cost: O(orders + free-list length). */
void *moerl_pool_alloc(moerl_pool *p, size_t bytes);

/* Return a block from moerl_pool_alloc, merging buddies. MOERL_ERR with a message (and nothing
 * changed) when ptr is not the start of a live block of this pool. NULL is a no-op. Thread-safe. */
int moerl_pool_free(moerl_pool *p, void *ptr);

/* 1 when ptr lies inside the pool's reserved range. */
int moerl_pool_owns(const moerl_pool *p, const void *ptr);

/* Size of the block that serves a request of `bytes` (0 when it is above max_block). */
size_t moerl_pool_block_size(const moerl_pool *p, size_t bytes);

/* Consistent snapshot of the statistics (taken under the pool's lock). */
void moerl_pool_get_stats(moerl_pool *p, moerl_pool_stats *st);

/* Check every internal invariant (free lists vs unit states, buddies never both free at one order,
 * counters vs blocks, allocated blocks committed). MOERL_OK or MOERL_ERR naming the first broken
 * one. For tests; O(units). */
int moerl_pool_check(moerl_pool *p);

/* ------------------------------------------------------------------ job-wide buffer allocator */

typedef enum { MOERL_ALLOC_MALLOC = 0, MOERL_ALLOC_POOL = 1, MOERL_ALLOC_JEMALLOC = 2 } moerl_alloc_kind;

/* The allocator MOERL_ALLOC selected (read once, on first use). */
moerl_alloc_kind moerl_alloc_current(void);
const char *moerl_alloc_name(moerl_alloc_kind k);
/* 1 when this build can load jemalloc (found jemalloc/jemalloc.h at build time). */
int moerl_alloc_have_jemalloc(void);

/* A zero-filled buffer of n bytes, 64-byte aligned, from the selected allocator; `tag` names the
 * buffer in the trace (a string literal). Out of memory: fatal, naming the call site, as xmalloc. */
void *moerl_buf_alloc_at(size_t n, const char *tag, const char *file, int line);
#define moerl_buf_alloc(n, tag) moerl_buf_alloc_at((n), (tag), __FILE__, __LINE__)
/* Free a buffer of moerl_buf_alloc. NULL is a no-op. */
void moerl_buf_free(void *ptr);

/* jemalloc's API: the library already in the process (LD_PRELOAD) or loaded with dlopen(RTLD_LOCAL)
 * (see MOERL_ALLOC=jemalloc above). */
typedef struct {
    void *(*mallocx)(size_t size, int flags);
    void (*dallocx)(void *ptr, int flags);
    int (*mallctl)(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
    int flags_align64; /* MALLOCX_ALIGN(64) */
    int flag_zero;     /* MALLOCX_ZERO */
} moerl_jemalloc_api;
/* Find or load libjemalloc.so.2 once. MOERL_ERR with a message when the build has no jemalloc or it
 * cannot be loaded (the static TLS case names LD_PRELOAD and GLIBC_TUNABLES). Thread-safe. */
int moerl_jemalloc_load(moerl_jemalloc_api *api);

/* The process pool's statistics: MOERL_OK when MOERL_ALLOC=pool and the pool exists, else MOERL_ERR
 * (st untouched). */
int moerl_alloc_pool_stats(moerl_pool_stats *st);

/* Parse a byte count with an optional K/M/G/T suffix (powers of 1024), e.g. "4M". MOERL_ERR with a
 * message naming `what` on anything else. */
int moerl_parse_bytes(const char *s, const char *what, size_t *out);

#endif
