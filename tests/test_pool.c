/* Caching pool (src/base/pool.c): invariants under random alloc/free sequences (no overlap,
 * alignment, contents kept, statistics consistent, everything returned and merged back), a shadow
 * model holding every byte of every live block, best fit, splitting, coalescing, the size classes,
 * the reserve, the expandable segment's growth in place (committed peak = peak in use), exhaustion
 * and oversize errors (the out-of-memory message), zero-size requests, bad input, threads, and the
 * job-wide buffer layer (MOERL_ALLOC=pool with its malloc fallback). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/pool.h"
#include "base/rng.h"
#include "test.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1 << 20)

typedef struct {
    unsigned char *p;
    size_t req, block;
    unsigned char tag;
} live_t;

static uint64_t xs(uint64_t *s) { /* xorshift64: the test's own stream, independent of moerl's rng */
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Fill the first and last 64 bytes (or all) of a live block with its tag; verify them. */
static void stamp(live_t *l) {
    const size_t n = l->req < 64 ? l->req : 64;
    memset(l->p, l->tag, n);
    memset(l->p + l->req - n, l->tag, n);
}
static int stamp_ok(const live_t *l) {
    const size_t n = l->req < 64 ? l->req : 64;
    for (size_t i = 0; i < n; i++)
        if (l->p[i] != l->tag || l->p[l->req - n + i] != l->tag) return 0;
    return 1;
}

static void test_random_sequences(void) {
    const size_t minb = 64 * KiB, maxb = 4 * MiB, cap = 32 * MiB;
    for (int seed = 1; seed <= 3; seed++) {
        moerl_pool *p = moerl_pool_create(&(moerl_pool_config){minb, maxb, cap, seed == 2 ? 0.0 : 0.3});
        CHECK(p != NULL, "create: %s", moerl_last_error());
        if (!p) return;
        live_t live[512];
        int n = 0, overlap = 0, misaligned = 0, corrupt = 0, exhausted = 0, bad_msg = 0, check_fail = 0,
            stat_fail = 0;
        uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)seed;
        for (int op = 0; op < 4000; op++) {
            if (n < 512 && (n == 0 || xs(&s) % 100 < 55)) {
                /* log-uniform sizes from 1 byte to the max block */
                const int lg = (int)(xs(&s) % 23);
                size_t req = ((size_t)1 << lg) + xs(&s) % ((size_t)1 << lg);
                if (req > maxb) req = maxb;
                unsigned char *q = moerl_pool_alloc(p, req);
                if (!q) {
                    exhausted++;
                    if (!strstr(moerl_last_error(), "exhausted")) bad_msg++;
                    continue;
                }
                const size_t blk = moerl_pool_block_size(p, req);
                if (((uintptr_t)q % 4096) || blk < req || blk % minb || blk - req >= minb) misaligned++;
                for (int i = 0; i < n; i++)
                    if (q < live[i].p + live[i].block && live[i].p < q + blk) overlap++;
                live[n] = (live_t){q, req, blk, (unsigned char)(op * 7 + 1)};
                stamp(&live[n]);
                n++;
            } else {
                const int i = (int)(xs(&s) % (uint64_t)n);
                if (!stamp_ok(&live[i])) corrupt++;
                CHECK(moerl_pool_free(p, live[i].p) == MOERL_OK, "free: %s", moerl_last_error());
                live[i] = live[--n];
            }
            if (op % 97 == 0) {
                if (moerl_pool_check(p) != MOERL_OK) {
                    check_fail++;
                    fprintf(stderr, "  %s\n", moerl_last_error());
                }
                moerl_pool_stats st;
                moerl_pool_get_stats(p, &st);
                size_t in_use = 0, req = 0;
                for (int i = 0; i < n; i++) in_use += live[i].block, req += live[i].req;
                if (st.in_use != in_use || st.requested != req || st.committed < st.in_use ||
                    st.peak_in_use < st.in_use || st.largest_free > st.free_committed ||
                    !(st.fragmentation >= 0 && st.fragmentation <= 1) || st.reserved != cap)
                    stat_fail++;
            }
        }
        CHECK(overlap == 0, "seed %d: %d overlapping blocks", seed, overlap);
        CHECK(misaligned == 0, "seed %d: %d misaligned or undersized blocks", seed, misaligned);
        CHECK(corrupt == 0, "seed %d: %d blocks lost their contents", seed, corrupt);
        CHECK(bad_msg == 0, "seed %d: %d refusals without 'exhausted' in the message", seed, bad_msg);
        CHECK(check_fail == 0, "seed %d: %d invariant checks failed", seed, check_fail);
        CHECK(stat_fail == 0, "seed %d: %d statistics snapshots inconsistent with the live blocks", seed, stat_fail);
        CHECK(exhausted > 0, "seed %d: the sequence never filled the 32 MiB pool (test too weak)", seed);
        moerl_pool_stats st;
        moerl_pool_get_stats(p, &st);
        CHECK(st.failures == (uint64_t)exhausted, "seed %d: failures %llu, refusals seen %d", seed,
              (unsigned long long)st.failures, exhausted);
        while (n > 0) {
            if (!stamp_ok(&live[n - 1])) corrupt++;
            moerl_pool_free(p, live[--n].p);
        }
        CHECK(corrupt == 0, "seed %d: contents lost before the final frees", seed);
        moerl_pool_get_stats(p, &st);
        CHECK(st.in_use == 0 && st.requested == 0 && st.allocs == st.frees, "seed %d: in_use %zu requested %zu "
              "allocs %llu frees %llu after freeing all", seed, st.in_use, st.requested,
              (unsigned long long)st.allocs, (unsigned long long)st.frees);
        CHECK(moerl_pool_check(p) == MOERL_OK, "seed %d: %s", seed, moerl_last_error());
        /* all buddies merged back: every max block is available again, and then nothing is */
        int got = 0;
        void *tops[8];
        for (int i = 0; i < 8; i++)
            if ((tops[i] = moerl_pool_alloc(p, maxb))) got++;
        CHECK(got == 8, "seed %d: %d of 8 max blocks after freeing all (buddies not merged)", seed, got);
        CHECK(moerl_pool_alloc(p, minb) == NULL, "seed %d: a full pool served another block", seed);
        moerl_pool_destroy(p);
    }
}

