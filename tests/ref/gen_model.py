"""Whole-model parity reference data for moerl's Qwen3-MoE (HF Qwen3MoeForCausalLM semantics).

Usage: /usr/bin/python3 tests/ref/gen_model.py OUTDIR

Writes
  OUTDIR/model_a/{config.json, model.safetensors}   config A: tied head, one dense MLP layer,
                                                    8 experts top-2, norm_topk_prob false
  OUTDIR/model_b/{config.json, model.safetensors}   config B: Qwen3-30B-A3B shape scaled down,
                                                    head_dim != hidden/heads, 16 experts top-4,
                                                    norm_topk_prob true, untied
  OUTDIR/model_a_ref.safetensors, OUTDIR/model_b_ref.safetensors
      packed batch, logits, target logprobs, losses, top-k expert ids and the gradient of the total
      loss for every parameter; model_b_ref also holds a 10-step AdamW loss trajectory.
  OUTDIR/model_b_score.safetensors
      one sequence with its per-token logprobs and losses: what `moerl score` must print.

The model is tests/ref/qwen3_moe_ref.py (float64 from the exact float32 checkpoint values; see its
docstring for why). Self-checks (finite-difference gradients, loop-over-experts MoE == dense MoE,
checkpoint round trip, aux-loss formula, hand AdamW == torch.optim.AdamW, router top-k margins) run
before anything is written; on any failure the script writes nothing, prints why and exits 1.
Prints "N passed, 0 failed" on success.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
import qwen3_moe_ref as R  # noqa: E402

# Matrices (embeddings, attention, MLP/expert weights, lm_head) ~ normal(0, INIT_STD). 0.1 rather
# than HF's initializer_range 0.02 so every block (attention, experts, dense MLP, head) moves the
# logits measurably at these tiny widths: a bug in any block then fails the parity test.
INIT_STD = 0.1
# Router weights ~ N(0, ROUTER_LOGIT_STD / sqrt(hidden)), so router logits (of an RMS-normalised
# input) have std ~ ROUTER_LOGIT_STD: scaled well above HF's 0.02 init so the router probabilities
# are spread out (top-k is then rarely decided by a near-tie), but not so far that the K-th and
# (K+1)-th probabilities both become tiny (which shrinks their gap again). Measured over 20 seeds:
# 1.5 minimises the fraction of rows with p_(K) - p_(K+1) < 1e-3 for both configurations.
ROUTER_LOGIT_STD = 1.5
# Norm weights ~ 1 + NORM_JITTER * normal(0, 1): around 1 but far enough that a missing or
# misapplied norm weight changes the result.
NORM_JITTER = 0.2
# Minimum allowed p_(K) - p_(K+1) over every token and MoE layer (and over every step of the
# AdamW trajectory). fp32 router probabilities carry ~1e-7 error, so 1e-4 leaves a 1000x margin.
GAP_MIN = 1e-4
MAX_RESEEDS = 200

ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
        "clip_max_norm": 1.0, "steps": 10}


def hf_config(v, h, inter, moe_inter, layers, nh, nkv, hd, e, k, norm_topk, tie, theta, coef,
              sparse_step, mlp_only):
    """A complete HF Qwen3MoeConfig dict (config.json field names)."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": v, "hidden_size": h, "intermediate_size": inter,
        "moe_intermediate_size": moe_inter, "num_hidden_layers": layers,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
        "hidden_act": "silu", "max_position_embeddings": 128, "initializer_range": 0.02,
        "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": tie,
        "rope_theta": theta, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": layers, "decoder_sparse_step": sparse_step,
        "num_experts": e, "num_experts_per_tok": k, "norm_topk_prob": norm_topk,
        "output_router_logits": False, "router_aux_loss_coef": coef,
        "mlp_only_layers": mlp_only, "bos_token_id": v - 2, "eos_token_id": v - 1,
        "torch_dtype": "float32",
    }


