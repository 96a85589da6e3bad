#!/usr/bin/python3
"""The PyTorch side of `make bench-train` and `make bench-llama`: trains the GPT-2 of
tests/trainer/gpt2_ref.py or, with --arch llama, the Llama of tests/trainer/llama_ref.py
(the models tp-train is checked against) with AdamW and clipping, at the given shape,
batch and thread count, on random tokens, and prints one JSON line with the median
step time and tokens per second after warm-up steps.

With --device cuda it trains on the GPU (make bench-gpu), in fp32 or, with
--dtype bf16, under bf16 autocast with fp32 weights (PyTorch's mixed precision),
and its line gains the GPT-2's MFU by the project's count (bench/mfu.py).
This is the reference model, not a fast loop: attention materialized, AdamW
unfused; bench/train_torch_loop.py is the loop a user writes.

Usage: train_baseline.py --layers L --dim D --heads H --vocab V --seq S --batch B
       --threads N [--steps N] [--warmup-steps N] [--device cpu|cuda] [--dtype fp32|bf16]
       [--arch gpt|llama] [--kv-heads K] [--ffn F] [--untied-embeddings]
       [--vocab-pad-multiple M]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "trainer"))
from gpt2_ref import GPT2  # noqa: E402
from llama_ref import Llama  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mfu as mfu_count  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    for name in ("layers", "dim", "heads", "vocab", "seq", "batch", "threads"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--untied-embeddings", action="store_true")
    p.add_argument("--vocab-pad-multiple", type=int, default=1,
                   help="GPT: the token table's rows padded to a multiple of M; tokens and MFU's count keep --vocab")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    device = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as tp-train computes it
    if a.arch == "llama":
        model = Llama.from_config({"arch": "llama", "layers": a.layers, "dim": a.dim, "heads": a.heads,
                                   "kv_heads": a.kv_heads or a.heads, "vocab": a.vocab, "ffn": a.ffn,
                                   "tied_embeddings": not a.untied_embeddings}).to(device)
    else:
        padded_vocab = -(-a.vocab // a.vocab_pad_multiple) * a.vocab_pad_multiple
        model = GPT2(a.layers, a.dim, a.heads, padded_vocab, a.seq, a.ffn or 4 * a.dim).to(device)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    times = []
    for step in range(a.warmup_steps + a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=device)
        start = time.perf_counter()
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if a.device == "cuda":
            torch.cuda.synchronize()
        if step >= a.warmup_steps:
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    result = {"ms": seconds * 1e3, "tokens_per_s": a.batch * a.seq / seconds, "loss": loss.item()}
    if a.device == "cuda" and a.arch == "gpt":
        name = torch.cuda.get_device_name(device)
        flops = mfu_count.gpt2_flops_per_token(a.layers, a.dim, a.vocab, a.seq, a.ffn or 4 * a.dim)
        result.update(device=name, flops_per_token=flops,
                      mfu=mfu_count.mfu(result["tokens_per_s"], flops, mfu_count.peak_bf16_flops(name)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
