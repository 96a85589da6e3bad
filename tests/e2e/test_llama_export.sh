#!/bin/sh
# Llama exports and imports (docs/EXPORT.md "Llama"), judged by the
# independent checker (tests/trainer/check_export.py: Hugging Face's
# LlamaForCausalLM names and config, llama.cpp's llama keys, the Q/K row
# permutation undone, Llama 3's rope_freqs as convert_hf_to_gguf.py computes
# them, the PyTorch Llama's loss against tp-train eval): untied and tied,
# sharded, imported back bit for bit at layouts with and without replicated
# key/value heads, and what cannot be expressed refused, naming it.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
CHECK="$ROOT/tests/trainer/check_export.py"

skip_without_python 'torch, numpy, h5py' "python3-torch (or h5py) is not installed"

# --- An untied Llama with 2 key/value heads, trained a little at tp2pp2.
printf 'The checkpoint of a Llama goes to Hugging Face and to llama.cpp. %.0s' $(seq 60) >"$WORK/text.txt"
expect_ok "tp-train prepare" "$BIN/tp-train" prepare "$WORK/text.txt" -o "$WORK/text.bin"
use_open_mpi
expect_ok "llama-tiny: 6 steps at tp2pp2" mpirun --oversubscribe -np 4 "$BIN/tp-train" --model llama-tiny --tp 2 --pp 2 \
    --micro-batch 2 --steps 6 --lr 3e-3 --data "$WORK/text.bin" --ckpt-dir "$WORK/run" --quiet
SRC="$WORK/run/step_00000006"
expect_ok "tp-train eval" "$BIN/tp-train" eval --ckpt "$SRC" --data "$WORK/text.bin" --windows 8 --json
cp "$WORK/.out" "$WORK/eval.json"
LOSS=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["loss"])' "$WORK/eval.json")
expect_ok "export: a Hugging Face Llama directory" "$CK" export "$SRC" --format safetensors -o "$WORK/hf"
expect_ok "its names, config and rows; the PyTorch Llama computes tp-train's loss" "$PY" "$CHECK" safetensors \
    "$WORK/hf" "$SRC" --data "$WORK/text.bin" --windows 8 --seq 32 --loss "$LOSS"
