#include "cli/common.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/log.h"
#include "base/trace.h"
#include "data/tasks.h"
#include "data/tokenizer.h"

void openblas_set_num_threads(int n);

void cli_def_model_keys(cfg *c) {
    cfg_def_str(c, "model.path", "", "HF checkpoint dir to start from; empty = new model from model.* below");
    cfg_def_int(c, "model.vocab_size", TOK_VOCAB_SIZE, "vocabulary (≥ 259 for the byte tokenizer)");
    cfg_def_int(c, "model.hidden_size", 128, "hidden size H");
    cfg_def_int(c, "model.intermediate_size", 256, "dense MLP width (layers in mlp_only_layers)");
    cfg_def_int(c, "model.moe_intermediate_size", 128, "expert width I");
    cfg_def_int(c, "model.num_hidden_layers", 2, "decoder layers");
    cfg_def_int(c, "model.num_attention_heads", 4, "query heads");
    cfg_def_int(c, "model.num_key_value_heads", 2, "key/value heads (GQA)");
    cfg_def_int(c, "model.head_dim", 32, "head dimension (may differ from H/heads, as in Qwen3)");
    cfg_def_int(c, "model.num_experts", 8, "experts per MoE layer");
    cfg_def_int(c, "model.num_experts_per_tok", 2, "top-k");
    cfg_def_int(c, "model.decoder_sparse_step", 1, "every n-th layer is MoE");
    cfg_def_int_list(c, "model.mlp_only_layers", NULL, 0, "layers with a dense MLP");
    cfg_def_bool(c, "model.norm_topk_prob", true, "renormalise the top-k router weights");
    cfg_def_bool(c, "model.tie_word_embeddings", false, "share embedding and LM head");
    cfg_def_float(c, "model.rope_theta", 10000.0, "RoPE base");
    cfg_def_float(c, "model.rms_norm_eps", 1e-6, "RMSNorm epsilon");
    cfg_def_int(c, "model.max_position_embeddings", 512, "context length");
    cfg_def_float(c, "model.router_aux_loss_coef", 0.001, "weight of the HF load-balancing loss");
    cfg_def_float(c, "model.initializer_range", 0.02, "std of the random init");
    cfg_def_int(c, "model.seed", 1, "seed of the random init");
    /* MoE execution switches (model.h moe_exec_opts; README "MoE ablation"): the math is the same */
    cfg_def_bool(c, "model.moe.grouped_gemm", true, "MoE: sorted permute + grouped GEMM (false: HF-style loop over experts)");
    cfg_def_bool(c, "model.moe.fused_permute", true, "MoE: gather fused into the grouped GEMM, weighted unpermute in one pass");
    cfg_def_bool(c, "model.moe.stacked_weights", true, "MoE: pre-stacked expert weights (false: per-expert buffers stacked per call)");
    cfg_def_bool(c, "model.moe.hand_on_row_idx", true, "MoE: the router's row_idx handed to the permute (false: rebuilt)");
    cfg_def_bool(c, "model.moe.pack_weights", true, "MoE: rollout engine packs expert weights in the decode kernel's panel layout (NZ)");
}

/* model.moe.* → the model's execution switches (any model, loaded or new). */
static void cli_apply_moe_switches(const cfg *c, moe_model *m) {
    m->cfg.exec.per_expert_loop = !cfg_bool(c, "model.moe.grouped_gemm");
    m->cfg.exec.separate_permute = !cfg_bool(c, "model.moe.fused_permute");
    m->cfg.exec.per_expert_weights = !cfg_bool(c, "model.moe.stacked_weights");
    m->cfg.exec.rebuild_row_idx = !cfg_bool(c, "model.moe.hand_on_row_idx");
    m->cfg.exec.no_pack = !cfg_bool(c, "model.moe.pack_weights");
}

