/* Qwen3-MoE forward/backward over a packed batch. See forward.h.
 *
 * Threading. The driver runs each stretch of work between two attention calls as ONE OpenMP
 * parallel region (a "team") instead of one region per kernel call: every thread owns a fixed,
 * contiguous share of the N tokens (team_share) and runs the row-local ops of the stretch on
 * its own rows back to back (RMSNorm, q/k/v/o and router projections, q/k norm, RoPE, top-k,
 * unpermute, residual adds, the LM head), so consecutive ops on the same rows need no barrier.
 * Barriers remain only where data crosses tokens: after routing (the permutation is global),
 * after each grouped GEMM (a token gathers rows computed by other threads) and before each weight
 * gradient (a sum over all tokens). The experts run through the grouped GEMM kernels' team forms
 * (grouped_gemm_forward_team/backward_team, src/kernels/cpu/grouped_gemm.c — the kernels
 * bench/ measures), whose work items are dynamically scheduled over the team, with the permute
 * gather fused into the gate_up items and SwiGLU (and its backward) as their epilogue; see
 * "MoE layer (team)" below for the pipeline and its ablation switches. Weight gradients dW += doutᵀ·x are
 * split by rows of dW (no reduction, so they do not depend on the thread count); RMSNorm weight
 * gradients are summed per thread and then reduced in thread order (deterministic for a given
 * thread count). The kernels called inside a team see an active parallel region and run on the
 * calling thread (their own OpenMP loops become one-thread regions; OpenMP builds of OpenBLAS
 * run single-threaded there; pthread builds are switched to one thread for the duration).
 * Attention stays a kernel call between teams (its own OpenMP loop over sequence × head ×
 * query-block tasks).
 * Why: a training step of the benchmark model (bench/bench_train_step.c) made ~50 kernel calls
 * per layer, each its own parallel region (plus OpenBLAS's own per GEMM); now a layer is four
 * regions (two teams, two attention calls) with ~8 barriers. Measured on the 2-core dev machine
 * (bench_train_step, 2 threads, old and new driver interleaved, two sessions of 4–5 runs each):
 * fastest run 166–170 → 160–166 ms/step (3%), median run 185–257 → 171–199 ms/step (8–23%: other
 * processes came and went, and the old driver lost more to them since each join can wait a
 * scheduler slice); 1 thread unchanged (~307 ms/step).
 */
#include "model/forward.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I would rename the parameters and
 * variables named I (kernels.h and below). */
#ifdef I
#undef I
#endif

#include "base/common.h"
#include "base/pool.h"
#include "base/trace.h"
#include "kernels/kernels.h"
#include "model/vocab_parallel.h"
/* Model-parallel layer events (forward.h's model_hooks: FSDP gathers parameters / reduces gradients here). */
#define PAR_EVENT(a, phase, l) \
    do { \
        const model_hooks *h_ = model_par_hooks((a)->par); \
        if (h_ && h_->layer_event) h_->layer_event((a)->par, (phase), (l)); \
    } while (0)

/* Tensor parallelism (moe_exec_opts.tp_size > 1, src/parallel/tp.c): par when its table has the TP
 * all-reduce, else NULL. tp_sum_team: x[n] summed over the TP group, called by every thread of a team
 * (barrier, thread 0's all-reduce, barrier); a NULL tp is a no-op. */
static void *tp_par(void *par) {
    const model_hooks *h = model_par_hooks(par);
    return h && h->tp_allreduce_f32 ? par : NULL;
}
static void tp_sum_team(void *tp, float *x, size_t n) {
    if (!tp) return;
#pragma omp barrier
#pragma omp master
    model_par_hooks(tp)->tp_allreduce_f32(tp, x, n);
#pragma omp barrier
}
/* The TP runtime when the experts are split over it (expert-TP: their outputs are partial sums), else NULL. */
static void *tp_expert_par(const moe_model *m, void *par) { return m->cfg.exec.tp_experts ? tp_par(par) : NULL; }
/* The first vocabulary row this rank holds (vocab-parallel embedding and LM head; 0 without TP). */
static int tp_vocab_lo(const moe_config *c) { return c->exec.tp_size > 1 ? c->exec.tp_rank * c->vocab_size : 0; }

/* Megatron sequence parallelism (model_hooks.tp_reduce_scatter / tp_all_gather; src/parallel/tp_sp.c): par when
 * its table has them, else NULL. Under it the residual stream and the RMSNorms of a TP rank cover its rows
 * [s0, s1) of the micro-batch (model_sp_rows); every token-parallel matrix product still covers all N rows. */
static void *tp_sp_par(void *par) {
    const model_hooks *h = model_par_hooks(par);
    return h && h->tp_reduce_scatter ? par : NULL;
}
/* Team collectives of SP (every thread calls; barrier, thread 0's hook, barrier; a NULL sp is a no-op):
 * x[N,H]'s rows gathered from their owners (gather 1) / partial rows reduce-scattered to this rank's rows (0). */
static void sp_collective_team(void *sp, float *x, int N, int H, int gather) {
    if (!sp) return;
#pragma omp barrier
#pragma omp master
    {
        const model_hooks *h = model_par_hooks(sp);
        (gather ? h->tp_all_gather : h->tp_reduce_scatter)(sp, x, N, H);
    }
#pragma omp barrier
}
#define sp_gather_team(sp, x, N, H) sp_collective_team((sp), (x), (N), (H), 1)
#define sp_scatter_team(sp, x, N, H) sp_collective_team((sp), (x), (N), (H), 0)
/* x[N,H]'s partial rows summed over the TP group tp (NULL: nothing to sum): all-reduced, or under SP
 * reduce-scattered to this rank's rows (Megatron's row-parallel output with sequence_parallel). */
static void tp_sum_rows_team(void *tp, float *x, int N, int H) {
    if (tp && tp_sp_par(tp)) sp_scatter_team(tp, x, N, H);
    else tp_sum_team(tp, x, (size_t)N * H);
}
/* A team barrier under SP (a NULL sp: none): a thread's slice rows were written as other threads' token rows. */
static void sp_sync_team(void *sp) {
    if (!sp) return;
#pragma omp barrier
}
/* ------------------------------------------------------------------ activation arena */

typedef struct {
    char *base;
    size_t used;
} arena_t;

static void *carve(arena_t *ar, size_t bytes) {
    size_t off = (ar->used + 63) & ~(size_t)63;
    ar->used = off + ((bytes + 63) & ~(size_t)63);
    return ar->base ? ar->base + off : NULL;
}
#define CF(n) ((float *)carve(ar, (size_t)(n) * sizeof(float)))
#define CI(n) ((int *)carve(ar, (size_t)(n) * sizeof(int)))

/* Whether a buffer of recompute class cls is kept across the forward (else it lives in the one
 * shared scratch that every layer's recomputed buffers alias): class 0 always (the layer input, the
 * routes used and the per-expert counts read after the forward), class 1 under selective recompute
 * (the attention block), class 2 never under recompute (the MLP/MoE sub-layer). */
static int rc_kept(int recompute, int cls) {
    return recompute == MODEL_RECOMPUTE_NONE || cls == 0 || (cls == 1 && recompute == MODEL_RECOMPUTE_SELECTIVE);
}

/* Carve decoder layer l's buffers for N tokens, the residual stream's and the norms' per-row buffers for Ns
 * (model_acts.sp_rows; N without Megatron SP): pass −1 all of them (no recompute), pass 0 only the kept ones,
 * pass 1 only the recomputed ones (into the shared scratch). */
static void layer_carve(const moe_config *c, layer_acts *L, int l, size_t N, size_t Ns, arena_t *ar, int pass) {
    const size_t H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim,
                 E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
                 Id = c->intermediate_size, M = N * (E > 0 ? K : 0);
    const int rc = c->exec.recompute;
#define LF(ptr, cls, n) \
    if (pass < 0 || pass == !rc_kept(rc, cls)) (ptr) = CF(n)
#define LI(ptr, cls, n) \
    if (pass < 0 || pass == !rc_kept(rc, cls)) (ptr) = CI(n)
    LF(L->resid_in, 0, Ns * H);
    LF(L->ln1, 1, N * H);
    LF(L->ln1_rstd, 1, Ns);
    LF(L->q_raw, 1, N * nh * hd);
    LF(L->k_raw, 1, N * nkv * hd);
    LF(L->q_rstd, 1, N * nh);
    LF(L->k_rstd, 1, N * nkv);
    LF(L->q, 1, N * nh * hd);
    LF(L->k, 1, N * nkv * hd);
    LF(L->v, 1, N * nkv * hd);
    LF(L->att, 1, N * nh * hd);
    LF(L->lse, 1, N * nh);
    LF(L->resid_mid, 1, Ns * H);
    LF(L->ln2, 2, N * H);
    LF(L->ln2_rstd, 2, Ns);
    mlp_acts *s = &L->mlp;
    if (moe_config_layer_is_moe(c, l)) {
        LF(s->router_logits, 2, N * E);
        LF(s->probs, 2, N * E);
        LI(s->topk_ids, 0, N * K);
        LI(s->row_idx, 2, N * K);
        LF(s->topk_w, 2, N * K);
        LI(s->sorted_row, 2, M);
        LI(s->expanded_pos, 2, M);
        LI(s->tokens_per_expert, 0, E);
        LI(s->offsets, 2, E + 1);
        LF(s->permuted, 2, M * H);
        LF(s->gate_up, 2, M * 2 * I);
        LF(s->act, 2, M * I);
        LF(s->y, 2, M * H);
        if (c->exec.per_expert_weights) {
            LF(s->w_gu, 2, E * 2 * I * H);
            LF(s->w_d, 2, E * H * I);
        }
    } else {
        LF(s->gate_up, 2, N * 2 * Id);
        LF(s->act, 2, N * Id);
    }
#undef LF
#undef LI
}

/* Rows of the residual stream's and the norms' per-row buffers for max_tokens tokens (model_acts.sp_rows): under
 * Megatron SP a TP rank's ⌈max_tokens/tp⌉, else 0 (all max_tokens rows). */
static int sp_layout_rows(const moe_config *c, int max_tokens) {
    return c->exec.tp_sp && c->exec.tp_size > 1 ? (max_tokens + c->exec.tp_size - 1) / c->exec.tp_size : 0;
}

static void layout(const moe_model *m, model_acts *a, arena_t *ar, int Nmax) {
    const moe_config *c = &m->cfg;
    a->sp_rows = sp_layout_rows(c, Nmax);
    const size_t Ns = a->sp_rows ? (size_t)a->sp_rows : (size_t)Nmax;
    const size_t N = (size_t)Nmax, H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads,
                 hd = c->head_dim, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
                 Id = c->intermediate_size, V = c->vocab_size;
    const size_t M = N * (E > 0 ? K : 0);
    const int lo = a->layer_lo, hi = a->layer_hi ? a->layer_hi : c->num_hidden_layers; /* pipeline stage */
    const int head = hi == c->num_hidden_layers;
    a->cu_seqlens = CI(N + 1);
    a->pos = CI(N);
    a->tokens_in = CI(N);
    a->rope_cos = CF((size_t)a->rope_max_pos * hd / 2);
    a->rope_sin = CF((size_t)a->rope_max_pos * hd / 2);
    size_t gu_max = 0, act_max = 0;
    /* separate_permute's weighted expert outputs (forward) and scattered gradients (backward):
     * never live across layers, so one buffer serves them all */
    float *yw = c->exec.separate_permute ? CF(M * H) : NULL;
    for (int l = lo; l < hi; l++) {
        memset(&a->layers[l].mlp, 0, sizeof a->layers[l].mlp);
        layer_carve(c, &a->layers[l], l, N, Ns, ar, c->exec.recompute ? 0 : -1);
        if (moe_config_layer_is_moe(c, l)) {
            a->layers[l].mlp.yw = yw;
            gu_max = MOERL_MAX(gu_max, M * 2 * I);
            act_max = MOERL_MAX(act_max, M * I);
        } else {
            gu_max = MOERL_MAX(gu_max, N * 2 * Id);
            act_max = MOERL_MAX(act_max, N * Id);
        }
    }
    if (c->exec.recompute) { /* one scratch for the recomputed buffers, every layer's aliasing its start */
        const size_t s0 = ar->used;
        size_t s1 = s0;
        for (int l = lo; l < hi; l++) {
            ar->used = s0;
            layer_carve(c, &a->layers[l], l, N, Ns, ar, 1);
            s1 = MOERL_MAX(s1, ar->used);
        }
        ar->used = s1;
    }
    a->resid_out = CF(Ns * H);
    a->lnf = CF(N * H);
    a->lnf_rstd = CF(Ns);
    a->logits = head ? CF(N * V) : NULL;
    a->logp = CF(N);
    a->entropy = CF(N);
    a->lse_head = CF(N);
    a->aux_counts = CF(E ? E : 1);
    a->aux_psum = CF(E ? E : 1);
    a->route_native = CI(E ? N * K : 1);
    a->d_resid = CF(N * H);
    a->d_tmp = CF(N * H);
    a->d_tmp2 = CF(N * H);
    a->d_q = CF(N * nh * hd);
    a->d_k = CF(N * nkv * hd);
    a->d_v = CF(N * nkv * hd);
    a->d_att = CF(N * nh * hd);
    a->d_logits = head ? CF(N * V) : NULL;
    a->d_permuted = CF(M * H);
    a->d_y = CF(M * H);
    a->d_gate_up = CF(gu_max);
    a->d_act = CF(act_max);
    a->d_topk_w = CF(N * K + 1);
    a->d_router_logits = CF(N * E + 1);
    a->d_probs = CF(N * E + 1);
    if (c->exec.per_expert_weights && E > 0) {
        a->dw_gu = CF(E * 2 * I * H);
        a->dw_d = CF(E * H * I);
    }
}

