#!/usr/bin/env bash
# moerl plan's traffic against the bytes moerl's communication layer counted in a real MPI run:
# `mpirun -np 3 build/moerl-mpi rl ... trainer.n_ranks=2` (one rollout rank, two data-parallel
# trainers) writes perf/grad_bytes_sent (dist_reducer_last_bytes, summed over a version's updates)
# and perf/weight_bcast_bytes (dist_xfer_stats.bytes of the weight broadcast) to metrics.jsonl;
# `moerl plan --config <same> --json` must give exactly those numbers (gradient all-reduce payload
# per update × updates per version, weight broadcast per sync). Plus the plan command's own checks:
# the published Qwen3-30B-A3B config plans to 30,532,122,624 parameters, bad layouts are refused
# naming the key (pp with EP and FSDP at once or SP, pp × FSDP with tied embeddings, model.* beside --model, tokens per step past 2^53), a
# billion-sequence batch plans without hanging, actor.use_kl_loss adds the reference sharded as the actor;
# the keys moerl rl refuses are refused by plan in rl's words (rl_check_config_keys, rl_check_seq_len,
# rl_check_rollout_tp; rl run beside it on each), and a key given twice on the command line warns, last wins.
# Run by tests/run.sh as `bash tests/e2e_plan.sh BUILD`. MOERL_NO_MPI=1 skips the
# MPI part (as tests/e2e_mpi.sh). Then tests/test_dist_plan.c under mpirun for every model-parallel
# layout moerl runs (FSDP, HSDP, Ulysses, the stage-owned pipeline with and without tied embeddings, pipeline × FSDP,
# plain and interleaved (actor.virtual_pipeline_parallel_size 2, 3), EP, SP × EP, and the
# replicated pipeline of pp_state_new alone): traffic per group and operation
# equal to the counters, memory per rank within 10% of moerl's accounting (FSDP: the shard exact, the peak
# gathered between plan's bounds — where it falls between them is timing); the KL reference sharded
# as the actor (trainer_shard_ref) gives the unsharded reference's logprobs and holds the actor's floats.
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
OUT=$W

# --- the published config
j=$($M plan --model examples/qwen3_30b_a3b --json 2>"$OUT/err") || fail "plan --model examples/qwen3_30b_a3b: $(cat "$OUT/err")"
n=$(echo "$j" | json_field n_params_hf 2>/dev/null)
[[ $n == 30532122624 ]] && ok || fail "Qwen3-30B-A3B parameters: plan says '$n', the model card 30532122624"
$M plan --model examples/qwen3_30b_a3b/config.json trainer.n_ranks=8 actor.pipeline_parallel_size=3 >/dev/null 2>"$OUT/err"
[[ $? -eq 1 ]] && grep -q "pipeline_parallel_size" "$OUT/err" && ok || fail "pp=3 over 8 ranks not refused by name: $(cat "$OUT/err")"
# plan_refuses WANT [key=value ...]: `moerl plan` on the published config exits 1 and its stderr ($OUT/err) matches
# WANT (a grep pattern)
plan_refuses() {
    local want=$1
    shift
    $M plan --model examples/qwen3_30b_a3b "$@" >/dev/null 2>"$OUT/err"
    [[ $? -eq 1 ]] && grep -q -- "$want" "$OUT/err"
}
# values moerl would refuse are refused by plan too, naming the key (no negative or overflowed figures)
for bad in "actor.moe.dispatcher=bogus:actor.moe.dispatcher" "rollout.max_num_seqs=-5:rollout.max_num_seqs" \
    "trainer.n_ranks=6 actor.ulysses_sequence_parallel_size=3:ulysses_sequence_parallel_size" \
    "data.max_response_length=2147483000 data.max_prompt_length=1000:32-bit" \
    "rollout.tensor_model_parallel_size=2 rollout.batch_invariant=true:rollout.batch_invariant=true" \
    "actor.ppo_max_token_len_per_gpu=527:actor.ppo_max_token_len_per_gpu=527 is below one sequence: data.max_prompt_length unset (0 = no limit in rl; plan assumes 512) + data.max_response_length=16 = 528 tokens, .* at least 528"; do
    IFS=: read -r kv want <<<"$bad"
    # shellcheck disable=SC2086
    plan_refuses "$want" $kv && ok || fail "plan $kv not refused naming $want: $(cat "$OUT/err")"
done
# messages that say what is allowed and why: expert-TP at TP 1 names TP's value; a size that does not divide the
# trainer ranks without a pipeline names no pipeline stage (with one, the stage's ranks); model parallelism on
# one trainer rank tells plan's user to set trainer.n_ranks (plan runs nothing), not to run under mpirun
plan_refuses "expert_tensor_parallel_size=2: .*must be 1 or equal actor.megatron.tensor_model_parallel_size .*that is 1 here (no TP)" \
    actor.megatron.expert_tensor_parallel_size=2 && ok || fail "plan expert-TP 2 at TP 1: $(cat "$OUT/err")"
plan_refuses "fsdp_size=3 does not divide the 4 trainer ranks$" trainer.n_ranks=4 actor.fsdp_config.fsdp_size=3 &&
    ! grep -q "pipeline stage" "$OUT/err" && ok || fail "plan fsdp 3 over 4 ranks: $(cat "$OUT/err")"
plan_refuses "fsdp_size=3 does not divide the 2 ranks of a pipeline stage (4 trainer ranks / actor.pipeline_parallel_size=2)" \
    trainer.n_ranks=4 actor.pipeline_parallel_size=2 actor.fsdp_config.fsdp_size=3 && ok ||
    fail "plan fsdp 3 over a stage of 2 ranks: $(cat "$OUT/err")"
plan_refuses "splits the model over trainer ranks: set trainer.n_ranks ≥ 2" actor.expert_parallel_size=2 &&
    ! grep -q "run under mpirun" "$OUT/err" && ok || fail "plan EP 2 on one trainer rank: $(cat "$OUT/err")"
# more data-parallel shards than a mini-batch has GRPO groups: moerl rl runs it (the extra shards get no data), so
# plan plans it and warns as rl does (rl_warn_idle_shards), naming the key, the value and the bound; none at the bound
$M plan --model examples/qwen3_30b_a3b trainer.n_ranks=2147483647 >/dev/null 2>"$OUT/err" &&
    grep -q "WARN.*trainer.n_ranks=2147483647 makes 2147483647 data-parallel shards .*actor.ppo_mini_batch_size=8 GRPO groups.*2147483639 shards get no data in any update; trainer.n_ranks ≤ 8 feeds every shard" "$OUT/err" &&
    ok || fail "plan trainer.n_ranks=2147483647 without the idle-shard warning: $(cat "$OUT/err")"
$M plan --model examples/qwen3_30b_a3b trainer.n_ranks=32 actor.pipeline_parallel_size=2 >/dev/null 2>"$OUT/err" &&
    grep -q "WARN.*makes 16 data-parallel shards (2 trainer ranks each.*trainer.n_ranks ≤ 16 feeds" "$OUT/err" &&
    ok || fail "plan pp 2 × 16 shards over 8 groups: $(cat "$OUT/err")"
$M plan --model examples/qwen3_30b_a3b trainer.n_ranks=16 actor.pipeline_parallel_size=2 >/dev/null 2>"$OUT/err" &&
    ! grep -q "data-parallel shard" "$OUT/err" && ok || fail "plan pp 2 × 8 shards over 8 groups warns: $(cat "$OUT/err")"
# trainer tensor parallelism (TP × DP): each rank holds the TP slice (half the weights and moments, up to the
# replicated norms and router) and the TP group's all-reduces are a row of their own; what moerl rl refuses
# (TP with EP and expert-TP, FSDP, Ulysses, recompute; Megatron sequence parallelism with EP or the pipeline)
# plan refuses, naming the keys. Megatron sequence parallelism is planned: its reduce-scatters and all-gathers
# move the bytes of the row all-reduces they replace (the micro-batch's 4096 tokens divide by 2, expert-TP) plus
# the RMSNorm weights' gradient sum, 2(P−1)/P · (2L + 1)·H floats (L 48, H 2048, fp32); weights are TP's, the
# arena holds the residual stream (2L + 1 [N,H] buffers) and the RMSNorms' statistics (2L + 1 [N]) on N/2 rows
j1=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 2>"$OUT/err") || fail "plan dp 8: $(cat "$OUT/err")"
j2=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.megatron.tensor_model_parallel_size=2 \
    2>"$OUT/err") || fail "plan tp 2 × dp 4: $(cat "$OUT/err")"
python3 - "$j1" "$j2" <<'PY' && ok || fail "tp 2 × dp 4 against dp 8: $j2"
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert b["tp"] == 2 and b["dp"] == 4 and a["tp"] == 1, (a["tp"], b["tp"], b["dp"])
r = b["weights_bytes"] / a["weights_bytes"]
assert 0.5 <= r < 0.501, r  # the norms and routers (< 0.1% of the 30B) stay whole
assert b["tp_bytes_per_update"] > 0 and a["tp_bytes_per_update"] == 0
PY
# practice B's tp × ep variant (experts whole, split over EP groups of ranks with the same TP rank): planned, each
# rank's experts a quarter of dp 8's, the attention and vocabulary halved as under tp 2; the EP all-to-all rows
# only a TP rank's half of the tokens (tests/test_dist_plan.c checks the rows byte for byte against a run)
j3=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.megatron.tensor_model_parallel_size=2 \
    actor.expert_parallel_size=4 actor.megatron.expert_tensor_parallel_size=1 2>"$OUT/err") ||
    fail "plan tp 2 × ep 4: $(cat "$OUT/err")"
