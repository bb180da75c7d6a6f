/* Tests for base/config (typed registry, YAML, overrides, dump round trip) and base/log
 * (log lines, JSONL metrics, progress bar). No numeric tolerances: every comparison is exact. */
#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/config.h"
#include "base/log.h"
#include "base/tb_events.h"
#include "test.h"

static char g_dir[256];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    fputs(text, f);
    fclose(f);
}

/* Load YAML text written to a file named `name` in the temp dir. */
static int load_text(cfg *c, const char *name, const char *text) {
    char p[512];
    path_in(p, sizeof p, name);
    write_text(p, text);
    return cfg_load_yaml(c, p);
}

static bool has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* events.out.tfevents.* files directly in dir. */
static int count_event_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, "events.out.tfevents.", 20) == 0;
    closedir(d);
    return n;
}

static cfg *make_cfg(void) {
    cfg *c = cfg_new();
    cfg_def_int(c, "actor.ppo_mini_batch_size", 4, "prompts per mini-batch");
    cfg_def_float(c, "actor.optim.lr", 1e-6, "learning rate");
    cfg_def_float(c, "actor.clip_ratio_low", 0.2, "PPO clip epsilon below 1");
    cfg_def_bool(c, "actor.use_kl_loss", false, "add a KL penalty to the loss");
    cfg_def_int(c, "rollout.n", 4, "responses per prompt");
    cfg_def_str(c, "model.path", "", "Hugging Face checkpoint folder");
    int64_t dev[1] = {0};
    cfg_def_int_list(c, "trainer.devices", dev, 1, "device ids");
    cfg_def_float(c, "async_training.staleness_threshold", 0.0, "extra fraction of stale samples allowed");
    cfg_def_int_list(c, "empty.list", NULL, 0, "starts empty");
    return c;
}

static void test_defaults(void) {
    cfg *c = make_cfg();
    CHECK(cfg_int(c, "actor.ppo_mini_batch_size") == 4, "default int");
    CHECK(cfg_float(c, "actor.optim.lr") == 1e-6, "default float");
    CHECK(cfg_bool(c, "actor.use_kl_loss") == false, "default bool");
    CHECK(strcmp(cfg_str(c, "model.path"), "") == 0, "default str");
    int n = -1;
    const int64_t *v = cfg_int_list(c, "trainer.devices", &n);
    CHECK(n == 1 && v && v[0] == 0, "default list n=%d", n);
    v = cfg_int_list(c, "empty.list", &n);
    CHECK(n == 0 && v == NULL, "empty list n=%d", n);
    CHECK(strcmp(cfg_origin(c, "rollout.n"), "default") == 0, "origin default");
    CHECK(cfg_has(c, "rollout.n") && !cfg_has(c, "rollout"), "cfg_has");
    cfg_free(c);
}

static void test_yaml_nested(void) {
    cfg *c = make_cfg();
    const char *y = "# a run\n"
                    "actor:\n"
                    "  ppo_mini_batch_size: 16\n"
                    "  optim:\n"
                    "    lr: 3e-6\n"
                    "  use_kl_loss: yes\n"
                    "rollout: {n: 8}\n"
                    "model:\n"
                    "  path: \"/models/qwen3 moe\"\n"
                    "trainer:\n"
                    "  devices:\n"
                    "    - 1\n"
                    "    - 3\n"
                    "async_training.staleness_threshold: 0.3\n";
    int rc = load_text(c, "nested.yaml", y);
    CHECK(rc == MOERL_OK, "load nested: %s", moerl_last_error());
    CHECK(cfg_int(c, "actor.ppo_mini_batch_size") == 16, "nested int");
    CHECK(cfg_float(c, "actor.optim.lr") == 3e-6, "3-level nested float");
    CHECK(cfg_bool(c, "actor.use_kl_loss") == true, "yes → true");
    CHECK(cfg_int(c, "rollout.n") == 8, "flow mapping");
    CHECK(strcmp(cfg_str(c, "model.path"), "/models/qwen3 moe") == 0, "quoted string");
    int n;
    const int64_t *v = cfg_int_list(c, "trainer.devices", &n);
    CHECK(n == 2 && v[0] == 1 && v[1] == 3, "block list");
    CHECK(cfg_float(c, "async_training.staleness_threshold") == 0.3, "dotted key inside YAML");
    CHECK(cfg_float(c, "actor.clip_ratio_low") == 0.2, "untouched key keeps default");
    char want[600];
    snprintf(want, sizeof want, "%s/nested.yaml:3", g_dir);
    CHECK(strcmp(cfg_origin(c, "actor.ppo_mini_batch_size"), want) == 0, "origin '%s'",
          cfg_origin(c, "actor.ppo_mini_batch_size"));
    /* a second file overrides the first */
    rc = load_text(c, "second.yaml", "rollout:\n  n: 2\n");
    CHECK(rc == MOERL_OK && cfg_int(c, "rollout.n") == 2, "later file wins");
    /* empty file and comment-only file are fine */
    CHECK(load_text(c, "empty.yaml", "") == MOERL_OK, "empty file: %s", moerl_last_error());
    CHECK(load_text(c, "comments.yaml", "# nothing\n") == MOERL_OK, "comment file");
    CHECK(cfg_int(c, "rollout.n") == 2, "empty files change nothing");
    /* null string */
    CHECK(load_text(c, "null.yaml", "model:\n  path: null\n") == MOERL_OK && strcmp(cfg_str(c, "model.path"), "") == 0,
          "null string → empty");
    cfg_free(c);
}

