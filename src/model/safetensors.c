/* safetensors reader (mmap + full validation) and streaming writer.
 * Format and validity rules: the format description in huggingface/safetensors README.md (see
 * safetensors.h). The header JSON is parsed with jansson. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format stores little-endian data)"
#endif

/* The reference implementation's limit on the header size (safetensors MAX_HEADER_SIZE). */
#define ST_MAX_HEADER_BYTES 100000000ULL

/* ------------------------------------------------------------------------- dtypes */

static const struct {
    const char *name;
    size_t size;
} g_dtypes[] = {
    [ST_F32] = {"F32", 4}, [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2}, [ST_F64] = {"F64", 8},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4},   [ST_I16] = {"I16", 2}, [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1},
};
#define ST_N_DTYPES ((int)(sizeof g_dtypes / sizeof g_dtypes[0]))

int st_dtype_from_name(const char *name) {
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (strcmp(name, g_dtypes[i].name) == 0) return i;
    return -1;
}

const char *st_dtype_name(st_dtype d) { return (int)d >= 0 && (int)d < ST_N_DTYPES ? g_dtypes[d].name : "?"; }

size_t st_dtype_size(st_dtype d) { return (int)d >= 0 && (int)d < ST_N_DTYPES ? g_dtypes[d].size : 0; }

/* ------------------------------------------------------------------------- fp16/bf16 */

