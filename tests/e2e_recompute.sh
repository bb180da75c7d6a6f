#!/usr/bin/env bash
# Activation recompute through the command line (docs/parallelism.md "Activation recompute"):
# `moerl sft` on examples/sft.yaml for 4 steps without recompute, with model.enable_gradient_checkpointing=true
# (full) and with actor.recompute_granularity=selective writes byte-identical checkpoints (model and optimizer)
# and the same losses; `moerl plan` prints a smaller recompute row for full than for selective, both below
# no recompute; bad values are refused naming the key. Ends with "N passed, N failed".
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
run_sft() { # name, extra keys...
    local name=$1
    shift
    OMP_NUM_THREADS=2 "$M" sft --config examples/sft.yaml trainer.total_training_steps=4 trainer.test_freq=0 \
        trainer.default_local_dir="$W/$name" "$@" >"$W/$name.log" 2>&1
}
check "sft without recompute" run_sft none
check "sft full recompute" run_sft full model.enable_gradient_checkpointing=true
check "sft selective recompute" run_sft selective model.enable_gradient_checkpointing=true actor.recompute_granularity=selective
for g in full selective; do
    for f in model.safetensors optimizer.safetensors; do
        check "$g: $f byte-identical to no recompute" cmp -s "$W/none/checkpoint/$f" "$W/$g/checkpoint/$f"
    done
    check "$g: the same metrics lines (losses)" cmp -s <(grep -o '"train/loss":[^,]*' "$W/none/metrics.jsonl") \
        <(grep -o '"train/loss":[^,]*' "$W/$g/metrics.jsonl")
done
check "the losses were logged" grep -q '"train/loss"' "$W/none/metrics.jsonl"
plan_acts() { # granularity keys... → the recompute activations row (GiB)
    "$M" plan --model examples/qwen3_30b_a3b trainer.n_ranks=8 actor.fsdp_config.fsdp_size=-1 \
        actor.ppo_max_token_len_per_gpu=8192 "$@" | sed -n 's/^| activations (recompute) | \([0-9.]*\) |$/\1/p'
}
none=$("$M" plan --model examples/qwen3_30b_a3b trainer.n_ranks=8 actor.fsdp_config.fsdp_size=-1 \
    actor.ppo_max_token_len_per_gpu=8192 | sed -n 's/^| activations (no recompute) | \([0-9.]*\) |$/\1/p')
full=$(plan_acts model.enable_gradient_checkpointing=true)
sel=$(plan_acts model.enable_gradient_checkpointing=true actor.recompute_granularity=selective)
check "plan: full ($full) < selective ($sel) < none ($none) GiB" \
    "$PY" -c "import sys; a, b, c = map(float, sys.argv[1:]); sys.exit(not (a < b < c))" "$full" "$sel" "$none"
expect_err "bad granularity (sft)" "actor.recompute_granularity: 'partial' is not full or selective" \
    "$M" sft --config examples/sft.yaml model.enable_gradient_checkpointing=true actor.recompute_granularity=partial \
    trainer.default_local_dir="$W/bad"
expect_err "granularity without recompute (plan)" "model.enable_gradient_checkpointing is false" \
    "$M" plan --model examples/qwen3_30b_a3b actor.recompute_granularity=selective
finish
