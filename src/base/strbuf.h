/* moerl — a growable, always NUL-terminated byte string (config dumps, answer normalisation).
 * Zero-initialise (strbuf b = {0}); free b.p, or take it with strbuf_take. Allocation failure is
 * fatal (xrealloc). */
#ifndef MOERL_STRBUF_H
#define MOERL_STRBUF_H

#include <stddef.h>

typedef struct {
    char *p;         /* the bytes, NUL-terminated once anything was appended; NULL before */
    size_t n, cap;   /* length (without the NUL) and capacity in bytes */
} strbuf;

/* Append s[0..n) (may contain NULs). */
void strbuf_putn(strbuf *b, const char *s, size_t n);
/* Append the C string s. */
void strbuf_puts(strbuf *b, const char *s);
/* Append printf(fmt, ...) of any length. */
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The string (heap, never NULL: "" when nothing was appended); the caller frees it. */
char *strbuf_take(strbuf *b);

#endif
