"""PyTorch reference data for the dense kernels of src/kernels/kernels.h (tests/test_kernels.c).

Usage: /usr/bin/python3 tests/ref/gen_kernels.py OUTDIR      → OUTDIR/kernels.safetensors

For every kernel it stores the inputs, the forward outputs, a random upstream gradient and the
gradients autograd gives for it. The ops are written from the Hugging Face definitions:
  linear     F.linear (y = x·Wᵀ, W [out, in])
  rmsnorm    HF Qwen3MoeRMSNorm: w * (x * rsqrt(mean(x²) + eps))
  rope       HF Qwen3MoeRotaryEmbedding (inv_freq = 1/theta^(arange(0,d,2)/d), angle = pos·inv_freq in
             fp32, emb = cat(freqs, freqs)) and apply_rotary_pos_emb with rotate_half
  attention  HF eager_attention_forward per packed sequence: repeat_kv for GQA,
             softmax(q·kᵀ·scale + causal mask) · v, plus lse = logsumexp of the masked scaled scores
  swiglu     HF Qwen3MoeMLP activation: silu(gate) * up
  logprob    verl logprobs_from_logits / entropy_from_logits after logits / temperature
Everything is computed in float64 from the float32 inputs (so the reference is the exact answer
to the fp32 inputs, and the C test's tolerances only measure moerl's own fp32 error), except the
RoPE cos/sin tables, which are built in float32 exactly as HF builds them (the fp32 rounding of
the angle pos·inv_freq is part of HF's behaviour at large positions).
Shapes follow kernels.h; integer tensors (positions, cu_seqlens, targets) are stored as I32.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

D = torch.float64


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def randn(*shape, std=1.0):
    return (torch.randn(*shape, dtype=torch.float32) * std)


def grads(out, dout, inputs):
    """Autograd gradients of Σ dout·out with respect to inputs."""
    return torch.autograd.grad(out, inputs, grad_outputs=dout.to(out.dtype))


def gen_linear(T):
    N, I, O = 7, 24, 40
    x, W, dout = randn(N, I), randn(O, I, std=0.2), randn(N, O)
    xd, Wd = x.to(D).requires_grad_(), W.to(D).requires_grad_()
    out = F.linear(xd, Wd)
    dx, dW = grads(out, dout, (xd, Wd))
    T.update({"linear.x": x, "linear.W": W, "linear.out": f32(out), "linear.dout": dout,
              "linear.dx": f32(dx), "linear.dW": f32(dW)})


def rmsnorm_hf(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def gen_rmsnorm(T):
    N, C, eps = 6, 40, 1e-6
    x = randn(N, C, std=1.5)
    x[2] *= 1e-3  # a row with a small norm, where eps matters relatively more
    w, dout = 1.0 + randn(C, std=0.3), randn(N, C)
    xd, wd = x.to(D).requires_grad_(), w.to(D).requires_grad_()
    out = rmsnorm_hf(xd, wd, eps)
    dx, dw = grads(out, dout, (xd, wd))
    T.update({"rmsnorm.x": x, "rmsnorm.w": w, "rmsnorm.eps": torch.tensor([eps], dtype=torch.float32),
              "rmsnorm.out": f32(out), "rmsnorm.dout": dout, "rmsnorm.dx": f32(dx), "rmsnorm.dw": f32(dw)})


def rope_tables_hf(pos, hd, theta):
    """cos, sin [N, hd] exactly as HF Qwen3MoeRotaryEmbedding (default rope type) in fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float32) / hd))
    freqs = (inv_freq[None, :, None].float() @ pos[None, None, :].float()).transpose(1, 2)[0]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def gen_rope(T):
    lens, nheads, hd, theta = [5, 9, 3, 11], 4, 24, 1.0e6
    pos = torch.cat([torch.arange(L, dtype=torch.int32) for L in lens[:3]] +
                    # the last sequence continues at a large position (a resumed partial rollout)
                    [torch.arange(4000, 4000 + lens[3], dtype=torch.int32)])
    N = pos.numel()
    x, dout = randn(N, nheads, hd), randn(N, nheads, hd)
    cos, sin = rope_tables_hf(pos, hd, theta)
    cos, sin = cos.to(D)[:, None, :], sin.to(D)[:, None, :]  # broadcast over heads
    xd = x.to(D).requires_grad_()
    out = xd * cos + rotate_half(xd) * sin
    (dx,) = grads(out, dout, (xd,))
    T.update({"rope.x": x, "rope.pos": pos, "rope.theta": torch.tensor([theta], dtype=torch.float32),
              "rope.out": f32(out), "rope.dout": dout, "rope.dx": f32(dx)})


def repeat_kv(x, n_rep):
    """[b, nkv, L, hd] → [b, nkv·n_rep, L, hd], kv head g serving query heads g·n_rep … (HF repeat_kv)."""
    b, nkv, L, hd = x.shape
    return x[:, :, None, :, :].expand(b, nkv, n_rep, L, hd).reshape(b, nkv * n_rep, L, hd)


