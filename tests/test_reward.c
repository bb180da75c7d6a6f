/* Reward backends from outside moerl (src/reward/): the reward.* keys and their checks; the verl
 * adapter on a verl-style reward file (tests/reward/verl_reward.py); reward programs in Python and
 * shell (tests/reward/cmd_reward.py, cmd_reward.sh); an HTTP reward server on the loopback
 * interface (tests/reward/server.py); and every failure mode: crash, crash then recovery, hang
 * past the timeout, garbage, NaN, wrong count, missing function, import error, a program that does
 * not exist, HTTP 500 then 200, always 500, a closed connection, a wrong length, 4xx. The expected
 * scores are the Python reward code's own (the reference is the program itself: the backend must
 * pass its answers through unchanged, so the comparisons are exact). Messages must name the
 * program or URL and the row. Needs python3 (as tests/ref/ does). Runs from the repository root. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "base/config.h"
#include "base/log.h"
#include "reward/reward.h"
#include "reward/reward_internal.h"
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

/* Processes whose command line has `arg` as an argument (e.g. a grandchild "sleep 1234.5"). A
 * process killed but not yet reaped by its new parent (init) still shows: wait for it to go. */
static int count_procs(const char *arg) {
    for (int tries = 0;; tries++) {
        DIR *d = opendir("/proc");
        int n = 0;
        struct dirent *e;
        while (d && (e = readdir(d))) {
            int pid = atoi(e->d_name);
            if (pid <= 0) continue;
            char p[64], buf[512];
            snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
            FILE *f = fopen(p, "r");
            if (!f) continue;
            size_t k = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            for (size_t i = 0; i < k;) {
                if (!strcmp(buf + i, arg)) n++;
                i += strlen(buf + i) + 1;
            }
        }
        if (d) closedir(d);
        if (n == 0 || tries == 100) return n;
        struct timespec t = {0, 20000000};
        nanosleep(&t, NULL);
    }
}

static reward_config base_config(reward_kind kind, int workers, double timeout_s, int retries) {
    reward_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    snprintf(c.python, sizeof c.python, "python3");
    snprintf(c.function_name, sizeof c.function_name, "compute_score");
    c.num_workers = workers;
    c.max_concurrency = 2;
    c.batch_size = 3;
    c.timeout_s = timeout_s;
    c.max_retries = retries;
    return c;
}

static reward_config cmd_config(const char *cmd, int workers, double timeout_s, int retries) {
    reward_config c = base_config(REWARD_COMMAND, workers, timeout_s, retries);
    snprintf(c.command, sizeof c.command, "%s", cmd);
    return c;
}

static reward_config fn_config(const char *path, const char *name, int workers) {
    reward_config c = base_config(REWARD_FUNCTION, workers, 30, 1);
    snprintf(c.function_path, sizeof c.function_path, "%s", path);
    snprintf(c.function_name, sizeof c.function_name, "%s", name);
    return c;
}

static reward_config url_config(const char *path, double timeout_s, int retries) {
    reward_config c = base_config(REWARD_URL, 1, timeout_s, retries);
    snprintf(c.url, sizeof c.url, "http://127.0.0.1:%d%s", server_port, path);
    return c;
}

/* n requests: row "rows.jsonl:<i+1>", data_source ds, solution "answer <i>" ("answer 1" for i = 1
 * matches ground truth "1" only by containing it), ground truth "<i % 3>". */
typedef struct {
    reward_request r[16];
    char sol[16][64], gt[16][16], where[16][32];
} reqset;

static void make_reqs(reqset *s, int n, const char *ds) {
    for (int i = 0; i < n; i++) {
        snprintf(s->sol[i], sizeof s->sol[i], "the answer is %d", i);
        snprintf(s->gt[i], sizeof s->gt[i], "%d", i % 3);
        snprintf(s->where[i], sizeof s->where[i], "rows.jsonl:%d", i + 1);
        s->r[i] = (reward_request){.data_source = ds, .solution_str = s->sol[i], .ground_truth = s->gt[i],
                                   .where = s->where[i]};
    }
}

static double extra(const reward_result *r, const char *key) {
    for (int k = 0; k < r->n_extra; k++)
        if (!strcmp(r->extra_keys[k], key)) return r->extra_vals[k];
    return -999;
}

