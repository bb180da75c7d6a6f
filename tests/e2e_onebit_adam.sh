#!/usr/bin/env bash
# actor.optim.name=onebit_adam end to end (1-bit Adam, docs/parallelism.md "1-bit Adam"):
#   warm-up    with freeze_step ≥ the run's optimizer steps it is exact AdamW: the checkpoint equals
#              actor.optim.name=adamw's bit for bit (model and moments)
#   compressed past the freeze the run trains, the momentum is exchanged at 1 bit per value
#              (perf/grad_compression_ratio > 20 on 2 trainer ranks) and the trainer ranks stay identical
#   resume     a run stopped after the freeze (its checkpoint holds onebit_adam.safetensors) and resumed
#              equals the uninterrupted run bit for bit: samples.jsonl, model, moments and error buffers —
#              in one process and under mpirun with 2 trainer ranks
#   exchange   test_dist_onebit under mpirun -np 2, 3, 4: the MPI exchange = the in-process simulation
#   variance   actor.optim.var_update_interval=2: exact steps interleaved after the freeze (the compression
#              ratio per trainer step ~2), resumed exactly across an exact step
#   refusals   FSDP / EP / pipeline layouts, freeze_step 0, var_update_interval < 0 or without onebit_adam, grad_compression together with it, an unknown
#              name, a checkpoint resumed on another number of trainer ranks: each named
# Usage: tests/e2e_onebit_adam.sh [BUILD_DIR]; ends with "N passed, N failed", non-zero on failure.
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
MOERL=$BUILD/moerl
MOERL_MPI=$BUILD/moerl-mpi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
COMMON=(sft.total_training_steps=0 trainer.val_n=0 trainer.test_freq=0 trainer.n_threads=1 data.n_test=8
        async_training.staleness_threshold=0 async_training.partial_rollout=false
        async_training.trigger_parameter_sync_step=1 actor.optim.lr=1e-3 actor.entropy_coeff=0.01
        actor.ppo_mini_batch_size=3 async_training.require_batches=2 trainer.save_freq=2)
OB=(actor.optim.name=onebit_adam actor.optim.freeze_step=4) # 2 optimizer steps per trainer step: frozen from step 3
# one NAME [key=value ...]: one process, lockstep (reproducible); timeout 300 s is a hang guard
one() {
    local name=$1
    shift
    timeout 300 "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" async_training.mode=lockstep \
        trainer.default_local_dir="$W/$name" "$@" >"$W/$name.json" 2>"$W/$name.log"
}
# mpi NAME NP T [key=value ...]
mpi() {
    local name=$1 np=$2 t=$3
    shift 3
    timeout 300 mpirun --oversubscribe -np "$np" "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
        trainer.default_local_dir="$W/$name" trainer.n_ranks="$t" "$@" >"$W/$name.json" 2>"$W/$name.log"
}
# full_and_resumed FULL RES [key=value ...]: under mpirun (1 rollout + 2 trainer ranks) FULL runs 6 trainer
# steps; RES stops at 4 and resumes to 6
full_and_resumed() {
    local full=$1 res=$2
    shift 2
    mpi "$full" 3 2 trainer.total_training_steps=6 "$@" &&
        mpi "$res" 3 2 trainer.total_training_steps=4 trainer.resume_mode=disable "$@" &&
        mpi "$res" 3 2 trainer.total_training_steps=6 trainer.resume_mode=auto "$@" && grep -q "resumed from" "$W/$res.log"
}
# resumed_same FULL RES WHAT: the resumed run equals the uninterrupted one bit for bit (samples, model,
# moments, error buffers)
resumed_same() {
    local msg
    if ! cmp -s "$W/$1/samples.jsonl" "$W/$2/samples.jsonl"; then bad "$3" "samples.jsonl differ from the uninterrupted run"
    elif msg=$(same_ckpt "$1" "$2" onebit_adam.safetensors); then ok "$3 = uninterrupted bit for bit"
    else bad "$3" "$msg"; fi
}
tail_log() { tail -6 "$W/$1.log" | sed 's/^/    | /'; }
# same_ckpt A B: the two runs' checkpoints hold the same files, byte for byte (trainer_state.json aside)
same_ckpt() {
    local f
    for f in model.safetensors optimizer.safetensors ${3:-}; do
        cmp -s "$W/$1/checkpoint/$f" "$W/$2/checkpoint/$f" || { echo "checkpoint/$f differs"; return 1; }
    done
}

