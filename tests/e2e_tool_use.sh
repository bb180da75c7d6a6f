#!/usr/bin/env bash
# End-to-end tests of the worked agentic task (examples/tool_use.yaml, docs/multi-turn.md "A worked
# example"): the example's chat template renders a conversation with tools and tool turns as
# @huggingface/jinja does; its calculator environment answers the protocol (and refuses what is not
# arithmetic); `moerl tasks --task tool_arith` writes demonstrations; the SFT warm start trains on them
# (the response as messages) and a short `moerl rl` run of the example makes multi-turn trajectories:
# samples with several assistant turns and calc calls, the tool metrics logged. Checks outcomes, not
# timing.
# Usage: tests/e2e_tool_use.sh [BUILD_DIR]   (default build; uses BUILD_DIR/moerl)
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
NM=${MOERL_NPM:-third_party/npm/node_modules}
if [[ ! -x $M ]]; then
    bad "setup" "$M not built"
    finish
fi
export OMP_NUM_THREADS=1
TPL=examples/tool_use/chat_template.jinja

# --- the calculator environment: one answer line per call line, in order
printf '%s\n' '{"trajectory_id":"1","name":"calc","arguments":{"expr":"1234*5678"}}' \
    '{"trajectory_id":"2","name":"calc","arguments":{"expr":"(2+3)*-4"}}' \
    '{"trajectory_id":"3","name":"calc","arguments":{"expr":"__import__(\"os\")"}}' \
    '{"trajectory_id":"4","name":"calc","arguments":{"expr":"9**99"}}' \
    '{"trajectory_id":"5","name":"calc","arguments":"1+1"}' \
    'not json' \
    '{"trajectory_id":"6","name":"search","arguments":{"q":"x"}}' |
    $PY examples/tool_use/calc_env.py >"$W/env.out" 2>"$W/env.err"
$PY - "$W/env.out" <<'PY' && ok "calc_env.py: results, and an error answer for each bad call" || bad "calc_env.py" "answers (above)"
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
want_content = {0: "7006652", 1: "-20"}
ok = len(got) == 7
for i, a in enumerate(got):
    if i in want_content:
        ok &= a == {"content": want_content[i]}
    else:
        ok &= set(a) == {"error"} and isinstance(a["error"], str) and a["error"] != ""
if not ok:
    print(got)
sys.exit(0 if ok else 1)
PY

# --- the example's template = @huggingface/jinja's rendering (tools named, consecutive tool messages
# in one user turn, the generation prompt); the byte tokenizer's folder comes from a tiny SFT run below
cat >"$W/conv.json" <<'EOF'
{"messages": [{"role": "user", "content": "Compute 1234*5678."},
 {"role": "assistant", "content": "<tool_call>{\"name\":\"calc\",\"arguments\":{\"expr\":\"1234*5678\"}}</tool_call>"},
 {"role": "tool", "content": "7006652"}, {"role": "tool", "content": "second"},
 {"role": "assistant", "content": "Answer: 7006652"}, {"role": "tool", "content": "last"}],
 "tools": [{"type": "function", "function": {"name": "calc"}}, {"type": "function", "function": {"name": "look_up"}}],
 "add_generation_prompt": true}
EOF

# --- moerl tasks: tool_arith rows carry the calc schema and a demonstration as messages
$M tasks --task tool_arith --digits 4 --out "$W/tasks" --n-train 4 --n-test 2 >/dev/null 2>"$W/err" || bad "tasks" "$(cat "$W/err")"
$PY - "$W/tasks/train.jsonl" <<'PY' && ok "tasks: tool_arith rows (tools, truth = the product, call → tool → Answer)" || bad "tasks: tool_arith rows"
import json, re, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    a, b = map(int, re.fullmatch(r"Compute (\d{4})\*(\d{4})\.", r["prompt"][0]["content"]).groups())
    want = str(a * b)
    assert r["tools"][0]["function"]["name"] == "calc" and r["reward_model"]["ground_truth"] == want
    call, tool, fin = r["response"]
    assert json.loads(re.fullmatch(r"<tool_call>(.*)</tool_call>", call["content"]).group(1)) == \
        {"name": "calc", "arguments": {"expr": "%d*%d" % (a, b)}}
    assert tool == {"role": "tool", "content": want} and fin == {"role": "assistant", "content": "Answer: " + want}
PY

# --- SFT on the demonstrations (moerl sft, the example's model and template)
SFT=(data.n_train=64 data.n_test=8 data.train_batch_size=8 trainer.total_training_steps=4
     trainer.val_n=2 trainer.n_threads=1 optim.lr=3e-3)
# moerl sft takes the model.* and data.* keys of the example; the rl-only sections are not its keys
$PY - <<'PY' >"$W/sft.yaml"
import re
text = open("examples/tool_use.yaml").read()
keep, on = [], False
for line in text.splitlines():
    if re.match(r"^[a-z_]+:", line):
        on = line.split(":")[0] in ("model", "data")
    if on:
        keep.append(line)
print("\n".join(keep))
PY
if $M sft --config "$W/sft.yaml" "${SFT[@]}" trainer.default_local_dir="$W/sft" >"$W/sft.log" 2>&1; then
    ok "sft: trains on tool-call demonstrations (responses as messages)"
else
    bad "sft" "$(tail -5 "$W/sft.log")"
fi
if [[ -f $W/sft/checkpoint/tokenizer_moerl.json ]]; then
    if $M tokenize --model "$W/sft/checkpoint" --chat --chat-template "$TPL" --file "$W/conv.json" >"$W/tpl.moerl" 2>"$W/err" &&
        mkdir -p "$W/tokcfg" && echo '{}' >"$W/tokcfg/tokenizer_config.json" &&
        node tests/ref/chat_render_ref.js "$NM" "$TPL" "$W/tokcfg" "$W/conv.json" >"$W/tpl.ref" 2>>"$W/err"; then
        check "the example's template renders as @huggingface/jinja does" \
            $PY -c 'import json,sys; a,b=(json.load(open(p))["text"] for p in sys.argv[1:]); sys.exit(a!=b)' "$W/tpl.moerl" "$W/tpl.ref"
    else
        bad "template reference" "$(head -c 400 "$W/err")"
    fi
fi
# the native chatml template cannot render the rows' tools: a clear error naming the row
expect_err "sft: chatml refuses the rows' tools, naming the row" "line 1 of the training data generated by data.task=tool_arith" \
    $M sft --config "$W/sft.yaml" "${SFT[@]}" data.chat_template=chatml trainer.default_local_dir="$W/sft_chatml"

finish
