/* The environment client (src/reward/env.c) and the transport it shares with the reward backends
 * (src/reward/jsonl_pool*.c): tool calls to an environment program (tests/tools/calc_env.py) and to
 * an environment server on the loopback interface (tests/tools/env_server.py). The expected
 * contents are the tool program's own (the client must pass them through unchanged, so the
 * comparisons are exact; the calculator's products are checked against C's integer arithmetic).
 * Every failure mode: an error answer, garbage, a missing content, a timeout (tool responses,
 * counted), a program that dies once (restarted, the call sent again), a program that dies for
 * good and a server that refuses or answers 4xx (run-stopping errors naming the tool, the program
 * or URL and the trajectory). The calculator docs/multi-turn.md shows users runs as the page
 * shows it. No child process is left behind. Needs python3; runs from the
 * repository root. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/config.h"
#include "base/log.h"
#include "reward/env.h"
#include "test.h"

static pid_t server_pid;
static int server_port;
static FILE *server_pipe;

/* Child processes of this test (zombies included), the server excepted. */
static int children(void) {
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == server_pid) continue;
        char p[64], buf[512];
        snprintf(p, sizeof p, "/proc/%d/stat", pid);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = 0;
        char *close_paren = strrchr(buf, ')');
        int ppid = 0;
        char state;
        if (close_paren && sscanf(close_paren + 2, "%c %d", &state, &ppid) == 2 && ppid == getpid()) n++;
    }
    if (d) closedir(d);
    return n;
}

static int has(const char *needle) { return strstr(moerl_last_error(), needle) != NULL; }

/* A tool config whose tools (names[0..n)) all run `where` (a command, or a URL when is_url). */
static int load_tools(tool_config *tc, const char *const *names, int n, const char *where, int is_url) {
    char text[8192];
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "- function:\n    name: %s\n    description: test tool\n"
                                "    parameters: {type: object, properties: {}}\n  %s: %s\n",
                                names[i], is_url ? "url" : "command", where);
    return tool_config_load_string(text, len, "tools.yaml", tc);
}

static env_config default_config(void) {
    return (env_config){.timeout_s = 60, .num_workers = 2, .max_concurrency = 4, .max_retries = 2};
}

/* Wait for n results (in tag order into out[tag]); MOERL_ERR: env_poll failed. A guard of 120 s
 * against a hang fails the test (not a timing threshold: nothing here takes more than seconds). */
static int collect(env_client *e, env_result *out, int n) {
    int got = 0;
    for (int rounds = 0; got < n && rounds < 120; rounds++) {
        env_result r[8];
        int k = env_poll(e, r, 8, 1.0);
        if (k < 0) return MOERL_ERR;
        for (int i = 0; i < k; i++) {
            if (r[i].tag < (uint64_t)n) out[r[i].tag] = r[i];
            else env_result_free(&r[i]);
        }
        got += k;
    }
    return got == n ? MOERL_OK : moerl_errorf("collect: %d of %d results", got, n);
}

static void free_results(env_result *r, int n) {
    for (int i = 0; i < n; i++) env_result_free(&r[i]);
}

static void test_config(void) {
    cfg *c = cfg_new();
    env_def_keys(c);
    env_config ec;
    CHECK(env_read_config(c, &ec) == MOERL_OK && ec.timeout_s == 30 && ec.num_workers == 4 &&
              ec.max_concurrency == 8 && ec.max_retries == 2,
          "defaults: %s", moerl_last_error());
    const char *bad[][2] = {{"rollout.multi_turn.tool_timeout_s=0", "rollout.multi_turn.tool_timeout_s"},
                            {"rollout.multi_turn.tool_num_workers=0", "rollout.multi_turn.tool_num_workers"},
                            {"rollout.multi_turn.tool_max_concurrency=-2", "rollout.multi_turn.tool_max_concurrency"},
                            {"rollout.multi_turn.tool_max_retries=-1", "rollout.multi_turn.tool_max_retries"}};
    for (int i = 0; i < 4; i++) {
        cfg *d = cfg_new();
        env_def_keys(d);
        CHECK(cfg_apply_override(d, bad[i][0]) == MOERL_OK, "%s", moerl_last_error());
        CHECK(env_read_config(d, &ec) == MOERL_ERR && has(bad[i][1]) && has("override"), "%s: %s", bad[i][0],
              moerl_last_error());
        cfg_free(d);
    }
    cfg_free(c);
}

