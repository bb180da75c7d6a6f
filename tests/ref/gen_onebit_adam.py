"""Reference of 1-bit Adam (src/optim/onebit_adam.h, src/dist/onebit.h) for tests/test_onebit_adam.c.

Usage: /usr/bin/python3 tests/ref/gen_onebit_adam.py OUTDIR     → OUTDIR/onebit_adam.safetensors

Written here from Tang et al. 2021 (arXiv 2102.02888, Algorithm 1) and the update order documented in
onebit_adam.h (not from the C code): W simulated workers, each with its own local gradient per step.
  warm-up (step t ≤ T = freeze_step): exact AdamW (torch.optim.AdamW's order, bias-corrected) on the
    averaged gradient.
  compression (t > T): m_w = β1·m + (1 − β1)·clip_w·g_w (each worker its local gradient);
    worker: y = m_w + e_w; s = ‖y‖₁/n (mean |y|); e_w = y − s·sign(y) (sign(0) = +1);
    server r (chunk r of c = ceil(n/W) rounded up to 32): z = (Σ_i s_i·sign_i) · (1/W) + e_s,r;
      s_r = ‖z‖₁/c_r; e_s,r = z − s_r·sign(z); m = concat_r(s_r·sign(z_r));
    p = p·(1 − lr·wd) on decayed ranges; p = p − lr/(1 − β1^t) · m / (√v/√(1 − β2^T) + eps).
Every float32 operation is one torch float32 op (one rounding each), the norms in float64, the bias corrections in float64 from the float32 β (as the C config holds
them), so the C
code (built without fused multiply-add in these files) must match bit for bit after the freeze.
Per case w{W} and step t, with the state before the step (.p .m .v .we .se), the inputs (.g: W×n local
gradients, .gavg: their mean for warm-up, .norm: float64 norms the clip uses) and the state after
(.p1 .m1 .v1 .we1 .se1); w{W}.sent: bytes one rank sends per compressed exchange.
Cases sw{W}.*: the exchange with per-tensor scales and the zero-variance mask (issue 29; onebit.h):
  segments (tensors) each with its own worker scale, each server chunk's pieces (segment ∩ chunk)
  their own server scale; values whose frozen variance is exactly 0 are left out of every scale and
  every error buffer and decode to momentum 0 (so only weight decay moves them); and, as the trainer
  runs it, the exchange in the update's units: each worker sends m_w / d (d = √v/√(1 − β2^T) + eps,
  the frozen denominator, the same on every rank), the averaged result is multiplied back by d.
  Message words: P + c/32 (P = the most pieces in any chunk).
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
    """The compressor's scale: mean |y| (sum in float64, one rounding to float32); 0 when empty."""
    if y.numel() == 0:
        return f(0.0)
    return f(float(y.double().abs().sum()) / y.numel())


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


def pieces(bounds, lo, hi):
    """(segment, a, b): the segments' intersections with [lo, hi), absolute indices, in order."""
    return [(k, max(bounds[k], lo), min(bounds[k + 1], hi)) for k in range(len(bounds) - 1)
            if bounds[k] < hi and bounds[k + 1] > lo]


def exchange(ms, we, se, n, W, bounds, act):
    c = chunk_of(n, W)
    ys = [torch.where(act, ms[w] + we[w], f(0.0)) for w in range(W)]
    nseg = len(bounds) - 1
    scales = [[rms(y[bounds[k]:bounds[k + 1]][act[bounds[k]:bounds[k + 1]]]) for k in range(nseg)] for y in ys]
    seg_of = torch.zeros(n, dtype=torch.long)
    for k in range(nseg):
        seg_of[bounds[k]:bounds[k + 1]] = k
    svec = [torch.stack(sc)[seg_of] if n else torch.zeros(0) for sc in scales]  # each value's worker scale
    we = [torch.where(act, ys[w] - svec[w] * sign(ys[w]), f(0.0)) for w in range(W)]
    out = torch.zeros(n)
    se = [s.clone() for s in se]
    P = 1
    for r in range(W):
        lo = r * c
        hi = max(lo, min(n, lo + c))
        ps = pieces(bounds, lo, hi)
        P = max(P, len(ps))
        for k, a, b in ps:
            acc = torch.zeros(b - a)
            for i in range(W):
                acc = acc + scales[i][k] * sign(ys[i][a:b])
            am = act[a:b]
            z = torch.where(am, acc * (f(1.0) / f(float(W))) + se[r][a - lo:b - lo], f(0.0))
            s = rms(z[am])
            se[r][a - lo:b - lo] = torch.where(am, z - s * sign(z), f(0.0))
            out[a:b] = torch.where(am, s * sign(z), f(0.0))
    return out, we, se, P


