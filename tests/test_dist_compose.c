/* Composed layouts (issue 27): the pipeline with FSDP (src/parallel/parallel.c pp_fsdp_init) and with
 * expert parallelism (pp_ep_init) against plain data parallelism run on one rank.
 *   Model: the pipeline test's (4 layers: three MoE, one dense; untied head; aux coefficient 0.02).
 *   Batch: 12 sequences (5..16 tokens), SFT loss (−logp of the response tokens / their global count),
 *   micro-batches of at most 24 tokens. Fixed packing (pp_options.dynamic = 0: each pipeline packs its
 *   share as one rank does, and on the layouts run so every pipeline packs the same count) with the
 *   global load-balancing loss (coefficient 0.02, the whole batch's top-k counts from
 *   compute_router_counts); or --dynamic: the pipeline's dynamic count (as the commands run it; the
 *   stage agrees on the most and re-packs), with the aux coefficient 0 — its gradient weights each
 *   micro-batch by its token share squared, so it depends on the split, which one rank cannot copy —
 *   so only the cross-entropy, whose gradient does not depend on the split, is compared.
 *   Layout (argv): --pp P --fsdp F [--keep] [--vpp V] on T ranks: P stages, D = T/P ranks per stage,
 *   each its own pipeline (data-parallel rank d of D); each stage's units sharded over FSDP groups of F
 *   consecutive ranks (HSDP replicas when F < D); --keep = actor.fsdp_config.reshard_after_forward=false.
 *   Or --pp P --fsdp 1 --ep E: each stage's experts split over expert groups of E consecutive ranks (E
 *   pipelines whose stage s all-to-all their MoE rows); the FSDP-only checks (traffic, resident pages) are
 *   replaced by: the stage holds its layers' slice of the experts (par_held_floats = the stage's range of
 *   the sliced layout) and its MoE layers ran exchanges.
 *   Reference (every rank, alone): train_accumulate without par on the D shards, gradients added in
 *   shard order (what D data-parallel ranks sum), plain AdamW, K steps.
 *   Checks, all through parallel.h's entry points as `moerl sft` / `moerl rl` call them:
 *     forward-only compute_logprobs through the stages equals one rank's on every stage;
 *     K AdamW steps: the cross-entropy losses, the gradient norm of every step, the weights and AdamW moments par_gather_full
 *       assembles on one keeper (rank 0, then the last rank: a keeper on another stage), the weights
 *       par_state_free leaves on every rank, against the reference (tolerances at each check);
 *     traffic with --keep: each of the stage's units all-gathered and reduce-scattered exactly once per
 *       update (the counted bytes against the units' shards);
 *     memory: par_held_floats = the stage's units / F (rounded up to FSDP's 16-float pieces), and
 *       after the optimizer step no gathered page of the parameter map stays resident beyond the
 *       pages straddling unit ends;
 *     resume: the whole weights and the reference's moments (a checkpoint's) loaded into a new
 *       par_state (par_take_full, par_adamw_shard) and one more step equals the reference's step K+1;
 *     uneven shares (one pipeline with all sequences, the others with two or none): the short pipelines
 *       run empty micro-batches (FSDP's collectives only); the gradient norm against one rank's;
 *     what does not compose yet (pipeline × SP, pipeline × EP × FSDP, pipeline × FSDP with tied embeddings)
 *       refused naming the keys (4 ranks, pp 2).
 *   --tp T --pp P: TP × pipeline (test_tp_pp: T·P·dp ranks against one rank running the dp shards; its checks
 *     and tolerances at the function) and its refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/common.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "dist_test.h"
#include "fixture.h"
#include "model/forward.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/ep.h"
#include "parallel/fsdp.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "test.h"
#include "train/train.h"

#define K_STEPS 3
#define N_SEQ 12
#define MAX_TOK 24
static const int seq_len[N_SEQ] = {11, 6, 9, 14, 5, 8, 12, 16, 7, 10, 13, 6};
static const int prompt_len[N_SEQ] = {3, 2, 4, 5, 1, 3, 4, 6, 2, 3, 5, 2};

static dist_ctx *g_ctx;
static int g_dynamic;     /* --dynamic: the pipeline's dynamic micro-batch count, aux loss off (see main) */
static float g_aux_coef;  /* the load-balancing loss coefficient of the runs and the reference */
static int g_ep = 1;      /* --ep: actor.expert_parallel_size of the composed runs */
/* Weight tolerance (absolute, weights of scale 0.02). Fixed packing: the same micro-batches as one rank,
 * only the order of the sums over the FSDP group / pipelines and the clip factor's last bit differ
 * (≈ 1e-7 relative of an update of ≈ lr = 3e-3 per step): 1e-6. --dynamic: other micro-batches than one
 * rank's, so the GEMMs block other row counts (≈ 1e-7 relative in each gradient), which AdamW's m/√v
 * amplifies where a gradient is near zero (its sign decides a ±lr step): measured ≤ 6e-6 after 3 steps,
 * 2e-5 allowed. --ep: an expert's grouped GEMM sums the rows of every pipeline of its expert group in one
 * weight-gradient GEMM (one rank sums each shard's GEMM, then the shards), the same ≈ 1e-7 relative reordering
 * and the same AdamW amplification: measured 1.6e-6 with 2 OpenMP threads, 2e-5 allowed. Either keeps a lost
 * shard or a wrong range (weights off by ~lr = 3e-3 per step) out. */
static float g_wtol = 1e-6f;
static int g_tokens[N_SEQ][16];
static double g_inv_resp;
#define RANK g_ctx->world_rank
#define CHECK_R(cond, ...) CHECK(cond, "[rank %d] " __VA_ARGS__)

