/* Tensor parallelism against one rank (src/parallel/tp.h). Every world rank is a trainer; the grid has
 * actor.megatron.tensor_model_parallel_size = --tp (default: the world size) and is data parallel over the
 * rest (dp = world / tp, the TP groups consecutive). Model: tests/par_fixture.h (E = 8 top-2, two MoE layers
 * and a dense one, nh 4 over --nkv key/value heads, vocabulary 64), the global aux loss on.
 * Run: K = 4 AdamW steps through parallel.h's entry points (par_state_init_cfg slices the model,
 * train_accumulate with the TP hooks, par_finish_grads, par_adamw_step with the norm counted once,
 * par_gather_full assembles the whole model on each group's TP rank 0).
 * Checks: CE and aux losses and the assembled weights match the one-rank reference within written fp32
 * tolerances; the whole model is bit-identical on every keeper; vocab-parallel log-probabilities and entropy
 * of the initial slice match the whole model's, and the gradient of Σ a·logp + b·entropy (the entropy term's
 * backward included) matches the whole model's gradient sliced (tp_slice_vec); a checkpoint of the gathered
 * model loads into the slices (tp_load_weights) bit for bit as the slice of the whole; refusals (sizes that do
 * not divide, TP with FSDP / EP / Ulysses / the interleaved pipeline, sequence_parallel, a slice without hooks;
 * recompute accepted).
 * --etp 1: experts whole on every TP rank (actor.megatron.expert_tensor_parallel_size=1); --vocab 67: a
 * vocabulary that is not a multiple of the TP size (the last slice padded, the padding outside the softmax).
 * --ep 2 (with --etp 1): TP × EP × DP (src/parallel/tp_ep.h): the experts split over EP groups of ranks with the
 * same TP rank, each TP rank's share of the tokens dispatched over its EP group; one keeper (rank 0) assembles
 * the whole model, the checkpoint loads into every rank's slice (par_slice_vec of the whole) and on one rank.
 * --sp: Megatron sequence parallelism (actor.megatron.sequence_parallel, src/parallel/tp_sp.h) on: the same
 * checks against one rank, and (dp 1) check_sp_vs_tp: one forward + backward of N and of N − 1 tokens (one of
 * them not a multiple of the TP size) with SP and with a second grid without it, logp / entropy / gradients
 * compared, and the bytes the TP group sent counted per operation against the formula of tp_sp.h (reduce-scatter
 * and all-gather of ⌈N/P⌉·H floats per row-parallel output / column-parallel input instead of all-reduces).
 * --ep 2 --etp 1 --sp: Megatron SP × EP (tp_sp.h: each TP rank's own rows dispatched over its EP group): the same
 * checks against one rank, and check_sp_ep_vs_tp_ep: one pass of N and N − 1 tokens against TP × EP without SP
 * (logp, entropy, gradients, recorded routes; the TP group's bytes per operation against their derivation).
 * Usage: test_dist_tp [--tp N] [--nkv K] [--etp 1] [--vocab V] [--ep N] [--sp]. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "dist/dist.h"
#include "parallel/parallel.h"
#include "parallel/tp.h"
#include "train/ckpt.h"
#include "par_fixture.h"
#include "dist_test.h"
#include "test.h"

#define E_EXPERTS 8
#define TOP_K 2

static dist_ctx *g_ctx;
#define RANK g_ctx->world_rank
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)

static par_config tp_pc(int tp, int etp) {
    par_config pc = {.fsdp_size = 1, .expert_parallel_size = 1, .ulysses_sequence_parallel_size = 1,
                     .pipeline_parallel_size = 1, .alltoall_max_ep = 16, .capacity_factor = 1.25,
                     .max_tokens = FX_MAX_TOKENS, .tensor_model_parallel_size = tp,
                     .expert_tensor_parallel_size = etp};
    return pc;
}

/* Refusals that need no communication (any process count). */
static void check_refusals(void) {
    par_config pc = tp_pc(2, -1);
    pc.fsdp_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_ERR && strstr(moerl_last_error(), "actor.fsdp_config.fsdp_size (2)"),
          "TP with FSDP: %s", moerl_last_error());
    pc = tp_pc(2, -1);
    pc.expert_parallel_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_ERR && strstr(moerl_last_error(), "actor.expert_parallel_size (2)"),
          "TP with EP: %s", moerl_last_error());
    pc = tp_pc(2, -1); /* TP × pipeline composes (tests/test_dist_compose.c --tp), its interleaved schedule not */
    pc.pipeline_parallel_size = 2;
    pc.virtual_pipeline_parallel_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_ERR && strstr(moerl_last_error(), "actor.pipeline_parallel_size=2") &&
              strstr(moerl_last_error(), "actor.virtual_pipeline_parallel_size (2)"),
          "TP with the interleaved pipeline: %s", moerl_last_error());
    pc = tp_pc(2, -1);
    pc.ulysses_sequence_parallel_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_ERR && strstr(moerl_last_error(), "ulysses_sequence_parallel_size (2)"),
          "TP with Ulysses: %s", moerl_last_error());
    pc = tp_pc(2, 1); /* TP × EP with experts whole: accepted when ep divides the dp = T / tp ranks */
    pc.expert_parallel_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_OK, "TP 2 × EP 2 (expert_tensor_parallel_size=1) on 4 ranks: %s",
          moerl_last_error());
    CHECK(par_check_tp(&pc, 2) == MOERL_ERR && strstr(moerl_last_error(), "actor.expert_parallel_size=2 must divide"),
          "TP 2 × EP 2 on 2 ranks: %s", moerl_last_error());
    pc.expert_tensor_parallel_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_ERR && strstr(moerl_last_error(), "expert_tensor_parallel_size=1"),
          "TP 2 × EP 2 with expert-TP: %s", moerl_last_error());
    pc.expert_tensor_parallel_size = 1; /* Megatron SP × EP (tp_sp.h): accepted with the experts whole */
    pc.sequence_parallel = 1;
    CHECK(par_check_tp(&pc, 4) == MOERL_OK, "TP 2 × EP 2 + SP on 4 ranks: %s", moerl_last_error());
    pc.expert_tensor_parallel_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_ERR && strstr(moerl_last_error(), "expert_tensor_parallel_size=1"),
          "TP 2 × EP 2 + SP with expert-TP: %s", moerl_last_error());
    pc = tp_pc(2, -1);
    CHECK(par_check_tp(&pc, 3) == MOERL_ERR && strstr(moerl_last_error(), "does not divide the 3 trainer"),
          "TP 2 over 3 ranks: %s", moerl_last_error());
    moe_config c = fx_config(E_EXPERTS, TOP_K, 1);
    CHECK(tp_config_apply(&c, 2, 1, 1) == MOERL_OK && c.num_key_value_heads == 1 && c.num_attention_heads == 2,
          "TP 2 with one kv head (replicated): %s", moerl_last_error());
    c = fx_config(E_EXPERTS, TOP_K, 4);
    const moe_config c0 = c;
    CHECK(tp_config_apply(&c, 8, 0, 1) == MOERL_ERR && strstr(moerl_last_error(), "num_attention_heads (4)") &&
              c.num_attention_heads == c0.num_attention_heads,
          "TP 8 with 4 heads: %s", moerl_last_error());
    c = fx_config(E_EXPERTS, TOP_K, 2);
    c.num_attention_heads = 6; /* TP 3 divides the 6 heads but neither divides nor is a multiple of 2 kv heads */
    CHECK(tp_config_apply(&c, 3, 0, 1) == MOERL_ERR && strstr(moerl_last_error(), "num_key_value_heads (2)"),
          "TP 3 with 2 kv heads: %s", moerl_last_error());
    c = fx_config(E_EXPERTS, TOP_K, 2);
    c.exec.recompute = MODEL_RECOMPUTE_FULL; /* combined since issue 27 (tests/test_dist_recompute.c --tp) */
    CHECK(tp_config_apply(&c, 2, 0, 1) == MOERL_OK && c.exec.recompute == MODEL_RECOMPUTE_FULL && c.exec.tp_size == 2,
          "TP with recompute: the slice keeps exec.recompute: %s", moerl_last_error());
    c = fx_config(E_EXPERTS, TOP_K, 2);
    c.vocab_size = 67; /* padded to 2 × 34 */
    CHECK(tp_config_apply(&c, 2, 1, 1) == MOERL_OK && c.num_attention_heads == 2 && c.num_key_value_heads == 1 &&
              c.vocab_size == 34 && c.exec.tp_vocab == 67 && c.moe_intermediate_size == 8 && c.intermediate_size == 16,
          "TP 2's local config: nh %d nkv %d V %d I %d Id %d", c.num_attention_heads, c.num_key_value_heads,
          c.vocab_size, c.moe_intermediate_size, c.intermediate_size);
    /* a slice without its runtime refuses to run */
    moe_model s;
    MOERL_ASSERT(model_init(&s, &c) == MOERL_OK);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &s, 16) == MOERL_OK);
    const int tk[2] = {1, 2}, cu[2] = {0, 2};
    CHECK(model_forward(&s, &a, tk, cu, NULL, 1, 2) == MOERL_ERR && strstr(moerl_last_error(), "tensor-parallel"),
          "a TP slice without hooks: %s", moerl_last_error());
    model_acts_free(&a);
    model_free(&s);
    cfg *k = cfg_new();
    par_def_keys(k);
    par_config rd;
    MOERL_ASSERT(cfg_apply_override(k, "actor.megatron.sequence_parallel=true") == MOERL_OK);
    CHECK(par_read_keys(k, &rd) == MOERL_ERR && strstr(moerl_last_error(), "actor.megatron.sequence_parallel=true") &&
              strstr(moerl_last_error(), "tensor_model_parallel_size ≥ 2 (got 1)"),
          "sequence_parallel without TP: %s", moerl_last_error());
    MOERL_ASSERT(cfg_apply_override(k, "actor.megatron.tensor_model_parallel_size=2") == MOERL_OK);
    CHECK(par_read_keys(k, &rd) == MOERL_OK && rd.sequence_parallel == 1 && rd.tensor_model_parallel_size == 2,
          "sequence_parallel with tp 2 accepted: %s", moerl_last_error());
    MOERL_ASSERT(cfg_apply_override(k, "actor.megatron.tensor_model_parallel_size=1") == MOERL_OK);
    MOERL_ASSERT(cfg_apply_override(k, "actor.megatron.sequence_parallel=false") == MOERL_OK);
    MOERL_ASSERT(cfg_apply_override(k, "actor.megatron.expert_tensor_parallel_size=3") == MOERL_OK);
    CHECK(par_read_keys(k, &rd) == MOERL_ERR && strstr(moerl_last_error(), "expert_tensor_parallel_size=3"),
          "expert_tensor_parallel_size 3 with tp 1: %s", moerl_last_error());
    cfg_free(k);
}

