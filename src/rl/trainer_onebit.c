/* actor.optim.name=onebit_adam in the RL trainer: see trainer_onebit.h. */
#include "rl/trainer_onebit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "dist/dist.h"
#include "dist/onebit.h"
#include "model/safetensors.h"
#include "optim/onebit_adam.h"

int trainer_onebit_frozen(const trainer *T) {
    return T->cfg->optim_name == OPTIM_ONEBIT_ADAM && onebit_adam_frozen(&T->opt, T->cfg->optim_freeze_step);
}

int64_t trainer_onebit_var_step(int64_t step, int64_t freeze_step, int64_t interval) {
    if (step <= freeze_step || interval <= 0) return freeze_step;
    return freeze_step + (step - freeze_step) / interval * interval;
}

int trainer_onebit_compress_next(const trainer *T) {
    if (!trainer_onebit_frozen(T)) return 0;
    const int64_t F = T->cfg->optim_freeze_step, K = T->cfg->optim_var_update_interval, next = T->opt.step + 1;
    return K <= 0 || (next - F) % K != 0;
}

static int n_workers(const trainer *T) { return T->dist ? T->dist->trainer_size : 1; }

static int cmp_size(const void *a, const void *b) {
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Segment bounds of the model's flat buffer, one segment per tensor (each its own 1-bit scale, as
 * DeepSpeed compresses each parameter tensor on its own); caller frees. Returns the segment count. */
static int tensor_bounds(const moe_model *m, size_t **out) {
    size_t *b = xmalloc((size_t)(m->n_tensors + 2) * sizeof(size_t));
    int nb = 0;
    b[nb++] = 0;
    for (int ti = 0; ti < m->n_tensors; ti++)
        if (m->tensors[ti].numel > 0 && m->tensors[ti].offset < m->n_params) b[nb++] = m->tensors[ti].offset;
    qsort(b, (size_t)nb, sizeof(size_t), cmp_size);
    int k = 0;
    for (int i = 0; i < nb; i++)
        if (i == 0 || b[i] != b[k - 1]) b[k++] = b[i];
    b[k++] = m->n_params; /* every offset is below it, so no repeat (n_params 0: one empty segment) */
    *out = b;
    return k - 1;
}

/* The mask of the compression phase (DeepSpeed's exp_avg_mask, made automatically): a value whose
 * frozen variance is exactly 0 had a zero gradient on every warm-up step; 1-bit signs cannot carry
 * its zero momentum (each step would move it by lr·s/eps), so it is left out of the exchange, its
 * momentum stays 0 and only weight decay moves it. Set once, at the first compression step (the
 * variance is frozen from then on, and a resume rebuilds the same mask from the saved variance). */
static void ensure_mask(trainer *T) {
    if (T->onebit->active) return;
    const size_t n = T->onebit->n;
    uint8_t *act = xmalloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) act[i] = T->opt.v[i] != 0.0f;
    onebit_exchange_set_active(T->onebit, act);
    free(act);
    log_info("1-bit Adam: %zu of %zu values had a zero gradient through the warm-up (frozen variance 0): masked, "
             "their momentum stays 0", T->onebit->n_masked, n);
}

/* The exchange and its group, made once (collective over the trainer ranks), seeded from a
 * checkpoint's rows when a resume brought them. */
static int ensure_exchange(trainer *T) {
    if (T->onebit) return MOERL_OK;
    const int W = n_workers(T), rank = T->dist ? T->dist->trainer_rank : 0;
    if (W > 1) {
        T->onebit_comm = dist_comm_split(T->dist, 0, rank);
        if (!T->onebit_comm) return MOERL_ERR;
    }
    T->onebit = xcalloc(1, sizeof *T->onebit);
    size_t *bounds;
    const int n_seg = tensor_bounds(T->m, &bounds);
    onebit_exchange_init_segments(T->onebit, T->m->n_params, W, rank, bounds, n_seg);
    free(bounds);
    if (T->onebit_rows) {
        const size_t n = T->onebit->n, c = T->onebit->chunk;
        const float *row = T->onebit_rows + (size_t)(T->onebit_n_rows == W ? rank : 0) * (n + c);
        memcpy(T->onebit->worker_err, row, n * sizeof(float));
        memcpy(T->onebit->server_err, row + n, c * sizeof(float));
        free(T->onebit_rows);
        T->onebit_rows = NULL;
        T->onebit_n_rows = 0;
    }
    return MOERL_OK;
}


