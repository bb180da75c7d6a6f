/* Trainer sub-groups (dist_comm, src/dist) and the model-parallel grid (src/parallel/grid.c).
 * Runs on the local backend (one process: groups of one, copies) and under mpirun -np 4
 * (tests/e2e_mpi.sh). Every collective is checked against the value computed independently from the
 * rank numbers; the byte counters against their documented formulas; the grid's layout (pp 2 × sp 2,
 * fsdp 2, ep 2 at 4 ranks) against grid.h's rank order; configuration errors name the key.
 * A check counts once (tests/dist_test.h). */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"
#include "parallel/grid.h"
#include "dist_test.h"
#include "test.h"

static float val(int rank, size_t i) { return (float)(rank * 1000 + (int)i); }

static void test_collectives(dist_ctx *ctx) {
    dist_comm *c = dist_comm_split(ctx, 0, ctx->trainer_rank);
    CHECK(c != NULL, "split: %s", moerl_last_error());
    const int P = dist_comm_size(c), r = dist_comm_rank(c);
    CHECK(P == ctx->trainer_size && r == ctx->trainer_rank, "size %d rank %d", P, r);
    const size_t n = 5;
    float *send = xmalloc(P * n * sizeof(float)), *recv = xmalloc(P * n * sizeof(float));
    for (size_t i = 0; i < n; i++) send[i] = val(r, i);
    CHECK(dist_comm_allgather_f32(c, send, n, recv) == MOERL_OK, "allgather");
    int ok = 1;
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < n; i++) ok &= recv[q * n + i] == val(q, i);
    CHECK(ok, "allgather values");
    CHECK(dist_comm_bytes(c, DIST_OP_ALLGATHER) == (double)(P - 1) * n * 4, "allgather bytes %g",
          dist_comm_bytes(c, DIST_OP_ALLGATHER));
    /* reduce-scatter: rank r's chunk q holds val(r, q·n+i); the result on q is Σ_r val(r, q·n+i) */
    for (size_t i = 0; i < P * n; i++) send[i] = val(r, i);
    CHECK(dist_comm_reduce_scatter_f32(c, send, recv, n) == MOERL_OK, "reduce-scatter");
    ok = 1;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < P; q++) want += val(q, r * n + i);
        ok &= recv[i] == want;
    }
    CHECK(ok, "reduce-scatter values");
    /* nonblocking versions give the same */
    float *recv2 = xmalloc(P * n * sizeof(float));
    dist_req *rq = dist_comm_ireduce_scatter_f32(c, send, recv2, n);
    CHECK(rq && dist_wait(rq) == MOERL_OK && !memcmp(recv, recv2, n * sizeof(float)), "ireduce-scatter");
    for (size_t i = 0; i < n; i++) send[i] = val(r, i);
    rq = dist_comm_iallgather_f32(c, send, n, recv2);
    CHECK(rq && dist_wait(rq) == MOERL_OK, "iallgather");
    ok = 1;
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < n; i++) ok &= recv2[q * n + i] == val(q, i);
    CHECK(ok, "iallgather values");
    /* all-to-all: r's chunk q = val(r, q) repeated → on q, chunk r = val(r, q) */
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < n; i++) send[q * n + i] = val(r, q) + (float)i / 8;
    CHECK(dist_comm_alltoall_f32(c, send, n, recv) == MOERL_OK, "alltoall");
    ok = 1;
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < n; i++) ok &= recv[q * n + i] == val(q, r) + (float)i / 8;
    CHECK(ok, "alltoall values");
    /* all-to-all-v: r sends (r + q) % 3 floats to q */
    size_t *sc = xcalloc(4 * P, sizeof(size_t)), *sd = sc + P, *rc = sc + 2 * P, *rd = sc + 3 * P, st = 0, rt = 0;
    for (int q = 0; q < P; q++) {
        sc[q] = (r + q) % 3, sd[q] = st, st += sc[q];
        rc[q] = (q + r) % 3, rd[q] = rt, rt += rc[q];
    }
    float *vs = xmalloc((st + 1) * sizeof(float)), *vr = xmalloc((rt + 1) * sizeof(float));
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < sc[q]; i++) vs[sd[q] + i] = val(r, 10 * q + i);
    CHECK(dist_comm_alltoallv_f32(c, vs, sc, sd, vr, rc, rd) == MOERL_OK, "alltoallv");
    ok = 1;
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < rc[q]; i++) ok &= vr[rd[q] + i] == val(q, 10 * r + i);
    CHECK(ok, "alltoallv values");
    double f64[2] = {r, 1};
    float f32[2] = {(float)r, 1};
    CHECK(dist_comm_allreduce_f64(c, f64, 2) == MOERL_OK && f64[0] == P * (P - 1) / 2.0 && f64[1] == P,
          "allreduce f64");
    CHECK(dist_comm_allreduce_f32(c, f32, 2) == MOERL_OK && f32[0] == P * (P - 1) / 2.0f && f32[1] == P,
          "allreduce f32");
    /* ring point-to-point */
    if (P > 1) {
        float out[3] = {(float)r, 1, 2}, in[3] = {0};
        dist_req *rr = dist_comm_irecv_f32(c, (r + P - 1) % P, 7, in, 3);
        dist_req *rs = dist_comm_isend_f32(c, (r + 1) % P, 7, out, 3);
        CHECK(dist_wait(rs) == MOERL_OK && dist_wait(rr) == MOERL_OK && in[0] == (float)((r + P - 1) % P),
              "p2p ring");
        CHECK(dist_comm_bytes(c, DIST_OP_P2P) == 12, "p2p bytes");
        CHECK(dist_comm_isend_f32(c, r, 7, out, 3) == NULL && strstr(moerl_last_error(), "peer"),
              "send to itself refused");
    } else {
        CHECK(dist_comm_bytes(c, DIST_OP_ALLGATHER) == 0, "a group of one moves nothing");
        CHECK(dist_comm_isend_f32(c, 0, 7, send, 1) == NULL, "p2p in a group of one is an error");
    }
    free(vs), free(vr), free(sc), free(send), free(recv), free(recv2);
    dist_comm_free(c);
}

