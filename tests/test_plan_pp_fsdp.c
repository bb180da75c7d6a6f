/* moerl plan's pipeline × FSDP rows (src/plan/plan_pp_fsdp.c) by hand, without MPI (tests/test_dist_plan.c
 * checks them byte for byte against runs under mpirun):
 *   - the extrapolation past the replay's cap gives the whole replay's gathers and peak exactly, for plain and
 *     interleaved 1F1B, every stage, resharding and keeping, cold and warm, both bounds;
 *   - the gathers grow by the same amount per period (micro-batch, pp micro-batches interleaved) across the
 *     default cap, forward-only passes and updates alike;
 *   - the stages' shards add up to the whole model's FSDP shard (every unit on exactly one stage);
 *   - reshard_after_forward=false gathers each of the stage's units once per update (the shard's floats ×
 *     (P − 1)), nothing after a logprob pass, and reduce-scatters once; resharding reduce-scatters the shard
 *     per micro-batch; HSDP's replica all-reduce and the norm over the stages have their closed forms;
 *   - plan_pp_fsdp_stage at the fullest stage is plan_compute's rows; the layouts moerl refuses stay refused
 *     (tied embeddings, EP with FSDP, Ulysses) naming the keys. */
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "plan/plan.h"
#include "plan/plan_pp_fsdp.h"
#include "test.h"

#define CK(cond) CHECK(cond, "%s", "")

static moe_config arch(int L, int tie) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 1000; c.hidden_size = 64; c.intermediate_size = 96; c.moe_intermediate_size = 32;
    c.num_hidden_layers = L; c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 16;
    c.num_experts = 8; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1; c.norm_topk_prob = 1;
    c.tie_word_embeddings = tie; c.max_position_embeddings = 1024; c.rms_norm_eps = 1e-6f; c.rope_theta = 1e4f;
    c.initializer_range = 0.02f; c.bos_token_id = -1; c.eos_token_id = -1;
    return c;
}

static plan_input input(int T, int pp, int fsdp, int v, int mb) {
    plan_input in = {.n_trainer = T, .fsdp = fsdp, .ep = 1, .sp = 1, .pp = pp, .vpp = v, .dtype_bytes = 4,
                     .micro_tokens = 64, .micro_batches = mb, .updates_per_step = 1, .fwd_only_passes = 1,
                     .n_rollout = 0, .rollout_tp = 1, .max_num_seqs = 1, .max_model_len = 64, .kv_dtype_bytes = 4,
                     .sync_every = 1, .step_tokens = (int64_t)T / pp * mb * 64};
    return in;
}

/* Extrapolated (small cap) against whole (no cap) replays, exactly: the gathers are sums of integers. */
static void test_extrapolation(void) {
    const moe_config c = arch(12, 0);
    int bad = 0, cases = 0;
    for (int pp = 2; pp <= 3; pp++)
        for (int v = 1; v <= 2; v++)
            for (int stage = 0; stage < pp; stage++)
                for (int mode = 0; mode < 8; mode++) {
                    const int keep = mode & 1, warm = (mode >> 1) & 1, eager = (mode >> 2) & 1, step = v > 1 ? pp : 1;
                    const int cap = 2 * pp * (v + 1);
                    for (int m = cap - step; m <= cap + 4 * step; m += step) {
                        if (m < pp || (v > 1 && m % pp)) continue;
                        double g1, p1, g2, p2;
                        const int ok = plan_pp_fsdp_update(&c, pp, v, stage, 2, eager, keep, warm, 1, m, cap, &g1, &p1) ==
                                           MOERL_OK &&
                                       plan_pp_fsdp_update(&c, pp, v, stage, 2, eager, keep, warm, 1, m, 1 << 20, &g2,
                                                           &p2) == MOERL_OK;
                        cases++;
                        if (!ok || g1 != g2 || p1 != p2) {
                            bad++;
                            printf("pp %d v %d stage %d keep %d warm %d eager %d m %d: extrapolated %.0f / %.0f, "
                                   "replayed %.0f / %.0f\n", pp, v, stage, keep, warm, eager, m, g1, p1, g2, p2);
                        }
                    }
                }
    CHECK(bad == 0 && cases > 100, "%d of %d extrapolated updates differ from the whole replay", bad, cases);
}

/* Across the default cap the gathers grow by the same floats per period. */
static void test_period(void) {
    const moe_config c = arch(12, 0);
    int bad = 0;
    for (int v = 1; v <= 2; v++) {
        const int pp = 2, step = v > 1 ? pp : 1, cap = 4 * pp * (v + 1) + 16;
        double prev = -1, d0 = -1, lp_prev = -1, lp_d0 = -1;
        for (int m = cap - 3 * step; m <= cap + 3 * step; m += step) {
            double g;
            if (plan_pp_fsdp_update(&c, pp, v, 0, 2, 0, 0, 0, 1, m, 0, &g, NULL) != MOERL_OK) bad++;
            const double lp = plan_pp_fsdp_fwd_only(&c, pp, v, 1, 2, 0, m, NULL, NULL);
            if (prev >= 0 && d0 < 0) d0 = g - prev, lp_d0 = lp - lp_prev;
            else if (prev >= 0 && (g - prev != d0 || lp - lp_prev != lp_d0)) bad++;
            prev = g;
            lp_prev = lp;
        }
        CHECK(bad == 0 && d0 > 0 && lp_d0 > 0, "v %d: per period %.0f floats (update), %.0f (forward-only)", v, d0,
              lp_d0);
    }
}