def grads(gen, W, n, t, seg_scale, zero):
    scale = 0.3 if t % 3 else 3.0  # every third step large enough to be clipped
    g = [((torch.randn(n, generator=gen) + 0.2 * torch.randn(n, generator=gen) * w) * scale / math.sqrt(n)).float()
         for w in range(W)]
    g = [x * seg_scale for x in g]
    if t <= FREEZE:  # values with a zero gradient through the whole warm-up (they get one afterwards)
        g = [torch.where(zero, f(0.0), x) for x in g]
    return g


def run(W, gen, tensors, prefix="w", bounds=None, seg_scale=None, zero=None):
    """One case: W workers, STEPS steps. bounds: segment bounds (None: one segment, no mask — the
    exchange of onebit_exchange_init); with bounds, the trainer's exchange: the mask is the frozen
    variance ≠ 0 and the momenta are exchanged divided by d; seg_scale: per-value gradient multiplier; zero: values with no warm-up gradient."""
    n = N
    c = chunk_of(n, W)
    seg_scale = torch.ones(n) if seg_scale is None else seg_scale
    zero = torch.zeros(n, dtype=torch.bool) if zero is None else zero
    masked = bounds is not None
    bounds = bounds or [0, n]
    p = torch.randn(n, generator=gen)
    m, v = torch.zeros(n), torch.zeros(n)
    we = [torch.zeros(n) for _ in range(W)]
    se = [torch.zeros(c) for _ in range(W)]
    P = 1
    for t in range(1, STEPS + 1):
        k = "%s%d.s%d." % (prefix, W, t)
        g = grads(gen, W, n, t, seg_scale, zero)
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
            act = v != 0 if masked else torch.ones(n, dtype=torch.bool)
            inv_bc2 = f(1.0 / math.sqrt(1.0 - float(f(B2)) ** FREEZE))
            d = torch.sqrt(v) * inv_bc2 + f(EPS)  # the frozen denominator
            if masked:  # the trainer's exchange: in the update's units, m_w / d
                ms = [x / d for x in ms]
            m, we, se, P = exchange(ms, we, se, n, W, bounds, act)
            if masked:
                m = m * d
            decay = torch.where(decay_mask(n), f(1.0) - f(LR) * f(WD), f(1.0))
            step_size = f(float(f(LR)) / (1.0 - float(f(B1)) ** t))
            p = p * decay
            p = p - step_size * m / (torch.sqrt(v) * inv_bc2 + f(EPS))
        tensors.update({k + "p1": p, k + "m1": m, k + "v1": v, k + "we1": torch.stack(we), k + "se1": torch.stack(se)})
    tensors["%s%d.sent" % (prefix, W)] = torch.tensor([2 * (W - 1) * 4 * (P + c // 32)], dtype=torch.int64)


# The segmented case (per-tensor scales, masked values): 4 "tensors" of very different gradient scales
# (×1, ×1e-3, ×1, ×30), and 40 values with no gradient through the warm-up — 10 in the decayed half
# [0, n/2) (they may only decay), 30 in the other (they must not move at all).
SEG_BOUNDS = [0, 250, 260, 600, 1000]
ZERO = [(100, 110), (520, 550)]


def seg_case():
    sc = torch.ones(N)
    sc[250:260] = 1e-3
    sc[600:1000] = 30.0
    zero = torch.zeros(N, dtype=torch.bool)
    for a, b in ZERO:
        zero[a:b] = True
    return sc, zero


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(29)
    tensors = {}
    for W in (1, 2, 3, 4):
        run(W, gen, tensors)
    sc, zero = seg_case()
    for W in (1, 2, 3):
        run(W, gen, tensors, "sw", SEG_BOUNDS, sc, zero)
    st_io.save({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "onebit_adam.safetensors"))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
