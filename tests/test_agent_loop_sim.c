/* The agent loop's simulation mode (rl/agent_loop.h, used by moerl simulate): its refusals, the
 * drawn scripts against the laws they follow (turns: 1 + geometric; turn lengths: Pareto; latencies:
 * log-normal; each checked within 4 standard errors of its sample), the assistant-turn cap, and
 * trajectories driven through the simulated engine on a test clock: turns − 1 calls, each answered at
 * exactly send + latency with tool_response_tokens inserted ids (mask 0), the timeout. */
#include <math.h>
#include <stdlib.h>

#include "base/common.h"
#include "rl/agent_loop.h"
#include "sim/sim_config.h"
#include "test.h"

static double g_now;
static double test_clock(void *ctx) { return *(double *)ctx; }

#define EOS 258
static agent_sim_config base_sc(void) {
    return (agent_sim_config){.turns_mean = 3, .latency_median_s = 2, .latency_sigma = 0.5, .response_tokens = 5,
                              .synth_alpha = 3, .synth_min = 8, .eos_id = EOS, .filler_id = 0};
}
static multi_turn_config base_mt(int max_turns, double timeout_s) {
    multi_turn_config m = {.enable = 1, .max_assistant_turns = max_turns, .max_tool_response_length = 256};
    m.env.timeout_s = timeout_s;
    return m;
}

static void refused(agent_sim_config s, const char *want) {
    const multi_turn_config m = base_mt(0, 30);
    agent_loop *A = agent_loop_create_sim(&m, &s, test_clock, &g_now);
    CHECK(!A && strstr(moerl_last_error(), want), "want '%s', got %s", want, A ? "a loop" : moerl_last_error());
    agent_loop_free(A);
}

static void test_refusals(void) {
    agent_sim_config s = base_sc();
    s.turns_mean = 0.5;
    refused(s, "turns_mean must be in [1, 1e6], got 0.5");
    s = base_sc();
    s.latency_median_s = 0;
    refused(s, "latency_median_s must be finite and > 0");
    s = base_sc();
    s.latency_sigma = -1;
    refused(s, "latency_sigma must be in [0, 20]");
    s = base_sc();
    s.filler_id = EOS;
    refused(s, "distinct");
    s = base_sc();
    s.synth_alpha = 0;
    refused(s, "synth_alpha 0 (> 0)");
    const multi_turn_config m = base_mt(0, 30);
    s = base_sc();
    CHECK(!agent_loop_create_sim(&m, &s, NULL, NULL) && strstr(moerl_last_error(), "a clock"), "no clock refused");
}

/* The script of r: its turns (eos count) and the lengths of its turns (into len[], at most cap). */
static int script_turns(const gen_request *r, int *len, int cap) {
    int k = 0, l = 0;
    for (int i = 0; i < r->sp.n_forced; i++) {
        l++;
        if (r->sp.forced[i] == EOS) {
            if (k < cap) len[k] = l;
            k++;
            l = 0;
        }
    }
    return k;
}

