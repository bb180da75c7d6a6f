/* moerl tokenize --model DIR (--text S | --file F) [options]
 * The model folder's tokenizer (the one generate, sft, rl and eval use) on a text:
 *   default     {"tokenizer": "hf-bpe", "n": N, "ids": [...]} (with --pieces also "pieces": the
 *               text of each token)
 *   --decode    the input is a list of ids ("1,5,9", "1 5 9" or a JSON list); prints their text
 *   --chat      the input is a JSON list of {"role", "content"} messages; prints the chat
 *               template's text and ids: {"template": "qwen3", "text": "...", "n": N, "ids": [...]} */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "data/tokenizer.h"

static void tk_usage(FILE *f) {
    fprintf(f,
            "usage: moerl tokenize --model DIR (--text S | --file F) [options]\n"
            "  --model DIR            a model folder (tokenizer.json, or moerl's byte tokenizer)\n"
            "  --text S | --file F    the input (a file is read as raw bytes)\n"
            "  --decode               the input is token ids (\"1,5,9\" or a JSON list): print their text\n"
            "  --skip-special         with --decode: leave out special tokens\n"
            "  --no-special           encode <|im_end|> etc. written in the text as plain text\n"
            "  --pieces               also print each token's text\n"
            "  --chat                 the input is a JSON list of {\"role\", \"content\"} messages: apply the chat\n"
            "                         template (with the generation prompt) and print its text and ids\n"
            "  --chat-template NAME   auto (the checkpoint's own, default), qwen3 or chatml\n"
            "  --no-thinking          Qwen3's enable_thinking=false\n"
            "  --no-generation-prompt with --chat: leave out the assistant's opening\n");
}

/* The model's vocab_size from DIR/config.json, or 0 when there is none (a tokenizer-only folder). */
static int read_vocab_size(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t je;
    json_t *o = json_load_file(p, 0, &je);
    const json_t *v = o ? json_object_get(o, "vocab_size") : NULL;
    int n = json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30)
                ? (int)json_integer_value(v) : 0;
    json_decref(o);
    return n;
}

static json_t *ids_json(const tok_seq *s) {
    json_t *a = json_array();
    for (int64_t i = 0; i < s->n; i++) json_array_append_new(a, json_integer(s->ids[i]));
    return a;
}

static void print_json(json_t *o) {
    char *js = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    printf("%s\n", js);
    free(js);
    json_decref(o);
}

