/* rollout.multi_turn.* as moerl rl reads them (rl_def_keys / rl_read_config): declared with help,
 * defaults accepted, each bad value refused with the key named, a key off its default without
 * enable refused (the environment's tool_* keys too), the tool file checked with enable=true (a
 * command line that needs a shell refused), and a good one accepted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/config.h"
#include "fixture.h"
#include "rl/multi_turn.h"
#include "rl/rl.h"
#include "test.h"

/* rl_read_config of the defaults plus one or two overrides: MOERL_OK or MOERL_ERR. */
static int read_with(const char *a, const char *b) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    int rc = MOERL_OK;
    if (a && cfg_apply_override(c, a) != MOERL_OK) rc = MOERL_ERR;
    if (rc == MOERL_OK && b && cfg_apply_override(c, b) != MOERL_OK) rc = MOERL_ERR;
    rl_config r;
    if (rc == MOERL_OK) rc = rl_read_config(c, &r);
    cfg_free(c);
    return rc;
}

static void refused(const char *a, const char *b, const char *want) {
    int rc = read_with(a, b);
    CHECK(rc == MOERL_ERR && strstr(moerl_last_error(), want), "%s %s: want an error with '%s', got %s", a, b ? b : "",
          want, rc ? moerl_last_error() : "accepted");
}

int main(void) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    const char *keys[] = {"rollout.multi_turn.enable", "rollout.multi_turn.max_assistant_turns",
                          "rollout.multi_turn.max_tool_response_length", "rollout.multi_turn.format",
                          "rollout.multi_turn.tool_config_path"};
    for (int i = 0; i < FX_N(keys); i++) CHECK(cfg_has(c, keys[i]), "%s declared", keys[i]);
    multi_turn_config m;
    CHECK(multi_turn_read_config(c, &m) == MOERL_OK && !m.enable && m.max_assistant_turns == 0 &&
              m.max_tool_response_length == 256 && !strcmp(m.format, "hermes") && !m.tool_config_path[0],
          "defaults (verl's): %s", moerl_last_error());
    char *help = NULL;
    size_t hl = 0;
    FILE *f = open_memstream(&help, &hl);
    cfg_print_help(c, f);
    fclose(f);
    CHECK(help && strstr(help, "rollout.multi_turn.tool_config_path") && strstr(help, "command:"), "help lists the keys");
    free(help);
    cfg_free(c);
    CHECK(read_with(NULL, NULL) == MOERL_OK, "defaults accepted: %s", moerl_last_error());
    refused("rollout.multi_turn.max_assistant_turns=-1", NULL, "max_assistant_turns must be ≥ 0");
    refused("rollout.multi_turn.max_tool_response_length=0", NULL, "max_tool_response_length must be a positive");
    refused("rollout.multi_turn.format=json", NULL, "rollout.multi_turn.format: 'json'");
    refused("rollout.multi_turn.max_assistant_turns=3", NULL, "max_assistant_turns is set but rollout.multi_turn.enable is false");
    refused("rollout.multi_turn.tool_config_path=t.yaml", NULL, "tool_config_path is set but");
    refused("rollout.multi_turn.enable=true", NULL, "needs rollout.multi_turn.tool_config_path");
    refused("rollout.multi_turn.enable=true", "rollout.multi_turn.tool_config_path=/nonexistent/t.yaml", "/nonexistent/t.yaml");
    char path[] = "/tmp/moerl_mt_XXXXXX";
    int fd = mkstemp(path);
    MOERL_ASSERT(fd >= 0);
    const char *bad = "- {function: {name: a}}\n", *good = "- {function: {name: calc}, command: ./env}\n";
    MOERL_ASSERT(write(fd, bad, strlen(bad)) == (ssize_t)strlen(bad));
    char kv[64];
    snprintf(kv, sizeof kv, "rollout.multi_turn.tool_config_path=%s", path);
    refused("rollout.multi_turn.enable=true", kv, "exactly one of command: or url:");
    MOERL_ASSERT(ftruncate(fd, 0) == 0 && pwrite(fd, good, strlen(good), 0) == (ssize_t)strlen(good));
    CHECK(read_with("rollout.multi_turn.enable=true", kv) == MOERL_OK, "enable=true with a good tool file: %s",
          moerl_last_error());
    const char *shell = "- {function: {name: calc}, command: ./env | tee log}\n";
    MOERL_ASSERT(ftruncate(fd, 0) == 0 && pwrite(fd, shell, strlen(shell), 0) == (ssize_t)strlen(shell));
    refused("rollout.multi_turn.enable=true", kv, "tool 'calc': command:");
    refused("rollout.multi_turn.tool_timeout_s=5", NULL, "tool_timeout_s is set but rollout.multi_turn.enable is false");
    refused("rollout.multi_turn.tool_num_workers=0", NULL, "rollout.multi_turn.tool_num_workers");
    close(fd);
    unlink(path);
    TEST_MAIN_END();
}
