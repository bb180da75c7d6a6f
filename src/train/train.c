#include "train/train.h"

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "data/tasks.h"
#include "data/tokenizer.h"
#include "rollout/engine.h"

int pack_microbatches(const train_seq *seqs, int n, int max_tokens, int *mb_start) {
    int n_mb = 0, cur = 0;
    mb_start[0] = 0;
    for (int i = 0; i < n; i++) {
        if (seqs[i].len > max_tokens)
            return moerl_errorf("sequence %d has %d tokens, more than a micro-batch holds (%d); raise the "
                                "micro-batch token limit (actor.ppo_max_token_len_per_gpu in moerl rl, at least the "
                                "longest prompt + data.max_response_length; data.max_token_len_per_micro_batch in "
                                "moerl sft)",
                                i, seqs[i].len, max_tokens);
        if (cur + seqs[i].len > max_tokens) {
            mb_start[++n_mb] = i;
            cur = 0;
        }
        cur += seqs[i].len;
    }
    if (n > 0) mb_start[++n_mb] = n;
    return n_mb;
}

/* Pack seqs[b0..b1) into the flat arrays; returns N. A response target whose resp_mask is 0 (a
 * token inserted between turns) gets resp_index −1, like a prompt token: no callback, logprob or
 * entropy reads it. */
static int pack(const train_seq *seqs, int b0, int b1, int *tok, int *cu, int *tgt, int *seq_of, int *resp_index) {
    int N = 0;
    cu[0] = 0;
    for (int i = b0; i < b1; i++) {
        const train_seq *s = &seqs[i];
        for (int t = 0; t < s->len; t++) {
            tok[N] = s->tokens[t];
            tgt[N] = t + 1 < s->len ? s->tokens[t + 1] : -1;
            seq_of[N] = i;
            int ri = (t + 1 < s->len && t + 1 >= s->resp_start) ? t + 1 - s->resp_start : -1;
            if (ri >= 0 && s->resp_mask && !s->resp_mask[ri]) ri = -1;
            resp_index[N] = ri;
            N++;
        }
        cu[i - b0 + 1] = N;
    }
    return N;
}

int train_pack(const train_seq *seqs, int b0, int b1, int *tok, int *cu, int *tgt, int *seq_of, int *resp_index) {
    return pack(seqs, b0, b1, tok, cu, tgt, seq_of, resp_index);
}

int64_t train_seq_loss_tokens(const train_seq *s) {
    const int n = s->len - s->resp_start;
    if (n <= 0) return 0;
    const int first = s->resp_start > 0 ? 0 : 1; /* a response starting at token 0 has no target for it */
    int64_t k = 0;
    for (int i = first; i < n; i++) k += !s->resp_mask || s->resp_mask[i];
    return k;
}

/* Masked response entries of out_logp hold 0 (no forward pass writes them; callers allocate with xmalloc). */
static void zero_masked_logprobs(const train_seq *seqs, int n, float **out_logp) {
    for (int i = 0; i < n; i++)
        if (seqs[i].resp_mask)
            for (int k = 0; k < seqs[i].len - seqs[i].resp_start; k++)
                if (!seqs[i].resp_mask[k]) out_logp[i][k] = 0.0f;
}

typedef struct {
    int *tok, *cu, *tgt, *seq_of, *resp_index;
    float *dlogp, *dent;
    int16_t *routes, *rec; /* [max_tokens, n_moe, K]: the replayed routes (when a sequence has some), the record */
    int per_token;         /* n_moe · K */
} pack_buf;

const int16_t *train_pack_routes(const train_seq *seqs, int b0, int b1, int16_t *buf, int per_token) {
    int any = 0;
    for (int i = b0; i < b1; i++) any |= seqs[i].routes != NULL;
    if (!any) return NULL;
    size_t o = 0;
    for (int i = b0; i < b1; i++) {
        const size_t n = (size_t)seqs[i].len * per_token;
        if (seqs[i].routes) memcpy(buf + o, seqs[i].routes, n * sizeof(int16_t));
        else
            for (size_t k = 0; k < n; k++) buf[o + k] = -1;
        o += n;
    }
    return buf;
}

/* 1 when the K experts of a (int) equal those of b (int16) as sets (each list holds distinct ids). */
static int same_route(const int *a, const int16_t *b, int K) {
    for (int j = 0; j < K; j++) {
        int found = 0;
        for (int i = 0; i < K && !found; i++) found = a[j] == b[i];
        if (!found) return 0;
    }
    return 1;
}

