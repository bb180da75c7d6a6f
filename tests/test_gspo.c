/* GSPO (actor.policy_loss.loss_mode=gspo), the KL estimators (actor.kl_loss_type, algorithm.kl_penalty,
 * '+' straight-through variants) and the KL-in-the-reward controller (algorithm.kl_ctrl.*) against
 *   (1) PyTorch: tests/ref/gen_gspo.py writes $MOERL_TESTDATA/gspo.safetensors (float64 autograd from
 *       the stored float32 inputs; verl's padded [B, T] form with a response mask);
 *   (2) the config keys: defaults (verl's), every bad value refused naming its key, gspo refused with
 *       the decoupled loss and with Ulysses SP.
 * The C side is fed as the trainer feeds it: only the mask-1 tokens (masked tokens never reach the
 * loss callback), flat, with sequence ids and seq-mean-token-mean weights 1/(S·|T_i|).
 * Tolerances: the references are exact for the fp32 inputs; the C code computes each token in
 * double and rounds dlogp to fp32 once, so gradients get rtol 1e-6 (a few fp32 ulps) with atol 1e-9
 * for exact zeros' neighbours; loss sums are double sums of ≤ 60 terms compared with the fp32-rounded
 * reference: rtol 1e-6 (the reference's rounding). The missing reference file is a failure. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "model/safetensors.h"
#include "rl/losses.h"
#include "rl/rl.h"
#include "rl/state.h"
#include "test.h"

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static float *need(const st_file *f, const char *name, int64_t *numel) {
    const st_tensor *t = st_find(f, name);
    CHECK(t != NULL, "%s: reference tensor '%s' is missing", f->path, name);
    if (!t) return NULL;
    float *x = xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
    if (st_to_f32(t, x) != MOERL_OK) {
        CHECK(0, "%s: %s", name, moerl_last_error());
        free(x);
        return NULL;
    }
    if (numel) *numel = t->numel;
    return x;
}

static void near(const char *what, double got, double want, double rtol) {
    CHECK(fabs(got - want) <= 1e-9 + rtol * fabs(want), "%s: got %.10g want %.10g (rtol %g)", what, got, want, rtol);
}

#define B 6
#define L 9

/* The batch as the trainer's callback sees it: mask-1 tokens only. Returns the token count. */
static int gather(const float *mask, const float *src, float *dst, int *seq, int *pos) {
    int k = 0;
    for (int i = 0; i < B; i++)
        for (int t = 0; t < L; t++)
            if (mask[i * L + t] > 0) {
                if (dst) dst[k] = src[i * L + t];
                if (seq) seq[k] = i;
                if (pos) pos[k] = i * L + t;
                k++;
            }
    return k;
}

