/* RL losses (src/rl/losses.h) against
 *   (1) PyTorch: tests/ref/gen_losses.py writes $MOERL_TESTDATA/losses.safetensors with fixed inputs
 *       and float64 autograd results (PPO loss, dlogp, per-token loss and statistics for five
 *       (ε_low, ε_high, c, decoupled, C) settings; GRPO advantages; k3 KL; entropy bonus);
 *   (2) central finite differences of the returned loss with respect to logp, for tokens whose
 *       branch (clip, dual clip, ±20 clamp, k3 value clamp) is the same at logp ± h;
 *   (3) hand-computed cases for each branch of the PPO loss, GRPO and k3.
 * The reference file missing is a failure. */
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

/* The tensor as fp32 (heap), or NULL with a failed CHECK naming it. */
static float *need_f32(const st_file *f, const char *name, int64_t *numel) {
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

static int *need_i32(const st_file *f, const char *name, int64_t *numel) {
    const st_tensor *t = st_find(f, name);
    CHECK(t != NULL && t->dtype == ST_I32, "%s: reference tensor '%s' is missing or not I32", f->path, name);
    if (!t || t->dtype != ST_I32) return NULL;
    int *x = xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof(int));
    memcpy(x, t->data, (size_t)t->numel * sizeof(int));
    if (numel) *numel = t->numel;
    return x;
}

/* |got − want| ≤ tol, printing both on failure. */
static void check_near(const char *what, double got, double want, double tol) {
    CHECK(fabs(got - want) <= tol, "%s: got %.10g want %.10g (tol %.3g)", what, got, want, tol);
}

static ppo_config cfg_from_row(const float *row) {
    ppo_config c = {.clip_ratio_low = row[0], .clip_ratio_high = row[1], .clip_ratio_c = row[2],
                    .decoupled = (int)row[3], .behav_imp_weight_cap = row[4]};
    return c;
}

/* Loss, gradient and statistics of one token with w = 1. */
static double one_token(float lp, float old, float behav, float a, const ppo_config *cfg, float *g, ppo_stats *st) {
    const float w1 = 1.0f;
    float gg;
    ppo_stats s = {0};
    double L = ppo_token_loss(&gg, &lp, &old, &behav, &a, NULL, &w1, 1, cfg, &s);
    if (g) *g = gg;
    if (st) *st = s;
    return L;
}

/* ---------------- (1) PyTorch parity ---------------- */

