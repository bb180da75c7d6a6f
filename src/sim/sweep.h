/* moerl simulate's runs: one simulation's result as JSON, and --sweep — the report grid (staleness
 * 0/0.1/0.3/0.5 × partial rollout on/off in async mode, the synchronous baseline, rollout:trainer
 * 1:1/2:1/3:1 at the same total devices) simulated into sub-folders of the output folder, with
 * sweep.md, sweep.dat, sweep.gp and sweep.png beside them. */
#ifndef MOERL_SIM_SWEEP_H
#define MOERL_SIM_SWEEP_H

#include <jansson.h>

#include "base/outdir.h"
#include "data/dataset.h"
#include "model/model.h"
#include "rl/rl.h"
#include "sim/sim.h"

/* The sweep's rows: [0] sync, [1..4] staleness 0/0.1/0.3/0.5 with partial rollout on, [5..8] the same
 * with it off, [9..11] the rollout:trainer splits 1:1, 2:1, 3:1 (sub-folders: rl_sweep_outputs). */
#define SIM_SWEEP_ROWS 12

typedef struct {
    rl_config rc;
    sim_setup su;
    moe_model *tiny;
    dataset *train;
    int ran;                          /* a simulation started (its folder holds results) */
    moerl_outdir sub[SIM_SWEEP_ROWS]; /* --sweep: the sub-folders, claimed before the first simulation */
    int n_sub;
} sim_ctx;

/* One simulation's figures and the setup's cost keys in force, as one JSON object. */
json_t *sim_result_json(const sim_result *r, const sim_setup *su);
/* The name of the sweep's sub-folder of row i (static). */
const char *sim_sweep_dir(int i);
/* The devices of the sweep's k:1 split of total devices (rollout devices a multiple of the replica
 * size tp): *rd rollout, *td trainer. Errors: no trainer device left. */
int sim_sweep_split(int total, int tp, int k, int *rd, int *td);
/* Run the grid (x: the configuration, setup, stand-in model and data; n_roll_dev rollout and n_train
 * trainer devices), write sweep.md, sweep.dat, sweep.gp/png under x->rc.out_dir and print sweep.md on
 * stdout — or, as_json, one JSON line {"parameter_versions", "warning", "rows": [...]}. Every
 * sub-folder is claimed (rl_sim_claim_folder) before the first simulation; on an error (not a stop
 * signal) the claimed ones no simulation wrote are removed. */
int sim_sweep(sim_ctx *x, int n_roll_dev, int n_train, int as_json);

#endif
