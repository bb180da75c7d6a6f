/* Rollouter: feeds prompts, keeps GRPO groups together, respects the staleness budget, applies
 * weight syncs at step boundaries (partial rollout: interrupt and resume), and has finished groups
 * scored beside generation: a group whose n responses are done is decoded and submitted to the
 * reward pool (its own thread); it stays in flight until its rewards are in, then enters the queue
 * with them (rl_group.rewards). */
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "rl/rl.h"

void rl_group_free(rl_group *g) {
    if (!g) return;
    for (int j = 0; j < g->n; j++) gen_request_free_outputs(&g->reqs[j]);
    if (g->rewards)
        for (int j = 0; j < g->n; j++) reward_result_free(&g->rewards[j]);
    free(g->rewards);
    free(g->traj);
    free(g->reqs);
    tok_seq_free(&g->prompt);
    free(g);
}

int rl_group_check_routes(const rl_group *g, const moe_config *c, int64_t *tokens) {
    int n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_moe += moe_config_layer_is_moe(c, l);
    const int K = n_moe ? c->num_experts_per_tok : 0, E = n_moe ? c->num_experts : 0;
    if (g->route_layers != n_moe || g->route_k != K || g->route_experts != E)
        return moerl_errorf("prompt uid %lld: routing records of %d MoE layers × top-%d of %d experts, the trained "
                            "model has %d × top-%d of %d (rollout.enable_rollout_routing_replay: %s)",
                            (long long)g->uid, g->route_layers, g->route_k, g->route_experts, n_moe, K, E,
                            g->route_layers ? "routes of another model" : "the rollout side recorded none");
    for (int j = 0; n_moe && j < g->n; j++) {
        const gen_request *r = &g->reqs[j];
        const int want = r->prompt_len + r->n_out - 1;
        if (!r->out_routes || r->n_routes != want)
            return moerl_errorf("prompt uid %lld response %d: %d tokens with recorded routes, %d forwarded (prompt %d + "
                                "response %d − 1)", (long long)g->uid, j, r->out_routes ? r->n_routes : 0, want,
                                r->prompt_len, r->n_out);
        if (tokens) *tokens += r->n_routes;
    }
    return MOERL_OK;
}

/* ------------------------------------------------------------------ reward requests */

static char *prompt_json(const ds_row *row) {
    json_t *a = json_array();
    for (int i = 0; i < row->n_prompt; i++) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string(row->prompt[i].role ? row->prompt[i].role : ""));
        json_t *c = row->prompt[i].content ? json_string(row->prompt[i].content) : NULL;
        json_object_set_new(m, "content", c ? c : json_null()); /* NULL: not valid UTF-8 */
        json_array_append_new(a, m);
    }
    char *s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return s;
}

void rl_group_reward_requests(const rl_group *g, const dataset *train, reward_request *reqs, rl_reward_store *st) {
    const ds_row *row = dataset_row(train, g->row);
    st->n = g->n;
    st->texts = xcalloc((size_t)(g->n ? g->n : 1), sizeof(char *));
    st->prompt_json = prompt_json(row);
    dataset_where(train, row->line, st->where, sizeof st->where);
    for (int j = 0; j < g->n; j++) {
        const gen_request *r = &g->reqs[j];
        size_t len = 0;
        char *txt = tok_decode(r->out_tokens, r->n_out, true, &len);
        st->texts[j] = txt ? txt : xstrdup("");
        reqs[j] = (reward_request){.data_source = row->data_source, .solution_str = st->texts[j],
                                   .ground_truth = row->ground_truth, .ground_truth_json = row->ground_truth_json,
                                   .extra_info_json = row->extra_info_json, .prompt_json = st->prompt_json,
                                   .where = st->where};
    }
}

