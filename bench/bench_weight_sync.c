/* bench_weight_sync — weight broadcast (dist_bcast_weights, and dist_bcast_weights_bf16 for rollout.dtype
 * bf16) from trainer rank 0 to the rollout ranks: time and achieved bandwidth vs model size, bucket size
 * and wire dtype, against a plain memcpy of the fp32 weights measured on the root in the same run (the
 * one-machine ceiling: a broadcast over shared memory moves every byte at least once more than memcpy
 * does). The fp32 and the bf16 broadcast of the same fp32 weights run back to back in every
 * repetition; vs_fp32 is the median over repetitions of fp32 time / bf16 time. The bf16 time includes
 * the root's rounding (bucket by bucket, overlapped with the sends); a bucket is bucket_bytes of wire
 * bytes for both dtypes (so bf16 has half as many).
 *
 * Run under mpirun with ≥ 2 ranks (the last rank is the trainer, the others roll out), e.g.
 *   mpirun --oversubscribe -np 2 build/mpi/bench/bench_weight_sync
 * (bench/run_dist.sh sets the Open MPI container variables and prints the command). The time of one
 * broadcast is the slowest sync-group member's wall time of the call (header, check, payload), after a
 * barrier; reported are the median and min–max over --reps repetitions after one warm-up.
 * Bandwidth = payload bytes / time (what every rollout rank receives). The peer: right before each
 * broadcast the root memcpys the same bytes between two distinct pre-touched buffers; memcpy_ms is the
 * median copy time and vs_memcpy the median over repetitions of memcpy_time / broadcast_time (the
 * broadcast's share of memcpy bandwidth — GB/s counts wire bytes, vs_memcpy the time; pairing each broadcast with its own copy keeps the ratio
 * meaningful on a machine whose load changes during the run).
 *
 * Usage: bench_weight_sync [--reps R] [--sizes-mb a,b,c] [--buckets-kb x,y,...] [--dtype fp32|bf16|both]
 * (bucket 0 = whole buffer in one MPI_Bcast). Defaults: sizes 4,32,128 MiB; buckets 64 KiB, 1 MiB,
 * 16 MiB, whole; both dtypes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"
#include "bench_util.h"


static int parse_list(const char *s, double *out, int cap) {
    int n = 0;
    char *end;
    while (*s && n < cap) {
        out[n++] = strtod(s, &end);
        if (end == s || out[n - 1] < 0) return -1;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    dist_ctx *ctx = dist_init(&argc, &argv);
    if (!ctx) {
        fprintf(stderr, "bench_weight_sync: %s\n", moerl_last_error());
        return 1;
    }
    int reps = 9, dtypes = 3; /* bit 0: fp32, bit 1: bf16 */
    double sizes[16] = {4, 32, 128}, buckets[16] = {64, 1024, 16384, 0};
    int n_sizes = 3, n_buckets = 4;
    for (int a = 1; a < argc; a++) {
        if (a + 1 >= argc) goto usage;
        if (!strcmp(argv[a], "--reps")) reps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--sizes-mb")) n_sizes = parse_list(argv[++a], sizes, 16);
        else if (!strcmp(argv[a], "--buckets-kb")) n_buckets = parse_list(argv[++a], buckets, 16);
        else if (!strcmp(argv[a], "--dtype")) {
            const char *v = argv[++a];
            dtypes = !strcmp(v, "fp32") ? 1 : !strcmp(v, "bf16") ? 2 : !strcmp(v, "both") ? 3 : 0;
            if (!dtypes) goto usage;
        }
        else goto usage;
    }
    if (reps < 1 || n_sizes < 1 || n_buckets < 1) goto usage;
    if (ctx->world_size < 2) {
        printf("bench_weight_sync: backend %s with %d rank: needs >= 2 ranks (one trainer, rollout ranks); run it "
               "under mpirun (bench/run_dist.sh)\n",
               dist_backend_name(), ctx->world_size);
        dist_finalize(ctx);
        return 0;
    }
    if (dist_split_roles(ctx, 1) != MOERL_OK) {
        fprintf(stderr, "bench_weight_sync: %s\n", moerl_last_error());
        return 1;
    }
    const int root = ctx->sync_rank == 0, S = ctx->sync_size;
    if (root)
        printf("bench_weight_sync: backend %s, 1 trainer -> %d rollout rank(s), %d reps (median [min max]); "
               "time = slowest member; size = fp32 model bytes (bf16 moves half)\n",
               dist_backend_name(), S - 1, reps);
    if (root)
        printf("%9s %9s %5s %8s %10s %10s %10s %10s %8s %10s %9s %8s\n", "size_MiB", "bucket", "dtype", "buckets",
               "wire_MiB", "bcast_ms", "min_ms", "max_ms", "GB/s", "memcpy_ms", "vs_memcpy", "vs_fp32");
    for (int si = 0; si < n_sizes; si++) {
        const size_t bytes = (size_t)(sizes[si] * 1048576.0);
        const size_t n = bytes / sizeof(float);
        float *w = xalloc_aligned(n * sizeof(float)), *dst = root ? xalloc_aligned(n * sizeof(float)) : NULL;
        uint16_t *w16 = root ? NULL : xalloc_aligned(n * sizeof(uint16_t) + 64);
        for (size_t i = 0; i < n; i++) w[i] = (float)(i % 1000) * 0.001f;
        if (root) memcpy(dst, w, n * sizeof(float)); /* fault the pages in */
        else memset(w16, 0, n * sizeof(uint16_t));
        for (int bi = 0; bi < n_buckets; bi++) {
            const size_t bucket_bytes = buckets[bi] > 0 ? (size_t)(buckets[bi] * 1024.0) : n * sizeof(float);
            /* per dtype d (0 fp32, 1 bf16): broadcast times, memcpy peer, per-rep ratios */
            double *t[2], *ratio[2], *vs32 = xmalloc(reps * sizeof(double)), *mc = xmalloc(reps * sizeof(double));
            for (int d = 0; d < 2; d++) t[d] = xmalloc(reps * sizeof(double)), ratio[d] = xmalloc(reps * sizeof(double));
            double *slot = xmalloc((size_t)S * sizeof(double));
            int nb[2] = {0, 0};
            size_t wire[2] = {0, 0};
            for (int r = -1; r < reps; r++) {
                /* the memcpy peer right before each pair of broadcasts, so all see the same machine load */
                double tm = 0, worst[2] = {0, 0};
                if (root) {
                    const double t0 = moerl_now();
                    memcpy(dst, w, n * sizeof(float));
                    tm = moerl_now() - t0;
                }
                for (int d = 0; d < 2; d++) {
                    if (!(dtypes & (1 << d))) continue;
                    dist_barrier(ctx, DIST_SYNC);
                    int version = root ? r + 10 : 0;
                    dist_xfer_stats st;
                    /* bf16: the root rounds its fp32 weights bucket by bucket (ring), rollout ranks receive bf16
                     * (wire bytes per bucket are bucket_bytes in both cases) */
                    const int rc = d == 0 ? dist_bcast_weights(ctx, w, n, &version, bucket_bytes, &st)
                                          : dist_bcast_weights_bf16(ctx, w, w16, n, &version,
                                                                    buckets[bi] > 0 ? bucket_bytes : n * 2, &st);
                    if (rc != MOERL_OK) {
                        fprintf(stderr, "bench_weight_sync: %s\n", moerl_last_error());
                        dist_abort(ctx, "broadcast failed");
                    }
                    memset(slot, 0, (size_t)S * sizeof(double));
                    slot[ctx->sync_rank] = st.seconds;
                    dist_allreduce_sum(ctx, DIST_SYNC, slot, S);
                    for (int k = 0; k < S; k++) worst[d] = fmax(worst[d], slot[k]);
                    if (r >= 0) {
                        t[d][r] = worst[d];
                        ratio[d][r] = tm / worst[d];
                    }
                    nb[d] = st.n_buckets;
                    wire[d] = st.bytes;
                }
                if (r >= 0) {
                    mc[r] = tm;
                    vs32[r] = worst[1] > 0 ? worst[0] / worst[1] : 0;
                }
            }
            bench_sort(mc, reps);
            bench_sort(vs32, reps);
            for (int d = 0; d < 2; d++) {
                if (!(dtypes & (1 << d))) continue;
                bench_sort(t[d], reps);
                bench_sort(ratio[d], reps);
                const double med = t[d][reps / 2];
                if (root) {
                    char bl[32], vs[16];
                    if (buckets[bi] > 0) snprintf(bl, sizeof bl, "%.0fKiB", buckets[bi]);
                    else snprintf(bl, sizeof bl, "whole");
                    if (d == 1 && (dtypes & 1)) snprintf(vs, sizeof vs, "%.2fx", vs32[reps / 2]);
                    else snprintf(vs, sizeof vs, "-");
                    printf("%9.1f %9s %5s %8d %10.1f %10.3f %10.3f %10.3f %8.2f %10.3f %9.2f %8s\n", sizes[si], bl,
                           d ? "bf16" : "fp32", nb[d], wire[d] / 1048576.0, 1e3 * med, 1e3 * t[d][0],
                           1e3 * t[d][reps - 1], wire[d] / med / 1e9, 1e3 * mc[reps / 2], ratio[d][reps / 2], vs);
                }
                free(t[d]);
                free(ratio[d]);
            }
            free(mc);
            free(vs32);
            free(slot);
        }
        free(w);
        free(w16);
        free(dst);
    }
    dist_finalize(ctx);
    return 0;
usage:
    if (ctx->world_rank == 0)
        fprintf(stderr, "usage: bench_weight_sync [--reps R>=1] [--sizes-mb a,b,...] [--buckets-kb x,y,... (0 = "
                        "whole)] [--dtype fp32|bf16|both]\n");
    dist_finalize(ctx);
    return 2;
}
