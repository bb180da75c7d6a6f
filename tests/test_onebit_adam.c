/* 1-bit Adam (src/optim/onebit_adam.h) and its two-stage compressed all-reduce (src/dist/onebit.h)
 * against tests/ref/gen_onebit_adam.py (a PyTorch implementation of Tang et al. 2021's update): one
 * worker and 2, 3, 4 simulated workers, steps before and after freeze_step, each step started from
 * the reference's state.
 * Tolerances: after the freeze, 0 — every float32 operation is one rounding in the same order on both
 * sides (these files are built without fused multiply-add; the norms are float64 sums rounded once to
 * float32, which agree unless a sum lands within 1e-16 of a float32 rounding boundary). Warm-up steps
 * run adamw_step_ranges, built with the project's flags (fused multiply-add allowed): rtol 1e-6 on
 * p, m, v (a few float32 roundings of a handful of operations) and atol 1e-9 (v near 0).
 * Also: the communicated volume per exchange (1 bit per value + one fp32 scale per message),
 * every worker ending with the same momentum, malformed messages refused with the rank named,
 * optim_name_parse. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist/onebit.h"
#include "model/safetensors.h"
#include "optim/onebit_adam.h"
#include "rl/trainer_onebit.h"
#include "test.h"

#define N 1000
#define STEPS 7
#define FREEZE 3

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static const st_tensor *need(const st_file *f, const char *k, const char *sfx, int64_t numel) {
    char nm[96];
    snprintf(nm, sizeof nm, "%s%s", k, sfx);
    const st_tensor *t = st_find(f, nm);
    if (!t || t->numel != numel) {
        CHECK(0, "reference tensor %s missing or of %lld values (expected %lld)", nm, t ? (long long)t->numel : -1LL,
              (long long)numel);
        return NULL;
    }
    return t;
}

static adamw_config ref_cfg(void) {
    return (adamw_config){.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.01f,
                          .max_grad_norm = 1.0f};
}

static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

/* The segmented case sw* of the reference (gen_onebit_adam.py SEG_BOUNDS, ZERO): tensor bounds,
 * and the values with no gradient through the warm-up, 10 decayed ([100, 110)), 30 not ([520, 550)). */
static const size_t seg_bounds[5] = {0, 250, 260, 600, 1000};

/* Per-tensor scales and the zero-variance mask as the trainer sets them (trainer_onebit.c): one
 * segment per tensor, active = frozen variance ≠ 0. */
static void seg_init(onebit_exchange *x, int W, int w, const float *v) {
    onebit_exchange_init_segments(x, N, W, w, seg_bounds, 4);
    uint8_t act[N];
    for (int i = 0; i < N; i++) act[i] = v[i] != 0.0f;
    onebit_exchange_set_active(x, act);
}

/* What the segmented case must show beyond equality with the reference: values with no warm-up
 * gradient have momentum 0, do not move where undecayed and only decay where decayed (p·(1 − lr·wd)),
 * and take no error feedback; the ×1e-3 tensor [250, 260) gets its own small scale, not the others'. */
static void seg_checks(const char *k, int W, const onebit_exchange *x, const float *m, const float *p1,
                       const float *p0) {
    const float decay = 1.0f - 1e-2f * ref_cfg().weight_decay;
    int zero_ok = 1;
    for (int i = 100; i < 110; i++) zero_ok &= m[i] == 0.0f && p1[i] == p0[i] * decay;
    for (int i = 520; i < 550; i++) zero_ok &= m[i] == 0.0f && p1[i] == p0[i];
    for (int w = 0; w < W; w++) {
        for (int i = 520; i < 550; i++) zero_ok &= x[w].worker_err[i] == 0.0f;
        CHECK(x[w].n_masked == 40, "%s: worker %d masks %zu values (expected the 40 with no warm-up gradient)", k, w,
              x[w].n_masked);
    }
    CHECK(zero_ok, "%s: values with no warm-up gradient keep momentum 0, only decay, no error feedback", k);
    double big = 0, small = 0;
    for (int i = 0; i < 250; i++) big += (double)m[i] * m[i];
    for (int i = 250; i < 260; i++) small = fmax(small, fabs(m[i]));
    big = sqrt(big / 250);
    CHECK(small > 0 && small < 0.01 * big, "%s: the ×1e-3 tensor's momentum %g is its own (the ×1 tensor's RMS %g)", k,
          small, big);
}

