#!/usr/bin/env bash
# End-to-end tests of the command line: score against the PyTorch reference, generate, sft,
# tasks, eval, and clear errors on bad input. Ends with "N passed, N failed".
EXPECT_ERR_GREP=-qi  # expect_err: case-insensitive patterns
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
TD=${MOERL_TESTDATA:-$BUILD/testdata}
# expect_err "what" "substring" cmd...: non-zero exit below 128 (no crash) and the message

# --- score agrees with the PyTorch reference (gen_model.py's model_b_score.safetensors)
toks=$($PY - "$TD/model_b_score.safetensors" <<'PYEOF'
import sys; sys.path.insert(0, "tests/ref"); import st_io
print(",".join(str(int(x)) for x in st_io.load(sys.argv[1])["tokens"]))
PYEOF
)
$M score --model "$TD/model_b" --tokens "$toks" >"$W/score.json" 2>"$W/err"
check "score runs" test $? -eq 0
$PY - "$W/score.json" "$TD/model_b_score.safetensors" <<'PYEOF'
import json, sys
sys.path.insert(0, "tests/ref"); import st_io
got = json.load(open(sys.argv[1])); ref = st_io.load(sys.argv[2])
lp = ref["token_logprobs"].tolist()
assert len(got["token_logprobs"]) == len(lp), "length"
# fp32 C vs float64 reference through 2 layers: 2e-5 absolute (as tests/test_model.c)
assert max(abs(a - b) for a, b in zip(got["token_logprobs"], lp)) < 2e-5, "token_logprobs"
assert abs(got["ce_loss"] - float(ref["ce_loss"][0])) < 2e-5, "ce_loss"
assert abs(got["aux_loss"] - float(ref["aux_loss"][0])) < 1e-5, "aux_loss"
PYEOF
check "score matches the PyTorch reference" test $? -eq 0
expect_err "score: unknown model dir" "config.json" $M score --model "$W/nope" --tokens 1,2,3
expect_err "score: bad token list" "integers" $M score --model "$TD/model_b" --tokens 1,x,3
expect_err "score: token outside vocab" "vocabulary" $M score --model "$TD/model_b" --tokens 1,99999

# --- generate
$M generate --model "$TD/model_b" --prompt-tokens 1,5,9 --max-new-tokens 12 --temperature 0.8 --top-p 0.9 -n 3 --seed 4 >"$W/gen.jsonl" 2>"$W/err"
check "generate runs" test $? -eq 0
$PY - "$W/gen.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, len(rows)
for r in rows:
    assert len(r["tokens"]) == len(r["logprobs"]) == len(r["versions"]) <= 12
    assert r["finish_reason"] in ("stop", "length")
    assert all(lp <= 0 for lp in r["logprobs"])
PYEOF
check "generate output schema" test $? -eq 0
# greedy is deterministic
$M generate --model "$TD/model_b" --prompt-tokens 3,4 --max-new-tokens 10 --temperature 0 >"$W/g1" 2>/dev/null
$M generate --model "$TD/model_b" --prompt-tokens 3,4 --max-new-tokens 10 --temperature 0 --max-num-seqs 1 >"$W/g2" 2>/dev/null
check "greedy generate reproducible" cmp -s "$W/g1" "$W/g2"
expect_err "generate: unknown model dir" "config.json" $M generate --model "$W/nope" --prompt-tokens 1,2
expect_err "generate: negative temperature" "temperature" $M generate --model "$TD/model_b" --prompt-tokens 1,2 --temperature -1
expect_err "generate: top-p out of range" "top-p" $M generate --model "$TD/model_b" --prompt-tokens 1,2 --top-p 1.5
expect_err "generate: prompt longer than the context" "max_position_embeddings" $M generate --model "$TD/model_b" --prompt-tokens "$(for i in $(seq 1 40000); do printf '1,'; done)1" --max-new-tokens 4
expect_err "generate: --prompts without tokenizer" "tokenizer" $M generate --model "$TD/model_b" --prompts /dev/null

