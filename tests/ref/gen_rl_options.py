"""PyTorch reference data for the RL options of src/rl/losses.h (tests/test_rl_options.c).

Usage: /usr/bin/python3 tests/ref/gen_rl_options.py OUTDIR   → OUTDIR/rl_options.safetensors

Formulas written from their public definitions (not copied):
  RLOO                 verl compute_rloo_outcome_advantage: A = r·n/(n−1) − mean·n/(n−1) (n > 1), A = r (n = 1).
  GRPO without std     verl compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False): A = r − mean (n = 1: mean 0).
  REINFORCE++ baseline verl compute_reinforce_plus_plus_baseline_outcome_advantage: s = r − group mean, broadcast
                       over the response tokens, then verl_F.masked_whiten over the batch (mean, unbiased var,
                       (s − mean)·rsqrt(var + 1e-8)).
  loss aggregation     verl core_algos.agg_loss over a padded [B, T] loss matrix and response mask: token-mean
                       Σ/Σmask; seq-mean-token-sum mean_seqs Σ_t; seq-mean-token-mean mean_seqs (Σ_t / len);
                       seq-mean-token-sum-norm Σ_seqs Σ_t / H / B (B = sequences with a loss token).
  rollout IS           verl rollout_correction: token w = min(exp(clamp(old − μ, ±20)), thr); sequence
                       w = min(exp(clamp(Σ_t (old − μ), ±20)), thr).
  overlong penalty     verl DAPO reward manager: expected = L_max − buf, p = min(−(len − expected)/buf·f, 0).
All in float64 from stored float32 inputs.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

D = torch.float64


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    T = {}
    # ---- advantages: groups of sizes 1, 2, 5, 8, 3, 8 with rewards in {0, 0.5, 1} and some noise
    sizes = [1, 2, 5, 8, 3, 8]
    R = sum(sizes)
    rewards = (torch.randint(0, 3, (R,), generator=g).to(torch.float32) * 0.5 +
               (torch.rand(R, generator=g) < 0.3).to(torch.float32) * torch.randn(R, generator=g).to(torch.float32))
    resp_len = torch.randint(1, 40, (R,), generator=g).to(torch.int32)
    r = rewards.to(D)
    rloo, nostd, base = torch.zeros(R, dtype=D), torch.zeros(R, dtype=D), torch.zeros(R, dtype=D)
    off = 0
    for n in sizes:
        x = r[off:off + n]
        m = x.mean() if n > 1 else torch.tensor(0.0, dtype=D)
        nostd[off:off + n] = x - m
        base[off:off + n] = x - m
        rloo[off:off + n] = (x * n / (n - 1) - x.mean() * n / (n - 1)) if n > 1 else x
        off += n
    # whitening over the response tokens (each response's value repeated len times)
    tok = torch.repeat_interleave(base, resp_len.to(torch.int64))
    mean = tok.mean()
    var = ((tok - mean) ** 2).mean() * tok.numel() / (tok.numel() - 1)
    rpp = (base - mean) * torch.rsqrt(var + 1e-8)
    T["adv_sizes"] = torch.tensor(sizes, dtype=torch.int32)
    T["adv_rewards"] = rewards
    T["adv_resp_len"] = resp_len
    T["adv_rloo"] = rloo.float()
    T["adv_grpo_nostd"] = nostd.float()
    T["adv_rpp"] = rpp.float()
    # ---- aggregation: B sequences, padded to Tmax, lengths 1..Tmax (and one empty, masked out)
    B, Tm = 7, 12
    L = torch.randn(B, Tm, generator=g).to(torch.float32)
    lens = torch.tensor([12, 3, 1, 7, 0, 10, 5], dtype=torch.int32)
    mask = (torch.arange(Tm)[None, :] < lens[:, None].to(torch.int64)).to(D)
    Ld = L.to(D)
    H = 16.0
    nseq = (lens > 0).sum().item()
    agg = [
        (Ld * mask).sum() / mask.sum(),
        (Ld * mask).sum(-1).sum() / nseq,
        sum(((Ld[i] * mask[i]).sum() / mask[i].sum()) for i in range(B) if lens[i] > 0) / nseq,
        (Ld * mask).sum(-1).sum() / H / nseq,
    ]
    T["agg_loss"] = L
    T["agg_lens"] = lens
    T["agg_H"] = torch.tensor([H], dtype=torch.float32)
    T["agg_ref"] = torch.tensor([a.item() for a in agg], dtype=torch.float64).float()
    # ---- rollout IS: one sequence per row, 9 tokens, log-ratios mixing small, large, clamp
    n = 9
    old = (torch.rand(4, n, generator=g) * -4.0 - 0.1).to(torch.float32)
    mu = (old.to(D) - torch.randn(4, n, generator=g, dtype=D) * 0.8).to(torch.float32)
    mu[3, 2] = old[3, 2] - 25.0  # beyond the ±20 clamp
    x = (old.to(D) - mu.to(D))
    thr = 2.0
    tokw = torch.clamp(torch.exp(torch.clamp(x, -20, 20)), max=thr)
    seqw = torch.clamp(torch.exp(torch.clamp(x.sum(-1, keepdim=True), -20, 20)), max=thr).expand(4, n)
    T["is_old"] = old
    T["is_mu"] = mu
    T["is_token"] = tokw.float()
    T["is_sequence"] = seqw.contiguous().float()
    # ---- overlong penalty: L_max 20, buffer 8, factor 1.5
    lens2 = torch.arange(0, 21, dtype=torch.int32)
    expected = 20 - 8
    pen = torch.clamp(-(lens2.to(D) - expected) / 8 * 1.5, max=0.0)
    T["ol_lens"] = lens2
    T["ol_pen"] = pen.float()
    st_io.save(T, os.path.join(out, "rl_options.safetensors"))
    print("wrote", os.path.join(out, "rl_options.safetensors"))
    print("1 passed, 0 failed")  # the count tests/run.sh requires of every step


if __name__ == "__main__":
    main()
