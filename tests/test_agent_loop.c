/* The agent loop (rl/agent_loop.h) on the real engine, Qwen3's tokenizer and template, and the
 * test environment program tests/tools/calc_env.py. The model's turns are forced (sampling_params
 * .forced) so that their text is known — including non-canonical ids: "hello" sampled as "hel" +
 * "lo" (one token when encoded) and an emoji as its four byte tokens — and the trajectory keeps
 * exactly those ids (never re-encoded), the tool turn's ids equal the text Qwen3's template writes
 * for it, the masks are 1 on sampled and 0 on inserted tokens, the sampled tokens' behaviour
 * logprobs equal a full forward's, and per-token versions stay exact when a weight sync comes while
 * the trajectory waits for its tool. Then what the model sees on bad tool input (malformed call,
 * unknown tool, a tool error, a timeout), the turn limit, the length limit, and an environment
 * that dies (the run stops with a message naming the tool). Needs python3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "fixture.h"
#include "model/forward.h"
#include "model/model.h"
#include "rl/agent_loop.h"
#include "rollout/engine.h"
#include "test.h"
#include "train/train.h"

#define VOCAB 151936
#define MAXLEN 1536

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static const char *TOOLS_YAML =
    "- function: {name: calc, description: Evaluate integer arithmetic., parameters: {type: object, properties: "
    "{expr: {type: string}}, required: [expr]}}\n"
    "  command: PY tests/tools/calc_env.py\n"
    "- function: {name: fail, description: Always fails.}\n"
    "  command: PY tests/tools/calc_env.py\n"
    "- function: {name: sleep, description: Never answers in time.}\n"
    "  command: PY tests/tools/calc_env.py\n"
    "- function: {name: die, description: Kills its program.}\n"
    "  command: PY tests/tools/calc_env.py\n"
    "- function: {name: meet, description: Answers once a folder holds n files.}\n"
    "  command: PY tests/tools/calc_env.py\n";

typedef struct {
    tokenizer *tk;
    moe_model m;
    engine *e;
    tool_config tc;
    json_t *schemas;
    ds_row row;
    tok_seq prompt;
    int32_t eot;
} fixture;

static void ids_of(const char *text, tok_seq *out) { tok_encode(text, strlen(text), false, out); }

static void append(tok_seq *s, const tok_seq *a) {
    for (int64_t i = 0; i < a->n; i++) tok_seq_push(s, a->ids[i]);
}

static void fx_setup(fixture *f) {
    memset(f, 0, sizeof *f);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3_tok", testdata());
    f->tk = tokenizer_load(dir, VOCAB);
    MOERL_ASSERT(f->tk);
    MOERL_ASSERT(tokenizer_set_chat_template(f->tk, "qwen3", false, "data.chat_template") == MOERL_OK);
    tok_set_current(f->tk);
    f->eot = tokenizer_token_id(f->tk, "<|im_end|>");
    const char *kv[] = {"model.max_position_embeddings=2048", "model.initializer_range=0.1"};
    moe_config c = fx_small_config_vocab(VOCAB, kv, FX_N(kv));
    MOERL_ASSERT(model_init(&f->m, &c) == MOERL_OK);
    model_init_random(&f->m, 5);
    engine_config ec = {.max_num_seqs = 4, .max_model_len = MAXLEN, .max_num_batched_tokens = 512};
    f->e = engine_create(&f->m.cfg, ec);
    MOERL_ASSERT(f->e && engine_load_weights(f->e, f->m.params, f->m.n_params, 0) == MOERL_OK);
    const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    char yaml[2048];
    size_t o = 0;
    for (const char *s = TOOLS_YAML; *s; s++) {
        if (!strncmp(s, "PY", 2)) {
            o += (size_t)snprintf(yaml + o, sizeof yaml - o, "%s", py);
            s++;
        } else {
            yaml[o++] = *s;
        }
    }
    yaml[o] = 0;
    MOERL_ASSERT(tool_config_load_string(yaml, o, "tools.yaml", &f->tc) == MOERL_OK);
    f->schemas = tool_config_schemas(&f->tc);
    static chat_msg user = {"user", "What is 2+3? Say hello.", NULL};
    f->row = (ds_row){.data_source = "t", .prompt = &user, .n_prompt = 1, .tools = f->schemas, .line = 7};
    ds_row_encode_prompt(&f->row, &f->prompt);
}

static void fx_free(fixture *f) {
    engine_free(f->e);
    model_free(&f->m);
    tool_config_free(&f->tc);
    json_decref(f->schemas);
    tok_seq_free(&f->prompt);
    tok_set_current(NULL);
    tokenizer_free(f->tk);
}

static agent_loop *make_loop(fixture *f, int max_turns, double timeout_s, int retries) {
    multi_turn_config m = {.enable = 1, .max_assistant_turns = max_turns, .max_tool_response_length = 256};
    snprintf(m.format, sizeof m.format, "hermes");
    env_config ec = {.timeout_s = timeout_s, .num_workers = 2, .max_concurrency = 2, .max_retries = retries};
    agent_loop *A = agent_loop_create(&m, &f->tc, &ec);
    CHECK(A != NULL, "agent_loop_create: %s", A ? "" : moerl_last_error());
    return A;
}

static void init_req(fixture *f, gen_request *r, const tok_seq *script, int max_tokens) {
    memset(r, 0, sizeof *r);
    r->id = 1;
    r->prompt = f->prompt.ids;
    r->prompt_len = (int)f->prompt.n;
    r->sp.temperature = 1.0f;
    r->sp.top_p = 1.0f;
    r->sp.seed = 99;
    r->sp.max_tokens = max_tokens;
    r->sp.forced = script->ids;
    r->sp.n_forced = (int)script->n;
}

/* Drive r to the end of its trajectory; with sync_while_waiting, load the weights as version 1 the
 * first time r waits for its tool (a weight sync while the tool runs). Returns MOERL_OK, or
 * MOERL_ERR from the loop (the environment failed). */