size_t model_acts_bytes(const moe_model *m, int max_tokens) {
    model_acts tmp;
    memset(&tmp, 0, sizeof tmp);
    int mp = m->cfg.max_position_embeddings > 32768 ? 32768 : m->cfg.max_position_embeddings;
    tmp.rope_max_pos = MOERL_MAX(max_tokens, mp);
    arena_t ar = {NULL, 0};
    layout(m, &tmp, &ar, max_tokens);
    return ar.used;
}

int model_acts_init(model_acts *a, const moe_model *m, int max_tokens) {
    return model_acts_init_range(a, m, max_tokens, 0, m->cfg.num_hidden_layers);
}

static int acts_init(model_acts *a, const moe_model *m, int max_tokens, int max_positions, int lo, int hi) {
    if (max_tokens <= 0) return moerl_errorf("model_acts_init: max_tokens must be positive, got %d", max_tokens);
    if (lo < 0 || hi <= lo || hi > m->cfg.num_hidden_layers)
        return moerl_errorf("model_acts_init_range: layers [%d, %d) is not a range of the model's %d layer%s", lo,
                            hi, m->cfg.num_hidden_layers, moerl_plural(m->cfg.num_hidden_layers));
    memset(a, 0, sizeof *a);
    a->layer_lo = lo;
    a->layer_hi = hi;
    a->max_tokens = max_tokens;
    int mp = m->cfg.max_position_embeddings > 32768 ? 32768 : m->cfg.max_position_embeddings;
    a->rope_max_pos = MOERL_MAX(MOERL_MAX(max_tokens, max_positions), mp);
    arena_t ar = {NULL, 0};
    layout(m, a, &ar, max_tokens);
    ar.base = moerl_buf_alloc(ar.used, "model_acts"); /* MOERL_ALLOC: malloc | pool | jemalloc */
    a->arena = ar.base;
    a->arena_bytes = ar.used;
    ar.used = 0;
    layout(m, a, &ar, max_tokens);
    rope_tables(a->rope_cos, a->rope_sin, a->rope_max_pos, m->cfg.head_dim, m->cfg.rope_theta);
    return MOERL_OK;
}

int model_acts_init_range(model_acts *a, const moe_model *m, int max_tokens, int lo, int hi) {
    return acts_init(a, m, max_tokens, max_tokens, lo, hi);
}

int model_acts_init_rows(model_acts *a, const moe_model *m, int rows, int max_positions) {
    return acts_init(a, m, rows, max_positions, 0, m->cfg.num_hidden_layers);
}

void model_acts_free(model_acts *a) {
    moerl_buf_free(a->arena);
    memset(a, 0, sizeof *a);
}

void mlp_acts_alloc(mlp_acts *s, const moe_model *m, int T) {
    const moe_config *c = &m->cfg;
    const size_t E = c->num_experts, K = c->num_experts_per_tok, M = (size_t)T * (E ? K : 0), H = c->hidden_size,
                 I = c->moe_intermediate_size, Id = c->intermediate_size;
#define FA(n) ((float *)xalloc_aligned(((size_t)(n) + 1) * sizeof(float)))
#define IA(n) ((int *)xalloc_aligned(((size_t)(n) + 1) * sizeof(int)))
    memset(s, 0, sizeof *s);
    s->router_logits = FA(T * E); s->probs = FA(T * E); s->topk_w = FA(T * K);
    s->topk_ids = IA(T * K); s->row_idx = IA(T * K);
    s->sorted_row = IA(M); s->expanded_pos = IA(M);
    s->tokens_per_expert = IA(E); s->offsets = IA(E + 1);
    s->permuted = FA(M * H); s->y = FA(M * H);
    s->gate_up = FA(MOERL_MAX(M * 2 * I, (size_t)T * 2 * Id));
    s->act = FA(MOERL_MAX(M * I, (size_t)T * Id));
    if (c->exec.separate_permute) s->yw = FA(M * H);
    if (c->exec.per_expert_weights && E) {
        s->w_gu = FA(E * 2 * I * H);
        s->w_d = FA(E * H * I);
    }
#undef FA
#undef IA
}

