/* moerl simulate --sweep: the report grid of simulations (see sweep.h). */
#include "sim/sweep.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/plot.h"
#include "base/signals.h"
#include "rl/run_dir.h"

/* NaN and infinities as null (JSON has no NaN). */
static json_t *json_real_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* One JSON value as a line on stdout (compact, ASCII-escaped, reals with `precision` significant
 * digits), freed. */
static void print_json_line(json_t *j, int precision) {
    char *t = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(precision));
    if (t) printf("%s\n", t);
    fflush(stdout);
    free(t);
    json_decref(j);
}

json_t *sim_result_json(const sim_result *r, const sim_setup *su) {
    json_t *o = json_object();
    json_object_set_new(o, "wall_s", json_real(r->wall_s));
    json_object_set_new(o, "steps", json_integer(r->steps));
    json_object_set_new(o, "versions", json_integer(r->versions));
    json_object_set_new(o, "prompts_trained", json_integer(r->prompts_trained));
    json_object_set_new(o, "tokens_generated", json_integer(r->tokens_generated));
    json_object_set_new(o, "prompts_per_s", json_real(r->prompts_per_s));
    json_object_set_new(o, "tokens_per_s", json_real(r->tokens_per_s));
    json_object_set_new(o, "trainer_idle_ratio", json_real(r->trainer_idle_ratio));
    json_object_set_new(o, "rollouter_idle_ratio", json_real(r->rollout_idle_ratio));
    json_object_set_new(o, "rollout_busy_s", json_real(r->rollout_busy_s));
    json_object_set_new(o, "train_busy_s", json_real(r->train_busy_s));
    json_object_set_new(o, "rollout_work_s", json_real(r->rollout_work_s));
    json_object_set_new(o, "train_work_s", json_real(r->train_work_s));
    json_object_set_new(o, "sync_s", json_real(r->sync_s));
    json_object_set_new(o, "max_staleness", json_integer(r->max_staleness));
    json_object_set_new(o, "interrupted_responses", json_integer(r->interrupted_responses));
    json_t *h = json_array();
    for (int i = 0; i < 8; i++) json_array_append_new(h, json_integer(r->stale_hist[i]));
    json_object_set_new(o, "staleness_histogram", h);
    json_object_set_new(o, "engine_steps", json_integer(r->engine_steps));
    /* the paged engine (issue 28): its counters over all replicas, the peak as bytes per rollout device */
    json_object_set_new(o, "preemptions", json_integer(r->preemptions));
    json_object_set_new(o, "kv_blocks_total", json_integer(r->kv_blocks_total));
    json_object_set_new(o, "kv_blocks_peak", json_integer(r->kv_blocks_peak));
    json_object_set_new(o, "prefix_hit_tokens", json_integer(r->prefix_hit_tokens));
    json_object_set_new(o, "block_size", json_integer(su->block_size));
    json_object_set_new(o, "kv_budget_blocks_per_replica", json_integer(su->kv_blocks)); /* 0: the reservation */
    json_object_set_new(o, "kv_peak_bytes_per_device",
                        json_real((double)r->kv_blocks_peak / su->n_rollout_replicas * su->block_size * su->kv_token_bytes));
    /* the gradient exchange (issue 29): the scheme, its updates after the exact warm-up, the time in all */
    json_object_set_new(o, "grad_exchange", json_string(plan_xchg_name(su->xchg)));
    json_object_set_new(o, "grad_exchange_s", json_real(r->exchange_s));
    json_object_set_new(o, "compressed_updates", json_integer(r->compressed_updates));
    json_object_set_new(o, "rollout_replicas", json_integer(su->n_rollout_replicas));
    json_object_set_new(o, "rollout_tp", json_integer(su->rollout_tp));
    json_object_set_new(o, "trainer_devices", json_integer(su->n_trainer));
    json_object_set_new(o, "device", json_string(su->dev.name));
    /* the cost keys in force (after calibration and scales), to pass back as key=value */
    json_t *k = json_object();
    json_object_set_new(k, "sim.mem_bandwidth", json_real(su->dev.a_bytes > 0 ? 1 / su->dev.a_bytes : 0));
    json_object_set_new(k, "sim.flops", json_real(su->dev.a_flops > 0 ? 1 / su->dev.a_flops : 0));
    json_object_set_new(k, "sim.train_flops", json_real(su->dev.s_flop > 0 ? 1 / su->dev.s_flop : 0));
    json_object_set_new(k, "sim.link_bandwidth", json_real(su->dev.link_bw));
    json_object_set_new(k, "sim.step_overhead_s", json_real(su->dev.c_step));
    json_object_set_new(k, "sim.update_overhead_s", json_real(su->dev.c_update));
    json_object_set_new(k, "sim.sync_overhead_s", json_real(su->dev.c_sync));
    /* the engine's bytes per weight / KV element: bf16 on the named GPUs, fp32 for cpu and a calibration
     * (without it, keys passed back without sim.device would time a cpu device's fp32 engine) */
    json_object_set_new(k, "rollout.dtype", json_string(su->dev.dtype_bytes == 2 ? "bf16" : "fp32"));
    json_object_set_new(o, "cost_keys", k);
    json_object_set_new(o, "host_cores", json_real(su->host_cores));
    if (su->multi_turn.turns_mean > 0) { /* rollout.multi_turn.enable: the distributions simulated */
        json_t *m = json_object();
        json_object_set_new(m, "sim.multi_turn.turns_mean", json_real(su->multi_turn.turns_mean));
        json_object_set_new(m, "sim.multi_turn.tool_latency_median_s", json_real(su->multi_turn.latency_median_s));
        json_object_set_new(m, "sim.multi_turn.tool_latency_sigma", json_real(su->multi_turn.latency_sigma));
        json_object_set_new(m, "sim.multi_turn.tool_response_tokens", json_integer(su->multi_turn.response_tokens));
        json_object_set_new(o, "multi_turn", m);
    }
    return o;
}

