/* A run's output folder (see run_dir.h): what `moerl rl` checks, clears and writes there, the resume
 * probe, and what `moerl simulate --sweep` leaves (so that a run can replace it). */
#include "rl/run_dir.h"
#include "rl/trainer_onebit.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdlib.h>
#include <stdio.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/outdir.h"
#include "optim/onebit_adam.h"
#include "rl/state.h"

/* moerl simulate --sweep's sub-folders, in sweep order: [0] sync, [1..4] staleness 0/0.1/0.3/0.5 with partial
 * rollout on, [5..8] the same with it off, [9..11] the rollout:trainer splits 1:1, 2:1, 3:1. */
#define SWEEP_ROWS 12
static const char *const k_sweep_dirs[SWEEP_ROWS] = {
    "sync",
    "async_s0.0_partial_on", "async_s0.1_partial_on", "async_s0.3_partial_on", "async_s0.5_partial_on",
    "async_s0.0_partial_off", "async_s0.1_partial_off", "async_s0.3_partial_off", "async_s0.5_partial_off",
    "split_1_to_1", "split_2_to_1", "split_3_to_1"};
static const char *const k_sweep_files[] = {"sweep.md", "sweep.dat", "sweep.gp", "sweep.png"};

void rl_sweep_outputs(const char *const **dirs, int *n_dirs, const char *const **files, int *n_files) {
    *dirs = k_sweep_dirs;
    *n_dirs = SWEEP_ROWS;
    *files = k_sweep_files;
    *n_files = (int)(sizeof k_sweep_files / sizeof *k_sweep_files);
}

int rl_remove_sweep_outputs(const char *dir) {
    /* what one simulation writes in its folder (sim_run: job_open_outputs, the plot; claim_folder) */
    static const char *sim_files[] = {"metrics.jsonl", "samples.jsonl", "plot.dat", "plot.gp", "reward_accuracy.png",
                                      MOERL_SIMULATION_MARKER, ".moerl.lock"};
    char p[4200], f[4400];
    for (int i = 0; i < SWEEP_ROWS; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, k_sweep_dirs[i]);
        snprintf(f, sizeof f, "%s/%s", p, MOERL_SIMULATION_MARKER);
        if (access(f, F_OK) != 0) continue; /* not the sweep's (or gone): left alone */
        if (moerl_lock_dir(p) < 0) return MOERL_ERR; /* a simulation still writing there */
        for (size_t j = 0; j < sizeof sim_files / sizeof *sim_files; j++) {
            snprintf(f, sizeof f, "%s/%s", p, sim_files[j]);
            if (unlink(f) != 0 && errno != ENOENT)
                return moerl_errorf("trainer.overwrite_output_dir: cannot delete '%s': %s", f, strerror(errno));
        }
        if (rmdir(p) != 0)
            log_warn("trainer.overwrite_output_dir: kept %s, the sweep's sub-folder: it holds files moerl simulate "
                     "does not write (%s)", p, strerror(errno));
    }
    for (size_t j = 0; j < sizeof k_sweep_files / sizeof *k_sweep_files; j++) {
        snprintf(f, sizeof f, "%s/%s", dir, k_sweep_files[j]);
        if (unlink(f) != 0 && errno != ENOENT)
            return moerl_errorf("trainer.overwrite_output_dir: cannot delete '%s': %s", f, strerror(errno));
    }
    return MOERL_OK;
}

/* On a resume the warm start is not rerun, but the frozen KL reference must still be the policy
 * RL started from: reload the warm start's checkpoint (when there was one) before the trainer
 * copies its reference; the RL checkpoint then replaces the live weights. */
int rl_restore_start_policy(const cfg *c, moe_model *m, const char *out_dir) {
    char dir[4200], f[4300];
    snprintf(dir, sizeof dir, "%s/sft_checkpoint", out_dir);
    snprintf(f, sizeof f, "%s/model.safetensors", dir);
    if (!(cfg_bool(c, "actor.use_kl_loss") || cfg_bool(c, "algorithm.use_kl_in_reward")) || access(f, R_OK) != 0)
        return MOERL_OK;
    return model_load_weights(m, dir);
}


/* What a run leaves in its output folder: folders, then files. */
static const char *k_run_dirs[] = {"checkpoint", "checkpoint.old", "checkpoint.tmp", "sft_checkpoint"};
static const char *k_run_files[] = {"metrics.jsonl", "samples.jsonl", "sft_metrics.jsonl", "plot.dat", "plot.gp",
                                    "reward_accuracy.png"};

