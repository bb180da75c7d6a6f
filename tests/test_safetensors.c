/* safetensors reader/writer: round trips (F32, BF16, metadata), bf16 rounding against an
 * independent reference and against torch, f16 decoding, and malformed files each rejected with a
 * message that names the file and the problem. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/rng.h"
#include "model/safetensors.h"
#include "test.h"

static char g_dir[1024];

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d && *d ? d : "build/testdata";
}

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

/* Write a raw file: u64 header length (claimed), header text, then `data_len` data bytes (0x11). */
static void write_raw(const char *path, uint64_t claimed_n, const char *hdr, size_t data_len) {
    FILE *f = fopen(path, "wb");
    if (!f) moerl_fatal("cannot create %s", path);
    fwrite(&claimed_n, 8, 1, f);
    fwrite(hdr, 1, strlen(hdr), f);
    for (size_t i = 0; i < data_len; i++) fputc(0x11, f);
    fclose(f);
}
/* Header with its true length. */
static void write_st(const char *path, const char *hdr, size_t data_len) {
    write_raw(path, strlen(hdr), hdr, data_len);
}

/* st_open must fail, without crashing, with a message containing the file path and every word. */
static void expect_reject(const char *what, const char *path, const char *w1, const char *w2) {
    st_file f;
    int rc = st_open(&f, path);
    const char *msg = moerl_last_error();
    CHECK(rc == MOERL_ERR, "%s: st_open accepted a malformed file", what);
    if (rc != MOERL_ERR) {
        st_close(&f);
        return;
    }
    if (getenv("MOERL_TEST_VERBOSE")) printf("  %-28s -> %s\n", what, msg);
    CHECK(strstr(msg, path) != NULL, "%s: message does not name the file: %s", what, msg);
    CHECK(strstr(msg, w1) != NULL, "%s: message lacks '%s': %s", what, w1, msg);
    if (w2) CHECK(strstr(msg, w2) != NULL, "%s: message lacks '%s': %s", what, w2, msg);
}

/* Reference fp32 → bf16 rounding computed independently of f32_to_bf16: take the two bf16 values
 * bracketing x (truncation toward zero and the next one away from zero), compare the distances in
 * double (exact: both differences are representable), ties go to the even mantissa. Overflow:
 * the value above the largest bf16 is 2^128 (rounds to infinity). */
static uint16_t ref_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (isnan(x)) return 0x7fc0;
    if (isinf(x)) return (uint16_t)(u >> 16);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dlo = fabs((double)bf16_to_f32(lo));
    double dhi = ((hi & 0x7f80) == 0x7f80) ? ldexp(1.0, 128) : fabs((double)bf16_to_f32(hi));
    double ax = fabs((double)x);
    if (ax - dlo < dhi - ax) return lo;
    if (ax - dlo > dhi - ax) return hi;
    return (lo & 1) ? hi : lo;
}

