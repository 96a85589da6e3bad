#!/bin/sh
# End-to-end tests of export, import, eval and generate on a small GPT-2
# trained here at tp2pp2 (vocabulary 250, padded at tp4), resharded to
# tp1pp1 and tp4pp1:
#   - tp-train eval agrees across layouts; the safetensors export loaded into
#     the independent PyTorch GPT-2 gives the same loss (1e-5 relative), and
#     so does transformers' from_pretrained where it is installed;
#   - every exported tensor equals the checkpoint's (independent parsers of
#     safetensors, GGUF and HDF5), in fp32, bf16 and fp16, sharded or not;
#   - GGUF metadata: general.type, name and size label; no_vocab for this
#     vocabulary, a --tokenizer's BPE vocabulary, and for a byte-level model
#     (vocabulary 256, synthesized) GPT-2's byte symbols, with which
#     llama.cpp's tokenizer (emulated) gives exactly tp-train prepare's
#     tokens of a text; each of these checks shown to fail on damaged input;
#   - exports from the three layouts are byte-identical but for the source
#     layout they record;
#   - export then import is bit-exact, into tp-train's resume;
#   - greedy generation equals PyTorch's; sampling repeats with its seed;
#   - bad input gives one clear error and leaves nothing behind.
# tier: full
. "$(dirname "$0")/lib.sh"

use_open_mpi
CKPT="$BIN/tp-ckpt"
TRAIN="$BIN/tp-train"
CHECK="$ROOT/tests/trainer/check_export.py"
MODEL="--model tiny --vocab 250"

# --- A model that has learned something: a repeated sentence.
"$PY" -c "print('the quick brown fox jumps over the lazy dog. ' * 300, end='')" >"$WORK/fox.txt"
expect_ok "prepare tokens" "$TRAIN" prepare "$WORK/fox.txt" -o "$WORK/fox.bin"
# Held-out text: the same words shuffled, so that the loss is neither tiny
# (where fp32 rounding of logsumexp - target dominates it) nor huge.
"$PY" -c "import random; w = 'the quick brown fox jumps over the lazy dog.'.split(); r = random.Random(5); print(' '.join(r.choice(w) for _ in range(400)), end='')" >"$WORK/held.txt"
expect_ok "prepare held-out tokens" "$TRAIN" prepare "$WORK/held.txt" -o "$WORK/held.bin"
expect_ok "train at tp2pp2" mpirun --oversubscribe -np 4 "$TRAIN" $MODEL --tp 2 --pp 2 --micro-batch 4 --grad-accum 2 \
    --steps 120 --lr 1e-2 --data "$WORK/fox.bin" --ckpt-dir "$WORK/run" --quiet </dev/null
SRC="$WORK/run/step_00000120"
expect_ok "reshard to tp1pp1" "$BIN/tp-reshard" "$SRC" --to tp1pp1 -o "$WORK/tp1pp1"
expect_ok "reshard to tp4pp1" "$BIN/tp-reshard" "$SRC" --to tp4pp1 -o "$WORK/tp4pp1"

json_field() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# --- eval at three layouts: the same loss (summation order aside).
EVAL="--data $WORK/held.bin --windows 24 --seq 32 --micro-batch 5 --json"
run "$TRAIN" eval --ckpt "$SRC" $EVAL
cp "$WORK/.out" "$WORK/eval1.json"
check "eval (one process) succeeds" [ "$RC" -eq 0 ]
run mpirun --oversubscribe -np 4 "$TRAIN" eval --ckpt "$WORK/run" --tp 2 --pp 2 $EVAL </dev/null
cp "$WORK/.out" "$WORK/eval4.json"
check "eval at tp2pp2 succeeds" [ "$RC" -eq 0 ]
run mpirun --oversubscribe -np 2 "$TRAIN" eval --ckpt "$WORK/tp4pp1" --pp 2 $EVAL </dev/null
cp "$WORK/.out" "$WORK/eval2.json"
check "eval at pp2 of a tp4 checkpoint succeeds" [ "$RC" -eq 0 ]
LOSS=$(json_field "$WORK/eval1.json" loss)
check "eval reports windows and tokens" [ "$(json_field "$WORK/eval1.json" windows)" = 24 ] && \
    check "eval counts tokens" [ "$(json_field "$WORK/eval1.json" tokens)" = 768 ]
check "eval: tp2pp2 and one process agree" same_loss "$WORK/eval1.json" "$WORK/eval4.json" 1e-5
check "eval: pp2 (from tp4) and one process agree" same_loss "$WORK/eval1.json" "$WORK/eval2.json" 1e-5
run "$TRAIN" eval --ckpt "$SRC" --data "$WORK/fox.bin" --seq 32 --json
check "eval: the model learned the sentence" "$PY" -c "import json, sys; sys.exit(not json.load(open(sys.argv[1]))['loss'] < 0.1)" "$WORK/.out"
check "eval of every window by default" [ "$(json_field "$WORK/.out" windows)" = $(( (13500 - 1) / 32 )) ]