/* Forward, vocab-parallel logp / entropy and the backward of Σ a·logp + b·entropy on the slice, against the
 * whole model (same weights): logp and entropy close, the slice's gradient close to the whole gradient's slice.
 * Collective over the TP group; every rank uses the same sequences. */
static void check_vocab_parallel(par_state *ps, moe_model *m, const moe_model *whole0, const fx_batch *b) {
    moe_model w;
    MOERL_ASSERT(model_init(&w, &whole0->cfg) == MOERL_OK);
    memcpy(w.params, whole0->params, w.n_params * sizeof(float));
    model_acts aw, as;
    MOERL_ASSERT(model_acts_init(&aw, &w, FX_MAX_TOKENS) == MOERL_OK && model_acts_init(&as, m, FX_MAX_TOKENS) == MOERL_OK);
    as.par = ps;
    const int N = b->n_tokens, cu[2] = {0, N};
    int tgt[FX_N_SEQ * 16];
    float dl[FX_N_SEQ * 16], de[FX_N_SEQ * 16];
    for (int n = 0; n < N; n++) {
        tgt[n] = n % 7 == 3 ? -1 : b->tok[(n + 1) % N]; /* some masked rows */
        dl[n] = 0.01f * (float)(n % 5) - 0.02f;
        de[n] = 0.003f * (float)(n % 3) - 0.002f;
    }
    MOERL_ASSERT(model_forward(&w, &aw, b->tok, cu, NULL, 1, N) == MOERL_OK);
    CHECK_R(model_forward(m, &as, b->tok, cu, NULL, 1, N) == MOERL_OK, "TP forward: %s", RANK, moerl_last_error());
    model_logprobs(&w, &aw, tgt, 0.7f, 1);
    model_logprobs(m, &as, tgt, 0.7f, 1);
    /* fp32 sums in another order (o_proj / down / embedding partial sums, exp over vocab halves): 2e-5 abs + rel
     * on log-probabilities of size ~4 */
    t_close("TP logp vs whole (T 0.7)", as.logp, aw.logp, N, 2e-5f, 2e-5f);
    t_close("TP entropy vs whole (T 0.7)", as.entropy, aw.entropy, N, 2e-5f, 2e-5f);
    model_zero_grad(&w);
    model_zero_grad(m);
    model_backward(&w, &aw, dl, de, 0.05f);
    model_backward(m, &as, dl, de, 0.05f);
    MOERL_ASSERT(par_finish_grads(ps, 1, 1) == MOERL_OK); /* q/k-norm sums (dp 1 here) */
    float *ws = xalloc_aligned((m->n_params + 1) * sizeof(float));
    tp_slice_vec(ps->tp, w.grads, ws);
    /* gradients ~1e-2..1e-4: 1e-6 absolute + 1e-4 relative (another summation order; no Adam amplification) */
    t_close("TP gradient (logp + entropy + aux) vs whole, sliced", m->grads, ws, (long)m->n_params, 1e-6f, 1e-4f);
    free(ws);
    model_acts_free(&aw);
    model_acts_free(&as);
    model_free(&w);
}

