#!/usr/bin/python3
"""Independent checks of `tp-ckpt export` and `tp-train eval/generate`.

Written from the formats' own specifications (safetensors: the Hugging Face
README; GGUF v3: ggml's docs/gguf.md and llama.cpp's loader rules) and from
Hugging Face's GPT-2 naming, with struct, json, numpy, h5py and torch only:
no code of the project. Checkpoints are merged with the independent reader
tests/ckpt/check_h5py.py.

  check_export.py safetensors DIR CKPT [--data F --windows N --seq T --loss X]
      Parses every file (8-byte little-endian header length, JSON header,
      offsets contiguous from 0, no trailing bytes, __metadata__ strings with
      format "pt"), the index of a sharded export and config.json; compares
      every tensor with the checkpoint bit for bit (Conv1D weights are the
      transposes; a dtype change rounds to nearest even); with --loss, loads
      the weights into the PyTorch GPT-2 (gpt2_ref.py) and compares its mean
      cross-entropy on the token windows with X (1e-5 relative).
  check_export.py gguf FILE CKPT [--tokenizer DIR] [--name N] [--text F --prepared F]
      Parses the GGUF v3 file (key types llama.cpp checks, alignment and
      offset rules, the gpt2 tensor names, general.type "model", general.name
      N or the default, general.size_label in gguf-py's notation of the
      tensors' parameter count, which must be the model's) and compares every
      tensor. The vocabulary: with --tokenizer, vocab.json in id order
      ([PADn] unused for missing ids, <|...|> control), merges.txt and
      <|endoftext|> as BOS/EOS; else, for a byte-level model (256 tokens),
      GPT-2's bytes_to_unicode symbols in byte order, all normal, no merges,
      BOS/EOS u32 tokens of the vocabulary, none added; else no_vocab and no
      other tokenizer key. With --text and --prepared (the token file
      `tp-train prepare` made of that text), tokenizes the text as llama.cpp's
      gpt2 tokenizer does with the file's vocabulary and requires exactly
      the file's tokens.
  check_export.py hdf5 FILE CKPT
      Reads every dataset with h5py and compares it.
  check_export.py generate CKPT --prompt P --tokens N
      Prints the greedy continuation of the PyTorch GPT-2 (the prompt's bytes
      are the tokens), to compare with `tp-train generate --temperature 0`.
  check_export.py transformers DIR --data F --windows N --seq T --loss X
      Loads DIR with transformers' GPT2LMHeadModel (or LlamaForCausalLM, by
      config.json's model_type) from_pretrained and compares its loss with X;
      exit 77 (skipped) where transformers is not installed.
A Llama checkpoint ("arch": "llama") is checked against Hugging Face's
LlamaForCausalLM names (q_proj, k_proj and v_proj the row ranges of our
fused QKV, gate_proj and up_proj those of the SwiGLU input, lm_head when
untied) and llama.cpp's llama architecture (its keys; attn_q and attn_k
with the rows of each head permuted as convert_hf_to_gguf.py's
LlamaModel.permute does, undone here before comparing); --loss loads the
weights into the PyTorch Llama (llama_ref.py).
Exit 0 when everything matches, 1 otherwise (one line per problem).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ckpt"))
sys.path.insert(0, HERE)
import check_h5py  # noqa: E402
from gpt2_ref import GPT2  # noqa: E402
from llama_ref import Llama  # noqa: E402

PROBLEMS = []


def problem(text):
    PROBLEMS.append(text)
    print("check_export: " + text)


# ---------------------------------------------------------------- checkpoint

def merged_params(path):
    """{name: (fp32 values, raw bits, dtype)} of the checkpoint's parameters."""
    ckpt, index = check_h5py.load_index(path)
    files, problems, out = {}, [], {}
    for tensor in index["tensors"]:
        if tensor["role"] != "param":
            continue
        result = check_h5py.read_logical(ckpt, index, tensor, files, problems)
        if result is not None:
            out[tensor["name"]] = (np.array(result[0], np.float32), np.array(result[1]), tensor["dtype"])
    for f in files.values():
        f.close()
    for p in problems:
        problem("reading the checkpoint: " + p)
    return out, index


def expected_bits(values, bits, dtype, out_dtype):
    """Raw bits of a tensor written in out_dtype (round to nearest even)."""
    if out_dtype == dtype:
        return bits
    rounded = check_h5py.round_to(values, out_dtype)
    if out_dtype == "fp32":
        return rounded.view(np.uint32)
    if out_dtype == "fp16":
        return rounded.astype(np.float16).view(np.uint16)
    return (rounded.view(np.uint32) >> 16).astype(np.uint16)


# GPT-2 in Hugging Face's names (GPT2LMHeadModel): Conv1D weights are [in, out].
HF_LAYER = [("ln1", "ln_1", False), ("attn.qkv", "attn.c_attn", True), ("attn.proj", "attn.c_proj", True),
            ("ln2", "ln_2", False), ("mlp.fc", "mlp.c_fc", True), ("mlp.proj", "mlp.c_proj", True)]
# llama.cpp's gpt2 names; torch layout [out, in] throughout.
GGUF_LAYER = [("ln1", "attn_norm"), ("attn.qkv", "attn_qkv"), ("attn.proj", "attn_output"), ("ln2", "ffn_norm"),
              ("mlp.fc", "ffn_up"), ("mlp.proj", "ffn_down")]


