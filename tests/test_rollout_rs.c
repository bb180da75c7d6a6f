/* Rollout rejection sampling (algorithm.rollout_correction.rollout_rs / rollout_rs_threshold) and the
 * training/rollout mismatch metrics (training/rollout_probs_diff_*, rollout_actor_probs_pearson_corr):
 *   (1) PyTorch: tests/ref/gen_rollout_rs.py writes $MOERL_TESTDATA/rollout_rs.safetensors — every option
 *       (token / seq_sum / seq_mean / seq_max, k1/k2/k3), a single k1 bound, chained and repeated options,
 *       a case that rejects nothing, exact threshold edges; the kept masks (exact), verl's metric names
 *       (exact) and values, and the mismatch metrics, on a batch with an empty row, tool-turn holes
 *       holding garbage logprobs, a one-token row and a row past the ±20 clamp;
 *   (2) edges without a reference: no loss token at all (NaN metrics, as verl raises), an empty response;
 *       the statistics summed in two halves equal the whole (what the trainer ranks do);
 *   (3) the config keys: defaults off, bad values refused naming key and value, bypass mode refused;
 *   (4) the trainer (trainer_step on a tiny model): a step with rejection gives exactly the gradient of
 *       the same step with the rejected tokens masked out of the responses by hand, for every
 *       loss_agg_mode, token and sequence rejection, with rollout_is=token at once and a multi-turn
 *       mask; the controls (no rejection) differ; the metrics of a known case (behaviour = the trainer's
 *       own logprobs: diff exactly 0, correlation 1, kl 0, ppl ratio 1, chi2 0, nothing rejected; and a
 *       known rejected share). Off-policy diagnostics (verl compute_offpolicy_metrics) against the
 *       reference too.
 * Tolerances: (1) C and the reference both compute in double from the same fp32 inputs, the sums in
 * different orders: rtol 1e-9 (the k3 values reach e^20, summed with O(1) ones) + atol 1e-12.
 * (4) gradients compared exactly: the masked-by-hand step runs the same arithmetic on the same tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rl/losses.h"
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
    const size_t es = dt == ST_F64 ? 8 : 4;
    void *x = xcalloc((size_t)(t->numel ? t->numel : 1) + 1, es);
    memcpy(x, t->data, (size_t)t->numel * es);
    if (numel) *numel = t->numel;
    return x;
}

/* An I32 byte tensor as a C string (the reference's option and threshold strings, names). */
static char *need_str(const st_file *f, const char *name) {
    int64_t n = 0;
    int *b = need(f, name, ST_I32, &n);
    if (!b) return NULL;
    char *s = xmalloc((size_t)n + 1);
    for (int64_t i = 0; i < n; i++) s[i] = (char)b[i];
    s[n] = 0;
    free(b);
    return s;
}

#define RB 9
#define RL 10

static void near(const char *what, double got, double want) {
    const int ok = (isnan(got) && isnan(want)) || fabs(got - want) <= 1e-12 + 1e-9 * fabs(want);
    CHECK(ok, "%s: got %.12g want %.12g", what, got, want);
}

