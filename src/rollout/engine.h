/* The rollout engine: KV-cache generation with continuous batching, behaviour logprobs and
 * policy versions per token, and interruption/resume for partial rollout.
 * (In verl's fully-async system this is vLLM's place.)
 *
 * Model code is shared with training: each step runs, per layer, the same qkv_forward and
 * mlp_forward (router top-k → permute → grouped GEMM → SwiGLU → grouped GEMM → unpermute) as
 * model_forward, over all tokens of the step as one batch; only attention differs (it reads the
 * KV cache: attention_kvcache_forward).
 *
 * Scheduling (continuous batching): up to max_num_seqs sequences run at once, each with a block
 * table into the paged KV cache (docs/engine.md). Every engine_step: (1) every decoding sequence gets
 * the block of its next position, oldest first, preempting the newest running sequence when none is
 * free; (2) the running sequences are scheduled: one decode token each, then the running prefills'
 * chunks in slot order, within max_num_batched_tokens and the free blocks; (3) waiting requests are
 * admitted, FIFO, with what is left of the token budget, while the free blocks cover that chunk
 * (interrupted and preempted requests are at the front of the queue) — blocks are allocated only for
 * the tokens scheduled in the step (vLLM's scheduler); a fresh request whose whole prompt its group's
 * leader already forwarded forwards nothing (its prompt's last block copied from the leader's, with prefix
 * caching: docs/engine.md); (4) one forward over the batch (decode tokens first, then prefill chunks, in
 * slot order); (5) every sequence whose input is complete samples one token with its own RNG (a follower
 * from its leader's kept logits); (6) finished sequences give their blocks back at once.
 *
 * Behaviour logprob of a sampled token = log_softmax(logits / T)[token] for temperature T > 0 and
 * log_softmax(logits)[token] for greedy (T = 0), computed before top-k/top-p filtering — the
 * quantity verl's trainer recomputes (logprobs_from_logits(logits / temperature)) and the one a
 * decoupled/behaviour-anchored PPO loss needs.
 */
#ifndef MOERL_ENGINE_H
#define MOERL_ENGINE_H

#include <stdint.h>

#include "base/rng.h"
#include "model/model.h"

typedef enum { FINISH_NONE = 0, FINISH_STOP, FINISH_LENGTH, FINISH_ABORT } finish_reason;
const char *finish_reason_name(finish_reason r);

typedef struct {
    float temperature; /* 0 = greedy; must be ≥ 0 */
    int top_k;         /* 0 = off; else keep the k most likely tokens */
    float top_p;       /* 1 = off; else nucleus (0, 1] */
    uint64_t seed;     /* the request's own RNG seed */
    int max_tokens;    /* new tokens at most (> 0) */
    int n_stop;
    int stop_tokens[8];/* besides the model's eos_token_id (if ≥ 0) */
    int ignore_eos;
    /* Forced decoding (tests, and replaying a known trajectory): the first n_forced tokens the model
     * samples over all turns are forced[0..n_forced) instead of draws (inserted ids do not count);
     * each gets the model's behaviour logprob of that token under the tempered distribution, as a
     * draw would, and the RNG advances as if it had drawn. Ids are checked against the vocabulary.
     * NULL / 0: off. The array is the caller's and must live until the request finishes. */
    const int *forced;
    int n_forced;
} sampling_params;

/* One generation request. The caller owns it; the engine fills the outputs.
 * Invariant: n_out tokens, logprobs, versions and mask entries always have equal length.
 *
 * Multi-turn (engine_continue): the output is the whole trajectory after the prompt — the turns
 * the model sampled (mask 1) and the ids the caller inserted between them (mask 0: tool responses
 * and the template text around them), never re-encoded. Inserted tokens carry logprob 0 and the
 * version of the last sampled token before them (the turn they answer). */
