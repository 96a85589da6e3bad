#!/usr/bin/python3
"""Real Megatron-Core checkpoints as the judge of tp-toolkit's reading of
them (tests/data/megatron-core/README.md, docs/MEGATRON.md).

The references are what Megatron-Core's ranks held in memory before they
saved: every tensor under Megatron-Core's own key, assembled from the
pieces the ranks held (ref/NAME/global.safetensors of the fixtures). They
are kept here as digests: the SHA-256 of each tensor's bytes, one for each
layer of a tensor whose layers are stacked, so that the repository carries
the checkpoints and not a second copy of their values.

  mcore_reference.py digests FIXTURES OUT.json
      FIXTURES is the folder of the fixtures (mcore-0.18/, mcore-0.20/):
      for every ref/NAME/global.safetensors, each key's dtype, shape and
      digests (read with the standard library and numpy: no project code).
      The vocabulary's tables (the word embeddings, the output layer and
      their optimizer state), stored padded, also have the digest of their
      first true_vocab rows (save.json's: the tokens' rows, without
      Megatron's padding).
  mcore_reference.py compare OUT.json RELEASE/NAME CKPT [--true-vocab]
      CKPT is a tp-ckpt checkpoint (any layout), read with the independent
      reader tests/ckpt/check_h5py.py: every tensor of the reference must be
      in it under its canonical name (the map below, written from
      Megatron-Core's layer specification) with the same dtype, shape and
      bytes, and it must hold no other tensor. With --true-vocab, the
      vocabulary's tables hold the tokens' rows alone.
Exit 0 when everything matches, 1 otherwise (one line per problem).
"""
import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
import check_h5py  # noqa: E402

STACKED = "decoder.layers."
# Megatron-Core's module paths under decoder.layers. (local specification,
# norms named as Transformer Engine's fused modules name them), and ours.
LAYER_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_norm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_norm.bias",
    "self_attention.linear_qkv.weight": "attention.qkv.weight",
    "self_attention.linear_qkv.bias": "attention.qkv.bias",
    "self_attention.linear_proj.weight": "attention.dense.weight",
    "self_attention.linear_proj.bias": "attention.dense.bias",
    "mlp.linear_fc1.layer_norm_weight": "post_norm.weight",
    "mlp.linear_fc1.layer_norm_bias": "post_norm.bias",
    "mlp.linear_fc1.weight": "mlp.fc1.weight",
    "mlp.linear_fc1.bias": "mlp.fc1.bias",
    "mlp.linear_fc2.weight": "mlp.fc2.weight",
    "mlp.linear_fc2.bias": "mlp.fc2.bias",
}
OTHER_NAMES = {
    "embedding.word_embeddings.weight": "embedding.word_embeddings.weight",
    "embedding.position_embeddings.weight": "embedding.position_embeddings.weight",
    "decoder.final_layernorm.weight": "final_norm.weight",
    "decoder.final_layernorm.bias": "final_norm.bias",
    "output_layer.weight": "output_layer.weight",
}
# Megatron's optimizer states, and the roles they are read as.
STATES = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "fp32_param": "master"}
# The tables whose rows are the vocabulary's, padded as Megatron pads them.
VOCABULARY_TABLES = ("embedding.word_embeddings.weight", "output_layer.weight")
DTYPES = {"F32": ("fp32", 4), "BF16": ("bf16", 2), "F16": ("fp16", 2)}


def read_safetensors(path):
    """{key: (dtype, shape, bytes)}."""
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        first, last = info["data_offsets"]
        out[key] = (info["dtype"], info["shape"], body[first:last])
    return out


