/* Writes the binary/generated part of the seed corpora under fuzz/corpus/ (run from the repository
 * root after `make`; see fuzz/README.md):
 *   cc -std=c11 -D_GNU_SOURCE -Isrc -Ifuzz -o build/gen_seeds fuzz/gen_seeds.c build/libmoerl.a \
 *      $(pkg-config --libs openblas) -lyaml -ljansson -lm -lpthread -fopenmp && build/gen_seeds
 * Seeds: safetensors files (every dtype, scalar, empty, metadata), a sharded checkpoint's index
 * and config.json, group and train messages, trainer_state.json. Text seeds (YAML, JSONL) are
 * committed as they are. */
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rl/state.h"
#include "rl/wire.h"

static void put(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "fuzz/corpus/%s", dir);
    moerl_mkdirs(path);
    snprintf(path, sizeof path, "fuzz/corpus/%s/%s", dir, name);
    if (moerl_write_file_atomic(path, p, n) != MOERL_OK) {
        fprintf(stderr, "%s\n", moerl_last_error());
        exit(1);
    }
}

static void copy_file(const char *from, const char *dir, const char *name) {
    char *t;
    size_t n;
    if (moerl_read_file(from, &t, &n) != MOERL_OK) {
        fprintf(stderr, "%s\n", moerl_last_error());
        exit(1);
    }
    put(dir, name, t, n);
    free(t);
}

/* a raw safetensors image: 8-byte length + header + data */
static void put_st(const char *name, const char *hdr, const void *data, size_t n) {
    size_t h = strlen(hdr);
    uint64_t N = h;
    unsigned char *b = malloc(8 + h + n + 1);
    memcpy(b, &N, 8);
    memcpy(b + 8, hdr, h);
    if (n) memcpy(b + 8 + h, data, n);
    put("safetensors", name, b, 8 + h + n);
    free(b);
}

static rl_group *make_group(int64_t uid, int n, int plen, int nout) {
    rl_group *g = calloc(1, sizeof *g);
    g->uid = uid;
    g->row = (int)(uid % 96);
    g->epoch = (int)(uid / 96);
    g->start_version = 3;
    g->n = g->n_done = n;
    g->prompt.ids = malloc((size_t)plen * 4);
    g->prompt.n = g->prompt.cap = plen;
    for (int i = 0; i < plen; i++) g->prompt.ids[i] = 256 + i % 3;
    g->reqs = calloc((size_t)n, sizeof(gen_request));
    for (int j = 0; j < n; j++) {
        gen_request *r = &g->reqs[j];
        int k = nout + j;
        r->n_out = k;
        r->finish = j % 2 ? FINISH_LENGTH : FINISH_STOP;
        r->n_interruptions = j;
        r->out_tokens = malloc((size_t)(k ? k : 1) * 4);
        r->out_logprobs = malloc((size_t)(k ? k : 1) * 4);
        r->out_versions = malloc((size_t)(k ? k : 1) * 4);
        for (int t = 0; t < k; t++) {
            r->out_tokens[t] = 48 + t;
            r->out_logprobs[t] = -0.25f * (float)t;
            r->out_versions[t] = 3 + t / 2;
        }
    }
    return g;
}