static void test_ppo_parity(const st_file *f) {
    int64_t N = 0, nc = 0;
    float *logp = need_f32(f, "ppo_logp", &N), *old = need_f32(f, "ppo_old_logp", NULL);
    float *behav = need_f32(f, "ppo_behav_logp", NULL), *adv = need_f32(f, "ppo_adv", NULL);
    float *w = need_f32(f, "ppo_w", NULL), *cfgs = need_f32(f, "ppo_configs", &nc);
    if (!(logp && old && behav && adv && w && cfgs)) goto out;
    const int K = (int)(nc / 5);
    CHECK(K >= 1 && nc % 5 == 0, "ppo_configs has %lld values, expected a multiple of 5", (long long)nc);
    float *dlogp = xmalloc((size_t)N * sizeof(float)), *tok = xmalloc((size_t)N * sizeof(float));
    for (int k = 0; k < K; k++) {
        ppo_config cfg = cfg_from_row(cfgs + 5 * k);
        char name[64], what[96];
        snprintf(name, sizeof name, "ppo%d_dlogp", k);
        float *ref_g = need_f32(f, name, NULL);
        snprintf(name, sizeof name, "ppo%d_loss", k);
        float *ref_loss = need_f32(f, name, NULL);
        snprintf(name, sizeof name, "ppo%d_token_loss", k);
        float *ref_tok = need_f32(f, name, NULL);
        snprintf(name, sizeof name, "ppo%d_stats", k);
        float *ref_st = need_f32(f, name, NULL);
        if (ref_g && ref_loss && ref_tok && ref_st) {
            /* dlogp is documented as overwritten: poison it first. */
            for (int64_t i = 0; i < N; i++) dlogp[i] = NAN;
            /* Statistics accumulate: start from a non-zero state and subtract it afterwards. */
            ppo_stats st = {.loss_sum = 1.0, .clipfrac_sum = 2.0, .kl_sum = 3.0, .dual_clip_sum = 4.0, .n_tokens = 5};
            double loss = ppo_token_loss(dlogp, logp, old, behav, adv, NULL, w, (int)N, &cfg, &st);
            double wabs = 0, labs = 0, xabs = 0;
            for (int64_t i = 0; i < N; i++) {
                if (!(w[i] > 0)) continue;
                wabs += w[i] * fabs(ref_tok[i]);
                labs += fabs(ref_tok[i]);
                xabs += fabs((double)logp[i] - old[i]);
            }
            /* Both sides are float64 math on the same fp32 inputs, rounded to fp32 once; libm's
             * and torch's exp may differ by an ulp of double, which can move the fp32 rounding by
             * an ulp (6e-8 relative): rtol 1e-6 leaves margin, while a formula error is ≥ 1e-2.
             * atol 1e-12 only admits exact zeros (clipped tokens are exactly 0 on both sides; any
             * real gradient here is ≥ 1e-9·w). */
            snprintf(what, sizeof what, "config %d: dlogp", k);
            t_close(what, dlogp, ref_g, N, 1e-12f, 1e-6f);
            /* Sums: the reference is stored in fp32 (6e-8 relative), and terms of both signs cancel,
             * so the tolerance scales with Σ|terms|. */
            snprintf(what, sizeof what, "config %d: Σ w·L", k);
            check_near(what, loss, ref_loss[0], 1e-6 * wabs + 1e-12);
            snprintf(what, sizeof what, "config %d: stats.loss_sum", k);
            check_near(what, st.loss_sum - 1.0, ref_st[0], 1e-6 * labs + 1e-9);
            /* Branch counts are integers and no token lies near a branch boundary (the generator
             * guarantees a relative margin of 1e-3), so they must match exactly. */
            snprintf(what, sizeof what, "config %d: stats.clipfrac_sum", k);
            check_near(what, st.clipfrac_sum - 2.0, ref_st[1], 0.0);
            snprintf(what, sizeof what, "config %d: stats.kl_sum", k);
            check_near(what, st.kl_sum - 3.0, ref_st[2], 1e-6 * xabs + 1e-9);
            snprintf(what, sizeof what, "config %d: stats.dual_clip_sum", k);
            check_near(what, st.dual_clip_sum - 4.0, ref_st[3], 0.0);
            CHECK(st.n_tokens - 5 == (int64_t)ref_st[4], "config %d: n_tokens %lld want %lld", k,
                  (long long)(st.n_tokens - 5), (long long)ref_st[4]);
            /* Per-token loss (w-free), every token including those with w = 0 in the batch. */
            for (int64_t i = 0; i < N; i++) tok[i] = (float)one_token(logp[i], old[i], behav[i], adv[i], &cfg, NULL, NULL);
            snprintf(what, sizeof what, "config %d: per-token loss", k);
            t_close(what, tok, ref_tok, N, 1e-12f, 1e-6f); /* same reasoning as dlogp */
        }
        free(ref_g); free(ref_loss); free(ref_tok); free(ref_st);
    }
    free(dlogp); free(tok);
out:
    free(logp); free(old); free(behav); free(adv); free(w); free(cfgs);
}

static void test_grpo_parity(const st_file *f) {
    int64_t N = 0, G = 0;
    float *r = need_f32(f, "grpo_rewards", &N), *ref = need_f32(f, "grpo_adv", NULL), *eps = need_f32(f, "grpo_eps", NULL);
    int *sizes = need_i32(f, "grpo_group_size", &G);
    if (r && ref && eps && sizes) {
        float *a = xmalloc((size_t)N * sizeof(float));
        grpo_advantages(a, r, sizes, (int)G, eps[0]);
        /* float64 on both sides from the same fp32 rewards; fp32 rounding of the result only
         * (and one ulp of sqrt): rtol 1e-6. atol 1e-12: the identical-reward group is exactly 0. */
        t_close("grpo advantages", a, ref, N, 1e-12f, 1e-6f);
        free(a);
    }
    free(r); free(ref); free(eps); free(sizes);
}