static void test_reference_case(const st_file *f, int i, const float *old, const float *behav,
                                const unsigned char *mask) {
    char key[64];
    snprintf(key, sizeof key, "case%d.rs", i);
    char *rs = need_str(f, key);
    snprintf(key, sizeof key, "case%d.thr", i);
    char *thr = need_str(f, key);
    snprintf(key, sizeof key, "case%d.names", i);
    char *names = need_str(f, key);
    snprintf(key, sizeof key, "case%d.keep", i);
    float *keep_ref = need(f, key, ST_F32, NULL);
    snprintf(key, sizeof key, "case%d.vals", i);
    int64_t nv = 0;
    double *vals_ref = need(f, key, ST_F64, &nv);
    rollout_rs_config c;
    if (!(rs && thr && names && keep_ref && vals_ref)) goto out;
    if (rollout_rs_parse(rs, thr, &c) != MOERL_OK) {
        CHECK(0, "case %d (%s / %s): %s", i, rs, thr, moerl_last_error());
        goto out;
    }
    rollout_rs_stats st;
    rollout_rs_stats_init(&st);
    unsigned char keep[RB * RL];
    int rejected = 0, keep_ok = 1;
    for (int b = 0; b < RB; b++)
        rejected += rollout_rs_sequence(&c, old + b * RL, behav + b * RL, mask + b * RL, RL, keep + b * RL, &st);
    int want_rej = 0;
    for (int t = 0; t < RB * RL; t++) {
        keep_ok &= keep[t] == (keep_ref[t] > 0.5f);
        want_rej += mask[t] && !(keep_ref[t] > 0.5f);
    }
    CHECK(keep_ok, "case %d (%s / %s): the kept mask differs from the reference", i, rs, thr);
    CHECK(rejected == want_rej, "case %d: %d rejected, want %d", i, rejected, want_rej);
    char nm[ROLLOUT_RS_MAX_METRICS][ROLLOUT_RS_NAME_LEN];
    double v[ROLLOUT_RS_MAX_METRICS];
    const int n = rollout_rs_metrics(&c, &st, nm, v);
    CHECK(n == nv, "case %d: %d metrics, the reference has %lld", i, n, (long long)nv);
    char *save = NULL, *tok = strtok_r(names, "\n", &save);
    for (int k = 0; k < n && k < nv; k++, tok = strtok_r(NULL, "\n", &save)) {
        CHECK(tok && !strcmp(tok, nm[k]), "case %d: metric %d is %s, the reference's %s", i, k, nm[k], tok ? tok : "-");
        char what[160];
        snprintf(what, sizeof what, "case %d (%s / %s) %s", i, rs, thr, nm[k]);
        near(what, v[k], vals_ref[k]);
    }
    /* the statistics of two halves summed (maxima maxed) equal the whole: the trainer ranks' reduction */
    rollout_rs_stats a, b2;
    rollout_rs_stats_init(&a);
    rollout_rs_stats_init(&b2);
    for (int r = 0; r < RB; r++)
        rollout_rs_sequence(&c, old + r * RL, behav + r * RL, mask + r * RL, RL, keep, r < 4 ? &a : &b2);
    for (int k = 0; k < RS_N_SUMS; k++) a.sum[k] += b2.sum[k];
    for (int k = 0; k < RS_N_MAXS; k++) a.max[k] = fmax(a.max[k], b2.max[k]);
    double v2[ROLLOUT_RS_MAX_METRICS];
    rollout_rs_metrics(&c, &a, NULL, v2);
    for (int k = 0; k < n; k++) near("two halves reduced", v2[k], v[k]);
out:
    free(rs); free(thr); free(names); free(keep_ref); free(vals_ref);
}

static void test_reference(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/rollout_rs.safetensors", testdata());
    st_file f;
    if (st_open(&f, path) != MOERL_OK) {
        CHECK(0, "cannot open %s (run tests/ref/gen_rollout_rs.py): %s", path, moerl_last_error());
        return;
    }
    float *old = need(&f, "old", ST_F32, NULL), *behav = need(&f, "behav", ST_F32, NULL),
          *maskf = need(&f, "mask", ST_F32, NULL);
    int *nc = need(&f, "n_cases", ST_I32, NULL);
    double *mm_ref = need(&f, "mismatch", ST_F64, NULL), *op_ref = need(&f, "offpolicy", ST_F64, NULL);
    if (old && behav && maskf && nc && mm_ref && op_ref) {
        unsigned char mask[RB * RL];
        for (int t = 0; t < RB * RL; t++) mask[t] = maskf[t] > 0.5f;
        CHECK(nc[0] >= 16, "the reference has %d cases", nc[0]);
        for (int i = 0; i < nc[0]; i++) test_reference_case(&f, i, old, behav, mask);
        probs_mismatch_stats mm;
        probs_mismatch_init(&mm);
        for (int b = 0; b < RB; b++) probs_mismatch_add(&mm, old + b * RL, behav + b * RL, mask + b * RL, RL);
        double got[4];
        probs_mismatch_finish(&mm, &got[0], &got[1], &got[2], &got[3]);
        const char *what[4] = {"rollout_probs_diff_max", "rollout_probs_diff_mean", "rollout_probs_diff_std",
                               "rollout_actor_probs_pearson_corr"};
        for (int k = 0; k < 4; k++) near(what[k], got[k], mm_ref[k]);
        offpolicy_stats op;
        offpolicy_init(&op);
        for (int b = 0; b < RB; b++) offpolicy_add(&op, old + b * RL, behav + b * RL, mask + b * RL, RL);
        const char *on[OFFPOLICY_N_METRICS];
        double ov[OFFPOLICY_N_METRICS];
        offpolicy_metrics(&op, on, ov);
        /* row 6's token past the clamp makes k3_kl ~ e^23: still double vs double, same rtol */
        for (int k = 0; k < OFFPOLICY_N_METRICS; k++) near(on[k], ov[k], op_ref[k]);
        offpolicy_init(&op);
        offpolicy_metrics(&op, NULL, ov);
        CHECK(isnan(ov[0]) && isnan(ov[12]), "off-policy metrics of nothing: NaN");
    }
    free(old); free(behav); free(maskf); free(nc); free(mm_ref); free(op_ref);
    st_close(&f);
}

