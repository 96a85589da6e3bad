#!/usr/bin/python3
"""The loop a user writes: the PyTorch side of scripts/bench-gpu.sh that
tp-train --device cuda is measured against. A GPT-2 (nanoGPT's shape: learned
positions, pre-LayerNorm, GELU (tanh), tied output) trained on random tokens
the way PyTorch's own recipes do it:
  - attention through torch.nn.functional.scaled_dot_product_attention (SDPA,
    causal), which picks its kernel (flash for bf16 on recent GPUs);
  - torch.optim.AdamW(fused=True), weight decay on the matrices, clipping at 1;
  - bf16 autocast with fp32 weights (--dtype bf16), or fp32 with TF32 off as
    tp-train computes it (--dtype fp32);
  - eager (--mode eager) or under torch.compile (--mode compile), the latter
    only where the compilation (the warm-up steps) ends within
    --compile-limit seconds: else the row says "not compiled in N s".
bench/train_baseline.py is the other PyTorch side: the reference model the
tests check tp-train against (attention materialized, AdamW unfused).

Where this PyTorch lacks a piece (Debian's torch 1.13 on the CPU: no SDPA, no
fused AdamW, no torch.compile), the loop runs without it and its labels say
so: attention "math" is softmax(q k^T / sqrt(hd), causal) v written out (what
SDPA's math kernel computes), the optimizer the plain AdamW, and a compile row
"not compiled: torch X has no torch.compile". Nothing claims a piece that did
not run: the attention label is the SDPA kernel a profiled call took.

One JSON line per (dtype, micro-batch), in the order given: tokens/s (the
median step after the warm-up steps), the step's milliseconds, the labels,
and MFU with the project's count (bench/mfu.py: 6N + 12 L d T FLOPs per token
against the GPU's dense bf16 peak; --peak-tflops gives a peak where none is
known, e.g. the CPU); a configuration that runs out of GPU memory gives a line
with "error" and the next one runs.

Usage: train_torch_loop.py --layers L --dim D --heads H --vocab V --seq S
       (--batch B [B...] [--dtype bf16|fp32 ...] | --runs DTYPE:B ...) [--mode eager|compile]
       [--compile-limit S] [--steps N] [--warmup-steps N] [--ffn F]
       [--vocab-pad-multiple M] [--device cpu|cuda] [--threads N]
       [--peak-tflops P]
"""
import argparse
import inspect
import json
import math
import os
import signal
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mfu as mfu_count  # noqa: E402

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def math_attention(q, k, v):
    """softmax(q k^T / sqrt(hd) + causal mask) v: what SDPA's math kernel
    computes, for a PyTorch without SDPA. q, k, v: [B, H, T, hd]."""
    T = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


class Block(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, ffn)
        self.fc_proj = nn.Linear(ffn, dim)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))  # [B, H, T, hd]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if HAS_SDPA else math_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, D))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, vocab, seq, ffn):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)  # [vocab (padded), dim], tied to the output
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for m in self.modules():  # GPT-2's initialization, as tp-train's (normal, std 0.02; biases 0)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, tokens):  # [B, T] -> logits [B, T, vocab]
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def sdpa_kernel_used(batch, heads, seq, head_dim, dtype, device):
    """The kernel SDPA takes for the model's attention (causal, [B, H, T, hd]
    of dtype, needing gradients), as the profiler records the call: flash,
    efficient, cudnn or math; or why there is none."""
    if not HAS_SDPA:
        return "math (no SDPA in torch %s)" % torch.__version__
    q, k, v = (torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True)
               for _ in range(3))
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ops = " ".join(e.key for e in prof.key_averages())
    except Exception as e:  # a profiler that cannot run here: say so, claim nothing
        return "sdpa (kernel unknown: %s)" % str(e).splitlines()[0][:80]
    for op, kernel in (("cudnn_attention", "cudnn"), ("flash_attention", "flash"),
                       ("efficient_attention", "efficient"), ("attention_math", "math")):
        if op in ops:
            return "sdpa-" + kernel
    return "sdpa (kernel unknown)"


