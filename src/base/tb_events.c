/* moerl — TensorBoard event files (see tb_events.h). */
#include "base/tb_events.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/common.h"

struct tb_writer {
    FILE *f;
    char *path;
};

/* ------------------------------------------------------------------ CRC32C */

static uint32_t g_crc_table[256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        g_crc_table[i] = c;
    }
}

uint32_t tb_crc32c(const void *data, size_t n) {
    pthread_once(&g_crc_once, crc_init);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = g_crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t tb_masked_crc32c(const void *data, size_t n) {
    uint32_t c = tb_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ------------------------------------------------------------------ protobuf encoding */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} pbuf;

static void pb_bytes(pbuf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void pb_varint(pbuf *b, uint64_t v) {
    unsigned char t[10];
    size_t n = 0;
    do {
        t[n++] = (unsigned char)((v & 0x7F) | (v >= 0x80 ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, t, n);
}

static void pb_le(pbuf *b, uint64_t v, int nbytes) {
    unsigned char t[8];
    for (int i = 0; i < nbytes; i++) t[i] = (unsigned char)(v >> (8 * i));
    pb_bytes(b, t, (size_t)nbytes);
}

/* Field key: (number << 3) | wire type (0 varint, 1 64-bit, 2 length-delimited, 5 32-bit). */
static void pb_key(pbuf *b, int field, int wire) { pb_varint(b, (uint64_t)(field << 3 | wire)); }

static void pb_len_field(pbuf *b, int field, const void *s, size_t n) {
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, s, n);
}

static void pb_double(pbuf *b, int field, double x) {
    uint64_t u;
    memcpy(&u, &x, 8);
    pb_key(b, field, 1);
    pb_le(b, u, 8);
}

static void pb_float(pbuf *b, int field, float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    pb_key(b, field, 5);
    pb_le(b, u, 4);
}

/* Event header: wall_time (1), step (2; int64 as a two's-complement varint). */
static void event_head(pbuf *b, double wall_time, int64_t step) {
    pb_double(b, 1, wall_time);
    pb_key(b, 2, 0);
    pb_varint(b, (uint64_t)step);
}

/* ------------------------------------------------------------------ records */

/* Frame `data` as one TFRecord, write it with one fwrite and flush. */
static int write_record(tb_writer *w, const unsigned char *data, size_t n) {
    pbuf r = {0};
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    pb_bytes(&r, len, 8);
    pb_le(&r, tb_masked_crc32c(len, 8), 4);
    pb_bytes(&r, data, n);
    pb_le(&r, tb_masked_crc32c(data, n), 4);
    int bad = fwrite(r.p, 1, r.n, w->f) != r.n || fflush(w->f) != 0;
    free(r.p);
    if (bad) return moerl_errorf("tensorboard event file '%s': write failed: %s", w->path, strerror(errno));
    return MOERL_OK;
}

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

tb_writer *tb_open(const char *dir, int64_t restart_step) {
    static atomic_int counter;
    if (moerl_mkdirs(dir) != MOERL_OK) {
        moerl_error_prefix("tensorboard folder '%s': ", dir);
        return NULL;
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *h = host; *h; h++)
        if (*h == '/') *h = '_';
    double now = wall_now();
    size_t cap = strlen(dir) + strlen(host) + 96;
    char *path = xmalloc(cap);
    snprintf(path, cap, "%s/events.out.tfevents.%lld.%s.%d.%d", dir, (long long)now, host, (int)getpid(),
             atomic_fetch_add(&counter, 1));
    FILE *f = fopen(path, "wb");
    if (!f) {
        moerl_errorf("cannot create tensorboard event file '%s': %s", path, strerror(errno));
        free(path);
        return NULL;
    }
    tb_writer *w = xcalloc(1, sizeof *w);
    w->f = f;
    w->path = path;
    pbuf e = {0};
    event_head(&e, now, 0);
    pb_len_field(&e, 3, "brain.Event:2", 13);
    int rc = write_record(w, e.p, e.n);
    if (rc == MOERL_OK && restart_step >= 0) {
        e.n = 0;
        event_head(&e, now, restart_step);
        unsigned char start[2] = {0x08, 0x01}; /* SessionLog { status: START } */
        pb_len_field(&e, 7, start, 2);
        rc = write_record(w, e.p, e.n);
    }
    free(e.p);
    if (rc != MOERL_OK) {
        tb_close(w);
        return NULL;
    }
    return w;
}

int tb_write_scalars(tb_writer *w, int64_t step, double wall_time, int n, const char *const keys[],
                     const double values[]) {
    pbuf sum = {0}, val = {0}, ev = {0};
    for (int i = 0; i < n; i++) {
        val.n = 0;
        pb_len_field(&val, 1, keys[i], strlen(keys[i]));
        pb_float(&val, 2, (float)values[i]);
        pb_len_field(&sum, 1, val.p, val.n);
    }
    event_head(&ev, wall_time, step);
    pb_len_field(&ev, 5, sum.p ? (const void *)sum.p : (const void *)"", sum.n);
    int rc = write_record(w, ev.p, ev.n);
    free(sum.p);
    free(val.p);
    free(ev.p);
    return rc;
}

const char *tb_path(const tb_writer *w) { return w->path; }

void tb_close(tb_writer *w) {
    if (!w) return;
    fclose(w->f);
    free(w->path);
    free(w);
}
