/* Open MPI implementation of dist.h — the only moerl file that includes mpi.h.
 *
 * Communicators (all made at dist_init / dist_split_roles, errors returned to MPI_CHECK):
 *   world    dup of MPI_COMM_WORLD: barrier / allreduce over DIST_WORLD, role splitting
 *   p2p      dup of MPI_COMM_WORLD: point-to-point messages only (ranks = world ranks)
 *   trainer  the last n_trainers world ranks (data-parallel group)
 *   sync     trainer rank 0 (key 0 → rank 0) + every rollout rank: weight broadcast
 *   each gradient reducer dups trainer once, so its nonblocking collectives never interleave with
 *   collectives the trainer loop issues on trainer meanwhile.
 * This Open MPI has no asynchronous progress thread: a nonblocking collective only advances while
 * some thread of the rank is inside MPI, hence the reducer's communication thread (or the POLL mode's
 * tests between layers).
 */
#ifdef MOERL_MPI
#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "base/common.h"
#include "base/log.h"
#include "base/pool.h"
#include "dist/dist.h"
#include "dist/compress.h"

#define DIST_TAG_MAX 32767 /* the MPI standard guarantees MPI_TAG_UB >= 32767 */

struct dist_impl {
    MPI_Comm world, p2p, trainer, sync, rollout;
    uint16_t *bf16_ring; /* the root's bf16 staging slots (dist_bcast_weights_bf16), kept between calls */
    size_t bf16_ring_cap; /* its capacity in values */
    char *sink_ring;     /* a receiving rank's slots (dist_recv_weights_stream), kept between calls */
    size_t sink_ring_cap; /* its capacity in bytes */
};

/* The abort hook has no argument for a context; these two identify the rank in its message. */
static int g_rank = -1, g_size = 0;

/* Checked wrapper target: print the call site and MPI's error string, then end the whole job. */
static void mpi_fail(int rc, const char *call, const char *file, int line) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error code %d", rc);
    fprintf(stderr, "moerl[rank %d]: MPI error at %s:%d: %s (in %s)\n", g_rank, file, line, s, call);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}
#define MPI_CHECK(call)                                                     \
    do {                                                                    \
        const int rc_ = (call);                                             \
        if (rc_ != MPI_SUCCESS) mpi_fail(rc_, #call, __FILE__, __LINE__);   \
    } while (0)

static void abort_hook(int code) {
    fprintf(stderr, "moerl[rank %d]: fatal error on this rank (message above); MPI_Abort ends all %d ranks\n", g_rank,
            g_size);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
}

const char *dist_backend_name(void) { return "mpi"; }

dist_ctx *dist_init(int *argc, char ***argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) {
        moerl_errorf("dist_init: MPI is already initialised (call dist_init once per process)");
        return NULL;
    }
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        moerl_errorf("dist_init: MPI_Init_thread failed");
        return NULL;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_size));
    if (provided < MPI_THREAD_MULTIPLE) {
        moerl_errorf("dist_init: the MPI library provides thread level %d, moerl needs MPI_THREAD_MULTIPLE (%d) for "
                     "its communication thread (use an MPI built with thread-multiple support)",
                     provided, MPI_THREAD_MULTIPLE);
        MPI_Finalize();
        return NULL;
    }
    moerl_set_abort_hook(abort_hook);
    if (g_size > 1) log_set_rank(g_rank, g_rank == 0); /* rank 0 prints the lines every rank logs alike */
    dist_ctx *c = xcalloc(1, sizeof *c);
    c->world_rank = g_rank;
    c->world_size = g_size;
    c->role = DIST_ROLE_UNSET;
    c->trainer_rank = c->sync_rank = -1;
    c->impl = xcalloc(1, sizeof *c->impl);
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c->impl->world));
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c->impl->p2p));
    c->impl->trainer = c->impl->sync = c->impl->rollout = MPI_COMM_NULL;
    return c;
}

static void free_role_comms(dist_ctx *ctx) {
    if (ctx->impl->trainer != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&ctx->impl->trainer));
    if (ctx->impl->sync != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&ctx->impl->sync));
    if (ctx->impl->rollout != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&ctx->impl->rollout));
}

void dist_finalize(dist_ctx *ctx) {
    if (!ctx) return;
    free_role_comms(ctx);
    MPI_CHECK(MPI_Comm_free(&ctx->impl->world));
    MPI_CHECK(MPI_Comm_free(&ctx->impl->p2p));
    free(ctx->impl->bf16_ring);
    free(ctx->impl->sink_ring);
    free(ctx->impl);
    free(ctx);
    moerl_set_abort_hook(NULL);
    MPI_Finalize();
}

int dist_split_roles(dist_ctx *ctx, int n_trainers) {
    const int P = ctx->world_size, me = ctx->world_rank;
    /* every rank must pass the same value: compare the max of n and of −n over the world */
    int v[2] = {n_trainers, -n_trainers};
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MAX, ctx->impl->world));
    if (v[0] != -v[1])
        return moerl_errorf("dist_split_roles: ranks disagree on n_trainers (values from %d to %d; this rank %d "
                            "passed %d)",
                            -v[1], v[0], me, n_trainers);
    if (P == 1 && n_trainers != 1)
        return moerl_errorf("dist_split_roles: world size 1 (embedded) needs n_trainers = 1, got %d", n_trainers);
    if (n_trainers < 1 || n_trainers > P)
        return moerl_errorf("dist_split_roles: n_trainers = %d outside [1, %d] for a world of %d ranks (1..%d for an "
                            "RL job with rollout ranks, %d for training only)",
                            n_trainers, P, P, P - 1, P);
    free_role_comms(ctx);
    const int first = P - n_trainers, is_trainer = me >= first, in_sync = !is_trainer || me == first;
    MPI_CHECK(MPI_Comm_split(ctx->impl->world, is_trainer ? 0 : MPI_UNDEFINED, me, &ctx->impl->trainer));
    /* key 0 for trainer rank 0 puts it at sync rank 0 (the root); rollout ranks follow in world order */
    MPI_CHECK(MPI_Comm_split(ctx->impl->world, in_sync ? 0 : MPI_UNDEFINED, me == first ? 0 : me + 1,
                             &ctx->impl->sync));
    MPI_CHECK(MPI_Comm_split(ctx->impl->world, is_trainer || P == 1 ? MPI_UNDEFINED : 0, me, &ctx->impl->rollout));
    ctx->n_trainers = n_trainers;
    ctx->n_rollout = P == 1 ? 1 : P - n_trainers;
    ctx->first_trainer = first;
    ctx->role = P == 1 ? DIST_ROLE_EMBEDDED : is_trainer ? DIST_ROLE_TRAINER : DIST_ROLE_ROLLOUT;
    ctx->trainer_rank = ctx->sync_rank = -1;
    ctx->trainer_size = ctx->sync_size = 0;
    if (is_trainer) {
        MPI_CHECK(MPI_Comm_rank(ctx->impl->trainer, &ctx->trainer_rank));
        MPI_CHECK(MPI_Comm_size(ctx->impl->trainer, &ctx->trainer_size));
    }
    if (in_sync) {
        MPI_CHECK(MPI_Comm_rank(ctx->impl->sync, &ctx->sync_rank));
        MPI_CHECK(MPI_Comm_size(ctx->impl->sync, &ctx->sync_size));
    }
    return MOERL_OK;
}

