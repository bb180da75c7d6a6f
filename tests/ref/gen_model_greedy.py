"""Greedy generation reference for the rollout engine: for model_a and model_b (written by
gen_model.py into OUTDIR, which run.sh runs first), 4 prompts each, 20 greedy tokens computed
with the float64 reference model by re-running the whole sequence each step (no KV cache, the
most literal definition). Prompts are chosen so that every step's top-1/top-2 logit gap exceeds
1e-3, far above fp32 error, so the C engine must match token for token.
Writes OUTDIR/greedy_{a,b}.safetensors: prompt.{i} (I32), greedy.{i} (I32)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
import qwen3_moe_ref as R  # noqa: E402

NEW_TOKENS = 20
MIN_GAP = 1e-3


def greedy(p64, cfg, prompt):
    seq = list(prompt)
    min_gap = float("inf")
    for _ in range(NEW_TOKENS):
        logits, _, _ = R.forward_sequence(p64, cfg, torch.tensor(seq, dtype=torch.int64))
        top2 = torch.topk(logits[-1], 2).values
        min_gap = min(min_gap, float(top2[0] - top2[1]))
        seq.append(int(torch.argmax(logits[-1])))
    return seq[len(prompt):], min_gap


def main():
    outdir = sys.argv[1]
    torch.set_num_threads(min(2, torch.get_num_threads()))
    passed = failed = 0
    for tag in ("a", "b"):
        d = os.path.join(outdir, "model_%s" % tag)
        with open(os.path.join(d, "config.json")) as f:
            cfg = R.Qwen3MoeConfig(json.load(f))
        p64 = R.to_float64(st_io.load(os.path.join(d, "model.safetensors")))
        if cfg.tie_word_embeddings:
            p64.pop("lm_head.weight", None)
        gen = torch.Generator().manual_seed(7)
        out, tries = {}, 0
        while len(out) < 8 and tries < 200:
            tries += 1
            plen = int(torch.randint(1, 12, (1,), generator=gen))
            prompt = torch.randint(0, cfg.vocab_size, (plen,), generator=gen).tolist()
            toks, gap = greedy(p64, cfg, prompt)
            if gap > MIN_GAP:
                i = len(out) // 2
                out["prompt.%d" % i] = torch.tensor(prompt, dtype=torch.int32)
                out["greedy.%d" % i] = torch.tensor(toks, dtype=torch.int32)
        if len(out) == 8:
            passed += 1
            st_io.save(out, os.path.join(outdir, "greedy_%s.safetensors.tmp" % tag))
            os.replace(os.path.join(outdir, "greedy_%s.safetensors.tmp" % tag),
                       os.path.join(outdir, "greedy_%s.safetensors" % tag))
        else:
            failed += 1
            print("FAIL model_%s: found only %d prompts with greedy gaps > %g" % (tag, len(out) // 2, MIN_GAP))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