void cli_def_data_keys(cfg *c) {
    cfg_def_str(c, "data.task", "arith", "built-in task to generate (arith, gsm8k-style, countdown); empty = use files");
    cfg_def_str(c, "data.train_files", "", "train JSONL (verl schema) when data.task is empty");
    cfg_def_str(c, "data.val_files", "", "held-out JSONL when data.task is empty");
    cfg_def_int(c, "data.n_train", 2000, "rows generated for training");
    cfg_def_int(c, "data.n_test", 200, "rows generated for held-out evaluation");
    cfg_def_int(c, "data.seed", 1, "task generator seed");
    cfg_def_int(c, "data.arith_digits", 2, "arith: digits per operand");
    cfg_def_int(c, "data.countdown_numbers", 4, "countdown: numbers per problem");
    cfg_def_int(c, "data.max_prompt_length", 0,
                "prompt tokens at most (chat template applied): a longer prompt is an error naming its row, or "
                "dropped with data.filter_overlong_prompts; 0 = no limit (moerl plan then plans for 512)");
    cfg_def_bool(c, "data.filter_overlong_prompts", false,
                 "drop the prompts longer than data.max_prompt_length (train and held-out rows; the count is logged) "
                 "instead of refusing them");
    cfg_def_int(c, "data.max_response_length", 16, "new tokens at most per response (eval and rollout)");
    cfg_def_str(c, "data.chat_template", "auto", "auto (the checkpoint's own: Qwen3's, or chatml for moerl's byte tokenizer) | qwen3 | chatml");
    cfg_def_bool(c, "data.enable_thinking", true, "Qwen3 chat template's enable_thinking (false: empty think block in the prompt)");
}

/* The model.* architecture keys against a model loaded from `path` (its config.json), for every
 * command that takes the architecture from a checkpoint (cli_build_model: model.path; plan and
 * simulate: --model or model.path). flag: how the path was given ("model.path", "--model", named in
 * the messages); path_origin: where it came from, a cfg origin ("override" or "command line" = the
 * command line; anything else = a config file). */
static int cli_check_arch_keys(const cfg *c, const char *flag, const char *path, const char *path_origin) {
    /* The architecture comes from the checkpoint's config.json, so a model.* value given as well
     * would be silently ignored (and recorded as if it had been used). A model.path given on the
     * command line wins over the config file's model.* keys (they are named in a note), so
     * `--config examples/demo.yaml model.path=DIR` continues from DIR; every other combination
     * is an error naming every conflicting key at once. */
    static const char *arch[] = {"model.vocab_size", "model.hidden_size", "model.intermediate_size",
        "model.moe_intermediate_size", "model.num_hidden_layers", "model.num_attention_heads",
        "model.num_key_value_heads", "model.head_dim", "model.num_experts", "model.num_experts_per_tok",
        "model.decoder_sparse_step", "model.mlp_only_layers", "model.norm_topk_prob",
        "model.tie_word_embeddings", "model.rope_theta", "model.rms_norm_eps", "model.max_position_embeddings",
        "model.router_aux_loss_coef", "model.initializer_range", "model.seed"};
    /* a path that cannot be read refuses the run first: no warning about keys it would have overridden */
    char cj_path[4200];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(cj_path, sizeof cj_path, "%s/config.json", path);
    else snprintf(cj_path, sizeof cj_path, "%s", path);
    if (access(cj_path, R_OK) != 0)
        return moerl_errorf("%s: cannot read '%s': %s (give a checkpoint folder holding config.json, or the "
                            "config.json file)",
                            flag, cj_path, strerror(errno));
    /* nor one whose config.json is not a model's (cheap: no weights are read here) */
    moe_config probe;
    if (moe_config_load(&probe, cj_path) != MOERL_OK) return moerl_error_prefix("%s: ", flag);
#define ORIGIN(o) (strcmp((o), "override") ? (o) : "command line")
    path_origin = ORIGIN(path_origin);
    const int path_cli = !strcmp(path_origin, "command line");
    char ignored[2048] = "", conflict[2048] = "";
    for (size_t i = 0; i < sizeof arch / sizeof arch[0]; i++) {
        const char *o = cfg_origin(c, arch[i]);
        if (!strcmp(o, "default")) continue;
        char *dst = path_cli && strcmp(o, "override") ? ignored : conflict;
        size_t n = strlen(dst);
        snprintf(dst + n, sizeof ignored - n, "%s%s (%s)", n ? ", " : "", arch[i], ORIGIN(o));
    }
    const size_t pl = strlen(path);
    const char *cj = pl >= 5 && !strcmp(path + pl - 5, ".json") ? "" : "/config.json";
    if (conflict[0])
        return moerl_errorf("%s (%s) loads the architecture from %s%s, but model.* keys are set as well: %s; drop "
                            "them (edit a copy of the config.json to plan another architecture), or drop %s to "
                            "take the architecture from model.* (a new model)",
                            flag, path_origin, path, cj, conflict, flag);
    if (ignored[0])
        log_warn("%s given on the command line: the architecture comes from %s%s; ignored from the config file: %s",
                 flag, path, cj, ignored);
#undef ORIGIN
    return MOERL_OK;
}

