/* The multi-turn loss mask (gen_request.out_mask → train_seq.resp_mask): inserted tool-turn tokens
 * carry no loss, no behaviour logprob and no entropy, and every normalisation counts only the
 * model-sampled tokens.
 *   - the trainer (trainer_step: packing, advantages, weights, PPO loss, entropy bonus, backward) on
 *     one GRPO group of multi-turn responses against PyTorch (tests/ref/gen_loss_mask.py): every
 *     parameter's gradient, actor/pg_loss, actor/entropy, pg_clipfrac and the decoupled loss's filtered
 *     share for each loss_agg_mode, for REINFORCE++ with recomputed old logprobs and sequence-level
 *     rollout IS, for the decoupled loss with behav_imp_weight_cap, and with the k3 KL to a reference
 *     policy (actor/kl_loss); then the control:
 *     the same group with the masks dropped (tool tokens counted) misses the reference by far more
 *     than the tolerance, so the comparison can fail;
 *   - exact equivalence: a response whose inserted tokens lead it trains bit-identically to the same
 *     token sequence with those tokens moved into the prompt (same gradients, same metrics), for
 *     every case above;
 *   - SFT on tool-call demonstrations (the tool_arith rows, ds_row_encode_sft's assistant-turn mask):
 *     sft_train's train/ce_loss is the mean over the assistant turns' tokens only, and neither the tool
 *     turns' tokens in the sum nor in the count would give it;
 *   - the packing: masked targets get resp_index −1, compute_logprobs writes 0 there and the same
 *     values elsewhere as without a mask, train_seq_loss_tokens counts the mask-1 targets. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/common.h"
#include "data/dataset.h"
#include "data/tasks.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rl/rl.h"
#include "rl/sft.h"
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

/* The reference's group, as the engine and the reward pool leave it. */
typedef struct {
    int G, P, *prompt, *len, *tok, *mask, *has_mask;
    float *rewards, *behav, *behav_is, *params;
    int *cases;
    int64_t n_cases;
} ref_group;

static int ref_load(const st_file *f, ref_group *r) {
    int64_t G = 0, P = 0, C = 0;
    r->prompt = need(f, "prompt", ST_I32, &P);
    r->len = need(f, "resp_len", ST_I32, &G);
    r->tok = need(f, "resp_tokens", ST_I32, NULL);
    r->mask = need(f, "resp_mask", ST_I32, NULL);
    r->has_mask = need(f, "has_mask", ST_I32, NULL);
    r->rewards = need(f, "rewards", ST_F32, NULL);
    r->behav = need(f, "behav", ST_F32, NULL);
    r->behav_is = need(f, "behav_is", ST_F32, NULL);
    r->params = need(f, "params", ST_F32, NULL);
    r->cases = need(f, "cases", ST_I32, &C);
    r->G = (int)G;
    r->P = (int)P;
    r->n_cases = C / 4;
    return r->prompt && r->len && r->tok && r->mask && r->has_mask && r->rewards && r->behav && r->behav_is &&
           r->params && r->cases;
}

static void ref_free(ref_group *r) {
    free(r->prompt); free(r->len); free(r->tok); free(r->mask); free(r->has_mask); free(r->rewards);
    free(r->behav); free(r->behav_is); free(r->params); free(r->cases);
}

/* Response j as a gen_request: tokens, behaviour logprobs (0 on inserted tokens), versions 0, and its
 * out_mask when with_mask and the reference gives one. lead > 0 moves the first `lead` tokens (all
 * inserted) out of the response (the caller puts them at the end of the prompt). */