/* The communicator of group g for this rank, or MPI_COMM_NULL with an error message. */
static MPI_Comm group_comm(dist_ctx *ctx, dist_group g, const char *fn) {
    if (g == DIST_WORLD) return ctx->impl->world;
    if (g != DIST_TRAINERS && g != DIST_SYNC) {
        moerl_errorf("%s: unknown group %d", fn, (int)g);
        return MPI_COMM_NULL;
    }
    if (ctx->role == DIST_ROLE_UNSET) {
        moerl_errorf("%s: call dist_split_roles first", fn);
        return MPI_COMM_NULL;
    }
    MPI_Comm c = g == DIST_TRAINERS ? ctx->impl->trainer : ctx->impl->sync;
    if (c == MPI_COMM_NULL)
        moerl_errorf("%s: world rank %d is not in the %s group", fn, ctx->world_rank,
                     g == DIST_TRAINERS ? "trainer" : "weight-sync");
    return c;
}

int dist_barrier(dist_ctx *ctx, dist_group g) {
    MPI_Comm c = group_comm(ctx, g, "dist_barrier");
    if (c == MPI_COMM_NULL) return MOERL_ERR;
    MPI_CHECK(MPI_Barrier(c));
    return MOERL_OK;
}

int dist_allreduce_sum(dist_ctx *ctx, dist_group g, double *buf, int n) {
    MPI_Comm c = group_comm(ctx, g, "dist_allreduce_sum");
    if (c == MPI_COMM_NULL) return MOERL_ERR;
    if (n < 0 || (n > 0 && !buf)) return moerl_errorf("dist_allreduce_sum: bad buffer (n = %d)", n);
    if (n == 0) return MOERL_OK;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, c));
    return MOERL_OK;
}

void dist_abort(dist_ctx *ctx, const char *msg) {
    fprintf(stderr, "moerl[rank %d]: abort: %s\n", ctx ? ctx->world_rank : g_rank, msg ? msg : "");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* ---- weight broadcast ---- */

/* Buckets in flight at once (MPI_Ibcast, waited oldest first): small buckets then pipeline instead of
 * paying one full broadcast latency each (bench_weight_sync: 64 KiB buckets of a 4 MiB buffer went
 * from 0.89 ms with one at a time to 0.54 ms with 16). */
#define BCAST_WINDOW 16

/* bf16 staging on the root: ring slots of one bucket each, at most this many bytes in all (but at
 * least 2 slots, so rounding the next bucket overlaps the broadcast of the last). */
#define BF16_RING_BYTES ((size_t)64 << 20)
/* Values rounded between two progress tests of the broadcasts in flight (512 KiB of bf16). */
#define BF16_ROUND_CHUNK 262144

/* The header of a weight broadcast: the root makes it (version, n, bucket values, dtype), every
 * rank receives it and checks it, and all agree whether to go on. Returns MOERL_ERR on every rank
 * when any refused (the message names the refusing rank), else fills *h. */
static int bcast_header(dist_ctx *ctx, dist_wdtype dt, const char *fn, size_t n, const int *version,
                        size_t bucket_bytes, size_t esz, int bad_args, int root_bad, dist_weight_header *h) {
    const int root = ctx->sync_rank == 0;
    if (root) {
        const size_t bv = MOERL_MIN(bucket_bytes / esz, (size_t)1 << 30); /* MPI counts are int */
        dist_weight_header_make(h, version ? *version : 0, n, root_bad ? 0 : bv, dt);
    }
    MPI_Comm c = ctx->impl->sync;
    MPI_CHECK(MPI_Bcast(h, (int)sizeof *h, MPI_BYTE, 0, c));
    /* flag[0]: somebody refused; flag[1]: highest refusing rollout world rank */
    int flag[2] = {root_bad, -1};
    int my_err = 0;
    if (!root) {
        if (bad_args) {
            moerl_errorf("%s (rollout rank %d): need %s (n = %zu) and version", fn, ctx->world_rank,
                         dt == DIST_WDTYPE_F32 ? "params" : "dst", n);
            my_err = 1;
        } else if (dist_weight_header_check(h, n, dt) != MOERL_OK) {
            my_err = 1;
        }
        if (my_err) flag[0] = 1, flag[1] = ctx->world_rank;
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flag, 2, MPI_INT, MPI_MAX, c));
    if (flag[0]) {
        if (root && !root_bad)
            moerl_errorf("weight broadcast of policy version %d aborted: rollout rank(s) rejected the header (highest "
                         "rejecting world rank %d; see its error message)",
                         *version, flag[1]);
        else if (!root && !my_err)
            moerl_errorf("weight broadcast aborted: world rank %d rejected the header", flag[1]);
        return MOERL_ERR;
    }
    return MOERL_OK;
}

/* A rollout rank's receive into a sink: a ring of at most BCAST_WINDOW buckets of bv values (esz
 * bytes each, n in all); each bucket is handed to sink in order as it completes. Every broadcast is
 * waited for on return. Returns the sink's first error (the receive goes on to the end). */
