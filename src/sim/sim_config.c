/* moerl simulate's configuration (see sim_config.h). */
#include "sim/sim_config.h"

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "data/data_config.h"
#include "data/tokenizer.h"
#include "model/model_config.h"
#include "parallel/grid.h"
#include "dist/compress.h"
#include "optim/onebit_adam.h"
#include "plan/plan.h"
#include "plan/plan_config.h"

void sim_def_keys(cfg *c) {
    rl_def_keys(c);
    cfg_def_str(c, "sim.device", "cpu", "cost keys of a named device: h200 | a100 | ascend910b | cpu (or --calibrate)");
    cfg_def_int(c, "sim.rollout_devices", 1, "rollout devices (replicas = this / rollout.tensor_model_parallel_size)");
    if (!cfg_has(c, "rollout.tensor_model_parallel_size"))
        cfg_def_int(c, "rollout.tensor_model_parallel_size", 1, "devices per rollout engine replica");
    cfg_def_float(c, "sim.mem_bandwidth", 0, "effective memory bandwidth of an engine step, bytes/s (0 = device's)");
    cfg_def_float(c, "sim.flops", 0, "effective FLOP/s of an engine step (0 = device's)");
    cfg_def_float(c, "sim.train_flops", 0, "effective training FLOP/s per trainer device (0 = device's)");
    cfg_def_float(c, "sim.link_bandwidth", 0, "weight-sync / gradient link, bytes/s (0 = device's)");
    cfg_def_float(c, "sim.step_overhead_s", -1, "fixed seconds per engine step (< 0 = device's)");
    cfg_def_float(c, "sim.update_overhead_s", -1, "fixed seconds per optimizer update (< 0 = device's)");
    cfg_def_float(c, "sim.sync_overhead_s", -1, "fixed seconds per weight sync besides the transfer (< 0 = device's)");
    cfg_def_float(c, "sim.gen_scale", 1, "multiplies every engine-step cost (calibration from measured runs)");
    cfg_def_float(c, "sim.train_scale", 1, "multiplies every PPO-update cost (calibration from measured runs)");
    cfg_def_float(c, "sim.host_cores", 0,
                  "> 0: rollout replicas and trainer are processes sharing this many CPU cores (processor sharing, "
                  "for runs on one host); 0 = independent devices");
    cfg_def_float(c, "sim.multi_turn.turns_mean", 3,
                  "with rollout.multi_turn.enable: mean assistant turns per trajectory (≥ 1): 1 + a geometric draw, "
                  "capped by rollout.multi_turn.max_assistant_turns; each turn's length is rollout.synthetic_length's "
                  "draw and each turn but the last makes one tool call");
    cfg_def_float(c, "sim.multi_turn.tool_latency_median_s", 1,
                  "with rollout.multi_turn.enable: median seconds of a tool call (log-normal latency; a latency over "
                  "rollout.multi_turn.tool_timeout_s is a timeout answered then)");
    cfg_def_float(c, "sim.multi_turn.tool_latency_sigma", 1,
                  "with rollout.multi_turn.enable: sigma of the log of a tool call's latency (0 = every call takes the "
                  "median)");
    plan_paged_def_keys(c); /* rollout.block_size, kv_cache_bytes, gpu_memory_utilization, enable_prefix_caching */
    cfg_def_float(c, "sim.device_memory", 0,
                  "bytes of memory per rollout device, for rollout.gpu_memory_utilization (0 = the device's: h200 141e9, "
                  "a100 80e9, ascend910b 64e9, cpu this machine's available memory)");
    plan_codec_def_keys(c, "sim");
    cfg_def_int(c, "sim.multi_turn.tool_response_tokens", 32,
                "with rollout.multi_turn.enable: token ids inserted per tool turn (the tool message with its template "
                "text)");
}

/* sim.multi_turn.* into su->multi_turn (rollout.multi_turn.enable), checked; refused when set without
 * enable, and the environment's keys a simulation does not model are refused when set with it. */
