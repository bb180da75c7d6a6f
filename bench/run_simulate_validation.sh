#!/usr/bin/env bash
# moerl simulate against measured runs of the same workload (examples/bench_async.yaml, the async
# benchmark: heavy-tailed response lengths, random model) on this machine.
#
# Calibration (from short measured runs, per execution setting, so each role's costs are those of the
# threads and processes it runs with):
#   setting "T"   one process, OMP_NUM_THREADS = all cores        (the synchronous baseline)
#   setting "1"   one process, one thread per role                (async: rollout thread + trainer thread)
#   setting "mpi" mpirun, one process per rank, one thread each   (1 trainer + R rollout ranks)
# For each: STEPS steps of `moerl rl async_training.mode=sync` (REPS repetitions; per-step medians of
# timing_s/gen, timing_s/update, timing_s/param_sync, the first step dropped as warm-up) and
# `moerl simulate --calibrate` of the same job (the cost model's shape: engine-step time in bytes,
# FLOPs and a constant; training time per FLOP; fitted on this machine). The scales
#   sim.gen_scale   = measured generation time per step / simulated  (generation time per token in flight)
#   sim.train_scale = measured update time per step / simulated      (train time per token)
#   sim.sync_overhead_s = measured parameter-sync time per sync
# then carry the calibration to the longer runs; sim.host_cores = the cores here: the roles are one-thread
# processes (threads in the one-process settings) sharing them by processor sharing — while n roles
# compute (the trainer in an update, each rollout replica with a group in its engine step; waiting
# roles sleep) each runs at min(1, cores / n) of its calibrated speed (src/sim/sim.h).
# Calibrating runs: sync (setting T), cal_1, cal_mpi (synchronous: the sides never overlap, so their
# per-phase times are each side's unshared speed). Predicted: async s=0.3 / 0.5 and 1 trainer + 1/2/3
# rollout ranks (asynchronous: the overlap and the sharing are the model's).
# Predictions: `moerl simulate` with those keys for every configuration; measured: STEPS-step runs,
# median prompts/s over REPS repetitions. Reported: both, the ratios (async/sync; R rollout ranks vs
# R = 1) and the error of the predicted ratio. The machine's load average is printed before and after:
# other work on the machine changes the measured figures, so re-run on a quiet machine to compare.
# Usage: bash bench/run_simulate_validation.sh [BUILD] [extra key=value ...]
#        (REPS=n, STEPS=n, NO_MPI=1, KEEP=dir (keep the runs' folders there) in the environment). The repetitions are interleaved (every
#        configuration once per round), so that slow drifts of the load hit all alike.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [[ $# -gt 0 && $1 != *=* ]]; then BUILD=$1; shift; fi
EXTRA=("$@")
REPS=${REPS:-3}
STEPS=${STEPS:-8}
T=$(nproc)
M=$BUILD/moerl
MM=$BUILD/moerl-mpi
CFG=examples/bench_async.yaml
[[ -x $M ]] || make -j2 "$M"
MPI=1
if [[ ${NO_MPI:-0} == 1 ]] || ! command -v mpirun >/dev/null 2>&1 || [[ ! -x $MM ]]; then MPI=0; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if [[ -n ${KEEP:-} ]]; then OUT=$KEEP; mkdir -p "$OUT"; else OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT; fi
PY=/usr/bin/python3
echo "# $T cores, load average before: $(cut -d' ' -f1-3 /proc/loadavg); $CFG; $STEPS-step runs, median of $REPS;" \
     "repetitions interleaved"

