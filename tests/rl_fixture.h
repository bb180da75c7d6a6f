/* Shared fixture of the RL tests (built by the real config readers, tests/fixture.h): a tiny random
 * Qwen3-MoE over moerl's byte vocabulary (eos = <|im_end|>): 2 MoE layers, hidden 32, 4 heads (2 kv,
 * head_dim 8), 4 experts top-2 of width 16, 256 positions. */
#ifndef MOERL_TEST_RL_FIXTURE_H
#define MOERL_TEST_RL_FIXTURE_H

#include <string.h>

#include "base/common.h"
#include "data/tokenizer.h"
#include "fixture.h"
#include "model/model.h"
#include "rl/rl.h"

static inline void rl_tiny_model(moe_model *m, uint64_t seed, float aux_coef) {
    char aux[64];
    snprintf(aux, sizeof aux, "model.router_aux_loss_coef=%.9g", (double)aux_coef);
    const char *kv[] = {"model.hidden_size=32", "model.intermediate_size=48", "model.moe_intermediate_size=16",
                        "model.num_hidden_layers=2", "model.num_attention_heads=4", "model.num_key_value_heads=2",
                        "model.head_dim=8", "model.num_experts=4", "model.num_experts_per_tok=2",
                        "model.max_position_embeddings=256", aux};
    moe_config c = fx_model_config(kv, FX_N(kv));
    MOERL_ASSERT(model_init(m, &c) == MOERL_OK);
    model_init_random(m, seed);
}

/* The RL tests' base configuration (each test overrides what it is about): groups of 4, responses
 * up to 10 tokens, mini-batches of 2 prompts, PPO clip 0.2/0.28 with dual clip 3, AdamW at lr 0,
 * token-mean GRPO anchored on the behaviour policy, lockstep, staleness 0.5, partial rollout; no
 * output folder, held-out evaluation, resume, watchdog or divergence stop. */
static inline rl_config rl_test_config(void) {
    const char *kv[] = {"rollout.n=4", "data.max_response_length=10", "rollout.max_num_seqs=16",
                        "rollout.max_num_batched_tokens=256", "actor.ppo_mini_batch_size=2", "actor.optim.lr=0",
                        "async_training.staleness_threshold=0.5", "async_training.mode=lockstep", "trainer.seed=3",
                        "trainer.default_local_dir=", "trainer.val_n=0", "trainer.test_freq=0",
                        "trainer.resume_mode=disable", "trainer.watchdog_s=0",
                        "trainer.max_consecutive_skipped_steps=0", "algorithm.filter_groups.max_num_gen_batches=0",
                        "actor.clip_ratio_high=0.28", "actor.kl_loss_coef=0", "reward_model.overlong_buffer.penalty_factor=0"};
    return fx_rl_config(kv, FX_N(kv));
}

/* The staleness budget a job derives from c (rl_config_budget), for the tests that build a rollouter
 * themselves; valid until the next call. A config the budget refuses fails the test at once. */
static inline const staleness_budget *fx_budget(const rl_config *c) {
    static staleness_budget b;
    MOERL_ASSERT(rl_config_budget(c, &b) == MOERL_OK);
    return &b;
}

#endif