static moe_config cfg_model(void) {
    const char *kv[] = {"model.num_hidden_layers=4", "model.num_key_value_heads=2", "model.num_experts=4",
                        "model.num_experts_per_tok=2", "model.mlp_only_layers=[2]", "model.router_aux_loss_coef=0.02",
                        "model.tie_word_embeddings=false"};
    return fx_small_config(kv, FX_N(kv));
}

static int shard(int d, int D, train_seq *out) {
    int k = 0;
    for (int s = d; s < N_SEQ; s += D)
        out[k++] = (train_seq){.tokens = g_tokens[s], .len = seq_len[s], .resp_start = prompt_len[s]};
    return k;
}

static double sft_cb(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                     float *dent) {
    (void)ctx, (void)seq_of, (void)dent;
    double loss = 0;
    for (int t = 0; t < a->N; t++)
        if (resp_index[t] >= 0) {
            dlogp[t] = (float)-g_inv_resp;
            loss -= a->logp[t] * g_inv_resp;
        }
    return loss;
}

static adamw_config opt_config(void) {
    return (adamw_config){.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .max_grad_norm = 1.0f};
}

static int64_t total_tokens(void) {
    int64_t t = 0;
    for (int s = 0; s < N_SEQ; s++) t += seq_len[s];
    return t;
}

/* One rank: `steps` steps of D shards each (gradients added in shard order), plain AdamW. os_at[k]
 * (k < steps, may be NULL) receives copies of the moments after step k+1 is not needed: only the
 * final state (os_out) and, per step, the loss and gradient norm. */
static void reference(int D, int steps, float *losses, double *gn, moe_model *m, adamw_state *os_out) {
    const moe_config c = cfg_model();
    MOERL_ASSERT(model_init(m, &c) == MOERL_OK);
    model_init_random(m, 4242);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, m, MAX_TOK) == MOERL_OK);
    float *sum = xcalloc(m->n_params, sizeof(float));
    train_seq seqs[N_SEQ];
    adamw_state os;
    adamw_init(&os, m, opt_config());
    train_step_opts to = {.max_tokens = MAX_TOK, .temperature = 1.0f, .aux_coef = g_aux_coef,
                          .total_tokens = total_tokens()};
    double counts[8];
    for (int k = 0; k < steps; k++) {
        double loss = 0;
        memset(counts, 0, sizeof counts);
        train_seq all[N_SEQ];
        MOERL_ASSERT(compute_router_counts(m, &a, all, shard(0, 1, all), MAX_TOK, counts) == MOERL_OK);
        to.aux_counts = counts;
        for (int d = 0; d < D; d++) {
            const int n = shard(d, D, seqs);
            train_step_out so;
            MOERL_ASSERT(train_accumulate(m, &a, seqs, n, &to, sft_cb, NULL, &so) == MOERL_OK);
            loss += so.loss - to.aux_coef * so.aux_loss; /* the cross-entropy part (see step) */
            for (size_t i = 0; i < m->n_params; i++) sum[i] = d ? sum[i] + m->grads[i] : m->grads[i];
        }
        memcpy(m->grads, sum, m->n_params * sizeof(float));
        losses[k] = (float)loss;
        MOERL_ASSERT(adamw_step(&os, m, os.cfg.lr, losses[k], &gn[k]) == 1);
    }
    *os_out = os;
    model_acts_free(&a);
    free(sum);
}

static par_config layout(int pp, int fsdp, int keep, int vpp) {
    par_config pc;
    memset(&pc, 0, sizeof pc);
    pc.fsdp_size = fsdp;
    pc.expert_parallel_size = g_ep;
    pc.ulysses_sequence_parallel_size = 1;
    pc.pipeline_parallel_size = pp;
    pc.virtual_pipeline_parallel_size = vpp;
    pc.alltoall_max_ep = 16;
    pc.capacity_factor = 1.25;
    pc.max_tokens = MAX_TOK;
    pc.fsdp_keep_gathered = keep;
    return pc;
}

/* par_state_init_cfg as the commands build it, with the test's packing (fixed, or --dynamic). m holds the whole model
 * (whole = NULL: the random initial weights). */
static int compose_init(par_state *ps, moe_model *m, const par_config *pc, const float *whole) {
    const moe_config c = cfg_model();
    MOERL_ASSERT(model_init(m, &c) == MOERL_OK);
    model_init_random(m, 4242);
    if (whole) memcpy(m->params, whole, m->n_params * sizeof(float));
    if (par_state_init_cfg(ps, g_ctx, pc, m) != MOERL_OK) return MOERL_ERR;
    pp_options po = pp_options_default();
    po.dynamic = g_dynamic;
    po.balance_seq_len = MAX_TOK;
    pp_set_options(ps->pp, &po);
    return MOERL_OK;
}

static size_t resident_bytes(const void *p, size_t len) {
    const size_t ps = (size_t)sysconf(_SC_PAGESIZE), np = (len + ps - 1) / ps;
    unsigned char *v = xmalloc(np ? np : 1);
    size_t r = 0;
    if (mincore((void *)p, len, v) == 0)
        for (size_t i = 0; i < np; i++) r += (v[i] & 1) ? ps : 0;
    free(v);
    return r;
}

