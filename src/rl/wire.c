/* Wire formats of the distributed RL job; see wire.h for the byte layouts. */
#include "rl/wire.h"

#include <math.h>
#include <string.h>

#include "base/common.h"

/* ------------------------------------------------------------------ growable writer */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} wbuf;

static void w_put(wbuf *w, const void *src, size_t len) {
    if (w->n + len > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->n + len) cap *= 2;
        w->p = xrealloc(w->p, cap);
        w->cap = cap;
    }
    if (len) memcpy(w->p + w->n, src, len);
    w->n += len;
}
static void w_i32(wbuf *w, int32_t v) { w_put(w, &v, 4); }
static void w_u32(wbuf *w, uint32_t v) { w_put(w, &v, 4); }
static void w_i64(wbuf *w, int64_t v) { w_put(w, &v, 8); }
static void w_u64(wbuf *w, uint64_t v) { w_put(w, &v, 8); }

/* ------------------------------------------------------------------ bounds-checked reader */

typedef struct {
    const unsigned char *p;
    size_t n, off;
    const char *what; /* "group message" / "train message" */
    int err;
} rbuf;

static int r_get(rbuf *r, void *dst, size_t len, const char *field) {
    if (r->err) return MOERL_ERR;
    if (len > r->n - r->off) {
        r->err = 1;
        return moerl_errorf("%s: truncated: %s needs %zu bytes at offset %zu, only %zu left of %zu", r->what, field,
                            len, r->off, r->n - r->off, r->n);
    }
    if (dst && len) memcpy(dst, r->p + r->off, len);
    r->off += len;
    return MOERL_OK;
}
static int r_i32(rbuf *r, int32_t *v, const char *f) { return r_get(r, v, 4, f); }
static int r_u32(rbuf *r, uint32_t *v, const char *f) { return r_get(r, v, 4, f); }
static int r_i64(rbuf *r, int64_t *v, const char *f) { return r_get(r, v, 8, f); }
static int r_u64(rbuf *r, uint64_t *v, const char *f) { return r_get(r, v, 8, f); }

static int r_magic(rbuf *r, const char *magic) {
    char m[8] = {0};
    if (r_get(r, m, 8, "magic") != MOERL_OK) return MOERL_ERR;
    if (memcmp(m, magic, 8) != 0) {
        char shown[9];
        for (int i = 0; i < 8; i++) shown[i] = (m[i] >= 32 && m[i] < 127) ? m[i] : '?';
        shown[8] = 0;
        r->err = 1;
        return moerl_errorf("%s: magic '%s', expected '%s' (not a moerl %s)", r->what, shown, magic, r->what);
    }
    uint32_t fmt = 0;
    if (r_u32(r, &fmt, "format") != MOERL_OK) return MOERL_ERR;
    if (fmt != RL_WIRE_FORMAT) {
        r->err = 1;
        return moerl_errorf("%s: format %u, this build reads format %d (ranks built from different moerl versions?)",
                            r->what, fmt, RL_WIRE_FORMAT);
    }
    return MOERL_OK;
}

static int r_count(rbuf *r, int32_t v, int32_t lo, int32_t hi, const char *field) {
    if (r->err) return MOERL_ERR;
    if (v < lo || v > hi) {
        r->err = 1;
        return moerl_errorf("%s: %s = %d outside [%d, %d]", r->what, field, v, lo, hi);
    }
    return MOERL_OK;
}

/* ------------------------------------------------------------------ group */

