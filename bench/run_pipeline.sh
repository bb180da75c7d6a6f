#!/usr/bin/env bash
# Pipeline bubble (issue 13): bench_dist_pipeline under mpirun -np 2 (2 stages, one compute thread
# each): measured idle share of the stages next to the 1F1B theory (p−1)/(m+p−1) and the interleaved
# theory (p−1)/(v·m+p−1), for fixed micro-batch counts 2, 4, 8 with and without look-ahead receives,
# and the dynamic count (4..16 from the token budget, micro-batches of at least 64 or 128 tokens);
# the same rows with the interleaved schedule (v = 2 chunks per stage) in the same run; then m = 2 with the progress thread off
# (--progress-us 0). The one-rank peer is a one-stage pipeline (same code) on rank 0.
# Then stage-owned dp 2 x pp 2 (-np 4): the exposed gradient sum over a stage's data-parallel ranks,
# after the schedule against overlapped with the cool-down (v = 2; v = 1 has nothing to overlap).
# Then the model state per rank (stage-owned against replicated): measured with 2 and 4 stages on the
# benchmark model (--memory), and the arithmetic for Qwen3-30B-A3B's layout (--config-json).
# Usage: bench/run_pipeline.sh [BUILD] [extra bench flags]   (default build; builds the binary if missing)
# The figures need free cores: 2 ranks on 2 cores with other work around inflate every idle share.
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-${BUILD:-build}}
shift || true
if ! command -v mpirun >/dev/null 2>&1; then
    echo "run_pipeline: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    exit 1
fi
[[ -x $BUILD/mpi/bench/bench_dist_pipeline ]] || make -j2 "$BUILD/mpi/bench/bench_dist_pipeline"
# shellcheck source=mpi_env.sh
source bench/mpi_env.sh
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
fi
echo "# $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=$OMP_NUM_THREADS"
run mpirun --oversubscribe -np 2 "$BUILD/mpi/bench/bench_dist_pipeline" --reps 5 --fixed 2,4,8 --min-mb-tokens 64,128 --vpp 1,2 "$@"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# without the progress thread"
run mpirun --oversubscribe -np 2 "$BUILD/mpi/bench/bench_dist_pipeline" --reps 5 --fixed 2 --progress-us 0 "$@"
echo "# stage-owned dp 2 x pp 2: the stage's gradient sum after the schedule against overlapped with the cool-down"
run mpirun --oversubscribe -np 4 "$BUILD/mpi/bench/bench_dist_pipeline" --owned 2 --vpp 1,2 --fixed 4 --reps 5
echo "# model state per rank: stage-owned against replicated"
run mpirun --oversubscribe -np 2 "$BUILD/mpi/bench/bench_dist_pipeline" --memory --layers 8
run mpirun --oversubscribe -np 4 "$BUILD/mpi/bench/bench_dist_pipeline" --memory --layers 8
run "$BUILD/mpi/bench/bench_dist_pipeline" --config-json examples/qwen3_30b_a3b/config.json --pp 1,2,4,8