/* No loss token anywhere: nothing kept, no rejection, every metric NaN (verl raises there); an empty
 * response counts only as a sequence. Mismatch of nothing is NaN; of identical logprobs 0 and 1. */
static void test_edges(void) {
    rollout_rs_config c;
    CHECK(rollout_rs_parse("token_k1,seq_mean_k3", "0.5_2,0.1", &c) == MOERL_OK && c.n == 2, "parse");
    const float old[4] = {-1, -2, -3, -4}, behav[4] = {-5, -1, -0.5f, -9};
    const unsigned char none[4] = {0, 0, 0, 0};
    unsigned char keep[4] = {9, 9, 9, 9};
    rollout_rs_stats st;
    rollout_rs_stats_init(&st);
    CHECK(rollout_rs_sequence(&c, old, behav, none, 4, keep, &st) == 0 && !keep[0] && !keep[1] && !keep[2] && !keep[3],
          "all masked: nothing kept, nothing rejected");
    CHECK(rollout_rs_sequence(&c, old, behav, NULL, 0, keep, &st) == 0, "an empty response");
    CHECK(st.sum[RS_HEAD_SEQ] == 2 && st.sum[RS_HEAD_TOK] == 0 && st.sum[RS_HEAD_SEQ_VALID] == 0, "counts");
    double v[ROLLOUT_RS_MAX_METRICS];
    const int n = rollout_rs_metrics(&c, &st, NULL, v);
    int all_nan = n == 15 + 14 + 2;
    for (int k = 0; k < n; k++) all_nan &= isnan(v[k]) != 0;
    CHECK(all_nan, "no loss token: %d metrics, all NaN", n);
    /* one token: std 0 (verl needs 2 tokens), seq_std 0 */
    rollout_rs_stats_init(&st);
    const unsigned char one[1] = {1};
    CHECK(rollout_rs_sequence(&c, old, behav, one, 1, keep, &st) == 1 && keep[0] == 0,
          "lr = 4: token_k1 0.5_2 rejects it");
    rollout_rs_metrics(&c, &st, NULL, v);
    CHECK(v[0] == -4.0 && v[3] == 0.0 && v[7] == 0.0 && v[13] == 1.0 && v[14] == 1.0,
          "one token: mean %g std %g seq_std %g masked %g seq_masked %g", v[0], v[3], v[7], v[13], v[14]);
    probs_mismatch_stats mm;
    probs_mismatch_init(&mm);
    double a, b, s, r;
    probs_mismatch_finish(&mm, &a, &b, &s, &r);
    CHECK(isnan(a) && isnan(b) && isnan(s) && isnan(r), "no token: NaN mismatch metrics");
    probs_mismatch_add(&mm, old, old, NULL, 4);
    probs_mismatch_finish(&mm, &a, &b, &s, &r);
    CHECK(a == 0 && b == 0 && s == 0 && fabs(r - 1) < 1e-12, "identical: max %g mean %g std %g corr %.17g", a, b, s, r);
}

