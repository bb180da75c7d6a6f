#!/usr/bin/env bash
# trainer.logger end to end: tiny `moerl rl` and `moerl sft` runs with the console, file and
# tensorboard sinks; their event files are read back by an independent reader (tests/ref/tb_reader.py:
# python3-protobuf with descriptors built at run time, its own CRC32C) and every (step, tag, value)
# compared with metrics.jsonl (values as float32: simple_value is a float — exact, no tolerance);
# the console lines compared with the same records (%.6g text); a resumed run's restart marker; the
# default (file only, today's output); errors for unknown loggers. Ends with "N passed, N failed".
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
READER=tests/ref/tb_reader.py
RS=(--config examples/smoke.yaml trainer.val_n=4 trainer.test_freq=2)

# reader_ok WHAT RUN_DIR JSONL TB_DIR: the reader's checks all pass
reader_ok() {
    local what=$1
    shift
    if $PY $READER check "$@" >"$W/reader.out" 2>&1; then ok "$what: $(grep -c '^ok' "$W/reader.out") reader checks"
    else bad "$what" "$(grep -v '^ok' "$W/reader.out" | head -20)"; fi
}

# console_ok WHAT STDERR JSONL...: the "step N: k=v ..." log lines are the JSONL files' records, in order
console_ok() {
    local what=$1
    shift
    if $PY - "$@" >"$W/console.out" 2>&1 <<'PYEOF'
import json, math, re, sys
lines = [l for l in open(sys.argv[1]) if re.search(r"\] INFO  step -?\d+:", l)]
recs = [json.loads(l) for f in sys.argv[2:] for l in open(f)]
assert len(lines) == len(recs), "%d console lines, %d records" % (len(lines), len(recs))
for l, r in zip(lines, recs):
    head, _, body = l.rstrip("\n").partition("] INFO  ")[2].partition(": ")
    assert head == "step %d" % r["step"], (head, r["step"])
    got = [kv.split("=", 1) for kv in body.split(" ")]
    want = [(k, v) for k, v in r.items() if k != "step"]
    assert [k for k, _ in got] == [k for k, _ in want], (got, want)
    for (k, gv), (_, wv) in zip(got, want):
        # %.6g of the double: compare the text with Python's %.6g of the JSON value (null: non-finite)
        assert (wv is None and gv in ("nan", "inf", "-inf")) or gv == "%.6g" % wv, (k, gv, wv)
print("%d console lines equal the records" % len(lines))
PYEOF
    then ok "$what: $(cat "$W/console.out")"; else bad "$what" "$(tail -5 "$W/console.out")"; fi
}

# --- an RL run with a warm start, all three sinks
R=$W/rl
$M rl "${RS[@]}" sft.total_training_steps=2 trainer.total_training_steps=3 trainer.default_local_dir="$R" \
    "trainer.logger=[console, file, tensorboard]" >"$W/rl.json" 2>"$W/rl.err"
check "rl with [console, file, tensorboard] runs" test $? -eq 0
check "rl: tensorboard folder in the output folder" test -d "$R/tensorboard"
reader_ok "rl event files = metrics.jsonl" "$R" "$R/metrics.jsonl" "$R/tensorboard"
reader_ok "warm-start event files (tensorboard/sft_metrics) = sft_metrics.jsonl" "$R" "$R/sft_metrics.jsonl" \
    "$R/tensorboard/sft_metrics"
console_ok "rl console lines" "$W/rl.err" "$R/sft_metrics.jsonl" "$R/metrics.jsonl"
check "rl: stdout is still the JSON summary" $PY -c 'import json,sys; json.load(open(sys.argv[1]))' "$W/rl.json"
check "rl: config.yaml records the logger list" grep -q 'logger: \["console", "file", "tensorboard"\]' "$R/config.yaml"

# --- resumed: a second event file, with TensorBoard's restart marker after the checkpoint's step
$M rl "${RS[@]}" sft.total_training_steps=2 trainer.total_training_steps=5 trainer.default_local_dir="$R" \
    "trainer.logger=[console, file, tensorboard]" >/dev/null 2>"$W/rl2.err"
check "resumed rl runs" test $? -eq 0
check "resumed: it did resume" grep -q "resumed from" "$W/rl2.err"
check "resumed: two event files" test "$(ls "$R/tensorboard" | grep -c '^events.out.tfevents\.')" -eq 2
reader_ok "resumed: event files (restart rule applied) = metrics.jsonl" "$R" "$R/metrics.jsonl" "$R/tensorboard"
check "resumed: one restart marker, at the checkpoint's step + 1 (4)" grep -qx "restarts: \[4\]" "$W/reader.out"
check "resumed: metrics.jsonl reaches step 5" test "$(tail -1 "$R/metrics.jsonl" | json_field step)" -eq 5

