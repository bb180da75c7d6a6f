"""Qwen3-MoE causal LM written from scratch in PyTorch: the whole-model parity reference for moerl.

Semantics follow Hugging Face transformers `Qwen3MoeForCausalLM`
(transformers/models/qwen3_moe/modeling_qwen3_moe.py, model_type "qwen3_moe").
Nothing here imports transformers; every formula is re-derived and each
function names the HF class or function whose formula it follows.

Precision: all reference arithmetic is float64. The checkpoint is stored in float32 and the
reference starts from those exact float32 values (`to_float64` widens them losslessly); float64 keeps
the reference's own rounding error (~1e-16 relative) negligible next to the fp32 C code's (~1e-7), so
any mismatch a parity test sees is the C code's. Where HF upcasts to fp32 (RMSNorm statistics, the
attention softmax, the router softmax) float64 is at least as precise, so the ordering of operations
is kept but no narrowing is done.

Parameters: a dict keyed by HF tensor names ("model.layers.{l}.mlp.experts.{e}.gate_proj.weight",
...). With tie_word_embeddings there is no "lm_head.weight" entry; the head is the embedding.
Linear weights are [out, in] and applied as x @ W^T (torch.nn.Linear without bias).

Packed batch: a flat token vector plus cu_seqlens (B+1 offsets). Each sequence runs through the model
separately with positions restarting at 0; token outputs are concatenated in batch order. The
load-balancing loss sees the router logits of every sequence and every MoE layer concatenated.
"""
import math

import torch
import torch.nn.functional as F


# ----------------------------------------------------------------------------------------------
# configuration and parameter table
# ----------------------------------------------------------------------------------------------

