#!/usr/bin/python3
"""What a Megatron-Core torch_dist checkpoint describes, read with Python's
standard library alone (no torch, no project code), to compare a checkpoint
the toolkit wrote with one Megatron-Core wrote (docs/MEGATRON.md "Writing").

PyTorch 2's `.metadata` pickles classes of torch.distributed.checkpoint that
PyTorch 1.13 lacks, so it is read by an unpickler whose classes record what
they are given: every object is its class name and state.

  mcore_metadata.py entries ITER_DIR
      Prints one line per entry: a tensor's key, dtype, global shape and its
      chunks (offsets and sizes), or a bytes entry's key.
  mcore_metadata.py compare REF OURS [--leave-out PREFIX]... [--ignore PATH]... [--tensors-only]
      Requires the two iteration directories' .metadata to describe the same
      entries: the same tensor keys with the same dtype, global shape and
      set of chunks (offsets, sizes), and the same bytes entries holding the
      same values (each a torch.save of [data]: _extra_state, rng_state),
      but for those whose key starts with a PREFIX left out; then the same
      metadata.json, and the same common state (common.pt, or the
      common_state entry's torch.save of [state]): every value equal, its
      tensors by dtype, shape and bytes, but at the paths ignored
      ("common.args.save"); with --tensors-only, the tensor entries alone.
      Exit 0 when equal, 1 with one line per difference.
  mcore_metadata.py common ITER_DIR
      Prints the common state, tensors as (dtype, shape, sha256).
"""
import hashlib
import io
import json
import os
import pickle
import sys
import zipfile


class Recorded:
    """An object of a class this reader does not import: its class and state."""
    cls = "?"
    args = ()  # pickle makes most of them with __new__ alone
    state = None

    def __init__(self, *args, **kwargs):
        self.args = args
        self.state = None

    def __setstate__(self, state):
        self.state = state

    def __repr__(self):
        return f"{self.cls}{self.args or ''}{'' if self.state is None else self.state}"

    __hash__ = object.__hash__  # storage_data's keys are MetadataIndex objects

    def __eq__(self, other):
        return isinstance(other, Recorded) and (self.cls, self.args, self.state) == (other.cls, other.args, other.state)


RECORDED = {}


def recorded_class(module, name):
    """One class per name, so that two reads of the same value compare equal."""
    if (module, name) not in RECORDED:
        RECORDED[module, name] = type(name, (Recorded,), {"cls": f"{module}.{name}"})
    return RECORDED[module, name]


class Tensor:
    """A tensor of a torch.save archive: dtype, shape and the bytes it holds."""

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, tuple(shape), data

    def __eq__(self, other):
        return isinstance(other, Tensor) and (self.dtype, self.shape, self.data) == (other.dtype, other.shape, other.data)

    def __repr__(self):
        return f"tensor({self.dtype}, {list(self.shape)}, sha256 {hashlib.sha256(self.data).hexdigest()[:16]})"


ELEMENT_BYTES = {"FloatStorage": 4, "BFloat16Storage": 2, "HalfStorage": 2, "DoubleStorage": 8, "LongStorage": 8,
                 "IntStorage": 4, "ByteStorage": 1, "BoolStorage": 1, "CharStorage": 1, "ShortStorage": 2}


class Unpickler(pickle.Unpickler):
    def __init__(self, data, storages=None):
        super().__init__(io.BytesIO(data))
        self.storages = storages or {}

    def find_class(self, module, name):
        if (module, name) in (("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset")):
            return super().find_class(module, name)
        if module == "torch" and name == "Size":
            return lambda values=(): ("Size",) + tuple(values)
        if module == "builtins" and name == "getattr":
            return lambda obj, attr: f"{obj!r}.{attr}"
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self.rebuild_tensor
        if module == "torch":  # dtypes, storage classes
            return f"torch.{name}"
        if module == "argparse" and name == "Namespace":
            return recorded_class(module, name)
        return recorded_class(module, name)

    def rebuild_tensor(self, storage, offset, shape, stride, *rest):
        kind, data = storage
        size = ELEMENT_BYTES.get(kind.split(".")[-1], 1)
        n = 1
        for d in shape:
            n *= d
        return Tensor(kind.split(".")[-1], shape, data[offset * size:(offset + n) * size])

    def persistent_load(self, pid):
        # ('storage', storage class, key, location, numel)
        return (str(pid[1]), self.storages.get(str(pid[2]), b""))


def torch_load(data):
    """A torch.save archive (bytes) as Python values."""
    z = zipfile.ZipFile(io.BytesIO(data))
    names = z.namelist()
    root = names[0].split("/")[0]
    storages = {n.split("/")[-1]: z.read(n) for n in names if n.startswith(root + "/data/")}
    return Unpickler(z.read(root + "/data.pkl"), storages).load()


def state(obj):
    return obj.state if isinstance(obj, Recorded) else obj


def read_metadata(directory):
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        md = state(Unpickler(f.read()).load())
    return md


