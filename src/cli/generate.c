/* moerl generate --model DIR (--prompt TEXT | --prompts FILE.jsonl | --prompt-tokens 1,5,9) [options]
 * Runs the rollout engine and prints one JSON object per response on stdout, in input order
 * (prompt 0's samples 0..n-1, then prompt 1's, ...; rollout/batch.h):
 *   {"prompt_index": i, "sample": j, "tokens": [...], "logprobs": [...], "versions": [...],
 *    "text": "..." (when the model folder has a tokenizer), "finish_reason": "stop"|"length"}
 * "versions" holds the policy version of each token's weights: the checkpoint's own version
 * (model/ckpt_meta.h), else 0. --prompts reads JSONL rows of which "prompt" (with "tools"), or
 * the apply_chat_template object shape, is used (data/prompts.h); prompts go through the
 * checkpoint's tokenizer and chat template (--chat-template: also a .jinja file). Progress and
 * throughput go to stderr. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "base/trace.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "cli/options.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "model/ckpt_meta.h"
#include "model/model.h"
#include "rollout/batch.h"

typedef struct {
    const char *model_dir, *pfile, *ptext, *tpl, *profile, *dtype;
    cli_int_list ptoks;
    int no_thinking;
    int batch_invariant; /* --batch-invariant: rollout.batch_invariant's kernels */
    int64_t max_new, top_k, seed, nsamp, max_seqs;
    double temp, top_p;
    int64_t block_size, kv_bytes; /* the paged KV cache (engine.h, docs/engine.md) */
    double mem_util;
    int prefix_caching;
} gen_args;

static const char gen_notes[] = /* %d: the byte tokenizer's vocabulary */
    "--prompts reads JSONL rows with a 'prompt' field: a list of chat messages {\"role\", \"content\", ...}\n"
    "(verl's schema; a row's 'tools' list goes with it; other fields are ignored), a plain string (one\n"
    "user message), or an object {\"messages\", \"tools\", \"add_generation_prompt\", \"enable_thinking\", ...}\n"
    "as apply_chat_template takes (a row may also be that object itself). Messages keep tool_calls,\n"
    "reasoning_content and every other key for the template (docs/chat-templates.md).\n"
    "--prompt and --prompts need the model folder's tokenizer: tokenizer.json (Hugging Face), or\n"
    "moerl's byte tokenizer (tokenizer_moerl.json or vocab_size %d). Generation stops at every eos id\n"
    "of generation_config.json.\n"
    "Output: one JSON line per response, in input order (prompt, then sample). The policy version of an\n"
    "RL checkpoint (its trainer_state.json) is reported in 'versions'.";

