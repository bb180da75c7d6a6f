/* Training pieces shared by SFT and the RL trainer: packing sequences into micro-batches,
 * one gradient-accumulated optimizer step over a list of sequences with per-token gradients,
 * learning-rate schedules, greedy evaluation with the rollout engine, and model setup. */
#ifndef MOERL_TRAIN_H
#define MOERL_TRAIN_H

#include <stdint.h>

#include "data/dataset.h"
#include "model/forward.h"
#include "model/model.h"
#include "rollout/engine.h" /* engine_config: eval_accuracy_paged (train.c already runs the engine) */

/* A sequence to train on: tokens[len]; the loss reads logp[t] = log p(tokens[t+1] | ≤ t) for
 * t < len−1. Only tokens t with t+1 ≥ resp_start are response targets. */
typedef struct {
    const int *tokens;
    int len;
    int resp_start;   /* index of the first response token in tokens */
    /* [len - resp_start] or NULL: 1 = a loss token (sampled by the model), 0 = a token inserted
     * between turns (tool responses and the template text around them: multi-turn rollouts, tool
     * demonstrations in SFT) — no loss, no logprob, no entropy; train_pack gives it resp_index −1.
     * NULL: every response token is a loss token. */
    const unsigned char *resp_mask;
    /* [len, n_moe_layers, K] int16 or NULL: the experts to replay for each token (model_acts.replay_routes;
     * entries −1 where none was recorded, e.g. the last sampled token, which the engine never forwarded).
     * train_pack-based passes hand them to the forward when replay is on. */
    const int16_t *routes;
} train_seq;

/* Greedy in-order packing: mb_start[0..n_mb] such that micro-batch j holds sequences
 * [mb_start[j], mb_start[j+1]) with at most max_tokens tokens. Returns n_mb, or MOERL_ERR if a
 * sequence alone exceeds max_tokens (message names it). mb_start needs n+1 entries. */
int pack_microbatches(const train_seq *seqs, int n, int max_tokens, int *mb_start);
/* Pack sequences [b0, b1) into the flat arrays of one micro-batch (each ≥ their tokens long;
 * cu_seqlens b1−b0+1): tokens, next-token targets (−1 at a sequence's end), seq_of (the sequence
 * index), resp_index (target's position in the response, −1 outside it and where the sequence's
 * resp_mask is 0). Returns N, the tokens. */
int train_pack(const train_seq *seqs, int b0, int b1, int *tok, int *cu_seqlens, int *tgt, int *seq_of,
               int *resp_index);
/* The loss tokens of s: response targets (positions resp_start.. len−1, at least 1) whose resp_mask is
 * 1 (all of them when resp_mask is NULL) — what the loss normalisation counts (RL's loss_agg_mode,
 * SFT's token mean). */
int64_t train_seq_loss_tokens(const train_seq *s);

/* Routing replay in the training passes (docs/rl.md, "Routing replay"). A pass replays the routes of
 * the sequences that carry train_seq.routes (model_acts.replay_routes of each packed micro-batch;
 * sequences without get −1: native routing). With a train_route_opts it also records and compares:
 *   record[i]  (NULL or per sequence [len, n_moe_layers, K] int16): the router's native top-k of
 *              every (token, MoE layer) THIS rank computes — its Ulysses SP tokens, its pipeline
 *              stage's layers; other entries are left as they are (initialise them to −1). A later
 *              pass with the same micro-batch token limit and layout replays them (R2).
 *   compare[i] (NULL or per sequence, entries may be NULL): the rollout's routes of the sequence in
 *              the same layout (−1 where none was recorded: not counted).
 *   count / agree / agree_native [n_moe_layers] (all or none): ADDED per MoE layer, over the (token,
 *              layer) pairs this rank computes whose compare route is recorded: their number, those
 *              whose routes used by the forward (replayed or native) equal the compare route as sets,
 *              and those whose native top-k does. Sum them over the trainer ranks, then divide. */
typedef struct train_route_opts {
    int16_t **record;
    const int16_t *const *compare;
    double *count, *agree, *agree_native;
} train_route_opts;

/* The routes of sequences [b0, b1) packed as train_pack packs their tokens, into buf [N, n_moe, K]
 * (per_token = n_moe·K entries a token; −1 for a sequence without routes). Returns buf when some
 * sequence carries routes, else NULL (nothing to replay). */
const int16_t *train_pack_routes(const train_seq *seqs, int b0, int b1, int16_t *buf, int per_token);
/* After a forward of the micro-batch of sequences [b0, b1) (packed by train_pack, cu its cu_seqlens)
 * with a->routes_out = rec: records and compares what r asks (train_route_opts) for this rank's
 * tokens and the MoE layers of a's layer range. */
