#!/usr/bin/env bash
# run_recompute.sh — the step-time cost of activation recompute (model.enable_gradient_checkpointing,
# actor.recompute_granularity; docs/parallelism.md "Activation recompute") against none, on the demo model
# (examples/demo.yaml's architecture) by default.
#
# Runs build/bench/bench_train_step --recompute none|full|selective, the three interleaved ROUNDS times
# (so a neighbour that comes and goes hits every mode alike), each run reporting the median of its --reps
# timed steps; prints per mode the median over rounds of the step and of the backward, the ratio of
# the step to none's, and the activation arena's bytes (model_acts, equal to moerl plan's rows).
# No thresholds: a benchmark, not a test. On a shared machine the numbers move with the other
# processes: compare only the rows of one invocation.
#
# Usage: bash bench/run_recompute.sh [--threads 2] [--reps 10] [--rounds 3] [--batch 8] [--seqlen 128]
#                                    [--bench-model]
#   --bench-model  bench_train_step's own configuration (hidden 256, 4 layers, 16 experts top-4) instead of
#                  the demo model
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2 REPS=10 ROUNDS=3 B=8 T=128 DEMO=--demo
while [[ $# -gt 0 ]]; do
    case $1 in
        --threads) THREADS=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --batch) B=$2; shift 2 ;;
        --seqlen) T=$2; shift 2 ;;
        --bench-model) DEMO=; shift ;;
        *) echo "run_recompute.sh: unknown option '$1' (see the header)" >&2; exit 2 ;;
    esac
done
BIN=build/bench/bench_train_step
[[ -x $BIN ]] || { echo "run_recompute.sh: $BIN not built (make -j2)" >&2; exit 1; }
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for ((r = 0; r < ROUNDS; r++)); do
    for mode in none full selective; do
        OMP_NUM_THREADS=$THREADS "$BIN" --threads "$THREADS" --reps "$REPS" --batch "$B" --seqlen "$T" $DEMO \
            --recompute "$mode" --json >>"$OUT"
    done
done
echo "bash bench/run_recompute.sh --threads $THREADS --reps $REPS --rounds $ROUNDS --batch $B --seqlen $T ${DEMO:+(demo model)}"
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
by = {}
for r in rows:
    by.setdefault(r['recompute'], []).append(r)
base = statistics.median(r['step_ms_median'] for r in by['none'])
print('| recompute | step ms (median of %d rounds) | backward ms | step / none | activation arena MiB |' % len(by['none']))
print('|---|---|---|---|---|')
for mode in ('none', 'full', 'selective'):
    rs = by[mode]
    step = statistics.median(r['step_ms_median'] for r in rs)
    bwd = statistics.median(r['backward_ms'] for r in rs)
    print('| %s | %.2f | %.2f | %.3f | %.2f |' % (mode, step, bwd, step / base, rs[0]['arena_bytes'] / 1048576))
PY
