/* Vocab-parallel log-probabilities and entropy of the LM head (tensor parallelism, Megatron's
 * vocab-parallel cross entropy): each rank of the TP group holds logits [N, V/tp] for its vocabulary rows
 * [v0, v0 + V/tp); the row statistics (max, Σexp, the target's logit, the entropy's Σexp·z) are reduced
 * over the group through model_par_hooks(a->par)->tp_allreduce, so the full logits are never gathered.
 * Internal to src/model (forward.c calls these when model_acts.par carries the TP hook). */
#ifndef MOERL_VOCAB_PARALLEL_H
#define MOERL_VOCAB_PARALLEL_H

#include "model/forward.h"

/* model_logprobs under TP: a->logp[N], a->lse_head[N] and (want_entropy) a->entropy[N] of the whole
 * vocabulary from this rank's a->logits [N, V/tp], a->targets and a->temperature (global token ids; rows
 * with target < 0 get logp = entropy = 0, as logprob_forward). Collective over the TP group. */
void vp_logprob_forward(const moe_model *m, model_acts *a, int v0, int want_entropy);
/* logprob_backward under TP: a->d_logits [N, V/tp] (OVERWRITTEN) = this rank's columns of
 * dlogp[n]·(onehot(target) − p)/T + dentropy[n]·(−p∘(log p + H))/T (dentropy may be NULL). Collective over
 * the TP group (the statistics are recomputed and reduced again: two all-reduces of N doubles). */
void vp_logprob_backward(const moe_model *m, model_acts *a, int v0, const float *dlogp, const float *dentropy);

#endif
