/* Helpers shared by the engine decode benchmarks (bench_decode, bench_decode_cpu). Header-only;
 * each bench is one translation unit. */
#ifndef MOERL_BENCH_ENGINE_H
#define MOERL_BENCH_ENGINE_H

#include <string.h>

#include "base/common.h"
#include "rollout/engine.h"

/* prompts[n][plen]: distinct token ids per request, from seed (the decode benchmarks' prompts). */
static inline void bench_make_prompts(int *prompts, int n, int plen, int V, uint64_t seed) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < plen; j++)
            prompts[(size_t)i * plen + j] = (int)((seed * 7919 + (uint64_t)i * 131 + (uint64_t)j * 17) % V);
}

/* Add n requests to e, request i with prompt prompts[i][0..plen) (kept by the caller while the
 * requests run): temperature 1, no top-k/top-p, sampling seed seed·1000 + i, ignore_eos,
 * max_tokens each. Fatal (naming `who`) if the engine refuses one. */
static inline void bench_add_decode_requests(engine *e, gen_request *r, int *prompts, int n, int plen, int max_tokens,
                                             uint64_t seed, const char *who) {
    for (int i = 0; i < n; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].id = i;
        r[i].prompt = prompts + (size_t)i * plen;
        r[i].prompt_len = plen;
        r[i].sp.temperature = 1.0f;
        r[i].sp.top_p = 1.0f;
        r[i].sp.seed = seed * 1000 + i;
        r[i].sp.max_tokens = max_tokens;
        r[i].sp.ignore_eos = 1;
        if (engine_add(e, &r[i]) != MOERL_OK) moerl_fatal("%s: engine_add: %s", who, moerl_last_error());
    }
}

#endif
