"""Reference of the threshold gradient codec (src/dist/compress.h) on fixed inputs, for tests/test_compress.c.

Usage: /usr/bin/python3 tests/ref/gen_compress.py OUTDIR      → OUTDIR/compress.safetensors

Written here from the format's description in compress.h (not from compress.c), with exact arithmetic:
  x = fp32(g + e);  τ = 2 · (lower) median of |x| over the nonzero x;  kept: |x| > τ.
  exponent: |x| = m·2^f with m ∈ [1, 2) (math.frexp in float64, exact for a float32); e = f + 1 iff m² > 2
            (m has 24 significant bits, so m² is exact in float64), capped at 127.
  value:    ±2^e; residual x − (±2^e) computed in float64 and checked to be a float32 (Sterbenz).
  indices:  bitmap (n bits) or Rice-coded gaps with r in {r0 − 1, r0, r0 + 1} ∩ [0, 31], r0 the largest
            r ≤ 30 with 2^r ≤ ⌊(n − k)/k⌋; the smallest wins, the bitmap on a tie, then the smaller r.
  non-finite: the bucket travels raw (header code 2, n float32), residual 0.
Per case: <case>.g, <case>.e (float32 inputs), <case>.payload (one int32 per byte), <case>.decoded (D(payload)
into zeros), <case>.residual (the new e).
"""
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def exponent(a):
    m, f = math.frexp(a)  # a = m·2^f, m ∈ [0.5, 1)
    m, f = 2 * m, f - 1
    e = f + 1 if m * m > 2 else f
    return min(e, 127)


def bits_le(value, nbits):
    return [(value >> i) & 1 for i in range(nbits)]


def encode(x):
    n = len(x)
    if any(not math.isfinite(v) for v in x):
        hdr = struct.pack("<IIBBBBi", n, n, 2, 0, 0, 0, 0)
        return hdr + struct.pack("<%df" % n, *x), list(x), [0.0] * n
    nz = sorted(abs(v) for v in x if v != 0)
    tau = 2 * nz[(len(nz) - 1) // 2] if nz else 0.0
    tau = f32(tau)
    kept = [i for i, v in enumerate(x) if abs(v) > tau]
    k = len(kept)
    exps = [exponent(abs(x[i])) for i in kept]
    e0 = min(exps) if k else 0
    span = (max(exps) - e0) if k else 0
    ebits = 0
    while k and span >> ebits:
        ebits += 1
    # index code
    gaps, prev = [], 0
    for i in kept:
        gaps.append(i - prev)
        prev = i + 1
    mode, r, best = 0, 0, n
    if k:
        r0 = 0
        while r0 < 30 and (1 << (r0 + 1)) <= (n - k) // k:
            r0 += 1
        for rr in range(max(0, r0 - 1), r0 + 2):
            b = sum((gp >> rr) + 1 + rr for gp in gaps)
            if b < best:
                mode, r, best = 1, rr, b
    stream = []
    decoded, residual = [0.0] * n, list(x)
    for i, e in zip(kept, exps):
        neg = 1 if x[i] < 0 else 0
        stream += [neg] + bits_le(e - e0, ebits)
        v = -(2.0 ** e) if neg else 2.0 ** e
        decoded[i] = v
        res = x[i] - v
        assert f32(res) == res, "residual not exact"
        residual[i] = res
    if mode == 0:
        ks = set(kept)
        stream += [1 if i in ks else 0 for i in range(n)]
    else:
        for gp in gaps:
            stream += [1] * (gp >> r) + [0] + bits_le(gp & ((1 << r) - 1), r)
    while len(stream) % 8:
        stream.append(0)
    body = bytes(sum(stream[j + b] << b for b in range(8)) for j in range(0, len(stream), 8))
    hdr = struct.pack("<IIBBBBi", n, k, mode, r, ebits, 0, e0)
    return hdr + body, decoded, residual


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(29)
    cases = {}
    g = torch.randn(1000, generator=gen) * 1e-3
    cases["normal"] = (g, torch.randn(1000, generator=gen) * 1e-4)
    ht = torch.randn(4096, generator=gen) / torch.rand(4096, generator=gen).clamp_min(1e-3) ** 1.5 * 1e-5
    ht[torch.rand(4096, generator=gen) < 0.3] = 0
    cases["heavy"] = (ht, torch.zeros(4096))
    sp = torch.randn(5000, generator=gen) * 1e-6
    idx = torch.randperm(5000, generator=gen)[:40]
    sp[idx] = torch.randn(40, generator=gen) * 10
    cases["sparse"] = (sp, torch.zeros(5000))
    ex = torch.tensor([1e-45, -3e-42, 1e-39, 2.5e-38, -1e-40, 3e38, -3.3e38, 1.5, -1.4142135, 1.4142137,
                       0.0, 1e-44, 7e-39, 2e30] * 8)
    cases["extremes"] = (ex, torch.zeros(len(ex)))
    cases["equal"] = (torch.full((64,), -0.25), torch.zeros(64))
    cases["empty"] = (torch.zeros(0), torch.zeros(0))
    cases["nonfinite"] = (torch.tensor([1.0, float("inf"), -2.0, float("nan"), 0.5]), torch.zeros(5))
    tensors = {}
    for name, (g, e) in cases.items():
        g, e = g.float(), e.float()
        x = [float(v) for v in (g + e)]
        payload, dec, res = encode(x)
        tensors[name + ".g"] = g.contiguous()
        tensors[name + ".e"] = e.contiguous()
        tensors[name + ".payload"] = torch.tensor(list(payload), dtype=torch.int32)
        tensors[name + ".decoded"] = torch.tensor(dec, dtype=torch.float32)
        tensors[name + ".residual"] = torch.tensor(res, dtype=torch.float32)
        print("%-10s n=%5d payload %6d bytes (raw %6d)" % (name, len(x), len(payload), 4 * len(x)))
    st_io.save(tensors, os.path.join(out, "compress.safetensors"))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