void train_route_visit(const moe_model *m, const model_acts *a, const train_seq *seqs, int b0, const int *cu,
                       const int16_t *rec, const train_route_opts *r) {
    if (!r || !rec) return;
    const moe_config *c = &m->cfg;
    const int K = c->num_experts_per_tok, per = model_moe_layer_count(c) * K;
    const int lo = a->layer_lo, hi = a->layer_hi ? a->layer_hi : c->num_hidden_layers;
    int mi_of[MOERL_MAX_LAYERS];
    for (int l = lo; l < hi; l++) mi_of[l] = model_moe_layer_index(c, l);
    int nat[256];
    MOERL_ASSERT(K <= (int)(sizeof nat / sizeof nat[0]));
    for (int t = a->tok0, b = 0; t < a->tok0 + a->N; t++) {
        while (cu[b + 1] <= t) b++;
        const size_t at = (size_t)(t - cu[b]) * per;
        const int16_t *cmp = r->compare && r->compare[b0 + b] ? r->compare[b0 + b] + at : NULL;
        int16_t *dst = r->record && r->record[b0 + b] ? r->record[b0 + b] + at : NULL;
        for (int l = lo; l < hi; l++) {
            const int mi = mi_of[l];
            if (mi < 0) continue;
            const int16_t *rt = rec + (size_t)t * per + (size_t)mi * K;
            if (dst) memcpy(dst + (size_t)mi * K, rt, (size_t)K * sizeof(int16_t));
            if (!cmp || !r->count || cmp[(size_t)mi * K] < 0) continue;
            for (int j = 0; j < K; j++) nat[j] = rt[j];
            r->count[mi] += 1;
            r->agree_native[mi] += same_route(nat, cmp + (size_t)mi * K, K);
            r->agree[mi] += same_route(a->layers[l].mlp.topk_ids + (size_t)(t - a->tok0) * K, cmp + (size_t)mi * K, K);
        }
    }
}

static void pack_buf_init(pack_buf *p, int max_tokens) {
    p->tok = xmalloc(max_tokens * sizeof(int));
    p->cu = xmalloc((max_tokens + 1) * sizeof(int));
    p->tgt = xmalloc(max_tokens * sizeof(int));
    p->seq_of = xmalloc(max_tokens * sizeof(int));
    p->resp_index = xmalloc(max_tokens * sizeof(int));
    p->dlogp = xmalloc(max_tokens * sizeof(float));
    p->dent = xmalloc(max_tokens * sizeof(float));
}

static void pack_buf_free(pack_buf *p) {
    free(p->tok); free(p->cu); free(p->tgt); free(p->seq_of); free(p->resp_index); free(p->dlogp); free(p->dent);
    free(p->routes); free(p->rec);
}

/* The routes buffers of a pass: the replay buffer when a sequence carries routes, the record when r asks
 * for something. */
static void pack_buf_routes(pack_buf *p, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                            const train_route_opts *r) {
    p->routes = p->rec = NULL;
    p->per_token = model_moe_layer_count(&m->cfg) * m->cfg.num_experts_per_tok;
    if (p->per_token <= 0) return;
    int any = 0;
    for (int i = 0; i < n; i++) any |= seqs[i].routes != NULL;
    const size_t sz = (size_t)max_tokens * p->per_token * sizeof(int16_t);
    if (any) p->routes = xmalloc(sz);
    if (r && (r->record || (r->compare && r->count))) p->rec = xmalloc(sz);
}

/* Micro-batch [b0, b1)'s replayed routes and record buffer onto the activations (before model_forward). */
static void install_routes(model_acts *a, pack_buf *p, const train_seq *seqs, int b0, int b1) {
    a->replay_routes = p->routes ? train_pack_routes(seqs, b0, b1, p->routes, p->per_token) : NULL;
    a->routes_out = p->rec;
}

static void clear_routes(model_acts *a) {
    a->replay_routes = NULL;
    a->routes_out = NULL;
}