static rl_group *make_group(const ref_group *r, const float *behav, int with_mask, int lead) {
    rl_group *g = xcalloc(1, sizeof *g);
    g->n = g->n_done = r->G;
    for (int i = 0; i < r->P; i++) tok_seq_push(&g->prompt, r->prompt[i]);
    for (int i = 0; i < lead; i++) tok_seq_push(&g->prompt, r->tok[i]); /* response 0's leading tokens */
    g->reqs = xcalloc((size_t)r->G, sizeof(gen_request));
    g->rewards = xcalloc((size_t)r->G, sizeof(reward_result));
    for (int j = 0, off = 0; j < r->G; off += r->len[j], j++) {
        gen_request *q = &g->reqs[j];
        const int n = r->len[j] - lead;
        q->id = j;
        q->prompt = g->prompt.ids;
        q->prompt_len = (int)g->prompt.n;
        q->n_out = n;
        q->finish = FINISH_STOP;
        q->out_tokens = xmalloc((size_t)n * sizeof(int));
        q->out_logprobs = xmalloc((size_t)n * sizeof(float));
        q->out_versions = xcalloc((size_t)n, sizeof(int));
        for (int t = 0; t < n; t++) {
            q->out_tokens[t] = r->tok[off + lead + t];
            q->out_logprobs[t] = behav[off + lead + t];
        }
        if (with_mask && r->has_mask[j]) {
            q->out_mask = xmalloc((size_t)n);
            for (int t = 0; t < n; t++) q->out_mask[t] = (unsigned char)r->mask[off + lead + t];
        }
        g->rewards[j].score = r->rewards[j];
        q->user = g;
    }
    return g;
}

static rl_config case_config(const ref_group *r, int k) {
    rl_config c = rl_test_config();
    const int *cs = r->cases + 4 * k;
    c.n = r->G;
    c.ppo_mini_batch_size = 1;
    c.ppo_epochs = 1;
    c.ppo_max_token_len = 256;
    c.temperature = 1.0f;
    c.optim.lr = 0.0f;              /* the gradient stays in m.grads, the weights as they are */
    c.optim.max_grad_norm = 0.0f;   /* no clipping: the raw gradient is compared */
    c.optim.weight_decay = 0.0f;
    c.ppo.clip_ratio_low = r->params[0];
    c.ppo.clip_ratio_high = r->params[1];
    c.ppo.clip_ratio_c = r->params[2];
    c.entropy_coeff = r->params[3];
    c.loss_scale_factor = r->params[4];
    c.rollout_is_threshold = r->params[5];
    c.loss_agg = (loss_agg_mode)cs[0];
    c.adv_estimator = cs[1] ? RL_ADV_REINFORCE_PP_BASELINE : RL_ADV_GRPO;
    c.norm_adv_by_std = 1;
    c.recompute_old = cs[2] == 1;  /* 1: recomputed old logprobs with sequence-level rollout IS */
    c.rollout_is = cs[2] == 1 ? ROLLOUT_IS_SEQUENCE : ROLLOUT_IS_NONE;
    c.ppo.decoupled = cs[2] == 2;  /* 2: AReaL's decoupled loss (anchor π_prox, behaviour weight capped) */
    c.ppo.behav_imp_weight_cap = r->params[6];
    c.use_kl_loss = cs[3];  /* k3 KL to the reference policy of loss_mask_ref_model */
    c.kl_loss_coef = r->params[7];
    c.overlong_enable = 0;
    c.overlong_filter = 0;
    return c;
}

/* The KL case's reference policy (tests/ref/gen_loss_mask.py: the weights, perturbed). */
static moe_model g_ref_policy;
static int g_have_ref_policy;

/* One trainer step of case k on group g (consumed); the gradient into grads[n_params]. */
static int train_case(moe_model *m, const ref_group *r, int k, rl_group *g, float *grads, train_stats *st) {
    rl_config c = case_config(r, k);
    trainer T;
    int rc = trainer_init(&T, &c, NULL, m);
    if (rc == MOERL_OK && T.ref) { /* trainer_init copied the actor: the reference is another policy */
        CHECK(g_have_ref_policy && g_ref_policy.n_params == T.ref->n_params, "case %d: no reference policy", k);
        if (g_have_ref_policy && g_ref_policy.n_params == T.ref->n_params)
            memcpy(T.ref->params, g_ref_policy.params, T.ref->n_params * sizeof(float));
    }
    if (rc == MOERL_OK) rc = trainer_step(&T, &g, 1, st);
    CHECK(rc == MOERL_OK, "case %d: trainer: %s", k, moerl_last_error());
    memcpy(grads, m->grads, m->n_params * sizeof(float));
    trainer_free(&T);
    rl_group_free(g);
    return rc;
}

/* Largest |g − ref| over a tensor relative to the tolerance used below (≤ 1: within it). */
static double worst_over_tol(const float *g, const float *rg, int64_t n) {
    float gmax = 0;
    for (int64_t j = 0; j < n; j++) gmax = fmaxf(gmax, fabsf(rg[j]));
    double w = 0;
    for (int64_t j = 0; j < n; j++) {
        const double tol = 1e-4 * gmax + 1e-9 + 1e-3 * fabs((double)rg[j]);
        w = fmax(w, fabs((double)g[j] - (double)rg[j]) / tol);
    }
    return w;
}

