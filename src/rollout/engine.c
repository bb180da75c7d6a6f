/* Rollout engine: continuous batching over a paged KV cache (blocks: kv_blocks.h). See engine.h. */
#include "rollout/engine.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/pool.h"
#include "base/trace.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/safetensors.h"
#include "rollout/kv_blocks.h"

/* Element-wise loops below this size stay on one thread (decode steps: a parallel region would
 * cost more than the loop). */
#define ENGINE_PAR_MIN_ELEMS 65536

struct engine {
    moe_model m;        /* inference model: the engine's own weight buffer */
    engine_config ec;
    int version;
    int L, H, V, nh, nkv, hd, E, K;
    int Vl; /* rows of the LM head this engine holds: V, or ⌈V/P⌉ under rollout TP (V: the whole vocabulary) */
    float *k_cache, *v_cache; /* [L][n_blocks][block_size][nkv·hd] */
    /* paged KV: the block manager; slot s's block table tables[s·max_blocks ..] holding n_tbl[s] blocks,
     * of which the first reg_upto[s] are registered and filled in the prefix cache; age[s]: admission
     * order (preemption takes the newest) */
    kv_blocks kb;
    int bs, max_blocks;
    int *tables, *n_tbl, *reg_upto, *tokbuf, *hit;
    int64_t *age, n_admitted;
    int16_t *blk_routes; /* [n_blocks][bs][n_moe·K]: routes of the forward that computed each block row
                            (record_routes with prefix caching), copied to a request served from it */
    /* Group prefill (copy-on-write of a prompt's tail, docs/engine.md "Prefix sharing"): slot s's request is a
     * leader when it is a fresh prompt forwarding its own tail — the positions [c0, P) past its shareable full
     * blocks, c0 = kvb_prefix_blocks(P)·bs — under version grp_ver[s]; grp_state[s]: 0 none, 1 forwarding,
     * 2 ready (it sampled: grp_lg[s] holds its last position's logits, V floats, and grp_blk[s] is the block
     * of its tail rows). grp_hash[s]: its prompt's hash. An entry lives while its leader holds its blocks. */
    unsigned char *grp_state;
    int *grp_ver, *grp_blk;
    uint64_t *grp_hash;
    float **grp_lg;
    /* followers admitted this step, sampled from their leader's (slot cow_src[i]) logits */
    gen_request **cow_req;
    int *cow_src, n_cow;
    gen_request **slots;
    gen_request *wait_head, *wait_tail, *paused_head, *paused_tail;
    int n_waiting, n_paused;
    /* step scratch for up to T = max_num_batched_tokens tokens */
    int *tok, *slot_of, *pos;
    float *x, *ln, *q_raw, *k_raw, *q_rstd, *k_rstd, *q, *k, *v, *att, *mid, *mlp_out;
    mlp_acts mlp;
    float *rope_cos, *rope_sin;
    /* sampling rows */
    int *sample_row;             /* [slots] batch row whose logits a slot samples from */
    gen_request **sample_req;    /* [slots] */
    float *hid, *hid_rstd, *logits, *sample_scratch;
    moe_bf16_weights bf; /* bf16 panels (ec.bf16_weights), else bf.buf == NULL */
    engine_stats st;
    void *ep;             /* expert parallelism over rollout ranks (engine_set_ep: a runtime with the MoE hooks), else NULL */
    void *tp;             /* tensor parallelism (engine_set_tp: a runtime with tp_allreduce_f32), else NULL */
    float *tp_logits;     /* rollout TP: [S][P·Vl], this rank's head columns in place, the others zero, then summed */
    /* routing record (ec.record_routes): moe_of[l] = MoE index of layer l (−1: dense MLP), n_moe of them */
    int moe_of[MOERL_MAX_LAYERS], n_moe;
};

/* Rows up to which a step's o_proj and LM head read the bf16 panels (beyond: the fp32 product
 * on the same bf16-rounded values, as qkv_forward and the experts' larger groups do). */
#define ENGINE_BF16_MAX_ROWS BF16_PANEL_MAX_ROWS

/* Allocate e->bf's panels (once) and lay out the pointers. */
static void bf16_layout(engine *e) {
    const moe_config *c = &e->m.cfg;
    int e_lo;
    /* E: the experts this engine holds (its slice under rollout expert parallelism) */
    const int H = e->H, E = e->E ? moe_config_local_experts(c, &e_lo) : 0, I = c->moe_intermediate_size, qo = e->nh * e->hd, ko = e->nkv * e->hd;
    const size_t sq = gemm_packed_size(qo, H), sk = gemm_packed_size(ko, H), so = gemm_packed_size(H, qo),
                 sgu = E ? gemm_packed_size(2 * I, H) : 0, sd = E ? gemm_packed_size(H, I) : 0;
    size_t total = gemm_packed_size(e->Vl, H);
    for (int l = 0; l < e->L; l++)
        total += sq + 2 * sk + so + (e->m.p.layers[l].router ? (size_t)E * (sgu + sd) : 0);
    uint16_t *q = e->bf.buf = xalloc_aligned(total * sizeof(uint16_t));
    for (int l = 0; l < e->L; l++) {
        e->bf.q[l] = q; q += sq;
        e->bf.k[l] = q; q += sk;
        e->bf.v[l] = q; q += sk;
        e->bf.o[l] = q; q += so;
        if (e->m.p.layers[l].router) {
            e->bf.gate_up[l] = q; q += (size_t)E * sgu;
            e->bf.down[l] = q; q += (size_t)E * sd;
        }
    }
    e->bf.lm_head = q;
}

/* Pack the bf16 panels of every matrix a decode step reads (one matrix per iteration, all threads;
 * a weight load is outside any parallel region): from w16 — bf16 values in the parameter layout —
 * when given, else from the engine's fp32 weights, which must already hold bf16-rounded values. */
static void bf16_pack_all(engine *e, const uint16_t *w16) {
    if (!e->bf.buf) bf16_layout(e);
    const moe_config *c = &e->m.cfg;
    int e_lo;
    const int H = e->H, E = e->E ? moe_config_local_experts(c, &e_lo) : 0, I = c->moe_intermediate_size,
              qo = e->nh * e->hd, ko = e->nkv * e->hd;
    const size_t sgu = E ? gemm_packed_size(2 * I, H) : 0, sd = E ? gemm_packed_size(H, I) : 0;
    const int per_layer = 4 + 2 * E, items = e->L * per_layer + 1;
    const float *base = e->m.params;
#define PACK(dst, w, O, Iw)                                                                              \
    do {                                                                                                 \
        if (w16) gemm_packed16_pack_bf16((uint16_t *)(dst), w16 + ((w) - base), (O), (Iw));              \
        else gemm_packed16_pack((uint16_t *)(dst), (w), (O), (Iw));                                      \
    } while (0)
#pragma omp parallel for schedule(dynamic, 1)
    for (int it = 0; it < items; it++) {
        if (it == items - 1) {
            PACK(e->bf.lm_head, e->m.p.lm_head, e->Vl, H);
            continue;
        }
        const int l = it / per_layer, j = it % per_layer;
        const layer_views *w = &e->m.p.layers[l];
        if (j == 0) PACK(e->bf.q[l], w->q_proj, qo, H);
        else if (j == 1) PACK(e->bf.k[l], w->k_proj, ko, H);
        else if (j == 2) PACK(e->bf.v[l], w->v_proj, ko, H);
        else if (j == 3) PACK(e->bf.o[l], w->o_proj, H, qo);
        else if (w->router) {
            const int x = j - 4, ex = x / 2;
            if (x % 2 == 0) PACK((uint16_t *)e->bf.gate_up[l] + (size_t)ex * sgu, w->experts_gate_up + (size_t)ex * 2 * I * H, 2 * I, H);
            else PACK((uint16_t *)e->bf.down[l] + (size_t)ex * sd, w->experts_down + (size_t)ex * H * I, H, I);
        }
    }
#undef PACK
    e->m.bf16 = &e->bf;
}

/* After a weight load in bf16 mode from fp32 values already in the engine's buffer: round them to
 * bf16 in place, then pack the panels. */
static void bf16_build(engine *e) {
    float *p = e->m.params;
    const size_t n = e->m.n_params;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
    bf16_pack_all(e, NULL);
}

/* The bf16 values of engine_weight_buffer_bf16 (the upper half of the fp32 buffer p[n], as bf16
 * element n onwards) widened in place to p[0..n): value i is read from bytes [2n + 2i, 2n + 2i + 2)
 * and written to bytes [4i, 4i + 4), which overwrites values j ≤ 2i − n + 1 only. A pass over
 * [lo, hi) with hi = (lo + n) / 2 therefore overwrites only values < lo, all read by earlier passes,
 * and reads only its own: each pass runs in parallel, halving what is left (~log2 n passes, the
 * last few values one at a time). */