static int run_traj(fixture *f, agent_loop *A, gen_request *r, agent_traj *t, int sync_while_waiting) {
    MOERL_ASSERT(engine_add(f->e, r) == MOERL_OK);
    gen_request *done[8];
    int synced = 0;
    for (int guard = 0; guard < 100000; guard++) {
        const int k = engine_step(f->e, done, 8);
        MOERL_ASSERT(k >= 0);
        for (int i = 0; i < k; i++) {
            const int rc = agent_loop_turn_end(A, f->e, done[i], t, &f->row, "7-0");
            if (rc < 0) return MOERL_ERR;
            if (rc == 1) return MOERL_OK;
        }
        if (agent_loop_waiting(A) > 0) {
            if (sync_while_waiting && !synced) {
                engine_pause(f->e, NULL, 0);
                MOERL_ASSERT(engine_load_weights(f->e, f->m.params, f->m.n_params, 1) == MOERL_OK);
                MOERL_ASSERT(engine_resume(f->e, done, 8) == 0);
                synced = 1;
            }
            const int p = agent_loop_poll(A, f->e, done, 8, 0.05);
            if (p < 0) return MOERL_ERR;
            if (p == 1) return MOERL_OK;
        }
    }
    MOERL_ASSERT(0);
    return MOERL_ERR;
}

/* The text of out[a..b) (special tokens kept). */
static char *text_of(const gen_request *r, int a, int b) {
    size_t l = 0;
    return tok_decode(&r->out_tokens[a], b - a, false, &l);
}

/* Logprobs of the sampled tokens against one full forward of prompt ⊕ output: the engine ran the
 * same fp32 math in other batch shapes (prefill of the continued turn): 2e-5 absolute is that
 * rounding margin (test_engine_turns uses 1e-5 for one turn; here the second turn's prefix is
 * recomputed at another chunking). Inserted tokens must carry 0. */
static void check_logprobs(fixture *f, const gen_request *r) {
    const int T = r->prompt_len + r->n_out;
    int *tok = xmalloc((size_t)T * sizeof(int));
    memcpy(tok, r->prompt, (size_t)r->prompt_len * sizeof(int));
    memcpy(tok + r->prompt_len, r->out_tokens, (size_t)r->n_out * sizeof(int));
    train_seq s = {.tokens = tok, .len = T, .resp_start = r->prompt_len};
    model_acts a;
    MOERL_ASSERT(model_acts_init(&a, &f->m, T) == MOERL_OK);
    float *lp = xcalloc((size_t)r->n_out, sizeof(float));
    float *outp[1] = {lp};
    MOERL_ASSERT(compute_logprobs(&f->m, &a, &s, 1, T, 1.0f, outp) == MOERL_OK);
    double worst = 0;
    int bad_inserted = 0;
    for (int i = 0; i < r->n_out; i++) {
        if (r->out_mask[i]) worst = fmax(worst, fabs((double)lp[i] - r->out_logprobs[i]));
        else bad_inserted += r->out_logprobs[i] != 0.0f;
    }
    CHECK(worst < 2e-5, "sampled tokens' behaviour logprobs = full forward's (max |diff| %.3g)", worst);
    CHECK(bad_inserted == 0, "inserted tokens carry logprob 0 (%d do not)", bad_inserted);
    model_acts_free(&a);
    free(lp);
    free(tok);
}