# --- safetensors: independent parse, every tensor, the loss in PyTorch.
for layout in tp2pp2:$SRC tp1pp1:$WORK/tp1pp1 tp4pp1:$WORK/tp4pp1; do
    name=${layout%%:*} from=${layout#*:}
    expect_ok "export safetensors from $name" "$CKPT" export "$from" --format safetensors -o "$WORK/hf-$name"
    expect_ok "export gguf from $name" "$CKPT" export "$from" --format gguf -o "$WORK/$name.gguf"
    expect_ok "export hdf5 from $name" "$CKPT" export "$from" --format hdf5 -o "$WORK/$name.h5"
done
run "$PY" "$CHECK" safetensors "$WORK/hf-tp2pp2" "$SRC" --data "$WORK/held.bin" --windows 24 --seq 32 --loss "$LOSS"
if [ "$RC" -eq 0 ] && grep -q "relative (tolerance 1e-5) ok" "$WORK/.out"; then pass; else failed "safetensors against the checkpoint and PyTorch"; fi
run "$PY" "$CHECK" gguf "$WORK/tp2pp2.gguf" "$SRC"
check "gguf against the checkpoint" [ "$RC" -eq 0 ]
run "$PY" "$CHECK" hdf5 "$WORK/tp2pp2.h5" "$SRC"
check "hdf5 against the checkpoint" [ "$RC" -eq 0 ]
run "$PY" "$CHECK" transformers "$WORK/hf-tp2pp2" --data "$WORK/held.bin" --windows 24 --seq 32 --loss "$LOSS"
if [ "$RC" -eq 77 ]; then echo "[SKIP] [$NAME] transformers' GPT2LMHeadModel.from_pretrained: transformers is not installed"
else check "transformers loads the export with the same loss" [ "$RC" -eq 0 ]; fi

# Byte-identical exports whatever the source layout, but for the layout
# recorded as provenance (the same number of bytes: tpXppY).
same_but_layout() {
    "$PY" - "$@" <<'PYEOF'
import sys
a, b, la, lb = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), sys.argv[3].encode(), sys.argv[4].encode()
if len(a) != len(b) or a.count(la) != 1 or b.count(lb) != 1 or a.index(la) != b.index(lb):
    sys.exit("sizes or the recorded layout differ in place")
at = a.index(la)
if a[:at] != b[:at] or a[at + len(la):] != b[at + len(lb):]:
    sys.exit("files differ beyond the recorded layout")
PYEOF
}
for other in tp1pp1 tp4pp1; do
    check "safetensors from tp2pp2 and $other identical but for the layout" \
        same_but_layout "$WORK/hf-tp2pp2/model.safetensors" "$WORK/hf-$other/model.safetensors" tp2pp2 "$other"
    check "config.json from tp2pp2 and $other identical" cmp -s "$WORK/hf-tp2pp2/config.json" "$WORK/hf-$other/config.json"
    check "gguf from tp2pp2 and $other byte-identical" cmp -s "$WORK/tp2pp2.gguf" "$WORK/$other.gguf"
    check "hdf5 from tp2pp2 and $other identical but for the layout" \
        same_but_layout "$WORK/tp2pp2.h5" "$WORK/$other.h5" tp2pp2 "$other"
done

# Other dtypes and sharding, checked the same way.
expect_ok "export bf16 in shards" "$CKPT" export "$SRC" --format safetensors --dtype bf16 --max-shard-size 64K -o "$WORK/hf-bf16"
SHARDS=$(ls "$WORK/hf-bf16" | grep -c '^model-[0-9]\{5\}-of-[0-9]\{5\}\.safetensors$')
check "bf16 export is sharded with an index" [ -f "$WORK/hf-bf16/model.safetensors.index.json" ] && \
    check "bf16 shards are numbered" [ "$SHARDS" -gt 1 ] && \
    check "the last shard is N of N" [ -f "$WORK/hf-bf16/$(printf 'model-%05d-of-%05d.safetensors' "$SHARDS" "$SHARDS")" ]
run "$PY" "$CHECK" safetensors "$WORK/hf-bf16" "$SRC"
check "bf16 shards against the checkpoint" [ "$RC" -eq 0 ]
expect_ok "export fp16 gguf" "$CKPT" export "$SRC" --format gguf --dtype fp16 -o "$WORK/fp16.gguf"
run "$PY" "$CHECK" gguf "$WORK/fp16.gguf" "$SRC"
check "fp16 gguf against the checkpoint" [ "$RC" -eq 0 ]
expect_ok "export bf16 hdf5" "$CKPT" export "$SRC" --format hdf5 --dtype bf16 -o "$WORK/bf16.h5"
run "$PY" "$CHECK" hdf5 "$WORK/bf16.h5" "$SRC" --dtype bf16
check "bf16 hdf5 against the checkpoint" [ "$RC" -eq 0 ]

# A GGUF with a GPT-2 BPE tokenizer (a small one covering the vocabulary).
mkdir "$WORK/tokenizer"
"$PY" - "$WORK/tokenizer" <<'PYEOF'
import json, sys
vocab = {f"t{i}": i for i in range(249)}
vocab["<|endoftext|>"] = 249
json.dump(vocab, open(sys.argv[1] + "/vocab.json", "w"))
open(sys.argv[1] + "/merges.txt", "w").write("#version: 0.2\nt 1\nt1 0\n")
PYEOF
expect_ok "export gguf with a tokenizer" "$CKPT" export "$SRC" --format gguf --tokenizer "$WORK/tokenizer" -o "$WORK/tok.gguf"
run "$PY" "$CHECK" gguf "$WORK/tok.gguf" "$SRC" --tokenizer "$WORK/tokenizer"
check "gguf tokenizer matches vocab.json and merges.txt" [ "$RC" -eq 0 ]
# merges.txt with lines ended by CR alone (old Mac line ends): the lines were
# counted by LF and split at both, past the end of the list (heap corrupted,
# exit 134 or 139). Python's splitlines, as the checker reads it, splits at both.
mkdir "$WORK/tokenizer-cr"
cp "$WORK/tokenizer/vocab.json" "$WORK/tokenizer-cr/"
printf '#version: 0.2\rt 1\rt1 0\rt 2\rt 3\rt 4\rt 5\rt 6\rt 7\rt 8\r' >"$WORK/tokenizer-cr/merges.txt"
expect_ok "export gguf with a tokenizer whose merges.txt ends lines with CR" "$CKPT" export "$SRC" --format gguf \
    --tokenizer "$WORK/tokenizer-cr" -o "$WORK/tok-cr.gguf"
run "$PY" "$CHECK" gguf "$WORK/tok-cr.gguf" "$SRC" --tokenizer "$WORK/tokenizer-cr"
check "gguf tokenizer matches the CR-ended merges.txt" [ "$RC" -eq 0 ]
# A tokenizer.json of a Unigram model (T5's): model.vocab a list of pairs,
# which the byte count read as names (exit 139); refused, saying what it is.
mkdir "$WORK/unigram"
printf '{"model":{"type":"Unigram","vocab":[["<unk>",0.0],["a",-1.0]]}}' >"$WORK/unigram/tokenizer.json"
expect_error "export with a Unigram tokenizer.json: refused" 1 "unigram/tokenizer.json: not a BPE tokenizer \(model.type Unigram" \
    "$CKPT" export "$SRC" --format gguf --tokenizer "$WORK/unigram" -o "$WORK/unigram.gguf"
