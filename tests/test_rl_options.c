/* The RL options of src/rl/losses.h against PyTorch (tests/ref/gen_rl_options.py):
 * advantage estimators (rloo, grpo without std, reinforce++ baseline with batch whitening, also
 * with its moments split over two "ranks"), the four loss aggregation modes (also summed over an
 * arbitrary split of the batch), rollout IS weights (token, sequence) and DAPO's overlong penalty. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/safetensors.h"
#include "rl/losses.h"
#include "test.h"

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

static void test_advantages(const st_file *f) {
    int64_t G, R;
    int *sizes = need(f, "adv_sizes", ST_I32, &G), *len = need(f, "adv_resp_len", ST_I32, NULL);
    float *r = need(f, "adv_rewards", ST_F32, &R), *rloo = need(f, "adv_rloo", ST_F32, NULL);
    float *nostd = need(f, "adv_grpo_nostd", ST_F32, NULL), *rpp = need(f, "adv_rpp", ST_F32, NULL);
    if (!(sizes && len && r && rloo && nostd && rpp)) return;
    float *a = xmalloc(R * sizeof(float));
    /* fp32 outputs of double arithmetic on the same fp32 inputs: one rounding apart */
    rloo_advantages(a, r, sizes, (int)G);
    t_close("rloo advantages vs PyTorch", a, rloo, R, 1e-6f, 1e-6f);
    grpo_advantages_no_std(a, r, sizes, (int)G);
    t_close("grpo (no std) advantages vs PyTorch", a, nostd, R, 1e-6f, 1e-6f);
    reinforce_pp_baseline(a, r, sizes, (int)G);
    double mom[3] = {0, 0, 0};
    reinforce_pp_moments(a, len, (int)R, mom);
    reinforce_pp_whiten(a, (int)R, mom);
    /* whitening divides by a std of order 0.5: a few fp32 ulps of the baseline */
    t_close("reinforce++ baseline advantages vs PyTorch", a, rpp, R, 1e-5f, 1e-5f);
    /* data parallel: two ranks with disjoint groups sum their moments first */
    {
        const int cut = sizes[0] + sizes[1] + sizes[2]; /* first three groups on rank 0 */
        float *b = xmalloc(R * sizeof(float));
        reinforce_pp_baseline(b, r, sizes, 3);
        reinforce_pp_baseline(b + cut, r + cut, sizes + 3, (int)G - 3);
        double m0[3] = {0, 0, 0}, m1[3] = {0, 0, 0};
        reinforce_pp_moments(b, len, cut, m0);
        reinforce_pp_moments(b + cut, len + cut, (int)R - cut, m1);
        for (int i = 0; i < 3; i++) m0[i] += m1[i];
        reinforce_pp_whiten(b, cut, m0);
        reinforce_pp_whiten(b + cut, (int)R - cut, m0);
        t_close("reinforce++ baseline split over 2 ranks vs PyTorch", b, rpp, R, 1e-5f, 1e-5f);
        free(b);
    }
    /* direction: in a group, the higher reward gets the higher advantage under every estimator */
    {
        const float rr[4] = {1, 0, 0, 1};
        const int sz[1] = {4}, ln[4] = {3, 3, 3, 3};
        float x[4];
        grpo_advantages(x, rr, sz, 1, 1e-6f);
        CHECK(x[0] > 0 && x[1] < 0, "grpo sign: %g %g", x[0], x[1]);
        rloo_advantages(x, rr, sz, 1);
        CHECK(x[0] > 0 && x[1] < 0 && fabsf(x[0] - 2.0f / 3.0f) < 1e-6f, "rloo: %g %g", x[0], x[1]);
        reinforce_pp_baseline(x, rr, sz, 1);
        double m[3] = {0, 0, 0};
        reinforce_pp_moments(x, ln, 4, m);
        reinforce_pp_whiten(x, 4, m);
        CHECK(x[0] > 0 && x[1] < 0, "reinforce++ sign: %g %g", x[0], x[1]);
    }
    free(a); free(sizes); free(len); free(r); free(rloo); free(nostd); free(rpp);
}

