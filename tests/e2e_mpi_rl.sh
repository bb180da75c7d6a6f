#!/usr/bin/env bash
# End-to-end tests of the main job across processes: `mpirun -np N build/moerl-mpi rl ...
# trainer.n_ranks=T` (the last T ranks data-parallel trainers, the others rollout ranks; see
# src/rl/job_dist.c). Toy scale (examples/smoke.yaml, no warm start, no held-out eval).
#   splits     1:1 (-np 2), 2:1 (-np 3) and 1:2 (-np 3, two trainer ranks) rollout:trainer ranks: exit 0,
#              one metrics record per version with version +1 per trigger_parameter_sync_step steps
#   staleness  staleness 0 + trigger 1: every sample generated entirely by the version that trains it
#   epochs     every prompt of each epoch trained exactly once over exactly 2 epochs (2 rollout ranks)
#   paged KV   a KV budget that preempts on 2 rollout ranks: rollout/preemptions, kv_blocks_* and the
#              prefix-cache hits summed over them in metrics.jsonl, n_preemptions per response in samples.jsonl
#   DP         DP=2 vs DP=1 on the same job. End to end the samples of a learning run may differ:
#              DP=2 sums gradients in another fp32 order, the weights then differ by rounding and a
#              sampled token can flip. So: (a) with lr = 0 (weights fixed, staleness 0, partial off,
#              one rollout rank) the samples must be IDENTICAL and the per-step gradient norm and
#              entropy (computed from the reduced gradient / summed over ranks) equal within fp32
#              rounding; (b) with lr > 0, DP=1 under mpirun must reproduce the single-process job
#              (build/moerl, mode sync = the same schedule) bit for bit: metrics and checkpoint
#              weights. The DP=2 update itself is checked against DP=1 at the trainer level by
#              tests/test_dist_dp.c; here the job also asserts identical weights on all trainer ranks.
#   bf16 sync  rollout.dtype bf16: the broadcast moves half the bytes of the fp32 one, and DP=1 under
#              mpirun (bf16 on the wire) equals the one-process job (fp32 rounded on load) bit for bit
#   model par. FSDP / HSDP / Ulysses SP / pipeline (also interleaved, 2 chunks per stage) / EP trainer ranks
#              against data parallelism on the same batch: the same samples, weights within 1e-4; the
#              pipeline runs' version records carry the bubble of their update schedules (perf/pipeline_*)
#   KL ref.    actor.use_kl_loss with the reference sharded as the actor (FSDP 2, EP 2) against data
#              parallelism: same samples, weights and actor/kl_loss (pipeline 2: version 1's kl_loss, and
#              with lr 0 the same samples and a zero KL); the FSDP run resumed from its step-4 checkpoint
#              (on fsdp 2 and on one trainer rank) equals the uninterrupted run
#   SFT stop   SIGUSR1 to mpirun during the SFT warm start: exit 138, its checkpoint, no rank left waiting;
#              an error in the warm start: exit 1, one message, no folder
#   resume     trainer rank 0 fails (injected) right after a checkpoint; the same command resumes and
#              every prompt of 4 epochs is trained exactly once over the two runs
#   logs       under mpirun -np 2, rl and sft: a key given twice, a configuration warning, val_n above the
#              held-out rows and the model's line each printed once; a refused resume (another seed) and a
#              run's folder with resume_mode=disable: the reason once, exit 1, no MPI_Abort
#   failures   an injected failure on a rollout rank (startup) and on trainer rank 1 (mid-run), and a
#              bad dataset: the job ends within the timeout, exit non-zero, the message names the rank;
#              trainer.n_ranks > 1 without mpirun, or leaving no rollout rank, fails clearly
# MPI is part of the setup (scripts/setup.sh installs openmpi-bin and libopenmpi-dev), so a missing
# mpirun or build/moerl-mpi FAILS. The only way to skip (printing the reason and "0 passed, 0 failed")
# is to say MPI is not wanted: MOERL_NO_MPI=1 in the environment, or `make test NO_MPI=1`.
# Usage: tests/e2e_mpi_rl.sh [BUILD_DIR]; ends with "N passed, N failed", non-zero on failure.
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
require_mpi e2e_mpi_rl "$BUILD"
MOERL_MPI=$BUILD/moerl-mpi
MOERL=$BUILD/moerl
if [[ ! -x $MOERL_MPI || ! -x $MOERL ]]; then
    bad "setup" "$MOERL_MPI or $MOERL not built (mpirun is installed: make builds moerl-mpi with mpicc)"
    finish
fi
# Open MPI in containers: allow root, more ranks than cores (idle ranks then yield), no CMA/ptrace
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 # ranks share the cores: one compute thread each
WORK=$W
COMMON=(sft.total_training_steps=0 trainer.val_n=0 trainer.test_freq=0 trainer.n_threads=1 data.n_test=8
        trainer.resume_mode=disable trainer.save_freq=-1)
# mpi_rl NAME NP T [key=value ...]: output folder $WORK/NAME, log $WORK/NAME.log, JSON $WORK/NAME.json;
# returns the exit code (timeout 120 s is a hang guard, not a speed requirement).
mpi_rl() {
    local name=$1 np=$2 t=$3
    shift 3
    timeout 120 mpirun --oversubscribe -np "$np" "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
        trainer.default_local_dir="$WORK/$name" trainer.n_ranks="$t" "$@" >"$WORK/$name.json" 2>"$WORK/$name.log"
}
tail_log() { tail -8 "$WORK/$1.log" | sed 's/^/    | /'; }

CHECK=$WORK/check.py
cat >"$CHECK" <<'EOF'
import collections, json, math, sys

def rows(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]

def fail(msg):
    print(msg)
    sys.exit(1)

def version_rows(d):
    return [r for r in rows(d + "/metrics.jsonl") if "fully_async/count/current_param_version" in r]

def timed(k):
    return k.startswith("timing_s/") or k.startswith("perf/") or k.endswith("idle_ratio")

cmd, d, args = sys.argv[1], sys.argv[2], sys.argv[3:]
if cmd == "onpolicy":  # every sample generated entirely by the version that trains it
    s = rows(d + "/samples.jsonl")
    if len(s) != int(args[0]):
        fail("%d samples, want %s" % (len(s), args[0]))
    off = [x for x in s if not (x["min_version"] == x["max_version"] == x["trainer_version"])]
    if off:
        fail("%d samples not on-policy, e.g. %s" % (len(off), off[0]))
