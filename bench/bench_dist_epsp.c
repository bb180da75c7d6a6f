/* Expert parallelism and Ulysses sequence parallelism under mpirun (src/parallel/ep.h, ulysses.h).
 *
 * --mode ep: EP size = the world size (every rank one EP rank, no data-parallel replicas), the
 *   benchmark model of bench_util.h with --layers MoE layers, --tokens tokens per rank per step
 *   (four packed sequences of random tokens). Per repetition, one training step (forward +
 *   backward through train_accumulate + ep_reduce_grads) with each dispatcher, interleaved:
 *   all-to-all (capacity factor --factor) and all-to-all-v. Prints per dispatcher the median step
 *   time, the median time inside the exchanges, the EP all-to-all bytes this rank sent per step
 *   (dist_comm_bytes) against the formula — all-to-all: 4·L·(P−1)·(E/P)·(2 + cap·H)·4 (four exchanges
 *   per MoE layer: dispatch, combine, and both again in backward, padded blocks, exact); all-to-all-v:
 *   the uniform-routing expectation 4·L·N·K·(P−1)/P·H·4 plus the count exchange (the measured value
 *   differs by the routing's imbalance) — and the model state per rank (params, grads and the two
 *   AdamW moments) against one rank holding every expert, and the peak RSS.
 * --mode sp: for each Ulysses size in --sp (dividing the world size; the rest is data parallel),
 *   a global batch of --tokens tokens per data shard of the SP=1 run... precisely: --seqs sequences of
 *   --seq-len tokens split over dp = P/sp shards; per repetition one step (forward + backward +
 *   gradient sum over the stage). Prints the median step time, the SP all-to-all bytes per step
 *   against the formula of ulysses.h, and the activation bytes per rank.
 * --mode mem: on 4 ranks, the same model (--layers MoE layers, 16 experts) trained with four layouts
 *   through parallel.h's entry points (par_state_init_cfg, train_accumulate, par_finish_grads,
 *   par_adamw_step): data parallel 4 (the DDP sum as one all-reduce of the gradient), FSDP 4, EP 4, and
 *   EP 2 × FSDP 2 (FSDP over the ranks holding the same experts). Per layout: moerl's accounting of
 *   the model state per rank (parameters, gradients, AdamW m and v of what the rank owns, plus FSDP's
 *   peak of gathered units), the peak RSS of the timed steps (VmHWM after /proc/self/clear_refs 5;
 *   the largest over the ranks), the bytes this rank sent per step summed over every group
 *   (dist_comm_bytes), and the median step time. --layout K runs only layout K (0..3 in the order
 *   above), so that the peak RSS is that layout's alone (otherwise the later layouts' VmHWM also
 *   holds what the process kept from the earlier ones).
 * Timing: every step starts after a world barrier; medians over --reps after one warm-up. The
 * ranks share the machine's cores, so on a small machine the times mostly measure the sharing;
 * the byte counts do not depend on it.
 * Usage: mpirun -np P bench_dist_epsp --mode ep|sp|mem [--layout K] [--reps R] [--tokens T] [--layers L] [--factor F]
 *        [--sp 1,2,4] [--seqs S] [--seq-len N] */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/common.h"
#include "base/rng.h"
#include "bench_util.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "parallel/ep.h"
#include "parallel/fsdp.h"
#include "parallel/parallel.h"
#include "parallel/ulysses.h"
#include "train/train.h"

static dist_ctx *g_ctx;

