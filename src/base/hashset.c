/* moerl — string set (see hashset.h). */
#include "base/hashset.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

uint64_t fnv1a64(const char *s) {
    uint64_t h = 14695981039346656037ULL; /* the FNV-1a 64-bit offset basis */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

void strset_init(strset *t, size_t expect) {
    t->cap = 64;
    while (t->cap < 2 * expect + 2) t->cap *= 2;
    t->slot = xcalloc(t->cap, sizeof(char *));
    t->n = 0;
}

/* The slot holding s, or the empty slot where it would go. */
static size_t strset_find(const strset *t, const char *s) {
    size_t i = fnv1a64(s) & (t->cap - 1);
    while (t->slot[i] && strcmp(t->slot[i], s) != 0) i = (i + 1) & (t->cap - 1);
    return i;
}

/* Double the table, moving every string (no copies). */
static void strset_grow(strset *t) {
    strset bigger = {xcalloc(2 * t->cap, sizeof(char *)), 2 * t->cap, t->n};
    for (size_t i = 0; i < t->cap; i++)
        if (t->slot[i]) bigger.slot[strset_find(&bigger, t->slot[i])] = t->slot[i];
    free(t->slot);
    *t = bigger;
}

bool strset_add(strset *t, const char *s) {
    size_t i = strset_find(t, s);
    if (t->slot[i]) return false;
    if (2 * (t->n + 1) > t->cap) {
        strset_grow(t);
        i = strset_find(t, s);
    }
    t->slot[i] = xstrdup(s);
    t->n++;
    return true;
}

bool strset_has(const strset *t, const char *s) { return t->slot[strset_find(t, s)] != NULL; }

void strset_free(strset *t) {
    for (size_t i = 0; i < t->cap; i++) free(t->slot[i]);
    free(t->slot);
    memset(t, 0, sizeof *t);
}
