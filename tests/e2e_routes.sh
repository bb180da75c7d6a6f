#!/usr/bin/env bash
# End to end: the rollout engine's routing records (rollout.enable_rollout_routing_replay, R3) reach the
# trainer — in one process through the queue, under mpirun through the wire (rollout rank → trainer rank 0
# → the other trainer ranks) — and survive a crash and resume. Toy scale (examples/smoke.yaml).
#   R3         actor.router_replay.mode=R3 with a bf16 engine, in one process and under mpirun: the trainer's
#              moe/routing_agreement (helper R's metric over the tokens with a recorded route) is exactly 1
#              every version, the native agreement below 1 somewhere — the records arrived, in place
#   partial    responses interrupted at a weight sync and resumed (re-prefilled) keep one route per token
#   multi-turn a tool turn inserted between two assistant turns (engine_continue) is recorded as well
#   simulate   moerl simulate runs no model: the keys (recording, R3) are ignored with a warning (samples unchanged)
#   lengths    every trained response carries routes for every token the engine forwarded: samples.jsonl's
#              n_routes = prompt + response − 1 (the trainer checks the same on every rank before it trains:
#              rl_group_check_routes, a mismatch would end the run); the key off: no routes at all
#   one = MPI  sync schedule, DP=1: mpirun (routes over the wire) and the one-process job (the queue) log
#              identical routes (routes_fnv1a, a digest of the int16 records) for every response; DP=2
#              (the train message to trainer rank 1): the run passes rank 1's check; so do EP 2, FSDP 2 and
#              pipeline 2 trainer ranks (the shape is the whole model's on every rank)
#   rollout EP 2 rollout ranks sharing one engine's experts against 2 plain rollout ranks, lr 0: the same
#              routes for every response (each rank records its own tokens' top-k, computed before the
#              dispatch; e2e_mpi_rl.sh shows the responses equal)
#   resume     trainer rank 0 fails (injected) after the checkpoint of version 3; the same command resumes
#              (groups in flight at a checkpoint are redone from their prompt, docs/rl.md "Routing
#              replay"), and the run's samples — routes included — equal the uninterrupted run's
# MPI parts: as e2e_mpi_rl.sh (MOERL_NO_MPI=1 skips them, a missing mpirun fails).
# Usage: tests/e2e_routes.sh [BUILD_DIR]; ends with "N passed, N failed", non-zero on failure.
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
MOERL=$BUILD/moerl
MOERL_MPI=$BUILD/moerl-mpi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
COMMON=(sft.total_training_steps=0 trainer.val_n=0 trainer.test_freq=0 trainer.n_threads=1 data.n_test=8
        trainer.resume_mode=disable trainer.save_freq=-1 trainer.total_training_steps=4
        rollout.enable_rollout_routing_replay=true)
run_rl() { # NAME [key=value ...]
    local name=$1
    shift
    timeout 120 "$MOERL" rl --config examples/smoke.yaml "${COMMON[@]}" trainer.default_local_dir="$W/$name" "$@" \
        >"$W/$name.json" 2>"$W/$name.log"
}
mpi_rl() { # NAME NP T [key=value ...] (timeout: a hang guard, not a speed requirement)
    local name=$1 np=$2 t=$3
    shift 3
    timeout 120 mpirun --oversubscribe -np "$np" "$MOERL_MPI" rl --config examples/smoke.yaml "${COMMON[@]}" \
        trainer.default_local_dir="$W/$name" trainer.n_ranks="$t" "$@" >"$W/$name.json" 2>"$W/$name.log"
}
tail_log() { tail -5 "$W/$1.log" | sed 's/^/    | /'; }

CHECK=$W/check.py
cat >"$CHECK" <<'EOF'
import json, sys

def groups(d):
    with open(d + "/samples.jsonl") as f:
        return [json.loads(l) for l in f if l.strip() and "responses" in json.loads(l)]

def lengths(d, steps):
    g = groups(d)
    if len({x["step"] for x in g}) != int(steps):
        return "groups of %d steps, want %s" % (len({x["step"] for x in g}), steps)
    n = 0
    for x in g:
        for j, r in enumerate(x["responses"]):
            want = len(x["prompt_ids"]) + len(r["ids"]) - 1
            if r.get("n_routes") != want or len(r.get("routes_fnv1a", "")) != 16:
                return "uid %d response %d: n_routes %s, want %d" % (x["uid"], j, r.get("n_routes"), want)
            n += 1
    return "ok: %d responses, routes of prompt + response − 1 tokens each" % n

