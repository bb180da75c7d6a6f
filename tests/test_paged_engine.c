/* The paged KV cache (issue 28): the paged attention kernels against the slot layout; the engine
 * under a tiny block budget (64 long generations, many preemptions), with prefix sharing on and
 * off, against the default reservation: the same tokens and the same logprob bits under the
 * batch-invariant kernels (whose outputs do not depend on the batch a token is computed in), the
 * same greedy tokens and logprobs within rounding with the default kernels; a GRPO batch's prefix
 * hits and prefill tokens, counted exactly; a weight swap never reusing old blocks; routes of
 * shared prompt tokens; the refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "plan/plan_kv.h"
#include "rl/rl.h"
#include "rollout/engine.h"
#include "test.h"

static moe_config small_config(int bi) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 61; c.hidden_size = 32; c.intermediate_size = 40; c.moe_intermediate_size = 16;
    c.num_hidden_layers = 2; c.num_attention_heads = 4; c.num_key_value_heads = 2;
    c.head_dim = 8; c.num_experts = 8; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1;
    c.norm_topk_prob = 1; c.max_position_embeddings = 512;
    c.rms_norm_eps = 1e-6f; c.rope_theta = 1e4f; c.initializer_range = 0.15f;
    c.bos_token_id = -1; c.eos_token_id = -1;
    c.exec.batch_invariant = bi;
    return c;
}

/* ---------------------------------------------------------------- kernels */

/* Paged kernels on a scrambled block table vs the slot layout holding the same rows: equal bits. */
static void test_kernels(void) {
    enum { NS = 3, ML = 150, BS = 16, MB = (ML + BS - 1) / BS, NKV = 2, NH = 4, HD = 8 };
    const long row = NKV * HD;
    float *ks = xcalloc((size_t)NS * ML * row, 4), *vs = xcalloc((size_t)NS * ML * row, 4);
    const int NB = NS * MB + 5;
    float *kp = xcalloc((size_t)NB * BS * row, 4), *vp = xcalloc((size_t)NB * BS * row, 4);
    int tables[NS * MB], perm[NB];
    for (int i = 0; i < NB; i++) perm[i] = i;
    rng_state g;
    rng_seed(&g, 5);
    for (int i = NB - 1; i > MB; i--) { /* sequence 0: blocks 0.. in order (contiguous path); the others shuffled */
        const int j = MB + (int)(rng_uniform(&g) * (i + 1 - MB)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0; s < NS; s++)
        for (int b = 0; b < MB; b++) tables[s * MB + b] = perm[s * MB + b];
    for (int s = 0; s < NS; s++)
        for (int p = 0; p < ML; p++)
            for (int d = 0; d < row; d++) {
                const float kv = rng_uniform(&g) * 2 - 1, vv = rng_uniform(&g) * 2 - 1;
                ks[((size_t)s * ML + p) * row + d] = kv;
                vs[((size_t)s * ML + p) * row + d] = vv;
                const size_t o = ((size_t)tables[s * MB + p / BS] * BS + p % BS) * row + d;
                kp[o] = kv;
                vp[o] = vv;
            }
    /* a batch: decode tokens at long positions and a prefill chunk crossing blocks */
    int seq[40], pos[40], N = 0;
    seq[N] = 0; pos[N++] = 149;
    seq[N] = 1; pos[N++] = 63;
    for (int p = 60; p < 95; p++) { seq[N] = 2; pos[N++] = p; }
    float *q = xmalloc((size_t)N * NH * HD * 4), *o1 = xmalloc((size_t)N * NH * HD * 4), *o2 = xmalloc((size_t)N * NH * HD * 4);
    for (int i = 0; i < N * NH * HD; i++) q[i] = rng_uniform(&g) * 2 - 1;
    for (int bi = 0; bi < 2; bi++) {
        if (bi) {
            attention_kvcache_forward_bi(o1, q, ks, vs, seq, pos, N, NH, NKV, HD, ML, 0.35f);
            attention_kvcache_paged_forward_bi(o2, q, kp, vp, tables, MB, seq, pos, N, NH, NKV, HD, BS, 0.35f);
        } else {
            attention_kvcache_forward(o1, q, ks, vs, seq, pos, N, NH, NKV, HD, ML, 0.35f);
            attention_kvcache_paged_forward(o2, q, kp, vp, tables, MB, seq, pos, N, NH, NKV, HD, BS, 0.35f);
        }
        CHECK(!memcmp(o1, o2, (size_t)N * NH * HD * 4), "paged kernel (%s) differs from the slot layout",
              bi ? "batch-invariant" : "default");
    }
    void *f[] = {ks, vs, kp, vp, q, o1, o2};
    for (int i = 0; i < 7; i++) free(f[i]);
}

/* ---------------------------------------------------------------- engine runs */

typedef struct {
    int n, plen[64], max_tokens[64];
    int *prompt[64];
    int arrive[64]; /* the engine step before which request i is added (0: all at the start) */
    float temp;
} workload;

typedef struct {
    int n_out[64], tokens[64][200], n_routes[64], preempt_sum;
    float lp[64][200];
    int16_t *routes[64];
    engine_stats st;
} outcome;

static void run(const moe_config *c, const moe_model *m, engine_config ec, const workload *w, outcome *o) {
    memset(o, 0, sizeof *o);
    engine *e = engine_create(c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m->params, m->n_params, 0) == MOERL_OK);
    gen_request *r = xcalloc(w->n, sizeof *r), *done[128];
    int added = 0, guard = 0;
    for (int step = 0; (added < w->n || engine_num_unfinished(e) > 0) && guard++ < 200000; step++) {
        for (int i = 0; i < w->n; i++) {
            if (w->arrive[i] != step) continue;
            r[i].id = i; r[i].prompt = w->prompt[i]; r[i].prompt_len = w->plen[i];
            r[i].sp.temperature = w->temp; r[i].sp.top_p = 1; r[i].sp.seed = 100 + i; r[i].sp.max_tokens = w->max_tokens[i];
            CHECK(engine_add(e, &r[i]) == MOERL_OK, "add: %s", moerl_last_error());
            added++;
        }
        MOERL_ASSERT(engine_step(e, done, 128) >= 0);
    }
    const int rw = engine_route_width(e, NULL, NULL);
    for (int i = 0; i < w->n; i++) {
        o->n_out[i] = r[i].n_out;
        memcpy(o->tokens[i], r[i].out_tokens, r[i].n_out * sizeof(int));
        memcpy(o->lp[i], r[i].out_logprobs, r[i].n_out * sizeof(float));
        o->n_routes[i] = r[i].n_routes;
        o->preempt_sum += r[i].n_preemptions;
        if (rw) {
            o->routes[i] = xmalloc((size_t)r[i].n_routes * rw * 2);
            memcpy(o->routes[i], r[i].out_routes, (size_t)r[i].n_routes * rw * 2);
        }
        gen_request_free_outputs(&r[i]);
    }
    o->st = engine_get_stats(e);
    free(r);
    engine_free(e);
}

