#!/usr/bin/env bash
# End-to-end tests of validation as verl reports it (rollout.val_kwargs.*, src/rl/validate.h) in
# `moerl rl` at toy scale: N = 4 sampled responses per held-out prompt write verl's val-core / val-aux
# metrics (mean@4, best@4, std@4, ... per data_source) with val/accuracy into metrics.jsonl at the start,
# every trainer.test_freq versions and the end, reproducibly; the default (greedy, N = 1) writes
# mean@1 = val/accuracy as before; a resumed run keeps its start accuracy and goes on writing them; bad
# rollout.val_kwargs.* values are refused naming the key. (The values themselves are checked against a
# numpy reference in tests/test_validate.c.) `moerl eval --samples N --temperature T` reports the same metrics,
# unchanged by the paged KV cache's rollout.* keys (prefix sharing, a budget that preempts), which reach
# eval's and validation's engines.
# Usage: tests/e2e_val.sh [BUILD_DIR]   (default build; uses BUILD_DIR/moerl)
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
MOERL=$BUILD/moerl
if [[ ! -x $MOERL ]]; then
    bad "setup" "$MOERL not built"
    finish
fi
export OMP_NUM_THREADS=1
COMMON=(sft.total_training_steps=0 trainer.n_threads=1 trainer.resume_mode=disable trainer.save_freq=-1
        async_training.mode=lockstep trainer.total_training_steps=2 trainer.test_freq=1 trainer.val_n=8 data.n_test=8)
SAMPLED=(rollout.val_kwargs.n=4 rollout.val_kwargs.do_sample=true rollout.val_kwargs.temperature=1.0)
# a short warm start on one-digit sums, so that some held-out responses are right (not every value 0)
WARM=(data.arith_digits=1 sft.total_training_steps=150 trainer.val_n=32 data.n_test=32)
run_rl() {
    local name=$1
    shift
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$W/$name" "$@" >"$W/$name.log" 2>&1
}

CHECK=$W/check.py
cat >"$CHECK" <<'EOF'
import json, sys

def val_rows(d):
    with open(d + "/metrics.jsonl") as f:
        return [r for r in (json.loads(l) for l in f if l.strip()) if "val/accuracy" in r]

def fail(msg):
    print(msg)
    sys.exit(1)

cmd, d, args = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = val_rows(d)
if cmd == "sampled":  # N = 4: the val-core / val-aux keys at every validation step
    steps = [r["step"] for r in rows]
    if steps != [int(s) for s in args[0].split(",")]:
        fail("validation records at steps %s, want %s" % (steps, args[0]))
    P = "val-%s/arith/reward/"
    for r in rows:
        core = sorted(k[len("val-core/arith/reward/"):] for k in r if k.startswith("val-core/"))
        want = ["best@4/mean", "best@4/std", "mean@4"]
        maj = ["maj@4/mean", "maj@4/std"]
        if core != want and core != sorted(want + maj):  # maj@4 once the built-in rewards return pred
            fail("step %d: val-core metrics %s, want %s (+ %s)" % (r["step"], core, want, maj))
        for k in ["std@4", "best@2/mean", "best@2/std", "worst@2/mean", "worst@4/mean", "worst@4/std"]:
            if (P % "aux") + k not in r:
                fail("step %d: %s missing" % (r["step"], (P % "aux") + k))
        m, b, w = r[(P % "core") + "mean@4"], r[(P % "core") + "best@4/mean"], r[(P % "aux") + "worst@4/mean"]
        if not (0 <= w <= m <= b <= 1):
            fail("step %d: worst@4 %g ≤ mean@4 %g ≤ best@4 %g in [0, 1] violated" % (r["step"], w, m, b))
        # arith's rewards are 0 or 1: the fraction scoring ≥ 1 is the mean reward
        if abs(r["val/accuracy"] - m) > 1e-12:
            fail("step %d: val/accuracy %g ≠ mean@4 %g" % (r["step"], r["val/accuracy"], m))
        if r["fully_async/count/current_param_version"] != r["step"]:
            fail("step %d: version %g" % (r["step"], r["fully_async/count/current_param_version"]))
elif cmd == "greedy":  # N = 1: mean@1 = val/accuracy and nothing else
    if not rows:
        fail("no validation record")
    for r in rows:
        keys = sorted(k for k in r if k.startswith("val-"))
        if keys != ["val-core/arith/reward/mean@1"] or abs(r[keys[0]] - r["val/accuracy"]) > 1e-12:
            fail("step %d: %s" % (r["step"], r))
