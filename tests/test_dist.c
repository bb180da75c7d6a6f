/* Distributed layer (src/dist): the same binary runs on the local backend (plain run, world size 1)
 * and under `mpirun -np N` on the MPI backend (tests/e2e_mpi.sh, N = 2, 3, 4).
 *
 * Covers: the DDP bucket plan (whole tensors, reverse layer order, first bucket ≤ 1 MiB then ≤ cap,
 * contiguous tiling, completion groups); the gradient reducer in every overlap mode against the exact
 * sum of all ranks' gradients (fp32 bound), bit-identical between overlap modes and across ranks, with
 * scaling, several steps and a tied embedding written in two phases; weight broadcast bit-identical with
 * the right policy version for bucket sizes from 1 float to larger than the buffer, a header mismatch
 * and bad root arguments failing clearly on every member; header validation; point-to-point messages
 * (ring of sizes 0 B..300 KB, a 64 KiB round trip, probe, tag matching); allreduce/barrier; role
 * splits and their errors.
 * `test_dist --fatal R` instead makes rank R call moerl_fatal while the others wait in a barrier
 * (e2e_mpi.sh checks that the job ends quickly with a message naming the rank).
 * Only rank 0 prints the final "N passed, M failed" line (counts summed over ranks). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/common.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "dist_test.h"
#include "fixture.h"
#include "test.h"

static dist_ctx *g_ctx;

#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)
#define RANK g_ctx->world_rank

static moe_config small_config(int tied) {
    const char *kv[] = {"model.intermediate_size=48", "model.num_hidden_layers=3", "model.num_key_value_heads=2",
                        "model.num_experts=4", "model.num_experts_per_tok=2",
                        "model.mlp_only_layers=[1]", /* layer 1 dense: both MLP kinds in the layout */
                        "model.router_aux_loss_coef=0",
                        tied ? "model.tie_word_embeddings=true" : "model.tie_word_embeddings=false"};
    return fx_small_config_vocab(96, kv, FX_N(kv));
}

static moe_config bench_config(void) {
    moe_config c = small_config(0);
    c.vocab_size = 512;
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.moe_intermediate_size = 128;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.num_experts = 16;
    c.num_experts_per_tok = 4;
    c.n_mlp_only_layers = 0;
    return c;
}

/* FNV-1a over bytes. */
static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* 1 if every rank of the world holds the same 64-bit value (exchanged exactly as 2 × 32-bit halves
 * in doubles: each rank fills its own slot, a sum over the world assembles the table). */
/* ---------------- bucket plan ---------------- */

static void check_plan(const moe_model *m, size_t first_cap, size_t cap, const char *what) {
    int nb = 0;
    dist_bucket *b = dist_plan_buckets(m, first_cap, cap, &nb);
    CHECK_R(b && nb > 0, "%s: plan failed: %s", RANK, what, moerl_last_error());
    if (!b) return;
    const int T = m->n_tensors, L = m->cfg.num_hidden_layers;
    int ok_tile = b[0].hi_tensor == T - 1 && b[nb - 1].lo_tensor == 0, ok_off = 1, ok_cap = 1, ok_close = 1,
        ok_group = 1, ok_bytes = 1;
    for (int i = 0; i < nb; i++) {
        const size_t c = i == 0 ? first_cap : cap;
        const size_t end = i == 0 ? m->n_params : b[i - 1].offset;
        ok_off &= b[i].offset == m->tensors[b[i].lo_tensor].offset && b[i].offset + b[i].n == end;
        size_t bytes = 0;
        int gmin = L + 1;
        for (int t = b[i].lo_tensor; t <= b[i].hi_tensor; t++) {
            bytes += (size_t)m->tensors[t].numel * 4;
            gmin = MOERL_MIN(gmin, dist_tensor_group(m, t));
        }
        ok_bytes &= bytes == b[i].bytes && gmin == b[i].group;
        /* at most the cap, unless a single tensor is larger than the cap on its own */
        ok_cap &= b[i].bytes <= c || b[i].lo_tensor == b[i].hi_tensor;
        if (i + 1 < nb) {
            ok_tile &= b[i + 1].hi_tensor == b[i].lo_tensor - 1;
            /* closing rule: the next tensor would not have fitted */
            ok_close &= b[i].bytes + (size_t)m->tensors[b[i].lo_tensor - 1].numel * 4 > c;
            ok_group &= b[i].group >= b[i + 1].group; /* later buckets complete later in backward */
        }
    }
    CHECK_R(ok_tile, "%s: buckets must tile the table in reverse order", RANK, what);
    CHECK_R(ok_off, "%s: bucket offsets/lengths must tile the buffer", RANK, what);
    CHECK_R(ok_bytes, "%s: bucket bytes/group bookkeeping", RANK, what);
    CHECK_R(ok_cap, "%s: bucket over its cap", RANK, what);
    CHECK_R(ok_close, "%s: a bucket was closed while the next tensor still fitted", RANK, what);
    CHECK_R(ok_group, "%s: bucket groups must not increase", RANK, what);
    /* the embedding is in the last bucket (group −1); the head (lm_head or, tied, the final norm) is
     * the first tensor of the first bucket */
    CHECK_R(b[nb - 1].lo_tensor == 0 && b[nb - 1].group == -1, "%s: embedding must be reduced last", RANK, what);
    const char *head = m->cfg.tie_word_embeddings ? "model.norm.weight" : "lm_head.weight";
    CHECK_R(!strcmp(m->tensors[b[0].hi_tensor].name, head) && dist_tensor_group(m, b[0].hi_tensor) == L,
            "%s: %s must open the first bucket", RANK, what, head);
    free(b);
}

