#!/usr/bin/env bash
# moerl simulate, calibrated on this machine, against measured runs of the same workload
# (examples/bench_async.yaml, as bench/run_async.sh): the synchronous baseline with all threads and
# async runs with one thread per role. The simulator is calibrated twice (--calibrate with
# OMP_NUM_THREADS=T for the sync baseline, 1 for the async roles: each role's costs at the threads
# it runs with). Prints measured and predicted prompts/s and the async/sync ratios.
# Usage: bash bench/run_simulate_validation.sh [extra key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
M=./build/moerl
T=$(nproc)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
EXTRA=("$@")
pps() { /usr/bin/python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["prompts_per_s"])' "$1"; }
real() {  # label, keys...
    local l=$1; shift
    $M rl --config examples/bench_async.yaml trainer.default_local_dir="$OUT/r_$l" "$@" "${EXTRA[@]}" >"$OUT/r_$l.json" 2>/dev/null
    pps "$OUT/r_$l.json"
}
sim() {  # label, threads, keys...
    local l=$1 th=$2; shift 2
    OMP_NUM_THREADS=$th $M simulate --calibrate --config examples/bench_async.yaml trainer.default_local_dir="$OUT/s_$l" \
        "$@" "${EXTRA[@]}" >"$OUT/s_$l.json" 2>"$OUT/s_$l.log"
    pps "$OUT/s_$l.json"
}
half=$(( T / 2 > 0 ? T / 2 : 1 ))
rs=$(real sync async_training.mode=sync trainer.n_threads=$T)
ps=$(sim sync $T async_training.mode=sync)
echo "| setting | measured prompts/s | simulated prompts/s | measured vs sync | simulated vs sync |"
echo "|---|---|---|---|---|"
echo "| sync ($T threads) | $rs | $ps | 1.00x | 1.00x |"
for s in 0.3 0.5; do
    ra=$(real "a$s" async_training.mode=async async_training.staleness_threshold=$s async_training.rollout_threads=$half \
         async_training.trainer_threads=$(( T - half > 0 ? T - half : 1 )))
    pa=$(sim "a$s" 1 async_training.mode=async async_training.staleness_threshold=$s)
    /usr/bin/python3 -c "import sys; rs,ps,ra,pa=map(float,sys.argv[1:]); print('| async s=$s partial on (1+1 threads) | %.2f | %.2f | %.2fx | %.2fx (error %+.0f%%) |' % (ra, pa, ra/rs, pa/ps, 100*((pa/ps)/(ra/rs)-1)))" "$rs" "$ps" "$ra" "$pa"
done
echo
echo "command: bash bench/run_simulate_validation.sh $*  ($T cores, load average $(cut -d' ' -f1-3 /proc/loadavg))"