static void test_gspo(const st_file *f) {
    float *logp = need(f, "gspo_logp", NULL), *old = need(f, "gspo_old", NULL), *adv = need(f, "gspo_adv", NULL);
    float *mask = need(f, "gspo_mask", NULL), *isw = need(f, "gspo_isw_w", NULL), *clip = need(f, "gspo_clip", NULL);
    float *seqr = need(f, "gspo_seq_log_ratio", NULL);
    if (!(logp && old && adv && mask && isw && clip && seqr)) goto out;
    float lp[B * L], od[B * L], ad[B * L], iw[B * L], w[B * L], slr[B * L], g[B * L], gv[B * L];
    int seq[B * L], pos[B * L], cnt[B];
    double sum[B];
    const int n = gather(mask, logp, lp, seq, pos);
    gather(mask, old, od, NULL, NULL);
    gather(mask, adv, ad, NULL, NULL);
    gather(mask, isw, iw, NULL, NULL);
    int tok[B] = {0}, S = 0;
    for (int k = 0; k < n; k++) tok[seq[k]]++;
    for (int i = 0; i < B; i++) S += tok[i] > 0;
    CHECK(S == 5 && n > 20, "fixture: %d sequences with a loss token (want 5), %d tokens", S, n);
    for (int k = 0; k < n; k++)
        w[k] = (float)loss_agg_weight(LOSS_AGG_SEQ_MEAN_TOKEN_MEAN, tok[seq[k]], n, S, 0);
    gspo_seq_log_ratio(slr, lp, od, seq, w, n, B, sum, cnt);
    for (int k = 0; k < n; k++)
        if (fabs(slr[k] - seqr[seq[k]]) > 1e-6 * fabs(seqr[seq[k]]) + 1e-9) {
            CHECK(0, "sequence %d log ratio: got %.9g want %.9g", seq[k], slr[k], seqr[seq[k]]);
            break;
        }
    const ppo_config cfg = {.clip_ratio_low = clip[0], .clip_ratio_high = clip[1], .clip_ratio_c = 3.0f};
    static const char *const names[2] = {"gspo", "gspo_isw"};
    for (int v = 0; v < 2; v++) {
        char nm[64];
        snprintf(nm, sizeof nm, "%s_loss", names[v]);
        float *want_loss = need(f, nm, NULL);
        snprintf(nm, sizeof nm, "%s_dlogp", names[v]);
        float *want_g = need(f, nm, NULL);
        snprintf(nm, sizeof nm, "%s_clipfrac", names[v]);
        float *want_cf = need(f, nm, NULL);
        if (want_loss && want_g && want_cf) {
            ppo_stats st = {0};
            const double loss = gspo_token_loss(g, lp, od, slr, ad, v ? iw : NULL, w, n, &cfg, &st);
            near(names[v], loss, want_loss[0], 1e-6);
            for (int k = 0; k < n; k++) gv[k] = want_g[pos[k]];
            t_close(names[v], g, gv, n, 1e-9f, 1e-6f);
            near("clipfrac", st.clipfrac_sum / st.n_tokens, want_cf[0], 1e-6);
            CHECK(st.n_tokens == n && st.dual_clip_sum == 0, "stats: %lld tokens", (long long)st.n_tokens);
            /* masked tokens (never gathered) have zero gradient in the reference too */
            double off = 0;
            for (int i = 0; i < B * L; i++)
                if (!(mask[i] > 0)) off += fabs(want_g[i]);
            CHECK(off == 0, "reference gradient outside the mask: %g", off);
        }
        free(want_loss);
        free(want_g);
        free(want_cf);
    }
    /* vanilla PPO on the same tokens, same clip: a different loss (the checks above can fail) */
    ppo_stats sv = {0};
    const ppo_config van = {.clip_ratio_low = clip[0], .clip_ratio_high = clip[1], .clip_ratio_c = 0.0f};
    const double lv = ppo_token_loss(g, lp, od, od, ad, NULL, w, n, &van, &sv);
    float *gl = need(f, "gspo_loss", NULL);
    if (gl) CHECK(fabs(lv - gl[0]) > 1e-3 * fabs(gl[0]), "vanilla %.9g equals gspo %.9g on the fixture", lv, gl[0]);
    free(gl);
    /* a sequence whose tokens are split across two calls would get another mean: the mean is per call */
    float slr2[B * L];
    gspo_seq_log_ratio(slr2, lp, od, seq, w, n / 2, B, sum, cnt);
    int differs = 0;
    for (int k = 0; k < n / 2; k++) differs |= slr2[k] != slr[k];
    CHECK(differs, "a partial sequence's mean must differ from the whole one's (fixture too flat)");
out:
    free(logp); free(old); free(adv); free(mask); free(isw); free(clip); free(seqr);
}

static const char *const KL_NAMES[] = {"k1", "abs", "k2", "k3", "k1+", "abs+", "k3+"};