j4=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.expert_parallel_size=4 2>"$OUT/err") ||
    fail "plan ep 4: $(cat "$OUT/err")"
python3 - "$j1" "$j2" "$j3" "$j4" <<'PY' && ok || fail "tp 2 × ep 4 against dp 8, tp 2 and ep 4: $j3"
import json, sys
a, b, c, d = (json.loads(x) for x in sys.argv[1:5])
assert c["tp"] == 2 and c["dp"] == 4 and c["ep"] == 4, (c["tp"], c["dp"], c["ep"])
assert c["weights_bytes"] < b["weights_bytes"] and c["weights_bytes"] < d["weights_bytes"], (c["weights_bytes"], b["weights_bytes"], d["weights_bytes"])
assert c["tp_bytes_per_update"] > b["tp_bytes_per_update"] > 0  # + the expert rows' all-gathers
PY
# practice B's tp × ep variant with activation recompute (issue 27): planned; the slice's arena shrinks, full
# recompute adds o_proj's all-reduce per layer and pass plus the recomputed MoE forward's expert-row gathers,
# selective only the gathers (tests/test_dist_plan.c checks the rows byte for byte against a run)
rcp() { $M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.megatron.tensor_model_parallel_size=2 \
    actor.expert_parallel_size=4 actor.megatron.expert_tensor_parallel_size=1 model.enable_gradient_checkpointing=true \
    "$@" 2>"$OUT/err"; }
j6=$(rcp) || fail "plan tp 2 × ep 4 with recompute: $(cat "$OUT/err")"
j7=$(rcp actor.recompute_granularity=selective) || fail "plan tp 2 × ep 4, selective recompute: $(cat "$OUT/err")"
python3 - "$j3" "$j6" "$j7" <<'PY' && ok || fail "tp 2 × ep 4 with recompute against without: $j6"
import json, sys
c, f, s = (json.loads(x) for x in sys.argv[1:4])
assert f["acts_recompute_bytes"] < s["acts_recompute_bytes"] < f["acts_bytes"] == c["acts_bytes"], (f["acts_recompute_bytes"], s["acts_recompute_bytes"], f["acts_bytes"])
assert f["trainer_total_bytes"] == f["trainer_total_recompute_bytes"] < c["trainer_total_bytes"], (f["trainer_total_bytes"], c["trainer_total_bytes"])
assert f["tp_bytes_per_update"] > s["tp_bytes_per_update"] > c["tp_bytes_per_update"], (f["tp_bytes_per_update"], s["tp_bytes_per_update"], c["tp_bytes_per_update"])
assert f["alltoall_ep_bytes_per_update"] == s["alltoall_ep_bytes_per_update"] > c["alltoall_ep_bytes_per_update"]
PY
$M plan --model examples/qwen3_30b_a3b trainer.n_ranks=8 actor.megatron.tensor_model_parallel_size=2 \
    actor.expert_parallel_size=4 actor.megatron.expert_tensor_parallel_size=1 model.enable_gradient_checkpointing=true \
    2>&1 | grep -q "activations (TP slice, recompute)" && ok || fail "plan tp 2 × ep 4 with recompute prints no recompute row"
j5=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.megatron.tensor_model_parallel_size=2 \
    actor.megatron.sequence_parallel=true 2>"$OUT/err") || fail "plan tp 2 + SP: $(cat "$OUT/err")"
python3 - "$j2" "$j5" <<'PY' && ok || fail "tp 2 + SP against tp 2: $j5"
import json, sys
b, e = (json.loads(x) for x in sys.argv[1:3])
assert e["tp"] == 2 and e["tp_sequence_parallel"] == 1 and b["tp_sequence_parallel"] == 0, e
assert e["tp_reduce_scatter_bytes_per_update"] > 0 and b["tp_reduce_scatter_bytes_per_update"] == 0
assert e["tp_bytes_per_update"] - b["tp_bytes_per_update"] == (2 * 48 + 1) * 2048 * 4, (e["tp_bytes_per_update"], b["tp_bytes_per_update"])
assert e["weights_bytes"] == b["weights_bytes"], (e["weights_bytes"], b["weights_bytes"])
assert e["micro_tokens"] == 4096, e["micro_tokens"]
shrunk = (2 * 48 + 1) * ((4096 - 2048) * 2048 * 4 + (4096 - 2048) * 4)  # fp32 activations, 4096-token micro-batch
for k in ("acts_bytes", "trainer_total_bytes"):
    assert b[k] - e[k] == shrunk, (k, b[k], e[k], shrunk)
PY
$M plan --model examples/qwen3_30b_a3b trainer.n_ranks=8 actor.megatron.tensor_model_parallel_size=2 \
    actor.megatron.sequence_parallel=true 2>&1 | grep -q "RMSNorms' statistics on ⌈N/2⌉ rows a rank" && ok ||
    fail "plan tp 2 + SP does not say the arena holds a rank's rows"
# practice B's tp × ep variant with Megatron SP (Megatron's required shape for TP with MoE): planned, the same
# weights as tp 2 × ep 4, its arena less half the residual stream's rows and the RMSNorms' statistics (as tp 2 + SP
# against tp 2), fewer TP bytes (no expert-row all-gathers, no ln2 gathers before the MoE layers; the aux
# statistics and the routers' gradient all-reduced instead), the same all-to-all rows
j6=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.megatron.tensor_model_parallel_size=2 \
    actor.expert_parallel_size=4 actor.megatron.expert_tensor_parallel_size=1 actor.megatron.sequence_parallel=true \
    2>"$OUT/err") || fail "plan tp 2 × ep 4 + SP: $(cat "$OUT/err")"
python3 - "$j3" "$j6" <<'PY' && ok || fail "tp 2 × ep 4 + SP against tp 2 × ep 4: $j6"
import json, sys
c, f = (json.loads(x) for x in sys.argv[1:3])
assert f["tp"] == 2 and f["ep"] == 4 and f["tp_sequence_parallel"] == 1 and f["tp_reduce_scatter_bytes_per_update"] > 0, f
assert 0 < f["tp_bytes_per_update"] < c["tp_bytes_per_update"], (f["tp_bytes_per_update"], c["tp_bytes_per_update"])
for k in ("weights_bytes", "alltoall_ep_bytes_per_update"):
    assert f[k] == c[k], (k, f[k], c[k])
assert f["micro_tokens"] == c["micro_tokens"] == 4096, (f["micro_tokens"], c["micro_tokens"])
shrunk = (2 * 48 + 1) * ((4096 - 2048) * 2048 * 4 + (4096 - 2048) * 4)  # as tp 2 + SP against tp 2
# SP × EP builds no token split (tp_ep.h): tp 2 × ep 4's total also holds its scratch, SP's none
assert f["tp_ep_scratch_bytes"] == 0 < c["tp_ep_scratch_bytes"], (f["tp_ep_scratch_bytes"], c["tp_ep_scratch_bytes"])
for k in ("acts_bytes", "trainer_total_bytes"):
    more = c["tp_ep_scratch_bytes"] if k == "trainer_total_bytes" else 0
    assert c[k] - f[k] == shrunk + more, (k, c[k], f[k], shrunk, more)
PY
for bad in "actor.expert_parallel_size=2:actor.expert_parallel_size (2)" "actor.fsdp_config.fsdp_size=2:fsdp_size (2)" \
    "actor.ulysses_sequence_parallel_size=2:ulysses_sequence_parallel_size (2)" \
    "actor.megatron.sequence_parallel=true actor.expert_parallel_size=2:expert_tensor_parallel_size=1" \
    "actor.megatron.sequence_parallel=true actor.pipeline_parallel_size=2:sequence_parallel=true with actor.pipeline_parallel_size=2" \
    "actor.megatron.sequence_parallel=true actor.expert_parallel_size=2 actor.megatron.expert_tensor_parallel_size=1 model.enable_gradient_checkpointing=true:does not combine with Megatron sequence parallelism × EP"; do
    IFS=: read -r kv want <<<"$bad"
    # shellcheck disable=SC2086
    plan_refuses "$want" trainer.n_ranks=8 actor.megatron.tensor_model_parallel_size=2 $kv && ok ||
        fail "plan tp 2 with $kv not refused naming $want: $(cat "$OUT/err")"
done
# TP × pipeline (× DP) is planned: each rank holds its stage's range of the TP slice — half the pipeline alone's
# weights up to the whole norms and router (tp 2 × pp 2 × dp 2 against pp 2 × dp 2: the same stage cut, the same
# micro-batches) —, sends the whole [N,H] to its counterpart in the next stage (the pipeline alone's p2p), sums
# the stage's range over its dp 2 ranks holding the same slice (2(2−1)/2: the weights' bytes) and adds the
# stage's TP collectives (tests/test_dist_plan.c checks each row byte for byte against a run). What moerl rl
# refuses with it stays refused, naming the keys: the interleaved schedule, EP
j6=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=4 actor.pipeline_parallel_size=2 2>"$OUT/err") ||
    fail "plan pp 2 × dp 2: $(cat "$OUT/err")"
j7=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.pipeline_parallel_size=2 \
    actor.megatron.tensor_model_parallel_size=2 2>"$OUT/err") && ok || fail "plan tp 2 × pp 2 × dp 2: $(cat "$OUT/err")"
