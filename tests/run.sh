#!/usr/bin/env bash
# Runs the whole suite: PyTorch reference generators, then every C test binary, then
# end-to-end command tests. Ends with one line "N passed, N failed"; non-zero on failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=/usr/bin/python3
export MOERL_TESTDATA=$BUILD/testdata
mkdir -p "$MOERL_TESTDATA"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# OpenBLAS 0.3.21 falls back to slow generic kernels on CPUs it does not know; the moerl binary
# picks Haswell kernels itself (moerl_blas_coretype_init), test binaries get it here when unset.
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
fi
# Sanitizer builds (BUILD=build-san): full malloc stacks, so that tests/lsan.supp recognises the leaks
# Open MPI and hwloc leave at exit (its only entries; moerl's own leaks are never suppressed).
export ASAN_OPTIONS=${ASAN_OPTIONS:-fast_unwind_on_malloc=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
passed=0; failed=0
run_one() {  # name, command...
    local name=$1; shift
    local log=$MOERL_TESTDATA/$name.log
    local t0=$(date +%s.%N)
    "$@" >"$log" 2>&1
    local rc=$?
    local line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
    local p=0 f=0
    if [[ -n "$line" ]]; then p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}'); fi
    if [[ $rc -ne 0 && $f -eq 0 ]]; then f=1; fi
    if [[ -z "$line" && $rc -eq 0 ]]; then p=1; fi
    passed=$((passed + p)); failed=$((failed + f))
    printf '%-28s %4d passed %3d failed  (%.1fs)\n' "$name" "$p" "$f" "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')"
    if [[ $f -ne 0 ]]; then echo "---- $log (last 40 lines)"; tail -40 "$log"; echo "----"; fi
}
# 1. reference data from PyTorch (each script writes into $MOERL_TESTDATA)
for gen in tests/ref/gen_*.py; do
    [[ -e $gen ]] || continue
    run_one "$(basename "$gen" .py)" $PY "$gen" "$MOERL_TESTDATA"
done
# 2. C test binaries
for t in "$BUILD"/tests/test_*; do
    [[ -x $t ]] || continue
    run_one "$(basename "$t")" "$t"
done
# 3. shell-level end-to-end tests
for s in tests/e2e_*.sh; do
    [[ -e $s ]] || continue
    run_one "$(basename "$s" .sh)" bash "$s" "$BUILD"
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
