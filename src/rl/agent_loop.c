/* The agent loop (agent_loop.h): multi-turn trajectories with tools between engine steps. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "base/utf8.h"
#include "base/rng.h"
#include "data/tool_calls.h"
#include "rl/agent_loop.h"

/* A live trajectory: its history after the prompt and the calls of its current tool turn. */
typedef struct {
    gen_request *r;
    agent_traj *t;
    const ds_row *row;
    char id[64];
    chat_msg *hist;      /* assistant and tool messages after the prompt (role, content owned) */
    int n_hist, cap_hist;
    int turn_start;      /* out index where the current assistant turn begins */
    char **resp;         /* [n_calls] the tool responses of the current turn (NULL: not yet answered) */
    int n_calls, n_pending;
    int ending;          /* the environment said done: end once every call is answered */
    double parked_at;
    /* simulation mode */
    int sim_turns;       /* the drawn assistant turns (uncapped) */
    int *script;         /* the forced ids of every turn (r->sp.forced) */
    rng_state sim_rng;   /* the latency draws */
    double answer_at, latency_s;
    int timed_out;
} traj;

typedef struct {
    uint64_t tag;
    traj *tr;
    int call;
} pending_call;

struct agent_loop {
    multi_turn_config m;
    const tool_config *tc;
    env_client *env;
    char eot[64];        /* the template's end-of-turn text, e.g. "<|im_end|>" */
    traj **live;
    int n_live, cap_live;
    pending_call *calls;
    int n_calls, cap_calls;
    uint64_t next_tag;
    int n_waiting;
    int n_logged_errors; /* tool error answers logged so far (the first 5) */
    agent_stats st;
    pthread_mutex_t st_mu; /* st: updated inside turn_end / poll, read by take_stats from another thread */
    /* simulation mode (agent_loop_create_sim): sim set, env NULL */
    int sim;
    agent_sim_config sc;
    double (*clock)(void *);
    void *clock_ctx;
    int *filler;         /* [sc.response_tokens] the inserted ids of a tool turn */
};

/* The stop id the chat template writes at the end of an assistant turn: render
 * [user "x", assistant "y"] and find which stop token's text follows "y". */
static int find_eot(char *eot, size_t cap) {
    tokenizer *tk = tok_current();
    chat_msg msgs[2] = {{.role = "user", .content = "x"}, {.role = "assistant", .content = "y"}};
    char *text = NULL;
    uint8_t *tpl = NULL;
    size_t len = 0;
    if (tokenizer_chat_render_masked(tk, msgs, 2, NULL, false, &text, &tpl, &len) != MOERL_OK)
        return moerl_error_prefix("multi-turn: the chat template cannot render an assistant turn: ");
    int n = 0, found = 0;
    const int32_t *stop = tokenizer_stop_ids(tk, &n);
    const char *y = strrchr(text, 'y');
    for (int i = 0; i < n && y && !found; i++) {
        size_t l = 0;
        char *s = tok_decode(&stop[i], 1, false, &l);
        if (s && l > 0 && l < cap && (size_t)(text + len - (y + 1)) >= l && !memcmp(y + 1, s, l) &&
            tpl[y + 1 - text]) {
            memcpy(eot, s, l);
            eot[l] = 0;
            found = 1;
        }
        free(s);
    }
    free(text);
    free(tpl);
    if (!found)
        return moerl_errorf("multi-turn: the chat template (%s) does not end an assistant turn with one of the "
                            "tokenizer's stop tokens, so a turn's end cannot be found; use a template that does "
                            "(data.chat_template)", tokenizer_chat_template_name(tk));
    return MOERL_OK;
}

/* Before any rollout: the chat template must render a tool message (else the model would never see
 * a tool's answer) — a probe turn's delta must hold the probe's content — and should render the tools'
 * schemas into the prompt (a warning when it does not: the model is not told which tools exist). */
