/* model_backward's per-layer hook (model_acts.layer_hook), which the data-parallel trainer uses to
 * start reducing gradient buckets while backward still runs (dist_reducer_layer_done):
 *   - it is called exactly once per backward group, in the order L (final norm + LM head), L−1, ...,
 *     0, −1 (embedding) — the numbering of dist_tensor_group;
 *   - at each call, every tensor of that group (and of every group called before) already holds its
 *     FINAL gradient: a snapshot taken inside the hook equals the gradient after backward bit for bit
 *     (a hook fired early would let the reducer sum a half-written bucket);
 *   - installing the hook changes nothing: gradients equal a run without it;
 *   - train_accumulate installs the hook for the last micro-batch only (three micro-batches: the
 *     hook sees each group once, after the last backward).
 * And the model-parallel hook tables (model/forward.h's model_hooks, train/train.h's train_par_hooks)
 * with a runtime of the test's own: the layer events come in model_forward / model_backward's order
 * and change nothing; train_accumulate / compute_logprobs / compute_router_counts hand the whole loop
 * to the runtime's hooks when set; an expert-sliced model refuses activations without a MoE hook.
 * Untied and tied embeddings (tied: the LM head's gradient lands in the embedding, group −1), a
 * MoE and a dense layer, dentropy and the aux loss on, random model and tokens. */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "dist/dist.h"
#include "model/forward.h"
#include "model/model.h"
#include "fixture.h"
#include "test.h"
#include "train/train.h"

typedef struct {
    moe_model *m;
    float *snap;      /* [n_params]: each group's gradients as seen inside its hook call */
    int calls[64];    /* group order of the calls */
    int n_calls;
} hook_rec;

static void record(void *ctx, int group) {
    hook_rec *h = ctx;
    if (h->n_calls < 64) h->calls[h->n_calls] = group;
    h->n_calls++;
    for (int i = 0; i < h->m->n_tensors; i++)
        if (dist_tensor_group(h->m, i) == group) {
            const tensor_info *t = &h->m->tensors[i];
            memcpy(h->snap + t->offset, h->m->grads + t->offset, (size_t)t->numel * sizeof(float));
        }
}

static moe_config hook_config(int tied) {
    const char *kv[] = {"model.intermediate_size=40", "model.num_hidden_layers=3", "model.num_key_value_heads=2",
                        "model.num_experts=4", "model.num_experts_per_tok=2", "model.mlp_only_layers=[1]",
                        "model.router_aux_loss_coef=0.01", "model.initializer_range=0.05",
                        tied ? "model.tie_word_embeddings=true" : "model.tie_word_embeddings=false"};
    return fx_small_config_vocab(48, kv, FX_N(kv));
}