# real LABEL SETTING NP_ROLLOUT keys... : repetition $REP of a STEPS-step run, its final JSON line appended
# to $OUT/LABEL.jsonl, its metrics in $OUT/LABEL.REP/metrics.jsonl. SETTING T | 1 | mpi; NP_ROLLOUT:
# rollout ranks (mpi only).
real() {
    local label=$1 setting=$2 nr=$3
    shift 3
    local dir="$OUT/$label.$REP" cmd
    case $setting in
    T) cmd=(env OMP_NUM_THREADS="$T" "$M" rl --config "$CFG" trainer.n_threads="$T") ;;
    1) cmd=(env OMP_NUM_THREADS=1 "$M" rl --config "$CFG" async_training.rollout_threads=1
            async_training.trainer_threads=1 trainer.n_threads=1) ;;
    mpi) cmd=(env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun --oversubscribe -np $((nr + 1)) "$MM" rl
              --config "$CFG" trainer.n_ranks=1) ;;
    esac
    cmd+=(trainer.default_local_dir="$dir" trainer.total_training_steps="$STEPS" "$@" "${EXTRA[@]}")
    [[ $REP -eq 1 ]] && echo "\$ ${cmd[*]}" >>"$OUT/commands.txt"
    if ! "${cmd[@]}" 2>"$dir.log" </dev/null | tail -1 >>"$OUT/$label.jsonl"; then
        echo "run $label failed:"; tail -5 "$dir.log"; exit 1
    fi
}
# sim LABEL SETTING ROLLOUT_DEVICES keys... : one simulation, JSON into $OUT/s_LABEL.json
sim() {
    local label=$1 setting=$2 nr=$3
    shift 3
    local th=1
    [[ $setting == T ]] && th=$T
    OMP_NUM_THREADS=$th "$M" simulate --config "$CFG" trainer.default_local_dir="$OUT/s_$label" \
        sim.rollout_devices="$nr" "$@" "${EXTRA[@]}" --json >"$OUT/s_$label.json" 2>"$OUT/s_$label.log" ||
        { echo "simulate $label failed:"; tail -5 "$OUT/s_$label.log"; exit 1; }
}

# The configurations: label | setting | rollout ranks | keys. The "cal_*" runs are synchronous runs of
# each setting whose per-phase times calibrate the simulator (the sync baseline is its own).
CONFIGS=("sync|T|1|async_training.mode=sync"
         "cal_1|1|1|async_training.mode=sync"
         "async0.3|1|1|async_training.mode=async async_training.staleness_threshold=0.3"
         "async0.5|1|1|async_training.mode=async async_training.staleness_threshold=0.5")
[[ $MPI == 1 ]] && CONFIGS+=("cal_mpi|mpi|1|async_training.mode=sync"
                             "mpi_r1|mpi|1|async_training.mode=async"
                             "mpi_r2|mpi|2|async_training.mode=async"
                             "mpi_r3|mpi|3|async_training.mode=async")
# repetitions outermost: every configuration sees the machine's load of the same minutes
for REP in $(seq 1 "$REPS"); do
    for c in "${CONFIGS[@]}"; do
        IFS='|' read -r label setting nr keys <<<"$c"
        # shellcheck disable=SC2086
        real "$label" "$setting" "$nr" $keys
    done
    echo "# repetition $REP done, load average $(cut -d' ' -f1-3 /proc/loadavg)"
done

# calibrate SETTING CAL_LABEL: writes $OUT/cal_SETTING.keys (key=value lines for moerl simulate)
calibrate() {
    local s=$1 cl=$2
    sim "cal_$s" "$s" 1 --calibrate trainer.total_training_steps="$STEPS" async_training.mode=sync
    $PY - "$OUT" "$s" "$cl" "$REPS" "$T" <<'PY' >"$OUT/cal_$s.keys"
import json, statistics as st, sys
out, s, cl, reps, cores = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
gen, upd, syn = [], [], []
for r in range(1, reps + 1):
    rows = [json.loads(l) for l in open("%s/%s.%d/metrics.jsonl" % (out, cl, r)) if l.strip()]
    rows = [x for x in rows if "timing_s/gen" in x][1:]  # drop the warm-up step
    gen.append(st.median(x["timing_s/gen"] for x in rows))
    upd.append(st.median(x["timing_s/update"] for x in rows))
    syn.append(st.median(x.get("timing_s/param_sync", 0.0) for x in rows))
g, u, y = st.median(gen), st.median(upd), st.median(syn)
sj = json.load(open("%s/s_cal_%s.json" % (out, s)))
sg, su = sj["rollout_busy_s"] / sj["steps"], sj["train_busy_s"] / sj["steps"]
keys = dict(sj["cost_keys"])
keys["sim.gen_scale"] = g / sg
keys["sim.train_scale"] = u / su
keys["sim.sync_overhead_s"] = y
keys["sim.host_cores"] = cores
for k, v in keys.items():
    print("%s=%s" % (k, v))
print("# calibration %s (from %s): measured gen %.4f s/step, update %.4f s/step, sync %.4f s; simulated before "
      "scaling gen %.4f, update %.4f -> sim.gen_scale %.3f, sim.train_scale %.3f"
      % (s, cl, g, u, y, sg, su, g / sg, u / su))
PY
}
calibrate T sync
calibrate 1 cal_1
[[ $MPI == 1 ]] && calibrate mpi cal_mpi
for c in "${CONFIGS[@]}"; do
    IFS='|' read -r label setting nr keys <<<"$c"
    [[ $label == cal_* ]] && continue
    mapfile -t ck < <(grep -v '^#' "$OUT/cal_$setting.keys")
    # shellcheck disable=SC2086
    sim "$label" "$setting" "$nr" trainer.total_training_steps="$STEPS" $keys "${ck[@]}"