static void test_bf16_rounding(void) {
    /* independent reference over many bit patterns: every 2^16-th high half times a set of low halves,
     * plus random words */
    int bad = 0;
    long n = 0;
    const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000};
    for (uint32_t hi = 0; hi < 0x10000; hi++) {
        for (int j = 0; j < 8; j++) {
            uint32_t u = (hi << 16) | lows[j];
            float x;
            memcpy(&x, &u, 4);
            if (isnan(x)) continue;
            n++;
            if (f32_to_bf16(x) != ref_bf16(x) && bad++ < 5)
                fprintf(stderr, "bf16 of bits %08x: got %04x want %04x\n", u, f32_to_bf16(x), ref_bf16(x));
        }
    }
    rng_state r;
    rng_seed(&r, 42);
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng_u64(&r);
        float x;
        memcpy(&x, &u, 4);
        if (isnan(x)) continue;
        n++;
        if (f32_to_bf16(x) != ref_bf16(x) && bad++ < 5)
            fprintf(stderr, "bf16 of bits %08x: got %04x want %04x\n", u, f32_to_bf16(x), ref_bf16(x));
    }
    CHECK(bad == 0, "%d of %ld values rounded differently from the reference", bad, n);
    /* NaN stays NaN (including a NaN whose payload sits only in the low 16 bits) */
    uint32_t nanbits[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u};
    for (int i = 0; i < 4; i++) {
        float x;
        memcpy(&x, &nanbits[i], 4);
        CHECK(isnan(bf16_to_f32(f32_to_bf16(x))), "NaN %08x became %04x", nanbits[i], f32_to_bf16(x));
    }
    /* bf16 → f32 is bits << 16 */
    CHECK(bf16_to_f32(0x3f80) == 1.0f && bf16_to_f32(0xc000) == -2.0f && bf16_to_f32(0x7f80) == INFINITY,
          "bf16_to_f32 basics");

    /* against torch's x.to(torch.bfloat16) */
    char p[4096];
    snprintf(p, sizeof p, "%s/bf16_rounding.safetensors", testdata());
    st_file f;
    int rc = st_open(&f, p);
    CHECK(rc == MOERL_OK, "reference file missing or invalid (run tests/ref/gen_checkpoint.py): %s",
          moerl_last_error());
    if (rc != MOERL_OK) return;
    const st_tensor *x = st_find(&f, "x"), *xb = st_find(&f, "x_bf16");
    CHECK(x && xb && x->dtype == ST_F32 && xb->dtype == ST_BF16 && x->numel == xb->numel && x->numel > 2000,
          "bf16 reference tensors malformed");
    if (x && xb && x->numel == xb->numel) {
        int mism = 0;
        for (int64_t i = 0; i < x->numel; i++) {
            float v;
            uint16_t want;
            memcpy(&v, (const char *)x->data + 4 * i, 4);
            memcpy(&want, (const char *)xb->data + 2 * i, 2);
            if (f32_to_bf16(v) != want && mism++ < 5)
                fprintf(stderr, "torch bf16 of %.9g: torch %04x moerl %04x\n", (double)v, want, f32_to_bf16(v));
        }
        CHECK(mism == 0, "%d values round differently from torch", mism);
    }
    st_close(&f);
}

/* f16 decoding, exhaustively, against value = (-1)^s · (e == 0 ? m·2^-24 : (1024 + m)·2^(e-25)). */
static void test_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint32_t s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float got = f16_to_f32((uint16_t)h);
        if (e == 31) {
            if (m == 0 ? !(isinf(got) && (signbit(got) != 0) == (s != 0)) : !isnan(got)) bad++;
            continue;
        }
        double v = e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024 + m), (int)e - 25);
        if (s) v = -v;
        if ((double)got != v || (signbit(got) != 0) != (s != 0)) {
            if (bad++ < 5) fprintf(stderr, "f16 %04x: got %.9g want %.9g\n", h, (double)got, v);
        }
    }
    CHECK(bad == 0, "%d f16 values decoded wrongly", bad);
}

