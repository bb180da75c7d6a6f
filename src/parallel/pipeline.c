/* Pipeline parallelism: stage partition, micro-batch plan, the 1F1B schedule (plain and interleaved),
 * stage-local ownership. See pipeline.h. */
#include "parallel/pipeline.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "model/perf.h"

pp_options pp_options_default(void) {
    pp_options o = {.dynamic = 1, .mb_min = 4, .mb_max = 16, .min_mb_tokens = 64, .prefetch = 1, .progress_us = 50,
                    .overlap_grads = 1};
    return o;
}

/* ------------------------------------------------------------------ partition */

int pp_partition(const moe_config *c, int pp, int seq_len, int *bounds, double *stage_cost) {
    const int L = c->num_hidden_layers;
    if (pp < 1 || pp > L)
        return moerl_errorf("pipeline: %d stages for a model of %d layer%s (expected 1..%d: a stage needs a layer)",
                            pp, L, moerl_plural(L), L);
    if (seq_len < 1) return moerl_errorf("pipeline: balance sequence length %d, expected ≥ 1", seq_len);
    const int64_t pairs = (int64_t)seq_len * (seq_len + 1) / 2;
    double *pre = xmalloc((L + 1) * sizeof(double)); /* prefix sums of the layer costs */
    pre[0] = 0;
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + model_layer_train_flops(c, l, seq_len, pairs);
    const double head = model_layer_train_flops(c, L, seq_len, pairs);
    /* best[s][j]: the smallest largest-stage cost of layers [0, j) in s+1 stages; cut[s][j] its last cut */
    double *best = xmalloc((size_t)pp * (L + 1) * sizeof(double));
    int *cut = xmalloc((size_t)pp * (L + 1) * sizeof(int));
#define BEST(s, j) best[(size_t)(s) * (L + 1) + (j)]
#define CUT(s, j) cut[(size_t)(s) * (L + 1) + (j)]
    for (int j = 0; j <= L; j++) {
        BEST(0, j) = pre[j] + (j == L && pp == 1 ? head : 0);
        CUT(0, j) = 0;
    }
    for (int s = 1; s < pp; s++)
        for (int j = 0; j <= L; j++) {
            BEST(s, j) = DBL_MAX;
            CUT(s, j) = -1;
            for (int i = s; i < j; i++) { /* stages 0..s−1 hold [0, i) (≥ 1 layer each), stage s holds [i, j) */
                if (BEST(s - 1, i) == DBL_MAX) continue;
                const double own = pre[j] - pre[i] + (j == L && s == pp - 1 ? head : 0);
                const double v = MOERL_MAX(BEST(s - 1, i), own);
                if (v < BEST(s, j)) {
                    BEST(s, j) = v;
                    CUT(s, j) = i;
                }
            }
        }
    bounds[pp] = L;
    for (int s = pp - 1, j = L; s >= 0; s--) {
        bounds[s] = CUT(s, j);
        j = bounds[s];
    }
    if (stage_cost)
        for (int s = 0; s < pp; s++)
            stage_cost[s] = pre[bounds[s + 1]] - pre[bounds[s]] + (s == pp - 1 ? head : 0);
#undef BEST
#undef CUT
    free(best);
    free(cut);
    free(pre);
    return MOERL_OK;
}

/* ------------------------------------------------------------------ micro-batch plan */

/* Split seqs into exactly c contiguous micro-batches (c in [the greedy count at max_tokens, n]) of the
 * smallest largest size: the smallest cap C in [longest, max_tokens] whose greedy packing makes ≤ c
 * (binary search; the greedy count falls as C grows), then the fullest micro-batch of ≥ 2 sequences is
 * cut in two, at the point that leaves the smaller larger half, until there are c (a cut never raises
 * the largest size, so it stays the optimum C of c contiguous parts). mb needs n+1 entries. */
static void pack_exact(const train_seq *seqs, int n, int longest, int max_tokens, int c, int *mb) {
    int lo = longest, hi = max_tokens;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (pack_microbatches(seqs, n, mid, mb) <= c) hi = mid;
        else lo = mid + 1;
    }
    int k = pack_microbatches(seqs, n, lo, mb);
    while (k < c) {
        int best = -1;
        int64_t best_tok = -1;
        for (int j = 0; j < k; j++) {
            if (mb[j + 1] - mb[j] < 2) continue;
            int64_t t = 0;
            for (int i = mb[j]; i < mb[j + 1]; i++) t += seqs[i].len;
            if (t > best_tok) best_tok = t, best = j;
        }
        int64_t left = 0, cut_best = INT64_MAX;
        int cut = mb[best] + 1;
        for (int i = mb[best] + 1; i < mb[best + 1]; i++) { /* cut before sequence i */
            left += seqs[i - 1].len;
            const int64_t worse = MOERL_MAX(left, best_tok - left);
            if (worse < cut_best) cut_best = worse, cut = i;
        }
        memmove(mb + best + 2, mb + best + 1, (size_t)(k - best) * sizeof(int));
        mb[best + 1] = cut;
        k++;
    }
}

int pp_plan_microbatches(const train_seq *seqs, int n, int max_tokens, int pp, const pp_options *opt, int *mb) {
    const pp_options d = pp_options_default();
    if (!opt) opt = &d;
    const int v = opt->virtual_stages > 1 ? opt->virtual_stages : 1;
    const int m_min = pack_microbatches(seqs, n, max_tokens, mb); /* the fewest contiguous micro-batches */
    if (m_min < 0) return MOERL_ERR;
    int m = m_min;
    int64_t T = 0;
    int longest = 0;
    for (int i = 0; i < n; i++) {
        T += seqs[i].len;
        longest = MOERL_MAX(longest, seqs[i].len);
    }
#define PP_COUNT_OK(k) ((k) >= pp && (v == 1 || (k) % pp == 0)) /* the schedule's rule */
    if (opt->dynamic && n > 0) {
        int64_t by_tokens = opt->min_mb_tokens > 0 ? T / opt->min_mb_tokens : opt->mb_max;
        int target = (int)MOERL_MIN(by_tokens, (int64_t)opt->mb_max);
        target = MOERL_MAX(target, MOERL_MAX(opt->mb_min, pp));
        if (v == 1 && m < target) {
            int cap = (int)MOERL_MAX((int64_t)longest, (T + target - 1) / target);
            cap = MOERL_MIN(cap, max_tokens);
            int m2 = pack_microbatches(seqs, n, cap, mb);
            if (m2 < 0) return MOERL_ERR;
            m = m2;
        } else if (v > 1 && (m < target || m % pp)) {
            /* interleaved: the smallest count from the target up that is a multiple of pp (the greedy
             * packing need not hit the target exactly, so the caps are tried in turn) */
            target = (target + pp - 1) / pp * pp;
            for (int t = target; t <= MOERL_MAX(n, target); t++) {
                int cap = (int)MOERL_MAX((int64_t)longest, (T + t - 1) / t);
                cap = MOERL_MIN(cap, max_tokens);
                const int m2 = pack_microbatches(seqs, n, cap, mb);
                if (m2 < 0) return MOERL_ERR;
                m = m2;
                if (PP_COUNT_OK(m2)) break;
            }
        }
        if (!PP_COUNT_OK(m)) {
            /* the caps above missed the rule (equal lengths: a cap below two sequences packs one each):
             * any count c in [m_min, n] is a contiguous packing (a micro-batch of ≥ 2 sequences splits
             * in two), so take the allowed c nearest the target (the smallest ≥ it, else the largest
             * below) and split exactly c ways, balanced */
            int c = -1;
            for (int k = MOERL_MAX(m_min, target); k <= n && c < 0; k++)
                if (PP_COUNT_OK(k)) c = k;
            for (int k = MOERL_MIN(n, target - 1); k >= m_min && c < 0; k--)
                if (PP_COUNT_OK(k)) c = k;
            if (c > 0) {
                pack_exact(seqs, n, longest, max_tokens, c, mb);
                m = c;
            } else {
                m = pack_microbatches(seqs, n, max_tokens, mb); /* none exists: the error below names it */
            }
        }
    }
#undef PP_COUNT_OK
    const int m_max = opt->dynamic ? n : m; /* the most micro-batches the packing could make */
    if (m_max < pp)
        return moerl_errorf("pipeline: this batch makes %d micro-batch%s (%d sequences, %lld tokens, at most %d tokens per "
                            "micro-batch) but %d pipeline stages need at least %d: give each pipeline at least %d "
                            "sequences%s, or lower actor.pipeline_parallel_size",
                            m_max, m_max == 1 ? "" : "es", n, (long long)T, max_tokens, pp, pp, pp,
                            opt->dynamic ? "" : " or lower the micro-batch token limit");
    if (v > 1 && m % pp) {
        char makes[64];
        if (opt->dynamic && m_max > m) snprintf(makes, sizeof makes, "%d to %d micro-batches, none of them", m, m_max);
        else snprintf(makes, sizeof makes, "%d micro-batches", m);
        return moerl_errorf("pipeline: the interleaved schedule (actor.virtual_pipeline_parallel_size=%d) needs a "
                            "micro-batch count that is a multiple of actor.pipeline_parallel_size=%d, but this batch "
                            "makes %s (%d sequences, %lld tokens, at most %d tokens per micro-batch): it needs %d%s, "
                            "or set actor.virtual_pipeline_parallel_size=1",
                            v, pp, makes, n, (long long)T, max_tokens, (m + pp - 1) / pp * pp,
                            opt->dynamic ? " (give each pipeline more sequences, or raise the micro-batch token limit)"
                                         : " (change the micro-batch token limit or the number of sequences)");
    }
    return m;
}

int pp_count_needed(int n, int seq_len, int max_tokens, int pp, int v) {
    if (seq_len < 1 || max_tokens < seq_len) return -1;
    const int per = max_tokens / seq_len; /* sequences of seq_len tokens per micro-batch */
    const int fewest = MOERL_MAX((MOERL_MAX(n, 0) + per - 1) / per, pp);
    return v > 1 ? (fewest + pp - 1) / pp * pp : fewest; /* the smallest allowed count ≥ fewest */
}

int pp_count_allowed(int n, int seq_len, int max_tokens, int pp, int v) {
    if (n <= 0) return 1; /* no sequences: the pipeline has no update to schedule */
    const int c = pp_count_needed(n, seq_len, max_tokens, pp, v);
    return c >= 0 && c <= n;
}

/* ------------------------------------------------------------------ schedule order */

int pp_schedule(int pp, int stage, int v, int m, int *kind, int *chunk, int *mbi) {
    int n = 0;
    if (v <= 1) { /* 1F1B: W warm-up forwards, steady pairs, cool-down backwards */
        const int W = MOERL_MIN(pp - stage - 1, m);
#define OP(f, c, j) (kind[n] = (f), chunk[n] = (c), mbi[n] = (j), n++)
        for (int j = 0; j < W; j++) OP(0, 0, j);
        for (int i = 0; i < m - W; i++) {
            OP(0, 0, W + i);
            OP(1, 0, i);
        }
        for (int i = m - W; i < m; i++) OP(1, 0, i);
        return n;
    }
    /* interleaved (Megatron-LM): the k-th forward of a rank is chunk (k mod pv)/p of micro-batch
     * (k / pv)·p + k mod p — groups of p micro-batches walk through the chunks —, the k-th backward
     * the same micro-batch of chunk v − 1 − (k mod pv)/p; warm-up (p − s − 1)·2 + (v − 1)·p forwards
     * (all of them when m = p), then 1F1B pairs, then the cool-down backwards */
    if (m % pp)
        return moerl_errorf("pipeline: the interleaved schedule needs a micro-batch count that is a multiple of "
                            "actor.pipeline_parallel_size=%d, got %d", pp, m);
    const int tot = m * v, pv = pp * v;
    const int W = m == pp ? tot : MOERL_MIN((pp - stage - 1) * 2 + (v - 1) * pp, tot);
#define FWD(k) OP(0, ((k) % pv) / pp, ((k) / pv) * pp + (k) % pp)
#define BWD(k) OP(1, v - 1 - ((k) % pv) / pp, ((k) / pv) * pp + (k) % pp)
    for (int k = 0; k < W; k++) FWD(k);
    for (int i = 0; i < tot - W; i++) {
        FWD(W + i);
        BWD(i);
    }
    for (int k = tot - W; k < tot; k++) BWD(k);
#undef FWD
#undef BWD
#undef OP
    return n;
}

