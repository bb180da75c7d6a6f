/* Checkpoint helpers (see ckpt.h). */
#include "train/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "model/safetensors.h"

void ckpt_remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4200];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

int ckpt_swap_dir(const char *tmp, const char *cur) {
    char old[4200];
    snprintf(old, sizeof old, "%s.old", cur);
    ckpt_remove_flat_dir(old);
    if (rename(cur, old) != 0 && errno != ENOENT) return moerl_errorf("cannot rename %s: %s", cur, strerror(errno));
    if (rename(tmp, cur) != 0) return moerl_errorf("cannot rename %s to %s: %s", tmp, cur, strerror(errno));
    ckpt_remove_flat_dir(old);
    return MOERL_OK;
}

int ckpt_save_optimizer(const adamw_state *s, const char *path) {
    st_writer *w = st_writer_new();
    int64_t shape[1] = {(int64_t)s->n};
    st_writer_add(w, "adam.m", s->m, 1, shape, ST_F32);
    st_writer_add(w, "adam.v", s->v, 1, shape, ST_F32);
    int rc = st_writer_finish(w, path);
    st_writer_free(w);
    return rc;
}

int ckpt_load_optimizer(adamw_state *s, const char *path) {
    st_file f;
    if (st_open(&f, path) != MOERL_OK) return MOERL_ERR;
    const st_tensor *tm = st_find(&f, "adam.m"), *tv = st_find(&f, "adam.v");
    if (!tm || !tv || tm->numel != (int64_t)s->n || tv->numel != (int64_t)s->n) {
        st_close(&f);
        return moerl_errorf("%s: adam.m/adam.v missing or not %zu floats", path, s->n);
    }
    st_to_f32(tm, s->m);
    st_to_f32(tv, s->v);
    st_close(&f);
    return MOERL_OK;
}

int ckpt_truncate_metrics(const char *path, int64_t step) {
    char *txt;
    size_t len;
    if (access(path, F_OK) != 0) return MOERL_OK;
    if (moerl_read_file(path, &txt, &len) != MOERL_OK) return MOERL_ERR;
    char *out = xmalloc(len + 1);
    size_t o = 0;
    for (char *line = txt; line < txt + len;) {
        char *nl = memchr(line, '\n', (size_t)(txt + len - line));
        size_t ll = nl ? (size_t)(nl - line) + 1 : (size_t)(txt + len - line);
        json_t *j = json_loadb(line, ll, 0, NULL);
        json_t *st = j ? json_object_get(j, "step") : NULL;
        if (!st || json_integer_value(st) <= step) {
            memcpy(out + o, line, ll);
            o += ll;
        }
        json_decref(j);
        line += ll;
    }
    int rc = moerl_write_file_atomic(path, out, o);
    free(out);
    free(txt);
    return rc;
}
