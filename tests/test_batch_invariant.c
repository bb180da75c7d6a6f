/* rollout.batch_invariant (moe_exec_opts.batch_invariant): the rollout engine's behaviour logprobs
 * equal the trainer's recomputed ones (compute_logprobs) BIT FOR BIT (memcmp, no tolerance), for a
 * prompt alone and in a batch of 200 others (greedy tokens identical too: vLLM issue 57016's case),
 * for several chunked-prefill budgets (max_num_batched_tokens), several micro-batch sizes, and 1 vs 2
 * OpenMP threads. The same cases without batch_invariant are run too and their largest difference is
 * printed and required to be nonzero, so the equality above is not vacuous. With a bf16 engine
 * (rollout.dtype=bf16) the trainer's recomputation from the bf16-rounded weights equals the engine's
 * bit for bit, and from the unrounded ones it does not. The kernels themselves
 * are checked against double-precision references (tolerances below) and for row invariance. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rollout/engine.h"
#include "train/train.h"
#include "test.h"

static void set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

static void fill(float *x, size_t n, uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_uniform_double(&r) * 2.0 - 1.0);
}

/* ------------------------------------------------------------------ kernels */

/* linear_forward_bi: within 1e-5 relative of a double reference (fp32 sums of 61 products of
 * magnitude ≤ 1: ~61·6e-8 worst case), and a row's bits do not depend on the row count, the
 * row's place, the thread count or accumulate's base. */
static void test_linear_bi(void) {
    enum { N = 37, I = 61, O = 70 };
    float *x = xmalloc(N * I * sizeof(float)), *W = xmalloc(O * I * sizeof(float));
    float *y = xmalloc(N * O * sizeof(float)), *y1 = xmalloc(O * sizeof(float)), *y2 = xmalloc(N * O * sizeof(float));
    float *ref = xmalloc(N * O * sizeof(float));
    fill(x, N * I, 1);
    fill(W, O * I, 2);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = 0;
            for (int i = 0; i < I; i++) s += (double)x[n * I + i] * W[o * I + i];
            ref[n * O + o] = (float)s;
        }
    set_threads(2);
    linear_forward_bi(y, x, W, N, I, O, 0);
    t_close("linear_forward_bi vs double reference", y, ref, N * O, 1e-5f, 1e-5f);
    int same = 1;
    for (int n = 0; n < N; n++) {
        linear_forward_bi(y1, x + n * I, W, 1, I, O, 0);
        same &= !memcmp(y1, y + n * O, O * sizeof(float));
    }
    CHECK(same, "linear_forward_bi: a row alone differs from the same row in a batch of %d", N);
    /* columns [3, O) on their own (other groups of four outputs): the same bits as in the whole product */
    const float *rows[16];
    for (int r = 0; r < 16; r++) rows[r] = x + r * I;
    gemm_bi_nt_rows(y2, O, rows, W, 16, I, 3, O, 0);
    same = 1;
    for (int r = 0; r < 16; r++) same &= !memcmp(y2 + r * O, y + r * O + 3, (O - 3) * sizeof(float));
    CHECK(same, "gemm_bi_nt_rows: columns [3, %d) differ from the same columns of [0, %d)", O, O);
    set_threads(1);
    linear_forward_bi(y2, x, W, N, I, O, 0);
    CHECK(!memcmp(y, y2, N * O * sizeof(float)), "linear_forward_bi: 1 vs 2 threads differ");
    /* the decode-path product (skinny) and OpenBLAS do differ on some element from each other */
    linear_forward(y2, x, W, N, I, O, 0);
    linear_forward(y1, x + 5 * I, W, 1, I, O, 0);
    float d = 0;
    for (int o = 0; o < O; o++) d = fmaxf(d, fabsf(y1[o] - y2[5 * O + o]));
    printf("default linear_forward: row 5 alone vs in %d rows: max |diff| %.3g\n", N, (double)d);
    set_threads(2);
    free(x), free(W), free(y), free(y1), free(y2), free(ref);
}

/* attention_forward_bi and attention_kvcache_forward_bi: each within 2e-6 of a double reference
 * (softmax weights ≤ 1 times values ≤ 1, fp32 rounding), and bit-identical to each other for every
 * token, whether the cache is filled one token at a time or in chunks. */
