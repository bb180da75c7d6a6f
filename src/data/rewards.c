/* moerl — rule-based reward functions and the data_source → reward dispatch (see rewards.h).
 *
 * Sources for the semantics (ideas only, no code taken):
 *   verl/utils/reward_score/gsm8k.py      "#### " extraction, last-300-character window, format_score 0
 *   verl/utils/reward_score/countdown.py  the countdown task (TinyZero): numbers + target, equation answer
 *   verl/utils/reward_score/__init__.py   default_compute_score: which data sources use the math scorer
 */
#include "data/rewards.h"

#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/expr.h"
#include "data/math_answer.h"

#define TOOL_RESPONSE_CLOSE "</tool_response>"
#define TOOL_ANSWER_MARK "Answer:"

/* Exact decimal in canonical form: sign, integer digits without leading zeros, fraction
 * digits without trailing zeros; "-0" becomes "0". */
typedef struct {
    char text[130];
} decimal;

/* Parse a number at s[i] per the grammar in rewards.h (sign decided by the caller). Returns the
 * end index, or i if there is no number there. */
static size_t scan_number(const char *s, size_t i, char *digits, size_t cap, size_t *frac_at) {
    size_t j = i, m = 0;
    *frac_at = (size_t)-1;
    if (!isdigit((unsigned char)s[j])) return i;
    for (;;) {
        while (isdigit((unsigned char)s[j])) {
            if (m + 1 < cap) digits[m++] = s[j];
            j++;
        }
        /* thousands group: ',' followed by exactly three digits */
        if (s[j] == ',' && isdigit((unsigned char)s[j + 1]) && isdigit((unsigned char)s[j + 2]) &&
            isdigit((unsigned char)s[j + 3]) && !isdigit((unsigned char)s[j + 4])) {
            j++;
            continue;
        }
        break;
    }
    if (s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
        *frac_at = m;
        j++;
        while (isdigit((unsigned char)s[j])) {
            if (m + 1 < cap) digits[m++] = s[j];
            j++;
        }
    }
    digits[m] = 0;
    return j;
}

static void canon_decimal(bool neg, const char *digits, size_t frac_at, decimal *out) {
    size_t n = strlen(digits);
    size_t int_len = frac_at == (size_t)-1 ? n : frac_at;
    size_t a = 0;
    while (a + 1 < int_len && digits[a] == '0') a++;
    size_t fend = n;
    while (fend > int_len && digits[fend - 1] == '0') fend--;
    char buf[128];
    size_t m = 0;
    for (size_t k = a; k < int_len && m + 2 < sizeof buf; k++) buf[m++] = digits[k];
    if (int_len == 0) buf[m++] = '0';
    if (fend > int_len) {
        buf[m++] = '.';
        for (size_t k = int_len; k < fend && m + 1 < sizeof buf; k++) buf[m++] = digits[k];
    }
    buf[m] = 0;
    bool zero = strcmp(buf, "0") == 0;
    snprintf(out->text, sizeof out->text, "%s%s", neg && !zero ? "-" : "", buf);
}

static bool sign_allowed_before(const char *s, size_t i) {
    if (i == 0) return true;
    unsigned char c = (unsigned char)s[i - 1];
    return !(isalnum(c) || c == ')');
}

/* The last number in s; false if none. */
static bool last_number(const char *s, decimal *out) {
    bool found = false;
    size_t i = 0, n = strlen(s);
    char digits[100];
    while (i < n) {
        if (isdigit((unsigned char)s[i]) && (i == 0 || !isdigit((unsigned char)s[i - 1]))) {
            size_t fa;
            size_t j = scan_number(s, i, digits, sizeof digits, &fa);
            bool neg = i > 0 && s[i - 1] == '-' && sign_allowed_before(s, i - 1);
            canon_decimal(neg, digits, fa, out);
            found = true;
            i = j;
        } else {
            i++;
        }
    }
    return found;
}

/* The whole (trimmed) string as one number. */
static bool whole_number(const char *s, decimal *out) {
    while (isspace((unsigned char)*s)) s++;
    bool neg = false;
    if (*s == '-' || *s == '+') { neg = *s == '-'; s++; }
    char digits[100];
    size_t fa;
    size_t j = scan_number(s, 0, digits, sizeof digits, &fa);
    if (j == 0) return false;
    while (isspace((unsigned char)s[j])) j++;
    if (s[j]) return false;
    canon_decimal(neg, digits, fa, out);
    return true;
}

/* reward_exact_number with the extracted answer: the last number in canonical form. */
static int exact_number_pred(const char *response, const char *ground_truth, double *score, char **pred) {
    decimal want, got;
    *score = 0.0;
    if (!whole_number(ground_truth, &want))
        return moerl_errorf("reward_exact_number: ground truth '%.100s' is not a number", ground_truth);
    if (last_number(response, &got)) {
        if (strcmp(got.text, want.text) == 0) *score = 1.0;
        if (pred) *pred = xstrdup(got.text);
    }
    return MOERL_OK;
}