static int read_multi_turn_keys(const cfg *c, const rl_config *rc, sim_setup *su) {
    static const char *const keys[4] = {"sim.multi_turn.turns_mean", "sim.multi_turn.tool_latency_median_s",
                                        "sim.multi_turn.tool_latency_sigma", "sim.multi_turn.tool_response_tokens"};
    agent_sim_config *m = &su->multi_turn;
    memset(m, 0, sizeof *m);
    if (!rc->multi_turn.enable) {
        for (int i = 0; i < 4; i++)
            if (strcmp(cfg_origin(c, keys[i]), "default"))
                return moerl_errorf("%s is set but rollout.multi_turn.enable is false: set enable=true to simulate "
                                    "multi-turn trajectories, or leave the key at its default", keys[i]);
        return MOERL_OK;
    }
    /* what the simulated environment does not model: refused rather than ignored */
    static const char *const unmodelled[4] = {"rollout.multi_turn.tool_num_workers", "rollout.multi_turn.tool_max_concurrency",
                                              "rollout.multi_turn.tool_max_retries",
                                              "rollout.multi_turn.max_tool_response_length"};
    for (int i = 0; i < 4; i++)
        if (strcmp(cfg_origin(c, unmodelled[i]), "default"))
            return moerl_errorf("%s: moerl simulate does not model it (each simulated tool call is answered after its "
                                "own drawn latency, with sim.multi_turn.tool_response_tokens ids); leave it at its "
                                "default", unmodelled[i]);
    m->turns_mean = cfg_float(c, keys[0]);
    m->latency_median_s = cfg_float(c, keys[1]);
    m->latency_sigma = cfg_float(c, keys[2]);
    const int64_t tok = cfg_int(c, keys[3]);
    if (!(m->turns_mean >= 1 && m->turns_mean <= 1e6))
        return moerl_errorf("%s must be in [1, 1e6] (assistant turns per trajectory), got %g", keys[0], m->turns_mean);
    if (!(m->latency_median_s > 0 && m->latency_median_s <= 1e6))
        return moerl_errorf("%s must be > 0 and ≤ 1e6 seconds, got %g", keys[1], m->latency_median_s);
    if (!(m->latency_sigma >= 0 && m->latency_sigma <= 20))
        return moerl_errorf("%s must be in [0, 20], got %g", keys[2], m->latency_sigma);
    if (tok < 0 || tok >= rc->max_response_length)
        return moerl_errorf("%s must be ≥ 0 and below data.max_response_length %d, got %lld", keys[3],
                            rc->max_response_length, (long long)tok);
    if (!(rc->synth_alpha > 0))
        return moerl_errorf("rollout.multi_turn.enable under moerl simulate draws each assistant turn's length from "
                            "rollout.synthetic_length.*: set rollout.synthetic_length.alpha > 0 (got %g)",
                            rc->synth_alpha);
    m->response_tokens = (int)tok;
    m->synth_alpha = rc->synth_alpha;
    m->synth_min = rc->synth_min;
    return MOERL_OK;
}

/* The stand-in model of the engine and trainer: one dense layer of width 8 over the byte vocabulary. */
int sim_tiny_model(moe_model *m, int max_len) {
    moe_config t;
    memset(&t, 0, sizeof t);
    t.vocab_size = TOK_VOCAB_SIZE; t.hidden_size = 8; t.intermediate_size = 8; t.moe_intermediate_size = 8;
    t.num_hidden_layers = 1; t.num_attention_heads = 1; t.num_key_value_heads = 1; t.head_dim = 8;
    t.num_experts = 0; t.num_experts_per_tok = 0; t.decoder_sparse_step = 1; t.max_position_embeddings = max_len;
    t.rms_norm_eps = 1e-6f; t.rope_theta = 1e4f; t.initializer_range = 0.02f;
    t.bos_token_id = TOK_BOS; t.eos_token_id = TOK_EOS;
    if (model_init(m, &t) != MOERL_OK) return MOERL_ERR;
    model_init_random(m, 1);
    return MOERL_OK;
}