def make_optimizer(model):
    """AdamW(fused=True) where this PyTorch has it for these parameters, else
    the plain AdamW; with the label of what was made."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    settings = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    if "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        return torch.optim.AdamW(groups, **settings), "AdamW, not fused (none in torch %s)" % torch.__version__
    try:
        return torch.optim.AdamW(groups, fused=True, **settings), "AdamW(fused=True)"
    except (RuntimeError, ValueError) as e:  # fused, but not for this device
        return torch.optim.AdamW(groups, **settings), "AdamW, not fused (%s)" % str(e).splitlines()[0][:80]


class CompileTimeout(BaseException):
    """Raised by the timer while torch.compile works past --compile-limit; a
    BaseException so that the compiler's `except Exception` does not wrap or
    swallow it."""


def on_timer(signum, frame):
    raise CompileTimeout()


def end_children():
    """Ends this process's descendants (the compiler's worker processes), by
    id, before leaving a compilation mid-way."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as f:
                parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    ours, grew = {os.getpid()}, True
    while grew:
        found = {p for p, parent in parents.items() if parent in ours} - ours
        grew = bool(found)
        ours |= found
    for pid in ours - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def train(a, step_fn, params, optimizer, dtype, batch, device):
    """Warm-up then measured steps of one configuration: (median seconds of
    the measured steps, warm-up seconds, last loss). Under --mode compile
    the warm-up, where the compiling happens, is timed against
    --compile-limit (CompileTimeout)."""
    times, warm_start = [], time.perf_counter()
    warm_seconds = 0.0
    if a.mode == "compile":
        signal.signal(signal.SIGALRM, on_timer)
        signal.setitimer(signal.ITIMER_REAL, a.compile_limit)
    try:
        for step in range(a.warmup_steps + a.steps):
            if step == a.warmup_steps:
                signal.setitimer(signal.ITIMER_REAL, 0)
                warm_seconds = time.perf_counter() - warm_start
            tokens = torch.randint(0, a.vocab, (batch, a.seq + 1), device=device)  # the true vocabulary
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
                logits = step_fn(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step >= a.warmup_steps:
                times.append(time.perf_counter() - start)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return statistics.median(times), warm_seconds, loss.item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("layers", "dim", "heads", "vocab", "seq"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--batch", type=int, nargs="+", help="micro-batches: a configuration each with each --dtype")
    p.add_argument("--dtype", choices=("bf16", "fp32"), nargs="+", default=["bf16"])
    p.add_argument("--runs", nargs="+", metavar="DTYPE:B",
                   help="the configurations in this order, instead of --dtype x --batch (bf16:4 bf16:16 fp32:4)")
    p.add_argument("--mode", choices=("eager", "compile"), default="eager")
    p.add_argument("--compile-limit", type=float, default=120.0,
                   help="seconds the warm-up steps (the compiling) may take under --mode compile")
    p.add_argument("--steps", type=int, default=10, help="measured steps")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--vocab-pad-multiple", type=int, default=1,
                   help="the token table's rows padded to a multiple of M (tp-train's gpt2-124m: 128); "
                        "tokens and the FLOP count keep --vocab")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's choice)")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="the dense bf16 peak for MFU where the GPU's is not known (e.g. the CPU)")
    a = p.parse_args()
    if a.runs:
        try:
            configs = [(d, int(b)) for d, b in (r.split(":") for r in a.runs)]
        except ValueError:
            p.error("--runs takes DTYPE:MICRO_BATCH, e.g. bf16:4, not %s" % " ".join(a.runs))
        if any(d not in ("bf16", "fp32") or b < 1 for d, b in configs):
            p.error("--runs: dtypes bf16 or fp32, micro-batches from 1: %s" % " ".join(a.runs))
    elif a.batch:
        configs = [(dtype, batch) for dtype in a.dtype for batch in a.batch]
    else:
        p.error("--batch or --runs is needed")
    if a.steps < 1 or a.warmup_steps < 0:
        p.error("--steps must be at least 1 and --warmup-steps at least 0")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    device = torch.device(a.device)
    ffn = a.ffn or 4 * a.dim
    padded_vocab = -(-a.vocab // a.vocab_pad_multiple) * a.vocab_pad_multiple
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as tp-train computes it (PyTorch's default too)
        torch.backends.cudnn.allow_tf32 = False
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = "cpu"
    if a.peak_tflops > 0:
        peak, peak_from = a.peak_tflops * 1e12, "--peak-tflops"
    else:
        peak = mfu_count.peak_bf16_flops(device_name) if device.type == "cuda" else 0.0
        peak_from = device_name if peak > 0 else None
    flops_per_token = mfu_count.gpt2_flops_per_token(a.layers, a.dim, a.vocab, a.seq, ffn)

    if hasattr(torch.device, "__enter__"):  # PyTorch 2: made (and initialized) on the device
        with device:
            model = GPT(a.layers, a.dim, a.heads, padded_vocab, a.seq, ffn)
    else:
        model = GPT(a.layers, a.dim, a.heads, padded_vocab, a.seq, ffn).to(device)
    params = list(model.parameters())
    optimizer, optimizer_label = make_optimizer(model)
    step_fn, not_compiled = model, None
    if a.mode == "compile":
        if hasattr(torch, "compile"):
            step_fn = torch.compile(model)
        else:
            not_compiled = "not compiled: no torch.compile in torch %s" % torch.__version__
    for i, (dtype, batch) in enumerate(configs):
        amp_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        row = {"trainer": "torch-loop", "mode": a.mode, "dtype": dtype, "micro_batch": batch, "seq": a.seq,
               "layers": a.layers, "dim": a.dim, "heads": a.heads, "vocab": a.vocab, "padded_vocab": padded_vocab,
               "optimizer": optimizer_label, "tf32": False, "torch": torch.__version__,
               "device": device_name, "parameters": sum(t.numel() for t in params),
               "count_parameters": mfu_count.gpt2_parameters(a.layers, a.dim, a.vocab, a.seq, ffn),
               "flops_per_token": flops_per_token, "peak_flops": peak, "peak_from": peak_from,
               "tokens_per_s": None, "mfu": None}
        row["attention"] = sdpa_kernel_used(batch, a.heads, a.seq, a.dim // a.heads, amp_dtype, device)
        row["label"] = "PyTorch %s loop, %s, attention %s, %s, %s" % (
            torch.__version__, "bf16 autocast" if dtype == "bf16" else "fp32 (TF32 off)", row["attention"],
            optimizer_label, "torch.compile" if a.mode == "compile" else "eager")
        if a.mode == "compile":
            row["compiled"] = False
        if not_compiled:
            row["note"] = not_compiled
            print(json.dumps(row), flush=True)
            continue
        try:
            seconds, warm_seconds, loss = train(a, step_fn, params, optimizer, dtype, batch, device)
        except CompileTimeout:
            row["note"] = "not compiled in %g s" % a.compile_limit
            print(json.dumps(row), flush=True)
            for dtype_left, batch_left in configs[i + 1:]:
                print(json.dumps(dict(row, dtype=dtype_left, micro_batch=batch_left,
                                      note="not tried: an earlier compilation passed the limit")), flush=True)
            end_children()
            os._exit(0)  # the compiler's state is left mid-way: no clean-up that waits for its workers
        except Exception as e:  # out of memory; or under torch.compile, a compiler that cannot run here
            if "out of memory" not in str(e):
                if a.mode != "compile":
                    raise
                row["note"] = "not compiled: %s: %s" % (type(e).__name__, (str(e).strip().splitlines() or [""])[0][:160])
                print(json.dumps(row), flush=True)
                for dtype_left, batch_left in configs[i + 1:]:
                    print(json.dumps(dict(row, dtype=dtype_left, micro_batch=batch_left,
                                          note="not tried: an earlier compilation failed")), flush=True)
                end_children()
                os._exit(0)  # as after a timeout: the compiler's state is left mid-way
            row["error"] = "out of memory"
            print(json.dumps(row), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        tokens_per_s = batch * a.seq / seconds
        row.update(ms=seconds * 1e3, tokens_per_s=tokens_per_s, loss=loss, steps=a.steps,
                   mfu=mfu_count.mfu(tokens_per_s, flops_per_token, peak))
        if a.mode == "compile":
            row.update(compiled=True, compile_s=warm_seconds, compile_limit_s=a.compile_limit)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
