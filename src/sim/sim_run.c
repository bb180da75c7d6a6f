/* moerl simulate's job (sim_run): the production step loop (src/rl/schedule.c's job_schedule_run)
 * with a discrete-event rollout side on a virtual clock, plugged in through rl's job_ops transport.
 * See src/sim/sim.h.
 *
 * Two clocks, both virtual: t_train (the step loop: it advances by the PPO update's cost and by
 * waits for groups and syncs) and t_roll (when the rollout side finishes its current engine step).
 * Before the loop observes anything (taking groups, a sync, the stop), the rollout side is advanced
 * to t_train: every engine step that starts at or before t_train runs (the real rollouter_tick:
 * staleness budget, admission, the engine's scheduler), and the groups a step completes become
 * visible in the MessageQueue only at the step's end (held back meanwhile, as a rollout rank's
 * groups are in flight to trainer rank 0). A rollout side with nothing to do idles until the next
 * event of the step loop. Async mode (`async_training.mode=async`): the two sides overlap, and a sync
 * happens at the rollout side's next step boundary (with partial rollout: interrupt; without:
 * drain first), as in job.c's rollouter thread. Lockstep and sync modes: the rollout side runs
 * only while the step loop waits for groups, as job.c's one-thread driver does, so a lockstep
 * simulation admits, interrupts and trains exactly the groups `moerl rl` does in lockstep.
 * With sim.host_cores (sim.h: processor sharing of one host's cores), an async PPO update is
 * co-simulated with the engine steps it overlaps (train_shared), each side slowed only while the
 * other computes.
 *
 * Multi-turn (rollout.multi_turn.enable): the rollouter's agent loop runs in simulation mode
 * (rl/agent_loop.h) on the rollout side's clock t_roll: a turn's tool call is sent at the start of the
 * engine step that ended the turn and answered at that time + its drawn latency; the answered
 * trajectories are continued by the next tick. A tick that finds nothing to decode and only
 * trajectories waiting for tools (the rollouter's wait_tools stage) jumps t_roll to the next answer
 * (idle time of the rollout side), or, when the step loop acts first, to that event. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "model/perf.h"
#include "plan/plan.h"
#include "rl/job_internal.h"
#include "rl/rl.h"
#include "sim/sim.h"
#include "rollout/engine.h"

typedef struct {
    const sim_setup *su;
    int async;
    double t_train, t_roll;
    rl_group **pending; /* completed by the step ending at t_roll, not yet visible */
    int n_pending, cap_pending;
    double win_busy, win_idle; /* rollout side, since the last sync */
    double busy, idle, train_busy, sync_s, wait_s;
    double roll_work, train_work; /* device-seconds at full speed: Σ step work × busy replicas; Σ update work × trainers */
    double step_b;             /* busy replicas of the rollout step ending at t_roll (host sharing) */
    double horizon;            /* a tool wait jumps t_roll at most to here (the step loop's next event) */
    int64_t steps_engine;
    int64_t updates;           /* optimizer updates so far (the exact exchange's warm-up counts them) */
    sim_result *res;
} sim_state;

static sim_state *ST(job *J) { return J->ops->ctx; }

static int defer_group(void *ctx, rl_group *g) {
    sim_state *s = ctx;
    if (s->n_pending == s->cap_pending) {
        s->cap_pending = s->cap_pending ? 2 * s->cap_pending : 64;
        s->pending = xrealloc(s->pending, (size_t)s->cap_pending * sizeof(rl_group *));
    }
    s->pending[s->n_pending++] = g;
    return MOERL_OK;
}

static int deliver(job *J) {
    sim_state *s = ST(J);
    for (int i = 0; i < s->n_pending; i++)
        if (rl_queue_put(&J->queue, s->pending[i]) != MOERL_OK) return MOERL_ERR;
    s->n_pending = 0;
    return MOERL_OK;
}