static void test_k3_parity(const st_file *f) {
    int64_t N = 0;
    float *lp = need_f32(f, "k3_logp", &N), *ref = need_f32(f, "k3_ref_logp", NULL), *w = need_f32(f, "k3_w", NULL);
    float *init = need_f32(f, "k3_dlogp_init", NULL), *coef = need_f32(f, "k3_coef", NULL);
    float *want_loss = need_f32(f, "k3_loss", NULL), *want_g = need_f32(f, "k3_dlogp", NULL);
    if (lp && ref && w && init && coef && want_loss && want_g) {
        float *g = xmalloc((size_t)N * sizeof(float));
        memcpy(g, init, (size_t)N * sizeof(float)); /* kl_k3_token_loss accumulates into dlogp */
        double kl = kl_k3_token_loss(g, lp, ref, w, (int)N, coef[0]);
        /* Every k3 term is ≥ 0 (no cancellation); the reference is stored in fp32: rtol 1e-6. */
        check_near("k3: Σ w·kl", kl, want_loss[0], 1e-6 * fabs(want_loss[0]));
        /* init + coef·w·∂kl/∂logp rounded to fp32 once on both sides: rtol 1e-6 as for PPO;
         * atol 1e-7 covers an fp32 ulp of the init value (|init| ≤ ~4) where the update is tiny. */
        t_close("k3: dlogp (accumulated)", g, want_g, N, 1e-6f, 1e-6f);
        free(g);
    }
    free(lp); free(ref); free(w); free(init); free(coef); free(want_loss); free(want_g);
}

static void test_entropy_parity(const st_file *f) {
    int64_t N = 0;
    float *H = need_f32(f, "ent_entropy", &N), *w = need_f32(f, "ent_w", NULL), *coef = need_f32(f, "ent_coef", NULL);
    float *want_sum = need_f32(f, "ent_sum", NULL), *want_g = need_f32(f, "ent_dentropy", NULL);
    if (H && w && coef && want_sum && want_g) {
        float *g = xmalloc((size_t)N * sizeof(float));
        for (int64_t i = 0; i < N; i++) g[i] = NAN; /* documented as written, not accumulated */
        double s = entropy_bonus(g, H, w, (int)N, coef[0]);
        check_near("entropy: Σ w·H", s, want_sum[0], 1e-6 * fabs(want_sum[0])); /* fp32-stored reference */
        t_close("entropy: dentropy", g, want_g, N, 1e-12f, 1e-6f);           /* −coef·w, one rounding */
        free(g);
    }
    free(H); free(w); free(coef); free(want_sum); free(want_g);
}

/* ---------------- (2) finite differences ---------------- */

static void test_ppo_fd(const st_file *f) {
    int64_t N = 0, nc = 0;
    float *logp = need_f32(f, "ppo_logp", &N), *old = need_f32(f, "ppo_old_logp", NULL);
    float *behav = need_f32(f, "ppo_behav_logp", NULL), *adv = need_f32(f, "ppo_adv", NULL);
    float *cfgs = need_f32(f, "ppo_configs", &nc);
    if (logp && old && behav && adv && cfgs) {
        const double h = 1e-3;
        for (int k = 0; k < nc / 5; k++) {
            ppo_config cfg = cfg_from_row(cfgs + 5 * k);
            int tested = 0, nonzero = 0;
            double worst = 0;
            int64_t wi = -1;
            for (int64_t i = 0; i < N; i++) {
                const double x = (double)logp[i] - old[i];
                if (fabs(fabs(x) - 20.0) < 4 * h) continue; /* the ±20 clamp lies inside the stencil */
                const float lp_p = (float)(logp[i] + h), lp_m = (float)(logp[i] - h);
                float g;
                ppo_stats s0, sp, sm;
                one_token(logp[i], old[i], behav[i], adv[i], &cfg, &g, &s0);
                const double Lp = one_token(lp_p, old[i], behav[i], adv[i], &cfg, NULL, &sp);
                const double Lm = one_token(lp_m, old[i], behav[i], adv[i], &cfg, NULL, &sm);
                if (sp.clipfrac_sum != s0.clipfrac_sum || sm.clipfrac_sum != s0.clipfrac_sum ||
                    sp.dual_clip_sum != s0.dual_clip_sum || sm.dual_clip_sum != s0.dual_clip_sum)
                    continue; /* a clip boundary lies inside the stencil */
                /* Divide by the step actually taken after fp32 rounding of logp ± h. */
                const double fd = (Lp - Lm) / ((double)lp_p - (double)lp_m);
                /* L is −A·bw·e^x on a smooth branch (or constant): the central-difference error is
                 * h²/6·|L'''| = h²/6·|L'| ≈ 1.7e-7 relative, the fp32 rounding of g 6e-8: rtol 1e-5.
                 * atol 1e-9 for exact-zero gradients. */
                const double r = fabs(fd - g) / (1e-9 + 1e-5 * fabs(g));
                if (r > worst) { worst = r; wi = i; }
                tested++;
                nonzero += g != 0.0f;
            }
            CHECK(worst <= 1.0, "config %d: dlogp vs central difference: worst token %lld (ratio %.3g)", k,
                  (long long)wi, worst);
            /* The stencil must not skip most tokens, and must see live (non-zero) gradients. */
            CHECK(tested >= N / 2 && nonzero >= 10, "config %d: only %d tokens FD-tested (%d with a non-zero gradient)",
                  k, tested, nonzero);
        }
    }
    free(logp); free(old); free(behav); free(adv); free(cfgs);
}

