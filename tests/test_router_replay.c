/* Routing replay (actor.router_replay R2/R3): the model's replayed MoE forward and its backward
 * against the PyTorch reference (tests/ref/gen_router_replay.py), on every MoE execution path;
 * replaying the native routes is bit-identical to no replay; routes_out holds the native top-k;
 * bad replayed routes are refused with a message naming the token and layer; the training passes
 * (train_accumulate, compute_logprobs, compute_router_counts) hand the sequences' routes to the
 * forward and record the native routes per sequence. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "base/rng.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rl/rl.h"
#include "rl_fixture.h"
#include "train/train.h"
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

typedef struct {
    moe_model m;
    st_file f;
    int N, B, V, Lm, K;
    int *tok, *cu, *tgt;
    float *mask;
    int16_t *routes; /* [N, Lm, K] */
} fixture;

static int fixture_open(fixture *x, const char *tag) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/replay_%s", testdata(), tag);
    snprintf(ref, sizeof ref, "%s/replay_%s_ref.safetensors", testdata(), tag);
    memset(x, 0, sizeof *x);
    if (model_load_hf(&x->m, dir) != MOERL_OK || st_open(&x->f, ref) != MOERL_OK) {
        CHECK(0, "%s: cannot load %s / %s (run tests/ref/gen_router_replay.py): %s", tag, dir, ref,
              moerl_last_error());
        return 0;
    }
    int64_t N64 = 0, B1 = 0, nr = 0;
    x->tok = get_i32(&x->f, "tokens", &N64);
    x->cu = get_i32(&x->f, "cu_seqlens", &B1);
    x->tgt = get_i32(&x->f, "targets", NULL);
    x->mask = get_f32(&x->f, "loss_mask", NULL);
    int *r32 = get_i32(&x->f, "routes", &nr);
    x->N = (int)N64;
    x->B = (int)B1 - 1;
    x->V = x->m.cfg.vocab_size;
    x->Lm = model_moe_layer_count(&x->m.cfg);
    x->K = x->m.cfg.num_experts_per_tok;
    CHECK(x->tok && x->cu && x->tgt && x->mask && r32 && nr == (int64_t)x->N * x->Lm * x->K,
          "%s: reference lacks the batch or routes", tag);
    if (!r32) return 0;
    x->routes = xmalloc((size_t)nr * sizeof(int16_t));
    for (int64_t i = 0; i < nr; i++) x->routes[i] = (int16_t)r32[i];
    free(r32);
    return 1;
}

static void fixture_close(fixture *x) {
    free(x->tok); free(x->cu); free(x->tgt); free(x->mask); free(x->routes);
    st_close(&x->f);
    model_free(&x->m);
}

/* loss = Σ mask·(−logp)/Σ mask + coef·aux (the reference's), forward + backward into m.grads. */
static float run_loss(fixture *x, model_acts *a, float *dlogp) {
    model_zero_grad(&x->m);
    if (model_forward(&x->m, a, x->tok, x->cu, NULL, x->B, x->N) != MOERL_OK) {
        CHECK(0, "forward failed: %s", moerl_last_error());
        return NAN;
    }
    model_logprobs(&x->m, a, x->tgt, 1.0f, 0);
    double msum = 0, ce = 0;
    for (int n = 0; n < x->N; n++) msum += x->mask[n];
    for (int n = 0; n < x->N; n++) {
        ce -= x->mask[n] * a->logp[n];
        dlogp[n] = (float)(-x->mask[n] / msum);
    }
    const float coef = x->m.cfg.router_aux_loss_coef;
    model_backward(&x->m, a, dlogp, NULL, coef);
    return (float)(ce / msum + coef * a->aux_loss);
}

static const moe_exec_opts SCHEDULES[] = {
    {0}, {.per_expert_loop = 1}, {.separate_permute = 1}, {.per_expert_weights = 1, .rebuild_row_idx = 1}};