/* ------------------------------------------------------------------ state */

typedef struct {
    model_acts a;
    int *tok, *cu, *tgt, *seq_of, *resp_index;
    float *dlogp, *dent;
    int16_t *routes, *rec; /* [N, n_moe, K]: the micro-batch's replayed routes, its native routes (routing replay) */
    float *fa, *ba;        /* [2E] counts and probability sums of virtual stages 0..k; [E] the micro-batch's counts */
    int fwd_posted;        /* micro-batch whose input receive is posted into this slot, −1 none */
    int grad_posted;       /* micro-batch whose gradient receive is posted, −1 none */
    dist_req *rq_h, *rq_fa, *rq_g, *rq_ba; /* receives: hidden, forward aux, d hidden, backward aux */
    dist_req *sq_h, *sq_fa, *sq_g, *sq_ba; /* sends of the same */
} pp_slot;

/* The overlapped gradient sum (pp_options.overlap_grads): a thread that sums a chunk's gradient
 * range over grid.stage_comm (the same blocking calls, in the same order, as the sum after the
 * schedule) as soon as the chunk's last backward is done. */
typedef struct {
    pthread_t th;
    int running;  /* the thread exists (until grad_sum_join) */
    int started;  /* this step's sums were handed to the thread: pp_finish_grads waits instead of summing */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int queue[PP_MAX_CHUNKS], nq, head, closed, rc;
    char err[256];
} grad_sum;

struct pp_state {
    dist_comm *comm;
    int pp, stage, v, nv;     /* stages, this stage, chunks per stage, virtual stages pp·v */
    int lo, hi, L, E, H, aux; /* lo, hi: chunk 0's layers; aux: the model has MoE layers (aux messages travel) */
    int *bounds;              /* [nv+1]: virtual stage k = chunk k / pp of stage k mod pp holds [bounds[k], bounds[k+1]) */
    int max_tokens;
    int n_slots[PP_MAX_CHUNKS];
    pp_slot *slots[PP_MAX_CHUNKS];
    int cur_m;                /* micro-batches of the schedule running (message tags) */
    int *done_c;              /* [v] backwards done per chunk in this step */
    pp_options opt;
    pp_stats st;
    double wait_s, busy_s;
    /* stage-local ownership (pp_own_stage): m holds this stage's units only */
    moe_model *own_m;       /* NULL: the model is replicated (the caller sums over all trainers) */
    dist_comm *stage_comm;  /* the stage's data-parallel ranks (gradient sum) */
    size_t own_lo, own_hi;  /* hull of this stage's ranges (v = 1: its one range) */
    size_t own_n;           /* floats this stage owns: Σ of its chunks' ranges */
    size_t coff[PP_MAX_CHUNKS + 1]; /* chunk c's first float in the compact (moment) layout */
    size_t emb_lo, emb_hi;  /* the embedding unit (tied head: the last stage holds a copy) */
    size_t *st_lo, *st_hi;  /* [nv]: every virtual stage's range */
    int tied;               /* tied embeddings and pp > 1: first and last stage share the embedding */
    size_t map_bytes;
    adamw_range *ranges;    /* this stage's tensors, chunk c's in [r0[c], r0[c+1]), offsets relative to its range */
    int r0[PP_MAX_CHUNKS + 1];
    grad_sum gs;
    /* pipeline × FSDP (pp_set_sharded): FSDP owns the stage's memory and gradient sums */
    moe_model *lay_m;       /* the model whose layout st_lo / st_hi describe (pp_exchange_layout) */
    void *fwd_par;          /* model_acts.par of the forward-only passes (the FSDP gathers); NULL: none */
    dist_comm *uniform;     /* the ranks whose schedules must match pass for pass (grid.stage_comm); NULL: none */
    int ext_grads;          /* 1: pp_zero_grad leaves the gradients to FSDP */
    /* TP × pipeline (pp_set_norm_squares): this stage's share of the squared gradient norm; NULL: its ranges' */
    double (*sq_fn)(void *ctx);
    void *sq_ctx;
    /* pipeline × EP (pp_set_experts) */
    int experts;            /* 1: expert tensors summed over ex_dp, their squares over ex_group */
    dist_comm *ex_dp, *ex_group;
    pp_expert_hooks xh;
    unsigned char *rexp;    /* [ranges]: the tensor is an expert's (TF_EXPERT) */
};

static int vstage(const pp_state *s, int c) { return c * s->pp + s->stage; }
static size_t piece_lo(const pp_state *s, int c) { return s->st_lo[vstage(s, c)]; }
static size_t piece_n(const pp_state *s, int c) { return s->st_hi[vstage(s, c)] - s->st_lo[vstage(s, c)]; }

static void slots_free_chunk(pp_state *s, int c) {
    for (int k = 0; k < s->n_slots[c] && s->slots[c]; k++) {
        pp_slot *sl = &s->slots[c][k];
        if (sl->a.arena) model_acts_free(&sl->a);
        free(sl->tok); free(sl->cu); free(sl->tgt); free(sl->seq_of); free(sl->resp_index);
        free(sl->dlogp); free(sl->dent); free(sl->fa); free(sl->ba); free(sl->routes); free(sl->rec);
    }
    free(s->slots[c]);
    s->slots[c] = NULL;
    s->n_slots[c] = 0;
}

static void slots_free(pp_state *s) {
    for (int c = 0; c < s->v; c++) slots_free_chunk(s, c);
    s->max_tokens = 0;
}

/* Activation slots for micro-batches of up to max_tokens tokens, at least need[c] for chunk c (the
 * schedule's largest number of chunk-c micro-batches in flight: a chunk's forwards and backwards
 * run in micro-batch order, so micro-batch j uses slot j mod n_slots[c]). Kept while big enough. */
static int slots_ensure(pp_state *s, const moe_model *m, int max_tokens, const int *need) {
    if (max_tokens > s->max_tokens) slots_free(s);
    s->max_tokens = MOERL_MAX(s->max_tokens, max_tokens);
    const size_t N = (size_t)s->max_tokens, E = s->E > 0 ? s->E : 1;
    for (int c = 0; c < s->v; c++) {
        if (s->slots[c] && s->n_slots[c] >= need[c]) continue;
        slots_free_chunk(s, c);
        s->n_slots[c] = need[c];
        s->slots[c] = xcalloc(need[c], sizeof(pp_slot));
        const int vs = vstage(s, c);
        for (int k = 0; k < need[c]; k++) {
            pp_slot *sl = &s->slots[c][k];
            sl->fwd_posted = sl->grad_posted = -1;
            if (model_acts_init_range(&sl->a, m, s->max_tokens, s->bounds[vs], s->bounds[vs + 1]) != MOERL_OK) {
                slots_free(s);
                return MOERL_ERR;
            }
            sl->tok = xmalloc(N * sizeof(int));
            sl->cu = xmalloc((N + 1) * sizeof(int));
            sl->tgt = xmalloc(N * sizeof(int));
            sl->seq_of = xmalloc(N * sizeof(int));
            sl->resp_index = xmalloc(N * sizeof(int));
            sl->dlogp = xmalloc(N * sizeof(float));
            sl->dent = xmalloc(N * sizeof(float));
            sl->fa = xcalloc(2 * E, sizeof(float));
            sl->ba = xcalloc(E, sizeof(float));
            const size_t per = (size_t)model_moe_layer_count(&m->cfg) * m->cfg.num_experts_per_tok;
            sl->routes = xmalloc((N * per + 1) * sizeof(int16_t));
            sl->rec = xmalloc((N * per + 1) * sizeof(int16_t));
        }
    }
    return MOERL_OK;
}

pp_state *pp_state_new(const par_grid *g, const moe_model *m, const pp_options *opt) {
    const moe_config *c = &m->cfg;
    if (!g || !g->pp_comm) {
        moerl_errorf("pipeline: no trainer grid (pp_comm) to run the stages on");
        return NULL;
    }
    pp_state *s = xcalloc(1, sizeof *s);
    s->opt = opt ? *opt : pp_options_default();
    s->comm = g->pp_comm;
    s->stage_comm = g->tp > 1 ? g->dp_comm : g->stage_comm; /* TP × pipeline: the ranks holding this TP slice */
    s->pp = g->pp;
    s->stage = g->stage;
    s->v = s->opt.virtual_stages > 0 ? s->opt.virtual_stages
                                     : MOERL_MAX(1, g->cfg.virtual_pipeline_parallel_size);
    s->opt.virtual_stages = s->v;
    s->L = c->num_hidden_layers;
    s->E = c->num_experts;
    s->H = c->hidden_size;
    for (int l = 0; l < s->L; l++) s->aux |= moe_config_layer_is_moe(c, l);
    if (s->v > PP_MAX_CHUNKS || (s->v > 1 && s->pp < 2)) {
        moerl_errorf("actor.virtual_pipeline_parallel_size=%d: expected 1..%d chunks per stage, and more than 1 only "
                     "with actor.pipeline_parallel_size ≥ 2 (it is %d)", s->v, PP_MAX_CHUNKS, s->pp);
        free(s);
        return NULL;
    }
    s->nv = s->pp * s->v;
    s->bounds = xmalloc((s->nv + 1) * sizeof(int));
    s->done_c = xcalloc(s->v, sizeof(int));
    double *cost = xmalloc(s->nv * sizeof(double));
    const int bal = s->opt.balance_seq_len > 0 ? s->opt.balance_seq_len
                                                : MOERL_MAX(1, MOERL_MIN(c->max_position_embeddings, 4096));
    if (s->nv > s->L) {
        moerl_errorf("pipeline: actor.pipeline_parallel_size=%d × actor.virtual_pipeline_parallel_size=%d = %d model "
                     "chunks exceed the model's %d layer%s (a chunk needs ≥ 1 layer)", s->pp, s->v, s->nv, s->L,
                     moerl_plural(s->L));
        free(cost);
        pp_state_free(s);
        return NULL;
    }
    if (pp_partition(c, s->nv, bal, s->bounds, cost) != MOERL_OK) {
        free(cost);
        pp_state_free(s);
        return NULL;
    }
    s->lo = s->bounds[s->stage];
    s->hi = s->bounds[s->stage + 1];
    if (!s->opt.quiet && s->stage == 0 && g->d == 0) {
        double tot = 0;
        for (int k = 0; k < s->nv; k++) tot += cost[k];
        char line[2048];
        int o = 0;
        for (int k = 0; k < s->nv && o < (int)sizeof line - 100; k++) {
            char who[48];
            if (s->v > 1) snprintf(who, sizeof who, "stage %d chunk %d", k % s->pp, k / s->pp);
            else snprintf(who, sizeof who, "stage %d", k);
            o += snprintf(line + o, sizeof line - o, "%s%s: layers %d-%d%s%s (%.1f%% of FLOPs)", k ? "; " : "", who,
                          s->bounds[k], s->bounds[k + 1] - 1, k == 0 ? " + embedding" : "",
                          k == s->nv - 1 ? " + norm, LM head" : "", 100.0 * cost[k] / tot);
        }
        if (s->v > 1)
            log_info("pipeline partition (%d stages × %d interleaved chunks, balanced for %d-token sequences): %s",
                     s->pp, s->v, bal, line);
        else
            log_info("pipeline partition (%d stages, balanced for %d-token sequences): %s", s->pp, bal, line);
    }
    free(cost);
    return s;
}

