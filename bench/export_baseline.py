#!/usr/bin/python3
"""Baseline for make bench-export: a checkpoint to a Hugging Face safetensors
file the way converters are commonly written in Python: read every piece
with h5py, merge the pieces with numpy (docs/FORMAT.md), transpose the
Conv1D weights, keep the whole state dict in memory, then write it. No
checksums are verified. Writes the same bytes as `tp-ckpt export --format
safetensors` (fp32), so times compare directly.

Usage: export_baseline.py CKPT OUT.safetensors
"""
import json
import os
import struct
import sys

import h5py
import numpy as np

ckpt, out = sys.argv[1:3]
index = json.load(open(os.path.join(ckpt, "index.json")))
tp = index["layout"]["tp"]
files = {}
state = {}
hf = {"tok_embed.weight": "wte.weight", "pos_embed.weight": "wpe.weight", "final_norm.weight": "ln_f.weight",
      "final_norm.bias": "ln_f.bias"}
layer = {"ln1": "ln_1", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "ln2": "ln_2", "mlp.fc": "mlp.c_fc",
         "mlp.proj": "mlp.c_proj"}
for t in index["tensors"]:
    if t["role"] != "param":
        continue
    pieces = []
    for p in t["pieces"]:
        path = os.path.join(ckpt, p["file"])
        files.setdefault(path, h5py.File(path, "r"))
        pieces.append(files[path]["tensors/" + t["name"]][...])
    part = t["partition"]
    if part["kind"] == "replicated":
        value = pieces[0]
    else:
        axis, local, segments = part["axis"], 0, []
        for size in part["segments"]:
            pad, g = part["pad_multiple"], part["granule"]
            padded = size if pad == 0 else -(-size // (tp * pad * g)) * (tp * pad * g)
            share = padded // tp
            whole = np.concatenate([np.take(p, range(local, local + share), axis=axis) for p in pieces], axis=axis)
            segments.append(np.take(whole, range(size), axis=axis))
            local += share
        value = np.concatenate(segments, axis=axis)
    name = t["name"][len("model/"):]
    if name.startswith("layers."):
        _, i, rest = name.split(".", 2)
        base, kind = rest.rsplit(".", 1)
        value = value.T if kind == "weight" and base in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj") else value
        name = f"h.{i}.{layer[base]}.{kind}"
    else:
        name = hf[name]
    state["transformer." + name] = np.ascontiguousarray(value, dtype=np.float32)
header, offset = {"__metadata__": {"format": "pt"}}, 0
for name, value in state.items():
    header[name] = {"dtype": "F32", "shape": list(value.shape), "data_offsets": [offset, offset + value.nbytes]}
    offset += value.nbytes
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    for value in state.values():
        f.write(value.tobytes())
    f.flush()
    os.fsync(f.fileno())