/* One forward, vocab-parallel logp / entropy and backward of the first N tokens of b on model m under par (a
 * par_state): fills logp, ent [N] and m's gradients (par_finish_grads); bytes[DIST_OP_COUNT] = what the TP group
 * sent during forward + logprobs + backward. */
static void sp_pass_routes(par_state *ps, moe_model *m, const fx_batch *b, int N, float *logp, float *ent,
                           double *bytes, int16_t *routes, const int16_t *replay);
static void sp_pass(par_state *ps, moe_model *m, const fx_batch *b, int N, float *logp, float *ent, double *bytes) {
    sp_pass_routes(ps, m, b, N, logp, ent, bytes, NULL, NULL);
}
/* sp_pass with routes != NULL: the forward records the native routes of all N tokens there ([N, n_moe, K], as
 * model_acts.routes_out), and every MoE layer's topk_ids of every row are checked against them (the experts used
 * are the native ones: replay NULL). replay != NULL: the forward replays these routes (model_acts.replay_routes). */
static void sp_pass_routes(par_state *ps, moe_model *m, const fx_batch *b, int N, float *logp, float *ent,
                           double *bytes, int16_t *routes, const int16_t *replay) {
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, FX_MAX_TOKENS) == MOERL_OK);
    a.par = ps;
    a.routes_out = routes;
    a.replay_routes = replay;
    const int cu[2] = {0, N};
    int tgt[FX_N_SEQ * 16];
    float dl[FX_N_SEQ * 16], de[FX_N_SEQ * 16];
    for (int n = 0; n < N; n++) {
        tgt[n] = n % 7 == 3 ? -1 : b->tok[(n + 1) % N];
        dl[n] = 0.01f * (float)(n % 5) - 0.02f;
        de[n] = 0.003f * (float)(n % 3) - 0.002f;
    }
    dist_comm *tc = ps->grid->tp_comm;
    dist_comm_reset_bytes(tc);
    model_zero_grad(m);
    CHECK_R(model_forward(m, &a, b->tok, cu, NULL, 1, N) == MOERL_OK, "forward (N %d): %s", RANK, N, moerl_last_error());
    const int K = m->cfg.num_experts_per_tok, per = model_moe_layer_count(&m->cfg) * K;
    for (int l = 0, bad = 0; routes && !replay && l < m->cfg.num_hidden_layers; l++) {
        const int mi = model_moe_layer_index(&m->cfg, l);
        for (int t = 0; mi >= 0 && t < N * K; t++) bad += a.layers[l].mlp.topk_ids[t] != routes[(t / K) * per + mi * K + t % K];
        CHECK_R(!bad, "layer %d: %d topk_ids differ from the recorded routes (N %d)", RANK, l, bad, N);
    }
    model_logprobs(m, &a, tgt, 0.7f, 1);
    model_backward(m, &a, dl, de, 0.05f);
    for (int op = 0; op < DIST_OP_COUNT; op++) bytes[op] = dist_comm_bytes(tc, (dist_op)op);
    MOERL_ASSERT(par_finish_grads(ps, 1, 1) == MOERL_OK); /* q/k-norm sums; with SP the RMSNorms' too */
    memcpy(logp, a.logp, (size_t)N * sizeof(float));
    memcpy(ent, a.entropy, (size_t)N * sizeof(float));
    model_acts_free(&a);
}

