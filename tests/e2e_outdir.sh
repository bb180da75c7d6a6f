#!/usr/bin/env bash
# End-to-end tests of the output folder's safety: trainer.overwrite_output_dir replaces the previous run
# only once every check has passed (a refused overwrite leaves it byte for byte), says what it deleted
# (and nothing when nothing was there), resume_mode=auto refuses a folder holding logs without a
# checkpoint, generate prints only the error on a failure, and a stopped moerl sft prints its summary.
# Ends with "N passed, N failed".
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
TD=${MOERL_TESTDATA:-$BUILD/testdata}

cat >"$W/rl.yaml" <<YEOF
model: {hidden_size: 32, intermediate_size: 64, moe_intermediate_size: 32, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_experts: 4, num_experts_per_tok: 2,
        max_position_embeddings: 128}
data: {task: arith, n_train: 32, n_test: 8, max_response_length: 8}
sft: {total_training_steps: 0}
rollout: {n: 2, max_num_seqs: 16}
actor: {ppo_mini_batch_size: 4}
trainer: {total_training_steps: 2, test_freq: 0, save_freq: 2, val_n: 0, n_threads: 1}
YEOF
# checksums of every file in a folder (the lock aside), sorted by name
sums() { (cd "$1" && find . -type f ! -name .moerl.lock | LC_ALL=C sort | xargs md5sum); }

# --- a refused overwrite leaves the previous run as it was
OW=$W/ow
$M rl --config "$W/rl.yaml" trainer.default_local_dir="$OW" >"$W/out" 2>"$W/err"
check "rl: the first run completes (rc $?)" test -s "$OW/checkpoint/trainer_state.json" -a -s "$OW/metrics.jsonl"
sums "$OW" >"$W/sum0"
# data: a row whose ground_truth is a bool (a string, number, object or list is expected)
$PY - "$OW/data" "$W/bad.jsonl" <<'PYEOF'
import glob, json, sys
rows = [json.loads(l) for l in open(sorted(glob.glob(sys.argv[1] + "/*train*.jsonl"))[0])]
rows[1]["reward_model"]["ground_truth"] = True
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PYEOF
TEST_FILE=$(ls "$OW"/data/*.jsonl | grep -v train | head -1)
cp "$TEST_FILE" "$W/test.jsonl"
REPLACE=(trainer.default_local_dir="$OW" trainer.resume_mode=disable trainer.overwrite_output_dir=true)
expect_err "rl overwrite: bad data refused" "bad.jsonl" \
    $M rl --config "$W/rl.yaml" "${REPLACE[@]}" data.task= data.train_files="$W/bad.jsonl" data.val_files="$W/test.jsonl"
check "rl overwrite refused (data): nothing said deleted" bash -c "! grep -q deleted '$W/err'"
sums "$OW" >"$W/sum1"
check "rl overwrite refused (data): the previous run's files are unchanged" cmp -s "$W/sum0" "$W/sum1"
# a data_source with no reward rule and no reward program
$PY - "$W/bad.jsonl" "$W/nosrc.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows[1]["reward_model"]["ground_truth"] = "3"
rows[1]["data_source"] = "no_such_source"
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PYEOF
expect_err "rl overwrite: unknown data_source refused" "no_such_source" \
    $M rl --config "$W/rl.yaml" "${REPLACE[@]}" data.task= data.train_files="$W/nosrc.jsonl" data.val_files="$W/test.jsonl"
sums "$OW" >"$W/sum1"
check "rl overwrite refused (data_source): the previous run's files are unchanged" cmp -s "$W/sum0" "$W/sum1"
# a chat template that raises on the first prompt
printf '{{ raise_exception("template refuses") }}' >"$W/bad.jinja"
expect_err "rl overwrite: a raising chat template refused" "template refuses" \
    $M rl --config "$W/rl.yaml" "${REPLACE[@]}" data.chat_template="$W/bad.jinja"
sums "$OW" >"$W/sum1"
check "rl overwrite refused (template): the previous run's files are unchanged" cmp -s "$W/sum0" "$W/sum1"
check "rl overwrite refused: no set-aside folder left" test ! -e "$OW/.moerl.previous"

# --- an overwrite that runs: says what it deleted, and the old checkpoint is gone
$M rl --config "$W/rl.yaml" "${REPLACE[@]}" trainer.total_training_steps=1 trainer.save_freq=-1 >"$W/out" 2>"$W/err"
check "rl overwrite runs (rc $?)" grep -q "RL done" "$W/err"
check "rl overwrite: names what it deleted" grep -qF "deleted the previous run in $OW: checkpoint/, metrics.jsonl, samples.jsonl, plot.dat, plot.gp, reward_accuracy.png, run.log, config.yaml (12 files)" "$W/err"
check "rl overwrite: the message is in run.log too" grep -q "deleted the previous run" "$OW/run.log"
check "rl overwrite: the previous checkpoint is gone" test ! -e "$OW/checkpoint" -a ! -e "$OW/.moerl.previous"
check "rl overwrite: the new run's metrics (1 step)" test "$(wc -l <"$OW/metrics.jsonl")" -eq 1

# --- overwrite of a missing or empty folder: nothing deleted, nothing said
for d in "$W/fresh" "$W/empty"; do
    [[ $d == */empty ]] && mkdir -p "$d"
    $M rl --config "$W/rl.yaml" trainer.default_local_dir="$d" trainer.resume_mode=disable \
        trainer.overwrite_output_dir=true trainer.total_training_steps=1 trainer.save_freq=-1 >"$W/out" 2>"$W/err"
    check "rl overwrite of $(basename "$d") folder runs (rc $?)" grep -q "RL done" "$W/err"
    check "rl overwrite of $(basename "$d") folder: no 'deleted' line" bash -c "! grep -q 'deleted' '$W/err'"
