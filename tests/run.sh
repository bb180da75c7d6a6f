#!/usr/bin/env bash
# Runs the suite: PyTorch reference generators (tests/ref/gen_*.py), then every C test binary
# ($BUILD/tests/test_*), then end-to-end command tests (tests/e2e_*.sh).
#   bash tests/run.sh                  the whole suite
#   bash tests/run.sh NAME [NAME...]   only the named steps, by basename with or without extension
#                                      (test_config, e2e_pool.sh, gen_model.py); they run in suite order.
#                                      A test that reads reference data needs its generator run once
#                                      before (name it too, or run the whole suite once).
# Every step must print a line "N passed, N failed": a step that exits 0 without one counts as 1
# failed. Ends with one line "N passed, N failed"; non-zero on failure (2 on an unknown NAME).
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

# The suite's steps, in order: "NAME<TAB>KIND<TAB>PATH" (KIND gen | bin | e2e). A C test whose binary
# is not built is listed with its source, so that naming it says what is missing.
steps() {
    local f n
    for f in tests/ref/gen_*.py; do [[ -e $f ]] && printf '%s\tgen\t%s\n' "$(basename "$f" .py)" "$f"; done
    for f in "$BUILD"/tests/test_*; do
        [[ -x $f && ! -d $f ]] && printf '%s\tbin\t%s\n' "$(basename "$f")" "$f"
    done
    for f in tests/test_*.c; do
        n=$(basename "$f" .c)
        [[ -e $f && ! -x $BUILD/tests/$n ]] && printf '%s\tunbuilt\t%s\n' "$n" "$f"
    done
    for f in tests/e2e_*.sh; do [[ -e $f ]] && printf '%s\te2e\t%s\n' "$(basename "$f" .sh)" "$f"; done
}
STEPS=$(steps)

# The names asked for, without extension; an unknown one stops here with the list of names.
declare -A WANT=()
for arg in "$@"; do
    n=$(basename "$arg")
    n=${n%.py}
    n=${n%.sh}
    n=${n%.c}
    if ! cut -f1 <<<"$STEPS" | grep -qxF -- "$n"; then
        echo "tests/run.sh: unknown test '$arg'; the names (BUILD=$BUILD):" >&2
        cut -f1 <<<"$STEPS" | sort -u | paste -sd' ' | fold -s -w 100 | sed 's/^/  /' >&2
        exit 2
    fi
    WANT[$n]=1
done

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
    if [[ -z "$line" && $rc -eq 0 ]]; then
        f=1
        echo "tests/run.sh: $name exited 0 but printed no \"N passed, N failed\" count: counted as failed" >>"$log"
    fi
    passed=$((passed + p)); failed=$((failed + f))
    printf '%-28s %4d passed %3d failed  (%.1fs)\n' "$name" "$p" "$f" "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')"
    if [[ $f -ne 0 ]]; then echo "---- $log (last 40 lines)"; tail -40 "$log"; echo "----"; fi
}
while IFS=$'\t' read -r -u 3 name kind path; do  # fd 3: the steps keep the caller's stdin
    [[ -n $name ]] || continue
    if [[ $# -gt 0 && -z ${WANT[$name]:-} ]]; then continue; fi
    case $kind in
    gen) run_one "$name" $PY "$path" "$MOERL_TESTDATA" ;;  # reference data from PyTorch, into $MOERL_TESTDATA
    bin) run_one "$name" "$path" ;;
    e2e) run_one "$name" bash "$path" "$BUILD" ;;
    unbuilt)  # only when named: the whole suite runs what is built, as before
        if [[ $# -gt 0 ]]; then
            echo "$name: $BUILD/tests/$name is not built (make $BUILD/tests/$name)"
            failed=$((failed + 1))
        fi ;;
    esac
done 3<<<"$STEPS"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