printf '{"model":{"type":"BPE","vocab":[["a",1]],"merges":[]}}' >"$WORK/unigram/tokenizer.json"
expect_error "export with a BPE tokenizer.json whose vocab is a list: refused" 1 "unigram/tokenizer.json: not a BPE tokenizer" \
    "$CKPT" export "$SRC" --format gguf --tokenizer "$WORK/unigram" -o "$WORK/unigram.gguf"
printf '{"model":{"type":"BPE","vocab":{"a":"0"},"merges":[]}}' >"$WORK/unigram/tokenizer.json"
expect_error "export with a token id given as a string: said so" 1 "unigram/tokenizer.json: token 'a' has no numeric id" \
    "$CKPT" export "$SRC" --format gguf --tokenizer "$WORK/unigram" -o "$WORK/unigram.gguf"

# The vocabulary-250 exports above say no_vocab (the checker requires it);
# a GGUF with a vocabulary is refused without the --tokenizer it came from.
run "$PY" "$CHECK" gguf "$WORK/tok.gguf" "$SRC"
if [ "$RC" -eq 1 ] && grep -q "tokenizer.ggml.model = (8, 'gpt2'), expected the string no_vocab" "$WORK/.out"; then pass
else failed "the no_vocab check fails on a vocabulary-250 GGUF with a vocabulary"; fi

# A byte-level model (vocabulary 256, as tp-train prepare makes them) needs no
# --tokenizer: its GGUF holds GPT-2's byte symbols, so that llama.cpp's
# tokenizer turns text into exactly the tokens tp-train prepare writes
# (punctuation, spaces, tabs and newlines, digits, 2- and 3-byte UTF-8).
expect_ok "synth a byte-level model" "$CKPT" synth -o "$WORK/bytes" --tp 2 --pp 1 --model tiny
"$PY" -c 'import sys; open(sys.argv[1], "wb").write("naïve café — 42!\n\tTabs, \"quotes\" & <tags>; ~end~ \x7f\x00 ok".encode())' "$WORK/utf8.txt"
expect_ok "prepare text of every kind of byte" "$TRAIN" prepare "$WORK/utf8.txt" -o "$WORK/utf8.bin"
expect_ok "export the byte-level model as gguf" "$CKPT" export "$WORK/bytes" --format gguf --name "bytes" -o "$WORK/bytes.gguf"
run "$PY" "$CHECK" gguf "$WORK/bytes.gguf" "$WORK/bytes" --name bytes --text "$WORK/utf8.txt" --prepared "$WORK/utf8.bin"
if [ "$RC" -eq 0 ] && grep -q "tokenize as tp-train prepare's tokens" "$WORK/.out"; then pass
else failed "byte-level gguf: its vocabulary tokenizes text as tp-train prepare does"; fi
run "$PY" "$CHECK" gguf "$WORK/bytes.gguf" "$WORK/bytes" --name bytes --text "$WORK/utf8.txt" --prepared "$WORK/fox.bin"
if [ "$RC" -eq 1 ] && grep -q -- "--text: 58 tokens from the GGUF's vocabulary, 13500 in" "$WORK/.out"; then pass
else failed "the tokenization check fails on another text's tokens"; fi
run "$PY" "$CHECK" gguf "$WORK/tp2pp2.gguf" "$SRC" --tokenizer "$WORK/tokenizer"
if [ "$RC" -eq 1 ] && grep -q "tokenizer.ggml.model = (8, 'no_vocab'), expected the string gpt2" "$WORK/.out"; then pass
else failed "the vocabulary check fails on a GGUF without the tokenizer asked for"; fi
run "$PY" "$CHECK" gguf "$WORK/bytes.gguf" "$WORK/bytes"
if [ "$RC" -eq 1 ] && grep -q "general.name = (8, 'bytes'), expected the string 'GPT-2 (tp-toolkit)'" "$WORK/.out"; then pass
else failed "the general.name check fails on another name"; fi
# Each byte-vocabulary check fails on a copy damaged in place (the same
# sizes): two symbols swapped, a BOS added, a BOS outside the vocabulary,
# another general.type and size label.
"$PY" - "$WORK/bytes.gguf" "$WORK/bytes-bad.gguf" <<'PYEOF'
import struct, sys
raw = open(sys.argv[1], "rb").read()
def s(text): return struct.pack("<Q", len(text)) + text
for old, new in ((s(b"a") + s(b"b"), s(b"b") + s(b"a")),
                 (b"add_bos_token\x07\x00\x00\x00\x00", b"add_bos_token\x07\x00\x00\x00\x01"),
                 (b"bos_token_id\x04\x00\x00\x00\x00\x00\x00\x00", b"bos_token_id\x04\x00\x00\x00\x00\x01\x00\x00"),
                 (s(b"model"), s(b"adapt")), (s(b"119K"), s(b"120K"))):
    assert raw.count(old) == 1, old
    raw = raw.replace(old, new)
open(sys.argv[2], "wb").write(raw)
PYEOF
run "$PY" "$CHECK" gguf "$WORK/bytes-bad.gguf" "$WORK/bytes" --name bytes --text "$WORK/utf8.txt" --prepared "$WORK/utf8.bin"
check "a damaged byte-level gguf fails the checker" [ "$RC" -eq 1 ]
for pattern in "not GPT-2's byte symbols in byte order (bytes \[97, 98\] differ)" "add_bos_token = (7, True)" \
    "bos_token_id = (4, 256) is not a u32 token" "general.type = (8, 'adapt')" \
    "general.size_label = (8, '120K'), 118528 parameters make the string 119K" "--text: .*first difference at 1$"; do
    check "the damaged byte-level gguf is caught: $pattern" grep -q -- "$pattern" "$WORK/.out"
