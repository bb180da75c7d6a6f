/* FLOP counts and the measured sgemm peak. See perf.h. */
#include "model/perf.h"

#include <cblas.h>
/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I would rename the variable I. */
#undef I

#include "base/common.h"

int64_t model_active_matmul_params(const moe_config *c) {
    const int64_t H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim,
                  E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
                  Id = c->intermediate_size, V = c->vocab_size;
    int64_t p = V * H; /* LM head (tied or not, the product is done) */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        p += H * nh * hd + 2 * H * nkv * hd + nh * hd * H;
        p += moe_config_layer_is_moe(c, l) ? E * H + K * 3 * H * I : 3 * H * Id;
    }
    return p;
}

int64_t model_attention_pairs(const int *cu_seqlens, int B) {
    int64_t s = 0;
    for (int b = 0; b < B; b++) {
        const int64_t T = cu_seqlens[b + 1] - cu_seqlens[b];
        s += T * (T + 1) / 2;
    }
    return s;
}

double model_train_flops(const moe_config *c, int64_t tokens, int64_t pairs) {
    return 6.0 * (double)model_active_matmul_params(c) * (double)tokens +
           12.0 * c->num_hidden_layers * (double)c->num_attention_heads * c->head_dim * (double)pairs;
}

double model_layer_train_flops(const moe_config *c, int l, int64_t tokens, int64_t pairs) {
    const int64_t H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim,
                  E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
                  Id = c->intermediate_size, V = c->vocab_size;
    if (l >= c->num_hidden_layers) return 6.0 * (double)(V * H) * (double)tokens;
    int64_t p = H * nh * hd + 2 * H * nkv * hd + nh * hd * H;
    p += moe_config_layer_is_moe(c, l) ? E * H + K * 3 * H * I : 3 * H * Id;
    return 6.0 * (double)p * (double)tokens + 12.0 * (double)nh * hd * (double)pairs;
}

double perf_sgemm_peak(double seconds, int threads) {
    const int n = 512;
    if (seconds < 0.05) seconds = 0.05;
    if (threads < 1) threads = 1;
    float *a = xalloc_aligned((size_t)n * n * sizeof(float)), *b = xalloc_aligned((size_t)n * n * sizeof(float)),
          *c = xalloc_aligned((size_t)n * n * sizeof(float));
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)((i * 7 + 3) % 17) * 0.01f;
        b[i] = (float)((i * 5 + 1) % 13) * 0.01f;
    }
    const int nb = openblas_get_num_threads();
    openblas_set_num_threads(1); /* one core: a call is short enough to fall between other work's time slices */
    double best = 0.0;
    const double t_end = moerl_now() + seconds;
    int reps = 0;
    do { /* the first call warms caches; at least 5 calls */
        const double t0 = moerl_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        const double dt = moerl_now() - t0;
        if (dt > 0 && reps > 0) best = MOERL_MAX(best, 2.0 * n * n * (double)n / dt);
        reps++;
    } while (reps < 5 || moerl_now() < t_end);
    openblas_set_num_threads(nb);
    free(a);
    free(b);
    free(c);
    return best * threads;
}