static int bcast_to_sink(dist_ctx *ctx, dist_wdtype dt, size_t n, size_t bv, size_t esz, dist_weight_sink sink,
                         void *sink_arg) {
    const size_t nb_total = n ? (n + bv - 1) / bv : 0;
    MPI_Comm c = ctx->impl->sync;
    MPI_Request win[BCAST_WINDOW];
    int nb = 0, sink_rc = MOERL_OK;
    const MPI_Datatype ty = dt == DIST_WDTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT;
    /* at most BF16_RING_BYTES in flight (2 slots at least), a slot no larger than the payload, and the
     * ring kept between calls: a fresh 16 × 64 MiB ring zeroed every sync cost 70 ms on a 1 MB model */
    int window = (int)MOERL_MIN((size_t)BCAST_WINDOW, MOERL_MAX((size_t)2, BF16_RING_BYTES / (bv * esz)));
    window = (int)MOERL_MIN((size_t)window, MOERL_MAX(nb_total, (size_t)1));
    struct dist_impl *I = ctx->impl;
    const size_t ring_bytes = (size_t)window * MOERL_MIN(bv, MOERL_MAX(n, (size_t)1)) * esz;
    if (I->sink_ring_cap < ring_bytes) {
        free(I->sink_ring);
        I->sink_ring_cap = ring_bytes;
        I->sink_ring = xalloc_aligned(ring_bytes);
    }
    char *ring = I->sink_ring;
    for (size_t off = 0;; off += bv, nb++) {
        if (nb >= window) { /* the oldest bucket in flight: wait, hand over, reuse its slot */
            const int k = nb - window;
            const size_t o = (size_t)k * bv;
            MPI_CHECK(MPI_Wait(&win[k % window], MPI_STATUS_IGNORE));
            if (sink_rc == MOERL_OK)
                sink_rc = sink(sink_arg, o, ring + (size_t)(k % window) * bv * esz, MOERL_MIN(bv, n - o));
        }
        if (off >= n) { /* drain: the last window - 1 buckets */
            if (nb - window + 1 >= (int)nb_total) break;
            continue;
        }
        MPI_CHECK(MPI_Ibcast(ring + (size_t)(nb % window) * bv * esz, (int)MOERL_MIN(bv, n - off), ty, 0, c,
                             &win[nb % window]));
    }
    return sink_rc;
}

/* The bf16 root: round each bucket of src[n] (bv values) into dst (when given) or a ring slot, then
 * broadcast it; at most BCAST_WINDOW slots in flight. Every broadcast is waited for on return.
 * Returns the buckets sent. */
static int bcast_bf16_root(dist_ctx *ctx, const float *src, uint16_t *dst, size_t n, size_t bv) {
    const size_t esz = sizeof(uint16_t), nb_total = n ? (n + bv - 1) / bv : 0;
    MPI_Comm c = ctx->impl->sync;
    MPI_Request win[BCAST_WINDOW];
    int nb = 0;
    int slots = (int)MOERL_MIN((size_t)BCAST_WINDOW, MOERL_MAX((size_t)2, BF16_RING_BYTES / (bv * esz)));
    slots = (int)MOERL_MIN((size_t)slots, MOERL_MAX(nb_total, (size_t)1));
    /* a slot is rewritten only after its previous broadcast completed */
    uint16_t *ring = NULL;
    if (!dst) { /* kept between calls: fresh pages every sync would cost a fault per 4 KiB */
        struct dist_impl *I = ctx->impl;
        if (I->bf16_ring_cap < (size_t)slots * bv) {
            free(I->bf16_ring);
            I->bf16_ring_cap = (size_t)slots * bv;
            I->bf16_ring = xalloc_aligned(I->bf16_ring_cap * esz);
        }
        ring = I->bf16_ring;
    }
    int oldest = 0; /* first bucket whose broadcast may still be in flight */
    for (size_t off = 0; off < n; off += bv, nb++) {
        const size_t cnt = MOERL_MIN(bv, n - off);
        if (nb >= slots) MPI_CHECK(MPI_Wait(&win[nb % slots], MPI_STATUS_IGNORE));
        oldest = MOERL_MAX(oldest, nb - slots + 1);
        uint16_t *b = dst ? dst + off : ring + (size_t)(nb % slots) * bv;
        /* Round in chunks and test the oldest broadcast in flight between them: Open MPI moves a
         * nonblocking broadcast only inside MPI calls, so without the tests the rollout ranks would
         * wait for the whole rounding of this bucket before receiving the previous one. */
        for (size_t k = 0; k < cnt; k += BF16_ROUND_CHUNK) {
            dist_f32_to_bf16(b + k, src + off + k, MOERL_MIN((size_t)BF16_ROUND_CHUNK, cnt - k));
            while (oldest < nb) {
                int done = 0;
                MPI_CHECK(MPI_Test(&win[oldest % slots], &done, MPI_STATUS_IGNORE));
                if (!done) break;
                oldest++;
            }
        }
        MPI_CHECK(MPI_Ibcast(b, (int)cnt, MPI_UINT16_T, 0, c, &win[nb % slots]));
    }
    for (int i = MOERL_MAX(0, nb - slots); i < nb; i++) MPI_CHECK(MPI_Wait(&win[i % slots], MPI_STATUS_IGNORE));
    return nb;
}

/* Straight broadcasts of ptr[n] (elements of type ty, esz bytes) in buckets of bv, at most
 * BCAST_WINDOW in flight; every broadcast is waited for on return. Returns the buckets. */
static int bcast_plain(dist_ctx *ctx, void *ptr, MPI_Datatype ty, size_t esz, size_t n, size_t bv) {
    MPI_Comm c = ctx->impl->sync;
    MPI_Request win[BCAST_WINDOW];
    int nb = 0;
    for (size_t off = 0; off < n; off += bv, nb++) {
        if (nb >= BCAST_WINDOW) MPI_CHECK(MPI_Wait(&win[nb % BCAST_WINDOW], MPI_STATUS_IGNORE));
        MPI_CHECK(MPI_Ibcast((char *)ptr + off * esz, (int)MOERL_MIN(bv, n - off), ty, 0, c, &win[nb % BCAST_WINDOW]));
    }
    for (int i = MOERL_MAX(0, nb - BCAST_WINDOW); i < nb; i++)
        MPI_CHECK(MPI_Wait(&win[i % BCAST_WINDOW], MPI_STATUS_IGNORE));
    return nb;
}

/* The broadcast of dist_bcast_weights (dtype F32: buf = params, in and out) and
 * dist_bcast_weights_bf16 (dtype BF16: src read on the root, dst written where given). */
