/* moerl — the reward/accuracy plot of an RL run, drawn by gnuplot WITHOUT a shell.
 *
 * The data file has one point per line, "<version> <train reward> <held-out accuracy>", with "nan"
 * where a series has no point (the RL job writes plot.dat in this form). The plot is made by
 * running gnuplot directly (posix_spawnp: no /bin/sh, no system()), with the script file, the data
 * file and the output file passed as separate argv entries that the script reads as the gnuplot
 * variables ARG1 and ARG2 (`gnuplot -c plot.gp DATA PNG`). No path is ever spliced into gnuplot
 * or shell text, so an output folder whose name holds quotes, spaces, `$(...)` or backquotes is
 * just a name. Relative paths are passed as "./path", so a name that gnuplot would read as a
 * pipe ('<cmd' as data, '|cmd' as output), as stdin ('-') or as a pseudo-file ('+') is a plain
 * file too.
 */
#ifndef MOERL_PLOT_H
#define MOERL_PLOT_H

/* Write out_dir/plot.gp (a gnuplot script; `cd out_dir && gnuplot plot.gp` redraws the plot from
 * plot.dat, or `gnuplot -c plot.gp DATA PNG` from any files) and run gnuplot on data_path to make
 * png_path: x = parameter version, y = train reward (mean, line) and held-out accuracy (greedy,
 * points), y range [0, 1.05], legend below the plot so it never covers the curves. The PNG is
 * written to a temporary name and renamed, so a failed draw leaves no half-written image.
 * Logs "plot written to <png>" on success and one warning otherwise (gnuplot not installed,
 * or gnuplot's own error text), and returns MOERL_OK / MOERL_ERR (with moerl_last_error() set).
 * A missing plot is never fatal to a run: callers log and continue. Paths ≤ 4000 bytes. */
int moerl_plot_reward_accuracy(const char *out_dir, const char *data_path, const char *png_path);

/* Any plot the same way: write `script` (gnuplot text reading ARG1 = data, ARG2 = output PNG) to
 * script_path, run `gnuplot -c script_path DATA PNG` without a shell, PNG written atomically.
 * MOERL_OK, or MOERL_ERR with the message (gnuplot missing, its error text); logs nothing.
 * (moerl simulate's sweep plot.) */
int moerl_plot_script(const char *script_path, const char *script, const char *data_path, const char *png_path);

#endif
