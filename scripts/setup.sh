#!/usr/bin/env bash
# Installs every Debian package moerl's build, tests, benchmarks and demo need.
# Idempotent and quick when everything is present. Runs without a terminal.
set -euo pipefail
PKGS=(build-essential pkg-config libopenblas-dev libopenblas-openmp-dev libyaml-dev libjansson-dev
      python3 python3-numpy python3-torch gnuplot-nox openmpi-bin libopenmpi-dev
      clang libclang-rt-dev)  # clang + compiler-rt (libFuzzer, sanitizer runtimes): tests/e2e_fuzz.sh
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "setup: all packages present"
fi