/* One training step through parallel.h (what sft_train.c does per mini-batch). */
static int step(par_state *ps, moe_model *m, model_acts *a, adamw_state *os, const train_seq *seqs, int n, float *loss,
                double *gn) {
    const moe_config c = cfg_model();
    double counts[8] = {0};
    if (compute_router_counts(m, a, seqs, n, MAX_TOK, counts) != MOERL_OK) return MOERL_ERR;
    dist_allreduce_sum(g_ctx, DIST_TRAINERS, counts, c.num_experts);
    for (int e = 0; e < c.num_experts; e++) /* every stage reports its pipeline's, every TP member its group's */
        counts[e] /= ps->grid->pp * par_batch_copies(ps);
    train_step_opts to = {.max_tokens = MAX_TOK, .temperature = 1.0f, .aux_coef = g_aux_coef,
                          .total_tokens = total_tokens(), .par = ps, .aux_counts = counts};
    train_step_out so;
    const int passes = 1, mx = par_max_passes(ps, passes);
    if (train_accumulate(m, NULL, seqs, n, &to, sft_cb, NULL, &so) != MOERL_OK) return MOERL_ERR;
    if (par_finish_grads(ps, passes, mx) != MOERL_OK) return MOERL_ERR;
    /* the cross-entropy part: the reported aux loss is the micro-batches' own (their split is the
     * pipeline's, re-packed to the count the stage agrees on), while the gradient uses the global counts */
    double l = so.loss - to.aux_coef * so.aux_loss;
    dist_allreduce_sum(g_ctx, DIST_TRAINERS, &l, 1);
    *loss = (float)(l / par_batch_copies(ps)); /* TP: every member of the last stage's group has the whole loss */
    return par_adamw_step(ps, m, os, os->cfg.lr, *loss, gn) == 1 ? MOERL_OK : MOERL_ERR;
}

/* Resume: the whole weights `whole` (a run's) and the whole moments of *ref_os (a checkpoint's: the reference's
 * after K_STEPS steps, within the runs' tolerances) into a new par_state of layout pc (par_take_full's and
 * par_adamw_shard's path), one more step against the reference's step K + 1, which replaces *ref / *ref_os /
 * ref_loss / ref_gn: the loss within 1e-6 + 1e-5 relative, the weights par_state_free leaves within wabs + wrel
 * relative (the caller's tolerance for one step more). */
static void resume_check(const par_config *pc, const float *whole, int D, const train_seq *seqs, int n,
                         const char *tag, float wabs, float wrel, moe_model *ref, adamw_state *ref_os,
                         float *ref_loss, double *ref_gn) {
    char what[200];
    par_state ps2;
    moe_model m2;
    CHECK_R(compose_init(&ps2, &m2, pc, whole) == MOERL_OK, "%s resume: %s", RANK, tag, moerl_last_error());
    adamw_state os2;
    adamw_init(&os2, ref, opt_config()); /* layout-sized, as a checkpoint's moments are read */
    memcpy(os2.m, ref_os->m, ref->n_params * sizeof(float));
    memcpy(os2.v, ref_os->v, ref->n_params * sizeof(float));
    os2.step = ref_os->step;
    par_adamw_shard(&ps2, &m2, &os2);
    CHECK_R(os2.n == par_held_floats(&ps2, &m2), "%s resume: moments %zu floats, held %zu", RANK, tag, os2.n,
            par_held_floats(&ps2, &m2));
    model_acts a2;
    MOERL_ASSERT(model_acts_init(&a2, &m2, MAX_TOK) == MOERL_OK);
    a2.par = &ps2;
    float l2 = 0;
    double g2 = 0;
    CHECK_R(step(&ps2, &m2, &a2, &os2, seqs, n, &l2, &g2) == MOERL_OK, "%s resumed step: %s", RANK, tag,
            moerl_last_error());
    model_free(ref);
    adamw_free(ref_os);
    reference(D, K_STEPS + 1, ref_loss, ref_gn, ref, ref_os);
    snprintf(what, sizeof what, "%s resumed step %d loss", tag, K_STEPS + 1);
    t_close(what, &l2, &ref_loss[K_STEPS], 1, 1e-6f, 1e-5f);
    adamw_free(&os2);
    model_acts_free(&a2);
    par_state_free(&ps2);
    snprintf(what, sizeof what, "%s resumed weights after step %d (rank %d)", tag, K_STEPS + 1, RANK);
    CHECK_R(t_close(what, m2.params, ref->params, (long)ref->n_params, wabs, wrel), "%s", RANK, what);
    model_free(&m2);
}

/* The largest |logp − one rank's| of compute_logprobs through ps over seqs (a NaN is kept), *rc its return; the
 * gathered units (FSDP) given back. */
static float logprobs_off(par_state *ps, moe_model *m, model_acts *a, const train_seq *seqs, int n, int *rc) {
    moe_model r0;
    const moe_config c = cfg_model();
    MOERL_ASSERT(model_init(&r0, &c) == MOERL_OK);
    model_init_random(&r0, 4242);
    model_acts ra;
    MOERL_ASSERT(model_acts_init(&ra, &r0, MAX_TOK) == MOERL_OK);
    float *lp[N_SEQ], *lr[N_SEQ], worst = 0;
    for (int i = 0; i < n; i++) lp[i] = xcalloc(16, sizeof(float)), lr[i] = xcalloc(16, sizeof(float));
    MOERL_ASSERT(compute_logprobs(&r0, &ra, seqs, n, MAX_TOK, 1.0f, lr) == MOERL_OK);
    *rc = compute_logprobs(m, a, seqs, n, MAX_TOK, 1.0f, lp);
    par_release_gathered(ps);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 16; k++) {
            const float d = fabsf(lp[i][k] - lr[i][k]);
            if (isnan(d) || d > worst) worst = d;
        }
        free(lp[i]);
        free(lr[i]);
    }
    model_acts_free(&ra);
    model_free(&r0);
    return worst;
}

