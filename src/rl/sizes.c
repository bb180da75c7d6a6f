/* The update's sizes checked against the data before any work (moerl rl before the SFT warm start,
 * moerl simulate before its run): one sequence against the micro-batch token limit, and the
 * pipeline's micro-batch count rule against the worst update a pipeline can get. See rl.h. */
#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "base/common.h"
#include "data/tokenizer.h"
#include "parallel/pipeline.h"
#include "rl/rl.h"

void rl_prompt_lengths(const dataset *train, int *shortest, int *longest) {
    int lo = INT_MAX, hi = 0;
    for (int64_t i = 0; i < dataset_count(train); i++) {
        tok_seq s = {0};
        const ds_row *r = dataset_row(train, i);
        tok_chat_encode(r->prompt, r->n_prompt, true, &s);
        lo = MOERL_MIN(lo, (int)s.n);
        hi = MOERL_MAX(hi, (int)s.n);
        tok_seq_free(&s);
    }
    if (shortest) *shortest = hi > 0 ? lo : 0;
    if (longest) *longest = hi;
}

void rl_shard_groups(int G, int D, int64_t cmin, int64_t cmax, int *k_lo, int *k_hi) {
    if (D <= 1 || G <= 0 || cmax <= 0) {
        *k_lo = *k_hi = MOERL_MAX(G, 0);
        return;
    }
    /* a shard's load is ≥ (total − (D − 1)·cmax) / D, and ≤ (total + (D − 1)·cmax) / D */
    const double lo_load = ((double)G * (double)cmin - (double)(D - 1) * (double)cmax) / D;
    const double hi_load = ((double)G * (double)cmax + (double)(D - 1) * (double)cmax) / D;
    int lo = lo_load > 0 ? (int)MOERL_MIN((double)G, ceil(lo_load / (double)cmax)) : 0;
    int hi = cmin > 0 ? (int)MOERL_MIN((double)G, floor(hi_load / (double)cmin)) : G;
    hi = MOERL_MIN(hi, G - (D - 1) * lo);
    *k_lo = lo;
    *k_hi = MOERL_MAX(hi, lo);
}

/* The first per-pipeline group count k in [k_lo, k_hi] (k ≥ 1) whose k·g sequences of up to L tokens
 * the pipeline cannot schedule, or 0 when every one can (pp_count_allowed). */
static int first_bad_groups(int k_lo, int k_hi, int g, int L, int max_tokens, int pp, int v) {
    for (int k = MOERL_MAX(k_lo, 1); k <= k_hi; k++)
        if ((int64_t)k * g > INT_MAX || !pp_count_allowed(k * g, L, max_tokens, pp, v)) return k;
    return 0;
}