static void test_plan(void) {
    for (int tied = 0; tied <= 1; tied++) {
        moe_config c = small_config(tied);
        moe_model m;
        MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
        const int L = c.num_hidden_layers;
        /* backward groups: embedding −1 (last), head L (first), layer tensors their layer */
        int ok = dist_tensor_group(&m, 0) == -1;
        for (int i = 0; i < m.n_tensors; i++) {
            const tensor_info *t = &m.tensors[i];
            if (t->layer >= 0) ok &= dist_tensor_group(&m, i) == t->layer;
            else if (i > 0) ok &= dist_tensor_group(&m, i) == L;
        }
        CHECK_R(ok, "tensor groups (tied %d)", RANK, tied);
        check_plan(&m, 4, 4, "one tensor per bucket");
        check_plan(&m, 1000, 3000, "first 1000 B then 3000 B");
        check_plan(&m, 4096, 16384, "first 4 KiB then 16 KiB");
        check_plan(&m, DIST_FIRST_BUCKET_BYTES, 25u << 20, "DDP defaults");
        int nb = -1;
        dist_bucket *b = dist_plan_buckets(&m, 4, 4, &nb);
        CHECK_R(b && nb == m.n_tensors, "4-byte cap gives one bucket per tensor (%d of %d)", RANK, nb, m.n_tensors);
        free(b);
        b = dist_plan_buckets(&m, 0, 100, &nb);
        CHECK_R(!b && strstr(moerl_last_error(), "caps"), "zero cap rejected: %s", RANK, moerl_last_error());
        model_free(&m);
    }
    /* the benchmark model with DDP defaults: 1 MiB first bucket, then ≤ 25 MiB */
    moe_config c = bench_config();
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    check_plan(&m, DIST_FIRST_BUCKET_BYTES, 25u << 20, "benchmark model, DDP defaults");
    check_plan(&m, DIST_FIRST_BUCKET_BYTES, 4u << 20, "benchmark model, 4 MiB");
    int nb;
    dist_bucket *b = dist_plan_buckets(&m, DIST_FIRST_BUCKET_BYTES, 25u << 20, &nb);
    if (RANK == 0) {
        printf("benchmark model (%zu floats) with DDP caps: %d buckets:", m.n_params, nb);
        for (int i = 0; i < nb; i++) printf(" [%s..%s %.2f MiB]", m.tensors[b[i].hi_tensor].name,
                                            m.tensors[b[i].lo_tensor].name, b[i].bytes / 1048576.0);
        printf("\n");
    }
    CHECK_R(b[0].bytes <= DIST_FIRST_BUCKET_BYTES, "first bucket ≤ 1 MiB", RANK);
    free(b);
    model_free(&m);
}

/* ---------------- gradient reducer ---------------- */

/* Rank r's gradient value for element j of tensor ti at step s: normal × 2^k with k ∈ [−8, 8], so
 * the summation order matters in fp32. `part` 0/1 splits the tied embedding into two writes. */
static void fill_tensor(float *dst, const tensor_info *t, int ti, int rank, int step, int part, int accumulate) {
    rng_state g;
    rng_seed(&g, 0x5eedULL ^ ((uint64_t)rank << 40) ^ ((uint64_t)step << 32) ^ ((uint64_t)ti << 8) ^ (uint64_t)part);
    for (int64_t j = 0; j < t->numel; j++) {
        const float v = ldexpf(rng_normal(&g), (int)rng_below(&g, 17) - 8);
        dst[t->offset + j] = accumulate ? dst[t->offset + j] + v : v;
    }
}

/* Write rank `rank`'s gradients for backward group `grp` (tied embedding: half in the head group,
 * the rest added in group −1, as model_backward does). */
static void fill_group(const moe_model *m, float *g, int grp, int rank, int step) {
    const int L = m->cfg.num_hidden_layers;
    for (int i = 0; i < m->n_tensors; i++) {
        const int tg = dist_tensor_group(m, i);
        if (tg == grp) fill_tensor(g, &m->tensors[i], i, rank, step, grp == -1 && m->cfg.tie_word_embeddings,
                                   grp == -1 && m->cfg.tie_word_embeddings);
        else if (grp == L && tg == -1 && m->cfg.tie_word_embeddings)
            fill_tensor(g, &m->tensors[i], i, rank, step, 0, 0);
    }
}

