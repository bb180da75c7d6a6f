"""Reference checkpoints written by PyTorch for moerl's checkpoint loader (tests/test_checkpoint.c)
and bf16 rounding reference values for tests/test_safetensors.c.

Usage: /usr/bin/python3 tests/ref/gen_checkpoint.py OUTDIR

Writes
  OUTDIR/ckpt_hf/{config.json, model.safetensors}
      tied embeddings (no lm_head.weight), one dense layer via mlp_only_layers=[1], head_dim 12 !=
      hidden/heads, F32, tensors stored in a shuffled order, config carries extra HF fields that
      moerl must ignore.
  OUTDIR/ckpt_hf_sharded/{config.json, model-0000k-of-00003.safetensors, model.safetensors.index.json}
      untied, decoder_sparse_step 2 (layers 0 and 2 dense, 1 and 3 MoE), BF16 except the RMSNorm
      weights which are F16, split into 3 shards with an index (HF save_pretrained layout).
  OUTDIR/ckpt_hf_expected.safetensors, OUTDIR/ckpt_hf_sharded_expected.safetensors
      every moerl tensor as float32 under its moerl name, built here with torch from the HF tensors:
      "model.layers.{l}.mlp.experts.gate_up" [E, 2I, H] = stack over e of cat(gate_proj, up_proj),
      "model.layers.{l}.mlp.experts.down" [E, H, I] = stack of down_proj,
      "model.layers.{l}.mlp.gate_up_proj" [2Id, H] = cat(gate_proj, up_proj), "...mlp.down_proj".
  OUTDIR/bf16_rounding.safetensors
      "x" F32 [n] and "x_bf16" BF16 [n] = x.to(torch.bfloat16) (torch's round-to-nearest-even),
      with exact ties, near-overflow values, subnormals, zeros and infinities among random values.

Self-checks (every written file read back with st_io and compared) run before exiting; prints
"N passed, 0 failed" and exits 0, or prints the failure and exits 1.
"""
import json
import os
import random
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402


