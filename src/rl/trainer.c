/* Trainer: rewards (by data_source), GRPO advantages, PPO policy loss anchored on the behaviour
 * logprobs from the engine (or AReaL's decoupled loss), optional entropy bonus and k3 KL to a
 * frozen reference, AdamW with clipping, over mini-batches of whole GRPO groups. */
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "data/tasks.h"
#include "rl/rl.h"
#include "train/train.h"

int trainer_init(trainer *T, const rl_config *cfg, const dataset *train, moe_model *m) {
    memset(T, 0, sizeof *T);
    T->cfg = cfg;
    T->train = train;
    T->m = m;
    adamw_init(&T->opt, m, cfg->optim);
    if (model_acts_init(&T->acts, m, cfg->ppo_max_token_len) != MOERL_OK) return MOERL_ERR;
    if (cfg->use_kl_loss) {
        T->ref = xcalloc(1, sizeof(moe_model));
        if (model_init_inference(T->ref, &m->cfg) != MOERL_OK) return MOERL_ERR;
        memcpy(T->ref->params, m->params, m->n_params * sizeof(float));
    }
    T->stage = "idle";
    T->last_progress = moerl_now();
    return MOERL_OK;
}

void trainer_free(trainer *T) {
    adamw_free(&T->opt);
    model_acts_free(&T->acts);
    if (T->ref) {
        model_free(T->ref);
        free(T->ref);
    }
}

typedef struct {
    const rl_config *cfg;
    float *adv;             /* [n_seqs] */
    float **anchor, **behav, **ref; /* per sequence, [response length] */
    double w;               /* 1 / response tokens of the mini-batch (token-mean) */
    /* scratch [max_tokens] */
    float *lp, *old, *bh, *ad, *ww, *g, *ent, *dent, *rf;
    int *idx;
    ppo_stats ps;
    double ent_sum, kl_sum;
} ppo_ctx;

static double ppo_grad(void *vctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                       float *dentropy) {
    ppo_ctx *c = vctx;
    int k = 0;
    for (int n = 0; n < a->N; n++) {
        if (resp_index[n] < 0) continue;
        int s = seq_of[n], i = resp_index[n];
        c->idx[k] = n;
        c->lp[k] = a->logp[n];
        c->old[k] = c->anchor[s][i];
        c->bh[k] = c->behav[s][i];
        c->ad[k] = c->adv[s];
        c->ww[k] = (float)c->w;
        if (c->ref) c->rf[k] = c->ref[s][i];
        if (c->cfg->entropy_coeff != 0) c->ent[k] = a->entropy[n];
        k++;
    }
    double loss = ppo_token_loss(c->g, c->lp, c->old, c->bh, c->ad, c->ww, k, &c->cfg->ppo, &c->ps);
    if (c->ref) {
        double kl = kl_k3_token_loss(c->g, c->lp, c->rf, c->ww, k, c->cfg->kl_loss_coef);
        c->kl_sum += kl;
        loss += c->cfg->kl_loss_coef * kl;
    }
    if (c->cfg->entropy_coeff != 0) {
        double h = entropy_bonus(c->dent, c->ent, c->ww, k, c->cfg->entropy_coeff);
        c->ent_sum += h;
        loss -= c->cfg->entropy_coeff * h;
        for (int j = 0; j < k; j++) dentropy[c->idx[j]] = c->dent[j];
    }
    for (int j = 0; j < k; j++) dlogp[c->idx[j]] = c->g[j];
    return loss;
}

int64_t rl_group_tokens(const rl_group *g) {
    int64_t t = 0;
    for (int j = 0; j < g->n; j++) t += g->reqs[j].prompt_len + g->reqs[j].n_out;
    return t;
}

int64_t rl_group_resp_tokens(const rl_group *g) {
    int64_t t = 0;
    for (int j = 0; j < g->n; j++) t += g->reqs[j].n_out;
    return t;
}

void rl_split_minibatch(rl_group *const *groups, int n, int n_ranks, int *owner) {
    int *order = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int64_t *cost = xmalloc((size_t)(n ? n : 1) * sizeof(int64_t));
    int64_t *load = xcalloc((size_t)n_ranks, sizeof(int64_t));
    for (int i = 0; i < n; i++) {
        order[i] = i;
        cost[i] = rl_group_tokens(groups[i]);
    }
    for (int i = 1; i < n; i++) /* insertion sort, stable: by cost descending, ties by index */
        for (int j = i; j > 0 && cost[order[j]] > cost[order[j - 1]]; j--) {
            const int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int r = 1; r < n_ranks; r++)
            if (load[r] < load[best]) best = r;
        owner[order[i]] = best;
        load[best] += cost[order[i]];
    }
    free(order);
    free(cost);
    free(load);
}