static int grad_sum_join(pp_state *s);

void pp_state_free(pp_state *s) {
    if (!s) return;
    grad_sum_join(s);
    if (s->own_m && pp_release_stage(s) != MOERL_OK)
        moerl_fatal("pipeline stage %d: assembling the whole model: %s", s->stage, moerl_last_error());
    free(s->st_lo);
    free(s->st_hi);
    free(s->ranges);
    free(s->rexp);
    slots_free(s);
    free(s->bounds);
    free(s->done_c);
    free(s);
}

void pp_set_options(pp_state *s, const pp_options *opt) {
    s->opt = *opt;
    s->opt.virtual_stages = s->v; /* fixed at creation (the cut and the ownership depend on it) */
}

void pp_stage_layers(const pp_state *s, int *lo, int *hi) {
    *lo = s->lo;
    *hi = s->hi;
}

int pp_chunks(const pp_state *s) { return s->v; }

void pp_chunk_layers(const pp_state *s, int c, int *lo, int *hi) {
    *lo = s->bounds[vstage(s, c)];
    *hi = s->bounds[vstage(s, c) + 1];
}

const int *pp_bounds(const pp_state *s) { return s->bounds; }
const pp_stats *pp_last_stats(const pp_state *s) { return &s->st; }

double pp_slots_bytes(const pp_state *s) {
    double b = 0;
    for (int c = 0; c < s->v; c++)
        for (int k = 0; k < s->n_slots[c] && s->slots[c]; k++) b += (double)s->slots[c][k].a.arena_bytes;
    return b;
}

int pp_metrics(const pp_state *s, const char **keys, double *vals) {
    if (!s) return 0;
    pp_window w = {0};
    pp_window_add(&w, &s->st);
    return pp_window_metrics(&w, keys, vals);
}

void pp_window_merge(pp_window *a, const pp_window *b) {
    if (!b->schedules) return;
    a->stages = b->stages;
    a->virtual_stages = b->virtual_stages;
    a->bubble_max = a->schedules ? MOERL_MAX(a->bubble_max, b->bubble_max) : b->bubble_max;
    a->schedules += b->schedules;
    a->step_s += b->step_s;
    a->idle_s += b->idle_s;
    a->wait_s += b->wait_s;
    a->microbatches += b->microbatches;
}

int pp_window_over_replicas(pp_window *w, dist_comm *stage_comm) {
    const int D = stage_comm ? dist_comm_size(stage_comm) : 1;
    if (D <= 1) return MOERL_OK;
    /* the sums, then each replica's bubble_max in its own slot (−1: no schedule), one sum for all */
    double *s = xcalloc((size_t)D + 5, sizeof(double));
    s[0] = w->schedules, s[1] = w->step_s, s[2] = w->idle_s, s[3] = w->wait_s, s[4] = w->microbatches;
    s[5 + dist_comm_rank(stage_comm)] = w->schedules ? w->bubble_max : -1.0;
    const int rc = dist_comm_allreduce_f64(stage_comm, s, (size_t)D + 5);
    if (rc == MOERL_OK) {
        w->schedules = (int)llround(s[0]);
        w->step_s = s[1];
        w->idle_s = s[2];
        w->wait_s = s[3];
        w->microbatches = s[4];
        double mx = -1.0;
        for (int d = 0; d < D; d++) mx = fmax(mx, s[5 + d]);
        if (w->schedules) w->bubble_max = mx;
    }
    free(s);
    return rc;
}

void pp_window_add(pp_window *w, const pp_stats *st) {
    if (st->stages < 1) return; /* no schedule ran */
    const pp_window one = {.schedules = 1, .stages = st->stages, .virtual_stages = st->virtual_stages,
                           .step_s = st->step_s, .idle_s = st->bubble_mean * st->step_s,
                           .wait_s = st->wait_share_mean * st->step_s, .bubble_max = st->bubble_max,
                           .microbatches = st->microbatches};
    pp_window_merge(w, &one);
}

int pp_window_metrics(const pp_window *w, const char **keys, double *vals) {
    if (!w->schedules) return 0;
    static const char *k[PP_N_METRICS] = {"perf/pipeline_bubble", "perf/pipeline_bubble_max",
                                          "perf/pipeline_bubble_theory", "perf/pipeline_bubble_theory_interleaved",
                                          "perf/pipeline_recv_wait", "perf/pipeline_microbatches",
                                          "perf/pipeline_virtual_stages"};
    const double P = w->stages, V = w->virtual_stages, m = w->microbatches / w->schedules;
    const double v[PP_N_METRICS] = {w->step_s > 0 ? w->idle_s / w->step_s : 0, w->bubble_max,
                                    (P - 1) / (m + P - 1), (P - 1) / (V * m + P - 1),
                                    w->step_s > 0 ? w->wait_s / w->step_s : 0, m, V};
    for (int i = 0; i < PP_N_METRICS; i++) {
        keys[i] = k[i];
        vals[i] = v[i];
    }
    return PP_N_METRICS;
}

/* ------------------------------------------------------------------ schedule */

/* Four message kinds per (destination virtual stage, micro-batch); tags stay below 32768. */
static int tag_of(const pp_state *s, int vs_dest, int j, int k) {
    return (int)(((int64_t)vs_dest * s->cur_m + j) % 8000) * 4 + k;
}
static int prev_rank(const pp_state *s) { return (s->stage + s->pp - 1) % s->pp; }
static int next_rank(const pp_state *s) { return (s->stage + 1) % s->pp; }

/* Wait for a request, counting the time as idle (blocked on the pipeline). */
static void wait_idle(pp_state *s, dist_req **r) {
    if (!*r) return;
    const double t0 = moerl_now();
    if (dist_wait(*r) != MOERL_OK) moerl_fatal("pipeline stage %d: %s", s->stage, moerl_last_error());
    *r = NULL;
    s->wait_s += moerl_now() - t0;
}

typedef struct {
    const train_seq *seqs;
    const int *mb, *N;     /* micro-batch starts [m+1], tokens [m] */
    int m;
    int64_t total;
    const train_step_opts *o;
    token_grad_fn fn;
    void *ctx;
    moe_model *model;
    train_step_out *out;
    double *psum_out, *counts_out; /* last stage: [E] each */
} pp_run;

static pp_slot *slot_of(pp_state *s, int c, int j) { return &s->slots[c][j % s->n_slots[c]]; }

/* Pipeline × EP: the expert side's saved state for micro-batch j's pass on chunk c (its slot). */
static void stage_slot(const pp_state *s, int c, int j) {
    if (!s->xh.use_slot) return;
    int k = 0, n = 0;
    for (int i = 0; i < s->v; i++) {
        if (i < c) k += s->n_slots[i];
        n += s->n_slots[i];
    }
    s->xh.use_slot(s->xh.ctx, k + j % s->n_slots[c], n);
}

/* Post the receive of micro-batch j's input to chunk c (all virtual stages but the first). */
static void post_input(pp_state *s, const pp_run *r, int c, int j) {
    pp_slot *sl = slot_of(s, c, j);
    const int vs = vstage(s, c);
    if (vs == 0 || sl->fwd_posted == j) return;
    wait_idle(s, &sl->sq_fa); /* fa was sent on by the slot's previous micro-batch */
    sl->rq_h = dist_comm_irecv_f32(s->comm, prev_rank(s), tag_of(s, vs, j, 0), sl->a.layers[s->bounds[vs]].resid_in,
                                   (size_t)r->N[j] * s->H);
    if (s->aux)
        sl->rq_fa = dist_comm_irecv_f32(s->comm, prev_rank(s), tag_of(s, vs, j, 1), sl->fa, 2 * (size_t)s->E);
    sl->fwd_posted = j;
}

/* Post the receive of micro-batch j's output gradient to chunk c (all virtual stages but the last). */
static void post_grad(pp_state *s, const pp_run *r, int c, int j) {
    pp_slot *sl = slot_of(s, c, j);
    const int vs = vstage(s, c);
    if (vs == s->nv - 1 || sl->grad_posted == j) return;
    wait_idle(s, &sl->sq_g); /* d_resid and ba were sent back by the slot's previous micro-batch */
    wait_idle(s, &sl->sq_ba);
    sl->rq_g = dist_comm_irecv_f32(s->comm, next_rank(s), tag_of(s, vs, j, 2), sl->a.d_resid, (size_t)r->N[j] * s->H);
    if (s->aux) sl->rq_ba = dist_comm_irecv_f32(s->comm, next_rank(s), tag_of(s, vs, j, 3), sl->ba, (size_t)s->E);
    sl->grad_posted = j;
}

/* Routing replay on a slot: the micro-batch's replayed routes (train_seq.routes; NULL when no sequence
 * carries any) and, when ro asks for a record or comparison, the native routes' buffer. */
static void slot_routes(pp_slot *sl, const moe_model *m, const train_seq *seqs, int b0, int b1,
                        const train_route_opts *ro) {
    const int per = model_moe_layer_count(&m->cfg) * m->cfg.num_experts_per_tok;
    sl->a.replay_routes = per > 0 ? train_pack_routes(seqs, b0, b1, sl->routes, per) : NULL;
    sl->a.routes_out = per > 0 && ro ? sl->rec : NULL;
}

static void idle_events(const pp_state *s, void *par, int vs, int backward);