static double zero_grad_fn(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                           float *dentropy) {
    (void)ctx; (void)seq_of; (void)dentropy;
    const float w = 1.0f / 4096.0f;
    double l = 0;
    for (int n = 0; n < a->N; n++)
        if (resp_index[n] >= 0) {
            dlogp[n] = -w;
            l -= w * a->logp[n];
        }
    return l;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

/* Sequences of random tokens: n of len each (half prompt), from seed. */
static int *make_seqs(train_seq *s, int n, int len, uint64_t seed, int V) {
    int *tok = xmalloc((size_t)n * len * sizeof(int));
    rng_state r;
    rng_seed(&r, seed);
    for (int i = 0; i < n * len; i++) tok[i] = (int)rng_below(&r, (uint64_t)V);
    for (int i = 0; i < n; i++) {
        s[i].tokens = tok + (size_t)i * len;
        s[i].len = len;
        s[i].resp_start = len / 2;
    }
    return tok;
}

static void world_barrier(void) { MOERL_ASSERT(dist_barrier(g_ctx, DIST_TRAINERS) == MOERL_OK); }

static void bench_ep(int reps, int tokens, int layers, double factor) {
    const int P = g_ctx->trainer_size, me = g_ctx->trainer_rank;
    moe_config c = bench_model_config(2048);
    c.num_hidden_layers = layers;
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = P, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = 1, .dispatcher = MOE_DISPATCH_ALLTOALL, .alltoall_max_ep = 16,
                     .capacity_factor = factor};
    par_grid g;
    MOERL_ASSERT(par_grid_init(&g, g_ctx, &pc, c.num_experts, c.num_attention_heads, c.num_key_value_heads,
                               c.num_hidden_layers) == MOERL_OK);
    moe_config lc = c;
    ep_config_apply(&g, &lc);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &lc) == MOERL_OK);
    model_init_random(&m, 7); /* replicated tensors equal on every rank; experts differ, which is fine */
    ep_state *eps[2] = {ep_state_new(&g, &lc, tokens), NULL};
    g.cfg.dispatcher = MOE_DISPATCH_ALLTOALLV;
    eps[1] = ep_state_new(&g, &lc, tokens);
    MOERL_ASSERT(eps[0] && eps[1]);
    par_state ps = {.grid = &g};
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, tokens) == MOERL_OK);
    a.par = &ps;
    train_seq seqs[4];
    int *tok = make_seqs(seqs, 4, tokens / 4, 100 + (uint64_t)me, c.vocab_size);
    train_step_opts o = {.max_tokens = tokens, .temperature = 1.0f, .aux_coef = c.router_aux_loss_coef, .par = &ps};
    double *t[2], *x[2], bytes[2] = {0, 0}, rows[2] = {0, 0}, spill[2] = {0, 0}, sizes[2] = {0, 0};
    for (int d = 0; d < 2; d++) {
        t[d] = xcalloc((size_t)reps, sizeof(double));
        x[d] = xcalloc((size_t)reps, sizeof(double));
    }
    for (int r = -1; r < reps; r++)
        for (int d = 0; d < 2; d++) {
            ps.ep = eps[d];
            par_bind_hooks(&ps);
            const ep_stats s0 = ep_get_stats(eps[d]);
            const double b0 = dist_comm_bytes(g.ep_comm, DIST_OP_ALLTOALL);
            world_barrier();
            const double t0 = moerl_now();
            train_step_out so;
            MOERL_ASSERT(train_accumulate(&m, &a, seqs, 4, &o, zero_grad_fn, NULL, &so) == MOERL_OK);
            MOERL_ASSERT(ep_reduce_grads(eps[d], &m) == MOERL_OK);
            const double dt = moerl_now() - t0;
            if (r < 0) continue;
            t[d][r] = dt;
            x[d][r] = ep_get_stats(eps[d]).seconds - s0.seconds;
            const ep_stats s1 = ep_get_stats(eps[d]); /* the last step's counts (the data repeat) */
            bytes[d] = dist_comm_bytes(g.ep_comm, DIST_OP_ALLTOALL) - b0;
            rows[d] = (double)(s1.rows_sent - s0.rows_sent);
            spill[d] = (double)(s1.spill_rows - s0.spill_rows);
            sizes[d] = (double)(s1.size_exchanges - s0.size_exchanges);
        }
    const int El = c.num_experts / P, H = c.hidden_size, K = c.num_experts_per_tok, cap = ep_capacity(eps[0]);
    /* exact formulas from the rows moved (ep.h), and the uniform-routing expectation */
    const double f_exact[2] = {4.0 * layers * (P - 1) * El * (2.0 + (double)cap * H) * 4.0 + spill[0] * H * 4.0,
                               rows[1] * H * 4.0 + sizes[1] * (P - 1) * El * 4.0};
    const double f_unif[2] = {4.0 * layers * (P - 1) * El * (2.0 + (double)cap * H) * 4.0,
                              4.0 * layers * (double)tokens * K * (P - 1) / P * H * 4.0 + layers * (P - 1) * El * 4.0};
    /* model state: params, grads, AdamW m and v */
    size_t full = m.n_params;
    for (int i = 0; i < m.n_tensors; i++)
        if (m.tensors[i].flags & TF_EXPERT) full += (size_t)m.tensors[i].numel * (P - 1);
    double med[2][2];
    for (int d = 0; d < 2; d++) {
        med[d][0] = bench_median(t[d], reps);
        med[d][1] = bench_median(x[d], reps);
    }
    double all[8] = {0};
    if (me == 0) {
        printf("EP %d (E=%d, %d per rank), H=%d, K=%d, %d MoE layers, %d tokens per rank per step, capacity %d rows "
               "(factor %.2f)\n", P, c.num_experts, El, H, K, layers, tokens, cap, factor);
        printf("%-10s %10s %12s %14s %14s %14s %12s\n", "dispatcher", "step ms", "exchange ms", "EP bytes/step",
               "formula", "uniform", "spill rows");
        const char *nm[2] = {"alltoall", "alltoallv"};
        for (int d = 0; d < 2; d++)
            printf("%-10s %10.1f %12.1f %14.0f %14.0f %14.0f %12.0f\n", nm[d], 1e3 * med[d][0], 1e3 * med[d][1],
                   bytes[d], f_exact[d], f_unif[d], spill[d]);
        printf("alltoall / alltoallv step time: %.3f (exchange time %.3f). formula: from the rows moved (exact); "
               "uniform: the expectation under uniform routing without spills\n", med[0][0] / med[1][0],
               med[0][1] / med[1][1]);
        printf("model state per rank (params + grads + AdamW m, v): %.1f MB with EP %d vs %.1f MB with every "
               "expert (%.2fx)\n", 16.0 * m.n_params / 1e6, P, 16.0 * full / 1e6, (double)full / m.n_params);
    }
    all[0] = peak_rss_mb();
    MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, all, 1) == MOERL_OK);
    if (me == 0) printf("peak RSS per rank (mean over ranks): %.1f MB\n", all[0] / P);
    for (int d = 0; d < 2; d++) {
        free(t[d]);
        free(x[d]);
        ep_state_free(eps[d]);
    }
    free(tok);
    model_acts_free(&a);
    model_free(&m);
    par_grid_free(&g);
}