done

# --- resume_mode=auto over a run's logs without a checkpoint (save_freq=-1): refused like disable
# ($W/fresh holds one: a completed run with trainer.save_freq=-1)
sums "$W/fresh" >"$W/sum0"
expect_err "rl auto over logs without a checkpoint: refused" "holds a run's logs (metrics.jsonl, samples.jsonl)" \
    $M rl --config "$W/rl.yaml" trainer.default_local_dir="$W/fresh" trainer.total_training_steps=1 trainer.save_freq=-1
check "rl auto refusal names the ways out" grep -q "trainer.overwrite_output_dir=true, or choose another trainer.default_local_dir" "$W/err"
sums "$W/fresh" >"$W/sum1"
check "rl auto refusal: the logs are unchanged" cmp -s "$W/sum0" "$W/sum1"
expect_err "rl disable over the same folder: refused too" "holds a run" \
    $M rl --config "$W/rl.yaml" trainer.default_local_dir="$W/fresh" trainer.resume_mode=disable
# a run an interrupted overwrite set aside (.moerl.previous/, nothing to resume beside it): named as such, with
# how to keep it (move it back) — not as logs without a checkpoint
mkdir -p "$W/aside/.moerl.previous" && cp -r "$W/fresh/." "$W/aside/.moerl.previous/"
expect_err "rl auto over a set-aside run: refused, naming it" "the previous run an overwrite set aside" \
    $M rl --config "$W/rl.yaml" trainer.default_local_dir="$W/aside" trainer.total_training_steps=1
check "rl auto over a set-aside run: says how to keep it" grep -q "move the contents of .*moerl.previous back" "$W/err"

# --- generate: on an error, the error alone (no summary)
$M generate --model "$TD/model_b" --prompt-tokens 1,5,9,999999 --max-new-tokens 4 >"$W/out" 2>"$W/err"
rc=$?
check "generate: token outside the vocabulary fails (rc $rc)" test $rc -eq 1
check "generate error: the vocabulary error is printed" grep -q "vocabulary" "$W/err"
check "generate error: no success summary" bash -c "! grep -q 'response\|KV cache' '$W/err'"
check "generate error: nothing on stdout" test ! -s "$W/out"

# --- moerl sft stopped by SIGINT prints its summary line (stopped_by_signal), as moerl rl does
$M tasks --task arith --out "$W/arith" --n-train 64 --n-test 8 >/dev/null 2>&1
cat >"$W/sft.yaml" <<YEOF
model: {hidden_size: 32, intermediate_size: 64, moe_intermediate_size: 32, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_experts: 4, num_experts_per_tok: 2}
data: {task: "", train_files: $W/arith/train.jsonl, val_files: $W/arith/test.jsonl, train_batch_size: 4}
trainer: {total_training_steps: 100000, total_epochs: 100000, default_local_dir: $W/sft, val_n: 4, n_threads: 1}
YEOF
$M sft --config "$W/sft.yaml" >"$W/sft.out" 2>"$W/sft.err" &
pid=$!
# the first step's line in metrics.jsonl, then SIGINT (polled: no sleep that depends on the machine's speed)
while kill -0 $pid 2>/dev/null; do
    [[ -s $W/sft/metrics.jsonl ]] && break
    sleep 0.05
done
kill -INT $pid
wait $pid
rc=$?
check "sft stopped by SIGINT: rc 130 (rc $rc)" test $rc -eq 130
$PY - "$W/sft.out" <<'PYEOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
j = json.loads(lines[0])
assert j["stopped_by_signal"] == 2, j
assert j["accuracy_after"] is None, j  # not measured: the run stopped
assert j["checkpoint"].endswith("/sft/checkpoint"), j
PYEOF
check "sft stopped by SIGINT: one JSON summary line with stopped_by_signal 2" test $? -eq 0
$M sft --config "$W/sft.yaml" trainer.total_training_steps=2 trainer.resume_mode=disable \
    trainer.overwrite_output_dir=true >"$W/sft.out" 2>"$W/sft.err"
check "sft finished (rc $?): stopped_by_signal null" test "$(json_field stopped_by_signal "$W/sft.out")" = None
finish
