/* Activation recompute (model.enable_gradient_checkpointing, actor.recompute_granularity = full |
 * selective; docs/parallelism.md "Activation recompute"): the forward's outputs, the routes it
 * records and the weight gradients are bit-identical (memcmp) to the run without recompute, on
 * every MoE execution path, on a model mixing MoE and dense layers, with routing replay (replayed
 * and native tokens mixed) and on a pipeline stage (layers [lo, hi), backward from the caller's
 * d_resid); the arena's bytes equal moerl plan's activation rows (plan_acts_bytes) for the same
 * model and tokens and shrink as documented; the keys' errors name the key and value. The
 * multi-rank layouts (FSDP, EP, Ulysses SP, the pipeline) are checked by test_dist_recompute under
 * mpirun (tests/e2e_mpi.sh). */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "base/rng.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/model_config.h"
#include "plan/plan.h"
#include "test.h"

static void tiny_config(moe_config *c, int dense_layer) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 96; c->hidden_size = 32; c->intermediate_size = 48; c->moe_intermediate_size = 16;
    c->num_hidden_layers = 3; c->num_attention_heads = 4; c->num_key_value_heads = 2; c->head_dim = 8;
    c->num_experts = 8; c->num_experts_per_tok = 2; c->decoder_sparse_step = 1; c->norm_topk_prob = 1;
    c->max_position_embeddings = 128; c->rms_norm_eps = 1e-6f; c->rope_theta = 10000; c->initializer_range = 0.2f;
    c->router_aux_loss_coef = 0.01f;
    c->bos_token_id = c->eos_token_id = -1;
    if (dense_layer >= 0) {
        c->n_mlp_only_layers = 1;
        c->mlp_only_layers[0] = dense_layer;
    }
}

typedef struct {
    int N, B;
    int tok[80], cu[4], tgt[80];
    float dlogp[80], dent[80];
    int16_t *replay; /* NULL or [N, Lm, K] */
} batch;

static void make_batch(batch *b, const moe_config *c, uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    b->N = 77;
    b->B = 3;
    b->cu[0] = 0; b->cu[1] = 30; b->cu[2] = 51; b->cu[3] = 77;
    for (int n = 0; n < b->N; n++) {
        b->tok[n] = (int)rng_below(&r, (uint64_t)c->vocab_size);
        b->tgt[n] = n % 11 == 0 ? -1 : (int)rng_below(&r, (uint64_t)c->vocab_size);
        b->dlogp[n] = -(float)rng_below(&r, 100) / 1000.0f;
        b->dent[n] = (float)rng_below(&r, 100) / 5000.0f;
    }
    b->replay = NULL;
}

/* What one forward + backward gives: logits, logp, entropy, aux, routes_out, topk_ids and counts per
 * layer, the gradients; and the arena's bytes. */
typedef struct {
    float *logits, *logp, *ent, aux;
    int16_t *routes;
    int *ids, *tpe;
    float *grads;
    size_t arena;
} result;

static void result_free(result *r) {
    free(r->logits); free(r->logp); free(r->ent); free(r->routes); free(r->ids); free(r->tpe); free(r->grads);
    memset(r, 0, sizeof *r);
}