/* TP × pipeline (parallel.c tp_pp_init): --tp T with --pp P on T·P·dp ranks, against one rank running the dp
 * shards (fixed packing: each pipeline packs its shard as one rank does). Checks: the slice and the stage (the
 * held floats = the stage's range of the TP slice's layout), forward-only logprobs on every stage, K steps'
 * losses and gradient norms, the whole weights and moments gathered on a keeper of stage 0 and of the last stage,
 * the whole model par_state_free leaves on every rank, and a resume from whole weights and moments (another
 * layout's checkpoint) one step further. Tolerances: TP's o_proj / MLP / embedding outputs are partial sums over
 * the TP ranks added in another fp32 order (tests/test_dist_tp.c): losses 1e-6 + 1e-5 relative, the gradient
 * norm 1e-5 relative (a replicated tensor counted twice or a lost stage moves it by its share, ≥ 1e-3 here), the
 * weights 5e-5 + 1e-4 relative (test_dist_tp.c's bound, ≈ lr/60: Adam passes the order's last bits on to
 * elements whose gradient is mostly noise; a missing all-reduce or a wrong slice moves whole tensors by ~lr =
 * 3e-3 per step). */
static void tp_pp_gathers(par_state *ps, moe_model *m, adamw_state *os, const moe_model *ref, const adamw_state *ref_os,
                          const char *tag) {
    const int T = g_ctx->world_size;
    char what[200];
    for (int kk = 0; kk < 2; kk++) { /* rank 0 (stage 0), then the last rank (the last stage, TP rank tp − 1) */
        const int keeper = kk ? T - 1 : 0;
        adamw_state mom;
        const moe_model *full = par_gather_full(ps, m, RANK == keeper, os, &mom);
        CHECK_R((RANK == keeper) == (full != NULL), "%s gather on %d: %s", RANK, tag, keeper, moerl_last_error());
        if (full) {
            snprintf(what, sizeof what, "%s gathered weights on rank %d vs data parallel", tag, keeper);
            t_close(what, full->params, ref->params, (long)ref->n_params, 5e-5f, 1e-4f);
            /* moments: m ≈ 0.1·g, v ≈ 0.05·g²; the gradients' last bits differ (TP order): 1e-3 relative with
             * floors 1e-7 / 1e-10 for entries whose gradient sums nearly cancel; a slice in the wrong place or
             * a stage's moments missing are off by their whole size */
            snprintf(what, sizeof what, "%s gathered moments m on rank %d", tag, keeper);
            t_close(what, mom.m, ref_os->m, (long)ref->n_params, 1e-7f, 1e-3f);
            snprintf(what, sizeof what, "%s gathered moments v on rank %d", tag, keeper);
            t_close(what, mom.v, ref_os->v, (long)ref->n_params, 1e-10f, 1e-3f);
            CHECK(full->n_params == ref->n_params && mom.n == ref->n_params && mom.step == K_STEPS,
                  "%s: gathered %zu floats, moments n %zu step %lld", tag, full->n_params, mom.n, (long long)mom.step);
        }
        par_release_full(ps, m, full, os, &mom);
    }
}

static void test_tp_pp(int pp, int tp) {
    const int T = g_ctx->world_size, dp = T / (pp * tp);
    char what[200], tag[96];
    snprintf(tag, sizeof tag, "tp %d x pp %d (dp %d)", tp, pp, dp);
    float ref_loss[K_STEPS + 1], loss[K_STEPS] = {0};
    double ref_gn[K_STEPS + 1];
    moe_model ref, m;
    adamw_state ref_os;
    reference(dp, K_STEPS, ref_loss, ref_gn, &ref, &ref_os);
    par_config pc = layout(pp, 1, 0, 1);
    pc.tensor_model_parallel_size = tp;
    pc.expert_tensor_parallel_size = -1;
    par_state ps;
    CHECK_R(compose_init(&ps, &m, &pc, NULL) == MOERL_OK, "%s: par_state_init_cfg: %s", RANK, tag, moerl_last_error());
    if (!ps.pp) return;
    const par_grid *g = ps.grid;
    size_t lo, hi;
    pp_own_range(ps.pp, &lo, &hi);
    CHECK_R(ps.tp && m.cfg.exec.tp_size == tp && g->dp == dp && g->tp == tp && par_held_floats(&ps, &m) == hi - lo &&
                hi - lo < m.n_params && m.n_params < ref.n_params && par_whole_params(&ps, &m) == ref.n_params,
            "%s stage %d: the slice's stage (tp_size %d, dp %d, holds %zu of the slice's %zu floats)", RANK, tag,
            g->stage, m.cfg.exec.tp_size, g->dp, par_held_floats(&ps, &m), m.n_params);
    train_seq seqs[N_SEQ];
    const int n = shard(g->dp_rank, dp, seqs);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, MAX_TOK) == MOERL_OK);
    a.par = &ps;
    int lrc;
    const float off = logprobs_off(&ps, &m, &a, seqs, n, &lrc);
    /* logprobs of scale ~4 through the TP partial sums in another order: 2e-5 (as test_dist_tp.c) */
    CHECK_R(lrc == MOERL_OK && off <= 2e-5f, "%s stage %d: forward-only logprobs off by %g from one rank's (rc %d: %s)",
            RANK, tag, g->stage, off, lrc, lrc ? moerl_last_error() : "");
    adamw_state os;
    par_adamw_init(&ps, &m, &os, opt_config());
    for (int k = 0; k < K_STEPS; k++) {
        double gn = 0;
        const int rc = step(&ps, &m, &a, &os, seqs, n, &loss[k], &gn);
        CHECK_R(rc == MOERL_OK && fabs(gn - ref_gn[k]) <= 1e-5 * ref_gn[k],
                "%s step %d: rc %d (%s), gradient norm %.9g, one rank %.9g", RANK, tag, k, rc,
                rc ? moerl_last_error() : "", gn, ref_gn[k]);
        if (RANK == 0) printf("  %s step %d: loss %.8f (one rank %.8f), gradient norm %.9f (one rank %.9f)\n", tag, k,
                              loss[k], ref_loss[k], gn, ref_gn[k]);
    }
    snprintf(what, sizeof what, "%s losses vs data parallel", tag);
    t_close(what, loss, ref_loss, K_STEPS, 1e-6f, 1e-5f);
    tp_pp_gathers(&ps, &m, &os, &ref, &ref_os, tag);
    adamw_free(&os);
    model_acts_free(&a);
    par_state_free(&ps); /* the stages, then the slices: the whole model back in m on every rank */
    snprintf(what, sizeof what, "%s weights after par_state_free (rank %d)", tag, RANK);
    CHECK_R(m.n_params == ref.n_params && t_close(what, m.params, ref.params, (long)ref.n_params, 5e-5f, 1e-4f), "%s",
            RANK, what);
    /* resume: whole weights and whole moments (a checkpoint's, any layout's: the reference's) */
    resume_check(&pc, m.params, dp, seqs, n, tag, 1e-4f, 1e-4f, &ref, &ref_os, ref_loss, ref_gn);
    adamw_free(&ref_os);
    model_free(&ref);
    model_free(&m);
}