elif cmd == "versions":  # one record per version; +1 per trig steps; the distributed metrics present
    trig, steps = int(args[0]), int(args[1])
    v = version_rows(d)
    if len(v) != steps // trig:
        fail("%d version records, want %d" % (len(v), steps // trig))
    for i, r in enumerate(v):
        ver, step = r["fully_async/count/current_param_version"], r["training/global_step"]
        if ver != i + 1 or step != (i + 1) * trig:
            fail("record %d: version %s at step %s, want version %d at step %d" % (i, ver, step, i + 1, (i + 1) * trig))
        for k in ("timing_s/param_sync", "timing_s/weight_bcast", "perf/weight_bcast_bytes",
                  "timing_s/grad_reduce_exposed"):
            if k not in r or not r[k] >= 0:
                fail("record %d: %s missing or negative: %s" % (i, k, r.get(k)))
        if r["perf/weight_bcast_bytes"] <= 0:
            fail("record %d: no weight broadcast bytes" % i)
elif cmd == "once":  # every (epoch, row) of epochs 0..E-1 trained exactly once
    epochs, n_rows = int(args[0]), int(args[1])
    s = rows(d + "/samples.jsonl")
    c = collections.Counter((x["epoch"], x["row"]) for x in s)
    bad_uid = [x for x in s if x["uid"] != x["epoch"] * n_rows + x["row"]]
    want = {(e, r) for e in range(epochs) for r in range(n_rows)}
    dup = sorted(k for k, n in c.items() if n > 1)
    missing = sorted(want - set(c))
    extra = sorted(set(c) - want)
    if dup or missing or extra or bad_uid or len(s) != epochs * n_rows:
        fail("%d samples; duplicated %s; missing %s; unexpected %s; bad uid %s"
             % (len(s), dup[:8], missing[:8], extra[:8], bad_uid[:2]))
elif cmd == "same_metrics":  # non-timing keys both runs have: bit-identical values
    a, b = rows(d + "/metrics.jsonl"), rows(args[0] + "/metrics.jsonl")
    if len(a) != len(b) or len(a) < 2:
        fail("%d vs %d metric records" % (len(a), len(b)))
    n = 0
    for i, (x, y) in enumerate(zip(a, b)):
        for k in set(x) & set(y):
            if not timed(k):
                n += 1
                if x[k] != y[k]:
                    fail("record %d: %s = %r vs %r" % (i, k, x[k], y[k]))
    print("%d values identical" % n)
elif cmd == "dp_close":  # DP=2 vs DP=1 with lr 0: gradient norm and entropy per version
    a, b = version_rows(d), version_rows(args[0])
    if len(a) != len(b) or len(a) < 4:
        fail("%d vs %d version records" % (len(a), len(b)))
    worst_g = worst_e = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        # the reduced gradient is a sum of the ranks' fp32 partial gradients (another summation order
        # than DP=1): observed relative differences of the norm ~1e-7; 1e-5 leaves 100x margin, while
        # a missing, doubled or wrongly weighted reduction changes the norm by O(1)
        g1, g2 = x["actor/grad_norm"], y["actor/grad_norm"]
        rg = abs(g1 - g2) / abs(g2)
        # entropy: token sums weighted by 1/(global token count), summed over ranks in double; observed
        # ~1e-9 relative; 1e-6 leaves margin
        e1, e2 = x["actor/entropy"], y["actor/entropy"]
        re = abs(e1 - e2) / abs(e2)
        worst_g, worst_e = max(worst_g, rg), max(worst_e, re)
        if not (g2 > 0 and rg <= 1e-5 and re <= 1e-6):
            fail("version %d: grad_norm %r vs %r (rel %.2g), entropy %r vs %r (rel %.2g)" % (i + 1, g1, g2, rg, e1, e2, re))
    print("max relative difference: grad_norm %.2g, entropy %.2g over %d versions" % (worst_g, worst_e, len(a)))
elif cmd == "same_responses":  # every uid of both runs has the same response tokens (order of lines aside)
    a = {x["uid"]: [r["ids"] for r in x["responses"]] for x in rows(d + "/samples.jsonl")}
    b = {x["uid"]: [r["ids"] for r in x["responses"]] for x in rows(args[0] + "/samples.jsonl")}
    if a.keys() != b.keys() or len(a) < 4:
        fail("uids differ: %d vs %d groups" % (len(a), len(b)))
    diff = [u for u in a if a[u] != b[u]]
    if diff:
        fail("%d of %d groups have other response tokens, e.g. uid %s" % (len(diff), len(a), diff[0]))
    print("%d groups, identical response tokens" % len(a))
elif cmd == "weights_close":  # checkpoint/{model,optimizer}.safetensors of two runs: max |a - b| ≤ tol
    import array, struct
    def load(p):
        with open(p, "rb") as f:
            b = f.read()
        n = struct.unpack("<Q", b[:8])[0]
        out = {}
        for k, v in json.loads(b[8:8 + n]).items():
            if k != "__metadata__":
                s0, s1 = v["data_offsets"]
                a = array.array("f")
                a.frombytes(b[8 + n + s0:8 + n + s1])
                out[k] = a
        return out
    tol, msg = float(args[1]), []
    for f in ("model.safetensors", "optimizer.safetensors"):
        a, b = load(d + "/checkpoint/" + f), load(args[0] + "/checkpoint/" + f)
        if a.keys() != b.keys():
            fail("%s: tensors differ: %s" % (f, sorted(set(a) ^ set(b))[:4]))
        worst = max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)
        if not worst <= tol:
            fail("%s: max |difference| %.3g > %g" % (f, worst, tol))
        msg.append("%s max |diff| %.2g" % (f.split(".")[0], worst))
    print(", ".join(msg))
elif cmd == "kl_close":  # actor/kl_loss of every version: both > 0; relative difference ≤ tol over the
    # first args[2] versions (all without it)
    a, b = version_rows(d), version_rows(args[0])
    tol, worst = float(args[1]), 0.0
    upto = int(args[2]) if len(args) > 2 else len(a)
    if len(a) != len(b) or len(a) < 4:
        fail("%d vs %d version records" % (len(a), len(b)))
    for i, (x, y) in enumerate(zip(a, b)):
        if i >= upto:
            if not (x.get("actor/kl_loss") or 0) > 0:
                fail("version %d: actor/kl_loss %r (expected > 0)" % (i + 1, x.get("actor/kl_loss")))
            continue
        k1, k2 = x.get("actor/kl_loss"), y.get("actor/kl_loss")
        if k1 is None or k2 is None or not k2 > 0:
            fail("version %d: actor/kl_loss %r vs %r (expected > 0: the second update of a step moves off the "
                 "reference)" % (i + 1, k1, k2))
        r = abs(k1 - k2) / k2
        worst = max(worst, r)
        if not r <= tol:
            fail("version %d: actor/kl_loss %r vs %r (relative %.2g > %g)" % (i + 1, k1, k2, r, tol))
    print("actor/kl_loss > 0 over %d versions, max relative difference %.2g over the first %d"
          % (len(a), worst, min(upto, len(a))))
elif cmd == "kl_zero":  # a fixed policy (lr 0) is its own reference: |actor/kl_loss| ≤ tol at every version
    a, tol = version_rows(d), float(args[0])
    if len(a) < 4:
        fail("%d version records" % len(a))
    worst = max(abs(x.get("actor/kl_loss", float("nan"))) for x in a)
    if not worst <= tol:
        fail("max |actor/kl_loss| %r > %g (the reference's logprobs are not the fixed policy's)" % (worst, tol))
    print("max |actor/kl_loss| %.2g over %d versions" % (worst, len(a)))
elif cmd == "half_bytes":  # every version's weight broadcast moved half the bytes of the other run's
    a, b = version_rows(d), version_rows(args[0])
    if len(a) != len(b) or not a:
        fail("%d vs %d version records" % (len(a), len(b)))
    for i, (x, y) in enumerate(zip(a, b)):
        if not (x["perf/weight_bcast_bytes"] > 0 and 2 * x["perf/weight_bcast_bytes"] == y["perf/weight_bcast_bytes"]):
            fail("version %d: %s bytes broadcast, the fp32 run %s (want exactly half)"
                 % (i + 1, x["perf/weight_bcast_bytes"], y["perf/weight_bcast_bytes"]))
    print("%d bytes per broadcast (fp32: %d) over %d versions"
          % (a[0]["perf/weight_bcast_bytes"], b[0]["perf/weight_bcast_bytes"], len(a)))
elif cmd == "pipeline":  # every version record carries the pipeline's bubble of its update schedules
    p, v = int(args[0]), int(args[1])
    rs = version_rows(d)
    if not rs:
        fail("no version record")
    keys = ("perf/pipeline_bubble", "perf/pipeline_bubble_max", "perf/pipeline_bubble_theory",
            "perf/pipeline_bubble_theory_interleaved", "perf/pipeline_recv_wait", "perf/pipeline_microbatches",
            "perf/pipeline_virtual_stages")
    for i, r in enumerate(rs):
        miss = [k for k in keys if not isinstance(r.get(k), float)]
        if miss:
            fail("record %d: %s missing" % (i, miss))
        b, bmax, m = r["perf/pipeline_bubble"], r["perf/pipeline_bubble_max"], r["perf/pipeline_microbatches"]
        th, thi, w = r["perf/pipeline_bubble_theory"], r["perf/pipeline_bubble_theory_interleaved"], r["perf/pipeline_recv_wait"]
        # m is the mean micro-batch count of the version's schedules (each ≥ p: the 1F1B guard); the
        # theory is (p−1)/(m+p−1), interleaved (p−1)/(v·m+p−1): the same double expressions as the C
        # code, so equal up to one rounding (1e-12 absolute)
        want, want_i = (p - 1) / (m + p - 1), (p - 1) / (v * m + p - 1)
        # bubble: idle time summed over the schedules / their time, mean over stages: a weighted mean of
        # the schedules' means, so ≤ the largest stage share (1e-12: rounding); receive waits are a part
        # of a stage's idle time (busy and wait are disjoint intervals of its schedule)
        if not (0 <= b < 1 and b <= bmax + 1e-12 and bmax < 1 and 0 <= w <= b + 1e-12):
            fail("record %d: bubble %r, max %r, recv_wait %r: want 0 <= wait <= bubble <= max < 1" % (i, b, bmax, w))
        if not (m >= p and r["perf/pipeline_virtual_stages"] == v):
            fail("record %d: %r micro-batches (want >= %d), %r virtual stages (want %d)"
                 % (i, m, p, r["perf/pipeline_virtual_stages"], v))
        if abs(th - want) > 1e-12 or abs(thi - want_i) > 1e-12:
            fail("record %d: theory %r / interleaved %r, want (p-1)/(m+p-1) = %r / (p-1)/(v*m+p-1) = %r at m = %r"
                 % (i, th, thi, want, want_i, m))
    print("%d version records, bubble %.3f..%.3f (theory %.3f..%.3f)" % (
        len(rs), min(r["perf/pipeline_bubble"] for r in rs), max(r["perf/pipeline_bubble"] for r in rs),
        min(r["perf/pipeline_bubble_theory_interleaved"] for r in rs),
        max(r["perf/pipeline_bubble_theory_interleaved"] for r in rs)))
else:
    fail("unknown check " + cmd)
EOF
check() { "$PY" "$CHECK" "$@"; }

# ---------------------------------------------------------------- role splits
# 1:1, staleness 0 with a sync every step: on-policy streaming
if mpi_rl s11 2 1 async_training.staleness_threshold=0 async_training.trigger_parameter_sync_step=1 \
    trainer.total_training_steps=8; then
    if msg=$(check onpolicy "$WORK/s11" 32); then ok "1:1 staleness 0: every sample min=max=trainer_version"
    else bad "1:1 staleness 0" "$msg"; fi
    if msg=$(check versions "$WORK/s11" 1 8); then ok "1:1: version +1 per step, sync/broadcast metrics"
    else bad "1:1 versions" "$msg"; fi
    # step 1 counts the wait for the first batch (the server grants prompts only after the start
    # validation and the peak measurement): positive wait and idle ratio at version 1 (no bound on size)
    if $PY -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if 'timing_s/gen' in l][0]
