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

/* ---- sharded form (FSDP / ZeRO-3: src/parallel/fsdp.c) ----
 * The moments cover only this rank's shard of the parameter layout: n floats, laid out like the
 * caller's shard buffers p and g. */
void adamw_init_shard(adamw_state *s, size_t n, adamw_config cfg);
/* A contiguous piece of a shard buffer that belongs to one tensor: floats [offset, offset+n) of p,
 * g, m and v; decay: the tensor is TF_DECAY. Pieces not listed (alignment padding) are left alone. */
typedef struct {
    size_t offset, n;
    int decay;
} adamw_range;
/* The step of adamw_step on a shard: the same update, clipping and skip rule, but with the GLOBAL
 * gradient norm given by the caller (the L2 norm over all shards, summed over the shard group) and
 * the update applied to p/g/s->m/s->v on the listed ranges only. Returns 1 applied, 0 skipped (norm
 * or loss not finite; counted in s->skipped). */
int adamw_step_ranges(adamw_state *s, float *p, const float *g, const adamw_range *r, int n_ranges, float lr,
                      float loss, double grad_norm);

#endif
