"""Llama in plain PyTorch, written from the semantics of Hugging Face's
LlamaForCausalLM (modeling_llama.py, eager attention), not from tp-train's
code: token embedding; pre-norm blocks of RMSNorm (variance in fp32, x *
rsqrt(mean(x^2) + eps), times the weight), attention with q/k/v projections
without biases, rotary embeddings in HF's rotate-half convention (with Llama
3's frequency scaling when configured), grouped-query attention by repeat_kv
(query head h reads KV head h // (H / K)), causal softmax in fp32 with
1/sqrt(head_dim) scaling, o_proj without bias; the SwiGLU MLP
down(silu(gate(x)) * up(x)); a final RMSNorm; lm_head tied to the embedding
or untied.

The parameters are tp-train's tensors as its checkpoint lays them out, so
that gradients compare per tensor: q_proj, k_proj and v_proj are one fused
weight [(H + 2K) * hd, D] (rows: the q heads, the k heads, the v heads)
split after the product, and gate_proj and up_proj one fused weight [2F, D]
(rows: gate, up) chunked after it. A product with a stacked weight is the
stack of the products, so the computation is HF's.

tests/trainer/test_llama_ref.py checks this model against Meta's original
formulation (complex rotary embeddings on permuted weights), explicit
expansion of the KV heads, known RMSNorm values and hand-computed Llama 3
frequencies.

Its products go through mixed_precision.linear (plain F.linear unless
mixed_precision.bf16_operands() is on), its attention through
mixed_precision.attention (the plain one here unless that is on)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mixed_precision import Linear, attention, bf16_gradient, bf16_value, linear


class RMSNorm(nn.Module):
    """LlamaRMSNorm: the variance in fp32, the weight applied after the cast back."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def default_inv_freq(head_dim, theta):
    """HF's _compute_default_rope_parameters: 1 / theta^(2i / hd), i < hd / 2, in fp32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """HF's _compute_llama3_parameters: wavelengths longer than original / low
    are divided by factor, shorter than original / high kept, and those
    between interpolated smoothly."""
    old_context_len = original_max_position_embeddings
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_inv_freq(head_dim, theta, scaling=None):
    """The rotary inverse frequencies [hd / 2] of a configuration; scaling is
    the "rope_scaling" object of Llama 3 (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings) or None."""
    inv_freq = default_inv_freq(head_dim, theta)
    if scaling:
        inv_freq = llama3_inv_freq(inv_freq, float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                   float(scaling["high_freq_factor"]),
                                   int(scaling["original_max_position_embeddings"]))
    return inv_freq


def rope_cos_sin(inv_freq, positions):
    """LlamaRotaryEmbedding.forward: angles position * inv_freq in fp32,
    emb = cat(freqs, freqs); cos and sin [T, hd] (attention scaling 1)."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    """cat(-x2, x1) of the two halves of the last dimension."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    """q, k [B, heads, T, hd]; cos, sin [T, hd]."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x, n_rep):
    """[B, K, T, hd] -> [B, K * n_rep, T, hd], KV head j serving query heads j * n_rep .. (j + 1) * n_rep - 1."""
    B, K, T, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, K, n_rep, T, hd).reshape(B, K * n_rep, T, hd)


class Attention(nn.Module):
    """LlamaAttention (eager), q_proj/k_proj/v_proj fused as qkv [(H + 2K) * hd, D]."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        if dim % heads or heads % kv_heads:
            raise ValueError(f"dim {dim}, heads {heads}, kv_heads {kv_heads}: not divisible")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.qkv = Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        H, K, hd = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv(x).split([H * hd, K * hd, K * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, K, hd).transpose(1, 2)
        v = v.view(B, T, K, hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        q, k, v = bf16_gradient(q), bf16_gradient(k), bf16_gradient(v)  # before the key/value heads' sum
        k, v = repeat_kv(k, H // K), repeat_kv(v, H // K)

        def plain(q, k, v):
            scores = (q @ k.transpose(2, 3)) * (hd ** -0.5)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            return probs @ v

        y = attention(q, k, v, hd ** -0.5, plain)
        return self.proj(y.transpose(1, 2).reshape(B, T, H * hd))


class MLP(nn.Module):
    """LlamaMLP, gate_proj and up_proj fused as fc [2F, D] (rows: gate, up)."""

    def __init__(self, dim, ffn):
        super().__init__()
        self.fc = Linear(dim, 2 * ffn, bias=False)
        self.proj = Linear(ffn, dim, bias=False)

    def forward(self, x):
        gate, up = bf16_value(self.fc(x)).chunk(2, dim=-1)
        return self.proj(bf16_gradient(F.silu(gate) * up))


class Block(nn.Module):
    """LlamaDecoderLayer: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, dim, heads, kv_heads, ffn, eps):
        super().__init__()
        self.ln1 = RMSNorm(dim, eps)
        self.attn = Attention(dim, heads, kv_heads)
        self.ln2 = RMSNorm(dim, eps)
        self.mlp = MLP(dim, ffn)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.mlp(self.ln2(x))