static void test_trajectory(fixture *f) {
    agent_loop *A = make_loop(f, 0, 30, 1);
    if (!A) return;
    /* turn 1: "hel"+"lo" (non-canonical), an emoji as its 4 byte tokens, a tool call; turn 2: the answer */
    tok_seq hel = {0}, lo = {0}, hello = {0}, call = {0}, ans = {0}, t1 = {0}, script = {0};
    ids_of("hel", &hel);
    ids_of("lo", &lo);
    ids_of("hello", &hello);
    CHECK(hel.n == 1 && lo.n == 1 && hello.n == 1 && hello.ids[0] != hel.ids[0],
          "'hello' is one token, 'hel' + 'lo' two others (a non-canonical split)");
    const char *bytes[4] = {"\xc3\xb0", "\xc5\x81", "\xc4\xba", "\xc4\xa2"}; /* byte-level chars of F0 9F 98 80 */
    append(&t1, &hel);
    append(&t1, &lo);
    tok_seq_push(&t1, tokenizer_token_id(f->tk, " "));
    for (int i = 0; i < 4; i++) {
        const int32_t id = tokenizer_token_id(f->tk, bytes[i]);
        CHECK(id >= 0, "byte token %d of the emoji exists", i);
        tok_seq_push(&t1, id);
    }
    ids_of("\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"2+3\"}}\n</tool_call>", &call);
    append(&t1, &call);
    tok_seq_push(&t1, f->eot);
    ids_of("Answer: 5", &ans);
    append(&script, &t1);
    append(&script, &ans);
    tok_seq_push(&script, f->eot);

    gen_request r;
    init_req(f, &r, &script, 600);
    agent_traj t = {0};
    CHECK(run_traj(f, A, &r, &t, 1) == MOERL_OK, "trajectory runs: %s", moerl_last_error());
    CHECK(r.finish == FINISH_STOP && t.turns == 2 && t.tool_calls == 1 && t.tool_errors == 0,
          "two turns, one tool call, no error (finish %s, turns %d, calls %d, errors %d)", finish_reason_name(r.finish),
          t.turns, t.tool_calls, t.tool_errors);
    /* turn 1 exactly as sampled */
    int same = r.n_out >= t1.n;
    for (int64_t i = 0; same && i < t1.n; i++) same = r.out_tokens[i] == t1.ids[i] && r.out_mask[i] == 1;
    CHECK(same, "turn 1's ids are the sampled ids, non-canonical ones included, mask 1");
    /* the tool turn: Qwen3's template text for one tool response, then turn 2 */
    tok_seq want = {0};
    const char *delta = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
                        "<think>\n\n</think>\n\n";
    tok_encode(delta, strlen(delta), true, &want);
    const int ins0 = (int)t1.n, ins1 = r.n_out - (int)ans.n - 1;
    int ok = ins1 - ins0 == want.n;
    for (int i = 0; ok && i < want.n; i++) ok = r.out_tokens[ins0 + i] == want.ids[i] && r.out_mask[ins0 + i] == 0;
    char *got = text_of(&r, ins0, ins1);
    CHECK(ok, "the tool turn's ids are the template's text for the response \"5\", mask 0 (got \"%s\")", got);
    free(got);
    same = 1;
    for (int64_t i = 0; i <= ans.n && same; i++)
        same = r.out_tokens[ins1 + i] == (i < ans.n ? ans.ids[i] : f->eot) && r.out_mask[ins1 + i] == 1;
    CHECK(same, "turn 2 as sampled, mask 1");
    /* versions: turn 1 and its tool turn under version 0; turn 2 under version 1 (the sync came while the
     * tool ran); behaviour logprobs are those of the weights in force (the same weights here) */
    int vok = 1;
    for (int i = 0; i < r.n_out; i++) vok &= r.out_versions[i] == (i < ins1 ? 0 : 1);
    CHECK(vok, "per-token versions: 0 through the tool turn, 1 for the turn after the sync");
    check_logprobs(f, &r);
    agent_stats st;
    agent_loop_take_stats(A, &st);
    CHECK(st.trajectories == 1 && st.turns_sum == 2 && st.turns_max == 2 && st.tool_calls == 1 &&
              st.tool_errors == 0 && st.tool_latency_sum_s > 0 && st.tool_wait_s > 0,
          "stats: 1 trajectory, 2 turns, 1 call, latency and wait counted");
    gen_request_free_outputs(&r);
    agent_loop_free(A);
    tok_seq_free(&hel); tok_seq_free(&lo); tok_seq_free(&hello); tok_seq_free(&call); tok_seq_free(&ans);
    tok_seq_free(&t1); tok_seq_free(&script); tok_seq_free(&want);
}