/* TP × pipeline's refusals (par_check_tp / par_check_tp_pp, naming the keys): with FSDP, with the interleaved
 * schedule, and tp · pp not dividing the trainer ranks. No communication. */
static void tp_pp_refusals(void) {
    par_config pc = layout(2, 2, 0, 1);
    pc.tensor_model_parallel_size = 2;
    CHECK(par_check_tp(&pc, 8) == MOERL_ERR && strstr(moerl_last_error(), "actor.fsdp_config.fsdp_size (2)"),
          "tp 2 x pp 2 x fsdp 2: %s", moerl_last_error());
    pc = layout(2, 1, 0, 2);
    pc.tensor_model_parallel_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_ERR && strstr(moerl_last_error(), "actor.virtual_pipeline_parallel_size (2)"),
          "tp 2 x pp 2 x v 2: %s", moerl_last_error());
    pc = layout(2, 1, 0, 1);
    pc.tensor_model_parallel_size = 2;
    CHECK(par_check_tp(&pc, 6) == MOERL_ERR && strstr(moerl_last_error(), "does not divide the 6 trainer ranks"),
          "tp 2 x pp 2 on 6 ranks: %s", moerl_last_error());
    pc = layout(2, 1, 0, 1);
    pc.tensor_model_parallel_size = 2;
    CHECK(par_check_tp(&pc, 4) == MOERL_OK && par_check_tp(&pc, 8) == MOERL_OK, "tp 2 x pp 2 refused: %s",
          moerl_last_error());
}

/* Floats of the stage's units (its chunks' layout ranges) and the shard FSDP should hold of them. */
static void stage_floats(const par_state *ps, const moe_model *m, size_t *stage_n, size_t *shard_max) {
    const int nv = ps->grid->pp * pp_chunks(ps->pp);
    size_t *lo = xmalloc((size_t)nv * sizeof(size_t)), *hi = xmalloc((size_t)nv * sizeof(size_t));
    pp_stage_ranges(m, pp_bounds(ps->pp), nv, lo, hi, NULL, NULL);
    *stage_n = 0;
    for (int k = ps->grid->stage; k < nv; k += ps->grid->pp) *stage_n += hi[k] - lo[k];
    /* FSDP pieces: ⌈unit / F⌉ rounded up to 16 floats, per unit (at most L + 2 units) */
    *shard_max = *stage_n / (size_t)ps->grid->fsdp + (size_t)(m->cfg.num_hidden_layers + 2) * 16;
    free(lo);
    free(hi);
}

