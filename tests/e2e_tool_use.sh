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
# (150 steps: enough for the tool-call format, so that the RL run below makes multi-turn trajectories)
SFT=(data.n_train=600 data.n_test=8 data.train_batch_size=32 trainer.total_training_steps=150
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

# --- moerl rl on the example from that checkpoint: multi-turn trajectories through calc_env.py
RL=(model.path="$W/sft/checkpoint" sft.total_training_steps=0 trainer.total_training_steps=2 trainer.val_n=0
    trainer.test_freq=0 trainer.save_freq=-1 trainer.n_threads=1 data.n_train=64 data.n_test=8)
if $M rl --config examples/tool_use.yaml "${RL[@]}" trainer.default_local_dir="$W/rl" >"$W/rl.log" 2>&1; then
    ok "rl: the example runs with multi-turn rollouts"
else
    bad "rl" "$(tail -5 "$W/rl.log")"
fi
# every sample checked against the rules: a trajectory with a tool turn holds the calculator's answer to
# the call the model wrote (the environment ran it), at most 3 assistant turns (max_assistant_turns),
# and its reward is 1 exactly when the final turn's "Answer:" is the product (the rows' ground truth)
$PY - "$W/rl/samples.jsonl" "$W/rl/data" <<'PY' && ok "rl: multi-turn samples (tool turns answered by calc_env.py, rewards by the final turn)" || bad "rl: samples" "(above)"
import glob, json, re, sys
from decimal import Decimal
rows = {}
for f in glob.glob(sys.argv[2] + "/*.jsonl"):
    if "-train" in f:
        rows = [json.loads(l) for l in open(f)]
multi = 0
bad = []
for line in open(sys.argv[1]):
    s = json.loads(line)
    truth = rows[s["row"]]["reward_model"]["ground_truth"]
    for r in s["responses"]:
        # the text as the reward read it (the byte tokenizer: ids < 256 are bytes, the others the skipped
        # special tokens); samples.jsonl holds null for a text that is not valid UTF-8
        t = r["text"] if r["text"] is not None else bytes(i for i in r["ids"] if i < 256).decode("utf-8", "replace")
        turns = 1 + t.count("</tool_response>\nassistant\n")
        if turns > 3 or ("turns" in r and r["turns"] != turns):
            bad.append(("turns", r.get("turns"), turns, t))
        if "loss_mask" in r and (len(r["loss_mask"]) != len(r["ids"]) or (turns > 1) != (0 in r["loss_mask"])):
            bad.append(("loss_mask", t))
        for call, resp in re.findall(r"<tool_call>(.*?)</tool_call>\nuser\n<tool_response>\n(.*?)\n</tool_response>", t, re.S):
            multi += 1
            try:
                c = json.loads(call)
                expr = c["arguments"]["expr"] if c.get("name") == "calc" else None
            except Exception:
                expr = None
            if expr is not None and re.fullmatch(r"[0-9*+\- ()]+", expr) and not resp.startswith("Error"):
                if resp != str(eval(expr, {"__builtins__": {}})):
                    bad.append(("tool answer", call, resp))
        final = t.split("</tool_response>")[-1]
        at = final.rfind("Answer:")
        m = re.match(r"[ \t]*(-?\d+(?:,\d{3}(?!\d))*(?:\.\d+)?)", final[at + 7:]) if at >= 0 else None
        want = 1.0 if m and Decimal(m.group(1).replace(",", "")) == Decimal(truth) else 0.0
        if r["reward"] != want:
            bad.append(("reward", r["reward"], want, t))
print("tool turns:", multi, "problems:", bad[:3])
sys.exit(0 if multi > 0 and not bad else 1)
PY
# the tool metrics of the agent loop are logged, and show trajectories of more than one turn
$PY - "$W/rl/metrics.jsonl" <<'PY' && ok "rl: num_turns, tool_calls and well_formed_rate logged" || bad "rl: tool metrics" "(above)"
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1])]
tr = [m for m in ms if "num_turns/mean" in m]
ok = len(tr) == 2 and max(m["num_turns/mean"] for m in tr) > 1 and all(m["tool_calls/mean"] > 0 for m in tr)
ok = ok and all(0 <= m["tool_calls/well_formed_rate"] <= 1 for m in tr)
if not ok:
    print(tr)
sys.exit(0 if ok else 1)
PY

finish
