#!/usr/bin/env bash
# Replays the committed regression inputs, then fuzzes each target for SECONDS (`make fuzz` calls
# this after `make fuzz-build`; fuzz/README.md). Usage: bash fuzz/run.sh SECONDS [TARGET...]
# (TARGET: safetensors, wire, ...; default all). One line per target: executions, seconds, result.
# Exit status non-zero when a regression input or the fuzzer finds a crash, leak, sanitizer report,
# timeout or over-sized allocation; the input is left in $FUZZ_WORK/artifacts/<target>/.
# FUZZ_WORK (default build-fuzz): where corpus/, artifacts/ and logs/ go (binaries: build-fuzz/fuzz/).
set -u
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
B=build-fuzz
WK=${FUZZ_WORK:-build-fuzz}
targets=("$@")
if ((${#targets[@]} == 0)); then
    for s in fuzz/fuzz_*.c; do t=$(basename "$s" .c); targets+=("${t#fuzz_}"); done
fi
# -malloc_limit_mb: one allocation above this is a finding (inputs are ≤ 64 KiB, so a parser asking
# for more is trusting a length field); -timeout: one input taking longer is a finding.
OPTS=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=64 -max_len=65536 -print_final_stats=1)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# tests/lsan.supp: only leaks inside Open MPI and the sanitizer runtime's own thread start-up (never moerl's)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
fail=0
for t in "${targets[@]}"; do
    bin=$B/fuzz/fuzz_$t
    if [[ ! -x $bin ]]; then echo "fuzz $t: no $bin (run make fuzz-build)"; fail=1; continue; fi
    mkdir -p "$WK/corpus/$t" "$WK/artifacts/$t" "$WK/logs"
    log=$WK/logs/$t.log
    : >"$log"
    # 1. every committed regression input and seed, once
    regs=()
    [[ -d fuzz/regressions/$t ]] && while IFS= read -r -d '' f; do regs+=("$f"); done \
        < <(find "fuzz/regressions/$t" -type f -print0 | sort -z)
    if ((${#regs[@]})) && ! "$bin" "${OPTS[@]}" -artifact_prefix="$WK/artifacts/$t/" "${regs[@]}" >>"$log" 2>&1; then
        echo "fuzz $t: a regression input fails again (log $log)"; tail -30 "$log"; fail=1; continue
    fi
    if ! "$bin" "${OPTS[@]}" -runs=0 -artifact_prefix="$WK/artifacts/$t/" "fuzz/corpus/$t" >>"$log" 2>&1; then
        echo "fuzz $t: a seed input fails (log $log)"; tail -30 "$log"; fail=1; continue
    fi
    # 2. fuzz (new inputs go to $WK/corpus/<t>; the committed seeds are read, not written)
    if [[ $SECONDS_EACH -gt 0 ]]; then
        "$bin" "${OPTS[@]}" -max_total_time="$SECONDS_EACH" -artifact_prefix="$WK/artifacts/$t/" \
            "$WK/corpus/$t" "fuzz/corpus/$t" >>"$log" 2>&1
        rc=$?
        execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
        secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1 | awk '{print $5}')
        if [[ $rc -ne 0 ]]; then
            echo "fuzz $t: FOUND a failure after ${execs:-?} executions (log $log, input in $WK/artifacts/$t/)"
            grep -E 'ERROR|runtime error|fuzz property|SUMMARY' "$log" | head -5
            fail=1
        else
            printf 'fuzz %-12s %10s executions in %4s s, %2d regression inputs, no failure\n' "$t" "${execs:-?}" \
                "${secs:-?}" "${#regs[@]}"
        fi
    else
        printf 'fuzz %-12s %2d regression inputs and the seed corpus replayed, no failure\n' "$t" "${#regs[@]}"
    fi
done
exit $fail
