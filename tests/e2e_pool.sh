#!/usr/bin/env bash
# End-to-end tests of the allocator switch (src/base/pool.h) on the main job: `moerl rl` on the smoke
# config with MOERL_ALLOC=pool (the pool's statistics at exit and in metrics.jsonl, an allocation trace
# whose allocations are all freed, the trace replays in bench_alloc), with jemalloc when the build has it
# (both documented starts: loaded by moerl under GLIBC_TUNABLES, and LD_PRELOAD), and the same lockstep
# run giving byte-identical checkpoints under malloc, pool and jemalloc, each selected by the config key
# trainer.allocator; MOERL_ALLOC alone still selects it, the key wins over it with a warning;
# trainer.allocator_reserve reaches the pool; moerl sft (and every rank under mpirun) takes the key; bad
# values of the keys, of MOERL_ALLOC and MOERL_POOL_* are refused with a message naming the key or
# variable, and so is jemalloc started without either of its two ways.
# Usage: tests/e2e_pool.sh [BUILD_DIR]. Ends with "N passed, N failed"; non-zero on any failure.
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
MOERL=$BUILD/moerl
[[ -x $MOERL ]] || { bad setup "$MOERL not built"; finish; }
WORK=$W
export OMP_NUM_THREADS=1
unset MOERL_ALLOC MOERL_ALLOC_TRACE MOERL_POOL_MIN_BLOCK MOERL_POOL_MAX_BLOCK MOERL_POOL_CAPACITY MOERL_POOL_RESERVE
LOCK=(sft.total_training_steps=0 trainer.val_n=0 trainer.test_freq=0 trainer.n_threads=1 data.n_test=8
      trainer.resume_mode=disable trainer.save_freq=0 async_training.mode=lockstep trainer.total_training_steps=8
      async_training.staleness_threshold=1.0)
JE_TLS=glibc.rtld.optional_static_tls=65536
run() {  # NAME ALLOC [key=value ...]; ALLOC jemalloc: dlopen'ed by moerl (GLIBC_TUNABLES); jemalloc_preload: LD_PRELOAD
    local name=$1 alloc=$2 pre=()
    shift 2
    case $alloc in
    jemalloc) pre=(GLIBC_TUNABLES=$JE_TLS) ;;
    jemalloc_preload) alloc=jemalloc pre=(LD_PRELOAD=libjemalloc.so.2) ;;
    esac
    env "${pre[@]}" MOERL_ALLOC_TRACE=$WORK/$name.trace.jsonl "$MOERL" rl --config examples/smoke.yaml \
        trainer.allocator=$alloc trainer.default_local_dir="$WORK/$name" "$@" >"$WORK/$name.log" 2>&1
}
allocs=(malloc pool)
if [[ -f /usr/include/jemalloc/jemalloc.h ]]; then  # the Makefile's detection
    allocs+=(jemalloc jemalloc_preload)
else
    echo "note: this build has no jemalloc: skipping MOERL_ALLOC=jemalloc"
fi
for a in "${allocs[@]}"; do
    if run "lock_$a" "$a" "${LOCK[@]}"; then ok "trainer.allocator=$a: lockstep smoke run"
    else bad "trainer.allocator=$a run" "exit $?"; tail -5 "$WORK/lock_$a.log"; fi
done
for a in "${allocs[@]:1}"; do
    if cmp -s "$WORK/lock_malloc/checkpoint/model.safetensors" "$WORK/lock_$a/checkpoint/model.safetensors"; then
        ok "trainer.allocator=$a: checkpoint identical to malloc's"
    else bad "trainer.allocator=$a checkpoint" "differs from malloc's (or missing)"; fi
done
# the environment variable alone still selects the allocator (measurements); the key, when given, wins over
# it with a warning naming both
if MOERL_ALLOC=pool "$MOERL" rl --config examples/smoke.yaml "${LOCK[@]}" trainer.default_local_dir="$WORK/env_pool" \
    >"$WORK/env_pool.log" 2>&1 && grep -q "moerl: memory pool: reserved" "$WORK/env_pool.log" &&
    cmp -s "$WORK/lock_malloc/checkpoint/model.safetensors" "$WORK/env_pool/checkpoint/model.safetensors"; then
    ok "MOERL_ALLOC=pool without the key: the pool runs, same checkpoint"