/* *m2 / *ps2: the whole model whole0 sliced on a second grid of ps's layout without SP; its slice must equal m's
 * (the same weights). Collective over the world. */
static void twin_without_sp(par_state *ps, const moe_model *m, const moe_model *whole0, moe_model *m2, par_state *ps2) {
    MOERL_ASSERT(model_init(m2, &whole0->cfg) == MOERL_OK);
    memcpy(m2->params, whole0->params, m2->n_params * sizeof(float));
    par_config pc2 = ps->grid->cfg;
    pc2.sequence_parallel = 0;
    CHECK_R(par_state_init_cfg(ps2, g_ctx, &pc2, m2) == MOERL_OK, "the grid without SP: %s", RANK, moerl_last_error());
    CHECK_R(memcmp(m2->params, m->params, m->n_params * sizeof(float)) == 0, "the two slices differ", RANK);
}

/* The arena of the SP slice m (exec.tp_sp, set by tp_state_attach) against the slice m2 without SP, by hand: the
 * residual stream's 2L + 1 [N,H] buffers (resid_in, resid_mid per layer, resid_out) and the RMSNorms' 2L + 1 [N]
 * statistics hold ⌈N/P⌉ of FX_MAX_TOKENS rows (each buffer rounded up to 64 B as forward.c carves it); every other
 * buffer is TP's. An arena laid out without SP is refused by the SP runtime's forward, naming the layout. */
static void check_sp_arena(par_state *ps, moe_model *m, moe_model *m2, int P) {
    const size_t L = m->cfg.num_hidden_layers, H = m->cfg.hidden_size, N = FX_MAX_TOKENS, c = (N + P - 1) / P;
#define R64(b) (((b) + 63) / 64 * 64)
    const size_t shrunk = (2 * L + 1) * (R64(N * H * 4) - R64(c * H * 4) + R64(N * 4) - R64(c * 4));
#undef R64
    const size_t sp = model_acts_bytes(m, FX_MAX_TOKENS), tp = model_acts_bytes(m2, FX_MAX_TOKENS);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, FX_MAX_TOKENS) == MOERL_OK);
    CHECK_R(m->cfg.exec.tp_sp == 1 && m2->cfg.exec.tp_sp == 0 && tp - sp == shrunk && a.arena_bytes == sp &&
                a.sp_rows == (int)c,
            "SP arena %zu B, TP's %zu B: %zu less, want %zu (%zu [N,H] rows of %zu); sp_rows %d", RANK, sp, tp, tp - sp,
            shrunk, 2 * L + 1, c, a.sp_rows);
    model_acts_free(&a);
    MOERL_ASSERT(model_acts_init(&a, m2, FX_MAX_TOKENS) == MOERL_OK); /* laid out without SP */
    a.par = ps;
    const int tok[4] = {1, 2, 3, 4}, cu[2] = {0, 4};
    CHECK_R(model_forward(m, &a, tok, cu, NULL, 1, 4) == MOERL_ERR && strstr(moerl_last_error(), "laid out without it"),
            "an arena without SP refused under SP: %s", RANK, moerl_last_error());
    model_acts_free(&a);
    if (RANK == 0) printf("  SP arena %zu B, TP's %zu B (%d rows a rank of %d)\n", sp, tp, (int)c, FX_MAX_TOKENS);
}

/* SP against TP without SP on the same slice weights (dp 1): log-probabilities, entropy and gradients of one
 * pass, and the bytes each moved (tp_sp.h), for N tokens and N − 1. Collective over the world. */