typedef struct gen_request {
    int64_t id;          /* caller's id */
    int *prompt;         /* [prompt_len] token ids (owned by the caller) */
    int prompt_len;
    sampling_params sp;
    /* outputs (allocated by the engine with capacity sp.max_tokens) */
    int *out_tokens;
    float *out_logprobs;
    int *out_versions;
    unsigned char *out_mask; /* 1 = sampled by the model, 0 = inserted by engine_continue; a request
                                whose out_mask is NULL (one built outside the engine) is all model tokens */
    int n_out;
    int turn;            /* assistant turn being generated: 0, then +1 per engine_continue */
    int n_interruptions; /* times this request was interrupted and resumed */
    int n_preemptions;   /* times the engine preempted it for KV blocks (re-prefilled at readmission) */
    float *out_logits;   /* optional, caller-allocated [sp.max_tokens][V]: the raw logits each
                            token was sampled from (debugging and tests); rows of inserted tokens
                            are zero; NULL to skip */
    finish_reason finish;
    /* engine-private */
    rng_state rng;
    int slot;            /* -1 when not holding a KV slot */
    int n_cached;        /* tokens of prompt ⊕ out already in the KV cache */
    int out_cap;         /* capacity of the output arrays the engine allocated (0: the caller's) */
    int n_sampled;       /* output tokens the model sampled (mask 1) so far: the index into sp.forced */
    /* Routing record (engine_config.record_routes; rollout routing replay): [(prompt_len + sp.max_tokens) ×
     * n_moe_layers × K] int16, allocated by the engine: the experts each MoE layer routed token t of
     * prompt ⊕ output to, in the forward that first computed t (docs/rl.md, "Routing replay", says what a
     * re-prefill after a pause or an engine_continue keeps). n_routes: tokens recorded so far; the last
     * sampled token, never forwarded, has none. NULL when not recording. */
    int16_t *out_routes;
    int n_routes;
    struct gen_request *next;
    void *user;          /* free for the caller */
} gen_request;

typedef struct {
    int max_num_seqs;           /* KV slots */
    int max_model_len;          /* prompt + response tokens per sequence */
    int max_num_batched_tokens; /* tokens per step (decode tokens + prefill chunks) */
    /* moerl simulate (src/sim): the scheduling above runs unchanged but no model does — no KV cache
     * is allocated, the forward is skipped and every sampled token is 0 with behaviour logprob 0
     * (responses then end at their length limit, or at rollout.synthetic_length's). */
    int simulated;
    int bf16_weights;           /* 1: compute from bf16 weights (rollout.dtype bf16, see below) */
    /* 1: record every forwarded token's routed experts (gen_request.out_routes; rollout routing replay):
     * 2·n_moe_layers·K bytes per token of prompt ⊕ sp.max_tokens, allocated at engine_add (Qwen3-30B-A3B:
     * 48 layers × 8 = 768 B per token). Refused with simulated (no model runs) or more than 32767 experts. */
    int record_routes;
    /* Paged KV cache (vLLM's PagedAttention; issue 28). KV memory is a pool of blocks of block_size
     * tokens (all layers' K and V of those positions); a sequence holds a block table, is admitted when
     * the free blocks cover its next chunk (not its worst-case length), and is preempted (blocks freed,
     * re-prefilled later: vLLM's recompute mode) when a running sequence needs a block and none is free.
     * block_size: tokens per block (rollout.block_size; 0 = 16). kv_cache_bytes: the budget in bytes
     * (rollout.kv_cache_bytes, or rollout.gpu_memory_utilization resolved by the caller; 0 = room for
     * max_num_seqs × max_model_len tokens, the reservation of the slot engine, so nothing is ever
     * preempted). enable_prefix_caching (vLLM's key): requests whose prompts share a prefix under the same
     * policy version share its full blocks, and fresh requests with the same whole prompt copy the block of
     * its last token from the one that forwarded it (copy-on-write) and sample their first token from its
     * logits: one prefill per GRPO group (docs/engine.md, "Prefix sharing"); KV computed under an older
     * version is never reused. */
    int block_size;
    int64_t kv_cache_bytes;
    int enable_prefix_caching;
    /* vLLM's gpu_memory_utilization, used when kv_cache_bytes is 0 and this is > 0: the budget is this
     * fraction of the memory available once the engine's weights are allocated (on a CPU host:
     * /proc/meminfo's MemAvailable, else sysconf's free pages). engine_create writes the resolved
     * block_size and kv_cache_bytes (whole blocks) back: engine_get_config reports them. */
    double gpu_memory_utilization;
} engine_config;