int cli_model_config(const cfg *c, const char *model, moe_config *mc) {
    if (model && cfg_str(c, "model.path")[0]) /* one would be dropped silently */
        return moerl_errorf("--model %s and model.path=%s (%s) both name a model: give one", model,
                            cfg_str(c, "model.path"),
                            strcmp(cfg_origin(c, "model.path"), "override") ? cfg_origin(c, "model.path") : "command line");
    const char *path = model ? model : cfg_str(c, "model.path");
    if (path[0]) {
        /* --model is a command-line flag: model.* keys given with it would be silently ignored */
        if (cli_check_arch_keys(c, model ? "--model" : "model.path", path,
                                model ? "command line" : cfg_origin(c, "model.path")) != MOERL_OK)
            return MOERL_ERR;
        char p[4200];
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(p, sizeof p, "%s/config.json", path);
        else snprintf(p, sizeof p, "%s", path);
        return moe_config_load(mc, p);
    }
    memset(mc, 0, sizeof *mc);
    mc->vocab_size = (int)cfg_int(c, "model.vocab_size");
    mc->hidden_size = (int)cfg_int(c, "model.hidden_size");
    mc->intermediate_size = (int)cfg_int(c, "model.intermediate_size");
    mc->moe_intermediate_size = (int)cfg_int(c, "model.moe_intermediate_size");
    mc->num_hidden_layers = (int)cfg_int(c, "model.num_hidden_layers");
    mc->num_attention_heads = (int)cfg_int(c, "model.num_attention_heads");
    mc->num_key_value_heads = (int)cfg_int(c, "model.num_key_value_heads");
    mc->head_dim = (int)cfg_int(c, "model.head_dim");
    mc->num_experts = (int)cfg_int(c, "model.num_experts");
    mc->num_experts_per_tok = (int)cfg_int(c, "model.num_experts_per_tok");
    mc->decoder_sparse_step = (int)cfg_int(c, "model.decoder_sparse_step");
    int nl;
    const int64_t *ml = cfg_int_list(c, "model.mlp_only_layers", &nl);
    if (nl > MOERL_MAX_LAYERS) return moerl_errorf("model.mlp_only_layers: more than %d entries", MOERL_MAX_LAYERS);
    mc->n_mlp_only_layers = nl;
    for (int i = 0; i < nl; i++) mc->mlp_only_layers[i] = (int)ml[i];
    mc->norm_topk_prob = cfg_bool(c, "model.norm_topk_prob");
    mc->tie_word_embeddings = cfg_bool(c, "model.tie_word_embeddings");
    mc->rope_theta = (float)cfg_float(c, "model.rope_theta");
    mc->rms_norm_eps = (float)cfg_float(c, "model.rms_norm_eps");
    mc->max_position_embeddings = (int)cfg_int(c, "model.max_position_embeddings");
    mc->router_aux_loss_coef = (float)cfg_float(c, "model.router_aux_loss_coef");
    mc->initializer_range = (float)cfg_float(c, "model.initializer_range");
    mc->bos_token_id = TOK_BOS;
    mc->eos_token_id = TOK_EOS;
    if (mc->vocab_size < TOK_VOCAB_SIZE)
        return moerl_errorf("model.vocab_size %d is smaller than the byte tokenizer's %d", mc->vocab_size,
                            TOK_VOCAB_SIZE);
    if (moe_config_validate(mc) != MOERL_OK) return moerl_error_prefix("model.*: ");
    return MOERL_OK;
}