static void bf16_widen_in_place(float *p, size_t n) {
    const uint16_t *w = (const uint16_t *)(void *)p + n;
    size_t lo = 0;
    while (n - lo > 4096) {
        const size_t hi = (lo + n) / 2;
#pragma omp parallel for schedule(static)
        for (size_t i = lo; i < hi; i++) {
            const uint32_t u = (uint32_t)w[i] << 16;
            memcpy(p + i, &u, 4);
        }
        lo = hi;
    }
    for (size_t i = lo; i < n; i++) { /* ascending: value i is read before anything overwrites it */
        const uint32_t u = (uint32_t)w[i] << 16;
        memcpy(p + i, &u, 4);
    }
}

/* out[N, O] (= or += per accumulate) = x[N, I] · Wᵀ from W's bf16 panels P, output columns split
 * in one contiguous run of 16-wide blocks per thread (one kernel call each, so it keeps several
 * panels in flight); tmp: [N, O] scratch for accumulate. */
static void linear16(float *out, float *tmp, const float *x, const uint16_t *P, int N, int I, int O, int accumulate) {
    float *dst = accumulate ? tmp : out;
    const int units = (O + 15) / 16;
#pragma omp parallel
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        const int u0 = (int)((long)units * t / nt), u1 = (int)((long)units * (t + 1) / nt);
        if (u1 > u0) gemm_packed16_nt(dst + (size_t)u0 * 16, O, x, P, N, I, u0 * 16, MOERL_MIN(O, u1 * 16));
    }
    if (accumulate)
        for (size_t i = 0; i < (size_t)N * O; i++) out[i] += tmp[i];
}

const char *finish_reason_name(finish_reason r) {
    switch (r) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    case FINISH_ABORT: return "abort";
    default: return "none";
    }
}

/* ------------------------------------------------------------------ routing record (docs/rl.md "Routing replay") */

/* The MoE layers in order (a layer with a router; the numbering of model_acts.replay_routes). */
static void routes_layout(engine *e) {
    e->n_moe = 0;
    for (int l = 0; l < e->L; l++) e->moe_of[l] = e->m.p.layers[l].router ? e->n_moe++ : -1;
}

int engine_route_width(const engine *e, int *n_moe_layers, int *k) {
    const int on = e->ec.record_routes && e->n_moe > 0;
    if (n_moe_layers) *n_moe_layers = on ? e->n_moe : 0;
    if (k) *k = on ? e->K : 0;
    return on ? e->n_moe * e->K : 0;
}

/* The route record of a request the engine admits (engine_add): [(prompt_len + sp.max_tokens) × n_moe × K]. */
static void routes_alloc(engine *e, gen_request *r) {
    const int w = engine_route_width(e, NULL, NULL);
    if (!w || r->out_routes) return;
    r->out_routes = xmalloc((size_t)(r->prompt_len + r->sp.max_tokens) * w * sizeof(int16_t));
    r->n_routes = 0;
}

/* After MoE layer l's router (e->mlp.topk_ids [T, K]): the step's tokens that are recorded for the first
 * time (position ≥ the request's n_routes) get their top-k; a re-prefilled token keeps its first route. */
static void routes_record(engine *e, int l, int T) {
    const int mi = e->moe_of[l], K = e->K, w = e->n_moe * K;
    if (mi < 0) return;
    for (int n = 0; n < T; n++) {
        gen_request *r = e->slots[e->slot_of[n]];
        if (!r->out_routes || e->pos[n] < r->n_routes) continue;
        int16_t *dst = r->out_routes + (size_t)e->pos[n] * w + (size_t)mi * K;
        for (int k = 0; k < K; k++) dst[k] = (int16_t)e->mlp.topk_ids[(size_t)n * K + k];
    }
    if (e->blk_routes) /* the block keeps the routes of the forward that computed its rows */
        for (int n = 0; n < T; n++) {
            const int p = e->pos[n], b = e->tables[(size_t)e->slot_of[n] * e->max_blocks + p / e->bs];
            int16_t *dst = e->blk_routes + ((size_t)b * e->bs + p % e->bs) * w + (size_t)mi * K;
            for (int k = 0; k < K; k++) dst[k] = (int16_t)e->mlp.topk_ids[(size_t)n * K + k];
        }
}

/* After the step's forward: every request's n_routes covers the positions it forwarded (they are
 * contiguous from n_cached ≤ n_routes, so the count only grows by the new ones). */
static void routes_advance(engine *e, int T) {
    for (int n = 0; n < T; n++) {
        gen_request *r = e->slots[e->slot_of[n]];
        if (r->out_routes && e->pos[n] == r->n_routes) r->n_routes++;
    }
}

/* Bytes of memory available now (Linux: /proc/meminfo's MemAvailable; else the free pages of
 * sysconf), the base of rollout.gpu_memory_utilization on a CPU. 0 when unknown. */
static int64_t mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        long long kb = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
        fclose(f);
        if (kb >= 0) return (int64_t)kb * 1024;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (int64_t)pages * psz : 0;
}

/* Bytes of one KV block: all layers' K and V rows of block_size positions, fp32. */
static int64_t kv_block_bytes(const engine *e) {
    return 2 * (int64_t)e->L * e->bs * e->nkv * e->hd * (int64_t)sizeof(float);
}

int engine_check_kv_budget(const moe_config *c, int block_size, int64_t kv_cache_bytes, int64_t len, const char *key,
                           const char *what) {
    if (kv_cache_bytes <= 0) return MOERL_OK;
    const int bs = block_size > 0 ? block_size : 16;
    /* kv_block_bytes of an engine of this model */
    const int64_t bb = 2 * (int64_t)c->num_hidden_layers * bs * c->num_key_value_heads * c->head_dim * (int64_t)sizeof(float),
                  have = kv_cache_bytes / bb, need = kvb_seq_blocks(len, bs);
    if (have >= need) return MOERL_OK;
    return moerl_errorf("%s=%lld holds %lld KV blocks of %d tokens (%lld bytes each), and %s (%lld tokens, the last "
                        "never forwarded) needs %lld blocks (%lld bytes): no request that long could ever run; raise %s "
                        "to at least %lld",
                        key, (long long)kv_cache_bytes, (long long)have, bs, (long long)bb, what, (long long)len,
                        (long long)need, (long long)(need * bb), key, (long long)(need * bb));
}

/* The paged KV cache's size (engine_config's block_size, kv_cache_bytes, gpu_memory_utilization):
 * resolves the budget into whole blocks, writes the resolved figures back to e->ec and sets up the
 * block manager and tables. Errors: a negative key, a budget under one block. */
static int kv_setup(engine *e) {
    engine_config *ec = &e->ec;
    if (ec->block_size < 0 || ec->kv_cache_bytes < 0 || !(ec->gpu_memory_utilization >= 0) ||
        ec->gpu_memory_utilization > 1)
        return moerl_errorf("engine: block_size (%d) and kv_cache_bytes (%lld) must be ≥ 0 and gpu_memory_utilization "
                            "(%g) in [0, 1]",
                            ec->block_size, (long long)ec->kv_cache_bytes, ec->gpu_memory_utilization);
    e->bs = ec->block_size ? ec->block_size : 16;
    e->max_blocks = (ec->max_model_len + e->bs - 1) / e->bs;
    const int64_t bb = kv_block_bytes(e);
    int64_t bytes = ec->kv_cache_bytes, n;
    if (!bytes && ec->gpu_memory_utilization > 0) bytes = (int64_t)(ec->gpu_memory_utilization * mem_available_bytes());
    if (bytes) {
        n = bytes / bb;
        if (n < 1)
            return moerl_errorf("engine: a KV budget of %lld bytes holds no block of %d tokens (%lld bytes: %d layers × "
                                "K and V × %d positions × %d floats)",
                                (long long)bytes, e->bs, (long long)bb, e->L, e->bs, e->nkv * e->hd);
        if (n > INT32_MAX / 2) n = INT32_MAX / 2;
        /* running sequences can never hold more than the slot engine's reservation: a larger budget (a large
         * rollout.gpu_memory_utilization on a host with much free memory, or a kv_cache_bytes beyond the run's
         * needs) is capped there rather than committed and zeroed for nothing (the simulated engine allocates no
         * KV and keeps the budget it was given, as moerl simulate plans it) */
        const int64_t cap = (int64_t)ec->max_num_seqs * e->max_blocks;
        if (!ec->simulated && n > cap) n = cap;
    } else {
        n = (int64_t)ec->max_num_seqs * e->max_blocks; /* the slot engine's reservation: nothing is preempted */
    }
    ec->block_size = e->bs;
    ec->kv_cache_bytes = n * bb;
    kvb_init(&e->kb, (int)n, e->bs);
    const size_t S = ec->max_num_seqs;
    e->tables = xmalloc(S * e->max_blocks * sizeof(int));
    e->n_tbl = xcalloc(S, sizeof(int));
    e->reg_upto = xcalloc(S, sizeof(int));
    e->age = xcalloc(S, sizeof(int64_t));
    e->tokbuf = xmalloc((size_t)e->bs * sizeof(int));
    e->grp_state = xcalloc(S, 1);
    e->grp_ver = xcalloc(S, sizeof(int));
    e->grp_blk = xcalloc(S, sizeof(int));
    e->grp_hash = xcalloc(S, sizeof(uint64_t));
    e->grp_lg = xcalloc(S, sizeof(float *));
    e->cow_req = xcalloc(S, sizeof(gen_request *));
    e->cow_src = xcalloc(S, sizeof(int));
    e->hit = xmalloc((size_t)e->max_blocks * sizeof(int));
    e->st.kv_blocks_total = n;
    const int w = engine_route_width(e, NULL, NULL);
    if (w && ec->enable_prefix_caching) e->blk_routes = xmalloc((size_t)n * e->bs * w * sizeof(int16_t));
    if (!ec->simulated) {
        e->k_cache = moerl_buf_alloc((size_t)(n * bb / 2), "kv_cache");
        e->v_cache = moerl_buf_alloc((size_t)(n * bb / 2), "kv_cache");
    }
    return MOERL_OK;
}

