/* Shared fixture of the model-parallel tests (test_dist_ep.c, test_dist_sp.c): a small random
 * Qwen3-MoE, a fixed global batch of packed sequences, the token-mean cross-entropy callback for
 * train_accumulate, the global aux load-balancing loss, and the one-rank reference: K AdamW steps
 * of train_accumulate over the whole batch in one micro-batch.
 * Loss per step: CE = −Σ_{response targets} logp / G (G = the global number of response targets),
 * plus aux_coef · HF's load-balancing loss over the WHOLE global batch (router counts summed over
 * every rank by compute_router_counts + a sum, as the RL trainer does). */
#ifndef MOERL_TEST_PAR_FIXTURE_H
#define MOERL_TEST_PAR_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "fixture.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/train.h"

#define FX_K_STEPS 4
#define FX_N_SEQ 8
#define FX_MAX_TOKENS 128
#define FX_AUX_COEF 0.05f
static const int fx_seq_len[FX_N_SEQ] = {11, 6, 9, 14, 5, 8, 12, 10};
static const int fx_prompt_len[FX_N_SEQ] = {3, 2, 4, 5, 1, 3, 4, 2};

/* Two MoE layers (E experts, top-K) and a dense one; nh = 4 query heads over nkv key/value heads. */
static moe_config fx_config(int E, int K, int nkv) {
    char kvh[64], ne[64], k[64];
    snprintf(kvh, sizeof kvh, "model.num_key_value_heads=%d", nkv);
    snprintf(ne, sizeof ne, "model.num_experts=%d", E);
    snprintf(k, sizeof k, "model.num_experts_per_tok=%d", K);
    const char *kv[] = {"model.num_hidden_layers=3", kvh, ne, k, "model.mlp_only_layers=[2]",
                        "model.router_aux_loss_coef=0.05", /* FX_AUX_COEF */
                        "model.initializer_range=0.1"}; /* larger than HF's 0.02: routing then differs clearly
                                                           between tokens */
    return fx_small_config(kv, FX_N(kv));
}

typedef struct {
    int tok[FX_N_SEQ * 16];
    train_seq seqs[FX_N_SEQ];
    int n_tokens, n_response;
} fx_batch;

static void fx_make_batch(fx_batch *b) {
    rng_state r;
    rng_seed(&r, 2024);
    int n = 0;
    b->n_response = 0;
    for (int s = 0; s < FX_N_SEQ; s++) {
        for (int t = 0; t < fx_seq_len[s]; t++) b->tok[n + t] = (int)rng_below(&r, 64);
        b->seqs[s].tokens = b->tok + n;
        b->seqs[s].len = fx_seq_len[s];
        b->seqs[s].resp_start = fx_prompt_len[s];
        b->n_response += fx_seq_len[s] - fx_prompt_len[s];
        n += fx_seq_len[s];
    }
    b->n_tokens = n;
}

/* Sequences of data shard `rank` among P: longest first onto the least loaded shard (ties to the
 * lower one); writes them in batch order into out and returns their count. */
static int fx_split(const fx_batch *b, int rank, int P, train_seq *out) {
    int order[FX_N_SEQ], load[64] = {0}, owner[FX_N_SEQ];
    for (int s = 0; s < FX_N_SEQ; s++) order[s] = s;
    for (int i = 1; i < FX_N_SEQ; i++)
        for (int j = i; j > 0 && fx_seq_len[order[j]] > fx_seq_len[order[j - 1]]; j--) {
            const int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < FX_N_SEQ; i++) {
        int best = 0;
        for (int p = 1; p < P; p++)
            if (load[p] < load[best]) best = p;
        owner[order[i]] = best;
        load[best] += fx_seq_len[order[i]];
    }
    int k = 0;
    for (int s = 0; s < FX_N_SEQ; s++)
        if (owner[s] == rank) out[k++] = b->seqs[s];
    return k;
}

/* Token-mean CE over the global batch's G response targets (train_accumulate's callback). */
typedef struct {
    float inv_g;
    double ce;
} fx_ce_ctx;

static double fx_ce(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                    float *dentropy) {
    (void)seq_of;
    (void)dentropy;
    fx_ce_ctx *c = ctx;
    double l = 0;
    for (int n = 0; n < a->N; n++)
        if (resp_index[n] >= 0) {
            l -= a->logp[n] * c->inv_g;
            dlogp[n] = -c->inv_g;
        }
    c->ce += l;
    return l;
}

static adamw_config fx_opt(void) {
    adamw_config oc = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                       .max_grad_norm = 1.0f};
    return oc;
}

/* The global aux value from the summed counts and router-probability sums over L_moe·N_total rows. */
static float fx_aux_value(const double *counts, const double *psum, int E, int64_t rows) {
    float c[64], p[64];
    for (int e = 0; e < E; e++) {
        c[e] = (float)counts[e];
        p[e] = (float)psum[e];
    }
    return moe_aux_loss(c, p, E, rows);
}

/* One rank, the whole batch in one micro-batch, K AdamW steps from model_init_random(seed 4242):
 * ce[k], aux[k] per step; the trained model in *m. */
static void fx_reference(const moe_config *c, const fx_batch *b, float *ce, float *aux, moe_model *m) {
    MOERL_ASSERT(model_init(m, c) == MOERL_OK);
    model_init_random(m, 4242);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, FX_MAX_TOKENS) == MOERL_OK);
    adamw_state os;
    adamw_init(&os, m, fx_opt());
    const int E = c->num_experts;
    for (int k = 0; k < FX_K_STEPS; k++) {
        double counts[64] = {0}, psum[64] = {0};
        MOERL_ASSERT(compute_router_counts(m, &a, b->seqs, FX_N_SEQ, FX_MAX_TOKENS, counts) == MOERL_OK);
        fx_ce_ctx cc = {1.0f / (float)b->n_response, 0};
        train_step_opts o = {.max_tokens = FX_MAX_TOKENS, .temperature = 1.0f, .aux_coef = FX_AUX_COEF,
                             .total_tokens = b->n_tokens, .aux_counts = counts, .aux_psum_out = psum};
        train_step_out so;
        MOERL_ASSERT(train_accumulate(m, &a, b->seqs, FX_N_SEQ, &o, fx_ce, &cc, &so) == MOERL_OK);
        ce[k] = (float)cc.ce;
        aux[k] = fx_aux_value(counts, psum, E, (int64_t)a.n_moe_layers * b->n_tokens);
        double gn;
        MOERL_ASSERT(adamw_step(&os, m, os.cfg.lr, ce[k], &gn) == 1);
    }
    adamw_free(&os);
    model_acts_free(&a);
}

static uint64_t fx_hash(const float *x, size_t n) {
    const unsigned char *p = (const unsigned char *)x;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

#endif
