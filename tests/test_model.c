/* Whole-model parity against the PyTorch reference (tests/ref/gen_model.py, float64 reference
 * computed from the same float32 weights): logits, target logprobs, CE, aux loss, top-k expert
 * ids (exactly), every parameter gradient, and 10 AdamW steps of losses. Two configurations:
 * A (dense layer mixed in, tied embeddings, norm_topk_prob false, head_dim = H/nh) and
 * B (Qwen3-30B-A3B scaled down: head_dim ≠ H/nh, norm_topk_prob true, untied). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "optim/adamw.h"
#include "test.h"

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static float *get_f32(const st_file *f, const char *name, int64_t *numel) {
    const st_tensor *t = st_find(f, name);
    if (!t) return NULL;
    float *x = xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
    if (st_to_f32(t, x) != MOERL_OK) { free(x); return NULL; }
    if (numel) *numel = t->numel;
    return x;
}

static int *get_i32(const st_file *f, const char *name, int64_t *numel) {
    const st_tensor *t = st_find(f, name);
    if (!t || t->dtype != ST_I32) return NULL;
    int *x = xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof(int));
    memcpy(x, t->data, (size_t)t->numel * sizeof(int));
    if (numel) *numel = t->numel;
    return x;
}

/* loss = Σ mask·(−logp)/Σ mask + coef·aux; fills dlogp. Returns the loss. */
static float run_loss(moe_model *m, model_acts *a, const int *tok, const int *cu, int B, int N, const int *tgt,
                      const float *mask, float *dlogp, int backward) {
    if (model_forward(m, a, tok, cu, NULL, B, N) != MOERL_OK) {
        fprintf(stderr, "forward failed: %s\n", moerl_last_error());
        return NAN;
    }
    model_logprobs(m, a, tgt, 1.0f, 0);
    double msum = 0, ce = 0;
    for (int n = 0; n < N; n++) msum += mask[n];
    for (int n = 0; n < N; n++) {
        ce -= mask[n] * a->logp[n];
        dlogp[n] = (float)(-mask[n] / msum);
    }
    ce /= msum;
    float coef = m->cfg.router_aux_loss_coef;
    if (backward) model_backward(m, a, dlogp, NULL, coef);
    return (float)(ce + coef * a->aux_loss);
}

