/* AdamW with decoupled weight decay and bias correction, plus global gradient-norm clipping.
 * Source: Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (2019); the update
 * order matches torch.optim.AdamW (decay p ← p·(1 − lr·wd) first, then the Adam step with
 * denom = sqrt(v)/sqrt(1−β2^t) + eps and step size lr/(1−β1^t)); clipping matches
 * torch.nn.utils.clip_grad_norm_ (coef = max_norm/(‖g‖₂ + 1e-6), applied only when < 1).
 * Moments m and v use the model's parameter layout (one contiguous buffer each).
 * Weight decay applies to tensors flagged TF_DECAY (matrices), never to RMSNorm weights.
 */
#ifndef MOERL_ADAMW_H
#define MOERL_ADAMW_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    float lr;            /* learning rate */
    float beta1, beta2;  /* default 0.9, 0.95 */
    float eps;           /* default 1e-8 */
    float weight_decay;  /* default 0.01 */
    float max_grad_norm; /* clip the global L2 norm to this; ≤ 0 disables clipping */
} adamw_config;

typedef struct {
    adamw_config cfg;
    size_t n;            /* floats per buffer (== model n_params) */
    float *m, *v;        /* first and second moments */
    int64_t step;        /* applied steps (t in the bias correction) */
    int64_t skipped;     /* steps skipped because the loss or gradient norm was not finite */
} adamw_state;

adamw_config adamw_default_config(void);
void adamw_init(adamw_state *s, const moe_model *m, adamw_config cfg);
void adamw_free(adamw_state *s);
/* Global L2 norm of all gradients (double accumulation). */
double grad_global_norm(const moe_model *m);
/* One optimizer step with learning rate lr (the schedule is the caller's). Computes the global
 * gradient norm (returned in *grad_norm, before clipping); if it or loss is not finite, the step
 * is skipped, counted in s->skipped, and 0 is returned; otherwise clips, updates the parameters
 * and returns 1. Gradients are not zeroed. */
int adamw_step(adamw_state *s, moe_model *m, float lr, float loss, double *grad_norm);

#endif
