#include "base/outdir.h"

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"

int moerl_outdir_check_subdirs(const char *dir, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        char p[4200];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (lstat(p, &st) == 0 && !S_ISDIR(st.st_mode))
            return moerl_errorf("'%s' is a file, but moerl keeps a folder of that name in the output folder: move or "
                                "delete it, or choose another trainer.default_local_dir", p);
    }
    return MOERL_OK;
}

int moerl_outdir_open(moerl_outdir *o, const char *dir) {
    memset(o, 0, sizeof *o);
    if (snprintf(o->dir, sizeof o->dir, "%s", dir) >= (int)sizeof o->dir)
        return moerl_errorf("output folder path too long: '%.100s...'", dir);
    /* the highest missing folder on the path: what this call will create */
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    struct stat st;
    while (p[0] && stat(p, &st) != 0) {
        snprintf(o->top, sizeof o->top, "%s", p);
        char *slash = strrchr(p, '/');
        if (!slash) break;
        while (slash > p && slash[-1] == '/') slash--; /* "a//b" */
        *slash = 0;
    }
    if (moerl_mkdirs(dir) != MOERL_OK || moerl_lock_dir(dir) < 0) return MOERL_ERR;
    return MOERL_OK;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void moerl_outdir_abandon(const moerl_outdir *o) {
    if (!o->top[0]) return;
    static const char *setup_only[] = {".moerl.lock", "config.yaml", "data", "run.log", MOERL_SIMULATION_MARKER};
    DIR *d = opendir(o->dir);
    if (!d) return;
    struct dirent *e;
    int only_setup = 1;
    while (only_setup && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int known = 0;
        for (size_t i = 0; i < sizeof setup_only / sizeof setup_only[0]; i++) known |= !strcmp(e->d_name, setup_only[i]);
        only_setup = known;
    }
    closedir(d);
    if (!only_setup) return;
    nftw(o->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    /* then the empty parents this run created, up to o->top */
    char p[4096];
    snprintf(p, sizeof p, "%s", o->dir);
    while (strlen(p) > strlen(o->top)) {
        char *slash = strrchr(p, '/');
        if (!slash) break;
        *slash = 0;
        if (rmdir(p) != 0) break;
    }
}

int moerl_outdir_remove(const moerl_outdir *o) {
    if (!o->top[0]) return 0;
    nftw(o->top, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 1;
}

int moerl_launcher_world(int *rank) {
    static const char *sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"};
    static const char *ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"};
    for (int i = 0; i < 3; i++) {
        const char *s = getenv(sizes[i]);
        if (!s) continue;
        const char *r = getenv(ranks[i]);
        *rank = r ? atoi(r) : 0;
        return atoi(s);
    }
    *rank = 0;
    return 1;
}
