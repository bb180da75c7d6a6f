/* Tests for the error buffer of base/common (moerl_errorf, moerl_error_prefix): a message built from
 * the previous message keeps every part of it (the case of an unknown data_source in `moerl rl`,
 * whose file:line prefix came out twice and whose bad name was lost). Exact string comparisons.
 * Also the message helpers beside it: moerl_plural, moerl_mem_available. */
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "data/tasks.h"
#include "test.h"

int main(void) {
    moerl_errorf("no reward function for data_source '%s'", "nosuch");
    moerl_errorf("%s:%d: %s", "data.jsonl", 7, moerl_last_error());
    CHECK(!strcmp(moerl_last_error(), "data.jsonl:7: no reward function for data_source 'nosuch'"), "got '%s'",
          moerl_last_error());
    /* the old text as the first argument, and twice */
    moerl_errorf("abc");
    moerl_errorf("%s-%s", moerl_last_error(), moerl_last_error());
    CHECK(!strcmp(moerl_last_error(), "abc-abc"), "got '%s'", moerl_last_error());
    /* a message that fills the buffer, then referred to: truncated, never garbled */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    moerl_errorf("%s", big);
    moerl_errorf("pre: %s", moerl_last_error());
    const char *e = moerl_last_error();
    size_t n = strlen(e);
    int all_x = n > 5;
    for (size_t i = 5; i < n; i++) all_x &= e[i] == 'x';
    CHECK(!strncmp(e, "pre: ", 5) && all_x && n < sizeof big, "long message: length %zu", n);
    /* moerl_error_prefix says the same */
    moerl_errorf("inner");
    moerl_error_prefix("%s: ", "outer");
    CHECK(!strcmp(moerl_last_error(), "outer: inner"), "got '%s'", moerl_last_error());
    /* the real chain: reward_fn_for's message, then a file:line context */
    CHECK(reward_fn_for("nosuch") == NULL, "unknown source accepted");
    moerl_errorf("%s:%d: %s", "f.jsonl", 3, moerl_last_error());
    CHECK(strstr(moerl_last_error(), "f.jsonl:3: ") == moerl_last_error() && strstr(moerl_last_error(), "'nosuch'") &&
              !strstr(moerl_last_error() + 1, "f.jsonl:3"),
          "got '%s'", moerl_last_error());
    /* moerl_plural: counts in messages read "1 layer", "2 layers", "0 layers" */
    char msg[64];
    for (long long k = 0; k < 3; k++) {
        snprintf(msg, sizeof msg, "%lld layer%s", k, moerl_plural(k));
        const char *want = k == 0 ? "0 layers" : k == 1 ? "1 layer" : "2 layers";
        CHECK(!strcmp(msg, want), "got '%s', want '%s'", msg, want);
    }
    /* moerl_mem_available: this machine's available memory, positive (Linux: MemAvailable) */
    CHECK(moerl_mem_available() > 0, "no available memory reported");
    TEST_MAIN_END();
}