/* Diagnostics of the compressed phase (MOERL_ONEBIT_DIAG=1; docs/parallelism.md "1-bit Adam"): a
 * shadow exact AdamW fed with the all-reduced gradient of the same steps (its own momentum and a
 * variance that keeps moving), and an fp32 all-reduce of the local momenta, both on copies (the run's
 * trajectory does not change; two extra fp32 all-reduces per step). Trainer rank 0 logs one line per
 * compressed step: the norms below and the ratio/cosine of the 1-bit update to the exact ones. */
static struct {
    int on;
    float *me, *ve, *gbar, *ubar; /* shadow momentum, variance; the averaged gradient, momentum/d */
    int64_t t;
    double gnorm_bar, e_stale;  /* the averaged gradient's norm; ‖m_e/d_frozen‖/‖m_e/d_live‖ */
} diag;

static int diag_allreduce(trainer *T, float *x, size_t n, int W) {
    if (T->onebit_comm && dist_comm_allreduce_f32(T->onebit_comm, x, n) != MOERL_OK) return MOERL_ERR;
    const float inv = 1.0f / (float)W;
    for (size_t i = 0; i < n; i++) x[i] *= inv;
    return MOERL_OK;
}

/* After an exact step (the shadow did not see it): the shadow restarts from the trainer's moments. */
static void diag_reseed(const trainer *T) {
    if (!diag.me) return;
    memcpy(diag.me, T->opt.m, T->m->n_params * sizeof(float));
    memcpy(diag.ve, T->opt.v, T->m->n_params * sizeof(float));
    diag.t = T->opt.step;
}

/* Before the local momentum update: average g (= W·g_r) over the ranks and step the shadow AdamW. */
static int diag_before(trainer *T, const float *g, int W) {
    if (!diag.on) {
        const char *e = getenv("MOERL_ONEBIT_DIAG");
        if (!e || strcmp(e, "1")) return MOERL_OK;
        diag.on = 1;
    }
    const size_t n = T->m->n_params;
    if (!diag.me) {
        diag.me = xmalloc(n * sizeof(float)), diag.ve = xmalloc(n * sizeof(float));
        diag.gbar = xmalloc(n * sizeof(float)), diag.ubar = xmalloc(n * sizeof(float));
        memcpy(diag.me, T->opt.m, n * sizeof(float));
        memcpy(diag.ve, T->opt.v, n * sizeof(float));
        diag.t = T->opt.step;
    }
    memcpy(diag.gbar, g, n * sizeof(float));
    if (diag_allreduce(T, diag.gbar, n, W) != MOERL_OK) return MOERL_ERR;
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)diag.gbar[i] * diag.gbar[i];
    diag.gnorm_bar = sqrt(ss);
    const adamw_config *c = &T->opt.cfg;
    const double coef = c->max_grad_norm > 0 ? c->max_grad_norm / (diag.gnorm_bar + 1e-6) : 1.0;
    const float clip = coef < 1.0 ? (float)coef : 1.0f;
    diag.t++;
    for (size_t i = 0; i < n; i++) {
        const float gi = diag.gbar[i] * clip;
        diag.me[i] = c->beta1 * diag.me[i] + (1.0f - c->beta1) * gi;
        diag.ve[i] = c->beta2 * diag.ve[i] + (1.0f - c->beta2) * gi * gi;
    }
    return MOERL_OK;
}

/* After to_update (T->opt.m = m_r/d): the exact average of the local m_r/d. */
static int diag_mid(trainer *T, int W) {
    if (!diag.on) return MOERL_OK;
    memcpy(diag.ubar, T->opt.m, T->m->n_params * sizeof(float));
    return diag_allreduce(T, diag.ubar, T->m->n_params, W);
}

