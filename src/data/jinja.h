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
 * Every output byte is tracked as template literal (1) or data (0), as chat_render records it
 * (data/chat_template.h): string literals of the template are template text; strings that come
 * from the variables are data, except the top-level string variables the caller names (special
 * tokens such as bos_token). Masks follow the bytes through concatenation, slicing, filters and
 * methods, so a tokenizer matches control tokens only where the template wrote them.
 */
#ifndef MOERL_JINJA_H
#define MOERL_JINJA_H

#include <jansson.h>
#include <stddef.h>

#include "data/chat_template.h"

typedef struct jinja_tpl jinja_tpl;

/* Parse template source src[0..len). `name` names it in messages ("NAME:LINE: ..."). On error
 * *out is NULL and the message names the line and what was expected. */
int jinja_parse(const char *src, size_t len, const char *name, jinja_tpl **out);
void jinja_free(jinja_tpl *t);

/* Render t with the variables of `vars` (a JSON object: messages, tools, add_generation_prompt,
 * bos_token, ...; any key) and append the text to out. template_vars: NULL-terminated names of
 * top-level string variables whose bytes count as template (may be NULL). Errors:
 * raise_exception's message, a type error, an unsupported filter/method/test/statement — each
 * with the template's name and line. out may hold a partial rendering after an error. */
int jinja_render(const jinja_tpl *t, const json_t *vars, const char *const *template_vars, chat_render *out);

#endif
