/* A private temporary folder for fuzz targets whose parser reads files (created on first use,
 * removed with its files at exit). */
#ifndef MOERL_FUZZ_TMPDIR_H
#define MOERL_FUZZ_TMPDIR_H

#include <dirent.h>
#include <unistd.h>

static char g_fuzz_dir[256];

static void fuzz_tmpdir_remove(void) {
    DIR *d = opendir(g_fuzz_dir);
    if (!d) return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", g_fuzz_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(g_fuzz_dir);
}

static const char *fuzz_tmpdir(void) {
    if (!g_fuzz_dir[0]) {
        const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(g_fuzz_dir, sizeof g_fuzz_dir, "%s/moerl_fuzz_XXXXXX", base);
        if (!mkdtemp(g_fuzz_dir)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fuzz_tmpdir_remove);
    }
    return g_fuzz_dir;
}

/* Write data[size] to dir/name (plainly: the parser under test reads it back at once). */
static void fuzz_write(const char *name, const uint8_t *data, size_t size) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", fuzz_tmpdir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(p);
        abort();
    }
}

#endif
