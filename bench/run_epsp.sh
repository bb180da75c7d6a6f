#!/usr/bin/env bash
# Expert parallelism and Ulysses SP under mpirun (bench/bench_dist_epsp.c); prints each command and its table.
#   --mode ep  -np 2 and -np 4: all-to-all vs all-to-all-v step and exchange time, EP bytes per step against
#              the formula, model state per rank against one rank holding every expert
#   --mode sp  -np 4: Ulysses size 1, 2, 4 (rest data parallel): step and exchange time, SP bytes per step
#              against the formula, activation bytes per rank
#   --mode mem -np 4, one process group per layout (DP 4, FSDP 4, EP 4, EP 2 x FSDP 2): model state and
#              gathered peak per rank (moerl's accounting), peak RSS, bytes per step, step time
# Usage: bench/run_epsp.sh [BUILD]   (default build). On a bigger machine raise --tokens / --reps and -np
# (the EP sizes must divide the 16 experts), e.g. mpirun -np 8 ... --mode ep --tokens 2048 --reps 9.
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-${BUILD:-build}}
B=$BUILD/mpi/bench/bench_dist_epsp
[[ -x $B ]] || make -j2 "$B"
# shellcheck source=mpi_env.sh
source bench/mpi_env.sh
echo "# $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=$OMP_NUM_THREADS"
run mpirun --oversubscribe -np 2 "$B" --mode ep --reps 5
run mpirun --oversubscribe -np 4 "$B" --mode ep --reps 5
run mpirun --oversubscribe -np 4 "$B" --mode sp --reps 5 --sp 1,2,4
for k in 0 1 2 3; do run mpirun --oversubscribe -np 4 "$B" --mode mem --layers 4 --reps 5 --layout $k; done
