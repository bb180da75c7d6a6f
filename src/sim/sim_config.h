/* moerl simulate's configuration: `moerl rl`'s keys plus the sim.* cost keys, read and checked as
 * moerl rl and moerl plan check them, into the rl_config and the sim_setup (sim/sim.h) a simulation
 * runs. */
#ifndef MOERL_SIM_CONFIG_H
#define MOERL_SIM_CONFIG_H

#include "base/config.h"
#include "model/model.h"
#include "rl/rl.h"
#include "sim/sim.h"

/* Declare rl_def_keys' keys and the simulation's: sim.device, sim.rollout_devices,
 * rollout.tensor_model_parallel_size (unless declared), the cost keys sim.mem_bandwidth, sim.flops,
 * sim.train_flops, sim.link_bandwidth, sim.*_overhead_s, the scales sim.gen_scale / sim.train_scale
 * sim.host_cores and the multi-turn distributions sim.multi_turn.* (turns_mean, tool_latency_median_s,
 * tool_latency_sigma, tool_response_tokens; read with rollout.multi_turn.enable, refused without), the paged
 * KV keys (plan_paged_def_keys) with sim.device_memory, and the codec costs sim.codec.* (plan_codec_def_keys). */
void sim_def_keys(cfg *c);
/* Read the configuration: rl_read_config into *rc (sweep: the async rows' budget checked too), the
 * simulated model's architecture into *target (model: --model, or NULL for model.path / model.*),
 * the devices (*n_roll_dev: sim.rollout_devices, a multiple of rollout.tensor_model_parallel_size)
 * and the layout against them and the model (par_check, plan_check_rollout_tp), the device's costs
 * (calibrate: measured on this machine, refused beside sim.device; else the named device's) with the
 * sim.* keys over them into *su, and the byte tokenizer with data.chat_template. Errors name the
 * keys and their values. */
int sim_read_setup(const cfg *c, const char *model, int calibrate, int sweep, rl_config *rc, sim_setup *su,
                   moe_config *target, int *n_roll_dev);
/* The stand-in model of the engine and trainer: one dense layer of width 8 over the byte vocabulary,
 * max_len positions. */
int sim_tiny_model(moe_model *m, int max_len);

#endif
