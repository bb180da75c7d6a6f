/* moerl generate --model DIR (--prompt TEXT | --prompts FILE.jsonl | --prompt-tokens 1,5,9) [options]
 * Runs the rollout engine and prints one JSON object per response on stdout, in input order
 * (prompt 0's samples 0..n-1, then prompt 1's, ...; responses finish in another order and wait
 * for their turn):
 *   {"prompt_index": i, "sample": j, "tokens": [...], "logprobs": [...], "versions": [...],
 *    "text": "..." (when the model folder has a tokenizer), "finish_reason": "stop"|"length"}
 * "versions" holds the policy version of each token's weights: the checkpoint's own version, read
 * from the trainer_state.json an RL checkpoint carries ("version"), else 0. --prompts reads JSONL
 * rows of which only "prompt" is used (chat messages, or a plain string = one user message), so
 * verl-style task rows and bare {"prompt": ...} rows both work; prompts go through the checkpoint's
 * tokenizer and chat template. Progress and throughput go to stderr. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/trace.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "rollout/engine.h"

static void gen_usage(FILE *f) {
    fprintf(f,
            "usage: moerl generate --model DIR (--prompt TEXT | --prompts FILE.jsonl | --prompt-tokens 1,5,9) [options]\n"
            "  --prompt TEXT        one user message, through the model's chat template\n"
            "  --max-new-tokens N   new tokens per response (default 64)\n"
            "  --temperature T      0 = greedy (default 1.0)\n"
            "  --top-p P            nucleus sampling, (0,1] (default 1.0 = off)\n"
            "  --top-k K            keep the K most likely tokens (default 0 = off)\n"
            "  --seed S             base seed; response j of prompt i uses seed S + 1000003·i + j (default 0)\n"
            "  -n N                 samples per prompt (default 1)\n"
            "  --max-num-seqs N     sequences in flight (default 32)\n"
            "  --dtype fp32|bf16    weights the engine computes from (default fp32; bf16: rollout.dtype bf16)\n"
            "  --chat-template NAME auto (the checkpoint's own, default) | qwen3 | chatml\n"
            "  --no-thinking        Qwen3's enable_thinking=false\n"
            "  --profile FILE       write a Chrome trace (Perfetto) of the engine's steps and kernels\n"
            "--prompts reads JSONL rows with a 'prompt' field: a list of chat messages {\"role\", \"content\"}\n"
            "(verl's schema; other fields are ignored) or a plain string (one user message).\n"
            "--prompt and --prompts need the model folder's tokenizer: tokenizer.json (Hugging Face), or\n"
            "moerl's byte tokenizer (tokenizer_moerl.json or vocab_size %d). Generation stops at every eos id\n"
            "of generation_config.json.\n"
            "Output: one JSON line per response, in input order (prompt, then sample). The policy version of an\n"
            "RL checkpoint (its trainer_state.json) is reported in 'versions'.\n",
            TOK_VOCAB_SIZE);
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "moerl generate: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}


/* The prompts of a JSONL file: every non-blank line an object with "prompt", either a list of
 * {"role", "content"} messages or a string (one user message). Other fields are ignored. Errors name
 * file:line and what was expected. On success *out holds one token sequence per row. */
