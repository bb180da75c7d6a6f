/* Wire formats of the distributed RL job (src/rl/wire.h) and the data-parallel split of a
 * mini-batch (rl_split_minibatch):
 *   - a finished group round-trips through rl_group_encode / rl_group_decode field by field (empty,
 *     short and long responses, every finish reason, interruptions, per-token versions, logprobs
 *     bit-exact including −inf), and the decoded group is self-contained (prompt pointers, n_done);
 *   - the rewards a rollout rank computed (score, extra fields, pred or none) round-trip exactly, an
 *     unscored group stays unscored, and every truncation, a non-finite score or value and bad string
 *     lengths are refused;
 *   - the decoder refuses, with a message naming the problem, every truncation of a valid message, a
 *     trailing byte, a foreign magic, another format, out-of-range counts, an unknown finish reason,
 *     negative tokens or versions and a NaN logprob (no crash, nothing leaked to the caller);
 *   - format 3's per-response loss mask (gen_request.out_mask) and trajectory records (rl_group.traj)
 *     round-trip exactly, absent ones stay absent, a mask byte other than 0/1 and out-of-range records
 *     are refused naming the uid and response, and every truncation is refused;
 *   - a train message (two mini-batches, global token counts, three groups) round-trips, STOP carries
 *     no mini-batches, and corrupt group lengths / announced counts are refused;
 *   - the split: a hand-checked longest-first assignment, and on random batches every group owned by
 *     one rank with max − min rank load ≤ the largest group (the greedy guarantee). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"
#include "rl/rl.h"
#include "rl/wire.h"
#include "test.h"

/* A group with n responses of the given lengths; values derived from (uid, j, t) so a mix-up shows. */
static rl_group *make_group(int64_t uid, int n_rows, int plen, int n, const int *lens) {
    rl_group *g = xcalloc(1, sizeof *g);
    g->uid = uid;
    g->row = (int)(uid % n_rows);
    g->epoch = (int)(uid / n_rows);
    g->start_version = 3 + (int)(uid % 5);
    g->n = g->n_done = n;
    for (int i = 0; i < plen; i++) tok_seq_push(&g->prompt, (int32_t)(7 * i + uid) % 259);
    g->reqs = xcalloc(n, sizeof(gen_request));
    for (int j = 0; j < n; j++) {
        gen_request *r = &g->reqs[j];
        r->prompt = g->prompt.ids;
        r->prompt_len = plen;
        r->n_out = lens[j];
        r->finish = (finish_reason)(1 + j % 3);
        r->n_interruptions = j % 4;
        r->n_preemptions = (j * 5) % 7; /* travels after the trajectories (samples.jsonl n_preemptions) */
        r->out_tokens = xmalloc((lens[j] + 1) * sizeof(int));
        r->out_logprobs = xmalloc((lens[j] + 1) * sizeof(float));
        r->out_versions = xmalloc((lens[j] + 1) * sizeof(int));
        for (int t = 0; t < lens[j]; t++) {
            r->out_tokens[t] = (int)((uid * 31 + j * 17 + t * 5) % 259);
            r->out_logprobs[t] = t == 1 && j == 2 ? -INFINITY : -0.013f * (float)(t + 1) - 0.5f * j;
            r->out_versions[t] = g->start_version + t / 3;
        }
        r->user = g;
    }
    return g;
}

/* 1 if a and b hold the same group (outputs bit-exact). */
static int same_group(const rl_group *a, const rl_group *b) {
    if (a->uid != b->uid || a->row != b->row || a->epoch != b->epoch || a->start_version != b->start_version ||
        a->n != b->n || a->prompt.n != b->prompt.n ||
        memcmp(a->prompt.ids, b->prompt.ids, a->prompt.n * sizeof(int32_t)))
        return 0;
    for (int j = 0; j < a->n; j++) {
        const gen_request *x = &a->reqs[j], *y = &b->reqs[j];
        if (x->n_out != y->n_out || x->finish != y->finish || x->n_interruptions != y->n_interruptions ||
            x->n_preemptions != y->n_preemptions || x->prompt_len != y->prompt_len || memcmp(x->prompt, y->prompt, x->prompt_len * sizeof(int)) ||
            memcmp(x->out_tokens, y->out_tokens, x->n_out * sizeof(int)) ||
            memcmp(x->out_logprobs, y->out_logprobs, x->n_out * sizeof(float)) ||
            memcmp(x->out_versions, y->out_versions, x->n_out * sizeof(int)) || !x->out_mask != !y->out_mask ||
            (x->out_mask && memcmp(x->out_mask, y->out_mask, x->n_out)))
            return 0;
    }
    if (!a->traj != !b->traj) return 0;
    for (int j = 0; a->traj && j < a->n; j++) {
        const agent_traj *x = &a->traj[j], *y = &b->traj[j];
        if (x->turns != y->turns || x->tool_calls != y->tool_calls || x->tool_errors != y->tool_errors ||
            x->env_done != y->env_done || x->has_env_reward != y->has_env_reward ||
            memcmp(&x->env_reward, &y->env_reward, 8))
            return 0;
    }
    if (!a->rewards != !b->rewards) return 0;
    for (int j = 0; a->rewards && j < a->n; j++) {
        const reward_result *x = &a->rewards[j], *y = &b->rewards[j];
        if (memcmp(&x->score, &y->score, 8) || x->n_extra != y->n_extra || !x->pred != !y->pred ||
            (x->pred && strcmp(x->pred, y->pred)))
            return 0;
        for (int e = 0; e < x->n_extra; e++)
            if (strcmp(x->extra_keys[e], y->extra_keys[e]) || memcmp(&x->extra_vals[e], &y->extra_vals[e], 8)) return 0;
    }
    return 1;
}

