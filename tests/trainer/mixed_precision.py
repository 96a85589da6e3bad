"""bf16 mixed precision for the PyTorch reference models, as tp-train
documents it (docs/TOOLS.md, --dtype bf16), written from that description:
every linear layer's product, forward and backward, takes its two operands
rounded to bf16 (to nearest, ties to even) and sums in the model's own
precision; the causal attention reads q, k and v rounded to bf16, and its
backward the gradient of its output and that output rounded too (what
cuDNN's flash attention reads in bf16; attention() below); the MLP's
input, the fc product's output, is rounded as tp-train keeps it, in bf16
(bf16_value() below: SwiGLU reads it so), and so are the logits (the
classifier's product, a bf16 activation as autocast writes it, from which
the cross-entropy is taken in the model's precision), but for GPT-2's GELU, which is
computed from the product's fp32 sums as cuBLASLt's epilogue computes it,
and whose backward reads the rounded input and the projection's gradient
unrounded (gelu_of_sums() below); the gradients
tp-train keeps in bf16 inside a layer are rounded where it rounds them
(bf16_gradient() below: SwiGLU's output's, and q, k and v's after
RoPE, once summed over the query heads that share a key/value head, as
cuDNN writes them); everything else (norms, the softmax and its
probabilities, other activations, the loss, the residual stream's
gradients) stays in that precision.

The reference models call linear() for every product with a weight. Outside
bf16_operands() it is F.linear, so the models are plain PyTorch (and
autocast, which the benchmarks use, applies as usual). Inside it:
  forward   y = bf16(x) @ bf16(W)^T + b, with b rounded to bf16 where
            tp-train writes y in bf16 (GPT-2's qkv and fc: a bias in the
            activation's type, as cuBLASLt takes it and autocast rounds it)
  backward  dx = bf16(dy) @ bf16(W)
            dW = bf16(dy)^T @ bf16(x), summed over every row
            db = bf16(dy) summed over every row (the gradient the product reads)
In an fp32 model the sums are fp32, which every CPU's BLAS gives exactly
enough; in an fp64 model they are exact to fp64's precision (the values
rounded first to fp32, then to bf16, as tp-train rounds fp32 values).

This is the judge's bf16, not PyTorch's autocast: autocast also rounds each
product's result to bf16, and on a CPU without AVX-512 PyTorch 1.13's bf16
products (autocast's, and backward's) of some layouts sum in bf16 (docs/
RELIABILITY.md, "bf16 on CPUs without AVX-512"), which no check of tp-train
can be more exact than.
"""
import contextlib

import torch
import torch.nn.functional as F

_BF16_OPERANDS = False


def round_bf16(t):
    """t rounded to bf16 (through fp32, to nearest, ties to even), kept in t's dtype."""
    return t.float().bfloat16().to(t.dtype)


class _Bf16OperandsLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, bias_in_bf16):
        x16, w16 = round_bf16(x), round_bf16(weight)
        ctx.save_for_backward(x16, w16)
        ctx.has_bias = bias is not None
        y = x16 @ w16.T  # x [..., C], W [OC, C]: y [..., OC]
        if bias is None:
            return y
        return y + (round_bf16(bias) if bias_in_bf16 else bias)

    @staticmethod
    def backward(ctx, dy):
        x16, w16 = ctx.saved_tensors
        dy16 = round_bf16(dy)
        dx = dy16 @ w16  # [..., C]
        dw = dy16.reshape(-1, dy.shape[-1]).T @ x16.reshape(-1, x16.shape[-1])  # [OC, C]
        db = dy16.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db, None