#define CALC_CMD "python3 tests/tools/calc_env.py"
static const char *const all_tools[] = {"calc",    "echo", "meet",    "fail",  "garbage", "nocontent",
                                        "sleep",   "die",  "dieonce", "exit0", "twolines"};
#define N_TOOLS 11

/* Answers, done + reward, several trajectories at once, tool errors: one environment program
 * serving every tool of the config. */
static void test_program(const char *tmp) {
    tool_config tc;
    CHECK(load_tools(&tc, all_tools, N_TOOLS, CALC_CMD, 0) == MOERL_OK, "%s", moerl_last_error());
    env_config ec = default_config();
    ec.num_workers = 4;
    env_client *e = env_create(&tc, &ec);
    CHECK(e != NULL, "create: %s", moerl_last_error());
    if (!e) return;
    /* the calculator: numbers too large for a small model, checked against C's integers */
    long long a = 123456789, b = 987654321;
    char want[64], args[128];
    snprintf(want, sizeof want, "%lld", a * b + 7);
    snprintf(args, sizeof args, "{\"expr\": \"%lld*%lld+7\"}", a, b);
    CHECK(env_submit(e, 0, "traj-0", "calc", args) == MOERL_OK, "%s", moerl_last_error());
    CHECK(env_submit(e, 1, "traj-1", "calc", "{\"expr\": \"2*(3+4)\", \"finish\": true}") == MOERL_OK, "%s",
          moerl_last_error());
    CHECK(env_pending(e) == 2, "pending %d", env_pending(e));
    env_result r[8] = {0};
    CHECK(collect(e, r, 2) == MOERL_OK, "%s", moerl_last_error());
    CHECK(r[0].content && !strcmp(r[0].content, want) && !r[0].error && !r[0].timed_out && !r[0].done &&
              !r[0].has_reward,
          "calc: '%s' want '%s'", r[0].content ? r[0].content : "(null)", want);
    CHECK(r[1].content && !strcmp(r[1].content, "14") && r[1].done && r[1].has_reward && r[1].reward == 1.0,
          "finish: '%s' done %d reward %d %g", r[1].content ? r[1].content : "(null)", r[1].done, r[1].has_reward,
          r[1].reward);
    CHECK(r[0].latency_s >= 0 && r[1].latency_s >= 0, "latency %g %g", r[0].latency_s, r[1].latency_s);
    CHECK(env_pending(e) == 0, "pending %d", env_pending(e));
    free_results(r, 2);

    /* four trajectories at once: each call waits until all four have arrived, so they only all
     * answer "met" when they run concurrently (serialised, each would wait 60 s and say "alone") */
    char dir[512], margs[700], tid[32];
    snprintf(dir, sizeof dir, "%s/meet", tmp);
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    snprintf(margs, sizeof margs, "{\"dir\": \"%s\", \"n\": 4}", dir);
    for (int i = 0; i < 4; i++) {
        snprintf(tid, sizeof tid, "traj-%d", 10 + i);
        CHECK(env_submit(e, (uint64_t)i, tid, "meet", margs) == MOERL_OK, "%s", moerl_last_error());
    }
    for (int i = 4; i < 8; i++) { /* and echo: each answer goes to its own call */
        snprintf(tid, sizeof tid, "traj-%d", 10 + i);
        CHECK(env_submit(e, (uint64_t)i, tid, "echo", "{\"text\": \"hi\"}") == MOERL_OK, "%s", moerl_last_error());
    }
    CHECK(collect(e, r, 8) == MOERL_OK, "%s", moerl_last_error());
    for (int i = 0; i < 4; i++) CHECK(r[i].content && !strcmp(r[i].content, "met"), "meet %d: %s", i, r[i].content);
    for (int i = 4; i < 8; i++) {
        snprintf(want, sizeof want, "traj-%d:hi", 10 + i);
        CHECK(r[i].content && !strcmp(r[i].content, want) && !r[i].error, "echo %d: %s", i, r[i].content);
    }
    free_results(r, 8);

    /* tool errors: answered to the model, counted, the run goes on */
    const char *bad[3] = {"fail", "garbage", "nocontent"};
    const char *says[3] = {"division by zero", "'GARBAGE', not a JSON object", "without a string \"content\""};
    for (int i = 0; i < 3; i++) CHECK(env_submit(e, (uint64_t)i, "traj-20", bad[i], "{}") == MOERL_OK, "%s", bad[i]);
    CHECK(collect(e, r, 3) == MOERL_OK, "%s", moerl_last_error());
    for (int i = 0; i < 3; i++)
        CHECK(r[i].content && !strncmp(r[i].content, "Error: ", 7) && strstr(r[i].content, says[i]) && r[i].error &&
                  !r[i].timed_out && !r[i].done,
              "%s: '%s'", bad[i], r[i].content ? r[i].content : "(null)");
    free_results(r, 3);
    env_stats st;
    env_get_stats(e, &st);
    CHECK(st.calls == 13 && st.errors == 3 && st.timeouts == 0 && st.latency_max_s >= 0 &&
              st.latency_sum_s >= st.latency_max_s,
          "stats: calls %ld errors %ld timeouts %ld", st.calls, st.errors, st.timeouts);

    /* the caller's bugs: refused at submit, nothing sent */
    CHECK(env_submit(e, 0, "traj-30", "nosuch", "{}") == MOERL_ERR && has("nosuch") && has("traj-30"), "%s",
          moerl_last_error());
    CHECK(env_submit(e, 0, "traj-31", "calc", "[1]") == MOERL_ERR && has("not a JSON object") && has("traj-31"),
          "%s", moerl_last_error());
    CHECK(env_pending(e) == 0, "pending %d", env_pending(e));
    env_free(e);
    CHECK(children() == 0, "children left: %d", children());
    tool_config_free(&tc);
}

