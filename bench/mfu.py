#!/usr/bin/python3
"""The model FLOPs utilization (MFU) count the benchmark scripts share: the
count tp-train reports on a GPU, in Python, for the PyTorch rows of
scripts/bench-gpu.sh (bench/train_torch_loop.py, bench/train_baseline.py).

- Training FLOPs per token: 6 N + 12 L d T, N the GPT's parameters as
  tp-train's catalogue counts them (model/gpt.c, gpt_training_flops_per_token:
  token table of the true vocabulary, no padding rows; a position table of
  seq rows; tied output), L layers, d the width, T the sequence trained on.
- The GPU's dense bf16 tensor-core peak by its name: PEAK_BF16_TFLOPS below is
  the twin of gpu_peak_bf16_flops's table in kernels/cpu/device.c (the C
  library's, which tp-train uses; the scripts may not link it). The two must
  list the same names and figures in the same order: tests/e2e/test_bench.sh
  compares them.

As a program, for the shell:
  mfu.py peak NAME                     the peak in FLOP/s (0: unknown)
  mfu.py flops L D V SEQ [FFN]         training FLOPs per token of a GPT-2
"""
import sys

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors'
# data sheets, most specific names first (a name's first match wins).
PEAK_BF16_TFLOPS = (
    ("H200", 989.4), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4),  # SXM
    ("A100", 312.0), ("L40S", 362.05), ("A10G", 70.0), ("L4", 121.0),
)


def peak_bf16_flops(name):
    """The dense bf16 peak in FLOP/s of the GPU named `name` (as the driver
    names it, e.g. "NVIDIA H100 80GB HBM3"); 0 when unknown."""
    for match, tflops in PEAK_BF16_TFLOPS:
        if name and match in name:
            return tflops * 1e12
    return 0.0


def gpt2_parameters(layers, dim, vocab, seq, ffn=None):
    """The parameters of a GPT-2 as tp-train counts them: token table
    [vocab, dim] (tied output), position table [seq, dim], per layer two
    norms (weight and bias, [dim] each), qkv [3 dim, dim] + [3 dim], proj
    [dim, dim] + [dim], fc [ffn, dim] + [ffn], fc proj [dim, ffn] + [dim];
    the final norm [dim] x 2."""
    ffn = ffn or 4 * dim
    per_layer = 4 * dim + (3 * dim * dim + 3 * dim) + (dim * dim + dim) + (ffn * dim + ffn) + (dim * ffn + dim)
    return vocab * dim + seq * dim + layers * per_layer + 2 * dim


def gpt2_flops_per_token(layers, dim, vocab, seq, ffn=None, train_seq=None):
    """6 N + 12 L d T: the training FLOPs per token (forward and backward of
    the products, plus attention's scores and weighted sums at sequence T)."""
    n = gpt2_parameters(layers, dim, vocab, seq, ffn)
    return 6.0 * n + 12.0 * layers * dim * (train_seq or seq)


def mfu(tokens_per_s, flops_per_token, peak_flops):
    """The fraction of the peak a rate of tokens reaches; None when the peak
    is unknown."""
    return tokens_per_s * flops_per_token / peak_flops if peak_flops > 0 else None


def main(argv):
    if len(argv) == 2 and argv[0] == "peak":
        print(peak_bf16_flops(argv[1]))
    elif len(argv) in (5, 6) and argv[0] == "flops":
        print(gpt2_flops_per_token(*map(int, argv[1:])))
    else:
        sys.exit(__doc__.split("As a program, for the shell:\n")[1])


if __name__ == "__main__":
    main(sys.argv[1:])
