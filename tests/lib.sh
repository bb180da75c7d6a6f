# tests/lib.sh — the shared harness of the end-to-end scripts (tests/e2e_*.sh). A script starts with
#     source "$(dirname "$0")/lib.sh"
# before anything else (it moves to the repository root, so the script's own paths are relative to it).
# What it gives:
#   counting   passed / failed; ok [NAME] (NAME printed as "ok   NAME"); bad NAME WHY ("FAIL NAME: WHY")
#              or bad WHY ("FAIL: WHY"); fail WHY... (= bad "WHY..."); check WHAT CMD... (ok when CMD
#              succeeds, else bad WHAT); finish: prints "N passed, N failed" (the line tests/run.sh counts)
#              and exits 0 only when nothing failed.
#   W          a fresh scratch folder (absolute path) under $MOERL_TESTDATA (else /tmp), removed at exit
#              when nothing failed, kept (and named) otherwise.
#   expect_err WHAT TEXT CMD...: CMD (stdout to $W/out, stderr to $W/err) fails, not by a signal, and its
#              stderr holds TEXT (grep $EXPECT_ERR_GREP: -qF, a literal, unless the script sets another).
#   json_field KEY [FILE]: prints the top-level field KEY of the JSON object in FILE (else stdin).
#   require_mpi NAME BUILD: the MPI scripts' gate: exits with "0 passed, 0 failed" when MOERL_NO_MPI=1 /
#              NO_MPI=1, with one failure when mpirun or BUILD/moerl-mpi is missing.
# It also sets -u and, where OPENBLAS_CORETYPE is unset and the CPU has AVX2+FMA, exports Haswell (as
# tests/run.sh and moerl_blas_coretype_init do: OpenBLAS 0.3.21 does not know some current CPUs).
# Each script keeps its own variables (BUILD, the binaries) and its checks.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY=/usr/bin/python3
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
fi

passed=0
failed=0
ok() {
    passed=$((passed + 1))
    if [[ $# -gt 0 ]]; then echo "ok   $*"; fi
}
bad() {
    failed=$((failed + 1))
    if [[ $# -gt 1 ]]; then echo "FAIL $1: ${*:2}"; else echo "FAIL: $*"; fi
}
fail() { bad "$*"; }
check() {
    local what=$1
    shift
    if "$@"; then ok; else bad "$what"; fi
}
finish() {
    echo "$passed passed, $failed failed"
    [[ $failed -eq 0 ]]
    exit $?
}

_lib_base=${MOERL_TESTDATA:-/tmp}
mkdir -p "$_lib_base"
W=$(mktemp -d "$(cd "$_lib_base" && pwd)/$(basename "$0" .sh).XXXXXX") || { echo "FAIL: mktemp"; exit 1; }
_lib_cleanup() {
    if [[ $failed -eq 0 ]] || rmdir "$W" 2>/dev/null; then rm -rf "$W"; else echo "outputs kept in $W"; fi
}
trap _lib_cleanup EXIT

EXPECT_ERR_GREP=${EXPECT_ERR_GREP:--qF}
expect_err() {
    local what=$1 text=$2
    shift 2
    "$@" >"$W/out" 2>"$W/err"
    local rc=$?
    # shellcheck disable=SC2086
    if [[ $rc -ne 0 && $rc -lt 128 ]] && grep $EXPECT_ERR_GREP -- "$text" "$W/err"; then ok
    else bad "$what (rc $rc): $(head -c 400 "$W/err")"; fi
}

json_field() {
    "$PY" -c 'import json, sys; print(json.load(open(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin)[sys.argv[1]])' "$@"
}

require_mpi() {
    local name=$1 build=$2
    if [[ ${MOERL_NO_MPI:-0} == 1 || ${NO_MPI:-0} == 1 ]]; then
        echo "$name: skipped: MOERL_NO_MPI=1 / NO_MPI=1 (MPI not wanted)"
        finish
    fi
    if ! command -v mpirun >/dev/null 2>&1; then
        echo "FAIL $name: mpirun is not installed, but the MPI tests are part of the suite: run scripts/setup.sh"
        echo "     (apt-get install openmpi-bin libopenmpi-dev) and rebuild, or set MOERL_NO_MPI=1 to skip them"
        failed=$((failed + 1))
        finish
    fi
    if [[ ! -x $build/moerl-mpi ]]; then
        echo "FAIL $name: $build/moerl-mpi is not built although mpirun is installed (is mpicc on PATH? make builds it"
        echo "     when it finds mpicc); set MOERL_NO_MPI=1 to skip the MPI tests"
        failed=$((failed + 1))
        finish
    fi
}
