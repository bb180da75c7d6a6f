/* moerl — the "tool_arith" task family: multiplication of numbers too large for a small model to
 * compute in its head, answered with a calculator tool over two assistant turns (see tasks.h). */
#include <stdio.h>
#include <string.h>

#include "data/task_family.h"

/* The calc tool as the rows' "tools" carry it (an OpenAI function schema; the same as
 * examples/tool_use/tools.yaml declares, so the prompt renders alike in SFT and in rollouts). */
const char task_tool_arith_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"calc\",\"description\":\"Evaluate an integer expression "
    "exactly (+ - * and parentheses).\",\"parameters\":{\"type\":\"object\",\"properties\":{\"expr\":{\"type\":"
    "\"string\",\"description\":\"e.g. 1234*5678\"}},\"required\":[\"expr\"]}}}]";

void task_gen_tool_arith(rng_state *r, const task_opts *o, task_item *it) {
    int64_t lo = 1, hi;
    for (int i = 1; i < o->arith_digits; i++) lo *= 10;
    hi = lo * 10 - 1;
    if (o->arith_digits == 1) lo = 2;
    const int64_t a = task_rng_range(r, lo, hi), b = task_rng_range(r, lo, hi);
    const long long c = (long long)(a * b); /* ≤ 18 digits: arith_digits ≤ 9 */
    char expr[64];
    snprintf(expr, sizeof expr, "%lld*%lld", (long long)a, (long long)b);
    snprintf(it->prompt, sizeof it->prompt, "Compute %s.", expr);
    snprintf(it->truth, sizeof it->truth, "%lld", c);
    /* the demonstration: a hermes tool call, the calculator's answer (calc_env.py's content: the
     * integer), then the final turn restating it; JSON text of the messages (escaped by hand: the
     * strings hold only digits, '*' and the quotes below) */
    snprintf(it->response, sizeof it->response,
             "[{\"role\":\"assistant\",\"content\":\"<tool_call>{\\\"name\\\":\\\"calc\\\",\\\"arguments\\\":"
             "{\\\"expr\\\":\\\"%s\\\"}}</tool_call>\"},{\"role\":\"tool\",\"content\":\"%lld\"},"
             "{\"role\":\"assistant\",\"content\":\"Answer: %lld\"}]",
             expr, c, c);
    it->response_json = 1;
}