static void test_compose(int pp, int fsdp, int keep, int vpp) {
    const int T = g_ctx->world_size, D = T / pp;
    char what[160], tag[96];
    if (g_ep > 1)
        snprintf(tag, sizeof tag, "pp %d x ep %d (dp %d%s%s)", pp, g_ep, D, vpp > 1 ? ", v 2" : "",
                 g_dynamic ? ", dynamic count" : "");
    else
        snprintf(tag, sizeof tag, "pp %d x fsdp %d (dp %d%s%s%s)", pp, fsdp, D, keep ? ", reshard_after_forward=false" : "",
                 vpp > 1 ? ", v 2" : "", g_dynamic ? ", dynamic count" : "");
    float ref_loss[K_STEPS + 1], loss[K_STEPS] = {0};
    double ref_gn[K_STEPS + 1];
    moe_model ref, m;
    adamw_state ref_os;
    reference(D, K_STEPS, ref_loss, ref_gn, &ref, &ref_os);
    const par_config pc = layout(pp, fsdp, keep, vpp);
    par_state ps;
    CHECK_R(compose_init(&ps, &m, &pc, NULL) == MOERL_OK, "%s: par_state_init_cfg: %s", RANK, tag, moerl_last_error());
    if (!ps.pp) return;
    if (fsdp > 1) CHECK_R(ps.fsdp != NULL && ps.grid->fsdp == fsdp && ps.grid->dp == D, "%s: FSDP not composed", RANK, tag);
    if (g_ep > 1) /* EP's slice: the stage's model holds E / ep experts of each MoE layer */
        CHECK_R(ps.ep != NULL && ps.grid->ep == g_ep && ps.grid->dp == D && m.n_params < par_whole_params(&ps, &m),
                "%s: EP not composed (sliced %zu floats, whole %zu)", RANK, tag, m.n_params, par_whole_params(&ps, &m));
    size_t stage_n, shard_max;
    stage_floats(&ps, &m, &stage_n, &shard_max);
    const size_t held = par_held_floats(&ps, &m);
    CHECK_R(held >= stage_n / (size_t)fsdp && held <= shard_max, "%s stage %d: holds %zu floats, the stage's %zu / %d",
            RANK, tag, ps.grid->stage, held, stage_n, fsdp);
    train_seq seqs[N_SEQ];
    const int n = shard(ps.grid->dp_rank, D, seqs);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, MAX_TOK) == MOERL_OK);
    a.par = &ps;
    /* forward-only through the stages with the stage's units gathered by FSDP: one rank's values
     * (the same kernels on the same micro-batches; the sum handing them on adds exact zeros) */
    {
        int rc;
        const float off = logprobs_off(&ps, &m, &a, seqs, n, &rc);
        /* the same kernels on the micro-batches the stage agreed on (a pipeline re-packs to the most any
         * pipeline of the stage planned, so its GEMMs may run on other row counts than one rank's): 1e-5
         * absolute on logprobs of scale ~4 (bit-identical when the packing is one rank's) */
        const int same = rc == MOERL_OK && off <= 1e-5f;
        CHECK_R(same, "%s stage %d: forward-only logprobs differ from one rank's (rc %d: %s)", RANK, tag,
                ps.grid->stage, rc, rc ? moerl_last_error() : "");
    }
    adamw_state os;
    par_adamw_init(&ps, &m, &os, opt_config());
    /* reshard_after_forward=false: each of the stage's units all-gathered once per update (by the router
     * counts' forward-only pass, then kept for every micro-batch) and reduce-scattered once: (F − 1)·s_u
     * floats sent per unit (dist.h's ring volume), exactly, whatever the schedule */
    double unit_bytes = 0;
    for (int u = 0; u < m.cfg.num_hidden_layers + 2 && ps.fsdp; u++) {
        size_t un;
        const size_t su = fsdp_unit_shard(ps.fsdp, u, &un);
        if (un > 0) unit_bytes += (double)(fsdp - 1) * (double)su * 4.0;
    }
    for (int k = 0; k < K_STEPS; k++) {
        double gn = 0;
        fsdp_stats s0 = {0}, s1 = {0};
        if (ps.fsdp) fsdp_get_stats(ps.fsdp, &s0);
        const int rc = step(&ps, &m, &a, &os, seqs, n, &loss[k], &gn);
        if (ps.fsdp) fsdp_get_stats(ps.fsdp, &s1);
        CHECK_R(!keep || (s1.allgather_bytes - s0.allgather_bytes == unit_bytes &&
                          s1.reduce_scatter_bytes - s0.reduce_scatter_bytes == unit_bytes),
                "%s step %d stage %d: all-gather %.0f B, reduce-scatter %.0f B; once per unit and update is %.0f B",
                RANK, tag, k, ps.grid->stage, s1.allgather_bytes - s0.allgather_bytes,
                s1.reduce_scatter_bytes - s0.reduce_scatter_bytes, unit_bytes);
        if (RANK == 0 && k == 0 && ps.fsdp)
            printf("  %s stage 0: step all-gather %.0f B, reduce-scatter %.0f B (units once: %.0f B)\n", tag,
                   s1.allgather_bytes - s0.allgather_bytes, s1.reduce_scatter_bytes - s0.reduce_scatter_bytes,
                   unit_bytes);
        CHECK_R(rc == MOERL_OK, "%s step %d: %s", RANK, tag, k, moerl_last_error());
        if (rc != MOERL_OK) break;
        /* the whole model's norm (squares summed over the FSDP group, then over the stages) against one
         * rank's single pass: summation order only, 1e-5 relative (a lost or doubled shard moves it by
         * its share, far more) */
        CHECK_R(fabs(gn - ref_gn[k]) <= 1e-5 * ref_gn[k], "%s step %d: gradient norm %.9g, one rank %.9g", RANK, tag,
                k, gn, ref_gn[k]);
    }
    /* pipeline × EP: every stage has MoE layers (layer 2 is the only dense one), whose rows went through the
     * expert group's exchanges */
    if (ps.ep)
        CHECK_R(ep_get_stats(ps.ep).exchanges > 0, "%s stage %d: no expert-parallel exchange ran", RANK, tag,
                ps.grid->stage);
    /* the optimizer step released every gathered unit: at most the pages straddling unit ends stay
     * (two per unit of the stage) */
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), rp = ps.fsdp ? resident_bytes(m.params, m.n_params * 4) : 0;
    CHECK_R(rp <= 2 * (size_t)(m.cfg.num_hidden_layers + 2) * pg, "%s stage %d: %zu bytes of the parameter map "
            "resident after the step", RANK, tag, ps.grid->stage, rp);
    /* losses: per-micro-batch sums in another grouping than one rank's: 1e-5 relative */
    snprintf(what, sizeof what, "%s losses vs data parallel", tag);
    t_close(what, loss, ref_loss, K_STEPS, 1e-6f, 1e-5f);
    /* the whole model and moments on a keeper: rank 0 (stage 0), then the last rank (the last stage) */
    for (int kk = 0; kk < 2; kk++) {
        const int keeper = kk ? T - 1 : 0;
        adamw_state mom;
        const moe_model *full = par_gather_full(&ps, &m, RANK == keeper, &os, &mom);
        CHECK_R((RANK == keeper) == (full != NULL), "%s gather on %d: %s", RANK, tag, keeper, moerl_last_error());
        if (full) {
            /* weights: gradient sums over the FSDP group / pipelines in another order than one rank's, and
             * the clip factor's last bit: ≈ 1e-7 relative of an update of ≈ lr = 3e-3 per step; 1e-6
             * absolute on weights of scale 0.02 keeps a lost shard or a wrong range (~lr per step) out */
            snprintf(what, sizeof what, "%s gathered weights on rank %d vs data parallel", tag, keeper);
            t_close(what, full->params, ref.params, (long)ref.n_params, g_wtol, 0.0f);
            /* moments: m ≈ 0.1·g (scale 1e-3), v ≈ 0.05·g² (scale 1e-6): the same last bits, 1e-4 relative
             * with floors 1e-8 / 1e-11 for entries whose gradient sums nearly cancel */
            snprintf(what, sizeof what, "%s gathered moments m on rank %d", tag, keeper);
            t_close(what, mom.m, ref_os.m, (long)ref.n_params, 1e-8f, 1e-4f);
            snprintf(what, sizeof what, "%s gathered moments v on rank %d", tag, keeper);
            t_close(what, mom.v, ref_os.v, (long)ref.n_params, 1e-11f, 1e-4f);
            CHECK(mom.n == ref.n_params && mom.step == K_STEPS, "%s: gathered moments n %zu step %lld", tag, mom.n,
                  (long long)mom.step);
        }
        par_release_full(&ps, &m, full, &os, &mom);
        const size_t r2 = ps.fsdp ? resident_bytes(m.params, m.n_params * 4) : 0;
        CHECK_R(r2 <= 2 * (size_t)(m.cfg.num_hidden_layers + 2) * pg, "%s: %zu bytes resident after par_release_full",
                RANK, tag, r2);
    }
    adamw_free(&os);
    model_acts_free(&a);
    par_state_free(&ps); /* the whole model back in m on every rank */
    snprintf(what, sizeof what, "%s weights after par_state_free (rank %d)", tag, RANK);
    CHECK_R(t_close(what, m.params, ref.params, (long)ref.n_params, g_wtol, 0.0f), "%s", RANK, what);

    /* resume: the whole weights (this run's) and whole moments (a checkpoint's: the reference's, the
     * same within the tolerances above) into a new par_state, one more step against the reference's
     * step K + 1 (same tolerances) */
    resume_check(&pc, m.params, D, seqs, n, tag, 2 * g_wtol, 0.0f, &ref, &ref_os, ref_loss, ref_gn);
    if (RANK == 0)
        for (int k = 0; k < K_STEPS; k++)
            printf("  %s step %d loss %.8f  data parallel %.8f\n", tag, k, loss[k], ref_loss[k]);
    adamw_free(&ref_os);
    model_free(&ref);
    model_free(&m);
}

