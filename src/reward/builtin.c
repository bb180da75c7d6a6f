/* The built-in reward backend: the rule rewards of data/rewards.h (reward_score) by data_source,
 * run in the calling thread (they take microseconds: no processes, no batching of their own). */
#include <stdlib.h>

#include "base/common.h"
#include "data/rewards.h"
#include "reward/reward.h"

static int builtin_score(reward_backend *b, const reward_request *reqs, int n, reward_result *out) {
    for (int i = 0; i < n; i++) {
        const reward_request *q = &reqs[i];
        double s = 0;
        char *pred = NULL;
        if (reward_score(q->data_source ? q->data_source : "", q->solution_str ? q->solution_str : "",
                         q->ground_truth ? q->ground_truth : "", &s, &pred) != MOERL_OK)
            return moerl_error_prefix("%s reward, row %s: ", b->what, q->where ? q->where : "(unknown)");
        out[i].score = s;
        out[i].pred = pred;
    }
    return MOERL_OK;
}

static void builtin_free(reward_backend *b) { free(b); }

reward_backend *reward_backend_builtin(void) {
    reward_backend *b = xcalloc(1, sizeof *b);
    b->what = "built-in";
    b->score = builtin_score;
    b->free = builtin_free;
    return b;
}