void train_route_visit(const moe_model *m, const model_acts *a, const train_seq *seqs, int b0, const int *cu,
                       const int16_t *rec, const train_route_opts *r);

/* Per-micro-batch callback: after the forward and model_logprobs of the packed micro-batch, the
 * callback reads logp (and entropy if asked) for the response targets and writes
 * dlogp/dentropy [N] (zero outside responses). resp_index[n] = position of token n's target in
 * the response of its sequence, −1 where token n is not a response target; seq_of[n] = the
 * sequence's index in the caller's array. Returns the micro-batch's loss contribution. */
typedef double (*token_grad_fn)(void *ctx, const model_acts *a, const int *seq_of, const int *resp_index,
                                float *dlogp, float *dentropy);

typedef struct train_step_opts {
    int max_tokens;      /* micro-batch capacity in tokens */
    float temperature;   /* logits / T before log-softmax (RL: rollout temperature) */
    int want_entropy;
    float aux_coef;      /* router_aux_loss_coef (0 = no aux loss) */
    /* Data parallel (0 / NULL in a single process):
     * total_tokens: tokens of the WHOLE global batch over all data-parallel ranks; each micro-batch's
     *   aux loss is weighted by N / total_tokens, so the ranks' weighted aux losses (and their
     *   gradients) add up to the token-weighted mean over the global batch. 0 = this call's tokens.
     * layer_hook / layer_hook_ctx: installed on the activations for the LAST micro-batch's backward
     *   only (model_acts.layer_hook; e.g. dist_reducer_layer_done), so gradient buckets are reduced
     *   while backward still runs, once no later micro-batch can add to them. With n = 0 sequences
     *   the hook is never called (the caller's reduction still takes part with zero gradients). */
    int64_t total_tokens;
    void (*layer_hook)(void *ctx, int group);
    void *layer_hook_ctx;
    /* Global load-balancing loss (HF load_balancing_loss_func over the WHOLE mini-batch):
     * aux_counts[E] = top-k selections per expert summed over every MoE layer, micro-batch and
     *   data-parallel rank of the mini-batch (compute_router_counts, then a sum over ranks), with
     *   total_tokens its token count; then the aux gradient is exactly that of the mini-batch's aux
     *   whatever the micro-batch and rank split. NULL: each micro-batch forms its own aux.
     * aux_psum_out[E] / aux_counts_out[E] (each may be NULL): Σ of the router probabilities and of the
     *   forward's top-k counts per expert over this call's micro-batches are ADDED here, so the caller
     *   can form the value E·Σ_e counts_e·psum_e/(L·N_total)² (after summing over ranks). */
    const double *aux_counts;
    double *aux_psum_out, *aux_counts_out;
    /* Model-parallel runtime, NULL = off: an object beginning with a train_par_head (below; src/parallel's
     * par_state is one), installed on the activations (model_acts.par) for every micro-batch. */
    void *par;
    /* Routing record / agreement of this pass (NULL: none; replay follows train_seq.routes regardless). */
    const train_route_opts *routes;
} train_step_opts;

typedef struct train_step_out {
    double loss;         /* Σ of callback losses + aux_coef·(token-weighted mean aux) */
    double aux_loss;     /* token-weighted mean aux over micro-batches */
    int n_microbatches;
    int64_t n_tokens;
} train_step_out;

/* ---- Hooks of a model-parallel runtime for the training loop (filled by src/parallel/parallel.c) ----
 * train_step_opts.par and model_acts.par point to an object beginning with a train_par_head: the
 * model's hook table (model/forward.h) first, then this one. Each hook gets that object as par. A NULL
 * runtime or table is one rank (or plain data parallelism through the caller's reducer). */
typedef struct train_par_hooks {
    /* The whole micro-batch loop replaced (pipeline parallelism, src/parallel/pipeline.c: the 1F1B
     * schedule and the stages' forward-only passes); all three set or all NULL. Same contracts as
     * train_accumulate (a is not used), compute_logprobs and compute_router_counts. */
    int (*accumulate)(void *par, moe_model *m, const train_seq *seqs, int n, const train_step_opts *o,
                      token_grad_fn fn, void *ctx, train_step_out *out);
    int (*logprobs)(void *par, const moe_model *m, const train_seq *seqs, int n, int max_tokens, float temperature,
                    float **out_logp, const train_route_opts *routes);
    int (*router_counts)(void *par, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                         double *counts);
    /* train_accumulate's start: zero the gradients this rank owns (FSDP: its shard). NULL: model_zero_grad. */
    void (*zero_grad)(void *par, moe_model *m);
    /* Groups whose members must run the same number of passes (FSDP, EP): max_passes returns the most
     * passes of any member (collective: call it BEFORE the passes; −1 on error), pad_passes runs the
     * missing max − passes as idle passes after them (backward 0: forward only). NULL: no padding. */
    int (*max_passes)(void *par, int passes);
    int (*pad_passes)(void *par, int passes, int max, int backward);
    /* Ulysses sequence parallelism: sum x[n] over the sequence-parallel group in place (each rank
     * holds its own tokens' values, zeros elsewhere: the sum is exact). NULL: no SP. */
    int (*seq_allreduce)(void *par, float *x, size_t n);
} train_par_hooks;

