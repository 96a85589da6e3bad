#!/usr/bin/python3
"""Independent reader of tp-ckpt checkpoints, written from docs/FORMAT.md.

Uses only h5py, numpy, xxhash and zstandard or libzstd (no project code). For every
tensor it reads each piece, checks every block hash, the piece checksum in
the file and in the index, that padding is zero, merges the pieces into the
logical tensor and, with --synth-seed, compares the values with the formula
of `tp-ckpt synth` (docs/TOOLS.md), recomputed here in numpy.

With --compare OTHER, it also merges every tensor of OTHER (any layout)
the same way and requires bit-identical logical tensors and equal tensor
sets: an independent check of a reshard.

Usage: check_h5py.py CKPT_DIR [--synth-seed N] [--compare OTHER] [--dump NAME OUT.npy]
Exit 0 when everything matches, 1 otherwise (one line per problem).
"""
import json
import os
import sys

import h5py
import numpy as np
import xxhash

try:
    import zstandard

    def zstd_decompress(frame):
        return zstandard.ZstdDecompressor().decompress(frame)
except ImportError:
    # A Python without the zstandard module (a GPU machine's image): the
    # zstd library itself, through ctypes. Our frames record their size.
    import ctypes
    import ctypes.util

    _zstd = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    _zstd.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
    _zstd.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    _zstd.ZSTD_decompress.restype = ctypes.c_size_t
    _zstd.ZSTD_decompress.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    _zstd.ZSTD_isError.restype = ctypes.c_uint
    _zstd.ZSTD_isError.argtypes = [ctypes.c_size_t]

    def zstd_decompress(frame):
        size = _zstd.ZSTD_getFrameContentSize(frame, len(frame))
        assert size < (1 << 63), "a zstd frame without its content size"
        out = ctypes.create_string_buffer(max(size, 1))
        n = _zstd.ZSTD_decompress(out, size, frame, len(frame))
        assert not _zstd.ZSTD_isError(n) and n == size, "a corrupt zstd frame"
        return out.raw[:n]

M64 = (1 << 64) - 1


def attr_int(value):
    """An integer attribute, stored as an array of one (numpy 2 refuses int()
    of any array with dimensions)."""
    values = np.asarray(value).reshape(-1)
    assert values.size == 1, "an attribute of %d values where one was expected" % values.size
    return int(values[0])


def resolve(path):
    if os.path.exists(os.path.join(path, "index.json")):
        return path
    with open(os.path.join(path, "latest")) as f:
        return os.path.join(path, f.read().strip())


def raw_piece_bytes(dset, path):
    """The stored bytes of a dataset, read beside HDF5: contiguous data at its
    file offset, chunks through read_direct_chunk and zstandard."""
    shape = dset.shape
    itemsize = dset.id.get_type().get_size()
    row_bytes = itemsize * (int(np.prod(shape[1:])) if len(shape) > 1 else 1)
    total = row_bytes * shape[0]
    if dset.chunks is None:
        offset = dset.id.get_offset()
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(total)
        assert len(data) == total, "short read"
        return data
    # The pipeline is HDF5's shuffle (filter 2) then zstd (filter 32015);
    # bit k of a chunk's filter mask says stage k was skipped.
    plist = dset.id.get_create_plist()
    assert [plist.get_filter(k)[0] for k in range(plist.get_nfilters())] == [2, 32015]
    chunk_rows = dset.chunks[0]
    out = bytearray()
    for r in range(0, shape[0], chunk_rows):
        mask, chunk = dset.id.read_direct_chunk((r,) + (0,) * (len(shape) - 1))
        if mask & 2 == 0:
            chunk = zstd_decompress(chunk)
        if mask & 1 == 0:
            chunk = np.frombuffer(chunk, np.uint8).reshape(itemsize, -1).T.tobytes()
        rows = min(chunk_rows, shape[0] - r)
        out += chunk[: rows * row_bytes]
    return bytes(out)


def values_from_bytes(data, dtype, shape):
    """fp32 values of raw little-endian bytes in the stored dtype."""
    if dtype == "fp32":
        return np.frombuffer(data, "<f4").reshape(shape)
    if dtype == "bf16":
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(data, "<f2").astype(np.float32).reshape(shape)