/* Host sharing (su->host_cores = C > 0): the trainer's processes and the busy rollout replicas are
 * processes on C cores, each at most one core; while n of them are runnable each progresses at
 * min(1, C / n) of its calibrated speed (processor sharing). A replica is runnable only while it
 * has a group in the step (a group's responses live on one rank, as the leader grants whole
 * groups), and a rollout rank without work sleeps (job_dist.c never spins), so an idle role costs
 * the others nothing. */
static double share_rate(const sim_state *s, double runnable) {
    const double C = s->su->host_cores;
    return C > 0 && runnable > C ? C / runnable : 1.0;
}

/* The agent loop's clock (multi-turn): the rollout side's. */
static double roll_clock(void *ctx) { return ((const sim_state *)ctx)->t_roll; }

#define ROLL_TOOL_WAIT 2

/* Start one rollout tick at t_roll (admission + one engine step): *w = the step's work (seconds at
 * full speed per busy replica), *b = the busy replicas (min(replicas, groups in the step)); the
 * caller sets its duration. Returns 1 (a step), 0 (nothing to do), ROLL_TOOL_WAIT (no step: only
 * trajectories waiting for tools, the answers due by t_roll taken; *w = *b = 0), MOERL_ERR. */
static int roll_begin(job *J, double *w, double *b) {
    sim_state *s = ST(J);
    const engine_stats a = engine_get_stats(J->R.eng);
    const int q0 = rl_queue_size(&J->queue), p0 = s->n_pending;
    const int did = rollouter_tick(&J->R);
    if (did <= 0) return did;
    if (!strcmp(J->R.stage, "wait_tools")) {
        *w = *b = 0;
        return ROLL_TOOL_WAIT;
    }
    const engine_stats z = engine_get_stats(J->R.eng);
    /* groups that had responses in the step: still in flight + completed by it (deferred in async
     * mode, queued in lockstep / sync mode) */
    const int groups = J->R.n_inflight + (s->n_pending - p0) + (rl_queue_size(&J->queue) - q0);
    const double rep = MOERL_MAX(1, MOERL_MIN(s->su->n_rollout_replicas, groups));
    const double toks = (double)(z.decode_tokens + z.prefill_tokens - a.decode_tokens - a.prefill_tokens) / rep;
    *w = sim_engine_step_s(s->su, toks, (double)(z.kv_reads - a.kv_reads) / rep);
    *b = s->su->host_cores > 0 ? rep : 0;
    s->roll_work += *w * rep;
    s->steps_engine++;
    return 1;
}

static void roll_account(sim_state *s, double dt) {
    s->busy += dt;
    s->win_busy += dt;
}

/* Lockstep / sync: the rollout side waits for the step loop (the update, the sync) until t: idle. */
static void roll_idle_to(sim_state *s, double t) {
    if (t <= s->t_roll) return;
    s->idle += t - s->t_roll;
    s->win_idle += t - s->t_roll;
    s->t_roll = t;
}

/* A tick found only trajectories waiting for tools: when the answers it took left work to decode,
 * go on at once; else the rollout side idles until the next answer or the horizon, whichever comes
 * first. Returns 1 (an answer is due, or work), 0 (the horizon came first: idle until the step loop
 * acts). */
static int roll_tool_wait(job *J) {
    sim_state *s = ST(J);
    if (engine_num_unfinished(J->R.eng) > 0 || agent_loop_waiting(J->R.agent) == 0) return 1;
    const double next = agent_loop_sim_next_answer(J->R.agent);
    const double to = MOERL_MIN(next, s->horizon);
    MOERL_ASSERT(isfinite(to) && to >= s->t_roll);
    roll_idle_to(s, to);
    return next <= to ? 1 : 0;
}

/* One rollout tick at t_roll with the trainer not computing (it waits for groups or syncs): the
 * busy replicas share the cores among themselves. Returns 1 (worked, or waited for a tool's answer),
 * 0 (idle), MOERL_ERR. */