CONFIG_A = hf_config(v=97, h=48, inter=40, moe_inter=24, layers=3, nh=4, nkv=2, hd=12, e=8, k=2,
                     norm_topk=False, tie=True, theta=10000.0, coef=0.01, sparse_step=1,
                     mlp_only=[1])
CONFIG_B = hf_config(v=131, h=64, inter=96, moe_inter=32, layers=2, nh=8, nkv=2, hd=16, e=16, k=4,
                     norm_topk=True, tie=False, theta=1e6, coef=0.001, sparse_step=1, mlp_only=[])

LENGTHS_A = [5, 17, 30, 9]
LENGTHS_B = [11, 24, 6]
SCORE_LEN_B = 19
# First seed tried per model; build() reseeds upward until every top-k margin exceeds GAP_MIN.
# For B the margin must hold at all 10 AdamW states, which only ~1 seed in 100 meets (the router
# moves ~lr * |x|_1 ~ 0.05 in logit space per step, so experts K and K+1 swap often); 2094 is the
# first seed from 2000 that passes, used as the start so the script does not spend ~25 s reseeding.
BASE_SEED = {"a": 1000, "b": 2094}


class Checks:
    """Counts named self-checks; failures are collected with their reason."""

    def __init__(self):
        self.passed, self.failed = 0, []

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed.append("%s: %s" % (name, detail))
            print("FAIL %s: %s" % (name, detail), flush=True)


# ----------------------------------------------------------------------------------------------
# random model and batch
# ----------------------------------------------------------------------------------------------

def init_params(cfg, gen):
    """float32 parameters in param_shapes order: norms ~ 1 + NORM_JITTER*N(0,1), router ~
    N(0, ROUTER_LOGIT_STD / sqrt(hidden)), every other matrix ~ N(0, INIT_STD)."""
    out = {}
    router_std = ROUTER_LOGIT_STD / math.sqrt(cfg.hidden_size)
    for name, shape in R.param_shapes(cfg):
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            out[name] = 1.0 + NORM_JITTER * z
        elif name.endswith("mlp.gate.weight"):
            out[name] = router_std * z
        else:
            out[name] = INIT_STD * z
    return out


def make_batch(cfg, gen, lengths):
    """Packed batch: random tokens; targets = next token within each sequence, -1 at its last
    token; loss_mask = 0 on a random prompt prefix (1..L//2 tokens) and on the last token, else 1."""
    toks, tgts, masks, cu = [], [], [], [0]
    for L in lengths:
        t = torch.randint(0, cfg.vocab_size, (L,), generator=gen, dtype=torch.int64)
        tg = torch.cat([t[1:], torch.tensor([-1])])
        m = torch.ones(L, dtype=torch.float32)
        prompt = int(torch.randint(1, max(1, L // 2) + 1, (1,), generator=gen))
        m[:prompt] = 0
        m[-1] = 0
        toks.append(t), tgts.append(tg), masks.append(m)
        cu.append(cu[-1] + L)
    return {"tokens": torch.cat(toks).to(torch.int32), "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "targets": torch.cat(tgts).to(torch.int32), "loss_mask": torch.cat(masks)}


def loss_and_grads(p64, cfg, batch):
    """Reference loss dict and d(loss)/d(param) for every parameter (autograd, float64)."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in p64.items()}
    out = R.packed_loss(leaves, cfg, batch["tokens"], batch["cu_seqlens"], batch["targets"],
                        batch["loss_mask"])
    names = list(leaves)
    gs = torch.autograd.grad(out["loss"], [leaves[n] for n in names], allow_unused=True)
    grads = {n: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(names, gs)}
    return out, grads


def loss_only(p64, cfg, batch, moe_fn=R.moe_block):
    with torch.no_grad():
        return R.packed_loss(p64, cfg, batch["tokens"], batch["cu_seqlens"], batch["targets"],
                             batch["loss_mask"], moe_fn)


def adam_trajectory(p64, cfg, batch, use_torch_optim=False, stop_gap=0.0):
    """ADAM["steps"] steps of AdamW with global grad-norm clipping on the same batch, float64.
    loss[i] is recorded before step i. Weight decay on every parameter with ndim >= 2 (not on 1-D
    norm weights). Returns (losses [steps], pre-clip grad norms [steps], min top-k gap seen); stops
    early (returning the gap) as soon as a state's top-k gap is <= stop_gap."""
    names = list(p64)
    params = [p64[n].detach().clone() for n in names]
    decay = [x.dim() >= 2 for x in params]
    state = [[torch.zeros_like(x), torch.zeros_like(x)] for x in params]
    opt = None
    if use_torch_optim:
        params = [x.requires_grad_(True) for x in params]
        groups = [{"params": [x for x, d in zip(params, decay) if d], "weight_decay": ADAM["weight_decay"]},
                  {"params": [x for x, d in zip(params, decay) if not d], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]),
                                eps=ADAM["eps"], foreach=False)
    losses, norms, gap = [], [], math.inf
    for step in range(1, ADAM["steps"] + 1):
        cur = dict(zip(names, [x.detach() for x in params]))
        out, grads = loss_and_grads(cur, cfg, batch)
        losses.append(float(out["loss"]))
        gap = min(gap, R.topk_gap(out["router_logits"].values(), cfg.num_experts_per_tok))
        if gap <= stop_gap:
            return losses, norms, gap
        g = [grads[n].detach().clone() for n in names]
        if opt is None:
            norms.append(R.clip_grad_norm(g, ADAM["clip_max_norm"]))
            R.adamw_step(params, g, state, step, ADAM["lr"], (ADAM["beta1"], ADAM["beta2"]),
                         ADAM["eps"], ADAM["weight_decay"], decay)
        else:
            for x, gi in zip(params, g):
                x.grad = gi
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, ADAM["clip_max_norm"])))
            opt.step()
    return losses, norms, gap


