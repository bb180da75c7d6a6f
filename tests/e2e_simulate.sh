#!/usr/bin/env bash
# moerl simulate runs the production scheduler: in lockstep and sync mode (deterministic in
# `moerl rl` too) a simulated run trains exactly the groups the real run trains — same uids in the
# same steps, same start/min/max policy versions per group, same interrupted responses — so
# samples.jsonl is identical line for line but for the responses' tokens, text and rewards, which the
# simulator does not produce (its engine only skips the model: admission,
# the staleness budget, interrupt/resume and the step loop are moerl rl's code). The async
# simulation is deterministic (two runs print the same result) and its bookkeeping is consistent
# (prompts trained = steps × prompts per step; partial rollout off never interrupts; staleness 0
# with one step per sync is on-policy). Run by tests/run.sh as `bash tests/e2e_simulate.sh BUILD`.
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
OUT=$W
CFG=examples/bench_async.yaml
BASE=(trainer.total_training_steps=4 data.max_response_length=96 model.max_position_embeddings=160
      trainer.resume_mode=disable)

same_samples() {  # label, mode, extra keys...
    local label=$1 mode=$2
    shift 2
    if ! $M rl --config $CFG trainer.default_local_dir="$OUT/real_$label" async_training.mode=$mode "${BASE[@]}" "$@" \
        >"$OUT/real_$label.json" 2>"$OUT/real_$label.log"; then
        fail "$label: moerl rl failed: $(tail -3 "$OUT/real_$label.log")"; return
    fi
    if ! $M simulate --config $CFG trainer.default_local_dir="$OUT/sim_$label" async_training.mode=$mode "${BASE[@]}" "$@" \
        >"$OUT/sim_$label.json" 2>"$OUT/sim_$label.log"; then
        fail "$label: moerl simulate failed: $(tail -3 "$OUT/sim_$label.log")"; return
    fi
    # the scheduling record of each group: every field but the responses' content (the simulator's engine
    # samples token 0 and scores nothing), with each response's length kept
    sched() {
        /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    g = json.loads(line)
    g["responses"] = [len(r["ids"]) for r in g.get("responses", [])]
    print(json.dumps(g, sort_keys=True))' "$1"
    }
    if [[ -s $OUT/sim_$label/samples.jsonl ]] && sched "$OUT/real_$label/samples.jsonl" >"$OUT/real_$label.sched" &&
        sched "$OUT/sim_$label/samples.jsonl" >"$OUT/sim_$label.sched" && cmp -s "$OUT/real_$label.sched" "$OUT/sim_$label.sched"; then
        ok
        echo "$label: samples.jsonl identical ($(wc -l <"$OUT/sim_$label/samples.jsonl") groups)"
    else
        fail "$label: samples.jsonl differs between moerl rl and moerl simulate"
        diff "$OUT/real_$label.sched" "$OUT/sim_$label.sched" | head -4
    fi
    /usr/bin/python3 - "$OUT/real_$label.json" "$OUT/sim_$label.json" <<'PY' && ok || fail "$label: generated tokens or versions differ"
import json, sys
a = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); b = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
sys.exit(0 if a["tokens_generated"] == b["tokens_generated"] and a["final_version"] == b["versions"] and a["max_staleness"] == b["max_staleness"] else 1)
PY
}
same_samples lockstep_partial lockstep async_training.partial_rollout=true async_training.staleness_threshold=0.5
same_samples sync sync

# never into a real run's folder (it would overwrite the run's metrics.jsonl and samples.jsonl): a
# folder with checkpoint/ (what moerl rl / sft write; a simulation writes none) is refused, untouched
mkdir -p "$OUT/realrun/checkpoint" && echo '{"step": 1}' >"$OUT/realrun/metrics.jsonl"
$M simulate --config $CFG trainer.default_local_dir="$OUT/realrun" "${BASE[@]}" >/dev/null 2>"$OUT/into_real.log"
rc=$?
if [[ $rc -ne 0 ]] && grep -q "holds a real run (checkpoint)" "$OUT/into_real.log" &&
    [[ $(cat "$OUT/realrun/metrics.jsonl") == '{"step": 1}' ]]; then ok
else fail "simulate into a real run's folder: exit $rc, $(tail -c 200 "$OUT/into_real.log")"; fi
# a real run without a checkpoint (trainer.save_freq=-1) is known by its run.log, which a simulation
# never writes: refused, untouched
mkdir -p "$OUT/realnockpt" && echo '{"step": 1}' >"$OUT/realnockpt/metrics.jsonl" && echo log >"$OUT/realnockpt/run.log"
$M simulate --config $CFG trainer.default_local_dir="$OUT/realnockpt" "${BASE[@]}" >/dev/null 2>"$OUT/into_real2.log"
rc=$?
if [[ $rc -ne 0 ]] && grep -q "holds a real run (run.log)" "$OUT/into_real2.log" &&
    [[ $(cat "$OUT/realnockpt/metrics.jsonl") == '{"step": 1}' ]]; then ok
else fail "simulate into a real run without a checkpoint: exit $rc, $(tail -c 200 "$OUT/into_real2.log")"; fi
# --sweep writes one folder per setting (sync/, async_s0.3_partial_on/, ...): a real run in one of them too
mkdir -p "$OUT/realsweep/sync/checkpoint" && echo '{"step": 1}' >"$OUT/realsweep/sync/metrics.jsonl"
$M simulate --config $CFG --sweep trainer.default_local_dir="$OUT/realsweep" "${BASE[@]}" >/dev/null 2>"$OUT/sweep_real.log"
rc=$?
if [[ $rc -ne 0 ]] && grep -q "realsweep/sync holds a real run" "$OUT/sweep_real.log" &&
    [[ $(cat "$OUT/realsweep/sync/metrics.jsonl") == '{"step": 1}' ]]; then ok
else fail "simulate --sweep into a real run's sub-folder: exit $rc, $(tail -c 200 "$OUT/sweep_real.log")"; fi