# --- the reader is not blind: a flipped byte in an event file is caught
f=$(ls "$R/tensorboard"/events.out.tfevents.* | head -1)
mkdir -p "$W/corrupt"
cp "$f" "$W/corrupt/"
g="$W/corrupt/$(basename "$f")"
$PY -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()); b[len(b)//2]^=1; open(p,"wb").write(bytes(b))' "$g"
if $PY $READER check "$R" "$R/metrics.jsonl" "$W/corrupt" >"$W/corrupt.out" 2>&1; then bad "reader: corrupt file accepted"
else check "reader: a flipped byte fails a CRC" grep -q "bad .*CRC" "$W/corrupt.out"; fi

# --- a new run in the folder (resume_mode=disable + overwrite) starts the event files anew
$M rl "${RS[@]}" sft.total_training_steps=0 trainer.total_training_steps=2 trainer.default_local_dir="$R" \
    trainer.resume_mode=disable trainer.overwrite_output_dir=true trainer.logger=file,tensorboard >/dev/null 2>"$W/rl3.err"
check "fresh rl over the old run" test $? -eq 0
check "fresh: one event file" test "$(ls "$R/tensorboard" | grep -c '^events.out.tfevents\.')" -eq 1
reader_ok "fresh: event file = metrics.jsonl" "$R" "$R/metrics.jsonl" "$R/tensorboard"
check "fresh: no console lines without console" test "$(grep -c '\] INFO  step [0-9]*:' "$W/rl3.err")" -eq 0

# --- the default is today's output: metrics.jsonl, no event files, no console metric lines
D=$W/def
$M rl "${RS[@]}" sft.total_training_steps=0 trainer.total_training_steps=1 trainer.default_local_dir="$D" >/dev/null 2>"$W/def.err"
check "default rl runs" test $? -eq 0
check "default: metrics.jsonl" test -s "$D/metrics.jsonl"
check "default: no tensorboard folder" test ! -e "$D/tensorboard"
check "default: no console metric lines" test "$(grep -c '\] INFO  step [0-9]*:' "$W/def.err")" -eq 0

# --- tensorboard alone: no metrics.jsonl, event files still complete
T=$W/tbonly
$M rl "${RS[@]}" sft.total_training_steps=0 trainer.total_training_steps=1 trainer.default_local_dir="$T" \
    trainer.logger=tensorboard >/dev/null 2>"$W/tb.err"
check "rl with [tensorboard] runs" test $? -eq 0
check "tensorboard only: no metrics.jsonl" test ! -e "$T/metrics.jsonl"
check "tensorboard only: an event file" test -s "$(ls "$T/tensorboard"/events.out.tfevents.* | head -1)"

# --- moerl sft writes its event files too
$M tasks --task arith --out "$W/arith" --n-train 48 --n-test 8 >/dev/null 2>&1
cat >"$W/sft.yaml" <<YEOF
model: {hidden_size: 32, intermediate_size: 64, moe_intermediate_size: 32, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_experts: 4, num_experts_per_tok: 2}
data: {task: "", train_files: $W/arith/train.jsonl, val_files: $W/arith/test.jsonl, train_batch_size: 16}
trainer: {total_training_steps: 3, default_local_dir: $W/sft, val_n: 8, logger: [console, file, tensorboard]}
YEOF
$M sft --config "$W/sft.yaml" >/dev/null 2>"$W/sft.err"
check "sft with a YAML logger list runs" test $? -eq 0
reader_ok "sft event files = metrics.jsonl" "$W/sft" "$W/sft/metrics.jsonl" "$W/sft/tensorboard"
console_ok "sft console lines" "$W/sft.err" "$W/sft/metrics.jsonl"

# --- errors name the key, the value and what is supported
expect_err "unknown logger" "trainer.logger: 'wandb' is not a logger moerl has (supported: console, file, tensorboard)" \
    $M rl "${RS[@]}" trainer.default_local_dir="$W/e1" trainer.logger=console,wandb
expect_err "empty logger list" "trainer.logger is empty" $M rl "${RS[@]}" trainer.default_local_dir="$W/e2" "trainer.logger=[]"
expect_err "logger twice" "'file' is given twice" $M rl "${RS[@]}" trainer.default_local_dir="$W/e3" trainer.logger=file,file
expect_err "sft: unknown logger" "'mlflow' is not a logger" $M sft --config "$W/sft.yaml" trainer.default_local_dir="$W/e4" \
    trainer.logger=mlflow
check "errors leave no folder behind" test ! -e "$W/e1/tensorboard"
finish