elif cmd == "nonzero":  # some best@4 above 0, and above mean@4 where the prompts are not all-or-nothing
    if not any(r["val-core/arith/reward/best@4/mean"] > r["val-core/arith/reward/mean@4"] > 0 for r in rows):
        fail("no record with best@4 > mean@4 > 0: %s" % rows)
elif cmd == "same":  # the same validation records as another run's
    other = val_rows(args[0])
    if rows != other:
        fail("validation records differ:\n%s\n%s" % (rows[:1], other[:1]))
print("ok")
EOF

# N = 4 sampled: start, every version, end
if run_rl sampled "${SAMPLED[@]}" "${WARM[@]}"; then ok "sampled run"; else bad "sampled run" "$(tail -3 "$W/sampled.log")"; fi
check "sampled: val-core/val-aux metrics at steps 0, 1, 2" "$PY" "$CHECK" sampled "$W/sampled" 0,1,2
check "sampled: after the warm start some responses are right" "$PY" "$CHECK" nonzero "$W/sampled"
check "sampled: the console line per data_source" grep -q "v1   validation arith: reward/mean@4 [0-9.]* reward/best@4/mean" "$W/sampled.log"
check "sampled: the held-out accuracy line stays" grep -q "v1   held-out accuracy" "$W/sampled.log"
run_rl sampled2 "${SAMPLED[@]}" "${WARM[@]}"
check "sampled: reproducible from the seed (lockstep)" "$PY" "$CHECK" same "$W/sampled" "$W/sampled2"

# greedy default: today's accuracy as mean@1
if run_rl greedy; then ok "greedy run"; else bad "greedy run" "$(tail -3 "$W/greedy.log")"; fi
check "greedy: mean@1 = val/accuracy only" "$PY" "$CHECK" greedy "$W/greedy"
if grep -q "validation arith:" "$W/greedy.log"; then bad "greedy: no per-source line at N = 1"; else ok; fi

# resume: the start accuracy from the checkpoint, then N = 4 metrics at the new steps
run_rl resume "${SAMPLED[@]}" trainer.save_freq=1
if run_rl resume "${SAMPLED[@]}" trainer.save_freq=1 trainer.resume_mode=auto trainer.total_training_steps=3; then
    ok "resumed run"
else
    bad "resumed run" "$(tail -3 "$W/resume.log")"
fi
check "resume: records at steps 0, 1, 2, then 3" "$PY" "$CHECK" sampled "$W/resume" 0,1,2,3
check "resume: start accuracy from the checkpoint" grep -q "resumed from" "$W/resume.log"