static void test_errors(void) {
    CHECK(moerl_pool_create(&(moerl_pool_config){3 * MiB, 8 * MiB, 0, 0.3}) == NULL &&
              strstr(moerl_last_error(), "min_block"),
          "min_block not a power of two: %s", moerl_last_error());
    CHECK(moerl_pool_create(&(moerl_pool_config){1024, 8 * MiB, 0, 0.3}) == NULL, "min_block below the page size");
    CHECK(moerl_pool_create(&(moerl_pool_config){4 * MiB, 2 * MiB, 0, 0.3}) == NULL &&
              strstr(moerl_last_error(), "max_block"),
          "max_block below min_block: %s", moerl_last_error());
    CHECK(moerl_pool_create(&(moerl_pool_config){4 * MiB, 8 * MiB, 0, 1.5}) == NULL &&
              strstr(moerl_last_error(), "reserve_frac"),
          "reserve 1.5: %s", moerl_last_error());
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){64 * KiB, 1 * MiB, 2 * MiB, 0.3});
    CHECK(p != NULL, "create: %s", moerl_last_error());
    if (!p) return;
    CHECK(moerl_pool_alloc(p, MiB + 1) == NULL && strstr(moerl_last_error(), "maximum block"),
          "oversize request: %s", moerl_last_error());
    CHECK(moerl_pool_block_size(p, MiB + 1) == 0 && moerl_pool_block_size(p, 0) == 64 * KiB &&
              moerl_pool_block_size(p, 64 * KiB + 1) == 128 * KiB,
          "block sizes");
    char *a = moerl_pool_alloc(p, 100);
    char *b = moerl_pool_alloc(p, MiB - 64 * KiB - 1); /* a large block: 15 granules of the second MiB */
    CHECK(a && b, "two allocations");
    CHECK(moerl_pool_alloc(p, 64 * KiB) != NULL, "the rest of the first max block serves a min block");
    moerl_pool_stats st;
    moerl_pool_get_stats(p, &st);
    const uint64_t fails = st.failures;
    CHECK(fails == 1, "one failure counted (the oversize one), got %llu", (unsigned long long)fails);
    CHECK(moerl_pool_free(p, a + 64) == MOERL_ERR && strstr(moerl_last_error(), "not the start"),
          "interior pointer refused: %s", moerl_last_error());
    int local;
    CHECK(moerl_pool_free(p, &local) == MOERL_ERR && strstr(moerl_last_error(), "outside"), "foreign pointer");
    CHECK(moerl_pool_free(p, a) == MOERL_OK, "free");
    CHECK(moerl_pool_free(p, a) == MOERL_ERR && strstr(moerl_last_error(), "double free"), "double free refused");
    CHECK(moerl_pool_check(p) == MOERL_OK, "state intact after refused frees: %s", moerl_last_error());
    CHECK(moerl_pool_free(p, NULL) == MOERL_OK, "free(NULL)");
    moerl_pool_destroy(p);
    moerl_pool_destroy(NULL);
    size_t v = 0;
    CHECK(moerl_parse_bytes("4M", "X", &v) == MOERL_OK && v == 4 * MiB, "4M");
    CHECK(moerl_parse_bytes("2GiB", "X", &v) == MOERL_OK && v == ((size_t)2 << 30), "2GiB");
    CHECK(moerl_parse_bytes("65536", "X", &v) == MOERL_OK && v == 65536, "65536");
    CHECK(moerl_parse_bytes("4Q", "MOERL_POOL_MIN_BLOCK", &v) == MOERL_ERR &&
              strstr(moerl_last_error(), "MOERL_POOL_MIN_BLOCK"),
          "bad suffix names the variable: %s", moerl_last_error());
    CHECK(moerl_parse_bytes("-1", "X", &v) == MOERL_ERR, "negative");
}

