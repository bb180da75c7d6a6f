/* The rollout engine's layouts on the same ranks (issue 27, the Ascend practice's inference comparison): one
 * workload — R prompts, each generating N tokens (EOS ignored) — run on every rank of the world (mpirun -np P)
 * as
 *   dp  P replicas, each rank a whole engine on R/P of the prompts;
 *   tp  one replica split over the P ranks (rollout.tensor_model_parallel_size, engine_set_tp): every rank runs
 *       all R prompts on its slice, one all-reduce after attention and one after the MLP per layer;
 *   ep  P ranks each holding E/P experts (rollout.expert_parallel_size, engine_set_ep) and R/P of the prompts,
 *       every step's routed rows through the EP all-to-all (ranks without rows run the exchange idle).
 * The layouts run interleaved (round 1: dp tp ep, round 2: ..., so machine load drifts over all of them) and
 * each reports its wall time from a barrier to the last rank's end; tokens/s = R·N / wall. Rank 0 prints
 * every round and the medians, and the weights and KV bytes per rank of each layout.
 * Usage: mpirun -np P bench_dist_rollout_layouts [--rounds K] [--prompts R] [--tokens N] [--prompt-len L]
 *        [--seqs S] [model.key=value ...] (defaults: 3 rounds, 16 prompts, 32 tokens, prompt 16, max_num_seqs 16;
 *        model: hidden 256, 8 heads, 4 kv heads, 16 experts top-2, 4 layers, vocabulary 4096). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "dist/dist.h"
#include "model/model.h"
#include "model/model_config.h"
#include "parallel/ep.h"
#include "parallel/grid.h"
#include "parallel/tp.h"
#include "parallel/tp_rollout.h"
#include "rollout/engine.h"

enum { L_DP = 0, L_TP, L_EP, N_LAYOUTS };
static const char *layout_name[N_LAYOUTS] = {"dp", "tp", "ep"};

typedef struct {
    int rounds, prompts, tokens, prompt_len, seqs;
} bench_opts;

typedef struct {
    engine *e;
    tp_rollout *tp;
    ep_state *ep;
    par_grid g;
    int lo, hi;     /* this rank's prompts */
    double load_s;  /* the weights into the engine: dp a copy (engine_load_weights), tp / ep this rank's slice
                       taken from the whole vector (tp_slice_range / ep_slice_range, as a weight sync does) */
} layout;

static engine_config bench_ec(const bench_opts *o) {
    engine_config ec = {.max_num_seqs = o->seqs, .max_model_len = o->prompt_len + o->tokens + 1,
                        .max_num_batched_tokens = 256};
    return ec;
}

/* This rank's engine of layout k over comm (the world's rollout ranks). */
static void layout_build(int k, const moe_model *m, dist_comm *comm, const bench_opts *o, layout *L) {
    const int P = dist_comm_size(comm), q = dist_comm_rank(comm);
    memset(L, 0, sizeof *L);
    moe_config c = m->cfg;
    L->lo = k == L_TP ? 0 : o->prompts * q / P;
    L->hi = k == L_TP ? o->prompts : o->prompts * (q + 1) / P;
    if (k == L_DP) {
        L->e = engine_create(&c, bench_ec(o));
        const double t0 = moerl_now();
        MOERL_ASSERT(L->e && engine_load_weights(L->e, m->params, m->n_params, 0) == MOERL_OK);
        L->load_s = moerl_now() - t0;
        return;
    }
    if (k == L_TP) MOERL_ASSERT(tp_config_apply(&c, P, q, c.num_experts > 0) == MOERL_OK);
    else {
        par_grid *g = &L->g;
        g->cfg = (par_config){.fsdp_size = 1, .expert_parallel_size = P, .ulysses_sequence_parallel_size = 1,
                              .pipeline_parallel_size = 1, .alltoall_max_ep = 16, .capacity_factor = 1.25};
        g->ep = P;
        g->ep_rank = q;
        g->ep_comm = comm;
        g->T = g->D = g->dp = g->sp = g->pp = g->fsdp = g->replicas = 1;
        ep_config_apply(g, &c);
    }
    L->e = engine_create(&c, bench_ec(o));
    MOERL_ASSERT(L->e);
    const moe_model *loc = engine_model(L->e);
    float *buf = engine_weight_buffer(L->e);
    memset(buf, 0, loc->n_params * sizeof(float));
    const double t0 = moerl_now();
    const int rc = k == L_TP ? tp_slice_range(m, loc, 0, m->params, m->n_params, 4, buf)
                             : ep_slice_range(m, loc, 0, m->params, m->n_params, 4, buf);
    MOERL_ASSERT(rc == MOERL_OK);
    engine_set_version(L->e, 0);
    L->load_s = moerl_now() - t0;
    if (k == L_TP) {
        L->tp = tp_rollout_new(comm);
        MOERL_ASSERT(L->tp && engine_set_tp(L->e, L->tp) == MOERL_OK);
    } else {
        L->ep = ep_state_new(&L->g, &c, bench_ec(o).max_num_batched_tokens);
        MOERL_ASSERT(L->ep && engine_set_ep(L->e, L->ep) == MOERL_OK);
    }
}