int train_accumulate(moe_model *m, model_acts *a, const train_seq *seqs, int n, const train_step_opts *o,
                     token_grad_fn fn, void *ctx, train_step_out *out) {
    const train_par_hooks *ph = train_par_hooks_of(o->par);
    if (ph && ph->accumulate) return ph->accumulate(o->par, m, seqs, n, o, fn, ctx, out); /* pipeline: 1F1B */
    memset(out, 0, sizeof *out);
    int *mb = xmalloc((n + 1) * sizeof(int));
    int n_mb = pack_microbatches(seqs, n, o->max_tokens, mb);
    if (n_mb < 0) {
        free(mb);
        return MOERL_ERR;
    }
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += seqs[i].len;
    if (o->total_tokens > 0) total = o->total_tokens;
    pack_buf p;
    pack_buf_init(&p, o->max_tokens);
    pack_buf_routes(&p, m, seqs, n, o->max_tokens, o->routes);
    if (o->par) a->par = o->par; /* model-parallel hooks (forward.h's model_hooks) */
    if (ph && ph->zero_grad) ph->zero_grad(o->par, m);
    else model_zero_grad(m);
    int rc = MOERL_OK;
    for (int j = 0; j < n_mb; j++) {
        int N = pack(seqs, mb[j], mb[j + 1], p.tok, p.cu, p.tgt, p.seq_of, p.resp_index);
        install_routes(a, &p, seqs, mb[j], mb[j + 1]);
        if (model_forward(m, a, p.tok, p.cu, NULL, mb[j + 1] - mb[j], N) != MOERL_OK) {
            rc = MOERL_ERR;
            break;
        }
        train_route_visit(m, a, seqs, mb[j], p.cu, p.rec, o->routes);
        /* Ulysses SP: this rank holds tokens [t0, t0 + a->N) of the micro-batch (a->N == N without SP) */
        const int t0 = a->tok0;
        model_logprobs(m, a, p.tgt + t0, o->temperature, o->want_entropy);
        memset(p.dlogp, 0, N * sizeof(float));
        memset(p.dent, 0, N * sizeof(float));
        out->loss += fn(ctx, a, p.seq_of + t0, p.resp_index + t0, p.dlogp + t0, p.dent + t0);
        const double share = (double)a->N / (double)total;
        out->aux_loss += share * a->aux_loss;
        double aux_w = o->aux_coef * share;
        if (a->n_moe_layers > 0) {
            const int E = m->cfg.num_experts;
            if (o->aux_psum_out)
                for (int e = 0; e < E; e++) o->aux_psum_out[e] += a->aux_psum[e];
            if (o->aux_counts_out)
                for (int e = 0; e < E; e++) o->aux_counts_out[e] += a->aux_counts[e];
            if (o->aux_counts) {
                /* Global load-balancing loss: the backward's d aux/d p[t,e] = w·E·counts[e]/(L·N)² must see
                 * the mini-batch's counts and row total (L·N_total): substitute the global counts and
                 * rescale, w = coef·(N/N_total)² turns (L·N)² into (L·N_total)². */
                for (int e = 0; e < E; e++) a->aux_counts[e] = (float)o->aux_counts[e];
                aux_w = o->aux_coef * share * share;
            }
        }
        if (j == n_mb - 1 && o->layer_hook) { /* last micro-batch: gradients become final layer by layer */
            a->layer_hook = o->layer_hook;
            a->layer_hook_ctx = o->layer_hook_ctx;
        }
        model_backward(m, a, p.dlogp + t0, o->want_entropy ? p.dent + t0 : NULL, (float)aux_w);
        a->layer_hook = NULL;
        a->layer_hook_ctx = NULL;
        out->n_tokens += a->N;
    }
    clear_routes(a);
    out->loss += o->aux_coef * out->aux_loss;
    out->n_microbatches = n_mb;
    pack_buf_free(&p);
    free(mb);
    return rc;
}

int compute_logprobs(const moe_model *m, model_acts *a, const train_seq *seqs, int n, int max_tokens,
                     float temperature, float **out_logp) {
    return compute_logprobs_routes(m, a, seqs, n, max_tokens, temperature, out_logp, NULL);
}

