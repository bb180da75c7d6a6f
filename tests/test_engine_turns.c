/* Multi-turn generation on the rollout engine (engine_continue): a continued request equals a fresh
 * request whose prompt is prompt ⊕ sampled ⊕ inserted ids (greedy and seeded sampling), its sampled
 * tokens' logprobs equal the trainer's full-forward recomputation, the per-token mask, interruption
 * mid-turn with exact per-token versions, the length cap over all turns, and bad input. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "fixture.h"
#include "model/forward.h"
#include "model/model.h"
#include "rollout/engine.h"
#include "test.h"

#define MAXTOK 40

static moe_config cfg_small(void) {
    const char *kv[] = {"model.max_position_embeddings=128", "model.initializer_range=0.15"};
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

/* Step until r finishes; with pause_every > 0, pause, load the weights as version `*ver + 1` and
 * resume every pause_every steps (the weights are unchanged, so tokens must not change). */
static void run_until(engine *e, gen_request *r, const moe_model *m, int pause_every, int *ver) {
    gen_request *done[16];
    for (int step = 1, guard = 0; r->finish == FINISH_NONE && guard < 10000; step++, guard++) {
        MOERL_ASSERT(engine_step(e, done, 16) >= 0);
        if (pause_every > 0 && r->finish == FINISH_NONE && step % pause_every == 0) {
            engine_pause(e, NULL, 0);
            ++*ver;
            MOERL_ASSERT(engine_load_weights(e, m->params, m->n_params, *ver) == MOERL_OK);
            MOERL_ASSERT(engine_resume(e, done, 16) >= 0);
        }
    }
}

/* The trainer's view: logprobs of every model-sampled output token from one full forward of
 * prompt ⊕ output. Same fp32 math in another batch shape: 1e-5 absolute is the accumulated rounding
 * margin (as test_engine's behaviour-logprob check). Inserted tokens are skipped. */
static void check_vs_full_forward(const moe_model *m, const gen_request *r, const char *tag) {
    const int T = r->prompt_len + r->n_out;
    int *tok = xmalloc(T * sizeof(int)), *tgt = xmalloc(T * sizeof(int));
    for (int i = 0; i < T; i++) tok[i] = i < r->prompt_len ? r->prompt[i] : r->out_tokens[i - r->prompt_len];
    for (int i = 0; i < T; i++) tgt[i] = i + 1 < T ? tok[i + 1] : -1;
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, T) == MOERL_OK);
    int cu[2] = {0, T};
    MOERL_ASSERT(model_forward(m, &a, tok, cu, NULL, 1, T) == MOERL_OK);
    model_logprobs(m, &a, tgt, r->sp.temperature > 0 ? r->sp.temperature : 1.0f, 0);
    float *got = xmalloc(r->n_out * sizeof(float)), *want = xmalloc(r->n_out * sizeof(float));
    int k = 0;
    for (int t = 0; t < r->n_out; t++)
        if (r->out_mask[t]) {
            got[k] = r->out_logprobs[t];
            want[k++] = a.logp[r->prompt_len - 1 + t];
        }
    char what[128];
    snprintf(what, sizeof what, "%s: sampled-token logprobs vs full forward (%d tokens)", tag, k);
    t_close(what, got, want, k, 1e-5f, 1e-5f);
    model_acts_free(&a);
    free(tok); free(tgt); free(got); free(want);
}

/* Turn 1 ends at a stop token (the token the same request samples at output index 3, found by a
 * probe run), 5 ids are inserted, turn 2 runs to the cap. */