/* Rewards for g as a reward pool stores them: response j gets score j/4 − 0.25 (0.1 for j = 1, not a
 * binary fraction), j extra fields and a pred except on odd j. */
static void add_rewards(rl_group *g) {
    g->rewards = xcalloc(g->n, sizeof(reward_result));
    for (int j = 0; j < g->n; j++) {
        reward_result *x = &g->rewards[j];
        x->score = j == 1 ? 0.1 : j / 4.0 - 0.25;
        x->n_extra = j;
        x->extra_keys = xmalloc((j + 1) * sizeof(char *));
        x->extra_vals = xmalloc((j + 1) * sizeof(double));
        for (int e = 0; e < j; e++) {
            char k[32];
            snprintf(k, sizeof k, "field_%d", e);
            x->extra_keys[e] = xstrdup(k);
            x->extra_vals[e] = -1e300 * (e + 1) + j;
        }
        x->pred = j % 2 ? NULL : xstrdup(j ? "42" : "");
    }
}

static void test_group_roundtrip(void) {
    const int lens[4] = {0, 1, 9, 40};
    rl_group *g = make_group(1234, 100, 6, 4, lens);
    void *buf;
    size_t len;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_OK, "encode: %s", moerl_last_error());
    /* header 8+4+4+8+4·4 = 40 bytes, prompt 24, route shape 12, per response 20 (with has_mask and
     * n_routes) + 12·n_out, "scored" 4, "has_traj" 4, n_preemptions 4 per response */
    const size_t want = 40 + 6 * 4 + 12 + 4 * 20 + 12 * (0 + 1 + 9 + 40) + 4 + 4 + 4 * 4;
    CHECK(len == want, "encoded %zu bytes, layout says %zu", len, want);
    CHECK(memcmp(buf, "MOERLGR1", 8) == 0, "magic on the wire");
    rl_group *d = NULL;
    CHECK(rl_group_decode(buf, len, &d) == MOERL_OK, "decode: %s", moerl_last_error());
    if (d) {
        CHECK(same_group(g, d), "decoded group differs from the original");
        CHECK(d->n_done == d->n, "n_done %d of %d", d->n_done, d->n);
        int self = 1;
        for (int j = 0; j < d->n; j++) self &= d->reqs[j].prompt == d->prompt.ids && d->reqs[j].user == d;
        CHECK(self, "decoded requests must point at the decoded group's own prompt and group");
        CHECK(isinf(d->reqs[2].out_logprobs[1]) && d->reqs[2].out_logprobs[1] < 0, "-inf logprob kept");
        rl_group_free(d);
    }
    /* every truncation fails cleanly */
    int trunc_ok = 1;
    for (size_t cut = 0; cut < len; cut++) {
        rl_group *x = NULL;
        if (rl_group_decode(buf, cut, &x) != MOERL_ERR || x != NULL) {
            trunc_ok = 0;
            rl_group_free(x);
            fprintf(stderr, "  truncated to %zu bytes: accepted\n", cut);
            break;
        }
    }
    CHECK(trunc_ok, "every truncated message must be refused");
    rl_group_decode(buf, 50, &d);
    CHECK(strstr(moerl_last_error(), "truncated") != NULL, "truncation message: %s", moerl_last_error());
    /* a trailing byte */
    unsigned char *big = xmalloc(len + 1);
    memcpy(big, buf, len);
    big[len] = 0;
    CHECK(rl_group_decode(big, len + 1, &d) == MOERL_ERR && strstr(moerl_last_error(), "left over"),
          "trailing byte: %s", moerl_last_error());
    free(big);
    free(buf);
    rl_group_free(g);
}

/* Encode a valid group, patch 4 bytes at `off` with v, decode; return the error message (or "OK"). */
static const char *patched(size_t off, int32_t v) {
    const int lens[2] = {3, 2};
    rl_group *g = make_group(77, 50, 4, 2, lens);
    void *buf;
    size_t len;
    MOERL_ASSERT(rl_group_encode(g, &buf, &len) == MOERL_OK);
    memcpy((char *)buf + off, &v, 4);
    rl_group *d = NULL;
    const int rc = rl_group_decode(buf, len, &d);
    rl_group_free(d);
    free(buf);
    rl_group_free(g);
    return rc == MOERL_OK ? "OK" : moerl_last_error();
}

