/* Deterministic random numbers: xoshiro256** seeded with splitmix64 (Blackman & Vigna 2018).
 * Each request/worker owns its own rng_state, so results never depend on thread interleaving. */
#ifndef MOERL_RNG_H
#define MOERL_RNG_H
#include <stdint.h>

typedef struct { uint64_t s[4]; } rng_state;

/* Seed from a 64-bit value (splitmix64 expansion; any seed, including 0, is valid). */
void rng_seed(rng_state *r, uint64_t seed);
/* Uniform 64-bit integer. */
uint64_t rng_u64(rng_state *r);
/* Uniform float in [0, 1) with 24 random bits. */
float rng_uniform(rng_state *r);
/* Uniform double in [0, 1) with 53 random bits. */
double rng_uniform_double(rng_state *r);
/* Standard normal (Box–Muller, no caching: one call = two uniforms, deterministic). */
float rng_normal(rng_state *r);
/* Uniform integer in [0, n) (n > 0), unbiased (Lemire's multiply-shift with rejection). */
uint64_t rng_below(rng_state *r, uint64_t n);
/* Fisher–Yates shuffle of an int array. */
void rng_shuffle_int(rng_state *r, int *a, int n);
#endif