static void test_attention_bi(void) {
    enum { L = 23, nh = 4, nkv = 2, hd = 12, MAXL = 32 };
    const int G = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = xmalloc(L * nh * hd * sizeof(float)), *k = xmalloc(L * nkv * hd * sizeof(float)),
          *v = xmalloc(L * nkv * hd * sizeof(float));
    fill(q, L * nh * hd, 3);
    fill(k, L * nkv * hd, 4);
    fill(v, L * nkv * hd, 5);
    float *out = xmalloc(L * nh * hd * sizeof(float)), *lse = xmalloc(nh * L * sizeof(float));
    float *ref = xmalloc(L * nh * hd * sizeof(float)), *o2 = xmalloc(L * nh * hd * sizeof(float));
    int cu[2] = {0, L};
    attention_forward_bi(out, lse, q, k, v, cu, 1, L, nh, nkv, hd, scale);
    for (int n = 0; n < L; n++)
        for (int h = 0; h < nh; h++) {
            double s[L], mx = -1e30, sum = 0;
            for (int j = 0; j <= n; j++) {
                s[j] = 0;
                for (int d = 0; d < hd; d++) s[j] += (double)q[(n * nh + h) * hd + d] * k[(j * nkv + h / G) * hd + d];
                s[j] *= scale;
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j <= n; j++) sum += exp(s[j] - mx);
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int j = 0; j <= n; j++) o += exp(s[j] - mx) / sum * v[(j * nkv + h / G) * hd + d];
                ref[(n * nh + h) * hd + d] = (float)o;
            }
        }
    t_close("attention_forward_bi vs double reference", out, ref, L * nh * hd, 2e-6f, 1e-5f);
    /* KV cache, slot 1 of 2: fill it in chunks of 1, 5, 17 tokens and attend each chunk */
    const int chunks[3] = {1, 5, 17};
    float *kc = xcalloc(2 * MAXL * nkv * hd, sizeof(float)), *vc = xcalloc(2 * MAXL * nkv * hd, sizeof(float));
    int slot[L], pos[L];
    for (int c = 0; c < 3; c++) {
        for (int n0 = 0; n0 < L; n0 += chunks[c]) {
            const int T = MOERL_MIN(chunks[c], L - n0);
            for (int i = 0; i < T; i++) {
                slot[i] = 1;
                pos[i] = n0 + i;
                memcpy(kc + ((size_t)MAXL + n0 + i) * nkv * hd, k + (n0 + i) * nkv * hd, nkv * hd * sizeof(float));
                memcpy(vc + ((size_t)MAXL + n0 + i) * nkv * hd, v + (n0 + i) * nkv * hd, nkv * hd * sizeof(float));
            }
            attention_kvcache_forward_bi(o2 + n0 * nh * hd, q + n0 * nh * hd, kc, vc, slot, pos, T, nh, nkv, hd, MAXL,
                                         scale);
        }
        CHECK(!memcmp(o2, out, L * nh * hd * sizeof(float)),
              "attention_kvcache_forward_bi (chunks of %d) differs from attention_forward_bi", chunks[c]);
    }
    free(q), free(k), free(v), free(out), free(lse), free(ref), free(o2), free(kc), free(vc);
}

/* grouped_gemm_forward_team with grouped_fuse.invariant: the fused gather (rows of x through
 * sorted_row) and the SwiGLU epilogue against a double reference (gate_up within 1e-5 relative as
 * linear_forward_bi; act = silu(g)·u within 2e-5: one more rounding through expf), on groups of 0, 1,
 * 5, 17 and 38 rows (every item shape: empty groups, partial row blocks, two row blocks), on 2 threads
 * as the model's teams call it; and each row's bits equal to the same row computed as a group of one. */
