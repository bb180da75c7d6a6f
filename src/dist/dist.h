/* moerl distributed layer: process groups, weight broadcast, point-to-point messages and the
 * bucketed data-parallel gradient reducer.
 *
 * This is the ONLY interface through which moerl talks to other processes. It has two
 * implementations with the same semantics:
 *   src/dist/mpi_dist.c   Open MPI (the only file that includes mpi.h); linked into build/moerl-mpi
 *                         and the MPI test/bench binaries, run under `mpirun`.
 *   src/dist/dist_local.c one process, no MPI: world size 1, every collective is an identity or a
 *                         copy, point-to-point messages go through an in-process mailbox.
 * dist_backend_name() tells which one a binary was linked with. src/dist/dist_common.c holds the
 * backend-independent parts (bucket plan, weight-broadcast header).
 *
 * Roles (dist_split_roles): the LAST n_trainers world ranks are trainers (the data-parallel group,
 * trainer_comm); the others are rollout ranks. sync_comm = {trainer rank 0 (as root 0)} ∪ all rollout
 * ranks carries the weight broadcast. A world of size 1 is "embedded": one process plays both roles.
 *
 * Errors: functions returning int give MOERL_OK or MOERL_ERR with a message (moerl_errorf) for bad
 * arguments and protocol mismatches. A failing MPI call is not returned: the MPI backend prints
 * "moerl[rank R]: MPI error at file:line: <MPI_Error_string>" and calls MPI_Abort, so no rank is left
 * hanging. moerl_fatal on any rank also reaches MPI_Abort (dist_init installs the abort hook).
 *
 * Threads: the MPI backend requires MPI_THREAD_MULTIPLE; every function may be called from any
 * thread, but collectives on one group must be called in the same order on all its members and not
 * concurrently from two threads of one rank (the reducer uses its own private communicator).
 *
 * Trainer step with the reducer (data parallel; dlogp already divided by the GLOBAL token count, so
 * the sum over ranks is the full gradient):
 *   dist_grad_reducer *r = dist_reducer_new(ctx, &model, 25.0, DIST_OVERLAP_THREAD);   // once
 *   model_zero_grad(&model); model_forward(...); model_logprobs(...);
 *   model_backward(...);            // with a per-layer hook: dist_reducer_layer_done(r, L) after the
 *                                   // head, (r, l) after layer l, (r, -1) after the embedding
 *   double exposed_s = dist_reducer_finish(r);   // grads now hold the sum over all trainers
 *   dist_allreduce_sum(ctx, DIST_TRAINERS, &loss, 1); adamw_step(...);
 *
 * Sources: MPI 3.1 standard (communicators, MPI_Comm_split, nonblocking collectives, matched probe);
 * PyTorch DistributedDataParallel (gradient buckets in reverse order, first bucket 1 MiB, then 25 MiB,
 * reduced as soon as complete); verl fully_async_policy (weight sync by a plain broadcast).
 */
#ifndef MOERL_DIST_H
#define MOERL_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef enum {
    DIST_ROLE_UNSET = 0, /* dist_split_roles not called yet */
    DIST_ROLE_EMBEDDED,  /* world size 1: rollout and trainer in one process */
    DIST_ROLE_ROLLOUT,
    DIST_ROLE_TRAINER,
} dist_role;

/* Process groups for the small collectives (dist_barrier, dist_allreduce_sum). */
typedef enum {
    DIST_WORLD = 0,   /* all ranks */
    DIST_TRAINERS,    /* trainer_comm: the data-parallel trainer ranks */
    DIST_SYNC,        /* sync_comm: trainer rank 0 (root 0) + all rollout ranks */
} dist_group;

struct dist_impl; /* backend handles (MPI communicators); private to the implementation */

