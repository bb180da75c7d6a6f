#!/usr/bin/env bash
# moerl simulate with multi-turn trajectories (rollout.multi_turn.enable, sim.multi_turn.*): the real
# rollouter and agent loop run with the turns drawn and the tools answered on the virtual clock.
# Checked: each trajectory's shape in samples.jsonl (turns − 1 tool calls, each answered by exactly
# sim.multi_turn.tool_response_tokens inserted ids, loss mask 0 on them); the mean number of turns
# against the geometric law's; the latency figures against the log-normal's; the time trajectories
# wait for tools against its lower bound and growing with the median; the assistant-turn limit and the
# tool timeout honoured; async beating sync at a long tool latency (an ordering on a deterministic
# virtual clock, no timing threshold); determinism; bad keys refused with messages naming them.
# Run by tests/run.sh as `bash tests/e2e_simulate_multi_turn.sh BUILD`.
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
CFG=examples/bench_async.yaml
cat >"$W/tools.yaml" <<'EOF'
- function:
    name: calc
    description: Evaluate an arithmetic expression exactly.
    parameters:
      type: object
      properties:
        expr: {type: string}
      required: [expr]
  command: python3 tests/tools/calc_env.py
EOF
# turns of 12 tokens on average (Pareto α=3 above 8), 16 ids per tool turn: a 3-turn trajectory is ~70 tokens
# of the 2048 allowed, so the length limit cuts almost none (checked below: the shape checks need finish "stop")
BASE=(trainer.resume_mode=disable data.max_response_length=2048 model.max_position_embeddings=4096
      rollout.synthetic_length.alpha=3 rollout.synthetic_length.min=8 rollout.multi_turn.enable=true
      rollout.multi_turn.tool_config_path="$W/tools.yaml" sim.multi_turn.tool_response_tokens=16)

sim() {  # label, keys... → $W/label.json, $W/label/{samples,metrics}.jsonl
    local label=$1
    shift
    if ! $M simulate --config $CFG --json trainer.default_local_dir="$W/$label" "${BASE[@]}" "$@" \
        >"$W/$label.json" 2>"$W/$label.log"; then
        fail "$label: moerl simulate failed: $(tail -c 400 "$W/$label.log")"
        return 1
    fi
}

# 1. sync mode, 16 steps × 8 prompts × 4 responses = 512 trajectories, turns_mean 3, σ = 0: every call
# takes the median exactly
if sim turns async_training.mode=sync trainer.total_training_steps=16 sim.multi_turn.turns_mean=3 \
    sim.multi_turn.tool_latency_median_s=2 sim.multi_turn.tool_latency_sigma=0; then
    "$PY" - "$W/turns" 16 3 2 <<'PY' && ok "trajectory shapes, turns mean, latency, tool wait" || fail "sync multi-turn simulation: figures above"
import json, math, sys
d, tok, mu, med = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
turns, calls, bad, cut = [], 0, [], 0
for line in open(d + "/samples.jsonl"):
    for r in json.loads(line)["responses"]:
        t, c, m = r["turns"], r["tool_calls"], r["loss_mask"]
        turns.append(t); calls += c
        if r["finish"] != "stop": cut += 1; continue
        runs, k = [], 0          # lengths of the runs of inserted ids (mask 0)
        for x in m + [1]:
            if x == 0: k += 1
            elif k: runs.append(k); k = 0
        if c != t - 1 or runs != [tok] * c or m[-1] != 1 or len(m) != len(r["ids"]):
            bad.append((t, c, runs[:4]))
N = len(turns)
mean = sum(turns) / N
# the reference: 1 + a geometric draw with mean mu − 1 has mean mu and variance mu (mu − 1); the tolerance is
# 4 standard errors of a mean of N draws (a failure by chance has probability ~6e-5; the run is deterministic,
# so it either always passes or always fails for this seed)
tol = 4 * math.sqrt(mu * (mu - 1) / N)
met = [json.loads(l) for l in open(d + "/metrics.jsonl")]
wait = sum(m["timing_s/tool"] for m in met)
mt = sum(m["num_turns/mean"] for m in met) / len(met)   # every step trains the same number of trajectories
lat = [m["tool_latency/mean"] for m in met if m["tool_latency/mean"] is not None]
print("N %d cut %d mean turns %.4f (want %g ± %.4f), metrics %.4f; calls %d, wait %.2f s (≥ %.2f), latency %s"
      % (N, cut, mean, mu, tol, mt, calls, wait, calls * med, sorted(set(lat))))
ok = (N == 512 and cut <= 2 and not bad and abs(mean - mu) <= tol and abs(mt - mean) < 1e-9
      # σ = 0: every answered call took the median; each waited at least its latency (answers are taken at
      # the first rollout tick at or after their time), and in sync mode every call of a trained trajectory
      # is answered within the run
      and all(abs(x - med) < 1e-9 for x in lat) and all(abs(m["tool_latency/max"] - med) < 1e-9 for m in met)
      and wait >= calls * med - 1e-6 and calls > 0)