static void test_reducer_model(int tied, double bucket_mb) {
    dist_ctx *ctx = g_ctx;
    const int P = ctx->trainer_size;
    moe_config c = small_config(tied);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    const int L = c.num_hidden_layers;
    const size_t n = m.n_params;
    /* exact reference: double sums of every rank's values (and Σ|x| for the bound) */
    float *tmp = xalloc_aligned(n * sizeof(float));
    enum { STEPS = 2 };
    double *exact = xcalloc(STEPS * n, sizeof(double)), *absum = xcalloc(STEPS * n, sizeof(double));
    for (int s = 0; s < STEPS; s++)
        for (int r = 0; r < P; r++) {
            memset(tmp, 0, n * sizeof(float));
            for (int grp = L; grp >= -1; grp--) fill_group(&m, tmp, grp, r, s);
            for (size_t j = 0; j < n; j++) {
                exact[s * n + j] += tmp[j];
                absum[s * n + j] += fabs(tmp[j]);
            }
        }
    float *ref = xalloc_aligned(STEPS * n * sizeof(float)); /* OFF mode's result, for bitwise checks */
    const char *mode_name[3] = {"off", "thread", "poll"};
    const double u = ldexp(1.0, -24);
    for (int mode = DIST_OVERLAP_OFF; mode <= DIST_OVERLAP_POLL; mode++) {
        dist_grad_reducer *r = dist_reducer_new(ctx, &m, bucket_mb, (dist_overlap)mode);
        CHECK_R(r != NULL, "reducer_new(%g MiB, %s): %s", RANK, bucket_mb, mode_name[mode], moerl_last_error());
        if (!r) continue;
        for (int s = 0; s < STEPS; s++) {
            const float scale = s == 0 ? 1.0f : 1.0f / (float)P;
            dist_reducer_set_scale(r, scale);
            model_zero_grad(&m);
            /* as in backward: write a group, declare it done, go on while earlier buckets reduce;
             * step 1 declares only every other group (a later call covers the skipped ones) */
            for (int grp = L; grp >= -1; grp--) {
                fill_group(&m, m.grads, grp, ctx->trainer_rank, s);
                if (s == 0 || grp % 2 == 0)
                    CHECK_R(dist_reducer_layer_done(r, grp) == MOERL_OK, "layer_done(%d)", RANK, grp);
            }
            const double exposed = dist_reducer_finish(r);
            CHECK_R(exposed >= 0, "exposed time %g", RANK, exposed);
            /* error bound of any summation order of P fp32 terms: (P−1)·u·Σ|x| (+ u·|sum| for the
             * scaling rounding); 1.01 covers the second-order terms */
            size_t bad = 0, worst = 0;
            double worst_r = 0;
            for (size_t j = 0; j < n; j++) {
                const double want = exact[s * n + j] * scale;
                const double lim = 1.01 * ((P - 1) * u * absum[s * n + j] * scale + u * fabs(want)) + 1e-37;
                const double err = fabs((double)m.grads[j] - want);
                if (!(err <= lim)) bad++;
                if (err / lim > worst_r) worst_r = err / lim, worst = j;
            }
            CHECK_R(bad == 0, "reducer %s %g MiB tied %d step %d: %zu elements off the exact sum (worst %zu: %g vs %g)",
                    RANK, mode_name[mode], bucket_mb, tied, s, bad, worst, (double)m.grads[worst],
                    exact[s * n + worst] * scale);
            if (mode == DIST_OVERLAP_OFF) memcpy(ref + s * n, m.grads, n * sizeof(float));
            else
                CHECK_R(memcmp(ref + s * n, m.grads, n * sizeof(float)) == 0,
                        "reducer %s must equal overlap off bit for bit (%g MiB, step %d)", RANK, mode_name[mode],
                        bucket_mb, s);
            CHECK_R(dist_same_on_all_ranks(g_ctx, hash_bytes(m.grads, n * sizeof(float))),
                    "reduced gradients must be identical on every rank (%s, step %d)", RANK, mode_name[mode], s);
        }
        CHECK_R(dist_reducer_layer_done(r, L + 1) == MOERL_ERR && strstr(moerl_last_error(), "outside"),
                "layer_done(L+1) rejected: %s", RANK, moerl_last_error());
        CHECK_R(dist_reducer_layer_done(r, -2) == MOERL_ERR, "layer_done(-2) rejected", RANK);
        dist_reducer_free(r);
    }
    free(tmp);
    free(exact);
    free(absum);
    free(ref);
    model_free(&m);
}

static void test_reducer(void) {
    dist_ctx *ctx = g_ctx;
    /* every rank a trainer (training-only split), so the sums run over the whole world */
    CHECK_R(dist_split_roles(ctx, ctx->world_size) == MOERL_OK, "split all trainers: %s", RANK, moerl_last_error());
    CHECK_R(ctx->trainer_size == ctx->world_size && ctx->trainer_rank == ctx->world_rank, "trainer group", RANK);
    test_reducer_model(0, 0.004);  /* ~4 KB buckets: many buckets, several in flight */
    test_reducer_model(1, 0.004);
    test_reducer_model(0, 25.0);   /* DDP default: the whole small model in one 1 MiB-capped bucket */
    moe_config c = small_config(0);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    dist_grad_reducer *r = dist_reducer_new(ctx, &m, 0.0, DIST_OVERLAP_OFF);
    CHECK_R(!r && strstr(moerl_last_error(), "bucket_mb"), "bucket_mb 0 rejected: %s", RANK, moerl_last_error());
    r = dist_reducer_new(ctx, &m, NAN, DIST_OVERLAP_OFF);
    CHECK_R(!r, "bucket_mb NaN rejected", RANK);
    r = dist_reducer_new(ctx, &m, 1.0, (dist_overlap)7);
    CHECK_R(!r && strstr(moerl_last_error(), "overlap"), "bad overlap mode rejected: %s", RANK, moerl_last_error());
    model_free(&m);
    MOERL_ASSERT(model_init_inference(&m, &c) == MOERL_OK);
    r = dist_reducer_new(ctx, &m, 1.0, DIST_OVERLAP_OFF);
    CHECK_R(!r && strstr(moerl_last_error(), "gradient"), "model without grads rejected: %s", RANK,
            moerl_last_error());
    model_free(&m);
}