else bad "MOERL_ALLOC=pool alone" "$(tail -3 "$WORK/env_pool.log")"; fi
if MOERL_ALLOC=pool "$MOERL" rl --config examples/smoke.yaml "${LOCK[@]}" trainer.allocator=malloc \
    trainer.default_local_dir="$WORK/key_wins" >"$WORK/key_wins.log" 2>&1 &&
    grep -qF "trainer.allocator=malloc overrides the environment's MOERL_ALLOC=pool" "$WORK/key_wins.log" &&
    ! grep -q "moerl: memory pool:" "$WORK/key_wins.log"; then
    ok "trainer.allocator=malloc wins over MOERL_ALLOC=pool, with a warning"
else bad "key over env" "$(tail -3 "$WORK/key_wins.log")"; fi
# trainer.allocator_reserve reaches the pool: reserve 0 decommits every freed page, the default 0.3 keeps some
if "$MOERL" rl --config examples/smoke.yaml "${LOCK[@]}" trainer.allocator=pool trainer.allocator_reserve=0 \
    trainer.default_local_dir="$WORK/res0" >"$WORK/res0.log" 2>&1 &&
    c0=$(grep -oE "moerl: memory pool: reserved [0-9]+ MiB, committed [0-9.]+ MiB" "$WORK/res0.log" | grep -oE "[0-9.]+ MiB$") &&
    c3=$(grep -oE "moerl: memory pool: reserved [0-9]+ MiB, committed [0-9.]+ MiB" "$WORK/lock_pool.log" | grep -oE "[0-9.]+ MiB$") &&
    [[ ${c0% MiB} == 0.0 ]] && awk -v c="${c3% MiB}" 'BEGIN { exit !(c > 0) }'; then
    ok "trainer.allocator_reserve=0: nothing left committed at exit (${c0}; reserve 0.3: ${c3})"
else bad "trainer.allocator_reserve=0" "committed at exit '${c0:-?}' (0.3: '${c3:-?}')"; tail -3 "$WORK/res0.log"; fi
# moerl sft takes the key too: the pool serves its buffers, the checkpoint matches malloc's
SFTK=(--config examples/sft.yaml trainer.total_training_steps=6 trainer.test_freq=0 trainer.val_n=8 data.n_test=8
      trainer.n_threads=1)
for a in malloc pool; do
    "$MOERL" sft "${SFTK[@]}" trainer.allocator=$a trainer.default_local_dir="$WORK/sft_$a" >"$WORK/sft_$a.log" 2>&1 ||
        bad "sft trainer.allocator=$a" "$(tail -3 "$WORK/sft_$a.log")"
done
if grep -q "moerl: memory pool: reserved" "$WORK/sft_pool.log" && ! grep -q "moerl: memory pool:" "$WORK/sft_malloc.log" &&
    cmp -s "$WORK/sft_malloc/checkpoint/model.safetensors" "$WORK/sft_pool/checkpoint/model.safetensors"; then
    ok "moerl sft trainer.allocator=pool: the pool serves it, checkpoint identical to malloc's"
else bad "sft with trainer.allocator" "pool line / checkpoint"; fi
# under mpirun every rank applies the key (each rank prints its pool's line at exit)
if [[ -x $BUILD/moerl-mpi ]] && command -v mpirun >/dev/null; then
    if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
        mpirun --oversubscribe -np 2 "$BUILD/moerl-mpi" sft "${SFTK[@]}" trainer.allocator=pool \
        trainer.default_local_dir="$WORK/sft_mpi" >"$WORK/sft_mpi.log" 2>&1 &&
        [[ $(grep -c "moerl: memory pool: reserved" "$WORK/sft_mpi.log") -eq 2 ]]; then
        ok "mpirun -np 2 moerl-mpi sft trainer.allocator=pool: both ranks use the pool"
    else bad "mpirun with trainer.allocator=pool" "$(tail -3 "$WORK/sft_mpi.log")"; fi
fi
# the pool's statistics: printed at exit, and in every metrics record
if grep -qE "moerl: memory pool: reserved [0-9]+ MiB, .*fragmentation [0-9.]+, [1-9][0-9]* allocations, [0-9]+ frees, 0 failures" "$WORK/lock_pool.log"; then
    ok "pool statistics printed at exit"