#define N_SCHEDULES ((int)(sizeof SCHEDULES / sizeof SCHEDULES[0]))

/* The replayed forward and every gradient vs the float64 reference, on each MoE schedule.
 * Tolerances are test_model.c's for the same models (fp32 through ≤ 3 layers of width ≤ 64,
 * observed ~1e-6): logits/logp 2e-5 + 1e-4 relative; aux 1e-5 relative (a sum of E products of
 * means); gradients 1e-4 of each tensor's largest entry (small entries are cancelling sums). The
 * native ids of the replayed forward are compared exactly (the generator keeps a 1e-4 top-k gap). */
static void check_reference(const char *tag) {
    fixture x;
    if (!fixture_open(&x, tag)) return;
    float *rlogits = get_f32(&x.f, "logits", NULL), *rlogp = get_f32(&x.f, "logp", NULL);
    float *raux = get_f32(&x.f, "aux_loss", NULL), *rloss = get_f32(&x.f, "loss", NULL);
    CHECK(rlogits && rlogp && raux && rloss, "%s: reference lacks logits/logp/aux_loss/loss", tag);
    float *dlogp = xmalloc(x.N * sizeof(float));
    int16_t *rec = xmalloc((size_t)x.N * x.Lm * x.K * sizeof(int16_t));
    for (int sc = 0; sc < N_SCHEDULES && rlogits && rlogp && raux && rloss; sc++) {
        x.m.cfg.exec = SCHEDULES[sc];
        model_acts a;
        MOERL_ASSERT(model_acts_init(&a, &x.m, x.N) == MOERL_OK);
        a.replay_routes = x.routes;
        a.routes_out = rec;
        memset(rec, 0x7f, (size_t)x.N * x.Lm * x.K * sizeof(int16_t));
        float loss = run_loss(&x, &a, dlogp);
        char what[300];
        snprintf(what, sizeof what, "%s schedule %d: logits", tag, sc);
        t_close(what, a.logits, rlogits, (long)x.N * x.V, 2e-5f, 1e-4f);
        snprintf(what, sizeof what, "%s schedule %d: logp", tag, sc);
        t_close(what, a.logp, rlogp, x.N, 2e-5f, 1e-4f);
        snprintf(what, sizeof what, "%s schedule %d: aux_loss (native top-k counts)", tag, sc);
        t_close(what, &a.aux_loss, raux, 1, 1e-6f, 1e-5f);
        snprintf(what, sizeof what, "%s schedule %d: loss", tag, sc);
        t_close(what, &loss, rloss, 1, 1e-5f, 1e-5f);
        for (int l = 0; l < x.m.cfg.num_hidden_layers; l++) {
            const int mi = model_moe_layer_index(&x.m.cfg, l);
            if (mi < 0) continue;
            char nm[64];
            snprintf(nm, sizeof nm, "native_ids.%d", l);
            int *ids = get_i32(&x.f, nm, NULL);
            int mism = 0, used = 0;
            for (int t = 0; t < x.N && ids; t++)
                for (int j = 0; j < x.K; j++) {
                    mism += rec[((size_t)t * x.Lm + mi) * x.K + j] != ids[t * x.K + j];
                    const int16_t want = x.routes[((size_t)t * x.Lm + mi) * x.K + j];
                    used += a.layers[l].mlp.topk_ids[t * x.K + j] != (want >= 0 ? want : ids[t * x.K + j]);
                }
            CHECK(ids && mism == 0, "%s schedule %d layer %d: routes_out differs from the native top-k in %d entries",
                  tag, sc, l, mism);
            CHECK(used == 0, "%s schedule %d layer %d: %d experts used are not the replayed ones", tag, sc, l, used);
            free(ids);
        }
        int nbad = 0;
        for (int i = 0; i < model_hf_count(&x.m); i++) {
            char hf[128], gname[160];
            model_hf_name(&x.m, i, hf, sizeof hf);
            snprintf(gname, sizeof gname, "grad.%s", hf);
            int64_t numel, rn, shape[2];
            int nd;
            float *g = model_hf_tensor(&x.m, x.m.grads, hf, &nd, shape, &numel);
            float *rg = get_f32(&x.f, gname, &rn);
            if (!g || !rg || rn != numel) {
                CHECK(0, "%s: gradient %s missing or wrong size", tag, hf);
                free(rg);
                continue;
            }
            float gmax = 0;
            for (int64_t j = 0; j < numel; j++) gmax = fmaxf(gmax, fabsf(rg[j]));
            snprintf(what, sizeof what, "%s schedule %d: %s", tag, sc, gname);
            const int before = t_failed;
            t_close(what, g, rg, (long)numel, 1e-4f * gmax + 1e-9f, 1e-3f);
            nbad += t_failed != before;
            free(rg);
        }
        printf("%s schedule %d: %d gradients compared, %d off\n", tag, sc, model_hf_count(&x.m), nbad);
        model_acts_free(&a);
    }
    free(rlogits); free(rlogp); free(raux); free(rloss); free(dlogp); free(rec);
    fixture_close(&x);
}

