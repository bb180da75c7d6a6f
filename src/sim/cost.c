/* moerl simulate's cost model: named devices, calibration on this machine, the engine-step time.
 * See sim.h. */
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "base/rng.h"
#include "model/forward.h"
#include "model/perf.h"
#include "optim/adamw.h"
#include "plan/plan.h"
#include "rollout/engine.h"
#include "sim/sim.h"

/* Datasheet figures (dense bf16 FLOP/s, HBM bandwidth) with efficiencies typical of serving and
 * training stacks: decode reaches about 60% of HBM bandwidth (vLLM-class engines), prefill about
 * 50% of peak FLOP/s, MoE training 30% MFU (Megatron-Core MoE reports 30–45% on H100; 25% for the
 * Ascend stack, whose practice reports idle time it had to remove). Links: per-device share of the
 * inter-node network for a weight broadcast (400 Gb/s InfiniBand NDR on H200/A100 nodes, 200 Gb/s
 * RoCE on Atlas 800T A2). These are assumptions of the model, written here so that a user can
 * replace each with a measured value (the cost keys of `moerl simulate`). */
int sim_device_named(const char *name, sim_device *d) {
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    double bw, fl, mfu, bw_eff = 0.6, fl_eff = 0.5;
    if (!strcmp(name, "h200")) {
        bw = 4.8e12, fl = 989e12, mfu = 0.30, d->link_bw = 50e9, d->c_step = 0.004, d->mem_bytes = 141e9;
    } else if (!strcmp(name, "a100")) {
        bw = 2.0e12, fl = 312e12, mfu = 0.30, d->link_bw = 25e9, d->c_step = 0.005, d->mem_bytes = 80e9;
    } else if (!strcmp(name, "ascend910b")) {
        bw = 1.6e12, fl = 313e12, mfu = 0.25, d->link_bw = 25e9, d->c_step = 0.008, d->mem_bytes = 64e9;
    } else if (!strcmp(name, "cpu")) { /* a placeholder: calibrate instead (--calibrate) */
        bw = 20e9, fl = 100e9, mfu = 0.5, d->link_bw = 5e9, d->c_step = 1e-4, bw_eff = fl_eff = 1;
        d->dtype_bytes = 4;
    } else {
        return moerl_errorf("sim.device: unknown device '%s' (known: h200, a100, ascend910b, cpu; or --calibrate)",
                            name);
    }
    if (!d->dtype_bytes) d->dtype_bytes = 2;
    d->a_bytes = 1.0 / (bw * bw_eff);
    d->a_flops = 1.0 / (fl * fl_eff);
    d->s_flop = 1.0 / (fl * mfu);
    d->c_update = strcmp(name, "cpu") ? 0.1 : 0.0;
    d->c_sync = strcmp(name, "cpu") ? 2.0 : 0.0;
    return MOERL_OK;
}

/* ------------------------------------------------------------------ engine step */

typedef struct {
    double p_dense, p_expert1, p_active;
    int n_moe, E, K, L, nh, nkv, hd;
} model_shape;

static model_shape shape_of(const moe_config *c) {
    model_shape s;
    memset(&s, 0, sizeof s);
    int64_t tot, dense, expert, hf;
    plan_param_counts(c, &tot, &dense, &expert, &hf);
    s.L = c->num_hidden_layers;
    for (int l = 0; l < s.L; l++) s.n_moe += moe_config_layer_is_moe(c, l);
    s.E = c->num_experts;
    s.K = c->num_experts_per_tok;
    s.p_dense = (double)dense;
    s.p_expert1 = s.n_moe > 0 && s.E > 0 ? (double)expert / ((double)s.n_moe * s.E) : 0;
    s.p_active = (double)model_active_matmul_params(c);
    s.nh = c->num_attention_heads;
    s.nkv = c->num_key_value_heads;
    s.hd = c->head_dim;
    return s;
}

static void step_terms(const model_shape *s, int dtype, int tp, double tokens, double kv_reads, double *bytes,
                       double *flops) {
    double touched = 0;
    if (s->E > 0 && tokens > 0) touched = s->E * (1.0 - pow(1.0 - (double)s->K / s->E, tokens));
    const int kv_split = tp < s->nkv ? tp : s->nkv;
    *bytes = (s->p_dense + s->n_moe * touched * s->p_expert1) * dtype / tp +
             kv_reads * 2.0 * s->nkv * s->hd * s->L * dtype / (kv_split > 0 ? kv_split : 1);
    *flops = (2.0 * s->p_active * tokens + 4.0 * s->L * s->nh * s->hd * kv_reads) / tp;
}