int cli_build_model(const cfg *c, moe_model *m) {
    const char *path = cfg_str(c, "model.path");
    if (path[0]) {
        if (cli_check_arch_keys(c, "model.path", path, cfg_origin(c, "model.path")) != MOERL_OK) return MOERL_ERR;
        if (model_load_hf(m, path) != MOERL_OK) return moerl_error_prefix("model.path: ");
        cli_apply_moe_switches(c, m);
        log_info("loaded model from %s (%lld parameters)", path, (long long)model_num_params(m));
        return cli_use_tokenizer(path, m->cfg.vocab_size, cfg_str(c, "data.chat_template"),
                                 cfg_bool(c, "data.enable_thinking"), "data.chat_template");
    }
    moe_config mc;
    if (cli_model_config(c, "", &mc) != MOERL_OK) return MOERL_ERR;
    if (model_init(m, &mc) != MOERL_OK) return MOERL_ERR;
    model_init_random(m, (uint64_t)cfg_int(c, "model.seed"));
    cli_apply_moe_switches(c, m);
    if (mc.num_experts == 0) {
        /* HF Qwen3-MoE: num_experts = 0 makes every layer a dense MLP; top-k then selects nothing */
        if (strcmp(cfg_origin(c, "model.num_experts_per_tok"), "default"))
            log_warn("model.num_experts_per_tok=%d is unused: model.num_experts=0 builds a dense model (every layer "
                     "a dense MLP of model.intermediate_size=%d)", mc.num_experts_per_tok, mc.intermediate_size);
        log_info("new model: %d layer%s, hidden %d, dense (model.num_experts=0: no experts, MLP width %d), %lld "
                 "parameters", mc.num_hidden_layers, moerl_plural(mc.num_hidden_layers), mc.hidden_size, mc.intermediate_size,
                 (long long)model_num_params(m));
    } else
        log_info("new model: %d layer%s, hidden %d, %d experts top-%d, %lld parameters", mc.num_hidden_layers,
                 moerl_plural(mc.num_hidden_layers), mc.hidden_size, mc.num_experts, mc.num_experts_per_tok, (long long)model_num_params(m));
    return cli_use_tokenizer(NULL, mc.vocab_size, cfg_str(c, "data.chat_template"), cfg_bool(c, "data.enable_thinking"),
                             "data.chat_template");
}

int cli_use_tokenizer(const char *model_dir, int vocab_size, const char *chat_template, bool enable_thinking,
                      const char *key) {
    static tokenizer *cur; /* the process's tokenizer (tokenizer.h: the current one) */
    tokenizer *t = model_dir ? tokenizer_load(model_dir, vocab_size) : tokenizer_new_bytes();
    if (!t) return MOERL_ERR;
    if (chat_template && tokenizer_set_chat_template(t, chat_template, enable_thinking, key) != MOERL_OK) {
        tokenizer_free(t);
        return MOERL_ERR;
    }
    tok_set_current(t);
    tokenizer_free(cur);
    cur = t;
    if (model_dir)
        log_info("tokenizer: %s (%s, %d ids), chat template %s", model_dir, tokenizer_kind(t), tokenizer_vocab_size(t),
                 tokenizer_chat_template_name(t));
    return MOERL_OK;
}

/* Where a key's value came from, for an error: "command line", "FILE:LINE" or "default". */
static const char *origin_name(const cfg *c, const char *key) {
    const char *o = cfg_origin(c, key);
    return strcmp(o, "override") ? o : "command line";
}

/* The task that generates the data, "" for files: data.task, except that files given while data.task
 * keeps its default (nobody asked for the built-in task) mean the files. */
static const char *data_task(const cfg *c) {
    const char *tf = cfg_str(c, "data.train_files"), *vf = cfg_str(c, "data.val_files");
    if ((tf[0] || vf[0]) && !strcmp(cfg_origin(c, "data.task"), "default")) return "";
    return cfg_str(c, "data.task");
}

int cli_check_data_keys(const cfg *c, const char *why_test) {
    /* the filter needs a limit: with none (0) it would drop nothing, silently */
    if (cfg_bool(c, "data.filter_overlong_prompts") && cfg_int(c, "data.max_prompt_length") == 0)
        return moerl_errorf("data.filter_overlong_prompts=true drops the prompts longer than data.max_prompt_length, "
                            "but data.max_prompt_length=0 (no limit) keeps every prompt: set data.max_prompt_length "
                            "to the longest prompt to keep (in tokens, chat template applied), or "
                            "data.filter_overlong_prompts=false");
    const char *task = data_task(c);
    if (!task[0]) return MOERL_OK; /* files: cli_prepare_data names a missing one */
    const char *tf = cfg_str(c, "data.train_files"), *vf = cfg_str(c, "data.val_files");
    if (tf[0] || vf[0])
        return moerl_errorf("data.task='%s' (%s) generates the data, so data.%s='%s' (%s) would be unused: to read "
                            "files set data.task= (empty) with data.train_files and data.val_files, or drop data.%s "
                            "to use the task",
                            task, origin_name(c, "data.task"), tf[0] ? "train_files" : "val_files", tf[0] ? tf : vf,
                            origin_name(c, tf[0] ? "data.train_files" : "data.val_files"),
                            tf[0] ? "train_files" : "val_files");
    if (why_test && cfg_int(c, "data.n_test") <= 0)
        return moerl_errorf("data.n_test=%lld generates no held-out rows, but %s: set data.n_test ≥ 1%s",
                            (long long)cfg_int(c, "data.n_test"), why_test,
                            strstr(why_test, "trainer.val_n") ? ", or trainer.val_n=0 (no held-out evaluation)" : "");
    return MOERL_OK;
}

