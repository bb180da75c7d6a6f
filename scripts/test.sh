#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make -j"$(nproc)"
bash tests/run.sh
