/* moerl — buddy memory pool with an expandable segment, and the job-wide buffer allocator.
 * See pool.h for the design and its sources (Knuth's buddy system, TAOCP vol. 1 §2.5; docs/benchmarks.md). */
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

enum { U_NONE = 0, U_FREE = 1, U_USED = 2 }; /* state of a unit: not a block head / head of a free / used block */

struct moerl_pool {
    pthread_mutex_t mu;
    char *base;
    size_t unit;      /* min_block */
    size_t max_block;
    size_t capacity;  /* bytes reserved = n_units · unit */
    double reserve_frac;
    int kmax;         /* max order: max_block = unit << kmax */
    int64_t n_units;
    uint8_t *state;   /* [n_units] */
    uint8_t *order;   /* [n_units] order of the block starting here (heads only) */
    uint8_t *commit;  /* [n_units] 1 = committed */
    int64_t *next, *prev; /* [n_units] free-list links (free heads only); -1 = end */
    size_t *req;      /* [n_units] requested bytes (used heads only) */
    int64_t head[64]; /* free list of each order; -1 = empty */
    moerl_pool_stats st;
};

static int is_pow2(size_t x) { return x && !(x & (x - 1)); }

moerl_pool_config moerl_pool_default_config(void) {
    moerl_pool_config c;
    c.min_block = (size_t)4 << 20;
    c.max_block = (size_t)2 << 30;
    c.capacity = 0;
    c.reserve_frac = 0.3;
    return c;
}

static void list_push(moerl_pool *p, int64_t u, int k) {
    p->state[u] = U_FREE;
    p->order[u] = (uint8_t)k;
    p->prev[u] = -1;
    p->next[u] = p->head[k];
    if (p->head[k] >= 0) p->prev[p->head[k]] = u;
    p->head[k] = u;
}

static void list_remove(moerl_pool *p, int64_t u) {
    const int k = p->order[u];
    if (p->prev[u] >= 0) p->next[p->prev[u]] = p->next[u];
    else p->head[k] = p->next[u];
    if (p->next[u] >= 0) p->prev[p->next[u]] = p->prev[u];
    p->state[u] = U_NONE;
    p->next[u] = p->prev[u] = -1;
}

