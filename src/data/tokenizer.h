/* moerl — tokenizers: one handle type for moerl's byte tokenizer and Hugging Face byte-level BPE.
 *
 * A `tokenizer` is loaded from a model folder (tokenizer_load) and is one of:
 *   bytes   moerl's byte tokenizer. Ids 0..255 are the bytes of the text (any bytes, so invalid
 *           UTF-8 round-trips exactly); special tokens follow, with Qwen2/Qwen3's names and roles:
 *               256 <|endoftext|>   bos and pad
 *               257 <|im_start|>
 *               258 <|im_end|>      eos
 *           TOK_VOCAB_SIZE = 259; a model may have a larger embedding table (ids ≥ 259 decode to
 *           nothing). Chat template: chatml (chat_template.h).
 *   hf-bpe  the checkpoint's own tokenizer.json (bpe.h: Qwen2/Qwen3, GPT-2, Llama 3 style
 *           byte-level BPE), its tokenizer_config.json (chat template, eos token) and
 *           generation_config.json (eos_token_id: one id or a list, all of them stop generation).
 *
 * Which one (tokenizer_load): tokenizer.json present → hf-bpe; else tokenizer_moerl.json
 * (written by moerl next to its checkpoints) or a model vocabulary of at most 259 → bytes; else
 * an error (a 151k-vocabulary model without its tokenizer files must not silently get bytes).
 *
 * The process-wide current tokenizer: the training and generation code (SFT, RL rollouts and
 * rewards, eval) calls the tok_* functions at the bottom, which use the tokenizer set once by
 * tok_set_current when the model is loaded (the CLI does it; until then, the byte tokenizer).
 * It is read-only afterwards, so threads share it freely.
 */
#ifndef MOERL_TOKENIZER_H
#define MOERL_TOKENIZER_H

#include <jansson.h>
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

/* One chat message. role is e.g. "system", "user", "assistant", "tool"; content is the text the
 * native templates render ("" when the message's content is null, absent or a list of parts).
 * msg, when not NULL, is the whole message object as it was given — tool_calls,
 * reasoning_content, name, tool_call_id, a null or list content, any other key — and the
 * Jinja-rendered templates receive it as is; NULL means the message is exactly {"role": role,
 * "content": content}. Whoever builds an array of messages owns role and content and (in
 * dataset rows) a reference on msg; see each builder. */
typedef struct {
    char *role;
    char *content;
    json_t *msg;
} chat_msg;

/* What travels beside the messages to the chat template, as apply_chat_template's arguments:
 * tools, a JSON list of tool (function) specs, or NULL; vars, a JSON object of further template
 * variables (enable_thinking, or any key a template reads), or NULL. A var enable_thinking
 * overrides the tokenizer's setting (tokenizer_set_chat_template). Both are only read. */
typedef struct {
    const json_t *tools;
    const json_t *vars;
} chat_extra;

typedef struct tokenizer tokenizer;

/* ---- the handle ---- */

/* moerl's byte tokenizer (never fails). */
tokenizer *tokenizer_new_bytes(void);
/* The tokenizer of a model folder (rule at the top). vocab_size: the model's embedding rows
 * (config.json), or 0 if unknown; ids of the tokenizer must fit in it. Returns NULL with
 * moerl_last_error() naming the folder, the file and the problem. */
tokenizer *tokenizer_load(const char *dir, int vocab_size);
void tokenizer_free(tokenizer *t);

/* "bytes" or "hf-bpe". */
const char *tokenizer_kind(const tokenizer *t);
/* One past the largest id the tokenizer produces or decodes. */
int32_t tokenizer_vocab_size(const tokenizer *t);
/* The id of a token given by its text ("<|im_end|>"), or -1. */
int32_t tokenizer_token_id(const tokenizer *t, const char *text);

/* Append the ids of text[0..len) (any bytes) to out. allow_special: control tokens
 * (<|im_start|>, <|im_end|>, <|endoftext|>, ...) written in the text become their ids; without
 * it they stay text (use this for untrusted content). hf-bpe: added tokens that are not special
 * (<think>, <tool_call>, ...) are always matched, as Hugging Face does; invalid UTF-8 is
 * encoded as the U+FFFD text a replacing decoder makes of it (bpe.h). Errors: bpe.h. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool allow_special, tok_seq *out);

/* Text of ids[0..n): each id's bytes (special ids their string, or nothing with skip_special;
 * ids the tokenizer does not define nothing). Returns a NUL-terminated heap string (it may
 * contain NUL bytes and invalid UTF-8 such as a cut character: *len, if not NULL, gets the true
 * length), or NULL with moerl_last_error() naming the position of a negative id. */
char *tokenizer_decode(const tokenizer *t, const int32_t *ids, int64_t n, bool skip_special, size_t *len);

/* Choose the chat template. name:
 *   "auto"    the checkpoint's own (chat_template.jinja, else tokenizer_config.json's
 *             chat_template, as transformers reads them), rendered by moerl's Jinja interpreter
 *             (data/jinja.h); for the byte tokenizer its folder's chat_template.jinja, else chatml.
 *             No template in the checkpoint is an error saying what to set.
 *   "qwen3", "chatml"  moerl's native renderers (chat_template.h);
 *   a path    a .jinja file (as vLLM's --chat-template): any name ending in ".jinja", holding a
 *             '/', or naming an existing file. Errors: the file cannot be read (its path), a
 *             parse error (file:line and what was expected).
 * A Jinja template whose text is Qwen3's (fingerprint) renders plain conversations with the
 * native qwen3 renderer, proven equal (tests/test_chat.c), and the rest through Jinja.
 * enable_thinking: false is passed to Jinja templates as enable_thinking=false; true leaves the
 * variable undefined (Qwen3's default is thinking); a chat_extra var overrides it. Errors name
 * the key `config_key` (e.g. "data.chat_template") in what to do. */