typedef struct train_par_head {
    model_par_head model;          /* FIRST: the model's hooks, so the runtime is also a model_acts.par */
    const train_par_hooks *train;  /* NULL: none */
} train_par_head;

/* The training hooks of a runtime object par (train_step_opts.par / model_acts.par): NULL when par or
 * its table is NULL. */
static inline const train_par_hooks *train_par_hooks_of(const void *par) {
    return par ? ((const train_par_head *)par)->train : NULL;
}

/* Zero grads, run forward+backward over all sequences in micro-batches (acts sized for
 * opts->max_tokens), accumulating gradients; the aux loss of each micro-batch is weighted by its
 * share of the tokens (of opts->total_tokens when set). Does not step the optimizer. n = 0 only
 * zeroes the gradients (a data-parallel rank without sequences in this mini-batch).
 * With a runtime whose accumulate hook is set (pipeline parallelism) the micro-batch loop is the 1F1B
 * schedule of pp_train_accumulate (src/parallel/pipeline.h; a is not used): every stage of the pipeline passes
 * the same sequences; the gradients and out are this stage's share, complete after the caller's sum
 * over all trainer ranks (as for data-parallel ranks). */
int train_accumulate(moe_model *m, model_acts *a, const train_seq *seqs, int n, const train_step_opts *opts,
                     token_grad_fn fn, void *ctx, train_step_out *out);
/* Forward only: logp of each sequence's response targets into out_logp[i] (caller allocates
 * len−resp_start floats per sequence; entries whose resp_mask is 0 are set to 0). Used for
 * proximal/reference logprobs and the trainer's recomputation. With a->par (model parallel,
 * train_par_hooks): FSDP / EP members run the group's number of passes (idle ones padded, so call it
 * on every member of the group); Ulysses SP ranks each compute their tokens and every rank of the SP
 * group returns all of them. */
int compute_logprobs(const moe_model *m, model_acts *a, const train_seq *seqs, int n, int max_tokens,
                     float temperature, float **out_logp);
/* compute_logprobs that also records / compares the routes as r asks (train_route_opts; NULL: as
 * compute_logprobs). */
int compute_logprobs_routes(const moe_model *m, model_acts *a, const train_seq *seqs, int n, int max_tokens,
                            float temperature, float **out_logp, const train_route_opts *r);

/* Forward only over all sequences (micro-batched as train_accumulate packs them): ADDS each MoE
 * layer's top-k selections per expert into counts[E] (the aux loss's f numerator). */
int compute_router_counts(const moe_model *m, model_acts *a, const train_seq *seqs, int n, int max_tokens,
                          double *counts);
/* Micro-batches pack_microbatches makes of the sequences (MOERL_ERR if one does not fit). */
int count_microbatches(const train_seq *seqs, int n, int max_tokens);

/* Learning rate at step (0-based) of total: linear warmup over warmup_ratio·total steps, then
 * "constant" or "cosine" (to min_lr_ratio·lr). Source: verl's get_cosine_schedule_with_warmup /
 * get_constant_schedule_with_warmup. */
float lr_schedule(const char *style, int64_t step, int64_t total, float lr, float warmup_ratio, float min_lr_ratio);

/* Greedy accuracy on the first n_limit rows (≤ 0: all) of a dataset: prompts through the chat
 * template, responses generated with the rollout engine (temperature 0, max_new_tokens), scored
 * by the row's reward function (score ≥ 1 counts as correct). Returns MOERL_ERR on an unknown
 * data_source or an engine error. */
int eval_accuracy(const moe_model *m, const dataset *ds, int64_t n_limit, int max_new_tokens, int max_num_seqs,
                  double *accuracy, double *mean_response_len);
/* eval_accuracy with the engine's paged KV cache given: kv->max_num_seqs, block_size, kv_cache_bytes,
 * gpu_memory_utilization, enable_prefix_caching (engine_config's meanings, docs/engine.md; the other
 * fields are eval's own). Errors as eval_accuracy's, and the engine's refusal of a request that could
 * never fit the budget. */
int eval_accuracy_paged(const moe_model *m, const dataset *ds, int64_t n_limit, int max_new_tokens,
                        const engine_config *kv, double *accuracy, double *mean_response_len);

#endif