done
# With --tokenizer, a byte-level model gets that vocabulary instead, the ids
# vocab.json lacks (250 to 255) as unused [PADn].
expect_ok "export the byte-level model with a tokenizer" "$CKPT" export "$WORK/bytes" --format gguf \
    --tokenizer "$WORK/tokenizer" -o "$WORK/bytes-tok.gguf"
run "$PY" "$CHECK" gguf "$WORK/bytes-tok.gguf" "$WORK/bytes" --tokenizer "$WORK/tokenizer"
check "byte-level gguf with --tokenizer: vocab.json, [PADn] unused, merges" [ "$RC" -eq 0 ]
# A size label with a decimal (gguf-py's notation keeps two significant
# digits), for a model of yet another vocabulary (300: no_vocab), in bf16.
expect_ok "synth a model of 1.7M parameters" "$CKPT" synth -o "$WORK/mid" --tp 2 --pp 1 --layers 2 --dim 256 --heads 4 \
    --vocab 300 --seq 64
expect_ok "export it as a bf16 gguf" "$CKPT" export "$WORK/mid" --format gguf --dtype bf16 -o "$WORK/mid.gguf"
run "$PY" "$CHECK" gguf "$WORK/mid.gguf" "$WORK/mid"
if [ "$RC" -eq 0 ] && grep -q "(size label 1.7M)" "$WORK/.out"; then pass
else failed "a 1.7M-parameter gguf: size label 1.7M, no_vocab, every tensor"; fi

# --- llama.cpp itself as the judge (tests/trainer/llama_cpp.mjs): a
# byte-level GPT-2 trained here, its GGUF loaded and run by llama.cpp's own
# library. Its loss on the held-out windows is tp-train eval's (fp32 in
# both; 1e-4: llama.cpp's CPU backend takes GELU from a table of its fp16
# inputs, GGML_GELU_FP16, which moved the loss of GPT-2s trained longer by up
# to 2e-5, measured against an fp64 GPT-2 reading the same GGUF; 3.4e-6
# here), its greedy continuation tp-train generate's, and its tokenizer gives
# tp-train prepare's tokens of text of every kind of byte.
expect_ok "train a byte-level GPT-2 at tp2" mpirun --oversubscribe -np 2 "$TRAIN" --model tiny --tp 2 --micro-batch 4 \
    --steps 120 --lr 1e-2 --data "$WORK/fox.bin" --ckpt-dir "$WORK/brun" --quiet </dev/null
BSRC="$WORK/brun/step_00000120"
expect_ok "export it as GGUF" "$CKPT" export "$BSRC" --format gguf -o "$WORK/trained.gguf"
expect_ok "tp-train eval of it" "$TRAIN" eval --ckpt "$BSRC" $EVAL
cp "$WORK/.out" "$WORK/trained-eval.json"
llama_cpp loss "$WORK/trained.gguf" "$WORK/held.bin" --windows 24 --seq 32
if judged_by_llama_cpp "the loss, greedy continuation and tokens of GPT-2 GGUF exports"; then
    cp "$WORK/.out" "$WORK/trained-llama.json"
    check "llama.cpp's loss of the GGUF is tp-train eval's" [ "$RC" -eq 0 ] &&
        check "to 1e-4" same_loss "$WORK/trained-eval.json" "$WORK/trained-llama.json" 1e-4
    # bf16 (GGML type 30) as llama.cpp reads it: the weights' rounding moves
    # the loss by about 4e-4 relative.
    expect_ok "export it as a bf16 GGUF" "$CKPT" export "$BSRC" --format gguf --dtype bf16 -o "$WORK/trained-bf16.gguf"
    llama_cpp loss "$WORK/trained-bf16.gguf" "$WORK/held.bin" --windows 24 --seq 32
    cp "$WORK/.out" "$WORK/trained-bf16-llama.json"
    check "llama.cpp's loss of the bf16 GGUF" [ "$RC" -eq 0 ] &&
        check "is tp-train eval's to 2e-3" same_loss "$WORK/trained-eval.json" "$WORK/trained-bf16-llama.json" 2e-3
    expect_ok "tp-train generate, greedy" "$TRAIN" generate --ckpt "$BSRC" --prompt "the quick " --tokens 22 --temperature 0
    cp "$WORK/.out" "$WORK/generated.txt"
    llama_cpp generate "$WORK/trained.gguf" --prompt "the quick " --tokens 22
    check "llama.cpp continues the prompt as tp-train generate does" [ "$RC" -eq 0 ] &&
        check "with the same text" cmp "$WORK/.out" "$WORK/generated.txt"
    llama_cpp tokenize "$WORK/bytes.gguf" "$WORK/utf8.txt" --prepared "$WORK/utf8.bin"
    check "llama.cpp's tokenizer gives tp-train prepare's tokens of every kind of byte" [ "$RC" -eq 0 ]
    # The judge can fail: with block 0's query and key rows swapped, the
    # file is still a well-formed GPT-2 to llama.cpp, and its loss is not
    # tp-train's; text other than the token file's is refused.
    "$PY" - "$WORK/trained.gguf" "$WORK/swapped.gguf" "$ROOT/tests/trainer" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[3])
import check_export as ce
raw = bytearray(open(sys.argv[1], "rb").read())
r = ce.Reader(raw)
r.at = 4
version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
kv = {}
for _ in range(n_kv):
    key, kind = r.string(), r.take("<I")
    kv[key] = (kind, r.value(kind))
alignment, infos, data = ce.tensor_infos(r, kv, n_tensors)
name, ne, kind, offset = next(i for i in infos if i[0] == "blk.0.attn_qkv.weight")
third = ne[0] * ne[1] // 3 * 4  # [3d rows of d] fp32: q, k, v
at = data + offset
raw[at:at + 2 * third] = raw[at + third:at + 2 * third] + raw[at:at + third]
open(sys.argv[2], "wb").write(raw)
PYEOF
    llama_cpp loss "$WORK/swapped.gguf" "$WORK/held.bin" --windows 24 --seq 32
    cp "$WORK/.out" "$WORK/swapped-llama.json"
    check "a GGUF with query and key swapped runs in llama.cpp" [ "$RC" -eq 0 ] &&
        check_all "its loss is not tp-train eval's to that tolerance" \
            '! same_loss "$WORK/trained-eval.json" "$WORK/swapped-llama.json" 1e-4'
    llama_cpp tokenize "$WORK/bytes.gguf" "$WORK/utf8.txt" --prepared "$WORK/fox.bin"
    check "the tokenizer check fails on another text's tokens" [ "$RC" -eq 1 ] &&
        check "naming the first token that differs" grep -q "^llama_cpp: token 0: llama.cpp 110, the token file 116" "$WORK/.err"