# a micro-batch token limit below one sequence (longest prompt + data.max_response_length=96) is refused
# at startup naming the key, its value and the minimum, as moerl rl refuses it
$M simulate --config $CFG trainer.default_local_dir="$OUT/short_mb" "${BASE[@]}" actor.ppo_max_token_len_per_gpu=64 \
    >/dev/null 2>"$OUT/short_mb.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -qE "actor.ppo_max_token_len_per_gpu=64 is below one sequence: .* \+ data.max_response_length=96 = [0-9]+ tokens.*at least [0-9]+" "$OUT/short_mb.log" \
    && [[ ! -e "$OUT/short_mb" ]]; then ok  # the folder it made (with its generated data/) is removed
else fail "simulate with actor.ppo_max_token_len_per_gpu below one sequence: exit $rc, $(tail -c 300 "$OUT/short_mb.log")"; fi
# ... and since that folder is gone, the message names the generated data by the key that made it, not by
# its file under short_mb/data/
if grep -q "the longest prompt of the training data generated by data.task=arith ([0-9]* tokens)" "$OUT/short_mb.log" &&
    ! grep -q "short_mb/data" "$OUT/short_mb.log"; then ok
else fail "simulate refusal names a generated file it removed: $(tail -c 300 "$OUT/short_mb.log")"; fi
# a prompt over data.max_prompt_length in generated data: its row is named by line and data.task
$M simulate --config $CFG trainer.default_local_dir="$OUT/long_gen" "${BASE[@]}" data.max_prompt_length=5 \
    >/dev/null 2>"$OUT/long_gen.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "simulate: line 1 of the training data generated by data.task=arith: the prompt has [0-9]* tokens" \
    "$OUT/long_gen.log" && ! grep -q "long_gen/data" "$OUT/long_gen.log" && [[ ! -e "$OUT/long_gen" ]]; then ok
else fail "simulate with generated prompts over data.max_prompt_length: exit $rc, $(tail -c 300 "$OUT/long_gen.log")"; fi
# --model that does not exist: refused naming it, before (and without) the warning about the config file's
# model.* keys it would have overridden ($CFG sets model.*; none on the command line, which would be a conflict)
$M simulate --config $CFG --model "$OUT/no_such_model" trainer.default_local_dir="$OUT/nomodel" \
    >/dev/null 2>"$OUT/nomodel.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "simulate: --model: cannot read '$OUT/no_such_model'" "$OUT/nomodel.log" &&
    ! grep -q "WARN" "$OUT/nomodel.log" && [[ ! -e "$OUT/nomodel" ]]; then ok
else fail "simulate --model of a missing folder: exit $rc, $(head -c 400 "$OUT/nomodel.log")"; fi
# --config twice: refused naming both (the last one used to win silently), nothing made
$M simulate --config $CFG --config examples/demo.yaml trainer.default_local_dir="$OUT/twice" >/dev/null 2>"$OUT/twice.log"
rc=$?
if [[ $rc -eq 2 ]] && grep -qF "simulate: --config given twice ('$CFG' and 'examples/demo.yaml')" "$OUT/twice.log" &&
    [[ ! -e "$OUT/twice" ]]; then ok
else fail "simulate --config twice: exit $rc, $(head -c 300 "$OUT/twice.log")"; fi
# --model whose config.json is not valid JSON: the same (the parse error first, no warning)
mkdir -p "$OUT/bad_model" && printf '{"hidden_size": 64,' >"$OUT/bad_model/config.json"
$M simulate --config $CFG --model "$OUT/bad_model" trainer.default_local_dir="$OUT/badmodel" \
    >/dev/null 2>"$OUT/badmodel.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "simulate: --model: config '$OUT/bad_model/config.json': not valid JSON" "$OUT/badmodel.log" &&
    ! grep -q "WARN" "$OUT/badmodel.log" && [[ ! -e "$OUT/badmodel" ]]; then ok
else fail "simulate --model with a malformed config.json: exit $rc, $(head -c 400 "$OUT/badmodel.log")"; fi
# actor.use_kl_loss: the KL reference's forward-only pass over the step's tokens, once per step (not per
# epoch), costs a third of a training pass. Sync mode trains the same groups either way (deterministic, the
# update time moves no sample) and the cpu device has no fixed cost per update (sim.update_overhead_s 0), so
# at 2 PPO epochs the trainer's work grows by exactly (2 + 1/3) / 2 (relative 1e-9: rounding of the sums only)
for kl in false true; do
    $M simulate --config $CFG trainer.default_local_dir="$OUT/kl_$kl" "${BASE[@]}" async_training.mode=sync --json \
        actor.ppo_epochs=2 actor.use_kl_loss=$kl >"$OUT/kl_$kl.json" 2>"$OUT/kl_$kl.log" ||
        fail "simulate actor.use_kl_loss=$kl: $(tail -2 "$OUT/kl_$kl.log")"
done
/usr/bin/python3 - "$OUT/kl_false.json" "$OUT/kl_true.json" 2 <<'PY'
import json, sys
a, b = (json.loads(open(f).read()) for f in sys.argv[1:3])
e = int(sys.argv[3])
bad = []
if a["tokens_generated"] != b["tokens_generated"] or a["steps"] != b["steps"]: bad.append("the two runs trained different data")
if not b["train_work_s"] > a["train_work_s"]: bad.append("train_work_s %g with the KL reference, %g without" % (b["train_work_s"], a["train_work_s"]))
want = a["train_work_s"] * (e + 1 / 3) / e
if abs(b["train_work_s"] - want) > 1e-9 * want: bad.append("train_work_s %g, want %g × (%d + 1/3) / %d = %g" % (b["train_work_s"], a["train_work_s"], e, e, want))
if not b["wall_s"] > a["wall_s"]: bad.append("wall_s did not rise")
print("; ".join(bad) if bad else "KL reference pass timed")
sys.exit(1 if bad else 0)
PY
[[ $? -eq 0 ]] && ok || fail "simulate actor.use_kl_loss"

