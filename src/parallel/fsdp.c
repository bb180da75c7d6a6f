/* FSDP / ZeRO-3 parameter, gradient and optimizer sharding (see fsdp.h for the design). */
#include "parallel/fsdp.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/common.h"
#include "base/trace.h"

enum { U_ABSENT = 0, U_FLIGHT, U_PRESENT };

typedef struct {
    size_t off, n;       /* layout range */
    size_t s;            /* owned floats per rank */
    size_t sh;           /* offset of the owned piece in the shard buffers */
    int p_state;         /* parameters: U_ABSENT / U_FLIGHT / U_PRESENT */
    dist_req *p_req;
    float *p_bounce;     /* all-gather target when P·s ≠ n */
    int g_live;          /* gradient region zeroed and written by the running backward */
    dist_req *g_req;     /* reduce-scatter in flight */
    float *g_bounce, *g_recv;
} fsdp_unit;

struct fsdp_state {
    moe_model *m;
    dist_comm *comm, *rep;
    int P, r, L, tied;
    int n_units;
    fsdp_unit *u;
    size_t S;
    float *p_shard, *g_shard;
    size_t map_bytes;
    adamw_range *ranges;  /* the owned pieces of every tensor, in shard order */
    int n_ranges;
    unsigned char *range_expert; /* [n_ranges]: the piece belongs to an expert tensor (TF_EXPERT) */
    dist_comm *erep, *ep; /* EP × FSDP (fsdp_set_expert_groups): expert replicas, the EP group */
    float *pack;          /* EP × FSDP: packing of the replica sums */
    size_t pack_n;
    double cur_bytes, peak_bytes;
    int rs_order[MOERL_MAX_LAYERS + 2], n_rs; /* units with a reduce-scatter in flight, oldest first */
    dist_comm *norm_extra; /* pipeline × FSDP (fsdp_set_norm_group): the other stages' squares join the norm */
    int keep;             /* actor.fsdp_config.reshard_after_forward=false (fsdp_set_reshard_after_forward): no
                             unit is released by the schedule (only by the optimizer step / fsdp_release_all),
                             gradients accumulate in the layout and fsdp_finish_grads reduce-scatters them */
};

/* Reduce-scatters allowed in flight: Open MPI progresses a nonblocking collective only inside MPI
 * calls, so without a bound every layer's gradient would stay live until the step's end (the whole
 * gradient resident); with it, at most this many finished units wait besides the one being written
 * (PyTorch FSDP's limit_all_gathers plays the same role for the gathers). */
#define FSDP_RS_IN_FLIGHT 2

/* ------------------------------------------------------------------ memory */


/* Transient buffers (bounces, receive buffers) straight from the kernel and back: the heap would
 * keep freed multi-MB blocks resident (glibc raises its mmap threshold after the first free). */
static float *tmp_alloc(size_t n) {
    float *p = moerl_map_sparse(n * sizeof(float));
    if (!p) moerl_fatal("fsdp: out of memory mapping %zu bytes", n * sizeof(float));
    return p; /* zero pages */
}
static void tmp_free(float *p, size_t n) {
    if (p) munmap(p, n ? n * sizeof(float) : 1);
}

static void account(fsdp_state *fs, double bytes) {
    fs->cur_bytes += bytes;
    if (fs->cur_bytes > fs->peak_bytes) fs->peak_bytes = fs->cur_bytes;
}

/* ------------------------------------------------------------------ units */

static int unit_of_tensor(const moe_model *m, int ti, int first_layer_tensor) {
    const tensor_info *t = &m->tensors[ti];
    if (t->layer >= 0) return t->layer + 1;
    return ti < first_layer_tensor ? 0 : m->cfg.num_hidden_layers + 1;
}