void mlp_acts_free(mlp_acts *s) {
    void *b[] = {s->router_logits, s->probs, s->topk_w, s->topk_ids, s->row_idx, s->sorted_row, s->expanded_pos,
                 s->tokens_per_expert, s->offsets, s->permuted, s->y, s->gate_up, s->act, s->yw, s->w_gu, s->w_d};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(b[i]);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------------ teams */

/* Threads for a driver team over N tokens: all OpenMP threads (1 inside an enclosing parallel
 * region), at most one per token, and few enough that the per-thread RMSNorm weight-gradient
 * partials (H + 2·hd floats each, see norm_partials) fit in the [N,H] scratch d_tmp2. */
static int team_size(const moe_model *m, int N) {
#ifdef _OPENMP
    if (omp_get_level() > 0) return 1; /* inside any region, active or not: never nest */
    const long H = m->cfg.hidden_size, hd = m->cfg.head_dim;
    const long cap = (long)N * H / (H + 2 * hd);
    return (int)MOERL_MAX(1L, MOERL_MIN((long)omp_get_max_threads(), cap));
#else
    (void)m;
    (void)N;
    return 1;
#endif
}

static int team_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int team_threads(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* The calling thread's contiguous share [i0, i1) of n items (the whole range outside a team).
 * Every phase of a team uses this same split of the tokens, so a thread's rows written by one
 * op are read by the next op of the same thread without a barrier. */
static void team_share(int n, int *i0, int *i1) {
    const long t = team_thread(), nt = team_threads();
    *i0 = (int)(n * t / nt);
    *i1 = (int)(n * (t + 1) / nt);
}

/* The rows of the residual stream and the RMSNorms this thread computes: its token rows [r0, r1), or under
 * Megatron sequence parallelism its share of this rank's slice of the a->N tokens (model_sp_rows). */
static void resid_rows(const moe_model *m, const model_acts *a, int r0, int r1, int *q0, int *q1) {
    *q0 = r0, *q1 = r1;
    if (!tp_sp_par(a->par)) return;
    int s0, s1;
    model_sp_rows(a->N, m->cfg.exec.tp_size, m->cfg.exec.tp_rank, &s0, &s1);
    team_share(s1 - s0, q0, q1);
    *q0 += s0, *q1 += s0;
}

/* The token row that row 0 of the residual stream's and the norms' per-row buffers holds (model_acts.sp_rows):
 * this rank's first row s0 under Megatron SP (token q is their row q − s0), else 0 (they hold every row). */
static int resid_row0(const moe_model *m, const model_acts *a) {
    if (!a->sp_rows) return 0;
    int s0, s1;
    model_sp_rows(a->N, m->cfg.exec.tp_size, m->cfg.exec.tp_rank, &s0, &s1);
    return s0;
}

/* Where a row-parallel output's partial sums of all N rows are formed before tp_sum_rows_team sums them: under
 * Megatron SP d_tmp2 (the backward's scratch, free in the forward), whose rank rows resid_add_rows then moves into
 * the rank-row buffer dst; else dst itself (summed in place). */
static float *row_sum_buf(model_acts *a, float *dst) { return a->sp_rows ? a->d_tmp2 : dst; }

/* After tp_sum_rows_team: this thread's residual rows (resid_rows) of dst = sum + add (add NULL: sum alone), with
 * sum[N,H] indexed by token and dst, add as the rank-row buffers (resid_row0). Without SP sum is dst (in place). */
static void resid_add_rows(const moe_model *m, const model_acts *a, float *dst, const float *sum, const float *add,
                           int r0, int r1) {
    const int H = m->cfg.hidden_size, lo = resid_row0(m, a);
    int q0, q1;
    resid_rows(m, a, r0, r1, &q0, &q1);
    if (q1 <= q0) return;
    const size_t nH = (size_t)(q1 - q0) * H;
    float *d = dst + (size_t)(q0 - lo) * H;
    const float *f = sum + (size_t)q0 * H;
    if (!add) {
        if (d != f) memcpy(d, f, nH * sizeof(float));
        return;
    }
    const float *r = add + (size_t)(q0 - lo) * H;
#pragma omp simd
    for (size_t i = 0; i < nH; i++) d[i] = f[i] + r[i];
}

/* OpenBLAS must be single-threaded inside a team. OpenMP builds (openblas_get_parallel() == 2)
 * are so by themselves inside a parallel region (and there openblas_set_num_threads would
 * shrink the OpenMP team itself); pthread builds are set to one thread and restored after. */
static int blas_team_begin(int nthr) {
    if (nthr <= 1 || openblas_get_parallel() == 2) return 0;
    const int nb = openblas_get_num_threads();
    if (nb != 1) openblas_set_num_threads(1);
    return nb;
}

static void blas_team_end(int nb) {
    if (nb > 1) openblas_set_num_threads(nb);
}

/* dW[o0:o1, :] += dout[0:m, o0:o1]ᵀ · x[0:m, :] — rows [o0, o1) of the weight gradient of a
 * linear layer y = x·Wᵀ (dout [m, O] with leading dimension O, x [m, In], dW [O, In]). Each
 * thread of a team takes a block of rows of dW, so no two threads write the same memory.
 * Source: the grad_weight formula of torch.nn.functional.linear (as linear_backward). */
static void wgrad_rows(float *dW, const float *dout, const float *x, int m, int In, int O, int o0, int o1) {
    if (m <= 0 || o1 <= o0 || In <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, In, m, 1.0f, dout + o0, O, x, In, 1.0f,
                dW + (size_t)o0 * In, In);
}

/* wgrad_rows over all N rows, this thread's share of the O output rows. */
static void wgrad_team(float *dW, const float *dout, const float *x, int N, int In, int O) {
    int o0, o1;
    team_share(O, &o0, &o1);
    wgrad_rows(dW, dout, x, N, In, O, o0, o1);
}

/* Per-thread RMSNorm weight-gradient partials in the d_tmp2 scratch: slot 0 [nt][H] for the
 * hidden-size norms (input/post-attention/final; never two live at once), then [nt][hd] for
 * q_norm and [nt][hd] for k_norm. With one thread the gradient is accumulated in place. */
typedef struct {
    float *hidden, *q, *k;
    int nt;
} norm_partials;

static norm_partials norm_partials_for(const moe_model *m, model_acts *a) {
    const int nt = team_threads(), H = m->cfg.hidden_size, hd = m->cfg.head_dim;
    norm_partials p = {a->d_tmp2, a->d_tmp2 + (size_t)nt * H, a->d_tmp2 + (size_t)nt * (H + hd), nt};
    return p;
}

/* Where this thread accumulates a norm weight gradient dw[C]: its zeroed partial slot, or dw
 * itself in a one-thread team. */
static float *norm_dw_slot(float *slots, float *dw, int C, int nt) {
    if (nt == 1) return dw;
    float *mine = slots + (size_t)team_thread() * C;
    memset(mine, 0, (size_t)C * sizeof(float));
    return mine;
}

/* dw[C] += Σ_t slots[t][C], columns split over the team, threads summed in order (the result
 * depends on the team size but not on timing). Call after a barrier. */
static void norm_dw_reduce(float *dw, const float *slots, int C, int nt) {
    if (nt == 1) return;
    int c0, c1;
    team_share(C, &c0, &c1);
    for (int c = c0; c < c1; c++) {
        float s = 0.0f;
        for (int t = 0; t < nt; t++) s += slots[(size_t)t * C + c];
        dw[c] += s;
    }
}

/* ------------------------------------------------------------------ layer pieces (team) */

/* out[N,O] (= or +=) x[N,I]·Wᵀ: linear_forward, or under moe_exec_opts.batch_invariant the
 * fixed-order product (linear_forward_bi) so that decode and training compute the same bits. */
static void lin(const moe_model *m, float *out, const float *x, const float *W, int N, int I, int O, int accumulate) {
    if (m->cfg.exec.batch_invariant) linear_forward_bi(out, x, W, N, I, O, accumulate);
    else linear_forward(out, x, W, N, I, O, accumulate);
}

/* Tokens [r0, r1) of x[N,H]: q_raw/k_raw/v = projections, q/k = RMSNorm per head (rstd saved)
 * then RoPE at pos. Source: HF Qwen3MoeAttention.forward up to the attention itself. */
static void qkv_rows(const moe_model *m, int l, const float *x, float *q_raw, float *k_raw, float *q_rstd,
                     float *k_rstd, float *q, float *k, float *v, const int *pos, const float *rope_cos,
                     const float *rope_sin, int r0, int r1) {
    const moe_config *c = &m->cfg;
    const layer_views *w = &m->p.layers[l];
    const int H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
    const int n = r1 - r0;
    if (n <= 0) return;
    const size_t oq = (size_t)r0 * nh * hd, ok = (size_t)r0 * nkv * hd;
    lin(m, q_raw + oq, x + (size_t)r0 * H, w->q_proj, n, H, nh * hd, 0);
    lin(m, k_raw + ok, x + (size_t)r0 * H, w->k_proj, n, H, nkv * hd, 0);
    lin(m, v + ok, x + (size_t)r0 * H, w->v_proj, n, H, nkv * hd, 0);
    rmsnorm_forward(q + oq, q_rstd + (size_t)r0 * nh, q_raw + oq, w->q_norm, n * nh, hd, c->rms_norm_eps);
    rmsnorm_forward(k + ok, k_rstd + (size_t)r0 * nkv, k_raw + ok, w->k_norm, n * nkv, hd, c->rms_norm_eps);
    rope_forward(q + oq, pos + r0, rope_cos, rope_sin, n, nh, hd);
    rope_forward(k + ok, pos + r0, rope_cos, rope_sin, n, nkv, hd);
}

/* ------------------------------------------------------------------ MoE layer (team)
 *
 * The production MoE path, forward and backward, run by every thread of a driver team:
 *   router logits + top-k per token (router_topk_rows emits row_idx) → counting-sort permute
 *   index (moe_permute_index, given that row_idx) → grouped GEMM gate_up with the gather fused
 *   in and SwiGLU as its epilogue (grouped_gemm_forward_team) → grouped GEMM down →
 *   unpermute weighted by the routing weights (per token).
 * Backward: unpermute backward + router backward per token → grouped GEMM backward of down
 * with the SwiGLU backward fused as its epilogue → grouped GEMM backward of gate_up → the
 * permute backward as a per-token gather, router weight and input gradients.
 * Each Ascend-practice optimisation can be switched off (moe_exec_opts in model.h); the
 * switches change the schedule, not the math. The naive HF loop (moe_naive.c) stays the oracle
 * in tests. */

/* Spans of the driver's stages (thread 0 of a team records them: its span of a stage that
 * ends in a barrier is the stage's wall time). */
#define SPAN_BEGIN() (team_thread() == 0 ? trace_begin() : -1.0)
#define SPAN_END(name, t) trace_end(name, "moe", t)

/* Token t and slot j of a k-major expanded row r = j·N + t. */
static inline void row_tj(int r, int N, int *t, int *j) {
    *t = r % N;
    *j = r / N;
}

/* Expert weights the GEMMs read: the stacked parameters, or (per_expert_weights) the layer's
 * stacked copy made by moe_stack_weights. */
static const float *moe_w_gate_up(const moe_model *m, int l, const mlp_acts *s) {
    return m->cfg.exec.per_expert_weights ? s->w_gu : m->p.layers[l].experts_gate_up;
}
static const float *moe_w_down(const moe_model *m, int l, const mlp_acts *s) {
    return m->cfg.exec.per_expert_weights ? s->w_d : m->p.layers[l].experts_down;
}

/* per_expert_weights: stack the E expert matrices into the layer's scratch, one copy per expert
 * matrix (what torch.stack of per-expert weights costs each forward). Team; ends in a barrier. */
static void moe_stack_weights(const moe_model *m, int l, mlp_acts *s) {
    const int E = m->cfg.num_experts, H = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size;
    const layer_views *w = &m->p.layers[l];
    const size_t ngu = (size_t)2 * I * H, nd = (size_t)H * I;
#pragma omp for schedule(static)
    for (int e = 0; e < E; e++) {
        memcpy(s->w_gu + e * ngu, w->experts_gate_up + e * ngu, ngu * sizeof(float));
        memcpy(s->w_d + e * nd, w->experts_down + e * nd, nd * sizeof(float));
    }
}

/* HF's selection, one expert at a time: for each e, a scan of all N·K (slot, token) choices
 * (torch.where(expert_mask[e])), slot-major, into the same arrays moe_permute_index fills. */
static void moe_scan_index(mlp_acts *s, int N, int E, int K) {
    int pos = 0;
    for (int e = 0; e < E; e++) {
        s->offsets[e] = pos;
        for (int j = 0; j < K; j++)
            for (int t = 0; t < N; t++)
                if (s->topk_ids[(size_t)t * K + j] == e) {
                    s->sorted_row[pos] = j * N + t;
                    s->expanded_pos[(size_t)t * K + j] = pos++;
                }
        s->tokens_per_expert[e] = pos - s->offsets[e];
    }
    s->offsets[E] = pos;
}

/* per_expert_loop forward: experts one after another, each stage split over the team (rows of
 * the gather and scatter, items of the one-expert grouped GEMM), as a framework runs a Python
 * loop of per-op parallel kernels. out must be zeroed (this thread's rows) before the barrier
 * that precedes this. */
static void moe_loop_forward_team(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N) {
    const moe_config *c = &m->cfg;
    const int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
    const float *Wgu = moe_w_gate_up(m, l, s), *Wd = moe_w_down(m, l, s);
    /* the loop's GEMMs are library calls (OpenBLAS), as HF's — or the fixed-order ones (batch_invariant) */
    const grouped_fuse lib = {.blas = 1, .invariant = c->exec.batch_invariant};
    for (int e = 0; e < E; e++) {
        const int r0 = s->offsets[e], r1 = s->offsets[e + 1];
        if (r1 == r0) continue;
#pragma omp for schedule(static)
        for (int i = r0; i < r1; i++) /* index_select */
            memcpy(s->permuted + (size_t)i * H, x + (size_t)(s->sorted_row[i] % N) * H, (size_t)H * sizeof(float));
        grouped_gemm_forward_team(s->gate_up, s->permuted, Wgu + (size_t)e * 2 * I * H, s->offsets + e, 1, H, 2 * I,
                                  &lib);
#pragma omp for schedule(static)
        for (int i = r0; i < r1; i++) swiglu_forward(s->act + (size_t)i * I, s->gate_up + (size_t)i * 2 * I, 1, I);
        grouped_gemm_forward_team(s->y, s->act, Wd + (size_t)e * H * I, s->offsets + e, 1, I, H, &lib);
#pragma omp for schedule(static)
        for (int i = r0; i < r1; i++) { /* index_add_ weighted; one row per token within an expert */
            int t, j;
            row_tj(s->sorted_row[i], N, &t, &j);
            const float w = s->topk_w[(size_t)t * K + j];
            float *o = out + (size_t)t * H;
            const float *y = s->y + (size_t)i * H;
#pragma omp simd
            for (int h = 0; h < H; h++) o[h] += w * y[h];
        }
    }
}

/* Routing replay and recording of one MoE layer (model_acts.replay_routes / routes_out): replay and
 * out point at this layer's K entries of the rank's first token, token t's at t·stride; native is
 * [N,K] scratch keeping the router's own top-k for the aux-loss counts. NULL (the engine's path, or
 * neither set): the native routes only. */
typedef struct {
    const int16_t *replay;
    int16_t *out;
    size_t stride;
    int *native;
    const int *force; /* recompute (model_backward): [N,K] the routes the forward used, reused as they were */
} route_io;

/* Rows [r0, r1) after router_topk_rows: record the native top-k (rt->out) and, where the token has
 * a replayed route (its entries are not −1), keep the native ids in rt->native and use the replayed
 * experts with their current probabilities as gate weights — summed and divided in router_row's
 * order, so replaying the native routes gives the native weights bit for bit. */
static void route_rows(const route_io *rt, mlp_acts *s, int r0, int r1, int E, int K, int norm) {
    for (int t = r0; t < r1; t++) {
        int *ids = s->topk_ids + (size_t)t * K;
        float *w = s->topk_w + (size_t)t * K;
        if (rt->force) { /* the recompute: the forward's own experts, weights as the replay's (bit for bit) */
            const float *p = s->probs + (size_t)t * E;
            float ws = 0.0f;
            for (int j = 0; j < K; j++) {
                ids[j] = rt->force[(size_t)t * K + j];
                w[j] = p[ids[j]];
                ws += w[j];
            }
            if (norm)
                for (int j = 0; j < K; j++) w[j] /= ws;
            continue;
        }
        if (rt->out)
            for (int j = 0; j < K; j++) rt->out[(size_t)t * rt->stride + j] = (int16_t)ids[j];
        if (!rt->replay) continue;
        memcpy(rt->native + (size_t)t * K, ids, (size_t)K * sizeof(int));
        const int16_t *rp = rt->replay + (size_t)t * rt->stride;
        if (rp[0] < 0) continue; /* no recorded route: native (model_forward checked all K are −1) */
        const float *p = s->probs + (size_t)t * E;
        float ws = 0.0f;
        for (int j = 0; j < K; j++) {
            ids[j] = rp[j];
            w[j] = p[ids[j]];
            ws += w[j];
        }
        if (norm)
            for (int j = 0; j < K; j++) w[j] /= ws;
    }
}

/* MoE block on x[N,H] → out[N,H] (OVERWRITTEN), called by every thread of a team; this thread's
 * token rows are [r0, r1). counts/psum (NULL: skip) receive the aux-loss statistics.
 * Source: HF Qwen3MoeSparseMoeBlock; the pipeline of Megatron/Ascend (forward.h). */
static void moe_forward_team(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N,
                             float *counts, float *psum, int r0, int r1, void *ep, const route_io *rt) {
    const moe_config *c = &m->cfg;
    const moe_exec_opts *ex = &c->exec;
    const layer_views *w = &m->p.layers[l];
    const int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
    const int n = r1 - r0, M = N * K;
    double t = SPAN_BEGIN();
    if (n > 0) {
        lin(m, s->router_logits + (size_t)r0 * E, x + (size_t)r0 * H, w->router, n, H, E, 0);
        const int hand_on = !ex->rebuild_row_idx && !ex->per_expert_loop;
        router_topk_rows(s->probs, s->topk_ids, s->topk_w, hand_on ? s->row_idx : NULL, s->router_logits, r0, r1, N,
                         E, K, c->norm_topk_prob);
        if (rt) route_rows(rt, s, r0, r1, E, K, c->norm_topk_prob);
        if (ex->per_expert_loop) memset(out + (size_t)r0 * H, 0, (size_t)n * H * sizeof(float));
    }
    if (ex->per_expert_weights) moe_stack_weights(m, l, s); /* its loop's barrier also ends the router stage */
#pragma omp barrier
    SPAN_END("router", t);
    t = SPAN_BEGIN();
#pragma omp single
    {
        if (counts) /* the load-balancing loss counts the router's own top-k, replayed or not (verl) */
            moe_aux_accumulate(counts, psum, s->probs, rt && rt->replay ? rt->native : s->topk_ids, N, E, K);
        if (ex->per_expert_loop) {
            moe_scan_index(s, N, E, K);
        } else {
            if (ex->rebuild_row_idx) /* the pass handing row_idx on saves */
                for (int j = 0; j < K; j++)
                    for (int tt = 0; tt < N; tt++) s->row_idx[(size_t)tt * K + j] = j * N + tt;
            moe_permute_index(s->sorted_row, s->expanded_pos, s->tokens_per_expert, s->offsets, s->topk_ids,
                              s->row_idx, N, E, K);
        }
    }
    if (ex->per_expert_loop) {
        SPAN_END("route index (scan)", t);
        t = SPAN_BEGIN();
        moe_loop_forward_team(m, l, x, out, s, N);
        SPAN_END("experts (loop)", t);
        return;
    }
    if (ep) { /* expert parallelism: permute, dispatch, local experts, combine into s->y (the MoE hook) */
        model_par_hooks(ep)->moe_forward(ep, m, l, x, s, N);
        SPAN_END("experts (expert parallel)", t);
    } else {
    grouped_fuse fz = {0};
    if (ex->separate_permute) {
#pragma omp for schedule(static)
        for (int i = 0; i < M; i++)
            memcpy(s->permuted + (size_t)i * H, x + (size_t)(s->sorted_row[i] % N) * H, (size_t)H * sizeof(float));
    } else {
        fz.gather_x = x;
        fz.sorted_row = s->sorted_row;
        fz.n_tokens = N;
    }
    SPAN_END("permute", t);
    t = SPAN_BEGIN();
    fz.swiglu_act = s->act;
    fz.invariant = ex->batch_invariant;
    if (m->nz && !ex->per_expert_weights) {
        fz.nz = m->nz_gate_up[l];
        fz.nz_stride = gemm_packed_size(2 * I, H);
    }
    if (m->bf16 && m->bf16->gate_up[l] && !ex->per_expert_weights) { /* the engine's bf16 weights */
        fz.nz16 = m->bf16->gate_up[l];
        fz.nz_stride = gemm_packed_size(2 * I, H);
    }
    /* fused: the rows are gathered inside the GEMM and no permuted copy is kept (backward gathers too) */
    grouped_gemm_forward_team(s->gate_up, ex->separate_permute ? s->permuted : NULL, moe_w_gate_up(m, l, s), s->offsets,
                              E, H, 2 * I, &fz);
    SPAN_END("gate_up GEMM + SwiGLU", t);
    t = SPAN_BEGIN();
    grouped_fuse fd = {.invariant = ex->batch_invariant};
    if (m->nz && !ex->per_expert_weights) {
        fd.nz = m->nz_down[l];
        fd.nz_stride = gemm_packed_size(H, I);
    }
    if (m->bf16 && m->bf16->down[l] && !ex->per_expert_weights) {
        fd.nz16 = m->bf16->down[l];
        fd.nz_stride = gemm_packed_size(H, I);
    }
    grouped_gemm_forward_team(s->y, s->act, moe_w_down(m, l, s), s->offsets, E, I, H, &fd);
    SPAN_END("down GEMM", t);
    } /* ep */
    t = SPAN_BEGIN();
    if (ex->separate_permute) {
        /* weight every expert output row, then (after the barrier) sum each token's rows */
#pragma omp for schedule(static)
        for (int i = 0; i < M; i++) {
            int tt, j;
            row_tj(s->sorted_row[i], N, &tt, &j);
            const float wt = s->topk_w[(size_t)tt * K + j];
            float *d = s->yw + (size_t)i * H;
            const float *y = s->y + (size_t)i * H;
#pragma omp simd
            for (int h = 0; h < H; h++) d[h] = wt * y[h];
        }
        for (int tt = r0; tt < r1; tt++) {
            float *o = out + (size_t)tt * H;
            const int *pos = s->expanded_pos + (size_t)tt * K;
            memcpy(o, s->yw + (size_t)pos[0] * H, (size_t)H * sizeof(float));
            for (int j = 1; j < K; j++) {
                const float *yj = s->yw + (size_t)pos[j] * H;
#pragma omp simd
                for (int h = 0; h < H; h++) o[h] += yj[h];
            }
        }
    } else if (n > 0) {
        moe_unpermute_forward(out + (size_t)r0 * H, s->y, s->topk_w + (size_t)r0 * K, s->expanded_pos + (size_t)r0 * K,
                              n, K, H);
    }
    SPAN_END("unpermute", t);
}

/* Dense SwiGLU MLP (HF Qwen3MoeMLP) on token rows [r0, r1): out = down(silu(gate(x))·up(x)). */
static void dense_forward_rows(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int r0, int r1) {
    const layer_views *w = &m->p.layers[l];
    const int H = m->cfg.hidden_size, Id = m->cfg.intermediate_size, n = r1 - r0;
    if (n <= 0) return;
    lin(m, s->gate_up + (size_t)r0 * 2 * Id, x + (size_t)r0 * H, w->mlp_gate_up, n, H, 2 * Id, 0);
    swiglu_forward(s->act + (size_t)r0 * Id, s->gate_up + (size_t)r0 * 2 * Id, n, Id);
    lin(m, out + (size_t)r0 * H, s->act + (size_t)r0 * Id, w->mlp_down, n, Id, H, 0);
}

/* MoE or dense MLP of layer l, called by every thread of a team; see mlp_forward. */
static void mlp_forward_team(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N,
                             float *counts, float *psum, int r0, int r1, void *ep, const route_io *rt) {
    if (m->p.layers[l].router) moe_forward_team(m, l, x, out, s, N, counts, psum, r0, r1, ep, rt);
    else dense_forward_rows(m, l, x, out, s, r0, r1);
}

/* ------------------------------------------------------------------ layer pieces (public) */

/* Every OpenMP thread for a decode-sized call (N ≤ SKINNY_MAX_ROWS) made outside any parallel
 * region (the rollout engine's steps), else team_size. Splitting a few tokens by rows would leave
 * all but one or two threads idle while the weights stream; the decode kernels split output
 * columns instead, with per-output sums that do not depend on the split. */
static int decode_team_size(const moe_model *m, int N) {
#ifdef _OPENMP
    if (N <= SKINNY_MAX_ROWS && omp_get_level() == 0) return omp_get_max_threads();
#endif
    return team_size(m, N);
}

/* Decode-sized qkv_forward on a team of nthr threads: the q, k and v projections as one
 * product over their concatenated output rows, split in 16-row blocks over the team (each
 * weight row read once per step), then q/k norm and RoPE on one thread (a few heads). */
static void qkv_decode(const moe_model *m, int l, const float *x, float *q_raw, float *k_raw, float *q_rstd,
                       float *k_rstd, float *q, float *k, float *v, const int *pos, const float *rope_cos,
                       const float *rope_sin, int N, int nthr) {
    const moe_config *c = &m->cfg;
    const layer_views *w = &m->p.layers[l];
    const int H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
    const int oq = nh * hd, ok = nkv * hd, units = (oq + 2 * ok + 15) / 16;
#pragma omp parallel num_threads(nthr)
    {
        const int t = team_thread(), nt = team_threads();
        const int c0 = (int)((long)units * t / nt) * 16, c1 = MOERL_MIN(oq + 2 * ok, (int)((long)units * (t + 1) / nt) * 16);
        /* the thread's block [c0, c1) of the concatenation q ‖ k ‖ v */
        const int seg0[3] = {0, oq, oq + ok}, segn[3] = {oq, ok, ok};
        float *outs[3] = {q_raw, k_raw, v};
        const float *ws[3] = {w->q_proj, w->k_proj, w->v_proj};
        const uint16_t *ws16[3] = {NULL, NULL, NULL};
        if (m->bf16 && oq % 16 == 0 && ok % 16 == 0) { /* the engine's bf16 weights (16-aligned segments) */
            ws16[0] = m->bf16->q[l]; ws16[1] = m->bf16->k[l]; ws16[2] = m->bf16->v[l];
        }
        for (int g = 0; g < 3; g++) {
            const int a = MOERL_MAX(c0, seg0[g]) - seg0[g], b = MOERL_MIN(c1, seg0[g] + segn[g]) - seg0[g];
            if (b <= a) continue;
            if (ws16[g]) gemm_packed16_nt(outs[g] + a, segn[g], x, ws16[g], N, H, a, b);
            else gemm_skinny_nt(outs[g] + a, segn[g], x, ws[g] + (size_t)a * H, N, H, b - a, 0);
        }
#pragma omp barrier
#pragma omp single
        {
            rmsnorm_forward(q, q_rstd, q_raw, w->q_norm, N * nh, hd, c->rms_norm_eps);
            rmsnorm_forward(k, k_rstd, k_raw, w->k_norm, N * nkv, hd, c->rms_norm_eps);
            rope_forward(q, pos, rope_cos, rope_sin, N, nh, hd);
            rope_forward(k, pos, rope_cos, rope_sin, N, nkv, hd);
        }
    }
}

void qkv_forward(const moe_model *m, int l, const float *x, float *q_raw, float *k_raw, float *q_rstd,
                 float *k_rstd, float *q, float *k, float *v, const int *pos, const float *rope_cos,
                 const float *rope_sin, int N) {
    if (m->cfg.exec.batch_invariant) { /* one kernel family whatever N (each product opens its own team) */
        qkv_rows(m, l, x, q_raw, k_raw, q_rstd, k_rstd, q, k, v, pos, rope_cos, rope_sin, 0, N);
        return;
    }
    const int nd = decode_team_size(m, N);
    if ((N <= SKINNY_MAX_ROWS && nd > 1) || (m->bf16 && N <= BF16_PANEL_MAX_ROWS)) { /* bf16: their panels, 1 thread too */
        qkv_decode(m, l, x, q_raw, k_raw, q_rstd, k_rstd, q, k, v, pos, rope_cos, rope_sin, N, nd);
        return;
    }
    const int nthr = team_size(m, N), nb = blas_team_begin(nthr);
#pragma omp parallel num_threads(nthr)
    {
        int r0, r1;
        team_share(N, &r0, &r1);
        qkv_rows(m, l, x, q_raw, k_raw, q_rstd, k_rstd, q, k, v, pos, rope_cos, rope_sin, r0, r1);
    }
    blas_team_end(nb);
}

/* The MLP sub-layer on a driver team: decode-sized batches use every thread (the grouped GEMM's
 * skinny items split each expert's output columns, so one token's experts spread over the team;
 * bench/run_llamacpp.sh); larger ones team_size as in training. */
static void mlp_forward_drive(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N,
                              float *counts, float *psum, void *ep) {
    const int nthr = decode_team_size(m, N), nb = blas_team_begin(nthr);
#pragma omp parallel num_threads(nthr)
    {
        int r0, r1;
        team_share(N, &r0, &r1);
        mlp_forward_team(m, l, x, out, s, N, counts, psum, r0, r1, ep, NULL);
    }
    blas_team_end(nb);
}

void mlp_forward(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N, float *counts,
                 float *psum) {
    MOERL_ASSERT(m->cfg.exec.ep_size <= 1 || !m->p.layers[l].router); /* an expert slice needs model_forward + ep */
    mlp_forward_drive(m, l, x, out, s, N, counts, psum, NULL);
}

/* par when its table has the MoE dispatch hook (expert parallelism), else NULL. */
static void *moe_dispatch_par(void *par) {
    const model_hooks *h = model_par_hooks(par);
    return h && h->moe_forward ? par : NULL;
}

/* par when its table has the attention shard hooks (Ulysses sequence parallelism), else NULL. */
static void *attn_shard_par(void *par) {
    const model_hooks *h = model_par_hooks(par);
    return h && h->attn_forward ? par : NULL;
}

/* ---- Megatron sequence parallelism × expert parallelism (experts whole; src/parallel/tp_sp.h) ----
 * An MoE layer takes this TP rank's rows [s0, s1) of the micro-batch (model_sp_rows) as they are — ln2 is not
 * gathered — routes them, dispatches them over the EP group (the moe_forward hook with n = s1 − s0 tokens) and
 * adds the combined rows to the rank's residual rows: no TP collective for the MoE in either direction (Megatron's
 * token dispatcher with sequence_parallel). The router's weight gradient and the aux-loss statistics cover the
 * rank's rows: the statistics are summed over the TP group after the forward (sp_ep_finish_forward), the router's
 * gradient with the norms' (tp_sp_reduce_router_grads). */

/* par when the SP × EP path applies (SP hooks, an MoE dispatch hook, experts whole), else NULL. */
static void *sp_ep_par(const moe_model *m, void *par) {
    return tp_sp_par(par) && moe_dispatch_par(par) && !m->cfg.exec.tp_experts ? par : NULL;
}

#define SP_EP_SHIFT(p, o) ((p) = (p) ? (p) + (o) : NULL)
/* Layer l's MoE sub-problem under SP × EP: this rank's rows [*s0, *s0 + *n) of the a->N tokens. The per-token
 * arrays of the layer's mlp_acts start at row s0 (token t of the sub-problem is row s0 + t: its routes stay at
 * their micro-batch rows); the permuted-row arrays (n·K rows) and the counts start at 0. */
static mlp_acts sp_ep_view(const moe_model *m, model_acts *a, int l, int *s0, int *n) {
    const size_t E = m->cfg.num_experts, K = m->cfg.num_experts_per_tok;
    int s1;
    model_sp_rows(a->N, m->cfg.exec.tp_size, m->cfg.exec.tp_rank, s0, &s1);
    *n = s1 - *s0;
    mlp_acts v = a->layers[l].mlp;
    const size_t t = (size_t)*s0;
    SP_EP_SHIFT(v.router_logits, t * E);
    SP_EP_SHIFT(v.probs, t * E);
    SP_EP_SHIFT(v.topk_ids, t * K);
    SP_EP_SHIFT(v.row_idx, t * K);
    SP_EP_SHIFT(v.topk_w, t * K);
    return v;
}

/* The MoE of layer l under SP × EP (team; this thread's slice rows [q0, q1) of resid_rows): out's rows [s0, s1)
 * := the experts' combined output for ln2's rows [s0, s1); the aux statistics of those rows accumulated. */
static void sp_ep_moe_forward_team(const moe_model *m, model_acts *a, int l, float *out, const route_io *rt, int q0,
                                   int q1) {
    int s0, n;
    mlp_acts v = sp_ep_view(m, a, l, &s0, &n);
    route_io r; /* the replayed / recorded routes of the sub-problem's tokens: rows s0.. of the micro-batch's */
    if (rt) {
        r = *rt;
        SP_EP_SHIFT(r.replay, (size_t)s0 * r.stride);
        SP_EP_SHIFT(r.out, (size_t)s0 * r.stride);
        rt = &r;
    }
    const size_t o = (size_t)s0 * m->cfg.hidden_size;
    moe_forward_team(m, l, a->layers[l].ln2 + o, out + o, &v, n, a->aux_counts, a->aux_psum, q0 - s0, q1 - s0, a->par,
                     rt);
}

void mlp_forward_par(const moe_model *m, int l, const float *x, float *out, mlp_acts *s, int N, void *par) {
    void *ep = moe_dispatch_par(par);
    if (!ep || !m->p.layers[l].router) mlp_forward(m, l, x, out, s, N, NULL, NULL);
    else mlp_forward_drive(m, l, x, out, s, N, NULL, NULL, ep);
}

/* ------------------------------------------------------------------ forward */

/* Layer l's attention input on token rows [r0, r1): ln1 = RMSNorm(resid_in), then q, k, v. */
static void attn_in_rows(const moe_model *m, model_acts *a, int l, int r0, int r1) {
    layer_acts *L = &a->layers[l];
    const int H = m->cfg.hidden_size;
    int q0, q1; /* SP: ln1 of this rank's rows, then all-gathered (the column-parallel q/k/v input) */
    resid_rows(m, a, r0, r1, &q0, &q1);
    const int lo = resid_row0(m, a);
    if (q1 > q0)
        rmsnorm_forward(L->ln1 + (size_t)q0 * H, L->ln1_rstd + (q0 - lo), L->resid_in + (size_t)(q0 - lo) * H,
                        m->p.layers[l].input_layernorm, q1 - q0, H, m->cfg.rms_norm_eps);
    sp_gather_team(tp_sp_par(a->par), L->ln1, a->N, H);
    if (r1 <= r0) return;
    qkv_rows(m, l, L->ln1, L->q_raw, L->k_raw, L->q_rstd, L->k_rstd, L->q, L->k, L->v, a->pos, a->rope_cos,
             a->rope_sin, r0, r1);
}

int model_moe_layer_index(const moe_config *c, int l) {
    if (l < 0 || l >= c->num_hidden_layers || !moe_config_layer_is_moe(c, l)) return -1;
    int k = 0;
    for (int i = 0; i < l; i++) k += moe_config_layer_is_moe(c, i);
    return k;
}

int model_moe_layer_count(const moe_config *c) {
    int k = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) k += moe_config_layer_is_moe(c, i);
    return k;
}

/* Layer l's replay / recording pointers (route_io) in model_acts' routes layout; 0 when layer l is
 * dense or neither array is set. */
static int layer_route_io(const moe_model *m, const model_acts *a, int l, route_io *rt) {
    const int mi = model_moe_layer_index(&m->cfg, l);
    if (mi < 0 || (!a->replay_routes && !a->routes_out)) return 0;
    memset(rt, 0, sizeof *rt);
    const int K = m->cfg.num_experts_per_tok;
    rt->stride = (size_t)model_moe_layer_count(&m->cfg) * K;
    const size_t off = (size_t)a->tok0 * rt->stride + (size_t)mi * K;
    rt->replay = a->replay_routes ? a->replay_routes + off : NULL;
    rt->out = a->routes_out ? a->routes_out + off : NULL;
    rt->native = a->route_native;
    return 1;
}

/* model_forward's check of the replayed routes of this rank's tokens [t0, t0 + n): per (token, MoE
 * layer) all K entries −1 (native routing) or K distinct experts in [0, E). */
static int check_replay_routes(const moe_config *c, const int16_t *rr, int t0, int n) {
    const int Lm = model_moe_layer_count(c), K = c->num_experts_per_tok, E = c->num_experts;
    for (int t = t0; t < t0 + n; t++)
        for (int mi = 0; mi < Lm; mi++) {
            const int16_t *r = rr + ((size_t)t * Lm + mi) * K;
            int none = 0;
            for (int j = 0; j < K; j++) {
                none += r[j] == -1;
                if (r[j] < -1 || r[j] >= E)
                    return moerl_errorf("model_forward: replay_routes of token %d, MoE layer %d: expert %d is "
                                        "outside [0,%d) (−1 = no recorded route)", t, mi, r[j], E);
                for (int i = 0; i < j && r[j] >= 0; i++)
                    if (r[i] == r[j])
                        return moerl_errorf("model_forward: replay_routes of token %d, MoE layer %d names expert "
                                            "%d twice; expected %d distinct experts", t, mi, r[j], K);
            }
            if (none && none != K)
                return moerl_errorf("model_forward: replay_routes of token %d, MoE layer %d mixes −1 (no recorded "
                                    "route) with experts; expected all %d entries −1 or all experts", t, mi, K);
        }
    return MOERL_OK;
}

/* Row-parallel output (team, TP): out[N,H] = Σ over the TP group of x[N,In]·Wᵀ (this rank's columns of W),
 * then + resid (rows [r0, r1) each; SP: out and resid hold this rank's rows, the sum is formed in row_sum_buf). */
static void tp_row_parallel_out(const moe_model *m, model_acts *a, void *tp, float *out, const float *x,
                                const float *W, const float *resid, int r0, int r1, int In) {
    const int H = m->cfg.hidden_size, n = r1 - r0;
    float *sum = row_sum_buf(a, out);
    if (n > 0) lin(m, sum + (size_t)r0 * H, x + (size_t)r0 * In, W, n, In, H, 0);
    tp_sum_rows_team(tp, sum, a->N, H); /* SP: reduce-scattered, the residual on this rank's rows */
    resid_add_rows(m, a, out, sum, resid, r0, r1);
}

/* Layer l after attention, on token rows [r0, r1) (team): resid_mid = resid_in + o_proj(att),
 * ln2 = RMSNorm(resid_mid), the MLP into the next residual stream plus resid_mid, then the
 * next layer's attention input — or, after the last layer, the final norm and the LM head. */
static void layer_rest_team(const moe_model *m, model_acts *a, int l, int r0, int r1) {
    const moe_config *c = &m->cfg;
    layer_acts *L = &a->layers[l];
    const layer_views *w = &m->p.layers[l];
    const int N = a->N, H = c->hidden_size, nhd = c->num_attention_heads * c->head_dim, n = r1 - r0;
    const int last = l + 1 == a->layer_hi; /* the last layer of this stage (of the model without pipeline) */
    float *out = last ? a->resid_out : a->layers[l + 1].resid_in;
    int q0, q1; /* the residual and norm rows (SP: this rank's slice, row q of its buffers at q − lo) */
    resid_rows(m, a, r0, r1, &q0, &q1);
    const int lo = resid_row0(m, a);
    const size_t o = (size_t)r0 * H, oq = (size_t)q0 * H, ol = (size_t)(q0 - lo) * H;
    void *tp = tp_par(a->par);
    if (tp) /* row-parallel o_proj: this rank's heads' partial sum, all-reduced, then the residual */
        tp_row_parallel_out(m, a, tp, L->resid_mid, L->att, w->o_proj, L->resid_in, r0, r1, nhd);
    else if (n > 0) {
        memcpy(L->resid_mid + o, L->resid_in + o, (size_t)n * H * sizeof(float));
        lin(m, L->resid_mid + o, L->att + (size_t)r0 * nhd, w->o_proj, n, nhd, H, 1);
    }
    if (q1 > q0)
        rmsnorm_forward(L->ln2 + oq, L->ln2_rstd + (q0 - lo), L->resid_mid + ol, w->post_attention_layernorm, q1 - q0,
                        H, c->rms_norm_eps);
    const int sp_ep = w->router && sp_ep_par(m, a->par); /* SP × EP: the MoE takes this rank's rows as they are */
    if (sp_ep) sp_sync_team(tp_sp_par(a->par));
    else sp_gather_team(tp_sp_par(a->par), L->ln2, N, H); /* SP: the MLP's input, every row (gather, then route) */
    route_io rt;
    const int routed = layer_route_io(m, a, l, &rt);
    float *sum = row_sum_buf(a, out); /* SP: the MLP's output by token row, the rank's rows then into out */
    if (sp_ep) sp_ep_moe_forward_team(m, a, l, sum, routed ? &rt : NULL, q0, q1);
    else mlp_forward_team(m, l, L->ln2, sum, &L->mlp, N, w->router ? a->aux_counts : NULL, a->aux_psum, r0, r1,
                          moe_dispatch_par(a->par), routed ? &rt : NULL);
    tp_sum_rows_team(w->router ? tp_expert_par(m, a->par) : tp, sum, N, H); /* row-parallel down projections */
    sp_sync_team(tp_sp_par(a->par)); /* SP with experts whole: no reduce-scatter, the rows are complete */
    resid_add_rows(m, a, out, sum, L->resid_mid, r0, r1);
    if (!last) {
        attn_in_rows(m, a, l + 1, r0, r1);
    } else if (a->logits) { /* a pipeline stage before the last has no head */
        if (q1 > q0)
            rmsnorm_forward(a->lnf + oq, a->lnf_rstd + (q0 - lo), a->resid_out + ol, m->p.norm, q1 - q0, H,
                            c->rms_norm_eps);
        sp_gather_team(tp_sp_par(a->par), a->lnf, N, H); /* SP: the vocab-parallel head's input, every row */
        if (n > 0) lin(m, a->logits + (size_t)r0 * c->vocab_size, a->lnf + o, m->p.lm_head, n, H, c->vocab_size, 0);
    }
}

/* After an SP × EP forward (one thread): the aux-loss statistics summed over the TP group (each rank counted its
 * rows), and — when the routes are recorded (routes_out) — every rank's rows of routes_out and of each MoE layer's
 * topk_ids all-gathered (the callers read them for all N tokens: train_route_visit). */
static void sp_ep_finish_forward(const moe_model *m, model_acts *a) {
    const model_hooks *h = model_par_hooks(a->par);
    const int E = m->cfg.num_experts, K = m->cfg.num_experts_per_tok, N = a->N, per = model_moe_layer_count(&m->cfg) * K;
    float *buf = xmalloc(((size_t)2 * (E > N * 2 * per ? E : N * 2 * per) + 1) * sizeof(float));
    memcpy(buf, a->aux_counts, (size_t)E * sizeof(float));
    memcpy(buf + E, a->aux_psum, (size_t)E * sizeof(float));
    h->tp_allreduce_f32(a->par, buf, (size_t)2 * E);
    memcpy(a->aux_counts, buf, (size_t)E * sizeof(float));
    memcpy(a->aux_psum, buf + E, (size_t)E * sizeof(float));
    if (a->routes_out) { /* a row: the token's routes_out entries, then its topk_ids of every MoE layer */
        int s0, s1;
        model_sp_rows(N, m->cfg.exec.tp_size, m->cfg.exec.tp_rank, &s0, &s1);
        for (int pass = 0; pass < 2; pass++) { /* 0: pack this rank's rows; 1: unpack every row after the gather */
            for (int t = pass ? 0 : s0; t < (pass ? N : s1); t++) {
                float *f = buf + (size_t)t * 2 * per;
                int16_t *ro = a->routes_out + (size_t)t * per;
                for (int i = 0; i < per; i++) pass ? (void)(ro[i] = (int16_t)f[i]) : (void)(f[i] = ro[i]);
                for (int l = 0, mi = 0; l < m->cfg.num_hidden_layers; l++) {
                    if (!m->p.layers[l].router) continue;
                    int *ids = a->layers[l].mlp.topk_ids + (size_t)t * K;
                    for (int j = 0; j < K; j++, mi++) pass ? (void)(ids[j] = (int)f[per + mi]) : (void)(f[per + mi] = ids[j]);
                }
            }
            if (!pass) h->tp_all_gather(a->par, buf, N, 2 * per);
        }
    }
    free(buf);
}

/* model_forward's check that the arena's layout (model_acts.sp_rows) matches the runtime: Megatron SP's hooks
 * with an arena laid out for them, ⌈N/tp⌉ rows fitting, and neither without the other. */
static int check_sp_layout(const moe_model *m, const model_acts *a, int N) {
    const int P = m->cfg.exec.tp_size;
    if (tp_sp_par(a->par) && !a->sp_rows)
        return moerl_errorf("model_forward: the runtime runs Megatron sequence parallelism (model_hooks.tp_reduce_scatter) "
                            "but the activation arena was laid out without it (moe_exec_opts.tp_sp 0 at model_acts_init): "
                            "lay it out after the model's TP slice (tp_state_attach sets tp_sp)");
    if (a->sp_rows && !tp_sp_par(a->par))
        return moerl_errorf("model_forward: the activation arena holds a TP rank's ⌈N/tp⌉ rows of the residual stream "
                            "(Megatron sequence parallelism, model_acts.sp_rows %d) but the runtime (model_acts.par) has "
                            "no sequence-parallel hooks", a->sp_rows);
    if (a->sp_rows && (P < 2 || (N + P - 1) / P > a->sp_rows))
        return moerl_errorf("model_forward: %d tokens over tp_size %d need %d rows a rank, the activation arena's "
                            "sequence-parallel buffers hold %d (model_acts.sp_rows)", N, P, P > 0 ? (N + P - 1) / P : N,
                            a->sp_rows);
    return MOERL_OK;
}

int model_forward(const moe_model *m, model_acts *a, const int *tokens, const int *cu_seqlens,
                  const int *positions, int B, int N) {
    const moe_config *c = &m->cfg;
    const int H = c->hidden_size, V = c->vocab_size, hd = c->head_dim, nh = c->num_attention_heads,
              nkv = c->num_key_value_heads, E = c->num_experts;
    void *sp = attn_shard_par(a->par); /* the attention shard's runtime (Ulysses SP), else NULL */
    const model_hooks *h = model_par_hooks(a->par);
    int t0 = 0, n_loc = N; /* Ulysses: this rank computes tokens [t0, t0 + n_loc) (attn_tokens) */
    if (sp) h->attn_tokens(sp, N, &t0, &n_loc);
    if (N <= 0 || n_loc > a->max_tokens)
        return moerl_errorf("model_forward: batch of %d tokens, expected 1..%d (max_tokens)", n_loc, a->max_tokens);
    if (B <= 0 || cu_seqlens[0] != 0 || cu_seqlens[B] != N)
        return moerl_errorf("model_forward: cu_seqlens must start at 0 and end at N=%d (B=%d)", N, B);
    for (int b = 0; b < B; b++)
        if (cu_seqlens[b + 1] < cu_seqlens[b])
            return moerl_errorf("model_forward: cu_seqlens decreases at sequence %d", b);
    const int Vw = c->exec.tp_size > 1 ? c->exec.tp_vocab : V; /* TP: the whole vocabulary */
    for (int n = 0; n < N; n++)
        if (tokens[n] < 0 || tokens[n] >= Vw)
            return moerl_errorf("model_forward: token %d at position %d outside the vocabulary [0,%d)", tokens[n],
                                n, Vw);
    if (c->exec.tp_size > 1 && !tp_par(a->par))
        return moerl_errorf("model_forward: the model holds a tensor-parallel slice (rank %d of %d) but the "
                            "activations carry no TP all-reduce hook (model_acts.par: src/parallel's par_state with "
                            "its tp_state)", c->exec.tp_rank, c->exec.tp_size);
    if (tp_sp_par(a->par) && (c->exec.tp_size < 2 || sp || a->layer_lo > 0 || a->layer_hi < c->num_hidden_layers))
        return moerl_errorf("model_forward: Megatron sequence parallelism (model_hooks.tp_reduce_scatter) needs a "
                            "tensor-parallel slice (tp_size %d) of the whole model without Ulysses or a pipeline stage",
                            c->exec.tp_size);
    if (check_sp_layout(m, a, n_loc) != MOERL_OK) return MOERL_ERR;
    if (c->exec.ep_size > 1 && !moe_dispatch_par(a->par))
        return moerl_errorf("model_forward: the model holds an expert-parallel slice (rank %d of %d) but the "
                            "activations carry no MoE dispatch hook (model_acts.par: a runtime whose model_hooks has "
                            "moe_forward, e.g. src/parallel's par_state with its ep_state)", c->exec.ep_rank,
                            c->exec.ep_size);
    if (a->replay_routes && E > 0 && check_replay_routes(c, a->replay_routes, t0, n_loc) != MOERL_OK)
        return MOERL_ERR;
    if (sp && h->attn_begin(sp, cu_seqlens, B, N) != MOERL_OK) return MOERL_ERR;
    a->N = n_loc;
    a->B = B;
    a->tok0 = t0;
    if (!sp) memcpy(a->cu_seqlens, cu_seqlens, (size_t)(B + 1) * sizeof(int)); /* SP: attn_begin keeps them */
    memcpy(a->tokens_in, tokens + t0, (size_t)n_loc * sizeof(int));
    if (positions) {
        for (int n = 0; n < n_loc; n++) {
            if (positions[t0 + n] < 0 || positions[t0 + n] >= a->rope_max_pos)
                return moerl_errorf("model_forward: position %d outside [0,%d)", positions[t0 + n], a->rope_max_pos);
            a->pos[n] = positions[t0 + n];
        }
    } else {
        for (int b = 0; b < B; b++)
            for (int n = MOERL_MAX(cu_seqlens[b], t0); n < MOERL_MIN(cu_seqlens[b + 1], t0 + n_loc); n++)
                a->pos[n - t0] = n - cu_seqlens[b];
    }
    N = n_loc;
    if (E > 0) {
        memset(a->aux_counts, 0, E * sizeof(float));
        memset(a->aux_psum, 0, E * sizeof(float));
    }
    a->n_moe_layers = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) a->n_moe_layers += m->p.layers[l].router != NULL;
    const float scale = 1.0f / sqrtf((float)hd);
    const int nthr = team_size(m, N), nb = blas_team_begin(nthr);
    /* embedding rows and layer 0's attention input; a later pipeline stage: layer lo's attention input
     * (the event of the region "layer lo−1's rest + layer lo's attention input", FSDP's units lo, lo+1) */
    PAR_EVENT(a, MODEL_FWD_LAYER, a->layer_lo - 1);
#pragma omp parallel num_threads(nthr)
    {
        int r0, r1;
        team_share(N, &r0, &r1);
        float *x = a->layers[0].resid_in;
        if (a->layer_lo == 0 && !tp_par(a->par)) /* a later pipeline stage's input was filled by the caller */
            for (int n = r0; n < r1; n++)
                memcpy(x + (size_t)n * H, m->p.embed_tokens + (size_t)a->tokens_in[n] * H, H * sizeof(float));
        else if (a->layer_lo == 0) { /* vocab-parallel embedding: this rank's rows, zero elsewhere, summed */
            const int v0 = tp_vocab_lo(c);
            float *sum = row_sum_buf(a, x);
            for (int n = r0; n < r1; n++) {
                const int v = a->tokens_in[n] - v0;
                if (v >= 0 && v < V) memcpy(sum + (size_t)n * H, m->p.embed_tokens + (size_t)v * H, H * sizeof(float));
                else memset(sum + (size_t)n * H, 0, H * sizeof(float));
            }
            tp_sum_rows_team(tp_par(a->par), sum, N, H); /* SP: reduce-scattered to this rank's rows */
            resid_add_rows(m, a, x, sum, NULL, r0, r1);
        }
        attn_in_rows(m, a, a->layer_lo, r0, r1);
    }
    for (int l = a->layer_lo; l < a->layer_hi; l++) {
        layer_acts *L = &a->layers[l];
        const double ta = trace_begin();
        if (sp) h->attn_forward(sp, l, L->att, L->q, L->k, L->v, scale); /* head-sharded (ulysses.c) */
        else if (c->exec.batch_invariant) /* key order of the engine's KV-cache attention (batch_invariant.c) */
            attention_forward_bi(L->att, L->lse, L->q, L->k, L->v, a->cu_seqlens, B, N, nh, nkv, hd, scale);
        else attention_forward(L->att, L->lse, L->q, L->k, L->v, a->cu_seqlens, B, N, nh, nkv, hd, scale);
        trace_end("attention", "model", ta);
        PAR_EVENT(a, MODEL_FWD_LAYER, l);
        const double tl = trace_begin();
#pragma omp parallel num_threads(nthr)
        {
            int r0, r1;
            team_share(N, &r0, &r1);
            layer_rest_team(m, a, l, r0, r1);
        }
        trace_end("layer rest (o_proj, norm, MoE, next qkv)", "model", tl);
    }
    blas_team_end(nb);
    if (E > 0 && sp_ep_par(m, a->par)) sp_ep_finish_forward(m, a); /* SP × EP: each rank routed its own rows */
    a->aux_loss = a->n_moe_layers ? moe_aux_loss(a->aux_counts, a->aux_psum, E, (int64_t)a->n_moe_layers * N) : 0.0f;
    return MOERL_OK;
}

