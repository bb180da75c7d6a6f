/* The template delta of a tool turn (tool_turn_ids, data/tool_calls.h). */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/tool_calls.h"

/* End offsets of the template-written occurrences of eot in text[0..len) (mask tpl): the count, and
 * the end of the k-th (1-based) in *end_k when k > 0. */
static int count_eot(const char *text, const uint8_t *tpl, size_t len, const char *eot, int k, size_t *end_k) {
    const size_t m = strlen(eot);
    int c = 0;
    for (size_t i = 0; i + m <= len; i++) {
        if (memcmp(text + i, eot, m)) continue;
        int all = 1;
        for (size_t j = 0; j < m; j++) all &= tpl[i + j];
        if (!all) continue;
        if (++c == k) *end_k = i + m;
        i += m - 1;
    }
    return c;
}

/* A short printable excerpt of s[0..n) for messages. */
static void excerpt(char *dst, size_t cap, const char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        const unsigned char ch = (unsigned char)s[i];
        if (ch == '\n') { dst[o++] = '\\'; dst[o++] = 'n'; }
        else dst[o++] = ch < 32 ? '?' : (char)ch;
    }
    dst[o] = 0;
}

int tool_turn_ids(const tokenizer *t, const chat_msg *msgs, int n_turn, int n, const chat_extra *x, const char *eot,
                  tok_seq *out) {
    if (n_turn < 1 || n <= n_turn)
        return moerl_errorf("tool turn: %d messages before the tool turn and %d in all (need ≥ 1, and tool messages after)",
                            n_turn, n);
    if (!msgs[n_turn - 1].role || strcmp(msgs[n_turn - 1].role, "assistant"))
        return moerl_errorf("tool turn: message %d (before the tool messages) has role '%s', expected assistant",
                            n_turn - 1, msgs[n_turn - 1].role ? msgs[n_turn - 1].role : "(none)");
    if (!eot || !*eot) return moerl_errorf("tool turn: no end-of-turn text");
    char *pt = NULL, *ft = NULL;
    uint8_t *pm = NULL, *fm = NULL;
    size_t pl = 0, fl = 0, pe = 0, b = 0;
    int rc = tokenizer_chat_render_masked(t, msgs, n_turn, x, false, &pt, &pm, &pl);
    if (rc == MOERL_OK) rc = tokenizer_chat_render_masked(t, msgs, n, x, true, &ft, &fm, &fl);
    if (rc != MOERL_OK) {
        moerl_error_prefix("tool turn: ");
        goto done;
    }
    const int k = count_eot(pt, pm, pl, eot, 0, NULL);
    if (k == 0) {
        rc = moerl_errorf("tool turn: the chat template writes no end-of-turn '%s' for the conversation up to the "
                          "assistant turn", eot);
        goto done;
    }
    count_eot(pt, pm, pl, eot, k, &pe);
    const size_t tail = pl - pe; /* what the template writes after the turn's eot, e.g. "\n" */
    if (count_eot(ft, fm, fl, eot, k, &b) < k || fl - b <= tail || memcmp(ft + b, pt + pe, tail) ||
        memcmp(fm + b, pm + pe, tail)) {
        char want[64], got[64];
        excerpt(want, sizeof want, pt + pe, tail);
        excerpt(got, sizeof got, b ? ft + b : ft, b ? MOERL_MIN(fl - b, (size_t)40) : 0);
        rc = moerl_errorf("tool turn: the template's text with the tool messages does not extend the conversation at the "
                          "end of the assistant turn: after its end-of-turn '%s' it writes \"%s\" where the turn alone "
                          "has \"%s\"", eot, got, want);
        goto done;
    }
    rc = tokenizer_encode_masked(t, ft + b, fl - b, fm + b, out);
done:
    free(pt); free(pm); free(ft); free(fm);
    return rc;
}