/* The value with the largest worker error: its tensor, its frozen and live variance (rank 0's view). */
static void diag_worst(const trainer *T) {
    const float *e = T->onebit->worker_err;
    size_t w = 0;
    for (size_t i = 1; i < T->m->n_params; i++)
        if (fabsf(e[i]) > fabsf(e[w])) w = i;
    for (int ti = 0; ti < T->m->n_tensors; ti++) {
        const tensor_info *t = &T->m->tensors[ti];
        if (w < t->offset || w >= t->offset + (size_t)t->numel) continue;
        double te = 0;
        for (int64_t j = 0; j < t->numel; j++) te += (double)e[t->offset + j] * e[t->offset + j];
        log_info("1-bit Adam diag: largest |e_w| %.4g at %s[%zu] (cols %lld): v frozen %.3g live %.3g, m %.3g; "
                 "|e_w| of the tensor %.4g", (double)e[w], t->name, w - t->offset,
                 (long long)t->shape[t->ndim - 1], (double)T->opt.v[w], (double)diag.ve[w], (double)diag.me[w], sqrt(te));
        return;
    }
}

/* After the exchange (T->opt.m = the 1-bit average of m_r/d): the comparisons, logged by rank 0. */
static int diag_after(trainer *T, int64_t v_step) {
    if (!diag.on) return MOERL_OK;
    const size_t n = T->m->n_params;
    const adamw_config *c = &T->opt.cfg;
    const float *u = T->opt.m, *v = T->opt.v;
    const double bc2f = 1.0 / sqrt(1.0 - pow(c->beta2, (double)v_step)),
                 bc2l = 1.0 / sqrt(1.0 - pow(c->beta2, (double)diag.t));
    /* sums: 0 ‖u‖² 1 ‖ū‖² 2 u·ū 3 ‖e‖² 4 u·e 5 ‖m_e/d_f‖² 6 ‖e_w‖² 7 ‖e_s‖² 8 Σ|u| 9 active */
    double s[10] = {0};
    for (size_t i = 0; i < n; i++) {
        const double dl = sqrt((double)diag.ve[i]) * bc2l + c->eps, df = sqrt((double)v[i]) * bc2f + c->eps;
        const double e = diag.me[i] / dl, ef = diag.me[i] / df;
        s[0] += (double)u[i] * u[i], s[1] += (double)diag.ubar[i] * diag.ubar[i], s[2] += (double)u[i] * diag.ubar[i];
        s[3] += e * e, s[4] += u[i] * e, s[5] += ef * ef, s[6] += (double)T->onebit->worker_err[i] * T->onebit->worker_err[i];
        if (u[i] != 0.0f) s[8] += fabs((double)u[i]), s[9] += 1;
    }
    for (size_t i = 0; i < T->onebit->chunk; i++) s[7] += (double)T->onebit->server_err[i] * T->onebit->server_err[i];
    double r[2] = {s[6], s[7]};
    if (T->dist && dist_allreduce_sum(T->dist, DIST_TRAINERS, r, 2) != MOERL_OK) return MOERL_ERR;
    if (T->dist && T->dist->trainer_rank != 0) return MOERL_OK;
    diag_worst(T);
    log_info("1-bit Adam diag step %lld: |g_bar| %.4g  |u_1bit| %.4g |u_exactavg| %.4g ratio %.3f cos %.3f | "
             "|u_adam| %.4g ratio %.3f cos %.3f | stale %.3f | |e_w| %.4g |e_s| %.4g | mean|u| %.4g",
             (long long)T->opt.step, diag.gnorm_bar, sqrt(s[0]), sqrt(s[1]), sqrt(s[0] / s[1]),
             s[2] / sqrt(s[0] * s[1]), sqrt(s[3]), sqrt(s[0] / s[3]), s[4] / sqrt(s[0] * s[3]), sqrt(s[5] / s[3]),
             sqrt(r[0]), sqrt(r[1]), s[9] > 0 ? s[8] / s[9] : 0.0);
    return MOERL_OK;
}