/* Every parameter gradient of case k against the reference; returns the worst ratio to the tolerance. */
static double compare_grads(const moe_model *m, const st_file *f, int k, const float *grads, int report) {
    double worst = 0;
    int ng = 0;
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
            continue;
        }
        const double w = worst_over_tol(g, rg, numel);
        worst = fmax(worst, w);
        /* fp32 forward/backward through 2 layers vs float64 autograd on the same fp32 weights: as
         * test_model's whole-model parity, 1e-4 of the tensor's largest entry (tiny entries are sums of
         * cancelling terms) plus 1e-3 relative; routing and every clip branch are decided with margins
         * far above fp32 rounding (gen_loss_mask.py), so no token can switch branch. */
        if (report) CHECK(w <= 1.0, "case %d: gradient %s off by %.3g× the tolerance", k, hf, w);
        ng++;
        free(rg);
    }
    if (report) CHECK(ng == model_hf_count(m), "case %d: %d of %d gradients compared", k, ng, model_hf_count(m));
    return worst;
}

static void test_trainer_vs_pytorch(void) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/loss_mask_model", testdata());
    snprintf(ref, sizeof ref, "%s/loss_mask.safetensors", testdata());
    moe_model m;
    st_file f;
    if (model_load_hf(&m, dir) != MOERL_OK || st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "cannot load %s / %s (run tests/ref/gen_loss_mask.py: bash tests/run.sh gen_loss_mask): %s", dir,
              ref, moerl_last_error());
        return;
    }
    ref_group r;
    if (!ref_load(&f, &r)) {
        st_close(&f);
        model_free(&m);
        return;
    }
    char rdir[1100];
    snprintf(rdir, sizeof rdir, "%s/loss_mask_ref_model", testdata());
    g_have_ref_policy = model_load_hf(&g_ref_policy, rdir) == MOERL_OK;
    CHECK(g_have_ref_policy, "cannot load the reference policy %s: %s", rdir, moerl_last_error());
    float *grads = xmalloc(m.n_params * sizeof(float));
    for (int k = 0; k < r.n_cases; k++) {
        const int recompute = r.cases[4 * k + 2];
        const float *behav = recompute ? r.behav_is : r.behav;
        train_stats st;
        if (train_case(&m, &r, k, make_group(&r, behav, 1, 0), grads, &st) != MOERL_OK) continue;
        const double worst = compare_grads(&m, &f, k, grads, 1);
        char mname[32];
        snprintf(mname, sizeof mname, "case%d.metrics", k);
        float *mt = need(&f, mname, ST_F32, NULL);
        if (mt) {
            /* the aggregated loss and the entropy mean: fp32 logprobs (≈1e-6 relative) through sums of
             * ≤ 40 terms in double: 1e-5 relative + 1e-6 absolute */
            const float got[5] = {(float)st.pg_loss, (float)st.entropy, (float)st.pg_clipfrac,
                                  (float)st.behav_dropped_frac, (float)st.kl_loss};
            char what[128];
            snprintf(what, sizeof what, "case %d: pg_loss, entropy, pg_clipfrac, behav_dropped_frac, kl_loss vs PyTorch",
                     k);
            t_close(what, got, mt, 5, 1e-6f, 1e-5f);
            free(mt);
        }
        /* control: the same group without its masks (tool tokens counted as loss tokens) */
        if (train_case(&m, &r, k, make_group(&r, behav, 0, 0), grads, &st) != MOERL_OK) continue;
        const double off = compare_grads(&m, &f, k, grads, 0);
        CHECK(off > 100.0, "case %d: counting the tool tokens moves the gradient only %.3g× the tolerance (the "
              "comparison could not tell)", k, off);
        fprintf(stderr, "  case %d: worst gradient %.3g of the tolerance; without the mask %.3g\n", k, worst, off);
    }
    free(grads);
    ref_free(&r);
    st_close(&f);
    model_free(&m);
}

/* Response 0 of the reference starts with sampled tokens; build a group whose responses all start
 * with the same inserted run instead, so that moving it into the prompt is the same token sequence. */