int compute_logprobs_routes(const moe_model *m, model_acts *a, const train_seq *seqs, int n, int max_tokens,
                            float temperature, float **out_logp, const train_route_opts *r) {
    const train_par_hooks *ph = train_par_hooks_of(a->par);
    zero_masked_logprobs(seqs, n, out_logp);
    if (ph && ph->logprobs) /* pipeline */
        return ph->logprobs(a->par, m, seqs, n, max_tokens, temperature, out_logp, r);
    int *mb = xmalloc((n + 1) * sizeof(int));
    int n_mb = pack_microbatches(seqs, n, max_tokens, mb);
    if (n_mb < 0) {
        free(mb);
        return MOERL_ERR;
    }
    /* FSDP / EP: every member of the group runs the same number of passes (train_par_hooks) */
    const int max_mb = ph && ph->max_passes ? ph->max_passes(a->par, n_mb) : n_mb;
    if (max_mb < 0) {
        free(mb);
        return MOERL_ERR;
    }
    const int sp_on = ph && ph->seq_allreduce; /* Ulysses SP */
    pack_buf p;
    pack_buf_init(&p, max_tokens);
    pack_buf_routes(&p, m, seqs, n, max_tokens, r);
    float *full = sp_on ? xmalloc((size_t)max_tokens * sizeof(float)) : NULL;
    int rc = MOERL_OK;
    for (int j = 0; j < n_mb && rc == MOERL_OK; j++) {
        int N = pack(seqs, mb[j], mb[j + 1], p.tok, p.cu, p.tgt, p.seq_of, p.resp_index);
        install_routes(a, &p, seqs, mb[j], mb[j + 1]);
        if (model_forward(m, a, p.tok, p.cu, NULL, mb[j + 1] - mb[j], N) != MOERL_OK) {
            rc = MOERL_ERR;
            break;
        }
        train_route_visit(m, a, seqs, mb[j], p.cu, p.rec, r);
        model_logprobs(m, a, p.tgt + a->tok0, temperature, 0);
        const float *lp = a->logp - a->tok0; /* lp[t]: token t of the micro-batch */
        int t0 = a->tok0, t1 = a->tok0 + a->N;
        if (sp_on) { /* Ulysses SP: this rank holds tokens [tok0, tok0 + N); the others come from the
                        * group (a sum with zeros elsewhere is exact), so every rank returns all of them */
            memset(full, 0, (size_t)N * sizeof(float));
            memcpy(full + a->tok0, a->logp, (size_t)a->N * sizeof(float));
            if (ph->seq_allreduce(a->par, full, (size_t)N) != MOERL_OK) {
                rc = MOERL_ERR;
                break;
            }
            lp = full;
            t0 = 0;
            t1 = N;
        }
        for (int t = t0; t < t1; t++)
            if (p.resp_index[t] >= 0) out_logp[p.seq_of[t]][p.resp_index[t]] = lp[t];
    }
    clear_routes(a);
    if (rc == MOERL_OK && ph && ph->pad_passes) rc = ph->pad_passes(a->par, n_mb, max_mb, 0);
    free(full);
    pack_buf_free(&p);
    free(mb);
    return rc;
}

int compute_router_counts(const moe_model *m, model_acts *a, const train_seq *seqs, int n, int max_tokens,
                          double *counts) {
    const train_par_hooks *ph = train_par_hooks_of(a->par);
    if (ph && ph->router_counts) return ph->router_counts(a->par, m, seqs, n, max_tokens, counts); /* pipeline */
    int *mb = xmalloc((n + 1) * sizeof(int));
    int n_mb = pack_microbatches(seqs, n, max_tokens, mb);
    if (n_mb < 0) {
        free(mb);
        return MOERL_ERR;
    }
    pack_buf p;
    pack_buf_init(&p, max_tokens);
    pack_buf_routes(&p, m, seqs, n, max_tokens, NULL);
    int rc = MOERL_OK;
    for (int j = 0; j < n_mb; j++) {
        int N = pack(seqs, mb[j], mb[j + 1], p.tok, p.cu, p.tgt, p.seq_of, p.resp_index);
        install_routes(a, &p, seqs, mb[j], mb[j + 1]);
        if (model_forward(m, a, p.tok, p.cu, NULL, mb[j + 1] - mb[j], N) != MOERL_OK) {
            rc = MOERL_ERR;
            break;
        }
        if (a->n_moe_layers > 0)
            for (int e = 0; e < m->cfg.num_experts; e++) counts[e] += a->aux_counts[e];
    }
    clear_routes(a);
    pack_buf_free(&p);
    free(mb);
    return rc;
}

int count_microbatches(const train_seq *seqs, int n, int max_tokens) {
    int *mb = xmalloc((n + 1) * sizeof(int));
    int n_mb = pack_microbatches(seqs, n, max_tokens, mb);
    free(mb);
    return n_mb;
}