static void test_group_errors(void) {
    /* offsets: magic 0, format 8, start_version 12, uid 16, row 24, epoch 28, n 32, prompt_len 36,
     * prompt 40..56, route shape 56..68, response 0: n_out 68, finish 72, n_interruptions 76, tokens 80..,
     * logprobs 92.., versions 104.. */
    struct {
        size_t off;
        int32_t v;
        const char *want;
    } cs[] = {
        {0, 0x4c52454d, "magic"},          /* "MERL" instead of "MOER" */
        {8, 1, "format 1"},
        {8, 2, "format 2"},                /* before the loss mask and trajectories */
        {8, 3, "format 3"},                /* before the routes */
        {8, 4, "format 4"},                /* before n_preemptions */
        {8, 6, "format 6"},
        {32, 0, "n (responses)"},
        {32, -3, "n (responses)"},
        {32, 1 << 20, "n (responses)"},
        {36, 0, "prompt_len"},
        {36, 1 << 27, "prompt_len"},
        {36, 1000, "truncated"},           /* plausible length, bytes missing */
        {68, -1, "n_out"},
        {68, 1000, "truncated"},
        {72, 9, "finish"},
        {76, -2, "n_interruptions"},
        {80, -5, "negative"},              /* a token id */
        {104, -1, "negative"},             /* a version */
        {92, 0x7fc00000, "NaN"},           /* a logprob */
        {12, -1, "start_version"},
        {180, -1, "n_preemptions"},        /* the last response's: scored 168, has_traj 172, then 2 × i32 */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const char *msg = patched(cs[i].off, cs[i].v);
        CHECK(strcmp(msg, "OK") != 0 && strstr(msg, cs[i].want) != NULL,
              "patch %zu (offset %zu = %d): message '%s' lacks '%s'", i, cs[i].off, cs[i].v, msg, cs[i].want);
    }
    CHECK(strcmp(patched(12, 0), "OK") == 0, "an unmodified field value must still decode: %s", patched(12, 0));
    rl_group bad = {.n = 0};
    void *buf = NULL;
    size_t len = 0;
    CHECK(rl_group_encode(&bad, &buf, &len) == MOERL_ERR && strstr(moerl_last_error(), "n = 0"),
          "encode of an empty group: %s", moerl_last_error());
}

static void test_group_rewards(void) {
    const int lens[4] = {2, 0, 5, 1};
    rl_group *g = make_group(88, 40, 3, 4, lens);
    add_rewards(g);
    void *buf;
    size_t len;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_OK, "encode: %s", moerl_last_error());
    /* after the responses: scored 4, then per response score 8 + n_extra 4 + j × (4 + 7 + 8) + pred 4 + bytes
     * (preds: "" for j = 0, none for 1 and 3, "42" for 2) */
    const size_t resp = 40 + 3 * 4 + 12 + 4 * 20 + 12 * (2 + 0 + 5 + 1);
    const size_t want = resp + 4 + 4 * 16 + (0 + 1 + 2 + 3) * 19 + 2 + 4 + 4 * 4; /* + has_traj, n_preemptions */
    CHECK(len == want, "encoded %zu bytes, layout says %zu", len, want);
    rl_group *d = NULL;
    CHECK(rl_group_decode(buf, len, &d) == MOERL_OK, "decode: %s", moerl_last_error());
    if (d) {
        CHECK(d->rewards && same_group(g, d), "rewards differ after the round trip");
        CHECK(d->rewards && d->rewards[0].pred && !d->rewards[0].pred[0] && !d->rewards[1].pred &&
                  d->rewards[1].score == 0.1,
              "empty pred kept, missing pred stays missing, scores bit-exact");
        rl_group_free(d);
    }
    int trunc_ok = 1;
    for (size_t cut = resp; cut < len; cut++) {
        rl_group *x = NULL;
        if (rl_group_decode(buf, cut, &x) != MOERL_ERR || x != NULL) {
            trunc_ok = 0;
            rl_group_free(x);
            fprintf(stderr, "  truncated to %zu bytes: accepted\n", cut);
            break;
        }
    }
    CHECK(trunc_ok, "every truncation inside the rewards must be refused");
    /* patches: scored, response 0's score (NaN, inf), its n_extra, response 1's key length, value, pred length */
    const size_t at_scored = resp, at_score0 = resp + 4, at_ne0 = at_score0 + 8, at_pred0 = at_ne0 + 4;
    const size_t at_score1 = at_pred0 + 4, at_klen1 = at_score1 + 8 + 4, at_val1 = at_klen1 + 4 + 7;
    struct {
        size_t off;
        uint64_t v;
        int bytes;
        const char *want;
    } cs[] = {
        {at_scored, 2, 4, "scored"},
        {at_score0, 0x7ff8000000000000ULL, 8, "score is nan"},
        {at_score0, 0x7ff0000000000000ULL, 8, "score is inf"},
        {at_ne0, (uint32_t)-1, 4, "n_extra"},
        {at_ne0, 5000, 4, "n_extra"},
        {at_ne0, 3, 4, "field"},           /* names that are not there: wrong lengths or truncation */
        {at_klen1, 0, 4, "extra field name"},
        {at_klen1, 1u << 21, 4, "extra field name"},
        {at_klen1, 10000, 4, "truncated"},
        {at_val1, 0xfff0000000000000ULL, 8, "extra field value is -inf"},
        {at_pred0, (uint32_t)-2, 4, "pred length"},
        {at_pred0, 1000, 4, "truncated"},
        {at_klen1 + 4, 0, 1, "NUL"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        unsigned char *p = xmalloc(len);
        memcpy(p, buf, len);
        memcpy(p + cs[i].off, &cs[i].v, cs[i].bytes);
        rl_group *x = NULL;
        const int rc = rl_group_decode(p, len, &x);
        CHECK(rc == MOERL_ERR && x == NULL && strstr(moerl_last_error(), cs[i].want),
              "rewards patch %zu (offset %zu): rc %d, message '%s' lacks '%s'", i, cs[i].off, rc, moerl_last_error(),
              cs[i].want);
        rl_group_free(x);
        free(p);
    }
    free(buf);
    /* the encoder refuses what the decoder would */
    g->rewards[2].score = NAN;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_ERR && strstr(moerl_last_error(), "score nan"),
          "encode of a NaN score: %s", moerl_last_error());
    g->rewards[2].score = 1;
    /* inside a train message, the rewards travel to the other trainer ranks */
    rl_minibatch mb = {.n_groups = 1, .resp_tokens = 8, .tokens = 20};
    CHECK(rl_train_msg_encode(RL_TRAIN_CMD_STEP, 1, 2, &mb, 1, &g, &buf, &len) == MOERL_OK, "train encode: %s",
          moerl_last_error());
    rl_train_msg m;
    CHECK(rl_train_msg_decode(buf, len, &m) == MOERL_OK && m.n_groups == 1 && same_group(g, m.groups[0]),
          "train message keeps the rewards: %s", moerl_last_error());
    rl_train_msg_free(&m);
    free(buf);
    rl_group_free(g);
}

