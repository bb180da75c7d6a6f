#!/usr/bin/env bash
# End to end: `moerl rl` with multi-turn rollouts and a tool (rollout.multi_turn.*). A tiny model is
# warm-started (SFT) on responses that are a calc tool call, so that its rollouts call the tool; the
# tool is an environment program (JSON lines) that dies on purpose while tests/…/broken exists. Checks:
#   - the dying environment stops the run with a message naming the tool, the program and the
#     trajectory, after a checkpoint; the folder is intact;
#   - with the environment fixed, the same command resumes and finishes: every prompt trained once;
#   - trajectories have tool turns: num_turns/max is 2, tool calls are counted, the samples' loss mask
#     is 0 exactly on the inserted tool turn, whose text is the template's tool turn holding the value
#     of the expression the model wrote (computed here independently), and 1 on every sampled token;
#   - the held-out validation ran the trajectories with the tool (val-aux/num_turns/mean > 1).
source "$(dirname "$0")/lib.sh"
BUILD=${BUILD:-build}
MOERL=$BUILD/moerl

# data: "Compute A+B." with the SFT response the tool call that computes it
"$PY" - "$W" <<'EOF'
import json, random, sys
w = sys.argv[1]
random.seed(3)
rows, seen = [], set()
while len(rows) < 72:
    a, b = random.randint(10, 99), random.randint(10, 99)
    if (a, b) in seen:
        continue
    seen.add((a, b))
    rows.append({"data_source": "arith", "prompt": [{"role": "user", "content": "Compute %d+%d." % (a, b)}],
                 "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                 "response": '<tool_call>{"name":"calc","arguments":{"expr":"%d+%d"}}</tool_call>' % (a, b)})
open(w + "/train.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in rows[:56]))
open(w + "/test.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in rows[56:]))
EOF
# the environment: integer + - * on the expression; dies (exit 3) on its 20th call while $W/broken exists
# (one process: validation runs its own, which never gets 20 calls of 16 trajectories of at most 2 turns)
cat >"$W/env.py" <<'EOF'
import ast, json, os, sys
broken = os.path.join(os.path.dirname(os.path.abspath(__file__)), "broken")
n = 0
def turns_train(folder):
    """Tool turns happened in training and were counted (no validation in this run)."""
    m = [r for r in records(folder + "/metrics.jsonl") if "num_turns/max" in r]
    if not m or max(r["num_turns/max"] for r in m) != 2 or not any(r["tool_calls/mean"] > 0 for r in m):
        return "no tool turn counted: %s" % [(r.get("num_turns/max"), r.get("tool_calls/mean")) for r in m]
    return "ok"

def ev(x):
    if isinstance(x, ast.Constant) and isinstance(x.value, int): return x.value
    if isinstance(x, ast.BinOp) and isinstance(x.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = ev(x.left), ev(x.right)
        return a + b if isinstance(x.op, ast.Add) else a - b if isinstance(x.op, ast.Sub) else a * b
    raise ValueError("only integers and + - *")
for line in sys.stdin:
    n += 1
    if n >= 20 and os.path.exists(broken):
        sys.stderr.write("env.py: dying on purpose\n")
        sys.exit(3)
    call = json.loads(line)
    try:
        out = {"content": str(ev(ast.parse(str(call["arguments"].get("expr", "")), mode="eval").body))}
    except Exception as e:
        out = {"error": "%s: %s" % (type(e).__name__, e)}
    print(json.dumps(out), flush=True)
EOF
cat >"$W/tools.yaml" <<EOF
- function:
    name: calc
    description: Evaluate integer arithmetic.
    parameters: {type: object, properties: {expr: {type: string}}, required: [expr]}
  command: $PY $W/env.py
EOF
cat >"$W/cfg.yaml" <<EOF
model: {hidden_size: 64, intermediate_size: 128, moe_intermediate_size: 64, num_hidden_layers: 2,
        num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, num_experts: 8, num_experts_per_tok: 2,
        max_position_embeddings: 256}
data: {train_files: $W/train.jsonl, val_files: $W/test.jsonl, max_response_length: 160,
       chat_template: tests/tools/chat_tools.jinja}
sft: {total_training_steps: 200, train_batch_size: 16, lr: 3.0e-3}
rollout:
  n: 4
  max_num_seqs: 32
  multi_turn: {enable: true, tool_config_path: $W/tools.yaml, max_assistant_turns: 2, tool_max_retries: 0,
               tool_num_workers: 1}
actor: {ppo_mini_batch_size: 4, optim: {lr: 1.0e-4}}
async_training: {staleness_threshold: 0.5, trigger_parameter_sync_step: 1, partial_rollout: true}
trainer: {total_training_steps: 6, test_freq: 3, save_freq: 2, val_n: 16, watchdog_s: 120}
EOF
run() {
    local name=$1
    shift
    "$MOERL" rl --config "$W/cfg.yaml" trainer.default_local_dir="$W/$name" "$@" >"$W/$name.log" 2>&1
}
tail_log() { tail -5 "$W/$1.log" | sed 's/^/    | /'; }

CHECK=$W/check.py
cat >"$CHECK" <<'EOF'
import ast, json, re, sys

def records(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]

def once(folder, total):
    """Every prompt trained exactly once over the run and its resume."""
    uids = [g["uid"] for g in records(folder + "/samples.jsonl") if "responses" in g]
    if len(uids) != total or len(set(uids)) != total:
        return "%d groups trained, %d distinct, want %d" % (len(uids), len(set(uids)), total)
    return "ok"

def turns(folder):
    """Tool turns happened and were counted."""
    m = [r for r in records(folder + "/metrics.jsonl") if "num_turns/max" in r]
    if not m:
        return "no num_turns metrics"
    if max(r["num_turns/max"] for r in m) != 2:
        return "num_turns/max never 2: %s" % [r["num_turns/max"] for r in m]
    if not any(r["tool_calls/mean"] > 0 for r in m):
        return "no tool call counted"
    v = [r for r in records(folder + "/metrics.jsonl") if "val-aux/num_turns/mean" in r]
    if not v or not any(r["val-aux/num_turns/mean"] > 1 for r in v):
        return "validation ran no tool turn: %s" % [r.get("val-aux/num_turns/mean") for r in v]
    return "ok"

def turns_train(folder):
    """Tool turns happened in training and were counted (no validation in this run)."""
    m = [r for r in records(folder + "/metrics.jsonl") if "num_turns/max" in r]
    if not m or max(r["num_turns/max"] for r in m) != 2 or not any(r["tool_calls/mean"] > 0 for r in m):
        return "no tool turn counted: %s" % [(r.get("num_turns/max"), r.get("tool_calls/mean")) for r in m]
    return "ok"

def ev(x):
    if isinstance(x, ast.Constant) and isinstance(x.value, int): return x.value
    if isinstance(x, ast.BinOp):
        a, b = ev(x.left), ev(x.right)
        return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(x.op)]
    raise ValueError

def masks(folder, tokenize):
    """mask 0 exactly on the inserted tool turn: the template's tool turn with the value of the call."""
    import subprocess
    checked = 0
    for g in records(folder + "/samples.jsonl"):
        for r in g.get("responses", []):
            ids, mask = r["ids"], r["loss_mask"]
            if len(ids) != len(mask) or set(mask) - {0, 1}:
                return "uid %d: mask of %d for %d ids" % (g["uid"], len(mask), len(ids))
            zeros = [i for i, v in enumerate(mask) if v == 0]
            if r["turns"] == 1:
                if zeros:
                    return "uid %d: one turn but %d inserted tokens" % (g["uid"], len(zeros))
                continue
            if not zeros or zeros != list(range(zeros[0], zeros[-1] + 1)):
                return "uid %d: the inserted tokens are not one run" % g["uid"]
            dec = lambda a: bytes(t for t in a if t < 256).decode("utf-8", "replace")
            first, ins = dec(ids[:zeros[0]]), ids[zeros[0]:zeros[-1] + 1]
            # the byte tokenizer: specials 257 <|im_start|>, 258 <|im_end|>
            if ids[zeros[0] - 1] != 258:
                return "uid %d: the sampled turn does not end with <|im_end|> before the tool turn" % g["uid"]
            m = re.search(r'<tool_call>(.*?)</tool_call>', first, re.S)
            text = "".join("<|im_start|>" if t == 257 else "<|im_end|>" if t == 258 else chr(t) for t in ins)
            try:
                call = json.loads(m.group(1))
                want = str(ev(ast.parse(str(call["arguments"]["expr"]), mode="eval").body))
            except Exception:
                continue  # a malformed call: answered with an error message
            if call.get("name") != "calc":
                if "Error: unknown tool '%s'" % call.get("name") not in text:
                    return "uid %d: unknown tool %r answered %r" % (g["uid"], call.get("name"), text)
                continue
            exp = "\n<|im_start|>tool\n%s<|im_end|>\n<|im_start|>assistant\n" % want
            if text != exp:
                return "uid %d: tool turn %r, want %r" % (g["uid"], text, exp)
            checked += 1
    return "ok %d tool turns checked" % checked if checked else "no well-formed tool turn to check"

r = globals()[sys.argv[1]](*[a if not a.isdigit() else int(a) for a in sys.argv[2:]])
print(r)
sys.exit(0 if r.startswith("ok") else 1)
EOF
check_py() {
    local name=$1
    shift
    local out
    if out=$("$PY" "$CHECK" "$@" 2>&1); then ok "$name ($out)"; else bad "$name" "$out"; fi
}

# --- a dying environment: stops after a checkpoint, with the tool, the program and the trajectory named
touch "$W/broken"
run mt
rc=$?
if [[ $rc -eq 1 ]]; then ok "environment dies: exit 1"; else bad "environment dies" "exit $rc, want 1"; tail_log mt; fi
for want in "tool 'calc'" "command '$PY $W/env.py'" "trajectory " "dying on purpose" "checkpoint at step" \
    "trainer.resume_mode=auto"; do
    if grep -qF -- "$want" "$W/mt.log"; then ok "the message names '$want'"
    else bad "message" "lacks '$want'"; tail_log mt; fi
done
[[ -d $W/mt/checkpoint ]] && ok "a checkpoint is on disk" || bad "checkpoint" "none in $W/mt"
cp "$W/mt.log" "$W/mt_failed.log"

# --- fixed: the same command resumes and finishes; every prompt trained once
rm -f "$W/broken"
if run mt trainer.resume_mode=auto; then
    if grep -q "resumed from" "$W/mt.log"; then ok "fixed: resumed"; else bad "fixed" "no 'resumed from'"; fi
    check_py "every prompt trained once" once "$W/mt" 24
    check_py "tool turns counted" turns "$W/mt"
    check_py "loss mask and tool turn ids" masks "$W/mt" x
else bad "fixed: resume" "exit $?"; tail_log mt; fi

# --- moerl eval runs the same trajectories with tools on the run's checkpoint
if "$MOERL" eval --model "$W/mt/checkpoint" --data "$W/test.jsonl" --max-new-tokens 160 \
    --chat-template tests/tools/chat_tools.jinja rollout.multi_turn.enable=true \
    rollout.multi_turn.tool_config_path="$W/tools.yaml" rollout.multi_turn.max_assistant_turns=2 \
    >"$W/eval.json" 2>"$W/eval.log"; then
    turns=$(tail -1 "$W/eval.json" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["metrics"]["val-aux/num_turns/mean"])')
    if "$PY" -c "import sys; sys.exit(0 if float('$turns') > 1 else 1)"; then ok "eval: trajectories with tools ($turns turns)"
    else bad "eval" "val-aux/num_turns/mean $turns, want > 1"; fi
else bad "eval" "exit $?: $(tail -2 "$W/eval.log")"; fi
# --- under mpirun (a rollout rank and a trainer rank; the groups cross the MPI wire with their loss masks
# and trajectory records): from the run's checkpoint, tool turns are counted and the masks check out
MOERL_MPI=$BUILD/moerl-mpi
if [[ ${MOERL_NO_MPI:-0} == 1 || ${NO_MPI:-0} == 1 ]]; then
    echo "skip mpirun: MOERL_NO_MPI=1 / NO_MPI=1"
elif [[ ! -x $MOERL_MPI ]] || ! command -v mpirun >/dev/null; then
    bad "mpirun" "no $MOERL_MPI or mpirun (install openmpi-bin libopenmpi-dev and rebuild, or set MOERL_NO_MPI=1)"
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    grep -v -e '^model:' -e '^        num_attention_heads' -e '^        max_position_embeddings' -e '^sft:' "$W/cfg.yaml" \
        >"$W/cfg_mpi.yaml"
    if OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout 300 mpirun --oversubscribe -np 2 "$MOERL_MPI" rl --config "$W/cfg_mpi.yaml" model.path="$W/mt/checkpoint" \
        trainer.n_ranks=1 trainer.total_training_steps=4 trainer.test_freq=0 trainer.save_freq=-1 \
        trainer.default_local_dir="$W/mpi" >"$W/mpi.log" 2>&1; then
        ok "mpirun: multi-turn job"
        check_py "mpirun: tool turns counted" turns_train "$W/mpi"
        check_py "mpirun: loss mask and tool turn ids" masks "$W/mpi" x
    else bad "mpirun" "exit $?"; tail_log mpi; fi
fi

expect_err "eval: a multi-turn key without enable" "tool_config_path is set but rollout.multi_turn.enable is false" \
    "$MOERL" eval --model "$W/mt/checkpoint" --data "$W/test.jsonl" rollout.multi_turn.tool_config_path="$W/tools.yaml"
finish