static void forward_step(pp_state *s, pp_run *r, int c, int j) {
    pp_slot *sl = slot_of(s, c, j);
    const int vs = vstage(s, c), last = vs == s->nv - 1, E = s->E;
    model_acts *a = &sl->a;
    if (vs > 0) {
        post_input(s, r, c, j); /* no-op when prefetched */
        wait_idle(s, &sl->rq_h);
        wait_idle(s, &sl->rq_fa);
        sl->fwd_posted = -1;
    }
    /* the slot's previous micro-batch must have left before its buffers are written again: resid_out
     * and fa (written below on every stage; the first posts no receive that would have waited for fa),
     * ba (the last stage copies into it) */
    wait_idle(s, &sl->sq_h);
    wait_idle(s, &sl->sq_fa);
    wait_idle(s, &sl->sq_ba);
    const double t0 = moerl_now();
    const int b0 = r->mb[j], b1 = r->mb[j + 1];
    stage_slot(s, c, j);
    if (b0 == b1) { /* an empty micro-batch (agree_count): the layer events, no rows; the counts pass on */
        idle_events(s, r->o->par, vs, 0);
        for (int e = 0; e < 2 * E && s->aux && vs == 0; e++) sl->fa[e] = 0.0f;
        if (last) {
            if (s->aux) memcpy(sl->ba, sl->fa, E * sizeof(float));
            return;
        }
        sl->sq_h = dist_comm_isend_f32(s->comm, next_rank(s), tag_of(s, vs + 1, j, 0), a->resid_out, 0);
        if (s->aux)
            sl->sq_fa = dist_comm_isend_f32(s->comm, next_rank(s), tag_of(s, vs + 1, j, 1), sl->fa, 2 * (size_t)E);
        if (s->opt.prefetch) post_grad(s, r, c, j);
        return;
    }
    const int N = train_pack(r->seqs, b0, b1, sl->tok, sl->cu, sl->tgt, sl->seq_of, sl->resp_index);
    a->par = r->o->par;
    slot_routes(sl, r->model, r->seqs, b0, b1, r->o->routes);
    if (model_forward(r->model, a, sl->tok, sl->cu, NULL, b1 - b0, N) != MOERL_OK)
        moerl_fatal("pipeline stage %d chunk %d, micro-batch %d: %s", s->stage, c, j, moerl_last_error());
    train_route_visit(r->model, a, r->seqs, b0, sl->cu, a->routes_out, r->o->routes);
    if (s->aux) { /* running sums of the router statistics over virtual stages 0..vs */
        for (int e = 0; e < E; e++) {
            sl->fa[e] = (vs ? sl->fa[e] : 0.0f) + a->aux_counts[e];
            sl->fa[E + e] = (vs ? sl->fa[E + e] : 0.0f) + a->aux_psum[e];
        }
    }
    if (!last) {
        s->busy_s += moerl_now() - t0;
        sl->sq_h = dist_comm_isend_f32(s->comm, next_rank(s), tag_of(s, vs + 1, j, 0), a->resid_out, (size_t)N * s->H);
        if (s->aux)
            sl->sq_fa = dist_comm_isend_f32(s->comm, next_rank(s), tag_of(s, vs + 1, j, 1), sl->fa, 2 * (size_t)E);
        if (s->opt.prefetch) post_grad(s, r, c, j);
        return;
    }
    /* last virtual stage: the model's router statistics, the loss and the token gradients */
    const train_step_opts *o = r->o;
    if (s->aux) {
        memcpy(a->aux_counts, sl->fa, E * sizeof(float));
        memcpy(a->aux_psum, sl->fa + E, E * sizeof(float));
        memcpy(sl->ba, sl->fa, E * sizeof(float));
        a->aux_loss = moe_aux_loss(a->aux_counts, a->aux_psum, E, (int64_t)a->n_moe_layers * N);
        for (int e = 0; e < E; e++) {
            r->psum_out[e] += a->aux_psum[e];
            r->counts_out[e] += a->aux_counts[e];
        }
    } else {
        a->aux_loss = 0.0f;
    }
    model_logprobs(r->model, a, sl->tgt, o->temperature, o->want_entropy);
    memset(sl->dlogp, 0, N * sizeof(float));
    memset(sl->dent, 0, N * sizeof(float));
    r->out->loss += r->fn(r->ctx, a, sl->seq_of, sl->resp_index, sl->dlogp, sl->dent);
    r->out->aux_loss += (double)N / (double)r->total * a->aux_loss;
    s->busy_s += moerl_now() - t0;
}

static void grad_sum_push(pp_state *s, int c);

static void backward_step(pp_state *s, pp_run *r, int c, int j) {
    pp_slot *sl = slot_of(s, c, j);
    const int vs = vstage(s, c), last = vs == s->nv - 1, E = s->E;
    model_acts *a = &sl->a;
    if (!last) {
        post_grad(s, r, c, j); /* no-op when prefetched */
        wait_idle(s, &sl->rq_g);
        wait_idle(s, &sl->rq_ba);
        sl->grad_posted = -1;
        if (s->aux) memcpy(a->aux_counts, sl->ba, E * sizeof(float)); /* the micro-batch's counts, all layers */
    }
    /* model_backward writes d_resid, which the slot's previous micro-batch may still be sending
     * (the last virtual stage posts no gradient receive that would have waited for it) */
    wait_idle(s, &sl->sq_g);
    const double t0 = moerl_now();
    const train_step_opts *o = r->o;
    const double share = (double)r->N[j] / (double)r->total;
    double aux_w = o->aux_coef * share;
    if (s->aux && o->aux_counts) { /* global load-balancing loss: as train_accumulate */
        for (int e = 0; e < E; e++) a->aux_counts[e] = (float)o->aux_counts[e];
        aux_w = o->aux_coef * share * share;
    }
    stage_slot(s, c, j);
    if (r->N[j] == 0) idle_events(s, o->par, vs, 1); /* an empty micro-batch (agree_count) */
    else model_backward(r->model, a, last ? sl->dlogp : NULL, last && o->want_entropy ? sl->dent : NULL, (float)aux_w);
    s->busy_s += moerl_now() - t0;
    /* a chunk's backwards run in micro-batch order: after the last one its gradients are final */
    if (++s->done_c[c] == r->m) grad_sum_push(s, c);
    if (vs > 0) {
        sl->sq_g = dist_comm_isend_f32(s->comm, prev_rank(s), tag_of(s, vs - 1, j, 2), a->d_resid,
                                       (size_t)r->N[j] * s->H);
        if (s->aux) sl->sq_ba = dist_comm_isend_f32(s->comm, prev_rank(s), tag_of(s, vs - 1, j, 3), sl->ba, (size_t)E);
        if (s->opt.prefetch && j + s->n_slots[c] < r->m) post_input(s, r, c, j + s->n_slots[c]); /* the slot is free */
    }
}

/* The progress thread: MPI_Iprobe on the pipeline's group every `us` µs until told to stop. */
typedef struct {
    dist_comm *comm;
    int us;
    atomic_int stop;
} progress_arg;

static void *progress_main(void *p) {
    progress_arg *a = p;
    const struct timespec ts = {a->us / 1000000, (long)(a->us % 1000000) * 1000L};
    while (!atomic_load(&a->stop)) {
        dist_comm_progress(a->comm);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Sum x[n] over a group in pieces that fit MPI's int counts. */
static int allreduce_chunks(dist_comm *c, float *x, size_t n) {
    const size_t CH = (size_t)1 << 26;
    for (size_t o = 0; o < n; o += CH)
        if (dist_comm_allreduce_f32(c, x + o, MOERL_MIN(CH, n - o)) != MOERL_OK) return MOERL_ERR;
    return MOERL_OK;
}

/* ---- the stage's gradient sum over its data-parallel ranks, chunk by chunk ----
 * Chunk c's range is summed with allreduce_chunks over grid.stage_comm. The chunks' sums run in the
 * order v − 1, …, 0 (the order in which the interleaved schedule finishes them; the same on every
 * data-parallel rank of the stage whatever its micro-batch count), either after the schedule
 * (pp_finish_grads) or, overlapped (v > 1 only), on a thread that starts a chunk's sum as soon as its
 * last backward is done. Both make the same calls on the same buffers: the sums are bit-identical. */
static int grad_sum_overlapped(const pp_state *s) {
    /* v = 1: the one chunk finishes with the last backward, there is nothing to overlap */
    return s->own_m && !s->experts && s->opt.overlap_grads && s->v > 1 && s->stage_comm &&
           dist_comm_size(s->stage_comm) > 1;
}

static void *grad_sum_main(void *p) {
    pp_state *s = p;
    grad_sum *q = &s->gs;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (q->head == q->nq && !q->closed) pthread_cond_wait(&q->cv, &q->mu);
        if (q->head == q->nq) { /* closed and drained */
            pthread_mutex_unlock(&q->mu);
            return NULL;
        }
        const int c = q->queue[q->head++];
        pthread_mutex_unlock(&q->mu);
        if (q->rc == MOERL_OK && allreduce_chunks(s->stage_comm, s->own_m->grads + piece_lo(s, c), piece_n(s, c)) !=
                                     MOERL_OK) {
            q->rc = MOERL_ERR;
            snprintf(q->err, sizeof q->err, "%s", moerl_last_error());
        }
    }
}

static void grad_sum_start(pp_state *s) {
    grad_sum *q = &s->gs;
    if (!grad_sum_overlapped(s)) return;
    q->nq = q->head = q->closed = 0;
    q->rc = MOERL_OK;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->th, NULL, grad_sum_main, s) != 0) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
        return; /* pp_finish_grads sums after the schedule */
    }
    q->running = q->started = 1;
}

/* Chunk c's gradients are final on this rank. The order of the pushes must be v − 1, …, 0. */
static void grad_sum_push(pp_state *s, int c) {
    grad_sum *q = &s->gs;
    if (!q->running) return;
    pthread_mutex_lock(&q->mu);
    MOERL_ASSERT(q->nq < PP_MAX_CHUNKS && c == s->v - 1 - q->nq);
    q->queue[q->nq++] = c;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Wait for the overlapped sums (MOERL_OK at once when none runs). */
static int grad_sum_join(pp_state *s) {
    grad_sum *q = &s->gs;
    if (!q->running) return MOERL_OK;
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    q->running = 0;
    if (q->rc != MOERL_OK) return moerl_errorf("pipeline stage %d: gradient sum over the stage: %s", s->stage, q->err);
    return q->nq == s->v ? MOERL_OK : moerl_errorf("pipeline stage %d: %d of %d chunks' gradient sums ran", s->stage,
                                                   q->nq, s->v);
}

/* All stages agree on the batch (sum and sum of squares of each value over pp_comm), and all planned
 * it without error: one small all-reduce, so that a refusal happens on every stage and none waits. */
static int check_agreement(pp_state *s, int ok, int n, int64_t tokens, int m) {
    const double v[4] = {ok, n, (double)tokens, m};
    double b[8];
    for (int k = 0; k < 4; k++) {
        b[k] = v[k];
        b[4 + k] = v[k] * v[k];
    }
    if (dist_comm_allreduce_f64(s->comm, b, 8) != MOERL_OK) return MOERL_ERR;
    if (!ok) return MOERL_ERR; /* this stage's own message stands */
    if (b[0] != s->pp) return moerl_errorf("pipeline: another stage refused this batch (see its message)");
    for (int k = 1; k < 4; k++)
        if (b[k] != s->pp * v[k] || b[4 + k] != s->pp * v[k] * v[k])
            return moerl_errorf("pipeline stage %d: the stages were given different batches (sequences, tokens or "
                                "micro-batch counts differ): every stage of a pipeline must get the same sequences",
                                s->stage);
    return MOERL_OK;
}

/* Pipeline × FSDP: the FSDP group's members sit in one stage of different pipelines and must run the
 * same layer events pass for pass, so every pipeline runs the same micro-batch count: the most any
 * pipeline planned (an all-gather over grid.stage_comm; the stages of one pipeline plan the same count,
 * so every stage finds the same most). A pipeline with fewer keeps its own packing and appends empty
 * micro-batches (0 tokens): their passes run the layer events only (idle_events: FSDP's gathers and
 * zero reduce-scatters, as fsdp_idle_pass) and their messages carry no hidden rows. A refusal on any
 * pipeline (ok = 0 there) is every rank's, so none waits in a pass. *mb and *Nmb grow to the count
 * (+ 1 entries). Returns the agreed ok (0 with a message). */
static int agree_count(pp_state *s, int n, int ok, int *nm, int **mb, int **Nmb) {
    if (!s->uniform || dist_comm_size(s->uniform) <= 1) return ok;
    const int D = dist_comm_size(s->uniform);
    float mine = ok ? (float)*nm : -1.0f, *all = xmalloc((size_t)D * sizeof(float));
    const int rc = dist_comm_allgather_f32(s->uniform, &mine, 1, all);
    int M = 0, bad = rc != MOERL_OK;
    for (int d = 0; d < D && !bad; d++) {
        bad |= all[d] < 0;
        M = MOERL_MAX(M, (int)all[d]);
    }
    free(all);
    if (!ok) return 0; /* this rank's own message stands */
    if (bad) return moerl_errorf("pipeline: another data-parallel pipeline of this stage refused its batch (see its "
                                 "message)"), 0;
    if (*nm == 0) (*mb)[0] = 0; /* no sequences here */
    if (*nm < M) {
        *mb = xrealloc(*mb, ((size_t)M + 1) * sizeof(int));
        *Nmb = xrealloc(*Nmb, ((size_t)M + 1) * sizeof(int));
        for (int j = *nm + 1; j <= M; j++) (*mb)[j] = n; /* empty: [n, n) */
        *nm = M;
    }
    return 1;
}

/* The layer events of an empty micro-batch's pass over virtual stage vs's layers [lo, hi), in
 * model_forward / model_backward's order (forward.h), through the model hooks of par: the collectives
 * a pass of the stage's FSDP group runs, with nothing computed. */
static void idle_events(const pp_state *s, void *par, int vs, int backward) {
    const model_hooks *h = model_par_hooks(par);
    void (*ev)(void *, model_layer_phase, int) = h ? h->layer_event : NULL;
    void (*idle)(void *, int, int) = s->xh.idle_layer; /* pipeline × EP: each layer's exchanges */
    if (!ev && !idle) return;
    const int lo = s->bounds[vs], hi = s->bounds[vs + 1], head = hi == s->L;
    if (!backward) {
        for (int l = lo - 1; l < hi; l++) {
            if (ev) ev(par, MODEL_FWD_LAYER, l);
            if (idle && l >= lo) idle(s->xh.ctx, l, 0);
        }
        return;
    }
    if (ev) ev(par, MODEL_BWD_LAYER, hi);
    if (ev && head) ev(par, MODEL_GRAD_READY, s->L);
    for (int l = hi - 1; l >= lo; l--) {
        if (ev) ev(par, MODEL_BWD_LAYER, l);
        if (idle) idle(s->xh.ctx, l, 1);
        if (ev) ev(par, MODEL_GRAD_READY, l);
    }
    if (ev && lo == 0) ev(par, MODEL_GRAD_READY, -1);
}

/* This stage's checks before a schedule: the token limit, every token in the vocabulary. 1 when all
 * hold (0 with a message). */
static int check_inputs(const moe_model *m, const train_seq *seqs, int n, int max_tokens) {
    const int V = moe_config_vocab(&m->cfg); /* a TP slice's tokens are whole-vocabulary ids */
    if (max_tokens <= 0) return moerl_errorf("pipeline: micro-batch token limit %d, expected > 0", max_tokens), 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < seqs[i].len; t++)
            if (seqs[i].tokens[t] < 0 || seqs[i].tokens[t] >= V)
                return moerl_errorf("pipeline: sequence %d has token %d at %d, outside the vocabulary [0,%d)", i,
                                    seqs[i].tokens[t], t, V), 0;
    return 1;
}

