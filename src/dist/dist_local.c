/* Single-process implementation of dist.h (no MPI): world size 1, the embedded role, collectives are
 * identities, the weight broadcast has no receiver, point-to-point messages to rank 0 (itself) go
 * through an in-process mailbox (so two threads of the embedded job can use the same protocol), and
 * the gradient reducer only applies its scale. Compiled out in the MPI build (-DMOERL_MPI), where
 * mpi_dist.c provides the same functions. */
#ifndef MOERL_MPI
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"

#define LOCAL_TAG_MAX 32767

typedef struct local_msg {
    int tag;
    size_t len;
    void *data;
    struct local_msg *next;
} local_msg;

struct dist_impl {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    local_msg *head, *tail; /* FIFO of messages sent to rank 0 */
};

const char *dist_backend_name(void) { return "local"; }

dist_ctx *dist_init(int *argc, char ***argv) {
    dist_ctx *c = xcalloc(1, sizeof *c);
    c->world_rank = 0;
    c->world_size = 1;
    c->role = DIST_ROLE_UNSET;
    c->trainer_rank = c->sync_rank = -1;
    c->impl = xcalloc(1, sizeof *c->impl);
    pthread_mutex_init(&c->impl->mu, NULL);
    pthread_cond_init(&c->impl->cv, NULL);
    return c;
}

void dist_finalize(dist_ctx *ctx) {
    if (!ctx) return;
    for (local_msg *m = ctx->impl->head; m;) {
        local_msg *n = m->next;
        free(m->data);
        free(m);
        m = n;
    }
    pthread_mutex_destroy(&ctx->impl->mu);
    pthread_cond_destroy(&ctx->impl->cv);
    free(ctx->impl);
    free(ctx);
}

int dist_split_roles(dist_ctx *ctx, int n_trainers) {
    if (n_trainers != 1)
        return moerl_errorf("dist_split_roles: world size 1 (embedded) needs n_trainers = 1, got %d", n_trainers);
    ctx->role = DIST_ROLE_EMBEDDED;
    ctx->n_trainers = ctx->n_rollout = 1;
    ctx->first_trainer = 0;
    ctx->trainer_rank = 0;
    ctx->trainer_size = 1;
    ctx->sync_rank = 0;
    ctx->sync_size = 1;
    return MOERL_OK;
}

static int check_group(const dist_ctx *ctx, dist_group g, const char *fn) {
    if (g == DIST_WORLD) return MOERL_OK;
    if (g != DIST_TRAINERS && g != DIST_SYNC) return moerl_errorf("%s: unknown group %d", fn, (int)g);
    if (ctx->role == DIST_ROLE_UNSET) return moerl_errorf("%s: call dist_split_roles first", fn);
    return MOERL_OK;
}

int dist_barrier(dist_ctx *ctx, dist_group g) { return check_group(ctx, g, "dist_barrier"); }

int dist_allreduce_sum(dist_ctx *ctx, dist_group g, double *buf, int n) {
    if (check_group(ctx, g, "dist_allreduce_sum") != MOERL_OK) return MOERL_ERR;
    if (n < 0 || (n > 0 && !buf)) return moerl_errorf("dist_allreduce_sum: bad buffer (n = %d)", n);
    return MOERL_OK; /* the sum over one rank is the value itself */
}

void dist_abort(dist_ctx *ctx, const char *msg) {
    fprintf(stderr, "moerl[rank 0]: abort: %s\n", msg ? msg : "");
    fflush(stderr);
    exit(1);
}

int dist_bcast_weights(dist_ctx *ctx, float *params, size_t n, int *version, size_t bucket_bytes,
                       dist_xfer_stats *st) {
    if (st) memset(st, 0, sizeof *st);
    if (ctx->role == DIST_ROLE_UNSET) return moerl_errorf("dist_bcast_weights: call dist_split_roles first");
    if ((n > 0 && !params) || !version)
        return moerl_errorf("dist_bcast_weights: params (n = %zu) and version must not be NULL", n);
    if (bucket_bytes < sizeof(float))
        return moerl_errorf("dist_bcast_weights: bucket_bytes must be >= 4 (one float), got %zu", bucket_bytes);
    return MOERL_OK; /* sync group of one: nobody to send to */
}

