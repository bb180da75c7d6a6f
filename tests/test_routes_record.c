/* The rollout engine's routing record (engine_config.record_routes, rollout routing replay R3) and its
 * transport:
 *   - the routes the engine records for every forwarded token (prompt and response) equal the top-k ids
 *     of model_forward (model_acts.layers[l].mlp.topk_ids) on the same sequence, MoE layers only (a model
 *     with a dense layer in the middle), through chunked prefill (max_num_batched_tokens 3, 8 and 64),
 *     greedy, sampled and forced decoding, several requests in one batch; n_routes = prompt + output − 1
 *     (the last sampled token is never forwarded);
 *   - pause / resume under NEW weights: the routes recorded before the pause are kept (a re-prefilled
 *     token keeps its first route; docs/rl.md "Routing replay") and equal the old weights' forward, the
 *     tokens forwarded after the resume equal the new weights' forward;
 *   - engine_continue (multi-turn): the inserted tool tokens are prefilled and recorded, every route equals
 *     the full forward of prompt ⊕ all turns;
 *   - abort mid-generation: n_routes = the tokens forwarded, their routes exact;
 *   - a simulated engine refuses to record; an engine without recording allocates nothing;
 *   - wire format 4: a group's routes round-trip bit-exactly (alone and inside a train message); an older
 *     format is refused naming both formats; an expert id or n_routes out of range, a bad route shape and
 *     every truncation are refused; the encoder refuses what the decoder would;
 *   - the trainer's check (rl_group_check_routes) refuses missing routes, a count other than the forwarded
 *     tokens and another model's shape.
 * Reference: model_forward (the same router code — router_topk_rows — run over the whole sequence as one
 * batch). The engine computes the same fp32 math in other batch shapes, so router probabilities differ
 * by rounding only; a top-k choice may then differ only where two experts' probabilities are within
 * 1e-5 of each other (a near tie), and every mismatch must be such a tie (counted and printed). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "fixture.h"
#include "model/forward.h"
#include "model/model.h"
#include "rl/rl.h"
#include "rl/wire.h"
#include "rollout/engine.h"
#include "test.h"

#define MAXTOK 24
#define TIE_EPS 1e-5f /* rounding of fp32 router probabilities in different batch shapes (see above) */

static int n_ties; /* mismatches explained by a near tie, over the whole run */

/* 3 layers, layer 1 dense: MoE layers 0 and 2 are MoE indices 0 and 1; 8 experts, top-2. */
static moe_config cfg_routes(void) {
    const char *kv[] = {"model.num_hidden_layers=3", "model.mlp_only_layers=[1]", "model.num_experts=8",
                        "model.num_experts_per_tok=2", "model.max_position_embeddings=128",
                        "model.initializer_range=0.15"};
    return fx_small_config(kv, FX_N(kv));
}

static sampling_params sp_make(float temp, uint64_t seed, int max_tokens) {
    sampling_params sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = temp; sp.top_p = 1; sp.seed = seed; sp.max_tokens = max_tokens;
    return sp;
}

static void init_req(gen_request *r, int64_t id, int *prompt, int plen, sampling_params sp) {
    memset(r, 0, sizeof *r);
    r->id = id; r->prompt = prompt; r->prompt_len = plen; r->sp = sp;
}

static void run_all(engine *e) {
    gen_request *done[32];
    for (int guard = 0; engine_num_unfinished(e) > 0 && guard < 10000; guard++) MOERL_ASSERT(engine_step(e, done, 32) >= 0);
}

/* 1 if the reference probabilities p[E] of one token hold a near tie around the top-k boundary or
 * inside the top-k (two of the K + 1 largest within TIE_EPS). */
static int near_tie(const float *p, int E, int K) {
    float top[16];
    int n = 0;
    for (int i = 0; i < E; i++) { /* insertion into the K + 1 largest, descending */
        float v = p[i];
        int j = n < K + 1 ? n++ : K + 1;
        if (j == K + 1 && v <= top[K]) continue;
        if (j == K + 1) j = K;
        while (j > 0 && top[j - 1] < v) { top[j] = top[j - 1]; j--; }
        top[j] = v;
    }
    for (int i = 0; i + 1 < n; i++)
        if (top[i] - top[i + 1] < TIE_EPS) return 1;
    return 0;
}

