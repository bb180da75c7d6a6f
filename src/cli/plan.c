/* moerl plan (--model DIR|config.json | --config FILE) [--json] [key=value ...] — memory per rank and
 * communication per step of an RL job for a parallel layout, from src/plan/plan.h's formulas.
 * The keys are `moerl rl`'s (so an rl YAML plans as it runs: trainer.n_ranks, actor.ppo_mini_batch_size,
 * actor.ppo_max_token_len_per_gpu, rollout.n, rollout.max_num_seqs, data.max_response_length,
 * async_training.require_batches, ...) plus the layout keys, verl's names:
 *   actor.fsdp_config.fsdp_size, actor.expert_parallel_size, actor.ulysses_sequence_parallel_size,
 *   actor.pipeline_parallel_size, actor.virtual_pipeline_parallel_size, model.enable_gradient_checkpointing,
 *   actor.fsdp_config.reshard_after_forward (with FSDP on, both settings' traffic and peak are printed),
 *   data.max_prompt_length (0, rl's "no limit", is planned as 512), rollout.n_ranks (rollout devices), rollout.tensor_model_parallel_size, actor.dtype,
 *   rollout.dtype; actor.use_kl_loss adds the KL reference model. Refused as moerl refuses them: the
 *   pipeline with FSDP / EP / SP (par_check_pp_alone), model.* beside --model (model_config_from_keys),
 *   data.* keys that exclude each other (data_check_keys: data.filter_overlong_prompts=true without
 *   data.max_prompt_length, data.task beside data files),
 *   tokens per step above 2^53 and counts above 2^31 − 1 (plan_read_input, plan_compute). */
#include <jansson.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "base/config.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "cli/options.h"
#include "parallel/grid.h"
#include "plan/plan.h"
#include "plan/plan_config.h"


/* The table's unit: GiB, or MiB when the plan's largest memory figure is under 1 GiB (a toy config
 * would print 0.000 everywhere); set once per table by print_table. */
static double g_unit_bytes = 1024.0 * 1024.0 * 1024.0;
static const char *g_unit = "GiB";
static double gib(double b) { return b / g_unit_bytes; }

/* FSDP's two settings of actor.fsdp_config.reshard_after_forward side by side: res[0] true (reshard per
 * layer, the default), res[1] false (units and gradients kept for the mini-batch). */
static json_t *fsdp_rows_json(const plan_result res[2]) {
    json_t *a = json_array();
    for (int k = 0; k < 2; k++) {
        json_t *o = json_object();
        json_object_set_new(o, "reshard_after_forward", json_boolean(k == 0));
        json_object_set_new(o, "allgather_bytes_per_update", json_real(res[k].allgather));
        json_object_set_new(o, "reduce_scatter_bytes_per_update", json_real(res[k].reduce_scatter));
        json_object_set_new(o, "gathered_bytes", json_real(res[k].gathered));
        json_object_set_new(o, "gathered_low_bytes", json_real(res[k].gathered_low));
        json_object_set_new(o, "trainer_total_no_recompute_bytes", json_real(res[k].total));
        json_object_set_new(o, "trainer_total_recompute_bytes", json_real(res[k].total_recompute));
        json_array_append_new(a, o);
    }
    return a;
}

static void print_fsdp_rows(const plan_input *in, const plan_result res[2]) {
    printf("| FSDP actor.fsdp_config.reshard_after_forward | all-gather per update (%s) | reduce-scatter per update "
           "(%s) | peak gathered + live gradients (%s) | trainer total, no recompute / recompute (%s) |\n"
           "|---|---|---|---|---|\n", g_unit, g_unit, g_unit, g_unit);
    for (int k = 0; k < 2; k++)
        printf("| %s%s | %.3f | %.3f | %.3f | %.3f / %.3f |\n",
               k == 0 ? "true: per layer, reduce-scatter per pass" : "false: kept for the mini-batch, one reduce-scatter",
               (k == 1) == (in->fsdp_keep_gathered != 0) ? " (this plan)" : "", gib(res[k].allgather),
               gib(res[k].reduce_scatter), gib(res[k].gathered), gib(res[k].total), gib(res[k].total_recompute));
}