static void test_leading_tokens_equal_prompt(void) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/loss_mask_model", testdata());
    snprintf(ref, sizeof ref, "%s/loss_mask.safetensors", testdata());
    moe_model m;
    st_file f;
    if (model_load_hf(&m, dir) != MOERL_OK || st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "cannot load %s / %s: %s", dir, ref, moerl_last_error());
        return;
    }
    ref_group r;
    if (!ref_load(&f, &r)) {
        st_close(&f);
        model_free(&m);
        return;
    }
    /* every response: the same 3 inserted tokens (mask 0, logprob 0), then its own tokens */
    const int lead = 3;
    int total = 0;
    for (int j = 0; j < r.G; j++) total += r.len[j];
    ref_group e = r;
    e.len = xmalloc(r.G * sizeof(int));
    e.tok = xmalloc((size_t)(total + lead * r.G) * sizeof(int));
    e.mask = xmalloc((size_t)(total + lead * r.G) * sizeof(int));
    e.has_mask = xmalloc(r.G * sizeof(int));
    float *bh = xmalloc((size_t)(total + lead * r.G) * sizeof(float)),
          *bi = xmalloc((size_t)(total + lead * r.G) * sizeof(float));
    for (int j = 0, o = 0, w = 0; j < r.G; o += r.len[j], j++) {
        e.len[j] = r.len[j] + lead;
        e.has_mask[j] = 1;
        for (int t = 0; t < e.len[j]; t++, w++) {
            const int in = t < lead;
            e.tok[w] = in ? r.tok[t] : r.tok[o + t - lead]; /* response 0's first tokens as the tool turn */
            e.mask[w] = in ? 0 : (r.has_mask[j] ? r.mask[o + t - lead] : 1);
            bh[w] = in ? 0.0f : r.behav[o + t - lead];
            bi[w] = in ? 0.0f : r.behav_is[o + t - lead];
        }
    }
    /* the moved form keeps a response's own mask only when it had one: has_mask stays as the reference's */
    float *g1 = xmalloc(m.n_params * sizeof(float)), *g2 = xmalloc(m.n_params * sizeof(float));
    for (int k = 0; k < r.n_cases; k++) {
        const float *b = r.cases[4 * k + 2] ? bi : bh;
        train_stats s1, s2;
        /* masked: prompt P, responses lead ⊕ own; moved: prompt P ⊕ lead, responses own */
        if (train_case(&m, &e, k, make_group(&e, b, 1, 0), g1, &s1) != MOERL_OK) continue;
        /* make_group with lead moves e.tok[0..lead) of response 0 into the prompt and drops each
         * response's first lead tokens: the same tokens for every response here */
        if (train_case(&m, &e, k, make_group(&e, b, 1, lead), g2, &s2) != MOERL_OK) continue;
        CHECK(!memcmp(g1, g2, m.n_params * sizeof(float)),
              "case %d: the gradient with a leading tool turn differs from the same tokens as prompt", k);
        CHECK(s1.pg_loss == s2.pg_loss && s1.entropy == s2.entropy && s1.pg_clipfrac == s2.pg_clipfrac &&
                  s1.ppo_kl == s2.ppo_kl,
              "case %d: metrics differ: pg_loss %.9g / %.9g, entropy %.9g / %.9g", k, s1.pg_loss, s2.pg_loss,
              s1.entropy, s2.entropy);
        CHECK(s1.response_length_mean == s2.response_length_mean + lead &&
                  s1.loss_tokens_mean == s2.loss_tokens_mean,
              "case %d: response_length counts the whole output (%.3g vs %.3g + %d), loss tokens the sampled "
              "ones (%.3g vs %.3g)", k, s1.response_length_mean, s2.response_length_mean, lead, s1.loss_tokens_mean,
              s2.loss_tokens_mean);
    }
    free(g1); free(g2); free(bh); free(bi);
    free(e.len); free(e.tok); free(e.mask); free(e.has_mask);
    ref_free(&r);
    st_close(&f);
    model_free(&m);
}