static int roll_step(job *J) {
    sim_state *s = ST(J);
    double w, b;
    const int did = roll_begin(J, &w, &b);
    if (did <= 0) return did;
    if (did == ROLL_TOOL_WAIT) {
        const int got = roll_tool_wait(J);
        if (!s->async && deliver(J) != MOERL_OK) return MOERL_ERR;
        return got;
    }
    const double dt = w / share_rate(s, b);
    s->t_roll += dt;
    s->step_b = b;
    roll_account(s, dt);
    if (!s->async) return deliver(J) == MOERL_OK ? 1 : MOERL_ERR;
    return 1;
}

/* Async: run every rollout step that starts at or before t. */
static int roll_advance(job *J, double t) {
    sim_state *s = ST(J);
    while (s->t_roll <= t) {
        if (deliver(J) != MOERL_OK) return MOERL_ERR;
        s->horizon = t; /* a wait for tools stops at the step loop's event */
        const int did = roll_step(J);
        s->horizon = INFINITY;
        if (did < 0) return MOERL_ERR;
        if (did == 0) { /* nothing to do until the step loop acts */
            s->idle += t - s->t_roll;
            s->win_idle += t - s->t_roll;
            s->t_roll = t;
            break;
        }
    }
    return MOERL_OK;
}

static int sim_get_groups(job *J, rl_group **out, int n, double timeout_s, double *waited) {
    sim_state *s = ST(J);
    const double t0 = s->t_train;
    if (s->async) {
        if (roll_advance(J, s->t_train) != MOERL_OK) return MOERL_ERR;
        while (rl_queue_size(&J->queue) < n) { /* wait for the rollout side's next step boundary */
            if (s->n_pending == 0 && s->t_roll <= s->t_train) {
                const int did = roll_step(J);
                if (did < 0) return MOERL_ERR;
                if (did == 0)
                    return moerl_errorf("simulate: rollout side idle with %d of %d groups queued (staleness budget "
                                        "or data exhausted)", rl_queue_size(&J->queue), n);
                continue;
            }
            s->t_train = MOERL_MAX(s->t_train, s->t_roll);
            if (deliver(J) != MOERL_OK) return MOERL_ERR;
            if (rl_queue_size(&J->queue) >= n) break;
            const int did = roll_step(J);
            if (did < 0) return MOERL_ERR;
            if (did == 0)
                return moerl_errorf("simulate: rollout side idle with %d of %d groups queued (staleness budget or "
                                    "data exhausted)", rl_queue_size(&J->queue), n);
        }
    } else { /* lockstep / sync: generate now, the step loop waits */
        roll_idle_to(s, s->t_train);
        while (rl_queue_size(&J->queue) < n) {
            const int did = roll_step(J);
            if (did < 0) return MOERL_ERR;
            if (did == 0)
                return moerl_errorf("simulate: rollouter idle with %d of %d groups queued (staleness budget or data "
                                    "exhausted)", rl_queue_size(&J->queue), n);
        }
        s->t_train = s->t_roll;
    }
    *waited = s->t_train - t0;
    s->wait_s += *waited;
    MOERL_ASSERT(rl_queue_try_get_n(&J->queue, (void **)out, n) == n);
    return n;
}

static int sim_send_part(job *J, int d, const rl_minibatch *mbs, int n_mb, rl_group **part, int n_part) {
    return moerl_errorf("internal: the simulated job has one trainer rank (asked to send to rank %d)", d);
}

/* Async with host sharing: a PPO update of `work` seconds at full speed on nt trainer processes,
 * run concurrently with the rollout side (discrete events at the ends of rollout steps: while
 * the update runs, nt + b processes share the cores; a rollout step still running when the
 * update ends finishes at the rate of its replicas alone). Advances t_train past the update and
 * t_roll through it. */