static int probe_template(const tool_config *tc, const char *eot) {
    tokenizer *tk = tok_current();
    static const char probe[] = "moerl-tool-probe-5e1f";
    chat_msg msgs[3] = {{.role = "user", .content = "x"}, {.role = "assistant", .content = "y"},
                        {.role = "tool", .content = (char *)probe}};
    json_t *schemas = tool_config_schemas(tc);
    const chat_extra x = {schemas, NULL};
    tok_seq ids = {0};
    int rc = tool_turn_ids(tk, msgs, 2, 3, &x, eot, &ids);
    if (rc == MOERL_OK) {
        size_t len = 0;
        char *text = tok_decode(ids.ids, ids.n, false, &len);
        if (!text || !strstr(text, probe))
            rc = moerl_errorf("the chat template (%s) does not render tool messages (role \"tool\"): the model would "
                              "never see a tool's answer; use a template that does (data.chat_template: the "
                              "checkpoint's own, or a .jinja file)", tokenizer_chat_template_name(tk));
        free(text);
    } else {
        moerl_error_prefix("the chat template (%s) cannot render a tool turn: ", tokenizer_chat_template_name(tk));
    }
    char *with = rc == MOERL_OK ? tokenizer_chat_text_ex(tk, msgs, 1, &x, true) : NULL;
    char *without = rc == MOERL_OK ? tokenizer_chat_text_ex(tk, msgs, 1, NULL, true) : NULL;
    if (with && without && !strcmp(with, without))
        log_warn("multi-turn: the chat template (%s) does not render the tools' schemas into the prompt: the model is "
                 "not told which tools exist (unless the prompts say so)", tokenizer_chat_template_name(tk));
    free(with);
    free(without);
    tok_seq_free(&ids);
    json_decref(schemas);
    return rc == MOERL_OK ? MOERL_OK : moerl_error_prefix("multi-turn: ");
}

int agent_loop_check_template(const tool_config *tc) {
    char eot[64];
    return find_eot(eot, sizeof eot) == MOERL_OK && probe_template(tc, eot) == MOERL_OK ? MOERL_OK : MOERL_ERR;
}

agent_loop *agent_loop_create(const multi_turn_config *m, const tool_config *tc, const env_config *ec) {
    agent_loop *A = xcalloc(1, sizeof *A);
    A->m = *m;
    A->tc = tc;
    if (find_eot(A->eot, sizeof A->eot) != MOERL_OK || probe_template(tc, A->eot) != MOERL_OK) {
        free(A);
        return NULL;
    }
    A->env = env_create(tc, ec);
    if (!A->env) {
        free(A);
        return NULL;
    }
    A->next_tag = 1;
    pthread_mutex_init(&A->st_mu, NULL);
    return A;
}

static void traj_free(traj *tr) {
    for (int i = 0; i < tr->n_hist; i++) {
        free(tr->hist[i].role);
        free(tr->hist[i].content);
    }
    free(tr->hist);
    for (int i = 0; i < tr->n_calls; i++) free(tr->resp[i]);
    free(tr->resp);
    free(tr->script);
    free(tr);
}

void agent_loop_free(agent_loop *A) {
    if (!A) return;
    env_free(A->env);
    for (int i = 0; i < A->n_live; i++) traj_free(A->live[i]);
    free(A->live);
    free(A->calls);
    free(A->filler);
    pthread_mutex_destroy(&A->st_mu);
    free(A);
}

static traj *find_traj(const agent_loop *A, const gen_request *r) {
    for (int i = 0; i < A->n_live; i++)
        if (A->live[i]->r == r) return A->live[i];
    return NULL;
}

static void drop_traj(agent_loop *A, traj *tr) {
    for (int i = 0; i < A->n_live; i++)
        if (A->live[i] == tr) {
            A->live[i] = A->live[--A->n_live];
            break;
        }
    traj_free(tr);
}

/* The trajectory ended: its record filled, the totals counted, its state freed. */
static void finish_traj(agent_loop *A, traj *tr) {
    tr->t->turns = tr->r->turn + 1;
    A->st.trajectories++;
    A->st.turns_sum += tr->t->turns;
    A->st.turns_max = MOERL_MAX(A->st.turns_max, tr->t->turns);
    drop_traj(A, tr);
}

static void hist_push(traj *tr, const char *role, char *content) {
    if (tr->n_hist == tr->cap_hist) {
        tr->cap_hist = tr->cap_hist ? 2 * tr->cap_hist : 8;
        tr->hist = xrealloc(tr->hist, (size_t)tr->cap_hist * sizeof(chat_msg));
    }
    tr->hist[tr->n_hist++] = (chat_msg){.role = xstrdup(role), .content = content, .msg = NULL};
}

