/* moerl — memory pool for large, long-lived buffers, and the job-wide buffer allocator switch.
 *
 * Two layers:
 *
 * 1. moerl_pool: a caching allocator in the manner of PyTorch's CUDA caching allocator (its design
 *    notes: size classes, best-fit, splitting, coalescing, expandable segments), for host memory:
 *    - Granule: every block is a multiple of min_block (the page size by default) and aligned to
 *      it; a request is rounded up to the granule (moerl_pool_block_size), so the rounding loss is
 *      below one granule per block.
 *    - Size classes: requests up to small_max (half a chunk; chunk = MOERL_POOL_SMALL_CHUNK = 2 MiB,
 *      at most max_block) are small: they are carved from chunks that the small class takes from the
 *      large class, so small, short-lived buffers never cut up the large free ranges; a chunk left
 *      wholly free goes back to the large class. Larger requests (up to max_block) are large.
 *    - Best fit: the smallest free block of the class that holds the request (the lowest address on
 *      ties), found through segregated size bins (4 sub-bins per power of two). The block is split:
 *      the request takes its low end, the rest stays free in the same class.
 *    - Coalescing: a freed block merges at once with its free neighbours of the same class (and, for
 *      small blocks, the same chunk), so free memory is never split into adjacent pieces.
 *    - Expandable segment: the pool reserves its whole address range once (mmap PROT_NONE,
 *      MAP_NORESERVE: no memory, no commit charge) and commits granules with mprotect when a block
 *      handed out covers them, so it grows in place, inside one mapping, and never copies. Before it
 *      commits new memory it decommits as much cached free memory (from the highest addresses down),
 *      so committed memory grows only when nothing cached is left: its peak is the peak in use.
 *    - Reserve (optional): freed memory stays committed as long as the free committed memory is at
 *      most reserve_frac × peak bytes in use (the practice's 30% by default; 0 returns every freed
 *      granule at once); beyond that it is decommitted (madvise MADV_DONTNEED + PROT_NONE),
 *      highest addresses first.
 *    Errors (no fallback inside the pool): a request above max_block, or one no free block can
 *    serve (the reservation is exhausted), returns NULL with a moerl_errorf message naming the
 *    size and the limit, and counts a failure. The buffer layer below documents its fallback.
 *    Thread safety: one mutex per pool around every call.
 *
 * 2. moerl_buf_alloc / moerl_buf_free: where moerl's large long-lived buffers come from (the
 *    activation arena, the engine's KV cache, the gradient reducer's compression buffers and
 *    residual). A job's config key trainer.allocator (moerl_alloc_select, below) or else the
 *    environment variable MOERL_ALLOC picks the allocator for the whole process:
 *      malloc   (default) glibc aligned_alloc + zero fill — exactly xalloc_aligned;
 *      pool     the caching pool above (one per process, created on first use);
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
 *    (fraction in [0, 1]; the key trainer.allocator_reserve when given), MOERL_POOL_COLOUR (bytes, a
 *    multiple of 64 below min_block, default 64): each buffer starts that far past its block's
 *    granule-aligned start (the block is that much larger), placed as glibc places its mmapped buffers
 *    (64 bytes past a page: its chunk header rounded to the 64-byte alignment) rather than at offset 0
 *    of a page (docs/benchmarks.md, "Memory"); 0 hands out the block's start. Bad values stop the
 *    process with a message naming the variable.
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
    size_t min_block;    /* bytes; granule of block sizes, alignment and commits: power of two, ≥ the page
                            size (default: the page size) */
    size_t max_block;    /* bytes; largest request: power of two, ≥ min_block, ≤ 2^30 · min_block (2 GiB) */
    size_t capacity;     /* bytes of address space to reserve; rounded up to a multiple of max_block;
                            0 = physical RAM */
    double reserve_frac; /* free memory kept committed, as a share of peak bytes in use; [0, 1] (0.3) */
} moerl_pool_config;

typedef struct {
    size_t reserved;       /* virtual address space reserved (bytes), fixed at creation */
    size_t committed;      /* bytes currently committed (accessible) */
    size_t peak_committed; /* high-water mark of committed */
    size_t in_use;         /* bytes in allocated blocks (block sizes, multiples of min_block) */
    size_t peak_in_use;    /* high-water mark of in_use */
    size_t requested;      /* bytes asked for by the live allocations (≤ in_use; the gap is rounding) */
    size_t free_committed; /* committed − in_use: the cached free memory */
    size_t largest_free;   /* largest free block lying wholly in committed memory */
    double fragmentation;  /* 1 − largest_free / free_committed (0 when nothing is free) */
    size_t peak_requested;    /* high-water mark of requested */
    size_t requested_at_peak; /* requested when committed was at its peak (the most, over the peak's span) */
    double peak_fragmentation; /* 1 − requested_at_peak / peak_committed: issue 29's "1 − requested /
                                  reserved at the peak" (0 before anything was committed) */
    uint64_t allocs, frees, failures; /* successful pool_alloc / pool_free calls; refused requests */
    uint64_t commits, decommits;      /* mprotect calls that committed / released memory */
    uint64_t fallbacks;               /* buffer-layer requests served by malloc after a refusal */
} moerl_pool_stats;