/* Replaying the routes the forward itself chose (routes_out of a plain pass) changes nothing, bit for
 * bit: logits, aux loss and every gradient, on each schedule; tokens with −1 keep theirs too. */
static void check_native_bitwise(const char *tag) {
    fixture x;
    if (!fixture_open(&x, tag)) return;
    const size_t nr = (size_t)x.N * x.Lm * x.K;
    float *dlogp = xmalloc(x.N * sizeof(float));
    float *logits0 = xmalloc((size_t)x.N * x.V * sizeof(float)), *g0 = xmalloc(x.m.n_params * sizeof(float));
    int16_t *nat = xmalloc(nr * sizeof(int16_t)), *rec = xmalloc(nr * sizeof(int16_t));
    for (int sc = 0; sc < N_SCHEDULES; sc++) {
        x.m.cfg.exec = SCHEDULES[sc];
        model_acts a;
        MOERL_ASSERT(model_acts_init(&a, &x.m, x.N) == MOERL_OK);
        a.routes_out = nat;
        const float loss0 = run_loss(&x, &a, dlogp);
        const float aux0 = a.aux_loss;
        memcpy(logits0, a.logits, (size_t)x.N * x.V * sizeof(float));
        memcpy(g0, x.m.grads, x.m.n_params * sizeof(float));
        for (int t = 0; t < x.N; t += 3) /* every third token: no recorded route (native) */
            for (size_t i = 0; i < (size_t)x.Lm * x.K; i++) nat[(size_t)t * x.Lm * x.K + i] = -1;
        a.replay_routes = nat;
        a.routes_out = rec;
        const float loss1 = run_loss(&x, &a, dlogp);
        CHECK(loss1 == loss0 && a.aux_loss == aux0, "%s schedule %d: native replay loss %.9g aux %.9g vs %.9g %.9g", tag,
              sc, loss1, a.aux_loss, loss0, aux0);
        CHECK(!memcmp(logits0, a.logits, (size_t)x.N * x.V * sizeof(float)), "%s schedule %d: logits differ", tag, sc);
        CHECK(!memcmp(g0, x.m.grads, x.m.n_params * sizeof(float)), "%s schedule %d: gradients differ", tag, sc);
        model_acts_free(&a);
    }
    free(dlogp); free(logits0); free(g0); free(nat); free(rec);
    fixture_close(&x);
}

