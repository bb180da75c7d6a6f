/* moerl — chat templates, implemented natively (no Jinja engine).
 *
 * A checkpoint's tokenizer_config.json carries its chat template as Jinja text. moerl recognises
 * the templates it implements by a fingerprint of that text (chat_tpl_identify) and renders them
 * in C; any other template is an error that names the config key choosing a built-in one.
 *
 *   chatml  "<|im_start|>{role}\n{content}<|im_end|>\n" per message; the generation prompt is
 *           "<|im_start|>assistant\n". moerl's byte tokenizer uses it (tokenizer.h).
 *   qwen3   Qwen3's template (Qwen3 hybrid-thinking checkpoints, e.g. Qwen3-30B-A3B), without
 *           tools: a leading system message, user/system/assistant/tool turns, assistant
 *           reasoning split at "</think>" and re-emitted as "<think>\n…\n</think>\n\n" for turns
 *           after the last user query, tool results folded into user turns as
 *           <tool_response> blocks, and with add_generation_prompt "<|im_start|>assistant\n",
 *           plus "<think>\n\n</think>\n\n" when enable_thinking is false. Its output is
 *           tested equal to the real template rendered by @huggingface/jinja
 *           (tests/ref/chat_template_ref.js).
 *
 * Rendering produces the text and, per byte, whether it is template literal (1) or message
 * content (0): tokenizers match control tokens (<|im_end|>, ...) only in template literals, so
 * content that spells one stays text.
 */
#ifndef MOERL_CHAT_TEMPLATE_H
#define MOERL_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

typedef enum { CHAT_TPL_NONE = 0, CHAT_TPL_CHATML = 1, CHAT_TPL_QWEN3 = 2 } chat_tpl;

/* A rendered text: text[0..len) (NUL-terminated) and tpl[0..len), 1 where a byte comes from the
 * template itself. Zero-initialise; free with chat_render_free. */
typedef struct {
    char *text;
    uint8_t *tpl;
    size_t len, cap;
} chat_render;

void chat_render_free(chat_render *r);

/* "chatml" / "qwen3" → the template; anything else MOERL_ERR listing the names. */
int chat_tpl_from_name(const char *name, chat_tpl *out);
const char *chat_tpl_name(chat_tpl t);
/* The built-in template whose Jinja source is exactly `jinja` (64-bit FNV-1a of the text), or
 * CHAT_TPL_NONE. */
chat_tpl chat_tpl_identify(const char *jinja, size_t len);
uint64_t chat_tpl_fingerprint(const char *jinja, size_t len);

/* Check that template t can render these messages (qwen3 renders the roles system, user,
 * assistant and tool; chatml any role). MOERL_ERR names the message and role. */
int chat_check(chat_tpl t, const chat_msg *msgs, int n);

/* Append the rendering of msgs[0..n) to out (as the template renders the whole list, with
 * add_generation_prompt and enable_thinking). Errors: those of chat_check. */
int chat_render_msgs(chat_tpl t, const chat_msg *msgs, int n, bool add_generation_prompt, bool enable_thinking,
                     chat_render *out);

/* Append what follows the generation prompt when the conversation continues with an assistant
 * message `response`, up to (not including) the end-of-turn token: for chatml the response
 * itself; for qwen3 "<think>\n{reasoning}\n</think>\n\n{answer}" as the template renders a
 * final assistant turn (reasoning is the text before "</think>" in response, empty if none),
 * where with enable_thinking false an empty think block is left out (the generation prompt
 * already holds it). Used for SFT targets. */
int chat_render_response(chat_tpl t, const char *response, bool enable_thinking, chat_render *out);

/* The end-of-turn token text of template t ("<|im_end|>" for both). */
const char *chat_tpl_end_of_turn(chat_tpl t);

#endif
