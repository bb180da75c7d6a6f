/* Trainer: rewards (stored by the rollouter's reward pool, shaped here), GRPO advantages, PPO policy loss anchored on the behaviour
 * logprobs from the engine (or AReaL's decoupled loss, or GSPO's sequence ratio), optional entropy bonus,
 * KL loss (actor.kl_loss_type) and KL-in-reward penalty (algorithm.use_kl_in_reward) to a frozen
 * reference, AdamW with clipping, over mini-batches of whole GRPO groups. */
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "model/perf.h"
#include "base/trace.h"
#include "data/tasks.h"
#include "model/safetensors.h"
#include "parallel/parallel.h"
#include "rl/rl.h"
#include "rl/trainer_onebit.h"
#include "train/train.h"

/* rollout.batch_invariant with rollout.dtype=bf16: the engine computes from the bf16-rounded weights
 * (nearest-even, engine_load_weights), so the trainer's forwards — the old-logprob pass, the update's
 * forward and backward, the reference's pass — compute from the same rounded values of its fp32
 * master weights, as mixed-precision training does: the gradients are those w.r.t. the rounded
 * weights, and the optimizer applies them to the masters (restored before each step). Nothing is
 * rounded in any other mode. */
static int bf16_forward(const trainer *T) { return T->cfg->batch_invariant && T->cfg->bf16_weights; }

/* In place; a value already in bf16 (zeros included) is not written, so a pipeline stage's released
 * pages of the layout (other stages' parameters) stay released. */
static void round_bf16(float *p, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float r = bf16_to_f32(f32_to_bf16(p[i]));
        if (memcmp(&r, &p[i], sizeof r)) p[i] = r;
    }
}

/* Keep the masters, then round the storage the forward reads (gathered FSDP copies are stale). */
static void params_round(trainer *T) {
    if (!bf16_forward(T) || T->rounded) return;
    size_t n;
    float *p = par_param_store(T->par, T->m, &n);
    if (T->n_masters != n) {
        free(T->masters);
        T->masters = xmalloc((n ? n : 1) * sizeof(float));
        T->n_masters = n;
    }
    memcpy(T->masters, p, n * sizeof(float));
    round_bf16(p, n);
    par_release_gathered(T->par);
    T->rounded = 1;
}

/* The masters back into the storage (before an optimizer step, and when trainer_update ends). */
static void params_restore(trainer *T) {
    if (!T->rounded) return;
    size_t n;
    float *p = par_param_store(T->par, T->m, &n);
    MOERL_ASSERT(n == T->n_masters);
    const float *w = T->masters;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) /* only what the rounding changed (as round_bf16) */
        if (memcmp(&w[i], &p[i], sizeof(float))) p[i] = w[i];
    par_release_gathered(T->par);
    T->rounded = 0;
}

int trainer_init(trainer *T, const rl_config *cfg, const dataset *train, moe_model *m) {
    memset(T, 0, sizeof *T);
    T->cfg = cfg;
    T->train = train;
    T->m = m;
    T->replication = 1;
    if (cfg->router_replay != ROUTER_REPLAY_DISABLED && model_moe_layer_count(&m->cfg) == 0)
        return moerl_errorf("actor.router_replay.mode=%s: the model has no MoE layer to replay routes in "
                            "(num_experts %d); set actor.router_replay.mode=disabled",
                            cfg->router_replay == ROUTER_REPLAY_R2 ? "R2" : "R3", m->cfg.num_experts);
    adamw_init(&T->opt, m, cfg->optim); /* the whole layout; par_adamw_shard cuts it to a rank's part */
    if (model_acts_init(&T->acts, m, cfg->ppo_max_token_len) != MOERL_OK) return MOERL_ERR;
    T->kl_ctrl = cfg->kl_ctrl; /* algorithm.kl_ctrl: β starts at kl_coef (a resume restores the saved β) */
    if (cfg->use_kl_loss || cfg->use_kl_in_reward) {
        T->ref = xcalloc(1, sizeof(moe_model));
        if (model_init_inference(T->ref, &m->cfg) != MOERL_OK) return MOERL_ERR;
        memcpy(T->ref->params, m->params, m->n_params * sizeof(float));
    }
    T->stage = "idle";
    T->last_progress = moerl_now();
    return MOERL_OK;
}

void trainer_free(trainer *T) {
    trainer_onebit_free(T); /* no group left here: rl_run_dist's trainers freed theirs at the end */
    trainer_unshard_ref(T);
    adamw_free(&T->opt);
    model_acts_free(&T->acts);
    free(T->masters);
    T->masters = NULL;
    if (T->ref) {
        model_free(T->ref);
        free(T->ref);
    }
}

int trainer_shard_ref(trainer *T) {
    if (!T->ref || T->ref_par || !par_active(T->par)) return MOERL_OK;
    T->ref_par = xcalloc(1, sizeof *T->ref_par);
    if (par_state_init_like(T->ref_par, T->par, T->ref) != MOERL_OK) {
        free(T->ref_par);
        T->ref_par = NULL;
        return moerl_error_prefix("the KL reference (actor.use_kl_loss), sharded as the actor: ");
    }
    return MOERL_OK;
}

void trainer_unshard_ref(trainer *T) {
    if (!T->ref_par) return;
    par_state_free(T->ref_par);
    free(T->ref_par);
    T->ref_par = NULL;
}

int trainer_ref_logprobs(trainer *T, const train_seq *seqs, int n, float **out) {
    struct par_state *actor = T->acts.par;
    T->acts.par = par_active(T->ref_par) ? T->ref_par : NULL;
    if (bf16_forward(T)) { /* the frozen reference: its stored values rounded once for all (idempotent) */
        size_t nr;
        float *p = par_param_store(T->acts.par, T->ref, &nr);
        round_bf16(p, nr);
        par_release_gathered(T->ref_par);
    }
    const int rc = compute_logprobs(T->ref, &T->acts, seqs, n, T->cfg->ppo_max_token_len, T->cfg->temperature, out);
    T->acts.par = actor;
    par_release_gathered(T->ref_par);
    return rc;
}

typedef struct {
    const rl_config *cfg;
    float *adv;             /* [n_seqs] of the mini-batch */
    float **anchor, **behav, **ref, **isw; /* per sequence, [response length]; ref/isw may be NULL */
    const double *w;        /* per sequence: aggregation weight of each of its loss tokens (0: masked out) */
    const double *w_pg;     /* gspo: the policy loss's weights (seq-mean-token-mean, as verl); NULL: w */
    /* scratch [max_tokens] */
    float *lp, *old, *bh, *ad, *ww, *g, *ent, *dent, *rf, *iw, *wp, *slr;
    int *idx, *sq;
    double *ssum;           /* gspo: [sequences of the step] */
    int *scnt, n_seq;       /* n_seq: sequences of the mini-batch (seq_of's range) */
    ppo_stats ps;
    double ent_sum, ent_count, kl_sum;
    double pg_agg;          /* Σ over updates of the aggregated policy loss (Σ w·L) */
} ppo_ctx;