static void test_k3_fd(const st_file *f) {
    int64_t N = 0;
    float *lp = need_f32(f, "k3_logp", &N), *ref = need_f32(f, "k3_ref_logp", NULL);
    if (lp && ref) {
        const double h = 1e-3;
        const float w1 = 1.0f;
        int tested = 0;
        double worst = 0;
        int64_t wi = -1;
        for (int64_t i = 0; i < N; i++) {
            const double d = (double)ref[i] - lp[i];
            const double kl = exp(d) - d - 1;
            if (fabs(kl - 10.0) < 0.1 || fabs(fabs(d) - 20.0) < 4 * h) continue; /* clamp inside the stencil */
            float g = 0, lpp = (float)(lp[i] + h), lpm = (float)(lp[i] - h), gd = 0;
            kl_k3_token_loss(&g, &lp[i], &ref[i], &w1, 1, 1.0f);
            const double Lp = kl_k3_token_loss(&gd, &lpp, &ref[i], &w1, 1, 1.0f);
            const double Lm = kl_k3_token_loss(&gd, &lpm, &ref[i], &w1, 1, 1.0f);
            const double fd = (Lp - Lm) / ((double)lpp - (double)lpm);
            /* kl''' wrt logp is −e^δ: central-difference error ≤ h²/6·e^(|δ|+h); plus fp32 rounding of g. */
            const double tol = (h * h / 6.0) * exp(fabs(d) + h) * 1.5 + 1e-6 * fabs(g) + 1e-9;
            const double r = fabs(fd - g) / tol;
            if (r > worst) { worst = r; wi = i; }
            tested++;
        }
        CHECK(worst <= 1.0, "k3: dlogp vs central difference: worst token %lld (ratio %.3g)", (long long)wi, worst);
        CHECK(tested >= N / 2, "k3: only %d of %lld tokens FD-tested", tested, (long long)N);
    }
    free(lp); free(ref);
}

/* ---------------- (3) hand-computed cases ---------------- */

