/* UTF-8 checks and repair (utf8.h). */
#include "base/utf8.h"

#include <string.h>

#include "base/common.h"

int moerl_utf8_len(const unsigned char *s, size_t left) {
    if (left == 0) return 0;
    const unsigned c = s[0];
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || (size_t)n > left) return 0;
    unsigned cp = n == 1 ? c : n == 2 ? c & 31 : n == 3 ? c & 15 : c & 7;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 63);
    }
    static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

char *moerl_utf8_repair(const char *s, size_t len, int keep_nul, size_t *out_len) {
    char *o = xmalloc(3 * len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        const int k = moerl_utf8_len((const unsigned char *)s + i, len - i);
        if (k > 0 && (keep_nul || s[i] != 0)) {
            memcpy(o + n, s + i, (size_t)k);
            n += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(o + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        }
    }
    o[n] = 0;
    if (out_len) *out_len = n;
    return o;
}
