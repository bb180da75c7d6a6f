/* moerl — a set of strings: open addressing with linear probing over FNV-1a 64-bit hashes
 * (Fowler–Noll–Vo, the public FNV-1a definition), table size a power of two at least twice the
 * expected count, grown by doubling when more than half full. The set owns copies of its strings.
 * Used where moerl needs "seen before?" over text keys (the task generators' train/test
 * disjointness check, data/tasks.h). Not thread-safe: one set per thread. */
#ifndef MOERL_HASHSET_H
#define MOERL_HASHSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char **slot; /* [cap]; NULL = empty */
    size_t cap;  /* a power of two ≥ 64 */
    size_t n;    /* strings held */
} strset;

/* An empty set sized for about `expect` strings without growing (any expect ≥ 0). */
void strset_init(strset *t, size_t expect);

/* Insert a copy of s (NUL-terminated, any bytes). Returns true if s was new, false if it was
 * already in the set (the set is then unchanged). */
bool strset_add(strset *t, const char *s);

/* true if s is in the set. */
bool strset_has(const strset *t, const char *s);

/* Free every string and the table; the set is left empty (strset_init again to reuse it). */
void strset_free(strset *t);

/* FNV-1a 64-bit hash of the NUL-terminated string s. */
uint64_t fnv1a64(const char *s);

#endif
