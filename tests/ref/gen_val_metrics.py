"""Reference values of verl's validation metrics for tests/test_validate.c (src/rl/validate.h).

Usage: /usr/bin/python3 tests/ref/gen_val_metrics.py OUTDIR   → OUTDIR/val_metrics.json

Written from the semantics of verl/trainer/ppo/metric_utils.py (process_validation_metrics,
bootstrap_metric, calc_maj_val) and ray_trainer.py (_validate: val-core / val-aux), not copied:
  per prompt and numeric variable: mean@N = np.mean, std@N = np.std (population; N > 1 only);
  for k in 2, 4, 8, ... < N and N: np.random.seed(42), then 1000 rounds of np.random.choice(N, k)
  (with replacement): best@k = max, worst@k = min, maj@k = the value of the first drawn response of
  the most frequent pred (ties: the pred drawn first; None, no answer, is a vote of its own) — each
  reported as /mean and /std (np.mean, np.std over the rounds); maj when the data_source has preds.
  Averaged over the prompts of a data_source (np.mean over the prompts having the metric).
  val-core: the core variable ("acc" if present, else "reward"), metric mean/maj/best at the largest
  k of that variable; everything else val-aux.
The bootstrap uses numpy's own legacy RandomState, so the C side (which draws the same indices with
its own MT19937) is checked against numpy's generator, not against a copy of itself.

The JSON holds the fixed inputs (so the C test reads exactly what was computed here) and the
expected metrics; plus raw np.random.choice draws after np.random.seed(42) for several N, k.
"""
import json
import os
import sys
from collections import OrderedDict

import numpy as np

N_BOOT = 1000
SEED = 42


def majority(vals, preds, idx):
    counts = OrderedDict()
    for i in idx:
        counts[preds[i]] = counts.get(preds[i], 0) + 1
    # as verl's max(vote2cnt, key=vote2cnt.get): the first in insertion order (= first drawn) of the top count
    best = max(counts, key=counts.get)
    for i in idx:
        if preds[i] == best:
            return vals[i]


def bootstrap(vals, preds, k):
    np.random.seed(SEED)
    best, worst, maj = [], [], []
    for _ in range(N_BOOT):
        idx = [int(i) for i in np.random.choice(len(vals), size=k, replace=True)]
        sub = [vals[i] for i in idx]
        best.append(np.max(sub))
        worst.append(np.min(sub))
        if preds is not None:
            maj.append(majority(vals, preds, idx))
    out = {"best": (np.mean(best), np.std(best)), "worst": (np.mean(worst), np.std(worst))}
    if preds is not None:
        out["maj"] = (np.mean(maj), np.std(maj))
    return out


def prompt_metrics(vals, preds):
    n = len(vals)
    m = OrderedDict()
    m[f"mean@{n}"] = float(np.mean(vals))
    if n > 1:
        m[f"std@{n}"] = float(np.std(vals))
        ks = []
        k = 2
        while k < n:
            ks.append(k)
            k *= 2
        ks.append(n)
        for k in ks:
            b = bootstrap(vals, preds, k)
            for stat in ("best", "worst", "maj"):
                if stat in b:
                    m[f"{stat}@{k}/mean"] = float(b[stat][0])
                    m[f"{stat}@{k}/std"] = float(b[stat][1])
    return m


def metrics(samples):
    """samples: dicts data_source, uid, score, pred (or None), extra {key: value}."""
    out = OrderedDict()
    sources = list(OrderedDict.fromkeys(s["data_source"] for s in samples))
    for ds in sources:
        mine = [s for s in samples if s["data_source"] == ds]
        variables = ["reward"] + [k for k in mine[0]["extra"] if k not in ("reward", "pred")
                                  and all(k in s["extra"] for s in mine)]
        core = "acc" if "acc" in variables else "reward"
        uids = list(OrderedDict.fromkeys(s["uid"] for s in mine))
        for var in variables:
            per = OrderedDict()
            for uid in uids:
                rs = [s for s in mine if s["uid"] == uid]
                vals = [s["score"] if var == "reward" else s["extra"][var] for s in rs]
                preds = [s["pred"] for s in rs]  # None: no answer, a vote of its own
                if all(s["pred"] is None for s in mine):
                    preds = None
                for name, v in prompt_metrics(vals, preds).items():
                    per.setdefault(name, []).append(v)
            k_max = max(int(name.split("@")[1].split("/")[0]) for name in per)
            for name, lst in per.items():
                k = int(name.split("@")[1].split("/")[0])
                sec = "val-core" if (var == core and k == k_max and name.startswith(("mean", "maj", "best"))) else "val-aux"
                out[f"{sec}/{ds}/{var}/{name}"] = float(np.mean(lst))
    return out