# --- tasks, sft, eval, generate with text
$M tasks --task arith --out "$W/arith" --n-train 64 --n-test 16 >/dev/null 2>&1
check "tasks writes files" test -s "$W/arith/train.jsonl" -a -s "$W/arith/test.jsonl"
expect_err "tasks: unknown task" "unknown" $M tasks --task nosuch --out "$W/x"
cat >"$W/sft.yaml" <<YEOF
model: {hidden_size: 32, intermediate_size: 64, moe_intermediate_size: 32, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_experts: 4, num_experts_per_tok: 2}
data: {task: "", train_files: $W/arith/train.jsonl, val_files: $W/arith/test.jsonl, train_batch_size: 16}
trainer: {total_training_steps: 3, default_local_dir: $W/sft, val_n: 8}
YEOF
$M sft --config "$W/sft.yaml" >"$W/sft.out" 2>"$W/err"
check "sft runs" test $? -eq 0
check "sft writes a checkpoint" test -s "$W/sft/checkpoint/model.safetensors" -a -s "$W/sft/checkpoint/config.json"
check "sft writes metrics" test "$(wc -l <"$W/sft/metrics.jsonl")" -ge 3
check "sft records its config" grep -q "total_training_steps: 3" "$W/sft/config.yaml"
$M eval --model "$W/sft/checkpoint" --data "$W/arith/test.jsonl" --n 8 >"$W/eval.json" 2>/dev/null
check "eval prints accuracy" grep -q '"accuracy"' "$W/eval.json"
$M generate --model "$W/sft/checkpoint" --prompts "$W/arith/test.jsonl" --max-new-tokens 6 --temperature 0 >"$W/gt.jsonl" 2>/dev/null
check "generate --prompts gives text" test "$(grep -c '"text"' "$W/gt.jsonl")" -eq 16
expect_err "sft: unknown key" "did you mean" $M sft --config "$W/sft.yaml" trainer.total_trainig_steps=3
expect_err "sft: wrong type" "int" $M sft --config "$W/sft.yaml" data.train_batch_size=abc
# moerl rl's keys given to moerl sft: its spelling of an sft key names sft's key; a typo of it gets sft's
# "did you mean"; a key only rl has is named as rl's
expect_err "sft: rl's actor.optim.lr names sft's optim.lr" "is moerl rl's spelling; moerl sft's key is 'optim.lr'" \
    $M sft --config "$W/sft.yaml" actor.optim.lr=3
expect_err "sft: a typo of rl's spelling" "(did you mean 'optim.lr'? moerl sft spells moerl rl's actor.optim.* as optim.*)" \
    $M sft --config "$W/sft.yaml" actor.optim.lrr=3
expect_err "sft: an rl-only key" "'rollout.n' is a key of moerl rl, not of moerl sft" $M sft --config "$W/sft.yaml" rollout.n=4
# model parallelism in one process: rl's check and words (par_check_ranks) with sft's advice, before the model is
# built (no "new model" line) and before any folder exists
expect_err "sft: EP in one process needs mpirun" "splits the model over trainer ranks: run under mpirun with build/moerl-mpi and ≥ 2 processes" \
    $M sft --config "$W/sft.yaml" actor.expert_parallel_size=2 trainer.default_local_dir="$W/sft_ep"
check "sft: EP in one process refused before the model is built, no folder" \
    bash -c "! grep -q 'new model' '$W/err' && [[ ! -e '$W/sft_ep' ]]"
printf '{"data_source": "arith", "prompt": "not a list"}\n' >"$W/bad.jsonl"
expect_err "sft: malformed dataset line" "bad.jsonl:1" $M sft --config "$W/sft.yaml" data.train_files="$W/bad.jsonl"
expect_err "unknown command" "unknown command" $M frobnicate

# --- input checks found by a new user's review
RS=(--config examples/smoke.yaml sft.total_training_steps=0 trainer.val_n=4)
expect_err "rl: int beyond 32 bits" "32-bit" $M rl "${RS[@]}" trainer.default_local_dir="$W/r1" rollout.n=4294967300
expect_err "rl: non-finite lr" "actor.optim.lr" $M rl "${RS[@]}" trainer.default_local_dir="$W/r2" actor.optim.lr=inf
expect_err "rl: response longer than the context" "max_position_embeddings" $M rl "${RS[@]}" trainer.default_local_dir="$W/r3" data.max_response_length=500
expect_err "rl: batch larger than the data" "training data has only" $M rl "${RS[@]}" trainer.default_local_dir="$W/r4" actor.ppo_mini_batch_size=1000
expect_err "rl: --config required" "required" $M rl
expect_err "eval: a directory as data file" "not a regular file" $M eval --model "$TD/model_b" --data "$W"
expect_err "score: more tokens than the context" "context" $M score --model "$TD/model_b" --tokens "$(seq -s, 1 40000 | sed 's/[0-9]*/3/g')"
mkdir -p "$W/busy"
( flock -x "$W/busy/.moerl.lock" -c 'sleep 5' & ) ; sleep 0.3
expect_err "rl: output folder in use" "in use" $M rl "${RS[@]}" trainer.default_local_dir="$W/busy"

