"""PyTorch reference for GSPO and the KL options through the RL trainer (tests/test_gspo_trainer.c).

Usage: /usr/bin/python3 tests/ref/gen_gspo_trainer.py OUTDIR
  → OUTDIR/gspo_trainer_model/, OUTDIR/gspo_trainer_ref_model/ (tiny Qwen3-MoE policy and reference)
  → OUTDIR/gspo_trainer.safetensors (the group, behaviour logprobs, per case metrics and every gradient)

The model, the multi-turn group (masks with inserted tool turns) and the forward are
tests/ref/gen_loss_mask.py's (imported). Cases, all behaviour-anchored, GRPO, entropy_coeff 0.01:
  0  actor.policy_loss.loss_mode=gspo with actor.loss_agg_mode=token-mean and GSPO's clip 3e-4/4e-4:
     log s_i = masked mean of (logp − μ), token ratio exp(logp − sg[logp] + sg[log s_i]) (clamp max 10),
     L = max(−A·s, −A·clip(s)), pg aggregated seq-mean-token-mean (verl forces it), the entropy bonus
     token-mean; KL loss k1+ (value d, gradient of d²/2) to the reference, coef 0.1, token-mean.
  1  vanilla PPO (clip 0.2/0.28, dual clip 3), seq-mean-token-mean, algorithm.use_kl_in_reward with
     kl_penalty=low_var_kl, β = 4 fixed: score_i − β·Σ_mask k3(μ, ref), then GRPO advantages.
Behaviour logprobs μ put each sequence's mean log ratio at a chosen value (inside the GSPO clip range,
below it, above it) with zero-mean per-token noise, so every branch is decided with a margin far above
fp32 rounding; vanilla's per-token ratios stay away from 0.8, 1.28 and the dual clip.
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
import gen_loss_mask as LM  # noqa: E402

D = torch.float64
G_LOW, G_HIGH = 3e-4, 4e-4
SEQ_LOG_RATIO = [1e-4, -2e-3, 3e-3, -5e-2]
ENT, KL_COEF, BETA = 0.01, 0.1, 4.0


def f32(x):
    return torch.tensor(x, dtype=torch.float32).item()


def tok_mean(mat, M):
    return (mat * M).sum() / M.sum()


def seq_mean_tok_mean(mat, M):
    tok = M.sum(1)
    has = tok > 0
    return ((mat * M).sum(1)[has] / tok[has]).sum() / has.sum()


def grpo(r):
    return ((r - r.mean()) / (r.std() + f32(1e-6))).to(torch.float32).to(D)


def k3(old, ref):
    d = torch.clamp(ref - old, -20, 20)
    return torch.clamp(torch.exp(d) - d - 1, -10, 10)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    cfg = R.Qwen3MoeConfig(LM.CFG)
    for attempt in range(GM.MAX_RESEEDS):
        seed = 7000 + attempt
        gen = torch.Generator().manual_seed(seed)
        params32 = GM.init_params(cfg, gen)
        prompt, resp = LM.build_batch(cfg, gen)
        p64 = R.to_float64(params32)
        ref32 = {n: v * (1 + LM.REF_JITTER * torch.randn(v.shape, generator=gen, dtype=torch.float32))
                 for n, v in params32.items()}
        ref64 = R.to_float64(ref32)
        with torch.no_grad():
            lp0, _, rl = LM.forward(p64, cfg, prompt, resp)
            ref_lp, _, rl_ref = LM.forward(ref64, cfg, prompt, resp)
        if min(R.topk_gap(rl.values(), cfg.num_experts_per_tok),
               R.topk_gap(rl_ref.values(), cfg.num_experts_per_tok)) > GM.GAP_MIN:
            break
    else:
        print("gen_gspo_trainer: no seed gives a top-k margin > %g\n0 passed, 1 failed" % GM.GAP_MIN)
        sys.exit(1)
    masks = [m if m else [1] * len(resp[j]) for j, m in enumerate(LM.MASKS)]
    T = max(len(r) for r in resp)
    behav = []
    for j, m in enumerate(masks):
        on = [i for i in range(len(m)) if m[i]]
        noise = [0.02 * ((k % 3) - 1) for k in range(len(on))]
        mean = sum(noise) / len(noise)
        b = torch.zeros(len(m), dtype=torch.float32)
        for k, i in enumerate(on):
            b[i] = float(lp0[j][i]) - (SEQ_LOG_RATIO[j] + noise[k] - mean)
        behav.append(b)
    M = LM.padded([torch.tensor(m, dtype=D) for m in masks], T)
    MU = LM.padded([b.to(D) for b in behav], T)
    REF = LM.padded([x.detach() for x in ref_lp], T)
    rewards = torch.tensor([f32(x) for x in LM.REWARDS], dtype=D)
    for j in range(len(masks)):   # the sequence ratios as stored, away from the clip bounds
        s = float(((LM.padded([x.detach() for x in lp0], T)[j] - MU[j]) * M[j]).sum() / M[j].sum())
        for bnd in (math.log(1 - f32(G_LOW)), math.log(1 + f32(G_HIGH))):
            assert abs(s - bnd) > 5e-5, (j, s)
    T_out = {"prompt": prompt.to(torch.int32), "rewards": rewards.float(),
             "resp_len": torch.tensor([len(r) for r in resp], dtype=torch.int32),
             "resp_tokens": torch.cat(resp).to(torch.int32),
             "resp_mask": torch.tensor([x for m in masks for x in m], dtype=torch.int32),
             "has_mask": torch.tensor([1 if m else 0 for m in LM.MASKS], dtype=torch.int32),
             "behav": torch.cat(behav),
             "params": torch.tensor([G_LOW, G_HIGH, LM.CLIP_LOW, LM.CLIP_HIGH, LM.CLIP_C, ENT, KL_COEF, BETA],
                                    dtype=torch.float32)}
    names = list(p64)
    for ci in range(2):
        leaves = {n: v.detach().clone().requires_grad_(True) for n, v in p64.items()}
        lp, ent, _ = LM.forward(leaves, cfg, prompt, resp)
        LP, E = LM.padded(lp, T), LM.padded(ent, T)
        if ci == 0:
            A = grpo(rewards)[:, None].expand(-1, T)
            seq = ((LP.detach() - MU) * M).sum(1) / M.sum(1).clamp(min=1)
            s = torch.exp(torch.clamp(LP - LP.detach() + seq[:, None], max=10.0))
            l1, l2 = -A * s, -A * torch.clamp(s, 1 - f32(G_LOW), 1 + f32(G_HIGH))
            L = torch.maximum(l1, l2)
            pg = seq_mean_tok_mean(L, M)
            h = tok_mean(E, M)
            d = LP - REF
            k2 = 0.5 * d * d
            klv = k2 - k2.detach() + d.detach()  # k1+: value d, gradient of k2
            kl = tok_mean(klv, M)
            loss = pg - f32(ENT) * h + f32(KL_COEF) * kl
            kl_reward = torch.zeros(())
        else:
            kls = (k3(MU, REF) * M)
            score = rewards - f32(BETA) * kls.sum(1)
            A = grpo(score.to(torch.float32).to(D))[:, None].expand(-1, T)
            r = torch.exp(torch.clamp(LP - MU, -20, 20))
            l1, l2 = -A * r, -A * torch.clamp(r, 1 - f32(LM.CLIP_LOW), 1 + f32(LM.CLIP_HIGH))
            L = torch.maximum(l1, l2)
            L = torch.where(A < 0, torch.minimum(L, -A * f32(LM.CLIP_C)), L)
            pg = seq_mean_tok_mean(L, M)
            h = seq_mean_tok_mean(E, M)
            loss = pg - f32(ENT) * h
            kl = torch.zeros(())
            kl_reward = (kls.sum(1) / (M.sum(1) + 1e-8)).mean()
        clipped = ((l2 > l1).to(D) * M).sum() / M.sum()
        gs = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
        for n, g in zip(names, gs):
            T_out["case%d.grad.%s" % (ci, n)] = (g if g is not None else torch.zeros_like(leaves[n])).float()
        T_out["case%d.metrics" % ci] = torch.tensor(
            [float(pg), float((E * M).sum() / M.sum()), float(clipped), float(kl), float(kl_reward)],
            dtype=torch.float32)
        print("case %d: pg_loss %.6g clipfrac %.3f kl_loss %.6g reward_kl %.6g" %
              (ci, float(pg), float(clipped), float(kl), float(kl_reward)))
    for name, p in (("gspo_trainer_model", params32), ("gspo_trainer_ref_model", ref32)):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(LM.CFG, f, indent=2)
        st_io.save(p, os.path.join(d, "model.safetensors"), {"format": "pt"})
    st_io.save(T_out, os.path.join(out, "gspo_trainer.safetensors"),
               {"generator": "tests/ref/gen_gspo_trainer.py", "seed": str(seed)})
    print("wrote %s (seed %d)" % (os.path.join(out, "gspo_trainer.safetensors"), seed))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