static void test_script_laws(void) {
    const multi_turn_config m = base_mt(0, 30);
    const agent_sim_config s = base_sc();
    agent_loop *A = agent_loop_create_sim(&m, &s, test_clock, &g_now);
    CHECK(A != NULL, "create: %s", moerl_last_error());
    if (!A) return;
    gen_request r;
    memset(&r, 0, sizeof r);
    const int N = 100000;
    double sum = 0;
    long ones = 0, turns_total = 0, over16 = 0, over32 = 0, short_turns = 0, last_filler = 0, failed = 0;
    int len[64];
    for (int i = 0; i < N; i++) {
        r.sp.seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1);
        failed += agent_loop_sim_script(A, &r, 1 << 20) != MOERL_OK;
        const int T = script_turns(&r, len, 64);
        sum += T;
        ones += T == 1;
        for (int k = 0; k < T && k < 64; k++) {
            turns_total++;
            over16 += len[k] > 16;
            over32 += len[k] > 32;
            short_turns += len[k] < 8;
        }
        last_filler += r.sp.n_forced > 0 && r.sp.forced[r.sp.n_forced - 1] != EOS;
    }
    /* 1 + Geometric(p = 1/mu) on {0, 1, ...}: mean mu, variance mu (mu − 1), P(T = 1) = 1/mu */
    const double mu = 3, mean = sum / N, se = sqrt(mu * (mu - 1) / N);
    CHECK(fabs(mean - mu) <= 4 * se, "turns mean %.4f, want %g ± %.4f", mean, mu, 4 * se);
    const double p1 = (double)ones / N, se1 = sqrt((1 / mu) * (1 - 1 / mu) / N);
    CHECK(fabs(p1 - 1 / mu) <= 4 * se1, "P(T=1) %.4f, want %.4f ± %.4f", p1, 1 / mu, 4 * se1);
    /* turn length ceil(min · U^(−1/alpha)) ≥ min, P(len > L) = (min / L)^alpha for L ≥ min */
    const double q16 = pow(8.0 / 16, 3), q32 = pow(8.0 / 32, 3);
    const double f16 = (double)over16 / turns_total, f32 = (double)over32 / turns_total;
    CHECK(fabs(f16 - q16) <= 4 * sqrt(q16 * (1 - q16) / turns_total), "P(len>16) %.5f want %.5f", f16, q16);
    CHECK(fabs(f32 - q32) <= 4 * sqrt(q32 * (1 - q32) / turns_total), "P(len>32) %.5f want %.5f", f32, q32);
    CHECK(failed == 0 && short_turns == 0 && last_filler == 0, "turns shorter than min: %ld; scripts not ending at eos: %ld",
          short_turns, last_filler);
    CHECK(r.sp.max_tokens == 1 << 20 && r.sp.ignore_eos == 0, "sampling parameters set");
    /* the same seed, the same script */
    r.sp.seed = 12345;
    agent_loop_sim_script(A, &r, 1 << 20);
    int *a = xmalloc((size_t)r.sp.n_forced * sizeof(int));
    const int na = r.sp.n_forced;
    memcpy(a, r.sp.forced, (size_t)na * sizeof(int));
    r.sp.seed = 99;
    agent_loop_sim_script(A, &r, 1 << 20);
    r.sp.seed = 12345;
    agent_loop_sim_script(A, &r, 1 << 20);
    CHECK(r.sp.n_forced == na && !memcmp(a, r.sp.forced, (size_t)na * sizeof(int)), "deterministic script");
    free(a);
    /* a budget smaller than the script: cut at max_tokens */
    agent_loop_sim_script(A, &r, 10);
    CHECK(r.sp.n_forced <= 10 && r.sp.max_tokens == 10, "script within max_tokens: %d", r.sp.n_forced);
    CHECK(agent_loop_sim_script(A, &r, 0) == MOERL_ERR, "max_tokens 0 refused");
    agent_loop_free(A);
    /* the cap: at most max_assistant_turns scripted */
    const multi_turn_config m2 = base_mt(2, 30);
    A = agent_loop_create_sim(&m2, &s, test_clock, &g_now);
    int most = 0;
    for (int i = 0; i < 2000; i++) {
        r.sp.seed = (uint64_t)i * 7919 + 1;
        agent_loop_sim_script(A, &r, 1 << 20);
        most = MOERL_MAX(most, script_turns(&r, len, 64));
    }
    CHECK(most == 2, "max_assistant_turns 2: at most %d turns scripted", most);
    agent_loop_free(A);
}

/* Drive trajectories (one at a time) through the simulated engine: *waits = Σ answer − send. */
typedef struct {
    long trajs, calls, turns, bad_shape;
    double lat_sum, lat_max, wait;
} run_totals;

static void drive(engine *e, agent_loop *A, int *prompt, uint64_t seed, int tok, run_totals *tot) {
    gen_request r;
    memset(&r, 0, sizeof r);
    r.id = (int64_t)seed;
    r.prompt = prompt;
    r.prompt_len = 3;
    r.sp.temperature = 1;
    r.sp.top_p = 1;
    r.sp.seed = seed;
    MOERL_ASSERT(agent_loop_sim_script(A, &r, 4000) == MOERL_OK);
    int len[256];
    const int T = script_turns(&r, len, 256);
    MOERL_ASSERT(engine_add(e, &r) == MOERL_OK);
    agent_traj t;
    memset(&t, 0, sizeof t);
    ds_row row = {.line = 1};
    gen_request *done[8];
    int ended = 0;
    for (int guard = 0; guard < 100000 && !ended; guard++) {
        if (engine_num_unfinished(e) == 0) { /* only waiting: jump the clock to the answer */
            MOERL_ASSERT(agent_loop_waiting(A) == 1);
            g_now = agent_loop_sim_next_answer(A);
            const int k = agent_loop_poll(A, e, done, 8, 0);
            MOERL_ASSERT(k >= 0);
            ended = k == 1;
            continue;
        }
        const int k = engine_step(e, done, 8);
        MOERL_ASSERT(k >= 0);
        for (int i = 0; i < k; i++) ended = agent_loop_turn_end(A, e, done[i], &t, &row, "x") == 1;
        g_now += 0.001; /* each step takes a millisecond of the test's clock */
    }
    /* shape: turns − 1 runs of exactly tok inserted ids, each after an eos */
    int runs = 0, k = 0, good = 1;
    for (int i = 0; i <= r.n_out; i++) {
        if (i < r.n_out && r.out_mask[i] == 0) {
            if (k == 0 && (i == 0 || r.out_tokens[i - 1] != EOS)) good = 0;
            k++;
        } else if (k) {
            good &= k == tok;
            runs++;
            k = 0;
        }
    }
    tot->bad_shape += !(good && runs == T - 1 && t.turns == T && t.tool_calls == T - 1 && r.finish == FINISH_STOP);
    tot->trajs++;
    tot->calls += t.tool_calls;
    tot->turns += t.turns;
    gen_request_free_outputs(&r);
}

