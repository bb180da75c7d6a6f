/* moerl — UTF-8 checks and repair for text that comes from outside (a model's sampled bytes, a
 * program's output) before it goes where valid UTF-8 is required (JSON, chat templates).
 * Layer: base. */
#ifndef MOERL_UTF8_H
#define MOERL_UTF8_H

#include <stddef.h>

/* Length (1..4) of the valid UTF-8 sequence at s[0..left), or 0 when none starts there: a stray
 * continuation byte, an overlong form, a surrogate, a code point above U+10FFFF, a sequence cut
 * short (RFC 3629). A NUL byte is a valid sequence of length 1. */
int moerl_utf8_len(const unsigned char *s, size_t left);
/* s[0..len) with each byte that does not start a valid sequence replaced by U+FFFD (EF BF BD), and
 * with keep_nul = 0 each NUL byte too (the result is then a C string holding all of the text). Heap,
 * NUL-terminated; *out_len (when not NULL) gets its length. */
char *moerl_utf8_repair(const char *s, size_t len, int keep_nul, size_t *out_len);

#endif