/* The first compressed step after an exact one (the freeze, or a variance update of
 * actor.optim.var_update_interval): the error buffers restart at 0 (they were measured against the
 * denominator of the variance before) and the mask is rebuilt from the variance now frozen. Decided
 * from the step counter alone, so a resumed run does what the uninterrupted one does. */
static void restart_after_exact(trainer *T, int64_t v_step) {
    if (T->opt.step != v_step) return;
    onebit_exchange *x = T->onebit;
    memset(x->worker_err, 0, (x->n ? x->n : 1) * sizeof(float));
    memset(x->server_err, 0, x->chunk * sizeof(float));
    onebit_exchange_set_active(x, NULL);
    diag_reseed(T);
}

int trainer_onebit_step(trainer *T, double *loss, double *grad_norm, int *applied, train_stats *st) {
    if (ensure_exchange(T) != MOERL_OK) return MOERL_ERR;
    const int64_t vs = trainer_onebit_var_step(T->opt.step, T->cfg->optim_freeze_step, T->cfg->optim_var_update_interval);
    restart_after_exact(T, vs);
    const int W = n_workers(T);
    float *g = T->m->grads;
    const size_t n = T->m->n_params;
    const float w = (float)W;
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        g[i] *= w; /* this rank's estimate of the full gradient (exact: W is a small integer) */
        ss += (double)g[i] * (double)g[i];
    }
    double sums[2] = {ss, *loss};
    if (T->dist && dist_allreduce_sum(T->dist, DIST_TRAINERS, sums, 2) != MOERL_OK) return MOERL_ERR;
    *loss = sums[1];
    *grad_norm = sqrt(sums[0] / W);
    /* the skip decision from the summed values (the same on every rank), the clip from the local norm */
    const double norm = isfinite(sums[0]) ? sqrt(ss) : NAN;
    if (isfinite(sums[0]) && diag_before(T, g, W) != MOERL_OK) return MOERL_ERR;
    *applied = onebit_adam_local(&T->opt, g, (float)*loss, norm);
    if (!*applied) return MOERL_OK;
    ensure_mask(T);
    onebit_adam_to_update(&T->opt, vs, T->opt.m); /* exchanged in the update's units */
    if (diag_mid(T, W) != MOERL_OK) return MOERL_ERR;
    if (onebit_allreduce_comm(T->onebit, T->onebit_comm, T->opt.m) != MOERL_OK) return MOERL_ERR;
    if (diag_after(T, vs) != MOERL_OK) return MOERL_ERR;
    onebit_adam_from_update(&T->opt, vs, T->opt.m);
    adamw_range *r = onebit_adam_model_ranges(T->m);
    onebit_adam_apply(&T->opt, vs, T->m->params, r, T->m->n_tensors, T->cfg->optim.lr);
    free(r);
    st->grad_bytes_sent += T->onebit->sent_bytes;
    st->grad_bytes_raw += W > 1 ? 2.0 * (W - 1) / W * 4.0 * (double)n : 0.0; /* a ring all-reduce of fp32 */
    return MOERL_OK;
}

int trainer_onebit_gather(trainer *T, float **rows, int *n_rows) {
    if (ensure_exchange(T) != MOERL_OK) return MOERL_ERR;
    const onebit_exchange *x = T->onebit;
    const size_t row = x->n + x->chunk;
    float *mine = xmalloc(row * sizeof(float));
    memcpy(mine, x->worker_err, x->n * sizeof(float));
    memcpy(mine + x->n, x->server_err, x->chunk * sizeof(float));
    *n_rows = x->world;
    *rows = xmalloc((size_t)x->world * row * sizeof(float));
    int rc = MOERL_OK;
    if (T->onebit_comm) rc = dist_comm_allgather_f32(T->onebit_comm, mine, row, *rows);
    else memcpy(*rows, mine, row * sizeof(float));
    free(mine);
    if (rc != MOERL_OK) {
        free(*rows);
        *rows = NULL;
    }
    return rc;
}