static void test_kl(const st_file *f) {
    int64_t N = 0;
    float *lp = need(f, "kl_logp", &N), *ref = need(f, "kl_ref", NULL);
    if (!(lp && ref)) goto out;
    float *v = xmalloc((size_t)N * sizeof(float)), *gr = xmalloc((size_t)N * sizeof(float));
    float *acc = xmalloc((size_t)N * sizeof(float)), *ones = xmalloc((size_t)N * sizeof(float));
    float *k3v = NULL;
    for (int64_t i = 0; i < N; i++) ones[i] = 1.0f;
    for (int j = 0; j < 7; j++) {
        kl_type t;
        CHECK(kl_type_parse("actor.kl_loss_type", KL_NAMES[j], &t) == MOERL_OK, "%s parses", KL_NAMES[j]);
        char nm[64];
        snprintf(nm, sizeof nm, "kl_%s_value", KL_NAMES[j]);
        float *wv = need(f, nm, NULL);
        snprintf(nm, sizeof nm, "kl_%s_grad", KL_NAMES[j]);
        float *wg = need(f, nm, NULL);
        if (wv && wg) {
            double total = 0;
            for (int64_t i = 0; i < N; i++) {
                double g;
                v[i] = (float)kl_value(t, lp[i], ref[i], &g);
                gr[i] = (float)g;
                total += v[i];
            }
            t_close(KL_NAMES[j], v, wv, N, 1e-7f, 1e-6f); /* k1's value is a difference of fp32: exact in double */
            t_close(KL_NAMES[j], gr, wg, N, 1e-9f, 1e-6f);
            /* kl_token_loss: Σ w·kl and dlogp += coef·w·grad, on top of what is there */
            for (int64_t i = 0; i < N; i++) acc[i] = 0.5f;
            const double s = kl_token_loss(acc, lp, ref, ones, (int)N, 0.25f, t);
            near("kl_token_loss sum", s, total, 1e-6);
            for (int64_t i = 0; i < N; i++) gr[i] = 0.5f + 0.25f * wg[i];
            t_close("kl_token_loss dlogp", acc, gr, N, 1e-7f, 1e-6f);
            if (j == 3) k3v = wv, wv = NULL;
            if (j == 6 && k3v) { /* k3+ keeps k3's value, takes k2's gradient: the two differ */
                float *k2g = need(f, "kl_k2_grad", NULL);
                CHECK(!memcmp(wv, k3v, (size_t)N * sizeof(float)), "k3+ value = k3 value");
                if (k2g) CHECK(!memcmp(wg, k2g, (size_t)N * sizeof(float)), "k3+ gradient = k2 gradient");
                free(k2g);
            }
        }
        free(wv);
        free(wg);
    }
    /* the legacy k3 entry point equals the k3 type */
    kl_type k3 = {KL_K3, 0};
    for (int64_t i = 0; i < N; i++) acc[i] = gr[i] = 0;
    const double a = kl_k3_token_loss(acc, lp, ref, ones, (int)N, 0.5f), b = kl_token_loss(gr, lp, ref, ones, (int)N, 0.5f, k3);
    CHECK(a == b && !memcmp(acc, gr, (size_t)N * sizeof(float)), "kl_k3_token_loss = kl_token_loss(k3)");
    free(k3v); free(v); free(gr); free(acc); free(ones);
out:
    free(lp);
    free(ref);
}

static void test_reward(const st_file *f) {
    float *old = need(f, "gspo_old", NULL), *ref = need(f, "rew_ref", NULL), *mask = need(f, "gspo_mask", NULL);
    float *score = need(f, "rew_score", NULL), *beta = need(f, "rew_beta", NULL);
    if (!(old && ref && mask && score && beta)) goto out;
    static const char *const names[2] = {"k1", "k3"};
    for (int j = 0; j < 2; j++) {
        kl_type t;
        kl_type_parse("algorithm.kl_penalty", names[j], &t);
        char nm[64];
        snprintf(nm, sizeof nm, "rew_%s_scores", names[j]);
        float *ws = need(f, nm, NULL);
        snprintf(nm, sizeof nm, "rew_%s_current_kl", names[j]);
        float *wk = need(f, nm, NULL);
        if (ws && wk) {
            double mean_sum = 0;
            for (int i = 0; i < B; i++) {
                unsigned char m[L];
                for (int t2 = 0; t2 < L; t2++) m[t2] = mask[i * L + t2] > 0;
                double mean;
                const double s = kl_response_sum(t, old + i * L, ref + i * L, m, L, &mean);
                near(names[j], (double)score[i] - (double)beta[0] * s, ws[i], 1e-6);
                mean_sum += mean;
            }
            near("current_kl", mean_sum / B, wk[0], 1e-6);
        }
        free(ws);
        free(wk);
    }
out:
    free(old); free(ref); free(mask); free(score); free(beta);
}

