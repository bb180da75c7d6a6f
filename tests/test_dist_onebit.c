/* 1-bit Adam's two-stage compressed all-reduce over real MPI ranks (onebit_allreduce_comm, src/dist/
 * onebit.h) against the in-process simulation of all W workers (the stage functions that
 * tests/test_onebit_adam.c checks against the PyTorch reference): 6 rounds of error feedback, every
 * rank's result and error buffers bit for bit (tolerance 0: the same float operations in the same
 * order), every rank ending with the same values, and the bytes the group's counter saw equal to
 * onebit_sent_bytes (1 bit per value + one scale per message). Run under mpirun with 2, 3, 4 ranks
 * (tests/e2e_onebit_adam.sh). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist/onebit.h"
#include "dist_test.h"

#define ROUNDS 6

/* Worker w's buffer in round k: deterministic, the same on every rank; n not a multiple of 32. */
static void momentum(float *v, size_t n, int w, int k) {
    for (size_t i = 0; i < n; i++) v[i] = (float)(sin(0.37 * (double)i + 1.3 * w + 0.71 * k) * (1.0 + 0.1 * w) * 1e-3);
}

/* The trainer's exchange (issue 29): per-tensor scales and a mask, over real ranks vs the simulation,
 * bit for bit, with the bytes counted (P scale words per message). */
static void segmented(dist_ctx *ctx, dist_comm *c) {
    const int W = ctx->world_size, me = ctx->world_rank;
    const size_t n = 1237, bounds[5] = {0, 300, 310, 900, n};
    uint8_t act[1237];
    for (size_t i = 0; i < n; i++) act[i] = !(i >= 500 && i < 540);
    onebit_exchange real, sim[8];
    onebit_exchange_init_segments(&real, n, W, me, bounds, 4);
    onebit_exchange_set_active(&real, act);
    for (int w = 0; w < W; w++) {
        onebit_exchange_init_segments(&sim[w], n, W, w, bounds, 4);
        onebit_exchange_set_active(&sim[w], act);
    }
    const size_t words = onebit_exchange_words(&real);
    float *v = xmalloc(n * 4), *sv = xmalloc(n * 4);
    int32_t *send = xmalloc((size_t)W * W * words * 4), *recv = xmalloc((size_t)W * words * 4),
            *gath = xmalloc((size_t)W * words * 4);
    const double before = dist_comm_bytes(c, DIST_OP_ALLTOALL);
    int match = 1, masked_zero = 1;
    for (int k = 0; k < ROUNDS; k++) {
        for (int w = 0; w < W; w++) {
            momentum(sv, n, w, k);
            for (size_t i = 300; i < 310; i++) sv[i] *= 1e-3f; /* a tensor of much smaller values */
            onebit_worker_compress(&sim[w], sv, send + (size_t)w * W * words);
        }
        for (int r = 0; r < W; r++) {
            for (int i = 0; i < W; i++) memcpy(recv + (size_t)i * words, send + ((size_t)i * W + r) * words, words * 4);
            MOERL_ASSERT(onebit_server_reduce(&sim[r], recv, gath + (size_t)r * words) == MOERL_OK);
        }
        MOERL_ASSERT(onebit_decode(&sim[me], gath, sv) == MOERL_OK);
        momentum(v, n, me, k);
        for (size_t i = 300; i < 310; i++) v[i] *= 1e-3f;
        CHECK(onebit_allreduce_comm(&real, c, v) == MOERL_OK, "%s", moerl_last_error());
        match &= !memcmp(v, sv, n * 4) && !memcmp(real.worker_err, sim[me].worker_err, n * 4) &&
                 !memcmp(real.server_err, sim[me].server_err, real.chunk * 4);
        for (size_t i = 500; i < 540; i++) masked_zero &= v[i] == 0.0f && real.worker_err[i] == 0.0f;
    }
    CHECK(match, "rank %d of %d: the segmented, masked exchange equals the simulation bit for bit", me, W);
    CHECK(masked_zero, "masked values decode to 0 and keep no error feedback");
    const double counted = dist_comm_bytes(c, DIST_OP_ALLTOALL) - before;
    CHECK(counted == ROUNDS * onebit_exchange_bytes(&real) && real.sent_bytes == onebit_exchange_bytes(&real) &&
              onebit_exchange_bytes(&real) == 2.0 * (W - 1) * 4 * (real.pieces + real.chunk / 32) && real.pieces > 1,
          "segmented bytes sent: counter %g, expected %d × %g (%d scales per message)", counted, ROUNDS,
          onebit_exchange_bytes(&real), real.pieces);
    onebit_exchange_free(&real);
    for (int w = 0; w < W; w++) onebit_exchange_free(&sim[w]);
    free(v);
    free(sv);
    free(send);
    free(recv);
    free(gath);
}