/* content cut to max characters (UTF-8 code points; a cut never splits one). Owned copy. */
static char *cut_chars(const char *s, int max) {
    size_t i = 0;
    int chars = 0;
    while (s[i] && chars < max) {
        i++;
        while (((unsigned char)s[i] & 0xC0) == 0x80) i++;
        chars++;
    }
    char *o = xmalloc(i + 1);
    memcpy(o, s, i);
    o[i] = 0;
    return o;
}

/* Every call of tr's turn is answered: insert the tool turn's ids and queue the next turn, or end.
 * Returns 1 ended, 0 continued, MOERL_ERR. */
static int continue_traj(agent_loop *A, engine *e, traj *tr) {
    for (int i = 0; i < tr->n_calls; i++) { /* a parser message may quote the model's stray bytes */
        char *v = moerl_utf8_repair(tr->resp[i], strlen(tr->resp[i]), 0, NULL);
        hist_push(tr, "tool", cut_chars(v, A->m.max_tool_response_length));
        free(v);
        free(tr->resp[i]);
    }
    free(tr->resp);
    tr->resp = NULL;
    const int n_tool = tr->n_calls;
    tr->n_calls = 0;
    if (tr->ending) return 1;
    const ds_row *row = tr->row;
    const int n = row->n_prompt + tr->n_hist;
    chat_msg *msgs = xmalloc((size_t)n * sizeof(chat_msg));
    memcpy(msgs, row->prompt, (size_t)row->n_prompt * sizeof(chat_msg));
    memcpy(msgs + row->n_prompt, tr->hist, (size_t)tr->n_hist * sizeof(chat_msg));
    const chat_extra x = {row->tools, NULL};
    tok_seq ids = {0};
    int rc = tool_turn_ids(tok_current(), msgs, n - n_tool, n, &x, A->eot, &ids);
    free(msgs);
    if (rc != MOERL_OK) {
        tok_seq_free(&ids);
        return moerl_error_prefix("trajectory %s, row line %lld: ", tr->id, (long long)row->line);
    }
    rc = engine_continue(e, tr->r, (const int *)ids.ids, (int)ids.n);
    tok_seq_free(&ids);
    if (rc < 0) return moerl_error_prefix("trajectory %s: ", tr->id);
    if (rc == 0) return 1; /* no room for the tool turn and a token: finish `length` */
    tr->turn_start = tr->r->n_out;
    return 0;
}

static void add_call(agent_loop *A, traj *tr, int call, uint64_t tag) {
    if (A->n_calls == A->cap_calls) {
        A->cap_calls = A->cap_calls ? 2 * A->cap_calls : 32;
        A->calls = xrealloc(A->calls, (size_t)A->cap_calls * sizeof(pending_call));
    }
    A->calls[A->n_calls++] = (pending_call){tag, tr, call};
}

/* Parse the turn that just ended and (send: the trajectory goes on) send its calls; returns the
 * call count (0: no tool call), or MOERL_ERR. */
static int start_calls(agent_loop *A, traj *tr, const char *text, size_t len, int send) {
    tool_calls tc = {0};
    tool_calls_parse_hermes(text, len, A->tc, &tc);
    const int n = tc.n;
    tr->t->tool_calls += n;
    A->st.tool_calls += n;
    if (n == 0 || !send) {
        tool_calls_free(&tc);
        return 0;
    }
    tr->resp = xcalloc((size_t)n, sizeof(char *));
    tr->n_calls = n;
    tr->n_pending = 0;
    int rc = MOERL_OK;
    for (int i = 0; i < n && rc == MOERL_OK; i++) {
        const tool_call *c = &tc.calls[i];
        if (c->error) { /* the model's malformed call: the parser's message is the response */
            tr->resp[i] = xstrdup(c->error);
            tr->t->tool_errors++;
            tr->t->malformed_calls++;
            A->st.tool_errors++;
            A->st.malformed_calls++;
            continue;
        }
        const uint64_t tag = A->next_tag++;
        rc = env_submit(A->env, tag, tr->id, c->name, c->arguments);
        if (rc == MOERL_OK) {
            add_call(A, tr, i, tag);
            tr->n_pending++;
        }
    }
    tool_calls_free(&tc);
    return rc == MOERL_OK ? n : MOERL_ERR;
}