static void test_train_msg(void) {
    const int l1[2] = {5, 0}, l2[2] = {2, 8}, l3[2] = {1, 1};
    rl_group *gs[3] = {make_group(10, 20, 3, 2, l1), make_group(31, 20, 5, 2, l2), make_group(45, 20, 2, 2, l3)};
    rl_minibatch mbs[2] = {{.n_groups = 2, .resp_tokens = 101, .tokens = 250}, {.n_groups = 1, .resp_tokens = 7,
                                                                                .tokens = 30}};
    void *buf;
    size_t len;
    CHECK(rl_train_msg_encode(RL_TRAIN_CMD_STEP, 4, 17, mbs, 2, gs, &buf, &len) == MOERL_OK, "encode: %s",
          moerl_last_error());
    rl_train_msg m;
    CHECK(rl_train_msg_decode(buf, len, &m) == MOERL_OK, "decode: %s", moerl_last_error());
    CHECK(m.cmd == RL_TRAIN_CMD_STEP && m.version == 4 && m.step == 17 && m.n_mb == 2 && m.n_groups == 3,
          "header: cmd %d version %d step %lld n_mb %d groups %d", m.cmd, m.version, (long long)m.step, m.n_mb,
          m.n_groups);
    if (m.n_mb == 2 && m.n_groups == 3) {
        CHECK(m.mbs[0].n_groups == 2 && m.mbs[0].resp_tokens == 101 && m.mbs[0].tokens == 250 &&
                  m.mbs[1].n_groups == 1 && m.mbs[1].resp_tokens == 7 && m.mbs[1].tokens == 30,
              "mini-batch table");
        CHECK(same_group(gs[0], m.groups[0]) && same_group(gs[1], m.groups[1]) && same_group(gs[2], m.groups[2]),
              "groups round-trip in order");
    }
    rl_train_msg_free(&m);
    /* truncations, then a group length pointing past the end */
    int trunc_ok = 1;
    for (size_t cut = 0; cut < len; cut += 3)
        if (rl_train_msg_decode(buf, cut, &m) != MOERL_ERR) {
            trunc_ok = 0;
            rl_train_msg_free(&m);
            break;
        }
    CHECK(trunc_ok, "truncated train messages must be refused");
    const size_t first_len_at = 8 + 4 + 4 + 4 + 8 + 4 + 2 * 20;
    uint64_t huge = (uint64_t)len;
    memcpy((char *)buf + first_len_at, &huge, 8);
    CHECK(rl_train_msg_decode(buf, len, &m) == MOERL_ERR && strstr(moerl_last_error(), "claims"),
          "group length beyond the buffer: %s", moerl_last_error());
    free(buf);
    /* hand-built: header + a table announcing 1000 groups, nothing after (the decoder must not
     * allocate or read for groups that cannot be there) */
    {
        unsigned char h[64];
        size_t o = 0;
        memcpy(h, "MOERLTB1", 8), o = 8;
        uint32_t f = RL_WIRE_FORMAT;
        int32_t cmd = 1, ver = 0, nmb = 1, ng = 1000;
        int64_t step = 0, rt = 1, tt = 1;
        memcpy(h + o, &f, 4), o += 4;
        memcpy(h + o, &cmd, 4), o += 4;
        memcpy(h + o, &ver, 4), o += 4;
        memcpy(h + o, &step, 8), o += 8;
        memcpy(h + o, &nmb, 4), o += 4;
        memcpy(h + o, &ng, 4), o += 4;
        memcpy(h + o, &rt, 8), o += 8;
        memcpy(h + o, &tt, 8), o += 8;
        CHECK(rl_train_msg_decode(h, o, &m) == MOERL_ERR && strstr(moerl_last_error(), "1000 groups"),
              "announced groups without bytes: %s", moerl_last_error());
    }
    CHECK(rl_train_msg_encode(RL_TRAIN_CMD_STOP, 9, 40, NULL, 0, NULL, &buf, &len) == MOERL_OK, "stop encode");
    CHECK(rl_train_msg_decode(buf, len, &m) == MOERL_OK && m.cmd == RL_TRAIN_CMD_STOP && m.n_mb == 0 &&
              m.n_groups == 0 && m.step == 40,
          "stop round-trip: %s", moerl_last_error());
    rl_train_msg_free(&m);
    int32_t bad_cmd = 7;
    memcpy((char *)buf + 12, &bad_cmd, 4);
    CHECK(rl_train_msg_decode(buf, len, &m) == MOERL_ERR && strstr(moerl_last_error(), "cmd 7"),
          "unknown cmd: %s", moerl_last_error());
    memcpy(buf, "MOERLGR1", 8);
    CHECK(rl_train_msg_decode(buf, len, &m) == MOERL_ERR && strstr(moerl_last_error(), "magic"),
          "a group where a train message is expected: %s", moerl_last_error());
    free(buf);
    for (int i = 0; i < 3; i++) rl_group_free(gs[i]);
}