/* The group's rewards (wire.h: "scored" and the per-response answers). */
static int rewards_write(wbuf *w, const rl_group *g) {
    w_i32(w, g->rewards ? 1 : 0);
    if (!g->rewards) return MOERL_OK;
    for (int j = 0; j < g->n; j++) {
        const reward_result *x = &g->rewards[j];
        if (!isfinite(x->score) || x->n_extra < 0 || x->n_extra > RL_WIRE_MAX_EXTRA)
            return moerl_errorf("group encode: uid %lld response %d: score %g with %d extra fields",
                                (long long)g->uid, j, x->score, x->n_extra);
        w_put(w, &x->score, 8);
        w_i32(w, x->n_extra);
        for (int e = 0; e < x->n_extra; e++) {
            const size_t kl = strlen(x->extra_keys[e]);
            if (kl == 0 || kl > RL_WIRE_MAX_STR)
                return moerl_errorf("group encode: uid %lld response %d: extra field name of %zu bytes",
                                    (long long)g->uid, j, kl);
            w_i32(w, (int32_t)kl);
            w_put(w, x->extra_keys[e], kl);
            w_put(w, &x->extra_vals[e], 8);
        }
        const size_t pl = x->pred ? strlen(x->pred) : 0;
        if (pl > RL_WIRE_MAX_STR)
            return moerl_errorf("group encode: uid %lld response %d: pred of %zu bytes", (long long)g->uid, j, pl);
        w_i32(w, x->pred ? (int32_t)pl : -1);
        w_put(w, x->pred, pl);
    }
    return MOERL_OK;
}

/* The trajectories' records (wire.h: "has_traj"), multi-turn rollouts only. */
static int traj_write(wbuf *w, const rl_group *g) {
    w_i32(w, g->traj ? 1 : 0);
    if (!g->traj) return MOERL_OK;
    for (int j = 0; j < g->n; j++) {
        const agent_traj *t = &g->traj[j];
        if (t->turns < 0 || t->tool_calls < 0 || t->tool_errors < 0 || t->tool_errors > t->tool_calls ||
            (unsigned)t->env_done > 1 || (unsigned)t->has_env_reward > 1 || !isfinite(t->env_reward))
            return moerl_errorf("group encode: uid %lld response %d: trajectory turns %d, tool_calls %d, tool_errors "
                                "%d, env_done %d, has_env_reward %d, env_reward %g", (long long)g->uid, j, t->turns,
                                t->tool_calls, t->tool_errors, t->env_done, t->has_env_reward, t->env_reward);
        w_i32(w, t->turns);
        w_i32(w, t->tool_calls);
        w_i32(w, t->tool_errors);
        w_i32(w, t->env_done);
        w_i32(w, t->has_env_reward);
        w_put(w, &t->env_reward, 8);
    }
    return MOERL_OK;
}

/* The group's route shape is all 0 (no routes) or in range (wire.h); 1 when it carries routes. */
static int routes_shape_ok(int layers, int k, int experts) {
    if (layers == 0 && k == 0 && experts == 0) return 1;
    return layers >= 1 && layers <= MOERL_MAX_LAYERS && k >= 1 && k <= experts && experts <= INT16_MAX;
}

/* Response j's routing record (wire.h: n_routes, routes) checked before anything is written. */
static int routes_check(const rl_group *g, int j) {
    const gen_request *r = &g->reqs[j];
    const size_t w = (size_t)g->route_layers * g->route_k;
    if (!w) return MOERL_OK; /* routes a group without a route shape has are not sent */
    if (!r->out_routes || r->n_routes < 0 || r->n_routes > g->prompt.n + r->n_out)
        return moerl_errorf("group encode: uid %lld response %d: %d recorded routes (%s) for %lld prompt + %d output "
                            "tokens", (long long)g->uid, j, r->n_routes, r->out_routes ? "array set" : "no array",
                            (long long)g->prompt.n, r->n_out);
    for (size_t i = 0; i < (size_t)r->n_routes * w; i++)
        if (r->out_routes[i] < 0 || r->out_routes[i] >= g->route_experts)
            return moerl_errorf("group encode: uid %lld response %d: token %zu, MoE layer %zu: expert %d outside [0, "
                                "%d)", (long long)g->uid, j, i / w, i % w / g->route_k, r->out_routes[i],
                                g->route_experts);
    return MOERL_OK;
}

static void routes_write(wbuf *w, const rl_group *g, const gen_request *r) {
    const size_t width = (size_t)g->route_layers * g->route_k;
    w_i32(w, width ? r->n_routes : -1);
    if (width) w_put(w, r->out_routes, (size_t)r->n_routes * width * sizeof(int16_t));
}