static int turn_end(agent_loop *A, engine *e, gen_request *r, agent_traj *t, const ds_row *row, const char *traj_id);

int agent_loop_turn_end(agent_loop *A, engine *e, gen_request *r, agent_traj *t, const ds_row *row,
                        const char *traj_id) {
    pthread_mutex_lock(&A->st_mu);
    const int rc = turn_end(A, e, r, t, row, traj_id);
    pthread_mutex_unlock(&A->st_mu);
    return rc;
}

static traj *new_traj(agent_loop *A, gen_request *r) {
    traj *tr = xcalloc(1, sizeof *tr);
    tr->r = r;
    if (A->n_live == A->cap_live) {
        A->cap_live = A->cap_live ? 2 * A->cap_live : 64;
        A->live = xrealloc(A->live, (size_t)A->cap_live * sizeof(traj *));
    }
    A->live[A->n_live++] = tr;
    return tr;
}

static int sim_turn_end(agent_loop *A, traj *tr);

static int turn_end(agent_loop *A, engine *e, gen_request *r, agent_traj *t, const ds_row *row, const char *traj_id) {
    traj *tr = find_traj(A, r);
    if (!tr) tr = new_traj(A, r); /* the first turn (simulation mode: made by agent_loop_sim_script) */
    if (!tr->t) {
        tr->t = t;
        tr->row = row;
        snprintf(tr->id, sizeof tr->id, "%s", traj_id);
    }
    if (A->sim) return sim_turn_end(A, tr);
    const int turns = r->turn + 1;
    const int limit = A->m.max_assistant_turns > 0 && turns >= A->m.max_assistant_turns;
    size_t eot_len = 0;
    char *last = r->finish == FINISH_STOP && r->n_out > tr->turn_start
                     ? tok_decode(&r->out_tokens[r->n_out - 1], 1, false, &eot_len)
                     : NULL;
    const int at_eot = last && !strcmp(last, A->eot);
    free(last);
    if (!at_eot) { /* length, abort, or a stop token the template does not end a turn with */
        finish_traj(A, tr);
        return 1;
    }
    size_t len = 0;
    char *raw = tok_decode(&r->out_tokens[tr->turn_start], r->n_out - 1 - tr->turn_start, false, &len);
    /* what the template renders for this turn: valid UTF-8 (the sampled ids stay as they are) */
    char *text = moerl_utf8_repair(raw ? raw : "", raw ? len : 0, 0, NULL);
    free(raw);
    len = strlen(text);
    /* the last turn allowed (max_assistant_turns): its calls are counted, never run (as verl) */
    const int n = start_calls(A, tr, text, len, !limit);
    hist_push(tr, "assistant", text);
    if (n < 0) return MOERL_ERR;
    if (n == 0 || limit) {
        finish_traj(A, tr);
        return 1;
    }
    if (tr->n_pending > 0) {
        tr->parked_at = moerl_now();
        A->n_waiting++;
        return 0;
    }
    const int rc = continue_traj(A, e, tr); /* every call was malformed: answered at once */
    if (rc == 1) finish_traj(A, tr);
    return rc;
}

/* The trajectory id of pending call `tag` ("?" when unknown). */
static const char *c_id(const agent_loop *A, uint64_t tag) {
    for (int i = 0; i < A->n_calls; i++)
        if (A->calls[i].tag == tag) return A->calls[i].tr ? A->calls[i].tr->id : "?";
    return "?";
}

static pending_call take_call(agent_loop *A, uint64_t tag) {
    for (int i = 0; i < A->n_calls; i++)
        if (A->calls[i].tag == tag) {
            pending_call c = A->calls[i];
            A->calls[i] = A->calls[--A->n_calls];
            return c;
        }
    return (pending_call){0, NULL, -1};
}

/* One answer in: record it; when it was the turn's last, continue or end. Returns 1 if the
 * trajectory ended (put in done), 0 otherwise, MOERL_ERR. */