/* rl_read_config of the defaults plus overrides (NULL-terminated). */
static int read_keys(const char **kv, rl_config *out) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    int rc = MOERL_OK;
    for (int i = 0; kv[i] && rc == MOERL_OK; i++) rc = cfg_apply_override(c, kv[i]);
    rl_config r;
    if (rc == MOERL_OK) rc = rl_read_config(c, &r);
    if (out && rc == MOERL_OK) *out = r;
    cfg_free(c);
    return rc;
}

static void refused(const char *rs, const char *thr, int bypass, const char *want1, const char *want2) {
    char a[256], b[256];
    snprintf(a, sizeof a, "algorithm.rollout_correction.rollout_rs=%s", rs);
    snprintf(b, sizeof b, "algorithm.rollout_correction.rollout_rs_threshold=%s", thr);
    const char *kv[] = {bypass ? "algorithm.rollout_correction.bypass_mode=true"
                               : "algorithm.rollout_correction.bypass_mode=false",
                        a, b, NULL};
    const int rc = read_keys(kv, NULL);
    CHECK(rc == MOERL_ERR && strstr(moerl_last_error(), want1) && (!want2 || strstr(moerl_last_error(), want2)),
          "%s / %s: want an error naming '%s' and '%s', got %s", rs, thr, want1, want2 ? want2 : "",
          rc ? moerl_last_error() : "accepted");
}