# async: deterministic, consistent
S=(--config $CFG trainer.resume_mode=disable trainer.total_training_steps=8 async_training.mode=async --json
   sim.step_overhead_s=0.003)  # a rollout-bound setting: syncs find responses in flight
$M simulate "${S[@]}" trainer.default_local_dir="$OUT/a1" >"$OUT/a1.json" 2>/dev/null || fail "async simulate failed"
$M simulate "${S[@]}" trainer.default_local_dir="$OUT/a2" >"$OUT/a2.json" 2>/dev/null || fail "async simulate failed"
cmp -s "$OUT/a1.json" "$OUT/a2.json" && ok || fail "two async simulations of the same seed differ"
# the other way round: moerl rl refuses a simulation's folder (its SIMULATION marker), leaving it untouched
cp "$OUT/a1/metrics.jsonl" "$OUT/a1_metrics.before"
$M rl --config $CFG trainer.default_local_dir="$OUT/a1" "${BASE[@]}" >/dev/null 2>"$OUT/rl_into_sim.log"
rc=$?
if [[ $rc -eq 1 ]] && [[ -f "$OUT/a1/SIMULATION" ]] && grep -q "holds a simulation (SIMULATION" "$OUT/rl_into_sim.log" &&
    cmp -s "$OUT/a1/metrics.jsonl" "$OUT/a1_metrics.before"; then ok
else fail "rl into a simulation's folder: exit $rc, $(tail -c 200 "$OUT/rl_into_sim.log")"; fi
$M sft --config examples/sft.yaml trainer.default_local_dir="$OUT/a1" >/dev/null 2>"$OUT/sft_into_sim.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "holds a simulation (SIMULATION" "$OUT/sft_into_sim.log" &&
    cmp -s "$OUT/a1/metrics.jsonl" "$OUT/a1_metrics.before"; then ok
else fail "sft into a simulation's folder: exit $rc, $(tail -c 200 "$OUT/sft_into_sim.log")"; fi
$M simulate "${S[@]}" trainer.default_local_dir="$OUT/a3" async_training.partial_rollout=false >"$OUT/a3.json" 2>/dev/null || fail "simulate partial off failed"
$M simulate "${S[@]}" trainer.default_local_dir="$OUT/a4" async_training.staleness_threshold=0 >"$OUT/a4.json" 2>/dev/null || fail "simulate s=0 failed"
$M simulate "${S[@]}" trainer.default_local_dir="$OUT/a5" sim.rollout_devices=3 >"$OUT/a5.json" 2>/dev/null || fail "simulate 3 rollout devices failed"
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
r = {k: json.loads(open("%s/%s.json" % (d, k)).read()) for k in ("a1", "a3", "a4", "a5")}
bad = []
for k, v in r.items():
    if v["prompts_trained"] != v["steps"] * 8: bad.append("%s: %d prompts in %d steps" % (k, v["prompts_trained"], v["steps"]))
    if sum(v["staleness_histogram"]) != v["prompts_trained"]: bad.append("%s: staleness histogram does not count every group" % k)
    if not (0 <= v["trainer_idle_ratio"] <= 1 and 0 <= v["rollouter_idle_ratio"] <= 1): bad.append("%s: idle ratio outside [0,1]" % k)
if r["a3"]["interrupted_responses"] != 0: bad.append("partial rollout off interrupted %d responses" % r["a3"]["interrupted_responses"])
if r["a1"]["interrupted_responses"] == 0: bad.append("partial rollout on never interrupted (the check would be vacuous)")
# more rollout devices: the rollout side is busy less of the time (it has more capacity)
if not r["a5"]["rollouter_idle_ratio"] > r["a1"]["rollouter_idle_ratio"]: bad.append("3 rollout devices not idler than 1")
print("; ".join(bad) if bad else "async consistent")
sys.exit(1 if bad else 0)
PY
[[ $? -eq 0 ]] && ok || fail "async consistency"
# the per-version metrics (metrics.jsonl) read the virtual clock, as the final JSON does: the windows'
# update, wait-for-groups and sync times add up to the run's wall_s and the updates to train_busy_s
# (only rounding of sums: 1e-9 relative), idle ratios are shares (they read 64–109 and throughput
# ~1M tokens/s while the rates divided virtual times by real ones)
/usr/bin/python3 - "$OUT/a1.json" "$OUT/a1/metrics.jsonl" <<'PY'
import json, sys
res = json.loads(open(sys.argv[1]).read())
rows = [r for r in map(json.loads, open(sys.argv[2])) if "timing_s/update" in r]
upd = sum(r["timing_s/update"] for r in rows)
tot = sum(r["timing_s/update"] + r["timing_s/gen"] + r["timing_s/param_sync"] for r in rows)
bad = []
if len(rows) != res["versions"]: bad.append("%d metric rows for %d versions" % (len(rows), res["versions"]))
if abs(upd - res["train_busy_s"]) > 1e-9 * res["train_busy_s"]: bad.append("Σ timing_s/update %g != train_busy_s %g" % (upd, res["train_busy_s"]))
if abs(tot - res["wall_s"]) > 1e-9 * res["wall_s"]: bad.append("Σ update+gen+sync %g != wall_s %g" % (tot, res["wall_s"]))
for r in rows:
    if not (0 <= r["trainer/idle_ratio"] <= 1 and 0 <= r["rollouter/idle_ratio"] <= 1): bad.append("step %d: idle ratio outside [0,1]" % r["step"])
    if not (0.2 * res["prompts_per_s"] < r["perf/prompts_per_s"] < 5 * res["prompts_per_s"]): bad.append("step %d: prompts/s %g against %g for the run" % (r["step"], r["perf/prompts_per_s"], res["prompts_per_s"]))
print("; ".join(bad) if bad else "per-version metrics on the virtual clock")
sys.exit(1 if bad else 0)
PY
[[ $? -eq 0 ]] && ok || fail "simulate per-version metrics"

# host sharing (sim.host_cores): processor sharing by the roles that compute. With at least as many cores
# as processes (1 trainer + 3 replicas on 4 cores) nobody waits for a core: the same run as without sharing;
# fewer cores never make it faster (1 ≤ 2 ≤ 4 cores); an idle role costs nothing (1 trainer + 1 replica on
# 2 cores: the update takes its unshared time); on 1 core the update is stretched only while the replica
# computes (by at most the replica's busy time: both run at half speed while they overlap). The calibrated cost keys of the validation script are
# not needed: the default cpu device's costs make the sides comparable (sim.step_overhead_s as above).
H=(--config $CFG trainer.resume_mode=disable trainer.total_training_steps=8 async_training.mode=async --json
   sim.step_overhead_s=0.003)
for k in r3c0:3:0 r3c1:3:1 r3c2:3:2 r3c4:3:4 r1c0:1:0 r1c1:1:1 r1c2:1:2; do
    IFS=: read -r name nr cores <<<"$k"
    $M simulate "${H[@]}" trainer.default_local_dir="$OUT/$name" sim.rollout_devices=$nr sim.host_cores=$cores \
        >"$OUT/$name.json" 2>"$OUT/$name.log" || fail "simulate $name failed: $(tail -2 "$OUT/$name.log")"
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
r = {k: json.loads(open("%s/%s.json" % (d, k)).read()) for k in ("r3c0", "r3c1", "r3c2", "r3c4", "r1c0", "r1c1", "r1c2")}
bad = []
# relative 1e-9: the shared path sums the same step and update times in another order (floating-point rounding)
close = lambda a, b: abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-30)
if not close(r["r3c4"]["prompts_per_s"], r["r3c0"]["prompts_per_s"]): bad.append("4 cores for 4 processes differ from no sharing")
if not (r["r3c1"]["prompts_per_s"] <= r["r3c2"]["prompts_per_s"] <= r["r3c4"]["prompts_per_s"]):
    bad.append("prompts/s not monotone in cores: %s" % [r[k]["prompts_per_s"] for k in ("r3c1", "r3c2", "r3c4")])