/* One turn of calls (the text between <tool_call> blocks), then "ok": what the model is shown. */
static void run_bad_calls(fixture *f, agent_loop *A, const char *calls, const char *want_in_response, int want_errors,
                          const char *tag) {
    tok_seq script = {0}, ok = {0};
    ids_of(calls, &script);
    tok_seq_push(&script, f->eot);
    const int64_t n1 = script.n;
    ids_of("ok", &ok);
    append(&script, &ok);
    tok_seq_push(&script, f->eot);
    gen_request r;
    init_req(f, &r, &script, 900);
    agent_traj t = {0};
    CHECK(run_traj(f, A, &r, &t, 0) == MOERL_OK, "%s: the run goes on (%s)", tag, moerl_last_error());
    char *resp = text_of(&r, (int)n1, r.n_out - (int)ok.n - 1);
    CHECK(t.turns == 2 && t.tool_errors == want_errors && strstr(resp, want_in_response),
          "%s: the model sees \"%s\" and %d tool error(s) are counted (turns %d, errors %d, tool turn \"%s\")", tag,
          want_in_response, want_errors, t.turns, t.tool_errors, resp);
    free(resp);
    gen_request_free_outputs(&r);
    tok_seq_free(&script);
    tok_seq_free(&ok);
}

static void test_bad_input(fixture *f) {
    agent_loop *A = make_loop(f, 0, 1.0, 1);
    if (!A) return;
    run_bad_calls(f, A, "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": </tool_call>", "Error", 1,
                  "invalid JSON");
    run_bad_calls(f, A, "<tool_call>{\"name\": \"nosuch\", \"arguments\": {}}</tool_call>", "nosuch", 1, "unknown tool");
    run_bad_calls(f, A, "<tool_call>{\"name\": \"fail\", \"arguments\": {}}</tool_call>", "division by zero", 1,
                  "a tool error");
    run_bad_calls(f, A, "<tool_call>{\"name\": \"sleep\", \"arguments\": {}}</tool_call>", "timed out", 1, "a timeout");
    run_bad_calls(f, A,
                  "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"6*7\"}}</tool_call>"
                  "<tool_call>{\"name\": \"fail\", \"arguments\": {}}</tool_call>",
                  "42", 1, "two calls in one turn, one failing");
    agent_stats st;
    agent_loop_take_stats(A, &st);
    CHECK(st.tool_calls == 6 && st.tool_errors == 5 && st.malformed_calls == 2 && st.tool_timeouts == 1,
          "stats: 6 calls, 5 errors, 2 malformed, 1 timeout (got %ld, %ld, %ld, %ld)", st.tool_calls, st.tool_errors,
          st.malformed_calls, st.tool_timeouts);
    agent_loop_free(A);
}

/* A turn whose bytes are not valid UTF-8 (a lone lead byte sampled as its byte token) still gets its
 * tool turn: the template renders the text with U+FFFD, the sampled ids stay as they were. */
