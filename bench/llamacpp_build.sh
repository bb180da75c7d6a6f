#!/usr/bin/env bash
# llamacpp_build.sh — compile bench/llamacpp_decode.c and bench/llamacpp_grpo.c against
# build/libmoerl.a and llama.cpp's prebuilt CPU library from the npm package
# @node-llama-cpp/linux-x64 (headers extracted by scripts/setup.sh into third_party/llama.cpp).
# Sourced by bench/run_llamacpp.sh, bench/run_llamacpp_grpo.sh and tests/e2e_llamacpp.sh; sets
# LLAMA_LIB_DIR, LLAMACPP_BIN (llamacpp_decode) and LLAMACPP_GRPO_BIN (llamacpp_grpo), or returns 3
# (with a message on stderr) when the library or headers are not installed.
BUILD=${BUILD:-build}
LLAMA_LIB_DIR=${LLAMA_LIB_DIR:-${MOERL_NPM:-third_party/npm/node_modules}/@node-llama-cpp/linux-x64/bins/linux-x64}
LLAMA_INC=${LLAMA_INC:-third_party/llama.cpp}
LLAMACPP_BIN=$BUILD/bench/llamacpp_decode
LLAMACPP_GRPO_BIN=$BUILD/bench/llamacpp_grpo
if [[ ! -f $LLAMA_LIB_DIR/libllama.v0.5.0.so || ! -f $LLAMA_INC/include/llama.h ]]; then
    echo "llama.cpp's prebuilt library or headers missing ($LLAMA_LIB_DIR, $LLAMA_INC): run bash scripts/setup.sh" >&2
    return 3
fi
[[ -f $BUILD/libmoerl.a ]] || { echo "run make first ($BUILD/libmoerl.a missing)" >&2; return 3; }
llamacpp_build_one() {  # bench/NAME.c -> $BUILD/bench/NAME when a source or libmoerl.a is newer
    local src=bench/$1.c bin=$BUILD/bench/$1
    if [[ -x $bin && ! $src -nt $bin && ! bench/llamacpp_common.h -nt $bin && ! bench/bench_util.h -nt $bin && ! bench/bench_engine.h -nt $bin &&
          ! $BUILD/libmoerl.a -nt $bin ]]; then
        return 0
    fi
    mkdir -p "$BUILD/bench"
    # the Makefile's own compiler flags and libraries (printed by an --eval'd rule), plus llama.cpp's
    local MK MK_CFLAGS MK_LDLIBS LIBDIR_ABS
    MK=$(make -s --no-print-directory --eval='moerl-print-%: ; @echo "$($*)"' moerl-print-CFLAGS moerl-print-LDLIBS 2>/dev/null | grep -v '^moerl:')
    MK_CFLAGS=$(sed -n 1p <<<"$MK" | sed 's/ -MMD -MP//')
    MK_LDLIBS=$(sed -n 2p <<<"$MK")
    LIBDIR_ABS=$(cd "$LLAMA_LIB_DIR" && pwd)
    # shellcheck disable=SC2086
    ${CC:-cc} $MK_CFLAGS -I"$LLAMA_INC/include" -I"$LLAMA_INC/ggml/include" -fopenmp -o "$bin" \
        "$src" "$BUILD/libmoerl.a" "$LIBDIR_ABS/libllama.v0.5.0.so" "$LIBDIR_ABS/libggml.v0.5.0.so" \
        "$LIBDIR_ABS/libggml-base.so" -Wl,-rpath,"$LIBDIR_ABS" $MK_LDLIBS
}
llamacpp_build_one llamacpp_decode || return 1
llamacpp_build_one llamacpp_grpo || return 1
return 0