if not r["r3c1"]["prompts_per_s"] < r["r3c4"]["prompts_per_s"]: bad.append("1 core not slower than 4 (the rule does nothing)")
if not close(r["r1c2"]["train_busy_s"], r["r1c0"]["train_busy_s"]): bad.append("1 + 1 on 2 cores: the update is stretched")
s1 = r["r1c1"]["train_busy_s"] - r["r1c1"]["train_work_s"]
if not (0 < s1 <= r["r1c1"]["rollout_busy_s"]): bad.append("1 + 1 on 1 core: update stretched by %g s, rollout busy %g s" % (s1, r["r1c1"]["rollout_busy_s"]))
print("; ".join(bad) if bad else "host sharing as documented")
sys.exit(1 if bad else 0)
PY
[[ $? -eq 0 ]] && ok || fail "host sharing"
# --calibrate of a model larger than this machine's memory is refused before anything is allocated,
# naming what it needs and what is available (Qwen3-30B-A3B: hundreds of GB of fp32 copies)
$M simulate --config $CFG --calibrate --model examples/qwen3_30b_a3b trainer.default_local_dir="$OUT/cal30b" \
    >/dev/null 2>"$OUT/cal30b.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "needs about [0-9.]* GB of memory" "$OUT/cal30b.log" &&
    grep -q "GB are available" "$OUT/cal30b.log"; then ok
else fail "simulate --calibrate of a 30B model: exit $rc, $(tail -c 300 "$OUT/cal30b.log")"; fi
# --sweep over a run of one parameter version: the staleness rows cannot differ, and it says so
$M simulate --config $CFG --sweep trainer.default_local_dir="$OUT/sweep1v" "${BASE[@]}" trainer.total_training_steps=2 \
    async_training.trigger_parameter_sync_step=2 >"$OUT/sweep1v.md" 2>"$OUT/sweep1v.log"
rc=$?
if [[ $rc -eq 0 ]] && grep -q "WARN.*makes 1 parameter version " "$OUT/sweep1v.log" &&
    grep -q "^Warning: 1 parameter version in this run" "$OUT/sweep1v.md"; then ok
else fail "simulate --sweep with one version: exit $rc, no warning: $(tail -c 300 "$OUT/sweep1v.log")"; fi
# 4 steps at a sync every 2 make 2 versions: no warning
$M simulate --config $CFG --sweep trainer.default_local_dir="$OUT/sweep2v" "${BASE[@]}" trainer.total_training_steps=4 \
    async_training.trigger_parameter_sync_step=2 >"$OUT/sweep2v.md" 2>"$OUT/sweep2v.log"
rc=$?
if [[ $rc -eq 0 ]] && ! grep -q "parameter version" "$OUT/sweep2v.log" "$OUT/sweep2v.md"; then ok
else fail "simulate --sweep with 2 versions (4 steps, sync every 2): exit $rc, $(grep -h "parameter version" "$OUT/sweep2v.log" | head -c 300)"; fi
# the count is the one the rows make: a last, shorter window syncs no weights (3 steps at a sync every 2: 1
# version; 1 step: 0), in the warning and in the JSON's parameter_versions
for st in 3:1 1:0; do
    IFS=: read -r steps want <<<"$st"
    $M simulate --config $CFG --sweep --json trainer.default_local_dir="$OUT/sweepv$steps" "${BASE[@]}" \
        trainer.total_training_steps=$steps async_training.trigger_parameter_sync_step=2 >"$OUT/sweepv$steps.json" \
        2>"$OUT/sweepv$steps.log"
    rc=$?
    if [[ $rc -eq 0 ]] && grep -q "WARN.*makes $want parameter version" "$OUT/sweepv$steps.log" &&
        /usr/bin/python3 - "$OUT/sweepv$steps.json" "$want" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read())
