/* SFT loop (see sft.h). */
#include "rl/sft.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/signals.h"
#include "train/ckpt.h"
#include "data/tokenizer.h"
#include "dist/dist.h"
#include "model/safetensors.h"
#include "parallel/ep.h"
#include "parallel/fsdp.h"
#include "parallel/pipeline.h"
#include "parallel/parallel.h"
#include "train/train.h"

/* The run's ranks (sft_opts.dist / .par): one process, data parallel, or model parallel (FSDP,
 * expert parallel, ... through parallel.h's entry points). */
typedef struct {
    dist_ctx *dc;       /* NULL or one trainer: one process */
    par_state *ps;
    fsdp_state *fs;     /* NULL: parameters replicated */
    int pp;             /* pipeline: stage-owned model (pipeline.h), assembled by par_gather_full */
    moe_model *m;
    int multi, root;    /* several trainer ranks; this rank writes (trainer rank 0) */
    int shard, n_shards;/* this rank's share of each batch */
} sft_ranks;

/* Sum x[n] over the trainer ranks (nothing in one process). */
static int ranks_sum(const sft_ranks *R, double *x, int n) {
    return R->multi ? dist_allreduce_sum(R->dc, DIST_TRAINERS, x, n) : MOERL_OK;
}

/* Every rank learns whether all succeeded (rc on each); a rank that did not fail but sees a
 * failure elsewhere fails too, with a message naming it. */
static int ranks_agree(const sft_ranks *R, int rc) {
    if (!R->multi) return rc;
    double bad = rc != MOERL_OK;
    if (ranks_sum(R, &bad, 1) != MOERL_OK) return MOERL_ERR;
    if (bad > 0 && rc == MOERL_OK) return moerl_errorf("SFT stopped: another trainer rank failed (its message is above)");
    return rc;
}

/* ranks_agree, for a refusal that may hold on some ranks only: every rank learns whether any failed,
 * and the lowest failing trainer rank alone reports it (*quiet = 1 on the others, whose message
 * then names that rank). */
static int ranks_agree_once(const sft_ranks *R, int rc, int *quiet) {
    *quiet = 0;
    if (!R->multi) return rc;
    const int D = R->dc->trainer_size;
    double *bad = xcalloc((size_t)D, sizeof(double));
    bad[R->dc->trainer_rank] = rc != MOERL_OK;
    const int src = ranks_sum(R, bad, D);
    int first = -1;
    for (int d = 0; d < D && first < 0; d++)
        if (bad[d] > 0) first = d;
    free(bad);
    if (src != MOERL_OK) return MOERL_ERR;
    if (first < 0) return MOERL_OK;
    *quiet = first != R->dc->trainer_rank;
    if (*quiet) return moerl_errorf("SFT stopped: trainer rank %d refused the step (its message is above)", first);
    return MOERL_ERR;
}

/* The root's value of x on every rank. */
static int ranks_from_root(const sft_ranks *R, double *x) {
    if (!R->multi) return MOERL_OK;
    if (!R->root) *x = 0;
    return ranks_sum(R, x, 1);
}

/* The whole model on the root (par_gather_full: FSDP gathers into m, expert parallelism assembles a
 * copy; the other ranks take part and get NULL). *erc: MOERL_ERR when the root got nothing. */
static const moe_model *full_on_root(const sft_ranks *R, moe_model *m, int *erc) {
    const moe_model *f = par_gather_full(R->ps, m, R->root, NULL, NULL);
    *erc = R->root && !f ? MOERL_ERR : MOERL_OK;
    return f;
}
static void full_done(const sft_ranks *R, moe_model *m, const moe_model *f) {
    par_release_full(R->ps, m, f, NULL, NULL);
}

typedef struct {
    double inv_tokens; /* 1 / loss tokens of the global batch (response tokens whose resp_mask is not 0) */
    double ce_sum;
} sft_ctx;

static double sft_grad(void *vctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                       float *dent) {
    sft_ctx *ctx = vctx;
    double loss = 0;
    for (int n = 0; n < a->N; n++) {
        if (resp_index[n] < 0) continue;
        loss -= a->logp[n] * ctx->inv_tokens;
        dlogp[n] = (float)(-ctx->inv_tokens);
    }
    ctx->ce_sum += loss;
    return loss;
}

/* Write the resumable state (see sft_opts.state_dir); the root writes, every rank takes part
 * (FSDP gathers the weights and the moments onto the root). */
static int sft_save_state_root(const moe_model *m, const adamw_state *os, const dataset *train, const sft_opts *o,
                               int64_t step, double acc0, int finished);
static int sft_save_state(const sft_ranks *R, moe_model *m, const adamw_state *os, const dataset *train,
                          const sft_opts *o, int64_t step, double acc0, int finished) {
    adamw_state full;
    const moe_model *f = par_gather_full(R->ps, m, R->root, os, &full);
    int rc = R->root && !f ? MOERL_ERR : MOERL_OK;
    if (rc == MOERL_OK && R->root) rc = sft_save_state_root(f, &full, train, o, step, acc0, finished);
    par_release_full(R->ps, m, f, os, &full);
    return ranks_agree(R, rc);
}