engine *engine_create(const moe_config *cfg, engine_config ec) {
    if (ec.max_num_seqs <= 0 || ec.max_model_len <= 1 || ec.max_num_batched_tokens <= 0) {
        moerl_errorf("engine: max_num_seqs (%d), max_model_len (%d) and max_num_batched_tokens (%d) must be "
                     "positive (max_model_len ≥ 2)",
                     ec.max_num_seqs, ec.max_model_len, ec.max_num_batched_tokens);
        return NULL;
    }
    if (ec.record_routes && ec.simulated) {
        moerl_errorf("engine: record_routes (rollout.enable_rollout_routing_replay) with a simulated engine: no model "
                     "runs, so there are no routes to record");
        return NULL;
    }
    if (ec.record_routes && cfg->num_experts > INT16_MAX) {
        moerl_errorf("engine: record_routes stores expert ids as int16, the model has %d experts (at most %d)",
                     cfg->num_experts, INT16_MAX);
        return NULL;
    }
    if (ec.max_num_batched_tokens < ec.max_num_seqs) ec.max_num_batched_tokens = ec.max_num_seqs;
    engine *e = xcalloc(1, sizeof *e);
    if (model_init_inference(&e->m, cfg) != MOERL_OK) {
        free(e);
        return NULL;
    }
    e->ec = ec;
    if (ec.bf16_weights) e->m.cfg.exec.no_pack = 1; /* the bf16 panels replace the fp32 expert panels */
    if (cfg->exec.batch_invariant) e->m.cfg.exec.no_pack = 1; /* the batch-invariant kernels read W itself */
    const moe_config *c = &e->m.cfg;
    e->L = c->num_hidden_layers; e->H = c->hidden_size; e->Vl = c->vocab_size;
    e->V = c->exec.tp_size > 1 ? c->exec.tp_vocab : c->vocab_size; /* rollout TP: tokens index the whole vocabulary */
    e->nh = c->num_attention_heads; e->nkv = c->num_key_value_heads; e->hd = c->head_dim;
    e->E = c->num_experts; e->K = c->num_experts_per_tok;
    routes_layout(e);
    const size_t S = ec.max_num_seqs, Lm = ec.max_model_len, T = ec.max_num_batched_tokens;
    const size_t kvrow = (size_t)e->nkv * e->hd, H = e->H, qrow = (size_t)e->nh * e->hd;
    if (kv_setup(e) != MOERL_OK) {
        model_free(&e->m);
        free(e);
        return NULL;
    }
    e->slots = xcalloc(S, sizeof(gen_request *));
    e->tok = xmalloc(T * sizeof(int));
    e->slot_of = xmalloc(T * sizeof(int));
    e->pos = xmalloc(T * sizeof(int));
#define FA(n) ((float *)xalloc_aligned((size_t)(n) * sizeof(float)))
    e->x = FA(T * H); e->ln = FA(T * H); e->mid = FA(T * H); e->mlp_out = FA(T * H);
    e->q_raw = FA(T * qrow); e->q = FA(T * qrow); e->att = FA(T * qrow); e->q_rstd = FA(T * e->nh);
    e->k_raw = FA(T * kvrow); e->k = FA(T * kvrow); e->v = FA(T * kvrow); e->k_rstd = FA(T * e->nkv);
    mlp_acts_alloc(&e->mlp, &e->m, (int)T);
    e->rope_cos = FA(Lm * e->hd / 2); e->rope_sin = FA(Lm * e->hd / 2);
    rope_tables(e->rope_cos, e->rope_sin, (int)Lm, e->hd, c->rope_theta);
    e->sample_row = xmalloc(S * sizeof(int));
    e->sample_req = xmalloc(S * sizeof(gen_request *));
    e->hid = FA(S * H); e->hid_rstd = FA(S); e->logits = FA(S * e->V); e->sample_scratch = FA(2 * (size_t)e->V);
    if (c->exec.tp_size > 1) e->tp_logits = FA(S * (size_t)c->exec.tp_size * e->Vl);
#undef FA
    return e;
}

void engine_free(engine *e) {
    if (!e) return;
    model_free(&e->m);
    moerl_buf_free(e->k_cache);
    moerl_buf_free(e->v_cache);
    e->k_cache = e->v_cache = NULL;
    void *bufs[] = {e->k_cache, e->v_cache, e->slots, e->tok, e->slot_of, e->pos, e->x, e->ln, e->mid, e->mlp_out,
                    e->q_raw, e->q, e->att, e->q_rstd, e->k_raw, e->k, e->v, e->k_rstd, e->rope_cos, e->rope_sin,
                    e->sample_row, e->sample_req, e->hid, e->hid_rstd, e->logits, e->sample_scratch, e->tp_logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    mlp_acts_free(&e->mlp);
    kvb_free(&e->kb);
    for (int s = 0; e->grp_lg && s < e->ec.max_num_seqs; s++) free(e->grp_lg[s]);
    void *kv[] = {e->tables, e->n_tbl, e->reg_upto, e->age, e->tokbuf, e->hit, e->blk_routes, e->grp_state, e->grp_ver,
                  e->grp_blk, e->grp_hash, e->grp_lg, e->cow_req, e->cow_src};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) free(kv[i]);
    free(e->bf.buf);
    free(e);
}

static void group_drop(engine *e, int s);

/* A weight load: KV computed under the old weights is never reused (the prefix cache forgets every
 * block, a running sequence's blocks computed so far never register, and no group's tail is copied). */
static void kv_weights_changed(engine *e) {
    kvb_clear(&e->kb);
    for (int s = 0; s < e->ec.max_num_seqs; s++) {
        if (e->slots[s]) e->reg_upto[s] = (e->slots[s]->n_cached + e->bs - 1) / e->bs;
        group_drop(e, s); /* a leader's tail rows and logits were computed under the old weights */
    }
}

int engine_load_weights(engine *e, const float *params, size_t n_params, int version) {
    if (n_params != e->m.n_params)
        return moerl_errorf("engine_load_weights: %zu floats given, the model layout has %zu", n_params,
                            e->m.n_params);
    if (e->ec.bf16_weights) { /* copy and round in one pass */
        float *p = e->m.params;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n_params; i++) p[i] = bf16_to_f32(f32_to_bf16(params[i]));
        model_pack_experts(&e->m); /* no_pack in this mode: the bf16 panels replace the fp32 ones */
        bf16_pack_all(e, NULL);
    } else {
        memcpy(e->m.params, params, n_params * sizeof(float));
        model_pack_experts(&e->m); /* the NZ switch: expert weights in the decode kernel's panel layout (or none) */
    }
    kv_weights_changed(e);
    e->version = version;
    return MOERL_OK;
}

int engine_version(const engine *e) { return e->version; }
float *engine_weight_buffer(engine *e) { return e->m.params; }
void engine_set_version(engine *e, int version) {
    model_pack_experts(&e->m); /* the buffer was filled in place: derived layouts follow, as in engine_load_weights */
    if (e->ec.bf16_weights) bf16_build(e);
    kv_weights_changed(e);
    e->version = version;
}

