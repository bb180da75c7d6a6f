/* The main job across processes (rl_run_dist; see rl.h): rollout ranks, data-parallel trainer
 * ranks, and trainer rank 0 ("the leader") in the middle.
 *
 * Messages (dist_send_msg / dist_recv_msg_any on world ranks; tags below):
 *   rollout → leader   ADMIT_REQ {k}: room for k more whole groups
 *   leader → rollout   ADMIT_GRANT {count, uids[count]}: start these prompts now (count may be 0:
 *                      the answer to a request while a sync or the stop is pending). Every request
 *                      gets exactly one answer; a rank has at most one request outstanding.
 *   rollout → leader   GROUP (wire.h "MOERLGR1"): a finished prompt group, scored by the rank's own
 *                      reward pool (rewards beside generation) before it is sent
 *   rollout → leader   REWARD_FAIL {message}: the rank's reward backend failed; the rank generates
 *                      nothing more and answers SYNC/STOP as usual
 *   leader → rollout   CMD {START|SYNC|BCAST|STOP|BYE, version, partial}
 *   rollout → leader   ACK {kind, groups in flight, groups sent so far, cumulative statistics}
 *   leader → trainer t TRAIN (wire.h "MOERLTB1"): its share of a step, or stop; STATE: weights and
 *                      optimizer state at startup; CMD BYE at the end
 * The leader's server thread receives everything addressed to it (GROUP, ADMIT_REQ, ACK) and is the
 * GLOBAL staleness budget and prompt feed of the embedded job: it grants a new uid only while
 * staleness_can_start(counter, queued) holds, prompts are left and no sync is pending, and it tracks
 * the granted-not-yet-received uids per rank ("outstanding"; with the queue, the unconsumed started
 * prompts a checkpoint lists).
 *
 * Sync (after every trigger_parameter_sync_step steps; verl's order: pause admission → interrupt or
 * drain → broadcast → load → version+1 → recompute the carried-over count → resume):
 *   leader: block grants (pending requests are answered with 0) → SYNC to every rollout rank
 *   rollout: take the answer to its outstanding request (start those groups) → partial rollout:
 *     engine_pause; else drain (step until the engine is empty, sending groups) → ACK {in flight,
 *     sent} → wait for BCAST
 *   leader: wait for every ACK and for every group each rank says it sent → version+1 → counter =
 *     Σ in flight (checked = outstanding) + queued → checkpoint if due → BCAST → dist_bcast_weights
 *     → unblock grants
 *   rollout: receive the weights, engine_load_weights(version), resume (interrupted first).
 * Data-parallel step: the leader takes required_samples groups from the queue, computes the sample
 * statistics over all of them, splits each mini-batch's groups over the trainer ranks (largest
 * first onto the least-loaded rank, by prompt+response tokens), sends each rank its share with the
 * mini-batch's global token counts, and every trainer rank runs trainer_update (gradients reduced
 * layer by layer by a dist_grad_reducer during the last micro-batch's backward; identical AdamW steps).
 *
 * Waiting never spins a core: the leader's main thread waits on condition variables, receivers
 * poll with short sleeps (ranks share the cores under --oversubscribe), and nobody enters a
 * collective long before its peers (a BCAST or START command precedes each weight broadcast).
 * Errors on any rank end the job with dist_abort, naming the rank and its role; a reward backend's
 * failure (REWARD_FAIL) first stops the loop at the leader's next wait for groups, which then writes a
 * checkpoint (the failed rank's groups are outstanding: redone on resume).
 * Sources: verl recipe/fully_async_policy (rollouter / trainer / parameter synchroniser roles,
 * staleness budget, partial rollout), PyTorch DDP (bucketed overlapped gradient all-reduce). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/common.h"
#include "base/log.h"
#include "rl/job_internal.h"
#include "parallel/ep.h"
#include "parallel/parallel.h"
#include "parallel/tp.h"
#include "parallel/tp_rollout.h"
#include "rl/rl.h"
#include "rl/trainer_onebit.h"
#include "dist/onebit.h"
#include "rl/wire.h"
#include "train/train.h"

void openblas_set_num_threads(int n);

enum { TAG_ADMIT_REQ = 101, TAG_ADMIT_GRANT, TAG_GROUP, TAG_CMD, TAG_ACK, TAG_TRAIN, TAG_STATE, TAG_REWARD_FAIL };
enum { CMD_START = 1, CMD_SYNC, CMD_BCAST, CMD_STOP, CMD_BYE };

typedef struct {
    int32_t cmd, version, partial, pad;
} cmd_msg;

typedef struct {
    int32_t kind;         /* CMD_SYNC or CMD_STOP: what this acknowledges */
    int32_t in_flight;    /* groups started and not finished on the rank */
    int64_t groups_sent;  /* GROUP messages sent since the start */
    int64_t gen_tokens;   /* generated tokens since the start (engine statistics) */
    double busy_s, idle_s;/* cumulative rollout busy / idle seconds */
    double reward_s;      /* cumulative seconds of the rank's reward pool in backend->score */
    int64_t reward_backlog; /* reward requests waiting on the rank */
    /* the paged KV cache since the start (engine_stats; docs/engine.md) */
    int64_t preemptions, kv_blocks_total, kv_blocks_peak, prefix_hit_tokens, prefill_tokens;
} ack_msg;

#define STATE_MAGIC "MOERLTS1"
typedef struct {
    char magic[8];
    uint32_t format;
    int32_t version;
    int64_t step, opt_step, opt_skipped;
    uint64_t n_params, chunk_floats;
    int32_t has_ref, pad;
    double kl_ctrl_value;     /* algorithm.use_kl_in_reward's β (trainer.kl_ctrl.value) */
} state_header;

/* ------------------------------------------------------------------ small helpers */

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void set_role_threads(int n) {
    if (n <= 0) n = 1;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
}

static char g_role[64] = "?";

/* End the whole job: "moerl[rank R]: abort: <role>: <message>". */
static void die(dist_ctx *ctx, const char *what) __attribute__((noreturn));
static void die(dist_ctx *ctx, const char *what) {
    char msg[1600];
    snprintf(msg, sizeof msg, "%s: %s%s%s", g_role, what ? what : "", what && what[0] ? ": " : "", moerl_last_error());
    dist_abort(ctx, msg);
}
#define CHECK_OK(call, what)                          \
    do {                                              \
        if ((call) != MOERL_OK) die(ctx, what);       \
    } while (0)

/* debug.test_fail_rank=r [debug.test_fail_version=v] (rl_config.test_fail): a deliberate error on world
 * rank r at startup (or once it reaches policy version v), for the test of failure propagation. */
static int injected_failure(const rl_config *cfg, const dist_ctx *ctx, int version) {
    if (!cfg->test_fail || cfg->test_fail_rank != ctx->world_rank) return MOERL_OK;
    const int at = cfg->test_fail_version >= 0 ? cfg->test_fail_version : -1;
    if (at != version) return MOERL_OK;
    if (at >= 0)
        return moerl_errorf("injected failure (debug.test_fail_rank=%d, debug.test_fail_version=%d)",
                            cfg->test_fail_rank, at);
    return moerl_errorf("injected failure (debug.test_fail_rank=%d)", cfg->test_fail_rank);
}

static void send_cmd(dist_ctx *ctx, int dst, int cmd, int version, int partial) {
    cmd_msg c = {cmd, version, partial, 0};
    CHECK_OK(dist_send_msg(ctx, dst, TAG_CMD, &c, sizeof c), "sending a command");
}

static cmd_msg recv_cmd(dist_ctx *ctx) {
    void *buf;
    size_t len;
    int src;
    CHECK_OK(dist_recv_msg_any(ctx, TAG_CMD, &src, &buf, &len), "receiving a command");
    if (len != sizeof(cmd_msg) || src != ctx->first_trainer) {
        free(buf);
        moerl_errorf("command message of %zu bytes from rank %d (expected %zu from trainer rank 0 = world rank %d)",
                     len, src, sizeof(cmd_msg), ctx->first_trainer);
        die(ctx, "protocol");
    }
    cmd_msg c;
    memcpy(&c, buf, sizeof c);
    free(buf);
    return c;
}

/* Send/receive a float array in chunks (dist_send_msg takes at most INT_MAX bytes). */
static void send_floats(dist_ctx *ctx, int dst, const float *x, size_t n, size_t chunk) {
    for (size_t off = 0; off < n; off += chunk)
        CHECK_OK(dist_send_msg(ctx, dst, TAG_STATE, x + off, MOERL_MIN(chunk, n - off) * sizeof(float)),
                 "sending the trainer state");
}
static void recv_floats(dist_ctx *ctx, float *x, size_t n, size_t chunk) {
    for (size_t off = 0; off < n; off += chunk) {
        void *buf;
        size_t len;
        CHECK_OK(dist_recv_msg_any(ctx, TAG_STATE, NULL, &buf, &len), "receiving the trainer state");
        const size_t want = MOERL_MIN(chunk, n - off) * sizeof(float);
        if (len != want) {
            free(buf);
            moerl_errorf("trainer state chunk at float %zu has %zu bytes, expected %zu", off, len, want);
            die(ctx, "protocol");
        }
        memcpy(x + off, buf, len);
        free(buf);
    }
}

/* ================================================================== rollout ranks */

