#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job's demo —
# an SFT warm start on the built-in arithmetic task, then fully-asynchronous GRPO — printing the
# held-out accuracy of the SFT start and of the RL result. Extra arguments are config overrides
# (key=value), e.g. `bash scripts/demo.sh trainer.total_training_steps=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make -j"$(nproc)" build/moerl
exec ./build/moerl rl --config examples/demo.yaml "$@"