fi

# --- import: bit-exact round trip, at other layouts, and training from it.
expect_ok "weights-only copy of the source" "$BIN/tp-reshard" "$SRC" --to tp2pp2 --no-optim -o "$WORK/weights"
expect_ok "import at tp4pp2" "$CKPT" import "$WORK/hf-tp2pp2" -o "$WORK/imported" --tp 4 --pp 2
expect_ok "import is bit-exact" "$CKPT" diff "$WORK/imported" "$WORK/weights"
expect_ok "imported checkpoint verifies" "$CKPT" verify "$WORK/imported"
expect_ok "import sharded bf16 as fp32" "$CKPT" import "$WORK/hf-bf16" -o "$WORK/imported16" --tp 1 --pp 1
expect_ok "bf16 round trip within bf16 rounding" "$CKPT" diff "$WORK/imported16" "$WORK/weights" --tol 4e-3 --atol 1e-6
mkdir "$WORK/trainrun"
expect_ok "import into a run directory" "$CKPT" import "$WORK/hf-tp1pp1" -o "$WORK/trainrun/step_00000000" --tp 2 --pp 1
run mpirun --oversubscribe -np 2 "$TRAIN" $MODEL --tp 2 --steps 2 --lr 1e-3 --data "$WORK/fox.bin" \
    --ckpt-dir "$WORK/trainrun" --resume </dev/null
if [ "$RC" -eq 0 ] && grep -q "resumed from .*step_00000000 at step 0" "$WORK/.out" && \
    grep -q "no optimizer state" "$WORK/.out" && [ -d "$WORK/trainrun/step_00000002" ]; then pass
