#!/usr/bin/env bash
# run_alloc.sh — the memory pool against glibc malloc and jemalloc (issues 13 and 29, "Memory").
#
# 1. Records allocation traces of real runs with MOERL_ALLOC=pool MOERL_ALLOC_TRACE=bench/traces/NAME.jsonl:
#    demo_rl     `moerl rl --config examples/demo.yaml` — the demo (SFT warm start, fully-async GRPO,
#                validation), whole unless DEMO_ARGS shortens it (e.g. DEMO_ARGS="trainer.total_training_steps=20");
#    smoke_rl    `moerl rl --config examples/smoke.yaml` (SFT warm start, fully-async GRPO, validation);
#    smoke_sft   `moerl sft --config examples/sft.yaml` (60 steps);
#    smoke_sft_dynbatch  the same with packed micro-batches of at most 96 tokens
#                (data.max_token_len_per_micro_batch=96: their count and sizes vary every step);
#    smoke_sft_pp2  `mpirun -np 2 moerl-mpi sft` with actor.pipeline_parallel_size=2 (rank 0 and rank 1).
# 2. Replays them with build/bench/bench_alloc against glibc, the pool and jemalloc: median replay time over
#    21 reps, peak footprint against glibc's, fragmentation at the peak, and (--resident) peak resident
#    memory, the pool's footprint over glibc's peak resident (definitions in bench/bench_alloc.c); then the
#    synthetic dynamic-micro-batch trace, 200 steps without --resident and SYNTH_RES=10 steps with it
#    (touching every page of a 200-step trace takes tens of minutes).
# 3. Step time of the demo (examples/demo.yaml as the demo runs it, fully asynchronous, without the SFT
#    warm start, validation and checkpoints; STEPS trainer steps) under MOERL_ALLOC=malloc|pool|jemalloc,
#    ROUNDS rounds with the allocators interleaved; prints medians over rounds of the median trainer
#    update time per step (metrics timing_s/update), of the run's wall time per step and of its user CPU time
#    per step (/usr/bin/time, the whole run over its steps: less sensitive to other processes than wall
#    time, though not immune: they share the caches), with the ratio against malloc measured in the same
#    rounds, every round's values (the spread shows the noise) and the load average at the start and the
#    end. The allocator is chosen with the config key trainer.allocator. No thresholds: a benchmark, not a
#    test. Run it on a quiet machine: other processes' load moves these times by more than the 2% the
#    issue asks about.
# Usage: bash bench/run_alloc.sh [BUILD_DIR]
#   env: ROUNDS=7 STEPS=30 OMP_NUM_THREADS=1 SYNTH_RES=10 DEMO_ARGS=""; ROUNDS=0 skips step 3,
#        ONLY_STEP_TIME=1 runs step 3 alone.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-7}
STEPS=${STEPS:-30}
SYNTH_RES=${SYNTH_RES:-10}
ONLY_STEP_TIME=${ONLY_STEP_TIME:-0}
read -r -a DEMO_EXTRA <<<"${DEMO_ARGS:-}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
W=$(mktemp -d /tmp/run_alloc.XXXXXX)
unset MOERL_ALLOC MOERL_ALLOC_TRACE
# jemalloc loaded by dlopen needs a larger static TLS surplus (src/base/pool.h); harmless for the others
export GLIBC_TUNABLES=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.rtld.optional_static_tls=65536
if [[ $ONLY_STEP_TIME -eq 0 ]]; then
echo "== 1. traces of real runs (MOERL_ALLOC=pool)"
T=bench/traces
SFT=(--config examples/sft.yaml trainer.total_training_steps=60 trainer.test_freq=30)
MOERL_ALLOC=pool MOERL_ALLOC_TRACE=$T/demo_rl.jsonl "$BUILD/moerl" rl --config examples/demo.yaml \
    trainer.default_local_dir="$W/demo" trainer.resume_mode=disable "${DEMO_EXTRA[@]}" >"$W/demo.log" 2>&1
MOERL_ALLOC=pool MOERL_ALLOC_TRACE=$T/smoke_rl.jsonl "$BUILD/moerl" rl --config examples/smoke.yaml \
    trainer.default_local_dir="$W/rec" trainer.resume_mode=disable >"$W/rec.log" 2>&1
MOERL_ALLOC=pool MOERL_ALLOC_TRACE=$T/smoke_sft.jsonl "$BUILD/moerl" sft "${SFT[@]}" \
    trainer.default_local_dir="$W/sft" >"$W/sft.log" 2>&1