static int count_tmp_files(void) {
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

static void test_roundtrip(void) {
    char p[4096];
    path_in(p, sizeof p, "rt.safetensors");
    rng_state r;
    rng_seed(&r, 7);
    float a[3 * 5 * 7], b[33], s[1] = {3.25f};
    for (int i = 0; i < 105; i++) a[i] = rng_normal(&r);
    for (int i = 0; i < 33; i++) b[i] = rng_normal(&r) * 1000.0f;
    b[0] = NAN;
    b[1] = -0.0f;
    b[2] = INFINITY;
    st_writer *w = st_writer_new();
    st_writer_add(w, "zz.first", a, 3, (int64_t[]){3, 5, 7}, ST_F32);
    st_writer_add(w, "b\"quoted\\name", b, 1, (int64_t[]){33}, ST_BF16); /* JSON escaping */
    st_writer_add(w, "scalar", s, 0, NULL, ST_F32);
    st_writer_add(w, "empty", NULL, 2, (int64_t[]){0, 4}, ST_F32);
    st_writer_add(w, "a.f32_again", a, 2, (int64_t[]){15, 7}, ST_F32);
    st_writer_add_metadata(w, "format", "pt");
    st_writer_add_metadata(w, "note", "ünïcode ok");
    uint64_t predicted = st_writer_size(w);
    int rc = st_writer_finish(w, p);
    st_writer_free(w);
    CHECK(rc == MOERL_OK, "writer failed: %s", moerl_last_error());
    CHECK(count_tmp_files() == 0, "temporary file left behind");
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && (uint64_t)sb.st_size == predicted, "st_writer_size %llu != file size %lld",
          (unsigned long long)predicted, (long long)sb.st_size);

    /* header: padded with spaces to a multiple of 8; metadata intact */
    char *raw = NULL;
    size_t len = 0;
    if (moerl_read_file(p, &raw, &len) == MOERL_OK && len >= 8) {
        uint64_t N;
        memcpy(&N, raw, 8);
        CHECK(N % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)N);
        CHECK(N <= len - 8 && (N == 0 || raw[8 + N - 1] == ' ' || raw[8 + N - 1] == '}'), "header padding");
        json_error_t je;
        json_t *h = json_loadb(raw + 8, N, 0, &je);
        CHECK(h != NULL, "written header is not JSON: %s", je.text);
        json_t *md = h ? json_object_get(h, "__metadata__") : NULL;
        CHECK(md && json_is_object(md) && json_object_size(md) == 2, "metadata object missing");
        CHECK(md && !strcmp(json_string_value(json_object_get(md, "format")), "pt") &&
                  !strcmp(json_string_value(json_object_get(md, "note")), "ünïcode ok"),
              "metadata values");
        /* insertion order in the data buffer */
        json_t *first = h ? json_object_get(h, "zz.first") : NULL;
        CHECK(first && json_integer_value(json_array_get(json_object_get(first, "data_offsets"), 0)) == 0,
              "first added tensor must start at data offset 0");
        json_decref(h);
    }
    free(raw);

    st_file f;
    rc = st_open(&f, p);
    CHECK(rc == MOERL_OK, "reopen failed: %s", moerl_last_error());
    if (rc != MOERL_OK) return;
    CHECK(f.n_tensors == 5, "n_tensors %d", f.n_tensors);
    CHECK(f.n_tensors == 5 && !strcmp(f.tensors[0].name, "zz.first") && !strcmp(f.tensors[4].name, "a.f32_again"),
          "tensors not in header order");
    const st_tensor *t = st_find(&f, "zz.first");
    CHECK(t && t->dtype == ST_F32 && t->ndim == 3 && t->shape[0] == 3 && t->shape[1] == 5 && t->shape[2] == 7 &&
              t->numel == 105,
          "zz.first meta");
    if (t) {
        float out[105];
        CHECK(st_to_f32(t, out) == MOERL_OK && memcmp(out, a, sizeof a) == 0, "F32 data not bit-identical");
    }
    t = st_find(&f, "b\"quoted\\name");
    CHECK(t && t->dtype == ST_BF16 && t->ndim == 1 && t->numel == 33, "bf16 tensor meta");
    if (t) {
        float out[33];
        int ok = st_to_f32(t, out) == MOERL_OK;
        for (int i = 0; i < 33 && ok; i++) {
            uint16_t raw16;
            memcpy(&raw16, (const char *)t->data + 2 * i, 2);
            if (raw16 != f32_to_bf16(b[i])) ok = 0;
            float want = bf16_to_f32(f32_to_bf16(b[i]));
            if (!(isnan(want) ? isnan(out[i]) : memcmp(&want, &out[i], 4) == 0)) ok = 0;
        }
        CHECK(ok, "BF16 data is not the rounded input");
    }
    t = st_find(&f, "scalar");
    CHECK(t && t->ndim == 0 && t->numel == 1 && memcmp(t->data, s, 4) == 0, "scalar tensor");
    t = st_find(&f, "empty");
    CHECK(t && t->ndim == 2 && t->numel == 0 && t->begin == t->end, "empty tensor");
    CHECK(st_find(&f, "missing") == NULL, "st_find of an absent name");
    st_close(&f);

    /* overwrite in place (rename over an existing file) */
    w = st_writer_new();
    st_writer_add(w, "only", a, 1, (int64_t[]){4}, ST_BF16);
    CHECK(st_writer_finish(w, p) == MOERL_OK, "overwrite failed: %s", moerl_last_error());
    st_writer_free(w);
    CHECK(st_open(&f, p) == MOERL_OK && f.n_tensors == 1, "overwritten file");
    st_close(&f);
}