/* reserve_frac: after freeing everything, the pool keeps ⌊reserve · peak⌋ rounded to whole units
 * committed (it decommits whole units only while the excess is at least one unit). */
static void test_reserve(void) {
    const size_t u = 64 * KiB;
    const double reserves[3] = {0.0, 0.3, 1.0};
    const size_t expect_units[3] = {0, 3, 10}; /* peak 10 units: 0, 3, 10 units kept */
    for (int r = 0; r < 3; r++) {
        moerl_pool *p = moerl_pool_create(&(moerl_pool_config){u, 16 * u, 64 * u, reserves[r]});
        void *b[10];
        for (int i = 0; i < 10; i++) b[i] = moerl_pool_alloc(p, u);
        moerl_pool_stats st;
        moerl_pool_get_stats(p, &st);
        CHECK(st.committed == 10 * u && st.in_use == 10 * u, "reserve %.1f: committed %zu in use %zu", reserves[r],
              st.committed, st.in_use);
        for (int i = 0; i < 10; i++) moerl_pool_free(p, b[i]);
        moerl_pool_get_stats(p, &st);
        CHECK(st.committed == expect_units[r] * u, "reserve %.1f: %zu bytes kept committed, want %zu", reserves[r],
              st.committed, expect_units[r] * u);
        CHECK(st.peak_committed == 10 * u && st.peak_in_use == 10 * u, "peaks");
        /* the kept memory serves the next burst without committing again */
        const uint64_t commits = st.commits;
        void *c = moerl_pool_alloc(p, u);
        moerl_pool_get_stats(p, &st);
        if (expect_units[r] > 0)
            CHECK(st.commits == commits, "reserve %.1f: a 1-unit request after the burst committed again",
                  reserves[r]);
        else
            CHECK(st.commits == commits + 1, "reserve 0: the request must commit");
        moerl_pool_free(p, c);
        CHECK(moerl_pool_check(p) == MOERL_OK, "%s", moerl_last_error());
        moerl_pool_destroy(p);
    }
}

/* Expandable segment: one reservation, commit grows in place, no copy, released memory comes back zeroed. */
static void test_expandable(void) {
    const size_t u = 64 * KiB;
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){u, 8 * u, 256 * u, 0.0});
    moerl_pool_stats st;
    moerl_pool_get_stats(p, &st);
    CHECK(st.reserved == 256 * u && st.committed == 0, "fresh pool: reserved %zu committed %zu", st.reserved,
          st.committed);
    unsigned char *first = moerl_pool_alloc(p, u);
    memset(first, 0xAB, u);
    size_t last_committed = u;
    int grew = 1, outside = 0;
    void *more[64];
    for (int i = 0; i < 64; i++) {
        more[i] = moerl_pool_alloc(p, 2 * u);
        if (!moerl_pool_owns(p, more[i])) outside++;
        moerl_pool_get_stats(p, &st);
        if (st.committed <= last_committed || st.reserved != 256 * u) grew = 0;
        last_committed = st.committed;
    }
    CHECK(grew, "committed grows with each allocation, reserved stays");
    CHECK(outside == 0, "%d blocks outside the one reservation", outside);
    moerl_pool_get_stats(p, &st);
    CHECK(st.committed == st.in_use, "reserve 0: committed %zu == in use %zu", st.committed, st.in_use);
    int intact = 1;
    for (size_t i = 0; i < u; i++) intact &= first[i] == 0xAB;
    CHECK(intact, "the first block kept its address and contents while the pool grew");
    for (int i = 0; i < 64; i++) moerl_pool_free(p, more[i]);
    moerl_pool_free(p, first);
    moerl_pool_get_stats(p, &st);
    CHECK(st.committed == 0 && st.decommits > 0, "all released: committed %zu", st.committed);
    unsigned char *again = moerl_pool_alloc(p, u);
    CHECK(again == first, "lowest address reused");
    int zero = 1;
    for (size_t i = 0; i < u; i++) zero &= again[i] == 0;
    CHECK(zero, "decommitted memory comes back zeroed");
    moerl_pool_free(p, again);
    moerl_pool_destroy(p);
}