static void test_trajectories(void) {
    moe_model m;
    MOERL_ASSERT(sim_tiny_model(&m, 1 << 16) == MOERL_OK);
    engine_config ec = {.max_num_seqs = 4, .max_model_len = 1 << 16, .max_num_batched_tokens = 512, .simulated = 1};
    engine *e = engine_create(&m.cfg, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m.params, m.n_params, 0) == MOERL_OK);
    int prompt[3] = {1, 2, 3};
    agent_sim_config s = base_sc();
    s.eos_id = m.cfg.eos_token_id;
    const multi_turn_config mt = base_mt(0, 1000);
    agent_loop *A = agent_loop_create_sim(&mt, &s, test_clock, &g_now);
    run_totals tot = {0};
    for (uint64_t i = 1; i <= 2000; i++) drive(e, A, prompt, i * 1000003ULL, s.response_tokens, &tot);
    agent_stats st;
    agent_loop_take_stats(A, &st);
    CHECK(tot.bad_shape == 0, "%ld trajectories with a wrong shape", tot.bad_shape);
    CHECK(st.trajectories == tot.trajs && st.turns_sum == tot.turns && st.tool_calls == tot.calls &&
              st.answered == tot.calls && st.tool_errors == 0,
          "stats: %ld trajectories %ld turns %ld calls %ld answered", st.trajectories, st.turns_sum, st.tool_calls,
          st.answered);
    /* the clock jumps to each answer: every wait is exactly its latency */
    CHECK(fabs(st.tool_wait_s - st.tool_latency_sum_s) < 1e-6 * st.tool_wait_s, "wait %.6f vs latencies %.6f",
          st.tool_wait_s, st.tool_latency_sum_s);
    /* log-normal(ln 2, 0.5): mean 2·exp(0.125), sd mean·sqrt(exp(0.25) − 1) */
    const double ref = 2 * exp(0.125), sd = ref * sqrt(exp(0.25) - 1), mean = st.tool_latency_sum_s / (double)st.answered;
    CHECK(fabs(mean - ref) <= 4 * sd / sqrt((double)st.answered), "latency mean %.4f want %.4f ± %.4f (%ld calls)",
          mean, ref, 4 * sd / sqrt((double)st.answered), st.answered);
    agent_loop_free(A);
    /* a timeout below every latency (σ = 0, median 2): each call answered at the timeout as an error */
    s.latency_sigma = 0;
    const multi_turn_config mt2 = base_mt(0, 0.5);
    A = agent_loop_create_sim(&mt2, &s, test_clock, &g_now);
    memset(&tot, 0, sizeof tot);
    for (uint64_t i = 1; i <= 30; i++) drive(e, A, prompt, i * 7777ULL, s.response_tokens, &tot);
    agent_loop_take_stats(A, &st);
    CHECK(tot.bad_shape == 0 && st.tool_timeouts == tot.calls && st.tool_errors == tot.calls && tot.calls > 0 &&
              st.tool_latency_max_s == 0.5 && fabs(st.tool_wait_s - 0.5 * (double)tot.calls) < 1e-6,
          "timeouts %ld errors %ld of %ld calls, max latency %g, wait %g", st.tool_timeouts, st.tool_errors, tot.calls,
          st.tool_latency_max_s, st.tool_wait_s);
    agent_loop_free(A);
    engine_free(e);
    model_free(&m);
}

int main(void) {
    test_refusals();
    test_script_laws();
    test_trajectories();
    TEST_MAIN_END();
}
