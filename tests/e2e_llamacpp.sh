#!/usr/bin/env bash
# End-to-end parity of moerl export-gguf with llama.cpp: the prebuilt llama.cpp library (npm
# @node-llama-cpp/linux-x64, installed by scripts/setup.sh) loads the GGUF moerl writes of the
# PyTorch-checked test model B (tests/ref/gen_model.py: 2 layers, 16 experts top-4, head_dim 16,
# norm_topk_prob true, untied) and, fed the same tokens, gives the logits moerl's rollout engine
# gives at every greedy step, and the same greedy token. Also: a model llama.cpp's qwen3moe
# cannot express is refused with the reason. Ends with "N passed, N failed".
EXPECT_ERR_GREP=-qi  # expect_err: case-insensitive patterns
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
TD=${MOERL_TESTDATA:-$BUILD/testdata}

# shellcheck source=../bench/llamacpp_build.sh
source bench/llamacpp_build.sh; rc=$?
if [[ $rc -ne 0 ]]; then bad "build bench/llamacpp_decode.c against llama.cpp (rc $rc; scripts/setup.sh installs it)"; finish; fi

$M export-gguf --model "$TD/model_b" --out "$W/b.gguf" 2>"$W/err"
check "export-gguf model_b" test $? -eq 0
check "export-gguf wrote a GGUF v3 file" bash -c "head -c 4 '$W/b.gguf' | grep -q GGUF && [[ \$(od -An -tu4 -j4 -N4 '$W/b.gguf' | tr -d ' ') == 3 ]]"
# Tolerance 1e-5 on max|Δlogit| / (1 + max|logit|): both sides compute in fp32 from the same fp32
# weights and differ only in summation order (seen: ≤ 3e-7 over 2 layers); a layout mistake
# (gate/up swapped, rope pairing, a transposed matrix) moves logits by O(0.1–1). llama.cpp's CPU
# flash attention rounds through fp16 (seen: 6e-4), so it is turned off for this comparison.
for prompt in 3,17,42,99,5,64 7,1,130,2,2,2,9,100,55,31,0,12; do
    MOERL_LLAMA_FLASH_ATTN=off "$LLAMACPP_BIN" --lib-dir "$LLAMA_LIB_DIR" --parity --model "$TD/model_b" \
        --gguf "$W/b.gguf" --prompt "$prompt" --steps 12 --tol 1e-5 >"$W/parity" 2>&1
    rc=$?
    check "llama.cpp logits and greedy tokens equal moerl's (prompt $prompt): $(tail -1 "$W/parity")" test $rc -eq 0
    check "parity ran 12 steps" test "$(grep -c '^step' "$W/parity")" -eq 12
done
# the comparison can fail: a GGUF whose gate and up experts are swapped must not pass
expect_err "an existing --out is kept without --force" "pass --force" \
    $M export-gguf --model "$TD/model_b" --out "$W/b.gguf" --dtype bf16
$M export-gguf --model "$TD/model_b" --out "$W/b.gguf" --dtype bf16 --force 2>"$W/err"
check "export-gguf --dtype bf16 --force" test $? -eq 0
MOERL_LLAMA_FLASH_ATTN=off "$LLAMACPP_BIN" --lib-dir "$LLAMA_LIB_DIR" --parity --model "$TD/model_b" \
    --gguf "$W/b.gguf" --prompt 3,17,42,99,5,64 --steps 4 --tol 1e-5 >"$W/parity" 2>&1
check "bf16-rounded weights are detected at 1e-5 (the check is sensitive)" test $? -eq 1

expect_err "a dense MLP layer is refused" "dense MLP layer" $M export-gguf --model "$TD/model_a" --out "$W/a.gguf"
check "nothing written for a refused export" test ! -e "$W/a.gguf"
expect_err "unknown dtype" "expected f32 or bf16" $M export-gguf --model "$TD/model_b" --out "$W/x.gguf" --dtype f16
expect_err "missing --out" "required" $M export-gguf --model "$TD/model_b"
cp -r "$TD/model_b" "$W/ck"
expect_err "never into the checkpoint being read" "inside the checkpoint folder" \
    $M export-gguf --model "$W/ck" --out "$W/ck/model.safetensors" --force
check "the checkpoint is untouched" cmp -s "$TD/model_b/model.safetensors" "$W/ck/model.safetensors"
expect_err "missing model" "config.json" $M export-gguf --model "$W/nope" --out "$W/x.gguf"
finish
