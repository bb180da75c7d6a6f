/* Megatron sequence parallelism's collectives (see tp_sp.h). */
#include "parallel/tp_sp.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/forward.h"

int tp_sp_reduce_scatter(dist_comm *comm, float *x, int N, int H) {
    const int P = dist_comm_size(comm), r = dist_comm_rank(comm), c = (N + P - 1) / P;
    int s0, s1;
    model_sp_rows(N, P, r, &s0, &s1);
    const size_t row = (size_t)H, whole = (size_t)P * c * row;
    float *send = x, *recv = xmalloc(((size_t)c * row + 1) * sizeof(float));
    if (whole != (size_t)N * row) { /* N not a multiple of P: zero rows pad the last slices */
        send = xcalloc(whole, sizeof(float));
        memcpy(send, x, (size_t)N * row * sizeof(float));
    }
    const int rc = dist_comm_reduce_scatter_f32(comm, send, recv, (size_t)c * row);
    if (rc == MOERL_OK) memcpy(x + (size_t)s0 * row, recv, (size_t)(s1 - s0) * row * sizeof(float));
    if (send != x) free(send);
    free(recv);
    return rc == MOERL_OK ? MOERL_OK : moerl_error_prefix("sequence-parallel reduce-scatter: ");
}

int tp_sp_all_gather(dist_comm *comm, float *x, int N, int H) {
    const int P = dist_comm_size(comm), r = dist_comm_rank(comm), c = (N + P - 1) / P;
    int s0, s1;
    model_sp_rows(N, P, r, &s0, &s1);
    const size_t row = (size_t)H;
    float *mine = xcalloc((size_t)c * row + 1, sizeof(float)), *all = xmalloc(((size_t)P * c * row + 1) * sizeof(float));
    memcpy(mine, x + (size_t)s0 * row, (size_t)(s1 - s0) * row * sizeof(float)); /* short slice: zero padding */
    const int rc = dist_comm_allgather_f32(comm, mine, (size_t)c * row, all);
    if (rc == MOERL_OK) memcpy(x, all, (size_t)N * row * sizeof(float)); /* member q's rows start at q·c */
    free(mine);
    free(all);
    return rc == MOERL_OK ? MOERL_OK : moerl_error_prefix("sequence-parallel all-gather: ");
}

int tp_sp_reduce_norm_grads(dist_comm *comm, moe_model *m) {
    const int L = m->cfg.num_hidden_layers, H = m->cfg.hidden_size;
    const size_t n = (size_t)(2 * L + 1) * H;
    float *buf = xmalloc(n * sizeof(float));
    for (int l = 0; l < L; l++) {
        memcpy(buf + (size_t)2 * l * H, m->g.layers[l].input_layernorm, (size_t)H * sizeof(float));
        memcpy(buf + (size_t)(2 * l + 1) * H, m->g.layers[l].post_attention_layernorm, (size_t)H * sizeof(float));
    }
    memcpy(buf + (size_t)2 * L * H, m->g.norm, (size_t)H * sizeof(float));
    const int rc = dist_comm_allreduce_f32(comm, buf, n);
    if (rc == MOERL_OK) {
        for (int l = 0; l < L; l++) {
            memcpy(m->g.layers[l].input_layernorm, buf + (size_t)2 * l * H, (size_t)H * sizeof(float));
            memcpy(m->g.layers[l].post_attention_layernorm, buf + (size_t)(2 * l + 1) * H, (size_t)H * sizeof(float));
        }
        memcpy(m->g.norm, buf + (size_t)2 * L * H, (size_t)H * sizeof(float));
    }
    free(buf);
    return rc == MOERL_OK ? MOERL_OK : moerl_error_prefix("sequence-parallel norm gradient sum: ");
}

int tp_sp_reduce_router_grads(dist_comm *comm, moe_model *m) {
    const int L = m->cfg.num_hidden_layers;
    const size_t n = (size_t)m->cfg.num_experts * m->cfg.hidden_size;
    size_t total = 0;
    for (int l = 0; l < L; l++) total += m->g.layers[l].router ? n : 0;
    if (!total) return MOERL_OK;
    float *buf = xmalloc(total * sizeof(float));
    for (int pass = 0, rc = MOERL_OK; pass < 2; pass++) { /* 0: pack, then the sum; 1: unpack */
        size_t o = 0;
        for (int l = 0; l < L; l++) {
            if (!m->g.layers[l].router) continue;
            if (pass) memcpy(m->g.layers[l].router, buf + o, n * sizeof(float));
            else memcpy(buf + o, m->g.layers[l].router, n * sizeof(float));
            o += n;
        }
        if (!pass && (rc = dist_comm_allreduce_f32(comm, buf, total)) != MOERL_OK) {
            free(buf);
            return moerl_error_prefix("sequence-parallel × expert-parallel router gradient sum: ");
        }
    }
    free(buf);
    return MOERL_OK;
}
