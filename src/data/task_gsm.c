/* moerl — the "gsm8k-style" task family: templated grade-school word problems whose worked
 * solutions end "#### <answer>" like openai/gsm8k's (see tasks.h). */
#include <stdio.h>
#include <string.h>

#include "data/task_family.h"

static const char *const k_names[] = {"Ava",  "Ben",   "Chloe", "Dev",  "Emma", "Farid", "Grace", "Hiro",
                                      "Isla", "Jamal", "Kira",  "Liam", "Maya", "Noah",  "Olga",  "Priya"};
static const char k_he[] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0}; /* 1: he, 0: she */
static const char *const k_items[] = {"apples", "marbles", "stickers", "pencils", "cards", "shells", "coins", "beads"};

#define NAMES_N (int)(sizeof k_names / sizeof k_names[0])
#define ITEMS_N (int)(sizeof k_items / sizeof k_items[0])

/* "1 apple" / "3 apples": k_items are plurals in 's', so the singular drops that letter. */
static const char *noun_n(char *buf, size_t cap, long long n, const char *plural) {
    size_t len = strlen(plural);
    if (n == 1 && len > 1 && plural[len - 1] == 's') snprintf(buf, cap, "%.*s", (int)(len - 1), plural);
    else snprintf(buf, cap, "%s", plural);
    return buf;
}

const char task_gsm_instruction[] = " Think step by step and write the final answer after \"####\".";

/* The person and item of one problem, and the question (q) and worked solution (s) a template
 * writes. */
typedef struct {
    const char *N, *p, *P; /* name, "he"/"she", "He"/"She" */
    const char *item;      /* a plural noun from k_items */
    char q[700], s[900];
} gsm_text;

/* A template: draws its numbers from r, writes g->q and g->s, returns the integer answer. */
typedef long long (*gsm_template)(rng_state *r, gsm_text *g);

/* buy then give away */
static long long gsm_buy_give(rng_state *r, gsm_text *g) {
    const char *N = g->N, *p = g->p, *P = g->P, *item = g->item;
    char w1[32];
    long long a = task_rng_range(r, 5, 60), b = task_rng_range(r, 2, 40), sum = a + b, c = task_rng_range(r, 1, sum);
    long long ans = sum - c;
    snprintf(g->q, sizeof g->q, "%s has %lld %s. %s buys %lld more and then gives %lld to a friend. How many %s does %s have now?",
             N, a, item, P, b, c, item, N);
    snprintf(g->s, sizeof g->s, "%s starts with %lld %s. After buying %lld more, %s has %lld + %lld = %lld %s. After giving away %lld, %s has %lld - %lld = %lld %s.",
             N, a, item, b, p, a, b, sum, item, c, p, sum, c, ans, noun_n(w1, sizeof w1, ans, item));
    return ans;
}

/* full boxes plus loose items */
static long long gsm_boxes(rng_state *r, gsm_text *g) {
    const char *N = g->N, *item = g->item;
    char w1[32];
    long long a = task_rng_range(r, 3, 48), b = task_rng_range(r, 2, 25), c = task_rng_range(r, 1, a - 1), m = a * b;
    long long ans = m + c;
    snprintf(g->q, sizeof g->q, "A box holds %lld %s. %s has %lld full boxes and %lld loose %s. How many %s does %s have in total?",
             a, item, N, b, c, noun_n(w1, sizeof w1, c, item), item, N);
    snprintf(g->s, sizeof g->s, "The %lld boxes hold %lld * %lld = %lld %s. Adding the %lld loose %s gives %lld + %lld = %lld %s.",
             b, b, a, m, item, c, c == 1 ? "one" : "ones", m, c, ans, item);
    return ans;
}

/* wages */
static long long gsm_wages(rng_state *r, gsm_text *g) {
    const char *N = g->N, *P = g->P;
    long long a = task_rng_range(r, 8, 40), b = task_rng_range(r, 2, 10), c = task_rng_range(r, 2, 7), d = a * b;
    long long ans = d * c;
    snprintf(g->q, sizeof g->q, "%s earns $%lld per hour. %s works %lld hours a day for %lld days. How many dollars does %s earn in total?",
             N, a, P, b, c, N);
    snprintf(g->s, sizeof g->s, "Each day %s earns %lld * %lld = %lld dollars. Over %lld days that is %lld * %lld = %lld dollars.",
             N, a, b, d, c, d, c, ans);
    return ans;
}

/* sharing equally */
static long long gsm_sharing(rng_state *r, gsm_text *g) {
    const char *N = g->N;
    long long b = task_rng_range(r, 2, 12), qq = task_rng_range(r, 2, 20), k = task_rng_range(r, 1, 15), rest = b * qq, a = rest + k;
    long long ans = qq;
    snprintf(g->q, sizeof g->q, "%s bakes %lld cookies, keeps %lld and shares the rest equally among %lld friends. How many cookies does each friend get?",
             N, a, k, b);
    snprintf(g->s, sizeof g->s, "%s shares %lld - %lld = %lld cookies. Each of the %lld friends gets %lld / %lld = %lld cookies.",
             N, a, k, rest, b, rest, b, ans);
    return ans;
}

