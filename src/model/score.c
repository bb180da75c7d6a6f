/* The score of one token sequence (model/score.h). */
#include "model/score.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/forward.h"

int model_score_tokens(const moe_model *m, const int *tokens, int T, float *logp, double *ce, double *aux) {
    if (T < 2) return moerl_errorf("scoring needs at least 2 tokens (got %d)", T);
    if (m->cfg.max_position_embeddings > 0 && T > m->cfg.max_position_embeddings)
        return moerl_errorf("%d tokens exceed the model's context max_position_embeddings %d", T,
                            m->cfg.max_position_embeddings);
    model_acts a;
    int cu[2] = {0, T}, rc = MOERL_ERR;
    int *targets = xmalloc(T * sizeof(int));
    for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : -1;
    if (model_acts_init(&a, m, T) == MOERL_OK) {
        if (model_forward(m, &a, tokens, cu, NULL, 1, T) == MOERL_OK) {
            model_logprobs(m, &a, targets, 1.0f, 0);
            double sum = 0;
            for (int t = 0; t + 1 < T; t++) sum += logp[t] = a.logp[t];
            *ce = -sum / (T - 1);
            *aux = a.aux_loss;
            rc = MOERL_OK;
        }
        model_acts_free(&a);
    }
    free(targets);
    return rc;
}
