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
#include "cli/options.h"
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
    memset(f, 0, sizeof *f);
    cli_overrides ov = {0};
    const cli_opt opts[] = {
        {.name = "config", .short_name = 'c', .type = CLI_STR, .dest = &f->config, .meta = "FILE",
         .flags = CLI_ONCE | CLI_REQUIRED, .help = "the rl YAML config to simulate"},
        {.name = "model", .short_name = 'm', .type = CLI_STR, .dest = &f->model, .meta = "DIR|config.json",
         .flags = CLI_ONCE, .help = "the model whose costs are simulated (else the config's model.*)"},
        {.name = "calibrate", .short_name = 'k', .type = CLI_FLAG, .dest = &f->calibrate,
         .help = "fit the cost keys to timed engine steps and training passes on this machine (instead of sim.device)"},
        {.name = "sweep", .short_name = 's', .type = CLI_FLAG, .dest = &f->do_sweep,
         .help = "sync, 8 staleness × partial-rollout rows and 3 rollout:trainer splits, into sub-folders"},
        {.name = "json", .short_name = 'j', .type = CLI_FLAG, .dest = &f->as_json, .help = "JSON output"},
    };
    const cli_spec spec = {.cmd = "simulate",
                           .synopsis = "--config FILE [--model DIR|config.json] [--calibrate] [--sweep] [--json] "
                                       "[key=value ...]",
                           .about = "The production RL scheduler on a virtual clock (src/sim/sim.h).",
                           .opts = opts, .n_opts = CLI_NOPTS(opts), .overrides = &ov, .keys = c};
    int code;
    if (cli_parse(&spec, argc, argv, &code)) return code;
    if (cfg_load_yaml(c, f->config) != MOERL_OK || cli_apply_overrides(c, &ov) != MOERL_OK) {
        cli_print_error("simulate", moerl_last_error());
        cli_overrides_free(&ov);
        return 1;
    }
    cli_overrides_free(&ov);
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