/* The device's cost keys (sim.*) over the named device or the calibration in su->dev. */
static int read_cost_keys(const cfg *c, const rl_config *rc, sim_setup *su) {
    sim_device *d = &su->dev;
    const double bw = cfg_float(c, "sim.mem_bandwidth"), fl = cfg_float(c, "sim.flops"),
                 tf = cfg_float(c, "sim.train_flops"), lk = cfg_float(c, "sim.link_bandwidth");
    if (bw > 0) d->a_bytes = 1 / bw;
    if (fl > 0) d->a_flops = 1 / fl;
    if (tf > 0) d->s_flop = 1 / tf;
    if (lk > 0) d->link_bw = lk;
    if (cfg_float(c, "sim.step_overhead_s") >= 0) d->c_step = cfg_float(c, "sim.step_overhead_s");
    if (cfg_float(c, "sim.update_overhead_s") >= 0) d->c_update = cfg_float(c, "sim.update_overhead_s");
    if (cfg_float(c, "sim.sync_overhead_s") >= 0) d->c_sync = cfg_float(c, "sim.sync_overhead_s");
    const double gs = cfg_float(c, "sim.gen_scale"), ts = cfg_float(c, "sim.train_scale");
    if (!(gs > 0) || !(ts > 0) || !isfinite(gs) || !isfinite(ts))
        return moerl_errorf("sim.gen_scale (%g) and sim.train_scale (%g) must be finite and > 0", gs, ts);
    d->a_bytes *= gs, d->a_flops *= gs, d->c_step *= gs;
    d->s_flop *= ts, d->c_update *= ts;
    su->host_cores = cfg_float(c, "sim.host_cores");
    if (!(su->host_cores >= 0) || !isfinite(su->host_cores))
        return moerl_errorf("sim.host_cores must be ≥ 0, got %g", su->host_cores);
    /* rollout.dtype given: the engine's weight/KV bytes per element follow it (else the device's:
     * bf16 on the named GPUs, fp32 for cpu and a calibration, as moerl's engine by default) */
    if (strcmp(cfg_origin(c, "rollout.dtype"), "default")) d->dtype_bytes = rc->bf16_weights ? 2 : 4;
    const char *nonneg[] = {"sim.mem_bandwidth", "sim.flops", "sim.train_flops", "sim.link_bandwidth"};
    for (size_t i = 0; i < sizeof nonneg / sizeof *nonneg; i++)
        if (!(cfg_float(c, nonneg[i]) >= 0))
            return moerl_errorf("%s must be ≥ 0 (0 = the device's), got %g", nonneg[i], cfg_float(c, nonneg[i]));
    return MOERL_OK;
}

/* The paged KV budget in the simulated model's blocks per replica (sim.h sim_setup.kv_blocks). */
static int read_paged_keys(const cfg *c, const moe_config *t, sim_setup *su) {
    const int64_t bs = cfg_int(c, "rollout.block_size");
    if (bs < 1 || bs > 65536) return moerl_errorf("rollout.block_size must be in [1, 65536] tokens, got %lld", (long long)bs);
    su->block_size = (int)bs;
    su->prefix_caching = cfg_bool(c, "rollout.enable_prefix_caching");
    const int split = MOERL_MAX(1, MOERL_MIN(su->rollout_tp, t->num_key_value_heads));
    su->kv_token_bytes = 2.0 * t->num_hidden_layers * t->num_key_value_heads * t->head_dim * su->dev.dtype_bytes / split;
    const double kb = (double)cfg_int(c, "rollout.kv_cache_bytes"), util = cfg_float(c, "rollout.gpu_memory_utilization"),
                 dm = cfg_float(c, "sim.device_memory");
    if (!(kb >= 0) || !isfinite(kb)) return moerl_errorf("rollout.kv_cache_bytes must be ≥ 0 (0 = see rollout.gpu_memory_utilization), got %g", kb);
    if (!(util >= 0 && util <= 1)) return moerl_errorf("rollout.gpu_memory_utilization must be a fraction in [0, 1] (0 = off), got %g", util);
    if (!(dm >= 0) || !isfinite(dm)) return moerl_errorf("sim.device_memory must be ≥ 0 bytes, got %g", dm);
    if (kb > 0 && util > 0)
        return moerl_errorf("rollout.kv_cache_bytes=%g and rollout.gpu_memory_utilization=%g both give the KV budget: "
                            "set one of them", kb, util);
    if (dm > 0 && !(util > 0))
        return moerl_errorf("sim.device_memory=%g is set but rollout.gpu_memory_utilization is 0: it sizes only that "
                            "budget", dm);
    double dev_budget = 0;
    if (kb > 0) dev_budget = kb / split;
    if (util > 0) {
        const double mem = dm > 0 ? dm : su->dev.mem_bytes > 0 ? su->dev.mem_bytes : (double)moerl_mem_available();
        int64_t tot, dense, expert, hf;
        plan_param_counts(t, &tot, &dense, &expert, &hf);
        const double w = (su->dev.dtype_bytes == 4 ? (double)tot * 4 : (double)hf * su->dev.dtype_bytes) / su->rollout_tp;
        if (mem <= w)
            return moerl_errorf("rollout.gpu_memory_utilization=%g: the rollout device's %.4g bytes (sim.device_memory or "
                                "sim.device=%s) do not hold its weights (%.4g bytes)", util, mem, su->dev.name, w);
        dev_budget = util * (mem - w);
    }
    su->kv_blocks = dev_budget > 0 ? (int64_t)floor(dev_budget / (su->block_size * su->kv_token_bytes)) : 0;
    if (dev_budget > 0 && su->kv_blocks < 1)
        return moerl_errorf("the KV budget of %.4g bytes per rollout device holds no block of %d tokens (%.4g bytes)",
                            dev_budget, su->block_size, su->block_size * su->kv_token_bytes);
    return MOERL_OK;
}

