/* Rollout engine tests: incremental decode vs full forward, batch invariance, interrupt/resume,
 * behaviour logprobs vs the trainer's recomputation, bad input, and greedy generation against
 * the PyTorch reference (tests/ref/gen_greedy.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "rollout/engine.h"
#include "test.h"

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

/* Config like the parity tests' B (head_dim ≠ H/nh, renormalised top-k) plus a dense layer. */
static moe_config small_config(int variant) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 61; c.hidden_size = 32; c.intermediate_size = 40; c.moe_intermediate_size = 16;
    c.num_hidden_layers = 3; c.num_attention_heads = 4; c.num_key_value_heads = 2;
    c.head_dim = variant ? 12 : 8; c.num_experts = 8; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1;
    c.norm_topk_prob = variant; c.tie_word_embeddings = !variant; c.max_position_embeddings = 256;
    c.rms_norm_eps = 1e-6f; c.rope_theta = variant ? 1e6f : 1e4f; c.router_aux_loss_coef = 0.001f;
    c.initializer_range = 0.15f; /* peaky logits: fewer near-ties in greedy comparisons */
    c.bos_token_id = -1; c.eos_token_id = -1;
    if (!variant) { c.n_mlp_only_layers = 1; c.mlp_only_layers[0] = 1; }
    return c;
}

static sampling_params sp_make(float temp, int top_k, float top_p, uint64_t seed, int max_tokens) {
    sampling_params sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = temp; sp.top_k = top_k; sp.top_p = top_p; sp.seed = seed; sp.max_tokens = max_tokens;
    return sp;
}

/* Run requests to completion. */
static void run_all(engine *e) {
    gen_request *done[256];
    int guard = 0;
    while (engine_num_unfinished(e) > 0 && guard++ < 100000) MOERL_ASSERT(engine_step(e, done, 256) >= 0);
}

static void init_req(gen_request *r, int64_t id, int *prompt, int plen, sampling_params sp) {
    memset(r, 0, sizeof *r);
    r->id = id; r->prompt = prompt; r->prompt_len = plen; r->sp = sp;
}

/* Full-forward logits and logprobs of prompt ⊕ response under the same weights. */
static void full_forward_check(moe_model *m, gen_request *r, float temperature, const char *tag) {
    int T = r->prompt_len + r->n_out;
    int *tok = xmalloc(T * sizeof(int)), *tgt = xmalloc(T * sizeof(int));
    for (int i = 0; i < T; i++) tok[i] = i < r->prompt_len ? r->prompt[i] : r->out_tokens[i - r->prompt_len];
    for (int i = 0; i < T; i++) tgt[i] = i + 1 < T ? tok[i + 1] : -1;
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, T) == MOERL_OK);
    int cu[2] = {0, T};
    MOERL_ASSERT(model_forward(m, &a, tok, cu, NULL, 1, T) == MOERL_OK);
    model_logprobs(m, &a, tgt, temperature > 0 ? temperature : 1.0f, 0);
    const int V = m->cfg.vocab_size;
    char what[128];
    if (r->out_logits) {
        /* logits of the token sampled at output i come from position prompt_len−1+i. Cached K/V
         * reproduce the same dot products; only summation order/blocking differ: 2e-5 absolute
         * on logits of magnitude ≤ ~5 (fp32 rounding through 3 layers). */
        snprintf(what, sizeof what, "%s: decode logits vs full forward", tag);
        t_close(what, r->out_logits, a.logits + (size_t)(r->prompt_len - 1) * V, (long)r->n_out * V, 2e-5f, 1e-5f);
    }
    /* behaviour logprob vs the trainer's recomputed logprob under the same weights: same fp32
     * math in a different batch shape; 1e-5 absolute is the accumulated rounding margin. */
    snprintf(what, sizeof what, "%s: behaviour logprobs vs trainer", tag);
    t_close(what, r->out_logprobs, a.logp + r->prompt_len - 1, r->n_out, 1e-5f, 1e-5f);
    model_acts_free(&a);
    free(tok);
    free(tgt);
}