# moerl eval: the same metrics from a checkpoint (the resumed run's), greedy and sampled
CK=$W/resume/checkpoint
TEST=$(ls "$W"/resume/data/*-test*.jsonl 2>/dev/null | grep -v train | head -1)
"$MOERL" eval --model "$CK" --data "$TEST" --n 8 --max-new-tokens 8 >"$W/eval1.json" 2>"$W/eval1.err"
"$MOERL" eval --model "$CK" --data "$TEST" --n 8 --max-new-tokens 8 --samples 4 --temperature 1 >"$W/eval4.json" \
    2>"$W/eval4.err"
"$MOERL" eval --model "$CK" --data "$TEST" --n 8 --max-new-tokens 8 --samples 4 --temperature 1 >"$W/eval4b.json" \
    2>/dev/null
check "eval: greedy mean@1 = accuracy, sampled mean@4 / best@4 / std@4, reproducible" "$PY" - "$W" <<'PYEOF'
import json, sys
w = sys.argv[1]
e1, e4, e4b = (json.load(open(w + f)) for f in ("/eval1.json", "/eval4.json", "/eval4b.json"))
m1, m4 = e1["metrics"], e4["metrics"]
assert e1["samples"] == 1 and list(m1) == ["val-core/arith/reward/mean@1"], e1
assert m1["val-core/arith/reward/mean@1"] == e1["accuracy"], e1
assert e4["samples"] == 4 and e4["n"] == 8, e4
for k in ("val-core/arith/reward/mean@4", "val-core/arith/reward/best@4/mean", "val-aux/arith/reward/std@4"):
    assert k in m4, (k, m4)
assert abs(m4["val-core/arith/reward/mean@4"] - e4["accuracy"]) < 1e-6, e4
assert e4 == e4b, (e4, e4b)
PYEOF
# the paged KV cache's keys reach eval's engine (docs/engine.md): the 4 samples of a prompt share its
# prompt blocks (prefix caching, on by default as in moerl rl), a budget of 12 blocks of 4 tokens (smoke
# model: 2 KB a block, a prompt + 8 tokens needs ~10) preempts, and neither changes the responses' metrics
"$MOERL" eval --model "$CK" --data "$TEST" --n 8 --max-new-tokens 8 --samples 4 --temperature 1 \
    rollout.enable_prefix_caching=false >"$W/eval4off.json" 2>/dev/null
"$MOERL" eval --model "$CK" --data "$TEST" --n 8 --max-new-tokens 8 --samples 4 --temperature 1 \
    rollout.block_size=4 rollout.kv_cache_bytes=24576 >"$W/eval4kv.json" 2>"$W/eval4kv.err"
check "eval: prefix caching and preemption (rollout.* keys) leave the metrics as they are" "$PY" - "$W" <<'PYEOF'
import json, sys
w = sys.argv[1]
e4, off, kv = (json.load(open(w + f)) for f in ("/eval4.json", "/eval4off.json", "/eval4kv.json"))
assert e4["prefix_hit_tokens"] > 0 and e4["preemptions"] == 0, e4
assert off["prefix_hit_tokens"] == 0 and off["preemptions"] == 0, off
assert kv["preemptions"] > 0, kv
for e in (off, kv):
    assert e["metrics"] == e4["metrics"] and e["accuracy"] == e4["accuracy"], (e, e4)
PYEOF
expect_err "eval: a negative rollout.kv_cache_bytes" "rollout.kv_cache_bytes must be ≥ 0" \
    "$MOERL" eval --model "$CK" --data "$TEST" rollout.kv_cache_bytes=-1
expect_err "eval: a budget no prompt fits" "could never run" \
    "$MOERL" eval --model "$CK" --data "$TEST" rollout.block_size=4 rollout.kv_cache_bytes=8192
# and moerl rl: the budget against the longest request of every engine it builds (the rollout's, the warm
# start's evals, validation's), checked before the warm start, validation or any rollout (docs/engine.md),
# naming the key, the budget and the need (smoke model: 2,048 bytes a block of 4 tokens; prompts of at most
# 33 tokens + 8 new: ⌈40/4⌉ = 10 blocks); exactly the need runs
expect_err "rl: a budget no prompt fits, before validation" "rollout.kv_cache_bytes=8192 holds 4 KV blocks of 4 tokens" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$W/kvval" rollout.block_size=4 \
    rollout.kv_cache_bytes=8192
check "rl: the refusal gives the need" grep -qF "needs 10 blocks (20480 bytes)" "$W/err"
expect_err "rl warm start: a budget no prompt fits, before the warm start trains" \
    "raise rollout.kv_cache_bytes to at least 20480" "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" \
    sft.total_training_steps=2 trainer.default_local_dir="$W/kvsft" rollout.block_size=4 rollout.kv_cache_bytes=20479
check "rl warm start: refused before its first step" bash -c '! grep -q "sft warm start" "$1"' _ "$W/err"
run_rl kvexact sft.total_training_steps=2 trainer.total_training_steps=1 rollout.block_size=4 rollout.kv_cache_bytes=20480
check "rl: a budget of exactly the need runs (warm start, validation, rollout)" grep -q "RL done: 1 step" "$W/kvexact.log"
expect_err "eval: --samples 4 without a temperature" "--samples 4 needs --temperature > 0" \
    "$MOERL" eval --model "$CK" --data "$TEST" --samples 4

# bad values name the key
expect_err "n = 0" "rollout.val_kwargs.n must be ≥ 1" "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$W/bad" rollout.val_kwargs.n=0
expect_err "negative temperature" "rollout.val_kwargs.temperature must be a finite number ≥ 0, got -1" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$W/bad" \
    rollout.val_kwargs.temperature=-1
expect_err "do_sample at temperature 0" "rollout.val_kwargs.do_sample=true with rollout.val_kwargs.temperature=0" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$W/bad" \
    rollout.val_kwargs.n=4 rollout.val_kwargs.do_sample=true
expect_err "N greedy copies" "rollout.val_kwargs.n=4 with rollout.val_kwargs.do_sample=false" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$W/bad" rollout.val_kwargs.n=4
expect_err "top_p 0" "rollout.val_kwargs.top_p must be in (0, 1]" "$MOERL" rl --config examples/smoke.yaml \
    "${COMMON[@]}" trainer.default_local_dir="$W/bad" rollout.val_kwargs.top_p=0
if [[ -e $W/bad ]]; then bad "bad values: refused before the output folder exists"; else ok; fi
finish
