#!/usr/bin/python3
"""The resharder a user would otherwise write with h5py and numpy: for each
tensor, load every source piece, merge them into the logical tensor, cut it
for the target layout and write the pieces to new shard files. Used by
`make bench-reshard` as the baseline (it writes no checksums, digests or
index, so it does less than tp-reshard).

Usage: reshard_baseline.py SRC DST TP PP
"""
import json
import os
import sys

import h5py
import numpy as np


def padded_segments(part, tp):
    out = []
    for size in part["segments"]:
        d, g = part["pad_multiple"], part["granule"]
        out.append(size if d == 0 else -(-size // (tp * d * g)) * (tp * d * g))
    return out


def merge(tensor, pieces, tp):
    part = tensor["partition"]
    if part["kind"] == "replicated":
        return pieces[0]
    axis, out, local = part["axis"], [], 0
    for size, padded in zip(part["segments"], padded_segments(part, tp)):
        share = padded // tp
        full = np.concatenate([np.take(p, range(local, local + share), axis=axis) for p in pieces], axis=axis)
        out.append(np.take(full, range(size), axis=axis))
        local += share
    return np.concatenate(out, axis=axis)


def split(tensor, logical, tp):
    part = tensor["partition"]
    if part["kind"] == "replicated":
        return [logical]
    axis, pieces, start = part["axis"], [[] for _ in range(tp)], 0
    for size, padded in zip(part["segments"], padded_segments(part, tp)):
        segment = np.take(logical, range(start, start + size), axis=axis)
        if padded > size:
            pad = [(0, 0)] * logical.ndim
            pad[axis] = (0, padded - size)
            segment = np.pad(segment, pad)
        for r, share in enumerate(np.split(segment, tp, axis=axis)):
            pieces[r].append(share)
        start += size
    return [np.concatenate(p, axis=axis) for p in pieces]


def stage(tensor, layers, pp):
    if tensor["anchor"] == "first":
        return 0
    if tensor["anchor"] == "last":
        return pp - 1
    return min(tensor["layer"] // (layers // pp), pp - 1)


def main(src, dst, tp, pp):
    index = json.load(open(os.path.join(src, "index.json")))
    layers = index["layout"]["num_layers"]
    os.makedirs(dst)
    inputs = {}
    outputs = {}
    for tensor in index["tensors"]:
        pieces = []
        for piece in tensor["pieces"]:
            path = os.path.join(src, piece["file"])
            if path not in inputs:
                inputs[path] = h5py.File(path, "r")
            dset = inputs[path]["tensors/" + tensor["name"]]
            raw = np.empty(dset.shape, dtype="<u4" if tensor["dtype"] == "fp32" else "<u2")
            dset.id.read(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=dset.id.get_type())  # stored bits
            pieces.append(raw)
        logical = merge(tensor, pieces, index["layout"]["tp"])
        s = stage(tensor, layers, pp)
        for r, piece in enumerate(split(tensor, logical, tp)):
            name = f"shard_pp{s:02d}_tp{r:02d}.h5"
            if name not in outputs:
                outputs[name] = h5py.File(os.path.join(dst, name), "w")
            outputs[name].create_dataset("tensors/" + tensor["name"], data=piece)
    for f in list(inputs.values()) + list(outputs.values()):
        f.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
