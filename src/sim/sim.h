/* moerl simulate: the production RL job (src/rl/schedule.c's step loop, the real rollouter with its
 * engine scheduler, MessageQueue, staleness budget, partial-rollout interrupt/resume) on a virtual
 * clock. Nothing runs a model: the rollouter's engine is created with engine_config.simulated (it
 * schedules, admits, chunks prefill, pauses and resumes exactly as in `moerl rl`, but emits token 0
 * without a forward), response lengths come from rollout.synthetic_length (the Pareto tail of
 * bench/run_async.sh), and every engine step, PPO update and weight sync advances the clock by
 * the cost model below. Discrete-event, single-threaded, deterministic for a seed.
 *
 * Cost model (per device; a "replica" is rollout_tp devices serving one engine):
 *   engine step   t = a_bytes · bytes + a_flops · flops + c_step, per replica, with the merged
 *                 engine's batch split evenly over the replicas that have a group in the step:
 *                   bytes = (P_dense + n_moe · E · (1 − (1 − K/E)^b) · P_expert1) · dtype / tp
 *                           + kv_reads · 2 · nkv · hd · L · dtype / min(tp, nkv)
 *                   flops = (2 · P_active · b + 4 · L · nh · hd · kv_reads) / tp
 *                 b = tokens of the step per busy replica, P_expert1 = one expert's weights, the
 *                 touched-expert count is the expectation for b tokens routed uniformly
 *                 (each of E experts missed with probability (1 − K/E)^b);
 *   PPO update    t = s_flop · model_train_flops(tokens, causal pairs) · (ppo_epochs + f / 3) / n_trainer
 *                     + c_update + (n_trainer > 1 ? 2·(n−1)/n · dtype·n_params / link_bw : 0) per update
 *                 (after the warm-up of actor.grad_compression / actor.optim.name=onebit_adam: the scheme's codec
 *                 + bytes instead, plan/plan_xchg.h, with the sim.codec.* costs),
 *                 f = rl_fwd_only_passes: the step's forward-only passes (a third of a training pass
 *                 each) — the proximal logprobs (decoupled loss or no bypass) and the KL reference's
 *                 logprobs (actor.use_kl_loss), as trainer_update runs them once per step;
 *   weight sync   t = bytes_bcast / link_bw + c_sync.
 * Host sharing (sim_setup.host_cores = C > 0, for validating against runs on one CPU host): the
 *   roles are processes of one thread each, sharing C cores by processor sharing — while n of them
 *   are runnable, each runs at min(1, C / n) of its calibrated speed. Runnable are the trainer's
 *   n_trainer processes while a PPO update computes (not while they wait for groups or sync) and
 *   the rollout replicas that have a group in the current engine step (b = min(replicas, groups in
 *   the step); the others sleep, as moerl's rollout ranks do, and a step's tokens are split over
 *   the b busy ones). An update and the engine steps that overlap it are co-simulated event by
 *   event (sim_run.c train_shared). C = 0: independent devices, no sharing.
 * a_bytes = 1/(bandwidth·efficiency), a_flops = 1/(FLOP rate·efficiency) come from a named device
 * (sim_device_named) or from sim_calibrate's least-squares fit to timed engine steps and training
 * steps of the real model on this machine.
 */
#ifndef MOERL_SIM_H
#define MOERL_SIM_H

#include <stdint.h>

#include "data/dataset.h"
#include "model/model.h"
#include "plan/plan_xchg.h"
#include "rl/agent_loop.h"
#include "rl/rl.h"

typedef struct {
    char name[32];
    double a_bytes;      /* s per byte read by an engine step (1 / effective memory bandwidth) */
    double a_flops;      /* s per FLOP of an engine step (1 / effective FLOP rate) */
    double c_step;       /* s per engine step (scheduling, sampling, launch) */
    double s_flop;       /* s per training FLOP on one trainer device (1 / (peak · MFU)) */
    double c_update;     /* s per optimizer update (AdamW over the local parameters, launch) */
    double link_bw;      /* bytes/s of the weight-sync / gradient link */
    double c_sync;       /* s per weight sync besides the transfer (pause, load, resume) */
    int dtype_bytes;     /* bytes per weight / KV element in the rollout engine */
    double mem_bytes;    /* memory per rollout device, for rollout.gpu_memory_utilization (0: this machine's
                            available memory, as the engine reads it on CPU) */
} sim_device;

/* Cost keys of a named device: h200, a100, ascend910b (datasheet bandwidth and FLOP rate with the
 * efficiencies written in sim.c), or cpu (moerl's fp32 CPU engine, a placeholder to calibrate).
 * Errors: unknown name (the message lists the known ones). */
int sim_device_named(const char *name, sim_device *d);

/* Fit the device from timed real work of model cfg on this machine with the current OpenMP
 * threads: engine decode steps at several batch sizes and a prefill chunk (a_bytes, a_flops,
 * c_step by non-negative least squares), training forward+backward at several token counts
 * (s_flop, c_update), a memcpy of the weights (link_bw: one process, the copy a same-host
 * broadcast does). Takes a few seconds. Errors: model too large for this machine's available memory
 * (checked before anything is allocated, sim_calibrate_bytes). */