uint16_t f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep sign, force quiet */
    /* round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* inf / NaN (payload kept) */
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13); /* normal: rebias 15 → 127 */
    } else if (man == 0) {
        u = sign; /* ±0 */
    } else {
        /* subnormal: value = man · 2^-24; normalise the mantissa */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* ------------------------------------------------------------------------- reader */

void st_close(st_file *f) {
    if (!f) return;
    if (f->map && f->map != MAP_FAILED) munmap(f->map, f->map_len);
    free(f->heap);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static int cmp_by_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static const char *json_type_name(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Validate one tensor entry of the header and fill *t (data pointer set later). */
static int parse_entry(st_tensor *t, const char *path, const char *name, json_t *v) {
    if (!json_is_object(v))
        return moerl_errorf("safetensors '%s': tensor '%s': expected an object with dtype/shape/data_offsets, "
                            "found %s", path, name, json_type_name(v));
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!jd || !json_is_string(jd))
        return moerl_errorf("safetensors '%s': tensor '%s': field 'dtype' must be a string, found %s", path, name,
                            jd ? json_type_name(jd) : "nothing (missing)");
    int dt = st_dtype_from_name(json_string_value(jd));
    if (dt < 0)
        return moerl_errorf("safetensors '%s': tensor '%s': unknown dtype '%s' (expected one of F32, BF16, F16, "
                            "F64, I64, I32, I16, I8, U8, BOOL)", path, name, json_string_value(jd));
    t->dtype = (st_dtype)dt;
    if (!js || !json_is_array(js))
        return moerl_errorf("safetensors '%s': tensor '%s': field 'shape' must be an array, found %s", path, name,
                            js ? json_type_name(js) : "nothing (missing)");
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return moerl_errorf("safetensors '%s': tensor '%s': shape has %zu dimensions, at most %d supported", path,
                            name, nd, ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    int overflow = 0, has_zero = 0;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return moerl_errorf("safetensors '%s': tensor '%s': shape[%zu] must be a non-negative integer, found %s",
                                path, name, i, json_is_integer(d) ? "a negative integer" : json_type_name(d));
        t->shape[i] = (int64_t)json_integer_value(d);
        uint64_t s = (uint64_t)t->shape[i];
        if (s == 0) has_zero = 1;
        else if (numel > (UINT64_MAX / 8) / s) overflow = 1;
        if (!overflow) numel *= s;
    }
    if (has_zero) numel = 0;
    if (overflow && !has_zero)
        return moerl_errorf("safetensors '%s': tensor '%s': shape is too large (element count overflows)", path, name);
    t->numel = (int64_t)numel;
    if (!jo || !json_is_array(jo))
        return moerl_errorf("safetensors '%s': tensor '%s': field 'data_offsets' must be an array [begin, end], "
                            "found %s", path, name, jo ? json_type_name(jo) : "nothing (missing)");
    if (json_array_size(jo) != 2)
        return moerl_errorf("safetensors '%s': tensor '%s': field 'data_offsets' must be an array [begin, end], "
                            "found %zu elements", path, name, json_array_size(jo));
    for (int i = 0; i < 2; i++) {
        json_t *o = json_array_get(jo, (size_t)i);
        if (!json_is_integer(o) || json_integer_value(o) < 0)
            return moerl_errorf("safetensors '%s': tensor '%s': data_offsets[%d] must be a non-negative integer, "
                                "found %s", path, name, i,
                                json_is_integer(o) ? "a negative integer" : json_type_name(o));
    }
    t->begin = (uint64_t)json_integer_value(json_array_get(jo, 0));
    t->end = (uint64_t)json_integer_value(json_array_get(jo, 1));
    if (t->begin > t->end)
        return moerl_errorf("safetensors '%s': tensor '%s': data_offsets begin %llu > end %llu", path, name,
                            (unsigned long long)t->begin, (unsigned long long)t->end);
    uint64_t want = numel * (uint64_t)st_dtype_size(t->dtype);
    if (t->end - t->begin != want) {
        char sh[256];
        int n = snprintf(sh, sizeof sh, "[");
        for (int i = 0; i < t->ndim && n < (int)sizeof sh - 24; i++)
            n += snprintf(sh + n, sizeof sh - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        snprintf(sh + n, sizeof sh - n, "]");
        return moerl_errorf("safetensors '%s': tensor '%s': data size mismatch: shape %s dtype %s needs %llu bytes "
                            "but data_offsets [%llu, %llu] span %llu bytes", path, name, sh,
                            st_dtype_name(t->dtype), (unsigned long long)want, (unsigned long long)t->begin,
                            (unsigned long long)t->end, (unsigned long long)(t->end - t->begin));
    }
    return MOERL_OK;
}

/* jansson reports a duplicate key as "duplicate object key near '"NAME"'"; pull NAME out. */
/* The name of the duplicated key after jansson's json_error_duplicate_key: jansson quotes the token
 * in its message only when it is at most 20 bytes long, so read the key from the header text
 * instead. jerr.position is the byte just past the key's closing quote; walk back to the opening
 * quote (one not escaped by an odd run of backslashes) and decode the literal with jansson, which
 * undoes its escapes. Falls back to "?" when the text there is not a string literal. */
static void duplicate_name(const json_error_t *e, const char *hdr, size_t N, char *out, size_t cap) {
    snprintf(out, cap, "?");
    size_t end = e->position > 0 ? (size_t)e->position : 0; /* one past the closing quote */
    if (end < 2 || end > N || hdr[end - 1] != '"') return;
    size_t q = end - 1;
    for (;;) {
        if (q == 0) return;
        q--;
        if (hdr[q] != '"') continue;
        size_t bs = 0;
        while (bs < q && hdr[q - 1 - bs] == '\\') bs++;
        if (bs % 2 == 0) break;
    }
    json_t *lit = json_loadb(hdr + q, end - q, JSON_DECODE_ANY, NULL);
    if (json_is_string(lit)) {
        /* shown inside quotes in a one-line message: keep printable ASCII, '?' for the rest */
        const char *v = json_string_value(lit);
        size_t n = json_string_length(lit), k = 0;
        size_t i = 0;
        for (; i < n && k + 4 < cap; i++)
            out[k++] = (v[i] >= 32 && v[i] < 127) || (unsigned char)v[i] >= 0x80 ? v[i] : '?';
        if (i < n) { /* cut: not inside a UTF-8 sequence, and say so */
            while (k > 0 && ((unsigned char)out[k - 1] & 0xC0) == 0x80) k--;
            if (k > 0 && (unsigned char)out[k - 1] >= 0xC0) k--;
            memcpy(out + k, "...", 3);
            k += 3;
        }
        out[k] = 0;
    }
    json_decref(lit);
}

static int st_parse_header(st_file *f, const char *path, const char *hdr, size_t N, size_t data_len) {
    json_error_t jerr;
    json_t *root = json_loadb(hdr, N, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_duplicate_key) {
            char nm[512];
            duplicate_name(&jerr, hdr, N, nm, sizeof nm);
            return moerl_errorf("safetensors '%s': duplicate tensor name \"%s\" in the header (at header byte %d); "
                                "every name must appear once", path, nm, jerr.position);
        }
        return moerl_errorf("safetensors '%s': header is not valid JSON: %s (line %d, column %d, header byte %d)",
                            path, jerr.text, jerr.line, jerr.column, jerr.position);
    }
    int rc = MOERL_OK;
    if (!json_is_object(root)) {
        rc = moerl_errorf("safetensors '%s': header must be a JSON object, found %s", path, json_type_name(root));
        goto done;
    }
    size_t n_entries = json_object_size(root);
    f->tensors = xcalloc(n_entries ? n_entries : 1, sizeof(st_tensor));
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = moerl_errorf("safetensors '%s': __metadata__ must be an object of strings, found %s", path,
                                  json_type_name(val));
                goto done;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = moerl_errorf("safetensors '%s': __metadata__ entry '%s' must be a string, found %s", path,
                                      mk, json_type_name(mv));
                    goto done;
                }
            }
            continue;
        }
        st_tensor *t = &f->tensors[f->n_tensors];
        memset(t, 0, sizeof *t);
        if (parse_entry(t, path, key, val) != MOERL_OK) {
            rc = MOERL_ERR;
            goto done;
        }
        t->name = xstrdup(key);
        f->n_tensors++;
    }
    /* the offsets, sorted by begin, must tile [0, data_len) exactly */
    {
        st_tensor **order = xmalloc((size_t)(f->n_tensors ? f->n_tensors : 1) * sizeof *order);
        for (int i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
        qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_by_begin);
        uint64_t pos = 0;
        const char *prev = NULL;
        for (int i = 0; i < f->n_tensors && rc == MOERL_OK; i++) {
            const st_tensor *t = order[i];
            if (t->begin < pos)
                rc = moerl_errorf("safetensors '%s': tensor '%s' data_offsets [%llu, %llu] overlap the previous "
                                  "tensor '%s' which ends at %llu", path, t->name, (unsigned long long)t->begin,
                                  (unsigned long long)t->end, prev, (unsigned long long)pos);
            else if (t->begin > pos && !prev)
                rc = moerl_errorf("safetensors '%s': gap in the data buffer: the first tensor '%s' begins at %llu "
                                  "(expected 0: offsets must tile the buffer from its start)", path, t->name,
                                  (unsigned long long)t->begin);
            else if (t->begin > pos)
                rc = moerl_errorf("safetensors '%s': gap in the data buffer: tensor '%s' begins at %llu but the "
                                  "previous data ends at %llu (expected offsets to be contiguous)", path, t->name,
                                  (unsigned long long)t->begin, (unsigned long long)pos);
            pos = t->end;
            prev = t->name;
        }
        free(order);
        if (rc == MOERL_OK && pos != data_len)
            rc = moerl_errorf("safetensors '%s': the last tensor '%s' ends at byte %llu of the data buffer but the "
                              "file holds %llu data bytes (expected 8 + header + last end == file size: %s)", path,
                              prev ? prev : "(none)", (unsigned long long)pos, (unsigned long long)data_len,
                              pos < data_len ? "trailing bytes after the last tensor" : "file is truncated");
    }