/* Same tokens (and logprobs: exact, or within tol) for every request. */
static void same(const workload *w, const outcome *a, const outcome *b, float tol, const char *what) {
    int tok_diff = 0;
    float lp_diff = 0;
    for (int i = 0; i < w->n; i++) {
        CHECK(a->n_out[i] == b->n_out[i], "%s: request %d: %d vs %d tokens", what, i, a->n_out[i], b->n_out[i]);
        for (int t = 0; t < a->n_out[i] && t < b->n_out[i]; t++) {
            tok_diff += a->tokens[i][t] != b->tokens[i][t];
            lp_diff = fmaxf(lp_diff, fabsf(a->lp[i][t] - b->lp[i][t]));
        }
    }
    CHECK(tok_diff == 0, "%s: %d tokens differ", what, tok_diff);
    CHECK(tol == 0 ? lp_diff == 0 : lp_diff <= tol, "%s: max |logprob diff| %g (allowed %g)", what, (double)lp_diff,
          (double)tol);
}

static void free_outcome(outcome *o) {
    for (int i = 0; i < 64; i++) free(o->routes[i]);
}

/* 64 long generations (prompts 5..40 tokens, 80..100 new) in a budget of 24 blocks of 8 tokens — a
 * seventh of what they need at once: many preemptions; the same outputs as the default reservation. */
