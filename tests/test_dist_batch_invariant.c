/* rollout.batch_invariant under the model-parallel layouts (run under mpirun by tests/e2e_mpi.sh):
 * the rollout engine (one process, every rank runs the same one) generates responses, and the
 * trainer's recomputation (compute_logprobs) under --layout fsdp | ep | sp | pp of the world size
 * (par_state_init_cfg, as `moerl rl` builds it) must give the engine's behaviour logprobs BIT FOR BIT
 * (memcmp) with moe_exec_opts.batch_invariant. The same run with the default kernels must show a
 * nonzero difference (printed), so the equality is not vacuous. In one process (tests/run.sh) the
 * layout is one rank and the check is the same. */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "dist_test.h"
#include "fixture.h"
#include "model/forward.h"
#include "model/model.h"
#include "parallel/parallel.h"
#include "rollout/engine.h"
#include "train/train.h"

#define N_SEQ 6
#define RESP 10
#define MAX_TOK 128
#define RANK (g_ctx->world_rank)

static dist_ctx *g_ctx;

/* Two MoE layers and a dense one, 4 experts top-2, 4 heads over 2 kv heads (fixture sizes). */
static moe_config bi_config(int bi) {
    const char *kv[] = {"model.num_hidden_layers=3", "model.num_key_value_heads=2", "model.num_experts=4",
                        "model.num_experts_per_tok=2", "model.mlp_only_layers=[1]", "model.initializer_range=0.1"};
    moe_config c = fx_small_config(kv, FX_N(kv));
    c.exec.batch_invariant = bi;
    return c;
}

typedef struct {
    int tok[N_SEQ][40];
    int plen[N_SEQ];
    gen_request r[N_SEQ];
    train_seq seqs[N_SEQ];
} batch;

/* The engine's responses (T = 0.8, seeded) and behaviour logprobs for N_SEQ prompts. */
static void generate(const moe_model *m, batch *b) {
    engine_config ec = {.max_num_seqs = N_SEQ, .max_model_len = 48, .max_num_batched_tokens = 32};
    engine *e = engine_create(&m->cfg, ec);
    MOERL_ASSERT(e && engine_load_weights(e, m->params, m->n_params, 0) == MOERL_OK);
    for (int i = 0; i < N_SEQ; i++) {
        b->plen[i] = 3 + 5 * i;
        for (int t = 0; t < b->plen[i]; t++) b->tok[i][t] = (i * 11 + t * 7 + 1) % 64;
        gen_request *r = &b->r[i];
        memset(r, 0, sizeof *r);
        r->id = i;
        r->prompt = b->tok[i];
        r->prompt_len = b->plen[i];
        r->sp.temperature = 0.8f;
        r->sp.top_p = 1.0f;
        r->sp.seed = 17 + i;
        r->sp.max_tokens = RESP;
        r->sp.ignore_eos = 1;
        MOERL_ASSERT(engine_add(e, r) == MOERL_OK);
    }
    gen_request *done[N_SEQ];
    for (int guard = 0; engine_num_unfinished(e) > 0 && guard < 10000; guard++)
        MOERL_ASSERT(engine_step(e, done, N_SEQ) >= 0);
    engine_free(e);
    for (int i = 0; i < N_SEQ; i++) {
        MOERL_ASSERT(b->r[i].n_out == RESP);
        memcpy(b->tok[i] + b->plen[i], b->r[i].out_tokens, RESP * sizeof(int));
        b->seqs[i] = (train_seq){.tokens = b->tok[i], .len = b->plen[i] + RESP, .resp_start = b->plen[i]};
    }
}

/* Largest |engine − trainer| logprob difference under the layout; *same: all bits equal. */
static float run(const par_config *pc, int bi, int *same) {
    const moe_config c = bi_config(bi);
    moe_model ref, m;
    MOERL_ASSERT(model_init(&ref, &c) == MOERL_OK && model_init(&m, &c) == MOERL_OK);
    model_init_random(&ref, 99);
    model_init_random(&m, 99);
    batch b;
    generate(&ref, &b);
    par_state ps;
    memset(&ps, 0, sizeof ps);
    if (g_ctx->world_size > 1) MOERL_ASSERT(par_state_init_cfg(&ps, g_ctx, pc, &m) == MOERL_OK);
    model_acts a;
    MOERL_ASSERT(model_acts_init_rows(&a, &m, par_acts_rows(g_ctx->world_size > 1 ? &ps : NULL, MAX_TOK), MAX_TOK) ==
                 MOERL_OK);
    if (g_ctx->world_size > 1) a.par = &ps;
    float lp[N_SEQ][RESP], *out[N_SEQ];
    for (int i = 0; i < N_SEQ; i++) out[i] = lp[i];
    /* micro-batches of at most 40 tokens: the sequences packed 1–3 per micro-batch */
    CHECK(compute_logprobs(&m, &a, b.seqs, N_SEQ, 40, 0.8f, out) == MOERL_OK, "compute_logprobs: %s",
          moerl_last_error());
    float d = 0;
    *same = 1;
    for (int i = 0; i < N_SEQ; i++) {
        *same &= !memcmp(lp[i], b.r[i].out_logprobs, sizeof lp[i]);
        for (int k = 0; k < RESP; k++) d = fmaxf(d, fabsf(lp[i][k] - b.r[i].out_logprobs[k]));
        gen_request_free_outputs(&b.r[i]);
    }
    model_acts_free(&a);
    if (g_ctx->world_size > 1) par_state_free(&ps);
    model_free(&m);
    model_free(&ref);
    return d;
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_batch_invariant: %s\n", moerl_last_error());
        return 1;
    }
    const char *layout = "fsdp";
    static const struct option lo[] = {{"layout", 1, 0, 'l'}, {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (o == 'l') layout = optarg;
        else {
            fprintf(stderr, "usage: test_dist_batch_invariant --layout fsdp|ep|sp|pp\n");
            return 1;
        }
    }
    const int P = g_ctx->world_size;
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = 1, .dispatcher = MOE_DISPATCH_ALLTOALLV, .alltoall_max_ep = 16,
                     .capacity_factor = 1.25, .max_tokens = MAX_TOK};
    if (!strcmp(layout, "fsdp")) pc.fsdp_size = P;
    else if (!strcmp(layout, "ep")) pc.expert_parallel_size = P;
    else if (!strcmp(layout, "sp")) pc.ulysses_sequence_parallel_size = P;
    else if (!strcmp(layout, "pp")) pc.pipeline_parallel_size = P;
    else {
        fprintf(stderr, "test_dist_batch_invariant: --layout %s: expected fsdp, ep, sp or pp\n", layout);
        return 1;
    }
    int same_on, same_off;
    const float on = run(&pc, 1, &same_on), off = run(&pc, 0, &same_off);
    CHECK(same_on, "rank %d, %s %d: batch_invariant trainer logprobs differ from the engine's (max |diff| %.3g)", RANK,
          layout, P, (double)on);
    CHECK(off > 0.0f, "rank %d, %s %d: the default kernels agree exactly too: the check above would be vacuous", RANK,
          layout, P);
    printf("rank %d, %s %d: engine vs trainer max |logprob diff|: batch_invariant %.3g (bitwise %s), default %.3g\n",
           RANK, layout, P, (double)on, same_on ? "equal" : "DIFFERENT", (double)off);
    return dist_test_finish(g_ctx);
}