static int run(moe_model *m, int rc, const batch *b, result *r) {
    const moe_config *c = &m->cfg;
    const int N = b->N, V = c->vocab_size, L = c->num_hidden_layers, K = c->num_experts_per_tok, E = c->num_experts;
    const int Lm = model_moe_layer_count(c);
    m->cfg.exec.recompute = rc;
    model_acts a;
    if (model_acts_init(&a, m, 96) != MOERL_OK) return 0;
    memset(r, 0, sizeof *r);
    r->arena = a.arena_bytes;
    r->routes = xcalloc((size_t)N * Lm * K, sizeof(int16_t));
    a.routes_out = r->routes;
    a.replay_routes = b->replay;
    model_zero_grad(m);
    if (model_forward(m, &a, b->tok, b->cu, NULL, b->B, N) != MOERL_OK) {
        model_acts_free(&a);
        return 0;
    }
    model_logprobs(m, &a, b->tgt, 0.7f, 1);
    r->logits = xmalloc((size_t)N * V * sizeof(float));
    memcpy(r->logits, a.logits, (size_t)N * V * sizeof(float));
    r->logp = xmalloc((size_t)N * sizeof(float));
    r->ent = xmalloc((size_t)N * sizeof(float));
    memcpy(r->logp, a.logp, (size_t)N * sizeof(float));
    memcpy(r->ent, a.entropy, (size_t)N * sizeof(float));
    r->aux = a.aux_loss;
    r->ids = xcalloc((size_t)L * N * K + 1, sizeof(int));
    r->tpe = xcalloc((size_t)L * E + 1, sizeof(int));
    for (int l = 0; l < L; l++)
        if (moe_config_layer_is_moe(c, l)) { /* what train.c and trainer.c read after the forward */
            memcpy(r->ids + (size_t)l * N * K, a.layers[l].mlp.topk_ids, (size_t)N * K * sizeof(int));
            memcpy(r->tpe + (size_t)l * E, a.layers[l].mlp.tokens_per_expert, (size_t)E * sizeof(int));
        }
    model_backward(m, &a, b->dlogp, b->dent, 0.01f);
    r->grads = xmalloc(m->n_params * sizeof(float));
    memcpy(r->grads, m->grads, m->n_params * sizeof(float));
    model_acts_free(&a);
    m->cfg.exec.recompute = 0;
    return 1;
}

static void compare(const char *what, const moe_model *m, const batch *b, const result *x, const result *y) {
    const moe_config *c = &m->cfg;
    const size_t N = b->N, V = c->vocab_size, L = c->num_hidden_layers, K = c->num_experts_per_tok,
                 E = c->num_experts, Lm = model_moe_layer_count(c);
    CHECK(!memcmp(x->logits, y->logits, N * V * sizeof(float)), "%s: logits differ", what);
    CHECK(!memcmp(x->logp, y->logp, N * sizeof(float)) && !memcmp(x->ent, y->ent, N * sizeof(float)),
          "%s: logp/entropy differ", what);
    CHECK(x->aux == y->aux, "%s: aux loss %.9g vs %.9g", what, (double)x->aux, (double)y->aux);
    CHECK(!memcmp(x->routes, y->routes, N * Lm * K * sizeof(int16_t)), "%s: routes_out differ", what);
    CHECK(!memcmp(x->ids, y->ids, L * N * K * sizeof(int)) && !memcmp(x->tpe, y->tpe, L * E * sizeof(int)),
          "%s: the topk_ids / tokens_per_expert read after the forward differ", what);
    size_t diff = 0, first = 0;
    for (size_t i = m->n_params; i-- > 0;)
        if (memcmp(&x->grads[i], &y->grads[i], sizeof(float))) diff++, first = i;
    CHECK(diff == 0, "%s: %zu gradient floats differ (first at %zu: %.9g vs %.9g)", what, diff, first,
          (double)x->grads[first], (double)y->grads[first]);
    double gn = 0;
    for (size_t i = 0; i < m->n_params; i++) gn += (double)y->grads[i] * y->grads[i];
    CHECK(gn > 0, "%s: the reference gradients are all zero (the test would prove nothing)", what);
}

