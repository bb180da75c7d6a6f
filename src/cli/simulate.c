/* moerl simulate --config FILE [--model DIR|config.json] [--calibrate] [--sweep] [--json] [key=value ...]
 * The production RL job on a virtual clock (src/sim/sim.h): `moerl rl`'s keys and data, plus
 *   sim.device             h200 | a100 | ascend910b | cpu (cost keys of a named device; --calibrate
 *                          measures this machine instead)
 *   sim.rollout_devices    rollout devices; replicas = rollout_devices / rollout.tensor_model_parallel_size
 *   trainer.n_ranks        trainer devices
 *   sim.mem_bandwidth, sim.flops, sim.train_flops, sim.link_bandwidth (bytes/s, FLOP/s; 0 = the device's),
 *   sim.step_overhead_s, sim.update_overhead_s, sim.sync_overhead_s (< 0 = the device's)
 * --model gives the simulated model (its costs); otherwise model.path / model.* as in `moerl rl`.
 * --sweep runs the report grid (staleness 0/0.1/0.3/0.5 × partial rollout on/off in async mode, the
 * synchronous baseline, rollout:trainer 1:1/2:1/3:1 at the same total devices) and writes
 * sweep.md, sweep.dat and sweep.png under trainer.default_local_dir, and prints sweep.md — or, with
 * --json, one JSON object with a row per setting (sweep()). Without --sweep the result is one JSON line
 * (--json: 17 significant digits). The checks of `moerl rl` and `moerl plan` apply (the layout against
 * the devices and the model, the model's context); --sweep checks all its sub-folders before the first
 * simulation. SIGINT / SIGTERM stop it at the next trainer step: it removes what it made
 * (stopped_cleanup) and exits 128 + signal. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/config.h"
#include "base/log.h"
#include "base/plot.h"
#include "base/signals.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "data/tokenizer.h"
#include "parallel/grid.h"
#include "plan/plan.h"
#include "rl/rl.h"
#include "rl/run_dir.h"
#include "sim/sim.h"
#include "sim/sim_config.h"
#include "sim/sweep.h"



/* A SIGINT / SIGTERM stopped the simulation (after its current one: the step loop stops at a step
 * boundary) or its setup: remove what this run made — the output folder when it created it, else the
 * sweep sub-folders it created and, when no simulation ran, the marker it wrote — and say what is
 * left. od NULL: nothing was made yet. */
static void stopped_cleanup(sim_ctx *x, const moerl_outdir *od, int top_marker_new) {
    const int sig = moerl_stop_requested();
    if (!od) {
        fprintf(stderr, "moerl simulate: stopped by signal %d before anything was written\n", sig);
        return;
    }
    if (moerl_outdir_remove(od)) {
        fprintf(stderr, "moerl simulate: stopped by signal %d; removed %s, the folder it made\n", sig, od->top);
        return;
    }
    int kept = 0; /* sub-folders that existed before (an earlier simulation's): not removed */
    for (int i = 0; i < x->n_sub; i++) kept += !moerl_outdir_remove(&x->sub[i]);
    if (!x->ran || (x->n_sub > 0 && kept == 0)) { /* nothing of this run's results is left */
        if (top_marker_new) {
            char m[4200];
            snprintf(m, sizeof m, "%s/%s", x->rc.out_dir, MOERL_SIMULATION_MARKER);
            unlink(m);
        }
        fprintf(stderr, "moerl simulate: stopped by signal %d; %s%s is as it was (but for its generated data/)\n", sig,
                x->n_sub > 0 ? "removed the sweep folders it made; " : "", x->rc.out_dir);
    } else {
        fprintf(stderr, "moerl simulate: stopped by signal %d; %s existed before and keeps its %s marker with the "
                "partial results of this simulation%s: rerun the simulation there or delete it\n",
                sig, x->rc.out_dir, MOERL_SIMULATION_MARKER, x->n_sub > 0 ? " (no sweep.md)" : "");
    }
}

/* The command line: flags into *f, the YAML and key=value overrides into c. Returns -1 to go on, else
 * the exit code (usage, --help; errors printed). */
typedef struct {
    const char *config, *model;
    int calibrate, do_sweep, as_json;
} sim_flags;