/* Fragmentation = 1 − largest free / free, on an exactly known layout. */
static void test_fragmentation(void) {
    const size_t u = 64 * KiB;
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){u, 4 * u, 4 * u, 1.0});
    void *b[4];
    for (int i = 0; i < 4; i++) b[i] = moerl_pool_alloc(p, u);
    moerl_pool_stats st;
    moerl_pool_get_stats(p, &st);
    CHECK(st.fragmentation == 0 && st.free_committed == 0, "full pool: nothing free");
    moerl_pool_free(p, b[0]);
    moerl_pool_free(p, b[2]);
    moerl_pool_get_stats(p, &st);
    /* exact: two free 1-unit blocks that are not buddies → largest u of 2u free */
    CHECK(st.free_committed == 2 * u && st.largest_free == u && st.fragmentation == 0.5,
          "free %zu largest %zu fragmentation %g (want 0.5)", st.free_committed, st.largest_free, st.fragmentation);
    CHECK(moerl_pool_alloc(p, 2 * u) == NULL, "2 units free but not contiguous: refused");
    moerl_pool_free(p, b[1]); /* merges with both free neighbours: 0..2 (a buddy system would stop at 0..1) */
    moerl_pool_get_stats(p, &st);
    CHECK(st.largest_free == 3 * u && st.free_committed == 3 * u && st.fragmentation == 0,
          "after coalescing: largest %zu free %zu", st.largest_free, st.free_committed);
    moerl_pool_free(p, b[3]);
    moerl_pool_get_stats(p, &st);
    CHECK(st.fragmentation == 0 && st.largest_free == 4 * u, "all merged: fragmentation %g", st.fragmentation);
    moerl_pool_destroy(p);
}


/* Best fit, splitting and coalescing on an exactly known layout (large class: requests > 1 MiB). */
static void test_best_fit_split_coalesce(void) {
    const size_t u = 64 * KiB;
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){u, 256 * u, 256 * u, 1.0});
    CHECK(p != NULL, "create: %s", moerl_last_error());
    if (!p) return;
    char *a = moerl_pool_alloc(p, 20 * u), *b = moerl_pool_alloc(p, 30 * u), *c = moerl_pool_alloc(p, 20 * u);
    char *d = moerl_pool_alloc(p, 40 * u), *e = moerl_pool_alloc(p, 20 * u);
    CHECK(a && b == a + 20 * u && c == a + 50 * u && d == a + 70 * u && e == a + 110 * u,
          "fresh blocks are cut from the low end, back to back");
    moerl_pool_free(p, b); /* holes: 30u at 20u, 40u at 70u; tail 126u at 130u */
    moerl_pool_free(p, d);
    char *x = moerl_pool_alloc(p, 25 * u - 100);
    CHECK(x == a + 20 * u, "best fit: 25u goes to the 30u hole, not the 40u one or the tail (offset %td u)",
          (x - a) / (ptrdiff_t)u);
    char *y = moerl_pool_alloc(p, 35 * u);
    CHECK(y == a + 70 * u, "best fit: 35u goes to the 40u hole (offset %td u)", (y - a) / (ptrdiff_t)u);
    char *z = moerl_pool_alloc(p, 5 * u); /* small: a new 2 MiB chunk, never the 5u large remainders */
    CHECK(z == a + 130 * u, "small request served from a chunk cut from the tail (offset %td u)",
          (z - a) / (ptrdiff_t)u);
    CHECK(moerl_pool_check(p) == MOERL_OK, "after splits: %s", moerl_last_error());
    moerl_pool_stats st;
    moerl_pool_get_stats(p, &st);
    CHECK(st.in_use == (20 + 25 + 20 + 35 + 20 + 5) * u && st.requested == st.in_use - 100, "in use %zu", st.in_use);
    moerl_pool_free(p, x); /* merges with the 5u remainder after it: 30u at 20u */
    moerl_pool_free(p, c); /* and with it: 50u at 20u (y at 70u is used) */
    moerl_pool_free(p, a); /* and 0..70u */
    CHECK(moerl_pool_check(p) == MOERL_OK, "after coalescing: %s", moerl_last_error());
    char *w = moerl_pool_alloc(p, 70 * u);
    CHECK(w == a, "the three freed neighbours and the remainder coalesced into one 70u block at the start");
    moerl_pool_free(p, w);
    moerl_pool_free(p, y);
    moerl_pool_free(p, z); /* its chunk is wholly free again: back to the large class */
    moerl_pool_free(p, e);
    CHECK(moerl_pool_check(p) == MOERL_OK, "all freed: %s", moerl_last_error());
    char *all = moerl_pool_alloc(p, 256 * u);
    CHECK(all == a, "everything coalesced into one block spanning the reservation");
    moerl_pool_free(p, all);
    moerl_pool_destroy(p);
}