done:
    json_decref(root);
    return rc;
}

/* Validate the whole file image buf[size] (size ≥ 8) and fill f (path copied, data pointers into buf). */
static int st_parse_buffer(st_file *f, const void *buf, size_t size, const char *path) {
    f->path = xstrdup(path);
    uint64_t N;
    memcpy(&N, buf, 8);
    if (N > ST_MAX_HEADER_BYTES)
        return moerl_errorf("safetensors '%s': header length %llu exceeds the 100 MB limit (%llu bytes); the file is "
                            "corrupt or not safetensors", path, (unsigned long long)N, ST_MAX_HEADER_BYTES);
    if (N > size - 8)
        return moerl_errorf("safetensors '%s': header length %llu is beyond the file (file has %zu bytes after the "
                            "8-byte length); the file is truncated", path, (unsigned long long)N, size - 8);
    if (st_parse_header(f, path, (const char *)buf + 8, (size_t)N, size - 8 - (size_t)N) != MOERL_OK)
        return MOERL_ERR;
    const char *data = (const char *)buf + 8 + N;
    for (int i = 0; i < f->n_tensors; i++) f->tensors[i].data = data + f->tensors[i].begin;
    return MOERL_OK;
}

/* read() the whole file (size bytes) from fd into a heap buffer; MOERL_ERR naming the file. */
static int read_whole(int fd, size_t size, const char *path, void **out) {
    char *buf = xmalloc(size ? size : 1);
    size_t got = 0;
    while (got < size) {
        ssize_t k = read(fd, buf + got, MOERL_MIN(size - got, (size_t)1 << 30));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = errno;
            free(buf);
            if (k == 0)
                return moerl_errorf("safetensors '%s': file shrank while being read: got %zu of %zu bytes", path,
                                    got, size);
            return moerl_errorf("safetensors: cannot read '%s': %s", path, strerror(e));
        }
        got += (size_t)k;
    }
    *out = buf;
    return MOERL_OK;
}

