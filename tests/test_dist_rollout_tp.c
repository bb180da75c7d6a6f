/* Rollout tensor parallelism (rollout.tensor_model_parallel_size; src/rollout/engine.h engine_set_tp,
 * src/parallel/tp_rollout.h, tp_slice_range in src/parallel/tp.h) against one engine holding the whole model.
 * One process (tests/run.sh): the streaming slice — a whole vector handed to tp_slice_range in ranges of
 * uneven sizes, fp32 and bf16, equals tp_slice_vec's slice (tp_state_attach) for TP 2 and 4, kv heads split
 * and replicated, a padded vocabulary — and the refusals of engine_set_tp.
 * Under mpirun (tests/e2e_mpi.sh, every world rank one member of a TP group of the world size): the engine
 * built from this rank's slice, its weights streamed in through tp_slice_range, generates the same prompts as
 * the whole engine: greedy tokens equal, logprobs and the logits each token was drawn from within a written
 * tolerance; sampled requests (temperature 1, top-p 0.9) draw the same tokens on every rank of the group; the
 * same in bf16 (rollout.dtype bf16); the KV cache per rank is the whole engine's / P.
 * Model: tests/par_fixture.h (E = 8 top-2, two MoE layers and a dense one, nh 4 over nkv kv heads).
 * Usage: test_dist_rollout_tp [--nkv K] [--vocab V]. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"
#include "parallel/grid.h"
#include "parallel/tp.h"
#include "parallel/tp_rollout.h"
#include "rollout/engine.h"
#pragma GCC diagnostic ignored "-Wunused-function" /* par_fixture.h's training helpers: only fx_config here */
#include "par_fixture.h"
#include "dist_test.h"
#include "test.h"

#define N_REQ 6
#define MAX_NEW 10