/* ---------------- weight broadcast ---------------- */

/* Deterministic weights for pattern k: finite values of all magnitudes plus −0, ±inf, a subnormal
 * and a NaN with payload (the broadcast must move bits, not values). */
static void fill_weights(float *w, size_t n, int k) {
    rng_state g;
    rng_seed(&g, 777 + (uint64_t)k);
    for (size_t i = 0; i < n; i++) w[i] = ldexpf(rng_normal(&g), (int)rng_below(&g, 61) - 30);
    const uint32_t specials[5] = {0x80000000u, 0x7f800000u, 0xff800000u, 0x00000123u, 0x7fc01234u};
    for (int i = 0; i < 5 && (size_t)i < n; i++) memcpy(&w[(i * 7919) % n], &specials[i], 4);
}

static void test_bcast(void) {
    dist_ctx *ctx = g_ctx;
    const int P = ctx->world_size;
    CHECK_R(dist_split_roles(ctx, 1) == MOERL_OK, "split 1 trainer: %s", RANK, moerl_last_error());
    if (P > 1) {
        CHECK_R(ctx->role == (RANK == P - 1 ? DIST_ROLE_TRAINER : DIST_ROLE_ROLLOUT), "role of rank", RANK);
        CHECK_R(ctx->sync_size == P && ctx->sync_rank == (RANK == P - 1 ? 0 : RANK + 1),
                "sync group: trainer 0 is root 0, rollout ranks follow (sync rank %d of %d)", RANK, ctx->sync_rank,
                ctx->sync_size);
    } else {
        CHECK_R(ctx->role == DIST_ROLE_EMBEDDED && ctx->sync_size == 1 && ctx->trainer_size == 1, "embedded roles",
                RANK);
    }
    const int root = ctx->sync_rank == 0;
    const size_t sizes[2] = {257, 100003};
    /* bucket sizes in bytes: 1 float, 7 floats, 6 bytes (→ 1 float), 4000 B, 256 KiB, larger than the
     * buffer; 1-float buckets only on the small buffer (one MPI_Bcast per float) */
    const size_t buckets[6] = {4, 28, 6, 4000, 262144, 1u << 22};
    int k = 0;
    for (int si = 0; si < 2; si++) {
        const size_t n = sizes[si];
        float *w = xmalloc(n * sizeof(float)), *want = xmalloc(n * sizeof(float));
        for (int bi = 0; bi < 6; bi++, k++) {
            if (si == 1 && buckets[bi] < 16) continue;
            fill_weights(want, n, k);
            if (root) memcpy(w, want, n * sizeof(float));
            else memset(w, 0xAB, n * sizeof(float));
            int version = root ? 100 + k : -1;
            dist_xfer_stats st;
            const int rc = dist_bcast_weights(ctx, w, n, &version, buckets[bi], &st);
            CHECK_R(rc == MOERL_OK, "bcast n=%zu bucket %zu B: %s", RANK, n, buckets[bi], moerl_last_error());
            if (P == 1) {
                CHECK_R(st.bytes == 0 && version == 100 + k, "embedded bcast is a no-op", RANK);
                continue;
            }
            CHECK_R(memcmp(w, want, n * sizeof(float)) == 0, "weights bit-identical (n=%zu bucket %zu B)", RANK, n,
                    buckets[bi]);
            CHECK_R(version == 100 + k, "version %d, want %d", RANK, version, 100 + k);
            const size_t bf = MOERL_MAX(buckets[bi] / 4, 1);
            CHECK_R(st.bytes == n * 4 && st.n_buckets == (int)((n + bf - 1) / bf) && st.seconds >= 0,
                    "stats: %zu bytes, %d buckets (want %zu, %zu)", RANK, st.bytes, st.n_buckets, n * 4,
                    (n + bf - 1) / bf);
        }
        free(w);
        free(want);
    }
    /* empty payload: only the version travels */
    int version = root ? 5 : 0;
    CHECK_R(dist_bcast_weights(ctx, NULL, 0, &version, 1024, NULL) == MOERL_OK && version == 5,
            "empty broadcast delivers the version (%d): %s", RANK, version, moerl_last_error());
    if (P > 1) {
        /* header mismatch: world rank 0 (a rollout rank) expects one float fewer; every member fails */
        const size_t n = 1000;
        float *w = xmalloc(n * sizeof(float));
        fill_weights(w, n, 99);
        version = root ? 9 : 3;
        const size_t my_n = RANK == 0 ? n - 1 : n;
        const int rc = dist_bcast_weights(ctx, w, my_n, &version, 4096, NULL);
        const char *e = moerl_last_error();
        CHECK_R(rc == MOERL_ERR, "mismatched broadcast must fail on every member", RANK);
        if (RANK == 0)
            CHECK_R(strstr(e, "1000 fp32 values") && strstr(e, "holds 999") && version == 3,
                    "mismatching rank names both sizes and keeps its version: %s", RANK, e);
        else if (root)
            CHECK_R(strstr(e, "rejected") && strstr(e, "world rank 0"), "root names the rejecting rank: %s", RANK, e);
        else
            CHECK_R(strstr(e, "world rank 0 rejected"), "other rollout ranks learn who rejected: %s", RANK, e);
        /* bad arguments on the root: everybody fails, receivers say the root refused */
        version = 1;
        const int rc2 = dist_bcast_weights(ctx, w, n, &version, root ? 2 : 4096, NULL);
        e = moerl_last_error();
        CHECK_R(rc2 == MOERL_ERR && (root ? strstr(e, "bucket_bytes") != NULL : strstr(e, "refused") != NULL),
                "bad root arguments fail everywhere: %s", RANK, e);
        /* the group still works afterwards */
        fill_weights(w, n, 100);
        if (!root) memset(w, 0, n * sizeof(float));
        version = root ? 11 : 0;
        CHECK_R(dist_bcast_weights(ctx, w, n, &version, 4096, NULL) == MOERL_OK && version == 11,
                "broadcast after a failed one: %s", RANK, moerl_last_error());
        float *want = xmalloc(n * sizeof(float));
        fill_weights(want, n, 100);
        CHECK_R(memcmp(w, want, n * sizeof(float)) == 0, "weights after a failed broadcast", RANK);
        free(want);
        free(w);
    } else {
        float w[4] = {0};
        version = 1;
        CHECK_R(dist_bcast_weights(ctx, w, 4, &version, 2, NULL) == MOERL_ERR &&
                    strstr(moerl_last_error(), "bucket_bytes"),
                "bucket_bytes < 4 rejected: %s", RANK, moerl_last_error());
    }
    if (P >= 3) {
        /* two trainers: trainer rank 1 is outside the sync group and returns at once */
        CHECK_R(dist_split_roles(ctx, 2) == MOERL_OK, "split 2 trainers", RANK);
        const size_t n = 5000;
        float *w = xmalloc(n * sizeof(float)), *want = xmalloc(n * sizeof(float));
        fill_weights(want, n, 42);
        if (ctx->sync_rank == 0) memcpy(w, want, n * sizeof(float));
        else memset(w, 0, n * sizeof(float));
        version = ctx->sync_rank == 0 ? 77 : 0;
        dist_xfer_stats st;
        CHECK_R(dist_bcast_weights(ctx, w, n, &version, 1000, &st) == MOERL_OK, "bcast with 2 trainers", RANK);
        if (ctx->sync_rank < 0)
            CHECK_R(st.bytes == 0 && version == 0 && RANK == P - 1, "trainer rank 1 takes no part", RANK);
        else
            CHECK_R(memcmp(w, want, n * sizeof(float)) == 0 && version == 77, "bcast with 2 trainers delivers", RANK);
        free(w);
        free(want);
    }
    /* header validation on its own */
    dist_weight_header h;
    dist_weight_header_make(&h, 3, 10, 4, DIST_WDTYPE_F32);
    CHECK_R(dist_weight_header_check(&h, 10, DIST_WDTYPE_F32) == MOERL_OK, "good header", RANK);
    h.magic[0] = 'X';
    CHECK_R(dist_weight_header_check(&h, 10, DIST_WDTYPE_F32) == MOERL_ERR &&
                strstr(moerl_last_error(), "magic 'XOERLWB1'"),
            "bad magic: %s", RANK, moerl_last_error());
    dist_weight_header_make(&h, 3, 10, 4, DIST_WDTYPE_F32);
    h.format = 1;
    CHECK_R(dist_weight_header_check(&h, 10, DIST_WDTYPE_F32) == MOERL_ERR &&
                strstr(moerl_last_error(), "format version 1"),
            "bad format: %s", RANK, moerl_last_error());
    dist_weight_header_make(&h, 3, 10, 4, DIST_WDTYPE_F32);
    CHECK_R(dist_weight_header_check(&h, 11, DIST_WDTYPE_F32) == MOERL_ERR && strstr(moerl_last_error(), "holds 11"),
            "size mismatch: %s", RANK, moerl_last_error());
    dist_weight_header_make(&h, 3, 10, 4, DIST_WDTYPE_BF16);
    CHECK_R(dist_weight_header_check(&h, 10, DIST_WDTYPE_BF16) == MOERL_OK, "good bf16 header", RANK);
    CHECK_R(dist_weight_header_check(&h, 10, DIST_WDTYPE_F32) == MOERL_ERR &&
                strstr(moerl_last_error(), "sent as bf16") && strstr(moerl_last_error(), "expects fp32"),
            "dtype mismatch: %s", RANK, moerl_last_error());
}

