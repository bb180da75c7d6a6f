/* moerl — the byte-level BPE's split regex: the tokenizer.json pattern (Oniguruma syntax, as the
 * `tokenizers` library runs it) rewritten where PCRE2 differs, then compiled (see bpe.h). */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/bpe_internal.h"

/* Hugging Face's `tokenizers` runs the split regex with Oniguruma, whose Unicode \s is the
 * White_Space property (tab..CR, space, U+0085, and the Z categories); PCRE2's UCP \s adds U+180E
 * (MONGOLIAN VOWEL SEPARATOR, a format character since Unicode 6.3). So \s is spelt out as that
 * set: inside a class as its members, outside as a class, and \S outside a class as the negated
 * class. Returns a heap pattern, or NULL (error set) for what this rewrite does not handle. */
#define WS_SET "\\t-\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
static char *oniguruma_ws(const char *pat, const char *name) {
    size_t n = strlen(pat), o = 0;
    char *out = xmalloc(n * 64 + 1);
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char d = pat[++i];
            if (d == 'Q') {
                free(out);
                moerl_errorf("%s: pre_tokenizer regex: \\Q...\\E quoting is not supported", name);
                return NULL;
            }
            if (d == 's' || (d == 'S' && !in_class)) {
                const char *rep = in_class ? WS_SET : d == 's' ? "[" WS_SET "]" : "[^" WS_SET "]";
                memcpy(out + o, rep, strlen(rep));
                o += strlen(rep);
                continue;
            }
            if (d == 'S') {
                free(out);
                moerl_errorf("%s: pre_tokenizer regex: \\S inside a character class is not supported", name);
                return NULL;
            }
            out[o++] = c;
            out[o++] = d;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            out[o++] = c;
            if (i + 1 < n && pat[i + 1] == '^') out[o++] = pat[++i];
            if (i + 1 < n && pat[i + 1] == ']') out[o++] = pat[++i]; /* a leading ] is a member */
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') { /* [:alpha:] */
            const char *e = strstr(pat + i + 2, ":]");
            size_t k = e ? (size_t)(e - (pat + i)) + 2 : 1;
            memcpy(out + o, pat + i, k);
            o += k;
            i += k - 1;
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

int bpe_compile_pattern(hf_bpe *b, const char *pattern, const char *name) {
    int err;
    PCRE2_SIZE eoff;
    char *pat = oniguruma_ws(pattern, name);
    if (!pat) return MOERL_ERR;
    b->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
    free(pat);
    if (!b->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return moerl_errorf("%s: pre_tokenizer regex does not compile with PCRE2 (offset %zu after spelling out \\s): "
                            "%s", name, (size_t)eoff, (char *)msg);
    }
    b->jit = pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE) == 0;
    return MOERL_OK;
}