if bad: print("bad trajectories (turns, calls, inserted runs):", bad[:5])
sys.exit(0 if ok else 1)
PY
fi

# 2. the time trajectories wait for tools grows with the latency median (same trajectories: same seeds)
prev=0
for med in 0.5 2 8; do
    sim "med$med" async_training.mode=sync trainer.total_training_steps=4 sim.multi_turn.tool_latency_median_s=$med || continue
    w=$("$PY" -c 'import json, sys; print(sum(json.loads(l)["timing_s/tool"] for l in open(sys.argv[1])))' "$W/med$med/metrics.jsonl")
    if "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$w" "$prev"; then ok "timing_s/tool median $med: $w s"
    else fail "timing_s/tool at median $med ($w s) not above the smaller median's ($prev s)"; fi
    prev=$w
done
# the log-normal's mean latency median · exp(σ²/2) against the calls' (sync mode: the calls answered in a
# step's window are those of the step's trajectories, so Σ step mean × step calls / Σ calls is the mean over
# all calls); the tolerance is 4 standard errors, the log-normal's sd being mean · sqrt(exp(σ²) − 1)
if sim lat async_training.mode=sync trainer.total_training_steps=16 sim.multi_turn.tool_latency_median_s=2 \
    sim.multi_turn.tool_latency_sigma=0.5; then
    "$PY" - "$W/lat" 2 0.5 <<'PY' && ok "tool_latency/mean vs the log-normal mean" || fail "tool_latency/mean"
import json, math, sys
d, med, sig = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
calls = {}
for l in open(d + "/samples.jsonl"):
    g = json.loads(l)
    calls[g["step"]] = calls.get(g["step"], 0) + sum(r["tool_calls"] for r in g["responses"])
met = [json.loads(l) for l in open(d + "/metrics.jsonl")]
n = sum(calls.values())
m = sum(x["tool_latency/mean"] * calls[x["step"]] for x in met) / n
ref = med * math.exp(sig * sig / 2)
tol = 4 * ref * math.sqrt(math.exp(sig * sig) - 1) / math.sqrt(n)
print("tool_latency/mean %.4f over %d calls, log-normal mean %.4f ± %.4f" % (m, n, ref, tol))
sys.exit(0 if abs(m - ref) <= tol else 1)
PY
fi

# 3. sync vs async at a long tool latency (30 s median): the async rollout side keeps other trajectories
# decoding and starts the next steps' groups while tools run, so the same 8 steps take less virtual time
LONG=(trainer.total_training_steps=8 sim.multi_turn.tool_latency_median_s=30 sim.multi_turn.turns_mean=4)
if sim long_sync async_training.mode=sync "${LONG[@]}" && sim long_async async_training.mode=async "${LONG[@]}" &&
    sim long_async2 async_training.mode=async "${LONG[@]}"; then
    s=$(json_field wall_s "$W/long_sync.json") a=$(json_field wall_s "$W/long_async.json") a2=$(json_field wall_s "$W/long_async2.json")
    if "$PY" -c 'import sys; s, a = map(float, sys.argv[1:3]); sys.exit(0 if a < s else 1)' "$s" "$a"; then
        ok "async beats sync at 30 s tool latency: wall $a s vs $s s"
    else fail "async wall $a s not below sync's $s s at a 30 s tool latency"; fi
    if [[ $a == "$a2" ]] && cmp -s "$W/long_async/samples.jsonl" "$W/long_async2/samples.jsonl"; then ok "async multi-turn deterministic"
    else fail "two async runs differ: wall $a vs $a2"; fi
    [[ $(json_field steps "$W/long_async.json") == 8 ]] && ok || fail "async long run: not 8 steps"
fi
# with host sharing (one core) the update and the tool waits are co-simulated: it runs, and sharing a core
# never makes it faster
if sim long_async_hc async_training.mode=async "${LONG[@]}" sim.host_cores=1; then
    "$PY" -c 'import json, sys; a, b = (json.load(open(f))["wall_s"] for f in sys.argv[1:3]); sys.exit(0 if b >= a - 1e-9 else 1)' \
        "$W/long_async.json" "$W/long_async_hc.json" && ok "host_cores=1 async multi-turn" || fail "host_cores=1 faster than unshared"
fi

# 4. rollout.multi_turn.max_assistant_turns caps the drawn turns; the last allowed turn's call is counted,
# never sent (as on the real path): turns ≤ 2, mean 1 + P(T ≥ 2) = 1 + (1 − 1/mu) = 5/3 for mu = 3
if sim cap async_training.mode=sync trainer.total_training_steps=8 rollout.multi_turn.max_assistant_turns=2; then
    "$PY" - "$W/cap/samples.jsonl" <<'PY' && ok "max_assistant_turns caps the turns" || fail "max_assistant_turns"
