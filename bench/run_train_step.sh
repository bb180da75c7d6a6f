#!/usr/bin/env bash
# run_train_step.sh — one fp32 training step of the benchmark Qwen3-MoE, moerl against PyTorch eager.
#
# Runs build/bench/bench_train_step (moerl) and bench/torch_train_step.py (the same model and step in
# PyTorch eager, HF Qwen3MoE style) with the same thread count, alternating the two ROUNDS times,
# and prints a table of medians: moerl tokens/s, PyTorch tokens/s, ratio moerl/PyTorch, and the
# per-phase medians (forward, logprobs, backward, optimizer) of both. Each run reports the median
# of its --reps timed steps; with several rounds the table shows the median over rounds.
# No thresholds: this is a benchmark, not a test.
#
# Other processes: on a shared machine a busy neighbour changes both numbers (an OpenMP program
# waits at every join for a thread the kernel has descheduled). Before each run the script waits
# up to --wait-idle seconds for the CPUs to be idle (< 10% busy over one second), and for each run
# it reports "others %": the CPU time used by other processes during the run, as a percentage of
# the machine (all busy time in /proc/stat minus the run's own CPU time). The table's medians are
# taken over the runs with others < 10% when there are any (the "runs used" column says how many).
#
# PyTorch's own best thread count can be lower than moerl's: with few cores its OpenMP pool
# (torch.set_num_threads) and the OpenBLAS pthread pool it calls for matmuls compete for the same
# cores. Unless --no-peer-best is given, PyTorch is also run at 1 thread when the largest requested
# count is above 1, and a second ratio against the best PyTorch figure measured is printed.
#
# Usage: bash bench/run_train_step.sh [--threads "2"] [--reps 10] [--rounds 1] [--wait-idle 60]
#                                     [--timeout 900] [--no-peer-best]
#   --threads    space- or comma-separated thread counts (default 2: all cores of the dev machine)
#   --wait-idle  seconds to wait for idle CPUs before each run (0: do not wait)
#   --timeout    seconds allowed per run (a run past it is reported as "timeout")
# Environment: OPENBLAS_CORETYPE defaults to Haswell for both sides (Debian 12's OpenBLAS 0.3.21
# falls back to generic SSE3 kernels on CPUs it does not know); anything else (OMP_WAIT_POLICY,
# ...) is passed to both unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
THREADS="2"
REPS=10
ROUNDS=1
WAIT_IDLE=60
TIMEOUT=900
PEER_BEST=1
CMDLINE="bash bench/run_train_step.sh"
[[ $# -gt 0 ]] && CMDLINE+=$(printf ' %q' "$@")
while [[ $# -gt 0 ]]; do
    case "$1" in
        --threads) THREADS=${2//,/ }; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --wait-idle) WAIT_IDLE=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --no-peer-best) PEER_BEST=0; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "run_train_step.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in $THREADS $REPS $ROUNDS $TIMEOUT; do
    if ! [[ $v =~ ^[1-9][0-9]*$ ]]; then
        echo "run_train_step.sh: thread counts, --reps, --rounds and --timeout must be positive integers (got '$v')" >&2
        exit 2
    fi
done
if ! [[ $WAIT_IDLE =~ ^[0-9]+$ ]]; then
    echo "run_train_step.sh: --wait-idle must be a non-negative integer (got '$WAIT_IDLE')" >&2
    exit 2
fi
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
BENCH=build/bench/bench_train_step
if [[ ! -x $BENCH ]]; then
    echo "run_train_step.sh: $BENCH not built (run make -j2 first)" >&2
    exit 1
fi
if ! $PY -c 'import torch' 2>/dev/null; then
    echo "run_train_step.sh: $PY cannot import torch (Debian python3-torch is expected)" >&2
    exit 1
fi

exec $PY - "$BENCH" "$THREADS" "$REPS" "$ROUNDS" "$WAIT_IDLE" "$TIMEOUT" "$PEER_BEST" "$CMDLINE" <<'EOF'
import json, os, resource, statistics, subprocess, sys, time

bench, threads, reps, rounds, wait_idle, timeout, peer_best, cmdline = sys.argv[1:]
threads = [int(t) for t in threads.split()]
reps, rounds, wait_idle, timeout, peer_best = int(reps), int(rounds), int(wait_idle), int(timeout), int(peer_best)
ncpu = os.cpu_count()
PH = ["forward_ms", "logprobs_ms", "backward_ms", "optimizer_ms"]


def cpu_jiffies():
    """(busy, total) jiffies of all CPUs from the first line of /proc/stat: user, nice, system,
    idle, iowait, irq, softirq, steal (time the hypervisor gave to others counts as busy; guest
    time is already inside user and is left out)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    idle = f[3] + f[4]  # idle + iowait
    return sum(f) - idle, sum(f)


def busy_fraction(seconds):
    b0, t0 = cpu_jiffies()
    time.sleep(seconds)
    b1, t1 = cpu_jiffies()
    return (b1 - b0) / max(1, t1 - t0)


def wait_for_idle():
    """Wait up to wait_idle seconds for < 10% busy CPUs; returns the last busy fraction seen."""
    deadline = time.time() + wait_idle
    while True:
        f = busy_fraction(1.0)
        if f < 0.10 or time.time() >= deadline:
            return f


def run(impl, t):
    if wait_idle:
        wait_for_idle()
    if impl == "moerl":
        cmd = [bench, "--threads", str(t), "--reps", str(reps), "--json"]
    else:
        cmd = [sys.executable, "bench/torch_train_step.py", "--threads", str(t), "--reps", str(reps), "--json"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0, j0 = cpu_jiffies()
    w0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        err = None if p.returncode == 0 else "failed (exit %d): %s" % (p.returncode, p.stderr.strip()[-300:])
    except subprocess.TimeoutExpired:
        p, err = None, "timeout"
    wall = time.time() - w0
    b1, j1 = cpu_jiffies()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    hz = os.sysconf("SC_CLK_TCK")
    others = max(0.0, ((b1 - b0) / hz - own) / (wall * ncpu)) if wall > 0 else 0.0
    if err:
        print("run_train_step: %s with %d threads: %s" % (impl, t, err), file=sys.stderr)
        r = {"impl": impl, "threads": t, "error": err.split(" ")[0]}
    else:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    r["others_pct"] = 100.0 * others
    print("  ran %-7s %2d threads: %s  (others %.0f%%)" % (
        impl, t, "%.1f ms/step" % r["step_ms_median"] if "error" not in r else r["error"], r["others_pct"]),
        flush=True)
    return r


def load():
    return " ".join(open("/proc/loadavg").read().split()[:3])


print("run_train_step: %d CPUs, load average %s; OPENBLAS_CORETYPE=%s OMP_WAIT_POLICY=%s; reps %d, rounds %d, "
      "wait-idle %d s" % (ncpu, load(), os.environ.get("OPENBLAS_CORETYPE"), os.environ.get("OMP_WAIT_POLICY", "unset"),
                          reps, rounds, wait_idle), flush=True)
runs = []
max_t = max(threads)
for t in threads:
    for _ in range(rounds):
        runs.append(run("moerl", t))
        runs.append(run("pytorch", t))
if peer_best and max_t > 1 and 1 not in threads:
    for _ in range(rounds):
        runs.append(run("pytorch", 1))


CLEAN_PCT = 10.0  # runs during which other processes used less than this share of the CPUs


def summary(impl, t):
    """Medians over the runs of impl at t threads: over the clean runs (others < CLEAN_PCT) when
    there is one, else over all runs."""
    sel = [r for r in runs if r["impl"] == impl and r["threads"] == t]
    ok = [r for r in sel if "error" not in r]
    if not ok:
        return {"error": sel[0]["error"]} if sel else None
    clean = [r for r in ok if r["others_pct"] < CLEAN_PCT]
    use = clean or ok
    s = {k: statistics.median(r[k] for r in use) for k in ["step_ms_median", "tokens_per_s"] + PH}
    s["others"] = max(r["others_pct"] for r in use)
    s["used"] = "%d/%d" % (len(use), len(sel))
    s["first_loss"] = ok[0]["first_loss"]
    return s


def fmt(s):
    if not s:
        return "-"
    return s["error"] if "error" in s else "%.0f" % s["tokens_per_s"]


def good(s):
    return s is not None and "error" not in s


print()
print("%-8s %13s %15s %20s %14s %11s" % ("threads", "moerl tok/s", "PyTorch tok/s", "ratio moerl/PyTorch",
                                         "max others %", "runs used"))
for t in threads:
    a, b = summary("moerl", t), summary("pytorch", t)
    ratio = "%.2fx" % (a["tokens_per_s"] / b["tokens_per_s"]) if good(a) and good(b) else "-"
    oth = max([s["others"] for s in (a, b) if good(s)], default=float("nan"))
    used = " ".join(s["used"] for s in (a, b) if good(s))
    print("%-8d %13s %15s %20s %14.0f %11s" % (t, fmt(a), fmt(b), ratio, oth, used))
print("(medians over the runs with others < %.0f%% when there are any; \"runs used\" = moerl, PyTorch)" % CLEAN_PCT)
print()
print("per-phase medians (ms)      %9s %9s %9s %9s %9s" % ("forward", "logprobs", "backward", "optimizer", "step"))
for t in sorted({r["threads"] for r in runs}):
    for impl in ("moerl", "pytorch"):
        s = summary(impl, t)
        if good(s):
            print("  %-7s %2d threads       %9.1f %9.1f %9.1f %9.1f %9.1f   first loss %.4f" % (
                impl, t, s["forward_ms"], s["logprobs_ms"], s["backward_ms"], s["optimizer_ms"], s["step_ms_median"],
                s["first_loss"]))
peers = [(t, summary("pytorch", t)) for t in sorted({r["threads"] for r in runs if r["impl"] == "pytorch"})]
peers = [(t, s) for t, s in peers if good(s)]
m = summary("moerl", max_t)
if peers and good(m):
    bt, bs = max(peers, key=lambda p: p[1]["tokens_per_s"])
    if bt != max_t:
        print()
        print("best PyTorch measured: %.0f tok/s at %d thread(s); moerl at %d threads / that = %.2fx" % (
            bs["tokens_per_s"], bt, max_t, m["tokens_per_s"] / bs["tokens_per_s"]))
print()
print("load average after: %s" % load())
print("command: %s" % cmdline)
EOF
