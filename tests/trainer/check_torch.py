#!/usr/bin/python3
"""Checks tp-train against an independent PyTorch model: GPT-2 (gpt2_ref.py),
or Llama (llama_ref.py) when the checkpoint's model configuration says
"arch": "llama" (no "arch" reads as GPT-2).

tp-train --dump DIR writes its initial weights (DIR/init), the tokens of every
global batch (DIR/batches.bin), and, at the first step, the gradients
(DIR/grads) and the logits of the last micro-batch of data-parallel replica 0
(DIR/logits), as checkpoints of its own layout. This script merges them with
the independent reader (tests/ckpt/check_h5py.py), loads the weights into the
PyTorch model, and compares, in fp32:
  - the initial weights against the rule of docs/DATA.md "Initial values"
    (the first 64 elements of every tensor not constant, computed here from
    --seed: a run that starts afresh computes them, a resumed one does not),
  - those logits and the first step's loss (1e-5 relative),
  - every parameter gradient (1e-4 relative to the tensor's largest),
  - the losses of every logged step of AdamW training (--loss-tol relative;
    decay on matrices and embeddings, none on norms and biases).
With --bf16 (tp-train --dtype bf16) the reference computes what tp-train
documents for it (mixed_precision.py): every linear product, forward and
backward, on bf16-rounded operands with fp32 sums, and the attention on
bf16-rounded q, k, v (and output and its gradient, backward), and keeps the
logits rounded to bf16 (a bf16 activation, as autocast writes the classifier's
product): the logits are then compared beyond their two roundings
(relative_beyond_rounding). Two checks more then
measure both sides against the same computation in fp64 (its gradients): the
judge must be as exact as what it judges. The tolerances are derived from
the products' length and bf16's unit roundoff (bf16_tolerances).

Usage: check_torch.py DUMP_DIR LOG.jsonl --micro-batch B --grad-accum A --steps N
       --lr X --warmup N [--min-lr X] [--weight-decay X] [--clip X] [--loss-tol X] [--bf16] [--seed N]
       check_torch.py --each FILE
With --each, FILE holds one check a line, "LABEL DUMP_DIR LOG.jsonl OPTIONS..."
(words split at spaces): all are judged in this one process (PyTorch loads
once), each output line starting "check_torch: [LABEL]". Exit status: 0 when
every check of every line passed, 1 otherwise.
"""
import argparse
import copy
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
try:
    import xxhash
except ImportError:  # a GPU machine's Python may lack it: that check is then skipped, and said
    xxhash = None

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ckpt"))
import check_h5py  # noqa: E402
from gpt2_ref import GPT2, lr_at  # noqa: E402
from llama_ref import Llama  # noqa: E402
from mixed_precision import bf16_operands  # noqa: E402


def merged(path):
    """{name: logical tensor} of a checkpoint, merged independently."""
    ckpt, index = check_h5py.load_index(path)
    files, problems, out = {}, [], {}
    for tensor in index["tensors"]:
        result = check_h5py.read_logical(ckpt, index, tensor, files, problems)
        if result is not None:
            out[tensor["name"]] = np.array(result[0], dtype=np.float32)
    for f in files.values():
        f.close()
    if problems:
        raise SystemExit("reading %s: %s" % (path, problems))
    return out, index