static void check_config(const char *tag, int adam, moe_exec_opts ex) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/model_%s", testdata(), tag);
    snprintf(ref, sizeof ref, "%s/model_%s_ref.safetensors", testdata(), tag);
    moe_model m;
    if (model_load_hf(&m, dir) != MOERL_OK) {
        CHECK(0, "config %s: cannot load %s: %s", tag, dir, moerl_last_error());
        return;
    }
    printf("config %s, MoE switches loop=%d separate_permute=%d per_expert_weights=%d rebuild_row_idx=%d\n", tag,
           ex.per_expert_loop, ex.separate_permute, ex.per_expert_weights, ex.rebuild_row_idx);
    st_file f;
    if (st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "config %s: cannot open reference %s: %s", tag, ref, moerl_last_error());
        model_free(&m);
        return;
    }
    m.cfg.exec = ex; /* the schedule under test (model.h moe_exec_opts); the math must not change */
    int64_t N64 = 0, B1 = 0;
    int *tok = get_i32(&f, "tokens", &N64), *cu = get_i32(&f, "cu_seqlens", &B1), *tgt = get_i32(&f, "targets", NULL);
    float *mask = get_f32(&f, "loss_mask", NULL);
    CHECK(tok && cu && tgt && mask, "config %s: reference lacks tokens/cu_seqlens/targets/loss_mask", tag);
    if (!(tok && cu && tgt && mask)) return;
    const int N = (int)N64, B = (int)B1 - 1, V = m.cfg.vocab_size;
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &m, N) == MOERL_OK);
    float *dlogp = xmalloc(N * sizeof(float));
    model_zero_grad(&m);
    float loss = run_loss(&m, &a, tok, cu, B, N, tgt, mask, dlogp, 1);
    char what[256];

    /* logits: fp32 vs the float64 reference through a few layers of width ≤ 64; observed
     * error ~1e-6, limit 2e-5 absolute + 1e-4 relative leaves room for summation order. */
    float *ref_logits = get_f32(&f, "logits", NULL);
    snprintf(what, sizeof what, "config %s logits", tag);
    CHECK(ref_logits != NULL, "%s missing", what);
    if (ref_logits) t_close(what, a.logits, ref_logits, (long)N * V, 2e-5f, 1e-4f);
    float *ref_logp = get_f32(&f, "logp", NULL);
    snprintf(what, sizeof what, "config %s logp", tag);
    if (ref_logp) t_close(what, a.logp, ref_logp, N, 2e-5f, 1e-4f);
    else CHECK(0, "%s missing", what);
    float *r = get_f32(&f, "aux_loss", NULL);
    /* aux is a sum of E products of means; relative 1e-5 covers fp32 accumulation. */
    snprintf(what, sizeof what, "config %s aux_loss", tag);
    if (r) t_close(what, &a.aux_loss, r, 1, 1e-6f, 1e-5f);
    else CHECK(0, "%s missing", what);
    free(r);
    r = get_f32(&f, "loss", NULL);
    snprintf(what, sizeof what, "config %s loss", tag);
    if (r) t_close(what, &loss, r, 1, 1e-5f, 1e-5f); /* mean of logprobs: same accuracy as logp */
    else CHECK(0, "%s missing", what);
    free(r);

    /* top-k expert ids: exact (the generator keeps a margin between the K-th and K+1-th prob). */
    int n_moe = 0;
    for (int l = 0; l < m.cfg.num_hidden_layers; l++) {
        if (!moe_config_layer_is_moe(&m.cfg, l)) continue;
        n_moe++;
        char nm[64];
        snprintf(nm, sizeof nm, "topk_ids.%d", l);
        int64_t nk;
        int *ids = get_i32(&f, nm, &nk);
        CHECK(ids && nk == (int64_t)N * m.cfg.num_experts_per_tok, "config %s: %s missing or wrong size", tag, nm);
        if (!ids) continue;
        int mism = 0;
        for (int64_t i = 0; i < nk; i++) mism += ids[i] != a.layers[l].mlp.topk_ids[i];
        CHECK(mism == 0, "config %s layer %d: %d top-k ids differ", tag, l, mism);
        free(ids);
    }
    CHECK(n_moe > 0, "config %s has no MoE layer", tag);

    /* every parameter gradient, by HF name */
    int ng = 0, nbad = 0;
    for (int i = 0; i < model_hf_count(&m); i++) {
        char hf[128], gname[160];
        model_hf_name(&m, i, hf, sizeof hf);
        snprintf(gname, sizeof gname, "grad.%s", hf);
        int64_t numel, rn, shape[2];
        int nd;
        float *g = model_hf_tensor(&m, m.grads, hf, &nd, shape, &numel);
        float *rg = get_f32(&f, gname, &rn);
        if (!g || !rg || rn != numel) {
            CHECK(0, "config %s: gradient %s missing or wrong size", tag, hf);
            free(rg);
            continue;
        }
        /* gradients: limit relative to the tensor's largest entry (1e-4 of it) since tiny entries
         * are sums of cancelling terms; fp32 backprop through ≤ 3 layers stays well inside. */
        float gmax = 0;
        for (int64_t j = 0; j < numel; j++) gmax = fmaxf(gmax, fabsf(rg[j]));
        int before = t_failed;
        t_close(gname, g, rg, (long)numel, 1e-4f * gmax + 1e-9f, 1e-3f);
        nbad += t_failed != before;
        ng++;
        free(rg);
    }
    CHECK(ng == model_hf_count(&m), "config %s: compared %d of %d gradients", tag, ng, model_hf_count(&m));
    printf("config %s: N=%d B=%d, %d gradients compared, %d off\n", tag, N, B, ng, nbad);

    if (adam) {
        int64_t ns;
        float *ref_losses = get_f32(&f, "adam_losses", &ns);
        CHECK(ref_losses && ns == 10, "config %s: adam_losses missing", tag);
        if (ref_losses) {
            adamw_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                               .max_grad_norm = 1.0f};
            adamw_state os;
            adamw_init(&os, &m, oc);
            float losses[10];
            for (int s = 0; s < 10; s++) {
                model_zero_grad(&m);
                losses[s] = run_loss(&m, &a, tok, cu, B, N, tgt, mask, dlogp, 1);
                double gn;
                CHECK(adamw_step(&os, &m, oc.lr, losses[s], &gn) == 1, "step %d skipped", s);
            }
            /* 10 AdamW steps amplify fp32 differences (Adam normalises tiny gradient differences);
             * 1e-4 relative on losses of order 1 still catches any wrong update rule. */
            snprintf(what, sizeof what, "config %s adam losses", tag);
            t_close(what, losses, ref_losses, 10, 1e-5f, 1e-4f);
            for (int s = 0; s < 10; s++) printf("  step %d loss %.6f ref %.6f\n", s, losses[s], ref_losses[s]);
            adamw_free(&os);
            free(ref_losses);
        }
    }
    free(ref_logits);
    free(ref_logp);
    free(dlogp);
    free(tok);
    free(cu);
    free(tgt);
    free(mask);
    model_acts_free(&a);
    st_close(&f);
    model_free(&m);
}