int main(int argc, char **argv) {
    dist_ctx *ctx = dist_init(&argc, &argv);
    MOERL_ASSERT(ctx && dist_split_roles(ctx, ctx->world_size) == MOERL_OK);
    const int W = ctx->world_size, me = ctx->world_rank;
    dist_comm *c = dist_comm_split(ctx, 0, me);
    MOERL_ASSERT(c);
    const size_t n = 1237, words = onebit_msg_words(onebit_chunk(n, W));
    onebit_exchange real, sim[8];
    onebit_exchange_init(&real, n, W, me);
    for (int w = 0; w < W; w++) onebit_exchange_init(&sim[w], n, W, w);
    float *v = xmalloc(n * 4), *sv = xmalloc(n * 4);
    int32_t *send = xmalloc((size_t)W * W * words * 4), *recv = xmalloc((size_t)W * words * 4),
            *gath = xmalloc((size_t)W * words * 4);
    int match = 1;
    for (int k = 0; k < ROUNDS; k++) {
        for (int w = 0; w < W; w++) {
            momentum(sv, n, w, k);
            onebit_worker_compress(&sim[w], sv, send + (size_t)w * W * words);
        }
        for (int r = 0; r < W; r++) {
            for (int i = 0; i < W; i++) memcpy(recv + (size_t)i * words, send + ((size_t)i * W + r) * words, words * 4);
            MOERL_ASSERT(onebit_server_reduce(&sim[r], recv, gath + (size_t)r * words) == MOERL_OK);
        }
        MOERL_ASSERT(onebit_decode(&sim[me], gath, sv) == MOERL_OK);
        momentum(v, n, me, k);
        CHECK(onebit_allreduce_comm(&real, c, v) == MOERL_OK, "%s", moerl_last_error());
        match &= !memcmp(v, sv, n * 4) && !memcmp(real.worker_err, sim[me].worker_err, n * 4) &&
                 !memcmp(real.server_err, sim[me].server_err, real.chunk * 4);
    }
    CHECK(match, "rank %d of %d: the MPI exchange equals the simulation bit for bit over %d rounds", me, W, ROUNDS);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n * 4; i++) h = (h ^ ((const unsigned char *)v)[i]) * 1099511628211ull;
    CHECK(dist_same_on_all_ranks(ctx, h), "every rank ends with the same averaged buffer");
    const double counted = dist_comm_bytes(c, DIST_OP_ALLTOALL);
    CHECK(counted == ROUNDS * onebit_sent_bytes(n, W) && real.sent_bytes == onebit_sent_bytes(n, W),
          "bytes sent: counter %g, expected %d × %g", counted, ROUNDS, onebit_sent_bytes(n, W));
    CHECK(onebit_sent_bytes(n, W) <= 2.0 * (W - 1) * (4 + (n / W + 32) / 8.0), "1 bit per value + scales");
    /* a group that does not match the buffers is refused */
    onebit_exchange wrong;
    onebit_exchange_init(&wrong, n, W + 1, 0);
    CHECK(onebit_allreduce_comm(&wrong, c, v) == MOERL_ERR && strstr(moerl_last_error(), "error buffers"),
          "mismatched group refused: %s", moerl_last_error());
    onebit_exchange_free(&wrong);
    segmented(ctx, c);
    onebit_exchange_free(&real);
    for (int w = 0; w < W; w++) onebit_exchange_free(&sim[w]);
    free(v);
    free(sv);
    free(send);
    free(recv);
    free(gath);
    dist_comm_free(c);
    return dist_test_finish(ctx);
}
