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
 *   pipeline with EP and FSDP at once or with SP (par_check_pp_alone), pipeline × FSDP with tied embeddings, model.* beside --model (model_config_from_keys),
 *   data.* keys that exclude each other (data_check_keys: data.filter_overlong_prompts=true without
 *   data.max_prompt_length, data.task beside data files),
 *   tokens per step above 2^53 and counts above 2^31 − 1 (plan_read_input, plan_compute).
 * Beside the reservation it prints the paged KV cache's expectation (plan/plan_kv.h: rollout.block_size,
 * rollout.kv_cache_bytes, rollout.gpu_memory_utilization with plan.rollout_device_memory,
 * rollout.enable_prefix_caching, rollout.synthetic_length.* or plan.mean_response_length) and where gradient
 * compression pays (plan/plan_xchg.h: plan.link_bandwidth, plan.train_flops, plan.codec.*), with the 8×A100
 * practice's worked row. */
#include <jansson.h>
#include <math.h>
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
#include "plan/plan_kv.h"
#include "plan/plan_xchg.h"


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
    R("acts_recompute_bytes", r->acts_recompute); R("tp_ep_scratch_bytes", r->tp_ep_scratch);
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
    I("tp", r->tp > 1 ? r->tp : 1); I("tp_experts", r->tp > 1 ? in->tp_experts : 0);
    R("tp_bytes_per_update", r->tp_allreduce);
    I("tp_sequence_parallel", r->tp > 1 ? in->tp_sp : 0); R("tp_reduce_scatter_bytes_per_update", r->tp_reduce_scatter);
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
    /* max_model_len fits the model's context: plan_read_input refuses or caps it as moerl rl checks it */
    printf("model: %d layer%s, hidden %d, %d experts top-%d (width %d), %d heads / %d kv × %d, vocab %d\n",
           mc->num_hidden_layers, moerl_plural(mc->num_hidden_layers), mc->hidden_size, mc->num_experts,
           mc->num_experts_per_tok, mc->moe_intermediate_size,
           mc->num_attention_heads, mc->num_key_value_heads, mc->head_dim, mc->vocab_size);
    const double pu = r->n_params_hf < 1e8 ? 1e6 : 1e9; /* millions for a toy model, else billions */
    const char *pn = r->n_params_hf < 1e8 ? "M" : "B";
    printf("parameters: %.3f %s (HF count), %.3f %s expert, %.3f %s active matmul per token\n", r->n_params_hf / pu, pn,
           r->n_params_expert / pu, pn, r->n_active / pu, pn);
    char tpf[32] = "";
    if (r->tp > 1) snprintf(tpf, sizeof tpf, " × tp %d", r->tp);
    printf("trainer: %d rank%s = pp %d × sp %d × dp %d%s; fsdp %d, ep %d; %s; micro-batch %lld tokens (%lld per rank "
           "after sp); fullest stage %d (%d layer%s)\n",
           in->n_trainer, moerl_plural(in->n_trainer), in->pp, in->sp, r->dp, tpf, r->fsdp, in->ep, in->dtype_bytes == 4 ? "fp32" : "bf16 + fp32 master",
           (long long)in->micro_tokens, (long long)((in->micro_tokens + in->sp - 1) / in->sp), r->fullest_stage,
           r->stage_layers, moerl_plural(r->stage_layers));
    if (r->tp > 1)
        printf("tensor parallel: tp %d × dp %d%s; each rank holds 1/%d of the attention heads, the dense MLP width, the "
               "vocabulary (padded to a multiple of %d)%s; norms and router whole\n", r->tp, r->dp,
               in->pp > 1 ? " per pipeline stage (its layers' slice; the TP rows are the fullest stage's)" : "", r->tp,
               r->tp, in->tp_experts ? " and each expert's width (expert-TP)" : ", every expert whole");
    if (r->tp > 1 && in->tp_sp)
        printf("Megatron sequence parallelism: the [N,H] row all-reduces become reduce-scatters + all-gathers of "
               "⌈N/%d⌉ rows%s; the activations row holds the residual stream and the RMSNorms' statistics on "
               "⌈N/%d⌉ rows a rank\n", r->tp, in->tp_experts ? "" : " (+ an ln2 all-gather per MoE layer: experts whole)",
               r->tp);
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
    printf("| activations (%sno recompute) | %.3f |\n| activations (%srecompute) | %.3f |\n",
           r->tp > 1 ? "TP slice, " : "", gib(r->acts), r->tp > 1 ? "TP slice, " : "", gib(r->acts_recompute));
    if (r->tp_ep_scratch > 0)
        printf("| TP × EP token-split scratch (sub rows, their gradients, the expert rows gathered) | %.3f |\n",
               gib(r->tp_ep_scratch));
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
    printf("| per rollout device | %s |\n|---|---|\n| weights | %.3f |\n| KV cache, reserved (slot engine) | %.3f |\n", g_unit,
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
    if (r->tp > 1)
        printf("| TP %s (activations, logprob statistics, q/k-norm%s and kv-head gradients%s) | %.3f | %.3f |\n",
               in->tp_sp ? "reduce-scatters + all-gathers + all-reduces" : "all-reduces",
               in->tp_sp ? ", RMSNorm" : "", in->ep > 1 ? "; TP × EP's expert-row all-gathers" : "", gib(r->tp_allreduce),
               gib(r->tp_allreduce * in->updates_per_step));
    if (in->logprob_passes > 0)
        printf("| forward-only logprob pass (per step: gathers, all-to-alls, p2p, logprob sums) | | %.3f |\n",
               gib(r->logprob_pass));
    if (in->ref_model)
        printf("| KL reference logprob pass (per step: the collectives of one forward-only pass) | | %.3f |\n",
               gib(r->ref_pass));
    printf("| weight broadcast (per sync, every %d step%s) | %.3f | |\n", in->sync_every, moerl_plural(in->sync_every),
           gib(r->weight_bcast));
}