def none(d):
    bad = [x["uid"] for x in groups(d) for r in x["responses"] if "n_routes" in r or "routes_fnv1a" in r]
    return "ok" if not bad and groups(d) else "routes logged without the key (uids %s)" % bad[:3]

def routes(d):
    return {(x["uid"], j): (r["ids"], r["routes_fnv1a"]) for x in groups(d) for j, r in enumerate(x["responses"])}

def same(a, b):
    ra, rb = routes(a), routes(b)
    if set(ra) != set(rb):
        return "different responses trained: %d vs %d" % (len(ra), len(rb))
    diff = [k for k in ra if ra[k] != rb[k]]
    return "ok: %d responses, identical tokens and routes" % len(ra) if not diff else \
        "%d of %d responses differ (first: uid %d response %d)" % (len(diff), len(ra), diff[0][0], diff[0][1])

def interrupted(d):
    n = sum(x["interrupted_responses"] for x in groups(d))
    return "ok: %d responses interrupted and resumed" % n if n else "no response was interrupted"

def replayed(d, versions):
    with open(d + "/metrics.jsonl") as f:
        m = [r for r in map(json.loads, f) if "moe/routing_agreement" in r]
    if len(m) != int(versions):
        return "moe/routing_agreement in %d version records, want %s" % (len(m), versions)
    if any(r["moe/routing_agreement"] != 1.0 or r["moe/routing_agreement_min"] != 1.0 for r in m):
        return "agreement under R3: %s" % [(r["moe/routing_agreement"], r["moe/routing_agreement_min"]) for r in m]
    native = [r["moe/routing_agreement_native"] for r in m]
    if not all(0.5 < x <= 1 for x in native) or min(native) == 1.0:
        return "native agreement %s (want < 1 somewhere: bf16 engine, fp32 trainer)" % native
    return "ok: moe/routing_agreement 1.0 in all %d versions, native %.4f..%.4f" % (len(m), min(native), max(native))

def two_turns(d):
    n = sum(r["turns"] == 2 for x in groups(d) for r in x["responses"])
    return "ok: %d responses with a tool turn" % n if n else "no response with a tool turn (nothing inserted)"

msg = globals()[sys.argv[1]](*sys.argv[2:])
print(msg)
sys.exit(0 if msg.startswith("ok") else 1)
EOF
check() { "$PY" "$CHECK" "$@"; }

# ---------------------------------------------------------------- one process
if run_rl one; then
    if msg=$(check lengths "$W/one" 4); then ok "one process: $msg"; else bad "one process" "$msg"; fi
else bad "one process" "exit $?"; tail_log one; fi
# partial rollout (lockstep: the same interruptions every run): responses interrupted at a weight sync and
# re-prefilled under the new weights keep one route per forwarded token
if run_rl partial async_training.mode=lockstep async_training.staleness_threshold=1.0 data.max_response_length=32 \
    rollout.max_num_seqs=16; then
    if msg=$(check lengths "$W/partial" 4) && msg2=$(check interrupted "$W/partial"); then ok "partial rollout: $msg; $msg2"
    else bad "partial rollout" "$msg ${msg2:-}"; fi
else bad "partial rollout" "exit $?"; tail_log partial; fi
# R3 (actor.router_replay.mode, docs/rl.md): the trainer replays the recorded routes — routing agreement
# exactly 1 every version — while the trainer's own top-k disagrees with the bf16 engine's somewhere
if run_rl r3 actor.router_replay.mode=R3 rollout.dtype=bf16; then
    if msg=$(check replayed "$W/r3" 4); then ok "R3, one process: $msg"; else bad "R3 one process" "$msg"; fi
else bad "R3 one process" "exit $?"; tail_log r3; fi
if run_rl off rollout.enable_rollout_routing_replay=false; then
    if msg=$(check none "$W/off"); then ok "key off: no routes recorded or logged"; else bad "key off" "$msg"; fi
else bad "key off" "exit $?"; tail_log off; fi

