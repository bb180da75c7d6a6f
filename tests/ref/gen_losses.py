"""PyTorch reference data for the RL losses of src/rl/losses.h (tests/test_losses.c).

Usage: /usr/bin/python3 tests/ref/gen_losses.py OUTDIR      → OUTDIR/losses.safetensors

The formulas are written here from their public definitions (not copied):
  GRPO advantage  verl compute_grpo_outcome_advantage: A = (r − mean_G) / (std_G + eps), std unbiased,
                  a group of one has mean 0 and std 1.
  PPO clip        verl compute_policy_loss: r = exp(clamp(logp − old, ±20)),
                  L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); for A < 0, L = min(L, −A·c);
                  clipped = (clipped surrogate > unclipped), dual = (L_clip > −A·c) ∧ (A < 0),
                  ppo_kl summand = −clamp(logp − old, ±20).
  decoupled PPO   AReaL: old = π_prox, b = exp(old − μ), L ← L · sg[b] where b ≤ C, 0 where b > C (filtered).
  k3 KL           verl kl_penalty("low_var_kl"): δ = clamp(ref − logp, ±20), kl = clamp(e^δ − δ − 1, ±10).
  entropy bonus   loss = −coef · Σ w·H.
Gradients are autograd's, with respect to logp (or the entropy). Everything is computed in float64
from the float32 inputs that are stored, so the reference is the exact answer for those inputs.
Inputs are drawn so that no token lies within a relative 1e-3 of a branch boundary (clip bounds,
dual-clip bound, ±20 clamp, behaviour-weight cap, k3 value clamp) under any configuration, which
makes every branch decision unambiguous; the script checks that every branch is exercised.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

D = torch.float64
MARGIN = 1e-3

# (ε_low, ε_high, c, decoupled, C); c ≤ 1 disables the dual clip. Rounded to float32 below so the
# reference uses exactly the parameters the C code receives.
CONFIGS = [
    (0.2, 0.2, 3.0, 0, 2.0),
    (0.2, 0.28, 3.0, 0, 2.0),
    (0.1, 0.3, 1.0, 0, 2.0),   # dual clip disabled: the ±20 ratio clamp shows in the loss value
    (0.2, 0.28, 3.0, 1, 2.0),
    (0.15, 0.25, 10.0, 1, 1.5),
]


def f32v(x):
    return torch.tensor(x, dtype=torch.float32).item()


CONFIGS = [tuple(f32v(v) for v in cfg) for cfg in CONFIGS]


def ppo_ref(logp, old, behav, adv, w, elo, ehi, c, decoupled, cap):
    """Per-token loss L (w-free), total Σ w·L, ∂total/∂logp, and the statistics."""
    lp = logp.to(D).clone().requires_grad_(True)
    old, behav, adv, w = old.to(D), behav.to(D), adv.to(D), w.to(D)
    x = torch.clamp(lp - old, -20.0, 20.0)
    r = torch.exp(x)
    l1 = -adv * r
    l2 = -adv * torch.clamp(r, 1.0 - elo, 1.0 + ehi)
    lc = torch.maximum(l1, l2)
    clipped = l2 > l1
    if c > 1.0:
        l3 = -adv * c
        L = torch.where(adv < 0, torch.minimum(lc, l3), lc)
        dual = (lc > l3) & (adv < 0)
    else:
        L = lc
        dual = torch.zeros_like(clipped)
    if decoupled:
        b = torch.exp(old - behav)
        bw = torch.where(b <= cap, b, torch.zeros_like(b)).detach()
        L = L * bw
    total = (L * w).sum()
    total.backward()
    m = w > 0
    stats = torch.tensor([L[m].sum().item(), clipped[m].sum().item(), (-x)[m].sum().item(),
                          dual[m].sum().item(), m.sum().item()], dtype=D)
    return L.detach(), total.detach(), lp.grad.detach(), stats, clipped, dual


def near(a, b):
    return abs(a - b) <= MARGIN * max(abs(b), 1e-30)


def token_ok(lp, o, b, a):
    """True when the token is unambiguous under every configuration (float32 values in, f64 math)."""
    x = lp - o
    if abs(abs(x) - 20.0) < 0.1:
        return False
    r = math.exp(max(-20.0, min(20.0, x)))
    for elo, ehi, c, dec, cap in CONFIGS:
        lo, hi = 1.0 - elo, 1.0 + ehi
        if near(r, lo) or near(r, hi):
            return False
        if c > 1.0 and a < 0:
            lc = max(-a * r, -a * min(max(r, lo), hi))
            if near(lc, -a * c):
                return False
        if dec and near(math.exp(o - b), cap):
            return False
    return True


def draw_ppo_tokens(n, g):
    """Token inputs mixing small, clip-range, dual-clip-range and ±20-clamp log-ratios."""
    kinds = ["small", "moderate", "dual", "clamp"]
    logp, old, behav, adv = [], [], [], []
    i = 0
    while len(logp) < n:
        kind = kinds[i % 4] if i % 11 else "clamp"
        i += 1
        u = lambda lo, hi: lo + (hi - lo) * torch.rand((), generator=g).item()  # noqa: E731
        sgn = 1.0 if torch.rand((), generator=g).item() < 0.5 else -1.0
        if kind == "small":
            x = u(-0.15, 0.15)
        elif kind == "moderate":
            x = sgn * u(0.3, 0.9)
        elif kind == "dual":
            x = u(1.3, 4.0)
        else:
            x = sgn * u(21.0, 30.0)
        lp = f32v(u(-6.0, -0.05))
        o = f32v(lp - x)
        b = f32v(o - u(-1.2, 1.2))
        if len(logp) % 9 == 4:
            a = 0.0
        else:
            a = f32v(torch.randn((), generator=g).item() * 1.5)
        if not token_ok(lp, o, b, a):
            continue
        logp.append(lp); old.append(o); behav.append(b); adv.append(a)
    t = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    return t(logp), t(old), t(behav), t(adv)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(20250611)
    T = {}

    # ---- PPO token loss ----
    N = 96
    logp, old, behav, adv = draw_ppo_tokens(N, g)
    mask = (torch.rand(N, generator=g) > 0.15).float()
    w = (mask / mask.sum()).to(torch.float32)
    T["ppo_logp"], T["ppo_old_logp"], T["ppo_behav_logp"], T["ppo_adv"], T["ppo_w"] = logp, old, behav, adv, w
    T["ppo_configs"] = torch.tensor(CONFIGS, dtype=torch.float32)
    seen = {"clip_high": 0, "clip_low": 0, "dual": 0, "clamp_hi": 0, "clamp_lo": 0, "cap": 0, "uncapped": 0}
    x = logp.to(D) - old.to(D)
    for k, (elo, ehi, c, dec, cap) in enumerate(CONFIGS):
        L, total, grad, stats, clipped, dual = ppo_ref(logp, old, behav, adv, w, elo, ehi, c, dec, cap)
        T[f"ppo{k}_token_loss"] = L.float()
        T[f"ppo{k}_loss"] = total.reshape(1).float()
        T[f"ppo{k}_dlogp"] = grad.float()
        T[f"ppo{k}_stats"] = stats.float()
        m = w > 0
        seen["clip_high"] += int((clipped & m & (adv > 0)).sum())
        seen["clip_low"] += int((clipped & m & (adv < 0)).sum())
        seen["dual"] += int((dual & m).sum())
        if dec:
            bw = torch.exp(old.to(D) - behav.to(D))
            seen["cap"] += int(((bw > cap) & m).sum())
            seen["uncapped"] += int(((bw < cap) & m).sum())
    seen["clamp_hi"] = int(((x > 20) & (adv < 0) & (w > 0)).sum())
    seen["clamp_lo"] = int(((x < -20) & (w > 0)).sum())
    for name, cnt in seen.items():
        assert cnt > 0, f"gen_losses: PPO test data exercises no '{name}' token; change the seed or the draw"
    assert int((adv == 0).sum()) > 0 and int((w == 0).sum()) > 0

    # ---- GRPO advantages: groups of 1, 2, 5 (random), 5 (identical rewards → A = 0), 3, 1 ----
    sizes = [1, 2, 5, 5, 3, 1]
    rewards = torch.cat([
        torch.tensor([0.7]), torch.tensor([1.0, 0.0]), torch.randn(5, generator=g),
        torch.full((5,), 0.7), torch.tensor([1.0, 0.0, 1.0]), torch.tensor([-1.5]),
    ]).to(torch.float32)
    eps = f32v(1e-6)
    advs, off = [], 0
    for n in sizes:
        r = rewards[off:off + n].to(D)
        off += n
        if n == 1:
            mean, std = torch.tensor(0.0, dtype=D), torch.tensor(1.0, dtype=D)
        else:
            mean, std = r.mean(), r.std()  # torch.std is unbiased (N − 1)
        advs.append((r - mean) / (std + eps))
    T["grpo_rewards"] = rewards
    T["grpo_group_size"] = torch.tensor(sizes, dtype=torch.int32)
    T["grpo_eps"] = torch.tensor([eps], dtype=torch.float32)
    T["grpo_adv"] = torch.cat(advs).float()

    # ---- k3 KL: small δ, and large |δ| that hit the value clamp (kl > 10) and the ±20 δ clamp ----
    NK = 64
    d = torch.randn(NK, generator=g, dtype=D) * 0.5
    d[5::9] = 3.0 + torch.rand(len(d[5::9]), generator=g, dtype=D) * 2.0        # kl = e^δ − δ − 1 > 10
    d[7::11] = -(13.0 + torch.rand(len(d[7::11]), generator=g, dtype=D) * 12.0)  # kl ≈ −δ − 1 > 10
    klogp = (-(torch.rand(NK, generator=g, dtype=D) * 5.0 + 0.05)).float()
    kref = (klogp.to(D) + d).float()
    dd = kref.to(D) - klogp.to(D)
    kv = torch.exp(dd.clamp(-20, 20)) - dd.clamp(-20, 20) - 1
    assert bool(((kv - 10.0).abs() > MARGIN * 10).all()), "gen_losses: a k3 token lies on the value clamp"
    assert int((kv > 10).sum()) > 0 and int((kv < 10).sum()) > 0
    kmask = (torch.rand(NK, generator=g) > 0.2).float()
    kw = (kmask / kmask.sum()).float()
    kcoef = f32v(0.05)
    kinit = torch.randn(NK, generator=g).float()
    lp = klogp.to(D).clone().requires_grad_(True)
    delta = torch.clamp(kref.to(D) - lp, -20.0, 20.0)
    kl = torch.clamp(torch.exp(delta) - delta - 1.0, -10.0, 10.0)
    ktotal = (kl * kw.to(D)).sum()
    (kcoef * ktotal).backward()
    T["k3_logp"], T["k3_ref_logp"], T["k3_w"], T["k3_dlogp_init"] = klogp, kref, kw, kinit
    T["k3_coef"] = torch.tensor([kcoef], dtype=torch.float32)
    T["k3_loss"] = ktotal.detach().reshape(1).float()
    T["k3_dlogp"] = (kinit.to(D) + lp.grad).float()

    # ---- entropy bonus ----
    NE = 32
    H = (torch.rand(NE, generator=g) * 3.0).float()
    emask = (torch.rand(NE, generator=g) > 0.25).float()
    ew = (emask / emask.sum()).float()
    ecoef = f32v(0.01)
    h = H.to(D).clone().requires_grad_(True)
    esum = (ew.to(D) * h).sum()
    (-ecoef * esum).backward()
    T["ent_entropy"], T["ent_w"] = H, ew
    T["ent_coef"] = torch.tensor([ecoef], dtype=torch.float32)
    T["ent_sum"] = esum.detach().reshape(1).float()
    T["ent_dentropy"] = h.grad.float()

    st_io.save(T, os.path.join(out, "losses.safetensors"))
    print(f"wrote {os.path.join(out, 'losses.safetensors')} ({len(T)} tensors; PPO branch counts {seen})")
    print("1 passed, 0 failed")  # the count tests/run.sh requires of every step


if __name__ == "__main__":
    main()