int main(void) {
    /* --- safetensors */
    float f32[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    put_st("f32.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", f32, 24);
    unsigned char mixed[8 + 4 + 2 + 2 + 1] = {0};
    for (size_t i = 0; i < sizeof mixed; i++) mixed[i] = (unsigned char)(i * 37);
    put_st("mixed.safetensors",
           "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]},"
           "\"c\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[12,14]},"
           "\"d\":{\"dtype\":\"I16\",\"shape\":[1,1],\"data_offsets\":[14,16]},"
           "\"e\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[16,17]},"
           "\"z\":{\"dtype\":\"U8\",\"shape\":[0,4],\"data_offsets\":[17,17]}}",
           mixed, sizeof mixed);
    put_st("empty.safetensors", "{}", NULL, 0);
    put_st("padded.safetensors", "{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}      ", f32, 8);

    /* --- a sharded checkpoint (same tiny model as fuzz_st_index.c) and its config.json */
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
    moe_model m;
    if (model_init(&m, &c) != MOERL_OK) return 1;
    model_init_random(&m, 1);
    const char *dir = "build/gen_seeds_ckpt";
    if (model_save_hf(&m, dir, 0, (uint64_t)m.n_params) != MOERL_OK) {
        fprintf(stderr, "%s\n", moerl_last_error());
        return 1;
    }
    copy_file("build/gen_seeds_ckpt/model.safetensors.index.json", "st_index", "index.json");
    for (int n = 2; n < 10; n++) { /* the first shard, whatever the count */
        char p[256];
        snprintf(p, sizeof p, "%s/model-00001-of-%05d.safetensors", dir, n);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        fclose(f);
        copy_file(p, "safetensors", "shard1.safetensors");
    }
    copy_file("build/gen_seeds_ckpt/config.json", "hf_config", "tiny.json");
    c.tie_word_embeddings = 1;
    c.n_mlp_only_layers = 1;
    c.mlp_only_layers[0] = 0;
    moe_config_save(&c, "build/gen_seeds_ckpt/config2.json");
    copy_file("build/gen_seeds_ckpt/config2.json", "hf_config", "tied_dense.json");
    model_free(&m);

    /* --- wire */
    rl_group *g1 = make_group(200, 2, 5, 3), *g2 = make_group(7, 1, 1, 0), *g3 = make_group(95, 3, 2, 1);
    /* g3 carries the rewards a rollout rank's reward pool computed (wire format 2): a score, an extra
     * field on response 1, a pred on response 0 */
    g3->rewards = calloc(3, sizeof(reward_result));
    for (int j = 0; j < 3; j++) g3->rewards[j].score = 0.5 * j;
    g3->rewards[0].pred = xstrdup("42");
    g3->rewards[1].n_extra = 1;
    g3->rewards[1].extra_keys = malloc(sizeof(char *));
    g3->rewards[1].extra_keys[0] = xstrdup("acc");
    g3->rewards[1].extra_vals = malloc(sizeof(double));
    g3->rewards[1].extra_vals[0] = 1.0;
    /* g4 is a multi-turn group (wire format 3): response 0 with an inserted tool turn in its out_mask,
     * response 1 without a mask, and the trajectories' records */
    rl_group *g4 = make_group(321, 2, 3, 6);
    g4->reqs[0].out_mask = malloc(6);
    for (int t = 0; t < 6; t++) g4->reqs[0].out_mask[t] = !(t == 2 || t == 3);
    g4->traj = calloc(2, sizeof(agent_traj));
    g4->traj[0] = (agent_traj){.turns = 2, .tool_calls = 1, .env_done = 1, .has_env_reward = 1, .env_reward = 1.0};
    g4->traj[1] = (agent_traj){.turns = 1};
    void *buf;
    size_t len;
    if (rl_group_encode(g4, &buf, &len) != MOERL_OK) return 1;
    put("wire", "group_multi_turn.bin", buf, len);
    free(buf);
    rl_group_free(g4);
    if (rl_group_encode(g1, &buf, &len) != MOERL_OK) return 1;
    put("wire", "group.bin", buf, len);
    free(buf);
    if (rl_group_encode(g2, &buf, &len) != MOERL_OK) return 1;
    put("wire", "group_empty_response.bin", buf, len);
    free(buf);
    if (rl_group_encode(g3, &buf, &len) != MOERL_OK) return 1;
    put("wire", "group_scored.bin", buf, len);
    free(buf);
    rl_minibatch mbs[2] = {{.n_groups = 2, .resp_tokens = 17, .tokens = 40}, {.n_groups = 1, .resp_tokens = 9, .tokens = 15}};
    rl_group *gs[3] = {g1, g2, g3};
    if (rl_train_msg_encode(RL_TRAIN_CMD_STEP, 4, 11, mbs, 2, gs, &buf, &len) != MOERL_OK) return 1;
    put("wire", "train.bin", buf, len);
    free(buf);
    if (rl_train_msg_encode(RL_TRAIN_CMD_STOP, 9, 30, NULL, 0, NULL, &buf, &len) != MOERL_OK) return 1;
    put("wire", "train_stop.bin", buf, len);
    free(buf);
    rl_group_free(g1);
    rl_group_free(g2);
    rl_group_free(g3);

    /* --- trainer_state.json (n_rows 96, seed 1: fuzz_state.c's expectation) */
    int64_t u[3] = {13, 96 + 40, 2 * 96 - 1};
    rl_state s = {.version = 3, .trainer_step = 12, .optimizer_step = 12, .consumed_prompts = 48, .feed_epoch = 1,
                  .feed_pos = 52, .seed = 1, .n_rows = 96, .data_fingerprint = 0x9a3b0c2d4e5f6071ULL,
                  .unconsumed_started = u, .n_unconsumed = 3, .samples_log_bytes = 9001};
    char *t = rl_state_to_json(&s);
    put("state", "state.json", t, strlen(t));
    free(t);
    s.n_unconsumed = 0;
    s.seed = 0xfedcba9876543210ULL;
    t = rl_state_to_json(&s);
    put("state", "state_big_seed.json", t, strlen(t));
    free(t);
    printf("seeds written under fuzz/corpus/\n");
    return 0;
}
