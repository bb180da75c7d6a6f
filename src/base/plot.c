#include "base/plot.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"

extern char **environ;

/* The script reads its files from ARG1/ARG2 (gnuplot -c), or plot.dat / reward_accuracy.png in the
 * current folder when run as `gnuplot plot.gp` (ARGC is 0 then). Nothing in it depends on the
 * paths, so it is the same text for every run. */
static const char k_script[] =
    "# moerl: train reward and held-out accuracy of an RL run, per parameter version.\n"
    "#   cd <run folder> && gnuplot plot.gp    reads plot.dat, writes reward_accuracy.png\n"
    "#   gnuplot -c plot.gp DATA PNG           any files\n"
    "if (ARGC >= 2) { data = ARG1; out = ARG2 } else { data = 'plot.dat'; out = 'reward_accuracy.png' }\n"
    "set terminal pngcairo size 900,560 noenhanced\n"
    "set output out\n"
    "set xlabel 'parameter version'\n"
    "set ylabel 'reward / accuracy'\n"
    "set yrange [*<0:1.05<*]\n"
    "set grid\n"
    "# the legend goes below the plot area, so it never covers a curve\n"
    "set key outside below center horizontal\n"
    "set datafile missing 'nan'\n"
    "plot data using 1:2 with lines lw 1.5 title 'train reward (mean)', \\\n"
    "     data using 1:3 with linespoints lw 2 pt 7 title 'held-out accuracy (greedy)'\n";

/* "./path" for a relative path, so gnuplot never reads a leading '<', '|', '-', '+' or '~' as a
 * pipe, stdin or a pseudo-file. */
static int argv_path(char *dst, size_t cap, const char *path) {
    int n = snprintf(dst, cap, "%s%s", path[0] == '/' ? "" : "./", path);
    if (n < 0 || (size_t)n >= cap) return moerl_errorf("plot: path too long: '%.200s...'", path);
    return MOERL_OK;
}

/* Run argv[0] (searched in PATH) with stdin and stdout on /dev/null and stderr into err[cap].
 * Returns the exit status (0..255), 127 when the program is not found, or -1 (message set). */
static int run_capture(char *const argv[], char *err, size_t cap) {
    int pfd[2];
    err[0] = 0;
    if (pipe2(pfd, O_CLOEXEC) != 0) return moerl_errorf("plot: pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (rc != 0) {
        close(pfd[0]);
        if (rc == ENOENT) return 127;
        return moerl_errorf("plot: cannot start %s: %s", argv[0], strerror(rc));
    }
    size_t used = 0;
    char buf[512];
    for (;;) { /* read to EOF (keeping the first cap-1 bytes) so the child never blocks on a full pipe */
        ssize_t k = read(pfd[0], buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        size_t take = MOERL_MIN((size_t)k, cap - 1 - used);
        memcpy(err + used, buf, take);
        used += take;
    }
    err[used] = 0;
    close(pfd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return moerl_errorf("plot: waitpid: %s", strerror(errno));
    if (WIFSIGNALED(st)) return moerl_errorf("plot: %s was killed by signal %d", argv[0], WTERMSIG(st));
    return WEXITSTATUS(st);
}

/* gnuplot's stderr as one line: every run of whitespace becomes one space, none at the ends. */
static void one_line(char *s) {
    size_t o = 0;
    for (size_t i = 0; s[i]; i++) {
        int sp = s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t';
        if (sp && (o == 0 || s[o - 1] == ' ')) continue;
        s[o++] = sp ? ' ' : s[i];
    }
    while (o > 0 && s[o - 1] == ' ') o--;
    s[o] = 0;
}

static int plot_impl(const char *out_dir, const char *data_path, const char *png_path) {
    char gp[4200];
    if (snprintf(gp, sizeof gp, "%s/plot.gp", out_dir) >= (int)sizeof gp)
        return moerl_errorf("plot: output folder path too long");
    return moerl_plot_script(gp, k_script, data_path, png_path);
}

int moerl_plot_script(const char *gp, const char *script, const char *data_path, const char *png_path) {
    char gp_arg[4300], dat_arg[4300], tmp[4200], tmp_arg[4300];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d.png", png_path, (int)getpid()) >= (int)sizeof tmp)
        return moerl_errorf("plot: PNG path too long");
    if (argv_path(gp_arg, sizeof gp_arg, gp) || argv_path(dat_arg, sizeof dat_arg, data_path) ||
        argv_path(tmp_arg, sizeof tmp_arg, tmp))
        return MOERL_ERR;
    struct stat st;
    if (stat(data_path, &st) != 0) return moerl_errorf("no data file '%s': %s", data_path, strerror(errno));
    if (moerl_write_file_atomic(gp, script, strlen(script)) != MOERL_OK) return moerl_error_prefix("plot: ");
    char *const argv[] = {"gnuplot", "-c", gp_arg, dat_arg, tmp_arg, NULL};
    char err[1024];
    int rc = run_capture(argv, err, sizeof err);
    if (rc < 0) return MOERL_ERR;
    if (rc == 127) return moerl_errorf("gnuplot is not installed (apt-get install gnuplot-nox)");
    one_line(err);
    if (rc != 0 || stat(tmp, &st) != 0 || st.st_size == 0) {
        unlink(tmp);
        return moerl_errorf("gnuplot failed (exit %d)%s%s", rc, err[0] ? ": " : "", err);
    }
    if (rename(tmp, png_path) != 0) {
        int e = errno;
        unlink(tmp);
        return moerl_errorf("plot: cannot rename '%s' to '%s': %s", tmp, png_path, strerror(e));
    }
    return MOERL_OK;
}

int moerl_plot_reward_accuracy(const char *out_dir, const char *data_path, const char *png_path) {
    if (plot_impl(out_dir, data_path, png_path) != MOERL_OK) {
        log_warn("no plot: %s (the data is in %s)", moerl_last_error(), data_path);
        return MOERL_ERR;
    }
    log_info("plot written to %s", png_path);
    return MOERL_OK;
}