/* Every combination of the MoE execution switches (model.h moe_exec_opts) against the default
 * schedule on the same model and batch: logits, logp, aux loss and every gradient. The switches
 * reorder fp32 sums (the per-expert loop adds a token's K expert outputs in expert order, the
 * separate permute backward adds a token's K row gradients in permuted order) and nothing else,
 * so the differences are a few ulps per sum carried through ≤ 3 layers: limits 1e-5 relative
 * (logits, logp; 2e-6 absolute for values near 0) and 2e-5 of each gradient tensor's largest
 * entry. Bit-identical results are not required (and not expected from the loop). */
static void check_switches(const char *tag) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/model_%s", testdata(), tag);
    snprintf(ref, sizeof ref, "%s/model_%s_ref.safetensors", testdata(), tag);
    moe_model m;
    st_file f;
    if (model_load_hf(&m, dir) != MOERL_OK || st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "switches %s: cannot load %s / %s: %s", tag, dir, ref, moerl_last_error());
        return;
    }
    int64_t N64 = 0, B1 = 0;
    int *tok = get_i32(&f, "tokens", &N64), *cu = get_i32(&f, "cu_seqlens", &B1), *tgt = get_i32(&f, "targets", NULL);
    float *mask = get_f32(&f, "loss_mask", NULL);
    CHECK(tok && cu && tgt && mask, "switches %s: reference lacks tokens/cu_seqlens/targets/loss_mask", tag);
    if (!(tok && cu && tgt && mask)) return;
    const int N = (int)N64, B = (int)B1 - 1, V = m.cfg.vocab_size;
    float *dlogp = xmalloc(N * sizeof(float));
    float *logits0 = xmalloc((size_t)N * V * sizeof(float)), *logp0 = xmalloc(N * sizeof(float));
    float *grads0 = xmalloc(m.n_params * sizeof(float)), aux0 = 0;
    for (int combo = 0; combo < 16; combo++) {
        moe_exec_opts ex = {.per_expert_loop = combo & 1, .separate_permute = (combo >> 1) & 1,
                            .per_expert_weights = (combo >> 2) & 1, .rebuild_row_idx = (combo >> 3) & 1};
        m.cfg.exec = ex;
        model_acts a;
        MOERL_ASSERT(model_acts_init(&a, &m, N) == MOERL_OK);
        model_zero_grad(&m);
        run_loss(&m, &a, tok, cu, B, N, tgt, mask, dlogp, 1);
        if (combo == 0) {
            memcpy(logits0, a.logits, (size_t)N * V * sizeof(float));
            memcpy(logp0, a.logp, N * sizeof(float));
            memcpy(grads0, m.grads, m.n_params * sizeof(float));
            aux0 = a.aux_loss;
        } else {
            char what[200];
            snprintf(what, sizeof what, "switches %s combo %d (loop %d sep %d pew %d rebuild %d): logits", tag, combo,
                     ex.per_expert_loop, ex.separate_permute, ex.per_expert_weights, ex.rebuild_row_idx);
            t_close(what, a.logits, logits0, (long)N * V, 2e-6f, 1e-5f);
            snprintf(what, sizeof what, "switches %s combo %d: logp", tag, combo);
            t_close(what, a.logp, logp0, N, 2e-6f, 1e-5f);
            snprintf(what, sizeof what, "switches %s combo %d: aux", tag, combo);
            t_close(what, &a.aux_loss, &aux0, 1, 1e-7f, 1e-6f); /* routing identical: same statistics */
            for (int i = 0; i < m.n_tensors; i++) {
                const tensor_info *ti = &m.tensors[i];
                const float *g = m.grads + ti->offset, *g0 = grads0 + ti->offset;
                float gmax = 0;
                for (int64_t j = 0; j < ti->numel; j++) gmax = fmaxf(gmax, fabsf(g0[j]));
                snprintf(what, sizeof what, "switches %s combo %d: grad %s", tag, combo, ti->name);
                t_close(what, g, g0, (long)ti->numel, 2e-5f * gmax + 1e-12f, 0.0f);
            }
        }
        model_acts_free(&a);
    }
    free(logits0); free(logp0); free(grads0); free(dlogp); free(tok); free(cu); free(tgt); free(mask);
    st_close(&f);
    model_free(&m);
}

