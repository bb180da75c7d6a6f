/* Pieces shared by the llama.cpp drivers bench/llamacpp_decode.c and bench/llamacpp_grpo.c:
 * the thread count, llama.cpp's log filter, medians, the benchmark model B's configuration and a
 * llama.cpp context with a reusable batch. Header-only (each driver is one translation unit,
 * compiled by bench/llamacpp_build.sh against llama.cpp's prebuilt CPU library). */
#ifndef MOERL_BENCH_LLAMACPP_COMMON_H
#define MOERL_BENCH_LLAMACPP_COMMON_H

#include "base/common.h"
#include "model/model.h"
#include "bench_util.h"

#include <ggml-backend.h>
#include <llama.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* OMP_NUM_THREADS (moerl; OpenBLAS is the OpenMP build) = llama.cpp's n_threads. */
static inline int n_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* llama.cpp's log callback: errors only. */
static inline void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static inline int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
typedef struct { double med, lo, hi; } stat3;
/* Median (mean of the two middle values for even n), min and max of v[n]; sorts v in place. */
static inline stat3 stats_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    stat3 s = {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[0], v[n - 1]};
    return s;
}

/* The benchmark model B of bench_decode (bench_util.h). */
static inline moe_config config_B(void) { return bench_model_config_B(); }

/* ------------------------------------------------------------------ llama.cpp */

typedef struct {
    struct llama_model *model;
    struct llama_context *ctx;
    int n_seq, n_vocab, own_model;
    struct llama_batch batch;
} llama_side;

/* Load a GGUF into memory (no mmap, as moerl's engine holds its weights), CPU only. */
static inline struct llama_model *llama_load_gguf(const char *gguf) {
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mode = LLAMA_LOAD_MODE_NONE;
    struct llama_model *m = llama_model_load_from_file(gguf, mp);
    if (!m) moerl_fatal("llama.cpp: cannot load '%s'", gguf);
    return m;
}

/* A context on `model` for n_seq sequences and n_ctx cells with a batch of batch_cap tokens, from
 * llama_context_default_params with the same threads as moerl; the caller's `tweak` (may be NULL)
 * edits the parameters first. MOERL_LLAMA_FLASH_ATTN=on|off overrides flash attention (auto). */
static inline void llama_ctx_open(llama_side *L, struct llama_model *model, int n_seq, int n_ctx, int batch_cap,
                                  void (*tweak)(struct llama_context_params *, void *), void *arg) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_seq_max = (uint32_t)n_seq;
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_threads = cp.n_threads_batch = n_threads();
    cp.no_perf = true;
    if (tweak) tweak(&cp, arg);
    const char *fa = getenv("MOERL_LLAMA_FLASH_ATTN"); /* on | off | (unset) auto */
    if (fa) cp.flash_attn_type = !strcmp(fa, "on") ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    L->model = model;
    L->own_model = 0;
    L->ctx = llama_init_from_model(model, cp);
    if (!L->ctx) moerl_fatal("llama.cpp: cannot create a context (n_seq %d, n_ctx %u)", n_seq, cp.n_ctx);
    L->n_seq = n_seq;
    L->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    L->batch = llama_batch_init(batch_cap, 0, 1);
}

static inline void llama_close(llama_side *L) {
    llama_batch_free(L->batch);
    llama_free(L->ctx);
    if (L->own_model) llama_model_free(L->model);
}

static inline void batch_add(struct llama_batch *b, int tok, int pos, int seq, int out) {
    const int i = b->n_tokens++;
    b->token[i] = tok;
    b->pos[i] = pos;
    b->n_seq_id[i] = 1;
    b->seq_id[i][0] = seq;
    b->logits[i] = (int8_t)out;
}

static inline void llama_run(llama_side *L) {
    if (llama_decode(L->ctx, L->batch) != 0) moerl_fatal("llama.cpp: llama_decode failed (%d tokens)", L->batch.n_tokens);
}

#endif
