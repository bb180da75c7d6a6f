/* FSDP memory and traffic per rank against the FSDP size N (src/parallel/fsdp.c).
 *   mpirun --oversubscribe -np N build/mpi/bench/bench_dist_fsdp [--budget-mb 160] [--steps 3] [--layers 8]
 * Every rank trains a random Qwen3-MoE (default: 8 layers, hidden 256, 8 experts of 256, vocab 1024:
 * ~59 MB of fp32 parameters, ~236 MB with gradients and AdamW moments) on its share of a global
 * batch of 8 sequences × 128 tokens, FSDP over all N ranks (N = 1: the replicated model and plain
 * AdamW). After one warm-up step the peak RSS is reset (/proc/self/clear_refs 5) and `steps` steps
 * are timed. Prints one JSON line (rank 0):
 *   state_mb      moerl's accounting of the training state: parameters, gradients, moments (the
 *                 owned shards under FSDP: 4·S floats; N = 1: 4·n_params) + the activation arena
 *   gathered_mb   FSDP's peak of gathered parameters + live gradient units + bounce buffers
 *   hwm_mb        VmHWM after the warm-up (the kernel's peak resident set of the timed steps)
 *   maxrss_mb     ru_maxrss of the whole run (includes building the whole model once at start)
 *   fits          state_mb + gathered_mb ≤ budget_mb
 *   allgather_b / reduce_scatter_b per step, and the formula of the schedule (fsdp.h):
 *                 all-gather (N−1)·4·[(A+B) + (b−1)·(A−s₁+B) + 1], reduce-scatter (N−1)·4·b·A with
 *                 A = Σ_u s_u (all units' shards), B = Σ of layers 0..L−2, s₁ = layer 0, b = passes
 *                 (micro-batches) per step, +1 the pass-count exchange
 *   step_s        median seconds per step (2 cores here: N ranks share them, so time is not a
 *                 scaling figure on this machine). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/common.h"
#include "base/config.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/fsdp.h"
#include "parallel/parallel.h"
#include "train/train.h"

#define N_SEQ 8
#define SEQ_LEN 128

static int g_resp;

static double ce_grad(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                      float *dent) {
    double loss = 0;
    for (int n = 0; n < a->N; n++) {
        if (resp_index[n] < 0) continue;
        loss -= a->logp[n] / g_resp;
        dlogp[n] = -1.0f / (float)g_resp;
    }
    return loss;
}

static double status_mb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atof(line + strlen(key) + 1) / 1024.0;
    if (f) fclose(f);
    return v;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    dist_ctx *ctx = dist_init(&argc, &argv);
    MOERL_ASSERT(ctx);
    double budget = 160;
    int steps = 3, layers = 8;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--budget-mb")) budget = atof(argv[i + 1]);
        if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
    }
    MOERL_ASSERT(dist_split_roles(ctx, ctx->world_size) == MOERL_OK);
    const int N = ctx->trainer_size;
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 1024;
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.moe_intermediate_size = 256;
    c.num_hidden_layers = layers;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = 1;
    c.max_position_embeddings = 256;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 10000.0f;
    c.initializer_range = 0.02f;
    c.bos_token_id = c.eos_token_id = -1;
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 1);
    const size_t n_params = m.n_params;
    cfg *kc = cfg_new();
    par_def_keys(kc);
    char kv[64];
    snprintf(kv, sizeof kv, "actor.fsdp_config.fsdp_size=%d", N);
    MOERL_ASSERT(cfg_apply_override(kc, kv) == MOERL_OK);
    par_state ps;
    if (par_state_init(&ps, ctx, kc, &m) != MOERL_OK) moerl_fatal("par_state_init: %s", moerl_last_error());
    cfg_free(kc);
    if (getenv("BENCH_FSDP_TRACE") && ctx->trainer_rank == 0)
        fprintf(stderr, "sharded: VmRSS %.1f MB, VmHWM %.1f MB\n", status_mb("VmRSS:"), status_mb("VmHWM:"));
    adamw_state os;
    if (ps.fsdp) fsdp_adamw_init(ps.fsdp, &os, adamw_default_config());
    else adamw_init(&os, &m, adamw_default_config());
    const int max_tokens = 2 * SEQ_LEN;
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, max_tokens) == MOERL_OK);
    a.par = &ps;
    static int tok[N_SEQ][SEQ_LEN];
    rng_state r;
    rng_seed(&r, 3);
    train_seq mine[N_SEQ];
    int n = 0;
    g_resp = 0;
    for (int s = 0; s < N_SEQ; s++) {
        for (int t = 0; t < SEQ_LEN; t++) tok[s][t] = (int)rng_below(&r, c.vocab_size);
        g_resp += SEQ_LEN - 16;
        if (s % N == ctx->trainer_rank) mine[n++] = (train_seq){.tokens = tok[s], .len = SEQ_LEN, .resp_start = 16};
    }
    double *ts = xcalloc((size_t)steps + 1, sizeof(double)), ag = 0, rs = 0;
    int b = 0;
    for (int k = 0; k <= steps; k++) {
        if (k == 1) { /* the timed steps: reset the peak RSS and the counters */
            FILE *f = fopen("/proc/self/clear_refs", "w");
            if (f) {
                fputs("5", f);
                fclose(f);
            }
            if (ps.fsdp) {
                fsdp_reset_peak(ps.fsdp);
                dist_comm_reset_bytes(ps.grid->fsdp_comm);
            }
        }
        const double t0 = moerl_now();
        train_step_opts to = {.max_tokens = max_tokens, .temperature = 1.0f, .total_tokens = N_SEQ * SEQ_LEN, .par = &ps};
        const int n_mb = count_microbatches(mine, n, max_tokens), max_mb = par_max_passes(&ps, n_mb);
        b = max_mb;
        train_step_out so;
        MOERL_ASSERT(train_accumulate(&m, &a, mine, n, &to, ce_grad, NULL, &so) == MOERL_OK);
        double loss = so.loss, gn;
        if (ps.fsdp) {
            MOERL_ASSERT(par_pad_passes(&ps, n_mb, max_mb, 1) == MOERL_OK && fsdp_finish_grads(ps.fsdp) == MOERL_OK);
            MOERL_ASSERT(dist_allreduce_sum(ctx, DIST_TRAINERS, &loss, 1) == MOERL_OK);
            fsdp_adamw_step(ps.fsdp, &os, 1e-4f, (float)loss, &gn);
        } else {
            adamw_step(&os, &m, 1e-4f, (float)loss, &gn);
        }
        ts[k] = moerl_now() - t0;
        if (getenv("BENCH_FSDP_TRACE") && ctx->trainer_rank == 0)
            fprintf(stderr, "step %d: VmRSS %.1f MB, VmHWM %.1f MB\n", k, status_mb("VmRSS:"), status_mb("VmHWM:"));
    }
    fsdp_stats st = {0};
    double A = 0, B = 0, s1 = 0;
    if (ps.fsdp) {
        fsdp_get_stats(ps.fsdp, &st);
        ag = st.allgather_bytes / steps;
        rs = st.reduce_scatter_bytes / steps;
        for (int u = 0; u < layers + 2; u++) A += (double)fsdp_unit_shard(ps.fsdp, u, NULL);
        for (int u = 1; u <= layers - 1; u++) B += (double)fsdp_unit_shard(ps.fsdp, u, NULL);
        s1 = (double)fsdp_unit_shard(ps.fsdp, 1, NULL);
    }
    const double state_mb = 4.0 * (ps.fsdp ? st.shard_floats : n_params) * 4 / 1048576 +
                            (double)model_acts_bytes(&m, max_tokens) / 1048576;
    const double gathered_mb = st.peak_gathered_bytes / 1048576;
    const double hwm = status_mb("VmHWM:");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mem[3] = {hwm, (double)ru.ru_maxrss / 1024, state_mb + gathered_mb}, mx[3];
    /* the largest over the ranks: every rank's own peak, reported as the max */
    for (int i = 0; i < 3; i++) {
        double v[64] = {0};
        v[ctx->trainer_rank] = mem[i];
        MOERL_ASSERT(dist_allreduce_sum(ctx, DIST_TRAINERS, v, N) == MOERL_OK);
        mx[i] = 0;
        for (int j = 0; j < N; j++) mx[i] = v[j] > mx[i] ? v[j] : mx[i];
    }
    qsort(ts + 1, (size_t)steps, sizeof(double), cmp_d);
    if (ctx->trainer_rank == 0) {
        const double agf = 4.0 * (N - 1) * ((A + B) + (b - 1) * (A - s1 + B) + 1), rsf = 4.0 * (N - 1) * b * A;
        printf("{\"N\": %d, \"params_mb\": %.1f, \"state_mb\": %.1f, \"gathered_mb\": %.1f, \"hwm_mb\": %.1f, "
               "\"maxrss_mb\": %.1f, \"budget_mb\": %.0f, \"fits\": %s, \"allgather_b\": %.0f, "
               "\"allgather_formula_b\": %.0f, \"reduce_scatter_b\": %.0f, \"reduce_scatter_formula_b\": %.0f, "
               "\"passes\": %d, \"step_s\": %.3f}\n",
               N, n_params * 4.0 / 1048576, state_mb, gathered_mb, mx[0], mx[1], budget,
               mx[2] <= budget ? "true" : "false", ag, agf, rs, rsf, b, ts[1 + steps / 2]);
    }
    free(ts);
    model_acts_free(&a);
    adamw_free(&os);
    par_state_free(&ps);
    model_free(&m);
    dist_finalize(ctx);
    return 0;
}
