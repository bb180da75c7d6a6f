/* trainer_state.json (src/rl/state.c): the writer's text reads back to the same struct; every kind of
 * damage is refused with a message naming the file and the field and saying what to do; another
 * data set or seed is refused as such; the writer refuses a state the reader would refuse. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "rl/state.h"
#include "test.h"

#define PATH "runs/x/checkpoint/trainer_state.json"

static rl_state sample(int64_t *uids) {
    uids[0] = 5;
    uids[1] = 100 + 7; /* epoch 1 (n_rows 100), row 7 */
    uids[2] = 200 + 99; /* epoch 2 = feed_epoch + 1: started past the end of the epoch */
    return (rl_state){.version = 12, .trainer_step = 48, .optimizer_step = 47, .optimizer_skipped = 1,
                      .consumed_prompts = 190, .feed_epoch = 1, .feed_pos = 100, .seed = 0xfedcba9876543210ULL,
                      .n_rows = 100, .data_fingerprint = 0x00c0ffee12345678ULL, .unconsumed_started = uids,
                      .n_unconsumed = 3, .samples_log_bytes = 123456};
}

static int same(const rl_state *a, const rl_state *b) {
    if (a->version != b->version || a->trainer_step != b->trainer_step || a->optimizer_step != b->optimizer_step ||
        a->optimizer_skipped != b->optimizer_skipped || a->consumed_prompts != b->consumed_prompts ||
        a->feed_epoch != b->feed_epoch || a->feed_pos != b->feed_pos || a->seed != b->seed ||
        a->n_rows != b->n_rows || a->data_fingerprint != b->data_fingerprint || a->n_unconsumed != b->n_unconsumed ||
        a->samples_log_bytes != b->samples_log_bytes)
        return 0;
    for (int i = 0; i < a->n_unconsumed; i++)
        if (a->unconsumed_started[i] != b->unconsumed_started[i]) return 0;
    return 1;
}

/* text with the first occurrence of `from` replaced by `to` */
static char *edit(const char *text, const char *from, const char *to) {
    const char *p = strstr(text, from);
    if (!p) {
        fprintf(stderr, "test bug: '%s' not in the state text\n", from);
        abort();
    }
    size_t a = (size_t)(p - text), nf = strlen(from), nt = strlen(to), n = strlen(text);
    char *r = malloc(n - nf + nt + 1);
    memcpy(r, text, a);
    memcpy(r + a, to, nt);
    memcpy(r + a + nt, p + nf, n - a - nf + 1);
    return r;
}

/* The edited text must be refused; the message names the file and contains w1 and w2. */
static void expect_refused(const char *what, const char *text, const rl_state_expect *ex, const char *w1,
                           const char *w2) {
    rl_state s;
    int rc = rl_state_parse(&s, text, strlen(text), PATH, ex);
    const char *m = moerl_last_error();
    CHECK(rc == MOERL_ERR, "%s: accepted", what);
    if (rc != MOERL_ERR) {
        rl_state_free(&s);
        return;
    }
    CHECK(s.unconsumed_started == NULL && s.n_rows == 0, "%s: *out not cleared on error", what);
    if (getenv("MOERL_TEST_VERBOSE")) printf("  %-26s -> %s\n", what, m);
    CHECK(strstr(m, PATH) != NULL, "%s: message does not name the file: %s", what, m);
    CHECK(strstr(m, w1) != NULL, "%s: message lacks '%s': %s", what, w1, m);
    if (w2) CHECK(strstr(m, w2) != NULL, "%s: message lacks '%s': %s", what, w2, m);
}