/* Bad replayed routes: an expert outside [0,E), one named twice, −1 mixed with experts. */
static void check_errors(void) {
    fixture x;
    if (!fixture_open(&x, "b")) return;
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &x.m, x.N) == MOERL_OK);
    const size_t nr = (size_t)x.N * x.Lm * x.K;
    int16_t *r = xmalloc(nr * sizeof(int16_t));
    a.replay_routes = r;
    struct { int16_t v0, v1; const char *want; } cases[] = {
        {16, 1, "outside [0,16)"}, {3, 3, "names expert 3 twice"}, {-1, 2, "mixes"}, {-2, 2, "outside"}};
    for (int c = 0; c < 4; c++) {
        memcpy(r, x.routes, nr * sizeof(int16_t));
        int16_t *row = r + ((size_t)7 * x.Lm + 1) * x.K; /* token 7, MoE layer 1 */
        for (int j = 0; j < x.K; j++) row[j] = (int16_t)(4 + j);
        row[0] = cases[c].v0;
        row[1] = cases[c].v1;
        const int rc = model_forward(&x.m, &a, x.tok, x.cu, NULL, x.B, x.N);
        CHECK(rc == MOERL_ERR && strstr(moerl_last_error(), cases[c].want) &&
                  strstr(moerl_last_error(), "token 7, MoE layer 1"),
              "case %d: rc %d: %s", c, rc, moerl_last_error());
    }
    free(r);
    model_acts_free(&a);
    fixture_close(&x);
}

/* ---- the trainer: actor.router_replay.mode and the routing-agreement metrics ---- */

#define G_RESP 4
static const int g_len[G_RESP] = {7, 11, 5, 9};
#define G_PROMPT 6

/* One group of G_RESP hand-made responses (random tokens, behaviour logprob −1 each) to a 6-token prompt. */
static rl_group *make_group(void) {
    rng_state r;
    rng_seed(&r, 31);
    rl_group *g = xcalloc(1, sizeof *g);
    g->n = g->n_done = G_RESP;
    for (int i = 0; i < G_PROMPT; i++) tok_seq_push(&g->prompt, 40 + (int)rng_below(&r, 60));
    g->reqs = xcalloc(G_RESP, sizeof(gen_request));
    g->rewards = xcalloc(G_RESP, sizeof(reward_result));
    for (int j = 0; j < G_RESP; j++) {
        gen_request *q = &g->reqs[j];
        q->id = j;
        q->prompt = g->prompt.ids;
        q->prompt_len = G_PROMPT;
        q->n_out = g_len[j];
        q->finish = FINISH_STOP;
        q->out_tokens = xmalloc((size_t)g_len[j] * sizeof(int));
        q->out_logprobs = xmalloc((size_t)g_len[j] * sizeof(float));
        q->out_versions = xcalloc((size_t)g_len[j], sizeof(int));
        for (int t = 0; t < g_len[j]; t++) {
            q->out_tokens[t] = 40 + (int)rng_below(&r, 60);
            q->out_logprobs[t] = -1.0f;
        }
        g->rewards[j].score = (float)j;
        q->user = g;
    }
    return g;
}

static void free_group(rl_group *g) {
    for (int j = 0; j < g->n; j++) {
        free(g->reqs[j].out_routes);
        g->reqs[j].out_routes = NULL;
    }
    rl_group_free(g);
}

/* Rollout routes for the group: the model's native routes (a recording forward, as the engine's would
 * be with the trainer's weights), the last token unrecorded (n_routes = len − 1); with perturb, the
 * routes of (token t, MoE layer t mod 2) for t ≡ 0 mod 3 replaced by the complement of the native set
 * (E = 4, top-2: certainly another set). dis[mi] counts the perturbed pairs per layer, tot the recorded ones. */
