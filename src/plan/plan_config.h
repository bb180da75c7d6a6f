/* moerl plan's configuration: the keys of `moerl rl` (so an rl YAML plans as it runs) plus the
 * layout and dtype keys plan models, read and checked into plan_input (plan/plan.h). */
#ifndef MOERL_PLAN_CONFIG_H
#define MOERL_PLAN_CONFIG_H

#include "base/config.h"
#include "model/model.h"
#include "plan/plan.h"

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

#endif