# --- second review: data fingerprint on resume, model.* with model.path, non-finite weights, data_source
$M rl "${RS[@]}" trainer.default_local_dir="$W/fp" trainer.total_training_steps=2 >/dev/null 2>&1
cp "$W/fp/config.yaml" "$W/fpcfg.before"
expect_err "rl: resume on other data refused" "other training data" $M rl "${RS[@]}" trainer.default_local_dir="$W/fp" trainer.total_training_steps=4 data.seed=5
check "rl: the refused resume kept the run's config.yaml" cmp -s "$W/fpcfg.before" "$W/fp/config.yaml"
# model.path on the command line wins over the file's model.* keys (named in a warning); model.*
# keys given beside it on the command line, or beside a model.path in the file, are all named at once
$M sft --config "$W/sft.yaml" model.path="$W/sft/checkpoint" trainer.default_local_dir="$W/sft2" >/dev/null 2>"$W/err"
check "sft: model.path on the command line wins over the file's model.*" test $? -eq 0
check "sft: the ignored model.* keys are named" grep -q "ignored from the config file: model.hidden_size (.*sft.yaml:1)" "$W/err"
expect_err "sft: model.* beside model.path on the command line" "model.num_experts (command line)" $M sft --config "$W/sft.yaml" model.path="$W/sft/checkpoint" model.num_experts=4 trainer.default_local_dir="$W/sft2b"
printf 'model: {path: %s, hidden_size: 32, num_experts: 4}\n' "$W/sft/checkpoint" >"$W/mp.yaml"
expect_err "rl: model.* beside model.path in a file: every key in one message" "model.hidden_size (.*model.num_experts (" $M rl --config "$W/mp.yaml" trainer.default_local_dir="$W/mp"
cp -r "$W/sft/checkpoint" "$W/nanckpt"
$PY - "$W/nanckpt/model.safetensors" <<'PYEOF'
import sys; sys.path.insert(0, "tests/ref"); import st_io, torch
t = st_io.load(sys.argv[1]); t["model.embed_tokens.weight"][3, 5] = float("nan"); st_io.save(t, sys.argv[1])
PYEOF
expect_err "score: NaN weights refused" "non-finite" $M score --model "$W/nanckpt" --tokens 1,2,3
sed 's/"data_source": *"arith"/"data_source": "nosuch"/' "$W/arith/test.jsonl" >"$W/badsrc.jsonl"
# sft trains on any data_source (training needs no reward; issue 28 review): the held-out rows without a
# reward are named once, with their file, and no accuracy is reported (rl and eval refuse them, below)
if $M sft --config "$W/sft.yaml" data.val_files="$W/badsrc.jsonl" trainer.default_local_dir="$W/sft3" >"$W/out" 2>"$W/err" &&
    [[ $(grep -c "data_source 'nosuch' (.*badsrc.jsonl) have no built-in reward" "$W/err") == 1 ]] &&
    [[ $(tail -1 "$W/out" | json_field accuracy_after) == None ]]; then ok
else bad "sft: unknown data_source named once, no accuracy: $(tail -2 "$W/err")"; fi


# --- issue 9: new-user findings in the command line
# an error built from the previous error keeps the file:line once and the bad name
expect_err "rl: unknown data_source named once with the file" "badsrc.jsonl:1: no reward function for data_source 'nosuch'" $M rl "${RS[@]}" data.task= data.train_files="$W/arith/train.jsonl" data.val_files="$W/badsrc.jsonl" trainer.default_local_dir="$W/ds"
check "rl: the file:line prefix is not doubled" test "$(grep -o 'badsrc.jsonl:1' "$W/err" | wc -l)" -eq 1
expect_err "eval: unknown data_source names the file" "badsrc.jsonl:1: no reward function" $M eval --model "$W/sft/checkpoint" --data "$W/badsrc.jsonl"
: >"$W/empty.jsonl"
expect_err "eval: empty data names the file" "empty.jsonl" $M eval --model "$W/sft/checkpoint" --data "$W/empty.jsonl"
check "eval: no doubled 'eval: eval:'" bash -c "! grep -q 'eval: eval:' '$W/err'"
# flags: unknown / another task's options are errors; help and version
expect_err "tasks: --digits for countdown" "arith task only" $M tasks --task countdown --digits 3 --out "$W/cd"
check "tasks: nothing written after a refused flag" test ! -e "$W/cd"
expect_err "tasks: unknown flag" "unknown option '--bogus'" $M tasks --task arith --out "$W/cd" --bogus 1
expect_err "tasks: --numbers for arith" "countdown task only" $M tasks --task arith --numbers 3 --out "$W/cd"
$M tasks --task countdown --numbers 3 --out "$W/cd3" --n-train 8 --n-test 4 >/dev/null 2>&1
check "tasks: --numbers 3 gives 3 numbers" grep -q '"numbers": *\[[0-9]*, *[0-9]*, *[0-9]*\]' "$W/cd3/test.jsonl"
expect_err "rl: an unknown flag" "unknown option '--total-steps'" $M rl --config examples/smoke.yaml --total-steps 3
expect_err "rl: --config=FILE is read" "unknown key 'rollout.nn'" $M rl --config=examples/smoke.yaml rollout.nn=3
$M help >"$W/out" 2>&1
check "moerl help" bash -c "[[ \$? -eq 0 ]] && grep -q 'commands:' '$W/out'"
$M help rl >"$W/out" 2>&1
check "moerl help rl lists the rl keys" grep -q "trainer.overwrite_output_dir" "$W/out"
$M --version >"$W/out" 2>&1
check "moerl --version" grep -q "^moerl [0-9]" "$W/out"
# every JSON line is valid JSON, whatever the paths hold (quotes, spaces, backslashes)
Q="$W/q \"dq\" back\\slash"
$M tasks --task arith --out "$Q/t" --n-train 16 --n-test 8 >"$W/tasks.json" 2>/dev/null
$M sft --config "$W/sft.yaml" trainer.default_local_dir="$Q/s" >"$W/sft.json" 2>/dev/null
$M eval --model "$Q/s/checkpoint" --data "$Q/t/test.jsonl" >"$W/eval.json" 2>/dev/null
$M rl "${RS[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$Q/r" >"$W/rl.json" 2>"$W/err"
$PY - "$W" "$Q" <<'PYEOF'
import json, sys
w, q = sys.argv[1], sys.argv[2]
t = json.load(open(w + "/tasks.json")); assert t["train"] == q + "/t/train.jsonl", t
s = json.load(open(w + "/sft.json")); assert s["checkpoint"] == q + "/s/checkpoint", s
e = json.load(open(w + "/eval.json")); assert e["data"] == q + "/t/test.jsonl" and 0 <= e["accuracy"] <= 1, e
r = json.loads(open(w + "/rl.json").read().strip().splitlines()[-1])
assert r["output_dir"] == q + "/r", r
assert r["accuracy_sft"] is None, "no warm start: accuracy_sft must be null, got %r" % r["accuracy_sft"]
assert r["steps"] == 2 and r["tokens_generated"] > 0, r
PYEOF
check "tasks/sft/eval/rl print valid JSON for paths with quotes and backslashes" test $? -eq 0
check "rl: the plot is drawn in a folder with quotes (or gnuplot is absent)" bash -c "[[ -s '$Q/r/reward_accuracy.png' ]] || ! command -v gnuplot >/dev/null"
check "rl: final tokens/s says what it counts" grep -q "generated tokens/s (rollout output" "$W/err"
# A folder name that a shell would run: the plot must not run it. Active once the RL job draws
# with base/plot.c (moerl_plot_reward_accuracy) instead of system().
if grep -q 'system(' src/rl/job.c; then
    echo "note: src/rl/job.c still draws the plot with system(): the \$(...) folder check waits for it"