static void bench_sp(int reps, const int *sps, int nsp, int n_seqs, int seq_len) {
    const int P = g_ctx->trainer_size, me = g_ctx->trainer_rank;
    moe_config c = bench_model_config(MOERL_MAX(2048, seq_len));
    c.num_hidden_layers = 2;
    if (me == 0) {
        printf("Ulysses sweep on %d ranks: %d sequences of %d tokens per step, H=%d, nh=%d, nkv=%d, %d layers\n", P,
               n_seqs, seq_len, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.num_hidden_layers);
        printf("%4s %4s %12s %14s %18s %18s %16s\n", "sp", "dp", "step ms", "exchange ms", "SP bytes/step",
               "formula", "acts B/rank");
    }
    for (int i = 0; i < nsp; i++) {
        const int sp = sps[i];
        if (P % sp || n_seqs % (P / sp)) {
            if (me == 0) printf("%4d  (skipped: must divide %d ranks and the sequences must split evenly)\n", sp, P);
            continue;
        }
        par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = sp,
                         .pipeline_parallel_size = 1, .dispatcher = MOE_DISPATCH_AUTO, .alltoall_max_ep = 16,
                         .capacity_factor = 1.25};
        par_grid g;
        MOERL_ASSERT(par_grid_init(&g, g_ctx, &pc, c.num_experts, c.num_attention_heads, c.num_key_value_heads,
                                   c.num_hidden_layers) == MOERL_OK);
        moe_model m;
        MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
        model_init_random(&m, 7);
        const int per = n_seqs / g.dp, mb = per * seq_len;
        par_state ps = {.grid = &g};
        if (sp > 1) ps.sp = sp_state_new(&g, &c, mb);
        par_bind_hooks(&ps);
        model_acts a;
        const int acts_tokens = (mb + sp - 1) / sp;
        MOERL_ASSERT(model_acts_init(&a, &m, acts_tokens) == MOERL_OK);
        a.par = &ps;
        train_seq seqs[64];
        int *tok = make_seqs(seqs, per, seq_len, 200 + (uint64_t)g.dp_rank, c.vocab_size);
        train_step_opts o = {.max_tokens = mb, .temperature = 1.0f, .aux_coef = 0, .par = &ps};
        double *t = xcalloc((size_t)reps, sizeof(double)), *x = xcalloc((size_t)reps, sizeof(double)), bytes = 0;
        for (int r = -1; r < reps; r++) {
            const double b0 = g.sp_comm ? dist_comm_bytes(g.sp_comm, DIST_OP_ALLTOALL) : 0;
            const double s0 = ps.sp ? sp_get_stats(ps.sp).seconds : 0;
            world_barrier();
            const double t0 = moerl_now();
            train_step_out so;
            MOERL_ASSERT(train_accumulate(&m, &a, seqs, per, &o, zero_grad_fn, NULL, &so) == MOERL_OK);
            MOERL_ASSERT(dist_comm_allreduce_f32(g.stage_comm, m.grads, m.n_params) == MOERL_OK);
            if (r < 0) continue;
            t[r] = moerl_now() - t0;
            x[r] = ps.sp ? sp_get_stats(ps.sp).seconds - s0 : 0;
            bytes = g.sp_comm ? dist_comm_bytes(g.sp_comm, DIST_OP_ALLTOALL) - b0 : 0;
        }
        /* ulysses.h: per layer forward (P−1)·n·W·hd + (N−n)·nh_l·hd, backward (P−1)·n·nh_l·hd + (N−n)·W·hd */
        double f = 0;
        if (sp > 1) {
            const int t0 = (int)((long)mb * g.sp_rank / sp), n = (int)((long)mb * (g.sp_rank + 1) / sp) - t0;
            const int nh_l = c.num_attention_heads / sp, nkv_l = c.num_key_value_heads >= sp ? c.num_key_value_heads / sp : 1;
            const int W = nh_l + 2 * nkv_l;
            f = 4.0 * c.num_hidden_layers * c.head_dim *
                ((double)(sp - 1) * n * W + (double)(mb - n) * nh_l + (double)(sp - 1) * n * nh_l + (double)(mb - n) * W);
        }
        const double mt = bench_median(t, reps), mx = bench_median(x, reps);
        if (me == 0)
            printf("%4d %4d %12.1f %14.1f %18.0f %18.0f %16zu\n", sp, g.dp, 1e3 * mt, 1e3 * mx, bytes, f,
                   model_acts_bytes(&m, acts_tokens));
        free(t);
        free(x);
        free(tok);
        model_acts_free(&a);
        sp_state_free(ps.sp);
        model_free(&m);
        par_grid_free(&g);
    }
}