static void test_writer_errors(void) {
    char p[4096];
    path_in(p, sizeof p, "bad_writer.safetensors");
    float a[4] = {1, 2, 3, 4};
    st_writer *w = st_writer_new();
    st_writer_add(w, "x", a, 1, (int64_t[]){4}, ST_F32);
    st_writer_add(w, "x", a, 1, (int64_t[]){4}, ST_F32);
    CHECK(st_writer_finish(w, p) == MOERL_ERR && strstr(moerl_last_error(), "duplicate tensor name") &&
              strstr(moerl_last_error(), "\"x\""),
          "writer accepted a duplicate name: %s", moerl_last_error());
    st_writer_free(w);
    w = st_writer_new();
    st_writer_add(w, "x", a, 1, (int64_t[]){4}, ST_F16);
    CHECK(st_writer_finish(w, p) == MOERL_ERR && strstr(moerl_last_error(), "F32 or BF16"),
          "writer accepted F16: %s", moerl_last_error());
    st_writer_free(w);
    struct stat sb;
    CHECK(stat(p, &sb) != 0, "a failed write left a file");
    CHECK(count_tmp_files() == 0, "a failed write left a temporary file");

    /* writing into a directory that does not exist: error naming the path */
    w = st_writer_new();
    st_writer_add(w, "x", a, 1, (int64_t[]){4}, ST_F32);
    snprintf(p, sizeof p, "%s/no/such/dir/x.safetensors", g_dir);
    CHECK(st_writer_finish(w, p) == MOERL_ERR && strstr(moerl_last_error(), "no/such/dir"),
          "write into a missing directory: %s", moerl_last_error());
    st_writer_free(w);
}

static void test_valid_edge_files(void) {
    char p[4096];
    st_file f;
    /* no tensors at all */
    path_in(p, sizeof p, "empty.safetensors");
    write_st(p, "{}", 0);
    CHECK(st_open(&f, p) == MOERL_OK && f.n_tensors == 0, "empty header rejected: %s", moerl_last_error());
    st_close(&f);
    /* header length not a multiple of 8 (unpadded writers exist): data is unaligned */
    path_in(p, sizeof p, "unaligned.safetensors");
    const char *h = "{\"h\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                    "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},\"__metadata__\":{\"k\":\"v\"}}";
    write_st(p, h, 8);
    int rc = st_open(&f, p);
    CHECK(rc == MOERL_OK, "unaligned file rejected: %s", moerl_last_error());
    if (rc == MOERL_OK) {
        float o[2];
        CHECK(st_to_f32(st_find(&f, "h"), o) == MOERL_OK && o[0] == bf16_to_f32(0x1111) && o[1] == o[0],
              "unaligned bf16 read");
        uint32_t u = 0x11111111u;
        float want;
        memcpy(&want, &u, 4);
        CHECK(st_to_f32(st_find(&f, "w"), o) == MOERL_OK && o[0] == want, "unaligned f32 read");
        st_close(&f);
    }
    /* st_to_f32 refuses integer dtypes */
    path_in(p, sizeof p, "int.safetensors");
    write_st(p, "{\"i\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    rc = st_open(&f, p);
    CHECK(rc == MOERL_OK, "I32 file rejected: %s", moerl_last_error());
    if (rc == MOERL_OK) {
        float o[2];
        CHECK(st_to_f32(&f.tensors[0], o) == MOERL_ERR && strstr(moerl_last_error(), "I32"),
              "st_to_f32 on I32: %s", moerl_last_error());
        st_close(&f);
    }
}

