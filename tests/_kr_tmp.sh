#!/usr/bin/env bash
# End-to-end tests of the main job, `moerl rl` (fully-async GRPO), at toy scale: staleness
# (on-policy streaming, lag bound in lockstep, versions per trigger_parameter_sync_step), nothing
# lost (one epoch; kill -9 and resume), lockstep reproducibility, the sync baseline, liveness
# (smoke config, watchdog), lr = 0 keeps ppo_kl at 0, and bad input. The semantics are verl
# fully_async_policy's (reference.md, "Fully-async RL").
# Usage: tests/e2e_rl.sh [BUILD_DIR]   (default build; uses BUILD_DIR/moerl)
# Prints one line per check and ends with "N passed, N failed"; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
MOERL=$BUILD/moerl
PY=/usr/bin/python3
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1: $2"; }
finish() {
    echo "$passed passed, $failed failed"
    [[ $failed -eq 0 ]]
    exit $?
}
if [[ ! -x $MOERL ]]; then
    bad "setup" "$MOERL not built"
    finish
fi
base=${MOERL_TESTDATA:-/tmp}
mkdir -p "$base"
WORK=$(mktemp -d "$base/e2e_rl.XXXXXX")
# One compute thread per process: the suite shares 2 cores with other jobs, and OpenMP teams
# spanning all cores of a loaded machine spin against each other (a lockstep run went from 0.6 s
# to 16 s). The roles' own thread settings (async_training.*_threads) are 1 by default.
export OMP_NUM_THREADS=1
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
fi

# Toy-scale overrides of the smoke config: no warm start, no held-out eval, 1 thread, no
# checkpoints unless a test asks, always a fresh start.
COMMON=(sft.total_training_steps=0 trainer.val_n=0 trainer.test_freq=0 trainer.n_threads=1 data.n_test=8
        trainer.resume_mode=disable trainer.save_freq=-1)
# run_rl NAME [key=value ...]: output folder $WORK/NAME, log $WORK/NAME.log; returns the exit code.
run_rl() {
    local name=$1
    shift
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$WORK/$name" "$@" \
        >"$WORK/$name.log" 2>&1
}
# The lag bound the job prints at start ("... lag bound N; ...").
lag_bound_of() { grep -o 'lag bound [0-9]*' "$WORK/$1.log" | head -1 | awk '{print $3}'; }
tail_log() { tail -5 "$WORK/$1.log" | sed 's/^/    | /'; }

# JSONL checks in Python (json module only). Each prints why it failed and exits 1.
CHECK=$WORK/check.py
cat >"$CHECK" <<'EOF'
import collections, json, math, sys

def rows(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]

def fail(msg):
    print(msg)
    sys.exit(1)

def samples(d):
    return rows(d + "/samples.jsonl")

def version_rows(d):
    return [r for r in rows(d + "/metrics.jsonl") if "fully_async/count/current_param_version" in r]

cmd, d, args = sys.argv[1], sys.argv[2], sys.argv[3:]
if cmd == "onpolicy":  # every sample generated entirely by the version that trains it
    s = samples(d)
    if len(s) != int(args[0]):
        fail("%d samples, want %s" % (len(s), args[0]))
    off = [x for x in s if not (x["min_version"] == x["max_version"] == x["trainer_version"])]
    if off:
        fail("%d samples not on-policy, e.g. %s" % (len(off), off[0]))
    m = [r["fully_async/max_staleness"] for r in version_rows(d)]
    if any(v != 0 for v in m):
        fail("fully_async/max_staleness %s" % m)
elif cmd == "maxlag":  # print max over samples of trainer_version - min_version
    print(max(x["trainer_version"] - x["min_version"] for x in samples(d)))