int cli_check_held_out_rows(const cfg *c, const dataset *test, const char *why_test) {
    if (!why_test || dataset_count(test) > 0) return MOERL_OK;
    if (data_task(c)[0]) return cli_check_data_keys(c, why_test);
    if (!test->path)
        return moerl_errorf("data.val_files is empty, but %s: give a JSONL file of held-out rows%s", why_test,
                            strstr(why_test, "trainer.val_n") ? ", or set trainer.val_n=0 (no held-out evaluation)" : "");
    return moerl_errorf("data.val_files '%s' has no rows, but %s: give a file with held-out rows%s", test->path,
                        why_test,
                        strstr(why_test, "trainer.val_n") ? ", or set trainer.val_n=0 (no held-out evaluation)" : "");
}

/* data.max_prompt_length on one split: a prompt (chat template applied, generation prompt
 * included, as the rollout encodes it) longer than the limit is an error naming file:line and the
 * length (dataset_where), or dropped with data.filter_overlong_prompts (verl's data.filter_overlong_prompts). */
static int check_prompt_lengths(const cfg *c, dataset *ds, const char *split) {
    const int64_t max = cfg_int(c, "data.max_prompt_length");
    if (max < 0) return moerl_errorf("data.max_prompt_length must be ≥ 0 (0 = no limit), got %lld", (long long)max);
    if (max == 0 || dataset_count(ds) == 0) return MOERL_OK;
    const int filter = cfg_bool(c, "data.filter_overlong_prompts");
    uint8_t *keep = xmalloc((size_t)dataset_count(ds));
    tok_seq s = {0};
    int rc = MOERL_OK;
    for (int64_t i = 0; i < dataset_count(ds); i++) {
        const ds_row *r = dataset_row(ds, i);
        tok_seq_clear(&s);
        tok_chat_encode(r->prompt, r->n_prompt, true, &s);
        keep[i] = s.n <= max;
        if (!keep[i] && !filter) {
            char w[4300];
            rc = moerl_errorf("%s: the prompt has %lld tokens (chat template applied), more than "
                              "data.max_prompt_length=%lld: raise data.max_prompt_length, or set "
                              "data.filter_overlong_prompts=true to drop such rows",
                              dataset_where(ds, r->line, w, sizeof w), (long long)s.n, (long long)max);
            break;
        }
    }
    tok_seq_free(&s);
    if (rc == MOERL_OK) {
        const int64_t n0 = dataset_count(ds), dropped = dataset_keep_rows(ds, keep);
        if (dropped > 0)
            log_info("data.filter_overlong_prompts: dropped %lld of %lld %s rows whose prompt is longer than "
                     "data.max_prompt_length=%lld tokens", (long long)dropped, (long long)n0, split, (long long)max);
        char w[4300];
        if (dataset_count(ds) == 0 && n0 > 0)
            rc = moerl_errorf("data.filter_overlong_prompts dropped every one of the %lld %s rows of %s (each prompt "
                              "is longer than data.max_prompt_length=%lld tokens): raise data.max_prompt_length",
                              (long long)n0, split, dataset_where(ds, 0, w, sizeof w), (long long)max);
    }
    free(keep);
    return rc;
}

/* The generated files' names (cli_prepare_data): what determines the rows, and nothing else. */
static void data_file_names(const char *out_dir, const char *task, const task_opts *o, char *tr, char *te,
                            size_t cap) {
    char opt[96] = "";
    if (!strcmp(task, "arith")) snprintf(opt, sizeof opt, "-d%d", o->arith_digits);
    else if (!strcmp(task, "countdown"))
        snprintf(opt, sizeof opt, "-k%d-m%d-t%d", o->countdown_numbers, o->countdown_max_number,
                 o->countdown_max_target);
    snprintf(te, cap, "%s/data/%s%s-s%llu-test%lld.jsonl", out_dir, task, opt, (unsigned long long)o->seed,
             (long long)o->n_test);
    snprintf(tr, cap, "%s/data/%s%s-s%llu-test%lld-train%lld.jsonl", out_dir, task, opt, (unsigned long long)o->seed,
             (long long)o->n_test, (long long)o->n_train);
}