static int sft_save_state_root(const moe_model *m, const adamw_state *os, const dataset *train, const sft_opts *o,
                               int64_t step, double acc0, int finished) {
    char tmp[4200], p[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->state_dir);
    ckpt_remove_flat_dir(tmp);
    if (moerl_mkdirs(tmp) != MOERL_OK || model_save_hf(m, tmp, 0, 0) != MOERL_OK) return MOERL_ERR;
    if (tokenizer_save(tok_current(), tmp) != MOERL_OK) return MOERL_ERR; /* a checkpoint carries its tokenizer */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
    if (ckpt_save_optimizer(os, p) != MOERL_OK) return MOERL_ERR;
    json_t *s = json_object();
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)dataset_fingerprint(train));
    json_object_set_new(s, "format", json_string("moerl-sft-state"));
    json_object_set_new(s, "format_version", json_integer(1));
    json_object_set_new(s, "step", json_integer(step));
    json_object_set_new(s, "optimizer_step", json_integer(os->step));
    json_object_set_new(s, "optimizer_skipped", json_integer(os->skipped));
    json_object_set_new(s, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(s, "batch_size", json_integer(o->batch_size));
    json_object_set_new(s, "n_rows", json_integer(dataset_count(train)));
    json_object_set_new(s, "data_fingerprint", json_string(fp));
    json_object_set_new(s, "accuracy_before", isfinite(acc0) ? json_real(acc0) : json_null());
    json_object_set_new(s, "stopped_at_accuracy", json_boolean(finished)); /* sft.stop_at_accuracy ended it */
    char *txt = json_dumps(s, JSON_INDENT(1));
    json_decref(s);
    snprintf(p, sizeof p, "%s/sft_state.json", tmp);
    const int rc = moerl_write_file_atomic(p, txt, strlen(txt));
    free(txt);
    if (rc != MOERL_OK || ckpt_swap_dir(tmp, o->state_dir) != MOERL_OK) return MOERL_ERR;
    return MOERL_OK;
}

/* The optimizer moments from optimizer.safetensors (the whole model's layout, whatever rank count
 * wrote it): the whole vectors, or this rank's part of them under FSDP / expert parallelism
 * (par_slice_vec straight from the mapped file). */
static int load_optimizer(const sft_ranks *R, const moe_model *m, adamw_state *os, const char *path) {
    if (!par_grads_self_reduced(R->ps)) return ckpt_load_optimizer(os, path);
    const size_t n_params = par_whole_params(R->ps, m);
    st_file f;
    if (st_open(&f, path) != MOERL_OK) return MOERL_ERR;
    const st_tensor *tm = st_find(&f, "adam.m"), *tv = st_find(&f, "adam.v");
    if (!tm || !tv || tm->numel != (int64_t)n_params || tv->numel != (int64_t)n_params || tm->dtype != ST_F32 ||
        tv->dtype != ST_F32) {
        st_close(&f);
        return moerl_errorf("%s: adam.m/adam.v missing, not F32 or not %zu floats", path, n_params);
    }
    par_slice_vec(R->ps, m, tm->data, os->m);
    par_slice_vec(R->ps, m, tv->data, os->v);
    st_close(&f);
    return MOERL_OK;
}

/* The held-out accuracy at the end of a finished run, added to its state's sft_state.json (written
 * atomically), so that a rerun with nothing left to do reports it. */
static int sft_record_after(const char *state_dir, double acc) {
    char p[4300];
    snprintf(p, sizeof p, "%s/sft_state.json", state_dir);
    json_error_t err;
    json_t *s = json_load_file(p, 0, &err);
    if (!s) return moerl_errorf("%s:%d: %s", p, err.line, err.text);
    json_object_set_new(s, "accuracy_after", isfinite(acc) ? json_real(acc) : json_null());
    char *txt = json_dumps(s, JSON_INDENT(1));
    json_decref(s);
    const int rc = moerl_write_file_atomic(p, txt, strlen(txt));
    free(txt);
    return rc;
}