static json_t *plan_json(const moe_config *mc, const plan_input *in, const plan_result *r) {
    json_t *o = json_object();
#define I(k, v) json_object_set_new(o, k, json_integer(v))
#define R(k, v) json_object_set_new(o, k, json_real(v))
    I("n_params", r->n_params); I("n_params_hf", r->n_params_hf); I("n_params_expert", r->n_params_expert);
    I("n_active", r->n_active);
    I("trainer_ranks", in->n_trainer); I("dp", r->dp); I("fsdp", r->fsdp); I("ep", in->ep); I("sp", in->sp);
    I("pp", in->pp); I("vpp", r->vpp); I("stage_layers", r->stage_layers);
    R("pp_bubble_theory", r->bubble_theory);
    I("fullest_stage", r->fullest_stage); I("dtype_bytes", in->dtype_bytes);
    I("micro_tokens", in->micro_tokens); I("micro_batches", r->micro_batches);
    I("fwd_only_passes", in->fwd_only_passes);
    json_object_set_new(o, "reshard_after_forward", json_boolean(!in->fsdp_keep_gathered));
    json_object_set_new(o, "pp_params", json_string(in->pp_params == PLAN_PP_REPLICATED ? "replicated" : "stage"));
    R("weights_bytes", r->weights); R("grads_bytes", r->grads); R("master_bytes", r->master);
    R("moments_bytes", r->moments); R("gathered_bytes", r->gathered);
    R("gathered_low_bytes", r->gathered_low); R("acts_bytes", r->acts);
    R("acts_recompute_bytes", r->acts_recompute);
    I("ref_model", in->ref_model); R("ref_weights_bytes", r->ref_weights); R("ref_acts_bytes", r->ref_acts);
    R("ref_held_bytes", r->ref_held); R("ref_gathered_bytes", r->ref_gathered);
    R("ref_pass_bytes_per_step", r->ref_pass); R("trainer_total_bytes", in->recompute ? r->total_recompute : r->total);
    R("trainer_total_no_recompute_bytes", r->total); R("trainer_total_recompute_bytes", r->total_recompute);
    I("rollout_ranks", in->n_rollout); I("rollout_tp", in->rollout_tp); I("max_num_seqs", in->max_num_seqs);
    I("max_model_len", in->max_model_len);
    R("rollout_weights_bytes", r->rollout_weights); R("kv_cache_bytes", r->kv_cache); R("routing_record_bytes", r->routing_record);
    R("rollout_total_bytes", r->rollout_total);
    R("allreduce_bytes_per_update", r->allreduce); R("allgather_bytes_per_update", r->allgather);
    R("reduce_scatter_bytes_per_update", r->reduce_scatter); R("alltoall_ep_bytes_per_update", r->alltoall_ep);
    R("alltoall_sp_bytes_per_update", r->alltoall_sp); R("p2p_pp_bytes_per_update", r->p2p_pp);
    I("updates_per_step", in->updates_per_step);
    I("logprob_passes", in->logprob_passes); R("logprob_pass_bytes_per_step", r->logprob_pass);
    R("comm_bytes_per_step", r->per_step); R("weight_bcast_bytes_per_sync", r->weight_bcast);
    I("sync_every_steps", in->sync_every);
#undef I
#undef R
    (void)mc;
    return o;
}