static void gather_start(fsdp_state *fs, int k) {
    fsdp_unit *u = &fs->u[k];
    if (u->p_state != U_ABSENT || u->n == 0) {
        if (u->n == 0) u->p_state = U_PRESENT;
        return;
    }
    float *dst = fs->m->params + u->off;
    if ((size_t)fs->P * u->s != u->n) {
        u->p_bounce = tmp_alloc((size_t)fs->P * u->s);
        dst = u->p_bounce;
        account(fs, (double)fs->P * u->s * 4); /* the layout region is touched only at the copy */
    } else {
        account(fs, (double)u->n * 4);
    }
    u->p_req = dist_comm_iallgather_f32(fs->comm, fs->p_shard + u->sh, u->s, dst);
    u->p_state = U_FLIGHT;
}

static void gather_wait(fsdp_state *fs, int k) {
    fsdp_unit *u = &fs->u[k];
    if (u->p_state != U_FLIGHT) return;
    MOERL_ASSERT(dist_wait(u->p_req) == MOERL_OK);
    u->p_req = NULL;
    if (u->p_bounce) {
        account(fs, (double)u->n * 4);
        memcpy(fs->m->params + u->off, u->p_bounce, u->n * sizeof(float));
        tmp_free(u->p_bounce, (size_t)fs->P * u->s);
        u->p_bounce = NULL;
        account(fs, -(double)fs->P * u->s * 4);
    }
    u->p_state = U_PRESENT;
}

static void release(fsdp_state *fs, int k) {
    fsdp_unit *u = &fs->u[k];
    if (u->p_state == U_ABSENT || u->n == 0) return;
    gather_wait(fs, k);
    moerl_drop_pages(fs->m->params, u->off, u->n);
    account(fs, -(double)u->n * 4);
    u->p_state = U_ABSENT;
}

/* Reduce-scatter of unit k complete: add into the owned gradient, give the pages back. */
static void grad_complete(fsdp_state *fs, int k) {
    fsdp_unit *u = &fs->u[k];
    float *g = fs->g_shard + u->sh;
    for (size_t i = 0; i < u->s; i++) g[i] += u->g_recv[i];
    tmp_free(u->g_recv, u->s);
    u->g_recv = NULL;
    account(fs, -(double)u->s * 4);
    if (u->g_bounce) { /* the layout region was given back when the bounce copy was made */
        tmp_free(u->g_bounce, (size_t)fs->P * u->s);
        u->g_bounce = NULL;
        account(fs, -(double)fs->P * u->s * 4);
    } else {
        moerl_drop_pages(fs->m->grads, u->off, u->n);
        account(fs, -(double)u->n * 4);
    }
}

static void rs_forget(fsdp_state *fs, int k) {
    int j = 0;
    for (int i = 0; i < fs->n_rs; i++)
        if (fs->rs_order[i] != k) fs->rs_order[j++] = fs->rs_order[i];
    fs->n_rs = j;
}

static void grad_wait(fsdp_state *fs, int k) {
    fsdp_unit *u = &fs->u[k];
    if (!u->g_req) return;
    MOERL_ASSERT(dist_wait(u->g_req) == MOERL_OK);
    u->g_req = NULL;
    rs_forget(fs, k);
    grad_complete(fs, k);
}

/* Complete the reduce-scatters that have finished (drives MPI's progress between layers). */
static void grad_poll(fsdp_state *fs) {
    for (int k = 0; k < fs->n_units; k++) {
        fsdp_unit *u = &fs->u[k];
        if (u->g_req && dist_test(u->g_req)) {
            u->g_req = NULL;
            rs_forget(fs, k);
            grad_complete(fs, k);
        }
    }
}

static void grad_touch(fsdp_state *fs, int k) {
    fsdp_unit *u = &fs->u[k];
    if (u->g_live || u->n == 0) return;
    grad_wait(fs, k); /* the previous micro-batch's reduce-scatter still reads this region */
    memset(fs->m->grads + u->off, 0, u->n * sizeof(float));
    account(fs, (double)u->n * 4);
    u->g_live = 1;
}

