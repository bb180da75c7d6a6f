/* Rollouter: feeds prompts, keeps GRPO groups together, respects the staleness budget, applies
 * weight syncs at step boundaries (partial rollout: interrupt and resume). Scores nothing. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/common.h"
#include "rl/rl.h"

void rl_group_free(rl_group *g) {
    if (!g) return;
    for (int j = 0; j < g->n; j++) gen_request_free_outputs(&g->reqs[j]);
    free(g->reqs);
    tok_seq_free(&g->prompt);
    free(g);
}

static void feed_shuffle(prompt_feed *f) {
    rng_state r;
    rng_seed(&r, f->seed * 1000003ULL + (uint64_t)f->epoch);
    for (int64_t i = 0; i < f->n_rows; i++) f->order[i] = (int)i;
    rng_shuffle_int(&r, f->order, (int)f->n_rows);
}

void prompt_feed_init(prompt_feed *f, int64_t n_rows, uint64_t seed) {
    memset(f, 0, sizeof *f);
    f->n_rows = n_rows;
    f->order = xmalloc((n_rows > 0 ? n_rows : 1) * sizeof(int));
    f->seed = seed;
    feed_shuffle(f);
}

void prompt_feed_free(prompt_feed *f) {
    free(f->order);
    free(f->redo);
    f->order = NULL;
    f->redo = NULL;
}

int64_t prompt_feed_next(prompt_feed *f) {
    if (f->redo_pos < f->n_redo) return f->redo[f->redo_pos++];
    if (f->pos >= f->n_rows) {
        f->epoch++;
        f->pos = 0;
        feed_shuffle(f);
    }
    return (int64_t)f->epoch * f->n_rows + f->order[f->pos++];
}

void prompt_feed_seek(prompt_feed *f, int epoch, int64_t pos) {
    f->epoch = epoch;
    feed_shuffle(f);
    f->pos = pos;
}

int rl_check_context(const dataset *train, int max_response_length, int max_position_embeddings, int *longest) {
    int max_plen;
    rl_prompt_lengths(train, NULL, &max_plen);
    if (longest) *longest = max_plen;
    if (max_position_embeddings > 0 && (int64_t)max_plen + max_response_length > max_position_embeddings)
        return moerl_errorf("the longest prompt of %s (%d tokens) + data.max_response_length %d exceeds the model's "
                            "context max_position_embeddings %d: shorten the prompts or the responses, or drop the long "
                            "prompts (data.max_prompt_length with data.filter_overlong_prompts=true)",
                            train->path ? train->path : "the training data", max_plen, max_response_length,
                            max_position_embeddings);
    return MOERL_OK;
}

int rollouter_init(rollouter *R, const rl_config *cfg, const staleness_budget *budget, const dataset *train,
                   const moe_model *m, rl_queue *q, int64_t total_prompts) {
    memset(R, 0, sizeof *R);
    R->cfg = cfg;
    R->train = train;
    R->queue = q;
    R->budget = *budget;
    int max_plen;
    if (rl_check_context(train, cfg->max_response_length, m->cfg.max_position_embeddings, &max_plen) != MOERL_OK)
        return MOERL_ERR;
    engine_config ec = {.max_num_seqs = cfg->max_num_seqs, .max_model_len = max_plen + cfg->max_response_length,
                        .max_num_batched_tokens = cfg->max_num_batched_tokens, .simulated = cfg->simulated,
                        .bf16_weights = cfg->bf16_weights};
    R->eng = engine_create(&m->cfg, ec);
    if (!R->eng) return MOERL_ERR;
    if (engine_load_weights(R->eng, m->params, m->n_params, 0) != MOERL_OK) return MOERL_ERR;
    prompt_feed_init(&R->feed, dataset_count(train), cfg->seed);
    R->prompts_left = total_prompts;
    R->cap_inflight = 64;
    R->inflight = xmalloc(R->cap_inflight * sizeof(rl_group *));
    R->done_buf = xmalloc((cfg->max_num_seqs * 2 + 64) * sizeof(gen_request *));
    pthread_mutex_init(&R->mu, NULL);
    pthread_cond_init(&R->cv, NULL);
    R->stage = "idle";
    R->last_progress = moerl_now();
    return MOERL_OK;
}

void rollouter_free(rollouter *R) {
    for (int i = 0; i < R->n_inflight; i++) rl_group_free(R->inflight[i]);
    free(R->inflight);
    free(R->done_buf);
    prompt_feed_free(&R->feed);
    engine_free(R->eng);
    pthread_mutex_destroy(&R->mu);
    pthread_cond_destroy(&R->cv);
}

int rollouter_in_flight(const rollouter *R) { return R->n_inflight; }

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

int rollouter_start_uid(rollouter *R, int64_t uid) {
    const rl_config *c = R->cfg;
    if (uid < 0 || R->feed.n_rows <= 0)
        return moerl_errorf("prompt uid %lld is not valid for a dataset of %lld rows", (long long)uid,
                            (long long)R->feed.n_rows);
    rl_group *g = xcalloc(1, sizeof *g);
    g->uid = uid;
    g->row = (int)(uid % R->feed.n_rows);
    g->epoch = (int)(uid / R->feed.n_rows);
    g->start_version = engine_version(R->eng);
    g->n = c->n;
    const ds_row *row = dataset_row(R->train, g->row);
    ds_row_encode_prompt(row, &g->prompt);
    g->reqs = xcalloc(g->n, sizeof(gen_request));
    for (int j = 0; j < g->n; j++) {
        gen_request *r = &g->reqs[j];
        r->id = uid * 1024 + j;
        r->prompt = g->prompt.ids;
        r->prompt_len = (int)g->prompt.n;
        r->sp.temperature = c->temperature;
        r->sp.top_p = c->top_p;
        r->sp.top_k = c->top_k;
        r->sp.max_tokens = c->max_response_length;
        /* each response has its own seed from (run seed, uid, j): reproducible, batch-invariant */
        r->sp.seed = mix64(c->seed ^ mix64((uint64_t)uid * 131 + (uint64_t)j));
        r->user = g;
        if (c->synth_alpha > 0) {
            rng_state lr;
            rng_seed(&lr, r->sp.seed ^ 0x5eedULL);
            double u = 1.0 - rng_uniform_double(&lr); /* (0, 1] */
            double len = c->synth_min * pow(u, -1.0 / c->synth_alpha);
            r->sp.max_tokens = len >= c->max_response_length ? c->max_response_length : (int)ceil(len);
            r->sp.ignore_eos = 1;
        }
        if (engine_add(R->eng, r) != MOERL_OK) {
            /* the request was not queued: drop the group's earlier requests too */
            for (int k = 0; k < j; k++) g->reqs[k].finish = FINISH_ABORT;
            return moerl_error_prefix("prompt row %d: ", g->row);
        }
    }
    if (R->n_inflight == R->cap_inflight) {
        R->cap_inflight *= 2;
        R->inflight = xrealloc(R->inflight, R->cap_inflight * sizeof(rl_group *));
    }
    R->inflight[R->n_inflight++] = g;
    staleness_on_start(&R->budget);
    R->prompts_left--;
    return MOERL_OK;
}