static void test_invalid_utf8(fixture *f) {
    agent_loop *A = make_loop(f, 0, 30, 1);
    if (!A) return;
    tok_seq script = {0}, call = {0};
    tok_seq_push(&script, tokenizer_token_id(f->tk, "\xc3\xb0")); /* the byte F0 alone */
    ids_of("<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"3*3\"}}</tool_call>", &call);
    append(&script, &call);
    tok_seq_push(&script, f->eot);
    const int32_t first = script.ids[0];
    tok_seq_clear(&call);
    ids_of("ok", &call);
    append(&script, &call);
    tok_seq_push(&script, f->eot);
    gen_request r;
    init_req(f, &r, &script, 600);
    agent_traj t = {0};
    const int rc = run_traj(f, A, &r, &t, 0);
    char *all = text_of(&r, 0, r.n_out);
    CHECK(rc == MOERL_OK && t.turns == 2 && r.out_tokens[0] == first && strstr(all, "<tool_response>\n9\n"),
          "invalid UTF-8 in a turn: the tool turn follows (rc %d, turns %d): %s", rc, t.turns,
          rc == MOERL_OK ? "" : moerl_last_error());
    free(all);
    gen_request_free_outputs(&r);
    agent_loop_free(A);
    tok_seq_free(&script);
    tok_seq_free(&call);
}

/* Other sequences keep decoding while one waits for its tool: trajectory A calls `meet`, which answers
 * only once its folder holds 2 files — the test adds the second after trajectory B (no tool call, 200
 * tokens) has ended. If the engine waited for A's tool, B could never end and A never be answered. */
static void test_decoding_goes_on(fixture *f) {
    agent_loop *A = make_loop(f, 0, 60, 1);
    if (!A) return;
    char dir[] = "/tmp/moerl_agent_XXXXXX";
    MOERL_ASSERT(mkdtemp(dir));
    char call[512];
    snprintf(call, sizeof call, "<tool_call>{\"name\": \"meet\", \"arguments\": {\"dir\": \"%s\", \"n\": 2}}</tool_call>",
             dir);
    tok_seq sa = {0}, sb = {0};
    ids_of(call, &sa);
    tok_seq_push(&sa, f->eot);
    ids_of("done", &sa);
    tok_seq_push(&sa, f->eot);
    for (int i = 0; i < 200; i++) tok_seq_push(&sb, tokenizer_token_id(f->tk, "a"));
    gen_request ra, rb;
    init_req(f, &ra, &sa, 600);
    init_req(f, &rb, &sb, 200);
    rb.id = 2;
    agent_traj ta = {0}, tb = {0};
    MOERL_ASSERT(engine_add(f->e, &ra) == MOERL_OK && engine_add(f->e, &rb) == MOERL_OK);
    gen_request *done[8];
    int a_end = 0, b_end = 0, b_ended_while_a_waited = 0, guard = 0;
    while (!(a_end && b_end) && guard++ < 100000) {
        const int k = engine_num_unfinished(f->e) > 0 ? engine_step(f->e, done, 8) : 0;
        for (int i = 0; i < k; i++) {
            agent_traj *t = done[i] == &ra ? &ta : &tb;
            const int rc = agent_loop_turn_end(A, f->e, done[i], t, &f->row, done[i] == &ra ? "a" : "b");
            MOERL_ASSERT(rc >= 0);
            if (rc == 1 && done[i] == &ra) a_end = 1;
            if (rc == 1 && done[i] == &rb) {
                b_end = 1;
                b_ended_while_a_waited = agent_loop_waiting(A) == 1;
                char file[600];
                snprintf(file, sizeof file, "%s/from-the-test", dir);
                FILE *fp = fopen(file, "w");
                MOERL_ASSERT(fp);
                fclose(fp);
            }
        }
        const int p = agent_loop_poll(A, f->e, done, 8, engine_num_unfinished(f->e) > 0 ? 0 : 0.05);
        MOERL_ASSERT(p >= 0);
        if (p == 1 && done[0] == &ra) a_end = 1;
    }
    char *resp = text_of(&ra, (int)(sa.n - 2), ra.n_out);
    CHECK(a_end && b_end && b_ended_while_a_waited && ta.turns == 2 && strstr(resp, "met"),
          "decoding goes on while a trajectory waits for its tool (B ended while A waited: %d; A's tool saw: %s)",
          b_ended_while_a_waited, resp);
    free(resp);
    gen_request_free_outputs(&ra);
    gen_request_free_outputs(&rb);
    agent_loop_free(A);
    tok_seq_free(&sa);
    tok_seq_free(&sb);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    MOERL_ASSERT(system(cmd) == 0);
}

