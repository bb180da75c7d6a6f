/* A fixed batch of prompts generated on the rollout engine to completion (moerl generate):
 * n_samples responses per prompt, handed to the caller in input order. */
#ifndef MOERL_ROLLOUT_BATCH_H
#define MOERL_ROLLOUT_BATCH_H

#include "rollout/engine.h"

typedef struct {
    int *const *prompts;    /* [n_prompts] token ids (owned by the caller) */
    const int *prompt_lens; /* [n_prompts] */
    int n_prompts;
    int n_samples;          /* responses per prompt (≥ 1) */
    sampling_params sp;     /* every response's; sp.seed is the base: response j of prompt i uses
                               sp.seed + 1000003·i + j */
} gen_batch;

/* Called once per response, in input order (prompt 0's samples 0..n-1, then prompt 1's, ...). */
typedef void (*gen_emit_fn)(void *ctx, const gen_request *r, int prompt_index, int sample);

/* Add every request of b to e, step the engine until all finished and hand each response to emit
 * (responses finish in another order and wait for their turn). Progress (responses, tokens/s) goes
 * to stderr under `label`. *n_emitted: the responses handed to emit. Errors: a request the engine
 * refuses ("prompt I: ..."), an engine step's error; the responses before it were emitted. */
int engine_generate_batch(engine *e, const gen_batch *b, gen_emit_fn emit, void *ctx, const char *label,
                          int *n_emitted);

#endif