static void test_preemption(int bi, float temp) {
    moe_config c = small_config(bi);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 7);
    workload w = {.n = 64, .temp = temp};
    static int buf[64][40];
    for (int i = 0; i < 64; i++) {
        w.plen[i] = 5 + (i * 7) % 36;
        w.max_tokens[i] = 80 + (i * 11) % 21;
        for (int j = 0; j < w.plen[i]; j++) buf[i][j] = (i * 31 + j * 17 + (j * j) % 7) % c.vocab_size;
        w.prompt[i] = buf[i];
    }
    engine_config ref = {.max_num_seqs = 16, .max_model_len = 150, .max_num_batched_tokens = 64,
                         .record_routes = 1};
    engine_config tiny = ref;
    tiny.block_size = 8;
    const int64_t block_bytes = 2LL * c.num_hidden_layers * 8 * c.num_key_value_heads * c.head_dim * 4;
    tiny.kv_cache_bytes = 24 * block_bytes;
    outcome a, b, p;
    run(&c, &m, ref, &w, &a);
    run(&c, &m, tiny, &w, &b);
    tiny.enable_prefix_caching = 1;
    run(&c, &m, tiny, &w, &p);
    char what[160];
    snprintf(what, sizeof what, "%s T=%g: tiny budget vs default reservation", bi ? "batch-invariant" : "default", (double)temp);
    CHECK(a.st.preemptions == 0 && b.st.preemptions > 64 && b.st.kv_blocks_total == 24 && b.st.kv_blocks_peak <= 24,
          "%s: preemptions %lld / %lld, blocks %lld (peak %lld)", what, (long long)a.st.preemptions,
          (long long)b.st.preemptions, (long long)b.st.kv_blocks_total, (long long)b.st.kv_blocks_peak);
    CHECK(b.preempt_sum == b.st.preemptions, "%s: per-request preemptions sum to %d, the engine counted %lld", what,
          b.preempt_sum, (long long)b.st.preemptions);
    printf("%s: %lld preemptions (%lld with prefix caching, %lld prompt tokens hit)\n", what,
           (long long)b.st.preemptions, (long long)p.st.preemptions, (long long)p.st.prefix_hit_tokens);
    /* batch-invariant kernels: a token's logits are the same bits in any batch, so exact; default kernels:
     * the batch's shape changes the GEMM/expert blocking, fp32 rounding ≤ 1e-5 on these logprobs */
    same(&w, &a, &b, bi ? 0 : 1e-5f, what);
    snprintf(what, sizeof what, "%s T=%g: tiny budget + prefix caching vs default", bi ? "batch-invariant" : "default", (double)temp);
    same(&w, &a, &p, bi ? 0 : 1e-5f, what);
    /* equal lengths through the preemptions: every forwarded token has its route (all but the last sampled) */
    int bad = 0, rdiff = 0;
    for (int i = 0; i < 64; i++) {
        bad += b.n_routes[i] != w.plen[i] + b.n_out[i] - 1 || p.n_routes[i] != w.plen[i] + p.n_out[i] - 1;
        if (bi && !bad && a.n_routes[i] == b.n_routes[i])
            rdiff += memcmp(a.routes[i], b.routes[i], (size_t)a.n_routes[i] * 2 * 2) != 0 ||
                     memcmp(a.routes[i], p.routes[i], (size_t)a.n_routes[i] * 2 * 2) != 0;
    }
    CHECK(bad == 0, "%s: %d requests whose routes do not cover prompt ⊕ output − 1", what, bad);
    CHECK(rdiff == 0, "%s: %d requests' routes differ from the default run's", what, rdiff);
    free_outcome(&a); free_outcome(&b); free_outcome(&p);
    model_free(&m);
}

/* A GRPO batch: 4 prompts (33, 38..40 tokens) × n = 8 samples. With prefix caching and 16-token blocks each
 * group forwards its prompt exactly once: the 7 other samples take its 32 tokens of full blocks from the
 * cache and a copy of its tail (the last 1..8 tokens: the 33-token prompt's is its last token alone) with its
 * last-position logits, so prefill = Σ P over the groups and hits = 7 × Σ P (prefill + hits = every prompt
 * token); the outputs (tokens, logprobs, routes) are those of the run without sharing. */
static void test_grpo(int bi) {
    moe_config c = small_config(bi);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 9);
    workload w = {.n = 32, .temp = 1.0f};
    static int buf[4][40];
    int plen_sum = 0;
    for (int g = 0; g < 4; g++) {
        for (int j = 0; j < 40; j++) buf[g][j] = (g * 13 + j * 7 + 3) % c.vocab_size;
        for (int k = 0; k < 8; k++) {
            w.plen[g * 8 + k] = g ? 37 + g : 33;
            w.prompt[g * 8 + k] = buf[g];
            w.max_tokens[g * 8 + k] = 20;
        }
        plen_sum += g ? 37 + g : 33;
    }
    engine_config off = {.max_num_seqs = 32, .max_model_len = 80, .max_num_batched_tokens = 512, .record_routes = 1};
    engine_config on = off;
    on.enable_prefix_caching = 1;
    outcome a, b;
    run(&c, &m, off, &w, &a);
    run(&c, &m, on, &w, &b);
    const int64_t hits = 7 * plen_sum;
    CHECK(a.st.prefix_hit_tokens == 0 && b.st.prefix_hit_tokens == hits, "GRPO: prefix hits %lld / %lld, expected 0 / %lld",
          (long long)a.st.prefix_hit_tokens, (long long)b.st.prefix_hit_tokens, (long long)hits);
    CHECK(a.st.prefill_tokens == 8 * plen_sum && b.st.prefill_tokens == 8 * plen_sum - hits,
          "GRPO: prefill tokens %lld (off) / %lld (on), expected %d / %lld", (long long)a.st.prefill_tokens,
          (long long)b.st.prefill_tokens, 8 * plen_sum, (long long)(8 * plen_sum - hits));
    printf("GRPO 4 × 8 (%s): prefill tokens %lld → %lld with prefix caching\n", bi ? "batch-invariant" : "default",
           (long long)a.st.prefill_tokens, (long long)b.st.prefill_tokens);
    same(&w, &a, &b, bi ? 0 : 1e-5f, bi ? "GRPO batch-invariant: prefix caching on vs off" : "GRPO default: prefix caching on vs off");
    int rdiff = 0;
    for (int i = 0; i < 32; i++)
        rdiff += a.n_routes[i] != b.n_routes[i] ||
                 (bi && memcmp(a.routes[i], b.routes[i], (size_t)a.n_routes[i] * 2 * 2) != 0);
    CHECK(rdiff == 0, "GRPO: %d requests' routes differ with prefix caching (shared prompt tokens get the owner's)", rdiff);
    free_outcome(&a); free_outcome(&b);
    model_free(&m);
}

