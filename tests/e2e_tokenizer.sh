#!/usr/bin/env bash
# End-to-end tests of the checkpoint's tokenizer on the command line: `moerl tokenize` (ids, decode,
# chat template) on Qwen3's real tokenizer files; a small random Qwen3-MoE with vocab 151936 given
# those files as a published checkpoint folder has them (config.json, safetensors, tokenizer.json,
# tokenizer_config.json, generation_config.json), then generate --prompt/--prompts, eval, sft and
# rl from it, checkpoints carrying the tokenizer files, and the errors: no tokenizer files, a
# checkpoint template that is not Qwen3's (rendered by the Jinja interpreter), an unknown template name.
# Needs $MOERL_TESTDATA/qwen3_tok from tests/ref/gen_tokenizer.py (tests/run.sh runs it first).
# Usage: tests/e2e_tokenizer.sh [BUILD_DIR]; ends with "N passed, N failed".
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
M=$BUILD/moerl
TD=${MOERL_TESTDATA:-$BUILD/testdata}
QT=$TD/qwen3_tok
export OMP_NUM_THREADS=1
if [[ ! -f $QT/tokenizer.json ]]; then bad "$QT/tokenizer.json missing (tests/ref/gen_tokenizer.py makes it)"; finish; fi

# --- moerl tokenize
out=$($M tokenize --model "$QT" --text "Hello, world! I'm here." 2>"$W/err")
check "tokenize ids (Qwen3: Hello , world ! I 'm here .)" test "$out" = '{"tokenizer":"hf-bpe","n":8,"ids":[9707,11,1879,0,358,2776,1588,13]}'
out=$($M tokenize --model "$QT" --decode --text "9707,11,1879,0" 2>"$W/err")
check "tokenize --decode" test "$out" = "Hello, world!"
out=$($M tokenize --model "$QT" --decode --text "[151644, 872, 198]" --skip-special 2>"$W/err")
check "tokenize --decode --skip-special" test "$out" = "$(printf 'user\n')"
out=$($M tokenize --model "$QT" --text "<|im_end|>" --no-special 2>/dev/null)
check "tokenize --no-special keeps <|im_end|> as text" test "$(echo "$out" | grep -c 151645)" -eq 0
out=$($M tokenize --model "$QT" --chat --text '[{"role":"user","content":"hi"}]' 2>"$W/err")
check "tokenize --chat (qwen3) text" grep -q '"template":"qwen3","text":"<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"' <<<"$out"
out=$($M tokenize --model "$QT" --chat --no-thinking --text '[{"role":"user","content":"hi"}]' 2>"$W/err")
check "tokenize --chat --no-thinking" grep -qF 'assistant\n<think>\n\n</think>\n\n"' <<<"$out"
printf 'caf\xc3\xa9 \xff' >"$W/raw.txt"
out=$($M tokenize --model "$QT" --file "$W/raw.txt" --pieces 2>"$W/err")
check "tokenize --file with invalid UTF-8 (U+FFFD)" grep -qF '\uFFFD"]' <<<"$out"
expect_err "tokenize: folder without a tokenizer" "no tokenizer" $M tokenize --model "$W" --text x
expect_err "tokenize: unknown template name" "qwen3" $M tokenize --model "$QT" --chat --chat-template llama --text '[]'
expect_err "tokenize: no input" "exactly one" $M tokenize --model "$QT"

# --- a small random Qwen3-MoE at Qwen3's vocabulary, laid out as a published checkpoint
$M tasks --task arith --out "$W/arith" --n-train 32 --n-test 8 >/dev/null 2>&1
cat >"$W/tiny.yaml" <<YEOF
model: {vocab_size: 151936, hidden_size: 32, intermediate_size: 64, moe_intermediate_size: 32, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_experts: 4, num_experts_per_tok: 2,
        tie_word_embeddings: true}
