#!/usr/bin/env bash
# Fuzz targets (fuzz/fuzz_*.c, fuzz/README.md), run by tests/run.sh as `bash tests/e2e_fuzz.sh BUILD`:
# builds them with clang's libFuzzer + ASan + UBSan (make fuzz-build → build-fuzz/), replays every
# committed regression input (fuzz/regressions/<target>/) and seed (fuzz/corpus/<target>/), then
# fuzzes each target for FUZZ_TEST_SECONDS (default 3). One check per target; a crash, leak,
# sanitizer report, broken property, over-sized allocation or slow input fails it. clang is part of
# the setup (scripts/setup.sh), so a missing clang FAILS. Runs once, with the plain build's suite
# (BUILD=build); under another BUILD it prints that and "0 passed, 0 failed".
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
if [[ $BUILD != build ]]; then
    echo "e2e_fuzz: runs with the plain suite (BUILD=build); nothing to do for BUILD=$BUILD"
    echo "0 passed, 0 failed"
    exit 0
fi
if ! command -v clang >/dev/null 2>&1; then
    echo "FAIL e2e_fuzz: clang is not installed, but the fuzz targets are part of the suite: run scripts/setup.sh"
    echo "0 passed, 1 failed"
    exit 1
fi
SECS=${FUZZ_TEST_SECONDS:-3}
mkdir -p build-fuzz
if ! make -s -j2 fuzz-build >build-fuzz/make.log 2>&1; then
    echo "FAIL e2e_fuzz: make fuzz-build failed:"
    tail -30 build-fuzz/make.log
    echo "0 passed, 1 failed"
    exit 1
fi
for s in fuzz/fuzz_*.c; do
    t=$(basename "$s" .c)
    t=${t#fuzz_}
    if out=$(bash fuzz/run.sh "$SECS" "$t" 2>&1); then
        echo "$out"
        passed=$((passed + 1))
    else
        echo "FAIL: $out"
        failed=$((failed + 1))
    fi
done
finish
