/* GSPO and the KL options through the RL trainer (trainer_step: packing, rewards, KL in the reward,
 * advantages, weights, the loss dispatch, backward) on one GRPO group of multi-turn responses against
 * PyTorch (tests/ref/gen_gspo_trainer.py): every parameter's gradient and the step's metrics for
 *   case 0: actor.policy_loss.loss_mode=gspo with loss_agg_mode=token-mean (the pg loss aggregated
 *           seq-mean-token-mean as verl forces, the entropy bonus and the KL loss token-mean), GSPO's
 *           clip 3e-4/4e-4, actor.kl_loss_type=k1+ to a reference policy;
 *   case 1: vanilla PPO with algorithm.use_kl_in_reward (kl_penalty=low_var_kl, fixed β = 4):
 *           actor/reward_kl_penalty, its coefficient, and the advantages from the penalised scores;
 * controls that can fail: case 0 run as vanilla, and case 1 without the KL in the reward, miss the
 * reference gradient by far more than the tolerance; case 1 with an adaptive controller moves β as
 * AdaptiveKLController does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rl/rl.h"
#include "rl_fixture.h"
#include "test.h"
#include "train/train.h"

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static void *need(const st_file *f, const char *name, st_dtype dt, int64_t *numel) {
    const st_tensor *t = st_find(f, name);
    CHECK(t != NULL && t->dtype == dt, "%s: reference tensor '%s' missing or of another dtype", f->path, name);
    if (!t || t->dtype != dt) return NULL;
    void *x = xmalloc((size_t)(t->numel ? t->numel : 1) * 4);
    memcpy(x, t->data, (size_t)t->numel * 4);
    if (numel) *numel = t->numel;
    return x;
}

typedef struct {
    int G, P, *prompt, *len, *tok, *mask, *has_mask;
    float *rewards, *behav, *params;
} ref_group;

static rl_group *make_group(const ref_group *r) {
    rl_group *g = xcalloc(1, sizeof *g);
    g->n = g->n_done = r->G;
    for (int i = 0; i < r->P; i++) tok_seq_push(&g->prompt, r->prompt[i]);
    g->reqs = xcalloc((size_t)r->G, sizeof(gen_request));
    g->rewards = xcalloc((size_t)r->G, sizeof(reward_result));
    for (int j = 0, off = 0; j < r->G; off += r->len[j], j++) {
        gen_request *q = &g->reqs[j];
        const int n = r->len[j];
        q->id = j;
        q->prompt = g->prompt.ids;
        q->prompt_len = (int)g->prompt.n;
        q->n_out = n;
        q->finish = FINISH_STOP;
        q->out_tokens = xmalloc((size_t)n * sizeof(int));
        q->out_logprobs = xmalloc((size_t)n * sizeof(float));
        q->out_versions = xcalloc((size_t)n, sizeof(int));
        for (int t = 0; t < n; t++) {
            q->out_tokens[t] = r->tok[off + t];
            q->out_logprobs[t] = r->behav[off + t];
        }
        if (r->has_mask[j]) {
            q->out_mask = xmalloc((size_t)n);
            for (int t = 0; t < n; t++) q->out_mask[t] = (unsigned char)r->mask[off + t];
        }
        g->rewards[j].score = r->rewards[j];
        q->user = g;
    }
    return g;
}

/* Case k's config; control = 1 runs the variant that must miss the reference. */
static rl_config case_config(const ref_group *r, int k, int control) {
    rl_config c = rl_test_config();
    c.n = r->G;
    c.ppo_mini_batch_size = 1;
    c.ppo_epochs = 1;
    c.ppo_max_token_len = 256;
    c.temperature = 1.0f;
    c.optim.lr = 0.0f;
    c.optim.max_grad_norm = 0.0f;
    c.optim.weight_decay = 0.0f;
    c.adv_estimator = RL_ADV_GRPO;
    c.norm_adv_by_std = 1;
    c.recompute_old = 0;
    c.rollout_is = ROLLOUT_IS_NONE;
    c.ppo.decoupled = 0;
    c.entropy_coeff = r->params[5];
    c.overlong_enable = c.overlong_filter = 0;
    if (k == 0) {
        c.loss_mode = control ? POLICY_LOSS_VANILLA : POLICY_LOSS_GSPO;
        c.ppo.clip_ratio_low = r->params[0];
        c.ppo.clip_ratio_high = r->params[1];
        c.ppo.clip_ratio_c = r->params[4];
        c.loss_agg = LOSS_AGG_TOKEN_MEAN;
        c.use_kl_loss = 1;
        c.kl_loss_coef = r->params[6];
        c.kl_loss_type = (kl_type){KL_K1, 1};
        c.use_kl_in_reward = 0;
    } else {
        c.loss_mode = POLICY_LOSS_VANILLA;
        c.ppo.clip_ratio_low = r->params[2];
        c.ppo.clip_ratio_high = r->params[3];
        c.ppo.clip_ratio_c = r->params[4];
        c.loss_agg = LOSS_AGG_SEQ_MEAN_TOKEN_MEAN;
        c.use_kl_loss = 0;
        c.use_kl_in_reward = !control;
        c.kl_penalty = (kl_type){KL_K3, 0};
        c.kl_ctrl = (kl_controller){.adaptive = 0, .value = r->params[7], .target = 0.1, .horizon = 10000};
    }
    return c;
}