typedef struct {
    dist_ctx *ctx;
    const rl_config *cfg;
    moe_model *m;
    rollouter R;
    int leader;
    int req_out;          /* an ADMIT_REQ awaits its answer */
    int64_t sent;         /* GROUP messages sent */
    int failed;           /* the reward backend failed: reported to the leader, nothing more is generated */
    /* rollout.expert_parallel_size > 1: this rank's EP group, the grid ep_state reads, the state */
    dist_comm *ep_comm;
    par_grid ep_grid;
    ep_state *ep;
    /* rollout.tensor_model_parallel_size > 1: this rank's replica group, its runtime, whether it is the
     * replica's first rank (it alone requests admissions, scores and sends groups: the others mirror it) */
    dist_comm *tp_comm;
    tp_rollout *tp;
    int tp_lead;
} rollout_rank;

/* Expert parallelism of the rollout engine (rollout.expert_parallel_size = P): consecutive rollout
 * ranks form groups of P; each engine holds its rank's E/P experts (the engine is rebuilt from the
 * sliced config) and every step's routed rows go through the EP dispatcher (src/parallel/ep.c, the
 * trainer's code: actor.moe.dispatcher and capacity_factor apply). A weight broadcast is sliced
 * bucket by bucket into the engine's buffer as it arrives (receive_weights). */
static void rollout_ep_setup(rollout_rank *W) {
    dist_ctx *ctx = W->ctx;
    const int P = W->cfg->rollout_ep, r = ctx->world_rank; /* rollout ranks are world ranks 0 .. n_rollout−1 */
    W->ep_comm = dist_comm_split_rollout(ctx, r / P, r);
    if (!W->ep_comm) die(ctx, "rollout expert parallelism");
    par_grid *g = &W->ep_grid;
    memset(g, 0, sizeof *g);
    g->cfg = W->cfg->par;
    g->ep = P;
    g->ep_rank = dist_comm_rank(W->ep_comm);
    g->ep_comm = W->ep_comm;
    g->T = g->D = g->dp = g->sp = g->pp = g->fsdp = g->replicas = 1;
    moe_config c = W->m->cfg;
    ep_config_apply(g, &c);
    const engine_config ec = engine_get_config(W->R.eng);
    engine_free(W->R.eng);
    W->R.eng = engine_create(&c, ec);
    if (!W->R.eng) die(ctx, "creating the expert-parallel rollout engine");
    W->ep = ep_state_new(g, &c, ec.max_num_batched_tokens);
    if (!W->ep) die(ctx, "rollout expert parallelism");
    engine_set_ep(W->R.eng, W->ep);
    if (g->ep_rank == 0)
        log_info("rollout EP: ranks %d..%d hold %d experts each (%s)", r, r + P - 1, c.num_experts / P,
                 moe_dispatcher_name(ep_dispatcher(W->ep)));
}

/* Rollout TP: the replica's ranks agree on the KV pool (rollout.gpu_memory_utilization reads each host's free
 * memory): every engine of the group is rebuilt with the smallest block count, so that their schedulers — and
 * their preemptions — stay identical. */
static void tp_agree_kv(rollout_rank *W, const moe_config *c, engine_config ec) {
    dist_ctx *ctx = W->ctx;
    const int P = W->cfg->rollout_tp;
    const int64_t n = engine_get_stats(W->R.eng).kv_blocks_total, bb = engine_get_config(W->R.eng).kv_cache_bytes / n;
    float mine[2] = {(float)(n >> 12), (float)(n & 4095)}, *all = xmalloc((size_t)2 * P * sizeof(float));
    CHECK_OK(dist_comm_allgather_f32(W->tp_comm, mine, 2, all), "rollout TP: the KV pool");
    int64_t lo = n;
    for (int q = 0; q < P; q++) lo = MOERL_MIN(lo, ((int64_t)all[2 * q] << 12) + (int64_t)all[2 * q + 1]);
    free(all);
    if (lo == n) return;
    ec.kv_cache_bytes = lo * bb;
    engine_free(W->R.eng);
    W->R.eng = engine_create(c, ec);
    if (!W->R.eng) die(ctx, "creating the tensor-parallel rollout engine");
}

/* Tensor parallelism of the rollout engine (rollout.tensor_model_parallel_size = P, vLLM's tensor_parallel_size):
 * consecutive rollout ranks form replicas of P; each engine holds tp_config_apply's slice (experts split) and
 * sums over the group through a tp_rollout runtime (engine_set_tp). Every rank of a replica runs the same
 * rollouter on the same prompts in the same steps: the first rank requests admissions and shares each grant
 * (tp_round), the others mirror it (their groups are neither scored nor sent). A weight broadcast is sliced as
 * it arrives (receive_weights: tp_slice_range). */
static void rollout_tp_setup(rollout_rank *W) {
    dist_ctx *ctx = W->ctx;
    const int P = W->cfg->rollout_tp, r = ctx->world_rank; /* rollout ranks are world ranks 0 .. n_rollout−1 */
    W->tp_comm = dist_comm_split_rollout(ctx, r / P, r);
    if (!W->tp_comm) die(ctx, "rollout tensor parallelism");
    const int q = dist_comm_rank(W->tp_comm);
    moe_config c = W->m->cfg;
    CHECK_OK(tp_config_apply(&c, P, q, c.num_experts > 0), "rollout.tensor_model_parallel_size");
    const engine_config ec = engine_get_config(W->R.eng);
    engine_free(W->R.eng);
    W->R.eng = engine_create(&c, ec);
    if (!W->R.eng) die(ctx, "creating the tensor-parallel rollout engine");
    tp_agree_kv(W, &c, ec);
    /* the vocabulary's padding rows stay zero: the broadcasts never write them */
    memset(W->cfg->bf16_weights ? (void *)engine_weight_buffer_bf16(W->R.eng) : (void *)engine_weight_buffer(W->R.eng),
           0, engine_model(W->R.eng)->n_params * (W->cfg->bf16_weights ? 2 : 4));
    W->tp = tp_rollout_new(W->tp_comm);
    if (!W->tp) die(ctx, "rollout tensor parallelism");
    CHECK_OK(engine_set_tp(W->R.eng, W->tp), "rollout tensor parallelism");
    W->tp_lead = q == 0;
    W->R.mirror = !W->tp_lead;
    const moe_model *lm = engine_model(W->R.eng);
    if (W->tp_lead)
        log_info("rollout TP: ranks %d..%d hold one replica, %zu of %zu weights and %lld KV bytes each", r, r + P - 1,
                 lm->n_params, W->m->n_params, (long long)engine_get_config(W->R.eng).kv_cache_bytes);
}

/* A rollout TP follower's finished group: its replica's first rank sends the same group. */
static int drop_group(void *vctx, rl_group *g) {
    (void)vctx;
    rl_group_free(g);
    return MOERL_OK;
}

/* One round of a rollout TP replica (collective over tp_comm): the first rank's grant — taken now when it has
 * arrived, or waited for when `wait` (a sync or the stop: the leader answers every pending request) — reaches
 * every rank, which all start its uids in the same order; returns 1 on every rank when every rank has a
 * command of trainer rank 0 waiting. */
static int tp_round(rollout_rank *W, int wait) {
    dist_ctx *ctx = W->ctx;
    const int cap = W->cfg->max_num_seqs + 1;
    double *x = xcalloc((size_t)cap + 2, sizeof(double)); /* [has a command, grant uids, uids ...] */
    x[0] = dist_iprobe(ctx, TAG_CMD) > 0;
    if (W->tp_lead && W->req_out && (wait || dist_iprobe(ctx, TAG_ADMIT_GRANT) > 0)) {
        void *buf;
        size_t len;
        CHECK_OK(dist_recv_msg_any(ctx, TAG_ADMIT_GRANT, NULL, &buf, &len), "receiving an admission grant");
        int32_t count = -1;
        if (len >= 8) memcpy(&count, buf, 4);
        if (count < 0 || count > cap || len != 8 + (size_t)count * 8) {
            free(buf);
            moerl_errorf("admission grant of %zu bytes announcing %d uids (at most %d)", len, count, cap);
            die(ctx, "protocol");
        }
        x[1] = count;
        for (int i = 0; i < count; i++) {
            int64_t uid;
            memcpy(&uid, (char *)buf + 8 + 8 * i, 8);
            x[2 + i] = (double)uid; /* exact: uids stay far below 2^53 */
        }
        free(buf);
        W->req_out = 0;
    }
    CHECK_OK(dist_comm_allreduce_f64(W->tp_comm, x, (size_t)cap + 2), "rollout TP round");
    for (int i = 0; i < (int)x[1]; i++) CHECK_OK(rollouter_start_uid(&W->R, (int64_t)x[2 + i]), "starting a granted prompt");
    const int all = x[0] == (double)W->cfg->rollout_tp;
    free(x);
    return all;
}

/* 1 on every rank of the EP group when x is nonzero on all of them (without EP: x != 0). */
static int ep_all(rollout_rank *W, int x) {
    dist_ctx *ctx = W->ctx;
    if (!W->ep) return x != 0;
    float f = x != 0;
    CHECK_OK(dist_comm_allreduce_f32(W->ep_comm, &f, 1), "rollout EP agreement");
    return f == (float)W->cfg->rollout_ep;
}

/* The reward backend failed on this rank (its message in moerl_last_error): trainer rank 0 is told
 * (TAG_REWARD_FAIL), stops the job at its next step boundary and writes a checkpoint in which this
 * rank's groups are outstanding; this rank stops generating and answers the SYNC / STOP rounds as
 * usual. Under rollout EP the group steps together: the job ends here. */