/* All distributed state of one process. Fields are read-only for callers. */
typedef struct dist_ctx {
    int world_rank, world_size;
    dist_role role;                   /* after dist_split_roles */
    int n_trainers, n_rollout;        /* group sizes (n_trainers + n_rollout == world_size, except
                                         embedded mode where both are 1) */
    int first_trainer;                /* world rank of trainer rank 0 (= world_size − n_trainers) */
    int trainer_rank, trainer_size;   /* rank/size in trainer_comm; trainer_rank −1 outside it */
    int sync_rank, sync_size;         /* rank/size in sync_comm (trainer rank 0 is 0); −1 outside */
    struct dist_impl *impl;
} dist_ctx;

/* "mpi" or "local": which implementation this binary was linked with. */
const char *dist_backend_name(void);

/* Start the distributed runtime. MPI: MPI_Init_thread(MPI_THREAD_MULTIPLE) (error if the library
 * provides less), errors on MPI_COMM_WORLD return to moerl's checked wrapper, and
 * moerl_set_abort_hook makes moerl_fatal print "moerl[rank R]: ..." and call MPI_Abort(world, code),
 * and a world of more than one process sets the log's rank (log_set_rank: world rank 0 prints the lines
 * every rank logs alike, base/log.h). Local: world rank 0 of 1. argc/argv may be NULL. Returns NULL with a message on failure.
 * Call once per process; free with dist_finalize. */
dist_ctx *dist_init(int *argc, char ***argv);
/* Free the groups and shut the runtime down (MPI_Finalize). Collective over the world. Reducers must
 * be freed first. NULL is a no-op. */
void dist_finalize(dist_ctx *ctx);

/* Split the world into rollout and trainer ranks: the LAST n_trainers world ranks train, the others
 * roll out. Collective over the world; every rank must pass the same n_trainers.
 * Valid: world size 1 → n_trainers must be 1 (embedded: one process in both roles, trainer group and
 * sync group of size 1); world size P > 1 → 1 ≤ n_trainers ≤ P−1 (RL job with P−n_trainers rollout
 * ranks), or n_trainers == P (training-only job, e.g. data-parallel SFT: no rollout ranks, the sync
 * group is trainer rank 0 alone). Errors (on every rank): n_trainers outside these ranges, ranks
 * disagreeing on n_trainers. May be called again to re-split (collective); reducers made under the
 * previous split must be freed first. */
int dist_split_roles(dist_ctx *ctx, int n_trainers);

/* Barrier over a group. Error: this rank is not in the group (or roles not split for
 * DIST_TRAINERS/DIST_SYNC). */
int dist_barrier(dist_ctx *ctx, dist_group g);
/* In-place elementwise sum of buf[n] over a group (small buffers: metrics, losses). The result is the
 * same on every member. Errors: as dist_barrier; n < 0 or buf NULL with n > 0. */
int dist_allreduce_sum(dist_ctx *ctx, dist_group g, double *buf, int n);
/* Print "moerl[rank R]: abort: <msg>" and end the whole job with exit code 1 (MPI_Abort). */
void dist_abort(dist_ctx *ctx, const char *msg) __attribute__((noreturn));

/* ---- weight broadcast (trainer rank 0 → every rollout rank) ---- */

#define DIST_WB_MAGIC "MOERLWB1" /* 8 bytes, no terminator on the wire */
#define DIST_WB_FORMAT 2          /* 2: the header carries the payload's dtype */

/* Element type of a weight broadcast's payload. */
typedef enum {
    DIST_WDTYPE_F32 = 0,  /* the trainer's fp32 values, bit for bit */
    DIST_WDTYPE_BF16 = 1, /* bf16 (the fp32 values rounded to nearest, ties to even; NaN stays NaN, made
                             quiet): a rollout engine with rollout.dtype bf16 computes from these */
} dist_wdtype;

/* "fp32" / "bf16" (and "dtype <k>" for an unknown value). */
const char *dist_wdtype_name(dist_wdtype t);

