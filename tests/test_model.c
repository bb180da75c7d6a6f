/* Whole-model parity against the PyTorch reference (tests/ref/gen_model.py, float64 reference
 * computed from the same float32 weights): logits, target logprobs, CE, aux loss, top-k expert
 * ids (exactly), every parameter gradient, and 10 AdamW steps of losses. Two configurations:
 * A (dense layer mixed in, tied embeddings, norm_topk_prob false, head_dim = H/nh) and
 * B (Qwen3-30B-A3B scaled down: head_dim ≠ H/nh, norm_topk_prob true, untied). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "optim/adamw.h"
#include "test.h"

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static float *get_f32(const st_file *f, const char *name, int64_t *numel) {
    const st_tensor *t = st_find(f, name);
    if (!t) return NULL;
    float *x = xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
    if (st_to_f32(t, x) != MOERL_OK) { free(x); return NULL; }
    if (numel) *numel = t->numel;
    return x;
}

static int *get_i32(const st_file *f, const char *name, int64_t *numel) {
    const st_tensor *t = st_find(f, name);
    if (!t || t->dtype != ST_I32) return NULL;
    int *x = xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof(int));
    memcpy(x, t->data, (size_t)t->numel * sizeof(int));
    if (numel) *numel = t->numel;
    return x;
}

/* loss = Σ mask·(−logp)/Σ mask + coef·aux; fills dlogp. Returns the loss. */
static float run_loss(moe_model *m, model_acts *a, const int *tok, const int *cu, int B, int N, const int *tgt,
                      const float *mask, float *dlogp, int backward) {
    if (model_forward(m, a, tok, cu, NULL, B, N) != MOERL_OK) {
        fprintf(stderr, "forward failed: %s\n", moerl_last_error());
        return NAN;
    }
    model_logprobs(m, a, tgt, 1.0f, 0);
    double msum = 0, ce = 0;
    for (int n = 0; n < N; n++) msum += mask[n];
    for (int n = 0; n < N; n++) {
        ce -= mask[n] * a->logp[n];
        dlogp[n] = (float)(-mask[n] / msum);
    }
    ce /= msum;
    float coef = m->cfg.router_aux_loss_coef;
    if (backward) model_backward(m, a, dlogp, NULL, coef);
    return (float)(ce + coef * a->aux_loss);
}