/* Compare routes[lo, hi) (rows of n_moe·K) with model_forward of seq[0..n) under m. Returns mismatches
 * that are not near ties. */
static int compare_forward(const moe_model *m, const int *seq, int n, const int16_t *routes, int lo, int hi,
                           const char *tag) {
    const moe_config *c = &m->cfg;
    const int K = c->num_experts_per_tok, E = c->num_experts;
    int n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_moe += m->p.layers[l].router != NULL;
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, n) == MOERL_OK);
    int cu[2] = {0, n};
    MOERL_ASSERT(model_forward(m, &a, seq, cu, NULL, 1, n) == MOERL_OK);
    int bad = 0;
    for (int l = 0, mi = 0; l < c->num_hidden_layers; l++) {
        if (!m->p.layers[l].router) continue;
        const mlp_acts *s = &a.layers[l].mlp;
        for (int t = lo; t < hi; t++) {
            int same = 1;
            for (int k = 0; k < K; k++) same &= routes[((size_t)t * n_moe + mi) * K + k] == s->topk_ids[(size_t)t * K + k];
            if (same) continue;
            if (near_tie(s->probs + (size_t)t * E, E, K)) n_ties++;
            else if (bad++ < 3)
                fprintf(stderr, "  %s: token %d layer %d: engine (%d,%d) forward (%d,%d)\n", tag, t, l,
                        routes[((size_t)t * n_moe + mi) * K], routes[((size_t)t * n_moe + mi) * K + 1],
                        s->topk_ids[(size_t)t * K], s->topk_ids[(size_t)t * K + 1]);
        }
        mi++;
    }
    model_acts_free(&a);
    return bad;
}

/* prompt ⊕ output of r, the forwarded part: [prompt_len + n_out − 1] (into seq). */
static int forwarded_seq(const gen_request *r, int *seq) {
    for (int i = 0; i < r->prompt_len; i++) seq[i] = r->prompt[i];
    for (int i = 0; i < r->n_out; i++) seq[r->prompt_len + i] = r->out_tokens[i];
    return r->prompt_len + r->n_out;
}

static void test_vs_forward(int chunk) {
    moe_config c = cfg_routes();
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 23);
    engine_config ec = {.max_num_seqs = 3, .max_model_len = 80, .max_num_batched_tokens = chunk, .record_routes = 1};
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    int nm = 0, k = 0;
    CHECK(engine_route_width(e, &nm, &k) == 4 && nm == 2 && k == 2, "route width: %d MoE layers × k %d", nm, k);
    int p0[7] = {3, 14, 15, 9, 26, 5, 35}, p1[3] = {2, 7, 1}, p2[11] = {8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0};
    int forced[4] = {11, 12, 13, 11};
    gen_request r[4];
    init_req(&r[0], 0, p0, 7, sp_make(0, 1, MAXTOK));
    init_req(&r[1], 1, p1, 3, sp_make(1.0f, 2, MAXTOK - 5));
    init_req(&r[2], 2, p2, 11, sp_make(0.7f, 3, MAXTOK));
    r[2].sp.forced = forced; r[2].sp.n_forced = 4;
    init_req(&r[3], 3, p0, 7, sp_make(1.0f, 4, 1)); /* one token: only the prompt is forwarded */
    for (int i = 0; i < 4; i++) MOERL_ASSERT(engine_add(e, &r[i]) == MOERL_OK);
    CHECK(r[0].out_routes && r[0].n_routes == 0, "chunk %d: engine_add allocates the record", chunk);
    run_all(e);
    for (int i = 0; i < 4; i++) {
        char tag[64];
        snprintf(tag, sizeof tag, "chunk %d request %d", chunk, i);
        int seq[128];
        const int n = forwarded_seq(&r[i], seq);
        CHECK(r[i].n_routes == n - 1, "%s: n_routes %d, prompt %d + output %d − 1 expected", tag, r[i].n_routes,
              r[i].prompt_len, r[i].n_out);
        CHECK(compare_forward(&m, seq, n - 1, r[i].out_routes, 0, r[i].n_routes, tag) == 0,
              "%s: routes differ from model_forward's top-k outside near ties", tag);
    }
    CHECK(!memcmp(r[2].out_tokens, forced, sizeof forced), "chunk %d: forced tokens taken", chunk);
    for (int i = 0; i < 4; i++) gen_request_free_outputs(&r[i]);
    CHECK(r[0].out_routes == NULL && r[0].n_routes == 0, "gen_request_free_outputs frees the record");
    engine_free(e);
    model_free(&m);
}