else
    P="$W/it's a '\$(touch pwned)' \`touch pwned2\` 'x" # balanced quotes: a spliced path would run both
    (cd "$W" && "$OLDPWD/$M" rl "${RS[@]/#examples/$OLDPWD/examples}" trainer.total_training_steps=2 trainer.default_local_dir="$P" >/dev/null 2>&1)
    check "rl: a folder named with \$(...) runs nothing" bash -c "[[ ! -e '$W/pwned' && ! -e '$W/pwned2' && ! -e pwned ]]"
    check "rl: and gets its plot" bash -c "[[ -s \"\$1/reward_accuracy.png\" ]] || ! command -v gnuplot >/dev/null" _ "$P"
fi
# generate: rows with only "prompt" (a string or messages), input order, the checkpoint's version
printf '{"prompt": "What is 2+3?"}\n\n{"prompt": [{"role": "user", "content": "12+30="}]}\n{"prompt": "7+1"}\n' >"$W/p.jsonl"
$M generate --model "$Q/r/checkpoint" --prompts "$W/p.jsonl" --max-new-tokens 5 -n 3 --seed 2 >"$W/gen.jsonl" 2>"$W/err"
check "generate: prompt-only rows" test $? -eq 0
$PY - "$W/gen.jsonl" "$Q/r/checkpoint/trainer_state.json" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
v = json.load(open(sys.argv[2]))["version"]
assert v == 2, v
assert [(r["prompt_index"], r["sample"]) for r in rows] == [(i, j) for i in range(3) for j in range(3)], "order"
assert all(x == v for r in rows for x in r["versions"]), "versions must be the checkpoint's %d" % v
PYEOF
check "generate: input order and the checkpoint's policy version" test $? -eq 0
printf '{"prompt": 5}\n' >"$W/p2.jsonl"
expect_err "generate: a bad prompt names file:line" "p2.jsonl:1: field 'prompt'" $M generate --model "$Q/r/checkpoint" --prompts "$W/p2.jsonl"
# resume_mode=disable into a folder holding a run is refused; trainer.overwrite_output_dir starts anew
cp "$Q/r/metrics.jsonl" "$W/m.before"
expect_err "rl: resume_mode=disable over a run is refused" "trainer.overwrite_output_dir=true" $M rl "${RS[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$Q/r" trainer.resume_mode=disable
check "rl: the refused run changed nothing" cmp -s "$W/m.before" "$Q/r/metrics.jsonl"
expect_err "rl: overwrite with resume_mode=auto is contradictory" "resume_mode=disable" $M rl "${RS[@]}" trainer.default_local_dir="$Q/r" trainer.overwrite_output_dir=true
$M rl "${RS[@]}" trainer.total_training_steps=1 trainer.default_local_dir="$Q/r" trainer.resume_mode=disable trainer.overwrite_output_dir=true >/dev/null 2>&1
check "rl: overwrite_output_dir starts anew" bash -c "[[ \$? -eq 0 ]] && grep -q '\"version\": 1,' \"\$1/r/checkpoint/trainer_state.json\" && [[ \$(grep -c '\"actor/pg_loss\"' \"\$1/r/metrics.jsonl\") -eq 1 ]]" _ "$Q"
# a stray FILE named checkpoint: a clear error on the first run
mkdir -p "$W/stray" && : >"$W/stray/checkpoint"
expect_err "rl: a file named checkpoint" "stray/checkpoint' is a file" $M rl "${RS[@]}" trainer.default_local_dir="$W/stray"
check "rl: nothing written beside the stray file" test ! -e "$W/stray/config.yaml"
# a run that fails validation leaves no folder behind (a new one; parents it made are removed too)
expect_err "rl: batch larger than the data (new folder)" "training data has only" $M rl "${RS[@]}" trainer.default_local_dir="$W/nf/deep/run" actor.ppo_mini_batch_size=1000
check "rl: a failed start leaves no folder" test ! -e "$W/nf"
expect_err "rl: bad model config (new folder)" "hidden_size" $M rl "${RS[@]}" trainer.default_local_dir="$W/nf2" model.hidden_size=0
check "rl: a bad model config leaves no folder" test ! -e "$W/nf2"
expect_err "sft: bad data (new folder)" "bad.jsonl:1" $M sft --config "$W/sft.yaml" data.train_files="$W/bad.jsonl" trainer.default_local_dir="$W/nf3"
check "sft: a failed start leaves no folder" test ! -e "$W/nf3"
# the gsm8k-style generator agrees in number ("1 hour", not "1 hours")
$M tasks --task gsm8k-style --out "$W/gsm" --n-train 3000 --n-test 100 >/dev/null 2>&1
check "gsm8k-style: no '1 <plural>'" bash -c "! grep -qE '(^|[^0-9.])1 (hours|dollars|pages|boys|girls|apples|marbles|stickers|pencils|cards|shells|coins|beads)' '$W/gsm/train.jsonl'"
check "gsm8k-style: '1 hour' does occur (the case is exercised)" grep -q "for 1 hour[,.]" "$W/gsm/train.jsonl"