run "$PY" "$CHECK" transformers "$WORK/hf" --data "$WORK/text.bin" --windows 8 --seq 32 --loss "$LOSS"
if [ "$RC" -eq 77 ]; then echo "[SKIP] [$NAME] transformers' LlamaForCausalLM.from_pretrained: transformers is not installed"
else check "transformers' LlamaForCausalLM loads the export with tp-train's loss" [ "$RC" -eq 0 ]; fi
check "q, k and v projections, gate and up, lm_head" "$PY" -c 'import json, struct, sys
raw = open(sys.argv[1] + "/model.safetensors", "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
shapes = {k: v["shape"] for k, v in h.items() if k != "__metadata__"}
sys.exit(not (shapes["model.layers.1.self_attn.q_proj.weight"] == [64, 64] and
              shapes["model.layers.1.self_attn.k_proj.weight"] == [32, 64] and
              shapes["model.layers.0.mlp.up_proj.weight"] == [128, 64] and shapes["lm_head.weight"] == [256, 64]))' \
    "$WORK/hf"
expect_ok "export: llama.cpp's llama architecture" "$CK" export "$SRC" --format gguf -o "$WORK/m.gguf"
expect_ok "its keys and tensors, Q and K unpermuted" "$PY" "$CHECK" gguf "$WORK/m.gguf" "$SRC"
# The judge can fail: the GGUF's Q rows are not Hugging Face's order (the
# permutation was applied), and a file whose Q rows were left unpermuted is
# caught.
check "the GGUF's attn_q is permuted" "$PY" - "$WORK/m.gguf" "$WORK/hf" <<'PYEOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
st = open(sys.argv[2] + "/model.safetensors", "rb").read()
h = json.loads(st[8:8 + struct.unpack("<Q", st[:8])[0]])
b, e = h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"]
q = st[8 + struct.unpack("<Q", st[:8])[0] + b:][:e - b]
# the same bytes as one run in the GGUF would mean no permutation
sys.exit(0 if raw.find(q) < 0 else 1)
PYEOF
"$PY" - "$WORK/m.gguf" "$WORK/unpermuted.gguf" "$WORK/hf" <<'PYEOF'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
st = open(sys.argv[3] + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", st[:8])[0]
h = json.loads(st[8:8 + n])
b, e = h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"]
q = st[8 + n + b:8 + n + e]
# find attn_q of block 0 by its sorted bytes (a permutation of rows keeps the multiset of rows)
rows = [q[i:i + 256] for i in range(0, len(q), 256)]
for start in range(0, len(raw) - len(q) + 1, 32):
    if sorted(raw[start + i:start + i + 256] for i in range(0, len(q), 256)) == sorted(rows):
        raw[start:start + len(q)] = q
        break
open(sys.argv[2], "wb").write(raw)
PYEOF
run "$PY" "$CHECK" gguf "$WORK/unpermuted.gguf" "$SRC"
check "a GGUF with Hugging Face's Q rows is refused by the judge" grep -q "blk.0.attn_q.weight: differs" "$WORK/.out"

# llama.cpp itself (tests/trainer/llama_cpp.mjs) runs the export: its loss
# on the training text is tp-train eval's (RoPE on permuted rows, grouped
# key/value heads, SwiGLU, RMSNorm, the untied output); with the rows left
# in Hugging Face's order it is not (6 steps of training lean little on
# attention: the loss moves by about 1.4e-4 relative, 14 times the
# tolerance, where the export agrees to about 1e-9).
llama_cpp loss "$WORK/m.gguf" "$WORK/text.bin" --windows 8 --seq 32
if judged_by_llama_cpp "the Llama GGUF's loss"; then
    cp "$WORK/.out" "$WORK/m-llama.json"
    check "llama.cpp's loss of the Llama GGUF is tp-train eval's" [ "$RC" -eq 0 ] &&
        check "to 1e-5" same_loss "$WORK/eval.json" "$WORK/m-llama.json" 1e-5
    llama_cpp loss "$WORK/unpermuted.gguf" "$WORK/text.bin" --windows 8 --seq 32
    cp "$WORK/.out" "$WORK/unpermuted-llama.json"
    check "the unpermuted GGUF runs in llama.cpp" [ "$RC" -eq 0 ] &&
        check_all "its loss is not tp-train eval's to that tolerance" \
            '! same_loss "$WORK/eval.json" "$WORK/unpermuted-llama.json" 1e-5'
    # Straight from a Llama-shaped Megatron-LM checkpoint (legacy, tp2): the
    # GGUF computes the same loss.
    expect_ok "the Llama as a Megatron-LM checkpoint at tp2" "$BIN/tp-reshard" "$SRC" --to tp2 --format megatron \
        -o "$WORK/megatron"
    expect_ok "exported as GGUF from Megatron's files" "$CK" export "$WORK/megatron" --format gguf -o "$WORK/megatron.gguf"
    llama_cpp loss "$WORK/megatron.gguf" "$WORK/text.bin" --windows 8 --seq 32
    check_all "llama.cpp's loss of the GGUF from Megatron's files is tp-train eval's" \
        '[ "$RC" -eq 0 ] && same_loss "$WORK/eval.json" "$WORK/.out" 1e-5'
fi

# --- Back: import at tp1 and at tp4 (2 KV heads replicated over 4 ranks).
expect_ok "import at tp1pp1" "$CK" import "$WORK/hf" --tp 1 --pp 1 -o "$WORK/back1"
expect_ok "bit-exact against the trained weights" "$CK" diff --weights-only "$WORK/back1" "$SRC"
expect_ok "import at tp4pp2 (K < TP)" "$CK" import "$WORK/hf" --tp 4 --pp 2 -o "$WORK/back4"
expect_ok "bit-exact too" "$CK" diff --weights-only "$WORK/back4" "$SRC"
expect_ok "tp-ckpt verify" "$CK" verify "$WORK/back4"
expect_ok "sharded export above --max-shard-size" "$CK" export "$WORK/back4" --format safetensors -o "$WORK/hf-sharded" \
    --max-shard-size 100K
check "several shards and an index" test -f "$WORK/hf-sharded/model.safetensors.index.json" -a \
    -f "$WORK/hf-sharded/model-00002-of-00005.safetensors"
expect_ok "checked" "$PY" "$CHECK" safetensors "$WORK/hf-sharded" "$WORK/back4"
expect_ok "imported from the shards" "$CK" import "$WORK/hf-sharded" --tp 2 --pp 1 -o "$WORK/back2"
expect_ok "bit-exact" "$CK" diff --weights-only "$WORK/back2" "$SRC"

# --- A tied Llama 3 (rope scaling 32, theta 500000): no lm_head, GGUF rope_freqs.
L3="--arch llama --layers 2 --dim 64 --heads 4 --kv-heads 1 --ffn 96 --vocab 300 --seq 2048 --tied-embeddings \
    --rope-theta 500000 --rope-scaling 32"
expect_ok "synth a tied Llama 3 at tp2pp2" "$CK" synth -o "$WORK/l3" --tp 2 --pp 2 $L3
expect_ok "export" "$CK" export "$WORK/l3" --format safetensors -o "$WORK/l3hf"
expect_ok "checked: rope_scaling llama3, tie_word_embeddings, no lm_head" "$PY" "$CHECK" safetensors "$WORK/l3hf" "$WORK/l3"
expect_ok "tp-train eval of the Llama 3" "$BIN/tp-train" eval --ckpt "$WORK/l3" --data "$WORK/text.bin" --windows 8 \
    --seq 32 --json
cp "$WORK/.out" "$WORK/l3-eval.json"
L3_LOSS=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["loss"])' "$WORK/l3-eval.json")
run "$PY" "$CHECK" transformers "$WORK/l3hf" --data "$WORK/text.bin" --windows 8 --seq 32 --loss "$L3_LOSS"
if [ "$RC" -eq 77 ]; then echo "[SKIP] [$NAME] transformers' Llama 3 (rope scaling, tied): transformers is not installed"
else check "transformers computes the tied Llama 3's loss as tp-train eval does" [ "$RC" -eq 0 ]; fi
expect_ok "GGUF" "$CK" export "$WORK/l3" --format gguf --dtype bf16 -o "$WORK/l3.gguf"
expect_ok "checked: rope_freqs.weight as the converter computes it" "$PY" "$CHECK" gguf "$WORK/l3.gguf" "$WORK/l3"
expect_ok "imported back at tp1" "$CK" import "$WORK/l3hf" --tp 1 --pp 1 -o "$WORK/l3back"
expect_ok "bit-exact" "$CK" diff "$WORK/l3back" "$WORK/l3"

# --- A Hugging Face tokenizer.json (BPE: GPT-2's byte symbols, merges as
# strings and as pairs, special and plain added tokens, Llama 3's
# pre-tokenizer) carried into the GGUF's tokenizer keys.
mkdir -p "$WORK/tok"
expect_ok "a tokenizer.json for 300 ids" "$PY" "$ROOT/tests/support/hf_tokenizer.py" "$WORK/tok" 300
expect_ok "synth a Llama of 300 tokens" "$CK" synth -o "$WORK/v300" --tp 2 --pp 1 --arch llama --layers 2 --dim 64 \
    --heads 4 --kv-heads 2 --vocab 300 --seq 32
expect_ok "GGUF with --tokenizer" "$CK" export "$WORK/v300" --format gguf --tokenizer "$WORK/tok" -o "$WORK/v300.gguf"
expect_ok "tokens by id, types, merges, pre llama-bpe, BOS/EOS and add_bos as the converter writes them" \
    "$PY" "$CHECK" gguf "$WORK/v300.gguf" "$WORK/v300" --tokenizer "$WORK/tok"
# llama.cpp runs the tied Llama 3 (no output.weight; rope_freqs from the
# scaling; one key/value head) to tp-train eval's loss. With the vocabulary
# of a tokenizer: a GGUF without one (no_vocab) stops llama.cpp as it
# evaluates ("Tokenizer not initialized").
expect_ok "the Llama 3 as an fp32 GGUF with the tokenizer" "$CK" export "$WORK/l3" --format gguf --tokenizer "$WORK/tok" \
    -o "$WORK/l3-tok.gguf"
llama_cpp loss "$WORK/l3-tok.gguf" "$WORK/text.bin" --windows 8 --seq 32
if judged_by_llama_cpp "the Llama 3 GGUF's loss"; then
    cp "$WORK/.out" "$WORK/l3-llama.json"
    check "llama.cpp's loss of the Llama 3 GGUF is tp-train eval's" [ "$RC" -eq 0 ] &&
        check "to 1e-5" same_loss "$WORK/l3-eval.json" "$WORK/l3-llama.json" 1e-5
fi
# Straight from a torch_dist checkpoint whose tables Megatron padded (300
# tokens in 384 rows at tp2, make_vocab_size_divisible_by 64): with
# --true-vocab-size the GGUF is, byte for byte, the export of the model it
# was written from, and llama.cpp computes that model's loss; with the
# padded table (84 rows of zero logits) it does not.
expect_ok "a tied Llama 3 padded to a multiple of 64" "$CK" synth -o "$WORK/l3p" --tp 2 --pp 2 $L3 --vocab-pad-multiple 64
expect_ok "as Megatron-Core torch_dist at tp2" "$BIN/tp-reshard" "$WORK/l3p" --to tp2 --format torch_dist -o "$WORK/l3p.td"
expect_ok "its info" "$CK" info "$WORK/l3p.td"
check "its tables hold 384 rows" grep -q "vocabulary 384 (padded)" "$WORK/.out"
expect_ok "GGUF from torch_dist with --true-vocab-size 300" "$CK" export "$WORK/l3p.td" --format gguf --tokenizer "$WORK/tok" \
    --true-vocab-size 300 --name "Llama (tp-toolkit)" -o "$WORK/l3p-true.gguf"
expect_ok "GGUF of the model it was written from" "$CK" export "$WORK/l3p" --format gguf --tokenizer "$WORK/tok" \
    -o "$WORK/l3p.gguf"
expect_ok "the same bytes" cmp "$WORK/l3p-true.gguf" "$WORK/l3p.gguf"
expect_ok "GGUF from torch_dist, the table as stored" "$CK" export "$WORK/l3p.td" --format gguf --tokenizer "$WORK/tok" \
    -o "$WORK/l3p-padded.gguf"
expect_ok "tp-train eval of the padded Llama 3" "$BIN/tp-train" eval --ckpt "$WORK/l3p" --data "$WORK/text.bin" --windows 8 \
    --seq 32 --json
cp "$WORK/.out" "$WORK/l3p-eval.json"
llama_cpp loss "$WORK/l3p-true.gguf" "$WORK/text.bin" --windows 8 --seq 32
if judged_by_llama_cpp "the true-vocabulary GGUF's loss"; then
    check_all "llama.cpp's loss of the GGUF from torch_dist at the true vocabulary is tp-train eval's" \
        '[ "$RC" -eq 0 ] && same_loss "$WORK/l3p-eval.json" "$WORK/.out" 1e-5'
    llama_cpp loss "$WORK/l3p-padded.gguf" "$WORK/text.bin" --windows 8 --seq 32
    check_all "the padded table's is not" '[ "$RC" -eq 0 ] && ! same_loss "$WORK/l3p-eval.json" "$WORK/.out" 1e-5'
fi
"$PY" -c 'import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["type"] = "WordPiece"
json.dump(t, open(sys.argv[1], "w"))' "$WORK/tok/tokenizer.json"
expect_error "a WordPiece tokenizer is refused" 1 "not a BPE tokenizer \\(model.type WordPiece" "$CK" export "$WORK/v300" \
    --format gguf --tokenizer "$WORK/tok" -o "$WORK/never.gguf"

# --- What this Llama cannot express is refused, naming it.
# edit DIR KEY VALUE: a copy of the Hugging Face directory with one config key set.
edit() {
    rm -rf "$WORK/edit" && cp -r "$1" "$WORK/edit"
    "$PY" -c 'import json, sys
c = json.load(open(sys.argv[1]))
c[sys.argv[2]] = json.loads(sys.argv[3])
json.dump(c, open(sys.argv[1], "w"))' "$WORK/edit/config.json" "$2" "$3"
}
edit "$WORK/hf" attention_bias true
expect_error "attention biases" 1 "attention_bias must be false" "$CK" import "$WORK/edit" --tp 1 --pp 1 -o "$WORK/never"
edit "$WORK/hf" hidden_act '"gelu"'
expect_error "another activation" 1 "hidden_act gelu" "$CK" import "$WORK/edit" --tp 1 --pp 1 -o "$WORK/never"
edit "$WORK/hf" rope_scaling '{"rope_type": "yarn", "factor": 4}'
expect_error "another rope scaling" 1 "config.json: rope_scaling: rope_type yarn: of the scaled types, Llama 3.s .llama3. is computed" \
    "$CK" import "$WORK/edit" --tp 1 --pp 1 -o "$WORK/never"
edit "$WORK/hf" head_dim 32
expect_error "a head_dim of its own" 1 "head_dim 32" "$CK" import "$WORK/edit" --tp 1 --pp 1 -o "$WORK/never"
# A file without one of its tensors (rewritten by hand: header and data).
rm -rf "$WORK/edit" && cp -r "$WORK/hf" "$WORK/edit"
"$PY" - "$WORK/edit/model.safetensors" <<'PYEOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
data = raw[8 + n:]
del h["model.layers.1.self_attn.k_proj.weight"]
out, at = {"__metadata__": h.pop("__metadata__")}, 0
blob = b""
for k, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    b, e = v["data_offsets"]
    out[k] = dict(v, data_offsets=[at, at + e - b])
    blob += data[b:e]
    at += e - b
header = json.dumps(out).encode()
header += b" " * (-len(header) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + blob)
PYEOF
expect_error "a missing k_proj" 1 "model.layers.1.self_attn.k_proj.weight \\(part 1 of model/layers.1.attn.qkv.weight\\) is missing" \
    "$CK" import "$WORK/edit" --tp 1 --pp 1 -o "$WORK/never"
check "nothing was written for refused imports" test ! -e "$WORK/never"
finish