/* The paged KV cache beside the slot engine's reservation (plan_kv.h), per rollout device. */
static void print_paged_rows(const plan_kv_input *k, const plan_kv_result *p) {
    if (k->synth_alpha > 0)
        printf("paged KV (rollout.block_size=%d): responses from rollout.synthetic_length (Pareto alpha %g from %d "
               "tokens, capped at %d: mean %.1f, %.1f%% at the cap), prompts of %d tokens\n",
               k->block_size, k->synth_alpha, k->synth_min, k->max_response, p->mean_response, 100 * p->p_cap,
               k->prompt_len);
    else
        printf("paged KV (rollout.block_size=%d): every response %d tokens (%s), prompts of %d tokens\n", k->block_size,
               k->fixed_response, k->fixed_response == k->max_response ? "data.max_response_length: set "
               "rollout.synthetic_length.* or plan.mean_response_length for a distribution" : "plan.mean_response_length",
               k->prompt_len);
    printf("| KV cache per rollout device | %s | sequences the budget admits | KV waste |\n|---|---|---|---|\n", g_unit);
    printf("| reserved (slot engine): %d × %d tokens | %.3f | %.0f | %.1f%% |\n", k->max_num_seqs, k->max_model_len,
           gib(p->reserved_bytes), p->seqs_reserved, 100 * p->waste_reserved);
    printf("| paged, expected: %d × %.2f blocks of %d tokens%s | %.3f | %.1f (max_num_seqs caps at %d) | %.1f%% |\n",
           k->max_num_seqs, p->blocks_per_seq_shared, k->block_size,
           p->shared_blocks > 0 ? " (prefix sharing)" : "", gib(p->paged_bytes), p->seqs_paged, k->max_num_seqs,
           100 * p->waste_paged);
    if (p->shared_blocks > 0)
        printf("| prefix sharing: a group of rollout.n=%d shares %d prompt block%s; %.2f blocks per sequence without it "
               "| %.3f | %.1f | |\n", k->group_size, p->shared_blocks, moerl_plural(p->shared_blocks), p->blocks_per_seq,
               gib(k->max_num_seqs * p->blocks_per_seq * p->block_bytes),
               (double)p->budget_blocks / p->blocks_per_seq);
    printf("| KV budget: %s | %.3f (%lld blocks) | | |\n",
           k->budget_bytes > 0 ? "rollout.kv_cache_bytes / gpu_memory_utilization" : "the reservation (rollout.kv_cache_bytes=0)",
           gib(p->budget_bytes), (long long)p->budget_blocks);
}

