/* The data-parallel reducer with compressed all-reduce (actor.grad_compression) under mpirun:
 * every rank fills its gradient buffer with its own seeded values, steps 0..K−1, and checks the
 * reduced gradient against its own simulation of the exchange — every rank's codec with every
 * rank's error-feedback residual, bucket by bucket, summed in rank order — bit for bit; the warm-up
 * steps against the exact sum; the bytes sent against the payload sizes (threshold: ≥ 8× smaller
 * than the exact all-reduce). In one process (or one trainer) the reducer sends nothing and leaves
 * the gradient as it is. Usage: test_dist_compress. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "model/model.h"
#include "dist/compress.h"
#include "test.h"

#define K_STEPS 4
#define WARMUP 1

static void grads_of(float *g, size_t n, int rank, int step) {
    rng_state r;
    rng_seed(&r, 1000u * (uint64_t)rank + (uint64_t)step + 7);
    for (size_t i = 0; i < n; i++) g[i] = (float)(rng_uniform_double(&r) * 2 - 1) * 1e-2f;
}

static void model_for_test(moe_model *m) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 64; c.hidden_size = 32; c.intermediate_size = 32; c.moe_intermediate_size = 16;
    c.num_hidden_layers = 2; c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 8;
    c.num_experts = 4; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1; c.norm_topk_prob = 1;
    c.max_position_embeddings = 64; c.rms_norm_eps = 1e-6f; c.rope_theta = 1e4f; c.initializer_range = 0.02f;
    MOERL_ASSERT(model_init(m, &c) == MOERL_OK);
}

int main(int argc, char **argv) {
    dist_ctx *ctx = dist_init(&argc, &argv);
    if (!ctx || dist_split_roles(ctx, ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_compress: %s\n", moerl_last_error());
        return 1;
    }
    const int D = ctx->trainer_size, me = ctx->trainer_rank;
    const grad_compression modes[2] = {GRAD_COMPRESSION_THRESHOLD, GRAD_COMPRESSION_ONEBIT};
    for (int mi = 0; mi < 2; mi++) {
        const grad_compression mode = modes[mi];
        moe_model m;
        model_for_test(&m);
        const size_t n = m.n_params;
        /* 0.02 MiB buckets: several of them, as in training */
        dist_grad_reducer *r = dist_reducer_new(ctx, &m, 0.02, mi ? DIST_OVERLAP_OFF : DIST_OVERLAP_THREAD);
        MOERL_ASSERT(r != NULL);
        dist_reducer_set_compression(r, mode, WARMUP, 64);
        const int nb = dist_reducer_n_buckets(r);
        const dist_bucket *b = dist_reducer_buckets(r);
        float **resid = xmalloc((size_t)D * sizeof(float *)), *tmp = xmalloc(n * sizeof(float));
        float *want = xmalloc(n * sizeof(float)), *g = xmalloc(n * sizeof(float));
        for (int d = 0; d < D; d++) resid[d] = xcalloc(n, sizeof(float));
        void *buf = xmalloc(compress_max_bytes(mode, n, 64));
        for (int k = 0; k < K_STEPS; k++) {
            grads_of(m.grads, n, me, k);
            dist_reducer_layer_done(r, m.cfg.num_hidden_layers); /* as backward would, then the rest */
            dist_reducer_finish(r);
            double sent, raw, want_sent = 0;
            dist_reducer_last_bytes(r, &sent, &raw);
            memset(want, 0, n * sizeof(float));
            if (D == 1 || k < WARMUP) { /* exact: the plain sum (one rank: the gradient itself) */
                for (int d = 0; d < D; d++) {
                    grads_of(g, n, d, k);
                    for (size_t i = 0; i < n; i++) want[i] += g[i];
                }
                /* MPI's sum order may differ from rank order: fp32 rounding of D ≤ 3 terms of 1e-2 */
                float worst = 0;
                for (size_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(m.grads[i] - want[i]));
                CHECK(worst <= 1e-8f, "%s step %d (exact): max difference %g", grad_compression_name(mode), k,
                      (double)worst);
                want_sent = D == 1 ? 0 : 4.0 * (double)n;
            } else {
                for (int j = 0; j < nb; j++) {
                    for (int d = 0; d < D; d++) {
                        grads_of(g, n, d, k);
                        const size_t len =
                            compress_bucket(mode, g + b[j].offset, resid[d] + b[j].offset, b[j].n, 64, buf);
                        if (d == me) want_sent += (double)len;
                        MOERL_ASSERT(decompress_add(mode, buf, len, want + b[j].offset, b[j].n) == MOERL_OK);
                    }
                }
                CHECK(!memcmp(m.grads, want, n * sizeof(float)), "%s step %d: the reduced gradient differs from the "
                      "simulated exchange", grad_compression_name(mode), k);
                CHECK(raw / sent > 1.5, "%s step %d: compression ratio %.2f", grad_compression_name(mode), k,
                      raw / sent);
                /* threshold keeps < half the elements at ≤ 1 + 9 bits each plus ≤ 1 index bit per element: even
                 * at that worst, 32 bits / 6 bits > 5×; these gradients keep far fewer (the practice's 8× target) */
                if (mode == GRAD_COMPRESSION_THRESHOLD)
                    CHECK(raw / sent >= 8.0, "threshold step %d: ratio %.2f below the practice's 8×", k, raw / sent);
            }
            CHECK(sent == want_sent, "%s step %d: %g bytes sent, want %g", grad_compression_name(mode), k, sent,
                  want_sent);
            if (me == 0 && k == K_STEPS - 1)
                printf("%s: DP=%d, %zu floats in %d buckets, step %d: %.0f bytes sent of %.0f (ratio %.2f)\n",
                       grad_compression_name(mode), D, n, nb, k, sent, raw, sent > 0 ? raw / sent : 0.0);
        }
        for (int d = 0; d < D; d++) free(resid[d]);
        free(resid); free(tmp); free(want); free(g); free(buf);
        dist_reducer_free(r);
        model_free(&m);
    }
    double f = t_failed;
    MOERL_ASSERT(dist_allreduce_sum(ctx, DIST_TRAINERS, &f, 1) == MOERL_OK);
    if (me == 0) printf("%d passed, %d failed\n", t_passed, (int)f);
    dist_finalize(ctx);
    return f > 0;
}