/* Uneven shares: pipeline 0 trains all 12 sequences (≥ 5 micro-batches), the others two (sequences 7
 * and 3: two micro-batches) or none. Every pipeline of a stage runs the same count (agree_count): the
 * short ones append empty micro-batches that run FSDP's collectives only. One step through
 * parallel.h against one rank running the same shares (gradients summed over them): the gradient norm
 * within 1e-5 relative (summation order only; a pipeline whose empty passes added anything, or whose
 * collectives paired with the wrong pass, is far off or hangs — timeout in e2e_mpi.sh). */
static int uneven_share(int d, int others_none, train_seq *seqs) {
    int n = 0;
    if (d == 0) return shard(0, 1, seqs);
    for (int s = 7; s >= 3 && !others_none; s -= 4)
        seqs[n++] = (train_seq){.tokens = g_tokens[s], .len = seq_len[s], .resp_start = prompt_len[s]};
    return n;
}

static void test_uneven(int pp, int fsdp, int others_none) {
    const int T = g_ctx->world_size, D = T / pp;
    if (D < 2 || (pp > 2 && !others_none)) return; /* two sequences fill at most 2 stages */
    const moe_config c = cfg_model();
    /* the reference: one rank, the D shares in order, gradients added; the global counts of all shares */
    moe_model ref;
    MOERL_ASSERT(model_init(&ref, &c) == MOERL_OK);
    model_init_random(&ref, 4242);
    model_acts ra;
    MOERL_ASSERT(model_acts_init(&ra, &ref, MAX_TOK) == MOERL_OK);
    train_seq seqs[N_SEQ];
    double counts[8] = {0};
    for (int d = 0; d < D; d++) {
        const int n = uneven_share(d, others_none, seqs);
        if (n) MOERL_ASSERT(compute_router_counts(&ref, &ra, seqs, n, MAX_TOK, counts) == MOERL_OK);
    }
    train_step_opts to = {.max_tokens = MAX_TOK, .temperature = 1.0f, .aux_coef = g_aux_coef,
                          .total_tokens = total_tokens(), .aux_counts = counts};
    float *sum = xcalloc(ref.n_params, sizeof(float));
    for (int d = 0; d < D; d++) {
        const int n = uneven_share(d, others_none, seqs);
        train_step_out so;
        MOERL_ASSERT(train_accumulate(&ref, &ra, seqs, n, &to, sft_cb, NULL, &so) == MOERL_OK);
        for (size_t i = 0; i < ref.n_params; i++) sum[i] += ref.grads[i];
    }
    double ss = 0;
    for (size_t i = 0; i < ref.n_params; i++) ss += (double)sum[i] * sum[i];
    const double ref_gn = sqrt(ss);
    free(sum);
    model_acts_free(&ra);
    model_free(&ref);

    const par_config pc = layout(pp, fsdp, 0, 1);
    par_state ps;
    moe_model m;
    CHECK_R(compose_init(&ps, &m, &pc, NULL) == MOERL_OK, "uneven fixture: %s", RANK, moerl_last_error());
    if (!ps.pp) return;
    const int n = uneven_share(ps.grid->dp_rank, others_none, seqs);
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, MAX_TOK) == MOERL_OK);
    a.par = &ps;
    adamw_state os;
    par_adamw_init(&ps, &m, &os, opt_config());
    float l;
    double gn = 0;
    const int rc = step(&ps, &m, &a, &os, seqs, n, &l, &gn);
    CHECK_R(rc == MOERL_OK && fabs(gn - ref_gn) <= 1e-5 * ref_gn,
            "pp %d x fsdp %d x ep %d, uneven shares (others %s), pipeline %d: rc %d (%s), gradient norm %.9g, one rank %.9g",
            RANK, pp, fsdp, g_ep, others_none ? "none" : "two", ps.grid->dp_rank, rc, rc ? moerl_last_error() : "", gn,
            ref_gn);
    if (RANK == 0)
        printf("  pp %d x fsdp %d x ep %d, uneven shares (others %s): gradient norm %.9f, one rank %.9f\n", pp, fsdp,
               g_ep, others_none ? "none" : "two sequences", gn, ref_gn);
    adamw_free(&os);
    model_acts_free(&a);
    par_state_free(&ps);
    model_free(&m);
}