void rl_reward_store_free(rl_reward_store *s) {
    for (int j = 0; j < s->n; j++) free(s->texts[j]);
    free(s->texts);
    free(s->prompt_json);
    s->texts = NULL;
    s->prompt_json = NULL;
    s->n = 0;
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

int rl_check_seq_len(const char *prompt, int64_t prompt_tokens, int64_t max_response_length,
                     int max_position_embeddings) {
    if (max_position_embeddings > 0 && prompt_tokens + max_response_length > max_position_embeddings)
        return moerl_errorf("%s (%lld token%s) + data.max_response_length %lld exceeds the model's context "
                            "max_position_embeddings %d: shorten the prompts or the responses, or drop the long "
                            "prompts (data.max_prompt_length with data.filter_overlong_prompts=true)",
                            prompt, (long long)prompt_tokens, moerl_plural(prompt_tokens),
                            (long long)max_response_length, max_position_embeddings);
    return MOERL_OK;
}

int rl_check_context(const dataset *train, int max_response_length, int max_position_embeddings, int *longest) {
    int max_plen;
    rl_prompt_lengths(train, NULL, &max_plen);
    if (longest) *longest = max_plen;
    char what[600];
    snprintf(what, sizeof what, "the longest prompt of %s", train->path ? train->path : "the training data");
    return rl_check_seq_len(what, max_plen, max_response_length, max_position_embeddings);
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
                        .bf16_weights = cfg->bf16_weights,
                        .block_size = cfg->block_size, .kv_cache_bytes = cfg->kv_cache_bytes,
                        .gpu_memory_utilization = cfg->gpu_memory_utilization,
                        .enable_prefix_caching = cfg->enable_prefix_caching,
                        /* moerl simulate runs no model: there are no routes to record (docs/rl.md) */
                        .record_routes = cfg->rollout_routing_replay && !cfg->simulated};
    if (cfg->rollout_routing_replay && cfg->simulated)
        log_warn("rollout.enable_rollout_routing_replay: moerl simulate runs no model, so no routes are recorded "
                 "(the simulation is the same without the key)");
    R->eng = engine_create(&m->cfg, ec);
    if (!R->eng) return MOERL_ERR;
    reward_backend *rb = rl_reward_backend(cfg);
    if (!rb) return MOERL_ERR;
    R->pool = reward_pool_create(rb);
    if (!R->pool) return MOERL_ERR;
    R->wait_rewards = 1;
    /* moerl simulate (cfg->simulated): its sim_run sets R->agent to a loop in simulation mode
     * (agent_loop_create_sim, on its virtual clock) before the first group starts; no tools run */
    if (cfg->multi_turn.enable && !cfg->simulated) {
        if (tool_config_load(cfg->multi_turn.tool_config_path, &R->tools) != MOERL_OK) return MOERL_ERR;
        R->agent = agent_loop_create(&cfg->multi_turn, &R->tools, &cfg->multi_turn.env);
        if (!R->agent) return MOERL_ERR;
    }
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
    reward_pool_free(R->pool); /* first: a batch being scored refers to nothing of R, but is stopped */
    R->pool = NULL;
    agent_loop_free(R->agent); /* the environment programs are killed; parked requests are the groups' */
    R->agent = NULL;
    tool_config_free(&R->tools);
    for (int i = 0; i < R->n_inflight; i++) rl_group_free(R->inflight[i]);
    free(R->inflight);
    free(R->done_buf);
    prompt_feed_free(&R->feed);
    engine_free(R->eng);
    pthread_mutex_destroy(&R->mu);
    pthread_cond_destroy(&R->cv);
}

int rollouter_in_flight(const rollouter *R) { return R->n_inflight; }

reward_backend *rl_reward_backend(const rl_config *cfg) { return reward_backend_create(&cfg->reward); }

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
    /* the routing records' shape (0 when the engine does not record; engine_add allocates them) */
    if (engine_route_width(R->eng, &g->route_layers, &g->route_k))
        g->route_experts = engine_model(R->eng)->cfg.num_experts;
    if (R->agent) g->traj = xcalloc(g->n, sizeof(agent_traj));
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
        /* moerl simulate, multi-turn: the drawn turns as a forced script (rl/agent_loop.h) */
        if (R->agent && c->simulated && agent_loop_sim_script(R->agent, r, c->max_response_length) != MOERL_OK)
            return moerl_error_prefix("prompt row %d: ", g->row);
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

/* A pool failure: latched in R (the message is the backend's, kept in R->error too). */
static int reward_failure(rollouter *R) {
    R->reward_failed = 1;
    snprintf(R->error, sizeof R->error, "%s", moerl_last_error());
    return MOERL_ERR;
}

static int deliver(rollouter *R, const reward_done *d);

/* Hand a finished group to the reward pool (tagged by its address: unique while it is in flight);
 * wait_rewards: score it now through the pool's backend and deliver it. */