/* Group prefill's edges, each against the run without prefix caching (batch-invariant kernels: the leader's
 * logits and tail rows are the bits a follower's own forward gives, so outputs, logprobs and routes are equal
 * bit for bit): (1) a block-aligned prompt (32 tokens, 16-token blocks: the tail copied is the last full block;
 * each sample then holds its own block for outputs): the prompt is forwarded exactly once; (2) a group whose
 * samples arrive in different steps (the leader already decoding when the others come: they still copy), the
 * last after the leader finished (it forwards the 5-token tail again). */
static void test_group_edges(void) {
    moe_config c = small_config(1);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 13);
    static int buf[2][40];
    for (int j = 0; j < 40; j++) {
        buf[0][j] = (j * 5 + 2) % c.vocab_size;
        buf[1][j] = (j * 3 + 11) % c.vocab_size;
    }
    engine_config off = {.max_num_seqs = 16, .max_model_len = 80, .max_num_batched_tokens = 256, .record_routes = 1};
    engine_config on = off;
    on.enable_prefix_caching = 1;
    for (int late = 0; late < 2; late++) {
        workload w = {.n = 7, .temp = 1.0f};
        const int P = late ? 37 : 32;
        for (int i = 0; i < 7; i++) {
            w.plen[i] = P;
            w.prompt[i] = buf[late];
            w.max_tokens[i] = 12;
            /* late: one more sample every 2 steps while the leader decodes its 12 tokens (steps 0..11), and the
             * last at step 20, after the leader finished: its tail went with the leader's blocks, so it forwards
             * the tail itself (its full blocks are still cached) */
            w.arrive[i] = late ? (i < 6 ? 2 * i : 20) : 0;
        }
        outcome a, b;
        run(&c, &m, off, &w, &a);
        run(&c, &m, on, &w, &b);
        const char *what = late ? "group arriving over 20 steps" : "block-aligned prompt";
        const int want_prefill = late ? P + (P - 32) : P, want_hits = 7 * P - want_prefill;
        CHECK(b.st.prefill_tokens == want_prefill && b.st.prefix_hit_tokens == want_hits && a.st.prefill_tokens == 7 * P,
              "%s: prefill %lld, hits %lld with sharing (want %d, %d), prefill %lld without (want %d)", what,
              (long long)b.st.prefill_tokens, (long long)b.st.prefix_hit_tokens, want_prefill, want_hits,
              (long long)a.st.prefill_tokens, 7 * P);
        same(&w, &a, &b, 0, what);
        int rdiff = 0;
        for (int i = 0; i < 7; i++)
            rdiff += a.n_routes[i] != P + a.n_out[i] - 1 || b.n_routes[i] != a.n_routes[i] ||
                     memcmp(a.routes[i], b.routes[i], (size_t)a.n_routes[i] * 2 * 2) != 0;
        CHECK(rdiff == 0, "%s: %d requests' routes differ from the run without sharing", what, rdiff);
        free_outcome(&a); free_outcome(&b);
    }
    model_free(&m);
}

/* The leader preempted before its followers copy: blocks of 4 tokens, a budget of 3. X (a 3-token prompt) is
 * admitted first, then the leader L and two followers F (6-token prompt: one shared block, a 2-token tail). Step 1
 * forwards X and L (3 blocks: the budget); step 2 has no block for a follower's tail; step 3, X needs a block and
 * the newest running sequence, L, is preempted before any follower copied. Its group is gone: a follower then
 * forwards the tail itself (the other copies from it), and every output is the run without sharing's. */
