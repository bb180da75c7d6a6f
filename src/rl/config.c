/* The RL algorithm's config keys (verl names) and their validation: loss aggregation, advantage
 * estimator, rollout correction, DAPO's overlong shaping/filtering and dynamic sampling,
 * divergence stop. The job's other keys (rollout.*, async_training.*, trainer.*) live with the
 * command (src/cli/rl.c). */
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "parallel/compress.h"
#include "rl/rl.h"

void rl_def_algorithm_keys(cfg *c) {
    cfg_def_str(c, "actor.loss_agg_mode", "token-mean",
                "loss aggregation: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm");
    cfg_def_float(c, "actor.loss_scale_factor", 0.0,
                  "divisor H of seq-mean-token-sum-norm (0 = data.max_response_length; Dr. GRPO)");
    cfg_def_str(c, "algorithm.adv_estimator", "grpo", "advantage estimator: grpo | rloo | reinforce_plus_plus_baseline");
    cfg_def_bool(c, "algorithm.norm_adv_by_std_in_grpo", true, "grpo: divide by the group std (false: Dr. GRPO)");
    cfg_def_bool(c, "algorithm.rollout_correction.bypass_mode", true,
                 "true: PPO ratio against the behaviour logprobs; false: recompute the old logprobs with the trainer");
    cfg_def_str(c, "algorithm.rollout_correction.rollout_is", "null",
                "rollout importance sampling (bypass_mode=false): null | token | sequence");
    cfg_def_float(c, "algorithm.rollout_correction.rollout_is_threshold", 2.0,
                  "truncation of the rollout IS weight min(pi_old/mu, threshold)");
    cfg_def_bool(c, "reward_model.overlong_buffer.enable", false, "DAPO overlong reward shaping");
    cfg_def_int(c, "reward_model.overlong_buffer.len", 0, "DAPO: the last len tokens before max_response_length are penalised");
    cfg_def_float(c, "reward_model.overlong_buffer.penalty_factor", 1.0, "DAPO: penalty at max_response_length");
    cfg_def_bool(c, "actor.overlong_filter", false, "DAPO overlong filtering: responses cut at max_response_length carry no loss");
    cfg_def_bool(c, "algorithm.filter_groups.enable", false, "DAPO dynamic sampling: drop groups whose rewards are all equal");
    cfg_def_int(c, "algorithm.filter_groups.max_num_gen_batches", 10,
                "stop when a step drops more than this many steps' worth of groups (0 = never)");
    cfg_def_str(c, "actor.grad_compression", "none",
                "data-parallel gradient all-reduce: none (exact) | onebit (sign + scale per chunk) | threshold (values above "
                "2·median|g|), both with error feedback");
    cfg_def_int(c, "actor.grad_compression_warmup_steps", 10, "exact all-reduce for the first n optimizer steps");
    cfg_def_int(c, "actor.grad_compression_chunk", 256, "onebit: elements per scale");
    cfg_def_int(c, "trainer.max_consecutive_skipped_steps", 10,
                "stop a diverged run after this many consecutive non-finite optimizer steps (0 = never)");
}