/* One compressed step of W simulated workers from the reference's state (prefix k); seg: the
 * segmented, masked exchange. */
static void frozen_step(const st_file *f, const char *k, int W, int t, int seg) {
    const size_t c = onebit_chunk(N, W);
    const st_tensor *p = need(f, k, "p", N), *m = need(f, k, "m", N), *v = need(f, k, "v", N),
                    *we = need(f, k, "we", (int64_t)W * N), *se = need(f, k, "se", (int64_t)W * c),
                    *g = need(f, k, "g", (int64_t)W * N), *nrm = need(f, k, "norm", W), *p1 = need(f, k, "p1", N),
                    *m1 = need(f, k, "m1", N), *we1 = need(f, k, "we1", (int64_t)W * N),
                    *se1 = need(f, k, "se1", (int64_t)W * c);
    if (!p || !m || !v || !we || !se || !g || !nrm || !p1 || !m1 || !we1 || !se1) return;
    adamw_state o[4];
    onebit_exchange x[4];
    float *pw[4];
    for (int w = 0; w < W; w++) {
        if (seg) seg_init(&x[w], W, w, v->data);
        else onebit_exchange_init(&x[w], N, W, w);
    }
    const size_t words = onebit_exchange_words(&x[0]);
    int32_t *send = xmalloc((size_t)W * W * words * 4), *recv = xmalloc((size_t)W * words * 4),
            *gath = xmalloc((size_t)W * words * 4);
    adamw_range r[2] = {{0, N / 2, 1}, {N / 2, N - N / 2, 0}};
    for (int w = 0; w < W; w++) {
        adamw_init_shard(&o[w], N, ref_cfg());
        memcpy(o[w].m, m->data, N * 4);
        memcpy(o[w].v, v->data, N * 4);
        o[w].step = t - 1;
        CHECK(onebit_adam_frozen(&o[w], FREEZE), "step %d follows the freeze", t);
        memcpy(x[w].worker_err, (const float *)we->data + (size_t)w * N, N * 4);
        memcpy(x[w].server_err, (const float *)se->data + (size_t)w * c, c * 4);
        CHECK(onebit_adam_local(&o[w], (const float *)g->data + (size_t)w * N, 0.0f, ((const double *)nrm->data)[w]) == 1,
              "step applied");
        if (seg) onebit_adam_to_update(&o[w], FREEZE, o[w].m); /* the trainer's exchange: in the update's units */
        onebit_worker_compress(&x[w], o[w].m, send + (size_t)w * W * words);
    }
    for (int r_ = 0; r_ < W; r_++) { /* all-to-all: message r_ of every worker to server r_ */
        for (int i = 0; i < W; i++) memcpy(recv + (size_t)i * words, send + ((size_t)i * W + r_) * words, words * 4);
        CHECK(onebit_server_reduce(&x[r_], recv, gath + (size_t)r_ * words) == MOERL_OK, "%s", moerl_last_error());
    }
    int all_same = 1;
    for (int w = 0; w < W; w++) {
        CHECK(onebit_decode(&x[w], gath, o[w].m) == MOERL_OK, "%s", moerl_last_error());
        if (seg) onebit_adam_from_update(&o[w], FREEZE, o[w].m);
        pw[w] = xmalloc(N * 4);
        memcpy(pw[w], p->data, N * 4);
        onebit_adam_apply(&o[w], FREEZE, pw[w], r, 2, 1e-2f);
        all_same &= same(pw[w], pw[0], N) && same(o[w].m, o[0].m, N);
        CHECK(same(x[w].worker_err, (const float *)we1->data + (size_t)w * N, N), "%sworker %d: worker error", k, w);
        CHECK(same(x[w].server_err, (const float *)se1->data + (size_t)w * c, c), "%sworker %d: server error", k, w);
    }
    CHECK(all_same, "%s: every worker ends with the same momentum and parameters", k);
    CHECK(same(o[0].m, m1->data, N), "%s: the averaged momentum equals the reference bit for bit", k);
    CHECK(same(pw[0], p1->data, N), "%s: the parameters equal the reference bit for bit", k);
    if (!same(pw[0], p1->data, N)) t_close(k, pw[0], p1->data, N, 0, 1e-6f);
    CHECK(same(o[0].v, v->data, N), "%s: the variance stays frozen", k);
    if (seg) seg_checks(k, W, x, o[0].m, pw[0], p->data);
    for (int w = 0; w < W; w++) {
        adamw_free(&o[w]);
        onebit_exchange_free(&x[w]);
        free(pw[w]);
    }
    free(send);
    free(recv);
    free(gath);
}