static int group_write(wbuf *w, const rl_group *g) {
    if (g->n <= 0 || g->n > RL_WIRE_MAX_N)
        return moerl_errorf("group encode: uid %lld has n = %d responses", (long long)g->uid, g->n);
    if (g->uid < 0 || g->uid > RL_WIRE_MAX_UID)
        return moerl_errorf("group encode: uid %lld outside [0, %lld]", (long long)g->uid, (long long)RL_WIRE_MAX_UID);
    if (g->prompt.n <= 0 || g->prompt.n > RL_WIRE_MAX_LEN)
        return moerl_errorf("group encode: uid %lld has a prompt of %lld tokens", (long long)g->uid,
                            (long long)g->prompt.n);
    if (!routes_shape_ok(g->route_layers, g->route_k, g->route_experts))
        return moerl_errorf("group encode: uid %lld: route shape %d MoE layers × k %d of %d experts (all 0, or 1 ≤ "
                            "layers ≤ %d and 1 ≤ k ≤ experts ≤ %d expected)", (long long)g->uid, g->route_layers,
                            g->route_k, g->route_experts, MOERL_MAX_LAYERS, INT16_MAX);
    for (int j = 0; j < g->n; j++) {
        const gen_request *r = &g->reqs[j];
        if (routes_check(g, j) != MOERL_OK) return MOERL_ERR;
        if (r->n_out < 0 || r->n_out > RL_WIRE_MAX_LEN ||
            (r->n_out > 0 && (!r->out_tokens || !r->out_logprobs || !r->out_versions)))
            return moerl_errorf("group encode: uid %lld response %d has n_out = %d without outputs", (long long)g->uid,
                                j, r->n_out);
        for (int t = 0; r->out_mask && t < r->n_out; t++)
            if (r->out_mask[t] > 1)
                return moerl_errorf("group encode: uid %lld response %d: out_mask[%d] = %d (0 or 1 expected)",
                                    (long long)g->uid, j, t, r->out_mask[t]);
    }
    w_put(w, RL_WIRE_GROUP_MAGIC, 8);
    w_u32(w, RL_WIRE_FORMAT);
    w_i32(w, g->start_version);
    w_i64(w, g->uid);
    w_i32(w, g->row);
    w_i32(w, g->epoch);
    w_i32(w, g->n);
    w_i32(w, (int32_t)g->prompt.n);
    w_put(w, g->prompt.ids, (size_t)g->prompt.n * 4);
    w_i32(w, g->route_layers);
    w_i32(w, g->route_k);
    w_i32(w, g->route_experts);
    for (int j = 0; j < g->n; j++) {
        const gen_request *r = &g->reqs[j];
        w_i32(w, r->n_out);
        w_i32(w, (int32_t)r->finish);
        w_i32(w, r->n_interruptions);
        w_put(w, r->out_tokens, (size_t)r->n_out * 4);
        w_put(w, r->out_logprobs, (size_t)r->n_out * 4);
        w_put(w, r->out_versions, (size_t)r->n_out * 4);
        w_i32(w, r->out_mask ? 1 : 0);
        if (r->out_mask) w_put(w, r->out_mask, (size_t)r->n_out);
        routes_write(w, g, r);
    }
    if (rewards_write(w, g) != MOERL_OK) return MOERL_ERR;
    if (traj_write(w, g) != MOERL_OK) return MOERL_ERR;
    for (int j = 0; j < g->n; j++) w_i32(w, g->reqs[j].n_preemptions);
    return MOERL_OK;
}

int rl_group_encode(const rl_group *g, void **buf, size_t *len) {
    wbuf w = {0};
    if (group_write(&w, g) != MOERL_OK) {
        free(w.p);
        return MOERL_ERR;
    }
    *buf = w.p;
    *len = w.n;
    return MOERL_OK;
}

static int check_nonneg(rbuf *r, const int32_t *v, int n, const char *field, int64_t uid, int j) {
    for (int i = 0; i < n; i++)
        if (v[i] < 0) {
            r->err = 1;
            return moerl_errorf("%s: uid %lld response %d: %s[%d] = %d is negative", r->what, (long long)uid, j, field,
                                i, v[i]);
        }
    return MOERL_OK;
}

