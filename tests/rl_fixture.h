/* Shared fixture of the RL tests: a tiny random Qwen3-MoE over moerl's byte vocabulary
 * (eos = <|im_end|>): 2 MoE layers, hidden 32, 4 heads (2 kv, head_dim 8), 4 experts top-2 of
 * width 16, 256 positions. */
#ifndef MOERL_TEST_RL_FIXTURE_H
#define MOERL_TEST_RL_FIXTURE_H

#include <string.h>

#include "base/common.h"
#include "data/tokenizer.h"
#include "model/model.h"

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

#endif