static void test_group_leader_preempted(void) {
    moe_config c = small_config(1);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 17);
    static int px[3] = {5, 9, 14}, pl[6] = {21, 3, 40, 7, 33, 2};
    workload w = {.n = 4, .temp = 1.0f};
    for (int i = 0; i < 4; i++) {
        w.plen[i] = i ? 6 : 3;
        w.prompt[i] = i ? pl : px;
        w.max_tokens[i] = 6;
    }
    const int64_t bb = 2LL * c.num_hidden_layers * 4 * c.num_key_value_heads * c.head_dim * 4;
    engine_config ref = {.max_num_seqs = 4, .max_model_len = 16, .max_num_batched_tokens = 64, .record_routes = 1};
    engine_config tiny = ref;
    tiny.block_size = 4;
    tiny.kv_cache_bytes = 3 * bb;
    tiny.enable_prefix_caching = 1;
    /* by hand: the preemption happens before a follower is admitted */
    engine *e = engine_create(&c, tiny);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    gen_request r[4], *done[8];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 4; i++) {
        r[i].id = i; r[i].prompt = w.prompt[i]; r[i].prompt_len = w.plen[i];
        r[i].sp.temperature = 1; r[i].sp.top_p = 1; r[i].sp.seed = 100 + i; r[i].sp.max_tokens = 6;
        MOERL_ASSERT(engine_add(e, &r[i]) == MOERL_OK);
    }
    for (int k = 0; k < 3; k++) MOERL_ASSERT(engine_step(e, done, 8) >= 0);
    CHECK(r[1].n_preemptions == 1 && r[1].n_out == 2 && r[2].n_out == 0 && r[3].n_out == 0 && r[2].slot < 0,
          "leader preempted before its followers copied: L preempted %d times with %d tokens, followers %d / %d tokens",
          r[1].n_preemptions, r[1].n_out, r[2].n_out, r[3].n_out);
    int guard = 0;
    while (engine_num_unfinished(e) > 0 && guard++ < 10000) MOERL_ASSERT(engine_step(e, done, 8) >= 0);
    const engine_stats st = engine_get_stats(e);
    int bad = 0;
    for (int i = 0; i < 4; i++) bad += r[i].n_out != 6 || r[i].n_routes != w.plen[i] + 5;
    CHECK(bad == 0, "leader preempted: %d requests with the wrong lengths", bad);
    printf("group with its leader preempted: prefill %lld, hits %lld, %lld preemptions\n", (long long)st.prefill_tokens,
           (long long)st.prefix_hit_tokens, (long long)st.preemptions);
    for (int i = 0; i < 4; i++) gen_request_free_outputs(&r[i]);
    engine_free(e);
    outcome a, b;
    run(&c, &m, ref, &w, &a);
    run(&c, &m, tiny, &w, &b);
    CHECK(b.st.preemptions > 0 && b.st.prefix_hit_tokens == st.prefix_hit_tokens, "leader preempted: %lld preemptions",
          (long long)b.st.preemptions);
    same(&w, &a, &b, 0, "leader preempted before its followers copied");
    int rdiff = 0;
    for (int i = 0; i < 4; i++)
        rdiff += a.n_routes[i] != b.n_routes[i] || memcmp(a.routes[i], b.routes[i], (size_t)a.n_routes[i] * 2 * 2) != 0;
    CHECK(rdiff == 0, "leader preempted: %d requests' routes differ", rdiff);
    free_outcome(&a); free_outcome(&b);
    model_free(&m);
}

/* A weight swap between the leader's forward and a follower's admission: the follower copies nothing (no hit at
 * all: the full-block cache is forgotten too), forwards its whole prompt under the new weights, and samples
 * exactly as the same request run alone under them. */
static void test_group_weight_swap(void) {
    moe_config c = small_config(1);
    moe_model m, m2;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK && model_init(&m2, &c) == MOERL_OK);
    model_init_random(&m, 21);
    model_init_random(&m2, 22);
    static int prompt[37];
    for (int j = 0; j < 37; j++) prompt[j] = (j * 7 + 4) % c.vocab_size;
    engine_config ec = {.max_num_seqs = 4, .max_model_len = 80, .max_num_batched_tokens = 256, .record_routes = 1,
                        .enable_prefix_caching = 1};
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    gen_request r[2], *done[4];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 2; i++) {
        r[i].id = i; r[i].prompt = prompt; r[i].prompt_len = 37;
        r[i].sp.temperature = 1; r[i].sp.top_p = 1; r[i].sp.seed = 100 + i; r[i].sp.max_tokens = 10;
    }
    MOERL_ASSERT(engine_add(e, &r[0]) == MOERL_OK);
    MOERL_ASSERT(engine_step(e, done, 4) == 0 && r[0].n_out == 1); /* the leader forwarded its prompt and sampled */
    MOERL_ASSERT(engine_load_weights(e, m2.params, m2.n_params, 1) == MOERL_OK); /* no pause: it keeps running */
    MOERL_ASSERT(engine_add(e, &r[1]) == MOERL_OK);
    int guard = 0;
    while (engine_num_unfinished(e) > 0 && guard++ < 1000) MOERL_ASSERT(engine_step(e, done, 4) >= 0);
    const engine_stats st = engine_get_stats(e);
    CHECK(st.prefix_hit_tokens == 0 && st.prefill_tokens == 2 * 37,
          "swap between the leader's forward and the follower's admission: %lld hits, %lld prefill (want 0, 74)",
          (long long)st.prefix_hit_tokens, (long long)st.prefill_tokens);
    /* the same request alone under the new weights, without sharing */
    ec.enable_prefix_caching = 0;
    engine *e2 = engine_create(&c, ec);
    MOERL_ASSERT(e2 && engine_load_weights(e2, m2.params, m2.n_params, 1) == MOERL_OK);
    gen_request solo;
    memset(&solo, 0, sizeof solo);
    solo.id = 1; solo.prompt = prompt; solo.prompt_len = 37;
    solo.sp = r[1].sp;
    MOERL_ASSERT(engine_add(e2, &solo) == MOERL_OK);
    guard = 0;
    while (engine_num_unfinished(e2) > 0 && guard++ < 1000) MOERL_ASSERT(engine_step(e2, done, 4) >= 0);
    int vbad = 0;
    for (int t = 0; t < r[1].n_out; t++) vbad += r[1].out_versions[t] != 1;
    CHECK(r[1].n_out == 10 && vbad == 0 && solo.n_out == 10 &&
              !memcmp(r[1].out_tokens, solo.out_tokens, 10 * sizeof(int)) &&
              !memcmp(r[1].out_logprobs, solo.out_logprobs, 10 * sizeof(float)) && r[1].n_routes == 46 &&
              !memcmp(r[1].out_routes, solo.out_routes, 46 * (size_t)engine_route_width(e, NULL, NULL) * 2),
          "follower after the swap: %d tokens (%d not of version 1), not those of the request alone under the new "
          "weights", r[1].n_out, vbad);
    gen_request_free_outputs(&solo);
    engine_free(e2);
    for (int i = 0; i < 2; i++) gen_request_free_outputs(&r[i]);
    engine_free(e);
    model_free(&m);
    model_free(&m2);
}

