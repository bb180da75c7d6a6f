/* Shared fixture of the RL tests: a tiny random Qwen3-MoE over moerl's byte vocabulary
 * (eos = <|im_end|>): 2 MoE layers, hidden 32, 4 heads (2 kv, head_dim 8), 4 experts top-2 of
 * width 16, 256 positions. */
#ifndef MOERL_TEST_RL_FIXTURE_H
#define MOERL_TEST_RL_FIXTURE_H

#include <string.h>

#include "base/common.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "rl/rl.h"

static inline void rl_tiny_model(moe_model *m, uint64_t seed, float aux_coef) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = TOK_VOCAB_SIZE; c.hidden_size = 32; c.intermediate_size = 48; c.moe_intermediate_size = 16;
    c.num_hidden_layers = 2; c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 8;
    c.num_experts = 4; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1; c.norm_topk_prob = 1;
    c.tie_word_embeddings = 0; c.max_position_embeddings = 256; c.rms_norm_eps = 1e-6f; c.rope_theta = 1e4f;
    c.router_aux_loss_coef = aux_coef; c.initializer_range = 0.02f;
    c.bos_token_id = TOK_BOS; c.eos_token_id = TOK_EOS;
    MOERL_ASSERT(model_init(m, &c) == MOERL_OK);
    model_init_random(m, seed);
}

/* The RL tests' base configuration (each test overrides what it is about): groups of 4, responses
 * up to 10 tokens, mini-batches of 2 prompts, PPO clip 0.2/0.28 with dual clip 3, AdamW at lr 0,
 * token-mean GRPO anchored on the behaviour policy, lockstep, staleness 0.5, partial rollout. */
static inline rl_config rl_test_config(void) {
    rl_config c;
    memset(&c, 0, sizeof c);
    c.n = 4;
    c.temperature = 1.0f;
    c.top_p = 1.0f;
    c.max_response_length = 10;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 256;
    c.ppo_mini_batch_size = 2;
    c.ppo_epochs = 1;
    c.ppo.clip_ratio_low = 0.2f;
    c.ppo.clip_ratio_high = 0.28f;
    c.ppo.clip_ratio_c = 3.0f;
    c.ppo.behav_imp_weight_cap = 2.0f;
    c.optim.beta1 = 0.9f;
    c.optim.beta2 = 0.99f;
    c.optim.eps = 1e-8f;
    c.optim.max_grad_norm = 1.0f;
    c.ppo_max_token_len = 4096;
    c.norm_adv_by_std = 1;
    c.rollout_is_threshold = 2.0f;
    c.staleness_threshold = 0.5;
    c.trigger_parameter_sync_step = 1;
    c.require_batches = 1;
    c.partial_rollout = 1;
    c.mode = RL_MODE_LOCKSTEP;
    c.rollout_threads = c.trainer_threads = 1;
    c.total_epochs = 1;
    c.seed = 3;
    return c;
}

#endif