int trainer_onebit_save(const float *rows, int n_rows, size_t n, const char *path) {
    const size_t c = onebit_chunk(n, n_rows);
    float *we = xmalloc((size_t)n_rows * n * sizeof(float) + 4), *se = xmalloc((size_t)n_rows * c * sizeof(float));
    for (int r = 0; r < n_rows; r++) {
        memcpy(we + (size_t)r * n, rows + (size_t)r * (n + c), n * sizeof(float));
        memcpy(se + (size_t)r * c, rows + (size_t)r * (n + c) + n, c * sizeof(float));
    }
    st_writer *w = st_writer_new();
    const int64_t s1[2] = {n_rows, (int64_t)n}, s2[2] = {n_rows, (int64_t)c};
    st_writer_add(w, "onebit.worker_err", we, 2, s1, ST_F32);
    st_writer_add(w, "onebit.server_err", se, 2, s2, ST_F32);
    const int rc = st_writer_finish(w, path);
    st_writer_free(w);
    free(we);
    free(se);
    return rc;
}

/* The checks of trainer_onebit_check on an open file f (closed on error). */
static int onebit_file_check(st_file *f, const char *path, size_t n, int n_ranks) {
    const st_tensor *we = st_find(f, "onebit.worker_err"), *se = st_find(f, "onebit.server_err");
    if (!we || !se || we->ndim != 2 || se->ndim != 2 || we->dtype != ST_F32 || se->dtype != ST_F32 ||
        we->shape[1] != (int64_t)n || se->shape[0] != we->shape[0] ||
        se->shape[1] != (int64_t)onebit_chunk(n, (int)we->shape[0])) {
        st_close(f);
        return moerl_errorf("%s: expected fp32 tensors onebit.worker_err [ranks, %zu] and onebit.server_err [ranks, "
                            "chunk] (1-bit Adam's error feedback, written by actor.optim.name=onebit_adam)", path, n);
    }
    const int rows = (int)we->shape[0];
    if (rows != n_ranks) {
        st_close(f);
        return moerl_errorf("%s holds 1-bit Adam error feedback of %d trainer rank(s), and trainer.n_ranks is %d: each "
                            "rank's error buffers are its own, so resume on %d trainer rank(s) (or start anew)",
                            path, rows, n_ranks, rows);
    }
    return MOERL_OK;
}

int trainer_onebit_check(const char *path, size_t n, int n_ranks) {
    st_file f;
    if (st_open(&f, path) != MOERL_OK) return MOERL_ERR;
    if (onebit_file_check(&f, path, n, n_ranks) != MOERL_OK) return MOERL_ERR;
    st_close(&f);
    return MOERL_OK;
}

int trainer_onebit_load(trainer *T, const char *path, int n_ranks) {
    st_file f;
    if (st_open(&f, path) != MOERL_OK) return MOERL_ERR;
    const size_t n = T->m->n_params;
    if (onebit_file_check(&f, path, n, n_ranks) != MOERL_OK) return MOERL_ERR;
    const st_tensor *we = st_find(&f, "onebit.worker_err"), *se = st_find(&f, "onebit.server_err");
    const int rows = (int)we->shape[0];
    const size_t c = (size_t)se->shape[1];
    free(T->onebit_rows);
    T->onebit_rows = xmalloc((size_t)rows * (n + c) * sizeof(float));
    for (int r = 0; r < rows; r++) {
        memcpy(T->onebit_rows + (size_t)r * (n + c), (const float *)we->data + (size_t)r * n, n * sizeof(float));
        memcpy(T->onebit_rows + (size_t)r * (n + c) + n, (const float *)se->data + (size_t)r * c, c * sizeof(float));
    }
    T->onebit_n_rows = rows;
    st_close(&f);
    return MOERL_OK;
}

void trainer_onebit_free(trainer *T) {
    if (T->onebit) {
        onebit_exchange_free(T->onebit);
        free(T->onebit);
        T->onebit = NULL;
    }
    if (T->onebit_comm) dist_comm_free(T->onebit_comm);
    T->onebit_comm = NULL;
    free(T->onebit_rows);
    T->onebit_rows = NULL;
    T->onebit_n_rows = 0;
}