static moe_model g_ref_policy;
static int g_have_ref;

static int train_case(moe_model *m, const rl_config *c, const ref_group *r, float *grads, train_stats *st,
                      double *beta_after) {
    trainer T;
    int rc = trainer_init(&T, c, NULL, m);
    CHECK(rc != MOERL_OK || !(c->use_kl_loss || c->use_kl_in_reward) || T.ref != NULL, "the KL options load a reference");
    if (rc == MOERL_OK && T.ref && g_have_ref) memcpy(T.ref->params, g_ref_policy.params, T.ref->n_params * sizeof(float));
    rl_group *g = make_group(r);
    if (rc == MOERL_OK) rc = trainer_step(&T, &g, 1, st);
    CHECK(rc == MOERL_OK, "trainer: %s", moerl_last_error());
    memcpy(grads, m->grads, m->n_params * sizeof(float));
    if (beta_after) *beta_after = T.kl_ctrl.value;
    trainer_free(&T);
    rl_group_free(g);
    return rc;
}

/* Worst |g − ref| over every gradient relative to the tolerance (test_loss_mask's: 1e-4 of the
 * tensor's largest entry + 1e-3 relative, fp32 forward/backward vs float64 autograd on the same weights). */
static double compare_grads(const moe_model *m, const st_file *f, int k, const float *grads) {
    double worst = 0;
    for (int i = 0; i < model_hf_count(m); i++) {
        char hf[128], gname[200];
        model_hf_name(m, i, hf, sizeof hf);
        snprintf(gname, sizeof gname, "case%d.grad.%s", k, hf);
        int64_t numel, rn = 0, shape[2];
        int nd;
        const float *g = model_hf_tensor(m, (float *)grads, hf, &nd, shape, &numel);
        float *rg = need(f, gname, ST_F32, &rn);
        if (!g || !rg || rn != numel) {
            CHECK(0, "case %d: gradient %s missing or of another size", k, hf);
            free(rg);
            return INFINITY;
        }
        float gmax = 0;
        for (int64_t j = 0; j < numel; j++) gmax = fmaxf(gmax, fabsf(rg[j]));
        for (int64_t j = 0; j < numel; j++) {
            const double tol = 1e-4 * gmax + 1e-9 + 1e-3 * fabs((double)rg[j]);
            worst = fmax(worst, fabs((double)g[j] - (double)rg[j]) / tol);
        }
        free(rg);
    }
    return worst;
}

