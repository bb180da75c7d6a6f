/* The two-stage compressed all-reduce of 1-bit Adam: see onebit.h for the algorithm and layout. */
#include "dist/onebit.h"

/* no fused multiply-add: the exchange is bit-for-bit the one of tests/ref/gen_onebit_adam.py */
#pragma GCC optimize("fp-contract=off")

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"

size_t onebit_chunk(size_t n, int world) {
    size_t c = (n + (size_t)world - 1) / (size_t)world;
    c = (c + 31) / 32 * 32;
    return c ? c : 32;
}

size_t onebit_msg_words(size_t chunk) { return 1 + chunk / 32; }

double onebit_sent_bytes(size_t n, int world) {
    return 2.0 * (world - 1) * 4.0 * (double)onebit_msg_words(onebit_chunk(n, world));
}

void onebit_exchange_init(onebit_exchange *x, size_t n, int world, int rank) {
    const size_t b[2] = {0, n};
    onebit_exchange_init_segments(x, n, world, rank, b, 1);
}

/* Values of chunk r that lie inside [0, n). */
static size_t chunk_count(const onebit_exchange *x, int r) {
    const size_t lo = (size_t)r * x->chunk;
    return lo >= x->n ? 0 : (x->n - lo < x->chunk ? x->n - lo : x->chunk);
}

/* The first segment that meets chunk r (seg[k + 1] > r·chunk); n_seg when none does. */
static int first_seg(const onebit_exchange *x, int r) {
    const size_t lo = (size_t)r * x->chunk;
    int a = 0, b = x->n_seg;
    while (a < b) {
        const int mid = (a + b) / 2;
        if (x->seg[mid + 1] > lo) b = mid;
        else a = mid + 1;
    }
    return a;
}

/* Piece j of chunk r: its segment *k and its range [*a, *b) relative to the chunk start; 0 past the
 * last piece. */
static int piece(const onebit_exchange *x, int r, int j, int *k, size_t *a, size_t *b) {
    const size_t lo = (size_t)r * x->chunk, hi = lo + chunk_count(x, r);
    *k = first_seg(x, r) + j;
    if (*k >= x->n_seg || x->seg[*k] >= hi || lo >= hi) return 0;
    *a = (x->seg[*k] > lo ? x->seg[*k] : lo) - lo;
    *b = (x->seg[*k + 1] < hi ? x->seg[*k + 1] : hi) - lo;
    return 1;
}

void onebit_exchange_init_segments(onebit_exchange *x, size_t n, int world, int rank, const size_t *bounds,
                                   int n_seg) {
    MOERL_ASSERT(world >= 1 && rank >= 0 && rank < world && n_seg >= 1 && bounds[0] == 0 && bounds[n_seg] == n);
    for (int k = 0; k < n_seg; k++) MOERL_ASSERT(n == 0 || bounds[k] < bounds[k + 1]);
    memset(x, 0, sizeof *x);
    x->world = world;
    x->rank = rank;
    x->n = n;
    x->chunk = onebit_chunk(n, world);
    x->worker_err = xcalloc(n ? n : 1, sizeof(float));
    x->server_err = xcalloc(x->chunk, sizeof(float));
    x->n_seg = n_seg;
    x->seg = xmalloc((size_t)(n_seg + 1) * sizeof(size_t));
    memcpy(x->seg, bounds, (size_t)(n_seg + 1) * sizeof(size_t));
    x->pieces = 1;
    for (int r = 0; r < world; r++) {
        int j = 0, k;
        size_t a, b;
        while (piece(x, r, j, &k, &a, &b)) j++;
        if (j > x->pieces) x->pieces = j;
    }
}

void onebit_exchange_set_active(onebit_exchange *x, const uint8_t *active) {
    free(x->active);
    x->active = NULL;
    x->n_masked = 0;
    if (!active) return;
    x->active = xmalloc(x->n ? x->n : 1);
    memcpy(x->active, active, x->n);
    for (size_t i = 0; i < x->n; i++) x->n_masked += !active[i];
}

size_t onebit_exchange_words(const onebit_exchange *x) { return (size_t)x->pieces + x->chunk / 32; }

double onebit_exchange_bytes(const onebit_exchange *x) {
    return 2.0 * (x->world - 1) * 4.0 * (double)onebit_exchange_words(x);
}