int dist_bcast_weights_bf16(dist_ctx *ctx, const float *src, uint16_t *dst, size_t n, int *version,
                            size_t bucket_bytes, dist_xfer_stats *st) {
    if (st) memset(st, 0, sizeof *st);
    if (ctx->role == DIST_ROLE_UNSET) return moerl_errorf("dist_bcast_weights_bf16: call dist_split_roles first");
    if ((n > 0 && !src) || !version)
        return moerl_errorf("dist_bcast_weights_bf16: src (n = %zu) and version must not be NULL", n);
    if (bucket_bytes < sizeof(uint16_t))
        return moerl_errorf("dist_bcast_weights_bf16: bucket_bytes must be >= 2 (one bf16), got %zu", bucket_bytes);
    const double t0 = moerl_now();
    /* sync group of one: nothing travels; the root's own dst gets the rounded values */
    if (dst && n) dist_f32_to_bf16(dst, src, n);
    if (st) st->seconds = moerl_now() - t0;
    return MOERL_OK;
}

int dist_recv_weights_stream(dist_ctx *ctx, dist_wdtype dtype, size_t n, int *version, dist_weight_sink sink,
                             void *arg, dist_xfer_stats *st) {
    (void)dtype, (void)n, (void)version, (void)sink, (void)arg;
    if (st) memset(st, 0, sizeof *st);
    return moerl_errorf("dist_recv_weights_stream: the only rank of a local run is the root (trainer rank 0), "
                        "which sends; only a rollout rank receives");
}

static int check_tag(int tag, const char *fn) {
    if (tag < 0 || tag > LOCAL_TAG_MAX) return moerl_errorf("%s: tag %d outside [0, %d]", fn, tag, LOCAL_TAG_MAX);
    return MOERL_OK;
}

int dist_send_msg(dist_ctx *ctx, int dst, int tag, const void *buf, size_t len) {
    if (dst != 0) return moerl_errorf("dist_send_msg: destination rank %d outside [0, 1)", dst);
    if (check_tag(tag, "dist_send_msg") != MOERL_OK) return MOERL_ERR;
    if (len > (size_t)2147483647) return moerl_errorf("dist_send_msg: %zu bytes exceed INT_MAX", len);
    if (len > 0 && !buf) return moerl_errorf("dist_send_msg: NULL buffer for %zu bytes", len);
    local_msg *m = xcalloc(1, sizeof *m);
    m->tag = tag;
    m->len = len;
    m->data = xmalloc(len ? len : 1);
    if (len) memcpy(m->data, buf, len);
    struct dist_impl *I = ctx->impl;
    pthread_mutex_lock(&I->mu);
    if (I->tail) I->tail->next = m;
    else I->head = m;
    I->tail = m;
    pthread_cond_broadcast(&I->cv);
    pthread_mutex_unlock(&I->mu);
    return MOERL_OK;
}

/* First queued message with tag (and its predecessor), under the mutex. */
static local_msg *find_msg(struct dist_impl *I, int tag, local_msg **prev) {
    *prev = NULL;
    for (local_msg *m = I->head; m; *prev = m, m = m->next)
        if (m->tag == tag) return m;
    return NULL;
}

int dist_recv_msg_any(dist_ctx *ctx, int tag, int *src, void **buf, size_t *len) {
    if (check_tag(tag, "dist_recv_msg_any") != MOERL_OK) return MOERL_ERR;
    struct dist_impl *I = ctx->impl;
    pthread_mutex_lock(&I->mu);
    local_msg *m, *prev;
    while (!(m = find_msg(I, tag, &prev))) pthread_cond_wait(&I->cv, &I->mu);
    if (prev) prev->next = m->next;
    else I->head = m->next;
    if (I->tail == m) I->tail = prev;
    pthread_mutex_unlock(&I->mu);
    if (src) *src = 0;
    *buf = m->data;
    *len = m->len;
    free(m);
    return MOERL_OK;
}

int dist_iprobe(dist_ctx *ctx, int tag) {
    if (check_tag(tag, "dist_iprobe") != MOERL_OK) return -1;
    struct dist_impl *I = ctx->impl;
    pthread_mutex_lock(&I->mu);
    local_msg *prev;
    const int found = find_msg(I, tag, &prev) != NULL;
    pthread_mutex_unlock(&I->mu);
    return found;
}