/* trainer.overwrite_output_dir=true: the previous run's entries are moved into this hidden sub-folder
 * (renames, nothing copied) once every check has passed, and removed once the new run has written its
 * config.yaml and run.log; a crash in between leaves them there, whole. */
#define PREVIOUS_RUN ".moerl.previous"

static int nonempty(const char *dir, const char *name) {
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && st.st_size > 0;
}

static int exists_in(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* trainer.resume_mode=auto and no RL checkpoint: the run starts RL anew (after a warm start it resumes,
 * when sft_checkpoint/ is there) and would replace the logs of a run stopped without a checkpoint
 * (trainer.save_freq=-1) — refused as resume_mode=disable refuses it, naming the files. */
static int check_logs_without_checkpoint(const char *dir) {
    if (exists_in(dir, PREVIOUS_RUN))
        return moerl_errorf("output folder '%s' holds " PREVIOUS_RUN "/, the previous run an overwrite set aside and "
                            "was interrupted before it deleted it: to keep that run, move the contents of %s/"
                            PREVIOUS_RUN " back into %s (then resume); to replace it, set trainer.resume_mode=disable "
                            "trainer.overwrite_output_dir=true; or choose another trainer.default_local_dir",
                            dir, dir, dir);
    const int warm = exists_in(dir, "sft_checkpoint") || exists_in(dir, "sft_checkpoint.old");
    static const char *logs[] = {"metrics.jsonl", "samples.jsonl", "sft_metrics.jsonl"};
    char found[300] = "";
    for (int i = 0; i < 3; i++) {
        const int has = i == 2 ? !warm && nonempty(dir, logs[i]) /* a warm start with a checkpoint resumes */
                               : nonempty(dir, logs[i]);
        if (has) snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", found[0] ? ", " : "", logs[i]);
    }
    if (!found[0]) return MOERL_OK;
    return moerl_errorf("output folder '%s' holds a run's logs (%s) but no checkpoint to resume (stopped before one "
                        "was written, or trainer.save_freq=-1): trainer.resume_mode=auto would start anew and replace "
                        "them; replace that run with trainer.resume_mode=disable trainer.overwrite_output_dir=true, or "
                        "choose another trainer.default_local_dir", dir, found);
}

/* Before any work (nothing is written): the output folder must not hold a file where moerl keeps
 * a folder, and resume_mode=disable must not silently replace a run that is there. */
int rl_check_out_dir(const cfg *c, const rl_config *rc) {
    const int overwrite = cfg_bool(c, "trainer.overwrite_output_dir");
    if (overwrite && rc->resume_auto)
        return moerl_errorf("trainer.overwrite_output_dir=true starts anew, but trainer.resume_mode=auto continues "
                            "the folder's run: set trainer.resume_mode=disable to start anew, or drop "
                            "trainer.overwrite_output_dir to continue");
    if (moerl_outdir_check_subdirs(rc->out_dir, k_run_dirs, 4) != MOERL_OK) return MOERL_ERR;
    char sim[4200];
    snprintf(sim, sizeof sim, "%s/%s", rc->out_dir, MOERL_SIMULATION_MARKER);
    if (!overwrite && access(sim, F_OK) == 0)
        return moerl_errorf("output folder '%s' holds a simulation (%s, written by moerl simulate): a run would "
                            "overwrite its metrics.jsonl and samples.jsonl; choose another trainer.default_local_dir, "
                            "or replace it with trainer.resume_mode=disable trainer.overwrite_output_dir=true",
                            rc->out_dir, MOERL_SIMULATION_MARKER);
    if (rc->resume_auto) { /* the resume reads checkpoint/: it must be an RL run's (job_load_checkpoint checks again) */
        char st[4200], st_old[4200], w[4200], idx[4200];
        snprintf(st, sizeof st, "%s/checkpoint/trainer_state.json", rc->out_dir);
        snprintf(st_old, sizeof st_old, "%s/checkpoint.old/trainer_state.json", rc->out_dir);
        snprintf(w, sizeof w, "%s/checkpoint/model.safetensors", rc->out_dir);
        snprintf(idx, sizeof idx, "%s/checkpoint/model.safetensors.index.json", rc->out_dir);
        if (access(st, F_OK) != 0 && access(st_old, F_OK) != 0 && (access(w, F_OK) == 0 || access(idx, F_OK) == 0))
            return moerl_errorf("%s/checkpoint holds a checkpoint without trainer_state.json (a moerl sft run, or a "
                                "copied model?), not an RL run to resume: use another trainer.default_local_dir "
                                "(model.path can point at that checkpoint), or set trainer.resume_mode=disable "
                                "trainer.overwrite_output_dir=true to replace it", rc->out_dir);
    }
    if (rc->resume_auto && !rl_run_dir_resuming(rc)) return check_logs_without_checkpoint(rc->out_dir);
    if (rc->resume_auto || overwrite) return MOERL_OK;
    char found[600] = "";
    for (int i = 0; i < 4 + 6 + 1; i++) {
        const char *name = i < 4 ? k_run_dirs[i] : i < 10 ? k_run_files[i - 4] : PREVIOUS_RUN;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", rc->out_dir, name);
        if (access(p, F_OK) == 0 && strlen(found) + strlen(name) + 3 < sizeof found)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", found[0] ? ", " : "", name);
    }
    if (found[0])
        return moerl_errorf("output folder '%s' holds a run (%s) and trainer.resume_mode=disable would replace it: "
                            "continue it with trainer.resume_mode=auto, start anew there (deleting it) with "
                            "trainer.overwrite_output_dir=true, or choose another trainer.default_local_dir",
                            rc->out_dir, found);
    return MOERL_OK;
}

/* trainer.overwrite_output_dir=true: the previous run's entries are moved into this hidden sub-folder
 * (renames, nothing copied) once every check has passed, and removed once the new run has written its
 * config.yaml and run.log; a crash in between leaves them there, whole. */
static const char *k_run_other[] = {"run.log", "config.yaml", MOERL_SIMULATION_MARKER};

static int rm_tree_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Files under p (1 for a file). */
static int count_files(const char *p) {
    struct stat st;
    if (lstat(p, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) return 1;
    DIR *d = opendir(p);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    char f[4500];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(f, sizeof f, "%s/%s", p, e->d_name);
        n += count_files(f);
    }
    closedir(d);
    return n;
}

/* Move dir/name into dir/PREVIOUS_RUN when it exists, noting it in *s. */
static int set_aside(const char *dir, const char *name, rl_set_aside *s) {
    char from[4200], to[4300];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    snprintf(to, sizeof to, "%s/" PREVIOUS_RUN "/%s", dir, name);
    struct stat st;
    if (lstat(from, &st) != 0) return MOERL_OK;
    const int files = count_files(from);
    if (rename(from, to) != 0)
        return moerl_errorf("trainer.overwrite_output_dir: cannot move '%s' to '%s': %s", from, to, strerror(errno));
    s->n_files += files;
    s->n_entries++;
    const size_t len = strlen(s->names);
    if (len + strlen(name) + 24 < sizeof s->names)
        snprintf(s->names + len, sizeof s->names - len, "%s%s%s", len ? ", " : "", name,
                 S_ISDIR(st.st_mode) ? "/" : "");
    return MOERL_OK;
}

int rl_set_aside_previous_run(const char *dir, rl_set_aside *s) {
    memset(s, 0, sizeof *s);
    char p[4200];
    snprintf(p, sizeof p, "%s/" PREVIOUS_RUN, dir);
    struct stat st;
    if (lstat(p, &st) == 0) { /* an older run an interrupted overwrite set aside: the user replaced it then */
        log_warn("trainer.overwrite_output_dir: removing %s (%d file%s), the run an interrupted overwrite set aside",
                 p, count_files(p), moerl_plural(count_files(p)));
        nftw(p, rm_tree_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    snprintf(p, sizeof p, "%s/%s", dir, MOERL_SIMULATION_MARKER);
    if (access(p, F_OK) == 0 && rl_remove_sweep_outputs(dir) != MOERL_OK) return MOERL_ERR; /* a simulate --sweep's */
    snprintf(p, sizeof p, "%s/" PREVIOUS_RUN, dir);
    if (mkdir(p, 0755) != 0)
        return moerl_errorf("trainer.overwrite_output_dir: cannot create '%s': %s", p, strerror(errno));
    for (int i = 0; i < 4 + 6 + 3; i++) {
        const char *name = i < 4 ? k_run_dirs[i] : i < 10 ? k_run_files[i - 4] : k_run_other[i - 10];
        if (set_aside(dir, name, s) != MOERL_OK) {
            char *msg = xstrdup(moerl_last_error());
            rl_restore_previous_run(dir);
            moerl_errorf("%s", msg);
            free(msg);
            return MOERL_ERR;
        }
    }
    if (s->n_entries == 0) rmdir(p); /* nothing was there: nothing to say later */
    return MOERL_OK;
}

void rl_restore_previous_run(const char *dir) {
    char p[4200], from[4500], to[4500];
    snprintf(p, sizeof p, "%s/" PREVIOUS_RUN, dir);
    DIR *d = opendir(p);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(from, sizeof from, "%s/%s", p, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dir, e->d_name);
        if (access(to, F_OK) == 0) unlink(to); /* what the new run wrote (config.yaml) gives way to the old */
        if (rename(from, to) != 0)
            log_warn("trainer.overwrite_output_dir: could not move %s back to %s (%s): it stays in %s", from, to,
                     strerror(errno), p);
    }
    closedir(d);
    rmdir(p);
}

int rl_drop_previous_run(const char *dir, const rl_set_aside *s) {
    if (s->n_entries == 0) return MOERL_OK;
    char p[4200];
    snprintf(p, sizeof p, "%s/" PREVIOUS_RUN, dir);
    if (nftw(p, rm_tree_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return moerl_errorf("trainer.overwrite_output_dir: cannot delete '%s' (the previous run, set aside): %s", p,
                            strerror(errno));
    log_info("trainer.overwrite_output_dir: deleted the previous run in %s: %s (%d file%s)", dir, s->names, s->n_files,
             moerl_plural(s->n_files));
    return MOERL_OK;
}

/* The run's log lines (of this process: trainer rank 0 under mpirun) are also appended to
 * out_dir/run.log, so a run's record survives a terminal or an mpirun that stops forwarding. */
static int rl_open_run_log(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/run.log", dir);
    return log_set_file(p);
}

/* A resume (trainer.resume_mode=auto and a trainer_state.json in checkpoint/ or checkpoint.old/)
 * must be of this training data and seed and of this model's shapes: checked here, before config.yaml
 * or the generated data are written, with the same rules the job applies when it loads the checkpoint
 * (rl_state_load, model_load_weights). A folder holding a warm start (sft_checkpoint/) and no RL
 * checkpoint is refused when sft.total_training_steps=0 would leave it unused. */
int rl_check_resume_state(const cfg *c, const rl_config *rc, const dataset *train, moe_model *m) {
    if (!rc->resume_auto) return MOERL_OK;
    char p[4200], dir[4200];
    snprintf(dir, sizeof dir, "%s/checkpoint", rc->out_dir);
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    if (access(p, R_OK) != 0) {
        snprintf(dir, sizeof dir, "%s/checkpoint.old", rc->out_dir);
        snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    }
    if (access(p, R_OK) != 0) { /* no RL checkpoint: RL starts anew, after the warm start */
        char ws[4200];
        snprintf(ws, sizeof ws, "%s/sft_checkpoint", rc->out_dir);
        if (cfg_int(c, "sft.total_training_steps") <= 0 && access(ws, F_OK) == 0)
            return moerl_errorf("output folder '%s' holds the SFT warm start of a moerl rl run (sft_checkpoint/) and no "
                                "RL checkpoint, but sft.total_training_steps=%lld would start RL from the new model and "
                                "leave that warm start unused: rerun with the run's sft.total_training_steps (its "
                                "config.yaml records it) to continue the warm start, or replace the run with "
                                "trainer.resume_mode=disable trainer.overwrite_output_dir=true",
                                rc->out_dir, (long long)cfg_int(c, "sft.total_training_steps"));
        return MOERL_OK;
    }
    const rl_state_expect want = {.n_rows = dataset_count(train), .seed = rc->seed,
                                  .data_fingerprint = dataset_fingerprint(train),
                                  .optimizer = optim_name_str((optim_name)rc->optim_name),
                                  .optimizer_freeze_step = rc->optim_name == OPTIM_ONEBIT_ADAM ? rc->optim_freeze_step : 0,
                                  .optimizer_var_update_interval =
                                      rc->optim_name == OPTIM_ONEBIT_ADAM ? rc->optim_var_update_interval : 0};
    rl_state st;
    int r = rl_state_load(&st, p, &want);
    rl_state_free(&st);
    if (r != MOERL_OK) return data_name_changed_keys(c, rc->out_dir);
    /* the job loads the checkpoint's weights into this model: the same checks, reading nothing */
    if (model_check_weights(m, dir) != MOERL_OK)
        return moerl_errorf("%s; resuming needs the checkpoint's model: keep its model.* values (or set model.path), or "
                            "use a new trainer.default_local_dir, or trainer.resume_mode=disable "
                            "trainer.overwrite_output_dir=true", moerl_last_error());
    /* 1-bit Adam's error feedback is per trainer rank: the job's load refuses another rank count, so refuse
     * it here, before the folder changes */
    snprintf(p, sizeof p, "%s/onebit_adam.safetensors", dir);
    if (rc->optim_name == OPTIM_ONEBIT_ADAM && access(p, R_OK) == 0 &&
        trainer_onebit_check(p, m->n_params, rc->n_trainer_ranks > 0 ? rc->n_trainer_ranks : 1) != MOERL_OK)
        return MOERL_ERR;
    return MOERL_OK;
}

/* What a run writes into its folder once every check has passed — the generated data, config.yaml and
 * run.log — once (done), so that a refused resume leaves the folder as it was. A warm start being
 * resumed has checks of its own (sft_checkpoint/'s data, seed and batch size, inside sft_train): the
 * writes then wait for them (sft_warm_start's on_checked). */

int rl_write_outputs(void *arg) {
    rl_outputs *w = arg;
    if (w->done) return MOERL_OK;
    char path[4200];
    rl_set_aside prev = {0};
    if (w->overwrite && rl_set_aside_previous_run(w->out_dir, &prev) != MOERL_OK) return MOERL_ERR;
    snprintf(path, sizeof path, "%s/config.yaml", w->out_dir);
    if (data_staged_commit(w->staged) != MOERL_OK || cfg_dump_yaml(w->c, path) != MOERL_OK ||
        rl_open_run_log(w->out_dir) != MOERL_OK) {
        if (prev.n_entries) rl_restore_previous_run(w->out_dir); /* the old run back in place, as it was */
        return MOERL_ERR;
    }
    w->done = 1;
    return rl_drop_previous_run(w->out_dir, &prev);
}

int rl_run_dir_resuming(const rl_config *rc) {
    if (!rc->resume_auto) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/checkpoint/trainer_state.json", rc->out_dir);
    if (access(path, R_OK) == 0) return 1;
    snprintf(path, sizeof path, "%s/checkpoint.old/trainer_state.json", rc->out_dir);
    return access(path, R_OK) == 0;
}

/* A simulation writes metrics.jsonl, samples.jsonl and plots into its folder like a run, so never into
 * a real run's: a checkpoint there means moerl rl / sft wrote it (a simulation writes none). Then
 * the folder is made and locked for this process (a live run's lock refuses it). */
int rl_sim_check_folder(const char *dir) {
    static const char *real[] = {"checkpoint", "checkpoint.old", "sft_checkpoint", "run.log"};
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return moerl_errorf("%s is a file, not a folder: give the simulation another trainer.default_local_dir", dir);
    for (int i = 0; i < 4; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, real[i]);
        if (stat(p, &st) == 0)
            return moerl_errorf("%s holds a real run (%s): a simulation would overwrite its metrics.jsonl "
                                "and samples.jsonl; give the simulation its own folder "
                                "(trainer.default_local_dir=...)",
                                dir, real[i]);
    }
    return MOERL_OK;
}

/* rl_sim_check_folder, then create and lock dir and write its marker; *marker_new (may be NULL) = the marker
 * was not there before. */
int rl_sim_claim_folder(const char *dir, moerl_outdir *od, int *marker_new) {
    if (rl_sim_check_folder(dir) != MOERL_OK) return MOERL_ERR;
    if (moerl_outdir_open(od, dir) != MOERL_OK) return MOERL_ERR;
    char m[4200];
    snprintf(m, sizeof m, "%s/%s", dir, MOERL_SIMULATION_MARKER);
    if (marker_new) *marker_new = access(m, F_OK) != 0;
    static const char note[] = "written by moerl simulate: this folder holds a simulation, not a run "
                               "(moerl rl refuses it unless trainer.overwrite_output_dir=true)\n";
    return moerl_write_file_atomic(m, note, sizeof note - 1);
}