/* Load the resumable state if present: 1 resumed (weights, optimizer, *step, *acc0), 0 none. */
static int sft_load_state(const sft_ranks *R, moe_model *m, adamw_state *os, const dataset *train, const sft_opts *o,
                          int64_t *step, double *acc0, int *finished, double *acc_end) {
    char dir[4200], p[4300];
    snprintf(dir, sizeof dir, "%s", o->state_dir);
    snprintf(p, sizeof p, "%s/sft_state.json", dir);
    if (access(p, R_OK) != 0) { /* a kill between the two renames of the swap leaves .old */
        snprintf(dir, sizeof dir, "%s.old", o->state_dir);
        snprintf(p, sizeof p, "%s/sft_state.json", dir);
        if (access(p, R_OK) != 0) {
            snprintf(p, sizeof p, "%s/model.safetensors", o->state_dir);
            char q[4300];
            snprintf(q, sizeof q, "%s/trainer_state.json", o->state_dir);
            if (access(q, F_OK) == 0)
                return moerl_errorf("%s holds a moerl rl checkpoint (trainer_state.json), not an SFT run to resume: use "
                                    "another trainer.default_local_dir (model.path can point at it)", o->state_dir);
            if (access(p, F_OK) == 0)
                return moerl_errorf("%s holds a checkpoint without sft_state.json (a finished SFT run of an older moerl, "
                                    "or a copied model?), not an SFT run to resume: use another trainer.default_local_dir, "
                                    "or trainer.resume_mode=disable trainer.overwrite_output_dir=true to replace it",
                                    o->state_dir);
            return 0;
        }
    }
    json_error_t err;
    json_t *s = json_load_file(p, 0, &err);
    if (!s)
        return moerl_errorf("%s:%d: %s (the file is damaged: move the checkpoint folder away or set "
                            "trainer.resume_mode=disable)", p, err.line, err.text);
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)dataset_fingerprint(train));
    const char *fmt = json_string_value(json_object_get(s, "format")), *sfp = json_string_value(json_object_get(s, "data_fingerprint"));
    json_t *jst = json_object_get(s, "step");
    int bad = !fmt || strcmp(fmt, "moerl-sft-state") || json_integer_value(json_object_get(s, "format_version")) != 1 ||
              !json_is_integer(jst) || json_integer_value(jst) < 0;
    if (bad) {
        json_decref(s);
        return moerl_errorf("%s: not a moerl SFT state of format_version 1 with a step ≥ 0 (the file is damaged: move "
                            "the checkpoint folder away or set trainer.resume_mode=disable)", p);
    }
    {
        char what[200] = "";
        const long long sbs = json_integer_value(json_object_get(s, "batch_size"));
        const unsigned long long sseed = (unsigned long long)json_integer_value(json_object_get(s, "seed"));
        if (!sfp || strcmp(sfp, fp) || json_integer_value(json_object_get(s, "n_rows")) != dataset_count(train))
            snprintf(what, sizeof what, "other training data (its rows are fingerprinted)");
        else if (sseed != o->seed)
            snprintf(what, sizeof what, "trainer.seed %llu (now %llu)", sseed, (unsigned long long)o->seed);
        else if (sbs != o->batch_size) /* the data order is replayed per batch: a resume keeps the batch size */
            snprintf(what, sizeof what, "batch size %lld (now %d; data.train_batch_size / sft.train_batch_size)", sbs,
                     o->batch_size);
        if (what[0]) {
            json_decref(s);
            return moerl_errorf("%s: the checkpoint was made with %s; resume with the same setting, or use a new "
                                "trainer.default_local_dir, or trainer.resume_mode=disable", p, what);
        }
    }
    if (par_load_weights(R->ps, m, dir) != MOERL_OK) { /* expert parallel: its experts only; TP: its slice */
        json_decref(s);
        return MOERL_ERR;
    }
    if (R->fs) fsdp_take_shard(R->fs); /* FSDP: keep this rank's shard only */
    if (R->pp) par_take_full(R->ps, m); /* pipeline: keep this stage's range only */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (load_optimizer(R, m, os, p) != MOERL_OK) {
        json_decref(s);
        return MOERL_ERR;
    }
    *step = json_integer_value(jst);
    os->step = json_integer_value(json_object_get(s, "optimizer_step"));
    os->skipped = json_integer_value(json_object_get(s, "optimizer_skipped"));
    json_t *a = json_object_get(s, "accuracy_before");
    *acc0 = json_is_number(a) ? json_number_value(a) : NAN;
    *finished = json_is_true(json_object_get(s, "stopped_at_accuracy"));
    json_t *ae = json_object_get(s, "accuracy_after"); /* recorded once the run finished (sft_record_after) */
    *acc_end = json_is_number(ae) ? json_number_value(ae) : NAN;
    json_decref(s);
    return 1;
}

/* The aux loss over the whole global batch (as one forward of it would form it), when the batch
 * is split over ranks or micro-batches: every MoE layer's top-k counts first (forward only),
 * summed over the ranks. */
static int n_moe_layers(const moe_config *c) {
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += moe_config_layer_is_moe(c, l);
    return n;
}

/* One optimizer step's gradient on this rank's share `mine[n]` of the global batch (tokens of the
 * global batch: g_tokens, its loss tokens (train_seq_loss_tokens): g_resp; global_aux: the aux over
 * the whole batch), reduced over the ranks (DP reducer or FSDP), then AdamW. Outputs the global loss, ce, aux,
 * tokens (summed over the ranks) and the gradient norm. */
typedef struct {
    double loss, ce, aux, tokens, grad_norm;
    int applied;
} sft_step_out;

static void reducer_hook(void *ctx, int group) { MOERL_ASSERT(dist_reducer_layer_done(ctx, group) == MOERL_OK); }

static int sft_step(const sft_ranks *R, dist_grad_reducer *red, moe_model *m, model_acts *acts, adamw_state *os,
                    const train_seq *mine, int n, int64_t g_tokens, int64_t g_resp, int global_aux, float lr,
                    const sft_opts *o, sft_step_out *out) {
    const int E = m->cfg.num_experts;
    double *aux = xcalloc((size_t)(2 * E + 4), sizeof(double)), *counts = aux, *psum = aux + E, *sums = aux + 2 * E;
    train_step_opts to = {.max_tokens = o->max_tokens, .temperature = 1.0f, .want_entropy = 0,
                          .aux_coef = m->cfg.router_aux_loss_coef, .total_tokens = g_tokens, .par = R->ps};
    if (red) {
        to.layer_hook = reducer_hook;
        to.layer_hook_ctx = red;
    }
    int rc = MOERL_ERR;
    if (R->ps && R->ps->pp) { /* every pipeline can schedule its share, or no rank enters the step */
        int quiet;
        const int ok = ranks_agree_once(R, pp_check_batch(R->ps->pp, mine, n, o->max_tokens), &quiet);
        if (o->quiet_error_out) *o->quiet_error_out = quiet;
        if (ok != MOERL_OK) goto out;
    }
    const int n_mb = count_microbatches(mine, n, o->max_tokens), max_mb = par_max_passes(R->ps, n_mb);
    if (n_mb < 0 || max_mb < 0) goto out;
    if (global_aux) {
        if (compute_router_counts(m, acts, mine, n, o->max_tokens, counts) != MOERL_OK) goto out;
        if (par_pad_passes(R->ps, n_mb, max_mb, 0) != MOERL_OK || ranks_sum(R, counts, E) != MOERL_OK) goto out;
        if (R->ps && R->ps->pp) /* every stage of a pipeline counted its shard: count it once (pipeline.h) */
            for (int e = 0; e < E; e++) counts[e] /= R->ps->grid->pp;
        for (int e = 0; e < E; e++) counts[e] /= par_batch_copies(R->ps); /* TP: every member counted the same */
        to.aux_counts = counts;
        to.aux_psum_out = psum;
    }
    sft_ctx sc = {.inv_tokens = g_resp > 0 ? 1.0 / (double)g_resp : 0.0};
    train_step_out so;
    if (train_accumulate(m, acts, mine, n, &to, sft_grad, &sc, &so) != MOERL_OK) goto out;
    if (par_finish_grads(R->ps, n_mb, max_mb) != MOERL_OK) goto out; /* FSDP / EP sums (par_grads_self_reduced) */
    if (red) dist_reducer_finish(red);
    sums[0] = sc.ce_sum;
    sums[1] = (double)so.n_tokens;
    sums[2] = so.aux_loss;
    if (ranks_sum(R, sums, 3) != MOERL_OK || (global_aux && ranks_sum(R, psum, E) != MOERL_OK)) goto out;
    for (int i = 0; i < 3; i++) sums[i] /= par_batch_copies(R->ps); /* TP: every member has the same sums */
    for (int e = 0; global_aux && e < E; e++) psum[e] /= par_batch_copies(R->ps);
    out->ce = sums[0];
    out->tokens = sums[1];
    out->aux = sums[2]; /* token-weighted mean of the micro-batches' own aux losses */
    if (global_aux) {   /* HF's aux of the whole batch: E·Σ_e f_e·P_e with f, P over its L·N rows */
        const double rows = (double)n_moe_layers(&m->cfg) * (double)g_tokens;
        double v = 0;
        for (int e = 0; e < E; e++) v += counts[e] * psum[e];
        out->aux = E * v / (rows * rows);
    }
    out->loss = out->ce + m->cfg.router_aux_loss_coef * out->aux;
    out->applied = par_adamw_step(R->ps, m, os, lr, (float)out->loss, &out->grad_norm);
    rc = MOERL_OK;
out:
    free(aux);
    return rc;
}