static int bcast_weights(dist_ctx *ctx, dist_wdtype dt, float *buf, const float *src, uint16_t *dst, size_t n,
                         int *version, size_t bucket_bytes, dist_xfer_stats *st, dist_weight_sink sink,
                         void *sink_arg) {
    const char *fn = sink ? "dist_recv_weights_stream"
                          : dt == DIST_WDTYPE_BF16 ? "dist_bcast_weights_bf16" : "dist_bcast_weights";
    const size_t esz = dt == DIST_WDTYPE_BF16 ? sizeof(uint16_t) : sizeof(float);
    if (st) memset(st, 0, sizeof *st);
    if (ctx->role == DIST_ROLE_UNSET) return moerl_errorf("%s: call dist_split_roles first", fn);
    if (ctx->sync_rank < 0) return MOERL_OK; /* trainer ranks other than 0 take no part */
    const double t0 = moerl_now();
    const int root = ctx->sync_rank == 0;
    if (sink && root)
        return moerl_errorf("%s: the root (trainer rank 0) sends; only a rollout rank receives into a sink", fn);
    const int have = n == 0 || sink || (dt == DIST_WDTYPE_F32 ? buf != NULL : root ? src != NULL : dst != NULL);
    const int bad_args = !have || !version;
    const int root_bad = root && (bad_args || bucket_bytes < esz);
    if (root_bad)
        moerl_errorf("%s (root): need %s (n = %zu), version and bucket_bytes >= %zu (got %zu)", fn,
                     dt == DIST_WDTYPE_F32 ? "params" : "src", n, esz, bucket_bytes);
    if (ctx->sync_size == 1) { /* nobody to send to; a bf16 root with dst rounds into it */
        if (root_bad) return MOERL_ERR;
        if (dt == DIST_WDTYPE_BF16 && dst && n) dist_f32_to_bf16(dst, src, n);
        if (st) st->seconds = moerl_now() - t0;
        return MOERL_OK;
    }
    dist_weight_header h;
    if (bcast_header(ctx, dt, fn, n, version, bucket_bytes, esz, bad_args, root_bad, &h) != MOERL_OK) return MOERL_ERR;
    const size_t bv = (size_t)h.bucket_values;
    int nb, sink_rc = MOERL_OK;
    if (sink) {
        sink_rc = bcast_to_sink(ctx, dt, n, bv, esz, sink, sink_arg);
        nb = n ? (int)((n + bv - 1) / bv) : 0;
    } else if (dt == DIST_WDTYPE_F32) {
        nb = bcast_plain(ctx, buf, MPI_FLOAT, esz, n, bv);
    } else if (!root) { /* straight into dst */
        nb = bcast_plain(ctx, dst, MPI_UINT16_T, esz, n, bv);
    } else {
        nb = bcast_bf16_root(ctx, src, dst, n, bv);
    }
    if (!root) *version = h.version;
    if (st) {
        st->bytes = n * esz;
        st->seconds = moerl_now() - t0;
        st->n_buckets = nb;
    }
    return sink_rc;
}

int dist_bcast_weights(dist_ctx *ctx, float *params, size_t n, int *version, size_t bucket_bytes,
                       dist_xfer_stats *st) {
    return bcast_weights(ctx, DIST_WDTYPE_F32, params, NULL, NULL, n, version, bucket_bytes, st, NULL, NULL);
}

int dist_bcast_weights_bf16(dist_ctx *ctx, const float *src, uint16_t *dst, size_t n, int *version,
                            size_t bucket_bytes, dist_xfer_stats *st) {
    return bcast_weights(ctx, DIST_WDTYPE_BF16, NULL, src, dst, n, version, bucket_bytes, st, NULL, NULL);
}

int dist_recv_weights_stream(dist_ctx *ctx, dist_wdtype dtype, size_t n, int *version, dist_weight_sink sink,
                             void *arg, dist_xfer_stats *st) {
    if (!sink) return moerl_errorf("dist_recv_weights_stream: sink must not be NULL");
    if (dtype != DIST_WDTYPE_F32 && dtype != DIST_WDTYPE_BF16)
        return moerl_errorf("dist_recv_weights_stream: dtype %d is not fp32 or bf16", (int)dtype);
    return bcast_weights(ctx, dtype, NULL, NULL, NULL, n, version, 0, st, sink, arg);
}

/* ---- point-to-point ---- */

static int check_tag(int tag, const char *fn) {
    if (tag < 0 || tag > DIST_TAG_MAX) return moerl_errorf("%s: tag %d outside [0, %d]", fn, tag, DIST_TAG_MAX);
    return MOERL_OK;
}

int dist_send_msg(dist_ctx *ctx, int dst, int tag, const void *buf, size_t len) {
    if (dst < 0 || dst >= ctx->world_size)
        return moerl_errorf("dist_send_msg: destination rank %d outside [0, %d)", dst, ctx->world_size);
    if (check_tag(tag, "dist_send_msg") != MOERL_OK) return MOERL_ERR;
    if (len > (size_t)INT_MAX) return moerl_errorf("dist_send_msg: %zu bytes exceed INT_MAX", len);
    if (len > 0 && !buf) return moerl_errorf("dist_send_msg: NULL buffer for %zu bytes", len);
    MPI_CHECK(MPI_Send(buf, (int)len, MPI_BYTE, dst, tag, ctx->impl->p2p));
    return MOERL_OK;
}

/* Sleep `us` microseconds (short waits between polls). */
static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int dist_recv_msg_any(dist_ctx *ctx, int tag, int *src, void **buf, size_t *len) {
    if (check_tag(tag, "dist_recv_msg_any") != MOERL_OK) return MOERL_ERR;
    MPI_Message msg;
    MPI_Status status;
    /* Matched probe (safe with several receiving threads). Poll with a growing sleep (≤ 200 µs)
     * instead of a blocking MPI_Mprobe, which spins a core for as long as nothing arrives; a waiting
     * trainer would otherwise steal a core from the rollout ranks on the same machine. */
    long wait_us = 0;
    for (;;) {
        int found = 0;
        MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, tag, ctx->impl->p2p, &found, &msg, &status));
        if (found) break;
        if (wait_us) sleep_us(wait_us);
        else sched_yield();
        wait_us = MOERL_MIN(200, wait_us + 10);
    }
    int count = 0;
    MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
    void *p = xmalloc(count ? (size_t)count : 1);
    MPI_CHECK(MPI_Mrecv(p, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
    if (src) *src = status.MPI_SOURCE;
    *buf = p;
    *len = (size_t)count;
    return MOERL_OK;
}

int dist_iprobe(dist_ctx *ctx, int tag) {
    if (check_tag(tag, "dist_iprobe") != MOERL_OK) return -1;
    int found = 0;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, tag, ctx->impl->p2p, &found, MPI_STATUS_IGNORE));
    return found;
}

/* ---- gradient reducer ---- */