static int train_shared(job *J, double work, double nt) {
    sim_state *s = ST(J);
    double t = s->t_train, rem_r = 0, b = s->step_b, t0_step = t;
    if (s->t_roll > t) { /* a step in progress, timed with the trainer not computing: re-time its rest */
        rem_r = (s->t_roll - t) * share_rate(s, b);
        s->busy -= s->t_roll - t; /* its busy time up to t stays counted; the rest is counted below */
        s->win_busy -= s->t_roll - t;
        s->t_roll = t;
    }
    while (work > 0) {
        if (rem_r <= 0) { /* the rollout side starts its next step at t */
            if (s->t_roll < t) { /* it was idle since t_roll (nothing to do until now) */
                s->idle += t - s->t_roll;
                s->win_idle += t - s->t_roll;
                s->t_roll = t;
            }
            if (deliver(J) != MOERL_OK) return MOERL_ERR;
            int did = roll_begin(J, &rem_r, &b);
            if (did < 0) return MOERL_ERR;
            if (did == ROLL_TOOL_WAIT) { /* waiting for tools: wall time, not work (no replica computes) */
                if (engine_num_unfinished(J->R.eng) > 0 || agent_loop_waiting(J->R.agent) == 0) continue;
                const double next = agent_loop_sim_next_answer(J->R.agent), r = share_rate(s, nt);
                if (next < t + work / r) { /* the answer comes during the update: the next tick then */
                    work -= (next - t) * r;
                    t = next;
                    continue; /* idle from t_roll to the new t: counted at the loop's top */
                }
                did = 0; /* the update ends first: it runs alone, the rollout side waits */
            }
            if (did == 0) { /* idle until the step loop acts: the update runs alone */
                t += work / share_rate(s, nt);
                work = 0;
                break;
            }
            t0_step = t;
        }
        const double r = share_rate(s, nt + b); /* every runnable process's rate */
        if (work <= rem_r) { /* the update ends first (or together) */
            t += work / r;
            rem_r -= work;
            work = 0;
        } else {
            t += rem_r / r;
            work -= rem_r;
            rem_r = 0;
            s->t_roll = t; /* the step ends */
            roll_account(s, t - t0_step);
        }
    }
    if (rem_r > 0) { /* the step in progress finishes with the trainer waiting */
        s->t_roll = t + rem_r / share_rate(s, b);
        roll_account(s, s->t_roll - t0_step);
    }
    s->step_b = b;
    s->t_train = t;
    return MOERL_OK;
}

/* The gradient exchange of the next optimizer update: the exact ring all-reduce of the fp32-or-bf16 gradients
 * during the scheme's warm-up (su->xchg_exact_updates), on 1-bit Adam's variance updates (xchg_var_interval) or
 * without compression, else the compressed scheme's
 * codec + bytes (plan_xchg_row_compute over the padded parameters). One trainer exchanges nothing. */
static double exchange_s(sim_state *s) {
    const sim_setup *su = s->su;
    if (su->n_trainer < 2) return 0;
    const double nt = su->n_trainer;
    int64_t tot, dense, expert, hf;
    plan_param_counts(su->target, &tot, &dense, &expert, &hf);
    double t = 2.0 * (nt - 1) / nt * (double)tot * su->dev.dtype_bytes / su->dev.link_bw;
    const int64_t K = su->xchg_var_interval, after = s->updates + 1 - su->xchg_exact_updates; /* > 0: past */
    if (su->xchg != PLAN_XCHG_NONE && after > 0 && (K <= 0 || after % K != 0)) { /* 1-bit Adam's variance updates exact */
        const plan_xchg_input in = {.elements = (double)tot, .ranks = su->n_trainer, .link_bw = su->dev.link_bw};
        plan_xchg_row row;
        if (plan_xchg_row_compute(&in, &su->codec, su->xchg, &row) == MOERL_OK) { /* inputs checked at setup */
            t = row.exchange_s;
            s->res->compressed_updates++;
        }
    }
    s->res->exchange_s += t;
    return t;
}