def hf_names(layers):
    """{Hugging Face name: (our name, transposed)}"""
    names = {"transformer.wte.weight": ("model/tok_embed.weight", False),
             "transformer.wpe.weight": ("model/pos_embed.weight", False),
             "transformer.ln_f.weight": ("model/final_norm.weight", False),
             "transformer.ln_f.bias": ("model/final_norm.bias", False)}
    for i in range(layers):
        for ours, theirs, transposed in HF_LAYER:
            names[f"transformer.h.{i}.{theirs}.weight"] = (f"model/layers.{i}.{ours}.weight", transposed)
            names[f"transformer.h.{i}.{theirs}.bias"] = (f"model/layers.{i}.{ours}.bias", False)
    return names


def gguf_names(layers):
    names = {"token_embd.weight": "model/tok_embed.weight", "position_embd.weight": "model/pos_embed.weight",
             "output_norm.weight": "model/final_norm.weight", "output_norm.bias": "model/final_norm.bias"}
    for i in range(layers):
        for ours, theirs in GGUF_LAYER:
            for kind in ("weight", "bias"):
                names[f"blk.{i}.{theirs}.{kind}"] = f"model/layers.{i}.{ours}.{kind}"
    return names


# Llama in Hugging Face's names (LlamaForCausalLM) and llama.cpp's: each
# maps to (our tensor, part); parts are row ranges of the fused tensors.
LLAMA_HF = [("ln1", "input_layernorm", None), ("attn.qkv", "self_attn.q_proj", "q"),
            ("attn.qkv", "self_attn.k_proj", "k"), ("attn.qkv", "self_attn.v_proj", "v"),
            ("attn.proj", "self_attn.o_proj", None), ("ln2", "post_attention_layernorm", None),
            ("mlp.fc", "mlp.gate_proj", "gate"), ("mlp.fc", "mlp.up_proj", "up"), ("mlp.proj", "mlp.down_proj", None)]
LLAMA_GGUF = [("ln1", "attn_norm", None), ("attn.qkv", "attn_q", "q"), ("attn.qkv", "attn_k", "k"),
              ("attn.qkv", "attn_v", "v"), ("attn.proj", "attn_output", None), ("ln2", "ffn_norm", None),
              ("mlp.fc", "ffn_gate", "gate"), ("mlp.fc", "ffn_up", "up"), ("mlp.proj", "ffn_down", None)]


def llama_names(model, gguf):
    """{outside name: (our name, part)} of a Llama checkpoint."""
    tied = model.get("tied_embeddings", False)
    if gguf:
        names = {"token_embd.weight": ("model/tok_embed.weight", None),
                 "output_norm.weight": ("model/final_norm.weight", None)}
        if not tied:
            names["output.weight"] = ("model/output.weight", None)
    else:
        names = {"model.embed_tokens.weight": ("model/tok_embed.weight", None),
                 "model.norm.weight": ("model/final_norm.weight", None)}
        if not tied:
            names["lm_head.weight"] = ("model/output.weight", None)
    for i in range(model["layers"]):
        for ours, theirs, part in LLAMA_GGUF if gguf else LLAMA_HF:
            names[(f"blk.{i}.{theirs}.weight" if gguf else f"model.layers.{i}.{theirs}.weight")] = \
                (f"model/layers.{i}.{ours}.weight", part)
    return names


def llama_part(model, array, part):
    """Rows of a fused tensor: Q, K, V of [q; k; v], gate and up of [gate; up]."""
    hd = model["dim"] // model["heads"]
    q, kv, f = model["heads"] * hd, model["kv_heads"] * hd, model["ffn"]
    ranges = {None: (0, array.shape[0]), "q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv),
              "gate": (0, f), "up": (f, 2 * f)}
    a, b = ranges[part]
    return array[a:b]


