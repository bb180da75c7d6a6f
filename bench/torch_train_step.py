"""torch_train_step — the PyTorch-eager peer of bench/bench_train_step.c: the same Qwen3-MoE and the
same training step, float32 on the CPU, written the way Hugging Face transformers' Qwen3MoE runs it
in eager mode (transformers/models/qwen3_moe/modeling_qwen3_moe.py):

  * a padded batch [B, T] with a 4-D additive causal mask (what HF eager attention does for B
    sequences of equal length), RoPE cos/sin computed once per forward from position ids;
  * Qwen3MoeAttention: q/k/v projections, per-head RMSNorm of q and k, rotate_half RoPE, repeat_kv
    for GQA, softmax(q k^T * hd^-0.5 + mask) in fp32, @ v, o_proj (eager_attention_forward);
  * Qwen3MoeSparseMoeBlock: router softmax in fp32, top-k, renormalised (norm_topk_prob), then a loop
    over the experts that were hit, each taking its tokens with torch.where on the one-hot expert
    mask, running gate/up/down (Qwen3MoeMLP, SiLU), scaling by the routing weight and index_add_-ing
    into the output;
  * the load-balancing aux loss (load_balancing_loss_func over all layers' router logits) times
    router_aux_loss_coef, computed in the model forward as Qwen3MoeForCausalLM does;
  * loss = mean over all tokens of -log_softmax(logits)[target] + coef * aux; loss.backward();
    torch.nn.utils.clip_grad_norm_(max_norm=1.0); torch.optim.AdamW (betas 0.9/0.95, eps 1e-8,
    weight decay 0.01 on matrices only, lr 1e-4); zero_grad.

Phases timed per step: forward (model to logits + aux), logprobs (log_softmax, gather, loss),
backward (loss.backward()), optimizer (clip + AdamW step + zero_grad). Prints the median and min-max
over --reps steps after --warmup untimed ones, and tokens/s of the median step; --json prints one
line with the same fields as bench_train_step --json.

Usage: OPENBLAS_CORETYPE=Haswell /usr/bin/python3 bench/torch_train_step.py [--threads N] [--reps R]
       [--warmup W] [--batch B] [--seqlen T] [--json] [--moe-layer]
Threads: torch.set_num_threads(N) for ATen's OpenMP pool; OpenBLAS (Debian's torch calls its
pthread build for matmuls) reads OPENBLAS_NUM_THREADS, which this script sets to N before torch is
imported unless it is already set (OpenBLAS's own default is all cores).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--moe-layer", action="store_true",
                    help="time one SparseMoeBlock alone, forward + backward (input and weight gradients) on "
                         "batch x seqlen tokens: the peer of bench_moe_ablation's MoE layer")
    a = ap.parse_args()
    if a.threads < 1 or a.reps < 1 or a.warmup < 0 or a.batch < 1 or a.seqlen < 1:
        ap.error("--threads, --reps, --batch, --seqlen must be >= 1 and --warmup >= 0")
    return a


ARGS = parse_args()
# Before torch loads OpenBLAS: same kernels as moerl (Debian 12's OpenBLAS misdetects this CPU) and
# the same thread count.
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(ARGS.threads))
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The benchmark configuration (same numbers as bench_train_step.c).
CFG = dict(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
           num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
           num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, tie_word_embeddings=False,
           rms_norm_eps=1e-6, rope_theta=1e6, router_aux_loss_coef=0.001, initializer_range=0.02)


class RMSNorm(nn.Module):
    """HF Qwen3MoeRMSNorm: weight * x / sqrt(mean(x^2) + eps), statistics in fp32."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    """HF Qwen3MoeAttention with eager_attention_forward (no cache, no dropout: p = 0)."""

    def __init__(self, c):
        super().__init__()
        H, self.nh, self.nkv, self.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], \
            c["head_dim"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, c["rms_norm_eps"])
        self.scaling = self.hd ** -0.5

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, -1, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, -1, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.hd).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv  # HF repeat_kv: expand + reshape
        k = k[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
        v = v[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        w = F.dropout(w, p=0.0, training=self.training)
        o = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(B, T, -1)
        return self.o_proj(o)


class ExpertMLP(nn.Module):
    """HF Qwen3MoeMLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):
    """HF Qwen3MoeSparseMoeBlock: router, top-k, loop over the experts hit."""

    def __init__(self, c):
        super().__init__()
        self.E, self.K, self.norm_topk = c["num_experts"], c["num_experts_per_tok"], c["norm_topk_prob"]
        self.gate = nn.Linear(c["hidden_size"], self.E, bias=False)
        self.experts = nn.ModuleList(ExpertMLP(c["hidden_size"], c["moe_intermediate_size"]) for _ in range(self.E))

    def forward(self, x):
        B, T, H = x.shape
        x = x.view(-1, H)
        router_logits = self.gate(x)
        rw = F.softmax(router_logits, dim=1, dtype=torch.float)
        rw, sel = torch.topk(rw, self.K, dim=-1)
        if self.norm_topk:
            rw = rw / rw.sum(dim=-1, keepdim=True)
        rw = rw.to(x.dtype)
        out = torch.zeros((B * T, H), dtype=x.dtype)
        expert_mask = F.one_hot(sel, num_classes=self.E).permute(2, 1, 0)  # [E, K, N]
        hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            slot, tok = torch.where(expert_mask[e].squeeze(0))
            y = self.experts[e](x[None, tok].reshape(-1, H)) * rw[tok, slot, None]
            out.index_add_(0, tok, y.to(x.dtype))
        return out.reshape(B, T, H), router_logits


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = SparseMoeBlock(c)

    def forward(self, h, cos, sin, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask)
        y, router_logits = self.mlp(self.post_attention_layernorm(h))
        return h + y, router_logits