def case_samples(rng, spec):
    """spec: list of (data_source, n_prompts, n_responses, kind, with_pred, extras)."""
    samples = []
    uid = 0
    for ds, n_prompts, n_resp, kind, with_pred, extras in spec:
        for _ in range(n_prompts):
            for _ in range(n_resp):
                if kind == "binary":
                    score = float(rng.integers(0, 2))
                elif kind == "const":
                    score = 0.75
                else:
                    score = float(np.round(rng.uniform(-1, 2), 6))
                pred = None
                if with_pred:
                    pred = str(int(rng.integers(0, 3)))
                ex = OrderedDict()
                for e in extras:
                    ex[e] = float(rng.integers(0, 2)) if e == "acc" else float(np.round(rng.normal(), 6))
                samples.append({"data_source": ds, "uid": uid, "score": score, "pred": pred, "extra": ex})
            uid += 1
    return samples


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(7)  # the inputs only; the bootstrap uses np.random's legacy generator
    cases = OrderedDict()
    cases["greedy"] = [("arith", 7, 1, "binary", True, [])]
    cases["n4"] = [("arith", 5, 4, "binary", True, [])]
    cases["n5_two_sources"] = [("countdown", 3, 5, "real", True, []), ("openai/gsm8k", 2, 5, "binary", False, [])]
    cases["n16"] = [("arith", 2, 16, "real", True, [])]
    cases["acc_extra"] = [("mine", 3, 3, "real", True, ["acc", "len"])]
    cases["const"] = [("arith", 2, 8, "const", True, [])]
    res = OrderedDict()
    for name, spec in cases.items():
        s = case_samples(rng, spec)
        # a response of prompt 1 of n4 has no pred: it votes "no answer"
        if name == "n4":
            s[5]["pred"] = None
        res[name] = {"samples": s, "metrics": metrics(s)}
    # the responses of prompts and data_sources interleaved (grouping by data_source, then uid, each in
    # order of first appearance), and a uid shared by two data_sources (two prompts)
    s = [dict(x) for x in res["n5_two_sources"]["samples"]]
    s = [s[i] for i in rng.permutation(len(s))]
    for x in s:
        if x["data_source"] == "openai/gsm8k" and x["uid"] == 3:
            x["uid"] = 0
    res["interleaved"] = {"samples": s, "metrics": metrics(s)}
    # an extra field one response lacks is no variable (verl would refuse lists of unequal length)
    s = [dict(x, extra=dict(x["extra"])) for x in res["acc_extra"]["samples"]]
    del s[4]["extra"]["len"]
    res["partial_extra"] = {"samples": s, "metrics": metrics(s)}
    assert not any("/len/" in k for k in res["partial_extra"]["metrics"])
    draws = []
    for n, k in [(1, 3), (2, 2), (3, 4), (4, 4), (5, 5), (7, 2), (16, 16), (13, 8), (1000, 5)]:
        np.random.seed(SEED)
        draws.append({"n": n, "k": k, "rounds": 20,
                      "idx": [int(i) for _ in range(20) for i in np.random.choice(n, size=k, replace=True)]})
    with open(os.path.join(out_dir, "val_metrics.json"), "w") as f:
        json.dump({"cases": res, "draws": draws, "n_bootstrap": N_BOOT, "seed": SEED}, f)
    n_metrics = sum(len(c["metrics"]) for c in res.values())
    print(f"wrote {out_dir}/val_metrics.json: {len(res)} cases, {n_metrics} metrics, {len(draws)} draw sequences")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
