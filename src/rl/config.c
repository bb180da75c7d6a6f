/* The RL job's config keys (verl names) and their reading into rl_config: rollout.*, actor.*,
 * async_training.* (the sync mode's rule, applied once), trainer.*, and the RL algorithm's keys (loss
 * aggregation, advantage estimator, rollout correction, DAPO's overlong shaping/filtering and dynamic
 * sampling, divergence stop). The model.*, data.*, sft.* and layout keys are their modules'. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "base/pool.h"
#include "data/data_config.h"
#include "model/model_config.h"
#include "dist/compress.h"
#include "parallel/config.h"
#include "rl/multi_turn.h"
#include "optim/onebit_adam.h"
#include "rl/rl.h"
#include "rl/sft_job.h"

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
    cfg_def_str(c, "algorithm.rollout_correction.rollout_rs", "null",
                "rollout rejection sampling (bypass_mode=false): null, or comma-separated options that must all pass, "
                "of token_k1|token_k2|token_k3 (per token: IcePop is token_k1), seq_sum_k1|k2|k3, seq_mean_k1|k2|k3 "
                "(geometric: seq_mean_k1), seq_max_k2|k3 (per sequence); k1 = -log(pi_old/mu), k2 = (log r)^2/2, "
                "k3 = r - 1 - log r; rejected tokens/sequences leave the loss and its normalisation");
    cfg_def_str(c, "algorithm.rollout_correction.rollout_rs_threshold", "null",
                "rollout_rs bounds, one for all options or one per option (comma separated): k1 options "
                "\"lower_upper\" ratio bounds (e.g. 0.5_2.0; a single number u means 1/u_u), k2/k3 one upper bound");
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
    cfg_def_str(c, "actor.policy_loss.loss_mode", "vanilla",
                "policy loss: vanilla (PPO token ratio) | gspo (sequence ratio exp(mean log ratio), Zheng et al. 2025; "
                "its pg loss is always aggregated seq-mean-token-mean as verl does, whatever actor.loss_agg_mode; use "
                "GSPO's clip scale, actor.clip_ratio_low=3e-4 and clip_ratio_high=4e-4; no dual clip)");
    cfg_def_str(c, "actor.kl_loss_type", "low_var_kl",
                "KL loss estimator (actor.use_kl_loss): kl (k1) | abs | mse (k2) | low_var_kl (k3); a trailing '+' "
                "(k1+, k3+, ...) keeps the value and takes k2's gradient (straight-through)");
    cfg_def_bool(c, "algorithm.use_kl_in_reward", false,
                 "subtract kl_ctrl's beta times the KL to the frozen starting policy from each response's score");
    cfg_def_str(c, "algorithm.kl_penalty", "kl",
                "KL estimator of use_kl_in_reward, on the old logprobs: kl (k1) | abs | mse (k2) | low_var_kl (k3), "
                "optionally with '+'");
    cfg_def_str(c, "algorithm.kl_ctrl.type", "fixed", "use_kl_in_reward's coefficient: fixed | adaptive (Ziegler et al. 2019)");
    cfg_def_float(c, "algorithm.kl_ctrl.kl_coef", 0.001, "use_kl_in_reward: beta (the adaptive controller's initial beta)");
    cfg_def_float(c, "algorithm.kl_ctrl.target_kl", 0.1, "adaptive: the mean per-token KL the controller steers to");
    cfg_def_float(c, "algorithm.kl_ctrl.horizon", 10000, "adaptive: responses over which beta moves by at most 20%");
    cfg_def_str(c, "actor.router_replay.mode", "disabled",
                "MoE routing replay (docs/rl.md, Routing replay): disabled | R2 (the old-logprob pass records each "
                "token's experts, the updates replay them; needs that pass: bypass_mode=false or use_decoupled_loss) | "
                "R3 (every trainer forward replays the rollout's experts; needs rollout.enable_rollout_routing_replay)");
    cfg_def_int(c, "trainer.max_consecutive_skipped_steps", 10,
                "stop a diverged run after this many consecutive non-finite optimizer steps (0 = never)");
}

/* actor.policy_loss.loss_mode, actor.kl_loss_type, algorithm.use_kl_in_reward / kl_penalty / kl_ctrl.* */
static int read_kl_keys(const cfg *c, rl_config *r) {
    if (policy_loss_mode_parse(cfg_str(c, "actor.policy_loss.loss_mode"), &r->loss_mode) != MOERL_OK ||
        kl_type_parse("actor.kl_loss_type", cfg_str(c, "actor.kl_loss_type"), &r->kl_loss_type) != MOERL_OK ||
        kl_type_parse("algorithm.kl_penalty", cfg_str(c, "algorithm.kl_penalty"), &r->kl_penalty) != MOERL_OK)
        return MOERL_ERR;
    if (r->loss_mode == POLICY_LOSS_GSPO && r->ppo.decoupled)
        return moerl_errorf("actor.policy_loss.loss_mode=gspo with actor.use_decoupled_loss=true: GSPO has no "
                            "decoupled form (verl's compute_policy_loss_gspo); use one of them");
    r->use_kl_in_reward = cfg_bool(c, "algorithm.use_kl_in_reward");
    const char *kt = cfg_str(c, "algorithm.kl_ctrl.type");
    if (!strcmp(kt, "fixed")) r->kl_ctrl.adaptive = 0;
    else if (!strcmp(kt, "adaptive")) r->kl_ctrl.adaptive = 1;
    else return moerl_errorf("algorithm.kl_ctrl.type: '%s' is not one of fixed, adaptive", kt);
    r->kl_ctrl.value = cfg_float(c, "algorithm.kl_ctrl.kl_coef");
    r->kl_ctrl.target = cfg_float(c, "algorithm.kl_ctrl.target_kl");
    r->kl_ctrl.horizon = cfg_float(c, "algorithm.kl_ctrl.horizon");
    if (!(r->kl_ctrl.value >= 0) || !isfinite(r->kl_ctrl.value))
        return moerl_errorf("algorithm.kl_ctrl.kl_coef must be a finite number ≥ 0, got %g", r->kl_ctrl.value);
    if (r->kl_ctrl.adaptive && !(r->kl_ctrl.horizon > 0 && isfinite(r->kl_ctrl.horizon)))
        return moerl_errorf("algorithm.kl_ctrl.horizon must be a finite number > 0 for kl_ctrl.type=adaptive, got %g",
                            r->kl_ctrl.horizon);
    if (r->kl_ctrl.adaptive && !(r->kl_ctrl.target > 0 && isfinite(r->kl_ctrl.target)))
        return moerl_errorf("algorithm.kl_ctrl.target_kl must be a finite number > 0 for kl_ctrl.type=adaptive, got %g",
                            r->kl_ctrl.target);
    return MOERL_OK;
}