# --- third review: output-folder and data.* checks before anything is written; eval's cap; a dense
# model; grad_compression in one process
cp "$W/sft/config.yaml" "$W/sftcfg.before"
expect_err "rl: into a moerl sft folder is refused before the warm start" "without trainer_state.json" $M rl --config examples/smoke.yaml trainer.default_local_dir="$W/sft" trainer.val_n=4
check "rl: the refused run wrote nothing into the sft folder" bash -c "cmp -s '$W/sftcfg.before' '$W/sft/config.yaml' && [[ ! -e '$W/sft/sft_checkpoint' && ! -e '$W/sft/sft_metrics.jsonl' && ! -e '$W/sft/run.log' ]]"
mkdir -p "$W/ws/sft_checkpoint" # what a moerl rl run stopped in its warm start leaves
expect_err "sft: into a moerl rl folder is refused" "ws' holds a moerl rl run (sft_checkpoint)" $M sft --config "$W/sft.yaml" trainer.default_local_dir="$W/ws"
check "sft: nothing written into the rl folder" bash -c "[[ ! -e '$W/ws/checkpoint' && ! -e '$W/ws/config.yaml' && ! -e '$W/ws/data' ]]"
expect_err "rl: data.train_files beside data.task names both keys" "data.task='arith' (examples/smoke.yaml:14) generates the data, so data.train_files='nope.jsonl' (command line)" $M rl "${RS[@]}" trainer.default_local_dir="$W/tf" data.train_files=nope.jsonl
check "rl: refused data keys leave no folder" test ! -e "$W/tf"
expect_err "rl: data.n_test=0 with held-out evals names data.n_test" "data.n_test=0 generates no held-out rows, but trainer.val_n=4" $M rl "${RS[@]}" trainer.default_local_dir="$W/nt" data.n_test=0
check "rl: data.n_test=0 refused before any folder" test ! -e "$W/nt"
# files given while data.task keeps its default (the config does not name a task): the files are read
grep -v "task: arith" examples/smoke.yaml >"$W/notask.yaml"
$M rl --config "$W/notask.yaml" sft.total_training_steps=0 trainer.total_training_steps=1 trainer.val_n=0 \
    trainer.test_freq=0 data.train_files="$W/arith/train.jsonl" data.val_files="$W/arith/test.jsonl" \
    trainer.default_local_dir="$W/deftask" >"$W/out" 2>"$W/err"
check "rl: files with data.task at its default are read ($(tail -c 200 "$W/err"))" test $? -eq 0
head -3 "$W/arith/test.jsonl" >"$W/val3.jsonl"
$M rl --config "$W/notask.yaml" sft.total_training_steps=0 trainer.total_training_steps=1 trainer.val_n=50 \
    trainer.test_freq=0 data.train_files="$W/arith/train.jsonl" data.val_files="$W/val3.jsonl" \
    trainer.default_local_dir="$W/val3" >"$W/out" 2>"$W/err"
