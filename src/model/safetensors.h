/* safetensors reading and writing (the Hugging Face checkpoint format).
 *
 * Format (huggingface/safetensors README.md): 8-byte little-endian u64 N; N bytes of JSON header
 *   {name: {"dtype": "F32"|"BF16"|"F16"|..., "shape": [...], "data_offsets": [begin, end]},
 *    "__metadata__": {str: str}}  (padded with spaces when written so that the data starts at a
 *    multiple of 64 bytes; readers accept any length);
 * then the data buffer, tensor bytes at 8 + N + begin.
 * A file is valid only if: N ≤ 100 MB; the JSON parses; names are unique; every dtype is
 * known; end − begin == numel · dtype size; the offsets, sorted, tile the data buffer from 0
 * without gaps or overlap; 8 + N + last_end == file size.
 * Source: huggingface/safetensors format spec.
 */
#ifndef MOERL_SAFETENSORS_H
#define MOERL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ST_F32 = 0, ST_BF16, ST_F16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL } st_dtype;

/* "F32" → ST_F32 etc.; -1 if unknown. */
int st_dtype_from_name(const char *name);
const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;   /* offsets into the data buffer */
    const void *data;      /* pointer into the mapped file */
} st_tensor;

typedef struct {
    char *path;
    void *map;             /* mmap of the whole file (st_open / ST_LOAD_MMAP; else NULL). Private and
                            * writable (copy on write: a write never reaches the file), so a caller
                            * may take it over as its own buffer (checkpoint.c does; then set it NULL) */
    size_t map_len;
    void *heap;            /* the file read into memory (ST_LOAD_READ; else NULL) */
    int n_tensors;
    st_tensor *tensors;    /* in header order */
} st_file;

/* How st_open_with gets the file's bytes:
 *   ST_LOAD_MMAP  mmap(MAP_PRIVATE) of the whole file with madvise(MADV_SEQUENTIAL): no copy,
 *                 pages come from the page cache as they are touched; st_release drops them again;
 *   ST_LOAD_READ  read() of the whole file into one heap buffer (the classic loader: the file's
 *                 bytes are copied once into that buffer; kept as the peer for bench/bench_load). */
typedef enum { ST_LOAD_MMAP = 0, ST_LOAD_READ } st_load_how;

/* Open, mmap and validate a safetensors file. On error returns MOERL_ERR with a message that
 * names the file and the offending tensor/field and what was expected. */
int st_open(st_file *f, const char *path);
/* st_open with the way of reading chosen (above); the same validation and messages. */
int st_open_with(st_file *f, const char *path, st_load_how how);
/* Tell the kernel that bytes [begin, end) of an mmapped file (pointers into f->map) are no longer
 * needed by this process: the whole pages inside the range are dropped from its resident set
 * (madvise MADV_DONTNEED; the data stays in the page cache and reads back from the file if
 * touched again). A no-op for files not mapped. Used to keep peak RSS near the size of the
 * destination buffer while converting a large checkpoint. */
void st_release(const st_file *f, const void *begin, const void *end);
/* The same validation on a file image held in memory (buf[len], kept alive by the caller while f
 * is open: tensor data pointers point into it; nothing is mapped or copied). `name` stands for the
 * path in messages. Used by the fuzz target and by anything that receives a file as bytes. */
int st_open_memory(st_file *f, const void *buf, size_t len, const char *name);
/* Unmap (st_open only) and free; f is zeroed. */
void st_close(st_file *f);
/* Find a tensor by name; NULL if absent. */
const st_tensor *st_find(const st_file *f, const char *name);
/* Convert a tensor (F32, BF16 or F16) to fp32 into dst[numel]. bf16→f32 is bits << 16.
 * MOERL_ERR for other dtypes. */
int st_to_f32(const st_tensor *t, float *dst);

/* Writer: collect tensors (pointers are kept, not copied, until st_writer_finish). */
typedef struct st_writer st_writer;
st_writer *st_writer_new(void);
/* Add fp32 data to be stored with dtype ST_F32 or ST_BF16 (round-to-nearest-even). */
void st_writer_add(st_writer *w, const char *name, const float *data, int ndim, const int64_t *shape,
                   st_dtype store_as);
void st_writer_add_metadata(st_writer *w, const char *key, const char *value);
/* Bytes the file would take (header + data). */
uint64_t st_writer_size(const st_writer *w);
/* Write atomically (temp + rename). Frees nothing; call st_writer_free after. */
int st_writer_finish(st_writer *w, const char *path);
void st_writer_free(st_writer *w);

/* fp32 ↔ bf16 helpers (round to nearest even; NaN stays NaN). */
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t b);
float f16_to_f32(uint16_t h);

#endif
