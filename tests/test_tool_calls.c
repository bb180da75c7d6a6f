/* Hermes tool-call parsing and the tool config loader (data/tool_calls.h): several calls per turn,
 * the text around them, malformed blocks and unknown tools as error calls, unclosed blocks as text;
 * tool files in both layouts, YAML core-schema scalars in the schema, and each refusal's message. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/tool_calls.h"
#include "test.h"

static const char TOOLS_YAML[] =
    "- type: function\n"
    "  function:\n"
    "    name: calc\n"
    "    description: Evaluate an arithmetic expression.\n"
    "    parameters:\n"
    "      type: object\n"
    "      properties:\n"
    "        expr: {type: string, description: 'e.g. 2+3'}\n"
    "        digits: {type: integer, enum: [1, 2, 10], default: ~}\n"
    "        exact: {type: boolean, default: true}\n"
    "        label: {type: string, enum: ['1', \"true\"]}\n"
    "      required: [expr]\n"
    "  command: python3 calc_env.py\n"
    "- function: {name: lookup, parameters: {type: object, properties: {k: {type: number, minimum: 0.5}}}}\n"
    "  url: http://127.0.0.1:8000/tool\n";

static int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

static void test_config(tool_config *tc) {
    CHECK(tool_config_load_string(TOOLS_YAML, strlen(TOOLS_YAML), "tools.yaml", tc) == MOERL_OK, "load: %s",
          moerl_last_error());
    CHECK(tc->n == 2 && !strcmp(tc->tools[0].name, "calc") && !strcmp(tc->tools[1].name, "lookup"), "names");
    CHECK(tc->tools[0].command && !strcmp(tc->tools[0].command, "python3 calc_env.py") && !tc->tools[0].url, "command");
    CHECK(tc->tools[1].url && !strcmp(tc->tools[1].url, "http://127.0.0.1:8000/tool") && !tc->tools[1].command, "url");
    CHECK(tool_config_find(tc, "lookup") == 1 && tool_config_find(tc, "nope") == -1, "find");
    /* the schema as JSON: plain scalars resolved by YAML's core schema, quoted ones stay strings */
    json_t *a = tool_config_schemas(tc);
    char *s = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS);
    const char *want =
        "[{\"function\":{\"description\":\"Evaluate an arithmetic expression.\",\"name\":\"calc\",\"parameters\":"
        "{\"properties\":{\"digits\":{\"default\":null,\"enum\":[1,2,10],\"type\":\"integer\"},\"exact\":{\"default\":"
        "true,\"type\":\"boolean\"},\"expr\":{\"description\":\"e.g. 2+3\",\"type\":\"string\"},\"label\":{\"enum\":"
        "[\"1\",\"true\"],\"type\":\"string\"}},\"required\":[\"expr\"],\"type\":\"object\"}},\"type\":\"function\"},"
        "{\"function\":{\"name\":\"lookup\",\"parameters\":{\"properties\":{\"k\":{\"minimum\":0.5,\"type\":\"number\"}},"
        "\"type\":\"object\"}},\"type\":\"function\"}]";
    CHECK(s && !strcmp(s, want), "schemas:\n got  %s\n want %s", s, want);
    free(s);
    json_decref(a);
    /* the `tools:` mapping layout */
    tool_config t2;
    const char *y2 = "tools:\n  - function: {name: a_b-c.d}\n    command: ./env\n";
    CHECK(tool_config_load_string(y2, strlen(y2), "t2.yaml", &t2) == MOERL_OK && t2.n == 1, "tools: layout: %s",
          moerl_last_error());
    tool_config_free(&t2);
}

static void config_error(const char *yaml, const char *want) {
    tool_config tc;
    int rc = tool_config_load_string(yaml, strlen(yaml), "bad.yaml", &tc);
    CHECK(rc == MOERL_ERR && has(moerl_last_error(), want) && has(moerl_last_error(), "bad.yaml") && tc.n == 0 &&
              !tc.tools,
          "refusal of %s: want '%s', got '%s'", yaml, want, rc ? moerl_last_error() : "(accepted)");
}

static void test_config_errors(void) {
    config_error("", "empty file");
    config_error("- [unclosed\n", "YAML error");
    config_error("a: 1\n", "non-empty list of tools");
    config_error("tools: []\n", "non-empty list");
    config_error("tools: [{function: {name: a}, command: x}]\nextra: 1\n", "only the key 'tools'");
    config_error("- 3\n", "tool 0: expected a mapping");
    config_error("- {function: {name: a}, command: x, timeout: 3}\n", "unknown key 'timeout'");
    config_error("- {function: {name: a, params: {}}, command: x}\n", "function: unknown key 'params'");
    config_error("- {type: tool, function: {name: a}, command: x}\n", "type must be \"function\"");
    config_error("- {function: {name: 'a b'}, command: x}\n", "function.name must be a name of letters, digits, '_', '-', '.', got 'a b'");
    config_error("- {function: {description: d}, command: x}\n", "function.name is missing");
    config_error("- {command: x}\n", "'function' must be a mapping");
    config_error("- {function: {name: a, parameters: [1]}, command: x}\n", "tool 0 (a): function.parameters");
    config_error("- {function: {name: a, description: [1]}, command: x}\n", "function.description");
    config_error("- {function: {name: a}}\n", "exactly one of command: or url:");
    config_error("- {function: {name: a}, command: x, url: y}\n", "exactly one of command: or url:");
    config_error("- {function: {name: a}, command: ''}\n", "command must be a non-empty string");
    config_error("- {function: {name: a}, url: 3}\n", "url must be a non-empty string");
    config_error("- {function: {name: a}, command: x}\n- {function: {name: a}, url: y}\n", "tool 1: the name 'a' is used twice");
    config_error("- {function: {name: a}, command: x, command: y}\n", "distinct scalars");
    tool_config tc;
    CHECK(tool_config_load("/nonexistent/tools.yaml", &tc) == MOERL_ERR &&
              has(moerl_last_error(), "rollout.multi_turn.tool_config_path") && has(moerl_last_error(), "/nonexistent/tools.yaml"),
          "missing file: %s", moerl_last_error());
}