# ---- warm-up: exact AdamW
if one adamw trainer.total_training_steps=2 && one ob_warm trainer.total_training_steps=2 "${OB[@]}"; then
    if msg=$(same_ckpt adamw ob_warm); then
        ok "onebit_adam before freeze_step = adamw bit for bit (4 optimizer steps, freeze_step 4)"
    else bad "onebit_adam warm-up" "$msg"; fi
else bad "onebit_adam warm-up" "exit $?"; tail_log ob_warm; fi

# ---- one process: trains past the freeze, and resumes exactly
if one ob_full trainer.total_training_steps=6 "${OB[@]}" &&
    one ob_res trainer.total_training_steps=4 "${OB[@]}" &&
    one ob_res trainer.total_training_steps=6 trainer.resume_mode=auto "${OB[@]}" && grep -q "resumed from" "$W/ob_res.log"; then
    if [[ ! -s $W/ob_full/checkpoint/onebit_adam.safetensors ]]; then bad "1-bit Adam checkpoint" "no onebit_adam.safetensors"
    elif ! cmp -s "$W/ob_full/samples.jsonl" "$W/ob_res/samples.jsonl"; then bad "1-bit Adam resume (one process)" "samples.jsonl differ"
    elif msg=$(same_ckpt ob_full ob_res onebit_adam.safetensors); then
        ok "1-bit Adam, one process: stopped at step 4 (past the freeze), resumed to 6 = uninterrupted bit for bit"
    else bad "1-bit Adam resume (one process)" "$msg"; fi
    # the optimizer is recorded in trainer_state.json: resuming with another one is refused, the folder untouched
    cfg_before=$(md5sum < "$W/ob_full/config.yaml")
    expect_err "a 1-bit Adam checkpoint resumed with adamw refused" "written with actor.optim.name=onebit_adam actor.optim.freeze_step=4" \
        "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" async_training.mode=lockstep trainer.default_local_dir="$W/ob_full" \
        trainer.total_training_steps=8 trainer.resume_mode=auto
    expect_err "a 1-bit Adam checkpoint resumed with another freeze_step refused" "this run has actor.optim.name=onebit_adam actor.optim.freeze_step=9" \
        "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" async_training.mode=lockstep trainer.default_local_dir="$W/ob_full" \
        trainer.total_training_steps=8 trainer.resume_mode=auto actor.optim.name=onebit_adam actor.optim.freeze_step=9
    expect_err "a 1-bit Adam checkpoint resumed with another var_update_interval refused" \
        "this run has actor.optim.name=onebit_adam actor.optim.freeze_step=4 actor.optim.var_update_interval=3" \
        "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" async_training.mode=lockstep trainer.default_local_dir="$W/ob_full" \
        trainer.total_training_steps=8 trainer.resume_mode=auto "${OB[@]}" actor.optim.var_update_interval=3
    check "the refused resumes left config.yaml as it was" test "$cfg_before" = "$(md5sum < "$W/ob_full/config.yaml")"
    if one adamw6 trainer.total_training_steps=6 && ! cmp -s "$W/adamw6/checkpoint/model.safetensors" \
        "$W/ob_full/checkpoint/model.safetensors"; then ok "past the freeze the update differs from AdamW's"
    else bad "1-bit Adam past the freeze" "the model equals AdamW's (compression not applied?)"; fi
else bad "1-bit Adam resume (one process)" "exit $? or no 'resumed from'"; tail_log ob_res; fi

# ---- refusals (before any model is built)
expect_err "onebit_adam with FSDP refused" "actor.fsdp_config.fsdp_size=2" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.n_ranks=2 actor.fsdp_config.fsdp_size=2 "${OB[@]}" \
    trainer.default_local_dir="$W/r1"
expect_err "onebit_adam with EP refused" "actor.expert_parallel_size=2" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.n_ranks=2 actor.expert_parallel_size=2 "${OB[@]}" \
    trainer.default_local_dir="$W/r2"
expect_err "freeze_step 0 refused" "actor.optim.freeze_step=0" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" actor.optim.name=onebit_adam actor.optim.freeze_step=0 \
    trainer.default_local_dir="$W/r3"
expect_err "freeze_step without onebit_adam refused" "it applies to onebit_adam only" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" actor.optim.freeze_step=3 trainer.default_local_dir="$W/r3b"
expect_err "var_update_interval without onebit_adam refused" "actor.optim.var_update_interval is set but actor.optim.name=adamw" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" actor.optim.var_update_interval=2 trainer.default_local_dir="$W/r3c"
expect_err "a negative var_update_interval refused" "actor.optim.var_update_interval=-1" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" "${OB[@]}" actor.optim.var_update_interval=-1 \
    trainer.default_local_dir="$W/r3d"