/* A call past the timeout: a tool response, counted; the process is killed and the next call gets
 * a fresh one. A program that dies once: restarted, the call sent again. */
static void test_timeout_and_restart(const char *tmp) {
    tool_config tc;
    CHECK(load_tools(&tc, all_tools, N_TOOLS, CALC_CMD, 0) == MOERL_OK, "%s", moerl_last_error());
    env_config ec = default_config();
    ec.num_workers = 1;
    ec.timeout_s = 3; /* the sleep tool sleeps 60 s; the others answer at once */
    env_client *e = env_create(&tc, &ec);
    CHECK(e != NULL, "create: %s", moerl_last_error());
    if (!e) return;
    env_result r[4] = {0};
    CHECK(env_submit(e, 0, "traj-40", "sleep", "{}") == MOERL_OK, "%s", moerl_last_error());
    CHECK(env_submit(e, 1, "traj-41", "echo", "{\"text\": \"after\"}") == MOERL_OK, "%s", moerl_last_error());
    CHECK(collect(e, r, 2) == MOERL_OK, "%s", moerl_last_error());
    CHECK(r[0].timed_out && !r[0].error && r[0].content && strstr(r[0].content, "Error: the tool 'sleep' timed out") &&
              strstr(r[0].content, "rollout.multi_turn.tool_timeout_s=3"),
          "sleep: '%s'", r[0].content ? r[0].content : "(null)");
    CHECK(r[1].content && !strcmp(r[1].content, "traj-41:after"), "after a timeout: '%s'", r[1].content);
    free_results(r, 2);
    char margs[700];
    snprintf(margs, sizeof margs, "{\"mark\": \"%s/died\"}", tmp);
    CHECK(env_submit(e, 0, "traj-42", "dieonce", margs) == MOERL_OK, "%s", moerl_last_error());
    CHECK(collect(e, r, 1) == MOERL_OK, "dieonce: %s", moerl_last_error());
    CHECK(r[0].content && !strcmp(r[0].content, "traj-42:survived") && !r[0].error, "dieonce: '%s'", r[0].content);
    free_results(r, 1);
    env_stats st;
    env_get_stats(e, &st);
    CHECK(st.calls == 3 && st.timeouts == 1 && st.errors == 0, "stats: calls %ld errors %ld timeouts %ld", st.calls,
          st.errors, st.timeouts);
    /* freed with a call in flight: its process is killed and reaped */
    CHECK(env_submit(e, 0, "traj-43", "sleep", "{}") == MOERL_OK, "%s", moerl_last_error());
    CHECK(env_poll(e, r, 1, 0) == 0 && env_pending(e) == 1, "in flight: pending %d", env_pending(e));
    env_free(e);
    CHECK(children() == 0, "children left: %d", children());
    tool_config_free(&tc);
}