static void check_config(const char *tag, int adam) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/model_%s", testdata(), tag);
    snprintf(ref, sizeof ref, "%s/model_%s_ref.safetensors", testdata(), tag);
    moe_model m;
    if (model_load_hf(&m, dir) != MOERL_OK) {
        CHECK(0, "config %s: cannot load %s: %s", tag, dir, moerl_last_error());
        return;
    }
    st_file f;
    if (st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "config %s: cannot open reference %s: %s", tag, ref, moerl_last_error());
        model_free(&m);
        return;
    }
    int64_t N64, B1;
    int *tok = get_i32(&f, "tokens", &N64), *cu = get_i32(&f, "cu_seqlens", &B1), *tgt = get_i32(&f, "targets", NULL);
    float *mask = get_f32(&f, "loss_mask", NULL);
    CHECK(tok && cu && tgt && mask, "config %s: reference lacks tokens/cu_seqlens/targets/loss_mask", tag);
    if (!(tok && cu && tgt && mask)) return;
    const int N = (int)N64, B = (int)B1 - 1, V = m.cfg.vocab_size;
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, N) == MOERL_OK);
    float *dlogp = xmalloc(N * sizeof(float));
    model_zero_grad(&m);
    float loss = run_loss(&m, &a, tok, cu, B, N, tgt, mask, dlogp, 1);
    char what[256];

    /* logits: fp32 vs the float64 reference through a few layers of width ≤ 64; observed
     * error ~1e-6, limit 2e-5 absolute + 1e-4 relative leaves room for summation order. */
    float *ref_logits = get_f32(&f, "logits", NULL);
    snprintf(what, sizeof what, "config %s logits", tag);
    CHECK(ref_logits != NULL, "%s missing", what);
    if (ref_logits) t_close(what, a.logits, ref_logits, (long)N * V, 2e-5f, 1e-4f);
    float *ref_logp = get_f32(&f, "logp", NULL);
    snprintf(what, sizeof what, "config %s logp", tag);
    if (ref_logp) t_close(what, a.logp, ref_logp, N, 2e-5f, 1e-4f);
    else CHECK(0, "%s missing", what);
    float *r = get_f32(&f, "aux_loss", NULL);
    /* aux is a sum of E products of means; relative 1e-5 covers fp32 accumulation. */
    snprintf(what, sizeof what, "config %s aux_loss", tag);
    if (r) t_close(what, &a.aux_loss, r, 1, 1e-6f, 1e-5f);
    else CHECK(0, "%s missing", what);
    free(r);
    r = get_f32(&f, "loss", NULL);
    snprintf(what, sizeof what, "config %s loss", tag);
    if (r) t_close(what, &loss, r, 1, 1e-5f, 1e-5f); /* mean of logprobs: same accuracy as logp */
    else CHECK(0, "%s missing", what);
    free(r);

    /* top-k expert ids: exact (the generator keeps a margin between the K-th and K+1-th prob). */
    int n_moe = 0;
    for (int l = 0; l < m.cfg.num_hidden_layers; l++) {
        if (!moe_config_layer_is_moe(&m.cfg, l)) continue;
        n_moe++;
        char nm[64];
        snprintf(nm, sizeof nm, "topk_ids.%d", l);
        int64_t nk;
        int *ids = get_i32(&f, nm, &nk);
        CHECK(ids && nk == (int64_t)N * m.cfg.num_experts_per_tok, "config %s: %s missing or wrong size", tag, nm);
        if (!ids) continue;
        int mism = 0;
        for (int64_t i = 0; i < nk; i++) mism += ids[i] != a.layers[l].mlp.topk_ids[i];
        CHECK(mism == 0, "config %s layer %d: %d top-k ids differ", tag, l, mism);
        free(ids);
    }
    CHECK(n_moe > 0, "config %s has no MoE layer", tag);

    /* every parameter gradient, by HF name */
    int ng = 0, nbad = 0;
    for (int i = 0; i < model_hf_count(&m); i++) {
        char hf[128], gname[160];
        model_hf_name(&m, i, hf, sizeof hf);
        snprintf(gname, sizeof gname, "grad.%s", hf);
        int64_t numel, rn, shape[2];
        int nd;
        float *g = model_hf_tensor(&m, m.grads, hf, &nd, shape, &numel);
        float *rg = get_f32(&f, gname, &rn);
        if (!g || !rg || rn != numel) {
            CHECK(0, "config %s: gradient %s missing or wrong size", tag, hf);
            free(rg);
            continue;
        }
        /* gradients: limit relative to the tensor's largest entry (1e-4 of it) since tiny entries
         * are sums of cancelling terms; fp32 backprop through ≤ 3 layers stays well inside. */
        float gmax = 0;
        for (int64_t j = 0; j < numel; j++) gmax = fmaxf(gmax, fabsf(rg[j]));
        int before = t_failed;
        t_close(gname, g, rg, (long)numel, 1e-4f * gmax + 1e-9f, 1e-3f);
        nbad += t_failed != before;
        ng++;
        free(rg);
    }
    CHECK(ng == model_hf_count(&m), "config %s: compared %d of %d gradients", tag, ng, model_hf_count(&m));
    printf("config %s: N=%d B=%d, %d gradients compared, %d off\n", tag, N, B, ng, nbad);

    if (adam) {
        int64_t ns;
        float *ref_losses = get_f32(&f, "adam_losses", &ns);
        CHECK(ref_losses && ns == 10, "config %s: adam_losses missing", tag);
        if (ref_losses) {
            adamw_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                               .max_grad_norm = 1.0f};
            adamw_state os;
            adamw_init(&os, &m, oc);
            float losses[10];
            for (int s = 0; s < 10; s++) {
                model_zero_grad(&m);
                losses[s] = run_loss(&m, &a, tok, cu, B, N, tgt, mask, dlogp, 1);
                double gn;
                CHECK(adamw_step(&os, &m, oc.lr, losses[s], &gn) == 1, "step %d skipped", s);
            }
            /* 10 AdamW steps amplify fp32 differences (Adam normalises tiny gradient differences);
             * 1e-4 relative on losses of order 1 still catches any wrong update rule. */
            snprintf(what, sizeof what, "config %s adam losses", tag);
            t_close(what, losses, ref_losses, 10, 1e-5f, 1e-4f);
            for (int s = 0; s < 10; s++) printf("  step %d loss %.6f ref %.6f\n", s, losses[s], ref_losses[s]);
            adamw_free(&os);
            free(ref_losses);
        }
    }
    free(ref_logits);
    free(ref_logp);
    free(dlogp);
    free(tok);
    free(cu);
    free(tgt);
    free(mask);
    model_acts_free(&a);
    st_close(&f);
    model_free(&m);
}