/* train_accumulate's callback: the micro-batch's response tokens gathered into flat arrays, the
 * PPO loss (+ k3 KL, entropy bonus) with each token weighted by its sequence's aggregation weight. */
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
        c->ww[k] = (float)c->w[s];
        c->wp[k] = (float)(c->w_pg ? c->w_pg[s] : c->w[s]);
        c->sq[k] = s;
        if (c->ref) c->rf[k] = c->ref[s][i];
        if (c->isw) c->iw[k] = c->isw[s][i];
        c->ent[k] = a->entropy[n];
        if (c->w[s] > 0) { /* actor/entropy: token mean over the loss tokens, whatever the bonus */
            c->ent_sum += a->entropy[n];
            c->ent_count += 1;
        }
        k++;
    }
    double loss;
    if (c->cfg->loss_mode == POLICY_LOSS_GSPO) { /* micro-batches hold whole sequences: the mean is exact */
        gspo_seq_log_ratio(c->slr, c->lp, c->old, c->sq, c->wp, k, c->n_seq, c->ssum, c->scnt);
        loss = gspo_token_loss(c->g, c->lp, c->old, c->slr, c->ad, c->isw ? c->iw : NULL, c->wp, k, &c->cfg->ppo,
                               &c->ps);
    } else {
        loss = ppo_token_loss(c->g, c->lp, c->old, c->bh, c->ad, c->isw ? c->iw : NULL, c->ww, k, &c->cfg->ppo,
                              &c->ps);
    }
    c->pg_agg += loss;
    if (c->ref && c->cfg->use_kl_loss) {
        double kl = kl_token_loss(c->g, c->lp, c->rf, c->ww, k, c->cfg->kl_loss_coef, c->cfg->kl_loss_type);
        c->kl_sum += kl;
        loss += c->cfg->kl_loss_coef * kl;
    }
    if (c->cfg->entropy_coeff != 0) {
        double h = entropy_bonus(c->dent, c->ent, c->ww, k, c->cfg->entropy_coeff);
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

int trainer_group_rewards(const trainer *T, const rl_group *g, float *rewards, float *raw_scores) {
    const rl_config *cfg = T->cfg;
    if (!g->rewards) /* every group comes through the rollouter's reward pool */
        return moerl_errorf("group uid %lld (row %d) reached the trainer without its rewards", (long long)g->uid,
                            g->row);
    for (int j = 0; j < g->n; j++) {
        const gen_request *r = &g->reqs[j];
        double score = g->rewards[j].score;
        if (raw_scores) raw_scores[j] = (float)score;
        if (cfg->overlong_enable)
            score += overlong_penalty(r->n_out, cfg->max_response_length, cfg->overlong_len,
                                      cfg->overlong_penalty_factor);
        rewards[j] = (float)score;
    }
    return MOERL_OK;
}

int rl_group_uniform_reward(const float *rewards, int n) {
    for (int j = 1; j < n; j++)
        if (rewards[j] != rewards[0]) return 0;
    return 1;
}

int trainer_sample_stats(const trainer *T, rl_group **groups, int n, train_stats *st) {
    const int G = T->cfg->n, R = n * G;
    float *rewards = xmalloc((size_t)(G ? G : 1) * sizeof(float)), *raw = xmalloc((size_t)(G ? G : 1) * sizeof(float));
    st->min_version = 1 << 30;
    double rsum = 0, rsq = 0;
    int64_t clipped = 0;
    for (int g = 0; g < n; g++) {
        MOERL_ASSERT(groups[g]->n == G);
        if (trainer_group_rewards(T, groups[g], rewards, raw) != MOERL_OK) {
            free(rewards);
            free(raw);
            return MOERL_ERR;
        }
        for (int j = 0; j < G; j++) {
            const gen_request *r = &groups[g]->reqs[j];
            const double score = rewards[j];
            rsum += score;
            rsq += score * score;
            st->acc_mean += raw[j] >= 1.0;
            clipped += r->finish == FINISH_LENGTH;
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
            st->response_length_mean += r->n_out; /* the whole output, tool turns included (verl) */
            if (r->out_mask)
                for (int t = 0; t < r->n_out; t++) st->loss_tokens_mean += r->out_mask[t] != 0;
            else
                st->loss_tokens_mean += r->n_out;
            st->response_length_max = MOERL_MAX(st->response_length_max, r->n_out);
            st->resp_tokens += r->n_out;
        }
    }
    free(rewards);
    free(raw);
    st->n_samples = R;
    if (R > 0) {
        st->reward_mean = rsum / R;
        st->reward_std = sqrt(fmax(0.0, rsq / R - st->reward_mean * st->reward_mean));
        st->acc_mean /= R;
        st->response_length_mean /= R;
        st->loss_tokens_mean /= R;
        st->response_clip_ratio = (double)clipped / R;
    }
    return MOERL_OK;
}

/* model_backward's per-layer hook in data-parallel mode: the group's gradients are final. */
static void reducer_hook(void *ctx, int group) { MOERL_ASSERT(dist_reducer_layer_done(ctx, group) == MOERL_OK); }

/* Sum x[n] over the trainer ranks (data parallel); nothing in one process. */
static int trainers_sum(trainer *T, double *x, int n) {
    return T->dist ? dist_allreduce_sum(T->dist, DIST_TRAINERS, x, n) : MOERL_OK;
}

/* The step's sequences (prompt ⊕ response of every response of every group on this rank) with
 * their rewards, advantages (algorithm.adv_estimator over the whole step: group-local estimators
 * need nothing else, REINFORCE++'s whitening sums its moments over the trainer ranks) and loss
 * mask (actor.overlong_filter masks responses cut at max_response_length). A multi-turn response's
 * token mask is its out_mask (seqs[s].resp_mask): the inserted tool-turn tokens are outside the
 * loss, and n_loss — the model-sampled tokens — is what every normalisation counts. */
typedef struct {
    int n_groups, R;
    train_seq *seqs;
    int **toks;
    float **behav, **prox, **ref, **isw;
    float *rewards, *adv;
    int *resp_len, *n_loss, *loss_mask; /* n_out (the whole output), its loss tokens, in the loss at all */
    double *w, *w_pg;       /* w_pg: gspo's policy-loss weights (seq-mean-token-mean), else NULL */
    /* rollout correction (step_data_mismatch, step_data_rejection): rs_mask[s] is sequence s's response
     * mask after rejection sampling (seqs[s].resp_mask points at it), NULL when rollout_rs is off */
    unsigned char **rs_mask;
    probs_mismatch_stats mm;
    offpolicy_stats offp;
    rollout_rs_stats rs;
    /* routing replay: the rollout's routes of each sequence [len, n_moe·K] (−1 rows where none was recorded;
     * NULL: none recorded), R2's record of the old-logprob pass; the agreement counts [3·n_moe] (NULL: none) */
    int16_t **rroutes, **r2routes;
    double *agree;
    int count_routes;       /* the update's forwards count the agreement (no old-logprob pass, first epoch) */
} step_data;

static void step_data_free(step_data *d) {
    for (int s = 0; s < d->R; s++) {
        free(d->toks[s]);
        if (d->prox) free(d->prox[s]);
        if (d->ref) free(d->ref[s]);
        if (d->isw) free(d->isw[s]);
        if (d->rs_mask) free(d->rs_mask[s]);
    }
    free(d->rs_mask);
    for (int s = 0; s < d->R; s++) {
        if (d->rroutes) free(d->rroutes[s]);
        if (d->r2routes) free(d->r2routes[s]);
    }
    free(d->rroutes); free(d->r2routes); free(d->agree);
    free(d->prox); free(d->ref); free(d->isw); free(d->toks); free(d->behav); free(d->seqs);
    free(d->rewards); free(d->adv); free(d->resp_len); free(d->n_loss); free(d->loss_mask); free(d->w); free(d->w_pg);
}

static float **alloc_resp_arrays(const step_data *d) {
    float **x = xcalloc((size_t)(d->R ? d->R : 1), sizeof(float *));
    for (int s = 0; s < d->R; s++) x[s] = xmalloc((size_t)(d->seqs[s].len - d->seqs[s].resp_start + 1) * sizeof(float));
    return x;
}

static int step_data_routes(trainer *T, rl_group **groups, step_data *d);

static int step_data_init(trainer *T, rl_group **groups, int n, step_data *d) {
    const rl_config *cfg = T->cfg;
    const int G = cfg->n, R = n * G;
    memset(d, 0, sizeof *d);
    d->n_groups = n;
    d->R = R;
    const size_t nr = (size_t)(R ? R : 1);
    d->seqs = xmalloc(nr * sizeof(train_seq));
    d->toks = xcalloc(nr, sizeof(int *));
    d->behav = xmalloc(nr * sizeof(float *));
    d->rewards = xmalloc(nr * sizeof(float));
    d->adv = xmalloc(nr * sizeof(float));
    d->resp_len = xmalloc(nr * sizeof(int));
    d->n_loss = xmalloc(nr * sizeof(int));
    d->loss_mask = xmalloc(nr * sizeof(int));
    d->w = xcalloc(nr, sizeof(double));
    for (int g = 0; g < n; g++) {
        MOERL_ASSERT(groups[g]->n == G);
        if (trainer_group_rewards(T, groups[g], d->rewards + g * G, NULL) != MOERL_OK) return MOERL_ERR;
        for (int j = 0; j < G; j++) {
            const gen_request *r = &groups[g]->reqs[j];
            const int s = g * G + j, L = r->prompt_len + r->n_out;
            d->toks[s] = xmalloc((size_t)L * sizeof(int));
            memcpy(d->toks[s], r->prompt, (size_t)r->prompt_len * sizeof(int));
            memcpy(d->toks[s] + r->prompt_len, r->out_tokens, (size_t)r->n_out * sizeof(int));
            d->seqs[s] = (train_seq){.tokens = d->toks[s], .len = L, .resp_start = r->prompt_len,
                                     .resp_mask = r->out_mask};
            d->behav[s] = r->out_logprobs;
            d->resp_len[s] = r->n_out;
            d->n_loss[s] = (int)train_seq_loss_tokens(&d->seqs[s]);
            d->loss_mask[s] = d->n_loss[s] > 0 && !(cfg->overlong_filter && r->finish == FINISH_LENGTH);
        }
    }
    return step_data_routes(T, groups, d);
}

/* Entries a token of the routes arrays holds (n_moe_layers · K); 0 for a dense model. */
static int route_width(const trainer *T) {
    return model_moe_layer_count(&T->m->cfg) * T->m->cfg.num_experts_per_tok;
}

/* The rollout's routes of every sequence (gen_request.out_routes: n_routes recorded tokens of prompt ⊕
 * output, the rest −1) and, under R3, the replay of every trainer forward. The agreement counts exist
 * whenever the engine records (a config switch, alike on every trainer rank: their sum is collective).
 * Errors: R3 and a response without routes, more recorded tokens than the sequence has. */
static int step_data_routes(trainer *T, rl_group **groups, step_data *d) {
    const rl_config *cfg = T->cfg;
    const int per = route_width(T), G = cfg->n;
    if (per <= 0) return MOERL_OK;
    if (cfg->rollout_routing_replay) d->agree = xcalloc((size_t)3 * (per / T->m->cfg.num_experts_per_tok), sizeof(double));
    d->rroutes = xcalloc((size_t)(d->R ? d->R : 1), sizeof(int16_t *));
    for (int s = 0; s < d->R; s++) {
        const gen_request *r = &groups[s / G]->reqs[s % G];
        const int L = d->seqs[s].len;
        if (!r->out_routes) {
            if (cfg->router_replay == ROUTER_REPLAY_R3)
                return moerl_errorf("actor.router_replay.mode=R3: response %lld of the step carries no recorded routes "
                                    "(rollout.enable_rollout_routing_replay must be on in the engine that generated it)",
                                    (long long)r->id);
            continue;
        }
        if (r->n_routes < 0 || r->n_routes > L)
            return moerl_errorf("routing replay: response %lld has %d recorded routes for %d tokens", (long long)r->id,
                                r->n_routes, L);
        d->rroutes[s] = xmalloc((size_t)L * per * sizeof(int16_t));
        memcpy(d->rroutes[s], r->out_routes, (size_t)r->n_routes * per * sizeof(int16_t));
        for (size_t k = (size_t)r->n_routes * per; k < (size_t)L * per; k++) d->rroutes[s][k] = -1;
        if (cfg->router_replay == ROUTER_REPLAY_R3) d->seqs[s].routes = d->rroutes[s];
    }
    return MOERL_OK;
}

/* The agreement counts of this step's first forward (d->agree: [count, agree, agree_native] per MoE layer),
 * summed over the trainer ranks, into st. */
static int finish_route_stats(trainer *T, step_data *d, train_stats *st) {
    st->routing_agreement_min = NAN;
    if (!d->agree) return MOERL_OK;
    const int Lm = route_width(T) / T->m->cfg.num_experts_per_tok;
    if (trainers_sum(T, d->agree, 3 * Lm) != MOERL_OK) return MOERL_ERR;
    for (int i = 0; i < Lm; i++) {
        const double n = d->agree[i], a = d->agree[Lm + i];
        st->routing_count += n;
        st->routing_agree += a;
        st->routing_agree_native += d->agree[2 * Lm + i];
        if (n > 0 && !(a / n >= st->routing_agreement_min)) st->routing_agreement_min = a / n;
    }
    return MOERL_OK;
}

/* The route options of a pass over sequences [s0, ...) of d: the agreement counts (first forward) and R2's
 * record (old-logprob pass). NULL when the pass has neither. */
static const train_route_opts *route_opts(trainer *T, step_data *d, int s0, int count, int record,
                                          train_route_opts *ro) {
    const int Lm = route_width(T) / (T->m->cfg.num_experts_per_tok ? T->m->cfg.num_experts_per_tok : 1);
    memset(ro, 0, sizeof *ro);
    if (count && d->agree) {
        ro->compare = (const int16_t *const *)d->rroutes + s0;
        ro->count = d->agree;
        ro->agree = d->agree + Lm;
        ro->agree_native = d->agree + 2 * Lm;
    }
    if (record && d->r2routes) ro->record = d->r2routes + s0;
    return ro->compare || ro->record ? ro : NULL;
}

/* algorithm.use_kl_in_reward (verl apply_kl_penalty): each response's score r − β·Σ_t kl_t over its
 * loss tokens, kl = algorithm.kl_penalty between the old logprobs (the PPO anchor: recomputed, or the
 * behaviour's in bypass mode) and the reference's; β = the controller's value before this step's
 * update. The mean KL is summed over the trainer ranks, so every rank updates β alike. */
static int step_data_kl_reward(trainer *T, step_data *d, train_stats *st) {
    double acc[2] = {0, (double)d->R};
    const double beta = T->kl_ctrl.value;
    for (int s = 0; s < d->R; s++) {
        const float *old = d->prox ? d->prox[s] : d->behav[s];
        double mean;
        const double sum = kl_response_sum(T->cfg->kl_penalty, old, d->ref[s], d->seqs[s].resp_mask, d->resp_len[s],
                                           &mean);
        d->rewards[s] = (float)((double)d->rewards[s] - beta * sum);
        acc[0] += mean;
    }
    if (trainers_sum(T, acc, 2) != MOERL_OK) return MOERL_ERR;
    acc[0] /= T->replication; /* whole sequences on every rank of a Ulysses group */
    acc[1] /= T->replication;
    const double current_kl = acc[1] > 0 ? acc[0] / acc[1] : 0.0;
    st->reward_kl_penalty = current_kl;
    st->reward_kl_penalty_coeff = beta;
    kl_controller_update(&T->kl_ctrl, current_kl, (int64_t)acc[1]); /* verl: n_steps = batch size */
    return MOERL_OK;
}

/* verl's training/rollout_probs_diff_* and rollout_actor_probs_pearson_corr: the trainer's logprobs
 * before the step (d->prox) against the behaviour's, over the loss tokens of the sequences in the loss
 * (before rejection sampling, as verl computes them right after the old-logprob pass); and verl's
 * off-policy diagnostics (compute_offpolicy_metrics: rollout_corr/kl, k3_kl, ppl, chi2) on the same tokens. */
static void step_data_mismatch(step_data *d) {
    probs_mismatch_init(&d->mm);
    offpolicy_init(&d->offp);
    for (int s = 0; s < d->R; s++)
        if (d->loss_mask[s]) {
            probs_mismatch_add(&d->mm, d->prox[s], d->behav[s], d->seqs[s].resp_mask, d->resp_len[s]);
            offpolicy_add(&d->offp, d->prox[s], d->behav[s], d->seqs[s].resp_mask, d->resp_len[s]);
        }
}

/* algorithm.rollout_correction.rollout_rs (verl compute_rollout_rejection_mask, applied as verl's
 * ray_trainer does: after the KL-in-reward penalty, before the advantages): each sequence in the loss
 * gets a new response mask without its rejected tokens, and its loss-token count from it, so the
 * rejected tokens leave the loss, the entropy bonus, the KL loss and every loss_agg_mode's
 * normalisation (a sequence rejected whole leaves the sequence count), as verl's modified
 * response_mask does. Needs d->prox (the config requires bypass_mode=false). */
static void step_data_rejection(trainer *T, step_data *d) {
    const rl_config *cfg = T->cfg;
    rollout_rs_stats_init(&d->rs);
    if (cfg->rollout_rs.n == 0 || !d->prox) return;
    d->rs_mask = xcalloc((size_t)(d->R ? d->R : 1), sizeof(unsigned char *));
    for (int s = 0; s < d->R; s++) {
        if (!d->loss_mask[s]) continue;
        d->rs_mask[s] = xmalloc((size_t)d->resp_len[s] + 1);
        rollout_rs_sequence(&cfg->rollout_rs, d->prox[s], d->behav[s], d->seqs[s].resp_mask, d->resp_len[s],
                            d->rs_mask[s], &d->rs);
        d->seqs[s].resp_mask = d->rs_mask[s];
        d->n_loss[s] = (int)train_seq_loss_tokens(&d->seqs[s]);
        d->loss_mask[s] = d->n_loss[s] > 0;
    }
}

/* The advantages of the step's responses (algorithm.adv_estimator), after the KL penalty when
 * use_kl_in_reward: the GRPO-family estimators take the summed token rewards as the outcome score. */
static int step_data_advantages(trainer *T, step_data *d, train_stats *st) {
    const rl_config *cfg = T->cfg;
    const int n = d->n_groups, R = d->R;
    if (cfg->use_kl_in_reward && step_data_kl_reward(T, d, st) != MOERL_OK) return MOERL_ERR;
    step_data_rejection(T, d);
    int *sizes = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    for (int g = 0; g < n; g++) sizes[g] = cfg->n;
    switch (cfg->adv_estimator) {
    case RL_ADV_GRPO:
        if (cfg->norm_adv_by_std) grpo_advantages(d->adv, d->rewards, sizes, n, 1e-6f);
        else grpo_advantages_no_std(d->adv, d->rewards, sizes, n);
        break;
    case RL_ADV_RLOO: rloo_advantages(d->adv, d->rewards, sizes, n); break;
    case RL_ADV_REINFORCE_PP_BASELINE: {
        reinforce_pp_baseline(d->adv, d->rewards, sizes, n);
        double mom[3] = {0, 0, 0};
        reinforce_pp_moments(d->adv, d->n_loss, R, mom);
        if (trainers_sum(T, mom, 3) != MOERL_OK) {
            free(sizes);
            return MOERL_ERR;
        }
        reinforce_pp_whiten(d->adv, R, mom);
        break;
    }
    }
    free(sizes);
    return MOERL_OK;
}

/* Old (proximal) logprobs with the weights before the step, when decoupled or when the rollout
 * correction does not bypass; rollout IS weights from them; reference logprobs for the KL loss. */
static int step_data_logprobs(trainer *T, step_data *d, rollout_is_stats *is) {
    const rl_config *cfg = T->cfg;
    if (cfg->ppo.decoupled || cfg->recompute_old) {
        d->prox = alloc_resp_arrays(d);
        const int per = route_width(T);
        if (cfg->router_replay == ROUTER_REPLAY_R2 && per > 0) { /* R2: this pass records, the updates replay */
            d->r2routes = xcalloc((size_t)(d->R ? d->R : 1), sizeof(int16_t *));
            for (int s = 0; s < d->R; s++) {
                d->r2routes[s] = xmalloc((size_t)d->seqs[s].len * per * sizeof(int16_t));
                for (size_t k = 0; k < (size_t)d->seqs[s].len * per; k++) d->r2routes[s][k] = -1;
            }
        }
        train_route_opts ro;
        if (compute_logprobs_routes(T->m, &T->acts, d->seqs, d->R, cfg->ppo_max_token_len, cfg->temperature, d->prox,
                                    route_opts(T, d, 0, 1, 1, &ro)) != MOERL_OK)
            return MOERL_ERR;
        step_data_mismatch(d);
        for (int s = 0; d->r2routes && s < d->R; s++) d->seqs[s].routes = d->r2routes[s];
        if (cfg->recompute_old && cfg->rollout_is != ROLLOUT_IS_NONE) {
            d->isw = alloc_resp_arrays(d);
            for (int s = 0; s < d->R; s++)
                rollout_is_weights_masked(d->isw[s], d->prox[s], d->behav[s], d->seqs[s].resp_mask, d->resp_len[s],
                                          cfg->rollout_is, cfg->rollout_is_threshold, d->loss_mask[s] ? is : NULL);
        }
    }
    if (T->ref) { /* the frozen reference routes natively: the replayed routes are the policy's */
        d->ref = alloc_resp_arrays(d);
        train_seq *native = xmalloc((size_t)(d->R ? d->R : 1) * sizeof(train_seq));
        for (int s = 0; s < d->R; s++) {
            native[s] = d->seqs[s];
            native[s].routes = NULL;
        }
        const int rc = trainer_ref_logprobs(T, native, d->R, d->ref);
        free(native);
        if (rc != MOERL_OK) return MOERL_ERR;
    }
    return MOERL_OK;
}

/* Aggregation weights of every sequence: the loss tokens and loss sequences of each mini-batch are
 * summed over the trainer ranks first, so every mode equals its value over the whole mini-batch. */
static int step_data_weights(trainer *T, step_data *d, const rl_minibatch *mbs, int n_mb) {
    const rl_config *cfg = T->cfg;
    const int G = cfg->n;
    double *cnt = xcalloc((size_t)(2 * n_mb + 1), sizeof(double));
    int s0 = 0;
    for (int b = 0; b < n_mb; b++) {
        const int s1 = s0 + mbs[b].n_groups * G;
        for (int s = s0; s < s1; s++)
            if (d->loss_mask[s]) {
                cnt[2 * b] += d->n_loss[s];
                cnt[2 * b + 1] += 1;
            }
        s0 = s1;
    }
    if (trainers_sum(T, cnt, 2 * n_mb) != MOERL_OK) {
        free(cnt);
        return MOERL_ERR;
    }
    for (int b = 0; b < 2 * n_mb; b++) cnt[b] /= T->replication; /* each sequence once (Ulysses SP) */
    const double H = cfg->loss_scale_factor > 0 ? cfg->loss_scale_factor : cfg->max_response_length;
    /* GSPO: verl's compute_policy_loss_gspo aggregates its pg loss seq-mean-token-mean whatever
     * actor.loss_agg_mode says; the KL loss and the entropy bonus keep actor.loss_agg_mode */
    if (cfg->loss_mode == POLICY_LOSS_GSPO) d->w_pg = xcalloc((size_t)(d->R ? d->R : 1), sizeof(double));
    s0 = 0;
    for (int b = 0; b < n_mb; b++) {
        const int s1 = s0 + mbs[b].n_groups * G;
        for (int s = s0; s < s1; s++) {
            const int64_t T_b = (int64_t)cnt[2 * b], S_b = (int64_t)cnt[2 * b + 1];
            d->w[s] = d->loss_mask[s] ? loss_agg_weight(cfg->loss_agg, d->n_loss[s], T_b, S_b, H) : 0.0;
            if (d->w_pg)
                d->w_pg[s] = d->loss_mask[s] ? loss_agg_weight(LOSS_AGG_SEQ_MEAN_TOKEN_MEAN, d->n_loss[s], T_b, S_b, H)
                                             : 0.0;
        }
        s0 = s1;
    }
    free(cnt);
    return MOERL_OK;
}

/* Max/mean tokens per expert of this rank's last micro-batch, averaged over the MoE layers. */
static double expert_load_ratio(const trainer *T) {
    const moe_config *mc = &T->m->cfg;
    double ratio = 0;
    int nl = 0;
    for (int l = 0; l < mc->num_hidden_layers; l++) {
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
    return nl ? ratio / nl : 0;
}

/* Does this mini-batch need the global aux pre-pass? Identical on every trainer rank. */
static int n_moe_layers(const moe_config *c) {
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += moe_config_layer_is_moe(c, l);
    return n;
}

static int want_global_aux(trainer *T, const train_seq *seqs, int n) {
    if (!(T->m->cfg.router_aux_loss_coef > 0) || T->m->cfg.num_experts <= 0 || n_moe_layers(&T->m->cfg) <= 0) return 0;
    if (T->dist) return 1;
    return count_microbatches(seqs, n, T->cfg->ppo_max_token_len) > 1;
}

/* The aggregated aux loss value of one update, E·Σ_e counts_e·psum_e / (L·N)², the same on every
 * rank (divided by the rank count, as the statistics are summed over the ranks afterwards). */
static double aux_value(const trainer *T, const double *counts, const double *psum, int64_t tokens) {
    const int E = T->m->cfg.num_experts, L = n_moe_layers(&T->m->cfg);
    const double rows = (double)L * (double)tokens;
    if (L <= 0 || E <= 0 || !(rows > 0)) return 0.0;
    double v = 0;
    for (int e = 0; e < E; e++) v += counts[e] * psum[e];
    return E * v / (rows * rows) / (T->dist ? T->dist->trainer_size : 1);
}

/* The end of a mini-batch under 1-bit Adam past its freeze: the compressed step (trainer_onebit.h)
 * instead of the gradient all-reduce and AdamW; the statistics as update_minibatch keeps them. */
static int onebit_minibatch_end(trainer *T, double loss, int n_pass, int max_pass, int global_aux, const double *aux_counts, double *aux_psum,
                                const rl_minibatch *mb, const train_step_out *so, train_stats *st, double *aux_sum,
                                double *tokens_sum) {
    T->stage = "update";
    if (par_finish_grads(T->par, n_pass, max_pass) != MOERL_OK) return MOERL_ERR;
    if (global_aux && trainers_sum(T, aux_psum, T->m->cfg.num_experts) != MOERL_OK) return MOERL_ERR;
    double gn;
    int applied;
    params_restore(T); /* bf16 × batch_invariant: the step updates the fp32 masters, as update_minibatch's */
    const int rc = trainer_onebit_step(T, &loss, &gn, &applied, st);
    params_round(T);
    if (rc != MOERL_OK) return MOERL_ERR;
    st->grad_norm += gn;
    *aux_sum += aux_value(T, aux_counts, aux_psum, mb->tokens);
    *tokens_sum += (double)so->n_tokens;
    return MOERL_OK;
}

/* One optimizer update on mini-batch sequences [s0, s1) of d: (the global aux counts first,) the
 * accumulated gradient, its reduction over the trainer ranks, AdamW. aux_buf holds 2E doubles.
 * Adds to st (grad_norm, reduction time and bytes, the pipeline schedule's statistics), *aux_sum and
 * *tokens_sum. */
static int update_minibatch(trainer *T, step_data *d, ppo_ctx *c, train_step_opts *to, const rl_minibatch *mb,
                            int s0, int s1, double *aux_buf, train_stats *st, double *aux_sum, double *tokens_sum) {
    const int E = T->m->cfg.num_experts;
    double *aux_counts = aux_buf, *aux_psum = aux_buf + E;
    c->w = d->w + s0;
    c->w_pg = d->w_pg ? d->w_pg + s0 : NULL;
    c->n_seq = s1 - s0;
    c->adv = d->adv + s0;
    c->anchor = (d->prox ? d->prox : d->behav) + s0;
    c->behav = d->behav + s0;
    c->ref = d->ref ? d->ref + s0 : NULL;
    c->isw = d->isw ? d->isw + s0 : NULL;
    to->total_tokens = mb->tokens;
    const int global_aux = want_global_aux(T, d->seqs + s0, s1 - s0);
    memset(aux_buf, 0, (size_t)(2 * E) * sizeof(double));
    to->aux_counts = NULL;
    to->aux_counts_out = aux_counts; /* one micro-batch on one rank: its own counts are the global ones */
    to->aux_psum_out = aux_psum;
    /* FSDP / EP: every member of a group runs the group's number of passes (parallel.h) */
    const int n_pass = count_microbatches(d->seqs + s0, s1 - s0, T->cfg->ppo_max_token_len),
              max_pass = par_max_passes(T->par, n_pass);
    if (n_pass < 0 || max_pass < 0) return MOERL_ERR;
    if (global_aux) { /* HF's aux over the whole mini-batch: its routing counts first */
        T->stage = "router_counts";
        if (compute_router_counts(T->m, &T->acts, d->seqs + s0, s1 - s0, T->cfg->ppo_max_token_len, aux_counts) !=
                MOERL_OK ||
            par_pad_passes(T->par, n_pass, max_pass, 0) != MOERL_OK || trainers_sum(T, aux_counts, E) != MOERL_OK)
            return MOERL_ERR;
        if (T->par && T->par->pp) /* every stage of a pipeline counted its sequences: count them once */
            for (int e = 0; e < E; e++) aux_counts[e] /= T->par->grid->pp;
        for (int e = 0; e < E; e++) aux_counts[e] /= par_batch_copies(T->par); /* TP: each member counted them */
        to->aux_counts = aux_counts;
        to->aux_counts_out = NULL;
        T->stage = "update";
    }
    train_step_out so;
    /* 1-bit Adam past its freeze: no gradient all-reduce during backward (trainer_onebit.h) */
    const int onebit = trainer_onebit_compress_next(T);
    to->layer_hook = !onebit && T->reducer ? reducer_hook : NULL;
    train_route_opts ro; /* no old-logprob pass: the first epoch's forward counts the routing agreement */
    to->routes = d->count_routes ? route_opts(T, d, s0, 1, 0, &ro) : NULL;
    const int rc = train_accumulate(T->m, &T->acts, d->seqs + s0, s1 - s0, to, ppo_grad, c, &so);
    to->routes = NULL;
    if (rc != MOERL_OK) return MOERL_ERR;
    if (T->par && T->par->pp) pp_window_add(&st->pp, pp_last_stats(T->par->pp)); /* the schedule's bubble */
    double loss = so.loss;
    if (onebit) return onebit_minibatch_end(T, loss, n_pass, max_pass, global_aux, aux_counts, aux_psum, mb, &so, st, aux_sum, tokens_sum);
    if (T->dist) { /* gradients and loss summed over the trainer ranks (DP reducer, or FSDP's reduce-scatter) */
        T->stage = "grad_reduce";
        const double tr = trace_begin();
        if (par_finish_grads(T->par, n_pass, max_pass) != MOERL_OK) return MOERL_ERR;
        if (T->reducer) {
            st->reduce_exposed_s += dist_reducer_finish(T->reducer);
            double sent, raw;
            dist_reducer_last_bytes(T->reducer, &sent, &raw);
            st->grad_bytes_sent += sent;
            st->grad_bytes_raw += raw;
        }
        trace_end("grad_reduce_wait", "dist", tr);
        if (dist_allreduce_sum(T->dist, DIST_TRAINERS, &loss, 1) != MOERL_OK) return MOERL_ERR;
        loss /= par_batch_copies(T->par); /* TP: every member has the whole loss */
        T->stage = "update";
    }
    if (global_aux && trainers_sum(T, aux_psum, E) != MOERL_OK) return MOERL_ERR;
    for (int e = 0; global_aux && e < E; e++) aux_psum[e] /= par_batch_copies(T->par);
    double gn;
    params_restore(T); /* bf16 × batch_invariant: the step updates the fp32 masters */
    par_adamw_step(T->par, T->m, &T->opt, T->cfg->optim.lr, (float)loss, &gn);
    params_round(T);
    st->grad_norm += gn;
    *aux_sum += aux_value(T, aux_counts, aux_psum, mb->tokens);
    *tokens_sum += (double)so.n_tokens;
    return MOERL_OK;
}

/* The step's loss statistics: this rank's sums (sums[15], layout below), summed over the trainer
 * ranks, into st. actor/pg_loss is the loss as actor.loss_agg_mode aggregates it (verl), mean over
 * the updates; pg_clipfrac and ppo_kl are token means (verl's masked_mean); no loss token at all
 * gives NaN (null in the metrics) and a warning. */
static int finish_stats(trainer *T, double *sums, int n_updates, train_stats *st) {
    if (trainers_sum(T, sums, 15) != MOERL_OK) return MOERL_ERR;
    /* perf/pipeline_*: every data-parallel pipeline's schedules, not only this rank's */
    if (T->par && T->par->pp && pp_window_over_replicas(&st->pp, T->par->grid->stage_comm) != MOERL_OK)
        return MOERL_ERR;
    /* per-token sums (0–9) are split over a Ulysses group's ranks; the importance-weight statistics
     * and the FLOPs (10–14) come from whole sequences, present on each of its ranks */
    for (int k = 10; k < 15; k++) sums[k] /= T->replication;
    for (int k = 0; k < 10; k++) sums[k] /= par_batch_copies(T->par); /* TP: the whole tokens on every member */
    const int nu = n_updates ? n_updates : 1;
    st->empty_steps = sums[3] > 0 ? 0 : 1;
    if (sums[3] > 0) {
        st->pg_loss = sums[0] / nu;
        st->pg_clipfrac = sums[1] / sums[3];
        st->ppo_kl = sums[2] / sums[3];
        st->behav_dropped_frac = sums[9] / sums[3];
    } else {
        st->pg_loss = st->pg_clipfrac = st->ppo_kl = st->behav_dropped_frac = NAN;
        log_warn("trainer step %lld: no response token carries loss (actor.overlong_filter masked every response, "
                 "every response is empty, or holds only tool-turn tokens, or algorithm.rollout_correction.rollout_rs "
                 "rejected every token): nothing was learned from this step; its "
                 "actor/pg_loss, pg_clipfrac, ppo_kl and entropy are left out of the version's means and it is counted "
                 "in actor/empty_steps",
                 (long long)T->step + 1);
    }
    st->entropy = sums[8] > 0 && sums[3] > 0 ? sums[4] / sums[8] : NAN;
    st->kl_loss = sums[5] / nu;
    st->grad_norm /= nu; /* the reduced gradient's norm: the same on every rank */
    st->aux_loss = sums[6] / nu;
    st->trained_tokens = (int64_t)sums[7];
    st->train_flops = sums[14];
    if (sums[13] > 0) {
        const double m = sums[10] / sums[13], m2 = sums[11] / sums[13];
        st->rollout_is_mean = m;
        st->rollout_is_std = sqrt(fmax(0.0, m2 - m * m));
        st->rollout_is_truncated_frac = sums[12] / sums[13];
        st->rollout_is_ess = m2 > 0 ? m * m / m2 : 0; /* (Σw)²/(n·Σw²) */
    }
    return MOERL_OK;
}

/* Elementwise max of x[n] over the trainer ranks (each rank's values in its own slot of a summed
 * buffer: the sum collective is the only one the trainers have); nothing in one process. */
static int trainers_max(trainer *T, double *x, int n) {
    if (!T->dist || n <= 0) return MOERL_OK;
    const int D = T->dist->trainer_size, r = T->dist->trainer_rank;
    double *buf = xcalloc((size_t)D * (size_t)n, sizeof(double));
    memcpy(buf + (size_t)r * n, x, (size_t)n * sizeof(double));
    const int rc = dist_allreduce_sum(T->dist, DIST_TRAINERS, buf, D * n);
    if (rc == MOERL_OK)
        for (int i = 0; i < n; i++) {
            double m = -INFINITY;
            for (int k = 0; k < D; k++) m = fmax(m, buf[(size_t)k * n + i]);
            x[i] = m;
        }
    free(buf);
    return rc;
}

/* The mismatch metrics and rollout_rs's metrics of the step: this rank's sums, summed over the
 * trainer ranks (whole sequences on each rank of a group sharing a shard: divided by replication),
 * the maxima maxed; then the ratios. */
static int finish_rollout_corr(trainer *T, step_data *d, train_stats *st) {
    const rl_config *cfg = T->cfg;
    if (d->prox) {
        probs_mismatch_stats *mm = &d->mm;
        double sums[8] = {mm->n, mm->sx, mm->sy, mm->sxx, mm->syy, mm->sxy, mm->sd, mm->sdd};
        if (trainers_sum(T, sums, 8) != MOERL_OK || trainers_max(T, &mm->dmax, 1) != MOERL_OK) return MOERL_ERR;
        for (int k = 0; k < 8; k++) sums[k] /= T->replication;
        mm->n = sums[0]; mm->sx = sums[1]; mm->sy = sums[2]; mm->sxx = sums[3]; mm->syy = sums[4];
        mm->sxy = sums[5]; mm->sd = sums[6]; mm->sdd = sums[7];
        probs_mismatch_finish(mm, &st->probs_diff_max, &st->probs_diff_mean, &st->probs_diff_std, &st->probs_pearson);
        st->mismatch_steps = mm->n > 0;
        if (trainers_sum(T, d->offp.sum, OFFP_N_SUM) != MOERL_OK || trainers_max(T, d->offp.max, 2) != MOERL_OK)
            return MOERL_ERR;
        for (int k = 0; k < OFFP_N_SUM; k++) d->offp.sum[k] /= T->replication;
        offpolicy_metrics(&d->offp, NULL, st->offpolicy_vals);
    }
    if (cfg->rollout_rs.n > 0) {
        if (trainers_sum(T, d->rs.sum, RS_N_SUMS) != MOERL_OK || trainers_max(T, d->rs.max, RS_N_MAXS) != MOERL_OK)
            return MOERL_ERR;
        for (int k = 0; k < RS_N_SUMS; k++) d->rs.sum[k] /= T->replication;
        rollout_rs_metrics(&cfg->rollout_rs, &d->rs, NULL, st->rs_vals);
        st->rs_steps = d->rs.sum[RS_HEAD_TOK] > 0;
    }
    return MOERL_OK;
}

static void ppo_ctx_alloc(ppo_ctx *c, int mt) {
    c->lp = xmalloc(mt * sizeof(float)); c->old = xmalloc(mt * sizeof(float)); c->bh = xmalloc(mt * sizeof(float));
    c->ad = xmalloc(mt * sizeof(float)); c->ww = xmalloc(mt * sizeof(float)); c->g = xmalloc(mt * sizeof(float));
    c->ent = xmalloc(mt * sizeof(float)); c->dent = xmalloc(mt * sizeof(float)); c->rf = xmalloc(mt * sizeof(float));
    c->iw = xmalloc(mt * sizeof(float)); c->idx = xmalloc(mt * sizeof(int));
    c->wp = xmalloc(mt * sizeof(float)); c->slr = xmalloc(mt * sizeof(float)); c->sq = xmalloc(mt * sizeof(int));
}

static void ppo_ctx_free(ppo_ctx *c) {
    free(c->lp); free(c->old); free(c->bh); free(c->ad); free(c->ww); free(c->g); free(c->ent); free(c->dent);
    free(c->rf); free(c->iw); free(c->idx); free(c->wp); free(c->slr); free(c->sq); free(c->ssum); free(c->scnt);
}

/* step_data_logprobs's passes: the proximal one, and the reference's (trainer_init made T->ref for
 * use_kl_loss). */
int rl_fwd_only_passes(const rl_config *cfg) {
    return (cfg->ppo.decoupled || cfg->recompute_old) + !!(cfg->use_kl_loss || cfg->use_kl_in_reward);
}

int trainer_update(trainer *T, rl_group **groups, const rl_minibatch *mbs, int n_mb, train_stats *st) {
    const rl_config *cfg = T->cfg;
    const double t0 = moerl_now();
    T->stage = "reward";
    int n = 0;
    for (int b = 0; b < n_mb; b++) n += mbs[b].n_groups;
    int rc = MOERL_ERR, n_updates = 0;
    ppo_ctx c = {.cfg = cfg};
    step_data d;
    rollout_is_stats is = {0};
    double *aux_buf = xcalloc((size_t)(2 * T->m->cfg.num_experts + 1), sizeof(double));
    double aux_sum = 0, tokens_sum = 0;
    if (step_data_init(T, groups, n, &d) != MOERL_OK) goto out;
    int64_t flop_tokens = 0, flop_pairs = 0; /* this rank's share, for perf/mfu */
    for (int s = 0; s < d.R; s++) {
        flop_tokens += d.seqs[s].len;
        flop_pairs += (int64_t)d.seqs[s].len * (d.seqs[s].len + 1) / 2;
    }
    T->stage = "logprobs";
    params_round(T); /* bf16 × batch_invariant: the forwards read the rounded values (no-op otherwise) */
    if (step_data_logprobs(T, &d, &is) != MOERL_OK || step_data_advantages(T, &d, st) != MOERL_OK ||
        step_data_weights(T, &d, mbs, n_mb) != MOERL_OK)
        goto out;
    T->stage = "update";
    ppo_ctx_alloc(&c, cfg->ppo_max_token_len);
    c.ssum = xmalloc((size_t)(d.R ? d.R : 1) * sizeof(double)); /* a mini-batch has at most the step's sequences */
    c.scnt = xmalloc((size_t)(d.R ? d.R : 1) * sizeof(int));
    train_step_opts to = {.max_tokens = cfg->ppo_max_token_len, .want_entropy = 1,
                          .temperature = cfg->temperature > 0 ? cfg->temperature : 1.0f,
                          .aux_coef = T->m->cfg.router_aux_loss_coef,
                          .layer_hook = T->reducer ? reducer_hook : NULL, .layer_hook_ctx = T->reducer,
                          .par = T->par};
    for (int ep = 0; ep < cfg->ppo_epochs; ep++) {
        d.count_routes = ep == 0 && !d.prox; /* else the old-logprob pass counted */
        for (int b = 0, s0 = 0; b < n_mb; s0 += mbs[b].n_groups * cfg->n, b++, n_updates++)
            if (update_minibatch(T, &d, &c, &to, &mbs[b], s0, s0 + mbs[b].n_groups * cfg->n, aux_buf, st, &aux_sum,
                                 &tokens_sum) != MOERL_OK)
                goto out;
    }
    /* loss statistics: sums over this rank's tokens, then over the trainer ranks */
    double sums[15] = {c.pg_agg, c.ps.clipfrac_sum, c.ps.kl_sum, (double)c.ps.n_tokens, c.ent_sum, c.kl_sum,
                       aux_sum, tokens_sum, c.ent_count, c.ps.behav_dropped_sum, is.w_sum, is.w_sq_sum, is.truncated,
                       (double)is.n_tokens,
                       model_train_flops(&T->m->cfg, flop_tokens, flop_pairs) *
                           (cfg->ppo_epochs + rl_fwd_only_passes(cfg) / 3.0)}; /* a forward is a third (perf.h) */
    if (finish_stats(T, sums, n_updates, st) != MOERL_OK || finish_rollout_corr(T, &d, st) != MOERL_OK ||
        finish_route_stats(T, &d, st) != MOERL_OK)
        goto out;
    st->expert_load_max_over_mean = n > 0 ? expert_load_ratio(T) : 0;
    T->step++;
    rc = MOERL_OK;
out:
    params_restore(T);
    ppo_ctx_free(&c);
    free(aux_buf);
    if (d.seqs) step_data_free(&d);
    st->update_s = moerl_now() - t0;
    T->stage = "idle";
    T->last_progress = moerl_now();
    return rc;
}

int rl_plan_step(rl_group *const *groups, int n, int mini_batch, int n_ranks, rl_minibatch *mbs, rl_group ***part,
                 int *n_part) {
    const int nmb = (n + mini_batch - 1) / mini_batch;
    int *owner = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    memset(mbs, 0, (size_t)n_ranks * nmb * sizeof *mbs);
    memset(n_part, 0, (size_t)n_ranks * sizeof *n_part);
    for (int b = 0; b < nmb; b++) {
        const int g0 = b * mini_batch, g1 = MOERL_MIN(n, (b + 1) * mini_batch);
        rl_split_minibatch(groups + g0, g1 - g0, n_ranks, owner + g0);
        int64_t rt = 0, tt = 0;
        for (int g = g0; g < g1; g++) {
            rt += rl_group_resp_tokens(groups[g]);
            tt += rl_group_tokens(groups[g]);
        }
        for (int d = 0; d < n_ranks; d++) {
            mbs[d * nmb + b].resp_tokens = rt;
            mbs[d * nmb + b].tokens = tt;
        }
        for (int g = g0; g < g1; g++) { /* each rank's groups in mini-batch order */
            const int d = owner[g];
            part[d][n_part[d]++] = groups[g];
            mbs[d * nmb + b].n_groups++;
        }
    }
    free(owner);
    return nmb;
}

int trainer_step(trainer *T, rl_group **groups, int n, train_stats *st) {
    memset(st, 0, sizeof *st);
    const double t0 = moerl_now();
    T->stage = "reward";
    if (trainer_sample_stats(T, groups, n, st) != MOERL_OK) {
        T->stage = "idle";
        return MOERL_ERR;
    }
    const int mb = T->cfg->ppo_mini_batch_size;
    rl_minibatch *mbs = xcalloc((size_t)(n + mb - 1) / mb + 1, sizeof *mbs);
    rl_group **mine = xmalloc((size_t)(n ? n : 1) * sizeof *mine);
    int n_mine;
    const int nmb = rl_plan_step(groups, n, mb, 1, mbs, &mine, &n_mine); /* one rank: every group */
    int rc = trainer_update(T, mine, mbs, nmb, st);
    free(mine);
    free(mbs);
    st->update_s = moerl_now() - t0;
    return rc;
}