static int on_answer(agent_loop *A, engine *e, env_result *res, gen_request **done, int *n_done, int cap) {
    A->st.answered++;
    A->st.tool_latency_sum_s += res->latency_s;
    A->st.tool_latency_max_s = MOERL_MAX(A->st.tool_latency_max_s, res->latency_s);
    A->st.tool_errors += res->error || res->timed_out;
    A->st.tool_timeouts += res->timed_out;
    if (res->error && A->n_logged_errors < 5) /* a tool that errors: say so a few times (then only metrics) */
        log_warn("multi-turn: a tool answered trajectory %s with an error (the model reads it as the tool response%s): "
                 "%.300s", c_id(A, res->tag), ++A->n_logged_errors == 5 ? "; further ones are only counted, in "
                 "tool_errors/mean" : "", res->content ? res->content : "");
    pending_call c = take_call(A, res->tag);
    traj *tr = c.tr;
    if (!tr) return 0; /* its trajectory ended */
    tr->resp[c.call] = res->content;
    res->content = NULL;
    tr->t->tool_errors += res->error || res->timed_out;
    if (res->done) tr->ending = tr->t->env_done = 1;
    if (res->has_reward) {
        tr->t->has_env_reward = 1;
        tr->t->env_reward = res->reward;
    }
    if (--tr->n_pending > 0) return 0;
    A->n_waiting--;
    A->st.tool_wait_s += moerl_now() - tr->parked_at;
    const int rc = continue_traj(A, e, tr);
    if (rc != 1) return rc;
    MOERL_ASSERT(*n_done < cap);
    done[(*n_done)++] = tr->r;
    finish_traj(A, tr);
    return 1;
}

static int poll(agent_loop *A, engine *e, gen_request **done, int cap, double wait_s);

static int sim_poll(agent_loop *A, engine *e, gen_request **done, int cap);

int agent_loop_poll(agent_loop *A, engine *e, gen_request **done, int cap, double wait_s) {
    if (A->sim) { /* answers come by the caller's clock: nothing to wait for here */
        pthread_mutex_lock(&A->st_mu);
        const int rc = sim_poll(A, e, done, cap);
        pthread_mutex_unlock(&A->st_mu);
        return rc;
    }
    if (env_pending(A->env) == 0) return 0;
    /* the wait happens outside the lock: take_stats never waits for tools */
    const int ready = env_poll(A->env, NULL, 0, wait_s);
    if (ready < 0) return MOERL_ERR;
    pthread_mutex_lock(&A->st_mu);
    const int rc = poll(A, e, done, cap, 0);
    pthread_mutex_unlock(&A->st_mu);
    return rc;
}

static int poll(agent_loop *A, engine *e, gen_request **done, int cap, double wait_s) {
    int n_done = 0;
    env_result res[16];
    for (int first = 1;; first = 0) {
        if (env_pending(A->env) == 0) break;
        const int k = env_poll(A->env, res, 16, first ? wait_s : 0);
        if (k < 0) return MOERL_ERR;
        int rc = MOERL_OK;
        for (int i = 0; i < k; i++) {
            if (rc != MOERL_ERR && n_done < cap) rc = on_answer(A, e, &res[i], done, &n_done, cap);
            else if (rc != MOERL_ERR) rc = moerl_errorf("agent loop: more ended trajectories than room (%d)", cap);
            env_result_free(&res[i]);
        }
        if (rc == MOERL_ERR) return MOERL_ERR;
        if (k < 16) break;
    }
    return n_done;
}

int agent_loop_waiting(const agent_loop *A) { return A->n_waiting; }

void agent_loop_take_stats(agent_loop *A, agent_stats *out) {
    pthread_mutex_lock(&A->st_mu);
    *out = A->st;
    memset(&A->st, 0, sizeof A->st);
    pthread_mutex_unlock(&A->st_mu);
}

/* ------------------------------------------------------------------ simulation mode */

