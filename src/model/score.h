/* The score of one token sequence under a model (moerl score; the user's perplexity/debug tool). */
#ifndef MOERL_MODEL_SCORE_H
#define MOERL_MODEL_SCORE_H

#include "model/model.h"

/* One forward pass over tokens[T] (T ≥ 2, at most the model's max_position_embeddings when set):
 * logp[t] = log p(tokens[t+1] | tokens ≤ t) for t < T−1 (logp: caller's [T−1]), *ce their negative
 * mean, *aux the HF load_balancing_loss_func over all MoE layers (without router_aux_loss_coef).
 * Errors: T out of range (naming the context), the forward's errors (non-finite weights...). */
int model_score_tokens(const moe_model *m, const int *tokens, int T, float *logp, double *ce, double *aux);

#endif