static void test_split(void) {
    /* groups of 1 response with prompt 1 token: cost = 1 + n_out */
    const int costs[4] = {10, 30, 20, 20};
    rl_group *gs[64];
    for (int i = 0; i < 4; i++) {
        int l = costs[i] - 1;
        gs[i] = make_group(i, 10, 1, 1, &l);
    }
    CHECK(rl_group_tokens(gs[1]) == 30 && rl_group_resp_tokens(gs[1]) == 29, "tokens %lld resp %lld",
          (long long)rl_group_tokens(gs[1]), (long long)rl_group_resp_tokens(gs[1]));
    int owner[64];
    rl_split_minibatch(gs, 4, 2, owner);
    /* 30 → r0; 20 (index 2) → r1; 20 (index 3) → r1 (20 < 30); 10 → r0 (30 < 40) */
    CHECK(owner[0] == 0 && owner[1] == 0 && owner[2] == 1 && owner[3] == 1, "owners %d %d %d %d", owner[0], owner[1],
          owner[2], owner[3]);
    rl_split_minibatch(gs, 4, 1, owner);
    CHECK(owner[0] == 0 && owner[1] == 0 && owner[2] == 0 && owner[3] == 0, "one rank owns everything");
    rl_split_minibatch(gs, 2, 3, owner); /* fewer groups than ranks: rank 2 gets nothing */
    CHECK(owner[0] == 1 && owner[1] == 0, "2 groups on 3 ranks: %d %d", owner[0], owner[1]);
    for (int i = 0; i < 4; i++) rl_group_free(gs[i]);
    /* random batches: the greedy bound max − min ≤ largest item */
    rng_state r;
    rng_seed(&r, 99);
    int bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        const int n = 1 + (int)rng_below(&r, 40), P = 1 + (int)rng_below(&r, 5);
        int64_t biggest = 0, load[8] = {0};
        for (int i = 0; i < n; i++) {
            int l = (int)rng_below(&r, 200);
            gs[i] = make_group(i, 100, 1 + (int)rng_below(&r, 9), 1, &l);
            biggest = MOERL_MAX(biggest, rl_group_tokens(gs[i]));
        }
        rl_split_minibatch(gs, n, P, owner);
        for (int i = 0; i < n; i++) {
            if (owner[i] < 0 || owner[i] >= P) bad++;
            else load[owner[i]] += rl_group_tokens(gs[i]);
            rl_group_free(gs[i]);
        }
        int64_t mx = 0, mn = INT64_MAX;
        for (int p = 0; p < P; p++) {
            mx = MOERL_MAX(mx, load[p]);
            mn = MOERL_MIN(mn, load[p]);
        }
        bad += mx - mn > biggest;
    }
    CHECK(bad == 0, "%d random splits broke the greedy balance bound", bad);
}