/* The production MoE layer (mlp_forward/mlp_backward, every schedule) against the naive HF loop
 * oracle (moe_naive.c) plus the router kernels, on the first MoE layer of model m with N tokens of
 * fixed pseudo-random inputs: layer output, dx, and the router, gate_up and down weight
 * gradients. fp32 on both sides with different sum orders (GEMM blocking, scatter order):
 * limits 1e-5 relative + 1e-6 absolute on outputs of size ~0.1, gradients 1e-5 of the tensor's
 * largest entry. Token counts are chosen so that expert groups fall on both sides of
 * SKINNY_MAX_ROWS (skinny column-split items and sgemm row-split items). */
static void check_vs_oracle(moe_model *mp, const char *tag, int N) {
    moe_model m = *mp; /* shallow: same buffers; cfg.exec and nz change below and are restored */
    int l = 0;
    while (l < m.cfg.num_hidden_layers && !m.p.layers[l].router) l++;
    CHECK(l < m.cfg.num_hidden_layers, "oracle %s: no MoE layer", tag);
    const int H = m.cfg.hidden_size, E = m.cfg.num_experts, K = m.cfg.num_experts_per_tok,
              I = m.cfg.moe_intermediate_size;
    const layer_views *w = &m.p.layers[l];
    float *x = xmalloc((size_t)N * H * sizeof(float)), *dout = xmalloc((size_t)N * H * sizeof(float));
    for (long i = 0; i < (long)N * H; i++) {
        x[i] = (float)sin(0.37 * i + 0.1);
        dout[i] = (float)cos(0.53 * i);
    }
    /* oracle */
    float *out_n = xcalloc((size_t)N * H, sizeof(float)), *dx_n = xcalloc((size_t)N * H, sizeof(float));
    float *logits = xmalloc((size_t)N * E * sizeof(float)), *probs = xmalloc((size_t)N * E * sizeof(float));
    float *tw = xmalloc((size_t)N * K * sizeof(float)), *dtw = xmalloc((size_t)N * K * sizeof(float));
    float *dlog = xmalloc((size_t)N * E * sizeof(float));
    int *ids = xmalloc((size_t)N * K * sizeof(int));
    const size_t ngu = (size_t)E * 2 * I * H, nd = (size_t)E * H * I;
    float *dWgu_n = xcalloc(ngu, sizeof(float)), *dWd_n = xcalloc(nd, sizeof(float)),
          *dWr_n = xcalloc((size_t)E * H, sizeof(float));
    linear_forward(logits, x, w->router, N, H, E, 0);
    router_topk_forward(probs, ids, tw, NULL, logits, N, E, K, m.cfg.norm_topk_prob);
    moe_naive_forward(out_n, x, w->experts_gate_up, w->experts_down, ids, tw, N, H, E, K, I);
    moe_naive_backward(dx_n, dWgu_n, dWd_n, dtw, dout, x, w->experts_gate_up, w->experts_down, ids, tw, N, H, E, K,
                       I);
    router_topk_backward(dlog, dtw, NULL, probs, ids, N, E, K, m.cfg.norm_topk_prob);
    linear_backward(dx_n, dWr_n, dlog, x, w->router, N, H, E, 1);
    float gmax_gu = 0, gmax_d = 0, gmax_r = 0;
    for (size_t i = 0; i < ngu; i++) gmax_gu = fmaxf(gmax_gu, fabsf(dWgu_n[i]));
    for (size_t i = 0; i < nd; i++) gmax_d = fmaxf(gmax_d, fabsf(dWd_n[i]));
    for (long i = 0; i < (long)E * H; i++) gmax_r = fmaxf(gmax_r, fabsf(dWr_n[i]));
    float *out = xmalloc((size_t)N * H * sizeof(float)), *dx = xmalloc((size_t)N * H * sizeof(float));
    for (int combo = 0; combo < 16; combo++) {
        m.cfg.exec = (moe_exec_opts){.per_expert_loop = combo & 1, .separate_permute = (combo >> 1) & 1,
                                     .per_expert_weights = (combo >> 2) & 1, .rebuild_row_idx = (combo >> 3) & 1};
        model_acts a;
        MOERL_ASSERT(model_acts_init(&a, &m, N) == MOERL_OK);
        model_zero_grad(&m);
        mlp_forward(&m, l, x, out, &a.layers[l].mlp, N, NULL, NULL);
        mlp_backward(&m, &a, l, x, dout, dx, N);
        char what[160];
        snprintf(what, sizeof what, "oracle %s N=%d combo %d: MoE output vs naive loop", tag, N, combo);
        t_close(what, out, out_n, (long)N * H, 1e-6f, 1e-5f);
        snprintf(what, sizeof what, "oracle %s N=%d combo %d: dx vs naive loop", tag, N, combo);
        t_close(what, dx, dx_n, (long)N * H, 1e-6f, 1e-5f);
        const layer_views *gw = &m.g.layers[l];
        snprintf(what, sizeof what, "oracle %s N=%d combo %d: d gate_up vs naive loop", tag, N, combo);
        t_close(what, gw->experts_gate_up, dWgu_n, (long)ngu, 1e-5f * gmax_gu, 0);
        snprintf(what, sizeof what, "oracle %s N=%d combo %d: d down vs naive loop", tag, N, combo);
        t_close(what, gw->experts_down, dWd_n, (long)nd, 1e-5f * gmax_d, 0);
        snprintf(what, sizeof what, "oracle %s N=%d combo %d: d router vs naive loop", tag, N, combo);
        t_close(what, gw->router, dWr_n, (long)E * H, 1e-5f * gmax_r, 0);
        model_acts_free(&a);
    }
    /* the NZ switch: packed expert weights in the decode-sized forward (groups ≤ SKINNY_MAX_ROWS
     * rows); sums over H or I in another order than the unpacked skinny kernel, so 1e-5 relative */
    for (int n = 1; n <= 8 && n <= N; n *= 2) {
        m.cfg.exec = (moe_exec_opts){0};
        mlp_acts s;
        mlp_acts_alloc(&s, &m, n);
        float *o1 = xmalloc((size_t)n * H * sizeof(float)), *o2 = xmalloc((size_t)n * H * sizeof(float));
        model_pack_experts(&m);
        CHECK(m.nz != NULL, "model_pack_experts left no packed weights");
        mlp_forward(&m, l, x, o1, &s, n, NULL, NULL);
        m.cfg.exec.no_pack = 1;
        model_pack_experts(&m);
        CHECK(m.nz == NULL, "no_pack: packed weights still set");
        mlp_forward(&m, l, x, o2, &s, n, NULL, NULL);
        char what[96];
        snprintf(what, sizeof what, "oracle %s: NZ packed vs unpacked decode forward, %d tokens", tag, n);
        t_close(what, o1, o2, (long)n * H, 1e-6f, 1e-5f);
        /* proof that the packed weights are what the forward reads: double them (the packed copy
         * only) and the output must move far beyond rounding */
        m.cfg.exec.no_pack = 0;
        model_pack_experts(&m);
        const size_t nzf = (size_t)E * (gemm_packed_size(2 * I, H) + gemm_packed_size(H, I));
        for (size_t i = 0; i < nzf; i++) m.nz[i] *= 2.0f; /* layer l is the first MoE layer: its panels lead nz */
        float *o3 = xmalloc((size_t)n * H * sizeof(float));
        mlp_forward(&m, l, x, o3, &s, n, NULL, NULL);
        double dmax = 0, omax = 0;
        for (long i = 0; i < (long)n * H; i++) {
            dmax = fmax(dmax, fabs((double)o3[i] - o1[i]));
            omax = fmax(omax, fabs((double)o1[i]));
        }
        CHECK(dmax > 0.1 * omax, "NZ (%d tokens): doubling the packed weights moved the output by %.3g (scale %.3g): "
              "the packed kernel did not run", n, dmax, omax);
        free(o3);
        m.cfg.exec.no_pack = 1;
        model_pack_experts(&m);
        for (int r = 0; r < n; r++) /* against the oracle too */
            for (int h = 0; h < H; h++) o2[(size_t)r * H + h] = out_n[(size_t)r * H + h];
        snprintf(what, sizeof what, "oracle %s: NZ packed decode forward vs naive loop, %d tokens", tag, n);
        t_close(what, o1, o2, (long)n * H, 1e-6f, 1e-5f);
        free(o1); free(o2);
        mlp_acts_free(&s);
    }
    free(x); free(dout); free(out_n); free(dx_n); free(logits); free(probs); free(tw); free(dtw); free(dlog); free(ids);
    free(dWgu_n); free(dWd_n); free(dWr_n); free(out); free(dx);
    model_pack_experts(&m); /* no_pack is set: frees the packed copy */
    mp->cfg.exec = (moe_exec_opts){0};
}