static void test_overrides(void) {
    cfg *c = make_cfg();
    CHECK(cfg_apply_override(c, "rollout.n=12") == MOERL_OK, "override: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "actor.optim.lr=5e-7") == MOERL_OK, "override float");
    CHECK(cfg_apply_override(c, "model.path='/a b'") == MOERL_OK, "override quoted string");
    CHECK(cfg_apply_override(c, "trainer.devices=[4, 5,6]") == MOERL_OK, "override list");
    CHECK(cfg_apply_override(c, "empty.list=7,8") == MOERL_OK, "override bare list");
    CHECK(cfg_apply_override(c, "actor.use_kl_loss=True") == MOERL_OK, "override bool");
    /* a file loaded after the overrides must not change them */
    int rc = load_text(c, "after.yaml", "rollout:\n  n: 3\nactor:\n  ppo_mini_batch_size: 32\n");
    CHECK(rc == MOERL_OK, "load after override: %s", moerl_last_error());
    CHECK(cfg_int(c, "rollout.n") == 12, "override wins over a later file: %lld", (long long)cfg_int(c, "rollout.n"));
    CHECK(cfg_int(c, "actor.ppo_mini_batch_size") == 32, "non-overridden key taken from file");
    CHECK(cfg_float(c, "actor.optim.lr") == 5e-7, "override float value");
    CHECK(strcmp(cfg_str(c, "model.path"), "/a b") == 0, "quotes stripped: '%s'", cfg_str(c, "model.path"));
    int n;
    const int64_t *v = cfg_int_list(c, "trainer.devices", &n);
    CHECK(n == 3 && v[0] == 4 && v[1] == 5 && v[2] == 6, "override list values");
    v = cfg_int_list(c, "empty.list", &n);
    CHECK(n == 2 && v[0] == 7 && v[1] == 8, "bare list values");
    CHECK(cfg_apply_override(c, "trainer.devices=[]") == MOERL_OK, "empty list override");
    cfg_int_list(c, "trainer.devices", &n);
    CHECK(n == 0, "empty list n=%d", n);
    CHECK(cfg_bool(c, "actor.use_kl_loss"), "bool override");
    CHECK(strcmp(cfg_origin(c, "rollout.n"), "override") == 0, "origin override");
    /* later override of the same key replaces */
    CHECK(cfg_apply_override(c, "rollout.n=13") == MOERL_OK && cfg_int(c, "rollout.n") == 13, "override twice");
    /* errors */
    rc = cfg_apply_override(c, "rollout.n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "key=value"), "missing '=': %s", moerl_last_error());
    rc = cfg_apply_override(c, "rollout.m=3");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "unknown key 'rollout.m'") &&
              has(moerl_last_error(), "did you mean 'rollout.n'"),
          "unknown override: %s", moerl_last_error());
    rc = cfg_apply_override(c, "=3");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "the key is empty"), "empty key: %s", moerl_last_error());
    rc = cfg_apply_override(c, "critic.model.path_to_nowhere=3");
    CHECK(rc == MOERL_ERR && !has(moerl_last_error(), "did you mean") && has(moerl_last_error(), "--help"),
          "no close key, no suggestion: %s", moerl_last_error());
    rc = cfg_apply_override(c, "actor.lr=1e-5");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "did you mean 'actor.optim.lr'"),
          "same leaf in another section is suggested: %s", moerl_last_error());
    rc = cfg_apply_override(c, "actor.use_kl_loss=maybe");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "actor.use_kl_loss") && has(moerl_last_error(), "'maybe'") &&
              has(moerl_last_error(), "bool"),
          "bad bool: %s", moerl_last_error());
    CHECK(cfg_bool(c, "actor.use_kl_loss"), "failed override leaves value");
    rc = cfg_apply_override(c, "rollout.n=4.0");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "'4.0'") && has(moerl_last_error(), "int"), "float for int: %s",
          moerl_last_error());
    rc = cfg_apply_override(c, "rollout.n=99999999999999999999");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "rollout.n"), "int64 overflow: %s", moerl_last_error());
    rc = cfg_apply_override(c, "actor.optim.lr=fast");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "float"), "bad float: %s", moerl_last_error());
    rc = cfg_apply_override(c, "actor.optim.lr=nan");
    CHECK(rc == MOERL_ERR, "nan rejected");
    rc = cfg_apply_override(c, "trainer.devices=[1,x]");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "int-list"), "bad list: %s", moerl_last_error());
    rc = cfg_apply_override(c, "model.path=\xff\xfe");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "UTF-8"), "invalid UTF-8 string: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "actor.optim.lr=-inf") == MOERL_OK && cfg_float(c, "actor.optim.lr") == -INFINITY,
          "-inf accepted");
    cfg_free(c);
}

