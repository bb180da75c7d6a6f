/* moerl — Hugging Face tokenizer.json, byte-level BPE (as Qwen2/Qwen3, GPT-2 and Llama 3 use it).
 *
 * Encoding a text follows the `tokenizers` library's pipeline (tokenizers/src/tokenizer/mod.rs,
 * added_vocabulary.rs, models/bpe/model.rs, pre_tokenizers/byte_level.rs):
 *   1. added tokens ("added_tokens": <|im_start|>, <think>, ...) are cut out first, leftmost-longest;
 *   2. each text span between them: invalid UTF-8 → U+FFFD (see below), then the normalizer
 *      (none, or NFC through Debian's libutf8proc);
 *   3. the Split pre-tokenizer's regex (PCRE2 with UTF + UCP, JIT-compiled; behavior "Isolated":
 *      every match and every gap between matches is a piece);
 *   4. ByteLevel: each byte of a piece becomes the vocab token of its GPT-2 byte-to-unicode
 *      character; then BPE merges by rank (lowest rank first, leftmost on ties) until none applies.
 * Decoding maps each id back to its bytes (byte-level tokens through the inverse byte map, added
 * tokens as their literal content); decoded bytes may be invalid UTF-8 (a partial character).
 *
 * Invalid UTF-8 input: `tokenizers` takes Rust strings, so bytes reach it only through a UTF-8
 * decoder with replacement (Python's errors="replace", Rust from_utf8_lossy, JavaScript's
 * TextDecoder and Buffer.toString all replace each *maximal ill-formed subsequence* — Unicode
 * ch. 3, "U+FFFD Substitution of Maximal Subparts" — with U+FFFD). moerl does the same before
 * step 2, so the ids equal those of the text such a decoder produces.
 *
 * Supported file contents (anything else is an error naming the field and value): model.type
 * "BPE" with dropout null, byte_fallback false, empty continuing_subword_prefix/end_of_word_suffix,
 * ignore_merges either way; normalizer null or NFC (or a Sequence of NFC); pre_tokenizer ByteLevel
 * (use_regex: the GPT-2 split pattern) or a Sequence of Split(Regex, Isolated, invert false) and
 * ByteLevel(use_regex false), add_prefix_space false; decoder null or ByteLevel; post_processor
 * null or ByteLevel; truncation and padding null; added tokens with lstrip/rstrip/single_word
 * false (and normalized false when there is a normalizer).
 *
 * Thread safety: a loaded hf_bpe is read-only; encode keeps a per-thread word cache, so any
 * number of threads may encode and decode with the same hf_bpe at once.
 */
#ifndef MOERL_BPE_H
#define MOERL_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

typedef struct hf_bpe hf_bpe;

/* Parse tokenizer.json text (json[0..len)); `name` (a path) stands for the file in messages.
 * Returns NULL with moerl_last_error() naming the file, the field and what moerl supports. */
hf_bpe *hf_bpe_load(const char *json, size_t len, const char *name);
void hf_bpe_free(hf_bpe *b);

/* Encode text[0..len) (any bytes) and append the ids to out. Added tokens with "special": true
 * (<|im_start|>, <|im_end|>, <|endoftext|>, ...) are matched only where `special_ok` allows:
 * special_ok == NULL → everywhere when allow_special, nowhere otherwise; else a match starting at
 * byte i is taken iff special_ok[i] is nonzero (the chat template marks its own literals this way,
 * so message content cannot inject control tokens). Added tokens with "special": false (<think>,
 * <tool_call>, ...) are matched everywhere, as in `tokenizers`. Returns MOERL_OK, or MOERL_ERR
 * naming the failure (a regex match error, e.g. PCRE2's resource limits on pathological input). */
int hf_bpe_encode(const hf_bpe *b, const char *text, size_t len, bool allow_special, const uint8_t *special_ok,
                  tok_seq *out);

/* The bytes of token `id` (*len set), or NULL for an id the file does not define. */
const char *hf_bpe_piece(const hf_bpe *b, int32_t id, size_t *len);
/* 1 if id is an added token with "special": true (skipped by decode with skip_special). */
int hf_bpe_is_special(const hf_bpe *b, int32_t id);
/* The id of a token given by its text (an added token's content, or a vocab entry's bytes), or -1. */
int32_t hf_bpe_token_id(const hf_bpe *b, const char *text, size_t len);
/* One past the largest id in the file (vocab and added tokens). */
int32_t hf_bpe_vocab_size(const hf_bpe *b);

/* Testing hook: pieces of up to n symbols use the quadratic merge loop, longer ones the heap
 * (default 48; both give the same ids). Returns the previous value. Not thread-safe. */
int hf_bpe_set_linear_max(int n);

#endif