static void test_controller(const st_file *f) {
    int64_t n = 0;
    float *kl = need(f, "ctrl_kl", &n), *p = need(f, "ctrl_params", NULL), *want = need(f, "ctrl_beta", NULL);
    if (kl && p && want) {
        kl_controller a = {.adaptive = 1, .value = p[0], .target = p[1], .horizon = p[2]};
        kl_controller fx = {.adaptive = 0, .value = p[0], .target = p[1], .horizon = p[2]};
        int ok = 1;
        for (int64_t i = 0; i < n; i++) {
            kl_controller_update(&a, kl[i], (int64_t)p[3]);
            kl_controller_update(&fx, kl[i], (int64_t)p[3]);
            /* a product of ≤ 8 factors in double against float64 rounded to fp32 once */
            if (fabs(a.value - want[i]) > 1e-6 * fabs(want[i])) {
                CHECK(0, "adaptive beta after update %lld: got %.9g want %.9g", (long long)i, a.value, want[i]);
                ok = 0;
            }
        }
        if (ok) CHECK(1, "adaptive sequence");
        CHECK(fx.value == p[0], "fixed controller: beta stays %g, got %g", p[0], fx.value);
        CHECK(fabs(a.value - p[0]) > 1e-3 * p[0], "the adaptive sequence moved beta (fixture too flat)");
    }
    free(kl); free(p); free(want);
}

/* rl_read_config of the defaults plus overrides. */
static int read_with(const char *a, const char *b, rl_config *out) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    int rc = MOERL_OK;
    if (a && cfg_apply_override(c, a) != MOERL_OK) rc = MOERL_ERR;
    if (rc == MOERL_OK && b && cfg_apply_override(c, b) != MOERL_OK) rc = MOERL_ERR;
    rl_config r;
    if (rc == MOERL_OK) rc = rl_read_config(c, &r);
    if (out) *out = r;
    cfg_free(c);
    return rc;
}

static void refused(const char *a, const char *b, const char *want1, const char *want2) {
    int rc = read_with(a, b, NULL);
    CHECK(rc == MOERL_ERR && strstr(moerl_last_error(), want1) && (!want2 || strstr(moerl_last_error(), want2)),
          "%s %s: want an error naming '%s', got %s", a, b ? b : "", want1, rc ? moerl_last_error() : "accepted");
}

