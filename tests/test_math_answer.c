/* The math-answer verifier (src/data/math_answer.h) and the extracted answers of every built-in
 * reward (reward_score's pred, src/data/rewards.h).
 *
 * 1. Python parity: $MOERL_TESTDATA/math_answers_ref.jsonl (tests/ref/gen_math_answers.py, an
 *    independent Python implementation of the same rules with fractions.Fraction, over the corpus
 *    tests/ref/math_answers.jsonl): moerl's score and pred must equal the reference's exactly, case
 *    by case, for every math data source (scores are 0/1 and preds are strings: no tolerance).
 * 2. Hand-written checks: the data sources that reach the verifier, the ground-truth error, the
 *    pred of arith, gsm8k and countdown, and the building blocks (extract, normalise, equal).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/math_answer.h"
#include "data/rewards.h"
#include "test.h"

static int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

static int str_eq(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

/* One reference case through reward_score(source). Returns 1 when score and pred agree. */
static int check_case(const char *source, json_t *c, int *printed) {
    const char *resp = json_string_value(json_object_get(c, "response"));
    const char *gt = json_string_value(json_object_get(c, "ground_truth"));
    double want = json_number_value(json_object_get(c, "score"));
    json_t *jp = json_object_get(c, "pred");
    const char *want_pred = json_is_string(jp) ? json_string_value(jp) : NULL;
    double got = -1;
    char *pred = NULL;
    int rc = reward_score(source, resp, gt, &got, &pred);
    int ok = rc == MOERL_OK && got == want && str_eq(pred, want_pred);
    if (!ok && (*printed)++ < 40)
        fprintf(stderr, "MISMATCH %s corpus line %lld: response %s | ground truth %s | moerl score %g pred %s%s%s "
                        "| reference score %g pred %s%s%s%s%s\n",
                source, (long long)json_integer_value(json_object_get(c, "line")), resp, gt, got, pred ? "'" : "",
                pred ? pred : "null", pred ? "'" : "", want, want_pred ? "'" : "", want_pred ? want_pred : "null",
                want_pred ? "'" : "", rc ? " error: " : "", rc ? moerl_last_error() : "");
    free(pred);
    return ok;
}

static void test_reference(void) {
    const char *d = getenv("MOERL_TESTDATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/math_answers_ref.jsonl", d ? d : "build/testdata");
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s: run tests/ref/gen_math_answers.py first (bash tests/run.sh gen_math_answers "
                     "test_math_answer)", path);
    if (!f) return;
    static const char *const sources[] = {"math", "lighteval/MATH", "HuggingFaceH4/MATH-500", "math_dapo", "aime2024"};
    char line[65536];
    int n = 0, bad = 0, printed = 0, ones = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *c = json_loads(line, 0, &e);
        if (!c) {
            CHECK(0, "%s: bad JSON line: %s", path, e.text);
            continue;
        }
        n++;
        ones += json_number_value(json_object_get(c, "score")) == 1.0;
        for (size_t s = 0; s < sizeof sources / sizeof sources[0]; s++) bad += !check_case(sources[s], c, &printed);
        json_decref(c);
    }
    fclose(f);
    CHECK(n >= 150, "the corpus has %d cases, expected at least 150", n);
    CHECK(ones >= 40 && n - ones >= 40, "the corpus should hold at least 40 right and 40 wrong answers: %d of %d score 1",
          ones, n);
    CHECK(bad == 0, "%d of %d (case, data source) pairs differ from the Python reference (first 40 above)", bad,
          n * 5);
    printf("reference: %d cases × 5 data sources compared, %d mismatches\n", n, bad);
}

static void test_sources(void) {
    static const char *const math[] = {"math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
                                       "HuggingFaceH4/MATH-500", "math_dapo", "math_dapo_reasoning",
                                       "aime2024", "aime"};
    for (size_t i = 0; i < sizeof math / sizeof math[0]; i++)
        CHECK(reward_fn_for(math[i]) == reward_math, "%s → reward_math", math[i]);
    CHECK(reward_fn_for("openai/gsm8k") == reward_gsm8k, "gsm8k keeps verl's strict rule");
    CHECK(reward_fn_for("MATH") == NULL && has(moerl_last_error(), "'MATH'") && has(moerl_last_error(), "aime*"),
          "unknown source names the known ones: %s", moerl_last_error());
    double s = -1;
    char *pred = (char *)1;
    CHECK(reward_score("math", "\\boxed{1}", "  $ $ ", &s, &pred) == MOERL_ERR && pred == NULL &&
              has(moerl_last_error(), "empty after normalisation") && has(moerl_last_error(), "'  $ $ '"),
          "empty ground truth is an error naming it: %s", moerl_last_error());
    CHECK(reward_math("The answer is \\boxed{\\frac{3}{4}}", "0.75", &s) == MOERL_OK && s == 1.0, "reward_math");
    CHECK(reward_score("nosuch", "1", "1", &s, &pred) == MOERL_ERR && pred == NULL, "unknown source: pred NULL");
}