MOERL_ALLOC=pool MOERL_ALLOC_TRACE=$T/smoke_sft_dynbatch.jsonl "$BUILD/moerl" sft "${SFT[@]}" \
    data.max_token_len_per_micro_batch=96 trainer.default_local_dir="$W/dyn" >"$W/dyn.log" 2>&1
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
    MOERL_ALLOC=pool MOERL_ALLOC_TRACE=$T/smoke_sft_pp2.jsonl mpirun --oversubscribe -np 2 "$BUILD/moerl-mpi" sft \
    "${SFT[@]}" actor.pipeline_parallel_size=2 data.max_token_len_per_micro_batch=160 \
    trainer.default_local_dir="$W/pp" >"$W/pp.log" 2>&1
grep -h "memory pool:" "$W"/{demo,rec,sft,dyn,pp}.log
echo "== 2. replay (bench_alloc)"
"$BUILD/bench/bench_alloc" --trace $T/demo_rl.jsonl --trace $T/smoke_rl.jsonl --trace $T/smoke_sft.jsonl \
    --trace $T/smoke_sft_dynbatch.jsonl --trace $T/smoke_sft_pp2.jsonl.rank0 --trace $T/smoke_sft_pp2.jsonl.rank1 \
    --reps 21 --resident
"$BUILD/bench/bench_alloc" --synthetic 200 --reps 21
"$BUILD/bench/bench_alloc" --synthetic "$SYNTH_RES" --reps 3 --resident
fi
if [[ $ROUNDS -eq 0 ]]; then rm -rf "$W"; exit 0; fi
echo "== 3. step time of the demo, $ROUNDS rounds x {malloc, pool, jemalloc}, $STEPS trainer steps each"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
DEMO=(sft.total_training_steps=0 trainer.val_n=0 trainer.test_freq=0 trainer.resume_mode=disable
      trainer.save_freq=0 trainer.total_training_steps=$STEPS)
for r in $(seq 1 "$ROUNDS"); do
    for a in malloc pool jemalloc; do
        /usr/bin/time -f "%U %S" -o "$W/r${r}_$a.cpu" "$BUILD/moerl" rl --config examples/demo.yaml "${DEMO[@]}" \
            trainer.allocator=$a trainer.default_local_dir="$W/r${r}_$a" >"$W/r${r}_$a.log" 2>&1 ||
            { echo "run $a failed"; tail -3 "$W/r${r}_$a.log"; exit 1; }
    done
done
/usr/bin/python3 - "$W" "$ROUNDS" <<'PYEOF'
import json, statistics as st, sys
w, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for a in ["malloc", "pool", "jemalloc"]:
    upd, wall, cpu = [], [], []
    for r in range(1, rounds + 1):
        d = w + "/r%d_%s" % (r, a)
        rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if l.strip()]
        u = [x["timing_s/update"] for x in rows if "timing_s/update" in x]
        upd.append(st.median(u))
        summ = json.loads(open(d + ".log").read().strip().splitlines()[-1] if False else
                          [l for l in open(d + ".log") if l.startswith('{"accuracy_sft"')][-1])
        wall.append(summ["wall_s"] / summ["steps"])
        us = open(d + ".cpu").read().split()[-2:]  # /usr/bin/time: user and system seconds of the whole run
        cpu.append(float(us[0]) / summ["steps"])
    res[a] = (st.median(upd), st.median(wall), st.median(cpu))
    print("%-9s per round: update_ms %s  wall_ms %s  user_cpu_ms %s" % (
        a, " ".join("%.1f" % (1e3 * x) for x in upd), " ".join("%.1f" % (1e3 * x) for x in wall),
        " ".join("%.1f" % (1e3 * x) for x in cpu)))
print("%-9s %16s %10s %16s %10s %16s %10s" % ("allocator", "update_ms/step", "vs malloc", "wall_ms/step", "vs malloc",
                                               "user_cpu_ms/step", "vs malloc"))
m = res["malloc"]
for a, (u, wl, c) in res.items():
    print("%-9s %16.2f %+9.1f%% %16.2f %+9.1f%% %16.2f %+9.1f%%" % (
        a, 1e3 * u, 100 * (u / m[0] - 1), 1e3 * wl, 100 * (wl / m[1] - 1), 1e3 * c, 100 * (c / m[2] - 1)))
PYEOF
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$W"