static void test_rows(void) {
    const moe_config c = arch(12, 0);
    /* the stages' shards are the whole model's FSDP shard */
    for (int v = 1; v <= 2; v++) {
        plan_input one = input(2, 1, 2, 1, 4);
        plan_result r1;
        CK(plan_compute(&c, &one, &r1) == MOERL_OK);
        double sum = 0;
        for (int s = 0; s < 3; s++) sum += plan_pp_fsdp_shard(&c, 3, v, s, 2);
        CHECK(sum * 4 == r1.weights, "v %d: stages' shards %.0f B, whole model's %.0f B", v, sum * 4, r1.weights);
    }
    /* keep: each unit gathered once per update, nothing after the logprob pass, one reduce-scatter */
    plan_input in = input(4, 2, 2, 1, 8);
    in.fsdp_keep_gathered = 1;
    for (int s = 0; s < 2; s++) {
        plan_traffic t;
        CK(plan_traffic_rank(&c, &in, s, 0, 0, &t) == MOERL_OK);
        const double S = plan_pp_fsdp_shard(&c, 2, 1, s, 2);
        CHECK(t.fsdp_allgather == S * 4 && t.fsdp_allgather_warm == 0 && t.fsdp_reduce_scatter == S * 4 &&
                  t.replica_allreduce == 0 && t.pp_norm_allreduce == 8 && t.pp_grad_allreduce == 0 && t.reducer == 0,
              "keep, stage %d: all-gather %.0f (warm %.0f), reduce-scatter %.0f, shard %.0f floats", s,
              t.fsdp_allgather, t.fsdp_allgather_warm, t.fsdp_reduce_scatter, S);
    }
    /* resharding over 8 ranks (fsdp 2: 2 HSDP replicas per stage): a reduce-scatter per micro-batch, the
     * replicas' all-reduce of the fp32 shard; more gathers than the keep case */
    in = input(8, 2, 2, 1, 8);
    for (int s = 0; s < 2; s++) {
        plan_traffic t;
        CK(plan_traffic_rank(&c, &in, s, 0, 1, &t) == MOERL_OK);
        const double S = plan_pp_fsdp_shard(&c, 2, 1, s, 2);
        CHECK(t.fsdp_reduce_scatter == S * 4 * 8 && t.replica_allreduce == 2.0 * 1 / 2 * S * 4 &&
                  t.fsdp_allgather > 8 * S * 4 && t.pp_p2p > 0,
              "reshard, stage %d: reduce-scatter %.0f, replicas %.0f, all-gather %.0f (shard %.0f floats)", s,
              t.fsdp_reduce_scatter, t.replica_allreduce, t.fsdp_allgather, S);
    }
    /* the per-stage rows at the fullest stage are plan_compute's */
    in.ref_model = 1;
    in.logprob_passes = 1;
    in.logprob_tokens = in.step_tokens;
    plan_result r, st;
    CK(plan_compute(&c, &in, &r) == MOERL_OK && plan_pp_fsdp_stage(&c, &in, r.fullest_stage, &st) == MOERL_OK);
    CK(st.weights == r.weights && st.gathered == r.gathered && st.gathered_low == r.gathered_low &&
       st.acts == r.acts && st.acts_recompute == r.acts_recompute && st.ref_held == r.ref_held &&
       st.ref_gathered == r.ref_gathered && st.ref_acts == r.ref_acts && st.total == r.total && r.ref_gathered > 0);
    CK(r.gathered_low > 0 && r.gathered_low <= r.gathered && r.allreduce > 0);
    plan_result other;
    CK(plan_pp_fsdp_stage(&c, &in, 1 - r.fullest_stage, &other) == MOERL_OK && other.total <= r.total);
    CK(plan_pp_fsdp_stage(&c, &in, 2, &other) == MOERL_ERR);
}

static void test_refusals(void) {
    moe_config c = arch(12, 1);
    plan_input in = input(4, 2, 2, 1, 8);
    plan_result r;
    CK(plan_compute(&c, &in, &r) == MOERL_ERR && strstr(moerl_last_error(), "tied embeddings") &&
       strstr(moerl_last_error(), "actor.fsdp_config.fsdp_size=2"));
    c.tie_word_embeddings = 0;
    in.ep = 2;
    CK(plan_compute(&c, &in, &r) == MOERL_ERR && strstr(moerl_last_error(), "actor.fsdp_config.fsdp_size (2)"));
    in.ep = 1;
    in.sp = 2;
    CK(plan_compute(&c, &in, &r) == MOERL_ERR && strstr(moerl_last_error(), "ulysses_sequence_parallel_size (2)"));
    in.sp = 1;
    in.vpp = 2; /* interleaved: planned */
    CK(plan_compute(&c, &in, &r) == MOERL_OK && r.vpp == 2 && r.fsdp == 2);
}

int main(void) {
    test_extrapolation();
    test_period();
    test_rows();
    test_refusals();
    TEST_MAIN_END();
}