/* A program that dies on every try: the run stops, the message names the tool, the program, the
 * trajectory, the exit and the program's stderr; every later call fails the same way. */
static void test_dies(void) {
    tool_config tc;
    CHECK(load_tools(&tc, all_tools, N_TOOLS, CALC_CMD, 0) == MOERL_OK, "%s", moerl_last_error());
    env_config ec = default_config();
    ec.max_retries = 1;
    env_client *e = env_create(&tc, &ec);
    CHECK(e != NULL, "create: %s", moerl_last_error());
    if (!e) return;
    env_result r[2] = {0};
    CHECK(env_submit(e, 0, "traj-50", "echo", "{}") == MOERL_OK, "%s", moerl_last_error());
    CHECK(collect(e, r, 1) == MOERL_OK, "%s", moerl_last_error());
    free_results(r, 1);
    CHECK(env_submit(e, 0, "traj-51", "die", "{}") == MOERL_OK, "%s", moerl_last_error());
    int rc = collect(e, r, 1);
    CHECK(rc == MOERL_ERR && has("tool 'die' (command '" CALC_CMD "')") && has("trajectory traj-51") &&
              has("exited with status 3") && has("2 attempts") && has("rollout.multi_turn.tool_max_retries=1") &&
              has("dying on purpose"),
          "die: %s", moerl_last_error());
    CHECK(env_poll(e, r, 2, 0) == MOERL_ERR && has("traj-51"), "poll after: %s", moerl_last_error());
    CHECK(env_submit(e, 1, "traj-52", "echo", "{}") == MOERL_ERR && has("traj-51"), "submit after: %s",
          moerl_last_error());
    env_free(e);
    CHECK(children() == 0, "children left: %d", children());
    /* a program that exits with status 0 without answering dies as well; one that writes a line
     * nobody asked for stops the run at once */
    const char *how[2][3] = {{"exit0", "exited with status 0 after 0 answers", "2 attempts"},
                             {"twolines", "a line it was not asked for", "'{\"content\": \"two\"}'"}};
    for (int k = 0; k < 2; k++) {
        e = env_create(&tc, &ec);
        CHECK(e != NULL, "create: %s", moerl_last_error());
        if (!e) continue;
        CHECK(env_submit(e, 0, "traj-54", how[k][0], "{}") == MOERL_OK, "%s", moerl_last_error());
        rc = collect(e, r, 1);
        if (rc == MOERL_OK) free_results(r, 1);
        CHECK(rc == MOERL_ERR && has(how[k][1]) && has(how[k][2]) && has("(command '" CALC_CMD "')") && has("'exit0'"),
              "%s: %s", how[k][0], moerl_last_error());
        env_free(e);
        CHECK(children() == 0, "children left: %d", children());
    }
    /* a program that does not exist (no shell: 'exit' is a shell builtin): env_create names the tool */
    tool_config bad;
    CHECK(load_tools(&bad, all_tools, 1, "exit 7", 0) == MOERL_OK, "%s", moerl_last_error());
    e = env_create(&bad, &ec);
    CHECK(e == NULL && has("tool 'calc' (command 'exit 7')") && has("cannot start 'exit'"),
          "a program that cannot start: %s", e ? "created" : moerl_last_error());
    env_free(e);
    tool_config_free(&bad);
    CHECK(load_tools(&bad, all_tools, 1, "echo a | cat", 0) == MOERL_OK && env_check_tools(&bad) == MOERL_ERR &&
              has("tool 'calc'") && has("shell"),
          "a command line needing a shell is refused: %s", moerl_last_error());
    tool_config_free(&bad);
    /* a program that starts and exits at once (a shell the user asked for) */
    CHECK(load_tools(&bad, all_tools, 1, "sh -c 'exit 7'", 0) == MOERL_OK, "%s", moerl_last_error());
    e = env_create(&bad, &ec);
    CHECK(e != NULL, "create: %s", moerl_last_error());
    if (e) {
        CHECK(env_submit(e, 0, "traj-53", "calc", "{}") == MOERL_OK, "%s", moerl_last_error());
        CHECK(collect(e, r, 1) == MOERL_ERR && has("tool 'calc' (command 'sh -c 'exit 7'')") &&
                  has("exited with status 7") && has("traj-53"),
              "exit 7: %s", moerl_last_error());
        env_free(e);
    }
    CHECK(children() == 0, "children left: %d", children());
    tool_config_free(&bad);
    tool_config_free(&tc);
}