/* moerl score's numbers against the reference for one sequence of config B. */
static void check_score(void) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/model_b", testdata());
    snprintf(ref, sizeof ref, "%s/model_b_score.safetensors", testdata());
    moe_model m;
    st_file f;
    if (model_load_hf(&m, dir) != MOERL_OK || st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "score: cannot load %s / %s: %s", dir, ref, moerl_last_error());
        return;
    }
    int64_t T;
    int *tok = get_i32(&f, "tokens", &T);
    float *rl = get_f32(&f, "token_logprobs", NULL), *ra = get_f32(&f, "aux_loss", NULL);
    CHECK(tok && rl && ra, "score reference incomplete");
    if (tok && rl && ra) {
        model_acts a;
        MOERL_ASSERT(model_acts_init(&a, &m, (int)T) == MOERL_OK);
        int cu[2] = {0, (int)T};
        int *tg = xmalloc(T * sizeof(int));
        for (int t = 0; t < T; t++) tg[t] = t + 1 < T ? tok[t + 1] : -1;
        CHECK(model_forward(&m, &a, tok, cu, NULL, 1, (int)T) == MOERL_OK, "forward");
        model_logprobs(&m, &a, tg, 1.0f, 0);
        t_close("score token_logprobs", a.logp, rl, (long)T - 1, 2e-5f, 1e-4f); /* as logp above */
        t_close("score aux_loss", &a.aux_loss, ra, 1, 1e-6f, 1e-5f);
        free(tg);
        model_acts_free(&a);
    }
    free(tok);
    free(rl);
    free(ra);
    st_close(&f);
    model_free(&m);
}

/* Forward errors are reported, not crashes. */
static void check_errors(void) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 11; c.hidden_size = 8; c.intermediate_size = 8; c.moe_intermediate_size = 4;
    c.num_hidden_layers = 1; c.num_attention_heads = 2; c.num_key_value_heads = 1; c.head_dim = 4;
    c.num_experts = 4; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1; c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-6f; c.rope_theta = 10000; c.initializer_range = 0.02f;
    moe_model m;
    CHECK(model_init(&m, &c) == MOERL_OK, "model_init: %s", moerl_last_error());
    model_init_random(&m, 1);
    model_acts a;
    model_acts_init(&a, &m, 4);
    int tok[5] = {1, 2, 3, 4, 5}, cu[2] = {0, 5};
    CHECK(model_forward(&m, &a, tok, cu, NULL, 1, 5) == MOERL_ERR && strstr(moerl_last_error(), "max_tokens"),
          "too many tokens: %s", moerl_last_error());
    int bad[2] = {1, 11}, cu2[2] = {0, 2};
    CHECK(model_forward(&m, &a, bad, cu2, NULL, 1, 2) == MOERL_ERR && strstr(moerl_last_error(), "vocabulary"),
          "token out of vocab: %s", moerl_last_error());
    model_acts_free(&a);
    model_free(&m);
}

int main(void) {
    check_config("a", 0);
    check_config("b", 1);
    check_score();
    check_errors();
    TEST_MAIN_END();
}