static void attach_rollout_routes(const moe_model *m, rl_group *g, int perturb, double *dis, double *tot) {
    const int K = m->cfg.num_experts_per_tok, E = m->cfg.num_experts, per = model_moe_layer_count(&m->cfg) * K;
    MOERL_ASSERT(E == 4 && K == 2 && per == 4);
    train_seq seqs[G_RESP];
    int *toks[G_RESP];
    float *lp[G_RESP];
    int16_t *rec[G_RESP];
    for (int j = 0; j < G_RESP; j++) {
        const gen_request *q = &g->reqs[j];
        const int L = q->prompt_len + q->n_out;
        toks[j] = xmalloc((size_t)L * sizeof(int));
        memcpy(toks[j], q->prompt, (size_t)q->prompt_len * sizeof(int));
        memcpy(toks[j] + q->prompt_len, q->out_tokens, (size_t)q->n_out * sizeof(int));
        seqs[j] = (train_seq){.tokens = toks[j], .len = L, .resp_start = q->prompt_len};
        lp[j] = xmalloc((size_t)L * sizeof(float));
        rec[j] = xmalloc((size_t)L * per * sizeof(int16_t));
    }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, 256) == MOERL_OK);
    train_route_opts ro = {.record = rec};
    MOERL_ASSERT(compute_logprobs_routes(m, &a, seqs, G_RESP, 256, 1.0f, lp, &ro) == MOERL_OK);
    model_acts_free(&a);
    dis[0] = dis[1] = 0;
    *tot = 0;
    for (int j = 0; j < G_RESP; j++) {
        gen_request *q = &g->reqs[j];
        q->n_routes = seqs[j].len - 1;
        *tot += 2.0 * q->n_routes;
        for (int t = 0; perturb && t < q->n_routes; t += 3) {
            int16_t *x = rec[j] + (size_t)t * per + (t % 2) * K;
            int16_t y[2], k = 0;
            for (int e = 0; e < E; e++)
                if (e != x[0] && e != x[1]) y[k++] = (int16_t)e;
            x[0] = y[0];
            x[1] = y[1];
            dis[t % 2]++;
        }
        free(q->out_routes);
        q->out_routes = rec[j];
        free(toks[j]);
        free(lp[j]);
    }
}

static rl_config replay_config(router_replay_mode mode, int recompute_old) {
    rl_config c = rl_test_config();
    c.n = G_RESP;
    c.ppo_mini_batch_size = 1;
    c.ppo_epochs = 1;
    c.ppo_max_token_len = 256;
    c.temperature = 1.0f;
    c.optim.lr = 0.0f;
    c.optim.max_grad_norm = 0.0f;
    c.recompute_old = recompute_old;
    c.rollout_routing_replay = 1;
    c.router_replay = mode;
    return c;
}

/* trainer_step on a fresh copy of the group with routes as asked; the gradient (lr 0) and the statistics. */
static void replay_step(const moe_model *m0, const rl_config *c, int perturb, float *grads, train_stats *st,
                        double *dis, double *tot) {
    moe_model m;
    MOERL_ASSERT(model_init(&m, &m0->cfg) == MOERL_OK);
    memcpy(m.params, m0->params, m.n_params * sizeof(float));
    rl_group *g = make_group();
    if (perturb >= 0) attach_rollout_routes(&m, g, perturb, dis, tot);
    trainer T;
    MOERL_ASSERT(trainer_init(&T, c, NULL, &m) == MOERL_OK);
    const int rc = trainer_step(&T, &g, 1, st);
    CHECK(rc == MOERL_OK, "trainer_step (mode %d, perturb %d): %s", c->router_replay, perturb, moerl_last_error());
    memcpy(grads, m.grads, m.n_params * sizeof(float));
    trainer_free(&T);
    free_group(g);
    model_free(&m);
}

/* disabled / R3 / R2 through trainer_step: R3 replaying the native routes gives the unreplayed gradient bit
 * for bit and perturbed routes change it; the agreement metrics of a case with known disagreement
 * (exact: they are ratios of integer counts); R3 without recorded routes refused. */