static void check_sp_vs_tp(par_state *ps, moe_model *m, const moe_model *whole0, const fx_batch *b, int etp) {
    moe_model m2;
    par_state ps2;
    twin_without_sp(ps, m, whole0, &m2, &ps2);
    const moe_config *c = &m->cfg;
    const int P = ps->grid->tp, L = c->num_hidden_layers;
    int n_mlp = 0; /* row-parallel MLP outputs: dense layers, and MoE layers under expert-TP */
    for (int l = 0; l < L; l++) n_mlp += !moe_config_layer_is_moe(c, l) || etp != 1;
    int n_moe = 0;
    for (int l = 0; l < L; l++) n_moe += moe_config_layer_is_moe(c, l);
    check_sp_arena(ps, m, &m2, P);
    float *g1 = xalloc_aligned((m->n_params + 1) * sizeof(float));
    for (int N = b->n_tokens; N >= b->n_tokens - 1; N--) {
        float lp1[FX_N_SEQ * 16], en1[FX_N_SEQ * 16], lp2[FX_N_SEQ * 16], en2[FX_N_SEQ * 16];
        double by1[DIST_OP_COUNT], by2[DIST_OP_COUNT];
        sp_pass(ps, m, b, N, lp1, en1, by1);
        memcpy(g1, m->grads, m->n_params * sizeof(float));
        sp_pass(&ps2, &m2, b, N, lp2, en2, by2);
        /* the same products; the row sums over the group (reduce-scatter vs all-reduce) and the norms' gradient
         * (partial over each rank's rows, then summed) in another fp32 order: as check_vocab_parallel's bounds */
        t_close("SP logp vs TP without SP", lp1, lp2, N, 2e-5f, 2e-5f);
        t_close("SP entropy vs TP without SP", en1, en2, N, 2e-5f, 2e-5f);
        t_close("SP gradients vs TP without SP", g1, m2.grads, (long)m->n_params, 1e-6f, 1e-4f);
        /* bytes (dist.h's convention): rows of H floats; c = ⌈N/P⌉ rows a rank; the vocab-parallel statistics
         * (two passes: forward, and vp_logprob_backward's recompute) and expert-TP's routing-weight gradient are
         * the same with and without SP */
        const double H = c->hidden_size, rows = (double)((N + P - 1) / P), f = 2.0 * (P - 1) / P;
        const double n_rs = 2 + 2 * L + 2 * n_mlp, n_ag = 4 * L + 2, n_ar = n_rs;
        const double stats_ar = 2 * f * 4 * N * 8, stats_ag = 2 * (P - 1) * 2.0 * N * 4;
        const double topk_ar = etp != 1 ? f * 4.0 * N * c->num_experts_per_tok * n_moe : 0;
        const double want_rs = n_rs * (P - 1) * rows * H * 4, want_ag = n_ag * (P - 1) * rows * H * 4 + stats_ag;
        const double want_ar_tp = n_ar * f * N * H * 4 + stats_ar + topk_ar;
        CHECK_R(by1[DIST_OP_REDUCE_SCATTER] == want_rs && by1[DIST_OP_ALLGATHER] == want_ag &&
                    by1[DIST_OP_ALLREDUCE] == stats_ar + topk_ar,
                "SP bytes (N %d): reduce-scatter %.0f (want %.0f), all-gather %.0f (want %.0f), all-reduce %.0f "
                "(want %.0f)", RANK, N, by1[DIST_OP_REDUCE_SCATTER], want_rs, by1[DIST_OP_ALLGATHER], want_ag,
                by1[DIST_OP_ALLREDUCE], stats_ar + topk_ar);
        CHECK_R(by2[DIST_OP_ALLREDUCE] == want_ar_tp && by2[DIST_OP_REDUCE_SCATTER] == 0 && by2[DIST_OP_ALLGATHER] == stats_ag,
                "TP bytes (N %d): all-reduce %.0f (want %.0f)", RANK, N, by2[DIST_OP_ALLREDUCE], want_ar_tp);
        /* Korthikanti et al.: with N a multiple of P and every row-parallel output reduce-scattered (expert-TP)
         * SP moves exactly the bytes of the all-reduces it replaces */
        if (N % P == 0 && etp != 1)
            CHECK_R(fabs((by1[DIST_OP_REDUCE_SCATTER] + by1[DIST_OP_ALLGATHER] - stats_ag) -
                         (by2[DIST_OP_ALLREDUCE] - stats_ar - topk_ar)) < 0.5,
                    "SP's reduce-scatter + all-gather bytes != TP's all-reduce bytes (N %d)", RANK, N);
        if (RANK == 0)
            printf("  N %d tp %d: SP reduce-scatter %.0f + all-gather %.0f B (rows), TP all-reduce %.0f B (rows)\n", N,
                   P, by1[DIST_OP_REDUCE_SCATTER], by1[DIST_OP_ALLGATHER] - stats_ag,
                   by2[DIST_OP_ALLREDUCE] - stats_ar - topk_ar);
    }
    free(g1);
    par_state_free(&ps2);
    model_free(&m2);
}

/* SP × EP (tp_sp.h: each TP rank dispatches its own ⌈N/P⌉ rows over its EP group) against TP × EP without SP
 * (tp_ep.h) on the same slice weights, the same N tokens on every rank: one pass of N and of N − 1 tokens (P ∤ N:
 * the last rank routes fewer rows) with the routes recorded. Checks: logp, entropy, the gradients after
 * par_finish_grads (routers and norms summed over TP, experts over their holders) and every token's recorded
 * routes and topk_ids (gathered over TP); the bytes tp_comm counts per operation against the derivation below;
 * ep_comm's all-to-all bytes equal TP × EP's when P | N (then SP's rows are TP × EP's share: the same rows
 * dispatched to the same experts). Collective over the world. */