/* Pause a group mid-generation (the 7 samples besides the first copied its whole prompt: 7 × 40 hits), load new
 * weights (version 1), resume: the old blocks are never reused (the first resumed request re-prefills the whole
 * prompt, the 7 others share its new full blocks; resumed requests have outputs, so they follow no tail), and
 * every output token after the swap carries version 1. */
static void test_weight_swap(void) {
    moe_config c = small_config(1);
    moe_model m, m2;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK && model_init(&m2, &c) == MOERL_OK);
    model_init_random(&m, 3);
    model_init_random(&m2, 4);
    engine_config ec = {.max_num_seqs = 8, .max_model_len = 80, .max_num_batched_tokens = 256, .enable_prefix_caching = 1};
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    int prompt[40];
    for (int j = 0; j < 40; j++) prompt[j] = (j * 5 + 1) % c.vocab_size;
    gen_request r[8], *done[16];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 8; i++) {
        r[i].id = i; r[i].prompt = prompt; r[i].prompt_len = 40;
        r[i].sp.temperature = 1; r[i].sp.top_p = 1; r[i].sp.seed = i; r[i].sp.max_tokens = 30;
        MOERL_ASSERT(engine_add(e, &r[i]) == MOERL_OK);
    }
    for (int k = 0; k < 6; k++) MOERL_ASSERT(engine_step(e, done, 16) == 0);
    const engine_stats s0 = engine_get_stats(e);
    CHECK(s0.prefix_hit_tokens == 7 * 40, "before the swap: %lld prompt tokens hit, expected %d", (long long)s0.prefix_hit_tokens, 7 * 40);
    CHECK(engine_pause(e, NULL, 0) == 8, "pause: 8 running");
    MOERL_ASSERT(engine_load_weights(e, m2.params, m2.n_params, 1) == MOERL_OK);
    MOERL_ASSERT(engine_resume(e, done, 16) == 0);
    int n_done = 0, guard = 0;
    while (engine_num_unfinished(e) > 0 && guard++ < 10000) n_done += engine_step(e, done, 16);
    const engine_stats s1 = engine_get_stats(e);
    /* after the swap, only the 32 shared prompt tokens of the 7 later requests can be hits: the blocks
     * computed under version 0 (prompt and partial outputs) are gone from the cache */
    CHECK(s1.prefix_hit_tokens - s0.prefix_hit_tokens == 7 * 32, "after the swap: %lld prompt tokens hit, expected %d",
          (long long)(s1.prefix_hit_tokens - s0.prefix_hit_tokens), 7 * 32);
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        int seen1 = 0;
        for (int t = 0; t < r[i].n_out; t++) {
            bad += r[i].out_versions[t] < seen1;
            if (r[i].out_versions[t] == 1) seen1 = 1;
        }
        bad += r[i].n_out != 30 || r[i].out_versions[0] != 0 || r[i].out_versions[29] != 1 || r[i].n_interruptions != 1;
        gen_request_free_outputs(&r[i]);
    }
    CHECK(n_done == 8 && bad == 0, "swap: %d done, %d bad version sequences", n_done, bad);
    engine_free(e);
    model_free(&m);
    model_free(&m2);
}