static int has(const char *needle) { return strstr(moerl_last_error(), needle) != NULL; }

/* Score n requests of `ds` with c; returns the score call's status (the backend is freed). A
 * failed create counts as MOERL_ERR. Results go to out (cleared by the caller). */
static int score_with(reward_config c, reqset *s, int n, reward_result *out) {
    memset(out, 0, (size_t)n * sizeof *out);
    reward_backend *b = reward_backend_create(&c);
    if (!b) return MOERL_ERR;
    int rc = b->score(b, s->r, n, out);
    b->free(b);
    return rc;
}

/* A failure case: the call must fail and the message name each of the needles. */
static void expect_fail(const char *what, reward_config c, const char *ds, int n, const char *const *needles) {
    reqset s;
    reward_result out[16];
    make_reqs(&s, n, ds);
    int rc = score_with(c, &s, n, out);
    CHECK(rc == MOERL_ERR, "%s: expected an error", what);
    for (int i = 0; needles[i]; i++) CHECK(has(needles[i]), "%s: message lacks '%s': %s", what, needles[i], moerl_last_error());
    CHECK(children() == 0, "%s: %d child processes left after free", what, children());
    reward_results_clear(out, n);
}

static void test_config(void) {
    cfg *c = cfg_new();
    reward_def_keys(c);
    reward_config r;
    CHECK(reward_read_config(c, &r) == MOERL_OK, "defaults: %s", moerl_last_error());
    CHECK(r.kind == REWARD_BUILTIN && r.num_workers == 4 && r.max_retries == 2 && r.timeout_s == 60 &&
              !strcmp(r.function_name, "compute_score") && !strcmp(r.python, "python3"),
          "defaults");
    static const struct {
        const char *set[2], *needle[3];
    } bad[] = {
        {{"reward.command=x", "reward.url=http://h/"}, {"reward.command", "reward.url", "both set"}},
        {{"reward.custom_reward_function.path=no/such.py", NULL}, {"reward.custom_reward_function.path", "no/such.py", "No such file"}},
        {{"reward.custom_reward_function.path=tests/reward", NULL}, {"'tests/reward' is not a file", NULL}},
        {{"reward.custom_reward_function.path=tests/reward/verl_reward.py", "reward.custom_reward_function.name=1x"},
         {"not a Python function name", NULL}},
        {{"reward.num_workers=0", NULL}, {"reward.num_workers", "override", "0 is not a count"}},
        {{"reward.url=http://h/", "reward.batch_size=-2"}, {"reward.batch_size", "-2 is not a count", NULL}},
        {{"reward.url=http://h/", "reward.max_concurrency=0"}, {"reward.max_concurrency", "0 is not a count", NULL}},
        {{"reward.command=x", "reward.max_retries=-1"}, {"reward.max_retries", "-1 is not from 0", NULL}},
        {{"reward.command=x", "reward.timeout_s=0"}, {"reward.timeout_s", "finite number of seconds > 0", NULL}},
        {{"reward.command=x", "reward.timeout_s=inf"}, {"reward.timeout_s", "inf is not a finite", NULL}},
        {{"reward.command=python3 'unclosed", NULL}, {"reward.command", "unbalanced quotes", NULL}},
        {{"reward.command=a | b", NULL}, {"reward.command", "without a shell", NULL}},
        {{"reward.command=run $(x)", NULL}, {"reward.command", NULL}},
        {{"reward.url=ftp://h/x", NULL}, {"reward.url", "not an http", NULL}},
        /* a key the chosen source does not read is refused, not ignored */
        {{"reward.num_workers=2", NULL}, {"reward.num_workers (from override) is not used by the built-in rewards", NULL}},
        {{"reward.url=http://h/", "reward.num_workers=2"}, {"reward.num_workers", "not used by reward.url", NULL}},
        {{"reward.command=x", "reward.batch_size=2"}, {"reward.batch_size", "not used by reward.command", NULL}},
        {{"reward.command=x", "reward.python=python3.11"}, {"reward.python", "not used by reward.command", NULL}},
        {{"reward.url=http://h/", "reward.custom_reward_function.name=f"}, {"reward.custom_reward_function.name", NULL}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg *d = cfg_new();
        reward_def_keys(d);
        for (int k = 0; k < 2 && bad[i].set[k]; k++)
            CHECK(cfg_apply_override(d, bad[i].set[k]) == MOERL_OK, "override %s: %s", bad[i].set[k], moerl_last_error());
        CHECK(reward_read_config(d, &r) == MOERL_ERR, "bad config %zu (%s) accepted", i, bad[i].set[0]);
        for (int k = 0; k < 3 && bad[i].needle[k]; k++)
            CHECK(has(bad[i].needle[k]), "bad config %zu: message lacks '%s': %s", i, bad[i].needle[k], moerl_last_error());
        cfg_free(d);
    }
    static const char *good[][3] = {{"reward.custom_reward_function.path=tests/reward/verl_reward.py", "F",
                                     "reward.python=python3"},
                                    {"reward.command=python3 tests/reward/cmd_reward.py 'ok'", "C", "reward.num_workers=2"},
                                    {"reward.url=http://127.0.0.1:1/score", "U", "reward.batch_size=4"}};
    for (int i = 0; i < 3; i++) {
        cfg *d = cfg_new();
        reward_def_keys(d);
        CHECK(cfg_apply_override(d, good[i][0]) == MOERL_OK, "%s", moerl_last_error());
        CHECK(cfg_apply_override(d, good[i][2]) == MOERL_OK, "%s", moerl_last_error());
        CHECK(cfg_apply_override(d, "reward.timeout_s=5") == MOERL_OK, "%s", moerl_last_error());
        CHECK(reward_read_config(d, &r) == MOERL_OK, "%s: %s", good[i][0], moerl_last_error());
        reward_kind want = good[i][1][0] == 'F' ? REWARD_FUNCTION : good[i][1][0] == 'C' ? REWARD_COMMAND : REWARD_URL;
        CHECK(r.kind == want, "%s: kind %d", good[i][0], (int)r.kind);
        cfg_free(d);
    }
    cfg_free(c);
    /* verl's nesting in a config file; errors name the file and line */
    static const char yaml[] = "reward:\n  custom_reward_function:\n    path: tests/reward/verl_reward.py\n"
                               "    name: other_score\n  num_workers: 3\n  timeout_s: 0.5\n";
    cfg *y = cfg_new();
    reward_def_keys(y);
    CHECK(cfg_load_yaml_string(y, yaml, strlen(yaml), "run.yaml") == MOERL_OK, "%s", moerl_last_error());
    CHECK(reward_read_config(y, &r) == MOERL_OK && r.kind == REWARD_FUNCTION && !strcmp(r.function_name, "other_score") &&
              r.num_workers == 3 && r.timeout_s == 0.5,
          "YAML: %s", moerl_last_error());
    CHECK(cfg_apply_override(y, "reward.url=http://h/") == MOERL_OK, "%s", moerl_last_error());
    CHECK(reward_read_config(y, &r) == MOERL_ERR && has("reward.custom_reward_function.path (from run.yaml:3)") &&
              has("reward.url (from override)"),
          "two sources: %s", moerl_last_error());
    cfg_free(y);
}

static void test_request_json(void) {
    reward_request q = {.data_source = "d", .solution_str = "bad \xff byte", .ground_truth = "{\"target\": 3}",
                        .ground_truth_json = 1, .extra_info_json = "{\"weight\": 2}", .prompt_json = NULL,
                        .where = "rows.jsonl:9"};
    json_t *j = reward_request_json(&q);
    CHECK(j != NULL, "%s", moerl_last_error());
    if (j) {
        char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
        CHECK(!strcmp(s, "{\"data_source\":\"d\",\"extra_info\":{\"weight\":2},\"ground_truth\":{\"target\":3},"
                         "\"prompt\":null,\"solution_str\":\"bad \xef\xbf\xbd byte\"}"),
              "request JSON: %s", s);
        free(s);
        json_decref(j);
    }
    q.extra_info_json = "[1]";
    CHECK(reward_request_json(&q) == NULL && has("rows.jsonl:9") && has("extra_info"), "%s", moerl_last_error());
    q.extra_info_json = NULL;
    q.prompt_json = "{not json";
    CHECK(reward_request_json(&q) == NULL && has("rows.jsonl:9") && has("prompt"), "%s", moerl_last_error());
    reward_result r;
    CHECK(reward_parse_answer_text("true", 4, &r) == MOERL_ERR && has("neither a number"), "%s", moerl_last_error());
    CHECK(reward_parse_answer_text("{\"score\": 1e999}", 16, &r) == MOERL_ERR, "overflow accepted");
    CHECK(reward_parse_answer_text("{\"score\": 2, \"ok\": true, \"pred\": \"x\", \"note\": \"s\"}", 50, &r) == MOERL_OK &&
              r.score == 2 && r.n_extra == 1 && extra(&r, "ok") == 1 && r.pred && !strcmp(r.pred, "x"),
          "object answer: %s", moerl_last_error());
    reward_results_clear(&r, 1);
}

static void test_builtin(void) {
    reward_config c = base_config(REWARD_BUILTIN, 1, 1, 0);
    reward_request q[2] = {{.data_source = "arith", .solution_str = "so 12", .ground_truth = "12", .where = "a:1"},
                           {.data_source = "arith", .solution_str = "so 13", .ground_truth = "12", .where = "a:2"}};
    reward_result out[2] = {{0}};
    reward_backend *b = reward_backend_create(&c);
    CHECK(b && b->score(b, q, 2, out) == MOERL_OK && out[0].score == 1 && out[1].score == 0, "built-in: %s",
          moerl_last_error());
    reward_results_clear(out, 2);
    if (b) b->free(b);
}

static void test_function(void) {
    reqset s;
    reward_result out[16];
    make_reqs(&s, 9, "plain");
    for (int i = 3; i < 6; i++) s.r[i].data_source = "rich";
    s.r[6].data_source = "noisy";
    s.r[7].data_source = "extra";
    s.r[7].ground_truth = "{\"target\": 4}";
    s.r[7].ground_truth_json = 1;
    s.r[7].extra_info_json = "{\"weight\": 0.5}";
    s.r[5].solution_str = "la réponse est 答"; /* UTF-8 both ways, whatever the locale */
    int rc = score_with(fn_config("tests/reward/verl_reward.py", "compute_score", 2), &s, 9, out);
    CHECK(rc == MOERL_OK, "verl file: %s", moerl_last_error());
    if (rc == MOERL_OK) {
        /* plain: ground truth i%3 in "the answer is i" */
        for (int i = 0; i < 3; i++) CHECK(out[i].score == (i == i % 3 ? 1.0 : 0.0) && out[i].n_extra == 0, "plain %d", i);
        /* rich: last word "i" == "i%3"? rows 3, 4, 5 → gt 0, 1, 2: never equal → -0.5, acc 0 */
        for (int i = 3; i < 6; i++) {
            char want[8];
            snprintf(want, sizeof want, "%s", i == 5 ? "答" : (char[2]){(char)('0' + i), 0});
            /* length: Python's len, in characters: "la réponse est 答" has 16 */
            CHECK(out[i].score == -0.5 && extra(&out[i], "acc") == 0 && extra(&out[i], "length") == (i == 5 ? 16 : 15) &&
                      out[i].pred && !strcmp(out[i].pred, want),
                  "rich %d: score %g", i, out[i].score);
        }
        CHECK(out[6].score == 0.25, "noisy: %g (its print must not become an answer)", out[6].score);
        CHECK(out[7].score == 2.0, "extra: %g", out[7].score);
        CHECK(out[8].score == 0.0, "plain 8 (gt 2 not in 'the answer is 8'): %g", out[8].score);
    }
    reward_results_clear(out, 9);
    CHECK(score_with(fn_config("tests/reward/verl_reward.py", "other_score", 1), &s, 2, out) == MOERL_OK &&
              out[0].score == 7 && out[1].score == 7,
          "other_score: %s", moerl_last_error());
    reward_results_clear(out, 2);
    CHECK(children() == 0, "children left: %d", children());
    expect_fail("function NaN", fn_config("tests/reward/verl_reward.py", "compute_score", 1), "nan", 3,
                (const char *[]){"verl_reward.py", "rows.jsonl:1", "not finite", NULL});
    expect_fail("function raises", fn_config("tests/reward/verl_reward.py", "compute_score", 1), "boom", 1,
                (const char *[]){"verl_reward.py", "rows.jsonl:1", "ValueError: cannot score this row", NULL});
    expect_fail("missing function", fn_config("tests/reward/verl_reward.py", "nope", 2), "plain", 1,
                (const char *[]){"verl_reward.py", "nope", "defines no function 'nope'", "compute_score, other_score",
                                 NULL});
    expect_fail("import error", fn_config("tests/reward/broken_reward.py", "compute_score", 1), "plain", 1,
                (const char *[]){"broken_reward.py", "a_module_that_does_not_exist", "before it was ready",
                                 /* the traceback's lines on lines of their own, indented */
                                 "its stderr ends:\n", "\n    Traceback (most recent call last):",
                                 "\n    ModuleNotFoundError: No module named 'a_module_that_does_not_exist'", NULL});
    CHECK(!has("\\n"), "import error: a literal \\n in %s", moerl_last_error());
    reward_config nopy = fn_config("tests/reward/verl_reward.py", "compute_score", 1);
    snprintf(nopy.python, sizeof nopy.python, "no-such-python-3");
    expect_fail("no interpreter", nopy, "plain", 1, (const char *[]){"cannot start 'no-such-python-3'", NULL});
}

/* The "ok" answers of cmd_reward.py and server.py: 1 when the ground truth is in the solution. */
static void check_ok(const char *what, const reqset *s, const reward_result *out, int n, const char *len_key) {
    for (int i = 0; i < n; i++) {
        double want = strstr(s->sol[i], s->gt[i]) ? 1.0 : 0.0;
        char last[16];
        snprintf(last, sizeof last, "%d", i);
        CHECK(out[i].score == want && out[i].pred && !strcmp(out[i].pred, last), "%s: row %d: score %g want %g", what,
              i, out[i].score, want);
        if (len_key) CHECK(extra(&out[i], len_key) == (double)strlen(s->sol[i]), "%s: row %d: %s", what, i, len_key);
    }
}

static void *cancel_later(void *arg) {
    reward_backend *b = arg;
    struct timespec t = {0, 300000000}; /* ordering only: a cancel before score starts fails it the same way */
    nanosleep(&t, NULL);
    b->cancel(b);
    return NULL;
}

static void test_command(const char *tmp) {
    reqset s;
    reward_result out[16];
    make_reqs(&s, 11, "plain");
    int rc = score_with(cmd_config("python3 tests/reward/cmd_reward.py ok", 3, 30, 0), &s, 11, out);
    CHECK(rc == MOERL_OK, "command ok: %s", moerl_last_error());
    if (rc == MOERL_OK) check_ok("command ok", &s, out, 11, "len");
    reward_results_clear(out, 11);
    /* a request far larger than a pipe's buffer (written in pieces as the program reads) */
    {
        size_t big = 3u << 20;
        char *sol = malloc(big + 1);
        memset(sol, 'x', big);
        memcpy(sol + big - 4, " 1 0", 4);
        sol[big] = 0;
        reqset b;
        make_reqs(&b, 2, "plain");
        b.r[1].solution_str = sol;
        rc = score_with(cmd_config("python3 tests/reward/cmd_reward.py ok", 1, 60, 0), &b, 2, out);
        CHECK(rc == MOERL_OK && extra(&out[1], "len") == (double)big && out[1].score == 1 && out[0].score == 1,
              "3 MiB request: %s", moerl_last_error());
        reward_results_clear(out, 2);
        free(sol);
    }
    /* shell, with a quoted argument holding a space: args = 2 */
    s.r[2].solution_str = "yes";
    rc = score_with(cmd_config("sh tests/reward/cmd_reward.sh yes 'two words'", 2, 30, 0), &s, 4, out);
    CHECK(rc == MOERL_OK && out[2].score == 1 && out[0].score == 0 && out[3].score == 0 && extra(&out[1], "args") == 2,
          "shell command: %s", moerl_last_error());
    reward_results_clear(out, 4);
    s.r[2].solution_str = s.sol[2];
    /* crash (or hang) at the first request, then fine: cured by one retry */
    static const char *once[] = {"crash_once", "hang_once"};
    for (int k = 0; k < 2; k++) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "python3 tests/reward/cmd_reward.py %s %s/%s.state", once[k], tmp, once[k]);
        /* timeout 2 s: a hang is cut after 2 s; a fresh Python answers in well under that */
        rc = score_with(cmd_config(cmd, 1, k ? 2.0 : 30, 1), &s, 3, out);
        CHECK(rc == MOERL_OK, "%s with a retry: %s", once[k], moerl_last_error());
        if (rc == MOERL_OK) check_ok(once[k], &s, out, 3, NULL);
        reward_results_clear(out, 3);
    }
    CHECK(children() == 0, "children left: %d", children());