static void grad_ready(fsdp_state *fs, int k) {
    fsdp_unit *u = &fs->u[k];
    if (!u->g_live) return;
    u->g_live = 0;
    const float *send = fs->m->grads + u->off;
    if ((size_t)fs->P * u->s != u->n) {
        u->g_bounce = tmp_alloc((size_t)fs->P * u->s); /* zeroed: the padding adds 0 */
        memcpy(u->g_bounce, send, u->n * sizeof(float));
        send = u->g_bounce;
        account(fs, (double)fs->P * u->s * 4);
        moerl_drop_pages(fs->m->grads, u->off, u->n);
        account(fs, -(double)u->n * 4);
    }
    u->g_recv = tmp_alloc(u->s);
    account(fs, (double)u->s * 4);
    u->g_req = dist_comm_ireduce_scatter_f32(fs->comm, send, u->g_recv, u->s);
    fs->rs_order[fs->n_rs++] = k;
    while (fs->n_rs > FSDP_RS_IN_FLIGHT) grad_wait(fs, fs->rs_order[0]);
}

/* ------------------------------------------------------------------ schedule */

#define MAX_NEED 3

/* Units whose parameters the region (phase, l) reads; returns their count. Regions follow
 * forward.c: forward l = layer l's o_proj/MLP + layer l+1's attention input (or the final norm
 * and head after the last layer), l = −1 the embedding + layer 0's attention input; backward L =
 * the head + layer L−1's MLP, backward l = layer l's attention part + layer l−1's MLP (l = 0:
 * the embedding scatter, which needs no parameters). */
static int region_params(const fsdp_state *fs, model_layer_phase ph, int l, int *out) {
    const int L = fs->L, PRE = 0, POST = L + 1;
    int n = 0;
    if (ph == MODEL_FWD_LAYER) {
        if (l < 0) {
            out[n++] = PRE;
            out[n++] = 1;
        } else if (l < L - 1) {
            out[n++] = l + 1;
            out[n++] = l + 2;
        } else {
            out[n++] = L;
            out[n++] = POST;
            if (fs->tied) out[n++] = PRE;
        }
    } else if (ph == MODEL_BWD_LAYER) {
        if (l >= L) {
            out[n++] = POST;
            out[n++] = L;
            if (fs->tied) out[n++] = PRE;
        } else {
            out[n++] = l + 1;
            if (l >= 1) out[n++] = l;
        }
    }
    return n;
}

/* Units whose gradients the backward region (l) writes. */
static int region_grads(const fsdp_state *fs, int l, int *out) {
    const int L = fs->L, PRE = 0, POST = L + 1;
    int n = 0;
    if (l >= L) {
        out[n++] = POST;
        out[n++] = L;
        if (fs->tied) out[n++] = PRE;
    } else {
        out[n++] = l + 1;
        out[n++] = l >= 1 ? l : PRE;
    }
    return n;
}

static int in_set(const int *s, int n, int k) {
    for (int i = 0; i < n; i++)
        if (s[i] == k) return 1;
    return 0;
}

void fsdp_layer_event(fsdp_state *fs, model_layer_phase ph, int l) {
    if (ph == MODEL_GRAD_READY) {
        if (fs->keep) return; /* accumulate: fsdp_finish_grads reduce-scatters once */
        grad_ready(fs, l < 0 ? 0 : l >= fs->L ? fs->L + 1 : l + 1);
        grad_poll(fs);
        return;
    }
    int need[MAX_NEED], next[MAX_NEED], nn = region_params(fs, ph, l, need), nx = 0;
    /* the region after this one: forward l+1, backward l−1 (none after the last of each) */
    if (ph == MODEL_FWD_LAYER && l + 1 <= fs->L - 1) nx = region_params(fs, ph, l + 1, next);
    if (ph == MODEL_BWD_LAYER && l - 1 >= 0) nx = region_params(fs, ph, l >= fs->L ? fs->L - 1 : l - 1, next);
    for (int i = 0; i < nn; i++) gather_start(fs, need[i]);
    for (int i = 0; i < nx; i++) gather_start(fs, next[i]); /* prefetch */
    for (int k = 0; k < fs->n_units && !fs->keep; k++)
        if (!in_set(need, nn, k) && !in_set(next, nx, k)) release(fs, k);
    if (ph == MODEL_BWD_LAYER) {
        int g[MAX_NEED], ng = region_grads(fs, l, g);
        for (int i = 0; i < ng; i++) grad_touch(fs, g[i]);
    }
    grad_poll(fs);
    const double t = trace_begin();
    for (int i = 0; i < nn; i++) gather_wait(fs, need[i]);
    trace_end("fsdp all-gather wait", "dist", t);
}