import json, math, sys
R = [r for l in open(sys.argv[1]) for r in json.loads(l)["responses"]]
t = [r["turns"] for r in R]
mean, ref = sum(t) / len(t), 1 + (1 - 1 / 3)
tol = 4 * math.sqrt(ref - 1) * math.sqrt(1 - (ref - 1)) / math.sqrt(len(t))  # Bernoulli(2/3) + 1, 4 s.e.
counted = sum(1 for r in R if r["turns"] == 2 and r["tool_calls"] == 2)
print("turns max %d mean %.3f (want %.3f ± %.3f), %d trajectories with the last turn's call counted" % (max(t), mean, ref, tol, counted))
sys.exit(0 if max(t) == 2 and abs(mean - ref) <= tol and counted > 0 else 1)
PY
fi
# rollout.multi_turn.tool_timeout_s below every latency: each call is a timeout answered at the timeout
if sim timeout async_training.mode=sync trainer.total_training_steps=2 sim.multi_turn.tool_latency_median_s=5 \
    sim.multi_turn.tool_latency_sigma=0 rollout.multi_turn.tool_timeout_s=1.5; then
    "$PY" - "$W/timeout/metrics.jsonl" <<'PY' && ok "tool_timeout_s: every call a timeout at 1.5 s" || fail "tool_timeout_s"
import json, sys
met = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if all(m["tool_errors/mean"] == m["tool_calls/mean"] > 0 and m["tool_latency/max"] == 1.5 for m in met) else 1)
PY
fi
# the printed result echoes the distributions simulated; --sweep runs them in every setting
"$PY" -c 'import json, sys
m = json.load(open(sys.argv[1]))["multi_turn"]
sys.exit(0 if m == {"sim.multi_turn.turns_mean": 3.0, "sim.multi_turn.tool_latency_median_s": 2.0,
                    "sim.multi_turn.tool_latency_sigma": 0.0, "sim.multi_turn.tool_response_tokens": 16} else 1)' \
    "$W/turns.json" && ok "multi_turn echoed" || fail "multi_turn echo: $(head -c 600 "$W/turns.json")"
if $M simulate --config $CFG --sweep trainer.default_local_dir="$W/sweep" "${BASE[@]}" trainer.total_training_steps=4 \
    >"$W/sweep.out" 2>"$W/sweep.log" && grep -q "async s=0.3 partial on" "$W/sweep/sweep.md" &&
    "$PY" -c 'import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if m and all(x["num_turns/mean"] >= 1 and x["timing_s/tool"] > 0 for x in m) else 1)' \
        "$W/sweep/async_s0.3_partial_on/metrics.jsonl"; then ok "--sweep with multi-turn"
else fail "--sweep with multi-turn: $(tail -c 300 "$W/sweep.log")"; fi
# lockstep mode runs too (the rollout side only while the step loop waits)
sim lockstep async_training.mode=lockstep trainer.total_training_steps=4 async_training.partial_rollout=true && ok "lockstep"

# 5. bad values refused, naming the key; keys a simulation does not model refused rather than ignored
S=(async_training.mode=sync trainer.total_training_steps=1)
err() { expect_err "$1" "$2" $M simulate --config $CFG trainer.default_local_dir="$W/bad" "${BASE[@]}" "${S[@]}" "${@:3}"; }
err "turns_mean < 1" "sim.multi_turn.turns_mean must be in [1, 1e6]" sim.multi_turn.turns_mean=0.5
err "median 0" "sim.multi_turn.tool_latency_median_s must be > 0" sim.multi_turn.tool_latency_median_s=0
err "sigma < 0" "sim.multi_turn.tool_latency_sigma must be in [0, 20], got -1" sim.multi_turn.tool_latency_sigma=-1
err "tokens < 0" "sim.multi_turn.tool_response_tokens must be ≥ 0" sim.multi_turn.tool_response_tokens=-1
err "tokens ≥ max_response_length" "below data.max_response_length 2048, got 2048" sim.multi_turn.tool_response_tokens=2048
err "no synthetic length" "set rollout.synthetic_length.alpha > 0" rollout.synthetic_length.alpha=0
err "tool_num_workers" "rollout.multi_turn.tool_num_workers: moerl simulate does not model it" rollout.multi_turn.tool_num_workers=3
err "max_tool_response_length" "rollout.multi_turn.max_tool_response_length: moerl simulate does not model it" \
    rollout.multi_turn.max_tool_response_length=10
expect_err "sim.multi_turn.* without enable" "sim.multi_turn.turns_mean is set but rollout.multi_turn.enable is false" \
    $M simulate --config $CFG trainer.default_local_dir="$W/bad" "${S[@]}" sim.multi_turn.turns_mean=2
finish
