#!/usr/bin/env bash
# Async vs sync throughput of the main job on a heavy-tailed response-length workload
# (examples/bench_async.yaml), same machine, same total threads. Prints a markdown table:
# prompts/s, generated tokens/s, ratio to the synchronous baseline, idle ratios, max staleness.
# Usage: bash bench/run_async.sh [extra key=value overrides]   (runs each setting once; the
# per-run step count is trainer.total_training_steps in the YAML)
set -euo pipefail
cd "$(dirname "$0")/.."
M=./build/moerl
T=$(nproc)
OUT=$(mktemp -d)
run() {  # label, overrides...
    local label=$1; shift
    $M rl --config examples/bench_async.yaml trainer.default_local_dir="$OUT/$label" "$@" "${EXTRA[@]}" \
        >"$OUT/$label.json" 2>"$OUT/$label.log" || { echo "run $label failed:"; tail "$OUT/$label.log"; exit 1; }
    /usr/bin/python3 - "$label" "$OUT/$label.json" "$BASE" <<'PY'
import json, sys
label, path, base = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.loads(open(path).read().strip().splitlines()[-1])
b = float(base) if base else r["prompts_per_s"]
print("| %-28s | %7.2f | %8.0f | %5.2fx | %5.2f | %5.2f | %d |" % (label, r["prompts_per_s"], r["tokens_per_s"],
      r["prompts_per_s"] / b, r["trainer_idle_ratio"], r["rollouter_idle_ratio"], r["max_staleness"]))
PY
}
EXTRA=("$@")
echo "| setting | prompts/s | gen tokens/s | vs sync | trainer idle | rollouter idle | max staleness |"
echo "|---|---|---|---|---|---|---|"
BASE=""
line=$(run "sync (baseline, $T threads)" async_training.mode=sync trainer.n_threads=$T)
echo "$line"
BASE=$(echo "$line" | awk -F'|' '{print $3}' | tr -d ' ')
half=$(( T / 2 > 0 ? T / 2 : 1 ))
for p in true false; do
    for s in 0 0.1 0.3 0.5; do
        run "async s=$s partial=$p" async_training.mode=async async_training.staleness_threshold=$s \
            async_training.partial_rollout=$p async_training.rollout_threads=$half \
            async_training.trainer_threads=$(( T - half > 0 ? T - half : 1 ))
    done
done
echo
echo "command: bash bench/run_async.sh $*  (workload: examples/bench_async.yaml, $T cores)"
rm -rf "$OUT"