/* rl_shard_groups' bounds hold for the split itself: random mini-batches whose groups cost between
 * cmin and cmax tokens (uniform, and one costly group among cheap ones, the case that leaves a rank
 * with few groups), every rank's group count within [k_lo, k_hi]; one shard gets all. */
static void test_shard_bounds(void) {
    rl_group *gs[64];
    int owner[64];
    rng_state r;
    rng_seed(&r, 7);
    int bad = 0, trials = 0, tight = 0;
    for (int trial = 0; trial < 400; trial++) {
        const int G = 1 + (int)rng_below(&r, 40), D = 1 + (int)rng_below(&r, 6);
        const int pmin = 1 + (int)rng_below(&r, 20), pmax = pmin + (int)rng_below(&r, 30), R = (int)rng_below(&r, 60);
        const int skewed = trial % 2;
        for (int i = 0; i < G; i++) {
            const int p = skewed ? (i == 0 ? pmax : pmin) : pmin + (int)rng_below(&r, (uint64_t)(pmax - pmin + 1));
            int l = skewed ? (i == 0 ? R : 0) : (int)rng_below(&r, (uint64_t)R + 1);
            gs[i] = make_group(i, 100, p, 1, &l);
        }
        rl_split_minibatch(gs, G, D, owner);
        int count[8] = {0};
        for (int i = 0; i < G; i++) count[owner[i]]++;
        int k_lo, k_hi;
        rl_shard_groups(G, D, pmin, pmax + R, &k_lo, &k_hi);
        for (int d = 0; d < D; d++) {
            bad += count[d] < k_lo || count[d] > k_hi;
            tight += count[d] == k_lo || count[d] == k_hi;
        }
        for (int i = 0; i < G; i++) rl_group_free(gs[i]);
        trials++;
    }
    CHECK(bad == 0, "%d rank group counts outside rl_shard_groups' bounds in %d mini-batches", bad, trials);
    CHECK(tight > 0, "the bounds are reached somewhere (%d)", tight);
    int lo, hi;
    rl_shard_groups(5, 1, 1, 10, &lo, &hi);
    CHECK(lo == 5 && hi == 5, "one shard: exactly G (%d..%d)", lo, hi);
    rl_shard_groups(8, 2, 10, 10, &lo, &hi); /* equal costs: 4 each */
    CHECK(lo == 4 && hi == 4, "equal costs over 2 shards: 4..4, got %d..%d", lo, hi);
    /* the review's case: 8 groups of one sequence, 1 in 8 prompts long (78 + 8 response tokens = 86),
     * the others ≥ 28: a pipeline with one group would leave the other 7 ≥ 196 tokens, more than
     * 2·86, so the split never gives a pipeline fewer than 2 */
    rl_shard_groups(8, 2, 28, 86, &lo, &hi);
    CHECK(lo == 2 && hi == 6, "8 groups of 28..86 tokens over 2 shards: 2..6, got %d..%d", lo, hi);
    /* mixed lengths: each group long (a long prompt) with probability 1/8 or 1/2, responses of 0..R
     * tokens; every count within the bounds, and the bounds' width against what the split reached */
    int mixed_bad = 0, reach_lo = 0, reach_hi = 0, mixed_trials = 0;
    for (int trial = 0; trial < 4000; trial++) {
        const int G = 1 + (int)rng_below(&r, 24), D = 2 + (int)rng_below(&r, 3), gsz = 1 + (int)rng_below(&r, 3);
        const int short_p = 5 + (int)rng_below(&r, 30), long_p = short_p + (int)rng_below(&r, 80);
        const int R = (int)rng_below(&r, 20), odds = trial % 2 ? 8 : 2;
        int lens[3];
        for (int i = 0; i < G; i++) {
            for (int j = 0; j < gsz; j++) lens[j] = (int)rng_below(&r, (uint64_t)R + 1);
            gs[i] = make_group(i, 100, rng_below(&r, (uint64_t)odds) == 0 ? long_p : short_p, gsz, lens);
        }
        rl_split_minibatch(gs, G, D, owner);
        int count[8] = {0};
        for (int i = 0; i < G; i++) count[owner[i]]++;
        int k_lo, k_hi;
        rl_shard_groups(G, D, (int64_t)gsz * short_p, (int64_t)gsz * (long_p + R), &k_lo, &k_hi);
        for (int d = 0; d < D; d++) {
            mixed_bad += count[d] < k_lo || count[d] > k_hi;
            reach_lo += count[d] == k_lo;
            reach_hi += count[d] == k_hi;
        }
        for (int i = 0; i < G; i++) rl_group_free(gs[i]);
        mixed_trials++;
    }
    CHECK(mixed_bad == 0, "%d rank group counts outside rl_shard_groups' bounds in %d mixed-length mini-batches",
          mixed_bad, mixed_trials);
    CHECK(reach_lo > 0 && reach_hi > 0, "mixed lengths reach both bounds somewhere (%d low, %d high)", reach_lo,
          reach_hi);
    /* exhaustive over small cases: every cost vector over {cmin, mid, cmax} for G ≤ 7 and D ≤ 3; the
     * counts stay in the bounds, and the bounds are reached by some vector in most cases */
    int ex_bad = 0, ex_cases = 0, ex_tight = 0;
    const int64_t costs[3][3] = {{10, 20, 30}, {28, 50, 86}, {5, 40, 100}};
    for (int ci = 0; ci < 3; ci++)
        for (int D = 2; D <= 3; D++)
            for (int G = 1; G <= 7; G++) {
                int pw = 1, seen_lo = G, seen_hi = 0;
                for (int i = 0; i < G; i++) pw *= 3;
                for (int code = 0; code < pw; code++) {
                    int c = code;
                    for (int i = 0; i < G; i++, c /= 3) {
                        int zero = 0;
                        gs[i] = make_group(i, 100, (int)costs[ci][c % 3], 1, &zero);
                    }
                    rl_split_minibatch(gs, G, D, owner);
                    int count[8] = {0};
                    for (int i = 0; i < G; i++) count[owner[i]]++;
                    for (int d = 0; d < D; d++) {
                        seen_lo = MOERL_MIN(seen_lo, count[d]);
                        seen_hi = MOERL_MAX(seen_hi, count[d]);
                    }
                    for (int i = 0; i < G; i++) rl_group_free(gs[i]);
                }
                int k_lo, k_hi;
                rl_shard_groups(G, D, costs[ci][0], costs[ci][2], &k_lo, &k_hi);
                ex_bad += seen_lo < k_lo || seen_hi > k_hi;
                ex_tight += seen_lo == k_lo && seen_hi == k_hi;
                ex_cases++;
            }
    CHECK(ex_bad == 0, "%d of %d exhaustive small cases outside rl_shard_groups' bounds", ex_bad, ex_cases);
    /* the bounds are sound, not exact (the split's largest-first order is not modelled): most cases
     * still hit both ends */
    CHECK(ex_tight * 2 > ex_cases, "the bounds are exact in %d of %d exhaustive small cases", ex_tight, ex_cases);
    fprintf(stderr, "rl_shard_groups: exact in %d of %d exhaustive small cases\n", ex_tight, ex_cases);
}

