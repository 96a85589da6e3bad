#!/usr/bin/python3
"""Self-test of the PyTorch Llama reference (llama_ref.py), independent of
tp-train. Each check compares the reference with a formulation written
another way, and each has a negative control (the check would fail on a
plausible mistake: the wrong rotary convention, KV heads tiled instead of
repeated, ...):
  rope     attention with rotary embeddings in HF's rotate-half convention,
           on q/k weights permuted as convert_llama_weights_to_hf does, equals
           Meta's original (complex numbers on interleaved pairs) on the
           unpermuted weights, with grouped-query attention, with and without
           Llama 3's frequency scaling (Meta's apply_scaling, per frequency);
  gqa      repeat_kv equals attention with the K heads' weights expanded
           explicitly to H heads (query head h reads KV head h // (H / K));
  rmsnorm  known values, the epsilon inside the root, and bf16 input
           normalized in fp32 and rounded once;
  llama3   the scaled inverse frequencies against hand-computed values for one
           high, one medium (interpolated) and one low frequency;
  model    causality, tied and untied names and shapes, load_named's refusals.
Exit status 0 when every check passes; each check prints one line.
"""
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import Attention, Llama, RMSNorm, rope_cos_sin, rope_inv_freq  # noqa: E402

FAILURES = []


def check(what, ok, detail=""):
    print(f"test_llama_ref: {what}: {'ok' if ok else 'FAIL'}{' (' + detail + ')' if detail else ''}")
    if not ok:
        FAILURES.append(what)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


# --------------------------------------------------------------- Meta's Llama
# Meta's llama/model.py (precompute_freqs_cis, apply_rotary_emb, repeat_kv,
# Attention.forward without the cache) and llama3's apply_scaling, as written
# there: the rotary embedding rotates interleaved pairs (x[2i], x[2i+1]) as
# complex numbers.

def meta_apply_scaling(freqs, scale_factor, low_freq_factor, high_freq_factor, old_context_len):
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / scale_factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / scale_factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=freqs.dtype)


def meta_freqs_cis(dim, end, theta, scaling=None):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    if scaling:
        freqs = meta_apply_scaling(freqs, scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
                                   scaling["original_max_position_embeddings"])
    t = torch.arange(end, dtype=torch.float32)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64 [end, dim / 2]


def meta_apply_rotary_emb(xq, xk, freqs_cis):
    """xq, xk [B, T, heads, hd]."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    shape = [1, xq_.shape[1], 1, xq_.shape[-1]]
    freqs_cis = freqs_cis.view(*shape)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def meta_repeat_kv(x, n_rep):
    """x [B, T, K, hd] -> [B, T, K * n_rep, hd]."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep,
                                                                                       head_dim)