static void test_continue_equals_fresh(float temp, int pause_every) {
    moe_config c = cfg_small();
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 17);
    engine_config ec = {.max_num_seqs = 3, .max_model_len = 100, .max_num_batched_tokens = 8};
    engine *e = engine_create(&c, ec);
    int ver = 0;
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, ver) == MOERL_OK);
    int prompt[5] = {3, 14, 15, 9, 26};
    char tag[96];
    snprintf(tag, sizeof tag, "T=%g pause_every=%d", (double)temp, pause_every);
    gen_request probe, r, fresh;
    init_req(&probe, 0, prompt, 5, sp_make(temp, 99, MAXTOK));
    MOERL_ASSERT(engine_add(e, &probe) == MOERL_OK);
    run_until(e, &probe, &m, 0, &ver);
    int stop = probe.out_tokens[3], first = 0;
    while (probe.out_tokens[first] != stop) first++; /* the stop token's first occurrence */
    init_req(&r, 1, prompt, 5, sp_make(temp, 99, MAXTOK));
    r.sp.n_stop = 1; r.sp.stop_tokens[0] = stop;
    r.out_logits = xcalloc((size_t)MAXTOK * c.vocab_size, sizeof(float));
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    run_until(e, &r, &m, pause_every, &ver);
    CHECK(r.finish == FINISH_STOP && r.n_out == first + 1, "%s: turn 1 finish %s n_out %d (want stop at %d)", tag,
          finish_reason_name(r.finish), r.n_out, first + 1);
    const int n1 = r.n_out, last_ver = r.out_versions[n1 - 1];
    int ins[5] = {60, 1, 2, 61, 0};
    r.sp.n_stop = 0;
    CHECK(engine_continue(e, &r, ins, 5) == 1, "%s: continue: %s", tag, moerl_last_error());
    CHECK(r.n_out == n1 + 5 && r.turn == 1, "%s: n_out %d turn %d after continue", tag, r.n_out, r.turn);
    const int n2 = r.n_out;
    /* the fresh request: prompt ⊕ outputs so far, the turn's seed, the rest of the budget */
    int fp[5 + MAXTOK];
    memcpy(fp, prompt, sizeof prompt);
    memcpy(fp + 5, r.out_tokens, n2 * sizeof(int));
    init_req(&fresh, 2, fp, 5 + n2, sp_make(temp, engine_turn_seed(99, 1), MAXTOK - n2));
    fresh.out_logits = xcalloc((size_t)MAXTOK * c.vocab_size, sizeof(float));
    const int nint_before = r.n_interruptions;
    run_until(e, &r, &m, pause_every, &ver); /* alone in the engine: the pauses land in turn 2 */
    MOERL_ASSERT(engine_add(e, &fresh) == MOERL_OK);
    run_until(e, &fresh, &m, 0, &ver);
    CHECK(r.finish == FINISH_LENGTH && r.n_out == MAXTOK, "%s: finish %s n_out %d (cap %d over all turns)", tag,
          finish_reason_name(r.finish), r.n_out, MAXTOK);
    CHECK(fresh.n_out == MAXTOK - n2 && !memcmp(fresh.out_tokens, r.out_tokens + n2, fresh.n_out * sizeof(int)),
          "%s: turn 2 tokens differ from the fresh request's", tag);
    /* same math, other batch/chunk shapes: rounding only (1e-5; logits of magnitude ≤ ~5: 2e-5) */
    t_close("turn 2 logprobs vs fresh request", r.out_logprobs + n2, fresh.out_logprobs, fresh.n_out, 1e-5f, 1e-5f);
    t_close("turn 2 logits vs fresh request", r.out_logits + (size_t)n2 * c.vocab_size, fresh.out_logits,
            (long)fresh.n_out * c.vocab_size, 2e-5f, 1e-5f);
    check_vs_full_forward(&m, &r, tag);
    int mask_ok = 1, ins_ok = 1, ver_ok = 1;
    for (int t = 0; t < r.n_out; t++) {
        const int inserted = t >= n1 && t < n2;
        mask_ok &= r.out_mask[t] == !inserted;
        if (inserted) {
            ins_ok &= r.out_tokens[t] == ins[t - n1] && r.out_logprobs[t] == 0 && r.out_versions[t] == last_ver;
            for (int v = 0; v < c.vocab_size; v++) ins_ok &= r.out_logits[(size_t)t * c.vocab_size + v] == 0;
        }
        if (t > 0) ver_ok &= r.out_versions[t] >= r.out_versions[t - 1];
    }
    CHECK(mask_ok, "%s: mask is 1 on sampled tokens, 0 on the inserted ones", tag);
    CHECK(ins_ok, "%s: inserted tokens keep their ids, logprob 0, the version of the turn, zero logits", tag);
    CHECK(ver_ok, "%s: versions never decrease along the output", tag);
    if (pause_every > 0) {
        CHECK(r.n_interruptions > nint_before && r.out_versions[r.n_out - 1] == ver && r.out_versions[0] == 0,
              "%s: interrupted %d times, versions %d..%d (engine at %d)", tag, r.n_interruptions, r.out_versions[0],
              r.out_versions[r.n_out - 1], ver);
    }
    free(r.out_logits); free(fresh.out_logits);
    gen_request_free_outputs(&probe); gen_request_free_outputs(&r); gen_request_free_outputs(&fresh);
    engine_free(e);
    model_free(&m);
}