/* While buckets are in flight and backward still runs, the communication thread tests them every
 * POLL_US microseconds (sleeping in between leaves the cores to backward); while dist_reducer_finish
 * waits it polls continuously (the main thread is idle then). bench_dist_reduce (2 ranks, 4 MiB
 * buckets, layered backward, a loaded 2-core machine with ~2× noise) swept 0 (spin) / 20 / 50 / 200 /
 * 1000 µs: exposed 10 / 31 / 6 / 22 / 68 ms. 1000 µs is clearly too slow; 50 µs was kept as the best
 * of the rest that does not spin a core. */
#ifndef POLL_US
#define POLL_US 50
#endif

struct dist_grad_reducer {
    const moe_model *m;
    MPI_Comm comm; /* private dup of trainer_comm (MPI_COMM_NULL when the group has one rank) */
    float *grads;
    int n_buckets;
    dist_bucket *b;
    dist_overlap overlap;
    float scale;
    int done_group;      /* lowest backward group marked final this step (L+1: none) */
    MPI_Request *req;    /* [n_buckets] */
    /* step state; in THREAD mode read and written under mu */
    int n_ready;         /* buckets complete (a prefix of b[]) */
    int n_issued;        /* buckets whose allreduce was started */
    int n_completed;     /* buckets reduced and scaled */
    int finishing, stop;
    int has_thread;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    /* compression (dist_reducer_set_compression) */
    int comp, comp_warmup, comp_chunk;
    int64_t steps;       /* finished steps */
    float *resid;        /* [n_params] error-feedback residual */
    unsigned char *sendbuf, *recvbuf;
    int *lens, *displs;  /* [trainer_size] */
    int world;           /* ranks in comm */
    double bytes_sent, bytes_raw, last_sent, last_raw;
};

static void scale_bucket(dist_grad_reducer *r, int i) {
    if (r->scale == 1.0f) return;
    float *g = r->grads + r->b[i].offset;
    const float s = r->scale;
    for (size_t j = 0; j < r->b[i].n; j++) g[j] *= s;
}

/* The compressed exchange of bucket i (blocking; in THREAD mode it runs on the communication thread,
 * overlapped with backward): compress with error feedback, all-gather the sizes and the payloads,
 * sum every rank's decompressed payload into the bucket. The request stays MPI_REQUEST_NULL. */
static void exchange_compressed(dist_grad_reducer *r, int i) {
    float *g = r->grads + r->b[i].offset;
    const size_t n = r->b[i].n;
    const size_t len = compress_bucket((grad_compression)r->comp, g, r->resid + r->b[i].offset, n, r->comp_chunk,
                                       r->sendbuf);
    const int ilen = (int)len;
    MPI_CHECK(MPI_Allgather(&ilen, 1, MPI_INT, r->lens, 1, MPI_INT, r->comm));
    size_t total = 0;
    for (int d = 0; d < r->world; d++) {
        r->displs[d] = (int)total;
        total += (size_t)r->lens[d];
    }
    MPI_CHECK(MPI_Allgatherv(r->sendbuf, ilen, MPI_BYTE, r->recvbuf, r->lens, r->displs, MPI_BYTE, r->comm));
    memset(g, 0, n * sizeof(float));
    for (int d = 0; d < r->world; d++)
        if (decompress_add((grad_compression)r->comp, r->recvbuf + r->displs[d], (size_t)r->lens[d], g, n) != MOERL_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "compressed gradient from trainer rank %d: %s", d, moerl_last_error());
            moerl_fatal("%s", msg);
        }
    r->bytes_sent += (double)len;
    r->bytes_raw += (double)n * 4.0;
}

static void issue_bucket(dist_grad_reducer *r, int i) {
    if (r->comp && r->steps >= r->comp_warmup) {
        exchange_compressed(r, i);
        return;
    }
    r->bytes_sent += (double)r->b[i].n * 4.0;
    r->bytes_raw += (double)r->b[i].n * 4.0;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, r->grads + r->b[i].offset, (int)r->b[i].n, MPI_FLOAT, MPI_SUM, r->comm,
                             &r->req[i]));
}

/* Test buckets in issue order from `completed` on; scale and count those done. Each MPI_Test runs
 * Open MPI's progress engine, which advances every outstanding collective. Returns the new count. */
static int test_buckets(dist_grad_reducer *r, int completed, int issued) {
    while (completed < issued) {
        int done = 0;
        MPI_CHECK(MPI_Test(&r->req[completed], &done, MPI_STATUS_IGNORE));
        if (!done) break;
        scale_bucket(r, completed);
        completed++;
    }
    return completed;
}

/* Advance n_ready to cover every bucket whose lowest group is already final. */
static void update_ready(dist_grad_reducer *r) {
    while (r->n_ready < r->n_buckets && r->b[r->n_ready].group >= r->done_group) r->n_ready++;
}