/* What does not compose yet is refused by par_state_init naming the keys, on every rank, with the model
 * unchanged: the pipeline with EP and FSDP together, with Ulysses SP, and pipeline × FSDP on tied
 * embeddings. */
static void test_refusals(int pp) {
    struct {
        int ep, sp, fsdp, tied, vpp;
        const char *want;
    } cases[] = {{2, 1, 2, 0, 1, "actor.fsdp_config.fsdp_size (2)"},
                 {1, 2, 1, 0, 1, "actor.ulysses_sequence_parallel_size (2)"},
                 {1, 1, 2, 1, 1, "tie_word_embeddings"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *tie = cases[i].tied ? "model.tie_word_embeddings=true" : "model.tie_word_embeddings=false";
        const char *kv[] = {"model.num_hidden_layers=4", "model.num_key_value_heads=2", "model.num_experts=4",
                            "model.num_experts_per_tok=2", "model.mlp_only_layers=[2]", tie};
        const moe_config c = fx_small_config(kv, FX_N(kv));
        moe_model m;
        MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
        model_init_random(&m, 4242);
        const size_t n0 = m.n_params;
        par_config pc = layout(pp, cases[i].fsdp, 0, cases[i].vpp);
        pc.expert_parallel_size = cases[i].ep;
        pc.ulysses_sequence_parallel_size = cases[i].sp;
        par_state ps;
        const int rc = par_state_init_cfg(&ps, g_ctx, &pc, &m);
        CHECK_R(rc == MOERL_ERR && strstr(moerl_last_error(), cases[i].want) &&
                    strstr(moerl_last_error(), "actor.pipeline_parallel_size") && m.n_params == n0 && !par_active(&ps),
                "pp %d with ep %d sp %d fsdp %d tied %d: rc %d, '%s' (want '%s')", RANK, pp, cases[i].ep, cases[i].sp,
                cases[i].fsdp, cases[i].tied, rc, moerl_last_error(), cases[i].want);
        if (rc == MOERL_OK) par_state_free(&ps);
        model_free(&m);
    }
}

int main(int argc, char **argv) {
    g_ctx = dist_init(&argc, &argv);
    if (!g_ctx || dist_split_roles(g_ctx, g_ctx->world_size) != MOERL_OK) {
        fprintf(stderr, "test_dist_compose: %s\n", moerl_last_error());
        return 1;
    }
    int pp = 2, fsdp = 2, keep = 0, vpp = 1, tp = 1, fsdp_given = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pp") && i + 1 < argc) pp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fsdp") && i + 1 < argc) fsdp = atoi(argv[++i]), fsdp_given = 1;
        else if (!strcmp(argv[i], "--vpp") && i + 1 < argc) vpp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ep") && i + 1 < argc) g_ep = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tp") && i + 1 < argc) tp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--keep")) keep = 1;
        else if (!strcmp(argv[i], "--dynamic")) g_dynamic = 1;
        else {
            fprintf(stderr, "test_dist_compose: unknown argument '%s' (--pp P --fsdp F [--ep E] [--vpp V] [--keep] [--dynamic] | --tp T --pp P)\n", argv[i]);
            return 2;
        }
    }
    g_aux_coef = g_dynamic ? 0.0f : cfg_model().router_aux_loss_coef;
    if (g_dynamic || g_ep > 1) g_wtol = 2e-5f;
    rng_state r;
    rng_seed(&r, 77);
    for (int s = 0; s < N_SEQ; s++)
        for (int t = 0; t < seq_len[s]; t++) g_tokens[s][t] = (int)rng_below(&r, 64);
    int resp = 0;
    for (int s = 0; s < N_SEQ; s++) resp += seq_len[s] - prompt_len[s];
    g_inv_resp = 1.0 / resp;
    if (RANK == 0) printf("test_dist_compose: backend %s, %d ranks\n", dist_backend_name(), g_ctx->world_size);
    if (tp > 1 && (fsdp_given || keep || vpp > 1 || g_dynamic || g_ep > 1)) {
        fprintf(stderr, "test_dist_compose: --tp runs TP x pipeline alone: no --fsdp, --ep, --keep, --vpp or --dynamic\n");
        return 2;
    }
    if (tp > 1) { /* TP × pipeline (--tp T --pp P) */
        tp_pp_refusals();
        if (g_ctx->world_size >= 4 && g_ctx->world_size % (pp * tp) == 0) test_tp_pp(pp, tp);
        return dist_test_finish(g_ctx);
    }
    if (g_ctx->world_size >= 4 && g_ctx->world_size % pp == 0) {
        test_compose(pp, fsdp, keep, vpp);
        test_uneven(pp, fsdp, 0);
        test_uneven(pp, fsdp, 1);
        if (pp == 2 && g_ctx->world_size == 4 && !keep && vpp == 1 && g_ep == 1) test_refusals(pp);
    }
    return dist_test_finish(g_ctx);
}