uint16_t *engine_weight_buffer_bf16(engine *e) {
    if (!e->ec.bf16_weights) {
        moerl_errorf("engine_weight_buffer_bf16: this engine computes from fp32 weights (engine_config.bf16_weights "
                     "= 0, rollout.dtype fp32); it takes fp32 weights only");
        return NULL;
    }
    return (uint16_t *)(void *)e->m.params + e->m.n_params;
}

int engine_set_version_bf16(engine *e, int version) {
    if (!e->ec.bf16_weights)
        return moerl_errorf("engine_set_version_bf16: this engine computes from fp32 weights (engine_config."
                            "bf16_weights = 0, rollout.dtype fp32)");
    const uint16_t *w = (const uint16_t *)(void *)e->m.params + e->m.n_params;
    model_pack_experts(&e->m); /* no_pack in this mode (a no-op), as in engine_load_weights */
    bf16_pack_all(e, w); /* the panels straight from the bf16 values, before widening overwrites them */
    bf16_widen_in_place(e->m.params, e->m.n_params);
    kv_weights_changed(e);
    e->version = version;
    return MOERL_OK;
}

int engine_load_weights_bf16(engine *e, const uint16_t *w, size_t n_params, int version) {
    if (n_params != e->m.n_params)
        return moerl_errorf("engine_load_weights_bf16: %zu values given, the model layout has %zu", n_params,
                            e->m.n_params);
    uint16_t *dst = engine_weight_buffer_bf16(e);
    if (!dst) return MOERL_ERR;
    memmove(dst, w, n_params * sizeof(uint16_t));
    return engine_set_version_bf16(e, version);
}

const moe_model *engine_model(const engine *e) { return &e->m; }

int engine_set_ep(engine *e, void *ep) {
    const model_hooks *h = model_par_hooks(ep);
    if (ep && !(h && h->moe_forward && h->moe_idle))
        return moerl_errorf("engine_set_ep: the runtime has no MoE dispatch hooks (model_hooks.moe_forward / moe_idle)");
    e->ep = ep;
    return MOERL_OK;
}

int engine_set_tp(engine *e, void *tp) {
    const model_hooks *h = model_par_hooks(tp);
    const moe_config *c = &e->m.cfg;
    if (!tp) {
        if (c->exec.tp_size > 1)
            return moerl_errorf("engine_set_tp: the engine holds a tensor-parallel slice (rank %d of %d): it needs its "
                                "group's all-reduce", c->exec.tp_rank, c->exec.tp_size);
        e->tp = NULL;
        return MOERL_OK;
    }
    if (!(h && h->tp_allreduce_f32))
        return moerl_errorf("engine_set_tp: the runtime has no tensor-parallel all-reduce (model_hooks.tp_allreduce_f32)");
    if (c->exec.tp_size <= 1)
        return moerl_errorf("engine_set_tp: the engine was created from a whole config (exec.tp_size %d): create it "
                            "from tp_config_apply's slice", c->exec.tp_size);
    if (!c->exec.tp_experts && c->num_experts > 0)
        return moerl_errorf("engine_set_tp: the rollout engine splits every expert over the group (expert-TP); the "
                            "config keeps the experts whole");
    if (c->exec.batch_invariant || e->ep)
        return moerl_errorf("engine_set_tp: tensor parallelism does not combine with %s in the rollout engine",
                            e->ep ? "expert parallelism (rollout.expert_parallel_size)"
                                  : "batch-invariant kernels (rollout.batch_invariant)");
    e->tp = tp;
    return MOERL_OK;
}

int engine_idle_step(engine *e) {
    if (!e->ep) return MOERL_OK;
    if (!e->ec.simulated) model_par_hooks(e->ep)->moe_idle(e->ep, &e->m, 0); /* the MoE layers' exchanges, no rows of its own */
    return MOERL_OK;
}

engine_config engine_get_config(const engine *e) { return e->ec; }
engine_stats engine_get_stats(const engine *e) { return e->st; }
void engine_kv_usage(const engine *e, int64_t *blocks_held, int64_t *tokens_cached) {
    int64_t t = 0;
    for (int s = 0; s < e->ec.max_num_seqs; s++)
        if (e->slots[s]) t += e->slots[s]->n_cached;
    if (blocks_held) *blocks_held = e->kb.n_blocks - e->kb.n_free;
    if (tokens_cached) *tokens_cached = t;
}

static void list_push_back(gen_request **head, gen_request **tail, gen_request *r) {
    r->next = NULL;
    if (*tail) (*tail)->next = r;
    else *head = r;
    *tail = r;
}

/* The sampling parameters' checks shared by engine_add and engine_continue. */
static int check_sampling(const gen_request *r) {
    const sampling_params *sp = &r->sp;
    if (!(sp->temperature >= 0) || !isfinite(sp->temperature))
        return moerl_errorf("request %lld: temperature must be a finite number ≥ 0, got %g", (long long)r->id,
                            (double)sp->temperature);
    if (!(sp->top_p > 0 && sp->top_p <= 1))
        return moerl_errorf("request %lld: top_p must be in (0, 1], got %g", (long long)r->id, (double)sp->top_p);
    if (sp->top_k < 0) return moerl_errorf("request %lld: top_k must be ≥ 0, got %d", (long long)r->id, sp->top_k);
    if (sp->max_tokens <= 0)
        return moerl_errorf("request %lld: max_tokens must be positive, got %d", (long long)r->id, sp->max_tokens);
    if (sp->n_stop < 0 || sp->n_stop > 8)
        return moerl_errorf("request %lld: at most 8 stop tokens, got %d", (long long)r->id, sp->n_stop);
    if (sp->n_forced < 0 || (sp->n_forced > 0 && !sp->forced))
        return moerl_errorf("request %lld: %d forced tokens without an array", (long long)r->id, sp->n_forced);
    return MOERL_OK;
}

static void enqueue(engine *e, gen_request *r) {
    r->finish = FINISH_NONE;
    r->slot = -1;
    r->n_cached = 0;
    list_push_back(&e->wait_head, &e->wait_tail, r);
    e->n_waiting++;
}

int engine_add(engine *e, gen_request *r) {
    const sampling_params *sp = &r->sp;
    if (r->prompt_len <= 0) return moerl_errorf("request %lld: empty prompt", (long long)r->id);
    if (r->prompt_len >= e->ec.max_model_len)
        return moerl_errorf("request %lld: prompt of %d tokens does not fit max_model_len %d (needs room for at "
                            "least one new token)",
                            (long long)r->id, r->prompt_len, e->ec.max_model_len);
    for (int i = 0; i < r->prompt_len; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->V)
            return moerl_errorf("request %lld: prompt token %d at index %d outside the vocabulary [0,%d)",
                                (long long)r->id, r->prompt[i], i, e->V);
    if (check_sampling(r) != MOERL_OK) return MOERL_ERR;
    /* KV positions the request can ever hold: prompt ⊕ output but the last sampled token (never forwarded) */
    const int64_t need =
        kvb_seq_blocks(MOERL_MIN((int64_t)r->prompt_len + sp->max_tokens, (int64_t)e->ec.max_model_len), e->bs);
    if (need > e->kb.n_blocks)
        return moerl_errorf("request %lld: prompt %d + max_tokens %d needs %lld KV blocks of %d tokens (%lld bytes), "
                            "the whole KV budget is %d blocks (%lld bytes, rollout.kv_cache_bytes / "
                            "gpu_memory_utilization): it could never run",
                            (long long)r->id, r->prompt_len, sp->max_tokens, (long long)need, e->bs,
                            (long long)(need * kv_block_bytes(e)), e->kb.n_blocks, (long long)e->ec.kv_cache_bytes);
    for (int i = 0; i < sp->n_forced; i++)
        if (sp->forced[i] < 0 || sp->forced[i] >= e->V)
            return moerl_errorf("request %lld: forced token %d at index %d outside the vocabulary [0,%d)",
                                (long long)r->id, sp->forced[i], i, e->V);
    if (!r->out_tokens) {
        r->out_tokens = xmalloc(sp->max_tokens * sizeof(int));
        r->out_logprobs = xmalloc(sp->max_tokens * sizeof(float));
        r->out_versions = xmalloc(sp->max_tokens * sizeof(int));
        r->out_mask = xmalloc(sp->max_tokens);
        r->out_cap = sp->max_tokens;
        r->n_out = 0;
        r->n_sampled = 0;
        r->n_interruptions = 0;
        r->n_preemptions = 0;
        r->turn = 0;
        rng_seed(&r->rng, sp->seed);
    }
    routes_alloc(e, r);
    enqueue(e, r);
    return MOERL_OK;
}

uint64_t engine_turn_seed(uint64_t seed, int turn) { return seed + (uint64_t)turn * 0x9E3779B97F4A7C15ULL; }