int cli_prepare_data(const cfg *c, const char *out_dir, dataset *train, dataset *test) {
    return cli_prepare_data_staged(c, out_dir, train, test, NULL);
}

int cli_prepare_data_staged(const cfg *c, const char *out_dir, dataset *train, dataset *test, cli_staged_data *staged) {
    const char *task = data_task(c);
    char tr[4096], te[4096];
    if (staged) memset(staged, 0, sizeof *staged);
    if (cli_check_data_keys(c, NULL) != MOERL_OK) return MOERL_ERR;
    if (task[0]) {
        task_opts o;
        task_opts_default(&o);
        o.n_train = cfg_int(c, "data.n_train");
        o.n_test = cfg_int(c, "data.n_test");
        o.seed = (uint64_t)cfg_int(c, "data.seed");
        o.arith_digits = (int)cfg_int(c, "data.arith_digits");
        o.countdown_numbers = (int)cfg_int(c, "data.countdown_numbers");
        data_file_names(out_dir, task, &o, tr, te, sizeof tr);
        if (staged) { /* temporary names until the run's checks pass (rank and pid: several processes) */
            int rank;
            cli_launcher_world(&rank);
            snprintf(staged->data_dir, sizeof staged->data_dir, "%s/data", out_dir);
            const char *final[2] = {tr, te};
            for (int i = 0; i < 2; i++) {
                snprintf(staged->dst[i], sizeof staged->dst[i], "%s", final[i]);
                snprintf(staged->tmp[i], sizeof staged->tmp[i], "%s.staged-r%d-%ld", final[i], rank, (long)getpid());
            }
            staged->n = 2;
            snprintf(tr, sizeof tr, "%s", staged->tmp[0]);
            snprintf(te, sizeof te, "%s", staged->tmp[1]);
        }
        if (task_generate(task, &o, tr, te) != MOERL_OK) return moerl_error_prefix("data.task: ");
    } else {
        snprintf(tr, sizeof tr, "%s", cfg_str(c, "data.train_files"));
        snprintf(te, sizeof te, "%s", cfg_str(c, "data.val_files"));
        if (!tr[0])
            return moerl_errorf("data from files needs data.train_files (JSONL; it is empty)%s",
                                cfg_str(c, "data.task")[0] ? "" : " — or set data.task to generate the data");
    }
    if (dataset_load(train, tr) != MOERL_OK) return MOERL_ERR;
    memset(test, 0, sizeof *test);
    /* no data.val_files: no held-out rows (cli_check_held_out_rows refuses it where they are evaluated) */
    if (te[0] && dataset_load(test, te) != MOERL_OK) {
        dataset_free(train);
        return MOERL_ERR;
    }
    const int gen = task[0] != 0;
    if (gen) { /* messages name generated data by the key that made it, not by a file a refusal may remove */
        char label[300];
        dataset *both[2] = {train, test};
        for (int d = 0; d < 2; d++) {
            snprintf(label, sizeof label, "the %s data generated by data.task=%s", d ? "held-out" : "training", task);
            free(both[d]->path);
            both[d]->path = xstrdup(label);
            both[d]->generated = 1;
        }
    }
    if (dataset_count(train) == 0)
        return gen ? moerl_errorf("%s has no rows (data.n_train=%lld): set data.n_train ≥ 1", train->path,
                                  (long long)cfg_int(c, "data.n_train"))
                   : moerl_errorf("training data '%s' has no rows", tr);
    if (cli_check_data_sources(train) != MOERL_OK || cli_check_data_sources(test) != MOERL_OK) return MOERL_ERR;
    const dataset *both[2] = {train, test};
    for (int d = 0; d < 2; d++)
        for (int64_t i = 0; i < dataset_count(both[d]); i++) {
            const ds_row *r = dataset_row(both[d], i);
            char w[4300];
            if (tokenizer_chat_check(tok_current(), r->prompt, r->n_prompt) != MOERL_OK)
                return moerl_error_prefix("%s: prompt: ", dataset_where(both[d], r->line, w, sizeof w));
        }
    if (check_prompt_lengths(c, train, "training") != MOERL_OK ||
        check_prompt_lengths(c, test, "held-out") != MOERL_OK)
        return MOERL_ERR;
    return MOERL_OK;
}