/* ---------------- bf16 weight broadcast ---------------- */

/* dist_f32_to_bf16 == f32_to_bf16 (the engine's rounding) for every sign/exponent/top-mantissa
 * pattern (all 65536 upper halves: zeros, subnormals, infinities, every NaN class) combined with the
 * lower halves that decide the rounding: 0, 1, just below / at / just above the tie (0x7fff, 0x8000,
 * 0x8001), 0xffff (carry into the exponent) and a random one. */
static void test_bf16_rounding(void) {
    const uint32_t lows[6] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
    enum { N = 65536 * 7 };
    float *x = xmalloc(N * sizeof(float));
    uint16_t *got = xmalloc(N * sizeof(uint16_t));
    rng_state g;
    rng_seed(&g, 4242);
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (int k = 0; k < 7; k++) {
            const uint32_t u = hi << 16 | (k < 6 ? lows[k] : (uint32_t)rng_below(&g, 65536));
            memcpy(&x[hi * 7 + k], &u, 4);
        }
    dist_f32_to_bf16(got, x, N);
    size_t bad = 0, first = N;
    for (size_t i = 0; i < N; i++)
        if (got[i] != f32_to_bf16(x[i])) bad++, first = first < N ? first : i;
    uint32_t fu = 0;
    if (first < N) memcpy(&fu, &x[first], 4);
    CHECK_R(bad == 0, "dist_f32_to_bf16 == f32_to_bf16 on %d bit patterns (%zu differ, first 0x%08x)", RANK, N, bad,
            fu);
    free(x);
    free(got);
}