int main(void) {
    int64_t uids[3];
    rl_state st = sample(uids);
    char *txt = rl_state_to_json(&st);
    CHECK(txt != NULL, "writer refused a valid state: %s", moerl_last_error());
    if (!txt) TEST_MAIN_END();
    const rl_state_expect ex = {.n_rows = 100, .seed = 0xfedcba9876543210ULL, .data_fingerprint = 0x00c0ffee12345678ULL};

    /* 1. round trip, with and without the expectation */
    rl_state back;
    CHECK(rl_state_parse(&back, txt, strlen(txt), PATH, &ex) == MOERL_OK, "valid state refused: %s",
          moerl_last_error());
    CHECK(same(&st, &back), "round trip changed the state");
    rl_state_free(&back);
    CHECK(back.unconsumed_started == NULL && back.n_unconsumed == 0, "rl_state_free left the list");
    CHECK(rl_state_parse(&back, txt, strlen(txt), PATH, NULL) == MOERL_OK && same(&st, &back),
          "valid state refused without expectation: %s", moerl_last_error());
    rl_state_free(&back);
    CHECK(strstr(txt, "\"data_fingerprint\": \"00c0ffee12345678\"") != NULL, "fingerprint not 16 hex digits: %s", txt);
    CHECK(txt[strlen(txt) - 1] == '\n', "text does not end with a newline");

    /* the file the job writes today (job.c write_checkpoint_files: JSON_INDENT(1), jansson's key order) */
    const char *legacy = "{\"format\": \"moerl-rl-state\", \"format_version\": 1, \"version\": 3, \"trainer_step\": 12,"
                         " \"optimizer_step\": 12, \"optimizer_skipped\": 0, \"consumed_prompts\": 48, \"feed_epoch\": 0,"
                         " \"feed_pos\": 52, \"seed\": 1, \"n_rows\": 96, \"data_fingerprint\": \"9a3b0c2d4e5f6071\","
                         " \"unconsumed_started\": [13, 40, 51], \"samples_log_bytes\": 9001}";
    CHECK(rl_state_parse(&back, legacy, strlen(legacy), PATH, NULL) == MOERL_OK && back.n_unconsumed == 3 &&
              back.unconsumed_started[2] == 51 && back.data_fingerprint == 0x9a3b0c2d4e5f6071ULL,
          "job.c's file refused or misread: %s", moerl_last_error());
    rl_state_free(&back);

    /* a seed ≥ 2^63 is stored as the negative int64 of the same bits and reads back */
    CHECK(strstr(txt, "\"seed\": -81985529216486896") != NULL, "seed not stored as int64 bits: %s", txt);

    /* 2. damage: every message names the field and says what to do */
    const char *todo = "move the checkpoint folder 'runs/x/checkpoint' away";
    expect_refused("not JSON", "{\"format\": ", NULL, "not valid JSON", todo);
    expect_refused("empty file", "", NULL, "not valid JSON", "trainer.resume_mode=disable");
    expect_refused("a list", "[1, 2]", NULL, "expected a JSON object", todo);
    struct {
        const char *what, *from, *to, *w1;
    } cases[] = {
        {"other format", "moerl-rl-state", "moerl-sft-state", "field 'format'"},
        {"format not a string", "\"moerl-rl-state\"", "7", "field 'format'"},
        {"format_version real", "\"format_version\": 1", "\"format_version\": 1.0", "field 'format_version'"},
        {"version missing", "\"version\": 12,", "", "field 'version'"},
        {"version negative", "\"version\": 12", "\"version\": -1", "field 'version' is -1"},
        {"version over int", "\"version\": 12", "\"version\": 2147483648", "field 'version'"},
        {"version a string", "\"version\": 12", "\"version\": \"12\"", "found a string"},
        {"trainer_step real", "\"trainer_step\": 48", "\"trainer_step\": 48.5", "field 'trainer_step'"},
        {"optimizer_step null", "\"optimizer_step\": 47", "\"optimizer_step\": null", "field 'optimizer_step'"},
        {"optimizer_skipped neg", "\"optimizer_skipped\": 1", "\"optimizer_skipped\": -3", "'optimizer_skipped'"},
        {"consumed negative", "\"consumed_prompts\": 190", "\"consumed_prompts\": -1", "field 'consumed_prompts'"},
        {"feed_epoch negative", "\"feed_epoch\": 1", "\"feed_epoch\": -1", "field 'feed_epoch'"},
        {"feed_epoch INT_MAX", "\"feed_epoch\": 1", "\"feed_epoch\": 2147483647", "field 'feed_epoch'"},
        {"feed_pos > n_rows", "\"feed_pos\": 100", "\"feed_pos\": 101", "field 'feed_pos'"},
        {"n_rows zero", "\"n_rows\": 100", "\"n_rows\": 0", "field 'n_rows'"},
        {"seed a real", "\"seed\": -81985529216486896", "\"seed\": 1e3", "field 'seed'"},
        {"fingerprint not hex", "00c0ffee12345678", "00c0ffee1234567g", "field 'data_fingerprint'"},
        {"fingerprint too long", "00c0ffee12345678", "00c0ffee123456780", "field 'data_fingerprint'"},
        {"fingerprint empty", "\"00c0ffee12345678\"", "\"\"", "field 'data_fingerprint'"},
        {"fingerprint a number", "\"00c0ffee12345678\"", "12", "field 'data_fingerprint'"},
        {"unconsumed not a list", "\"unconsumed_started\": [", "\"unconsumed_started\": 5, \"x\": [", "'unconsumed_started' must be a list"},
        {"unconsumed entry real", "107", "107.0", "entry 1"},
        {"unconsumed negative", "107", "-107", "entry 1"},
        {"unconsumed too far", "299", "300", "entry 2"},
        {"samples bytes negative", "\"samples_log_bytes\": 123456", "\"samples_log_bytes\": -1", "'samples_log_bytes'"},
        {"duplicate key", "\"version\": 12", "\"version\": 12, \"version\": 12", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = edit(txt, cases[i].from, cases[i].to);
        expect_refused(cases[i].what, t, NULL, cases[i].w1, todo);
        free(t);
    }
    char *t = edit(txt, "\"format_version\": 1", "\"format_version\": 2");
    expect_refused("newer format_version", t, NULL, "format_version 2", "trainer.resume_mode=disable");
    free(t);
    /* an unknown extra field is fine (a later moerl may add some) */
    t = edit(txt, "\"version\": 12", "\"version\": 12, \"note\": [1, {}]");
    CHECK(rl_state_parse(&back, t, strlen(t), PATH, &ex) == MOERL_OK, "extra field refused: %s", moerl_last_error());
    rl_state_free(&back);
    free(t);

    /* 3. another run's data or seed */
    rl_state_expect other = ex;
    other.n_rows = 101;
    expect_refused("other n_rows", txt, &other, "other training data", "trainer.resume_mode=disable");
    other = ex;
    other.data_fingerprint ^= 1;
    expect_refused("other fingerprint", txt, &other, "other training data", "00c0ffee12345679");
    other = ex;
    other.seed = 7;
    expect_refused("other seed", txt, &other, "another trainer.seed", "this run has 7");

    /* 4. the writer refuses what the reader refuses */
    rl_state bad = st;
    bad.feed_pos = 101;
    char *bt = rl_state_to_json(&bad);
    CHECK(bt == NULL && strstr(moerl_last_error(), "feed_pos"), "writer wrote feed_pos > n_rows");
    free(bt);
    bad = st;
    int64_t far[1] = {-4};
    bad.unconsumed_started = far;
    bad.n_unconsumed = 1;
    bt = rl_state_to_json(&bad);
    CHECK(bt == NULL && strstr(moerl_last_error(), "unconsumed_started"), "writer wrote a negative uid");
    free(bt);
    bad = st;
    bad.n_unconsumed = 0;
    bad.unconsumed_started = NULL;
    bt = rl_state_to_json(&bad);
    CHECK(bt != NULL && strstr(bt, "\"unconsumed_started\": []"), "empty list not written: %s", bt ? bt : "NULL");
    free(bt);

    /* 5. the file functions: write atomically, load back */
    const char *dir = getenv("MOERL_TESTDATA") ? getenv("MOERL_TESTDATA") : "/tmp";
    char p[4096];
    snprintf(p, sizeof p, "%s/test_state_trainer_state.json", dir);
    CHECK(rl_state_write(p, &st) == MOERL_OK, "write: %s", moerl_last_error());
    CHECK(rl_state_load(&back, p, &ex) == MOERL_OK && same(&st, &back), "load: %s", moerl_last_error());
    rl_state_free(&back);
    snprintf(p, sizeof p, "%s/no/such/trainer_state.json", dir);
    CHECK(rl_state_load(&back, p, &ex) == MOERL_ERR && strstr(moerl_last_error(), p), "missing file: %s",
          moerl_last_error());
    free(txt);
    TEST_MAIN_END();
}
