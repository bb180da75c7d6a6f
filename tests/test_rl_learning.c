/* Learning goes the right way: a tiny task whose reward depends on one token choice (the answer to
 * "Compute 3+4." is the single token '7'), a tiny Qwen3-MoE warm-started by SFT until it answers '7'
 * with probability about 0.1–0.5, then the whole main job (rl_run) for a few steps at lr > 0. The
 * probability of the rewarded first token must rise, for every loss aggregation mode, every advantage
 * estimator, the decoupled loss, the rollout IS correction, DAPO's filtering/shaping options, and in
 * async, lockstep and sync mode. A flipped advantage sign (or a flipped loss gradient) makes it fall:
 * checked by hand when this test was written, and the reason the test exists.
 * Also: the run is refused with top-k sampling (the behaviour policy would not be the sampler's). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/forward.h"
#include "model/model.h"
#include "rl/rl.h"
#include "rl_fixture.h"
#include "test.h"
#include "rl/sft.h"
#include "train/train.h"

static char g_dir[4096];
static dataset g_train, g_sft;

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    MOERL_ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

static void setup_data(void) {
    const char *base = getenv("MOERL_TESTDATA");
    if (!base || !base[0]) base = "/tmp";
    MOERL_ASSERT(moerl_mkdirs(base) == MOERL_OK);
    snprintf(g_dir, sizeof g_dir, "%s/test_rl_learning_XXXXXX", base);
    MOERL_ASSERT(mkdtemp(g_dir) != NULL);
    const char *row = "{\"data_source\": \"arith\", \"prompt\": [{\"role\": \"user\", \"content\": \"Compute 3+4.\"}], "
                      "\"reward_model\": {\"style\": \"rule\", \"ground_truth\": \"7\"}, \"response\": \"7\"}\n";
    char *text = xmalloc(strlen(row) * 64 + 1), p[4200];
    text[0] = 0;
    for (int i = 0; i < 64; i++) strcat(text, row);
    snprintf(p, sizeof p, "%s/train.jsonl", g_dir);
    write_file(p, text);
    CHECK(dataset_load(&g_train, p) == MOERL_OK, "dataset: %s", moerl_last_error());
    /* SFT rows: the answer '7' half the time and '8' otherwise, so the warm start lands in between */
    const char *row8 = "{\"data_source\": \"arith\", \"prompt\": [{\"role\": \"user\", \"content\": \"Compute 3+4.\"}], "
                       "\"reward_model\": {\"style\": \"rule\", \"ground_truth\": \"7\"}, \"response\": \"8\"}\n";
    text[0] = 0;
    for (int i = 0; i < 16; i++) strcat(text, i % 4 == 0 ? row : row8);
    snprintf(p, sizeof p, "%s/sft.jsonl", g_dir);
    write_file(p, text);
    CHECK(dataset_load(&g_sft, p) == MOERL_OK, "dataset: %s", moerl_last_error());
    free(text);
}


/* log P(first response token = '7' | the prompt), temperature 1. */
static double p_seven(const moe_model *m) {
    chat_msg msg = {(char *)"user", (char *)"Compute 3+4.", NULL};
    tok_seq s = {0};
    tok_chat_encode(&msg, 1, true, &s);
    const int plen = (int)s.n;
    tok_seq_push(&s, '7');
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, 256) == MOERL_OK);
    train_seq ts = {.tokens = s.ids, .len = (int)s.n, .resp_start = plen};
    float lp[2];
    float *out[1] = {lp};
    MOERL_ASSERT(compute_logprobs(m, &a, &ts, 1, 256, 1.0f, out) == MOERL_OK);
    model_acts_free(&a);
    tok_seq_free(&s);
    return exp(lp[0]);
}

static rl_config base_config(const char *dir) {
    rl_config c = rl_test_config();
    c.n = 8;
    c.max_response_length = 3;
    c.max_num_seqs = 64;
    c.max_num_batched_tokens = 512;
    c.ppo_mini_batch_size = 4;
    c.optim.lr = 3e-3f;
    c.ppo_max_token_len = 64; /* several micro-batches per mini-batch */
    c.total_training_steps = 6;
    c.seed = 5;
    c.save_freq = -1;
    c.val_n = 0;
    snprintf(c.out_dir, sizeof c.out_dir, "%s", dir);
    return c;
}

typedef struct {
    const char *name;
    void (*set)(rl_config *c);
} variant;