void fsdp_idle_pass(fsdp_state *fs, int backward) {
    const int L = fs->L;
    for (int l = -1; l < L; l++) fsdp_layer_event(fs, MODEL_FWD_LAYER, l);
    if (!backward) return;
    fsdp_layer_event(fs, MODEL_BWD_LAYER, L);
    fsdp_layer_event(fs, MODEL_GRAD_READY, L);
    for (int l = L - 1; l >= 0; l--) {
        fsdp_layer_event(fs, MODEL_BWD_LAYER, l);
        fsdp_layer_event(fs, MODEL_GRAD_READY, l);
    }
    fsdp_layer_event(fs, MODEL_GRAD_READY, -1);
}

void fsdp_zero_grad(fsdp_state *fs) {
    if (fs->g_shard) memset(fs->g_shard, 0, fs->S * sizeof(float));
}

void fsdp_set_reshard_after_forward(fsdp_state *fs, int reshard) { fs->keep = !reshard && fs->g_shard; }

void fsdp_set_expert_groups(fsdp_state *fs, dist_comm *expert_replicas, dist_comm *ep) {
    fs->erep = expert_replicas;
    fs->ep = ep;
}

/* EP × FSDP: sum the owned gradient pieces of one kind (expert or not) over group c, packed. */
static int replica_sum_kind(fsdp_state *fs, int expert, dist_comm *c) {
    if (!c || dist_comm_size(c) <= 1) return MOERL_OK;
    size_t n = 0;
    for (int i = 0; i < fs->n_ranges; i++)
        if (fs->range_expert[i] == expert) n += fs->ranges[i].n;
    if (n > fs->pack_n) {
        free(fs->pack);
        fs->pack_n = n;
        fs->pack = xalloc_aligned((n + 1) * sizeof(float));
    }
    size_t o = 0;
    for (int i = 0; i < fs->n_ranges; i++)
        if (fs->range_expert[i] == expert) {
            memcpy(fs->pack + o, fs->g_shard + fs->ranges[i].offset, fs->ranges[i].n * sizeof(float));
            o += fs->ranges[i].n;
        }
    if (dist_comm_allreduce_f32(c, fs->pack, n) != MOERL_OK) return MOERL_ERR;
    o = 0;
    for (int i = 0; i < fs->n_ranges; i++)
        if (fs->range_expert[i] == expert) {
            memcpy(fs->g_shard + fs->ranges[i].offset, fs->pack + o, fs->ranges[i].n * sizeof(float));
            o += fs->ranges[i].n;
        }
    return MOERL_OK;
}

