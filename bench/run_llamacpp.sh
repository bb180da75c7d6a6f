#!/usr/bin/env bash
# run_llamacpp.sh — decode tokens/s of moerl's rollout engine beside llama.cpp's on the same
# weights: the benchmark model B of bench_decode (H 512, 8 layers, 32 experts top-4, 433 MB fp32)
# exported with model_export_gguf, llama.cpp's prebuilt CPU library from the npm package
# @node-llama-cpp/linux-x64 3.22.1 (scripts/setup.sh), the same number of threads, batch 1/8/32,
# medians over repetitions and the ratio per repetition; llama.cpp at its own defaults (f16 KV
# cache, its KV layout, flash attention auto). Method: bench/llamacpp_decode.c's header.
# Same dtype on both sides: --gguf-dtype bf16 --moerl-bf16 (the "bf16 moerl / llama.cpp" column).
#
# Usage: bash bench/run_llamacpp.sh [--reps 5] [--batches 1,8,32] [--max-tokens 32] [--prompt-len 16]
#                                   [--gguf-dtype f32|bf16] [--moerl-bf16]
# Threads: OMP_NUM_THREADS (default: all cores). Needs make and bash scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=llamacpp_build.sh
source bench/llamacpp_build.sh || exit $?
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
exec "$LLAMACPP_BIN" --lib-dir "$LLAMA_LIB_DIR" --tmp "${TMPDIR:-/tmp}" "$@"
