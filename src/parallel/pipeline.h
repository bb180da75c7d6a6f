/* Pipeline parallelism (actor.pipeline_parallel_size): the decoder layers cut into pp stages, the
 * 1F1B schedule over micro-batches, activations and their gradients sent point-to-point.
 *
 * Layout. Stage s of a pipeline (grid.pp_comm, ranked by stage) computes decoder layers
 * [bounds[s], bounds[s+1]); stage 0 also the embedding, stage pp−1 the final norm and LM head.
 * The cut (pp_partition) minimises the largest stage cost in training FLOPs
 * (model_layer_train_flops, src/model/perf.c), the LM head counted on the last stage; the
 * embedding is a row lookup (no FLOPs).
 *
 * Schedule (PipeDream-Flush / Megatron-LM's non-interleaved 1F1B, Narayanan et al. 2021 §2.2):
 * stage s runs W = min(pp−s−1, m) warm-up forwards, then m−W pairs (forward of micro-batch W+i,
 * backward of i), then W cool-down backwards. Each in-flight micro-batch keeps its own activations
 * (model_acts over the stage's layers; at most pp−s of them on stage s). Messages on pp_comm, all
 * nonblocking (isend / irecv), so the transfer runs while the stage computes:
 *   forward  s → s+1: the stage's output hidden [N,H], and (MoE models) the running sums over
 *            stages 0..s of the router top-k counts and probabilities [2E] — the load-balancing
 *            loss (HF load_balancing_loss_func) couples all layers of a micro-batch;
 *   backward s+1 → s: ∂loss/∂hidden [N,H], and the micro-batch's full counts [E] (the aux gradient
 *            of every layer needs them).
 * Look-ahead prefetch (pp_options.prefetch): the receive of micro-batch j's input is posted as soon
 * as its activation slot is free (after the backward of j − slots), the receive of its gradient right
 * after its forward, so a stage rarely waits for a message that was already sent. A message larger
 * than the transport's eager size still needs both ends inside MPI to move (Open MPI's shared-memory
 * transport); a progress thread (pp_options.progress_us) polls the engine while the stage computes.
 *
 * Micro-batches. The sequences are packed in order as train_accumulate packs them (max_tokens per
 * micro-batch). With pp_options.dynamic the count m is then raised towards the bubble's need: when
 * fewer than target = clamp(T / min_mb_tokens, max(mb_min, pp), mb_max) micro-batches come out
 * (T = the batch's tokens), the batch is re-packed with the token cap max(longest sequence,
 * ceil(T / target)). The guard: m < pp is refused (1F1B would leave a stage without work and the
 * practice deadlocked there) with an error naming the count needed.
 *
 * Gradients and outputs: additive over the trainer ranks. After the schedule each stage holds the
 * gradients of its own parameters (zeros elsewhere; with tied embeddings the first and last stage
 * each hold their part of the shared tensor), and only the last stage reports the loss, aux, tokens
 * and router statistics (0 on the others) — as the loss callback's own sums live there. So a stage is
 * to its caller what a data-parallel rank is: the caller's sum over ALL trainer ranks (the reducer
 * over trainer_comm, dist_reducer_new, and its small dist_allreduce_sum(DIST_TRAINERS) calls) gives
 * the full gradient and the global loss, over pp stages and dp pipelines at once, and every rank then
 * steps the whole optimizer on identical gradients. Parameters and optimizer state are therefore
 * replicated (the grid's stage_comm sum would cover one stage only: it needs a stage-sharded
 * optimizer, not built); a stage keeps only its layers' activations. Forward-only passes
 * (compute_logprobs, compute_router_counts) run the whole replicated model on each rank: a caller
 * summing router counts over all trainers must count each pipeline once (sum over stage_comm).
 * Bubble. Every step measures per stage busy time (forward + backward compute), time blocked on
 * receives, and the schedule time T (slowest stage, from a common start): idle share
 * = 1 − busy / T (perf/pipeline_bubble: the mean over stages), receive-wait share = wait / T, next
 * to the 1F1B theory (pp − 1)/(m + pp − 1). */
#ifndef MOERL_PARALLEL_PIPELINE_H
#define MOERL_PARALLEL_PIPELINE_H

#include "model/forward.h"
#include "parallel/grid.h"
#include "train/train.h"