static void test_unknown_and_types(void) {
    cfg *c = make_cfg();
    char p[600];
    /* unknown key: file + line + key + suggestion; and nothing applied (all-or-nothing) */
    int rc = load_text(c, "typo.yaml", "rollout:\n  n: 9\nactor:\n  ppo_mini_batchsize: 8\n");
    path_in(p, sizeof p, "typo.yaml");
    char want[700];
    snprintf(want, sizeof want, "%s:4: unknown key 'actor.ppo_mini_batchsize'", p);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), want) &&
              has(moerl_last_error(), "did you mean 'actor.ppo_mini_batch_size'"),
          "unknown key: %s", moerl_last_error());
    CHECK(cfg_int(c, "rollout.n") == 4, "failed file applies nothing: rollout.n=%lld", (long long)cfg_int(c, "rollout.n"));
    /* unknown section */
    rc = load_text(c, "sec.yaml", "rolout:\n  n: 9\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), ":2: unknown key 'rolout.n'") &&
              has(moerl_last_error(), "did you mean 'rollout.n'"),
          "unknown section: %s", moerl_last_error());
    /* wrong types */
    rc = load_text(c, "t1.yaml", "rollout:\n  n: four\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), ":2: key 'rollout.n': value 'four'") &&
              has(moerl_last_error(), "not a valid int"),
          "string for int: %s", moerl_last_error());
    rc = load_text(c, "t2.yaml", "rollout:\n  n: '4'\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "quoted"), "quoted int: %s", moerl_last_error());
    rc = load_text(c, "t3.yaml", "actor:\n  use_kl_loss: 1\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "actor.use_kl_loss") && has(moerl_last_error(), "true or false"),
          "int for bool: %s", moerl_last_error());
    rc = load_text(c, "t4.yaml", "rollout:\n  n:\n    a: 1\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "got a mapping"), "mapping for int: %s", moerl_last_error());
    rc = load_text(c, "t5.yaml", "rollout:\n  n: [1, 2]\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "got a list"), "list for int: %s", moerl_last_error());
    rc = load_text(c, "t6.yaml", "trainer:\n  devices: [1, two]\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "'two'") && has(moerl_last_error(), "trainer.devices"),
          "bad list item: %s", moerl_last_error());
    rc = load_text(c, "t7.yaml", "trainer:\n  devices: [[1]]\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "nested list"), "nested list: %s", moerl_last_error());
    rc = load_text(c, "t8.yaml", "actor:\n  optim:\n    lr: ~\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "actor.optim.lr"), "null for float: %s", moerl_last_error());
    /* flow list and a single scalar for a list */
    rc = load_text(c, "l1.yaml", "trainer: {devices: [7, -2]}\n");
    int n;
    const int64_t *v = cfg_int_list(c, "trainer.devices", &n);
    CHECK(rc == MOERL_OK && n == 2 && v[0] == 7 && v[1] == -2, "flow list");
    rc = load_text(c, "l2.yaml", "trainer:\n  devices: []\n");
    cfg_int_list(c, "trainer.devices", &n);
    CHECK(rc == MOERL_OK && n == 0, "empty flow list");
    /* duplicate key in a file */
    rc = load_text(c, "dup.yaml", "rollout:\n  n: 1\nrollout:\n  n: 2\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), ":4: key 'rollout.n' given twice (first at line 2)"),
          "duplicate: %s", moerl_last_error());
    /* structure errors */
    rc = load_text(c, "top.yaml", "- 1\n- 2\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "top level must be a mapping"), "top list: %s", moerl_last_error());
    rc = load_text(c, "docs.yaml", "rollout: {n: 1}\n---\nrollout: {n: 2}\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "more than one YAML document"), "two docs: %s",
          moerl_last_error());
    rc = load_text(c, "alias.yaml", "rollout:\n  n: &x 3\nactor:\n  ppo_mini_batch_size: *x\n");
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "aliases"), "alias: %s", moerl_last_error());
    /* missing file */
    path_in(p, sizeof p, "does_not_exist.yaml");
    rc = cfg_load_yaml(c, p);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), "does_not_exist.yaml"), "missing file: %s", moerl_last_error());
    cfg_free(c);
}

static void test_syntax_errors(void) {
    cfg *c = make_cfg();
    char p[600], want[700];
    /* a key without ':' on line 3: libyaml reports where it gave up (line 4) and where the key began */
    int rc = load_text(c, "syn1.yaml", "rollout:\n  n: 3\nactor\n  use_kl_loss: true\n");
    path_in(p, sizeof p, "syn1.yaml");
    snprintf(want, sizeof want, "%s:4:", p);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), want) && has(moerl_last_error(), "YAML syntax error") &&
              has(moerl_last_error(), "could not find expected ':'") && has(moerl_last_error(), "at line 3"),
          "missing colon: %s", moerl_last_error());
    CHECK(cfg_int(c, "rollout.n") == 4, "syntax error after a valid key applies nothing");
    /* a list item inside a mapping on line 3 */
    rc = load_text(c, "syn4.yaml", "rollout:\n  n: 3\n  - 4\n");
    path_in(p, sizeof p, "syn4.yaml");
    snprintf(want, sizeof want, "%s:3:3: YAML syntax error", p);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), want), "stray list item: %s", moerl_last_error());
    /* a tab used for indentation on line 2 */
    rc = load_text(c, "syn2.yaml", "rollout:\n\tn: 3\n");
    path_in(p, sizeof p, "syn2.yaml");
    snprintf(want, sizeof want, "%s:2:", p);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), want) && has(moerl_last_error(), "YAML syntax error"),
          "tab: %s", moerl_last_error());
    /* bad indentation on line 3 */
    rc = load_text(c, "syn3.yaml", "actor:\n  ppo_mini_batch_size: 1\n use_kl_loss: true\n");
    path_in(p, sizeof p, "syn3.yaml");
    snprintf(want, sizeof want, "%s:3:", p);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), want), "indent: %s", moerl_last_error());
    CHECK(cfg_int(c, "actor.ppo_mini_batch_size") == 4, "syntax error applies nothing");
    cfg_free(c);
}