/* Before any step (and the held-out eval): can every data-parallel pipeline schedule its share of
 * each batch — batch_size / D sequences, one more for the first batch_size mod D shares — when all
 * of them are as long as the longest row (pp_count_allowed, the worst case)? Config and data only:
 * the same verdict on every rank. */
static int sft_check_pipeline_shares(const sft_ranks *R, const sft_opts *o, const tok_seq *seqs, int64_t n_rows) {
    int64_t longest = 0;
    for (int64_t i = 0; i < n_rows; i++) longest = MOERL_MAX(longest, seqs[i].n);
    const int D = R->n_shards, bs = o->batch_size, pp = R->ps->grid->pp, v = pp_chunks(R->ps->pp);
    for (int k = 0; k < 2; k++) { /* the larger share, then the smaller (equal when D divides bs) */
        const int share = bs / D + (k == 0 && bs % D ? 1 : 0);
        if (pp_count_allowed(share, (int)longest, o->max_tokens, pp, v)) continue;
        const int need = pp_count_needed(share, (int)longest, o->max_tokens, pp, v);
        return moerl_errorf(
            "pipeline: data.train_batch_size=%d over %d data-parallel pipeline%s gives a pipeline %d sequence%s per "
            "step, but with every sequence as long as the longest row (%lld tokens) and at most %d tokens per "
            "micro-batch, %d pipeline stage%s%s need %d micro-batches, and %d sequence%s cannot make that many "
            "(a sequence is never split): change data.train_batch_size or data.max_token_len_per_micro_batch, or "
            "lower actor.pipeline_parallel_size%s",
            bs, D, moerl_plural(D), share, moerl_plural(share), (long long)longest, o->max_tokens, pp,
            moerl_plural(pp), v > 1 ? " (interleaved: a multiple of actor.pipeline_parallel_size)" : "", need, share,
            moerl_plural(share), v > 1 ? " or set actor.virtual_pipeline_parallel_size=1" : "");
    }
    return MOERL_OK;
}

/* One sft_train call: its ranks, the encoded rows and the training state. */
typedef struct {
    sft_ranks R;
    moe_model *m;
    const dataset *train, *test;
    const sft_opts *o;
    int64_t n_rows;
    int bs;
    tok_seq *seqs;
    int *resp_start, *order;
    uint8_t **resp_mask; /* [n_rows]: a row's loss mask over its response (NULL: every response token) */
    train_seq *batch, *mine;
    metrics_writer *mw;
    model_acts acts;
    adamw_state os;
    dist_grad_reducer *red;
    int64_t total, step0, step, tokens_seen;
    double acc0, acc, acc_end, mlen;
    int resumed, finished, aux_on, stopped;
    progress pb;
} sft_run;