static void test_ppo_hand(void) {
    const ppo_config base = {.clip_ratio_low = 0.2f, .clip_ratio_high = 0.2f, .clip_ratio_c = 3.0f,
                             .decoupled = 0, .behav_imp_weight_cap = 2.0f};
    const float old = -1.0f;
    float g;
    ppo_stats s;
    double L;
    /* Values are double math on fp32 inputs; the log-ratios below are fp32-rounded, so the ratio
     * is exact only to ~1e-7 relative: tolerances 1e-6 (relative to the value). */
#define LP(ratio) ((float)(old + log(ratio)))
#define RATIO(lp) exp((double)(lp) - (double)old)

    /* A > 0, r = 1.5 > 1 + ε: clipped at 1.2, L = −1.2·A, gradient exactly 0, clipfrac 1. */
    L = one_token(LP(1.5), old, 0, 2.0f, &base, &g, &s);
    check_near("A>0 r>1+ε: L", L, -2.4, 1e-6);
    CHECK(g == 0.0f && s.clipfrac_sum == 1 && s.dual_clip_sum == 0, "A>0 r>1+ε: g %g clip %g dual %g", g,
          s.clipfrac_sum, s.dual_clip_sum);
    /* A > 0, r = 1.1 inside: L = −A·r, dL/dlogp = −A·r. */
    float lp = LP(1.1);
    L = one_token(lp, old, 0, 2.0f, &base, &g, &s);
    check_near("A>0 inside: L", L, -2.0 * RATIO(lp), 1e-6);
    check_near("A>0 inside: g", g, -2.0 * RATIO(lp), 1e-6);
    CHECK(s.clipfrac_sum == 0, "A>0 inside: clipfrac %g", s.clipfrac_sum);
    /* A > 0, r = 0.5 < 1 − ε: the unclipped branch is larger, gradient flows: −A·r. */
    lp = LP(0.5);
    L = one_token(lp, old, 0, 1.0f, &base, &g, &s);
    check_near("A>0 r<1−ε: L", L, -RATIO(lp), 1e-6);
    check_near("A>0 r<1−ε: g", g, -RATIO(lp), 1e-6);
    CHECK(s.clipfrac_sum == 0, "A>0 r<1−ε: clipfrac %g", s.clipfrac_sum);
    /* A < 0, r = 0.5 < 1 − ε: clipped at 0.8, L = 0.8·|A|, gradient 0. */
    L = one_token(LP(0.5), old, 0, -1.0f, &base, &g, &s);
    check_near("A<0 r<1−ε: L", L, 0.8, 1e-6);
    CHECK(g == 0.0f && s.clipfrac_sum == 1 && s.dual_clip_sum == 0, "A<0 r<1−ε: g %g clip %g", g, s.clipfrac_sum);
    /* A < 0, 1 + ε < r = 2 < c: unclipped, L = −A·r, gradient −A·r. */
    lp = LP(2.0);
    L = one_token(lp, old, 0, -1.0f, &base, &g, &s);
    check_near("A<0 1+ε<r<c: L", L, RATIO(lp), 1e-6);
    check_near("A<0 1+ε<r<c: g", g, RATIO(lp), 1e-6);
    CHECK(s.clipfrac_sum == 0 && s.dual_clip_sum == 0, "A<0 1+ε<r<c: clip %g dual %g", s.clipfrac_sum, s.dual_clip_sum);
    /* A < 0, r = e^5 ≫ c: dual clip, L = −A·c = 6, gradient 0; not counted as PPO-clipped. */
    L = one_token((float)(old + 5.0), old, 0, -2.0f, &base, &g, &s);
    check_near("dual clip: L", L, 6.0, 1e-12);
    CHECK(g == 0.0f && s.dual_clip_sum == 1 && s.clipfrac_sum == 0, "dual clip: g %g dual %g clip %g", g,
          s.dual_clip_sum, s.clipfrac_sum);
    /* Same token with c ≤ 1 (dual clip off): L = −A·r. */
    ppo_config nodual = base;
    nodual.clip_ratio_c = 1.0f;
    lp = (float)(old + 5.0);
    L = one_token(lp, old, 0, -2.0f, &nodual, &g, &s);
    check_near("no dual clip: L", L, 2.0 * RATIO(lp), 1e-6 * 2.0 * RATIO(lp));
    check_near("no dual clip: g", g, 2.0 * RATIO(lp), 1e-6 * 2.0 * RATIO(lp));
    CHECK(s.dual_clip_sum == 0, "no dual clip: dual %g", s.dual_clip_sum);
    /* ±20 clamp: log-ratio 25 → r = e^20 (not e^25), gradient 0; ppo_kl summand −20. */
    L = one_token((float)(old + 25.0), old, 0, -1.0f, &nodual, &g, &s);
    check_near("ratio clamp +20: L", L, exp(20.0), 1e-9 * exp(20.0)); /* x is clamped to exactly 20 */
    check_near("ratio clamp +20: kl", s.kl_sum, -20.0, 0.0);
    CHECK(g == 0.0f, "ratio clamp +20: g %g, want exactly 0", g);
    /* log-ratio −25 with A > 0: unclipped branch, value −A·e^−20, gradient exactly 0 (clamped). */
    L = one_token((float)(old - 25.0), old, 0, 1.0f, &base, &g, &s);
    check_near("ratio clamp −20: L", L, -exp(-20.0), 1e-12 * exp(-20.0));
    check_near("ratio clamp −20: kl", s.kl_sum, 20.0, 0.0);
    CHECK(g == 0.0f && s.clipfrac_sum == 0, "ratio clamp −20: g %g (want exactly 0) clip %g", g, s.clipfrac_sum);
    /* A = 0: L = 0 and gradient 0 everywhere. */
    L = one_token(LP(1.5), old, 0, 0.0f, &base, &g, &s);
    CHECK(L == 0.0 && g == 0.0f && s.clipfrac_sum == 0 && s.dual_clip_sum == 0, "A=0: L %g g %g", L, g);
    /* Clip-higher: ε_high = 0.28, r = 1.25 is inside for A > 0 (would be clipped with 0.2). */
    ppo_config dapo = base;
    dapo.clip_ratio_high = 0.28f;
    lp = LP(1.25);
    L = one_token(lp, old, 0, 1.0f, &dapo, &g, &s);
    check_near("clip-higher: L", L, -RATIO(lp), 1e-6);
    CHECK(s.clipfrac_sum == 0 && g != 0.0f, "clip-higher: clip %g g %g", s.clipfrac_sum, g);

    /* Decoupled: anchor = prox; weight exp(prox − μ) scales value and gradient; above the cap C
     * the token is filtered out (AReaL: weight 0), counted in behav_dropped_sum. */
    ppo_config dec = base;
    dec.decoupled = 1;
    lp = LP(1.1);
    L = one_token(lp, old, (float)(old - log(1.5)), 1.0f, &dec, &g, &s);
    const double w15 = exp((double)old - (double)(float)(old - log(1.5)));
    check_near("decoupled weight 1.5: L", L, -RATIO(lp) * w15, 1e-6);
    check_near("decoupled weight 1.5: g", g, -RATIO(lp) * w15, 1e-6);
    {
        ppo_stats sd = {0};
        L = one_token(lp, old, (float)(old - log(3.0)), 1.0f, &dec, &g, &sd);
        CHECK(L == 0.0 && g == 0.0f, "decoupled weight 3 > cap 2 is filtered out: L %g g %g", L, (double)g);
        CHECK(sd.behav_dropped_sum == 1 && sd.n_tokens == 1, "filtered token counted as dropped (%g of %lld)",
              sd.behav_dropped_sum, (long long)sd.n_tokens);
    }
    /* Clipped token stays gradient-free under the weight. */
    L = one_token(LP(1.5), old, (float)(old - log(1.5)), 1.0f, &dec, &g, &s);
    check_near("decoupled clipped: L", L, -1.2 * w15, 1e-6);
    CHECK(g == 0.0f, "decoupled clipped: g %g", g);
    /* Non-decoupled mode ignores behav_logp (NULL allowed). */
    {
        float l1 = LP(1.1), a1 = 1.0f, w1 = 1.0f, g1;
        L = ppo_token_loss(&g1, &l1, &old, NULL, &a1, NULL, &w1, 1, &base, NULL);
        check_near("behav NULL, not decoupled: L", L, -RATIO(l1), 1e-6);
    }

    /* Weights: w scales value and gradient; w = 0 tokens get dlogp 0, no stats, even with NaN inputs. */
    {
        float l[3] = {LP(1.1), NAN, LP(0.9)}, o[3] = {old, old, old}, a[3] = {1.0f, NAN, -1.0f};
        float w[3] = {0.25f, 0.0f, 0.5f}, gg[3] = {NAN, NAN, NAN};
        ppo_stats st = {0};
        L = ppo_token_loss(gg, l, o, NULL, a, NULL, w, 3, &base, &st);
        const double r0 = RATIO(l[0]), r2 = RATIO(l[2]);
        check_near("weighted sum", L, 0.25 * -r0 + 0.5 * r2, 1e-6);
        check_near("weighted g0", gg[0], 0.25 * -r0, 1e-6);
        CHECK(gg[1] == 0.0f, "w=0 token: dlogp %g, want 0", gg[1]);
        check_near("weighted g2", gg[2], 0.5 * r2, 1e-6);
        CHECK(st.n_tokens == 2, "w=0 token counted: n_tokens %lld", (long long)st.n_tokens);
        check_near("stats.loss_sum is w-free", st.loss_sum, -r0 + r2, 1e-6);
        check_near("stats.kl_sum", st.kl_sum, -((double)l[0] - old) - ((double)l[2] - old), 1e-9);
    }
#undef LP
#undef RATIO
}