void model_logprobs(const moe_model *m, model_acts *a, const int *targets, float temperature, int want_entropy) {
    a->targets = targets;
    a->temperature = temperature;
    if (tp_par(a->par)) { /* vocab-parallel: statistics reduced over the TP group (vocab_parallel.c) */
        vp_logprob_forward(m, a, tp_vocab_lo(&m->cfg), want_entropy);
        return;
    }
    logprob_forward(a->logp, want_entropy ? a->entropy : NULL, a->lse_head, a->logits, targets, a->N,
                    m->cfg.vocab_size, temperature);
}

/* ------------------------------------------------------------------ backward */

/* per_expert_weights backward: zero the layer's stacked weight-gradient scratch (team; ends in
 * a barrier) — and after the GEMMs, add it to each expert's gradient (the per-expert .grad
 * accumulation of the practice's baseline). */
static void moe_wgrad_scratch_zero(const moe_model *m, model_acts *a) {
    const int E = m->cfg.num_experts, H = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size;
    const size_t ngu = (size_t)2 * I * H, nd = (size_t)H * I;
#pragma omp for schedule(static)
    for (int e = 0; e < E; e++) {
        memset(a->dw_gu + e * ngu, 0, ngu * sizeof(float));
        memset(a->dw_d + e * nd, 0, nd * sizeof(float));
    }
}
static void moe_wgrad_scratch_add(moe_model *m, model_acts *a, int l) {
    const int E = m->cfg.num_experts, H = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size;
    const size_t ngu = (size_t)2 * I * H, nd = (size_t)H * I;
    layer_views *gw = &m->g.layers[l];
#pragma omp for schedule(static) nowait
    for (int e = 0; e < E; e++) {
        float *g1 = gw->experts_gate_up + e * ngu, *g2 = gw->experts_down + e * nd;
        const float *s1 = a->dw_gu + e * ngu, *s2 = a->dw_d + e * nd;
#pragma omp simd
        for (size_t i = 0; i < ngu; i++) g1[i] += s1[i];
#pragma omp simd
        for (size_t i = 0; i < nd; i++) g2[i] += s2[i];
    }
}