else bad "pool statistics at exit" "line missing"; tail -3 "$WORK/lock_pool.log"; fi
if msg=$($PY - "$WORK" <<'PYEOF'
import json, sys
w = sys.argv[1]
rows = [json.loads(l) for l in open(w + "/lock_pool/metrics.jsonl") if l.strip()]
keys = ["memory/pool_reserved_bytes", "memory/pool_committed_bytes", "memory/pool_in_use_bytes",
        "memory/pool_peak_bytes", "memory/pool_fragmentation"]
def val(r, k):
    return r.get(k, r.get("metrics", {}).get(k) if isinstance(r.get("metrics"), dict) else None)
steps = [r for r in rows if val(r, "actor/pg_loss") is not None]
if not steps: print("no step records"); sys.exit(1)
for r in steps:
    v = [val(r, k) for k in keys]
    if any(x is None for x in v): print("record lacks", [k for k, x in zip(keys, v) if x is None]); sys.exit(1)
    res, com, use, peak, frag = v
    if not (res > 0 and 0 < use <= peak and use <= com <= res and 0 <= frag <= 1):
        print("inconsistent", v); sys.exit(1)
for r in [json.loads(l) for l in open(w + "/lock_malloc/metrics.jsonl") if l.strip()]:
    if val(r, "memory/pool_reserved_bytes") is not None: print("malloc run reports pool metrics"); sys.exit(1)
# the trace: header, every allocation freed by exit, ids unique
lines = [json.loads(l) for l in open(w + "/lock_pool.trace.jsonl")]
if lines[0].get("moerl_alloc_trace") != 1 or lines[0].get("allocator") != "pool": print("bad header", lines[0]); sys.exit(1)
a = {r["id"]: r for r in lines[1:] if r["op"] == "alloc"}
f = [r["id"] for r in lines[1:] if r["op"] == "free"]
tags = {r["tag"] for r in a.values()}
if len(a) < 3 or sorted(f) != sorted(a) or not {"model_acts", "kv_cache"} <= tags:
    print("trace: %d allocs, %d frees, tags %s" % (len(a), len(f), tags)); sys.exit(1)
PYEOF
); then ok "pool metrics in metrics.jsonl (malloc run has none); trace complete"
else bad "pool metrics / trace" "$msg"; fi
# the issue's fragmentation (1 − requested / committed at the peak) on the real run, from the exit line
if lost=$(grep -oE "at the peak [0-9.]+ of [0-9.]+ committed: [0-9.]+% lost" "$WORK/lock_pool.log" | grep -oE "[0-9.]+%" | tr -d %) &&
    [[ -n $lost ]] && awk -v l="$lost" 'BEGIN { exit !(l <= 3.0) }'; then
    ok "pool: ${lost}% lost at the peak on the smoke run (≤ 3%)"
else bad "pool fragmentation at the peak" "'${lost:-line missing}' (want ≤ 3%)"; fi
if [[ -x $BUILD/bench/bench_alloc ]]; then
    if "$BUILD/bench/bench_alloc" --trace "$WORK/lock_pool.trace.jsonl" --reps 3 >"$WORK/replay.log" 2>&1 &&
        grep -q "^  pool " "$WORK/replay.log" && grep -q "^  glibc " "$WORK/replay.log"; then
        ok "bench_alloc replays the recorded trace"
    else bad "bench_alloc replay" "$(tail -3 "$WORK/replay.log")"; fi
    # memory figures are exact (no timing): the pool's footprint at most glibc's, ≤ 3% lost at the peak,
    # on the recorded trace and on the synthetic dynamic-micro-batch one; the synthetic trace written to
    # a file replays to the same figures
    if "$BUILD/bench/bench_alloc" --trace "$WORK/lock_pool.trace.jsonl" --synthetic 40 --reps 1 \
        --write-synthetic "$WORK/synth.jsonl" --json "$WORK/mem.json" >"$WORK/mem.log" 2>&1 &&
        "$BUILD/bench/bench_alloc" --trace "$WORK/synth.jsonl" --reps 1 --json "$WORK/mem2.json" >>"$WORK/mem.log" 2>&1 &&
        msg=$($PY - "$WORK" <<'PYEOF'
import json, sys
w = sys.argv[1]
runs = json.load(open(w + "/mem.json")) + json.load(open(w + "/mem2.json"))
for r in runs:
    p, g = r["pool"], r["glibc"]
    if p["failures"] or p["fragmentation_at_peak"] > 0.03 or p["peak_footprint_bytes"] > g["peak_footprint_bytes"]:
        print("%s: pool %.0f bytes (%.4f lost at the peak), glibc %.0f" % (r["trace"], p["peak_footprint_bytes"],
              p["fragmentation_at_peak"], g["peak_footprint_bytes"])); sys.exit(1)
a, b = runs[1]["pool"], runs[2]["pool"]
if (a["peak_footprint_bytes"], a["peak_requested_bytes"]) != (b["peak_footprint_bytes"], b["peak_requested_bytes"]):
    print("the written synthetic trace replays differently"); sys.exit(1)
PYEOF
); then ok "bench_alloc: pool footprint ≤ glibc's and ≤ 3% lost at the peak (recorded and synthetic traces)"
    else bad "bench_alloc memory figures" "${msg:-$(tail -3 "$WORK/mem.log")}"; fi
    # --resident: every allocator reports its peak resident memory and the footprint / glibc-resident ratio
    # (present and positive; no threshold on resident memory, which depends on the machine)
    if "$BUILD/bench/bench_alloc" --trace "$WORK/lock_pool.trace.jsonl" --synthetic 2 --reps 1 --resident \
        --json "$WORK/res.json" >"$WORK/res.log" 2>&1 &&
        msg=$($PY - "$WORK/res.json" <<'PYEOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    for a in ("glibc", "pool", "jemalloc"):
        if a not in r: continue
        x = r[a]
        if not x.get("peak_resident_bytes", 0) > 0 or not x.get("footprint_over_glibc_resident", 0) > 0:
            print("%s %s: %s" % (r["trace"], a, x)); sys.exit(1)
PYEOF
); then ok "bench_alloc --resident reports peak resident memory for every allocator"
    else bad "bench_alloc --resident" "${msg:-$(tail -3 "$WORK/res.log")}"; fi