/* actor.router_replay.mode (verl's key and values) and what each mode needs: R3 the engine's record
 * (rollout.enable_rollout_routing_replay), R2 the old-logprob pass that records. */
static int read_router_replay(const cfg *c, rl_config *r) {
    const char *m = cfg_str(c, "actor.router_replay.mode");
    if (!strcmp(m, "disabled")) r->router_replay = ROUTER_REPLAY_DISABLED;
    else if (!strcmp(m, "R2")) r->router_replay = ROUTER_REPLAY_R2;
    else if (!strcmp(m, "R3")) r->router_replay = ROUTER_REPLAY_R3;
    else return moerl_errorf("actor.router_replay.mode: '%s' is not one of disabled, R2, R3", m);
    if (r->router_replay == ROUTER_REPLAY_R3 && !r->rollout_routing_replay)
        return moerl_errorf("actor.router_replay.mode=R3 replays the rollout's routes, which the engine records only "
                            "with rollout.enable_rollout_routing_replay=true; set it (or use mode R2 or disabled)");
    if (r->router_replay == ROUTER_REPLAY_R2 && !r->recompute_old && !r->ppo.decoupled)
        return moerl_errorf("actor.router_replay.mode=R2 records the routes in the old-logprob pass, which runs only "
                            "with algorithm.rollout_correction.bypass_mode=false or actor.use_decoupled_loss=true; set "
                            "one of them (or use mode R3 with rollout.enable_rollout_routing_replay=true)");
    return MOERL_OK;
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
    if (read_kl_keys(c, r) != MOERL_OK) return MOERL_ERR;
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
    if (rollout_rs_parse(cfg_str(c, "algorithm.rollout_correction.rollout_rs"),
                         cfg_str(c, "algorithm.rollout_correction.rollout_rs_threshold"), &r->rollout_rs) != MOERL_OK)
        return MOERL_ERR;
    if (r->rollout_rs.n > 0 && !r->recompute_old)
        return moerl_errorf("algorithm.rollout_correction.rollout_rs=%s needs recomputed old logprobs: set "
                            "algorithm.rollout_correction.bypass_mode=false, also with actor.use_decoupled_loss=true (moerl "
                            "rejects against the rollout correction's pi_old before the update; rejection inside the "
                            "bypass-mode loss is not offered)",
                            cfg_str(c, "algorithm.rollout_correction.rollout_rs"));
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

/* rollout.block_size, kv_cache_bytes, gpu_memory_utilization, enable_prefix_caching: the paged KV cache
 * (vLLM's names; engine.h, docs/engine.md). */
void rollout_kv_def_keys(cfg *c) {
    cfg_def_int(c, "rollout.block_size", 16, "tokens per KV-cache block of the paged engine (vLLM's block_size)");
    cfg_def_int(c, "rollout.kv_cache_bytes", 0,
                "KV-cache budget in bytes (blocks of rollout.block_size tokens × all layers' K and V); sequences are "
                "admitted by free blocks and the newest preempted (re-prefilled later) when blocks run out. 0 = "
                "rollout.gpu_memory_utilization's, or when that is 0 room for rollout.max_num_seqs × the longest "
                "prompt + data.max_response_length (never preempts)");
    cfg_def_float(c, "rollout.gpu_memory_utilization", 0.0,
                  "vLLM's meaning for the KV budget when rollout.kv_cache_bytes is 0: this fraction of the memory "
                  "free once the engine's weights are allocated (on a CPU host /proc/meminfo's MemAvailable); 0 = off");
    cfg_def_bool(c, "rollout.enable_prefix_caching", true,
                 "share the KV blocks of a common prompt prefix between requests under the same policy version "
                 "(a GRPO group of rollout.n samples prefills its prompt once); KV from older weights is never reused");
}

/* The paged-KV keys into r, validated. */
int rollout_kv_read(const cfg *c, rl_config *r) {
    const int64_t bs = cfg_int(c, "rollout.block_size"), bytes = cfg_int(c, "rollout.kv_cache_bytes");
    const double u = cfg_float(c, "rollout.gpu_memory_utilization");
    if (bs < 1 || bs > 65536) return moerl_errorf("rollout.block_size must be in [1, 65536] tokens, got %lld", (long long)bs);
    if (bytes < 0) return moerl_errorf("rollout.kv_cache_bytes must be ≥ 0 (0 = see rollout.gpu_memory_utilization), got %lld", (long long)bytes);
    if (!(u >= 0 && u <= 1))
        return moerl_errorf("rollout.gpu_memory_utilization must be a fraction in [0, 1] (0 = off), got %g", u);
    if (bytes > 0 && u > 0) /* as moerl plan and simulate: one budget, not a silent precedence */
        return moerl_errorf("rollout.kv_cache_bytes=%lld and rollout.gpu_memory_utilization=%g both give the KV budget: "
                            "set one of them (the other 0)", (long long)bytes, u);
    r->block_size = (int)bs;
    r->kv_cache_bytes = bytes;
    r->gpu_memory_utilization = u;
    r->enable_prefix_caching = cfg_bool(c, "rollout.enable_prefix_caching");
    return MOERL_OK;
}

/* ---- trainer.allocator (issue 29): the buffer allocator of moerl rl and moerl sft (src/base/pool.h) */

void rl_def_allocator_keys(cfg *c) {
    cfg_def_str(c, "trainer.allocator", "malloc",
                "allocator of the large buffers (activation arena, KV cache, gradient-compression buffers): malloc "
                "(glibc) | pool (moerl's caching pool) | jemalloc (docs/benchmarks.md, \"Memory\"); when given it "
                "wins over the environment's MOERL_ALLOC (a warning names both), else MOERL_ALLOC decides");
    cfg_def_float(c, "trainer.allocator_reserve", 0.3,
                  "trainer.allocator=pool: freed memory the pool keeps committed, as a share of the peak in use, "
                  "in [0, 1] (0 = return every freed page at once); when given it wins over MOERL_POOL_RESERVE");
}

/* trainer.allocator's name into *k (may be NULL) and trainer.allocator_reserve's range. */
static int check_allocator_keys(const cfg *c, moerl_alloc_kind *k) {
    const char *a = cfg_str(c, "trainer.allocator");
    moerl_alloc_kind kind = MOERL_ALLOC_MALLOC;
    if (moerl_alloc_parse(a, &kind) != MOERL_OK)
        return moerl_errorf("trainer.allocator: '%s' (%s) is not malloc, pool or jemalloc", a,
                            cfg_origin(c, "trainer.allocator"));
    const double r = cfg_float(c, "trainer.allocator_reserve");
    if (strcmp(cfg_origin(c, "trainer.allocator_reserve"), "default") && !(r >= 0 && r <= 1))
        return moerl_errorf("trainer.allocator_reserve: %g (%s) is not a fraction in [0, 1]", r,
                            cfg_origin(c, "trainer.allocator_reserve"));
    if (k) *k = kind;
    return MOERL_OK;
}

int rl_check_config_keys(const cfg *c, rl_config *r) {
    if (rl_read_config(c, r) != MOERL_OK) return MOERL_ERR;
    return check_allocator_keys(c, NULL);
}

int rl_select_allocator(const cfg *c) {
    moerl_alloc_kind k = MOERL_ALLOC_MALLOC;
    if (check_allocator_keys(c, &k) != MOERL_OK) return MOERL_ERR;
    const double r = cfg_float(c, "trainer.allocator_reserve");
    const int r_given = strcmp(cfg_origin(c, "trainer.allocator_reserve"), "default") != 0;
    moerl_alloc_choice ch = {.kind = strcmp(cfg_origin(c, "trainer.allocator"), "default") ? (int)k : -1,
                             .reserve_frac = r_given ? r : -1.0,
                             .kind_key = "trainer.allocator",
                             .reserve_key = "trainer.allocator_reserve"};
    return moerl_alloc_select(&ch);
}

void rl_def_keys(cfg *c) {
    model_def_keys(c);
    rl_def_allocator_keys(c); /* trainer.allocator, trainer.allocator_reserve */
    model_def_train_keys(c); /* model.enable_gradient_checkpointing, actor.recompute_granularity */
    data_def_keys(c);
    sft_def_warm_start_keys(c);
    par_def_layout_keys(c); /* trainer.n_ranks, actor.fsdp_config.fsdp_size, ... (src/parallel/config.h) */
    reward_def_keys(c);     /* reward.*: where rewards come from (src/reward/reward_config.c) */
    cfg_def_int(c, "rollout.n", 8, "responses per prompt (the GRPO group)");
    cfg_def_float(c, "rollout.temperature", 1.0, "sampling temperature (behaviour logprobs use the same)");
    cfg_def_float(c, "rollout.top_p", 1.0, "nucleus sampling");
    cfg_def_int(c, "rollout.top_k", 0, "top-k sampling (0 = off)");
    cfg_def_int(c, "rollout.max_num_seqs", 64, "sequences in flight in the engine");
    cfg_def_int(c, "rollout.max_num_batched_tokens", 1024, "tokens per engine step");
    rollout_kv_def_keys(c);
    cfg_def_int(c, "rollout.expert_parallel_size", 1,
                "experts of the rollout engine split over this many rollout ranks (EP for inference; the "
                "routed rows go through actor.moe.dispatcher's all-to-all / all-to-all-v); 1 = every rollout "
                "rank holds every expert");
    cfg_def_int(c, "rollout.tensor_model_parallel_size", 1,
                "rollout ranks one engine replica is split over (vLLM's tensor_parallel_size; Megatron's split: "
                "heads, dense and expert widths and the vocabulary divided, one all-reduce after attention and one "
                "after the MLP per layer, the logits gathered so every rank samples the same token); the rollout "
                "ranks form rollout ranks / this replicas. 1 = one replica per rollout rank");
    cfg_def_bool(c, "rollout.enable_rollout_routing_replay", false,
                 "record the experts every MoE layer routes each prompt and response token to in the rollout "
                 "engine (R3, arXiv 2510.11370); they travel with the sample to the trainer. Memory: 2·K bytes per "
                 "MoE layer per token of prompt + data.max_response_length, per response in flight (Qwen3-30B-A3B: "
                 "768 B per token). Not in moerl simulate (no model runs: nothing to record)");
    cfg_def_str(c, "rollout.dtype", "fp32", "weights the rollout engine computes from: fp32 | bf16 (half the bytes per decoded token; the trainer keeps fp32)");
    cfg_def_bool(c, "rollout.batch_invariant", false,
                 "bit-for-bit on-policy: the engine and the trainer compute with batch-invariant kernels (each "
                 "output reduced in one fixed order whatever the batch, chunked-prefill split, micro-batch, thread "
                 "count or layout), so the behaviour logprobs equal the trainer's recomputed ones exactly; slower "
                 "(docs/rl.md, \"Bit-for-bit on-policy\"); with rollout.dtype=bf16 the trainer's forwards compute from the bf16-rounded values of its fp32 master weights");
    cfg_def_float(c, "rollout.synthetic_length.alpha", 0.0, "benchmark workload: Pareto tail index of response lengths (0 = off; EOS ignored when on)");
    cfg_def_int(c, "rollout.synthetic_length.min", 8, "benchmark workload: shortest response");
    val_def_keys(c); /* rollout.val_kwargs.* (rl/validate.h) */
    multi_turn_def_keys(c); /* rollout.multi_turn.* (rl/multi_turn.h) */
    cfg_def_int(c, "actor.ppo_mini_batch_size", 8, "prompts per optimizer step");
    cfg_def_int(c, "actor.ppo_epochs", 1, "passes over each mini-batch");
    cfg_def_float(c, "actor.clip_ratio", 0.2,
                  "PPO clip ε, symmetric (verl's key): the ε of each side whose actor.clip_ratio_low / "
                  "clip_ratio_high is not given");
    cfg_def_float(c, "actor.clip_ratio_low", 0.2, "PPO clip ε below 1");
    cfg_def_float(c, "actor.clip_ratio_high", 0.2,
                  "PPO clip ε above 1 (verl's default 0.2; DAPO's clip-higher is 0.28, set it explicitly)");
    cfg_def_float(c, "actor.clip_ratio_c", 3.0,
                  "dual-clip constant for negative advantages (actor.policy_loss.loss_mode=vanilla; GSPO has no dual clip)");
    cfg_def_bool(c, "actor.use_decoupled_loss", false, "AReaL decoupled PPO (proximal = trainer weights before the step)");
    cfg_def_float(c, "actor.behav_imp_weight_cap", 2.0, "cap of the behaviour importance weight (decoupled)");
    cfg_def_float(c, "actor.entropy_coeff", 0.0, "entropy bonus");
    cfg_def_bool(c, "actor.use_kl_loss", false, "KL loss (estimator: actor.kl_loss_type) to the frozen starting policy");
    cfg_def_float(c, "actor.kl_loss_coef", 0.001, "KL loss weight");
    cfg_def_int(c, "actor.ppo_max_token_len_per_gpu", 4096, "tokens per packed micro-batch");
    cfg_def_float(c, "actor.optim.lr", 1e-4, "learning rate");
    cfg_def_float(c, "actor.optim.weight_decay", 0.0, "AdamW weight decay");
    cfg_def_float(c, "actor.optim.beta1", 0.9, "AdamW beta1");
    cfg_def_float(c, "actor.optim.beta2", 0.99, "AdamW beta2");
    cfg_def_float(c, "actor.optim.clip_grad", 1.0, "global gradient-norm clip");
    cfg_def_str(c, "actor.optim.name", "adamw",
                "adamw | onebit_adam (1-bit Adam, Tang et al. 2021: exact AdamW for freeze_step steps, then the "
                "variance frozen and the momentum all-reduced at 1 bit per value with error feedback; docs/parallelism.md)");
    cfg_def_int(c, "actor.optim.freeze_step", 10, "onebit_adam: exact AdamW optimizer steps before the variance freezes (≥ 1)");
    cfg_def_int(c, "actor.optim.var_update_interval", 0,
                "onebit_adam: every n-th optimizer step after freeze_step is an exact AdamW step (full-precision "
                "all-reduce) that moves the frozen variance and restarts the error feedback (0/1 Adam's variance "
                "updates, Lu et al. 2022, at a fixed interval); 0 = never, 1-bit Adam as published");
    rl_def_algorithm_keys(c);
    cfg_def_float(c, "async_training.staleness_threshold", 0.3, "extra prompts allowed per version, as a share of W");
    cfg_def_int(c, "async_training.trigger_parameter_sync_step", 1, "trainer steps per weight sync");
    cfg_def_int(c, "async_training.require_batches", 1, "mini-batches per trainer step");
    cfg_def_bool(c, "async_training.partial_rollout", true, "interrupt and resume in-flight responses at a sync");
    cfg_def_str(c, "async_training.mode", "async", "async (threads) | lockstep (one thread, reproducible) | sync (baseline)");
    cfg_def_int(c, "async_training.rollout_threads", 1, "compute threads of the rollouter (async mode; every rollout rank under mpirun)");
    cfg_def_int(c, "async_training.trainer_threads", 1, "compute threads of the trainer (async mode; every trainer rank under mpirun)");
    cfg_def_int(c, "trainer.total_training_steps", 0, "trainer steps (0 = from total_epochs)");
    cfg_def_int(c, "trainer.total_epochs", 1, "passes over the prompts");
    cfg_def_str(c, "trainer.default_local_dir", "runs/rl", "output folder");
    cfg_def_int(c, "trainer.test_freq", 5,
                "held-out eval every n versions (0 = start and end only; -1 = start only, no validation during or "
                "after training, as verl's -1 with val_before_train)");
    cfg_def_int(c, "trainer.save_freq", 0, "checkpoint every n versions (0 = end only, -1 = never)");
    cfg_def_int(c, "trainer.val_n", 200, "held-out rows evaluated (0 = no eval)");
    cfg_def_str(c, "trainer.resume_mode", "auto", "auto (continue from the folder's checkpoint) | disable (start anew)");
    cfg_def_bool(c, "trainer.overwrite_output_dir", false, "with resume_mode=disable: start anew in a folder that holds a run, deleting its checkpoints and logs (else refused)");
    cfg_def_int(c, "trainer.seed", 1, "seed of prompt order and sampling");
    cfg_def_float(c, "trainer.watchdog_s", 600, "abort if no trainer step completes for this long (0 = off)");
    cfg_def_bool(c, "trainer.save_bf16", false, "store checkpoints in bf16");
    metrics_def_logger_key(c, "trainer.logger");
    cfg_def_int(c, "trainer.n_threads", 0, "threads for lockstep/sync modes and the warm start (0 = all)");
    cfg_def_int(c, "debug.test_fail_rank", -1,
                "test only: a deliberate error on this world rank under mpirun (-1 = off), at startup or at debug.test_fail_version");
    cfg_def_int(c, "debug.test_fail_version", -1,
                "test only: with debug.test_fail_rank, fail once that rank reaches this policy version (-1 = at startup)");
}

/* rollout.batch_invariant. With rollout.dtype=bf16 the trainer's forwards compute from the
 * bf16-rounded values of its master weights, as the engine does (trainer.c, params_round). */
static int read_batch_invariant_key(const cfg *c, rl_config *r) {
    r->batch_invariant = cfg_bool(c, "rollout.batch_invariant");
    return MOERL_OK;
}

/* rollout.* and data.max_response_length. */
static int read_rollout_keys(const cfg *c, rl_config *r) {
    r->n = (int)cfg_int(c, "rollout.n");
    r->temperature = (float)cfg_float(c, "rollout.temperature");
    r->top_p = (float)cfg_float(c, "rollout.top_p");
    r->top_k = (int)cfg_int(c, "rollout.top_k");
    r->max_response_length = (int)cfg_int(c, "data.max_response_length");
    r->max_num_seqs = (int)cfg_int(c, "rollout.max_num_seqs");
    r->max_num_batched_tokens = (int)cfg_int(c, "rollout.max_num_batched_tokens");
    if (rollout_kv_read(c, r) != MOERL_OK) return MOERL_ERR;
    r->rollout_ep = (int)cfg_int(c, "rollout.expert_parallel_size");
    if (r->rollout_ep < 1)
        return moerl_errorf("rollout.expert_parallel_size must be ≥ 1, got %d", r->rollout_ep);
    r->rollout_tp = (int)cfg_int(c, "rollout.tensor_model_parallel_size");
    if (r->rollout_tp < 1)
        return moerl_errorf("rollout.tensor_model_parallel_size must be ≥ 1, got %d", r->rollout_tp);
    const char *rdt = cfg_str(c, "rollout.dtype");
    if (strcmp(rdt, "fp32") && strcmp(rdt, "bf16"))
        return moerl_errorf("rollout.dtype: '%s' is not a weight type the engine computes from (expected fp32 or bf16)", rdt);
    r->bf16_weights = !strcmp(rdt, "bf16");
    r->rollout_routing_replay = cfg_bool(c, "rollout.enable_rollout_routing_replay");
    if (read_batch_invariant_key(c, r) != MOERL_OK) return MOERL_ERR;
    r->synth_alpha = cfg_float(c, "rollout.synthetic_length.alpha");
    r->synth_min = (int)cfg_int(c, "rollout.synthetic_length.min");
    if (r->synth_alpha < 0 || r->synth_min <= 0)
        return moerl_errorf("rollout.synthetic_length: alpha must be ≥ 0 and min positive (got %g, %d)", r->synth_alpha, r->synth_min);
    return val_read_kwargs(c, &r->val_kwargs); /* rollout.val_kwargs.* (rl/validate.h) */
}

/* actor.* (the PPO loss and AdamW), async_training.*, trainer.* as given (checked by check_values). */
static void read_actor_trainer_keys(const cfg *c, rl_config *r) {
    r->ppo_mini_batch_size = (int)cfg_int(c, "actor.ppo_mini_batch_size");
    r->ppo_epochs = (int)cfg_int(c, "actor.ppo_epochs");
    r->ppo.clip_ratio_low = (float)cfg_float(c, "actor.clip_ratio_low");
    r->ppo.clip_ratio_high = (float)cfg_float(c, "actor.clip_ratio_high");
    r->ppo.clip_ratio_c = (float)cfg_float(c, "actor.clip_ratio_c");
    r->ppo.decoupled = cfg_bool(c, "actor.use_decoupled_loss");
    r->ppo.behav_imp_weight_cap = (float)cfg_float(c, "actor.behav_imp_weight_cap");
    r->entropy_coeff = (float)cfg_float(c, "actor.entropy_coeff");
    r->use_kl_loss = cfg_bool(c, "actor.use_kl_loss");
    r->kl_loss_coef = (float)cfg_float(c, "actor.kl_loss_coef");
    r->ppo_max_token_len = (int)cfg_int(c, "actor.ppo_max_token_len_per_gpu");
    r->optim.lr = (float)cfg_float(c, "actor.optim.lr");
    r->optim.weight_decay = (float)cfg_float(c, "actor.optim.weight_decay");
    r->optim.beta1 = (float)cfg_float(c, "actor.optim.beta1");
    r->optim.beta2 = (float)cfg_float(c, "actor.optim.beta2");
    r->optim.eps = 1e-8f;
    r->optim.max_grad_norm = (float)cfg_float(c, "actor.optim.clip_grad");
    r->async_keys.staleness_threshold = cfg_float(c, "async_training.staleness_threshold");
    r->async_keys.trigger_parameter_sync_step = (int)cfg_int(c, "async_training.trigger_parameter_sync_step");
    r->async_keys.partial_rollout = cfg_bool(c, "async_training.partial_rollout");
    r->require_batches = (int)cfg_int(c, "async_training.require_batches");
    r->rollout_threads = (int)cfg_int(c, "async_training.rollout_threads");
    r->trainer_threads = (int)cfg_int(c, "async_training.trainer_threads");
    r->total_training_steps = cfg_int(c, "trainer.total_training_steps");
    r->total_epochs = (int)cfg_int(c, "trainer.total_epochs");
    snprintf(r->out_dir, sizeof r->out_dir, "%s", cfg_str(c, "trainer.default_local_dir"));
    r->test_freq = (int)cfg_int(c, "trainer.test_freq");
    r->save_freq = (int)cfg_int(c, "trainer.save_freq");
    r->val_n = (int)cfg_int(c, "trainer.val_n");
    r->seed = (uint64_t)cfg_int(c, "trainer.seed");
    r->watchdog_s = cfg_float(c, "trainer.watchdog_s");
    r->save_bf16 = cfg_bool(c, "trainer.save_bf16");
    r->test_fail_rank = (int)cfg_int(c, "debug.test_fail_rank");
    r->test_fail_version = (int)cfg_int(c, "debug.test_fail_version");
    r->test_fail = r->test_fail_rank >= 0;
}

int rl_config_budget(const rl_config *r, staleness_budget *b) {
    return staleness_init(b, r->ppo_mini_batch_size, r->require_batches, r->trigger_parameter_sync_step,
                          r->staleness_threshold);
}

int rl_config_set_mode(rl_config *r, rl_mode mode) {
    r->mode = mode;
    r->staleness_threshold = r->async_keys.staleness_threshold;
    r->trigger_parameter_sync_step = r->async_keys.trigger_parameter_sync_step;
    r->partial_rollout = r->async_keys.partial_rollout;
    if (mode == RL_MODE_SYNC) { /* the synchronous baseline: generate a batch, then train on it */
        r->staleness_threshold = 0;
        r->trigger_parameter_sync_step = 1;
        r->partial_rollout = 0;
    }
    staleness_budget b; /* the budget's own checks, before any work (e.g. a warm start) */
    return rl_config_budget(r, &b);
}

/* async_training.mode and trainer.resume_mode; the sync rule (rl_config_set_mode) applied once here. */
static int read_modes(const cfg *c, rl_config *r) {
    const char *mode = cfg_str(c, "async_training.mode");
    rl_mode m;
    if (!strcmp(mode, "async")) m = RL_MODE_ASYNC;
    else if (!strcmp(mode, "lockstep")) m = RL_MODE_LOCKSTEP;
    else if (!strcmp(mode, "sync")) m = RL_MODE_SYNC;
    else return moerl_errorf("async_training.mode: '%s' is not one of async, lockstep, sync", mode);
    const int trigger = r->async_keys.trigger_parameter_sync_step;
    if (m == RL_MODE_SYNC) {
        /* every rank reads the configuration: said once (base/log.h) */
        if (trigger != 1 && strcmp(cfg_origin(c, "async_training.trigger_parameter_sync_step"), "default") != 0)
            log_shared(LOG_WARN, "async_training.trigger_parameter_sync_step=%d is not used: async_training.mode=sync syncs the "
                     "weights after every step (trigger_parameter_sync_step=1); use async_training.mode=async or "
                     "lockstep to sync every %d steps", trigger, trigger);
    }
    const char *rm = cfg_str(c, "trainer.resume_mode");
    if (!strcmp(rm, "auto")) r->resume_auto = 1;
    else if (strcmp(rm, "disable")) return moerl_errorf("trainer.resume_mode: '%s' is not auto or disable", rm);
    if (r->n <= 0) return moerl_errorf("rollout.n must be positive, got %d", r->n);
    return rl_config_set_mode(r, m);
}

/* The optimizer's and the PPO loss's values. */
static int check_loss_values(const rl_config *r) {
    if (!(r->optim.lr >= 0) || !isfinite(r->optim.lr))
        return moerl_errorf("actor.optim.lr must be a finite number ≥ 0, got %g", (double)r->optim.lr);
    if (!(r->optim.weight_decay >= 0) || !isfinite(r->optim.weight_decay))
        return moerl_errorf("actor.optim.weight_decay must be a finite number ≥ 0, got %g", (double)r->optim.weight_decay);
    if (!(r->optim.beta1 >= 0 && r->optim.beta1 < 1) || !(r->optim.beta2 >= 0 && r->optim.beta2 < 1))
        return moerl_errorf("actor.optim.beta1/beta2 must be in [0, 1), got %g, %g", (double)r->optim.beta1, (double)r->optim.beta2);
    if (!(r->ppo.clip_ratio_low >= 0 && r->ppo.clip_ratio_low < 1))
        return moerl_errorf("actor.clip_ratio_low must be in [0, 1), got %g", (double)r->ppo.clip_ratio_low);
    if (!(r->ppo.clip_ratio_high >= 0) || !isfinite(r->ppo.clip_ratio_high))
        return moerl_errorf("actor.clip_ratio_high must be a finite number ≥ 0, got %g", (double)r->ppo.clip_ratio_high);
    if (!isfinite(r->ppo.clip_ratio_c)) return moerl_errorf("actor.clip_ratio_c must be finite");
    if (!(r->ppo.behav_imp_weight_cap > 0) || !isfinite(r->ppo.behav_imp_weight_cap))
        return moerl_errorf("actor.behav_imp_weight_cap must be a finite number > 0, got %g",
                            (double)r->ppo.behav_imp_weight_cap);
    if (!isfinite(r->entropy_coeff))
        return moerl_errorf("actor.entropy_coeff must be a finite number, got %g", (double)r->entropy_coeff);
    if (!(r->kl_loss_coef >= 0) || !isfinite(r->kl_loss_coef))
        return moerl_errorf("actor.kl_loss_coef must be a finite number ≥ 0, got %g", (double)r->kl_loss_coef);
    return MOERL_OK;
}

/* The run's lengths, counts and sampling values. */
static int check_run_values(rl_config *r) {
    if (r->top_k == -1) r->top_k = 0; /* verl/vLLM spell "off" as -1 */
    if (r->top_k < 0) return moerl_errorf("rollout.top_k must be ≥ 0 (or -1 for off), got %d", r->top_k);
    if (check_loss_values(r) != MOERL_OK) return MOERL_ERR;
    if (r->total_training_steps < 0) return moerl_errorf("trainer.total_training_steps must be ≥ 0 (0 = from total_epochs)");
    if (r->total_epochs < 1) return moerl_errorf("trainer.total_epochs must be ≥ 1, got %d", r->total_epochs);
    if (r->val_n < 0) return moerl_errorf("trainer.val_n must be ≥ 0 (0 = no eval), got %d", r->val_n);
    if (r->test_freq < -1)
        return moerl_errorf("trainer.test_freq must be ≥ -1 (-1 = no validation during training, 0 = start and end "
                            "only), got %d", r->test_freq);
    if (r->save_freq < -1) return moerl_errorf("trainer.save_freq must be ≥ -1 (-1 = never), got %d", r->save_freq);
    if (!(r->watchdog_s >= 0)) return moerl_errorf("trainer.watchdog_s must be ≥ 0 (0 = off), got %g", r->watchdog_s);
    if (!(r->temperature > 0) || !isfinite(r->temperature))
        return moerl_errorf("rollout.temperature must be a finite number > 0 for RL, got %g", r->temperature);
    if (!(r->top_p > 0 && r->top_p <= 1)) return moerl_errorf("rollout.top_p must be in (0, 1], got %g", r->top_p);
    if (r->max_response_length <= 0) return moerl_errorf("data.max_response_length must be positive");
    if (r->max_num_seqs < r->n)
        return moerl_errorf("rollout.max_num_seqs (%d) must hold at least one group of rollout.n (%d)", r->max_num_seqs, r->n);
    if (r->ppo_epochs <= 0) return moerl_errorf("actor.ppo_epochs must be positive");
    if (r->ppo_max_token_len <= 0) return moerl_errorf("actor.ppo_max_token_len_per_gpu must be positive");
    if (r->rollout_threads <= 0 || r->trainer_threads <= 0)
        return moerl_errorf("async_training.rollout_threads and trainer_threads must be positive");
    return MOERL_OK;
}

/* actor.optim.name / actor.optim.freeze_step, and the layouts 1-bit Adam refuses: its compressed
 * exchange replaces the data-parallel all-reduce of whole replicas, which FSDP (reduce-scatter of
 * shards), expert parallelism, pipeline stages and Ulysses SP (each sums its own) do not use. */
static int read_optim_name(const cfg *c, rl_config *r, const par_config *pc) {
    optim_name on;
    if (optim_name_parse(cfg_str(c, "actor.optim.name"), &on) != MOERL_OK) return MOERL_ERR;
    r->optim_name = (int)on;
    r->optim_freeze_step = cfg_int(c, "actor.optim.freeze_step");
    r->optim_var_update_interval = cfg_int(c, "actor.optim.var_update_interval");
    if (on != OPTIM_ONEBIT_ADAM) {
        for (int k = 0; k < 2; k++) {
            const char *key = k ? "actor.optim.var_update_interval" : "actor.optim.freeze_step";
            if (strcmp(cfg_origin(c, key), "default"))
                return moerl_errorf("%s is set but actor.optim.name=%s: it applies to onebit_adam only; set "
                                    "actor.optim.name=onebit_adam, or leave the key at its default", key,
                                    cfg_str(c, "actor.optim.name"));
        }
        return MOERL_OK;
    }
    if (r->optim_var_update_interval < 0)
        return moerl_errorf("actor.optim.var_update_interval=%lld: expected 0 (never) or a positive number of "
                            "optimizer steps", (long long)r->optim_var_update_interval);
    if (r->optim_var_update_interval == 1)
        log_shared(LOG_WARN, "actor.optim.var_update_interval=1 makes every optimizer step after actor.optim.freeze_step an exact "
                 "AdamW step: nothing is compressed (1-bit Adam then runs as AdamW); use ≥ 2, or 0 for 1-bit Adam as "
                 "published");
    if (r->optim_freeze_step < 1)
        return moerl_errorf("actor.optim.freeze_step=%lld: 1-bit Adam needs at least one exact AdamW step to have a "
                            "variance to freeze; use freeze_step ≥ 1", (long long)r->optim_freeze_step);
    if (r->grad_compression != GRAD_COMPRESSION_NONE)
        return moerl_errorf("actor.optim.name=onebit_adam with actor.grad_compression=%s: 1-bit Adam compresses the "
                            "momentum itself after the freeze and needs the exact gradient all-reduce before it; set "
                            "actor.grad_compression=none", grad_compression_name((grad_compression)r->grad_compression));
    const int fsdp = pc->fsdp_size == -1 ? r->n_trainer_ranks / (pc->pipeline_parallel_size > 0 ? pc->pipeline_parallel_size : 1)
                                         : pc->fsdp_size;
    if (pc->tensor_model_parallel_size > 1)
        return moerl_errorf("actor.optim.name=onebit_adam supports data-parallel trainer ranks only (whole replicas "
                            "averaging their momenta); actor.megatron.tensor_model_parallel_size=%d splits the model: set "
                            "it to 1 or use actor.optim.name=adamw", pc->tensor_model_parallel_size);
    if (fsdp > 1 || pc->expert_parallel_size > 1 || pc->pipeline_parallel_size > 1 || pc->ulysses_sequence_parallel_size > 1)
        return moerl_errorf("actor.optim.name=onebit_adam supports data-parallel trainer ranks only (whole replicas "
                            "averaging their momenta); actor.fsdp_config.fsdp_size=%d, actor.expert_parallel_size=%d, "
                            "actor.pipeline_parallel_size=%d, actor.ulysses_sequence_parallel_size=%d split the model "
                            "or the sequences: set them to 1 or use actor.optim.name=adamw",
                            fsdp, pc->expert_parallel_size, pc->pipeline_parallel_size, pc->ulysses_sequence_parallel_size);
    return MOERL_OK;
}

int rl_check_optim_keys(const cfg *c, int n_trainer_ranks, const par_config *pc) {
    rl_config r = {.n_trainer_ranks = n_trainer_ranks};
    grad_compression gc;
    if (grad_compression_parse(cfg_str(c, "actor.grad_compression"), &gc) != MOERL_OK) return MOERL_ERR;
    r.grad_compression = (int)gc;
    return read_optim_name(c, &r, pc);
}

/* actor.clip_ratio (verl's symmetric PPO ε): the ε of each side whose own key is not given — verl's
 * compute_policy_loss takes clip_ratio_low/high when set and clip_ratio otherwise, so DAPO's
 * `clip_ratio=0.2 clip_ratio_high=0.28` means 0.2 below and 0.28 above. */
static int read_clip_ratio(const cfg *c, rl_config *r) {
    if (!strcmp(cfg_origin(c, "actor.clip_ratio"), "default")) return MOERL_OK;
    const float e = (float)cfg_float(c, "actor.clip_ratio");
    if (!strcmp(cfg_origin(c, "actor.clip_ratio_low"), "default")) r->ppo.clip_ratio_low = e;
    if (!strcmp(cfg_origin(c, "actor.clip_ratio_high"), "default")) r->ppo.clip_ratio_high = e;
    return MOERL_OK;
}

/* rollout.n = 1 with a group estimator: a group of one has no baseline. As verl
 * (compute_grpo_outcome_advantage, compute_rloo_outcome_advantage: a singleton group has mean 0, std 1),
 * the advantage is the response's raw score: REINFORCE without a baseline, which learns only from
 * nonzero rewards. reinforce_plus_plus_baseline whitens over the batch (a batch baseline): no warning. */
static void warn_group_of_one(const rl_config *r, const char *est) {
    if (r->n != 1 || r->adv_estimator == RL_ADV_REINFORCE_PP_BASELINE) return;
    log_shared(LOG_WARN, "rollout.n=1 with algorithm.adv_estimator=%s: a group of one response has no group baseline, so its "
             "advantage is its raw score (verl's rule: a lone response's group has mean 0 and std 1): REINFORCE "
             "without a baseline, where a reward of 0 gives no gradient at all (every step's actor/pg_loss is 0 while "
             "no response scores); use rollout.n ≥ 2 for %s's group baseline, or algorithm.adv_estimator="
             "reinforce_plus_plus_baseline (whitened over the batch)", est, est);
}

/* A key that only acts when a switch enables it: the key, its declared type ('s' string, 'b' bool,
 * 'i' int, 'f' float), the switch as a user would set it, and whether r has it on.
 * (algorithm.rollout_correction.rollout_rs_threshold without rollout_rs is an error already: rollout_rs.c.) */
typedef struct {
    const char *key;
    char type;
    const char *needs;
    int on;
} rl_dependent_key;

/* k's value as text ("k3+", "0.5", "true") into buf; *is_default when it equals the declared default. */
static void value_text(const cfg *c, const cfg *defaults, const rl_dependent_key *k, char *buf, size_t cap,
                       int *is_default) {
    switch (k->type) {
    case 's':
        snprintf(buf, cap, "%s", cfg_str(c, k->key));
        *is_default = !strcmp(cfg_str(c, k->key), cfg_str(defaults, k->key));
        break;
    case 'b':
        snprintf(buf, cap, "%s", cfg_bool(c, k->key) ? "true" : "false");
        *is_default = cfg_bool(c, k->key) == cfg_bool(defaults, k->key);
        break;
    case 'i':
        snprintf(buf, cap, "%lld", (long long)cfg_int(c, k->key));
        *is_default = cfg_int(c, k->key) == cfg_int(defaults, k->key);
        break;
    default:
        snprintf(buf, cap, "%g", cfg_float(c, k->key));
        *is_default = cfg_float(c, k->key) == cfg_float(defaults, k->key);
    }
}

int rl_warn_ignored_keys(const cfg *c, const rl_config *r) {
    const rl_dependent_key keys[] = {
        {"actor.kl_loss_type", 's', "actor.use_kl_loss=true", r->use_kl_loss},
        {"actor.kl_loss_coef", 'f', "actor.use_kl_loss=true", r->use_kl_loss},
        {"algorithm.kl_penalty", 's', "algorithm.use_kl_in_reward=true", r->use_kl_in_reward},
        {"algorithm.kl_ctrl.type", 's', "algorithm.use_kl_in_reward=true", r->use_kl_in_reward},
        {"algorithm.kl_ctrl.kl_coef", 'f', "algorithm.use_kl_in_reward=true", r->use_kl_in_reward},
        {"algorithm.kl_ctrl.target_kl", 'f', "algorithm.use_kl_in_reward=true and algorithm.kl_ctrl.type=adaptive",
          r->use_kl_in_reward && r->kl_ctrl.adaptive},
        {"algorithm.kl_ctrl.horizon", 'f', "algorithm.use_kl_in_reward=true and algorithm.kl_ctrl.type=adaptive",
          r->use_kl_in_reward && r->kl_ctrl.adaptive},
        {"actor.clip_ratio_c", 'f', "actor.policy_loss.loss_mode=vanilla (the dual clip; GSPO has none)",
          r->loss_mode != POLICY_LOSS_GSPO},
        {"actor.behav_imp_weight_cap", 'f', "actor.use_decoupled_loss=true", r->ppo.decoupled},
        {"algorithm.rollout_correction.rollout_is_threshold", 'f', "algorithm.rollout_correction.rollout_is=token or sequence",
          r->rollout_is != ROLLOUT_IS_NONE},
        {"reward_model.overlong_buffer.len", 'i', "reward_model.overlong_buffer.enable=true", r->overlong_enable},
        {"reward_model.overlong_buffer.penalty_factor", 'f', "reward_model.overlong_buffer.enable=true",
          r->overlong_enable},
        {"algorithm.filter_groups.max_num_gen_batches", 'i', "algorithm.filter_groups.enable=true", r->filter_groups},
        {"algorithm.norm_adv_by_std_in_grpo", 'b', "algorithm.adv_estimator=grpo", r->adv_estimator == RL_ADV_GRPO},
        {"actor.loss_scale_factor", 'f', "actor.loss_agg_mode=seq-mean-token-sum-norm",
          r->loss_agg == LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM},
        {"actor.grad_compression_warmup_steps", 'i', "actor.grad_compression=onebit or threshold",
          r->grad_compression != GRAD_COMPRESSION_NONE},
        {"actor.grad_compression_chunk", 'i', "actor.grad_compression=onebit",
          r->grad_compression == GRAD_COMPRESSION_ONEBIT},
    };
    cfg *defaults = cfg_new();
    rl_def_keys(defaults);
    int n = 0; /* every rank reads the configuration: log_shared says it once */
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const rl_dependent_key *k = &keys[i];
        if (!strcmp(cfg_origin(c, k->key), "default") || k->on) continue;
        char v[128];
        int is_default = 0;
        value_text(c, defaults, k, v, sizeof v, &is_default);
        if (is_default) continue; /* a verl config spelling out the default: nothing is lost */
        n++;
        log_shared(LOG_WARN, "%s=%s (%s) has no effect: it applies only with %s; set that, or drop the key", k->key, v,
                     cfg_origin(c, k->key), k->needs);
    }
    cfg_free(defaults);
    return n;
}