/* A warm-up step: exact AdamW (adamw_step_ranges) on the averaged gradient. */
static void warmup_step(const st_file *f, const char *k, int W, int t) {
    const st_tensor *p = need(f, k, "p", N), *m = need(f, k, "m", N), *v = need(f, k, "v", N),
                    *ga = need(f, k, "gavg", N), *nrm = need(f, k, "norm", W), *p1 = need(f, k, "p1", N),
                    *m1 = need(f, k, "m1", N), *v1 = need(f, k, "v1", N), *we1 = need(f, k, "we1", (int64_t)W * N);
    if (!p || !m || !v || !ga || !nrm || !p1 || !m1 || !v1 || !we1) return;
    adamw_state o;
    adamw_init_shard(&o, N, ref_cfg());
    memcpy(o.m, m->data, N * 4);
    memcpy(o.v, v->data, N * 4);
    o.step = t - 1;
    CHECK(!onebit_adam_frozen(&o, FREEZE), "step %d is a warm-up step", t);
    float *pp = xmalloc(N * 4);
    memcpy(pp, p->data, N * 4);
    adamw_range r[2] = {{0, N / 2, 1}, {N / 2, N - N / 2, 0}};
    CHECK(adamw_step_ranges(&o, pp, ga->data, r, 2, 1e-2f, 0.0f, ((const double *)nrm->data)[0]) == 1, "applied");
    char what[128];
    snprintf(what, sizeof what, "%sp (warm-up)", k);
    t_close(what, pp, p1->data, N, 1e-9f, 1e-6f);
    snprintf(what, sizeof what, "%sm (warm-up)", k);
    t_close(what, o.m, m1->data, N, 1e-9f, 1e-6f);
    snprintf(what, sizeof what, "%sv (warm-up)", k);
    t_close(what, o.v, v1->data, N, 1e-9f, 1e-6f);
    float *z = xcalloc((size_t)W * N, 4);
    CHECK(same(we1->data, z, (size_t)W * N), "%s: no error feedback during warm-up", k);
    free(z);
    free(pp);
    adamw_free(&o);
}