int engine_continue(engine *e, gen_request *r, const int *ids, int n) {
    if (r->finish != FINISH_STOP || r->slot != -1 || !r->out_tokens)
        return moerl_errorf("engine_continue: request %lld is not a turn finished at a stop token (finish %s)",
                            (long long)r->id, finish_reason_name(r->finish));
    if (n < 0 || (n > 0 && !ids))
        return moerl_errorf("engine_continue: request %lld: %d inserted ids", (long long)r->id, n);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= e->V)
            return moerl_errorf("engine_continue: request %lld: inserted token %d at index %d outside the vocabulary "
                                "[0,%d)", (long long)r->id, ids[i], i, e->V);
    if (check_sampling(r) != MOERL_OK) return MOERL_ERR;
    if (r->out_cap && r->sp.max_tokens != r->out_cap)
        return moerl_errorf("engine_continue: request %lld: sp.max_tokens changed from %d to %d; it bounds all turns "
                            "together and cannot change between them", (long long)r->id, r->out_cap, r->sp.max_tokens);
    if (r->n_out + n >= r->sp.max_tokens || r->prompt_len + r->n_out + n >= e->ec.max_model_len) {
        r->finish = FINISH_LENGTH; /* no room for a new token after the inserted ones */
        return 0;
    }
    if (!r->out_mask) { /* outputs the caller allocated: every token so far was sampled */
        r->out_mask = xmalloc(r->sp.max_tokens);
        memset(r->out_mask, 1, r->n_out);
    }
    const int ver = r->n_out > 0 ? r->out_versions[r->n_out - 1] : e->version;
    for (int i = 0; i < n; i++) {
        const int t = r->n_out + i;
        r->out_tokens[t] = ids[i];
        r->out_logprobs[t] = 0;
        r->out_versions[t] = ver;
        r->out_mask[t] = 0;
        if (r->out_logits) memset(r->out_logits + (size_t)t * e->V, 0, e->V * sizeof(float));
    }
    r->n_out += n;
    r->turn++;
    rng_seed(&r->rng, engine_turn_seed(r->sp.seed, r->turn));
    enqueue(e, r);
    return 1;
}

void gen_request_free_outputs(gen_request *r) {
    free(r->out_tokens);
    free(r->out_logprobs);
    free(r->out_versions);
    free(r->out_mask);
    free(r->out_routes);
    r->out_routes = NULL;
    r->n_routes = 0;
    r->out_mask = NULL;
    r->out_cap = 0;
    r->out_tokens = NULL;
    r->out_logprobs = NULL;
    r->out_versions = NULL;
}

int engine_num_running(const engine *e) {
    int n = 0;
    for (int s = 0; s < e->ec.max_num_seqs; s++) n += e->slots[s] != NULL;
    return n;
}

int engine_num_unfinished(const engine *e) { return engine_num_running(e) + e->n_waiting + e->n_paused; }

static int seq_token(const gen_request *r, int i) { return i < r->prompt_len ? r->prompt[i] : r->out_tokens[i - r->prompt_len]; }
static int seq_len(const gen_request *r) { return r->prompt_len + r->n_out; }
static int at_length_limit(const engine *e, const gen_request *r) {
    return r->n_out >= r->sp.max_tokens || seq_len(r) >= e->ec.max_model_len;
}

/* ---- Rollout tensor parallelism (engine_set_tp; Megatron's split, vLLM's tensor_parallel_size): this rank
 * holds a slice of every matrix (tp_config_apply's layout) and every rank of the group runs the same batch. */

/* x[n] summed over the TP group (every rank gets the same sums: the runtime's all-reduce). */
static void tp_sum(engine *e, float *x, size_t n) { model_par_hooks(e->tp)->tp_allreduce_f32(e->tp, x, n); }

/* Vocab-parallel embedding: the rows of this rank's tokens [rank·Vl, rank·Vl + Vl), zero for the others,
 * summed over the group. */
static void tp_embed(engine *e, int T) {
    const int H = e->H, v0 = e->m.cfg.exec.tp_rank * e->Vl;
    for (int n = 0; n < T; n++) {
        const int t = e->tok[n] - v0;
        float *x = e->x + (size_t)n * H;
        if (t >= 0 && t < e->Vl) memcpy(x, e->m.p.embed_tokens + (size_t)t * H, H * sizeof(float));
        else memset(x, 0, H * sizeof(float));
    }
    tp_sum(e, e->x, (size_t)T * H);
}

/* Row-parallel o_proj: this rank's heads' partial product (into mlp_out, free until the MLP), summed over the
 * group, then added to the residual x. */
static void tp_o_proj(engine *e, int l, int T) {
    const int H = e->H, In = e->nh * e->hd;
    if (e->bf.buf && T <= ENGINE_BF16_MAX_ROWS) linear16(e->mlp_out, NULL, e->att, e->bf.o[l], T, In, H, 0);
    else linear_forward(e->mlp_out, e->att, e->m.p.layers[l].o_proj, T, In, H, 0);
    const size_t TH = (size_t)T * H;
    tp_sum(e, e->mlp_out, TH);
    float *x = e->x;
    const float *p = e->mlp_out;
#pragma omp parallel for simd schedule(static) if (TH >= ENGINE_PAR_MIN_ELEMS)
    for (size_t i = 0; i < TH; i++) x[i] += p[i];
}

/* The full logits on every rank: each rank's Vl columns lg[n_rows, Vl] (in e->logits) placed at [rank·Vl, ..) of a zeroed
 * [n_rows, P·Vl] row and summed over the group (an all-gather through the all-reduce: x + 0 is exact), then
 * the first V columns (the padding of the last slice dropped) → e->logits [n_rows, V]. Every rank then
 * samples the same token from the same logits with the request's own RNG. */
static void tp_gather_logits(engine *e, const float *lg, int n_rows) {
    const int P = e->m.cfg.exec.tp_size, Vl = e->Vl, W = P * Vl, q = e->m.cfg.exec.tp_rank;
    float *g = e->tp_logits;
    memset(g, 0, (size_t)n_rows * W * sizeof(float));
    for (int r = 0; r < n_rows; r++) memcpy(g + (size_t)r * W + (size_t)q * Vl, lg + (size_t)r * Vl, Vl * sizeof(float));
    tp_sum(e, g, (size_t)n_rows * W);
    for (int r = 0; r < n_rows; r++) memcpy(e->logits + (size_t)r * e->V, g + (size_t)r * W, e->V * sizeof(float));
}

/* Forward T tokens (tok, slot_of, pos) through all layers, writing K/V into the cache; then
 * the final norm + LM head for the n_rows rows in sample_row → e->logits. */