/* The options (table) → a; 0 = go on, else the exit code is in *code. */
static int gen_parse(int argc, char **argv, gen_args *a, int *code) {
    char notes[1024];
    snprintf(notes, sizeof notes, gen_notes, TOK_VOCAB_SIZE);
    const cli_opt opts[] = {
        CLI_OPT_STR("model", &a->model_dir, "DIR", CLI_ONCE | CLI_REQUIRED, "a checkpoint folder"),
        CLI_OPT_STR("prompt", &a->ptext, "TEXT", CLI_ONCE, "one user message, through the model's chat template"),
        CLI_OPT_STR("prompts", &a->pfile, "FILE.jsonl", CLI_ONCE, "one prompt per row (below)"),
        CLI_OPT_LIST("prompt-tokens", &a->ptoks, "1,5,9", CLI_ONCE, "one prompt as token ids"),
        CLI_OPT_INT("max-new-tokens", &a->max_new, "N", 1, 10000000, "new tokens per response"),
        CLI_OPT_FLOAT("temperature", &a->temp, "T", 0, 1e6, "0 = greedy"),
        CLI_OPT_FLOAT("top-p", &a->top_p, "P", 1e-9, 1, "nucleus sampling in (0, 1]; 1 = off"),
        CLI_OPT_INT("top-k", &a->top_k, "K", -1, 1000000000, "keep the K most likely tokens; 0 or -1 = off"),
        CLI_OPT_INT("seed", &a->seed, "S", 0, 9000000000000000LL,
                    "base seed; response j of prompt i uses seed S + 1000003·i + j"),
        {.short_name = 'n', .type = CLI_INT, .dest = &a->nsamp, .meta = "N", .imin = 1, .imax = 1000000,
         .help = "samples per prompt"},
        CLI_OPT_INT("max-num-seqs", &a->max_seqs, "N", 1, 100000, "sequences in flight"),
        CLI_OPT_CHOICE("dtype", &a->dtype, "fp32|bf16", "fp32|bf16",
                       "weights the engine computes from (bf16: as rollout.dtype bf16)"),
        CLI_OPT_STR("chat-template", &a->tpl, "NAME", 0,
                    "auto (the checkpoint's own) | qwen3 | chatml | the path of a .jinja file"),
        CLI_OPT_FLAG("no-thinking", &a->no_thinking, "the chat template's enable_thinking=false (Qwen3: no thinking)"),
        CLI_OPT_FLAG("batch-invariant", &a->batch_invariant,
                     "batch-invariant kernels (as rollout.batch_invariant): a response and its logprobs do not depend "
                     "on the other prompts, --max-num-seqs or the thread count; slower (with --dtype bf16: from the "
                     "bf16-rounded weights)"),
        CLI_OPT_INT("block-size", &a->block_size, "N", 1, 65536, "tokens per KV-cache block (as rollout.block_size)"),
        CLI_OPT_INT("kv-cache-bytes", &a->kv_bytes, "B", 0, INT64_MAX,
                    "KV-cache budget in bytes (as rollout.kv_cache_bytes; 0 = room for --max-num-seqs full-length "
                    "sequences); sequences that do not fit wait, the newest are preempted when blocks run out"),
        CLI_OPT_FLOAT("gpu-memory-utilization", &a->mem_util, "F", 0, 1,
                      "with --kv-cache-bytes 0: the KV budget is this fraction of the memory available after the "
                      "weights (as rollout.gpu_memory_utilization; MemAvailable on a CPU host)"),
        CLI_OPT_FLAG("enable-prefix-caching", &a->prefix_caching,
                     "share the KV blocks of common prompt prefixes: the -n samples of a prompt prefill it once (as "
                     "rollout.enable_prefix_caching)"),
        CLI_OPT_STR("profile", &a->profile, "FILE", 0, "write a Chrome trace (Perfetto) of the engine's steps and kernels"),
    };
    const cli_spec spec = {.cmd = "generate", .opts = opts, .n_opts = CLI_NOPTS(opts), .notes = notes,
                           .synopsis = "--model DIR (--prompt TEXT | --prompts FILE.jsonl | --prompt-tokens 1,5,9) "
                                       "[options]",
                           .about = "Samples responses with the rollout engine: one JSON line per response on stdout."};
    if (cli_parse(&spec, argc, argv, code)) return 1;
    if (a->top_k < 0) a->top_k = 0; /* -1 = off, as in vLLM */
    if (a->kv_bytes > 0 && a->mem_util > 0) { /* one budget, as rollout.* refuses both */
        free(a->ptoks.v);
        fprintf(stderr, "moerl generate: --kv-cache-bytes %lld and --gpu-memory-utilization %g both give the KV budget: "
                        "give one of them\n", (long long)a->kv_bytes, a->mem_util);
        *code = 2;
        return 1;
    }
    if ((!!a->ptoks.v + !!a->pfile + !!a->ptext) != 1) {
        fprintf(stderr, "moerl generate: --model and exactly one of --prompt / --prompts / --prompt-tokens are required\n");
        free(a->ptoks.v);
        *code = 2;
        return 1;
    }
    if (a->profile && trace_open(a->profile) != MOERL_OK) { /* Chrome trace of the engine steps, written at exit */
        fprintf(stderr, "moerl generate: --profile: %s\n", moerl_last_error());
        free(a->ptoks.v);
        *code = 2;
        return 1;
    }
    return 0;
}

