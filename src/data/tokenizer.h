/* moerl — byte-level tokenizer with Qwen-style special tokens and chat template.
 *
 * Ids 0..255 are the bytes of the text (any bytes, so invalid UTF-8 round-trips exactly);
 * special tokens follow, with Qwen2/Qwen3's names and roles:
 *     256 <|endoftext|>   bos and pad (Qwen's pad token; Qwen3's bos_token_id 151643 is the same token)
 *     257 <|im_start|>
 *     258 <|im_end|>      eos (Qwen3 chat models' eos_token_id 151645 is the same token)
 * TOK_VOCAB_SIZE = 259. A model may have a larger embedding table; ids ≥ 259 decode to nothing.
 *
 * Chat template: the ChatML layout of Qwen's tokenizer_config.json chat_template (without tools
 * and without a default system message):
 *     for each message  "<|im_start|>{role}\n{content}<|im_end|>\n"
 *     for generation    "<|im_start|>assistant\n"
 * The Qwen BPE tokenizer comes later (design.md); it will keep these functions' contracts.
 */
#ifndef MOERL_TOKENIZER_H
#define MOERL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOK_ENDOFTEXT 256
#define TOK_IM_START 257
#define TOK_IM_END 258
#define TOK_BOS TOK_ENDOFTEXT
#define TOK_PAD TOK_ENDOFTEXT
#define TOK_EOS TOK_IM_END
#define TOK_VOCAB_SIZE 259

/* A growable sequence of token ids. Zero-initialise ({0}); free with tok_seq_free. */
typedef struct {
    int32_t *ids;
    int64_t n, cap;
} tok_seq;

void tok_seq_push(tok_seq *s, int32_t id);
void tok_seq_clear(tok_seq *s); /* n = 0, keeps the memory */
void tok_seq_free(tok_seq *s);

/* One chat message; role is e.g. "system", "user", "assistant". */
typedef struct {
    char *role;
    char *content;
} chat_msg;

/* The text of special token `id` ("<|im_end|>"), or NULL if id is not a special token. */
const char *tok_special_text(int32_t id);

/* Append the ids of text[0..len) to out. With allow_special, the exact strings "<|endoftext|>",
 * "<|im_start|>", "<|im_end|>" become their special ids; without it every byte is a byte id
 * (use this for untrusted content, so a user cannot inject control tokens). */
void tok_encode(const char *text, size_t len, bool allow_special, tok_seq *out);

/* Text of ids[0..n): byte ids give their byte, special ids their string (or nothing with
 * skip_special), ids ≥ TOK_VOCAB_SIZE nothing. Returns a NUL-terminated heap string (the text
 * may itself contain NUL bytes: *len, if not NULL, gets the true length), or NULL with
 * moerl_last_error() naming the position for a negative id. */
char *tok_decode(const int32_t *ids, int64_t n, bool skip_special, size_t *len);

/* The chat template as text (see the top of this file); add_generation_prompt appends
 * "<|im_start|>assistant\n". Heap string. */
char *tok_chat_text(const chat_msg *msgs, int n, bool add_generation_prompt);

/* The chat template as ids, appended to out: the structural tokens are special ids; role and
 * content are encoded byte by byte (allow_special = false), so content that spells
 * "<|im_end|>" stays plain text. */
void tok_chat_encode(const chat_msg *msgs, int n, bool add_generation_prompt, tok_seq *out);

/* A response as the model must produce it after the generation prompt: the bytes of `text`
 * followed by <|im_end|> (eos), appended to out. Used for SFT targets. */
void tok_encode_response(const char *text, tok_seq *out);

#endif