/* bf16 weights (engine_config.bf16_weights): at every weight load the engine rounds its copy of
 * the weights to bf16 (nearest, ties to even; kept as fp32 values, so prefill-sized products and
 * the small tensors compute with exactly these values) and packs every matrix a decode step
 * reads — q/k/v/o projections, experts, LM head — as bf16 panels (gemm_packed16_pack), which the
 * decode kernels widen to fp32 in registers: half the weight bytes per decoded token, fp32
 * arithmetic. The caller's weights (the trainer's fp32 master copy) are not touched. The fp32
 * expert panels of model.moe.pack_weights are not built in this mode. */

typedef struct engine engine;

/* Create an engine for a model configuration; the engine owns its own weight buffer (filled by
 * engine_load_weights) and its KV cache. With cfg->exec.batch_invariant (rollout.batch_invariant) every
 * step runs the batch-invariant kernels (kernels.h) and a sampled token's logprob is logprob_forward's
 * on its logits row, so it equals the trainer's recomputation bit for bit (docs/rl.md, "Bit-for-bit
 * on-policy"). With bf16_weights too, those kernels read the bf16-rounded weights widened to fp32
 * (exact), so a forward from the same rounded values (the trainer's, rl/trainer.c) agrees bit for bit.
 * Errors: invalid sizes (named). */
engine *engine_create(const moe_config *cfg, engine_config ec);
void engine_free(engine *e);
/* Copy weights (a parameter-layout buffer of m) into the engine and set the policy version.
 * Only at a step boundary (the engine is single-threaded; callers serialise). */
int engine_load_weights(engine *e, const float *params, size_t n_params, int version);
int engine_version(const engine *e);
/* The engine's own weight buffer (n_params floats of its model layout) for a caller that fills it
 * in place — a rollout rank receiving a broadcast, without a second copy of the weights — followed
 * by engine_set_version, which also rebuilds what engine_load_weights derives from the weights (the
 * packed expert panels of model.moe.pack_weights). Only at a step boundary, like engine_load_weights. */
float *engine_weight_buffer(engine *e);
void engine_set_version(engine *e, int version);
/* bf16 weights straight in (engine_config.bf16_weights; a rollout rank receiving a bf16 weight
 * broadcast, dist_bcast_weights_bf16): engine_weight_buffer_bf16 is room for n_params bf16 values
 * inside the engine's own weight buffer (its upper half, so no second copy of the weights); the
 * caller fills it and calls engine_set_version_bf16, which packs the bf16 panels directly from
 * those values and then widens them in place to the fp32 values prefill and the small tensors read
 * (exact: bf16 → fp32 is the bits shifted up). The engine then computes exactly as after
 * engine_load_weights of any fp32 weights that round (nearest, ties to even) to these values.
 * Between the two calls the engine's fp32 weights are garbage: only at a step boundary, like
 * engine_weight_buffer. engine_load_weights_bf16 does both from the caller's w[n_params].
 * Errors: the engine computes from fp32 weights (bf16_weights = 0; NULL from the buffer call),
 * n_params differs from the model layout's. */