/* The cap over all turns, the model-length cap, and refusals that leave the request untouched. */
static void test_limits_and_errors(void) {
    moe_config c = cfg_small();
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 23);
    engine_config ec = {.max_num_seqs = 2, .max_model_len = 30, .max_num_batched_tokens = 16};
    engine *e = engine_create(&c, ec);
    int ver = 0;
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    int prompt[4] = {5, 6, 7, 8}, ins[30];
    for (int i = 0; i < 30; i++) ins[i] = (i * 7) % c.vocab_size;
    gen_request r;
    init_req(&r, 0, prompt, 4, sp_make(0, 1, 20));
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    CHECK(engine_continue(e, &r, ins, 1) == MOERL_ERR, "continuing a running request is refused");
    r.sp.n_stop = 1; r.sp.stop_tokens[0] = -7; /* never sampled: runs to the cap */
    run_until(e, &r, &m, 0, &ver);
    CHECK(r.finish == FINISH_LENGTH && engine_continue(e, &r, ins, 1) == MOERL_ERR,
          "a request finished at its length limit cannot continue");
    gen_request_free_outputs(&r);
    /* a turn that stops after 2 tokens: the greedy token at index 1 as stop token */
    init_req(&r, 1, prompt, 4, sp_make(0, 1, 20));
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    run_until(e, &r, &m, 0, &ver);
    const int stop = r.out_tokens[1];
    gen_request_free_outputs(&r);
    init_req(&r, 2, prompt, 4, sp_make(0, 1, 20));
    r.sp.n_stop = 1; r.sp.stop_tokens[0] = stop;
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    run_until(e, &r, &m, 0, &ver);
    MOERL_ASSERT(r.finish == FINISH_STOP);
    const int n1 = r.n_out;
    int bad[2] = {3, 64};
    CHECK(engine_continue(e, &r, bad, 2) == MOERL_ERR && r.n_out == n1 && r.finish == FINISH_STOP,
          "an id outside the vocabulary is refused, request untouched");
    CHECK(engine_continue(e, &r, ins, -1) == MOERL_ERR && r.n_out == n1, "n < 0 refused");
    r.sp.max_tokens = 30;
    CHECK(engine_continue(e, &r, ins, 1) == MOERL_ERR && r.n_out == n1 && strstr(moerl_last_error(), "max_tokens changed"),
          "a changed max_tokens refused (it bounds all turns): %s", moerl_last_error());
    r.sp.max_tokens = 20;
    /* no room left for a new token: nothing appended, finished at its length */
    CHECK(engine_continue(e, &r, ins, 20 - n1) == 0 && r.finish == FINISH_LENGTH && r.n_out == n1,
          "inserted ids filling max_tokens: finish %s n_out %d", finish_reason_name(r.finish), r.n_out);
    r.finish = FINISH_STOP; /* as it was: the refusal changed nothing else */
    /* room for exactly one token: one is sampled, then the cap */
    r.sp.n_stop = 0;
    CHECK(engine_continue(e, &r, ins, 19 - n1) == 1, "continue: %s", moerl_last_error());
    run_until(e, &r, &m, 0, &ver);
    CHECK(r.finish == FINISH_LENGTH && r.n_out == 20 && r.out_mask[19] == 1 && r.out_mask[18] == 0,
          "one token after the insertion, then the cap: finish %s n_out %d", finish_reason_name(r.finish), r.n_out);
    gen_request_free_outputs(&r);
    /* max_model_len (30) binds before max_tokens (40): prompt 4 + outputs must stay below it */
    init_req(&r, 3, prompt, 4, sp_make(0, 1, 40));
    r.sp.n_stop = 1; r.sp.stop_tokens[0] = stop;
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    run_until(e, &r, &m, 0, &ver);
    MOERL_ASSERT(r.finish == FINISH_STOP);
    CHECK(engine_continue(e, &r, ins, 26 - r.n_out) == 0 && r.finish == FINISH_LENGTH,
          "inserted ids reaching max_model_len: finish %s", finish_reason_name(r.finish));
    gen_request_free_outputs(&r);
    engine_free(e);
    model_free(&m);
}

int main(void) {
    test_continue_equals_fresh(0, 0);      /* greedy */
    test_continue_equals_fresh(0.9f, 0);   /* seeded sampling */
    test_continue_equals_fresh(0.9f, 3);   /* interrupted every 3 steps, mid-turn, new version each time */
    test_continue_equals_fresh(0, 2);
    test_limits_and_errors();
    TEST_MAIN_END();
}