/* Header sent before the weights (40 bytes, host byte order: all ranks run on one architecture). */
typedef struct {
    char magic[8];           /* DIST_WB_MAGIC */
    uint32_t format;         /* DIST_WB_FORMAT */
    int32_t version;         /* policy version of these weights */
    uint64_t n_values;       /* parameter values that follow (of dtype) */
    uint64_t bucket_values;  /* values per bucket (last bucket shorter); 0 = the root refused to
                                send (bad arguments on the root), nothing follows */
    uint32_t dtype;          /* dist_wdtype of the payload */
    uint32_t reserved;       /* 0 */
} dist_weight_header;

/* Fill a header for `version`, n values of dtype, bucket_values per bucket. */
void dist_weight_header_make(dist_weight_header *h, int version, size_t n, size_t bucket_values, dist_wdtype dtype);
/* Validate a received header against this rank's buffer of n_expected values of dtype_expected.
 * Errors (message names the field, the value received and the value expected): magic differs (not a
 * moerl weight broadcast), format differs, bucket_values == 0 (the root refused), dtype differs
 * (rollout.dtype differs between the trainer and this rank), n_values != n_expected. */
int dist_weight_header_check(const dist_weight_header *h, size_t n_expected, dist_wdtype dtype_expected);

/* fp32 → bf16, round to nearest, ties to even; NaN keeps its sign and top payload bits and is made
 * quiet (bit 6 of the bf16 set). Bit-identical to f32_to_bf16 (src/model/safetensors.h), which the
 * rollout engine rounds with, and to gemm_packed16_pack's rounding; branch-free, so it vectorises.
 * dst and src must not overlap. Runs on the OpenMP threads from n ≥ 65536 on (memory-bound: one
 * thread reaches about half the machine's copy bandwidth). */
void dist_f32_to_bf16(uint16_t *dst, const float *src, size_t n);

typedef struct {
    size_t bytes;    /* payload bytes sent (root) or received (rollout rank), header excluded:
                        n · 4 for fp32, n · 2 for bf16; 0 when nothing travelled (a sync group of one) */
    double seconds;  /* wall time of the whole call on this rank (the root's includes the rounding) */
    int n_buckets;   /* buckets (one MPI_Ibcast each) of the payload */
} dist_xfer_stats;

/* Broadcast params[n] from trainer rank 0 to every rollout rank over sync_comm, in buckets of
 * bucket_bytes (rounded down to whole floats), one MPI_Ibcast per bucket with up to 16 in flight
 * (pipelined; the root's buffer must stay untouched until the call returns), after the header
 * {MOERLWB1, format 2, *version, n, bucket floats, fp32}. Collective over sync_comm. On the root, *version
 * is the version to send; on a rollout rank it receives the root's version. Rollout ranks use the
 * root's bucket size (their bucket_bytes is ignored). Ranks outside sync_comm (trainer ranks ≠ 0)
 * return MOERL_OK at once with zero stats. After the header every member learns whether all accepted
 * it (one small allreduce), so a mismatch fails on EVERY member instead of hanging:
 * Errors: on a rollout rank, the header check fails (message from dist_weight_header_check — a root
 * sending bf16 to a rank calling this fp32 receive is one; its params and *version are left
 * untouched); on the root, a rollout rank rejected the header (message names the highest rejecting
 * world rank) or its own arguments are bad (params NULL with n > 0, bucket_bytes < 4) — then the
 * rollout ranks fail too, naming the root. st may be NULL.
 * Embedded / training-only jobs (sync group of size 1) return at once after validating arguments.
 * Source: verl fully_async_policy (weight reshard by a plain broadcast). */
int dist_bcast_weights(dist_ctx *ctx, float *params, size_t n, int *version, size_t bucket_bytes,
                       dist_xfer_stats *st);