double sim_engine_step_s(const sim_setup *su, double tokens, double kv_reads) {
    const model_shape s = shape_of(su->target);
    double b, f;
    step_terms(&s, su->dev.dtype_bytes, su->rollout_tp, tokens, kv_reads, &b, &f);
    return su->dev.a_bytes * b + su->dev.a_flops * f + su->dev.c_step;
}

/* ------------------------------------------------------------------ calibration */

/* Non-negative least squares of t ≈ Σ_j coef_j · x[i][j] (k ≤ 3 columns) with relative weights
 * (each row divided by t_i, so every sample counts by its relative error): every subset of the
 * columns is solved by normal equations and the best non-negative solution kept. */
static void nnls_rel(int n, int k, double x[][3], const double *t, double *coef) {
    double best = INFINITY;
    for (int j = 0; j < k; j++) coef[j] = 0;
    for (int mask = 1; mask < (1 << k); mask++) {
        int idx[3], m = 0;
        for (int j = 0; j < k; j++)
            if (mask >> j & 1) idx[m++] = j;
        double A[3][4] = {{0}};
        for (int i = 0; i < n; i++) {
            const double w = 1.0 / (t[i] * t[i]);
            for (int a = 0; a < m; a++) {
                for (int b = 0; b < m; b++) A[a][b] += w * x[i][idx[a]] * x[i][idx[b]];
                A[a][m] += w * x[i][idx[a]] * t[i];
            }
        }
        int ok = 1; /* Gauss–Jordan */
        for (int a = 0; a < m && ok; a++) {
            int p = a;
            for (int r = a + 1; r < m; r++)
                if (fabs(A[r][a]) > fabs(A[p][a])) p = r;
            if (fabs(A[p][a]) < 1e-300) { ok = 0; break; }
            for (int cc = 0; cc <= m; cc++) { double tmp = A[a][cc]; A[a][cc] = A[p][cc]; A[p][cc] = tmp; }
            for (int r = 0; r < m; r++) {
                if (r == a) continue;
                const double f = A[r][a] / A[a][a];
                for (int cc = a; cc <= m; cc++) A[r][cc] -= f * A[a][cc];
            }
        }
        if (!ok) continue;
        double sol[3] = {0, 0, 0};
        for (int a = 0; a < m; a++) {
            sol[idx[a]] = A[a][m] / A[a][a];
            if (sol[idx[a]] < 0) ok = 0;
        }
        if (!ok) continue;
        double res = 0;
        for (int i = 0; i < n; i++) {
            double p = 0;
            for (int j = 0; j < k; j++) p += sol[j] * x[i][j];
            res += (p - t[i]) * (p - t[i]) / (t[i] * t[i]);
        }
        if (res < best) {
            best = res;
            for (int j = 0; j < k; j++) coef[j] = sol[j];
        }
    }
}

#define CAL_MAX 256

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double sim_calibrate_bytes(const moe_config *cfg, int max_num_seqs, int train_tokens) {
    int64_t total, dense, expert, hf;
    plan_param_counts(cfg, &total, &dense, &expert, &hf);
    const double kv = 2.0 * cfg->num_hidden_layers * max_num_seqs * (32 + 24 + 1) * (double)cfg->num_key_value_heads *
                      cfg->head_dim * sizeof(float); /* the engine's K and V for its 32 + 24 + 1 positions */
    return 4.0 * total * 4 + 4.0 * expert + kv + plan_acts_bytes(cfg, train_tokens, 0, cfg->num_hidden_layers, 0);
}

/* sim_calibrate's engine part: decode steps of model m (config cfg, shape s) at batch sizes up to
 * max_num_seqs after a prefill of 32-token prompts, timed, and d->a_bytes, a_flops, c_step fitted
 * (non-negative least squares). Errors: the engine cannot be created. */