python3 - "$j6" "$j7" <<'PY' && ok || fail "tp 2 × pp 2 × dp 2 against pp 2 × dp 2: $j7"
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:3])
assert b["tp"] == 2 and b["pp"] == 2 and b["dp"] == 2 and a["tp"] == 1, (b["tp"], b["pp"], b["dp"])
assert b["stage_layers"] == a["stage_layers"] and b["micro_batches"] == a["micro_batches"], b
r = b["weights_bytes"] / a["weights_bytes"]
assert 0.5 <= r < 0.501, r
assert b["p2p_pp_bytes_per_update"] == a["p2p_pp_bytes_per_update"] > 0
assert b["allreduce_bytes_per_update"] == b["weights_bytes"], (b["allreduce_bytes_per_update"], b["weights_bytes"])
assert b["tp_bytes_per_update"] > 0 and a["tp_bytes_per_update"] == 0
assert b["acts_bytes"] < a["acts_bytes"]  # the heads, experts' width and logits split
PY
for bad in "actor.virtual_pipeline_parallel_size=2:virtual_pipeline_parallel_size (2) must be 1" \
    "actor.expert_parallel_size=2 actor.megatron.expert_tensor_parallel_size=1:actor.expert_parallel_size (2) must be 1 with it"; do
    IFS=: read -r kv want <<<"$bad"
    # shellcheck disable=SC2086
    plan_refuses "$want" trainer.n_ranks=8 actor.pipeline_parallel_size=2 actor.megatron.tensor_model_parallel_size=2 $kv &&
        ok || fail "plan tp 2 × pp 2 with $kv not refused naming $want: $(cat "$OUT/err")"
done
# TP × pipeline with activation recompute (as moerl rl runs it) is planned: the stage's slots hold the recompute
# arena (full: the kept tensors; selective: more), and full recompute repeats o_proj's all-reduce of the
# micro-batch's [N,H] per layer of the stage (selective: no TP collective) — a multiple of the fullest stage's
# 26 layers × 16 micro-batches × H 2048 × 4 bytes (test_dist_plan checks the rows byte for byte against a run)
tpr() { $M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.pipeline_parallel_size=2 \
    actor.megatron.tensor_model_parallel_size=2 model.enable_gradient_checkpointing=true "$@" 2>"$OUT/err"; }
j8=$(tpr) || fail "plan tp 2 × pp 2 with recompute: $(cat "$OUT/err")"
j9=$(tpr actor.recompute_granularity=selective) || fail "plan tp 2 × pp 2, selective recompute: $(cat "$OUT/err")"
python3 - "$j7" "$j8" "$j9" <<'PY' && ok || fail "tp 2 × pp 2 with recompute against without: $j8"
import json, sys
c, f, s = (json.loads(x) for x in sys.argv[1:4])
assert f["acts_bytes"] == s["acts_bytes"] == c["acts_bytes"], (f["acts_bytes"], c["acts_bytes"])
assert f["acts_recompute_bytes"] < s["acts_recompute_bytes"] < c["acts_bytes"], (f["acts_recompute_bytes"], s["acts_recompute_bytes"])
assert f["trainer_total_bytes"] == f["trainer_total_recompute_bytes"] < s["trainer_total_bytes"] < c["trainer_total_bytes"]
assert s["tp_bytes_per_update"] == c["tp_bytes_per_update"], (s["tp_bytes_per_update"], c["tp_bytes_per_update"])
d = f["tp_bytes_per_update"] - c["tp_bytes_per_update"]
assert d > 0 and d % (c["stage_layers"] * c["micro_batches"] * 2048 * 4) == 0, d
assert f["p2p_pp_bytes_per_update"] == c["p2p_pp_bytes_per_update"] and f["stage_layers"] == c["stage_layers"]
PY
# data.max_prompt_length is one key for plan and rl (src/cli/common.c): plan sizes the context with it,
# and rl's "no limit" (0, the default) is planned as 512 — capped at what the model's context leaves after
# the responses, the longest prompt rl admits (rl_check_seq_len): the smoke model's 128 − 8 = 120
mml() { $M plan --config examples/smoke.yaml --json "$@" 2>/dev/null |
    json_field max_model_len 2>/dev/null; }
[[ $(mml data.max_prompt_length=100) == 108 && $(mml model.max_position_embeddings=1024) == 520 && $(mml) == 128 ]] && ok ||
    fail "plan's max_model_len: $(mml data.max_prompt_length=100) with data.max_prompt_length=100 (want 108), $(mml model.max_position_embeddings=1024) by default with a 1024-token context (want 520), $(mml) with the smoke model's 128 (want 128)"
# data.filter_overlong_prompts=true without data.max_prompt_length (it would drop nothing) is refused with
# moerl rl's and simulate's words (cli_check_data_keys, shared); with a limit it plans
$M plan --config examples/smoke.yaml data.filter_overlong_prompts=true >/dev/null 2>"$OUT/err"
rc=$?
[[ $rc -eq 1 ]] && grep -qF "plan: data.filter_overlong_prompts=true drops the prompts longer than data.max_prompt_length, but data.max_prompt_length=0" "$OUT/err" &&
    ok || fail "plan data.filter_overlong_prompts=true without a limit: exit $rc, $(cat "$OUT/err")"
[[ $(mml data.max_prompt_length=100 data.filter_overlong_prompts=true) == 108 ]] && ok ||
    fail "plan data.filter_overlong_prompts=true data.max_prompt_length=100 did not plan"
# --model that does not exist: refused naming it, with no warning about the config's model.* keys first
$M plan --config examples/smoke.yaml --model "$OUT/no_such_model" >/dev/null 2>"$OUT/err"
rc=$?
[[ $rc -eq 1 ]] && grep -qF "plan: --model: cannot read '$OUT/no_such_model'" "$OUT/err" && ! grep -q WARN "$OUT/err" &&
    ok || fail "plan --model of a missing folder: exit $rc, $(head -c 300 "$OUT/err")"
# --config (or --model) twice: refused naming both (the last one used to win silently)
$M plan --config examples/smoke.yaml --config examples/demo.yaml >/dev/null 2>"$OUT/err"
rc=$?
[[ $rc -eq 2 ]] && grep -qF "plan: --config given twice ('examples/smoke.yaml' and 'examples/demo.yaml')" "$OUT/err" &&
    ok || fail "plan --config twice: exit $rc, $(head -c 300 "$OUT/err")"
# --model and model.path together: refused naming both (model.path was dropped silently)
$M plan --model examples/qwen3_30b_a3b model.path=/nonexistent >/dev/null 2>"$OUT/err"
rc=$?
[[ $rc -eq 1 ]] && grep -qF "plan: --model examples/qwen3_30b_a3b and model.path=/nonexistent (command line) both name a model" "$OUT/err" &&
    ok || fail "plan --model with model.path: exit $rc, $(head -c 300 "$OUT/err")"
# counts of one read in the singular ("1 layer", "1 rank", "every 1 step")
$M plan --config examples/smoke.yaml model.num_hidden_layers=1 >"$OUT/one" 2>&1
grep -q "^model: 1 layer, " "$OUT/one" && grep -q "^trainer: 1 rank = .*(1 layer)" "$OUT/one" &&
    grep -q "every 1 step)" "$OUT/one" && ok || fail "plan's singular counts: $(grep -E '^model|^trainer' "$OUT/one")"
# layouts moerl refuses (the pipeline combines with data parallelism, FSDP and EP, not with EP and FSDP at once
# nor with Ulysses: par_check_pp_compose through plan's par_check_pp_alone),
# model.* beside --model (the architecture is the config.json's: they would be dropped), and batch
# or length values whose tokens per step overflow or whose FSDP replay would not end
for bad in "actor.pipeline_parallel_size=2 actor.expert_parallel_size=2 actor.fsdp_config.fsdp_size=2:actor.fsdp_config.fsdp_size (2)" \
    "actor.pipeline_parallel_size=2 actor.ulysses_sequence_parallel_size=2:actor.ulysses_sequence_parallel_size (2)" \
    "model.num_experts=64:model.num_experts (command line)" \
    "actor.ppo_mini_batch_size=1000000000 rollout.n=1000000000 rollout.max_num_seqs=1000000000:actor.ppo_mini_batch_size × async_training.require_batches × rollout.n" \
    "actor.ppo_mini_batch_size=2000000000 rollout.n=2000 rollout.max_num_seqs=2000 actor.ppo_max_token_len_per_gpu=528:exceed 2^31 − 1: lower actor.ppo_mini_batch_size" \
    "async_training.require_batches=100000 actor.ppo_epochs=100000:async_training.require_batches × actor.ppo_epochs"; do
    IFS=: read -r kv want <<<"$bad"
    # shellcheck disable=SC2086
    $M plan --model examples/qwen3_30b_a3b trainer.n_ranks=4 $kv >/dev/null 2>"$OUT/err"
    [[ $? -eq 1 ]] && grep -qF -- "$want" "$OUT/err" && ok || fail "plan $kv not refused naming '$want': $(cat "$OUT/err")"
done
# pipeline × FSDP (each stage's units sharded over its FSDP group; plan_pp_fsdp.h): planned with its rows —
# the stage's shard (less than FSDP's over the whole model), the FSDP collectives of the stage's passes, the
# pipeline's p2p, the norm's sum over the stages; kept units (reshard_after_forward=false) gather each of the
# stage's units once per update, the shard's bytes × (fsdp − 1); fsdp=-1 (the stage's ranks) too, HSDP over 8
# ranks adds the replicas' all-reduce; a model with tied embeddings is refused as moerl sft / rl refuse it
PF=(--model examples/qwen3_30b_a3b --json trainer.n_ranks=4 actor.pipeline_parallel_size=2)
r=$($M plan "${PF[@]}" actor.fsdp_config.fsdp_size=2 2>"$OUT/err" | /usr/bin/python3 -c '
import json, sys; d = json.load(sys.stdin)
print(d["pp"] == 2 and d["fsdp"] == 2 and d["allgather_bytes_per_update"] > d["weights_bytes"] and
      d["reduce_scatter_bytes_per_update"] > 0 and d["p2p_pp_bytes_per_update"] > 0 and d["gathered_bytes"] > 0 and
      d["allreduce_bytes_per_update"] == 8, d["weights_bytes"])' 2>/dev/null)
w1=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=2 actor.fsdp_config.fsdp_size=2 2>/dev/null | json_field weights_bytes)
[[ ${r%% *} == True ]] && /usr/bin/python3 -c "import sys; sys.exit(not ${r#* } < 0.6 * $w1)" && ok ||
    fail "plan pp 2 × fsdp 2: rows missing or wrong ($r; fsdp 2 alone $w1): $(cat "$OUT/err")"
