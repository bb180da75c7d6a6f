/* Fuzz target: model.safetensors.index.json of a sharded Hugging Face checkpoint (the index
 * parsing and cross-checks of src/model/checkpoint.c, reached through model_load_weights). A tiny
 * Qwen3-MoE is saved once in several shards to a temporary folder; each input replaces the index there and
 * the weights are loaded. The input must be refused with a message, or load (only an index that
 * maps every tensor to the shard really holding it can). */
#include "fuzz_common.h"
#include "fuzz_tmpdir.h"
#include "model/model.h"

static moe_model g_m;

static void setup(void) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 7;
    c.hidden_size = 4;
    c.intermediate_size = 4;
    c.moe_intermediate_size = 2;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 2;
    c.num_experts = 2;
    c.num_experts_per_tok = 1;
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = 1;
    c.max_position_embeddings = 16;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1e4f;
    c.router_aux_loss_coef = 0.01f;
    c.initializer_range = 0.02f;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    if (model_init(&g_m, &c) != MOERL_OK) {
        fprintf(stderr, "fuzz setup: %s\n", moerl_last_error());
        abort();
    }
    model_init_random(&g_m, 1);
    /* several shards of at most a quarter of the parameter bytes each (as fuzz/gen_seeds.c) */
    if (model_save_hf(&g_m, fuzz_tmpdir(), 0, (uint64_t)g_m.n_params) != MOERL_OK) {
        fprintf(stderr, "fuzz setup: %s\n", moerl_last_error());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_m.params) setup();
    fuzz_write("model.safetensors.index.json", data, size);
    if (model_load_weights(&g_m, fuzz_tmpdir()) != MOERL_OK) fuzz_check_error();
    return 0;
}