int rl_read_config(const cfg *c, rl_config *r) {
    memset(r, 0, sizeof *r);
    if (read_rollout_keys(c, r) != MOERL_OK) return MOERL_ERR;
    read_actor_trainer_keys(c, r);
    if (read_clip_ratio(c, r) != MOERL_OK) return MOERL_ERR;
    if (metrics_read_logger_key(c, "trainer.logger", &r->metrics_loggers) != MOERL_OK) return MOERL_ERR;
    if (read_modes(c, r) != MOERL_OK || check_run_values(r) != MOERL_OK) return MOERL_ERR;
    if (rl_read_algorithm_keys(c, r) != MOERL_OK || read_router_replay(c, r) != MOERL_OK) return MOERL_ERR;
    warn_group_of_one(r, cfg_str(c, "algorithm.adv_estimator"));
    rl_warn_ignored_keys(c, r);
    if (reward_read_config(c, &r->reward) != MOERL_OK) return MOERL_ERR;
    if (multi_turn_read_config(c, &r->multi_turn) != MOERL_OK) return MOERL_ERR;
    /* the layout keys, refused before any folder or model exists (par_check against the ranks and the
     * model once the model is known) */
    const int64_t sp = cfg_int(c, "actor.ulysses_sequence_parallel_size");
    if (r->loss_mode == POLICY_LOSS_GSPO && sp > 1)
        return moerl_errorf("actor.policy_loss.loss_mode=gspo with actor.ulysses_sequence_parallel_size=%lld: GSPO's "
                            "sequence ratio needs every token of a sequence on one rank, and Ulysses SP splits each "
                            "sequence over its ranks; set ulysses_sequence_parallel_size=1 or loss_mode=vanilla",
                            (long long)sp);
    par_layout L;
    if (par_read_layout(c, r->grad_compression, &L) != MOERL_OK) return MOERL_ERR;
    r->n_trainer_ranks = L.n_trainer_ranks;
    if (read_optim_name(c, r, &L.par) != MOERL_OK) return MOERL_ERR;
    r->sync_bucket_mb = L.sync_bucket_mb;
    r->grad_bucket_mb = L.grad_bucket_mb;
    r->par = L.par;
    /* the 1F1B guard (each stage needs ≥ pp micro-batches) is rl_check_update_sizes', before the warm
     * start: a data-parallel pipeline gets whole GRPO groups (rollout.n sequences) or none, which
     * mini-batch · n / dp sequences per shard does not model (1 group of 3 over 2 pipelines: 3 or 0) */
    return MOERL_OK;
}
