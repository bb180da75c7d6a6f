#!/usr/bin/env bash
# End-to-end: `moerl sft` on your own data (docs/data.md, docs/rewards.md).
#   any data_source   rows whose data_source has no built-in reward train (training needs no reward):
#                     the run says once that no held-out accuracy is measured and prints null accuracies
#   reward.*          sft takes moerl rl's reward keys: a verl reward file scores the held-out rows
#                     (accuracies are numbers); a numeric ground truth reaches the file as a number
#                     and a row without reward_model.style is read as "rule"
#   parquet           a parquet file is refused with the command converting it to JSONL
#   list              data.train_files=[a,b] on the command line is refused as a list (one file a split)
# Usage: tests/e2e_own_data.sh [BUILD_DIR]   (default build; uses BUILD_DIR/moerl)
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
MOERL=$BUILD/moerl
if [[ ! -x $MOERL ]]; then
    bad "setup" "$MOERL not built"
    # --- a list on the command line (verl takes several files): refused as a list, naming the key
expect_err "list of files" "data.train_files: got a list '[$W/train.jsonl,$W/test.jsonl]', expected one JSONL file" \
    "$MOERL" sft --config "$W/cfg.yaml" trainer.default_local_dir="$W/ls" "data.train_files=[$W/train.jsonl,$W/test.jsonl]"

finish
fi
export OMP_NUM_THREADS=1

"$PY" - "$W" <<'EOF'
import json, sys
w = sys.argv[1]
def row(a, b, i, numeric):
    rm = {"ground_truth": a + b} if numeric else {"style": "rule", "ground_truth": str(a + b)}
    return json.dumps({"data_source": "my_math", "prompt": [{"role": "user", "content": "Compute %d+%d." % (a, b)}],
                       "reward_model": rm, "response": str(a + b), "extra_info": {"index": i}})
for name, n, numeric in [("train", 32, False), ("test", 4, False), ("test_num", 4, True)]:
    with open("%s/%s.jsonl" % (w, name), "w") as f:
        for i in range(n): f.write(row(i % 7, i % 5, i, numeric) + "\n")
EOF
cat >"$W/my_reward.py" <<'EOF'
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source != "my_math":
        raise ValueError("data_source %r" % data_source)
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.0
EOF
cat >"$W/cfg.yaml" <<EOF
model:
  hidden_size: 32
  intermediate_size: 48
  moe_intermediate_size: 16
  num_hidden_layers: 1
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 8
  num_experts: 4
  num_experts_per_tok: 2
  max_position_embeddings: 128
data:
  task: ""
  train_files: $W/train.jsonl
  val_files: $W/test.jsonl
  max_response_length: 3
  train_batch_size: 8
trainer:
  total_training_steps: 2
EOF

# --- any data_source, built-in rewards: trains, says once that no held-out accuracy is measured
if "$MOERL" sft --config "$W/cfg.yaml" trainer.default_local_dir="$W/plain" >"$W/plain.out" 2>"$W/plain.err"; then
    n=$(grep -c "no held-out accuracy is measured" "$W/plain.err")
    if [[ $n == 1 ]] && grep -q "data_source 'my_math'" "$W/plain.err"; then ok "own data_source: said once"
    else bad "own data_source" "said $n times: $(tail -3 "$W/plain.err")"; fi
    acc=$(tail -1 "$W/plain.out" | json_field accuracy_after)
    if [[ $acc == None ]]; then ok "own data_source: no accuracy (null)"; else bad "own data_source" "accuracy $acc"; fi
    [[ -f $W/plain/checkpoint/model.safetensors ]] && ok "own data_source: checkpoint" || bad "own data_source" "no checkpoint"
else bad "own data_source" "exit $?: $(tail -3 "$W/plain.err")"; fi

# --- sft's reward.* keys: the reward file scores the held-out rows
if "$MOERL" sft --help 2>&1 | grep -q "reward.custom_reward_function.path"; then ok "sft --help lists reward.*"
else bad "sft --help" "no reward.custom_reward_function.path"; fi
for v in test test_num; do
    if "$MOERL" sft --config "$W/cfg.yaml" trainer.default_local_dir="$W/rw_$v" data.val_files="$W/$v.jsonl" \
        reward.custom_reward_function.path="$W/my_reward.py" reward.num_workers=1 >"$W/rw_$v.out" 2>"$W/rw_$v.err"; then
        acc=$(tail -1 "$W/rw_$v.out" | json_field accuracy_after)
        if [[ $acc != None ]] && ! grep -q "no held-out accuracy" "$W/rw_$v.err"; then ok "reward file ($v): accuracy $acc"
        else bad "reward file ($v)" "accuracy $acc: $(tail -3 "$W/rw_$v.err")"; fi
    else bad "reward file ($v)" "exit $?: $(tail -3 "$W/rw_$v.err")"; fi
done

# --- a numeric ground truth reaches a custom reward as a number (the eval's reward call says which)
cat >"$W/num_reward.py" <<'EOF'
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not isinstance(ground_truth, int) or isinstance(ground_truth, bool):
        raise TypeError("ground_truth %r is not a number" % (ground_truth,))
    return 0.0
EOF
if "$MOERL" sft --config "$W/cfg.yaml" trainer.default_local_dir="$W/num" data.val_files="$W/test_num.jsonl" \
    reward.custom_reward_function.path="$W/num_reward.py" reward.num_workers=1 >"$W/num.out" 2>"$W/num.err"; then
    ok "numeric ground truth: a number to the reward file"
else bad "numeric ground truth" "exit $?: $(tail -3 "$W/num.err")"; fi

# --- parquet: refused with the conversion
printf 'PAR1\x15\x04\x15\x00' >"$W/train.parquet"
expect_err "parquet" "is a parquet file" "$MOERL" sft --config "$W/cfg.yaml" trainer.default_local_dir="$W/pq" \
    data.train_files="$W/train.parquet"
grep -q "pd.read_parquet('$W/train.parquet')" "$W/err" && ok "parquet: the conversion" || bad "parquet" "$(cat "$W/err")"

# --- a list on the command line (verl takes several files): refused as a list, naming the key
expect_err "list of files" "data.train_files: got a list '[$W/train.jsonl,$W/test.jsonl]', expected one JSONL file" \
    "$MOERL" sft --config "$W/cfg.yaml" trainer.default_local_dir="$W/ls" "data.train_files=[$W/train.jsonl,$W/test.jsonl]"

finish