int sim_calibrate(const moe_config *cfg, int max_num_seqs, int train_tokens, sim_device *d);
/* The bytes sim_calibrate allocates (it refuses, naming both figures, when they exceed
 * moerl_mem_available): 4 fp32 copies of the n_params floats (the model's weights and gradients,
 * the engine's weights, the copy the broadcast timing makes), the engine's packed expert weights,
 * the engine's KV cache for max_num_seqs × 57 positions and the activation arena of
 * train_tokens tokens (plan_acts_bytes). An estimate from src/plan's counts, within the small
 * buffers it leaves out. */
double sim_calibrate_bytes(const moe_config *cfg, int max_num_seqs, int train_tokens);

typedef struct {
    const moe_config *target;    /* the model whose costs are simulated */
    sim_device dev;
    int n_rollout_replicas;      /* engine replicas (each rollout_tp devices) */
    int rollout_tp;
    int n_trainer;               /* trainer devices */
    double host_cores;           /* > 0: the "devices" are one-thread processes sharing this many CPU cores
                                    (moerl's CPU runs on one host): while n roles are runnable (a trainer computing
                                    an update, a replica with a group in its step) each runs at min(1, host_cores /
                                    n) of its calibrated speed (processor sharing); 0 = independent devices */
    /* rollout.multi_turn.enable: the sim.multi_turn.* distributions of the simulated trajectories
     * (rl/agent_loop.h's simulation mode; eos_id / filler_id are set by sim_run from the stand-in model) */
    agent_sim_config multi_turn;
    /* The paged KV cache (issue 28) in the simulated model's terms: the engine's admission and preemption
     * run on kv_blocks blocks of block_size tokens per replica (sim_run converts them into the stand-in
     * model's bytes), prefix sharing on or off. kv_blocks 0: the slot engine's reservation. */
    int block_size;              /* rollout.block_size */
    int prefix_caching;          /* rollout.enable_prefix_caching */
    int64_t kv_blocks;           /* per replica: the budget (rollout.kv_cache_bytes per replica, or
                                    rollout.gpu_memory_utilization × (device memory − weights) per device) over
                                    block_size × kv_token_bytes; 0 = the reservation */
    double kv_token_bytes;       /* KV bytes of one token on one rollout device: 2·L·nkv·hd·dtype / min(tp, nkv) */
    /* The gradient exchange (issue 29): the scheme actor.grad_compression / actor.optim.name selects, its
     * codec costs (sim.codec.*), and the first optimizer updates that still exchange exactly
     * (actor.grad_compression_warmup_steps, or 1-bit Adam's actor.optim.freeze_step) */
    plan_codec codec;
    plan_xchg_scheme xchg;
    int64_t xchg_exact_updates;
    int64_t xchg_var_interval; /* onebit_adam: actor.optim.var_update_interval (updates F + jK exact), 0 none */
} sim_setup;

typedef struct {
    double wall_s;               /* virtual seconds from the first step to the stop */
    int64_t steps, prompts_trained, tokens_generated, versions;
    double prompts_per_s, tokens_per_s;
    double trainer_idle_ratio;   /* Σ virtual wait for groups / wall */
    double rollout_idle_ratio;   /* idle / (busy + idle) of the rollout side */
    double rollout_busy_s, rollout_idle_s, train_busy_s, sync_s;
    double rollout_work_s;       /* Σ over engine steps of (work per busy replica at full speed) × busy replicas: the
                                    device-seconds (on a CPU host: CPU-seconds) the rollout side computes */
    double train_work_s;         /* Σ over PPO updates of the work at full speed × trainer devices, likewise */
    int max_staleness;
    int64_t interrupted_responses; /* trained responses that were interrupted at least once */
    int64_t stale_hist[8];       /* trained groups by lag (T.version − oldest token version), last bin ≥ 7 */
    int64_t engine_steps;
    /* the paged engine's counters (engine_stats, all replicas' merged engine): blocks in the pool, the most
     * held at once, preemptions, prompt tokens served from shared blocks */
    int64_t kv_blocks_total, kv_blocks_peak, preemptions, prefix_hit_tokens;
    double exchange_s;           /* Σ over optimizer updates of the gradient exchange (scheme and codec included) */
    int64_t compressed_updates;  /* updates that exchanged with the compressed scheme (after the exact ones) */
} sim_result;

/* Run the job of cfg (cfg->mode async | lockstep | sync as in `moerl rl`; val_n, save_freq and the
 * watchdog are forced off) on the virtual clock; tiny is the stand-in model the engine and trainer
 * hold (its weights are never used for compute; same vocabulary as the tokenizer). Writes
 * samples.jsonl and metrics.jsonl under cfg->out_dir like `moerl rl` (their timing fields are host
 * time; the virtual figures are in *res). Errors: as rl_run's configuration checks, a deadlock of
 * the rollout side (message says what it waited for). */
int sim_run(const rl_config *cfg, const sim_setup *su, moe_model *tiny, const dataset *train, sim_result *res);

/* Seconds of one engine step per replica (the cost model above) for a step that forwarded
 * `tokens` tokens per replica reading kv_reads KV rows per replica. */
double sim_engine_step_s(const sim_setup *su, double tokens, double kv_reads);

#endif