float lr_schedule(const char *style, int64_t step, int64_t total, float lr, float warmup_ratio, float min_lr_ratio) {
    int64_t warm = (int64_t)(warmup_ratio * (double)total);
    if (step < warm) return lr * (float)(step + 1) / (float)warm;
    if (style && !strcmp(style, "cosine") && total > warm) {
        double prog = (double)(step - warm) / (double)(total - warm);
        if (prog > 1) prog = 1;
        double c = 0.5 * (1.0 + cos(M_PI * prog));
        return (float)(lr * (min_lr_ratio + (1.0 - min_lr_ratio) * c));
    }
    return lr;
}

int eval_accuracy(const moe_model *m, const dataset *ds, int64_t n_limit, int max_new_tokens, int max_num_seqs,
                  double *accuracy, double *mean_len) {
    return eval_accuracy_paged(m, ds, n_limit, max_new_tokens, &(engine_config){.max_num_seqs = max_num_seqs},
                               accuracy, mean_len);
}

int eval_accuracy_paged(const moe_model *m, const dataset *ds, int64_t n_limit, int max_new_tokens,
                        const engine_config *kv, double *accuracy, double *mean_len) {
    const int max_num_seqs = kv->max_num_seqs;
    int64_t n = dataset_count(ds);
    if (n_limit > 0 && n_limit < n) n = n_limit;
    if (n == 0) return moerl_errorf("eval: dataset '%s' is empty", ds->path ? ds->path : "?");
    tok_seq *prompts = xcalloc(n, sizeof(tok_seq));
    int max_plen = 0;
    for (int64_t i = 0; i < n; i++) {
        const ds_row *r = dataset_row(ds, i);
        ds_row_encode_prompt(r, &prompts[i]);
        max_plen = MOERL_MAX(max_plen, (int)prompts[i].n);
    }
    if (m->cfg.max_position_embeddings > 0 && max_plen + max_new_tokens > m->cfg.max_position_embeddings) {
        for (int64_t i = 0; i < n; i++) tok_seq_free(&prompts[i]);
        free(prompts);
        return moerl_errorf("eval: the longest prompt of %s (%d tokens) + %d new tokens exceeds the model's context "
                            "max_position_embeddings %d", ds->path ? ds->path : "the data", max_plen, max_new_tokens,
                            m->cfg.max_position_embeddings);
    }
    engine_config ec = {.max_num_seqs = max_num_seqs, .max_model_len = max_plen + max_new_tokens,
                        .max_num_batched_tokens = MOERL_MAX(512, max_num_seqs), .block_size = kv->block_size,
                        .kv_cache_bytes = kv->kv_cache_bytes, .gpu_memory_utilization = kv->gpu_memory_utilization,
                        .enable_prefix_caching = kv->enable_prefix_caching};
    engine *e = engine_create(&m->cfg, ec);
    int rc = MOERL_ERR;
    gen_request *reqs = xcalloc(n, sizeof(gen_request));
    gen_request **done = xmalloc((n + 1) * sizeof(gen_request *));
    if (!e || engine_load_weights(e, m->params, m->n_params, 0) != MOERL_OK) goto out;
    for (int64_t i = 0; i < n; i++) {
        gen_request *r = &reqs[i];
        r->id = i;
        r->prompt = prompts[i].ids;
        r->prompt_len = (int)prompts[i].n;
        r->sp.temperature = 0;
        r->sp.top_p = 1;
        r->sp.max_tokens = max_new_tokens;
        if (engine_add(e, r) != MOERL_OK) goto out;
    }
    double correct = 0, len_sum = 0;
    int64_t finished = 0;
    while (finished < n) {
        int k = engine_step(e, done, (int)n + 1);
        if (k < 0) goto out;
        for (int d = 0; d < k; d++) {
            gen_request *r = done[d];
            size_t tl;
            char *txt = tok_decode(r->out_tokens, r->n_out, true, &tl);
            double score = 0;
            if (reward_row(dataset_row(ds, r->id), txt ? txt : "", &score) != MOERL_OK) {
                free(txt);
                goto out;
            }
            free(txt);
            correct += score >= 1.0;
            len_sum += r->n_out;
            finished++;
        }
    }
    *accuracy = correct / (double)n;
    if (mean_len) *mean_len = len_sum / (double)n;
    rc = MOERL_OK;
out:
    for (int64_t i = 0; i < n; i++) {
        gen_request_free_outputs(&reqs[i]);
        tok_seq_free(&prompts[i]);
    }
    free(reqs);
    free(done);
    free(prompts);
    engine_free(e);
    return rc;
}