/* Pause after `steps` steps, load other weights, resume: first routes kept, later ones the new forward's. */
static void test_pause_new_weights(void) {
    moe_config c = cfg_routes();
    moe_model m, m2;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK && model_init(&m2, &c) == MOERL_OK);
    model_init_random(&m, 23);
    model_init_random(&m2, 41);
    engine_config ec = {.max_num_seqs = 2, .max_model_len = 80, .max_num_batched_tokens = 5, .record_routes = 1};
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    int p0[9] = {3, 14, 15, 9, 26, 5, 35, 8, 9};
    gen_request r;
    init_req(&r, 0, p0, 9, sp_make(0.8f, 5, MAXTOK));
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    gen_request *done[4];
    for (int s = 0; s < 8; s++) MOERL_ASSERT(engine_step(e, done, 4) >= 0);
    MOERL_ASSERT(r.finish == FINISH_NONE);
    const int n_before = r.n_routes, w = 4;
    int16_t *snap = xmalloc((size_t)n_before * w * sizeof(int16_t));
    memcpy(snap, r.out_routes, (size_t)n_before * w * sizeof(int16_t));
    MOERL_ASSERT(engine_pause(e, NULL, 0) == 1);
    CHECK(r.n_routes == n_before, "pause keeps the record (%d → %d)", n_before, r.n_routes);
    MOERL_ASSERT(engine_load_weights(e, m2.params, m2.n_params, 1) == MOERL_OK);
    MOERL_ASSERT(engine_resume(e, done, 4) == 0);
    run_all(e);
    int seq[128];
    const int n = forwarded_seq(&r, seq);
    CHECK(r.n_interruptions == 1 && r.n_routes == n - 1, "resumed: n_routes %d of %d forwarded", r.n_routes, n - 1);
    CHECK(!memcmp(r.out_routes, snap, (size_t)n_before * w * sizeof(int16_t)),
          "the re-prefill under new weights keeps the %d tokens' first routes", n_before);
    CHECK(compare_forward(&m, seq, n_before, r.out_routes, 0, n_before, "before pause (old weights)") == 0,
          "routes before the pause equal the old weights' forward");
    CHECK(compare_forward(&m2, seq, n - 1, r.out_routes, n_before, r.n_routes, "after resume (new weights)") == 0,
          "routes after the resume equal the new weights' forward");
    /* the new weights route some kept token differently: the rule above is visible (else the test is blind) */
    int16_t *fresh = xcalloc((size_t)(n - 1) * w, sizeof(int16_t));
    {
        engine *e2 = engine_create(&c, ec);
        MOERL_ASSERT(e2 && engine_load_weights(e2, m2.params, m2.n_params, 1) == MOERL_OK);
        gen_request q;
        init_req(&q, 1, seq, n - 1, sp_make(0, 1, 1));
        MOERL_ASSERT(engine_add(e2, &q) == MOERL_OK);
        run_all(e2);
        memcpy(fresh, q.out_routes, (size_t)(n - 1) * w * sizeof(int16_t));
        gen_request_free_outputs(&q);
        engine_free(e2);
    }
    CHECK(memcmp(fresh, snap, (size_t)n_before * w * sizeof(int16_t)) != 0,
          "the new weights route the kept tokens otherwise (the test can tell first from last routes)");
    free(fresh);
    free(snap);
    gen_request_free_outputs(&r);
    engine_free(e);
    model_free(&m);
    model_free(&m2);
}