/* per_expert_loop backward of the experts: one expert after another, every stage split over the
 * team; writes d_topk_w (all rows) and dx = Σ over each token's rows (dx zeroed, this thread's
 * rows, before the barrier that precedes this). */
static void moe_loop_backward_team(moe_model *m, model_acts *a, int l, const float *dout, float *dx, float *dWgu,
                                   float *dWd) {
    const moe_config *c = &m->cfg;
    mlp_acts *s = &a->layers[l].mlp;
    const int N = a->N, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok,
              I = c->moe_intermediate_size;
    const float *Wgu = moe_w_gate_up(m, l, s), *Wd = moe_w_down(m, l, s);
    const grouped_fuse lib = {.blas = 1}; /* library GEMMs, as in moe_loop_forward_team */
    for (int e = 0; e < E; e++) {
        const int r0 = s->offsets[e], r1 = s->offsets[e + 1];
        if (r1 == r0) continue;
#pragma omp for schedule(static)
        for (int i = r0; i < r1; i++) {
            int t, j;
            row_tj(s->sorted_row[i], N, &t, &j);
            moe_unpermute_backward_row(a->d_y + (size_t)i * H, a->d_topk_w + (size_t)t * K + j, dout + (size_t)t * H,
                                       s->y + (size_t)i * H, s->topk_w[(size_t)t * K + j], H);
        }
        grouped_gemm_backward_team(a->d_act, dWd + (size_t)e * H * I, a->d_y, s->act, Wd + (size_t)e * H * I,
                                   s->offsets + e, 1, I, H, &lib);
#pragma omp for schedule(static)
        for (int i = r0; i < r1; i++)
            swiglu_backward(a->d_gate_up + (size_t)i * 2 * I, a->d_act + (size_t)i * I, s->gate_up + (size_t)i * 2 * I,
                            1, I);
        grouped_gemm_backward_team(a->d_permuted, dWgu + (size_t)e * 2 * I * H, a->d_gate_up, s->permuted,
                                   Wgu + (size_t)e * 2 * I * H, s->offsets + e, 1, H, 2 * I, &lib);
#pragma omp for schedule(static)
        for (int i = r0; i < r1; i++) {
            float *d = dx + (size_t)(s->sorted_row[i] % N) * H;
            const float *src = a->d_permuted + (size_t)i * H;
#pragma omp simd
            for (int h = 0; h < H; h++) d[h] += src[h];
        }
    }
}

