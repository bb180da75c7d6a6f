/* Gradient compression with error feedback for the data-parallel all-reduce (the 8×A100
 * practice's "1-bit gradient compression", docs/benchmarks.md). Pure codecs over one bucket of a
 * rank's gradient; the exchange (every rank's payload to every rank, then a local sum) is
 * src/dist's. Both codecs keep what they do not send in an error-feedback residual e that is added
 * to the next step's gradient, so nothing is lost, only delayed:
 *     x = g + e;  payload = C(x);  e ← x − D(payload)
 * (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019, "Error feedback fixes SignSGD").
 *
 * threshold: τ = 2·median(|x|) over the bucket's nonzero elements (the practice's dynamic τ; exact
 *   zeros — unused embedding rows, experts without tokens — never need to travel, and counting them
 *   would pull τ to 0 and send everything); the elements with |x| > τ travel as (index u32,
 *   value f32) pairs; D puts them back, zeros elsewhere.
 * onebit: per chunk of `chunk` elements one scale s = mean |x| over the chunk and one sign bit per
 *   element; D gives ±s (1-bit SGD with a per-chunk scale; the 1-bit Adam paper compresses the
 *   momentum the same way after an uncompressed warm-up).
 * Clipping "at 1.0 after decompression" is the optimizer's global-norm clip (actor.optim.clip_grad)
 * applied to the reduced gradient, as before. */
#ifndef MOERL_DIST_COMPRESS_H
#define MOERL_DIST_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { GRAD_COMPRESSION_NONE = 0, GRAD_COMPRESSION_ONEBIT, GRAD_COMPRESSION_THRESHOLD } grad_compression;

/* "none" | "onebit" | "threshold" → *out; MOERL_ERR names the accepted values. */
int grad_compression_parse(const char *name, grad_compression *out);
const char *grad_compression_name(grad_compression c);

/* Payload bytes needed at most for n elements (threshold: the worst case of every element kept). */
size_t compress_max_bytes(grad_compression c, size_t n, int chunk);

/* Compress x = g + e in place of the residual: reads g[n] and e[n], writes the payload into out
 * (capacity compress_max_bytes) and e ← (g + e) − D(payload). Returns the payload size in bytes.
 * Payload layout — threshold: u32 count, then count × (u32 index, f32 value); onebit: u32 n, u32
 * chunk, ceil(n/chunk) × f32 scale, ceil(n/8) bytes of sign bits (1 = negative), little-endian. */
size_t compress_bucket(grad_compression c, const float *g, float *e, size_t n, int chunk, void *out);

/* Add D(payload) into acc[n] (acc += decompressed). Errors: a payload inconsistent with n or with
 * its own length (a malformed message from another rank: named, never read past len). */
int decompress_add(grad_compression c, const void *payload, size_t len, float *acc, size_t n);

/* The threshold codec's τ for x[n]: 2·median(|x|) over the nonzero x (the lower median for an even
 * count; 0 when every x is 0). */
float compress_threshold_tau(const float *x, size_t n);

#endif
