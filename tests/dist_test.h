/* Helpers shared by the MPI tests (tests/test_dist*.c, run under mpirun by tests/e2e_mpi.sh).
 * Every rank runs the same checks; a check counts ONCE, not once per rank: dist_test_finish prints
 * the largest per-rank pass and failure counts (rank 0 prints) and every rank exits non-zero when
 * any rank failed a check. */
#ifndef MOERL_TEST_DIST_TEST_H
#define MOERL_TEST_DIST_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/common.h"
#include "dist/dist.h"
#include "test.h"

/* 1 if v is the same on every world rank (collective over the world). */
static inline int dist_same_on_all_ranks(dist_ctx *ctx, uint64_t v) {
    const int P = ctx->world_size, me = ctx->world_rank;
    double *t = xcalloc((size_t)2 * P, sizeof(double));
    t[2 * me] = (double)(v >> 32);
    t[2 * me + 1] = (double)(v & 0xffffffffu);
    MOERL_ASSERT(dist_allreduce_sum(ctx, DIST_WORLD, t, 2 * P) == MOERL_OK);
    int same = 1;
    for (int r = 1; r < P; r++) same &= t[2 * r] == t[0] && t[2 * r + 1] == t[1];
    free(t);
    return same;
}

/* Gather the ranks' counts, print "N passed, M failed" once (N, M: the largest per-rank counts; any
 * failure anywhere makes M ≥ 1), finalize, and return the exit code (collective over the world). */
static inline int dist_test_finish(dist_ctx *ctx) {
    const int P = ctx->world_size, me = ctx->world_rank;
    double *c = xcalloc((size_t)2 * P, sizeof(double));
    c[2 * me] = t_passed;
    c[2 * me + 1] = t_failed;
    MOERL_ASSERT(dist_allreduce_sum(ctx, DIST_WORLD, c, 2 * P) == MOERL_OK);
    int passed = 0, failed = 0;
    for (int r = 0; r < P; r++) {
        passed = (int)c[2 * r] > passed ? (int)c[2 * r] : passed;
        failed = (int)c[2 * r + 1] > failed ? (int)c[2 * r + 1] : failed;
    }
    free(c);
    if (me == 0) printf("%d passed, %d failed\n", passed, failed);
    dist_finalize(ctx);
    return failed > 0;
}

#endif