#define CMD "python3 tests/reward/cmd_reward.py "
    expect_fail("crash", cmd_config(CMD "crash", 2, 30, 2), "plain", 2,
                (const char *[]){"reward.command '" CMD "crash'", "rows.jsonl:", "exited with status 3", "3 attempts",
                                 "crashing on purpose at plain", NULL});
    /* a crash while a child of its own keeps stderr open: the exit status is read at once, the child killed */
    expect_fail("crash with a child", cmd_config("sh -c 'sleep 1234.7 & read x; echo dying >&2; exit 5'", 1, 1000, 0),
                "plain", 1, (const char *[]){"rows.jsonl:1", "exited with status 5", "dying", NULL});
    CHECK(count_procs("1234.7") == 0, "the crashed program's child survived");
    expect_fail("segv", cmd_config(CMD "segv", 1, 30, 0), "plain", 1,
                (const char *[]){CMD "segv", "rows.jsonl:1", "killed by signal 11", NULL});
    expect_fail("hang", cmd_config(CMD "hang", 2, 1.0, 1), "plain", 3,
                (const char *[]){CMD "hang", "rows.jsonl:", "no answer within reward.timeout_s=1s", "2 attempts",
                                 "cmd_reward: hanging", NULL});
    /* a hung shell program with a child of its own: the whole process group is killed */
    expect_fail("hang with a grandchild", cmd_config("sh -c 'sleep 1234.5 & read x; wait'", 1, 1.0, 0), "plain", 1,
                (const char *[]){"sh -c", "rows.jsonl:1", "no answer within reward.timeout_s=1s", NULL});
    CHECK(count_procs("1234.5") == 0, "the program's own child survived the kill");
    /* a program that closes its stdout and keeps running: killed once reward.timeout_s has passed */
    expect_fail("stdout closed", cmd_config("sh -c 'exec 1>&-; sleep 1234.6'", 1, 1.0, 0), "plain", 1,
                (const char *[]){"rows.jsonl:1", "closed its stdin or stdout and did not exit", NULL});
    CHECK(count_procs("1234.6") == 0, "the program that closed its stdout survived");
    expect_fail("garbage", cmd_config(CMD "garbage", 1, 30, 2), "plain", 2,
                (const char *[]){CMD "garbage", "rows.jsonl:1", "not JSON", "this is not json", NULL});
    /* a start-up banner on stdout: named as output before the first request, diagnostics belong on stderr.
     * Whether the pool reads the banner before writing the first request ("a line it was not asked for") or as
     * its answer ("rows.jsonl:1 ... not JSON") is timing (ASan's slower start gives the first), so only what both
     * messages say is checked. */
    expect_fail("banner", cmd_config("sh -c 'echo Loading model...; while read x; do echo 1; done'", 1, 30, 0),
                "plain", 1,
                (const char *[]){"Loading model...", "output before the first request", "print diagnostics to stderr",
                                 NULL});
    expect_fail("nan", cmd_config(CMD "nan", 1, 30, 2), "plain", 1,
                (const char *[]){CMD "nan", "rows.jsonl:1", "not finite", NULL});
    CHECK(!has("start-up banner"), "a NaN score blamed on a banner: %s", moerl_last_error());
    expect_fail("no score", cmd_config(CMD "notscore", 1, 30, 2), "plain", 1,
                (const char *[]){CMD "notscore", "rows.jsonl:1", "has no \"score\"", NULL});
    /* a first answer that is JSON but wrong is the answer's own error, not a banner */
    CHECK(!has("start-up banner"), "a JSON answer without a score blamed on a banner: %s", moerl_last_error());
    expect_fail("string", cmd_config(CMD "string", 1, 30, 2), "plain", 1,
                (const char *[]){CMD "string", "neither a number nor an object", NULL});
    expect_fail("two lines", cmd_config(CMD "two", 1, 30, 2), "plain", 1,
                (const char *[]){CMD "two", "a line it was not asked for", NULL});
    expect_fail("exit 0", cmd_config(CMD "exit0", 1, 30, 2), "plain", 2,
                (const char *[]){CMD "exit0", "rows.jsonl:1", "exited with status 0", "must answer every request", NULL});
    expect_fail("error answer", cmd_config(CMD "error", 1, 30, 2), "plain", 1,
                (const char *[]){CMD "error", "rows.jsonl:1", "no verifier for this row", NULL});
    /* stdin closed: the write gets EPIPE (SIGPIPE must not kill the test) or the exit shows first */
    expect_fail("stdin closed", cmd_config(CMD "closein", 1, 30, 0), "plain", 1,
                (const char *[]){CMD "closein", "rows.jsonl:1", "exited with status 4", "closed stdin", NULL});
    /* a 3 MiB request to a program that closes its stdin without reading: the write meets EPIPE */
    {
        size_t big = 3u << 20;
        char *sol = malloc(big + 1);
        memset(sol, 'x', big);
        sol[big] = 0;
        reqset b;
        make_reqs(&b, 1, "plain");
        b.r[0].solution_str = sol;
        reward_result o1 = {0};
        rc = score_with(cmd_config(CMD "closein", 1, 30, 0), &b, 1, &o1);
        CHECK(rc == MOERL_ERR && has("exited with status 4") && has("closed stdin") && has("rows.jsonl:1"),
              "EPIPE: %s", moerl_last_error());
        free(sol);
    }
    expect_fail("no program", cmd_config("no-such-reward-program --x", 2, 30, 2), "plain", 1,
                (const char *[]){"reward.command 'no-such-reward-program --x'", "cannot start", NULL});
    /* cancel from another thread while a request hangs */
    reward_backend *b = reward_backend_create(&(reward_config){0});
    b->free(b);
    reward_config hc = cmd_config(CMD "hang", 1, 1000, 0);
    b = reward_backend_create(&hc);
    CHECK(b != NULL, "%s", moerl_last_error());
    if (b) {
        pthread_t th;
        pthread_create(&th, NULL, cancel_later, b);
        memset(out, 0, sizeof out);
        CHECK(b->score(b, s.r, 1, out) == MOERL_ERR && has("cancelled"), "cancel: %s", moerl_last_error());
        pthread_join(th, NULL);
        b->free(b);
    }
    CHECK(children() == 0, "children left after cancel: %d", children());