/* A length-prefixed string of [lo, RL_WIRE_MAX_STR] bytes (−1 with lo < 0: none, *out NULL). */
static int r_str(rbuf *r, int lo, char **out, const char *field, int64_t uid, int j) {
    *out = NULL;
    int32_t len = 0;
    if (r_i32(r, &len, field)) return MOERL_ERR;
    if (len < lo || len > RL_WIRE_MAX_STR) {
        r->err = 1;
        return moerl_errorf("%s: uid %lld response %d: %s = %d outside [%d, %d]", r->what, (long long)uid, j, field,
                            len, lo, RL_WIRE_MAX_STR);
    }
    if (len < 0) return MOERL_OK;
    if ((size_t)len > r->n - r->off) return r_get(r, NULL, (size_t)len, field);
    char *s = xmalloc((size_t)len + 1);
    r_get(r, s, (size_t)len, field);
    s[len] = 0;
    if (memchr(s, 0, (size_t)len)) {
        free(s);
        r->err = 1;
        return moerl_errorf("%s: uid %lld response %d: %s holds a NUL byte", r->what, (long long)uid, j, field);
    }
    *out = s;
    return MOERL_OK;
}

static int r_finite(rbuf *r, double *v, const char *field, int64_t uid, int j) {
    if (r_get(r, v, 8, field)) return MOERL_ERR;
    if (!isfinite(*v)) {
        r->err = 1;
        return moerl_errorf("%s: uid %lld response %d: %s is %g (a reward must be finite)", r->what, (long long)uid, j,
                            field, *v);
    }
    return MOERL_OK;
}

/* The rewards after a group's responses (g->rewards stays NULL when the group was not scored). */
static int rewards_read(rbuf *r, rl_group *g) {
    int32_t scored = 0;
    if (r_i32(r, &scored, "scored") || r_count(r, scored, 0, 1, "scored")) return MOERL_ERR;
    if (!scored) return MOERL_OK;
    if ((size_t)g->n > (r->n - r->off) / 16) /* every answer takes at least 16 bytes */
        return r_get(r, NULL, (size_t)g->n * 16, "rewards");
    g->rewards = xcalloc((size_t)g->n, sizeof(reward_result));
    for (int j = 0; j < g->n; j++) {
        reward_result *x = &g->rewards[j];
        int32_t ne = 0;
        if (r_finite(r, &x->score, "score", g->uid, j) || r_i32(r, &ne, "n_extra") ||
            r_count(r, ne, 0, RL_WIRE_MAX_EXTRA, "n_extra"))
            return MOERL_ERR;
        if ((size_t)ne * 12 > r->n - r->off) return r_get(r, NULL, (size_t)ne * 12, "extra fields");
        x->extra_keys = xcalloc((size_t)(ne ? ne : 1), sizeof(char *));
        x->extra_vals = xcalloc((size_t)(ne ? ne : 1), sizeof(double));
        for (int e = 0; e < ne; e++) {
            if (r_str(r, 1, &x->extra_keys[e], "extra field name", g->uid, j)) return MOERL_ERR;
            x->n_extra = e + 1; /* the names read so far are freed with the group */
            if (r_finite(r, &x->extra_vals[e], "extra field value", g->uid, j)) return MOERL_ERR;
        }
        if (r_str(r, -1, &x->pred, "pred length", g->uid, j)) return MOERL_ERR;
    }
    return MOERL_OK;
}

/* Response j's loss mask (has_mask, then n_out bytes of 0 / 1) into q->out_mask (NULL without one). */
static int mask_read(rbuf *r, gen_request *q, int64_t uid, int j) {
    int32_t has = 0;
    if (r_i32(r, &has, "has_mask") || r_count(r, has, 0, 1, "has_mask")) return MOERL_ERR;
    if (!has) return MOERL_OK;
    if ((size_t)q->n_out > r->n - r->off) return r_get(r, NULL, (size_t)q->n_out, "response mask");
    q->out_mask = xmalloc(q->n_out > 0 ? (size_t)q->n_out : 1);
    if (r_get(r, q->out_mask, (size_t)q->n_out, "response mask")) return MOERL_ERR;
    for (int t = 0; t < q->n_out; t++)
        if (q->out_mask[t] > 1) {
            r->err = 1;
            return moerl_errorf("%s: uid %lld response %d: mask[%d] = %d (0 = inserted tool-turn token, 1 = sampled "
                                "token expected)", r->what, (long long)uid, j, t, q->out_mask[t]);
        }
    return MOERL_OK;
}

