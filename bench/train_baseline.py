#!/usr/bin/python3
"""The PyTorch side of `make bench-train`: trains the GPT-2 of tests/trainer/gpt2_ref.py
(the model tp-train is checked against) with AdamW and clipping, at the given shape,
batch and thread count, on random tokens, and prints one JSON line with the median
step time and tokens per second after warm-up steps.

Usage: train_baseline.py --layers L --dim D --heads H --vocab V --seq S --batch B
       --threads N [--steps N] [--warmup-steps N]
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


def main():
    p = argparse.ArgumentParser()
    for name in ("layers", "dim", "heads", "vocab", "seq", "batch", "threads"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup-steps", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT2(a.layers, a.dim, a.heads, a.vocab, a.seq, 4 * a.dim)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    times = []
    for step in range(a.warmup_steps + a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= a.warmup_steps:
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    print(json.dumps({"ms": seconds * 1e3, "tokens_per_s": a.batch * a.seq / seconds, "loss": loss.item()}))


if __name__ == "__main__":
    main()