def digests(fixtures, out_path):
    result = {}
    for release in sorted(os.listdir(fixtures)):
        ref_root = os.path.join(fixtures, release, "ref")
        if not os.path.isdir(ref_root):
            continue
        for name in sorted(os.listdir(ref_root)):
            tensors = {}
            with open(os.path.join(ref_root, name, "save.json")) as f:
                true_vocab = json.load(f)["true_vocab"]
            for key, (dtype, shape, data) in read_safetensors(os.path.join(ref_root, name, "global.safetensors")).items():
                model_key = key.split(".", 3)[3] if key.startswith("optimizer.state.") else key
                parts = shape[0] if model_key.startswith(STACKED) else 1
                step = len(data) // parts
                tensors[key] = {"dtype": dtype, "shape": shape,
                                "sha256": [hashlib.sha256(data[i * step:(i + 1) * step]).hexdigest() for i in range(parts)]}
                if model_key in VOCABULARY_TABLES:
                    row = len(data) // shape[0]
                    tensors[key]["true_rows"] = true_vocab
                    tensors[key]["sha256_true_rows"] = hashlib.sha256(data[:true_vocab * row]).hexdigest()
            result[release + "/" + name] = tensors
    with open(out_path, "w") as f:
        json.dump(result, f, indent=0, sort_keys=True)
        f.write("\n")
    return 0


def canonical(key):
    """[(our name, layer slice or None)] of a Megatron-Core key."""
    role = None
    if key.startswith("optimizer.state."):
        state, key = key[len("optimizer.state."):].split(".", 1)
        role = STATES[state]
    if key.startswith(STACKED):
        ours = LAYER_NAMES[key[len(STACKED):]]
        names = [("layers.%d.%s" % (layer, ours), layer) for layer in range(LAYERS[0])]
    else:
        names = [(OTHER_NAMES[key], None)]
    return [("optim/%s/%s" % (role, n) if role else n, layer) for n, layer in names]


LAYERS = [0]


def compare(digest_path, which, ckpt_path, true_vocab=False):
    with open(digest_path) as f:
        reference = json.load(f)[which]
    ckpt, index = check_h5py.load_index(ckpt_path)
    tensors = {t["name"]: t for t in index["tensors"]}
    files, problems, seen, optimizer = {}, [], set(), 0
    for key, ref in sorted(reference.items()):
        model_key = key.split(".", 3)[3] if key.startswith("optimizer.state.") else key
        LAYERS[0] = ref["shape"][0] if model_key.startswith(STACKED) else 1
        dtype = DTYPES[ref["dtype"]][0]
        shape = ref["shape"][1:] if model_key.startswith(STACKED) else ref["shape"]
        digest = ref["sha256"]
        if true_vocab and model_key in VOCABULARY_TABLES:
            shape, digest = [ref["true_rows"]] + shape[1:], [ref["sha256_true_rows"]]
        for name, layer in canonical(key):
            seen.add(name)
            t = tensors.get(name)
            if t is None:
                problems.append("%s (Megatron-Core's %s%s): missing" % (name, key, "" if layer is None else "[%d]" % layer))
                continue
            if t["dtype"] != dtype or t["shape"] != shape:
                problems.append("%s: %s %s, Megatron-Core's %s holds %s %s" % (name, t["dtype"], t["shape"], key, dtype, shape))
                continue
            read = check_h5py.read_logical(ckpt, index, t, files, problems)
            if read is None:
                continue
            got = hashlib.sha256(np.ascontiguousarray(read[1]).tobytes()).hexdigest()
            if got != digest[layer or 0]:
                problems.append("%s: its bytes differ from Megatron-Core's %s%s" % (name, key, "" if layer is None else "[%d]" % layer))
            elif name.startswith("optim/"):
                optimizer += 1
    for f in files.values():
        f.close()
    extra = sorted(set(tensors) - seen)
    if extra:
        problems.append("tensors Megatron-Core did not hold: %s" % ", ".join(extra[:8]))
    for p in problems:
        print(p)
    if not problems:
        print("%s: %d tensors bit-identical to Megatron-Core's own (%d of them the optimizer's), none other"
              % (which, len(seen), optimizer))
    return 1 if problems else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "digests":
        return digests(argv[2], argv[3])
    if len(argv) in (5, 6) and argv[1] == "compare" and argv[5:] in ([], ["--true-vocab"]):
        return compare(argv[2], argv[3], argv[4], true_vocab=len(argv) == 6)
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