/* --sweep's sub-folders (rl_sweep_outputs), in sweep order (sweep()): [0] sync, [1..4] staleness
 * 0/0.1/0.3/0.5 with partial rollout on, [5..8] the same with it off, [9..11] the rollout:trainer
 * splits 1:1, 2:1, 3:1; and its files (sweep.md, sweep.dat, sweep.gp, sweep.png). */
static const double k_sweep_staleness[4] = {0, 0.1, 0.3, 0.5};
const char *sim_sweep_dir(int i) {
    const char *const *dirs, *const *files;
    int nd, nf;
    rl_sweep_outputs(&dirs, &nd, &files, &nf);
    return dirs[i];
}
static const char *sweep_file(int i) {
    const char *const *dirs, *const *files;
    int nd, nf;
    rl_sweep_outputs(&dirs, &nd, &files, &nf);
    return files[i];
}


/* One setting of the sweep, simulated into <out_dir>/<label>. rows non-NULL (--sweep --json): appends
 * the setting (label, mode, staleness, partial rollout, devices) followed by result_json's fields. */
static int run_one(sim_ctx *x, int row, rl_mode mode, double s, int partial, int n_roll_dev, int n_train,
                   sim_result *r, json_t *rows) {
    const char *label = sim_sweep_dir(row);
    rl_config rc = x->rc;
    sim_setup su = x->su;
    /* the row's keys, then the mode's rule (rl_config_set_mode: sync forces staleness 0, a sync every
     * step and no partial rollout); the trigger is the config's, whatever async_training.mode says */
    rc.async_keys.staleness_threshold = s;
    rc.async_keys.partial_rollout = partial;
    if (rl_config_set_mode(&rc, mode) != MOERL_OK) return MOERL_ERR;
    su.n_rollout_replicas = n_roll_dev / su.rollout_tp;
    su.n_trainer = n_train;
    snprintf(rc.out_dir, sizeof rc.out_dir, "%s/%s", x->rc.out_dir, label); /* claimed by claim_sweep_folders */
    log_info("simulate %s: %d rollout device%s (%d replica%s), %d trainer device%s", label, n_roll_dev,
             moerl_plural(n_roll_dev), su.n_rollout_replicas, moerl_plural(su.n_rollout_replicas), n_train,
             moerl_plural(n_train));
    x->ran = 1;
    if (sim_run(&rc, &su, x->tiny, x->train, r) != MOERL_OK) return MOERL_ERR;
    if (moerl_stop_requested()) return MOERL_ERR; /* a signal stopped it: cmd_simulate cleans up */
    if (rows) {
        json_t *o = json_object();
        json_object_set_new(o, "setting", json_string(label));
        json_object_set_new(o, "mode", json_string(mode == RL_MODE_SYNC ? "sync" : "async"));
        json_object_set_new(o, "staleness_threshold", json_real(rc.staleness_threshold));
        json_object_set_new(o, "partial_rollout", json_boolean(rc.partial_rollout));
        json_object_set_new(o, "rollout_devices", json_integer(n_roll_dev));
        json_t *res = sim_result_json(r, &su);
        json_object_update(o, res); /* the run's figures after the setting's keys */
        json_decref(res);
        json_array_append_new(rows, o);
    }
    return MOERL_OK;
}