typedef struct {
    int dynamic;        /* 1: raise the micro-batch count from the token budget (default 1) */
    int mb_min, mb_max; /* dynamic range of the target count (default 4, 16: the practice's) */
    int min_mb_tokens;  /* dynamic: a micro-batch keeps at least this many tokens (default 64) */
    int prefetch;       /* 1: post receives as early as their buffers are free (default 1) */
    int progress_us;    /* > 0: a thread drives MPI progress every this many µs during the schedule, so
                           large messages move while both ends compute (default 50); 0 = off */
    int balance_seq_len;/* sequence length assumed by the FLOP balance (attention pairs); 0 = the model's
                           max_position_embeddings, at most 4096 */
    int quiet;          /* 1: do not log the partition */
} pp_options;

/* Defaults as documented on the fields. The environment variable MOERL_PP_PROGRESS_US, when set,
 * overrides progress_us (benchmarks). */
pp_options pp_options_default(void);

typedef struct {
    int stages, microbatches;
    double step_s;           /* schedule time of the slowest stage, s */
    double busy_s, wait_s;   /* this stage: compute, blocked on receives */
    double bubble;           /* this stage's idle share 1 − busy/step */
    double bubble_mean, bubble_max, wait_share_mean; /* over the stages */
    double theory;           /* (pp − 1)/(m + pp − 1) */
    double bytes_sent;       /* this stage's point-to-point payload of the step */
} pp_stats;

struct pp_state;
typedef struct pp_state pp_state;

/* Cut L = c->num_hidden_layers layers into pp contiguous stages of ≥ 1 layer minimising the
 * largest stage cost (exact, by dynamic programming over the cut points). Layer cost:
 * model_layer_train_flops for tokens = seq_len, pairs = seq_len(seq_len+1)/2; the LM head's is
 * added to the last stage. bounds[pp+1] receives the cut: stage s = [bounds[s], bounds[s+1]).
 * stage_cost[pp] (may be NULL) receives each stage's cost. Errors: pp < 1 or pp > L, seq_len < 1. */
int pp_partition(const moe_config *c, int pp, int seq_len, int *bounds, double *stage_cost);

/* Micro-batch split the pipeline uses for these sequences: mb_start[0..m] as pack_microbatches
 * (mb_start needs n+1 entries), re-packed as described above when opt->dynamic. Returns m, or
 * MOERL_ERR (a sequence longer than max_tokens; m < pp, naming the count needed). */
int pp_plan_microbatches(const train_seq *seqs, int n, int max_tokens, int pp, const pp_options *opt, int *mb_start);

/* A pipeline runtime on this trainer rank: the stage g->stage of g->pp over g->pp_comm. The
 * activation slots (model_acts over the stage's layers) are allocated by the first step, sized for
 * its max_tokens (again when a later step needs more). Logs the partition (layers and FLOP share of
 * each stage) unless opt->quiet. opt NULL = defaults. Not collective (no messages).
 * Errors: g or g->pp_comm NULL, pp outside 1..L. */
pp_state *pp_state_new(const par_grid *g, const moe_model *m, const pp_options *opt);
void pp_state_free(pp_state *s);
/* This stage's layer range [*lo, *hi). */
void pp_stage_layers(const pp_state *s, int *lo, int *hi);
const int *pp_bounds(const pp_state *s); /* [pp+1] */
/* Statistics of the last pp_train_accumulate (identical on every stage except the per-stage fields). */
const pp_stats *pp_last_stats(const pp_state *s);

/* The last step's metrics for a metrics line: perf/pipeline_bubble (idle share, mean over stages),
 * perf/pipeline_bubble_max, perf/pipeline_bubble_theory ((p−1)/(m+p−1)), perf/pipeline_recv_wait
 * (receive-wait share, mean over stages), perf/pipeline_microbatches. Writes up to PP_N_METRICS
 * keys and values; returns their count (0 for a NULL state). */
#define PP_N_METRICS 5
int pp_metrics(const pp_state *s, const char **keys, double *vals);

/* train_accumulate through the pipeline (called by train_accumulate when opts->par->pp is set;
 * collective over pp_comm, every stage passing the same sequences and options): zero the
 * gradients, run the 1F1B schedule, leave this stage's gradients and (last stage) outputs as
 * described above, to be summed over all trainer ranks; out->n_microbatches on every stage. The loss
 * callback runs on the last stage only, in micro-batch order; opts->layer_hook is called for every backward group after
 * the gradient exchange. Errors (on every stage alike, before any message): the guard (m < pp),
 * a sequence over max_tokens, a token outside the vocabulary, stages disagreeing on the batch. */
int pp_train_accumulate(pp_state *s, moe_model *m, const train_seq *seqs, int n, const train_step_opts *o,
                        token_grad_fn fn, void *ctx, train_step_out *out);

#endif