/* The prompts as token ids (prompts[i] heap, plens[i]); the tokenizer is current. Errors name the
 * option or file:line. */
static int gen_load_prompts(gen_args *a, int ***prompts, int **plens, int *n) {
    tok_seq *seqs = NULL;
    *n = 1;
    if (a->ptoks.v) {
        seqs = xcalloc(1, sizeof *seqs);
        for (int i = 0; i < a->ptoks.n; i++) tok_seq_push(&seqs[0], a->ptoks.v[i]);
    } else if (a->ptext) {
        chat_msg msg = {"user", (char *)a->ptext, NULL};
        seqs = xcalloc(1, sizeof *seqs);
        tok_chat_encode(&msg, 1, true, &seqs[0]);
    } else if (prompt_file_read(a->pfile, &seqs, n) != MOERL_OK) {
        return MOERL_ERR;
    }
    *prompts = xmalloc(*n * sizeof(int *));
    *plens = xmalloc(*n * sizeof(int));
    for (int i = 0; i < *n; i++) {
        (*prompts)[i] = seqs[i].ids; /* owned by prompts[] from here */
        (*plens)[i] = (int)seqs[i].n;
    }
    free(seqs);
    return MOERL_OK;
}

typedef struct {
    int has_tok;
} gen_out;

/* One response as a JSON line on stdout. */
static void gen_emit(void *ctx, const gen_request *r, int prompt_index, int sample) {
    const gen_out *g = ctx;
    json_t *o = json_object(), *tk = json_array(), *lp = json_array(), *vv = json_array();
    for (int t = 0; t < r->n_out; t++) {
        json_array_append_new(tk, json_integer(r->out_tokens[t]));
        json_array_append_new(lp, cli_json_real(r->out_logprobs[t]));
        json_array_append_new(vv, json_integer(r->out_versions[t]));
    }
    json_object_set_new(o, "prompt_index", json_integer(prompt_index));
    json_object_set_new(o, "sample", json_integer(sample));
    json_object_set_new(o, "tokens", tk);
    json_object_set_new(o, "logprobs", lp);
    json_object_set_new(o, "versions", vv);
    if (g->has_tok) {
        size_t len;
        char *txt = tok_decode(r->out_tokens, r->n_out, true, &len);
        json_object_set_new(o, "text", cli_json_text(txt ? txt : "", txt ? len : 0));
        free(txt);
    }
    json_object_set_new(o, "finish_reason", json_string(finish_reason_name(r->finish)));
    char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9) | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER);
    printf("%s\n", line);
    fflush(stdout);
    free(line);
    json_decref(o);
}