data: {task: "", train_files: $W/arith/train.jsonl, val_files: $W/arith/test.jsonl, train_batch_size: 4}
trainer: {total_training_steps: 1, default_local_dir: $W/init, val_n: 2, n_threads: 1}
YEOF
$M sft --config "$W/tiny.yaml" >/dev/null 2>"$W/err"
check "random 151936-vocab model written" test -s "$W/init/checkpoint/model.safetensors"
check "a new model's checkpoint carries the byte-tokenizer marker" test -s "$W/init/checkpoint/tokenizer_moerl.json"
D=$W/qwen
mkdir -p "$D"
cp "$W/init/checkpoint/config.json" "$W/init/checkpoint/model.safetensors" "$D/"
cp "$QT/tokenizer.json" "$QT/tokenizer_config.json" "$QT/generation_config.json" "$D/"
$M generate --model "$D" --prompt "What is 2+2?" --max-new-tokens 4 --temperature 0 >"$W/g.jsonl" 2>"$W/err"
check "generate --prompt through Qwen3's tokenizer" grep -q '"text"' "$W/g.jsonl"
$M generate --model "$D" --prompts "$W/arith/test.jsonl" --max-new-tokens 3 --temperature 0 >"$W/g2.jsonl" 2>"$W/err"
check "generate --prompts through Qwen3's tokenizer" test "$(grep -c '"text"' "$W/g2.jsonl")" -eq 8
$M generate --model "$D" --prompt-tokens 9707,11 --max-new-tokens 2 >"$W/g3.jsonl" 2>"$W/err"
check "generate --prompt-tokens decodes text" grep -q '"text"' "$W/g3.jsonl"
$M eval --model "$D" --data "$W/arith/test.jsonl" --n 4 --max-new-tokens 3 >"$W/e.json" 2>"$W/err"
check "eval through Qwen3's tokenizer" grep -q '"accuracy"' "$W/e.json"
sed '/^model:/,/tie_word_embeddings: true}/d' "$W/tiny.yaml" >"$W/from.yaml"
$M sft --config "$W/from.yaml" model.path="$D" trainer.default_local_dir="$W/sft" >/dev/null 2>"$W/sft.err"
check "sft from the folder" test -s "$W/sft/checkpoint/model.safetensors"
check "sft logs the checkpoint's tokenizer" grep -q "hf-bpe.*chat template qwen3" "$W/sft.err"
check "sft checkpoint carries tokenizer.json" cmp -s "$QT/tokenizer.json" "$W/sft/checkpoint/tokenizer.json"
check "sft checkpoint carries tokenizer_config.json" cmp -s "$QT/tokenizer_config.json" "$W/sft/checkpoint/tokenizer_config.json"
check "sft checkpoint carries generation_config.json" cmp -s "$QT/generation_config.json" "$W/sft/checkpoint/generation_config.json"
check "sft checkpoint has no byte-tokenizer marker" test ! -e "$W/sft/checkpoint/tokenizer_moerl.json"
sed '/^model:/,/^data:/{/^data:/!d}' examples/smoke.yaml >"$W/rl.yaml"  # the smoke run without its architecture
$M rl --config "$W/rl.yaml" model.path="$D" data.task= data.train_files="$W/arith/train.jsonl" \
    data.val_files="$W/arith/test.jsonl" sft.total_training_steps=0 trainer.total_training_steps=2 trainer.val_n=0 \
    trainer.test_freq=0 trainer.save_freq=-1 trainer.n_threads=1 trainer.resume_mode=disable \
    data.max_response_length=4 trainer.default_local_dir="$W/rl" >"$W/rl.out" 2>"$W/rl.err"
check "rl from the folder" grep -qE '"steps": ?2' "$W/rl.out"
check "rl logs the checkpoint's tokenizer" grep -q "hf-bpe.*chat template qwen3" "$W/rl.err"

# --- errors
mkdir -p "$W/notok"
cp "$D/config.json" "$D/model.safetensors" "$W/notok/"
expect_err "generate: 151936 vocab without tokenizer files" "no tokenizer" $M generate --model "$W/notok" --prompt hi
expect_err "sft: 151936 vocab without tokenizer files" "tokenizer.json" $M sft --config "$W/from.yaml" model.path="$W/notok" trainer.default_local_dir="$W/x1"
expect_err "sft: unknown template name" "data.chat_template" $M sft --config "$W/from.yaml" model.path="$D" data.chat_template=llama3 trainer.default_local_dir="$W/x2"
mkdir -p "$W/othertpl"
cp "$D"/* "$W/othertpl/"
/usr/bin/python3 - "$W/othertpl/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
json.dump(c, open(sys.argv[1], "w"))
PY
# another template: rendered by the Jinja interpreter (it writes no end of turn, so SFT cannot cut targets from it)
expect_err "sft: a template without an end of turn" "none of the tokenizer's stop ids" $M sft --config "$W/from.yaml" model.path="$W/othertpl" trainer.default_local_dir="$W/x3"
$M generate --model "$W/othertpl" --prompt hi --max-new-tokens 1 >/dev/null 2>"$W/err"
check "generate with the checkpoint's own (non-Qwen3) template" test $? -eq 0
$M generate --model "$W/othertpl" --prompt hi --chat-template chatml --max-new-tokens 1 >/dev/null 2>"$W/err"
check "generate --chat-template chatml overrides" test $? -eq 0
finish
