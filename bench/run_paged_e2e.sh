#!/usr/bin/env bash
# The end-to-end async job (moerl rl) before and after the paged KV cache (issue 28): generated
# tokens/s (the run's tokens_per_s, rollout output over the run) on the demo (examples/demo.yaml) and
# on a long-prompt variant of it (data.task=gsm8k-style: word problems, prompts of about 200 tokens
# on the demo's tokenizer, against the arith prompts' few dozen), interleaved rounds, medians. The SFT warm start is skipped (sft.total_training_steps=0):
# the measure is the RL job's.
#   after  = BUILD/moerl with the rl defaults (paged, prefix caching on, the reservation-sized budget)
#   before = BEFORE/moerl when BEFORE is a build folder of the engine before the paged cache (the parent
#            of the first paged-cache commit, built in a scratch worktree), else the same binary with
#            rollout.enable_prefix_caching=false and rollout.kv_cache_bytes=0: the same
#            reservation-sized budget as after (rl's default), nothing shared, so the pair differs only
#            in prefix sharing (the paged kernels and per-step allocation run in both; the label says which).
# Usage: bash bench/run_paged_e2e.sh [ROUNDS [STEPS]]   env: BUILD (build), BEFORE (unset),
#        THREADS (nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-10}
BUILD=${BUILD:-build}
THREADS=${THREADS:-$(nproc)}
OUT=$(mktemp -d)
[[ -x $BUILD/moerl ]] || { echo "$BUILD/moerl not built (make -j2)" >&2; exit 1; }
if [[ -n ${BEFORE:-} ]]; then
    [[ -x $BEFORE/moerl ]] || { echo "BEFORE=$BEFORE: no $BEFORE/moerl" >&2; exit 1; }
    BEFORE_LABEL="before ($BEFORE/moerl)"
else
    BEFORE_LABEL="before (reservation, no prefix caching)"
fi
COMMON=(sft.total_training_steps=0 trainer.total_training_steps="$STEPS" trainer.n_threads="$THREADS"
        trainer.save_freq=-1 trainer.test_freq=0 trainer.val_n=0 trainer.resume_mode=disable)
LONG=(data.task=gsm8k-style model.max_position_embeddings=1024)
run() { # workload variant round: prints tokens/s
    local w=$1 v=$2 i=$3 bin=$BUILD/moerl
    local -a extra=()
    [[ $w == long ]] && extra+=("${LONG[@]}")
    if [[ $v == before ]]; then
        if [[ -n ${BEFORE:-} ]]; then bin=$BEFORE/moerl
        else extra+=(rollout.enable_prefix_caching=false rollout.kv_cache_bytes=0); fi
    fi
    local d=$OUT/$w-$v-$i
    "$bin" rl --config examples/demo.yaml "${COMMON[@]}" "${extra[@]}" trainer.default_local_dir="$d" >"$d.json" \
        2>"$d.log" || { echo "run $w $v $i failed: $(tail -n 3 "$d.log")" >&2; exit 1; }
    /usr/bin/python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["tokens_per_s"])' "$d.json"
}
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A R
for ((i = 1; i <= ROUNDS; i++)); do
    for w in demo long; do
        for v in before after; do R[$w-$v]+="$(run "$w" "$v" "$i") "; done
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| workload | $BEFORE_LABEL tokens/s | after (paged, prefix caching) tokens/s | after / before | per round (before; after) |"
echo "|---|---|---|---|---|"
for w in demo long; do
    /usr/bin/python3 - "$w" "${R[$w-before]}" "${R[$w-after]}" <<'PY'
import statistics, sys
w, b, a = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
mb, ma = statistics.median(b), statistics.median(a)
name = "demo" if w == "demo" else "long prompts"
print(f"| {name} | {mb:.0f} | {ma:.0f} | {ma / mb:.2f}x | {' '.join(f'{x:.0f}' for x in b)}; {' '.join(f'{x:.0f}' for x in a)} |")
PY
done
rm -rf "$OUT"