static void v_token_mean(rl_config *c) { c->loss_agg = LOSS_AGG_TOKEN_MEAN; }
static void v_seq_sum(rl_config *c) { c->loss_agg = LOSS_AGG_SEQ_MEAN_TOKEN_SUM; }
static void v_seq_mean(rl_config *c) { c->loss_agg = LOSS_AGG_SEQ_MEAN_TOKEN_MEAN; }
static void v_seq_sum_norm(rl_config *c) {
    c->loss_agg = LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
    c->norm_adv_by_std = 0; /* Dr. GRPO */
}
static void v_rloo(rl_config *c) { c->adv_estimator = RL_ADV_RLOO; }
static void v_rpp(rl_config *c) { c->adv_estimator = RL_ADV_REINFORCE_PP_BASELINE; }
static void v_decoupled(rl_config *c) {
    c->ppo.decoupled = 1;
    c->mode = RL_MODE_ASYNC;
}
static void v_rollout_is(rl_config *c) {
    c->recompute_old = 1;
    c->rollout_is = ROLLOUT_IS_SEQUENCE;
    c->mode = RL_MODE_ASYNC;
}
static void v_dapo(rl_config *c) {
    c->filter_groups = 1;
    c->overlong_filter = 1;
    c->overlong_enable = 1;
    c->overlong_len = 1;
    c->overlong_penalty_factor = 0.5;
}
static void v_async(rl_config *c) { c->mode = RL_MODE_ASYNC; }
static void v_sync(rl_config *c) {
    c->mode = RL_MODE_SYNC;
    c->staleness_threshold = 0;
    c->partial_rollout = 0;
}

int main(void) {
    setup_data();
    moe_model m0;
    rl_tiny_model(&m0, 11, 0.001f);
    const double p_init = p_seven(&m0);
    /* warm start: SFT until '7' is neither rare nor certain */
    sft_opts so = {.batch_size = 16, .max_tokens = 512, .total_epochs = 1, .total_steps = 40,
                   .optim = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .max_grad_norm = 1.0f},
                   .lr_scheduler = "constant", .val_n = 0, .max_response_length = 3, .seed = 1, .label = "sft"};
    CHECK(sft_train(&m0, &g_sft, &g_sft, &so, NULL, NULL) == MOERL_OK, "sft: %s", moerl_last_error());
    const double p0 = p_seven(&m0);
    printf("P('7') at random init %.4f, after the SFT warm start %.4f\n", p_init, p0);
    CHECK(p0 > 0.05 && p0 < 0.6, "warm start lands between rare and certain: P('7') = %.4f", p0);
    const variant vs[] = {{"token-mean (lockstep)", v_token_mean},
                          {"seq-mean-token-sum", v_seq_sum},
                          {"seq-mean-token-mean", v_seq_mean},
                          {"seq-mean-token-sum-norm + Dr. GRPO", v_seq_sum_norm},
                          {"rloo", v_rloo},
                          {"reinforce_plus_plus_baseline", v_rpp},
                          {"decoupled (async)", v_decoupled},
                          {"rollout IS sequence (async)", v_rollout_is},
                          {"DAPO filter_groups + overlong", v_dapo},
                          {"async mode", v_async},
                          {"sync mode", v_sync}};
    for (size_t i = 0; i < sizeof vs / sizeof *vs; i++) {
        char dir[4300];
        snprintf(dir, sizeof dir, "%s/run%zu", g_dir, i);
        rl_config c = base_config(dir);
        vs[i].set(&c);
        moe_model m;
        MOERL_ASSERT(model_init(&m, &m0.cfg) == MOERL_OK);
        memcpy(m.params, m0.params, m0.n_params * sizeof(float));
        rl_result res;
        const int rc = rl_run(&c, &m, &g_train, &g_train, &res);
        CHECK(rc == MOERL_OK, "%s: rl_run: %s", vs[i].name, moerl_last_error());
        const double p1 = p_seven(&m);
        printf("%-36s P('7') %.4f → %.4f after %lld steps\n", vs[i].name, p0, p1, (long long)res.steps);
        /* The rewarded choice must become clearly more likely: 6 steps at lr 3e-3 move it by tens of
         * percent; a margin of 0.02 keeps sampling noise from passing a wrong sign. */
        CHECK(p1 > p0 + 0.02, "%s: P('7') did not rise: %.4f → %.4f", vs[i].name, p0, p1);
        model_free(&m);
    }
    /* truncated sampling is refused where the config is read (src/rl/config.c) */
    {
        rl_config c = base_config(g_dir);
        c.top_k = 5;
        cfg *y = cfg_new();
        rl_def_algorithm_keys(y);
        CHECK(rl_read_algorithm_keys(y, &c) == MOERL_ERR && strstr(moerl_last_error(), "rollout.top_k"),
              "top-k refused with a reason: %s", moerl_last_error());
        c.top_k = 0;
        c.top_p = 0.9f;
        CHECK(rl_read_algorithm_keys(y, &c) == MOERL_ERR && strstr(moerl_last_error(), "top_p"),
              "top-p refused: %s", moerl_last_error());
        c.top_p = 1.0f;
        CHECK(rl_read_algorithm_keys(y, &c) == MOERL_OK, "defaults accepted: %s", moerl_last_error());
        cfg_free(y);
    }
    model_free(&m0);
    dataset_free(&g_train);
    dataset_free(&g_sft);
    char cmd[4200 + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    printf("%d passed, %d failed\n", t_passed, t_failed);
    return t_failed ? 1 : 0;
}