/* A multi-turn group: response j's out_mask (NULL for j = 1: a request built outside the engine) with
 * runs of inserted tokens, and the trajectories' records. */
static rl_group *make_multi_turn_group(void) {
    const int lens[3] = {7, 4, 0};
    rl_group *g = make_group(901, 100, 5, 3, lens);
    for (int j = 0; j < 3; j++) {
        gen_request *r = &g->reqs[j];
        if (j == 1) continue;
        r->out_mask = xmalloc((size_t)r->n_out + 1);
        for (int t = 0; t < r->n_out; t++) {
            r->out_mask[t] = !(t >= 2 && t < 5); /* sampled, 3 inserted, sampled */
            if (!r->out_mask[t]) r->out_logprobs[t] = 0.0f;
        }
    }
    g->traj = xcalloc(3, sizeof(agent_traj));
    g->traj[0] = (agent_traj){.turns = 2, .tool_calls = 3, .tool_errors = 1, .env_done = 1, .has_env_reward = 1,
                              .env_reward = 0.1};
    g->traj[1] = (agent_traj){.turns = 1};
    g->traj[2] = (agent_traj){.turns = 4, .tool_calls = 3, .has_env_reward = 1, .env_reward = -1e300};
    return g;
}

/* Encode the multi-turn group, patch `bytes` bytes at off, decode; the error message (or "OK"). */
static const char *mt_patched(size_t off, uint64_t v, int bytes) {
    rl_group *g = make_multi_turn_group();
    void *buf;
    size_t len;
    MOERL_ASSERT(rl_group_encode(g, &buf, &len) == MOERL_OK);
    memcpy((char *)buf + off, &v, bytes);
    rl_group *d = NULL;
    const int rc = rl_group_decode(buf, len, &d);
    const int leak_free = rc == MOERL_OK || d == NULL;
    rl_group_free(d);
    free(buf);
    rl_group_free(g);
    MOERL_ASSERT(leak_free);
    return rc == MOERL_OK ? "OK" : moerl_last_error();
}

/* Format 3's loss mask per response and trajectory records: exact round trip (alone and in a train
 * message), every truncation refused, a mask byte other than 0/1 and out-of-range records refused
 * with a message naming the uid and response, the encoder refusing the same. */