/* bf16 bits of x (nearest, ties to even), as the weight broadcast sends them */
static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The whole model m sliced for TP rank q of P by tp_state_attach (the trainer's path) = the reference. */
static void attach_slice(const moe_model *m, int P, int q, moe_model *out) {
    par_grid g = {0};
    g.tp = P;
    g.tp_rank = q;
    g.cfg.expert_tensor_parallel_size = -1;
    MOERL_ASSERT(model_init_inference(out, &m->cfg) == MOERL_OK);
    memcpy(out->params, m->params, m->n_params * sizeof(float));
    tp_state *ts = tp_state_attach(&g, out);
    MOERL_ASSERT(ts);
    tp_state_free(ts); /* the slice stays in out */
}

/* tp_slice_range over ranges of uneven sizes equals tp_slice_vec's slice, fp32 and bf16. */
static void check_slice_range(int P, int nkv, int vocab) {
    moe_config c = fx_config(8, 2, nkv);
    c.vocab_size = vocab;
    moe_model m;
    MOERL_ASSERT(model_init_inference(&m, &c) == MOERL_OK);
    model_init_random(&m, 77);
    uint16_t *w16 = xmalloc(m.n_params * sizeof(uint16_t));
    for (size_t i = 0; i < m.n_params; i++) w16[i] = to_bf16(m.params[i]);
    for (int q = 0; q < P; q++) {
        moe_model ref;
        attach_slice(&m, P, q, &ref);
        float *got = xcalloc(ref.n_params, sizeof(float));
        uint16_t *got16 = xcalloc(ref.n_params, sizeof(uint16_t));
        int ok = 1;
        for (size_t off = 0, k = 0; off < m.n_params; k++) {
            const size_t cnt = MOERL_MIN((size_t)(1 + (k * 7919) % 997), m.n_params - off); /* 1 .. 997 values */
            ok &= tp_slice_range(&m, &ref, off, m.params + off, cnt, 4, got) == MOERL_OK;
            ok &= tp_slice_range(&m, &ref, off, w16 + off, cnt, 2, got16) == MOERL_OK;
            off += cnt;
        }
        size_t bad = 0, bad16 = 0;
        for (size_t i = 0; i < ref.n_params; i++) {
            bad += got[i] != ref.params[i];
            bad16 += got16[i] != to_bf16(ref.params[i]);
        }
        CHECK(ok && bad == 0 && bad16 == 0,
              "tp_slice_range = tp_slice_vec (TP %d rank %d, nkv %d, vocab %d): %zu fp32 and %zu bf16 values differ "
              "of %zu (%s)", P, q, nkv, vocab, bad, bad16, ref.n_params, ok ? "ok" : moerl_last_error());
        free(got);
        free(got16);
        model_free(&ref);
    }
    moe_model ref;
    attach_slice(&m, P, 0, &ref);
    CHECK(tp_slice_range(&m, &ref, m.n_params - 2, m.params, 3, 4, ref.params) == MOERL_ERR &&
              strstr(moerl_last_error(), "past the model"),
          "a range past the model: %s", moerl_last_error());
    CHECK(tp_slice_range(&ref, &ref, 0, m.params, 1, 4, ref.params) == MOERL_ERR &&
              strstr(moerl_last_error(), "not the whole model"),
          "a slice as the source: %s", moerl_last_error());
    model_free(&ref);
    free(w16);
    model_free(&m);
}

static engine_config tp_ec(int bf16) {
    engine_config ec = {.max_num_seqs = 4, .max_model_len = 32, .max_num_batched_tokens = 24, .bf16_weights = bf16};
    return ec;
}

/* engine_set_tp's refusals (no communication). */
static void check_refusals(void) {
    moe_config c = fx_config(8, 2, 2);
    engine *whole = engine_create(&c, tp_ec(0));
    struct {
        model_par_head head;
    } none = {{NULL}};
    CHECK(engine_set_tp(whole, &none) == MOERL_ERR && strstr(moerl_last_error(), "tp_allreduce_f32"),
          "a runtime without the hook: %s", moerl_last_error());
    CHECK(engine_set_tp(whole, NULL) == MOERL_OK, "TP off on a whole engine");
    engine_free(whole);
    moe_config lc = c;
    MOERL_ASSERT(tp_config_apply(&lc, 2, 0, 1) == MOERL_OK);
    engine *sl = engine_create(&lc, tp_ec(0));
    CHECK(sl && engine_set_tp(sl, NULL) == MOERL_ERR && strstr(moerl_last_error(), "tensor-parallel slice"),
          "a slice without its group: %s", moerl_last_error());
    engine_free(sl);
    lc = c;
    MOERL_ASSERT(tp_config_apply(&lc, 2, 0, 0) == MOERL_OK);
    sl = engine_create(&lc, tp_ec(0));
    static const model_hooks hk = {.tp_allreduce_f32 = (void (*)(void *, float *, size_t))1};
    struct {
        model_par_head head;
    } fake = {{&hk}};
    CHECK(sl && engine_set_tp(sl, &fake) == MOERL_ERR && strstr(moerl_last_error(), "experts whole"),
          "experts kept whole: %s", moerl_last_error());
    engine_free(sl);
}

typedef struct {
    int tok[N_REQ][MAX_NEW], n[N_REQ];
    float lp[N_REQ][MAX_NEW];
    float *logits; /* [N_REQ][MAX_NEW][V] */
} gen_out;

/* Generate N_REQ prompts (the first four greedy, the last two sampled) to completion on e. */
static void generate(engine *e, int V, gen_out *o) {
    static int prompts[N_REQ][6] = {{1, 5, 9}, {2, 7}, {3, 11, 13, 17, 19}, {4}, {8, 6, 40}, {12, 30, 50, 60}};
    static const int plen[N_REQ] = {3, 2, 5, 1, 3, 4};
    gen_request r[N_REQ];
    memset(r, 0, sizeof r);
    o->logits = xcalloc((size_t)N_REQ * MAX_NEW * V, sizeof(float));
    for (int i = 0; i < N_REQ; i++) {
        r[i].id = i;
        r[i].prompt = prompts[i];
        r[i].prompt_len = plen[i];
        r[i].sp = (sampling_params){.temperature = i < 4 ? 0.0f : 1.0f, .top_p = i < 4 ? 1.0f : 0.9f,
                                    .seed = 1000 + i, .max_tokens = MAX_NEW, .ignore_eos = 1};
        r[i].out_logits = o->logits + (size_t)i * MAX_NEW * V;
        MOERL_ASSERT(engine_add(e, &r[i]) == MOERL_OK);
    }
    gen_request *done[32];
    for (int guard = 0; engine_num_unfinished(e) > 0 && guard < 1000; guard++) MOERL_ASSERT(engine_step(e, done, 32) >= 0);
    for (int i = 0; i < N_REQ; i++) {
        o->n[i] = r[i].n_out;
        memcpy(o->tok[i], r[i].out_tokens, r[i].n_out * sizeof(int));
        memcpy(o->lp[i], r[i].out_logprobs, r[i].n_out * sizeof(float));
        r[i].out_logits = NULL; /* ours */
        gen_request_free_outputs(&r[i]);
    }
}

/* This rank's TP engine of m's config: the slice's weights streamed in through tp_slice_range in buckets. */
static engine *tp_engine(dist_comm *comm, const moe_model *m, int bf16, tp_rollout **rt) {
    const int P = dist_comm_size(comm), q = dist_comm_rank(comm);
    moe_config lc = m->cfg;
    MOERL_ASSERT(tp_config_apply(&lc, P, q, 1) == MOERL_OK);
    engine *e = engine_create(&lc, tp_ec(bf16));
    MOERL_ASSERT(e);
    const moe_model *loc = engine_model(e);
    const size_t esz = bf16 ? 2 : 4, bucket = 333;
    void *buf = bf16 ? (void *)engine_weight_buffer_bf16(e) : (void *)engine_weight_buffer(e);
    memset(buf, 0, loc->n_params * esz); /* the vocabulary's padding rows */
    uint16_t *w16 = bf16 ? xmalloc(m->n_params * 2) : NULL;
    for (size_t i = 0; bf16 && i < m->n_params; i++) w16[i] = to_bf16(m->params[i]);
    for (size_t off = 0; off < m->n_params; off += bucket) {
        const size_t cnt = MOERL_MIN(bucket, m->n_params - off);
        MOERL_ASSERT(tp_slice_range(m, loc, off, bf16 ? (const void *)(w16 + off) : (const void *)(m->params + off),
                                    cnt, esz, buf) == MOERL_OK);
    }
    free(w16);
    if (bf16) MOERL_ASSERT(engine_set_version_bf16(e, 0) == MOERL_OK);
    else engine_set_version(e, 0);
    *rt = tp_rollout_new(comm);
    MOERL_ASSERT(*rt && engine_set_tp(e, *rt) == MOERL_OK);
    return e;
}

/* TP engine against the whole engine (every rank computes the reference too). */
static void check_generation(dist_ctx *ctx, int nkv, int vocab, int bf16) {
    moe_config c = fx_config(8, 2, nkv);
    c.vocab_size = vocab;
    moe_model m;
    MOERL_ASSERT(model_init_inference(&m, &c) == MOERL_OK);
    model_init_random(&m, 4242);
    engine *ref = engine_create(&c, tp_ec(bf16));
    MOERL_ASSERT(ref && engine_load_weights(ref, m.params, m.n_params, 0) == MOERL_OK);
    gen_out a, b;
    generate(ref, vocab, &a);
    dist_comm *comm = dist_comm_split(ctx, 0, ctx->world_rank);
    MOERL_ASSERT(comm);
    const int P = dist_comm_size(comm);
    tp_rollout *rt;
    engine *e = tp_engine(comm, &m, bf16, &rt);
    generate(e, vocab, &b);
    /* Tolerances: the TP sums add the P ranks' fp32 partial products (heads, widths, experts' widths) in
     * another order than one dot product, ~1e-6 relative per layer on these O(1) activations; 1e-4 absolute
     * on logits/logprobs leaves two orders of margin, while a missing or doubled all-reduce moves them by O(0.1). */
    const double tol = 1e-4;
    int greedy_same = 1, sampled_same = 1, n_same = 1;
    double max_lp = 0, max_lg = 0;
    for (int i = 0; i < N_REQ; i++) {
        n_same &= a.n[i] == b.n[i];
        for (int t = 0; t < MOERL_MIN(a.n[i], b.n[i]); t++) {
            if (i < 4) greedy_same &= a.tok[i][t] == b.tok[i][t];
            if (a.tok[i][t] != b.tok[i][t]) break; /* later rows follow other prefixes */
            max_lp = fmax(max_lp, fabs(a.lp[i][t] - b.lp[i][t]));
            for (int v = 0; v < vocab; v++) {
                const size_t k = ((size_t)i * MAX_NEW + t) * vocab + v;
                max_lg = fmax(max_lg, fabs(a.logits[k] - b.logits[k]));
            }
        }
    }
    /* every rank of the group drew the same tokens (sampled requests included) */
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < N_REQ; i++)
        for (int t = 0; t < b.n[i]; t++) h = (h ^ (uint64_t)b.tok[i][t]) * 1099511628211ULL;
    sampled_same = dist_same_on_all_ranks(ctx, h);
    const char *dt = bf16 ? "bf16" : "fp32";
    CHECK(n_same && greedy_same, "TP %d (%s, nkv %d, vocab %d): greedy tokens equal the whole engine's", P, dt, nkv,
          vocab);
    CHECK(max_lp <= tol && max_lg <= tol, "TP %d (%s, nkv %d, vocab %d): logprobs within %g (max %.3g), logits (max "
          "%.3g)", P, dt, nkv, vocab, tol, max_lp, max_lg);
    CHECK(sampled_same, "TP %d (%s): every rank of the group drew the same tokens", P, dt);
    const engine_config er = engine_get_config(ref), et = engine_get_config(e);
    const int kv_split = nkv >= P; /* replicated kv heads (nkv < P): one head per rank, not nkv/P */
    CHECK(!kv_split || et.kv_cache_bytes * P == er.kv_cache_bytes,
          "TP %d: KV per rank %lld bytes = the whole engine's %lld / %d", P, (long long)et.kv_cache_bytes,
          (long long)er.kv_cache_bytes, P);
    CHECK(engine_model(e)->n_params < m.n_params / P + m.n_params / 4, "TP %d: weights per rank %zu of %zu", P,
          engine_model(e)->n_params, m.n_params);
    if (ctx->world_rank == 0)
        printf("rollout TP %d %s nkv %d vocab %d: max |Δlogprob| %.3g, max |Δlogit| %.3g, KV/rank %lld of %lld B, "
               "weights/rank %zu of %zu floats, %.0f all-reduced bytes\n",
               P, dt, nkv, vocab, max_lp, max_lg, (long long)et.kv_cache_bytes, (long long)er.kv_cache_bytes,
               engine_model(e)->n_params, m.n_params, tp_rollout_bytes(rt));
    engine_free(e);
    engine_free(ref);
    tp_rollout_free(rt);
    dist_comm_free(comm);
    free(a.logits);
    free(b.logits);
    model_free(&m);
}