int pp_slots_needed(int pp, int stage, int v, int m, int *need) {
    if (v < 1 || v > PP_MAX_CHUNKS) return moerl_errorf("pipeline: %d chunks per stage, expected 1..%d", v, PP_MAX_CHUNKS);
    for (int c = 0; c < v; c++) need[c] = 1;
    if (m <= 0) return MOERL_OK;
    if (pp < 1 || stage < 0 || stage >= pp) return moerl_errorf("pipeline: stage %d of %d, expected 0..%d", stage, pp, pp - 1);
    /* The schedule is walked up to m_cap micro-batches at most (moerl plan asks about counts up to
     * 2^31 − 1). Past the warm-up (≤ 2(p − 1) + (v − 1)p forwards when m > p) the steady 1F1B pairs
     * repeat with period p·v — each chunk gets p forwards and p backwards per period — and the
     * cool-down only retires micro-batches, so once the steady phase holds a whole period the peaks
     * are reached and more micro-batches change nothing (tests/test_pipeline.c checks it against the
     * whole schedule). m_cap keeps the interleaved rule (a multiple of p). */
    const int64_t warm = 2 * (int64_t)(pp - 1) + (int64_t)(v - 1) * pp;
    int64_t m_cap = (warm + (int64_t)pp * v + v - 1) / v + 2 * (int64_t)pp;
    m_cap = (m_cap + pp - 1) / pp * pp;
    if (v > 1 && m % pp) return pp_schedule(pp, stage, v, m, NULL, NULL, NULL); /* its refusal (nothing written) */
    if (m > m_cap) m = (int)m_cap;
    const int nops = 2 * m * v;
    int *kind = xmalloc(3 * (size_t)nops * sizeof(int)), *chunk = kind + nops, *mbi = chunk + nops;
    if (pp_schedule(pp, stage, v, m, kind, chunk, mbi) != nops) {
        free(kind);
        return MOERL_ERR;
    }
    int in[PP_MAX_CHUNKS] = {0};
    for (int i = 0; i < nops; i++) {
        in[chunk[i]] += kind[i] ? -1 : 1;
        need[chunk[i]] = MOERL_MAX(need[chunk[i]], in[chunk[i]]);
    }
    free(kind);
    if (v == 1) need[0] = MOERL_MAX(need[0], pp - stage); /* the plain 1F1B's slots, as before */
    return MOERL_OK;
}

/* The slots a schedule of nm micro-batches needs (pp_slots_needed; 1 per chunk for a forward-only
 * pass), allocated. */
static int slots_for(pp_state *s, const moe_model *m, int max_tokens, int nm, int fwd_only) {
    int need[PP_MAX_CHUNKS];
    if (pp_slots_needed(s->pp, s->stage, s->v, fwd_only ? 0 : nm, need) != MOERL_OK) return MOERL_ERR;
    return slots_ensure(s, m, max_tokens, need);
}

int pp_check_batch(const pp_state *s, const train_seq *seqs, int n, int max_tokens) {
    if (n <= 0) return MOERL_OK; /* a pipeline without sequences: zero gradients */
    int *mb = xmalloc((size_t)(n + 1) * sizeof(int));
    const int m = pp_plan_microbatches(seqs, n, max_tokens, s->pp, &s->opt, mb);
    free(mb);
    return m < 0 ? MOERL_ERR : MOERL_OK;
}

/* The 1F1B schedule (interleaved when v > 1) of r's nm micro-batches on this stage, with the MPI
 * progress thread (pp_options.progress_us) around it and the look-ahead receives posted first;
 * returns when every send of the slots has left: the seconds since t_start. */
static double run_1f1b(pp_state *s, pp_run *r, int nm, double t_start) {
    const int P = s->pp, V = s->v;
    progress_arg pa = {.comm = s->comm, .us = s->opt.progress_us};
    atomic_init(&pa.stop, 0);
    pthread_t pt;
    const int have_pt = pa.us > 0 && pthread_create(&pt, NULL, progress_main, &pa) == 0;
    if (s->opt.prefetch)
        for (int c = 0; c < V; c++)
            for (int j = 0; j < MOERL_MIN(s->n_slots[c], nm); j++) post_input(s, r, c, j);
    /* warm-up forwards, steady forward/backward pairs, cool-down backwards */
    const int nops = 2 * nm * V;
    int *kind = xmalloc(3 * (size_t)nops * sizeof(int)), *chunk = kind + nops, *mbi = chunk + nops;
    if (pp_schedule(P, s->stage, V, nm, kind, chunk, mbi) != nops) /* the plan checked the count */
        moerl_fatal("pipeline stage %d: %s", s->stage, moerl_last_error());
    for (int i = 0; i < nops; i++) {
        if (kind[i]) backward_step(s, r, chunk[i], mbi[i]);
        else forward_step(s, r, chunk[i], mbi[i]);
    }
    free(kind);
    for (int c = 0; c < V; c++)
        for (int k = 0; k < s->n_slots[c]; k++) {
            pp_slot *sl = &s->slots[c][k];
            wait_idle(s, &sl->sq_h);
            wait_idle(s, &sl->sq_fa);
            wait_idle(s, &sl->sq_g);
            wait_idle(s, &sl->sq_ba);
        }
    const double sched = moerl_now() - t_start;
    if (have_pt) {
        atomic_store(&pa.stop, 1);
        pthread_join(pt, NULL);
    }
    return sched;
}

/* s->st from a schedule of nm micro-batches: tim [3P] = every stage's schedule, busy and wait
 * seconds (summed over the stages); the schedule time T is the slowest stage's, idle share = 1 −
 * busy/T; bytes0: the point-to-point bytes before the schedule. */
static void schedule_stats(pp_state *s, const double *tim, int nm, double bytes0) {
    const int P = s->pp, V = s->v;
    pp_stats *st = &s->st;
    memset(st, 0, sizeof *st);
    st->stages = P;
    st->virtual_stages = V;
    st->microbatches = nm;
    for (int k = 0; k < P; k++) st->step_s = MOERL_MAX(st->step_s, tim[k]);
    for (int k = 0; k < P && st->step_s > 0; k++) {
        const double idle = 1.0 - tim[P + k] / st->step_s;
        st->bubble_mean += idle / P;
        st->bubble_max = MOERL_MAX(st->bubble_max, idle);
        st->wait_share_mean += tim[2 * P + k] / st->step_s / P;
    }
    st->busy_s = s->busy_s;
    st->wait_s = s->wait_s;
    st->bubble = st->step_s > 0 ? 1.0 - s->busy_s / st->step_s : 0;
    st->theory = (double)(P - 1) / (double)(nm + P - 1);
    st->theory_interleaved = (double)(P - 1) / (double)((double)V * nm + P - 1);
    st->bytes_sent = dist_comm_bytes(s->comm, DIST_OP_P2P) - bytes0;
    if (s->gs.running) {
        pthread_mutex_lock(&s->gs.mu);
        st->grad_sums_overlapped = s->gs.nq;
        pthread_mutex_unlock(&s->gs.mu);
    }
}

