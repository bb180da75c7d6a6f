/* rollout.multi_turn.* (rl/multi_turn.h). */
#include "rl/multi_turn.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "rl/agent_loop.h"

#define MT_DEF_TOOL_RESPONSE 256

void multi_turn_def_keys(cfg *c) {
    cfg_def_bool(c, "rollout.multi_turn.enable", false,
                 "multi-turn rollouts with tools (docs/multi-turn.md): a trajectory is assistant turns and the tool "
                 "turns answering their tool calls; the environment programs or servers of tool_config_path run the "
                 "tools");
    cfg_def_int(c, "rollout.multi_turn.max_assistant_turns", 0,
                "assistant turns per trajectory at most (0 = no limit but data.max_response_length over all turns)");
    cfg_def_int(c, "rollout.multi_turn.max_tool_response_length", MT_DEF_TOOL_RESPONSE,
                "characters of a tool response kept (the rest is cut)");
    cfg_def_str(c, "rollout.multi_turn.format", "hermes",
                "how the model writes tool calls: hermes (<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>)");
    cfg_def_str(c, "rollout.multi_turn.tool_config_path", "",
                "YAML list of tools: OpenAI function schema + command: (JSON-lines program) or url: (HTTP); rows "
                "without their own \"tools\" get these schemas in their prompt");
    env_def_keys(c); /* rollout.multi_turn.tool_* (reward/env.h) */
}

static int copy_str(char *dst, size_t cap, const char *v, const char *key) {
    if (strlen(v) >= cap) return moerl_errorf("%s: value of %zu characters is too long (at most %zu)", key, strlen(v), cap - 1);
    memcpy(dst, v, strlen(v) + 1);
    return MOERL_OK;
}

int multi_turn_read_config(const cfg *c, multi_turn_config *m) {
    memset(m, 0, sizeof *m);
    m->enable = cfg_bool(c, "rollout.multi_turn.enable");
    const int64_t turns = cfg_int(c, "rollout.multi_turn.max_assistant_turns"),
                  trl = cfg_int(c, "rollout.multi_turn.max_tool_response_length");
    if (turns < 0 || turns > 1000000)
        return moerl_errorf("rollout.multi_turn.max_assistant_turns must be ≥ 0 (0 = no limit), got %lld", (long long)turns);
    if (trl <= 0 || trl > 100000000)
        return moerl_errorf("rollout.multi_turn.max_tool_response_length must be a positive number of characters, got %lld",
                            (long long)trl);
    m->max_assistant_turns = (int)turns;
    m->max_tool_response_length = (int)trl;
    if (copy_str(m->format, sizeof m->format, cfg_str(c, "rollout.multi_turn.format"), "rollout.multi_turn.format") ||
        copy_str(m->tool_config_path, sizeof m->tool_config_path, cfg_str(c, "rollout.multi_turn.tool_config_path"),
                 "rollout.multi_turn.tool_config_path"))
        return MOERL_ERR;
    if (strcmp(m->format, "hermes"))
        return moerl_errorf("rollout.multi_turn.format: '%s' is not a tool-call format moerl parses (expected hermes)", m->format);
    if (env_read_config(c, &m->env) != MOERL_OK) return MOERL_ERR;
    if (!m->enable) {
        static const char *const env_keys[4] = {"tool_timeout_s", "tool_num_workers", "tool_max_concurrency",
                                                "tool_max_retries"};
        const char *off = turns ? "max_assistant_turns" : trl != MT_DEF_TOOL_RESPONSE ? "max_tool_response_length"
                          : m->tool_config_path[0]                                   ? "tool_config_path"
                                                                                     : NULL;
        char key[96];
        for (int i = 0; i < 4 && !off; i++) {
            snprintf(key, sizeof key, "rollout.multi_turn.%s", env_keys[i]);
            if (strcmp(cfg_origin(c, key), "default")) off = env_keys[i];
        }
        if (off)
            return moerl_errorf("rollout.multi_turn.%s is set but rollout.multi_turn.enable is false: set enable=true "
                                "for multi-turn rollouts, or leave the key at its default",
                                off);
        return MOERL_OK;
    }
    if (!m->tool_config_path[0])
        return moerl_errorf("rollout.multi_turn.enable=true needs rollout.multi_turn.tool_config_path (a YAML list of tools)");
    tool_config tc; /* checked now; loaded again by whoever runs the tools (rollouter_init) */
    if (tool_config_load(m->tool_config_path, &tc) != MOERL_OK) return MOERL_ERR;
    const int rc = env_check_tools(&tc);
    tool_config_free(&tc);
    return rc == MOERL_OK ? MOERL_OK : moerl_error_prefix("rollout.multi_turn.tool_config_path %s: ", m->tool_config_path);
}

int multi_turn_attach_tools(const multi_turn_config *m, dataset *ds) {
    if (!m->enable || dataset_count(ds) == 0) return MOERL_OK;
    tool_config tc;
    if (tool_config_load(m->tool_config_path, &tc) != MOERL_OK) return MOERL_ERR;
    json_t *schemas = tool_config_schemas(&tc);
    int rc = agent_loop_check_template(&tc); /* before anything runs (rl: before the warm start) */
    tool_config_free(&tc);
    for (int64_t i = 0; i < ds->n && rc == MOERL_OK; i++) {
        ds_row *r = &ds->rows[i];
        if (r->tools) continue;
        r->tools = json_incref(schemas);
        const chat_extra x = {r->tools, NULL};
        if (tokenizer_chat_check_ex(tok_current(), r->prompt, r->n_prompt, &x) != MOERL_OK) {
            char where[1100];
            rc = moerl_error_prefix("%s with the tools of rollout.multi_turn.tool_config_path %s: ",
                                    dataset_where(ds, r->line, where, sizeof where), m->tool_config_path);
        }
    }
    json_decref(schemas);
    return rc;
}