static void forward_tokens(engine *e, int T, int n_rows) {
    const moe_model *m = &e->m;
    const moe_config *c = &m->cfg;
    const int H = e->H, nh = e->nh, nkv = e->nkv, hd = e->hd, bs = e->bs, mb = e->max_blocks;
    const size_t kvrow = (size_t)nkv * hd, layer = (size_t)e->kb.n_blocks * bs * kvrow;
    const float scale = 1.0f / sqrtf((float)hd);
    if (e->tp) tp_embed(e, T);
    else for (int n = 0; n < T; n++) memcpy(e->x + (size_t)n * H, m->p.embed_tokens + (size_t)e->tok[n] * H, H * sizeof(float));
    for (int l = 0; l < e->L; l++) {
        const layer_views *w = &m->p.layers[l];
        float *kc = e->k_cache + (size_t)l * layer, *vc = e->v_cache + (size_t)l * layer;
        rmsnorm_forward(e->ln, e->mid /* rstd scratch */, e->x, w->input_layernorm, T, H, c->rms_norm_eps);
        qkv_forward(m, l, e->ln, e->q_raw, e->k_raw, e->q_rstd, e->k_rstd, e->q, e->k, e->v, e->pos, e->rope_cos,
                    e->rope_sin, T);
        for (int n = 0; n < T; n++) {
            const int p = e->pos[n];
            const size_t off = ((size_t)e->tables[(size_t)e->slot_of[n] * mb + p / bs] * bs + p % bs) * kvrow;
            memcpy(kc + off, e->k + (size_t)n * kvrow, kvrow * sizeof(float));
            memcpy(vc + off, e->v + (size_t)n * kvrow, kvrow * sizeof(float));
        }
        const double ta = trace_begin();
        if (c->exec.batch_invariant) /* the trainer's key order (batch_invariant.c) */
            attention_kvcache_paged_forward_bi(e->att, e->q, kc, vc, e->tables, mb, e->slot_of, e->pos, T, nh, nkv, hd,
                                               bs, scale);
        else attention_kvcache_paged_forward(e->att, e->q, kc, vc, e->tables, mb, e->slot_of, e->pos, T, nh, nkv, hd, bs,
                                             scale);
        trace_end("attention (KV cache)", "engine", ta);
        if (e->tp) tp_o_proj(e, l, T);
        else if (c->exec.batch_invariant) linear_forward_bi(e->x, e->att, w->o_proj, T, nh * hd, H, 1);
        else if (e->bf.buf && T <= ENGINE_BF16_MAX_ROWS) linear16(e->x, e->mlp_out, e->att, e->bf.o[l], T, nh * hd, H, 1);
        else linear_forward(e->x, e->att, w->o_proj, T, nh * hd, H, 1); /* x ← x + o_proj(att): the residual */
        rmsnorm_forward(e->ln, e->mid, e->x, w->post_attention_layernorm, T, H, c->rms_norm_eps);
        mlp_forward_par(m, l, e->ln, e->mlp_out, &e->mlp, T, e->ep); /* ep NULL: mlp_forward */
        if (e->tp) tp_sum(e, e->mlp_out, (size_t)T * H); /* row-parallel down projections (dense and experts) */
        if (e->ec.record_routes) routes_record(e, l, T);
        const size_t TH = (size_t)T * H;
        float *x = e->x;
        const float *mo = e->mlp_out;
#pragma omp parallel for simd schedule(static) if (TH >= ENGINE_PAR_MIN_ELEMS)
        for (size_t i = 0; i < TH; i++) x[i] += mo[i];
    }
    for (int r = 0; r < n_rows; r++)
        memcpy(e->hid + (size_t)r * H, e->x + (size_t)e->sample_row[r] * H, H * sizeof(float));
    rmsnorm_forward(e->hid, e->hid_rstd, e->hid, m->p.norm, n_rows, H, c->rms_norm_eps);
    float *lg = e->logits; /* rollout TP: this rank's Vl columns [n_rows, Vl] first, then the gathered rows */
    if (c->exec.batch_invariant) linear_forward_bi(lg, e->hid, m->p.lm_head, n_rows, H, e->Vl, 0);
    else if (e->bf.buf && n_rows <= ENGINE_BF16_MAX_ROWS) linear16(lg, NULL, e->hid, e->bf.lm_head, n_rows, H, e->Vl, 0);
    else linear_forward(lg, e->hid, m->p.lm_head, n_rows, H, e->Vl, 0);
    if (e->tp) tp_gather_logits(e, lg, n_rows);
}

static int is_stop(const engine *e, const gen_request *r, int tok) {
    if (!r->sp.ignore_eos && e->m.cfg.eos_token_id >= 0 && tok == e->m.cfg.eos_token_id) return 1;
    if (!r->sp.ignore_eos && tok_is_stop(tok)) return 1; /* every eos id of the checkpoint's tokenizer */
    for (int i = 0; i < r->sp.n_stop; i++)
        if (tok == r->sp.stop_tokens[i]) return 1;
    return 0;
}

/* ------------------------------------------------------------------ paged KV: block tables, prefix cache, preemption */

static int *tbl_of(engine *e, int s) { return e->tables + (size_t)s * e->max_blocks; }

/* The token ids of block i of r's sequence (prompt ⊕ output) → e->tokbuf. */
static void block_tokens(engine *e, const gen_request *r, int i) {
    for (int j = 0; j < e->bs; j++) e->tokbuf[j] = seq_token(r, i * e->bs + j);
}

/* Prefix cache: register slot s's blocks whose tokens are all known (prompt blocks when allocated,
 * so that a request with the same prefix waits for them; output blocks once full), marking them
 * filled once their rows are computed (n_cached). A block whose parent is not registered, or whose
 * key another block already holds, ends the chain. reg_upto advances over the filled ones. */
static void register_blocks(engine *e, int s) {
    if (!e->ec.enable_prefix_caching) return;
    const gen_request *r = e->slots[s];
    const int *t = tbl_of(e, s), bs = e->bs;
    int adv = 1;
    /* simulated (no model: every sampled token is 0): only prompt blocks, as output blocks of zeros would
     * match each other where real outputs differ */
    const int known = e->ec.simulated ? r->prompt_len : seq_len(r);
    for (int i = e->reg_upto[s]; i < e->n_tbl[s] && (i + 1) * bs <= known; i++) {
        const int b = t[i], parent = i ? t[i - 1] : -1, filled = r->n_cached >= (i + 1) * bs;
        if (e->kb.reg[b]) {
            if (filled) e->kb.filled[b] = 1;
        } else {
            if (parent >= 0 && !e->kb.reg[parent]) break;
            block_tokens(e, r, i);
            if (kvb_lookup(&e->kb, parent, e->version, e->tokbuf) >= 0) break;
            kvb_register(&e->kb, b, parent, e->version, e->tokbuf, filled);
        }
        adv = adv && filled;
        if (adv) e->reg_upto[s] = i + 1;
    }
}

/* Grow slot s's block table to cover positions < upto, as far as free blocks allow; returns the
 * positions covered (≤ upto). */
static int ensure_blocks(engine *e, int s, int upto) {
    int *t = tbl_of(e, s);
    const int need = (upto + e->bs - 1) / e->bs;
    int grew = 0;
    while (e->n_tbl[s] < need) {
        const int b = kvb_alloc(&e->kb);
        if (b < 0) break;
        t[e->n_tbl[s]++] = b;
        grew = 1;
    }
    const int64_t held = e->kb.n_blocks - e->kb.n_free;
    if (held > e->st.kv_blocks_peak) e->st.kv_blocks_peak = held;
    if (grew) register_blocks(e, s);
    return MOERL_MIN(upto, e->n_tbl[s] * e->bs);
}

/* Give slot s's blocks back, the last first (so a sequence's tail is evicted before its head). */
static void release_blocks(engine *e, int s) {
    group_drop(e, s); /* its tail block may be reused from now on: no follower copies it any more */
    const int *t = tbl_of(e, s);
    for (int i = e->n_tbl[s] - 1; i >= 0; i--) kvb_release(&e->kb, t[i]);
    e->n_tbl[s] = e->reg_upto[s] = 0;
}

/* vLLM's recompute-mode preemption: slot s gives its blocks back and its request goes to the front of
 * the waiting queue with everything it produced (tokens, logprobs, versions, mask, routes, RNG state);
 * it is re-prefilled at its readmission. */
static void preempt(engine *e, int s) {
    gen_request *r = e->slots[s];
    release_blocks(e, s);
    e->slots[s] = NULL;
    r->slot = -1;
    r->n_cached = 0;
    r->n_preemptions++;
    e->st.preemptions++;
    r->next = e->wait_head;
    e->wait_head = r;
    if (!e->wait_tail) e->wait_tail = r;
    e->n_waiting++;
}

/* The running sequence admitted last (−1: none). */
static int newest_running(const engine *e) {
    int v = -1;
    for (int s = 0; s < e->ec.max_num_seqs; s++)
        if (e->slots[s] && (v < 0 || e->age[s] > e->age[v])) v = s;
    return v;
}

/* Step 1: every running sequence that decodes gets the block of its next position, oldest first;
 * when none is free the newest running sequence is preempted (itself, if it is the newest). */
static void reserve_decodes(engine *e) {
    const int S = e->ec.max_num_seqs;
    for (;;) { /* the oldest running decoder not yet covered */
        int s = -1;
        for (int x = 0; x < S; x++) {
            const gen_request *r = e->slots[x];
            if (r && seq_len(r) - r->n_cached == 1 && e->n_tbl[x] * e->bs <= r->n_cached && (s < 0 || e->age[x] < e->age[s]))
                s = x;
        }
        if (s < 0) return;
        const int want = e->slots[s]->n_cached + 1;
        while (e->slots[s] && ensure_blocks(e, s, want) < want) preempt(e, newest_running(e));
    }
}

/* Prefix-cache hits of r: its leading full blocks found in the cache (never the block of its last
 * token, which must be forwarded to sample from) → e->hit; returns their count, or −1 when one of
 * them is still being computed by a running sequence (r then waits for it: one prefill per group). */
static int prefix_match(engine *e, const gen_request *r) {
    if (!e->ec.enable_prefix_caching) return 0;
    int n = 0;
    for (const int nb = (int)kvb_prefix_blocks(seq_len(r), e->bs); n < nb; n++) {
        block_tokens(e, r, n);
        const int b = kvb_lookup(&e->kb, n ? e->hit[n - 1] : -1, e->version, e->tokbuf);
        if (b < 0) break;
        if (!e->kb.filled[b]) return -1;
        e->hit[n] = b;
    }
    return n;
}

