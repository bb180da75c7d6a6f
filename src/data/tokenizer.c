/* moerl — byte-level tokenizer (see tokenizer.h). */
#include "data/tokenizer.h"

#include <string.h>

#include "base/common.h"

static const char *const k_special[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

void tok_seq_push(tok_seq *s, int32_t id) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->ids = xrealloc(s->ids, sizeof(int32_t) * (size_t)s->cap);
    }
    s->ids[s->n++] = id;
}

void tok_seq_clear(tok_seq *s) { s->n = 0; }

void tok_seq_free(tok_seq *s) {
    free(s->ids);
    s->ids = NULL;
    s->n = s->cap = 0;
}

const char *tok_special_text(int32_t id) {
    if (id >= TOK_ENDOFTEXT && id < TOK_VOCAB_SIZE) return k_special[id - TOK_ENDOFTEXT];
    return NULL;
}

void tok_encode(const char *text, size_t len, bool allow_special, tok_seq *out) {
    size_t i = 0;
    while (i < len) {
        if (allow_special && text[i] == '<') {
            int hit = -1;
            size_t hl = 0;
            for (int k = 0; k < 3; k++) {
                size_t sl = strlen(k_special[k]);
                if (sl <= len - i && memcmp(text + i, k_special[k], sl) == 0) { hit = k; hl = sl; break; }
            }
            if (hit >= 0) {
                tok_seq_push(out, TOK_ENDOFTEXT + hit);
                i += hl;
                continue;
            }
        }
        tok_seq_push(out, (int32_t)(unsigned char)text[i]);
        i++;
    }
}

char *tok_decode(const int32_t *ids, int64_t n, bool skip_special, size_t *len) {
    size_t cap = (size_t)n + 16, m = 0;
    char *s = xmalloc(cap);
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        const char *piece = NULL;
        size_t pl = 0;
        char byte;
        if (id < 0) {
            free(s);
            moerl_errorf("tok_decode: id %d at position %lld is negative", (int)id, (long long)i);
            return NULL;
        } else if (id < 256) {
            byte = (char)(unsigned char)id;
            piece = &byte;
            pl = 1;
        } else if (id < TOK_VOCAB_SIZE) {
            if (skip_special) continue;
            piece = k_special[id - TOK_ENDOFTEXT];
            pl = strlen(piece);
        } else {
            continue; /* beyond the byte vocabulary: decodes to nothing */
        }
        if (m + pl + 1 > cap) {
            cap = 2 * (m + pl + 1);
            s = xrealloc(s, cap);
        }
        memcpy(s + m, piece, pl);
        m += pl;
    }
    s[m] = 0;
    if (len) *len = m;
    return s;
}

char *tok_chat_text(const chat_msg *msgs, int n, bool add_generation_prompt) {
    size_t cap = 64;
    for (int i = 0; i < n; i++) cap += strlen(msgs[i].role) + strlen(msgs[i].content) + 32;
    char *s = xmalloc(cap);
    size_t m = 0;
    for (int i = 0; i < n; i++)
        m += (size_t)snprintf(s + m, cap - m, "%s%s\n%s%s\n", k_special[1], msgs[i].role, msgs[i].content, k_special[2]);
    if (add_generation_prompt) m += (size_t)snprintf(s + m, cap - m, "%sassistant\n", k_special[1]);
    (void)m;
    return s;
}

void tok_chat_encode(const chat_msg *msgs, int n, bool add_generation_prompt, tok_seq *out) {
    for (int i = 0; i < n; i++) {
        tok_seq_push(out, TOK_IM_START);
        tok_encode(msgs[i].role, strlen(msgs[i].role), false, out);
        tok_seq_push(out, '\n');
        tok_encode(msgs[i].content, strlen(msgs[i].content), false, out);
        tok_seq_push(out, TOK_IM_END);
        tok_seq_push(out, '\n');
    }
    if (add_generation_prompt) {
        tok_seq_push(out, TOK_IM_START);
        tok_encode("assistant\n", 10, false, out);
    }
}

void tok_encode_response(const char *text, tok_seq *out) {
    tok_encode(text, strlen(text), false, out);
    tok_seq_push(out, TOK_EOS);
}