static const char k_sweep_gp[] =
    "if (ARGC >= 2) { data = ARG1; out = ARG2 } else { data = 'sweep.dat'; out = 'sweep.png' }\n"
    "set terminal pngcairo size 1100,480 noenhanced\n"
    "set output out\n"
    "set multiplot layout 1,2 title 'moerl simulate: throughput relative to the synchronous baseline'\n"
    "set grid\nset key outside below center horizontal\n"
    "set xlabel 'staleness_threshold'\nset ylabel 'prompts/s vs sync'\nset yrange [0:*]\n"
    "plot data index 0 using 1:2 with linespoints lw 2 pt 7 title 'partial rollout on', \\\n"
    "     data index 0 using 1:3 with linespoints lw 2 pt 5 title 'partial rollout off'\n"
    "set xlabel 'rollout : trainer devices'\nset ylabel 'prompts/s vs 1:1'\nset xtics 1\n"
    "plot data index 1 using 1:2 with linespoints lw 2 pt 7 title 'throughput vs 1:1', \\\n"
    "     data index 1 using 1:3 with linespoints lw 2 pt 4 title 'rollout idle', \\\n"
    "     data index 1 using 1:4 with linespoints lw 2 pt 6 title 'trainer idle'\n"
    "unset multiplot\n";

/* Parameter versions the swept async rows make: job_plan's step count over the config's
 * async_training.trigger_parameter_sync_step, rounded down (the step loop syncs when the step count
 * is a multiple of it, so a last, shorter window makes no version; what the rows report as
 * "versions"). With one or none, no sample can be older than the weights it trains, so the staleness
 * rows cannot differ. */
static int64_t sweep_versions(const sim_ctx *x) {
    const rl_config *rc = &x->rc;
    const int64_t req = (int64_t)rc->ppo_mini_batch_size * rc->require_batches;
    const int64_t steps = rc->total_training_steps > 0 ? rc->total_training_steps
                                                       : (int64_t)rc->total_epochs * dataset_count(x->train) / req;
    const int64_t t = rc->async_keys.trigger_parameter_sync_step > 0 ? rc->async_keys.trigger_parameter_sync_step : 1;
    return steps / t;
}

/* The devices of the sweep's k:1 split of total devices (rollout devices a multiple of the replica
 * size tp): *rd rollout, *td trainer. Errors: no trainer device left. */
int sim_sweep_split(int total, int tp, int k, int *rd, int *td) {
    *rd = (int)((double)total * k / (k + 1) / tp) * tp;
    if (*rd < tp) *rd = tp;
    *td = total - *rd;
    if (*td < 1) return moerl_errorf("simulate --sweep: %d device%s leave no trainer at %d:1", total, moerl_plural(total), k);
    return MOERL_OK;
}

/* Every sub-folder the sweep writes, before the first simulation: none may hold a real run
 * (rl_sim_check_folder) or be in use; each is created, locked and marked. On error the ones this call
 * created are removed again (moerl_outdir_abandon: they hold only the marker and the lock). */
static int claim_sweep_folders(sim_ctx *x) {
    for (int i = 0; i < SIM_SWEEP_ROWS; i++) {
        char d[4200];
        snprintf(d, sizeof d, "%s/%s", x->rc.out_dir, sim_sweep_dir(i));
        if (rl_sim_claim_folder(d, &x->sub[i], NULL) != MOERL_OK) {
            for (int j = i - 1; j >= 0; j--) moerl_outdir_abandon(&x->sub[j]);
            x->n_sub = 0;
            return MOERL_ERR;
        }
        x->n_sub = i + 1;
    }
    return MOERL_OK;
}