static void test_backward_hook(int tied) {
    const moe_config c = hook_config(tied);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 4242 + tied);
    const int B = 3, N = 29, cu[4] = {0, 11, 18, 29};
    int tok[29], tgt[29];
    float dlogp[29], dent[29];
    rng_state r;
    rng_seed(&r, 7 + tied);
    for (int n = 0; n < N; n++) tok[n] = (int)rng_below(&r, (uint64_t)c.vocab_size);
    for (int n = 0; n < N; n++) {
        const int last = n + 1 == cu[1] || n + 1 == cu[2] || n + 1 == cu[3];
        tgt[n] = last ? -1 : tok[n + 1];
        dlogp[n] = last ? 0.0f : -(float)(1 + n % 3) / N;
        dent[n] = last ? 0.0f : 0.01f / N;
    }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, N) == MOERL_OK);
    CHECK(a.layer_hook == NULL && a.layer_hook_ctx == NULL, "model_acts_init must leave the hook unset");
    /* reference: no hook */
    model_zero_grad(&m);
    MOERL_ASSERT(model_forward(&m, &a, tok, cu, NULL, B, N) == MOERL_OK);
    model_logprobs(&m, &a, tgt, 1.0f, 1);
    model_backward(&m, &a, dlogp, dent, 0.5f);
    float *ref = xmalloc(m.n_params * sizeof(float));
    memcpy(ref, m.grads, m.n_params * sizeof(float));
    /* with the hook */
    hook_rec h = {.m = &m, .snap = xcalloc(m.n_params, sizeof(float))};
    a.layer_hook = record;
    a.layer_hook_ctx = &h;
    model_zero_grad(&m);
    MOERL_ASSERT(model_forward(&m, &a, tok, cu, NULL, B, N) == MOERL_OK);
    model_logprobs(&m, &a, tgt, 1.0f, 1);
    model_backward(&m, &a, dlogp, dent, 0.5f);
    const int L = c.num_hidden_layers;
    int order_ok = h.n_calls == L + 2;
    for (int i = 0; order_ok && i < h.n_calls; i++) order_ok = h.calls[i] == L - i;
    CHECK(order_ok, "tied %d: %d hook calls, want %d in the order L..-1 (first %d, last %d)", tied, h.n_calls, L + 2,
          h.calls[0], h.n_calls > 0 ? h.calls[MOERL_MIN(h.n_calls, 64) - 1] : 99);
    CHECK(memcmp(m.grads, ref, m.n_params * sizeof(float)) == 0, "tied %d: the hook changed the gradients", tied);
    /* every group's snapshot (taken in its hook call) equals its final gradient; padding between
     * tensors is never written, so compare tensor by tensor */
    int early = -1;
    for (int i = 0; i < m.n_tensors && early < 0; i++) {
        const tensor_info *t = &m.tensors[i];
        if (memcmp(h.snap + t->offset, m.grads + t->offset, (size_t)t->numel * sizeof(float)) != 0) early = i;
    }
    CHECK(early < 0, "tied %d: tensor %s (group %d) changed after its hook call", tied,
          early >= 0 ? m.tensors[early].name : "", early >= 0 ? dist_tensor_group(&m, early) : 0);
    /* the snapshot is not trivially zero: the check compares real gradients */
    double norm = 0;
    for (size_t i = 0; i < m.n_params; i++) norm += (double)h.snap[i] * h.snap[i];
    CHECK(norm > 0, "tied %d: zero gradients", tied);
    free(h.snap);
    free(ref);
    model_acts_free(&a);
    model_free(&m);
}

typedef struct {
    int calls;
} count_rec;
static void count_hook(void *ctx, int group) { ((count_rec *)ctx)->calls++; }
static double zero_grad_fn(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                           float *dentropy) {
    for (int n = 0; n < a->N; n++)
        if (resp_index[n] >= 0) dlogp[n] = -0.01f;
    return 0.0;
}

static void test_train_accumulate_hook(void) {
    const moe_config c = hook_config(0);
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 99);
    int toks[3][10];
    train_seq seqs[3];
    for (int s = 0; s < 3; s++) {
        for (int t = 0; t < 10; t++) toks[s][t] = (s * 7 + t * 3) % c.vocab_size;
        seqs[s] = (train_seq){.tokens = toks[s], .len = 10, .resp_start = 4};
    }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, 12) == MOERL_OK); /* 12 tokens: one sequence per micro-batch */
    count_rec cr = {0};
    train_step_opts o = {.max_tokens = 12, .temperature = 1.0f, .aux_coef = 0.01f, .layer_hook = count_hook,
                         .layer_hook_ctx = &cr};
    train_step_out so;
    MOERL_ASSERT(train_accumulate(&m, &a, seqs, 3, &o, zero_grad_fn, NULL, &so) == MOERL_OK);
    CHECK(so.n_microbatches == 3, "%d micro-batches", so.n_microbatches);
    CHECK(cr.calls == c.num_hidden_layers + 2, "hook calls over 3 micro-batches: %d, want %d (last one only)",
          cr.calls, c.num_hidden_layers + 2);
    CHECK(a.layer_hook == NULL, "train_accumulate must remove the hook afterwards");
    /* no sequences: zero gradients, no hook call */
    cr.calls = 0;
    MOERL_ASSERT(train_accumulate(&m, &a, seqs, 0, &o, zero_grad_fn, NULL, &so) == MOERL_OK);
    int zero = 1;
    for (size_t i = 0; i < m.n_params; i++) zero &= m.grads[i] == 0.0f;
    CHECK(zero && cr.calls == 0, "empty share: grads zero %d, hook calls %d", zero, cr.calls);
    model_acts_free(&a);
    model_free(&m);
}