/* The checks of the options that need no data; the ranks. */
static int sft_run_init(sft_run *S) {
    const sft_opts *o = S->o;
    const int bs = S->bs;
    /* the checks before the first step see the same config and data on every rank, so they fail alike:
     * rank 0 reports them (reset once they pass, so that a rank's own failure later is its own to print) */
    if (o->quiet_error_out) *o->quiet_error_out = o->dist && o->dist->trainer_rank > 0;
    if (bs <= 0 || bs > S->n_rows)
        return moerl_errorf("SFT batch size %d (data.train_batch_size, or sft.train_batch_size for the warm start) must be "
                            "in 1..%lld, the training rows (after sft.validation_rows)", bs, (long long)S->n_rows);
    if (!(o->optim.lr >= 0) || !isfinite(o->optim.lr) || !(o->optim.weight_decay >= 0) || !isfinite(o->optim.weight_decay))
        return moerl_errorf("SFT learning rate and weight decay (optim.lr / optim.weight_decay, sft.lr / sft.weight_decay "
                            "for the warm start) must be finite numbers ≥ 0 (got %g, %g)",
                            (double)o->optim.lr, (double)o->optim.weight_decay);
    sft_ranks *R = &S->R;
    *R = (sft_ranks){.dc = o->dist, .ps = o->par, .fs = o->par ? o->par->fsdp : NULL, .root = 1, .n_shards = 1,
                     .m = S->m};
    R->pp = o->par && o->par->pp && pp_is_owned(o->par->pp);
    R->multi = R->dc && R->dc->trainer_size > 1;
    if (R->dc && R->dc->trainer_rank > 0) R->root = 0;
    par_data_shard(R->ps, &R->shard, &R->n_shards);
    if (!R->ps && R->multi) {
        R->shard = R->dc->trainer_rank;
        R->n_shards = R->dc->trainer_size;
    }
    S->seqs = xcalloc(S->n_rows, sizeof(tok_seq));
    S->resp_start = xmalloc(S->n_rows * sizeof(int));
    S->resp_mask = xcalloc(S->n_rows, sizeof(uint8_t *));
    S->order = xmalloc(S->n_rows * sizeof(int));
    S->batch = xmalloc(bs * sizeof(train_seq));
    S->mine = xmalloc(bs * sizeof(train_seq));
    return MOERL_OK;
}

/* Every row chat-encoded with its response, checked against the vocabulary and the micro-batch (on
 * every rank, so no rank fails alone inside a step). */
static int sft_encode_rows(sft_run *S) {
    const dataset *train = S->train;
    char where[4200];
    for (int64_t i = 0; i < S->n_rows; i++) {
        const ds_row *r = dataset_row(train, i);
        tok_seq *q = &S->seqs[i];
        /* the prompt, then the response (a string, or messages: the assistant turns masked 1) */
        if (ds_row_encode_sft(r, dataset_where(train, r->line, where, sizeof where), q, &S->resp_start[i],
                              &S->resp_mask[i]) != MOERL_OK)
            return MOERL_ERR;
        for (int64_t t = 0; t < q->n; t++)
            if (q->ids[t] >= moe_config_vocab(&S->m->cfg))
                return moerl_errorf("%s: token %d outside the model's vocabulary %d",
                                    dataset_where(train, r->line, where, sizeof where), q->ids[t], moe_config_vocab(&S->m->cfg));
        if (q->n > S->o->max_tokens)
            return moerl_errorf("%s: the row has %lld tokens, more than a micro-batch holds (%d): raise "
                                "data.max_token_len_per_micro_batch (actor.ppo_max_token_len_per_gpu for the warm start)",
                                dataset_where(train, r->line, where, sizeof where), (long long)q->n, S->o->max_tokens);
    }
    return MOERL_OK;
}

/* The step count, the optimizer, the activations and (data parallel) the gradient reducer. */
static int sft_run_prepare(sft_run *S) {
    const sft_opts *o = S->o;
    sft_ranks *R = &S->R;
    /* o->skip_pp_share_check (tests only): skip it, so that a test reaches the in-step agreement (sft_step) */
    if (R->ps && R->ps->pp && !o->skip_pp_share_check &&
        sft_check_pipeline_shares(R, o, S->seqs, S->n_rows) != MOERL_OK) {
        if (o->quiet_error_out) *o->quiet_error_out = !R->root; /* the same verdict on every rank */
        return MOERL_ERR;
    }
    S->total = o->total_epochs * (S->n_rows / S->bs);
    if (o->total_steps > 0) S->total = o->total_steps;
    if (S->total <= 0)
        return moerl_errorf("no SFT steps: %lld rows, batch %d, %lld epochs", (long long)S->n_rows, S->bs,
                            (long long)o->total_epochs);
    if (o->quiet_error_out) *o->quiet_error_out = 0; /* the alike checks passed */
    par_adamw_init(R->ps, S->m, &S->os, o->optim);
    /* a pipeline's passes use its own per-stage activations (acts only carries par there); a Ulysses
     * rank holds its token share */
    if (model_acts_init_rows(&S->acts, S->m, par_acts_rows(R->ps, o->max_tokens), o->max_tokens) != MOERL_OK)
        return MOERL_ERR;
    S->acts.par = R->ps;
    if (R->root && S->acts.sp_rows) /* Megatron SP's arena (docs/parallelism.md "Megatron sequence parallelism") */
        log_info("%s: activation arena %zu bytes a rank (micro-batches of %d tokens; the residual stream and the "
                 "RMSNorms' statistics on %d rows: Megatron sequence parallelism)", o->label, S->acts.arena_bytes,
                 o->max_tokens, S->acts.sp_rows);
    else if (R->root)
        log_info("%s: activation arena %zu bytes a rank (micro-batches of %d tokens)", o->label, S->acts.arena_bytes,
                 o->max_tokens);
    if (R->multi && !par_grads_self_reduced(R->ps)) { /* data parallel: the bucketed reducer sums while backward runs */
        /* (FSDP, EP and the stage-owned pipeline sum in par_finish_grads instead) */
        S->red = R->ps && R->ps->grid && !R->ps->pp
                     ? dist_reducer_new_on(R->dc, R->ps->grid->stage_comm, S->m, 25.0, DIST_OVERLAP_THREAD)
                     : dist_reducer_new(R->dc, S->m, 25.0, DIST_OVERLAP_THREAD);
        if (!S->red) return MOERL_ERR;
    }
    if (o->stop_signal_out) *o->stop_signal_out = 0;
    if (o->nothing_left_out) *o->nothing_left_out = 0;
    return MOERL_OK;
}

/* The greedy accuracy of the whole model on ds (rank 0 evaluates; every rank gets it in *acc); skip:
 * NaN, nothing evaluated. */