static void test_bcast_bf16(void) {
    dist_ctx *ctx = g_ctx;
    const int P = ctx->world_size;
    CHECK_R(dist_split_roles(ctx, 1) == MOERL_OK, "split 1 trainer: %s", RANK, moerl_last_error());
    const int root = ctx->sync_rank == 0;
    const size_t sizes[2] = {257, 100003};
    /* wire bytes per bucket: 1 value, 7 values, 3 bytes (→ 1 value), 4000 B (more buckets than the
     * 16 staging slots: the ring is reused), 256 KiB, larger than the payload */
    const size_t buckets[6] = {2, 14, 3, 4000, 262144, 1u << 22};
    int k = 0;
    for (int si = 0; si < 2; si++) {
        const size_t n = sizes[si];
        float *w = xmalloc(n * sizeof(float)), *w32 = xmalloc(n * sizeof(float));
        uint16_t *got = xmalloc(n * sizeof(uint16_t)), *want = xmalloc(n * sizeof(uint16_t));
        for (int bi = 0; bi < 6; bi++, k++) {
            if (si == 1 && buckets[bi] < 8) continue;
            fill_weights(w, n, 200 + k);
            for (size_t i = 0; i < n; i++) want[i] = f32_to_bf16(w[i]); /* what the engine rounds to on load */
            if (!root) memset(w, 0xAB, n * sizeof(float)); /* src is the root's alone */
            memset(got, 0xCD, n * sizeof(uint16_t));
            int version = root ? 300 + k : -1;
            dist_xfer_stats st;
            /* the root keeps its dst NULL (the ring path) except for one case (rounding into dst) */
            const int root_dst = bi == 4;
            const int rc = dist_bcast_weights_bf16(ctx, root ? w : NULL, !root || root_dst || P == 1 ? got : NULL, n,
                                                   &version, buckets[bi], &st);
            CHECK_R(rc == MOERL_OK, "bf16 bcast n=%zu bucket %zu B: %s", RANK, n, buckets[bi], moerl_last_error());
            CHECK_R(version == 300 + k, "version %d, want %d", RANK, version, 300 + k);
            if (!root || root_dst || P == 1)
                CHECK_R(!memcmp(got, want, n * sizeof(uint16_t)),
                        "bf16 values == fp32 sent then rounded on load, bit for bit (n=%zu bucket %zu B)", RANK, n,
                        buckets[bi]);
            if (P == 1) {
                CHECK_R(st.bytes == 0, "a sync group of one sends nothing (%zu bytes)", RANK, st.bytes);
                continue;
            }
            const size_t bv = MOERL_MAX(buckets[bi] / 2, 1);
            CHECK_R(st.bytes == n * 2 && st.n_buckets == (int)((n + bv - 1) / bv),
                    "bf16 stats: %zu bytes, %d buckets (want %zu = half the fp32 payload, %zu)", RANK, st.bytes,
                    st.n_buckets, n * 2, (n + bv - 1) / bv);
            if (bi == 3) { /* the same weights as fp32: the counted bytes double */
                fill_weights(w32, n, 200 + k);
                if (!root) memset(w32, 0, n * sizeof(float));
                dist_xfer_stats s32;
                version = root ? 1 : 0;
                CHECK_R(dist_bcast_weights(ctx, w32, n, &version, 2 * buckets[bi], &s32) == MOERL_OK &&
                            s32.bytes == 2 * st.bytes && s32.n_buckets == st.n_buckets,
                        "fp32 broadcast of the same weights: %zu bytes (bf16 %zu), %d buckets (bf16 %d)", RANK,
                        s32.bytes, st.bytes, s32.n_buckets, st.n_buckets);
            }
        }
        free(w);
        free(w32);
        free(got);
        free(want);
    }
    /* empty payload: only the version travels */
    int version = root ? 6 : 0;
    CHECK_R(dist_bcast_weights_bf16(ctx, NULL, NULL, 0, &version, 1024, NULL) == MOERL_OK && version == 6,
            "empty bf16 broadcast delivers the version (%d): %s", RANK, version, moerl_last_error());
    const size_t n = 1000;
    float *w = xmalloc(n * sizeof(float));
    uint16_t *d = xmalloc(n * sizeof(uint16_t));
    fill_weights(w, n, 500);
    if (P > 1) {
        /* dtype mismatch: the root sends bf16, world rank 0 (a rollout rank) receives fp32 — and the
         * other way round; every member fails, the mismatching rank names both types */
        for (int dir = 0; dir < 2; dir++) {
            /* dir 0: root and the other rollout ranks bf16, world rank 0 fp32; dir 1: the reverse */
            const int use_bf16 = (dir == 0) != (RANK == 0);
            version = root ? 9 : 3;
            const int rc = use_bf16 ? dist_bcast_weights_bf16(ctx, w, d, n, &version, 4096, NULL)
                                    : dist_bcast_weights(ctx, w, n, &version, 4096, NULL);
            const char *e = moerl_last_error();
            CHECK_R(rc == MOERL_ERR, "dtype mismatch (direction %d) must fail on every member", RANK, dir);
            if (RANK == 0)
                CHECK_R(strstr(e, dir == 0 ? "sent as bf16" : "sent as fp32") &&
                            strstr(e, dir == 0 ? "expects fp32" : "expects bf16") && strstr(e, "rollout.dtype") &&
                            version == 3,
                        "mismatching rank names both dtypes and keeps its version: %s", RANK, e);
            else if (root)
                CHECK_R(strstr(e, "rejected") && strstr(e, "world rank 0"), "root names the rejecting rank: %s", RANK,
                        e);
        }
        /* bad arguments on the root (no src): everybody fails, receivers say the root refused */
        version = 1;
        const int rc2 = dist_bcast_weights_bf16(ctx, NULL, d, n, &version, 4096, NULL);
        const char *e = moerl_last_error();
        CHECK_R(rc2 == MOERL_ERR && (root ? strstr(e, "src") != NULL : strstr(e, "refused") != NULL),
                "bad root arguments fail everywhere: %s", RANK, e);
        /* the group still works afterwards */
        fill_weights(w, n, 501);
        version = root ? 12 : 0;
        CHECK_R(dist_bcast_weights_bf16(ctx, w, root ? NULL : d, n, &version, 4096, NULL) == MOERL_OK && version == 12,
                "bf16 broadcast after a failed one: %s", RANK, moerl_last_error());
        if (!root) {
            float *want = xmalloc(n * sizeof(float));
            fill_weights(want, n, 501);
            int same = 1;
            for (size_t i = 0; i < n; i++) same &= d[i] == f32_to_bf16(want[i]);
            CHECK_R(same, "bf16 weights after a failed broadcast", RANK);
            free(want);
        }
    } else {
        version = 1;
        CHECK_R(dist_bcast_weights_bf16(ctx, w, d, 4, &version, 1, NULL) == MOERL_ERR &&
                    strstr(moerl_last_error(), "bucket_bytes"),
                "bucket_bytes < 2 rejected: %s", RANK, moerl_last_error());
        CHECK_R(dist_bcast_weights_bf16(ctx, NULL, d, 4, &version, 16, NULL) == MOERL_ERR &&
                    strstr(moerl_last_error(), "src"),
                "src NULL rejected: %s", RANK, moerl_last_error());
    }
    free(w);
    free(d);
}