def build(tag, cfg_dict, lengths, with_adam, score_len):
    """Reseed until every router top-k margin (batch, score sequence, AdamW trajectory) exceeds
    GAP_MIN. Returns everything the checks and the writer need, or raises RuntimeError."""
    cfg = R.Qwen3MoeConfig(cfg_dict)
    for attempt in range(MAX_RESEEDS):
        seed = BASE_SEED[tag] + attempt
        gen = torch.Generator().manual_seed(seed)
        params32 = init_params(cfg, gen)
        batch = make_batch(cfg, gen, lengths)
        score_tokens = (torch.randint(0, cfg.vocab_size, (score_len,), generator=gen).to(torch.int32)
                        if score_len else None)
        p64 = R.to_float64(params32)
        fwd = loss_only(p64, cfg, batch)
        gap = R.topk_gap(fwd["router_logits"].values(), cfg.num_experts_per_tok)
        if gap <= GAP_MIN:
            continue
        score = None
        if score_tokens is not None:
            with torch.no_grad():
                lg, rl, _ = R.forward_sequence(p64, cfg, score_tokens)
            gap = min(gap, R.topk_gap(rl.values(), cfg.num_experts_per_tok))
            if gap <= GAP_MIN:
                continue
            score = {"tokens": score_tokens, "logits": lg, "router_logits": rl}
        adam = None
        if with_adam:
            losses, norms, agap = adam_trajectory(p64, cfg, batch, stop_gap=GAP_MIN)
            if agap <= GAP_MIN:
                continue
            gap = min(gap, agap)
            adam = {"losses": losses, "norms": norms}
        print("%s: seed %d (attempt %d), min top-k probability gap %.3e" % (tag, seed, attempt, gap),
              flush=True)
        return {"tag": tag, "cfg": cfg, "cfg_dict": cfg_dict, "seed": seed, "params32": params32,
                "p64": p64, "batch": batch, "score": score, "adam": adam, "gap": gap}
    raise RuntimeError("%s: no seed in %d attempts gives a top-k probability gap > %g"
                       % (tag, MAX_RESEEDS, GAP_MIN))