check "rl: trainer.val_n beyond the held-out rows warns with both counts" bash -c "[[ $? -eq 0 ]] && grep -q 'trainer.val_n=50, but the held-out split ($W/val3.jsonl) has 3 rows' '$W/err'"
expect_err "sft: data.n_test=0 names data.n_test" "data.n_test=0 generates no held-out rows" $M sft --config "$W/sft.yaml" data.task=arith data.train_files= data.val_files= data.n_test=0 trainer.default_local_dir="$W/nt2"
: >"$W/noval.jsonl"
expect_err "rl: an empty data.val_files with held-out evals" "data.val_files '$W/noval.jsonl' has no rows" $M rl "${RS[@]}" data.task= data.train_files="$W/arith/train.jsonl" data.val_files="$W/noval.jsonl" trainer.default_local_dir="$W/nt4"
$M rl --config examples/smoke.yaml sft.total_training_steps=2 data.n_test=0 trainer.val_n=0 trainer.test_freq=0 trainer.total_training_steps=1 trainer.default_local_dir="$W/nt3" >"$W/nt3.json" 2>"$W/err"
rc=$?
check "rl: data.n_test=0 with trainer.val_n=0 runs, the warm start without held-out evals" bash -c "[[ $rc -eq 0 ]] && grep -q 'no held-out evaluation (trainer.val_n=0)' '$W/err' && grep -q '\"accuracy_sft\":null' '$W/nt3.json'"
$M eval --model "$W/sft/checkpoint" --data "$W/arith/test.jsonl" --n 2 >"$W/e1.json" 2>/dev/null
$M eval --model "$W/sft/checkpoint" --data "$W/arith/test.jsonl" --n 2 --max-new-tokens 5 >"$W/e2.json" 2>/dev/null
check "eval: reports its response cap (default 16, --max-new-tokens)" bash -c "grep -q '\"max_new_tokens\":16' '$W/e1.json' && grep -q '\"max_new_tokens\":5' '$W/e2.json'"
check "eval --help documents the default cap" bash -c "$M eval --help | grep -q 'max-new-tokens N .*default 16'"
$M rl "${RS[@]}" model.num_experts=0 actor.grad_compression=onebit trainer.total_training_steps=1 trainer.default_local_dir="$W/dense" >/dev/null 2>"$W/err"
rc=$?
check "rl: model.num_experts=0 runs as a dense model" bash -c "[[ $rc -eq 0 ]] && grep -q 'dense (model.num_experts=0' '$W/err'"
check "rl: num_experts_per_tok beside num_experts=0 is named unused" grep -q "model.num_experts_per_tok=2 is unused" "$W/err"
check "rl: grad_compression in one process warns it has no effect" grep -q "actor.grad_compression=onebit .*no effect" "$W/err"
expect_err "rl: top-k above the experts" "exceeds 'num_experts'" $M rl "${RS[@]}" model.num_experts=1 trainer.default_local_dir="$W/k"