static void report_reward_failure(rollout_rank *W) {
    dist_ctx *ctx = W->ctx;
    if (W->ep || W->tp) die(ctx, "rewards");
    W->failed = 1;
    engine_abort(W->R.eng, NULL, 0);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", moerl_last_error());
    CHECK_OK(dist_send_msg(ctx, W->leader, TAG_REWARD_FAIL, msg, strlen(msg) + 1), "reporting a reward failure");
}

/* One generation step. Under rollout EP the group steps together: the ranks with work step, the
 * others run the step's exchanges without rows (engine_idle_step). Returns 1 when this rank
 * generated; *any: some rank of the group (this one without EP) had work. Errors end the job. */
static int rollout_step(rollout_rank *W, int *any) {
    dist_ctx *ctx = W->ctx;
    if (W->failed) {
        *any = 0;
        return 0;
    }
    const int mine = engine_num_unfinished(W->R.eng) > 0;
    if (W->ep) {
        /* [0] ranks with requests to decode, [1] ranks whose trajectories wait for tools only */
        float f[2] = {(float)mine, (float)(rollouter_unfinished(&W->R) > 0)};
        CHECK_OK(dist_comm_allreduce_f32(W->ep_comm, f, 2), "rollout EP step");
        *any = f[0] > 0 || f[1] > 0;
        if (f[0] > 0 && !mine) {
            CHECK_OK(engine_idle_step(W->R.eng), "rollout EP idle step");
            /* answered tool calls and scored groups go on meanwhile */
            if (rollouter_poll_tools(&W->R, 0) < 0 || rollouter_collect_rewards(&W->R, 0) < 0) {
                if (!W->R.reward_failed) die(ctx, "rewards");
                report_reward_failure(W);
                *any = 0;
            }
            return 0;
        }
        /* f[0] == 0: nobody decodes this step, so no rank runs the engine's exchanges; the ranks whose
         * trajectories wait for tools poll them (rollouter_step with an empty engine) */
    }
    const int did = rollouter_step(&W->R);
    if (did < 0 && W->R.reward_failed) { /* the reward backend or the tool environment */
        report_reward_failure(W);
        *any = 0;
        return 0;
    }
    if (did < 0) die(ctx, "generation");
    if (!W->ep) *any = did > 0;
    return did;
}

static int send_group(void *vctx, rl_group *g) {
    rollout_rank *W = vctx;
    void *buf;
    size_t len;
    int rc = rl_group_encode(g, &buf, &len);
    rl_group_free(g);
    if (rc != MOERL_OK) return MOERL_ERR;
    rc = dist_send_msg(W->ctx, W->leader, TAG_GROUP, buf, len);
    free(buf);
    if (rc == MOERL_OK) W->sent++;
    return rc;
}

/* Receive the answer to the outstanding request and start the granted prompts. */
static void take_grant(rollout_rank *W) {
    dist_ctx *ctx = W->ctx;
    void *buf;
    size_t len;
    CHECK_OK(dist_recv_msg_any(ctx, TAG_ADMIT_GRANT, NULL, &buf, &len), "receiving an admission grant");
    int32_t count = -1;
    if (len >= 8) memcpy(&count, buf, 4);
    if (len < 8 || count < 0 || len != 8 + (size_t)count * 8) {
        free(buf);
        moerl_errorf("admission grant of %zu bytes announcing %d uids", len, count);
        die(ctx, "protocol");
    }
    for (int i = 0; i < count; i++) {
        int64_t uid;
        memcpy(&uid, (char *)buf + 8 + 8 * i, 8);
        CHECK_OK(rollouter_start_uid(&W->R, uid), "starting a granted prompt");
    }
    free(buf);
    W->req_out = 0;
}

/* The answer to the outstanding request taken (a sync or the stop); under rollout TP with the whole replica. */
static void settle_grant(rollout_rank *W) {
    if (W->tp) tp_round(W, 1);
    else if (W->req_out) take_grant(W);
}

static void send_ack(rollout_rank *W, int kind) {
    engine_stats es = engine_get_stats(W->R.eng);
    if (W->tp && !W->tp_lead) { /* a rollout TP follower: the replica's first rank counts its groups and tokens */
        const engine_stats z = {0};
        es = z;
    }
    ack_msg a = {.kind = kind, .in_flight = W->tp && !W->tp_lead ? 0 : W->R.n_inflight, .groups_sent = W->sent,
                 .gen_tokens = es.generated_tokens, .busy_s = W->R.busy_s, .idle_s = W->R.idle_s,
                 .reward_s = reward_pool_busy_s(W->R.pool), .reward_backlog = reward_pool_backlog(W->R.pool),
                 .preemptions = es.preemptions, .kv_blocks_total = es.kv_blocks_total,
                 .kv_blocks_peak = es.kv_blocks_peak, .prefix_hit_tokens = es.prefix_hit_tokens,
                 .prefill_tokens = es.prefill_tokens};
    dist_ctx *ctx = W->ctx;
    CHECK_OK(dist_send_msg(ctx, W->leader, TAG_ACK, &a, sizeof a), "sending an acknowledgement");
}

/* Under rollout EP or TP: each bucket of the broadcast, as it arrives, sliced into the engine's buffer. */
typedef struct {
    const moe_model *full, *local;
    void *dst;
    size_t esz;
    int tp;
} slice_sink;

static int slice_bucket(void *arg, size_t off, const void *vals, size_t cnt) {
    const slice_sink *s = arg;
    if (s->tp) return tp_slice_range(s->full, s->local, off, vals, cnt, s->esz, s->dst);
    return ep_slice_range(s->full, s->local, off, vals, cnt, s->esz, s->dst);
}

/* Receive the weights broadcast for a (re)start or a sync and load them into the engine. */
static void receive_weights(rollout_rank *W, int version) {
    dist_ctx *ctx = W->ctx;
    int v = -1;
    /* straight into the engine's weights: a rollout rank holds one copy, no training model; bf16
     * (rollout.dtype bf16) travels as bf16 into the engine's buffer (engine_weight_buffer_bf16). Under
     * rollout EP each bucket is sliced into the engine's buffer as it arrives (dist_recv_weights_stream:
     * a ring of buckets, no whole-model copy). */
    const int bf16 = W->cfg->bf16_weights;
    void *buf = bf16 ? (void *)engine_weight_buffer_bf16(W->R.eng) : (void *)engine_weight_buffer(W->R.eng);
    if (W->ep || W->tp) {
        slice_sink s = {.full = W->m, .local = engine_model(W->R.eng), .dst = buf, .esz = bf16 ? 2 : 4, .tp = !!W->tp};
        CHECK_OK(dist_recv_weights_stream(ctx, bf16 ? DIST_WDTYPE_BF16 : DIST_WDTYPE_F32, W->m->n_params, &v,
                                          slice_bucket, &s, NULL),
                 W->tp ? "receiving the weights (tensor-parallel slice)" : "receiving the weights (expert slice)");
    } else {
        CHECK_OK(bf16 ? dist_bcast_weights_bf16(ctx, NULL, buf, W->m->n_params, &v, 2, NULL)
                      : dist_bcast_weights(ctx, buf, W->m->n_params, &v, 1, NULL),
                 "receiving the weights");
    }
    if (v != version) {
        moerl_errorf("weight broadcast carried policy version %d, the command announced %d", v, version);
        die(ctx, "protocol");
    }
    if (bf16) CHECK_OK(engine_set_version_bf16(W->R.eng, v), "loading the bf16 weights");
    else engine_set_version(W->R.eng, v);
}

static void rollout_sync(rollout_rank *W, const cmd_msg *c) {
    dist_ctx *ctx = W->ctx;
    W->R.stage = "param_sync";
    settle_grant(W); /* the leader answers pending requests once grants are blocked */
    if (c->partial) {
        engine_pause(W->R.eng, NULL, 0);
    } else { /* let in-flight responses finish under the old weights */
        W->R.draining = 1;
        for (int any = 1; any;) rollout_step(W, &any); /* under rollout EP until every rank is drained */
    }
    send_ack(W, CMD_SYNC);
    cmd_msg b = recv_cmd(ctx);
    if (b.cmd != CMD_BCAST || b.version != c->version) {
        moerl_errorf("expected BCAST of version %d after a SYNC, got command %d (version %d)", c->version, b.cmd,
                     b.version);
        die(ctx, "protocol");
    }
    receive_weights(W, b.version);
    if (!W->failed && rollouter_resume(&W->R) != MOERL_OK) {
        if (!W->R.reward_failed) die(ctx, "resuming after the sync");
        report_reward_failure(W);
    }
    CHECK_OK(injected_failure(W->R.cfg, ctx, b.version), "test");
}

/* The rollout rank's engine, EP state and W itself, and the queue the engine was made with. */
static void rollout_rank_free(rollout_rank *W, rl_queue *unused) {
    rollouter_free(&W->R);
    ep_state_free(W->ep);
    dist_comm_free(W->ep_comm);
    tp_rollout_free(W->tp);
    dist_comm_free(W->tp_comm);
    rl_queue_destroy(unused);
    free(W);
}

