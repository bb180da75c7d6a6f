#!/usr/bin/env bash
# run_llamacpp_grpo.sh — rollout throughput on one GRPO workload (issue 28): moerl's rollout engine
# with prefix caching, the same engine without it, and llama.cpp with its own prompt sharing
# (the prompt prefilled once per group, its KV given to the group's other sequences with
# llama_memory_seq_cp, continuous batching), on the same weights (the benchmark model B of
# bench_decode, exported to GGUF), the same threads and the same forced response lengths.
# Medians over repetitions and the ratio per repetition; method and output: the header of
# bench/llamacpp_grpo.c; figures: docs/engine.md ("Against llama.cpp on a GRPO workload").
#
# Usage: bash bench/run_llamacpp_grpo.sh [--groups 8] [--n 8] [--prompt-min 256] [--prompt-max 512]
#            [--alpha 1.0] [--resp-min 4] [--resp-max 256] [--max-seqs G*n] [--max-batched-tokens 2048]
#            [--dtype f32|bf16] [--reps 3] [--seed 2026] [--llama-kv default|unified|split|both]
#            [--greedy] [--workload-out FILE]
# Threads: OMP_NUM_THREADS (default: all cores). Needs make and bash scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=llamacpp_build.sh
source bench/llamacpp_build.sh || exit $?
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
exec "$LLAMACPP_GRPO_BIN" --lib-dir "$LLAMA_LIB_DIR" --tmp "${TMPDIR:-/tmp}" "$@"