want = int(sys.argv[2])
vs = {r["versions"] for r in d["rows"][1:]}  # the async rows (the sync row syncs every step)
sys.exit(0 if d["parameter_versions"] == want and vs == {want} and d["warning"] else 1)
PY
    then ok
    else fail "simulate --sweep, $steps steps at a sync every 2: exit $rc, want $want versions: $(head -c 300 "$OUT/sweepv$steps.json")"; fi
done
# async_training.mode=sync on the command line: the sync row is the same, and the async rows still run the
# config's trigger_parameter_sync_step, staleness and partial rollout (only the row's own settings change):
# 8 steps at bench_async.yaml's sync every 2 = 4 versions with and without it
for m in async sync; do
    $M simulate --config $CFG --sweep --json trainer.default_local_dir="$OUT/sweepmode_$m" "${BASE[@]}" \
        trainer.total_training_steps=8 async_training.mode=$m >"$OUT/sweepmode_$m.json" 2>"$OUT/sweepmode_$m.log" ||
        fail "simulate --sweep async_training.mode=$m: $(tail -c 300 "$OUT/sweepmode_$m.log")"
done
/usr/bin/python3 - "$OUT/sweepmode_async.json" "$OUT/sweepmode_sync.json" <<'PY'
import json, sys
a, b = (json.loads(open(f).read())["rows"] for f in sys.argv[1:3])
bad = []
va, vb = [r["versions"] for r in a], [r["versions"] for r in b]
if va != vb: bad.append("versions %s with mode=async, %s with mode=sync" % (va, vb))
if any(v != 4 for v in va[1:]): bad.append("async rows' versions %s, want 4 (8 steps, sync every 2)" % va[1:])
for x, y in zip(a[9:], b[9:]):
    if (x["staleness_threshold"], x["partial_rollout"]) != (y["staleness_threshold"], y["partial_rollout"]): bad.append("%s: staleness/partial differ" % x["setting"])
print("; ".join(bad) if bad else "sweep rows independent of async_training.mode")
sys.exit(1 if bad else 0)
PY
[[ $? -eq 0 ]] && ok || fail "simulate --sweep with async_training.mode=sync"
# --sweep --json: the sweep as one JSON object on stdout (no markdown table), a row per setting in sweep.md's
# order, each with the non-sweep --json result's fields; sweep.md is still written
$M simulate --config $CFG --sweep --json trainer.default_local_dir="$OUT/sweepj" "${BASE[@]}" \
    >"$OUT/sweepj.json" 2>"$OUT/sweepj.log"
rc=$?
/usr/bin/python3 - "$OUT/sweepj.json" "$OUT/a1.json" "$OUT/sweepj/sweep.md" <<'PY'
import json, os, sys
text = open(sys.argv[1]).read()
bad = []
try:
    d = json.loads(text)
except ValueError as e:
    print("stdout is not one JSON value: %s: %r" % (e, text[:200])); sys.exit(1)
rows = d["rows"]
names = ["sync"] + ["async_s%.1f_partial_%s" % (s, p) for p in ("on", "off") for s in (0, 0.1, 0.3, 0.5)] + \
        ["split_%d_to_1" % k for k in (1, 2, 3)]
if [r["setting"] for r in rows] != names: bad.append("settings %s" % [r["setting"] for r in rows])
single = set(json.loads(open(sys.argv[2]).read()))
for r in rows:
    if not single <= set(r): bad.append("%s lacks %s" % (r["setting"], sorted(single - set(r))))
    if r["setting"] != "sync" and not r["setting"].startswith("split") and r["partial_rollout"] != r["setting"].endswith("on"): bad.append("%s: partial_rollout" % r["setting"])
if rows and rows[0]["vs_sync"] != 1: bad.append("sync row vs_sync %r" % rows[0]["vs_sync"])
# 1e-12: the same division in C and here, of values printed with 17 digits (a last-bit difference at most)
if any(abs(r["vs_sync"] - r["prompts_per_s"] / rows[0]["prompts_per_s"]) > 1e-12 for r in rows[:9]): bad.append("vs_sync not prompts/s over sync's")
if [r.get("split") for r in rows[9:]] != ["1:1", "2:1", "3:1"]: bad.append("split rows")
if d["warning"] is not None or d["parameter_versions"] < 2: bad.append("warning %r, %r versions" % (d["warning"], d["parameter_versions"]))
if "|" in text: bad.append("markdown on stdout")
if not os.path.getsize(sys.argv[3]) > 0: bad.append("no sweep.md")
print("; ".join(bad) if bad else "sweep JSON")
sys.exit(1 if bad else 0)
PY
[[ $? -eq 0 && $rc -eq 0 ]] && ok || fail "simulate --sweep --json: exit $rc, $(tail -c 300 "$OUT/sweepj.log")"

# the model's context, as moerl rl refuses it: 545-token sequences (the longest prompt + 512) over a
# 128-position model, from model.* or from --model's config.json; nothing is left behind
$M simulate --config $CFG trainer.default_local_dir="$OUT/ctx" model.max_position_embeddings=128 >/dev/null 2>"$OUT/ctx.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "simulate: the longest prompt of .* + data.max_response_length 512 exceeds the model's context max_position_embeddings 128" \
    "$OUT/ctx.log" && [[ ! -e "$OUT/ctx" ]]; then ok
else fail "simulate beyond the model's context: exit $rc, $(tail -c 300 "$OUT/ctx.log")"; fi
# ... the same message as moerl rl's (one check, rl_check_context)
$M rl --config $CFG trainer.default_local_dir="$OUT/ctx_rl" model.max_position_embeddings=128 >/dev/null 2>"$OUT/ctx_rl.log"
if [[ -n $(grep "^moerl simulate: " "$OUT/ctx.log") ]] &&
    [[ $(grep "^moerl rl: " "$OUT/ctx_rl.log" | sed 's/^moerl rl: //') == $(grep "^moerl simulate: " "$OUT/ctx.log" | sed 's/^moerl simulate: //') ]]; then ok
