/* The rollout engine's bf16 weights (engine_config.bf16_weights, rollout.dtype bf16) and the bf16
 * panel kernel (gemm_packed16_*): the kernel equals the fp32 panel kernel on bf16-rounded
 * weights; the bf16 engine equals the fp32 engine run on bf16-rounded weights; its logprobs stay
 * within a stated distance of the fp32 engine's on the original weights; the caller's weights are
 * untouched and an in-place reload (engine_weight_buffer + engine_set_version) is rounded too; bf16
 * weights loaded directly (engine_weight_buffer_bf16 / engine_load_weights_bf16, what a rollout rank
 * receiving a bf16 weight broadcast does) give bit-identical weights and logits.
 * Model: the PyTorch-checked test model B (tests/ref/gen_model.py: H 64, 2 layers, 16 experts
 * top-4, head_dim 16, V 131). */
#include "base/common.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rollout/engine.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static void round_bf16(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}

/* gemm_packed16 on W = gemm_packed on bf16(W), for row counts 1..19 and ragged output ranges. */
static void test_kernel(void) {
    enum { O = 300, I = 37, MR = 19 }; /* 19 panels: groups of 8, 8 and 3 panels (passes of 8, 4, 2 and 1 panels
                                        * at one row); 19 rows: blocks of 8, 8 and 3 (AVX-512) or of 4 */
    rng_state r;
    rng_seed(&r, 5);
    float *W = xmalloc((size_t)O * I * sizeof(float)), *Wr = xmalloc((size_t)O * I * sizeof(float));
    float *x = xmalloc(MR * I * sizeof(float));
    for (int i = 0; i < O * I; i++) W[i] = (float)rng_normal(&r) * 0.3f;
    for (int i = 0; i < MR * I; i++) x[i] = (float)rng_normal(&r);
    memcpy(Wr, W, (size_t)O * I * sizeof(float));
    round_bf16(Wr, (size_t)O * I);
    const size_t np = gemm_packed_size(O, I);
    uint16_t *P16 = xmalloc(np * sizeof(uint16_t));
    float *P = xmalloc(np * sizeof(float));
    gemm_packed16_pack(P16, W, O, I);
    gemm_packed_pack(P, Wr, O, I);
    int same_pack = 1;
    for (int o = 0; o < O; o++)
        for (int i = 0; i < I; i++) same_pack &= bf16_to_f32(gemm_packed16_get(P16, I, o, i)) == Wr[(size_t)o * I + i];
    CHECK(same_pack, "bf16 panels hold bf16(W)");
    /* padding lanes past O are zero: the kernel reads them (whole panels) */
    int zero_pad = 1;
    for (int o = O; o < (int)(np / I); o++)
        for (int i = 0; i < I; i++) zero_pad &= gemm_packed16_get(P16, I, o, i) == 0;
    CHECK(zero_pad, "bf16 panel padding is zero");
    /* panels from bf16 weights (a bf16 weight broadcast) == panels from the fp32 weights */
    uint16_t *W16 = xmalloc((size_t)O * I * sizeof(uint16_t)), *Q16 = xmalloc(np * sizeof(uint16_t));
    for (int i = 0; i < O * I; i++) W16[i] = f32_to_bf16(W[i]);
    gemm_packed16_pack_bf16(Q16, W16, O, I);
    CHECK(!memcmp(Q16, P16, np * sizeof(uint16_t)), "gemm_packed16_pack_bf16(bf16(W)) == gemm_packed16_pack(W)");
    free(W16); free(Q16);
    const float *rows[MR];
    for (int i = 0; i < MR; i++) rows[i] = x + (size_t)i * I;
    for (int m = 1; m <= MR; m++) {
        static float a[MR * O], b[MR * O];
        for (int k = -16; k < O; k += 16) {
            /* the whole range (k = −16 stands for [0, O)), blocks of 32 and 16 and the ragged end */
            const int o0 = MOERL_MAX(k, 0), o1 = k < 0 ? O : MOERL_MIN(O, o0 + 16 + (o0 == 0 ? 16 : 0));
            memset(a, 0, sizeof a);
            memset(b, 0, sizeof b);
            gemm_packed16_nt_rows(a, O, rows, P16, m, I, o0, o1);
            gemm_packed_nt_rows(b, O, rows, P, m, I, o0, o1);
            /* the same operations in the same order on the same (exactly widened) values: equal
             * up to the last bit; 1e-6 relative leaves room for a compiler contracting one of the
             * two loops into FMAs and not the other */
            char what[64];
            snprintf(what, sizeof what, "packed16 == packed(bf16 W), m %d, o0 %d", m, o0);
            t_close(what, a, b, (long)m * O, 1e-6f, 1e-6f);
            /* batch invariance: each row alone gives the same bits as inside the batch of m */
            int inv = 1;
            for (int r = 0; r < m; r++) {
                float one[O];
                gemm_packed16_nt_rows(one, O, rows + r, P16, 1, I, o0, o1);
                inv &= !memcmp(one, a + (size_t)r * O, (size_t)(o1 - o0) * sizeof(float));
            }
            CHECK(inv, "packed16 rows of a batch of %d == each row alone (o0 %d, o1 %d)", m, o0, o1);
        }
    }
    /* gemm_packed16_nt (row-major a) = the row-pointer form */
    static float a[MR * O], b[MR * O];
    gemm_packed16_nt(a, O, x, P16, MR, I, 0, O);
    gemm_packed16_nt_rows(b, O, rows, P16, MR, I, 0, O);
    CHECK(!memcmp(a, b, sizeof a), "gemm_packed16_nt == gemm_packed16_nt_rows");
    /* and against the plain definition Σ_i x[r, i]·bf16(W)[o, i] in double precision: 1e-5
     * relative is float accumulation error over 37 terms of unit-scale products (≈ 37·6e-8 · |terms|) */
    for (int r = 0; r < MR; r++)
        for (int o = 0; o < O; o++) {
            double acc = 0;
            for (int i = 0; i < I; i++) acc += (double)x[(size_t)r * I + i] * Wr[(size_t)o * I + i];
            b[(size_t)r * O + o] = (float)acc;
        }
    t_close("packed16 == the naive product on bf16(W), 19 rows", a, b, (long)MR * O, 1e-5f, 1e-5f);
    free(W); free(Wr); free(x); free(P16); free(P);
}