sys.exit(0 if r['training/global_step'] == 1 and r['timing_s/gen'] > 0 and r['trainer/idle_ratio'] > 0 else 1)
" "$WORK/s11/metrics.jsonl"; then ok "1:1: step 1's timing_s/gen and trainer/idle_ratio count the first wait"
    else bad "1:1 first wait" "version 1 shows no wait"; fi
else
    bad "1:1" "exit $?"; tail_log s11
fi
# 2:1, two epochs of 32 prompts, partial rollout and staleness, a sync every 2 steps
if mpi_rl s21 3 1 data.n_train=32 trainer.total_training_steps=0 trainer.total_epochs=2 \
    async_training.staleness_threshold=0.5 async_training.trigger_parameter_sync_step=2; then
    if msg=$(check once "$WORK/s21" 2 32); then ok "2:1: every prompt of 2 epochs trained exactly once"
    else bad "2:1 epochs" "$msg"; fi
    if msg=$(check versions "$WORK/s21" 2 16); then ok "2:1: version +1 per 2 steps"
    else bad "2:1 versions" "$msg"; fi
else
    bad "2:1" "exit $?"; tail_log s21
fi
# 2:1 with a paged KV budget of 12 blocks of 4 tokens per rollout rank (smoke model: 2 KB a block; a
# prompt of ~33 tokens + 8 needs 10): the rollout ranks preempt, and their rollout/ metrics (summed over
# the 2 ranks, docs/engine.md) and each response's samples.jsonl n_preemptions reach trainer rank 0
if mpi_rl kv21 3 1 trainer.total_training_steps=2 rollout.block_size=4 rollout.kv_cache_bytes=24576; then
    if msg=$($PY -c "
import json, sys
d = sys.argv[1]
m = [json.loads(l) for l in open(d + '/metrics.jsonl') if 'rollout/preemptions' in l]
n = [x['n_preemptions'] for l in open(d + '/samples.jsonl') for x in json.loads(l)['responses']]
ok = m and all(r['rollout/kv_blocks_total'] == 24 and r['rollout/kv_blocks_peak'] <= 24 for r in m)
ok = ok and m[-1]['rollout/preemptions'] > 0 and 0 < sum(n) <= m[-1]['rollout/preemptions']
ok = ok and m[-1]['rollout/prefix_hit_tokens'] > 0 and 0 < m[-1]['rollout/prefix_cache_hit_rate'] < 1
print('%d version rows, %g preemptions, %d in the trained samples, blocks %g' % (len(m), m[-1]['rollout/preemptions'] if m else -1, sum(n), m[-1]['rollout/kv_blocks_total'] if m else -1))
sys.exit(0 if ok else 1)
" "$WORK/kv21"); then ok "2:1 paged KV: rollout/ metrics summed over the rollout ranks, n_preemptions: $msg"
    else bad "2:1 paged KV metrics" "$msg"; fi
else
    bad "2:1 paged KV" "exit $?"; tail_log kv21
fi
# 1:2, two data-parallel trainer ranks, mini-batches split over them, on-policy
if mpi_rl s12 3 2 async_training.staleness_threshold=0 trainer.total_training_steps=6 actor.ppo_mini_batch_size=3 \
    async_training.require_batches=2 actor.ppo_epochs=2; then
    if msg=$(check onpolicy "$WORK/s12" 36); then ok "1:2 staleness 0: every sample on-policy"
    else bad "1:2 staleness 0" "$msg"; fi
    if msg=$(check versions "$WORK/s12" 1 6); then ok "1:2: version +1 per step"
    else bad "1:2 versions" "$msg"; fi
    if grep -q "weights identical on all 2 trainer ranks" "$WORK/s12.log"; then ok "1:2: trainer replicas identical"
    else bad "1:2 replicas" "no 'weights identical on all 2 trainer ranks' line"; tail_log s12; fi
else
    bad "1:2" "exit $?"; tail_log s12
fi

# ---------------------------------------------------------------- DP=2 vs DP=1
# (a) lr 0, staleness 0, partial off, one rollout rank: samples identical, gradients equal to rounding.
# Aux loss off: HF's load-balancing loss uses per-forward batch statistics, so it is not additive over
# a split batch (DP=1 and DP=2 would optimise different losses; see tests/test_dist_dp.c); the entropy
# bonus gives every step a gradient even when all rewards are 0. 0.02 MiB gradient buckets: ~50 of
# them, each reduced as soon as model_backward's layer hook says its layers are final.
DET=(actor.optim.lr=0 async_training.staleness_threshold=0 async_training.partial_rollout=false
     actor.ppo_mini_batch_size=3 async_training.require_batches=2 trainer.total_training_steps=6
     model.router_aux_loss_coef=0 actor.entropy_coeff=0.01 actor.grad_bucket_mb=0.02)
if mpi_rl dp1 2 1 "${DET[@]}" && mpi_rl dp2 3 2 "${DET[@]}"; then
    if cmp -s "$WORK/dp1/samples.jsonl" "$WORK/dp2/samples.jsonl"; then ok "DP=2 vs DP=1 (lr 0): identical samples.jsonl"
    else bad "DP samples" "samples.jsonl differ"; fi
    if msg=$(check dp_close "$WORK/dp2" "$WORK/dp1"); then ok "DP=2 vs DP=1 (lr 0): $msg"
    else bad "DP=2 vs DP=1" "$msg"; fi
else
    bad "DP=2 vs DP=1" "a run failed"; tail_log dp1; tail_log dp2
fi
# (b) lr > 0: DP=1 under mpirun reproduces the single-process job bit for bit (sync schedule)
SYN=(async_training.staleness_threshold=0 async_training.partial_rollout=false async_training.trigger_parameter_sync_step=1
     trainer.total_training_steps=6 trainer.save_freq=0 actor.optim.lr=1e-3 actor.entropy_coeff=0.01)
if mpi_rl syn_mpi 2 1 "${SYN[@]}" && "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" "${SYN[@]}" \
    async_training.mode=sync trainer.default_local_dir="$WORK/syn_one" >"$WORK/syn_one.json" 2>"$WORK/syn_one.log"; then
    if msg=$(check same_metrics "$WORK/syn_mpi" "$WORK/syn_one"); then ok "DP=1 under mpirun = one process: $msg"
    else bad "mpirun vs one process metrics" "$msg"; fi
    if cmp -s "$WORK/syn_mpi/checkpoint/model.safetensors" "$WORK/syn_one/checkpoint/model.safetensors"; then
        ok "DP=1 under mpirun = one process: identical trained weights"
    else bad "mpirun vs one process weights" "checkpoint/model.safetensors differ (or missing)"; fi
else
    bad "mpirun vs one process" "a run failed"; tail_log syn_mpi; tail_log syn_one
fi

# (c) rollout.dtype bf16: the weight broadcast carries bf16 (rounded on the trainer, loaded as bf16 by
# the rollout rank): half the bytes of (b)'s fp32 broadcast, and the job still reproduces the
# single-process bf16 job — which hands fp32 weights to its engine and rounds them on load — bit for bit
if mpi_rl syn_mpi16 2 1 "${SYN[@]}" rollout.dtype=bf16 && "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" \
    "${SYN[@]}" rollout.dtype=bf16 async_training.mode=sync trainer.default_local_dir="$WORK/syn_one16" \
    >"$WORK/syn_one16.json" 2>"$WORK/syn_one16.log"; then
    if msg=$(check half_bytes "$WORK/syn_mpi16" "$WORK/syn_mpi"); then ok "bf16 weight sync: $msg"
    else bad "bf16 weight sync bytes" "$msg"; fi
    if msg=$(check same_metrics "$WORK/syn_mpi16" "$WORK/syn_one16") &&
        cmp -s "$WORK/syn_mpi16/samples.jsonl" "$WORK/syn_one16/samples.jsonl"; then
        ok "bf16 weight sync under mpirun = one process rounding on load: identical samples, $msg"
    else bad "bf16 mpirun vs one process" "${msg:-samples.jsonl differ}"; fi
else
    bad "bf16 weight sync" "a run failed"; tail_log syn_mpi16; tail_log syn_one16
fi

# ---------------------------------------------------------------- compressed gradient all-reduce
# DP=2 trainers + 1 rollout rank with actor.grad_compression: the job completes, the replicas stay
# identical (checked by the job itself at the end), and the metrics report the payload ratio.
for comp in threshold onebit; do
    if mpi_rl comp_$comp 3 2 actor.grad_compression=$comp actor.grad_compression_warmup_steps=2 \
        trainer.total_training_steps=6 actor.optim.lr=1e-3; then
        r=$($PY -c "import json,sys; rs=[json.loads(l) for l in open(sys.argv[1]) if 'perf/grad_compression_ratio' in l]; print(rs[-1]['perf/grad_compression_ratio'] if rs else 0)" "$WORK/comp_$comp/metrics.jsonl")
        if grep -q "weights identical on all 2 trainer rank" "$WORK/comp_$comp.log" && $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) > 1.5 else 1)" "$r"; then
            ok "grad_compression=$comp at DP=2: replicas identical, payload ratio $r after warm-up"
        else bad "grad_compression=$comp" "ratio '$r' or replicas not identical"; tail_log comp_$comp; fi
    else bad "grad_compression=$comp" "exit $?"; tail_log comp_$comp; fi
done

