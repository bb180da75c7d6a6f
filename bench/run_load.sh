#!/usr/bin/env bash
# run_load.sh — checkpoint load time and peak RSS of a 1.05 GB (F32) / 0.53 GB (BF16) Qwen3-MoE
# checkpoint for each loading mode (read|copy|mmap, model_load_opts), measured in the same run; see
# bench/bench_load.c for what is timed. Writes the checkpoints under build/bench/load_ckpt
# (removed afterwards unless --keep).
# Usage: bash bench/run_load.sh [--reps 5] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/bench/bench_load"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bench/bench_load" "$@"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