/* Response j's routing record (n_routes, then n_routes × route_layers × route_k int16) into q->out_routes
 * (NULL when the group has no route shape). */
static int routes_read(rbuf *r, const rl_group *g, gen_request *q, int j) {
    const size_t w = (size_t)g->route_layers * g->route_k;
    int32_t nr = 0;
    if (r_i32(r, &nr, "n_routes")) return MOERL_ERR;
    if (!w) return r_count(r, nr, -1, -1, "n_routes (the group has no route shape)");
    const int32_t most = (int32_t)MOERL_MIN((int64_t)INT32_MAX, (int64_t)q->prompt_len + q->n_out);
    if (r_count(r, nr, 0, most, "n_routes (at most prompt_len + n_out)")) return MOERL_ERR;
    const size_t bytes = (size_t)nr * w * sizeof(int16_t);
    if (bytes > r->n - r->off) return r_get(r, NULL, bytes, "routes");
    q->out_routes = xmalloc(bytes ? bytes : 1);
    q->n_routes = nr;
    r_get(r, q->out_routes, bytes, "routes");
    for (size_t i = 0; i < (size_t)nr * w; i++)
        if (q->out_routes[i] < 0 || q->out_routes[i] >= g->route_experts) {
            r->err = 1;
            return moerl_errorf("%s: uid %lld response %d: token %zu, MoE layer %zu: expert %d outside [0, %d)",
                                r->what, (long long)g->uid, j, i / w, i % w / g->route_k, q->out_routes[i],
                                g->route_experts);
        }
    return MOERL_OK;
}

/* The group's route shape after the prompt (wire.h). */
static int route_shape_read(rbuf *r, rl_group *g) {
    int32_t v[3] = {0};
    if (r_i32(r, &v[0], "route_layers") || r_i32(r, &v[1], "route_k") || r_i32(r, &v[2], "route_experts"))
        return MOERL_ERR;
    if (!routes_shape_ok(v[0], v[1], v[2])) {
        r->err = 1;
        return moerl_errorf("%s: uid %lld: route shape %d MoE layers × k %d of %d experts (all 0, or 1 ≤ layers ≤ %d "
                            "and 1 ≤ k ≤ experts ≤ %d expected)", r->what, (long long)g->uid, v[0], v[1], v[2],
                            MOERL_MAX_LAYERS, INT16_MAX);
    }
    g->route_layers = v[0];
    g->route_k = v[1];
    g->route_experts = v[2];
    return MOERL_OK;
}

/* The trajectories' records after the rewards (g->traj stays NULL for single-turn groups). */
static int traj_read(rbuf *r, rl_group *g) {
    int32_t has = 0;
    if (r_i32(r, &has, "has_traj") || r_count(r, has, 0, 1, "has_traj")) return MOERL_ERR;
    if (!has) return MOERL_OK;
    if ((size_t)g->n > (r->n - r->off) / 28) /* every record takes 5·4 + 8 bytes */
        return r_get(r, NULL, (size_t)g->n * 28, "trajectories");
    g->traj = xcalloc((size_t)g->n, sizeof(agent_traj));
    for (int j = 0; j < g->n; j++) {
        agent_traj *t = &g->traj[j];
        int32_t v[5] = {0};
        for (int k = 0; k < 5; k++)
            if (r_i32(r, &v[k], "trajectory")) return MOERL_ERR;
        if (r_get(r, &t->env_reward, 8, "env_reward")) return MOERL_ERR;
        if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[2] > v[1] || (uint32_t)v[3] > 1 || (uint32_t)v[4] > 1 ||
            !isfinite(t->env_reward)) {
            r->err = 1;
            return moerl_errorf("%s: uid %lld response %d: trajectory turns %d, tool_calls %d, tool_errors %d, "
                                "env_done %d, has_env_reward %d, env_reward %g (counts ≥ 0, tool_errors ≤ "
                                "tool_calls, flags 0 or 1, a finite reward expected)", r->what, (long long)g->uid, j,
                                v[0], v[1], v[2], v[3], v[4], t->env_reward);
        }
        *t = (agent_traj){.turns = v[0], .tool_calls = v[1], .tool_errors = v[2], .env_done = v[3],
                          .has_env_reward = v[4], .env_reward = t->env_reward};
    }
    return MOERL_OK;
}