/* check_vs_oracle on config B and on a tiny model whose expert width is one 16-column unit
 * (I = 16: a decode-sized group then has fewer column blocks than work items). */
static void check_oracles(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/model_b", testdata());
    moe_model m;
    if (model_load_hf(&m, dir) != MOERL_OK) {
        CHECK(0, "oracle: cannot load %s: %s", dir, moerl_last_error());
    } else {
        const int ns[] = {3, 12, 37};
        for (int i = 0; i < 3; i++) check_vs_oracle(&m, "b", ns[i]);
        model_free(&m);
    }
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 64; c.hidden_size = 32; c.intermediate_size = 32; c.moe_intermediate_size = 16;
    c.num_hidden_layers = 1; c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 8;
    c.num_experts = 4; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1; c.norm_topk_prob = 1;
    c.max_position_embeddings = 64; c.rms_norm_eps = 1e-6f; c.rope_theta = 10000; c.initializer_range = 0.02f;
    c.bos_token_id = c.eos_token_id = -1;
    MOERL_ASSERT(model_init(&m, &c) == MOERL_OK);
    model_init_random(&m, 31337);
    const int ns[] = {5, 26, 65};
    for (int i = 0; i < 3; i++) check_vs_oracle(&m, "tiny", ns[i]);
    model_free(&m);
}