int pp_train_accumulate(pp_state *s, moe_model *m, const train_seq *seqs, int n, const train_step_opts *o,
                        token_grad_fn fn, void *ctx, train_step_out *out) {
    memset(out, 0, sizeof *out);
    s->gs.started = 0;
    if (grad_sum_join(s) == MOERL_ERR) /* a previous step's sums that nobody finished */
        return MOERL_ERR;
    const int E = s->E, P = s->pp, V = s->v;
    int *mb = xmalloc((n + 1) * sizeof(int)), *Nmb = xmalloc((n + 1) * sizeof(int));
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += seqs[i].len;
    int ok = check_inputs(m, seqs, n, o->max_tokens), nm = 0;
    if (ok && n > 0 && (nm = pp_plan_microbatches(seqs, n, o->max_tokens, P, &s->opt, mb)) < 0) ok = 0;
    ok = agree_count(s, n, ok, &nm, &mb, &Nmb);
    if (ok && slots_for(s, m, o->max_tokens, nm, 0) != MOERL_OK) ok = 0;
    pp_zero_grad(s, m);
    if (check_agreement(s, ok, n, total, ok ? nm : 0) != MOERL_OK) {
        free(mb);
        free(Nmb);
        return MOERL_ERR;
    }
    memset(s->done_c, 0, V * sizeof(int));
    grad_sum_start(s);
    if (nm == 0) { /* a data-parallel pipeline without sequences: zero gradients, as train_accumulate */
        free(mb);
        free(Nmb);
        memset(&s->st, 0, sizeof s->st);
        for (int c = V - 1; c >= 0; c--) grad_sum_push(s, c);
        if (o->layer_hook)
            for (int g = s->L; g >= -1; g--) o->layer_hook(o->layer_hook_ctx, g);
        return MOERL_OK;
    }
    const double t_start = moerl_now(); /* the stages leave the agreement all-reduce together */
    for (int j = 0; j < nm; j++) {
        Nmb[j] = 0;
        for (int i = mb[j]; i < mb[j + 1]; i++) Nmb[j] += seqs[i].len;
    }
    if (o->total_tokens > 0) total = o->total_tokens;
    /* psum[E], counts[E] (last stage), then per stage: schedule, busy and wait seconds [3P] */
    double *acc = xcalloc(2 * (size_t)E + 3 * (size_t)P, sizeof(double)), *tim = acc + 2 * E;
    pp_run r = {.seqs = seqs, .mb = mb, .N = Nmb, .m = nm, .total = total, .o = o, .fn = fn, .ctx = ctx, .model = m,
                .out = out, .psum_out = acc, .counts_out = acc + E};
    s->wait_s = s->busy_s = 0;
    s->cur_m = nm;
    const double bytes0 = dist_comm_bytes(s->comm, DIST_OP_P2P);
    const double sched = run_1f1b(s, &r, nm, t_start);
    /* additive convention: the last stage reports the pipeline's loss, aux and statistics, the others 0 */
    const int last = s->stage == P - 1;
    if (last) {
        out->loss += o->aux_coef * out->aux_loss;
        for (int e = 0; e < E && s->aux; e++) {
            if (o->aux_psum_out) o->aux_psum_out[e] += acc[e];
            if (o->aux_counts_out) o->aux_counts_out[e] += acc[E + e];
        }
    }
    tim[s->stage] = sched;
    tim[P + s->stage] = s->busy_s;
    tim[2 * P + s->stage] = s->wait_s;
    if (dist_comm_allreduce_f64(s->comm, tim, 3 * (size_t)P) != MOERL_OK)
        moerl_fatal("pipeline stage %d: %s", s->stage, moerl_last_error());
    out->n_microbatches = nm;
    out->n_tokens = 0;
    for (int j = 0; j < nm && last; j++) out->n_tokens += Nmb[j];
    schedule_stats(s, tim, nm, bytes0);
    if (o->layer_hook) /* every group's gradient (this stage's share) is final: the caller's sum may start */
        for (int g = s->L; g >= -1; g--) o->layer_hook(o->layer_hook_ctx, g);
    free(acc);
    free(mb);
    free(Nmb);
    return MOERL_OK;
}

/* ------------------------------------------------------------------ forward-only passes */

/* A forward-only pass's start, on every stage alike: the checks of pp_train_accumulate, the packing
 * of train_accumulate (pack_microbatches: the same micro-batches as one rank), the agreement. mb and
 * Nmb need n + 1 entries. Returns the micro-batch count or MOERL_ERR (on every stage). */
static int plan_forward(pp_state *s, const moe_model *m, const train_seq *seqs, int n, int max_tokens, int **mbp,
                        int **Nmbp) {
    int *mb = *mbp;
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += seqs[i].len;
    int ok = check_inputs(m, seqs, n, max_tokens), nm = 0;
    if (ok && n > 0 && (nm = pack_microbatches(seqs, n, max_tokens, mb)) < 0) ok = 0;
    ok = agree_count(s, n, ok, &nm, mbp, Nmbp);
    mb = *mbp;
    int *Nmb = *Nmbp;
    if (ok && slots_for(s, m, max_tokens, nm, 1) != MOERL_OK) ok = 0;
    if (check_agreement(s, ok, n, total, ok ? nm : 0) != MOERL_OK) return MOERL_ERR;
    for (int j = 0; j < nm; j++) {
        Nmb[j] = 0;
        for (int i = mb[j]; i < mb[j + 1]; i++) Nmb[j] += seqs[i].len;
    }
    return nm;
}

/* Called on every stage after each micro-batch's forward over a chunk's layers. */
typedef void (*fwd_visit)(pp_state *s, int c, const moe_model *m, model_acts *a, const pp_slot *sl, int N, void *ctx);

/* The forward-only schedule: micro-batch order (interleaved: groups of pp micro-batches through the
 * chunks, as the training schedule's forwards, the last group possibly shorter); virtual stage k receives
 * micro-batch j's hidden state from k − 1 (receives posted ahead into the free slots), runs its
 * layers, calls visit, sends the output to k + 1. */
static void forward_only(pp_state *s, const moe_model *m, const train_seq *seqs, const int *mb, const int *Nmb,
                         int nm, fwd_visit visit, void *ctx, const train_route_opts *ro) {
    const size_t H = (size_t)s->H;
    const int V = s->v;
    s->cur_m = nm;
    progress_arg pa = {.comm = s->comm, .us = s->opt.progress_us};
    atomic_init(&pa.stop, 0);
    pthread_t pt;
    const int have_pt = pa.us > 0 && nm > 0 && pthread_create(&pt, NULL, progress_main, &pa) == 0;
    for (int c = 0; c < V; c++) {
        const int vs = vstage(s, c);
        for (int j = 0; vs > 0 && j < MOERL_MIN(s->n_slots[c], nm); j++) {
            pp_slot *sl = slot_of(s, c, j);
            sl->rq_h = dist_comm_irecv_f32(s->comm, prev_rank(s), tag_of(s, vs, j, 0),
                                           sl->a.layers[s->bounds[vs]].resid_in, (size_t)Nmb[j] * H);
        }
    }
    /* groups of pp micro-batches (the last may be shorter), each through chunk 0, 1, …: a pass
     * depends only on passes earlier in this order (the previous stage's, or the last stage's previous
     * chunk of the same group), so no stage waits on one that waits on it — for any count m */
    const int nops = nm * V;
    int *chunk = xmalloc(2 * (size_t)(nops ? nops : 1) * sizeof(int)), *mbi = chunk + nops, no = 0;
    for (int g0 = 0; g0 < nm; g0 += s->pp)
        for (int c = 0; c < V; c++)
            for (int j = g0; j < MOERL_MIN(g0 + s->pp, nm); j++) {
                chunk[no] = c;
                mbi[no++] = j;
            }
    for (int i = 0; i < nops; i++) {
        const int c = chunk[i], j = mbi[i], vs = vstage(s, c), last = vs == s->nv - 1;
        pp_slot *sl = slot_of(s, c, j);
        model_acts *a = &sl->a;
        if (vs > 0) wait_idle(s, &sl->rq_h);
        wait_idle(s, &sl->sq_h); /* resid_out of the slot's previous micro-batch has left */
        stage_slot(s, c, j);
        if (mb[j] == mb[j + 1]) { /* an empty micro-batch (agree_count): the layer events only */
            idle_events(s, s->fwd_par, vs, 0);
            if (!last) sl->sq_h = dist_comm_isend_f32(s->comm, next_rank(s), tag_of(s, vs + 1, j, 0), a->resid_out, 0);
        } else {
            const int N = train_pack(seqs, mb[j], mb[j + 1], sl->tok, sl->cu, sl->tgt, sl->seq_of, sl->resp_index);
            a->par = s->fwd_par; /* pipeline × FSDP: the stage's gathers; NULL otherwise */
            slot_routes(sl, m, seqs, mb[j], mb[j + 1], ro);
            if (model_forward(m, a, sl->tok, sl->cu, NULL, mb[j + 1] - mb[j], N) != MOERL_OK)
                moerl_fatal("pipeline stage %d chunk %d, forward-only micro-batch %d: %s", s->stage, c, j,
                            moerl_last_error());
            train_route_visit(m, a, seqs, mb[j], sl->cu, a->routes_out, ro);
            visit(s, c, m, a, sl, N, ctx);
            if (!last)
                sl->sq_h = dist_comm_isend_f32(s->comm, next_rank(s), tag_of(s, vs + 1, j, 0), a->resid_out, (size_t)N * H);
        }
        const int jn = j + s->n_slots[c];
        if (vs > 0 && jn < nm) /* the input buffer is free again */
            sl->rq_h = dist_comm_irecv_f32(s->comm, prev_rank(s), tag_of(s, vs, jn, 0), a->layers[s->bounds[vs]].resid_in,
                                           (size_t)Nmb[jn] * H);
    }
    free(chunk);
    for (int c = 0; c < V; c++)
        for (int k = 0; k < s->n_slots[c]; k++) wait_idle(s, &s->slots[c][k].sq_h);
    if (have_pt) {
        atomic_store(&pa.stop, 1);
        pthread_join(pt, NULL);
    }
}

typedef struct {
    float temperature;
    const size_t *off; /* [n]: each sequence's first entry in flat */
    float *flat;
} logp_ctx;

static void logp_visit(pp_state *s, int c, const moe_model *m, model_acts *a, const pp_slot *sl, int N, void *vctx) {
    if (vstage(s, c) != s->nv - 1) return;
    logp_ctx *x = vctx;
    model_logprobs(m, a, sl->tgt, x->temperature, 0);
    for (int t = 0; t < N; t++)
        if (sl->resp_index[t] >= 0) x->flat[x->off[sl->seq_of[t]] + (size_t)sl->resp_index[t]] = a->logp[t];
}

int pp_compute_logprobs(pp_state *s, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                        float temperature, float **out_logp, const train_route_opts *ro) {
    int *mb = xmalloc((n + 1) * sizeof(int)), *Nmb = xmalloc((n + 1) * sizeof(int));
    const int nm = plan_forward(s, m, seqs, n, max_tokens, &mb, &Nmb);
    if (nm < 0) {
        free(mb);
        free(Nmb);
        return MOERL_ERR;
    }
    /* sequence i's response entries: index t + 1 − resp_start for targets t + 1 in [max(resp_start, 1), len) */
    size_t *off = xmalloc(((size_t)n + 1) * sizeof(size_t));
    off[0] = 0;
    for (int i = 0; i < n; i++) off[i + 1] = off[i] + (size_t)MOERL_MAX(0, seqs[i].len - seqs[i].resp_start);
    float *flat = xcalloc(off[n] ? off[n] : 1, sizeof(float));
    logp_ctx c = {.temperature = temperature, .off = off, .flat = flat};
    forward_only(s, m, seqs, mb, Nmb, nm, logp_visit, &c, ro);
    /* the last stage's values on every stage: the others add zeros (exact) */
    int rc = allreduce_chunks(s->comm, flat, off[n]);
    for (int i = 0; i < n && rc == MOERL_OK; i++) {
        const int rs = seqs[i].resp_start, first = MOERL_MAX(rs, 1) - rs;
        for (int k = first; k < seqs[i].len - rs; k++) out_logp[i][k] = flat[off[i] + (size_t)k];
    }
    free(flat);
    free(off);
    free(mb);
    free(Nmb);
    return rc;
}

static void counts_visit(pp_state *s, int c, const moe_model *m, model_acts *a, const pp_slot *sl, int N,
                         void *vctx) {
    (void)c, (void)m, (void)sl, (void)N;
    double *acc = vctx;
    for (int e = 0; e < s->E && s->aux; e++) acc[e] += a->aux_counts[e]; /* this stage's MoE layers */
}