uint16_t *engine_weight_buffer_bf16(engine *e);
int engine_set_version_bf16(engine *e, int version);
int engine_load_weights_bf16(engine *e, const uint16_t *w, size_t n_params, int version);
/* The engine's inference model (weights in the engine's buffer). */
const moe_model *engine_model(const engine *e);
/* Expert parallelism over rollout ranks: the engine was created from a config whose exec.ep_size /
 * ep_rank select this rank's experts, and every step's MoE layers exchange their routed rows through
 * the runtime ep: an object beginning with a model_par_head (model/forward.h) whose table has
 * moe_forward and moe_idle (src/parallel/ep.h's ep_state). Then every rank of the group must step
 * together: engine_step on the ranks with work, engine_idle_step (the exchanges with no rows of its
 * own: moe_idle) on the others. NULL turns it off. Errors: a runtime without those hooks. */
int engine_set_ep(engine *e, void *ep);
/* Tensor parallelism over rollout ranks (rollout.tensor_model_parallel_size, vLLM's tensor_parallel_size): the
 * engine was created from tp_config_apply's slice (src/parallel/tp.h, experts split: heads, kv heads, the dense
 * and every expert's width, the vocabulary over P), its weights are that slice (tp_slice_range), and tp is an
 * object beginning with a model_par_head whose table has tp_allreduce_f32 over the P ranks of the replica
 * (src/parallel/tp_rollout.h). Every step then sums the embedding, each layer's o_proj and MLP outputs over the
 * group (one all-reduce after attention and one after the MLP per layer) and gathers the LM head's columns
 * into the whole [V] logits, from which every rank samples the same token (the request's own RNG): every rank
 * of the group must hold the same requests and call engine_step together. KV per rank: nkv/P heads.
 * NULL turns it off (refused while the engine holds a slice). Errors: a runtime without the hook, a whole
 * config, experts kept whole, rollout EP or batch-invariant kernels on the same engine. */
int engine_set_tp(engine *e, void *tp);
int engine_idle_step(engine *e);
/* The configuration the engine was created with. */
engine_config engine_get_config(const engine *e);
/* Validate and enqueue; allocates the outputs (capacity sp.max_tokens) when r has none, and with
 * engine_config.record_routes the routing record (gen_request.out_routes) when r has none.
 * Errors (request untouched): empty prompt, prompt_len ≥ max_model_len,
 * a token outside the vocabulary, temperature < 0 or not finite, top_p ∉ (0,1], top_k < 0,
 * max_tokens ≤ 0. */
int engine_add(engine *e, gen_request *r);
/* One scheduler step. Finished requests (finish != NONE) are appended to done[] (capacity
 * max_num_seqs + queued); returns their count, or MOERL_ERR. */
int engine_step(engine *e, gen_request **done, int done_cap);
/* Requests running or waiting. */
int engine_num_unfinished(const engine *e);
int engine_num_running(const engine *e);
/* Pause at a step boundary: every running request gives up its KV slot and keeps its tokens,
 * logprobs and versions; it is counted as interrupted and moved to the paused list. Returns
 * the number of interrupted requests (their pointers go to out[] if non-NULL). Waiting
 * requests stay queued. */
int engine_pause(engine *e, gen_request **out, int out_cap);
/* Resume: paused requests go to the FRONT of the waiting queue (interrupted first); at their
 * admission prompt ⊕ partial response is re-prefilled under the current weights. A paused
 * request that already reached its length limit is returned finished (FINISH_LENGTH) via done[]. */
int engine_resume(engine *e, gen_request **done, int done_cap);
/* Abort everything (running, waiting, paused): each gets FINISH_ABORT and is returned in out[]. */
int engine_abort(engine *e, gen_request **out, int out_cap);
/* Continue a finished turn (multi-turn rollouts): append the n inserted token ids (the tool turn's
 * template text, as ids — never re-encoded) to r's output with mask 0, logprob 0 and the version of
 * r's last sampled token, then queue r (at the back) to generate the next assistant turn. At its
 * admission prompt ⊕ every output token (sampled and inserted) is prefilled under the current
 * weights; the KV slot of the previous turn is not kept. The turn samples from its own stream,
 * seeded with engine_turn_seed(sp.seed, turn), so a continued request samples exactly as a fresh
 * request whose prompt is prompt ⊕ outputs and whose seed is that turn seed. The caller may change
 * r->sp's stop tokens (n_stop, stop_tokens, ignore_eos) and temperature/top_k/top_p before the call;
 * sp.max_tokens and sp.seed stay (a changed max_tokens is refused). sp.max_tokens bounds the whole output (sampled + inserted) over
 * all turns, and prompt ⊕ output stays below max_model_len.
 * Returns 1 if r was queued; 0 if the inserted ids leave no room for a new token — then nothing is
 * appended and r is finished with FINISH_LENGTH (as verl's agent loop ends a trajectory whose tool
 * response would overflow the response length); MOERL_ERR (r untouched) if r is not a request finished
 * with FINISH_STOP by this engine, n < 0, an id is outside the vocabulary or the sampling parameters
 * are invalid (as engine_add). */
