#include "model/model_config.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "data/tokenizer.h" /* the byte vocabulary's size and special ids (constants only) */

void model_def_keys(cfg *c) {
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
static void model_apply_moe_switches(const cfg *c, moe_model *m) {
    m->cfg.exec.per_expert_loop = !cfg_bool(c, "model.moe.grouped_gemm");
    m->cfg.exec.separate_permute = !cfg_bool(c, "model.moe.fused_permute");
    m->cfg.exec.per_expert_weights = !cfg_bool(c, "model.moe.stacked_weights");
    m->cfg.exec.rebuild_row_idx = !cfg_bool(c, "model.moe.hand_on_row_idx");
    m->cfg.exec.no_pack = !cfg_bool(c, "model.moe.pack_weights");
    if (cfg_has(c, "model.enable_gradient_checkpointing")) /* the training commands' (model_def_train_keys) */
        m->cfg.exec.recompute = model_recompute_mode(c);
}

void model_def_train_keys(cfg *c) {
    cfg_def_bool(c, "model.enable_gradient_checkpointing", false,
                 "activation recompute (verl's key): keep layer inputs, recompute in the backward (docs/parallelism.md)");
    cfg_def_str(c, "actor.recompute_granularity", "full",
                "with model.enable_gradient_checkpointing: full (recompute each decoder layer from its input) | "
                "selective (keep the attention block, recompute the MLP/MoE sub-layer) (Megatron's key)");
}

int model_recompute_mode(const cfg *c) {
    if (!cfg_has(c, "model.enable_gradient_checkpointing") || !cfg_bool(c, "model.enable_gradient_checkpointing"))
        return MODEL_RECOMPUTE_NONE;
    const char *g = cfg_str(c, "actor.recompute_granularity");
    return !strcmp(g, "selective") ? MODEL_RECOMPUTE_SELECTIVE : MODEL_RECOMPUTE_FULL;
}

int model_check_train_keys(const cfg *c) {
    if (!cfg_has(c, "model.enable_gradient_checkpointing")) return MOERL_OK;
    const char *g = cfg_str(c, "actor.recompute_granularity");
    if (strcmp(g, "full") && strcmp(g, "selective"))
        return moerl_errorf("actor.recompute_granularity: '%s' is not full or selective", g);
    if (!cfg_bool(c, "model.enable_gradient_checkpointing") && strcmp(cfg_origin(c, "actor.recompute_granularity"), "default"))
        return moerl_errorf("actor.recompute_granularity=%s is set but model.enable_gradient_checkpointing is false: "
                            "set model.enable_gradient_checkpointing=true to recompute, or drop the granularity", g);
    return MOERL_OK;
}

/* The model.* architecture keys against a model loaded from `path` (its config.json), for every
 * command that takes the architecture from a checkpoint (model_build_from_keys: model.path; plan and
 * simulate: --model or model.path). flag: how the path was given ("model.path", "--model", named in
 * the messages); path_origin: where it came from, a cfg origin ("override" or "command line" = the
 * command line; anything else = a config file). */
static int model_check_arch_keys(const cfg *c, const char *flag, const char *path, const char *path_origin) {
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
                            "them (for another architecture, edit a copy of that config.json), or drop %s to "
                            "take the architecture from model.* (a new model)",
                            flag, path_origin, path, cj, conflict, flag);
    if (ignored[0])
        log_warn("%s given on the command line: the architecture comes from %s%s; ignored from the config file: %s",
                 flag, path, cj, ignored);
#undef ORIGIN
    return MOERL_OK;
}

int model_config_from_keys(const cfg *c, const char *model, moe_config *mc) {
    if (model && cfg_str(c, "model.path")[0]) /* one would be dropped silently */
        return moerl_errorf("--model %s and model.path=%s (%s) both name a model: give one", model,
                            cfg_str(c, "model.path"),
                            strcmp(cfg_origin(c, "model.path"), "override") ? cfg_origin(c, "model.path") : "command line");
    const char *path = model ? model : cfg_str(c, "model.path");
    if (path[0]) {
        /* --model is a command-line flag: model.* keys given with it would be silently ignored */
        if (model_check_arch_keys(c, model ? "--model" : "model.path", path,
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

int model_build_from_keys(const cfg *c, moe_model *m) {
    if (model_check_train_keys(c) != MOERL_OK) return MOERL_ERR;
    const char *path = cfg_str(c, "model.path");
    if (path[0]) {
        if (model_check_arch_keys(c, "model.path", path, cfg_origin(c, "model.path")) != MOERL_OK) return MOERL_ERR;
        if (model_load_hf(m, path) != MOERL_OK) return moerl_error_prefix("model.path: ");
        model_apply_moe_switches(c, m);
        log_info("loaded model from %s (%lld parameters)", path, (long long)model_num_params(m));
        return MOERL_OK;
    }
    moe_config mc;
    if (model_config_from_keys(c, "", &mc) != MOERL_OK) return MOERL_ERR;
    if (model_init(m, &mc) != MOERL_OK) return MOERL_ERR;
    model_init_random(m, (uint64_t)cfg_int(c, "model.seed"));
    model_apply_moe_switches(c, m);
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
    return MOERL_OK;
}