static void test_grouped_bi(void) {
    enum { E = 5, I = 37, O = 2 * 23, T = 61 };
    const int counts[E] = {0, 1, 5, 17, 38};
    int offsets[E + 1] = {0}, M = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
    M = offsets[E];
    float *x = xmalloc(T * I * sizeof(float)), *W = xmalloc((size_t)E * O * I * sizeof(float));
    float *gu = xmalloc((size_t)M * O * sizeof(float)), *act = xmalloc((size_t)M * (O / 2) * sizeof(float));
    float *ref_gu = xmalloc((size_t)M * O * sizeof(float)), *ref_act = xmalloc((size_t)M * (O / 2) * sizeof(float));
    int *sorted_row = xmalloc(M * sizeof(int));
    fill(x, T * I, 8);
    fill(W, (size_t)E * O * I, 9);
    for (int i = 0; i < M; i++) sorted_row[i] = (i * 37 + 11) % (2 * T); /* expanded rows j·T + t, K = 2 */
    grouped_fuse f = {.gather_x = x, .sorted_row = sorted_row, .n_tokens = T, .swiglu_act = act, .invariant = 1};
    set_threads(2);
#pragma omp parallel
    grouped_gemm_forward_team(gu, NULL, W, offsets, E, I, O, &f);
    for (int e = 0; e < E; e++)
        for (int i = offsets[e]; i < offsets[e + 1]; i++) {
            const float *xr = x + (size_t)(sorted_row[i] % T) * I;
            double g[O];
            for (int o = 0; o < O; o++) {
                g[o] = 0;
                for (int k = 0; k < I; k++) g[o] += (double)xr[k] * W[((size_t)e * O + o) * I + k];
                ref_gu[(size_t)i * O + o] = (float)g[o];
            }
            for (int c = 0; c < O / 2; c++)
                ref_act[(size_t)i * (O / 2) + c] = (float)(g[c] / (1.0 + exp(-g[c])) * g[O / 2 + c]);
        }
    t_close("grouped_gemm_forward_bi_team gate_up vs double reference", gu, ref_gu, (long)M * O, 1e-5f, 1e-5f);
    t_close("grouped_gemm_forward_bi_team SwiGLU vs double reference", act, ref_act, (long)M * (O / 2), 2e-5f, 2e-5f);
    int same = 1;
    float *one = xmalloc(O * sizeof(float)), *one_act = xmalloc((O / 2) * sizeof(float));
    for (int e = 0; e < E; e++)
        for (int i = offsets[e]; i < offsets[e + 1]; i++) {
            int off1[2] = {0, 1};
            grouped_fuse f1 = {.gather_x = x, .sorted_row = sorted_row + i, .n_tokens = T, .swiglu_act = one_act,
                               .invariant = 1};
            grouped_gemm_forward_team(one, NULL, W + (size_t)e * O * I, off1, 1, I, O, &f1);
            same &= !memcmp(one, gu + (size_t)i * O, O * sizeof(float)) &&
                    !memcmp(one_act, act + (size_t)i * (O / 2), (O / 2) * sizeof(float));
        }
    CHECK(same, "grouped_gemm_forward_bi_team: a row alone differs from the same row in its group");
    free(x), free(W), free(gu), free(act), free(ref_gu), free(ref_act), free(sorted_row), free(one), free(one_act);
}

/* ------------------------------------------------------------------ engine ≡ trainer */

/* Odd sizes everywhere (hidden 36, head_dim 12, vocab 61, expert width 20) so every kernel's tail
 * runs; layer 1 dense. */
static moe_config bi_config(int bi) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 61; c.hidden_size = 36; c.intermediate_size = 44; c.moe_intermediate_size = 20;
    c.num_hidden_layers = 3; c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 12;
    c.num_experts = 8; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1; c.norm_topk_prob = 1;
    c.max_position_embeddings = 128; c.rms_norm_eps = 1e-6f; c.rope_theta = 1e4f;
    c.router_aux_loss_coef = 0.001f; c.initializer_range = 0.15f; c.bos_token_id = -1; c.eos_token_id = -1;
    c.n_mlp_only_layers = 1; c.mlp_only_layers[0] = 1;
    c.exec.batch_invariant = bi;
    return c;
}

#define N_OTHERS 200
#define RESP 12

typedef struct {
    int prompt[40];
    int plen;
    gen_request r;
} req_t;