/* 1 when the files at a and b hold the same bytes. */
static int same_bytes(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    char ba[65536], bb[65536];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        same = na == nb && !memcmp(ba, bb, na);
        if (na == 0 || na < sizeof ba) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int cli_staged_commit(cli_staged_data *s) {
    for (int i = 0; i < s->n; i++) {
        if (access(s->dst[i], F_OK) == 0 && same_bytes(s->tmp[i], s->dst[i])) { /* the run's own file: keep it */
            unlink(s->tmp[i]);
            continue;
        }
        if (rename(s->tmp[i], s->dst[i]) != 0)
            return moerl_errorf("cannot rename '%s' to '%s': %s", s->tmp[i], s->dst[i], strerror(errno));
    }
    s->n = 0;
    return MOERL_OK;
}

void cli_staged_discard(cli_staged_data *s) {
    for (int i = 0; i < s->n; i++) unlink(s->tmp[i]);
    if (s->n && s->data_dir[0]) rmdir(s->data_dir); /* only when empty: a run's data stays */
    s->n = 0;
}

/* The "key: value" lines of the data: section of a cfg_dump_yaml text, comments dropped: *n pairs
 * (heap strings; free with free_pairs). */
static char **data_section_pairs(const char *text, int *n) {
    char **kv = NULL;
    int cnt = 0, in = 0;
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        if (!strncmp(l, "data:", 5) && len == 5) in = 1;
        else if (len && l[0] != ' ') in = 0;
        else if (in && len > 2 && l[2] != ' ') {
            char *line = xmalloc(len + 1);
            memcpy(line, l + 2, len - 2);
            line[len - 2] = 0;
            char *colon = strstr(line, ": "), *cmt = strstr(line, "  # ");
            if (cmt) *cmt = 0;
            if (colon) {
                *colon = 0;
                kv = realloc(kv, (size_t)(cnt + 2) * 2 * sizeof *kv);
                kv[2 * cnt] = xstrdup(line);
                kv[2 * cnt + 1] = xstrdup(colon + 2);
                cnt++;
            }
            free(line);
        }
        l = e ? e + 1 : NULL;
    }
    *n = cnt;
    return kv;
}

static void free_pairs(char **kv, int n) {
    for (int i = 0; i < 2 * n; i++) free(kv[i]);
    free(kv);
}

int cli_name_changed_data_keys(const cfg *c, const char *out_dir) {
    char p[4200], *old = NULL, *why = xstrdup(moerl_last_error());
    size_t len;
    snprintf(p, sizeof p, "%s/config.yaml", out_dir);
    if (access(p, R_OK) != 0 || moerl_read_file(p, &old, &len) != MOERL_OK) {
        moerl_errorf("%s", why);
        free(why);
        return MOERL_ERR;
    }
    char *now = cfg_dump_yaml_string(c);
    int n_old, n_now;
    char **ko = data_section_pairs(old, &n_old), **kn = data_section_pairs(now, &n_now);
    char changed[1200] = "";
    for (int i = 0; i < n_now; i++)
        for (int j = 0; j < n_old; j++)
            if (!strcmp(kn[2 * i], ko[2 * j]) && strcmp(kn[2 * i + 1], ko[2 * j + 1])) {
                size_t at = strlen(changed);
                snprintf(changed + at, sizeof changed - at, "%sdata.%s was %s, now %s", at ? "; " : "", kn[2 * i],
                         ko[2 * j + 1], kn[2 * i + 1]);
            }
    if (changed[0])
        moerl_errorf("%s (the run's config.yaml differs in: %s)", why, changed);
    else
        moerl_errorf("%s", why);
    free_pairs(ko, n_old);
    free_pairs(kn, n_now);
    free(old);
    free(now);
    free(why);
    return MOERL_ERR;
}

int cli_check_data_sources(const dataset *ds) {
    for (int64_t i = 0; i < dataset_count(ds); i++) {
        const ds_row *r = dataset_row(ds, i);
        char w[4300];
        if (!reward_fn_for(r->data_source)) return moerl_error_prefix("%s: ", dataset_where(ds, r->line, w, sizeof w));
    }
    return MOERL_OK;
}