static int sim_config_check(const agent_sim_config *s, double (*clock)(void *)) {
    if (!(s->turns_mean >= 1 && s->turns_mean <= 1e6))
        return moerl_errorf("agent loop (simulation): turns_mean must be in [1, 1e6], got %g", s->turns_mean);
    if (!(s->latency_median_s > 0 && isfinite(s->latency_median_s)))
        return moerl_errorf("agent loop (simulation): latency_median_s must be finite and > 0, got %g",
                            s->latency_median_s);
    if (!(s->latency_sigma >= 0 && s->latency_sigma <= 20))
        return moerl_errorf("agent loop (simulation): latency_sigma must be in [0, 20], got %g", s->latency_sigma);
    if (s->response_tokens < 0 || !(s->synth_alpha > 0) || s->synth_min <= 0 || s->eos_id < 0 || s->filler_id < 0 ||
        s->filler_id == s->eos_id || !clock)
        return moerl_errorf("agent loop (simulation): response_tokens %d (≥ 0), synth_alpha %g (> 0), synth_min %d "
                            "(> 0), eos_id %d and filler_id %d (≥ 0, distinct) and a clock are required",
                            s->response_tokens, s->synth_alpha, s->synth_min, s->eos_id, s->filler_id);
    return MOERL_OK;
}

agent_loop *agent_loop_create_sim(const multi_turn_config *m, const agent_sim_config *s, double (*clock)(void *),
                                  void *clock_ctx) {
    if (sim_config_check(s, clock) != MOERL_OK) return NULL;
    agent_loop *A = xcalloc(1, sizeof *A);
    A->m = *m;
    A->sim = 1;
    A->sc = *s;
    A->clock = clock;
    A->clock_ctx = clock_ctx;
    A->filler = xmalloc((size_t)(s->response_tokens > 0 ? s->response_tokens : 1) * sizeof(int));
    for (int i = 0; i < s->response_tokens; i++) A->filler[i] = s->filler_id;
    A->next_tag = 1;
    pthread_mutex_init(&A->st_mu, NULL);
    return A;
}

/* 1 + a geometric draw on {0, 1, ...} with mean mu − 1 (success probability 1 / mu), by inversion. */
static int draw_turns(rng_state *g, double mu) {
    if (mu <= 1) return 1;
    const double u = 1.0 - rng_uniform_double(g); /* (0, 1] */
    const double k = floor(log(u) / log1p(-1.0 / mu));
    return k >= 1e6 ? 1000000 : 1 + (int)k;
}

/* A turn's length (≥ 1 token, the eos included): Pareto(alpha) above min, as rollouter_start_uid draws
 * a single-turn synthetic length. */
static int draw_turn_len(rng_state *g, const agent_sim_config *s, int max_tokens) {
    const double u = 1.0 - rng_uniform_double(g);
    const double len = s->synth_min * pow(u, -1.0 / s->synth_alpha);
    return len >= max_tokens ? max_tokens : MOERL_MAX(1, (int)ceil(len));
}

int agent_loop_sim_script(agent_loop *A, gen_request *r, int max_tokens) {
    if (!A->sim) return moerl_errorf("agent_loop_sim_script: the agent loop is not in simulation mode");
    if (max_tokens <= 0) return moerl_errorf("agent_loop_sim_script: max_tokens must be positive, got %d", max_tokens);
    traj *tr = find_traj(A, r);
    if (tr) drop_traj(A, tr); /* r started again: a new trajectory */
    tr = new_traj(A, r);
    rng_state g;
    rng_seed(&g, r->sp.seed ^ 0x7475726e73ULL); /* "turns": apart from the engine's sampling stream */
    tr->sim_turns = draw_turns(&g, A->sc.turns_mean);
    const int scripted = A->m.max_assistant_turns > 0 ? MOERL_MIN(tr->sim_turns, A->m.max_assistant_turns)
                                                      : tr->sim_turns;
    int n = 0, cap = 0;
    for (int k = 0; k < scripted && n < max_tokens; k++) { /* sampled ids never exceed max_tokens */
        const int len = MOERL_MIN(draw_turn_len(&g, &A->sc, max_tokens), max_tokens - n);
        if (n + len > cap) {
            cap = MOERL_MAX(2 * cap, n + len);
            tr->script = xrealloc(tr->script, (size_t)cap * sizeof(int));
        }
        for (int i = 0; i < len - 1; i++) tr->script[n++] = A->sc.filler_id;
        tr->script[n++] = A->sc.eos_id;
    }
    rng_seed(&tr->sim_rng, r->sp.seed ^ 0x6c6174656e6379ULL); /* "latency" */
    r->sp.forced = tr->script;
    r->sp.n_forced = n;
    r->sp.max_tokens = max_tokens;
    r->sp.ignore_eos = 0;
    return MOERL_OK;
}

