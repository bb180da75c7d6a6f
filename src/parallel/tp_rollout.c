/* The rollout engine's tensor-parallel runtime (see tp_rollout.h). */
#include "parallel/tp_rollout.h"

#include <stdlib.h>

#include "base/common.h"
#include "model/forward.h"

struct tp_rollout {
    model_par_head head; /* FIRST: the TP hooks, so a tp_rollout is an engine_set_tp runtime */
    dist_comm *comm;
    int P;
    double bytes;
};

static void rtp_allreduce_f32(void *par, float *x, size_t n) {
    tp_rollout *t = par;
    if (dist_comm_allreduce_f32(t->comm, x, n) != MOERL_OK)
        moerl_fatal("rollout tensor-parallel all-reduce: %s", moerl_last_error());
    t->bytes += (double)n * sizeof(float);
}

/* The engine sums floats only (engine_set_tp); the doubles' hook (the trainer's vocab-parallel statistics) is unset. */
static const model_hooks rtp_hooks = {.tp_allreduce_f32 = rtp_allreduce_f32};

tp_rollout *tp_rollout_new(dist_comm *comm) {
    if (!comm || dist_comm_size(comm) < 2) {
        moerl_errorf("tp_rollout_new: rollout tensor parallelism needs a group of ≥ 2 ranks (rollout."
                     "tensor_model_parallel_size), got %d", comm ? dist_comm_size(comm) : 0);
        return NULL;
    }
    tp_rollout *t = xcalloc(1, sizeof *t);
    t->head.hooks = &rtp_hooks;
    t->comm = comm;
    t->P = dist_comm_size(comm);
    return t;
}

void tp_rollout_free(tp_rollout *t) { free(t); }

double tp_rollout_bytes(const tp_rollout *t) { return t ? t->bytes : 0; }
