#include "rl/staleness.h"

#include <math.h>

#include "base/common.h"

int staleness_init(staleness_budget *b, int mb, int rb, int trig, double s) {
    if (mb <= 0) return moerl_errorf("actor.ppo_mini_batch_size must be positive, got %d", mb);
    if (rb <= 0) return moerl_errorf("async_training.require_batches must be positive, got %d", rb);
    if (trig <= 0) return moerl_errorf("async_training.trigger_parameter_sync_step must be positive, got %d", trig);
    if (!(s >= 0) || !isfinite(s))
        return moerl_errorf("async_training.staleness_threshold must be a finite number ≥ 0, got %g", s);
    b->required_samples = mb * rb;
    b->window = trig * b->required_samples;
    /* floor with a small guard so 0.3·10 = 2.9999999 still floors to 3 */
    b->max_required_samples = (int)floor((double)b->window * (1.0 + s) + 1e-9);
    b->lag_bound = (b->max_required_samples + b->window - 1) / b->window - 1;
    b->counter = 0;
    return MOERL_OK;
}

int staleness_can_start(const staleness_budget *b, int64_t queued) {
    return b->counter < b->max_required_samples && queued < b->max_required_samples;
}

void staleness_on_start(staleness_budget *b) { b->counter++; }

void staleness_on_version(staleness_budget *b, int64_t in_flight, int64_t interrupted, int64_t queued) {
    b->counter = in_flight + interrupted + queued;
}

void staleness_on_drop(staleness_budget *b, int64_t k, int64_t held) {
    b->counter -= k;
    if (b->counter < held) b->counter = held;
    if (b->counter < 0) b->counter = 0;
}
