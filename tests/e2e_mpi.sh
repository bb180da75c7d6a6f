#!/usr/bin/env bash
# MPI tests of the distributed layer (src/dist), run by tests/run.sh as `bash tests/e2e_mpi.sh BUILD`.
#   test_dist     N = 2, 3, 4 ranks: bucket plan, reducer (all overlap modes) vs the exact sum, weight
#                 broadcast, header mismatch, point-to-point, small collectives, role errors
#   test_dist_dp  DP = 2 and 3 against DP = 1 (and DP = 3 + one rollout rank receiving the weights)
#   test_dist_trainer  the RL trainer (every loss_agg_mode, reinforce++, overlong filter, global aux loss)
#                 at DP = 2 and 3 against one rank and one micro-batch
#   fatal         a rank calling moerl_fatal must end the whole job quickly (MPI_Abort), naming the rank
# Skips (with its reason and "0 passed, 0 failed") only when mpirun is not installed. Prints
# "N passed, N failed" (each mpirun's summed checks plus the fatal-rank checks); non-zero on failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
if ! command -v mpirun >/dev/null 2>&1; then
    echo "e2e_mpi: skipped: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    echo "0 passed, 0 failed"
    exit 0
fi
# Open MPI in containers: allow root, more ranks than cores (idle ranks then yield), no CMA/ptrace
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 # N ranks share the cores: one compute thread each
MPIRUN=(mpirun --oversubscribe)
passed=0
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

run_mpi() {  # label, np, binary, args...
    local label=$1 np=$2 bin=$3
    shift 3
    if [[ ! -x $bin ]]; then
        fail "$label: $bin not built (mpirun is installed: build with mpicc so make builds the MPI tests)"
        return
    fi
    local out rc
    out=$(timeout 300 "${MPIRUN[@]}" -np "$np" "$bin" "$@" 2>&1)
    rc=$?
    local line
    line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
    local p=0 f=0
    if [[ -n $line ]]; then
        p=$(echo "$line" | awk '{print $1}')
        f=$(echo "$line" | awk '{print $3}')
    fi
    if [[ $rc -ne 0 && $f -eq 0 ]]; then f=1; fi
    if [[ -z $line ]]; then f=$((f > 0 ? f : 1)); fi
    passed=$((passed + p))
    failed=$((failed + f))
    printf '%-34s %5d passed %3d failed (exit %d)\n' "$label" "$p" "$f" "$rc"
    if [[ $f -ne 0 ]]; then echo "---- output"; echo "$out" | tail -40; echo "----"; fi
}

T=$BUILD/mpi/tests
for np in 2 3 4; do run_mpi "test_dist -np $np" "$np" "$T/test_dist"; done
run_mpi "test_dist_dp -np 2 (DP=2)" 2 "$T/test_dist_dp"
run_mpi "test_dist_dp -np 3 (DP=3)" 3 "$T/test_dist_dp"
run_mpi "test_dist_dp -np 4 (DP=3 + rollout)" 4 "$T/test_dist_dp" --trainers 3
run_mpi "test_dist_trainer -np 2 (DP=2)" 2 "$T/test_dist_trainer"
run_mpi "test_dist_trainer -np 3 (DP=3)" 3 "$T/test_dist_trainer"

# fatal on one rank: the others wait in a barrier forever unless MPI_Abort ends the job
if [[ -x $T/test_dist ]]; then
    err=$(mktemp)
    t0=$(date +%s.%N)
    timeout 30 "${MPIRUN[@]}" -np 3 "$T/test_dist" --fatal 1 >/dev/null 2>"$err"
    rc=$?
    dt=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.1f", a-b}')
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then fail "fatal: the job hung (timeout 30 s) after rank 1 called moerl_fatal"
    elif [[ $rc -eq 0 ]]; then fail "fatal: exit code 0 after a fatal error"
    else passed=$((passed + 1)); fi
    if grep -q 'moerl\[rank 1\]' "$err" && grep -q 'deliberate failure on rank 1' "$err"; then passed=$((passed + 1))
    else fail "fatal: stderr does not name rank 1 and the message:"; cat "$err"; fi
    echo "fatal rank 1 of 3: exit $rc after ${dt}s"
    rm -f "$err"
else
    fail "fatal: $T/test_dist not built"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