int st_open_with(st_file *f, const char *path, st_load_how how) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return moerl_errorf("safetensors: cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return moerl_errorf("safetensors: cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return moerl_errorf("safetensors: '%s' is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return moerl_errorf("safetensors '%s': file is truncated: %zu bytes, need at least 8 for the header length",
                            path, size);
    }
    const void *bytes;
    if (how == ST_LOAD_READ) {
        int rc = read_whole(fd, size, path, &f->heap);
        close(fd);
        if (rc != MOERL_OK) return rc;
        bytes = f->heap;
    } else {
        /* private + writable: copy on write, so a caller that adopts the mapping as its buffer may
         * modify it without the file ever changing (the fd is read-only) */
        void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        int e = errno;
        close(fd);
        if (map == MAP_FAILED)
            return moerl_errorf("safetensors: cannot mmap '%s' (%zu bytes): %s", path, size, strerror(e));
        (void)madvise(map, size, MADV_SEQUENTIAL); /* a hint: read ahead, drop behind */
        f->map = map;
        f->map_len = size;
        bytes = map;
    }
    if (st_parse_buffer(f, bytes, size, path) != MOERL_OK) {
        st_close(f);
        return MOERL_ERR;
    }
    return MOERL_OK;
}

int st_open(st_file *f, const char *path) { return st_open_with(f, path, ST_LOAD_MMAP); }

void st_release(const st_file *f, const void *begin, const void *end) {
    if (!f->map || (const char *)end <= (const char *)begin) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)f->map, hi = lo + f->map_len;
    uintptr_t b = (uintptr_t)begin, e = (uintptr_t)end;
    if (b < lo) b = lo;
    if (e > hi) e = hi;
    b = (b + page - 1) & ~(page - 1); /* only pages wholly inside the range */
    e &= ~(page - 1);
    if (e > b) (void)madvise((void *)b, e - b, MADV_DONTNEED); /* private, unwritten: rereads from the file */
}

int st_open_memory(st_file *f, const void *buf, size_t len, const char *name) {
    memset(f, 0, sizeof *f);
    if (len < 8)
        return moerl_errorf("safetensors '%s': file is truncated: %zu bytes, need at least 8 for the header length",
                            name, len);
    if (st_parse_buffer(f, buf, len, name) != MOERL_OK) {
        st_close(f);
        return MOERL_ERR;
    }
    return MOERL_OK;
}