moerl_pool *moerl_pool_create(const moerl_pool_config *cfg) {
    moerl_pool_config c = cfg ? *cfg : moerl_pool_default_config();
    const long page = sysconf(_SC_PAGESIZE);
    if (!is_pow2(c.min_block) || c.min_block < (size_t)page) {
        moerl_errorf("pool: min_block must be a power of two ≥ the page size %ld, got %zu", page, c.min_block);
        return NULL;
    }
    if (!is_pow2(c.max_block) || c.max_block < c.min_block || c.max_block / c.min_block > ((size_t)1 << 30)) {
        moerl_errorf("pool: max_block must be a power of two between min_block (%zu) and 2^30 · min_block, got %zu",
                     c.min_block, c.max_block);
        return NULL;
    }
    if (!(c.reserve_frac >= 0 && c.reserve_frac <= 1)) {
        moerl_errorf("pool: reserve_frac must be in [0, 1], got %g", c.reserve_frac);
        return NULL;
    }
    if (c.capacity == 0) {
        const long pages = sysconf(_SC_PHYS_PAGES);
        c.capacity = pages > 0 ? (size_t)pages * (size_t)page : c.max_block;
    }
    if (c.capacity > ((size_t)1 << 46)) {
        moerl_errorf("pool: capacity %zu bytes is above the 64 TiB this pool reserves at most", c.capacity);
        return NULL;
    }
    c.capacity = (c.capacity + c.max_block - 1) / c.max_block * c.max_block;
    moerl_pool *p = xcalloc(1, sizeof *p);
    p->unit = c.min_block;
    p->max_block = c.max_block;
    p->capacity = c.capacity;
    p->reserve_frac = c.reserve_frac;
    p->kmax = 0;
    while ((p->unit << p->kmax) < p->max_block) p->kmax++;
    p->n_units = (int64_t)(c.capacity / c.min_block);
    void *b = mmap(NULL, c.capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (b == MAP_FAILED) {
        moerl_errorf("pool: cannot reserve %zu bytes of address space: %s", c.capacity, strerror(errno));
        free(p);
        return NULL;
    }
    p->base = b;
    p->state = xcalloc((size_t)p->n_units, 1);
    p->order = xcalloc((size_t)p->n_units, 1);
    p->commit = xcalloc((size_t)p->n_units, 1);
    p->next = xmalloc((size_t)p->n_units * sizeof(int64_t));
    p->prev = xmalloc((size_t)p->n_units * sizeof(int64_t));
    p->req = xcalloc((size_t)p->n_units, sizeof(size_t));
    for (int k = 0; k < 64; k++) p->head[k] = -1;
    const int64_t top = (int64_t)1 << p->kmax;
    for (int64_t u = p->n_units - top; u >= 0; u -= top) list_push(p, u, p->kmax); /* lowest address first */
    p->st.reserved = c.capacity;
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

void moerl_pool_destroy(moerl_pool *p) {
    if (!p) return;
    munmap(p->base, p->capacity);
    pthread_mutex_destroy(&p->mu);
    free(p->state);
    free(p->order);
    free(p->commit);
    free(p->next);
    free(p->prev);
    free(p->req);
    free(p);
}

int moerl_pool_owns(const moerl_pool *p, const void *ptr) {
    return p && (const char *)ptr >= p->base && (const char *)ptr < p->base + p->capacity;
}

static int order_for(const moerl_pool *p, size_t bytes) {
    if (bytes > p->max_block) return -1;
    int k = 0;
    while ((p->unit << k) < bytes) k++;
    return k;
}

size_t moerl_pool_block_size(const moerl_pool *p, size_t bytes) {
    const int k = order_for(p, bytes ? bytes : 1);
    return k < 0 ? 0 : p->unit << k;
}

/* Commit (on=1) or decommit (on=0) units [u, u+n) whose state differs, one syscall per run.
 * Decommit releases the pages (MADV_DONTNEED: zero on next commit) and removes access. */
static int set_commit(moerl_pool *p, int64_t u, int64_t n, int on) {
    int64_t i = u;
    while (i < u + n) {
        if (p->commit[i] == on) { i++; continue; }
        int64_t j = i;
        while (j < u + n && p->commit[j] != on) j++;
        char *a = p->base + (size_t)i * p->unit;
        const size_t len = (size_t)(j - i) * p->unit;
        if (on) {
            if (mprotect(a, len, PROT_READ | PROT_WRITE) != 0)
                return moerl_errorf("pool: cannot commit %zu bytes: %s", len, strerror(errno));
            p->st.commits++;
            p->st.committed += len;
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
    if (p->st.committed > p->st.peak_committed) p->st.peak_committed = p->st.committed;
    return MOERL_OK;
}

/* Committed units in [u, u+n). */
static int64_t committed_units(const moerl_pool *p, int64_t u, int64_t n) {
    int64_t c = 0;
    for (int64_t i = u; i < u + n; i++) c += p->commit[i];
    return c;
}

/* Free block u of order k (state already U_USED removed): merge with free buddies, list it. Returns
 * the head of the merged block and its order in *ko. */
static int64_t release(moerl_pool *p, int64_t u, int k, int *ko) {
    while (k < p->kmax) {
        const int64_t b = u ^ ((int64_t)1 << k);
        if (p->state[b] != U_FREE || p->order[b] != k) break;
        list_remove(p, b);
        p->state[u] = U_NONE;
        u = u < b ? u : b;
        k++;
    }
    list_push(p, u, k);
    *ko = k;
    return u;
}

/* Decommit free memory of block [u, u+2^k) beyond the reserve, from its end. */
static void trim(moerl_pool *p, int64_t u, int k) {
    const size_t allow = (size_t)(p->reserve_frac * (double)p->st.peak_in_use);
    const size_t free_c = p->st.committed - p->st.in_use;
    if (free_c <= allow) return;
    int64_t excess = (int64_t)((free_c - allow) / p->unit); /* whole units only */
    for (int64_t i = u + ((int64_t)1 << k) - 1; i >= u && excess > 0; i--)
        if (p->commit[i]) {
            if (set_commit(p, i, 1, 0) != MOERL_OK) return; /* stays committed: only costs memory */
            excess--;
        }
}

void *moerl_pool_alloc(moerl_pool *p, size_t bytes) {
    if (!bytes) bytes = 1;
    const int k = order_for(p, bytes);
    if (k < 0) {
        pthread_mutex_lock(&p->mu);
        p->st.failures++;
        pthread_mutex_unlock(&p->mu);
        moerl_errorf("pool: request of %zu bytes is above the maximum block of %zu bytes (MOERL_POOL_MAX_BLOCK)", bytes,
                     p->max_block);
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    int j = k;
    while (j <= p->kmax && p->head[j] < 0) j++;
    if (j > p->kmax) {
        p->st.failures++;
        const size_t in_use = p->st.in_use;
        pthread_mutex_unlock(&p->mu);
        moerl_errorf("pool: exhausted: no free block of %zu bytes for a request of %zu bytes (%zu of %zu reserved "
                     "bytes in use; raise MOERL_POOL_CAPACITY)",
                     p->unit << k, bytes, in_use, p->capacity);
        return NULL;
    }
    /* In the list of order j, prefer the block with the most committed units, then the lowest address:
     * reuse cached memory before committing more, and pack allocations towards the start. */
    int64_t best = -1, best_c = -1;
    const int64_t nj = (int64_t)1 << j;
    for (int64_t u = p->head[j]; u >= 0; u = p->next[u]) {
        const int64_t c = committed_units(p, u, nj);
        if (c > best_c || (c == best_c && u < best)) best = u, best_c = c;
        if (best_c == nj && j > k) break; /* fully committed and about to be split: good enough */
    }
    int64_t u = best;
    list_remove(p, u);
    while (j > k) { /* split: keep the half with more committed units (ties: the lower), list the other */
        j--;
        const int64_t h = (int64_t)1 << j;
        if (committed_units(p, u + h, h) > committed_units(p, u, h)) {
            list_push(p, u, j);
            u += h;
        } else
            list_push(p, u + h, j);
    }
    if (set_commit(p, u, (int64_t)1 << k, 1) != MOERL_OK) {
        int ko;
        release(p, u, k, &ko);
        p->st.failures++;
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    p->state[u] = U_USED;
    p->order[u] = (uint8_t)k;
    p->req[u] = bytes;
    p->st.in_use += p->unit << k;
    p->st.requested += bytes;
    p->st.allocs++;
    if (p->st.in_use > p->st.peak_in_use) p->st.peak_in_use = p->st.in_use;
    pthread_mutex_unlock(&p->mu);
    return p->base + (size_t)u * p->unit;
}

int moerl_pool_free(moerl_pool *p, void *ptr) {
    if (!ptr) return MOERL_OK;
    if (!moerl_pool_owns(p, ptr)) return moerl_errorf("pool_free: %p is outside the pool", ptr);
    const size_t off = (size_t)((char *)ptr - p->base);
    pthread_mutex_lock(&p->mu);
    const int64_t u = (int64_t)(off / p->unit);
    if (off % p->unit || p->state[u] != U_USED) {
        pthread_mutex_unlock(&p->mu);
        return moerl_errorf("pool_free: %p is not the start of a live pool block (double free?)", ptr);
    }
    const int k = p->order[u];
    p->st.in_use -= p->unit << k;
    p->st.requested -= p->req[u];
    p->req[u] = 0;
    p->st.frees++;
    int ko;
    const int64_t m = release(p, u, k, &ko);
    trim(p, m, ko);
    pthread_mutex_unlock(&p->mu);
    return MOERL_OK;
}

/* Largest free block lying wholly in committed memory (lock held). */
static size_t largest_committed_free(const moerl_pool *p) {
    for (int k = p->kmax; k >= 0; k--) {
        const int64_t n = (int64_t)1 << k;
        for (int64_t u = p->head[k]; u >= 0; u = p->next[u])
            if (committed_units(p, u, n) == n) return p->unit << k;
    }
    /* Free blocks only partly committed: the largest committed run inside one free block. */
    size_t best = 0;
    for (int k = p->kmax; k >= 1; k--)
        for (int64_t u = p->head[k]; u >= 0; u = p->next[u]) {
            int64_t run = 0;
            for (int64_t i = u; i < u + ((int64_t)1 << k); i++) {
                run = p->commit[i] ? run + 1 : 0;
                if ((size_t)run * p->unit > best) best = (size_t)run * p->unit;
            }
        }
    return best;
}

void moerl_pool_get_stats(moerl_pool *p, moerl_pool_stats *st) {
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    st->free_committed = p->st.committed - p->st.in_use;
    st->largest_free = st->free_committed ? largest_committed_free(p) : 0;
    st->fragmentation = st->free_committed ? 1.0 - (double)st->largest_free / (double)st->free_committed : 0.0;
    pthread_mutex_unlock(&p->mu);
}

int moerl_pool_check(moerl_pool *p) {
    int rc = MOERL_OK;
    pthread_mutex_lock(&p->mu);
    size_t in_use = 0, req = 0, committed = 0, listed = 0, free_units = 0;
    for (int64_t i = 0; i < p->n_units; i++) committed += p->commit[i];
    committed *= p->unit;
    for (int k = 0; k <= p->kmax && rc == MOERL_OK; k++)
        for (int64_t u = p->head[k], prev = -1; u >= 0; prev = u, u = p->next[u]) {
            if (p->state[u] != U_FREE || p->order[u] != k || p->prev[u] != prev || (u & (((int64_t)1 << k) - 1))) {
                rc = moerl_errorf("pool_check: free list %d entry %lld inconsistent", k, (long long)u);
                break;
            }
            if (k < p->kmax) {
                const int64_t b = u ^ ((int64_t)1 << k);
                if (p->state[b] == U_FREE && p->order[b] == k) {
                    rc = moerl_errorf("pool_check: buddies %lld and %lld both free at order %d", (long long)u,
                                      (long long)b, k);
                    break;
                }
            }
            listed++;
            free_units += (size_t)1 << k;
        }
    /* Walk the blocks in address order: heads must tile the range exactly. */
    size_t heads_free = 0;
    for (int64_t u = 0; u < p->n_units && rc == MOERL_OK;) {
        if (p->state[u] == U_NONE) {
            rc = moerl_errorf("pool_check: unit %lld is inside no block", (long long)u);
            break;
        }
        const int64_t n = (int64_t)1 << p->order[u];
        for (int64_t i = u + 1; i < u + n; i++)
            if (p->state[i] != U_NONE) {
                rc = moerl_errorf("pool_check: block %lld (order %d) overlaps the head at %lld", (long long)u,
                                  p->order[u], (long long)i);
                break;
            }
        if (p->state[u] == U_USED) {
            in_use += (size_t)n * p->unit;
            req += p->req[u];
            if (committed_units(p, u, n) != n && rc == MOERL_OK)
                rc = moerl_errorf("pool_check: used block %lld not fully committed", (long long)u);
        } else heads_free++;
        u += n;
    }
    if (rc == MOERL_OK && heads_free != listed)
        rc = moerl_errorf("pool_check: %zu free blocks, %zu listed", heads_free, listed);
    if (rc == MOERL_OK && (in_use != p->st.in_use || req != p->st.requested || committed != p->st.committed))
        rc = moerl_errorf("pool_check: counters (in_use %zu, requested %zu, committed %zu) disagree with the blocks "
                          "(%zu, %zu, %zu)",
                          p->st.in_use, p->st.requested, p->st.committed, in_use, req, committed);
    if (rc == MOERL_OK && in_use + free_units * p->unit != p->capacity)
        rc = moerl_errorf("pool_check: used %zu + free %zu != capacity %zu", in_use, free_units * p->unit, p->capacity);
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
            "requested %.1f), fragmentation %.3f, %llu allocations, %llu frees, %llu failures, %llu fallbacks\n",
            s.reserved / MiB, s.committed / MiB, s.peak_committed / MiB, s.in_use / MiB, s.peak_in_use / MiB,
            s.requested / MiB, s.fragmentation, (unsigned long long)s.allocs, (unsigned long long)s.frees,
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

static void alloc_init(void) {
    const char *a = getenv("MOERL_ALLOC");
    if (!a || !*a || !strcmp(a, "malloc")) G.kind = MOERL_ALLOC_MALLOC;
    else if (!strcmp(a, "pool")) G.kind = MOERL_ALLOC_POOL;
    else if (!strcmp(a, "jemalloc")) G.kind = MOERL_ALLOC_JEMALLOC;
    else moerl_fatal("MOERL_ALLOC='%s': expected malloc (the default), pool or jemalloc", a);
    if (G.kind == MOERL_ALLOC_POOL) {
        moerl_pool_config c = moerl_pool_default_config();
        c.min_block = env_bytes("MOERL_POOL_MIN_BLOCK", c.min_block);
        c.max_block = env_bytes("MOERL_POOL_MAX_BLOCK", c.max_block);
        c.capacity = env_bytes("MOERL_POOL_CAPACITY", 0);
        const char *r = getenv("MOERL_POOL_RESERVE");
        if (r && *r) {
            char *end;
            c.reserve_frac = strtod(r, &end);
            if (end == r || *end || !(c.reserve_frac >= 0 && c.reserve_frac <= 1))
                moerl_fatal("MOERL_POOL_RESERVE='%s': expected a fraction in [0, 1] (default 0.3)", r);
        }
        G.pool = moerl_pool_create(&c);
        if (!G.pool) moerl_fatal("MOERL_ALLOC=pool: %s", moerl_last_error());
    } else if (G.kind == MOERL_ALLOC_JEMALLOC) {
        if (moerl_jemalloc_load(&G.je) != MOERL_OK) moerl_fatal("MOERL_ALLOC=jemalloc: %s", moerl_last_error());
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
        p = moerl_pool_alloc(G.pool, sz);
        if (p) memset(p, 0, sz);
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
        if (moerl_pool_free(G.pool, ptr) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
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