/* The gradient exchange's scheme and codec (sim.h sim_setup.xchg). */
static int read_xchg_keys(const cfg *c, const rl_config *rc, sim_setup *su) {
    if (plan_codec_read(c, "sim", &su->codec) != MOERL_OK) return MOERL_ERR;
    su->xchg = PLAN_XCHG_NONE;
    su->xchg_exact_updates = 0;
    su->xchg_var_interval = 0;
    if (rc->optim_name == OPTIM_ONEBIT_ADAM) {
        su->xchg = PLAN_XCHG_ONEBIT_ADAM;
        su->xchg_exact_updates = rc->optim_freeze_step;
        su->xchg_var_interval = rc->optim_var_update_interval;
    } else if (rc->grad_compression != GRAD_COMPRESSION_NONE) {
        su->xchg = rc->grad_compression == GRAD_COMPRESSION_ONEBIT ? PLAN_XCHG_ONEBIT : PLAN_XCHG_THRESHOLD;
        su->xchg_exact_updates = rc->grad_compression_warmup_steps;
    }
    if (su->xchg == PLAN_XCHG_NONE) { /* the codec keys time a compressed exchange: refused when none runs */
        static const char *const sch[3] = {"onebit", "threshold", "onebit_adam"}, *const fld[2] = {"encode_ns", "decode_ns"};
        char key[96];
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                if (j == 2 && i != 1) continue;
                snprintf(key, sizeof key, "sim.codec.%s.%s", sch[i], j < 2 ? fld[j] : "ratio");
                if (strcmp(cfg_origin(c, key), "default"))
                    return moerl_errorf("%s is set, but the gradient exchange is exact (actor.grad_compression=none, "
                                        "actor.optim.name=adamw): the codec keys time a compressed exchange only", key);
            }
    }
    return MOERL_OK;
}

/* The configuration (moerl rl's reader), the simulated model, the devices and their costs, checked as
 * moerl rl and moerl plan check them; *n_roll_dev: sim.rollout_devices. */
