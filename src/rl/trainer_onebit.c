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

int trainer_onebit_step(trainer *T, double *loss, double *grad_norm, int *applied, train_stats *st) {
    if (ensure_exchange(T) != MOERL_OK) return MOERL_ERR;
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
    *applied = onebit_adam_local(&T->opt, g, (float)*loss, norm);
    if (!*applied) return MOERL_OK;
    ensure_mask(T);
    onebit_adam_to_update(&T->opt, T->cfg->optim_freeze_step, T->opt.m); /* exchanged in the update's units */
    if (onebit_allreduce_comm(T->onebit, T->onebit_comm, T->opt.m) != MOERL_OK) return MOERL_ERR;
    onebit_adam_from_update(&T->opt, T->cfg->optim_freeze_step, T->opt.m);
    adamw_range *r = onebit_adam_model_ranges(T->m);
    onebit_adam_apply(&T->opt, T->cfg->optim_freeze_step, T->m->params, r, T->m->n_tensors, T->cfg->optim.lr);
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