static void check_trainer(void) {
    moe_model m;
    rl_tiny_model(&m, 5, 0.01f);
    const size_t P = m.n_params;
    float *g_off = xmalloc(P * sizeof(float)), *g = xmalloc(P * sizeof(float));
    double dis[2], tot;
    train_stats st;
    rl_config c = replay_config(ROUTER_REPLAY_DISABLED, 0);
    c.rollout_routing_replay = 0;
    replay_step(&m, &c, -1, g_off, &st, dis, &tot); /* no routes recorded: no metric */
    CHECK(st.routing_count == 0 && isnan(st.routing_agreement_min), "no routes: count %g", st.routing_count);
    /* disabled with perturbed rollout routes: the metrics see the disagreement, the gradient is unchanged */
    c = replay_config(ROUTER_REPLAY_DISABLED, 0);
    replay_step(&m, &c, 1, g, &st, dis, &tot);
    const double want = (tot - dis[0] - dis[1]) / tot;
    const double per_layer = tot / 2, worst = (per_layer - fmax(dis[0], dis[1])) / per_layer;
    CHECK(dis[0] > 0 && dis[1] > 0 && st.routing_count == tot && st.routing_agree / st.routing_count == want &&
              st.routing_agree_native / st.routing_count == want && st.routing_agreement_min == worst,
          "disabled: count %g (want %g), agreement %.6f native %.6f (want %.6f), min %.6f (want %.6f)", st.routing_count,
          tot, st.routing_agree / st.routing_count, st.routing_agree_native / st.routing_count, want,
          st.routing_agreement_min, worst);
    CHECK(!memcmp(g, g_off, P * sizeof(float)), "disabled: recorded routes changed the gradient");
    /* R3, native routes: 1.0 and the same gradient bit for bit */
    c = replay_config(ROUTER_REPLAY_R3, 0);
    replay_step(&m, &c, 0, g, &st, dis, &tot);
    CHECK(st.routing_agree == tot && st.routing_agree_native == tot && st.routing_agreement_min == 1.0,
          "R3 native: agreement %g native %g of %g", st.routing_agree, st.routing_agree_native, tot);
    CHECK(!memcmp(g, g_off, P * sizeof(float)), "R3 replaying the native routes changed the gradient");
    /* R3, perturbed: agreement 1.0 by construction, native as above, another gradient */
    replay_step(&m, &c, 1, g, &st, dis, &tot);
    CHECK(st.routing_agree == tot && st.routing_agreement_min == 1.0 &&
              st.routing_agree_native / st.routing_count == want,
          "R3 perturbed: agreement %g of %g, min %g, native %.6f (want %.6f)", st.routing_agree, tot,
          st.routing_agreement_min, st.routing_agree_native / st.routing_count, want);
    double diff = 0;
    for (size_t i = 0; i < P; i++) diff = fmax(diff, fabs((double)g[i] - g_off[i]));
    CHECK(diff > 1e-6, "R3 with other routes left the gradient unchanged (max diff %g)", diff);
    /* R3 and the old-logprob pass: the metrics are counted there (the first forward) */
    c = replay_config(ROUTER_REPLAY_R3, 1);
    replay_step(&m, &c, 1, g, &st, dis, &tot);
    CHECK(st.routing_count == tot && st.routing_agree == tot && st.routing_agree_native / st.routing_count == want,
          "R3 + recompute: count %g agreement %g native %.6f", st.routing_count, st.routing_agree,
          st.routing_agree_native / st.routing_count);
    /* R2: the old-logprob pass records the native routes and the update replays them (lr 0: the same weights,
     * so the gradient is the unreplayed one bit for bit); its metrics are the native ones */
    c = replay_config(ROUTER_REPLAY_DISABLED, 1);
    replay_step(&m, &c, 1, g_off, &st, dis, &tot);
    c = replay_config(ROUTER_REPLAY_R2, 1);
    replay_step(&m, &c, 1, g, &st, dis, &tot);
    CHECK(!memcmp(g, g_off, P * sizeof(float)), "R2 at unchanged weights changed the gradient");
    CHECK(st.routing_agree / st.routing_count == want && st.routing_agree_native == st.routing_agree,
          "R2: agreement %.6f native %.6f (want %.6f)", st.routing_agree / st.routing_count,
          st.routing_agree_native / st.routing_count, want);
    /* R3 with a response that carries no routes */
    c = replay_config(ROUTER_REPLAY_R3, 0);
    {
        rl_group *gr = make_group();
        trainer T;
        MOERL_ASSERT(trainer_init(&T, &c, NULL, &m) == MOERL_OK);
        CHECK(trainer_step(&T, &gr, 1, &st) == MOERL_ERR && strstr(moerl_last_error(), "carries no recorded routes") &&
                  strstr(moerl_last_error(), "rollout.enable_rollout_routing_replay"),
              "R3 without routes: %s", moerl_last_error());
        trainer_free(&T);
        free_group(gr);
    }
    { /* a dense model has nothing to replay: refused rather than ignored */
        const char *kv[] = {"model.num_experts=0", "model.num_hidden_layers=2"};
        moe_config dc = fx_small_config(kv, FX_N(kv));
        moe_model dm;
        MOERL_ASSERT(model_init(&dm, &dc) == MOERL_OK);
        trainer T;
        CHECK(trainer_init(&T, &c, NULL, &dm) == MOERL_ERR && strstr(moerl_last_error(), "no MoE layer") &&
                  strstr(moerl_last_error(), "actor.router_replay.mode=R3"),
              "R3 on a dense model: %s", moerl_last_error());
        trainer_free(&T);
        model_free(&dm);
    }
    free(g_off);
    free(g);
    model_free(&m);
}

