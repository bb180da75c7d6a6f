#!/usr/bin/env bash
# Compression learning gap on the demo, several seeds (issue 13): the DP = 2 demo (mpirun -np 3:
# one rollout rank, two trainer ranks) for actor.grad_compression = none, onebit, threshold and
# trainer.seed = 1, 2, 3, all from ONE SFT warm start (WARM, a checkpoint folder made by the demo's
# warm start: runs/demo/sft_checkpoint), then a summary: mean ± sample standard deviation of the
# final held-out accuracy (val/accuracy at the last version) and of the training reward and
# actor/pg_loss averaged over the last 10 steps.
# Usage: bench/run_compression_seeds.sh WARM OUT [STEPS] [BUILD]   (default 100 steps, build)
set -eu
cd "$(dirname "$0")/.."
WARM=${1:?usage: run_compression_seeds.sh WARM_CHECKPOINT OUT_DIR [STEPS] [BUILD]}
OUT=${2:?usage: run_compression_seeds.sh WARM_CHECKPOINT OUT_DIR [STEPS] [BUILD]}
STEPS=${3:-100}
BUILD=${4:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
mkdir -p "$OUT"
for seed in 1 2 3; do
    for mode in none onebit threshold; do
        d=$OUT/${mode}_s$seed
        [[ -s $d/done ]] && continue
        echo "\$ mpirun --oversubscribe -np 3 $BUILD/moerl-mpi rl --config examples/demo.yaml trainer.n_ranks=2" \
             "trainer.total_training_steps=$STEPS actor.grad_compression=$mode trainer.seed=$seed model.path=$WARM" \
             "sft.total_training_steps=0 trainer.default_local_dir=$d"
        mpirun --oversubscribe -np 3 "$BUILD/moerl-mpi" rl --config examples/demo.yaml trainer.n_ranks=2 \
            trainer.total_training_steps="$STEPS" actor.grad_compression=$mode trainer.seed=$seed model.path="$WARM" \
            sft.total_training_steps=0 trainer.resume_mode=disable trainer.overwrite_output_dir=true \
            trainer.default_local_dir="$d" >"$OUT/${mode}_s$seed.log" 2>&1
        date >"$d/done"
    done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys, statistics as st, os
out = sys.argv[1]
print("mode       held-out accuracy (%)   reward (last 10)   pg_loss (last 10)   seeds")
for mode in ("none", "onebit", "threshold"):
    acc, rew, pgl = [], [], []
    for seed in (1, 2, 3):
        p = os.path.join(out, f"{mode}_s{seed}", "metrics.jsonl")
        if not os.path.exists(p): continue
        rows = [json.loads(l) for l in open(p)]
        a = [r["val/accuracy"] for r in rows if r.get("val/accuracy") is not None]
        tr = [r for r in rows if r.get("actor/pg_loss") is not None]
        if not a or not tr: continue
        acc.append(100 * a[-1])
        rk = next(k for k in ("critic/score/mean", "critic/rewards/mean", "reward/mean") if k in tr[-1])
        rew.append(sum(r[rk] for r in tr[-10:]) / len(tr[-10:]))
        pgl.append(sum(r["actor/pg_loss"] for r in tr[-10:]) / len(tr[-10:]))
    f = lambda v: f"{st.mean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else (f"{v[0]:.3f}" if v else "-")
    print(f"{mode:10s} {f(acc):>22s} {f(rew):>18s} {f(pgl):>19s}   {len(acc)}")
    print(f"{'':10s} per seed: acc {['%.1f' % x for x in acc]}")
PY
