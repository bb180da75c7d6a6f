#!/usr/bin/env bash
# End-to-end: the rollout-correction metrics and rejection sampling in `moerl rl` (docs/rl.md,
# "Rollout correction"). Toy scale (examples/smoke.yaml, no warm start, no held-out eval); the engine
# runs in bf16 (rollout.dtype=bf16), so its behaviour logprobs really differ from the trainer's fp32 ones.
#   metrics    bypass_mode=false with rollout_rs=token_k1,seq_mean_k1 and rollout_is=token: every
#              version record has training/rollout_probs_diff_max/_mean/_std,
#              training/rollout_actor_probs_pearson_corr (diff > 0, correlation in (0.9, 1]), verl's
#              off-policy diagnostics (rollout_corr/kl, k3_kl, ppl, log_ppl_diff, ppl_ratio, chi2) and all
#              of verl's rollout_corr/rollout_rs_* names (15 per k1 option + 2), some tokens rejected
#              and not all; the default bypass mode reports no mismatch metrics (none computed)
#   errors     an unknown option, a threshold k2 cannot take, options without a threshold, and
#              rollout_rs in bypass mode: exit 1 naming the key and the value
#   ranks      under mpirun (skipped with MOERL_NO_MPI=1): data parallel 2, Ulysses SP 2 and pipeline 2
#              against one trainer rank on the same batches (sync schedule, staleness 0): identical
#              samples, version 1's rejected shares identical and its other rollout_rs and mismatch metrics
#              within 2e-6 + 1e-4 relative: the weights are the same and the recomputed logprobs differ only
#              by fp32 summation order (observed ≤ 5e-7 per logprob), and every such metric is a mean, max,
#              min or spread of logprob differences or of probability differences (p ≤ 1), so it moves
#              by about twice that (observed 4.8e-7 on token_k1_min); a token counted twice or on one
#              rank only changes the shares and means by O(1/tokens)
# Usage: tests/e2e_rollout_corr.sh [BUILD_DIR]; ends with "N passed, N failed", non-zero on failure.
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
MOERL=$BUILD/moerl
WORK=$W
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
COMMON=(sft.total_training_steps=0 trainer.val_n=0 trainer.test_freq=0 trainer.n_threads=1 data.n_test=8
        trainer.resume_mode=disable trainer.save_freq=-1 rollout.dtype=bf16)
RS=(algorithm.rollout_correction.bypass_mode=false algorithm.rollout_correction.rollout_is=token
    algorithm.rollout_correction.rollout_rs=token_k1,seq_mean_k1
    algorithm.rollout_correction.rollout_rs_threshold=0.99_1.01,0.999_1.001)
run_rl() { # run_rl NAME [key=value ...]: output folder $WORK/NAME, log $WORK/NAME.log
    local name=$1
    shift
    timeout 120 "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$WORK/$name" "$@" \
        >"$WORK/$name.json" 2>"$WORK/$name.log"
}
tail_log() { tail -8 "$WORK/$1.log" | sed 's/^/    | /'; }

CHECK=$WORK/check.py
cat >"$CHECK" <<'EOF'
import json, math, sys

def versions(d):
    with open(d + "/metrics.jsonl") as f:
        return [r for r in (json.loads(l) for l in f if l.strip()) if "fully_async/count/current_param_version" in r]

MM = ["training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std",
      "training/rollout_actor_probs_pearson_corr"] + ["rollout_corr/" + k for k in (
      "kl", "k3_kl", "training_ppl", "training_log_ppl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
      "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq")]
STATS = ["mean", "max", "min", "std", "fraction_high", "fraction_low", "seq_mean", "seq_std", "seq_max", "seq_min",
         "seq_max_deviation", "seq_fraction_high", "seq_fraction_low", "masked_fraction", "seq_masked_fraction"]
RS_KEYS = ["rollout_corr/rollout_rs_%s_%s" % (o, s) for o in ("token_k1", "seq_mean_k1") for s in STATS] + \
          ["rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_seq_masked_fraction"]
cmd, d = sys.argv[1], sys.argv[2]
v = versions(d)
if not v:
    print("no version record"); sys.exit(1)
if cmd == "metrics":
    rej = []
    for i, r in enumerate(v):
        miss = [k for k in MM + RS_KEYS if k not in r or r[k] is None]
        if miss:
            print("version record %d lacks %s" % (i, miss[:4])); sys.exit(1)
        if not (r[MM[0]] > 0 and 0.9 < r[MM[3]] <= 1.0):
            print("record %d: diff max %s, correlation %s" % (i, r[MM[0]], r[MM[3]])); sys.exit(1)
        rej.append(r["rollout_corr/rollout_rs_masked_fraction"])
    if not (0 < sum(rej) / len(rej) < 1):
        print("rejected shares %s: the run must reject some tokens and keep some" % rej); sys.exit(1)
    print("%d records, mean rejected share %.3f, diff max %.3g, correlation %.6f"
          % (len(v), sum(rej) / len(rej), v[0][MM[0]], v[0][MM[3]]))
