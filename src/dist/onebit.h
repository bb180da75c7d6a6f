/* The two-stage compressed all-reduce of 1-bit Adam (Tang et al. 2021, "1-bit Adam: Communication
 * Efficient Large-Scale Training with Adam's Convergence Speed", arXiv 2102.02888, Algorithm 1 and
 * §4; the semantics of DeepSpeed's compressed_allreduce, read, not copied). It averages a buffer x[n]
 * (1-bit Adam's momentum) over W ranks, moving one bit per value plus one fp32 scale per message:
 *
 *   worker (every rank):  y = x + e_w;  s_w = ‖y‖₁/n;  send sign(y) (1 bit each) and s_w;
 *                         e_w ← y − s_w·sign(y)                       (worker error feedback)
 *   stage 1 (all-to-all): rank r receives chunk r of every rank's signs and every s_w.
 *   server (rank r, its chunk of c values, c_r of them inside [0, n)):
 *                         z = (Σ_{i=0..W−1} s_i·sign_i) · (1/W) + e_s   (sum in rank order, fp32)
 *                         s_s = ‖z‖₁/c_r;  e_s ← z − s_s·sign(z)        (server error feedback)
 *   stage 2 (all-gather): every rank receives every chunk's signs and s_s; x[r·c + j] = s_s,r·sign.
 *
 * sign(0) = +1 (as DeepSpeed). Scales: the mean |y| summed in double over the values inside [0, n),
 * then rounded to fp32 (an empty chunk has scale 0). DeepSpeed (and this file before issue 29) uses
 * ‖y‖₂/√n, which keeps ‖s·sign(y)‖₂ = ‖y‖₂; the mean |y| is instead the s that minimises the
 * compression error ‖y − s·sign(y)‖₂ that the error feedback must carry (the scaled sign of
 * Karimireddy et al. 2019, "Error Feedback Fixes SignSGD"), and a few large values raise it far less:
 * with ‖y‖₂/√n they set the magnitude every value of the buffer moves by (issue 29: the demo's
 * 1-bit Adam still collapsed after 80 versions with the RMS scale, not with the mean; see
 * docs/parallelism.md). The chunk c is ceil(n/W) rounded up to a multiple of
 * 32, so the sign words of a chunk never straddle two ranks; values past n (padding) are 0 and are
 * never written back.
 * Message (both stages): P + c/32 int32 words: words 0..P−1 the scales' fp32 bits (P = 1 without
 * segments, below), then the signs, element j of the chunk in bit j%32 of word P + j/32, 1 = negative.
 * Volume per rank and exchange: 2·(W−1)·(4 + c/8) bytes (each stage sends W−1 messages to the other
 * ranks), against 2·(W−1)/W·4n for a ring all-reduce of fp32: about 32× less for large n.
 * Every rank ends with the same x (bit for bit).
 *
 * Per-tensor scales (issue 29; DeepSpeed calls its compressed_allreduce once per parameter tensor,
 * scale ‖t‖₂/√numel of that tensor): onebit_exchange_init_segments splits [0, n) into segments (the
 * model's tensors); the worker's scale s_w is then one per segment, and the server's s_s one per
 * piece = segment ∩ server chunk, so a tensor with small momenta is not sent the large tensors'
 * magnitude. A message then carries P scale words (P = the most pieces any chunk has; unused ones 0)
 * before the signs: 4·P + c/8 bytes. One segment gives P = 1, the layout above.
 * Mask (DeepSpeed's exp_avg_mask): values with active[i] = 0 take no part — they count in no scale,
 * their sign bits are 0 and unread, their error feedback stays 0 and they decode to exactly 0. */
#ifndef MOERL_DIST_ONEBIT_H
#define MOERL_DIST_ONEBIT_H

#include <stddef.h>
#include <stdint.h>

struct dist_comm;

typedef struct onebit_exchange {
    int world, rank;   /* the group of the exchange */
    size_t n;          /* values in the reduced buffer */
    size_t chunk;      /* values per rank's server chunk (onebit_chunk) */
    float *worker_err; /* n: the worker's error feedback e_w */
    float *server_err; /* chunk: this rank's server error feedback e_s for its chunk */
    double sent_bytes; /* bytes this rank sent in its last exchange (onebit_allreduce_comm) */
    int n_seg;         /* segments with their own scale (1: the whole buffer) */
    size_t *seg;       /* n_seg + 1 increasing bounds, seg[0] = 0, seg[n_seg] = n */
    int pieces;        /* P: scale words per message (the most segments any chunk meets, ≥ 1) */
    uint8_t *active;   /* n flags, 0 = masked (onebit_exchange_set_active); NULL: all take part */
    size_t n_masked;   /* values with active[i] = 0 */
} onebit_exchange;

/* ceil(n/world) rounded up to a multiple of 32 (at least 32). */
size_t onebit_chunk(size_t n, int world);
/* int32 words of one message: 1 + chunk/32. */
size_t onebit_msg_words(size_t chunk);
/* Bytes one rank sends per exchange: 2·(world−1)·4·onebit_msg_words(chunk). */
double onebit_sent_bytes(size_t n, int world);
/* Zeroed error buffers for rank `rank` of `world` (1 ≤ world, 0 ≤ rank < world), one segment. */
void onebit_exchange_init(onebit_exchange *x, size_t n, int world, int rank);
/* The same with n_seg segments given by bounds[n_seg + 1] (copied): bounds[0] = 0, strictly
 * increasing, bounds[n_seg] = n (asserted). Each segment gets its own scale (see above). */
void onebit_exchange_init_segments(onebit_exchange *x, size_t n, int world, int rank, const size_t *bounds,
                                   int n_seg);
/* Masks values: active[n] (copied; 0 = masked, see above), or NULL to clear the mask. The mask must
 * be the same on every rank of the group, and stay fixed while the error buffers live. */
void onebit_exchange_set_active(onebit_exchange *x, const uint8_t *active);
/* int32 words of one message of x: x->pieces + chunk/32. */
size_t onebit_exchange_words(const onebit_exchange *x);
/* Bytes one rank sends per exchange of x: 2·(world−1)·4·onebit_exchange_words(x). */
double onebit_exchange_bytes(const onebit_exchange *x);
void onebit_exchange_free(onebit_exchange *x);

/* Worker stage (words = onebit_exchange_words(x) below): reads v[n], updates x->worker_err, writes world messages into send[world·words]
 * (message q for rank q: its chunk of the signs, with this rank's scale). */
void onebit_worker_compress(onebit_exchange *x, const float *v, int32_t *send);
/* Server stage: recv[world·words] holds message i from rank i (this rank's chunk); averages, adds
 * x->server_err, compresses, updates x->server_err and writes this rank's message into out[words].
 * Error: a scale that is not finite or negative in a received message (named, with the rank). */
int onebit_server_reduce(onebit_exchange *x, const int32_t *recv, int32_t *out);
/* Decode: gathered[world·words] holds every rank's server message in rank order; writes v[n].
 * Error: a scale that is not finite or negative (named, with the rank). */
int onebit_decode(const onebit_exchange *x, const int32_t *gathered, float *v);

/* The whole exchange over a dist group (two dist_comm_alltoall_i32; the group's size and rank must
 * be x->world and x->rank; c may be NULL for a world of 1: the same stages, nothing sent): v[n] in, the compressed average out, the same on every member. Sets
 * x->sent_bytes. Errors: a group that does not match x, a malformed message, a failing collective. */
int onebit_allreduce_comm(onebit_exchange *x, struct dist_comm *c, float *v);

#endif
