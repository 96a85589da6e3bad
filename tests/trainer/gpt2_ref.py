"""GPT-2 in plain PyTorch, written from the model description of tp-train
(not from its code): learned token and position embeddings, pre-LayerNorm
blocks (eps 1e-5), causal multi-head attention with biases and 1/sqrt(head_dim)
scaling, an MLP of width ffn with GELU (tanh approximation), a final
LayerNorm, and the output projection tied to the token embedding. Its
products go through mixed_precision.linear (plain F.linear unless
mixed_precision.bf16_operands() is on), its attention through
mixed_precision.attention (the plain one here unless that is on)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mixed_precision import Linear, attention, bf16_gradient, bf16_value, gelu_of_sums, linear


class Block(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim, eps=1e-5)
        self.qkv = Linear(dim, 3 * dim, bf16_output=True)
        self.proj = Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim, eps=1e-5)
        self.fc = Linear(dim, ffn, bf16_output=True)
        self.fc_proj = Linear(ffn, dim)

    def attention(self, x):
        B, T, D = x.shape
        hd = D // self.heads
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (bf16_gradient(t.view(B, T, self.heads, hd).transpose(1, 2)) for t in (q, k, v))

        def plain(q, k, v):
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            return F.softmax(scores, dim=-1) @ v

        y = attention(q, k, v, 1.0 / math.sqrt(hd), plain)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, D))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_proj(gelu_of_sums(self.fc(self.ln2(x))))


class GPT2(nn.Module):
    def __init__(self, layers, dim, heads, vocab, seq, ffn):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        # tied output projection; the logits a bf16 activation in bf16 (tp-train's)
        return bf16_value(linear(self.ln_f(x), self.wte.weight))

    def load_named(self, tensors):
        """Sets every parameter from {tp-train global name: numpy array}."""
        names = {"model/tok_embed.weight": self.wte.weight, "model/pos_embed.weight": self.wpe.weight,
                 "model/final_norm.weight": self.ln_f.weight, "model/final_norm.bias": self.ln_f.bias}
        for i, b in enumerate(self.blocks):
            for ours, theirs in (("ln1", b.ln1), ("attn.qkv", b.qkv), ("attn.proj", b.proj), ("ln2", b.ln2),
                                 ("mlp.fc", b.fc), ("mlp.proj", b.fc_proj)):
                names[f"model/layers.{i}.{ours}.weight"] = theirs.weight
                names[f"model/layers.{i}.{ours}.bias"] = theirs.bias
        with torch.no_grad():
            for name, param in names.items():
                param.copy_(torch.from_numpy(tensors[name]))
        return names  # name -> parameter, for comparing gradients


def lr_at(step, lr, min_lr, warmup, steps):
    """Linear warmup to lr over `warmup` updates, cosine decay to min_lr at `steps`."""
    if step <= warmup:
        return lr * step / max(warmup, 1)
    if step >= steps:
        return min_lr
    progress = (step - warmup) / (steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