static void run_rollout_rank(dist_ctx *ctx, const rl_config *cfg, moe_model *m, const dataset *train) {
    set_role_threads(cfg->rollout_threads);
    rollout_rank *W = xcalloc(1, sizeof *W);
    W->ctx = ctx;
    W->cfg = cfg;
    W->m = m;
    W->leader = ctx->first_trainer;
    rl_queue unused;
    rl_queue_init(&unused, 1);
    staleness_budget b; /* this process's copy of the job's budget (the trainer leader's grants admit prompts) */
    CHECK_OK(rl_config_budget(cfg, &b), "configuration");
    CHECK_OK(rollouter_init(&W->R, cfg, &b, train, m, &unused, INT64_MAX), "creating the rollout engine");
    /* the engine has its own copy of the weights: drop the training model's buffers (parameters and
     * gradients); the layout (m->n_params, tensor table) stays for the size checks and, under
     * rollout EP, for taking this rank's slice of each broadcast */
    if (cfg->rollout_ep > 1) rollout_ep_setup(W);
    if (cfg->rollout_tp > 1) rollout_tp_setup(W);
    model_free_params(m);
    free(m->grads);
    m->grads = NULL;
    W->R.on_group_done = W->tp && !W->tp_lead ? drop_group : send_group;
    W->R.on_group_done_ctx = W;
    W->R.wait_rewards = 0; /* this rank scores its own groups beside generation, then sends them */
    cmd_msg c = recv_cmd(ctx);
    if (c.cmd == CMD_BYE) { /* rl_run_dist_cancel: RL does not start */
        rollout_rank_free(W, &unused);
        return;
    }
    if (c.cmd != CMD_START) {
        moerl_errorf("expected START, got command %d", c.cmd);
        die(ctx, "protocol");
    }
    receive_weights(W, c.version);
    long wait_us = 0;
    for (;;) {
        /* under rollout EP or TP: once the whole group has it (TP: the replica's grant shared in the same round) */
        if (W->tp ? tp_round(W, 0) : ep_all(W, dist_iprobe(ctx, TAG_CMD) > 0)) {
            c = recv_cmd(ctx);
            if (c.cmd == CMD_SYNC) {
                rollout_sync(W, &c);
                wait_us = 0;
                continue;
            }
            if (c.cmd != CMD_STOP) {
                moerl_errorf("unexpected command %d while generating", c.cmd);
                die(ctx, "protocol");
            }
            settle_grant(W);
            break;
        }
        if (!W->tp && W->req_out && dist_iprobe(ctx, TAG_ADMIT_GRANT) > 0) take_grant(W);
        if (!W->req_out && !W->failed && (!W->tp || W->tp_lead)) {
            const int32_t k = rollouter_room(&W->R);
            if (k > 0) {
                CHECK_OK(dist_send_msg(ctx, W->leader, TAG_ADMIT_REQ, &k, sizeof k), "requesting admissions");
                W->req_out = 1;
            }
        }
        int any;
        rollout_step(W, &any);
        if (any) {
            wait_us = 0;
        } else { /* nothing to generate: wait for grants or commands without spinning */
            const double t0 = moerl_now();
            sleep_us(wait_us ? wait_us : 20);
            rl_atomic_add(&W->R.idle_s, moerl_now() - t0);
            wait_us = MOERL_MIN(1000, wait_us * 2 + 20);
        }
    }
    /* stop: abandon the in-flight work (the leader lists it as unconsumed for a resume) */
    engine_abort(W->R.eng, NULL, 0);
    send_ack(W, CMD_STOP);
    c = recv_cmd(ctx);
    if (c.cmd != CMD_BYE) {
        moerl_errorf("expected BYE after STOP, got command %d", c.cmd);
        die(ctx, "protocol");
    }
    if (W->ep) {
        const ep_stats es = ep_get_stats(W->ep);
        log_info("rollout EP: %ld rows sent to the other ranks of the group, %.3f s in the exchanges", es.rows_sent,
                 es.seconds);
    }
    rollout_rank_free(W, &unused);
}

/* ================================================================== trainer ranks > 0 */

static void check_trainers_identical(dist_ctx *ctx, const moe_model *m, int is_leader);

static void recv_state(dist_ctx *ctx, trainer *T) {
    void *buf;
    size_t len;
    CHECK_OK(dist_recv_msg_any(ctx, TAG_STATE, NULL, &buf, &len), "receiving the trainer state");
    state_header h;
    if (len != sizeof h) {
        free(buf);
        moerl_errorf("trainer state header of %zu bytes, expected %zu", len, sizeof h);
        die(ctx, "protocol");
    }
    memcpy(&h, buf, sizeof h);
    free(buf);
    if (memcmp(h.magic, STATE_MAGIC, 8) || h.format != 1 || h.n_params != T->m->n_params ||
        h.has_ref != (T->ref != NULL) || h.chunk_floats == 0) {
        moerl_errorf("trainer state header: format %u, %llu parameters, ref %d (this rank: format 1, %zu "
                     "parameters, ref %d)",
                     h.format, (unsigned long long)h.n_params, h.has_ref, T->m->n_params, T->ref != NULL);
        die(ctx, "protocol");
    }
    recv_floats(ctx, T->m->params, T->m->n_params, h.chunk_floats);
    recv_floats(ctx, T->opt.m, T->m->n_params, h.chunk_floats);
    recv_floats(ctx, T->opt.v, T->m->n_params, h.chunk_floats);
    if (T->ref) recv_floats(ctx, T->ref->params, T->ref->n_params, h.chunk_floats);
    T->version = h.version;
    T->step = h.step;
    T->opt.step = h.opt_step;
    T->opt.skipped = h.opt_skipped;
    T->kl_ctrl.value = h.kl_ctrl_value;
    if (trainer_onebit_frozen(T)) { /* resumed past 1-bit Adam's freeze: this rank's error buffers */
        const size_t row = T->m->n_params + onebit_chunk(T->m->n_params, ctx->n_trainers);
        free(T->onebit_rows);
        T->onebit_rows = xmalloc(row * sizeof(float));
        T->onebit_n_rows = 1;
        recv_floats(ctx, T->onebit_rows, row, h.chunk_floats);
    }
}

static void send_state(dist_ctx *ctx, const trainer *T, int dst) {
    const size_t chunk = (size_t)16 << 20; /* 64 MiB of floats per message */
    state_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, STATE_MAGIC, 8);
    h.format = 1;
    h.version = T->version;
    h.step = T->step;
    h.opt_step = T->opt.step;
    h.opt_skipped = T->opt.skipped;
    h.kl_ctrl_value = T->kl_ctrl.value;
    h.n_params = T->m->n_params;
    h.chunk_floats = chunk;
    h.has_ref = T->ref != NULL;
    CHECK_OK(dist_send_msg(ctx, dst, TAG_STATE, &h, sizeof h), "sending the trainer state");
    send_floats(ctx, dst, T->m->params, T->m->n_params, chunk);
    send_floats(ctx, dst, T->opt.m, T->m->n_params, chunk);
    send_floats(ctx, dst, T->opt.v, T->m->n_params, chunk);
    if (T->ref) send_floats(ctx, dst, T->ref->params, T->ref->n_params, chunk);
    if (trainer_onebit_frozen(T)) { /* the checkpoint's error buffers of that trainer rank (load_onebit_rows) */
        const size_t row = T->m->n_params + onebit_chunk(T->m->n_params, ctx->n_trainers);
        MOERL_ASSERT(T->onebit_rows && T->onebit_n_rows == ctx->n_trainers);
        send_floats(ctx, dst, T->onebit_rows + (size_t)(dst - ctx->first_trainer) * row, row, chunk);
    }
}

/* The trainer rank's model-parallel runtime (src/parallel/parallel.h), as `moerl sft` builds it,
 * and what goes with it: the AdamW moments cut to this rank's part, the gradient reducer (none
 * under FSDP, whose reduce-scatter sums the gradients; over the stage's ranks with Ulysses SP, as
 * sft does) and which data-parallel shard of each step every trainer rank trains (the ranks of a
 * Ulysses group share one). Collective over the trainer ranks; the sizes were checked when the
 * config was read (rl_read_config, src/rl/config.c). shard_of (on trainer rank 0: [trainer_size]) gets the map. */
