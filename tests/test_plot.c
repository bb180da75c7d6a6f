/* Tests for base/plot: the reward/accuracy PNG is drawn by gnuplot without a shell, so output
 * folders whose names hold quotes, spaces, $(...), backquotes, or a leading '<' / '|' / '-'
 * (gnuplot's pipe, stdin and option spellings) work and run nothing; without gnuplot the call
 * fails with a clear message and no crash. No numeric tolerances. */
#include <errno.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/plot.h"
#include "test.h"

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static int exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

static int is_png(const char *p) {
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    unsigned char h[8] = {0};
    size_t n = fread(h, 1, 8, f);
    fclose(f);
    return n == 8 && !memcmp(h, "\x89PNG\r\n\x1a\n", 8);
}

/* Names that a shell or gnuplot would act on if a path were ever spliced into command text. */
static const char *k_names[] = {
    "it's a \"run\" $(touch pwned1) `touch pwned2`",
    "<touch pwned3",
    "|touch pwned4",
    "-e system('touch pwned5')",
    "a; touch pwned6 &&",
};
#define N_NAMES (int)(sizeof k_names / sizeof k_names[0])

static void write_data(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/plot.dat", dir);
    FILE *f = fopen(p, "w");
    if (!f) { perror(p); exit(2); }
    fprintf(f, "0 nan 0.1\n1 0.2 nan\n2 0.35 nan\n3 0.5 nan\n4 0.55 0.4\n5 0.7 nan\n6 0.8 0.6\n");
    fclose(f);
}

static int no_pwned(const char *where) {
    char p[4400];
    int ok = 1;
    for (int i = 1; i <= N_NAMES + 1; i++) {
        snprintf(p, sizeof p, "%s/pwned%d", where, i);
        if (exists(p)) {
            fprintf(stderr, "a command ran: '%s' exists\n", p);
            ok = 0;
        }
    }
    return ok;
}

static int have_gnuplot(void) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char *dup = xstrdup(path), *save = NULL;
    int found = 0;
    for (char *d = strtok_r(dup, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char p[4200];
        snprintf(p, sizeof p, "%s/gnuplot", d);
        found = access(p, X_OK) == 0;
    }
    free(dup);
    return found;
}

int main(void) {
    char base[] = "/tmp/moerl_test_plot_XXXXXX";
    if (!mkdtemp(base)) { perror("mkdtemp"); return 2; }
    char cwd0[4096];
    if (!getcwd(cwd0, sizeof cwd0) || chdir(base) != 0) { perror("chdir"); return 2; }
    log_set_level(LOG_WARN);

    if (have_gnuplot()) {
        for (int i = 0; i < N_NAMES; i++) {
            /* relative (the "./" guard) and absolute paths */
            for (int absolute = 0; absolute < 2; absolute++) {
                char dir[4200], dat[4300], png[4300], gp[4300];
                snprintf(dir, sizeof dir, "%s%s%s", absolute ? base : "", absolute ? "/abs " : "", k_names[i]);
                CHECK(moerl_mkdirs(dir) == MOERL_OK, "%s", moerl_last_error());
                write_data(dir);
                snprintf(dat, sizeof dat, "%s/plot.dat", dir);
                snprintf(png, sizeof png, "%s/reward_accuracy.png", dir);
                snprintf(gp, sizeof gp, "%s/plot.gp", dir);
                int rc = moerl_plot_reward_accuracy(dir, dat, png);
                CHECK(rc == MOERL_OK, "folder '%s': %s", dir, moerl_last_error());
                CHECK(is_png(png), "folder '%s': no PNG at '%s'", dir, png);
                CHECK(exists(gp), "folder '%s': no plot.gp", dir);
                CHECK(no_pwned(base) && no_pwned(dir), "folder '%s'", dir);
            }
        }
        /* the legend sits outside (below) the plot area, not over the curves */
        char *txt = NULL;
        char gp[4300];
        snprintf(gp, sizeof gp, "%s/plot.gp", k_names[0]);
        CHECK(moerl_read_file(gp, &txt, NULL) == MOERL_OK && strstr(txt, "set key outside below"), "legend");
        free(txt);
        /* a missing data file: an error naming it, no PNG */
        CHECK(moerl_mkdirs("empty") == MOERL_OK, "mkdir");
        CHECK(moerl_plot_reward_accuracy("empty", "empty/plot.dat", "empty/x.png") == MOERL_ERR &&
                  strstr(moerl_last_error(), "empty/plot.dat") && !exists("empty/x.png"),
              "missing data: %s", moerl_last_error());
        /* data gnuplot cannot plot: gnuplot's own message, no half-written PNG left behind */
        FILE *f = fopen("empty/bad.dat", "w");
        fprintf(f, "x y z\n");
        fclose(f);
        CHECK(moerl_plot_reward_accuracy("empty", "empty/bad.dat", "empty/bad.png") == MOERL_ERR &&
                  strstr(moerl_last_error(), "gnuplot failed") && !exists("empty/bad.png"),
              "bad data: %s", moerl_last_error());
    } else {
        printf("note: gnuplot is not installed: the PNG checks are skipped (scripts/setup.sh installs it)\n");
    }

    /* gnuplot absent (PATH without it): a clear error, no crash, no PNG */
    char *old_path = xstrdup(getenv("PATH") ? getenv("PATH") : "");
    CHECK(moerl_mkdirs("nogp") == MOERL_OK, "mkdir");
    write_data("nogp");
    setenv("PATH", base, 1); /* a folder without gnuplot */
    int rc = moerl_plot_reward_accuracy("nogp", "nogp/plot.dat", "nogp/reward_accuracy.png");
    setenv("PATH", old_path, 1);
    free(old_path);
    CHECK(rc == MOERL_ERR && strstr(moerl_last_error(), "not installed"), "no gnuplot: %s", moerl_last_error());
    CHECK(!exists("nogp/reward_accuracy.png"), "no gnuplot: a PNG appeared");

    if (chdir(cwd0) != 0) perror("chdir back");
    nftw(base, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    TEST_MAIN_END();
}