int reward_exact_number(const char *response, const char *ground_truth, double *score) {
    return exact_number_pred(response, ground_truth, score, NULL);
}

/* The final assistant turn of a multi-turn response: the text after the last "</tool_response>" (the
 * tool turns' closing, as Qwen3's template and examples/tool_use's write it), or the whole response. */
static const char *final_turn(const char *response) {
    const char *tail = response, *p;
    while ((p = strstr(tail, TOOL_RESPONSE_CLOSE))) tail = p + strlen(TOOL_RESPONSE_CLOSE);
    return tail;
}

/* reward_tool_answer with the extracted answer: the number after the final turn's last "Answer:". */
static int tool_answer_pred(const char *response, const char *ground_truth, double *score, char **pred) {
    decimal want, got;
    *score = 0.0;
    if (!whole_number(ground_truth, &want))
        return moerl_errorf("reward_tool_answer: ground truth '%.100s' is not a number", ground_truth);
    const char *s = final_turn(response), *p, *at = NULL;
    while ((p = strstr(s, TOOL_ANSWER_MARK))) at = s = p + strlen(TOOL_ANSWER_MARK);
    if (!at) return MOERL_OK;
    while (*at == ' ' || *at == '\t') at++;
    bool neg = *at == '-';
    if (neg) at++;
    char digits[100];
    size_t fa;
    if (scan_number(at, 0, digits, sizeof digits, &fa) == 0) return MOERL_OK;
    canon_decimal(neg, digits, fa, &got);
    if (strcmp(got.text, want.text) == 0) *score = 1.0;
    if (pred) *pred = xstrdup(got.text);
    return MOERL_OK;
}

int reward_tool_answer(const char *response, const char *ground_truth, double *score) {
    return tool_answer_pred(response, ground_truth, score, NULL);
}

#define GSM8K_CLIP_CHARS 300 /* verl gsm8k.py _SOLUTION_CLIP_CHARS */

static bool gsm8k_class(char c) { return isdigit((unsigned char)c) || c == '.' || c == ','; }

/* reward_gsm8k with the extracted answer: the last "#### " answer without ',' and '$'. */
static int gsm8k_pred(const char *response, const char *ground_truth, double *score, char **pred) {
    *score = 0.0;
    /* keep the last 300 characters (code points: skip UTF-8 continuation bytes when counting) */
    size_t n = strlen(response), start = n;
    int chars = 0;
    while (start > 0 && chars < GSM8K_CLIP_CHARS) {
        start--;
        if (((unsigned char)response[start] & 0xC0) != 0x80) chars++;
    }
    const char *s = response + start;
    size_t len = n - start, i = 0;
    const char *best = NULL;
    size_t best_len = 0;
    while (i + 5 <= len) {
        if (memcmp(s + i, "#### ", 5) != 0) { i++; continue; }
        size_t j = i + 5, k;
        if (j < len && s[j] == '-' && j + 1 < len && gsm8k_class(s[j + 1])) k = j + 1;
        else if (j < len && gsm8k_class(s[j])) k = j;
        else { i++; continue; }
        while (k < len && gsm8k_class(s[k])) k++;
        best = s + j;
        best_len = k - j;
        i = k; /* findall: matches do not overlap */
    }
    if (!best) return MOERL_OK;
    char *ans = xmalloc(best_len + 1);
    size_t m = 0;
    for (size_t t = 0; t < best_len; t++)
        if (best[t] != ',' && best[t] != '$') ans[m++] = best[t];
    ans[m] = 0;
    if (strcmp(ans, ground_truth) == 0) *score = 1.0;
    if (pred) *pred = ans;
    else free(ans);
    return MOERL_OK;
}

int reward_gsm8k(const char *response, const char *ground_truth, double *score) {
    return gsm8k_pred(response, ground_truth, score, NULL);
}

/* Parse {"target": int, "numbers": [int, ...]}; numbers (≤ 64) into nums. */
static int countdown_truth(const char *gt, int64_t *target, int64_t *nums, int *n) {
    json_error_t e;
    json_t *o = json_loads(gt, 0, &e);
    const char *want = "expected {\"target\": int, \"numbers\": [int, ...]}";
    if (!o) return moerl_errorf("countdown ground truth '%.100s': not JSON (%s); %s", gt, e.text, want);
    int rc = MOERL_ERR;
    json_t *t = json_object_get(o, "target"), *ns = json_object_get(o, "numbers");
    if (!json_is_object(o) || !json_is_integer(t) || !json_is_array(ns) || json_array_size(ns) == 0 ||
        json_array_size(ns) > 64) {
        moerl_errorf("countdown ground truth '%.100s': %s (1 to 64 numbers)", gt, want);
        goto done;
    }
    *target = json_integer_value(t);
    *n = (int)json_array_size(ns);
    for (int i = 0; i < *n; i++) {
        json_t *x = json_array_get(ns, (size_t)i);
        if (!json_is_integer(x)) {
            moerl_errorf("countdown ground truth '%.100s': numbers[%d] is not an integer; %s", gt, i, want);
            goto done;
        }
        nums[i] = json_integer_value(x);
    }
    rc = MOERL_OK;
done:
    json_decref(o);
    return rc;
}

