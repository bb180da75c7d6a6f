#!/usr/bin/env bash
# run_moe_layer_torch.sh — the MoE layer (forward + backward) of moerl's production path against the
# Ascend practice's baseline: PyTorch eager running Hugging Face's Qwen3MoeSparseMoeBlock (router,
# top-k, a loop over the experts hit with torch.where / index_add_; bench/torch_train_step.py
# --moe-layer), same shape (1024 tokens, hidden 256, 16 experts top-4, expert width 128), fp32, the
# same thread count, then PyTorch at 1 thread (its best count here: its OpenMP and OpenBLAS pools
# compete with 2). moerl's figure is bench_moe_ablation's fused ("full") configuration, which runs
# mlp_forward + mlp_backward — the code the trainer runs. Alternates the two ROUNDS times; prints
# each run and the ratio of the medians. No thresholds: a benchmark, not a test.
# Usage: bash bench/run_moe_layer_torch.sh [ROUNDS (default 3)] [THREADS (default 2)]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
T=${2:-2}
PY=/usr/bin/python3
[[ -x build/bench/bench_moe_ablation ]] || make -j2 build/bench/bench_moe_ablation
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
echo "# $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $T threads, $ROUNDS rounds"
m=(); t=(); t1=()
for r in $(seq 1 "$ROUNDS"); do
    ms=$(OMP_NUM_THREADS=$T build/bench/bench_moe_ablation --reps 9 --no-decode --no-step |
        awk '/^ *full +forward/ {f=$3; b=$6} END {printf "%.3f", f + b}')
    tt=$(OPENBLAS_NUM_THREADS=$T $PY bench/torch_train_step.py --moe-layer --threads "$T" --reps 9 --json |
        $PY -c 'import json,sys; print(json.loads(sys.stdin.read())["ms_median"])')
    t1r=$(OPENBLAS_NUM_THREADS=1 $PY bench/torch_train_step.py --moe-layer --threads 1 --reps 9 --json |
        $PY -c 'import json,sys; print(json.loads(sys.stdin.read())["ms_median"])')
    echo "round $r: moerl $ms ms, PyTorch $tt ms ($T threads), PyTorch $t1r ms (1 thread)"
    m+=("$ms"); t+=("$tt"); t1+=("$t1r")
done
$PY - "${m[*]}" "${t[*]}" "${t1[*]}" "$T" <<'PYEOF'
import statistics, sys
m, t, t1 = ([float(v) for v in a.split()] for a in sys.argv[1:4])
mm, tm, t1m = statistics.median(m), statistics.median(t), statistics.median(t1)
print("moerl MoE layer fwd+bwd %.2f ms; PyTorch HF loop %.2f ms (%s threads) -> %.2fx, %.2f ms (1 thread) -> %.2fx; "
      "moerl's time is %.0f%% below PyTorch's best (practice: -60%% for sorted permute + grouped GEMM)"
      % (mm, tm, sys.argv[4], tm / mm, t1m, t1m / mm, 100 * (1 - mm / min(tm, t1m))))
PYEOF
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