static void layout_free(layout *L) {
    engine_free(L->e);
    tp_rollout_free(L->tp);
    ep_state_free(L->ep);
}

/* One timed run of layout L: its prompts to completion; under EP the group steps together. Returns the wall
 * seconds from the barrier to the last rank's end. */
static double layout_run(layout *L, dist_comm *comm, const bench_opts *o, int vocab) {
    const int n = L->hi - L->lo;
    gen_request *r = xcalloc((size_t)(n ? n : 1), sizeof *r);
    int *prompt = xmalloc((size_t)o->prompts * o->prompt_len * sizeof(int));
    for (int i = 0; i < o->prompts * o->prompt_len; i++) prompt[i] = (int)((i * 2654435761u) % (unsigned)vocab);
    for (int i = 0; i < n; i++) {
        r[i].id = L->lo + i;
        r[i].prompt = prompt + (size_t)(L->lo + i) * o->prompt_len;
        r[i].prompt_len = o->prompt_len;
        r[i].sp = (sampling_params){.temperature = 1.0f, .top_p = 1.0f, .seed = 7 + (uint64_t)(L->lo + i),
                                    .max_tokens = o->tokens, .ignore_eos = 1};
        MOERL_ASSERT(engine_add(L->e, &r[i]) == MOERL_OK);
    }
    gen_request **done = xmalloc(((size_t)o->seqs * 2 + 64) * sizeof *done);
    MOERL_ASSERT(dist_comm_barrier(comm) == MOERL_OK);
    const double t0 = moerl_now();
    for (;;) {
        float f = engine_num_unfinished(L->e) > 0;
        if (L->ep) MOERL_ASSERT(dist_comm_allreduce_f32(comm, &f, 1) == MOERL_OK); /* the EP group steps together */
        if (f == 0) break;
        if (engine_num_unfinished(L->e) > 0) MOERL_ASSERT(engine_step(L->e, done, o->seqs * 2 + 64) >= 0);
        else MOERL_ASSERT(engine_idle_step(L->e) == MOERL_OK);
    }
    double dt = moerl_now() - t0;
    MOERL_ASSERT(dist_comm_barrier(comm) == MOERL_OK);
    double mx = dt; /* the slowest rank's wall: the layout's */
    float all[64];
    float mine = (float)dt;
    if (dist_comm_size(comm) <= 64 && dist_comm_allgather_f32(comm, &mine, 1, all) == MOERL_OK)
        for (int q = 0; q < dist_comm_size(comm); q++) mx = all[q] > mx ? all[q] : mx;
    for (int i = 0; i < n; i++) {
        MOERL_ASSERT(r[i].n_out == o->tokens);
        gen_request_free_outputs(&r[i]);
    }
    free(done);
    free(prompt);
    free(r);
    return mx;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static moe_config bench_model(int argc, char **argv) {
    cfg *c = cfg_new();
    model_def_keys(c);
    const char *base[] = {"model.hidden_size=256", "model.intermediate_size=512", "model.moe_intermediate_size=128",
                          "model.num_attention_heads=8", "model.num_key_value_heads=4", "model.head_dim=32",
                          "model.num_hidden_layers=4", "model.num_experts=16", "model.num_experts_per_tok=2",
                          "model.max_position_embeddings=512"};
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) MOERL_ASSERT(cfg_apply_override(c, base[i]) == MOERL_OK);
    for (int i = optind; i < argc; i++)
        if (cfg_apply_override(c, argv[i]) != MOERL_OK) {
            fprintf(stderr, "bench_dist_rollout_layouts: %s\n", moerl_last_error());
            exit(2);
        }
    moe_config mc;
    if (model_config_from_keys(c, NULL, &mc) != MOERL_OK) {
        fprintf(stderr, "bench_dist_rollout_layouts: %s\n", moerl_last_error());
        exit(2);
    }
    cfg_free(c);
    mc.vocab_size = 4096;
    mc.bos_token_id = mc.eos_token_id = -1;
    return mc;
}