static void test_group_mask_traj(void) {
    rl_group *g = make_multi_turn_group();
    void *buf;
    size_t len;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_OK, "encode: %s", moerl_last_error());
    /* route shape 12; responses: 20 + 12·n_out each, + n_out mask bytes when present (responses 0 and 2);
     * scored 4; has_traj 4 + 3 × (5·4 + 8); n_preemptions 3 × 4 */
    const size_t resp = 40 + 5 * 4 + 12 + 3 * 20 + 12 * (7 + 4 + 0) + (7 + 0);
    const size_t want = resp + 4 + 4 + 3 * 28 + 3 * 4;
    CHECK(len == want, "encoded %zu bytes, layout says %zu", len, want);
    rl_group *d = NULL;
    CHECK(rl_group_decode(buf, len, &d) == MOERL_OK, "decode: %s", moerl_last_error());
    if (d) {
        CHECK(same_group(g, d), "mask or trajectories differ after the round trip");
        CHECK(d->reqs[0].out_mask && !d->reqs[1].out_mask && d->reqs[2].out_mask && d->traj,
              "a response without a mask stays without one, an empty response keeps its (empty) mask");
        CHECK(d->reqs[0].out_mask && d->reqs[0].out_mask[1] == 1 && d->reqs[0].out_mask[2] == 0 &&
                  d->reqs[0].out_mask[5] == 1,
              "mask bytes");
        CHECK(d->traj && d->traj[0].tool_errors == 1 && d->traj[0].env_reward == 0.1 && d->traj[2].env_reward == -1e300,
              "trajectory records bit-exact");
        rl_group_free(d);
    }
    int trunc_ok = 1;
    for (size_t cut = 0; cut < len; cut++) {
        rl_group *x = NULL;
        if (rl_group_decode(buf, cut, &x) != MOERL_ERR || x != NULL) {
            trunc_ok = 0;
            rl_group_free(x);
            fprintf(stderr, "  truncated to %zu bytes: accepted\n", cut);
            break;
        }
    }
    CHECK(trunc_ok, "every truncation of a multi-turn group must be refused");
    free(buf);
    /* offsets: route shape 60..72; response 0 starts at 72; its has_mask at 72 + 12 + 12·7 = 168, mask
     * 172..179, n_routes 179; response 1 at 183, has_mask at 183 + 12 + 48 = 243, n_routes 247; response 2
     * at 251, has_mask 263, n_routes 267; scored 271; has_traj 275; record 0 at 279: turns, tool_calls 283,
     * tool_errors 287, env_done 291, has_env_reward 295, env_reward 299; record 1 at 307 */
    struct {
        size_t off;
        uint64_t v;
        int bytes;
        const char *want;
    } cs[] = {
        {174, 2, 1, "uid 901 response 0: mask[2] = 2"},
        {172, 255, 1, "uid 901 response 0: mask[0] = 255"},
        {168, 2, 4, "has_mask"},
        {243, (uint32_t)-1, 4, "has_mask"},
        {243, 1, 4, "uid 901"},            /* a mask announced for response 1: the bytes after it shift */
        {275, 2, 4, "has_traj"},
        {279, (uint32_t)-1, 4, "uid 901 response 0: trajectory turns -1"},
        {287, 4, 4, "tool_errors 4"},      /* more errors than calls */
        {291, 2, 4, "env_done 2"},
        {295, 3, 4, "has_env_reward 3"},
        {299, 0x7ff8000000000000ULL, 8, "env_reward nan"},
        {307 + 4, (uint32_t)-7, 4, "uid 901 response 1"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const char *msg = mt_patched(cs[i].off, cs[i].v, cs[i].bytes);
        CHECK(strcmp(msg, "OK") != 0 && strstr(msg, cs[i].want) != NULL,
              "mask/traj patch %zu (offset %zu): message '%s' lacks '%s'", i, cs[i].off, msg, cs[i].want);
    }
    CHECK(strcmp(mt_patched(173, 0, 1), "OK") == 0, "a 0 mask byte where a 1 was still decodes");
    /* the encoder refuses what the decoder would */
    g->reqs[0].out_mask[3] = 7;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_ERR && strstr(moerl_last_error(), "out_mask[3] = 7"),
          "encode of a bad mask byte: %s", moerl_last_error());
    g->reqs[0].out_mask[3] = 0;
    g->traj[1].tool_errors = 2;
    CHECK(rl_group_encode(g, &buf, &len) == MOERL_ERR && strstr(moerl_last_error(), "response 1: trajectory"),
          "encode of a bad trajectory record: %s", moerl_last_error());
    g->traj[1].tool_errors = 0;
    /* a train message carries them to the other trainer ranks */
    rl_minibatch mb = {.n_groups = 1, .resp_tokens = 11, .tokens = 26};
    CHECK(rl_train_msg_encode(RL_TRAIN_CMD_STEP, 1, 2, &mb, 1, &g, &buf, &len) == MOERL_OK, "train encode: %s",
          moerl_last_error());
    rl_train_msg m;
    CHECK(rl_train_msg_decode(buf, len, &m) == MOERL_OK && m.n_groups == 1 && same_group(g, m.groups[0]),
          "train message keeps the masks and trajectories: %s", moerl_last_error());
    rl_train_msg_free(&m);
    free(buf);
    rl_group_free(g);
}

int main(void) {
    test_group_roundtrip();
    test_group_mask_traj();
    test_group_errors();
    test_group_rewards();
    test_train_msg();
    test_split();
    test_shard_bounds();
    TEST_MAIN_END();
}