/* Size classes: small requests share chunks and never take large free memory; an emptied chunk returns. */
static void test_size_classes(void) {
    const size_t u = 64 * KiB;
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){u, 128 * u, 128 * u, 1.0}); /* chunk 32u */
    char *small[40];
    for (int i = 0; i < 40; i++) small[i] = moerl_pool_alloc(p, (size_t)(1 + i % 3) * 1000);
    CHECK(small[0] && small[31] == small[0] + 31 * u && small[32] == small[0] + 32 * u,
          "40 one-granule requests fill one chunk, then the next");
    for (int i = 0; i < 40; i += 2) moerl_pool_free(p, small[i]);
    char *big = moerl_pool_alloc(p, 20 * u); /* large: not in the chunks' holes */
    CHECK(big == small[0] + 64 * u, "a large request takes the large free range after the chunks (offset %td u)",
          (big - small[0]) / (ptrdiff_t)u);
    char *s2 = moerl_pool_alloc(p, 2 * u);
    CHECK(s2 == small[0] + 40 * u, "2u: best fit among the chunks' free blocks (1u holes, and the second chunk's "
          "24u rest at 40u), not the large range (offset %td u)", (s2 - small[0]) / (ptrdiff_t)u);
    moerl_pool_free(p, s2);
    for (int i = 1; i < 40; i += 2) moerl_pool_free(p, small[i]);
    CHECK(moerl_pool_check(p) == MOERL_OK, "%s", moerl_last_error());
    moerl_pool_free(p, big);
    char *all = moerl_pool_alloc(p, 128 * u);
    CHECK(all == small[0], "emptied chunks went back to the large class and coalesced");
    moerl_pool_free(p, all);
    moerl_pool_destroy(p);
}

/* Growth: committed memory grows only when nothing cached is left, so its peak is the peak in use. */
static void test_growth_peak(void) {
    const size_t u = 64 * KiB;
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){u, 256 * u, 256 * u, 1.0});
    void *a = moerl_pool_alloc(p, 30 * u);
    void *keep = moerl_pool_alloc(p, 20 * u);
    moerl_pool_free(p, a); /* 30u cached (reserve 1.0 keeps it) */
    moerl_pool_stats st;
    moerl_pool_get_stats(p, &st);
    CHECK(st.committed == 50 * u, "freed memory stays cached: committed %zu", st.committed / u);
    void *big = moerl_pool_alloc(p, 40 * u); /* fits no cached hole: 40u new, 30u cached released first */
    moerl_pool_get_stats(p, &st);
    CHECK(st.committed == 60 * u && st.peak_committed == 60 * u && st.peak_in_use == 60 * u && st.decommits == 1,
          "grow after releasing the cache: committed %zu peak %zu peak in use %zu decommits %llu", st.committed / u,
          st.peak_committed / u, st.peak_in_use / u, (unsigned long long)st.decommits);
    CHECK(st.peak_requested == 60 * u && st.requested_at_peak == 60 * u && st.peak_fragmentation == 0,
          "peak fragmentation %g", st.peak_fragmentation);
    void *c = moerl_pool_alloc(p, 17 * u + 1); /* 18u: commits 18 more; 1 granule minus 1 byte lost */
    moerl_pool_get_stats(p, &st);
    CHECK(st.peak_committed == 78 * u && st.requested_at_peak == 77 * u + 1 &&
              st.peak_fragmentation == 1.0 - (77.0 * u + 1) / (78.0 * u),
          "peak fragmentation = 1 − requested / committed at the peak: %g", st.peak_fragmentation);
    moerl_pool_free(p, c);
    moerl_pool_free(p, big);
    moerl_pool_free(p, keep);
    CHECK(moerl_pool_check(p) == MOERL_OK, "%s", moerl_last_error());
    moerl_pool_destroy(p);
}

/* Shadow model: every byte of every live block holds its own pattern until it is freed, blocks never
 * overlap, committed never exceeds the peak in use, invariants hold throughout. */