#undef CMD
}

static void test_http(void) {
    reqset s;
    reward_result out[16];
    make_reqs(&s, 7, "plain");
    int rc = score_with(url_config("/ok", 30, 0), &s, 7, out);
    CHECK(rc == MOERL_OK, "server ok: %s", moerl_last_error());
    if (rc == MOERL_OK) {
        check_ok("server ok", &s, out, 7, NULL);
        for (int i = 0; i < 7; i++) /* reward.batch_size = 3: POSTs of 3, 3, 1 */
            CHECK(extra(&out[i], "batch") == (i < 6 ? 3 : 1) && extra(&out[i], "acc") == out[i].score, "batch of row %d",
                  i);
    }
    reward_results_clear(out, 7);
    /* reward.max_concurrency = 2: the server never has more than 2 POSTs in progress */
    make_reqs(&s, 16, "plain");
    rc = score_with(url_config("/conc", 30, 0), &s, 16, out);
    CHECK(rc == MOERL_OK, "concurrency: %s", moerl_last_error());
    for (int i = 0; i < 16 && rc == MOERL_OK; i++)
        CHECK(extra(&out[i], "inflight") >= 1 && extra(&out[i], "inflight") <= 2, "row %d: %g POSTs in progress", i,
              extra(&out[i], "inflight"));
    if (rc == MOERL_OK) check_ok("concurrency", &s, out, 16, NULL);
    reward_results_clear(out, 16);
    make_reqs(&s, 7, "plain");
    /* a POST of 3 MiB (curl would otherwise wait on "Expect: 100-continue") */
    {
        size_t big = 3u << 20;
        char *sol = malloc(big + 1);
        memset(sol, 'y', big);
        memcpy(sol + big - 2, " 0", 2);
        sol[big] = 0;
        reqset b;
        make_reqs(&b, 2, "plain");
        b.r[0].solution_str = sol;
        rc = score_with(url_config("/ok", 60, 0), &b, 2, out);
        CHECK(rc == MOERL_OK && out[0].score == 1 && out[0].pred && !strcmp(out[0].pred, "0") && out[1].score == 1,
              "3 MiB POST: %s", moerl_last_error());
        reward_results_clear(out, 2);
        free(sol);
    }
    static const char *cured[] = {"/flaky/a", "/closeonce/a"};
    for (int k = 0; k < 2; k++) {
        rc = score_with(url_config(cured[k], 30, 1), &s, 4, out);
        CHECK(rc == MOERL_OK, "%s with a retry: %s", cured[k], moerl_last_error());
        if (rc == MOERL_OK) check_ok(cured[k], &s, out, 4, NULL);
        reward_results_clear(out, 4);
    }
    char url[300];
    snprintf(url, sizeof url, "reward.url http://127.0.0.1:%d", server_port);
    expect_fail("always 500", url_config("/always500", 30, 1), "plain", 4,
                (const char *[]){url, "/always500", "from row rows.jsonl:", "HTTP 500", "internal error (always)",
                                 "2 attempts", NULL});
    expect_fail("closed", url_config("/close", 30, 0), "plain", 2,
                (const char *[]){"/close", "from row rows.jsonl:1", "Server returned nothing", NULL});
    expect_fail("wrong length", url_config("/wronglen", 30, 2), "plain", 2,
                (const char *[]){"/wronglen", "from row rows.jsonl:1", "1 answers for 2 requests", NULL});
    expect_fail("NaN", url_config("/nan", 30, 2), "plain", 2, (const char *[]){"/nan", "rows.jsonl:1", "NaN", NULL});
    expect_fail("400", url_config("/bad400", 30, 2), "plain", 2,
                (const char *[]){"/bad400", "rows.jsonl:1", "HTTP 400", "missing field", NULL});
    expect_fail("not JSON", url_config("/notjson", 30, 2), "plain", 1,
                (const char *[]){"/notjson", "not a JSON list", "<html>hello", NULL});
    expect_fail("timeout", url_config("/slow", 1.0, 0), "plain", 1,
                (const char *[]){"/slow", "rows.jsonl:1", "no answer within reward.timeout_s=1s", NULL});
    /* cancel from another thread while a POST waits */
    reward_config sc = url_config("/slow", 1000, 0);
    reward_backend *b = reward_backend_create(&sc);
    CHECK(b != NULL, "%s", moerl_last_error());
    if (b) {
        pthread_t th;
        pthread_create(&th, NULL, cancel_later, b);
        memset(out, 0, sizeof out);
        CHECK(b->score(b, s.r, 2, out) == MOERL_ERR && has("cancelled") && has("/slow"), "http cancel: %s",
              moerl_last_error());
        pthread_join(th, NULL);
        b->free(b);
    }
    reward_config refused = url_config("/ok", 30, 1);
    snprintf(refused.url, sizeof refused.url, "http://127.0.0.1:1/score");
    expect_fail("refused", refused, "plain", 1,
                (const char *[]){"reward.url http://127.0.0.1:1/score", "rows.jsonl:1", "connect", "2 attempts", NULL});
}

static int start_server(void) {
    server_pipe = popen("exec python3 tests/reward/server.py", "r");
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
    log_set_level(LOG_ERROR); /* the retries' warnings */
    char tmp[] = "/tmp/moerl-test-reward-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    test_config();
    test_request_json();
    test_builtin();
    test_function();
    test_command(tmp);
    if (start_server() == MOERL_OK) {
        test_http();
        kill(server_pid, SIGTERM);
        pclose(server_pipe);
    } else
        CHECK(0, "cannot start tests/reward/server.py");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0, "rm");
    TEST_MAIN_END();
}
