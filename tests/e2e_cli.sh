#!/usr/bin/env bash
# End-to-end tests of the command line: score against the PyTorch reference, generate, sft,
# tasks, eval, and clear errors on bad input. Ends with "N passed, N failed".
set -u
BUILD=${1:-build}
M=$BUILD/moerl
TD=${MOERL_TESTDATA:-$BUILD/testdata}
PY=/usr/bin/python3
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }
# expect_err "what" "substring" cmd...: non-zero exit below 128 (no crash) and the message
expect_err() {
    local what=$1 sub=$2; shift 2
    "$@" >"$W/out" 2>"$W/err"; local rc=$?
    if [[ $rc -ne 0 && $rc -lt 128 ]] && grep -qi -- "$sub" "$W/err"; then ok
    else bad "$what (rc $rc): $(head -c 300 "$W/err")"; fi
}

# --- score agrees with the PyTorch reference (gen_model.py's model_b_score.safetensors)
toks=$($PY - "$TD/model_b_score.safetensors" <<'PYEOF'
import sys; sys.path.insert(0, "tests/ref"); import st_io
print(",".join(str(int(x)) for x in st_io.load(sys.argv[1])["tokens"]))
PYEOF
)
$M score --model "$TD/model_b" --tokens "$toks" >"$W/score.json" 2>"$W/err"
check "score runs" test $? -eq 0
$PY - "$W/score.json" "$TD/model_b_score.safetensors" <<'PYEOF'
import json, sys
sys.path.insert(0, "tests/ref"); import st_io
got = json.load(open(sys.argv[1])); ref = st_io.load(sys.argv[2])
lp = ref["token_logprobs"].tolist()
assert len(got["token_logprobs"]) == len(lp), "length"
# fp32 C vs float64 reference through 2 layers: 2e-5 absolute (as tests/test_model.c)
assert max(abs(a - b) for a, b in zip(got["token_logprobs"], lp)) < 2e-5, "token_logprobs"
assert abs(got["ce_loss"] - float(ref["ce_loss"][0])) < 2e-5, "ce_loss"
assert abs(got["aux_loss"] - float(ref["aux_loss"][0])) < 1e-5, "aux_loss"
PYEOF
check "score matches the PyTorch reference" test $? -eq 0
expect_err "score: unknown model dir" "config.json" $M score --model "$W/nope" --tokens 1,2,3
expect_err "score: bad token list" "integers" $M score --model "$TD/model_b" --tokens 1,x,3
expect_err "score: token outside vocab" "vocabulary" $M score --model "$TD/model_b" --tokens 1,99999

# --- generate
$M generate --model "$TD/model_b" --prompt-tokens 1,5,9 --max-new-tokens 12 --temperature 0.8 --top-p 0.9 -n 3 --seed 4 >"$W/gen.jsonl" 2>"$W/err"
check "generate runs" test $? -eq 0
$PY - "$W/gen.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, len(rows)
for r in rows:
    assert len(r["tokens"]) == len(r["logprobs"]) == len(r["versions"]) <= 12
    assert r["finish_reason"] in ("stop", "length")
    assert all(lp <= 0 for lp in r["logprobs"])
PYEOF
check "generate output schema" test $? -eq 0
# greedy is deterministic
$M generate --model "$TD/model_b" --prompt-tokens 3,4 --max-new-tokens 10 --temperature 0 >"$W/g1" 2>/dev/null
$M generate --model "$TD/model_b" --prompt-tokens 3,4 --max-new-tokens 10 --temperature 0 --max-num-seqs 1 >"$W/g2" 2>/dev/null
check "greedy generate reproducible" cmp -s "$W/g1" "$W/g2"
expect_err "generate: unknown model dir" "config.json" $M generate --model "$W/nope" --prompt-tokens 1,2
expect_err "generate: negative temperature" "temperature" $M generate --model "$TD/model_b" --prompt-tokens 1,2 --temperature -1
expect_err "generate: top-p out of range" "top-p" $M generate --model "$TD/model_b" --prompt-tokens 1,2 --top-p 1.5
expect_err "generate: prompt longer than the context" "max_position_embeddings" $M generate --model "$TD/model_b" --prompt-tokens "$(for i in $(seq 1 40000); do printf '1,'; done)1" --max-new-tokens 4
expect_err "generate: --prompts without tokenizer" "tokenizer" $M generate --model "$TD/model_b" --prompts /dev/null

