/* Fuzz target: a safetensors file image (src/model/safetensors.c, st_open_memory — the same
 * validation st_open applies to a mapped file). On success every tensor's data is read (converted
 * to fp32 where the dtype allows), so a tensor whose offsets reach past the image is an ASan
 * report; the checks of safetensors.h (tiling, sizes) are re-verified independently. */
#include "fuzz_common.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size heap copy: a read one byte past the image is caught */
    uint8_t *img = malloc(size ? size : 1);
    if (size) memcpy(img, data, size);
    st_file f;
    if (st_open_memory(&f, img, size, "fuzz.safetensors") != MOERL_OK) {
        fuzz_check_error();
        free(img);
        return 0;
    }
    uint64_t N;
    memcpy(&N, img, 8);
    const uint64_t data_len = size - 8 - N;
    uint64_t total = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const st_tensor *t = &f.tensors[i];
        FUZZ_ASSERT(t->end >= t->begin && t->end <= data_len, "tensor %s [%llu, %llu) outside %llu data bytes",
                    t->name, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_len);
        FUZZ_ASSERT(t->end - t->begin == (uint64_t)t->numel * st_dtype_size(t->dtype), "size of %s", t->name);
        FUZZ_ASSERT(st_find(&f, t->name) == t, "st_find(%s) is another tensor", t->name);
        total += t->end - t->begin;
        if (t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16) {
            float *dst = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
            FUZZ_ASSERT(st_to_f32(t, dst) == MOERL_OK, "st_to_f32(%s): %s", t->name, moerl_last_error());
            free(dst);
        } else {
            volatile uint8_t sink = 0;
            const uint8_t *p = t->data;
            for (uint64_t k = 0; k < t->end - t->begin; k++) sink ^= p[k];
            (void)sink;
        }
    }
    FUZZ_ASSERT(total == data_len, "tensors cover %llu of %llu data bytes", (unsigned long long)total,
                (unsigned long long)data_len);
    st_close(&f);
    free(img);
    return 0;
}