/* The same broadcast with a bf16 payload (half the bytes): for rollout ranks whose engine computes
 * from bf16 weights (rollout.dtype bf16). The root (trainer rank 0) reads its fp32 master weights
 * src[n] and rounds them bucket by bucket (dist_f32_to_bf16) into a ring of staging buffers — at most
 * max(2 buckets, 64 MiB) and never more than 16 buckets, the broadcasts in flight; kept by the context
 * for the next call — each broadcast as soon as it is rounded (the root tests the broadcasts in flight
 * while it rounds, so they progress meanwhile) and no full bf16 copy is made on the root;
 * bucket_bytes counts wire bytes (rounded down to whole bf16 values, at least 2). Every rollout rank
 * receives the rounded values into dst[n]. The header says bf16: a rollout rank calling the fp32
 * dist_bcast_weights fails naming both types, and vice versa. The values equal rounding the fp32
 * broadcast on arrival, bit for bit. On the root dst may be NULL; when it is given, the root also
 * writes the rounded values there (in a sync group of one — embedded, training-only — that is all
 * the call does: no bytes travel, st->bytes is 0). src is read only on the root, dst written only
 * where given. Errors: as dist_bcast_weights (root: src NULL with n > 0, bucket_bytes < 2; rollout
 * rank: dst NULL with n > 0, header mismatch). */
int dist_bcast_weights_bf16(dist_ctx *ctx, const float *src, uint16_t *dst, size_t n, int *version,
                            size_t bucket_bytes, dist_xfer_stats *st);

/* A rollout rank's receive of the weight broadcast without a whole-model buffer: the buckets the
 * root sends (dist_bcast_weights / dist_bcast_weights_bf16 on trainer rank 0, dtype saying which)
 * land in a ring of at most 16 buckets (window × the root's bucket size) and each is handed to
 * sink(arg, off, vals, cnt) in order as it completes — vals holds values [off, off + cnt) of the n
 * (fp32 floats or bf16 uint16), valid during the call. A sink returning MOERL_ERR stops the handing
 * over (the broadcast itself still completes, so no rank hangs) and the call returns MOERL_ERR with
 * the sink's message. For an expert-parallel rollout rank, which keeps only its experts'
 * slice (ep_slice_range). Errors: as dist_bcast_weights on a rollout rank (header mismatch, dtype
 * other than fp32/bf16); sink NULL; called on the root (it sends) or in a local run. */
typedef int (*dist_weight_sink)(void *arg, size_t off, const void *vals, size_t cnt);
int dist_recv_weights_stream(dist_ctx *ctx, dist_wdtype dtype, size_t n, int *version, dist_weight_sink sink,
                             void *arg, dist_xfer_stats *st);

/* ---- point-to-point messages (the RL sample/command protocol is built on these) ---- */

/* Send len bytes to world rank dst with tag (0 ≤ tag ≤ 32767, the MPI-guaranteed tag range).
 * Blocks until buf may be reused: small messages return at once, large ones (≳ the MPI eager limit,
 * tens of KiB) wait until the receiver matches them, so two ranks must not both block sending large
 * messages to each other. The local backend's only rank is 0 (a send to itself is queued, copied).
 * Errors: dst outside [0, world_size), tag out of range, len > INT_MAX, buf NULL with len > 0. */
int dist_send_msg(dist_ctx *ctx, int dst, int tag, const void *buf, size_t len);
/* Receive the next message with `tag` from any rank (blocks until one arrives; matched probe, so safe
 * with several receiving threads). *buf gets a heap buffer (free() it; never NULL, even for len 0),
 * *len its size, *src the sender's world rank (src may be NULL). Errors: tag out of range. */
int dist_recv_msg_any(dist_ctx *ctx, int tag, int *src, void **buf, size_t *len);
/* 1 if a message with `tag` is waiting (from any rank), else 0; never blocks. −1 on a bad tag. */
int dist_iprobe(dist_ctx *ctx, int tag);

/* ---- data-parallel gradient reducer ---- */