# multi-turn (rollout.multi_turn, a calc tool; SFT teaches the tool call): the inserted tool turns are
# recorded too — every response, of one turn or two, has n_routes = prompt + all its tokens − 1
"$PY" - "$W" <<'EOF'
import json, random, sys
w = sys.argv[1]
random.seed(3)
rows, seen = [], set()
while len(rows) < 56:
    a, b = random.randint(10, 99), random.randint(10, 99)
    if (a, b) not in seen:
        seen.add((a, b))
        rows.append({"data_source": "arith", "prompt": [{"role": "user", "content": "Compute %d+%d." % (a, b)}],
                     "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                     "response": '<tool_call>{"name":"calc","arguments":{"expr":"%d+%d"}}</tool_call>' % (a, b)})
open(w + "/train.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in rows))
EOF
cat >"$W/env.py" <<'EOF'
import json, sys
for line in sys.stdin:
    try:
        a, b = str(json.loads(line)["arguments"].get("expr", "")).split("+")
        out = {"content": str(int(a) + int(b))}
    except Exception:
        out = {"error": "expected an expression a+b"}
    print(json.dumps(out), flush=True)
EOF
cat >"$W/tools.yaml" <<EOF
- function:
    name: calc
    description: Add two integers.
    parameters: {type: object, properties: {expr: {type: string}}, required: [expr]}
  command: $PY $W/env.py
EOF
cat >"$W/mt.yaml" <<EOF
model: {hidden_size: 64, intermediate_size: 128, moe_intermediate_size: 64, num_hidden_layers: 2,
        num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, num_experts: 8, num_experts_per_tok: 2,
        max_position_embeddings: 256}
data: {train_files: $W/train.jsonl, max_response_length: 160, chat_template: tests/tools/chat_tools.jinja}
sft: {total_training_steps: 200, train_batch_size: 16, lr: 3.0e-3}
rollout:
  n: 4
  max_num_seqs: 32
  multi_turn: {enable: true, tool_config_path: $W/tools.yaml, max_assistant_turns: 2, tool_max_retries: 0,
               tool_num_workers: 1}
actor: {ppo_mini_batch_size: 4, optim: {lr: 1.0e-4}}
async_training: {staleness_threshold: 0.5, trigger_parameter_sync_step: 1, partial_rollout: true}
trainer: {total_training_steps: 4, test_freq: 0, save_freq: -1, val_n: 0, watchdog_s: 120, n_threads: 1,
          resume_mode: disable}
EOF
if timeout 120 "$MOERL" rl --config "$W/mt.yaml" trainer.default_local_dir="$W/mt" rollout.enable_rollout_routing_replay=true \
    >"$W/mt.json" 2>"$W/mt.log"; then
    if msg=$(check lengths "$W/mt" 4) && msg2=$(check two_turns "$W/mt"); then ok "multi-turn: $msg; $msg2"
    else bad "multi-turn" "$msg ${msg2:-}"; fi
else bad "multi-turn" "exit $?"; tail_log mt; fi

# moerl simulate runs no model: the key is ignored with a warning, the simulated samples are the same
SIM=(--config examples/bench_async.yaml trainer.total_training_steps=4 data.max_response_length=96
     model.max_position_embeddings=160 trainer.resume_mode=disable)
if timeout 120 "$MOERL" simulate "${SIM[@]}" trainer.default_local_dir="$W/sim_on" rollout.enable_rollout_routing_replay=true \
        actor.router_replay.mode=R3 >/dev/null 2>"$W/sim_on.log" &&
    timeout 120 "$MOERL" simulate "${SIM[@]}" trainer.default_local_dir="$W/sim_off" >/dev/null 2>"$W/sim_off.log"; then
    if grep -q "WARN  rollout.enable_rollout_routing_replay: moerl simulate runs no model" "$W/sim_on.log" &&
        grep -q "WARN  actor.router_replay.mode=R3: moerl simulate runs no model" "$W/sim_on.log" &&
        cmp -s "$W/sim_on/samples.jsonl" "$W/sim_off/samples.jsonl"; then
        ok "simulate: the key is ignored with a warning, identical simulated samples"
    else bad "simulate" "no warning, or the samples differ"; fi
else bad "simulate" "exit $?"; tail_log sim_on; fi

# ---------------------------------------------------------------- mpirun
if [[ ${MOERL_NO_MPI:-0} == 1 || ${NO_MPI:-0} == 1 ]]; then
    echo "MPI parts skipped (MOERL_NO_MPI=1)"
    finish
fi
if ! command -v mpirun >/dev/null || [[ ! -x $MOERL_MPI ]]; then
    bad "setup" "mpirun or $MOERL_MPI missing (MOERL_NO_MPI=1 skips the MPI parts)"
    finish
fi
SYN=(async_training.staleness_threshold=0 async_training.partial_rollout=false
     async_training.trigger_parameter_sync_step=1 trainer.total_training_steps=6 actor.optim.lr=1e-3)
if mpi_rl syn_mpi 2 1 "${SYN[@]}" && run_rl syn_one "${SYN[@]}" async_training.mode=sync; then
    if msg=$(check lengths "$W/syn_mpi" 6); then ok "mpirun 1 rollout + 1 trainer: $msg"; else bad "mpirun lengths" "$msg"; fi
    if msg=$(check same "$W/syn_mpi" "$W/syn_one"); then ok "mpirun (wire) = one process (queue): $msg"
    else bad "mpirun vs one process" "$msg"; fi
else bad "mpirun vs one process" "a run failed"; tail_log syn_mpi; tail_log syn_one; fi
if mpi_rl dp2 3 2; then
    if msg=$(check lengths "$W/dp2" 4); then ok "DP=2 (train message to trainer rank 1, checked there): $msg"
    else bad "DP=2" "$msg"; fi
else bad "DP=2" "exit $?"; tail_log dp2; fi
if mpi_rl r3_mpi 2 1 actor.router_replay.mode=R3 rollout.dtype=bf16; then
    if msg=$(check replayed "$W/r3_mpi" 4); then ok "R3 under mpirun (routes over the wire): $msg"
    else bad "R3 under mpirun" "$msg"; fi
else bad "R3 under mpirun" "exit $?"; tail_log r3_mpi; fi
for par in actor.expert_parallel_size=2 actor.fsdp_config.fsdp_size=2 actor.pipeline_parallel_size=2; do
    if mpi_rl "mp_${par%%=*}" 3 2 "$par"; then
        if msg=$(check lengths "$W/mp_${par%%=*}" 4); then ok "trainer ranks with $par: $msg"
        else bad "$par" "$msg"; fi
    else bad "$par" "exit $?"; tail_log "mp_${par%%=*}"; fi
done

EPR=(actor.optim.lr=0 async_training.staleness_threshold=0 async_training.partial_rollout=false
     trainer.total_training_steps=6 actor.ppo_mini_batch_size=3 async_training.require_batches=2)
if mpi_rl ep_ref 3 1 "${EPR[@]}" && mpi_rl ep2 3 1 "${EPR[@]}" rollout.expert_parallel_size=2 &&
    grep -q "rollout EP: ranks 0..1 hold 4 experts each" "$W/ep2.log"; then
    if msg=$(check same "$W/ep2" "$W/ep_ref"); then ok "rollout EP 2 = 2 plain rollout ranks: $msg"
    else bad "rollout EP 2" "$msg"; fi
    if msg=$(check lengths "$W/ep2" 6); then ok "rollout EP 2: $msg"; else bad "rollout EP 2 lengths" "$msg"; fi
else bad "rollout EP 2" "a run failed or no EP line"; tail_log ep_ref; tail_log ep2; fi

# ---------------------------------------------------------------- crash and resume
RES=("${SYN[@]}" trainer.save_freq=1 trainer.resume_mode=auto)
mpi_rl res 2 1 "${RES[@]}" debug.test_fail_rank=1 debug.test_fail_version=3
rc1=$?
if [[ $rc1 -eq 0 || $rc1 -eq 124 ]]; then bad "crash and resume" "first run: exit $rc1 (expected the injected failure)"
    tail_log res
elif mpi_rl res 2 1 "${RES[@]}" && grep -q "resumed from .*: version 3" "$W/res.log"; then
    if msg=$(check same "$W/res" "$W/syn_mpi"); then ok "crash after version 3, resume = uninterrupted run: $msg"
    else bad "crash and resume" "$msg"; fi
else bad "crash and resume" "resumed run: exit $? or no 'resumed from ... version 3'"; tail_log res; fi
finish