/* Every MoE execution path × {full, selective} × {native routing, replay}; arena bytes vs plan. */
static void test_equivalence(int dense_layer) {
    moe_config c;
    tiny_config(&c, dense_layer);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 4242);
    batch b;
    make_batch(&b, &c, 7);
    const int Lm = model_moe_layer_count(&c), K = c.num_experts_per_tok;
    int16_t *replay = xmalloc((size_t)b.N * Lm * K * sizeof(int16_t));
    for (int t = 0; t < b.N; t++) /* a third of the tokens native (−1), the others experts (t + j·3 + mi) mod E */
        for (int mi = 0; mi < Lm; mi++)
            for (int j = 0; j < K; j++)
                replay[((size_t)t * Lm + mi) * K + j] = (int16_t)(t % 3 == 0 ? -1 : (t + 3 * j + mi) % c.num_experts);
    const char *paths[] = {"default", "separate_permute", "per_expert_loop", "per_expert_weights", "batch_invariant"};
    for (int p = 0; p < 5; p++) {
        moe_exec_opts ex = {0};
        if (p == 1) ex.separate_permute = 1;
        if (p == 2) ex.per_expert_loop = 1;
        if (p == 3) ex.per_expert_weights = 1;
        if (p == 4) ex.batch_invariant = 1; /* rollout.batch_invariant's kernels: the recompute must use them too */
        m.cfg.exec = ex;
        for (int rp = 0; rp < 2; rp++) {
            b.replay = rp ? replay : NULL;
            result ref, got;
            if (!run(&m, MODEL_RECOMPUTE_NONE, &b, &ref)) {
                CHECK(0, "%s: reference run failed: %s", paths[p], moerl_last_error());
                continue;
            }
            CHECK(ref.arena == (size_t)plan_acts_bytes(&m.cfg, 96, 0, c.num_hidden_layers, MODEL_RECOMPUTE_NONE),
                  "%s: arena %zu B vs plan %.0f", paths[p], ref.arena,
                  plan_acts_bytes(&m.cfg, 96, 0, c.num_hidden_layers, MODEL_RECOMPUTE_NONE));
            size_t prev = ref.arena;
            for (int rc = MODEL_RECOMPUTE_SELECTIVE; rc >= MODEL_RECOMPUTE_FULL; rc--) {
                char what[160];
                snprintf(what, sizeof what, "dense layer %d, %s, %s, %s", dense_layer, paths[p],
                         rc == MODEL_RECOMPUTE_FULL ? "full" : "selective", rp ? "replay" : "native routes");
                if (!run(&m, rc, &b, &got)) {
                    CHECK(0, "%s: run failed: %s", what, moerl_last_error());
                    continue;
                }
                compare(what, &m, &b, &got, &ref);
                const double want = plan_acts_bytes(&m.cfg, 96, 0, c.num_hidden_layers, rc);
                CHECK(got.arena == (size_t)want, "%s: arena %zu B vs moerl plan's %.0f B", what, got.arena, want);
                CHECK(got.arena < prev, "%s: arena %zu B does not shrink below %zu B", what, got.arena, prev);
                prev = got.arena;
                result_free(&got);
            }
            result_free(&ref);
        }
    }
    free(replay);
    model_free(&m);
}

/* A pipeline stage (layers [1, 3), the head's stage): the caller fills layers[1].resid_in and the
 * backward leaves ∂loss/∂resid_in in d_resid — the same bits with recompute as without. Also the
 * first stage [0, 1) backward from a given d_resid. */