/* ---- Group prefill: one forward of a prompt's tail per group, copied on write (docs/engine.md "Prefix sharing").
 * The full blocks of a prompt are shared through the prefix cache; its tail — the positions [c0, P) of the block
 * of its last token, c0 = kvb_prefix_blocks(P)·bs, 1 to bs tokens — is forwarded by one request of the group (its
 * leader). Every other fresh request with the same prompt under the same version (a follower) forwards nothing:
 * it gets a block of its own holding a copy of the leader's tail rows (K/V of every layer, and their routes),
 * and draws its first token from the leader's last-position logits, kept for the group. A block-aligned prompt's
 * tail is its last full block, copied the same way (not shared read-only): one path, and a follower holds
 * exactly the blocks a sample that forwarded its tail would, so moerl plan's block count stays exact. */

/* FNV-1a over the prompt's ids: the cheap first test before comparing two prompts. */
static uint64_t prompt_hash(const gen_request *r) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (int i = 0; i < r->prompt_len; i++) h = (h ^ (uint32_t)r->prompt[i]) * 0x100000001B3ULL;
    return h;
}

/* Slot s leads no group any more (its blocks are given back, or the weights changed): its logits are freed.
 * Followers that copied already keep their own rows; later ones forward the tail themselves. */
static void group_drop(engine *e, int s) {
    e->grp_state[s] = 0;
    free(e->grp_lg[s]);
    e->grp_lg[s] = NULL;
}

/* A fresh request (no output yet) whose prefix-cache hits are every full block before its tail (nh of them)
 * can follow a leader. Returns the slot of a ready leader with the same prompt and version, −2 when the only
 * such leaders are still forwarding their tail (r then waits, as for a block being computed), −1 when none. */
static int group_find(engine *e, const gen_request *r, int nh, uint64_t h) {
    if (!e->ec.enable_prefix_caching || r->n_out > 0 || nh != kvb_prefix_blocks(r->prompt_len, e->bs)) return -1;
    int found = -1;
    for (int q = 0; q < e->ec.max_num_seqs; q++) {
        const gen_request *l = e->slots[q];
        if (!e->grp_state[q] || e->grp_ver[q] != e->version || e->grp_hash[q] != h || l->prompt_len != r->prompt_len ||
            memcmp(l->prompt, r->prompt, (size_t)r->prompt_len * sizeof(int)))
            continue;
        if (e->grp_state[q] == 2) return q;
        found = -2;
    }
    return found;
}

/* Slot s's request, just admitted to forward its own tail, leads a group when it is a fresh prompt. */
static void group_lead(engine *e, int s, uint64_t h) {
    const gen_request *r = e->slots[s];
    if (!e->ec.enable_prefix_caching || r->n_out > 0) return;
    e->grp_state[s] = 1;
    e->grp_ver[s] = e->version;
    e->grp_hash[s] = h;
}

/* Before r samples from lg[V] (its logits row this step): a leader sampling its first token keeps a copy of lg
 * and the block of its tail rows; its group is ready. */
static void group_ready(engine *e, const gen_request *r, const float *lg) {
    const int s = r->slot;
    if (e->grp_state[s] != 1 || r->n_out > 0) return;
    if (!e->ec.simulated) {
        e->grp_lg[s] = xmalloc((size_t)e->V * sizeof(float));
        memcpy(e->grp_lg[s], lg, (size_t)e->V * sizeof(float));
    }
    e->grp_blk[s] = tbl_of(e, s)[kvb_prefix_blocks(r->prompt_len, e->bs)];
    e->grp_state[s] = 2;
}

/* Admission of follower r into slot s (its nh full blocks already in its table) behind the leader in slot q:
 * a block of its own for the tail, the leader's tail rows copied into it (every layer's K and V; the routes of
 * those positions, into the block's record and r's), the whole prompt cached, and r listed to sample its
 * first token from the leader's logits this step. The caller checked that one block is free. */
static void group_follow(engine *e, int s, gen_request *r, int q, int nh) {
    const int bs = e->bs, c0 = nh * bs, n = r->prompt_len - c0, src = e->grp_blk[q], dst = kvb_alloc(&e->kb);
    MOERL_ASSERT(dst >= 0);
    const int64_t held = e->kb.n_blocks - e->kb.n_free;
    if (held > e->st.kv_blocks_peak) e->st.kv_blocks_peak = held;
    tbl_of(e, s)[nh] = dst;
    e->n_tbl[s] = nh + 1;
    if (e->k_cache) {
        const size_t kvrow = (size_t)e->nkv * e->hd, layer = (size_t)e->kb.n_blocks * bs * kvrow;
        for (int l = 0; l < e->L; l++) {
            const size_t so = l * layer + (size_t)src * bs * kvrow, d = l * layer + (size_t)dst * bs * kvrow;
            memcpy(e->k_cache + d, e->k_cache + so, (size_t)n * kvrow * sizeof(float));
            memcpy(e->v_cache + d, e->v_cache + so, (size_t)n * kvrow * sizeof(float));
        }
    }
    const int w = engine_route_width(e, NULL, NULL);
    if (w && e->blk_routes) {
        memcpy(e->blk_routes + (size_t)dst * bs * w, e->blk_routes + (size_t)src * bs * w, (size_t)n * w * sizeof(int16_t));
        if (r->out_routes) { /* a position re-prefilled keeps its first route */
            for (int p = MOERL_MAX(r->n_routes, c0); p < r->prompt_len; p++)
                memcpy(r->out_routes + (size_t)p * w, e->blk_routes + ((size_t)dst * bs + p - c0) * w, (size_t)w * sizeof(int16_t));
            r->n_routes = MOERL_MAX(r->n_routes, r->prompt_len);
        }
    }
    r->n_cached = r->prompt_len;
    e->st.prefix_hit_tokens += n;
    register_blocks(e, s);
    e->cow_req[e->n_cow] = r;
    e->cow_src[e->n_cow++] = q;
}

/* Step 2: the running sequences' tokens of this step — every decoder 1 (its block reserved in step 1),
 * then the running prefills in slot order, each as far as the token budget and the free blocks allow —
 * with blocks for exactly those tokens, none for a later chunk (vLLM's scheduler: running requests
 * first, blocks only for the tokens scheduled now). fed[s]: slot s's tokens; returns their sum. */
static int schedule_running(engine *e, int *fed) {
    const int S = e->ec.max_num_seqs, budget = e->ec.max_num_batched_tokens;
    int T = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int s = 0; s < S; s++) {
            const gen_request *r = e->slots[s];
            if (!r || fed[s]) continue;
            const int need = seq_len(r) - r->n_cached;
            if ((pass == 0) != (need == 1)) continue;
            const int take = MOERL_MIN(need, budget - T);
            if (take <= 0) continue;
            const int got = ensure_blocks(e, s, r->n_cached + take) - r->n_cached;
            if (got <= 0) continue;
            fed[s] = got;
            T += got;
        }
    return T;
}

/* Step 3: admit waiting requests into free slots, FIFO, with what is left of the token budget (T
 * tokens scheduled so far): each gets its next chunk, as much of prompt ⊕ output past its prefix-cache
 * hits as the budget leaves, and blocks for exactly that chunk; the first whose chunk the free blocks do
 * not cover, or that waits for a block being computed (or its group's tail), stops admission, as does a spent
 * budget. A request served from cached blocks gets their routes (record_routes); a follower of its group's
 * leader (group_find) takes one block, for its copy of the tail, and no token of the budget. Returns the tokens
 * scheduled. */
static int admit(engine *e, int *fed, int T) {
    const int S = e->ec.max_num_seqs, bs = e->bs, budget = e->ec.max_num_batched_tokens;
    for (int s = 0; s < S && e->wait_head && T < budget; s++) {
        if (e->slots[s]) continue;
        gen_request *r = e->wait_head;
        const int nh = prefix_match(e, r);
        if (nh < 0) return T;
        const uint64_t h = e->ec.enable_prefix_caching && r->n_out == 0 ? prompt_hash(r) : 0;
        const int lead = group_find(e, r, nh, h); /* ≥ 0: r follows it, forwarding nothing */
        if (lead == -2) return T;                 /* its group's tail is being forwarded: wait for it */
        const int c0 = nh * bs, chunk = lead >= 0 ? 0 : MOERL_MIN(seq_len(r) - c0, budget - T);
        int avail = e->kb.n_free;
        for (int i = 0; i < nh; i++) avail -= e->kb.ref[e->hit[i]] == 0;
        if (avail < (lead >= 0 ? 1 : (c0 + chunk + bs - 1) / bs - nh)) return T;
        e->wait_head = r->next;
        if (!e->wait_head) e->wait_tail = NULL;
        e->n_waiting--;
        r->next = NULL;
        r->slot = s;
        r->n_cached = c0;
        e->slots[s] = r;
        e->age[s] = e->n_admitted++;
        for (int i = 0; i < nh; i++) {
            kvb_ref(&e->kb, e->hit[i]);
            tbl_of(e, s)[i] = e->hit[i];
        }
        e->n_tbl[s] = e->reg_upto[s] = nh;
        e->st.prefix_hit_tokens += c0;
        const int w = engine_route_width(e, NULL, NULL);
        if (r->out_routes && e->blk_routes && r->n_routes < c0) {
            for (int p = r->n_routes; p < c0; p++)
                memcpy(r->out_routes + (size_t)p * w, e->blk_routes + ((size_t)e->hit[p / bs] * bs + p % bs) * w,
                       (size_t)w * sizeof(int16_t));
            r->n_routes = c0;
        }
        if (lead >= 0) {
            group_follow(e, s, r, lead, nh);
            continue;
        }
        ensure_blocks(e, s, c0 + chunk); /* its prompt blocks registered now: a request behind it with the same
                                            prefix waits for them rather than computing them again */
        fed[s] = chunk;
        T += chunk;
        group_lead(e, s, h);
    }
    return T;
}