static void test_aggregation(const st_file *f) {
    int64_t n;
    float *L = need(f, "agg_loss", ST_F32, &n), *H = need(f, "agg_H", ST_F32, NULL), *ref = need(f, "agg_ref", ST_F32, NULL);
    int64_t B;
    int *lens = need(f, "agg_lens", ST_I32, &B);
    if (!(L && H && ref && lens)) return;
    const int Tm = (int)(n / B);
    int64_t toks = 0, seqs = 0;
    for (int i = 0; i < B; i++) {
        toks += lens[i];
        seqs += lens[i] > 0;
    }
    const char *names[4] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"};
    for (int m = 0; m < 4; m++) {
        loss_agg_mode mode;
        CHECK(loss_agg_mode_parse(names[m], &mode) == MOERL_OK && (int)mode == m, "parse %s", names[m]);
        CHECK(!strcmp(loss_agg_mode_name(mode), names[m]), "name of %s", names[m]);
        /* the whole batch at once, and in two arbitrary parts (two ranks / micro-batches) */
        double whole = 0, part[2] = {0, 0};
        for (int i = 0; i < B; i++) {
            const double w = loss_agg_weight(mode, lens[i], toks, seqs, H[0]);
            for (int t = 0; t < lens[i]; t++) {
                whole += w * L[i * Tm + t];
                part[(i * 7 + t) % 2] += w * L[i * Tm + t];
            }
        }
        /* double sums of fp32 inputs against fp32 storage of the float64 reference */
        CHECK(fabs(whole - ref[m]) <= 1e-6 * (1 + fabs(ref[m])), "%s: %.9g vs PyTorch %.9g", names[m], whole,
              (double)ref[m]);
        CHECK(fabs(part[0] + part[1] - whole) <= 1e-12 * (1 + fabs(whole)), "%s: split sum %.12g vs %.12g", names[m],
              part[0] + part[1], whole);
    }
    loss_agg_mode bad;
    CHECK(loss_agg_mode_parse("seq-mean", &bad) == MOERL_ERR && strstr(moerl_last_error(), "seq-mean-token-mean"),
          "unknown mode names the accepted ones: %s", moerl_last_error());
    free(L); free(H); free(ref); free(lens);
}

static void test_rollout_is(const st_file *f) {
    int64_t n;
    float *old = need(f, "is_old", ST_F32, &n), *mu = need(f, "is_mu", ST_F32, NULL);
    float *tok = need(f, "is_token", ST_F32, NULL), *seq = need(f, "is_sequence", ST_F32, NULL);
    if (!(old && mu && tok && seq)) return;
    const int S = 4, T = (int)(n / S);
    float *w = xmalloc(n * sizeof(float));
    rollout_is_stats st = {0};
    for (int s = 0; s < S; s++) rollout_is_weights(w + s * T, old + s * T, mu + s * T, T, ROLLOUT_IS_TOKEN, 2.0f, &st);
    t_close("rollout IS token weights vs PyTorch", w, tok, n, 1e-6f, 1e-6f);
    CHECK(st.n_tokens == n && st.truncated > 0, "token IS stats: %lld tokens, %g truncated", (long long)st.n_tokens,
          st.truncated);
    for (int s = 0; s < S; s++) rollout_is_weights(w + s * T, old + s * T, mu + s * T, T, ROLLOUT_IS_SEQUENCE, 2.0f, NULL);
    /* the sequence sum of 9 log-ratios in double, exp'd: relative 1e-6 */
    t_close("rollout IS sequence weights vs PyTorch", w, seq, n, 1e-6f, 1e-6f);
    free(w); free(old); free(mu); free(tok); free(seq);
}

static void test_overlong(const st_file *f) {
    int64_t n;
    int *lens = need(f, "ol_lens", ST_I32, &n);
    float *pen = need(f, "ol_pen", ST_F32, NULL);
    if (!(lens && pen)) return;
    float *p = xmalloc(n * sizeof(float));
    for (int i = 0; i < n; i++) p[i] = (float)overlong_penalty(lens[i], 20, 8, 1.5);
    t_close("overlong penalty vs PyTorch", p, pen, n, 1e-7f, 1e-6f);
    CHECK(overlong_penalty(5, 20, 0, 1.0) == 0.0, "no buffer, no penalty");
    free(p); free(lens); free(pen);
}

/* The rollout IS weight multiplies the PPO loss and its gradient (detached). */
static void test_is_in_loss(void) {
    ppo_config cfg = {.clip_ratio_low = 0.2f, .clip_ratio_high = 0.2f, .clip_ratio_c = 3.0f};
    float lp = -1.0f, old = -1.05f, a = 1.0f, w = 1.0f, isw = 0.5f, g1, g2;
    double L1 = ppo_token_loss(&g1, &lp, &old, NULL, &a, NULL, &w, 1, &cfg, NULL);
    double L2 = ppo_token_loss(&g2, &lp, &old, NULL, &a, &isw, &w, 1, &cfg, NULL);
    CHECK(fabs(L2 - 0.5 * L1) < 1e-12 && fabsf(g2 - 0.5f * g1) < 1e-7f, "IS weight scales L (%g vs %g) and g", L2, L1);
}

int main(void) {
    char p[4096];
    snprintf(p, sizeof p, "%s/rl_options.safetensors", testdata());
    st_file f;
    if (st_open(&f, p) != MOERL_OK) {
        CHECK(0, "%s (run tests/ref/gen_rl_options.py first)", moerl_last_error());
    } else {
        test_advantages(&f);
        test_aggregation(&f);
        test_rollout_is(&f);
        test_overlong(&f);
        st_close(&f);
    }
    test_is_in_loss();
    printf("%d passed, %d failed\n", t_passed, t_failed);
    return t_failed ? 1 : 0;
}
