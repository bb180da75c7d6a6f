/* The staleness budget of verl's fully-async trainer (fully_async_policy), exactly:
 *   required_samples      = ppo_mini_batch_size · require_batches   (prompts per trainer step)
 *   W                     = trigger_parameter_sync_step · required_samples (prompts per version)
 *   max_required_samples  = floor(W · (1 + staleness_threshold))   (also the queue capacity)
 * A counter goes +1 when a NEW prompt starts generating (a resumed partial prompt does not
 * count). At every version change it is reset to in-flight + interrupted + queued prompts (the
 * carried-over work). The rollouter may start a new prompt only while counter < max_required_samples
 * and the queue holds fewer than max_required_samples groups.
 * Consequence (tested): prompts started but not yet consumed by the trainer never exceed
 * max_required_samples. Groups reach the trainer in completion order (as in verl), so a per-sample
 * version lag is bounded by lag_bound = ceil(max_required_samples / W) − 1 only when groups finish
 * in the order they started (equal lengths); a long response that is overtaken by shorter ones can
 * be older, and the trainer reports every sample's lag (fully_async/max_staleness, samples.jsonl).
 * Source: verl recipe/fully_async_policy (README.md and its rollouter); docs/rl.md. */
#ifndef MOERL_STALENESS_H
#define MOERL_STALENESS_H

#include <stdint.h>

typedef struct {
    int required_samples;
    int window;               /* W */
    int max_required_samples;
    int lag_bound;            /* in versions */
    int64_t counter;
} staleness_budget;

/* Errors: non-positive sizes, negative threshold (message names the key). */
int staleness_init(staleness_budget *b, int ppo_mini_batch_size, int require_batches,
                   int trigger_parameter_sync_step, double staleness_threshold);
/* May a new prompt start now, given the groups currently queued? */
int staleness_can_start(const staleness_budget *b, int64_t queued);
/* A new prompt started. */
void staleness_on_start(staleness_budget *b);
/* k finished groups were dropped by DAPO's dynamic sampling (algorithm.filter_groups; moerl's
 * rule, verl's fully-async trainer has none): they are consumed without training, so they give
 * their slots back at once (counter −= k) and as many new prompts replace them — otherwise a
 * trainer waiting for replacements under a full budget would wait forever. The counter never drops
 * below `held`, the groups in flight (interrupted ones included) plus those queued now: a dropped
 * group taken from the queue before a version re-based the counter is not in it, and giving its
 * slot back again would let the queue outgrow the budget. */
void staleness_on_drop(staleness_budget *b, int64_t k, int64_t held);
/* Version changed: re-base on the carried-over prompts. */
void staleness_on_version(staleness_budget *b, int64_t in_flight, int64_t interrupted, int64_t queued);

#endif