/* moerl score's numbers against the reference for one sequence of config B. */
static void check_score(void) {
    char dir[1024], ref[1024];
    snprintf(dir, sizeof dir, "%s/model_b", testdata());
    snprintf(ref, sizeof ref, "%s/model_b_score.safetensors", testdata());
    moe_model m;
    st_file f;
    if (model_load_hf(&m, dir) != MOERL_OK || st_open(&f, ref) != MOERL_OK) {
        CHECK(0, "score: cannot load %s / %s: %s", dir, ref, moerl_last_error());
        return;
    }
    int64_t T;
    int *tok = get_i32(&f, "tokens", &T);
    float *rl = get_f32(&f, "token_logprobs", NULL), *ra = get_f32(&f, "aux_loss", NULL);
    CHECK(tok && rl && ra, "score reference incomplete");
    if (tok && rl && ra) {
        model_acts a;
        MOERL_ASSERT(model_acts_init(&a, &m, (int)T) == MOERL_OK);
        int cu[2] = {0, (int)T};
        int *tg = xmalloc(T * sizeof(int));
        for (int t = 0; t < T; t++) tg[t] = t + 1 < T ? tok[t + 1] : -1;
        CHECK(model_forward(&m, &a, tok, cu, NULL, 1, (int)T) == MOERL_OK, "forward");
        model_logprobs(&m, &a, tg, 1.0f, 0);
        t_close("score token_logprobs", a.logp, rl, (long)T - 1, 2e-5f, 1e-4f); /* as logp above */
        t_close("score aux_loss", &a.aux_loss, ra, 1, 1e-6f, 1e-5f);
        free(tg);
        model_acts_free(&a);
    }
    free(tok);
    free(rl);
    free(ra);
    st_close(&f);
    model_free(&m);
}

