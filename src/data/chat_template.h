/* moerl — chat templates: native renderers and the Jinja-rendered kind.
 *
 * A checkpoint's tokenizer_config.json carries its chat template as Jinja text; moerl renders any
 * such template (or a .jinja file) with its Jinja interpreter (data/jinja.h, chat_render_jinja),
 * with the variables apply_chat_template passes: messages, tools, add_generation_prompt, the
 * special tokens (bos_token, eos_token, ...) and any further keyword (enable_thinking, ...).
 * Two templates are also implemented natively, as a fast path for plain conversations (every
 * message only a role and a string content, no tools): moerl recognises Qwen3's by a fingerprint
 * of its text (chat_tpl_identify), and chatml is moerl's own:
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

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

/* CHAT_TPL_JINJA: a template rendered only by the Jinja interpreter. */
typedef enum { CHAT_TPL_NONE = 0, CHAT_TPL_CHATML = 1, CHAT_TPL_QWEN3 = 2, CHAT_TPL_JINJA = 3 } chat_tpl;
typedef struct jinja_tpl jinja_tpl; /* data/jinja.h */

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

/* Check that native template t can render these messages (qwen3 renders the roles system, user,
 * assistant and tool; chatml any role; both only plain messages, chat_msg_extra_key).
 * MOERL_ERR names the message and the role or key. */
int chat_check(chat_tpl t, const chat_msg *msgs, int n);

/* The first key of message m that a native renderer would drop ("tool_calls",
 * "reasoning_content", "content" when it is not a string, ...), or NULL when m is plain: no msg
 * object, or one with only a string "role" and a string "content". */
const char *chat_msg_extra_key(const chat_msg *m);
/* 1 when the native qwen3 renderer writes assistant content c exactly as Qwen3's template does in
 * @huggingface/jinja: c holds no "</think>" and does not start with whitespace (the template's
 * strip('\n')/lstrip('\n') remove every kind of whitespace there, JavaScript's trim set, while
 * the native renderer removes newlines only, as Python's Jinja2 does). */
int chat_qwen3_native_exact(const char *c);
/* 1 when every message of msgs[0..n) is plain (chat_msg_extra_key NULL). */
int chat_msgs_plain(const chat_msg *msgs, int n);
/* The messages as a JSON list (new reference): each message's msg object (shared, a new
 * reference) or {"role": role, "content": content}. NULL when a role or content is not UTF-8. */
json_t *chat_msgs_json(const chat_msg *msgs, int n);

/* What a Jinja rendering gets besides the messages: x (tools, further variables; may be NULL),
 * add_generation_prompt, enable_thinking (-1: leave undefined, 0/1: the value; a var in x wins),
 * and specials, a JSON object of the special-token variables (bos_token, eos_token, ... →
 * string), whose bytes count as template text in the mask. */
typedef struct {
    const chat_extra *x;
    bool add_generation_prompt;
    int enable_thinking;
    const json_t *specials;
} chat_jinja_args;

/* Append the rendering of msgs[0..n) by the parsed Jinja template jt to out, with the variables
 * {messages, tools (when given), add_generation_prompt, the specials, enable_thinking (when set),
 * every var of x except messages/tools/add_generation_prompt}. Errors: those of jinja_render
 * (the template's name and line), a role or content that is not UTF-8. */
int chat_render_jinja(const jinja_tpl *jt, const chat_msg *msgs, int n, const chat_jinja_args *a, chat_render *out);

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