elif cmd == "versions":  # one record per version; +1 per trigger steps
    trig, steps = int(args[0]), int(args[1])
    v = version_rows(d)
    if len(v) != steps // trig:
        fail("%d version records, want %d" % (len(v), steps // trig))
    for i, r in enumerate(v):
        ver, step = r["fully_async/count/current_param_version"], r["training/global_step"]
        if ver != i + 1 or step != (i + 1) * trig or r["step"] != step:
            fail("record %d: version %s at step %s, want version %d at step %d" % (i, ver, step, i + 1, (i + 1) * trig))
elif cmd == "once":  # every (epoch, row) of epochs 0..E-1 trained exactly once
    epochs, n_rows = int(args[0]), int(args[1])
    s = samples(d)
    c = collections.Counter((x["epoch"], x["row"]) for x in s)
    bad_uid = [x for x in s if x["uid"] != x["epoch"] * n_rows + x["row"]]
    want = {(e, r) for e in range(epochs) for r in range(n_rows)}
    dup = sorted(k for k, n in c.items() if n > 1)
    missing = sorted(want - set(c))
    extra = sorted(set(c) - want)
    if dup or missing or extra or bad_uid or len(s) != epochs * n_rows:
        fail("%d samples; duplicated %s; missing %s; unexpected %s; bad uid %s"
             % (len(s), dup[:8], missing[:8], extra[:8], bad_uid[:2]))
elif cmd == "same_metrics":  # identical values except wall-clock-dependent keys
    a, b = rows(d + "/metrics.jsonl"), rows(args[0] + "/metrics.jsonl")
    def timed(k):
        return k.startswith("timing_s/") or k.startswith("perf/") or k.endswith("idle_ratio")
    if len(a) != len(b):
        fail("%d vs %d metric records" % (len(a), len(b)))
    for i, (x, y) in enumerate(zip(a, b)):
        if set(x) != set(y):
            fail("record %d: keys differ: %s" % (i, sorted(set(x) ^ set(y))))
        for k in x:
            if not timed(k) and x[k] != y[k]:
                fail("record %d: %s = %r vs %r" % (i, k, x[k], y[k]))
    if len(a) < 2:
        fail("only %d metric records" % len(a))
elif cmd == "kl":  # |actor/ppo_kl| < tol at every version, over >= min_versions versions
    tol, min_v = float(args[0]), int(args[1])
    v = version_rows(d)
    kl = [(r["fully_async/count/current_param_version"], r["actor/ppo_kl"]) for r in v]
    if len(kl) < min_v:
        fail("%d versions, want >= %d" % (len(kl), min_v))
    off = [(ver, x) for ver, x in kl if not abs(x) < tol]
    if off:
        fail("ppo_kl beyond %g at (version, value) %s" % (tol, off))
    print("max |ppo_kl| %.3g over %d versions" % (max(abs(x) for _, x in kl), len(kl)))
elif cmd == "stale":  # how many samples were trained at a later version than they started
    print(sum(1 for x in samples(d) if x["trainer_version"] > x["min_version"]))
elif cmd == "no_val":
    v = [r for r in rows(d + "/metrics.jsonl") if "val/accuracy" in r]
    if v:
        fail("%d val/accuracy records with trainer.val_n=0, e.g. %s" % (len(v), v[0]))
elif cmd == "ckpt_step":  # trainer_step of the folder's checkpoint, -1 if none (yet)
    try:
        with open(d + "/checkpoint/trainer_state.json") as f:
            print(json.load(f)["trainer_step"])
    except Exception:
        print(-1)
else:
    fail("unknown check " + cmd)
EOF
check() { "$PY" "$CHECK" "$@"; }

# ---------------------------------------------------------------- staleness
# kill -9 after a checkpoint exists, then the same command resumes (resume_mode=auto): over the
# combined samples.jsonl every prompt of every epoch is trained exactly once.
KR=(data.n_train=32 trainer.total_training_steps=0 trainer.total_epochs=6 trainer.save_freq=1
    trainer.resume_mode=auto)
# (the binary itself goes to the background: killing a backgrounded shell function would kill
# only its subshell and leave moerl running)
"$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$WORK/resume" "${KR[@]}" \
    >"$WORK/resume.log" 2>&1 &
pid=$!
step=-1
for _ in $(seq 1 3000); do  # hang guard only (30 s); normally a checkpoint appears within a second
    step=$(check ckpt_step "$WORK/resume")
    [[ $step -ge 3 ]] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
rc1=$?
if [[ $rc1 -ne 137 ]]; then
    bad "kill and resume" "first run was not killed mid-run (exit $rc1, checkpoint step $step)"; tail_log resume
else
    cp "$WORK/resume.log" "$WORK/resume_killed.log"
    if run_rl resume "${KR[@]}"; then
        if ! grep -q "resumed from" "$WORK/resume.log"; then bad "kill and resume" "second run did not resume"
        elif msg=$(check once "$WORK/resume" 6 32); then ok "kill -9 at step >= $step and resume: every prompt of 6 epochs once"
        else bad "kill and resume" "$msg"; fi
    else
        bad "kill and resume" "resumed run exit $?"; tail_log resume
    fi
fi

# ---------------------------------------------------------------- reproducibility, sync mode
echo "outputs kept in $WORK"; finish