else fail "simulate's context message differs from rl's: $(tail -c 300 "$OUT/ctx_rl.log")"; fi
mkdir -p "$OUT/ctx_model"
/usr/bin/python3 -c 'import json, sys; d = json.load(open("examples/qwen3_30b_a3b/config.json")); d["max_position_embeddings"] = 128; json.dump(d, open(sys.argv[1], "w"))' \
    "$OUT/ctx_model/config.json"
$M simulate --config $CFG --model "$OUT/ctx_model" trainer.default_local_dir="$OUT/ctx2" >/dev/null 2>"$OUT/ctx2.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "exceeds the model's context max_position_embeddings 128" "$OUT/ctx2.log" && [[ ! -e "$OUT/ctx2" ]]; then ok
else fail "simulate --model of a 128-position model: exit $rc, $(tail -c 300 "$OUT/ctx2.log")"; fi
# layouts moerl plan and moerl rl refuse are refused with their messages (par_check, the rollout TP against
# the heads), before any folder is made
for k in "pp:trainer.n_ranks=2 actor.pipeline_parallel_size=3:actor.pipeline_parallel_size=3 does not divide the 2 trainer ranks" \
         "rtp:rollout.tensor_model_parallel_size=3 sim.rollout_devices=3:rollout.tensor_model_parallel_size=3 does not divide the 8 attention heads"; do
    IFS=: read -r name keys msg <<<"$k"
    # shellcheck disable=SC2086  # keys: several key=value words
    $M simulate --config $CFG trainer.default_local_dir="$OUT/lay_$name" $keys >/dev/null 2>"$OUT/lay_$name.log"
    rc=$?
    if [[ $rc -eq 1 ]] && grep -q "simulate: $msg" "$OUT/lay_$name.log" && [[ ! -e "$OUT/lay_$name" ]]; then ok
    else fail "simulate with layout $keys: exit $rc, $(tail -c 300 "$OUT/lay_$name.log")"; fi
done
# --sweep checks every sub-folder it will use before the first simulation: a real run (its run.log) in the
# last one, split_3_to_1, is refused at once — no sub-folder made, no SIMULATION marker in the top folder
mkdir -p "$OUT/sweeplast/split_3_to_1" && echo log >"$OUT/sweeplast/split_3_to_1/run.log"
$M simulate --config $CFG --sweep trainer.default_local_dir="$OUT/sweeplast" "${BASE[@]}" >/dev/null 2>"$OUT/sweeplast.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "sweeplast/split_3_to_1 holds a real run (run.log)" "$OUT/sweeplast.log" &&
    ! grep -q "simulate sync" "$OUT/sweeplast.log" && [[ $(ls -A "$OUT/sweeplast") == split_3_to_1 ]]; then ok
else fail "simulate --sweep with a real run in split_3_to_1: exit $rc, $(ls -A "$OUT/sweeplast"), $(tail -c 300 "$OUT/sweeplast.log")"; fi
# moerl rl trainer.overwrite_output_dir=true over a sweep's folder deletes the sweep's outputs (its 12
# sub-folders, sweep.md/.dat/.gp/.png) with its marker; a folder of the user's there is kept
mkdir -p "$OUT/sweepj/mine" && echo keep >"$OUT/sweepj/mine/notes.txt"
$M rl --config $CFG trainer.default_local_dir="$OUT/sweepj" "${BASE[@]}" trainer.total_training_steps=1 \
    trainer.overwrite_output_dir=true >/dev/null 2>"$OUT/rl_over_sweep.log"
