/* Tensor parallelism of the rollout engine (rollout.tensor_model_parallel_size, vLLM's tensor_parallel_size):
 * the runtime an engine's TP slice calls (engine_set_tp, src/rollout/engine.h) — an object beginning with a
 * model_par_head whose hook table has tp_allreduce_f32 over the P ranks of one replica. The
 * slice itself is tp_config_apply's (src/parallel/tp.h, experts split over the group) and its weights come
 * from tp_slice_range. */
#ifndef MOERL_PARALLEL_TP_ROLLOUT_H
#define MOERL_PARALLEL_TP_ROLLOUT_H

#include "dist/dist.h"

typedef struct tp_rollout tp_rollout;

/* The runtime over comm (the replica's P ranks; not owned: the caller frees it after tp_rollout_free). A
 * failed collective later ends the process with the message (moerl_fatal), as the trainer's TP does. NULL
 * with moerl_errorf when comm is NULL or has one rank. */
tp_rollout *tp_rollout_new(dist_comm *comm);
void tp_rollout_free(tp_rollout *t);
/* Bytes the runtime's all-reduces have summed since tp_rollout_new (the payload, 4 per float). */
double tp_rollout_bytes(const tp_rollout *t);

#endif
