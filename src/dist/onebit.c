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
    MOERL_ASSERT(world >= 1 && rank >= 0 && rank < world);
    memset(x, 0, sizeof *x);
    x->world = world;
    x->rank = rank;
    x->n = n;
    x->chunk = onebit_chunk(n, world);
    x->worker_err = xcalloc(n ? n : 1, sizeof(float));
    x->server_err = xcalloc(x->chunk, sizeof(float));
}

void onebit_exchange_free(onebit_exchange *x) {
    free(x->worker_err);
    free(x->server_err);
    memset(x, 0, sizeof *x);
}

/* Values of chunk r that lie inside [0, n). */
static size_t chunk_count(const onebit_exchange *x, int r) {
    const size_t lo = (size_t)r * x->chunk;
    return lo >= x->n ? 0 : (x->n - lo < x->chunk ? x->n - lo : x->chunk);
}

/* RMS of y[cnt] (‖y‖₂/√cnt) in double, rounded to fp32; 0 for an empty piece. */
static float rms_scale(const float *y, size_t cnt) {
    if (!cnt) return 0.0f;
    double ss = 0.0;
    for (size_t i = 0; i < cnt; i++) ss += (double)y[i] * (double)y[i];
    return (float)sqrt(ss / (double)cnt);
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

/* Pack sign bits of y[cnt] (1 = negative) into words[chunk/32], zero beyond cnt. */
static void pack_signs(const float *y, size_t cnt, size_t chunk, int32_t *words) {
    memset(words, 0, chunk / 8);
    for (size_t j = 0; j < cnt; j++)
        if (y[j] < 0.0f) words[j / 32] |= (int32_t)(1u << (j % 32));
}

static float sign_of(const int32_t *words, size_t j) { return ((uint32_t)words[j / 32] >> (j % 32)) & 1u ? -1.0f : 1.0f; }

void onebit_worker_compress(onebit_exchange *x, const float *v, int32_t *send) {
    const size_t W = onebit_msg_words(x->chunk);
    float *e = x->worker_err;
    for (size_t i = 0; i < x->n; i++) e[i] += v[i]; /* y = x + e_w, kept in e_w until the residual is known */
    const float s = rms_scale(e, x->n);
    for (int q = 0; q < x->world; q++) {
        const size_t lo = (size_t)q * x->chunk, cnt = chunk_count(x, q);
        int32_t *msg = send + (size_t)q * W;
        msg[0] = f32_bits(s);
        pack_signs(e + lo, cnt, x->chunk, msg + 1);
    }
    for (size_t i = 0; i < x->n; i++) e[i] -= e[i] < 0.0f ? -s : s; /* e_w ← y − s·sign(y) */
}

/* The scale of message i; error when it is not a finite non-negative number. */
static int msg_scale(const int32_t *msg, int from, const char *stage, float *s) {
    *s = bits_f32(msg[0]);
    if (!isfinite(*s) || *s < 0.0f)
        return moerl_errorf("1-bit all-reduce (%s): the message from rank %d carries scale %g, expected a finite "
                            "number ≥ 0 (a non-finite momentum, or a corrupt message)",
                            stage, from, (double)*s);
    return MOERL_OK;
}

int onebit_server_reduce(onebit_exchange *x, const int32_t *recv, int32_t *out) {
    const size_t W = onebit_msg_words(x->chunk), cnt = chunk_count(x, x->rank);
    float *z = x->server_err;
    float *acc = xcalloc(x->chunk, sizeof(float));
    for (int i = 0; i < x->world; i++) {
        float s;
        if (msg_scale(recv + (size_t)i * W, i, "server stage", &s) != MOERL_OK) {
            free(acc);
            return MOERL_ERR;
        }
        const int32_t *signs = recv + (size_t)i * W + 1;
        for (size_t j = 0; j < cnt; j++) acc[j] += s * sign_of(signs, j);
    }
    const float inv_w = 1.0f / (float)x->world;
    for (size_t j = 0; j < cnt; j++) z[j] = acc[j] * inv_w + z[j]; /* z = mean + e_s, kept in e_s */
    free(acc);
    const float s = rms_scale(z, cnt);
    out[0] = f32_bits(s);
    pack_signs(z, cnt, x->chunk, out + 1);
    for (size_t j = 0; j < cnt; j++) z[j] -= z[j] < 0.0f ? -s : s; /* e_s ← z − s·sign(z) */
    return MOERL_OK;
}

int onebit_decode(const onebit_exchange *x, const int32_t *gathered, float *v) {
    const size_t W = onebit_msg_words(x->chunk);
    for (int r = 0; r < x->world; r++) {
        float s;
        if (msg_scale(gathered + (size_t)r * W, r, "all-gather stage", &s) != MOERL_OK) return MOERL_ERR;
        const int32_t *signs = gathered + (size_t)r * W + 1;
        float *dst = v + (size_t)r * x->chunk;
        const size_t cnt = chunk_count(x, r);
        for (size_t j = 0; j < cnt; j++) dst[j] = s * sign_of(signs, j);
    }
    return MOERL_OK;
}

int onebit_allreduce_comm(onebit_exchange *x, struct dist_comm *c, float *v) {
    if (!c && x->world == 1) { /* one worker: its own server; the error feedback still applies */
        const size_t W = onebit_msg_words(x->chunk);
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
    const size_t W = onebit_msg_words(x->chunk), P = (size_t)x->world;
    int32_t *send = xmalloc(P * W * sizeof(int32_t)), *recv = xmalloc(P * W * sizeof(int32_t));
    int rc = MOERL_ERR;
    onebit_worker_compress(x, v, send);
    if (dist_comm_alltoall_i32(c, (const int *)send, W, (int *)recv) != MOERL_OK) goto out;
    if (onebit_server_reduce(x, recv, send) != MOERL_OK) goto out; /* this rank's message in send[0..W) */
    for (size_t q = 1; q < P; q++) memcpy(send + q * W, send, W * sizeof(int32_t)); /* all-gather as all-to-all */
    if (dist_comm_alltoall_i32(c, (const int *)send, W, (int *)recv) != MOERL_OK) goto out;
    rc = onebit_decode(x, recv, v);
    x->sent_bytes = onebit_sent_bytes(x->n, x->world);
out:
    free(send);
    free(recv);
    return rc;
}