static int sft_eval(sft_run *S, const dataset *ds, int skip, double *acc) {
    int erc;
    const moe_model *f = full_on_root(&S->R, S->m, &erc);
    if (S->R.root && erc == MOERL_OK && skip) *acc = NAN;
    else if (S->R.root && erc == MOERL_OK && (S->o->score || (S->o->multi_turn && S->o->multi_turn->enable))) {
        /* greedy, one response per row: eval_accuracy's; with tools, a trajectory per row */
        const val_options vo = {.kw = {.n = 1, .top_p = 1.0f, .top_k = -1}, .n_rows = S->o->val_n,
                                .max_new_tokens = S->o->max_response_length, .max_num_seqs = 64, .seed = S->o->seed,
                                .multi_turn = S->o->multi_turn, .block_size = S->o->eval_block_size,
                                .kv_cache_bytes = S->o->eval_kv_cache_bytes,
                                .gpu_memory_utilization = S->o->eval_gpu_memory_utilization,
                                .enable_prefix_caching = S->o->eval_prefix_caching};
        val_report rep;
        erc = val_run(f, ds, &vo, S->o->score, S->o->score_ctx, &rep);
        if (erc == MOERL_OK) {
            *acc = rep.accuracy;
            S->mlen = rep.mean_len;
            val_report_free(&rep);
        }
    } else if (S->R.root && erc == MOERL_OK)
        erc = eval_accuracy_paged(f, ds, S->o->val_n, S->o->max_response_length,
                                  &(engine_config){.max_num_seqs = 64, .block_size = S->o->eval_block_size,
                                                   .kv_cache_bytes = S->o->eval_kv_cache_bytes,
                                                   .gpu_memory_utilization = S->o->eval_gpu_memory_utilization,
                                                   .enable_prefix_caching = S->o->eval_prefix_caching},
                                  acc, &S->mlen);
    full_done(&S->R, S->m, f);
    if (ranks_agree(&S->R, erc) != MOERL_OK || ranks_from_root(&S->R, acc) != MOERL_OK) return MOERL_ERR;
    return MOERL_OK;
}

/* The resume (state_dir and resume set), the caller's writes (on_checked), the metrics file and the
 * accuracy before. */
static int sft_run_start(sft_run *S) {
    const sft_opts *o = S->o;
    sft_ranks *R = &S->R;
    S->acc_end = NAN; /* a finished run's recorded accuracy at its end */
    if (o->state_dir && o->resume) {
        S->resumed = sft_load_state(R, S->m, &S->os, S->train, o, &S->step0, &S->acc0, &S->finished, &S->acc_end);
        int quiet; /* a refused resume is alike on every rank (or its own): the lowest failing rank says it */
        const int agreed = ranks_agree_once(R, S->resumed < 0 ? MOERL_ERR : MOERL_OK, &quiet);
        if (o->quiet_error_out) *o->quiet_error_out = quiet;
        if (agreed != MOERL_OK) return MOERL_ERR;
        if (S->resumed && R->root) {
            log_info("%s: resumed from %s at step %lld (%lld asked)", o->label, o->state_dir, (long long)S->step0,
                     (long long)S->total);
            if (o->metrics_path && ckpt_truncate_metrics(o->metrics_path, S->step0) != MOERL_OK) return MOERL_ERR;
        }
    }
    if (o->on_checked && ranks_agree(R, R->root ? o->on_checked(o->on_checked_arg) : MOERL_OK) != MOERL_OK)
        return MOERL_ERR;
    if (R->root) {
        if (!S->resumed && o->metrics_path) unlink(o->metrics_path); /* a new run starts a new record */
        if (o->metrics_path && !(S->mw = metrics_open_loggers(o->metrics_path, o->metrics_loggers ? o->metrics_loggers
                                                                                                : METRICS_FILE,
                                                               S->resumed ? S->step0 : -1)))
            return MOERL_ERR;
    }
    if (!S->resumed) {
        if (sft_eval(S, S->test, o->no_held_out_eval, &S->acc0) != MOERL_OK) return MOERL_ERR;
        if (R->root && !o->no_held_out_eval) log_info("%s: held-out accuracy before: %.1f%%", o->label, 100 * S->acc0);
    }
    return MOERL_OK;
}

/* The periodic evaluation after step `step` (0-based) on the validation split (or the held-out one),
 * and the stop at sft.stop_at_accuracy (S->total becomes step + 1). */
static int sft_periodic_eval(sft_run *S, int64_t step) {
    const sft_opts *o = S->o;
    if (!(o->test_freq > 0 && (step + 1) % o->test_freq == 0 && step + 1 < S->total &&
          (o->validation || !o->no_held_out_eval)))
        return MOERL_OK;
    if (sft_eval(S, o->validation ? o->validation : S->test, 0, &S->acc) != MOERL_OK) return MOERL_ERR;
    if (S->R.root)
        log_info("%s step %lld: %s accuracy %.1f%%", o->label, (long long)step + 1,
                 o->validation ? "validation" : "held-out", 100 * S->acc);
    if (S->mw) {
        const char *k2[] = {o->validation ? "val/validation_accuracy" : "val/accuracy"};
        double v2[] = {S->acc};
        metrics_write(S->mw, step + 1, 1, k2, v2);
    }
    if (o->stop_accuracy > 0 && S->acc >= o->stop_accuracy) {
        if (S->R.root)
            log_info("%s: accuracy %.1f%% reached the stop level %.1f%% at step %lld", o->label, 100 * S->acc,
                     100 * o->stop_accuracy, (long long)step + 1);
        S->total = step + 1; /* ends both loops after this step */
    }
    return MOERL_OK;
}

