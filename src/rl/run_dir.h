/* The output folder of `moerl rl` (trainer.default_local_dir): the checks before any work, the
 * previous run's outputs deleted by trainer.overwrite_output_dir, the resume probe and its checks, and
 * what a run writes once every check has passed. Also what `moerl simulate --sweep` leaves there. */
#ifndef MOERL_RL_RUN_DIR_H
#define MOERL_RL_RUN_DIR_H

#include "base/config.h"
#include "base/outdir.h"
#include "data/data_config.h"
#include "data/dataset.h"
#include "model/model.h"
#include "rl/rl.h"

/* Before any work (nothing is written): the output folder must not hold a file where moerl keeps a
 * folder, nor a simulation (unless trainer.overwrite_output_dir), and resume_mode=disable must not
 * silently replace a run that is there, nor resume_mode=auto when the folder holds a run's logs
 * (metrics.jsonl, samples.jsonl, a warm start's sft_metrics.jsonl without sft_checkpoint/; non-empty)
 * or a set-aside .moerl.previous but no RL checkpoint (it would start anew over them);
 * trainer.overwrite_output_dir=true with resume_mode=auto is refused; a resume must find an RL run's
 * checkpoint (not a moerl sft one). Errors name the folder,
 * what it holds and the keys that would work. */
int rl_check_out_dir(const cfg *c, const rl_config *rc);
/* What rl_set_aside_previous_run moved: the entries (names, "checkpoint/, metrics.jsonl, ..."; folders
 * end in '/') and the files in them. */
typedef struct {
    int n_entries, n_files;
    char names[600];
} rl_set_aside;
/* trainer.overwrite_output_dir=true, every check passed (the folder locked): move the previous run's
 * checkpoints, metrics, plots, run.log, config.yaml and a simulation's marker into dir/.moerl.previous
 * (renames: nothing is deleted yet), so nothing of it mixes with the new run. A .moerl.previous an
 * interrupted overwrite left is deleted first (warned); a simulate --sweep's sub-folders are deleted
 * (rl_remove_sweep_outputs). The generated task data (data/) is kept. *s: what moved (n_entries 0:
 * nothing was there, and no folder is left). Errors name the entry that cannot be moved (those moved
 * already go back). */
int rl_set_aside_previous_run(const char *dir, rl_set_aside *s);
/* Move everything in dir/.moerl.previous back into dir (replacing what the new run wrote there), then
 * remove the empty folder: a new run that failed before it started writing leaves the old one whole.
 * Entries that cannot move back are named in a warning and stay in .moerl.previous. */
void rl_restore_previous_run(const char *dir);
/* Once the new run has started writing: delete dir/.moerl.previous and log what was deleted (names and
 * the file count) — nothing is logged when s->n_entries is 0. Errors name the folder. */
int rl_drop_previous_run(const char *dir, const rl_set_aside *s);
/* 1 when the run resumes RL: trainer.resume_mode=auto and a trainer_state.json in checkpoint/ or
 * checkpoint.old/ of rc->out_dir. */
int rl_run_dir_resuming(const rl_config *rc);
/* A resume (rl_run_dir_resuming) must be of this training data and seed (rl_state_load's rules; the
 * data.* keys that changed are named, data_name_changed_keys) and of this model's shapes
 * (model_check_weights), checked before anything is written. A folder holding a warm start
 * (sft_checkpoint/) and no RL checkpoint is refused when sft.total_training_steps=0 would leave it
 * unused. */
int rl_check_resume_state(const cfg *c, const rl_config *rc, const dataset *train, moe_model *m);
/* On a resume the warm start is not rerun, but the frozen KL reference must still be the policy RL
 * started from: reload the warm start's checkpoint (when actor.use_kl_loss and there was one) before
 * the trainer copies its reference; the RL checkpoint then replaces the live weights. */
int rl_restore_start_policy(const cfg *c, moe_model *m, const char *out_dir);

/* What a run writes into its folder once every check has passed — the staged generated data,
 * config.yaml and run.log (the log lines of this process are appended there too) — once (done), so
 * that a refused resume leaves the folder as it was. A warm start being resumed has checks of its own:
 * the writes then wait for them (sft_warm_start's on_checked). */
typedef struct {
    const cfg *c;
    const char *out_dir;
    data_staged *staged;
    int overwrite; /* trainer.overwrite_output_dir: the previous run is set aside first and deleted after */
    int done;
} rl_outputs;
/* rl_outputs *arg: write them (once; later calls do nothing). With overwrite, the previous run is set
 * aside before (rl_set_aside_previous_run), moved back when a write fails, and deleted once config.yaml
 * and run.log are written (rl_drop_previous_run). Errors name the file. */
int rl_write_outputs(void *arg);

/* What `moerl simulate --sweep` writes under its output folder: n_dirs sub-folders (one simulation
 * each, sweep order: sync, the 8 staleness × partial rollout rows, the 3 rollout:trainer splits)
 * and n_files files (sweep.md, sweep.dat, sweep.gp, sweep.png). Static names, not to be freed. */
void rl_sweep_outputs(const char *const **dirs, int *n_dirs, const char *const **files, int *n_files);
/* trainer.overwrite_output_dir=true over a sweep's folder (dir holds MOERL_SIMULATION_MARKER): delete
 * the sweep's files and every sweep sub-folder that holds a simulation's marker — only the files a
 * simulation writes there; a sub-folder holding anything else is kept and named in a warning.
 * Errors: a sub-folder in use by another moerl process (its lock), a file that cannot be deleted. */
int rl_remove_sweep_outputs(const char *dir);
/* A simulation's folder (moerl simulate): it writes metrics.jsonl, samples.jsonl and plots like a
 * run, so never into a real run's — a checkpoint or run.log there means moerl rl / sft wrote it (a
 * simulation writes none); dir a file is refused too. Errors name the folder and what it holds. */
int rl_sim_check_folder(const char *dir);
/* rl_sim_check_folder, then create and lock dir (moerl_outdir_open into od) and write its
 * MOERL_SIMULATION_MARKER; *marker_new (may be NULL) = the marker was not there before. */
int rl_sim_claim_folder(const char *dir, moerl_outdir *od, int *marker_new);

#endif