static int sim_update(job *J, rl_group **part, const rl_minibatch *mbs, int n_mb, train_stats *st) {
    sim_state *s = ST(J);
    const rl_config *c = J->cfg;
    const sim_setup *su = s->su;
    int64_t tokens = 0, pairs = 0;
    int n = 0;
    for (int b = 0; b < n_mb; b++) n += mbs[b].n_groups;
    for (int i = 0; i < n; i++) {
        const rl_group *g = part[i];
        int vmin = 1 << 30;
        for (int j = 0; j < g->n; j++) {
            const gen_request *r = &g->reqs[j];
            const int64_t L = r->prompt_len + r->n_out;
            tokens += L;
            pairs += L * (L + 1) / 2;
            for (int t = 0; t < r->n_out; t++) vmin = MOERL_MIN(vmin, r->out_versions[t]);
            s->res->interrupted_responses += r->n_interruptions > 0;
        }
        const int lag = vmin == (1 << 30) ? 0 : J->T.version - vmin;
        s->res->stale_hist[MOERL_MIN(7, MOERL_MAX(0, lag))]++;
    }
    /* ppo_epochs forward+backward passes, and once per step the forward-only ones (a third each,
     * model/perf.h): the proximal logprobs and the KL reference's (actor.use_kl_loss), as trainer_update */
    const double flops = model_train_flops(su->target, tokens, pairs) * (c->ppo_epochs + rl_fwd_only_passes(c) / 3.0);
    const int updates = n_mb * c->ppo_epochs;
    const double nt = su->n_trainer;
    double comm = 0;
    for (int u = 0; u < updates; u++, s->updates++) comm += exchange_s(s);
    double dt = flops * su->dev.s_flop / nt + updates * su->dev.c_update + comm;
    const double t_start = s->t_train;
    s->train_work += dt * nt;
    if (su->host_cores > 0 && s->async) {
        if (train_shared(J, dt, nt) != MOERL_OK) return MOERL_ERR;
    } else {
        s->t_train += dt;
    }
    s->train_busy += s->t_train - t_start;
    st->trained_tokens = tokens * c->ppo_epochs;
    st->train_flops = flops;
    J->T.step++;
    return MOERL_OK;
}

static int sim_sync(job *J, int version, double *rb, double *ri) {
    sim_state *s = ST(J);
    rollouter *R = &J->R;
    if (s->async) {
        if (roll_advance(J, s->t_train) != MOERL_OK) return MOERL_ERR;
        s->t_roll = MOERL_MAX(s->t_roll, s->t_train); /* the rollout side's next step boundary */
        if (deliver(J) != MOERL_OK) return MOERL_ERR;
    } else {
        roll_idle_to(s, s->t_train);
    }
    if (!J->cfg->partial_rollout) { /* drain: in-flight responses finish under the old weights (multi-turn:
                                       the trajectories waiting for tools too, as job.c's sync) */
        R->draining = 1;
        while (rollouter_unfinished(R) > 0) {
            const int did = roll_step(J);
            if (did < 0) return MOERL_ERR;
            if (deliver(J) != MOERL_OK) return MOERL_ERR;
            if (did == 0) break;
        }
    }
    int64_t tot, dense, expert, hf;
    plan_param_counts(s->su->target, &tot, &dense, &expert, &hf);
    const double bytes = s->su->dev.dtype_bytes == 4 ? (double)tot * 4 : (double)hf * s->su->dev.dtype_bytes;
    const double dt = bytes / s->su->dev.link_bw + s->su->dev.c_sync;
    if (rollouter_apply_sync(R, J->m->params, J->m->n_params, version) != MOERL_OK) return MOERL_ERR;
    s->t_roll += dt;
    s->sync_s += dt;
    if (deliver(J) != MOERL_OK) return MOERL_ERR;
    s->t_train = s->t_roll;
    *rb = s->win_busy;
    *ri = s->win_idle;
    s->win_busy = s->win_idle = 0;
    return MOERL_OK;
}

