/* The Chrome trace writer (src/base/trace.c) and the MFU pieces (src/model/perf.c):
 *  1. off by default: trace_begin is −1 and nothing is recorded;
 *  2. a training step (forward, backward, AdamW) and rollout-engine steps (prefill, decode,
 *     sampling) with the trace on write a file that is valid JSON (jansson) in the Chrome
 *     trace-event format — "traceEvents" of complete ("X") events with name, cat, ts, dur,
 *     pid, tid — holding the expected span names: the MoE stages (router, permute, each grouped
 *     GEMM, unpermute, their backward), attention, the optimizer and the engine steps; spans
 *     from several OpenMP threads keep their own thread ids;
 *  3. bad paths are refused when the trace is opened (missing folder, a folder), a second
 *     trace_open while recording is refused;
 *  4. model_train_flops against the formula written out by hand for a small config, attention
 *     pairs of a packed batch, and a measured sgemm peak that is positive and finite.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/trace.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/perf.h"
#include "optim/adamw.h"
#include "rollout/engine.h"
#include "fixture.h"
#include "test.h"

static moe_config tiny_config(void) {
    const char *kv[] = {"model.intermediate_size=48", "model.num_hidden_layers=2", "model.num_key_value_heads=2",
                        "model.num_experts=4", "model.num_experts_per_tok=2", "model.max_position_embeddings=128",
                        "model.router_aux_loss_coef=0.01",
                        "model.mlp_only_layers=[1]"}; /* layer 1 dense: both kinds of MLP */
    return fx_small_config(kv, FX_N(kv));
}

/* One training step and a few engine steps on the tiny model. */
static void run_workload(void) {
    moe_config c = tiny_config();
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 3);
    const int N = 40, B = 2;
    int tok[40], tgt[40], cu[3] = {0, 25, 40};
    for (int i = 0; i < N; i++) {
        tok[i] = (i * 7 + 1) % c.vocab_size;
        tgt[i] = (i * 11 + 2) % c.vocab_size;
    }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, N) == MOERL_OK);
    model_zero_grad(&m);
    CHECK(model_forward(&m, &a, tok, cu, NULL, B, N) == MOERL_OK, "forward: %s", moerl_last_error());
    model_logprobs(&m, &a, tgt, 1.0f, 0);
    float dlogp[40];
    for (int i = 0; i < N; i++) dlogp[i] = -1.0f / N;
    model_backward(&m, &a, dlogp, NULL, c.router_aux_loss_coef);
    adamw_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                       .max_grad_norm = 1.0f};
    adamw_state os;
    adamw_init(&os, &m, oc);
    double gn;
    adamw_step(&os, &m, oc.lr, 1.0f, &gn);
    adamw_free(&os);
    model_acts_free(&a);

    engine_config ec = {.max_num_seqs = 2, .max_model_len = 32, .max_num_batched_tokens = 32};
    engine *e = engine_create(&m.cfg, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 1) == MOERL_OK);
    int prompt[6] = {1, 2, 3, 4, 5, 6};
    gen_request r[2];
    for (int i = 0; i < 2; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].id = i; r[i].prompt = prompt; r[i].prompt_len = 6;
        r[i].sp = (sampling_params){.temperature = 1.0f, .top_p = 1.0f, .seed = 5 + i, .max_tokens = 4, .ignore_eos = 1};
        CHECK(engine_add(e, &r[i]) == MOERL_OK, "engine_add: %s", moerl_last_error());
    }
    gen_request *done[2];
    int n_done = 0;
    for (int s = 0; s < 20 && n_done < 2; s++) n_done += engine_step(e, done + n_done, 2 - n_done);
    CHECK(n_done == 2, "engine finished %d of 2 requests", n_done);
    for (int i = 0; i < 2; i++) {
        gen_request_free_outputs(&r[i]);
    }
    engine_free(e);
    model_free(&m);
}

static int has_name(json_t *events, const char *name) {
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        const char *n = json_string_value(json_object_get(ev, "name"));
        if (n && !strcmp(n, name)) return 1;
    }
    return 0;
}