int tokenizer_set_chat_template(tokenizer *t, const char *name, bool enable_thinking, const char *config_key);
/* The enable_thinking of the last tokenizer_set_chat_template (true before any). */
bool tokenizer_enable_thinking(const tokenizer *t);
/* The chosen template's name: "qwen3", "chatml", or for another Jinja template its source (the
 * .jinja path, or "DIR/tokenizer_config.json"); "none" before a successful choice for hf-bpe. */
const char *tokenizer_chat_template_name(const tokenizer *t);

/* Check that the chat template renders these messages: the native renderers check the roles
 * (and refuse what they cannot render: tools, tool_calls, reasoning_content, ... — the error
 * says to use the checkpoint's template or a .jinja file); a Jinja template is rendered once
 * (its raise_exception messages, unsupported features). x may be NULL. */
int tokenizer_chat_check(const tokenizer *t, const chat_msg *msgs, int n);
int tokenizer_chat_check_ex(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x);
/* The chat template's text for msgs (add_generation_prompt: end with the assistant's opening).
 * Heap string, or NULL on error. x (tools, variables) may be NULL. */
char *tokenizer_chat_text(const tokenizer *t, const chat_msg *msgs, int n, bool add_generation_prompt);
char *tokenizer_chat_text_ex(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x,
                             bool add_generation_prompt);
/* The chat template as ids, appended to out: the text of tokenizer_chat_text encoded in one go,
 * except that control tokens are matched only where the template wrote them (literal template
 * text and the special-token variables bos_token, eos_token, ...), so content that spells
 * "<|im_end|>" stays text. */
int tokenizer_chat_encode(const tokenizer *t, const chat_msg *msgs, int n, bool add_generation_prompt, tok_seq *out);
int tokenizer_chat_encode_ex(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x,
                             bool add_generation_prompt, tok_seq *out);
/* A response as the model must produce it after the generation prompt, appended to out: the
 * template's rendering of a final assistant turn (chat_render_response: the text itself for
 * chatml; qwen3 adds its think block) followed by the end-of-turn token <|im_end|>. Another
 * Jinja template: what rendering [user "", assistant text] adds to [user ""] with the generation
 * prompt, up to and including the first stop id (tokenizer_stop_ids) the template wrote; an
 * error if that rendering does not continue the prompt's. SFT targets. */
int tokenizer_encode_response(const tokenizer *t, const char *text, tok_seq *out);

/* The chat template's rendering of msgs as text[0..len) (NUL-terminated) and, per byte, tpl[i] = 1 where
 * the template itself wrote it (chat_render's mask); both heap, the caller frees them. Errors: those
 * of tokenizer_chat_text_ex (x: tools and template variables, or NULL). For the tool turns of multi-turn rollouts (data/tool_calls.h). */
int tokenizer_chat_render_masked(const tokenizer *t, const chat_msg *msgs, int n, const chat_extra *x,
                                 bool add_generation_prompt, char **text, uint8_t **tpl, size_t *len);
/* Append the ids of text[0..len), control tokens matched only at bytes with tpl[i] = 1 (as
 * tokenizer_chat_encode encodes a rendering). */
int tokenizer_encode_masked(const tokenizer *t, const char *text, size_t len, const uint8_t *tpl, tok_seq *out);

/* Ids that end a generation (hf-bpe: generation_config.json eos_token_id, all of them, else
 * config.json's, plus tokenizer_config.json's eos_token; bytes: <|im_end|>). *n gets the count. */
const int32_t *tokenizer_stop_ids(const tokenizer *t, int *n);

/* Write the tokenizer files into dir (atomically each), so a checkpoint written there loads
 * with the same tokenizer: bytes → tokenizer_moerl.json; hf-bpe → the files it was loaded from
 * (tokenizer.json, tokenizer_config.json, generation_config.json, chat_template.jinja,
 * special_tokens_map.json, vocab.json, merges.txt, those present), byte for byte. A template
 * chosen from a .jinja file (or the byte tokenizer's own) is written as chat_template.jinja, so
 * the checkpoint renders prompts as the run that wrote it did ("auto", and transformers). */
int tokenizer_save(const tokenizer *t, const char *dir);

/* ---- the process-wide current tokenizer (see the top) ---- */

/* Make t current (the caller keeps ownership and must not free it while it is current; NULL
 * restores the byte tokenizer). Call before starting threads that tokenize. */
void tok_set_current(tokenizer *t);
/* The current tokenizer (the byte tokenizer until tok_set_current). */
tokenizer *tok_current(void);
/* 1 if tok ends a generation under the current tokenizer (tokenizer_stop_ids); always 0 before a
 * tok_set_current, so code that never loads a tokenizer stops only where its model says. */
int tok_is_stop(int32_t tok);

/* The text of byte-tokenizer special id (256..258: "<|im_end|>", ...), or NULL. */
const char *tok_special_text(int32_t id);

/* The functions below are those of the handle on the current tokenizer; errors that can only
 * come from data checked beforehand (tokenizer_chat_check: a role the template cannot render)
 * or from a pathological regex input end the program with the message (moerl_fatal). */
void tok_encode(const char *text, size_t len, bool allow_special, tok_seq *out);
char *tok_decode(const int32_t *ids, int64_t n, bool skip_special, size_t *len);
char *tok_chat_text(const chat_msg *msgs, int n, bool add_generation_prompt);
void tok_chat_encode(const chat_msg *msgs, int n, bool add_generation_prompt, tok_seq *out);
void tok_chat_encode_ex(const chat_msg *msgs, int n, const chat_extra *x, bool add_generation_prompt, tok_seq *out);
void tok_encode_response(const char *text, tok_seq *out);

#endif