class _Bf16OperandsAttention(torch.autograd.Function):
    """Causal attention of q [B, H, T, hd] and k, v (their key/value heads
    already repeated for their query heads) on bf16-rounded operands, the
    backward from the saved probabilities: dV = P^T g, dP = g V^T, dS = P
    (dP - rowsum(g out)) scale, dQ = dS K, dK = dS^T Q, with g and out
    rounded (rowsum(g out) is the softmax backward's sum over keys of P dP,
    taken from the output as FlashAttention and tp-train take it)."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        q16, k16, v16 = round_bf16(q), round_bf16(k), round_bf16(v)
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores = ((q16 @ k16.transpose(-2, -1)) * scale).masked_fill(~mask, float("-inf"))
        p = F.softmax(scores, dim=-1)
        out = p @ v16
        ctx.save_for_backward(q16, k16, v16, p, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q16, k16, v16, p, out = ctx.saved_tensors
        g16, o16 = round_bf16(d_out), round_bf16(out)
        dv = p.transpose(-2, -1) @ g16
        dp = g16 @ v16.transpose(-2, -1)
        ds = p * (dp - (g16 * o16).sum(-1, keepdim=True)) * ctx.scale
        return ds @ k16, ds.transpose(-2, -1) @ q16, dv, None


def attention(q, k, v, scale, plain):
    """The causal attention of q, k, v [B, H, T, hd] (scores scaled by
    scale): plain(q, k, v), the model's own, or with bf16 operands inside
    bf16_operands()."""
    if _BF16_OPERANDS:
        return _Bf16OperandsAttention.apply(q, k, v, scale)
    return plain(q, k, v)


class _Bf16Gradient(torch.autograd.Function):
    """x itself; its gradient rounded to bf16 on the way back."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx):
        return round_bf16(dx)


class _Bf16Value(torch.autograd.Function):
    """x rounded to bf16; its gradient passed on as it comes (a cast's)."""

    @staticmethod
    def forward(ctx, x):
        return round_bf16(x)

    @staticmethod
    def backward(ctx, dx):
        return dx


def bf16_value(x):
    """x, which tp-train keeps as bf16 (kernels.h): rounded inside
    bf16_operands(), untouched outside."""
    if _BF16_OPERANDS:
        return _Bf16Value.apply(x)
    return x


def bf16_gradient(x):
    """x, whose gradient tp-train keeps as bf16 (kernels.h): rounded inside
    bf16_operands(), untouched outside."""
    if _BF16_OPERANDS:
        return _Bf16Gradient.apply(x)
    return x


class _GeluOfSums(torch.autograd.Function):
    """GELU (tanh) of the fp32 sums h of the product before it, h kept
    rounded to bf16 for the backward: its gradient is GELU's derivative at
    the rounded h times the gradient as it comes, unrounded (tp-train's
    matmul_forward_gelu_bf16 and matmul_backward_gelu_bf16: cuBLASLt's GELU
    epilogues)."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(round_bf16(h))
        return F.gelu(h, approximate="tanh")

    @staticmethod
    def backward(ctx, dg):
        (h16,) = ctx.saved_tensors
        with torch.enable_grad():
            h16 = h16.detach().requires_grad_()
            (dh,) = torch.autograd.grad(F.gelu(h16, approximate="tanh"), h16, dg)
        return dh


def gelu_of_sums(h):
    """GELU (tanh approximation) of the MLP's input h, as GPT-2's bf16 MLP
    computes it inside bf16_operands() (_GeluOfSums), F.gelu outside."""
    if _BF16_OPERANDS:
        return _GeluOfSums.apply(h)
    return F.gelu(h, approximate="tanh")


def linear(x, weight, bias=None, bf16_output=False):
    """x @ weight^T + bias: F.linear, or with bf16 operands inside
    bf16_operands(), where a product tp-train writes in bf16 (bf16_output)
    adds its bias rounded to bf16 (its gradient passed on as a cast's)."""
    if _BF16_OPERANDS:
        return _Bf16OperandsLinear.apply(x, weight, bias, bf16_output)
    return F.linear(x, weight, bias)


class Linear(torch.nn.Linear):
    """nn.Linear whose product is linear() above; bf16_output: tp-train
    writes its output in bf16 (GPT-2's qkv and fc)."""

    def __init__(self, *args, bf16_output=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.bf16_output = bf16_output

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.bf16_output)


@contextlib.contextmanager
def bf16_operands(enabled=True):
    """Within: every linear() product takes bf16-rounded operands (when enabled)."""
    global _BF16_OPERANDS
    before = _BF16_OPERANDS
    _BF16_OPERANDS = enabled
    try:
        yield
    finally:
        _BF16_OPERANDS = before