static int calibrate_engine(const moe_config *cfg, const moe_model *m, const model_shape *s, int max_num_seqs,
                            sim_device *d) {
    double X[CAL_MAX][3], T[CAL_MAX];
    int n = 0;
    /* engine: decode at batch sizes up to max_num_seqs, after a prefill of 32-token prompts */
    const int plen = 32, gen = 24;
    engine_config ec = {.max_num_seqs = max_num_seqs, .max_model_len = plen + gen + 1,
                        .max_num_batched_tokens = MOERL_MAX(max_num_seqs * plen, 256)};
    engine *e = engine_create(cfg, ec);
    if (!e) return MOERL_ERR;
    engine_load_weights(e, m->params, m->n_params, 0);
    int batches[5] = {1, 4, 16, 64, 128}, nb = 0;
    for (int i = 0; i < 5; i++)
        if (batches[i] <= max_num_seqs) batches[nb++] = batches[i];
    if (batches[nb - 1] != max_num_seqs && nb < 5) batches[nb++] = max_num_seqs;
    int *prompt = xmalloc(plen * sizeof(int));
    for (int i = 0; i < plen; i++) prompt[i] = (i * 7 + 3) % cfg->vocab_size;
    gen_request **done = xmalloc((size_t)(max_num_seqs * 2 + 8) * sizeof(gen_request *));
    for (int bi = 0; bi < nb && n < CAL_MAX - 40; bi++) {
        const int b = batches[bi];
        gen_request *rq = xcalloc((size_t)b, sizeof(gen_request));
        for (int j = 0; j < b; j++) {
            rq[j].id = j;
            rq[j].prompt = prompt;
            rq[j].prompt_len = plen;
            rq[j].sp = (sampling_params){.temperature = 1.0f, .top_p = 1.0f, .seed = (uint64_t)j + 1, .max_tokens = gen,
                                          .ignore_eos = 1};
            engine_add(e, &rq[j]);
        }
        int step = 0;
        while (engine_num_unfinished(e) > 0) {
            const engine_stats a = engine_get_stats(e);
            const double t0 = moerl_now();
            if (engine_step(e, done, max_num_seqs * 2 + 8) < 0) break;
            const double dt = moerl_now() - t0;
            const engine_stats z = engine_get_stats(e);
            const double toks = (double)(z.decode_tokens + z.prefill_tokens - a.decode_tokens - a.prefill_tokens);
            double by, fl;
            step_terms(s, 4, 1, toks, (double)(z.kv_reads - a.kv_reads), &by, &fl);
            if (step++ >= 2 && dt > 0 && n < CAL_MAX) { /* the first steps warm caches and thread pools */
                X[n][0] = by, X[n][1] = fl, X[n][2] = 1, T[n] = dt;
                n++;
            } else if (step == 1 && dt > 0 && n < CAL_MAX) { /* the prefill: compute-heavy, keep it */
                X[n][0] = by, X[n][1] = fl, X[n][2] = 1, T[n] = dt;
                n++;
            }
        }
        for (int j = 0; j < b; j++) gen_request_free_outputs(&rq[j]);
        free(rq);
    }
    free(done);
    free(prompt);
    engine_free(e);
    double coef[3];
    nnls_rel(n, 3, X, T, coef);
    d->a_bytes = coef[0];
    d->a_flops = coef[1];
    d->c_step = coef[2];
    return MOERL_OK;
}

/* sim_calibrate's training part: forward + logprobs + backward of model m on packed 128-token
 * sequences at several sizes up to train_tokens, and AdamW steps, timed: d->s_flop and d->c_update.
 * Errors: the activation arena cannot be made. */