int st_to_f32(const st_tensor *t, float *dst) {
    const unsigned char *src = t->data;
    int64_t n = t->numel;
    switch (t->dtype) {
    case ST_F32: memcpy(dst, src, (size_t)n * 4); return MOERL_OK;
    case ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t b;
            memcpy(&b, src + 2 * i, 2); /* data may be unaligned (header length need not be a multiple of 8) */
            dst[i] = bf16_to_f32(b);
        }
        return MOERL_OK;
    case ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        return MOERL_OK;
    default:
        return moerl_errorf("safetensors: tensor '%s' has dtype %s; only F32, BF16 and F16 convert to fp32", t->name,
                            st_dtype_name(t->dtype));
    }
}

/* ------------------------------------------------------------------------- writer */

typedef struct {
    char *name;
    const float *data;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    st_dtype dtype;
    int bad_ndim; /* ndim outside [0, ST_MAX_DIMS] or a negative dim: reported by finish */
} st_wentry;

struct st_writer {
    st_wentry *e;
    int n, cap;
    char **meta; /* key, value pairs */
    int n_meta;
};

st_writer *st_writer_new(void) { return xcalloc(1, sizeof(st_writer)); }

void st_writer_add(st_writer *w, const char *name, const float *data, int ndim, const int64_t *shape,
                   st_dtype store_as) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->e = xrealloc(w->e, (size_t)w->cap * sizeof *w->e);
    }
    st_wentry *e = &w->e[w->n++];
    memset(e, 0, sizeof *e);
    e->name = xstrdup(name);
    e->data = data;
    e->dtype = store_as;
    e->ndim = ndim;
    e->numel = 1;
    if (ndim < 0 || ndim > ST_MAX_DIMS) {
        e->bad_ndim = 1;
        e->ndim = 0;
        return;
    }
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        if (shape[i] < 0) e->bad_ndim = 1;
        e->numel *= shape[i];
    }
}

void st_writer_add_metadata(st_writer *w, const char *key, const char *value) {
    w->meta = xrealloc(w->meta, (size_t)(w->n_meta + 1) * 2 * sizeof(char *));
    w->meta[2 * w->n_meta] = xstrdup(key);
    w->meta[2 * w->n_meta + 1] = xstrdup(value);
    w->n_meta++;
}

/* Header JSON (unpadded) in insertion order; NULL with an error set if the entries are invalid. */
static char *writer_header(const st_writer *w, const char *path, uint64_t *data_bytes) {
    json_t *root = json_object();
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const st_wentry *e = &w->e[i];
        if (e->bad_ndim) {
            moerl_errorf("safetensors writer '%s': tensor '%s': bad shape (ndim must be 0..%d, dims non-negative)",
                         path, e->name, ST_MAX_DIMS);
            goto fail;
        }
        if (e->dtype != ST_F32 && e->dtype != ST_BF16) {
            moerl_errorf("safetensors writer '%s': tensor '%s': can only store F32 or BF16, asked for %s", path,
                         e->name, st_dtype_name(e->dtype));
            goto fail;
        }
        if (e->numel > 0 && !e->data) {
            moerl_errorf("safetensors writer '%s': tensor '%s' has %lld elements but no data", path, e->name,
                         (long long)e->numel);
            goto fail;
        }
        if (strcmp(e->name, "__metadata__") == 0 || json_object_get(root, e->name)) {
            moerl_errorf("safetensors writer '%s': duplicate tensor name \"%s\"", path, e->name);
            goto fail;
        }
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        uint64_t nb = (uint64_t)e->numel * st_dtype_size(e->dtype);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + nb)));
        json_t *ent = json_object();
        json_object_set_new(ent, "dtype", json_string(st_dtype_name(e->dtype)));
        json_object_set_new(ent, "shape", shape);
        json_object_set_new(ent, "data_offsets", offs);
        if (json_object_set_new(root, e->name, ent) != 0) {
            moerl_errorf("safetensors writer '%s': tensor name \"%s\" is not valid UTF-8", path, e->name);
            goto fail;
        }
        off += nb;
    }
    if (w->n_meta) {
        json_t *meta = json_object();
        for (int i = 0; i < w->n_meta; i++) {
            json_t *s = json_string(w->meta[2 * i + 1]);
            if (!s || json_object_set_new(meta, w->meta[2 * i], s) != 0) {
                moerl_errorf("safetensors writer '%s': metadata '%s' is not valid UTF-8", path, w->meta[2 * i]);
                json_decref(meta);
                goto fail;
            }
        }
        json_object_set_new(root, "__metadata__", meta);
    }
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (data_bytes) *data_bytes = off;
    return s;
