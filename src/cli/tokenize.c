/* moerl tokenize --model DIR (--text S | --file F) [options]
 * The model folder's tokenizer (the one generate, sft, rl and eval use) on a text:
 *   default     {"tokenizer": "hf-bpe", "n": N, "ids": [...]} (with --pieces also "pieces": the
 *               text of each token)
 *   --decode    the input is a list of ids ("1,5,9", "1 5 9" or a JSON list); prints their text
 *   --chat      the input is a JSON list of messages, or an object in the shape of
 *               apply_chat_template's arguments {"messages", "tools", "add_generation_prompt",
 *               "enable_thinking", any other template variable} (data/prompts.h: chat_call);
 *               prints the chat template's text and ids: {"template": "qwen3", "text": "...", "n":
 *               N, "ids": [...]}. --chat-template also takes the path of a .jinja file. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "cli/options.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "model/ckpt_meta.h"

typedef struct {
    const char *model, *text, *file, *tpl;
    int decode, skip, nospecial, pieces, chat, no_thinking, no_gen, tpl_given;
} tk_args;

/* The options (table) → a; 0 = go on, else the exit code is in *code. */
static int tk_parse(int argc, char **argv, tk_args *a, int *code) {
    const cli_opt opts[] = {
        CLI_OPT_STR("model", &a->model, "DIR", CLI_ONCE | CLI_REQUIRED,
                    "a model folder (tokenizer.json, or moerl's byte tokenizer)"),
        CLI_OPT_STR("text", &a->text, "S", CLI_ONCE, "the input"),
        CLI_OPT_STR("file", &a->file, "F", CLI_ONCE, "the input, read from a file as raw bytes"),
        CLI_OPT_FLAG("decode", &a->decode, "the input is token ids (\"1,5,9\" or a JSON list): print their text"),
        CLI_OPT_FLAG("skip-special", &a->skip, "with --decode: leave out special tokens"),
        CLI_OPT_FLAG("no-special", &a->nospecial, "encode <|im_end|> etc. written in the text as plain text"),
        CLI_OPT_FLAG("pieces", &a->pieces, "also print each token's text"),
        CLI_OPT_FLAG("chat", &a->chat, "the input is a JSON list of messages, or an object {\"messages\", \"tools\", "
                                       "\"add_generation_prompt\", \"enable_thinking\", ...} as apply_chat_template "
                                       "takes: apply the chat template (with the generation prompt) and print its "
                                       "text and ids"),
        {.name = "chat-template", .type = CLI_STR, .dest = &a->tpl, .given = &a->tpl_given, .meta = "NAME",
         .help = "auto (the checkpoint's own), qwen3, chatml, or the path of a .jinja file"},
        CLI_OPT_FLAG("no-thinking", &a->no_thinking, "the chat template's enable_thinking=false (Qwen3: no thinking)"),
        CLI_OPT_FLAG("no-generation-prompt", &a->no_gen, "with --chat: leave out the assistant's opening"),
    };
    const cli_spec spec = {.cmd = "tokenize", .opts = opts, .n_opts = CLI_NOPTS(opts),
                           .synopsis = "--model DIR (--text S | --file F) [options]",
                           .about = "The model folder's tokenizer (the one generate, sft, rl and eval use) on a text: "
                                    "prints {\"tokenizer\", \"n\", \"ids\"} (--chat: also \"template\" and \"text\"; "
                                    "--decode: the text)."};
    if (cli_parse(&spec, argc, argv, code)) return 1;
    if (!a->text == !a->file || (a->decode && a->chat)) {
        fprintf(stderr, "moerl tokenize: --model and exactly one of --text / --file are required (and not both "
                        "--decode and --chat)\n");
        *code = 2;
        return 1;
    }
    const char *unused = a->skip && !a->decode ? "--skip-special applies with --decode"
                         : (a->tpl_given || a->no_thinking || a->no_gen) && !a->chat
                             ? "--chat-template, --no-thinking and --no-generation-prompt apply with --chat"
                         : a->nospecial && a->decode ? "--no-special applies when encoding, not with --decode"
                                                     : NULL;
    if (unused) { /* an option that would be silently ignored */
        fprintf(stderr, "moerl tokenize: %s\n", unused);
        *code = 2;
        return 1;
    }
    return 0;
}

/* --decode: ids ("1 5 9", "[1, 5, 9]" or "1,5,9"; buf is rewritten) → their text on stdout. */
static int tk_decode(const tokenizer *t, char *buf, size_t len, int skip) {
    int *ids = NULL, n = 0;
    for (size_t i = 0; i < len; i++)
        if (buf[i] == ' ' || buf[i] == '[' || buf[i] == ']' || buf[i] == '\n' || buf[i] == '\t') buf[i] = ',';
    char *p = buf;
    while (*p == ',') p++;
    char *e = p + strlen(p);
    while (e > p && e[-1] == ',') *--e = 0;
    for (char *q = p; *q; q++) /* collapse ",," left by the separators */
        while (q[0] == ',' && q[1] == ',') memmove(q, q + 1, strlen(q));
    if (cli_parse_int_list(p, &ids, &n) != MOERL_OK) {
        fprintf(stderr, "moerl tokenize --decode: %s\n", moerl_last_error());
        return 1;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) {
            fprintf(stderr, "moerl tokenize --decode: id %d (position %d) is outside the tokenizer's vocabulary "
                            "0..%d\n", ids[i], i, tokenizer_vocab_size(t) - 1);
            free(ids);
            return 1;
        }
    size_t tl;
    char *txt = tokenizer_decode(t, ids, n, skip, &tl);
    free(ids);
    if (!txt) {
        fprintf(stderr, "moerl tokenize --decode: %s\n", moerl_last_error());
        return 1;
    }
    fwrite(txt, 1, tl, stdout);
    fputc('\n', stdout); /* one line, like every other mode */
    free(txt);
    return 0;
}