static void test_parse(const tool_config *tools) {
    tool_calls tc;
    const char *t1 = "I will compute it.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"2+3\", \"digits\": 2}}\n"
                     "</tool_call>\n<tool_call>{\"name\":\"lookup\",\"arguments\":\"{\\\"k\\\": 1.5}\"}</tool_call>"
                     "<tool_call>{\"name\": \"calc\"}</tool_call>  ";
    CHECK(tool_calls_parse_hermes(t1, strlen(t1), tools, &tc) == MOERL_OK, "parse");
    CHECK(tc.n == 3 && tc.n_errors == 0, "three calls, no errors: n %d errors %d", tc.n, tc.n_errors);
    if (tc.n == 3) {
        CHECK(!strcmp(tc.calls[0].name, "calc") && !strcmp(tc.calls[0].arguments, "{\"expr\":\"2+3\",\"digits\":2}"),
              "call 0: %s %s", tc.calls[0].name, tc.calls[0].arguments);
        CHECK(!strcmp(tc.calls[1].name, "lookup") && !strcmp(tc.calls[1].arguments, "{\"k\":1.5}"),
              "call 1 (arguments as a JSON string): %s %s", tc.calls[1].name, tc.calls[1].arguments);
        CHECK(!strcmp(tc.calls[2].arguments, "{}"), "call 2 without arguments: %s", tc.calls[2].arguments);
    }
    CHECK(!strcmp(tc.content, "I will compute it."), "content '%s'", tc.content);
    tool_calls_free(&tc);
    /* malformed blocks become error calls, in order; an unclosed block stays text */
    const char *t2 = "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": }</tool_call>"
                     "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>"
                     "<tool_call>[1, 2]</tool_call>"
                     "<tool_call>{\"arguments\": {}}</tool_call>"
                     "<tool_call>{\"name\": \"calc\", \"arguments\": 7}</tool_call>"
                     "<tool_call>{\"name\": \"calc\", \"arguments\": \"not json\"}</tool_call>"
                     "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"1\"}}</tool_call>"
                     "done <tool_call>{\"name\": \"calc\"";
    CHECK(tool_calls_parse_hermes(t2, strlen(t2), tools, &tc) == MOERL_OK, "parse");
    const char *want[7] = {"not valid JSON", "unknown tool 'rm_rf'; the tools are: calc, lookup", "must be a JSON object",
                           "no \"name\"", "\"arguments\" must be a JSON object", "\"arguments\" must be a JSON object", NULL};
    CHECK(tc.n == 7 && tc.n_errors == 6, "n %d errors %d", tc.n, tc.n_errors);
    for (int i = 0; i < tc.n && i < 7; i++) {
        if (want[i]) CHECK(has(tc.calls[i].error, want[i]) && !tc.calls[i].arguments, "call %d: error '%s', want '%s'", i,
                           tc.calls[i].error, want[i]);
        else CHECK(!tc.calls[i].error && !strcmp(tc.calls[i].arguments, "{\"expr\":\"1\"}"), "call %d well formed", i);
    }
    CHECK(!strcmp(tc.content, "done <tool_call>{\"name\": \"calc\""), "unclosed block stays text: '%s'", tc.content);
    tool_calls_free(&tc);
    /* no tool list: any name is accepted; no blocks: no calls, the text trimmed */
    const char *t3 = "<tool_call>{\"name\": \"rm_rf\"}</tool_call>";
    CHECK(tool_calls_parse_hermes(t3, strlen(t3), NULL, &tc) == MOERL_OK && tc.n == 1 && !tc.calls[0].error, "any name");
    tool_calls_free(&tc);
    const char *t4 = "  The answer is 5.\n";
    CHECK(tool_calls_parse_hermes(t4, strlen(t4), tools, &tc) == MOERL_OK && tc.n == 0 && !strcmp(tc.content, "The answer is 5."),
          "no calls");
    tool_calls_free(&tc);
    CHECK(tool_calls_parse_hermes(NULL, 0, tools, &tc) == MOERL_ERR, "NULL text refused");
}

int main(void) {
    tool_config tc;
    test_config(&tc);
    test_config_errors();
    test_parse(&tc);
    tool_config_free(&tc);
    TEST_MAIN_END();
}