# ----------------------------------------------------------------------------------------------
# self-checks
# ----------------------------------------------------------------------------------------------

def check_model(m, chk, tmpdir):
    tag, cfg, p64, batch = m["tag"], m["cfg"], m["p64"], m["batch"]
    out, grads = loss_and_grads(p64, cfg, batch)
    m["out"], m["grads"] = out, grads

    chk.check("%s top-k gap > %g" % (tag, GAP_MIN), m["gap"] > GAP_MIN, "gap %.3e" % m["gap"])

    # checkpoint round trip: the file holds exactly the float32 values the reference started from
    path = os.path.join(tmpdir, "roundtrip_%s.safetensors" % tag)
    st_io.save(m["params32"], path)
    back = st_io.load(path)
    os.remove(path)
    same = (list(back) == list(m["params32"]) and
            all(back[k].dtype == torch.float32 and torch.equal(back[k], v)
                for k, v in m["params32"].items()) and
            all(torch.equal(p64[k], v.double()) for k, v in m["params32"].items()))
    chk.check("%s float32 checkpoint round trip is bit-exact" % tag, same)

    # loop-over-experts MoE (HF) == dense all-experts MoE with a scattered top-k weight matrix
    dense = loss_only(p64, cfg, batch, moe_fn=R.moe_block_dense)
    for l in cfg.moe_layers():
        same_ids = torch.equal(out["topk_ids"][l], dense["topk_ids"][l])
        chk.check("%s layer %d top-k ids loop == dense" % (tag, l), same_ids)
    # both are exact float64 sums of the same terms in a different order: ~1e-16 relative
    d = float((out["logits"].detach() - dense["logits"]).abs().max())
    scale = float(dense["logits"].abs().max())
    chk.check("%s MoE loop-over-experts == dense formulation (logits)" % tag,
              d <= 1e-12 * max(1.0, scale), "max |diff| %.3e" % d)
    d = abs(float(out["loss"]) - float(dense["loss"]))
    chk.check("%s MoE loop-over-experts == dense formulation (loss)" % tag, d <= 1e-12,
              "|diff| %.3e" % d)

    # aux loss: HF one-hot formulation == count formula of moe_aux_loss (src/kernels/kernels.h)
    rl = [out["router_logits"][l].detach() for l in sorted(out["router_logits"])]
    allr = torch.cat(rl)
    P = torch.softmax(allr, -1)
    counts = torch.zeros(cfg.num_experts, dtype=torch.float64)
    for l in sorted(out["topk_ids"]):
        counts += torch.bincount(out["topk_ids"][l].reshape(-1), minlength=cfg.num_experts).double()
    aux2 = cfg.num_experts * float((counts / allr.shape[0] * P.mean(0)).sum())
    # same float64 quantities summed in another order: agreement to ~1e-15; 1e-12 absolute on O(k)
    chk.check("%s aux loss == E * sum_e f_e * mean P_e" % tag,
              abs(aux2 - float(out["aux"])) <= 1e-12, "%r vs %r" % (aux2, float(out["aux"])))

    # gradients vs central finite differences on a few entries (float64). h = 1e-5: truncation
    # error ~ h^2 |f'''| ~ 1e-10 and rounding ~ 1e-16 * |loss| / h ~ 1e-10; top-k cannot flip since
    # the probability margin (> 1e-4) is far larger than the perturbation of the router logits.
    gen = torch.Generator().manual_seed(7 + (0 if tag == "a" else 1))
    moe_l = cfg.moe_layers()[0]
    pick = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_norm.weight", "model.layers.0.self_attn.v_proj.weight",
            "model.layers.%d.mlp.gate.weight" % moe_l, "model.norm.weight",
            "model.layers.%d.input_layernorm.weight" % (cfg.num_hidden_layers - 1)]
    # the expert with the largest gradient in the first MoE layer (an expert that was routed to)
    best = max(range(cfg.num_experts), key=lambda e: float(
        grads["model.layers.%d.mlp.experts.%d.down_proj.weight" % (moe_l, e)].abs().max()))
    pick += ["model.layers.%d.mlp.experts.%d.%s.weight" % (moe_l, best, w)
             for w in ("gate_proj", "up_proj", "down_proj")]
    dense_l = [l for l in range(cfg.num_hidden_layers) if not cfg.is_moe_layer(l)]
    if dense_l:
        pick.append("model.layers.%d.mlp.down_proj.weight" % dense_l[0])
    if not cfg.tie_word_embeddings:
        pick.append("lm_head.weight")
    h = 1e-5
    for name in pick:
        g = grads[name].reshape(-1)
        big = torch.nonzero(g.abs() >= 0.1 * g.abs().max()).reshape(-1)
        i = int(big[int(torch.randint(0, len(big), (1,), generator=gen))])
        vals = []
        for sgn in (1, -1):
            q = dict(p64)
            t = p64[name].clone()
            t.view(-1)[i] += sgn * h
            q[name] = t
            vals.append(float(loss_only(q, cfg, batch)["loss"]))
        fd = (vals[0] - vals[1]) / (2 * h)
        an = float(g[i])
        # tolerance: 1e-8 absolute (FD rounding/truncation above) + 1e-6 relative
        chk.check("%s finite-difference grad %s[%d]" % (tag, name, i),
                  abs(fd - an) <= 1e-8 + 1e-6 * abs(an), "fd %.10e autograd %.10e" % (fd, an))