static void test_decode_matches_forward(int variant) {
    moe_config c = small_config(variant);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 42 + variant);
    engine_config ec = {.max_num_seqs = 4, .max_model_len = 96, .max_num_batched_tokens = 64};
    engine *e = engine_create(&c, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    int p1[1] = {7}, p2[40], p3[5] = {1, 2, 3, 4, 5};
    for (int i = 0; i < 40; i++) p2[i] = (i * 13 + 5) % c.vocab_size;
    gen_request r[3];
    init_req(&r[0], 0, p1, 1, sp_make(0, 0, 1, 0, 60));      /* greedy from a 1-token prompt: every position */
    init_req(&r[1], 1, p2, 40, sp_make(0.8f, 0, 1, 9, 30));  /* prefill 40 then sample */
    init_req(&r[2], 2, p3, 5, sp_make(1.3f, 10, 0.9f, 3, 25)); /* top-k + top-p */
    for (int i = 0; i < 3; i++) {
        r[i].out_logits = xmalloc((size_t)r[i].sp.max_tokens * c.vocab_size * sizeof(float));
        CHECK(engine_add(e, &r[i]) == MOERL_OK, "add: %s", moerl_last_error());
    }
    run_all(e);
    for (int i = 0; i < 3; i++) {
        char tag[64];
        snprintf(tag, sizeof tag, "variant %d request %d", variant, i);
        CHECK(r[i].finish == FINISH_LENGTH && r[i].n_out == r[i].sp.max_tokens, "%s: finish %d n_out %d", tag,
              r[i].finish, r[i].n_out);
        full_forward_check(&m, &r[i], r[i].sp.temperature, tag);
        for (int t = 0; t < r[i].n_out; t++) CHECK(r[i].out_versions[t] == 0, "version");
        free(r[i].out_logits);
        gen_request_free_outputs(&r[i]);
    }
    engine_free(e);
    model_free(&m);
}

/* The same seeded request alone and in a full batch of other requests. */
static void test_batch_invariance(void) {
    moe_config c = small_config(1);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 5);
    engine_config ec = {.max_num_seqs = 8, .max_model_len = 64, .max_num_batched_tokens = 32};
    int prompt[6] = {3, 9, 27, 20, 1, 50};
    gen_request solo;
    engine *e = engine_create(&c, ec);
    engine_load_weights(e, m.params, m.n_params, 0);
    init_req(&solo, 0, prompt, 6, sp_make(1.0f, 0, 0.95f, 1234, 30));
    engine_add(e, &solo);
    run_all(e);
    /* mixed batch: others with different prompts/lengths, admitted before and after */
    gen_request others[12], again;
    int op[12][10];
    for (int i = 0; i < 12; i++) {
        for (int j = 0; j < 10; j++) op[i][j] = (i * 7 + j * 3) % c.vocab_size;
        init_req(&others[i], 100 + i, op[i], 1 + i % 10, sp_make(0.7f, 5, 1, 77 + i, 5 + 3 * i));
    }
    for (int i = 0; i < 5; i++) engine_add(e, &others[i]);
    init_req(&again, 1, prompt, 6, sp_make(1.0f, 0, 0.95f, 1234, 30));
    engine_add(e, &again);
    for (int i = 5; i < 12; i++) engine_add(e, &others[i]);
    run_all(e);
    CHECK(solo.n_out == again.n_out && !memcmp(solo.out_tokens, again.out_tokens, solo.n_out * sizeof(int)),
          "batch invariance: tokens differ alone vs in a batch");
    /* logprobs: same math, different batch composition → only GEMM blocking differs (1e-5). */
    t_close("batch invariance logprobs", again.out_logprobs, solo.out_logprobs, solo.n_out, 1e-5f, 1e-5f);
    gen_request_free_outputs(&solo);
    gen_request_free_outputs(&again);
    for (int i = 0; i < 12; i++) gen_request_free_outputs(&others[i]);
    engine_free(e);
    model_free(&m);
}