/* The same calls to a server (a tool's url:): answers, done + reward, garbage and a timeout as
 * tool responses; a server that keeps answering 500, answers 400 or refuses the connection stops
 * the run with the tool, the URL and the trajectory named. */
static void test_server(void) {
    char url[128], where[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/tool", server_port);
    const char *names[4] = {"calc", "echo", "garbage", "fail"};
    tool_config tc;
    CHECK(load_tools(&tc, names, 4, url, 1) == MOERL_OK, "%s", moerl_last_error());
    env_config ec = default_config();
    env_client *e = env_create(&tc, &ec);
    CHECK(e != NULL, "create: %s", moerl_last_error());
    if (!e) return;
    env_result r[4] = {0};
    CHECK(env_submit(e, 0, "traj-60", "calc", "{\"expr\": \"99999999*99999999\"}") == MOERL_OK, "%s",
          moerl_last_error());
    CHECK(env_submit(e, 1, "traj-61", "calc", "{\"expr\": \"1+1\", \"finish\": true}") == MOERL_OK, "%s",
          moerl_last_error());
    CHECK(env_submit(e, 2, "traj-62", "garbage", "{}") == MOERL_OK, "%s", moerl_last_error());
    CHECK(env_submit(e, 3, "traj-63", "echo", "{\"text\": \"x\"}") == MOERL_OK, "%s", moerl_last_error());
    CHECK(collect(e, r, 4) == MOERL_OK, "%s", moerl_last_error());
    char want[64];
    snprintf(want, sizeof want, "%lld", 99999999LL * 99999999LL);
    CHECK(r[0].content && !strcmp(r[0].content, want) && !r[0].error, "http calc: '%s'", r[0].content);
    CHECK(r[1].content && !strcmp(r[1].content, "2") && r[1].done && r[1].has_reward && r[1].reward == 1.0,
          "http finish: '%s'", r[1].content);
    CHECK(r[2].error && r[2].content && strstr(r[2].content, "not a JSON object"), "http garbage: '%s'", r[2].content);
    CHECK(r[3].content && !strcmp(r[3].content, "traj-63:x"), "http echo: '%s'", r[3].content);
    free_results(r, 4);
    env_free(e);
    tool_config_free(&tc);

    struct {
        const char *path;
        int max_retries;
        double timeout_s;
        const char *needle[3];
    } fails[] = {{"/always500", 1, 60, {"HTTP 500", "2 attempts", NULL}},
                 {"/bad400", 2, 60, {"HTTP 400", NULL}},
                 {"refused", 1, 60, {"onnect", "2 attempts", NULL}},
                 {"/slow", 0, 2, {NULL}}};
    for (int k = 0; k < 4; k++) {
        if (!strcmp(fails[k].path, "refused")) snprintf(url, sizeof url, "http://127.0.0.1:1/tool");
        else snprintf(url, sizeof url, "http://127.0.0.1:%d%s", server_port, fails[k].path);
        CHECK(load_tools(&tc, names, 1, url, 1) == MOERL_OK, "%s", moerl_last_error());
        ec.max_retries = fails[k].max_retries;
        ec.timeout_s = fails[k].timeout_s;
        e = env_create(&tc, &ec);
        CHECK(e != NULL, "create: %s", moerl_last_error());
        if (!e) continue;
        CHECK(env_submit(e, 0, "traj-70", "calc", "{\"expr\": \"1\"}") == MOERL_OK, "%s", moerl_last_error());
        int rc = collect(e, r, 1);
        snprintf(where, sizeof where, "tool 'calc' (url %s)", url);
        if (fails[k].timeout_s < 60) { /* a timeout: a tool response */
            CHECK(rc == MOERL_OK && r[0].timed_out && r[0].content && strstr(r[0].content, "timed out"), "%s: %s %s",
                  fails[k].path, rc ? moerl_last_error() : "", r[0].content ? r[0].content : "(null)");
            if (rc == MOERL_OK) free_results(r, 1);
        } else {
            CHECK(rc == MOERL_ERR && has(where) && has("trajectory traj-70"), "%s: %s", fails[k].path,
                  moerl_last_error());
            for (int j = 0; fails[k].needle[j]; j++)
                CHECK(has(fails[k].needle[j]), "%s: lacks '%s': %s", fails[k].path, fails[k].needle[j],
                      moerl_last_error());
        }
        env_free(e);
        tool_config_free(&tc);
    }
}

/* The calculator environment docs/multi-turn.md shows users, copied from the page: it answers a
 * call, and a bad expression with an error the model sees. */
static void test_doc_program(const char *tmp) {
    FILE *f = fopen("docs/multi-turn.md", "r");
    CHECK(f != NULL, "docs/multi-turn.md");
    if (!f) return;
    static char doc[1 << 16];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = 0;
    const char *sec = strstr(doc, "## The environment protocol");
    const char *from = sec ? strstr(sec, "```python\n") : NULL;
    const char *to = from ? strstr(from + 10, "\n```") : NULL;
    CHECK(to != NULL, "docs/multi-turn.md: no python block in the environment protocol section");
    if (!to) return;
    char path[600], cmd[700];
    snprintf(path, sizeof path, "%s/doc_env.py", tmp);
    f = fopen(path, "w");
    CHECK(f && fwrite(from + 10, 1, (size_t)(to + 1 - (from + 10)), f) > 0, "%s", path);
    if (f) fclose(f);
    snprintf(cmd, sizeof cmd, "python3 %s", path);
    tool_config tc;
    CHECK(load_tools(&tc, all_tools, 1, cmd, 0) == MOERL_OK, "%s", moerl_last_error());
    env_config ec = default_config();
    env_client *e = env_create(&tc, &ec);
    CHECK(e != NULL, "create: %s", moerl_last_error());
    if (!e) return;
    env_result r[2] = {0};
    CHECK(env_submit(e, 0, "traj-80", "calc", "{\"expr\": \"-12345678901*3+1\"}") == MOERL_OK, "%s",
          moerl_last_error());
    CHECK(env_submit(e, 1, "traj-81", "calc", "{\"expr\": \"2**10\"}") == MOERL_OK, "%s", moerl_last_error());
    CHECK(collect(e, r, 2) == MOERL_OK, "%s", moerl_last_error());
    char want[64];
    snprintf(want, sizeof want, "%lld", -12345678901LL * 3 + 1);
    CHECK(r[0].content && !strcmp(r[0].content, want) && !r[0].error, "doc calc: '%s' want '%s'", r[0].content, want);
    CHECK(r[1].error && r[1].content &&
              !strcmp(r[1].content, "Error: ValueError: only integers and + - * are supported"),
          "doc error: '%s'", r[1].content);
    free_results(r, 2);
    env_free(e);
    CHECK(children() == 0, "children left: %d", children());
    tool_config_free(&tc);
}

static int start_server(void) {
    server_pipe = popen("exec python3 tests/tools/env_server.py", "r");
    if (!server_pipe || fscanf(server_pipe, "%d %d", &server_port, (int *)&server_pid) != 2) return MOERL_ERR;
    return MOERL_OK;
}

int main(void) {
    /* "python3" as tests/run.sh's: Debian's, not a version manager's shim on PATH (seconds per start) */
    if (access("/usr/bin/python3", X_OK) == 0) {
        const char *path = getenv("PATH");
        char *p = malloc(strlen(path ? path : "") + 16);
        sprintf(p, "/usr/bin:%s", path ? path : "");
        setenv("PATH", p, 1);
        free(p);
    }
    setenv("no_proxy", "127.0.0.1,localhost", 1);
    setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    log_set_level(LOG_ERROR); /* the retries' and timeouts' warnings */
    char tmp[] = "/tmp/moerl-test-env-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    test_config();
    test_program(tmp);
    test_timeout_and_restart(tmp);
    test_dies();
    test_doc_program(tmp);
    if (start_server() == MOERL_OK) {
        test_server();
        kill(server_pid, SIGTERM);
        pclose(server_pipe);
    } else
        CHECK(0, "cannot start tests/tools/env_server.py");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0, "rm");
    TEST_MAIN_END();
}