def check_adam(m, chk):
    """Hand-written AdamW + clipping (what the C side mirrors) == torch.optim.AdamW +
    torch.nn.utils.clip_grad_norm_, both float64: same formula, so only rounding differs."""
    losses_t, norms_t, _ = adam_trajectory(m["p64"], m["cfg"], m["batch"], use_torch_optim=True)
    # float64 throughout and the same formula: differences are rounding (~1e-15); 1e-12 absolute
    # on losses of O(1) and 1e-12 relative on the grad norms
    dl = max(abs(a - b) for a, b in zip(losses_t, m["adam"]["losses"]))
    dn = max(abs(a - b) / b for a, b in zip(norms_t, m["adam"]["norms"]))
    chk.check("%s AdamW trajectory == torch.optim.AdamW" % m["tag"], dl <= 1e-12 and dn <= 1e-12,
              "max |dloss| %.3e, max rel |dnorm| %.3e" % (dl, dn))
    lo = m["adam"]["losses"]
    chk.check("%s AdamW trajectory decreases the loss" % m["tag"], lo[-1] < lo[0],
              "losses %r" % lo)


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------

def atomic_save(tensors, path, metadata):
    st_io.save(tensors, path + ".tmp", metadata)
    os.replace(path + ".tmp", path)


def write_model(m, outdir):
    d = os.path.join(outdir, "model_%s" % m["tag"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json.tmp"), "w") as f:
        json.dump(m["cfg_dict"], f, indent=2)
        f.write("\n")
    os.replace(os.path.join(d, "config.json.tmp"), os.path.join(d, "config.json"))
    atomic_save(m["params32"], os.path.join(d, "model.safetensors"), {"format": "pt"})


def common_meta(m):
    return {"generator": "tests/ref/gen_model.py", "model": "model_%s" % m["tag"],
            "seed": str(m["seed"]), "precision": "reference computed in float64 from the float32 checkpoint",
            "init": "matrices N(0,%g), router N(0,%g/sqrt(hidden)), norms 1+%g*N(0,1)"
                    % (INIT_STD, ROUTER_LOGIT_STD, NORM_JITTER),
            "min_topk_prob_gap": "%.6e" % m["gap"]}


def write_ref(m, outdir):
    cfg, b, out = m["cfg"], m["batch"], m["out"]
    f32 = lambda x: x.detach().to(torch.float32).contiguous()  # noqa: E731
    t = {"tokens": b["tokens"], "cu_seqlens": b["cu_seqlens"], "targets": b["targets"],
         "loss_mask": b["loss_mask"], "logits": f32(out["logits"]), "logp": f32(out["logp"]),
         "ce_loss": f32(out["ce"]).reshape(1), "aux_loss": f32(out["aux"]).reshape(1),
         "loss": f32(out["loss"]).reshape(1)}
    for l in cfg.moe_layers():
        t["topk_ids.%d" % l] = out["topk_ids"][l].to(torch.int32).contiguous()
    for l in cfg.moe_layers():
        t["router_logits.%d" % l] = f32(out["router_logits"][l])
    for name, _ in R.param_shapes(cfg):
        t["grad." + name] = f32(m["grads"][name])
    meta = common_meta(m)
    if m["adam"] is not None:
        t["adam_losses"] = torch.tensor(m["adam"]["losses"], dtype=torch.float32)
        t["adam_grad_norms"] = torch.tensor(m["adam"]["norms"], dtype=torch.float32)
        meta.update({"adam_" + k: repr(v) for k, v in ADAM.items()})
        meta["adam_decay_rule"] = "weight decay on parameters with ndim >= 2, not on 1-D norm weights"
        meta["adam_rule"] = ("torch.optim.AdamW (decoupled decay p*=1-lr*wd, bias-corrected) after "
                             "torch.nn.utils.clip_grad_norm_(max_norm) on the global L2 norm; "
                             "adam_losses[i] = loss before step i; adam_grad_norms[i] = pre-clip norm")
    atomic_save(t, os.path.join(outdir, "model_%s_ref.safetensors" % m["tag"]), meta)


def write_score(m, outdir):
    cfg, s = m["cfg"], m["score"]
    tok = s["tokens"]
    lp = R.target_logprobs(s["logits"][:-1], tok[1:].long())
    rl = [s["router_logits"][l] for l in sorted(s["router_logits"])]
    aux = R.load_balancing_loss(rl, cfg.num_experts, cfg.num_experts_per_tok)
    t = {"tokens": tok, "token_logprobs": lp.to(torch.float32),
         "ce_loss": (-lp.mean()).to(torch.float32).reshape(1),
         "aux_loss": aux.to(torch.float32).reshape(1)}
    meta = common_meta(m)
    meta["definition"] = ("token_logprobs[t] = log p(tokens[t+1] | tokens[0..t]); ce_loss = "
                          "-mean(token_logprobs); aux_loss = HF load_balancing_loss_func over all "
                          "T tokens of every MoE layer")
    atomic_save(t, os.path.join(outdir, "model_%s_score.safetensors" % m["tag"]), meta)


OUTPUTS = ["model_a/config.json", "model_a/model.safetensors", "model_b/config.json",
           "model_b/model.safetensors", "model_a_ref.safetensors", "model_b_ref.safetensors",
           "model_b_score.safetensors"]


def main():
    if len(sys.argv) != 2:
        print("usage: gen_model.py OUTDIR", file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    for rel in OUTPUTS:  # never leave stale reference data behind if this run fails
        path = os.path.join(outdir, rel)
        if os.path.exists(path):
            os.remove(path)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    chk = Checks()
    try:
        ma = build("a", CONFIG_A, LENGTHS_A, with_adam=False, score_len=0)
        mb = build("b", CONFIG_B, LENGTHS_B, with_adam=True, score_len=SCORE_LEN_B)
    except RuntimeError as e:
        print("FAIL %s" % e)
        print("0 passed, 1 failed")
        return 1
    for m in (ma, mb):
        check_model(m, chk, outdir)
    check_adam(mb, chk)
    if chk.failed:
        print("self-checks failed, nothing written:")
        for f in chk.failed:
            print("  " + f)
        print("%d passed, %d failed" % (chk.passed, len(chk.failed)))
        return 1
    for m in (ma, mb):
        write_model(m, outdir)
        write_ref(m, outdir)
    write_score(mb, outdir)
    print("%d passed, 0 failed" % chk.passed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