/* Multi-turn: turn 1 stops, 4 tool ids are inserted, turn 2 runs to the cap; all routes equal the forward. */
static void test_continue(void) {
    moe_config c = cfg_routes();
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 23);
    engine_config ec = {.max_num_seqs = 2, .max_model_len = 80, .max_num_batched_tokens = 4, .record_routes = 1};
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    int p0[6] = {3, 14, 15, 9, 26, 5}, forced[3] = {7, 7, 9};
    gen_request r;
    init_req(&r, 0, p0, 6, sp_make(1.0f, 9, MAXTOK));
    r.sp.forced = forced; r.sp.n_forced = 3;
    r.sp.n_stop = 1; r.sp.stop_tokens[0] = 9; /* turn 1 ends at the third (forced) token */
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    run_all(e);
    CHECK(r.finish == FINISH_STOP && r.n_out == 3 && r.n_routes == 6 + 3 - 1, "turn 1: %s, n_out %d, n_routes %d",
          finish_reason_name(r.finish), r.n_out, r.n_routes);
    int ins[4] = {60, 1, 2, 61};
    r.sp.n_stop = 0;
    MOERL_ASSERT(engine_continue(e, &r, ins, 4) == 1);
    CHECK(r.n_routes == 8, "engine_continue records nothing by itself (n_routes %d)", r.n_routes);
    run_all(e);
    int seq[128];
    const int n = forwarded_seq(&r, seq);
    CHECK(r.finish == FINISH_LENGTH && r.n_routes == n - 1, "turn 2: n_routes %d of %d forwarded (inserted ids "
          "included)", r.n_routes, n - 1);
    CHECK(compare_forward(&m, seq, n - 1, r.out_routes, 0, r.n_routes, "multi-turn") == 0,
          "multi-turn routes (the inserted ids too) equal the full forward");
    /* abort mid-generation: what was forwarded is recorded, exactly */
    gen_request a;
    init_req(&a, 1, p0, 6, sp_make(1.0f, 10, MAXTOK));
    MOERL_ASSERT(engine_add(e, &a) == MOERL_OK);
    gen_request *done[4];
    for (int s = 0; s < 5; s++) MOERL_ASSERT(engine_step(e, done, 4) >= 0);
    MOERL_ASSERT(engine_abort(e, done, 4) == 1 && a.finish == FINISH_ABORT);
    const int na = forwarded_seq(&a, seq);
    CHECK(a.n_routes == na - 1, "aborted: n_routes %d, %d forwarded", a.n_routes, na - 1);
    CHECK(compare_forward(&m, seq, na - 1, a.out_routes, 0, a.n_routes, "aborted") == 0, "aborted request's routes");
    gen_request_free_outputs(&a);
    gen_request_free_outputs(&r);
    engine_free(e);
    model_free(&m);
}

static void test_config_refusals(void) {
    moe_config c = cfg_routes();
    engine_config ec = {.max_num_seqs = 2, .max_model_len = 40, .max_num_batched_tokens = 4, .simulated = 1,
                        .record_routes = 1};
    CHECK(engine_create(&c, ec) == NULL && strstr(moerl_last_error(), "simulated"), "simulated + record: %s",
          moerl_last_error());
    ec.simulated = 0;
    ec.record_routes = 0;
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e);
    int nm = -1, k = -1;
    CHECK(engine_route_width(e, &nm, &k) == 0 && nm == 0 && k == 0, "no recording: width 0");
    int p[2] = {1, 2};
    gen_request r;
    init_req(&r, 0, p, 2, sp_make(0, 1, 2));
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    CHECK(r.out_routes == NULL, "no record allocated without record_routes");
    engine_abort(e, NULL, 0);
    gen_request_free_outputs(&r);
    engine_free(e);
}

/* ------------------------------------------------------------------ wire */

/* A group of 3 responses with recorded routes (2 MoE layers × k 2 of 8 experts); response 1 has none
 * recorded yet (n_routes 0). */
static rl_group *routed_group(void) {
    rl_group *g = xcalloc(1, sizeof *g);
    g->uid = 77;
    g->row = 7;
    g->epoch = 1;
    g->start_version = 2;
    g->n = g->n_done = 3;
    g->route_layers = 2; g->route_k = 2; g->route_experts = 8;
    for (int i = 0; i < 5; i++) tok_seq_push(&g->prompt, 10 + i);
    g->reqs = xcalloc(3, sizeof(gen_request));
    const int lens[3] = {4, 0, 6};
    for (int j = 0; j < 3; j++) {
        gen_request *r = &g->reqs[j];
        r->prompt = g->prompt.ids;
        r->prompt_len = 5;
        r->n_out = lens[j];
        r->finish = FINISH_LENGTH;
        r->out_tokens = xcalloc(8, sizeof(int));
        r->out_logprobs = xcalloc(8, sizeof(float));
        r->out_versions = xcalloc(8, sizeof(int));
        for (int t = 0; t < lens[j]; t++) r->out_tokens[t] = t + j, r->out_versions[t] = 2;
        r->n_routes = j == 1 ? 0 : 5 + lens[j] - 1;
        r->out_routes = xmalloc((size_t)(5 + 8) * 4 * sizeof(int16_t));
        for (int i = 0; i < r->n_routes * 4; i++) r->out_routes[i] = (int16_t)((i * 5 + j) % 8);
        r->user = g;
    }
    return g;
}