/* Bytes of a small-class chunk (at most max_block, at least min_block). */
#define MOERL_POOL_SMALL_CHUNK ((size_t)2 << 20)

/* Defaults: page-size granule, 2 GiB largest request, the practice's 30% reserve, capacity = physical RAM. */
moerl_pool_config moerl_pool_default_config(void);

/* Create a pool: reserves cfg->capacity bytes of address space (no memory yet). NULL with a
 * message on a bad configuration (naming the field and value) or when mmap fails. */
moerl_pool *moerl_pool_create(const moerl_pool_config *cfg);

/* Destroy the pool and unmap its range; live blocks become invalid. NULL is a no-op. */
void moerl_pool_destroy(moerl_pool *p);

/* A block of moerl_pool_block_size(bytes) bytes (0 counts as 1), aligned to min_block (so to the
 * page size), committed; contents undefined (zero if never used before). NULL with a message when
 * bytes > max_block or no free block is large enough. Thread-safe. Cost: O(bins + blocks in the
 * first bins that fit), plus O(blocks) when it must commit new memory. */
void *moerl_pool_alloc(moerl_pool *p, size_t bytes);

/* As moerl_pool_alloc, the block zero-filled: only its pages that were committed before the call are
 * written (cached free memory); the pages it commits anew are zero already (never touched, or released
 * with MADV_DONTNEED) and stay untouched — not resident — until the caller writes them, as with a fresh
 * mmap. */
void *moerl_pool_alloc_zeroed(moerl_pool *p, size_t bytes);

/* Return a block from moerl_pool_alloc, merging it with its free neighbours. MOERL_ERR with a message (and nothing
 * changed) when ptr is not the start of a live block of this pool. NULL is a no-op. Thread-safe. */
int moerl_pool_free(moerl_pool *p, void *ptr);

/* 1 when ptr lies inside the pool's reserved range. */
int moerl_pool_owns(const moerl_pool *p, const void *ptr);

/* Size of the block that serves a request of `bytes`: bytes rounded up to min_block (0 counts as 1;
 * 0 when bytes is above max_block). */
size_t moerl_pool_block_size(const moerl_pool *p, size_t bytes);

/* Consistent snapshot of the statistics (taken under the pool's lock). */
void moerl_pool_get_stats(moerl_pool *p, moerl_pool_stats *st);

/* Check every internal invariant (blocks tile the reservation in address order, free lists vs blocks
 * and their bins, no two free neighbours of one class, small blocks inside their chunk, no wholly
 * free chunk left in the small class, used blocks mapped and committed, counters vs blocks).
 * MOERL_OK or MOERL_ERR naming the first broken one. For tests; O(blocks + units). */
int moerl_pool_check(moerl_pool *p);

/* ------------------------------------------------------------------ job-wide buffer allocator */

typedef enum { MOERL_ALLOC_MALLOC = 0, MOERL_ALLOC_POOL = 1, MOERL_ALLOC_JEMALLOC = 2 } moerl_alloc_kind;

/* The process's buffer allocator: the one moerl_alloc_select chose, else the one MOERL_ALLOC names (read
 * once, on first use; malloc when unset). */
moerl_alloc_kind moerl_alloc_current(void);
const char *moerl_alloc_name(moerl_alloc_kind k);
/* "malloc" | "pool" | "jemalloc" → *out; MOERL_ERR (no message) on anything else. */
int moerl_alloc_parse(const char *s, moerl_alloc_kind *out);

/* A job's choice of buffer allocator (the config keys trainer.allocator / trainer.allocator_reserve). */
typedef struct {
    int kind;            /* a moerl_alloc_kind, or -1: the environment decides (MOERL_ALLOC, else malloc) */
    double reserve_frac; /* the pool's reserve in [0, 1], or < 0: MOERL_POOL_RESERVE (else 0.3) decides */
    const char *kind_key, *reserve_key; /* what the two settings are called in messages */
} moerl_alloc_choice;

/* Select the process's buffer allocator before its first buffer allocation (moerl rl and moerl sft call
 * it on every rank before building anything). Precedence: a setting given here wins over the
 * environment variable for the same thing (MOERL_ALLOC, MOERL_POOL_RESERVE), with one warning on stderr
 * naming both when they differ; the pool's other settings (MOERL_POOL_MIN_BLOCK, _MAX_BLOCK, _CAPACITY)
 * come from the environment only. Errors (MOERL_ERR, message naming the key and value): a reserve given
 * when the resolved allocator is not the pool; a reserve outside [0, 1]; an allocator already in use
 * in this process that differs (a buffer was allocated before the call, or a second call disagrees);
 * the pool cannot be created or jemalloc cannot be loaded (the MOERL_ALLOC=jemalloc conditions). Bad
 * MOERL_ALLOC / MOERL_POOL_* values the choice does not override stop the process as without it. */
int moerl_alloc_select(const moerl_alloc_choice *ch);
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