/* Parse one group from r (the reader's `what` names the enclosing message). */
static int group_read(rbuf *r, rl_group **out) {
    *out = NULL;
    if (r_magic(r, RL_WIRE_GROUP_MAGIC) != MOERL_OK) return MOERL_ERR;
    int32_t sv = 0, row = 0, epoch = 0, n = 0, plen = 0;
    int64_t uid = 0;
    if (r_i32(r, &sv, "start_version") || r_i64(r, &uid, "uid") || r_i32(r, &row, "row") ||
        r_i32(r, &epoch, "epoch") || r_i32(r, &n, "n") || r_i32(r, &plen, "prompt_len"))
        return MOERL_ERR;
    if (r_count(r, n, 1, RL_WIRE_MAX_N, "n (responses)") || r_count(r, plen, 1, RL_WIRE_MAX_LEN, "prompt_len") ||
        r_count(r, sv, 0, INT32_MAX, "start_version") || r_count(r, row, 0, INT32_MAX, "row") ||
        r_count(r, epoch, 0, INT32_MAX, "epoch"))
        return MOERL_ERR;
    if (uid < 0 || uid > RL_WIRE_MAX_UID) {
        r->err = 1;
        return moerl_errorf("%s: uid %lld outside [0, %lld]", r->what, (long long)uid, (long long)RL_WIRE_MAX_UID);
    }
    /* every response takes at least its 16-byte header: bound the request array by the bytes left */
    if ((size_t)n > (r->n - r->off) / 16) {
        r->err = 1;
        return moerl_errorf("%s: truncated: uid %lld announces %d responses, but only %zu bytes follow (at least 16 "
                            "each)", r->what, (long long)uid, n, r->n - r->off);
    }
    if ((size_t)plen * 4 > r->n - r->off) /* check before allocating what a bad length asks for */
        return r_get(r, NULL, (size_t)plen * 4, "prompt tokens");
    rl_group *g = xcalloc(1, sizeof *g);
    g->uid = uid;
    g->row = row;
    g->epoch = epoch;
    g->start_version = sv;
    g->n = n;
    g->reqs = xcalloc((size_t)n, sizeof(gen_request));
    g->prompt.ids = xmalloc((size_t)plen * 4);
    g->prompt.n = g->prompt.cap = plen;
    int rc = r_get(r, g->prompt.ids, (size_t)plen * 4, "prompt tokens");
    if (rc == MOERL_OK) rc = check_nonneg(r, g->prompt.ids, plen, "prompt", uid, -1);
    if (rc == MOERL_OK) rc = route_shape_read(r, g);
    for (int j = 0; j < n && rc == MOERL_OK; j++) {
        gen_request *q = &g->reqs[j];
        int32_t n_out = 0, fin = 0, nint = 0;
        if (r_i32(r, &n_out, "n_out") || r_i32(r, &fin, "finish") || r_i32(r, &nint, "n_interruptions") ||
            r_count(r, n_out, 0, RL_WIRE_MAX_LEN, "n_out") ||
            r_count(r, fin, FINISH_NONE, FINISH_ABORT, "finish") ||
            r_count(r, nint, 0, INT32_MAX, "n_interruptions")) {
            rc = MOERL_ERR;
            break;
        }
        if ((size_t)n_out * 12 > r->n - r->off) {
            rc = r_get(r, NULL, (size_t)n_out * 12, "response tokens/logprobs/versions");
            break;
        }
        q->id = uid * 1024 + j;
        q->prompt = g->prompt.ids;
        q->prompt_len = plen;
        q->n_out = n_out;
        q->finish = (finish_reason)fin;
        q->n_interruptions = nint;
        q->slot = -1;
        q->user = g;
        q->sp.max_tokens = n_out;
        size_t cap = n_out > 0 ? (size_t)n_out : 1;
        q->out_tokens = xmalloc(cap * 4);
        q->out_logprobs = xmalloc(cap * 4);
        q->out_versions = xmalloc(cap * 4);
        if (r_get(r, q->out_tokens, (size_t)n_out * 4, "response tokens") ||
            r_get(r, q->out_logprobs, (size_t)n_out * 4, "response logprobs") ||
            r_get(r, q->out_versions, (size_t)n_out * 4, "response versions") ||
            check_nonneg(r, q->out_tokens, n_out, "tokens", uid, j) ||
            check_nonneg(r, q->out_versions, n_out, "versions", uid, j)) {
            rc = MOERL_ERR;
            break;
        }
        for (int t = 0; t < n_out; t++)
            if (isnan(q->out_logprobs[t])) {
                r->err = 1;
                rc = moerl_errorf("%s: uid %lld response %d: logprob %d is NaN", r->what, (long long)uid, j, t);
                break;
            }
        if (rc == MOERL_OK) rc = mask_read(r, q, uid, j);
        if (rc == MOERL_OK) rc = routes_read(r, g, q, j);
    }
    if (rc == MOERL_OK) rc = rewards_read(r, g);
    if (rc == MOERL_OK) rc = traj_read(r, g);
    for (int j = 0; j < n && rc == MOERL_OK; j++) {
        int32_t np = 0;
        if (r_i32(r, &np, "n_preemptions") || r_count(r, np, 0, INT32_MAX, "n_preemptions")) rc = MOERL_ERR;
        else g->reqs[j].n_preemptions = np;
    }
    if (rc != MOERL_OK) {
        rl_group_free(g);
        return MOERL_ERR;
    }
    g->n_done = n;
    *out = g;
    return MOERL_OK;
}

