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
        ds_row_encode_prompt(r, &s);
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
    cmin = MOERL_MAX((int64_t)0, MOERL_MIN(cmin, cmax));
    /* when shard i took its last group (cost c_i) it was the least loaded, so every shard j ends with
     * load_j ≥ load_i − c_i ≥ (k_i − 1)·cmin. A shard with k groups has a load in [k·cmin, k·cmax];
     * of the other D − 1 shards, one has ≥ ⌈(G − k)/(D − 1)⌉ groups and one ≤ ⌊(G − k)/(D − 1)⌋.
     * k is possible only if k·cmax ≥ (⌈(G − k)/(D − 1)⌉ − 1)·cmin (the fullest other shard took its
     * last group while no fuller than this one) and (k − 1)·cmin ≤ ⌊(G − k)/(D − 1)⌋·cmax (the same
     * for this shard against the emptiest other). Both tests are monotone in k. */
    /* lo: the least k in [0, G] failing the first test (k·cmax below the fullest other's bound), hi: the greatest
     * k in [lo, G] failing the second; both by bisection (log G steps: plan takes mini-batches of 10^9 groups) */
    int a = 0, b = G; /* the first test holds below a, fails at b (or b = G) */
    while (a < b) {
        const int k = a + (b - a) / 2;
        if ((int64_t)k * cmax < (int64_t)((G - k + D - 2) / (D - 1) - 1) * cmin) a = k + 1;
        else b = k;
    }
    int lo = a, hi;
    a = lo, b = G; /* the second test fails at a (or a = lo), holds above b */
    while (a < b) {
        const int k = b - (b - a) / 2;
        if ((int64_t)(k - 1) * cmin > (int64_t)((G - k) / (D - 1)) * cmax) b = k - 1;
        else a = k;
    }
    hi = a;
    /* every shard gets between lo and hi groups, so none gets more than G − (D − 1)·lo */
    hi = MOERL_MAX(lo, MOERL_MIN(hi, G - (D - 1) * lo));
    lo = MOERL_MIN(hi, MOERL_MAX(lo, G - (D - 1) * hi));
    *k_lo = lo;
    *k_hi = hi;
}

/* The first per-pipeline group count k in [k_lo, k_hi] (k ≥ 1) whose k·g sequences of up to L tokens
 * the pipeline cannot schedule, or 0 when every one can (pp_count_allowed). From n ≥ 2·pp sequences on,
 * pp_count_allowed(n) depends on n mod pp alone (pp_count_needed: never with L past max_tokens; with one
 * sequence per micro-batch, the interleaved schedule needs pp | n; else always, as ⌈n/per⌉ rounded up to a
 * multiple of pp is ≤ n), so k·g's verdicts repeat with period pp in k once k·g ≥ 2·pp: one period is checked,
 * and past it only k·g overflowing 32 bits can fail (a mini-batch of 10^9 groups takes no 10^9 steps). */
static int first_bad_groups(int k_lo, int k_hi, int g, int L, int max_tokens, int pp, int v) {
    if (g < 1) return 0; /* no sequences: nothing to schedule (pp_count_allowed(0)) */
    const int64_t k_rep = MOERL_MAX((int64_t)MOERL_MAX(k_lo, 1), ((int64_t)2 * pp + g - 1) / g) + pp;
    int64_t k = MOERL_MAX(k_lo, 1);
    for (; k <= k_hi && k < k_rep; k++) /* up to one period past 2·pp sequences */
        if (k * g > INT_MAX || !pp_count_allowed((int)(k * g), L, max_tokens, pp, v)) return (int)k;
    /* the counts within 2·pp of INT_MAX, where pp_count_needed's rounding overflows (refused, as before), up to
     * the first k with k·g > INT_MAX: at most 2·pp + 2 of them */
    for (k = MOERL_MAX(k, ((int64_t)INT_MAX - 2 * pp) / g); k <= k_hi; k++)
        if (k * g > INT_MAX || !pp_count_allowed((int)(k * g), L, max_tokens, pp, v)) return (int)k;
    return 0;
}

int rl_check_step_rows(const rl_config *cfg, int64_t rows, staleness_budget *b, int64_t *total_steps) {
    if (rl_config_budget(cfg, b) != MOERL_OK) return MOERL_ERR;
    const int64_t steps = cfg->total_training_steps > 0 ? cfg->total_training_steps
                                                        : (int64_t)cfg->total_epochs * rows / b->required_samples;
    if (steps <= 0)
        return moerl_errorf("no trainer steps: %lld training row%s, %d prompt%s per step (actor.ppo_mini_batch_size × "
                            "async_training.require_batches), trainer.total_epochs %d",
                            (long long)rows, moerl_plural(rows), b->required_samples, moerl_plural(b->required_samples),
                            cfg->total_epochs);
    if (b->required_samples > rows)
        return moerl_errorf("a trainer step needs %d prompts (actor.ppo_mini_batch_size × async_training.require_batches) "
                            "but the training data has only %lld row%s",
                            b->required_samples, (long long)rows, moerl_plural(rows));
    if (total_steps) *total_steps = steps;
    return MOERL_OK;
}

