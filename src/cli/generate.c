/* moerl generate --model DIR (--prompt-tokens 1,5,9 | --prompts FILE.jsonl) [options]
 * Runs the rollout engine and prints one JSON object per response on stdout:
 *   {"prompt_index": i, "sample": j, "tokens": [...], "logprobs": [...], "versions": [...],
 *    "text": "..." (models with moerl's byte tokenizer), "finish_reason": "stop"|"length"}
 * Progress and throughput go to stderr. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "base/trace.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "rollout/engine.h"

static void gen_usage(FILE *f) {
    fprintf(f,
            "usage: moerl generate --model DIR (--prompt-tokens 1,5,9 | --prompts FILE.jsonl) [options]\n"
            "  --max-new-tokens N   new tokens per response (default 64)\n"
            "  --temperature T      0 = greedy (default 1.0)\n"
            "  --top-p P            nucleus sampling, (0,1] (default 1.0 = off)\n"
            "  --top-k K            keep the K most likely tokens (default 0 = off)\n"
            "  --seed S             base seed; response j of prompt i uses seed S + 1000003·i + j (default 0)\n"
            "  -n N                 samples per prompt (default 1)\n"
            "  --max-num-seqs N     sequences in flight (default 32)\n"
            "  --profile FILE       write a Chrome trace (Perfetto) of the engine's steps and kernels\n"
            "--prompts reads verl-style JSONL (field 'prompt': chat messages) and needs a model trained with\n"
            "moerl's byte tokenizer (vocab_size >= %d).\n",
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

int cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *ptoks = NULL, *pfile = NULL;
    double max_new = 64, temp = 1.0, top_p = 1.0, top_k = 0, seed = 0, nsamp = 1, max_seqs = 32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { gen_usage(stdout); return 0; }
        else if (!strcmp(a, "--model") && has) model_dir = argv[++i];
        else if (!strcmp(a, "--prompt-tokens") && has) ptoks = argv[++i];
        else if (!strcmp(a, "--prompts") && has) pfile = argv[++i];
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
    if (!model_dir || (!ptoks == !pfile)) {
        fprintf(stderr, "moerl generate: --model and exactly one of --prompt-tokens / --prompts are required\n");
        return 2;
    }
    moe_model m;
    if (model_load_hf(&m, model_dir) != MOERL_OK) {
        fprintf(stderr, "moerl generate: %s\n", moerl_last_error());
        return 1;
    }
    const int has_tok = m.cfg.vocab_size >= TOK_VOCAB_SIZE;
    int n_prompts = 0, rc = 1;
    int **prompts = NULL, *plens = NULL;
    dataset ds = {0};
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
    } else {
        if (!has_tok) {
            fprintf(stderr, "moerl generate: --prompts needs a tokenizer, but model '%s' has vocab_size %d < %d "
                            "(moerl's byte tokenizer); use --prompt-tokens\n", model_dir, m.cfg.vocab_size, TOK_VOCAB_SIZE);
            model_free(&m);
            return 2;
        }
        if (dataset_load(&ds, pfile) != MOERL_OK) {
            fprintf(stderr, "moerl generate: %s\n", moerl_last_error());
            model_free(&m);
            return 1;
        }
        n_prompts = (int)dataset_count(&ds);
        prompts = xmalloc(n_prompts * sizeof(int *));
        plens = xmalloc(n_prompts * sizeof(int));
        for (int i = 0; i < n_prompts; i++) {
            const ds_row *row = dataset_row(&ds, i);
            tok_seq s = {0};
            tok_chat_encode(row->prompt, row->n_prompt, true, &s);
            prompts[i] = s.ids;
            plens[i] = (int)s.n;
        }
    }
    int max_plen = 0;
    for (int i = 0; i < n_prompts; i++) max_plen = MOERL_MAX(max_plen, plens[i]);
    engine_config ec = {.max_num_seqs = (int)max_seqs, .max_model_len = max_plen + (int)max_new,
                        .max_num_batched_tokens = MOERL_MAX(256, (int)max_seqs)};
    if (m.cfg.max_position_embeddings > 0 && ec.max_model_len > m.cfg.max_position_embeddings) {
        fprintf(stderr, "moerl generate: prompt (%d tokens) + --max-new-tokens %d exceeds the model's context "
                        "max_position_embeddings %d\n", max_plen, (int)max_new, m.cfg.max_position_embeddings);
        goto out;
    }
    engine *e = engine_create(&m.cfg, ec);
    if (!e || engine_load_weights(e, m.params, m.n_params, 0) != MOERL_OK) {
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
            char *js = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(7) | JSON_ENSURE_ASCII);
            printf("%s\n", js);
            free(js);
            json_decref(o);
            finished++;
        }
        if (k < 0) break;
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
    fprintf(stderr, "moerl generate: %d responses, %lld tokens in %.2f s (%.1f tokens/s; prefill %lld tokens, %lld steps)\n",
            total, (long long)st.generated_tokens, dt, st.generated_tokens / (dt > 0 ? dt : 1e-9),
            (long long)st.prefill_tokens, (long long)st.steps);
    for (int k = 0; k < total; k++) gen_request_free_outputs(&reqs[k]);
    free(reqs);
    free(done);
    engine_free(e);
    rc = 0;
out:
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(plens);
    if (pfile) dataset_free(&ds);
    model_free(&m);
    return rc;
}