class Qwen3MoeConfig:
    """The config.json fields the forward pass reads (HF `Qwen3MoeConfig` names and defaults).

    head_dim is read from the config (Qwen3: may differ from hidden_size // num_attention_heads);
    it defaults to hidden_size // num_attention_heads only when absent, as HF does.
    """

    def __init__(self, d):
        self.raw = dict(d)
        if d.get("model_type") != "qwen3_moe":
            raise ValueError("config: model_type is %r, expected 'qwen3_moe'" % d.get("model_type"))
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.intermediate_size = int(d["intermediate_size"])
        self.moe_intermediate_size = int(d["moe_intermediate_size"])
        self.num_hidden_layers = int(d["num_hidden_layers"])
        self.num_attention_heads = int(d["num_attention_heads"])
        self.num_key_value_heads = int(d["num_key_value_heads"])
        self.head_dim = int(d.get("head_dim") or self.hidden_size // self.num_attention_heads)
        self.num_experts = int(d["num_experts"])
        self.num_experts_per_tok = int(d["num_experts_per_tok"])
        self.decoder_sparse_step = int(d.get("decoder_sparse_step", 1))
        self.mlp_only_layers = list(d.get("mlp_only_layers", []))
        self.norm_topk_prob = bool(d.get("norm_topk_prob", False))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        self.rope_theta = float(d.get("rope_theta", 10000.0))
        self.rms_norm_eps = float(d.get("rms_norm_eps", 1e-6))
        self.router_aux_loss_coef = float(d.get("router_aux_loss_coef", 0.001))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("config: num_attention_heads %d is not a multiple of num_key_value_heads %d"
                             % (self.num_attention_heads, self.num_key_value_heads))
        if self.head_dim % 2:
            raise ValueError("config: head_dim %d must be even for RoPE" % self.head_dim)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError("config: num_experts_per_tok %d > num_experts %d"
                             % (self.num_experts_per_tok, self.num_experts))

    def is_moe_layer(self, l):
        """HF Qwen3MoeDecoderLayer.__init__: layer l uses Qwen3MoeSparseMoeBlock iff
        l not in mlp_only_layers and num_experts > 0 and (l + 1) % decoder_sparse_step == 0."""
        return (l not in self.mlp_only_layers and self.num_experts > 0
                and (l + 1) % self.decoder_sparse_step == 0)

    def moe_layers(self):
        return [l for l in range(self.num_hidden_layers) if self.is_moe_layer(l)]


def param_shapes(cfg):
    """Ordered list of (HF name, shape) for every parameter of Qwen3MoeForCausalLM.

    Shapes (Linear weights are [out, in]): embed [V,H]; per layer input/post norms [H];
    q_proj [nh*hd, H]; k_proj, v_proj [nkv*hd, H]; o_proj [H, nh*hd]; q_norm, k_norm [hd];
    MoE layers: mlp.gate [E,H] and per expert gate_proj/up_proj [I,H], down_proj [H,I];
    dense layers: mlp.gate_proj/up_proj [Id,H], mlp.down_proj [H,Id]; model.norm [H];
    lm_head [V,H] only when tie_word_embeddings is false.
    """
    V, H, hd = cfg.vocab_size, cfg.hidden_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    out = [("model.embed_tokens.weight", (V, H))]
    for l in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % l
        out += [(p + "input_layernorm.weight", (H,)),
                (p + "self_attn.q_proj.weight", (nh * hd, H)),
                (p + "self_attn.k_proj.weight", (nkv * hd, H)),
                (p + "self_attn.v_proj.weight", (nkv * hd, H)),
                (p + "self_attn.o_proj.weight", (H, nh * hd)),
                (p + "self_attn.q_norm.weight", (hd,)),
                (p + "self_attn.k_norm.weight", (hd,)),
                (p + "post_attention_layernorm.weight", (H,))]
        if cfg.is_moe_layer(l):
            I = cfg.moe_intermediate_size
            out.append((p + "mlp.gate.weight", (cfg.num_experts, H)))
            for e in range(cfg.num_experts):
                q = p + "mlp.experts.%d." % e
                out += [(q + "gate_proj.weight", (I, H)), (q + "up_proj.weight", (I, H)),
                        (q + "down_proj.weight", (H, I))]
        else:
            Id = cfg.intermediate_size
            out += [(p + "mlp.gate_proj.weight", (Id, H)), (p + "mlp.up_proj.weight", (Id, H)),
                    (p + "mlp.down_proj.weight", (H, Id))]
    out.append(("model.norm.weight", (H,)))
    if not cfg.tie_word_embeddings:
        out.append(("lm_head.weight", (V, H)))
    return out


def to_float64(params32):
    """Widen a dict of float32 tensors to float64 leaf tensors (exact: every fp32 value is an fp64
    value). Raises if an entry is not float32, so the reference cannot start from anything else."""
    out = {}
    for k, v in params32.items():
        if v.dtype != torch.float32:
            raise ValueError("parameter %s has dtype %s, expected float32" % (k, v.dtype))
        out[k] = v.detach().to(torch.float64).clone()
    return out


# ----------------------------------------------------------------------------------------------
# building blocks
# ----------------------------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """HF Qwen3MoeRMSNorm.forward: weight * x / sqrt(mean(x^2, last dim) + eps); no bias, no +1.
    HF computes the statistics in fp32; here in float64. x [..., D], weight [D] -> [..., D]."""
    var = x.pow(2).mean(dim=-1, keepdim=True)
    return weight * (x * torch.rsqrt(var + eps))


def rope_cos_sin(T, head_dim, theta, dtype=torch.float64):
    """HF Qwen3MoeRotaryEmbedding (rope_type "default"): inv_freq[i] = theta^(-2i/d) for i < d/2,
    freqs[t, i] = t * inv_freq[i], emb = cat(freqs, freqs). Returns cos, sin [T, head_dim] for
    positions 0..T-1. (HF evaluates this in fp32; float64 here, a ~1e-7 difference at these
    positions that the C fp32 code also carries.)"""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    pos = torch.arange(T, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    """HF rotate_half (NEOX layout): [-x[..., d/2:], x[..., :d/2]]; element i pairs with i + d/2."""
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """HF apply_rotary_pos_emb: x * cos + rotate_half(x) * sin. x [nheads, T, hd], cos/sin [T, hd]."""
    return x * cos + rotate_half(x) * sin


def attention(p, prefix, x, cfg):
    """HF Qwen3MoeAttention.forward with eager_attention_forward, one sequence, no cache.

    x [T, H] (already input_layernorm'ed) -> [T, H]. q = x Wq^T viewed [T, nh, hd], q_norm per head
    over hd (RMSNorm), then RoPE; same for k with nkv heads; v is not normed. GQA (repeat_kv): query
    head h reads kv head h // (nh / nkv). scores = q k^T * head_dim^-0.5 + causal mask (-inf above
    the diagonal), softmax over keys (HF: fp32), weights @ v, heads concatenated, o_proj.
    """
    T = x.shape[0]
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = (x @ p[prefix + "q_proj.weight"].t()).view(T, nh, hd)
    k = (x @ p[prefix + "k_proj.weight"].t()).view(T, nkv, hd)
    v = (x @ p[prefix + "v_proj.weight"].t()).view(T, nkv, hd)
    q = rms_norm(q, p[prefix + "q_norm.weight"], cfg.rms_norm_eps).transpose(0, 1)  # [nh, T, hd]
    k = rms_norm(k, p[prefix + "k_norm.weight"], cfg.rms_norm_eps).transpose(0, 1)  # [nkv, T, hd]
    v = v.transpose(0, 1)                                                          # [nkv, T, hd]
    cos, sin = rope_cos_sin(T, hd, cfg.rope_theta, x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep = nh // nkv
    k = k.repeat_interleave(rep, dim=0)  # HF repeat_kv: kv head j serves query heads j*rep..j*rep+rep-1
    v = v.repeat_interleave(rep, dim=0)
    scores = (q @ k.transpose(1, 2)) * (hd ** -0.5)                               # [nh, T, T]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    ctx = (probs @ v).transpose(0, 1).reshape(T, nh * hd)
    return ctx @ p[prefix + "o_proj.weight"].t()


def swiglu_mlp(x, gate_w, up_w, down_w):
    """HF Qwen3MoeMLP.forward: down_proj(silu(gate_proj(x)) * up_proj(x)). x [T, H] -> [T, H]."""
    return (F.silu(x @ gate_w.t()) * (x @ up_w.t())) @ down_w.t()


def router(p, prefix, x, cfg):
    """Router of HF Qwen3MoeSparseMoeBlock.forward: logits = gate(x) [T, E]; p = softmax(logits)
    over all E experts (HF: fp32); top-k of p (sorted descending); if norm_topk_prob the k weights
    are divided by their sum. Returns (logits [T,E], topk_weights [T,K], topk_ids [T,K] int64)."""
    logits = x @ p[prefix + "mlp.gate.weight"].t()
    probs = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(probs, cfg.num_experts_per_tok, dim=-1)
    if cfg.norm_topk_prob:
        w = w / w.sum(dim=-1, keepdim=True)
    return logits, w, ids


def expert_weights(p, prefix, e):
    q = prefix + "mlp.experts.%d." % e
    return p[q + "gate_proj.weight"], p[q + "up_proj.weight"], p[q + "down_proj.weight"]


def moe_block(p, prefix, x, cfg):
    """HF Qwen3MoeSparseMoeBlock.forward, loop over experts exactly as HF does it.

    x [T, H] (post_attention_layernorm'ed). For each expert e, the (slot, token) pairs that chose it
    are found from the one-hot mask of topk_ids; the expert runs on those tokens, its output is
    scaled by the routing weight of that slot and index_add'ed into the output.
    Returns (out [T, H], router logits [T, E], topk_ids [T, K])."""
    logits, w, ids = router(p, prefix, x, cfg)
    out = torch.zeros_like(x)
    mask = F.one_hot(ids, num_classes=cfg.num_experts).permute(2, 1, 0)  # [E, K, T]
    for e in range(cfg.num_experts):
        slot, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        y = swiglu_mlp(x[tok], *expert_weights(p, prefix, e)) * w[tok, slot, None]
        out = out.index_add(0, tok, y)
    return out, logits, ids


def moe_block_dense(p, prefix, x, cfg):
    """Dense formulation of the same MoE block, used only as a self-check of `moe_block`:
    every expert runs on every token and the outputs are weighted by a [T, E] matrix that is zero
    except at the top-k ids, where it holds the routing weights (scatter of topk_weights).
    out[t] = sum_e W[t, e] * f_e(x_t)."""
    logits, w, ids = router(p, prefix, x, cfg)
    dense_w = torch.zeros(x.shape[0], cfg.num_experts, dtype=x.dtype).scatter(1, ids, w)
    out = torch.zeros_like(x)
    for e in range(cfg.num_experts):
        out = out + dense_w[:, e:e + 1] * swiglu_mlp(x, *expert_weights(p, prefix, e))
    return out, logits, ids


# ----------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------

def forward_sequence(p, cfg, tokens, moe_fn=moe_block):
    """HF Qwen3MoeModel.forward + Qwen3MoeForCausalLM head for ONE sequence (positions 0..T-1).

    Each Qwen3MoeDecoderLayer: h = x + attn(input_layernorm(x)); h = h + mlp(post_attention_layernorm(h))
    where mlp is the sparse MoE block or the dense SwiGLU MLP (cfg.is_moe_layer). Then model.norm and
    lm_head (or the embedding matrix when tie_word_embeddings).
    tokens: int tensor [T]. Returns (logits [T, V], {l: router logits [T, E]}, {l: topk_ids [T, K]})
    for MoE layers l."""
    h = p["model.embed_tokens.weight"][tokens.long()]
    router_logits, topk_ids = {}, {}
    for l in range(cfg.num_hidden_layers):
        pre = "model.layers.%d." % l
        a = rms_norm(h, p[pre + "input_layernorm.weight"], cfg.rms_norm_eps)
        h = h + attention(p, pre + "self_attn.", a, cfg)
        m = rms_norm(h, p[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        if cfg.is_moe_layer(l):
            y, router_logits[l], topk_ids[l] = moe_fn(p, pre, m, cfg)
        else:
            y = swiglu_mlp(m, p[pre + "mlp.gate_proj.weight"], p[pre + "mlp.up_proj.weight"],
                           p[pre + "mlp.down_proj.weight"])
        h = h + y
    h = rms_norm(h, p["model.norm.weight"], cfg.rms_norm_eps)
    head = p["model.embed_tokens.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
    return h @ head.t(), router_logits, topk_ids


def forward_packed(p, cfg, tokens, cu_seqlens, moe_fn=moe_block):
    """Packed batch: sequence b is tokens[cu_seqlens[b]:cu_seqlens[b+1]], run alone (positions restart
    at 0, no attention across sequences); outputs concatenated in batch order.
    Returns (logits [N, V], {l: router logits [N, E]}, {l: topk_ids [N, K]})."""
    logits, rl, ids = [], {}, {}
    for b in range(len(cu_seqlens) - 1):
        s, e = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        lg, r, i = forward_sequence(p, cfg, tokens[s:e], moe_fn)
        logits.append(lg)
        for l in r:
            rl.setdefault(l, []).append(r[l])
            ids.setdefault(l, []).append(i[l])
    return (torch.cat(logits, 0), {l: torch.cat(v, 0) for l, v in rl.items()},
            {l: torch.cat(v, 0) for l, v in ids.items()})


def load_balancing_loss(router_logits, num_experts, top_k):
    """HF load_balancing_loss_func (attention_mask None) as Qwen3MoeForCausalLM calls it.

    router_logits: list of [N_i, E] (every MoE layer of every sequence), concatenated to [R, E];
    P = softmax(rows); the top-k of P gives a one-hot mask [R, K, E]; tokens_per_expert = mean over
    rows [K, E]; router_prob_per_expert = mean over rows of P [E];
    aux = E * sum(tokens_per_expert * router_prob_per_expert) = E * sum_e f_e * mean_rows(P[:, e])
    with f_e = (top-k selections of e) / R (no division by k: perfect balance gives k).
    Only P carries gradient (the mask is piecewise constant). Returns a scalar tensor."""
    cat = torch.cat(list(router_logits), dim=0)
    probs = torch.softmax(cat, dim=-1)
    _, sel = torch.topk(probs, top_k, dim=-1)
    mask = F.one_hot(sel, num_experts).to(probs.dtype)       # [R, K, E]
    tokens_per_expert = mask.mean(dim=0)                     # [K, E]
    prob_per_expert = probs.mean(dim=0)                      # [E]
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * num_experts


def target_logprobs(logits, targets):
    """logp[t] = log_softmax(logits[t])[targets[t]] (the loss_function of Qwen3MoeForCausalLM is
    cross-entropy on these); 0 where targets[t] < 0. logits [N, V], targets int [N] -> [N]."""
    lsm = torch.log_softmax(logits, dim=-1)
    valid = targets >= 0
    safe = torch.where(valid, targets.long(), torch.zeros_like(targets.long()))
    lp = lsm.gather(1, safe[:, None])[:, 0]
    return torch.where(valid, lp, torch.zeros_like(lp))


def packed_loss(p, cfg, tokens, cu_seqlens, targets, loss_mask, moe_fn=moe_block):
    """Total training loss of a packed batch, as Qwen3MoeForCausalLM.forward combines it:
    ce = sum(mask * -logp) / sum(mask); aux = load_balancing_loss over all MoE layers and all
    sequences; loss = ce + router_aux_loss_coef * aux.
    Returns dict with logits [N,V], logp [N], ce, aux, loss (scalars), router_logits {l: [N,E]},
    topk_ids {l: [N,K]}."""
    logits, rl, ids = forward_packed(p, cfg, tokens, cu_seqlens, moe_fn)
    logp = target_logprobs(logits, targets)
    mask = loss_mask.to(logits.dtype)
    ce = -(mask * logp).sum() / mask.sum()
    layers = sorted(rl)
    aux = (load_balancing_loss([rl[l] for l in layers], cfg.num_experts, cfg.num_experts_per_tok)
           if layers else torch.zeros((), dtype=logits.dtype))
    loss = ce + cfg.router_aux_loss_coef * aux
    return {"logits": logits, "logp": logp, "ce": ce, "aux": aux, "loss": loss,
            "router_logits": rl, "topk_ids": ids}


def topk_gap(router_logits, top_k):
    """Smallest gap p_(K) - p_(K+1) between the K-th and (K+1)-th largest router probability over
    all rows of all given [N, E] logit tensors (inf when K == E). A parity test can only demand that
    C selects the same experts when this is far above fp32 rounding."""
    gap = math.inf
    for lg in router_logits:
        probs = torch.softmax(lg.detach(), dim=-1)
        if top_k >= probs.shape[-1]:
            continue
        s, _ = torch.sort(probs, dim=-1, descending=True)
        gap = min(gap, float((s[:, top_k - 1] - s[:, top_k]).min()))
    return gap


# ----------------------------------------------------------------------------------------------
# optimizer (torch-style AdamW with global grad-norm clipping)
# ----------------------------------------------------------------------------------------------

def clip_grad_norm(grads, max_norm):
    """torch.nn.utils.clip_grad_norm_ (norm_type 2): total = ||(||g_i||_2)_i||_2;
    coef = min(max_norm / (total + 1e-6), 1); every gradient is multiplied by coef (in place).
    Returns the pre-clip total norm (python float)."""
    total = torch.stack([g.norm(2) for g in grads]).norm(2)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return float(total)


def adamw_step(params, grads, state, step, lr, betas, eps, weight_decay, decay):
    """torch.optim.AdamW single-tensor update (torch 1.13 `_single_tensor_adamw`), step counted
    from 1: p *= 1 - lr*wd (only where decay); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).
    params/grads: lists of tensors (updated in place); state: list of [m, v]; decay: list of bool."""
    b1, b2 = betas
    bc1 = 1 - b1 ** step
    bc2 = 1 - b2 ** step
    for x, g, (m, v), d in zip(params, grads, state, decay):
        if d:
            x.mul_(1 - lr * weight_decay)
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
        x.addcdiv_(m, denom, value=-lr / bc1)