static unsigned char pat(uint32_t id, size_t i) { return (unsigned char)((id * 2654435761u) >> 24 ^ (i * 31 + id)); }

static void test_shadow_model(void) {
    const size_t minb = 4096, maxb = 1 * MiB, cap = 64 * MiB;
    for (int seed = 1; seed <= 3; seed++) {
        moerl_pool *p = moerl_pool_create(&(moerl_pool_config){minb, maxb, cap, seed == 1 ? 0.0 : 0.3});
        struct { unsigned char *p; size_t n; uint32_t id; } live[256];
        int n = 0, bad_bytes = 0, overlap = 0, check_fail = 0, over_peak = 0, refused = 0;
        uint64_t s = 0x1234567ull * (uint64_t)seed;
        for (uint32_t op = 1; op <= 3000; op++) {
            if (n < 256 && (n == 0 || xs(&s) % 100 < 52)) {
                const int lg = (int)(xs(&s) % 21);
                const size_t req = 1 + xs(&s) % ((size_t)1 << lg);
                unsigned char *q = moerl_pool_alloc(p, req);
                if (!q) {
                    refused++;
                    continue;
                }
                for (int i = 0; i < n; i++)
                    if (q < live[i].p + live[i].n && live[i].p < q + req) overlap++;
                for (size_t i = 0; i < req; i++) q[i] = pat(op, i);
                live[n].p = q, live[n].n = req, live[n].id = op;
                n++;
            } else {
                const int k = (int)(xs(&s) % (uint64_t)n);
                for (size_t i = 0; i < live[k].n; i++) bad_bytes += live[k].p[i] != pat(live[k].id, i);
                moerl_pool_free(p, live[k].p);
                live[k] = live[--n];
            }
            if (op % 50 == 0) {
                check_fail += moerl_pool_check(p) != MOERL_OK;
                moerl_pool_stats st;
                moerl_pool_get_stats(p, &st);
                over_peak += st.committed > st.peak_in_use || st.peak_committed > st.peak_in_use;
            }
            if (op % 500 == 0) /* every byte of every live block */
                for (int k = 0; k < n; k++)
                    for (size_t i = 0; i < live[k].n; i++) bad_bytes += live[k].p[i] != pat(live[k].id, i);
        }
        CHECK(bad_bytes == 0 && overlap == 0, "seed %d: %d bytes changed, %d overlaps", seed, bad_bytes, overlap);
        CHECK(check_fail == 0, "seed %d: %d invariant checks failed (%s)", seed, check_fail, moerl_last_error());
        CHECK(over_peak == 0, "seed %d: committed above the peak in use %d times", seed, over_peak);
        CHECK(refused == 0, "seed %d: %d refusals in a pool that never fills", seed, refused);
        while (n > 0) moerl_pool_free(p, live[--n].p);
        moerl_pool_stats st;
        moerl_pool_get_stats(p, &st);
        CHECK(st.in_use == 0 && moerl_pool_check(p) == MOERL_OK && moerl_pool_alloc(p, maxb) != NULL,
              "seed %d: all returned and coalesced", seed);
        moerl_pool_destroy(p);
    }
}

typedef struct {
    moerl_pool *p;
    int seed, bad;
} thr_arg;

static void *thr_main(void *arg) {
    thr_arg *a = arg;
    live_t live[64];
    int n = 0;
    uint64_t s = 0xABCDEF12345ull + (uint64_t)a->seed;
    for (int op = 0; op < 3000; op++) {
        if (n < 64 && (n == 0 || xs(&s) % 2)) {
            const size_t req = 1 + xs(&s) % (256 * KiB);
            unsigned char *q = moerl_pool_alloc(a->p, req);
            if (!q) continue;
            live[n] = (live_t){q, req, 0, (unsigned char)(a->seed * 64 + n)};
            stamp(&live[n++]);
        } else {
            const int i = (int)(xs(&s) % (uint64_t)n);
            if (!stamp_ok(&live[i])) a->bad++;
            if (moerl_pool_free(a->p, live[i].p) != MOERL_OK) a->bad++;
            live[i] = live[--n];
        }
    }
    while (n > 0) {
        if (!stamp_ok(&live[n - 1])) a->bad++;
        moerl_pool_free(a->p, live[--n].p);
    }
    return NULL;
}