int cli_outdir_check_subdirs(const char *dir, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        char p[4200];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (lstat(p, &st) == 0 && !S_ISDIR(st.st_mode))
            return moerl_errorf("'%s' is a file, but moerl keeps a folder of that name in the output folder: move or "
                                "delete it, or choose another trainer.default_local_dir", p);
    }
    return MOERL_OK;
}

int cli_outdir_open(cli_outdir *o, const char *dir) {
    memset(o, 0, sizeof *o);
    if (snprintf(o->dir, sizeof o->dir, "%s", dir) >= (int)sizeof o->dir)
        return moerl_errorf("output folder path too long: '%.100s...'", dir);
    /* the highest missing folder on the path: what this call will create */
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    struct stat st;
    while (p[0] && stat(p, &st) != 0) {
        snprintf(o->top, sizeof o->top, "%s", p);
        char *slash = strrchr(p, '/');
        if (!slash) break;
        while (slash > p && slash[-1] == '/') slash--; /* "a//b" */
        *slash = 0;
    }
    if (moerl_mkdirs(dir) != MOERL_OK || moerl_lock_dir(dir) < 0) return MOERL_ERR;
    return MOERL_OK;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void cli_outdir_abandon(const cli_outdir *o) {
    if (!o->top[0]) return;
    static const char *setup_only[] = {".moerl.lock", "config.yaml", "data", "run.log", CLI_SIMULATION_MARKER};
    DIR *d = opendir(o->dir);
    if (!d) return;
    struct dirent *e;
    int only_setup = 1;
    while (only_setup && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int known = 0;
        for (size_t i = 0; i < sizeof setup_only / sizeof setup_only[0]; i++) known |= !strcmp(e->d_name, setup_only[i]);
        only_setup = known;
    }
    closedir(d);
    if (!only_setup) return;
    nftw(o->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    /* then the empty parents this run created, up to o->top */
    char p[4096];
    snprintf(p, sizeof p, "%s", o->dir);
    while (strlen(p) > strlen(o->top)) {
        char *slash = strrchr(p, '/');
        if (!slash) break;
        *slash = 0;
        if (rmdir(p) != 0) break;
    }
}

int cli_outdir_remove(const cli_outdir *o) {
    if (!o->top[0]) return 0;
    nftw(o->top, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 1;
}

void cli_print_json(json_t *j, int real_precision) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER |
                                JSON_REAL_PRECISION(real_precision > 0 ? real_precision : 6));
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(j);
}

/* The size and rank an MPI launcher gave this process (Open MPI, MPICH/Intel MPI hydra, MVAPICH),
 * or size 1 when not launched by one. */
int cli_launcher_world(int *rank) {
    static const char *sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"};
    static const char *ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"};
    for (int i = 0; i < 3; i++) {
        const char *s = getenv(sizes[i]);
        if (!s) continue;
        const char *r = getenv(ranks[i]);
        *rank = r ? atoi(r) : 0;
        return atoi(s);
    }
    *rank = 0;
    return 1;
}

void cli_print_error(const char *cmd, const char *msg) {
    size_t n = strlen(cmd);
    if (!strncmp(msg, cmd, n) && msg[n] == ':' && msg[n + 1] == ' ') msg += n + 2;
    fprintf(stderr, "moerl %s: %s\n", cmd, msg);
}

void cli_set_threads(int n) {
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
}

int cli_save_checkpoint(const moe_model *m, const char *dir, int bf16) {
    if (model_save_hf(m, dir, bf16, 0) != MOERL_OK) return MOERL_ERR;
    return tokenizer_save(tok_current(), dir);
}

json_t *cli_json_real(double x) { return isfinite(x) ? json_real(x) : json_null(); }

json_t *cli_json_text(const char *s, size_t len) {
    json_t *j = json_stringn(s, len);
    if (j) return j;
    /* not valid UTF-8: keep valid sequences, replace every other byte with U+FFFD */
    char *out = xmalloc(len * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = n > 0 && i + n <= len && c != 0;
        for (int k = 1; ok && k < n; k++) ok = ((unsigned char)s[i + k] >> 6) == 2;
        if (ok && n > 1) {
            json_t *t = json_stringn(s + i, n); /* rejects overlongs and surrogates */
            ok = t != NULL;
            json_decref(t);
        }
        if (ok) {
            memcpy(out + o, s + i, n);
            o += n;
            i += n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(out, o);
    free(out);
    return j ? j : json_string("");
}