/* The step loop's clock: the trainer's virtual time. */
static double sim_clock(job *J) { return ST(J)->t_train; }

static void sim_add_prompts(job *J, int64_t k) { atomic_fetch_add(&J->R.dropped_pending, k); }

static int64_t *sim_inflight_uids(job *J, int *n) {
    const rollouter *R = &J->R;
    int64_t *u = xmalloc((size_t)(R->n_inflight ? R->n_inflight : 1) * sizeof(int64_t));
    for (int i = 0; i < R->n_inflight; i++) u[i] = R->inflight[i]->uid;
    *n = R->n_inflight;
    return u;
}

static int sim_stop(job *J, double *rb, double *ri) {
    sim_state *s = ST(J);
    if (!s->async) roll_idle_to(s, s->t_train); /* the last update */
    *rb = s->win_busy;
    *ri = s->win_idle;
    return MOERL_OK;
}

static void sim_describe(job *J, char *buf, size_t len) {
    sim_state *s = ST(J);
    snprintf(buf, len, "simulated rollout side at t=%.3f s (step loop at %.3f s), %d groups in flight", s->t_roll,
             s->t_train, (int)J->R.n_inflight);
}

static void sim_abort(job *J, const char *msg) {
    fprintf(stderr, "moerl simulate: %s\n", msg);
    fflush(stderr);
    _exit(3);
}

/* The rollouter's engine again with the paged fields of su (sim.h): the budget of kv_blocks blocks per replica,
 * in the simulated model's terms, becomes as many blocks of the stand-in model's KV (fp32 K and V of its
 * layers), so admission and preemption see the target's block counts. kv_blocks 0: the reservation. Errors:
 * a budget smaller than one sequence at the engine's max_model_len (as the engine refuses it, with the
 * target's numbers). */
static int paged_engine(rollouter *R, const sim_setup *su, const moe_model *tiny) {
    engine_config ec = engine_get_config(R->eng);
    const int B = su->block_size;
    const int64_t need = ((int64_t)ec.max_model_len + B - 1) / B;
    if (su->kv_blocks > 0 && su->kv_blocks < need)
        return moerl_errorf("the KV budget holds %lld blocks of %d tokens per replica (%.4g bytes each on a rollout "
                            "device), fewer than one sequence at full length needs (%d tokens = %lld blocks): raise "
                            "rollout.kv_cache_bytes / rollout.gpu_memory_utilization",
                            (long long)su->kv_blocks, B, B * su->kv_token_bytes, ec.max_model_len, (long long)need);
    const moe_config *t = &tiny->cfg;
    const double tiny_token = 2.0 * t->num_hidden_layers * t->num_key_value_heads * t->head_dim * sizeof(float);
    ec.block_size = B;
    ec.enable_prefix_caching = su->prefix_caching;
    ec.kv_cache_bytes = su->kv_blocks > 0 ? (int64_t)((double)su->kv_blocks * su->n_rollout_replicas * B * tiny_token) : 0;
    engine_free(R->eng);
    R->eng = engine_create(t, ec);
    if (!R->eng) return MOERL_ERR;
    return engine_load_weights(R->eng, tiny->params, tiny->n_params, 0);
}