int main(void) {
    char dir[1024], ref[1024], rdir[1100];
    snprintf(dir, sizeof dir, "%s/gspo_trainer_model", testdata());
    snprintf(rdir, sizeof rdir, "%s/gspo_trainer_ref_model", testdata());
    snprintf(ref, sizeof ref, "%s/gspo_trainer.safetensors", testdata());
    moe_model m;
    st_file f;
    if (model_load_hf(&m, dir) != MOERL_OK || st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "cannot load %s / %s (run tests/ref/gen_gspo_trainer.py): %s", dir, ref, moerl_last_error());
        TEST_MAIN_END();
    }
    g_have_ref = model_load_hf(&g_ref_policy, rdir) == MOERL_OK;
    CHECK(g_have_ref, "cannot load %s: %s", rdir, moerl_last_error());
    ref_group r = {0};
    int64_t G = 0, P = 0;
    r.prompt = need(&f, "prompt", ST_I32, &P);
    r.len = need(&f, "resp_len", ST_I32, &G);
    r.tok = need(&f, "resp_tokens", ST_I32, NULL);
    r.mask = need(&f, "resp_mask", ST_I32, NULL);
    r.has_mask = need(&f, "has_mask", ST_I32, NULL);
    r.rewards = need(&f, "rewards", ST_F32, NULL);
    r.behav = need(&f, "behav", ST_F32, NULL);
    r.params = need(&f, "params", ST_F32, NULL);
    r.G = (int)G;
    r.P = (int)P;
    if (r.prompt && r.len && r.tok && r.mask && r.has_mask && r.rewards && r.behav && r.params && g_have_ref) {
        float *grads = xmalloc(m.n_params * sizeof(float));
        for (int k = 0; k < 2; k++) {
            train_stats st;
            rl_config c = case_config(&r, k, 0);
            if (train_case(&m, &c, &r, grads, &st, NULL) != MOERL_OK) continue;
            const double worst = compare_grads(&m, &f, k, grads);
            CHECK(worst <= 1.0, "case %d: a gradient is off by %.3g× the tolerance", k, worst);
            char mname[32];
            snprintf(mname, sizeof mname, "case%d.metrics", k);
            float *mt = need(&f, mname, ST_F32, NULL);
            if (mt) {
                /* fp32 logprobs (≈1e-6 relative) through sums of ≤ 40 terms in double: 1e-5 relative + 1e-6 */
                const float got[5] = {(float)st.pg_loss, (float)st.entropy, (float)st.pg_clipfrac, (float)st.kl_loss,
                                      k ? (float)st.reward_kl_penalty : 0.0f};
                char what[96];
                snprintf(what, sizeof what, "case %d: pg_loss, entropy, pg_clipfrac, kl_loss, reward_kl_penalty", k);
                t_close(what, got, mt, 5, 1e-6f, 1e-5f);
                free(mt);
            }
            if (k == 1) CHECK(st.reward_kl_penalty_coeff == (double)r.params[7], "reward_kl_penalty_coeff %g",
                              st.reward_kl_penalty_coeff);
            rl_config cc = case_config(&r, k, 1);
            if (train_case(&m, &cc, &r, grads, &st, NULL) != MOERL_OK) continue;
            const double off = compare_grads(&m, &f, k, grads);
            CHECK(off > 100.0, "case %d: the control is only %.3g× the tolerance off (the check could not fail)", k,
                  off);
            fprintf(stderr, "  case %d: worst gradient %.3g of the tolerance; control %.3g\n", k, worst, off);
        }
        /* the adaptive controller inside the trainer: one step moves β as AdaptiveKLController */
        rl_config c = case_config(&r, 1, 0);
        c.kl_ctrl = (kl_controller){.adaptive = 1, .value = 0.5, .target = 0.001, .horizon = 40};
        train_stats st;
        double beta = 0;
        if (train_case(&m, &c, &r, grads, &st, &beta) == MOERL_OK) {
            double e = st.reward_kl_penalty / 0.001 - 1.0;
            e = e < -0.2 ? -0.2 : (e > 0.2 ? 0.2 : e);
            const double want = 0.5 * (1.0 + e * r.G / 40.0);
            CHECK(fabs(beta - want) <= 1e-12 && beta != 0.5, "adaptive beta after one step %.12g, want %.12g", beta,
                  want);
        }
        free(grads);
    }
    free(r.prompt); free(r.len); free(r.tok); free(r.mask); free(r.has_mask); free(r.rewards); free(r.behav);
    free(r.params);
    if (g_have_ref) model_free(&g_ref_policy);
    st_close(&f);
    model_free(&m);
    TEST_MAIN_END();
}
