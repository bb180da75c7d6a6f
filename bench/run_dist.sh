#!/usr/bin/env bash
# Distributed benchmarks (src/dist) under mpirun; prints each command, then its table.
#   bench_dist_reduce  -np 2: exposed gradient-reduction time per step and its share of the step
#                      (backward + reduce), overlap off / communication thread / polling between layers
#   bench_weight_sync  -np 2 and -np 3: weight broadcast time and bandwidth vs model and bucket size,
#                      against memcpy of the same bytes in the same run
# Usage: bench/run_dist.sh [BUILD]   (default build; builds the MPI binaries with make if missing)
# Results depend on free cores: ranks, their compute threads and the communication thread share them.
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-${BUILD:-build}}
if ! command -v mpirun >/dev/null 2>&1; then
    echo "run_dist: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    exit 1
fi
if [[ ! -x $BUILD/mpi/bench/bench_dist_reduce || ! -x $BUILD/mpi/bench/bench_weight_sync ]]; then
    make -j2 "$BUILD/mpi/bench/bench_dist_reduce" "$BUILD/mpi/bench/bench_weight_sync"
fi
# Open MPI in containers: allow root, more ranks than cores, no CMA/ptrace single copy
# shellcheck source=mpi_env.sh
source bench/mpi_env.sh
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
fi
echo "# $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=$OMP_NUM_THREADS," \
     "OMPI_MCA_btl_vader_single_copy_mechanism=none"
run mpirun --oversubscribe -np 2 "$BUILD/mpi/bench/bench_dist_reduce" --reps 5 --bucket-mb 25,4,1
run mpirun --oversubscribe -np 2 "$BUILD/mpi/bench/bench_weight_sync" --reps 9
run mpirun --oversubscribe -np 3 "$BUILD/mpi/bench/bench_weight_sync" --reps 9 --sizes-mb 32 --buckets-kb 64,1024,0