static int submit_group(rollouter *R, rl_group *g) {
    reward_request *reqs = xcalloc((size_t)(g->n ? g->n : 1), sizeof *reqs);
    rl_reward_store st;
    rl_group_reward_requests(g, R->train, reqs, &st);
    int m = 0; /* the responses the reward scores: those whose environment gave no reward */
    for (int j = 0; j < g->n; j++)
        if (!(g->traj && g->traj[j].has_env_reward)) reqs[m++] = reqs[j];
    int rc = MOERL_OK;
    reward_done d = {.tag = (uint64_t)(uintptr_t)g, .n = m, .results = NULL};
    if (R->wait_rewards || m == 0 || R->mirror) {
        d.results = xcalloc((size_t)(m ? m : 1), sizeof(reward_result));
        const double t0 = moerl_now();
        if (m > 0 && !R->mirror) rc = reward_pool_score(R->pool, reqs, m, d.results);
        rl_atomic_add(&R->reward_wait_s, moerl_now() - t0);
        if (rc != MOERL_OK) free(d.results);
    } else {
        rc = reward_pool_submit(R->pool, d.tag, reqs, m);
    }
    rl_reward_store_free(&st);
    free(reqs);
    if (rc != MOERL_OK) return reward_failure(R);
    R->n_scoring++;
    return R->wait_rewards || m == 0 || R->mirror ? deliver(R, &d) : MOERL_OK;
}

/* A trajectory ended (single turn: its request finished): its group is complete when all n are. */
static int trajectory_done(rollouter *R, gen_request *r) {
    rl_group *g = r->user;
    R->gen_tokens += r->n_out;
    if (++g->n_done < g->n) return MOERL_OK;
    return submit_group(R, g);
}

/* The environment failed (latched: the job checkpoints and stops, as for a reward failure). */
static int env_failure(rollouter *R) {
    R->env_failed = 1;
    R->reward_failed = 1; /* an outside program failed: the job's checkpoint-and-stop path */
    snprintf(R->error, sizeof R->error, "%s", moerl_last_error());
    return MOERL_ERR;
}

/* Requests the engine returned: multi-turn, each ended a turn (the agent loop parks it for its tool
 * calls, continues it, or ends the trajectory); single turn, each is a finished trajectory. */
static int finish_requests(rollouter *R, int k) {
    for (int d = 0; d < k; d++) {
        gen_request *r = R->done_buf[d];
        if (R->agent) {
            rl_group *g = r->user;
            const int j = (int)(r - g->reqs);
            char id[48];
            snprintf(id, sizeof id, "%lld-%d", (long long)g->uid, j);
            const int rc = agent_loop_turn_end(R->agent, R->eng, r, &g->traj[j], dataset_row(R->train, g->row), id);
            if (rc < 0) return env_failure(R);
            if (rc == 0) continue; /* waiting for its tools, or queued for its next turn */
        }
        if (trajectory_done(R, r) != MOERL_OK) return MOERL_ERR;
    }
    return MOERL_OK;
}

int rollouter_poll_tools(rollouter *R, double wait_s) {
    if (!R->agent || agent_loop_waiting(R->agent) == 0) return 0;
    const int cap = R->cfg->max_num_seqs * 2 + 64;
    const int k = agent_loop_poll(R->agent, R->eng, R->done_buf, cap, wait_s);
    if (k < 0) return env_failure(R);
    for (int d = 0; d < k; d++)
        if (trajectory_done(R, R->done_buf[d]) != MOERL_OK) return MOERL_ERR;
    return k;
}

int rollouter_unfinished(const rollouter *R) {
    return engine_num_unfinished(R->eng) + (R->agent ? agent_loop_waiting(R->agent) : 0);
}

/* A scored group leaves the in-flight list for the queue (or the callback). */
static int deliver(rollouter *R, const reward_done *d) {
    rl_group *g = (rl_group *)(uintptr_t)d->tag;
    int at = -1;
    for (int i = 0; i < R->n_inflight && at < 0; i++)
        if (R->inflight[i] == g) at = i;
    int m = g->n; /* what was submitted: the responses without an environment's reward */
    for (int j = 0; g->traj && j < g->n; j++) m -= g->traj[j].has_env_reward;
    MOERL_ASSERT(at >= 0 && d->n == m); /* the pool hands back what was submitted */
    R->inflight[at] = R->inflight[--R->n_inflight];
    R->n_scoring--;
    if (m == g->n) {
        g->rewards = d->results;
    } else { /* the environment's reward is the score of its trajectories */
        g->rewards = xcalloc((size_t)g->n, sizeof(reward_result));
        for (int j = 0, k = 0; j < g->n; j++) {
            if (g->traj[j].has_env_reward) g->rewards[j].score = g->traj[j].env_reward;
            else g->rewards[j] = d->results[k++];
        }
        free(d->results);
    }
    if (R->on_group_done) return R->on_group_done(R->on_group_done_ctx, g);
    return rl_queue_put(R->queue, g);
}

