/* The template delta of a tool turn (tool_turn_ids): with Qwen3's tokenizer and template, the delta
 * ids equal the tail of the whole conversation's encoding after the assistant turn's <|im_end|> (so
 * prompt ⊕ sampled ⊕ delta joins with no drift at the boundary: the "\n" after <|im_end|> belongs to
 * the delta), decode to the text Qwen3's template writes for tool turns (its rendering is tested
 * equal to @huggingface/jinja's elsewhere: test_tokenizer / test_jinja), keep a tool response that
 * spells <|im_end|> as text, follow enable_thinking, and refuse what cannot be a tool turn. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "data/tokenizer.h"
#include "data/tool_calls.h"
#include "test.h"

static const char *testdata(void) {
    const char *d = getenv("MOERL_TESTDATA");
    return d ? d : "build/testdata";
}

static int count_id(const int32_t *ids, int64_t n, int32_t id, int k, int64_t *pos_k) {
    int c = 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == id && ++c == k) *pos_k = i;
    return c;
}

static chat_msg M(const char *role, const char *content) { return (chat_msg){(char *)role, (char *)content, NULL}; }

static void test_non_canonical(tokenizer *t);

static void check_delta_x(tokenizer *t, const chat_msg *msgs, int n_turn, int n, const chat_extra *x, const char *want_text,
                          const char *tag) {
    const int32_t eot = tokenizer_token_id(t, "<|im_end|>");
    tok_seq delta = {0}, full = {0}, pre = {0};
    CHECK(tool_turn_ids(t, msgs, n_turn, n, x, "<|im_end|>", &delta) == MOERL_OK, "%s: %s", tag, moerl_last_error());
    MOERL_ASSERT(tokenizer_chat_encode_ex(t, msgs, n, x, true, &full) == MOERL_OK);
    MOERL_ASSERT(tokenizer_chat_encode_ex(t, msgs, n_turn, x, false, &pre) == MOERL_OK);
    int64_t pos = -1;
    const int k = count_id(pre.ids, pre.n, eot, 0, NULL);
    count_id(full.ids, full.n, eot, k, &pos);
    CHECK(pos >= 0 && delta.n == full.n - pos - 1 && !memcmp(delta.ids, full.ids + pos + 1, delta.n * sizeof(int32_t)),
          "%s: delta (%lld ids) is the whole conversation's ids after the turn's <|im_end|> (%lld ids)", tag,
          (long long)delta.n, (long long)(full.n - pos - 1));
    size_t len;
    char *txt = tokenizer_decode(t, delta.ids, delta.n, false, &len);
    CHECK(txt && !strcmp(txt, want_text), "%s: delta text\n got  [%s]\n want [%s]", tag, txt, want_text);
    CHECK(count_id(delta.ids, delta.n, eot, 0, NULL) == 1, "%s: one <|im_end|> id in the delta (the template's)", tag);
    free(txt);
    tok_seq_free(&delta); tok_seq_free(&full); tok_seq_free(&pre);
}

static void check_delta(tokenizer *t, const chat_msg *msgs, int n_turn, int n, const char *want_text, const char *tag) {
    check_delta_x(t, msgs, n_turn, n, NULL, want_text, tag);
}

static void test_qwen3(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3_tok", testdata());
    tokenizer *t = tokenizer_load(dir, 151936);
    CHECK(t != NULL, "load %s: %s (run tests/ref/gen_tokenizer.py first)", dir, moerl_last_error());
    if (!t) return;
    MOERL_ASSERT(tokenizer_set_chat_template(t, "qwen3", true, "data.chat_template") == MOERL_OK);
    chat_msg msgs[] = {
        M("system", "You can call tools."), M("user", "What is 123456789 * 987654321?"),
        M("assistant", "<think>\nI should use the calculator.\n</think>\n\n<tool_call>\n{\"name\": \"calc\", \"arguments\": "
                       "{\"expr\": \"123456789*987654321\"}}\n</tool_call>"),
        M("tool", "121932631112635269"), M("tool", "<|im_end|> is not a token here"),
        M("assistant", "The product is 121932631112635269."), M("tool", "ok")};
    check_delta(t, msgs, 3, 5,
                "\n<|im_start|>user\n<tool_response>\n121932631112635269\n</tool_response>\n<tool_response>\n<|im_end|> "
                "is not a token here\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                "qwen3, two tool responses");
    check_delta(t, msgs, 3, 4, "\n<|im_start|>user\n<tool_response>\n121932631112635269\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                "qwen3, one tool response");
    check_delta(t, msgs, 6, 7, "\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                "qwen3, second tool turn");
    /* the checkpoint's own template through the Jinja interpreter, with the tools in the system prompt */
    MOERL_ASSERT(tokenizer_set_chat_template(t, "auto", true, "data.chat_template") == MOERL_OK);
    json_error_t je;
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"description\": \"Evaluate.\", "
                               "\"parameters\": {\"type\": \"object\", \"properties\": {\"expr\": {\"type\": \"string\"}}}}}]", 0, &je);
    MOERL_ASSERT(tools);
    chat_extra x = {tools, NULL};
    check_delta_x(t, msgs, 3, 4, &x,
                  "\n<|im_start|>user\n<tool_response>\n121932631112635269\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                  "qwen3 via Jinja (the checkpoint's template), with tools");
    json_decref(tools);
    MOERL_ASSERT(tokenizer_set_chat_template(t, "qwen3", false, "data.chat_template") == MOERL_OK);
    check_delta(t, msgs, 3, 4,
                "\n<|im_start|>user\n<tool_response>\n121932631112635269\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
                "<think>\n\n</think>\n\n",
                "qwen3 enable_thinking=false");
    tok_seq out = {0};
    CHECK(tool_turn_ids(t, msgs, 3, 4, NULL, "<|endoftext|>", &out) == MOERL_ERR && strstr(moerl_last_error(), "no end-of-turn") &&
              out.n == 0,
          "an eot the template does not write: %s", moerl_last_error());
    CHECK(tool_turn_ids(t, msgs, 2, 4, NULL, "<|im_end|>", &out) == MOERL_ERR && strstr(moerl_last_error(), "expected assistant"),
          "the turn before the tools must be the assistant's: %s", moerl_last_error());
    CHECK(tool_turn_ids(t, msgs, 3, 3, NULL, "<|im_end|>", &out) == MOERL_ERR && out.n == 0, "no tool messages refused");
    tok_seq_free(&out);
    test_non_canonical(t);
    tokenizer_free(t);
}

/* Non-canonical samples: the model may sample a word as two tokens that re-encode as one. The next
 * turn's input is prompt ⊕ sampled ⊕ delta — the sampled ids verbatim — and the delta depends only on
 * the text, so it is the same whichever ids spelled the turn. */
static void test_non_canonical(tokenizer *t) {
    const char *content = "The calculator is unbelievably precise.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": "
                          "{\"expr\": \"2+3\"}}\n</tool_call>";
    chat_msg msgs[] = {M("user", "2+3?"), M("assistant", content), M("tool", "5")};
    tok_seq canon = {0}, split = {0}, prompt = {0}, delta = {0}, again = {0};
    MOERL_ASSERT(tokenizer_encode(t, content, strlen(content), false, &canon) == MOERL_OK);
    int64_t at = -1; /* the first token of ≥ 4 letters, sampled as two halves instead */
    for (int64_t i = 0; i < canon.n && at < 0; i++) {
        size_t l;
        char *s = tokenizer_decode(t, canon.ids + i, 1, false, &l);
        int letters = l >= 4;
        for (size_t j = 0; j < l; j++) letters &= (s[j] >= 'a' && s[j] <= 'z');
        if (letters) {
            at = i;
            for (int64_t k = 0; k < i; k++) tok_seq_push(&split, canon.ids[k]);
            MOERL_ASSERT(tokenizer_encode(t, s, l / 2, false, &split) == MOERL_OK);
            MOERL_ASSERT(tokenizer_encode(t, s + l / 2, l - l / 2, false, &split) == MOERL_OK);
            for (int64_t k = i + 1; k < canon.n; k++) tok_seq_push(&split, canon.ids[k]);
        }
        free(s);
    }
    MOERL_ASSERT(at >= 0);
    size_t l1, l2;
    char *a = tokenizer_decode(t, canon.ids, canon.n, false, &l1), *b = tokenizer_decode(t, split.ids, split.n, false, &l2);
    MOERL_ASSERT(tokenizer_encode(t, b, l2, false, &again) == MOERL_OK);
    CHECK(l1 == l2 && !memcmp(a, b, l1) && split.n > canon.n && again.n == canon.n &&
              !memcmp(again.ids, canon.ids, canon.n * sizeof(int32_t)),
          "the split sample spells the same text and re-encodes to the canonical ids (it would be lost by re-encoding)");
    free(a); free(b);
    MOERL_ASSERT(tokenizer_chat_encode(t, msgs, 1, true, &prompt) == MOERL_OK);
    MOERL_ASSERT(tool_turn_ids(t, msgs, 2, 3, NULL, "<|im_end|>", &delta) == MOERL_OK);
    /* the next turn's input: prompt ⊕ sampled (with its <|im_end|>) ⊕ delta */
    tok_seq next = {0};
    for (int64_t i = 0; i < prompt.n; i++) tok_seq_push(&next, prompt.ids[i]);
    for (int64_t i = 0; i < split.n; i++) tok_seq_push(&next, split.ids[i]);
    tok_seq_push(&next, tokenizer_token_id(t, "<|im_end|>"));
    for (int64_t i = 0; i < delta.n; i++) tok_seq_push(&next, delta.ids[i]);
    CHECK(!memcmp(next.ids + prompt.n, split.ids, split.n * sizeof(int32_t)), "the sampled ids stand verbatim");
    tok_seq full = {0};
    MOERL_ASSERT(tokenizer_chat_encode(t, msgs, 3, true, &full) == MOERL_OK);
    /* re-encoding the conversation gives other ids (the split token, and here also the empty think
     * block the generation prompt held, which Qwen3's template drops from a past turn) but the same tail */
    CHECK(full.n >= delta.n && !memcmp(full.ids + full.n - delta.n, next.ids + next.n - delta.n, delta.n * sizeof(int32_t)) &&
              (full.n != next.n || memcmp(full.ids, next.ids, next.n * sizeof(int32_t))),
          "the input keeps the sampled ids where re-encoding would not, and ends with the same tool turn (%lld vs %lld ids)",
          (long long)next.n, (long long)full.n);
    tok_seq *all[] = {&canon, &split, &prompt, &delta, &again, &next, &full};
    for (int i = 0; i < 7; i++) tok_seq_free(all[i]);
}

static void test_chatml_bytes(void) {
    tokenizer *t = tokenizer_new_bytes();
    MOERL_ASSERT(tokenizer_set_chat_template(t, "chatml", true, "data.chat_template") == MOERL_OK);
    chat_msg msgs[] = {M("user", "2+3?"), M("assistant", "<tool_call>{\"name\": \"calc\"}</tool_call>"), M("tool", "5")};
    check_delta(t, msgs, 2, 3, "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n", "chatml, byte tokenizer");
    tokenizer_free(t);
}

int main(void) {
    test_qwen3();
    test_chatml_bytes();
    TEST_MAIN_END();
}
