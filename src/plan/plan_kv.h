/* moerl plan's paged KV cache model (issue 28): what the rollout engine's KV cache holds when it is a
 * pool of blocks (engine_config.block_size, kv_cache_bytes, enable_prefix_caching; src/rollout/engine.h)
 * rather than the slot engine's reservation of max_num_seqs × max_model_len tokens.
 *
 * A sequence of prompt P and response R tokens holds ⌈(P + R − 1)/B⌉ blocks of B tokens at its longest,
 * as the engine allocates them (kvb_seq_blocks, src/rollout/kv_blocks.h: the last sampled token's K/V
 * is never written). The response
 * length R follows the distribution moerl's rollout draws (rollout.synthetic_length: the rollouter's
 * ⌈m · U^(−1/α)⌉ capped at data.max_response_length, U uniform in (0, 1], so P(R ≤ k) = 1 − (m/k)^α for
 * m ≤ k < cap and R = cap with probability (m/(cap − 1))^α), or — with no distribution configured
 * (alpha = 0) — a fixed length (plan.mean_response_length, default the cap). With prefix sharing the
 * rollout.n sequences of a GRPO group share their prompt's ⌊(P − 1)/B⌋ full blocks (kvb_prefix_blocks: the
 * block of the last prompt token is each sequence's own, recomputed to sample from), so a group holds
 * S + n · E[⌈(P + R − 1)/B⌉ − S] blocks, S = ⌊(P − 1)/B⌋
 * (n = min(rollout.n, max_num_seqs): a batch never holds more of a group than it has sequences).
 * Expectations are exact sums over the distribution (no sampling). */
#ifndef MOERL_PLAN_KV_H
#define MOERL_PLAN_KV_H

#include <stdint.h>

typedef struct {
    int prompt_len;        /* P: data.max_prompt_length (plan's assumed prompt) */
    int max_response;      /* the cap: data.max_response_length */
    double synth_alpha;    /* rollout.synthetic_length.alpha: > 0 the Pareto tail, 0 a fixed length */
    int synth_min;         /* rollout.synthetic_length.min (m) */
    int fixed_response;    /* alpha = 0: the response length assumed (1 ..  max_response) */
    int block_size;        /* B: rollout.block_size */
    int group_size;        /* rollout.n */
    int prefix_caching;    /* rollout.enable_prefix_caching */
    int max_num_seqs;      /* rollout.max_num_seqs (per engine replica) */
    int max_model_len;     /* the slot engine's reservation per sequence (P + cap) */
    double token_bytes;    /* KV bytes of one token on one rollout device (all layers' K and V) */
    double budget_bytes;   /* the KV budget per rollout device; 0 = the reservation (max_num_seqs × max_model_len) */
} plan_kv_input;

typedef struct {
    double mean_response;       /* E[R], tokens */
    double mean_tokens;         /* E[P + R] */
    double blocks_per_seq;      /* E[⌈(P + R − 1)/B⌉], no sharing */
    int shared_blocks;          /* ⌊(P − 1)/B⌋ full prompt blocks a group shares (0 without prefix caching or n = 1) */
    double blocks_per_seq_shared; /* blocks_per_seq − shared_blocks · (n − 1)/n: a sequence's share with sharing */
    double block_bytes;         /* B · token_bytes */
    double reserved_bytes;      /* max_num_seqs · max_model_len · token_bytes: the slot engine's reservation */
    double paged_bytes;         /* max_num_seqs · blocks_per_seq_shared · block_bytes: the expected KV of a full batch */
    double budget_bytes;        /* the budget (input, or reserved_bytes when 0) */
    int64_t budget_blocks;      /* ⌊budget / block_bytes⌋ */
    double seqs_reserved;       /* ⌊budget / (max_model_len · token_bytes)⌋: sequences the reservation admits */
    double seqs_paged;          /* budget_blocks / blocks_per_seq_shared: sequences in flight on expectation
                                   (before max_num_seqs caps them) */
    double waste_reserved;      /* 1 − mean_tokens / max_model_len: reserved KV no token uses */
    double waste_paged;         /* 1 − (mean_tokens − 1) / (B · blocks_per_seq): the last blocks' unused tail
                                   (sharing saves more than this, it wastes nothing more) */
    double p_cap;               /* P(R = cap): the share of responses that reach the cap */
} plan_kv_result;

/* The paged model of in (see above). Errors name the key and value: block_size < 1 or > 2^20,
 * prompt_len or max_response < 1, alpha < 0 or not finite, synth_min < 1 (alpha > 0), fixed_response
 * outside 1..max_response (alpha = 0), group_size or max_num_seqs < 1, token_bytes ≤ 0, budget_bytes < 0
 * or a budget smaller than one sequence at the cap (⌈(max_model_len − 1)/B⌉ blocks: the engine refuses such a
 * request at engine_add). */
int plan_kv_compute(const plan_kv_input *in, plan_kv_result *out);

/* E[⌈(P + R − 1)/B⌉] and E[R] over plan_kv_compute's response distribution. Errors as plan_kv_compute. */
int plan_kv_expected_blocks(const plan_kv_input *in, double *blocks, double *mean_response, double *p_cap);

#endif
