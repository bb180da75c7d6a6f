#!/usr/bin/env bash
# Rollout scaling of the main job across processes: `mpirun -np R+T build/moerl-mpi rl
# trainer.n_ranks=T` with R = 1, 2, 3 rollout ranks and T = 1 trainer (plus R = 1, T = 2 data-parallel
# trainers), against the single-process async job (build/moerl, rollout and trainer threads) measured
# in the same run. Workload: examples/bench_async.yaml (heavy-tailed response lengths, random model).
#   A  as configured in the YAML: the trainer turns out to be the slower role on this machine
#   B  rollout-heavy: 8 responses per prompt with a heavier length tail (Pareto alpha 0.9, up to 384
#      tokens), decode batches of ≤ 8 sequences, staleness_threshold 1.0: at 1:1 the rollout rank is
#      the slower role (idle ~7%, the trainer ~30%)
# Per setting: median over REPS runs (default 3) of generated tokens/s and prompts/s (the JSON the job
# prints), the ratio of tokens/s to the 1:1 split, idle ratios, and the parameter sync: mean time of
# a whole sync on trainer rank 0 (pause/drain → broadcast → resume) and of the weight broadcast with
# its payload bandwidth.
# Usage: bench/run_mpi_scaling.sh [BUILD] [extra key=value ...]   (REPS=n, STEPS=n in the environment)
# Every process runs one compute thread; a machine with fewer cores than processes is oversubscribed
# (the job never spins while waiting, so idle ranks leave their core to the others).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [[ $# -gt 0 && $1 != *=* ]]; then BUILD=$1; shift; fi
EXTRA=("$@")
REPS=${REPS:-3}
STEPS=${STEPS:-8}
if ! command -v mpirun >/dev/null 2>&1; then
    echo "run_mpi_scaling: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    exit 1
fi
[[ -x $BUILD/moerl-mpi && -x $BUILD/moerl ]] || make -j2 "$BUILD/moerl" "$BUILD/moerl-mpi"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
CFG=examples/bench_async.yaml
echo "# $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $CFG, $STEPS steps," \
     "median of $REPS runs; one compute thread per process"

# run LABEL NP T [overrides]: one JSON line per repetition into $OUT/LABEL.jsonl (NP 0: one process)
run() {
    local label=$1 np=$2 t=$3
    shift 3
    : >"$OUT/$label.jsonl"
    for rep in $(seq 1 "$REPS"); do
        local dir="$OUT/$label.$rep" cmd
        if [[ $np -eq 0 ]]; then
            cmd=("$BUILD/moerl" rl --config "$CFG" trainer.default_local_dir="$dir" trainer.total_training_steps="$STEPS"
                 async_training.rollout_threads=1 async_training.trainer_threads=1 "$@" "${EXTRA[@]}")
        else
            cmd=(mpirun --oversubscribe -np "$np" "$BUILD/moerl-mpi" rl --config "$CFG" trainer.default_local_dir="$dir"
                 trainer.total_training_steps="$STEPS" trainer.n_ranks="$t" "$@" "${EXTRA[@]}")
        fi
        [[ $rep -eq 1 ]] && echo "\$ ${cmd[*]}" >>"$OUT/commands.txt"
        if ! "${cmd[@]}" 2>"$dir.log" | tail -1 >>"$OUT/$label.jsonl"; then
            echo "run $label failed:"
            tail "$dir.log"
            exit 1
        fi
    done
}

table() {  # workload name, then labels
    local name=$1
    shift
    echo
    echo "### workload $name"
    echo "| setting | gen tokens/s (min–max) | vs 1:1 | prompts/s | rollout idle | trainer idle | param sync s | weight bcast s | bcast GB/s | exposed grad reduce s |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    /usr/bin/python3 - "$OUT" "$@" <<'PY'
import json, statistics, sys
out, labels = sys.argv[1], sys.argv[2:]
def load(l):
    return [json.loads(x) for x in open("%s/%s.jsonl" % (out, l)) if x.strip()]
def med(rs, k):
    v = [r.get(k, float("nan")) for r in rs]
    return statistics.median(v)
lo = lambda rs: min(r["tokens_per_s"] for r in rs)
hi = lambda rs: max(r["tokens_per_s"] for r in rs)
base = med(load(labels[1]), "tokens_per_s")  # labels[1] is the 1:1 split
for l in labels:
    rs = load(l)
    t = med(rs, "tokens_per_s")
    name = l.split("_", 1)[1].replace("_", " ")
    if "world_size" in rs[0]:
        print("| %s | %.0f (%.0f–%.0f) | %.2fx | %.2f | %.2f | %.2f | %.4f | %.4f | %.2f | %.3f |" % (
            name, t, lo(rs), hi(rs), t / base, med(rs, "prompts_per_s"), med(rs, "rollouter_idle_ratio"), med(rs, "trainer_idle_ratio"),
            med(rs, "param_sync_s"), med(rs, "weight_bcast_s"), med(rs, "weight_bcast_GBps"),
            med(rs, "grad_reduce_exposed_s")))
    else:
        print("| %s | %.0f (%.0f–%.0f) | %.2fx | %.2f | %.2f | %.2f | - | - | - | - |" % (
            name, t, lo(rs), hi(rs), t / base, med(rs, "prompts_per_s"), med(rs, "rollouter_idle_ratio"), med(rs, "trainer_idle_ratio")))
PY
}

for w in A B; do
    O=()
    [[ $w == B ]] && O=(rollout.max_num_seqs=8 rollout.n=8 actor.ppo_mini_batch_size=4 data.max_response_length=384
                        rollout.synthetic_length.alpha=0.9 async_training.staleness_threshold=1.0)
    run "${w}_one_process_(threads_1+1)" 0 1 "${O[@]}"
    run "${w}_1_rollout_:_1_trainer" 2 1 "${O[@]}"
    run "${w}_2_rollout_:_1_trainer" 3 1 "${O[@]}"
    run "${w}_3_rollout_:_1_trainer" 4 1 "${O[@]}"
    run "${w}_1_rollout_:_2_trainers_(DP)" 3 2 "${O[@]}"
    table "$w$([[ $w == B ]] && echo ' (rollout-heavy)')" "${w}_one_process_(threads_1+1)" \
        "${w}_1_rollout_:_1_trainer" "${w}_2_rollout_:_1_trainer" "${w}_3_rollout_:_1_trainer" \
        "${w}_1_rollout_:_2_trainers_(DP)"
done
echo
echo "commands (first repetition of each; output folders are temporary):"
cat "$OUT/commands.txt"
