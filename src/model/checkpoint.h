/* moerl — how Hugging Face checkpoint directories are read (src/model/checkpoint.c).
 *
 * model_load_hf, model_load_hf_inference, model_load_weights and model_check_weights (model.h)
 * read with the process-wide load options (model_set_load_opts; default: mmap, 64 MiB windows);
 * the *_opts variants below take them per call. The options never change the loaded bits: every
 * mode and window gives bit-identical parameters (tests/test_load.c); they change only speed and
 * peak resident memory (bench/bench_load.c compares the modes).
 *
 *   MODEL_LOAD_MMAP (default)  the files are mapped; an F32 file that holds the parameters in the
 *          buffer's own layout (one file, moerl's tensor order and 64-byte alignment: what moerl's
 *          own F32 save writes when no tensor needs padding) becomes the parameter buffer itself
 *          when the caller allows it (model_load_hf: a new model), with no copy; anything else
 *          (BF16/F16, stacking of other orders, shards) is converted straight from the mapping into
 *          place, in file order, in windows (window_bytes) whose pages are dropped once converted,
 *          so the peak resident set stays near the parameter buffer's size;
 *   MODEL_LOAD_COPY  mapped, every tensor copied/converted into the buffer, nothing dropped (moerl's
 *          loader before mmap adoption, kept for comparison);
 *   MODEL_LOAD_READ  each file read() whole into a heap buffer, then converted (the classic loader).
 */
#ifndef MOERL_CHECKPOINT_H
#define MOERL_CHECKPOINT_H

#include <stddef.h>

#include "model/model.h"

typedef enum { MODEL_LOAD_MMAP = 0, MODEL_LOAD_COPY, MODEL_LOAD_READ } model_load_mode;

typedef struct {
    model_load_mode mode;
    /* file bytes converted per window before its pages are dropped (mmap mode), and 4× the largest
     * slice one thread converts (at most 1 Mi elements); 0 = the default, 64 MiB. Small values
     * (tests: 4096) exercise many windows and slices on a small model. */
    size_t window_bytes;
} model_load_opts;

/* mode MODEL_LOAD_MMAP, window_bytes 0 (64 MiB). */
void model_load_opts_default(model_load_opts *o);

/* Parse a mode name: "mmap" (also "" and NULL: the default), "copy" or "read". `what` names the
 * source in the error, e.g. "environment variable MOERL_LOAD" gives
 * "environment variable MOERL_LOAD='fast': expected mmap (default), copy or read". */
int model_load_mode_parse(const char *text, const char *what, model_load_mode *mode);

/* "mmap", "copy" or "read". */
const char *model_load_mode_name(model_load_mode mode);

/* Set / get the process-wide load options used by the loaders that take none (model.h). Set them
 * once at start-up, before any thread loads a checkpoint (not synchronised). */
void model_set_load_opts(const model_load_opts *o);
void model_get_load_opts(model_load_opts *o);

/* model_load_hf (with_grads 1) or model_load_hf_inference (with_grads 0) with explicit options
 * (NULL: the process-wide ones). Same errors; on error the model is left freed (zeroed). */
int model_load_hf_opts(moe_model *m, const char *dir, int with_grads, const model_load_opts *o);

/* model_load_weights with explicit options (NULL: the process-wide ones); never adopts the mapping. */
int model_load_weights_opts(moe_model *m, const char *dir, const model_load_opts *o);

#endif