def load_balancing_loss(router_logits, E, K):
    """HF load_balancing_loss_func without an attention mask."""
    cat = torch.cat(router_logits, dim=0)
    p = F.softmax(cat, dim=-1)
    _, sel = torch.topk(p, K, dim=-1)
    mask = F.one_hot(sel, E)
    tokens_per_expert = torch.mean(mask.float(), dim=0)
    prob_per_expert = torch.mean(p, dim=0)
    return torch.sum(tokens_per_expert * prob_per_expert.unsqueeze(0)) * E


class Qwen3MoeForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        hd = c["head_dim"]
        self.register_buffer("inv_freq", 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)),
                             persistent=False)
        std = c["initializer_range"]  # HF _init_weights
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                mod.weight.data.normal_(0.0, std)

    def forward(self, tokens):
        B, T = tokens.shape
        h = self.embed_tokens(tokens)
        pos = torch.arange(T).unsqueeze(0).expand(B, T)
        freqs = (self.inv_freq[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((T, T), torch.finfo(h.dtype).min).triu(1)[None, None].expand(B, 1, T, T)
        router_logits = []
        for layer in self.layers:
            h, rl = layer(h, cos, sin, mask)
            router_logits.append(rl)
        logits = self.lm_head(self.norm(h))
        aux = load_balancing_loss(router_logits, self.c["num_experts"], self.c["num_experts_per_tok"])
        return logits, aux


def moe_layer():
    """HF's SparseMoeBlock alone: forward, then backward of sum(out * dout) into x and every weight;
    prints the median of --reps timed passes after --warmup (ms) and, with --json, one JSON line."""
    torch.set_num_threads(ARGS.threads)
    torch.manual_seed(1234)
    c = CFG
    block = SparseMoeBlock(c)
    for p in block.parameters():
        nn.init.normal_(p, std=c["initializer_range"])
    g = torch.Generator().manual_seed(99)
    N, H = ARGS.batch * ARGS.seqlen, c["hidden_size"]
    x = torch.randn(1, N, H, generator=g).requires_grad_(True)
    dout = torch.randn(1, N, H, generator=g)
    times = []
    for r in range(-ARGS.warmup, ARGS.reps):
        t0 = time.perf_counter()
        out, _ = block(x)
        (out * dout).sum().backward()
        dt = time.perf_counter() - t0
        block.zero_grad(set_to_none=True)
        x.grad = None
        if r >= 0:
            times.append(dt)
    med = statistics.median(times)
    if ARGS.json:
        print(json.dumps({"impl": "pytorch", "what": "moe_layer", "threads": ARGS.threads, "tokens": N,
                          "ms_median": round(1e3 * med, 3), "ms_min": round(1e3 * min(times), 3)}))
    else:
        print("torch_train_step --moe-layer: PyTorch %s eager, %d threads, %d tokens, E %d top-%d, I %d: forward + "
              "backward median %.2f ms [min %.2f]" % (torch.__version__, ARGS.threads, N, c["num_experts"],
                                                      c["num_experts_per_tok"], c["moe_intermediate_size"],
                                                      1e3 * med, 1e3 * min(times)))
    return 0


def main():
    if ARGS.moe_layer:
        return moe_layer()
    torch.set_num_threads(ARGS.threads)
    torch.manual_seed(1234)
    c = CFG
    model = Qwen3MoeForCausalLM(c)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    B, T, V = ARGS.batch, ARGS.seqlen, c["vocab_size"]
    N = B * T
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    names = ["forward", "logprobs", "backward", "optimizer", "step"]
    times = {k: [] for k in names}
    first_loss = None
    for r in range(-ARGS.warmup, ARGS.reps):
        t0 = time.perf_counter()
        logits, aux = model(tokens)
        t1 = time.perf_counter()
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]
        loss = -logp.mean() + c["router_aux_loss_coef"] * aux
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if first_loss is None:
            first_loss = float(loss)
        if r >= 0:
            for k, dt in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                times[k].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    nparams = sum(p.numel() for p in model.parameters())
    if ARGS.json:
        out = {"impl": "pytorch", "threads": ARGS.threads, "reps": ARGS.reps, "warmup": ARGS.warmup, "batch": B,
               "seqlen": T, "tokens": N, "params": nparams, "first_loss": round(first_loss, 6),
               "step_ms_median": round(1e3 * med["step"], 3), "step_ms_min": round(1e3 * min(times["step"]), 3),
               "step_ms_max": round(1e3 * max(times["step"]), 3), "tokens_per_s": round(N / med["step"], 1)}
        for k in names[:-1]:
            out[k + "_ms"] = round(1e3 * med[k], 3)
        print(json.dumps(out))
    else:
        print("torch_train_step: PyTorch %s eager, %d threads, batch %d x %d = %d tokens, %d params, %d reps after "
              "%d warm-up, first loss %.4f (ln V = %.4f)" % (torch.__version__, ARGS.threads, B, T, N, nparams,
                                                             ARGS.reps, ARGS.warmup, first_loss, math.log(V)))
        for k in names:
            print("  %-9s median %8.2f ms  [min %8.2f  max %8.2f]" % (k, 1e3 * med[k], 1e3 * min(times[k]),
                                                                     1e3 * max(times[k])))
        print("  tokens/s (median step): %.0f" % (N / med["step"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