static void req_init(req_t *q, int64_t id, int plen, uint64_t seed, float temp) {
    memset(q, 0, sizeof *q);
    q->plen = plen;
    for (int i = 0; i < plen; i++) q->prompt[i] = (int)((seed * 31 + i * 17 + 3) % 61);
    q->r.id = id;
    q->r.prompt = q->prompt;
    q->r.prompt_len = plen;
    q->r.sp.temperature = temp;
    q->r.sp.top_p = 1.0f;
    q->r.sp.seed = seed;
    q->r.sp.max_tokens = RESP;
    q->r.sp.ignore_eos = 1;
}

static int g_bf16; /* generate: engine_config.bf16_weights (rollout.dtype=bf16) */

/* Generate the target (prompt of 30 tokens) with `others` other requests in the same engine. */
static void generate(const moe_model *m, int bi, int budget, int others, float temp, req_t *target, req_t *rest) {
    moe_config c = bi_config(bi);
    engine_config ec = {.max_num_seqs = others + 1, .max_model_len = 64, .max_num_batched_tokens = budget,
                        .bf16_weights = g_bf16};
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m->params, m->n_params, 0) == MOERL_OK);
    req_init(target, 0, 30, 7, temp);
    for (int i = 0; i < others / 2; i++) {
        req_init(&rest[i], 1 + i, 1 + i % 37, 100 + i, 0.9f);
        MOERL_ASSERT(engine_add(e, &rest[i].r) == MOERL_OK);
    }
    MOERL_ASSERT(engine_add(e, &target->r) == MOERL_OK);
    for (int i = others / 2; i < others; i++) {
        req_init(&rest[i], 1 + i, 1 + i % 37, 100 + i, 0.9f);
        MOERL_ASSERT(engine_add(e, &rest[i].r) == MOERL_OK);
    }
    gen_request *done[N_OTHERS + 1];
    for (int guard = 0; engine_num_unfinished(e) > 0 && guard < 100000; guard++)
        MOERL_ASSERT(engine_step(e, done, N_OTHERS + 1) >= 0);
    engine_free(e);
}

/* The trainer's logprobs (compute_logprobs, micro-batches of at most mb tokens) of the target's
 * response, packed with the first n_rest other sequences → lp[RESP]. */
static void recompute(const moe_model *m, const req_t *target, const req_t *rest, int n_rest, int mb, float temp,
                      float *lp) {
    const int n = n_rest + 1;
    train_seq *s = xcalloc(n, sizeof *s);
    int **toks = xcalloc(n, sizeof *toks);
    float **out = xcalloc(n, sizeof *out);
    for (int i = 0; i < n; i++) {
        /* the target in the middle of its micro-batch: after half of the others */
        const req_t *q = i == n_rest / 2 ? target : &rest[i < n_rest / 2 ? i : i - 1];
        const int len = q->plen + q->r.n_out;
        toks[i] = xmalloc(len * sizeof(int));
        memcpy(toks[i], q->prompt, q->plen * sizeof(int));
        memcpy(toks[i] + q->plen, q->r.out_tokens, q->r.n_out * sizeof(int));
        s[i] = (train_seq){.tokens = toks[i], .len = len, .resp_start = q->plen};
        out[i] = xmalloc(q->r.n_out * sizeof(float));
    }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, mb) == MOERL_OK);
    MOERL_ASSERT(compute_logprobs(m, &a, s, n, mb, temp > 0 ? temp : 1.0f, out) == MOERL_OK);
    memcpy(lp, out[n_rest / 2], RESP * sizeof(float));
    model_acts_free(&a);
    for (int i = 0; i < n; i++) free(toks[i]), free(out[i]);
    free(toks), free(out), free(s);
}

