/* moerl plan's paged KV cache model (see plan_kv.h). */
#include "plan/plan_kv.h"

#include <math.h>

#include "base/common.h"
#include "rollout/kv_blocks.h"

/* The longest response plan sums the distribution over, term by term (2^24 tokens: a fraction of a
 * second of pow() calls). */
#define PLAN_KV_MAX_RESPONSE (1 << 24)

static int check_input(const plan_kv_input *in) {
    if (in->block_size < 1 || in->block_size > (1 << 20))
        return moerl_errorf("rollout.block_size must be in 1..%d tokens, got %d", 1 << 20, in->block_size);
    if (in->prompt_len < 1 || in->max_response < 1)
        return moerl_errorf("the paged KV model needs a prompt length (data.max_prompt_length, got %d) and a response "
                            "cap (data.max_response_length, got %d) of at least one token",
                            in->prompt_len, in->max_response);
    if (in->max_response > PLAN_KV_MAX_RESPONSE)
        return moerl_errorf("data.max_response_length=%d: the paged KV model sums the length distribution token by "
                            "token up to %d tokens", in->max_response, PLAN_KV_MAX_RESPONSE);
    if (!(in->synth_alpha >= 0) || !isfinite(in->synth_alpha))
        return moerl_errorf("rollout.synthetic_length.alpha must be ≥ 0 and finite, got %g", in->synth_alpha);
    if (in->synth_alpha > 0 && in->synth_min < 1)
        return moerl_errorf("rollout.synthetic_length.min must be ≥ 1, got %d", in->synth_min);
    if (in->synth_alpha == 0 && (in->fixed_response < 1 || in->fixed_response > in->max_response))
        return moerl_errorf("plan.mean_response_length=%d: the response length plan assumes without "
                            "rollout.synthetic_length must be in 1..data.max_response_length (%d)",
                            in->fixed_response, in->max_response);
    if (in->group_size < 1 || in->max_num_seqs < 1)
        return moerl_errorf("rollout.n (%d) and rollout.max_num_seqs (%d) must be ≥ 1", in->group_size,
                            in->max_num_seqs);
    if (!(in->token_bytes > 0) || !(in->budget_bytes >= 0) || !isfinite(in->budget_bytes))
        return moerl_errorf("the KV bytes per token (%g) must be > 0 and the KV budget (%g bytes) ≥ 0",
                            in->token_bytes, in->budget_bytes);
    return MOERL_OK;
}

int plan_kv_expected_blocks(const plan_kv_input *in, double *blocks, double *mean_response, double *p_cap) {
    if (check_input(in) != MOERL_OK) return MOERL_ERR;
    const int64_t P = in->prompt_len, B = in->block_size, cap = in->max_response;
    if (in->synth_alpha == 0) { /* one length for every response */
        const int64_t R = in->fixed_response;
        *blocks = (double)kvb_seq_blocks(P + R, (int)B);
        *mean_response = (double)R;
        *p_cap = R == cap ? 1 : 0;
        return MOERL_OK;
    }
    const double m = in->synth_min, a = in->synth_alpha;
    if (m >= cap - 1) { /* ⌈m · U^(−1/α)⌉ ≥ m > cap − 1: every response reaches the cap */
        *blocks = (double)kvb_seq_blocks(P + cap, (int)B);
        *mean_response = (double)cap;
        *p_cap = 1;
        return MOERL_OK;
    }
    /* P(R = k) = S(k − 1) − S(k) for m < k < cap, S(k) = (m/k)^α; P(R = cap) = S(cap − 1) */
    const int64_t k0 = (int64_t)m;
    double eb = 0, er = 0, s_prev = 1; /* S(m) = 1 */
    for (int64_t k = k0 + 1; k < cap; k++) {
        const double s = pow(m / (double)k, a), p = s_prev - s;
        eb += p * (double)kvb_seq_blocks(P + k, (int)B);
        er += p * (double)k;
        s_prev = s;
    }
    eb += s_prev * (double)kvb_seq_blocks(P + cap, (int)B);
    er += s_prev * (double)cap;
    *blocks = eb;
    *mean_response = er;
    *p_cap = s_prev;
    return MOERL_OK;
}

int plan_kv_compute(const plan_kv_input *in, plan_kv_result *out) {
    plan_kv_result r = {0};
    if (plan_kv_expected_blocks(in, &r.blocks_per_seq, &r.mean_response, &r.p_cap) != MOERL_OK) return MOERL_ERR;
    /* a batch of max_num_seqs holds groups of at most that many sequences sharing a prompt */
    const int B = in->block_size, n = MOERL_MIN(in->group_size, in->max_num_seqs);
    r.mean_tokens = in->prompt_len + r.mean_response;
    r.shared_blocks = in->prefix_caching && n > 1 ? (int)kvb_prefix_blocks(in->prompt_len, B) : 0;
    r.blocks_per_seq_shared = r.blocks_per_seq - r.shared_blocks * (double)(n - 1) / n;
    r.block_bytes = B * in->token_bytes;
    r.reserved_bytes = (double)in->max_num_seqs * in->max_model_len * in->token_bytes;
    r.paged_bytes = in->max_num_seqs * r.blocks_per_seq_shared * r.block_bytes;
    r.budget_bytes = in->budget_bytes > 0 ? in->budget_bytes : r.reserved_bytes;
    r.budget_blocks = (int64_t)floor(r.budget_bytes / r.block_bytes);
    const int64_t need = kvb_seq_blocks(in->max_model_len, B); /* the engine's engine_add count */
    if (r.budget_blocks < need) /* as the engine refuses a request that cannot fit alone */
        return moerl_errorf("the KV budget of %.4g bytes per rollout device holds %lld blocks of %d tokens (%.4g bytes "
                            "each), fewer than one sequence at full length needs (%d tokens = %lld blocks): raise "
                            "rollout.kv_cache_bytes / rollout.gpu_memory_utilization or lower data.max_response_length",
                            r.budget_bytes, (long long)r.budget_blocks, B, r.block_bytes, in->max_model_len,
                            (long long)need);
    r.seqs_reserved = floor(r.budget_bytes / ((double)in->max_model_len * in->token_bytes));
    r.seqs_paged = (double)r.budget_blocks / r.blocks_per_seq_shared;
    r.waste_reserved = 1 - r.mean_tokens / in->max_model_len;
    r.waste_paged = 1 - (r.mean_tokens - 1) / (B * r.blocks_per_seq); /* K/V rows written: all but the last token */
    *out = r;
    return MOERL_OK;
}