static void test_keys(void) {
    rl_config r;
    CHECK(read_with(NULL, NULL, &r) == MOERL_OK, "defaults: %s", moerl_last_error());
    CHECK(r.loss_mode == POLICY_LOSS_VANILLA && r.kl_loss_type.est == KL_K3 && !r.kl_loss_type.straight_through &&
              !r.use_kl_in_reward && r.kl_penalty.est == KL_K1 && !r.kl_ctrl.adaptive && r.kl_ctrl.value == 0.001 &&
              r.kl_ctrl.target == 0.1 && r.kl_ctrl.horizon == 10000,
          "verl's defaults: vanilla, low_var_kl, kl_penalty=kl, fixed 0.001 / 0.1 / 10000");
    CHECK(read_with("actor.policy_loss.loss_mode=gspo", "actor.kl_loss_type=k3+", &r) == MOERL_OK &&
              r.loss_mode == POLICY_LOSS_GSPO && r.kl_loss_type.est == KL_K3 && r.kl_loss_type.straight_through,
          "gspo, k3+: %s", moerl_last_error());
    CHECK(read_with("algorithm.kl_ctrl.type=adaptive", "algorithm.kl_penalty=mse", &r) == MOERL_OK &&
              r.kl_ctrl.adaptive && r.kl_penalty.est == KL_K2,
          "adaptive, mse: %s", moerl_last_error());
    refused("actor.policy_loss.loss_mode=gpg", NULL, "actor.policy_loss.loss_mode", "'gpg'");
    refused("actor.kl_loss_type=full", NULL, "actor.kl_loss_type", "'full'");
    refused("actor.kl_loss_type=k4", NULL, "actor.kl_loss_type", "'k4'");
    refused("actor.kl_loss_type=+", NULL, "actor.kl_loss_type", NULL);
    refused("algorithm.kl_penalty=k3++", NULL, "algorithm.kl_penalty", "'k3++'");
    refused("algorithm.kl_ctrl.type=pid", NULL, "algorithm.kl_ctrl.type", "'pid'");
    refused("algorithm.kl_ctrl.kl_coef=-1", NULL, "algorithm.kl_ctrl.kl_coef", NULL);
    refused("algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0", "algorithm.kl_ctrl.horizon", NULL);
    refused("algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0", "algorithm.kl_ctrl.target_kl", NULL);
    CHECK(read_with("algorithm.kl_ctrl.horizon=0", NULL, NULL) == MOERL_OK, "a fixed controller has no horizon");
    refused("actor.policy_loss.loss_mode=gspo", "actor.use_decoupled_loss=true", "actor.use_decoupled_loss",
            "loss_mode=gspo");
    refused("actor.policy_loss.loss_mode=gspo", "actor.ulysses_sequence_parallel_size=2",
            "actor.ulysses_sequence_parallel_size", "loss_mode=gspo");
    cfg *c = cfg_new();
    rl_def_keys(c);
    const char *keys[] = {"actor.policy_loss.loss_mode", "actor.kl_loss_type", "algorithm.use_kl_in_reward",
                          "algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
                          "algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) CHECK(cfg_has(c, keys[i]), "%s declared", keys[i]);
    cfg_free(c);
}

/* trainer_state.json keeps the controller's β (exact resume): written, read back bit-exact (jansson
 * prints doubles round-trip exactly), null = none, a negative value refused naming the field. */
static void test_state_field(void) {
    rl_state s = {.n_rows = 4, .feed_pos = 1, .last_val_accuracy = NAN, .kl_ctrl_value = 0.0012345678901234567};
    char *txt = rl_state_to_json(&s);
    CHECK(txt != NULL, "state with kl_ctrl_value written: %s", moerl_last_error());
    if (!txt) return;
    rl_state r;
    CHECK(rl_state_parse(&r, txt, strlen(txt), "t.json", NULL) == MOERL_OK && r.kl_ctrl_value == s.kl_ctrl_value,
          "kl_ctrl_value read back: %.17g (%s)", r.kl_ctrl_value, moerl_last_error());
    rl_state_free(&r);
    free(txt);
    s.kl_ctrl_value = NAN;
    txt = rl_state_to_json(&s);
    CHECK(txt && strstr(txt, "\"kl_ctrl_value\": null"), "none is written as null");
    CHECK(txt && rl_state_parse(&r, txt, strlen(txt), "t.json", NULL) == MOERL_OK && isnan(r.kl_ctrl_value),
          "null reads back as none");
    rl_state_free(&r);
    free(txt);
    s.kl_ctrl_value = -1;
    CHECK(rl_state_to_json(&s) == NULL && strstr(moerl_last_error(), "kl_ctrl_value"), "a negative beta is refused");
    static const char bad[] = "{\"format\": \"moerl-rl-state\", \"format_version\": 1, \"version\": 0, "
                              "\"trainer_step\": 0, \"optimizer_step\": 0, \"optimizer_skipped\": 0, "
                              "\"consumed_prompts\": 0, \"feed_epoch\": 0, \"n_rows\": 4, \"feed_pos\": 0, "
                              "\"seed\": 0, \"samples_log_bytes\": 0, \"kl_ctrl_value\": \"big\", "
                              "\"data_fingerprint\": \"ab\", \"unconsumed_started\": []}";
    CHECK(rl_state_parse(&r, bad, strlen(bad), "t.json", NULL) == MOERL_ERR &&
              strstr(moerl_last_error(), "t.json") && strstr(moerl_last_error(), "'kl_ctrl_value'"),
          "a string beta is refused naming file and field: %s", moerl_last_error());
    rl_state_free(&r);
}

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gspo.safetensors", testdata());
    st_file f;
    if (st_open(&f, path) != MOERL_OK) {
        CHECK(0, "cannot open reference %s (run tests/ref/gen_gspo.py %s): %s", path, testdata(), moerl_last_error());
    } else {
        test_gspo(&f);
        test_kl(&f);
        test_reward(&f);
        test_controller(&f);
        st_close(&f);
    }
    test_keys();
    test_state_field();
    TEST_MAIN_END();
}