static int start_group(rollouter *R) { return rollouter_start_uid(R, prompt_feed_next(&R->feed)); }

static int finish_requests(rollouter *R, int k) {
    for (int d = 0; d < k; d++) {
        rl_group *g = R->done_buf[d]->user;
        R->gen_tokens += R->done_buf[d]->n_out;
        if (++g->n_done < g->n) continue;
        for (int i = 0; i < R->n_inflight; i++)
            if (R->inflight[i] == g) {
                R->inflight[i] = R->inflight[--R->n_inflight];
                break;
            }
        if (R->on_group_done) {
            if (R->on_group_done(R->on_group_done_ctx, g) != MOERL_OK) return MOERL_ERR;
        } else if (rl_queue_put(R->queue, g) != MOERL_OK) {
            return MOERL_ERR;
        }
    }
    return MOERL_OK;
}

int rollouter_room(const rollouter *R) {
    const int busy = engine_num_unfinished(R->eng), cap = R->cfg->max_num_seqs, n = R->cfg->n;
    if (busy == 0) return MOERL_MAX(1, cap / n);
    return busy + n > cap ? 0 : (cap - busy) / n;
}

int rollouter_tick(rollouter *R) {
    const rl_config *c = R->cfg;
    const int cap = c->max_num_seqs;
    R->stage = "admit";
    const int64_t dropped = atomic_exchange(&R->dropped_pending, 0);
    if (dropped > 0) { /* replacements for groups the trainer dropped, with their budget slots */
        R->prompts_left += dropped;
        staleness_on_drop(&R->budget, dropped);
    }
    while (!R->draining && R->prompts_left > 0 && staleness_can_start(&R->budget, rl_queue_size(R->queue))) {
        int busy = engine_num_unfinished(R->eng);
        if (busy > 0 && busy + c->n > cap) break; /* no room: keep groups out of the engine's queue */
        if (start_group(R) != MOERL_OK) return MOERL_ERR;
    }
    return rollouter_step(R);
}

int rollouter_step(rollouter *R) {
    const rl_config *c = R->cfg;
    if (engine_num_unfinished(R->eng) == 0) {
        R->stage = "idle";
        return 0;
    }
    R->stage = "generate";
    double t0 = moerl_now();
    int k = engine_step(R->eng, R->done_buf, c->max_num_seqs * 2 + 64);
    if (k < 0) return MOERL_ERR;
    R->stage = "queue";
    if (finish_requests(R, k) != MOERL_OK) return MOERL_ERR;
    rl_atomic_add(&R->busy_s, moerl_now() - t0);
    R->last_progress = moerl_now();
    return 1;
}

int rollouter_apply_sync(rollouter *R, const float *params, size_t n_params, int version) {
    R->stage = "param_sync";
    if (R->cfg->partial_rollout) engine_pause(R->eng, NULL, 0);
    else MOERL_ASSERT(engine_num_running(R->eng) == 0);
    if (R->on_paused) R->on_paused(R->on_paused_ctx);
    if (engine_load_weights(R->eng, params, n_params, version) != MOERL_OK) return MOERL_ERR;
    /* carried-over work: in-flight groups (interrupted ones included) + queued groups */
    staleness_on_version(&R->budget, R->n_inflight, 0, rl_queue_size(R->queue));
    return rollouter_resume(R);
}

int rollouter_resume(rollouter *R) {
    int k = engine_resume(R->eng, R->done_buf, R->cfg->max_num_seqs * 2 + 64);
    if (finish_requests(R, k) != MOERL_OK) return MOERL_ERR;
    R->draining = 0;
    R->last_progress = moerl_now();
    return MOERL_OK;
}
