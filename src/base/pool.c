/* moerl — caching memory pool (size classes, best-fit with splitting and coalescing, one expandable
 * segment), and the job-wide buffer allocator. See pool.h for the design and where it comes from. */
#include "base/pool.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"

#ifdef MOERL_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

enum { K_LARGE = 0, K_SMALL = 1, N_BINS = 160 };

/* A block: a run of granules [off, off+size) of the reservation. All blocks tile the reservation in
 * address order; a small block lies inside one chunk (a large block handed to the small class). */
typedef struct blk {
    size_t off, size; /* bytes, multiples of the granule */
    size_t req;       /* bytes asked for (used blocks) */
    size_t chunk;     /* small blocks: offset of their chunk */
    struct blk *prev, *next;   /* address order */
    struct blk *fprev, *fnext; /* free list of its bin */
    int used, small, bin;
} blk;

struct moerl_pool {
    pthread_mutex_t mu;
    char *base;
    size_t gran;      /* min_block: size and alignment granule of blocks, and the commit unit */
    size_t max_block; /* largest request */
    size_t capacity;  /* bytes reserved = n_units · gran */
    size_t chunk;     /* size of a small-class chunk */
    size_t small_max; /* requests up to this many bytes are small */
    double reserve_frac;
    int64_t n_units, top; /* units; top: one past the highest unit ever committed */
    uint8_t *commit;      /* [n_units] 1 = committed */
    blk *first, *last;
    blk *bins[2][N_BINS];
    blk **map; /* used blocks by offset, open addressing */
    size_t map_cap, map_n;
    moerl_pool_stats st;
};

static int is_pow2(size_t x) { return x && !(x & (x - 1)); }

moerl_pool_config moerl_pool_default_config(void) {
    moerl_pool_config c;
    const long page = sysconf(_SC_PAGESIZE);
    c.min_block = page > 0 ? (size_t)page : 4096;
    c.max_block = (size_t)2 << 30;
    c.capacity = 0;
    c.reserve_frac = 0.3;
    return c;
}

/* ---- size bins (two-level segregated fit: 4 linear sub-bins per power of two, so a bin's sizes
 * span less than 25% and every block of a later bin is larger than every block of an earlier one) */

static int bin_of(const moerl_pool *p, size_t size) {
    const uint64_t s = size / p->gran; /* ≥ 1 */
    if (s < 8) return (int)s - 1;
    const int fl = 63 - __builtin_clzll(s);
    return 7 + (fl - 3) * 4 + (int)((s >> (fl - 2)) & 3);
}

static void bin_push(moerl_pool *p, blk *b) {
    b->bin = bin_of(p, b->size);
    blk **h = &p->bins[b->small][b->bin];
    b->fprev = NULL;
    b->fnext = *h;
    if (*h) (*h)->fprev = b;
    *h = b;
}

static void bin_remove(moerl_pool *p, blk *b) {
    if (b->fprev) b->fprev->fnext = b->fnext;
    else p->bins[b->small][b->bin] = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
}

/* Best fit in one class: the smallest free block of at least `size` bytes, the lowest address on ties. */
static blk *find_fit(moerl_pool *p, int kind, size_t size) {
    const int b0 = bin_of(p, size);
    blk *best = NULL;
    for (int b = b0; b < N_BINS && !best; b++)
        for (blk *x = p->bins[kind][b]; x; x = x->fnext)
            if (x->size >= size &&
                (!best || x->size < best->size || (x->size == best->size && x->off < best->off)))
                best = x;
    return best;
}

/* ---- used blocks by offset (linear probing, backward-shift deletion) */

static size_t map_slot(const moerl_pool *p, size_t off) {
    uint64_t h = (uint64_t)(off / p->gran) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 29)) & (p->map_cap - 1);
}

static void map_put(moerl_pool *p, blk *b);

static void map_grow(moerl_pool *p) {
    blk **old = p->map;
    const size_t oc = p->map_cap;
    p->map_cap = oc ? 2 * oc : 64;
    p->map = xcalloc(p->map_cap, sizeof *p->map);
    p->map_n = 0;
    for (size_t i = 0; i < oc; i++)
        if (old[i]) map_put(p, old[i]);
    free(old);
}

static void map_put(moerl_pool *p, blk *b) {
    if (2 * (p->map_n + 1) > p->map_cap) map_grow(p);
    size_t i = map_slot(p, b->off);
    while (p->map[i]) i = (i + 1) & (p->map_cap - 1);
    p->map[i] = b;
    p->map_n++;
}

static blk *map_get(const moerl_pool *p, size_t off) {
    if (!p->map_cap) return NULL;
    for (size_t i = map_slot(p, off); p->map[i]; i = (i + 1) & (p->map_cap - 1))
        if (p->map[i]->off == off) return p->map[i];
    return NULL;
}

static void map_del(moerl_pool *p, size_t off) {
    const size_t mask = p->map_cap - 1;
    size_t i = map_slot(p, off);
    while (p->map[i]->off != off) i = (i + 1) & mask;
    p->map[i] = NULL;
    p->map_n--;
    for (size_t j = (i + 1) & mask; p->map[j]; j = (j + 1) & mask) {
        const size_t k = map_slot(p, p->map[j]->off); /* entry j stays unless its home lies outside (i, j] */
        const int stays = i <= j ? (k > i && k <= j) : (k > i || k <= j);
        if (!stays) {
            p->map[i] = p->map[j];
            p->map[j] = NULL;
            i = j;
        }
    }
}

/* ---- creation */

