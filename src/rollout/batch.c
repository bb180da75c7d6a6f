/* A fixed batch of prompts on the rollout engine (rollout/batch.h). */
#include "rollout/batch.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/common.h"
#include "base/log.h"

static void add_requests(engine *e, const gen_batch *b, gen_request *reqs, int *n_added) {
    const int ns = b->n_samples;
    *n_added = 0;
    for (int i = 0; i < b->n_prompts; i++)
        for (int j = 0; j < ns; j++) {
            gen_request *r = &reqs[i * ns + j];
            r->id = i * ns + j;
            r->prompt = b->prompts[i];
            r->prompt_len = b->prompt_lens[i];
            r->sp = b->sp;
            r->sp.seed = b->sp.seed + 1000003ULL * i + j;
            if (engine_add(e, r) != MOERL_OK) {
                moerl_error_prefix("prompt %d: ", i);
                return;
            }
            ++*n_added;
        }
}

int engine_generate_batch(engine *e, const gen_batch *b, gen_emit_fn emit, void *ctx, const char *label,
                          int *n_emitted) {
    const int total = b->n_prompts * b->n_samples;
    gen_request *reqs = xcalloc(total > 0 ? total : 1, sizeof(gen_request));
    gen_request **done = xmalloc((total + 1) * sizeof(gen_request *));
    char *finished = xcalloc(total > 0 ? total : 1, 1);
    int n_added, n_done = 0, next = 0, rc = MOERL_OK;
    add_requests(e, b, reqs, &n_added);
    if (n_added < total) rc = MOERL_ERR;
    double t0 = moerl_now();
    progress pb;
    progress_begin(&pb, label, total);
    while (rc == MOERL_OK && n_done < total) {
        int k = engine_step(e, done, total + 1);
        for (int d = 0; d < k; d++, n_done++) finished[done[d]->id] = 1;
        for (; next < total && finished[next]; next++) /* in input order */
            emit(ctx, &reqs[next], next / b->n_samples, next % b->n_samples);
        if (k < 0) rc = MOERL_ERR;
        else if (k > 0) {
            char extra[96];
            double el = moerl_now() - t0;
            snprintf(extra, sizeof extra, "%.0f tokens/s", engine_get_stats(e).generated_tokens / (el > 0 ? el : 1e-9));
            progress_update(&pb, n_done, extra);
        }
    }
    progress_end(&pb, NULL);
    if (n_added < total) engine_abort(e, done, total + 1); /* the requests it holds point into reqs */
    for (int k = 0; k < total; k++) gen_request_free_outputs(&reqs[k]);
    free(finished);
    free(done);
    free(reqs);
    *n_emitted = next;
    return rc;
}