int pp_compute_router_counts(pp_state *s, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                             double *counts) {
    int *mb = xmalloc((n + 1) * sizeof(int)), *Nmb = xmalloc((n + 1) * sizeof(int));
    const int nm = plan_forward(s, m, seqs, n, max_tokens, &mb, &Nmb);
    int rc = nm < 0 ? MOERL_ERR : MOERL_OK;
    if (rc == MOERL_OK && s->aux) {
        double *acc = xcalloc((size_t)s->E, sizeof(double));
        forward_only(s, m, seqs, mb, Nmb, nm, counts_visit, acc, NULL);
        /* integer counts (exact in float per micro-batch and in double here): the stages' layers add up */
        rc = dist_comm_allreduce_f64(s->comm, acc, (size_t)s->E);
        for (int e = 0; e < s->E && rc == MOERL_OK; e++) counts[e] += acc[e];
        free(acc);
    }
    free(mb);
    free(Nmb);
    return rc;
}

/* ------------------------------------------------------------------ stage-local ownership */

#define PP_TAG_XFER 32100 /* parameter / moment ranges between stages (gather, release) */
#define PP_TAG_EMB_G 32101 /* tied embedding: gradient, last stage → stage 0 */
#define PP_TAG_EMB_P 32102 /* tied embedding: parameters, stage 0 → last stage */
#define PP_CHUNK ((size_t)1 << 28) /* floats per point-to-point message (MPI int counts) */

/* Give back the whole pages inside base[a, b) (pages straddling the ends stay). */
static void drop_range(float *base, size_t a, size_t b) {
    if (b > a) moerl_drop_pages(base, a, b - a);
}

/* Point-to-point requests of one exchange. */
typedef struct {
    dist_req **r;
    int n, cap, bad;
} req_list;

static void req_push(req_list *l, dist_req *r) {
    if (!r) {
        l->bad = 1;
        return;
    }
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->r = xrealloc(l->r, (size_t)l->cap * sizeof *l->r);
    }
    l->r[l->n++] = r;
}

static int req_wait_all(req_list *l) {
    int rc = l->bad ? MOERL_ERR : MOERL_OK;
    for (int i = 0; i < l->n; i++)
        if (dist_wait(l->r[i]) != MOERL_OK) rc = MOERL_ERR;
    free(l->r);
    memset(l, 0, sizeof *l);
    return rc;
}

static void post_range(req_list *l, dist_comm *c, int peer, int tag, float *buf, size_t n, int send) {
    for (size_t o = 0; o < n; o += PP_CHUNK) {
        const size_t k = MOERL_MIN(PP_CHUNK, n - o);
        req_push(l, send ? dist_comm_isend_f32(c, peer, tag, buf + o, k) : dist_comm_irecv_f32(c, peer, tag, buf + o, k));
    }
}

/* Every stage's own ranges to stage `to` (−1: to every stage). mine holds this stage's ranges: at
 * their layout offsets (compact = 0: a layout-sized buffer) or one after the other in chunk order
 * (compact = 1: the moments' layout, chunk c at coff[c]); dst (a layout-sized buffer, on the
 * receivers) gets the other stages' ranges at their layout offsets and, unless mine already lies
 * there, this stage's. The pieces from one stage travel in virtual-stage order on one tag (MPI keeps
 * their order). Collective over pp_comm. */
static int exchange_ranges(pp_state *s, const float *mine, int compact, float *dst, int to) {
    req_list l = {0};
    const int recv = to < 0 || to == s->stage;
    if (recv && dst)
        for (int k = 0; k < s->nv; k++)
            if (k % s->pp != s->stage)
                post_range(&l, s->comm, k % s->pp, PP_TAG_XFER, dst + s->st_lo[k], s->st_hi[k] - s->st_lo[k], 0);
    for (int r = 0; r < s->pp; r++)
        if (r != s->stage && (to < 0 || r == to))
            for (int c = 0; c < s->v; c++)
                post_range(&l, s->comm, r, PP_TAG_XFER, (float *)(compact ? mine + s->coff[c] : mine + piece_lo(s, c)),
                           piece_n(s, c), 1);
    const int rc = req_wait_all(&l);
    if (rc != MOERL_OK) return moerl_errorf("pipeline stage %d: exchanging the stages' ranges: %s", s->stage,
                                            moerl_last_error());
    if (recv && dst)
        for (int c = 0; c < s->v; c++) {
            const float *src = compact ? mine + s->coff[c] : mine + piece_lo(s, c);
            if (dst + piece_lo(s, c) != src) memcpy(dst + piece_lo(s, c), src, piece_n(s, c) * sizeof(float));
        }
    return MOERL_OK;
}

void pp_stage_ranges(const moe_model *m, const int *bounds, int pp, size_t *lo, size_t *hi, size_t *emb_lo,
                     size_t *emb_hi) {
    const int L = m->cfg.num_hidden_layers, U = L + 2;
    size_t *off = xmalloc((size_t)U * sizeof(size_t)), *end = xcalloc((size_t)U, sizeof(size_t));
    for (int k = 0; k < U; k++) off[k] = SIZE_MAX;
    int before_layers = 1;
    for (int i = 0; i < m->n_tensors; i++) { /* units: embedding, layers 0..L−1, final norm and untied head */
        const tensor_info *t = &m->tensors[i];
        if (t->layer >= 0) before_layers = 0;
        const int u = t->layer >= 0 ? t->layer + 1 : before_layers ? 0 : L + 1;
        off[u] = MOERL_MIN(off[u], t->offset);
        end[u] = MOERL_MAX(end[u], t->offset + (((size_t)t->numel + 15) & ~(size_t)15));
    }
    for (int k = 0; k < U; k++) {
        MOERL_ASSERT(off[k] != SIZE_MAX); /* every unit has a tensor (the final norm at least) */
        MOERL_ASSERT(k == 0 ? off[0] == 0 : off[k] == end[k - 1]); /* contiguous in unit order */
    }
    MOERL_ASSERT(end[U - 1] == m->n_params);
    for (int k = 0; k < pp; k++) {
        lo[k] = k == 0 ? 0 : off[bounds[k] + 1];
        hi[k] = k == pp - 1 ? m->n_params : end[bounds[k + 1]];
    }
    if (emb_lo) *emb_lo = off[0];
    if (emb_hi) *emb_hi = end[0];
    free(off);
    free(end);
}


/* Every virtual stage's layout range of m (st_lo / st_hi, the embedding's), once. */
static void layout_ranges(pp_state *s, const moe_model *m) {
    if (s->st_lo) return;
    s->st_lo = xmalloc((size_t)s->nv * sizeof(size_t));
    s->st_hi = xmalloc((size_t)s->nv * sizeof(size_t));
    pp_stage_ranges(m, s->bounds, s->nv, s->st_lo, s->st_hi, &s->emb_lo, &s->emb_hi);
}

void pp_stage_units(const pp_state *s, unsigned char *on) {
    memset(on, 0, (size_t)s->L + 2);
    for (int c = 0; c < s->v; c++) {
        const int vs = vstage(s, c);
        for (int l = s->bounds[vs]; l < s->bounds[vs + 1]; l++) on[l + 1] = 1;
        if (vs == 0) on[0] = 1;
        if (vs == s->nv - 1) on[s->L + 1] = 1;
    }
}

void pp_set_sharded(pp_state *s, moe_model *m, void *par) {
    layout_ranges(s, m);
    s->lay_m = m;
    s->fwd_par = par;
    s->uniform = s->stage_comm;
    s->ext_grads = 1;
}

moe_model *pp_sharded_model(const pp_state *s) { return s ? s->lay_m : NULL; }

int pp_exchange_layout(pp_state *s, float *buf, int to) {
    if (!s->st_lo) return moerl_errorf("pp_exchange_layout: the pipeline has no layout (pp_set_sharded)");
    return exchange_ranges(s, buf, 0, to < 0 || to == s->stage ? buf : NULL, to);
}

int pp_own_stage(pp_state *s, moe_model *m) {
    if (s->own_m) return moerl_errorf("pipeline stage %d: the model is already stage-owned", s->stage);
    if (!m->params) return moerl_errorf("pipeline: a stage-owned model needs parameters (none were given)");
    layout_ranges(s, m);
    s->own_lo = piece_lo(s, 0);
    s->own_hi = s->st_hi[vstage(s, s->v - 1)];
    s->own_n = 0;
    for (int c = 0; c < s->v; c++) {
        s->coff[c] = s->own_n;
        s->own_n += piece_n(s, c);
    }
    s->coff[s->v] = s->own_n;
    s->tied = m->cfg.tie_word_embeddings && s->pp > 1;
    s->ranges = xcalloc((size_t)m->n_tensors + 1, sizeof(adamw_range));
    s->rexp = xcalloc((size_t)m->n_tensors + 1, 1);
    int nr = 0;
    for (int c = 0; c < s->v; c++) {
        const size_t lo = piece_lo(s, c), hi = lo + piece_n(s, c);
        s->r0[c] = nr;
        for (int i = 0; i < m->n_tensors; i++) {
            const tensor_info *t = &m->tensors[i];
            if (t->offset < lo || t->offset >= hi) continue;
            s->rexp[nr] = (t->flags & TF_EXPERT) != 0;
            s->ranges[nr++] = (adamw_range){.offset = t->offset - lo, .n = (size_t)t->numel,
                                            .decay = (t->flags & TF_DECAY) != 0};
        }
    }
    s->r0[s->v] = nr;
    s->map_bytes = m->n_params * sizeof(float);
    /* an inference model (no gradient buffer: the KL reference, par_state_init_like) stays one */
    float *mp = moerl_map_sparse(s->map_bytes), *mg = m->grads ? moerl_map_sparse(s->map_bytes) : NULL;
    if (!mp || (m->grads && !mg)) {
        if (mp) munmap(mp, s->map_bytes);
        if (mg) munmap(mg, s->map_bytes);
        return moerl_errorf("pipeline: cannot map %zu bytes of address space for the stage's parameters",
                            2 * s->map_bytes);
    }
    for (int c = 0; c < s->v; c++)
        memcpy(mp + piece_lo(s, c), m->params + piece_lo(s, c), piece_n(s, c) * sizeof(float));
    if (s->tied && s->stage == s->pp - 1) /* the LM head reads the embedding */
        memcpy(mp + s->emb_lo, m->params + s->emb_lo, (s->emb_hi - s->emb_lo) * sizeof(float));
    model_free_params(m); /* a heap buffer or a checkpoint mapping adopted at load */
    free(m->grads);
    m->params = mp;
    m->grads = mg;
    model_views_for(m, m->params, &m->p);
    if (mg) model_views_for(m, m->grads, &m->g);
    s->own_m = m;
    return MOERL_OK;
}

int pp_release_stage(pp_state *s) {
    moe_model *m = s->own_m;
    if (!m) return MOERL_OK;
    if (grad_sum_join(s) != MOERL_OK) return MOERL_ERR;
    float *p = xalloc_aligned(m->n_params * sizeof(float));
    if (exchange_ranges(s, m->params, 0, p, -1) != MOERL_OK) {
        free(p);
        return MOERL_ERR;
    }
    munmap(m->params, s->map_bytes);
    m->params = p;
    model_views_for(m, m->params, &m->p);
    if (m->grads) {
        munmap(m->grads, s->map_bytes);
        m->grads = xalloc_aligned(m->n_params * sizeof(float));
        model_views_for(m, m->grads, &m->g);
    }
    s->own_m = NULL;
    return MOERL_OK;
}

int pp_is_owned(const pp_state *s) { return s && s->own_m; }

void pp_own_range(const pp_state *s, size_t *lo, size_t *hi) {
    *lo = s->own_lo;
    *hi = s->own_hi;
}

void pp_own_chunk_range(const pp_state *s, int c, size_t *lo, size_t *hi) {
    *lo = piece_lo(s, c);
    *hi = piece_lo(s, c) + piece_n(s, c);
}

