/* Multi-turn rollouts with tools: the rollout.multi_turn.* keys (verl's names and defaults).
 *
 *   rollout.multi_turn.enable                trajectories of assistant and tool turns (false)
 *   rollout.multi_turn.max_assistant_turns   assistant turns per trajectory at most (0 = no limit
 *                                            but data.max_response_length, which bounds all turns)
 *   rollout.multi_turn.max_tool_response_length  characters of a tool response kept (256)
 *   rollout.multi_turn.format                how the model writes tool calls: hermes (data/tool_calls.h)
 *   rollout.multi_turn.tool_config_path      the tools: a YAML list (data/tool_calls.h)
 *
 * The rollouter's agent loop (rl/agent_loop.h) runs the trajectories; the environment client's keys
 * (rollout.multi_turn.tool_*) are reward/env.h's. A multi_turn key changed from its default while
 * enable is false is refused (never accepted and ignored).
 *
 * Layer: rl (uses data).
 */
#ifndef MOERL_RL_MULTI_TURN_H
#define MOERL_RL_MULTI_TURN_H

#include "base/config.h"
#include "data/dataset.h"
#include "data/tool_calls.h"
#include "reward/env.h"

typedef struct {
    int enable;
    int max_assistant_turns;      /* 0 = no limit */
    int max_tool_response_length; /* characters, > 0 */
    char format[16];              /* "hermes" */
    char tool_config_path[1024];  /* "" = none */
    env_config env;               /* rollout.multi_turn.tool_* (reward/env.h) */
} multi_turn_config;

/* Declare rollout.multi_turn.* with their help (the tool_* keys through env_def_keys). */
void multi_turn_def_keys(cfg *c);
/* Read and check rollout.multi_turn.*: max_assistant_turns ≥ 0, max_tool_response_length > 0, format
 * hermes, tool_config_path required with enable and loadable (tool_config_load's errors); any key
 * off its default while enable is false is an error naming the key. */
int multi_turn_read_config(const cfg *c, multi_turn_config *m);

/* m->enable: every row of ds without its own "tools" gets the tool config's function schemas
 * (tool_config_schemas), so that its prompt renders them — the rollouts', validation's, the warm
 * start's and moerl eval's; rows with their own keep them. Each such row is checked against the
 * current tokenizer's chat template (a template that cannot render tools is named). Errors: the tool
 * config's (tool_config_load), the template's, naming the row. */
int multi_turn_attach_tools(const multi_turn_config *m, dataset *ds);

#endif