static void test_dump_roundtrip(void) {
    cfg *a = make_cfg();
    cfg_def_str(a, "data.note", "", "free text");
    cfg_def_float(a, "z.tiny", 0.0, "");
    cfg_def_int(a, "z.neg", 0, "negative");
    const char *ov[] = {"rollout.n=7",
                        "actor.optim.lr=0.1",
                        "actor.clip_ratio_low=1e-300",
                        "async_training.staleness_threshold=inf",
                        "actor.use_kl_loss=true",
                        "trainer.devices=[3, -1, 9223372036854775807]",
                        "z.tiny=3",
                        "z.neg=-9223372036854775808",
                        "data.note=say \"hi\"\\ tab\there # not a comment: ünïcode"};
    for (size_t i = 0; i < sizeof ov / sizeof ov[0]; i++)
        CHECK(cfg_apply_override(a, ov[i]) == MOERL_OK, "override %s: %s", ov[i], moerl_last_error());
    CHECK(cfg_apply_override(a, "model.path=line1") == MOERL_OK, "path");
    char p[600];
    path_in(p, sizeof p, "dump.yaml");
    CHECK(cfg_dump_yaml(a, p) == MOERL_OK, "dump: %s", moerl_last_error());
    /* the dump holds help comments and nested sections */
    char *text = NULL;
    size_t len;
    CHECK(moerl_read_file(p, &text, &len) == MOERL_OK, "read dump");
    CHECK(text && has(text, "actor:\n") && has(text, "  optim:\n    lr: 0.1  # learning rate\n"),
          "nested dump with help:\n%s", text ? text : "");
    CHECK(text && has(text, "  ppo_mini_batch_size: 4  # prompts per mini-batch\n"), "int line");
    /* no temp file left behind */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", p, (int)getpid());
    CHECK(access(tmp, F_OK) != 0, "atomic write left %s", tmp);

    cfg *b = make_cfg();
    cfg_def_str(b, "data.note", "other", "free text");
    cfg_def_float(b, "z.tiny", 5.0, "");
    cfg_def_int(b, "z.neg", 5, "negative");
    CHECK(cfg_load_yaml(b, p) == MOERL_OK, "reload dump: %s", moerl_last_error());
    CHECK(cfg_int(b, "rollout.n") == 7, "rt int");
    CHECK(cfg_int(b, "actor.ppo_mini_batch_size") == 4, "rt default int");
    CHECK(cfg_float(b, "actor.optim.lr") == 0.1, "rt 0.1 exactly");
    CHECK(cfg_float(b, "actor.clip_ratio_low") == 1e-300, "rt 1e-300 exactly");
    CHECK(cfg_float(b, "async_training.staleness_threshold") == INFINITY, "rt inf");
    CHECK(cfg_float(b, "z.tiny") == 3.0, "rt integral float");
    CHECK(cfg_int(b, "z.neg") == INT64_MIN, "rt int64 min");
    CHECK(cfg_bool(b, "actor.use_kl_loss") == true, "rt bool");
    int n;
    const int64_t *v = cfg_int_list(b, "trainer.devices", &n);
    CHECK(n == 3 && v[0] == 3 && v[1] == -1 && v[2] == INT64_MAX, "rt list");
    cfg_int_list(b, "empty.list", &n);
    CHECK(n == 0, "rt empty list");
    CHECK(strcmp(cfg_str(b, "data.note"), cfg_str(a, "data.note")) == 0, "rt string: '%s' vs '%s'",
          cfg_str(b, "data.note"), cfg_str(a, "data.note"));
    CHECK(strcmp(cfg_str(b, "model.path"), "line1") == 0, "rt path");
    /* dumping the reloaded registry gives the same text */
    char *t2 = cfg_dump_yaml_string(b);
    CHECK(text && strcmp(text, t2) == 0, "dump is a fixed point");
    free(t2);
    free(text);
    /* a string with a newline and control bytes also round-trips */
    cfg_free(a);
    a = make_cfg();
    cfg_def_str(a, "data.note", "", "free text");
    cfg_def_float(a, "z.tiny", 0.0, "");
    cfg_def_int(a, "z.neg", 0, "negative");
    const char *esc = "data:\n  note: \"a\\nb\\x01c\"\n";
    CHECK(cfg_load_yaml_string(a, esc, strlen(esc), "inline") == MOERL_OK, "escapes: %s", moerl_last_error());
    CHECK(strcmp(cfg_str(a, "data.note"), "a\nb\x01" "c") == 0, "escaped string value");
    t2 = cfg_dump_yaml_string(a);
    CHECK(cfg_load_yaml_string(b, t2, strlen(t2), "dump2") == MOERL_OK, "reload escapes: %s", moerl_last_error());
    CHECK(strcmp(cfg_str(b, "data.note"), "a\nb\x01" "c") == 0, "control bytes round-trip");
    free(t2);
    cfg_free(a);
    cfg_free(b);
}

static void test_edit_distance(void) {
    CHECK(cfg_edit_distance("kitten", "sitting") == 3, "kitten/sitting");
    CHECK(cfg_edit_distance("", "abc") == 3, "empty");
    CHECK(cfg_edit_distance("rollout.n", "rollout.n") == 0, "equal");
    CHECK(cfg_edit_distance("ab", "ba") == 2, "swap costs two");
}