static json_t *paged_json(const plan_kv_input *k, const plan_kv_result *p) {
    json_t *o = json_object();
#define I(key, v) json_object_set_new(o, key, json_integer(v))
#define R(key, v) json_object_set_new(o, key, json_real(v))
    I("block_size", k->block_size); I("prompt_len", k->prompt_len); I("shared_blocks", p->shared_blocks);
    json_object_set_new(o, "length_distribution", json_string(k->synth_alpha > 0 ? "rollout.synthetic_length" : "fixed"));
    R("mean_response", p->mean_response); R("p_cap", p->p_cap); R("blocks_per_seq", p->blocks_per_seq);
    R("blocks_per_seq_shared", p->blocks_per_seq_shared); R("block_bytes", p->block_bytes);
    R("reserved_bytes", p->reserved_bytes); R("paged_bytes", p->paged_bytes); R("budget_bytes", p->budget_bytes);
    I("budget_blocks", p->budget_blocks); R("seqs_reserved", p->seqs_reserved); R("seqs_paged", p->seqs_paged);
    R("waste_reserved", p->waste_reserved); R("waste_paged", p->waste_paged);
#undef I
#undef R
    return o;
}

/* The gradient exchange of each scheme (plan_xchg.h): rows[s] for in. */
static int xchg_rows(const plan_xchg_input *in, const plan_codec *k, plan_xchg_row rows[PLAN_XCHG_N]) {
    for (int s = 0; s < PLAN_XCHG_N; s++)
        if (plan_xchg_row_compute(in, k, (plan_xchg_scheme)s, &rows[s]) != MOERL_OK) return MOERL_ERR;
    return MOERL_OK;
}

static void print_xchg_table(const char *title, const plan_xchg_input *in, const plan_xchg_row rows[PLAN_XCHG_N]) {
    const int rule = plan_xchg_rule(in, &rows[0]);
    char link[64] = "not given (plan.link_bandwidth)", comp[64] = "not given (plan.train_flops)";
    if (in->link_bw > 0) snprintf(link, sizeof link, "%.4g GB/s = %.4g Gbit/s per rank", in->link_bw / 1e9, in->link_bw * 8 / 1e9);
    if (in->compute_s > 0) snprintf(comp, sizeof comp, "%.4g s", in->compute_s);
    printf("%s: %d rank%s, %.4g gradient floats (%.4g MB); link %s; compute per update %s\n", title, in->ranks,
           moerl_plural(in->ranks), in->elements, in->elements * 4 / 1e6, link, comp);
    printf("| scheme | bytes sent per element | ratio | codec s per update | exchange s per update | exchange / compute | "
           "shortens the step below (Gbit/s per rank) |\n|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < PLAN_XCHG_N; s++) {
        const plan_xchg_row *r = &rows[s];
        char ex[32] = "—", fr[32] = "—", cx[48] = "—";
        if (in->link_bw > 0) snprintf(ex, sizeof ex, "%.4g%s", r->exchange_s, r->shortens ? " (shorter)" : "");
        if (in->link_bw > 0 && in->compute_s > 0) snprintf(fr, sizeof fr, "%.1f%%", 100 * r->exchange_s / in->compute_s);
        if (s > 0 && in->ranks < 2) {
            snprintf(cx, sizeof cx, "no exchange on one rank");
        } else if (s > 0) {
            if (r->crossover_bw <= 0) snprintf(cx, sizeof cx, "never (sends no fewer bytes)");
            else snprintf(cx, sizeof cx, "%.4g", r->crossover_bw * 8 / 1e9);
        }
        printf("| %s | %.4g | %.3g× | %.4g | %s | %s | %s |\n", plan_xchg_name((plan_xchg_scheme)s),
               r->bytes_per_element, r->ratio, r->codec_s, ex, fr, cx);
    }
    printf("  the practice's rule of thumb (compress above %.0f MB and when communication exceeds %.0f%% of compute): "
           "%s\n", PLAN_XCHG_RULE_BYTES / 1e6, 100 * PLAN_XCHG_RULE_FRACTION,
           rule == 1 ? "compress" : rule == 0 ? "do not compress" : "size passes; give plan.link_bandwidth and plan.train_flops for the 20% test");
}