def unpermute_rope(array, heads):
    """Undoes llama.cpp's LlamaModel.permute (w.reshape(n_head, 2, hd/2,
    D).swapaxes(1, 2)): row h hd + 2 i + a of the file back to h hd + a hd/2 + i."""
    rows, cols = array.shape
    hd = rows // heads
    return array.reshape(heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def rope_factors(model):
    """convert_hf_to_gguf.py's rope_freqs for Llama 3's scaling: for each
    frequency of transformers' inv_freq (fp32), 1 below the high-frequency
    wavelength, factor above the low one, 1 / ((1 - smooth) / factor + smooth)
    between. As float32."""
    scaling, hd = model["rope_scaling"], model["dim"] // model["heads"]
    freqs = 1.0 / (model["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * 3.141592653589793 / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def llama_parameters(model):
    """The logical parameters of the Llama the checkpoint describes."""
    v, d, f, layers = model["vocab"], model["dim"], model["ffn"], model["layers"]
    kv = model["kv_heads"] * (d // model["heads"])
    per_layer = 2 * d + d * d + 2 * kv * d + d * d + 3 * d * f
    return v * d * (1 if model.get("tied_embeddings") else 2) + layers * per_layer + d


# --------------------------------------------------------------- safetensors

ST_DTYPES = {"F32": ("<u4", 4, "fp32"), "BF16": ("<u2", 2, "bf16"), "F16": ("<u2", 2, "fp16")}


def read_safetensors(path):
    """{name: (raw bits array, dtype name)} and __metadata__ of one file."""
    raw = open(path, "rb").read()
    if len(raw) < 8:
        problem(f"{path}: shorter than the 8-byte header length")
        return {}, {}
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        problem(f"{path}: header length {n} runs past the end")
        return {}, {}
    text = raw[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        problem(f"{path}: the header does not start with '{{'")
    if (8 + n) % 8:
        problem(f"{path}: data starts at {8 + n}, not 8-byte aligned")
    header = json.loads(text)
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    if meta is None or not all(isinstance(v, str) for v in meta.values()) or meta.get("format") != "pt":
        problem(f"{path}: __metadata__ must map strings to strings with format 'pt': {meta}")
    spans, out = [], {}
    for name, entry in header.items():
        if entry["dtype"] not in ST_DTYPES:
            problem(f"{path}: {name}: dtype {entry['dtype']}")
            continue
        code, size, dtype = ST_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = int(np.prod(entry["shape"], dtype=np.int64))
        if end - begin != count * size:
            problem(f"{path}: {name}: {end - begin} bytes for shape {entry['shape']}")
            continue
        spans.append((begin, end, name))
        out[name] = (np.frombuffer(data[begin:end], code).reshape(entry["shape"]), dtype)
    covered = 0
    for begin, end, name in sorted(spans):
        if begin != covered:
            problem(f"{path}: {name} starts at {begin}, expected {covered} (gap or overlap)")
        covered = end
    if covered != len(data):
        problem(f"{path}: tensors cover {covered} bytes, the data section holds {len(data)}")
    return out, meta or {}


def check_safetensors(a):
    params, index = merged_params(a.ckpt)
    model = index["model"]
    layers = model["layers"]
    index_path = os.path.join(a.dir, "model.safetensors.index.json")
    tensors, meta = {}, None
    if os.path.exists(index_path):
        idx = json.load(open(index_path))
        files = sorted(set(idx["weight_map"].values()))
        total = 0
        for name in files:
            got, m = read_safetensors(os.path.join(a.dir, name))
            meta = meta or m
            for t, (bits, dtype) in got.items():
                if idx["weight_map"].get(t) != name:
                    problem(f"{name}: {t} is not mapped to this file in the index")
                total += bits.nbytes
            tensors.update(got)
        if idx["metadata"]["total_size"] != total:
            problem(f"index total_size {idx['metadata']['total_size']} != {total}")
        count = len(files)
        for i, name in enumerate(files):
            if name != f"model-{i + 1:05d}-of-{count:05d}.safetensors":
                problem(f"shard file name {name}")
    else:
        tensors, meta = read_safetensors(os.path.join(a.dir, "model.safetensors"))
    if meta.get("tp_toolkit.step") != str(index["step"]):
        problem(f"__metadata__ step {meta.get('tp_toolkit.step')} != {index['step']}")
    layout = index["layout"]
    if meta.get("tp_toolkit.source_layout") != f"tp{layout['tp']}pp{layout['pp']}":
        problem(f"__metadata__ source layout {meta.get('tp_toolkit.source_layout')}")
    config = json.load(open(os.path.join(a.dir, "config.json")))
    if model.get("arch") == "llama":
        check_llama_safetensors(a, params, model, tensors, config)
        return
    want = {"model_type": "gpt2", "n_layer": layers, "n_embd": model["dim"], "n_head": model["heads"],
            "vocab_size": model["vocab"], "n_positions": model["seq"], "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "architectures": ["GPT2LMHeadModel"]}
    for key, value in want.items():
        if config.get(key) != value:
            problem(f"config.json: {key} is {config.get(key)!r}, expected {value!r}")
    if (config.get("n_inner") or 4 * model["dim"]) != model["ffn"]:
        problem(f"config.json: n_inner {config.get('n_inner')} for ffn {model['ffn']}")
    names = hf_names(layers)
    ours = compare_tensors(tensors, params, names, "GPT2LMHeadModel's",
                           lambda bits, transposed: bits.T if transposed else bits,
                           lambda want, transposed: want)
    print(f"check_export: safetensors: {len(tensors)} tensors compared with {a.ckpt}")
    if a.loss is not None and len(ours) == len(names):
        check_loss(model, {name: parts[0] for name, parts in ours.items()}, a)


def compare_tensors(tensors, params, names, whose, ours_of, want_of):
    """Every outside tensor ({name: (bits, dtype)}) against the checkpoint's
    parameters: names maps an outside name to (our name, how); ours_of(bits,
    how) is the outside tensor in our layout, want_of(bits, how) the part of
    ours it holds. Returns {our name: [its values as exported, in order]}."""
    if set(tensors) != set(names):
        problem(f"tensor names differ from {whose}: extra {sorted(set(tensors) - set(names))}, "
                f"missing {sorted(set(names) - set(tensors))}")
    ours = {}
    for theirs, (name, how) in names.items():
        if theirs not in tensors or name not in params:
            continue
        bits, out_dtype = tensors[theirs]
        values, source_bits, dtype = params[name]
        want_bits = want_of(expected_bits(values, source_bits, dtype, out_dtype), how)
        got = ours_of(bits, how)
        if got.shape != want_bits.shape or not np.array_equal(got, want_bits):
            problem(f"{theirs}: differs from {name}" + ("" if not how else " transposed" if how is True else " " + how))
        ours.setdefault(name, []).append(
            check_h5py.values_from_bytes(np.ascontiguousarray(got).tobytes(), out_dtype, got.shape).copy())
    return ours


def check_llama_safetensors(a, params, model, tensors, config):
    """A LlamaForCausalLM directory: config.json, every tensor a row range of ours."""
    hd = model["dim"] // model["heads"]
    want = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": model["layers"],
            "hidden_size": model["dim"], "num_attention_heads": model["heads"],
            "num_key_value_heads": model["kv_heads"], "intermediate_size": model["ffn"], "vocab_size": model["vocab"],
            "max_position_embeddings": model["seq"], "hidden_act": "silu", "head_dim": hd,
            "rms_norm_eps": model["norm_eps"], "rope_theta": model["rope_theta"],
            "tie_word_embeddings": model["tied_embeddings"], "attention_bias": False, "mlp_bias": False}
    scaling = model.get("rope_scaling")
    want["rope_scaling"] = dict(scaling, rope_type="llama3") if scaling else None
    for key, value in want.items():
        if config.get(key) != value:
            problem(f"config.json: {key} is {config.get(key)!r}, expected {value!r}")
    names = llama_names(model, gguf=False)
    fused = compare_tensors(tensors, params, names, "LlamaForCausalLM's", lambda bits, part: bits,
                            lambda want, part: llama_part(model, want, part))
    print(f"check_export: safetensors: {len(tensors)} tensors compared with {a.ckpt} (Llama)")
    if a.loss is not None and len(fused) == len({n for n, _ in names.values()}):
        # The weights as the export holds them, fused back (parts in row order) into the reference's tensors.
        check_loss(model, {name: np.concatenate(parts) for name, parts in fused.items()}, a)


def windows(path, count, seq):
    tokens = np.fromfile(path, dtype="<u2", offset=256 * 4).astype(np.int64)
    x = np.stack([tokens[i * seq:i * seq + seq] for i in range(count)])
    y = np.stack([tokens[i * seq + 1:i * seq + seq + 1] for i in range(count)])
    return torch.from_numpy(x), torch.from_numpy(y)


def reference_model(model, weights):
    torch.set_num_threads(1)
    if model.get("arch") == "llama":
        m = Llama.from_config(model)
    else:
        m = GPT2(model["layers"], model["dim"], model["heads"], model["vocab"], model["seq"], model["ffn"])
    m.load_named(weights)
    return m


def check_loss(model, weights, a):
    m = reference_model(model, weights)
    x, y = windows(a.data, a.windows, a.seq)
    with torch.no_grad():
        logits = m(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    rel = abs(loss - a.loss) / abs(loss)
    status = "ok" if rel <= 1e-5 else "FAIL"
    print(f"check_export: loss of the safetensors weights in PyTorch {loss:.9g}, tp-train eval {a.loss:.9g}: "
          f"{rel:.2e} relative (tolerance 1e-5) {status}")
    if rel > 1e-5:
        problem("loss differs")


# ---------------------------------------------------------------------- GGUF

GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGML_TYPES = {0: ("<u4", 4, "fp32"), 1: ("<u2", 2, "fp16"), 30: ("<u2", 2, "bf16")}


class Reader:
    def __init__(self, raw):
        self.raw, self.at = raw, 0

    def take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.raw, self.at)
        self.at += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.raw[self.at:self.at + n].decode("utf-8")
        self.at += n
        return s

    def value(self, kind):
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, n = self.take("<I"), self.take("<Q")
            return (inner, [self.value(inner) for _ in range(n)])
        return self.take(GGUF_SCALARS[kind])


def bytes_to_unicode():
    """GPT-2's byte-to-symbol table, as openai/gpt-2's encoder.py defines it:
    the printable bytes ! .. ~, U+00A1 .. U+00AC and U+00AE .. U+00FF stand
    for themselves; every other byte, in increasing order, for the next code
    point from 256 on. {byte: symbol}"""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(2 ** 8):
        if b not in bs:
            bs.append(b)
            cs.append(2 ** 8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def size_label(count):
    """gguf-py's model_weight_count_rounded_notation(count, min_digits=2)."""
    if count > 1e12:
        scaled, suffix = count * 1e-12, "T"
    elif count > 1e9:
        scaled, suffix = count * 1e-9, "B"
    elif count > 1e6:
        scaled, suffix = count * 1e-6, "M"
    else:
        scaled, suffix = count * 1e-3, "K"
    fix = max(2 - len(str(round(scaled)).lstrip("0")), 0)
    return f"{scaled:.{fix}f}{suffix}"


def gpt_parameters(model):
    """The logical parameters of the GPT-2 the checkpoint describes."""
    v, d, s, f, layers = model["vocab"], model["dim"], model["seq"], model["ffn"], model["layers"]
    per_layer = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (f * d + f) + (d * f + d)
    return v * d + s * d + layers * per_layer + 2 * d


def prepared_tokens(path):
    """The tokens of a token file (llm.c's format, docs/DATA.md: 256 int32 of
    header, magic 20240520, version 1, the count at [2]; then uint16 tokens)."""
    header = np.fromfile(path, dtype="<i4", count=256)
    if len(header) != 256 or header[0] != 20240520 or header[1] != 1:
        problem(f"{path}: not a token file")
        return []
    tokens = np.fromfile(path, dtype="<u2", count=int(header[2]), offset=1024)
    if len(tokens) != header[2]:
        problem(f"{path}: {len(tokens)} tokens, the header says {header[2]}")
    return tokens.tolist()


def llama_utf8(data):
    """What llama.cpp's tokenizer makes of the bytes of a text: it decodes
    them as UTF-8 (unicode_cpts_from_utf8: a byte that does not start a
    complete sequence becomes U+FFFD and is skipped) and encodes the code
    points again (unicode_cpt_to_utf8). Valid UTF-8 comes back unchanged."""
    out, at = bytearray(), 0
    while at < len(data):
        b = data[at]
        size = 1 if b < 0x80 else 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 0
        tail = data[at + 1:at + size]
        if size == 0 or len(tail) != size - 1 or any(c >> 6 != 2 for c in tail):
            out += "\ufffd".encode("utf-8")
            at += 1
            continue
        cp = b & (0x7F, 0x1F, 0x0F, 0x07)[size - 1]
        for c in tail:
            cp = cp << 6 | c & 0x3F
        if cp > 0x10FFFF:
            problem(f"--text: code point {cp:#x} at byte {at}: llama.cpp cannot encode it")
        out += bytes([cp]) if cp < 0x80 else bytes([0xC0 | cp >> 6, 0x80 | cp & 0x3F]) if cp < 0x800 else \
            bytes([0xE0 | cp >> 12, 0x80 | cp >> 6 & 0x3F, 0x80 | cp & 0x3F]) if cp < 0x10000 else \
            bytes([0xF0 | cp >> 18 & 0x07, 0x80 | cp >> 12 & 0x3F, 0x80 | cp >> 6 & 0x3F, 0x80 | cp & 0x3F])
        at += size
    return bytes(out)


def llama_tokenize(data, tokens, merges):
    """llama.cpp's gpt2 tokenizer (llm_tokenizer_bpe_session) for a vocabulary
    without merges: the text's UTF-8 (llama_utf8) pre-tokenized into words
    (which only cuts the text: with no merges, where it cuts changes
    nothing), each word's bytes written as their bytes_to_unicode symbols,
    each symbol looked up in the token list (text_to_token), and a symbol
    that is no token looked up byte by byte. No BOS or EOS added."""
    if merges:
        problem("--text: this emulation tokenizes only vocabularies without merges")
        return None
    table = bytes_to_unicode()
    ids = {t: i for i, t in enumerate(tokens)}
    out = []
    for symbol in (table[b] for b in llama_utf8(data)):
        if symbol in ids:
            out.append(ids[symbol])
        else:
            out.extend(ids[chr(c)] for c in symbol.encode("utf-8") if c < 0x80 and chr(c) in ids)
    return out


# GGUF's token types (llama_token_type).
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5


def check_array(kv, key, element, what):
    """The values of an array key of GGUF element type element, or None."""
    kind, value = kv.get(key, (None, None))
    if kind != 9 or value[0] != element:
        problem(f"{what}: {key} is {str(kv.get(key))[:80]}, expected an array of GGUF type {element}")
        return None
    return value[1]


def check_vocabulary(a, kv, vocab):
    """The tokenizer keys: GPT-2 BPE from --tokenizer, GPT-2's byte symbols
    for a byte-level model (256 tokens) without one, else no_vocab; and, with
    --text, llama.cpp's tokenization of the text with that vocabulary."""
    byte_model = vocab == 256 and not a.tokenizer
    what = "--tokenizer vocabulary" if a.tokenizer else "byte vocabulary" if byte_model else "no vocabulary"
    expected = "gpt2" if a.tokenizer or byte_model else "no_vocab"
    if kv.get("tokenizer.ggml.model") != (8, expected):
        problem(f"tokenizer.ggml.model = {kv.get('tokenizer.ggml.model')}, expected the string {expected} for a "
                f"vocabulary of {vocab}" + ("" if a.tokenizer else " without --tokenizer"))
        return
    if expected == "no_vocab":
        extra = sorted(k for k in kv if k.startswith("tokenizer.") and k != "tokenizer.ggml.model")
        if extra:
            problem(f"no_vocab with tokenizer keys {extra}")
        if a.text:
            problem("--text: a no_vocab file has no tokenizer")
        return
    tokens = check_array(kv, "tokenizer.ggml.tokens", 8, what)
    types = check_array(kv, "tokenizer.ggml.token_type", 5, what)  # int32
    merges = check_array(kv, "tokenizer.ggml.merges", 8, what)
    if tokens is None or types is None or merges is None:
        return
    if len(tokens) != vocab or len(types) != vocab:
        problem(f"{what}: {len(tokens)} tokens and {len(types)} token types for a vocabulary of {vocab}")
        return
    if a.tokenizer and os.path.exists(os.path.join(a.tokenizer, "tokenizer.json")):
        check_hf_tokenizer(a, kv, vocab, tokens, types, merges)
        return
    if kv.get("tokenizer.ggml.pre") != (8, "gpt-2"):
        problem(f"{what}: tokenizer.ggml.pre = {kv.get('tokenizer.ggml.pre')}, expected the string gpt-2")
    if a.tokenizer:
        vocab_json = json.load(open(os.path.join(a.tokenizer, "vocab.json"), encoding="utf-8"))
        by_id = {i: token for token, i in vocab_json.items()}
        for i in range(vocab):
            # Ids vocab.json lacks are padding, unused; <|...|> tokens control.
            token = by_id.get(i, f"[PAD{i}]")
            kind = TOKEN_UNUSED if i not in by_id else \
                TOKEN_CONTROL if len(token) >= 4 and token.startswith("<|") and token.endswith("|>") else TOKEN_NORMAL
            if tokens[i] != token or types[i] != kind:
                problem(f"token {i} is {tokens[i]!r} of type {types[i]}, expected {token!r} of type {kind}")
        want_merges = [l for l in open(os.path.join(a.tokenizer, "merges.txt"), encoding="utf-8").read().splitlines()
                       if l and not l.startswith("#version")]
        if merges != want_merges:
            problem("merges differ from merges.txt")
        eot = vocab_json.get("<|endoftext|>")
        for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            if kv.get(key) != (None if eot is None else (4, eot)):
                problem(f"{what}: {key} = {kv.get(key)}, expected <|endoftext|> ({eot}) as u32")
    else:
        table = bytes_to_unicode()
        if tokens != [table[b] for b in range(256)]:
            wrong = [b for b in range(256) if tokens[b] != table[b]]
            problem(f"{what}: the tokens are not GPT-2's byte symbols in byte order (bytes {wrong[:8]} differ)")
        if types != [TOKEN_NORMAL] * 256:
            problem(f"{what}: token types {sorted(set(types))}, expected all {TOKEN_NORMAL} (normal)")
        if merges:
            problem(f"{what}: {len(merges)} merges, expected none")
        for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"):
            if kv.get(key) != (7, False):
                problem(f"{what}: {key} = {kv.get(key)}, expected the bool false")
        for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            kind, token = kv.get(key, (None, None))
            if kind != 4 or not 0 <= token < vocab:
                problem(f"{what}: {key} = {kv.get(key)} is not a u32 token of the vocabulary")
    if a.text:
        got = llama_tokenize(open(a.text, "rb").read(), tokens, merges)
        want = prepared_tokens(a.prepared)
        if got is None:
            return
        if got != want:
            first = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            problem(f"--text: {len(got)} tokens from the GGUF's vocabulary, {len(want)} in {a.prepared}; "
                    f"first difference at {first}")
        else:
            print(f"check_export: gguf: {len(got)} bytes of {a.text} tokenize as tp-train prepare's tokens")


LLAMA3_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def check_hf_tokenizer(a, kv, vocab, tokens, types, merges):
    """A tokenizer.json (BPE) as llama.cpp's converter writes it: model.vocab
    and added_tokens by id (special added tokens control 3, others
    user-defined 4, missing ids [PADn] unused 5), the merges as "a b", the
    pre-tokenizer's llama.cpp name, BOS/EOS and add_bos_token from
    tokenizer_config.json."""
    t = json.load(open(os.path.join(a.tokenizer, "tokenizer.json"), encoding="utf-8"))
    cfg_path = os.path.join(a.tokenizer, "tokenizer_config.json")
    cfg = json.load(open(cfg_path, encoding="utf-8")) if os.path.exists(cfg_path) else {}
    want = {i: (tok, TOKEN_NORMAL) for tok, i in t["model"]["vocab"].items()}
    for entry in t.get("added_tokens", []):
        want[entry["id"]] = (entry["content"], TOKEN_CONTROL if entry.get("special") else 4)
    for i in range(vocab):
        tok, kind = want.get(i, (f"[PAD{i}]", TOKEN_UNUSED))
        if tokens[i] != tok or types[i] != kind:
            problem(f"token {i} is {tokens[i]!r} of type {types[i]}, expected {tok!r} of type {kind}")
    want_merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
    if merges != want_merges:
        problem("merges differ from tokenizer.json's")
    pre = t.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [])
    name = "gpt-2" if pre.get("type") == "ByteLevel" else "default"
    if any(st.get("type") == "Split" and st.get("pattern", {}).get("Regex") == LLAMA3_SPLIT for st in steps):
        name = "llama-bpe"
    if kv.get("tokenizer.ggml.pre") != (8, name):
        problem(f"tokenizer.ggml.pre = {kv.get('tokenizer.ggml.pre')}, expected the string {name}")
    for key, field in (("tokenizer.ggml.bos_token_id", "bos_token"), ("tokenizer.ggml.eos_token_id", "eos_token")):
        named = cfg.get(field)
        named = named.get("content") if isinstance(named, dict) else named
        ids = [i for i in range(vocab) if tokens[i] == named]
        if kv.get(key) != ((4, ids[0]) if ids else None):
            problem(f"{key} = {kv.get(key)}, expected {named!r} ({ids[:1]}) as u32")
    if "add_bos_token" in cfg and kv.get("tokenizer.ggml.add_bos_token") != (7, cfg["add_bos_token"]):
        problem(f"tokenizer.ggml.add_bos_token = {kv.get('tokenizer.ggml.add_bos_token')}")
    print(f"check_export: gguf: tokenizer.json's {len(t['model']['vocab'])} tokens, {len(merges)} merges, "
          f"{len(t.get('added_tokens', []))} added, pre {name}")


def tensor_infos(r, kv, n_tensors):
    """The alignment, the tensor infos (name, dims, ggml type, offset) read at
    r, and where the tensor data starts."""
    alignment = kv.get("general.alignment", (4, 32))[1]
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("<I")
        ne = [r.take("<Q") for _ in range(n_dims)]
        infos.append((name, ne, r.take("<I"), r.take("<Q")))
    return alignment, infos, -(-r.at // alignment) * alignment


def check_gguf(a):
    params, index = merged_params(a.ckpt)
    model = index["model"]
    raw = open(a.file, "rb").read()
    r = Reader(raw)
    if raw[:4] != b"GGUF":
        problem("magic is not GGUF")
        return
    r.at = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version != 3:
        problem(f"version {version}")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        kind = r.take("<I")
        if key in kv:
            problem(f"key {key} twice")
        kv[key] = (kind, r.value(kind))
    if model.get("arch") == "llama":
        check_llama_gguf(a, params, model, kv, r, raw, n_tensors, n_kv)
        return
    # Types llama.cpp insists on: counts u32 (4), the epsilon f32 (6), strings (8).
    want = {"general.architecture": (8, "gpt2"), "gpt2.context_length": (4, model["seq"]),
            "gpt2.embedding_length": (4, model["dim"]), "gpt2.feed_forward_length": (4, model["ffn"]),
            "gpt2.block_count": (4, model["layers"]), "gpt2.attention.head_count": (4, model["heads"]),
            "gpt2.vocab_size": (4, model["vocab"])}
    for key, value in want.items():
        if kv.get(key) != value:
            problem(f"metadata {key} = {kv.get(key)}, expected {value}")
    kind, eps = kv.get("gpt2.attention.layer_norm_epsilon", (None, None))
    if kind != 6 or abs(eps - 1e-5) > 1e-12:
        problem(f"gpt2.attention.layer_norm_epsilon = {kv.get('gpt2.attention.layer_norm_epsilon')}")
    check_vocabulary(a, kv, model["vocab"])
    if kv.get("general.type") != (8, "model"):
        problem(f"general.type = {kv.get('general.type')}, expected the string model")
    name = a.name if a.name is not None else "GPT-2 (tp-toolkit)"
    if kv.get("general.name") != (8, name):
        problem(f"general.name = {kv.get('general.name')}, expected the string {name!r}")
    alignment, infos, start = tensor_infos(r, kv, n_tensors)
    expected_offset = 0
    names = gguf_names(model["layers"])
    if sorted(n for n, *_ in infos) != sorted(names):
        problem(f"tensor names differ from llama.cpp's gpt2: {sorted(set(n for n, *_ in infos) ^ set(names))}")
    file_types = {0: "fp32", 1: "fp16", 32: "bf16"}
    matrix_dtype = None
    for name, ne, ggml_type, offset in infos:
        if len(name) >= 64:
            problem(f"{name}: name of 64 bytes or more")
        if offset != expected_offset:
            problem(f"{name}: offset {offset}, expected {expected_offset}")
        code, size, dtype = GGML_TYPES[ggml_type]
        shape = list(reversed(ne))
        nbytes = int(np.prod(shape)) * size
        expected_offset += -(-nbytes // alignment) * alignment
        bits = np.frombuffer(raw, code, count=int(np.prod(shape)), offset=start + offset).reshape(shape)
        if len(shape) == 1 and dtype != "fp32":
            problem(f"{name}: a 1-D tensor in {dtype} (llama.cpp keeps them in fp32)")
        if len(shape) == 2:
            matrix_dtype = dtype
        if name not in names or names[name] not in params:
            continue
        values, source_bits, source_dtype = params[names[name]]
        if not np.array_equal(bits, expected_bits(values, source_bits, source_dtype, dtype)):
            problem(f"{name}: differs from {names[name]}")
    if file_types.get(kv.get("general.file_type", (None, None))[1]) != matrix_dtype:
        problem(f"general.file_type {kv.get('general.file_type')} for {matrix_dtype} matrices")
    if start + expected_offset != len(raw):
        problem(f"file is {len(raw)} bytes, the padded tensors end at {start + expected_offset}")
    # The size label counts the parameters of the tensors written: the
    # logical parameters of the model (no padding, no output matrix).
    parameters = sum(int(np.prod(ne)) for _, ne, *_ in infos)
    if parameters != gpt_parameters(model):
        problem(f"the tensors hold {parameters} parameters, the model {gpt_parameters(model)}")
    if kv.get("general.size_label") != (8, size_label(parameters)):
        problem(f"general.size_label = {kv.get('general.size_label')}, {parameters} parameters make the string "
                f"{size_label(parameters)}")
    print(f"check_export: gguf: {n_tensors} tensors, {n_kv} keys (size label {size_label(parameters)}) "
          f"compared with {a.ckpt}")


def check_llama_gguf(a, params, model, kv, r, raw, n_tensors, n_kv):
    """llama.cpp's llama architecture: keys, tensor names, and every tensor a
    row range of ours (Q and K unpermuted first)."""
    hd = model["dim"] // model["heads"]
    want = {"general.architecture": (8, "llama"), "llama.context_length": (4, model["seq"]),
            "llama.embedding_length": (4, model["dim"]), "llama.feed_forward_length": (4, model["ffn"]),
            "llama.block_count": (4, model["layers"]), "llama.attention.head_count": (4, model["heads"]),
            "llama.attention.head_count_kv": (4, model["kv_heads"]), "llama.rope.dimension_count": (4, hd),
            "llama.vocab_size": (4, model["vocab"]), "general.type": (8, "model"),
            "general.name": (8, a.name if a.name is not None else "Llama (tp-toolkit)")}
    for key, value in want.items():
        if kv.get(key) != value:
            problem(f"metadata {key} = {kv.get(key)}, expected {value}")
    for key, value in (("llama.rope.freq_base", model["rope_theta"]),
                       ("llama.attention.layer_norm_rms_epsilon", model["norm_eps"])):
        kind, got = kv.get(key, (None, None))
        if kind != 6 or abs(got - value) > 1e-6 * abs(value):
            problem(f"{key} = {kv.get(key)}, expected the f32 {value}")
    check_vocabulary(a, kv, model["vocab"])
    alignment, infos, start = tensor_infos(r, kv, n_tensors)
    names = llama_names(model, gguf=True)
    scaling = model.get("rope_scaling")
    if scaling:
        names["rope_freqs.weight"] = (None, None)
    if sorted(n for n, *_ in infos) != sorted(names):
        problem(f"tensor names differ from llama.cpp's llama: {sorted(set(n for n, *_ in infos) ^ set(names))}")
    for name, ne, ggml_type, offset in infos:
        code, size, dtype = GGML_TYPES[ggml_type]
        shape = list(reversed(ne))
        bits = np.frombuffer(raw, code, count=int(np.prod(shape)), offset=start + offset).reshape(shape)
        if name == "rope_freqs.weight" and scaling:
            want = rope_factors(model)
            if dtype != "fp32" or bits.view(np.float32).tolist() != want.tolist():
                problem(f"rope_freqs.weight {bits.view(np.float32)[:4]}... differs from the converter's {want[:4]}...")
            continue
        if name not in names or names[name][0] not in params:
            continue
        ours, part = names[name]
        values, source_bits, source_dtype = params[ours]
        want_bits = llama_part(model, expected_bits(values, source_bits, source_dtype, dtype), part)
        if part in ("q", "k"):
            bits = unpermute_rope(bits, model["heads"] if part == "q" else model["kv_heads"])
        if bits.shape != want_bits.shape or not np.array_equal(bits, want_bits):
            problem(f"{name}: differs from {ours}{' ' + part if part else ''}"
                    f"{' (after undoing the rope permutation)' if part in ('q', 'k') else ''}")
    parameters = sum(int(np.prod(ne)) for name, ne, *_ in infos if name != "rope_freqs.weight")
    if parameters != llama_parameters(model):
        problem(f"the tensors hold {parameters} parameters, the model {llama_parameters(model)}")
    if kv.get("general.size_label") != (8, size_label(parameters)):
        problem(f"general.size_label = {kv.get('general.size_label')}, expected {size_label(parameters)}")
    print(f"check_export: gguf: {n_tensors} tensors, {n_kv} keys (Llama, size label {size_label(parameters)}) "
          f"compared with {a.ckpt}")


# ---------------------------------------------------------------------- HDF5

def check_hdf5(a):
    import h5py
    params, index = merged_params(a.ckpt)
    with h5py.File(a.file, "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        if sorted(names) != sorted(params):
            problem(f"datasets differ from the checkpoint's parameters: {sorted(set(names) ^ set(params))}")
        for name in names:
            if name not in params:
                continue
            values, bits, dtype = params[name]
            got = f[name][...].astype(np.float32)
            want = check_h5py.round_to(values, a.dtype or dtype)
            if not np.array_equal(got, want):
                problem(f"{name}: differs")
        if json.loads(f.attrs["model"]) != index["model"] or f.attrs["step"] != str(index["step"]):
            problem("root attributes model/step differ from the checkpoint's")
    print(f"check_export: hdf5: {len(names)} datasets compared with {a.ckpt}")


# ------------------------------------------------------------------ generate

def greedy(a):
    params, index = merged_params(a.ckpt)
    model = index["model"]
    m = reference_model(model, {k: v[0] for k, v in params.items()})
    context = list(a.prompt.encode())
    out = []
    with torch.no_grad():
        for _ in range(a.tokens):
            window = context[-model["seq"]:]
            logits = m(torch.tensor([window]))[0, -1]
            token = int(torch.argmax(logits))
            out.append(token)
            context.append(token)
    sys.stdout.buffer.write(a.prompt.encode() + bytes(t if t < 256 else 63 for t in out) + b"\n")


# -------------------------------------------------------------- transformers

def check_transformers(a):
    try:
        from transformers import GPT2LMHeadModel, LlamaForCausalLM
    except ImportError:
        print("check_export: SKIP: Hugging Face transformers is not installed")
        sys.exit(77)
    llama = json.load(open(os.path.join(a.dir, "config.json"))).get("model_type") == "llama"
    # Loaded in the dtype its config names (the keyword for it changed name in
    # transformers 5), then computed in fp32 as tp-train eval does.
    hf = (LlamaForCausalLM if llama else GPT2LMHeadModel).from_pretrained(a.dir).float().eval()
    x, y = windows(a.data, a.windows, a.seq)
    with torch.no_grad():
        logits = hf(x).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    rel = abs(loss - a.loss) / abs(loss)
    print(f"check_export: transformers loss {loss:.9g}, tp-train eval {a.loss:.9g}: {rel:.2e} relative")
    if rel > 1e-5:
        problem("transformers' loss differs")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["safetensors", "gguf", "hdf5", "generate", "transformers"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--data")
    p.add_argument("--windows", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--loss", type=float)
    p.add_argument("--dtype")
    p.add_argument("--tokenizer")
    p.add_argument("--text")
    p.add_argument("--prepared")
    p.add_argument("--name")
    p.add_argument("--prompt")
    p.add_argument("--tokens", type=int)
    a = p.parse_args()
    if a.mode == "safetensors":
        a.dir, a.ckpt = a.paths
        check_safetensors(a)
    elif a.mode == "gguf":
        a.file, a.ckpt = a.paths
        check_gguf(a)
    elif a.mode == "hdf5":
        a.file, a.ckpt = a.paths
        check_hdf5(a)
    elif a.mode == "generate":
        a.ckpt = a.paths[0]
        greedy(a)
    else:
        a.dir = a.paths[0]
        check_transformers(a)
    sys.exit(1 if PROBLEMS else 0)


if __name__ == "__main__":
    main()
