"""Reference of 1-bit Adam (src/optim/onebit_adam.h, src/dist/onebit.h) for tests/test_onebit_adam.c.

Usage: /usr/bin/python3 tests/ref/gen_onebit_adam.py OUTDIR     → OUTDIR/onebit_adam.safetensors

Written here from Tang et al. 2021 (arXiv 2102.02888, Algorithm 1) and the update order documented in
onebit_adam.h (not from the C code): W simulated workers, each with its own local gradient per step.
  warm-up (step t ≤ T = freeze_step): exact AdamW (torch.optim.AdamW's order, bias-corrected) on the
    averaged gradient.
  compression (t > T): m_w = β1·m + (1 − β1)·clip_w·g_w (each worker its local gradient);
    worker: y = m_w + e_w; s = ‖y‖/√n; e_w = y − s·sign(y) (sign(0) = +1);
    server r (chunk r of c = ceil(n/W) rounded up to 32): z = (Σ_i s_i·sign_i) · (1/W) + e_s,r;
      s_r = ‖z‖/√c_r; e_s,r = z − s_r·sign(z); m = concat_r(s_r·sign(z_r));
    p = p·(1 − lr·wd) on decayed ranges; p = p − lr/(1 − β1^t) · m / (√v/√(1 − β2^T) + eps).
Every float32 operation is one torch float32 op (one rounding each), the norms in float64, the bias corrections in float64 from the float32 β (as the C config holds
them), so the C
code (built without fused multiply-add in these files) must match bit for bit after the freeze.
Per case w{W} and step t, with the state before the step (.p .m .v .we .se), the inputs (.g: W×n local
gradients, .gavg: their mean for warm-up, .norm: float64 norms the clip uses) and the state after
(.p1 .m1 .v1 .we1 .se1); w{W}.sent: bytes one rank sends per compressed exchange.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

F = torch.float32
N, STEPS, FREEZE = 1000, 7, 3
LR, B1, B2, EPS, WD, CLIP = 1e-2, 0.9, 0.99, 1e-8, 0.01, 1.0


def f(x):
    return torch.tensor(x, dtype=F)


def clip_coef(norm):
    coef = CLIP / (norm + 1e-6)
    return f(coef) if coef < 1.0 else f(1.0)


def rms(y):
    if y.numel() == 0:
        return f(0.0)
    return f(math.sqrt(float((y.double() ** 2).sum()) / y.numel()))


def sign(y):
    return torch.where(y < 0, f(-1.0), f(1.0))


def chunk_of(n, w):
    c = (n + w - 1) // w
    return max(32, (c + 31) // 32 * 32)


def decay_mask(n):
    return torch.arange(n) < n // 2  # the C test's ranges: [0, n/2) decayed, [n/2, n) not


def adamw(p, m, v, g, norm, t, lr):
    clip = clip_coef(norm)
    gi = g * clip
    decay = torch.where(decay_mask(len(p)), f(1.0) - f(lr) * f(WD), f(1.0))
    p = p * decay
    m = f(B1) * m + (f(1.0) - f(B1)) * gi
    v = f(B2) * v + (f(1.0) - f(B2)) * gi * gi
    step_size = f(float(f(lr)) / (1.0 - float(f(B1)) ** t))
    inv_bc2 = f(1.0 / math.sqrt(1.0 - float(f(B2)) ** t))
    p = p - step_size * m / (torch.sqrt(v) * inv_bc2 + f(EPS))
    return p, m, v


def exchange(ms, we, se, n, W):
    c = chunk_of(n, W)
    ys = [ms[w] + we[w] for w in range(W)]
    scales = [rms(y) for y in ys]
    signs = [torch.cat([sign(y), torch.ones(W * c - n)]) for y in ys]
    we = [ys[w] - scales[w] * sign(ys[w]) for w in range(W)]
    out = torch.zeros(W * c)
    se = [s.clone() for s in se]
    for r in range(W):
        cnt = max(0, min(c, n - r * c))
        acc = torch.zeros(cnt)
        for i in range(W):
            acc = acc + scales[i] * signs[i][r * c:r * c + cnt]
        z = acc * (f(1.0) / f(float(W))) + se[r][:cnt]
        s = rms(z)
        se[r][:cnt] = z - s * sign(z)
        out[r * c:r * c + cnt] = s * sign(z)
    return out[:n], we, se


def run(W, gen, tensors):
    n = N
    c = chunk_of(n, W)
    p = torch.randn(n, generator=gen)
    m, v = torch.zeros(n), torch.zeros(n)
    we = [torch.zeros(n) for _ in range(W)]
    se = [torch.zeros(c) for _ in range(W)]
    for t in range(1, STEPS + 1):
        k = "w%d.s%d." % (W, t)
        scale = 0.3 if t % 3 else 3.0  # every third step large enough to be clipped
        g = [(torch.randn(n, generator=gen) + 0.2 * torch.randn(n, generator=gen) * w) * scale / math.sqrt(n)
             for w in range(W)]
        g = [x.float() for x in g]
        gavg = torch.stack(g).double().mean(0).float()
        tensors.update({k + "p": p, k + "m": m, k + "v": v, k + "we": torch.stack(we), k + "se": torch.stack(se),
                        k + "g": torch.stack(g), k + "gavg": gavg})
        if t <= FREEZE:
            norm = float(gavg.double().norm())
            tensors[k + "norm"] = torch.tensor([norm] * W, dtype=torch.float64)
            p, m, v = adamw(p, m, v, gavg, norm, t, LR)
        else:
            norms = [float(x.double().norm()) for x in g]
            tensors[k + "norm"] = torch.tensor(norms, dtype=torch.float64)
            ms = [f(B1) * m + (f(1.0) - f(B1)) * (g[w] * clip_coef(norms[w])) for w in range(W)]
            m, we, se = exchange(ms, we, se, n, W)
            decay = torch.where(decay_mask(n), f(1.0) - f(LR) * f(WD), f(1.0))
            step_size = f(float(f(LR)) / (1.0 - float(f(B1)) ** t))
            inv_bc2 = f(1.0 / math.sqrt(1.0 - float(f(B2)) ** FREEZE))
            p = p * decay
            p = p - step_size * m / (torch.sqrt(v) * inv_bc2 + f(EPS))
        tensors.update({k + "p1": p, k + "m1": m, k + "v1": v, k + "we1": torch.stack(we), k + "se1": torch.stack(se)})
    tensors["w%d.sent" % W] = torch.tensor([2 * (W - 1) * 4 * (1 + c // 32)], dtype=torch.int64)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(29)
    tensors = {}
    for W in (1, 2, 3, 4):
        run(W, gen, tensors)
    st_io.save({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "onebit_adam.safetensors"))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