static void test_threads(void) {
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){64 * KiB, 1 * MiB, 64 * MiB, 0.3});
    pthread_t t[3];
    thr_arg a[3];
    for (int i = 0; i < 3; i++) {
        a[i] = (thr_arg){p, i + 1, 0};
        pthread_create(&t[i], NULL, thr_main, &a[i]);
    }
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        bad += a[i].bad;
    }
    CHECK(bad == 0, "%d corrupted blocks or failed frees across threads", bad);
    moerl_pool_stats st;
    moerl_pool_get_stats(p, &st);
    CHECK(st.in_use == 0 && st.allocs == st.frees && moerl_pool_check(p) == MOERL_OK, "threads: all returned (%s)",
          moerl_last_error());
    moerl_pool_destroy(p);
}

/* The buffer layer with MOERL_ALLOC=pool (set here, before its first use): zero-filled 64-byte aligned
 * buffers from the pool, a refused request served by malloc and counted. */
static void test_buffer_layer(void) {
    setenv("MOERL_ALLOC", "pool", 1);
    setenv("MOERL_POOL_MIN_BLOCK", "64K", 1);
    setenv("MOERL_POOL_MAX_BLOCK", "1M", 1);
    setenv("MOERL_POOL_CAPACITY", "4M", 1);
    CHECK(moerl_alloc_current() == MOERL_ALLOC_POOL, "MOERL_ALLOC=pool selected");
    unsigned char *a = moerl_buf_alloc(1000, "test");
    int zero = 1;
    for (int i = 0; i < 1000; i++) zero &= a[i] == 0;
    CHECK(zero && (uintptr_t)a % 64 == 0, "zero-filled, aligned");
    /* placed as glibc places its mmapped buffers: 64 bytes (MOERL_POOL_COLOUR's default) past the block's
     * start, which is granule-aligned */
    CHECK((uintptr_t)a % (64 * KiB) == 64, "buffer 64 bytes past its block's start: %p", (void *)a);
    memset(a, 1, 1000);
    moerl_buf_free(a);
    unsigned char *b = moerl_buf_alloc(1000, "test"); /* same block again: zeroed by the layer */
    zero = 1;
    for (int i = 0; i < 1000; i++) zero &= b[i] == 0;
    CHECK(zero && b == a, "reused block zero-filled");
    moerl_pool_stats st;
    CHECK(moerl_alloc_pool_stats(&st) == MOERL_OK && st.in_use == 64 * KiB && st.reserved == 4 * MiB,
          "pool stats through the layer: in use %zu", st.in_use);
    unsigned char *z = moerl_buf_alloc(0, "zero"); /* zero bytes: a valid, aligned buffer of its own */
    CHECK(z != NULL && z != b && (uintptr_t)z % 64 == 0, "zero-size buffer");
    moerl_buf_free(z);
    unsigned char *big = moerl_buf_alloc(2 * MiB, "too_big"); /* above the 1 MiB max block: malloc fallback */
    CHECK(big != NULL && big[2 * MiB - 1] == 0, "fallback served and zeroed");
    moerl_alloc_pool_stats(&st);
    CHECK(st.fallbacks == 1 && st.failures == 1, "fallback counted: %llu", (unsigned long long)st.fallbacks);
    moerl_buf_free(big);
    moerl_buf_free(b);
    moerl_buf_free(NULL);
    moerl_alloc_pool_stats(&st);
    CHECK(st.in_use == 0, "all returned through the layer");
    /* a job's choice after the first buffer: accepted when it agrees, refused naming the key when not */
    moerl_alloc_choice ch = {MOERL_ALLOC_MALLOC, -1, "trainer.allocator", "trainer.allocator_reserve"};
    CHECK(moerl_alloc_select(&ch) == MOERL_ERR &&
              strstr(moerl_last_error(), "trainer.allocator=malloc: this process already allocates its buffers with pool"),
          "select after first use, other kind: %s", moerl_last_error());
    ch.kind = MOERL_ALLOC_POOL;
    ch.reserve_frac = 0.3; /* MOERL_POOL_RESERVE unset: the pool's default */
    CHECK(moerl_alloc_select(&ch) == MOERL_OK, "select agreeing with the allocator in use: %s", moerl_last_error());
    ch.reserve_frac = 0.5;
    CHECK(moerl_alloc_select(&ch) == MOERL_ERR && strstr(moerl_last_error(), "trainer.allocator_reserve=0.5") &&
              strstr(moerl_last_error(), "another reserve"),
          "select with another reserve: %s", moerl_last_error());
    ch.reserve_frac = 1.5;
    CHECK(moerl_alloc_select(&ch) == MOERL_ERR && strstr(moerl_last_error(), "expected a fraction in [0, 1]"),
          "reserve out of range: %s", moerl_last_error());
}