static void *comm_thread_main(void *arg) {
    dist_grad_reducer *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->n_issued == r->n_ready && r->n_completed == r->n_issued)
            pthread_cond_wait(&r->cv_work, &r->mu);
        if (r->stop) break;
        const int ready = r->n_ready;
        int issued = r->n_issued, completed = r->n_completed;
        pthread_mutex_unlock(&r->mu);
        for (; issued < ready; issued++) issue_bucket(r, issued);
        const int before = completed;
        completed = test_buckets(r, completed, issued);
        pthread_mutex_lock(&r->mu);
        r->n_issued = issued;
        r->n_completed = completed;
        if (completed == r->n_buckets) pthread_cond_broadcast(&r->cv_done);
        if (completed == before && completed < issued && r->n_ready == issued) {
            if (r->finishing) {
                pthread_mutex_unlock(&r->mu);
                sched_yield();
                pthread_mutex_lock(&r->mu);
            } else {
                /* nothing advanced and nothing new: sleep POLL_US or until new buckets are ready */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += POLL_US * 1000L;
                if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
                pthread_cond_timedwait(&r->cv_work, &r->mu, &ts);
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

struct dist_comm; /* defined with the sub-group functions below */
static MPI_Comm comm_of(const struct dist_comm *c);
static int comm_size_of(const struct dist_comm *c);

static dist_grad_reducer *reducer_new(dist_ctx *ctx, const struct dist_comm *group, const moe_model *m,
                                      double bucket_mb, dist_overlap overlap);

dist_grad_reducer *dist_reducer_new(dist_ctx *ctx, const moe_model *m, double bucket_mb, dist_overlap overlap) {
    return reducer_new(ctx, NULL, m, bucket_mb, overlap);
}

dist_grad_reducer *dist_reducer_new_on(dist_ctx *ctx, const struct dist_comm *group, const moe_model *m,
                                       double bucket_mb, dist_overlap overlap) {
    if (!group) {
        moerl_errorf("dist_reducer_new_on: no group given");
        return NULL;
    }
    return reducer_new(ctx, group, m, bucket_mb, overlap);
}

static dist_grad_reducer *reducer_new(dist_ctx *ctx, const struct dist_comm *group, const moe_model *m,
                                      double bucket_mb, dist_overlap overlap) {
    if (ctx->role == DIST_ROLE_UNSET) {
        moerl_errorf("dist_reducer_new: call dist_split_roles first");
        return NULL;
    }
    if (ctx->trainer_rank < 0) {
        moerl_errorf("dist_reducer_new: world rank %d is a rollout rank, not a trainer", ctx->world_rank);
        return NULL;
    }
    if (!m->grads) {
        moerl_errorf("dist_reducer_new: the model has no gradient buffer (model_init_inference?)");
        return NULL;
    }
    if (!(bucket_mb > 0) || !isfinite(bucket_mb)) {
        moerl_errorf("dist_reducer_new: bucket_mb must be a positive number of MiB, got %g", bucket_mb);
        return NULL;
    }
    if (overlap != DIST_OVERLAP_OFF && overlap != DIST_OVERLAP_THREAD && overlap != DIST_OVERLAP_POLL) {
        moerl_errorf("dist_reducer_new: unknown overlap mode %d", (int)overlap);
        return NULL;
    }
    const size_t cap = (size_t)MOERL_MAX(1.0, bucket_mb * 1048576.0);
    int nb = 0;
    dist_bucket *b = dist_plan_buckets(m, MOERL_MIN(DIST_FIRST_BUCKET_BYTES, cap), cap, &nb);
    if (!b) return NULL;
    for (int i = 0; i < nb; i++)
        if (b[i].n > (size_t)INT_MAX) {
            moerl_errorf("dist_reducer_new: bucket %d (tensors %s..%s) holds %zu floats, over MPI's int count", i,
                         m->tensors[b[i].hi_tensor].name, m->tensors[b[i].lo_tensor].name, b[i].n);
            free(b);
            return NULL;
        }
    dist_grad_reducer *r = xcalloc(1, sizeof *r);
    r->m = m;
    r->grads = m->grads;
    r->n_buckets = nb;
    r->b = b;
    r->overlap = overlap;
    r->scale = 1.0f;
    r->done_group = m->cfg.num_hidden_layers + 1;
    r->req = xcalloc((size_t)(nb ? nb : 1), sizeof *r->req);
    for (int i = 0; i < nb; i++) r->req[i] = MPI_REQUEST_NULL;
    r->comm = MPI_COMM_NULL;
    if (group ? comm_size_of(group) > 1 : ctx->trainer_size > 1) {
        MPI_CHECK(MPI_Comm_dup(group ? comm_of(group) : ctx->impl->trainer, &r->comm));
        if (overlap == DIST_OVERLAP_THREAD) {
            pthread_mutex_init(&r->mu, NULL);
            pthread_cond_init(&r->cv_work, NULL);
            pthread_cond_init(&r->cv_done, NULL);
            if (pthread_create(&r->thread, NULL, comm_thread_main, r) != 0) {
                moerl_errorf("dist_reducer_new: cannot start the communication thread");
                MPI_CHECK(MPI_Comm_free(&r->comm));
                free(r->req);
                free(r->b);
                free(r);
                return NULL;
            }
            r->has_thread = 1;
        }
    }
    return r;
}

void dist_reducer_set_scale(dist_grad_reducer *r, float s) { r->scale = s; }

int dist_reducer_layer_done(dist_grad_reducer *r, int group) {
    const int L = r->m->cfg.num_hidden_layers;
    if (group < -1 || group > L)
        return moerl_errorf("dist_reducer_layer_done: group %d outside [-1, %d]", group, L);
    if (group >= r->done_group) return MOERL_OK;
    if (r->has_thread) {
        pthread_mutex_lock(&r->mu);
        r->done_group = group;
        const int before = r->n_ready;
        update_ready(r);
        if (r->n_ready != before) pthread_cond_signal(&r->cv_work);
        pthread_mutex_unlock(&r->mu);
        return MOERL_OK;
    }
    r->done_group = group;
    update_ready(r);
    if (r->comm != MPI_COMM_NULL && r->overlap == DIST_OVERLAP_POLL) {
        for (; r->n_issued < r->n_ready; r->n_issued++) issue_bucket(r, r->n_issued);
        r->n_completed = test_buckets(r, r->n_completed, r->n_issued);
    }
    return MOERL_OK;
}

double dist_reducer_finish(dist_grad_reducer *r) {
    const double t0 = moerl_now();
    const int nb = r->n_buckets;
    if (r->has_thread) {
        pthread_mutex_lock(&r->mu);
        r->done_group = -1;
        update_ready(r);
        r->finishing = 1;
        pthread_cond_signal(&r->cv_work);
        while (r->n_completed < nb) pthread_cond_wait(&r->cv_done, &r->mu);
        r->finishing = 0;
        r->n_ready = r->n_issued = r->n_completed = 0;
        r->done_group = r->m->cfg.num_hidden_layers + 1;
        r->steps++;
        r->last_sent = r->bytes_sent;
        r->last_raw = r->bytes_raw;
        r->bytes_sent = r->bytes_raw = 0;
        pthread_mutex_unlock(&r->mu);
        return moerl_now() - t0;
    }
    r->done_group = -1;
    update_ready(r);
    if (r->comm == MPI_COMM_NULL) { /* one trainer: the sum is the gradient itself */
        for (int i = 0; i < nb; i++) scale_bucket(r, i);
    } else if (r->overlap == DIST_OVERLAP_OFF) {
        /* blocking, bucket by bucket; the same MPI_Iallreduce algorithm as the overlapped modes, so the
         * sums are bit-identical between modes (a blocking MPI_Allreduce may pick another algorithm
         * and summation order) */
        for (int i = 0; i < nb; i++) {
            issue_bucket(r, i);
            MPI_CHECK(MPI_Wait(&r->req[i], MPI_STATUS_IGNORE));
            scale_bucket(r, i);
        }
    } else {
        for (; r->n_issued < nb; r->n_issued++) issue_bucket(r, r->n_issued);
        for (; r->n_completed < nb; r->n_completed++) {
            MPI_CHECK(MPI_Wait(&r->req[r->n_completed], MPI_STATUS_IGNORE));
            scale_bucket(r, r->n_completed);
        }
    }
    r->n_ready = r->n_issued = r->n_completed = 0;
    r->done_group = r->m->cfg.num_hidden_layers + 1;
    r->steps++;
    r->last_sent = r->bytes_sent;
    r->last_raw = r->bytes_raw;
    r->bytes_sent = r->bytes_raw = 0;
    return moerl_now() - t0;
}

void dist_reducer_free(dist_grad_reducer *r) {
    if (!r) return;
    if (r->has_thread) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_signal(&r->cv_work);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv_work);
        pthread_cond_destroy(&r->cv_done);
    }
    if (r->comm != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&r->comm));
    moerl_buf_free(r->resid);
    moerl_buf_free(r->sendbuf);
    moerl_buf_free(r->recvbuf);
    free(r->lens);
    free(r->displs);
    free(r->req);
    free(r->b);
    free(r);
}