# --- fourth review: a refused resume leaves every file of the run's folder as it was (config.yaml, data/,
# run.log); generated data files are named by what determines their rows; sync mode names an unused key
snap() { (cd "$1" && find . -type f ! -name .moerl.lock -print0 | sort -z | xargs -0 md5sum); }
$M rl "${RS[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$W/ra" >/dev/null 2>&1
cp -r "$W/ra" "$W/rb"
snap "$W/rb" >"$W/rb.before"
expect_err "rl: resume with another model.hidden_size refused" "field 'hidden_size' is 64 in the file but 128" $M rl "${RS[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$W/rb" model.hidden_size=128
check "rl: the refused model change left the folder as it was (config.yaml too)" bash -c "diff <(cd '$W/rb' && find . -type f ! -name .moerl.lock -print0 | sort -z | xargs -0 md5sum) '$W/rb.before'"
expect_err "rl: resume with data.task=countdown refused, naming the key" "data.task was \"arith\", now \"countdown\"" $M rl "${RS[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$W/rb" data.task=countdown model.max_position_embeddings=256
check "rl: the refused countdown resume generated nothing into data/" bash -c "[[ \$(ls -A '$W/rb/data' | grep -vc '^arith-') -eq 0 ]] && diff <(cd '$W/rb' && find . -type f ! -name .moerl.lock -print0 | sort -z | xargs -0 md5sum) '$W/rb.before'"
CDK=(data.task=countdown model.max_position_embeddings=256 trainer.total_training_steps=2)
$M rl "${RS[@]}" "${CDK[@]}" trainer.default_local_dir="$W/cdr" >/dev/null 2>&1
check "rl: countdown data named by its own options, not arith's" bash -c "ls '$W/cdr/data' | grep -qx 'countdown-k4-m25-t100-s1-test32-train96.jsonl' && ! ls '$W/cdr/data' | grep -q -- '-d2-'"
snap "$W/cdr" >"$W/cdr.before"
expect_err "rl: resume with data.countdown_numbers=3 refused, naming the key" "data.countdown_numbers was 4, now 3" $M rl "${RS[@]}" "${CDK[@]}" trainer.default_local_dir="$W/cdr" data.countdown_numbers=3
check "rl: the refused countdown_numbers resume left data/ as it was" bash -c "diff <(cd '$W/cdr' && find . -type f ! -name .moerl.lock -print0 | sort -z | xargs -0 md5sum) '$W/cdr.before'"
$M rl "${RS[@]}" trainer.total_training_steps=1 trainer.default_local_dir="$W/sy" async_training.mode=sync async_training.trigger_parameter_sync_step=4 >/dev/null 2>"$W/err"
check "rl: sync mode warns that the given trigger_parameter_sync_step is not used" grep -q "WARN .*async_training.trigger_parameter_sync_step=4 is not used: async_training.mode=sync syncs the weights after every step" "$W/err"
$M rl "${RS[@]}" trainer.total_training_steps=1 trainer.default_local_dir="$W/sy2" async_training.mode=sync >/dev/null 2>"$W/err"
check "rl: sync mode with the key at its default warns nothing about it" bash -c "! grep -q 'trigger_parameter_sync_step=.* is not used' '$W/err'"
# moerl sft: refused resumes (trainer.seed, data.seed, model shape, resume_mode=disable) change nothing
SG=(--config "$W/sft.yaml" data.task=arith data.train_files= data.val_files= data.n_train=64 data.n_test=8)
$M sft "${SG[@]}" trainer.default_local_dir="$W/sr" >"$W/sr1.json" 2>/dev/null
snap "$W/sr" >"$W/sr.before"
expect_err "sft: resume with another trainer.seed refused" "trainer.seed 1 (now 9)" $M sft "${SG[@]}" trainer.default_local_dir="$W/sr" trainer.seed=9
expect_err "sft: resume on other data refused, naming the key" "data.seed was 1, now 3" $M sft "${SG[@]}" trainer.default_local_dir="$W/sr" data.seed=3
expect_err "sft: resume with another model shape refused" "hidden_size" $M sft "${SG[@]}" trainer.default_local_dir="$W/sr" model.hidden_size=64
expect_err "sft: resume_mode=disable over a checkpoint refused" "trainer.overwrite_output_dir=true" $M sft "${SG[@]}" trainer.default_local_dir="$W/sr" trainer.resume_mode=disable
check "sft: the refused resumes left the folder as it was (config.yaml, data/)" bash -c "diff <(cd '$W/sr' && find . -type f ! -name .moerl.lock -print0 | sort -z | xargs -0 md5sum) '$W/sr.before'"
$M sft "${SG[@]}" trainer.default_local_dir="$W/sr" >"$W/sr2.json" 2>/dev/null
$PY - "$W/sr1.json" "$W/sr2.json" <<'PYEOF'
import json, sys
a, b = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:3])
assert a["accuracy_after"] is not None and b["accuracy_after"] == a["accuracy_after"], (a, b)
assert b["accuracy_before"] == a["accuracy_before"], (a, b)
PYEOF
check "sft: a rerun with nothing left to do reports the recorded accuracy_after" test $? -eq 0

# ---- refusals of the option table and the small commands
$M tasks --task gsm8k-style --format gsm8k --out "$W/g8" >/dev/null 2>&1
cp "$W/g8/train.jsonl" "$W/g8_train_copy.jsonl"
expect_err "tasks --from-gsm8k over its own input" "over its own input" $M tasks --from-gsm8k "$W/g8/train.jsonl" --out "$W/g8"
check "tasks --from-gsm8k: the refused input is untouched" cmp -s "$W/g8/train.jsonl" "$W/g8_train_copy.jsonl"
expect_err "init --tokenizer-from a folder without tokenizer.json" "tokenizer-from '$W/nope'" $M init --out "$W/i1" --tokenizer-from "$W/nope"
check "init --tokenizer-from refused: no folder made" test ! -e "$W/i1/config.json"
check "init --shard-mb 0 writes one file" $M init --out "$W/i0" --shard-mb 0
check "init --shard-mb 0: model.safetensors, no index" test -f "$W/i0/model.safetensors" -a ! -f "$W/i0/model.safetensors.index.json"
expect_err "export-gguf --out a folder" "is a folder" $M export-gguf --model "$W/i0" --out "$W" --force
expect_err "a numeric option given twice" "-n given twice ('2' and '3')" $M generate --model "$W/i0" --prompt-tokens 1,2 -n 2 -n 3
expect_err "a choice option given twice" "--dtype given twice" $M export-gguf --model "$W/i0" --out "$W/x.gguf" --dtype bf16 --dtype f32

expect_err "rl: a step larger than the data, refused before the warm start" "a trainer step needs 1000 prompts" \
    $M rl --config examples/smoke.yaml actor.ppo_mini_batch_size=1000 trainer.default_local_dir="$W/big_step"