/* ---------------- point-to-point, small collectives, role errors ---------------- */

static void fill_msg(unsigned char *b, size_t len, int src, int k) {
    for (size_t i = 0; i < len; i++) b[i] = (unsigned char)(i * 31 + (size_t)src * 7 + (size_t)k * 13);
}

static void test_p2p(void) {
    dist_ctx *ctx = g_ctx;
    const int P = ctx->world_size, me = ctx->world_rank;
    const size_t lens[4] = {0, 1, 1000, 300000};
    unsigned char *out = xmalloc(300000), *want = xmalloc(300000);
    for (int k = 0; k < 4; k++) {
        const int dst = (me + 1) % P, from = (me - 1 + P) % P;
        fill_msg(out, lens[k], me, k);
        void *in = NULL;
        size_t len = 0;
        int src = -1, rs, rr;
        /* even ranks send first, odd ranks receive first: a ring of large blocking sends cannot deadlock */
        if (me % 2 == 0 || P == 1) {
            rs = dist_send_msg(ctx, dst, 10 + k, out, lens[k]);
            rr = dist_recv_msg_any(ctx, 10 + k, &src, &in, &len);
        } else {
            rr = dist_recv_msg_any(ctx, 10 + k, &src, &in, &len);
            rs = dist_send_msg(ctx, dst, 10 + k, out, lens[k]);
        }
        CHECK_R(rs == MOERL_OK && rr == MOERL_OK, "ring %zu bytes: %s", RANK, lens[k], moerl_last_error());
        fill_msg(want, lens[k], from, k);
        CHECK_R(in && src == from && len == lens[k] && memcmp(in, want, len) == 0,
                "ring message of %zu bytes from %d (got %zu bytes from %d)", RANK, lens[k], from, len, src);
        free(in);
    }
    /* round trip: rank 0 sends 64 KiB to the last rank, which echoes it back under another tag */
    if (P > 1 && (me == 0 || me == P - 1)) {
        fill_msg(out, 65536, 0, 9);
        void *in = NULL;
        size_t len = 0;
        int src = -1;
        if (me == 0) {
            CHECK_R(dist_send_msg(ctx, P - 1, 20, out, 65536) == MOERL_OK &&
                        dist_recv_msg_any(ctx, 21, &src, &in, &len) == MOERL_OK,
                    "round trip: %s", RANK, moerl_last_error());
            CHECK_R(src == P - 1 && len == 65536 && memcmp(in, out, len) == 0, "echo comes back intact", RANK);
        } else {
            CHECK_R(dist_recv_msg_any(ctx, 20, &src, &in, &len) == MOERL_OK && src == 0 &&
                        dist_send_msg(ctx, 0, 21, in, len) == MOERL_OK,
                    "echo: %s", RANK, moerl_last_error());
        }
        free(in);
    }
    /* probe: rank 0 sends tag 7 to the last rank, which sees it waiting and not under tag 8 */
    const int dst = P - 1;
    if (me == 0) {
        const char msg[] = "sample batch 1";
        CHECK_R(dist_send_msg(ctx, dst, 7, msg, sizeof msg) == MOERL_OK, "send tag 7", RANK);
        if (P == 1) CHECK_R(dist_send_msg(ctx, dst, 9, msg, 3) == MOERL_OK, "send tag 9", RANK);
    }
    if (me == dst) {
        int seen = 0;
        for (int i = 0; i < 200000 && !(seen = dist_iprobe(ctx, 7)); i++) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
        CHECK_R(seen == 1, "iprobe sees the waiting message", RANK);
        CHECK_R(dist_iprobe(ctx, 8) == 0, "iprobe ignores other tags", RANK);
        void *in;
        size_t len;
        int src;
        if (P == 1) { /* tag matching out of arrival order */
            CHECK_R(dist_recv_msg_any(ctx, 9, &src, &in, &len) == MOERL_OK && len == 3, "tag 9 first", RANK);
            free(in);
        }
        CHECK_R(dist_recv_msg_any(ctx, 7, &src, &in, &len) == MOERL_OK && src == 0 && len == 15 &&
                    !strcmp(in, "sample batch 1"),
                "probed message received", RANK);
        free(in);
        CHECK_R(dist_iprobe(ctx, 7) == 0, "nothing left under tag 7", RANK);
    }
    CHECK_R(dist_send_msg(ctx, P, 1, out, 1) == MOERL_ERR && strstr(moerl_last_error(), "destination"),
            "bad destination: %s", RANK, moerl_last_error());
    CHECK_R(dist_send_msg(ctx, 0, -1, out, 1) == MOERL_ERR && strstr(moerl_last_error(), "tag"), "negative tag", RANK);
    CHECK_R(dist_send_msg(ctx, 0, 40000, out, 1) == MOERL_ERR, "tag over 32767", RANK);
    CHECK_R(dist_iprobe(ctx, -3) == -1, "iprobe bad tag", RANK);
    free(out);
    free(want);
    CHECK_R(dist_barrier(ctx, DIST_WORLD) == MOERL_OK, "barrier", RANK);
}

