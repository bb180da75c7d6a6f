/* Backend-independent parts of the distributed layer: backward groups, the DDP-style gradient bucket
 * plan, the weight-broadcast header and its bf16 rounding. Linked with both dist_local.c and mpi_dist.c. */
#include <string.h>

#include "base/common.h"
#include "dist/dist.h"

int dist_tensor_group(const moe_model *m, int i) {
    const tensor_info *t = &m->tensors[i];
    if (t->layer >= 0) return t->layer;
    /* a non-layer tensor before every decoder layer (the embedding) is final last; one after them
     * (final norm, lm_head) is final first */
    for (int j = 0; j < i; j++)
        if (m->tensors[j].layer >= 0) return m->cfg.num_hidden_layers;
    return -1;
}

dist_bucket *dist_plan_buckets(const moe_model *m, size_t first_cap_bytes, size_t cap_bytes, int *n_buckets) {
    *n_buckets = 0;
    if (cap_bytes == 0 || first_cap_bytes == 0) {
        moerl_errorf("gradient bucket plan: caps must be > 0 bytes (got first %zu, cap %zu)", first_cap_bytes,
                     cap_bytes);
        return NULL;
    }
    const int T = m->n_tensors;
    dist_bucket *b = xcalloc((size_t)(T ? T : 1), sizeof *b);
    int nb = 0;
    int hi = T - 1;
    while (hi >= 0) {
        const size_t cap = nb == 0 ? first_cap_bytes : cap_bytes;
        int lo = hi;
        size_t bytes = (size_t)m->tensors[hi].numel * sizeof(float);
        while (lo > 0) {
            const size_t next = (size_t)m->tensors[lo - 1].numel * sizeof(float);
            if (bytes + next > cap) break;
            bytes += next;
            lo--;
        }
        dist_bucket *k = &b[nb++];
        k->lo_tensor = lo;
        k->hi_tensor = hi;
        k->offset = m->tensors[lo].offset;
        k->n = (hi + 1 < T ? m->tensors[hi + 1].offset : m->n_params) - k->offset;
        k->bytes = bytes;
        k->group = dist_tensor_group(m, lo);
        for (int i = lo; i <= hi; i++) k->group = MOERL_MIN(k->group, dist_tensor_group(m, i));
        hi = lo - 1;
    }
    *n_buckets = nb;
    return b;
}

const char *dist_wdtype_name(dist_wdtype t) {
    switch (t) {
    case DIST_WDTYPE_F32: return "fp32";
    case DIST_WDTYPE_BF16: return "bf16";
    default: return "an unknown dtype";
    }
}

void dist_weight_header_make(dist_weight_header *h, int version, size_t n, size_t bucket_values, dist_wdtype dtype) {
    memset(h, 0, sizeof *h);
    memcpy(h->magic, DIST_WB_MAGIC, 8);
    h->format = DIST_WB_FORMAT;
    h->version = version;
    h->n_values = n;
    h->bucket_values = bucket_values;
    h->dtype = (uint32_t)dtype;
}

int dist_weight_header_check(const dist_weight_header *h, size_t n_expected, dist_wdtype dtype_expected) {
    if (memcmp(h->magic, DIST_WB_MAGIC, 8) != 0) {
        char got[33];
        for (int i = 0; i < 8; i++) {
            const unsigned char c = (unsigned char)h->magic[i];
            if (c >= 32 && c < 127) got[i] = (char)c;
            else got[i] = '?';
        }
        got[8] = 0;
        return moerl_errorf("weight broadcast header: magic '%s' is not '%s' (not a moerl weight broadcast, "
                            "or the ranks run different programs)",
                            got, DIST_WB_MAGIC);
    }
    if (h->format != DIST_WB_FORMAT)
        return moerl_errorf("weight broadcast header: format version %u, this build reads version %d (ranks run "
                            "different moerl builds)",
                            (unsigned)h->format, DIST_WB_FORMAT);
    if (h->bucket_values == 0)
        return moerl_errorf("weight broadcast header: trainer rank 0 refused to send (bad arguments on the root; "
                            "see its error message)");
    if (h->dtype != (uint32_t)dtype_expected)
        return moerl_errorf("weight broadcast header: policy version %d is sent as %s (dtype %u) but this rank "
                            "expects %s (rollout.dtype must be the same on the trainer and every rollout rank)",
                            (int)h->version, dist_wdtype_name((dist_wdtype)h->dtype), (unsigned)h->dtype,
                            dist_wdtype_name(dtype_expected));
    if (h->n_values != (uint64_t)n_expected)
        return moerl_errorf("weight broadcast header: policy version %d carries %llu %s values but this rank's "
                            "parameter buffer holds %zu (model configs differ between trainer and rollout?)",
                            (int)h->version, (unsigned long long)h->n_values, dist_wdtype_name(dtype_expected),
                            n_expected);
    return MOERL_OK;
}

void dist_f32_to_bf16(uint16_t *restrict dst, const float *restrict src, size_t n) {
    /* The rounding of f32_to_bf16 without its branch: add 0x7fff plus the lowest kept bit, truncate;
     * a NaN (|bits| above the infinity's) instead keeps its top 16 bits with the quiet bit set. */
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, src + i, 4);
        const uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
        const uint32_t q = (x >> 16) | 0x0040u;
        dst[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
    }
}