void dist_reducer_set_compression(dist_grad_reducer *r, int mode, int warmup_steps, int chunk) {
    if (mode == GRAD_COMPRESSION_NONE || r->comm == MPI_COMM_NULL) return; /* exact, or nothing to send */
    MOERL_ASSERT(chunk > 0 && warmup_steps >= 0 && r->resid == NULL);
    r->comp = mode;
    r->comp_warmup = warmup_steps;
    r->comp_chunk = chunk;
    MPI_CHECK(MPI_Comm_size(r->comm, &r->world));
    size_t maxn = 0;
    for (int i = 0; i < r->n_buckets; i++) maxn = MOERL_MAX(maxn, r->b[i].n);
    const size_t cap = compress_max_bytes((grad_compression)mode, maxn, chunk);
    if (cap * (size_t)r->world > (size_t)INT_MAX)
        moerl_fatal("compressed bucket payloads of %zu bytes × %d ranks exceed MPI's int count: lower actor.grad_bucket_mb",
                    cap, r->world);
    r->resid = moerl_buf_alloc(r->m->n_params * sizeof(float), "grad_residual");
    r->sendbuf = moerl_buf_alloc(cap, "grad_comp_send");
    r->recvbuf = moerl_buf_alloc(cap * (size_t)r->world, "grad_comp_recv");
    r->lens = xcalloc((size_t)r->world, sizeof(int));
    r->displs = xcalloc((size_t)r->world, sizeof(int));
}

void dist_reducer_last_bytes(const dist_grad_reducer *r, double *sent, double *raw) {
    *sent = r->last_sent;
    *raw = r->last_raw;
}

int dist_reducer_n_buckets(const dist_grad_reducer *r) { return r->n_buckets; }
const dist_bucket *dist_reducer_buckets(const dist_grad_reducer *r) { return r->b; }
/* ------------------------------------------------------------------ trainer sub-groups */

struct dist_comm {
    MPI_Comm comm;
    int rank, size;
    double bytes[DIST_OP_COUNT];
};

struct dist_req {
    MPI_Request req;
};

/* A sub-group of `parent` (MPI_COMM_NULL: this rank is not in it; `who` names the parent). */
static dist_comm *comm_split_of(dist_ctx *ctx, MPI_Comm parent, const char *fn, const char *who, int color, int key) {
    if (parent == MPI_COMM_NULL) {
        moerl_errorf("%s: this rank (world %d) is not a %s (or roles are not split)", fn, ctx->world_rank, who);
        return NULL;
    }
    if (color < 0) {
        moerl_errorf("%s: color %d, expected ≥ 0", fn, color);
        return NULL;
    }
    dist_comm *c = xcalloc(1, sizeof *c);
    MPI_CHECK(MPI_Comm_split(parent, color, key, &c->comm));
    MPI_CHECK(MPI_Comm_rank(c->comm, &c->rank));
    MPI_CHECK(MPI_Comm_size(c->comm, &c->size));
    return c;
}

dist_comm *dist_comm_split_rollout(dist_ctx *ctx, int color, int key) {
    return comm_split_of(ctx, ctx->impl->rollout, "dist_comm_split_rollout", "rollout rank", color, key);
}

dist_comm *dist_comm_split(dist_ctx *ctx, int color, int key) {
    return comm_split_of(ctx, ctx->impl->trainer, "dist_comm_split", "trainer", color, key);
}

void dist_comm_free(dist_comm *c) {
    if (!c) return;
    MPI_CHECK(MPI_Comm_free(&c->comm));
    free(c);
}

int dist_comm_rank(const dist_comm *c) { return c->rank; }
static MPI_Comm comm_of(const struct dist_comm *c) { return c->comm; }
static int comm_size_of(const struct dist_comm *c) { return c->size; }
int dist_comm_size(const dist_comm *c) { return c->size; }
double dist_comm_bytes(const dist_comm *c, dist_op op) { return op >= 0 && op < DIST_OP_COUNT ? c->bytes[op] : 0.0; }
void dist_comm_reset_bytes(dist_comm *c) { memset(c->bytes, 0, sizeof c->bytes); }

/* Count n elements (or P·n for the gathered side) against MPI's int counts. */
static int comm_count_ok(const char *fn, size_t n, int P, const void *a, const void *b) {
    if ((double)n * (double)P > (double)INT_MAX)
        return moerl_errorf("%s: %zu elements × %d ranks exceed MPI's int count (%d)", fn, n, P, INT_MAX);
    if (n > 0 && (!a || !b)) return moerl_errorf("%s: NULL buffer with %zu elements", fn, n);
    return MOERL_OK;
}

int dist_comm_barrier(dist_comm *c) {
    MPI_CHECK(MPI_Barrier(c->comm));
    return MOERL_OK;
}

int dist_comm_allreduce_f32(dist_comm *c, float *buf, size_t n) {
    if (comm_count_ok("dist_comm_allreduce_f32", n, 1, buf, buf) != MOERL_OK) return MOERL_ERR;
    if (c->size == 1 || n == 0) return MOERL_OK;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->comm));
    c->bytes[DIST_OP_ALLREDUCE] += 2.0 * (c->size - 1) / c->size * (double)n * 4;
    return MOERL_OK;
}

int dist_comm_allreduce_f64(dist_comm *c, double *buf, size_t n) {
    if (comm_count_ok("dist_comm_allreduce_f64", n, 1, buf, buf) != MOERL_OK) return MOERL_ERR;
    if (c->size == 1 || n == 0) return MOERL_OK;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, c->comm));
    c->bytes[DIST_OP_ALLREDUCE] += 2.0 * (c->size - 1) / c->size * (double)n * 8;
    return MOERL_OK;
}