static void test_keys(void) {
    rl_config r;
    const char *none[] = {NULL};
    CHECK(read_keys(none, &r) == MOERL_OK && r.rollout_rs.n == 0, "default: off (%s)", moerl_last_error());
    const char *ok[] = {"algorithm.rollout_correction.bypass_mode=false",
                        "algorithm.rollout_correction.rollout_rs=token_k1,seq_max_k2",
                        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0,0.3", NULL};
    CHECK(read_keys(ok, &r) == MOERL_OK && r.rollout_rs.n == 2 && r.rollout_rs.opt[0].k == 1 &&
              fabs(r.rollout_rs.opt[0].lower - log(0.5)) < 1e-15 && fabs(r.rollout_rs.opt[0].upper - log(2.0)) < 1e-15 &&
              r.rollout_rs.opt[1].agg == RS_AGG_SEQ_MAX && r.rollout_rs.opt[1].upper == 0.3,
          "two options: %s", moerl_last_error());
    const char *is_too[] = {"algorithm.rollout_correction.bypass_mode=false",
                            "algorithm.rollout_correction.rollout_is=token",
                            "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
                            "algorithm.rollout_correction.rollout_rs_threshold=0.999_1.001", NULL};
    CHECK(read_keys(is_too, &r) == MOERL_OK && r.rollout_is == ROLLOUT_IS_TOKEN && r.rollout_rs.n == 1,
          "rollout_is and rollout_rs at once: %s", moerl_last_error());
    const char *K = "algorithm.rollout_correction.rollout_rs", *KT = "algorithm.rollout_correction.rollout_rs_threshold";
    refused("token_k4", "2", 0, K, "'token_k4'");
    refused("geometric", "2", 0, K, "'geometric'");
    refused("token_k1", "null", 0, KT, "token_k1");
    refused("null", "0.5_2", 0, KT, "'0.5_2'");
    refused("token_k2", "0.1_0.2", 0, KT, "'0.1_0.2'");
    refused("token_k1", "abc", 0, KT, "'abc'");
    refused("token_k1", "-1_2", 0, KT, "'-1_2'");
    refused("token_k1", "2_0.5", 0, KT, "'2_0.5'");
    refused("token_k1", "0.5", 0, KT, "'0.5'");
    refused("seq_sum_k3", "0", 0, KT, "'0'");
    refused("seq_sum_k3", "inf", 0, KT, "'inf'");
    refused("token_k1,token_k2,token_k3", "1,2", 0, KT, "'1,2'");
    refused("token_k1", "0.5_2", 1, "bypass_mode", "rollout_rs=token_k1");
    refused(" , ", "2", 0, K, "an empty entry");
    refused("token_k1,,seq_mean_k1", "2", 0, K, "an empty entry");
    refused("token_k1,", "2", 0, K, "an empty entry");
    refused("token_k1,seq_mean_k1", "2,", 0, KT, "an empty entry");
    refused("token_k2", "0x10", 0, KT, "'0x10'"); /* decimal numbers only (strtod would read hex) */
    refused("token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,"
            "token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,token_k1,"
            "token_k1",
            "2", 0, K, "more than 22");
    cfg *c = cfg_new();
    rl_def_keys(c);
    CHECK(cfg_has(c, K) && cfg_has(c, KT), "the keys are declared");
    cfg_free(c);
}

/* ------------------------------------------------------------------ through the trainer */

#define G 4
#define P 5
#define N_OUT 9

static moe_model g_m;

/* One group: fixed prompt and response tokens, behaviour logprobs = the trainer's own logprobs −
 * delta (so the log ratio old − μ is delta), optional multi-turn masks (response 2 has tool-turn
 * holes with garbage behaviour logprobs) and extra hand masking (drop: 1 = masked out). */
static rl_group *make_group(const float *prox, const float *delta, int multi_turn, const unsigned char *drop) {
    rl_group *g = xcalloc(1, sizeof *g);
    g->n = g->n_done = G;
    for (int i = 0; i < P; i++) tok_seq_push(&g->prompt, 40 + 7 * i);
    g->reqs = xcalloc(G, sizeof(gen_request));
    g->rewards = xcalloc(G, sizeof(reward_result));
    for (int j = 0; j < G; j++) {
        gen_request *q = &g->reqs[j];
        q->id = j;
        q->prompt = g->prompt.ids;
        q->prompt_len = P;
        q->n_out = N_OUT;
        q->finish = FINISH_STOP;
        q->out_tokens = xmalloc(N_OUT * sizeof(int));
        q->out_logprobs = xmalloc(N_OUT * sizeof(float));
        q->out_versions = xcalloc(N_OUT, sizeof(int));
        const int hole = multi_turn && j == 2;
        if (hole || drop) q->out_mask = xmalloc(N_OUT);
        for (int t = 0; t < N_OUT; t++) {
            q->out_tokens[t] = 60 + (j * 13 + t * 5) % 50;
            const int in_hole = hole && t >= 3 && t < 6;
            q->out_logprobs[t] = in_hole ? 0.0f : prox ? prox[j * N_OUT + t] - delta[j * N_OUT + t] : -1.0f;
            if (q->out_mask) q->out_mask[t] = (unsigned char)(!in_hole && !(drop && drop[j * N_OUT + t]));
        }
        g->rewards[j].score = (float)(j % 3) * 0.5f;
        q->user = g;
    }
    return g;
}

static rl_config trainer_config(loss_agg_mode agg, const char *rs, const char *thr, int is_token) {
    rl_config c = rl_test_config();
    c.n = G;
    c.ppo_mini_batch_size = 1;
    c.ppo_epochs = 1;
    c.ppo_max_token_len = 256;
    c.temperature = 1.0f;
    c.optim.lr = 0.0f;
    c.optim.max_grad_norm = 0.0f;
    c.optim.weight_decay = 0.0f;
    c.loss_agg = agg;
    c.recompute_old = 1;
    c.rollout_is = is_token ? ROLLOUT_IS_TOKEN : ROLLOUT_IS_NONE;
    c.rollout_is_threshold = 2.0f;
    c.entropy_coeff = 0.01f;
    MOERL_ASSERT(rollout_rs_parse(rs, thr, &c.rollout_rs) == MOERL_OK);
    return c;
}

static int run_step(const rl_config *c, rl_group *g, float *grads, train_stats *st) {
    trainer T;
    int rc = trainer_init(&T, c, NULL, &g_m);
    if (rc == MOERL_OK) rc = trainer_step(&T, &g, 1, st);
    CHECK(rc == MOERL_OK, "trainer: %s", moerl_last_error());
    memcpy(grads, g_m.grads, g_m.n_params * sizeof(float));
    trainer_free(&T);
    return rc;
}

/* The trainer's logprobs of the group's responses under the current weights (prox[G·N_OUT]). */
static void own_logprobs(float *prox, int multi_turn) {
    rl_group *g = make_group(NULL, NULL, multi_turn, NULL);
    train_seq seqs[G];
    int toks[G][P + N_OUT];
    float *out[G];
    for (int j = 0; j < G; j++) {
        memcpy(toks[j], g->prompt.ids, P * sizeof(int));
        memcpy(toks[j] + P, g->reqs[j].out_tokens, N_OUT * sizeof(int));
        seqs[j] = (train_seq){.tokens = toks[j], .len = P + N_OUT, .resp_start = P, .resp_mask = NULL};
        out[j] = prox + j * N_OUT;
    }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &g_m, 256) == MOERL_OK);
    MOERL_ASSERT(compute_logprobs(&g_m, &a, seqs, G, 256, 1.0f, out) == MOERL_OK);
    model_acts_free(&a);
    rl_group_free(g);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

