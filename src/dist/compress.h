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
 *   would pull τ to 0 and send everything); each element with |x| > τ travels as its sign and the
 *   exponent e of the power of two nearest to |x| in log space (no mantissa: D gives ±2^e; e =
 *   ⌊log2|x|⌋ + 1 iff the significand exceeds √2, capped at 127), and the kept indices travel as a
 *   bitmap or as Rice-coded gaps, whichever is smaller for the bucket. Since |x|/2^e ∈ (1/√2, √2]
 *   (or [1, 2) at the cap), x − (±2^e) is exact in fp32 (Sterbenz), so D(payload) + e' == x holds
 *   bit for bit; the dropped mantissa waits in the residual like the elements below τ.
 *   A bucket holding a non-finite element travels raw (every float as it is, residual cleared), so
 *   inf/NaN reach the reduced gradient as the exact all-reduce would deliver them.
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

/* Payload bytes needed at most for n elements (threshold: 16 + 4n, its raw form, which bounds every
 * coded form: at most n index bits and 10 bits per kept value). */
size_t compress_max_bytes(grad_compression c, size_t n, int chunk);

/* Compress x = g + e in place of the residual: reads g[n] and e[n], writes the payload into out
 * (capacity compress_max_bytes) and e ← (g + e) − D(payload). Returns the payload size in bytes.
 * Payload layouts, little-endian —
 * threshold (n < 2^32): a 16-byte header: u32 n, u32 k (kept), u8 index code (0 bitmap, 1 Rice,
 *   2 raw), u8 Rice parameter r (0 unless Rice), u8 exponent bits b (0..9), u8 0, i32 e0 (the
 *   smallest exponent); then one bit stream, least significant bit first, zero-padded to a byte:
 *   k values of 1 + b bits (bit 0 the sign, 1 = negative; bits 1..b: e − e0) in index order, then
 *   the indices — bitmap: n bits, 1 = kept; Rice: per kept index its gap (index − previous index − 1,
 *   the first: the index itself) as gap >> r one-bits, a zero bit, and the r low bits of the gap.
 *   Raw (code 2, k = n, r = b = e0 = 0): n × f32 after the header.
 * onebit: u32 n, u32 chunk, ceil(n/chunk) × f32 scale, ceil(n/8) bytes of sign bits (1 = negative). */
size_t compress_bucket(grad_compression c, const float *g, float *e, size_t n, int chunk, void *out);

/* Add D(payload) into acc[n] (acc += decompressed). Errors: a payload inconsistent with n or with
 * its own length, or with a field outside the layout above (a malformed message from another rank:
 * named, never read past len; a threshold payload is validated whole before acc is touched). */
int decompress_add(grad_compression c, const void *payload, size_t len, float *acc, size_t n);

/* The threshold codec's τ for x[n]: 2·median(|x|) over the nonzero x (the lower median for an even
 * count; 0 when every x is 0; inf when the median is ≥ 2^127, so nothing is kept). Exact, by a
 * radix select over the float bit patterns. */
float compress_threshold_tau(const float *x, size_t n);

/* The threshold codec's exponent for a finite a > 0: the e (in [−149, 127]) of the power of two
 * nearest to a in log space (a = m·2^f, m ∈ [1, 2): e = f + 1 iff m > √2), capped at 127. */
int compress_exp_nearest(float a);

#endif