done
grep -h '^#' "$OUT"/cal_*.keys

$PY - "$OUT" "$REPS" <<'PY'
import json, statistics as st, sys
out, reps = sys.argv[1], int(sys.argv[2])
def meas(l):
    return st.median(json.loads(x)["prompts_per_s"] for x in open("%s/%s.jsonl" % (out, l)) if x.strip())
def spread(l):
    v = [json.loads(x)["prompts_per_s"] for x in open("%s/%s.jsonl" % (out, l)) if x.strip()]
    return min(v), max(v)
def pred(l):
    return json.load(open("%s/s_%s.json" % (out, l)))["prompts_per_s"]
import os
labels = [l for l in ["sync", "async0.3", "async0.5", "mpi_r1", "mpi_r2", "mpi_r3"] if os.path.exists("%s/%s.jsonl" % (out, l))]
print("| configuration | measured prompts/s (median, min–max) | simulated prompts/s | error |")
print("|---|---|---|---|")
for l in labels:
    m, p = meas(l), pred(l)
    lo, hi = spread(l)
    print("| %s | %.3f (%.3f–%.3f) | %.3f | %+.1f%% |" % (l, m, lo, hi, p, 100 * (p / m - 1)))
print()
print("| ratio | measured | simulated | error of the ratio |")
print("|---|---|---|---|")
pairs = [("async0.3", "sync"), ("async0.5", "sync")]
if "mpi_r1" in labels:
    pairs += [("mpi_r2", "mpi_r1"), ("mpi_r3", "mpi_r1")]
worst = 0
for a, b in pairs:
    rm, rp = meas(a) / meas(b), pred(a) / pred(b)
    worst = max(worst, abs(rp / rm - 1))
    print("| %s / %s | %.3f | %.3f | %+.1f%% |" % (a, b, rm, rp, 100 * (rp / rm - 1)))
print()
def phases(l):  # per-step medians over repetitions: update time, wait for groups (the trainer's side)
    u, g = [], []
    for r in range(1, reps + 1):
        rows = [json.loads(x) for x in open("%s/%s.%d/metrics.jsonl" % (out, l, r)) if x.strip()]
        rows = [x for x in rows if "timing_s/gen" in x]
        n = json.loads(open("%s/%s.jsonl" % (out, l)).readlines()[r - 1])["steps"]  # the run's trainer steps
        u.append(sum(x["timing_s/update"] for x in rows) / n)
        g.append(sum(x["timing_s/gen"] for x in rows) / n)
    return st.median(u), st.median(g)
if "mpi_r1" in labels:
    print("| per trainer step | update s measured | simulated | wait for groups s measured | simulated |")
    print("|---|---|---|---|---|")
    for l in [x for x in labels if x.startswith("mpi_r")]:
        mu, mg = phases(l)
        sj = json.load(open("%s/s_%s.json" % (out, l)))
        su, sg = sj["train_busy_s"] / sj["steps"], sj["trainer_idle_ratio"] * sj["wall_s"] / sj["steps"]
        print("| %s | %.3f | %.3f | %.3f | %.3f |" % (l, mu, su, mg, sg))
    print()
print("largest error of a predicted ratio: %.1f%% (the bar: 10%%)" % (100 * worst))
PY
echo
echo "commands (first repetition of each):"
sed 's/^/    /' "$OUT/commands.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: REPS=$REPS STEPS=$STEPS bash bench/run_simulate_validation.sh ${BUILD} ${EXTRA[*]}"