static void test_grpo_hand(void) {
    /* groups: [1, 0] → mean 0.5, unbiased std √0.5 → ±0.5/√0.5 = ±√0.5;
     * [3] (singleton) → 3/(1 + eps); [2, 2, 2] → std 0 → A = 0 exactly (eps keeps it finite). */
    const float r[6] = {1.0f, 0.0f, 3.0f, 2.0f, 2.0f, 2.0f};
    const int sizes[3] = {2, 1, 3};
    float a[6];
    grpo_advantages(a, r, sizes, 3, 1e-6f);
    const double s = sqrt(0.5), e = (double)1e-6f;
    check_near("grpo pair +", a[0], 0.5 / (s + e), 1e-6); /* fp32 result */
    check_near("grpo pair −", a[1], -0.5 / (s + e), 1e-6);
    check_near("grpo singleton", a[2], 3.0 / (1.0 + e), 1e-6);
    CHECK(a[3] == 0.0f && a[4] == 0.0f && a[5] == 0.0f, "grpo identical rewards: %g %g %g, want 0", a[3], a[4], a[5]);
}

static void test_k3_hand(void) {
    const float w1 = 1.0f;
    /* ref = logp: kl 0, gradient 0. */
    float lp = -1.3f, ref = -1.3f, g = 0.5f;
    double kl = kl_k3_token_loss(&g, &lp, &ref, &w1, 1, 1.0f);
    CHECK(kl == 0.0 && g == 0.5f, "k3 equal: kl %g, dlogp %g (want 0, unchanged 0.5)", kl, g);
    /* δ = ln 2: kl = 2 − ln 2 − 1, ∂kl/∂logp = 1 − 2 = −1; coef 0.1, w 0.5 → adds −0.05. */
    lp = -2.0f;
    ref = (float)(-2.0 + log(2.0));
    const double d = (double)ref - lp;
    const float w5 = 0.5f;
    g = 1.0f;
    kl = kl_k3_token_loss(&g, &lp, &ref, &w5, 1, 0.1f);
    check_near("k3 δ=ln2: kl", kl, 0.5 * (exp(d) - d - 1), 1e-12);
    check_near("k3 δ=ln2: dlogp accumulates", g, 1.0 + 0.1 * 0.5 * (1 - exp(d)), 1e-6);
    /* δ = 4: kl = e^4 − 5 ≈ 49.6 → clamped to 10, gradient 0. */
    lp = -5.0f;
    ref = -1.0f;
    g = 0.0f;
    kl = kl_k3_token_loss(&g, &lp, &ref, &w1, 1, 1.0f);
    CHECK(kl == 10.0 && g == 0.0f, "k3 value clamp: kl %g (want 10) dlogp %g (want 0)", kl, g);
    /* w = 0: nothing added, nothing summed (NaN input ignored). */
    float z = 0.0f, nanv = NAN;
    g = 0.25f;
    kl = kl_k3_token_loss(&g, &nanv, &ref, &z, 1, 1.0f);
    CHECK(kl == 0.0 && g == 0.25f, "k3 w=0: kl %g dlogp %g", kl, g);
}

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/losses.safetensors", testdata());
    st_file f;
    if (st_open(&f, path) != MOERL_OK) {
        CHECK(0, "cannot open reference %s (run tests/ref/gen_losses.py %s): %s", path, testdata(), moerl_last_error());
    } else {
        test_ppo_parity(&f);
        test_grpo_parity(&f);
        test_k3_parity(&f);
        test_entropy_parity(&f);
        test_ppo_fd(&f);
        test_k3_fd(&f);
        st_close(&f);
    }
    test_ppo_hand();
    test_grpo_hand();
    test_k3_hand();
    TEST_MAIN_END();
}