static int read_prompts(const char *path, tok_seq **out, int *n_out) {
    char *text;
    size_t len;
    if (moerl_read_file(path, &text, &len) != MOERL_OK) return MOERL_ERR;
    tok_seq *seqs = NULL;
    int n = 0, cap = 0, rc = MOERL_ERR;
    long long line = 0;
    for (size_t pos = 0; pos < len;) {
        line++;
        const char *s = text + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - s) : len - pos;
        pos += ll + (nl ? 1 : 0);
        size_t k = 0;
        while (k < ll && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
        if (k == ll) continue;
        json_error_t je;
        json_t *o = json_loadb(s, ll, 0, &je);
        if (!o) {
            moerl_errorf("%s:%lld: invalid JSON at column %d: %s", path, line, je.column, je.text);
            goto out;
        }
        json_t *p = json_is_object(o) ? json_object_get(o, "prompt") : NULL;
        chat_msg one, *msgs = NULL;
        int nm = 0;
        const char *bad = NULL;
        if (!p) bad = json_is_object(o) ? "the field is missing" : "the line is not a JSON object";
        else if (json_is_string(p)) {
            one.role = "user";
            one.content = (char *)json_string_value(p);
            msgs = &one;
            nm = 1;
        } else if (json_is_array(p) && json_array_size(p) > 0) {
            nm = (int)json_array_size(p);
            msgs = xcalloc(nm, sizeof *msgs);
            for (int i = 0; i < nm && !bad; i++) {
                json_t *m = json_array_get(p, i), *r = json_object_get(m, "role"), *c = json_object_get(m, "content");
                if (!json_is_string(r) || !json_is_string(c)) bad = "a message without string role and content";
                else {
                    msgs[i].role = (char *)json_string_value(r);
                    msgs[i].content = (char *)json_string_value(c);
                }
            }
        } else bad = "neither a string nor a non-empty list of messages";
        if (bad) {
            moerl_errorf("%s:%lld: field 'prompt': expected a list of {\"role\", \"content\"} messages or a string, "
                         "got %s", path, line, bad);
            if (msgs != &one) free(msgs);
            json_decref(o);
            goto out;
        }
        if (tokenizer_chat_check(tok_current(), msgs, nm) != MOERL_OK) {
            moerl_error_prefix("%s:%lld: prompt: ", path, line);
            if (msgs != &one) free(msgs);
            json_decref(o);
            goto out;
        }
        if (n == cap) seqs = xrealloc(seqs, (cap = cap ? 2 * cap : 64) * sizeof *seqs);
        memset(&seqs[n], 0, sizeof seqs[n]);
        tok_chat_encode(msgs, nm, true, &seqs[n]);
        n++;
        if (msgs != &one) free(msgs);
        json_decref(o);
    }
    if (n == 0) {
        moerl_errorf("%s: no prompts (every line is blank)", path);
        goto out;
    }
    rc = MOERL_OK;
out:
    free(text);
    if (rc != MOERL_OK) {
        for (int i = 0; i < n; i++) tok_seq_free(&seqs[i]);
        free(seqs);
        return rc;
    }
    *out = seqs;
    *n_out = n;
    return MOERL_OK;
}

/* The policy version of the checkpoint in dir: trainer_state.json's "version" (written with every
 * RL checkpoint), or 0 when the file is absent (an SFT or HF checkpoint). A file that is present
 * but damaged is an error naming it. */
static int checkpoint_version(const char *dir, int *version) {
    char p[4200];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    *version = 0;
    if (access(p, F_OK) != 0) return MOERL_OK;
    json_error_t je;
    json_t *s = json_load_file(p, 0, &je);
    if (!s) return moerl_errorf("%s:%d: invalid JSON: %s", p, je.line, je.text);
    json_t *v = json_object_get(s, "version");
    int ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 2147483647;
    if (ok) *version = (int)json_integer_value(v);
    json_decref(s);
    if (!ok) return moerl_errorf("%s: field 'version': expected an integer ≥ 0 (the policy version)", p);
    return MOERL_OK;
}

int cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *ptoks = NULL, *pfile = NULL, *ptext = NULL, *tpl = "auto";
    int thinking = 1, bf16 = 0;
    double max_new = 64, temp = 1.0, top_p = 1.0, top_k = 0, seed = 0, nsamp = 1, max_seqs = 32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { gen_usage(stdout); return 0; }
        else if (!strcmp(a, "--model") && has) model_dir = argv[++i];
        else if (!strcmp(a, "--prompt-tokens") && has) ptoks = argv[++i];
        else if (!strcmp(a, "--prompts") && has) pfile = argv[++i];
        else if (!strcmp(a, "--prompt") && has) ptext = argv[++i];
        else if (!strcmp(a, "--chat-template") && has) tpl = argv[++i];
        else if (!strcmp(a, "--no-thinking")) thinking = 0;
        else if (!strcmp(a, "--max-new-tokens") && has) { if (parse_num(a, argv[++i], 1, 1e7, &max_new)) return 2; }
        else if (!strcmp(a, "--temperature") && has) { if (parse_num(a, argv[++i], 0, 1e6, &temp)) return 2; }
        else if (!strcmp(a, "--top-p") && has) { if (parse_num(a, argv[++i], 1e-9, 1, &top_p)) return 2; }
        else if (!strcmp(a, "--top-k") && has) { /* -1 = off, as in vLLM */
            if (parse_num(a, argv[++i], -1, 1e9, &top_k)) return 2;
            if (top_k < 0) top_k = 0;
        }
        else if (!strcmp(a, "--seed") && has) { if (parse_num(a, argv[++i], 0, 9e15, &seed)) return 2; }
        else if (!strcmp(a, "-n") && has) { if (parse_num(a, argv[++i], 1, 1e6, &nsamp)) return 2; }
        else if (!strcmp(a, "--max-num-seqs") && has) { if (parse_num(a, argv[++i], 1, 1e5, &max_seqs)) return 2; }
        else if (!strcmp(a, "--dtype") && has) {
            const char *d = argv[++i];
            if (strcmp(d, "fp32") && strcmp(d, "bf16")) {
                fprintf(stderr, "moerl generate: --dtype '%s': expected fp32 or bf16\n", d);
                return 2;
            }
            bf16 = !strcmp(d, "bf16");
        }
        else if (!strcmp(a, "--profile") && has) { /* Chrome trace of the engine steps, written at exit */
            if (trace_open(argv[++i]) != MOERL_OK) {
                fprintf(stderr, "moerl generate: --profile: %s\n", moerl_last_error());
                return 2;
            }
        }
        else {
            fprintf(stderr, "moerl generate: unknown or incomplete option '%s'\n", a);
            gen_usage(stderr);
            return 2;
        }
    }
    if (!model_dir || (!!ptoks + !!pfile + !!ptext) != 1) {
        fprintf(stderr, "moerl generate: --model and exactly one of --prompt / --prompts / --prompt-tokens are required\n");
        return 2;
    }
    moe_model m;
    if (model_load_hf_inference(&m, model_dir) != MOERL_OK) {
        fprintf(stderr, "moerl generate: %s\n", moerl_last_error());
        return 1;
    }
    /* the folder's tokenizer: needed for text prompts; with --prompt-tokens it adds "text" when present */
    const int has_tok = cli_use_tokenizer(model_dir, m.cfg.vocab_size, ptoks ? NULL : tpl, thinking,
                                          "--chat-template") == MOERL_OK;
    if (!has_tok && !ptoks) {
        fprintf(stderr, "moerl generate: %s\n", moerl_last_error());
        model_free(&m);
        return 2;
    }
    int n_prompts = 0, rc = 1, version = 0;
    int **prompts = NULL, *plens = NULL;
    if (checkpoint_version(model_dir, &version) != MOERL_OK) {
        cli_print_error("generate", moerl_last_error());
        model_free(&m);
        return 1;
    }
    if (ptoks) {
        n_prompts = 1;
        prompts = xmalloc(sizeof(int *));
        plens = xmalloc(sizeof(int));
        if (cli_parse_int_list(ptoks, &prompts[0], &plens[0]) != MOERL_OK) {
            fprintf(stderr, "moerl generate: --prompt-tokens: %s\n", moerl_last_error());
            free(prompts); free(plens);
            model_free(&m);
            return 2;
        }
    } else if (ptext) {
        n_prompts = 1;
        prompts = xmalloc(sizeof(int *));
        plens = xmalloc(sizeof(int));
        chat_msg msg = {"user", (char *)ptext};
        tok_seq s = {0};
        tok_chat_encode(&msg, 1, true, &s);
        prompts[0] = s.ids;
        plens[0] = (int)s.n;
    } else {
        tok_seq *seqs;
        if (read_prompts(pfile, &seqs, &n_prompts) != MOERL_OK) {
            cli_print_error("generate", moerl_last_error());
            model_free(&m);
            return 1;
        }
        prompts = xmalloc(n_prompts * sizeof(int *));
        plens = xmalloc(n_prompts * sizeof(int));
        for (int i = 0; i < n_prompts; i++) {
            prompts[i] = seqs[i].ids; /* owned by prompts[] from here */
            plens[i] = (int)seqs[i].n;
        }
        free(seqs);
    }
    int max_plen = 0;
    for (int i = 0; i < n_prompts; i++) max_plen = MOERL_MAX(max_plen, plens[i]);
    engine_config ec = {.max_num_seqs = (int)max_seqs, .max_model_len = max_plen + (int)max_new,
                        .max_num_batched_tokens = MOERL_MAX(256, (int)max_seqs), .bf16_weights = bf16};
    if (m.cfg.max_position_embeddings > 0 && ec.max_model_len > m.cfg.max_position_embeddings) {
        fprintf(stderr, "moerl generate: prompt (%d tokens) + --max-new-tokens %d exceeds the model's context "
                        "max_position_embeddings %d\n", max_plen, (int)max_new, m.cfg.max_position_embeddings);
        goto out;
    }
    engine *e = engine_create(&m.cfg, ec);
    if (!e || engine_load_weights(e, m.params, m.n_params, version) != MOERL_OK) {
        fprintf(stderr, "moerl generate: %s\n", moerl_last_error());
        goto out;
    }
    const int ns = (int)nsamp, total = n_prompts * ns;
    gen_request *reqs = xcalloc(total, sizeof(gen_request));
    for (int i = 0; i < n_prompts; i++)
        for (int j = 0; j < ns; j++) {
            gen_request *r = &reqs[i * ns + j];
            r->id = i * ns + j;
            r->prompt = prompts[i];
            r->prompt_len = plens[i];
            r->sp.temperature = (float)temp;
            r->sp.top_p = (float)top_p;
            r->sp.top_k = (int)top_k;
            r->sp.max_tokens = (int)max_new;
            r->sp.seed = (uint64_t)seed + 1000003ULL * i + j;
            if (engine_add(e, r) != MOERL_OK) {
                fprintf(stderr, "moerl generate: prompt %d: %s\n", i, moerl_last_error());
                engine_free(e);
                for (int k = 0; k < total; k++) gen_request_free_outputs(&reqs[k]);
                free(reqs);
                goto out;
            }
        }
    gen_request **done = xmalloc((total + 1) * sizeof(gen_request *));
    char **lines = xcalloc(total, sizeof(char *)); /* finished responses waiting for their turn */
    int next_out = 0;
    if (version > 0) log_info("model %s is at policy version %d (its trainer_state.json)", model_dir, version);
    double t0 = moerl_now();
    int finished = 0;
    progress pb;
    progress_begin(&pb, "generate", total);
    while (finished < total) {
        int k = engine_step(e, done, total + 1);
        for (int d = 0; d < k; d++) {
            gen_request *r = done[d];
            json_t *o = json_object(), *tk = json_array(), *lp = json_array(), *vv = json_array();
            for (int t = 0; t < r->n_out; t++) {
                json_array_append_new(tk, json_integer(r->out_tokens[t]));
                json_array_append_new(lp, cli_json_real(r->out_logprobs[t]));
                json_array_append_new(vv, json_integer(r->out_versions[t]));
            }
            json_object_set_new(o, "prompt_index", json_integer(r->id / ns));
            json_object_set_new(o, "sample", json_integer(r->id % ns));
            json_object_set_new(o, "tokens", tk);
            json_object_set_new(o, "logprobs", lp);
            json_object_set_new(o, "versions", vv);
            if (has_tok) {
                size_t len;
                char *txt = tok_decode(r->out_tokens, r->n_out, true, &len);
                json_object_set_new(o, "text", cli_json_text(txt ? txt : "", txt ? len : 0));
                free(txt);
            }
            json_object_set_new(o, "finish_reason", json_string(finish_reason_name(r->finish)));
            lines[r->id] = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(7) | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER);
            json_decref(o);
            finished++;
        }
        for (; next_out < total && lines[next_out]; next_out++) { /* in input order */
            printf("%s\n", lines[next_out]);
            free(lines[next_out]);
            lines[next_out] = NULL;
        }
        fflush(stdout);
        if (k < 0) {
            cli_print_error("generate", moerl_last_error());
            break;
        }
        if (k > 0) {
            char extra[96];
            engine_stats cur = engine_get_stats(e);
            double el = moerl_now() - t0;
            snprintf(extra, sizeof extra, "%.0f tokens/s", cur.generated_tokens / (el > 0 ? el : 1e-9));
            progress_update(&pb, finished, extra);
        }
    }
    progress_end(&pb, NULL);
    double dt = moerl_now() - t0;
    engine_stats st = engine_get_stats(e);
    fprintf(stderr,
            "moerl generate: %d response%s, %lld token%s in %.2f s (%.1f tokens/s; prefill %lld token%s, %lld step%s)\n",
            total, moerl_plural(total), (long long)st.generated_tokens, moerl_plural(st.generated_tokens), dt,
            st.generated_tokens / (dt > 0 ? dt : 1e-9), (long long)st.prefill_tokens, moerl_plural(st.prefill_tokens),
            (long long)st.steps, moerl_plural(st.steps));
    for (int k = 0; k < total; k++) {
        gen_request_free_outputs(&reqs[k]);
        free(lines[k]);
    }
    free(lines);
    free(reqs);
    free(done);
    engine_free(e);
    rc = next_out == total ? 0 : 1;
out:
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(plens);
    model_free(&m);
    return rc;
}