static const char *agg_name(loss_agg_mode m) { return loss_agg_mode_name(m); }

/* Rejection vs the same tokens masked by hand. drop[] = the tokens the options must reject (known
 * from delta by construction, with wide margins). */
static void equivalence(loss_agg_mode agg, const char *rs, const char *thr, int is_token, int multi_turn,
                        const float *prox, const float *delta, const unsigned char *drop, int n_drop) {
    const size_t np = g_m.n_params;
    float *ga = xmalloc(np * sizeof(float)), *gb = xmalloc(np * sizeof(float)), *gc = xmalloc(np * sizeof(float));
    train_stats sa, sb, sc;
    rl_config ca = trainer_config(agg, rs, thr, is_token), cb = trainer_config(agg, "null", "null", is_token);
    rl_group *a = make_group(prox, delta, multi_turn, NULL), *b = make_group(prox, delta, multi_turn, drop),
             *c = make_group(prox, delta, multi_turn, NULL);
    if (run_step(&ca, a, ga, &sa) == MOERL_OK && run_step(&cb, b, gb, &sb) == MOERL_OK &&
        run_step(&cb, c, gc, &sc) == MOERL_OK) {
        const double d = max_abs_diff(ga, gb, np), ctl = max_abs_diff(ga, gc, np);
        CHECK(d == 0.0, "%s, %s %s, is=%d, multi-turn %d: rejection vs masking by hand differ by %g", agg_name(agg),
              rs, thr, is_token, multi_turn, d);
        CHECK(ctl > 1e-6, "%s, %s: the control (no rejection) is only %g off: the check could not fail",
              agg_name(agg), rs, ctl);
        CHECK(sa.pg_loss == sb.pg_loss && sa.entropy == sb.entropy, "%s, %s: pg_loss %.9g vs %.9g", agg_name(agg), rs,
              sa.pg_loss, sb.pg_loss);
        /* rollout_rs_masked_fraction: the last-but-one metric */
        char nm[ROLLOUT_RS_MAX_METRICS][ROLLOUT_RS_NAME_LEN];
        const int n = rollout_rs_metrics(&ca.rollout_rs, NULL, nm, NULL);
        const int n_tok = G * N_OUT - (multi_turn ? 3 : 0);
        CHECK(!strcmp(nm[n - 2], "rollout_rs_masked_fraction") && sa.rs_steps == 1 &&
                  fabs(sa.rs_vals[n - 2] - (double)n_drop / n_tok) < 1e-15,
              "%s: masked fraction %g, want %d/%d", rs, sa.rs_vals[n - 2], n_drop, n_tok);
        CHECK(sa.mismatch_steps == 1 && sa.probs_diff_max > 0 && isfinite(sa.probs_pearson),
              "mismatch metrics reported (diff max %g, corr %g)", sa.probs_diff_max, sa.probs_pearson);
    }
    rl_group_free(a); rl_group_free(b); rl_group_free(c);
    free(ga); free(gb); free(gc);
}

