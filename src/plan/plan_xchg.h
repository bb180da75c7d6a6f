/* Where gradient compression pays (issue 29): the time of one optimizer update's gradient exchange
 * over D data-parallel ranks for each of moerl's schemes, from the link bandwidth and the codec's
 * measured cost per element, and the crossover bandwidth below which a scheme shortens the step.
 *
 * Bytes a rank sends per gradient element (fp32 gradients, 4 B):
 *   none         the ring all-reduce: 2(D − 1)/D · 4;
 *   onebit       actor.grad_compression=onebit: every rank's payload goes to every rank (an all-gather),
 *                (D − 1) · (1/8 + 4/chunk): one sign bit per element and one fp32 scale per
 *                actor.grad_compression_chunk elements;
 *   threshold    actor.grad_compression=threshold, the same all-gather of payloads at the measured volume
 *                ratio ρ (docs/parallelism.md: 11.3× on moerl's real gradients): (D − 1) · 4/ρ;
 *   onebit_adam  actor.optim.name=onebit_adam after its warm-up: the two-stage compressed all-reduce of the
 *                momentum (src/dist/onebit.h), an all-to-all of signs then an all-gather of the server
 *                chunks: 2(D − 1)/D · 1/8 (the one scale per rank is left out).
 * Codec seconds per element (one core, the cost measured by bench/bench_compress): onebit and threshold
 * encode the rank's bucket once and decode the D payloads, t_enc + D · t_dec; onebit_adam compresses the
 * momentum (n), decodes the D received chunks (n), compresses its server chunk (n/D) and decodes the D
 * gathered chunks (n): t_enc · (1 + 1/D) + 2 · t_dec.
 * A scheme's exchange time per update is n · (codec + bytes/bw), not overlapped with the backward pass
 * (the exposed time when nothing overlaps it: moerl's reducer overlaps buckets with the backward, so a
 * run exposes at most this). It beats the exact all-reduce when n · codec < n · (b_none − b)/bw, that is
 * on links slower than the crossover (b_none − b)/codec; a scheme that sends no fewer bytes never pays. */
#ifndef MOERL_PLAN_XCHG_H
#define MOERL_PLAN_XCHG_H

#include <stdint.h>

#include "base/config.h"

typedef enum { PLAN_XCHG_NONE = 0, PLAN_XCHG_ONEBIT, PLAN_XCHG_THRESHOLD, PLAN_XCHG_ONEBIT_ADAM, PLAN_XCHG_N } plan_xchg_scheme;

/* The practice's rule of thumb (the 8×A100 practice): compress gradients above 1 MB and when communication
 * exceeds 20% of compute. */
#define PLAN_XCHG_RULE_BYTES 1e6
#define PLAN_XCHG_RULE_FRACTION 0.2

typedef struct {
    double encode_ns[PLAN_XCHG_N], decode_ns[PLAN_XCHG_N]; /* per element, one core (none: 0) */
    double threshold_ratio; /* threshold's volume ratio ρ */
    int onebit_chunk;       /* actor.grad_compression_chunk */
} plan_codec;

typedef struct {
    double elements;  /* gradient floats a rank exchanges per update */
    int ranks;        /* D: ranks of the all-reduce */
    double link_bw;   /* bytes/s a rank sends and receives; 0 = not given (no times) */
    double compute_s; /* compute per update (forward + backward); 0 = not given */
} plan_xchg_input;

typedef struct {
    double bytes_per_element; /* a rank sends, per gradient element */
    double ratio;             /* none's bytes / this scheme's */
    double codec_s;           /* codec seconds per update */
    double exchange_s;        /* codec_s + bytes / link_bw (0 when link_bw is not given) */
    double crossover_bw;      /* bytes/s: below it the scheme's exchange is shorter than none's (0: never; none: 0) */
    int shortens;             /* link_bw given and below crossover_bw */
} plan_xchg_row;

/* The scheme's name as its key spells it: none, onebit, threshold, onebit_adam. */
const char *plan_xchg_name(plan_xchg_scheme s);
/* Declare the codec keys under prefix ("plan" or "sim"): <prefix>.codec.{onebit,threshold,onebit_adam}.
 * {encode_ns,decode_ns} (defaults: docs/parallelism.md's measured Gaussian-bucket table; onebit_adam's the
 * onebit codec's) and <prefix>.codec.threshold.ratio (11.3). */
void plan_codec_def_keys(cfg *c, const char *prefix);
/* Read them (and actor.grad_compression_chunk) into *k. Errors name the key and value: costs < 0 or not
 * finite, a ratio ≤ 1, a chunk < 1. */
int plan_codec_read(const cfg *c, const char *prefix, plan_codec *k);
/* One scheme's row. Errors: ranks < 1, elements, link_bw or compute_s < 0 or not finite. */
int plan_xchg_row_compute(const plan_xchg_input *in, const plan_codec *k, plan_xchg_scheme s, plan_xchg_row *row);
/* The practice's rule of thumb for in: gradients above 1 MB and the exact exchange above 20% of compute
 * (1: compress, 0: do not, −1: compute or link not given, so only the size test is known). */
int plan_xchg_rule(const plan_xchg_input *in, const plan_xchg_row *none);

/* The 8×A100 practice's setting as an input (../shared/reference.md, practice B): 8 GPUs exchanging 30 GB of
 * gradients per sync (7.5e9 fp32 elements) in 420 ms exact — the link bandwidth that time implies for the
 * ring all-reduce, 2·7/8·30e9 B / 0.42 s = 125 GB/s per rank — in a 1.42 s step, so 1.0 s of compute. */
void plan_xchg_practice(plan_xchg_input *x);
#define PLAN_XCHG_PRACTICE_BYTES 30e9
#define PLAN_XCHG_PRACTICE_EXACT_S 0.42
#define PLAN_XCHG_PRACTICE_STEP_S 1.42

#endif