def entries(directory):
    """{key: ('tensor', dtype, shape, frozenset of chunks) or ('bytes',)}"""
    out = {}
    for key, m in state(read_metadata(directory))["state_dict_metadata"].items():
        s = state(m)
        if isinstance(s, dict) and "chunks" in s:
            props = state(s["properties"])
            dtype = props["dtype"] if isinstance(props, dict) else props[0]
            chunks = frozenset((tuple(state(c)["offsets"][1:]), tuple(state(c)["sizes"][1:])) for c in s["chunks"])
            out[key] = ("tensor", str(dtype), tuple(s["size"][1:]), chunks)
        else:
            out[key] = ("bytes",)
    return out


def bytes_item(directory, key):
    """The bytes of a bytes entry's item."""
    md = state(read_metadata(directory))
    for index, info in md["storage_data"].items():
        if state(index)["fqn"] == key:
            s = state(info)
            with open(os.path.join(directory, s["relative_path"]), "rb") as f:
                f.seek(s["offset"])
                return f.read(s["length"])
    raise KeyError(key)


def common_state(directory):
    path = os.path.join(directory, "common.pt")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return "common.pt", torch_load(f.read())
    loaded = torch_load(bytes_item(directory, "common_state/shard_0_1"))
    return "common_state/shard_0_1", loaded[0]


def differences(a, b, path, out):
    """Lines naming where two values differ."""
    if isinstance(a, Recorded) and isinstance(b, Recorded):
        if a.cls != b.cls or a.args != b.args:
            out.append(f"{path}: {a.cls}{a.args} and {b.cls}{b.args}")
        differences(a.state, b.state, path, out)
    elif isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() - b.keys():
            out.append(f"{path}.{k}: only in the reference")
        for k in b.keys() - a.keys():
            out.append(f"{path}.{k}: only in ours")
        for k in a.keys() & b.keys():
            differences(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) == type(b):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items and {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            differences(x, y, f"{path}[{i}]", out)
    elif not (a == b and type(a) == type(b)):
        out.append(f"{path}: {a!r} and {b!r}")


def compare(ref, ours, leave_out, ignore, tensors_only):
    problems = []
    left = lambda k, v: any(k.startswith(p) for p in leave_out) or (tensors_only and v[0] != "tensor")  # noqa: E731
    a = {k: v for k, v in entries(ref).items() if not left(k, v)}
    b = {k: v for k, v in entries(ours).items() if not left(k, v)}
    for k in sorted(a.keys() - b.keys()):
        problems.append(f"{k}: in the reference only")
    for k in sorted(b.keys() - a.keys()):
        problems.append(f"{k}: in ours only")
    for k in sorted(a.keys() & b.keys()):
        if a[k][:3] != b[k][:3]:
            problems.append(f"{k}: {a[k][:3]} and {b[k][:3]}")
        elif a[k][0] == "tensor" and a[k][3] != b[k][3]:
            problems.append(f"{k}: chunks {sorted(a[k][3] - b[k][3])} in the reference only, "
                            f"{sorted(b[k][3] - a[k][3])} in ours only")
    for k in sorted(a.keys() & b.keys()):
        if a[k][0] == "bytes" and b[k][0] == "bytes" and k != "common_state/shard_0_1":
            differences(torch_load(bytes_item(ref, k)), torch_load(bytes_item(ours, k)), k, problems)
    tensors = sum(1 for v in a.values() if v[0] == "tensor")
    objects = len(a) - tensors
    if tensors_only:
        for p in problems:
            print(p)
        if not problems:
            print(f"mcore_metadata: the same {tensors} tensor entries (dtype, shape, chunks)")
        return 1 if problems else 0
    with open(os.path.join(ref, "metadata.json")) as f:
        ref_config = f.read()
    with open(os.path.join(ours, "metadata.json")) as f:
        our_config = f.read()
    if json.loads(ref_config) != json.loads(our_config):
        problems.append(f"metadata.json: {ref_config} and {our_config}")
    where_a, common_a = common_state(ref)
    where_b, common_b = common_state(ours)
    if where_a != where_b:
        problems.append(f"the common state: in {where_a} and in {where_b}")
    differences(common_a, common_b, "common", problems)
    problems = [p for p in problems if p.split(":")[0] not in ignore]
    for p in problems:
        print(p)
    if not problems:
        print(f"mcore_metadata: the same {tensors} tensor entries (dtype, shape, chunks), {objects} bytes entries, "
              f"metadata.json and common state ({where_a})")
    return 1 if problems else 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "entries":
        for k, v in sorted(entries(argv[1]).items()):
            print(k, *(sorted(x) if isinstance(x, frozenset) else x for x in v[1:]))
        return 0
    if len(argv) >= 2 and argv[0] == "common":
        where, value = common_state(argv[1])
        print(where)
        print(value)
        return 0
    if len(argv) >= 3 and argv[0] == "compare":
        leave_out = [argv[i + 1] for i in range(3, len(argv) - 1) if argv[i] == "--leave-out"]
        ignore = [argv[i + 1] for i in range(3, len(argv) - 1) if argv[i] == "--ignore"]
        return compare(argv[1], argv[2], leave_out, ignore, "--tensors-only" in argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