void onebit_exchange_free(onebit_exchange *x) {
    free(x->worker_err);
    free(x->server_err);
    free(x->seg);
    free(x->active);
    memset(x, 0, sizeof *x);
}

/* The scale of the active values of y[cnt] (act: their flags, NULL = all): their mean |y|, ‖y‖₁/count,
 * summed in double and rounded to fp32; 0 when none. The mean |y| is the s that minimises
 * ‖y − s·sign(y)‖₂ (the error the feedback must carry); see onebit.h for why not ‖y‖₂/√count. */
static float mean_abs_scale(const float *y, const uint8_t *act, size_t cnt) {
    double sa = 0.0;
    size_t m = 0;
    for (size_t i = 0; i < cnt; i++)
        if (!act || act[i]) {
            sa += fabs((double)y[i]);
            m++;
        }
    return m ? (float)(sa / (double)m) : 0.0f;
}

static int32_t f32_bits(float f) {
    int32_t b;
    memcpy(&b, &f, 4);
    return b;
}

static float bits_f32(int32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* Set the sign bits (1 = negative) of the active values y[a..b) into words (zeroed by the caller). */
static void pack_signs(const float *y, const uint8_t *act, size_t a, size_t b, int32_t *words) {
    for (size_t j = a; j < b; j++)
        if ((!act || act[j]) && y[j] < 0.0f) words[j / 32] |= (int32_t)(1u << (j % 32));
}

static float sign_of(const int32_t *words, size_t j) { return ((uint32_t)words[j / 32] >> (j % 32)) & 1u ? -1.0f : 1.0f; }

static const uint8_t *act_at(const onebit_exchange *x, size_t off) { return x->active ? x->active + off : NULL; }

void onebit_worker_compress(onebit_exchange *x, const float *v, int32_t *send) {
    const size_t W = onebit_exchange_words(x), P = (size_t)x->pieces;
    float *e = x->worker_err;
    const uint8_t *act = x->active;
    for (size_t i = 0; i < x->n; i++)
        if (!act || act[i]) e[i] += v[i]; /* y = x + e_w, kept in e_w until the residual is known */
    float *s = xmalloc((size_t)x->n_seg * sizeof(float));
    for (int k = 0; k < x->n_seg; k++) s[k] = mean_abs_scale(e + x->seg[k], act_at(x, x->seg[k]), x->seg[k + 1] - x->seg[k]);
    for (int q = 0; q < x->world; q++) {
        const size_t lo = (size_t)q * x->chunk;
        int32_t *msg = send + (size_t)q * W;
        memset(msg, 0, W * sizeof(int32_t));
        int k;
        size_t a, b;
        for (int j = 0; piece(x, q, j, &k, &a, &b); j++) {
            msg[j] = f32_bits(s[k]);
            pack_signs(e + lo, act_at(x, lo), a, b, msg + P);
        }
    }
    for (int k = 0; k < x->n_seg; k++) /* e_w ← y − s·sign(y) */
        for (size_t i = x->seg[k]; i < x->seg[k + 1]; i++)
            if (!act || act[i]) e[i] -= e[i] < 0.0f ? -s[k] : s[k];
    free(s);
}

/* The scales of a message; error when one is not a finite non-negative number. */
static int msg_scales(const int32_t *msg, int P, int from, const char *stage) {
    for (int j = 0; j < P; j++) {
        const float s = bits_f32(msg[j]);
        if (!isfinite(s) || s < 0.0f)
            return moerl_errorf("1-bit all-reduce (%s): the message from rank %d carries scale %g, expected a finite "
                                "number ≥ 0 (a non-finite momentum, or a corrupt message)",
                                stage, from, (double)s);
    }
    return MOERL_OK;
}

int onebit_server_reduce(onebit_exchange *x, const int32_t *recv, int32_t *out) {
    const size_t W = onebit_exchange_words(x), P = (size_t)x->pieces, lo = (size_t)x->rank * x->chunk;
    const uint8_t *act = act_at(x, lo);
    float *z = x->server_err;
    int k;
    size_t a, b;
    for (int i = 0; i < x->world; i++)
        if (msg_scales(recv + (size_t)i * W, x->pieces, i, "server stage") != MOERL_OK) return MOERL_ERR;
    float *acc = xcalloc(x->chunk, sizeof(float));
    for (int i = 0; i < x->world; i++) {
        const int32_t *msg = recv + (size_t)i * W;
        for (int j = 0; piece(x, x->rank, j, &k, &a, &b); j++) {
            const float s = bits_f32(msg[j]);
            for (size_t t = a; t < b; t++)
                if (!act || act[t]) acc[t] += s * sign_of(msg + P, t);
        }
    }
    const float inv_w = 1.0f / (float)x->world;
    memset(out, 0, W * sizeof(int32_t));
    for (int j = 0; piece(x, x->rank, j, &k, &a, &b); j++) {
        for (size_t t = a; t < b; t++)
            if (!act || act[t]) z[t] = acc[t] * inv_w + z[t]; /* z = mean + e_s, kept in e_s */
        const float s = mean_abs_scale(z + a, act ? act + a : NULL, b - a);
        out[j] = f32_bits(s);
        pack_signs(z, act, a, b, out + P);
        for (size_t t = a; t < b; t++)
            if (!act || act[t]) z[t] -= z[t] < 0.0f ? -s : s; /* e_s ← z − s·sign(z) */
    }
    free(acc);
    return MOERL_OK;
}

int onebit_decode(const onebit_exchange *x, const int32_t *gathered, float *v) {
    const size_t W = onebit_exchange_words(x), P = (size_t)x->pieces;
    for (int r = 0; r < x->world; r++)
        if (msg_scales(gathered + (size_t)r * W, x->pieces, r, "all-gather stage") != MOERL_OK) return MOERL_ERR;
    for (int r = 0; r < x->world; r++) {
        const int32_t *msg = gathered + (size_t)r * W;
        const size_t lo = (size_t)r * x->chunk;
        const uint8_t *act = act_at(x, lo);
        float *dst = v + lo;
        int k;
        size_t a, b;
        for (int j = 0; piece(x, r, j, &k, &a, &b); j++) {
            const float s = bits_f32(msg[j]);
            for (size_t t = a; t < b; t++) dst[t] = !act || act[t] ? s * sign_of(msg + P, t) : 0.0f;
        }
    }
    return MOERL_OK;
}

int onebit_allreduce_comm(onebit_exchange *x, struct dist_comm *c, float *v) {
    if (!c && x->world == 1) { /* one worker: its own server; the error feedback still applies */
        const size_t W = onebit_exchange_words(x);
        int32_t *a = xmalloc(W * sizeof(int32_t)), *b = xmalloc(W * sizeof(int32_t));
        onebit_worker_compress(x, v, a);
        int rc = onebit_server_reduce(x, a, b);
        if (rc == MOERL_OK) rc = onebit_decode(x, b, v);
        free(a);
        free(b);
        x->sent_bytes = 0;
        return rc;
    }
    if (!c) return moerl_errorf("1-bit all-reduce: no group given for a world of %d", x->world);
    if (dist_comm_size(c) != x->world || dist_comm_rank(c) != x->rank)
        return moerl_errorf("1-bit all-reduce: the group has rank %d of %d, the error buffers were made for rank %d "
                            "of %d", dist_comm_rank(c), dist_comm_size(c), x->rank, x->world);
    const size_t W = onebit_exchange_words(x), P = (size_t)x->world;
    int32_t *send = xmalloc(P * W * sizeof(int32_t)), *recv = xmalloc(P * W * sizeof(int32_t));
    int rc = MOERL_ERR;
    onebit_worker_compress(x, v, send);
    if (dist_comm_alltoall_i32(c, (const int *)send, W, (int *)recv) != MOERL_OK) goto out;
    if (onebit_server_reduce(x, recv, send) != MOERL_OK) goto out; /* this rank's message in send[0..W) */
    for (size_t q = 1; q < P; q++) memcpy(send + q * W, send, W * sizeof(int32_t)); /* all-gather as all-to-all */
    if (dist_comm_alltoall_i32(c, (const int *)send, W, (int *)recv) != MOERL_OK) goto out;
    rc = onebit_decode(x, recv, v);
    x->sent_bytes = onebit_exchange_bytes(x);
out:
    free(send);
    free(recv);
    return rc;
}