MASK64 = (1 << 64) - 1


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def initial_normals(seed, name, n):
    """The first n standard normals of tensor `name` (docs/DATA.md "Initial values")."""
    h = xxhash.xxh3_64_intdigest(name.encode())
    out = []
    for j in range((n + 1) // 2):
        a = splitmix64(seed ^ splitmix64(h ^ splitmix64(j)))
        b = splitmix64(a)
        u1 = ((a >> 11) + 0.5) / 2.0 ** 53
        u2 = (b >> 11) / 2.0 ** 53
        r = math.sqrt(-2.0 * math.log(u1))
        out += [r * math.cos(2 * math.pi * u2), r * math.sin(2 * math.pi * u2)]
    return np.array(out[:n])


def initial_values_error(weights, seed):
    """Largest departure of the dumped initial weights from std * z, over the
    first 64 elements of every tensor that is not constant; std is each
    tensor's, fitted (0.02, or GPT-2's residual scaling of it)."""
    worst = 0.0
    for name, values in weights.items():
        first = values.reshape(-1)[:64].astype(np.float64)
        if np.all(first == first[0]):
            continue  # a norm's weight or a bias: its constant
        z = initial_normals(seed, name, len(first))
        std = float(first @ z / (z @ z))
        if not 0.001 < std < 0.05:
            return float("inf")
        worst = max(worst, float(np.max(np.abs(first - std * z))) / std)
    return worst


FP32_TOLERANCES = {"logits": 1e-5, "loss": 1e-5, "gradients": 1e-4}

U_BF16 = 2.0 ** -8  # bf16 keeps 8 significant bits: rounding to nearest errs by 2^-8 relative at most
U_FP32 = 2.0 ** -24


def bf16_tolerances(cfg, rows_per_step):
    """The bf16 tolerances of a model configuration (the index's "model").

    Both sides round the same fp32 values to bf16 and sum in fp32, in
    different orders (tp-train's kernels, oneDNN or OpenBLAS's sgemm, against
    PyTorch's BLAS). A sum of K products in another order differs by up to
    eps = K u32 relative, K the longest product of the model. Where two
    fp32 values that differ by eps round to different bf16 values (a
    fraction of about eps / 2u of them), the operands differ by one bf16
    step (2u) instead: a product of K such operands then differs by about
    2u sqrt(eps / 2u) = sqrt(2u eps) relative to its size (one "flip" stage).
    Each layer's products take the last layer's results, so the departure
    adds up over the stages a value goes through: the layers on the way
    forward (logits), twice as many for the gradients (forward, then back).
    A layer's stage is its four products in series (qkv, the projection, the
    MLP's two), each rounding its operands; the attention rounds once more
    on each way (q, k and v forward, its output's gradient back: what cuDNN's
    flash attention reads in bf16), so a layer counts 5/4 of a stage. (q, k
    and v come straight from a product of bf16 operands: at tp2 the Llama's
    logits departed by 1.5e-3, beyond the 1.4e-3 of a whole stage per layer;
    within the 1.7e-3 of 5/4, docs/RELIABILITY.md.)
    The tolerance is twice that sum: the worst entry of a tensor, relative to
    its largest, stayed within 0.95 of the sum at 2 and 6 layers, GPT-2 and
    Llama, against the fp64 computation of the same bf16 operands (docs/
    RELIABILITY.md, "bf16 on CPUs without AVX-512"), while a side that does
    not round at all departs by 2-3 times the tolerance at 2 layers. The
    loss is a mean over the step's rows (tokens), so its departure is the
    logits' over sqrt(rows); the 10 steps' losses, the gradients' over it.

    K: the longest sum of a product, forward (over dim, ffn), backward to the
    input (over qkv's, the MLP's and the vocabulary's outputs: summed across
    tensor-parallel ranks, the same length) or to the weights (over the rows
    of a step: micro-batch x sequence x accumulation)."""
    dim, heads, ffn, vocab = cfg["dim"], cfg["heads"], cfg["ffn"], cfg["vocab"]
    head_dim, kv_heads = dim // heads, cfg.get("kv_heads", heads)
    mlp_out = 2 * ffn if cfg.get("arch") == "llama" or cfg.get("mlp") == "swiglu" else ffn
    longest = max(dim, ffn, mlp_out, (heads + 2 * kv_heads) * head_dim, vocab, rows_per_step)
    flip = math.sqrt(2 * U_BF16 * longest * U_FP32)
    stages = cfg["layers"] * 5 / 4
    logits = 2 * stages * flip
    gradients = 2 * (2 * stages) * flip
    return {"logits": logits, "loss": logits / math.sqrt(rows_per_step), "gradients": gradients,
            "losses": gradients / math.sqrt(rows_per_step)}


def relative(a, b):
    scale = float(np.abs(b).max())
    return float(np.abs(a - b).max()) / (scale if scale > 0 else 1.0)


def relative_beyond_rounding(a, b):
    """relative() of two arrays each rounded to bf16 from fp32 values: what
    departs beyond the two roundings (|a - b| <= |x - y| + u |a| + u |b|
    for a = bf16(x), b = bf16(y), to first order), relative to b's largest:
    the same measure of x against y as relative() of unrounded values."""
    scale = float(np.abs(b).max())
    beyond = np.abs(a - b) - U_BF16 * (np.abs(a) + np.abs(b))
    return max(float(beyond.max()), 0.0) / (scale if scale > 0 else 1.0)


def judge(argv, label=""):
    """Runs the checks of one command line (check_torch.py's own
    arguments); returns the number that failed."""
    p = argparse.ArgumentParser(prog="check_torch.py")
    p.add_argument("dump")
    p.add_argument("log")
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--grad-accum", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--min-lr", type=float, default=None)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--loss-tol", type=float, default=None)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    weights, index = merged(os.path.join(a.dump, "init"))
    cfg = index["model"]
    T = cfg["seq"]
    tol = bf16_tolerances(cfg, a.micro_batch * a.grad_accum * T) if a.bf16 else FP32_TOLERANCES
    loss_tol = a.loss_tol if a.loss_tol is not None else tol.get("losses", 1e-5)

    def precision():
        return bf16_operands(a.bf16)
    if cfg.get("arch", "gpt") == "llama":
        model = Llama.from_config(cfg)
    else:
        model = GPT2(cfg["layers"], cfg["dim"], cfg["heads"], cfg["vocab"], cfg["seq"], cfg["ffn"])
    params = model.load_named(weights)
    batches = np.fromfile(os.path.join(a.dump, "batches.bin"), dtype=np.int32)
    batches = torch.from_numpy(batches.copy()).view(a.steps, -1, T + 1).long()  # [step, sample, T + 1]
    logged = [r for r in map(json.loads, open(a.log)) if "event" not in r]  # step lines
    failures = []
    prefix = f"check_torch: [{label}]" if label else "check_torch:"

    def check(what, value, tol):
        status = "ok" if value <= tol else "FAIL"
        print(f"{prefix} {what}: {value:.3e} (tolerance {tol:.3g}) {status}", flush=True)
        if value > tol:
            failures.append(what)

    # fp32 rounding of std * z: a relative 1e-7 of the largest value.
    if xxhash:
        check("initial values against docs/DATA.md's rule", initial_values_error(weights, a.seed), 1e-5)
    else:
        print(f"{prefix} initial values: skipped (this Python has no xxhash module)")

    # Step 1: logits of the dumped micro-batch, the loss, every gradient.
    tokens = batches[0]
    with precision():
        logits = model(tokens[:, :-1]).float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    B, A = a.micro_batch, a.grad_accum
    ours_logits, _ = merged(os.path.join(a.dump, "logits"))
    theirs = logits[(A - 1) * B: A * B].reshape(B * T, -1).detach().numpy()
    # In bf16 both sides' logits are bf16 activations (the classifier's product rounded, as autocast writes it).
    logits_error = (relative_beyond_rounding if a.bf16 else relative)(ours_logits["dump/logits"], theirs)
    check("logits of the last micro-batch of replica 0" + (" (beyond their bf16 rounding)" if a.bf16 else ""),
          logits_error, tol["logits"])
    check("loss of step 1", abs(logged[0]["loss"] - loss.item()) / loss.item(), tol["loss"])
    loss.backward()
    grads, _ = merged(os.path.join(a.dump, "grads"))
    worst = max((relative(grads[name], param.grad.numpy()), name) for name, param in params.items())
    check(f"gradients (worst: {worst[1]})", worst[0], tol["gradients"])
    if a.bf16:
        # The same step in fp64 from the same bf16 operands: how far each side is from it.
        exact = copy.deepcopy(model).double()
        exact.zero_grad(set_to_none=True)
        exact_params = exact.load_named(weights)
        with precision():
            logits64 = exact(tokens[:, :-1])
        F.cross_entropy(logits64.reshape(-1, logits64.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
        for side, side_grads in (("tp-train's", {n: grads[n] for n in params}),
                                 ("the judge's", {n: q.grad.numpy() for n, q in params.items()})):
            worst = max((relative(side_grads[n], exact_params[n].grad.numpy()), n) for n in params)
            check(f"{side} gradients against fp64 sums of the same bf16 operands (worst: {worst[1]})", worst[0],
                  tol["gradients"])

    # Training: AdamW with decoupled decay on matrices and embeddings, clipping, schedule.
    model.zero_grad()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    min_lr = a.min_lr if a.min_lr is not None else a.lr / 10
    worst_loss = 0.0
    for step in range(1, a.steps + 1):
        tokens = batches[step - 1]
        with precision():
            logits = model(tokens[:, :-1]).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        ours = logged[step - 1]
        assert ours["step"] == step
        worst_loss = max(worst_loss, abs(ours["loss"] - loss.item()) / loss.item())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, a.lr, min_lr, a.warmup, a.steps)
        optimizer.step()
    check(f"losses of {a.steps} AdamW steps", worst_loss, loss_tol)
    return len(failures)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--each":
        failed = 0
        with open(sys.argv[2], encoding="utf-8") as f:
            for line in f:
                words = line.split()
                if not words:
                    continue
                try:
                    failed += judge(words[1:], words[0])
                except (Exception, SystemExit) as e:  # this line fails; the next ones are still judged
                    print(f"check_torch: [{words[0]}] error: {type(e).__name__}: {e} FAIL", flush=True)
                    failed += 1
        return 1 if failed else 0
    return 1 if judge(sys.argv[1:]) else 0


if __name__ == "__main__":
    sys.exit(main())