else failed "tp-train resumes from an imported checkpoint"; fi
# Files saved by GPT2Model (no "transformer." prefix), with the old attention
# buffers and a tied lm_head, import the same; an untied lm_head does not.
"$PY" - "$WORK/hf-tp2pp2" "$WORK/hf-plain" "$WORK/hf-untied" <<'PYEOF'
import json, os, shutil, struct, sys
src, plain, untied = sys.argv[1:4]
raw = open(src + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
def write(path, entries):
    os.mkdir(path)
    shutil.copy(src + "/config.json", path)
    out, blob = {"__metadata__": {"format": "pt"}}, b""
    for name, (entry, payload) in entries.items():
        out[name] = {"dtype": entry["dtype"], "shape": entry["shape"], "data_offsets": [len(blob), len(blob) + len(payload)]}
        blob += payload
    text = json.dumps(out).encode()
    open(path + "/model.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + blob)
tensors = {k[len("transformer."):]: (v, data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items() if k != "__metadata__"}
mask = ({"dtype": "F32", "shape": [1, 1, 2, 2]}, struct.pack("<4f", 1, 0, 1, 1))
entries = dict(tensors, **{"h.0.attn.bias": mask, "h.1.attn.masked_bias": ({"dtype": "F32", "shape": []}, struct.pack("<f", -1e4)),
                           "lm_head.weight": tensors["wte.weight"]})
write(plain, entries)
wte = tensors["wte.weight"]
entries["lm_head.weight"] = (wte[0], bytes(len(wte[1])))
write(untied, entries)
PYEOF
expect_ok "import without the transformer. prefix, buffers and tied lm_head" \
    "$CKPT" import "$WORK/hf-plain" -o "$WORK/imported-plain" --tp 2 --pp 1
expect_ok "prefix-less import is bit-exact" "$CKPT" diff "$WORK/imported-plain" "$WORK/weights"
expect_error "an untied lm_head is refused" 1 "untied output head" \
    "$CKPT" import "$WORK/hf-untied" -o "$WORK/bad-untied" --tp 1 --pp 1
check "nothing written for the untied import" [ ! -e "$WORK/bad-untied" ]

# --- generate: greedy equals PyTorch's greedy; sampling repeats with its seed.
run "$TRAIN" generate --ckpt "$SRC" --prompt "the quick " --tokens 30 --temperature 0
cp "$WORK/.out" "$WORK/greedy.txt"
check "greedy generation succeeds" [ "$RC" -eq 0 ]
run "$PY" "$CHECK" generate "$SRC" --prompt "the quick " --tokens 30
check "greedy generation equals PyTorch's" cmp -s "$WORK/.out" "$WORK/greedy.txt"
check "the model continues the sentence" grep -q "the quick brown fox jumps" "$WORK/greedy.txt"
run "$TRAIN" generate --ckpt "$WORK/tp4pp1" --prompt "the " --tokens 40 --seed 7
cp "$WORK/.out" "$WORK/sample1.txt"
run "$TRAIN" generate --ckpt "$SRC" --prompt "the " --tokens 40 --seed 7
check "sampling with one seed repeats, from any layout" cmp -s "$WORK/.out" "$WORK/sample1.txt"
check "a byte-level model (vocabulary 250) generates without a warning" [ ! -s "$WORK/.err" ]
# top-k and top-p (tests/trainer/test_sampling.c checks their shares):
# one token kept is the greedy text at any temperature; neither narrowing
# draws as before.
expect_ok "generate --top-k 1 at temperature 3" "$TRAIN" generate --ckpt "$SRC" --prompt "the quick " --tokens 30 \
    --temperature 3 --top-k 1 --seed 11
check "top-k 1 is the greedy text" cmp -s "$WORK/.out" "$WORK/greedy.txt"
expect_ok "generate --top-p 1e-9 at temperature 3" "$TRAIN" generate --ckpt "$SRC" --prompt "the quick " --tokens 30 \
    --temperature 3 --top-p 1e-9 --seed 11
check "top-p near 0 is the greedy text" cmp -s "$WORK/.out" "$WORK/greedy.txt"
expect_ok "generate --top-k 0 --top-p 1" "$TRAIN" generate --ckpt "$SRC" --prompt "the " --tokens 40 --seed 7 --top-k 0 \
    --top-p 1
check "no narrowing draws as the default does" cmp -s "$WORK/.out" "$WORK/sample1.txt"
for p in 0 1.5 -0.5 nan; do
    expect_error "generate --top-p $p" 2 "^tp-train generate: --top-p expects .*, got '$p'" \
        "$TRAIN" generate --ckpt "$SRC" --prompt "the " --top-p "$p"
done
expect_error "generate --top-k -1" 2 "^tp-train generate: --top-k expects an integer in 0\.\.2147483647, got '-1'" "$TRAIN" generate \
    --ckpt "$SRC" --prompt "the " --top-k -1
# A model of another tokenizer's ids (more than 256 tokens): bytes in and
# out mean nothing to it, which was not said.
expect_ok "synthesize a model of GPT-2's vocabulary" "$CKPT" synth -o "$WORK/bpe" --tp 1 --pp 1 --model tiny --vocab 50257
expect_ok "generate with it" "$TRAIN" generate --ckpt "$WORK/bpe" --prompt "the " --tokens 4 --seed 7
check "it says the prompt is read as bytes, which a vocabulary of 50257 was not trained on" \
    grep -q "^tp-train: warning: the model's vocabulary has 50257 tokens, more than the 256 bytes" "$WORK/.err"

# --- Bad input: one line, the right exit status, nothing half-written.
expect_ok "synthesize a SwiGLU model" "$CKPT" synth -o "$WORK/swiglu" --tp 1 --pp 1 --layers 2 --dim 64 --heads 4 \
    --vocab 250 --seq 32 --swiglu
expect_error "SwiGLU cannot be exported as GPT-2" 1 "SwiGLU MLP cannot be expressed" \
    "$CKPT" export "$WORK/swiglu" --format safetensors -o "$WORK/bad-export"
expect_error "SwiGLU cannot be exported as GGUF" 1 "cannot be expressed as llama.cpp" \
    "$CKPT" export "$WORK/swiglu" --format gguf -o "$WORK/bad.gguf"
check "no output from refused exports" [ ! -e "$WORK/bad-export" ] && check "no gguf from refused exports" [ ! -e "$WORK/bad.gguf" ]
expect_error "unknown format" 2 "unknown format 'onnx'" "$CKPT" export "$SRC" --format onnx -o "$WORK/x"
expect_error "export over an existing output" 1 "already exists" "$CKPT" export "$SRC" --format gguf -o "$WORK/tp2pp2.gguf"
expect_ok "export over it with --force" "$CKPT" export "$SRC" --format gguf -o "$WORK/tp2pp2.gguf" --force
check "no staging leftovers" [ -z "$(find "$WORK" -maxdepth 1 -name '.*staging*')" ]

# --force replaces only an earlier export of ours, known by its mark (the
# GGUF key and safetensors __metadata__ tp_toolkit.format, HDF5's root
# attribute format), not any file with the format's signature; and no
# output is written inside its input (exit 2, naming both).
expect_ok "export hdf5 over an earlier one with --force" "$CKPT" export "$SRC" --format hdf5 -o "$WORK/tp2pp2.h5" --force
expect_ok "export safetensors over an earlier one with --force" "$CKPT" export "$SRC" --format safetensors \
    -o "$WORK/hf-tp2pp2" --force
SHARD="$SRC/shard_pp00_tp00.h5"
BEFORE=$(md5sum <"$SHARD")
expect_error "--force onto a shard of the source checkpoint" 2 \
    "the output .*step_00000120/shard_pp00_tp00.h5 lies inside the input .*/run" \
    "$CKPT" export "$WORK/run" --format hdf5 -o "$SHARD" --force
check "the shard is untouched" [ "$(md5sum <"$SHARD")" = "$BEFORE" ]
expect_ok "and the checkpoint verifies" "$CKPT" verify "$WORK/run"
expect_error "an export into the source checkpoint" 2 "the output .*step_00000120/m.gguf lies inside the input .*step_00000120" \
    "$CKPT" export "$SRC" --format gguf -o "$SRC/m.gguf"
check_all "nothing written into the source" '[ ! -e "$SRC/m.gguf" ] && [ -z "$(find "$SRC" -name ".*staging*")" ]'
# An export named step_N among a run's checkpoints is not one of them: the
# trainer reaching step N stopped there. Refused before anything is written.
expect_error "an export named step_N in a run directory: refused, saying why" 2 \
    "/run is a run directory, where step_00000130 names one of the run's checkpoints, which an export is not" \
    "$CKPT" export "$SRC" --format safetensors -o "$WORK/run/step_00000130"
check "nothing written there" [ ! -e "$WORK/run/step_00000130" ]
expect_ok "the same name outside a run directory is anyone's" "$CKPT" export "$SRC" --format gguf \
    -o "$WORK/step_00000130"
cp "$SHARD" "$WORK/shard-copy.h5"
expect_error "--force onto an HDF5 file that is no export (a shard's copy)" 1 \
    "shard-copy.h5 is not an HDF5 export \\(an HDF5 file whose root attribute format is 'tp-ckpt', not 'tp-toolkit merged weights'\\)" \
    "$CKPT" export "$SRC" --format hdf5 -o "$WORK/shard-copy.h5" --force
check "the HDF5 file is untouched" cmp -s "$SHARD" "$WORK/shard-copy.h5"
# A GGUF file without the mark: an export of ours with its first key renamed.
"$PY" - "$WORK/tp2pp2.gguf" "$WORK/other.gguf" <<'PYEOF'
import sys
raw = open(sys.argv[1], "rb").read()
assert raw[32:49] == b"tp_toolkit.format", raw[24:64]
open(sys.argv[2], "wb").write(raw[:32] + b"general.copyright" + raw[49:])
PYEOF
cp "$WORK/other.gguf" "$WORK/other.gguf.before"
expect_error "--force onto a GGUF file without the mark" 1 "other.gguf is not a GGUF export \\(a GGUF file whose first key is not tp_toolkit.format" \
    "$CKPT" export "$SRC" --format gguf -o "$WORK/other.gguf" --force
check "the GGUF file is untouched" cmp -s "$WORK/other.gguf" "$WORK/other.gguf.before"
# A safetensors directory of another writer: the same weights, __metadata__ {"format": "pt"}.
mkdir "$WORK/hf-other"
"$PY" - "$WORK/hf-tp2pp2/model.safetensors" "$WORK/hf-other/model.safetensors" <<'PYEOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
header["__metadata__"] = {"format": "pt"}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PYEOF
cp "$WORK/hf-tp2pp2/config.json" "$WORK/hf-other/"
BEFORE=$(tree_digest "$WORK/hf-other")
expect_error "--force onto safetensors weights without the mark" 1 \
    "hf-other is not a safetensors export \\(model.safetensors is a safetensors file without this toolkit's mark" \
    "$CKPT" export "$SRC" --format safetensors -o "$WORK/hf-other" --force
check "the directory is untouched" [ "$(tree_digest "$WORK/hf-other")" = "$BEFORE" ]
rm "$WORK/hf-other/model.safetensors"
expect_error "--force onto a directory holding config.json alone" 1 "hf-other is not a safetensors export \\(it holds no safetensors file" \
    "$CKPT" export "$SRC" --format safetensors -o "$WORK/hf-other" --force
expect_ok "the marked export imports" "$CKPT" import "$WORK/hf-tp2pp2" -o "$WORK/reimported" --tp 1 --pp 1

# Damaged Hugging Face directories, each made from a good one.
damage() {
    "$PY" - "$WORK/hf-tp1pp1" "$WORK/dmg-$1" "$1" <<'PYEOF'
import json, os, shutil, struct, sys
src, dst, kind = sys.argv[1:4]
shutil.copytree(src, dst)
path = dst + "/model.safetensors"
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
if kind == "truncated":
    open(path, "wb").write(raw[: 8 + n // 2])
elif kind == "config":
    open(dst + "/config.json", "w").write(open(src + "/config.json").read()[:40])
elif kind in ("activation", "layers", "model_type"):
    c = json.load(open(src + "/config.json"))
    if kind == "activation": c["activation_function"] = "relu"
    if kind == "layers": c["n_layer"] = 357913942  # 12 x this wraps a 32-bit count
    if kind == "model_type": del c["model_type"]
    json.dump(c, open(dst + "/config.json", "w"))
else:
    if kind == "overlap":
        header["transformer.wpe.weight"]["data_offsets"][0] -= 4
        header["transformer.wpe.weight"]["data_offsets"][1] -= 4
    elif kind == "missing":
        del header["transformer.h.1.mlp.c_fc.bias"]
        header["transformer.h.1.mlp.c_proj.weight"]["data_offsets"][0] -= 1024  # keep the data covered
        header["transformer.h.1.mlp.c_proj.weight"]["shape"][0] += 4
    elif kind == "shape":
        s = header["transformer.wte.weight"]["shape"]; s.reverse()
    text = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + data)
PYEOF
}
for case in "truncated:truncated" "overlap:overlaps tensor" "missing:tensor transformer.h.1.mlp.c_fc.bias .*is missing" \
    "shape:has shape \[64, 250\], expected \[250, 64\] for .*; the shapes expected follow config.json: n_embd 64, n_head" "config:config.json: not a JSON object" \
    "activation:activation_function relu" "layers:357913942 layers: at most 100000" \
    "model_type:model_type is missing \(expected gpt2 or llama\)"; do
    kind=${case%%:*} pattern=${case#*:}
    damage "$kind"
    expect_error "import refuses a damaged directory ($kind)" 1 "$pattern" \
        "$CKPT" import "$WORK/dmg-$kind" -o "$WORK/bad-$kind" --tp 2 --pp 1
    check "nothing written for the damaged import ($kind)" [ ! -e "$WORK/bad-$kind" ]
done
# A sharded directory whose index leaves out a tensor its shard holds.
cp -r "$WORK/hf-bf16" "$WORK/dmg-index"
"$PY" - "$WORK/dmg-index/model.safetensors.index.json" <<'PYEOF'
import json, sys
index = json.load(open(sys.argv[1]))
del index["weight_map"]["transformer.h.0.ln_2.bias"]
json.dump(index, open(sys.argv[1], "w"))
PYEOF
expect_error "import refuses an index that leaves out a tensor" 1 "transformer.h.0.ln_2.bias of .* is not in the index" \
    "$CKPT" import "$WORK/dmg-index" -o "$WORK/bad-index" --tp 1 --pp 1
check "nothing written for the incomplete index" [ ! -e "$WORK/bad-index" ]
expect_error "import of a model the layout cannot split" 1 "heads 4 is not divisible by tp 3" \
    "$CKPT" import "$WORK/hf-tp1pp1" -o "$WORK/bad-tp3" --tp 3 --pp 1
expect_error "import needs a layout" 2 "needs -o CKPT, --tp and --pp" "$CKPT" import "$WORK/hf-tp1pp1" -o "$WORK/x"

expect_error "eval: more windows than the data holds" 1 "hold [0-9]+ windows of 32 tokens .* asked for 100000" \
    "$TRAIN" eval --ckpt "$SRC" --data "$WORK/fox.bin" --windows 100000 --seq 32
expect_error "eval: a window longer than the model's context" 1 "--seq 64 exceeds the 32 positions" \
    "$TRAIN" eval --ckpt "$SRC" --data "$WORK/fox.bin" --seq 64
expect_error "eval needs data" 2 "^tp-train eval: needs --ckpt CKPT and --data FILE \\(see tp-train eval --help\\)$" "$TRAIN" eval --ckpt "$SRC"
expect_error "eval of a missing checkpoint" 1 "no-such" "$TRAIN" eval --ckpt "$WORK/no-such" --data "$WORK/fox.bin"
# At tp2 rank 0 alone looks for the checkpoint; its reason is the run's, said once.
run mpirun --oversubscribe -np 2 "$TRAIN" eval --ckpt "$WORK/no-such" --data "$WORK/fox.bin" --tp 2
check_all "eval at tp2 of a missing checkpoint: rank 0's reason, said once" \
    '[ "$RC" -eq 1 ] && [ "$(grep -c "^tp-train: error: .*no-such" "$WORK/.err")" -eq 1 ]'
expect_error "generate: a prompt byte outside the vocabulary" 1 "prompt byte 255 at offset 1 is outside the model's vocabulary of 250" \
    "$TRAIN" generate --ckpt "$SRC" --prompt "$(printf 'a\377')"
expect_error "generate: an empty prompt: a usage error" 2 "--prompt is empty" "$TRAIN" generate --ckpt "$SRC" --prompt ""
# Weights that give NaN logits (the final norm's weight NaN): generate
# stops with the reason (it printed zero bytes as if chosen, exit 0).
"$PY" - "$WORK/hf-tp1pp1" "$WORK/hf-nan" <<'PYEOF'
import json, shutil, struct, sys
shutil.copytree(sys.argv[1], sys.argv[2])
path = sys.argv[2] + "/model.safetensors"
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
b, e = json.loads(raw[8:8 + n])["transformer.ln_f.weight"]["data_offsets"]
raw[8 + n + b:8 + n + e] = struct.pack("<f", float("nan")) * ((e - b) // 4)
open(path, "wb").write(raw)
PYEOF
expect_ok "import weights holding NaN (--allow-nonfinite)" "$CKPT" import "$WORK/hf-nan" -o "$WORK/nan" --tp 1 --pp 1 \
    --allow-nonfinite
run "$TRAIN" generate --ckpt "$WORK/nan" --prompt "the " --tokens 5
check_all "generate: NaN logits are an error naming the checkpoint" \
    '[ "$RC" -eq 1 ] && grep -q "^tp-train: error: .*/nan: the logit of token 0 is nan after 0 generated tokens" "$WORK/.err"'
# eval of them: the loss printed (null in JSON) and a failure, naming the
# checkpoint (exit 0 before: a script took it for an evaluation done).
run "$TRAIN" eval --ckpt "$WORK/nan" --data "$WORK/fox.bin" --seq 32 --windows 2 --json
check_all "eval of NaN weights: loss null, exit 1, the checkpoint named (exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -q "\"loss\": null" "$WORK/.out" &&
     grep -q "^tp-train: error: the loss of .*/nan.* is not finite" "$WORK/.err"'
# A micro-batch is cut to the windows a replica has (one here): it was built
# whole, 285 GB at this size, and the evaluation failed for want of memory.
expect_ok "eval: --micro-batch far above the windows" "$TRAIN" eval --ckpt "$SRC" --data "$WORK/fox.bin" --windows 1 \
    --micro-batch 1048576
# 40,000 forward passes through a pipeline of 2: their messages' tags wrap
# at 32767 (the most every MPI guarantees; they had counted on), in order.
"$PY" -c "print('the quick brown fox jumps over the lazy dog. ' * 1000, end='')" >"$WORK/long.txt"
expect_ok "prepare 45,000 tokens" "$TRAIN" prepare "$WORK/long.txt" -o "$WORK/long.bin"
run "$TRAIN" eval --ckpt "$SRC" --data "$WORK/long.bin" --seq 1 --micro-batch 1 --windows 40000 --json
cp "$WORK/.out" "$WORK/passes1.json"
run mpirun --oversubscribe -np 2 "$TRAIN" eval --ckpt "$SRC" --data "$WORK/long.bin" --pp 2 --seq 1 --micro-batch 1 \
    --windows 40000 --json </dev/null
check_all "eval: 40,000 passes at pp2 as one process" '[ "$RC" -eq 0 ] && same_loss "$WORK/passes1.json" "$WORK/.out" 1e-9'
# Ranks that see different files (nodes that do not share a directory),
# stood in for by a working directory a rank (mpirun -wdir): the job ends,
# naming the cause. Each rank had looked at --ckpt itself: with a Megatron
# checkpoint where rank 0 looked, rank 0 refused and rank 1 waited for it
# without a word; a token file that rank 1 alone lacked was "another rank
# failed".
expect_ok "a Megatron copy of the checkpoint" "$BIN/tp-reshard" "$SRC" --to tp1 --format megatron -o "$WORK/megatron-src"
mkdir -p "$WORK/node0" "$WORK/node1"
ln -s "$WORK/megatron-src" "$WORK/node0/CK"
ln -s "$SRC" "$WORK/node1/CK"
cp "$WORK/fox.bin" "$WORK/node0/d.bin"
cp "$WORK/fox.bin" "$WORK/node1/d.bin"
run timeout 120 mpirun --oversubscribe -np 1 -wdir "$WORK/node0" "$TRAIN" eval --ckpt CK --data d.bin --dp 2 : \
    -np 1 -wdir "$WORK/node1" "$TRAIN" eval --ckpt CK --data d.bin --dp 2 </dev/null
check_all "eval: rank 0 finds a Megatron checkpoint: refused (exit 2, said once), no rank left waiting" \
    '[ "$RC" -eq 2 ] && [ "$(grep -c "^tp-train: --ckpt CK is a Megatron-LM checkpoint" "$WORK/.err")" -eq 1 ]'
rm "$WORK/node0/CK" "$WORK/node1/d.bin"
ln -s "$SRC" "$WORK/node0/CK"
run timeout 120 mpirun --oversubscribe -np 1 -wdir "$WORK/node0" "$TRAIN" eval --ckpt CK --data d.bin --dp 2 : \
    -np 1 -wdir "$WORK/node1" "$TRAIN" eval --ckpt CK --data d.bin --dp 2 </dev/null
check_all "eval: a token file only rank 1 lacks: rank 0 says rank 1's reason" \
    '[ "$RC" -eq 1 ] && grep -q "^tp-train: error: rank 1: d.bin: no such token file" "$WORK/.err"'

finish