/* Backward groups: the order in which gradients become final in model_backward.
 * group L (= num_hidden_layers): tensors with layer −1 AFTER the decoder layers in the table (final
 * norm, untied lm_head) — final first; group l: decoder layer l's tensors; group −1: tensors with
 * layer −1 BEFORE the decoder layers (the embedding, which receives the tied head's gradient too) —
 * final last. */
int dist_tensor_group(const moe_model *m, int tensor_index);

/* One bucket: whole tensors [lo_tensor, hi_tensor] of the table, filled in REVERSE table order
 * (hi_tensor first), which is a contiguous range of any parameter-layout buffer. */
typedef struct {
    size_t offset;   /* first float (= offset of lo_tensor) */
    size_t n;        /* floats, including the alignment padding after each tensor */
    size_t bytes;    /* Σ numel·4 of its tensors (what the size cap counts) */
    int lo_tensor, hi_tensor;
    int group;       /* lowest backward group among its tensors: complete once that group is done */
} dist_bucket;

/* DDP-style bucket plan: walk the tensors in reverse table order (= reverse backward-completion
 * order: head, layer L−1, ..., layer 0, embedding), adding whole tensors to the current bucket while
 * its bytes stay ≤ cap, where cap is first_cap_bytes for the first bucket and cap_bytes after; a
 * tensor larger than the cap gets a bucket of its own. Buckets tile [0, n_params) in reverse order
 * without gaps. Returns a heap array (free()) and its length in *n_buckets.
 * Errors: cap_bytes or first_cap_bytes == 0. Source: torch DDP _compute_bucket_assignment_by_size. */
dist_bucket *dist_plan_buckets(const moe_model *m, size_t first_cap_bytes, size_t cap_bytes, int *n_buckets);

#define DIST_FIRST_BUCKET_BYTES ((size_t)1 << 20) /* DDP's first bucket: 1 MiB */

typedef enum {
    DIST_OVERLAP_OFF = 0,   /* one blocking allreduce per bucket in dist_reducer_finish (MPI_Iallreduce
                               + MPI_Wait: the same algorithm as the overlapped modes, so the sums are
                               bit-identical; Open MPI's blocking MPI_Allreduce picks another summation
                               order at 3 ranks) */
    DIST_OVERLAP_THREAD,    /* a communication thread issues each bucket's MPI_Iallreduce when it is
                               complete and polls MPI_Test while backward continues */
    DIST_OVERLAP_POLL,      /* no thread: dist_reducer_layer_done issues ready buckets and polls
                               MPI_Test, so progress happens only between layers. Measured here
                               (bench_dist_reduce, Open MPI 4.1 shared memory): a test per layer moves
                               a shared-memory allreduce only a few fragments, so most of it is left
                               for finish; THREAD is the mode that overlaps. Whether overlap shortens
                               the step depends on spare cores: the thread's copies need CPU too. */
} dist_overlap;

typedef struct dist_grad_reducer dist_grad_reducer;

/* A reducer summing m->grads over trainer_comm in buckets of the plan
 * dist_plan_buckets(m, min(1 MiB, cap), cap) with cap = bucket_mb MiB (DDP default 25). Every trainer
 * must create it with the same model layout, bucket_mb and (for determinism) overlap mode; the
 * summation is MPI_SUM over the same buckets in the same order, so for a fixed rank count the result
 * is deterministic, bit-identical on every rank and between overlap modes. The model (and its grads
 * buffer) must outlive the reducer. Collective over the trainer group (it duplicates trainer_comm
 * for its own traffic), so all trainers create (and free) their reducers in the same order.
 * Errors: this rank is not a trainer (or roles not split), m->grads NULL, bucket_mb ≤ 0 or not finite,
 * a bucket over INT_MAX floats, unknown overlap mode. */
dist_grad_reducer *dist_reducer_new(dist_ctx *ctx, const moe_model *m, double bucket_mb, dist_overlap overlap);
/* The same reducer over a trainer sub-group (dist_comm, below) instead of trainer_comm: e.g. the ranks
 * of one pipeline stage or the data-parallel replicas of an FSDP shard. Collective over the group.
 * Errors: as dist_reducer_new, group NULL. */