static void test_reference(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/onebit_adam.safetensors", testdata());
    st_file f;
    if (st_open(&f, path) != MOERL_OK) {
        CHECK(0, "cannot open reference %s (run tests/ref/gen_onebit_adam.py %s): %s", path, testdata(),
              moerl_last_error());
        return;
    }
    for (int W = 1; W <= 4; W++) {
        for (int t = 1; t <= STEPS; t++) {
            char k[32];
            snprintf(k, sizeof k, "w%d.s%d.", W, t);
            if (t <= FREEZE) warmup_step(&f, k, W, t);
            else frozen_step(&f, k, W, t, 0);
        }
        char k[32];
        snprintf(k, sizeof k, "w%d.", W);
        const st_tensor *sent = need(&f, k, "sent", 1);
        if (sent) /* the volume: the reference counts (1 + c/32) words per message, 2·(W−1) messages */
            CHECK(onebit_sent_bytes(N, W) == (double)((const int64_t *)sent->data)[0], "W=%d: %g bytes sent, reference %lld",
                  W, onebit_sent_bytes(N, W), (long long)((const int64_t *)sent->data)[0]);
    }
    for (int W = 1; W <= 3; W++) { /* per-tensor scales and the zero-variance mask */
        for (int t = 1; t <= STEPS; t++) {
            char k[32];
            snprintf(k, sizeof k, "sw%d.s%d.", W, t);
            if (t <= FREEZE) warmup_step(&f, k, W, t);
            else frozen_step(&f, k, W, t, 1);
        }
        char k[32];
        snprintf(k, sizeof k, "sw%d.", W);
        const st_tensor *sent = need(&f, k, "sent", 1);
        onebit_exchange x;
        onebit_exchange_init_segments(&x, N, W, 0, seg_bounds, 4);
        if (sent) /* the reference counts (P + c/32) words per message: P scales, one per piece */
            CHECK(onebit_exchange_bytes(&x) == (double)((const int64_t *)sent->data)[0],
                  "segmented W=%d: %g bytes sent (%d scales per message), reference %lld", W, onebit_exchange_bytes(&x),
                  x.pieces, (long long)((const int64_t *)sent->data)[0]);
        onebit_exchange_free(&x);
    }
    st_close(&f);
}

/* Per-tensor scales on their own: two segments whose values differ by 1000× each decode to their own
 * magnitude (with one scale for the buffer both would get its mean |v|, ≈ 0.5); a masked value decodes to
 * 0 and counts in no scale. */
static void test_segment_scales(void) {
    enum { M = 200 };
    float v[M];
    for (int i = 0; i < M; i++) v[i] = (i % 3 ? 1.0f : -1.0f) * (i < 100 ? 1.0f : 1e-3f);
    const size_t b[3] = {0, 100, M};
    onebit_exchange x;
    onebit_exchange_init_segments(&x, M, 1, 0, b, 2);
    uint8_t act[M];
    for (int i = 0; i < M; i++) act[i] = i != 150;
    onebit_exchange_set_active(&x, act);
    float in[M];
    memcpy(in, v, sizeof v);
    in[150] = 1e6f; /* masked: must not leak into the tensor's scale */
    CHECK(onebit_allreduce_comm(&x, NULL, in) == MOERL_OK, "%s", moerl_last_error());
    int ok = 1;
    for (int i = 0; i < M; i++) ok &= i == 150 ? in[i] == 0.0f : fabsf(in[i] - v[i]) <= 1e-6f * fabsf(v[i]);
    CHECK(ok, "each segment decodes to its own scale (in[0] %g, in[120] %g), the masked value to 0 (%g)", in[0],
          in[120], in[150]);
    CHECK(x.pieces == 2 && x.n_masked == 1 && onebit_exchange_words(&x) == 2 + x.chunk / 32, "2 scales per message");
    onebit_exchange_free(&x);
    onebit_exchange y;
    onebit_exchange_init(&y, M, 1, 0);
    memcpy(in, v, sizeof v);
    CHECK(onebit_allreduce_comm(&y, NULL, in) == MOERL_OK && fabsf(in[120]) > 0.5f,
          "one scale for the buffer gives the small tensor the large one's magnitude (%g)", in[120]);
    onebit_exchange_free(&y);
}

/* The volume: one bit per value plus one fp32 scale per message, against fp32's 32 bits. */
static void test_volume(void) {
    const size_t n = 1u << 20;
    for (int W = 2; W <= 8; W *= 2) {
        const size_t c = onebit_chunk(n, W);
        CHECK(c * (size_t)W >= n && c % 32 == 0 && c < n / W + 32, "W=%d: chunk %zu covers n=%zu", W, c, n);
        const double sent = onebit_sent_bytes(n, W), bits_per_value = 8.0 * (sent - 2.0 * (W - 1) * 4) /
                                                                      (2.0 * (W - 1) * (double)c);
        CHECK(bits_per_value == 1.0, "W=%d: %g bits per value besides the scales", W, bits_per_value);
        const double ring = 2.0 * (W - 1) / W * 4.0 * (double)n; /* fp32 ring all-reduce, bytes per rank */
        CHECK(ring / sent > 31.9 && ring / sent <= 32.0, "W=%d: %.3f× less than fp32's all-reduce", W, ring / sent);
    }
    CHECK(onebit_sent_bytes(1000, 1) == 0, "a group of one sends nothing");
    CHECK(onebit_chunk(0, 3) == 32 && onebit_chunk(33, 1) == 64 && onebit_msg_words(64) == 3, "chunk sizes");
}