int rl_check_update_sizes(const rl_config *r, const dataset *train, int pipeline) {
    staleness_budget b; /* the step's prompts against the rows, before any work (job_plan checks again) */
    if (rl_check_step_rows(r, dataset_count(train), &b, NULL) != MOERL_OK) return MOERL_ERR;
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
    if (!pipeline || pc->pipeline_parallel_size <= 1) return MOERL_OK;
    const int sp = pc->ulysses_sequence_parallel_size > 0 ? pc->ulysses_sequence_parallel_size : 1;
    char src[300];
    snprintf(src, sizeof src, "the longest prompt of %s, %d tokens, + data.max_response_length=%d", file, longest,
             r->max_response_length);
    /* a group costs g × (prompt + response) tokens, at least g × the shortest prompt (a response may
     * be short), at most g × L */
    const rl_pp_sizes z = {.groups = r->ppo_mini_batch_size,
                           .group_size = r->n,
                           .pipelines = MOERL_MAX(1, r->n_trainer_ranks / pc->pipeline_parallel_size / sp),
                           .pp = pc->pipeline_parallel_size,
                           .vpp = pc->virtual_pipeline_parallel_size,
                           .min_seq_tokens = shortest,
                           .seq_tokens = (int)L64,
                           .max_tokens = r->ppo_max_token_len,
                           .seq_tokens_src = src};
    return rl_check_pipeline_groups(&z);
}

int rl_check_pipeline_groups(const rl_pp_sizes *z) {
    const int pp = z->pp;
    if (pp <= 1) return MOERL_OK;
    const int v = z->vpp > 1 ? z->vpp : 1, D = MOERL_MAX(1, z->pipelines), G = z->groups, g = z->group_size,
              L = z->seq_tokens;
    /* a mini-batch's G groups go to the D pipelines largest first onto the least-loaded
     * (rl_split_minibatch) */
    int k_lo, k_hi;
    rl_shard_groups(G, D, (int64_t)g * MOERL_MIN(z->min_seq_tokens, L), (int64_t)g * L, &k_lo, &k_hi);
    const int bad = first_bad_groups(k_lo, k_hi, g, L, z->max_tokens, pp, v);
    if (!bad) return MOERL_OK;
    if ((int64_t)bad * g > INT_MAX) /* a count the pipeline's 32-bit micro-batch schedule cannot hold */
        return moerl_errorf("actor.pipeline_parallel_size=%d: actor.ppo_mini_batch_size=%d prompts split over %d "
                            "data-parallel pipeline%s can give a pipeline %d group%s of rollout.n=%d = %lld sequences "
                            "in one update, more than 2^31 − 1: lower actor.ppo_mini_batch_size or rollout.n",
                            pp, G, D, moerl_plural(D), bad, moerl_plural(bad), g, (long long)bad * g);
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
        if (!first_bad_groups(k_lo, k_hi, g2, L, z->max_tokens, pp, v)) {
            ADD_FIX("rollout.n=%d", g2);
            break;
        }
    const int n_max = (int)MOERL_MIN((int64_t)k_hi * g, (int64_t)INT_MAX);
    for (int per = z->max_tokens / L + 1; per <= n_max && (int64_t)per * L <= INT_MAX; per++)
        if (!first_bad_groups(k_lo, k_hi, g, L, per * L, pp, v)) {
            ADD_FIX("actor.ppo_max_token_len_per_gpu=%d", per * L);
            break;
        }
    if (v > 1 && !first_bad_groups(k_lo, k_hi, g, L, z->max_tokens, pp, 1))
        ADD_FIX("actor.virtual_pipeline_parallel_size=1");
#undef ADD_FIX
    const int n = bad * g, per = z->max_tokens / L;
    char why[200], vkey[64] = "";
    if (v > 1) snprintf(vkey, sizeof vkey, " with actor.virtual_pipeline_parallel_size=%d", v);
    if (n < pp)
        snprintf(why, sizeof why, "at most %d micro-batch%s, fewer than the %d stages", n, n == 1 ? "" : "es", pp);
    else if ((n + per - 1) / per == n)
        snprintf(why, sizeof why, "%d micro-batches (one sequence of %d tokens per micro-batch), not a multiple of %d",
                 n, L, pp);
    else
        snprintf(why, sizeof why, "%d to %d micro-batches (%d sequences of %d tokens fit one), none a multiple of %d",
                 (n + per - 1) / per, n, per, L, pp);
    return moerl_errorf("actor.pipeline_parallel_size=%d%s cannot schedule every update this configuration can make: "
                        "a pipeline can get %d group%s of rollout.n=%d response%s (actor.ppo_mini_batch_size=%d prompt%s "
                        "split by tokens over %d data-parallel pipeline%s), and with sequences of up to %d tokens (%s) "
                        "and actor.ppo_max_token_len_per_gpu=%d its %d sequence%s make%s %s. Would work: %s",
                        pp, vkey,
                        bad, moerl_plural(bad), g, moerl_plural(g), G, moerl_plural(G), D, moerl_plural(D), L, z->seq_tokens_src, z->max_tokens, n, moerl_plural(n), n == 1 ? "s" : "", why,
                        fix[0] ? fix : "a larger rollout.n");
}
