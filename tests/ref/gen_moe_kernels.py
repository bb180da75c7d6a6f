"""PyTorch reference data for the MoE kernels of src/kernels/kernels.h (tests/test_moe_kernels.c).

Usage: /usr/bin/python3 tests/ref/gen_moe_kernels.py OUTDIR      -> OUTDIR/moe_kernels.safetensors

One MoE layer (router + experts) as Hugging Face Qwen3MoeSparseMoeBlock.forward computes it, written
here from the HF definitions (transformers is not installed; nothing is imported from it):
  router   logits = x @ W_gate^T; p = softmax(logits) over all E experts; (w, ids) = topk(p, K);
           if norm_topk_prob: w /= w.sum(-1)
  experts  one_hot(ids).permute(2, 1, 0) gives each expert's (slot, token) pairs via torch.where;
           y_e = down(silu(gate(x_sel)) * up(x_sel)) * w[tok, slot]; out.index_add_(0, tok, y_e)
  aux      HF load_balancing_loss_func over the router logits of TWO MoE layers (this layer and a
           second layer whose logits are given as a constant), concatenated to [2N, E]:
           aux = E * sum(mean(one_hot(topk(softmax)), rows) * mean(softmax, rows))
  loss     sum(dout * out) + coef * aux; autograd gives d/dx, d/dW_gate, d/d(stacked gate_up),
           d/d(stacked down). Expert weights are stacked as moerl stores them: gate_up [E, 2I, H]
           (gate rows then up rows), down [E, H, I].
Three cases: "norm1/" (norm_topk_prob true, as Qwen3-30B-A3B) and "norm0/" (false) at N 32, H 64,
E 8, top-2, I 32, and "odd/" (norm_topk_prob true) at N 29, H 20, E 7, top-3, I 13: sizes that are
not multiples of moerl's GEMM tile (6 rows × 16 columns, 8-lane halves), with one expert chosen by a
single token. In all, the last expert receives no token (its router row points away from a constant
input direction), so the zero-gradient path of an idle expert is covered.
All arithmetic is float64 from the float32 inputs (the reference is the exact answer to the fp32
inputs; the C tolerances measure moerl's fp32 error only). The inputs are redrawn until every row's
K-th and (K+1)-th logits differ by more than 1e-3 in both layers, so fp32 rounding (~1e-6 here)
cannot reorder the top-k and the C test can compare ids exactly. Ids are stored as I32.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

D = torch.float64
N, H, E, K, I = 32, 64, 8, 2, 32
COEF = 0.05  # router_aux_loss_coef (large enough that the aux gradient is visible in the test)
MIN_GAP = 1e-3


def topk_gap(logits):
    """Smallest gap between the K-th and (K+1)-th largest logit over rows."""
    s = logits.sort(dim=-1, descending=True).values
    return float((s[:, K - 1] - s[:, K]).min())


def router(x, w_gate, norm):
    """HF Qwen3MoeSparseMoeBlock router: softmax in (at least) fp32, top-k, optional renorm."""
    logits = x @ w_gate.t()
    probs = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(probs, K, dim=-1)
    if norm:
        w = w / w.sum(dim=-1, keepdim=True)
    return logits, probs, w, ids


def moe_block(x, w_gate, gate_up, down, norm):
    """HF Qwen3MoeSparseMoeBlock.forward (expert loop with one_hot/where/index_add_)."""
    logits, probs, w, ids = router(x, w_gate, norm)
    out = torch.zeros_like(x)
    mask = F.one_hot(ids, num_classes=E).permute(2, 1, 0)  # [E, K, N]
    for e in range(E):
        slot, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        xs = x[tok]
        g = xs @ gate_up[e, :I].t()
        u = xs @ gate_up[e, I:].t()
        y = (F.silu(g) * u) @ down[e].t()
        out = out.index_add(0, tok, y * w[tok, slot, None])
    return out, logits, probs, w, ids


def load_balancing_loss(logits_list):
    """HF load_balancing_loss_func, attention_mask None."""
    cat = torch.cat(logits_list, dim=0)
    rw = torch.softmax(cat, dim=-1)
    _, sel = torch.topk(rw, K, dim=-1)
    mask = F.one_hot(sel, E)
    tokens_per_expert = mask.to(D).mean(dim=0)          # [K, E]
    router_prob_per_expert = rw.mean(dim=0)              # [E]
    return (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * E


def set_dims(n, h, e, k, i):
    global N, H, E, K, I
    N, H, E, K, I = n, h, e, k, i


def make_case(seed, norm, prefix=None, single=False):
    """One case; single: expert E-2 is chosen by token 0 alone (a one-row group)."""
    g = torch.Generator().manual_seed(seed)
    for attempt in range(1000):
        x = torch.randn(N, H, generator=g, dtype=torch.float32)
        x[:, 0] = x[:, 0].abs() + 2.0                    # a constant positive direction
        w_gate = torch.randn(E, H, generator=g, dtype=torch.float32) * 0.3
        w_gate[E - 1, 0] = -8.0                          # the last expert's logit is about -16: idle
        if single:                                       # expert E-2: token 0 only
            w_gate[E - 2, 0] = -8.0
            w_gate[E - 2, 1] = 2.0
            x[:, 1] = x[:, 1].clamp(-2.0, 2.0)
            x[0, 1] = 30.0
        logits_l2 = torch.randn(N, E, generator=g, dtype=torch.float32) * 1.5
        gate_up = torch.randn(E, 2 * I, H, generator=g, dtype=torch.float32) * (H ** -0.5)
        down = torch.randn(E, H, I, generator=g, dtype=torch.float32) * (I ** -0.5)
        dout = torch.randn(N, H, generator=g, dtype=torch.float32)
        l1 = x.to(D) @ w_gate.to(D).t()
        if topk_gap(l1) > MIN_GAP and topk_gap(logits_l2.to(D)) > MIN_GAP:
            break
    else:
        raise SystemExit("gen_moe_kernels: no draw with top-k gaps above %g" % MIN_GAP)

    xd = x.to(D).requires_grad_()
    wg = w_gate.to(D).requires_grad_()
    gu = gate_up.to(D).requires_grad_()
    dn = down.to(D).requires_grad_()
    out, logits, probs, w, ids = moe_block(xd, wg, gu, dn, norm)
    if (ids == E - 1).any():
        raise SystemExit("gen_moe_kernels: expert %d was meant to receive no token" % (E - 1))
    if single and int((ids == E - 2).sum()) != 1:
        raise SystemExit("gen_moe_kernels: expert %d was meant to receive one token" % (E - 2))
    aux = load_balancing_loss([logits, logits_l2.to(D)])
    loss = (out * dout.to(D)).sum() + COEF * aux
    loss.backward()

    p = prefix or "norm%d/" % norm
    f32 = lambda t: t.detach().to(torch.float32).contiguous()  # noqa: E731
    return {
        p + "x": x, p + "router_w": w_gate, p + "gate_up_w": gate_up, p + "down_w": down,
        p + "dout": dout, p + "logits_l2": logits_l2,
        p + "coef": torch.tensor([COEF], dtype=torch.float32),
        p + "router_logits": f32(logits), p + "probs": f32(probs),
        p + "topk_ids": ids.to(torch.int32).contiguous(), p + "topk_w": f32(w),
        p + "out": f32(out), p + "aux": f32(aux.reshape(1)),
        p + "dx": f32(xd.grad), p + "drouter_w": f32(wg.grad),
        p + "dgate_up_w": f32(gu.grad), p + "ddown_w": f32(dn.grad),
    }


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: gen_moe_kernels.py OUTDIR")
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)
    tensors = {}
    tensors.update(make_case(1234, 1))
    tensors.update(make_case(5678, 0))
    set_dims(29, 20, 7, 3, 13)
    tensors.update(make_case(91011, 1, prefix="odd/", single=True))
    set_dims(32, 64, 8, 2, 32)
    path = os.path.join(outdir, "moe_kernels.safetensors")
    st_io.save(tensors, path, metadata={"generator": "tests/ref/gen_moe_kernels.py",
                                        "N": str(N), "H": str(H), "E": str(E), "K": str(K), "I": str(I)})
    print("wrote", path, len(tensors), "tensors")
    print("1 passed, 0 failed")  # the count tests/run.sh requires of every step


if __name__ == "__main__":
    main()
