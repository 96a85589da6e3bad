#!/bin/sh
# tp-ckpt import of Hugging Face directories that another reader would read
# differently, and of outputs that would not be what their names say
# (docs/EXPORT.md "Import"): each refused in one line before anything is
# written, naming what to change.
#   - model.safetensors beside model.safetensors.index.json (transformers
#     loads the single file, import took the index's shards);
#   - a config.json key given twice (Python's json keeps the last value,
#     cJSON the first: rope_theta 10000 imported for 500000);
#   - a llama3 rope_scaling factor 0 (stored as "no scaling"), refused as
#     -2 is; a number given as a string said to be a string;
#   - transformers 5's rope_parameters read as version 4's rope_theta and
#     rope_scaling (it was ignored), a type not computed refused;
#   - an output under a regular file said to be under a file;
#   - an import into a run directory holding another run's checkpoints
#     (`latest` stayed on them, and --resume continued that run), and an
#     output named step_N recording another step (import, synth --step);
#   - in a sharded directory, a tensor missing said missing from the index,
#     and a stacked part of the wrong width named with its shard and shape
#     (both named the first shard, whatever held the tensor), and parts
#     whose rows add up but are not each their own (they were imported);
#   - inputs that are no safetensors model directory said to be what they
#     are (PyTorch pickles, a GGUF file, a file of a model directory, this
#     toolkit's checkpoint or run, a DCP checkpoint, shards without their
#     index), not "DIR/config.json: cannot open";
#   - config.json that is no JSON (a trailing comma, NaN) said with the
#     line and column; a header name of invalid UTF-8 refused, escaped;
#   - a tied lm_head.weight in another dtype with the embedding's values
#     imported (it was "differs");
#   - a Llama whose config.json says tie_word_embeddings true beside an
#     lm_head.weight of its own: the config named (it was "an untied output
#     head cannot be expressed", which this Llama can);
#   - a tied model's embedding stored as lm_head.weight alone (the name
#     safetensors' save_model keeps of two shared tensors): the embedding
#     said missing, with the file (a GPT-2's other tensors were all
#     "unexpected", a Llama's "no tensor model.embed_tokens.weight");
#   - NaN or infinite weights (fp32, a bf16 shard, fp16) refused naming the
#     file, the tensor, how many of each, the first's index and how many
#     tensors hold some, each value counted once where key/value rows are
#     replicated; --allow-nonfinite imports them bit for bit with a warning
#     (they were imported silently).
# Inputs are synthesized and exported here: no training.
# tier: check
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
GPT="--layers 2 --dim 64 --heads 4 --vocab 250 --seq 32"
LLAMA="--arch llama --layers 2 --dim 64 --heads 4 --kv-heads 2 --vocab 256 --seq 32"

expect_ok "synth a GPT-2" "$CK" synth -o "$WORK/gpt" --tp 1 --pp 1 $GPT
expect_ok "export it" "$CK" export "$WORK/gpt" --format safetensors -o "$WORK/hf"
expect_ok "export it sharded" "$CK" export "$WORK/gpt" --format safetensors --max-shard-size 64K -o "$WORK/hf-sharded"
expect_ok "the sharded export imports" "$CK" import "$WORK/hf-sharded" -o "$WORK/ok-sharded" --tp 2 --pp 1
expect_ok "synth a Llama" "$CK" synth -o "$WORK/llama" --tp 1 --pp 1 $LLAMA
expect_ok "export it" "$CK" export "$WORK/llama" --format safetensors -o "$WORK/hf-llama"

# A copy of a Hugging Face directory with config.json's text edited: sed
# keeps what Python's json would not (a key twice).
edited() { # NAME SOURCE SED-EXPRESSION
    cp -r "$2" "$WORK/$1"
    sed -i "$3" "$WORK/$1/config.json"
}

# --- Directories another reader reads differently.
cp -r "$WORK/hf-sharded" "$WORK/both"
cp "$WORK/hf/model.safetensors" "$WORK/both/"
expect_error "model.safetensors beside an index" 1 \
    "both holds both model.safetensors and model.safetensors.index.json .*transformers loads model.safetensors" \
    "$CK" import "$WORK/both" -o "$WORK/bad-both" --tp 1 --pp 1
check "nothing written for it" [ ! -e "$WORK/bad-both" ]