/* The engine over the prompts: responses on stdout, the summary on stderr. Exit code. */
static int gen_run(const gen_args *a, const moe_model *m, int version, int has_tok, int **prompts, int *plens, int n) {
    int max_plen = 0;
    for (int i = 0; i < n; i++) max_plen = MOERL_MAX(max_plen, plens[i]);
    engine_config ec = {.max_num_seqs = (int)a->max_seqs, .max_model_len = max_plen + (int)a->max_new,
                        .max_num_batched_tokens = MOERL_MAX(256, (int)a->max_seqs), .bf16_weights = !strcmp(a->dtype, "bf16"),
                        .block_size = (int)a->block_size, .kv_cache_bytes = a->kv_bytes,
                        .gpu_memory_utilization = a->mem_util, .enable_prefix_caching = a->prefix_caching};
    if (m->cfg.max_position_embeddings > 0 && ec.max_model_len > m->cfg.max_position_embeddings) {
        fprintf(stderr, "moerl generate: prompt (%d tokens) + --max-new-tokens %d exceeds the model's context "
                        "max_position_embeddings %d\n", max_plen, (int)a->max_new, m->cfg.max_position_embeddings);
        return 1;
    }
    moe_config mc = m->cfg;
    mc.exec.batch_invariant = a->batch_invariant;
    engine *e = engine_create(&mc, ec);
    if (!e || engine_load_weights(e, m->params, m->n_params, version) != MOERL_OK) {
        fprintf(stderr, "moerl generate: %s\n", moerl_last_error());
        engine_free(e);
        return 1;
    }
    gen_batch b = {.prompts = prompts, .prompt_lens = plens, .n_prompts = n, .n_samples = (int)a->nsamp,
                   .sp = {.temperature = (float)a->temp, .top_p = (float)a->top_p, .top_k = (int)a->top_k,
                          .max_tokens = (int)a->max_new, .seed = (uint64_t)a->seed}};
    gen_out g = {has_tok};
    if (version > 0) log_info("model %s is at policy version %d (its trainer_state.json)", a->model_dir, version);
    const int total = n * b.n_samples;
    int emitted = 0;
    double t0 = moerl_now();
    int rc = engine_generate_batch(e, &b, gen_emit, &g, "generate", &emitted);
    if (rc == MOERL_OK && emitted != total)
        rc = moerl_errorf("the engine returned %d of the %d responses asked for", emitted, total);
    if (rc != MOERL_OK) { /* the error alone: no summary of a batch that did not finish */
        cli_print_error("generate", moerl_last_error());
        engine_free(e);
        return 1;
    }
    double dt = moerl_now() - t0;
    engine_stats st = engine_get_stats(e);
    fprintf(stderr,
            "moerl generate: %d response%s, %lld token%s in %.2f s (%.1f tokens/s; prefill %lld token%s, %lld step%s)\n",
            total, moerl_plural(total), (long long)st.generated_tokens, moerl_plural(st.generated_tokens), dt,
            st.generated_tokens / (dt > 0 ? dt : 1e-9), (long long)st.prefill_tokens, moerl_plural(st.prefill_tokens),
            (long long)st.steps, moerl_plural(st.steps));
    const engine_config rc_ = engine_get_config(e);
    fprintf(stderr,
            "moerl generate: KV cache %lld blocks of %d tokens (%.1f MiB), peak %lld in use; %lld preemption%s; %lld "
            "prompt token%s from shared prefix blocks\n",
            (long long)st.kv_blocks_total, rc_.block_size, rc_.kv_cache_bytes / 1048576.0, (long long)st.kv_blocks_peak,
            (long long)st.preemptions, moerl_plural(st.preemptions), (long long)st.prefix_hit_tokens,
            moerl_plural(st.prefix_hit_tokens));
    engine_free(e);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    gen_args a = {.tpl = "auto", .dtype = "fp32", .max_new = 64, .temp = 1.0, .top_p = 1.0, .nsamp = 1, .max_seqs = 32,
                .block_size = 16};
    int code;
    if (gen_parse(argc, argv, &a, &code)) return code;
    moe_model m;
    if (model_load_hf_inference(&m, a.model_dir) != MOERL_OK) {
        fprintf(stderr, "moerl generate: %s\n", moerl_last_error());
        free(a.ptoks.v);
        return 1;
    }
    /* the folder's tokenizer: needed for text prompts; with --prompt-tokens it adds "text" when present */
    const int has_tok = cli_use_tokenizer(a.model_dir, m.cfg.vocab_size, a.ptoks.v ? NULL : a.tpl, !a.no_thinking,
                                          "--chat-template") == MOERL_OK;
    int n_prompts = 0, rc = 1, version = 0;
    int **prompts = NULL, *plens = NULL;
    if (!has_tok && !a.ptoks.v) {
        fprintf(stderr, "moerl generate: %s\n", moerl_last_error());
        rc = 2;
    } else if (checkpoint_policy_version(a.model_dir, &version) != MOERL_OK ||
               gen_load_prompts(&a, &prompts, &plens, &n_prompts) != MOERL_OK) {
        cli_print_error("generate", moerl_last_error());
        n_prompts = 0;
    } else {
        rc = gen_run(&a, &m, version, has_tok, prompts, plens, n_prompts);
    }
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(plens);
    free(a.ptoks.v);
    model_free(&m);
    return rc;
}