/* Interrupt every few steps with unchanged weights: tokens equal the uninterrupted run. */
static void test_interrupt_resume(float temp) {
    moe_config c = small_config(0);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 11);
    engine_config ec = {.max_num_seqs = 3, .max_model_len = 80, .max_num_batched_tokens = 16};
    int prompts[5][8];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 8; j++) prompts[i][j] = (i * 11 + j * 5 + 1) % c.vocab_size;
    gen_request ref[5], intr[5];
    engine *e = engine_create(&c, ec);
    engine_load_weights(e, m.params, m.n_params, 0);
    for (int i = 0; i < 5; i++) {
        init_req(&ref[i], i, prompts[i], 3 + i, sp_make(temp, 0, 1, 100 + i, 20 + 7 * i));
        engine_add(e, &ref[i]);
    }
    run_all(e);
    for (int i = 0; i < 5; i++) {
        init_req(&intr[i], i, prompts[i], 3 + i, sp_make(temp, 0, 1, 100 + i, 20 + 7 * i));
        engine_add(e, &intr[i]);
    }
    gen_request *done[64], *paused[64];
    int step = 0, n_pauses = 0, version = 0, aligned = 1;
    while (engine_num_unfinished(e) > 0) {
        engine_step(e, done, 64);
        if (++step % 4 == 0) {
            int np = engine_pause(e, paused, 64);
            for (int i = 0; i < np; i++) {
                gen_request *r = paused[i];
                for (int t = 0; t < r->n_out; t++) aligned &= r->out_versions[t] <= version;
            }
            /* "swap" to identical weights under a new version */
            engine_load_weights(e, m.params, m.n_params, ++version);
            engine_resume(e, done, 64);
            n_pauses++;
        }
    }
    CHECK(n_pauses > 3, "expected several interruptions, got %d", n_pauses);
    CHECK(aligned, "versions beyond the current version");
    int total_intr = 0;
    for (int i = 0; i < 5; i++) {
        total_intr += intr[i].n_interruptions;
        CHECK(intr[i].n_out == ref[i].n_out && !memcmp(intr[i].out_tokens, ref[i].out_tokens, ref[i].n_out * sizeof(int)),
              "temp %g request %d: interrupted tokens differ from uninterrupted (n %d vs %d)", (double)temp, i,
              intr[i].n_out, ref[i].n_out);
        /* re-prefill recomputes the same K/V with a different batch shape: 1e-5 on logprobs. */
        t_close("interrupt/resume logprobs", intr[i].out_logprobs, ref[i].out_logprobs, ref[i].n_out, 1e-5f, 1e-5f);
        /* versions never decrease along a response, and resumed tokens keep theirs */
        int mono = 1;
        for (int t = 1; t < intr[i].n_out; t++) mono &= intr[i].out_versions[t] >= intr[i].out_versions[t - 1];
        CHECK(mono, "request %d: versions decrease", i);
        gen_request_free_outputs(&ref[i]);
        gen_request_free_outputs(&intr[i]);
    }
    CHECK(total_intr > 0, "no request was interrupted");
    engine_free(e);
    model_free(&m);
}

