/* The output folder of a run (rl, sft, simulate): created and locked, removed again after a refused
 * start, and the MPI launcher's world read from the environment (usable before MPI_Init). */
#ifndef MOERL_OUTDIR_H
#define MOERL_OUTDIR_H

/* The file `moerl simulate` leaves in every folder it writes (metrics.jsonl, samples.jsonl and plots
 * like a run's): `moerl rl` refuses such a folder unless told to overwrite it, and simulate refuses a
 * folder holding a real run (its checkpoints or its run.log, which a simulation never writes). */
#define MOERL_SIMULATION_MARKER "SIMULATION"

typedef struct {
    char dir[4096];
    char top[4096]; /* the highest folder this run created ("" when dir existed already) */
} moerl_outdir;

/* Each `names[i]` (n of them) inside dir must be a folder when it exists: a file there (e.g. a
 * stray file named `checkpoint`) is an error naming it and what to do, found before any work. */
int moerl_outdir_check_subdirs(const char *dir, const char *const *names, int n);
/* Create dir (with parents) and lock it for this process (moerl_lock_dir), remembering which
 * folders this call created. Errors: path too long, as moerl_mkdirs / moerl_lock_dir. */
int moerl_outdir_open(moerl_outdir *o, const char *dir);
/* After a failure before the run produced anything: when moerl_outdir_open created the folder and
 * it holds nothing but what setting up wrote (.moerl.lock, config.yaml, generated data/, run.log,
 * the simulation marker), remove it and the parents it created, so a failed start leaves nothing
 * behind. Otherwise leave it alone. */
void moerl_outdir_abandon(const moerl_outdir *o);
/* After a run stopped by a signal: remove o->top (the highest folder moerl_outdir_open created) with
 * everything in it. Returns 1 when it removed a folder, 0 when moerl_outdir_open created none (the
 * folder existed before: left alone). */
int moerl_outdir_remove(const moerl_outdir *o);

/* The world size an MPI launcher gave this process (Open MPI, MPICH/Intel MPI hydra, MVAPICH) and
 * its rank in *rank, read from the launcher's environment (no MPI call: usable before MPI_Init);
 * size 1 and rank 0 when not launched by one. */
int moerl_launcher_world(int *rank);

#endif