static void trainer_par_setup(dist_ctx *ctx, const rl_config *cfg, trainer *T, int *n_shards, int **shard_of) {
    moe_model *m = T->m;
    T->dist = ctx;
    T->par = xcalloc(1, sizeof *T->par);
    par_config pc = cfg->par;
    pc.max_tokens = cfg->ppo_max_token_len; /* EP / Ulysses buffers hold one micro-batch */
    CHECK_OK(par_state_init_cfg(T->par, ctx, &pc, m), "model parallelism");
    CHECK_OK(trainer_shard_ref(T), "model parallelism"); /* the KL reference sharded as the actor */
    par_adamw_shard(T->par, m, &T->opt);
    /* Ulysses' share, pipeline slots, Megatron SP's rows of the residual stream (the slice's exec.tp_sp) */
    if (par_acts_rows(T->par, cfg->ppo_max_token_len) != cfg->ppo_max_token_len || m->cfg.exec.tp_sp) {
        model_acts_free(&T->acts);
        CHECK_OK(model_acts_init_rows(&T->acts, m, par_acts_rows(T->par, cfg->ppo_max_token_len), cfg->ppo_max_token_len),
                 "the activation arena");
    }
    T->acts.par = par_active(T->par) ? T->par : NULL;
    int idx, cnt;
    par_data_shard(T->par, &idx, &cnt);
    const int D = ctx->trainer_size;
    T->replication = D / cnt;
    double *map = xcalloc((size_t)D, sizeof(double));
    map[ctx->trainer_rank] = idx;
    CHECK_OK(dist_allreduce_sum(ctx, DIST_TRAINERS, map, D), "the data-parallel shard map");
    if (shard_of) {
        *n_shards = cnt;
        *shard_of = xmalloc((size_t)D * sizeof(int));
        for (int d = 0; d < D; d++) (*shard_of)[d] = (int)map[d];
    }
    free(map);
    const par_grid *g = T->par->grid;
    if (!par_grads_self_reduced(T->par)) { /* FSDP, EP and the stage-owned pipeline sum their gradients themselves */
        T->reducer = g ? dist_reducer_new_on(ctx, g->stage_comm, m, cfg->grad_bucket_mb, DIST_OVERLAP_THREAD)
                       : dist_reducer_new(ctx, m, cfg->grad_bucket_mb, DIST_OVERLAP_THREAD);
        if (!T->reducer) die(ctx, "gradient reducer");
        dist_reducer_set_compression(T->reducer, cfg->grad_compression, cfg->grad_compression_warmup_steps,
                                     cfg->grad_compression_chunk);
    }
    if (ctx->trainer_rank == 0 && g)
        log_info("trainer ranks: %d = pp %d × dp %d × sp %d; FSDP shard groups of %d (%d replica%s), EP %d",
                 D, g->pp, g->dp, g->sp, g->fsdp, g->replicas, g->replicas == 1 ? "" : "s", g->ep);
    if (ctx->trainer_rank == 0 && T->ref_par)
        log_info("KL reference sharded as the actor: %.1f MB on trainer rank 0 (the whole model: %.1f MB)",
                 par_held_floats(T->ref_par, T->ref) * 4 / 1e6, par_whole_params(T->ref_par, T->ref) * 4 / 1e6);
}

/* The end of the trainer's work (collective): the reducer, the AdamW moments whole on trainer rank
 * 0 and the model whole on every trainer rank, so the last checkpoint and the consistency check see
 * plain buffers. */
static void trainer_par_free(trainer *T) {
    dist_ctx *ctx = T->dist;
    if (trainer_onebit_frozen(T)) { /* 1-bit Adam's error buffers on trainer rank 0, for the last checkpoint */
        float *rows;
        int n_rows;
        CHECK_OK(trainer_onebit_gather(T, &rows, &n_rows), "gathering the 1-bit Adam error buffers");
        trainer_onebit_free(T);
        T->onebit_rows = rows;
        T->onebit_n_rows = n_rows;
    } else {
        trainer_onebit_free(T);
    }
    dist_reducer_free(T->reducer);
    T->reducer = NULL;
    if (!T->par) return;
    if (par_active(T->par)) { /* the whole AdamW moments to trainer rank 0 (the final checkpoint's) */
        const int keep = ctx->trainer_rank == 0;
        adamw_state mo, whole = {0};
        const moe_model *w = par_gather_full(T->par, T->m, keep, &T->opt, &mo);
        if (keep) {
            if (!w) die(ctx, "gathering the optimizer state");
            whole = mo;
            whole.m = xalloc_aligned(mo.n * sizeof(float));
            whole.v = xalloc_aligned(mo.n * sizeof(float));
            memcpy(whole.m, mo.m, mo.n * sizeof(float));
            memcpy(whole.v, mo.v, mo.n * sizeof(float));
        }
        par_release_full(T->par, T->m, w, &T->opt, &mo);
        if (keep) {
            adamw_free(&T->opt);
            T->opt = whole;
        }
    }
    const int max_tokens = T->cfg->ppo_max_token_len;
    const int resized = par_acts_rows(T->par, max_tokens) != max_tokens || T->m->cfg.exec.tp_sp;
    trainer_unshard_ref(T); /* the reference's strategies first: they borrow T->par's grid */
    par_state_free(T->par); /* the whole model back in m on every trainer rank */
    free(T->par);
    T->par = NULL;
    if (resized) { /* whole micro-batches on one rank again */
        model_acts_free(&T->acts);
        CHECK_OK(model_acts_init(&T->acts, T->m, max_tokens), "the activation arena");
    }
    T->acts.par = NULL;
}

static void run_trainer_follower(dist_ctx *ctx, const rl_config *cfg, moe_model *m, const dataset *train) {
    set_role_threads(cfg->trainer_threads);
    trainer *T = xcalloc(1, sizeof *T);
    CHECK_OK(trainer_init(T, cfg, train, m), "trainer setup");
    const cmd_msg c0 = recv_cmd(ctx); /* START, then the state; BYE from rl_run_dist_cancel */
    if (c0.cmd == CMD_BYE) {
        trainer_free(T);
        free(T);
        return;
    }
    if (c0.cmd != CMD_START) {
        moerl_errorf("expected START or BYE before the trainer state, got command %d", c0.cmd);
        die(ctx, "protocol");
    }
    recv_state(ctx, T);
    trainer_par_setup(ctx, cfg, T, NULL, NULL);
    for (;;) {
        void *buf;
        size_t len;
        int src;
        CHECK_OK(dist_recv_msg_any(ctx, TAG_TRAIN, &src, &buf, &len), "receiving a train message");
        rl_train_msg msg;
        int rc = rl_train_msg_decode(buf, len, &msg);
        free(buf);
        if (rc != MOERL_OK) die(ctx, "train message from trainer rank 0");
        if (msg.cmd == RL_TRAIN_CMD_STOP) {
            rl_train_msg_free(&msg);
            break;
        }
        if (msg.cmd == RL_TRAIN_CMD_GATHER) { /* trainer rank 0 assembles the whole model (dist_whole) */
            if (msg.version && trainer_onebit_frozen(T)) { /* and 1-bit Adam's error buffers */
                float *rows;
                int n_rows;
                CHECK_OK(trainer_onebit_gather(T, &rows, &n_rows), "gathering the 1-bit Adam error buffers");
                free(rows);
                if (!par_active(T->par)) {
                    rl_train_msg_free(&msg);
                    continue;
                }
            }
            adamw_state mo;
            (void)par_gather_full(T->par, T->m, 0, &T->opt, msg.version ? &mo : NULL); /* NULL here by design */
            par_release_full(T->par, T->m, NULL, &T->opt, msg.version ? &mo : NULL);
            rl_train_msg_free(&msg);
            continue;
        }
        T->version = msg.version;
        if (T->step != msg.step) {
            moerl_errorf("train message for step %lld, this rank is at step %lld", (long long)msg.step,
                         (long long)T->step);
            die(ctx, "protocol");
        }
        train_stats st;
        memset(&st, 0, sizeof st);
        for (int i = 0; T->cfg->rollout_routing_replay && i < msg.n_groups; i++) /* routing records off the wire */
            CHECK_OK(rl_group_check_routes(msg.groups[i], &T->m->cfg, NULL), "train message");
        CHECK_OK(trainer_update(T, msg.groups, msg.mbs, msg.n_mb, &st), "trainer step");
        rl_train_msg_free(&msg);
        CHECK_OK(injected_failure(T->cfg, ctx, T->version), "test");
    }
    trainer_par_free(T);
    check_trainers_identical(ctx, m, 0);
    cmd_msg c = recv_cmd(ctx);
    if (c.cmd != CMD_BYE) {
        moerl_errorf("expected BYE after the last step, got command %d", c.cmd);
        die(ctx, "protocol");
    }
    trainer_free(T);
    free(T);
}

/* ================================================================== trainer rank 0 */

typedef struct {
    int syncs;
    double sync_s, bcast_s;
    int64_t bcast_bytes;
} sync_totals;

typedef struct {
    job J;                  /* first: the shared loop's job_ops get &J and cast back */
    dist_ctx *ctx;
    int P, n_rollout, n_trainers;
    int n_rows;
    /* admission server: everything below under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    staleness_budget budget;
    prompt_feed feed;
    int64_t prompts_left;
    int blocked;            /* a sync or the stop is pending: requests are answered with 0 */
    int stopping;
    int server_done;
    int failed_rank;        /* a rollout rank whose reward backend failed (−1: none) */
    char fail_msg[2048];
    int *pending;           /* [P] admissions a rank asked for and did not get yet (0: none) */
    int64_t *out_uid;       /* outstanding: granted, not yet received */
    int *out_rank;
    int n_out, cap_out;
    int64_t *received;      /* [P] groups received from each rank */
    int *ack_got;           /* [P] this round's acknowledgement arrived */
    ack_msg *ack;           /* [P] latest acknowledgement */
    int acks;               /* acknowledgements in this round */
    double win_busy, win_idle; /* rollout busy/idle seconds reported since the last window */
    double win_reward;      /* reward pool seconds reported since the last window (all rollout ranks) */
    int rr;                 /* round-robin start for serving requests */
    sync_totals tot;
    pthread_t server;
} leader;