/* Rewards of a group's n responses (reward function of the prompt's data_source). */
static int group_rewards(const trainer *T, const rl_group *g, float *rewards) {
    if (g->row < 0 || g->row >= dataset_count(T->train))
        return moerl_errorf("group uid %lld: row %d outside the training set's %lld rows", (long long)g->uid, g->row,
                            (long long)dataset_count(T->train));
    const ds_row *row = dataset_row(T->train, g->row);
    for (int j = 0; j < g->n; j++) {
        const gen_request *r = &g->reqs[j];
        size_t len;
        char *txt = tok_decode(r->out_tokens, r->n_out, true, &len);
        double score = 0;
        int rc = reward_row(row, txt ? txt : "", &score);
        free(txt);
        if (rc != MOERL_OK) return MOERL_ERR;
        rewards[j] = (float)score;
    }
    return MOERL_OK;
}

int trainer_sample_stats(const trainer *T, rl_group **groups, int n, train_stats *st) {
    const int G = T->cfg->n, R = n * G;
    float *rewards = xmalloc((size_t)(G ? G : 1) * sizeof(float));
    st->min_version = 1 << 30;
    double rsum = 0, rsq = 0;
    for (int g = 0; g < n; g++) {
        MOERL_ASSERT(groups[g]->n == G);
        if (group_rewards(T, groups[g], rewards) != MOERL_OK) {
            free(rewards);
            return MOERL_ERR;
        }
        for (int j = 0; j < G; j++) {
            const gen_request *r = &groups[g]->reqs[j];
            const double score = rewards[j];
            rsum += score;
            rsq += score * score;
            st->acc_mean += score >= 1.0;
            /* staleness and partial-rollout accounting */
            int vmin = 1 << 30, vmax = -1;
            for (int t = 0; t < r->n_out; t++) {
                vmin = MOERL_MIN(vmin, r->out_versions[t]);
                vmax = MOERL_MAX(vmax, r->out_versions[t]);
            }
            if (r->n_out == 0) vmin = vmax = T->version;
            int lag = T->version - vmin;
            st->max_lag = MOERL_MAX(st->max_lag, lag);
            st->min_version = MOERL_MIN(st->min_version, vmin);
            st->stale_samples += lag > 0;
            st->partial_samples += r->n_interruptions > 0;
            st->max_partial_span = MOERL_MAX(st->max_partial_span, vmax - vmin);
            st->response_length_mean += r->n_out;
            st->response_length_max = MOERL_MAX(st->response_length_max, r->n_out);
            st->resp_tokens += r->n_out;
        }
    }
    free(rewards);
    st->n_samples = R;
    if (R > 0) {
        st->reward_mean = rsum / R;
        st->reward_std = sqrt(fmax(0.0, rsq / R - st->reward_mean * st->reward_mean));
        st->acc_mean /= R;
        st->response_length_mean /= R;
    }
    return MOERL_OK;
}

/* model_backward's per-layer hook in data-parallel mode: the group's gradients are final. */
static void reducer_hook(void *ctx, int group) { MOERL_ASSERT(dist_reducer_layer_done(ctx, group) == MOERL_OK); }