static int parse_args(cfg *c, int argc, char **argv, sim_flags *f) {
    static const struct option opts[] = {{"config", required_argument, 0, 'c'}, {"model", required_argument, 0, 'm'},
                                         {"calibrate", no_argument, 0, 'k'},     {"sweep", no_argument, 0, 's'},
                                         {"json", no_argument, 0, 'j'},          {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    memset(f, 0, sizeof *f);
    optind = 1;
    while ((o = getopt_long(argc, argv, "c:m:ksjh", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
        case 'm':
            if (cli_flag_once("simulate", o == 'm' ? "--model" : "--config", o == 'm' ? &f->model : &f->config, optarg))
                return 2;
            break;
        case 'k': f->calibrate = 1; break;
        case 's': f->do_sweep = 1; break;
        case 'j': f->as_json = 1; break;
        case 'h':
            printf("usage: moerl simulate --config FILE [--model DIR|config.json] [--calibrate] [--sweep] [--json] "
                   "[key=value ...]\nThe production RL scheduler on a virtual clock (src/sim/sim.h). keys:\n");
            cfg_print_help(c, stdout);
            return 0;
        default: fprintf(stderr, "moerl simulate: see --help\n"); return 2;
        }
    }
    if (!f->config) {
        fprintf(stderr, "moerl simulate: --config FILE is required (see --help)\n");
        return 2;
    }
    if (cfg_load_yaml(c, f->config) != MOERL_OK) {
        cli_print_error("simulate", moerl_last_error());
        return 1;
    }
    for (int i = optind; i < argc; i++) {
        if (!strchr(argv[i], '=')) {
            fprintf(stderr, "moerl simulate: unexpected argument '%s' (expected key=value)\n", argv[i]);
            return 2;
        }
        if (cfg_apply_override(c, argv[i]) != MOERL_OK) {
            cli_print_error("simulate", moerl_last_error());
            return 1;
        }
    }
    return -1;
}



/* Everything the sweep would refuse on its way, before anything is written. */
static int check_sweep(const sim_ctx *x, int n_roll_dev) {
    for (int k = 1; k <= 3; k++) {
        int rd, td;
        if (sim_sweep_split(n_roll_dev + x->su.n_trainer, x->su.rollout_tp, k, &rd, &td) != MOERL_OK) return MOERL_ERR;
    }
    for (int i = 0; i < SIM_SWEEP_ROWS; i++) {
        char d[4200];
        snprintf(d, sizeof d, "%s/%s", x->rc.out_dir, sim_sweep_dir(i));
        if (rl_sim_check_folder(d) != MOERL_OK) return MOERL_ERR;
    }
    return MOERL_OK;
}

int cmd_simulate(int argc, char **argv) {
    cfg *c = cfg_new();
    sim_def_keys(c);
    sim_flags f;
    int rc = parse_args(c, argc, argv, &f);
    if (rc >= 0) {
        cfg_free(c);
        return rc;
    }
    rc = 1;
    int opened = 0, top_marker_new = 0, n_roll_dev = 0;
    moerl_outdir od;
    moe_model tiny;
    memset(&tiny, 0, sizeof tiny);
    dataset train, test;
    memset(&train, 0, sizeof train);
    memset(&test, 0, sizeof test);
    sim_ctx x;
    memset(&x, 0, sizeof x);
    moe_config target;
    if (sim_read_setup(c, f.model, f.calibrate, f.do_sweep, &x.rc, &x.su, &target, &n_roll_dev) != MOERL_OK) goto fail;
    if (f.do_sweep && check_sweep(&x, n_roll_dev) != MOERL_OK) goto fail;
    moerl_install_stop_signals(); /* Ctrl-C / SIGTERM: stop after the current simulation (stopped_cleanup) */
    if (rl_sim_claim_folder(x.rc.out_dir, &od, &top_marker_new) != MOERL_OK) goto fail;
    opened = 1;
    if (data_prepare(c, x.rc.out_dir, &train, &test) != MOERL_OK) goto fail;
    if (rl_check_update_sizes(&x.rc, &train, 0) != MOERL_OK) goto fail; /* one sequence per micro-batch at least */
    /* the simulated model's context, as moerl rl refuses it (the stand-in model below has no limit) */
    if (rl_check_context(&train, x.rc.max_response_length, target.max_position_embeddings, NULL) != MOERL_OK) goto fail;
    if (sim_tiny_model(&tiny, 1 << 20) != MOERL_OK) goto fail;
    x.tiny = &tiny;
    x.train = &train;
    if (moerl_stop_requested()) goto fail;
    if (f.do_sweep) {
        if (sim_sweep(&x, n_roll_dev, x.su.n_trainer, f.as_json) != MOERL_OK) goto fail;
    } else {
        sim_result r;
        x.ran = 1;
        if (sim_run(&x.rc, &x.su, &tiny, &train, &r) != MOERL_OK || moerl_stop_requested()) goto fail;
        cli_print_json(sim_result_json(&r, &x.su), f.as_json ? 17 : 6);
    }
    rc = 0;
    goto done;
fail:
    if (moerl_stop_requested()) {
        rc = 128 + moerl_stop_requested();
        stopped_cleanup(&x, opened ? &od : NULL, top_marker_new);
    } else {
        cli_print_error("simulate", moerl_last_error());
        if (opened && !x.ran && top_marker_new) { /* refused before any simulation: no marker left behind */
            char m[4200];
            snprintf(m, sizeof m, "%s/%s", x.rc.out_dir, MOERL_SIMULATION_MARKER);
            unlink(m);
        }
        if (opened) moerl_outdir_abandon(&od); /* a folder this run made, holding only what setting up wrote */
    }
done:
    if (tiny.params) model_free(&tiny);
    dataset_free(&train);
    dataset_free(&test);
    cfg_free(c);
    return rc;
}
