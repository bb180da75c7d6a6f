"""PyTorch reference for the multi-turn loss mask through the RL trainer (tests/test_loss_mask.c).

Usage: /usr/bin/python3 tests/ref/gen_loss_mask.py OUTDIR
  → OUTDIR/loss_mask_model/{config.json, model.safetensors}  a tiny random Qwen3-MoE (no aux loss)
  → OUTDIR/loss_mask_ref_model/...                            the KL case's reference policy
  → OUTDIR/loss_mask.safetensors                               one GRPO group and, per case, the
                                                                aggregated losses, metrics and the
                                                                gradient of every parameter

One prompt with G = 4 multi-turn responses: each response's tokens hold model-sampled tokens (mask 1)
and inserted tool-turn tokens (mask 0, behaviour logprob 0, as the engine writes them); response 1
has no mask at all (a single-turn response: every token is a loss token). The loss is written here
from its public definitions (not copied), with the response mask as the loss mask everywhere, as
verl's multi-turn agent loop uses response_mask:
  ratio r = exp(clamp(logp − old, ±20)), L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)), for A < 0
  L = min(L, −A·c) (dual clip); rollout IS (sequence) w = min(exp(clamp(Σ_mask (old − μ), ±20)), thr);
  verl core_algos.agg_loss over the masked [G, T] matrix:
    token-mean               Σ m·L / Σ m
    seq-mean-token-sum       mean over sequences with a loss token of Σ_t m·L
    seq-mean-token-mean      mean over those sequences of Σ_t m·L / Σ_t m
    seq-mean-token-sum-norm  Σ m·L / H / (sequences with a loss token)
  loss = agg(L) − entropy_coeff · agg(H_t), H_t the entropy of softmax(logits) at the target position;
  k3 KL to a reference policy (actor.use_kl_loss): δ = clamp(ref − logp, ±20), kl = clamp(e^δ − δ − 1,
  ±10), loss += kl_loss_coef · agg(kl) (actor/kl_loss = agg(kl));
  decoupled PPO (AReaL): the anchor is π_prox (recomputed), L ← L·b with b = π_prox/μ when b ≤ C,
  0 when b > C (the token is filtered out, still counted in the denominator);
  GRPO advantage (r − mean)/(std + 1e-6) (std unbiased); REINFORCE++ baseline: s = r − group mean,
  whitened over the loss tokens (verl masked_whiten: mean and unbiased variance over mask-1 tokens).
Metrics: actor/pg_loss = agg(L), actor/entropy = token mean of H over the loss tokens, pg_clipfrac and
the decoupled loss's filtered share, token means over the loss tokens.
The model is tests/ref/qwen3_moe_ref.py in float64 from the exact float32 checkpoint values; the
seed is advanced until every router top-k margin exceeds 1e-4 (so fp32 routing agrees), and the
behaviour logprobs μ = logp_ref − δ put every token's ratio at fixed values away from every branch
boundary (clip bounds, dual clip, IS threshold), so every branch decision is unambiguous in fp32.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
import qwen3_moe_ref as R  # noqa: E402
import gen_model as GM  # noqa: E402

D = torch.float64
CFG = GM.hf_config(v=61, h=32, inter=40, moe_inter=16, layers=2, nh=4, nkv=2, hd=8, e=6, k=2,
                   norm_topk=False, tie=False, theta=10000.0, coef=0.0, sparse_step=1, mlp_only=[])
PROMPT_LEN = 5
# response masks (None: no mask); runs of 0 are the inserted tool turns
MASKS = [
    [1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1],
    None,
    [1, 1, 0, 0, 0, 1, 1],
    [1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1],
]
REWARDS = [1.0, 0.0, 0.5, 0.0]
CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
ENTROPY_COEFF = 0.01
SCALE_H = 16.0          # actor.loss_scale_factor of seq-mean-token-sum-norm
IS_THRESHOLD = 2.0
BEHAV_CAP = 1.3         # actor.behav_imp_weight_cap of the decoupled case (π_prox/μ above it: filtered)
KL_COEF = 0.1           # actor.kl_loss_coef of the KL case; its reference: the weights × (1 + REF_JITTER·N(0,1))
REF_JITTER = 0.05
# behaviour-anchored cases: ratio π/μ per loss token cycles through these (none within 1e-2 of
# 1 − ε_low = 0.8, 1 + ε_high = 1.28 or the dual-clip bound at c = 3)
RATIOS = [0.5, 1.1, 1.6, 0.9, 5.0, 1.05, 0.7]
# IS case: per loss token log(π_old/μ) cycles through these; response sums checked against ln thr
IS_DELTAS = [0.05, -0.03, 0.12, 0.02]
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def f32(x):
    return torch.tensor(x, dtype=torch.float32).item()


def agg(mat, mask, mode):
    """verl agg_loss over [G, T] with the loss mask (sequences without a loss token are left out)."""
    tok = mask.sum(dim=1)
    has = tok > 0
    S = has.sum()
    if mode == "token-mean":
        return (mat * mask).sum() / mask.sum()
    if mode == "seq-mean-token-sum":
        return (mat * mask).sum(dim=1)[has].sum() / S
    if mode == "seq-mean-token-mean":
        return ((mat * mask).sum(dim=1)[has] / tok[has]).sum() / S
    return (mat * mask).sum() / SCALE_H / S


def advantages(case):
    r = torch.tensor([f32(x) for x in REWARDS], dtype=D)
    if case["adv"] == "grpo":
        return (r - r.mean()) / (r.std() + f32(1e-6))
    return r - r.mean()  # REINFORCE++ baseline before whitening


def build_batch(cfg, gen):
    prompt = torch.randint(0, cfg.vocab_size, (PROMPT_LEN,), generator=gen)
    resp = [torch.randint(0, cfg.vocab_size, (len(m) if m else 9,), generator=gen) for m in MASKS]
    return prompt, resp


def forward(p64, cfg, prompt, resp):
    """Per response: logp and entropy at every response position [T_j] (float64, differentiable)."""
    toks = [torch.cat([prompt, r]) for r in resp]
    cu = [0]
    for t in toks:
        cu.append(cu[-1] + len(t))
    tokens = torch.cat(toks).to(torch.int32)
    logits, rl, _ = R.forward_packed(p64, cfg, tokens, torch.tensor(cu, dtype=torch.int32))
    lsm = torch.log_softmax(logits, dim=-1)
    ent_all = -(lsm.exp() * lsm).sum(dim=-1)
    lp, ent = [], []
    for j, r in enumerate(resp):
        # the target tokens[P + i] is predicted at position P + i − 1 of the sequence
        pos = torch.arange(PROMPT_LEN - 1, PROMPT_LEN - 1 + len(r)) + cu[j]
        lp.append(lsm[pos, r.long()])
        ent.append(ent_all[pos])
    return lp, ent, rl


def padded(xs, T, fill=0.0):
    out = torch.full((len(xs), T), fill, dtype=D)
    for j, x in enumerate(xs):
        out[j, :len(x)] = x
    return out


def case_loss(case, lp, ent, behav, masks, T, ref=None):
    """The trainer's loss for one case (differentiable in lp / ent) and its metrics."""
    LP, E, MU = padded(lp, T), padded(ent, T), padded(behav, T)
    M = padded([torch.tensor(m, dtype=D) for m in masks], T)
    A = advantages(case)
    if case["adv"] == "rpp":  # masked_whiten over the loss tokens
        s = A[:, None].expand(-1, T)
        n = M.sum()
        mean = (s * M).sum() / n
        var = (((s - mean) ** 2) * M).sum() / n * n / (n - 1)
        A = (A - mean) / torch.sqrt(var + 1e-8)
    A = A.to(torch.float32).to(D)[:, None].expand(-1, T)
    bw = torch.ones_like(LP)
    if case["recompute"] == 2:  # decoupled: anchor π_prox, behaviour weight b = π_prox/μ, filtered above C
        old, w = LP.detach(), torch.ones_like(LP)
        b = torch.exp(old - MU)
        bw = torch.where(b <= BEHAV_CAP, b, torch.zeros_like(b))
    elif case["recompute"]:
        old = LP.detach()
        seq = ((old - MU) * M).sum(dim=1).clamp(-20, 20)
        w = torch.minimum(torch.exp(seq), torch.tensor(IS_THRESHOLD, dtype=D))[:, None].expand(-1, T)
    else:
        old, w = MU, torch.ones_like(LP)
    r = torch.exp(torch.clamp(LP - old, -20, 20))
    l1, l2 = -A * r, -A * torch.clamp(r, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    L = torch.maximum(l1, l2)
    L = torch.where(A < 0, torch.minimum(L, -A * CLIP_C), L) * bw * w
    pg = agg(L, M, case["mode"])
    h = agg(E, M, case["mode"])
    clipped = ((l2 > l1).to(D) * M).sum() / M.sum()
    dropped = ((bw == 0).to(D) * M).sum() / M.sum()
    loss, kl = pg - ENTROPY_COEFF * h, torch.zeros((), dtype=D)
    if ref is not None:
        d = torch.clamp(padded(ref, T) - LP, -20, 20)
        kl = agg(torch.clamp(torch.exp(d) - d - 1, -10, 10), M, case["mode"])
        loss = loss + KL_COEF * kl
    return loss, pg, (E * M).sum() / M.sum(), clipped, dropped, kl


# recompute: 0 behaviour-anchored, 1 recomputed old + sequence-level rollout IS, 2 decoupled
CASES = [{"mode": m, "adv": "grpo", "recompute": 0} for m in MODES] + \
        [{"mode": "token-mean", "adv": "rpp", "recompute": 1},
         {"mode": "seq-mean-token-sum", "adv": "grpo", "recompute": 2},
         {"mode": "seq-mean-token-mean", "adv": "grpo", "recompute": 0, "kl": 1}]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    cfg = R.Qwen3MoeConfig(CFG)
    for attempt in range(GM.MAX_RESEEDS):
        seed = 4000 + attempt
        gen = torch.Generator().manual_seed(seed)
        params32 = GM.init_params(cfg, gen)
        prompt, resp = build_batch(cfg, gen)
        p64 = R.to_float64(params32)
        with torch.no_grad():
            lp0, _, rl = forward(p64, cfg, prompt, resp)
        ref32 = {n: v * (1 + REF_JITTER * torch.randn(v.shape, generator=gen, dtype=torch.float32))
                 for n, v in params32.items()}
        ref64 = R.to_float64(ref32)
        with torch.no_grad():
            ref_lp, _, rl_ref = forward(ref64, cfg, prompt, resp)
        if min(R.topk_gap(rl.values(), cfg.num_experts_per_tok),
               R.topk_gap(rl_ref.values(), cfg.num_experts_per_tok)) > GM.GAP_MIN:
            break
    else:
        print("gen_loss_mask: no seed gives a top-k margin > %g\n0 passed, 1 failed" % GM.GAP_MIN)
        sys.exit(1)
    masks = [m if m else [1] * len(resp[j]) for j, m in enumerate(MASKS)]
    T = max(len(r) for r in resp)
    # behaviour logprobs: μ = logp − log(ratio) on loss tokens, 0 on inserted ones (fp32, as stored)
    behav, behav_is, k = [], [], 0
    for j, m in enumerate(masks):
        b = torch.zeros(len(m), dtype=torch.float32)
        bi = torch.zeros(len(m), dtype=torch.float32)
        for i, on in enumerate(m):
            if on:
                b[i] = float(lp0[j][i]) - math.log(RATIOS[k % len(RATIOS)])
                bi[i] = float(lp0[j][i]) - IS_DELTAS[k % len(IS_DELTAS)] * (4.0 if j == 0 else 1.0)
                k += 1
        behav.append(b)
        behav_is.append(bi)
    # every IS sequence weight away from the threshold
    for j, m in enumerate(masks):
        sdel = sum(float(lp0[j][i]) - float(behav_is[j][i]) for i in range(len(m)) if m[i])
        assert abs(sdel - math.log(IS_THRESHOLD)) > 1e-2, "gen_loss_mask: IS weight on the threshold"
    T_out = {"prompt": prompt.to(torch.int32), "rewards": torch.tensor(REWARDS, dtype=torch.float32),
             "resp_len": torch.tensor([len(r) for r in resp], dtype=torch.int32),
             "resp_tokens": torch.cat(resp).to(torch.int32),
             "resp_mask": torch.tensor([x for m in masks for x in m], dtype=torch.int32),
             "has_mask": torch.tensor([1 if m else 0 for m in MASKS], dtype=torch.int32),
             "behav": torch.cat(behav), "behav_is": torch.cat(behav_is),
             "params": torch.tensor([CLIP_LOW, CLIP_HIGH, CLIP_C, ENTROPY_COEFF, SCALE_H, IS_THRESHOLD,
                                     BEHAV_CAP, KL_COEF], dtype=torch.float32)}
    names = list(p64)
    for ci, case in enumerate(CASES):
        leaves = {n: v.detach().clone().requires_grad_(True) for n, v in p64.items()}
        lp, ent, _ = forward(leaves, cfg, prompt, resp)
        mu = [b.to(D) for b in (behav_is if case["recompute"] else behav)]  # decoupled: the IS draws too
        loss, pg, h, clipfrac, dropped, kl = case_loss(case, lp, ent, mu, masks, T,
                                                       ref_lp if case.get("kl") else None)
        gs = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
        for n, g in zip(names, gs):
            T_out["case%d.grad.%s" % (ci, n)] = (g if g is not None else torch.zeros_like(leaves[n])).float()
        T_out["case%d.metrics" % ci] = torch.tensor([float(pg), float(h), float(clipfrac), float(dropped),
                                                     float(kl)], dtype=torch.float32)
        print("case %d (%s, %s%s%s): pg_loss %.6g entropy %.6g clipfrac %.3f filtered %.3f kl %.6g" %
              (ci, case["mode"], case["adv"], ["", ", recompute + sequence IS", ", decoupled"][case["recompute"]],
               ", k3 KL" if case.get("kl") else "", float(pg), float(h), float(clipfrac), float(dropped), float(kl)))
        if case["recompute"] == 2:
            assert 0 < float(dropped) < 1, "gen_loss_mask: the decoupled case filters no token (or all)"
            for j, m in enumerate(masks):
                for i in range(len(m)):
                    if m[i]:
                        b = math.exp(float(lp0[j][i]) - float(mu[j][i]))
                        assert abs(b - BEHAV_CAP) > 1e-2, "gen_loss_mask: a behaviour weight on the cap"
    T_out["cases"] = torch.tensor([[MODES.index(c["mode"]), c["adv"] == "rpp", c["recompute"], c.get("kl", 0)]
                                   for c in CASES], dtype=torch.int32)
    d = os.path.join(out, "loss_mask_model")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CFG, f, indent=2)
    st_io.save(params32, os.path.join(d, "model.safetensors"), {"format": "pt"})
    d = os.path.join(out, "loss_mask_ref_model")  # the KL case's reference policy
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CFG, f, indent=2)
    st_io.save(ref32, os.path.join(d, "model.safetensors"), {"format": "pt"})
    st_io.save(T_out, os.path.join(out, "loss_mask.safetensors"),
               {"generator": "tests/ref/gen_loss_mask.py", "seed": str(seed)})
    print("wrote %s (seed %d, %d cases)" % (os.path.join(out, "loss_mask.safetensors"), seed, len(CASES)))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