int trainer_update(trainer *T, rl_group **groups, const rl_minibatch *mbs, int n_mb, train_stats *st) {
    const rl_config *cfg = T->cfg;
    double t0 = moerl_now();
    T->stage = "reward";
    int n = 0;
    for (int b = 0; b < n_mb; b++) n += mbs[b].n_groups;
    const int G = cfg->n, R = n * G;
    float *rewards = xmalloc(R * sizeof(float)), *adv = xmalloc(R * sizeof(float));
    int *sizes = xmalloc(n * sizeof(int));
    train_seq *seqs = xmalloc(R * sizeof(train_seq));
    int **toks = xcalloc(R, sizeof(int *));
    float **behav = xmalloc(R * sizeof(float *)), **prox = NULL, **ref = NULL;
    int rc = MOERL_ERR;
    ppo_ctx c = {.cfg = cfg};
    for (int g = 0; g < n; g++) {
        sizes[g] = G;
        MOERL_ASSERT(groups[g]->n == G);
        if (group_rewards(T, groups[g], rewards + g * G) != MOERL_OK) goto out;
        for (int j = 0; j < G; j++) {
            gen_request *r = &groups[g]->reqs[j];
            int s = g * G + j;
            /* sequence = prompt ⊕ response */
            int L = r->prompt_len + r->n_out;
            toks[s] = xmalloc(L * sizeof(int));
            memcpy(toks[s], r->prompt, r->prompt_len * sizeof(int));
            memcpy(toks[s] + r->prompt_len, r->out_tokens, r->n_out * sizeof(int));
            seqs[s] = (train_seq){.tokens = toks[s], .len = L, .resp_start = r->prompt_len};
            behav[s] = r->out_logprobs;
        }
    }
    grpo_advantages(adv, rewards, sizes, n, 1e-6f);
    if (!cfg->norm_adv_by_std) { /* Dr. GRPO style: A = r − mean, no std division */
        for (int g = 0; g < n; g++) {
            double m = 0;
            for (int j = 0; j < G; j++) m += rewards[g * G + j];
            m /= G;
            for (int j = 0; j < G; j++) adv[g * G + j] = (float)(rewards[g * G + j] - m);
        }
    }
    T->stage = "logprobs";
    if (cfg->ppo.decoupled) { /* proximal policy = the trainer's weights before this step */
        prox = xcalloc(R, sizeof(float *));
        for (int s = 0; s < R; s++) prox[s] = xmalloc((seqs[s].len - seqs[s].resp_start + 1) * sizeof(float));
        if (compute_logprobs(T->m, &T->acts, seqs, R, cfg->ppo_max_token_len, cfg->temperature, prox) != MOERL_OK)
            goto out;
    }
    if (T->ref) {
        ref = xcalloc(R, sizeof(float *));
        for (int s = 0; s < R; s++) ref[s] = xmalloc((seqs[s].len - seqs[s].resp_start + 1) * sizeof(float));
        model_acts ra;
        if (model_acts_init(&ra, T->ref, cfg->ppo_max_token_len) != MOERL_OK) goto out;
        int e = compute_logprobs(T->ref, &ra, seqs, R, cfg->ppo_max_token_len, cfg->temperature, ref);
        model_acts_free(&ra);
        if (e != MOERL_OK) goto out;
    }
    T->stage = "update";
    const int mt = cfg->ppo_max_token_len;
    c.lp = xmalloc(mt * sizeof(float)); c.old = xmalloc(mt * sizeof(float)); c.bh = xmalloc(mt * sizeof(float));
    c.ad = xmalloc(mt * sizeof(float)); c.ww = xmalloc(mt * sizeof(float)); c.g = xmalloc(mt * sizeof(float));
    c.ent = xmalloc(mt * sizeof(float)); c.dent = xmalloc(mt * sizeof(float)); c.rf = xmalloc(mt * sizeof(float));
    c.idx = xmalloc(mt * sizeof(int));
    train_step_opts to = {.max_tokens = mt, .temperature = cfg->temperature > 0 ? cfg->temperature : 1.0f,
                          .want_entropy = cfg->entropy_coeff != 0, .aux_coef = T->m->cfg.router_aux_loss_coef};
    if (T->reducer) {
        to.layer_hook = reducer_hook;
        to.layer_hook_ctx = T->reducer;
    }
    int n_updates = 0;
    double aux_sum = 0, tokens_sum = 0;
    for (int ep = 0; ep < cfg->ppo_epochs; ep++) {
        int s0 = 0;
        for (int b = 0; b < n_mb; b++) {
            const int s1 = s0 + mbs[b].n_groups * G;
            c.w = mbs[b].resp_tokens > 0 ? 1.0 / (double)mbs[b].resp_tokens : 0.0;
            c.adv = adv + s0;
            c.anchor = (prox ? prox : behav) + s0;
            c.behav = behav + s0;
            c.ref = ref ? ref + s0 : NULL;
            to.total_tokens = mbs[b].tokens;
            /* seq_of indexes the mini-batch's own array (seqs + s0) */
            train_step_out so;
            if (train_accumulate(T->m, &T->acts, seqs + s0, s1 - s0, &to, ppo_grad, &c, &so) != MOERL_OK) goto out;
            double loss = so.loss;
            if (T->reducer) { /* gradients and loss summed over the trainer ranks */
                T->stage = "grad_reduce";
                st->reduce_exposed_s += dist_reducer_finish(T->reducer);
                if (dist_allreduce_sum(T->dist, DIST_TRAINERS, &loss, 1) != MOERL_OK) goto out;
                T->stage = "update";
            }
            double gn;
            adamw_step(&T->opt, T->m, cfg->optim.lr, (float)loss, &gn);
            st->grad_norm += gn;
            aux_sum += so.aux_loss;
            tokens_sum += (double)so.n_tokens;
            n_updates++;
            s0 = s1;
        }
    }
    /* loss statistics: sums over this rank's tokens, then over the trainer ranks */
    double sums[8] = {c.ps.loss_sum, c.ps.clipfrac_sum, c.ps.kl_sum, (double)c.ps.n_tokens, c.ent_sum, c.kl_sum,
                      aux_sum, tokens_sum};
    if (T->reducer && dist_allreduce_sum(T->dist, DIST_TRAINERS, sums, 8) != MOERL_OK) goto out;
    if (sums[3] > 0) {
        st->pg_loss = sums[0] / sums[3];
        st->pg_clipfrac = sums[1] / sums[3];
        st->ppo_kl = sums[2] / sums[3];
    }
    const int nu = n_updates ? n_updates : 1;
    st->entropy = sums[4] / nu;
    st->kl_loss = sums[5] / nu;
    st->grad_norm /= nu; /* the reduced gradient's norm: the same on every rank */
    st->aux_loss = sums[6] / nu;
    st->trained_tokens = (int64_t)sums[7];
    /* expert load of this rank's last micro-batch: max/mean tokens per expert, averaged over MoE layers */
    {
        const moe_config *mc = &T->m->cfg;
        double ratio = 0;
        int nl = 0;
        for (int l = 0; l < mc->num_hidden_layers && n > 0; l++) {
            if (!moe_config_layer_is_moe(mc, l)) continue;
            const int *tpe = T->acts.layers[l].mlp.tokens_per_expert;
            double sum = 0, mx = 0;
            for (int e = 0; e < mc->num_experts; e++) {
                sum += tpe[e];
                mx = fmax(mx, tpe[e]);
            }
            if (sum > 0) {
                ratio += mx / (sum / mc->num_experts);
                nl++;
            }
        }
        st->expert_load_max_over_mean = nl ? ratio / nl : 0;
    }
    T->step++;
    rc = MOERL_OK;
out:
    free(c.lp); free(c.old); free(c.bh); free(c.ad); free(c.ww); free(c.g); free(c.ent); free(c.dent); free(c.rf);
    free(c.idx);
    for (int s = 0; s < R; s++) {
        free(toks[s]);
        if (prox) free(prox[s]);
        if (ref) free(ref[s]);
    }
    free(prox);
    free(ref);
    free(toks);
    free(behav);
    free(seqs);
    free(sizes);
    free(rewards);
    free(adv);
    st->update_s = moerl_now() - t0;
    T->stage = "idle";
    T->last_progress = moerl_now();
    return rc;
}

int trainer_step(trainer *T, rl_group **groups, int n, train_stats *st) {
    memset(st, 0, sizeof *st);
    const double t0 = moerl_now();
    T->stage = "reward";
    if (trainer_sample_stats(T, groups, n, st) != MOERL_OK) {
        T->stage = "idle";
        return MOERL_ERR;
    }
    /* each mini-batch (ppo_mini_batch_size consecutive groups) whole on this rank */
    const int mb = T->cfg->ppo_mini_batch_size, nmb = (n + mb - 1) / mb;
    rl_minibatch *mbs = xcalloc(nmb, sizeof *mbs);
    for (int b = 0; b < nmb; b++) {
        const int g0 = b * mb, g1 = MOERL_MIN(n, (b + 1) * mb);
        mbs[b].n_groups = g1 - g0;
        for (int g = g0; g < g1; g++) {
            mbs[b].resp_tokens += rl_group_resp_tokens(groups[g]);
            mbs[b].tokens += rl_group_tokens(groups[g]);
        }
    }
    int rc = trainer_update(T, groups, mbs, nmb, st);
    free(mbs);
    st->update_s = moerl_now() - t0;
    return rc;
}