rc=$?
left=$(cd "$OUT/sweepj" && ls -d sync async_* split_* sweep.* SIMULATION 2>/dev/null | tr '\n' ' ')
if [[ $rc -eq 0 && -z $left && -f "$OUT/sweepj/mine/notes.txt" && -f "$OUT/sweepj/metrics.jsonl" ]]; then ok
else fail "rl overwrite over a sweep: exit $rc, left: $left $(tail -c 300 "$OUT/rl_over_sweep.log")"; fi
# cost_keys reproduce the run when passed back as key=value without sim.device (named devices differ from
# the default cpu device in the engine's dtype too: rollout.dtype is among the keys); --json prints 17
# significant digits, so the same wall_s to the last bit
for dev in h200 ascend910b; do
    $M simulate --config $CFG --json trainer.default_local_dir="$OUT/dev_$dev" "${BASE[@]}" sim.device=$dev \
        >"$OUT/dev_$dev.json" 2>"$OUT/dev_$dev.log" || fail "simulate sim.device=$dev: $(tail -c 300 "$OUT/dev_$dev.log")"
    mapfile -t keys < <(/usr/bin/python3 -c 'import json, sys
for k, v in json.loads(open(sys.argv[1]).read())["cost_keys"].items(): print("%s=%s" % (k, v if isinstance(v, str) else repr(v)))' "$OUT/dev_$dev.json")
    $M simulate --config $CFG --json trainer.default_local_dir="$OUT/devk_$dev" "${BASE[@]}" "${keys[@]}" \
        >"$OUT/devk_$dev.json" 2>"$OUT/devk_$dev.log"
    if /usr/bin/python3 -c 'import json, sys
a, b = (json.loads(open(f).read()) for f in sys.argv[1:3])
sys.exit(0 if a["wall_s"] == b["wall_s"] and b["device"] == "cpu" else 1)' "$OUT/dev_$dev.json" "$OUT/devk_$dev.json"; then ok
    else fail "cost_keys of sim.device=$dev do not reproduce wall_s: $(head -c 200 "$OUT/dev_$dev.json") vs $(head -c 200 "$OUT/devk_$dev.json")"; fi
done
# --calibrate measures this machine: a sim.device beside it is refused, not ignored
$M simulate --config $CFG --calibrate sim.device=h200 trainer.default_local_dir="$OUT/calnamed" >/dev/null 2>"$OUT/calnamed.log"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "calibrate measures this machine's costs, but sim.device=h200" "$OUT/calnamed.log" &&
    [[ ! -e "$OUT/calnamed" ]]; then ok
else fail "simulate --calibrate sim.device=h200: exit $rc, $(tail -c 300 "$OUT/calnamed.log")"; fi
# SIGINT stops a sweep cleanly: exit 130 (128 + 2, as moerl rl) and the folder it made is removed; SIGTERM into
# a folder that existed: 143, the sub-folders it made removed, the folder as it was but for data/. The signal
# is sent once the first simulation has written metrics (a long run: 2000 steps each; it stops at a step).
for k in INT:130:sig_new/out:sig_new TERM:143:sig_old:; do
    IFS=: read -r sig want dir gone <<<"$k"
    [[ $sig == TERM ]] && mkdir -p "$OUT/$dir"
    $M simulate --config $CFG --sweep trainer.default_local_dir="$OUT/$dir" trainer.total_training_steps=2000 \
        >/dev/null 2>"$OUT/sig_$sig.log" &
    pid=$!
    while kill -0 $pid 2>/dev/null && [[ ! -s $OUT/$dir/sync/metrics.jsonl ]]; do sleep 0.1; done
    kill -$sig $pid
    wait $pid
    rc=$?
    if [[ $sig == INT ]]; then state=$([[ -e "$OUT/$gone" ]] && echo "$OUT/$gone left" || echo clean)
    else state=$([[ $(ls -A "$OUT/$dir" | tr '\n' ' ') == ".moerl.lock data " ]] && echo clean || echo "left: $(ls -A "$OUT/$dir" | tr '\n' ' ')"); fi
    if [[ $rc -eq $want && $state == clean ]] && grep -q "stopped by signal" "$OUT/sig_$sig.log"; then ok
    else fail "simulate --sweep stopped by SIG$sig: exit $rc (want $want), $state, $(tail -c 300 "$OUT/sig_$sig.log")"; fi
done
# a new sweep into a finished sweep's folder removes the old report first: stopped early, it leaves no
# complete but stale sweep.md
$M simulate --config $CFG --sweep trainer.default_local_dir="$OUT/resweep" trainer.total_training_steps=4 >/dev/null 2>&1
had=$([[ -s "$OUT/resweep/sweep.md" ]] && echo yes || echo no)
$M simulate --config $CFG --sweep trainer.default_local_dir="$OUT/resweep" trainer.total_training_steps=2000 \
    >/dev/null 2>"$OUT/resweep.log" &
pid=$!
while kill -0 $pid 2>/dev/null && [[ -e "$OUT/resweep/sweep.md" ]]; do sleep 0.1; done
kill -INT $pid 2>/dev/null
wait $pid
rc=$?
if [[ $had == yes && $rc -eq 130 && ! -e "$OUT/resweep/sweep.md" && ! -e "$OUT/resweep/sweep.png" ]]; then ok
else fail "re-sweep stopped early: first sweep.md $had, exit $rc, $(ls "$OUT/resweep" | tr '\n' ' ')"; fi

# --- the paged KV cache (issue 28): simulate builds the engine with rollout.block_size, the budget in the
# simulated model's blocks and prefix caching, and reports the engine's counters. The bench model's KV is
# 2 (K, V) · 4 layers · 2 kv heads · 32 · 4 B (cpu: fp32) = 2048 B per token, 32768 B per 16-token block.
PG=(--config $CFG --json trainer.resume_mode=disable "${BASE[@]}")
pg() { local d=$1; shift; rm -rf "$OUT/$d"; $M simulate "${PG[@]}" trainer.default_local_dir="$OUT/$d" "$@" >"$OUT/$d.json" 2>"$OUT/$d.log"; }
pgf() { /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join(str(d[k]) for k in sys.argv[2:]))' "$@"; }
pg pg_default
r=$(pgf "$OUT/pg_default.json" block_size kv_budget_blocks_per_replica 2>&1)
[[ $r == "16 0" ]] && ok || fail "simulate's default paged fields (block 16, the reservation): $r, $(tail -c 300 "$OUT/pg_default.log")"
for k in preemptions kv_blocks_total kv_blocks_peak prefix_hit_tokens kv_peak_bytes_per_device; do
    v=$(pgf "$OUT/pg_default.json" $k 2>/dev/null)
    [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] && ok || fail "simulate --json has no counter $k ($v)"
done
# a budget of 1,000,000 B per replica: ⌊1e6 / 32768⌋ = 30 blocks; 2 replicas of tp 2 (min(tp, 2 kv heads) = 2:
# 1024 B per token and device, so ⌊5e5 / 16384⌋ = 30 blocks per replica again); the same prompts trained
pg pg_budget rollout.kv_cache_bytes=1000000
pg pg_budget2 rollout.kv_cache_bytes=1000000 sim.rollout_devices=4 rollout.tensor_model_parallel_size=2
r=$(pgf "$OUT/pg_budget.json" kv_budget_blocks_per_replica prompts_trained 2>&1) r2=$(pgf "$OUT/pg_budget2.json" kv_budget_blocks_per_replica 2>&1)
want=$(pgf "$OUT/pg_default.json" prompts_trained 2>&1)
[[ $r == "30 $want" && $r2 == 30 ]] && ok || fail "simulate with rollout.kv_cache_bytes=1e6: '$r' / '$r2' (want '30 $want' / 30), $(tail -c 300 "$OUT/pg_budget.log")"
# once the paged engine is in this build (engine.c counts the pool), its pool is the budget: 30 blocks
if grep -q "kv_blocks_total" src/rollout/engine.c; then
    r=$(pgf "$OUT/pg_budget.json" kv_blocks_total 2>&1)
    [[ $r == 30 ]] && ok || fail "the paged engine's pool under simulate: $r blocks (want 30)"
    # 12 blocks (393,216 B) for sequences of up to 129 tokens (9 blocks): the engine must preempt, and the
    # same prompts are trained; groups of rollout.n=4 share their prompts' full blocks unless caching is off
    pg pg_tight rollout.kv_cache_bytes=393216
    r=$(pgf "$OUT/pg_tight.json" preemptions prompts_trained kv_blocks_peak 2>&1)
    read -r pre pt peak <<<"$r"
    [[ $pre -gt 0 && $pt == "$want" && $peak -le 12 ]] && ok || fail "simulate on 12 blocks: preemptions, prompts, peak '$r' (want > 0, $want, ≤ 12)"
    pg pg_nocache rollout.enable_prefix_caching=false
    r=$(pgf "$OUT/pg_default.json" prefix_hit_tokens 2>&1) r2=$(pgf "$OUT/pg_nocache.json" prefix_hit_tokens 2>&1)
    [[ $r -gt 0 && $r2 == 0 ]] && ok || fail "prefix_hit_tokens with / without prefix caching: $r / $r2 (want > 0 / 0)"
fi
# gpu_memory_utilization: h200 (141e9 B, bf16: 1024 B per token): 0.5 × (141e9 − the bf16 weights (HF count × 2))
pg pg_util sim.device=h200 rollout.gpu_memory_utilization=0.5
hf=$($M plan --config $CFG --json "${BASE[@]}" 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["n_params_hf"])')
r=$(pgf "$OUT/pg_util.json" kv_budget_blocks_per_replica 2>&1)
[[ -n $hf && $r == $(/usr/bin/python3 -c "import math; print(math.floor(0.5 * (141e9 - $hf * 2) / (16 * 1024)))") ]] && ok ||
    fail "simulate gpu_memory_utilization=0.5 on h200: $r blocks (hf $hf), $(tail -c 300 "$OUT/pg_util.log")"
# refusals naming the key and value
for bad in "rollout.block_size=0:rollout.block_size must be in [1, 65536] tokens, got 0" \
    "rollout.kv_cache_bytes=-5:rollout.kv_cache_bytes must be ≥ 0 (0 = see rollout.gpu_memory_utilization), got -5" \
    "rollout.kv_cache_bytes=1000:holds no block of 16 tokens" \
    "rollout.kv_cache_bytes=98304:the KV budget holds 3 blocks of 16 tokens per replica" \
    "rollout.gpu_memory_utilization=2:rollout.gpu_memory_utilization must be a fraction in [0, 1] (0 = off), got 2" \
    "rollout.kv_cache_bytes=1000000 rollout.gpu_memory_utilization=0.5:both give the KV budget" \
    "sim.device_memory=8e10:sim.device_memory=8e+10 is set but rollout.gpu_memory_utilization is 0" \
    "sim.codec.onebit.encode_ns=1:sim.codec.onebit.encode_ns is set, but the gradient exchange is exact" \
    "actor.grad_compression=threshold sim.codec.threshold.ratio=1:sim.codec.threshold.ratio must be > 1"; do
    IFS=: read -r kv want <<<"$bad"
    # shellcheck disable=SC2086
    pg pg_bad $kv
    [[ $? -eq 1 ]] && grep -qF -- "$want" "$OUT/pg_bad.log" && ok || fail "simulate $kv not refused with '$want': $(tail -c 300 "$OUT/pg_bad.log")"
done

# --- the gradient exchange (issue 29) follows actor.grad_compression / actor.optim.name: over 2 trainers on the
# cpu device's 5e9 B/s link, n = the padded parameters; exact ring 2·(1/2)·4n/link per update during the warm-up,
# then onebit n·(8.9 + 2·8.1) ns + n·(1/8 + 4/256)/link, onebit_adam n·(8.9·1.5 + 2·8.1) ns + n/8/link, threshold
# with a free codec n·(4/11.3)/link — shorter than exact, and the step with it; 1-bit Adam with
# var_update_interval=2 from freeze_step 1: updates 1 and 3 exact, 2 and 4 compressed
n=$($M plan --config $CFG --json "${BASE[@]}" 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["n_params"])')
for case in "none::0:4" "onebit:actor.grad_compression=onebit actor.grad_compression_warmup_steps=1:1:4" \
    "onebit_adam:actor.optim.name=onebit_adam actor.optim.freeze_step=1:1:4" \
    "onebit_adam:actor.optim.name=onebit_adam actor.optim.freeze_step=1 actor.optim.var_update_interval=2:2:4" \
    "threshold:actor.grad_compression=threshold actor.grad_compression_warmup_steps=0 sim.codec.threshold.encode_ns=0 sim.codec.threshold.decode_ns=0:0:4"; do
    IFS=: read -r sc keys exact total <<<"$case"
    # shellcheck disable=SC2086
    pg pg_x_$sc trainer.n_ranks=2 $keys
    r=$(/usr/bin/python3 - "$OUT/pg_x_$sc.json" "$n" "$sc" "$exact" "$total" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1])); n = float(sys.argv[2]); sc = sys.argv[3]; ex, tot = int(sys.argv[4]), int(sys.argv[5])