static float max_diff(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

/* One configuration (bi on or off): every case compared against the target generated alone at a
 * budget of 64 tokens on 2 threads. Returns the largest difference seen (0 expected with bi). */
static float run_cases(int bi, float temp) {
    moe_config c = bi_config(bi);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 21);
    req_t *rest = xcalloc(N_OTHERS, sizeof *rest);
    req_t solo;
    float lp[RESP], worst = 0;
    set_threads(2);
    generate(&m, bi, 64, 0, temp, &solo, rest);
    CHECK(solo.r.n_out == RESP, "solo: %d tokens", solo.r.n_out);
    /* the trainer, micro-batches of 42 (the target alone), 97 and 1000 tokens, on 2 and 1 threads */
    req_t tmp;
    generate(&m, bi, 256, 24, temp, &tmp, rest); /* others to pack around the target */
    gen_request_free_outputs(&tmp.r);
    const int mbs[3] = {42, 97, 1000};
    for (int t = 2; t >= 1; t--) {
        set_threads(t);
        for (int i = 0; i < 3; i++) {
            recompute(&m, &solo, rest, i == 0 ? 0 : 24, mbs[i], temp, lp);
            const float d = max_diff(lp, solo.r.out_logprobs, RESP);
            worst = fmaxf(worst, d);
            if (bi)
                CHECK(!memcmp(lp, solo.r.out_logprobs, sizeof lp),
                      "T=%g: trainer (micro-batch %d, %d threads) vs engine logprobs: max |diff| %.3g", (double)temp,
                      mbs[i], t, (double)d);
        }
    }
    for (int i = 0; i < 24; i++) gen_request_free_outputs(&rest[i].r);
    /* the engine: alone under budgets 3 and 7 (chunked prefill of the 30-token prompt), 1 thread;
     * in a batch of 200 others (budget 256 and 512), 2 threads */
    const int budgets[4] = {3, 7, 256, 512}, others[4] = {0, 0, N_OTHERS, N_OTHERS};
    for (int i = 0; i < 4; i++) {
        set_threads(i < 2 ? 1 : 2);
        req_t again;
        generate(&m, bi, budgets[i], others[i], temp, &again, rest);
        const int same_tok = again.r.n_out == RESP && !memcmp(again.r.out_tokens, solo.r.out_tokens, RESP * sizeof(int));
        const float d = same_tok ? max_diff(again.r.out_logprobs, solo.r.out_logprobs, RESP) : INFINITY;
        worst = fmaxf(worst, d);
        if (bi) {
            CHECK(same_tok, "T=%g: budget %d with %d others: tokens differ from the solo run", (double)temp,
                  budgets[i], others[i]);
            CHECK(same_tok && !memcmp(again.r.out_logprobs, solo.r.out_logprobs, sizeof lp),
                  "T=%g: budget %d with %d others: logprobs differ (max |diff| %.3g)", (double)temp, budgets[i],
                  others[i], (double)d);
        }
        gen_request_free_outputs(&again.r);
        for (int j = 0; j < others[i]; j++) gen_request_free_outputs(&rest[j].r);
    }
    set_threads(2);
    gen_request_free_outputs(&solo.r);
    free(rest);
    model_free(&m);
    return worst;
}

static void test_engine_equals_trainer(float temp) {
    const float on = run_cases(1, temp), off = run_cases(0, temp);
    printf("T=%g: engine vs trainer / solo vs batched, max |logprob diff|: batch_invariant %.3g, default %.3g\n",
           (double)temp, (double)on, (double)off);
    CHECK(on == 0.0f, "batch_invariant: max |diff| %.3g, expected exactly 0", (double)on);
    CHECK(off > 0.0f, "default kernels show no difference: the equality above would be vacuous");
}

/* rollout.dtype=bf16 with batch_invariant: the engine rounds its weights to bf16 (nearest even) and the
 * batch-invariant kernels read those values; the trainer's recomputation from the bf16-rounded values
 * of the fp32 weights (what rl/trainer.c's params_round gives the forward) equals the engine's
 * logprobs bit for bit, batched among 24 others or alone, and the engine's batch (200 others) changes
 * nothing; the recomputation from the unrounded fp32 weights differs (the rounding is what matters). */