/* Greedy decode of n_prompts prompts on engine e; logits [n][steps][V], tokens [n][steps]. */
static void decode(engine *e, int V, int steps, float *logits, int *tokens) {
    static int prompts[3][6] = {{3, 17, 42, 99, 5, 64}, {7, 1, 130, 2, 2, 9}, {100, 55, 31, 0, 12, 8}};
    gen_request r[3];
    gen_request *done[3];
    for (int i = 0; i < 3; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].id = i;
        r[i].prompt = prompts[i];
        r[i].prompt_len = 6;
        r[i].sp.temperature = 0;
        r[i].sp.top_p = 1;
        r[i].sp.max_tokens = steps;
        r[i].sp.ignore_eos = 1;
        r[i].out_logits = logits + (size_t)i * steps * V;
        if (engine_add(e, &r[i]) != MOERL_OK) { CHECK(0, "engine_add: %s", moerl_last_error()); return; }
    }
    while (engine_num_unfinished(e) > 0)
        if (engine_step(e, done, 3) < 0) { CHECK(0, "engine_step: %s", moerl_last_error()); return; }
    for (int i = 0; i < 3; i++) {
        memcpy(tokens + (size_t)i * steps, r[i].out_tokens, (size_t)steps * sizeof(int));
        gen_request_free_outputs(&r[i]);
    }
}

static engine *make_engine(const moe_model *m, const float *params, int bf16) {
    engine_config ec = {.max_num_seqs = 3, .max_model_len = 64, .max_num_batched_tokens = 32, .bf16_weights = bf16};
    engine *e = engine_create(&m->cfg, ec);
    if (!e || engine_load_weights(e, params, m->n_params, 0) != MOERL_OK) return NULL;
    return e;
}

/* log_softmax of logits[V] into out[V]. */
static void log_softmax(float *out, const float *x, int V) {
    double mx = x[0], s = 0;
    for (int v = 1; v < V; v++) mx = fmax(mx, x[v]);
    for (int v = 0; v < V; v++) s += exp(x[v] - mx);
    const double lse = mx + log(s);
    for (int v = 0; v < V; v++) out[v] = (float)(x[v] - lse);
}