int fsdp_finish_grads(fsdp_state *fs) {
    const double t = trace_begin();
    /* held mini-batch: every unit's accumulated gradient is live here and goes out now, one unit at a
     * time (reduce-scatter, wait, add into the shard, give the pages back); otherwise only a unit whose
     * pass ended without its hook (not expected) */
    for (int k = 0; k < fs->n_units; k++) {
        if (fs->u[k].g_live) grad_ready(fs, k);
        grad_wait(fs, k);
    }
    int rc = MOERL_OK;
    if (fs->ep) { /* EP × FSDP: replicated tensors over every replica, expert slices over their holders */
        rc = replica_sum_kind(fs, 0, fs->rep);
        if (rc == MOERL_OK) rc = replica_sum_kind(fs, 1, fs->erep);
    } else if (fs->rep && dist_comm_size(fs->rep) > 1) {
        rc = dist_comm_allreduce_f32(fs->rep, fs->g_shard, fs->S);
    }
    trace_end("fsdp reduce-scatter wait", "dist", t);
    return rc;
}

double fsdp_grad_norm(fsdp_state *fs) {
    if (fs->ep) { /* EP × FSDP: the whole model's norm — replicated squares once, experts over the EP group */
        double ss[2] = {0, 0};
        for (int i = 0; i < fs->n_ranges; i++) {
            const float *g = fs->g_shard + fs->ranges[i].offset;
            double s = 0;
            for (size_t j = 0; j < fs->ranges[i].n; j++) s += (double)g[j] * (double)g[j];
            ss[fs->range_expert[i]] += s;
        }
        MOERL_ASSERT(dist_comm_allreduce_f64(fs->comm, ss, 2) == MOERL_OK);
        MOERL_ASSERT(dist_comm_allreduce_f64(fs->ep, &ss[1], 1) == MOERL_OK);
        double t = ss[0] + ss[1];
        if (fs->norm_extra) MOERL_ASSERT(dist_comm_allreduce_f64(fs->norm_extra, &t, 1) == MOERL_OK);
        return sqrt(t);
    }
    double ss = 0;
    const float *g = fs->g_shard;
    const size_t n = fs->S;
#pragma omp parallel for reduction(+ : ss) schedule(static)
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * (double)g[i];
    MOERL_ASSERT(dist_comm_allreduce_f64(fs->comm, &ss, 1) == MOERL_OK);
    if (fs->norm_extra) MOERL_ASSERT(dist_comm_allreduce_f64(fs->norm_extra, &ss, 1) == MOERL_OK);
    return sqrt(ss);
}

void fsdp_set_norm_group(fsdp_state *fs, dist_comm *stages) { fs->norm_extra = stages; }

void fsdp_adamw_init(fsdp_state *fs, adamw_state *os, adamw_config cfg) { adamw_init_shard(os, fs->S, cfg); }

int fsdp_adamw_step(fsdp_state *fs, adamw_state *os, float lr, float loss, double *grad_norm) {
    const double norm = fsdp_grad_norm(fs);
    if (grad_norm) *grad_norm = norm;
    const int applied = adamw_step_ranges(os, fs->p_shard, fs->g_shard, fs->ranges, fs->n_ranges, lr, loss, norm);
    fsdp_release_all(fs); /* every gathered copy is stale now */
    return applied;
}

float *fsdp_param_shard(fsdp_state *fs, size_t *n) {
    *n = fs->S;
    return fs->p_shard;
}

void fsdp_release_all(fsdp_state *fs) {
    for (int k = 0; k < fs->n_units; k++) release(fs, k);
}

int fsdp_gather_full(fsdp_state *fs, int keep) {
    for (int k = 0; k < fs->n_units; k++) {
        gather_start(fs, k);
        gather_wait(fs, k);
        if (!keep) release(fs, k);
    }
    return MOERL_OK;
}

void fsdp_slice_vec(const fsdp_state *fs, const float *full, float *shard_vec) {
    for (int k = 0; k < fs->n_units; k++) {
        const fsdp_unit *u = &fs->u[k];
        const size_t lo = (size_t)fs->r * u->s, hi = MOERL_MIN(u->n, lo + u->s);
        float *d = shard_vec + u->sh;
        memset(d, 0, u->s * sizeof(float));
        if (hi > lo) memcpy(d, full + u->off + lo, (hi - lo) * sizeof(float));
    }
}