fi
# bad values: refused, named
expect_bad() {  # NAME PATTERN {VAR=VALUE | -u VAR | key=value}...: the environment's first, then the keys
    local name=$1 pat=$2 envs=() keys=()
    shift 2
    while (($#)); do
        case $1 in
        -u) envs+=("$1" "$2"); shift ;;
        [A-Z]*=*) envs+=("$1") ;;
        *) keys+=("$1") ;;
        esac
        shift
    done
    env "${envs[@]}" "$MOERL" rl --config examples/smoke.yaml "${LOCK[@]}" trainer.default_local_dir="$WORK/$name" \
        "${keys[@]}" >"$WORK/$name.log" 2>&1
    local rc=$?
    if [[ $rc -ne 0 && $rc -lt 128 ]] && grep -qF -- "$pat" "$WORK/$name.log"; then ok "bad $name refused: exit $rc"
    else bad "bad $name" "exit $rc, output lacks '$pat'"; tail -3 "$WORK/$name.log"; fi
}
expect_bad alloc "MOERL_ALLOC='bogus'" MOERL_ALLOC=bogus
expect_bad key "trainer.allocator: 'bogus' (override) is not malloc, pool or jemalloc" trainer.allocator=bogus
expect_bad key_reserve "trainer.allocator_reserve: 1.5 (override) is not a fraction in [0, 1]" \
    trainer.allocator=pool trainer.allocator_reserve=1.5
expect_bad reserve_not_pool "trainer.allocator_reserve=0.5 applies to the pool only, but the buffer allocator is malloc" \
    trainer.allocator_reserve=0.5
expect_bad min_block "MOERL_POOL_MIN_BLOCK" MOERL_ALLOC=pool MOERL_POOL_MIN_BLOCK=4X
expect_bad max_block "max_block must be a power of two" MOERL_ALLOC=pool MOERL_POOL_MAX_BLOCK=3M
expect_bad reserve "MOERL_POOL_RESERVE" MOERL_ALLOC=pool MOERL_POOL_RESERVE=2
if [[ " ${allocs[*]} " == *" jemalloc "* ]]; then  # no re-exec: started without either way, a clear refusal
    expect_bad jemalloc_tls "start the process with LD_PRELOAD=libjemalloc.so.2" -u LD_PRELOAD -u GLIBC_TUNABLES \
        MOERL_ALLOC=jemalloc
fi
# a pool too small for the run: refusals fall back to malloc, the run completes and counts them
if MOERL_ALLOC=pool MOERL_POOL_MIN_BLOCK=64K MOERL_POOL_MAX_BLOCK=1M MOERL_POOL_CAPACITY=2M "$MOERL" rl \
    --config examples/smoke.yaml "${LOCK[@]}" trainer.default_local_dir="$WORK/tiny" >"$WORK/tiny.log" 2>&1 &&
    grep -q "serving it (and any later refusal) with malloc" "$WORK/tiny.log" &&
    grep -qE "[1-9][0-9]* fallbacks" "$WORK/tiny.log" &&
    cmp -s "$WORK/lock_malloc/checkpoint/model.safetensors" "$WORK/tiny/checkpoint/model.safetensors"; then
    ok "exhausted / oversize pool: malloc fallback, counted, same checkpoint"
else bad "pool fallback" "$(tail -3 "$WORK/tiny.log")"; fi
finish
