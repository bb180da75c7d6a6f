/* The reward.* config keys (verl's names where verl has them: reward.custom_reward_function.path
 * and .name are verl's custom_reward_function keys under moerl's reward section) and their checks.
 * docs/rewards.md describes them for users. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "reward/reward.h"
#include "reward/reward_internal.h"

void reward_def_keys(cfg *c) {
    cfg_def_str(c, "reward.custom_reward_function.path", "",
                "a Python file defining a verl-style reward function (empty = built-in rewards by data_source)");
    cfg_def_str(c, "reward.custom_reward_function.name", "compute_score",
                "the function in reward.custom_reward_function.path: fn(data_source, solution_str, ground_truth, "
                "extra_info) -> float or dict with 'score'");
    cfg_def_str(c, "reward.command", "",
                "a reward program speaking JSON lines on stdin/stdout (split into words as a shell would, "
                "without running a shell; docs/rewards.md)");
    cfg_def_str(c, "reward.url", "", "an HTTP(S) reward server taking POSTs of JSON lists of requests");
    cfg_def_str(c, "reward.python", "python3", "the Python interpreter running reward.custom_reward_function.path");
    cfg_def_int(c, "reward.num_workers", 4,
                "reward processes (custom_reward_function / command), each one request at a time");
    cfg_def_int(c, "reward.max_concurrency", 8, "reward.url: POSTs in flight at once");
    cfg_def_int(c, "reward.batch_size", 16, "reward.url: requests per POST");
    cfg_def_float(c, "reward.timeout_s", 60.0,
                  "seconds one request (processes) or one POST (url) may take before it counts as failed");
    cfg_def_int(c, "reward.max_retries", 2,
                "retries of a request whose process crashed or hung, or whose POST failed (5xx, timeout, "
                "connection); then the run stops");
}

/* The key's value and where it came from, for messages. */
static const char *origin(const cfg *c, const char *key) {
    const char *o = cfg_origin(c, key);
    return strcmp(o, "default") ? o : "the default";
}

static int copy_str(const cfg *c, const char *key, char *dst, size_t cap) {
    const char *v = cfg_str(c, key);
    if (strlen(v) >= cap)
        return moerl_errorf("%s (from %s): the value is %zu bytes long; at most %zu are supported", key,
                            origin(c, key), strlen(v), cap - 1);
    snprintf(dst, cap, "%s", v);
    return MOERL_OK;
}