int main(int argc, char **argv) {
    dist_ctx *ctx = dist_init(&argc, &argv);
    if (!ctx || ctx->world_size < 2 || dist_split_roles(ctx, ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "bench_dist_rollout_layouts: run under mpirun with ≥ 2 ranks (%s)\n",
                ctx ? moerl_last_error() : "no context");
        return 1;
    }
    bench_opts o = {.rounds = 3, .prompts = 16, .tokens = 32, .prompt_len = 16, .seqs = 16};
    static const struct option lo[] = {{"rounds", 1, 0, 'r'}, {"prompts", 1, 0, 'p'}, {"tokens", 1, 0, 't'},
                                       {"prompt-len", 1, 0, 'l'}, {"seqs", 1, 0, 's'}, {0, 0, 0, 0}};
    for (int x; (x = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        int *dst = x == 'r' ? &o.rounds : x == 'p' ? &o.prompts : x == 't' ? &o.tokens : x == 'l' ? &o.prompt_len
                 : x == 's' ? &o.seqs : NULL;
        if (!dst) return 2;
        *dst = atoi(optarg);
    }
    const moe_config c = bench_model(argc, argv);
    moe_model m;
    MOERL_ASSERT(model_init_inference(&m, &c) == MOERL_OK);
    model_init_random(&m, 1234);
    dist_comm *comm = dist_comm_split(ctx, 0, ctx->world_rank); /* the ranks as one group */
    MOERL_ASSERT(comm);
    const int P = dist_comm_size(comm), me = ctx->world_rank;
    double *wall = xcalloc((size_t)N_LAYOUTS * o.rounds, sizeof(double));
    int64_t wbytes[N_LAYOUTS], kvbytes[N_LAYOUTS];
    double load_s[N_LAYOUTS] = {0};
    for (int k = 0; k < o.rounds * N_LAYOUTS; k++) {
        const int l = k % N_LAYOUTS, round = k / N_LAYOUTS;
        layout L;
        layout_build(l, &m, comm, &o, &L);
        wbytes[l] = (int64_t)engine_model(L.e)->n_params * 4;
        kvbytes[l] = engine_get_config(L.e).kv_cache_bytes;
        load_s[l] += L.load_s / o.rounds;
        wall[l * o.rounds + round] = layout_run(&L, comm, &o, c.vocab_size);
        layout_free(&L);
        if (me == 0)
            printf("round %d %-2s %d ranks: %.3f s, %.1f tokens/s\n", round + 1, layout_name[l], P,
                   wall[l * o.rounds + round], (double)o.prompts * o.tokens / wall[l * o.rounds + round]);
    }
    if (me == 0) {
        printf("workload: %d prompts × %d tokens (prompt %d), max_num_seqs %d per engine, %d ranks; model hidden %d, "
               "%d layers, %d heads / %d kv, %d experts top-%d, vocabulary %d\n",
               o.prompts, o.tokens, o.prompt_len, o.seqs, P, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
               c.num_key_value_heads, c.num_experts, c.num_experts_per_tok, c.vocab_size);
        for (int l = 0; l < N_LAYOUTS; l++) {
            qsort(wall + l * o.rounds, o.rounds, sizeof(double), cmp_d);
            const double med = wall[l * o.rounds + o.rounds / 2];
            printf("median %-2s %d: %.1f tokens/s (%.3f s), weights %.2f MB per rank, KV pool %.2f MB per rank, weights "
                   "loaded in %.1f ms (mean)\n",
                   layout_name[l], P, (double)o.prompts * o.tokens / med, med, wbytes[l] / 1e6, kvbytes[l] / 1e6,
                   load_s[l] * 1e3);
        }
    }
    free(wall);
    model_free(&m);
    dist_comm_free(comm);
    dist_finalize(ctx);
    return 0;
}