static int same_routes(const rl_group *a, const rl_group *b) {
    if (a->route_layers != b->route_layers || a->route_k != b->route_k || a->route_experts != b->route_experts)
        return 0;
    const int w = a->route_layers * a->route_k;
    for (int j = 0; j < a->n; j++) {
        const gen_request *x = &a->reqs[j], *y = &b->reqs[j];
        if (!w && (y->out_routes || y->n_routes)) return 0;
        if (w && (x->n_routes != y->n_routes || !y->out_routes ||
                  memcmp(x->out_routes, y->out_routes, (size_t)x->n_routes * w * sizeof(int16_t))))
            return 0;
    }
    return 1;
}

/* The decoder's answer for buf with `bytes` bytes at `off` replaced by v ("OK" when it accepts). */
static const char *patched_decode(const void *buf, size_t len, size_t off, int32_t v, int bytes) {
    unsigned char *p = xmalloc(len);
    memcpy(p, buf, len);
    memcpy(p + off, &v, bytes);
    rl_group *x = NULL;
    const int rc = rl_group_decode(p, len, &x);
    MOERL_ASSERT(rc == MOERL_OK || x == NULL);
    rl_group_free(x);
    free(p);
    return rc == MOERL_OK ? "OK" : moerl_last_error();
}

static void test_wire(void) {
    rl_group *g = routed_group();
    void *buf;
    size_t len;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_OK, "encode: %s", moerl_last_error());
    /* header 40, prompt 20, route shape 12, responses 20 + 12·n_out + 8·n_routes (2 × 2 int16), scored 4, has_traj 4,
     * n_preemptions 4 per response (format 5) */
    const size_t want = 40 + 20 + 12 + 3 * 20 + 12 * (4 + 0 + 6) + 8 * (8 + 0 + 10) + 4 + 4 + 3 * 4;
    CHECK(len == want, "encoded %zu bytes, layout says %zu", len, want);
    rl_group *d = NULL;
    CHECK(rl_group_decode(buf, len, &d) == MOERL_OK && same_routes(g, d), "routes round trip: %s",
          moerl_last_error());
    rl_group_free(d);
    /* offsets: route shape 60 (layers), 64 (k), 68 (experts); response 0 at 72: n_routes at 72 + 12 + 48 + 4
     * (has_mask) = 136, routes 140.. */
    struct {
        size_t off;
        int32_t v;
        int bytes;
        const char *want;
    } cs[] = {
        {8, 3, 4, "format 3, this build reads format 5"},
        {60, 0, 4, "route shape 0 MoE layers"},
        {64, 9, 4, "k 9 of 8 experts"},
        {68, 40000, 4, "40000 experts"},
        {136, -1, 4, "n_routes"},
        {136, 10, 4, "n_routes"},          /* more than prompt 5 + output 4 */
        {140, 8, 2, "uid 77 response 0: token 0, MoE layer 0: expert 8 outside [0, 8)"},
        {140 + 6, -1, 2, "token 0, MoE layer 1: expert -1"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const char *msg = patched_decode(buf, len, cs[i].off, cs[i].v, cs[i].bytes);
        CHECK(strcmp(msg, "OK") && strstr(msg, cs[i].want), "patch %zu (offset %zu = %d): '%s' lacks '%s'", i,
              cs[i].off, cs[i].v, msg, cs[i].want);
    }
    CHECK(!strcmp(patched_decode(buf, len, 140, 7, 2), "OK"), "an in-range expert id still decodes");
    int trunc_ok = 1;
    for (size_t cut = 0; cut < len; cut++) {
        rl_group *x = NULL;
        if (rl_group_decode(buf, cut, &x) != MOERL_ERR || x) {
            trunc_ok = 0;
            rl_group_free(x);
            break;
        }
    }
    CHECK(trunc_ok, "every truncation of a routed group is refused");
    free(buf);
    /* in a train message (the trainer ranks' path) */
    rl_minibatch mb = {.n_groups = 1, .resp_tokens = 10, .tokens = 25};
    rl_train_msg tm;
    CHECK(rl_train_msg_encode(RL_TRAIN_CMD_STEP, 2, 5, &mb, 1, &g, &buf, &len) == MOERL_OK &&
              rl_train_msg_decode(buf, len, &tm) == MOERL_OK && tm.n_groups == 1 && same_routes(g, tm.groups[0]),
          "routes in a train message: %s", moerl_last_error());
    rl_train_msg_free(&tm);
    free(buf);
    /* the encoder refuses what the decoder would */
    g->reqs[2].out_routes[3] = 8;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_ERR && strstr(moerl_last_error(), "expert 8 outside"),
          "encode of an expert id out of range: %s", moerl_last_error());
    g->reqs[2].out_routes[3] = 1;
    g->reqs[0].n_routes = 10;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_ERR && strstr(moerl_last_error(), "10 recorded routes"),
          "encode of n_routes past the sequence: %s", moerl_last_error());
    g->reqs[0].n_routes = 8;
    g->route_k = 9;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_ERR && strstr(moerl_last_error(), "route shape"),
          "encode of a bad route shape: %s", moerl_last_error());
    /* a group without a route shape sends no routes (and decodes without any) */
    g->route_layers = g->route_k = g->route_experts = 0;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_OK && rl_group_decode(buf, len, &d) == MOERL_OK &&
              same_routes(g, d) && !d->reqs[0].out_routes,
          "no route shape: no routes on the wire: %s", moerl_last_error());
    rl_group_free(d);
    free(buf);
    rl_group_free(g);
}