check "rl: that refusal leaves no folder (no warm start ran)" test ! -e "$W/big_step"

expect_err "tasks --from-gsm8k with a generator option" "--from-gsm8k takes --out DIR only" \
    $M tasks --from-gsm8k "$W/g8_train_copy.jsonl" --out "$W/g9" --n-train 5
check "tasks --from-gsm8k alone still converts" $M tasks --from-gsm8k "$W/g8_train_copy.jsonl" --out "$W/g9"

expect_err "tokenize --skip-special without --decode" "--skip-special applies with --decode" \
    $M tokenize --model "$W/i0" --text hi --skip-special
expect_err "tokenize --no-thinking without --chat" "apply with --chat" $M tokenize --model "$W/i0" --text hi --no-thinking

expect_err "rl: rollout.temperature=inf refused with the config" "rollout.temperature must be a finite number" \
    $M rl --config examples/smoke.yaml rollout.temperature=inf trainer.default_local_dir="$W/inf_t"
check "rl: the temperature refusal leaves no folder" test ! -e "$W/inf_t"

# --- verl users' keys (src/rl/config.c): accepted with verl's meaning, or a warning when a key does nothing
# verl's DAPO spelling: clip_ratio for the side not given (its values: test_rl_keys)
$M rl --config examples/smoke.yaml actor.clip_ratio=0.1 actor.clip_ratio_high=0.3 sft.total_training_steps=0 \
    trainer.total_training_steps=1 trainer.default_local_dir="$W/cr" >"$W/out" 2>"$W/err"
check "rl: actor.clip_ratio with actor.clip_ratio_high runs (rc $?)" grep -q '"steps":1' "$W/out"
$M plan --config examples/smoke.yaml actor.clip_ratio=0.1 >"$W/out" 2>"$W/err"
check "plan: actor.clip_ratio (verl's symmetric ε) accepted" test $? -eq 0
check "plan: actor.clip_ratio draws no did-you-mean" bash -c "! grep -q 'did you mean' '$W/err'"
$M plan --config examples/smoke.yaml actor.kl_loss_type=k3+ >"$W/out" 2>"$W/err"
check "plan: actor.kl_loss_type without actor.use_kl_loss warns naming both" \
    grep -q "actor.kl_loss_type=k3+ (override) has no effect: it applies only with actor.use_kl_loss=true" "$W/err"
$M plan --config examples/smoke.yaml actor.kl_loss_type=k3+ actor.use_kl_loss=true >"$W/out" 2>"$W/err"
check "plan: actor.kl_loss_type with actor.use_kl_loss: no warning" bash -c "! grep -q 'has no effect' '$W/err'"
$M plan --config examples/smoke.yaml algorithm.kl_ctrl.kl_coef=0.01 >"$W/out" 2>"$W/err"
check "plan: algorithm.kl_ctrl.kl_coef without use_kl_in_reward warns" \
    grep -q "algorithm.kl_ctrl.kl_coef=0.01 (override) has no effect: it applies only with algorithm.use_kl_in_reward=true" "$W/err"
$M plan --config examples/smoke.yaml rollout.n=1 rollout.max_num_seqs=32 >"$W/out" 2>"$W/err"
check "plan: rollout.n=1 with grpo warns naming rollout.n, the estimator and why" \
    grep -q "rollout.n=1 with algorithm.adv_estimator=grpo: a group of one response has no group baseline" "$W/err"
$M plan --config examples/smoke.yaml rollout.n=1 algorithm.adv_estimator=reinforce_plus_plus_baseline >"$W/out" 2>"$W/err"
check "plan: rollout.n=1 with reinforce_plus_plus_baseline (batch baseline): no warning" bash -c "! grep -q 'rollout.n=1' '$W/err'"
$M plan --config examples/smoke.yaml trainer.test_freq=-1 >"$W/out" 2>"$W/err"
check "plan: trainer.test_freq=-1 (verl: no validation during training) accepted" test $? -eq 0
expect_err "rl: trainer.test_freq=-2 refused" "trainer.test_freq must be ≥ -1" \
    $M rl --config examples/smoke.yaml trainer.test_freq=-2 trainer.default_local_dir="$W/tf2"
printf 'rollout: 5\n' >"$W/sec.yaml"
expect_err "rl: a section given a value (YAML)" "'rollout' is a section" $M rl --config "$W/sec.yaml"
check "rl: the section message suggests no rollout.n typo" bash -c "! grep -q 'did you mean' '$W/err'"
expect_err "rl: a section given a value (override)" "'rollout' is a section" $M rl --config examples/smoke.yaml rollout=5
expect_err "rl: model.* with model.path" "model.* keys are set as well" \
    $M rl --config examples/smoke.yaml model.path="$TD/model_b" model.hidden_size=32 trainer.default_local_dir="$W/mp"
check "rl: the model.* refusal does not speak of plan" bash -c "! grep -q 'plan' '$W/err'"

finish