# ---------------------------------------------------------------- model parallelism on the trainer ranks
# FSDP / HSDP / Ulysses SP / pipeline / EP against data parallelism on the same global batch (sync schedule, one
# rollout rank, so the samples are the same while the weights agree): lr > 0, a checkpoint every 2
# versions (the whole model and the AdamW moments gathered from the shards onto trainer rank 0).
# Tolerance 1e-4 on weights and moments: the runs differ only in the fp32 summation order of the
# gradients, and Adam divides each coordinate by its own √v, so a coordinate whose gradient is a
# cancelling sum can move by a visible share of lr = 1e-3 (observed ≤ 1.1e-5 with SP, 0 with FSDP);
# a missing, doubled or misrouted reduction moves most coordinates by O(lr) per step.
MP=(async_training.staleness_threshold=0 async_training.partial_rollout=false async_training.trigger_parameter_sync_step=1
    trainer.total_training_steps=6 trainer.save_freq=2 actor.optim.lr=1e-3 actor.entropy_coeff=0.01
    actor.ppo_mini_batch_size=3 async_training.require_batches=2)
mp_case() { # mp_case LABEL NAME NP T REF [key=value ...]: run NAME and compare it with the DP run REF
    local label=$1 name=$2 np=$3 t=$4 ref=$5
    shift 5
    if mpi_rl "$name" "$np" "$t" "${MP[@]}" "$@"; then
        if ! cmp -s "$WORK/$name/samples.jsonl" "$WORK/$ref/samples.jsonl"; then bad "$label" "samples.jsonl differ from $ref"
        elif msg=$(check weights_close "$WORK/$name" "$WORK/$ref" 1e-4); then ok "$label = $ref: same samples, $msg"
        else bad "$label" "$msg"; fi
    else bad "$label" "exit $?"; tail_log "$name"; fi
}
pp_metrics_case() { # pp_metrics_case LABEL NAME P V: NAME's metrics carry the pipeline bubble (check pipeline)
    if [[ ! -f $WORK/$2/metrics.jsonl ]]; then return; fi # (the run failed: mp_case said so)
    if msg=$(check pipeline "$WORK/$2" "$3" "$4"); then ok "$1: bubble metrics every version: $msg"
    else bad "$1 bubble metrics" "$msg"; fi
}
if mpi_rl mp_dp1 2 1 "${MP[@]}" && mpi_rl mp_dp2 3 2 "${MP[@]}" && mpi_rl mp_dp4 5 4 "${MP[@]}"; then
    mp_case "FSDP 2 (moerl rl)" mp_fsdp2 3 2 mp_dp2 actor.fsdp_config.fsdp_size=2
    mp_case "HSDP 2x2 (moerl rl)" mp_hsdp 5 4 mp_dp4 actor.fsdp_config.fsdp_size=2
    # FSDP keeping its units for the mini-batch (one reduce-scatter per update): the same tolerance
    mp_case "FSDP 2, reshard_after_forward=false (moerl rl)" mp_fsdp2k 3 2 mp_dp2 actor.fsdp_config.fsdp_size=2 \
        actor.fsdp_config.reshard_after_forward=false
    mp_case "Ulysses SP 2 x FSDP 2 (moerl rl)" mp_spfsdp 5 4 mp_dp2 actor.ulysses_sequence_parallel_size=2 \
        actor.fsdp_config.fsdp_size=2
    mp_case "Ulysses SP 2 (moerl rl)" mp_sp2 3 2 mp_dp1 actor.ulysses_sequence_parallel_size=2
    mp_case "pipeline 2 (moerl rl)" mp_pp2 3 2 mp_dp1 actor.pipeline_parallel_size=2
    pp_metrics_case "pipeline 2 (moerl rl)" mp_pp2 2 1
    mp_case "dp 2 x pipeline 2 (moerl rl)" mp_dppp 5 4 mp_dp2 actor.pipeline_parallel_size=2
    pp_metrics_case "dp 2 x pipeline 2 (moerl rl)" mp_dppp 2 1
    # pipeline × FSDP (issue 27): each stage's layers sharded over its 2 ranks, against DP 2 on the same batch
    mp_case "pipeline 2 x FSDP 2 (moerl rl)" mp_ppfsdp 5 4 mp_dp2 actor.pipeline_parallel_size=2 actor.fsdp_config.fsdp_size=2
    # pipeline × EP (issue 27): each stage's experts split over its 2 ranks (two pipelines), against DP 2
    mp_case "pipeline 2 x EP 2 (moerl rl)" mp_ppep 5 4 mp_dp2 actor.pipeline_parallel_size=2 actor.expert_parallel_size=2
    # interleaved: 2 chunks per stage need pp·v = 4 layers (the smoke model has 2): its own DP reference
    if mpi_rl mp_dp1_l4 2 1 "${MP[@]}" model.num_hidden_layers=4; then
        mp_case "pipeline 2 x virtual 2 (moerl rl)" mp_vpp 3 2 mp_dp1_l4 model.num_hidden_layers=4 \
            actor.pipeline_parallel_size=2 actor.virtual_pipeline_parallel_size=2
        pp_metrics_case "pipeline 2 x virtual 2 (moerl rl)" mp_vpp 2 2
    else bad "4-layer data-parallel reference" "exit $?"; tail_log mp_dp1_l4; fi
    mp_case "EP 2 (moerl rl)" mp_ep2 3 2 mp_dp2 actor.expert_parallel_size=2
    mp_case "EP 2 x FSDP 2 (moerl rl)" mp_epfsdp 5 4 mp_dp4 actor.expert_parallel_size=2 actor.fsdp_config.fsdp_size=2
    mp_case "EP 2 x FSDP 2, reshard_after_forward=false (moerl rl)" mp_epfsdpk 5 4 mp_dp4 actor.expert_parallel_size=2 \
        actor.fsdp_config.fsdp_size=2 actor.fsdp_config.reshard_after_forward=false
    # tensor parallelism (actor.megatron.tensor_model_parallel_size): a TP group trains the sequences of one
    # data-parallel shard, so TP 2 compares with DP 1 and TP 2 x DP 2 with DP 2 (observed ≤ 1.1e-5)
    mp_case "TP 2 (moerl rl)" mp_tp2 3 2 mp_dp1 actor.megatron.tensor_model_parallel_size=2
    mp_case "TP 2 x DP 2 (moerl rl)" mp_tpdp 5 4 mp_dp2 actor.megatron.tensor_model_parallel_size=2
    # TP × EP (issue 27, experts whole: each TP rank dispatches its half of the tokens over its EP group of ranks
    # with the same TP rank; src/parallel/tp_ep.h): dp 2 as TP 2 x DP 2, against DP 2 on the same batch
    mp_case "TP 2 x EP 2 (moerl rl)" mp_tpep 5 4 mp_dp2 actor.megatron.tensor_model_parallel_size=2 \
        actor.expert_parallel_size=2 actor.megatron.expert_tensor_parallel_size=1
    # Megatron sequence parallelism on the TP group (norms and residual on half the tokens): the same bound
    mp_case "TP 2 + sequence parallel (moerl rl)" mp_tpsp 3 2 mp_dp1 actor.megatron.tensor_model_parallel_size=2 \
        actor.megatron.sequence_parallel=true
    # Megatron SP × TP × EP (each TP rank's own rows dispatched over its EP group; tp_sp.h): against DP 2 as TP × EP
    # (observed 8.6e-6)
    mp_case "TP 2 x EP 2 + sequence parallel (moerl rl)" mp_tpsep 5 4 mp_dp2 actor.megatron.tensor_model_parallel_size=2 \
        actor.expert_parallel_size=2 actor.megatron.expert_tensor_parallel_size=1 actor.megatron.sequence_parallel=true
    # TP × pipeline (issue 27): each stage's layers TP-split over 2 ranks, 2 stages, against DP 1 (observed 9.5e-6)
    mp_case "TP 2 x pipeline 2 (moerl rl)" mp_tppp 5 4 mp_dp1 actor.megatron.tensor_model_parallel_size=2 \
        actor.pipeline_parallel_size=2
    pp_metrics_case "TP 2 x pipeline 2 (moerl rl)" mp_tppp 2 1