static void test_trainer(void) {
    rl_tiny_model(&g_m, 26, 0.0f);
    float prox[G * N_OUT], prox_mt[G * N_OUT], delta[G * N_OUT];
    own_logprobs(prox, 0);
    own_logprobs(prox_mt, 1);
    /* known case: behaviour = the trainer's own logprobs → diff exactly 0, correlation 1, nothing rejected */
    {
        memset(delta, 0, sizeof delta);
        const size_t np = g_m.n_params;
        float *gr = xmalloc(np * sizeof(float));
        train_stats st;
        rl_config c = trainer_config(LOSS_AGG_TOKEN_MEAN, "token_k1,seq_max_k3", "0.999_1.001,1e-6", 0);
        rl_group *g = make_group(prox, delta, 0, NULL);
        if (run_step(&c, g, gr, &st) == MOERL_OK) {
            CHECK(st.mismatch_steps == 1 && st.probs_diff_max == 0 && st.probs_diff_mean == 0 &&
                      fabs(st.probs_pearson - 1) < 1e-12,
                  "on-policy: diff max %g mean %g corr %.17g", st.probs_diff_max, st.probs_diff_mean, st.probs_pearson);
            const double *ov = st.offpolicy_vals; /* kl, k3_kl, ..., log_ppl_diff (6), ppl_ratio (10), chi2 (11, 12) */
            CHECK(ov[0] == 0 && ov[1] == 0 && ov[6] == 0 && ov[7] == 0 && ov[10] == 1 && ov[11] == 0 && ov[12] == 0 &&
                      ov[2] == ov[4],
                  "on-policy off-policy metrics: kl %g k3 %g log_ppl_diff %g ppl_ratio %g chi2 %g %g", ov[0], ov[1],
                  ov[6], ov[10], ov[11], ov[12]);
            const int n = rollout_rs_metrics(&c.rollout_rs, NULL, NULL, NULL);
            CHECK(st.rs_steps == 1 && st.rs_vals[n - 2] == 0 && st.rs_vals[n - 1] == 0, "on-policy: nothing rejected");
        }
        rl_group_free(g);
        free(gr);
    }
    /* token rejection (IcePop's token_k1 0.5_2.0 keeps |lr| ≤ log 2): small deltas everywhere, ±1 on
     * chosen tokens; multi-turn: holes hold behaviour 0 (lr ≈ old, far outside) and must not count */
    unsigned char drop[G * N_OUT] = {0};
    int n_drop = 0;
    for (int t = 0; t < G * N_OUT; t++) {
        delta[t] = 0.02f * (float)((t * 7) % 5 - 2);
        if (t % 7 == 3 && t / N_OUT != 3) {
            delta[t] = (t % 2) ? 1.0f : -1.0f;
            drop[t] = 1;
        }
    }
    for (int t = 0; t < G * N_OUT; t++) n_drop += drop[t];
    const loss_agg_mode aggs[4] = {LOSS_AGG_TOKEN_MEAN, LOSS_AGG_SEQ_MEAN_TOKEN_SUM, LOSS_AGG_SEQ_MEAN_TOKEN_MEAN,
                                   LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM};
    for (int k = 0; k < 4; k++) equivalence(aggs[k], "token_k1", "0.5_2.0", k == 1, 0, prox, delta, drop, n_drop);
    /* multi-turn: the holes are neither counted nor rejected (a dropped token inside a hole is not one) */
    unsigned char drop_mt[G * N_OUT];
    int n_drop_mt = 0;
    for (int t = 0; t < G * N_OUT; t++) {
        const int in_hole = t / N_OUT == 2 && t % N_OUT >= 3 && t % N_OUT < 6;
        drop_mt[t] = drop[t] && !in_hole;
        n_drop_mt += drop_mt[t];
    }
    equivalence(LOSS_AGG_TOKEN_MEAN, "token_k1", "0.5_2.0", 1, 1, prox_mt, delta, drop_mt, n_drop_mt);
    /* sequence rejection (geometric: seq_mean_k1): response 1 shifted by −0.3 per token leaves whole,
     * the others (|mean lr| ≤ 0.04) stay; every mode's sequence count loses it */
    for (int t = 0; t < G * N_OUT; t++) {
        delta[t] = 0.02f * (float)((t * 7) % 5 - 2);
        drop[t] = t / N_OUT == 1;
        if (drop[t]) delta[t] += 0.3f;
    }
    for (int k = 0; k < 4; k++) equivalence(aggs[k], "seq_mean_k1", "0.9_1.1", 0, 0, prox, delta, drop, N_OUT);
    model_free(&g_m);
}

int main(void) {
    test_reference();
    test_edges();
    test_keys();
    test_trainer();
    TEST_MAIN_END();
}
