/* moerl — common definitions: error reporting, checked allocation, small helpers.
 *
 * Error model (borrowed from SQLite/Redis): library functions return an int status
 * (MOERL_OK = 0, MOERL_ERR = -1) and record a human-readable message with moerl_errorf();
 * only the program's top (cli/) decides to print and exit.  Invariants that can only be
 * broken by a bug in moerl itself use MOERL_ASSERT, which stays on in release builds and
 * calls the abort hook (dist/ installs one that reaches MPI_Abort).
 */
#ifndef MOERL_COMMON_H
#define MOERL_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define MOERL_OK 0
#define MOERL_ERR (-1)

/* Record an error message for the calling thread (printf format). Returns MOERL_ERR so a
 * caller can write `return moerl_errorf("...")`. A later call replaces the message. An argument
 * may be moerl_last_error() itself (the old text is read before it is replaced), though
 * moerl_error_prefix says the same more directly. */
int moerl_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefix the current thread's message with more context ("loading X: " + old message). */
int moerl_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The calling thread's last error message ("" if none). */
const char *moerl_last_error(void);

/* Abort hook: called by moerl_fatal before abort(); dist/ sets one that calls MPI_Abort. */
typedef void (*moerl_abort_hook_fn)(int code);
void moerl_set_abort_hook(moerl_abort_hook_fn fn);
/* Print "moerl: fatal: <file>:<line>: <message>" to stderr, run the abort hook, exit(code). */
void moerl_fatal_at(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
#define moerl_fatal(...) moerl_fatal_at(__FILE__, __LINE__, __VA_ARGS__)

/* Always-on assertion for internal invariants (never for user input). */
#define MOERL_ASSERT(cond) \
    do { if (!(cond)) moerl_fatal_at(__FILE__, __LINE__, "assertion failed: %s", #cond); } while (0)

/* Checked allocation: on failure prints the size and call site and aborts (one OOM path). */
void *moerl_malloc_at(size_t n, const char *file, int line);
void *moerl_calloc_at(size_t n, size_t sz, const char *file, int line);
void *moerl_realloc_at(void *p, size_t n, const char *file, int line);
/* 64-byte aligned allocation (for SIMD/BLAS buffers), zero-filled; free with free(). */
void *moerl_aligned_alloc_at(size_t n, const char *file, int line);
#define xmalloc(n) moerl_malloc_at((n), __FILE__, __LINE__)
#define xcalloc(n, sz) moerl_calloc_at((n), (sz), __FILE__, __LINE__)
#define xrealloc(p, n) moerl_realloc_at((p), (n), __FILE__, __LINE__)
#define xalloc_aligned(n) moerl_aligned_alloc_at((n), __FILE__, __LINE__)
char *xstrdup(const char *s);

/* The plural suffix of a count in a message: "" for 1 (and −1), "s" otherwise — printf("%d layer%s",
 * n, moerl_plural(n)) writes "1 layer", "2 layers", "0 layers". */
const char *moerl_plural(long long n);

/* The shortest decimal significand of a finite double x that reads back (strtod) as x, the core of both
 * Python's repr/str and JavaScript's Number#toString (each lays the digits out its own way): writes
 * digits[] (1–17 of them, NUL-terminated, no trailing zeros; "0" for ±0), *exp10 (x = ±d.ddd… × 10^exp10)
 * and *neg (the sign bit, so −0 is negative); returns the digit count. */
int moerl_shortest_digits(double x, char digits[24], int *exp10, int *neg);

/* Memory this process can still allocate, in bytes: MemAvailable of /proc/meminfo (what the
 * kernel can hand out without swapping), else sysconf's available physical pages × page size;
 * 0 when neither is readable. */
uint64_t moerl_mem_available(void);

/* Monotonic wall clock in seconds. */
double moerl_now(void);

/* Read a whole file into a NUL-terminated heap buffer. Returns MOERL_ERR with a message
 * naming the path on failure. */
int moerl_read_file(const char *path, char **out, size_t *len);
/* Write a file atomically: write to "<path>.tmp.<pid>", fsync, rename over path. */
int moerl_write_file_atomic(const char *path, const void *data, size_t len);
/* Sparse buffers (FSDP's gather targets, a pipeline stage's layout-sized views): moerl_map_sparse
 * reserves `bytes` of zero-filled address space (MAP_NORESERVE: pages get memory when written; NULL
 * on failure; free with munmap); moerl_drop_pages gives back the whole pages inside
 * base[off, off + n) floats (pages straddling the ends stay). */
float *moerl_map_sparse(size_t bytes);
void moerl_drop_pages(float *base, size_t off, size_t n);
/* Take an exclusive, non-blocking lock on DIR/.moerl.lock for the rest of the process, so two
 * runs cannot write the same output folder. Returns the lock's fd (≥ 0) or MOERL_ERR naming
 * the folder when another process holds it. */
int moerl_lock_dir(const char *dir);
/* mkdir -p */
int moerl_mkdirs(const char *path);

#define MOERL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MOERL_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif

/* OpenBLAS 0.3.21 (Debian 12) does not recognise some current x86 CPUs and falls back to its
 * generic SSE3 "Prescott" kernels, 3-20x slower here. The choice is made when the library
 * loads, from OPENBLAS_CORETYPE. If that variable is unset and the CPU has AVX2+FMA, this sets
 * it to Haswell (AVX2 kernels) and re-executes the program once; a value set by the user (or
 * MOERL_KEEP_BLAS_CORETYPE=1) is left alone. Call first thing in main(). */
void moerl_blas_coretype_init(char **argv);