static void test_collectives(void) {
    dist_ctx *ctx = g_ctx;
    const int P = ctx->world_size;
    double v[2] = {ctx->world_rank + 1.0, 0.5};
    CHECK_R(dist_allreduce_sum(ctx, DIST_WORLD, v, 2) == MOERL_OK && v[0] == P * (P + 1) / 2.0 && v[1] == 0.5 * P,
            "allreduce over the world: %g %g", RANK, v[0], v[1]);
    CHECK_R(dist_split_roles(ctx, 1) == MOERL_OK, "split", RANK);
    double t = 1;
    if (ctx->trainer_rank >= 0)
        CHECK_R(dist_allreduce_sum(ctx, DIST_TRAINERS, &t, 1) == MOERL_OK && t == 1, "allreduce over 1 trainer",
                RANK);
    else
        CHECK_R(dist_allreduce_sum(ctx, DIST_TRAINERS, &t, 1) == MOERL_ERR && strstr(moerl_last_error(), "not in"),
                "rollout rank is not in the trainer group: %s", RANK, moerl_last_error());
    double s = 1;
    CHECK_R(dist_allreduce_sum(ctx, DIST_SYNC, &s, 1) == MOERL_OK && s == ctx->sync_size, "allreduce over sync",
            RANK);
    /* role-split errors reach every rank, and the previous split survives them */
    CHECK_R(dist_split_roles(ctx, 0) == MOERL_ERR && strstr(moerl_last_error(), "n_trainers"), "0 trainers: %s", RANK,
            moerl_last_error());
    CHECK_R(dist_split_roles(ctx, P + 1) == MOERL_ERR, "more trainers than ranks", RANK);
    if (P >= 3) {
        CHECK_R(dist_split_roles(ctx, ctx->world_rank == 0 ? 1 : 2) == MOERL_ERR &&
                    strstr(moerl_last_error(), "disagree"),
                "ranks disagreeing on n_trainers: %s", RANK, moerl_last_error());
    }
    CHECK_R(ctx->n_trainers == 1 && dist_barrier(ctx, DIST_SYNC) == MOERL_OK, "previous split intact", RANK);
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx) {
        fprintf(stderr, "test_dist: dist_init: %s\n", moerl_last_error());
        return 1;
    }
    if (argc == 3 && !strcmp(argv[1], "--fatal")) {
        const int victim = atoi(argv[2]);
        if (g_ctx->world_rank == victim) moerl_fatal("deliberate failure on rank %d (test_dist --fatal)", victim);
        dist_barrier(g_ctx, DIST_WORLD); /* never completes: only MPI_Abort ends the others */
        fprintf(stderr, "test_dist: rank %d passed a barrier its peer never entered\n", g_ctx->world_rank);
        return 1;
    }
    if (g_ctx->world_rank == 0)
        printf("test_dist: backend %s, %d rank(s)\n", dist_backend_name(), g_ctx->world_size);
    {   /* before dist_split_roles: group operations are refused */
        moe_config c = small_config(0);
        moe_model m;
        MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
        CHECK_R(dist_reducer_new(g_ctx, &m, 1.0, DIST_OVERLAP_OFF) == NULL &&
                    strstr(moerl_last_error(), "dist_split_roles"),
                "reducer before the split: %s", RANK, moerl_last_error());
        CHECK_R(dist_barrier(g_ctx, DIST_TRAINERS) == MOERL_ERR, "trainer barrier before the split", RANK);
        model_free(&m);
    }
    test_plan();
    test_reducer();
    test_bcast();
    test_bf16_rounding();
    test_bcast_bf16();
    test_p2p();
    test_collectives();
    return dist_test_finish(g_ctx);
}