/* Refusals with the numbers. */
static void test_refusals(void) {
    moe_config c = small_config(0);
    const int64_t bb = 2LL * c.num_hidden_layers * 16 * c.num_key_value_heads * c.head_dim * 4;
    engine_config ec = {.max_num_seqs = 4, .max_model_len = 200, .max_num_batched_tokens = 64, .kv_cache_bytes = bb - 1};
    CHECK(!engine_create(&c, ec) && strstr(moerl_last_error(), "holds no block"), "budget under one block: %s",
          moerl_last_error());
    ec.kv_cache_bytes = 4 * bb;
    ec.block_size = -2;
    CHECK(!engine_create(&c, ec) && strstr(moerl_last_error(), "block_size (-2)"), "negative block_size: %s", moerl_last_error());
    ec.block_size = 0;
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e);
    CHECK(engine_get_config(e).block_size == 16 && engine_get_config(e).kv_cache_bytes == 4 * bb,
          "resolved config: block_size %d, kv_cache_bytes %lld", engine_get_config(e).block_size,
          (long long)engine_get_config(e).kv_cache_bytes);
    int prompt[50] = {0};
    gen_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt; r.prompt_len = 50; r.sp.top_p = 1; r.sp.max_tokens = 15; /* 64 positions: 4 blocks, fits */
    CHECK(engine_add(e, &r) == MOERL_OK, "a request of exactly the budget is accepted: %s", moerl_last_error());
    gen_request r2 = {0};
    r2.id = 9; r2.prompt = prompt; r2.prompt_len = 50; r2.sp.top_p = 1; r2.sp.max_tokens = 16; /* 65: 5 blocks */
    CHECK(engine_add(e, &r2) == MOERL_ERR && strstr(moerl_last_error(), "needs 5 KV blocks of 16 tokens") &&
              strstr(moerl_last_error(), "budget is 4 blocks"),
          "refusal: %s", moerl_last_error());
    gen_request *done[4];
    while (engine_num_unfinished(e) > 0) MOERL_ASSERT(engine_step(e, done, 4) >= 0);
    CHECK(r.n_out == 15, "the request of the whole budget ran: %d tokens", r.n_out);
    gen_request_free_outputs(&r);
    engine_free(e);
    ec.kv_cache_bytes = 0;
    ec.gpu_memory_utilization = 1.5;
    CHECK(!engine_create(&c, ec) && strstr(moerl_last_error(), "gpu_memory_utilization (1.5)"), "utilization > 1: %s",
          moerl_last_error());
    ec.gpu_memory_utilization = 0.001;
    e = engine_create(&c, ec);
    CHECK(e && engine_get_stats(e).kv_blocks_total >= 1, "gpu_memory_utilization resolves to blocks");
    engine_free(e);
}

/* moerl plan counts the blocks the engine allocates (kvb_seq_blocks, kvb_prefix_blocks): a group of 4 samples
 * of a 16-token prompt, 9 new tokens each, 8-token blocks. Each holds ⌈(16 + 9 − 1)/8⌉ = 3 blocks at its
 * longest and the group shares ⌊15/8⌋ = 1, so 1 + 4·2 = 9 blocks at once (the old count, ⌈25/8⌉ and ⌊16/8⌋,
 * said 10). A budget of exactly 9 runs with no preemption and a peak of 9; 8 preempts, with the same outputs
 * (batch-invariant kernels: exact). One sequence of 25 tokens: 3 blocks pass plan and run, 2 are refused by
 * both, naming the blocks. */
