"""PyTorch reference for routing replay (actor.router_replay R2/R3; tests/test_router_replay.c).

Usage: /usr/bin/python3 tests/ref/gen_router_replay.py OUTDIR

Writes, for two tiny Qwen3-MoE models ("a": a dense layer between two MoE layers, top-2 of 8,
norm_topk_prob false; "b": two MoE layers, top-4 of 16, norm_topk_prob true):
  OUTDIR/replay_{a,b}/{config.json, model.safetensors}
  OUTDIR/replay_{a,b}_ref.safetensors: the packed batch, the replayed routes
      routes [N, n_moe_layers, K] int32 (-1 on the tokens that keep their native top-k), the
      forward's logits and target logprobs, ce / aux / total loss, the native top-k of every MoE
      layer in the REPLAYED forward (native_ids.{l} [N, K]: what routes_out must hold), and the
      gradient of the total loss for every parameter (router included).

The replayed MoE block (the semantics of verl's router replay and arXiv 2510.11370's rollout routing
replay, written here from their description; nothing is imported from them): the router computes
p = softmax(x W_gate^T) over all E experts as usual; a token with a recorded route uses the recorded
experts ids_r instead of topk(p), with gate weights w_j = p[ids_r[j]] (divided by their sum when
norm_topk_prob), so the router's gradient flows through the probabilities of the replayed experts;
the experts run on the replayed choice. The load-balancing loss is HF load_balancing_loss_func on the
router logits, i.e. its counts come from the router's NATIVE top-k, as verl keeps it.
Everything else is tests/ref/qwen3_moe_ref.py (HF Qwen3MoeForCausalLM in float64 from the exact
float32 weights): the C test's tolerances measure moerl's fp32 error only.

Routes are random distinct experts per (token, MoE layer), not sorted by probability, and about a
fifth of the tokens keep their native routing (-1), so both paths and the slot order are exercised.
Native top-k ids are compared exactly by the C test, so the seed is redrawn until every native
K-th/(K+1)-th router probability gap in the replayed forward exceeds GAP_MIN (as gen_model.py).
Prints "N passed, 0 failed" after its self-checks (finite-difference gradient of the router through
the replayed weights, native-route replay == plain forward); on failure writes nothing and exits 1.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
import qwen3_moe_ref as R  # noqa: E402
import gen_model as G  # noqa: E402

GAP_MIN = 1e-4  # fp32 router probabilities carry ~1e-7 error: a 1000x margin (gen_model.py)
NATIVE_SHARE = 0.2  # tokens whose routes are -1 (the engine's last sampled token, unrecorded prompts)
CONFIGS = {
    "a": (G.hf_config(v=97, h=48, inter=40, moe_inter=24, layers=3, nh=4, nkv=2, hd=12, e=8, k=2,
                      norm_topk=False, tie=True, theta=10000.0, coef=0.01, sparse_step=1, mlp_only=[1]),
          [5, 17, 30, 9], 3000),
    "b": (G.hf_config(v=131, h=64, inter=96, moe_inter=32, layers=2, nh=8, nkv=2, hd=16, e=16, k=4,
                      norm_topk=True, tie=False, theta=1e6, coef=0.01, sparse_step=1, mlp_only=[]),
          [11, 24, 6], 4000),
}


def make_routes(cfg, gen, N):
    """[N, n_moe, K] int64: K distinct random experts (random order) or all -1 (NATIVE_SHARE)."""
    nm, E, K = len(cfg.moe_layers()), cfg.num_experts, cfg.num_experts_per_tok
    out = torch.empty(N, nm, K, dtype=torch.int64)
    for t in range(N):
        for i in range(nm):
            out[t, i] = torch.randperm(E, generator=gen)[:K]
            if float(torch.rand(1, generator=gen)) < NATIVE_SHARE:
                out[t, i] = -1
    return out


def replay_moe_fn(routes, offset):
    """A moe_fn for qwen3_moe_ref.forward_sequence: the replayed Qwen3MoeSparseMoeBlock. routes is
    [N, n_moe, K] of the whole packed batch; offset[0] is the first token of the sequence being run
    (forward_packed runs sequences one by one)."""
    def fn(p, prefix, x, cfg):
        l = int(prefix.split(".")[2])
        mi = cfg.moe_layers().index(l)
        T = x.shape[0]
        r = routes[offset[0]:offset[0] + T, mi]
        logits = x @ p[prefix + "mlp.gate.weight"].t()
        probs = torch.softmax(logits, dim=-1)
        _, native = torch.topk(probs, cfg.num_experts_per_tok, dim=-1)
        use = r[:, 0] >= 0
        ids = torch.where(use[:, None], r, native)
        w = probs.gather(1, ids)
        if cfg.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for t in range(T):
            for j in range(cfg.num_experts_per_tok):
                e = int(ids[t, j])
                out[t] = out[t] + w[t, j] * R.swiglu_mlp(x[t:t + 1], *R.expert_weights(p, prefix, e))[0]
        if l == cfg.moe_layers()[-1]:
            offset[0] += T
        return out, logits, native
    return fn


def replay_loss(p, cfg, batch, routes):
    offset = [0]
    return R.packed_loss(p, cfg, batch["tokens"], batch["cu_seqlens"], batch["targets"], batch["loss_mask"],
                         replay_moe_fn(routes, offset))


def grads_of(p64, cfg, batch, routes):
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in p64.items()}
    out = replay_loss(leaves, cfg, batch, routes)
    names = list(leaves)
    gs = torch.autograd.grad(out["loss"], [leaves[n] for n in names], allow_unused=True)
    return out, {n: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(names, gs)}


def build(tag, checks):
    cfg_dict, lengths, seed = CONFIGS[tag]
    cfg = R.Qwen3MoeConfig(cfg_dict)
    for s in range(seed, seed + G.MAX_RESEEDS):
        gen = torch.Generator().manual_seed(s)
        p32 = G.init_params(cfg, gen)
        batch = G.make_batch(cfg, gen, lengths)
        routes = make_routes(cfg, gen, int(batch["tokens"].numel()))
        p64 = R.to_float64(p32)
        with torch.no_grad():
            out = replay_loss(p64, cfg, batch, routes)
        if R.topk_gap(out["router_logits"].values(), cfg.num_experts_per_tok) > GAP_MIN:
            break
    else:
        raise SystemExit("no seed in %d tries gives top-k gaps > %g" % (G.MAX_RESEEDS, GAP_MIN))
    out, grads = grads_of(p64, cfg, batch, routes)
    # self-check 1: replaying each token's native routes is the plain forward
    with torch.no_grad():
        plain = R.packed_loss(p64, cfg, batch["tokens"], batch["cu_seqlens"], batch["targets"], batch["loss_mask"])
        nat = torch.stack([plain["topk_ids"][l] for l in cfg.moe_layers()], dim=1)
        again = replay_loss(p64, cfg, batch, nat)
    checks.check("%s native replay == forward" % tag, torch.allclose(again["logits"], plain["logits"], atol=1e-12),
                 "max diff %g" % float((again["logits"] - plain["logits"]).abs().max()))
    # self-check 2: the replayed router's gradient (one entry) by central differences
    name = "model.layers.0.mlp.gate.weight"
    g = grads[name]
    i = int(g.abs().argmax())
    h = 1e-6
    pp, pm = dict(p64), dict(p64)
    pp[name] = p64[name].clone().view(-1)
    pp[name][i] += h
    pp[name] = pp[name].view_as(p64[name])
    pm[name] = p64[name].clone().view(-1)
    pm[name][i] -= h
    pm[name] = pm[name].view_as(p64[name])
    with torch.no_grad():
        fd = (replay_loss(pp, cfg, batch, routes)["loss"] - replay_loss(pm, cfg, batch, routes)["loss"]) / (2 * h)
    gi = float(g.view(-1)[i])
    checks.check("%s router finite difference" % tag, abs(float(fd) - gi) <= 1e-6 * max(1.0, abs(gi)),
                 "fd %g autograd %g" % (float(fd), gi))
    # the replay must change something: some replayed route differs from the native one
    diff = int(((routes >= 0) & (routes.sort(-1).values != nat.sort(-1).values)).any(-1).sum())
    checks.check("%s replay differs from native" % tag, diff > 0, "no route differs")
    return {"tag": tag, "cfg": cfg, "cfg_dict": cfg_dict, "seed": s, "params32": p32, "batch": batch,
            "routes": routes, "out": out, "grads": grads}


def write(m, outdir):
    d = os.path.join(outdir, "replay_%s" % m["tag"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(m["cfg_dict"], f, indent=2)
        f.write("\n")
    G.atomic_save(m["params32"], os.path.join(d, "model.safetensors"), {"format": "pt"})
    cfg, b, out = m["cfg"], m["batch"], m["out"]
    f32 = lambda x: x.detach().to(torch.float32).contiguous()  # noqa: E731
    t = {"tokens": b["tokens"], "cu_seqlens": b["cu_seqlens"], "targets": b["targets"],
         "loss_mask": b["loss_mask"], "routes": m["routes"].to(torch.int32).contiguous(),
         "logits": f32(out["logits"]), "logp": f32(out["logp"]), "ce_loss": f32(out["ce"]).reshape(1),
         "aux_loss": f32(out["aux"]).reshape(1), "loss": f32(out["loss"]).reshape(1)}
    for l in cfg.moe_layers():
        t["native_ids.%d" % l] = out["topk_ids"][l].to(torch.int32).contiguous()
    for name, _ in R.param_shapes(cfg):
        t["grad." + name] = f32(m["grads"][name])
    meta = {"generator": "tests/ref/gen_router_replay.py", "seed": str(m["seed"]),
            "precision": "reference computed in float64 from the float32 checkpoint"}
    G.atomic_save(t, os.path.join(outdir, "replay_%s_ref.safetensors" % m["tag"]), meta)


def main():
    if len(sys.argv) != 2:
        print("usage: gen_router_replay.py OUTDIR", file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)
    checks = G.Checks()
    models = [build(tag, checks) for tag in ("a", "b")]
    if checks.failed:
        print("%d passed, %d failed" % (checks.passed, len(checks.failed)))
        return 1
    for m in models:
        write(m, outdir)
    print("%d passed, 0 failed" % checks.passed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