int dist_comm_allgather_f32(dist_comm *c, const float *send, size_t n, float *recv) {
    if (comm_count_ok("dist_comm_allgather_f32", n, c->size, send, recv) != MOERL_OK) return MOERL_ERR;
    if (n == 0) return MOERL_OK;
    MPI_CHECK(MPI_Allgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, c->comm));
    c->bytes[DIST_OP_ALLGATHER] += (double)(c->size - 1) * n * 4;
    return MOERL_OK;
}

int dist_comm_reduce_scatter_f32(dist_comm *c, const float *send, float *recv, size_t n) {
    if (comm_count_ok("dist_comm_reduce_scatter_f32", n, c->size, send, recv) != MOERL_OK) return MOERL_ERR;
    if (n == 0) return MOERL_OK;
    MPI_CHECK(MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, c->comm));
    c->bytes[DIST_OP_REDUCE_SCATTER] += (double)(c->size - 1) * n * 4;
    return MOERL_OK;
}

int dist_comm_alltoall_f32(dist_comm *c, const float *send, size_t n, float *recv) {
    if (comm_count_ok("dist_comm_alltoall_f32", n, c->size, send, recv) != MOERL_OK) return MOERL_ERR;
    if (n == 0) return MOERL_OK;
    MPI_CHECK(MPI_Alltoall(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, c->comm));
    c->bytes[DIST_OP_ALLTOALL] += (double)(c->size - 1) * n * 4;
    return MOERL_OK;
}

int dist_comm_alltoall_i32(dist_comm *c, const int *send, size_t n, int *recv) {
    if (comm_count_ok("dist_comm_alltoall_i32", n, c->size, send, recv) != MOERL_OK) return MOERL_ERR;
    if (n == 0) return MOERL_OK;
    MPI_CHECK(MPI_Alltoall(send, (int)n, MPI_INT, recv, (int)n, MPI_INT, c->comm));
    c->bytes[DIST_OP_ALLTOALL] += (double)(c->size - 1) * n * 4;
    return MOERL_OK;
}

int dist_comm_alltoallv_f32(dist_comm *c, const float *send, const size_t *scounts, const size_t *sdispls,
                            float *recv, const size_t *rcounts, const size_t *rdispls) {
    const int P = c->size;
    int *sc = xmalloc(4 * (size_t)P * sizeof(int)), *sd = sc + P, *rc = sc + 2 * P, *rd = sc + 3 * P;
    double sent = 0;
    for (int q = 0; q < P; q++) {
        if (scounts[q] > INT_MAX || sdispls[q] > INT_MAX || rcounts[q] > INT_MAX || rdispls[q] > INT_MAX) {
            free(sc);
            return moerl_errorf("dist_comm_alltoallv_f32: a count or displacement for rank %d exceeds MPI's int", q);
        }
        sc[q] = (int)scounts[q], sd[q] = (int)sdispls[q], rc[q] = (int)rcounts[q], rd[q] = (int)rdispls[q];
        if (q != c->rank) sent += (double)scounts[q] * 4;
    }
    MPI_CHECK(MPI_Alltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, c->comm));
    c->bytes[DIST_OP_ALLTOALL] += sent;
    free(sc);
    return MOERL_OK;
}

dist_req *dist_comm_iallgather_f32(dist_comm *c, const float *send, size_t n, float *recv) {
    if (comm_count_ok("dist_comm_iallgather_f32", n, c->size, send, recv) != MOERL_OK) return NULL;
    dist_req *r = xcalloc(1, sizeof *r);
    MPI_CHECK(MPI_Iallgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, c->comm, &r->req));
    c->bytes[DIST_OP_ALLGATHER] += (double)(c->size - 1) * n * 4;
    return r;
}

dist_req *dist_comm_ireduce_scatter_f32(dist_comm *c, const float *send, float *recv, size_t n) {
    if (comm_count_ok("dist_comm_ireduce_scatter_f32", n, c->size, send, recv) != MOERL_OK) return NULL;
    dist_req *r = xcalloc(1, sizeof *r);
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, c->comm, &r->req));
    c->bytes[DIST_OP_REDUCE_SCATTER] += (double)(c->size - 1) * n * 4;
    return r;
}

static int p2p_ok(const char *fn, dist_comm *c, int peer, int tag, const void *buf, size_t n) {
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return moerl_errorf("%s: peer %d, expected another rank of the group [0,%d) (this rank is %d)", fn, peer,
                            c->size, c->rank);
    if (tag < 0 || tag > DIST_TAG_MAX) return moerl_errorf("%s: tag %d outside [0,%d]", fn, tag, DIST_TAG_MAX);
    return comm_count_ok(fn, n, 1, buf, buf);
}

dist_req *dist_comm_isend_f32(dist_comm *c, int peer, int tag, const float *buf, size_t n) {
    if (p2p_ok("dist_comm_isend_f32", c, peer, tag, buf, n) != MOERL_OK) return NULL;
    dist_req *r = xcalloc(1, sizeof *r);
    MPI_CHECK(MPI_Isend(buf, (int)n, MPI_FLOAT, peer, tag, c->comm, &r->req));
    c->bytes[DIST_OP_P2P] += (double)n * 4;
    return r;
}

dist_req *dist_comm_irecv_f32(dist_comm *c, int peer, int tag, float *buf, size_t n) {
    if (p2p_ok("dist_comm_irecv_f32", c, peer, tag, buf, n) != MOERL_OK) return NULL;
    dist_req *r = xcalloc(1, sizeof *r);
    MPI_CHECK(MPI_Irecv(buf, (int)n, MPI_FLOAT, peer, tag, c->comm, &r->req));
    return r;
}

int dist_wait(dist_req *r) {
    if (!r) return MOERL_OK;
    MPI_CHECK(MPI_Wait(&r->req, MPI_STATUS_IGNORE));
    free(r);
    return MOERL_OK;
}

void dist_comm_progress(dist_comm *c) {
    int flag = 0;
    if (c) MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c->comm, &flag, MPI_STATUS_IGNORE));
}

int dist_test(dist_req *r) {
    if (!r) return 1;
    int done = 0;
    MPI_CHECK(MPI_Test(&r->req, &done, MPI_STATUS_IGNORE));
    if (done) free(r);
    return done;
}
#endif /* MOERL_MPI */