/* A message whose scale is not finite (a non-finite momentum on the sender, or corruption) is refused
 * with the sending rank named; error feedback with a zero momentum keeps everything at 0. */
static void test_errors(void) {
    onebit_exchange x;
    onebit_exchange_init(&x, 100, 2, 1);
    const size_t w = onebit_msg_words(x.chunk);
    int32_t *msgs = xcalloc(2 * w, 4), out[8];
    const float bad = NAN;
    memcpy(&msgs[w], &bad, 4);
    CHECK(onebit_server_reduce(&x, msgs, out) == MOERL_ERR && strstr(moerl_last_error(), "rank 1"),
          "NaN scale refused: %s", moerl_last_error());
    const float neg = -1.0f;
    memcpy(&msgs[w], &neg, 4);
    float v[100];
    CHECK(onebit_decode(&x, msgs, v) == MOERL_ERR && strstr(moerl_last_error(), "rank 1"), "negative scale refused: %s",
          moerl_last_error());
    onebit_exchange_free(&x);
    free(msgs);
    optim_name o;
    CHECK(optim_name_parse("onebit_adam", &o) == MOERL_OK && o == OPTIM_ONEBIT_ADAM, "onebit_adam");
    CHECK(optim_name_parse("adamw", &o) == MOERL_OK && o == OPTIM_ADAMW, "adamw");
    CHECK(optim_name_parse("adam1bit", &o) == MOERL_ERR && strstr(moerl_last_error(), "actor.optim.name") &&
              strstr(moerl_last_error(), "onebit_adam"),
          "unknown name refused: %s", moerl_last_error());
    /* the skip rule: a non-finite norm or loss changes nothing and counts the step as skipped */
    adamw_state s;
    adamw_init_shard(&s, 4, ref_cfg());
    const float g[4] = {1, 2, 3, 4};
    CHECK(onebit_adam_local(&s, g, NAN, 1.0) == 0 && onebit_adam_local(&s, g, 0.0f, INFINITY) == 0 && s.step == 0 &&
              s.skipped == 2 && s.m[0] == 0.0f,
          "non-finite loss / norm skipped");
    adamw_free(&s);
}

/* actor.optim.var_update_interval: the step whose variance the compressed steps use (the freeze, then
 * every interval-th step after it, each an exact AdamW step). */
static void test_var_step(void) {
    const int64_t F = 10;
    for (int64_t t = 0; t <= 40; t++)
        CHECK(trainer_onebit_var_step(t, F, 0) == F, "interval 0 (as published): the freeze step at step %lld", (long long)t);
    const int64_t want[][2] = {{5, 10}, {10, 10}, {11, 10}, {19, 10}, {20, 20}, {21, 20}, {29, 20}, {30, 30}, {35, 30}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(trainer_onebit_var_step(want[i][0], F, 10) == want[i][1], "interval 10: after step %lld the variance of "
              "step %lld (got %lld)", (long long)want[i][0], (long long)want[i][1],
              (long long)trainer_onebit_var_step(want[i][0], F, 10));
    CHECK(trainer_onebit_var_step(13, 4, 3) == 13 && trainer_onebit_var_step(12, 4, 3) == 10 &&
              trainer_onebit_var_step(7, 4, 1) == 7,
          "interval 3 from freeze 4: steps 7, 10, 13 update the variance; interval 1: every step");
}

int main(void) {
    test_var_step();
    test_reference();
    test_segment_scales();
    test_volume();
    test_errors();
    TEST_MAIN_END();
}