static int calibrate_train(const moe_config *cfg, moe_model *m, int train_tokens, sim_device *d) {
    /* training: forward + logprobs + backward on packed 128-token sequences at several sizes, from a
     * sixteenth of train_tokens up (a toy config's updates are smaller than the largest size; an
     * intercept fitted from large sizes only swung 0.0007–0.55 s between runs); each size's time is
     * the median of CAL_TRAIN_REPS timed repetitions, so a load spike moves no point of the fit */
    double X[CAL_MAX][3], T[CAL_MAX], coef[3];
    int n = 0;
    enum { CAL_SIZES = 4, CAL_TRAIN_REPS = 5 };
    int sizes[CAL_SIZES] = {train_tokens / 16, train_tokens / 4, train_tokens / 2, train_tokens};
    model_acts acts;
    if (model_acts_init(&acts, m, train_tokens) != MOERL_OK) return MOERL_ERR;
    int *tok = xmalloc((size_t)train_tokens * sizeof(int)), *tgt = xmalloc((size_t)train_tokens * sizeof(int));
    int *cu = xmalloc((size_t)(train_tokens / 16 + 2) * sizeof(int));
    float *dl = xcalloc((size_t)train_tokens, sizeof(float));
    rng_state r;
    rng_seed(&r, 11);
    for (int i = 0; i < train_tokens; i++) {
        tok[i] = (int)(rng_uniform_double(&r) * (cfg->vocab_size - 1));
        tgt[i] = (int)(rng_uniform_double(&r) * (cfg->vocab_size - 1));
        dl[i] = -1.0f / train_tokens;
    }
    double tt[CAL_SIZES][CAL_TRAIN_REPS];
    for (int rep = 0; rep <= CAL_TRAIN_REPS; rep++)
        for (int si = 0; si < CAL_SIZES; si++) {
            const int N = MOERL_MAX(16, sizes[si]), seq = MOERL_MIN(128, N);
            int B = 0;
            cu[0] = 0;
            while (cu[B] < N) { cu[B + 1] = MOERL_MIN(N, cu[B] + seq); B++; }
            const double t0 = moerl_now();
            if (model_forward(m, &acts, tok, cu, NULL, B, N) != MOERL_OK) break;
            model_logprobs(m, &acts, tgt, 1.0f, 0);
            model_backward(m, &acts, dl, NULL, 0.0f);
            const double dt = moerl_now() - t0;
            if (rep == 0) continue; /* warm-up */
            tt[si][rep - 1] = dt;
            if (rep == CAL_TRAIN_REPS) { /* the median of the size's repetitions */
                qsort(tt[si], CAL_TRAIN_REPS, sizeof(double), cmp_double);
                X[n][0] = model_train_flops(cfg, N, model_attention_pairs(cu, B));
                X[n][1] = 1;
                T[n] = tt[si][CAL_TRAIN_REPS / 2];
                n++;
            }
        }
    nnls_rel(n, 2, X, T, coef);
    d->s_flop = coef[0];
    adamw_state opt;
    adamw_config oc = adamw_default_config();
    adamw_init(&opt, m, oc);
    double gn;
    adamw_step(&opt, m, 0.0f, 0.0f, &gn); /* warm */
    double ts[CAL_TRAIN_REPS];
    for (int i = 0; i < CAL_TRAIN_REPS; i++) { /* the median: one preempted step measured 0.24 s on a toy model */
        const double ta = moerl_now();
        adamw_step(&opt, m, 0.0f, 0.0f, &gn);
        ts[i] = moerl_now() - ta;
    }
    qsort(ts, CAL_TRAIN_REPS, sizeof(double), cmp_double);
    d->c_update = coef[1] + ts[CAL_TRAIN_REPS / 2];
    adamw_free(&opt);
    free(tok);
    free(tgt);
    free(cu);
    free(dl);
    model_acts_free(&acts);
    return MOERL_OK;
}

/* sim_calibrate's link: one timed copy of m's weights (what a same-host broadcast moves). */
static void calibrate_link(const moe_model *m, sim_device *d) {
    float *dst = xalloc_aligned(m->n_params * sizeof(float));
    memcpy(dst, m->params, m->n_params * sizeof(float));
    const double tc = moerl_now();
    memcpy(dst, m->params, m->n_params * sizeof(float));
    const double dc = moerl_now() - tc;
    d->link_bw = dc > 0 ? m->n_params * 4.0 / dc : 1e10;
    d->c_sync = 0;
    free(dst);
}

int sim_calibrate(const moe_config *cfg, int max_num_seqs, int train_tokens, sim_device *d) {
    const double need = sim_calibrate_bytes(cfg, max_num_seqs, train_tokens);
    const uint64_t avail = moerl_mem_available();
    if (avail > 0 && need > (double)avail)
        return moerl_errorf("simulate --calibrate runs the model on this machine and needs about %.1f GB of memory (fp32 "
                            "weights, gradients, the engine's copy and the broadcast copy, the engine's packed experts, "
                            "activations for %d training tokens), but %.1f GB are available (MemAvailable): calibrate "
                            "on a smaller model of the same shape family (--model with fewer layers or experts) and "
                            "pass its cost keys (sim.mem_bandwidth, sim.flops, sim.train_flops), or use a named "
                            "sim.device",
                            need / 1e9, train_tokens, (double)avail / 1e9);
    sim_device_named("cpu", d);
    snprintf(d->name, sizeof d->name, "calibrated");
    d->dtype_bytes = 4; /* moerl's engine: fp32 weights and KV */
    moe_model m;
    if (model_init(&m, cfg) != MOERL_OK) return MOERL_ERR;
    model_init_random(&m, 7);
    const model_shape s = shape_of(cfg);
    if (calibrate_engine(cfg, &m, &s, max_num_seqs, d) != MOERL_OK || calibrate_train(cfg, &m, train_tokens, d) != MOERL_OK) {
        model_free(&m);
        return MOERL_ERR;
    }
    calibrate_link(&m, d);
    model_free(&m);
    log_info("calibrated: engine step = %.3g s/byte · bytes + %.3g s/FLOP · FLOPs + %.3g s; training %.3g s/FLOP "
             "(%.2f GFLOP/s) + %.3g s per update; weight copy %.2f GB/s",
             d->a_bytes, d->a_flops, d->c_step, d->s_flop, d->s_flop > 0 ? 1e-9 / d->s_flop : 0, d->c_update,
             d->link_bw / 1e9);
    return MOERL_OK;
}