/* MoE block backward (team). dout[N,H] = ∂loss/∂(block output); writes this thread's token rows
 * of dx[N,H] = ∂loss/∂(block input) (OVERWRITTEN) and accumulates the expert and router weight
 * gradients. Every read of dout happens before one of this function's barriers, so the caller
 * may update its own rows of dout after this returns. Order (default schedule):
 * unpermute backward and router backward per token → barrier → grouped GEMM backward of down
 * with the SwiGLU backward fused → grouped GEMM backward of gate_up → router weight gradient,
 * per-token gather of dx (moe_permute_backward as a gather: dx[t] = Σ_j dpermuted[pos(t, j)])
 * plus the router's input gradient. Source: the chain rule through HF Qwen3MoeSparseMoeBlock
 * (transformers, src/transformers/models/qwen3_moe/modeling_qwen3_moe.py). */
static void moe_backward_team(moe_model *m, model_acts *a, int l, mlp_acts *s, const float *x, const float *dout,
                              float *dx, int N, float aux_weight, int r0, int r1) {
    const moe_config *c = &m->cfg;
    const moe_exec_opts *ex = &c->exec;
    const layer_views *w = &m->p.layers[l];
    layer_views *gw = &m->g.layers[l];
    const int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok,
              I = c->moe_intermediate_size, n = r1 - r0, M = N * K;
    float *dWgu = ex->per_expert_weights ? a->dw_gu : gw->experts_gate_up;
    float *dWd = ex->per_expert_weights ? a->dw_d : gw->experts_down;
    const float *Wgu = moe_w_gate_up(m, l, s), *Wd = moe_w_down(m, l, s);
    double t = SPAN_BEGIN();
    if (ex->per_expert_weights) moe_wgrad_scratch_zero(m, a);
    if (ex->per_expert_loop) {
        if (n > 0) memset(dx + (size_t)r0 * H, 0, (size_t)n * H * sizeof(float));
#pragma omp barrier
        moe_loop_backward_team(m, a, l, dout, dx, dWgu, dWd);
        SPAN_END("bwd experts (loop)", t);
        t = SPAN_BEGIN();
    } else if (ex->separate_permute) {
        /* scatter each token's gradient to its rows (into the yw scratch), then weight them */
        for (int tt = r0; tt < r1; tt++)
            for (int j = 0; j < K; j++)
                memcpy(s->yw + (size_t)s->expanded_pos[(size_t)tt * K + j] * H, dout + (size_t)tt * H,
                       (size_t)H * sizeof(float));
#pragma omp barrier
#pragma omp for schedule(static)
        for (int i = 0; i < M; i++) {
            int tt, j;
            row_tj(s->sorted_row[i], N, &tt, &j);
            moe_unpermute_backward_row(a->d_y + (size_t)i * H, a->d_topk_w + (size_t)tt * K + j, s->yw + (size_t)i * H,
                                       s->y + (size_t)i * H, s->topk_w[(size_t)tt * K + j], H);
        }
    } else if (n > 0) {
        /* fused: only the routing weights' gradient here; the grouped GEMM reads the weighted rows
         * of dout in place (grouped_fuse.gather_dout) — except under expert parallelism, whose
         * dispatch sends d_y */
        const int ep_on = moe_dispatch_par(a->par) != NULL;
        moe_unpermute_backward(ep_on ? a->d_y : NULL, a->d_topk_w + (size_t)r0 * K, dout + (size_t)r0 * H, s->y,
                               s->topk_w + (size_t)r0 * K, s->expanded_pos + (size_t)r0 * K, n, K, H);
    }
    tp_sum_team(tp_expert_par(m, a->par), a->d_topk_w, (size_t)N * K); /* expert-TP: partial expert outputs */
    if (n > 0) {
        const float *dprobs = NULL;
        if (aux_weight != 0.0f) {
            moe_aux_backward(a->d_probs + (size_t)r0 * E, a->aux_counts, n, E, (int64_t)a->n_moe_layers * a->N,
                             aux_weight); /* SP × EP: the micro-batch's a->N tokens, not the sub-problem's N */
            dprobs = a->d_probs + (size_t)r0 * E;
        }
        router_topk_backward(a->d_router_logits + (size_t)r0 * E, a->d_topk_w + (size_t)r0 * K, dprobs,
                             s->probs + (size_t)r0 * E, s->topk_ids + (size_t)r0 * K, n, E, K, c->norm_topk_prob);
    }
#pragma omp barrier
    SPAN_END(ex->per_expert_loop ? "bwd router" : "bwd unpermute + router", t);
    if (moe_dispatch_par(a->par)) { /* expert parallelism: dispatch d_y, local experts, combine (ep.c) */
        t = SPAN_BEGIN();
        model_par_hooks(a->par)->moe_backward(a->par, m, l, s, a->d_y, a->d_permuted, dWgu, dWd);
        SPAN_END("bwd experts (expert parallel)", t);
    } else if (!ex->per_expert_loop) {
        t = SPAN_BEGIN();
        grouped_fuse fz = {0}, fg = {0};
        fz.swiglu_dgate_up = a->d_gate_up;
        fz.swiglu_gate_up = s->gate_up;
        if (!ex->separate_permute) { /* fused unpermute backward and permute: dout and x read in place */
            fz.gather_dout = dout;
            fz.topk_w = s->topk_w;
            fz.topk_k = K;
            fz.sorted_row = fg.sorted_row = s->sorted_row;
            fz.n_tokens = fg.n_tokens = N;
            fg.gather_x = x;
        }
        /* da NULL: ∂/∂act only feeds the SwiGLU backward epilogue and stays in each item's scratch */
        grouped_gemm_backward_team(NULL, dWd, ex->separate_permute ? a->d_y : NULL, s->act, Wd, s->offsets, E, I, H,
                                   &fz);
        SPAN_END("bwd down GEMM + SwiGLU", t);
        t = SPAN_BEGIN();
        grouped_gemm_backward_team(a->d_permuted, dWgu, a->d_gate_up, ex->separate_permute ? s->permuted : NULL, Wgu,
                                   s->offsets, E, H, 2 * I, &fg);
        SPAN_END("bwd gate_up GEMM", t);
    }
    t = SPAN_BEGIN();
    if (ex->per_expert_weights) moe_wgrad_scratch_add(m, a, l);
    wgrad_team(gw->router, a->d_router_logits, x, N, H, E);
    if (ex->per_expert_loop) {
        /* dx already holds the experts' part */
    } else if (ex->separate_permute) {
        /* moe_permute_backward's schedule: dx zeroed, then every permuted row added to its
         * token, each thread owning a slice of the columns */
        int h0, h1;
        team_share((H + 15) / 16, &h0, &h1);
        h0 = MOERL_MIN(H, h0 * 16);
        h1 = MOERL_MIN(H, h1 * 16);
        for (int tt = 0; tt < N; tt++) memset(dx + (size_t)tt * H + h0, 0, (size_t)(h1 - h0) * sizeof(float));
        for (int i = 0; i < M; i++) {
            float *d = dx + (size_t)(s->sorted_row[i] % N) * H;
            const float *src = a->d_permuted + (size_t)i * H;
            for (int h = h0; h < h1; h++) d[h] += src[h];
        }
#pragma omp barrier
    } else {
        for (int tt = r0; tt < r1; tt++) {
            float *d = dx + (size_t)tt * H;
            const int *pos = s->expanded_pos + (size_t)tt * K;
            memcpy(d, a->d_permuted + (size_t)pos[0] * H, (size_t)H * sizeof(float));
            for (int j = 1; j < K; j++) {
                const float *src = a->d_permuted + (size_t)pos[j] * H;
#pragma omp simd
                for (int h = 0; h < H; h++) d[h] += src[h];
            }
        }
    }
    tp_sum_rows_team(tp_expert_par(m, a->par), dx, N, H); /* expert-TP: the experts' input gradient */
    if (n > 0)
        linear_backward(dx + (size_t)r0 * H, NULL, a->d_router_logits + (size_t)r0 * E, NULL, w->router, n, H, E, 1);
    SPAN_END("bwd permute + router wgrad", t);
}