/* ------------------------------------------------------------------ log */

static char *slurp(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    return s;
}

static int count_char(const char *s, char c) {
    int k = 0;
    for (; *s; s++) k += *s == c;
    return k;
}

static void test_log_lines(void) {
    FILE *f = tmpfile();
    log_set_stream(f);
    log_info("hello %d", 5);
    log_debug("hidden");
    log_warn("careful\n");
    log_set_prefix("rank 1");
    log_error("bad");
    log_set_prefix(NULL);
    log_set_stream(NULL);
    char *s = slurp(f);
    fclose(f);
    /* "[YYYY-MM-DD HH:MM:SS.mmm] INFO  hello 5\n" */
    int y, mo, d, h, mi, se, ms;
    char lvl[8], rest[64];
    int k = sscanf(s, "[%4d-%2d-%2d %2d:%2d:%2d.%3d] %5s %63[^\n]", &y, &mo, &d, &h, &mi, &se, &ms, lvl, rest);
    CHECK(k == 9 && strcmp(lvl, "INFO") == 0 && strcmp(rest, "hello 5") == 0, "log line format: '%s'", s);
    CHECK(!has(s, "hidden"), "debug below level dropped");
    CHECK(has(s, "] WARN  careful\n[") && count_char(s, '\n') == 3, "trailing newline not doubled: '%s'", s);
    CHECK(has(s, "] ERROR rank 1: bad\n"), "prefix: '%s'", s);
    free(s);
    log_set_level(LOG_DEBUG);
    f = tmpfile();
    log_set_stream(f);
    log_debug("shown");
    log_set_stream(NULL);
    log_set_level(LOG_INFO);
    s = slurp(f);
    fclose(f);
    CHECK(has(s, "] DEBUG shown\n"), "debug at debug level");
    free(s);
}

static void test_metrics(void) {
    char p[600];
    path_in(p, sizeof p, "sub/dir/metrics.jsonl");
    metrics_writer *m = metrics_open(p);
    CHECK(m != NULL, "metrics_open (creates parents): %s", moerl_last_error());
    if (!m) return;
    const char *k1[] = {"timing_s/gen", "actor/pg_loss", "critic/rewards/mean"};
    double v1[] = {1.5, -0.25, NAN};
    CHECK(metrics_write(m, 1, 3, k1, v1) == MOERL_OK, "write 1");
    double v2[] = {2.0, 0.125, 1.0};
    CHECK(metrics_write(m, 2, 3, k1, v2) == MOERL_OK, "write 2");
    const char *kd[] = {"a", "a"};
    double vd[] = {1, 2};
    CHECK(metrics_write(m, 3, 2, kd, vd) == MOERL_ERR && has(moerl_last_error(), "'a' given twice"), "dup key: %s",
          moerl_last_error());
    const char *ks[] = {"step"};
    CHECK(metrics_write(m, 3, 1, ks, vd) == MOERL_ERR, "'step' key reserved");
    /* readable while open: each line was flushed */
    char *text;
    size_t len;
    CHECK(moerl_read_file(p, &text, &len) == MOERL_OK && count_char(text, '\n') == 2, "two flushed lines");
    free(text);
    metrics_close(m);
    m = metrics_open(p);
    double v3[] = {INFINITY, 3, 4};
    CHECK(m && metrics_write(m, 10, 3, k1, v3) == MOERL_OK, "append after reopen");
    metrics_close(m);
    CHECK(moerl_read_file(p, &text, &len) == MOERL_OK, "read metrics");
    CHECK(count_char(text, '\n') == 3, "three lines after reopen");
    /* parse each line back */
    char *save, *line = strtok_r(text, "\n", &save);
    int64_t steps[3];
    int i = 0;
    for (; line && i < 3; line = strtok_r(NULL, "\n", &save), i++) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        CHECK(o && json_is_object(o), "line %d parses: %s", i, e.text);
        if (!o) continue;
        steps[i] = json_integer_value(json_object_get(o, "step"));
        if (i == 0) {
            CHECK(json_real_value(json_object_get(o, "timing_s/gen")) == 1.5, "value 1.5");
            CHECK(json_real_value(json_object_get(o, "actor/pg_loss")) == -0.25, "value -0.25");
            CHECK(json_is_null(json_object_get(o, "critic/rewards/mean")), "NaN → null");
            /* key order as given, step first */
            const char *first = json_object_iter_key(json_object_iter(o));
            CHECK(strcmp(first, "step") == 0, "step first");
        }
        if (i == 2) CHECK(json_is_null(json_object_get(o, "timing_s/gen")), "inf → null");
        json_decref(o);
    }
    CHECK(i == 3 && steps[0] == 1 && steps[1] == 2 && steps[2] == 10, "steps 1,2,10");
    free(text);
    CHECK(metrics_open("/proc/no/such/dir/m.jsonl") == NULL, "unopenable path fails");
}