/* One optimizer step (step, 0-based) on the bs rows of the epoch's order from b: this rank's share,
 * the metrics line, the periodic evaluation and the progress line. */
static int sft_one_step(sft_run *S, int64_t ep, int64_t b, int64_t step) {
    const sft_opts *o = S->o;
    sft_ranks *R = &S->R;
    if (o->state_dir && o->save_freq > 0 && step > S->step0 && step % o->save_freq == 0 &&
        sft_save_state(R, S->m, &S->os, S->train, o, step, S->acc0, 0) != MOERL_OK)
        return MOERL_ERR;
    double t0 = moerl_now();
    int64_t resp_tokens = 0, g_tokens = 0;
    int n_mine = 0;
    for (int j = 0; j < S->bs; j++) {
        int i = S->order[b + j];
        S->batch[j] = (train_seq){.tokens = S->seqs[i].ids, .len = (int)S->seqs[i].n, .resp_start = S->resp_start[i],
                                  .resp_mask = S->resp_mask[i]};
        /* the cross-entropy's token mean counts the loss tokens: a row's resp_mask leaves out the tool
         * turns of a multi-turn demonstration */
        resp_tokens += train_seq_loss_tokens(&S->batch[j]);
        g_tokens += S->seqs[i].n;
        if (j % R->n_shards == R->shard) S->mine[n_mine++] = S->batch[j]; /* round-robin over the data shards */
    }
    const int global_aux = S->aux_on && (R->n_shards > 1 || (R->ps && (R->ps->sp || R->ps->pp)) || /* SP / pp */
                                         count_microbatches(S->batch, S->bs, o->max_tokens) > 1);
    float lr = lr_schedule(o->lr_scheduler, step, S->total, o->optim.lr, o->warmup_ratio, o->min_lr_ratio);
    sft_step_out so = {0};
    if (sft_step(R, S->red, S->m, &S->acts, &S->os, S->mine, n_mine, g_tokens, resp_tokens, global_aux, lr, o, &so) !=
        MOERL_OK)
        return MOERL_ERR;
    double dt = moerl_now() - t0;
    S->tokens_seen += (int64_t)so.tokens;
    pp_window ppw = {0}; /* the step's schedules of every data-parallel pipeline (collective) */
    if (R->ps && R->ps->pp) {
        pp_window_add(&ppw, pp_last_stats(R->ps->pp));
        if (pp_window_over_replicas(&ppw, R->ps->grid->stage_comm) != MOERL_OK) return MOERL_ERR;
    }
    if (S->mw) {
        const char *keys[] = {"train/loss", "train/ce_loss", "moe/aux_loss", "actor/grad_norm", "train/lr",
                              "perf/throughput", "timing_s/step", "train/skipped_steps", "train/epoch"};
        double vals[] = {so.loss, so.ce, so.aux, so.grad_norm, lr, so.tokens / dt, dt, (double)S->os.skipped, (double)ep};
        metrics_write(S->mw, step + 1, 9, keys, vals);
        const char *pk[PP_N_METRICS];
        double pv[PP_N_METRICS];
        const int np = pp_window_metrics(&ppw, pk, pv); /* perf/pipeline_bubble, ... */
        if (np) metrics_write(S->mw, step + 1, np, pk, pv);
    }
    if (sft_periodic_eval(S, step) != MOERL_OK) return MOERL_ERR;
    char extra[160];
    snprintf(extra, sizeof extra, "loss %.4f ce %.4f aux %.3f gnorm %.3f lr %.2e %.0f tok/s%s", so.loss, so.ce, so.aux,
             so.grad_norm, lr, so.tokens / dt, so.applied ? "" : " (skipped: non-finite)");
    if (R->root) progress_update(&S->pb, step + 1, extra);
    return MOERL_OK;
}

/* The epochs from step0 (each epoch's shuffled order replayed from the seed) until S->total steps or a
 * stop signal (S->stopped; every rank stops at the same step). */
static int sft_loop(sft_run *S) {
    rng_state rng;
    rng_seed(&rng, S->o->seed);
    const int64_t n_rows = S->n_rows, bs = S->bs, per_epoch = n_rows / bs;
    S->step = S->step0;
    for (int64_t ep = 0; S->step < S->total && !S->stopped; ep++) {
        for (int64_t i = 0; i < n_rows; i++) S->order[i] = (int)i;
        rng_shuffle_int(&rng, S->order, (int)n_rows); /* replayed for the epochs before a resume point */
        if ((ep + 1) * per_epoch <= S->step0) continue;
        const int64_t b0 = ep * per_epoch < S->step0 ? (S->step0 - ep * per_epoch) * bs : 0;
        for (int64_t b = b0; b + bs <= n_rows && S->step < S->total; b += bs, S->step++) {
            double sig = moerl_stop_requested(); /* every rank stops at the same step */
            if (ranks_sum(&S->R, &sig, 1) != MOERL_OK) return MOERL_ERR;
            if (sig > 0) {
                S->stopped = moerl_stop_requested() ? moerl_stop_requested() : 15;
                break;
            }
            if (sft_one_step(S, ep, b, S->step) != MOERL_OK) return MOERL_ERR;
        }
    }
    return MOERL_OK;
}