static void test_engine_bf16(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/model_b", testdata());
    moe_model m;
    if (model_load_hf(&m, dir) != MOERL_OK) {
        CHECK(0, "cannot load %s (run tests/ref/gen_model.py %s): %s", dir, testdata(), moerl_last_error());
        return;
    }
    const int V = m.cfg.vocab_size, steps = 10;
    const size_t n = m.n_params, nl = (size_t)3 * steps * V;
    float *orig = xmalloc(n * sizeof(float)), *rounded = xmalloc(n * sizeof(float));
    memcpy(orig, m.params, n * sizeof(float));
    memcpy(rounded, m.params, n * sizeof(float));
    round_bf16(rounded, n);
    float *l16 = xcalloc(nl, sizeof(float)), *lr = xcalloc(nl, sizeof(float)), *l32 = xcalloc(nl, sizeof(float));
    int *t16 = xcalloc(3 * steps, sizeof(int)), *tr = xcalloc(3 * steps, sizeof(int)), *t32 = xcalloc(3 * steps, sizeof(int));
    engine *e16 = make_engine(&m, m.params, 1), *er = make_engine(&m, rounded, 0), *e32 = make_engine(&m, orig, 0);
    CHECK(e16 && er && e32, "engines: %s", moerl_last_error());
    if (!e16 || !er || !e32) return;
    CHECK(!memcmp(m.params, orig, n * sizeof(float)), "the caller's fp32 weights are not rounded by the bf16 engine");
    decode(e16, V, steps, l16, t16);
    decode(er, V, steps, lr, tr);
    decode(e32, V, steps, l32, t32);

    /* 1. bf16 engine == fp32 engine on bf16-rounded weights. Both compute in fp32 from the same
     *    weight values; they differ only in summation order (bf16 panels vs the skinny kernel for
     *    q/k/v/o and the LM head): fp32 rounding over 2 layers, |logits| ≲ 5, so 2e-5 absolute
     *    plus 2e-5 relative (the fp32 path's own error against float64 is 2e-5, tests/test_model.c). */
    CHECK(!memcmp(t16, tr, 3 * steps * sizeof(int)), "bf16 engine greedy tokens == fp32 engine on bf16-rounded weights");
    t_close("bf16 engine logits == fp32 engine on bf16-rounded weights", l16, lr, (long)nl, 2e-5f, 2e-5f);

    /* 2. bf16 engine vs fp32 engine on the original weights, at every step where the tokens so
     *    far agree: the behaviour logprob (of the token fp32 chose) and the whole log-softmax.
     *    Rounding each weight to bf16 changes it by ≤ 2^-9 relative; with random signs the logits
     *    of this model (log-softmax spread ≈ 7) move by ~1e-2, and a logprob by a few 1e-3 (seen:
     *    median 4e-3 for the chosen token). A MoE layer adds jumps: where two experts' router
     *    scores are closer than the rounding moves them, bf16 picks the other expert (seen: up to
     *    0.065 on the chosen token, 0.23 on some unlikely token of the same step). Tolerances:
     *    median ≤ 1e-2 and every step ≤ 0.15 for the chosen token, ≤ 0.5 over the vocabulary —
     *    2.5× the largest seen, and well below what a wrong weight (a logit off by O(1)) gives. */
    double worst = 0, worst_tok = 0, d_tok[3 * 10];
    int compared = 0;
    float *a = xmalloc(V * sizeof(float)), *b = xmalloc(V * sizeof(float));
    for (int i = 0; i < 3; i++)
        for (int s = 0; s < steps; s++) {
            if (s > 0 && t16[i * steps + s - 1] != t32[i * steps + s - 1]) break; /* inputs differ from here */
            log_softmax(a, l16 + ((size_t)i * steps + s) * V, V);
            log_softmax(b, l32 + ((size_t)i * steps + s) * V, V);
            for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)a[v] - b[v]));
            const int tok = t32[i * steps + s];
            d_tok[compared] = fabs((double)a[tok] - b[tok]);
            worst_tok = fmax(worst_tok, d_tok[compared]);
            compared++;
        }
    double med = 0;
    if (compared) { /* median of d_tok[0..compared) */
        for (int i = 1; i < compared; i++)
            for (int j = i; j > 0 && d_tok[j - 1] > d_tok[j]; j--) { double t = d_tok[j]; d_tok[j] = d_tok[j - 1]; d_tok[j - 1] = t; }
        med = compared % 2 ? d_tok[compared / 2] : 0.5 * (d_tok[compared / 2 - 1] + d_tok[compared / 2]);
    }
    printf("bf16 vs fp32 weights over %d steps (3 prompts): behaviour logprob |d| median %.3g max %.3g; "
           "log-softmax max |d| %.3g\n", compared, med, worst_tok, worst);
    CHECK(compared >= 3, "at least the first step of each prompt compared (%d)", compared);
    CHECK(med <= 1e-2, "median |d behaviour logprob| %.3g <= 1e-2", med);
    CHECK(worst_tok <= 0.15, "max |d behaviour logprob| %.3g <= 0.15", worst_tok);
    CHECK(worst <= 0.5, "max |d logprob| over the vocabulary %.3g <= 0.5", worst);
    CHECK(worst > 0, "bf16 weights change the logprobs at all (the mode is on): %.3g", worst);

    /* 3. an in-place reload (a rollout rank receiving a broadcast) is rounded and packed again */
    memcpy(engine_weight_buffer(e16), orig, n * sizeof(float));
    engine_set_version(e16, 1);
    float *l16b = xcalloc(nl, sizeof(float));
    int *t16b = xcalloc(3 * steps, sizeof(int));
    decode(e16, V, steps, l16b, t16b);
    CHECK(!memcmp(l16b, l16, nl * sizeof(float)), "reload via engine_weight_buffer + engine_set_version == engine_load_weights");
    CHECK(engine_version(e16) == 1, "version");

    /* 4. bf16 weights straight in (a rollout rank receiving a bf16 broadcast): engine_weight_buffer_bf16
     *    filled with bf16(orig), engine_set_version_bf16 — the same fp32 weights (bit for bit: the
     *    bf16-rounded values) and the same logits, bit for bit, as rounding fp32 weights on load.
     *    Loaded over different weights first, so a load that did nothing would show. */
    uint16_t *w16 = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) w16[i] = f32_to_bf16(orig[i]);
    float *other = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) other[i] = orig[i] * 0.5f;
    CHECK(engine_load_weights(e16, other, n, 7) == MOERL_OK, "load other weights");
    uint16_t *dst = engine_weight_buffer_bf16(e16);
    CHECK(dst != NULL, "bf16 buffer of a bf16 engine: %s", moerl_last_error());
    if (dst) {
        memcpy(dst, w16, n * sizeof(uint16_t));
        CHECK(engine_set_version_bf16(e16, 2) == MOERL_OK && engine_version(e16) == 2, "engine_set_version_bf16");
        CHECK(!memcmp(engine_model(e16)->params, rounded, n * sizeof(float)),
              "bf16 in place: the engine's fp32 weights == the bf16-rounded weights, bit for bit");
        decode(e16, V, steps, l16b, t16b);
        CHECK(!memcmp(l16b, l16, nl * sizeof(float)), "bf16 in place: logits == engine_load_weights of fp32, bit for bit");
    }
    CHECK(engine_load_weights(e16, other, n, 7) == MOERL_OK, "load other weights");
    CHECK(engine_load_weights_bf16(e16, w16, n, 3) == MOERL_OK && engine_version(e16) == 3, "engine_load_weights_bf16");
    decode(e16, V, steps, l16b, t16b);
    CHECK(!memcmp(l16b, l16, nl * sizeof(float)), "engine_load_weights_bf16: logits == engine_load_weights of fp32");
    CHECK(engine_load_weights_bf16(e16, w16, n - 1, 3) == MOERL_ERR && strstr(moerl_last_error(), "layout has"),
          "wrong size refused: %s", moerl_last_error());
    CHECK(engine_weight_buffer_bf16(e32) == NULL && strstr(moerl_last_error(), "fp32"),
          "an fp32 engine has no bf16 buffer: %s", moerl_last_error());
    CHECK(engine_load_weights_bf16(e32, w16, n, 3) == MOERL_ERR && engine_set_version_bf16(e32, 3) == MOERL_ERR,
          "an fp32 engine refuses bf16 weights");
    free(w16); free(other);

    free(a); free(b); free(l16b); free(t16b);
    engine_free(e16); engine_free(er); engine_free(e32);
    free(l16); free(lr); free(l32); free(t16); free(tr); free(t32); free(orig); free(rounded);
    model_free(&m);
}

int main(void) {
    test_kernel();
    test_engine_bf16();
    TEST_MAIN_END();
}