def meta_attention(x, wq, wk, wv, wo, heads, kv_heads, freqs_cis):
    B, T, _ = x.shape
    hd = wq.shape[0] // heads
    xq, xk, xv = x @ wq.T, x @ wk.T, x @ wv.T
    xq, xk, xv = xq.view(B, T, heads, hd), xk.view(B, T, kv_heads, hd), xv.view(B, T, kv_heads, hd)
    xq, xk = meta_apply_rotary_emb(xq, xk, freqs_cis)
    keys, values = meta_repeat_kv(xk, heads // kv_heads), meta_repeat_kv(xv, heads // kv_heads)
    xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
    scores = xq @ keys.transpose(2, 3) / math.sqrt(hd)
    mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    scores = torch.softmax((scores + mask).float(), dim=-1).type_as(xq)
    out = (scores @ values).transpose(1, 2).contiguous().view(B, T, -1)
    return out @ wo.T


def hf_permute(w, n_heads):
    """convert_llama_weights_to_hf's permute: Meta's interleaved pairs of each
    head to HF's halves; w [n_heads * hd, D]."""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def hf_attention(x, wq, wk, wv, wo, heads, kv_heads, theta, scaling=None):
    """The reference's Attention with the given HF-layout weights."""
    D = x.shape[-1]
    attn = Attention(D, heads, kv_heads)
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([wq, wk, wv]))
        attn.proj.weight.copy_(wo)
    cos, sin = rope_cos_sin(rope_inv_freq(D // heads, theta, scaling), torch.arange(x.shape[1]))
    with torch.no_grad():
        return attn(x, cos, sin)


def test_rope():
    torch.manual_seed(1)
    B, T, D, H, K = 2, 24, 64, 8, 2
    hd = D // H
    x = torch.randn(B, T, D)
    wq, wk, wv = torch.randn(H * hd, D) / 8, torch.randn(K * hd, D) / 8, torch.randn(K * hd, D) / 8
    wo = torch.randn(D, H * hd) / 8
    scaled = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    for label, theta, scaling in (("theta 10000", 10000.0, None), ("theta 500000, Llama 3 scaling", 500000.0, scaled)):
        meta = meta_attention(x, wq, wk, wv, wo, H, K, meta_freqs_cis(hd, T, theta, scaling))
        ours = hf_attention(x, hf_permute(wq, H), hf_permute(wk, K), wv, wo, H, K, theta, scaling)
        err = rel(ours, meta)
        check(f"rope: HF rotate-half on permuted q/k = Meta's complex rotation ({label})", err < 1e-5, f"{err:.1e}")
    # Negative controls: without the permutation, or without the rotation.
    meta = meta_attention(x, wq, wk, wv, wo, H, K, meta_freqs_cis(hd, T, 10000.0))
    unpermuted = rel(hf_attention(x, wq, wk, wv, wo, H, K, 10000.0), meta)
    check("rope: without the permutation the conventions differ (control)", unpermuted > 1e-2, f"{unpermuted:.1e}")
    no_rotation = rel(meta_attention(x, wq, wk, wv, wo, H, K, torch.ones(T, hd // 2, dtype=torch.complex64)), meta)
    check("rope: the rotation matters at all (control)", no_rotation > 1e-2, f"{no_rotation:.1e}")
    # The scaling changes the low frequencies at these lengths.
    scaled_meta = meta_attention(x, wq, wk, wv, wo, H, K, meta_freqs_cis(hd, T, 500000.0, scaled))
    unscaled = rel(hf_attention(x, hf_permute(wq, H), hf_permute(wk, K), wv, wo, H, K, 500000.0), scaled_meta)
    check("rope: the scaling matters at these lengths (control)", unscaled > 1e-4, f"{unscaled:.1e}")


def test_gqa():
    torch.manual_seed(2)
    B, T, D, H, K = 2, 16, 48, 6, 2
    hd, rep = D // H, H // K
    x = torch.randn(B, T, D)
    wq, wk, wv = torch.randn(H * hd, D) / 7, torch.randn(K * hd, D) / 7, torch.randn(K * hd, D) / 7
    wo = torch.randn(D, H * hd) / 7
    gqa = hf_attention(x, wq, wk, wv, wo, H, K, 10000.0)
    # Query head h reads KV head h // rep: each KV head's rows repeated rep times in a row.
    expand = [h // rep for h in range(H)]
    wk_full = torch.cat([wk[j * hd:(j + 1) * hd] for j in expand])
    wv_full = torch.cat([wv[j * hd:(j + 1) * hd] for j in expand])
    full = hf_attention(x, wq, wk_full, wv_full, wo, H, H, 10000.0)
    err = rel(gqa, full)
    check(f"gqa: repeat_kv (H {H}, K {K}) = K expanded to H heads explicitly", err < 1e-6, f"{err:.1e}")
    # Control: query head h reading KV head h % K (tiled) is another model.
    tiled = [h % K for h in range(H)]
    wk_tiled = torch.cat([wk[j * hd:(j + 1) * hd] for j in tiled])
    wv_tiled = torch.cat([wv[j * hd:(j + 1) * hd] for j in tiled])
    err = rel(hf_attention(x, wq, wk_tiled, wv_tiled, wo, H, H, 10000.0), full)
    check("gqa: KV heads tiled (h % K) differ (control)", err > 1e-2, f"{err:.1e}")


def test_rmsnorm():
    norm = RMSNorm(4, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 1.0, 2.0, 0.5]))
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])
    # mean(x^2) = 30 / 4 = 7.5; 1 / sqrt(7.50001) = 0.36514813...; zeros stay zeros.
    r = 1 / math.sqrt(7.5 + 1e-5)
    expected = torch.tensor([[r, 2 * r, 6 * r, 2 * r], [0.0, 0.0, 0.0, 0.0]])
    with torch.no_grad():
        y = norm(x)
    check("rmsnorm: [1 2 3 4] * [1 1 2 0.5] = [0.365148 0.730296 2.190889 0.730296]",
          torch.allclose(y, expected, rtol=1e-6, atol=0) and abs(float(y[0, 0]) - 0.3651481) < 1e-6,
          " ".join(f"{v:.6f}" for v in y[0].tolist()))
    # The epsilon counts: a tiny input is not scaled to unit RMS.
    with torch.no_grad():
        small = norm(torch.full((1, 4), 1e-3))
    check("rmsnorm: eps 1e-5 inside the root (1e-3 -> 1e-3 / sqrt(1e-6 + 1e-5))",
          abs(float(small[0, 0]) - 1e-3 / math.sqrt(1.1e-5)) < 1e-6, f"{float(small[0, 0]):.6f}")
    # bf16 input: normalized in fp32 and rounded to bf16 once (HF casts back
    # before the weight); computing in bf16 throughout rounds more often.
    torch.manual_seed(4)
    xb = (torch.randn(256, 64) * 3).bfloat16()
    xf = xb.float()
    once = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16().float()
    with torch.no_grad():
        yb = RMSNorm(64, 1e-5)(xb)
    check("rmsnorm: bf16 input normalized in fp32, rounded once", torch.equal(yb.float(), once))
    throughout = (xb * torch.rsqrt(xb.pow(2).mean(-1, keepdim=True) + 1e-5)).float()
    differ = int((throughout != once).sum())
    check("rmsnorm: in bf16 throughout it differs (control)", differ > 0, f"{differ} of {once.numel()} values")


def test_llama3():
    # Llama 3.2's scaling: factor 32, low 1, high 4, original 8192: wavelengths
    # above 8192 are divided by 32, below 2048 kept, between interpolated.
    # theta 500000, hd 64: inv_freq[i] = 500000^(-2i/64), wavelength 2 pi / inv_freq.
    scaling = {"factor": 32, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}
    scaled = rope_inv_freq(64, 500000.0, scaling).double()
    plain = rope_inv_freq(64, 500000.0).double()
    # i = 5: 500000^(-10/64) = 0.12869, wavelength 2 pi / 0.12869 = 48.8 < 2048: high, kept.
    # i = 15: 500000^(-30/64) = 2.1311e-3, wavelength 2948.3 in [2048, 8192]: medium,
    #   smooth = (8192 / 2948.3 - 1) / 3 = 0.59285, (1 - smooth) / 32 + smooth = 0.60557 of it: 1.2905e-3.
    # i = 25: 500000^(-50/64) = 3.5292e-5, wavelength 178033 > 8192: low, / 32: 1.1029e-6.
    hand = {5: 0.12868737, 15: 1.2905479e-3, 25: 1.1028837e-6}
    for i, want in hand.items():
        f = 500000.0 ** (-2 * i / 64)
        wavelen = 2 * math.pi / f
        if wavelen < 2048:
            formula = f
        elif wavelen > 8192:
            formula = f / 32
        else:
            smooth = (8192 / wavelen - 1) / 3
            formula = (1 - smooth) * f / 32 + smooth * f
        band = "high" if wavelen < 2048 else "low" if wavelen > 8192 else "medium"
        ok = abs(scaled[i].item() - want) < 1e-4 * want and abs(formula - want) < 1e-4 * want
        check(f"llama3: inv_freq[{i}] ({band}, wavelength {wavelen:.1f}) = {want:.5g}", ok,
              f"{scaled[i].item():.7g}, unscaled {plain[i].item():.5g}")
    # Every frequency: the bands and the interpolation, in double from the formula.
    f = 500000.0 ** (-np.arange(0, 64, 2) / 64)
    wavelen = 2 * np.pi / f
    smooth = (8192 / wavelen - 1) / 3
    want = np.where(wavelen < 2048, f, np.where(wavelen > 8192, f / 32, (1 - smooth) * f / 32 + smooth * f))
    err = float(np.max(np.abs(scaled.numpy() - want) / want))
    check("llama3: all 32 frequencies against the formula in double", err < 1e-5, f"{err:.1e}")


def test_model():
    cfg = {"arch": "llama", "layers": 2, "dim": 32, "heads": 4, "kv_heads": 2, "vocab": 50, "seq": 16, "ffn": 48,
           "mlp": "swiglu", "vocab_pad_multiple": 1, "dtype": "fp32", "tied_embeddings": False, "norm_eps": 1e-5,
           "rope_theta": 10000}
    torch.manual_seed(3)
    model = Llama.from_config(cfg)
    shapes = {n: tuple(p.shape) for n, p in model.named_ours().items()}
    want = {"model/tok_embed.weight": (50, 32), "model/final_norm.weight": (32,), "model/output.weight": (50, 32),
            "model/layers.1.attn.qkv.weight": ((4 + 2 * 2) * 8, 32), "model/layers.1.attn.proj.weight": (32, 32),
            "model/layers.1.mlp.fc.weight": (96, 32), "model/layers.1.mlp.proj.weight": (32, 48),
            "model/layers.1.ln1.weight": (32,), "model/layers.1.ln2.weight": (32,)}
    check("model: untied names and shapes", all(shapes.get(n) == s for n, s in want.items()) and len(shapes) == 15)
    check("model: every parameter named once", len({id(p) for p in model.named_ours().values()}) ==
          len(list(model.parameters())) == len(shapes))
    tied = Llama.from_config(dict(cfg, tied_embeddings=True))
    check("model: tied has no output.weight", "model/output.weight" not in tied.named_ours() and
          len(list(tied.parameters())) == 14)
    # Causality: changing token 10 changes no logits before position 10.
    tokens = torch.randint(0, 50, (2, 16))
    other = tokens.clone()
    other[:, 10] = (other[:, 10] + 1) % 50
    with torch.no_grad():
        a, b = model(tokens), model(other)
    check("model: causal (a later token changes no earlier logit)",
          torch.equal(a[:, :10], b[:, :10]) and not torch.allclose(a[:, 10:], b[:, 10:]))
    # load_named: sets every tensor, refuses an extra or a wrong shape.
    tensors = {n: np.full(p.shape, 0.5, dtype=np.float32) for n, p in model.named_ours().items()}
    model.load_named(tensors)
    check("model: load_named sets every tensor", all(bool((p == 0.5).all()) for p in model.parameters()))
    refused = []
    for bad in (dict(tensors, **{"model/layers.0.attn.qkv.bias": np.zeros(64, np.float32)}),
                dict(tensors, **{"model/final_norm.weight": np.zeros(33, np.float32)}), tensors):
        try:
            (tied if bad is tensors else model).load_named(bad)
            refused.append(False)
        except ValueError:
            refused.append(True)
    check("model: load_named refuses an extra tensor, a wrong shape, output.weight for a tied model", all(refused))


def main():
    torch.set_num_threads(1)
    for test in (test_rope, test_gqa, test_rmsnorm, test_llama3, test_model):
        test()
    print(f"test_llama_ref: {len(FAILURES)} failed" + (": " + ", ".join(FAILURES) if FAILURES else ""))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