/* Step 5 for one request: its next token from lg[V] (its logits row; unused in simulated mode) with its own
 * parameters and RNG, the behaviour logprob, version and mask appended; a request that stops or reaches its
 * length gives its blocks back at once and goes to done[] (room for done_cap). Returns 1 when it finished. */
static int sample_one(engine *e, gen_request *r, const float *lg, gen_request **done, int done_cap) {
    float lp = 0;
    int tok = e->ec.simulated ? 0 : sample_token(lg, e->V, &r->sp, &r->rng, &lp, e->sample_scratch);
    if (r->n_sampled < r->sp.n_forced) { /* forced decoding: the draw is replaced, its logprob the model's */
        tok = r->sp.forced[r->n_sampled];
        lp = e->ec.simulated ? 0.0f : token_logprob(lg, e->V, r->sp.temperature, tok);
    }
    if (e->m.cfg.exec.batch_invariant && !e->ec.simulated) /* the trainer's log-softmax (model_logprobs) */
        logprob_forward(&lp, NULL, NULL, lg, &tok, 1, e->V, r->sp.temperature > 0 ? r->sp.temperature : 1.0f);
    r->n_sampled++;
    if (r->out_logits && !e->ec.simulated) memcpy(r->out_logits + (size_t)r->n_out * e->V, lg, e->V * sizeof(float));
    r->out_tokens[r->n_out] = tok;
    r->out_logprobs[r->n_out] = lp;
    r->out_versions[r->n_out] = e->version;
    if (r->out_mask) r->out_mask[r->n_out] = 1;
    r->n_out++;
    e->st.generated_tokens++;
    if (is_stop(e, r, tok)) r->finish = FINISH_STOP;
    else if (at_length_limit(e, r)) r->finish = FINISH_LENGTH;
    if (r->finish == FINISH_NONE) return 0;
    release_blocks(e, r->slot);
    e->slots[r->slot] = NULL;
    r->slot = -1;
    MOERL_ASSERT(done_cap > 0);
    done[0] = r;
    return 1;
}

int engine_step(engine *e, gen_request **done, int done_cap) {
    const int S = e->ec.max_num_seqs;
    int n_done = 0;
    /* 1. blocks for the running decoders (preempting the newest when none is free); 2. the running
     * sequences' tokens; 3. admission with the rest of the token budget */
    int fed[S > 0 ? S : 1];
    memset(fed, 0, sizeof fed);
    const int64_t preempted = e->st.preemptions;
    reserve_decodes(e);
    int T = schedule_running(e, fed);
    if (e->st.preemptions == preempted) T = admit(e, fed, T); /* not in a step that preempted (it would thrash) */
    /* 4. the batch: decode tokens first, then prefill chunks, in slot order */
    int n_rows = 0;
    T = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int s = 0; s < S; s++) {
            gen_request *r = e->slots[s];
            if (!r || !fed[s]) continue;
            const int need = seq_len(r) - r->n_cached, take = fed[s];
            if ((pass == 0) != (need == 1)) continue;
            for (int i = 0; i < take; i++) {
                e->tok[T] = seq_token(r, r->n_cached + i);
                e->slot_of[T] = s;
                e->pos[T] = r->n_cached + i;
                e->st.kv_reads += r->n_cached + i + 1;
                T++;
            }
            if (take == need) {
                e->sample_row[n_rows] = T - 1;
                e->sample_req[n_rows] = r;
                n_rows++;
            }
            /* decode: the one newest sampled token; every prompt position (a prompt's last token alone
             * in its chunk too: pass 0 orders it, the counter does not make it a decode) and re-prefilled
             * outputs are prefill, so prefill + prefix hits cover every prompt token */
            if (pass == 0 && r->n_out > 0) e->st.decode_tokens += take;
            else e->st.prefill_tokens += take;
        }
    }
    if (T == 0) { /* nothing to feed; under EP the group still expects this step's exchanges */
        if (!e->n_cow) { /* (followers admitted this step only sample) */
            const int v = newest_running(e);
            if (v >= 0) preempt(e, v); /* running prefills hold every block: the newest makes room */
        }
        if (e->ep) engine_idle_step(e);
        if (!e->n_cow) return 0;
    }
    double t0 = moerl_now();
    if (T > 0) {
        const double tr = trace_begin();
        if (!e->ec.simulated) forward_tokens(e, T, n_rows);
        if (e->ec.record_routes) routes_advance(e, T);
        trace_end(n_rows == T ? "engine decode forward" : "engine prefill forward", "engine", tr);
    }
    double t1 = moerl_now();
    const double ts = trace_begin();
    for (int s = 0; s < S; s++)
        if (e->slots[s]) {
            e->slots[s]->n_cached += fed[s];
            if (fed[s]) register_blocks(e, s);
        }
    /* 5. sample: the followers admitted this step from their leaders' logits (before a leader finishing in this
     * step frees them), then every row of the forward */
    for (int i = 0; i < e->n_cow; i++)
        n_done += sample_one(e, e->cow_req[i], e->grp_lg[e->cow_src[i]], done + n_done, done_cap - n_done);
    e->n_cow = 0;
    for (int i = 0; i < n_rows; i++) {
        gen_request *r = e->sample_req[i];
        const float *lg = e->logits + (size_t)i * e->V;
        group_ready(e, r, lg);
        n_done += sample_one(e, r, lg, done + n_done, done_cap - n_done);
    }
    trace_end("engine sample", "engine", ts);
    e->st.steps++;
    e->st.forward_s += t1 - t0;
    e->st.sample_s += moerl_now() - t1;
    return n_done;
}

int engine_pause(engine *e, gen_request **out, int out_cap) {
    int n = 0;
    for (int s = 0; s < e->ec.max_num_seqs; s++) {
        gen_request *r = e->slots[s];
        if (!r) continue;
        release_blocks(e, s);
        e->slots[s] = NULL;
        r->slot = -1;
        r->n_cached = 0; /* the KV cache is stale after a weight swap: re-prefill on resume */
        r->n_interruptions++;
        list_push_back(&e->paused_head, &e->paused_tail, r);
        e->n_paused++;
        if (out) {
            MOERL_ASSERT(n < out_cap);
            out[n] = r;
        }
        n++;
    }
    return n;
}

int engine_resume(engine *e, gen_request **done, int done_cap) {
    int n_done = 0;
    gen_request *front = NULL, *front_tail = NULL;
    for (gen_request *r = e->paused_head, *nx; r; r = nx) {
        nx = r->next;
        if (at_length_limit(e, r)) {
            r->finish = FINISH_LENGTH;
            MOERL_ASSERT(n_done < done_cap);
            done[n_done++] = r;
            continue;
        }
        list_push_back(&front, &front_tail, r);
        e->n_waiting++;
    }
    e->paused_head = e->paused_tail = NULL;
    e->n_paused = 0;
    if (front) {
        front_tail->next = e->wait_head;
        e->wait_head = front;
        if (!e->wait_tail) e->wait_tail = front_tail;
    }
    return n_done;
}

int engine_abort(engine *e, gen_request **out, int out_cap) {
    int n = 0;
    engine_pause(e, NULL, 0);
    gen_request *lists[2] = {e->paused_head, e->wait_head};
    for (int i = 0; i < 2; i++)
        for (gen_request *r = lists[i], *nx; r; r = nx) {
            nx = r->next;
            r->next = NULL;
            r->finish = FINISH_ABORT;
            if (out) {
                MOERL_ASSERT(n < out_cap);
                out[n] = r;
            }
            n++;
        }
    e->paused_head = e->paused_tail = e->wait_head = e->wait_tail = NULL;
    e->n_paused = e->n_waiting = 0;
    return n;
}