static void test_plan_boundary(void) {
    moe_config c = small_config(1);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 11);
    const int64_t bb = 2LL * c.num_hidden_layers * 8 * c.num_key_value_heads * c.head_dim * 4;
    plan_kv_input in = {.prompt_len = 16, .max_response = 9, .fixed_response = 9, .block_size = 8, .group_size = 4,
                        .prefix_caching = 1, .max_num_seqs = 4, .max_model_len = 25, .token_bytes = bb / 8.0};
    plan_kv_result pr;
    CHECK(plan_kv_compute(&in, &pr) == MOERL_OK && pr.blocks_per_seq == 3 && pr.shared_blocks == 1 &&
              fabs(pr.paged_bytes / pr.block_bytes - 9) < 1e-12,
          "plan: %g blocks a sequence, %d shared, %g a group (want 3, 1, 9): %s", pr.blocks_per_seq, pr.shared_blocks,
          pr.paged_bytes / pr.block_bytes, moerl_last_error());
    static int prompt[16];
    for (int j = 0; j < 16; j++) prompt[j] = (j * 11 + 5) % c.vocab_size;
    workload w = {.n = 4, .temp = 1.0f};
    for (int i = 0; i < 4; i++) {
        w.plen[i] = 16;
        w.max_tokens[i] = 9;
        w.prompt[i] = prompt;
    }
    engine_config ec = {.max_num_seqs = 4, .max_model_len = 25, .max_num_batched_tokens = 64, .block_size = 8,
                        .enable_prefix_caching = 1, .kv_cache_bytes = 9 * bb};
    outcome exact, less;
    run(&c, &m, ec, &w, &exact);
    ec.kv_cache_bytes = 8 * bb;
    run(&c, &m, ec, &w, &less);
    CHECK(exact.st.preemptions == 0 && exact.st.kv_blocks_peak == 9 && exact.n_out[3] == 9,
          "plan's 9 blocks: %lld preemptions, peak %lld (want 0, 9)", (long long)exact.st.preemptions,
          (long long)exact.st.kv_blocks_peak);
    CHECK(less.st.preemptions > 0 && less.st.kv_blocks_peak == 8, "one block less: %lld preemptions, peak %lld",
          (long long)less.st.preemptions, (long long)less.st.kv_blocks_peak);
    same(&w, &exact, &less, 0, "plan boundary: 8 blocks vs 9");
    /* one sequence at the cap */
    in.group_size = in.max_num_seqs = 1;
    in.budget_bytes = (double)(3 * bb);
    CHECK(plan_kv_compute(&in, &pr) == MOERL_OK && pr.budget_blocks == 3, "plan refuses the engine's 3 blocks: %s",
          moerl_last_error());
    engine_config one = {.max_num_seqs = 1, .max_model_len = 25, .max_num_batched_tokens = 64, .block_size = 8,
                         .kv_cache_bytes = 3 * bb};
    w.n = 1;
    run(&c, &m, one, &w, &exact);
    CHECK(exact.n_out[0] == 9 && exact.st.kv_blocks_peak == 3, "3 blocks: %d tokens, peak %lld", exact.n_out[0],
          (long long)exact.st.kv_blocks_peak);
    in.budget_bytes = (double)(3 * bb - 1);
    CHECK(plan_kv_compute(&in, &pr) == MOERL_ERR && strstr(moerl_last_error(), "holds 2 blocks") &&
              strstr(moerl_last_error(), "25 tokens = 3 blocks"), "plan with 2 blocks: %s", moerl_last_error());
    one.kv_cache_bytes = 3 * bb - 1;
    engine *e = engine_create(&c, one);
    MOERL_ASSERT(e);
    gen_request r = {0};
    r.prompt = prompt; r.prompt_len = 16; r.sp.top_p = 1; r.sp.max_tokens = 9;
    CHECK(engine_add(e, &r) == MOERL_ERR && strstr(moerl_last_error(), "needs 3 KV blocks of 8 tokens") &&
              strstr(moerl_last_error(), "budget is 2 blocks"), "engine with 2 blocks: %s", moerl_last_error());
    engine_free(e);
    free_outcome(&exact); free_outcome(&less);
    model_free(&m);
}

/* rl_read_config of the defaults plus one override: the error (NULL when accepted) and r. */
static const char *read_key(const char *kv, rl_config *r) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    int rc = kv ? cfg_apply_override(c, kv) : MOERL_OK;
    if (rc == MOERL_OK) rc = rl_read_config(c, r);
    cfg_free(c);
    return rc == MOERL_OK ? NULL : moerl_last_error();
}

/* The rollout keys: defaults (vLLM's), values read through, bad ones refused naming key and value. */
static void test_keys(void) {
    rl_config r;
    const char *err = read_key(NULL, &r);
    CHECK(!err && r.block_size == 16 && r.kv_cache_bytes == 0 && r.gpu_memory_utilization == 0 && r.enable_prefix_caching == 1,
          "defaults: %s", err ? err : "");
    err = read_key("rollout.kv_cache_bytes=1048576", &r);
    CHECK(!err && r.kv_cache_bytes == 1048576, "kv_cache_bytes read: %s", err ? err : "");
    err = read_key("rollout.enable_prefix_caching=false", &r);
    CHECK(!err && r.enable_prefix_caching == 0, "enable_prefix_caching=false read");
    const char *bad[][2] = {{"rollout.block_size=0", "rollout.block_size must be in [1, 65536] tokens, got 0"},
                            {"rollout.kv_cache_bytes=-5", "rollout.kv_cache_bytes must be ≥ 0"},
                            {"rollout.gpu_memory_utilization=1.2", "rollout.gpu_memory_utilization must be a fraction in [0, 1]"}};
    for (int i = 0; i < 3; i++) {
        err = read_key(bad[i][0], &r);
        CHECK(err && strstr(err, bad[i][1]), "%s refused: %s", bad[i][0], err ? err : "(accepted)");
    }
}

int main(void) {
    test_keys();
    test_kernels();
    test_refusals();
    test_plan_boundary();
    test_grpo(1);
    test_grpo(0);
    test_weight_swap();
    test_group_edges();
    test_group_leader_preempted();
    test_group_weight_swap();
    test_preemption(1, 0.0f);
    test_preemption(1, 1.0f);
    test_preemption(0, 0.0f);
    TEST_MAIN_END();
}