static void test_engine_bf16(float temp) {
    moe_config c = bi_config(1);
    moe_model m, r;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK && model_init(&r, &c) == MOERL_OK);
    model_init_random(&m, 21);
    for (size_t i = 0; i < m.n_params; i++) r.params[i] = bf16_to_f32(f32_to_bf16(m.params[i]));
    req_t *rest = xcalloc(N_OTHERS, sizeof *rest);
    req_t solo, again;
    float lp[RESP];
    set_threads(2);
    g_bf16 = 1;
    generate(&m, 1, 64, 0, temp, &solo, rest);
    generate(&m, 1, 256, N_OTHERS, temp, &again, rest);
    CHECK(solo.r.n_out == RESP && again.r.n_out == RESP && !memcmp(again.r.out_tokens, solo.r.out_tokens, sizeof(int) * RESP) &&
              !memcmp(again.r.out_logprobs, solo.r.out_logprobs, sizeof lp),
          "T=%g bf16: the engine's output alone differs from among %d others", (double)temp, N_OTHERS);
    for (int j = 24; j < N_OTHERS; j++) gen_request_free_outputs(&rest[j].r);
    g_bf16 = 0;
    for (int n_rest = 0; n_rest <= 24; n_rest += 24) {
        recompute(&r, &solo, rest, n_rest, 1000, temp, lp);
        CHECK(!memcmp(lp, solo.r.out_logprobs, sizeof lp),
              "T=%g bf16: trainer on rounded weights (%d others) vs engine: max |diff| %.3g", (double)temp, n_rest,
              (double)max_diff(lp, solo.r.out_logprobs, RESP));
    }
    recompute(&m, &solo, rest, 24, 1000, temp, lp);
    const float d = max_diff(lp, solo.r.out_logprobs, RESP);
    printf("T=%g bf16 engine: trainer on fp32 (unrounded) weights differs by %.3g (on the rounded ones: 0)\n",
           (double)temp, (double)d);
    CHECK(d > 0.0f, "T=%g bf16: the unrounded weights give the same logprobs: the check above would be vacuous",
          (double)temp);
    for (int j = 0; j < 24; j++) gen_request_free_outputs(&rest[j].r);
    gen_request_free_outputs(&solo.r);
    gen_request_free_outputs(&again.r);
    free(rest);
    model_free(&m);
    model_free(&r);
}

/* Training under batch_invariant: the forward's logits within 1e-5 of the default kernels' (fp32 sums
 * in another order through 3 layers, logits of magnitude ≲ 3) and model_backward's gradients from the
 * activations the invariant forward saved within 1e-4 absolute + 1e-3 relative of the default's (the
 * same backward kernels on inputs that differ by that rounding; a wrong saved activation — gate_up,
 * act, lse — moves gradients by their own size). */
static void test_training_gradients(void) {
    moe_model m[2];
    model_acts a[2];
    enum { B = 3, N = 45 };
    int tok[N], tgt[N], cu[B + 1] = {0, 10, 27, 45};
    float dlogp[N];
    for (int n = 0; n < N; n++) tok[n] = (n * 29 + 3) % 61, tgt[n] = (n * 13 + 5) % 61, dlogp[n] = -1.0f / N;
    for (int k = 0; k < 2; k++) {
        const moe_config c = bi_config(k);
        MOERL_ASSERT(model_init(&m[k], &c) == MOERL_OK);
        model_init_random(&m[k], 5);
        MOERL_ASSERT(model_acts_init(&a[k], &m[k], N) == MOERL_OK);
        MOERL_ASSERT(model_forward(&m[k], &a[k], tok, cu, NULL, B, N) == MOERL_OK);
        model_logprobs(&m[k], &a[k], tgt, 1.0f, 1);
        model_backward(&m[k], &a[k], dlogp, NULL, 0.01f);
    }
    t_close("batch_invariant forward: logits vs default kernels", a[1].logits, a[0].logits, (long)N * 61, 1e-5f, 1e-5f);
    t_close("batch_invariant training: gradients vs default kernels", m[1].grads, m[0].grads, (long)m[0].n_params,
            1e-4f, 1e-3f);
    for (int k = 0; k < 2; k++) model_acts_free(&a[k]), model_free(&m[k]);
}

int main(void) {
    test_linear_bi();
    test_attention_bi();
    test_grouped_bi();
    test_training_gradients();
    test_engine_equals_trainer(0.0f); /* greedy: vLLM issue 57016's case */
    test_engine_equals_trainer(0.8f);
    test_engine_bf16(0.0f);
    test_engine_bf16(0.8f);
    TEST_MAIN_END();
}