int rl_read_algorithm_keys(const cfg *c, rl_config *r) {
    if (loss_agg_mode_parse(cfg_str(c, "actor.loss_agg_mode"), &r->loss_agg) != MOERL_OK) return MOERL_ERR;
    r->loss_scale_factor = cfg_float(c, "actor.loss_scale_factor");
    if (!(r->loss_scale_factor >= 0) || !isfinite(r->loss_scale_factor))
        return moerl_errorf("actor.loss_scale_factor must be ≥ 0 (0 = data.max_response_length), got %g",
                            r->loss_scale_factor);
    const char *est = cfg_str(c, "algorithm.adv_estimator");
    if (!strcmp(est, "grpo")) r->adv_estimator = RL_ADV_GRPO;
    else if (!strcmp(est, "rloo")) r->adv_estimator = RL_ADV_RLOO;
    else if (!strcmp(est, "reinforce_plus_plus_baseline")) r->adv_estimator = RL_ADV_REINFORCE_PP_BASELINE;
    else
        return moerl_errorf("algorithm.adv_estimator: '%s' is not one of grpo, rloo, reinforce_plus_plus_baseline", est);
    r->norm_adv_by_std = cfg_bool(c, "algorithm.norm_adv_by_std_in_grpo");
    r->recompute_old = !cfg_bool(c, "algorithm.rollout_correction.bypass_mode");
    const char *is = cfg_str(c, "algorithm.rollout_correction.rollout_is");
    if (!strcmp(is, "null") || !strcmp(is, "none") || !is[0]) r->rollout_is = ROLLOUT_IS_NONE;
    else if (!strcmp(is, "token")) r->rollout_is = ROLLOUT_IS_TOKEN;
    else if (!strcmp(is, "sequence")) r->rollout_is = ROLLOUT_IS_SEQUENCE;
    else return moerl_errorf("algorithm.rollout_correction.rollout_is: '%s' is not one of null, token, sequence", is);
    r->rollout_is_threshold = (float)cfg_float(c, "algorithm.rollout_correction.rollout_is_threshold");
    if (!(r->rollout_is_threshold > 0) || !isfinite(r->rollout_is_threshold))
        return moerl_errorf("algorithm.rollout_correction.rollout_is_threshold must be a finite number > 0, got %g",
                            (double)r->rollout_is_threshold);
    if (r->rollout_is != ROLLOUT_IS_NONE && !r->recompute_old)
        return moerl_errorf("algorithm.rollout_correction.rollout_is=%s needs recomputed old logprobs: set "
                            "algorithm.rollout_correction.bypass_mode=false (with bypass the ratio is already "
                            "taken against the behaviour policy)", is);
    if (r->rollout_is != ROLLOUT_IS_NONE && r->ppo.decoupled)
        return moerl_errorf("algorithm.rollout_correction.rollout_is and actor.use_decoupled_loss both weight the "
                            "loss by pi_old/mu: choose one");
    r->overlong_enable = cfg_bool(c, "reward_model.overlong_buffer.enable");
    r->overlong_len = (int)cfg_int(c, "reward_model.overlong_buffer.len");
    r->overlong_penalty_factor = cfg_float(c, "reward_model.overlong_buffer.penalty_factor");
    if (r->overlong_len < 0 || (r->overlong_enable && (r->overlong_len <= 0 || r->overlong_len > r->max_response_length)))
        return moerl_errorf("reward_model.overlong_buffer.len must be in [1, data.max_response_length = %d] when "
                            "enabled, got %d", r->max_response_length, r->overlong_len);
    if (!(r->overlong_penalty_factor >= 0) || !isfinite(r->overlong_penalty_factor))
        return moerl_errorf("reward_model.overlong_buffer.penalty_factor must be ≥ 0, got %g",
                            r->overlong_penalty_factor);
    r->overlong_filter = cfg_bool(c, "actor.overlong_filter");
    r->filter_groups = cfg_bool(c, "algorithm.filter_groups.enable");
    r->filter_max_num_gen_batches = (int)cfg_int(c, "algorithm.filter_groups.max_num_gen_batches");
    if (r->filter_groups && r->n < 2)
        return moerl_errorf("algorithm.filter_groups.enable=true with rollout.n=%d: a group of one response always has "
                            "equal rewards, so every group would be dropped; use rollout.n ≥ 2", r->n);
    if (r->filter_max_num_gen_batches < 0)
        return moerl_errorf("algorithm.filter_groups.max_num_gen_batches must be ≥ 0 (0 = never stop), got %d",
                            r->filter_max_num_gen_batches);
    grad_compression gc;
    if (grad_compression_parse(cfg_str(c, "actor.grad_compression"), &gc) != MOERL_OK) return MOERL_ERR;
    r->grad_compression = (int)gc;
    r->grad_compression_warmup_steps = (int)cfg_int(c, "actor.grad_compression_warmup_steps");
    r->grad_compression_chunk = (int)cfg_int(c, "actor.grad_compression_chunk");
    if (r->grad_compression_warmup_steps < 0 || r->grad_compression_chunk < 1)
        return moerl_errorf("actor.grad_compression_warmup_steps must be ≥ 0 and actor.grad_compression_chunk ≥ 1 "
                            "(got %d, %d)", r->grad_compression_warmup_steps, r->grad_compression_chunk);
    r->max_consecutive_skipped = (int)cfg_int(c, "trainer.max_consecutive_skipped_steps");
    if (r->max_consecutive_skipped < 0)
        return moerl_errorf("trainer.max_consecutive_skipped_steps must be ≥ 0 (0 = never stop), got %d",
                            r->max_consecutive_skipped);
    /* The engine's behaviour logprob is log softmax(z/T) over the FULL vocabulary while a truncated
     * sampler draws from the renormalised top-k/top-p set, so the PPO ratio would be taken against
     * a distribution the token was not drawn from. */
    if (r->top_k > 0 || r->top_p < 1.0f)
        return moerl_errorf("rollout.top_k=%d / rollout.top_p=%g: truncated sampling is refused in moerl rl: the "
                            "behaviour logprobs and the trainer's recomputation use the full tempered distribution, so "
                            "the PPO ratio would be biased against the truncated distribution the tokens were drawn "
                            "from; use rollout.top_k=0 (off) and rollout.top_p=1 (temperature is fine)",
                            r->top_k, (double)r->top_p);
    return MOERL_OK;
}