/* Grant what the budget allows to pending requests (called with mu held). */
static void serve_pending(leader *L) {
    dist_ctx *ctx = L->ctx;
    for (int i = 0; i < L->n_rollout; i++) {
        const int r = (L->rr + i) % L->n_rollout;
        if (L->pending[r] <= 0) continue;
        if (!L->blocked && !(L->prompts_left > 0 && staleness_can_start(&L->budget, rl_queue_size(&L->J.queue))))
            break; /* nothing to grant to anyone now; the request stays pending */
        const int k = L->pending[r];
        int64_t *buf = xmalloc((size_t)(k + 1) * sizeof(int64_t));
        int32_t count = 0;
        while (!L->blocked && count < k && L->prompts_left > 0 &&
               staleness_can_start(&L->budget, rl_queue_size(&L->J.queue))) {
            const int64_t uid = prompt_feed_next(&L->feed);
            staleness_on_start(&L->budget);
            L->prompts_left--;
            if (L->n_out == L->cap_out) {
                L->cap_out = L->cap_out ? 2 * L->cap_out : 64;
                L->out_uid = xrealloc(L->out_uid, (size_t)L->cap_out * sizeof(int64_t));
                L->out_rank = xrealloc(L->out_rank, (size_t)L->cap_out * sizeof(int));
            }
            L->out_uid[L->n_out] = uid;
            L->out_rank[L->n_out] = r;
            L->n_out++;
            buf[1 + count++] = uid;
        }
        if (count > 0 || L->blocked) {
            memcpy(buf, &count, 4);
            memset((char *)buf + 4, 0, 4);
            CHECK_OK(dist_send_msg(ctx, r, TAG_ADMIT_GRANT, buf, 8 + (size_t)count * 8), "sending a grant");
            L->pending[r] = 0;
            if (count > 0) L->rr = (r + 1) % L->n_rollout;
        }
        free(buf);
    }
}