/* The trainer's check (rl_group_check_routes) against the model: the shape, the count per response. */
static void test_trainer_check(void) {
    const char *kv[] = {"model.num_hidden_layers=3", "model.mlp_only_layers=[1]", "model.num_experts=8",
                        "model.num_experts_per_tok=2"};
    moe_config c = fx_small_config(kv, FX_N(kv));
    rl_group *g = routed_group();
    int64_t tok = 0;
    CHECK(rl_group_check_routes(g, &c, &tok) == MOERL_ERR && strstr(moerl_last_error(), "response 1: 0 tokens"),
          "a response without its routes is refused: %s", moerl_last_error());
    g->reqs[1].n_routes = 5 + 0 - 1;
    tok = 0;
    CHECK(rl_group_check_routes(g, &c, &tok) == MOERL_OK && tok == 8 + 4 + 10, "a complete group passes (%lld "
          "tokens): %s", (long long)tok, moerl_last_error());
    g->reqs[2].n_routes = 11;
    CHECK(rl_group_check_routes(g, &c, NULL) == MOERL_ERR && strstr(moerl_last_error(), "11 tokens with recorded "
          "routes, 10 forwarded"), "a count other than the forwarded tokens: %s", moerl_last_error());
    g->reqs[2].n_routes = 10;
    c.num_experts_per_tok = 3;
    CHECK(rl_group_check_routes(g, &c, NULL) == MOERL_ERR && strstr(moerl_last_error(), "another model"),
          "another model's routes: %s", moerl_last_error());
    c.num_experts_per_tok = 2;
    g->route_layers = g->route_k = g->route_experts = 0;
    CHECK(rl_group_check_routes(g, &c, NULL) == MOERL_ERR && strstr(moerl_last_error(), "recorded none"),
          "a group without routes: %s", moerl_last_error());
    rl_group_free(g);
}

int main(void) {
    const int chunks[3] = {3, 8, 64};
    for (int i = 0; i < 3; i++) test_vs_forward(chunks[i]);
    test_pause_new_weights();
    test_continue();
    test_config_refusals();
    test_wire();
    test_trainer_check();
    printf("top-k mismatches at near ties (probabilities within %g): %d\n", (double)TIE_EPS, n_ties);
    TEST_MAIN_END();
}