/* The equation text of a countdown response (heap), see reward_countdown. */
static char *countdown_extract(const char *r) {
    const char *a = NULL, *b = NULL;
    for (const char *p = r; (p = strstr(p, "<answer>")) != NULL;) {
        const char *q = strstr(p + 8, "</answer>");
        if (!q) break;
        a = p + 8;
        b = q;
        p = q + 9;
    }
    if (!a) {
        /* last non-empty line */
        const char *end = r + strlen(r);
        for (;;) {
            while (end > r && isspace((unsigned char)end[-1])) end--;
            const char *st = end;
            while (st > r && st[-1] != '\n') st--;
            a = st;
            b = end;
            break;
        }
    }
    while (a < b && isspace((unsigned char)*a)) a++;
    while (b > a && (isspace((unsigned char)b[-1]) || b[-1] == '.')) b--;
    char *s = xmalloc((size_t)(b - a) + 1);
    memcpy(s, a, (size_t)(b - a));
    s[b - a] = 0;
    return s;
}

/* reward_countdown with the extracted answer: the equation text (NULL when empty). */
static int countdown_pred(const char *response, const char *ground_truth, double *score, char **pred) {
    int64_t target = 0, nums[64];
    int n = 0;
    *score = 0.0;
    if (countdown_truth(ground_truth, &target, nums, &n)) return MOERL_ERR;
    char *eq = countdown_extract(response);
    if (*eq && countdown_verify(eq, nums, n, target) == CD_VALID) *score = 1.0;
    if (pred && *eq) *pred = eq;
    else free(eq);
    return MOERL_OK;
}

int reward_countdown(const char *response, const char *ground_truth, double *score) {
    return countdown_pred(response, ground_truth, score, NULL);
}

int reward_math(const char *response, const char *ground_truth, double *score) {
    return math_answer_score(response, ground_truth, score, NULL);
}

/* A built-in reward that also reports the answer it extracted (reward_score). */
typedef int (*reward_pred_fn)(const char *response, const char *ground_truth, double *score, char **pred);

/* prefix: the data_source only has to start with `source` (verl: data_source.startswith("aime")). */
static const struct {
    const char *source;
    bool prefix;
    reward_fn fn;
    reward_pred_fn pred_fn;
} k_rewards[] = {
    {"arith", false, reward_exact_number, exact_number_pred},
    {"gsm8k-style", false, reward_gsm8k, gsm8k_pred},
    {"gsm8k", false, reward_gsm8k, gsm8k_pred},
    {"openai/gsm8k", false, reward_gsm8k, gsm8k_pred},
    {"countdown", false, reward_countdown, countdown_pred},
    {"tool_arith", false, reward_tool_answer, tool_answer_pred},
    {"math", false, reward_math, math_answer_score},
    {"lighteval/MATH", false, reward_math, math_answer_score},
    {"DigitalLearningGmbH/MATH-lighteval", false, reward_math, math_answer_score},
    {"HuggingFaceH4/MATH-500", false, reward_math, math_answer_score},
    {"math_dapo", false, reward_math, math_answer_score},
    {"math_dapo_reasoning", false, reward_math, math_answer_score},
    {"aime", true, reward_math, math_answer_score},
};
#define N_REWARDS (sizeof k_rewards / sizeof k_rewards[0])

/* The table index of data_source, or -1 with an error naming the known sources. */
static int reward_index(const char *data_source) {
    for (size_t i = 0; i < N_REWARDS; i++) {
        size_t L = strlen(k_rewards[i].source);
        if (k_rewards[i].prefix ? strncmp(k_rewards[i].source, data_source, L) == 0
                                : strcmp(k_rewards[i].source, data_source) == 0)
            return (int)i;
    }
    char known[512] = "";
    for (size_t i = 0; i < N_REWARDS; i++) {
        strcat(known, i ? ", " : "");
        strcat(known, k_rewards[i].source);
        if (k_rewards[i].prefix) strcat(known, "*");
    }
    moerl_errorf("no reward function for data_source '%s' (known: %s)", data_source, known);
    return -1;
}

reward_fn reward_fn_for(const char *data_source) {
    int i = reward_index(data_source);
    return i < 0 ? NULL : k_rewards[i].fn;
}

int reward_row(const ds_row *r, const char *response, double *score) {
    reward_fn fn = reward_fn_for(r->data_source);
    if (!fn) return moerl_error_prefix("row at line %lld: ", (long long)r->line);
    if (fn(response, r->ground_truth, score)) return moerl_error_prefix("row at line %lld: ", (long long)r->line);
    return MOERL_OK;
}

int reward_score(const char *data_source, const char *response, const char *ground_truth, double *score, char **pred) {
    if (pred) *pred = NULL;
    int i = reward_index(data_source);
    if (i < 0) return MOERL_ERR;
    return k_rewards[i].pred_fn(response, ground_truth, score, pred);
}