int sim_run(const rl_config *cfg_in, const sim_setup *su, moe_model *tiny, const dataset *train, sim_result *res) {
    rl_config cfg = *cfg_in;
    cfg.val_n = 0;
    cfg.save_freq = -1;
    cfg.watchdog_s = 0;
    cfg.resume_auto = 0;
    cfg.simulated = 1;
    if (su->n_rollout_replicas < 1 || su->rollout_tp < 1 || su->n_trainer < 1)
        return moerl_errorf("simulate: rollout replicas (%d), devices per replica (%d) and trainer devices (%d) must "
                            "be positive", su->n_rollout_replicas, su->rollout_tp, su->n_trainer);
    /* the replicas as one engine: their slots and token budgets add up, a step's batch is split evenly */
    cfg.max_num_seqs *= su->n_rollout_replicas;
    cfg.max_num_batched_tokens *= su->n_rollout_replicas;
    memset(res, 0, sizeof *res);
    sim_state S;
    memset(&S, 0, sizeof S);
    S.su = su;
    S.async = cfg.mode == RL_MODE_ASYNC;
    S.res = res;
    S.horizon = INFINITY;
    job_ops ops = {sim_get_groups, sim_send_part, sim_sync, sim_add_prompts, sim_inflight_uids, sim_stop,
                   sim_describe, sim_abort, &S, sim_update, NULL, NULL, sim_clock};
    job *J = xcalloc(1, sizeof *J);
    J->cfg = &cfg;
    J->train = J->test = train;
    J->m = tiny;
    J->n_trainers = 1;
    J->ops = &ops;
    int rc = MOERL_ERR;
    staleness_budget b;
    if (job_plan(J, &b) != MOERL_OK) goto out;
    if (moerl_mkdirs(cfg.out_dir) != MOERL_OK) goto out;
    rl_queue_init(&J->queue, b.max_required_samples);
    if (rollouter_init(&J->R, &cfg, &b, train, tiny, &J->queue, J->total_prompts) != MOERL_OK) goto out;
    if (paged_engine(&J->R, su, tiny) != MOERL_OK) goto out;
    if (cfg.multi_turn.enable) { /* the agent loop in simulation mode, on the rollout side's clock */
        agent_sim_config mt = su->multi_turn;
        mt.eos_id = tiny->cfg.eos_token_id;
        mt.filler_id = 0; /* the token the simulated engine samples (a byte, not a stop id) */
        J->R.agent = agent_loop_create_sim(&cfg.multi_turn, &mt, roll_clock, &S);
        if (!J->R.agent) goto out;
    }
    J->feed = &J->R.feed;
    if (S.async) {
        J->R.on_group_done = defer_group;
        J->R.on_group_done_ctx = &S;
    }
    if (trainer_init(&J->T, &cfg, train, tiny) != MOERL_OK) goto out;
    if (job_open_outputs(J, 0) != MOERL_OK) goto out;
    rl_result rr;
    memset(&rr, 0, sizeof rr);
    rc = job_schedule_run(J, &rr);
    if (rc == MOERL_OK) {
        res->wall_s = S.t_train;
        res->steps = rr.steps;
        res->prompts_trained = rr.prompts_trained;
        res->versions = rr.final_version;
        res->tokens_generated = engine_get_stats(J->R.eng).generated_tokens;
        res->prompts_per_s = S.t_train > 0 ? rr.prompts_trained / S.t_train : 0;
        res->tokens_per_s = S.t_train > 0 ? res->tokens_generated / S.t_train : 0;
        res->trainer_idle_ratio = S.t_train > 0 ? S.wait_s / S.t_train : 0;
        res->rollout_idle_ratio = S.busy + S.idle > 0 ? S.idle / (S.busy + S.idle) : 0;
        res->rollout_busy_s = S.busy;
        res->rollout_idle_s = S.idle;
        res->train_busy_s = S.train_busy;
        res->rollout_work_s = S.roll_work;
        res->train_work_s = S.train_work;
        res->sync_s = S.sync_s;
        res->max_staleness = rr.max_lag_seen;
        res->engine_steps = S.steps_engine;
        const engine_stats es = engine_get_stats(J->R.eng);
        res->kv_blocks_total = es.kv_blocks_total;
        res->kv_blocks_peak = es.kv_blocks_peak;
        res->preemptions = es.preemptions;
        res->prefix_hit_tokens = es.prefix_hit_tokens;
    }
out:
    for (int i = 0; i < S.n_pending; i++) rl_group_free(S.pending[i]);
    free(S.pending);
    job_free(J);
    return rc;
}
