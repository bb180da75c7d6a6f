/* moerl — the "arith" task family: multi-digit addition and subtraction (see tasks.h). */
#include <stdbool.h>
#include <stdio.h>

#include "data/task_family.h"

void task_gen_arith(rng_state *r, const task_opts *o, task_item *it) {
    int64_t lo = 1, hi;
    for (int i = 1; i < o->arith_digits; i++) lo *= 10;
    hi = lo * 10 - 1;
    if (o->arith_digits == 1) lo = 0;
    int64_t a = task_rng_range(r, lo, hi), b = task_rng_range(r, lo, hi);
    bool add = rng_u64(r) & 1;
    int64_t c = add ? a + b : a - b;
    snprintf(it->prompt, sizeof it->prompt, "Compute %lld%c%lld.", (long long)a, add ? '+' : '-', (long long)b);
    snprintf(it->truth, sizeof it->truth, "%lld", (long long)c);
    snprintf(it->response, sizeof it->response, "%lld", (long long)c);
}