void fsdp_take_shard(fsdp_state *fs) {
    fsdp_slice_vec(fs, fs->m->params, fs->p_shard);
    for (int k = 0; k < fs->n_units; k++) {
        fsdp_unit *u = &fs->u[k];
        if (u->p_state != U_ABSENT) {
            gather_wait(fs, k);
            account(fs, -(double)u->n * 4);
            u->p_state = U_ABSENT;
        }
    }
    moerl_drop_pages(fs->m->params, 0, fs->m->n_params);
}

int fsdp_gather_vec(fsdp_state *fs, const float *shard_vec, float *full) {
    for (int k = 0; k < fs->n_units; k++) {
        const fsdp_unit *u = &fs->u[k];
        if (u->n == 0) continue;
        float *tmp = tmp_alloc((size_t)fs->P * u->s);
        const int rc = dist_comm_allgather_f32(fs->comm, shard_vec + u->sh, u->s, tmp);
        if (rc == MOERL_OK && full) memcpy(full + u->off, tmp, u->n * sizeof(float));
        tmp_free(tmp, (size_t)fs->P * u->s);
        if (rc != MOERL_OK) return rc;
    }
    return MOERL_OK;
}

/* ------------------------------------------------------------------ setup */

fsdp_state *fsdp_state_new(moe_model *m, dist_comm *shard, dist_comm *replicas) {
    return fsdp_state_new_units(m, shard, replicas, NULL);
}

fsdp_state *fsdp_state_new_units(moe_model *m, dist_comm *shard, dist_comm *replicas, const unsigned char *unit_on) {
    fsdp_state *fs = xcalloc(1, sizeof *fs);
    fs->m = m;
    fs->comm = shard;
    fs->rep = replicas;
    fs->P = dist_comm_size(shard);
    fs->r = dist_comm_rank(shard);
    fs->L = m->cfg.num_hidden_layers;
    fs->tied = m->cfg.tie_word_embeddings;
    fs->n_units = fs->L + 2;
    fs->u = xcalloc((size_t)fs->n_units, sizeof(fsdp_unit));
    int first_layer = m->n_tensors;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].layer >= 0) {
            first_layer = i;
            break;
        }
    for (int k = 0; k < fs->n_units; k++) fs->u[k].off = SIZE_MAX;
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        fsdp_unit *u = &fs->u[unit_of_tensor(m, i, first_layer)];
        const size_t end = t->offset + (((size_t)t->numel + 15) & ~(size_t)15);
        if (u->off == SIZE_MAX) u->off = t->offset;
        MOERL_ASSERT(t->offset == u->off + u->n); /* units are contiguous in table order */
        u->n = end - u->off;
    }
    size_t sh = 0;
    for (int k = 0; k < fs->n_units; k++) {
        fsdp_unit *u = &fs->u[k];
        if (u->off == SIZE_MAX || (unit_on && !unit_on[k])) u->off = 0, u->n = 0; /* absent, or not this stage's */
        u->s = ((u->n + (size_t)fs->P - 1) / (size_t)fs->P + 15) & ~(size_t)15;
        u->sh = sh;
        sh += u->s;
    }
    fs->S = sh;
    /* the owned piece of every tensor, for the optimizer */
    fs->ranges = xcalloc((size_t)m->n_tensors + 1, sizeof(adamw_range));
    fs->range_expert = xcalloc((size_t)m->n_tensors + 1, 1);
    for (int i = 0; i < m->n_tensors; i++) {
        const tensor_info *t = &m->tensors[i];
        const fsdp_unit *u = &fs->u[unit_of_tensor(m, i, first_layer)];
        const size_t own0 = u->off + (size_t)fs->r * u->s, own1 = own0 + u->s;
        const size_t a = MOERL_MAX(own0, t->offset), b = MOERL_MIN(own1, t->offset + (size_t)t->numel);
        if (b <= a) continue;
        fs->range_expert[fs->n_ranges] = (t->flags & TF_EXPERT) != 0;
        fs->ranges[fs->n_ranges++] = (adamw_range){.offset = u->sh + (a - own0), .n = b - a,
                                                   .decay = (t->flags & TF_DECAY) != 0};
    }
    fs->p_shard = xalloc_aligned((fs->S ? fs->S : 1) * sizeof(float));
    fs->g_shard = m->grads ? xalloc_aligned((fs->S ? fs->S : 1) * sizeof(float)) : NULL; /* inference: none */
    fs->map_bytes = m->n_params * sizeof(float);
    float *mp = moerl_map_sparse(fs->map_bytes), *mg = m->grads ? moerl_map_sparse(fs->map_bytes) : NULL;
    if (!mp || (m->grads && !mg)) {
        if (mp) munmap(mp, fs->map_bytes);
        if (mg) munmap(mg, fs->map_bytes);
        free(fs->p_shard);
        free(fs->g_shard);
        free(fs->ranges);
        free(fs->range_expert);
        free(fs->u);
        free(fs);
        return moerl_errorf("fsdp: cannot map %zu bytes of address space for the gather buffers", 2 * m->n_params * 4),
               NULL;
    }
    fsdp_slice_vec(fs, m->params, fs->p_shard);
    model_free_params(m); /* a heap buffer or a checkpoint mapping adopted at load */
    free(m->grads);
    m->params = mp;
    m->grads = mg;
    model_views_for(m, m->params, &m->p);
    if (mg) model_views_for(m, m->grads, &m->g);
    return fs;
}