/* Dense MLP backward (team): this thread's rows of dx (OVERWRITTEN), then — after a barrier —
 * the weight gradients split by rows of dW, and a closing barrier because the caller next
 * updates its rows of dout, which the weight gradient of the down projection reads in full. */
static void dense_backward_team(moe_model *m, model_acts *a, int l, const float *x, const float *dout, float *dx,
                                int r0, int r1) {
    const layer_views *w = &m->p.layers[l];
    layer_views *gw = &m->g.layers[l];
    mlp_acts *s = &a->layers[l].mlp;
    const int N = a->N, H = m->cfg.hidden_size, Id = m->cfg.intermediate_size, n = r1 - r0;
    if (n > 0) {
        linear_backward(a->d_act + (size_t)r0 * Id, NULL, dout + (size_t)r0 * H, NULL, w->mlp_down, n, Id, H, 0);
        swiglu_backward(a->d_gate_up + (size_t)r0 * 2 * Id, a->d_act + (size_t)r0 * Id,
                        s->gate_up + (size_t)r0 * 2 * Id, n, Id);
        linear_backward(dx + (size_t)r0 * H, NULL, a->d_gate_up + (size_t)r0 * 2 * Id, NULL, w->mlp_gate_up, n, H,
                        2 * Id, 0);
    }
#pragma omp barrier
    wgrad_team(gw->mlp_down, dout, s->act, N, Id, H);
    wgrad_team(gw->mlp_gate_up, a->d_gate_up, x, N, H, 2 * Id);
#pragma omp barrier
    tp_sum_rows_team(tp_par(a->par), dx, N, H); /* column-parallel gate_up: partial input gradient */
}

/* The MoE backward of layer l under SP × EP (team; slice rows [q0, q1)): d_tmp's rows [s0, s1) := ∂/∂ln2 of those
 * rows from d_resid's rows [s0, s1); the local experts' and the router's gradients accumulate this rank's rows. */
static void sp_ep_moe_backward_team(moe_model *m, model_acts *a, int l, float aux_weight, int q0, int q1) {
    int s0, n;
    mlp_acts v = sp_ep_view(m, a, l, &s0, &n);
    const size_t o = (size_t)s0 * m->cfg.hidden_size;
    moe_backward_team(m, a, l, &v, a->layers[l].ln2 + o, a->d_resid + o, a->d_tmp + o, n, aux_weight, q0 - s0,
                      q1 - s0);
}

/* Layer l from its output back to resid_mid and through o_proj (team): on entry d_resid holds
 * ∂loss/∂(layer output); on exit ∂loss/∂resid_mid, and d_att = ∂loss/∂att (all rows, after the
 * region ends). MLP backward into d_tmp, post-attention RMSNorm backward added to d_resid (the
 * residual path), o_proj input gradient per token; then after a barrier the o_proj weight
 * gradient and the norm weight gradient. */
static void layer_mlp_backward_team(moe_model *m, model_acts *a, int l, float aux_weight, int r0, int r1) {
    const moe_config *c = &m->cfg;
    layer_acts *L = &a->layers[l];
    const layer_views *w = &m->p.layers[l];
    layer_views *gw = &m->g.layers[l];
    const int N = a->N, H = c->hidden_size, nhd = c->num_attention_heads * c->head_dim, n = r1 - r0;
    void *sp = tp_sp_par(a->par);
    int q0, q1; /* SP: the norm's rows are this rank's slice; ∂out and ∂resid_mid all-gathered for the products */
    resid_rows(m, a, r0, r1, &q0, &q1);
    const int sp_ep = w->router && sp_ep_par(m, a->par); /* SP × EP: the MoE on this rank's rows, no gather */
    if (sp_ep) sp_sync_team(sp);
    else sp_gather_team(sp, a->d_resid, N, H);
    if (sp_ep) sp_ep_moe_backward_team(m, a, l, aux_weight, q0, q1);
    else if (w->router) moe_backward_team(m, a, l, &L->mlp, L->ln2, a->d_resid, a->d_tmp, N, aux_weight, r0, r1);
    else dense_backward_team(m, a, l, L->ln2, a->d_resid, a->d_tmp, r0, r1);
    sp_sync_team(sp);
    norm_partials np = norm_partials_for(m, a);
    float *dw = norm_dw_slot(np.hidden, gw->post_attention_layernorm, H, np.nt);
    const int lo = resid_row0(m, a);
    if (q1 > q0)
        rmsnorm_backward(a->d_resid + (size_t)q0 * H, dw, a->d_tmp + (size_t)q0 * H,
                         L->resid_mid + (size_t)(q0 - lo) * H, w->post_attention_layernorm, L->ln2_rstd + (q0 - lo),
                         q1 - q0, H, 1);
    sp_gather_team(sp, a->d_resid, N, H);
    if (n > 0)
        linear_backward(a->d_att + (size_t)r0 * nhd, NULL, a->d_resid + (size_t)r0 * H, NULL, w->o_proj, n, nhd, H, 0);
#pragma omp barrier
    wgrad_team(gw->o_proj, a->d_resid, L->att, N, nhd, H);
    norm_dw_reduce(gw->post_attention_layernorm, np.hidden, H, np.nt);
}

/* Layer l from the attention's q/k/v gradients (d_q, d_k, d_v, all rows) back to the layer input
 * (team): RoPE and q/k-norm backward per token, the q/k/v input gradients into d_tmp, the input
 * RMSNorm backward added to d_resid (now ∂loss/∂resid_in); then after a barrier the q/k/v
 * weight gradients and the three norm weight gradients. */
static void layer_attn_backward_team(moe_model *m, model_acts *a, int l, int r0, int r1) {
    const moe_config *c = &m->cfg;
    layer_acts *L = &a->layers[l];
    const layer_views *w = &m->p.layers[l];
    layer_views *gw = &m->g.layers[l];
    const int N = a->N, H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads,
              hd = c->head_dim, n = r1 - r0;
    norm_partials np = norm_partials_for(m, a);
    float *dwq = norm_dw_slot(np.q, gw->q_norm, hd, np.nt), *dwk = norm_dw_slot(np.k, gw->k_norm, hd, np.nt);
    float *dw1 = norm_dw_slot(np.hidden, gw->input_layernorm, H, np.nt);
    if (n > 0) {
        const size_t oq = (size_t)r0 * nh * hd, ok = (size_t)r0 * nkv * hd, o = (size_t)r0 * H;
        rope_backward(a->d_q + oq, a->pos + r0, a->rope_cos, a->rope_sin, n, nh, hd);
        rope_backward(a->d_k + ok, a->pos + r0, a->rope_cos, a->rope_sin, n, nkv, hd);
        rmsnorm_backward(a->d_q + oq, dwq, a->d_q + oq, L->q_raw + oq, w->q_norm, L->q_rstd + (size_t)r0 * nh,
                         n * nh, hd, 0);
        rmsnorm_backward(a->d_k + ok, dwk, a->d_k + ok, L->k_raw + ok, w->k_norm, L->k_rstd + (size_t)r0 * nkv,
                         n * nkv, hd, 0);
        linear_backward(a->d_tmp + o, NULL, a->d_q + oq, NULL, w->q_proj, n, H, nh * hd, 0);
        linear_backward(a->d_tmp + o, NULL, a->d_k + ok, NULL, w->k_proj, n, H, nkv * hd, 1);
        linear_backward(a->d_tmp + o, NULL, a->d_v + ok, NULL, w->v_proj, n, H, nkv * hd, 1);
    }
    tp_sum_rows_team(tp_par(a->par), a->d_tmp, N, H); /* column-parallel q/k/v: partial input gradient */
    int q0, q1; /* SP: reduce-scattered, the input norm on this rank's rows */
    resid_rows(m, a, r0, r1, &q0, &q1);
    if (q1 > q0) {
        const int lo = resid_row0(m, a);
        const size_t o = (size_t)q0 * H, ol = (size_t)(q0 - lo) * H;
        rmsnorm_backward(a->d_resid + o, dw1, a->d_tmp + o, L->resid_in + ol, w->input_layernorm,
                         L->ln1_rstd + (q0 - lo), q1 - q0, H, 1);
    }
#pragma omp barrier
    wgrad_team(gw->q_proj, a->d_q, L->ln1, N, H, nh * hd);
    wgrad_team(gw->k_proj, a->d_k, L->ln1, N, H, nkv * hd);
    wgrad_team(gw->v_proj, a->d_v, L->ln1, N, H, nkv * hd);
    norm_dw_reduce(gw->q_norm, np.q, hd, np.nt);
    norm_dw_reduce(gw->k_norm, np.k, hd, np.nt);
    norm_dw_reduce(gw->input_layernorm, np.hidden, H, np.nt);
}

/* LM head and final norm backward (team): d_logits per token, d_tmp = d_logits·W_head, d_resid =
 * final RMSNorm backward (∂loss/∂resid_out); after a barrier the head and norm weight
 * gradients. */
static void head_backward_team(moe_model *m, model_acts *a, const float *dlogp, const float *dentropy, int r0,
                               int r1) {
    const moe_config *c = &m->cfg;
    const int N = a->N, H = c->hidden_size, V = c->vocab_size, n = r1 - r0;
    norm_partials np = norm_partials_for(m, a);
    float *dw = norm_dw_slot(np.hidden, m->g.norm, H, np.nt);
    if (n > 0) {
        const size_t o = (size_t)r0 * H, ov = (size_t)r0 * V;
        if (!tp_par(a->par)) /* TP: vp_logprob_backward filled d_logits before the team */
            logprob_backward(a->d_logits + ov, dlogp + r0, dentropy ? dentropy + r0 : NULL, a->logits + ov,
                             a->targets + r0, n, V, a->temperature);
        linear_backward(a->d_tmp + o, NULL, a->d_logits + ov, NULL, m->p.lm_head, n, H, V, 0);
    }
    tp_sum_rows_team(tp_par(a->par), a->d_tmp, N, H); /* vocab-parallel head: partial input gradient */
    int q0, q1; /* SP: reduce-scattered, the final norm on this rank's rows */
    resid_rows(m, a, r0, r1, &q0, &q1);
    if (q1 > q0) {
        const int lo = resid_row0(m, a);
        const size_t o = (size_t)q0 * H, ol = (size_t)(q0 - lo) * H;
        rmsnorm_backward(a->d_resid + o, dw, a->d_tmp + o, a->resid_out + ol, m->p.norm, a->lnf_rstd + (q0 - lo),
                         q1 - q0, H, 0);
    }
#pragma omp barrier
    wgrad_team(m->g.lm_head, a->d_logits, a->lnf, N, H, V);
    norm_dw_reduce(m->g.norm, np.hidden, H, np.nt);
}