/* A paused request at its length limit is returned finished, not resumed; abort returns all. */
static void test_limits_and_abort(void) {
    moe_config c = small_config(0);
    c.eos_token_id = 3;
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 3);
    engine_config ec = {.max_num_seqs = 2, .max_model_len = 12, .max_num_batched_tokens = 16};
    engine *e = engine_create(&c, ec);
    engine_load_weights(e, m.params, m.n_params, 0);
    int p[10] = {1, 2, 4, 5, 6, 7, 8, 9, 10, 11};
    gen_request r, q;
    init_req(&r, 0, p, 10, sp_make(0, 0, 1, 0, 50));
    r.sp.ignore_eos = 1;
    engine_add(e, &r);
    run_all(e);
    CHECK(r.finish == FINISH_LENGTH && r.n_out == 2, "max_model_len bounds the response: n_out %d", r.n_out);
    gen_request_free_outputs(&r);
    /* eos / stop tokens */
    init_req(&r, 0, p, 2, sp_make(0, 0, 1, 0, 9));
    engine_add(e, &r);
    run_all(e);
    int first = r.out_tokens[0];
    gen_request_free_outputs(&r);
    init_req(&r, 0, p, 2, sp_make(0, 0, 1, 0, 9));
    r.sp.n_stop = 1;
    r.sp.stop_tokens[0] = first;
    engine_add(e, &r);
    run_all(e);
    CHECK(r.finish == FINISH_STOP && r.n_out == 1, "stop token ends the response (n_out %d)", r.n_out);
    gen_request_free_outputs(&r);
    /* abort */
    init_req(&r, 0, p, 3, sp_make(1, 0, 1, 5, 8));
    init_req(&q, 1, p, 4, sp_make(1, 0, 1, 6, 8));
    engine_add(e, &r);
    engine_add(e, &q);
    gen_request *done[8], *out[8];
    engine_step(e, done, 8);
    int na = engine_abort(e, out, 8);
    CHECK(na == 2 && r.finish == FINISH_ABORT && q.finish == FINISH_ABORT && engine_num_unfinished(e) == 0,
          "abort returns every request (%d)", na);
    gen_request_free_outputs(&r);
    gen_request_free_outputs(&q);
    /* bad input */
    int bad[1] = {999};
    init_req(&r, 0, bad, 1, sp_make(0, 0, 1, 0, 4));
    CHECK(engine_add(e, &r) == MOERL_ERR && strstr(moerl_last_error(), "vocabulary"), "bad token: %s", moerl_last_error());
    init_req(&r, 0, p, 10, sp_make(-1, 0, 1, 0, 4));
    CHECK(engine_add(e, &r) == MOERL_ERR && strstr(moerl_last_error(), "temperature"), "bad temperature: %s", moerl_last_error());
    init_req(&r, 0, p, 10, sp_make(1, 0, 1.5f, 0, 4));
    CHECK(engine_add(e, &r) == MOERL_ERR && strstr(moerl_last_error(), "top_p"), "bad top_p: %s", moerl_last_error());
    int longp[12] = {0};
    init_req(&r, 0, longp, 12, sp_make(1, 0, 1, 0, 4));
    CHECK(engine_add(e, &r) == MOERL_ERR && strstr(moerl_last_error(), "max_model_len"), "long prompt: %s", moerl_last_error());
    init_req(&r, 0, p, 2, sp_make(1, 0, 1, 0, 0));
    CHECK(engine_add(e, &r) == MOERL_ERR && strstr(moerl_last_error(), "max_tokens"), "max_tokens 0: %s", moerl_last_error());
    engine_free(e);
    model_free(&m);
}

/* Greedy generation equals the PyTorch reference's, token for token. */
static void test_greedy_vs_torch(const char *tag) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/model_%s", testdata(), tag);
    snprintf(ref, sizeof ref, "%s/greedy_%s.safetensors", testdata(), tag);
    moe_model m;
    st_file f;
    if (model_load_hf(&m, dir) != MOERL_OK || st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "greedy %s: cannot load %s / %s: %s", tag, dir, ref, moerl_last_error());
        return;
    }
    engine_config ec = {.max_num_seqs = 4, .max_model_len = 128, .max_num_batched_tokens = 64};
    engine *e = engine_create(&m.cfg, ec);
    engine_load_weights(e, m.params, m.n_params, 0);
    gen_request r[4];
    int n = 0;
    const st_tensor *pt[4], *gt[4];
    for (int i = 0; i < 4; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "prompt.%d", i);
        pt[i] = st_find(&f, nm);
        snprintf(nm, sizeof nm, "greedy.%d", i);
        gt[i] = st_find(&f, nm);
        if (!pt[i] || !gt[i]) break;
        init_req(&r[i], i, (int *)pt[i]->data, (int)pt[i]->numel, sp_make(0, 0, 1, 0, (int)gt[i]->numel));
        r[i].sp.ignore_eos = 1;
        engine_add(e, &r[i]);
        n++;
    }
    CHECK(n > 0, "greedy %s: no prompts in reference", tag);
    run_all(e);
    for (int i = 0; i < n; i++) {
        const int *want = gt[i]->data;
        int same = r[i].n_out == gt[i]->numel;
        for (int t = 0; same && t < r[i].n_out; t++) same = r[i].out_tokens[t] == want[t];
        CHECK(same, "greedy %s prompt %d differs from PyTorch", tag, i);
        gen_request_free_outputs(&r[i]);
    }
    engine_free(e);
    st_close(&f);
    model_free(&m);
}

int main(void) {
    test_decode_matches_forward(0);
    test_decode_matches_forward(1);
    test_batch_invariance();
    test_interrupt_resume(0.0f);
    test_interrupt_resume(1.0f);
    test_limits_and_abort();
    test_greedy_vs_torch("a");
    test_greedy_vs_torch("b");
    TEST_MAIN_END();
}