else bad "model-parallel references" "a data-parallel run failed"; tail_log mp_dp2; tail_log mp_dp4; fi
# ---------------------------------------------------------------- the KL reference under model parallelism
# actor.use_kl_loss=true: the reference is sharded as the actor (trainer_shard_ref: FSDP's unit shards,
# the pipeline stage's range, the local experts) and its logprob pass runs through its own strategies.
# FSDP 2 and EP 2 against data parallelism (the whole reference on each trainer rank) on the same
# batch: the same samples, weights and moments within 1e-4 (the tolerance above, for the same
# reason), and actor/kl_loss of every version within 1e-4 relative — the KL is a token mean of
# exp(ref − logp) − (ref − logp) − 1 over the same tokens, so a reference logprob off by its rounding
# (tests/test_dist_plan.c: observed 0) or weights off by ≤ 1e-5 move it by ~1e-5 relative, while a
# reference of another model (a wrong shard, stale or unsharded zeros) changes it by O(1). The
# pipeline's update sums in another fp32 order than DP 1 and, with the KL term, a sampled token flips
# in version 2 (observed: kl_loss 2e-5 relative apart before it), so pipeline 2 is held to: version 1
# (its samples come from the starting policy in both runs) within 1e-4 relative and kl_loss > 0 at
# every version (a frozen reference apart from the moving actor), and with lr 0 (a fixed policy is its
# own reference) the same samples as DP 1 and |kl_loss| ≤ 1e-7 (observed 2.6e-14: k3 of differences in
# the last bit; a reference holding other weights than the policy gives ~1e-3 and more). Then exact resume with the reference sharded:
# the FSDP 2 run stopped at step 4 (its checkpoint) and resumed to step 6 on the same layout and on
# one trainer rank (the whole reference again) equals the uninterrupted run.
KL=(actor.use_kl_loss=true actor.kl_loss_coef=0.5)
kl_case() { # kl_case LABEL NAME NP T REF [key=value ...]: mp_case with the KL loss, and its kl_loss against REF's
    mp_case "$@"
    if [[ -f $WORK/$2/metrics.jsonl ]]; then
        if msg=$(check kl_close "$WORK/$2" "$WORK/$5" 1e-4); then ok "$1: $msg"; else bad "$1 kl_loss" "$msg"; fi
    fi
}
if mpi_rl kl_dp1 2 1 "${MP[@]}" "${KL[@]}" && mpi_rl kl_dp2 3 2 "${MP[@]}" "${KL[@]}"; then
    kl_case "KL reference, FSDP 2 (moerl rl)" kl_fsdp2 3 2 kl_dp2 "${KL[@]}" actor.fsdp_config.fsdp_size=2
    if grep -q "KL reference sharded as the actor" "$WORK/kl_fsdp2.log"; then ok "FSDP 2: the KL reference is sharded"
    else bad "FSDP 2 KL reference" "no 'KL reference sharded as the actor' line"; tail_log kl_fsdp2; fi
    if mpi_rl kl_pp2 3 2 "${MP[@]}" "${KL[@]}" actor.pipeline_parallel_size=2; then
        if msg=$(check kl_close "$WORK/kl_pp2" "$WORK/kl_dp1" 1e-4 1); then ok "KL reference, pipeline 2 (moerl rl): $msg"
        else bad "KL reference, pipeline 2 (moerl rl)" "$msg"; fi
    else bad "KL reference, pipeline 2 (moerl rl)" "exit $?"; tail_log kl_pp2; fi
    if mpi_rl kl_dp1_lr0 2 1 "${MP[@]}" "${KL[@]}" actor.optim.lr=0 &&
        mpi_rl kl_pp2_lr0 3 2 "${MP[@]}" "${KL[@]}" actor.optim.lr=0 actor.pipeline_parallel_size=2; then
        if ! cmp -s "$WORK/kl_pp2_lr0/samples.jsonl" "$WORK/kl_dp1_lr0/samples.jsonl"; then
            bad "KL reference, pipeline 2, lr 0" "samples.jsonl differ from DP 1's"
        elif msg=$(check kl_zero "$WORK/kl_pp2_lr0" 1e-7); then ok "KL reference, pipeline 2, lr 0: same samples, $msg"
        else bad "KL reference, pipeline 2, lr 0" "$msg"; fi
    else bad "KL reference, pipeline 2, lr 0" "exit $?"; tail_log kl_pp2_lr0; fi
    # pipeline × FSDP: the reference sharded the same way (each stage's units over its FSDP group); lr 0,
    # so the policy is its own reference: |kl_loss| ≤ 1e-7 as for pipeline 2 above (observed 2.8e-14)
    if mpi_rl kl_ppfsdp_lr0 5 4 "${MP[@]}" "${KL[@]}" actor.optim.lr=0 actor.pipeline_parallel_size=2 \
        actor.fsdp_config.fsdp_size=2; then
        if ! grep -q "KL reference sharded as the actor" "$WORK/kl_ppfsdp_lr0.log"; then
            bad "KL reference, pipeline 2 x FSDP 2, lr 0" "no 'KL reference sharded as the actor' line"
        elif msg=$(check kl_zero "$WORK/kl_ppfsdp_lr0" 1e-7); then ok "KL reference, pipeline 2 x FSDP 2, lr 0: $msg"
        else bad "KL reference, pipeline 2 x FSDP 2, lr 0" "$msg"; fi
    else bad "KL reference, pipeline 2 x FSDP 2, lr 0" "exit $?"; tail_log kl_ppfsdp_lr0; fi
    kl_case "KL reference, EP 2 (moerl rl)" kl_ep2 3 2 kl_dp2 "${KL[@]}" actor.expert_parallel_size=2
    for to in 2:fsdp 1:one; do
        t=${to%%:*} name=kl_res_${to##*:}
        if mpi_rl "$name" 3 2 "${MP[@]}" "${KL[@]}" actor.fsdp_config.fsdp_size=2 trainer.total_training_steps=4 &&
            mpi_rl "$name" $((t + 1)) "$t" "${MP[@]}" "${KL[@]}" actor.fsdp_config.fsdp_size="$t" \
                trainer.resume_mode=auto && grep -q "resumed from" "$WORK/$name.log"; then
            if ! cmp -s "$WORK/$name/samples.jsonl" "$WORK/kl_fsdp2/samples.jsonl"; then
                bad "KL FSDP 2 resumed on $t trainer rank(s)" "samples.jsonl differ from the uninterrupted run"
            elif msg=$(check weights_close "$WORK/$name" "$WORK/kl_fsdp2" 1e-4) &&
                msg2=$(check kl_close "$WORK/$name" "$WORK/kl_fsdp2" 1e-4); then
                ok "KL FSDP 2 stopped at step 4, resumed on $t trainer rank(s) = uninterrupted: $msg; $msg2"
            else bad "KL FSDP 2 resumed on $t trainer rank(s)" "$msg ${msg2:-}"; fi
        else bad "KL FSDP 2 resumed on $t trainer rank(s)" "exit $? or no 'resumed from'"; tail_log "$name"; fi
    done
else bad "KL references" "a data-parallel run failed"; tail_log kl_dp1; tail_log kl_dp2; fi
# rollout EP: 2 rollout ranks sharing one engine's experts (each holds 4 of 8) against 2 plain
# rollout ranks, both dispatchers, lr 0 (the policy is fixed, so every group's responses depend only
# on its uid's sampling seed and the logits): the same response tokens for every group. The expert
# outputs are the same fp32 rows, only computed on the owning rank (observed: identical).
EPR=(actor.optim.lr=0 async_training.staleness_threshold=0 async_training.partial_rollout=false
     trainer.total_training_steps=6 actor.ppo_mini_batch_size=3 async_training.require_batches=2)
if mpi_rl rep_ref 3 1 "${EPR[@]}"; then
    for disp in alltoall alltoallv; do
        if mpi_rl rep_$disp 3 1 "${EPR[@]}" rollout.expert_parallel_size=2 actor.moe.dispatcher=$disp &&
            grep -q "rollout EP: ranks 0..1 hold 4 experts each ($disp)" "$WORK/rep_$disp.log"; then
            if msg=$(check same_responses "$WORK/rep_$disp" "$WORK/rep_ref"); then ok "rollout EP 2 ($disp) = 2 rollout ranks: $msg"
            else bad "rollout EP 2 ($disp)" "$msg"; fi
        else bad "rollout EP 2 ($disp)" "exit or no EP line"; tail_log rep_$disp; fi
    done
else bad "rollout EP reference" "exit $?"; tail_log rep_ref; fi
# bf16 rollout weights: each broadcast bucket (0.01 MiB here: ~100 buckets, many split inside a
# tensor) is sliced into the engine's bf16 buffer as it arrives (dist_recv_weights_stream +
# ep_slice_range); the same response tokens as 2 plain bf16 rollout ranks
if mpi_rl rep_ref16 3 1 "${EPR[@]}" rollout.dtype=bf16 &&
    mpi_rl rep_ep16 3 1 "${EPR[@]}" rollout.dtype=bf16 rollout.expert_parallel_size=2 async_training.sync_bucket_mb=0.01 &&
    msg=$(check same_responses "$WORK/rep_ep16" "$WORK/rep_ref16"); then
    ok "rollout EP 2, bf16 weights sliced bucket by bucket = 2 bf16 rollout ranks: $msg"
else bad "rollout EP 2 bf16 streamed slices" "${msg:-exit}"; tail_log rep_ep16; fi
# a model whose expert weights are larger than the small one's slack (hidden 256, 32 experts, 8 MB of
# experts per layer): the packed expert panels of an EP engine (fp32 and bf16) hold its 16 experts,
# not all 32 (reading past the slice crashed here); the same responses as 2 plain rollout ranks
BIG=(model.hidden_size=256 model.moe_intermediate_size=256 model.num_experts=32 trainer.total_training_steps=3)
for dt in fp32 bf16; do
    if mpi_rl big_ref_$dt 3 1 "${EPR[@]}" "${BIG[@]}" rollout.dtype=$dt &&
        mpi_rl big_ep_$dt 3 1 "${EPR[@]}" "${BIG[@]}" rollout.dtype=$dt rollout.expert_parallel_size=2 &&
        grep -q "rollout EP: ranks 0..1 hold 16 experts each" "$WORK/big_ep_$dt.log" &&
        msg=$(check same_responses "$WORK/big_ep_$dt" "$WORK/big_ref_$dt"); then
        ok "rollout EP 2 on a 32-expert hidden-256 model ($dt) = 2 plain rollout ranks: $msg"
    else bad "rollout EP 2, 32 experts ($dt)" "${msg:-exit or no EP line}"; tail_log big_ep_$dt; fi
done
# and the asynchronous schedule with partial rollout: syncs interrupt the group mid-generation
# (every rank of it at the same step), bf16 rollout weights, a checkpoint every 4 versions
if mpi_rl rep_async 3 1 rollout.expert_parallel_size=2 async_training.staleness_threshold=1 \
    async_training.partial_rollout=true trainer.total_training_steps=16 trainer.save_freq=4 rollout.dtype=bf16 \
    data.max_response_length=48 rollout.synthetic_length.alpha=1 &&
    n=$($PY -c "import json,sys; print(sum(json.loads(l)['interrupted_responses'] for l in open(sys.argv[1])))" \
        "$WORK/rep_async/samples.jsonl") && [[ $n -gt 0 ]]; then
    ok "rollout EP 2, async with partial rollout and bf16: 16 steps, $n interrupted-and-resumed responses"
else bad "rollout EP 2 async" "exit or no interrupted response"; tail_log rep_async; fi
# rollout TP (rollout.tensor_model_parallel_size=2): one engine replica split over the 2 rollout ranks (heads,
# widths, experts' widths and vocabulary halved; the logits gathered) against 2 plain rollout ranks, lr 0 as
# above: every group's response tokens the same. The TP sums add the two halves' fp32 partial products in
# another order (~1e-7 relative on the logits), which could in principle move a sampled token across a CDF
# boundary; the run is deterministic (one thread per rank, two-rank all-reduce), so a pass is stable.
rtp_case() { # rtp_case LABEL NAME REF NP [key=value ...]: NAME under rollout TP 2 has REF's responses
    local label=$1 name=$2 ref=$3 np=$4
    shift 4
    if mpi_rl "$name" "$np" 1 "${EPR[@]}" rollout.tensor_model_parallel_size=2 "$@" &&
        grep -q "rollout TP: ranks 0..1 hold one replica" "$WORK/$name.log" &&
        msg=$(check same_responses "$WORK/$name" "$WORK/$ref"); then ok "$label: $msg"
    else bad "$label" "${msg:-exit or no TP line}"; tail_log "$name"; fi
}
if [[ -f $WORK/rep_ref/samples.jsonl ]]; then rtp_case "rollout TP 2 = 2 plain rollout ranks (fp32)" rep_tp rep_ref 3
else bad "rollout TP 2" "no rollout reference run"; fi
if [[ -f $WORK/rep_ref16/samples.jsonl ]]; then
    rtp_case "rollout TP 2, bf16 weights sliced bucket by bucket = 2 bf16 rollout ranks" rep_tp16 rep_ref16 3 \
        rollout.dtype=bf16 async_training.sync_bucket_mb=0.01
else bad "rollout TP 2 bf16" "no bf16 rollout reference run"; fi
# two TP replicas (4 rollout ranks) and the asynchronous schedule with partial rollout: syncs interrupt both
# replicas mid-generation, every rank of a replica at the same step; a checkpoint every 4 versions
if mpi_rl rep_tp_async 5 1 rollout.tensor_model_parallel_size=2 async_training.staleness_threshold=1 \
    async_training.partial_rollout=true trainer.total_training_steps=12 trainer.save_freq=4 rollout.dtype=bf16 \
    data.max_response_length=48 rollout.synthetic_length.alpha=1 &&
    grep -q "rollout TP: ranks 2..3 hold one replica" "$WORK/rep_tp_async.log" &&
    n=$($PY -c "import json,sys; print(sum(json.loads(l)['interrupted_responses'] for l in open(sys.argv[1])))" \
        "$WORK/rep_tp_async/samples.jsonl") && [[ $n -gt 0 ]]; then
    ok "rollout TP 2 x 2 replicas, async with partial rollout and bf16: 12 steps, $n interrupted-and-resumed responses"
else bad "rollout TP 2 async" "exit or no interrupted response"; tail_log rep_tp_async; fi
# refusals, once, before any folder: a size that does not divide the rollout ranks, TP with rollout EP
for case in "rtp3:rollout.tensor_model_parallel_size=3:does not divide the 2 rollout ranks" \
    "rtpep:rollout.tensor_model_parallel_size=2 rollout.expert_parallel_size=2:either tensor- or expert-parallel"; do
    IFS=: read -r nm keys pat <<<"$case"
    # shellcheck disable=SC2086
    timeout 60 mpirun --oversubscribe -np 3 "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
        trainer.default_local_dir="$WORK/$nm" trainer.n_ranks=1 $keys >/dev/null 2>"$WORK/$nm.log"
    rc=$?
    n=$(grep -c -- "$pat" "$WORK/$nm.log")
    if [[ $rc -ne 0 && $rc -ne 124 && $n -eq 1 && ! -e $WORK/$nm ]]; then ok "$keys: refused once (exit $rc): $pat"
    else bad "$keys refused" "exit $rc, $n messages"; tail_log "$nm"; fi
done

# the FSDP run's checkpoint resumes on another number of trainer ranks (2 → 1) and trains on
if [[ -d $WORK/mp_fsdp2/checkpoint ]] && mpi_rl mp_fsdp2 2 1 "${MP[@]}" trainer.total_training_steps=8 \
    trainer.resume_mode=auto && grep -q "resumed" "$WORK/mp_fsdp2.log" &&
    $PY -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; sys.exit(0 if r[-1]['training/global_step']==8 else 1)" \
        "$WORK/mp_fsdp2/metrics.jsonl"; then
    ok "an FSDP-2 checkpoint of moerl rl resumes on 1 trainer rank and reaches step 8"
else bad "FSDP checkpoint resume on 1 rank" "exit or log"; tail_log mp_fsdp2; fi

# a refused resume under mpirun (another trainer.seed): exit non-zero, the refusal named, and no rank's staged
# data left in the folder (ranks ended by the leader's abort had finished and removed theirs: data_prepare_staged)
if [[ -d $WORK/mp_fsdp2/checkpoint ]]; then
    mpi_rl mp_fsdp2 3 1 "${MP[@]}" trainer.total_training_steps=10 trainer.resume_mode=auto trainer.seed=99
    rc=$?
    left=$(find "$WORK/mp_fsdp2" -name '*.staged-*' | head -3)
    if [[ $rc -ne 0 ]] && grep -q "trainer.seed" "$WORK/mp_fsdp2.log" && [[ -z $left ]]; then
        ok "a refused resume under mpirun (trainer.seed changed): exit $rc, named, no staged data left behind"
    else bad "refused resume under mpirun" "exit $rc, left: ${left:-none}"; tail_log mp_fsdp2; fi
fi

# ---------------------------------------------------------------- SIGTERM to mpirun: checkpoint, resume
# mpirun forwards SIGTERM to every rank; trainer rank 0 stops at the next step boundary, stops the
# other ranks, writes a checkpoint and exits 143 (the others leave with it); the same command resumes.
KS=(data.n_train=32 trainer.total_training_steps=0 trainer.total_epochs=6 trainer.save_freq=2
    trainer.resume_mode=auto)
# (SIGUSR1 to mpirun: Open MPI forwards it to every rank as it is; SIGTERM to mpirun starts its own
# kill sequence — SIGCONT, then SIGTERM and SIGKILL 1 s apart —, which a loaded run may not survive)
timeout 120 mpirun --oversubscribe -np 3 "$MOERL_MPI" rl --config examples/smoke.yaml \
    "${COMMON[@]}" trainer.default_local_dir="$WORK/sigterm" trainer.n_ranks=1 "${KS[@]}" >"$WORK/sigterm.json" \
    2>"$WORK/sigterm.log" &
pid=$!
for _ in $(seq 1 6000); do  # hang guard only
    [[ -f $WORK/sigterm/checkpoint/trainer_state.json ]] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
done
sleep 0.3
kill -USR1 "$(pgrep -P $pid -x mpirun)" 2>/dev/null
wait $pid
rc1=$?
# the stop's JSON line carries the MPI keys as a finished run's does (checked when mpirun forwarded the
# stdout it had: after forwarding the signal it may drop a rank's output, below; before the resume rewrites it)
if [[ -s $WORK/sigterm.json ]] && grep -q stopped_by_signal "$WORK/sigterm.json"; then
    if $PY -c "import json,sys; r=json.loads([l for l in open(sys.argv[1]) if 'stopped_by_signal' in l][-1]); sys.exit(0 if r['stopped_by_signal']==10 and r['world_size']==3 and r['rollout_ranks']==2 and r['trainer_ranks']==1 and 'syncs' in r else 1)" \
        "$WORK/sigterm.json"; then ok "SIGUSR1 to mpirun: the stop JSON has world_size, the ranks and syncs"
    else bad "SIGUSR1 stop JSON" "$(tail -c 300 "$WORK/sigterm.json")"; fi
else echo "note: mpirun did not forward the stop JSON line (not checked)"; fi
# (the line is read from the run's own log file: mpirun may stop forwarding a rank's stderr once it
# has forwarded the signal)
if [[ $rc1 -eq 0 ]] || ! grep -q "stopped by signal 10" "$WORK/sigterm/run.log"; then
    bad "SIGUSR1 to mpirun" "exit $rc1, no 'stopped by signal' line"; tail_log sigterm
elif mpi_rl sigterm 3 1 "${KS[@]}" && msg=$(check once "$WORK/sigterm" 6 32); then
    ok "SIGUSR1 to mpirun (exit $rc1): checkpoint, resume: every prompt of 6 epochs once"
else bad "SIGUSR1 to mpirun, resume" "${msg:-exit $?}"; tail_log sigterm; fi

# SIGUSR1 to mpirun during the SFT warm start (trainer rank 0 only; 2 trainer ranks, 1 rollout rank):
# rank 0 writes sft_checkpoint/ and tells the other ranks, which wait for RL's start, to leave: exit
# 138, not a hang (timeout 120 is the hang guard)
timeout 120 mpirun --oversubscribe -np 3 "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/sigsft" trainer.n_ranks=2 sft.total_training_steps=100000 \
    trainer.total_training_steps=3 >"$WORK/sigsft.json" 2>"$WORK/sigsft.log" &
pid=$!
for _ in $(seq 1 6000); do  # hang guard only: wait for the warm start's first metrics record
    [[ -s $WORK/sigsft/sft_metrics.jsonl ]] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
done
kill -USR1 "$(pgrep -P $pid -x mpirun)" 2>/dev/null
wait $pid
rc1=$?
if [[ $rc1 -eq 138 ]] && grep -q "stopped by signal 10 in the SFT warm start" "$WORK/sigsft.log" &&
    [[ -d $WORK/sigsft/sft_checkpoint ]] &&
    $PY -c "import json,sys; r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); sys.exit(0 if r['stopped_in']=='sft_warm_start' and r['stopped_by_signal']==10 else 1)" \
        "$WORK/sigsft.json"; then
    ok "SIGUSR1 to mpirun in the SFT warm start: exit 138, sft_checkpoint, the stop JSON (no rank left waiting)"
else bad "SIGUSR1 to mpirun in the SFT warm start" "exit $rc1 (124: hang)"; tail_log sigsft; fi

# an error in the SFT warm start (sft.lr=-1, refused by sft_train there): the other ranks are sent BYE
# too, so the job ends (timeout 120 is the hang guard) with exit 1, the message once, no folder
timeout 120 mpirun --oversubscribe -np 3 "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/errsft" trainer.n_ranks=2 sft.total_training_steps=5 sft.lr=-1 \
    trainer.total_training_steps=3 >"$WORK/errsft.json" 2>"$WORK/errsft.log"
rc=$?
if [[ $rc -eq 1 ]] && [[ $(grep -c "^moerl rl (trainer 0): sft warm start: SFT learning rate" "$WORK/errsft.log") -eq 1 ]] &&
    ! grep -q "abort:" "$WORK/errsft.log" && [[ ! -e $WORK/errsft ]]; then
    ok "an error in the SFT warm start under mpirun: exit 1, one message, no folder (no rank left waiting)"
else bad "error in the SFT warm start" "exit $rc (124: hang)"; tail_log errsft; fi

# ---------------------------------------------------------------- crash and resume
# 2 rollout ranks + 1 trainer; trainer rank 0 (world rank 2) fails right after the checkpoint of
# version 13; the same command (resume_mode auto) continues: 4 epochs of 32 prompts, each once.
KR=(data.n_train=32 trainer.total_training_steps=0 trainer.total_epochs=4 trainer.save_freq=1
    trainer.resume_mode=auto async_training.staleness_threshold=1.0 async_training.trigger_parameter_sync_step=1)
mpi_rl resume 3 1 "${KR[@]}" debug.test_fail_rank=2 debug.test_fail_version=13
rc1=$?
cp "$WORK/resume.log" "$WORK/resume_first.log"
if [[ $rc1 -eq 0 || $rc1 -eq 124 ]]; then
    bad "crash and resume" "first run: exit $rc1 (expected the injected failure)"; tail_log resume
elif mpi_rl resume 3 1 "${KR[@]}"; then
    at=$(grep -o 'resumed from .*: version [0-9]*, step [0-9]*' "$WORK/resume.log" | grep -o '[0-9]*$')
    if [[ "$at" != 13 ]]; then bad "crash and resume" "second run did not resume at step 13 (got '$at')"
    elif msg=$(check once "$WORK/resume" 4 32); then ok "crash at step 13, resume: every prompt of 4 epochs once"
    else bad "crash and resume" "$msg"; fi
else
    bad "crash and resume" "resumed run exit $?"; tail_log resume
fi

# ---------------------------------------------------------------- failures end the whole job
# expect_abort NAME RANK PATTERN NP T [key=value ...]: exit non-zero without
# hitting the timeout, stderr names the rank ("moerl[rank R]"; RANK is a regex) and contains PATTERN.
expect_abort() {
    local name=$1 rank=$2 pat=$3 np=$4 t=$5
    shift 5
    local t0 rc dt
    t0=$(date +%s.%N)
    timeout 60 mpirun --oversubscribe -np "$np" "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
        trainer.default_local_dir="$WORK/$name" trainer.n_ranks="$t" trainer.total_training_steps=200 "$@" \
        >"$WORK/$name.json" 2>"$WORK/$name.log"
    rc=$?
    dt=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.1f", a-b}')
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then bad "$name" "the job hung (timeout 60 s)"; tail_log "$name"
    elif [[ $rc -eq 0 ]]; then bad "$name" "exit 0 after a failure"
    elif grep -qE "moerl\[rank $rank\]" "$WORK/$name.log" && grep -qF -- "$pat" "$WORK/$name.log"; then
        ok "$name: exit $rc after ${dt}s, message names the rank ($(grep -oE 'moerl\[rank [0-9]+\]' "$WORK/$name.log" | head -1))"
    else bad "$name" "exit $rc, stderr lacks 'moerl[rank $rank]' or '$pat'"; tail_log "$name"; fi
}
expect_abort fail_rollout_start 0 "rollout rank 0 of 1: test: injected failure" 3 2 debug.test_fail_rank=0
expect_abort fail_trainer1_v2 2 "trainer rank 1 of 2: test: injected failure" 3 2 \
    debug.test_fail_rank=2 debug.test_fail_version=2
good='{"data_source": "arith", "prompt": [{"role": "user", "content": "Compute 1+2."}], "reward_model": {"style": "rule", "ground_truth": "3"}}'
printf '%s\n%s\n%s\n' "$good" "$good" '{"data_source": "arith", "prompt": 5}' >"$WORK/bad_rows.jsonl"
printf '%s\n' "$good" >"$WORK/good_rows.jsonl"
# (every rank reads the file and fails; whichever aborts first names itself)
expect_abort bad_dataset "[0-9]+" "bad_rows.jsonl:3" 2 1 data.task= data.train_files="$WORK/bad_rows.jsonl" \
    data.val_files="$WORK/good_rows.jsonl"
# a layout the ranks cannot make: every rank reaches the same verdict, so rank 0 says it once and all
# exit 1 (no MPI_Abort, no message per rank), before the output folder exists
timeout 60 mpirun --oversubscribe -np 5 "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/badlayout" trainer.n_ranks=4 actor.fsdp_config.fsdp_size=3 >/dev/null 2>"$WORK/badlayout.log"
rc=$?
n=$(grep -c "fsdp_size=3 does not divide the 4 trainer ranks" "$WORK/badlayout.log")
if [[ $rc -ne 0 && $rc -ne 124 && $n -eq 1 && ! -e $WORK/badlayout ]] && ! grep -q MPI_ABORT "$WORK/badlayout.log"; then
    ok "fsdp_size=3 on 4 trainer ranks: exit $rc, one message, no MPI_Abort, no folder"
else bad "bad layout under mpirun" "exit $rc, $n messages"; tail_log badlayout; fi
# the pipeline's micro-batch count rule against the worst update, before the warm start: pp 2 × v 2 needs an
# even count, and 3 responses of up to 41 tokens with 60 tokens per micro-batch make exactly 3 — refused
# once (every rank reaches the verdict), naming the keys and values that would work, no folder
timeout 60 mpirun --oversubscribe -np 3 "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" sft.total_training_steps=10 \
    trainer.default_local_dir="$WORK/ppcount" trainer.n_ranks=2 model.num_hidden_layers=4 actor.pipeline_parallel_size=2 \
    actor.virtual_pipeline_parallel_size=2 rollout.n=3 actor.ppo_mini_batch_size=1 actor.ppo_max_token_len_per_gpu=60 \
    >/dev/null 2>"$WORK/ppcount.log"
rc=$?
n=$(grep -c "actor.pipeline_parallel_size=2 with actor.virtual_pipeline_parallel_size=2 cannot schedule" "$WORK/ppcount.log")
if [[ $rc -eq 1 && $n -eq 1 && ! -e $WORK/ppcount ]] && ! grep -qi "warm start" "$WORK/ppcount.log" &&
    grep -qF "Would work: rollout.n=4, or actor.ppo_max_token_len_per_gpu=82, or actor.virtual_pipeline_parallel_size=1" \
        "$WORK/ppcount.log"; then
    ok "pp 2 x v 2 with an odd worst-case micro-batch count: refused at startup, once, naming what would work"
else bad "pipeline count rule at startup" "exit $rc, $n messages"; tail_log ppcount; fi
# one of the values named: 82 tokens hold two sequences, so 3 sequences pack as 2 + 1 (the equal-length
# case the caps alone never packed two to a micro-batch: 3 micro-batches, refused at the first update)
if mpi_rl ppcount_ok 3 2 model.num_hidden_layers=4 actor.pipeline_parallel_size=2 actor.virtual_pipeline_parallel_size=2 \
    rollout.n=3 actor.ppo_mini_batch_size=1 actor.ppo_max_token_len_per_gpu=82 trainer.total_training_steps=3; then
    m=$(grep -o '"perf/pipeline_microbatches": *[0-9.]*' "$WORK/ppcount_ok/metrics.jsonl" | awk -F: '{print $2+0}' | sort -u | tr '\n' ' ')
    if [[ $m == "2 " ]]; then ok "pp 2 x v 2, 3 sequences per update: runs as 2 micro-batches"
    else bad "pp 2 x v 2, 3 sequences per update" "micro-batch counts '$m', expected 2"; fi
else bad "pp 2 x v 2, 3 sequences per update" "exit $?"; tail_log ppcount_ok; fi
# rl_shard_groups' bound with mixed prompt lengths: 8 one-sequence groups, one prompt of 79 tokens and seven
# of 31, over dp 2 x pp 2 with 90 tokens per micro-batch (one sequence each). A pipeline with one group would
# leave the other 7 groups (≥ 7 x 31 tokens) against its ≤ 87, which the largest-first split never does: each
# pipeline gets ≥ 2 sequences, ≥ 2 micro-batches. Once refused ("a pipeline can get 1 group"); now it runs.
short_row='{"data_source": "arith", "prompt": [{"role": "user", "content": "Compute 1+2."}], "reward_model": {"style": "rule", "ground_truth": "3"}}'
long_row='{"data_source": "arith", "prompt": [{"role": "user", "content": "'"$(printf 'Compute 1+2 %.0s' 1 2 3 4 5)"'"}], "reward_model": {"style": "rule", "ground_truth": "3"}}'
printf '%s\n' "$long_row" "$short_row" "$short_row" "$short_row" "$short_row" "$short_row" "$short_row" "$short_row" \
    >"$WORK/mixed_rows.jsonl"
printf '%s\n' "$short_row" "$short_row" >"$WORK/mixed_val.jsonl"
if mpi_rl mixed_len 5 4 data.task= data.train_files="$WORK/mixed_rows.jsonl" data.val_files="$WORK/mixed_val.jsonl" \
    model.num_hidden_layers=4 actor.pipeline_parallel_size=2 rollout.n=1 actor.ppo_mini_batch_size=8 \
    actor.ppo_max_token_len_per_gpu=90 trainer.total_training_steps=2; then
    ok "dp 2 x pp 2, one long prompt in 8: not refused (each pipeline gets 2 or more groups), runs"
else bad "dp 2 x pp 2 with mixed prompt lengths" "exit $?"; tail_log mixed_len; fi
# configuration errors
"$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$WORK/nompi" trainer.n_ranks=2 \
    >"$WORK/nompi.log" 2>&1
rc=$?
if [[ $rc -ne 0 && $rc -lt 128 ]] && grep -qF "run under mpirun with build/moerl-mpi" "$WORK/nompi.log"; then
    ok "trainer.n_ranks=2 in one process: exit $rc, tells to use mpirun"
else bad "n_ranks without mpirun" "exit $rc"; tail_log nompi; fi
"$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$WORK/fsdp_one" \
    actor.fsdp_config.fsdp_size=2 >"$WORK/fsdp_one.log" 2>&1
rc=$?
if [[ $rc -ne 0 && $rc -lt 128 ]] && grep -qF "trainer.n_ranks ≥ 2" "$WORK/fsdp_one.log" && [[ ! -e $WORK/fsdp_one ]]; then
    ok "actor.fsdp_config.fsdp_size=2 in one process: exit $rc, tells to use trainer ranks, no folder"
else bad "FSDP in one process" "exit $rc"; tail_log fsdp_one; fi
timeout 60 mpirun --oversubscribe -np 4 "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/fsdp_bad" trainer.n_ranks=3 actor.fsdp_config.fsdp_size=2 >"$WORK/fsdp_bad.log" 2>&1
rc=$?
if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -qF "actor.fsdp_config.fsdp_size" "$WORK/fsdp_bad.log" && [[ ! -e $WORK/fsdp_bad ]]; then
    ok "fsdp_size=2 over 3 trainer ranks: exit $rc, names the key, no folder"
else bad "FSDP size not dividing the ranks" "exit $rc"; tail_log fsdp_bad; fi
timeout 60 mpirun --oversubscribe -np 2 "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
    trainer.default_local_dir="$WORK/norollout" trainer.n_ranks=2 >"$WORK/norollout.log" 2>&1
rc=$?
if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -qF "leaves no rollout rank" "$WORK/norollout.log"; then
    ok "trainer.n_ranks = world size: exit $rc, no rollout rank left"
else bad "n_ranks = world size" "exit $rc"; tail_log norollout; fi

# ---------------------------------------------------------------- logs under mpirun
# what every rank logs alike (a key given twice, a configuration warning, the model's summary, val_n above
# the held-out rows) is printed once (the first trainer speaks, base/log.h); a refused resume (another
# trainer.seed) is said once and every rank exits 1 through MPI_Finalize: no MPI_Abort banner, no rank's
# own copy, no stop notice from a rank that mpirun's SIGTERM reached
mpi_rl logonce 2 1 trainer.seed=1 trainer.seed=2 trainer.val_n=100 trainer.save_freq=2 trainer.total_training_steps=2 \
    actor.optim.name=onebit_adam actor.optim.var_update_interval=1
rc=$?
n_dup=$(grep -c "trainer.seed is given twice on the command line" "$WORK/logonce.log")
n_cfg=$(grep -c "actor.optim.var_update_interval=1 makes every optimizer step" "$WORK/logonce.log")
n_val=$(grep -c "trainer.val_n=100, but the held-out split" "$WORK/logonce.log")
n_model=$(grep -c "new model: " "$WORK/logonce.log")
if [[ $rc -eq 0 && $n_dup -eq 1 && $n_cfg -eq 1 && $n_val -eq 1 && $n_model -eq 1 ]]; then
    ok "rl under mpirun -np 2: a key given twice, a config warning, val_n above the rows, the model: each said once"
else bad "rl warnings once under mpirun" "exit $rc; lines: key twice $n_dup, config $n_cfg, val_n $n_val, model $n_model"
    tail_log logonce; fi
if [[ -d $WORK/logonce/checkpoint ]]; then
    mpi_rl logonce 2 1 trainer.seed=3 trainer.val_n=100 trainer.total_training_steps=4 trainer.resume_mode=auto
    rc=$?
    n=$(grep -c "the checkpoint was made with another trainer.seed (2; this run has 3)" "$WORK/logonce.log")
    left=$(find "$WORK/logonce" -name '*.staged-*' | head -3)
    if [[ $rc -eq 1 && $n -eq 1 && -z $left ]] && ! grep -qE "MPI_ABORT|abort:|stopping at the next step" "$WORK/logonce.log"; then
        ok "a refused resume under mpirun -np 2: the reason once, exit 1, no MPI_Abort, no staged data left"
    else bad "refused resume said once" "exit $rc, $n messages, left: ${left:-none}"; tail_log logonce; fi
    # the folder holds a run and trainer.resume_mode=disable (COMMON's): the leader's refusal, likewise once
    mpi_rl logonce 2 1 trainer.total_training_steps=4
    rc=$?
    n=$(grep -c "trainer.resume_mode=disable would replace it" "$WORK/logonce.log")
    if [[ $rc -eq 1 && $n -eq 1 && -d $WORK/logonce/checkpoint ]] && ! grep -qE "MPI_ABORT|abort:" "$WORK/logonce.log"; then
        ok "a run's folder with trainer.resume_mode=disable under mpirun -np 2: refused once, exit 1, the run kept"
    else bad "a run's folder refused once" "exit $rc, $n messages"; tail_log logonce; fi
else bad "refused resume said once" "the first run left no checkpoint"; fi
# moerl sft under mpirun: the same rules (rank 0 speaks)
sft_mpi() {
    local name=$1
    shift
    timeout 120 mpirun --oversubscribe -np 2 "$MOERL_MPI" sft --config examples/sft.yaml trainer.n_threads=1 \
        trainer.default_local_dir="$WORK/$name" trainer.total_training_steps=2 trainer.save_freq=1 "$@" \
        >"$WORK/$name.json" 2>"$WORK/$name.log"
}
sft_mpi sftonce trainer.seed=1 trainer.seed=2
rc=$?
n_dup=$(grep -c "trainer.seed is given twice on the command line" "$WORK/sftonce.log")
n_model=$(grep -c "new model: " "$WORK/sftonce.log")
if [[ $rc -eq 0 && $n_dup -eq 1 && $n_model -eq 1 ]]; then ok "sft under mpirun -np 2: a key given twice and the model said once"
else bad "sft lines once under mpirun" "exit $rc; lines: key twice $n_dup, model $n_model"; tail_log sftonce; fi
sft_mpi sftonce trainer.seed=5 trainer.total_training_steps=3 trainer.resume_mode=auto
rc=$?
n=$(grep -c "the checkpoint was made with trainer.seed 2 (now 5)" "$WORK/sftonce.log")
if [[ $rc -eq 1 && $n -eq 1 ]] && ! grep -qE "MPI_ABORT|abort:" "$WORK/sftonce.log"; then
    ok "a refused sft resume under mpirun -np 2: the reason once, exit 1, no MPI_Abort"
else bad "refused sft resume said once" "exit $rc, $n messages"; tail_log sftonce; fi

finish