static void test_malformed(void) {
    char p[4096];
    const char *A = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char h[1024];

    path_in(p, sizeof p, "short.safetensors");
    FILE *fp = fopen(p, "wb");
    fwrite("\x10\x00\x00", 1, 3, fp);
    fclose(fp);
    expect_reject("file shorter than 8 bytes", p, "truncated", NULL);

    path_in(p, sizeof p, "truncdata.safetensors");
    snprintf(h, sizeof h, "{%s}", A);
    write_st(p, h, 5);
    expect_reject("data truncated", p, "truncated", "'a'");

    path_in(p, sizeof p, "hdrbeyond.safetensors");
    write_raw(p, 4096, "{}", 0);
    expect_reject("header length beyond file", p, "beyond the file", "4096");

    path_in(p, sizeof p, "hdrhuge.safetensors");
    write_raw(p, 200000000ULL, "{}", 0);
    expect_reject("oversized header claim", p, "100 MB", "200000000");

    path_in(p, sizeof p, "overlap.safetensors");
    snprintf(h, sizeof h, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", A);
    write_st(p, h, 12);
    expect_reject("overlapping offsets", p, "overlap", "'b'");

    path_in(p, sizeof p, "gap.safetensors");
    snprintf(h, sizeof h, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", A);
    write_st(p, h, 20);
    expect_reject("gapped offsets", p, "gap", "'b'");

    path_in(p, sizeof p, "gapstart.safetensors");
    write_st(p, "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16);
    expect_reject("data not starting at 0", p, "gap", "'b'");

    path_in(p, sizeof p, "dtype.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F8_E9M9\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    expect_reject("unknown dtype", p, "unknown dtype 'F8_E9M9'", "'a'");

    path_in(p, sizeof p, "size.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_reject("shape/size mismatch", p, "size mismatch", "needs 12 bytes");

    path_in(p, sizeof p, "dup.safetensors");
    snprintf(h, sizeof h, "{%s,\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", A);
    write_st(p, h, 16);
    expect_reject("duplicate name", p, "duplicate tensor name", "\"a\"");
    /* jansson names the key in its own message only up to 20 bytes: a real tensor name is longer */
    path_in(p, sizeof p, "dup_long.safetensors");
    snprintf(h, sizeof h,
             "{\"model.layers.0.mlp.experts.7.down_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2],"
             "\"data_offsets\":[0,8]},\"model.layers.0.mlp.experts.7.down_proj.weight\":{\"dtype\":\"F32\","
             "\"shape\":[2],\"data_offsets\":[8,16]}}");
    write_st(p, h, 16);
    expect_reject("duplicate long name", p, "duplicate tensor name",
                  "\"model.layers.0.mlp.experts.7.down_proj.weight\"");
    /* the same key spelled with escapes (\u0062 = b, an escaped quote) is still named decoded */
    path_in(p, sizeof p, "dup_escaped.safetensors");
    snprintf(h, sizeof h,
             "{\"a\\\"bcdefghijklmnopqrstuvwxyz\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"a\\\"\\u0062cdefghijklmnopqrstuvwxyz\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}");
    write_st(p, h, 16);
    expect_reject("duplicate escaped name", p, "duplicate tensor name", "\"a\"bcdefghijklmnopqrstuvwxyz\"");

    path_in(p, sizeof p, "trailing.safetensors");
    snprintf(h, sizeof h, "{%s}", A);
    write_st(p, h, 9);
    expect_reject("trailing bytes", p, "trailing bytes", NULL);

    path_in(p, sizeof p, "notjson.safetensors");
    write_st(p, "{\"a\": [1, 2", 0);
    expect_reject("non-JSON header", p, "not valid JSON", NULL);

    path_in(p, sizeof p, "binary.safetensors");
    write_st(p, "\x89PNG\r\n\x1a\n", 0);
    expect_reject("binary header", p, "not valid JSON", NULL);

    path_in(p, sizeof p, "array.safetensors");
    write_st(p, "[1, 2]", 0);
    expect_reject("header is an array", p, "must be a JSON object", NULL);

    path_in(p, sizeof p, "beginend.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8);
    expect_reject("begin > end", p, "begin 8 > end 0", "'a'");

    path_in(p, sizeof p, "negshape.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8);
    expect_reject("negative dimension", p, "shape[0] must be a non-negative integer", NULL);

    path_in(p, sizeof p, "realshape.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8);
    expect_reject("real-valued dimension", p, "shape[0]", "a real number");

    path_in(p, sizeof p, "nodtype.safetensors");
    write_st(p, "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_reject("missing dtype", p, "'dtype'", "missing");

    path_in(p, sizeof p, "offsets3.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8);
    expect_reject("data_offsets of length 3", p, "data_offsets", "[begin, end]");

    path_in(p, sizeof p, "hugeshape.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0);
    expect_reject("element count overflow", p, "too large", NULL);

    path_in(p, sizeof p, "meta.safetensors");
    snprintf(h, sizeof h, "{%s,\"__metadata__\":{\"format\":3}}", A);
    write_st(p, h, 8);
    expect_reject("metadata value not a string", p, "__metadata__", "'format'");

    path_in(p, sizeof p, "entry.safetensors");
    write_st(p, "{\"a\":[1]}", 0);
    expect_reject("entry not an object", p, "'a'", "expected an object");

    snprintf(p, sizeof p, "%s/does_not_exist.safetensors", g_dir);
    expect_reject("missing file", p, "cannot open", NULL);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/st_tmp_XXXXXX", testdata());
    if (moerl_mkdirs(testdata()) != MOERL_OK || !mkdtemp(g_dir)) {
        fprintf(stderr, "cannot create a temporary directory under %s\n", testdata());
        return 1;
    }
    test_bf16_rounding();
    test_f16();
    test_roundtrip();
    test_writer_errors();
    test_valid_edge_files();
    test_malformed();
    /* clean up the temporary directory (flat) */
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char p[8192];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(g_dir);
    TEST_MAIN_END();
}