def hf_config(v, h, inter, moe_inter, layers, nh, nkv, hd, e, k, tie, sparse_step, mlp_only, dtype):
    """HF Qwen3MoeConfig dict (config.json field names), with fields moerl does not read."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": v, "hidden_size": h, "intermediate_size": inter,
        "moe_intermediate_size": moe_inter, "num_hidden_layers": layers,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
        "hidden_act": "silu", "max_position_embeddings": 256, "initializer_range": 0.02,
        "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": tie,
        "rope_theta": 1000000.0, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": layers, "decoder_sparse_step": sparse_step,
        "num_experts": e, "num_experts_per_tok": k, "norm_topk_prob": True,
        "output_router_logits": False, "router_aux_loss_coef": 0.001,
        "mlp_only_layers": mlp_only, "bos_token_id": v - 2, "eos_token_id": v - 1,
        "torch_dtype": dtype, "transformers_version": "4.51.0",
    }


def is_moe(cfg, l):
    """HF Qwen3MoeDecoderLayer: MoE iff l not in mlp_only_layers, num_experts > 0 and
    (l + 1) % decoder_sparse_step == 0."""
    return (l not in cfg["mlp_only_layers"] and cfg["num_experts"] > 0
            and (l + 1) % cfg["decoder_sparse_step"] == 0)


def hf_tensors(cfg, gen):
    """Random HF-named tensors (float32) for cfg, in HF state-dict order."""
    V, H, hd = cfg["vocab_size"], cfg["hidden_size"], cfg["head_dim"]
    nh, nkv, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_experts"]
    I, Id = cfg["moe_intermediate_size"], cfg["intermediate_size"]

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    t = {"model.embed_tokens.weight": r(V, H)}
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        t[p + "input_layernorm.weight"] = 1 + 0.1 * r(H)
        t[p + "self_attn.q_proj.weight"] = r(nh * hd, H)
        t[p + "self_attn.k_proj.weight"] = r(nkv * hd, H)
        t[p + "self_attn.v_proj.weight"] = r(nkv * hd, H)
        t[p + "self_attn.o_proj.weight"] = r(H, nh * hd)
        t[p + "self_attn.q_norm.weight"] = 1 + 0.1 * r(hd)
        t[p + "self_attn.k_norm.weight"] = 1 + 0.1 * r(hd)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * r(H)
        if is_moe(cfg, l):
            t[p + "mlp.gate.weight"] = r(E, H)
            for e in range(E):
                q = p + "mlp.experts.%d." % e
                t[q + "gate_proj.weight"] = r(I, H)
                t[q + "up_proj.weight"] = r(I, H)
                t[q + "down_proj.weight"] = r(H, I)
        else:
            t[p + "mlp.gate_proj.weight"] = r(Id, H)
            t[p + "mlp.up_proj.weight"] = r(Id, H)
            t[p + "mlp.down_proj.weight"] = r(H, Id)
    t["model.norm.weight"] = 1 + 0.1 * r(H)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = r(V, H)
    return t


def moerl_tensors(cfg, hf):
    """The moerl (stacked) layout of HF tensors hf, as float32 (model.h)."""
    out = {}
    E = cfg["num_experts"]
    for name, x in hf.items():
        if ".mlp.experts." in name or ".mlp.gate_proj." in name or ".mlp.up_proj." in name \
                or ".mlp.down_proj." in name:
            continue
        out[name] = x.float()
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d.mlp." % l
        if is_moe(cfg, l):
            out[p + "experts.gate_up"] = torch.stack(
                [torch.cat([hf[p + "experts.%d.gate_proj.weight" % e],
                            hf[p + "experts.%d.up_proj.weight" % e]], 0) for e in range(E)], 0).float()
            out[p + "experts.down"] = torch.stack(
                [hf[p + "experts.%d.down_proj.weight" % e] for e in range(E)], 0).float()
        else:
            out[p + "gate_up_proj"] = torch.cat([hf[p + "gate_proj.weight"], hf[p + "up_proj.weight"]],
                                                0).float()
            out[p + "down_proj"] = hf[p + "down_proj.weight"].float()
    return out


def bf16_cases(gen):
    """float32 values that exercise bf16 round-to-nearest-even."""
    def from_bits(bits):
        return torch.tensor(bits, dtype=torch.int32).view(torch.float32)

    bits = []
    for hi in (0x3f80, 0x3f81, 0x4049, 0x404a, 0xbf80, 0xbf81, 0x0001, 0x0080, 0x7f7f, 0xff7f):
        for lo in (0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff):  # 0x8000 = exact tie
            b = (hi << 16) | lo
            bits.append(b - (1 << 32) if b >= (1 << 31) else b)
    special = [0.0, -0.0, float("inf"), float("-inf"), 3.4028234663852886e38, -3.4028234663852886e38,
               1e-45, -1e-45, 1.1754942e-38, 5.877472e-39]
    x = torch.cat([from_bits(bits), torch.tensor(special, dtype=torch.float32),
                   torch.randn(2000, generator=gen) * torch.exp(8 * torch.randn(2000, generator=gen))])
    return x.contiguous()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    gen = torch.Generator().manual_seed(20240611)
    passed = 0

    # --- single-file, tied, F32, shuffled tensor order
    cfg_a = hf_config(v=37, h=24, inter=20, moe_inter=8, layers=3, nh=4, nkv=2, hd=12, e=4, k=2,
                      tie=True, sparse_step=1, mlp_only=[1], dtype="float32")
    hf_a = hf_tensors(cfg_a, gen)
    names = list(hf_a)
    random.Random(7).shuffle(names)
    da = os.path.join(out, "ckpt_hf")
    os.makedirs(da, exist_ok=True)
    for fn in os.listdir(da):  # no stale files of another layout
        os.unlink(os.path.join(da, fn))
    with open(os.path.join(da, "config.json"), "w") as f:
        json.dump(cfg_a, f, indent=2)
    st_io.save({n: hf_a[n] for n in names}, os.path.join(da, "model.safetensors"), {"format": "pt"})
    exp_a = moerl_tensors(cfg_a, hf_a)
    st_io.save(exp_a, os.path.join(out, "ckpt_hf_expected.safetensors"))

    # --- sharded, untied, BF16 with F16 norms, index
    cfg_b = hf_config(v=41, h=16, inter=24, moe_inter=12, layers=4, nh=2, nkv=1, hd=8, e=3, k=2,
                      tie=False, sparse_step=2, mlp_only=[], dtype="bfloat16")
    hf_b = {n: (x.half() if n.endswith("norm.weight") else x.bfloat16())
            for n, x in hf_tensors(cfg_b, gen).items()}
    db = os.path.join(out, "ckpt_hf_sharded")
    os.makedirs(db, exist_ok=True)
    for fn in os.listdir(db):
        os.unlink(os.path.join(db, fn))
    with open(os.path.join(db, "config.json"), "w") as f:
        json.dump(cfg_b, f, indent=2)
    names = list(hf_b)
    n_shards = 3
    cuts = [0, len(names) // 3, 2 * len(names) // 3, len(names)]
    weight_map, total = {}, 0
    for s in range(n_shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, n_shards)
        part = {n: hf_b[n] for n in names[cuts[s]:cuts[s + 1]]}
        st_io.save(part, os.path.join(db, fn), {"format": "pt"})
        for n, x in part.items():
            weight_map[n] = fn
            total += x.numel() * x.element_size()
    with open(os.path.join(db, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    exp_b = moerl_tensors(cfg_b, hf_b)
    st_io.save(exp_b, os.path.join(out, "ckpt_hf_sharded_expected.safetensors"))

    # --- bf16 rounding reference
    x = bf16_cases(gen)
    st_io.save({"x": x, "x_bf16": x.to(torch.bfloat16)}, os.path.join(out, "bf16_rounding.safetensors"))

    # --- self-checks: everything reads back identically
    back = st_io.load(os.path.join(da, "model.safetensors"))
    ok = set(back) == set(hf_a) and all(torch.equal(back[n], hf_a[n]) for n in hf_a)
    passed += ok
    back = {}
    for fn in sorted(set(weight_map.values())):
        back.update(st_io.load(os.path.join(db, fn)))
    ok2 = set(back) == set(hf_b) and all(back[n].dtype == hf_b[n].dtype and torch.equal(back[n], hf_b[n])
                                          for n in hf_b)
    passed += ok2
    e = st_io.load(os.path.join(out, "ckpt_hf_sharded_expected.safetensors"))
    g = "model.layers.1.mlp.experts.gate_up"
    ok3 = (tuple(e[g].shape) == (3, 24, 16)
           and torch.equal(e[g][2, 12:], hf_b["model.layers.1.mlp.experts.2.up_proj.weight"].float()))
    passed += ok3
    r = st_io.load(os.path.join(out, "bf16_rounding.safetensors"))
    # header length of the written file is a multiple of 8 (padding rule)
    with open(os.path.join(out, "bf16_rounding.safetensors"), "rb") as f:
        ok4 = struct.unpack("<Q", f.read(8))[0] % 8 == 0 and torch.equal(r["x"], x)
    passed += ok4
    failed = 4 - passed
    if failed:
        print("gen_checkpoint: self-check failed (%s)" % [ok, ok2, ok3, ok4])
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