int rl_group_decode(const void *buf, size_t len, rl_group **out) {
    rbuf r = {.p = buf, .n = len, .off = 0, .what = "group message"};
    if (group_read(&r, out) != MOERL_OK) return MOERL_ERR;
    if (r.off != len) {
        rl_group_free(*out);
        *out = NULL;
        return moerl_errorf("group message: %zu bytes left over after the group's %zu (corrupt length fields?)",
                            len - r.off, r.off);
    }
    return MOERL_OK;
}

/* ------------------------------------------------------------------ train message */

int rl_train_msg_encode(int cmd, int version, int64_t step, const rl_minibatch *mbs, int n_mb, rl_group *const *groups,
                        void **buf, size_t *len) {
    if (n_mb < 0) return moerl_errorf("train message encode: n_mb = %d", n_mb);
    wbuf w = {0};
    w_put(&w, RL_WIRE_TRAIN_MAGIC, 8);
    w_u32(&w, RL_WIRE_FORMAT);
    w_i32(&w, cmd);
    w_i32(&w, version);
    w_i64(&w, step);
    w_i32(&w, n_mb);
    int total = 0;
    for (int b = 0; b < n_mb; b++) {
        w_i32(&w, mbs[b].n_groups);
        w_i64(&w, mbs[b].resp_tokens);
        w_i64(&w, mbs[b].tokens);
        total += mbs[b].n_groups;
    }
    for (int i = 0; i < total; i++) {
        const size_t at = w.n;
        w_u64(&w, 0); /* length, patched below */
        if (group_write(&w, groups[i]) != MOERL_OK) {
            free(w.p);
            return MOERL_ERR;
        }
        const uint64_t glen = w.n - at - 8;
        memcpy(w.p + at, &glen, 8);
    }
    *buf = w.p;
    *len = w.n;
    return MOERL_OK;
}

void rl_train_msg_free(rl_train_msg *m) {
    for (int i = 0; i < m->n_groups; i++) rl_group_free(m->groups[i]);
    free(m->groups);
    free(m->mbs);
    memset(m, 0, sizeof *m);
}