/* train_pack, compute_logprobs and train_seq_loss_tokens with a mask. */
static void test_packing(void) {
    moe_model m;
    rl_tiny_model(&m, 7, 0.0f);
    const int tok[12] = {5, 9, 14, 2, 77, 31, 8, 8, 120, 64, 3, 11};
    const unsigned char mask[8] = {1, 1, 0, 0, 0, 1, 0, 1}; /* response = tok[4..12) */
    train_seq s[2] = {{.tokens = tok, .len = 12, .resp_start = 4, .resp_mask = mask},
                      {.tokens = tok, .len = 12, .resp_start = 4}};
    int ptok[24], cu[3], tgt[24], seq_of[24], ri[24];
    const int N = train_pack(s, 0, 2, ptok, cu, tgt, seq_of, ri);
    CHECK(N == 24 && cu[1] == 12 && cu[2] == 24, "packed %d tokens", N);
    int ok = 1;
    for (int t = 0; t < 12; t++) {
        const int k = t + 1 - 4, in = t + 1 < 12 && k >= 0;
        ok &= ri[12 + t] == (in ? k : -1);            /* without a mask: every response target */
        ok &= ri[t] == (in && mask[k] ? k : -1);      /* with one: the mask-1 targets only */
    }
    CHECK(ok, "resp_index: −1 on the masked targets, their position elsewhere");
    CHECK(train_seq_loss_tokens(&s[0]) == 4 && train_seq_loss_tokens(&s[1]) == 8, "loss tokens %lld / %lld",
          (long long)train_seq_loss_tokens(&s[0]), (long long)train_seq_loss_tokens(&s[1]));
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, 64) == MOERL_OK);
    float l0[8], l1[8];
    for (int i = 0; i < 8; i++) l0[i] = l1[i] = NAN; /* as xmalloc'd memory may hold anything */
    float *out[2] = {l0, l1};
    CHECK(compute_logprobs(&m, &a, s, 2, 64, 1.0f, out) == MOERL_OK, "compute_logprobs: %s", moerl_last_error());
    int same = 1, zero = 1;
    for (int k = 0; k < 8; k++) {
        if (mask[k]) same &= l0[k] == l1[k] && l0[k] < 0;
        else zero &= l0[k] == 0.0f;
    }
    CHECK(same, "the loss tokens' logprobs equal the unmasked sequence's");
    CHECK(zero, "masked entries hold 0");
    model_acts_free(&a);
    model_free(&m);
}

/* ------------------------------------------------------------------ SFT */

/* The ce of a tool-use demonstration batch as sft_train reports it (train/ce_loss of its one step at
 * lr 0, read back from its metrics file) against the cross-entropy over the assistant turns' tokens
 * only, computed here from compute_logprobs on the same encoding (ds_row_encode_sft) and model; the
 * control: the mean over every response token (tool turns included) is far from it. */
static double sft_metric_ce(const char *path) {
    FILE *f = fopen(path, "r");
    double ce = NAN;
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        const json_t *v = j ? json_object_get(j, "train/ce_loss") : NULL;
        if (v && json_is_number(v)) ce = json_number_value(v);
        json_decref(j);
    }
    if (f) fclose(f);
    return ce;
}