static json_t *xchg_json(const plan_xchg_input *in, const plan_xchg_row rows[PLAN_XCHG_N]) {
    json_t *o = json_object(), *a = json_array();
    json_object_set_new(o, "ranks", json_integer(in->ranks));
    json_object_set_new(o, "elements", json_real(in->elements));
    json_object_set_new(o, "link_bandwidth", json_real(in->link_bw));
    json_object_set_new(o, "compute_s", json_real(in->compute_s));
    json_object_set_new(o, "rule_of_thumb", json_integer(plan_xchg_rule(in, &rows[0])));
    for (int s = 0; s < PLAN_XCHG_N; s++) {
        json_t *r = json_object();
        json_object_set_new(r, "scheme", json_string(plan_xchg_name((plan_xchg_scheme)s)));
        json_object_set_new(r, "bytes_per_element", json_real(rows[s].bytes_per_element));
        json_object_set_new(r, "ratio", json_real(rows[s].ratio));
        json_object_set_new(r, "codec_s", json_real(rows[s].codec_s));
        json_object_set_new(r, "exchange_s", json_real(rows[s].exchange_s));
        json_object_set_new(r, "crossover_bandwidth", isinf(rows[s].crossover_bw) ? json_null() : json_real(rows[s].crossover_bw));
        json_object_set_new(r, "shortens", json_boolean(rows[s].shortens));
        json_array_append_new(a, r);
    }
    json_object_set_new(o, "schemes", a);
    return o;
}

/* The paged KV rows and the two compression tables (this plan's exchange, the practice's worked row). */
static int plan_extras(const cfg *c, const moe_config *mc, const plan_input *in, const plan_result *r, json_t *o,
                       int print) {
    plan_kv_input kv;
    plan_kv_result pk;
    plan_xchg_input x, px;
    plan_codec k;
    plan_xchg_row rows[PLAN_XCHG_N], prow[PLAN_XCHG_N];
    if (plan_read_paged(c, mc, in, r, &kv) != MOERL_OK || plan_kv_compute(&kv, &pk) != MOERL_OK ||
        plan_read_xchg(c, mc, in, r, &x, &k) != MOERL_OK || xchg_rows(&x, &k, rows) != MOERL_OK)
        return MOERL_ERR;
    plan_xchg_practice(&px);
    if (xchg_rows(&px, &k, prow) != MOERL_OK) return MOERL_ERR;
    if (o) {
        json_object_set_new(o, "paged_kv", paged_json(&kv, &pk));
        json_object_set_new(o, "grad_exchange", xchg_json(&x, rows));
        json_object_set_new(o, "grad_exchange_practice", xchg_json(&px, prow));
        return MOERL_OK;
    }
    if (!print) return MOERL_OK;
    print_paged_rows(&kv, &pk);
    print_xchg_table("gradient exchange per update (the DDP reducer's payload over the dp ranks; plan.codec.* costs)", &x,
                     rows);
    if (in->fsdp > 1 || r->fsdp > 1 || in->pp > 1 || in->ep > 1)
        printf("  (this layout reduces its gradients by FSDP reduce-scatters / the pipeline stage's or EP's all-reduces, "
               "which moerl does not compress — actor.grad_compression is refused with them: the rows are the same "
               "gradients all-reduced by plain data parallelism)\n");
    print_xchg_table("the 8×A100 practice (30 GB of gradients over 8 GPUs, 420 ms exact in a 1.42 s step)", &px, prow);
    return MOERL_OK;
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
        if (plan_extras(c, &mc, &in, &r, o, 0) != MOERL_OK) {
            json_decref(o);
            goto fail;
        }
        cli_print_json(o, 17);
    } else {
        if (plan_extras(c, &mc, &in, &r, NULL, 0) != MOERL_OK) goto fail; /* refused before anything prints */
        plan_print_table(&mc, &in, &r);
        if (r.fsdp > 1) print_fsdp_rows(&in, both);
        plan_extras(c, &mc, &in, &r, NULL, 1);
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
