/* 1-bit Adam (Tang et al. 2021, arXiv 2102.02888, Algorithm 1; DeepSpeed's OnebitAdam for the
 * semantics, read, not copied). Two phases over one adamw_state (its m, v and step):
 *   warm-up, steps 1..freeze_step: exact AdamW on the all-reduced gradient (adamw_step; nothing here).
 *   compression, steps > freeze_step: the variance v stays as it was after step freeze_step; each
 *     worker updates the momentum from its LOCAL gradient, m ← β1·m + (1 − β1)·g_local, the momenta
 *     are averaged by the two-stage 1-bit all-reduce with worker and server error feedback
 *     (dist/onebit.h, done by the caller between the two calls below), and the parameter moves with
 *     the frozen variance (the trainer exchanges m/d, d the update's denominator below, and leaves
 *     out the values whose frozen v is 0: onebit_adam_to_update and rl/trainer_onebit.c, issue 29):
 *         p ← p·(1 − lr·wd)            (TF_DECAY tensors; AdamW's decoupled decay, as adamw.h)
 *         p ← p − lr/(1 − β1^t) · m / (√v · 1/√(1 − β2^T) + eps)      T = freeze_step, t = step
 * Bias correction: DeepSpeed's OnebitAdam applies none (its bias_correction flag is unused), the paper
 * none either; moerl's warm-up is torch AdamW with both corrections, so the compression phase keeps
 * them continuous with it — v's correction frozen at T with v itself, m's continuing with t (→ 1 as t
 * grows, where the update equals DeepSpeed's up to the constant 1/√(1 − β2^T) on v).
 * Clipping: the caller gives the norm the clip uses (global-norm clip, coef = max/(norm + 1e-6) when
 * < 1, as adamw.h) and applies the skip rule: a non-finite norm or loss skips the step (counted). */
#ifndef MOERL_ONEBIT_ADAM_H
#define MOERL_ONEBIT_ADAM_H

#include <stdint.h>

#include "optim/adamw.h"

/* "adamw" | "onebit_adam" (actor.optim.name). */
typedef enum { OPTIM_ADAMW = 0, OPTIM_ONEBIT_ADAM = 1 } optim_name;
/* Parse a name; MOERL_ERR naming the accepted values otherwise. */
int optim_name_parse(const char *name, optim_name *out);
/* The key value of n ("adamw", "onebit_adam"): what optim_name_parse reads and trainer_state.json records. */
const char *optim_name_str(optim_name n);

/* 1 when the next step is a compression step (s->step ≥ freeze_step), else 0 (an exact AdamW step). */
int onebit_adam_frozen(const adamw_state *s, int64_t freeze_step);

/* First half of a compression step: the skip rule (non-finite norm or loss: s->skipped++, returns 0,
 * nothing changes), else s->step++ and m[i] ← β1·m[i] + (1 − β1)·(g[i]·clip) over all s->n values
 * (g: this worker's local gradient in the units of the full gradient), returns 1. */
int onebit_adam_local(adamw_state *s, const float *g, float loss, double norm);

/* Second half, after the caller replaced s->m by its compressed average: the parameter update above
 * on the listed ranges of p (same layout as s->m, s->v). freeze_step ≥ 1. */
void onebit_adam_apply(const adamw_state *s, int64_t freeze_step, float *p, const adamw_range *r, int n_ranges,
                       float lr);

/* The exchange in preconditioned units (issue 29): the variance is frozen and the same on every
 * rank, so averaging m_w/d over the workers, d = √v/√(1 − β2^T) + eps, equals averaging m_w and
 * dividing by d — but the 1-bit compressor then gives each value a magnitude s·d proportional to its
 * own denominator instead of one s for all, and its error feedback is measured in the units of the
 * update. With one s for all, values whose frozen √v is far below the tensor's typical one move by
 * lr·s/d ≫ lr on the first compressed step (the demo's collapse at step freeze_step + 2).
 * onebit_adam_to_update: x[i] ← x[i] / d_i over all s->n values; onebit_adam_from_update: x[i] ←
 * x[i] · d_i (the inverse up to rounding). freeze_step ≥ 1. */
void onebit_adam_to_update(const adamw_state *s, int64_t freeze_step, float *x);
void onebit_adam_from_update(const adamw_state *s, int64_t freeze_step, float *x);

/* The ranges of a whole model (one per tensor, decay from TF_DECAY); caller frees. */
adamw_range *onebit_adam_model_ranges(const moe_model *m);

#endif