int rl_check_update_sizes(const rl_config *r, const dataset *train, int pipeline) {
    int shortest, longest;
    rl_prompt_lengths(train, &shortest, &longest);
    const char *file = train->path ? train->path : "the training data";
    const int64_t L64 = (int64_t)longest + r->max_response_length;
    if (L64 > r->ppo_max_token_len)
        return moerl_errorf("actor.ppo_max_token_len_per_gpu=%d is below one sequence: the longest prompt of %s "
                            "(%d tokens) + data.max_response_length=%d = %lld tokens, and a sequence is never split "
                            "across micro-batches: set actor.ppo_max_token_len_per_gpu to at least %lld (or shorten "
                            "data.max_response_length)",
                            r->ppo_max_token_len, file, longest, r->max_response_length, (long long)L64,
                            (long long)L64);
    const par_config *pc = &r->par;
    const int pp = pc->pipeline_parallel_size;
    if (!pipeline || pp <= 1) return MOERL_OK;
    const int v = pc->virtual_pipeline_parallel_size > 1 ? pc->virtual_pipeline_parallel_size : 1;
    const int sp = pc->ulysses_sequence_parallel_size > 0 ? pc->ulysses_sequence_parallel_size : 1;
    const int D = MOERL_MAX(1, r->n_trainer_ranks / pp / sp), G = r->ppo_mini_batch_size, g = r->n, L = (int)L64;
    /* a mini-batch's G groups go to the D pipelines largest first onto the least-loaded
     * (rl_split_minibatch): a group costs g × (prompt + response) tokens, at least g × the shortest
     * prompt (a response may be short), at most g × L */
    int k_lo, k_hi;
    rl_shard_groups(G, D, (int64_t)g * shortest, (int64_t)g * L, &k_lo, &k_hi);
    const int bad = first_bad_groups(k_lo, k_hi, g, L, r->ppo_max_token_len, pp, v);
    if (!bad) return MOERL_OK;
    /* values that would work, each alone: rollout.n (the group range depends on the lengths only),
     * actor.ppo_max_token_len_per_gpu (more sequences per micro-batch), the plain schedule */
    char fix[400] = "", part[128];
    size_t used = 0;
#define ADD_FIX(...)                                                                                                   \
    do {                                                                                                               \
        snprintf(part, sizeof part, __VA_ARGS__);                                                                      \
        used += (size_t)snprintf(fix + used, used < sizeof fix ? sizeof fix - used : 0, "%s%s", used ? ", or " : "",   \
                                 part);                                                                                \
    } while (0)
    for (int g2 = g + 1; g2 <= g + 2 * pp * v; g2++)
        if (!first_bad_groups(k_lo, k_hi, g2, L, r->ppo_max_token_len, pp, v)) {
            ADD_FIX("rollout.n=%d", g2);
            break;
        }
    const int n_max = (int)MOERL_MIN((int64_t)k_hi * g, (int64_t)INT_MAX);
    for (int per = r->ppo_max_token_len / L + 1; per <= n_max && (int64_t)per * L <= INT_MAX; per++)
        if (!first_bad_groups(k_lo, k_hi, g, L, per * L, pp, v)) {
            ADD_FIX("actor.ppo_max_token_len_per_gpu=%d", per * L);
            break;
        }
    if (v > 1 && !first_bad_groups(k_lo, k_hi, g, L, r->ppo_max_token_len, pp, 1))
        ADD_FIX("actor.virtual_pipeline_parallel_size=1");
#undef ADD_FIX
    const int n = bad * g, per = r->ppo_max_token_len / L;
    char why[200], vkey[64] = "";
    if (v > 1) snprintf(vkey, sizeof vkey, " with actor.virtual_pipeline_parallel_size=%d", v);
    if (n < pp)
        snprintf(why, sizeof why, "%d sequences make at most %d micro-batches, fewer than the %d stages", n, n, pp);
    else if ((n + per - 1) / per == n)
        snprintf(why, sizeof why, "%d micro-batches (one sequence of %d tokens per micro-batch), not a multiple of %d",
                 n, L, pp);
    else
        snprintf(why, sizeof why, "%d to %d micro-batches (%d sequences of %d tokens fit one), none a multiple of %d",
                 (n + per - 1) / per, n, per, L, pp);
    return moerl_errorf("actor.pipeline_parallel_size=%d%s cannot schedule every update this configuration can make: "
                        "a pipeline can get %d group%s of rollout.n=%d responses (actor.ppo_mini_batch_size=%d prompts "
                        "split by tokens over %d data-parallel pipeline%s), and with sequences of up to %d tokens (the "
                        "longest prompt of %s, %d tokens, + data.max_response_length=%d) and "
                        "actor.ppo_max_token_len_per_gpu=%d its %d sequences make %s. Would work: %s",
                        pp, vkey,
                        bad, bad == 1 ? "" : "s", g, G, D, D == 1 ? "" : "s", L, file, longest,
                        r->max_response_length, r->ppo_max_token_len, n, why, fix[0] ? fix : "a larger rollout.n");
}