def attention_hf(q, k, v, cu, nh, nkv, hd, scale):
    """Packed causal GQA attention: HF eager attention applied to each sequence separately."""
    outs, lses = [], []
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        L = e - s
        qs = q[s:e].transpose(0, 1)[None]                  # [1, nh, L, hd]
        ks = repeat_kv(k[s:e].transpose(0, 1)[None], nh // nkv)
        vs = repeat_kv(v[s:e].transpose(0, 1)[None], nh // nkv)
        scores = torch.matmul(qs, ks.transpose(2, 3)) * scale
        mask = torch.full((L, L), float("-inf"), dtype=scores.dtype).triu(1)
        scores = scores + mask
        p = F.softmax(scores, dim=-1)
        outs.append(torch.matmul(p, vs)[0].transpose(0, 1))  # [L, nh, hd]
        lses.append(torch.logsumexp(scores, dim=-1)[0])     # [nh, L]
    return torch.cat(outs, 0), torch.cat(lses, 1)


def gen_attention(T):
    # 4 packed sequences (70 and 130 cross the 64-row blocks of the C kernel, 5 is shorter than
    # one block); GQA with nh/nkv = 4; head_dim 24 ≠ hidden/nh (hidden would be 64 → 8).
    lens, nh, nkv, hd = [70, 5, 130, 33], 8, 2, 24
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    N = cu[-1]
    scale = 1.0 / math.sqrt(hd)
    q, k, v = randn(N, nh, hd, std=1.5), randn(N, nkv, hd, std=1.5), randn(N, nkv, hd)
    dout = randn(N, nh, hd)
    qd, kd, vd = (t.to(D).requires_grad_() for t in (q, k, v))
    out, lse = attention_hf(qd, kd, vd, cu, nh, nkv, hd, scale)
    dq, dk, dv = grads(out, dout, (qd, kd, vd))
    T.update({"attention.q": q, "attention.k": k, "attention.v": v,
              "attention.cu_seqlens": torch.tensor(cu, dtype=torch.int32),
              "attention.out": f32(out), "attention.lse": f32(lse), "attention.dout": dout,
              "attention.dq": f32(dq), "attention.dk": f32(dk), "attention.dv": f32(dv)})


def gen_swiglu(T):
    N, I = 5, 33
    gate_up = randn(N, 2 * I, std=2.0)
    gate_up[0, :4] = torch.tensor([-30.0, 30.0, -90.0, 0.0])  # saturated and zero gates
    dout = randn(N, I)
    gu = gate_up.to(D).requires_grad_()
    out = F.silu(gu[:, :I]) * gu[:, I:]
    (dgu,) = grads(out, dout, (gu,))
    T.update({"swiglu.gate_up": gate_up, "swiglu.out": f32(out), "swiglu.dout": dout,
              "swiglu.dgate_up": f32(dgu)})


def gen_logprob(T):
    N, V, temp = 6, 1000, 0.7
    logits = randn(N, V, std=3.0)
    logits[3, 17] = 40.0  # a peaked row: logp of the argmax ≈ 0, tiny entropy
    target = torch.randint(0, V, (N,), dtype=torch.int32)
    target[3] = 17
    target[1] = -1  # masked rows (prompt or padding tokens)
    target[4] = -1
    dlogp, dentropy = randn(N), randn(N)
    ld = logits.to(D).requires_grad_()
    z = ld / temp
    logsm = F.log_softmax(z, dim=-1)                       # verl logprobs_from_logits
    valid = target >= 0
    logp_all = logsm.gather(-1, target.clamp(min=0).long()[:, None])[:, 0]
    logp = torch.where(valid, logp_all, torch.zeros_like(logp_all))
    pd = F.softmax(z, dim=-1)                              # verl entropy_from_logits
    lse = torch.logsumexp(z, dim=-1)
    entropy_full = lse - (pd * z).sum(-1)
    entropy = torch.where(valid, entropy_full, torch.zeros_like(entropy_full))
    # kernels.h: masked rows get no gradient from dlogp, but the entropy term still applies, so
    # the objective differentiated is Σ dlogp·logp(masked) + Σ dentropy·entropy(all rows).
    obj = (dlogp.to(D) * logp).sum() + (dentropy.to(D) * entropy_full).sum()
    (dlogits,) = torch.autograd.grad(obj, (ld,))
    T.update({"logprob.logits": logits, "logprob.target": target,
              "logprob.temperature": torch.tensor([temp], dtype=torch.float32),
              "logprob.logp": f32(logp), "logprob.entropy": f32(entropy), "logprob.lse": f32(lse),
              "logprob.dlogp": dlogp, "logprob.dentropy": dentropy, "logprob.dlogits": f32(dlogits)})


def main():
    if len(sys.argv) != 2:
        print("usage: gen_kernels.py OUTDIR", file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(1234)
    T = {}
    for gen in (gen_linear, gen_rmsnorm, gen_rope, gen_attention, gen_swiglu, gen_logprob):
        gen(T)
    path = os.path.join(outdir, "kernels.safetensors")
    tmp = path + ".tmp"
    st_io.save(T, tmp, metadata={"generator": "tests/ref/gen_kernels.py", "torch": torch.__version__})
    os.replace(tmp, path)
    print(f"wrote {path}: {len(T)} tensors")
    print("1 passed, 0 failed")  # the count tests/run.sh requires of every step
    return 0


if __name__ == "__main__":
    sys.exit(main())
