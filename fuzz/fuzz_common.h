/* Shared bits of moerl's libFuzzer targets (fuzz/README.md). Each target defines
 * LLVMFuzzerTestOneInput: it hands the input to one parser of outside input, which must either
 * accept it or fail with an error message, never crash, read out of bounds, leak or allocate out
 * of proportion to the input (libFuzzer's -malloc_limit_mb); on success the target checks a
 * property of the result (usually: written back out and read again, it is the same), and a broken
 * property aborts through FUZZ_ASSERT so libFuzzer records the input. */
#ifndef MOERL_FUZZ_COMMON_H
#define MOERL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_ASSERT(cond, ...)                                                        \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "fuzz property broken at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            abort();                                                                  \
        }                                                                             \
    } while (0)

/* A NUL-terminated heap copy of the input (free()). */
static inline char *fuzz_strndup(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* Every error message must be a non-empty string (a failing parser always says why). */
static inline void fuzz_check_error(void) {
    const char *m = moerl_last_error();
    FUZZ_ASSERT(m && m[0], "a parser failed without a message");
}

#endif