/* Expert parallelism: the exchanges of the run, summed over the ranks, in one log line. */
static int sft_log_ep(sft_run *S) {
    const sft_ranks *R = &S->R;
    if (!R->ps || !R->ps->ep) return MOERL_OK;
    const ep_stats es = ep_get_stats(R->ps->ep);
    double v[5] = {(double)es.exchanges, (double)es.rows_sent, (double)es.spill_rounds, (double)es.idle_passes,
                   es.seconds};
    if (ranks_sum(R, v, 5) != MOERL_OK) return MOERL_ERR;
    if (R->root)
        log_info("%s: expert parallel (ep %d, %s, capacity %d rows): %.0f exchanges, %.0f rows sent, %.0f spill "
                 "rounds, %.0f idle passes, %.2f s in exchanges (summed over the ranks)", S->o->label,
                 R->ps->grid->ep, moe_dispatcher_name(ep_dispatcher(R->ps->ep)), ep_capacity(R->ps->ep), v[0], v[1],
                 v[2], v[3], v[4]);
    return MOERL_OK;
}

/* After the loop: the checkpoint, then (not stopped) the accuracy after and the run's summary. */
static int sft_run_finish(sft_run *S, double train_s, double *acc_before, double *acc_after) {
    const sft_opts *o = S->o;
    const sft_ranks *R = &S->R;
    const int64_t per_epoch = S->n_rows / S->bs, step = S->step, tokens_seen = S->tokens_seen;
    const int at_accuracy = !S->stopped && step < (o->total_steps > 0 ? o->total_steps : o->total_epochs * per_epoch);
    if (o->state_dir && sft_save_state(R, S->m, &S->os, S->train, o, step, S->acc0, at_accuracy) != MOERL_OK)
        return MOERL_ERR;
    if (S->stopped) {
        if (R->root)
            log_info("%s: stopped by signal %d at step %lld: checkpoint in %s", o->label, S->stopped, (long long)step,
                     o->state_dir ? o->state_dir : "(none: no state folder)");
        if (o->stop_signal_out) *o->stop_signal_out = S->stopped;
        if (acc_before) *acc_before = S->acc0;
        if (acc_after) *acc_after = NAN;
        return MOERL_OK;
    }
    if (sft_eval(S, S->test, o->no_held_out_eval, &S->acc) != MOERL_OK) return MOERL_ERR;
    if (R->root && o->no_held_out_eval)
        log_info("%s done: %lld step%s, %lld tokens in %.1f s (%.0f tokens/s); no held-out evaluation (%s)",
                 o->label, (long long)step, moerl_plural(step), (long long)tokens_seen, train_s, tokens_seen / train_s,
                 o->no_held_out_why ? o->no_held_out_why : "trainer.val_n=0");
    else if (R->root)
        log_info("%s done: %lld step%s, %lld tokens in %.1f s (%.0f tokens/s); held-out accuracy %.1f%% -> %.1f%%",
                 o->label, (long long)step, moerl_plural(step), (long long)tokens_seen, train_s, tokens_seen / train_s,
                 100 * S->acc0, 100 * S->acc);
    if (S->mw && !o->no_held_out_eval) {
        const char *k3[] = {"val/accuracy", "val/accuracy_before"};
        double v3[] = {S->acc, S->acc0};
        metrics_write(S->mw, step, 2, k3, v3);
    }
    if (R->root && o->state_dir && sft_record_after(o->state_dir, S->acc) != MOERL_OK) return MOERL_ERR;
    if (acc_before) *acc_before = S->acc0;
    if (acc_after) *acc_after = S->acc;
    return MOERL_OK;
}

static void sft_run_free(sft_run *S) {
    if (S->mw) metrics_close(S->mw);
    for (int64_t i = 0; S->seqs && i < S->n_rows; i++) tok_seq_free(&S->seqs[i]);
    free(S->seqs);
    free(S->resp_start);
    for (int64_t i = 0; S->resp_mask && i < S->n_rows; i++) free(S->resp_mask[i]);
    free(S->resp_mask);
    free(S->order);
    free(S->batch);
    free(S->mine);
    dist_reducer_free(S->red);
    if (S->acts.arena) model_acts_free(&S->acts);
    if (S->os.m) adamw_free(&S->os);
}

int sft_train(moe_model *m, const dataset *train, const dataset *test, const sft_opts *o, double *acc_before,
              double *acc_after) {
    sft_run S;
    memset(&S, 0, sizeof S);
    S.m = m;
    S.train = train;
    S.test = test;
    S.o = o;
    S.n_rows = dataset_count(train);
    S.bs = o->batch_size;
    if (sft_run_init(&S) != MOERL_OK) return MOERL_ERR; /* nothing allocated yet */
    int rc = MOERL_ERR;
    if (sft_encode_rows(&S) != MOERL_OK || sft_run_prepare(&S) != MOERL_OK || sft_run_start(&S) != MOERL_OK) goto out;
    if (S.step0 >= S.total || S.finished) {
        if (S.R.root)
            log_info("%s: nothing left to do: the run in %s is at step %lld and %lld step%s asked; raise %s to continue",
                     o->label, o->state_dir, (long long)S.step0, (long long)S.total, moerl_plural(S.total),
                     o->steps_key ? o->steps_key : "the step count");
        if (acc_before) *acc_before = S.acc0;
        if (acc_after) *acc_after = S.acc_end; /* NaN when not recorded (the state of a stopped or older run) */
        if (o->nothing_left_out) *o->nothing_left_out = 1;
        rc = MOERL_OK;
        goto out;
    }
    S.aux_on = m->cfg.router_aux_loss_coef > 0 && m->cfg.num_experts > 0 && n_moe_layers(&m->cfg) > 0;
    if (S.R.root) progress_begin(&S.pb, o->label, S.total);
    const double t_start = moerl_now();
    if (sft_loop(&S) != MOERL_OK) goto out;
    if (S.R.root) progress_end(&S.pb, NULL);
    if (sft_log_ep(&S) != MOERL_OK) goto out;
    rc = sft_run_finish(&S, moerl_now() - t_start, acc_before, acc_after);
out:
    sft_run_free(&S);
    return rc;
}