int main(int argc, char **argv) {
    dist_ctx *ctx = dist_init(&argc, &argv);
    if (!ctx || dist_split_roles(ctx, ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_rollout_tp: %s\n", moerl_last_error());
        return 1;
    }
    int nkv = 2, vocab = 64;
    static const struct option lo[] = {{"nkv", 1, 0, 'k'}, {"vocab", 1, 0, 'v'}, {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (o == 'k') nkv = atoi(optarg);
        else if (o == 'v') vocab = atoi(optarg);
        else {
            fprintf(stderr, "usage: test_dist_rollout_tp [--nkv K] [--vocab V]\n");
            return 1;
        }
    }
    if (ctx->world_size == 1) { /* one process (tests/run.sh): the slicer and the refusals */
        check_slice_range(2, 2, 64);
        check_slice_range(2, 2, 67);
        check_slice_range(4, 2, 67);
        check_slice_range(2, 1, 64);
        check_refusals();
        printf("test_dist_rollout_tp: one process: the slice and the refusals; generation runs under mpirun "
               "(tests/e2e_mpi.sh)\n");
        dist_finalize(ctx);
        TEST_MAIN_END();
    }
    check_generation(ctx, nkv, vocab, 0);
    check_generation(ctx, nkv, vocab, 1);
    return dist_test_finish(ctx);
}