elif cmd == "none":
    found = [k for r in v for k in r if k in MM or k.startswith("rollout_corr/rollout_rs")]
    if found:
        print("bypass mode reported %s" % found[:3]); sys.exit(1)
    print("no mismatch or rejection metrics in %d records" % len(v))
elif cmd == "same_v1":
    w = versions(sys.argv[3])[0]
    r = v[0]
    for k in MM + RS_KEYS:
        exact = k.endswith("masked_fraction")
        a, b = r[k], w[k]
        if (a != b) if exact else abs(a - b) > 2e-6 + 1e-4 * abs(b):
            print("version 1 %s: %r vs %r" % (k, a, b)); sys.exit(1)
    print("version 1: rejected share %.4f, diff mean %.4g" % (r["rollout_corr/rollout_rs_masked_fraction"], r[MM[1]]))
EOF
check_py() { /usr/bin/python3 "$CHECK" "$@"; }

if [[ ! -x $MOERL ]]; then
    bad "setup" "$MOERL not built"
    finish
fi

# ---------------------------------------------------------------- metrics
if run_rl rs "${RS[@]}"; then
    if msg=$(check_py metrics "$WORK/rs"); then ok "rollout_rs + rollout_is, bf16 engine: $msg"
    else bad "metrics" "$msg"; fi
else bad "rollout_rs run" "exit $?"; tail_log rs; fi
if run_rl bypass; then
    if msg=$(check_py none "$WORK/bypass"); then ok "bypass mode: $msg"; else bad "bypass mode" "$msg"; fi
else bad "bypass run" "exit $?"; tail_log bypass; fi

# ---------------------------------------------------------------- errors
K=algorithm.rollout_correction
expect_err "unknown option" "rollout_rs='token_k4'" "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/e1" $K.bypass_mode=false $K.rollout_rs=token_k4 $K.rollout_rs_threshold=2
expect_err "k2 range" "rollout_rs_threshold='0.1_0.2'" "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/e2" $K.bypass_mode=false $K.rollout_rs=seq_max_k2 $K.rollout_rs_threshold=0.1_0.2
expect_err "no threshold" "rollout_rs_threshold is null" "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/e3" $K.bypass_mode=false $K.rollout_rs=token_k1
expect_err "bypass" "bypass_mode=false" "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/e4" $K.rollout_rs=token_k1 $K.rollout_rs_threshold=0.5_2.0

# ---------------------------------------------------------------- trainer ranks
if [[ ${MOERL_NO_MPI:-0} == 1 || ${NO_MPI:-0} == 1 ]]; then
    echo "ranks: skipped (MOERL_NO_MPI=1 / NO_MPI=1)"
elif ! command -v mpirun >/dev/null 2>&1 || [[ ! -x $BUILD/moerl-mpi ]]; then
    bad "ranks" "mpirun or $BUILD/moerl-mpi missing (scripts/setup.sh installs MPI; MOERL_NO_MPI=1 skips)"
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    MP=(async_training.staleness_threshold=0 async_training.partial_rollout=false
        async_training.trigger_parameter_sync_step=1 trainer.total_training_steps=3 actor.optim.lr=1e-3
        actor.ppo_mini_batch_size=3 async_training.require_batches=2)
    mpi_rl() { # mpi_rl NAME NP T [key=value ...]
        local name=$1 np=$2 t=$3
        shift 3
        timeout 120 mpirun --oversubscribe -np "$np" "$BUILD/moerl-mpi" rl --config examples/smoke.yaml "${COMMON[@]}" \
            trainer.default_local_dir="$WORK/$name" trainer.n_ranks="$t" "${MP[@]}" "${RS[@]}" "$@" \
            >"$WORK/$name.json" 2>"$WORK/$name.log"
    }
    if mpi_rl r_dp1 2 1; then
        for c in "r_dp2 3 2" "r_sp2 3 2 actor.ulysses_sequence_parallel_size=2" "r_pp2 3 2 actor.pipeline_parallel_size=2"; do
            read -r -a a <<<"$c"
            if mpi_rl "${a[@]}"; then
                if ! cmp -s "$WORK/${a[0]}/samples.jsonl" "$WORK/r_dp1/samples.jsonl"; then
                    bad "${a[0]}" "samples.jsonl differ from one trainer rank's"
                elif msg=$(check_py same_v1 "$WORK/${a[0]}" "$WORK/r_dp1"); then ok "${a[*]:3}${a[3]:+ }${a[0]} = one rank: $msg"
                else bad "${a[0]}" "$msg"; fi
            else bad "${a[0]}" "exit $?"; tail_log "${a[0]}"; fi
        done
    else bad "one trainer rank under mpirun" "exit $?"; tail_log r_dp1; fi
fi
finish