static void test_stage(void) {
    moe_config c;
    tiny_config(&c, -1);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 99);
    batch b;
    make_batch(&b, &c, 11);
    const size_t N = b.N, H = c.hidden_size;
    float *x = xmalloc(N * H * sizeof(float)), *dres[3], *g[3];
    rng_state r;
    rng_seed(&r, 5);
    for (size_t i = 0; i < N * H; i++) x[i] = (float)((int)rng_below(&r, 2001) - 1000) / 1000.0f;
    for (int lo = 0; lo < 2; lo++) {
        const int hi = lo ? 3 : 1;
        for (int rc = 0; rc < 3; rc++) {
            m.cfg.exec.recompute = rc;
            model_acts a;
            MOERL_ASSERT(model_acts_init_range(&a, &m, 96, lo, hi) == MOERL_OK);
            CHECK(a.arena_bytes == (size_t)plan_acts_bytes(&m.cfg, 96, lo, hi, rc), "stage [%d,%d) rc %d: arena %zu vs plan %.0f",
                  lo, hi, rc, a.arena_bytes, plan_acts_bytes(&m.cfg, 96, lo, hi, rc));
            if (lo) memcpy(a.layers[lo].resid_in, x, N * H * sizeof(float));
            model_zero_grad(&m);
            MOERL_ASSERT(model_forward(&m, &a, b.tok, b.cu, NULL, b.B, b.N) == MOERL_OK);
            if (hi == 3) model_logprobs(&m, &a, b.tgt, 1.0f, 0);
            else memcpy(a.d_resid, x, N * H * sizeof(float)); /* ∂loss/∂resid_out given by the next stage */
            model_backward(&m, &a, b.dlogp, NULL, 0.01f);
            dres[rc] = xmalloc(N * H * sizeof(float));
            memcpy(dres[rc], a.d_resid, N * H * sizeof(float));
            g[rc] = xmalloc(m.n_params * sizeof(float));
            memcpy(g[rc], m.grads, m.n_params * sizeof(float));
            model_acts_free(&a);
        }
        for (int rc = 1; rc < 3; rc++) {
            CHECK(!memcmp(g[rc], g[0], m.n_params * sizeof(float)), "stage [%d,%d) %s: gradients differ", lo, hi,
                  rc == 1 ? "full" : "selective");
            if (lo) CHECK(!memcmp(dres[rc], dres[0], N * H * sizeof(float)), "stage [%d,%d): d_resid differs", lo, hi);
        }
        for (int rc = 0; rc < 3; rc++) free(dres[rc]), free(g[rc]);
    }
    m.cfg.exec.recompute = 0;
    free(x);
    model_free(&m);
}

/* The keys: defaults, the granularity read, and the errors naming key and value. */
static void test_keys(void) {
    cfg *c = cfg_new();
    model_def_keys(c);
    model_def_train_keys(c);
    CHECK(model_check_train_keys(c) == MOERL_OK && model_recompute_mode(c) == MODEL_RECOMPUTE_NONE, "defaults: none");
    MOERL_ASSERT(cfg_apply_override(c, "model.enable_gradient_checkpointing=true") == MOERL_OK);
    CHECK(model_check_train_keys(c) == MOERL_OK && model_recompute_mode(c) == MODEL_RECOMPUTE_FULL, "on: full");
    MOERL_ASSERT(cfg_apply_override(c, "actor.recompute_granularity=selective") == MOERL_OK);
    CHECK(model_recompute_mode(c) == MODEL_RECOMPUTE_SELECTIVE, "selective");
    moe_model m;
    CHECK(model_build_from_keys(c, &m) == MOERL_OK && m.cfg.exec.recompute == MODEL_RECOMPUTE_SELECTIVE,
          "model_build_from_keys sets exec.recompute");
    model_free(&m);
    MOERL_ASSERT(cfg_apply_override(c, "actor.recompute_granularity=partial") == MOERL_OK);
    CHECK(model_check_train_keys(c) != MOERL_OK && strstr(moerl_last_error(), "actor.recompute_granularity") &&
              strstr(moerl_last_error(), "partial"), "bad granularity: %s", moerl_last_error());
    CHECK(model_build_from_keys(c, &m) != MOERL_OK, "model_build_from_keys refuses a bad granularity");
    MOERL_ASSERT(cfg_apply_override(c, "actor.recompute_granularity=full") == MOERL_OK);
    MOERL_ASSERT(cfg_apply_override(c, "model.enable_gradient_checkpointing=false") == MOERL_OK);
    CHECK(model_check_train_keys(c) != MOERL_OK && strstr(moerl_last_error(), "model.enable_gradient_checkpointing"),
          "granularity without recompute: %s", moerl_last_error());
    cfg_free(c);
}

int main(void) {
    test_keys();
    test_equivalence(-1);
    test_equivalence(1);
    test_stage();
    TEST_MAIN_END();
}
