"""Writes torch.save files with real PyTorch for tests/formats/test_torch.c,
and what PyTorch says they hold, for the C reader to be judged against.

Usage: torch_fixtures.py DIR

DIR/state.pt      a Megatron-like checkpoint: nested dicts, an OrderedDict
                  state dict (with its _metadata), a Parameter, tensors of
                  every dtype the reader knows, views sharing one storage at
                  offsets, a transposed (non-contiguous) view, a scalar, an
                  empty tensor, argparse.Namespace args holding a dtype,
                  numpy's RNG state, an enum, integer keys, bytes, a set, a
                  big integer, floats, None and booleans.
DIR/zip64.pt      state.pt's entries rewritten by Python's zipfile with
                  Zip64 fields wherever they can be (a valid zip archive that
                  unzip and zipfile read; PyTorch 1.13's reader refuses it).
DIR/deflated.pt   state.pt's entries compressed (refused: torch.save stores).
DIR/legacy.pt     the format of before PyTorch 1.6 (refused by the reader).
DIR/expected.txt  one line per tensor, from PyTorch:
                  PATH DTYPE CONTIGUOUS NDIM SHAPE... HEX-OF-ITS-BYTES
                  and lines "value PATH REPR" for some non-tensor values.
"""
import argparse
import collections
import enum
import io
import os
import sys
import zipfile

import numpy as np
import torch


class Backend(enum.Enum):
    flash = 1
    local = 2


def tensors():
    torch.manual_seed(7)
    g = torch.Generator().manual_seed(7)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = collections.OrderedDict()
    state["word_embeddings.weight"] = torch.randn(5, 4, generator=g)
    state["layers.0.qkv.weight"] = torch.randn(6, 4, generator=g).to(torch.bfloat16)
    state["layers.0.qkv.bias"] = torch.randn(6, generator=g).half()
    state["layers.0.norm.weight"] = torch.nn.Parameter(torch.ones(4) * 1.5)
    state["doubles"] = torch.tensor([1.0, -2.5, 1e300], dtype=torch.float64)
    state["longs"] = torch.tensor([1, -2, 2**40], dtype=torch.int64)
    state["ints"] = torch.tensor([[7, -8]], dtype=torch.int32)
    state["shorts"] = torch.tensor([300, -300], dtype=torch.int16)
    state["chars"] = torch.tensor([-5, 5], dtype=torch.int8)
    state["bytes"] = torch.tensor([0, 255], dtype=torch.uint8)
    state["bools"] = torch.tensor([True, False, True])
    state["complex"] = torch.tensor([1 + 2j], dtype=torch.complex64)
    state["scalar"] = torch.tensor(3.25)
    state["empty"] = torch.zeros(0, 3)
    # Views of one storage: rows 1..2 and row 3 of base (offsets 6 and 18).
    state["view.rows"] = base[1:3]
    state["view.last"] = base[3]
    state["view.transposed"] = base.t()
    return state


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    state = tensors()
    state._metadata = collections.OrderedDict({"": {"version": 1}})
    args = argparse.Namespace(num_layers=2, hidden_size=4, params_dtype=torch.bfloat16, swiglu=False,
                              attention_backend=Backend.flash, tokenizer_type="GPT2BPETokenizer")
    np.random.seed(3)
    checkpoint = {
        "args": args,
        "checkpoint_version": 3.0,
        "iteration": 1000,
        "model": {"language_model": state},
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(2), "step": 5}, 1: {"exp_avg": torch.ones(3)}},
                      "param_groups": [{"lr": 1e-4, "params": [0, 1]}]},
        "rng_state": [{"np_rng_state": np.random.get_state(), "random_rng_state": (3, tuple(range(4)), None)}],
        "blob": b"\x00\x01bytes\xff",
        "tags": {"a", "b"},
        "big": 2**70 + 5,
        "negative": -(2**40),
        "flags": [True, False, None],
        "ratio": 0.125,
    }
    torch.save(checkpoint, os.path.join(out, "state.pt"))
    torch.save({"x": torch.ones(2)}, os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)

    # The same entries through Python's zipfile, with Zip64 fields in every
    # local header, central directory record (the limits below make every
    # size and offset "too large") and the Zip64 end records.
    zipfile.ZIP64_LIMIT = 0
    zipfile.ZIP_FILECOUNT_LIMIT = 0
    with zipfile.ZipFile(os.path.join(out, "state.pt")) as src, \
            zipfile.ZipFile(os.path.join(out, "zip64.pt"), "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            with dst.open(info.filename, "w", force_zip64=True) as f:
                f.write(src.read(info.filename))

    loaded = torch.load(os.path.join(out, "state.pt"), weights_only=False)
    with zipfile.ZipFile(os.path.join(out, "zip64.pt")) as z:
        assert z.testzip() is None
    zipfile.ZIP64_LIMIT = 1 << 31
    zipfile.ZIP_FILECOUNT_LIMIT = (1 << 16) - 1
    with zipfile.ZipFile(os.path.join(out, "state.pt")) as src, \
            zipfile.ZipFile(os.path.join(out, "deflated.pt"), "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    with open(os.path.join(out, "expected.txt"), "w") as f:
        def walk(path, value):
            if isinstance(value, torch.Tensor):
                t = value.detach()
                contiguous = int(t.is_contiguous())
                data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else \
                    t.reshape(1).view(torch.uint8).numpy().tobytes()
                name = str(t.dtype).replace("torch.", "")
                f.write("%s %s %d %d %s %s\n" % (path, name, contiguous, t.dim(),
                                                 " ".join(str(s) for s in t.shape), data.hex() or "-"))
            elif isinstance(value, dict):
                for k, v in value.items():
                    walk("%s.%s" % (path, k) if path else str(k), v)
            elif isinstance(value, (list, tuple)):
                for i, v in enumerate(value):
                    walk("%s.%d" % (path, i), v)
        walk("", loaded)
        f.write("value iteration %d\n" % loaded["iteration"])
        f.write("value negative %d\n" % loaded["negative"])
        big = loaded["big"]  # as pickle's LONG1 holds it: the fewest bytes with a sign bit
        f.write("value big %s\n" % big.to_bytes((big.bit_length() >> 3) + 1, "little", signed=True).hex())
        f.write("value blob %s\n" % loaded["blob"].hex())


if __name__ == "__main__":
    main()
