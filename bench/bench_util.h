/* Helpers shared by the benchmarks: medians over repetitions and the benchmark model of the
 * issues (hidden 256, 4 layers, 8 heads, 2 kv heads, head_dim 32, 16 experts top-4, expert size
 * 128, vocab 512, all layers MoE). Header-only; each bench is one translation unit. */
#ifndef MOERL_BENCH_UTIL_H
#define MOERL_BENCH_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/model.h"

static int bench_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sort v[n] ascending in place. */
static inline void bench_sort(double *v, int n) { qsort(v, (size_t)n, sizeof *v, bench_cmp_double); }

/* Sort v[n] in place and return its median (mean of the two middle values for even n). */
static inline double bench_median_sorted(double *v, int n) {
    bench_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median of v[n], leaving v untouched. */
static inline double bench_median(const double *v, int n) {
    double *c = xmalloc((size_t)n * sizeof(double));
    memcpy(c, v, (size_t)n * sizeof(double));
    const double m = bench_median_sorted(c, n);
    free(c);
    return m;
}

/* The benchmark model configuration; max_pos = max_position_embeddings (at least 2048). */
static inline moe_config bench_model_config(int max_pos) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 512;
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.moe_intermediate_size = 128;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.num_experts = 16;
    c.num_experts_per_tok = 4;
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = 1;
    c.tie_word_embeddings = 0;
    c.max_position_embeddings = MOERL_MAX(max_pos, 2048);
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1e6f;
    c.router_aux_loss_coef = 0.001f;
    c.initializer_range = 0.02f;
    c.bos_token_id = c.eos_token_id = -1;
    return c;
}

/* The larger benchmark model ("B" of bench_decode and the llama.cpp drivers): H 512, 8 layers, 8 heads / 2 KV
 * heads, head_dim 64, 32 experts top-4, expert I 256, vocab 2048, untied, every layer MoE (433 MB fp32). */
static inline moe_config bench_model_config_B(void) {
    moe_config c = bench_model_config(4096);
    c.vocab_size = 2048;
    c.hidden_size = 512;
    c.moe_intermediate_size = 256;
    c.intermediate_size = 4 * c.moe_intermediate_size; /* unused: every layer is MoE */
    c.num_hidden_layers = 8;
    c.head_dim = 64;
    c.num_experts = 32;
    return c;
}

#endif
