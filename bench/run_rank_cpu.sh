#!/usr/bin/env bash
# What each role of a `moerl rl` mpirun job really consumes: CPU time and run-queue wait of every rank,
# read from /proc/<pid>/task/*/schedstat every 50 ms, counted from the trainer's first log line (the
# job's start-up excluded) to the end. The workload is bench/run_simulate_validation.sh's
# (examples/bench_async.yaml, async, one thread per rank), with 1 trainer + R rollout ranks.
# Usage: bash bench/run_rank_cpu.sh [R (default 1)] [BUILD] [extra key=value ...]
# Prints prompts/s, the idle ratios, each rank's CPU and run-queue wait and the load average.
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-1}
[[ $# -gt 0 ]] && shift
BUILD=build
if [[ $# -gt 0 && $1 != *=* ]]; then BUILD=$1; shift; fi
MM=$BUILD/moerl-mpi
[[ -x $MM ]] || make -j2 "$MM"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PY=/usr/bin/python3
# the sampler: every 50 ms, one line per thread of this job's ranks: time rank tid run_ns wait_ns
$PY - "$OUT/sched" "$OUT/run" <<'PY' &
import os, sys, time, signal
out, tag = open(sys.argv[1], "w"), sys.argv[2].encode()
signal.signal(signal.SIGTERM, lambda *a: (out.close(), os._exit(0)))
ranks = {}
while True:
    t = time.time()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if tag not in open("/proc/%s/cmdline" % pid, "rb").read() or b"moerl-mpi" not in open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")[0]:
                continue
            if pid not in ranks:
                env = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
                ranks[pid] = next((e.split(b"=")[1].decode() for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")), None)
            if ranks[pid] is None:
                continue
            for tid in os.listdir("/proc/%s/task" % pid):
                r, w, _ = open("/proc/%s/task/%s/schedstat" % (pid, tid)).read().split()
                out.write("%.3f %s %s %s %s\n" % (t, ranks[pid], tid, r, w))
        except (OSError, ValueError):
            pass  # the process or thread ended between the listing and the read
    time.sleep(0.05)
PY
SP=$!
L0=$(cut -d' ' -f1-3 /proc/loadavg)
env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun --oversubscribe -np $((R + 1)) "$MM" rl --config examples/bench_async.yaml \
    trainer.n_ranks=1 trainer.default_local_dir="$OUT/run" trainer.total_training_steps=8 async_training.mode=async "$@" \
    2>"$OUT/log" </dev/null | tail -1 >"$OUT/result.json" || { echo "run failed:"; tail -5 "$OUT/log"; kill $SP; exit 1; }
kill $SP
wait $SP 2>/dev/null || true
$PY - "$OUT" "$R" "$L0" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import collections, datetime, json, sys
out, R, l0, l1 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
d = json.loads(open(out + "/result.json").read())
first = open(out + "/run/run.log").readline()  # "[YYYY-mm-dd HH:MM:SS.mmm] ...": the job's start
t0 = datetime.datetime.strptime(first[1:24], "%Y-%m-%d %H:%M:%S.%f").timestamp()
samples = collections.defaultdict(list)
for line in open(out + "/sched"):
    t, rank, tid, r, w = line.split()
    samples[(rank, tid)].append((float(t), int(r), int(w)))
per = collections.defaultdict(lambda: [0.0, 0.0])
for (rank, tid), v in samples.items():
    before = [x for x in v if x[0] <= t0]
    b = before[-1] if before else (t0, 0, 0)  # a thread started after t0 counts from zero
    per[rank][0] += (v[-1][1] - b[1]) / 1e9
    per[rank][1] += (v[-1][2] - b[2]) / 1e9
print("1 trainer + %d rollout ranks: %.3f prompts/s, wall %.2f s, trainer idle %.2f, rollout idle %.2f; load average "
      "before %s, after %s" % (R, d["prompts_per_s"], d["wall_s"], d["trainer_idle_ratio"], d["rollouter_idle_ratio"], l0, l1))
roll = 0.0
for rank in sorted(per, key=int):
    role = "trainer" if int(rank) == R else "rollout"
    roll += per[rank][0] if role == "rollout" else 0
    print("  rank %s (%s): CPU %.2f s, run-queue wait %.2f s" % (rank, role, per[rank][0], per[rank][1]))
print("  rollout ranks together: CPU %.2f s" % roll)
PY
