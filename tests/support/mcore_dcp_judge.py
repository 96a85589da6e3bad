#!/usr/bin/python3
"""PyTorch's own distributed checkpoint load as the judge of a torch_dist
checkpoint the toolkit wrote, against what Megatron-Core's ranks held
(tests/data/megatron-core/reference.json, tests/support/mcore_reference.py).

  mcore_dcp_judge.py REFERENCE.json RELEASE/NAME ITER_DIR [--weights-only]
      Loads every tensor entry of the torch_dist checkpoint's iteration
      directory ITER_DIR whole with the PyTorch at hand
      (torch.distributed.checkpoint of 2.x, or 1.13's
      torch.distributed._shard.checkpoint: the output must then be written
      with --dcp-torch 1.13), and with 2.x every bytes entry as the bytes it
      holds, each a torch.save archive (1.13's planner torch.loads a bytes
      entry, which would import Megatron's classes the common state names:
      there they are left to tests/support/mcore_metadata.py). Every tensor of the reference RELEASE/NAME
      (Megatron-Core's keys, a layer's tensors stacked) must be there with
      the same dtype and shape and, layer by layer, the same bytes, and no
      other tensor (with --weights-only: the model's alone, none of the
      optimizer's). No project code reads anything.
Exit 0 when everything matches, 1 otherwise (one line per problem); 77
where torch lacks a distributed checkpoint module.
"""
import hashlib
import io
import json
import os
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "formats"))
import dcp_torch  # noqa: E402  (PyTorch's DCP, 1.13 or 2.x, and the shim 1.13 needs)
import torch  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] != "--weights-only"):
        sys.stderr.write(__doc__)
        return 2
    reference_path, which, path = argv[:3]
    weights_only = len(argv) == 4
    with open(reference_path) as f:
        reference = json.load(f)[which]
    if weights_only:
        reference = {k: v for k, v in reference.items() if not k.startswith("optimizer.")}
    tensors, others = dcp_torch.tensor_entries(path)
    state = {k: torch.empty(size, dtype=dtype) for k, (size, dtype) in tensors.items()}
    if dcp_torch.TORCH2:
        state.update({k: io.BytesIO() for k in others})
    else:
        others = []
    dcp_torch.alone(lambda rank, ranks: dcp_torch.load(state, path))
    problems = []
    for key in sorted(others):
        value = state[key]
        data = value.getvalue() if isinstance(value, io.BytesIO) else None
        if data is None or not zipfile.is_zipfile(io.BytesIO(data)):
            problems.append(f"{key}: the bytes entry loaded is not a torch.save archive")
    for key, ref in sorted(reference.items()):
        if key not in state:
            problems.append(f"{key}: missing")
            continue
        t = state[key]
        if t.dtype != DTYPES[ref["dtype"]] or list(t.shape) != ref["shape"]:
            problems.append(f"{key}: {t.dtype} {list(t.shape)}, Megatron-Core held {ref['dtype']} {ref['shape']}")
            continue
        parts = len(ref["sha256"])
        for i in range(parts):
            part = t[i] if parts > 1 else t
            data = part.contiguous().view(torch.uint8).numpy().tobytes() if part.dim() else part.reshape(1).view(torch.uint8).numpy().tobytes()
            if hashlib.sha256(data).hexdigest() != ref["sha256"][i]:
                problems.append(f"{key}{'' if parts == 1 else f'[{i}]'}: its bytes differ from Megatron-Core's")
    extra = sorted(set(tensors) - set(reference))
    if extra:
        problems.append("tensors Megatron-Core did not hold: " + ", ".join(extra[:8]))
    for p in problems:
        print(p)
    if not problems:
        print(f"{which}: {len(reference)} tensors loaded by PyTorch {torch.__version__}'s DCP bit-identical to "
              f"Megatron-Core's own, {len(others)} bytes entries loaded, none other")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