fail:
    json_decref(root);
    return NULL;
}

/* 8 + padded header length for an unpadded header of n bytes: the header is padded with spaces so
 * that the data buffer starts at a multiple of 64 bytes (the format asks for a multiple of 8;
 * 64 lets a reader use an F32 file in place as a 64-byte-aligned parameter buffer, checkpoint.c). */
static uint64_t header_padded(uint64_t n) { return (8 + n + 63) & ~(uint64_t)63; }

uint64_t st_writer_size(const st_writer *w) {
    uint64_t data = 0;
    char *h = writer_header(w, "(size)", &data);
    if (!h) return 0;
    uint64_t n = strlen(h);
    free(h);
    return header_padded(n) + data;
}

static int write_all(int fd, const void *buf, size_t len, const char *tmp) {
    const char *p = buf;
    while (len > 0) {
        ssize_t k = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (k < 0) {
            if (errno == EINTR) continue;
            return moerl_errorf("safetensors writer: cannot write '%s': %s", tmp, strerror(errno));
        }
        p += k;
        len -= (size_t)k;
    }
    return MOERL_OK;
}

int st_writer_finish(st_writer *w, const char *path) {
    uint64_t data_bytes = 0;
    char *h = writer_header(w, path, &data_bytes);
    if (!h) return MOERL_ERR;
    size_t hn = strlen(h), padded = (size_t)header_padded(hn) - 8;
    char *hdr = xmalloc(8 + padded);
    uint64_t N = padded;
    memcpy(hdr, &N, 8);
    memcpy(hdr + 8, h, hn);
    memset(hdr + 8 + hn, ' ', padded - hn);
    free(h);

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        free(hdr);
        return moerl_errorf("safetensors writer: cannot create '%s': %s", tmp, strerror(errno));
    }
    int rc = write_all(fd, hdr, 8 + padded, tmp);
    free(hdr);
    /* tensor data streamed in insertion order; BF16 converted through a bounded buffer */
    enum { CHUNK = 1 << 18 };
    uint16_t *buf = NULL;
    for (int i = 0; i < w->n && rc == MOERL_OK; i++) {
        const st_wentry *e = &w->e[i];
        if (e->numel == 0) continue;
        if (e->dtype == ST_F32) {
            rc = write_all(fd, e->data, (size_t)e->numel * 4, tmp);
            continue;
        }
        if (!buf) buf = xmalloc(CHUNK * sizeof *buf);
        for (int64_t s = 0; s < e->numel && rc == MOERL_OK; s += CHUNK) {
            int64_t n = MOERL_MIN((int64_t)CHUNK, e->numel - s);
            for (int64_t j = 0; j < n; j++) buf[j] = f32_to_bf16(e->data[s + j]);
            rc = write_all(fd, buf, (size_t)n * 2, tmp);
        }
    }
    free(buf);
    if (rc == MOERL_OK && fsync(fd) != 0) rc = moerl_errorf("safetensors writer: cannot fsync '%s': %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == MOERL_OK)
        rc = moerl_errorf("safetensors writer: cannot close '%s': %s", tmp, strerror(errno));
    if (rc == MOERL_OK && rename(tmp, path) != 0)
        rc = moerl_errorf("safetensors writer: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (rc != MOERL_OK) {
        unlink(tmp);
        return MOERL_ERR;
    }
    /* make the rename durable: fsync the containing directory (best effort) */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        if (slash == dir) slash[1] = 0;
        else *slash = 0;
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return MOERL_OK;
}

void st_writer_free(st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    for (int i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->e);
    free(w->meta);
    free(w);
}