/* ------------------------------------------------------------------ activation recompute
 *
 * Under moe_exec_opts.recompute the arena keeps, per decoder layer, only what rc_kept names (the
 * layer input, the routes it used and its per-expert counts; selective: the attention block too);
 * every other buffer of every layer aliases one shared scratch, overwritten layer after layer in
 * the forward. The backward recomputes each layer into that scratch just before its backward
 * (layer l−1's recompute follows layer l's attention backward, inside backward region l, so the
 * FSDP gathers of that region serve it and the model-parallel collectives of every rank line up):
 * the same calls on the same rows of the same teams as the forward, and MoE layers route with
 * the kept routes (route_io.force), so the recomputed buffers — and the gradients — are bit-identical
 * to a run without recompute. Under tensor parallelism the recompute repeats the forward's TP collectives
 * that rebuild a buffer the backward reads (o_proj's row-parallel sum; Megatron SP's ln1 / ln2 all-gathers), in
 * the same order on every rank of the TP group; the MLP output's sum is not repeated (its result, the next layer's
 * input, is kept). docs/parallelism.md, "Activation recompute". */

/* Recompute layer l's forward into the shared scratch: full, its attention input (ln1, q/k/v),
 * the attention, o_proj and the residual; both granularities, the post-attention norm and the MLP
 * (MoE layers on the kept routes, no aux-loss statistics: the forward's stay). The MLP's output
 * goes to d_tmp (free here): the layer's output is the next layer's kept input. */
static void recompute_layer(const moe_model *m, model_acts *a, int l, int nthr) {
    const moe_config *c = &m->cfg;
    layer_acts *L = &a->layers[l];
    const layer_views *w = &m->p.layers[l];
    const int N = a->N, H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads,
              hd = c->head_dim, nhd = nh * hd, full = c->exec.recompute == MODEL_RECOMPUTE_FULL;
    void *sp = attn_shard_par(a->par);
    const double tr = trace_begin();
    if (full) {
#pragma omp parallel num_threads(nthr)
        {
            int r0, r1;
            team_share(N, &r0, &r1);
            attn_in_rows(m, a, l, r0, r1);
        }
        const float scale = 1.0f / sqrtf((float)hd);
        if (sp) model_par_hooks(sp)->attn_forward(sp, l, L->att, L->q, L->k, L->v, scale);
        else if (c->exec.batch_invariant) /* model_forward's kernel choice, so the same bits */
            attention_forward_bi(L->att, L->lse, L->q, L->k, L->v, a->cu_seqlens, a->B, N, nh, nkv, hd, scale);
        else attention_forward(L->att, L->lse, L->q, L->k, L->v, a->cu_seqlens, a->B, N, nh, nkv, hd, scale);
    }
    mlp_acts s2 = L->mlp; /* the router writes its native top-k into scratch; the kept routes stay */
    route_io rt;
    memset(&rt, 0, sizeof rt);
    rt.force = L->mlp.topk_ids;
    if (w->router) s2.topk_ids = a->route_native;
    void *tp = tp_par(a->par);
#pragma omp parallel num_threads(nthr)
    {
        int r0, r1, q0, q1; /* q0, q1: the norm's rows (Megatron SP: this rank's slice, at q − lo in its buffers) */
        team_share(N, &r0, &r1);
        resid_rows(m, a, r0, r1, &q0, &q1);
        const int lo = resid_row0(m, a);
        const size_t o = (size_t)r0 * H, oq = (size_t)q0 * H, ol = (size_t)(q0 - lo) * H;
        if (full && tp) /* TP: o_proj's partial sums all-reduced (SP: reduce-scattered) as in layer_rest_team */
            tp_row_parallel_out(m, a, tp, L->resid_mid, L->att, w->o_proj, L->resid_in, r0, r1, nhd);
        else if (r1 > r0 && full) {
            memcpy(L->resid_mid + o, L->resid_in + o, (size_t)(r1 - r0) * H * sizeof(float));
            lin(m, L->resid_mid + o, L->att + (size_t)r0 * nhd, w->o_proj, r1 - r0, nhd, H, 1);
        }
        if (q1 > q0)
            rmsnorm_forward(L->ln2 + oq, L->ln2_rstd + (q0 - lo), L->resid_mid + ol, w->post_attention_layernorm,
                            q1 - q0, H, c->rms_norm_eps);
        sp_gather_team(tp_sp_par(a->par), L->ln2, N, H); /* SP: the MLP's input, every row */
        mlp_forward_team(m, l, L->ln2, a->d_tmp, &s2, N, NULL, NULL, r0, r1, moe_dispatch_par(a->par),
                         w->router ? &rt : NULL);
    } /* the MLP's output is not needed (the next layer's input is kept): its TP sum is not repeated */
    trace_end("recompute layer", "model", tr);
}

/* Attention backward of layer l (its recomputed or kept q, k, v, att, lse). */
static void attn_backward_layer(model_acts *a, const moe_config *c, int l) {
    layer_acts *La = &a->layers[l];
    const int hd = c->head_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    void *sp = attn_shard_par(a->par);
    const double ta = trace_begin();
    if (sp) model_par_hooks(sp)->attn_backward(sp, l, a->d_q, a->d_k, a->d_v, a->d_att, scale);
    else attention_backward(a->d_q, a->d_k, a->d_v, a->d_att, La->q, La->k, La->v, La->att, La->lse, a->cu_seqlens,
                            a->B, a->N, c->num_attention_heads, c->num_key_value_heads, hd, scale);
    trace_end("bwd attention", "model", ta);
}

/* The embedding's gradient (team, after a barrier): scatter-add the rows of d_resid; each thread
 * owns a block of columns (two tokens may share an id), tokens in order. */
static void embed_backward_team(moe_model *m, model_acts *a) {
    const int H = m->cfg.hidden_size;
    sp_gather_team(tp_sp_par(a->par), a->d_resid, a->N, H); /* SP: every row's ∂resid_in (the reduce-scatter's) */
#pragma omp barrier
    int h0, h1;
    team_share(H, &h0, &h1);
    float *gE = m->g.embed_tokens;
    const int v0 = tp_vocab_lo(&m->cfg), V = m->cfg.vocab_size;
    for (int n = 0; n < a->N; n++) {
        if (a->tokens_in[n] < v0 || a->tokens_in[n] - v0 >= V) continue; /* TP: another rank's row */
        float *row = gE + (size_t)(a->tokens_in[n] - v0) * H;
        const float *d = a->d_resid + (size_t)n * H;
        for (int h = h0; h < h1; h++) row[h] += d[h];
    }
}

/* model_backward under recompute: the same work, events and hooks in the same order per tensor,
 * with layer l−1 recomputed between layer l's attention backward and layer l−1's MLP backward
 * (and the last layer before the head's backward). */
static void model_backward_recompute(moe_model *m, model_acts *a, const float *dlogp, const float *dentropy,
                                     float aux_weight) {
    const int L = m->cfg.num_hidden_layers, N = a->N;
    const int nthr = team_size(m, N), nb = blas_team_begin(nthr);
    const int lo = a->layer_lo, hi = a->layer_hi, head = hi == L;
    PAR_EVENT(a, MODEL_BWD_LAYER, hi); /* hi < L: a pipeline stage's region "layer hi−1's MLP" (FSDP unit hi) */
    recompute_layer(m, a, hi - 1, nthr);
    if (head && tp_par(a->par)) vp_logprob_backward(m, a, tp_vocab_lo(&m->cfg), dlogp, dentropy);
#pragma omp parallel num_threads(nthr)
    {
        int r0, r1;
        team_share(N, &r0, &r1);
        if (head) head_backward_team(m, a, dlogp, dentropy, r0, r1);
        layer_mlp_backward_team(m, a, hi - 1, aux_weight, r0, r1);
    }
    if (head) {
        if (a->layer_hook) a->layer_hook(a->layer_hook_ctx, L);
        PAR_EVENT(a, MODEL_GRAD_READY, L);
    }
    for (int l = hi - 1; l >= lo; l--) {
        attn_backward_layer(a, &m->cfg, l);
        PAR_EVENT(a, MODEL_BWD_LAYER, l);
#pragma omp parallel num_threads(nthr)
        {
            int r0, r1;
            team_share(N, &r0, &r1);
            layer_attn_backward_team(m, a, l, r0, r1);
            if (l == lo && lo == 0) embed_backward_team(m, a);
        }
        if (l > lo) {
            recompute_layer(m, a, l - 1, nthr);
#pragma omp parallel num_threads(nthr)
            {
                int r0, r1;
                team_share(N, &r0, &r1);
                layer_mlp_backward_team(m, a, l - 1, aux_weight, r0, r1);
            }
        }
        if (a->layer_hook) a->layer_hook(a->layer_hook_ctx, l);
        PAR_EVENT(a, MODEL_GRAD_READY, l);
    }
    if (lo == 0) {
        if (a->layer_hook) a->layer_hook(a->layer_hook_ctx, -1);
        PAR_EVENT(a, MODEL_GRAD_READY, -1);
    }
    blas_team_end(nb);
}

void model_backward(moe_model *m, model_acts *a, const float *dlogp, const float *dentropy, float aux_weight) {
    if (m->cfg.exec.recompute) {
        model_backward_recompute(m, a, dlogp, dentropy, aux_weight);
        return;
    }
    const moe_config *c = &m->cfg;
    const int N = a->N, B = a->B, H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads,
              nkv = c->num_key_value_heads, L = c->num_hidden_layers;
    const float scale = 1.0f / sqrtf((float)hd);
    const int nthr = team_size(m, N), nb = blas_team_begin(nthr);
    const int lo = a->layer_lo, hi = a->layer_hi, head = hi == L; /* pipeline stage: see model_acts */
    void *sp = attn_shard_par(a->par), *sp_tp = tp_sp_par(a->par);
    PAR_EVENT(a, MODEL_BWD_LAYER, hi); /* hi < L: a pipeline stage's region "layer hi−1's MLP" (FSDP unit hi) */
    if (head && tp_par(a->par)) vp_logprob_backward(m, a, tp_vocab_lo(c), dlogp, dentropy);
#pragma omp parallel num_threads(nthr)
    {
        int r0, r1;
        team_share(N, &r0, &r1);
        if (head) head_backward_team(m, a, dlogp, dentropy, r0, r1); /* else d_resid is the caller's */
        layer_mlp_backward_team(m, a, hi - 1, aux_weight, r0, r1);
    }
    if (head) {
        if (a->layer_hook) a->layer_hook(a->layer_hook_ctx, L); /* final norm + LM head are final */
        PAR_EVENT(a, MODEL_GRAD_READY, L);
    }
    for (int l = hi - 1; l >= lo; l--) {
        layer_acts *La = &a->layers[l];
        const double ta = trace_begin();
        if (sp) model_par_hooks(sp)->attn_backward(sp, l, a->d_q, a->d_k, a->d_v, a->d_att, scale);
        else attention_backward(a->d_q, a->d_k, a->d_v, a->d_att, La->q, La->k, La->v, La->att, La->lse,
                                a->cu_seqlens, B, N, nh, nkv, hd, scale);
        trace_end("bwd attention", "model", ta);
        PAR_EVENT(a, MODEL_BWD_LAYER, l);
#pragma omp parallel num_threads(nthr)
        {
            int r0, r1;
            team_share(N, &r0, &r1);
            layer_attn_backward_team(m, a, l, r0, r1);
            if (l > lo) {
                layer_mlp_backward_team(m, a, l - 1, aux_weight, r0, r1);
            } else if (lo == 0) { /* a later pipeline stage leaves ∂loss/∂resid_in in d_resid */
                /* embedding: scatter-add rows; each thread owns a block of columns (two tokens
                 * may share an id), tokens in order */
                sp_gather_team(sp_tp, a->d_resid, N, H); /* SP: every row's ∂resid_in (the reduce-scatter's) */
#pragma omp barrier
                int h0, h1;
                team_share(H, &h0, &h1);
                float *gE = m->g.embed_tokens;
                const int v0 = tp_vocab_lo(c), V = c->vocab_size;
                for (int n = 0; n < N; n++) {
                    if (a->tokens_in[n] < v0 || a->tokens_in[n] - v0 >= V) continue; /* TP: another rank's row */
                    float *row = gE + (size_t)(a->tokens_in[n] - v0) * H;
                    const float *d = a->d_resid + (size_t)n * H;
                    for (int h = h0; h < h1; h++) row[h] += d[h];
                }
            }
        }
        if (a->layer_hook) a->layer_hook(a->layer_hook_ctx, l); /* layer l (its MLP was done earlier) */
        PAR_EVENT(a, MODEL_GRAD_READY, l);
    }
    if (lo == 0) {
        if (a->layer_hook) a->layer_hook(a->layer_hook_ctx, -1); /* the embedding scatter is done */
        PAR_EVENT(a, MODEL_GRAD_READY, -1);
    }
    blas_team_end(nb);
}

void mlp_backward(moe_model *m, model_acts *a, int l, const float *x, const float *dout, float *dx, int N) {
    MOERL_ASSERT(N > 0 && N <= a->max_tokens && l >= 0 && l < m->cfg.num_hidden_layers);
    a->N = N;
    const int nthr = team_size(m, N), nb = blas_team_begin(nthr);
#pragma omp parallel num_threads(nthr)
    {
        int r0, r1;
        team_share(N, &r0, &r1);
        if (m->p.layers[l].router) moe_backward_team(m, a, l, &a->layers[l].mlp, x, dout, dx, a->N, 0.0f, r0, r1);
        else dense_backward_team(m, a, l, x, dout, dx, r0, r1);
    }
    blas_team_end(nb);
}
