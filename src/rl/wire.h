/* Wire formats of the distributed RL job (src/rl/job_dist.c): how a finished GRPO group travels from
 * a rollout rank to trainer rank 0, and how trainer rank 0 hands each data-parallel trainer rank its
 * share of a trainer step. Byte layouts are fixed (host byte order, like the weight-broadcast header
 * of dist.h: every rank of a job runs on one architecture); integers are little-endian on x86-64.
 *
 * Group ("MOERLGR1", format 5):
 *   char magic[8] "MOERLGR1" | u32 format = 5 | i32 start_version | i64 uid | i32 row | i32 epoch |
 *   i32 n (responses) | i32 prompt_len | i32 prompt[prompt_len] |
 *   i32 route_layers | i32 route_k | i32 route_experts |
 *   n × { i32 n_out | i32 finish | i32 n_interruptions | i32 tokens[n_out] | f32 logprobs[n_out] |
 *         i32 versions[n_out] | i32 has_mask (0 | 1) | if has_mask: u8 mask[n_out] (0 | 1) |
 *         i32 n_routes (−1: none) | i16 routes[n_routes × route_layers × route_k] } |
 *   i32 scored (0 | 1) | if scored: n × { f64 score | i32 n_extra |
 *         n_extra × { i32 key_len | key bytes | f64 value } | i32 pred_len (−1: no pred) | pred bytes } |
 *   i32 has_traj (0 | 1) | if has_traj: n × { i32 turns | i32 tool_calls | i32 tool_errors | i32 env_done |
 *         i32 has_env_reward | f64 env_reward } |
 *   n × { i32 n_preemptions }
 *   (mask: gen_request.out_mask, 1 = sampled, 0 = a multi-turn rollout's inserted tool-turn token; the
 *   rewards the rollout rank's reward pool computed, rl_group.rewards: scores and extra values finite,
 *   names 1..RL_WIRE_MAX_STR bytes without NUL; traj: rl_group.traj, counts ≥ 0 with tool_errors ≤
 *   tool_calls, flags 0 | 1, env_reward finite; n_preemptions: gen_request.n_preemptions ≥ 0, the times the
 *   paged engine preempted the response (samples.jsonl); routes: gen_request.out_routes / n_routes and the group's
 *   route_* shape (rl_group), all three 0 and every n_routes −1 when the group carries no routes, else
 *   1 ≤ route_layers ≤ MOERL_MAX_LAYERS, 1 ≤ route_k ≤ route_experts ≤ 32767, 0 ≤ n_routes ≤ prompt_len +
 *   n_out and every id in [0, route_experts). Format 1 had no rewards, format 2 no mask and traj, format 3
 *   no routes, format 4 no n_preemptions)
 * Train message ("MOERLTB1", format 5), trainer rank 0 → trainer rank t:
 *   char magic[8] "MOERLTB1" | u32 format = 5 | i32 cmd (RL_TRAIN_CMD_*) | i32 version | i64 step |
 *   i32 n_mb | n_mb × { i32 n_groups | i64 resp_tokens | i64 tokens } |
 *   Σ n_groups × { u64 length | group bytes (as above) }
 *   resp_tokens / tokens are the mini-batch's GLOBAL counts over all trainer ranks (token-mean loss
 *   weight and aux-loss share); n_groups this rank's groups of the mini-batch, in mini-batch order.
 * Decoders validate the magic, the format, every count and length against the bytes received, and
 * fail with a message naming the field and the values (a truncated, foreign or newer message never
 * crashes the receiver). Source: moerl's own protocol (no public format to follow); the unit that
 * travels is verl fully_async_policy's: a prompt with all its n responses, never split. */
#ifndef MOERL_RL_WIRE_H
#define MOERL_RL_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "rl/rl.h"

#define RL_WIRE_GROUP_MAGIC "MOERLGR1"
#define RL_WIRE_TRAIN_MAGIC "MOERLTB1"
#define RL_WIRE_FORMAT 5
#define RL_WIRE_MAX_EXTRA 4096         /* extra reward fields per response a decoder accepts */
#define RL_WIRE_MAX_STR (1 << 20)      /* bytes of an extra field's name or a pred a decoder accepts */
#define RL_WIRE_MAX_N 65536            /* responses per group a decoder accepts */
#define RL_WIRE_MAX_LEN (1 << 26)      /* tokens per prompt or response a decoder accepts */
/* largest uid a decoder accepts: request ids are uid·1024 + response index (rollouter.c), which
 * must not overflow int64 */
#define RL_WIRE_MAX_UID ((INT64_MAX - RL_WIRE_MAX_N) / 1024)

/* STEP: train on the groups; STOP: leave the loop; GATHER: take part in gathering the whole model on
 * trainer rank 0 (model parallelism; version = 1 when the AdamW moments come too; no groups). */
enum { RL_TRAIN_CMD_STEP = 1, RL_TRAIN_CMD_STOP = 2, RL_TRAIN_CMD_GATHER = 3 };

/* Serialise a finished group (every response's outputs, out_mask when set, routes when the group has a
 * route shape, rewards and traj when set) into a new heap buffer *buf (free()) of *len bytes. Errors:
 * n ≤ 0, a response with n_out < 0 or NULL outputs while n_out > 0, a mask byte other than 0 / 1, a
 * trajectory record out of range, a route shape out of range, a response without routes (or with
 * n_routes outside [0, prompt_len + n_out]) in a group with a route shape, an expert id out of range. */
int rl_group_encode(const rl_group *g, void **buf, size_t *len);
/* Parse a group written by rl_group_encode into a new rl_group (free with rl_group_free); every
 * response is finished (n_done = n), reqs[j].prompt points at the group's own prompt copy and
 * reqs[j].user at the group. Errors (message "group message: ..."): fewer bytes than the header,
 * wrong magic, another format, n outside [1, RL_WIRE_MAX_N], a length outside [0, RL_WIRE_MAX_LEN]
 * (prompt: ≥ 1), a uid outside [0, RL_WIRE_MAX_UID], more responses than the bytes left could hold,
 * a negative token id, version or interruption count, an unknown finish reason, a NaN logprob, a
 * mask byte other than 0 / 1 (the message names the uid, response and token), a non-finite score or
 * extra value, a bad string length, a trajectory record out of range, a route shape, n_routes or expert
 * id out of range (named with the uid, response, token and layer), bytes missing or left over.
 * reqs[j].out_mask, out_routes and traj are NULL when the sender had none. */
int rl_group_decode(const void *buf, size_t len, rl_group **out);

/* A decoded train message (rl_minibatch: rl.h). groups[] concatenates the mini-batches' groups. */
typedef struct {
    int cmd;
    int version;
    int64_t step;
    int n_mb;
    rl_minibatch *mbs;     /* [n_mb] */
    int n_groups;
    rl_group **groups;     /* [n_groups] */
} rl_train_msg;

/* Serialise a train message (groups: Σ mbs[i].n_groups entries). cmd STOP carries no mini-batches
 * (n_mb 0). Errors: as rl_group_encode; n_mb < 0. */
int rl_train_msg_encode(int cmd, int version, int64_t step, const rl_minibatch *mbs, int n_mb, rl_group *const *groups,
                        void **buf, size_t *len);
/* Parse a train message. Errors (message "train message: ..."): as rl_group_decode for the header and
 * each group, an unknown cmd, negative counts, n_mb over 1<<20, group lengths beyond the buffer. */
int rl_train_msg_decode(const void *buf, size_t len, rl_train_msg *out);
/* Free the groups and arrays of a decoded message (the struct itself is the caller's). */
void rl_train_msg_free(rl_train_msg *m);

#endif