bw, exact = 5e9, 4 * n / 5e9
comp = {"none": exact, "onebit": n * 25.1e-9 + n * (1 / 8 + 4 / 256) / bw,
        "onebit_adam": n * (8.9 * 1.5 + 2 * 8.1) * 1e-9 + n / 8 / bw, "threshold": n * (4 / 11.3) / bw}[sc]
want = ex * exact + (tot - ex) * comp if sc != "none" else tot * exact
ok = d["grad_exchange"] == sc and d["steps"] == tot and abs(d["grad_exchange_s"] - want) <= 1e-9 * want and \
    d["compressed_updates"] == (0 if sc == "none" else tot - ex)
print("ok" if ok else (d["grad_exchange"], d["grad_exchange_s"], want, d["compressed_updates"]))
PY
)
    [[ $r == ok ]] && ok || fail "simulate's exchange with $sc: $r $(tail -c 200 "$OUT/pg_x_$sc.log")"
done
r=$(/usr/bin/python3 -c 'import json,sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); print(b["wall_s"] < a["wall_s"])' "$OUT/pg_x_none.json" "$OUT/pg_x_threshold.json" 2>&1)
[[ $r == True ]] && ok || fail "a cheaper exchange (threshold, free codec) did not shorten the simulated run: $r"
finish