int engine_continue(engine *e, gen_request *r, const int *ids, int n);
/* The RNG seed of assistant turn `turn` of a request seeded with `seed` (turn 0: seed itself). */
uint64_t engine_turn_seed(uint64_t seed, int turn);
/* The routing record's shape (engine_config.record_routes): n_moe_layers MoE layers (those with a router,
 * in layer order) × k experts per token; returns their product, the int16 entries per recorded token of
 * gen_request.out_routes. 0 (and 0, 0) when the engine does not record or the model has no MoE layer. */
int engine_route_width(const engine *e, int *n_moe_layers, int *k);
/* Release a finished request's output buffers (out_routes too). */
void gen_request_free_outputs(gen_request *r);

/* Counters for benchmarks/metrics. prefill_tokens: positions forwarded from a prompt or re-forwarded
 * after a preemption (prefill_tokens + prefix_hit_tokens ≥ every admitted prompt's length, equal without
 * preemption); decode_tokens: a running sequence's newest sampled token, one per sequence and step. */
typedef struct {
    int64_t steps, prefill_tokens, decode_tokens, generated_tokens;
    int64_t kv_reads;   /* Σ over forwarded tokens of the positions each attends (pos + 1): KV rows read */
    double forward_s, sample_s;
    /* paged KV cache: blocks in the pool, the most held at once, preemptions (a running sequence
     * giving its blocks back to be re-prefilled later), prompt tokens served from shared blocks or
     * copied from the group leader's tail (not forwarded) */
    int64_t kv_blocks_total, kv_blocks_peak, preemptions, prefix_hit_tokens;
} engine_stats;
engine_stats engine_get_stats(const engine *e);
/* The paged KV cache now: blocks held by running sequences (shared ones once) and the positions their
 * K/V rows fill (Σ over running sequences of the tokens cached; a shared block counts once per
 * sharer, so with sharing the second can exceed the first × block_size). */
void engine_kv_usage(const engine *e, int64_t *blocks_held, int64_t *tokens_cached);

/* Before any engine exists: refuses a KV budget of kv_cache_bytes (> 0; 0 = the reservation or
 * gpu_memory_utilization, resolved when the engine is created, so not checked here) that cannot hold one
 * request of len tokens (its longest prompt ⊕ max_tokens) in blocks of block_size (0 = 16) positions of
 * model c — the refusal engine_add would make, with the same count (kvb_seq_blocks). key names the
 * budget's configuration key and what says where len comes from; the error gives the budget and the
 * need in blocks and bytes, and the bytes that would do. */
int engine_check_kv_budget(const moe_config *c, int block_size, int64_t kv_cache_bytes, int64_t len, const char *key,
                           const char *what);

/* Sample one token from logits[V] with the request's parameters and RNG; returns the token and
 * writes its behaviour logprob (definition above). Exposed for tests. scratch: [2V] floats. */
int sample_token(const float *logits, int V, const sampling_params *sp, rng_state *rng, float *logprob,
                 float *scratch);
/* The behaviour logprob of token tok under logits[V] / temperature (temperature 0 or less: 1), as
 * sample_token defines it (the full tempered distribution). */
float token_logprob(const float *logits, int V, float temperature, int tok);

#endif
