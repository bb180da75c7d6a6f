/* GGUF export of a moerl model, for llama.cpp (architecture "qwen3moe").
 *
 * File format: GGUF version 3 (ggml's gguf.h / docs/gguf.md): "GGUF", version, tensor and
 * key-value counts, the key-value metadata, the tensor infos (name, dims innermost first, ggml
 * type, offset), padding to general.alignment (32), then each tensor's data at its aligned
 * offset. All integers little-endian.
 *
 * Metadata: general.architecture = "qwen3moe" and qwen3moe.{context_length, embedding_length,
 * feed_forward_length, block_count, attention.head_count, attention.head_count_kv,
 * attention.key_length, attention.value_length, attention.layer_norm_rms_epsilon,
 * rope.freq_base, expert_count, expert_used_count, expert_feed_forward_length, vocab_size};
 * tokenizer.ggml.model = "none" (llama.cpp then runs on token ids alone: the export carries
 * weights, not a tokenizer).
 *
 * Tensors (llama.cpp's names; moerl's [out, in] row-major matrices are ggml's {in, out}):
 *   token_embd.weight {H, V}, output_norm.weight {H}, output.weight {H, V} (absent when tied),
 *   blk.l.attn_norm / attn_q / attn_k / attn_v / attn_output / attn_q_norm / attn_k_norm /
 *   ffn_norm / ffn_gate_inp (router {H, E}) .weight, and the stacked experts
 *   blk.l.ffn_gate_exps {H, I, E} and ffn_up_exps {H, I, E} (the gate and up halves of moerl's
 *   [E][2I][H] gate_up) and ffn_down_exps {I, H, E}.
 *
 * What llama.cpp's qwen3moe cannot express is an error naming it: a dense (non-MoE) layer
 * (mlp_only_layers, decoder_sparse_step > 1) and norm_topk_prob = false (llama.cpp always
 * renormalises the top-k weights of this architecture). */
#ifndef MOERL_GGUF_H
#define MOERL_GGUF_H

#include "model/model.h"

typedef enum { GGUF_EXPORT_F32 = 0, GGUF_EXPORT_BF16 = 1 } gguf_export_dtype;

/* Write m's weights to path (atomically: a temporary file renamed over path) as F32 or BF16
 * (round to nearest even; the 1-D norm weights stay F32, as llama.cpp's converters keep them).
 * Errors: a model llama.cpp's qwen3moe cannot express (see above), I/O errors naming the file. */
int model_export_gguf(const moe_model *m, const char *path, gguf_export_dtype dtype);

#endif