static void test_trace(void) {
    /* 1. off */
    CHECK(!trace_enabled() && trace_begin() < 0, "trace is on before trace_open");
    run_workload();
    CHECK(trace_count() == 0, "%zu spans recorded while off", trace_count());

    /* 3. bad paths */
    CHECK(trace_open("/nonexistent-dir-moerl/t.json") == MOERL_ERR && strstr(moerl_last_error(), "folder"),
          "missing folder accepted: %s", moerl_last_error());
    const char *dir = getenv("MOERL_TESTDATA");
    if (!dir || !*dir) dir = "build/testdata";
    CHECK(trace_open(dir) == MOERL_ERR, "a folder accepted as the trace file");

    /* 2. on */
    char path[1024];
    snprintf(path, sizeof path, "%s/trace_test.json", dir);
    remove(path);
    CHECK(trace_open(path) == MOERL_OK, "trace_open: %s", moerl_last_error());
    CHECK(trace_open(path) == MOERL_ERR, "second trace_open while recording accepted");
    int nthreads = 1;
#pragma omp parallel
    {
        double t = trace_begin();
#ifdef _OPENMP
#pragma omp single
        nthreads = omp_get_num_threads();
#endif
        trace_end("thread span", "test", t);
    }
    TRACE_SPAN("macro span", "test") { run_workload(); }
    CHECK(trace_close() == MOERL_OK, "trace_close: %s", moerl_last_error());
    CHECK(!trace_enabled(), "still recording after trace_close");
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    CHECK(root != NULL, "trace %s is not valid JSON: %s (line %d)", path, jerr.text, jerr.line);
    if (!root) return;
    json_t *events = json_object_get(root, "traceEvents");
    CHECK(json_is_array(events) && json_array_size(events) > 0, "traceEvents missing or empty");
    size_t i;
    json_t *ev;
    int well_formed = 1, n_thread_spans = 0;
    json_t *tids = json_object();
    json_array_foreach(events, i, ev) {
        json_t *ph = json_object_get(ev, "ph"), *ts = json_object_get(ev, "ts"), *dur = json_object_get(ev, "dur");
        if (!json_is_string(json_object_get(ev, "name")) || !json_is_string(json_object_get(ev, "cat")) ||
            !json_is_string(ph) || strcmp(json_string_value(ph), "X") || !json_is_number(ts) || !json_is_number(dur) ||
            json_number_value(ts) < 0 || json_number_value(dur) < 0 || !json_is_integer(json_object_get(ev, "pid")) ||
            !json_is_integer(json_object_get(ev, "tid")))
            well_formed = 0;
        if (!strcmp(json_string_value(json_object_get(ev, "name")), "thread span")) {
            n_thread_spans++;
            char k[32];
            snprintf(k, sizeof k, "%lld", (long long)json_integer_value(json_object_get(ev, "tid")));
            json_object_set_new(tids, k, json_true());
        }
    }
    CHECK(well_formed, "an event lacks name/cat/ph=X/ts/dur/pid/tid");
    CHECK(n_thread_spans == nthreads && (int)json_object_size(tids) == nthreads,
          "%d thread spans with %zu distinct tids from %d threads", n_thread_spans, json_object_size(tids), nthreads);
    json_decref(tids);
    const char *expected[] = {"macro span", "router", "permute", "gate_up GEMM + SwiGLU", "down GEMM", "unpermute",
                              "attention", "bwd unpermute + router", "bwd down GEMM + SwiGLU", "bwd gate_up GEMM",
                              "bwd permute + router wgrad", "bwd attention", "optimizer", "engine prefill forward",
                              "engine decode forward", "engine sample", "attention (KV cache)"};
    for (size_t k = 0; k < sizeof expected / sizeof expected[0]; k++)
        CHECK(has_name(events, expected[k]), "span '%s' missing from the trace", expected[k]);
    json_decref(root);
}

static void test_flops(void) {
    moe_config c = tiny_config();
    /* by hand: V·H = 2048; per layer attention 32·32 + 2·32·16 + 32·32 = 3072; layer 0 MoE
     * router 4·32 + experts 2·3·32·16 = 128 + 3072; layer 1 dense 3·32·48 = 4608 */
    const int64_t want = 2048 + 2 * 3072 + (128 + 3072) + 4608;
    CHECK(model_active_matmul_params(&c) == want, "active matmul params %lld, want %lld",
          (long long)model_active_matmul_params(&c), (long long)want);
    int cu[4] = {0, 3, 3, 7}; /* lengths 3, 0, 4 → 6 + 0 + 10 pairs */
    CHECK(model_attention_pairs(cu, 3) == 16, "attention pairs %lld, want 16", (long long)model_attention_pairs(cu, 3));
    const double f = model_train_flops(&c, 7, 16), fw = 6.0 * want * 7 + 12.0 * 2 * 4 * 8 * 16;
    CHECK(fabs(f - fw) <= 1e-9 * fw, "train flops %.1f, want %.1f", f, fw);
    const double peak = perf_sgemm_peak(0.05, 1), peak2 = perf_sgemm_peak(0.05, 2);
    CHECK(isfinite(peak) && peak > 1e6, "measured sgemm peak %g FLOP/s", peak);
    /* two cores: twice one core's best (separate measurements: within 2× of each other either way) */
    CHECK(peak2 > peak && peak2 < 4 * peak, "2-core peak %g against 1-core %g", peak2, peak);
    printf("measured sgemm peak %.1f GFLOP/s per core\n", peak * 1e-9);
}

int main(void) {
    test_trace();
    test_flops();
    TEST_MAIN_END();
}