/* A simulated turn ended: end the trajectory (its drawn turns done, a length limit, the turn limit:
 * that turn's call counted), or send its one call, answered at now + a drawn latency. */
static int sim_turn_end(agent_loop *A, traj *tr) {
    const gen_request *r = tr->r;
    const int turns = r->turn + 1;
    if (r->finish != FINISH_STOP || turns >= tr->sim_turns) {
        finish_traj(A, tr);
        return 1;
    }
    tr->t->tool_calls++;
    A->st.tool_calls++;
    if (A->m.max_assistant_turns > 0 && turns >= A->m.max_assistant_turns) { /* counted, never run */
        finish_traj(A, tr);
        return 1;
    }
    double lat = A->sc.latency_median_s * exp(A->sc.latency_sigma * (double)rng_normal(&tr->sim_rng));
    tr->timed_out = A->m.env.timeout_s > 0 && lat > A->m.env.timeout_s;
    if (tr->timed_out) lat = A->m.env.timeout_s;
    const double now = A->clock(A->clock_ctx);
    tr->latency_s = lat;
    tr->parked_at = now;
    tr->answer_at = now + lat;
    tr->n_pending = 1;
    A->n_waiting++;
    return 0;
}

double agent_loop_sim_next_answer(const agent_loop *A) {
    double t = INFINITY;
    for (int i = 0; A->sim && i < A->n_live; i++)
        if (A->live[i]->n_pending > 0) t = MOERL_MIN(t, A->live[i]->answer_at);
    return t;
}

static int by_answer(const void *a, const void *b) {
    const traj *x = *(traj *const *)a, *y = *(traj *const *)b;
    if (x->answer_at != y->answer_at) return x->answer_at < y->answer_at ? -1 : 1;
    return x->r->id < y->r->id ? -1 : x->r->id > y->r->id;
}

/* One due answer: counted as the real path counts an environment's, then the filler tool turn.
 * Returns 1 ended (length: no room), 0 continued, MOERL_ERR. */
static int sim_answer(agent_loop *A, engine *e, traj *tr, double now) {
    A->st.answered++;
    A->st.tool_latency_sum_s += tr->latency_s;
    A->st.tool_latency_max_s = MOERL_MAX(A->st.tool_latency_max_s, tr->latency_s);
    A->st.tool_errors += tr->timed_out;
    A->st.tool_timeouts += tr->timed_out;
    A->st.tool_wait_s += now - tr->parked_at;
    tr->n_pending = 0;
    A->n_waiting--;
    tr->t->tool_errors += tr->timed_out;
    const int rc = engine_continue(e, tr->r, A->filler, A->sc.response_tokens);
    if (rc < 0) return moerl_error_prefix("trajectory %s: ", tr->id);
    if (rc == 0) return 1; /* no room for the tool turn and a token: finish `length` */
    tr->turn_start = tr->r->n_out;
    return 0;
}

/* Continue (or end) every trajectory whose answer is due by the clock, earliest first. */
static int sim_poll(agent_loop *A, engine *e, gen_request **done, int cap) {
    const double now = A->clock(A->clock_ctx);
    int n_due = 0;
    traj **due = xmalloc((size_t)(A->n_live ? A->n_live : 1) * sizeof(traj *));
    for (int i = 0; i < A->n_live; i++)
        if (A->live[i]->n_pending > 0 && A->live[i]->answer_at <= now) due[n_due++] = A->live[i];
    qsort(due, (size_t)n_due, sizeof *due, by_answer);
    int n_done = 0, rc = MOERL_OK;
    for (int i = 0; i < n_due && rc != MOERL_ERR; i++) {
        rc = sim_answer(A, e, due[i], now);
        if (rc != 1) continue;
        if (n_done == cap) {
            rc = moerl_errorf("agent loop: more ended trajectories than room (%d)", cap);
            break;
        }
        done[n_done++] = due[i]->r;
        finish_traj(A, due[i]);
    }
    free(due);
    return rc == MOERL_ERR ? MOERL_ERR : n_done;
}
