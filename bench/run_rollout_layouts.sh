#!/usr/bin/env bash
# The rollout engine's layouts on the same 2 ranks (issue 27; the Ascend practice's inference comparison):
# one workload (prompts × tokens, EOS ignored, temperature 1) run as dp 2 (two whole replicas, half the prompts
# each), tp 2 (one replica split over both ranks: rollout.tensor_model_parallel_size=2) and ep 2 (each rank 8 of
# the 16 experts and half the prompts: rollout.expert_parallel_size=2), interleaved round by round
# (bench/bench_dist_rollout_layouts.c); prints every round, the tokens/s medians and the weights and KV bytes per
# rank. Then the same at a small batch (one prompt per replica: the latency regime).
# Usage: bench/run_rollout_layouts.sh [BUILD] [ROUNDS]   (defaults: build, 5). The machine may be shared: the
# load average is printed before and after; compare the layouts of one run, not runs of different days.
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-${BUILD:-build}}
ROUNDS=${2:-5}
B=$BUILD/mpi/bench/bench_dist_rollout_layouts
[[ -x $B ]] || make -j2 "$B"
# shellcheck source=mpi_env.sh
source bench/mpi_env.sh
echo "# $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=$OMP_NUM_THREADS"
run mpirun --oversubscribe -np 2 "$B" --rounds "$ROUNDS" --prompts 16 --tokens 32
run mpirun --oversubscribe -np 2 "$B" --rounds "$ROUNDS" --prompts 2 --tokens 32
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