/* two-leg trip */
static long long gsm_trip(rng_state *r, gsm_text *g) {
    char w1[32], w2[32];
    long long a = task_rng_range(r, 20, 90), b = task_rng_range(r, 1, 6), c = task_rng_range(r, 20, 90), d = task_rng_range(r, 1, 6);
    long long x = a * b, y = c * d;
    long long ans = x + y;
    snprintf(g->q, sizeof g->q, "A train travels at %lld miles per hour for %lld %s, then at %lld miles per hour for %lld %s. How many miles does it travel in total?",
             a, b, noun_n(w1, sizeof w1, b, "hours"), c, d, noun_n(w2, sizeof w2, d, "hours"));
    snprintf(g->s, sizeof g->s, "The first part is %lld * %lld = %lld miles. The second part is %lld * %lld = %lld miles. In total it travels %lld + %lld = %lld miles.",
             a, b, x, c, d, y, x, y, ans);
    return ans;
}

/* change from a bill */
static long long gsm_change(rng_state *r, gsm_text *g) {
    const char *N = g->N;
    char w1[32];
    long long a = task_rng_range(r, 2, 12), b = task_rng_range(r, 1, 15), t = a * b;
    static const long long bills[] = {20, 50, 100, 200};
    int first = 0;
    while (bills[first] <= t) first++;
    long long c = bills[task_rng_range(r, first, 3)];
    long long ans = c - t;
    snprintf(g->q, sizeof g->q, "%s buys %lld notebooks at $%lld each and pays with a $%lld bill. How much change, in dollars, does %s get?",
             N, a, b, c, N);
    snprintf(g->s, sizeof g->s, "The notebooks cost %lld * %lld = %lld dollars. The change is %lld - %lld = %lld %s.",
             a, b, t, c, t, ans, noun_n(w1, sizeof w1, ans, "dollars"));
    return ans;
}

/* percentages */
static long long gsm_percent(rng_state *r, gsm_text *g) {
    char w1[32], w2[32];
    long long k = task_rng_range(r, 1, 10), a = 20 * k, pc = 5 * task_rng_range(r, 1, 19), girls = a * pc / 100;
    long long ans = a - girls;
    snprintf(g->q, sizeof g->q, "There are %lld students in a class and %lld%% of them are girls. How many boys are in the class?",
             a, pc);
    snprintf(g->s, sizeof g->s, "There are %lld * %lld / 100 = %lld %s, so there are %lld - %lld = %lld %s.",
             a, pc, girls, noun_n(w1, sizeof w1, girls, "girls"), a, girls, ans, noun_n(w2, sizeof w2, ans, "boys"));
    return ans;
}

/* pages left */
static long long gsm_pages(rng_state *r, gsm_text *g) {
    const char *N = g->N, *p = g->p;
    long long a = task_rng_range(r, 5, 40), t = 2 * a, sum = a + t, c = sum + task_rng_range(r, 1, 200);
    long long ans = c - sum;
    snprintf(g->q, sizeof g->q, "%s reads %lld pages of a %lld-page book on Monday and twice as many pages on Tuesday. How many pages are left to read?",
             N, a, c);
    snprintf(g->s, sizeof g->s, "On Tuesday %s reads 2 * %lld = %lld pages. So far %s has read %lld + %lld = %lld pages, so %lld - %lld = %lld %s left.",
             p, a, t, p, a, t, sum, c, sum, ans, ans == 1 ? "page is" : "pages are");
    return ans;
}

static const gsm_template k_templates[8] = {gsm_buy_give, gsm_boxes,  gsm_wages,   gsm_sharing,
                                            gsm_trip,     gsm_change, gsm_percent, gsm_pages};

void task_gen_gsm(rng_state *r, const task_opts *o, task_item *it) {
    (void)o;
    gsm_text g;
    int ni = (int)task_rng_range(r, 0, NAMES_N - 1);
    g.N = k_names[ni];
    g.p = k_he[ni] ? "he" : "she";
    g.P = k_he[ni] ? "He" : "She";
    g.item = k_items[task_rng_range(r, 0, ITEMS_N - 1)];
    long long ans = k_templates[task_rng_range(r, 0, 7)](r, &g);
    snprintf(it->prompt, sizeof it->prompt, "%s%s", g.q, task_gsm_instruction);
    snprintf(it->truth, sizeof it->truth, "%lld", ans);
    snprintf(it->response, sizeof it->response, "%s\n#### %lld", g.s, ans);
}