/* A runtime of the test's own: the head the hooks need, then the events the layer hook saw. */
typedef struct {
    train_par_head head;
    int ev[256][2]; /* (phase, layer) */
    int n_ev, zero_calls, loop_calls;
} fake_par;

static void fake_event(void *par, model_layer_phase phase, int l) {
    fake_par *f = par;
    if (f->n_ev < 256) f->ev[f->n_ev][0] = (int)phase, f->ev[f->n_ev][1] = l;
    f->n_ev++;
}
static void fake_zero(void *par, moe_model *m) {
    ((fake_par *)par)->zero_calls++;
    model_zero_grad(m);
}
static int fake_accumulate(void *par, moe_model *m, const train_seq *seqs, int n, const train_step_opts *o,
                           token_grad_fn fn, void *ctx, train_step_out *out) {
    ((fake_par *)par)->loop_calls++;
    memset(out, 0, sizeof *out);
    out->n_microbatches = 77;
    return MOERL_OK;
}
static int fake_logprobs(void *par, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                         float temperature, float **out_logp, const train_route_opts *ro) {
    ((fake_par *)par)->loop_calls++;
    return MOERL_OK;
}
static int fake_counts(void *par, const moe_model *m, const train_seq *seqs, int n, int max_tokens, double *counts) {
    ((fake_par *)par)->loop_calls++;
    return MOERL_OK;
}