/* --chat: the flags that say the same as the object's keys; both is an error (the flag would be
 * silently ignored or the key overruled). */
static int tk_chat_flags(const tk_args *a, chat_call *c) {
    const char *twice = a->no_gen && c->add_generation_prompt >= 0 ? "--no-generation-prompt and the input's "
                                                                      "\"add_generation_prompt\""
                        : a->no_thinking && c->x.vars && json_object_get(c->x.vars, "enable_thinking")
                            ? "--no-thinking and the input's \"enable_thinking\""
                            : NULL;
    if (twice) return moerl_errorf("both %s are given: keep one", twice);
    if (c->add_generation_prompt < 0) c->add_generation_prompt = !a->no_gen;
    return MOERL_OK;
}

/* --chat: the conversation in buf (a list of messages or the apply_chat_template object) through
 * the chat template → res gets "template" and "text", s the ids. */
static int tk_chat(tokenizer *t, const tk_args *a, const char *buf, size_t len, json_t *res, tok_seq *s) {
    json_error_t je;
    json_t *in = json_loadb(buf, len, 0, &je);
    if (!json_is_array(in) && !json_is_object(in)) {
        fprintf(stderr, "moerl tokenize --chat: the input must be a JSON list of messages or an object "
                        "{\"messages\": [...], \"tools\": [...], ...} (%s)\n", in ? "got another JSON value" : je.text);
        json_decref(in);
        return 1;
    }
    chat_call c;
    int rc = 1;
    char *txt = NULL;
    if (tokenizer_set_chat_template(t, a->tpl, !a->no_thinking, "--chat-template") != MOERL_OK ||
        chat_call_from_json(in, &c) != MOERL_OK) {
        fprintf(stderr, "moerl tokenize --chat: %s\n", moerl_last_error());
        json_decref(in);
        return 1;
    }
    if (tk_chat_flags(a, &c) != MOERL_OK ||
        !(txt = tokenizer_chat_text_ex(t, c.msgs, c.n, &c.x, c.add_generation_prompt)) ||
        tokenizer_chat_encode_ex(t, c.msgs, c.n, &c.x, c.add_generation_prompt, s) != MOERL_OK)
        fprintf(stderr, "moerl tokenize --chat: %s\n", moerl_last_error());
    else {
        const char *name = tokenizer_chat_template_name(t);
        json_object_set_new(res, "template", cli_json_text(name, strlen(name)));
        json_object_set_new(res, "text", cli_json_text(txt, strlen(txt)));
        rc = 0;
    }
    free(txt);
    chat_call_free(&c);
    json_decref(in);
    return rc;
}

/* Encode (or --chat) buf and print the JSON result. */
static int tk_encode(tokenizer *t, const tk_args *a, const char *buf, size_t len) {
    tok_seq s = {0};
    json_t *res = json_object();
    json_object_set_new(res, "tokenizer", json_string(tokenizer_kind(t)));
    int rc = 1;
    if (a->chat) {
        if (tk_chat(t, a, buf, len, res, &s)) goto out;
    } else if (tokenizer_encode(t, buf, len, !a->nospecial, &s) != MOERL_OK) {
        fprintf(stderr, "moerl tokenize: %s\n", moerl_last_error());
        goto out;
    }
    json_t *ids = json_array();
    for (int64_t i = 0; i < s.n; i++) json_array_append_new(ids, json_integer(s.ids[i]));
    json_object_set_new(res, "n", json_integer(s.n));
    json_object_set_new(res, "ids", ids);
    if (a->pieces) {
        json_t *pa = json_array();
        for (int64_t i = 0; i < s.n; i++) {
            size_t pl;
            char *pt = tokenizer_decode(t, &s.ids[i], 1, false, &pl);
            json_array_append_new(pa, cli_json_text(pt, pl));
            free(pt);
        }
        json_object_set_new(res, "pieces", pa);
    }
    char *js = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    printf("%s\n", js);
    free(js);
    rc = 0;
out:
    json_decref(res);
    tok_seq_free(&s);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    tk_args a = {.tpl = "auto"};
    int code;
    if (tk_parse(argc, argv, &a, &code)) return code;
    char *buf = NULL;
    size_t len = 0;
    if (a.file) {
        if (moerl_read_file(a.file, &buf, &len) != MOERL_OK) {
            fprintf(stderr, "moerl tokenize: --file: %s\n", moerl_last_error());
            return 1;
        }
    } else {
        buf = xstrdup(a.text);
        len = strlen(a.text);
    }
    struct stat mst;
    tokenizer *t = NULL;
    int rc = 1;
    if (stat(a.model, &mst) != 0 || !S_ISDIR(mst.st_mode))
        fprintf(stderr, "moerl tokenize: --model '%s' is not a folder (a checkpoint folder with config.json and the "
                        "tokenizer files)\n", a.model);
    else if (!(t = tokenizer_load(a.model, checkpoint_vocab_size(a.model))))
        fprintf(stderr, "moerl tokenize: %s\n", moerl_last_error());
    else
        rc = a.decode ? tk_decode(t, buf, len, a.skip) : tk_encode(t, &a, buf, len);
    tokenizer_free(t);
    free(buf);
    return rc;
}