/* Forward errors are reported, not crashes. */
static void check_errors(void) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 11; c.hidden_size = 8; c.intermediate_size = 8; c.moe_intermediate_size = 4;
    c.num_hidden_layers = 1; c.num_attention_heads = 2; c.num_key_value_heads = 1; c.head_dim = 4;
    c.num_experts = 4; c.num_experts_per_tok = 2; c.decoder_sparse_step = 1; c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-6f; c.rope_theta = 10000; c.initializer_range = 0.02f;
    moe_model m;
    CHECK(model_init(&m, &c) == MOERL_OK, "model_init: %s", moerl_last_error());
    model_init_random(&m, 1);
    model_acts a;
    model_acts_init(&a, &m, 4);
    int tok[5] = {1, 2, 3, 4, 5}, cu[2] = {0, 5};
    CHECK(model_forward(&m, &a, tok, cu, NULL, 1, 5) == MOERL_ERR && strstr(moerl_last_error(), "max_tokens"),
          "too many tokens: %s", moerl_last_error());
    int bad[2] = {1, 11}, cu2[2] = {0, 2};
    CHECK(model_forward(&m, &a, bad, cu2, NULL, 1, 2) == MOERL_ERR && strstr(moerl_last_error(), "vocabulary"),
          "token out of vocab: %s", moerl_last_error());
    model_acts_free(&a);
    model_free(&m);
}

int main(void) {
    const moe_exec_opts def = {0};
    check_config("a", 0, def);
    check_config("b", 1, def);
    /* each Ascend-practice optimisation switched off on its own, against PyTorch as above */
    const moe_exec_opts off[] = {{.per_expert_loop = 1}, {.separate_permute = 1}, {.per_expert_weights = 1},
                                 {.rebuild_row_idx = 1}};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        check_config("a", 0, off[i]);
        check_config("b", 0, off[i]);
    }
    check_switches("a");
    check_switches("b");
    check_oracles();
    check_score();
    check_errors();
    TEST_MAIN_END();
}