static int check_config(const moerl_pool_config *c, long page) {
    if (!is_pow2(c->min_block) || c->min_block < (size_t)page)
        return moerl_errorf("pool: min_block must be a power of two ≥ the page size %ld, got %zu", page, c->min_block);
    if (!is_pow2(c->max_block) || c->max_block < c->min_block || c->max_block / c->min_block > ((size_t)1 << 30))
        return moerl_errorf("pool: max_block must be a power of two between min_block (%zu) and 2^30 · min_block, "
                            "got %zu",
                            c->min_block, c->max_block);
    if (!(c->reserve_frac >= 0 && c->reserve_frac <= 1))
        return moerl_errorf("pool: reserve_frac must be in [0, 1], got %g", c->reserve_frac);
    if (c->capacity > ((size_t)1 << 46))
        return moerl_errorf("pool: capacity %zu bytes is above the 64 TiB this pool reserves at most", c->capacity);
    return MOERL_OK;
}

moerl_pool *moerl_pool_create(const moerl_pool_config *cfg) {
    moerl_pool_config c = cfg ? *cfg : moerl_pool_default_config();
    const long page = sysconf(_SC_PAGESIZE);
    if (check_config(&c, page) != MOERL_OK) return NULL;
    if (c.capacity == 0) {
        const long pages = sysconf(_SC_PHYS_PAGES);
        c.capacity = pages > 0 ? (size_t)pages * (size_t)page : c.max_block;
    }
    c.capacity = (c.capacity + c.max_block - 1) / c.max_block * c.max_block;
    void *b = mmap(NULL, c.capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (b == MAP_FAILED) {
        moerl_errorf("pool: cannot reserve %zu bytes of address space: %s", c.capacity, strerror(errno));
        return NULL;
    }
    moerl_pool *p = xcalloc(1, sizeof *p);
    p->base = b;
    p->gran = c.min_block;
    p->max_block = c.max_block;
    p->capacity = c.capacity;
    p->reserve_frac = c.reserve_frac;
    p->chunk = MOERL_POOL_SMALL_CHUNK < c.max_block ? MOERL_POOL_SMALL_CHUNK : c.max_block;
    if (p->chunk < c.min_block) p->chunk = c.min_block;
    p->small_max = p->chunk / 2 >= c.min_block ? p->chunk / 2 : 0;
    p->n_units = (int64_t)(c.capacity / c.min_block);
    p->commit = xcalloc((size_t)p->n_units, 1);
    blk *all = xcalloc(1, sizeof *all); /* one free large block spans the reservation */
    all->size = c.capacity;
    p->first = p->last = all;
    bin_push(p, all);
    p->st.reserved = c.capacity;
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

void moerl_pool_destroy(moerl_pool *p) {
    if (!p) return;
    munmap(p->base, p->capacity);
    pthread_mutex_destroy(&p->mu);
    for (blk *b = p->first, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(p->map);
    free(p->commit);
    free(p);
}

int moerl_pool_owns(const moerl_pool *p, const void *ptr) {
    return p && (const char *)ptr >= p->base && (const char *)ptr < p->base + p->capacity;
}

size_t moerl_pool_block_size(const moerl_pool *p, size_t bytes) {
    if (!bytes) bytes = 1;
    if (bytes > p->max_block) return 0;
    return (bytes + p->gran - 1) / p->gran * p->gran;
}

/* ---- commit */

/* Commit (on=1) or decommit (on=0) units [u, u+n) whose state differs, one syscall per run.
 * Decommit releases the pages (MADV_DONTNEED: zero on next commit) and removes access. */
static int set_commit(moerl_pool *p, int64_t u, int64_t n, int on) {
    int64_t i = u;
    const int64_t e = u + n;
    while (i < e) {
        const uint8_t *d = memchr(p->commit + i, !on, (size_t)(e - i)); /* next unit to change */
        if (!d) break;
        i = d - p->commit;
        const uint8_t *k = memchr(p->commit + i, on, (size_t)(e - i)); /* end of the run to change */
        const int64_t j = k ? k - p->commit : e;
        char *a = p->base + (size_t)i * p->gran;
        const size_t len = (size_t)(j - i) * p->gran;
        if (on) {
            if (mprotect(a, len, PROT_READ | PROT_WRITE) != 0)
                return moerl_errorf("pool: cannot commit %zu bytes: %s", len, strerror(errno));
            p->st.commits++;
            p->st.committed += len;
            if (j > p->top) p->top = j;
        } else {
            madvise(a, len, MADV_DONTNEED);
            if (mprotect(a, len, PROT_NONE) != 0)
                return moerl_errorf("pool: cannot decommit %zu bytes: %s", len, strerror(errno));
            p->st.decommits++;
            p->st.committed -= len;
        }
        memset(p->commit + i, on, (size_t)(j - i));
        i = j;
    }
    if (p->st.committed > p->st.peak_committed) {
        p->st.peak_committed = p->st.committed;
        p->st.requested_at_peak = p->st.requested;
    } else if (p->st.committed == p->st.peak_committed && p->st.requested > p->st.requested_at_peak)
        p->st.requested_at_peak = p->st.requested;
    return MOERL_OK;
}

static int64_t committed_units(const moerl_pool *p, int64_t u, int64_t n) {
    int64_t c = 0;
    const int64_t e = u + n < p->top ? u + n : p->top; /* nothing above top was ever committed */
    for (int64_t i = u; i < e; i++) c += p->commit[i];
    return c;
}

/* Decommit up to `units` committed units of free blocks, from the highest address down (the pool
 * packs allocations towards the start, so the top is the memory least likely to be reused).
 * Returns the units released. */
static int64_t release_cached(moerl_pool *p, int64_t units) {
    int64_t done = 0;
    for (blk *b = p->last; b && done < units; b = b->prev) {
        if (b->used) continue;
        const int64_t u0 = (int64_t)(b->off / p->gran);
        int64_t i = u0 + (int64_t)(b->size / p->gran);
        if (i > p->top) i = p->top;
        while (i > u0 && done < units) {
            const uint8_t *one = memrchr(p->commit + u0, 1, (size_t)(i - u0)); /* last committed unit */
            if (!one) break;
            i = one - p->commit + 1;
            int64_t j = i - 1; /* committed run [j, i), clipped to what is still to release */
            while (j > u0 && p->commit[j - 1] && i - j < units - done) j--;
            if (set_commit(p, j, i - j, 0) != MOERL_OK) return done; /* stays committed: only costs memory */
            done += i - j;
            i = j;
        }
    }
    return done;
}

/* Free memory kept committed beyond the reserve (reserve_frac × peak in use) is decommitted. */
static void trim(moerl_pool *p) {
    const size_t allow = (size_t)(p->reserve_frac * (double)p->st.peak_in_use);
    const size_t free_c = p->st.committed - p->st.in_use;
    if (free_c > allow && free_c - allow >= p->gran)
        release_cached(p, (int64_t)((free_c - allow) / p->gran)); /* whole units only */
}

/* ---- split and coalesce */

/* Cut free block b (out of its bin) to `size` bytes at its low end; the rest becomes a free block of
 * the same class, listed. */
static void split(moerl_pool *p, blk *b, size_t size) {
    if (b->size == size) return;
    blk *r = xcalloc(1, sizeof *r);
    r->off = b->off + size;
    r->size = b->size - size;
    r->small = b->small;
    r->chunk = b->chunk;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    else p->last = r;
    b->next = r;
    b->size = size;
    bin_push(p, r);
}

static int same_class(const blk *a, const blk *b) {
    return a->small == b->small && (!a->small || a->chunk == b->chunk);
}

/* Absorb b's next neighbour n (free, same class, out of its bin) into b. */
static void absorb_next(moerl_pool *p, blk *b) {
    blk *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    else p->last = b;
    free(n);
}

/* Free block b (not listed): merge it with free neighbours of its class; a chunk left wholly free
 * goes back to the large class and merges there. Lists the result and returns it. */
static blk *coalesce(moerl_pool *p, blk *b) {
    for (int pass = 0; pass < 2; pass++) {
        if (b->next && !b->next->used && same_class(b, b->next)) {
            bin_remove(p, b->next);
            absorb_next(p, b);
        }
        if (b->prev && !b->prev->used && same_class(b->prev, b)) {
            blk *q = b->prev;
            bin_remove(p, q);
            absorb_next(p, q);
            b = q;
        }
        if (!b->small || b->size != p->chunk) break;
        b->small = 0; /* a whole free chunk returns to the large class */
        b->chunk = 0;
    }
    bin_push(p, b);
    return b;
}

/* ---- allocation */

static void *alloc_fail(moerl_pool *p, size_t bytes, size_t size) {
    p->st.failures++;
    const size_t in_use = p->st.in_use;
    pthread_mutex_unlock(&p->mu);
    moerl_errorf("pool: exhausted: no free block of %zu bytes for a request of %zu bytes (%zu of %zu reserved "
                 "bytes in use; raise MOERL_POOL_CAPACITY)",
                 size, bytes, in_use, p->capacity);
    return NULL;
}

/* A free block of `size` bytes of the request's class, out of its bin (lock held); NULL when none. */
static blk *take(moerl_pool *p, size_t size) {
    const int small = size <= p->small_max;
    blk *b = find_fit(p, small, size);
    if (!b && small) { /* a new chunk for the small class, best fit among the large blocks */
        b = find_fit(p, K_LARGE, p->chunk);
        if (!b) return NULL;
        bin_remove(p, b);
        split(p, b, p->chunk);
        b->small = 1;
        b->chunk = b->off;
    } else if (!b)
        return NULL;
    else
        bin_remove(p, b);
    split(p, b, size);
    return b;
}

/* Zero the units of [u, u+n) that are committed (lock held): the others are committed fresh, and memory
 * never touched since its commit (mprotect of untouched or MADV_DONTNEED'ed pages) reads as zero. */
static void zero_committed(moerl_pool *p, int64_t u, int64_t n) {
    const int64_t e = u + n < p->top ? u + n : p->top;
    for (int64_t i = u; i < e;) {
        const uint8_t *one = memchr(p->commit + i, 1, (size_t)(e - i));
        if (!one) break;
        i = one - p->commit;
        const uint8_t *zero = memchr(p->commit + i, 0, (size_t)(e - i));
        const int64_t j = zero ? zero - p->commit : e;
        memset(p->base + (size_t)i * p->gran, 0, (size_t)(j - i) * p->gran);
        i = j;
    }
}

static void *pool_alloc(moerl_pool *p, size_t bytes, int zero);

void *moerl_pool_alloc(moerl_pool *p, size_t bytes) { return pool_alloc(p, bytes, 0); }

void *moerl_pool_alloc_zeroed(moerl_pool *p, size_t bytes) { return pool_alloc(p, bytes, 1); }

static void *pool_alloc(moerl_pool *p, size_t bytes, int zero) {
    if (!bytes) bytes = 1;
    if (bytes > p->max_block) {
        pthread_mutex_lock(&p->mu);
        p->st.failures++;
        pthread_mutex_unlock(&p->mu);
        moerl_errorf("pool: request of %zu bytes is above the maximum block of %zu bytes (MOERL_POOL_MAX_BLOCK)", bytes,
                     p->max_block);
        return NULL;
    }
    const size_t size = moerl_pool_block_size(p, bytes);
    pthread_mutex_lock(&p->mu);
    blk *b = take(p, size);
    if (!b) return alloc_fail(p, bytes, size);
    b->used = 1;
    const int64_t u = (int64_t)(b->off / p->gran), n = (int64_t)(size / p->gran);
    const int64_t have = committed_units(p, u, n), need = n - have;
    if (zero && have > 0) zero_committed(p, u, n); /* before the commit below: only the reused pages */
    /* Grow only when no cached memory is left: release as much cached free memory elsewhere as
     * this block needs committed, so the committed total stays at most the peak in use. */
    const int64_t cached = (int64_t)((p->st.committed - p->st.in_use) / p->gran) - have; /* outside b */
    if (need > 0 && cached > 0) release_cached(p, need < cached ? need : cached);
    if (set_commit(p, u, n, 1) != MOERL_OK) {
        b->used = 0;
        coalesce(p, b);
        p->st.failures++;
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    b->req = bytes;
    map_put(p, b);
    p->st.in_use += size;
    p->st.requested += bytes;
    p->st.allocs++;
    if (p->st.in_use > p->st.peak_in_use) p->st.peak_in_use = p->st.in_use;
    if (p->st.requested > p->st.peak_requested) p->st.peak_requested = p->st.requested;
    if (p->st.committed == p->st.peak_committed && p->st.requested > p->st.requested_at_peak)
        p->st.requested_at_peak = p->st.requested;
    pthread_mutex_unlock(&p->mu);
    return p->base + b->off;
}

int moerl_pool_free(moerl_pool *p, void *ptr) {
    if (!ptr) return MOERL_OK;
    if (!moerl_pool_owns(p, ptr)) return moerl_errorf("pool_free: %p is outside the pool", ptr);
    const size_t off = (size_t)((char *)ptr - p->base);
    pthread_mutex_lock(&p->mu);
    blk *b = map_get(p, off);
    if (!b) {
        pthread_mutex_unlock(&p->mu);
        return moerl_errorf("pool_free: %p is not the start of a live pool block (double free?)", ptr);
    }
    map_del(p, off);
    p->st.in_use -= b->size;
    p->st.requested -= b->req;
    p->st.frees++;
    b->used = 0;
    b->req = 0;
    coalesce(p, b);
    trim(p);
    pthread_mutex_unlock(&p->mu);
    return MOERL_OK;
}

/* ---- statistics and invariants */

/* Largest run of committed units inside one free block (lock held). */
static size_t largest_committed_free(const moerl_pool *p) {
    int64_t best = 0;
    for (const blk *b = p->first; b; b = b->next) {
        if (b->used) continue;
        const int64_t u0 = (int64_t)(b->off / p->gran);
        int64_t e = u0 + (int64_t)(b->size / p->gran);
        if (e > p->top) e = p->top;
        for (int64_t i = u0; i < e;) {
            const uint8_t *one = memchr(p->commit + i, 1, (size_t)(e - i));
            if (!one) break;
            i = one - p->commit;
            const uint8_t *zero = memchr(p->commit + i, 0, (size_t)(e - i));
            const int64_t j = zero ? zero - p->commit : e;
            if (j - i > best) best = j - i;
            i = j;
        }
    }
    return (size_t)best * p->gran;
}

void moerl_pool_get_stats(moerl_pool *p, moerl_pool_stats *st) {
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    st->free_committed = p->st.committed - p->st.in_use;
    st->largest_free = st->free_committed ? largest_committed_free(p) : 0;
    st->fragmentation = st->free_committed ? 1.0 - (double)st->largest_free / (double)st->free_committed : 0.0;
    st->peak_fragmentation =
        p->st.peak_committed ? 1.0 - (double)p->st.requested_at_peak / (double)p->st.peak_committed : 0.0;
    pthread_mutex_unlock(&p->mu);
}

/* Listed free blocks of both classes, checking each entry's bin and state (lock held). */
static int check_bins(const moerl_pool *p, size_t *n_listed) {
    *n_listed = 0;
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < N_BINS; b++)
            for (const blk *x = p->bins[k][b], *prev = NULL; x; prev = x, x = x->fnext) {
                if (x->used || x->small != k || x->bin != b || bin_of(p, x->size) != b || x->fprev != prev)
                    return moerl_errorf("pool_check: free list (class %d, bin %d) entry at %zu inconsistent", k, b,
                                        x->off);
                (*n_listed)++;
            }
    return MOERL_OK;
}

/* One block of the address walk: tiling, class, coalescing, commit, map entry (lock held). */
static int check_block(const moerl_pool *p, const blk *b, size_t expect_off) {
    if (b->off != expect_off || !b->size || b->size % p->gran)
        return moerl_errorf("pool_check: block at %zu (size %zu) does not tile the range (expected offset %zu)",
                            b->off, b->size, expect_off);
    if (b->small && (b->off < b->chunk || b->off + b->size > b->chunk + p->chunk))
        return moerl_errorf("pool_check: small block at %zu leaves its chunk at %zu", b->off, b->chunk);
    if (!b->used && b->next && !b->next->used && same_class(b, b->next))
        return moerl_errorf("pool_check: free neighbours at %zu and %zu not coalesced", b->off, b->next->off);
    if (!b->used && b->small && b->size == p->chunk)
        return moerl_errorf("pool_check: wholly free chunk at %zu not returned to the large class", b->off);
    if (b->used && (map_get(p, b->off) != b || b->req > b->size || b->size - b->req >= p->gran))
        return moerl_errorf("pool_check: used block at %zu not mapped or badly sized", b->off);
    if (b->used && committed_units(p, (int64_t)(b->off / p->gran), (int64_t)(b->size / p->gran)) !=
                       (int64_t)(b->size / p->gran))
        return moerl_errorf("pool_check: used block at %zu not fully committed", b->off);
    return MOERL_OK;
}

int moerl_pool_check(moerl_pool *p) {
    pthread_mutex_lock(&p->mu);
    size_t listed = 0, n_free = 0, n_used = 0, in_use = 0, req = 0, off = 0, committed = 0;
    int rc = check_bins(p, &listed);
    for (const blk *b = p->first, *prev = NULL; b && rc == MOERL_OK; prev = b, b = b->next) {
        if (b->prev != prev) rc = moerl_errorf("pool_check: block list links broken at %zu", b->off);
        else rc = check_block(p, b, off);
        off += b->size;
        if (b->used) n_used++, in_use += b->size, req += b->req;
        else n_free++;
    }
    for (int64_t i = 0; i < p->n_units; i++) committed += p->commit[i];
    committed *= p->gran;
    if (rc == MOERL_OK && off != p->capacity)
        rc = moerl_errorf("pool_check: blocks cover %zu of the %zu reserved bytes", off, p->capacity);
    if (rc == MOERL_OK && (n_free != listed || n_used != p->map_n))
        rc = moerl_errorf("pool_check: %zu free blocks, %zu listed; %zu used, %zu mapped", n_free, listed, n_used,
                          p->map_n);
    if (rc == MOERL_OK && (in_use != p->st.in_use || req != p->st.requested || committed != p->st.committed))
        rc = moerl_errorf("pool_check: counters (in_use %zu, requested %zu, committed %zu) disagree with the blocks "
                          "(%zu, %zu, %zu)",
                          p->st.in_use, p->st.requested, p->st.committed, in_use, req, committed);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* ------------------------------------------------------------------ byte counts */

int moerl_parse_bytes(const char *s, const char *what, size_t *out) {
    if (!s || !*s) return moerl_errorf("%s: empty value, expected a byte count such as 4194304 or 4M", what);
    char *end = NULL;
    errno = 0;
    const double v = strtod(s, &end);
    double mul = 1;
    if (end && *end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mul = 1024.0; break;
        case 'M': mul = 1048576.0; break;
        case 'G': mul = 1073741824.0; break;
        case 'T': mul = 1099511627776.0; break;
        default: mul = 0;
        }
        if (mul && (end[1] == 'i' || end[1] == 'I')) end++;
        if (mul && (toupper((unsigned char)end[1]) == 'B')) end++;
        if (mul) end++;
    }
    if (errno || end == s || *end || !mul || !(v >= 0) || v * mul > 1.8e19)
        return moerl_errorf("%s: '%s' is not a byte count (expected e.g. 4194304, 4M, 2G)", what, s);
    *out = (size_t)(v * mul);
    return MOERL_OK;
}

/* ------------------------------------------------------------------ job-wide buffer allocator */

typedef struct {
    double t;
    uint64_t id;
    size_t size;
    const char *tag;
    char op; /* 'a' or 'f' */
} trace_rec;


static struct {
    pthread_once_t once;
    moerl_alloc_kind kind;
    moerl_pool *pool;
    size_t colour; /* bytes between a pool block's start and the buffer handed out (MOERL_POOL_COLOUR) */
    int warned_fallback;
    uint64_t fallbacks;
    moerl_jemalloc_api je;
    /* trace */
    pthread_mutex_t tmu;
    char *trace_path;
    double t0;
    trace_rec *rec;
    size_t n_rec, cap_rec;
    struct { void *ptr; uint64_t id; } *live;
    size_t n_live, cap_live;
    uint64_t next_id;
} G = {.once = PTHREAD_ONCE_INIT, .tmu = PTHREAD_MUTEX_INITIALIZER};

const char *moerl_alloc_name(moerl_alloc_kind k) {
    switch (k) {
    case MOERL_ALLOC_POOL: return "pool";
    case MOERL_ALLOC_JEMALLOC: return "jemalloc";
    default: return "malloc";
    }
}

int moerl_alloc_have_jemalloc(void) {
#ifdef MOERL_HAVE_JEMALLOC
    return 1;
#else
    return 0;
#endif
}

static void trace_write(void) {
    pthread_mutex_lock(&G.tmu);
    size_t cap = 4096 + G.n_rec * 96, len = 0;
    char *buf = xmalloc(cap);
    json_t *h = json_pack("{s:i,s:s,s:i}", "moerl_alloc_trace", 1, "allocator", moerl_alloc_name(G.kind), "pid",
                          (int)getpid());
    char *line = json_dumps(h, JSON_COMPACT);
    len += (size_t)snprintf(buf + len, cap - len, "%s\n", line);
    free(line);
    json_decref(h);
    for (size_t i = 0; i < G.n_rec; i++) {
        const trace_rec *r = &G.rec[i];
        json_t *o = json_pack("{s:f,s:s,s:I,s:I,s:s}", "t", r->t, "op", r->op == 'a' ? "alloc" : "free", "id",
                              (json_int_t)r->id, "size", (json_int_t)r->size, "tag", r->tag ? r->tag : "");
        line = json_dumps(o, JSON_COMPACT);
        const size_t ll = strlen(line);
        if (len + ll + 2 > cap) {
            cap = 2 * cap + ll;
            buf = xrealloc(buf, cap);
        }
        memcpy(buf + len, line, ll);
        len += ll;
        buf[len++] = '\n';
        free(line);
        json_decref(o);
    }
    if (moerl_write_file_atomic(G.trace_path, buf, len) != MOERL_OK)
        fprintf(stderr, "moerl: cannot write the allocation trace: %s\n", moerl_last_error());
    else
        fprintf(stderr, "moerl: allocation trace (%zu records) written to %s\n", G.n_rec, G.trace_path);
    free(buf);
    pthread_mutex_unlock(&G.tmu);
}

static void print_pool_stats(void) {
    moerl_pool_stats s;
    if (moerl_alloc_pool_stats(&s) != MOERL_OK) return;
    const double MiB = 1048576.0;
    fprintf(stderr,
            "moerl: memory pool: reserved %.0f MiB, committed %.1f MiB (peak %.1f), in use %.1f MiB (peak %.1f, "
            "requested %.1f; at the peak %.1f of %.1f committed: %.2f%% lost), fragmentation %.3f, %llu allocations, "
            "%llu frees, %llu failures, %llu fallbacks\n",
            s.reserved / MiB, s.committed / MiB, s.peak_committed / MiB, s.in_use / MiB, s.peak_in_use / MiB,
            s.requested / MiB, s.requested_at_peak / MiB, s.peak_committed / MiB, 100 * s.peak_fragmentation,
            s.fragmentation, (unsigned long long)s.allocs, (unsigned long long)s.frees,
            (unsigned long long)s.failures, (unsigned long long)s.fallbacks);
}

static void at_exit(void) {
    if (G.trace_path) trace_write();
    if (G.kind == MOERL_ALLOC_POOL) print_pool_stats();
}

static size_t env_bytes(const char *name, size_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    size_t out = dflt;
    if (moerl_parse_bytes(v, name, &out) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
    return out;
}

/* A job's choice (moerl_alloc_select), read by alloc_init; sel_err holds why applying it failed. */
static struct {
    int set, failed, inited;
    moerl_alloc_choice ch;
    char kind_key[64], reserve_key[64];
    char err[1024];
} SEL;

static double env_reserve(double dflt) {
    const char *r = getenv("MOERL_POOL_RESERVE");
    if (!r || !*r) return dflt;
    char *end;
    const double v = strtod(r, &end);
    if (end == r || *end || !(v >= 0 && v <= 1))
        moerl_fatal("MOERL_POOL_RESERVE='%s': expected a fraction in [0, 1] (default 0.3)", r);
    return v;
}

/* The allocator kind: the job's choice when it names one (a differing MOERL_ALLOC is overridden, with a
 * warning), else MOERL_ALLOC (a bad value is fatal: nothing overrides it), else malloc. */
static moerl_alloc_kind resolve_kind(void) {
    const char *a = getenv("MOERL_ALLOC");
    const int env_set = a && *a;
    moerl_alloc_kind env_kind = MOERL_ALLOC_MALLOC;
    const int env_ok = !env_set || moerl_alloc_parse(a, &env_kind) == MOERL_OK;
    if (SEL.set && SEL.ch.kind >= 0) {
        const moerl_alloc_kind k = (moerl_alloc_kind)SEL.ch.kind;
        if (env_set && (!env_ok || env_kind != k))
            fprintf(stderr, "moerl: warning: %s=%s overrides the environment's MOERL_ALLOC=%s (the config key wins)\n",
                    SEL.kind_key, moerl_alloc_name(k), a);
        return k;
    }
    if (!env_ok) moerl_fatal("MOERL_ALLOC='%s': expected malloc (the default), pool or jemalloc", a);
    return env_kind;
}

/* The pool's reserve: the job's choice (only with the pool; a differing MOERL_POOL_RESERVE is
 * overridden, with a warning), else MOERL_POOL_RESERVE, else 0.3. MOERL_ERR (SEL.err) on a choice
 * that does not apply. */
static int resolve_reserve(moerl_alloc_kind kind, double *out) {
    if (!(SEL.set && SEL.ch.reserve_frac >= 0)) {
        if (kind == MOERL_ALLOC_POOL) *out = env_reserve(*out);
        return MOERL_OK;
    }
    if (kind != MOERL_ALLOC_POOL) {
        snprintf(SEL.err, sizeof SEL.err,
                 "%s=%g applies to the pool only, but the buffer allocator is %s (%s, or MOERL_ALLOC; "
                 "set %s=pool or drop %s)",
                 SEL.reserve_key, SEL.ch.reserve_frac, moerl_alloc_name(kind), SEL.kind_key, SEL.kind_key,
                 SEL.reserve_key);
        return MOERL_ERR;
    }
    const char *r = getenv("MOERL_POOL_RESERVE");
    if (r && *r && strtod(r, NULL) != SEL.ch.reserve_frac)
        fprintf(stderr, "moerl: warning: %s=%g overrides the environment's MOERL_POOL_RESERVE=%s (the config key wins)\n",
                SEL.reserve_key, SEL.ch.reserve_frac, r);
    *out = SEL.ch.reserve_frac;
    return MOERL_OK;
}

/* Create the process pool from the environment's settings and the resolved reserve. */
static int setup_pool(double reserve) {
    moerl_pool_config c = moerl_pool_default_config();
    c.min_block = env_bytes("MOERL_POOL_MIN_BLOCK", c.min_block);
    c.max_block = env_bytes("MOERL_POOL_MAX_BLOCK", c.max_block);
    c.capacity = env_bytes("MOERL_POOL_CAPACITY", 0);
    c.reserve_frac = reserve;
    G.colour = env_bytes("MOERL_POOL_COLOUR", 64);
    if (G.colour % 64 || G.colour >= c.min_block)
        moerl_fatal("MOERL_POOL_COLOUR=%zu: expected a multiple of 64 bytes below the pool's block granule (%zu)",
                    G.colour, c.min_block);
    G.pool = moerl_pool_create(&c);
    return G.pool ? MOERL_OK : MOERL_ERR;
}

/* Runs once (pthread_once): the allocator, its pool or library, the trace. Failures of a job's choice
 * leave malloc in place and are reported by moerl_alloc_select; the environment's alone are fatal. */
static void alloc_init(void) {
    __atomic_store_n(&SEL.inited, 1, __ATOMIC_RELEASE);
    G.kind = resolve_kind();
    const char *who = SEL.set && SEL.ch.kind >= 0 ? SEL.kind_key : "MOERL_ALLOC";
    double reserve = moerl_pool_default_config().reserve_frac;
    int rc = resolve_reserve(G.kind, &reserve);
    if (rc == MOERL_OK && G.kind == MOERL_ALLOC_POOL) {
        rc = setup_pool(reserve);
        if (rc != MOERL_OK) snprintf(SEL.err, sizeof SEL.err, "%s=pool: %s", who, moerl_last_error());
    } else if (rc == MOERL_OK && G.kind == MOERL_ALLOC_JEMALLOC) {
        rc = moerl_jemalloc_load(&G.je);
        if (rc != MOERL_OK) snprintf(SEL.err, sizeof SEL.err, "%s=jemalloc: %s", who, moerl_last_error());
    }
    if (rc != MOERL_OK) {
        if (!SEL.set) moerl_fatal("%s", SEL.err);
        SEL.failed = 1;
        G.kind = MOERL_ALLOC_MALLOC; /* moerl_alloc_select reports it; the job stops */
    }
    const char *t = getenv("MOERL_ALLOC_TRACE");
    if (t && *t) {
        const char *rank = getenv("OMPI_COMM_WORLD_RANK");
        if (!rank) rank = getenv("PMI_RANK");
        const size_t n = strlen(t) + 32;
        G.trace_path = xmalloc(n);
        if (rank) snprintf(G.trace_path, n, "%s.rank%s", t, rank);
        else snprintf(G.trace_path, n, "%s", t);
        G.t0 = moerl_now();
    }
    if (G.trace_path || G.kind == MOERL_ALLOC_POOL) atexit(at_exit);
}

int moerl_alloc_parse(const char *s, moerl_alloc_kind *out) {
    if (!s) return MOERL_ERR;
    if (!strcmp(s, "malloc")) *out = MOERL_ALLOC_MALLOC;
    else if (!strcmp(s, "pool")) *out = MOERL_ALLOC_POOL;
    else if (!strcmp(s, "jemalloc")) *out = MOERL_ALLOC_JEMALLOC;
    else return MOERL_ERR;
    return MOERL_OK;
}

/* The allocator was set up before this choice (an earlier buffer or call): it must agree. */
static int select_check_current(const moerl_alloc_choice *ch) {
    if (SEL.failed) return moerl_errorf("%s", SEL.err);
    if (ch->kind >= 0 && ch->kind != (int)G.kind)
        return moerl_errorf("%s=%s: this process already allocates its buffers with %s (chosen before the key was "
                            "applied); the allocator is chosen once per process, before its first buffer",
                            ch->kind_key, moerl_alloc_name((moerl_alloc_kind)ch->kind), moerl_alloc_name(G.kind));
    if (ch->reserve_frac >= 0 && (G.kind != MOERL_ALLOC_POOL || G.pool->reserve_frac != ch->reserve_frac))
        return moerl_errorf("%s=%g: this process's buffer allocator (%s) is already set up%s; the allocator is chosen "
                            "once per process, before its first buffer",
                            ch->reserve_key, ch->reserve_frac, moerl_alloc_name(G.kind),
                            G.kind == MOERL_ALLOC_POOL ? " with another reserve" : ", and the reserve is the pool's");
    return MOERL_OK;
}

int moerl_alloc_select(const moerl_alloc_choice *ch) {
    const char *kk = ch->kind_key ? ch->kind_key : "allocator", *rk = ch->reserve_key ? ch->reserve_key : "reserve";
    if (ch->kind > MOERL_ALLOC_JEMALLOC)
        return moerl_errorf("%s: unknown allocator kind %d (expected malloc, pool or jemalloc)", kk, ch->kind);
    if (ch->reserve_frac >= 0 && !(ch->reserve_frac <= 1))
        return moerl_errorf("%s=%g: expected a fraction in [0, 1] (the share of the peak in use the pool keeps "
                            "committed when freed)", rk, ch->reserve_frac);
    moerl_alloc_choice c = *ch;
    c.kind_key = kk;
    c.reserve_key = rk;
    if (__atomic_load_n(&SEL.inited, __ATOMIC_ACQUIRE)) {
        pthread_once(&G.once, alloc_init); /* wait until it has finished */
        return select_check_current(&c);
    }
    SEL.set = 1;
    SEL.ch = c;
    snprintf(SEL.kind_key, sizeof SEL.kind_key, "%s", kk);
    snprintf(SEL.reserve_key, sizeof SEL.reserve_key, "%s", rk);
    SEL.ch.kind_key = SEL.kind_key;
    SEL.ch.reserve_key = SEL.reserve_key;
    pthread_once(&G.once, alloc_init);
    return SEL.failed ? moerl_errorf("%s", SEL.err) : MOERL_OK;
}

static pthread_once_t je_once = PTHREAD_ONCE_INIT;
static moerl_jemalloc_api je_api;
static char je_err[600];

/* Debian's libjemalloc uses initial-exec TLS, which glibc can place in a library loaded after start only
 * within the static TLS surplus it sized at exec time (glibc.rtld.optional_static_tls, 512 bytes by
 * default: "cannot allocate memory in static TLS block"). So the library is used as the process was
 * started: already loaded (LD_PRELOAD, found by RTLD_NOLOAD), or loaded here with RTLD_LOCAL when the
 * surplus is large enough (GLIBC_TUNABLES); the process is never re-executed. */
static void je_load_once(void) {
#ifdef MOERL_HAVE_JEMALLOC
    void *h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(je_err, sizeof je_err,
                 "cannot load libjemalloc.so.2 (%s). %s", why ? why : "unknown error",
                 why && strstr(why, "static TLS")
                     ? "glibc loads jemalloc after start only with a larger static TLS surplus: start the process with "
                       "LD_PRELOAD=libjemalloc.so.2 (jemalloc then serves every allocation) or with "
                       "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 (only the buffers)"
                     : "Install libjemalloc2 (scripts/setup.sh)");
        return;
    }
    je_api.mallocx = (void *(*)(size_t, int))dlsym(h, "mallocx");
    je_api.dallocx = (void (*)(void *, int))dlsym(h, "dallocx");
    je_api.mallctl = (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(h, "mallctl");
    je_api.flags_align64 = MALLOCX_ALIGN(64);
    je_api.flag_zero = MALLOCX_ZERO;
    if (!je_api.mallocx || !je_api.dallocx || !je_api.mallctl) {
        snprintf(je_err, sizeof je_err, "libjemalloc.so.2 lacks mallocx/dallocx/mallctl");
        je_api.mallocx = NULL;
    }
#else
    snprintf(je_err, sizeof je_err,
             "this build has no jemalloc (install libjemalloc-dev with scripts/setup.sh and rebuild)");
#endif
}

int moerl_jemalloc_load(moerl_jemalloc_api *api) {
    pthread_once(&je_once, je_load_once);
    if (!je_api.mallocx) return moerl_errorf("jemalloc: %s", je_err);
    *api = je_api;
    return MOERL_OK;
}

moerl_alloc_kind moerl_alloc_current(void) {
    pthread_once(&G.once, alloc_init);
    return G.kind;
}

static void trace_op(char op, void *ptr, size_t size, const char *tag) {
    pthread_mutex_lock(&G.tmu);
    uint64_t id = 0;
    if (op == 'a') {
        id = ++G.next_id;
        if (G.n_live == G.cap_live) {
            G.cap_live = G.cap_live ? 2 * G.cap_live : 64;
            G.live = xrealloc(G.live, G.cap_live * sizeof *G.live);
        }
        G.live[G.n_live].ptr = ptr;
        G.live[G.n_live++].id = id;
    } else {
        for (size_t i = G.n_live; i-- > 0;)
            if (G.live[i].ptr == ptr) {
                id = G.live[i].id;
                G.live[i] = G.live[--G.n_live];
                break;
            }
    }
    if (G.n_rec == G.cap_rec) {
        G.cap_rec = G.cap_rec ? 2 * G.cap_rec : 256;
        G.rec = xrealloc(G.rec, G.cap_rec * sizeof *G.rec);
    }
    G.rec[G.n_rec++] = (trace_rec){moerl_now() - G.t0, id, size, tag, op};
    pthread_mutex_unlock(&G.tmu);
}

void *moerl_buf_alloc_at(size_t n, const char *tag, const char *file, int line) {
    const moerl_alloc_kind k = moerl_alloc_current();
    const size_t sz = n ? (n + 63) & ~(size_t)63 : 64;
    void *p = NULL;
    if (k == MOERL_ALLOC_POOL) {
        p = moerl_pool_alloc_zeroed(G.pool, sz + G.colour); /* writes only reused pages: fresh ones are zero */
        if (p) p = (char *)p + G.colour;
        else {
            pthread_mutex_lock(&G.tmu);
            G.fallbacks++;
            const int warn = !G.warned_fallback;
            G.warned_fallback = 1;
            pthread_mutex_unlock(&G.tmu);
            if (warn)
                fprintf(stderr, "moerl: warning: %s:%d: %s; serving it (and any later refusal) with malloc\n", file,
                        line, moerl_last_error());
            p = moerl_aligned_alloc_at(sz, file, line);
        }
    } else if (k == MOERL_ALLOC_JEMALLOC) {
        p = G.je.mallocx(sz, G.je.flags_align64 | G.je.flag_zero);
        if (!p) moerl_fatal_at(file, line, "out of memory allocating %zu bytes with jemalloc", sz);
    } else {
        p = moerl_aligned_alloc_at(sz, file, line);
    }
    if (G.trace_path) trace_op('a', p, n, tag);
    return p;
}

void moerl_buf_free(void *ptr) {
    if (!ptr) return;
    const moerl_alloc_kind k = moerl_alloc_current();
    if (G.trace_path) trace_op('f', ptr, 0, NULL);
    if (k == MOERL_ALLOC_POOL && moerl_pool_owns(G.pool, ptr)) {
        if (moerl_pool_free(G.pool, (char *)ptr - G.colour) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
    } else if (k == MOERL_ALLOC_JEMALLOC) {
        G.je.dallocx(ptr, 0);
    } else {
        free(ptr);
    }
}

int moerl_alloc_pool_stats(moerl_pool_stats *st) {
    if (moerl_alloc_current() != MOERL_ALLOC_POOL || !G.pool) return MOERL_ERR;
    moerl_pool_get_stats(G.pool, st);
    pthread_mutex_lock(&G.tmu);
    st->fallbacks = G.fallbacks;
    pthread_mutex_unlock(&G.tmu);
    return MOERL_OK;
}