static void plan_print_table(const moe_config *mc, const plan_input *in, const plan_result *r) {
    const double big = MOERL_MAX(MOERL_MAX(r->total, r->rollout_total), r->weight_bcast);
    g_unit_bytes = big < 1024.0 * 1024.0 * 1024.0 ? 1024.0 * 1024.0 : 1024.0 * 1024.0 * 1024.0;
    g_unit = big < 1024.0 * 1024.0 * 1024.0 ? "MiB" : "GiB";
    if ((int64_t)in->max_model_len > mc->max_position_embeddings)
        log_warn("data.max_prompt_length + data.max_response_length = %d tokens exceed the model's context "
                 "(max_position_embeddings = %d): the KV cache and activations are planned for %d tokens; give "
                 "data.max_prompt_length=N (0 = no limit, planned as %d) for what your prompts need",
                 in->max_model_len, mc->max_position_embeddings, in->max_model_len, PLAN_DEFAULT_PROMPT_LEN);
    printf("model: %d layer%s, hidden %d, %d experts top-%d (width %d), %d heads / %d kv × %d, vocab %d\n",
           mc->num_hidden_layers, moerl_plural(mc->num_hidden_layers), mc->hidden_size, mc->num_experts,
           mc->num_experts_per_tok, mc->moe_intermediate_size,
           mc->num_attention_heads, mc->num_key_value_heads, mc->head_dim, mc->vocab_size);
    const double pu = r->n_params_hf < 1e8 ? 1e6 : 1e9; /* millions for a toy model, else billions */
    const char *pn = r->n_params_hf < 1e8 ? "M" : "B";
    printf("parameters: %.3f %s (HF count), %.3f %s expert, %.3f %s active matmul per token\n", r->n_params_hf / pu, pn,
           r->n_params_expert / pu, pn, r->n_active / pu, pn);
    printf("trainer: %d rank%s = pp %d × sp %d × dp %d; fsdp %d, ep %d; %s; micro-batch %lld tokens (%lld per rank "
           "after sp); fullest stage %d (%d layer%s)\n",
           in->n_trainer, moerl_plural(in->n_trainer), in->pp, in->sp, r->dp, r->fsdp, in->ep, in->dtype_bytes == 4 ? "fp32" : "bf16 + fp32 master",
           (long long)in->micro_tokens, (long long)((in->micro_tokens + in->sp - 1) / in->sp), r->fullest_stage,
           r->stage_layers, moerl_plural(r->stage_layers));
    if (in->pp > 1)
        printf("pipeline: %d stages × %d chunk%s, %d micro-batches per update; bubble (pp − 1)/(v·m + pp − 1) = %.3f\n",
               in->pp, r->vpp, r->vpp == 1 ? "" : "s (interleaved 1F1B)", r->micro_batches, r->bubble_theory);
    printf("| per trainer rank | %s |\n|---|---|\n", g_unit);
    printf("| weights | %.3f |\n| gradients | %.3f |\n", gib(r->weights), gib(r->grads));
    if (r->master > 0) printf("| fp32 master weights | %.3f |\n", gib(r->master));
    printf("| AdamW moments | %.3f |\n", gib(r->moments));
    if (r->gathered > 0)
        printf("| all-gathered parameters (FSDP peak; %.3f if every reduce-scatter ends at once) | %.3f |\n",
               gib(r->gathered_low), gib(r->gathered));
    else
        printf("| all-gathered parameters (FSDP) | %.3f |\n", gib(r->gathered));
    printf("| activations (no recompute) | %.3f |\n| activations (recompute) | %.3f |\n", gib(r->acts),
           gib(r->acts_recompute));
    if (in->ref_model) {
        printf("| KL reference policy (actor.use_kl_loss: fp32, sharded as the actor's weights) | %.3f |\n",
               gib(r->ref_weights));
        if (r->ref_acts > 0)
            printf("| reference pass activations (its pipeline's slots, one per chunk; only during that pass) | "
                   "%.3f |\n", gib(r->ref_acts));
        if (r->ref_gathered > 0)
            printf("| reference pass all-gathered units (FSDP peak; only during that pass%s) | %.3f |\n",
                   r->ref_held > 0 ? ", beside the units the proximal pass left gathered" : "", gib(r->ref_gathered));
    }
    printf("| **total** (no recompute / recompute) | **%.3f** / **%.3f** |\n", gib(r->total), gib(r->total_recompute));
    printf("rollout: %d device%s, %d per replica; %d sequence%s × %d tokens per replica; %s\n", in->n_rollout,
           moerl_plural(in->n_rollout), in->rollout_tp, in->max_num_seqs, moerl_plural(in->max_num_seqs),
           in->max_model_len, in->kv_dtype_bytes == 4 ? "fp32" : "bf16");
    printf("| per rollout device | %s |\n|---|---|\n| weights | %.3f |\n| KV cache | %.3f |\n", g_unit,
           gib(r->rollout_weights), gib(r->kv_cache));
    if (in->record_routes)
        printf("| routing record (rollout.enable_rollout_routing_replay) | %.3f |\n", gib(r->routing_record));
    printf("| **total** | **%.3f** |\n", gib(r->rollout_total));
    printf("| communication per trainer rank | %s per update | %s per step (%d updates) |\n|---|---|---|\n",
           g_unit, g_unit, in->updates_per_step);
    const char *names[] = {"gradient all-reduce", "FSDP all-gather", "FSDP reduce-scatter", "EP all-to-all",
                           "SP all-to-all", "PP p2p"};
    const double v[] = {r->allreduce, r->allgather, r->reduce_scatter, r->alltoall_ep, r->alltoall_sp, r->p2p_pp};
    for (int i = 0; i < 6; i++) printf("| %s | %.3f | %.3f |\n", names[i], gib(v[i]), gib(v[i] * in->updates_per_step));
    if (in->logprob_passes > 0)
        printf("| forward-only logprob pass (per step: gathers, all-to-alls, p2p, logprob sums) | | %.3f |\n",
               gib(r->logprob_pass));
    if (in->ref_model)
        printf("| KL reference logprob pass (per step: the collectives of one forward-only pass) | | %.3f |\n",
               gib(r->ref_pass));
    printf("| weight broadcast (per sync, every %d step%s) | %.3f | |\n", in->sync_every, moerl_plural(in->sync_every),
           gib(r->weight_bcast));
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *config = NULL;
    int as_json = 0, code;
    cli_overrides ov = {0};
    cfg *c = cfg_new();
    plan_def_keys(c);
    const cli_opt opts[] = {
        {.name = "model", .short_name = 'm', .type = CLI_STR, .dest = &model, .meta = "DIR|config.json",
         .flags = CLI_ONCE, .help = "the model: a checkpoint folder or its config.json (else the config's model.*)"},
        {.name = "config", .short_name = 'c', .type = CLI_STR, .dest = &config, .meta = "FILE", .flags = CLI_ONCE,
         .help = "an rl YAML config (plans the run it describes)"},
        {.name = "json", .short_name = 'j', .type = CLI_FLAG, .dest = &as_json, .help = "one JSON object instead of the tables"},
    };
    const cli_spec spec = {.cmd = "plan",
                           .synopsis = "(--model DIR|config.json | --config FILE) [--json] [key=value ...]",
                           .about = "Memory per rank (weights, gradients, AdamW moments, activations with and without "
                                    "recompute,\nall-gathered parameters, KV cache) and communication per step for a "
                                    "parallel layout\n(formulas: src/plan/plan.h).",
                           .opts = opts, .n_opts = CLI_NOPTS(opts), .overrides = &ov, .keys = c};
    if (cli_parse(&spec, argc, argv, &code)) {
        cfg_free(c);
        return code;
    }
    if (!model && !config) {
        fprintf(stderr, "moerl plan: give --model DIR|config.json or --config FILE (see --help)\n");
        cli_overrides_free(&ov);
        cfg_free(c);
        return 2;
    }
    int rc = 1;
    if (config && cfg_load_yaml(c, config) != MOERL_OK) goto fail;
    if (cli_apply_overrides(c, &ov) != MOERL_OK) goto fail;
    moe_config mc;
    plan_input in;
    plan_result r;
    if (plan_read_input(c, model, &mc, &in) != MOERL_OK || plan_compute(&mc, &in, &r) != MOERL_OK) goto fail;
    /* FSDP: both settings of actor.fsdp_config.reshard_after_forward (the other one planned beside) */
    plan_result both[2];
    if (r.fsdp > 1) {
        plan_input other = in;
        other.fsdp_keep_gathered = !in.fsdp_keep_gathered;
        if (plan_compute(&mc, &other, &both[other.fsdp_keep_gathered ? 1 : 0]) != MOERL_OK) goto fail;
        both[in.fsdp_keep_gathered ? 1 : 0] = r;
    }
    if (as_json) {
        json_t *o = plan_json(&mc, &in, &r);
        if (r.fsdp > 1) json_object_set_new(o, "fsdp_reshard_rows", fsdp_rows_json(both));
        cli_print_json(o, 17);
    } else {
        plan_print_table(&mc, &in, &r);
        if (r.fsdp > 1) print_fsdp_rows(&in, both);
    }
    cli_overrides_free(&ov);
    cfg_free(c);
    return 0;
fail:
    cli_print_error("plan", moerl_last_error());
    cli_overrides_free(&ov);
    cfg_free(c);
    return rc;
}