r=$($M plan "${PF[@]}" actor.fsdp_config.fsdp_size=2 actor.fsdp_config.reshard_after_forward=false 2>"$OUT/err" |
    /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin)
print(d["allgather_bytes_per_update"] == d["weights_bytes"] == d["reduce_scatter_bytes_per_update"] > 0)' 2>/dev/null)
[[ $r == True ]] && ok || fail "plan pp 2 × fsdp 2 keeping the units: all-gathers not the shard once: $(cat "$OUT/err")"
r=$($M plan "${PF[@]}" trainer.n_ranks=8 actor.fsdp_config.fsdp_size=2 2>"$OUT/err" | /usr/bin/python3 -c '
import json, sys; d = json.load(sys.stdin); print(d["fsdp"] == 2 and d["allreduce_bytes_per_update"] > 8)' 2>/dev/null)
[[ $r == True ]] && ok || fail "plan pp 2 × fsdp 2 × 2 HSDP replicas: no replica all-reduce: $(cat "$OUT/err")"
$M plan --model examples/qwen3_30b_a3b trainer.n_ranks=4 actor.pipeline_parallel_size=2 actor.fsdp_config.fsdp_size=-1 \
    >"$OUT/ppf" 2>"$OUT/err" && grep -q "fsdp 2, ep 1" "$OUT/ppf" && grep -q "^| FSDP all-gather | [1-9]" "$OUT/ppf" &&
    grep -q "^| PP p2p | [0-9.]*[1-9]" "$OUT/ppf" && grep -q "^pipeline: 2 stages" "$OUT/ppf" && ok ||
    fail "plan pp 2 × fsdp -1: $(head -c 300 "$OUT/err") $(grep -E '^trainer|FSDP all-gather|PP p2p' "$OUT/ppf")"
$M plan --config examples/smoke.yaml trainer.n_ranks=4 actor.pipeline_parallel_size=2 actor.fsdp_config.fsdp_size=2 \
    model.tie_word_embeddings=true >/dev/null 2>"$OUT/err"
rc=$?
[[ $rc -eq 1 ]] && grep -qF "actor.fsdp_config.fsdp_size=2: a model with tied embeddings" "$OUT/err" && ok ||
    fail "plan pp 2 × fsdp 2 with tied embeddings: exit $rc, want the run's refusal: $(cat "$OUT/err")"
# a billion sequences per mini-batch under FSDP: 1.3·10^8 micro-batches per update plan in a few
# replayed passes (the timeout only tells a hang from an answer)
j=$(timeout 120 $M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.fsdp_config.fsdp_size=8 \
    actor.ppo_mini_batch_size=1000000000 2>"$OUT/err")
mb=$(echo "$j" | json_field micro_batches 2>/dev/null)
[[ $mb == 128906250 ]] && ok || fail "plan of 10^9 sequences per mini-batch: micro_batches '$mb' (want 128906250): $(cat "$OUT/err")"
# pipeline × FSDP with a billion prompts per mini-batch: the whole-group split's bounds (rl_shard_groups, by
# bisection) and the pipeline's count rule (periodic past 2·pp sequences) take no pass per group: plans
# (rollout.n=1), or is refused naming the keys when a pipeline's sequences pass 2^31 − 1 (rollout.n=8; no
# negative counts). The timeouts only tell a hang from an answer.
j=$(timeout 120 $M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=4 actor.pipeline_parallel_size=2 \
    actor.fsdp_config.fsdp_size=2 actor.ppo_mini_batch_size=1000000000 rollout.n=1 2>"$OUT/err")
mb=$(echo "$j" | json_field micro_batches 2>/dev/null)
[[ $mb == 64453125 ]] && ok || fail "plan pp 2 × fsdp 2 of 10^9 prompts: micro_batches '$mb' (want 64453125): $(cat "$OUT/err")"
timeout 120 $M plan --model examples/qwen3_30b_a3b trainer.n_ranks=4 actor.pipeline_parallel_size=2 \
    actor.fsdp_config.fsdp_size=2 actor.ppo_mini_batch_size=1000000000 >/dev/null 2>"$OUT/err"
[[ $? -eq 1 ]] && grep -q "actor.ppo_mini_batch_size=1000000000 prompts split over 2 data-parallel pipelines can give a pipeline [0-9]* groups of rollout.n=8 = [0-9]* sequences in one update, more than 2^31 − 1" "$OUT/err" &&
    ! grep -q -- "-[0-9]" "$OUT/err" && ok || fail "plan pp 2 × fsdp 2 of 10^9 groups of 8: $(cat "$OUT/err")"
# actor.use_kl_loss: the reference is sharded as the actor (fp32): FSDP's shard, gathered in its own
# forward-only pass (one logprob pass's collectives); plain data parallel keeps the whole padded layout
j=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.fsdp_config.fsdp_size=8 actor.use_kl_loss=true 2>"$OUT/err")
r=$(echo "$j" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ref_weights_bytes"] == d["weights_bytes"] < 4 * d["n_params"] / 7 and d["ref_pass_bytes_per_step"] > 0 and d["ref_gathered_bytes"] > 0 and d["ref_acts_bytes"] == 0)' 2>/dev/null)
[[ $r == True ]] && ok || fail "plan actor.use_kl_loss=true fsdp 8: reference weights not the actor's FSDP shard: $(cat "$OUT/err")"
j=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.fsdp_config.fsdp_size=1 actor.use_kl_loss=true 2>"$OUT/err")
r=$(echo "$j" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ref_weights_bytes"] == 4 * d["n_params"] and d["ref_pass_bytes_per_step"] == 0)' 2>/dev/null)
[[ $r == True ]] && ok || fail "plan actor.use_kl_loss=true plain DP: reference weights not 4 × n_params: $(cat "$OUT/err")"
$M plan --model examples/qwen3_30b_a3b actor.use_kl_loss=true | grep -q "KL reference policy" && ok || fail "plan table has no KL reference line"
# actor.fsdp_config.reshard_after_forward: with FSDP on, plan gives both settings' rows (the chosen one's
# figures are the plan's own); false holds one reduce-scatter per update (88 micro-batches on practice A's
# FSDP-32 layout, the command of docs/plan-and-simulate.md); refused without FSDP, naming the key
PA=(trainer.n_ranks=32 actor.fsdp_config.fsdp_size=-1 actor.ulysses_sequence_parallel_size=8 actor.dtype=bf16
    rollout.dtype=bf16 actor.ppo_max_token_len_per_gpu=32768 model.enable_gradient_checkpointing=true rollout.n_ranks=32
    rollout.tensor_model_parallel_size=2 rollout.max_num_seqs=128 data.max_prompt_length=2048
    data.max_response_length=20480 rollout.n=16 actor.ppo_mini_batch_size=32 async_training.trigger_parameter_sync_step=4)
j=$($M plan --model examples/qwen3_30b_a3b --json "${PA[@]}" actor.fsdp_config.reshard_after_forward=false 2>"$OUT/err")
r=$(echo "$j" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); t, f = d["fsdp_reshard_rows"]
print(t["reshard_after_forward"] and not f["reshard_after_forward"] and not d["reshard_after_forward"] and f["allgather_bytes_per_update"] == d["allgather_bytes_per_update"] and f["gathered_bytes"] == d["gathered_bytes"] and abs(t["reduce_scatter_bytes_per_update"] - d["micro_batches"] * f["reduce_scatter_bytes_per_update"]) <= 1e-12 * t["reduce_scatter_bytes_per_update"] and t["allgather_bytes_per_update"] > 100 * f["allgather_bytes_per_update"] and f["gathered_bytes"] > t["gathered_bytes"])' 2>/dev/null)
[[ $r == True ]] && ok || fail "plan practice A reshard_after_forward=false: rows not as expected: $(cat "$OUT/err")"
$M plan --model examples/qwen3_30b_a3b "${PA[@]}" | grep -c "^| true: per layer\|^| false: kept" | grep -qx 2 && ok ||
    fail "plan practice A's table lacks the two reshard_after_forward rows"
$M plan --model examples/qwen3_30b_a3b actor.fsdp_config.reshard_after_forward=false >/dev/null 2>"$OUT/err"
[[ $? -eq 1 ]] && grep -q "reshard_after_forward=false.*fsdp_size" "$OUT/err" && ok ||
    fail "plan reshard_after_forward=false without FSDP not refused naming the keys: $(cat "$OUT/err")"
# interleaved 1F1B is planned (no longer refused): the micro-batch count is the pipeline's own
# (pp_plan_microbatches' dynamic rule: the update re-packed into 16 micro-batches, aiming at ≥ 64 tokens each, a
# multiple of pp), not the token budget's 8
j=$($M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 actor.pipeline_parallel_size=4 \
    actor.virtual_pipeline_parallel_size=2 actor.ppo_mini_batch_size=16 actor.ppo_max_token_len_per_gpu=4224 2>"$OUT/err")
r=$(echo "$j" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["vpp"], d["micro_batches"], round(d["pp_bubble_theory"], 6))' 2>/dev/null)
[[ $r == "2 16 0.085714" ]] && ok || fail "plan pp 4 × v 2: vpp, micro-batches, bubble '$r' (want 2 16 0.085714 = 3/35): $(cat "$OUT/err")"
$M plan >/dev/null 2>&1
[[ $? -eq 2 ]] && ok || fail "plan without --model/--config should be a usage error (exit 2)"
$M plan --model examples/qwen3_30b_a3b | grep -q "KV cache" && ok || fail "plan table has no KV cache line"

# --- the paged KV model (issue 28) on practice A's rollout (Qwen3-30B-A3B, bf16, tp 2, 128 × (2048 + 20480) tokens,
# rollout.n 16, the Pareto(1) tail from 1024 tokens of examples/sim_ascend_qwen3_30b.yaml): the 132 GiB
# reservation, and the paged expectation against an independent Python sum over the rollouter's draw
# ⌈m·u^(−1/α)⌉ capped (P(R ≤ k) = 1 − (m/k)^α), as the engine allocates: ⌈(P + R − 1)/B⌉ blocks a sequence (the
# last sampled token's K/V is never written), the group's ⌊(P − 1)/B⌋ = 127 full prompt blocks counted once
PA=(--model examples/qwen3_30b_a3b trainer.n_ranks=32 actor.fsdp_config.fsdp_size=-1 actor.ulysses_sequence_parallel_size=8
    actor.dtype=bf16 rollout.dtype=bf16 actor.ppo_max_token_len_per_gpu=32768 rollout.n_ranks=32
    rollout.tensor_model_parallel_size=2 rollout.max_num_seqs=128 data.max_prompt_length=2048 data.max_response_length=20480
    rollout.n=16 actor.ppo_mini_batch_size=32 rollout.synthetic_length.alpha=1 rollout.synthetic_length.min=1024)
$M plan "${PA[@]}" --json >"$OUT/pa.json" 2>"$OUT/err" || fail "plan practice A paged: $(cat "$OUT/err")"
r=$(/usr/bin/python3 - "$OUT/pa.json" <<'PY'
import json, math, sys
d = json.load(open(sys.argv[1])); k = d["paged_kv"]
P, B, cap, m, a, n = 2048, 16, 20480, 1024, 1.0, 16
tok = 2 * 48 * 4 * 128 * 2 / 2          # K and V, 48 layers, 4 kv heads of 128, bf16, over tp 2
probs = {kk: (m / (kk - 1)) ** a - (m / kk) ** a for kk in range(m + 1, cap)}
probs[cap] = (m / (cap - 1)) ** a
eb = sum(p * math.ceil((P + kk - 1) / B) for kk, p in probs.items())
shared = eb - ((P - 1) // B) * (n - 1) / n
want = {"reserved_bytes": 128 * 22528 * tok, "blocks_per_seq": eb, "blocks_per_seq_shared": shared,
        "paged_bytes": 128 * shared * B * tok, "budget_blocks": 128 * 22528 * tok // (B * tok),
        "mean_response": sum(p * kk for kk, p in probs.items())}
bad = [f"{x}: {k[x]} vs {v}" for x, v in want.items() if abs(k[x] - v) > 1e-9 * abs(v)]  # summation order only
print("ok" if not bad and k["shared_blocks"] == 127 and abs(k["reserved_bytes"] / 2**30 - 132) < 1e-12 else bad)
PY
)
[[ $r == ok ]] && ok || fail "practice A's paged KV rows against the Python sum: $r"
$M plan "${PA[@]}" >"$OUT/pa.txt" 2>"$OUT/err"
grep -qF "| reserved (slot engine): 128 × 22528 tokens | 132.000 |" "$OUT/pa.txt" && grep -qF "paged, expected: 128 × 265.08 blocks of 16 tokens (prefix sharing)" "$OUT/pa.txt" &&
    ok || fail "practice A's table rows: $(grep -F "KV" "$OUT/pa.txt")"
# the budget: rollout.kv_cache_bytes is an engine replica's (tp 2: half per device); gpu_memory_utilization takes
# that fraction of the device's memory less its weights
b=$($M plan "${PA[@]}" --json rollout.kv_cache_bytes=40000000000 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["paged_kv"]["budget_bytes"])')
[[ $b == 20000000000.0 ]] && ok || fail "rollout.kv_cache_bytes=4e10 over tp 2: budget per device $b (want 2e10)"
r=$($M plan "${PA[@]}" --json rollout.gpu_memory_utilization=0.9 plan.rollout_device_memory=141e9 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(abs(d["paged_kv"]["budget_bytes"] - 0.9 * (141e9 - d["rollout_weights_bytes"])) < 1)')
[[ $r == True ]] && ok || fail "gpu_memory_utilization=0.9 of 141e9 less the weights: $r"
# refusals naming the key and the value
for bad in "rollout.block_size=0:rollout.block_size must be in [1, 65536] tokens, got 0" \
    "rollout.kv_cache_bytes=-1:rollout.kv_cache_bytes must be ≥ 0" \
    "rollout.kv_cache_bytes=1000000:holds 0 blocks of 16 tokens" \
    "rollout.gpu_memory_utilization=1.5:rollout.gpu_memory_utilization must be a fraction in [0, 1] (0 = off), got 1.5" \
    "rollout.gpu_memory_utilization=0.9:needs the rollout device's memory: give plan.rollout_device_memory" \
    "plan.rollout_device_memory=1e9 rollout.gpu_memory_utilization=0.9:plan.rollout_device_memory=1e+09 bytes does not hold" \
    "plan.rollout_device_memory=141e9:plan.rollout_device_memory=1.41e+11 is set but rollout.gpu_memory_utilization is 0" \
    "rollout.kv_cache_bytes=100 rollout.gpu_memory_utilization=0.5:both give the KV budget" \
    "plan.mean_response_length=99999:plan.mean_response_length must be in 0..data.max_response_length (20480; 0 = the cap), got 99999" \
    "plan.mean_response_length=100:plan.mean_response_length=100 and rollout.synthetic_length.alpha=1 both give" \
    "plan.codec.threshold.ratio=0.5:plan.codec.threshold.ratio must be > 1 (exact bytes / sent bytes), got 0.5" \
    "plan.codec.onebit.encode_ns=-2:plan.codec.onebit.encode_ns must be ≥ 0 nanoseconds per element, got -2" \
    "plan.link_bandwidth=-1:plan.link_bandwidth must be ≥ 0 bytes/s (0 = not given), got -1" \
    "plan.train_flops=-1:plan.train_flops must be ≥ 0 FLOP/s (0 = not given), got -1"; do
    IFS=: read -r kv want <<<"$bad"
    # shellcheck disable=SC2086
    $M plan "${PA[@]}" $kv >"$OUT/out" 2>"$OUT/err"
    [[ $? -eq 1 ]] && grep -qF -- "$want" "$OUT/err" && [[ ! -s $OUT/out ]] && ok || fail "plan $kv not refused with '$want' (before any table): $(cat "$OUT/err")"
done

# --- where compression pays (issue 29): the schemes' exchange over plain DP 8 on a 10 Gbit/s link, and the
# practice's worked row (30 GB over 8 GPUs, 420 ms exact: 125 GB/s; moerl's CPU codecs at 68 ns/element for onebit
# lose there, onebit_adam's crossover 8·(7 − 0.21875)/(8.9·9/8 + 16.2) ns = 2.07 Gbit/s)
$M plan --model examples/qwen3_30b_a3b --json trainer.n_ranks=8 plan.link_bandwidth=1.25e9 plan.train_flops=1e14 \
    actor.ppo_max_token_len_per_gpu=32768 >"$OUT/x.json" 2>"$OUT/err" || fail "plan compression rows: $(cat "$OUT/err")"
r=$(/usr/bin/python3 - "$OUT/x.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); g = {s["scheme"]: s for s in d["grad_exchange"]["schemes"]}
p = {s["scheme"]: s for s in d["grad_exchange_practice"]["schemes"]}
n, D, bw = d["n_params"], 8, 1.25e9
want = {"none": (7, 0), "onebit": (7 * (1 / 8 + 4 / 256), 8.9 + 8 * 8.1), "threshold": (7 * 4 / 11.3, 22.9 + 8 * 5.4),
        "onebit_adam": (2 * 7 / 8 / 8, 8.9 * 9 / 8 + 2 * 8.1)}
bad = []
for s, (b, c) in want.items():
    ex = n * (c * 1e-9 + b / bw)
    if abs(g[s]["bytes_per_element"] - b) > 1e-12 or abs(g[s]["exchange_s"] - ex) > 1e-9 * ex:
        bad.append((s, g[s]["exchange_s"], ex))
    if s != "none" and abs(g[s]["crossover_bandwidth"] - (7 - b) / (c * 1e-9)) > 1e-6 * (7 - b) / (c * 1e-9):
        bad.append((s, "crossover", g[s]["crossover_bandwidth"]))
if abs(p["none"]["exchange_s"] - 0.42) > 1e-12 or abs(p["onebit_adam"]["crossover_bandwidth"] * 8 / 1e9 - 2.0699) > 1e-3:
    bad.append(("practice", p["none"]["exchange_s"], p["onebit_adam"]["crossover_bandwidth"]))
if d["grad_exchange"]["rule_of_thumb"] != 1 or d["grad_exchange_practice"]["rule_of_thumb"] != 1:
    bad.append("rule")
print("ok" if not bad else bad)
PY
)
[[ $r == ok ]] && ok || fail "compression rows against the hand formulas: $r"
# one trainer rank exchanges nothing: no crossover claimed
$M plan --config examples/smoke.yaml 2>/dev/null | grep -qF "| onebit | 0 | 1× | 0 | — | — | no exchange on one rank |" && ok ||
    fail "plan on one trainer rank: $($M plan --config examples/smoke.yaml 2>&1 | grep onebit)"
# the compute per update is the update's FLOPs shared by the trainer devices: half as long on twice the ranks
cs() { $M plan --model examples/qwen3_30b_a3b --json plan.train_flops=1e14 "$@" 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["grad_exchange"]["compute_s"])'; }
r=$(/usr/bin/python3 -c "a, b = $(cs trainer.n_ranks=4), $(cs trainer.n_ranks=8); print(a > 0 and abs(a - 2 * b) <= 1e-12 * a)")
[[ $r == True ]] && ok || fail "plan's compute per update on 4 vs 8 ranks: $r"
$M plan --model examples/qwen3_30b_a3b trainer.n_ranks=8 >"$OUT/x.txt" 2>&1
grep -qF "| onebit_adam | 0.2188 | 32× |" "$OUT/x.txt" && grep -qF "the 8×A100 practice" "$OUT/x.txt" &&
    grep -qF "rule of thumb (compress above 1 MB and when communication exceeds 20% of compute)" "$OUT/x.txt" &&
    ok || fail "plan's compression table: $(grep -A8 "gradient exchange" "$OUT/x.txt")"

# --- whole GRPO groups per data-parallel pipeline (rl_check_pipeline_groups, shared with moerl rl): dp 2 × pp 2
# with 41-token sequences. (a) 3 groups of 3 over 2 pipelines: one gets 1 group, 3 sequences of 41 tokens one per
# micro-batch, odd for interleaving; (b) one sequence per update: a pipeline gets 1 or 0, below 2 stages; (c) one
# group of 3, 82 tokens per micro-batch: a pipeline gets 3 sequences (2 or 3 micro-batches) or none — runs.
GRP=(--config examples/smoke.yaml model.num_hidden_layers=4 trainer.n_ranks=4 actor.pipeline_parallel_size=2
     data.max_prompt_length=33)
GCASES=("refuse|a pipeline can get 1 group of rollout.n=3|actor.virtual_pipeline_parallel_size=2 rollout.n=3 actor.ppo_mini_batch_size=3 actor.ppo_max_token_len_per_gpu=41"
        "refuse|its 1 sequence makes at most 1 micro-batch, fewer than the 2 stages|rollout.n=1 actor.ppo_mini_batch_size=1"
        "run|pipeline: 2 stages × 1 chunk, 3 micro-batches per update|rollout.n=3 actor.ppo_mini_batch_size=1 actor.ppo_max_token_len_per_gpu=82")
for gc in "${GCASES[@]}"; do
    IFS='|' read -r want text keys <<<"$gc"
    # shellcheck disable=SC2086
    $M plan "${GRP[@]}" $keys >"$OUT/gplan.out" 2>"$OUT/gplan.err"
    rc=$?
    if [[ $want == refuse ]]; then
        [[ $rc -eq 1 ]] && grep -qF -- "$text" "$OUT/gplan.err" && ok || fail "plan $keys: exit $rc, want a refusal saying '$text': $(cat "$OUT/gplan.err")"
    else
        [[ $rc -eq 0 ]] && grep -qF -- "$text" "$OUT/gplan.out" && ok || fail "plan $keys: exit $rc, want '$text': $(cat "$OUT/gplan.err")"
    fi
done
# data.max_prompt_length unset: the refusal names plan's assumption (512) and the key to set
$M plan --config examples/smoke.yaml data.max_prompt_length=0 actor.ppo_max_token_len_per_gpu=100 >/dev/null 2>"$OUT/unset.err"
[[ $? -eq 1 ]] && grep -qF "data.max_prompt_length unset (0 = no limit in rl; plan assumes 512)" "$OUT/unset.err" &&
    grep -qF "or set data.max_prompt_length" "$OUT/unset.err" && ok || fail "unset max_prompt_length message: $(cat "$OUT/unset.err")"

# the check on the length gives the capped length, named
grep -qF "capped at 120 by the model's context (max_position_embeddings 128)" "$OUT/unset.err" && ok ||
    fail "the capped prompt length not named: $(cat "$OUT/unset.err")"

# --- plan checks the keys moerl rl checks, with rl's words (rl_check_config_keys): each value below is refused
# by plan naming the key, and by `moerl rl` (before any folder exists) with the same message
# same_refusal WANT KEY=VALUE...: plan and rl on the smoke config both exit 1, plan's stderr holds WANT, and the
# message after "moerl plan: " equals the one after "moerl rl: "
same_refusal() {
    local want=$1
    shift
    $M plan --config examples/smoke.yaml "$@" >/dev/null 2>"$OUT/p.err"
    local prc=$?
    $M rl --config examples/smoke.yaml trainer.default_local_dir="$OUT/rl_refused" "$@" >/dev/null 2>"$OUT/r.err"
    local rrc=$?
    local pm rm
    pm=$(sed -n 's/^moerl plan: //p' "$OUT/p.err")
    rm=$(sed -n 's/^moerl rl: //p' "$OUT/r.err")
    [[ $prc -eq 1 && $rrc -eq 1 ]] && grep -qF -- "$want" "$OUT/p.err" && [[ -n $pm && $pm == "$rm" ]] &&
        [[ ! -e $OUT/rl_refused ]] && ok ||
        fail "$* not refused alike naming '$want': plan exit $prc ($(cat "$OUT/p.err")), rl exit $rrc ($(cat "$OUT/r.err"))"
}
same_refusal "async_training.staleness_threshold must be a finite number ≥ 0, got -1" async_training.staleness_threshold=-1
same_refusal "rollout.top_p must be in (0, 1], got 2" rollout.top_p=2
same_refusal "rollout.top_k=0 / rollout.top_p=0.9: truncated sampling is refused" rollout.top_p=0.9
same_refusal "actor.optim.lr must be a finite number ≥ 0, got inf" actor.optim.lr=inf
same_refusal "actor.optim.beta1/beta2 must be in [0, 1), got 0.9, 1" actor.optim.beta2=1
same_refusal "actor.clip_ratio_low must be in [0, 1), got -0.1" actor.clip_ratio_low=-0.1
same_refusal "async_training.mode: 'bogus' is not one of async, lockstep, sync" async_training.mode=bogus
same_refusal "algorithm.adv_estimator: 'bogus' is not one of grpo" algorithm.adv_estimator=bogus
same_refusal "actor.loss_agg_mode" actor.loss_agg_mode=bogus
same_refusal "trainer.resume_mode: 'bogus' is not auto or disable" trainer.resume_mode=bogus
same_refusal "trainer.allocator: 'bogus' (override) is not malloc, pool or jemalloc" trainer.allocator=bogus
same_refusal "trainer.total_epochs must be ≥ 1, got 0" trainer.total_epochs=0
same_refusal "algorithm.filter_groups.enable=true with rollout.n=1" algorithm.filter_groups.enable=true rollout.n=1
same_refusal "actor.router_replay.mode=R2 records the routes in the old-logprob pass" actor.router_replay.mode=R2
same_refusal "data.n_test=0 generates no held-out rows, but trainer.val_n=4 evaluates on them" data.n_test=0 trainer.val_n=4
# the sequence against the model's context (rl_check_seq_len): responses that leave no room for a prompt in the
# smoke model's 128 positions are refused by both (rl names its data's longest prompt, plan the shortest one)
$M plan --config examples/smoke.yaml data.max_response_length=128 >/dev/null 2>"$OUT/p.err"
prc=$?
$M rl --config examples/smoke.yaml trainer.default_local_dir="$OUT/rl_ctx" data.max_response_length=128 >/dev/null 2>"$OUT/r.err"
rrc=$?
ctx="+ data.max_response_length 128 exceeds the model's context max_position_embeddings 128: shorten the prompts"
[[ $prc -eq 1 && $rrc -eq 1 ]] && grep -qF "plan: data.max_prompt_length unset: the shortest prompt (1 token) $ctx" "$OUT/p.err" &&
    grep -qF "rl: the longest prompt of the training data generated by data.task=arith" "$OUT/r.err" &&
    grep -qF "$ctx" "$OUT/r.err" && [[ ! -e $OUT/rl_ctx ]] && ok ||
    fail "responses of the whole context: plan exit $prc ($(cat "$OUT/p.err")), rl exit $rrc ($(cat "$OUT/r.err"))"
# data.max_prompt_length + data.max_response_length past the context: plan refuses (every prompt rl admits may
# be that long); rl refuses this data (its prompts + 100 tokens do not fit either)
$M plan --config examples/smoke.yaml data.max_prompt_length=40 data.max_response_length=100 >/dev/null 2>"$OUT/p.err"
prc=$?
$M rl --config examples/smoke.yaml trainer.default_local_dir="$OUT/rl_ctx" data.max_prompt_length=40 \
    data.max_response_length=100 >/dev/null 2>"$OUT/r.err"
rrc=$?
ctx="+ data.max_response_length 100 exceeds the model's context max_position_embeddings 128"
[[ $prc -eq 1 && $rrc -eq 1 ]] && grep -qF "plan: data.max_prompt_length (40 tokens) $ctx" "$OUT/p.err" &&
    grep -qF "$ctx" "$OUT/r.err" && ok ||
    fail "prompt + response past the context: plan exit $prc ($(cat "$OUT/p.err")), rl exit $rrc ($(cat "$OUT/r.err"))"
# a key given twice on the command line: the last value is used (tests/e2e_*.sh build commands from shared key
# lists and set one again), with a warning naming the key and both values — plan and rl alike
seqs=$($M plan --config examples/smoke.yaml --json rollout.max_num_seqs=16 rollout.max_num_seqs=48 2>"$OUT/p.err" |
    json_field max_num_seqs 2>/dev/null)
dup="rollout.max_num_seqs is given twice on the command line: rollout.max_num_seqs=16, then rollout.max_num_seqs=48; the last value (48) is used"
[[ $seqs == 48 ]] && grep -qF "$dup" "$OUT/p.err" && ok || fail "plan with a key twice: max_num_seqs '$seqs' (want 48), $(cat "$OUT/p.err")"
$M plan --config examples/smoke.yaml rollout.max_num_seqs=48 >/dev/null 2>"$OUT/p.err"
! grep -qF "given twice" "$OUT/p.err" && ok || fail "plan warns about a key given once: $(cat "$OUT/p.err")"
$M plan --config examples/smoke.yaml rollout.max_num_seqs=48 rollout.max_num_seqs=48 >/dev/null 2>"$OUT/p.err"
! grep -qF "given twice" "$OUT/p.err" && ok || fail "plan warns about a key given twice with one value: $(cat "$OUT/p.err")"
# rl: the last of rollout.top_p=0.5 rollout.top_p=2 is the one checked (refused naming 2), after the warning
$M rl --config examples/smoke.yaml trainer.default_local_dir="$OUT/rl_dup" rollout.top_p=0.5 rollout.top_p=2 \
    >/dev/null 2>"$OUT/r.err"
rrc=$?
[[ $rrc -eq 1 ]] && grep -qF "rollout.top_p is given twice on the command line: rollout.top_p=0.5, then rollout.top_p=2; the last value (2) is used" "$OUT/r.err" &&
    grep -qF "rollout.top_p must be in (0, 1], got 2" "$OUT/r.err" && ok || fail "rl with a key twice: exit $rrc, $(cat "$OUT/r.err")"

# --- traffic against a real MPI run
if [[ ${MOERL_NO_MPI:-0} == 1 || ${NO_MPI:-0} == 1 ]]; then
    echo "e2e_plan: MPI part skipped (MOERL_NO_MPI=1)"
elif ! command -v mpirun >/dev/null 2>&1 || [[ ! -x $BUILD/moerl-mpi ]]; then
    fail "mpirun or $BUILD/moerl-mpi missing (scripts/setup.sh; MOERL_NO_MPI=1 to skip)"
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    # --- what moerl rl refuses only under mpirun (the rollout TP against the model, lockstep over ranks): plan's
    # message holds rl's (rl_check_rollout_tp is the one check; lockstep's words are rl's)
    for mc in "3|rollout.tensor_model_parallel_size=2 model.intermediate_size=129|rollout.tensor_model_parallel_size=2 must divide the model's intermediate_size (129)" \
        "3|trainer.n_ranks=2 async_training.mode=lockstep|async_training.mode=lockstep runs in one process only; under mpirun use async or sync"; do
        IFS='|' read -r np keys text <<<"$mc"
        # shellcheck disable=SC2086
        $M plan --config examples/smoke.yaml rollout.n_ranks=$((np - 1)) $keys >/dev/null 2>"$OUT/p.err"
        prc=$?
        # shellcheck disable=SC2086
        timeout 120 mpirun --oversubscribe -np "$np" "$BUILD/moerl-mpi" rl --config examples/smoke.yaml $keys \
            trainer.default_local_dir="$OUT/mpi_refused" trainer.n_threads=1 >/dev/null 2>"$OUT/r.err"
        rrc=$?
        [[ $prc -eq 1 && $rrc -ne 0 ]] && grep -qF -- "plan: $text" "$OUT/p.err" && grep -qF -- "$text" "$OUT/r.err" &&
            ok || fail "$keys: want '$text' from plan (exit $prc: $(cat "$OUT/p.err")) and rl under mpirun -np $np (exit $rrc: $(grep 'moerl rl' "$OUT/r.err"))"
    done
    KEYS=(trainer.n_ranks=2 trainer.total_training_steps=4 async_training.trigger_parameter_sync_step=2
          async_training.require_batches=2 actor.ppo_mini_batch_size=2 rollout.n=2 data.max_response_length=24
          model.max_position_embeddings=128 rollout.synthetic_length.alpha=0)
    if timeout 300 mpirun --oversubscribe -np 3 "$BUILD/moerl-mpi" rl --config examples/bench_async.yaml \
        trainer.default_local_dir="$OUT/run" "${KEYS[@]}" >"$OUT/rl.json" 2>"$OUT/rl.log"; then
        ok
        $M plan --config examples/bench_async.yaml "${KEYS[@]}" --json >"$OUT/plan.json" 2>"$OUT/plan.err" || fail "plan: $(cat "$OUT/plan.err")"
        r=$(/usr/bin/python3 - "$OUT/run/metrics.jsonl" "$OUT/plan.json" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
plan = json.load(open(sys.argv[2]))
wins = [r for r in recs if "perf/grad_bytes_sent" in r]
steps_per_version = plan["sync_every_steps"]
want_grad = plan["allreduce_bytes_per_update"] * plan["updates_per_step"] * steps_per_version
bad = []
for r in wins:
    if r["perf/grad_bytes_sent"] != want_grad:
        bad.append("grad all-reduce: counted %r, plan %r" % (r["perf/grad_bytes_sent"], want_grad))
    if r["perf/weight_bcast_bytes"] != plan["weight_bcast_bytes_per_sync"]:
        bad.append("weight broadcast: counted %r, plan %r" % (r["perf/weight_bcast_bytes"], plan["weight_bcast_bytes_per_sync"]))
print("OK %d versions: gradient %d bytes per version, broadcast %d bytes" % (len(wins), want_grad, plan["weight_bcast_bytes_per_sync"]) if wins and not bad else "BAD " + ("; ".join(bad) or "no metrics with perf/grad_bytes_sent"))
PY
)
        echo "$r"
        [[ $r == OK* ]] && ok || fail "traffic: $r"
    else
        fail "mpirun -np 3 moerl-mpi rl failed: $(tail -5 "$OUT/rl.log")"
    fi
    # --- the group cases above under moerl rl (5 processes: 4 trainer ranks, 1 rollout): the same verdict as plan
    for gc in "${GCASES[@]}"; do
        IFS='|' read -r want text keys <<<"$gc"
        rm -rf "$OUT/grp"
        # shellcheck disable=SC2086
        timeout 300 mpirun --oversubscribe -np 5 "$BUILD/moerl-mpi" rl "${GRP[@]}" $keys trainer.default_local_dir="$OUT/grp" \
            sft.total_training_steps=0 trainer.total_training_steps=1 trainer.val_n=0 trainer.test_freq=0 data.n_test=8 \
            trainer.n_threads=1 trainer.resume_mode=disable trainer.save_freq=-1 >/dev/null 2>"$OUT/grp.log"
        rc=$?
        if [[ $want == refuse ]]; then
            [[ $rc -eq 1 ]] && grep -qF -- "${text#a pipeline can get }" "$OUT/grp.log" && ok ||
                fail "rl $keys: exit $rc, want plan's refusal '$text': $(grep 'moerl rl' "$OUT/grp.log")"
        else
            [[ $rc -eq 0 ]] && ok || fail "rl $keys: exit $rc, plan accepts it: $(tail -3 "$OUT/grp.log")"
        fi
    done
    # --- every model-parallel layout moerl runs: plan's traffic per group and operation equals the
    # counters byte for byte, its memory per rank (EP slice, the PP stage's range, held floats and moments)
    # is within 10% of moerl's own accounting; FSDP's shard is plan's exactly and its peak gathered between
    # plan's bounds (where between is timing: whether a reduce-scatter has completed when fsdp.c polls)
    # (tests/test_dist_plan.c). The pipeline as par_state_init builds it (stage-owned: the stage
    # all-reduce over grid.stage_comm, with tied embeddings the exchange between first and last
    # stage), and once replicated (pp_state_new alone, the bubble benchmark's). EP with the
    # all-to-all dispatcher at capacity factor E/K = 2 (no spill: the spill round is data-dependent).
    # FSDP also with actor.fsdp_config.reshard_after_forward=false (units kept, one reduce-scatter per
    # update): its traffic and its peak (exact: nothing completes early) equal plan's held rows.
    # Pipeline × FSDP (pp 2 × fsdp 2, kept units, interleaved v 3, and over 8 ranks with 2 HSDP replicas per
    # stage): the stage's FSDP collectives, replicas, p2p and the norm's sum over the stages byte for byte,
    # every stage's shard, peak bounds and activation slots (plan_pp_fsdp_stage).
    # TP × DP (tp 2, tp 2 × dp 2 with and without expert-TP, tp 4 with the 2 kv heads replicated): the bytes
    # tp_comm and dp_comm count in the logprob pass and an update equal plan's tp rows, the slice plan's.
    # TP × EP (tp 2 × ep 2, experts whole): also ep_comm's all-to-alls and the expert gradient sum (ep_dp_comm),
    # and the scratch tp_ep_state holds against plan's tp_ep_scratch row.
    # Megatron SP (tp 2; tp 2 × dp 2 with experts whole: the ln2 gathers): tp_comm's reduce-scatters and
    # all-gathers equal plan's SP rows, the arena (residual stream on ⌈N/tp⌉ rows) plan's. SP × EP (tp 2 × ep 2,
    # experts whole): the MoE on each rank's own rows (no ln2 or expert-row gathers; the aux statistics and routers'
    # sums), the arena shrunk as SP's.
    # TP × pipeline (tp 2 × pp 2, with tied embeddings, and × dp 2): per stage tp_comm's bytes, the stage's
    # all-reduce over dp_comm and pp_comm's p2p and sums equal plan's rows; the stage's range of the slice, its
    # moments and activation slots plan's, exactly; with activation recompute (full, selective) the same rows,
    # full recompute's repeated o_proj all-reduces among tp_comm's, and the slots the recompute arena.
    T=$BUILD/mpi/tests/test_dist_plan
    if [[ ! -x $T ]]; then
        fail "$T not built"
    else
        while IFS='|' read -r np keys; do
            # shellcheck disable=SC2086
            o=$(timeout 300 mpirun --oversubscribe -np "$np" "$T" $keys 2>&1 </dev/null)
            rc=$?
            line=$(echo "$o" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
            echo "test_dist_plan -np $np $keys: $(echo "$o" | grep -E '^fsdp ' | tail -1) ($line)"
            [[ $rc -eq 0 && $line == *", 0 failed" ]] && ok || { fail "test_dist_plan -np $np $keys"; echo "$o" | tail -20; }
        done <<'LAYOUTS'
2|
3|
2|actor.fsdp_config.fsdp_size=2
3|actor.fsdp_config.fsdp_size=3
4|actor.fsdp_config.fsdp_size=4
4|actor.fsdp_config.fsdp_size=2
2|actor.ulysses_sequence_parallel_size=2
4|actor.ulysses_sequence_parallel_size=2
4|actor.ulysses_sequence_parallel_size=4
2|actor.pipeline_parallel_size=2
4|actor.pipeline_parallel_size=2
4|actor.pipeline_parallel_size=4
2|actor.pipeline_parallel_size=2 model.tie_word_embeddings=true
4|actor.pipeline_parallel_size=2 model.tie_word_embeddings=true
4|actor.pipeline_parallel_size=4 model.tie_word_embeddings=true
4|actor.pipeline_parallel_size=2 plan.pp_params=replicated
2|actor.pipeline_parallel_size=2 actor.virtual_pipeline_parallel_size=2
4|actor.pipeline_parallel_size=2 actor.virtual_pipeline_parallel_size=3 model.tie_word_embeddings=true
4|actor.pipeline_parallel_size=2 actor.virtual_pipeline_parallel_size=2 plan.pp_params=replicated
2|actor.expert_parallel_size=2 actor.moe.capacity_factor=2
4|actor.expert_parallel_size=2 actor.moe.capacity_factor=2
4|actor.expert_parallel_size=4 actor.moe.capacity_factor=2
4|actor.ulysses_sequence_parallel_size=2 actor.expert_parallel_size=2 actor.moe.capacity_factor=2
4|actor.ulysses_sequence_parallel_size=2 actor.fsdp_config.fsdp_size=2
4|actor.expert_parallel_size=2 actor.fsdp_config.fsdp_size=2 actor.moe.capacity_factor=2
4|actor.pipeline_parallel_size=2 actor.expert_parallel_size=2 actor.moe.capacity_factor=2
8|actor.pipeline_parallel_size=2 actor.expert_parallel_size=2 actor.moe.capacity_factor=2
4|actor.pipeline_parallel_size=2 actor.expert_parallel_size=2 actor.moe.capacity_factor=2 model.tie_word_embeddings=true
4|actor.pipeline_parallel_size=2 actor.expert_parallel_size=2 actor.virtual_pipeline_parallel_size=3 actor.moe.capacity_factor=2
4|actor.pipeline_parallel_size=2 actor.fsdp_config.fsdp_size=2
4|actor.pipeline_parallel_size=2 actor.fsdp_config.fsdp_size=2 actor.fsdp_config.reshard_after_forward=false
4|actor.pipeline_parallel_size=2 actor.fsdp_config.fsdp_size=2 actor.virtual_pipeline_parallel_size=3
8|actor.pipeline_parallel_size=2 actor.fsdp_config.fsdp_size=2
2|actor.fsdp_config.fsdp_size=2 actor.fsdp_config.reshard_after_forward=false
3|actor.fsdp_config.fsdp_size=3 actor.fsdp_config.reshard_after_forward=false
4|actor.fsdp_config.fsdp_size=2 actor.fsdp_config.reshard_after_forward=false
4|actor.fsdp_config.fsdp_size=4 model.tie_word_embeddings=true
4|actor.fsdp_config.fsdp_size=4 model.tie_word_embeddings=true actor.fsdp_config.reshard_after_forward=false
4|actor.ulysses_sequence_parallel_size=2 actor.fsdp_config.fsdp_size=2 actor.fsdp_config.reshard_after_forward=false
4|actor.expert_parallel_size=2 actor.fsdp_config.fsdp_size=2 actor.moe.capacity_factor=2 actor.fsdp_config.reshard_after_forward=false
2|actor.megatron.tensor_model_parallel_size=2
4|actor.megatron.tensor_model_parallel_size=2
4|actor.megatron.tensor_model_parallel_size=2 actor.megatron.expert_tensor_parallel_size=1
4|actor.megatron.tensor_model_parallel_size=4
4|actor.megatron.tensor_model_parallel_size=2 actor.megatron.expert_tensor_parallel_size=1 actor.expert_parallel_size=2 actor.moe.capacity_factor=2
2|actor.megatron.tensor_model_parallel_size=2 actor.megatron.sequence_parallel=true
2|actor.megatron.tensor_model_parallel_size=2 model.enable_gradient_checkpointing=true
4|actor.megatron.tensor_model_parallel_size=2 model.enable_gradient_checkpointing=true actor.recompute_granularity=selective
4|actor.megatron.tensor_model_parallel_size=2 actor.megatron.expert_tensor_parallel_size=1 actor.expert_parallel_size=2 actor.moe.capacity_factor=2 model.enable_gradient_checkpointing=true
2|actor.megatron.tensor_model_parallel_size=2 actor.megatron.sequence_parallel=true model.enable_gradient_checkpointing=true
2|actor.megatron.tensor_model_parallel_size=2 actor.megatron.sequence_parallel=true model.enable_gradient_checkpointing=true actor.recompute_granularity=selective
4|actor.megatron.tensor_model_parallel_size=2 actor.megatron.sequence_parallel=true actor.megatron.expert_tensor_parallel_size=1
4|actor.megatron.tensor_model_parallel_size=2 actor.megatron.sequence_parallel=true actor.megatron.expert_tensor_parallel_size=1 actor.expert_parallel_size=2 actor.moe.capacity_factor=2
4|actor.megatron.tensor_model_parallel_size=2 actor.pipeline_parallel_size=2
4|actor.megatron.tensor_model_parallel_size=2 actor.pipeline_parallel_size=2 model.tie_word_embeddings=true
8|actor.megatron.tensor_model_parallel_size=2 actor.pipeline_parallel_size=2
4|actor.megatron.tensor_model_parallel_size=2 actor.pipeline_parallel_size=2 model.enable_gradient_checkpointing=true
4|actor.megatron.tensor_model_parallel_size=2 actor.pipeline_parallel_size=2 model.enable_gradient_checkpointing=true actor.recompute_granularity=selective model.tie_word_embeddings=true
LAYOUTS
    fi
fi
# routing replay: the engine's routing record is planned per rollout device (max_num_seqs · max_model_len · MoE
# layers · K · 2 bytes: the smoke model has 2 MoE layers, top-2); R3 without the record is refused as rl refuses it
rr=$($M plan --config examples/smoke.yaml --json rollout.enable_rollout_routing_replay=true 2>/dev/null | json_field routing_record_bytes 2>/dev/null)
seqs=$($M plan --config examples/smoke.yaml --json 2>/dev/null | json_field max_num_seqs 2>/dev/null)
len=$(mml)
want=$((seqs * len * 2 * 2 * 2))
[[ -n "$rr" && "${rr%.*}" == "$want" ]] && ok || fail "plan's routing record: ${rr:-missing} bytes, want $want (max_num_seqs $seqs × $len tokens × 2 MoE layers × top-2 × 2 bytes)"
$M plan --config examples/smoke.yaml actor.router_replay.mode=R3 >/dev/null 2>"$OUT/err"
rc=$?
[[ $rc -eq 1 ]] && grep -qF "actor.router_replay.mode=R3 replays the rollout's routes, which the engine records only with rollout.enable_rollout_routing_replay=true" "$OUT/err" && ok ||
    fail "plan actor.router_replay.mode=R3 without the record: exit $rc, $(cat "$OUT/err")"
$M plan --config examples/smoke.yaml actor.optim.name=onebit_adam trainer.n_ranks=2 >/dev/null 2>"$OUT/err"
grep -qF "moerl plan does not model compressed exchanges" "$OUT/err" && ok || fail "plan with onebit_adam: no warning ($(cat "$OUT/err"))"
# 1-bit Adam's combinations moerl rl refuses, refused by plan with rl's messages (rl_check_optim_keys)
for bad in "actor.grad_compression=onebit:set actor.grad_compression=none" \
    "actor.optim.freeze_step=0:use freeze_step ≥ 1" \
    "actor.fsdp_config.fsdp_size=2:supports data-parallel trainer ranks only"; do
    $M plan --config examples/smoke.yaml actor.optim.name=onebit_adam trainer.n_ranks=2 data.max_prompt_length=40 \
        "${bad%%:*}" >/dev/null 2>"$OUT/err"
    rc=$?
    [[ $rc -ne 0 ]] && grep -qF "${bad#*:}" "$OUT/err" && ok ||
        fail "plan onebit_adam ${bad%%:*}: rc $rc, want a refusal with '${bad#*:}' ($(cat "$OUT/err"))"
done

finish
