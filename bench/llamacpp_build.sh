#!/usr/bin/env bash
# llamacpp_build.sh — compile bench/llamacpp_decode.c against build/libmoerl.a and llama.cpp's
# prebuilt CPU library from the npm package @node-llama-cpp/linux-x64 (headers extracted by
# scripts/setup.sh into third_party/llama.cpp). Sourced by bench/run_llamacpp.sh and
# tests/e2e_llamacpp.sh; sets LLAMA_LIB_DIR and LLAMACPP_BIN, or returns 3 (with a message on
# stderr) when the library or headers are not installed.
BUILD=${BUILD:-build}
LLAMA_LIB_DIR=${LLAMA_LIB_DIR:-${MOERL_NPM:-third_party/npm/node_modules}/@node-llama-cpp/linux-x64/bins/linux-x64}
LLAMA_INC=${LLAMA_INC:-third_party/llama.cpp}
LLAMACPP_BIN=$BUILD/bench/llamacpp_decode
if [[ ! -f $LLAMA_LIB_DIR/libllama.v0.5.0.so || ! -f $LLAMA_INC/include/llama.h ]]; then
    echo "llama.cpp's prebuilt library or headers missing ($LLAMA_LIB_DIR, $LLAMA_INC): run bash scripts/setup.sh" >&2
    return 3
fi
[[ -f $BUILD/libmoerl.a ]] || { echo "run make first ($BUILD/libmoerl.a missing)" >&2; return 3; }
if [[ ! -x $LLAMACPP_BIN || bench/llamacpp_decode.c -nt $LLAMACPP_BIN || $BUILD/libmoerl.a -nt $LLAMACPP_BIN ]]; then
    mkdir -p "$BUILD/bench"
    # the Makefile's own compiler flags and libraries (printed by an --eval'd rule), plus llama.cpp's
    MK=$(make -s --no-print-directory --eval='moerl-print-%: ; @echo "$($*)"' moerl-print-CFLAGS moerl-print-LDLIBS 2>/dev/null | grep -v '^moerl:')
    MK_CFLAGS=$(sed -n 1p <<<"$MK" | sed 's/ -MMD -MP//')
    MK_LDLIBS=$(sed -n 2p <<<"$MK")
    LIBDIR_ABS=$(cd "$LLAMA_LIB_DIR" && pwd)
    # shellcheck disable=SC2086
    ${CC:-cc} $MK_CFLAGS -I"$LLAMA_INC/include" -I"$LLAMA_INC/ggml/include" -fopenmp -o "$LLAMACPP_BIN" \
        bench/llamacpp_decode.c "$BUILD/libmoerl.a" "$LIBDIR_ABS/libllama.v0.5.0.so" "$LIBDIR_ABS/libggml.v0.5.0.so" \
        "$LIBDIR_ABS/libggml-base.so" -Wl,-rpath,"$LIBDIR_ABS" $MK_LDLIBS || return 1
fi
return 0