/* reward_score's pred for the other built-in rewards. */
static void test_preds(void) {
    double s;
    char *p = NULL;
    CHECK(reward_score("arith", "so 12 then 1,234.50", "1234.5", &s, &p) == MOERL_OK && s == 1.0 && str_eq(p, "1234.5"),
          "arith pred: %s", p ? p : "null");
    free(p);
    CHECK(reward_score("arith", "no number", "3", &s, &p) == MOERL_OK && s == 0.0 && p == NULL, "arith no pred");
    CHECK(reward_score("gsm8k", "work\n#### 1,234", "1234", &s, &p) == MOERL_OK && s == 1.0 && str_eq(p, "1234"),
          "gsm8k pred: %s", p ? p : "null");
    free(p);
    CHECK(reward_score("openai/gsm8k", "#### 7\nthen #### 8", "7", &s, &p) == MOERL_OK && s == 0.0 && str_eq(p, "8"),
          "gsm8k pred is the last marker, wrong answer: %s", p ? p : "null");
    free(p);
    CHECK(reward_score("gsm8k-style", "the answer is 5", "5", &s, &p) == MOERL_OK && s == 0.0 && p == NULL,
          "gsm8k strict: no marker, no pred");
    const char *gt = "{\"target\": 24, \"numbers\": [4, 6, 1]}";
    CHECK(reward_score("countdown", "think\n<answer> 4*6*1 </answer>", gt, &s, &p) == MOERL_OK && s == 1.0 &&
              str_eq(p, "4*6*1"),
          "countdown pred: %s", p ? p : "null");
    free(p);
    CHECK(reward_score("countdown", "   \n", gt, &s, &p) == MOERL_OK && s == 0.0 && p == NULL, "countdown no pred");
    CHECK(reward_score("math", "So \\boxed{0.50}", "\\frac12", &s, &p) == MOERL_OK && s == 1.0 && str_eq(p, "1/2"),
          "math pred is canonical: %s", p ? p : "null");
    free(p);
    CHECK(reward_score("math", "\\boxed{\\sqrt2}", "2", &s, &p) == MOERL_OK && s == 0.0 && str_eq(p, "\\sqrt{2}"),
          "math pred of a non-number: %s", p ? p : "null");
    free(p);
}

static void test_parts(void) {
    char *x = math_answer_extract("a \\boxed{\\frac{a}{\\{b\\}}} b");
    CHECK(str_eq(x, "\\frac{a}{\\{b\\}}"), "nested extract: %s", x ? x : "null");
    free(x);
    x = math_answer_extract("nothing here");
    CHECK(x == NULL, "no answer");
    x = math_answer_normalize(" \\left( 1{,}5 \\right) ");
    CHECK(str_eq(x, "(1{,}5)"), "normalize: %s", x);
    free(x);
    CHECK(math_answer_equal("0.75", "\\frac{3}{4}") && !math_answer_equal("0.75", "\\frac{3}{5}"), "equal");
    CHECK(math_answer_equal("[1,\\frac{1}{2})", "[1,0.5)") && !math_answer_equal("[1,0.5)", "(1,0.5)"), "lists");
    x = math_answer_canonical("-\\frac{4}{6}");
    CHECK(str_eq(x, "-2/3"), "canonical: %s", x);
    free(x);
    /* a long response: extraction is linear, no fixed-size buffer */
    size_t n = 1 << 20;
    char *big = malloc(n + 32);
    memset(big, 'x', n);
    strcpy(big + n, " \\boxed{17}");
    double s;
    CHECK(reward_math(big, "17", &s) == MOERL_OK && s == 1.0, "1 MiB response");
    free(big);
}

int main(void) {
    test_reference();
    test_sources();
    test_preds();
    test_parts();
    TEST_MAIN_END();
}
