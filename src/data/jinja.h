/* moerl — a Jinja interpreter for Hugging Face chat templates.
 *
 * Implements what chat templates use (transformers' apply_chat_template renders them with Jinja2
 * in a sandbox; @huggingface/jinja is the JavaScript implementation the tests compare against):
 * statements if/elif/else, for (with else, loop.index/index0/first/last/length/revindex/...,
 * loop filters), set (also block set), macro and call, filter blocks, namespace(), expressions
 * with the Python-like operators, tests (defined, none, string, mapping, ...), the filters and
 * string/list/dict methods templates call, tojson, raise_exception, and whitespace control
 * ({%- -%}, trim_blocks/lstrip_blocks as transformers sets them). Anything else is an error that
 * names it and its line.
 *
 * Output is byte-identical to @huggingface/jinja 0.5.11 (tests/test_jinja.c checks the Qwen3,
 * DeepSeek-V3, Llama 3.1 and Gemma 3 templates and one snippet per feature against it), quirks
 * included: booleans print true/false, lists and dicts print as JSON, strip/lstrip/rstrip trim
 * whitespace whatever their argument, tuples cannot be printed. What it lacks (select, map with
 * a filter name, sum, min, max, batch, truncate, round, loop.cycle, str.find, ...) follows
 * Jinja2. Variables: JSON as JSON.parse reads it (an integral number is an integer; keys that
 * are array indices come first, ascending). strftime_now reads the local time, or
 * $SOURCE_DATE_EPOCH (seconds) when set. docs/chat-templates.md lists what is supported.
 *
 * Every output byte is tracked as template literal (1) or data (0), as chat_render records it
 * (data/chat_template.h): string literals and text of the template are template; strings that
 * come from the variables are data, except the top-level string variables the caller names
 * (special tokens such as bos_token). Masks follow the bytes through concatenation, slicing,
 * filters and methods; bytes a filter makes up (tojson's quotes and braces, printed numbers and
 * booleans, indentation) are data. So a tokenizer matches control tokens only where the
 * template wrote them.
 *
 * A parsed template is read-only while rendering: threads may render one template at once.
 * Rendering allocates in an arena freed on return (also after an error); nesting is bounded
 * (100 levels of expressions or blocks, 100 of macro calls), so no input overflows a stack.
 */
#ifndef MOERL_JINJA_H
#define MOERL_JINJA_H

#include <jansson.h>
#include <stddef.h>

#include "data/chat_template.h"

typedef struct jinja_tpl jinja_tpl;

/* Parse template source src[0..len) (UTF-8; preprocessed as transformers configures Jinja2:
 * trim_blocks, lstrip_blocks, one trailing newline dropped, {% generation %} tags removed).
 * `name` names it in messages ("NAME:LINE: ..."). On error (MOERL_ERR) *out is NULL and the
 * message names the line and what was expected, e.g. "tpl:4: 'for' opened on line 4 is never
 * closed: expected {% endfor %}" or "tpl:1: unknown or unsupported statement 'include'". */
int jinja_parse(const char *src, size_t len, const char *name, jinja_tpl **out);
/* Free a parsed template (NULL is fine). */
void jinja_free(jinja_tpl *t);

/* Render t with the variables of `vars` (a JSON object: messages, tools, add_generation_prompt,
 * bos_token, ...; any key) and append the text to out. template_vars: NULL-terminated names of
 * top-level string variables whose bytes count as template (may be NULL). Errors:
 * raise_exception's message ("tpl:19: raise_exception: Conversation roles must alternate ..."),
 * a type error ("tpl:3: cannot apply filter 'trim' to NullValue"), an unknown filter or test,
 * an undefined value where one cannot be used — each with the template's name and line; vars
 * not an object; a variable named like a built-in global (range, namespace, true, ...), which
 * @huggingface/jinja refuses too. On success out->text is NUL-terminated (an empty rendering
 * too); out may hold a partial rendering after an error. */
int jinja_render(const jinja_tpl *t, const json_t *vars, const char *const *template_vars, chat_render *out);

#endif