void fsdp_state_free(fsdp_state *fs) {
    if (!fs) return;
    moe_model *m = fs->m;
    for (int k = 0; k < fs->n_units; k++) grad_wait(fs, k);
    fsdp_release_all(fs);
    float *p = xalloc_aligned(m->n_params * sizeof(float));
    MOERL_ASSERT(fsdp_gather_vec(fs, fs->p_shard, p) == MOERL_OK);
    munmap(m->params, fs->map_bytes);
    m->params = p;
    model_views_for(m, m->params, &m->p);
    if (fs->g_shard) { /* an inference model (no gradient buffer) stays one */
        munmap(m->grads, fs->map_bytes);
        m->grads = xalloc_aligned(m->n_params * sizeof(float));
        model_views_for(m, m->grads, &m->g);
    }
    free(fs->p_shard);
    free(fs->g_shard);
    free(fs->ranges);
    free(fs->range_expert);
    free(fs->pack);
    free(fs->u);
    free(fs);
}

void fsdp_get_stats(const fsdp_state *fs, fsdp_stats *st) {
    memset(st, 0, sizeof *st);
    st->P = fs->P;
    st->rank = fs->r;
    st->replicas = fs->rep ? dist_comm_size(fs->rep) : 1;
    st->shard_floats = fs->S;
    st->n_params = fs->m->n_params;
    st->peak_gathered_bytes = fs->peak_bytes;
    st->gathered_bytes = fs->cur_bytes;
    st->allgather_bytes = dist_comm_bytes(fs->comm, DIST_OP_ALLGATHER);
    st->reduce_scatter_bytes = dist_comm_bytes(fs->comm, DIST_OP_REDUCE_SCATTER);
    st->replica_bytes = fs->rep ? dist_comm_bytes(fs->rep, DIST_OP_ALLREDUCE) : 0;
    st->n_units = fs->n_units;
    for (int k = 0; k < fs->n_units; k++) st->unit_floats_max = MOERL_MAX(st->unit_floats_max, fs->u[k].n);
}

void fsdp_reset_peak(fsdp_state *fs) { fs->peak_bytes = fs->cur_bytes; }

size_t fsdp_unit_shard(const fsdp_state *fs, int k, size_t *unit_floats) {
    if (unit_floats) *unit_floats = fs->u[k].n;
    return fs->u[k].s;
}