# --- tasks, sft, eval, generate with text
$M tasks --task arith --out "$W/arith" --n-train 64 --n-test 16 >/dev/null 2>&1
check "tasks writes files" test -s "$W/arith/train.jsonl" -a -s "$W/arith/test.jsonl"
expect_err "tasks: unknown task" "unknown" $M tasks --task nosuch --out "$W/x"
cat >"$W/sft.yaml" <<YEOF
model: {hidden_size: 32, intermediate_size: 64, moe_intermediate_size: 32, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_experts: 4, num_experts_per_tok: 2}
data: {task: "", train_files: $W/arith/train.jsonl, val_files: $W/arith/test.jsonl, train_batch_size: 16}
trainer: {total_training_steps: 3, default_local_dir: $W/sft, val_n: 8}
YEOF
$M sft --config "$W/sft.yaml" >"$W/sft.out" 2>"$W/err"
check "sft runs" test $? -eq 0
check "sft writes a checkpoint" test -s "$W/sft/checkpoint/model.safetensors" -a -s "$W/sft/checkpoint/config.json"
check "sft writes metrics" test "$(wc -l <"$W/sft/metrics.jsonl")" -ge 3
check "sft records its config" grep -q "total_training_steps: 3" "$W/sft/config.yaml"
$M eval --model "$W/sft/checkpoint" --data "$W/arith/test.jsonl" --n 8 >"$W/eval.json" 2>/dev/null
check "eval prints accuracy" grep -q '"accuracy"' "$W/eval.json"
$M generate --model "$W/sft/checkpoint" --prompts "$W/arith/test.jsonl" --max-new-tokens 6 --temperature 0 >"$W/gt.jsonl" 2>/dev/null
check "generate --prompts gives text" test "$(grep -c '"text"' "$W/gt.jsonl")" -eq 16
expect_err "sft: unknown key" "did you mean" $M sft --config "$W/sft.yaml" trainer.total_trainig_steps=3
expect_err "sft: wrong type" "int" $M sft --config "$W/sft.yaml" data.train_batch_size=abc
printf '{"data_source": "arith", "prompt": "not a list"}\n' >"$W/bad.jsonl"
expect_err "sft: malformed dataset line" "bad.jsonl:1" $M sft --config "$W/sft.yaml" data.train_files="$W/bad.jsonl"
expect_err "unknown command" "unknown command" $M frobnicate

# --- input checks found by a new user's review
RS=(--config examples/smoke.yaml sft.total_training_steps=0 trainer.val_n=4)
expect_err "rl: int beyond 32 bits" "32-bit" $M rl "${RS[@]}" trainer.default_local_dir="$W/r1" rollout.n=4294967300
expect_err "rl: non-finite lr" "actor.optim.lr" $M rl "${RS[@]}" trainer.default_local_dir="$W/r2" actor.optim.lr=inf
expect_err "rl: response longer than the context" "max_position_embeddings" $M rl "${RS[@]}" trainer.default_local_dir="$W/r3" data.max_response_length=500
expect_err "rl: batch larger than the data" "training data has only" $M rl "${RS[@]}" trainer.default_local_dir="$W/r4" actor.ppo_mini_batch_size=1000
expect_err "rl: --config required" "required" $M rl
expect_err "eval: a directory as data file" "not a regular file" $M eval --model "$TD/model_b" --data "$W"
expect_err "score: more tokens than the context" "context" $M score --model "$TD/model_b" --tokens "$(seq -s, 1 40000 | sed 's/[0-9]*/3/g')"
mkdir -p "$W/busy"
( flock -x "$W/busy/.moerl.lock" -c 'sleep 5' & ) ; sleep 0.3
expect_err "rl: output folder in use" "in use" $M rl "${RS[@]}" trainer.default_local_dir="$W/busy"

# --- second review: data fingerprint on resume, model.* with model.path, non-finite weights, data_source
$M rl "${RS[@]}" trainer.default_local_dir="$W/fp" trainer.total_training_steps=2 >/dev/null 2>&1
expect_err "rl: resume on other data refused" "other training data" $M rl "${RS[@]}" trainer.default_local_dir="$W/fp" trainer.total_training_steps=4 data.seed=5
expect_err "sft: model.* with model.path" "together with model.path" $M sft --config "$W/sft.yaml" model.path="$W/sft/checkpoint" trainer.default_local_dir="$W/sft2"
cp -r "$W/sft/checkpoint" "$W/nanckpt"
$PY - "$W/nanckpt/model.safetensors" <<'PYEOF'
import sys; sys.path.insert(0, "tests/ref"); import st_io, torch
t = st_io.load(sys.argv[1]); t["model.embed_tokens.weight"][3, 5] = float("nan"); st_io.save(t, sys.argv[1])
PYEOF
expect_err "score: NaN weights refused" "non-finite" $M score --model "$W/nanckpt" --tokens 1,2,3
sed 's/"data_source": *"arith"/"data_source": "nosuch"/' "$W/arith/test.jsonl" >"$W/badsrc.jsonl"
expect_err "sft: unknown data_source at load" "badsrc.jsonl:1" $M sft --config "$W/sft.yaml" data.val_files="$W/badsrc.jsonl" trainer.default_local_dir="$W/sft3"

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