static void test_hook_tables(void) {
    const moe_config c = hook_config(0);
    const int L = c.num_hidden_layers;
    moe_model m;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 31);
    const int B = 2, N = 17, cu[3] = {0, 9, 17};
    int tok[17], tgt[17];
    float dlogp[17];
    for (int n = 0; n < N; n++) tok[n] = (n * 5 + 1) % c.vocab_size;
    for (int n = 0; n < N; n++) {
        tgt[n] = n + 1 == cu[1] || n + 1 == N ? -1 : tok[n + 1];
        dlogp[n] = tgt[n] < 0 ? 0.0f : -1.0f / N;
    }
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, N) == MOERL_OK);
    CHECK(a.par == NULL, "model_acts_init must leave par unset");
    /* reference: no runtime */
    model_zero_grad(&m);
    MOERL_ASSERT(model_forward(&m, &a, tok, cu, NULL, B, N) == MOERL_OK);
    model_logprobs(&m, &a, tgt, 1.0f, 0);
    model_backward(&m, &a, dlogp, NULL, 0.1f);
    float *ref = xmalloc(m.n_params * sizeof(float)), *ref_logp = xmalloc(N * sizeof(float));
    memcpy(ref, m.grads, m.n_params * sizeof(float));
    memcpy(ref_logp, a.logp, N * sizeof(float));
    /* the layer events only */
    const model_hooks mh = {.layer_event = fake_event};
    fake_par f;
    memset(&f, 0, sizeof f);
    f.head.model.hooks = &mh;
    a.par = &f;
    model_zero_grad(&m);
    MOERL_ASSERT(model_forward(&m, &a, tok, cu, NULL, B, N) == MOERL_OK);
    model_logprobs(&m, &a, tgt, 1.0f, 0);
    model_backward(&m, &a, dlogp, NULL, 0.1f);
    /* want: FWD −1, FWD 0..L−1, BWD L, READY L, then (BWD l, READY l) for l = L−1..0, READY −1 */
    int want[256][2], nw = 0;
    want[nw][0] = MODEL_FWD_LAYER, want[nw++][1] = -1;
    for (int l = 0; l < L; l++) want[nw][0] = MODEL_FWD_LAYER, want[nw++][1] = l;
    want[nw][0] = MODEL_BWD_LAYER, want[nw++][1] = L;
    want[nw][0] = MODEL_GRAD_READY, want[nw++][1] = L;
    for (int l = L - 1; l >= 0; l--) {
        want[nw][0] = MODEL_BWD_LAYER, want[nw++][1] = l;
        want[nw][0] = MODEL_GRAD_READY, want[nw++][1] = l;
    }
    want[nw][0] = MODEL_GRAD_READY, want[nw++][1] = -1;
    int same = f.n_ev == nw;
    for (int i = 0; same && i < nw; i++) same = f.ev[i][0] == want[i][0] && f.ev[i][1] == want[i][1];
    CHECK(same, "layer events: %d calls, want %d in model_forward / model_backward's order", f.n_ev, nw);
    CHECK(memcmp(m.grads, ref, m.n_params * sizeof(float)) == 0 && memcmp(a.logp, ref_logp, N * sizeof(float)) == 0,
          "the layer events changed the result");
    /* the training loop's hooks: zero_grad at train_accumulate's start, the whole loop handed over */
    train_seq seqs[2] = {{.tokens = tok, .len = 9, .resp_start = 3}, {.tokens = tok + 9, .len = 8, .resp_start = 2}};
    train_par_hooks th = {.zero_grad = fake_zero};
    f.head.train = &th;
    f.n_ev = 0;
    train_step_opts o = {.max_tokens = N, .temperature = 1.0f, .par = &f};
    train_step_out so;
    a.par = NULL;
    MOERL_ASSERT(train_accumulate(&m, &a, seqs, 2, &o, zero_grad_fn, NULL, &so) == MOERL_OK);
    CHECK(f.zero_calls == 1 && a.par == &f && f.n_ev == nw, /* one micro-batch */
          "train_accumulate with a runtime: zero_grad %d calls, par %s, %d layer events", f.zero_calls,
          a.par == &f ? "installed" : "not installed", f.n_ev);
    th.accumulate = fake_accumulate;
    th.logprobs = fake_logprobs;
    th.router_counts = fake_counts;
    float lp0[6], lp1[6], *lps[2] = {lp0, lp1};
    double counts[4] = {0};
    MOERL_ASSERT(train_accumulate(&m, NULL, seqs, 2, &o, zero_grad_fn, NULL, &so) == MOERL_OK);
    CHECK(so.n_microbatches == 77, "train_accumulate must hand the loop to the accumulate hook");
    MOERL_ASSERT(compute_logprobs(&m, &a, seqs, 2, N, 1.0f, lps) == MOERL_OK);
    MOERL_ASSERT(compute_router_counts(&m, &a, seqs, 2, N, counts) == MOERL_OK);
    CHECK(f.loop_calls == 3, "the loop hooks ran %d times, want 3", f.loop_calls);
    a.par = NULL;
    model_acts_free(&a);
    /* an expert slice without a MoE dispatch hook is refused, naming the hook */
    moe_config cs = c;
    cs.exec.ep_size = 2;
    cs.exec.ep_rank = 0;
    moe_model ms;
    MOERL_ASSERT(model_init(&ms, &cs) == MOERL_OK);
    model_init_random(&ms, 5);
    MOERL_ASSERT(model_acts_init(&a, &ms, N) == MOERL_OK);
    a.par = &f; /* layer events only */
    CHECK(model_forward(&ms, &a, tok, cu, NULL, B, N) == MOERL_ERR && strstr(moerl_last_error(), "MoE dispatch hook"),
          "expert slice without a MoE hook: %s", moerl_last_error());
    model_acts_free(&a);
    model_free(&ms);
    free(ref);
    free(ref_logp);
    model_free(&m);
}

int main(void) {
    test_backward_hook(0);
    test_backward_hook(1);
    test_train_accumulate_hook();
    test_hook_tables();
    TEST_MAIN_END();
}