class Llama(nn.Module):
    def __init__(self, layers, dim, heads, kv_heads, vocab, ffn, norm_eps=1e-5, rope_theta=10000.0,
                 rope_scaling=None, tied_embeddings=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, ffn, norm_eps) for _ in range(layers))
        self.final_norm = RMSNorm(dim, norm_eps)
        self.tied = tied_embeddings
        self.output = None if tied_embeddings else Linear(dim, vocab, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(dim // heads, rope_theta, rope_scaling), persistent=False)

    @classmethod
    def from_config(cls, cfg):
        """From a checkpoint index's "model" object (tp-train's configuration JSON)."""
        if cfg.get("arch") != "llama":
            raise ValueError(f"not a Llama configuration: arch {cfg.get('arch')!r}")
        if cfg.get("mlp", "swiglu") != "swiglu":
            raise ValueError(f"Llama's MLP is SwiGLU, the configuration says {cfg['mlp']!r}")
        return cls(cfg["layers"], cfg["dim"], cfg["heads"], cfg.get("kv_heads", cfg["heads"]), cfg["vocab"],
                   cfg["ffn"], norm_eps=cfg.get("norm_eps", 1e-5), rope_theta=cfg.get("rope_theta", 10000.0),
                   rope_scaling=cfg.get("rope_scaling"), tied_embeddings=cfg.get("tied_embeddings", False))

    def forward(self, tokens):
        T = tokens.shape[1]
        cos, sin = rope_cos_sin(self.inv_freq, torch.arange(T, device=tokens.device))
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.final_norm(x)
        # the logits a bf16 activation in bf16 (tp-train's)
        return bf16_value(linear(x, self.embed.weight) if self.tied else self.output(x))

    def named_ours(self):
        """{tp-train global name: parameter}, every parameter once."""
        names = {"model/tok_embed.weight": self.embed.weight, "model/final_norm.weight": self.final_norm.weight}
        for i, b in enumerate(self.blocks):
            for ours, theirs in (("ln1", b.ln1), ("attn.qkv", b.attn.qkv), ("attn.proj", b.attn.proj),
                                 ("ln2", b.ln2), ("mlp.fc", b.mlp.fc), ("mlp.proj", b.mlp.proj)):
                names[f"model/layers.{i}.{ours}.weight"] = theirs.weight
        if not self.tied:
            names["model/output.weight"] = self.output.weight
        return names

    def load_named(self, tensors):
        """Sets every parameter from {tp-train global name: numpy array}; fails
        on a missing tensor, a shape that differs, or a model/ tensor this
        model does not have (an untied output of a tied model, say)."""
        names = self.named_ours()
        missing = sorted(set(names) - set(tensors))
        extra = sorted(n for n in tensors if n.startswith("model/") and n not in names)
        if missing or extra:
            raise ValueError(f"checkpoint tensors: missing {missing}, not in this Llama {extra}")
        with torch.no_grad():
            for name, param in names.items():
                value = torch.from_numpy(tensors[name])
                if tuple(value.shape) != tuple(param.shape):
                    raise ValueError(f"{name}: shape {tuple(value.shape)}, this Llama has {tuple(param.shape)}")
                param.copy_(value)
        return names  # name -> parameter, for comparing gradients