int sim_read_setup(const cfg *c, const char *model, int calibrate, int sweep, rl_config *rc, sim_setup *su,
                   moe_config *target, int *n_roll_dev) {
    if (calibrate && strcmp(cfg_origin(c, "sim.device"), "default")) /* refused: not the named device's */
        return moerl_errorf("--calibrate measures this machine's costs, but sim.device=%s (%s) names a device's: drop "
                            "one of them",
                            cfg_str(c, "sim.device"),
                            strcmp(cfg_origin(c, "sim.device"), "override") ? cfg_origin(c, "sim.device") : "command line");
    if (rl_read_config(c, rc) != MOERL_OK || model_config_from_keys(c, model, target) != MOERL_OK)
        return MOERL_ERR;
    if (sweep) { /* the async rows' budget: the reader checked the configured mode's */
        rl_config async = *rc;
        if (rl_config_set_mode(&async, RL_MODE_ASYNC) != MOERL_OK) return MOERL_ERR;
    }
    if (read_multi_turn_keys(c, rc, su) != MOERL_OK) return MOERL_ERR;
    if (rc->batch_invariant) /* refused rather than ignored: its cost is the kernels', and no kernel runs here */
        return moerl_errorf("rollout.batch_invariant=true: moerl simulate does not model the batch-invariant kernels "
                            "(its engine and trainer run no model, and the cost model has no figure for them; "
                            "docs/benchmarks.md, 'Batch-invariant kernels'); leave it at false");
    if (rc->router_replay != ROUTER_REPLAY_DISABLED) { /* the trainer runs no model here: nothing to replay */
        log_warn("actor.router_replay.mode=%s: moerl simulate runs no model, so no routes are replayed (replay costs "
                 "no extra step time in the cost model; the simulation is the same without the key)",
                 rc->router_replay == ROUTER_REPLAY_R2 ? "R2" : "R3");
        rc->router_replay = ROUTER_REPLAY_DISABLED;
    }
    su->target = target;
    su->rollout_tp = (int)cfg_int(c, "rollout.tensor_model_parallel_size");
    *n_roll_dev = (int)cfg_int(c, "sim.rollout_devices");
    if (su->rollout_tp < 1 || *n_roll_dev < su->rollout_tp || *n_roll_dev % su->rollout_tp)
        return moerl_errorf("sim.rollout_devices %d must be a positive multiple of rollout.tensor_model_parallel_size %d",
                            *n_roll_dev, su->rollout_tp);
    /* the layout against the trainer devices and the model, as moerl plan and moerl rl refuse it (the
     * pipeline's combinations: rl_read_config's par_read_layout) */
    if (par_check(&rc->par, rc->n_trainer_ranks, target->num_experts, target->num_attention_heads,
                  target->num_key_value_heads, target->num_hidden_layers) != MOERL_OK ||
        plan_check_rollout_tp(su->rollout_tp, target->num_attention_heads) != MOERL_OK)
        return MOERL_ERR;
    su->n_rollout_replicas = *n_roll_dev / su->rollout_tp;
    su->n_trainer = rc->n_trainer_ranks;
    const par_config *pc = &rc->par;
    if (pc->pipeline_parallel_size > 1 || pc->expert_parallel_size > 1 || pc->ulysses_sequence_parallel_size > 1 ||
        pc->fsdp_size > 1 || rc->rollout_ep > 1)
        log_warn("moerl simulate times a PPO update as its FLOPs over the trainer devices plus a ring all-reduce of "
                 "the gradients, and an engine step per replica: the parallel layout (actor.pipeline_parallel_size, "
                 "expert / sequence parallel and FSDP sizes, rollout.expert_parallel_size) is not modelled — no "
                 "pipeline bubble, no all-to-all or gather traffic (moerl plan gives the traffic)");
    if (calibrate) {
        if (sim_calibrate(target, MOERL_MIN(rc->max_num_seqs, 128), MOERL_MIN(rc->ppo_max_token_len, 4096),
                          &su->dev) != MOERL_OK)
            return MOERL_ERR;
    } else if (sim_device_named(cfg_str(c, "sim.device"), &su->dev) != MOERL_OK) {
        return MOERL_ERR;
    }
    if (read_cost_keys(c, rc, su) != MOERL_OK || read_paged_keys(c, target, su) != MOERL_OK ||
        read_xchg_keys(c, rc, su) != MOERL_OK)
        return MOERL_ERR;
    return data_use_tokenizer(NULL, TOK_VOCAB_SIZE, cfg_str(c, "data.chat_template"), cfg_bool(c, "data.enable_thinking"),
                              "data.chat_template");
}