int rl_train_msg_decode(const void *buf, size_t len, rl_train_msg *out) {
    memset(out, 0, sizeof *out);
    rbuf r = {.p = buf, .n = len, .off = 0, .what = "train message"};
    int32_t cmd = 0, version = 0, n_mb = 0;
    int64_t step = 0;
    if (r_magic(&r, RL_WIRE_TRAIN_MAGIC) || r_i32(&r, &cmd, "cmd") || r_i32(&r, &version, "version") ||
        r_i64(&r, &step, "step") || r_i32(&r, &n_mb, "n_mb"))
        return MOERL_ERR;
    if (cmd != RL_TRAIN_CMD_STEP && cmd != RL_TRAIN_CMD_STOP && cmd != RL_TRAIN_CMD_GATHER)
        return moerl_errorf("train message: unknown cmd %d (expected %d step, %d stop or %d gather)", cmd,
                            RL_TRAIN_CMD_STEP, RL_TRAIN_CMD_STOP, RL_TRAIN_CMD_GATHER);
    if (r_count(&r, n_mb, 0, 1 << 20, "n_mb") || r_count(&r, version, 0, INT32_MAX, "version")) return MOERL_ERR;
    if ((size_t)n_mb * 20 > len - r.off) return r_get(&r, NULL, (size_t)n_mb * 20, "mini-batch table");
    out->cmd = cmd;
    out->version = version;
    out->step = step;
    out->n_mb = n_mb;
    out->mbs = xcalloc((size_t)(n_mb ? n_mb : 1), sizeof(rl_minibatch));
    int64_t total = 0;
    for (int b = 0; b < n_mb; b++) {
        int32_t ng = 0;
        int64_t rt = 0, tt = 0;
        if (r_i32(&r, &ng, "n_groups") || r_i64(&r, &rt, "resp_tokens") || r_i64(&r, &tt, "tokens") ||
            r_count(&r, ng, 0, 1 << 24, "n_groups")) {
            rl_train_msg_free(out);
            return MOERL_ERR;
        }
        if (rt < 0 || tt < rt) {
            rl_train_msg_free(out);
            return moerl_errorf("train message: mini-batch %d: resp_tokens %lld, tokens %lld (need 0 ≤ resp ≤ tokens)",
                                b, (long long)rt, (long long)tt);
        }
        out->mbs[b] = (rl_minibatch){.n_groups = ng, .resp_tokens = rt, .tokens = tt};
        total += ng;
    }
    /* every group takes at least 8 (length) + 32 (header) bytes: bound the allocation by the buffer */
    if (total > (int64_t)((len - r.off) / 40) + 1) {
        rl_train_msg_free(out);
        return moerl_errorf("train message: %lld groups announced, but only %zu bytes follow", (long long)total,
                            len - r.off);
    }
    out->groups = xcalloc((size_t)(total ? total : 1), sizeof(rl_group *));
    for (int64_t i = 0; i < total; i++) {
        uint64_t glen = 0;
        if (r_u64(&r, &glen, "group length")) {
            rl_train_msg_free(out);
            return MOERL_ERR;
        }
        if (glen > len - r.off) {
            rl_train_msg_free(out);
            return moerl_errorf("train message: group %lld claims %llu bytes, only %zu left", (long long)i,
                                (unsigned long long)glen, len - r.off);
        }
        rbuf g = {.p = r.p + r.off, .n = (size_t)glen, .off = 0, .what = "train message"};
        if (group_read(&g, &out->groups[i]) != MOERL_OK) {
            rl_train_msg_free(out);
            return moerl_error_prefix("group %lld: ", (long long)i);
        }
        out->n_groups++;
        if (g.off != glen) {
            rl_train_msg_free(out);
            return moerl_errorf("train message: group %lld: %zu of its %llu bytes left over", (long long)i,
                                (size_t)glen - g.off, (unsigned long long)glen);
        }
        r.off += (size_t)glen;
    }
    if (r.off != len) {
        size_t left = len - r.off;
        rl_train_msg_free(out);
        return moerl_errorf("train message: %zu bytes left over after %lld groups", left, (long long)total);
    }
    return MOERL_OK;
}