static void test_grid(dist_ctx *ctx) {
    cfg *c = cfg_new();
    par_def_keys(c);
    par_config pc;
    CHECK(par_read_keys(c, &pc) == MOERL_OK, "defaults");
    const int T = ctx->trainer_size;
    CHECK(par_check(&pc, T, 8, 4, 2, 4) == MOERL_OK, "all ones fit %s", moerl_last_error());
    cfg_apply_override(c, "actor.moe.dispatcher=alltoallw");
    CHECK(par_read_keys(c, &pc) == MOERL_ERR && strstr(moerl_last_error(), "actor.moe.dispatcher"), "bad dispatcher");
    cfg_apply_override(c, "actor.moe.dispatcher=auto");
    pc.ulysses_sequence_parallel_size = 3;
    CHECK(par_check(&pc, 6, 8, 6, 2, 4) == MOERL_ERR && strstr(moerl_last_error(), "key/value"), "GQA sp 3 vs nkv 2");
    pc.ulysses_sequence_parallel_size = 1, pc.expert_parallel_size = 3;
    CHECK(par_check(&pc, 3, 8, 4, 2, 4) == MOERL_ERR && strstr(moerl_last_error(), "experts"), "ep 3 vs 8 experts");
    pc.expert_parallel_size = 1, pc.pipeline_parallel_size = 5;
    CHECK(par_check(&pc, 5, 8, 4, 2, 4) == MOERL_ERR && strstr(moerl_last_error(), "layers"), "pp 5 vs 4 layers");
    if (T == 4) {
        par_config q;
        par_read_keys(c, &q);
        q.pipeline_parallel_size = 2, q.ulysses_sequence_parallel_size = 2, q.fsdp_size = 2;
        q.expert_parallel_size = 2;
        par_grid g;
        CHECK(par_grid_init(&g, ctx, &q, 8, 4, 2, 4) == MOERL_OK, "grid: %s", moerl_last_error());
        const int t = ctx->trainer_rank;
        CHECK(g.D == 2 && g.stage == t / 2 && g.sp_rank == t % 2 && g.dp == 1, "layout t=%d", t);
        CHECK(dist_comm_size(g.pp_comm) == 2 && dist_comm_rank(g.pp_comm) == g.stage, "pp group");
        CHECK(dist_comm_size(g.sp_comm) == 2 && dist_comm_size(g.dp_comm) == 1, "sp / dp groups");
        CHECK(dist_comm_size(g.fsdp_comm) == 2 && dist_comm_size(g.replica_comm) == 1, "fsdp / replica groups");
        CHECK(par_dispatcher(&g) == MOE_DISPATCH_ALLTOALL, "auto: ep 2 ≤ 16 → alltoall");
        /* the pp group of rank t joins t and t ± 2: allgather the trainer ranks */
        float me = (float)t, both[2];
        dist_comm_allgather_f32(g.pp_comm, &me, 1, both);
        CHECK(both[0] == (float)(t % 2) && both[1] == (float)(t % 2 + 2), "pp members %g %g", both[0], both[1]);
        g.cfg.alltoall_max_ep = 1;
        CHECK(par_dispatcher(&g) == MOE_DISPATCH_ALLTOALLV, "auto above the threshold → alltoallv");
        par_grid_free(&g);
    }
    cfg_free(c);
}

int main(int argc, char **argv) {
    dist_ctx *ctx = dist_init(&argc, &argv);
    if (!ctx || dist_split_roles(ctx, ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_comm: %s\n", moerl_last_error());
        return 1;
    }
    test_collectives(ctx);
    test_grid(ctx);
    return dist_test_finish(ctx);
}
