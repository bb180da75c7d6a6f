/* moerl plan's configuration: the keys of `moerl rl` (so an rl YAML plans as it runs) plus the
 * layout and dtype keys plan models, read and checked into plan_input (plan/plan.h). */
#ifndef MOERL_PLAN_CONFIG_H
#define MOERL_PLAN_CONFIG_H

#include "base/config.h"
#include "model/model.h"
#include "plan/plan.h"
#include "plan/plan_kv.h"
#include "plan/plan_xchg.h"

/* The prompt length plan assumes when data.max_prompt_length is 0 (no limit in rl): verl's default. */
#define PLAN_DEFAULT_PROMPT_LEN 512

/* Declare rl_def_keys' keys and plan's own: model.enable_gradient_checkpointing, rollout.n_ranks,
 * rollout.tensor_model_parallel_size, actor.dtype, rollout.dtype, plan.pp_params (each unless
 * declared already). */
void plan_def_keys(cfg *c);
/* The architecture (model: --model DIR|config.json, or NULL for model.path / model.* as
 * model_config_from_keys reads them) into *mc and the job's sizes into *in, refused as moerl refuses
 * them (the data.* keys, the layout against the trainer ranks and the model, counts above 2^31 − 1,
 * tokens per step above 2^53). Errors name the keys and their values. */
int plan_read_input(const cfg *c, const char *model, moe_config *mc, plan_input *in);

/* The paged KV cache's rollout keys (issue 28; the engine's engine_config fields, vLLM's names), each
 * unless declared already: rollout.block_size (16), rollout.kv_cache_bytes (0 = the slot engine's
 * reservation), rollout.gpu_memory_utilization (0 = off), rollout.enable_prefix_caching (true). moerl plan
 * and moerl simulate declare them as moerl rl does. */
void plan_paged_def_keys(cfg *c);
/* The paged KV model's input for a plan already computed (in, r): the prompt, the response distribution
 * (rollout.synthetic_length.*, else plan.mean_response_length), the paged keys, and the budget per
 * rollout device: rollout.kv_cache_bytes (an engine replica's, so / min(tp, kv heads) per device), or
 * rollout.gpu_memory_utilization × (plan.rollout_device_memory − the device's weights and routing record),
 * or 0 (the reservation). Errors name the key and value: both budgets set, a utilization outside (0, 1] or
 * without plan.rollout_device_memory, a device too small for its weights, negative values. */
int plan_read_paged(const cfg *c, const moe_config *mc, const plan_input *in, const plan_result *r, plan_kv_input *kv);
/* The gradient exchange of the plan (in, r): the DDP reducer's n_params floats over the dp ranks, the link
 * (plan.link_bandwidth, bytes/s), compute per update (the update's FLOPs at full length over the trainer devices, model_train_flops,
 * over plan.train_flops) and the codec keys plan.codec.*. Errors name the key and value. */
int plan_read_xchg(const cfg *c, const moe_config *mc, const plan_input *in, const plan_result *r, plan_xchg_input *x,
                   plan_codec *k);

#endif