/* The report grid (see the top of this file): writes sweep.md, sweep.dat, sweep.gp/png under the output
 * folder, and prints sweep.md on stdout — or, as_json, one JSON object: {"parameter_versions": N,
 * "warning": text or null, "rows": [...]}, a row per setting in sweep.md's order (sync, the 8 staleness
 * × partial rollout rows, the 3 rollout:trainer splits), each the setting's keys, its throughput
 * relative to its table's baseline ("vs_sync" / "vs_1_to_1", and "split" for the splits) and every
 * field of the non-sweep --json result. */
int sim_sweep(sim_ctx *x, int n_roll_dev, int n_train, int as_json) {
    const double *ss = k_sweep_staleness;
    sim_result base, r[2][4], sp[3];
    char md[16384];
    size_t o = 0;
    json_t *rows = as_json ? json_array() : NULL;
    const int64_t versions = sweep_versions(x);
    if (versions <= 1) {
        log_warn("simulate --sweep: the run makes %lld parameter version%s (trainer steps / "
                 "async_training.trigger_parameter_sync_step=%d), so no sample is generated by older weights than "
                 "the ones it trains and the staleness rows come out the same: raise trainer.total_training_steps or "
                 "lower async_training.trigger_parameter_sync_step",
                 (long long)versions, moerl_plural(versions), x->rc.async_keys.trigger_parameter_sync_step);
        o += snprintf(md + o, sizeof md - o,
                      "Warning: %lld parameter version%s in this run, so the staleness rows cannot differ.\n\n",
                      (long long)versions, moerl_plural(versions));
    }
    int rc = MOERL_ERR;
    if (claim_sweep_folders(x) != MOERL_OK) goto out;
    { /* a previous sweep's report goes now: a stopped or failed sweep must not leave a stale, complete table */
        for (size_t i = 0; i < 4; i++) {
            char f[4200];
            snprintf(f, sizeof f, "%s/%s", x->rc.out_dir, sweep_file(i));
            if (unlink(f) != 0 && errno != ENOENT) {
                moerl_errorf("simulate --sweep: cannot remove the previous sweep's %s: %s", f, strerror(errno));
                goto out;
            }
        }
    }
    if (run_one(x, 0, RL_MODE_SYNC, 0, 0, n_roll_dev, n_train, &base, rows) != MOERL_OK) goto out;
    o += snprintf(md + o, sizeof md - o,
                  "| setting | prompts/s | vs sync | gen tokens/s | trainer idle | rollout idle | max staleness | "
                  "interrupted responses |\n|---|---|---|---|---|---|---|---|\n"
                  "| sync | %.4g | 1.00x | %.4g | %.2f | %.2f | %d | %lld |\n",
                  base.prompts_per_s, base.tokens_per_s, base.trainer_idle_ratio, base.rollout_idle_ratio,
                  base.max_staleness, (long long)base.interrupted_responses);
    for (int p = 1; p >= 0; p--)
        for (int i = 0; i < 4; i++) {
            sim_result *q = &r[p][i];
            if (run_one(x, 1 + 4 * (1 - p) + i, RL_MODE_ASYNC, ss[i], p, n_roll_dev, n_train, q, rows) != MOERL_OK) goto out;
            o += snprintf(md + o, sizeof md - o, "| async s=%.1f partial %s | %.4g | %.2fx | %.4g | %.2f | %.2f | %d | %lld |\n",
                          ss[i], p ? "on" : "off", q->prompts_per_s, q->prompts_per_s / base.prompts_per_s,
                          q->tokens_per_s, q->trainer_idle_ratio, q->rollout_idle_ratio, q->max_staleness,
                          (long long)q->interrupted_responses);
        }
    /* rollout:trainer at the same total, the configured staleness and partial rollout */
    const int total = n_roll_dev + n_train, tp = x->su.rollout_tp;
    o += snprintf(md + o, sizeof md - o,
                  "\n| rollout : trainer (%d devices, staleness %.2g, partial %s) | rollout devices | trainer devices | "
                  "prompts/s | vs 1:1 | trainer idle | rollout idle |\n|---|---|---|---|---|---|---|\n",
                  total, x->rc.async_keys.staleness_threshold, x->rc.async_keys.partial_rollout ? "on" : "off");
    for (int k = 1; k <= 3; k++) {
        int rd, td;
        if (sim_sweep_split(total, tp, k, &rd, &td) != MOERL_OK) goto out; /* checked before the sweep: cannot fail */
        if (run_one(x, 8 + k, RL_MODE_ASYNC, x->rc.async_keys.staleness_threshold, x->rc.async_keys.partial_rollout,
                    rd, td, &sp[k - 1], rows) != MOERL_OK)
            goto out;
        /* too few devices for the ratio: the row says which split it ran (2 devices: 2:1 and 3:1 are 1:1) */
        char split[48];
        if (rd == k * td) snprintf(split, sizeof split, "%d:1", k);
        else snprintf(split, sizeof split, "%d:1 (nearest with %d devices: %d:%d)", k, total, rd, td);
        o += snprintf(md + o, sizeof md - o, "| %s | %d | %d | %.4g | %.2fx | %.2f | %.2f |\n", split, rd, td,
                      sp[k - 1].prompts_per_s, sp[k - 1].prompts_per_s / sp[0].prompts_per_s,
                      sp[k - 1].trainer_idle_ratio, sp[k - 1].rollout_idle_ratio);
    }
    char p[4300], dat[4300], png[4300], gp[4300];
    snprintf(p, sizeof p, "%s/sweep.md", x->rc.out_dir);
    if (moerl_write_file_atomic(p, md, o) != MOERL_OK) goto out;
    char d[4096];
    size_t n = 0;
    n += snprintf(d + n, sizeof d - n, "# staleness  partial_on/sync  partial_off/sync\n");
    for (int i = 0; i < 4; i++)
        n += snprintf(d + n, sizeof d - n, "%.2f %.6f %.6f\n", ss[i], r[1][i].prompts_per_s / base.prompts_per_s,
                      r[0][i].prompts_per_s / base.prompts_per_s);
    n += snprintf(d + n, sizeof d - n, "\n\n# rollout:trainer  vs_1:1  rollout_idle  trainer_idle\n");
    for (int k = 0; k < 3; k++)
        n += snprintf(d + n, sizeof d - n, "%d %.6f %.6f %.6f\n", k + 1, sp[k].prompts_per_s / sp[0].prompts_per_s,
                      sp[k].rollout_idle_ratio, sp[k].trainer_idle_ratio);
    snprintf(dat, sizeof dat, "%s/sweep.dat", x->rc.out_dir);
    snprintf(png, sizeof png, "%s/sweep.png", x->rc.out_dir);
    snprintf(gp, sizeof gp, "%s/sweep.gp", x->rc.out_dir);
    if (moerl_write_file_atomic(dat, d, n) != MOERL_OK) goto out;
    if (moerl_plot_script(gp, k_sweep_gp, dat, png) != MOERL_OK) log_warn("no plot: %s", moerl_last_error());
    else log_info("plot written to %s", png);
    if (as_json) {
        /* rows in run order: [0] sync, [1..8] the staleness rows, [9..11] the splits 1:1, 2:1, 3:1 */
#define PPS(i) json_number_value(json_object_get(json_array_get(rows, (i)), "prompts_per_s"))
        for (int i = 0; i < 9; i++)
            json_object_set_new(json_array_get(rows, i), "vs_sync", json_real_or_null(PPS(i) / PPS(0)));
        for (int k = 0; k < 3; k++) {
            json_t *row = json_array_get(rows, 9 + k);
            char split[16];
            snprintf(split, sizeof split, "%d:1", k + 1); /* asked for; rollout_devices, trainer_devices: ran */
            json_object_set_new(row, "split", json_string(split));
            json_object_set_new(row, "vs_1_to_1", json_real_or_null(PPS(9 + k) / PPS(9)));
        }
#undef PPS
        char warn[200];
        snprintf(warn, sizeof warn, "the run makes %lld parameter version%s, so the staleness rows cannot differ",
                 (long long)versions, moerl_plural(versions));
        json_t *j = json_object();
        json_object_set_new(j, "parameter_versions", json_integer(versions));
        json_object_set_new(j, "warning", versions <= 1 ? json_string(warn) : json_null());
        json_object_set_new(j, "rows", rows);
        rows = NULL;
        print_json_line(j, 17);
    } else {
        fwrite(md, 1, o, stdout);
    }
    rc = MOERL_OK;
out:
    if (rc != MOERL_OK && !moerl_stop_requested()) /* the claimed sub-folders no simulation wrote: removed */
        for (int i = 0; i < x->n_sub; i++) moerl_outdir_abandon(&x->sub[i]);
    json_decref(rows);
    return rc;
}