int cmd_tokenize(int argc, char **argv) {
    enum { O_MODEL = 1, O_TEXT, O_FILE, O_DECODE, O_SKIP, O_NOSPECIAL, O_PIECES, O_CHAT, O_TPL, O_NOTHINK, O_NOGEN, O_HELP };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},   {"text", required_argument, 0, O_TEXT},
        {"file", required_argument, 0, O_FILE},     {"decode", no_argument, 0, O_DECODE},
        {"skip-special", no_argument, 0, O_SKIP},   {"no-special", no_argument, 0, O_NOSPECIAL},
        {"pieces", no_argument, 0, O_PIECES},       {"chat", no_argument, 0, O_CHAT},
        {"chat-template", required_argument, 0, O_TPL}, {"no-thinking", no_argument, 0, O_NOTHINK},
        {"no-generation-prompt", no_argument, 0, O_NOGEN}, {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0}};
    const char *model = NULL, *text = NULL, *file = NULL, *tpl = "auto";
    int decode = 0, skip = 0, nospecial = 0, pieces = 0, chat = 0, thinking = 1, gen = 1, o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case O_MODEL: model = optarg; break;
        case O_TEXT: text = optarg; break;
        case O_FILE: file = optarg; break;
        case O_DECODE: decode = 1; break;
        case O_SKIP: skip = 1; break;
        case O_NOSPECIAL: nospecial = 1; break;
        case O_PIECES: pieces = 1; break;
        case O_CHAT: chat = 1; break;
        case O_TPL: tpl = optarg; break;
        case O_NOTHINK: thinking = 0; break;
        case O_NOGEN: gen = 0; break;
        case 'h':
        case O_HELP: tk_usage(stdout); return 0;
        default:
            fprintf(stderr, "moerl tokenize: unknown option or missing value in '%s'\n", argv[optind - 1]);
            tk_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "moerl tokenize: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model || !text == !file || (decode && chat)) {
        fprintf(stderr, "moerl tokenize: --model and exactly one of --text / --file are required (and not both "
                        "--decode and --chat)\n");
        return 2;
    }
    char *buf = NULL;
    size_t len = 0;
    if (file) {
        if (moerl_read_file(file, &buf, &len) != MOERL_OK) {
            fprintf(stderr, "moerl tokenize: --file: %s\n", moerl_last_error());
            return 1;
        }
    } else {
        buf = xstrdup(text);
        len = strlen(text);
    }
    int rc = 1;
    tok_seq s = {0};
    tokenizer *t = NULL;
    struct stat mst;
    if (stat(model, &mst) != 0 || !S_ISDIR(mst.st_mode)) {
        fprintf(stderr, "moerl tokenize: --model '%s' is not a folder (a checkpoint folder with config.json and the "
                        "tokenizer files)\n", model);
        goto out;
    }
    t = tokenizer_load(model, read_vocab_size(model));
    if (!t) {
        fprintf(stderr, "moerl tokenize: %s\n", moerl_last_error());
        free(buf);
        return 1;
    }
    if (decode) {
        int *ids = NULL, n = 0;
        for (size_t i = 0; i < len; i++) /* accept "1 5 9", "[1, 5, 9]" and "1,5,9" */
            if (buf[i] == ' ' || buf[i] == '[' || buf[i] == ']' || buf[i] == '\n' || buf[i] == '\t') buf[i] = ',';
        char *p = buf;
        while (*p == ',') p++;
        char *e = p + strlen(p);
        while (e > p && e[-1] == ',') *--e = 0;
        for (char *q = p; *q; q++) /* collapse ",," left by the separators */
            while (q[0] == ',' && q[1] == ',') memmove(q, q + 1, strlen(q));
        if (cli_parse_int_list(p, &ids, &n) != MOERL_OK) {
            fprintf(stderr, "moerl tokenize --decode: %s\n", moerl_last_error());
            goto out;
        }
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) {
                fprintf(stderr, "moerl tokenize --decode: id %d (position %d) is outside the tokenizer's vocabulary "
                                "0..%d\n", ids[i], i, tokenizer_vocab_size(t) - 1);
                free(ids);
                goto out;
            }
        for (int i = 0; i < n; i++) tok_seq_push(&s, ids[i]);
        free(ids);
        size_t tl;
        char *txt = tokenizer_decode(t, s.ids, s.n, skip, &tl);
        if (!txt) {
            fprintf(stderr, "moerl tokenize --decode: %s\n", moerl_last_error());
            goto out;
        }
        fwrite(txt, 1, tl, stdout);
        fputc('\n', stdout); /* one line, like every other mode */
        free(txt);
        rc = 0;
        goto out;
    }
    json_t *res = json_object();
    json_object_set_new(res, "tokenizer", json_string(tokenizer_kind(t)));
    if (chat) {
        json_error_t je;
        json_t *msgs = json_loadb(buf, len, 0, &je);
        if (!json_is_array(msgs)) {
            fprintf(stderr, "moerl tokenize --chat: the input must be a JSON list of {\"role\", \"content\"} messages "
                            "(%s)\n", msgs ? "got another JSON value" : je.text);
            json_decref(msgs);
            json_decref(res);
            goto out;
        }
        int n = (int)json_array_size(msgs);
        chat_msg *m = xcalloc(n ? n : 1, sizeof(chat_msg));
        int ok = 1;
        for (int i = 0; i < n && ok; i++) {
            const json_t *r = json_object_get(json_array_get(msgs, i), "role"),
                         *c = json_object_get(json_array_get(msgs, i), "content");
            if (!json_is_string(r) || !json_is_string(c)) {
                fprintf(stderr, "moerl tokenize --chat: message %d: expected {\"role\": string, \"content\": string}\n", i);
                ok = 0;
            } else {
                m[i].role = (char *)json_string_value(r);
                m[i].content = (char *)json_string_value(c);
            }
        }
        char *txt = NULL;
        if (ok && (tokenizer_set_chat_template(t, tpl, thinking, "--chat-template") != MOERL_OK ||
                   !(txt = tokenizer_chat_text(t, m, n, gen)) || tokenizer_chat_encode(t, m, n, gen, &s) != MOERL_OK)) {
            fprintf(stderr, "moerl tokenize --chat: %s\n", moerl_last_error());
            ok = 0;
        }
        if (ok) {
            json_object_set_new(res, "template", json_string(tokenizer_chat_template_name(t)));
            json_object_set_new(res, "text", cli_json_text(txt, strlen(txt)));
        }
        free(txt);
        free(m);
        json_decref(msgs);
        if (!ok) {
            json_decref(res);
            goto out;
        }
    } else if (tokenizer_encode(t, buf, len, !nospecial, &s) != MOERL_OK) {
        fprintf(stderr, "moerl tokenize: %s\n", moerl_last_error());
        json_decref(res);
        goto out;
    }
    json_object_set_new(res, "n", json_integer(s.n));
    json_object_set_new(res, "ids", ids_json(&s));
    if (pieces) {
        json_t *pa = json_array();
        for (int64_t i = 0; i < s.n; i++) {
            size_t pl;
            char *pt = tokenizer_decode(t, &s.ids[i], 1, false, &pl);
            json_array_append_new(pa, cli_json_text(pt, pl));
            free(pt);
        }
        json_object_set_new(res, "pieces", pa);
    }
    print_json(res);
    rc = 0;
out:
    tok_seq_free(&s);
    tokenizer_free(t);
    free(buf);
    return rc;
}
