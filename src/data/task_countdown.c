/* moerl — the "countdown" task family (see tasks.h): numbers and a target reachable with + - * /,
 * as in TinyZero's countdown task (verl/utils/reward_score/countdown.py; ideas only). The target
 * is built by combining all the numbers at random with positive integer intermediates, so every
 * problem has a solution, which is the SFT response. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/expr.h"
#include "data/task_family.h"

typedef struct {
    int64_t v;
    char s[256];
    int prec; /* 3 atom, 2 * /, 1 + - */
} cd_node;

static int op_prec(char op) { return op == '+' || op == '-' ? 1 : 2; }

static void cd_combine(const cd_node *a, char op, const cd_node *b, int64_t v, cd_node *out) {
    int pr = op_prec(op);
    bool pa = a->prec < pr, pb = b->prec < pr || (b->prec == pr && (op == '-' || op == '/'));
    snprintf(out->s, sizeof out->s, "%s%.120s%s%c%s%.120s%s", pa ? "(" : "", a->s, pa ? ")" : "", op, pb ? "(" : "", b->s,
             pb ? ")" : "");
    out->v = v;
    out->prec = pr;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* Draw n numbers in 1..max_number into nums and combine all of them at random (positive integer
 * intermediates) into nodes[0]: its value v is the target, its text s a solution. Redraws until
 * the target is in 1..max_target. */
static void cd_draw(rng_state *r, const task_opts *o, int n, int64_t *nums, cd_node *nodes) {
    for (;;) {
        for (int i = 0; i < n; i++) {
            nums[i] = task_rng_range(r, 1, o->countdown_max_number);
            nodes[i].v = nums[i];
            snprintf(nodes[i].s, sizeof nodes[i].s, "%lld", (long long)nums[i]);
            nodes[i].prec = 3;
        }
        int m = n;
        while (m > 1) {
            int i = (int)task_rng_range(r, 0, m - 1), j = (int)task_rng_range(r, 0, m - 2);
            if (j >= i) j++;
            cd_node a = nodes[i], b = nodes[j], c;
            char op = "+-*/"[task_rng_range(r, 0, 3)];
            if (op == '-' && a.v < b.v) { cd_node t = a; a = b; b = t; }
            if (op == '-' && a.v == b.v) op = '+';
            if (op == '/' && (b.v == 1 || a.v % b.v != 0)) op = '*';
            int64_t v = op == '+' ? a.v + b.v : op == '-' ? a.v - b.v : op == '*' ? a.v * b.v : a.v / b.v;
            cd_combine(&a, op, &b, v, &c);
            /* remove i and j, append c */
            int hi = i > j ? i : j, lo = i > j ? j : i;
            nodes[hi] = nodes[m - 1];
            nodes[lo] = nodes[m - 2];
            nodes[m - 2] = c;
            m--;
        }
        if (nodes[0].v >= 1 && nodes[0].v <= o->countdown_max_target) break;
    }
}

/* The disjointness key: the same multiset of numbers with the same target is the same problem in
 * any order ("target:sorted,numbers,"). */
static void cd_key(const int64_t *nums, int n, int64_t target, char *key, size_t cap) {
    int64_t sorted[8];
    memcpy(sorted, nums, sizeof(int64_t) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(int64_t), cmp_i64);
    size_t m = (size_t)snprintf(key, cap, "%lld:", (long long)target);
    for (int i = 0; i < n; i++) m += (size_t)snprintf(key + m, cap - m, "%lld,", (long long)sorted[i]);
}

void task_gen_countdown(rng_state *r, const task_opts *o, task_item *it) {
    int n = o->countdown_numbers;
    int64_t nums[8];
    cd_node nodes[8];
    memset(nodes, 0, sizeof nodes);
    cd_draw(r, o, n, nums, nodes);
    int64_t target = nodes[0].v;
    MOERL_ASSERT(countdown_verify(nodes[0].s, nums, n, target) == CD_VALID);
    char list[128];
    size_t m = 0;
    for (int i = 0; i < n; i++) m += (size_t)snprintf(list + m, sizeof list - m, "%s%lld", i ? ", " : "", (long long)nums[i]);
    snprintf(it->prompt, sizeof it->prompt,
             "Using the numbers [%s], write an equation that equals %lld. You may use +, -, *, / and parentheses, "
             "and each number at most once. Answer with the equation only.",
             list, (long long)target);
    snprintf(it->truth, sizeof it->truth, "{\"target\":%lld,\"numbers\":[%s]}", (long long)target, list);
    it->truth_json = 1;
    snprintf(it->response, sizeof it->response, "%s", nodes[0].s);
    cd_key(nums, n, target, it->key, sizeof it->key);
}