def round_to(values, dtype):
    """Round fp32 values to the stored dtype (nearest, ties to even), as fp32."""
    if dtype == "fp32":
        return values
    if dtype == "fp16":
        return values.astype(np.float16).astype(np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def synth_values(seed, seed_name, count, mean, scale):
    h = xxhash.xxh3_64_intdigest(seed_name.encode())
    key = np.uint64(((seed * 0x9E3779B97F4A7C15) & M64) ^ h)
    index = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = key + index * np.uint64(0xD1B54A32D192ED03)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = ((z >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float32) * np.float32(1.0 / (1 << 23))
    return np.float32(mean) + np.float32(scale) * u


def synth_rule(tensor, config):
    """(seed name, mean, scale) of a tensor as `tp-ckpt synth` generates it."""
    role, name = tensor["role"], tensor["name"]
    if role in ("param", "master"):
        param = tensor["param"]
        base = param.split("/", 1)[1]
        layers = config["layers"]
        if base.endswith(("ln1.weight", "ln2.weight", "final_norm.weight")):
            return param, 1.0, 0.02
        if base.endswith(("attn.proj.weight", "mlp.proj.weight")):
            return param, 0.0, float(np.float32(0.02) / np.sqrt(np.float32(2.0 * layers)))
        return param, 0.0, 0.02
    if role == "exp_avg":
        return name, 0.0, 1e-3
    if role == "exp_avg_sq":
        return name, 1e-6, 1e-6
    raise ValueError("unknown role " + role)


def splitmix64(z):
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def logical_digest(bits):
    """docs/FORMAT.md "Logical digests": sum of x_i * K[i % 4096] * F[i // 4096] mod 2^64."""
    x = bits.reshape(-1).astype(np.uint64)
    i = np.arange(x.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        k = (splitmix64(np.uint64(0x7470636B70744B00) + (i % np.uint64(4096))) & np.uint64(0xFFFFFFFF)) | np.uint64(1)
        f = splitmix64(np.uint64(0x7470636B70744600) + i // np.uint64(4096)) | np.uint64(1)
        return int(np.sum(x * k * f, dtype=np.uint64))


def merge(tensor, pieces, tp, disagree=None):
    """The logical tensor from its pieces (docs/FORMAT.md "Partition"), and
    the padding it leaves out. A replicated segment (replicate_small_segments,
    fewer granules than ranks) takes each granule from its first holder;
    replicas that differ from it are appended to disagree as (segment,
    granule, rank)."""
    part = tensor["partition"]
    if part["kind"] == "replicated":
        return pieces[0], []
    axis, granule, pad = part["axis"], part["granule"], part["pad_multiple"]
    replicate = part.get("replicate_small_segments", False)
    out, padding, local = [], [], 0
    for s, size in enumerate(part["segments"]):
        granules = size // granule
        if replicate and granules < tp:
            holders = tp // granules
            share = granule
            rows = lambda r: np.take(pieces[r], range(local, local + share), axis=axis)  # noqa: E731
            out.append(np.concatenate([rows(g * holders) for g in range(granules)], axis=axis))
            for r in range(tp):
                if not np.array_equal(rows(r), rows(r // holders * holders), equal_nan=True) and disagree is not None:
                    disagree.append((s, r // holders, r))
            local += share
            continue
        padded = size if pad == 0 else -(-size // (tp * pad * granule)) * (tp * pad * granule)
        share = padded // tp
        full = np.concatenate([np.take(p, range(local, local + share), axis=axis) for p in pieces], axis=axis)
        out.append(np.take(full, range(size), axis=axis))
        padding.append(np.take(full, range(size, padded), axis=axis))
        local += share
    return np.concatenate(out, axis=axis), padding


def text(value):
    """A string attribute: fixed-length (format 1.1) ones come as bytes."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def check_metadata(ckpt, index, problems):
    """Format 1.1: each file's size and the XXH3 of its bytes outside the
    pieces' extents (contiguous offset/length, compressed chunks)."""
    extents = {}
    for tensor in index["tensors"]:
        for piece in tensor["pieces"]:
            if "chunks" in piece:
                spans = [(c[0], c[1]) for c in piece["chunks"]]
            elif "offset" in piece:
                spans = [(piece["offset"], piece["length"])]
            else:
                spans = []
            extents.setdefault(piece["file"], []).extend(spans)
    for entry in index["files"]:
        if "meta_checksum" not in entry:
            continue
        with open(os.path.join(ckpt, entry["name"]), "rb") as f:
            data = f.read()
        if len(data) != entry["bytes"]:
            problems.append(f"{entry['name']}: {len(data)} bytes, the index says {entry['bytes']}")
            continue
        h, pos = xxhash.xxh3_64(), 0
        for offset, length in sorted(extents.get(entry["name"], [])):
            h.update(data[pos:offset])
            pos = offset + length
        h.update(data[pos:])
        if f"{h.intdigest():016x}" != entry["meta_checksum"]:
            problems.append(f"{entry['name']}: metadata checksum {h.intdigest():016x}, the index says "
                            f"{entry['meta_checksum']}")


def check_shard_tensors(ckpt, index, problems):
    """Format 1.6: each file's shard_tensors, where written, is the number of
    tensors with a piece in its shard, whichever of the shard's files holds it."""
    held = {}
    for tensor in index["tensors"]:
        for piece in tensor["pieces"]:
            shard = (tensor["stage"], piece["tp"])
            held[shard] = held.get(shard, 0) + 1
    for entry in index["files"]:
        with h5py.File(os.path.join(ckpt, entry["name"]), "r") as f:
            if "shard_tensors" not in f.attrs:
                continue
            declared = attr_int(f.attrs["shard_tensors"])
        if declared != held.get((entry["pp"], entry["tp"]), 0):
            problems.append(f"{entry['name']}: shard_tensors {declared}, its shard's files hold "
                            f"{held.get((entry['pp'], entry['tp']), 0)}")


def read_logical(ckpt, index, tensor, files, problems):
    """Checks every piece of a tensor and merges it: (logical values as
    float32, logical raw bits), or None after a problem."""
    name, dtype = tensor["name"], tensor["dtype"]
    tp = index["layout"]["tp"]
    pieces, raw = [], []
    for p, piece in enumerate(tensor["pieces"]):
        path = os.path.join(ckpt, piece["file"])
        if path not in files:
            files[path] = h5py.File(path, "r")
        f = files[path]
        entry = next((e for e in index["files"] if e["name"] == piece["file"]), None)
        if entry is None or entry["pp"] != tensor["stage"] or entry["tp"] != piece["tp"]:
            problems.append(f"{name} piece {p}: in {piece['file']}, not a file of its shard in 'files'")
            return None
        # Format 1.6: a shard's data-parallel file says which it is, and holds
        # optimizer state only before 1.7 (ZeRO-3's parameters since).
        dp = entry.get("dp", 0)
        stored_dp = attr_int(f.attrs["shard_dp"]) if "shard_dp" in f.attrs else 0
        if stored_dp != dp:
            problems.append(f"{piece['file']}: attribute shard_dp disagrees with the index's dp {dp}")
        if dp and tensor["role"] == "param" and index["format_version"] < [1, 7]:
            problems.append(f"{name} piece {p}: a parameter in data-parallel file {piece['file']} (format "
                            f"{index['format_version']})")
        dset = f["tensors/" + name]
        if list(dset.shape) != piece["shape"]:
            problems.append(f"{name} piece {p}: shape {dset.shape} != index {piece['shape']}")
            return None
        if text(dset.attrs["dtype"]) != dtype or attr_int(dset.attrs["piece"]) != p:
            problems.append(f"{name} piece {p}: attributes disagree with the index")
        data = raw_piece_bytes(dset, path)
        rows = dset.shape[0]
        row_bytes = len(data) // rows
        block_rows = attr_int(dset.attrs["checksum_block_rows"])
        stored = f["checksums/" + name][...]
        hashes = [xxhash.xxh3_64_intdigest(data[b * row_bytes: min(b + block_rows, rows) * row_bytes])
                  for b in range(0, rows, block_rows)]
        if list(map(int, stored)) != hashes:
            problems.append(f"{name} piece {p}: block hashes differ")
        checksum = xxhash.xxh3_64_intdigest(np.array(hashes, dtype="<u8").tobytes())
        if checksum != attr_int(dset.attrs["checksum"]) or f"{checksum:016x}" != piece["checksum"]:
            problems.append(f"{name} piece {p}: piece checksum differs")
        values = values_from_bytes(data, dtype, dset.shape)
        raw.append(np.frombuffer(data, "<u4" if dtype == "fp32" else "<u2").reshape(dset.shape))
        # h5py's own conversion of the stored type must agree (bf16/fp16 as
        # floats). Compressed data needs the zstd plugin, absent here: the
        # chunks were already decoded above with zstandard.
        if dset.chunks is None and not np.array_equal(dset[...].astype(np.float32), values, equal_nan=True):
            problems.append(f"{name} piece {p}: h5py reads different values than the raw bytes")
        pieces.append(values)
    disagree = []
    logical, padding = merge(tensor, pieces, tp)
    bits = merge(tensor, raw, tp, disagree)[0]
    for segment, g, r in disagree:
        problems.append(f"{name}: segment {segment} granule {g}: the replica on rank {r} differs from its first holder's")
    if list(logical.shape) != tensor["shape"]:
        problems.append(f"{name}: merged shape {logical.shape} != {tensor['shape']}")
        return None
    if any(np.count_nonzero(p) for p in padding):
        problems.append(f"{name}: padding is not zero")
    digest = logical_digest(bits)
    if f"{digest:016x}" != tensor["digest"]:
        problems.append(f"{name}: logical digest {digest:016x} != index {tensor['digest']}")
    pieces_sum = sum(int(p["digest"], 16) for p in tensor["pieces"]) % (1 << 64)
    if pieces_sum != digest:
        problems.append(f"{name}: piece digests do not add up to the tensor's")
    return logical, bits


def load_index(path):
    ckpt = resolve(path)
    with open(os.path.join(ckpt, "index.json")) as f:
        index = json.load(f)
    assert index["format"] == "tp-ckpt" and index["format_version"][0] == 1
    return ckpt, index


def main(argv):
    ckpt, index = load_index(argv[1])
    seed = int(argv[argv.index("--synth-seed") + 1]) if "--synth-seed" in argv else None
    dump = argv[argv.index("--dump") + 1: argv.index("--dump") + 3] if "--dump" in argv else None
    other = load_index(argv[argv.index("--compare") + 1]) if "--compare" in argv else None
    problems = []
    files, other_files = {}, {}
    checked = 0
    check_metadata(ckpt, index, problems)
    if problems:  # damaged metadata: not for libhdf5 to parse
        for p in problems:
            print("check_h5py: " + p)
        return 1
    check_shard_tensors(ckpt, index, problems)
    if other:
        names = {t["name"] for t in index["tensors"]}
        other_names = {t["name"] for t in other[1]["tensors"]}
        for n in sorted(names ^ other_names):
            problems.append(f"{n}: in one checkpoint only")
        other_tensors = {t["name"]: t for t in other[1]["tensors"]}
    for tensor in index["tensors"]:
        name, dtype = tensor["name"], tensor["dtype"]
        result = read_logical(ckpt, index, tensor, files, problems)
        if result is None:
            continue
        logical, bits = result
        if seed is not None:
            seed_name, mean, scale = synth_rule(tensor, index["model"])
            expect = round_to(synth_values(seed, seed_name, logical.size, mean, scale), dtype).reshape(logical.shape)
            if not np.array_equal(expect, logical):
                bad = int(np.count_nonzero(expect != logical))
                problems.append(f"{name}: {bad} of {logical.size} values differ from the synth formula")
        if other and name in other_tensors:
            theirs = read_logical(other[0], other[1], other_tensors[name], other_files, problems)
            if theirs is not None and (other_tensors[name]["dtype"] != dtype or not np.array_equal(theirs[1], bits)):
                problems.append(f"{name}: differs from {other[0]}")
        if dump and dump[0] == name:
            np.save(dump[1], logical)
        checked += 1
    for f in list(files.values()) + list(other_files.values()):
        f.close()
    for p in problems:
        print("check_h5py: " + p)
    print(f"check_h5py: {checked} tensors read, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