"$PY" - "$WORK/hf-llama/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
assert "rope_theta" in c, sorted(c)
PYEOF
edited twice "$WORK/hf-llama" 's/"rope_theta":[^,}]*/"rope_theta": 10000, "rope_theta": 500000/'
check "the edited config.json holds rope_theta twice, Python reads 500000" "$PY" -c '
import json, sys
text = open(sys.argv[1]).read()
sys.exit(not (text.count("\"rope_theta\"") == 2 and json.loads(text)["rope_theta"] == 500000))' "$WORK/twice/config.json"
expect_error "a config.json key twice" 1 "twice/config.json: key rope_theta appears twice" \
    "$CK" import "$WORK/twice" -o "$WORK/bad-twice" --tp 1 --pp 1
check "nothing written for it" [ ! -e "$WORK/bad-twice" ]

for factor in 0 -2; do
    "$PY" - "$WORK/hf-llama" "$WORK/factor$factor" "$factor" <<'PYEOF'
import json, shutil, sys
src, dst, factor = sys.argv[1], sys.argv[2], float(sys.argv[3])
shutil.copytree(src, dst)
c = json.load(open(dst + "/config.json"))
c["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}
json.dump(c, open(dst + "/config.json", "w"))
PYEOF
    expect_error "rope_scaling factor $factor" 1 "config.json: rope_scaling factor $factor: expected factor >= 1" \
        "$CK" import "$WORK/factor$factor" -o "$WORK/bad-factor$factor" --tp 1 --pp 1
done

# transformers 5 writes RoPE as rope_parameters (rope_theta inside it, no
# rope_scaling): the same model as version 4's spelling (rope_parameters was
# ignored: theta 10000, unscaled, imported without a word).
expect_ok "synth a Llama 3 of theta 500000 scaled by 32" "$CK" synth -o "$WORK/llama3" --tp 1 --pp 1 $LLAMA \
    --rope-theta 500000 --rope-scaling 32
expect_ok "export it (transformers 4's rope_theta and rope_scaling)" "$CK" export "$WORK/llama3" --format safetensors \
    -o "$WORK/hf-llama3"
"$PY" - "$WORK/hf-llama3" "$WORK/hf-llama3-v5" <<'PYEOF'
import json, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
c = json.load(open(sys.argv[2] + "/config.json"))
c["rope_parameters"] = dict(c.pop("rope_scaling"), rope_theta=c.pop("rope_theta"))
json.dump(c, open(sys.argv[2] + "/config.json", "w"))
PYEOF
for v in llama3 llama3-v5; do
    expect_ok "import the $v spelling" "$CK" import "$WORK/hf-$v" -o "$WORK/imp-$v" --tp 1 --pp 1
    expect_ok "its model" "$CK" info "$WORK/imp-$v" --json
    cp "$WORK/.out" "$WORK/imp-$v.json"
done
check "both spellings import the same model: theta 500000, scaled by 32" "$PY" -c '
import json, sys
a, b = (json.load(open(p))["model"] for p in sys.argv[1:3])
sys.exit(not (a == b and a["rope_theta"] == 500000 and a["rope_scaling"]["factor"] == 32))' \
    "$WORK/imp-llama3.json" "$WORK/imp-llama3-v5.json"
edited yarn "$WORK/hf-llama3-v5" 's/"rope_type": "llama3"/"rope_type": "yarn"/'
expect_error "a RoPE this Llama does not compute" 1 "config.json: rope_parameters: rope_type yarn" \
    "$CK" import "$WORK/yarn" -o "$WORK/bad-yarn" --tp 1 --pp 1

edited eps-string "$WORK/hf" 's/"layer_norm_epsilon":[^,}]*/"layer_norm_epsilon": "1e-5"/'
expect_error "layer_norm_epsilon as a string" 1 "config.json: layer_norm_epsilon is a string, not a number" \
    "$CK" import "$WORK/eps-string" -o "$WORK/bad-eps" --tp 1 --pp 1

: >"$WORK/plain-file"
expect_error "an output under a regular file" 1 "plain-file is a file, not a directory" \
    "$CK" import "$WORK/hf" -o "$WORK/plain-file/sub" --tp 1 --pp 1

# --- Outputs in run directories.
mkdir "$WORK/run"
expect_ok "another model's checkpoint at step 4" "$CK" synth -o "$WORK/run/step_00000004" --tp 1 --pp 1 $LLAMA --step 4
expect_error "import into a run directory holding another run's checkpoints" 2 \
    "run holds the checkpoints of a run \\(.*step_00000004\\): .*tp-train --resume would continue that run" \
    "$CK" import "$WORK/hf" -o "$WORK/run/step_00000000" --tp 1 --pp 1
check_all "nothing written, latest unchanged" \
    '[ ! -e "$WORK/run/step_00000000" ] && [ "$(cat "$WORK/run/latest")" = step_00000004 ]'
expect_error "import named step_N inside a checkpoint" 2 "gpt is a checkpoint, not a run directory" \
    "$CK" import "$WORK/hf" -o "$WORK/gpt/step_00000000" --tp 1 --pp 1
check "nothing written into it" [ ! -e "$WORK/gpt/step_00000000" ]
mkdir "$WORK/fresh"
expect_error "import named for a step it does not record" 2 \
    "step_00000007 is named for step 7, but the checkpoint records step 0: .*name it .*fresh/step_00000000" \
    "$CK" import "$WORK/hf" -o "$WORK/fresh/step_00000007" --tp 1 --pp 1
check "nothing written for it" [ ! -e "$WORK/fresh/step_00000007" ]
expect_ok "import into an empty run directory" "$CK" import "$WORK/hf" -o "$WORK/fresh/step_00000000" --tp 1 --pp 1
check "it is latest" [ "$(cat "$WORK/fresh/latest")" = step_00000000 ]
expect_ok "--force replaces the import, the run's only checkpoint" \
    "$CK" import "$WORK/hf" -o "$WORK/fresh/step_00000000" --tp 2 --pp 1 --force
expect_error "synth named for a step it does not record" 2 "step_00000005 is named for step 5, but the checkpoint records step 3" \
    "$CK" synth -o "$WORK/fresh/step_00000005" --tp 1 --pp 1 $GPT --step 3
check "nothing written for it" [ ! -e "$WORK/fresh/step_00000005" ]

# --- Sharded directories: what is missing or wrong is named where it is.
# st.py ACTION DIR ...: edits a safetensors directory (tensors rewritten
# whole, so that the data stays covered), printing what the test matches.
cat >"$WORK/st.py" <<'PYEOF'
import json, os, struct, sys
import numpy as np
def load(path):
    raw = open(path, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    return meta, {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}
def save(path, meta, tensors, rename=None):
    header, blobs, at = ({"__metadata__": meta} if meta else {}), [], 0
    for k, (dtype, shape, blob) in tensors.items():
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(blob)]}; blobs.append(blob); at += len(blob)
    text = json.dumps(header).encode()
    if rename: text = text.replace(rename[0], rename[1])
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return text
action, d = sys.argv[1], sys.argv[2]
index_path = d + "/model.safetensors.index.json"
index = json.load(open(index_path)) if os.path.exists(index_path) else None
def file_of(name): return index["weight_map"][name] if index else "model.safetensors"
if action == "shard-of":  # the shard holding a tensor
    print(file_of(sys.argv[3]))
