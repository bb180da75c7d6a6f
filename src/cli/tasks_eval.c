/* moerl tasks --task NAME --out DIR [--n-train N] [--n-test N] [--seed S] [--digits D] [--numbers K]
 *             [--format verl|gsm8k]
 *   writes DIR/train.jsonl and DIR/test.jsonl (verl schema; --format gsm8k: openai/gsm8k rows, for
 *   gsm8k-style) for a built-in task; prints one JSON object {"train", "test", "n_train",
 *   "n_test"}. An option of another task (--digits is arith's, --numbers countdown's) is an error,
 *   not silently ignored.
 * moerl tasks --from-gsm8k FILE.jsonl --out DIR
 *   openai/gsm8k rows → DIR/<name of FILE> in verl schema (tasks.h gsm8k_convert); prints {"out", "n"}.
 * moerl eval --model DIR --data FILE.jsonl [--n N] [--max-new-tokens N] [--samples N --temperature T
 *            [--top-p P] [--top-k K] [--seed S]]
 *   held-out accuracy with the row's reward function (greedy by default), and verl's validation
 *   metrics (rl/validate.h: val_run); prints one JSON object {"accuracy", "n", "samples",
 *   "mean_response_length", "max_new_tokens", "data", "preemptions", "prefix_hit_tokens", "metrics":
 *   {"val-core/...", ...}}; rollout.block_size=N rollout.kv_cache_bytes=B rollout.gpu_memory_utilization=F
 *   rollout.enable_prefix_caching=BOOL size the engine's paged KV cache as in moerl rl (docs/engine.md). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "cli/options.h"
#include "data/dataset.h"
#include "data/prompts.h"
#include "data/tasks.h"
#include "model/model.h"
#include "reward/reward.h"
#include "rl/multi_turn.h"
#include "rl/rl.h"
#include "rl/validate.h"

/* moerl tasks --from-gsm8k FILE --out DIR */
static int tasks_from_gsm8k(const char *from, const char *out) {
    const char *base = strrchr(from, '/') ? strrchr(from, '/') + 1 : from;
    char dst[4096], split[256];
    snprintf(dst, sizeof dst, "%s/%s", out, base);
    snprintf(split, sizeof split, "%s", base);
    char *dot = strstr(split, ".jsonl");
    if (dot) *dot = 0;
    int64_t n = 0;
    struct stat a, b;
    if (stat(from, &a) == 0 && stat(dst, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
        fprintf(stderr, "moerl tasks: --out %s would write %s over its own input --from-gsm8k %s: choose another "
                        "--out folder\n", out, dst, from);
        return 2;
    }
    if (moerl_mkdirs(out) != MOERL_OK || gsm8k_convert(from, dst, split, &n) != MOERL_OK) {
        cli_print_error("tasks", moerl_last_error());
        return 1;
    }
    json_t *j = json_object();
    json_object_set_new(j, "out", cli_json_text(dst, strlen(dst)));
    json_object_set_new(j, "n", json_integer(n));
    cli_print_json(j, 0);
    return 0;
}

/* An option of another task is an error, not silently ignored. 0 = fine. */
static int tasks_check_options(const char *task, int raw, int digits_set, int numbers_set) {
    if (raw && strcmp(task, "gsm8k-style")) {
        fprintf(stderr, "moerl tasks: --format gsm8k applies to the gsm8k-style task only, not '%s'\n", task);
        return 2;
    }
    if (digits_set && strcmp(task, "arith") && strcmp(task, "tool_arith")) {
        fprintf(stderr, "moerl tasks: --digits applies to the arith task only (and tool_arith), not '%s'%s\n", task,
                strcmp(task, "countdown") ? "" : " (countdown takes --numbers)");
        return 2;
    }
    if (numbers_set && strcmp(task, "countdown")) {
        fprintf(stderr, "moerl tasks: --numbers applies to the countdown task only, not '%s'\n", task);
        return 2;
    }
    return 0;
}

int cmd_tasks(int argc, char **argv) {
    const char *task = NULL, *out = NULL, *format = "verl", *from = NULL;
    task_opts o;
    task_opts_default(&o);
    int64_t n_train = o.n_train, n_test = o.n_test, seed = (int64_t)o.seed, digits = o.arith_digits,
            numbers = o.countdown_numbers;
    int digits_set = 0, numbers_set = 0, gen_set = 0, nf; /* gen_set: an option of the generators was given */
    const char *const *fam = task_families(&nf);
    char notes[512] = "tasks:";
    for (int k = 0; k < nf; k++) snprintf(notes + strlen(notes), sizeof notes - strlen(notes), " %s", fam[k]);
    const cli_opt opts[] = {
        CLI_OPT_STR("task", &task, "NAME", CLI_ONCE, "the built-in task (listed below)"),
        CLI_OPT_STR("out", &out, "DIR", CLI_ONCE | CLI_REQUIRED, "the folder for train.jsonl and test.jsonl"),
        {.name = "n-train", .type = CLI_INT, .dest = &n_train, .given = &gen_set, .meta = "N", .imin = 1,
         .imax = 100000000, .help = "training rows"},
        {.name = "n-test", .type = CLI_INT, .dest = &n_test, .given = &gen_set, .meta = "N", .imin = 1,
         .imax = 100000000, .help = "held-out rows"},
        {.name = "seed", .type = CLI_INT, .dest = &seed, .given = &gen_set, .meta = "S", .imin = 0, .imax = INT64_MAX,
         .help = "generator seed"},
        {.name = "digits", .type = CLI_INT, .dest = &digits, .given = &digits_set, .meta = "D", .imin = 1, .imax = 18,
         .help = "arith and tool_arith only: digits per operand"},
        {.name = "numbers", .type = CLI_INT, .dest = &numbers, .given = &numbers_set, .meta = "K", .imin = 2, .imax = 6,
         .help = "countdown only: numbers per problem"},
        {.name = "format", .type = CLI_STR, .dest = &format, .given = &gen_set, .meta = "verl|gsm8k",
         .choices = "verl|gsm8k",
         .help = "moerl's rows (verl), or openai/gsm8k rows {\"question\", \"answer\"} with the final answer after "
                 "\"####\" (gsm8k-style only)"},
        CLI_OPT_STR("from-gsm8k", &from, "FILE.jsonl", CLI_ONCE,
                    "convert openai/gsm8k rows to moerl's rows as verl's gsm8k preprocessing does (written to DIR/<name "
                    "of FILE>; the split in extra_info is that name without .jsonl)"),
    };
    const cli_spec spec = {.cmd = "tasks", .opts = opts, .n_opts = CLI_NOPTS(opts), .notes = notes,
                           .synopsis = "--task NAME --out DIR [--n-train N] [--n-test N] [--seed S] [--digits D] "
                                       "[--numbers K] [--format verl|gsm8k]\n   or: moerl tasks --from-gsm8k FILE.jsonl "
                                       "--out DIR",
                           .about = "Writes DIR/train.jsonl and DIR/test.jsonl of a built-in task and prints "
                                    "{\"train\", \"test\", \"n_train\", \"n_test\"}."};
    int code;
    if (cli_parse(&spec, argc, argv, &code)) return code;
    if (from) {
        if (task || gen_set || digits_set || numbers_set) { /* they would be silently unused */
            fprintf(stderr, "moerl tasks: --from-gsm8k takes --out DIR only (no --task, --n-train, --n-test, --seed, "
                            "--digits, --numbers or --format: those options make a built-in task)\n");
            return 2;
        }
        return tasks_from_gsm8k(from, out);
    }
    if (!task) {
        fprintf(stderr, "moerl tasks: --task and --out are required\n");
        return 2;
    }
    const int raw = !strcmp(format, "gsm8k");
    if (tasks_check_options(task, raw, digits_set, numbers_set)) return 2;
    o.n_train = n_train;
    o.n_test = n_test;
    o.seed = (uint64_t)seed;
    o.arith_digits = (int)digits;
    o.countdown_numbers = (int)numbers;
    char tr[4096], te[4096];
    snprintf(tr, sizeof tr, "%s/train.jsonl", out);
    snprintf(te, sizeof te, "%s/test.jsonl", out);
    if ((raw ? task_generate_gsm8k_raw(&o, tr, te) : task_generate(task, &o, tr, te)) != MOERL_OK) {
        cli_print_error("tasks", moerl_last_error());
        return 1;
    }
    json_t *j = json_object();
    json_object_set_new(j, "train", cli_json_text(tr, strlen(tr)));
    json_object_set_new(j, "test", cli_json_text(te, strlen(te)));
    json_object_set_new(j, "n_train", json_integer(o.n_train));
    json_object_set_new(j, "n_test", json_integer(o.n_test));
    cli_print_json(j, 0);
    return 0;
}

/* The eval's JSON line. */
static void eval_print(const val_report *rep, const val_options *o, const dataset *ds, const char *data) {
    json_t *j = json_object();
    json_object_set_new(j, "accuracy", cli_json_real(rep->accuracy));
    json_object_set_new(j, "n", json_integer(o->n_rows > 0 && o->n_rows < dataset_count(ds) ? o->n_rows
                                                                                          : dataset_count(ds)));
    json_object_set_new(j, "samples", json_integer(o->kw.n));
    json_object_set_new(j, "mean_response_length", cli_json_real(rep->mean_len));
    json_object_set_new(j, "max_new_tokens", json_integer(o->max_new_tokens));
    json_object_set_new(j, "data", cli_json_text(data, strlen(data)));
    json_object_set_new(j, "preemptions", json_integer(rep->preemptions)); /* the paged KV cache (docs/engine.md) */
    json_object_set_new(j, "prefix_hit_tokens", json_integer(rep->prefix_hit_tokens));
    json_t *m = json_object();
    for (int i = 0; i < rep->metrics.n; i++) json_object_set_new(m, rep->metrics.keys[i], cli_json_real(rep->metrics.vals[i]));
    json_object_set_new(j, "metrics", m);
    cli_print_json(j, 6);
}

/* eval's scoring through a reward pool (val_run's callback). */
static int eval_pool_score(void *ctx, const reward_request *reqs, int n, reward_result *out) {
    return reward_pool_score(ctx, reqs, n, out);
}

int cmd_eval(int argc, char **argv) {
    const char *model_dir = NULL, *data = NULL, *tpl = "auto";
    int64_t n = 0, max_new = 16, samples = 1, top_k = -1, seed = 1;
    double temp = 0, top_p = 1;
    int no_thinking = 0;
    const cli_opt opts[] = {
        CLI_OPT_STR("model", &model_dir, "DIR", CLI_ONCE | CLI_REQUIRED, "a checkpoint folder"),
        CLI_OPT_STR("data", &data, "FILE.jsonl", CLI_ONCE | CLI_REQUIRED, "task rows (verl schema; moerl tasks writes them)"),
        CLI_OPT_INT("n", &n, "N", 0, 100000000, "evaluate the first N rows (0 = all)"),
        CLI_OPT_INT("max-new-tokens", &max_new, "N", 1, 1000000,
                    "response cap in tokens (data.max_response_length's default; pass the run's to score as it did)"),
        CLI_OPT_INT("samples", &samples, "N", 1, 1000000,
                    "responses per row (rollout.val_kwargs.n): verl's mean@N, best@N, maj@N, std@N; N > 1 needs "
                    "--temperature > 0"),
        CLI_OPT_FLOAT("temperature", &temp, "T", 0, 1e6, "sampling temperature (0 = greedy)"),
        CLI_OPT_FLOAT("top-p", &top_p, "P", 1e-9, 1, "nucleus sampling in (0, 1]; 1 = off"),
        CLI_OPT_INT("top-k", &top_k, "K", -1, 1000000000, "keep the K most likely tokens; 0 or -1 = off"),
        CLI_OPT_INT("seed", &seed, "S", 0, 9000000000000000LL, "sampling seed: response j of row i from (S, i, j)"),
        CLI_OPT_STR("chat-template", &tpl, "NAME", 0,
                    "auto (the checkpoint's own) | qwen3 | chatml | the path of a .jinja file"),
        CLI_OPT_FLAG("no-thinking", &no_thinking, "the chat template's enable_thinking=false (Qwen3: no thinking)"),
    };
    cfg *keys = cfg_new(); /* reward.*=value: score with a reward file, command or server as `moerl rl` does */
    reward_def_keys(keys);
    multi_turn_def_keys(keys); /* rollout.multi_turn.*=value: trajectories with tools, as `moerl rl` runs them */
    rollout_kv_def_keys(keys); /* rollout.block_size, kv_cache_bytes, ...: the engine's paged KV cache, as rl's */
    cli_overrides ov = {0};
    const cli_spec spec = {.cmd = "eval", .opts = opts, .n_opts = CLI_NOPTS(opts), .overrides = &ov, .keys = keys,
                           .synopsis = "--model DIR --data FILE.jsonl [--n N] [--max-new-tokens N] [--samples N "
                                       "--temperature T [--top-p P] [--top-k K] [--seed S]] "
                                       "[--chat-template auto|qwen3|chatml|FILE.jinja] [--no-thinking] [reward.*=VALUE ...] "
                                       "[rollout.multi_turn.*=VALUE ...] [rollout.block_size|kv_cache_bytes|gpu_memory_utilization|"
                                       "enable_prefix_caching=VALUE ...]",
                           .about = "Held-out accuracy with each row's reward function (greedy unless --temperature), "
                                    "and verl's validation metrics; prints {\"accuracy\", \"n\", \"samples\", "
                                    "\"mean_response_length\", \"max_new_tokens\", \"data\", \"metrics\"}. "
                                    "reward.custom_reward_function.path=F.py, reward.command=CMD or reward.url=URL "
                                    "score with your own reward instead of the built-in rules (docs/rewards.md). "
                                    "rollout.multi_turn.enable=true rollout.multi_turn.tool_config_path=T.yaml runs each "
                                    "response as a trajectory with tools (docs/multi-turn.md). rollout.block_size, "
                                    "rollout.kv_cache_bytes, rollout.gpu_memory_utilization and "
                                    "rollout.enable_prefix_caching size the engine's paged KV cache as in moerl rl "
                                    "(docs/engine.md)."};
    int code;
    if (cli_parse(&spec, argc, argv, &code)) {
        cfg_free(keys);
        return code;
    }
    reward_config rcfg;
    multi_turn_config mt;
    rl_config kv = {0}; /* the rollout.* paged-KV keys only */
    reward_pool *pool = NULL;
    const int outside = cli_apply_overrides(keys, &ov) == MOERL_OK && reward_read_config(keys, &rcfg) == MOERL_OK &&
                                multi_turn_read_config(keys, &mt) == MOERL_OK && rollout_kv_read(keys, &kv) == MOERL_OK
                            ? rcfg.kind != REWARD_BUILTIN
                            : -1;
    cli_overrides_free(&ov);
    cfg_free(keys);
    if (outside < 0) {
        cli_print_error("eval", moerl_last_error());
        return 1;
    }
    const int thinking = !no_thinking;
    moe_model m = {0};
    dataset ds = {0};
    int rc = 1;
    val_report rep = {0};
    const val_options o = {.kw = {.n = (int)samples, .temperature = (float)temp, .top_p = (float)top_p,
                                  .top_k = (int)top_k, .do_sample = temp > 0},
                           .n_rows = n, .max_new_tokens = (int)max_new, .max_num_seqs = 64, .seed = (uint64_t)seed,
                           .multi_turn = &mt, .block_size = kv.block_size, .kv_cache_bytes = kv.kv_cache_bytes,
                           .gpu_memory_utilization = kv.gpu_memory_utilization,
                           .enable_prefix_caching = kv.enable_prefix_caching};
    if (samples > 1 && temp == 0) {
        moerl_errorf("--samples %lld needs --temperature > 0: greedy responses would all be the same", (long long)samples);
        goto fail;
    }
    /* the data first (cheap, and its errors name file:line), then the model */
    if (dataset_load(&ds, data) != MOERL_OK || (!outside && cli_check_data_sources(&ds) != MOERL_OK)) goto fail;
    if (model_load_hf_inference(&m, model_dir) != MOERL_OK) goto fail;
    if (cli_use_tokenizer(model_dir, m.cfg.vocab_size, tpl, thinking, "--chat-template") != MOERL_OK) goto fail;
    if (dataset_check_prompts(&ds) != MOERL_OK || multi_turn_attach_tools(&mt, &ds) != MOERL_OK) goto fail;
    log_info("eval: %s responses of at most %lld tokens (--max-new-tokens; a run's data.max_response_length "
             "should match), %lld per row", temp > 0 ? "sampled" : "greedy", (long long)max_new, (long long)samples);
    if (outside) {
        reward_backend *b = reward_backend_create(&rcfg);
        pool = b ? reward_pool_create(b) : NULL;
        if (!pool) goto fail;
    }
    if (val_run(&m, &ds, &o, pool ? eval_pool_score : NULL, pool, &rep) != MOERL_OK) {
        /* a reward error names the row's line: say which file it is in */
        if (!strstr(moerl_last_error(), data)) moerl_error_prefix("%s: ", data);
        goto fail;
    }
    eval_print(&rep, &o, &ds, data);
    rc = 0;
    goto out;
fail:
    cli_print_error("eval", moerl_last_error());
out:
    reward_pool_free(pool);
    val_report_free(&rep);
    dataset_free(&ds);
    model_free(&m);
    return rc;
}