/* actor.router_replay.mode read by rl_read_config: the values, and what R2 and R3 need. */
static int read_with(const char *const *kv, int n) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    fx_apply(c, kv, n);
    rl_config r;
    const int rc = rl_read_config(c, &r);
    cfg_free(c);
    return rc == MOERL_OK ? (int)r.router_replay : -1;
}

static void check_config_key(void) {
    const char *off[] = {"actor.router_replay.mode=disabled"};
    CHECK(read_with(off, 1) == ROUTER_REPLAY_DISABLED, "disabled: %s", moerl_last_error());
    const char *bad[] = {"actor.router_replay.mode=r3"};
    CHECK(read_with(bad, 1) == -1 && strstr(moerl_last_error(), "actor.router_replay.mode: 'r3' is not one of "
                                                                "disabled, R2, R3"),
          "bad value: %s", moerl_last_error());
    const char *r3[] = {"actor.router_replay.mode=R3"};
    CHECK(read_with(r3, 1) == -1 && strstr(moerl_last_error(), "rollout.enable_rollout_routing_replay=true") &&
              strstr(moerl_last_error(), "mode=R3"),
          "R3 without the engine's record: %s", moerl_last_error());
    const char *r2[] = {"actor.router_replay.mode=R2"};
    CHECK(read_with(r2, 1) == -1 && strstr(moerl_last_error(), "bypass_mode=false") &&
              strstr(moerl_last_error(), "use_decoupled_loss"),
          "R2 in bypass mode: %s", moerl_last_error());
    const char *r2ok[] = {"actor.router_replay.mode=R2", "algorithm.rollout_correction.bypass_mode=false"};
    CHECK(read_with(r2ok, 2) == ROUTER_REPLAY_R2, "R2 with recomputed old logprobs: %s", moerl_last_error());
    const char *r2dec[] = {"actor.router_replay.mode=R2", "actor.use_decoupled_loss=true"};
    CHECK(read_with(r2dec, 2) == ROUTER_REPLAY_R2, "R2 with the decoupled loss: %s", moerl_last_error());
}

int main(void) {
    check_config_key();
    check_trainer();
    check_reference("a");
    check_reference("b");
    check_native_bitwise("a");
    check_native_bitwise("b");
    check_errors();
    TEST_MAIN_END();
}