static void test_progress(void) {
    FILE *f = tmpfile();
    progress p;
    progress_begin_on(&p, f, false, 0.0, "gen", 10);
    progress_update(&p, 3, "loss 1.5");
    progress_update(&p, 7, NULL);
    progress_end(&p, NULL);
    char *s = slurp(f);
    fclose(f);
    CHECK(count_char(s, '\n') == 3 && !has(s, "\r") && !has(s, "\033"), "plain lines when not a tty: '%s'", s);
    CHECK(has(s, "gen 3/10  30%") && has(s, "loss 1.5"), "plain line content: '%s'", s);
    CHECK(has(s, "gen 7/10  70%"), "second line");
    free(s);

    f = tmpfile();
    progress_begin_on(&p, f, false, 3600.0, "slow", 0);
    for (int i = 1; i <= 50; i++) progress_update(&p, i, NULL);
    progress_end(&p, NULL);
    s = slurp(f);
    fclose(f);
    /* period 1 h: the first update draws, the other 49 fall inside the period, end draws */
    CHECK(count_char(s, '\n') == 2 && has(s, "slow 50"), "period throttles plain lines: '%s'", s);
    free(s);

    f = tmpfile();
    progress_begin_on(&p, f, true, 0.0, "train", 4);
    progress_update(&p, 2, NULL);
    progress_end(&p, "done");
    s = slurp(f);
    fclose(f);
    CHECK(has(s, "\rtrain [###############...............] 2/4  50%"), "tty bar: '%s'", s);
    CHECK(has(s, "\033[K") && count_char(s, '\n') == 1 && s[strlen(s) - 1] == '\n', "tty redraw + final newline");
    CHECK(has(s, " done\033[K\n"), "final line with extra text: '%s'", s);
    free(s);
}

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

/* The string-list type (trainer.logger): YAML block and flow lists, a scalar, overrides, errors,
 * the dump round trip. */