/* ---- reducer: a sum over one rank is the gradient itself; only the scale applies ---- */

struct dist_grad_reducer {
    const moe_model *m;
    float *grads;
    int n_buckets;
    dist_bucket *b;
    float scale;
};

dist_grad_reducer *dist_reducer_new_on(dist_ctx *ctx, const struct dist_comm *group, const moe_model *m,
                                       double bucket_mb, dist_overlap overlap) {
    if (!group) {
        moerl_errorf("dist_reducer_new_on: no group given");
        return NULL;
    }
    return dist_reducer_new(ctx, m, bucket_mb, overlap);
}

dist_grad_reducer *dist_reducer_new(dist_ctx *ctx, const moe_model *m, double bucket_mb, dist_overlap overlap) {
    if (ctx->role == DIST_ROLE_UNSET) {
        moerl_errorf("dist_reducer_new: call dist_split_roles first");
        return NULL;
    }
    if (!m->grads) {
        moerl_errorf("dist_reducer_new: the model has no gradient buffer (model_init_inference?)");
        return NULL;
    }
    if (!(bucket_mb > 0) || !isfinite(bucket_mb)) {
        moerl_errorf("dist_reducer_new: bucket_mb must be a positive number of MiB, got %g", bucket_mb);
        return NULL;
    }
    if (overlap != DIST_OVERLAP_OFF && overlap != DIST_OVERLAP_THREAD && overlap != DIST_OVERLAP_POLL) {
        moerl_errorf("dist_reducer_new: unknown overlap mode %d", (int)overlap);
        return NULL;
    }
    const size_t cap = (size_t)MOERL_MAX(1.0, bucket_mb * 1048576.0);
    dist_grad_reducer *r = xcalloc(1, sizeof *r);
    r->m = m;
    r->grads = m->grads;
    r->scale = 1.0f;
    r->b = dist_plan_buckets(m, MOERL_MIN(DIST_FIRST_BUCKET_BYTES, cap), cap, &r->n_buckets);
    if (!r->b) {
        free(r);
        return NULL;
    }
    return r;
}

void dist_reducer_set_scale(dist_grad_reducer *r, float s) { r->scale = s; }

int dist_reducer_layer_done(dist_grad_reducer *r, int group) {
    const int L = r->m->cfg.num_hidden_layers;
    if (group < -1 || group > L)
        return moerl_errorf("dist_reducer_layer_done: group %d outside [-1, %d]", group, L);
    return MOERL_OK;
}

double dist_reducer_finish(dist_grad_reducer *r) {
    if (r->scale != 1.0f) {
        float *g = r->grads;
        const float s = r->scale;
        for (size_t i = 0; i < r->m->n_params; i++) g[i] *= s;
    }
    return 0.0;
}

void dist_reducer_free(dist_grad_reducer *r) {
    if (!r) return;
    free(r->b);
    free(r);
}

void dist_reducer_set_compression(dist_grad_reducer *r, int mode, int warmup_steps, int chunk) {
    (void)r; (void)mode; (void)warmup_steps; (void)chunk; /* one process: nothing is sent */
}
void dist_reducer_last_bytes(const dist_grad_reducer *r, double *sent, double *raw) {
    (void)r;
    *sent = *raw = 0;
}
int dist_reducer_n_buckets(const dist_grad_reducer *r) { return r->n_buckets; }
const dist_bucket *dist_reducer_buckets(const dist_grad_reducer *r) { return r->b; }
/* ------------------------------------------------------------------ trainer sub-groups (size 1) */

struct dist_comm {
    double bytes[DIST_OP_COUNT]; /* always 0: a group of one moves nothing */
};

struct dist_req {
    int unused;
};

dist_comm *dist_comm_split(dist_ctx *ctx, int color, int key) {
    if (ctx->role != DIST_ROLE_EMBEDDED && ctx->role != DIST_ROLE_TRAINER) {
        moerl_errorf("dist_comm_split: roles are not split on this rank");
        return NULL;
    }
    if (color < 0) {
        moerl_errorf("dist_comm_split: color %d, expected ≥ 0", color);
        return NULL;
    }
    return xcalloc(1, sizeof(dist_comm));
}