struct dist_comm;
dist_grad_reducer *dist_reducer_new_on(dist_ctx *ctx, const struct dist_comm *group, const moe_model *m,
                                       double bucket_mb, dist_overlap overlap);
/* Multiply every gradient by s after the sum (e.g. 1/trainer_size for a mean). Default 1 (no pass).
 * Applied per bucket right after it completes. */
void dist_reducer_set_scale(dist_grad_reducer *r, float s);
/* Tell the reducer that backward group `group` (see dist_tensor_group; −1 ≤ group ≤ L) and every
 * later one (higher index) are final. Buckets that became complete are reduced (overlap THREAD/POLL)
 * or queued (OFF). A group already covered is a no-op. After this call the caller must not write the
 * gradients of groups ≥ `group` until dist_reducer_finish returns. Error: group out of range. */
int dist_reducer_layer_done(dist_grad_reducer *r, int group);
/* End of backward: marks every group final, reduces what is left, waits for all buckets (scaled) and
 * resets for the next step. Returns the EXPOSED communication time in seconds: the time this call
 * blocked. */
double dist_reducer_finish(dist_grad_reducer *r);
/* Stop the communication thread and free the reducer (collective over the trainer group, like
 * dist_reducer_new). Not during a step (between layer_done and finish). NULL is a no-op. */
void dist_reducer_free(dist_grad_reducer *r);
/* The plan in use (read-only; issue order = index order). */
/* Compressed reduction (src/dist/compress.h): from the reducer's (warmup_steps+1)-th step on,
 * each bucket is compressed with error feedback (the residual buffer is the reducer's, n_params
 * floats), every rank's payload goes to every rank (all-gather of sizes, then of payloads) and
 * each rank sums the decompressed payloads; before that, and with GRAD_COMPRESSION_NONE, the exact
 * all-reduce runs unchanged. chunk: onebit's elements per scale. In one process (or one trainer)
 * nothing is sent and nothing is compressed. Set before the first step. */
void dist_reducer_set_compression(dist_grad_reducer *r, int mode, int warmup_steps, int chunk);
/* Bytes this rank sent for the last reduced step, and what the exact all-reduce's payload would
 * have been (4 · n_params): the compression ratio is raw / sent. */
void dist_reducer_last_bytes(const dist_grad_reducer *r, double *sent, double *raw);
int dist_reducer_n_buckets(const dist_grad_reducer *r);
const dist_bucket *dist_reducer_buckets(const dist_grad_reducer *r);

/* ---- sub-groups of the trainer ranks (the model-parallel grid of src/parallel/grid.h) ----
 *
 * A dist_comm is a communicator over a subset of the trainer ranks (FSDP shard group, expert-parallel
 * group, Ulysses group, pipeline, data-parallel replicas), made by splitting trainer_comm. All its
 * collectives are blocking unless named i*, move fp32 (or int32) payloads, and are called in the same
 * order by every member. The local backend's groups have size 1: collectives are copies, p2p is an
 * error. Every call adds the bytes this rank SENT to the group's counters (dist_comm_bytes) using the
 * algorithmic volume of a ring / pairwise algorithm (the convention of NCCL's "bus bytes"):
 *   allgather of n floats per rank: (P−1)·n·4; reduce-scatter to n per rank: (P−1)·n·4;
 *   allreduce of n: 2·(P−1)/P·n·4; all-to-all(v): the floats sent to the OTHER ranks ·4;
 *   point-to-point: n·4. A group of one moves nothing.
 * Errors: counts over INT_MAX elements, NULL buffers with a count > 0, a rank outside the group.
 * MPI failures abort the job as everywhere in dist.h. Source: MPI 3.1 §5 (collectives), §6.4
 * (MPI_Comm_split); PyTorch FSDP / Megatron process groups for how they are used. */