elif action == "drop":  # a tensor gone from its shard and the index
    name = sys.argv[3]; f = d + "/" + file_of(name); meta, t = load(f); del t[name]; save(f, meta, t)
    del index["weight_map"][name]; json.dump(index, open(index_path, "w"))
elif action == "swap-widths":  # q and k of layer 0 keep their rows together, cut elsewhere
    q, k = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    assert file_of(q) == file_of(k)
    f = d + "/" + file_of(q); meta, t = load(f)
    rows = t[q][2] + t[k][2]; cols = t[q][1][1]; half = len(rows) // 2
    t[q] = (t[q][0], [half // (4 * cols), cols], rows[:half]); t[k] = (t[k][0], [half // (4 * cols), cols], rows[half:])
    save(f, meta, t)
elif action == "lm-head-f16":  # a tied GPT-2 head in F16, the embedding exact in F16 (or not: "differ")
    f = d + "/model.safetensors"; meta, t = load(f)
    wte = "transformer.wte.weight"; w = np.frombuffer(t[wte][2], np.float32).astype(np.float16)
    t[wte] = (t[wte][0], t[wte][1], w.astype(np.float32).tobytes())
    head = w.copy()
    if len(sys.argv) > 3: head[5] = np.float16(head[5] + 1)
    t["lm_head.weight"] = ("F16", t[wte][1], head.tobytes()); save(f, meta, t)
elif action == "head-only":  # a tied model's embedding stored as lm_head.weight alone (save_model keeps that name)
    f = d + "/model.safetensors"; meta, t = load(f)
    t["lm_head.weight"] = t.pop(sys.argv[3]); save(f, meta, t)
elif action == "poison":  # poison TENSOR INDEX VALUE ...: elements (flat indices) set to nan, inf or -inf, in its dtype
    name = sys.argv[3]; f = d + "/" + file_of(name); meta, t = load(f); dtype, shape, blob = t[name]
    if dtype == "F32": v = np.frombuffer(blob, np.float32).copy()
    elif dtype == "F16": v = np.frombuffer(blob, np.float16).copy()
    else: v = np.frombuffer(blob, np.uint16).copy()  # BF16: the top half of the fp32's bits
    for i, x in zip(sys.argv[4::2], sys.argv[5::2]):
        x = np.float32(x)
        v[int(i)] = (x.view(np.uint32) >> 16).astype(np.uint16) if dtype == "BF16" else x
    t[name] = (dtype, shape, v.tobytes()); save(f, meta, t)
    print(file_of(name))
elif action == "same-values":  # same-values OTHER: every tensor of DIR has OTHER's bytes (NaN payloads included)
    a = {n: v for f in sorted(os.listdir(d)) if f.endswith(".safetensors") for n, v in load(d + "/" + f)[1].items()}
    b = {n: v for f in sorted(os.listdir(sys.argv[3])) if f.endswith(".safetensors")
         for n, v in load(sys.argv[3] + "/" + f)[1].items()}
    differ = [n for n in a if n not in b or a[n] != b[n]]
    if differ or len(a) != len(b): sys.exit("differ: %s of %d and %d" % (differ[:5], len(a), len(b)))
elif action == "bad-utf8":  # a tensor named "model.\xff": prints the file offset of the name
    f = d + "/model.safetensors"; meta, t = load(f)
    t["model.X"] = ("F32", [1], b"\0" * 4)
    text = save(f, meta, t, (b'"model.X"', b'"model.\xff"'))
    print(8 + text.index(b"model.\xff"))
PYEOF
expect_ok "synth a Llama of 4 heads and 2 KV heads" "$CK" synth -o "$WORK/llama4" --tp 1 --pp 1 $LLAMA --ffn 256
expect_ok "export it in 4 shards" "$CK" export "$WORK/llama4" --format safetensors --max-shard-size 200K -o "$WORK/sh"
check "the first layer is not in the last shard, the norm is" "$PY" -c '
import json, sys
m = json.load(open(sys.argv[1]))["weight_map"]
files = sorted(set(m.values()))
sys.exit(not (len(files) > 2 and m["model.layers.0.self_attn.k_proj.weight"] != files[-1] and m["model.norm.weight"] != files[0]))' \
    "$WORK/sh/model.safetensors.index.json"

cp -r "$WORK/sh" "$WORK/sh-kv4"
"$PY" - "$WORK/sh-kv4/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1])); c["num_key_value_heads"] = 4; json.dump(c, open(sys.argv[1], "w"))
PYEOF
K_SHARD=$("$PY" "$WORK/st.py" shard-of "$WORK/sh" model.layers.0.self_attn.k_proj.weight)
expect_error "a K projection of the wrong width: named with its shard and shapes" 1 \
    "sh-kv4/$K_SHARD: tensor model.layers.0.self_attn.k_proj.weight \[32, 64\], expected \[64, 64\] \(part 2 of 3 of model/layers.0.attn.qkv.weight, whose parts have 64, 64 and 64 rows: model.layers.0.self_attn.q_proj.weight \[64, 64\], model.layers.0.self_attn.k_proj.weight \[32, 64\], model.layers.0.self_attn.v_proj.weight \[32, 64\]\)" \
    "$CK" import "$WORK/sh-kv4" -o "$WORK/bad-kv4" --tp 1 --pp 1
check "and with the sizes config.json gave, num_key_value_heads among them" grep -q \
    "; the shapes expected follow config.json: hidden_size 64, num_attention_heads 4, num_key_value_heads 4 (heads of 16), intermediate_size " \
    "$WORK/.err"

cp -r "$WORK/sh" "$WORK/sh-swap"
"$PY" "$WORK/st.py" swap-widths "$WORK/sh-swap"
expect_error "Q and K cut elsewhere, their rows adding up: refused, naming Q" 1 \
    "sh-swap/$K_SHARD: tensor model.layers.0.self_attn.q_proj.weight \[48, 64\], expected \[64, 64\] \(part 1 of 3 of .*, whose parts have 64, 32 and 32 rows: .*k_proj.weight \[48, 64\]" \
    "$CK" import "$WORK/sh-swap" -o "$WORK/bad-swap" --tp 1 --pp 1
check "nothing written for it" [ ! -e "$WORK/bad-swap" ]

cp -r "$WORK/sh" "$WORK/sh-nonorm"
"$PY" "$WORK/st.py" drop "$WORK/sh-nonorm" model.norm.weight
expect_error "a tensor missing from a sharded directory: the index named, not the first shard" 1 \
    "sh-nonorm/model.safetensors.index.json: tensor model.norm.weight \(for model/final_norm.*\) is missing" \
    "$CK" import "$WORK/sh-nonorm" -o "$WORK/bad-nonorm" --tp 1 --pp 1

# --- The index's metadata.total_size: no reader checks it (transformers
# passes the metadata on) and writers count it differently (huggingface_hub
# the tensors' storages, mlx-examples once the files' sizes), so one that
# matches neither the shards' tensor bytes nor their files' is said in one
# warning line and the import goes on, every tensor checked against its
# shard's header. The sizes are Python's, from the shards' headers.
expect_ok "the sharded directory as exported" "$CK" import "$WORK/sh" -o "$WORK/sh-import" --tp 1 --pp 1
check "says nothing of its total_size (the tensors' bytes)" test ! -s "$WORK/.err"
cp -r "$WORK/sh" "$WORK/sh-total"
# index_total DIR TENSORS|FILES|N: sets total_size; prints the shards' tensor bytes and file bytes.
cat >"$WORK/index_total.py" <<'PYEOF'
import json, os, struct, sys
d, how = sys.argv[1], sys.argv[2]
path = d + "/model.safetensors.index.json"
index = json.load(open(path))
files = [d + "/" + f for f in sorted(set(index["weight_map"].values()))]
header_bytes = [8 + struct.unpack("<Q", open(f, "rb").read(8))[0] for f in files]
file_bytes = sum(os.path.getsize(f) for f in files)
tensor_bytes = file_bytes - sum(header_bytes)
index["metadata"]["total_size"] = {"TENSORS": tensor_bytes, "FILES": file_bytes}.get(how) or int(how) * tensor_bytes
json.dump(index, open(path, "w"))
print(tensor_bytes, file_bytes, len(files))
PYEOF
set -- $("$PY" "$WORK/index_total.py" "$WORK/sh-total" 2)
expect_ok "an index whose total_size is twice the shards' tensor bytes (another dtype's copy): imported" \
    "$CK" import "$WORK/sh-total" -o "$WORK/sh-total-import" --tp 1 --pp 1
check "with one warning line naming the index, what it says and what the shards hold" sh -c '
test "$(wc -l <"$1")" -eq 1 && grep -q "^tp-ckpt: warning: .*sh-total/model.safetensors.index.json: metadata.total_size says $2 bytes, but the $5 shards. tensors hold $3 (their files $4): an index of another copy of the model" "$1"' \
    sh "$WORK/.err" $(($1 * 2)) "$1" "$2" "$3"
expect_ok "the tensors imported are the shards' (those of the directory as exported)" "$CK" diff "$WORK/sh-import" \
    "$WORK/sh-total-import"
"$PY" "$WORK/index_total.py" "$WORK/sh-total" FILES >/dev/null
expect_ok "an index whose total_size counts the shard files (mlx-examples' save_weights)" \
    "$CK" import "$WORK/sh-total" -o "$WORK/sh-files-import" --tp 1 --pp 1
check "says nothing" test ! -s "$WORK/.err"

# --- Inputs that are not a safetensors model directory, said as what they are.
mkdir "$WORK/bin"
cp "$WORK/hf-llama/config.json" "$WORK/bin/"
"$PY" -c 'import sys, torch; torch.save({"w": torch.zeros(2)}, sys.argv[1])' "$WORK/bin/pytorch_model.bin"
expect_error "a directory of PyTorch pickles" 1 \
    "bin holds PyTorch pickles \(pytorch_model.bin\), which import does not read .*save_pretrained\(OUT, safe_serialization=True\)" \
    "$CK" import "$WORK/bin" -o "$WORK/bad-bin" --tp 1 --pp 1
expect_ok "a GGUF export" "$CK" export "$WORK/llama" --format gguf -o "$WORK/m.gguf"
expect_error "a GGUF file" 1 "m.gguf is a GGUF file \(llama.cpp's\), which import does not read" \
    "$CK" import "$WORK/m.gguf" -o "$WORK/bad-gguf" --tp 1 --pp 1
expect_error "model.safetensors given for its directory" 1 \
    "hf-llama/model.safetensors is a file of the Hugging Face model directory .*hf-llama: give the directory" \
    "$CK" import "$WORK/hf-llama/model.safetensors" -o "$WORK/bad-file" --tp 1 --pp 1
expect_error "a shard given for its directory" 1 "sh/$K_SHARD is a file of the Hugging Face model directory .*/sh: give" \
    "$CK" import "$WORK/sh/$K_SHARD" -o "$WORK/bad-shard" --tp 1 --pp 1
expect_error "this toolkit's checkpoint" 1 "llama is already this toolkit's checkpoint, not a Hugging Face model directory: .*tp-reshard" \
    "$CK" import "$WORK/llama" -o "$WORK/bad-own" --tp 1 --pp 1
expect_error "this toolkit's run directory" 1 "fresh is a run directory of this toolkit's checkpoints.*tp-reshard .*fresh/step_00000000 " \
    "$CK" import "$WORK/fresh" -o "$WORK/bad-run" --tp 1 --pp 1
expect_ok "a DCP checkpoint" "$BIN/tp-reshard" "$WORK/llama" --to tp1pp1 --format dcp -o "$WORK/dcp"
expect_error "a DCP checkpoint: named, with its conversion" 1 \
    "dcp is a PyTorch distributed checkpoint \(.metadata\), which import does not read: convert it with tp-reshard" \
    "$CK" import "$WORK/dcp" -o "$WORK/bad-dcp" --tp 1 --pp 1
mkdir "$WORK/noindex"
cp "$WORK/sh/"*.safetensors "$WORK/sh/config.json" "$WORK/noindex/"
expect_error "shards without their index: named, and the index" 1 \
    "noindex holds safetensors files \(model-0000[1-4]-of-00004.safetensors, .* and 1 more\) but no model.safetensors.index.json" \
    "$CK" import "$WORK/noindex" -o "$WORK/bad-noindex" --tp 1 --pp 1
check "nothing written for any" sh -c '! ls -d "$1"/bad-* 2>/dev/null' sh "$WORK"

# --- Files that are no JSON, and names that are no UTF-8.
cp -r "$WORK/hf" "$WORK/comma"
"$PY" - "$WORK/comma/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1])); text = json.dumps(c, indent=2)
open(sys.argv[1], "w").write(text[:-2] + ",\n}")  # a comma after the last member
PYEOF
LINES=$(wc -l <"$WORK/comma/config.json")
expect_error "a trailing comma in config.json: its line and column" 1 \
    "comma/config.json: not a JSON object: invalid JSON at line $((LINES + 1)), column 1 \(byte [0-9]+, at \"\}\"\)" \
    "$CK" import "$WORK/comma" -o "$WORK/bad-comma" --tp 1 --pp 1
cp -r "$WORK/hf" "$WORK/nan"
"$PY" - "$WORK/nan/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1])); c["initializer_range"] = float("nan"); json.dump(c, open(sys.argv[1], "w"))
PYEOF
expect_error "NaN in config.json (Python's json writes it): where" 1 \
    "nan/config.json: not a JSON object: invalid JSON at line 1, column [0-9]+ \(byte [0-9]+, at \"NaN" \
    "$CK" import "$WORK/nan" -o "$WORK/bad-nan" --tp 1 --pp 1

cp -r "$WORK/hf-llama" "$WORK/utf8"
AT=$("$PY" "$WORK/st.py" bad-utf8 "$WORK/utf8")
expect_error "a tensor name of invalid UTF-8: refused, the byte escaped, its offset named" 1 \
    "utf8/model.safetensors: the tensor name \"model\.\\\\xff\" at byte $AT of the file is not valid UTF-8" \
    "$CK" import "$WORK/utf8" -o "$WORK/bad-utf8" --tp 1 --pp 1
check "no raw 0xff byte reaches the terminal" sh -c '! LC_ALL=C grep -q "$(printf "\377")" "$1"' sh "$WORK/.err"

# --- A tied head in another dtype.
cp -r "$WORK/hf" "$WORK/lmf16"
"$PY" "$WORK/st.py" lm-head-f16 "$WORK/lmf16"
expect_ok "an F16 lm_head.weight equal in value to the F32 embedding imports" \
    "$CK" import "$WORK/lmf16" -o "$WORK/ok-lmf16" --tp 1 --pp 1
cp -r "$WORK/hf" "$WORK/lmf16-off"
"$PY" "$WORK/st.py" lm-head-f16 "$WORK/lmf16-off" differ
expect_error "one value apart, it is refused" 1 "lmf16-off: lm_head.weight differs from transformer.wte.weight" \
    "$CK" import "$WORK/lmf16-off" -o "$WORK/bad-lmf16" --tp 1 --pp 1
# The Llama is untied (its own lm_head.weight); config.json saying tied
# contradicts the file, and the message says which key, not a limit.
edited tied-says "$WORK/hf-llama" 's/"tie_word_embeddings":[^,}]*/"tie_word_embeddings": true/'
expect_error "a Llama's own lm_head beside tie_word_embeddings true: the config named" 1 \
    "tied-says: lm_head.weight differs from model.embed_tokens.weight, but config.json says tie_word_embeddings true .*untied Llama's config.json says tie_word_embeddings false" \
    "$CK" import "$WORK/tied-says" -o "$WORK/bad-tied-says" --tp 1 --pp 1
check "nothing written for it" [ ! -e "$WORK/bad-tied-says" ]

# --- A tied embedding stored under the head's name alone.
cp -r "$WORK/hf" "$WORK/head-only"
"$PY" "$WORK/st.py" head-only "$WORK/head-only" transformer.wte.weight
expect_error "a GPT-2 of lm_head.weight without transformer.wte.weight: the embedding said missing" 1 \
    "head-only/model.safetensors: tensor transformer.wte.weight is missing, and lm_head.weight, which a tied model shares with it, is there" \
    "$CK" import "$WORK/head-only" -o "$WORK/bad-head-only" --tp 1 --pp 1
expect_ok "synth a tied Llama" "$CK" synth -o "$WORK/llama-tied" --tp 1 --pp 1 $LLAMA --tied-embeddings
expect_ok "export it" "$CK" export "$WORK/llama-tied" --format safetensors -o "$WORK/hf-llama-tied"
"$PY" "$WORK/st.py" head-only "$WORK/hf-llama-tied" model.embed_tokens.weight
expect_error "a tied Llama of lm_head.weight without model.embed_tokens.weight: the file named" 1 \
    "hf-llama-tied/model.safetensors: tensor model.embed_tokens.weight is missing, and lm_head.weight, which a tied model shares with it, is there" \
    "$CK" import "$WORK/hf-llama-tied" -o "$WORK/bad-llama-tied" --tp 1 --pp 1

# --- NaN and infinite values in the weights (a damaged download, an export of
# a diverged run): refused before anything is written, naming the file,
# the tensor, how many of each and the first's [row, col] (they were
# imported silently, and training failed later); --allow-nonfinite imports
# them, bit for bit, with a warning naming the same.
cp -r "$WORK/hf" "$WORK/nanw"
"$PY" "$WORK/st.py" poison "$WORK/nanw" transformer.h.1.mlp.c_fc.weight 785 nan 900 nan >/dev/null  # [3, 17], [3, 132]
"$PY" "$WORK/st.py" poison "$WORK/nanw" transformer.h.0.ln_2.weight 9 -inf >/dev/null
mkdir "$WORK/nf"
expect_error "a NaN in a GPT-2 weight: refused, the file, tensor, counts, first index and other tensors named" 1 \
    "nanw/model.safetensors: tensor transformer.h.0.ln_2.weight \[64\] holds 0 NaNs and 1 infinite value, the first at \[9\]; 2 tensors in all hold NaN or infinite values \(3 values\): nothing imported \(--allow-nonfinite" \
    "$CK" import "$WORK/nanw" -o "$WORK/nf/nan" --tp 2 --pp 1
check "nothing left of it, staging included" sh -c '[ -z "$(ls -A "$1")" ]' sh "$WORK/nf"
"$PY" "$WORK/st.py" poison "$WORK/nanw" transformer.h.0.ln_2.weight 9 1.0 >/dev/null
expect_error "the transposed one alone: its [row, col] in the source's shape" 1 \
    "nanw/model.safetensors: tensor transformer.h.1.mlp.c_fc.weight \[64, 256\] holds 2 NaNs and 0 infinite values, the first at \[3, 17\]: nothing" \
    "$CK" import "$WORK/nanw" -o "$WORK/nf/nan" --tp 2 --pp 1
check "nothing left of it" sh -c '[ -z "$(ls -A "$1")" ]' sh "$WORK/nf"

# bf16 shards of a Llama of 2 KV heads at tp 4: the K rows are replicated on
# two ranks each, and each value is counted once.
expect_ok "export the Llama in bf16 shards" "$CK" export "$WORK/llama4" --format safetensors --dtype bf16 \
    --max-shard-size 100K -o "$WORK/inf"
SHARD=$("$PY" "$WORK/st.py" poison "$WORK/inf" model.layers.1.self_attn.k_proj.weight 329 inf 330 -inf 700 nan)
expect_error "an inf in a bf16 shard: its shard named, each value counted once though replicated" 1 \
    "inf/$SHARD: tensor model.layers.1.self_attn.k_proj.weight \[32, 64\] holds 1 NaN and 2 infinite values, the first at \[5, 9\]: nothing imported" \
    "$CK" import "$WORK/inf" -o "$WORK/nf/inf" --tp 4 --pp 1 --dtype bf16
check "nothing left of it" sh -c '[ -z "$(ls -A "$1")" ]' sh "$WORK/nf"
expect_ok "--allow-nonfinite imports it" "$CK" import "$WORK/inf" -o "$WORK/nf/inf" --tp 4 --pp 1 --dtype bf16 --allow-nonfinite
check "with a warning naming the same" grep -q \
    "warning: imported with NaN or infinite values (--allow-nonfinite): .*inf/$SHARD: tensor model.layers.1.self_attn.k_proj.weight \[32, 64\] holds 1 NaN and 2 infinite values, the first at \[5, 9\]" \
    "$WORK/.err"
expect_ok "export the import" "$CK" export "$WORK/nf/inf" --format safetensors --dtype bf16 -o "$WORK/inf-back"
check "the values carried bit for bit, NaN's payload included" "$PY" "$WORK/st.py" same-values "$WORK/inf-back" "$WORK/inf"

expect_ok "export the Llama in fp16" "$CK" export "$WORK/llama" --format safetensors --dtype fp16 -o "$WORK/f16"
"$PY" "$WORK/st.py" poison "$WORK/f16" model.norm.weight 7 inf >/dev/null
expect_error "an inf in an fp16 tensor, imported as fp32" 1 \
    "f16/model.safetensors: tensor model.norm.weight \[64\] holds 0 NaNs and 1 infinite value, the first at \[7\]" \
    "$CK" import "$WORK/f16" -o "$WORK/nf/f16" --tp 1 --pp 1
expect_ok "--allow-nonfinite imports the GPT-2's NaNs at tp 2" \
    "$CK" import "$WORK/nanw" -o "$WORK/nf/nan" --tp 2 --pp 1 --allow-nonfinite
expect_ok "export it" "$CK" export "$WORK/nf/nan" --format safetensors -o "$WORK/nan-back"
check "its values carried bit for bit" "$PY" "$WORK/st.py" same-values "$WORK/nan-back" "$WORK/nanw"

expect_ok "a clean model imports as before" "$CK" import "$WORK/hf" -o "$WORK/nf/clean" --tp 2 --pp 1
check "without a warning" sh -c '! grep -q warning "$1"' sh "$WORK/.err"
expect_ok "equal to the checkpoint it was exported from" "$CK" diff "$WORK/nf/clean" "$WORK/gpt"

finish
