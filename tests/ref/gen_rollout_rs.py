"""PyTorch reference for rollout rejection sampling and the training/rollout mismatch metrics
(tests/test_rollout_rs.c).

Usage: /usr/bin/python3 tests/ref/gen_rollout_rs.py OUTDIR      → OUTDIR/rollout_rs.safetensors

Written here from the public definitions (verl rollout_corr_helper.compute_rollout_rejection_mask,
compute_rs_metrics, _parse_rollout_rs_thresholds; verl utils/debug/metrics.calculate_debug_metrics),
not copied. On a padded [B, L] batch with a response mask m and lr = clamp(old − μ, ±20):
  k1 = −lr, k2 = lr²/2, k3 = e^lr − 1 − lr;
  token_kK keeps a token by its own value, seq_sum/seq_mean/seq_max_kK a whole row by the masked
  sum / masked mean (Σ / (count + 1e-8)) / masked max of the row; k1 keeps log(lo) ≤ v ≤ log(hi), k2/k3
  keep v ≤ hi; all options must pass. Metrics per option (verl's names), then the overall masked
  fractions (the sequence one over every row, as verl's .mean()).
  Mismatch: p = exp(logp) for the trainer (x) and the behaviour (y) on the mask: max/mean/std (unbiased)
  of |x − y| and torch.corrcoef(x, y). Off-policy diagnostics (verl compute_offpolicy_metrics) over the
  rows with a loss token: kl, k3_kl (unclamped), training/rollout ppl and log ppl, log_ppl_diff (mean,
  abs mean, max, min), ppl_ratio, chi2_token (ratio clamped at ±20), chi2_seq (summed log ratio clamped).
Everything is float64 from the float32 inputs that are stored. The batch holds an empty row, a
multi-turn row with holes (garbage logprobs under the holes), a one-token row, a row past the ±20
clamp and a row whose k2 values sit exactly on a threshold (lr = 0.5: k2 = 0.125 exactly).
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

D = torch.float64
B, L = 9, 10

CASES = [
    ("token_k1", "0.5_2.0"),          # IcePop-style token masking
    ("token_k1", "1.5"),              # a single k1 bound: upper 1.5, lower 1/1.5
    ("token_k2", "0.125"),            # row 8 sits exactly on the bound: kept (≤)
    ("token_k3", "0.1"),
    ("seq_sum_k1", "0.5_2.0"),
    ("seq_sum_k2", "0.25"),           # row 8: 0.125 + 0.125 = 0.25 exactly: kept
    ("seq_sum_k3", "0.3"),
    ("seq_mean_k1", "0.9_1.1"),       # geometric
    ("seq_mean_k2", "0.05"),
    ("seq_mean_k3", "0.05"),
    ("seq_max_k2", "0.3"),
    ("seq_max_k3", "0.3"),
    ("token_k1, seq_mean_k3", "0.6_1.6,0.02"),
    ("token_k2,token_k2", "0.1"),     # a repeated option counts once
    ("seq_max_k2,seq_sum_k1,token_k3", "1000,1e-9_1e9,1e12"),  # nothing rejected
    ("token_k2", "0.12"),             # row 8 just past the bound
]


def parse(opts, thr):
    names = []
    for o in opts.split(","):
        o = o.strip()
        if o and o not in names:
            names.append(o)
    specs = [s.strip() for s in thr.split(",") if s.strip()]
    if len(specs) == 1:
        specs = specs * len(names)
    out = []
    for name, spec in zip(names, specs):
        k = int(name[-1])
        if k == 1:
            if "_" in spec:
                lo, hi = (float(x) for x in spec.split("_", 1))
            else:
                hi = float(spec)
                lo = 1.0 / hi
            out.append((name, k, math.log(lo), math.log(hi)))
        else:
            out.append((name, k, 0.0, float(spec)))
    return out


def token_values(lr, k):
    x = lr.clamp(-20.0, 20.0)
    if k == 1:
        return -x
    if k == 2:
        return 0.5 * x * x
    return torch.exp(x) - 1.0 - x


def rs_ref(old, behav, mask, opts, thr):
    lr = old.to(D) - behav.to(D)
    m = mask > 0
    mf = m.to(D)
    cnt = mf.sum(-1)
    valid = cnt > 0
    N = mf.sum()
    keep_all = torch.ones(B, L, dtype=torch.bool)
    names, vals = [], []

    def put(prefix, what, v):
        names.append(f"rollout_rs_{prefix}_{what}" if prefix else f"rollout_rs_{what}")
        vals.append(float(v))

    for name, k, lo, hi in parse(opts, thr):
        v = token_values(lr, k)
        vz = torch.where(m, v, torch.zeros_like(v))
        ssum = vz.sum(-1)
        smean = ssum / (cnt + 1e-8)
        smax = torch.where(m, v, torch.full_like(v, -math.inf)).max(-1).values
        smax = torch.where(torch.isinf(smax), torch.zeros_like(smax), smax)

        def inside(x):
            return (x >= lo) & (x <= hi) if k == 1 else x <= hi

        level_tok = name.startswith("token")
        if level_tok:
            stat = v
            keep = inside(v)
            seqv = smean
        else:
            sv = {"seq_sum": ssum, "seq_mean": smean, "seq_max": smax}[name.rsplit("_", 1)[0]]
            stat = sv.unsqueeze(-1).expand(B, L)
            keep = inside(sv).unsqueeze(-1).expand(B, L)
            seqv = sv
        keep_all &= keep
        sel = stat[m]
        sv_valid = seqv[valid]
        put(name, "mean", sel.mean())
        if level_tok:
            put(name, "max", sel.max())
            put(name, "min", sel.min())
        else:
            put(name, "max", sv_valid.max())
            put(name, "min", sv_valid.min())
        cl = sel.clamp(min=lo if k == 1 else 0.0, max=hi)
        put(name, "std", math.sqrt(max(0.0, float((cl * cl).mean() - cl.mean() ** 2))) if N > 1 else 0.0)
        if level_tok:
            put(name, "fraction_high", (sel > hi).to(D).mean())
            put(name, "fraction_low", (sel < lo).to(D).mean() if k == 1 else 0.0)
        else:
            put(name, "fraction_high", (sv_valid > hi).to(D).mean())
            put(name, "fraction_low", (sv_valid < lo).to(D).mean() if k == 1 else 0.0)
        put(name, "seq_mean", sv_valid.mean())
        put(name, "seq_std", sv_valid.std() if sv_valid.numel() > 1 else 0.0)
        put(name, "seq_max", sv_valid.max())
        put(name, "seq_min", sv_valid.min())
        put(name, "seq_max_deviation", sv_valid.abs().max())
        put(name, "seq_fraction_high", (sv_valid > hi).to(D).mean())
        if k == 1:
            put(name, "seq_fraction_low", (sv_valid < lo).to(D).mean())
        rej = (~keep) & m
        put(name, "masked_fraction", rej.to(D).sum() / N)
        put(name, "seq_masked_fraction", rej.any(-1)[valid].to(D).mean())
    rej = (~keep_all) & m
    put("", "masked_fraction", rej.to(D).sum() / N)
    put("", "seq_masked_fraction", rej.any(-1).to(D).mean())  # over every row (verl: .mean())
    return (keep_all & m).to(torch.float32), names, vals


def mismatch_ref(old, behav, mask):
    m = mask > 0
    x = torch.exp(old.to(D))[m]
    y = torch.exp(behav.to(D))[m]
    d = (x - y).abs()
    corr = torch.corrcoef(torch.stack([x, y]))[0, 1]
    return [float(d.max()), float(d.mean()), float(d.std()), float(corr)]


def offpolicy_ref(old, behav, mask):
    """verl compute_offpolicy_metrics over the rows with a loss token (the trainer passes only those)."""
    keep = (mask > 0).any(-1)
    o, b, m = old.to(D)[keep], behav.to(D)[keep], mask.to(D)[keep]
    cnt = m.sum(-1)

    def mmean(x, axis=None):
        return (x * m).sum(axis) / (m.sum(axis) + 1e-8)

    mo, mb = mmean(o, -1), mmean(b, -1)
    lr = o - b
    d = mb - mo
    s = torch.clamp((lr * m).sum(-1), -20.0, 20.0)
    vals = [mmean(b - o), mmean(torch.exp(lr) - lr - 1.0), torch.exp(-mo).mean(), (-mo).mean(),
            torch.exp(-mb).mean(), (-mb).mean(), d.mean(), d.abs().mean(), d.max(), d.min(), torch.exp(d).mean(),
            mmean(torch.exp(torch.clamp(lr, -20.0, 20.0)).square()) - 1.0, torch.exp(2.0 * s).mean() - 1.0]
    assert (cnt > 0).all()
    return [float(v) for v in vals]


def make_batch():
    g = torch.Generator().manual_seed(26)
    lens = [10, 7, 0, 10, 1, 10, 5, 8, 2]
    mask = torch.zeros(B, L)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    mask[3] = torch.tensor([1, 1, 0, 0, 0, 1, 1, 1, 0, 0], dtype=torch.float32)  # tool-turn holes
    behav = -torch.rand(B, L, generator=g) * 3.0 - 0.05
    lr = torch.zeros(B, L)
    lr[0] = (torch.rand(L, generator=g) - 0.5) * 0.08              # near on-policy
    lr[1] = (torch.rand(L, generator=g) - 0.5) * 0.4
    lr[1, 2], lr[1, 5] = 1.5, -1.2                                  # outliers
    lr[3] = (torch.rand(L, generator=g) - 0.5) * 0.6
    lr[4, 0] = 0.8
    lr[5] = -0.4 + (torch.rand(L, generator=g) - 0.5) * 0.1         # systematic shift
    lr[6] = (torch.rand(L, generator=g) - 0.5) * 0.2
    lr[6, 3] = 23.0                                                 # past the ±20 clamp
    lr[7] = (torch.rand(L, generator=g) - 0.5) * 1.0
    old = behav + lr
    old[6, 3] = -0.01
    behav[6, 3] = -23.01
    old[8, :2], behav[8, :2] = -1.0, -1.5                           # lr = 0.5 exactly, k2 = 0.125
    garbage = mask == 0                                              # never read: no behaviour logprob there
    behav = torch.where(garbage, torch.full_like(behav, 7.0), behav)
    old = torch.where(garbage, torch.full_like(old, -50.0), old)
    return old.float(), behav.float(), mask


def as_bytes(s):
    return torch.tensor(list(s.encode()), dtype=torch.int32)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    old, behav, mask = make_batch()
    T = {"old": old, "behav": behav, "mask": mask, "n_cases": torch.tensor([len(CASES)], dtype=torch.int32)}
    for i, (opts, thr) in enumerate(CASES):
        keep, names, vals = rs_ref(old, behav, mask, opts, thr)
        T[f"case{i}.rs"] = as_bytes(opts)
        T[f"case{i}.thr"] = as_bytes(thr)
        T[f"case{i}.keep"] = keep
        T[f"case{i}.names"] = as_bytes("\n".join(names))
        T[f"case{i}.vals"] = torch.tensor(vals, dtype=D)
    T["mismatch"] = torch.tensor(mismatch_ref(old, behav, mask), dtype=D)
    T["offpolicy"] = torch.tensor(offpolicy_ref(old, behav, mask), dtype=D)
    # fixture sanity: the cases must reject something without rejecting everything, and the edge holds
    k2 = rs_ref(old, behav, mask, "token_k2", "0.125")[0]
    assert k2[8, 0] == 1 and rs_ref(old, behav, mask, "token_k2", "0.12")[0][8, 0] == 0
    path = os.path.join(out, "rollout_rs.safetensors")
    st_io.save(T, path)
    print(f"wrote {path} ({len(T)} tensors)")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