expect_err "onebit_adam with grad_compression refused" "actor.grad_compression=none" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" "${OB[@]}" actor.grad_compression=onebit \
    trainer.default_local_dir="$W/r4"
expect_err "unknown optimizer refused" "expected adamw or onebit_adam" \
    "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" actor.optim.name=lamb trainer.default_local_dir="$W/r5"

# ---- mpirun: 1 rollout rank + 2 data-parallel trainer ranks
if [[ ${MOERL_NO_MPI:-0} == 1 || ${NO_MPI:-0} == 1 ]]; then
    echo "e2e_onebit_adam: mpirun cases skipped: MOERL_NO_MPI=1 / NO_MPI=1"
elif ! command -v mpirun >/dev/null 2>&1 || [[ ! -x $MOERL_MPI ]]; then
    bad "mpirun cases" "mpirun or $MOERL_MPI missing (set MOERL_NO_MPI=1 to skip)"
else
    for np in 2 3 4; do # the exchange over MPI = the simulation checked against the PyTorch reference
        if out=$(timeout 120 mpirun --oversubscribe -np "$np" "$BUILD/mpi/tests/test_dist_onebit" 2>&1) &&
            grep -q " 0 failed" <<<"$out"; then ok "test_dist_onebit -np $np: $(tail -1 <<<"$out")"
        else bad "test_dist_onebit -np $np" "$(tail -4 <<<"$out")"; fi
    done
    if full_and_resumed mp_full mp_res "${OB[@]}"; then
        ratio=$(grep -o '"perf/grad_compression_ratio": *[0-9.e+]*' "$W/mp_full/metrics.jsonl" | tail -1 | sed 's/.*: *//')
        if $PY -c "import sys; sys.exit(0 if float('${ratio:-0}') > 20 else 1)"; then
            ok "2 trainer ranks: the momentum exchange sends ${ratio}× less than an fp32 all-reduce"
        else bad "1-bit Adam volume" "perf/grad_compression_ratio ${ratio:-missing}, expected > 20"; fi
        resumed_same mp_full mp_res "1-bit Adam, 2 trainer ranks: stopped at step 4, resumed to 6"
        cfg_before=$(md5sum < "$W/mp_res/config.yaml")
        expect_err "a 2-rank checkpoint resumed on 1 trainer rank refused" "trainer.n_ranks is 1" \
            timeout 300 mpirun --oversubscribe -np 2 "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
            trainer.default_local_dir="$W/mp_res" trainer.n_ranks=1 trainer.total_training_steps=8 \
            trainer.resume_mode=auto "${OB[@]}"
        check "the refused resume left the run's config.yaml as it was" test "$cfg_before" = "$(md5sum < "$W/mp_res/config.yaml")"
    else bad "1-bit Adam under mpirun" "exit $? or no 'resumed from'"; tail_log mp_full; tail_log mp_res; fi
    # variance updates: freeze 4, interval 2 -> optimizer steps 6, 8, 10, 12 exact (v moves), 5, 7, 9, 11
    # compressed: each trainer step from 3 on holds one of each (ratio ~2 instead of ~32); stopped at trainer
    # step 4 (= optimizer step 8, an exact one: the saved error buffers are the ones before the restart)
    VU=(actor.optim.var_update_interval=2)
    if full_and_resumed mv_full mv_res "${OB[@]}" "${VU[@]}"; then
        ratios=$(grep -o '"perf/grad_compression_ratio": *[0-9.e+]*' "$W/mv_full/metrics.jsonl" | sed 's/.*: *//' | tr '\n' ' ')
        if $PY -c "import sys; r=[float(x) for x in '$ratios'.split()]; sys.exit(0 if len(r)==6 and r[:2]==[1.0,1.0] and all(1.5<x<2.5 for x in r[2:]) else 1)"; then
            ok "var_update_interval=2: every other optimizer step after the freeze exact (ratio per trainer step: $ratios)"
        else bad "var_update_interval=2" "perf/grad_compression_ratio per trainer step: $ratios (expected 1 1 then ~2)"; fi
        resumed_same mv_full mv_res "var_update_interval=2, 2 trainer ranks: stopped at an exact step, resumed"
        if ! cmp -s "$W/mv_full/checkpoint/model.safetensors" "$W/mp_full/checkpoint/model.safetensors"; then
            ok "var_update_interval=2 changes the trajectory (the exact steps run)"
        else bad "var_update_interval=2" "the model equals the run without it"; fi
    else bad "var_update_interval under mpirun" "exit $? or no 'resumed from'"; tail_log mv_full; tail_log mv_res; fi
fi
finish