static double status_mb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atof(line + strlen(key)) / 1024.0; /* kB */
    if (f) fclose(f);
    return v;
}

/* Bytes this rank sent through every group of g since the last reset. */
static double grid_bytes(const par_grid *g, int reset) {
    dist_comm *cs[] = {g->stage_comm, g->fsdp_comm, g->replica_comm, g->ep_comm, g->ep_dp_comm, g->ep_replica_comm};
    double b = 0;
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        if (!cs[i]) continue;
        for (int op = 0; op < DIST_OP_COUNT; op++) b += dist_comm_bytes(cs[i], (dist_op)op);
        if (reset) dist_comm_reset_bytes(cs[i]);
    }
    return b;
}

static void bench_mem(int reps, int tokens, int layers, int only) {
    const int P = g_ctx->trainer_size, me = g_ctx->trainer_rank;
    moe_config c = bench_model_config(2048);
    c.num_hidden_layers = layers;
    const struct {
        const char *name;
        int fsdp, ep;
    } lay[] = {{"DP 4", 1, 1}, {"FSDP 4", 4, 1}, {"EP 4", 1, 4}, {"EP 2 x FSDP 2", 2, 2}};
    train_seq seqs[4];
    int *tok = make_seqs(seqs, 4, tokens / 4, 300 + (uint64_t)me, c.vocab_size);
    if (me == 0)
        printf("%d ranks, H=%d, %d layers of %d experts (I=%d, top-%d), %d tokens per rank per step\n"
               "%-14s %14s %14s %14s %14s %10s\n", P, c.hidden_size, layers, c.num_experts, c.moe_intermediate_size,
               c.num_experts_per_tok, tokens, "layout", "state MB", "+gathered MB", "peak RSS MB", "bytes/step",
               "step ms");
    for (size_t k = 0; k < sizeof lay / sizeof *lay; k++) {
        if (only >= 0 && (int)k != only) continue;
        moe_model m;
        MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
        model_init_random(&m, 7);
        const size_t whole = m.n_params;
        par_config pc = {.fsdp_size = lay[k].fsdp, .expert_parallel_size = lay[k].ep,
                         .ulysses_sequence_parallel_size = 1, .pipeline_parallel_size = 1,
                         .dispatcher = MOE_DISPATCH_ALLTOALLV, .alltoall_max_ep = 16, .capacity_factor = 1.25,
                         .max_tokens = tokens};
        par_state ps;
        MOERL_ASSERT(par_state_init_cfg(&ps, g_ctx, &pc, &m) == MOERL_OK);
        par_grid dpg = {0}; /* data parallel: a grid of ones for the gradient all-reduce's byte counter */
        const par_grid *g = ps.grid;
        if (!g) {
            MOERL_ASSERT(par_grid_init(&dpg, g_ctx, &pc, c.num_experts, c.num_attention_heads, c.num_key_value_heads,
                                       layers) == MOERL_OK);
            g = &dpg;
        }
        adamw_state os;
        par_adamw_init(&ps, &m, &os, adamw_default_config());
        model_acts a;
        MOERL_ASSERT(model_acts_init(&a, &m, tokens) == MOERL_OK);
        a.par = &ps;
        double *t = xcalloc((size_t)reps, sizeof(double)), bytes = 0;
        for (int r = -1; r < reps; r++) {
            if (r == 0) { /* the timed steps: reset the peak RSS and the counters */
                FILE *f = fopen("/proc/self/clear_refs", "w");
                if (f) {
                    fputs("5", f);
                    fclose(f);
                }
                if (ps.fsdp) fsdp_reset_peak(ps.fsdp);
                grid_bytes(g, 1);
            }
            world_barrier();
            const double t0 = moerl_now();
            train_step_opts o = {.max_tokens = tokens, .temperature = 1.0f, .aux_coef = c.router_aux_loss_coef,
                                 .par = &ps};
            const int passes = count_microbatches(seqs, 4, tokens), most = par_max_passes(&ps, passes);
            train_step_out so;
            MOERL_ASSERT(train_accumulate(&m, &a, seqs, 4, &o, zero_grad_fn, NULL, &so) == MOERL_OK);
            MOERL_ASSERT(par_finish_grads(&ps, passes, most) == MOERL_OK);
            if (!par_grads_self_reduced(&ps))
                MOERL_ASSERT(dist_comm_allreduce_f32(g->stage_comm, m.grads, m.n_params) == MOERL_OK);
            double gn;
            par_adamw_step(&ps, &m, &os, 1e-5f, (float)so.loss, &gn);
            if (r < 0) continue;
            t[r] = moerl_now() - t0;
        }
        bytes = grid_bytes(g, 0) / reps;
        double state = 16.0 * (double)(ps.fsdp ? os.n : m.n_params), gathered = 0;
        if (ps.fsdp) {
            fsdp_stats st;
            fsdp_get_stats(ps.fsdp, &st);
            gathered = st.peak_gathered_bytes;
        }
        double v[3] = {state, gathered, status_mb("VmHWM:")}, mx[3];
        for (int i = 0; i < 3; i++) { /* the largest over the ranks (the sum of one non-zero term per pass) */
            double all[64] = {0};
            all[me] = v[i];
            MOERL_ASSERT(P <= 64 && dist_allreduce_sum(g_ctx, DIST_TRAINERS, all, P) == MOERL_OK);
            mx[i] = 0;
            for (int q = 0; q < P; q++) mx[i] = fmax(mx[i], all[q]);
        }
        const double mt = bench_median(t, reps);
        if (me == 0)
            printf("%-14s %14.2f %14.2f %14.1f %14.0f %10.1f\n", lay[k].name, mx[0] / 1048576, mx[1] / 1048576, mx[2],
                   bytes, 1e3 * mt);
        if (me == 0 && (k == 0 || only >= 0))
            printf("%-14s (one rank holding everything: %.2f MB of state)\n", "", 16.0 * (double)whole / 1048576);
        free(t);
        model_acts_free(&a);
        adamw_free(&os);
        if (!ps.grid) par_grid_free(&dpg);
        par_state_free(&ps);
        model_free(&m);
    }
    free(tok);
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "bench_dist_epsp: %s\n", moerl_last_error());
        return 1;
    }
    const char *mode = "ep";
    int reps = 5, tokens = 256, layers = 2, sps[8] = {1, 2, 4}, nsp = 3, n_seqs = 4, seq_len = 256;
    double factor = 1.25;
    int only = -1;
    static const struct option lo[] = {{"mode", 1, 0, 'm'},   {"reps", 1, 0, 'r'}, {"tokens", 1, 0, 't'},
                                       {"layers", 1, 0, 'l'}, {"factor", 1, 0, 'f'}, {"sp", 1, 0, 's'},
                                       {"seqs", 1, 0, 'q'},   {"seq-len", 1, 0, 'n'}, {"layout", 1, 0, 'y'},
                                       {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (o) {
        case 'm': mode = optarg; break;
        case 'r': reps = atoi(optarg); break;
        case 't': tokens = atoi(optarg); break;
        case 'l': layers = atoi(optarg); break;
        case 'f': factor = atof(optarg); break;
        case 'q': n_seqs = atoi(optarg); break;
        case 'n': seq_len = atoi(optarg); break;
        case 'y': only = atoi(optarg); break;
        case 's': {
            nsp = 0;
            for (char *p = optarg; *p && nsp < 8;) {
                sps[nsp++] = (int)strtol(p, &p, 10);
                if (*p == ',') p++;
                else break;
            }
            break;
        }
        default:
            fprintf(stderr, "usage: bench_dist_epsp --mode ep|sp|mem [--reps R] [--tokens T] [--layers L] [--factor F] "
                            "[--sp 1,2,4] [--seqs S] [--seq-len N] [--layout 0..3]\n");
            return 1;
        }
    }
    if (only < -1 || only > 3) {
        fprintf(stderr, "bench_dist_epsp: --layout must be 0 (DP 4), 1 (FSDP 4), 2 (EP 4) or 3 (EP 2 x FSDP 2)\n");
        return 1;
    }
    if (reps < 1 || tokens < 8 || layers < 1 || !(factor > 0) || n_seqs < 1 || n_seqs > 64 || seq_len < 8) {
        fprintf(stderr, "bench_dist_epsp: bad option values\n");
        return 1;
    }
    if (!strcmp(mode, "ep")) {
        if (g_ctx->trainer_size < 2 || 16 % g_ctx->trainer_size) {
            fprintf(stderr, "bench_dist_epsp --mode ep: run with 2, 4, 8 or 16 ranks (the 16 experts must split)\n");
            return 1;
        }
        bench_ep(reps, tokens, layers, factor);
    } else if (!strcmp(mode, "sp")) {
        bench_sp(reps, sps, nsp, n_seqs, seq_len);
    } else if (!strcmp(mode, "mem")) {
        if (g_ctx->trainer_size != 4) {
            fprintf(stderr, "bench_dist_epsp --mode mem: run with 4 ranks (its layouts are 4-rank layouts)\n");
            return 1;
        }
        bench_mem(reps, tokens, layers, only);
    } else {
        fprintf(stderr, "bench_dist_epsp: --mode must be ep, sp or mem, got '%s'\n", mode);
        return 1;
    }
    dist_finalize(g_ctx);
    return 0;
}