size_t pp_held_floats(const pp_state *s) {
    if (!s->own_m) return 0;
    return s->own_n + (s->tied && s->stage == s->pp - 1 ? s->emb_hi - s->emb_lo : 0);
}

void pp_zero_grad(pp_state *s, moe_model *m) {
    if (s && s->ext_grads) return; /* pipeline × FSDP: the shard is FSDP's (zeroed by the par hook) */
    if (!s || !s->own_m) {
        model_zero_grad(m);
        return;
    }
    for (int c = 0; c < s->v; c++) memset(m->grads + piece_lo(s, c), 0, piece_n(s, c) * sizeof(float));
    if (s->tied && s->stage == s->pp - 1) memset(m->grads + s->emb_lo, 0, (s->emb_hi - s->emb_lo) * sizeof(float));
}

static int need_owned(const pp_state *s, const char *fn) {
    if (s->own_m) return MOERL_OK;
    return moerl_errorf("%s: the pipeline's model is replicated (pp_own_stage was not called): sum its gradients over "
                        "every trainer rank and step plain AdamW instead", fn);
}

/* Pipeline × EP: chunk c's gradient range in runs of one kind (expert tensors or the others; the padding
 * after a tensor joins its run, the floats before the first tensor the first run): fn(s, g, n, expert, ctx)
 * on each, in layout order; stops at the first error. */
typedef int (*run_fn)(pp_state *s, float *g, size_t n, int expert, void *ctx);
static int expert_runs(pp_state *s, int c, run_fn fn, void *ctx) {
    float *g = s->own_m->grads + piece_lo(s, c);
    const size_t n = piece_n(s, c);
    size_t start = 0;
    int kind = -1;
    for (int r = s->r0[c]; r < s->r0[c + 1]; r++) {
        if (kind >= 0 && s->rexp[r] != kind) {
            if (fn(s, g + start, s->ranges[r].offset - start, kind, ctx) != MOERL_OK) return MOERL_ERR;
            start = s->ranges[r].offset;
        }
        kind = s->rexp[r];
    }
    return start < n ? fn(s, g + start, n - start, kind > 0, ctx) : MOERL_OK;
}

/* The sum of a run over the ranks holding the same tensor: the expert group's data-parallel ranks or the stage. */
static int sum_run(pp_state *s, float *g, size_t n, int expert, void *ctx) {
    (void)ctx;
    dist_comm *c = expert ? s->ex_dp : s->stage_comm;
    return c && dist_comm_size(c) > 1 ? allreduce_chunks(c, g, n) : MOERL_OK;
}

/* A run's squares into ss[expert]. */
static int square_run(pp_state *s, float *g, size_t n, int expert, void *ctx) {
    (void)s;
    double sc = 0;
#pragma omp parallel for reduction(+ : sc) schedule(static)
    for (long i = 0; i < (long)n; i++) sc += (double)g[i] * (double)g[i];
    ((double *)ctx)[expert] += sc;
    return MOERL_OK;
}

int pp_set_experts(pp_state *s, dist_comm *expert_dp, dist_comm *expert_group, void *par, const pp_expert_hooks *h) {
    if (!s->own_m) return moerl_errorf("pp_set_experts: the pipeline's model is not stage-owned (pp_own_stage first)");
    for (int c = 0; c < s->v; c++)
        for (int r = s->r0[c] + 1; r < s->r0[c + 1]; r++)
            if (s->ranges[r].offset < s->ranges[r - 1].offset + s->ranges[r - 1].n)
                return moerl_errorf("pp_set_experts: the layout's tensors are not in offset order (tensor range %d)", r);
    s->experts = 1;
    s->ex_dp = expert_dp;
    s->ex_group = expert_group;
    s->fwd_par = par;
    s->uniform = s->stage_comm;
    s->xh = *h;
    return MOERL_OK;
}

int pp_finish_grads(pp_state *s) {
    if (need_owned(s, "pp_finish_grads") != MOERL_OK) return MOERL_ERR;
    float *g = s->own_m->grads;
    const int last = s->stage == s->pp - 1;
    /* the stage's data-parallel ranks hold the same parameters: sum their gradients, chunk by chunk
     * (overlapped: the thread started them during the schedule; wait for it) */
    if (s->gs.started) {
        s->gs.started = 0;
        if (grad_sum_join(s) != MOERL_OK) return MOERL_ERR;
    } else if (s->experts) { /* pipeline × EP: the expert tensors over the ranks holding the same experts */
        for (int c = s->v - 1; c >= 0; c--)
            if (expert_runs(s, c, sum_run, NULL) != MOERL_OK) return MOERL_ERR;
    } else {
        for (int c = s->v - 1; c >= 0; c--)
            if (allreduce_chunks(s->stage_comm, g + piece_lo(s, c), piece_n(s, c)) != MOERL_OK) return MOERL_ERR;
    }
    if (!s->tied) return MOERL_OK;
    /* tied head: the last stage's part of the embedding gradient joins stage 0's (which steps it) */
    const size_t ne = s->emb_hi - s->emb_lo;
    req_list l = {0};
    if (last) {
        if (allreduce_chunks(s->stage_comm, g + s->emb_lo, ne) != MOERL_OK) return MOERL_ERR;
        post_range(&l, s->comm, 0, PP_TAG_EMB_G, g + s->emb_lo, ne, 1);
        return req_wait_all(&l);
    }
    if (s->stage != 0) return MOERL_OK;
    float *tmp = moerl_map_sparse(ne * sizeof(float));
    if (!tmp) return moerl_errorf("pipeline: cannot map %zu bytes for the embedding gradient", ne * sizeof(float));
    post_range(&l, s->comm, s->pp - 1, PP_TAG_EMB_G, tmp, ne, 0);
    int rc = req_wait_all(&l);
    if (rc == MOERL_OK)
        for (size_t i = 0; i < ne; i++) g[s->emb_lo + i] += tmp[i];
    munmap(tmp, ne * sizeof(float));
    return rc;
}

void pp_adamw_init(pp_state *s, adamw_state *os, adamw_config cfg) {
    if (need_owned(s, "pp_adamw_init") != MOERL_OK) moerl_fatal("%s", moerl_last_error());
    adamw_init_shard(os, s->own_n, cfg);
}

void pp_slice_vec(const pp_state *s, const float *full, float *own) {
    for (int c = 0; c < s->v; c++) memcpy(own + s->coff[c], full + piece_lo(s, c), piece_n(s, c) * sizeof(float));
}

int pp_adamw_step(pp_state *s, adamw_state *os, float lr, float loss, double *grad_norm) {
    if (need_owned(s, "pp_adamw_step") != MOERL_OK) moerl_fatal("%s", moerl_last_error());
    moe_model *m = s->own_m;
    double ss = s->sq_fn ? s->sq_fn(s->sq_ctx) : 0, kind[2] = {0, 0}; /* sq_fn: TP × pipeline's share */
    for (int c = 0; c < s->v && s->experts; c++) expert_runs(s, c, square_run, kind);
    /* pipeline × EP: the expert group's other experts' squares (the replicated tensors' are the same on every member) */
    if (s->experts && dist_comm_size(s->ex_group) > 1 && dist_comm_allreduce_f64(s->ex_group, &kind[1], 1) != MOERL_OK)
        moerl_fatal("pipeline stage %d: expert gradient norm: %s", s->stage, moerl_last_error());
    if (s->experts) ss = kind[0] + kind[1];
    for (int c = 0; c < s->v && !s->experts && !s->sq_fn; c++) {
        const float *g = m->grads + piece_lo(s, c);
        const long n = (long)piece_n(s, c);
        double sc = 0;
#pragma omp parallel for reduction(+ : sc) schedule(static)
        for (long i = 0; i < n; i++) sc += (double)g[i] * (double)g[i];
        ss += sc;
    }
    /* the global norm: every stage's own parameters once (the tied embedding on stage 0) */
    if (dist_comm_allreduce_f64(s->comm, &ss, 1) != MOERL_OK)
        moerl_fatal("pipeline stage %d: gradient norm: %s", s->stage, moerl_last_error());
    const double norm = sqrt(ss);
    if (grad_norm) *grad_norm = norm;
    /* one AdamW step over the chunks' ranges: each chunk's moments at coff[c] of the compact state */
    adamw_state t = *os;
    int applied = 0;
    for (int c = 0; c < s->v; c++) {
        t.m = os->m + s->coff[c];
        t.v = os->v + s->coff[c];
        t.step = os->step;
        t.skipped = os->skipped;
        applied = adamw_step_ranges(&t, m->params + piece_lo(s, c), m->grads + piece_lo(s, c), s->ranges + s->r0[c],
                                    s->r0[c + 1] - s->r0[c], lr, loss, norm);
    }
    os->step = t.step;
    os->skipped = t.skipped;
    if (applied && s->tied && (s->stage == 0 || s->stage == s->pp - 1)) { /* the head's copy of the embedding */
        req_list l = {0};
        const int last = s->stage == s->pp - 1;
        post_range(&l, s->comm, last ? 0 : s->pp - 1, PP_TAG_EMB_P, m->params + s->emb_lo, s->emb_hi - s->emb_lo,
                   !last);
        if (req_wait_all(&l) != MOERL_OK)
            moerl_fatal("pipeline stage %d: embedding copy: %s", s->stage, moerl_last_error());
    }
    return applied;
}

/* The pages of the parameter map this stage does not hold (its chunks' ranges; the embedding's copy
 * on a tied last stage, which lies before them). */
static void drop_foreign(pp_state *s) {
    moe_model *m = s->own_m;
    size_t from = s->tied && s->stage == s->pp - 1 ? s->emb_hi : 0;
    for (int c = 0; c < s->v; c++) {
        drop_range(m->params, from, piece_lo(s, c));
        from = piece_lo(s, c) + piece_n(s, c);
    }
    drop_range(m->params, from, m->n_params);
}

void pp_take_full(pp_state *s) {
    if (s && s->own_m) drop_foreign(s);
}

int pp_gather_full(pp_state *s, int keep_stage, const adamw_state *os, adamw_state *moments) {
    if (need_owned(s, "pp_gather_full") != MOERL_OK) return MOERL_ERR;
    moe_model *m = s->own_m;
    const int keep = s->stage == keep_stage;
    if (moments) {
        memset(moments, 0, sizeof *moments);
        if (keep) {
            *moments = *os;
            moments->n = m->n_params;
            moments->m = xalloc_aligned(m->n_params * sizeof(float));
            moments->v = xalloc_aligned(m->n_params * sizeof(float));
        }
        if (exchange_ranges(s, os->m, 1, keep ? moments->m : NULL, keep_stage) != MOERL_OK ||
            exchange_ranges(s, os->v, 1, keep ? moments->v : NULL, keep_stage) != MOERL_OK) {
            if (keep) {
                free(moments->m);
                free(moments->v);
            }
            memset(moments, 0, sizeof *moments);
            return MOERL_ERR;
        }
    }
    return exchange_ranges(s, m->params, 0, keep ? m->params : NULL, keep_stage);
}

void pp_release_full(pp_state *s, int kept, adamw_state *moments) {
    if (moments && moments->m) {
        free(moments->m);
        free(moments->v);
        memset(moments, 0, sizeof *moments);
    }
    if (kept && s->own_m) drop_foreign(s);
}

void pp_set_forward_par(pp_state *s, void *par) { s->fwd_par = par; }

void pp_set_norm_squares(pp_state *s, double (*fn)(void *ctx), void *ctx) {
    s->sq_fn = fn;
    s->sq_ctx = ctx;
}