static void test_str_list(void) {
    cfg *c = cfg_new();
    const char *def[] = {"file"};
    cfg_def_str_list(c, "trainer.logger", def, 1, "sinks");
    cfg_def_str_list(c, "x.empty", NULL, 0, "starts empty");
    int n;
    const char *const *v = cfg_str_list(c, "trainer.logger", &n);
    CHECK(n == 1 && !strcmp(v[0], "file"), "default");
    CHECK(cfg_str_list(c, "x.empty", &n) == NULL && n == 0, "empty default");
    CHECK(load_text(c, "sl1.yaml", "trainer:\n  logger:\n    - console\n    - \"tensor board\"\n") == MOERL_OK,
          "block list: %s", moerl_last_error());
    v = cfg_str_list(c, "trainer.logger", &n);
    CHECK(n == 2 && !strcmp(v[0], "console") && !strcmp(v[1], "tensor board"), "block list values");
    CHECK(load_text(c, "sl2.yaml", "trainer: {logger: [console, file, tensorboard]}\n") == MOERL_OK, "flow list");
    v = cfg_str_list(c, "trainer.logger", &n);
    CHECK(n == 3 && !strcmp(v[2], "tensorboard"), "flow list values");
    CHECK(load_text(c, "sl3.yaml", "trainer: {logger: console}\n") == MOERL_OK, "scalar");
    v = cfg_str_list(c, "trainer.logger", &n);
    CHECK(n == 1 && !strcmp(v[0], "console") && has(cfg_origin(c, "trainer.logger"), "sl3.yaml:1"),
          "a scalar is a one-item list, origin %s", cfg_origin(c, "trainer.logger"));
    CHECK(load_text(c, "sl4.yaml", "trainer: {logger: []}\n") == MOERL_OK && cfg_str_list(c, "trainer.logger", &n) == NULL &&
              n == 0,
          "empty flow list");
    CHECK(load_text(c, "sl5.yaml", "trainer: {logger: [console, 3]}\n") == MOERL_OK &&
              !strcmp(cfg_str_list(c, "trainer.logger", &n)[1], "3"),
          "a number item is its text");
    CHECK(load_text(c, "sl6.yaml", "trainer: {logger: [console, {a: 1}]}\n") == MOERL_ERR &&
              has(moerl_last_error(), "sl6.yaml:1") && has(moerl_last_error(), "must be strings, got a mapping"),
          "mapping item: %s", moerl_last_error());
    CHECK(load_text(c, "sl7.yaml", "trainer: {logger: [console, \"\"]}\n") == MOERL_ERR &&
              has(moerl_last_error(), "item 2 is empty") && has(moerl_last_error(), "'trainer.logger'"),
          "empty item: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "trainer.logger=console,tensorboard") == MOERL_OK, "comma override");
    v = cfg_str_list(c, "trainer.logger", &n);
    CHECK(n == 2 && !strcmp(v[0], "console") && !strcmp(v[1], "tensorboard"), "comma override values");
    CHECK(cfg_apply_override(c, "trainer.logger=[ file , 'console' ]") == MOERL_OK, "bracket override");
    v = cfg_str_list(c, "trainer.logger", &n);
    CHECK(n == 2 && !strcmp(v[0], "file") && !strcmp(v[1], "console"), "bracket override values, quotes removed");
    CHECK(cfg_apply_override(c, "trainer.logger=\"file,console\"") == MOERL_OK && cfg_str_list(c, "trainer.logger", &n) &&
              n == 2,
          "quoted override");
    CHECK(cfg_apply_override(c, "trainer.logger=file,,console") == MOERL_ERR && has(moerl_last_error(), "item 2 is empty") &&
              has(moerl_last_error(), "string-list"),
          "empty override item: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "trainer.logger=[file") == MOERL_ERR && has(moerl_last_error(), "closing ']'"),
          "unclosed bracket: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "x.empty=[]") == MOERL_OK && cfg_str_list(c, "x.empty", &n) == NULL && n == 0, "[]");
    /* dump and reload */
    CHECK(cfg_apply_override(c, "x.empty=a\\b,\"q\"x") == MOERL_OK, "odd characters");
    char *text = cfg_dump_yaml_string(c);
    CHECK(has(text, "logger: [\"file\", \"console\"]  # sinks"), "dump: %s", text);
    cfg *d = cfg_new();
    cfg_def_str_list(d, "trainer.logger", NULL, 0, "sinks");
    cfg_def_str_list(d, "x.empty", NULL, 0, "starts empty");
    CHECK(cfg_load_yaml_string(d, text, strlen(text), "dump") == MOERL_OK, "reload: %s", moerl_last_error());
    v = cfg_str_list(d, "x.empty", &n);
    CHECK(n == 2 && !strcmp(v[0], "a\\b") && !strcmp(v[1], "\"q\"x"), "round trip of odd items");
    char *t2 = cfg_dump_yaml_string(d);
    CHECK(!strcmp(text, t2), "dump is a fixed point");
    free(t2);
    free(text);
    cfg_free(d);
    cfg_free(c);
}

/* trainer.logger names → sinks, and the sinks a writer opens. */
static void test_metrics_loggers(void) {
    unsigned f = 99;
    const char *all[] = {"tensorboard", "console", "file"};
    CHECK(metrics_logger_flags("trainer.logger", all, 3, &f) == MOERL_OK &&
              f == (METRICS_FILE | METRICS_CONSOLE | METRICS_TENSORBOARD),
          "all three");
    const char *w[] = {"console", "wandb"};
    CHECK(metrics_logger_flags("trainer.logger", w, 2, &f) == MOERL_ERR &&
              has(moerl_last_error(), "trainer.logger: 'wandb' is not a logger moerl has (supported: console, file, "
                                      "tensorboard)"),
          "unknown: %s", moerl_last_error());
    const char *twice[] = {"file", "file"};
    CHECK(metrics_logger_flags("k", twice, 2, &f) == MOERL_ERR && has(moerl_last_error(), "'file' is given twice"),
          "twice");
    CHECK(metrics_logger_flags("k", NULL, 0, &f) == MOERL_ERR && has(moerl_last_error(), "k is empty"), "empty");
    /* console only: no file; one log line per record */
    char p[600], tb[700];
    path_in(p, sizeof p, "lg/sft_metrics.jsonl");
    FILE *log = tmpfile();
    log_set_stream(log);
    metrics_writer *m = metrics_open_loggers(p, METRICS_CONSOLE, -1);
    const char *k[] = {"a/b", "c"};
    double v[] = {0.5, NAN};
    CHECK(m && metrics_write(m, 7, 2, k, v) == MOERL_OK, "console write");
    metrics_close(m);
    log_set_stream(NULL);
    char buf[512] = "";
    rewind(log);
    size_t got = fread(buf, 1, sizeof buf - 1, log);
    buf[got] = 0;
    fclose(log);
    CHECK(has(buf, "INFO  step 7: a/b=0.5 c=nan\n"), "console line: %s", buf);
    CHECK(access(p, F_OK) != 0, "no JSONL without file");
    /* tensorboard: <folder>/tensorboard/<stem> for a file other than metrics.jsonl; a fresh writer
     * removes the folder's earlier event files, a resumed one keeps them */
    m = metrics_open_loggers(p, METRICS_TENSORBOARD, -1);
    CHECK(m && metrics_write(m, 1, 2, k, v) == MOERL_OK, "tensorboard write");
    metrics_close(m);
    path_in(tb, sizeof tb, "lg/tensorboard/sft_metrics");
    CHECK(count_event_files(tb) == 1, "one event file in %s", tb);
    metrics_close(metrics_open_loggers(p, METRICS_TENSORBOARD, 1));
    CHECK(count_event_files(tb) == 2, "a resumed writer adds a file");
    metrics_close(metrics_open_loggers(p, METRICS_TENSORBOARD, -1));
    CHECK(count_event_files(tb) == 1, "a fresh writer starts anew");
    path_in(p, sizeof p, "lg/metrics.jsonl");
    metrics_close(metrics_open_loggers(p, METRICS_TENSORBOARD | METRICS_FILE, -1));
    path_in(tb, sizeof tb, "lg/tensorboard");
    CHECK(count_event_files(tb) == 1 && access(p, F_OK) == 0, "metrics.jsonl → <folder>/tensorboard");
    path_in(p, sizeof p, "lg/blocked");
    write_text(p, "a file where the tensorboard folder's parent should be");
    char q[700];
    snprintf(q, sizeof q, "%s/metrics.jsonl", p);
    CHECK(metrics_open_loggers(q, METRICS_TENSORBOARD, -1) == NULL && has(moerl_last_error(), "tensorboard folder"),
          "unwritable tensorboard folder: %s", moerl_last_error());
    /* CRC32C: the standard check value of "123456789" (RFC 3720 B.4) and the mask of TFRecord */
    CHECK(tb_crc32c("123456789", 9) == 0xE3069283u, "crc32c check value: %08x", tb_crc32c("123456789", 9));
    uint32_t c = tb_crc32c("", 0);
    CHECK(c == 0 && tb_masked_crc32c("", 0) == (((c >> 15) | (c << 17)) + 0xa282ead8u), "mask of the empty CRC");
}

static void *log_from_thread(void *arg) {
    log_info("%s", (const char *)arg);
    return NULL;
}

/* Several processes (log_set_rank): the lines every rank logs alike (log_shared, log_shared_begin/end)
 * only on the speaker; the others' own lines named by their rank ("rank R", or the prefix set). */
static void test_log_ranks(void) {
    FILE *f = tmpfile();
    log_set_stream(f);
    log_set_rank(0, true); /* the speaker: shared lines printed, no rank added */
    log_shared(LOG_WARN, "shared on 0");
    log_info("own on 0");
    log_set_rank(1, false); /* another rank */
    log_shared(LOG_WARN, "shared on 1");
    log_shared_begin();
    log_shared_begin();
    log_info("nested shared on 1");
    log_shared_end();
    log_info("still shared on 1");
    pthread_t th;
    pthread_create(&th, NULL, log_from_thread, "another thread's own line");
    pthread_join(th, NULL);
    log_error("shared error on 1");
    log_shared_end();
    log_info("own on 1");
    log_set_prefix("rollout 1");
    log_warn("own with prefix");
    log_shared(LOG_INFO, "shared with prefix");
    log_set_prefix(NULL);
    bool sp = true;
    CHECK(log_get_rank(&sp) == 1 && !sp, "log_get_rank: %d %d", log_get_rank(NULL), sp);
    log_set_rank(-1, false); /* one process: everything, as is */
    log_shared(LOG_INFO, "shared alone");
    CHECK(log_get_rank(&sp) == -1 && sp, "one process speaks");
    log_set_stream(NULL);
    char *s = slurp(f);
    fclose(f);
    CHECK(has(s, "] WARN  shared on 0\n") && has(s, "] INFO  own on 0\n"), "speaker: '%s'", s);
    CHECK(!has(s, "shared on 1") && !has(s, "still shared") && !has(s, "shared with prefix"),
          "shared lines dropped on a rank that does not speak: '%s'", s);
    CHECK(has(s, "] INFO  rank 1: another thread's own line\n"), "the shared stretch is the thread's: '%s'", s);
    CHECK(has(s, "] ERROR rank 1: shared error on 1\n"), "errors print on every rank: '%s'", s);
    CHECK(has(s, "] INFO  rank 1: own on 1\n") && has(s, "] WARN  rollout 1: own with prefix\n"),
          "own lines carry the rank: '%s'", s);
    CHECK(has(s, "] INFO  shared alone\n") && count_char(s, '\n') == 7, "one process: '%s'", s);
    free(s);
}

/* Another command's keys named in the unknown-key messages (cfg_set_other_command): its spelling of a key of this
 * command (a prefix pair and a whole-key pair), a typo of that spelling, a key only it has; a key neither has
 * keeps the usual suggestion. */
static void test_other_command(void) {
    static const char *const spell[] = {"actor.optim.", "optim.", "sft.lr", "optim.lr"};
    cfg *c = cfg_new(), *rl = cfg_new();
    cfg_def_float(c, "optim.lr", 1e-3, "lr");
    cfg_def_int(c, "trainer.total_training_steps", 1, "steps");
    cfg_def_float(rl, "actor.optim.lr", 1e-6, "lr");
    cfg_def_int(rl, "trainer.n_ranks", 1, "ranks");
    cfg_def_float(rl, "sft.lr", 1e-3, "warm-start lr");
    cfg_set_other_command(c, "moerl sft", rl, "moerl rl", spell, 2);
    CHECK(cfg_apply_override(c, "actor.optim.lr=3") == MOERL_ERR &&
              has(moerl_last_error(), "('actor.optim.lr' is moerl rl's spelling; moerl sft's key is 'optim.lr')"),
          "rl spelling: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "sft.lr=3") == MOERL_ERR && has(moerl_last_error(), "moerl sft's key is 'optim.lr'"),
          "whole-key pair: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "actor.optim.lrr=3") == MOERL_ERR &&
              has(moerl_last_error(), "(did you mean 'optim.lr'? moerl sft spells moerl rl's actor.optim.* as optim.*)"),
          "typo of the rl spelling: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "trainer.n_ranks=2") == MOERL_ERR &&
              has(moerl_last_error(), "('trainer.n_ranks' is a key of moerl rl, not of moerl sft;"),
          "rl-only key: %s", moerl_last_error());
    CHECK(load_text(c, "other.yaml", "actor:\n  optim:\n    lr: 1\n") == MOERL_ERR &&
              has(moerl_last_error(), ":3: unknown key 'actor.optim.lr' ('actor.optim.lr' is moerl rl's spelling"),
          "rl spelling in a file: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "trainer.total_trainig_steps=2") == MOERL_ERR &&
              has(moerl_last_error(), "(did you mean 'trainer.total_training_steps'?)"),
          "a typo of this command's key: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "zzz.qqq=2") == MOERL_ERR && has(moerl_last_error(), "no key of this command is close"),
          "a key of neither: %s", moerl_last_error());
    CHECK(cfg_float(c, "optim.lr") == 1e-3, "refused overrides change nothing");
    cfg_free(c); /* frees rl */
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/moerl_test_config_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_defaults();
    test_yaml_nested();
    test_overrides();
    test_unknown_and_types();
    test_other_command();
    test_syntax_errors();
    test_dump_roundtrip();
    test_edit_distance();
    test_log_lines();
    test_log_ranks();
    test_metrics();
    test_progress();
    test_str_list();
    test_metrics_loggers();
    nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    TEST_MAIN_END();
}