static int is_identifier(const char *s) {
    if (!s[0] || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return 0;
    for (const char *p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_')) return 0;
    return 1;
}

static int check_counts(const cfg *c, reward_config *o) {
    static const char *keys[] = {"reward.num_workers", "reward.max_concurrency", "reward.batch_size"};
    int *dst[] = {&o->num_workers, &o->max_concurrency, &o->batch_size};
    for (int i = 0; i < 3; i++) {
        int64_t v = cfg_int(c, keys[i]);
        if (v < 1 || v > 4096)
            return moerl_errorf("%s (from %s): %lld is not a count from 1 to 4096", keys[i], origin(c, keys[i]),
                                (long long)v);
        *dst[i] = (int)v;
    }
    int64_t r = cfg_int(c, "reward.max_retries");
    if (r < 0 || r > 1000)
        return moerl_errorf("reward.max_retries (from %s): %lld is not from 0 to 1000", origin(c, "reward.max_retries"),
                            (long long)r);
    o->max_retries = (int)r;
    o->timeout_s = cfg_float(c, "reward.timeout_s");
    if (!isfinite(o->timeout_s) || !(o->timeout_s > 0) || o->timeout_s > 1e6)
        return moerl_errorf("reward.timeout_s (from %s): %g is not a finite number of seconds > 0 (at most 1e6)",
                            origin(c, "reward.timeout_s"), o->timeout_s);
    return MOERL_OK;
}

static int check_function(const cfg *c, reward_config *o) {
    const char *k = "reward.custom_reward_function.path";
    struct stat st;
    if (stat(o->function_path, &st) != 0)
        return moerl_errorf("%s (from %s): cannot read '%s': %s", k, origin(c, k), o->function_path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return moerl_errorf("%s (from %s): '%s' is not a file (expected a Python file defining %s)", k, origin(c, k),
                            o->function_path, o->function_name);
    if (access(o->function_path, R_OK) != 0)
        return moerl_errorf("%s (from %s): cannot read '%s': %s", k, origin(c, k), o->function_path, strerror(errno));
    if (!is_identifier(o->function_name))
        return moerl_errorf("reward.custom_reward_function.name (from %s): '%s' is not a Python function name",
                            origin(c, "reward.custom_reward_function.name"), o->function_name);
    if (!o->python[0])
        return moerl_errorf("reward.python (from %s) is empty: it names the Python interpreter running %s",
                            origin(c, "reward.python"), o->function_path);
    return MOERL_OK;
}

/* A key set (not left at its default) that the chosen source does not use is refused, not ignored. */
static int check_unused(const cfg *c, reward_kind kind) {
    static const struct {
        const char *key;
        unsigned kinds; /* bit per reward_kind that reads it */
    } keys[] = {
        {"reward.custom_reward_function.name", 1u << REWARD_FUNCTION},
        {"reward.python", 1u << REWARD_FUNCTION},
        {"reward.num_workers", 1u << REWARD_FUNCTION | 1u << REWARD_COMMAND},
        {"reward.batch_size", 1u << REWARD_URL},
        {"reward.max_concurrency", 1u << REWARD_URL},
        {"reward.timeout_s", 1u << REWARD_FUNCTION | 1u << REWARD_COMMAND | 1u << REWARD_URL},
        {"reward.max_retries", 1u << REWARD_FUNCTION | 1u << REWARD_COMMAND | 1u << REWARD_URL},
    };
    static const char *source[] = {("the built-in rewards (none of reward.custom_reward_function.path, "
                                    "reward.command, reward.url is set)"),
                                   "reward.custom_reward_function.path", "reward.command", "reward.url"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!(keys[i].kinds >> kind & 1u) && strcmp(cfg_origin(c, keys[i].key), "default"))
            return moerl_errorf("%s (from %s) is not used by %s: unset it, or set the reward source it belongs to",
                                keys[i].key, cfg_origin(c, keys[i].key), source[kind]);
    return MOERL_OK;
}

int reward_read_config(const cfg *c, reward_config *o) {
    memset(o, 0, sizeof *o);
    if (copy_str(c, "reward.custom_reward_function.path", o->function_path, sizeof o->function_path) ||
        copy_str(c, "reward.custom_reward_function.name", o->function_name, sizeof o->function_name) ||
        copy_str(c, "reward.command", o->command, sizeof o->command) ||
        copy_str(c, "reward.url", o->url, sizeof o->url) || copy_str(c, "reward.python", o->python, sizeof o->python))
        return MOERL_ERR;
    static const char *src[] = {"reward.custom_reward_function.path", "reward.command", "reward.url"};
    const char *set[3];
    int n_set = 0;
    for (int i = 0; i < 3; i++)
        if (cfg_str(c, src[i])[0]) set[n_set++] = src[i];
    if (n_set > 1)
        return moerl_errorf("%s (from %s) and %s (from %s) are both set: rewards come from one source; unset one",
                            set[0], origin(c, set[0]), set[1], origin(c, set[1]));
    if (check_counts(c, o) != MOERL_OK) return MOERL_ERR;
    o->kind = o->function_path[0] ? REWARD_FUNCTION : o->command[0] ? REWARD_COMMAND : o->url[0] ? REWARD_URL
                                                                                                 : REWARD_BUILTIN;
    if (check_unused(c, o->kind) != MOERL_OK) return MOERL_ERR;
    if (o->function_path[0]) {
        return check_function(c, o);
    }
    if (o->command[0]) {
        char **argv = NULL;
        int argc = 0;
        if (reward_split_command(o->command, &argv, &argc) != MOERL_OK)
            return moerl_error_prefix("reward.command (from %s): ", origin(c, "reward.command"));
        reward_free_argv(argv, argc);
        return MOERL_OK;
    }
    if (o->url[0]) {
        if (strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8))
            return moerl_errorf("reward.url (from %s): '%s' is not an http:// or https:// URL", origin(c, "reward.url"),
                                o->url);
    }
    return MOERL_OK;
}