static void test_limits(fixture *f) {
    /* max_assistant_turns 1: the call is counted, never run, and the trajectory ends */
    agent_loop *A = make_loop(f, 1, 30, 1);
    if (!A) return;
    tok_seq script = {0};
    ids_of("<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"1+1\"}}</tool_call>", &script);
    tok_seq_push(&script, f->eot);
    gen_request r;
    init_req(f, &r, &script, 600);
    agent_traj t = {0};
    CHECK(run_traj(f, A, &r, &t, 0) == MOERL_OK && t.turns == 1 && t.tool_calls == 1 && r.n_out == script.n &&
              agent_loop_waiting(A) == 0,
          "max_assistant_turns=1: one turn, the call counted and not run");
    gen_request_free_outputs(&r);
    agent_loop_free(A);
    /* the length limit: a tool turn that leaves no room ends the trajectory with finish length */
    A = make_loop(f, 0, 30, 1);
    init_req(f, &r, &script, (int)script.n + 10);
    memset(&t, 0, sizeof t);
    CHECK(run_traj(f, A, &r, &t, 0) == MOERL_OK && r.finish == FINISH_LENGTH && r.n_out <= r.sp.max_tokens &&
              t.turns == 1,
          "a tool turn longer than the room left: finish length, max_tokens never exceeded (n_out %d of %d)", r.n_out,
          r.sp.max_tokens);
    gen_request_free_outputs(&r);
    agent_loop_free(A);
    tok_seq_free(&script);
}

static void test_env_dies(fixture *f) {
    agent_loop *A = make_loop(f, 0, 30, 0);
    if (!A) return;
    tok_seq script = {0};
    ids_of("<tool_call>{\"name\": \"die\", \"arguments\": {}}</tool_call>", &script);
    tok_seq_push(&script, f->eot);
    gen_request r;
    init_req(f, &r, &script, 600);
    agent_traj t = {0};
    const int rc = run_traj(f, A, &r, &t, 0);
    CHECK(rc == MOERL_ERR && strstr(moerl_last_error(), "die") && strstr(moerl_last_error(), "7-0"),
          "an environment program that dies stops the run, naming the tool and the trajectory: %s", moerl_last_error());
    engine_abort(f->e, NULL, 0);
    gen_request_free_outputs(&r);
    agent_loop_free(A);
    tok_seq_free(&script);
}

/* A template that drops tool messages is refused before anything runs (the model would never see an
 * answer); one that raises on them too, with its message. */
static void test_template_checks(fixture *f) {
    const char *drop = "{%- for m in messages %}{%- if m.role != 'tool' %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                       "<|im_end|>\n{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
                       "{%- endif %}";
    char path[] = "/tmp/moerl_tpl_XXXXXX.jinja";
    const int fd = mkstemps(path, 6);
    MOERL_ASSERT(fd >= 0 && write(fd, drop, strlen(drop)) == (ssize_t)strlen(drop));
    close(fd);
    MOERL_ASSERT(tokenizer_set_chat_template(f->tk, path, false, "data.chat_template") == MOERL_OK);
    CHECK(agent_loop_check_template(&f->tc) == MOERL_ERR && strstr(moerl_last_error(), "does not render tool messages"),
          "a template that drops tool messages is refused: %s", moerl_last_error());
    multi_turn_config m = {.enable = 1, .max_tool_response_length = 256};
    env_config ec = {.timeout_s = 30, .num_workers = 1, .max_concurrency = 1, .max_retries = 0};
    CHECK(agent_loop_create(&m, &f->tc, &ec) == NULL, "agent_loop_create refuses it too");
    unlink(path);
    MOERL_ASSERT(tokenizer_set_chat_template(f->tk, "qwen3", false, "data.chat_template") == MOERL_OK);
    CHECK(agent_loop_check_template(&f->tc) == MOERL_OK, "Qwen3's template passes: %s", moerl_last_error());
}

int main(void) {
    fixture f;
    fx_setup(&f);
    test_template_checks(&f);
    test_trajectory(&f);
    test_bad_input(&f);
    test_invalid_utf8(&f);
    test_decoding_goes_on(&f);
    test_limits(&f);
    test_env_dies(&f);
    fx_free(&f);
    TEST_MAIN_END();
}
