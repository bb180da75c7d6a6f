#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char g_err[2048];
static moerl_abort_hook_fn g_abort_hook;

/* The message is formatted into a scratch buffer first and then copied, so an argument that
 * points into the thread's own message (moerl_errorf("ctx: %s", moerl_last_error())) reads the
 * old text intact: vsnprintf straight into g_err would overwrite its own source as it runs. */
int moerl_errorf(const char *fmt, ...) {
    char tmp[sizeof g_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(g_err, tmp, sizeof g_err);
    return MOERL_ERR;
}

int moerl_error_prefix(const char *fmt, ...) {
    char old[sizeof g_err], pre[1024];
    memcpy(old, g_err, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    snprintf(g_err, sizeof g_err, "%s%s", pre, old);
    return MOERL_ERR;
}

const char *moerl_last_error(void) { return g_err; }

void moerl_set_abort_hook(moerl_abort_hook_fn fn) { g_abort_hook = fn; }

void moerl_fatal_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "moerl: fatal: %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    if (g_abort_hook) g_abort_hook(1);
    exit(1);
}

void *moerl_malloc_at(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) moerl_fatal_at(file, line, "out of memory allocating %zu bytes", n);
    return p;
}

void *moerl_calloc_at(size_t n, size_t sz, const char *file, int line) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) moerl_fatal_at(file, line, "out of memory allocating %zu x %zu bytes", n, sz);
    return p;
}

void *moerl_realloc_at(void *p, size_t n, const char *file, int line) {
    void *q = realloc(p, n ? n : 1);
    if (!q) moerl_fatal_at(file, line, "out of memory reallocating %zu bytes", n);
    return q;
}

void *moerl_aligned_alloc_at(size_t n, const char *file, int line) {
    size_t sz = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, sz ? sz : 64);
    if (!p) moerl_fatal_at(file, line, "out of memory allocating %zu aligned bytes", n);
    memset(p, 0, sz ? sz : 64);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

uint64_t moerl_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb = 0;
        int found = 0;
        while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
        fclose(f);
        if (found) return (uint64_t)kb * 1024;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

const char *moerl_plural(long long n) { return n == 1 || n == -1 ? "" : "s"; }

int moerl_shortest_digits(double x, char digits[24], int *exp10, int *neg) {
    char tmp[40];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, x); /* [-]d.ddde±XX with p significant digits */
    *neg = tmp[0] == '-';
    int nd = 0;
    const char *q = tmp + *neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    *exp10 = atoi(q + 1);
    return nd;
}

double moerl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int moerl_read_file(const char *path, char **out, size_t *len) {
    struct stat st;
    if (stat(path, &st) != 0) return moerl_errorf("cannot open '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return moerl_errorf("'%s' is not a regular file (a directory?)", path);
    FILE *f = fopen(path, "rb");
    if (!f) return moerl_errorf("cannot open '%s': %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return moerl_errorf("cannot seek '%s'", path); }
    long n = ftell(f);
    if (n < 0) { fclose(f); return moerl_errorf("cannot size '%s'", path); }
    rewind(f);
    char *buf = xmalloc((size_t)n + 1);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return moerl_errorf("short read on '%s'", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    if (len) *len = (size_t)n;
    return MOERL_OK;
}

int moerl_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return moerl_errorf("cannot create '%s': %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return moerl_errorf("cannot write '%s': %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return moerl_errorf("cannot flush '%s': %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return moerl_errorf("cannot rename '%s' to '%s': %s", tmp, path, strerror(e));
    }
    /* make the rename itself durable: fsync the containing directory */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    int dfd = open(dir[0] ? dir : "/", O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return MOERL_OK;
}

int moerl_lock_dir(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.moerl.lock", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return moerl_errorf("cannot create the lock file '%s': %s", p, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return moerl_errorf("output folder '%s' is in use by another moerl run (lock '%s'); use another "
                            "trainer.default_local_dir or wait for that run to end", dir, p);
    }
    return fd; /* held until the process exits */
}

int moerl_mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return moerl_errorf("bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) != 0) {
                struct stat st;
                if (errno != EEXIST) return moerl_errorf("cannot create directory '%s': %s", buf, strerror(errno));
                if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
                    return moerl_errorf("cannot create directory '%s': a file of that name exists", buf);
            }
            buf[i] = c;
        }
    }
    return MOERL_OK;
}

void moerl_blas_coretype_init(char **argv) {
#if defined(__x86_64__)
    if (getenv("OPENBLAS_CORETYPE") || getenv("MOERL_KEEP_BLAS_CORETYPE")) return;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return;
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with whatever OpenBLAS picked */
#else
    (void)argv;
#endif
}

float *moerl_map_sparse(size_t bytes) {
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void moerl_drop_pages(float *base, size_t off, size_t n) {
    static size_t page;
    if (!page) page = (size_t)sysconf(_SC_PAGESIZE);
    const uintptr_t ps = page, a = (uintptr_t)(base + off), b = (uintptr_t)(base + off + n);
    const uintptr_t a1 = (a + ps - 1) & ~(ps - 1), b1 = b & ~(ps - 1);
    if (b1 > a1) madvise((void *)a1, b1 - a1, MADV_DONTNEED);
}