static void check_sp_ep_vs_tp_ep(par_state *ps, moe_model *m, const moe_model *whole0, const fx_batch *b) {
    moe_model m2;
    par_state ps2;
    twin_without_sp(ps, m, whole0, &m2, &ps2);
    const moe_config *c = &m->cfg;
    const int P = ps->grid->tp, L = c->num_hidden_layers, n_moe = model_moe_layer_count(c), K = c->num_experts_per_tok;
    const int per = n_moe * K;
    check_sp_arena(ps, m, &m2, P); /* the MoE on the rank's rows writes through the shrunken residual rows too */
    float *g1 = xalloc_aligned((m->n_params + 1) * sizeof(float));
    for (int N = b->n_tokens; N >= b->n_tokens - 1; N--) {
        float lp1[FX_N_SEQ * 16], en1[FX_N_SEQ * 16], lp2[FX_N_SEQ * 16], en2[FX_N_SEQ * 16];
        double by1[DIST_OP_COUNT], by2[DIST_OP_COUNT], ep1, ep2;
        int16_t *r1 = xmalloc((size_t)N * per * sizeof(int16_t)), *r2 = xmalloc((size_t)N * per * sizeof(int16_t));
        dist_comm_reset_bytes(ps->grid->ep_comm);
        sp_pass_routes(ps, m, b, N, lp1, en1, by1, r1, NULL);
        ep1 = dist_comm_bytes(ps->grid->ep_comm, DIST_OP_ALLTOALL);
        memcpy(g1, m->grads, m->n_params * sizeof(float));
        dist_comm_reset_bytes(ps2.grid->ep_comm);
        sp_pass_routes(&ps2, &m2, b, N, lp2, en2, by2, r2, NULL);
        ep2 = dist_comm_bytes(ps2.grid->ep_comm, DIST_OP_ALLTOALL);
        /* the same products; the residual rows reduce-scattered instead of all-reduced and the routers' and norms'
         * gradients summed from each rank's rows, in another fp32 order: check_sp_vs_tp's bounds */
        t_close("SP × EP logp vs TP × EP", lp1, lp2, N, 2e-5f, 2e-5f);
        t_close("SP × EP entropy vs TP × EP", en1, en2, N, 2e-5f, 2e-5f);
        t_close("SP × EP gradients vs TP × EP", g1, m2.grads, (long)m->n_params, 1e-6f, 1e-4f);
        CHECK_R(memcmp(r1, r2, (size_t)N * per * sizeof(int16_t)) == 0, "SP × EP's recorded routes differ (N %d)",
                RANK, N);
        /* bytes (dist.h's convention): a row op moves (P−1)·⌈N/P⌉·H floats. SP × EP: SP's reduce-scatters (the
         * MoE layers have none: experts whole); SP's 4L + 2 gathers less the MoE layers' ln2 and ∂out (2 each);
         * all-reduces: the vocab-parallel statistics and the aux statistics (2E floats, one forward); the routes
         * recorded: one all-gather of every token's routes_out and topk_ids (2·n_moe·K floats a row). TP × EP:
         * [N,H] all-reduces and, per MoE layer and pass, the expert rows' all-gather ((P−1)·⌈N/P⌉·K·H floats). */
        const double H = c->hidden_size, rows = (double)((N + P - 1) / P), f = 2.0 * (P - 1) / P;
        int n_dense = 0;
        for (int l = 0; l < L; l++) n_dense += !moe_config_layer_is_moe(c, l);
        const double stats_ar = 2 * f * 4 * N * 8, stats_ag = 2 * (P - 1) * 2.0 * N * 4, aux_ar = f * 2 * c->num_experts * 4;
        const double want_rs = (2 + 2 * L + 2 * n_dense) * (P - 1) * rows * H * 4;
        const double routes_ag = (P - 1) * rows * 2 * per * 4; /* the recorded routes and topk_ids, one row a token */
        const double want_ag = (4 * L + 2 - 2 * n_moe) * (P - 1) * rows * H * 4 + stats_ag + routes_ag;
        const double want_ag2 = stats_ag + 2 * n_moe * (P - 1) * rows * K * H * 4;
        const double want_ar2 = (2 + 2 * L + 2 * n_dense) * f * N * H * 4 + stats_ar;
        CHECK_R(by1[DIST_OP_REDUCE_SCATTER] == want_rs && by1[DIST_OP_ALLGATHER] == want_ag &&
                    by1[DIST_OP_ALLREDUCE] == stats_ar + aux_ar,
                "SP × EP bytes (N %d): reduce-scatter %.0f (want %.0f), all-gather %.0f (want %.0f), all-reduce %.0f "
                "(want %.0f)", RANK, N, by1[DIST_OP_REDUCE_SCATTER], want_rs, by1[DIST_OP_ALLGATHER], want_ag,
                by1[DIST_OP_ALLREDUCE], stats_ar + aux_ar);
        CHECK_R(by2[DIST_OP_REDUCE_SCATTER] == 0 && by2[DIST_OP_ALLGATHER] == want_ag2 && by2[DIST_OP_ALLREDUCE] == want_ar2,
                "TP × EP bytes (N %d): all-gather %.0f (want %.0f), all-reduce %.0f (want %.0f)", RANK, N,
                by2[DIST_OP_ALLGATHER], want_ag2, by2[DIST_OP_ALLREDUCE], want_ar2);
        CHECK_R(ep1 > 0 && (N % P || ep1 == ep2), "EP all-to-all (N %d): SP × EP %.0f B, TP × EP %.0f B", RANK, N, ep1,
                ep2);
        if (RANK == 0)
            printf("  N %d tp %d ep %d: SP × EP reduce-scatter %.0f + all-gather %.0f + all-reduce %.0f B; TP × EP "
                   "all-gather %.0f + all-reduce %.0f B; all-to-all %.0f / %.0f B\n", N, P, ps->grid->ep,
                   by1[DIST_OP_REDUCE_SCATTER], by1[DIST_OP_ALLGATHER], by1[DIST_OP_ALLREDUCE], by2[DIST_OP_ALLGATHER],
                   by2[DIST_OP_ALLREDUCE], ep1, ep2);
        /* routing replay (R3) of other routes — each token's experts shifted by one — on both layouts: SP × EP
         * reads its own rows' replayed routes (a row off would route other experts: O(1) apart) */
        const int E = c->num_experts;
        for (int i = 0; i < N * per; i++) r1[i] = (int16_t)((r1[i] + 1) % E);
        sp_pass_routes(ps, m, b, N, lp1, en1, by1, NULL, r1);
        memcpy(g1, m->grads, m->n_params * sizeof(float));
        sp_pass_routes(&ps2, &m2, b, N, lp2, en2, by2, NULL, r1);
        t_close("SP × EP replayed logp vs TP × EP's", lp1, lp2, N, 2e-5f, 2e-5f);
        t_close("SP × EP replayed gradients vs TP × EP's", g1, m2.grads, (long)m->n_params, 1e-6f, 1e-4f);
        free(r1);
        free(r2);
    }
    free(g1);
    par_state_free(&ps2);
    model_free(&m2);
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_tp: %s\n", moerl_last_error());
        return 1;
    }
    check_refusals();
    if (g_ctx->world_size == 1) { /* one process (tests/run.sh): the refusals only */
        printf("test_dist_tp: one process: refusals only; TP runs under mpirun (tests/e2e_mpi.sh)\n");
        dist_finalize(g_ctx);
        TEST_MAIN_END();
    }
    int tp = g_ctx->world_size, nkv = 2, etp = -1, vocab = 64, ep = 1, sp = 0;
    static const struct option lo[] = {{"tp", 1, 0, 't'}, {"nkv", 1, 0, 'k'}, {"etp", 1, 0, 'e'}, {"vocab", 1, 0, 'v'},
                                       {"ep", 1, 0, 'p'}, {"sp", 0, 0, 's'}, {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (o == 't') tp = atoi(optarg);
        else if (o == 'k') nkv = atoi(optarg);
        else if (o == 'e') etp = atoi(optarg);
        else if (o == 'v') vocab = atoi(optarg);
        else if (o == 'p') ep = atoi(optarg);
        else if (o == 's') sp = 1;
        else {
            fprintf(stderr, "usage: test_dist_tp [--tp N] [--nkv K] [--etp 1] [--vocab V ≥ 64] [--ep N] [--sp]\n");
            return 1;
        }
    }
    moe_config c = fx_config(E_EXPERTS, TOP_K, nkv);
    c.vocab_size = vocab; /* e.g. 67: not a multiple of tp, the last slice padded */
    fx_batch b;
    fx_make_batch(&b);
    float ref_ce[FX_K_STEPS], ref_aux[FX_K_STEPS];
    moe_model ref, init;
    fx_reference(&c, &b, ref_ce, ref_aux, &ref);
    MOERL_ASSERT(model_init(&init, &c) == MOERL_OK);
    model_init_random(&init, 4242);

    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    memcpy(m.params, init.params, m.n_params * sizeof(float));
    par_config pc = tp_pc(tp, etp);
    pc.expert_parallel_size = ep;
    pc.sequence_parallel = sp;
    par_state ps;
    CHECK_R(par_state_init_cfg(&ps, g_ctx, &pc, &m) == MOERL_OK, "par_state_init_cfg (tp %d): %s", RANK, tp,
            moerl_last_error());
    if (!ps.tp) return dist_test_finish(g_ctx);
    const par_grid *g = ps.grid;
    CHECK_R(m.cfg.exec.tp_size == tp && m.n_params < init.n_params && par_grads_self_reduced(&ps) &&
                par_whole_params(&ps, &m) == init.n_params && par_batch_copies(&ps) == tp,
            "the slice: tp_size %d, %zu of %zu floats", RANK, m.cfg.exec.tp_size, m.n_params, init.n_params);
    if (g->dp == 1) check_vocab_parallel(&ps, &m, &init, &b);
    if (g->dp == 1 && sp) check_sp_vs_tp(&ps, &m, &init, &b, etp);
    if (sp && ep > 1) check_sp_ep_vs_tp_ep(&ps, &m, &init, &b);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, FX_MAX_TOKENS) == MOERL_OK);
    a.par = &ps;
    adamw_state os;
    par_adamw_init(&ps, &m, &os, fx_opt());
    int shard, n_shards;
    par_data_shard(&ps, &shard, &n_shards);
    CHECK_R(n_shards == g->dp && shard == g->dp_rank, "data shard %d of %d (dp %d)", RANK, shard, n_shards, g->dp);
    train_seq mine[FX_N_SEQ];
    const int n = fx_split(&b, shard, n_shards, mine), E = c.num_experts;
    float ce[FX_K_STEPS], aux[FX_K_STEPS];
    for (int k = 0; k < FX_K_STEPS; k++) {
        double counts[64] = {0}, sums[1 + 64] = {0};
        MOERL_ASSERT(compute_router_counts(&m, &a, mine, n, FX_MAX_TOKENS, counts) == MOERL_OK);
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, E) == MOERL_OK);
        for (int e = 0; e < E; e++) counts[e] /= par_batch_copies(&ps);
        fx_ce_ctx cc = {1.0f / (float)b.n_response, 0};
        train_step_opts o = {.max_tokens = FX_MAX_TOKENS, .temperature = 1.0f, .aux_coef = FX_AUX_COEF,
                             .total_tokens = b.n_tokens, .aux_counts = counts, .aux_psum_out = sums + 1, .par = &ps};
        train_step_out so;
        MOERL_ASSERT(train_accumulate(&m, &a, mine, n, &o, fx_ce, &cc, &so) == MOERL_OK);
        MOERL_ASSERT(par_finish_grads(&ps, 1, 1) == MOERL_OK);
        sums[0] = cc.ce;
        MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_TRAINERS, sums, 1 + E) == MOERL_OK);
        for (int i = 0; i < 1 + E; i++) sums[i] /= par_batch_copies(&ps);
        ce[k] = (float)sums[0];
        aux[k] = fx_aux_value(counts, sums + 1, E, (int64_t)a.n_moe_layers * b.n_tokens);
        double gn;
        CHECK_R(par_adamw_step(&ps, &m, &os, os.cfg.lr, ce[k], &gn) == 1, "step %d not applied", RANK, k);
    }
    /* losses: fp32 partial sums in another order at weights drifting by earlier steps' rounding (as
     * tests/test_dist_dp.c): 1e-6 absolute + 1e-5 relative */
    t_close("TP CE losses vs one rank", ce, ref_ce, FX_K_STEPS, 1e-6f, 1e-5f);
    t_close("TP aux losses vs one rank", aux, ref_aux, FX_K_STEPS, 1e-6f, 1e-5f);
    adamw_state mo;
    const int keep = ep > 1 ? RANK == 0 : g->tp_rank == 0; /* TP × EP: one keeper assembles the whole model */
    const moe_model *full = par_gather_full(&ps, &m, keep, &os, &mo);
    CHECK_R(!keep || (full && full->n_params == ref.n_params && mo.n == ref.n_params), "par_gather_full: %s", RANK,
            moerl_last_error());
    uint64_t h = 0;
    if (keep && full) {
        /* weights: gradients summed over TP partial sums and DP ranks in another fp32 order, passed on by Adam to
         * elements whose gradient is mostly noise; same bound and reasoning as tests/test_dist_dp.c: atol 5e-5
         * (≈ lr/60) + rtol 1e-4; a missing all-reduce or a wrong slice moves weights by ~lr per step */
        t_close("TP weights vs one rank", full->params, ref.params, (long)ref.n_params, 5e-5f, 1e-4f);
        double worst = 0;
        for (size_t i = 0; i < ref.n_params; i++) worst = fmax(worst, fabs((double)full->params[i] - ref.params[i]));
        if (RANK == 0) {
            for (int k = 0; k < FX_K_STEPS; k++)
                printf("  step %d  CE TP %.7f one rank %.7f  aux TP %.7f one rank %.7f\n", k, ce[k], ref_ce[k], aux[k],
                       ref_aux[k]);
            printf("  tp %d dp %d: max |w_TP − w_one rank| = %.3g; %zu of %zu parameters per rank\n", g->tp, g->dp,
                   worst, m.n_params, ref.n_params);
        }
        h = fx_hash(full->params, full->n_params);
    }
    /* every keeper (one per TP group) holds the same bits: the DP replicas stepped identically */
    double hv[2] = {keep ? (double)(h >> 32) : 0, keep ? (double)(h & 0xffffffffu) : 0}, cnt = keep;
    double *all = xcalloc((size_t)3 * g_ctx->world_size, sizeof(double));
    all[3 * RANK] = hv[0], all[3 * RANK + 1] = hv[1], all[3 * RANK + 2] = cnt;
    MOERL_ASSERT(dist_allreduce_sum(g_ctx, DIST_WORLD, all, 3 * g_ctx->world_size) == MOERL_OK);
    int same = 1, first = -1;
    for (int r = 0; r < g_ctx->world_size; r++)
        if (all[3 * r + 2] > 0) {
            if (first < 0) first = r;
            same &= all[3 * r] == all[3 * first] && all[3 * r + 1] == all[3 * first + 1];
        }
    free(all);
    CHECK_R(same, "the assembled weights must be bit-identical on every TP group's keeper", RANK);
    /* checkpoint: the whole model saved (HF layout) loads into each rank's slice as the slice of the whole */
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/moerl_test_tp_%d_%d", (int)getppid(), ep > 1 ? 0 : g->dp_rank);
    if (keep && full) MOERL_ASSERT(model_save_hf(full, dir, 0, 0) == MOERL_OK);
    MOERL_ASSERT(dist_barrier(g_ctx, DIST_WORLD) == MOERL_OK);
    float *before = xalloc_aligned((m.n_params + 1) * sizeof(float)), *want = xalloc_aligned((m.n_params + 1) * sizeof(float));
    memcpy(before, m.params, m.n_params * sizeof(float));
    memset(m.params, 0, m.n_params * sizeof(float));
    CHECK_R(par_load_weights(&ps, &m, dir) == MOERL_OK, "par_load_weights: %s", RANK, moerl_last_error());
    CHECK_R(memcmp(m.params, before, m.n_params * sizeof(float)) == 0, "the reloaded slice differs from the trained one",
            RANK);
    if (keep && full) { /* and into a one-rank model (another TP size) bit for bit */
        moe_model one;
        MOERL_ASSERT(model_init(&one, &c) == MOERL_OK);
        CHECK_R(model_load_weights(&one, dir) == MOERL_OK &&
                    memcmp(one.params, full->params, one.n_params * sizeof(float)) == 0,
                "the TP checkpoint on one rank: %s", RANK, moerl_last_error());
        if (ep > 1) par_slice_vec(&ps, &m, one.params, want); /* the expert slice, then its TP slice */
        else tp_slice_vec(ps.tp, one.params, want);
        CHECK_R(memcmp(want, before, m.n_params * sizeof(float)) == 0, "tp_slice_vec of the whole != the slice", RANK);
        model_free(&one);
    }
    MOERL_ASSERT(dist_barrier(g_ctx, DIST_WORLD) == MOERL_OK);
    if (keep && full) ckpt_remove_flat_dir(dir);
    free(before);
    free(want);
    par_release_full(&ps, &m, full, &os, &mo);
    adamw_free(&os);
    model_acts_free(&a);
    par_state_free(&ps); /* assembles the whole model back into m on every rank */
    CHECK_R(m.n_params == ref.n_params && m.cfg.exec.tp_size == 0 && m.cfg.exec.ep_size <= 1, "par_state_free: the whole model back (%zu floats)",
            RANK, m.n_params);
    t_close("TP model after par_state_free vs one rank", m.params, ref.params, (long)ref.n_params, 5e-5f, 1e-4f);
    model_free(&m);
    model_free(&init);
    model_free(&ref);
    return dist_test_finish(g_ctx);
}