/* Zero-size requests take one granule each (distinct, aligned, writable); a full reservation refuses
 * the next request with a message naming both sizes, what is in use and the variable to raise, changes
 * nothing, and serves the same request again once memory is freed. 2 MiB reserved with a 1 MiB max
 * block: the small class's chunk is 1 MiB (small requests: up to 512 KiB), the large class the other. */
static void test_zero_size_and_exhaustion(void) {
    const size_t u = 64 * KiB;
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){u, 1 * MiB, 2 * MiB, 0.3});
    CHECK(p != NULL, "create: %s", moerl_last_error());
    if (!p) return;
    unsigned char *z1 = moerl_pool_alloc(p, 0), *z2 = moerl_pool_alloc(p, 0);
    moerl_pool_stats st;
    moerl_pool_get_stats(p, &st);
    CHECK(z1 && z2 && z1 != z2 && (uintptr_t)z1 % u == 0 && (uintptr_t)z2 % u == 0,
          "zero-size: two distinct granule-aligned blocks");
    if (z1 && z2) z1[0] = z2[u - 1] = 7; /* writable over the whole granule */
    CHECK(st.in_use == 2 * u && st.requested == 2, "zero-size counts one granule, one byte: in use %zu req %zu",
          st.in_use, st.requested);
    void *s1 = moerl_pool_alloc(p, 7 * u), *s2 = moerl_pool_alloc(p, 7 * u); /* the small chunk is full */
    void *big = moerl_pool_alloc(p, 1 * MiB);                                  /* the large MiB is taken */
    CHECK(s1 && s2 && big, "the whole reservation handed out: %s", moerl_last_error());
    moerl_pool_get_stats(p, &st);
    const size_t committed = st.committed;
    CHECK(moerl_pool_alloc(p, 100) == NULL, "a full pool refuses");
    const char *e = moerl_last_error();
    CHECK(strstr(e, "exhausted") && strstr(e, "no free block of 65536 bytes") &&
              strstr(e, "request of 100 bytes") && strstr(e, "2097152 of 2097152 reserved") &&
              strstr(e, "MOERL_POOL_CAPACITY"),
          "out-of-memory message names the sizes, the use and the variable: %s", e);
    moerl_pool_get_stats(p, &st);
    CHECK(st.failures == 1 && st.committed == committed && moerl_pool_check(p) == MOERL_OK,
          "refusal counted, nothing changed: %s", moerl_last_error());
    moerl_pool_free(p, z2);
    void *again = moerl_pool_alloc(p, 100);
    CHECK(again == z2, "the freed granule serves the refused request");
    void *pp[4] = {again, z1, s1, s2};
    for (int i = 0; i < 4; i++) moerl_pool_free(p, pp[i]);
    moerl_pool_free(p, big);
    moerl_pool_get_stats(p, &st);
    CHECK(st.in_use == 0 && moerl_pool_check(p) == MOERL_OK, "all returned and merged: %s", moerl_last_error());
    moerl_pool_destroy(p);
}

/* moerl_pool_alloc_zeroed: a block over cached (dirty, committed) pages and fresh ones reads as zero
 * throughout; the fresh pages are committed, the cached ones reused. */
static void test_alloc_zeroed(void) {
    const size_t u = 64 * KiB;
    moerl_pool *p = moerl_pool_create(&(moerl_pool_config){u, 4 * MiB, 16 * MiB, 1.0}); /* keep what is freed */
    CHECK(p != NULL, "create: %s", moerl_last_error());
    if (!p) return;
    unsigned char *a = moerl_pool_alloc(p, 3 * u);
    memset(a, 0xAB, 3 * u);
    moerl_pool_free(p, a);
    moerl_pool_stats st;
    moerl_pool_get_stats(p, &st);
    const size_t committed = st.committed;
    unsigned char *b = moerl_pool_alloc_zeroed(p, 5 * u);
    int zero = 1;
    for (size_t i = 0; i < 5 * u; i++) zero &= b[i] == 0;
    moerl_pool_get_stats(p, &st);
    CHECK(b == a && zero, "dirty cached pages and fresh ones read zero");
    CHECK(committed == 3 * u && st.committed == 5 * u && moerl_pool_check(p) == MOERL_OK,
          "3 units reused, 2 committed: %zu → %zu", committed, st.committed);
    moerl_pool_destroy(p);
}

int main(void) {
    test_alloc_zeroed();
    test_errors();
    test_random_sequences();
    test_reserve();
    test_expandable();
    test_fragmentation();
    test_best_fit_split_coalesce();
    test_size_classes();
    test_growth_peak();
    test_zero_size_and_exhaustion();
    test_shadow_model();
    test_threads();
    test_buffer_layer();
    TEST_MAIN_END();
}