typedef struct dist_comm dist_comm;
typedef struct dist_req dist_req;

typedef enum {
    DIST_OP_ALLGATHER = 0,
    DIST_OP_REDUCE_SCATTER,
    DIST_OP_ALLREDUCE,
    DIST_OP_ALLTOALL,
    DIST_OP_P2P,
    DIST_OP_COUNT
} dist_op;

/* Split the trainer group: trainers passing the same color (≥ 0) form one group, ordered by key
 * (ties: trainer rank). Collective over trainer_comm. Returns NULL with a message when this rank is not
 * a trainer or color < 0. Free with dist_comm_free (collective over the group, in creation order). */
dist_comm *dist_comm_split(dist_ctx *ctx, int color, int key);
/* The same over the rollout ranks (e.g. the engine's expert-parallel groups): collective over the
 * rollout ranks; NULL with a message on a trainer rank or before the roles are split. */
dist_comm *dist_comm_split_rollout(dist_ctx *ctx, int color, int key);
void dist_comm_free(dist_comm *c);
int dist_comm_rank(const dist_comm *c);
int dist_comm_size(const dist_comm *c);
/* Bytes this rank sent through c per operation kind since creation (or the last reset). */
double dist_comm_bytes(const dist_comm *c, dist_op op);
void dist_comm_reset_bytes(dist_comm *c);
int dist_comm_barrier(dist_comm *c);
/* In-place elementwise sum of buf[n] over the group (same result on every member). */
int dist_comm_allreduce_f32(dist_comm *c, float *buf, size_t n);
int dist_comm_allreduce_f64(dist_comm *c, double *buf, size_t n);
/* recv[P·n] = the members' send[n] in rank order (send may not alias recv). */
int dist_comm_allgather_f32(dist_comm *c, const float *send, size_t n, float *recv);
/* recv[n] = Σ over members of their send[r·n .. r·n+n) where r is this rank (send [P·n]). */
int dist_comm_reduce_scatter_f32(dist_comm *c, const float *send, float *recv, size_t n);
/* Member r's send[q·n .. q·n+n) lands in member q's recv[r·n .. r·n+n). */
int dist_comm_alltoall_f32(dist_comm *c, const float *send, size_t n, float *recv);
int dist_comm_alltoall_i32(dist_comm *c, const int *send, size_t n, int *recv);
/* Variable all-to-all: scounts[q] floats from send+sdispls[q] go to member q, which receives them at
 * recv+rdispls[r] with rcounts[r] = this rank's scounts[q] (the caller exchanges the counts first,
 * e.g. with dist_comm_alltoall_i32). Arrays of P entries. */
int dist_comm_alltoallv_f32(dist_comm *c, const float *send, const size_t *scounts, const size_t *sdispls,
                            float *recv, const size_t *rcounts, const size_t *rdispls);
/* Nonblocking versions: the buffers must stay untouched until dist_wait returns. */
dist_req *dist_comm_iallgather_f32(dist_comm *c, const float *send, size_t n, float *recv);
dist_req *dist_comm_ireduce_scatter_f32(dist_comm *c, const float *send, float *recv, size_t n);
/* Point-to-point to / from group rank peer with tag (0..32767); nonblocking. */
dist_req *dist_comm_isend_f32(dist_comm *c, int peer, int tag, const float *buf, size_t n);
dist_req *dist_comm_irecv_f32(dist_comm *c, int peer, int tag, float *buf, size_t n);
/* Drive the MPI progress engine once for c (MPI_Iprobe on c; nothing is received): a thread that
 * calls it now and then moves the fragments of large nonblocking messages while the owning thread
 * computes (Open MPI's shared-memory transport progresses only inside MPI calls). Local: no-op. */
void dist_comm_progress(dist_comm *c);
/* Wait for and free a request (NULL: MOERL_OK). dist_test: 1 when complete (then freed), else 0. */
int dist_wait(dist_req *r);
int dist_test(dist_req *r);

#endif
