"""PyTorch reference for GSPO, the KL estimators and the KL-in-reward controller (tests/test_gspo.c).

Usage: /usr/bin/python3 tests/ref/gen_gspo.py OUTDIR      → OUTDIR/gspo.safetensors

Formulas written here from their public definitions (verl core_algos; not copied):
  GSPO (Zheng et al. 2025, verl compute_policy_loss_gspo) on a padded [B, T] batch with a response
  mask m: log s_i = Σ_t m·(logp − old) / max(Σ_t m, 1); per token log s_i,t = logp − sg[logp] + sg[log s_i],
  clamped above at 10; s = exp(·); L = max(−A·s, −A·clip(s, 1−ε_low, 1+ε_high)) · is_w;
  aggregated seq-mean-token-mean (verl agg_loss: Σ_t m·L / (Σ_t m + 1e-8) averaged over the sequences
  with a loss token). Gradient: autograd with respect to logp.
  KL estimators (verl kl_penalty), d = logp − ref: k1 = d, abs = |d|, k2 = d²/2,
  k3 = clamp(e^δ − δ − 1, ±10) with δ = clamp(−d, ±20); '+' = k2 − sg[k2] + sg[value].
  Adaptive KL controller (Ziegler et al. 2019, verl AdaptiveKLController):
  β ← β·(1 + clip(kl/target − 1, ±0.2)·n/horizon).
  KL in the reward (verl apply_kl_penalty): token rewards score_t − β·kl_t, summed per response;
  current_kl = mean over responses of masked_mean(kl) = Σ m·kl / (Σ m + 1e-8).
Everything is float64 from the float32 inputs that are stored. Sequence log ratios are drawn away from
every clip bound by a relative margin, so each branch decision is unambiguous in fp32.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

D = torch.float64
KL_TYPES = ["k1", "abs", "k2", "k3", "k1+", "abs+", "k3+"]
# GSPO's published clip scale (actor.clip_ratio_low/high = 3e-4 / 4e-4)
LOW, HIGH = 3e-4, 4e-4


def f32(x):
    return float(torch.tensor(x, dtype=torch.float32))


def gspo_ref(logp, old, adv, mask, isw, low, high):
    lp = logp.to(D).clone().requires_grad_(True)
    m = mask.to(D)
    nakl = lp - old.to(D)
    seq_len = m.sum(-1).clamp(min=1)
    seq = (nakl * m).sum(-1) / seq_len
    log_s = torch.clamp(lp - lp.detach() + seq.detach().unsqueeze(-1), max=10.0)
    s = torch.exp(log_s)
    A = adv.to(D)
    l1 = -A * s
    l2 = -A * torch.clamp(s, 1 - low, 1 + high)
    L = torch.maximum(l1, l2)
    if isw is not None:
        L = L * isw.to(D)
    tok = m.sum(-1)
    seq_loss = (L * m).sum(-1) / (tok + 1e-8)
    has = (tok > 0).to(D)
    loss = (seq_loss * has).sum() / has.sum()
    loss.backward()
    clipfrac = ((l2 > l1).to(D) * m).sum() / m.sum()
    return loss.detach(), lp.grad, clipfrac.detach(), seq.detach()


def kl_ref(name, logp, ref):
    lp = logp.to(D).clone().requires_grad_(True)
    d = lp - ref.to(D)
    base = name.rstrip("+")
    if base == "k1":
        v = d
    elif base == "abs":
        v = d.abs()
    elif base == "k2":
        v = 0.5 * d.square()
    else:
        x = torch.clamp(-d, -20.0, 20.0)
        v = torch.clamp(torch.exp(x) - x - 1.0, -10.0, 10.0)
    if name.endswith("+"):
        k2 = 0.5 * d.square()
        v = k2 - k2.detach() + v.detach()
    v.sum().backward()
    return v.detach(), lp.grad


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(26)
    T = {}
    # ---- GSPO: B = 6 sequences of up to 9 tokens, multi-turn masks (0 runs inside), one fully masked ----
    B, L = 6, 9
    lens = [9, 7, 5, 9, 4, 6]
    mask = torch.zeros(B, L)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    mask[0, 3:5] = 0      # an inserted tool turn
    mask[3, 1:4] = 0
    mask[4, :] = 0        # every token masked (tool output only): no loss, out of the seq-mean
    # per-sequence target mean log ratio: inside the clip range, below it, above it, huge (clamp at 10)
    targets = [1e-4, -2e-3, 3e-3, 10.5, 0.0, -1e-4]
    adv_seq = [0.7, 1.3, -0.9, -1.1, 0.5, -0.4]
    old = (torch.rand(B, L, generator=g) * -3.0 - 0.1).float()
    noise = (torch.rand(B, L, generator=g) - 0.5) * 0.02
    logp = torch.zeros(B, L)
    for i in range(B):
        m = mask[i]
        nz = noise[i] * m
        if m.sum() > 0:
            nz = nz - (nz.sum() / m.sum()) * m      # the masked mean of the noise is 0
        logp[i] = old[i] + targets[i] + nz
    logp = logp.float()
    adv = torch.tensor(adv_seq).unsqueeze(-1).expand(B, L).contiguous().float()
    isw = (torch.rand(B, L, generator=g) * 1.5 + 0.25).float()
    for name, w in (("gspo", None), ("gspo_isw", isw)):
        loss, grad, cf, seq = gspo_ref(logp, old, adv, mask, w, f32(LOW), f32(HIGH))
        T[name + "_loss"] = loss.reshape(1).float()
        T[name + "_dlogp"] = grad.float()
        T[name + "_clipfrac"] = cf.reshape(1).float()
    # every branch exercised, with a margin from the clip bounds
    for i in range(B):
        if mask[i].sum() == 0:
            continue
        r = torch.exp(torch.tensor(float(seq[i]), dtype=D))
        for b in (1 - LOW, 1 + HIGH):
            assert abs(float(r) - b) > 1e-5, (i, float(r))
    T["gspo_logp"], T["gspo_old"], T["gspo_adv"], T["gspo_mask"], T["gspo_isw_w"] = logp, old, adv, mask, isw
    T["gspo_clip"] = torch.tensor([LOW, HIGH], dtype=torch.float32)
    T["gspo_seq_log_ratio"] = seq.float()
    # ---- KL estimators: values and gradients, with k3's clamps (|δ| > 20, kl > 10) ----
    N = 40
    klp = (torch.rand(N, generator=g) * -4.0).float()
    kref = (klp + (torch.rand(N, generator=g) - 0.5) * 4.0).float()
    kref[0], kref[1], kref[2], kref[3] = klp[0] + 25.0, klp[1] - 25.0, klp[2] + 3.0, klp[3]  # clamps, d = 0
    T["kl_logp"], T["kl_ref"] = klp, kref
    for name in KL_TYPES:
        v, gr = kl_ref(name, klp, kref)
        T["kl_" + name + "_value"], T["kl_" + name + "_grad"] = v.float(), gr.float()
    # ---- KL in the reward: responses of the GSPO batch, old = gspo_old, ref drawn ----
    rref = (old + (torch.rand(B, L, generator=g) - 0.5) * 0.6).float()
    score = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.25])
    beta = f32(0.05)
    T["rew_ref"], T["rew_score"], T["rew_beta"] = rref, score.float(), torch.tensor([beta], dtype=torch.float32)
    for name in ("k1", "k3"):
        kld, _ = kl_ref(name, old, rref)
        kld = kld * mask.to(D)
        tok_rewards = torch.zeros(B, L, dtype=D)
        for i in range(B):
            tok_rewards[i, max(lens[i] - 1, 0)] = score[i]      # the outcome score on the last token
        tok_rewards = tok_rewards - beta * kld
        T["rew_" + name + "_scores"] = tok_rewards.sum(-1).float()
        cur = (kld.sum(-1) / (mask.to(D).sum(-1) + 1e-8)).mean()
        T["rew_" + name + "_current_kl"] = cur.reshape(1).float()
    # ---- adaptive controller: 8 updates ----
    kls = [f32(x) for x in (0.05, 0.3, 0.12, 0.0, 0.1, 0.5, 0.08, 0.099)]
    b, tgt, hor, nst = f32(0.2), f32(0.1), 500.0, 64
    seqb = []
    for k in kls:
        e = min(max(k / tgt - 1.0, -0.2), 0.2)
        b *= 1.0 + e * nst / hor
        seqb.append(b)
    T["ctrl_kl"] = torch.tensor(kls, dtype=torch.float32)
    T["ctrl_params"] = torch.tensor([f32(0.2), tgt, hor, nst], dtype=torch.float32)
    T["ctrl_beta"] = torch.tensor(seqb, dtype=torch.float32)  # float64 sequence rounded once
    st_io.save(T, os.path.join(out, "gspo.safetensors"))
    print(f"wrote {os.path.join(out, 'gspo.safetensors')} ({len(T)} tensors)")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
