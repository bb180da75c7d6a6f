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
 * Interleaved (actor.virtual_pipeline_parallel_size = v > 1, Megatron-LM's virtual pipeline stages,
 * Narayanan et al. 2021 §2.2.2): the layers are cut into pp·v virtual stages (the same FLOP balance);
 * stage s holds chunks c = 0..v−1, the virtual stages c·pp + s, so a micro-batch goes round the ring
 * of stages v times (the last stage's chunk c sends to stage 0's chunk c + 1, and back). Each
 * chunk's in-flight micro-batches have their own slots (the schedule's largest window, pp_schedule).
 * Bubble (p − 1)/(v·m + p − 1), for v× the messages; m must be a multiple of pp.
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
 * practice deadlocked there) with an error naming the count needed. Interleaved (v > 1 chunks per
 * stage, pp_options.virtual_stages): m must be a multiple of pp, as Megatron-LM requires (the schedule
 * walks groups of pp micro-batches through the chunks); the dynamic count rounds its target up to a
 * multiple of pp and tries the caps from there up until the packing gives one; a fixed packing that
 * does not is refused naming actor.virtual_pipeline_parallel_size, pp and the count needed.
 * When the caps give no allowed count (equal lengths: a cap below two sequences packs one each), the
 * dynamic count is the allowed one nearest the target (the smallest ≥ it, else the largest below)
 * among [the greedy count at max_tokens, n] — every count there is a contiguous packing — and the
 * sequences are split exactly that many ways with the smallest largest micro-batch. So with
 * pp_options.dynamic a batch is refused only when no packing (sequences whole, in order, ≤ max_tokens
 * each) has an allowed count. min_mb_tokens steers the target only: a micro-batch holds whole
 * sequences, so it can hold fewer tokens.
 *
 * Gradients and outputs. After the schedule each stage holds the gradients of its own parameters
 * (with tied embeddings the first and last stage each hold their part of the shared tensor), and only
 * the last stage reports the loss, aux, tokens and router statistics (0 on the others) — as the loss
 * callback's own sums live there. Two ways to own the model:
 *   stage-owned (pp_own_stage; par_state_init does it): as Megatron-LM, a stage holds only its
 *     units' parameters, gradients and AdamW moments — decoder layers [lo, hi), plus the embedding
 *     on stage 0 and the final norm and LM head on the last; m->params / m->grads stay buffers of
 *     the whole layout (every view and kernel unchanged) but become sparse anonymous mappings of
 *     which only the stage's range is ever touched (the pages of the others take no memory). The
 *     units are contiguous in the layout, so a stage owns ONE float range [own_lo, own_hi) per chunk
 *     (interleaved: v ranges, not adjacent; its AdamW moments hold them one after the other); with
 *     tied embeddings the last stage also holds a copy of the embedding (its LM head), stepped by
 *     stage 0 alone: pp_finish_grads sends the last stage's part of its gradient to stage 0, and
 *     pp_adamw_step sends the updated embedding back (Megatron's embedding group does the same with
 *     an all-reduce). Gradients are summed over the stage's data-parallel ranks only
 *     (grid.stage_comm, pp_finish_grads), the optimizer steps the stage's range (pp_adamw_step: the
 *     global norm summed over pp_comm), and pp_gather_full assembles the whole model on one stage
 *     (checkpoints, weight sync, evaluation). The caller sums losses and statistics over all
 *     trainer ranks as before (the non-last stages add 0) and creates no gradient reducer.
 *   replicated (pp_state_new alone; benchmarks and the replicated test): m stays whole on every
 *     rank; the caller sums the gradients over ALL trainer ranks (the reducer over trainer_comm), so
 *     pp stages and dp pipelines add up at once, and steps plain AdamW on every rank.
 * Forward-only passes (compute_logprobs, compute_router_counts in train.c dispatch to
 * pp_compute_logprobs / pp_compute_router_counts) run the stages forward only and give every stage
 * of the pipeline the pipeline's result: the logprobs the last stage computed, the router counts of
 * all layers. A caller summing router counts over all trainers must count each pipeline once (divide
 * by pp, or sum over stage_comm only).
 * Bubble. Every step measures per stage busy time (forward + backward compute), time blocked on
 * receives, and the schedule time T (slowest stage, from a common start): idle share
 * = 1 − busy / T (perf/pipeline_bubble: the mean over stages), receive-wait share = wait / T, next
 * to the 1F1B theory (pp − 1)/(m + pp − 1). The times are all-reduced over pp_comm at the end of the
 * schedule, so every stage holds the pipeline's statistics; pp_window sums them over several schedules
 * (moerl rl: the mini-batches and PPO epochs of a version's updates). */
#ifndef MOERL_PARALLEL_PIPELINE_H
#define MOERL_PARALLEL_PIPELINE_H

#include "model/forward.h"
#include "optim/adamw.h"
#include "parallel/grid.h"
#include "train/train.h"

typedef struct {
    int dynamic;        /* 1: raise the micro-batch count from the token budget (default 1) */
    int mb_min, mb_max; /* dynamic range of the target count (default 4, 16: the practice's) */
    int min_mb_tokens;  /* dynamic: the target count is at most tokens / this (default 64); a micro-batch
                           holds whole sequences, so it may hold fewer tokens */
    int prefetch;       /* 1: post receives as early as their buffers are free (default 1) */
    int progress_us;    /* > 0: a thread drives MPI progress every this many µs during the schedule, so
                           large messages move while both ends compute (default 50); 0 = off */
    int balance_seq_len;/* sequence length assumed by the FLOP balance (attention pairs); 0 = the model's
                           max_position_embeddings, at most 4096 */
    int quiet;          /* 1: do not log the partition */
    int virtual_stages; /* model chunks per stage (interleaved 1F1B); 0 = the grid's
                           actor.virtual_pipeline_parallel_size (default 0); fixed when the state is made */
    int overlap_grads;  /* stage-owned, v > 1: sum a chunk's gradients over the stage's data-parallel ranks
                           on a thread as soon as its last backward is done (default 1; 0 turns it off: the
                           same sums after the schedule; v = 1 always sums after it, as
                           its one chunk finishes with the last backward) */
} pp_options;

/* Defaults as documented on the fields (the caller sets any other value explicitly, e.g. the
 * benchmarks' --progress-us; pp_set_options changes them on a live state). */
pp_options pp_options_default(void);

typedef struct {
    int stages, microbatches, virtual_stages;
    double step_s;           /* schedule time of the slowest stage, s */
    double busy_s, wait_s;   /* this stage: compute, blocked on receives */
    double bubble;           /* this stage's idle share 1 − busy/step */
    double bubble_mean, bubble_max, wait_share_mean; /* over the stages */
    double theory;           /* the plain 1F1B's (pp − 1)/(m + pp − 1) */
    double theory_interleaved; /* the interleaved schedule's (pp − 1)/(v·m + pp − 1) (= theory at v = 1) */
    double bytes_sent;       /* this stage's point-to-point payload of the step */
    int grad_sums_overlapped; /* chunks whose gradient sum over the stage's data-parallel ranks was started
                                 on the thread during the schedule (pp_options.overlap_grads; 0: after it) */
} pp_stats;

struct pp_state;
typedef struct pp_state pp_state;

/* Cut L = c->num_hidden_layers layers into pp contiguous stages of ≥ 1 layer minimising the
 * largest stage cost (exact, by dynamic programming over the cut points). Layer cost:
 * model_layer_train_flops for tokens = seq_len, pairs = seq_len(seq_len+1)/2; the LM head's is
 * added to the last stage. bounds[pp+1] receives the cut: stage s = [bounds[s], bounds[s+1]).
 * stage_cost[pp] (may be NULL) receives each stage's cost. Errors: pp < 1 or pp > L, seq_len < 1. */
int pp_partition(const moe_config *c, int pp, int seq_len, int *bounds, double *stage_cost);

/* Most model chunks per stage (actor.virtual_pipeline_parallel_size). */
#define PP_MAX_CHUNKS 16

/* The order in which stage `stage` of pp runs its forward (kind 0) and backward (kind 1) passes over
 * m micro-batches with v chunks per stage: kind / chunk / mbi[2·m·v] receive them; returns 2·m·v.
 * v = 1: the plain 1F1B (warm-up min(pp − stage − 1, m) forwards, pairs, cool-down backwards).
 * v > 1 (m a multiple of pp): Megatron-LM's interleaved schedule (Narayanan et al. 2021 §2.2.2): the
 * k-th forward runs chunk (k mod pp·v) / pp on micro-batch (k / (pp·v))·pp + k mod pp, the k-th
 * backward the same micro-batch on chunk v − 1 − (k mod pp·v) / pp; warm-up (pp − stage − 1)·2 +
 * (v − 1)·pp forwards (all when m = pp), then one forward and one backward in turn, then the rest
 * of the backwards. Every chunk's forwards and backwards run in micro-batch order, and the chunks'
 * last backwards come in the order v − 1, …, 0. Pure. */
int pp_schedule(int pp, int stage, int v, int m, int *kind, int *chunk, int *mbi);
/* Activation slots stage `stage` allocates per chunk for a schedule of m micro-batches (m ≤ 0: a
 * forward-only pass, 1 each): need[c] (c < v) = the largest number of chunk-c micro-batches between
 * their forward and backward in pp_schedule's order (a chunk's passes run in micro-batch order, so
 * micro-batch j uses slot j mod need[c]); v = 1 at least pp − stage (1F1B's). What each slot holds:
 * model_acts over the chunk's layers. Errors: v outside 1..PP_MAX_CHUNKS, as pp_schedule. */
int pp_slots_needed(int pp, int stage, int v, int m, int *need);
/* (Returns MOERL_ERR with a message, writing nothing, for v > 1 with m not a multiple of pp.) */

/* Micro-batch split the pipeline uses for these sequences: mb_start[0..m] as pack_microbatches
 * (mb_start needs n+1 entries), re-packed as described above when opt->dynamic (opt->virtual_stages
 * > 1: the interleaved schedule's rule). Returns m, or MOERL_ERR (a sequence longer than max_tokens;
 * m < pp, naming the count needed; v > 1 and m not a multiple of pp). */
int pp_plan_microbatches(const train_seq *seqs, int n, int max_tokens, int pp, const pp_options *opt, int *mb_start);

/* Can every batch of n sequences of at most seq_len tokens each be packed for the schedule
 * (pp_plan_microbatches with pp_options.dynamic: whole sequences in order, ≤ max_tokens per
 * micro-batch, a count ≥ pp and with v > 1 a multiple of pp)? All at seq_len is the worst case: longer
 * sequences never lower the fewest micro-batches, and any count from the fewest up to n is a packing,
 * so the answer is whether an allowed count lies in [ceil(n / floor(max_tokens / seq_len)), n].
 * 1 yes, 0 no (also seq_len > max_tokens); n ≤ 0: 1 (nothing to schedule). Pure. */
int pp_count_allowed(int n, int seq_len, int max_tokens, int pp, int v);
/* The fewest micro-batches the schedule allows for n sequences of seq_len tokens (whole sequences, ≤
 * max_tokens each, ≥ pp, with v > 1 a multiple of pp); −1 when seq_len > max_tokens (or < 1). The
 * packing exists iff this is ≤ n (pp_count_allowed). Pure. */
int pp_count_needed(int n, int seq_len, int max_tokens, int pp, int v);

/* Would pp_train_accumulate on this state accept these n sequences (pp_plan_microbatches with the
 * state's options)? MOERL_OK (also n ≤ 0), else MOERL_ERR with its message. Not collective (no
 * messages): a data-parallel caller agrees on the verdict over every pipeline before the step, so a
 * pipeline refused alone does not leave the others waiting in the step's collectives. */
int pp_check_batch(const pp_state *s, const train_seq *seqs, int n, int max_tokens);

/* A pipeline runtime on this trainer rank: the stage g->stage of g->pp over g->pp_comm. The
 * activation slots (model_acts over the stage's layers) are allocated by the first step, sized for
 * its max_tokens (again when a later step needs more). Logs the partition (layers and FLOP share of
 * each stage) unless opt->quiet. opt NULL = defaults. Not collective (no messages).
 * Errors: g or g->pp_comm NULL, pp outside 1..L. */
pp_state *pp_state_new(const par_grid *g, const moe_model *m, const pp_options *opt);
void pp_state_free(pp_state *s);
/* Replace the options (e.g. of the state par_state_init built; quiet has no effect after creation). */
void pp_set_options(pp_state *s, const pp_options *opt);
/* This stage's layer range [*lo, *hi) (interleaved: its chunk 0's). */
void pp_stage_layers(const pp_state *s, int *lo, int *hi);
/* Chunks per stage (v) and chunk c's layers [*lo, *hi): virtual stage c·pp + stage of the cut. */
int pp_chunks(const pp_state *s);
void pp_chunk_layers(const pp_state *s, int c, int *lo, int *hi);
const int *pp_bounds(const pp_state *s); /* [pp·v + 1]: the cut into virtual stages */
/* Bytes of the activation arenas of this stage's slots now (Σ over chunks and slots of model_acts'
 * arena_bytes; the slots grow to the largest schedule run so far, pp_slots_needed). */
double pp_slots_bytes(const pp_state *s);
/* Statistics of the last pp_train_accumulate (identical on every stage except the per-stage fields). */
const pp_stats *pp_last_stats(const pp_state *s);

/* The last step's metrics for a metrics line: perf/pipeline_bubble (idle share, mean over stages),
 * perf/pipeline_bubble_max, perf/pipeline_bubble_theory (the plain 1F1B's (p−1)/(m+p−1)),
 * perf/pipeline_bubble_theory_interleaved ((p−1)/(v·m+p−1), the interleaved schedule's; equal at
 * v = 1), perf/pipeline_recv_wait (receive-wait share, mean over stages), perf/pipeline_microbatches,
 * perf/pipeline_virtual_stages (v). Writes up to PP_N_METRICS keys and values; returns their count
 * (0 for a NULL state). */
#define PP_N_METRICS 7
int pp_metrics(const pp_state *s, const char **keys, double *vals);

/* The statistics of several 1F1B schedules (pp_train_accumulate calls: the mini-batches and PPO epochs of
 * a `moerl rl` update, the updates of a version window), summed so that pp_window_metrics writes the keys
 * of pp_metrics over all of them. Zero-initialise; pp_metrics is pp_window_metrics of one schedule. */
typedef struct {
    int schedules;             /* schedules added */
    int stages, virtual_stages;
    double step_s;             /* Σ_k T_k: the schedules' times (slowest stage of each), s */
    double idle_s;             /* Σ_k bubble_mean_k · T_k: idle time, mean over the stages, s */
    double wait_s;             /* Σ_k wait_share_mean_k · T_k: receive-wait time, mean over the stages, s */
    double bubble_max;         /* max_k bubble_max_k: the largest idle share of one stage in one schedule */
    double microbatches;       /* Σ_k m_k */
} pp_window;

/* Add the schedule whose statistics st holds (pp_last_stats: gathered from every stage, the same on every
 * stage of the pipeline) to w. */
void pp_window_add(pp_window *w, const pp_stats *st);
/* Add the schedules of b to a. */
void pp_window_merge(pp_window *a, const pp_window *b);
/* Combine the windows of the data-parallel replicas of a pipeline stage (collective over
 * stage_comm, every member calling it once with its window; NULL or a one-rank comm: no-op): the
 * schedules, times, idle and wait seconds and micro-batch counts summed over the replicas' pipelines,
 * bubble_max their largest, so that dp × pp runs report every pipeline, not only the leader's.
 * Errors: the collectives'. */
int pp_window_over_replicas(pp_window *w, dist_comm *stage_comm);
/* The keys of pp_metrics over w's K schedules: perf/pipeline_bubble = Σ idle / Σ T (idle time summed
 * over the schedules over their summed time, mean over stages: 1 − Σ_k busy_k / Σ_k T_k), _max (the
 * largest of one stage in one schedule), perf/pipeline_recv_wait = Σ wait / Σ T, perf/pipeline_microbatches
 * = m̄ = Σ m_k / K, perf/pipeline_bubble_theory = (p−1)/(m̄+p−1) and _theory_interleaved = (p−1)/(v·m̄+p−1):
 * the theory's idle share of the K schedules together (each (p−1) micro-batch times idle out of m_k+p−1,
 * summed), perf/pipeline_virtual_stages = v. Writes up to PP_N_METRICS keys and values; returns their
 * count (0 when w holds no schedule). */
int pp_window_metrics(const pp_window *w, const char **keys, double *vals);

/* train_accumulate through the pipeline (called by train_accumulate when opts->par->pp is set;
 * collective over pp_comm, every stage passing the same sequences and options): zero the
 * gradients (pp_zero_grad), run the 1F1B schedule, leave this stage's gradients and (last stage)
 * outputs as described above — stage-owned: to be finished by pp_finish_grads; replicated: to be
 * summed over all trainer ranks; out->n_microbatches on every stage. The loss callback runs on the
 * last stage only, in micro-batch order; opts->layer_hook (replicated use: a reducer's) is called
 * for every backward group after the gradient exchange. Errors (on every stage alike, before any message): the guard (m < pp),
 * a sequence over max_tokens, a token outside the vocabulary, stages disagreeing on the batch. */
int pp_train_accumulate(pp_state *s, moe_model *m, const train_seq *seqs, int n, const train_step_opts *o,
                        token_grad_fn fn, void *ctx, train_step_out *out);

/* ---- forward-only passes (collective over pp_comm; every stage passes the same sequences) ----
 * pp_compute_logprobs: compute_logprobs through the pipeline: the micro-batches as train_accumulate
 * packs them (max_tokens each, no dynamic count: forward-only passes have no 1F1B constraint), each
 * stage's layers in turn, the last stage's model_logprobs at `temperature`; then every stage's
 * out_logp[i][k] (k = target index − resp_start, as compute_logprobs writes) holds the last stage's
 * values (a sum over pp_comm in which the other stages add zeros: bit-identical to one rank running
 * the same micro-batches). ro (NULL: none): each stage records / compares the routes of its own MoE
 * layers (train_route_opts). Errors (on every stage, before any message): a sequence over max_tokens,
 * a token outside the vocabulary, stages disagreeing on the batch.
 * pp_compute_router_counts: compute_router_counts through the pipeline: counts[E] += the pipeline's
 * top-k counts over every MoE layer, on every stage (integers: exact). Errors as above. */
int pp_compute_logprobs(pp_state *s, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                        float temperature, float **out_logp, const train_route_opts *ro);
int pp_compute_router_counts(pp_state *s, const moe_model *m, const train_seq *seqs, int n, int max_tokens,
                             double *counts);

/* ---- stage-local ownership (see "Gradients and outputs" above) ---- */
/* The layout ranges the stages of the cut bounds[pp+1] own (pure; m needs only its tensor table, e.g.
 * model_init_layout without buffers): stage k holds floats [lo[k], hi[k]) — its decoder layers, plus
 * the embedding on stage 0 and the final norm and LM head on the last —, contiguous and tiling
 * [0, n_params). emb_lo / emb_hi (may be NULL): the embedding's range (a tied last stage's copy). */
void pp_stage_ranges(const moe_model *m, const int *bounds, int pp, size_t *lo, size_t *hi, size_t *emb_lo,
                     size_t *emb_hi);
/* Make m stage-owned: keep this stage's range of m->params (which must hold the whole model, the same
 * on every stage), free m's full buffers and put sparse mappings of the whole layout in their place
 * (views refreshed). Not collective. Until pp_release_stage (pp_state_free calls it) the model must
 * be used through the functions below and the pipeline's passes only: a whole-model forward on
 * this rank would read zeros. An inference model (m->grads NULL: the KL reference of
 * par_state_init_like) keeps no gradients and runs the forward-only passes only. Errors: already
 * owned, m without parameters, mmap failing. */
int pp_own_stage(pp_state *s, moe_model *m);
/* ---- pipeline × FSDP (parallel.c composes them): FSDP shards each stage's units over the stage's
 * FSDP group and owns the memory, the gradient sums and the optimizer; the pipeline runs the schedule.
 * pp_stage_units: on[L+2] (FSDP's units: 0 the embedding, l+1 layer l, L+1 the final norm and LM head)
 * = 1 for this stage's units (its chunks' layers, the embedding on stage 0, the head on the last).
 * pure. pp_set_sharded: the state runs on m sharded by FSDP (instead of pp_own_stage): the layout
 * ranges of m for pp_exchange_layout; par is model_acts.par of the forward-only passes (so FSDP gathers
 * there too); the micro-batch count is agreed over grid.stage_comm before every schedule (each FSDP
 * group's members run the same passes: a pipeline with fewer micro-batches re-packs into the most, one
 * with fewer sequences than that refuses the batch on every rank); pp_zero_grad leaves the gradients
 * alone (FSDP zeroes its shard). Not collective. pp_exchange_layout: buf (layout-sized, on every stage
 * of this pipeline) holds this stage's ranges; afterwards stage `to` (−1: every stage) holds every
 * stage's at their layout offsets. Collective over pp_comm. Errors: no layout, MPI failures. */
void pp_stage_units(const pp_state *s, unsigned char *on);
void pp_set_sharded(pp_state *s, moe_model *m, void *par);
int pp_exchange_layout(pp_state *s, float *buf, int to);
/* ---- pipeline × EP (parallel.c composes them): each stage's MoE layers dispatch over the expert group
 * inside the stage (every member holds the same layers of a different pipeline); the model is EP's slice,
 * stage-owned as usual (pp_own_stage first). pp_set_experts: the expert tensors' gradients are summed over
 * expert_dp (grid.ep_dp_comm: the stage's ranks holding the same experts) and the other tensors' over
 * grid.stage_comm (pp_finish_grads); the gradient norm adds the expert tensors' squares over expert_group
 * (grid.ep_comm) before the sum over the stages (pp_adamw_step); the micro-batch count is agreed over
 * grid.stage_comm before every schedule (as pipeline × FSDP: a shorter pipeline appends empty micro-batches,
 * so every member of an expert group runs the same passes, pass for pass); par is model_acts.par of the
 * forward-only passes. Hooks (h, copied): use_slot(ctx, slot, n_slots) before every pass (forward, backward,
 * empty) of a micro-batch on activation slot `slot` of n_slots (chunks' slots numbered one after the other:
 * the expert side keeps one saved state per in-flight micro-batch); idle_layer(ctx, l, backward) for each
 * layer of an empty micro-batch's pass, in the order model_forward / model_backward run them (forward
 * lo..hi−1, backward hi−1..lo). The overlapped gradient sum (pp_options.overlap_grads) is not used (its
 * thread's collectives would interleave with EP's in an order that differs between members).
 * Not collective. Errors: the state not stage-owned, the layout's tensors out of offset order. */
typedef struct {
    void *ctx;
    void (*use_slot)(void *ctx, int slot, int n_slots);
    void (*idle_layer)(void *ctx, int layer, int backward);
} pp_expert_hooks;
int pp_set_experts(pp_state *s, dist_comm *expert_dp, dist_comm *expert_group, void *par, const pp_expert_hooks *h);
/* The model pp_set_sharded was given (NULL: none). */
moe_model *pp_sharded_model(const pp_state *s);
/* The whole model back in ordinary heap buffers of m on EVERY stage (grads zeroed); collective over
 * pp_comm. A replicated state: no-op. */
int pp_release_stage(pp_state *s);
int pp_is_owned(const pp_state *s);
/* This stage's layout range [*lo, *hi) (stage-owned only; interleaved: the hull of its chunks' ranges,
 * which it does not all hold — see pp_own_chunk_range). */
void pp_own_range(const pp_state *s, size_t *lo, size_t *hi);
/* Chunk c's layout range (stage-owned only): pp_stage_ranges' range of virtual stage c·pp + stage. */
void pp_own_chunk_range(const pp_state *s, int c, size_t *lo, size_t *hi);
/* Parameter floats this stage holds (its chunks' ranges, plus the embedding copy of a tied last stage);
 * 0 for a replicated state. Gradients hold as many; the AdamW moments 2·(Σ of the chunks' ranges). */
size_t pp_held_floats(const pp_state *s);
/* Zero this stage's gradients (all of m->grads for a replicated state). Not collective. */
void pp_zero_grad(pp_state *s, moe_model *m);
/* After pp_train_accumulate: sum the stage's gradients over grid.stage_comm (its data-parallel
 * ranks; under TP × pipeline grid.dp_comm, the stage's ranks holding the same TP slice; one all-reduce per chunk's range, chunks v − 1 … 0 — with pp_options.overlap_grads they
 * were started on a thread during the schedule as each chunk's last backward finished, and this
 * waits for them: the same calls, bit-identical sums), then (tied embeddings) add the last stage's
 * part of the embedding gradient to stage 0's. Collective over stage_comm and pp_comm. Errors: a
 * replicated state, MPI failures. */
int pp_finish_grads(pp_state *s);
/* AdamW moments over this stage's chunks' ranges, one after the other in chunk order (Σ of their floats
 * each; a replicated state is fatal). */
void pp_adamw_init(pp_state *s, adamw_state *os, adamw_config cfg);
/* own = this stage's chunks' ranges of a layout-sized vector full (e.g. a checkpoint's moments), one after
 * the other (the moments' layout). Not collective. */
void pp_slice_vec(const pp_state *s, const float *full, float *own);
/* adamw_step on the stage's range with the global gradient norm (Σ over the stages of their ranges'
 * squares, summed over pp_comm: each parameter once); the tied embedding's copy on the last stage is
 * refreshed from stage 0. Returns as adamw_step. Collective over pp_comm. */
int pp_adamw_step(pp_state *s, adamw_state *os, float lr, float loss, double *grad_norm);
/* TP × pipeline (parallel.c): fn(ctx) returns this stage's share of the squared global gradient norm — the same
 * on every member of its TP group: the split tensors' squares summed over the group, each replicated one counted
 * once — and pp_adamw_step sums those shares over pp_comm instead of its own ranges' squares. Collective as fn
 * is (every member of the TP group calls pp_adamw_step together). fn NULL: the ranges' squares (default). */
void pp_set_norm_squares(pp_state *s, double (*fn)(void *ctx), void *ctx);
/* model_acts.par of the forward-only passes (pp_compute_logprobs / _router_counts): TP × pipeline gives its
 * par_state (the TP all-reduces), pipeline × FSDP sets it through pp_set_sharded; NULL (default): none. */
void pp_set_forward_par(pp_state *s, void *par);
/* m->params was overwritten with the whole model (a checkpoint load): keep this stage's range and
 * give the other pages back. Not collective. No-op when replicated. */
void pp_take_full(pp_state *s);
/* The whole model on stage keep_stage of this pipeline: every stage sends its range of m->params
 * (and, with moments != NULL, of os's moments) there; the keeping stage receives them into its
 * m->params (pages backed until pp_release_full) and, with moments, into a layout-sized state
 * (*moments: n = n_params, step / skipped / cfg of os; NULL buffers on the other stages).
 * Collective over pp_comm. Errors: a replicated state, MPI failures. */
int pp_gather_full(pp_state *s, int keep_stage, const adamw_state *os, adamw_state *moments);
/* Undo pp_gather_full: free the moments' buffers (if any), and on the keeping stage (kept = 1) give
 * back the pages of the other stages' ranges. Not collective. */
void pp_release_full(pp_state *s, int kept, adamw_state *moments);

#endif