int rollouter_collect_rewards(rollouter *R, double wait_s) {
    if (R->n_scoring == 0) return 0;
    reward_done done[16];
    int total = 0;
    for (;;) {
        const int k = reward_pool_poll(R->pool, done, 16, total == 0 ? wait_s : 0);
        if (k < 0) return reward_failure(R);
        int rc = MOERL_OK;
        for (int i = 0; i < k; i++) {
            if (rc == MOERL_OK) {
                rc = deliver(R, &done[i]);
            } else { /* a delivery failed: release the rest (the job stops) */
                for (int j = 0; j < done[i].n; j++) reward_result_free(&done[i].results[j]);
                free(done[i].results);
            }
        }
        if (rc != MOERL_OK) return MOERL_ERR;
        total += k;
        if (k < 16) break;
    }
    if (total > 0) R->last_progress = moerl_now();
    return total;
}

int rollouter_room(const rollouter *R) {
    const int busy = rollouter_unfinished(R), cap = R->cfg->max_num_seqs, n = R->cfg->n;
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
        staleness_on_drop(&R->budget, dropped, R->n_inflight + rl_queue_size(R->queue));
    }
    while (!R->draining && R->prompts_left > 0 && staleness_can_start(&R->budget, rl_queue_size(R->queue))) {
        int busy = rollouter_unfinished(R); /* trajectories waiting for tools hold their room */
        if (busy > 0 && busy + c->n > cap) break; /* no room: keep groups out of the engine's queue */
        if (start_group(R) != MOERL_OK) return MOERL_ERR;
    }
    return rollouter_step(R);
}

/* After an engine step: the tool calls answered meanwhile continue their trajectories, and the groups
 * scored meanwhile go on (wait_rewards: already delivered). */
static int collect_after_step(rollouter *R) {
    if (rollouter_poll_tools(R, 0) < 0) return MOERL_ERR;
    return rollouter_collect_rewards(R, 0) < 0 ? MOERL_ERR : MOERL_OK;
}

/* How long an otherwise idle rollouter waits for rewards per step: short, so that a sync request
 * or a stop is seen at once. */
#define REWARD_WAIT_S 0.005

int rollouter_step(rollouter *R) {
    const rl_config *c = R->cfg;
    if (engine_num_unfinished(R->eng) == 0) {
        if (R->agent && agent_loop_waiting(R->agent) > 0) { /* nothing to decode: every trajectory waits for tools */
            R->stage = "wait_tools";
            const double t0 = moerl_now();
            if (rollouter_poll_tools(R, REWARD_WAIT_S) < 0 || rollouter_collect_rewards(R, 0) < 0) return MOERL_ERR;
            rl_atomic_add(&R->idle_s, moerl_now() - t0);
            /* not stalled: every call ends within rollout.multi_turn.tool_timeout_s (then the model is told
             * it timed out), so the watchdog need not guard tool waits */
            R->last_progress = moerl_now();
            return 1;
        }
        if (R->n_scoring == 0) {
            R->stage = "idle";
            return 0;
        }
        R->stage = "wait_rewards";
        const double t0 = moerl_now();
        const int got = rollouter_collect_rewards(R, REWARD_WAIT_S);
        if (got < 0) return MOERL_ERR;
        rl_atomic_add(&R->idle_s, moerl_now() - t0); /* waiting, not generating */
        return 1;
    }
    R->stage = "generate";
    double t0 = moerl_now();
    int k = engine_step(R->eng, R->done_buf, c->max_num_seqs * 2 + 64);
    if (k < 0) return MOERL_ERR;
    const engine_stats es = engine_get_stats(R->eng); /* a snapshot the trainer thread may read (under mu) */
    pthread_mutex_lock(&R->mu);
    R->eng_stats = es;
    pthread_mutex_unlock(&R->mu);
    R->stage = "queue";
    if (finish_requests(R, k) != MOERL_OK) return MOERL_ERR;
    if (collect_after_step(R) != MOERL_OK) return MOERL_ERR;
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
    if (collect_after_step(R) != MOERL_OK) return MOERL_ERR;
    R->draining = 0;
    R->last_progress = moerl_now();
    return MOERL_OK;
}