static void test_sft_mask(void) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test_loss_mask_XXXXXX", testdata());
    MOERL_ASSERT(moerl_mkdirs(testdata()) == MOERL_OK && mkdtemp(dir) != NULL);
    char tr[4200], te[4200], mp[4200];
    snprintf(tr, sizeof tr, "%s/train.jsonl", dir);
    snprintf(te, sizeof te, "%s/test.jsonl", dir);
    snprintf(mp, sizeof mp, "%s/metrics.jsonl", dir);
    task_opts to;
    task_opts_default(&to);
    to.n_train = 4;
    to.n_test = 1;
    to.seed = 5;
    tokenizer *t = tokenizer_new_bytes();
    CHECK(tokenizer_set_chat_template(t, "examples/tool_use/chat_template.jinja", true, "data.chat_template") ==
              MOERL_OK, "template: %s", moerl_last_error());
    tok_set_current(t);
    dataset ds = {0};
    if (task_generate("tool_arith", &to, tr, te) != MOERL_OK || dataset_load(&ds, tr) != MOERL_OK) {
        CHECK(0, "tool_arith rows: %s", moerl_last_error());
        tok_set_current(NULL);
        tokenizer_free(t);
        return;
    }
    moe_model m;
    rl_tiny_model(&m, 13, 0.0f);
    /* the reference: the rows' encodings with their masks, logprobs from the model before the step */
    const int n = (int)dataset_count(&ds);
    tok_seq *ids = xcalloc(n, sizeof(tok_seq));
    uint8_t **mk = xcalloc(n, sizeof(uint8_t *));
    train_seq *seqs = xcalloc(n, sizeof(train_seq));
    float **lp = xcalloc(n, sizeof(float *));
    for (int i = 0; i < n; i++) {
        int rs = 0;
        MOERL_ASSERT(ds_row_encode_sft(dataset_row(&ds, i), "ROW", &ids[i], &rs, &mk[i]) == MOERL_OK);
        CHECK(mk[i] != NULL, "row %d: a demonstration with a tool turn has a loss mask", i);
        seqs[i] = (train_seq){.tokens = ids[i].ids, .len = (int)ids[i].n, .resp_start = rs, .resp_mask = mk[i]};
        lp[i] = xmalloc((size_t)(ids[i].n - rs + 1) * sizeof(float));
    }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, 1024) == MOERL_OK);
    MOERL_ASSERT(compute_logprobs(&m, &a, seqs, n, 1024, 1.0f, lp) == MOERL_OK);
    double s_mask = 0, s_all = 0;
    int64_t k_mask = 0, k_all = 0, k_masked = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < seqs[i].len - seqs[i].resp_start; k++) {
            if (mk[i][k]) {
                s_mask -= lp[i][k];
                k_mask++;
            } else {
                k_masked++;
            }
            k_all++;
        }
    /* the control's values: the same sequences unmasked (tool turns counted) */
    for (int i = 0; i < n; i++) seqs[i].resp_mask = NULL;
    MOERL_ASSERT(compute_logprobs(&m, &a, seqs, n, 1024, 1.0f, lp) == MOERL_OK);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < seqs[i].len - seqs[i].resp_start; k++) s_all -= lp[i][k];
    const double ce_mask = s_mask / (double)k_mask, ce_all = s_all / (double)k_all;
    CHECK(k_masked > 0 && k_mask > 0, "the demonstrations hold %lld tool-turn and %lld assistant tokens",
          (long long)k_masked, (long long)k_mask);
    /* one SFT step over the whole batch at lr 0: its train/ce_loss is the loss before the step */
    sft_opts so = {.batch_size = n, .max_tokens = 1024, .total_epochs = 1, .total_steps = 1,
                   .optim = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .max_grad_norm = 1.0f},
                   .lr_scheduler = "constant", .val_n = 0, .no_held_out_eval = 1, .max_response_length = 4,
                   .seed = 1, .label = "sft", .metrics_path = mp};
    CHECK(sft_train(&m, &ds, &ds, &so, NULL, NULL) == MOERL_OK, "sft: %s", moerl_last_error());
    const double ce = sft_metric_ce(mp);
    /* the same fp32 forward of the same sequences (packed in another order), sums in double: 1e-5
     * relative covers the GEMMs' other row blocking */
    CHECK(fabs(ce - ce_mask) <= 1e-5 * fabs(ce_mask), "SFT ce %.9g, the assistant tokens' mean %.9g", ce, ce_mask);
    /* controls, each 10× the tolerance away at least: the tool turns' tokens in the sum, or in the count */
    const double ce_count_all = s_mask / (double)k_all;
    CHECK(fabs(ce_all - ce_mask) > 1e-4 * fabs(ce_mask) && fabs(ce_count_all - ce_mask) > 1e-4 * fabs(ce_mask),
          "controls: the mean over every response token %.9g or the assistant tokens' sum over every token %.9g is "
          "as close (the check could not tell)", ce_all, ce_count_all);
    printf("  SFT on %d tool demonstrations: ce %.6f = the %lld assistant tokens' mean %.6f (with the %lld tool-turn "
           "tokens: %.6f)\n", n, ce, (long long)k_mask, ce_mask, (long long)k_masked, ce_all);
    for (int i = 0; i < n; i++) {
        tok_seq_free(&ids[i]);
        free(mk[i]);
        free(lp[i]);
    }
    free(ids); free(mk); free(seqs); free(lp);
    model_acts_free(&a);
    model_free(&m);
    dataset_free(&ds);
    tok_set_current(NULL);
    tokenizer_free(t);
    unlink(tr);
    unlink(te);
    unlink(mp);
    rmdir(dir);
}

int main(void) {
    test_packing();
    test_trainer_vs_pytorch();
    test_leading_tokens_equal_prompt();
    test_sft_mask();
    if (g_have_ref_policy) model_free(&g_ref_policy);
    TEST_MAIN_END();
}