static void server_group(leader *L, int src, void *buf, size_t len) {
    dist_ctx *ctx = L->ctx;
    rl_group *g;
    if (rl_group_decode(buf, len, &g) != MOERL_OK) {
        moerl_error_prefix("from rollout rank %d: ", src);
        die(ctx, "server");
    }
    if (g->n != L->J.cfg->n || g->uid % L->n_rows != g->row || g->uid / L->n_rows != g->epoch) {
        moerl_errorf("group from rank %d: uid %lld, row %d, epoch %d, %d responses (dataset of %d rows, rollout.n %d)",
                     src, (long long)g->uid, g->row, g->epoch, g->n, L->n_rows, L->J.cfg->n);
        die(ctx, "server");
    }
    pthread_mutex_lock(&L->mu);
    int found = -1;
    for (int i = 0; i < L->n_out; i++)
        if (L->out_uid[i] == g->uid && L->out_rank[i] == src) {
            found = i;
            break;
        }
    if (found < 0) {
        moerl_errorf("rank %d sent uid %lld, which was not granted to it (or arrived twice)", src, (long long)g->uid);
        die(ctx, "server");
    }
    L->out_uid[found] = L->out_uid[L->n_out - 1];
    L->out_rank[found] = L->out_rank[L->n_out - 1];
    L->n_out--;
    L->received[src]++;
    if (rl_queue_put(&L->J.queue, g) != MOERL_OK) die(ctx, "server");
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

static void server_request(leader *L, int src, void *buf, size_t len) {
    dist_ctx *ctx = L->ctx;
    int32_t k = 0;
    if (len != 4 || (memcpy(&k, buf, 4), k <= 0) || src >= L->n_rollout) {
        moerl_errorf("admission request of %zu bytes (k = %d) from rank %d", len, k, src);
        die(ctx, "server");
    }
    pthread_mutex_lock(&L->mu);
    if (L->pending[src] > 0) {
        moerl_errorf("rank %d sent a second admission request before the first was answered", src);
        die(ctx, "server");
    }
    L->pending[src] = k;
    pthread_mutex_unlock(&L->mu);
}

static void server_ack(leader *L, int src, void *buf, size_t len) {
    dist_ctx *ctx = L->ctx;
    if (len != sizeof(ack_msg) || src >= L->n_rollout) {
        moerl_errorf("acknowledgement of %zu bytes from rank %d", len, src);
        die(ctx, "server");
    }
    ack_msg a;
    memcpy(&a, buf, sizeof a);
    pthread_mutex_lock(&L->mu);
    if (L->ack_got[src]) {
        moerl_errorf("rank %d acknowledged twice", src);
        die(ctx, "server");
    }
    L->win_busy += a.busy_s - L->ack[src].busy_s;
    L->win_idle += a.idle_s - L->ack[src].idle_s;
    L->win_reward += a.reward_s - L->ack[src].reward_s;
    L->ack[src] = a;
    L->ack_got[src] = 1;
    L->acks++;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

/* A rollout rank's reward backend failed: the trainer loop stops at its next wait for groups
 * (dist_get_groups), with that message, and writes a checkpoint first. */
static void server_reward_fail(leader *L, int src, void *buf, size_t len) {
    pthread_mutex_lock(&L->mu);
    if (L->failed_rank < 0) {
        L->failed_rank = src;
        snprintf(L->fail_msg, sizeof L->fail_msg, "%.*s", (int)(len > 0 ? len - 1 : 0), (const char *)buf);
        L->J.reward_failed = 1;
    }
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

/* All acknowledgements of this round in, and every group they announce received (mu held). */
static int round_complete(const leader *L) {
    if (L->acks < L->n_rollout) return 0;
    for (int r = 0; r < L->n_rollout; r++)
        if (L->received[r] < L->ack[r].groups_sent) return 0;
    return 1;
}

static void *server_main(void *arg) {
    leader *L = arg;
    dist_ctx *ctx = L->ctx;
    static const int tags[4] = {TAG_GROUP, TAG_ADMIT_REQ, TAG_ACK, TAG_REWARD_FAIL};
    long wait_us = 0;
    for (;;) {
        int did = 0;
        for (int t = 0; t < 4; t++) {
            if (dist_iprobe(ctx, tags[t]) <= 0) continue;
            void *buf;
            size_t len;
            int src;
            CHECK_OK(dist_recv_msg_any(ctx, tags[t], &src, &buf, &len), "server receive");
            if (tags[t] == TAG_GROUP) server_group(L, src, buf, len);
            else if (tags[t] == TAG_ADMIT_REQ) server_request(L, src, buf, len);
            else if (tags[t] == TAG_ACK) server_ack(L, src, buf, len);
            else server_reward_fail(L, src, buf, len);
            free(buf);
            did = 1;
        }
        pthread_mutex_lock(&L->mu);
        serve_pending(L);
        const int done = L->stopping && round_complete(L);
        if (done) {
            L->server_done = 1;
            pthread_cond_broadcast(&L->cv);
        }
        pthread_mutex_unlock(&L->mu);
        if (done) break;
        if (did) {
            wait_us = 0;
        } else {
            sleep_us(wait_us ? wait_us : 10);
            wait_us = MOERL_MIN(200, wait_us * 2 + 10);
        }
    }
    return NULL;
}

/* Block grants and start an acknowledgement round (SYNC or STOP sent afterwards). */
static void begin_round(leader *L, int stopping) {
    pthread_mutex_lock(&L->mu);
    L->blocked = 1;
    L->stopping = stopping;
    L->acks = 0;
    memset(L->ack_got, 0, (size_t)L->P * sizeof(int));
    pthread_mutex_unlock(&L->mu);
}

static int64_t *outstanding_copy(leader *L, int *n) {
    int64_t *u = xmalloc((size_t)(L->n_out + 1) * sizeof(int64_t));
    memcpy(u, L->out_uid, (size_t)L->n_out * sizeof(int64_t));
    *n = L->n_out;
    return u;
}

/* ---- the transport of the shared step loop (job_ops) on trainer rank 0; J is L's first member */

static void dist_describe(job *J, char *buf, size_t len) {
    leader *L = (leader *)J;
    pthread_mutex_lock(&L->mu);
    snprintf(buf, len, "%d granted prompts outstanding, %d of %d rollout acknowledgements", L->n_out, L->acks,
             L->n_rollout);
    pthread_mutex_unlock(&L->mu);
}

static void leader_abort(job *J, const char *msg) {
    leader *L = (leader *)J;
    moerl_errorf("%s", msg);
    die(L->ctx, "");
}

static int dist_get_groups(job *J, rl_group **out, int n, double timeout_s, double *waited) {
    leader *L = (leader *)J;
    pthread_mutex_lock(&L->mu);
    const int failed = L->failed_rank;
    pthread_mutex_unlock(&L->mu);
    if (failed >= 0) { /* set once, never changed: the message is stable */
        *waited = 0;
        return moerl_errorf("rollout rank %d: %s", failed, L->fail_msg);
    }
    const int got = rl_queue_get_n(&J->queue, (void **)out, n, timeout_s, waited);
    if (got == n) return n;
    if (got < 0) return 0; /* timeout */
    return moerl_errorf("the sample queue closed with %d of %d groups", rl_queue_size(&J->queue), n);
}

static int dist_send_part(job *J, int d, const rl_minibatch *mbs, int n_mb, rl_group **part, int n_part) {
    leader *L = (leader *)J;
    dist_ctx *ctx = L->ctx;
    void *buf;
    size_t len;
    if (rl_train_msg_encode(RL_TRAIN_CMD_STEP, J->T.version, J->T.step, mbs, n_mb, part, &buf, &len) != MOERL_OK)
        return MOERL_ERR;
    const int rc = dist_send_msg(ctx, ctx->first_trainer + d, TAG_TRAIN, buf, len);
    free(buf);
    return rc;
}

static void dist_add_prompts(job *J, int64_t k) {
    leader *L = (leader *)J;
    pthread_mutex_lock(&L->mu);
    L->prompts_left += k;
    staleness_on_drop(&L->budget, k, L->n_out + rl_queue_size(&J->queue)); /* n_out: granted, in flight */
    pthread_mutex_unlock(&L->mu);
}

static int64_t *dist_inflight_uids(job *J, int *n) {
    leader *L = (leader *)J;
    pthread_mutex_lock(&L->mu);
    int64_t *u = outstanding_copy(L, n);
    pthread_mutex_unlock(&L->mu);
    return u;
}

/* The window's reward figures for job_emit_version from the acknowledgements (mu held or the server
 * stopped): pool seconds over all rollout ranks, requests waiting on them; and the paged KV cache's
 * counters since the start (rollout/preemptions, ...), summed over the rollout ranks as their
 * generated tokens are (each rank's engine has a pool of its own: blocks and peaks add up). */
static void reward_window(leader *L) {
    job *J = &L->J;
    J->win_reward_s = L->win_reward;
    L->win_reward = 0;
    int64_t backlog = 0;
    engine_stats kv = {0};
    for (int r = 0; r < L->n_rollout; r++) {
        const ack_msg *a = &L->ack[r];
        backlog += a->reward_backlog;
        kv.preemptions += a->preemptions;
        kv.kv_blocks_total += a->kv_blocks_total;
        kv.kv_blocks_peak += a->kv_blocks_peak;
        kv.prefix_hit_tokens += a->prefix_hit_tokens;
        kv.prefill_tokens += a->prefill_tokens;
    }
    J->reward_backlog = (int)backlog;
    J->rollout_kv = kv;
    J->has_rollout_kv = 1;
}

/* The parameter sync of trainer rank 0 (order in the file header). */
static int dist_sync(job *J, int version, double *rb, double *ri) {
    leader *L = (leader *)J;
    dist_ctx *ctx = L->ctx;
    const rl_config *cfg = J->cfg;
    const double t0 = moerl_now();
    begin_round(L, 0);
    for (int r = 0; r < L->n_rollout; r++) send_cmd(ctx, r, CMD_SYNC, version, cfg->partial_rollout);
    pthread_mutex_lock(&L->mu);
    while (!round_complete(L)) pthread_cond_wait(&L->cv, &L->mu);
    int64_t in_flight = 0;
    for (int r = 0; r < L->n_rollout; r++) in_flight += L->ack[r].in_flight;
    if (in_flight != L->n_out) {
        moerl_errorf("sync to version %d: rollout ranks report %lld groups in flight, %d granted prompts are "
                     "outstanding",
                     version, (long long)in_flight, L->n_out);
        die(ctx, "protocol");
    }
    /* carried-over work: in-flight groups (interrupted ones included) + queued groups */
    staleness_on_version(&L->budget, in_flight, 0, rl_queue_size(&J->queue));
    *rb = L->win_busy;
    *ri = L->win_idle;
    L->win_busy = L->win_idle = 0;
    reward_window(L);
    int n_inflight = 0;
    const int want_ckpt = job_want_checkpoint(J, version);
    int64_t *inflight = want_ckpt ? outstanding_copy(L, &n_inflight) : NULL;
    pthread_mutex_unlock(&L->mu);
    /* the whole model here for the checkpoint and the broadcast (gathered once when it is split) */
    CHECK_OK(job_whole_begin(J, want_ckpt), "gathering the model for the weight sync");
    if (want_ckpt) { /* consistent: rollout ranks are paused, nothing arrives, grants are blocked */
        const int c = job_save_checkpoint(J, inflight, n_inflight);
        free(inflight);
        if (c != MOERL_OK) {
            job_whole_end(J);
            return MOERL_ERR;
        }
    }
    for (int r = 0; r < L->n_rollout; r++) send_cmd(ctx, r, CMD_BCAST, version, cfg->partial_rollout);
    dist_xfer_stats xs;
    int v = version;
    const size_t bucket = (size_t)MOERL_MAX(4.0, cfg->sync_bucket_mb * 1048576.0);
    CHECK_OK(cfg->bf16_weights
                 ? dist_bcast_weights_bf16(ctx, J->whole_m->params, NULL, J->whole_m->n_params, &v, bucket, &xs)
                 : dist_bcast_weights(ctx, J->whole_m->params, J->whole_m->n_params, &v, bucket, &xs),
             "weight broadcast");
    job_whole_end(J);
    pthread_mutex_lock(&L->mu);
    L->blocked = 0;
    pthread_mutex_unlock(&L->mu);
    J->win_bcast_s += xs.seconds;
    J->bcast_bytes = (int64_t)xs.bytes;
    L->tot.syncs++;
    L->tot.sync_s += moerl_now() - t0;
    L->tot.bcast_s += xs.seconds;
    L->tot.bcast_bytes = (int64_t)xs.bytes;
    CHECK_OK(injected_failure(cfg, ctx, version), "test");
    return MOERL_OK;
}

static uint64_t hash_params(const moe_model *m);

/* Stop: rollout ranks abandon their work and acknowledge; trainer ranks leave their loop; the
 * replicas are checked identical. */
static int dist_stop(job *J, double *rb, double *ri) {
    leader *L = (leader *)J;
    dist_ctx *ctx = L->ctx;
    begin_round(L, 1);
    for (int r = 0; r < L->n_rollout; r++) send_cmd(ctx, r, CMD_STOP, J->T.version, 0);
    for (int d = 1; d < L->n_trainers; d++) {
        void *buf;
        size_t len;
        CHECK_OK(rl_train_msg_encode(RL_TRAIN_CMD_STOP, J->T.version, J->T.step, NULL, 0, NULL, &buf, &len), "stop");
        CHECK_OK(dist_send_msg(ctx, ctx->first_trainer + d, TAG_TRAIN, buf, len), "sending stop");
        free(buf);
    }
    pthread_join(L->server, NULL); /* returns once every STOP acknowledgement and group is in */
    trainer_par_free(&J->T);
    check_trainers_identical(ctx, J->m, 1);
    *rb = L->win_busy;
    *ri = L->win_idle;
    reward_window(L);
    return MOERL_OK;
}

/* The whole model on trainer rank 0 when the trainer ranks split it: the others are told to take part. */
static int dist_whole(job *J, int moments) {
    leader *L = (leader *)J;
    dist_ctx *ctx = L->ctx;
    if (moments && trainer_onebit_frozen(&J->T) && J->T.onebit) { /* 1-bit Adam's error buffers, every rank's */
        for (int d = 1; !par_active(J->T.par) && d < L->n_trainers; d++) {
            void *buf;
            size_t len;
            if (rl_train_msg_encode(RL_TRAIN_CMD_GATHER, 1, J->T.step, NULL, 0, NULL, &buf, &len) != MOERL_OK)
                return MOERL_ERR;
            const int rc = dist_send_msg(ctx, ctx->first_trainer + d, TAG_TRAIN, buf, len);
            free(buf);
            if (rc != MOERL_OK) return MOERL_ERR;
        }
        if (par_active(J->T.par)) return moerl_errorf("1-bit Adam with a model-parallel layout (refused by the config)");
        if (trainer_onebit_gather(&J->T, &J->onebit_rows, &J->onebit_n_rows) != MOERL_OK) return MOERL_ERR;
    }
    if (!par_active(J->T.par)) { /* replicated (or after the end: trainer_par_free made it whole) */
        J->whole_m = J->m;
        J->whole_opt = J->T.opt;
        return MOERL_OK;
    }
    for (int d = 1; d < L->n_trainers; d++) {
        void *buf;
        size_t len;
        if (rl_train_msg_encode(RL_TRAIN_CMD_GATHER, moments, J->T.step, NULL, 0, NULL, &buf, &len) != MOERL_OK)
            return MOERL_ERR;
        const int rc = dist_send_msg(ctx, ctx->first_trainer + d, TAG_TRAIN, buf, len);
        free(buf);
        if (rc != MOERL_OK) return MOERL_ERR;
    }
    J->whole_m = par_gather_full(J->T.par, J->m, 1, &J->T.opt, moments ? &J->whole_opt : NULL);
    if (!moments) J->whole_opt = J->T.opt; /* not used: the checkpoint asks for the moments */
    return J->whole_m ? MOERL_OK : MOERL_ERR;
}

static void dist_whole_done(job *J) {
    if (!par_active(J->T.par)) return;
    par_release_full(J->T.par, J->m, J->whole_m, &J->T.opt, J->whole_moments ? &J->whole_opt : NULL);
}

static const job_ops DIST_OPS = {dist_get_groups, dist_send_part, dist_sync, dist_add_prompts, dist_inflight_uids,
                                 dist_stop, dist_describe, leader_abort, NULL, NULL, dist_whole, dist_whole_done, NULL};

/* FNV-1a hash of the weights: equal on every trainer rank iff they stayed identical. */
static uint64_t hash_params(const moe_model *m) {
    const unsigned char *b = (const unsigned char *)m->params;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < m->n_params * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* Collective over the trainer ranks: the same weights everywhere (dies naming the first that
 * differs otherwise). */
static void check_trainers_identical(dist_ctx *ctx, const moe_model *m, int is_leader) {
    const int D = ctx->trainer_size;
    double *t = xcalloc((size_t)2 * D, sizeof(double));
    const uint64_t h = hash_params(m);
    t[2 * ctx->trainer_rank] = (double)(h >> 32);
    t[2 * ctx->trainer_rank + 1] = (double)(h & 0xffffffffu);
    CHECK_OK(dist_allreduce_sum(ctx, DIST_TRAINERS, t, 2 * D), "weight check");
    for (int d = 1; d < D; d++)
        if (t[2 * d] != t[0] || t[2 * d + 1] != t[1]) {
            moerl_errorf("the weights of trainer rank %d differ from trainer rank 0's after training (data-parallel "
                         "replicas diverged)",
                         d);
            die(ctx, "consistency check");
        }
    if (is_leader)
        log_info("weights identical on all %d trainer rank%s (hash %016llx)", D, moerl_plural(D),
                 (unsigned long long)h);
    free(t);
}

static void run_leader(dist_ctx *ctx, const rl_config *cfg, moe_model *m, const dataset *train, const dataset *test,
                       rl_result *res) {
    set_role_threads(cfg->trainer_threads);
    leader *L = xcalloc(1, sizeof *L);
    job *J = &L->J;
    L->ctx = ctx;
    L->P = ctx->world_size;
    L->n_rollout = ctx->n_rollout;
    L->n_trainers = ctx->n_trainers;
    L->n_rows = (int)dataset_count(train);
    J->cfg = cfg;
    J->train = train;
    J->test = test;
    J->m = m;
    J->is_dist = 1;
    J->n_trainers = ctx->n_trainers;
    J->ops = &DIST_OPS;
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv, NULL);
    CHECK_OK(job_plan(J, &L->budget), "configuration");
    rl_queue_init(&J->queue, L->budget.max_required_samples);
    prompt_feed_init(&L->feed, dataset_count(train), cfg->seed);
    J->feed = &L->feed;
    L->pending = xcalloc((size_t)L->P, sizeof(int));
    L->received = xcalloc((size_t)L->P, sizeof(int64_t));
    L->ack_got = xcalloc((size_t)L->P, sizeof(int));
    L->ack = xcalloc((size_t)L->P, sizeof(ack_msg));
    L->failed_rank = -1;
    CHECK_OK(trainer_init(&J->T, cfg, train, m), "trainer setup");
    if (cfg->resume_auto) CHECK_OK(job_load_checkpoint(J, &J->resumed), "resume");
    L->prompts_left = MOERL_MAX(0, (J->total_steps - J->T.step) * (int64_t)L->budget.required_samples); /* as job.c */
    /* the starting state to the other trainer ranks, the weights to the rollout ranks */
    for (int d = 1; d < L->n_trainers; d++) {
        send_cmd(ctx, ctx->first_trainer + d, CMD_START, J->T.version, 0);
        send_state(ctx, &J->T, ctx->first_trainer + d);
    }
    for (int r = 0; r < L->n_rollout; r++) send_cmd(ctx, r, CMD_START, J->T.version, cfg->partial_rollout);
    dist_xfer_stats xs;
    int v = J->T.version;
    const size_t bucket = (size_t)MOERL_MAX(4.0, cfg->sync_bucket_mb * 1048576.0);
    CHECK_OK(cfg->bf16_weights ? dist_bcast_weights_bf16(ctx, m->params, NULL, m->n_params, &v, bucket, &xs)
                               : dist_bcast_weights(ctx, m->params, m->n_params, &v, bucket, &xs),
             "initial weight broadcast");
    trainer_par_setup(ctx, cfg, &J->T, &J->n_shards, &J->shard_of);
    CHECK_OK(job_open_outputs(J, J->resumed), "outputs");
    log_info("fully-async GRPO on %d processes: %d rollout rank%s + %d trainer rank%s; %lld step%s × "
             "%d prompts × %d responses; staleness_threshold %g → queue %d, lag bound %d (for in-order completion); "
             "trigger_parameter_sync_step %d; partial_rollout %s; weights %.1f MB (%s), broadcast in %.1f MiB buckets "
             "(%.3f s at start); gradient buckets %.1f MiB",
             L->P, L->n_rollout, moerl_plural(L->n_rollout), L->n_trainers, moerl_plural(L->n_trainers),
             (long long)J->total_steps, moerl_plural(J->total_steps), L->budget.required_samples, cfg->n,
             cfg->staleness_threshold, L->budget.max_required_samples, L->budget.lag_bound,
             cfg->trigger_parameter_sync_step, cfg->partial_rollout ? "on" : "off",
             m->n_params * (cfg->bf16_weights ? 2 : 4) / 1e6, cfg->bf16_weights ? "bf16" : "fp32", cfg->sync_bucket_mb, xs.seconds, cfg->grad_bucket_mb);
    CHECK_OK(injected_failure(cfg, ctx, -1), "test");
    /* the start validation and the peak measurement before the first grant (the server grants the
     * rollout ranks their prompts): step 1 then shows the trainer's wait for its first batch */
    CHECK_OK(job_schedule_prepare(J, res), "start of the run");
    if (pthread_create(&L->server, NULL, server_main, L) != 0) {
        moerl_errorf("cannot start the server thread");
        die(ctx, "");
    }
    CHECK_OK(job_schedule_run(J, res), "");
    int64_t gen = 0;
    for (int r = 0; r < L->n_rollout; r++) gen += L->ack[r].gen_tokens;
    res->tokens_generated = gen;
    res->tokens_per_s = res->wall_s > 0 ? gen / res->wall_s : 0;
    res->stop_signal = J->stop_signal;
    res->rollout_ranks = L->n_rollout;
    res->trainer_ranks = L->n_trainers;
    res->syncs = L->tot.syncs;
    res->param_sync_s = L->tot.syncs ? L->tot.sync_s / L->tot.syncs : 0;
    res->weight_bcast_s = L->tot.syncs ? L->tot.bcast_s / L->tot.syncs : 0;
    res->weight_bcast_bytes = L->tot.bcast_bytes;
    res->weight_bcast_gbps =
        L->tot.bcast_s > 0 ? (double)L->tot.bcast_bytes * L->tot.syncs / L->tot.bcast_s / 1e9 : 0;
    res->grad_reduce_exposed_s = J->reduce_exposed_total;
    job_close_outputs(J);
    for (int r = 0; r < L->P; r++)
        if (r != ctx->world_rank) send_cmd(ctx, r, CMD_BYE, J->T.version, 0);
    trainer_free(&J->T);
    free(J->shard_of);
    void *g;
    while (rl_queue_try_get_n(&J->queue, &g, 1) == 1) rl_group_free(g);
    rl_queue_destroy(&J->queue);
    prompt_feed_free(&L->feed);
    free(L->pending);
    free(L->received);
    free(L->ack_got);
    free(L->ack);
    free(L->out_uid);
    free(L->out_rank);
    reward_pool_free(L->J.val_pool);
    for (int k = 0; k < L->J.n_rx; k++) free(L->J.rx_keys[k]);
    free(L->J.rx_keys);
    free(L->J.rx_sum);
    free(L->J.rx_cnt);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
    free(L);
}

int rl_run_dist(const rl_config *cfg, dist_ctx *ctx, moe_model *m, const dataset *train, const dataset *test,
                rl_result *res) {
    memset(res, 0, sizeof *res);
    if (ctx->role == DIST_ROLE_UNSET || ctx->world_size < 2 || ctx->n_rollout < 1)
        return moerl_errorf("rl_run_dist: needs a world of ≥ 2 ranks split into rollout and trainer ranks (world %d, "
                            "%d rollout)",
                            ctx->world_size, ctx->n_rollout);
    if (cfg->mode == RL_MODE_LOCKSTEP)
        return moerl_errorf("async_training.mode=lockstep runs in one process only (use async or sync with mpirun)");
    { /* the plan's checks (job_plan), identically on every rank before any communication */
        job plan = {.cfg = cfg, .train = train};
        staleness_budget b;
        if (job_plan(&plan, &b) != MOERL_OK) return MOERL_ERR;
    }
    if (ctx->role == DIST_ROLE_ROLLOUT) {
        snprintf(g_role, sizeof g_role, "rollout rank %d of %d", ctx->world_rank, ctx->n_rollout);
    } else {
        snprintf(g_role, sizeof g_role, "trainer rank %d of %d", ctx->trainer_rank, ctx->trainer_size);
    }
    if (injected_failure(cfg, ctx, -1) != MOERL_OK && ctx->trainer_rank != 0) die(ctx, "test");
    m->cfg.exec.batch_invariant = cfg->batch_invariant; /* rollout.batch_invariant: engine and trainer models alike */
    if (ctx->role == DIST_ROLE_ROLLOUT) run_rollout_rank(ctx, cfg, m, train);
    else if (ctx->trainer_rank > 0) run_trainer_follower(ctx, cfg, m, train);
    else run_leader(ctx, cfg, m, train, test, res);
    return MOERL_OK;
}

int rl_run_dist_cancel(dist_ctx *ctx) {
    if (ctx->role == DIST_ROLE_UNSET || ctx->trainer_rank != 0)
        return moerl_errorf("rl_run_dist_cancel: trainer rank 0 only (this is world rank %d)", ctx->world_rank);
    for (int r = 0; r < ctx->world_size; r++)
        if (r != ctx->world_rank) {
            cmd_msg c = {CMD_BYE, 0, 0, 0};
            if (dist_send_msg(ctx, r, TAG_CMD, &c, sizeof c) != MOERL_OK) return MOERL_ERR;
        }
    return MOERL_OK;
}