dist_comm *dist_comm_split_rollout(dist_ctx *ctx, int color, int key) {
    moerl_errorf("dist_comm_split_rollout: one process has no rollout ranks (run under mpirun)");
    return NULL;
}

void dist_comm_free(dist_comm *c) { free(c); }
int dist_comm_rank(const dist_comm *c) { return 0; }
int dist_comm_size(const dist_comm *c) { return 1; }
double dist_comm_bytes(const dist_comm *c, dist_op op) { return 0.0; }
void dist_comm_reset_bytes(dist_comm *c) {}
int dist_comm_barrier(dist_comm *c) { return MOERL_OK; }
void dist_comm_progress(dist_comm *c) { (void)c; }

static int local_copy(const char *fn, const void *send, void *recv, size_t bytes) {
    if (bytes > 0 && (!send || !recv)) return moerl_errorf("%s: NULL buffer with %zu bytes", fn, bytes);
    if (bytes > 0 && send != recv) memmove(recv, send, bytes);
    return MOERL_OK;
}

int dist_comm_allreduce_f32(dist_comm *c, float *buf, size_t n) {
    return local_copy("dist_comm_allreduce_f32", buf, buf, n * sizeof(float));
}
int dist_comm_allreduce_f64(dist_comm *c, double *buf, size_t n) {
    return local_copy("dist_comm_allreduce_f64", buf, buf, n * sizeof(double));
}
int dist_comm_allgather_f32(dist_comm *c, const float *send, size_t n, float *recv) {
    return local_copy("dist_comm_allgather_f32", send, recv, n * sizeof(float));
}
int dist_comm_reduce_scatter_f32(dist_comm *c, const float *send, float *recv, size_t n) {
    return local_copy("dist_comm_reduce_scatter_f32", send, recv, n * sizeof(float));
}
int dist_comm_alltoall_f32(dist_comm *c, const float *send, size_t n, float *recv) {
    return local_copy("dist_comm_alltoall_f32", send, recv, n * sizeof(float));
}
int dist_comm_alltoall_i32(dist_comm *c, const int *send, size_t n, int *recv) {
    return local_copy("dist_comm_alltoall_i32", send, recv, n * sizeof(int));
}
int dist_comm_alltoallv_f32(dist_comm *c, const float *send, const size_t *scounts, const size_t *sdispls,
                            float *recv, const size_t *rcounts, const size_t *rdispls) {
    if (scounts[0] != rcounts[0])
        return moerl_errorf("dist_comm_alltoallv_f32: sends %zu floats to itself but expects %zu", scounts[0],
                            rcounts[0]);
    return local_copy("dist_comm_alltoallv_f32", send ? send + sdispls[0] : NULL, recv ? recv + rdispls[0] : NULL,
                      scounts[0] * sizeof(float));
}
dist_req *dist_comm_iallgather_f32(dist_comm *c, const float *send, size_t n, float *recv) {
    if (dist_comm_allgather_f32(c, send, n, recv) != MOERL_OK) return NULL;
    return xcalloc(1, sizeof(dist_req));
}
dist_req *dist_comm_ireduce_scatter_f32(dist_comm *c, const float *send, float *recv, size_t n) {
    if (dist_comm_reduce_scatter_f32(c, send, recv, n) != MOERL_OK) return NULL;
    return xcalloc(1, sizeof(dist_req));
}
dist_req *dist_comm_isend_f32(dist_comm *c, int peer, int tag, const float *buf, size_t n) {
    moerl_errorf("dist_comm_isend_f32: peer %d, but a group of one process has no other rank", peer);
    return NULL;
}
dist_req *dist_comm_irecv_f32(dist_comm *c, int peer, int tag, float *buf, size_t n) {
    moerl_errorf("dist_comm_irecv_f32: peer %d, but a group of one process has no other rank", peer);
    return NULL;
}
int dist_wait(dist_req *r) {
    free(r);
    return MOERL_OK;
}
int dist_test(dist_req *r) {
    free(r);
    return 1;
}
#endif /* MOERL_MPI */
