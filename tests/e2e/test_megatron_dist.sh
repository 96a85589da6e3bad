#!/bin/sh
# Megatron-Core torch_dist checkpoints (docs/MEGATRON.md, docs/DCP.md),
# written with PyTorch's own distributed checkpoint in Megatron-Core's
# layout (tests/support/megatron_dist_fixture.py), judged by the legacy
# checkpoint of the same model (megatron_fixture.py, the same options):
# every tensor, optimizer state included, read bit for bit equal through
# both readers, across stacked and numbered layers, SwiGLU, grouped queries,
# untied embeddings, data-parallel cuts, Transformer Engine and local names;
# converted to a legacy Megatron checkpoint that megatron_fixture.py's own
# merge finds equal to the model's unsharded reference, to this toolkit's
# format and to DCP; wrong inputs refused in one line. The distributed
# optimizer's torch_dist layouts (dp_reshardable, fully_reshardable,
# fully_sharded_model_space) written as Megatron-Core's code writes them,
# judged the same way and resharded across TP, PP and DP. Skipped without
# python3-torch.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
LEGACY="$ROOT/tests/support/megatron_fixture.py"
DIST="$ROOT/tests/support/megatron_dist_fixture.py"

skip_without_python 'torch, numpy' "python3-torch is not installed"

SHAPE="--layers 4 --hidden 64 --heads 8 --ffn 128 --vocab 200 --make-vocab-size-divisible-by 16"
# case NAME OPTIONS: the torch_dist fixture (OPTIONS with --numbered and --dp)
# and the legacy one (without them), the same model.
case_pair() {
    name=$1
    shift
    expect_ok "torch_dist fixture $name: $*" "$PY" "$DIST" "$WORK/$name.dist" $SHAPE "$@" --full "$WORK/$name.full.pt"
    legacy_options=$(echo "$*" | sed 's/--numbered//; s/--dp [0-9]*//; s/--strided-chunks//')
    expect_ok "legacy fixture $name" "$PY" "$LEGACY" "$WORK/$name.legacy" $SHAPE $legacy_options
    expect_ok "$name: every tensor of the torch_dist checkpoint equals the legacy one's, bit for bit" \
        "$CK" diff "$WORK/$name.legacy" "$WORK/$name.dist"
}
case_pair gpt --names core --tp 2 --pp 2 --dtype bf16 --optimizer
check "diff compared the weights and the Adam state with fp32 masters" grep -q "^equal: 208 tensors" "$WORK/.out"
# The entries that are no tensors read (Transformer Engine's _extra_state
# objects, counters) are not compared: diff says how many, as of a DCP;
# torch's own reading of the .metadata counts them.
OTHERS=$("$PY" - "$ROOT/tests/formats/dcp_torch.py" "$WORK/gpt.dist/iter_0001000" <<'PYEOF'
import runpy, sys, torch
md = runpy.run_path(sys.argv[1])["read_metadata"](sys.argv[2])
floats = (torch.float32, torch.bfloat16, torch.float16)
print(sum(not hasattr(m, "chunks") or m.properties.dtype not in floats or not 1 <= len(m.size) <= 8 or 0 in m.size
          for m in md.state_dict_metadata.values()))
PYEOF
)
check "torch counts the torch_dist checkpoint's entries that are no tensors ($OTHERS)" [ "${OTHERS:-0}" -gt 0 ]
check "diff says the torch_dist side's other entries were not compared, as many as torch counts" grep -q \
    "^note: other entries of a distributed checkpoint not compared (0 in A, $OTHERS in B" "$WORK/.out"
expect_ok "info of the torch_dist checkpoint" "$CK" info "$WORK/gpt.dist"
check_all "info counts and lists them" 'grep -q "^tensors      208 read as tensors, $OTHERS other entries" "$WORK/.out" &&
    [ "$(sed -n "/^other entries (not read as tensors)/,\$p" "$WORK/.out" | tail -n +2 | wc -l)" -eq "$OTHERS" ]'
case_pair llama --names core --tp 2 --swiglu --query-groups 2 --untied --rope --rmsnorm --no-bias --dtype bf16 \
    --optimizer --dp 2
case_pair local --names core-local --tp 4 --numbered --dtype fp32 --optimizer
# The model's shards stored with their dimensions in reverse order (a [R, C]
# one with strides (1, R)), which torch.save keeps: read as DCP's are, each
# chunk one box in its order (refused as "not row-major" before).
case_pair strided --names core --tp 2 --pp 2 --dtype bf16 --optimizer --dp 2 --strided-chunks
check "torch loads the word embeddings' chunks back not contiguous" "$PY" -c '
import io, os, sys, torch
sys.path.insert(0, sys.argv[2])
import dcp_torch
md = dcp_torch.read_metadata(sys.argv[1])
found = 0
for index, info in md.storage_data.items():
    if index.fqn != "embedding.word_embeddings.weight":
        continue
    with open(os.path.join(sys.argv[1], info.relative_path), "rb") as f:
        f.seek(info.offset)
        t = torch.load(io.BytesIO(f.read(info.length)))
    assert t.dim() == 2 and not t.is_contiguous(), t.stride()
    found += 1
assert found > 0' "$WORK/strided.dist/iter_0001000" "$ROOT/tests/formats"
expect_ok "strided: reshard -> tp1 in this format, verified" "$RS" "$WORK/strided.dist" --format tp --to tp1 \
    -o "$WORK/strided.tp1" --verify
expect_ok "strided: which equals the legacy checkpoint" "$CK" diff "$WORK/strided.legacy" "$WORK/strided.tp1"

expect_ok "info" "$CK" info "$WORK/gpt.dist"
check "info names the format, the iteration and the saved layout" \
    grep -q "^checkpoint .*(Megatron-Core torch_dist, checkpoint_version 3.0, core names, common state in common.pt: up to 0.18)" \
    "$WORK/.out"
check_all "info: iteration, saved layout, the optimizer read" \
    'grep -q "^iteration    1000" "$WORK/.out" && grep -q "^saved at     tp=2 pp=2 " "$WORK/.out" &&
     grep -q "^optimizer    Adam state in the model.s space, read" "$WORK/.out"'
check "info lists layer 3's fused QKV under its canonical name, cut by query group" \
    grep -Eq "^layers.3.attention.qkv.weight +bf16 +\[192, 64\] +\[192, 64\] +split axis 0 granule 8 " "$WORK/.out"
expect_ok "info --json" "$CK" info "$WORK/llama.dist" --json
check "info --json gives each key once (its format was also the index's)" json_keys_once "$WORK/.out"
check_all "info --json: format, names, 108 tensors (27 parameters, each with 3 states)" \
    '"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"format\"]==\"megatron-torch-dist\" and d[\"names\"]==\"core\" and len(d[\"tensors\"])==108, (d[\"format\"], len(d[\"tensors\"]))" "$WORK/.out"'
expect_ok "verify: every item's CRC-32s, every tensor read" "$CK" verify "$WORK/gpt.dist"

# --------------------------------------------------------------- conversions
# --from names the layout it was saved at (the summary's and --json's), not
# the tp 1 it is read at: tp2pp2 was refused and tp1pp1 taken.
expect_ok "--from the saved layout tp2pp2" "$RS" "$WORK/gpt.dist" --from tp2pp2 --to tp1 --format tp -o "$WORK/from" --json
check "its --json names the saved layout as from" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["from"] == {"tp": 2, "pp": 2}, j["from"]' "$WORK/.out"
expect_error "--from the layout it is read at: refused, naming the saved one" 1 "--from tp1 does not match .* which is tp2pp2" \
    "$RS" "$WORK/gpt.dist" --from tp1 --to tp1 --format tp -o "$WORK/from1"
expect_error "a torch_dist source is written as torch_dist by default; at tp4 its vocabulary padded for tp2 is refused" 1 \
    "padded vocabulary of 224 rows is not a multiple of 16 x tp 4" "$RS" "$WORK/gpt.dist" --to tp4 -o "$WORK/x"
expect_ok "torch_dist -> this toolkit's format tp4pp2, Adam state included, verified" "$RS" "$WORK/gpt.dist" \
    --format tp --to tp4pp2 -o "$WORK/gpt.tp" --verify
check "verified 208 tensors" grep -q "^verified: 208 tensors equal to the source" "$WORK/.out"
check "the summary names the layout the source was saved at (tp2pp2), not the whole tensors it is read as" \
    grep -q "^resharded .*gpt.dist.* (tp2pp2) -> " "$WORK/.out"
expect_ok "its tp4pp2 output resharded on" "$RS" "$WORK/gpt.tp" --to tp2 -o "$WORK/gpt.tp2"
check "whose summary names its own layout (the origin it carries says tp2pp2)" grep -q "^resharded .* (tp4pp2) -> " \
    "$WORK/.out"
expect_ok "the legacy checkpoint equals it too" "$CK" diff "$WORK/gpt.legacy" "$WORK/gpt.tp"
expect_error "torch_dist -> legacy Megatron with the optimizer: refused, saying why" 1 \
    "not written as a legacy Megatron optimizer.*--weights-only" "$RS" "$WORK/gpt.dist" --format megatron --to tp2 \
    -o "$WORK/x"
expect_ok "fixture without an optimizer" "$PY" "$DIST" "$WORK/w.dist" $SHAPE --names core --tp 2 --pp 2 --dtype bf16 \
    --swiglu --untied --full "$WORK/w.full.pt"
expect_ok "torch_dist -> legacy Megatron tp2pp1 (Megatron-LM #1291), verified" "$RS" "$WORK/w.dist" --format megatron \
    --to tp2pp1 -o "$WORK/w.legacy" --verify
expect_ok "megatron_fixture.py's own merge of the legacy output equals the model's reference" \
    "$PY" "$LEGACY" --verify "$WORK/w.legacy" --full "$WORK/w.full.pt"
expect_ok "the Adam state's checkpoint, weights only, to legacy tp1pp4" "$RS" "$WORK/gpt.dist" --format megatron \
    --weights-only --to tp1pp4 -o "$WORK/gpt.legacy4" --verify
expect_error "legacy tp4: the vocabulary padded for tp2 is refused, as Megatron would" 1 \
    "padded vocabulary of 224 rows is not a multiple of 16 x tp 4" "$RS" "$WORK/gpt.dist" --format megatron --weights-only \
    --to tp4pp1 -o "$WORK/x"
expect_ok "torch_dist -> DCP tp2pp2, verified" "$RS" "$WORK/llama.dist" --format dcp --to tp2pp2 -o "$WORK/llama.dcp" \
    --verify
expect_ok "the DCP output equals the legacy checkpoint of the model" "$CK" diff "$WORK/llama.legacy" "$WORK/llama.dcp"

# ------------------------------------------------------------------ refusals
cp -r "$WORK/w.dist" "$WORK/zarr"
printf '{"sharded_backend": "zarr", "sharded_backend_version": 1}' >"$WORK/zarr/iter_0001000/metadata.json"
expect_error "another backend" 1 "zarr backend is not read" "$CK" info "$WORK/zarr"
cp -r "$WORK/w.dist" "$WORK/nocommon"
rm "$WORK/nocommon/iter_0001000/common.pt"
expect_error "no common.pt and no common_state entry" 1 "neither common.pt nor a bytes entry common_state/shard_0_1: the model's args are not known" \
    "$RS" "$WORK/nocommon" --format tp --to tp1 -o "$WORK/x"
# A model whose args say another size than the tensors.
expect_ok "fixture with 96 hidden" "$PY" "$DIST" "$WORK/h96.dist" --layers 4 --hidden 96 --heads 8 --ffn 128 --vocab 200 \
    --make-vocab-size-divisible-by 16 --names core --tp 2
cp "$WORK/w.dist/iter_0001000/common.pt" "$WORK/h96.dist/iter_0001000/common.pt"
expect_error "tensors another shape than the args make" 1 "key .*: \[224, 96\], the args make .* \[224, 64\]" "$CK" info \
    "$WORK/h96.dist"
# One bit flipped in an item's tensor data: every reader checks the CRC-32
# its archive records as it reads (verify reads them all); nothing written.
cp -r "$WORK/w.dist" "$WORK/flip"
DATA=$(ls "$WORK/flip/iter_0001000/"*.distcp | head -n 1)
OFFSET=$("$PY" - "$DATA" <<'PYEOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
best = None  # the largest tensor entry of any item: (size, data offset)
at = 0
while True:
    at = data.find(b"PK\x03\x04", at)
    if at < 0:
        break
    size = struct.unpack("<I", data[at + 22:at + 26])[0]
    n, m = struct.unpack("<HH", data[at + 26:at + 30])
    if b"/data/" in data[at + 30:at + 30 + n] and (best is None or size > best[0]):
        best = (size, at + 30 + n + m)
    at += 4
print(best[1] + best[0] // 2)
PYEOF
)
flip_byte "$DATA" "$OFFSET"
expect_error "a flipped bit: verify names the damaged item" 1 "items damaged, the first: .*CRC-32" "$CK" verify "$WORK/flip"
expect_error "a flipped bit: tp-reshard --format tp names the entry and both CRC-32s" 1 \
    "distcp: entry [^:]+: its [0-9]+ bytes have CRC-32 [0-9a-f]{8}, the archive records [0-9a-f]{8} \\(data damaged\\)" \
    "$RS" "$WORK/flip" --format tp --to tp1 -o "$WORK/flip.tp"
expect_error "a flipped bit: tp-reshard --format megatron too" 1 "distcp: entry [^:]+: its [0-9]+ bytes have CRC-32" \
    "$RS" "$WORK/flip" --format megatron --to tp1 -o "$WORK/flip.meg"
# Every writer leaves a failed read of the source as the source's reader
# words it: the source's file first, not the staging file being written.
for f in megatron torch_dist dcp tp; do
    expect_error "a flipped bit: --format $f names the source first" 1 \
        "^tp-reshard: error: $WORK/flip/iter_0001000: tensor [^:]+ piece [0-9]+: $WORK/flip/iter_0001000/__[0-9]+_0.distcp: entry" \
        "$RS" "$WORK/flip" --format $f --to tp1 -o "$WORK/flip.$f"
    check "a flipped bit: --format $f: no staging path in the message" sh -c '! grep -q staging "$1"' sh "$WORK/.err"
done
check_all "a flipped bit: nothing written" '[ ! -e "$WORK/flip.tp" ] && [ ! -e "$WORK/flip.meg" ] &&
    [ ! -e "$WORK/flip.megatron" ] && [ ! -e "$WORK/flip.torch_dist" ] && [ ! -e "$WORK/flip.dcp" ]'

# ---------------------------------------------------- the distributed optimizer
# Megatron-Core's DistributedOptimizer.sharded_state_dict layouts, written by
# megatron_dist_fixture.py as Megatron-Core's code makes them (our reading of
# Megatron-LM d98e8a64dd; docs/MEGATRON.md): each judged by the legacy
# checkpoint of the same model (megatron_fixture.py's non-distributed and
# distributed optimizers) or by the model-space form; every tensor bit for bit.
for layout in dp_reshardable fully_reshardable fully_sharded_model_space; do
    expect_ok "torch_dist fixture, the distributed optimizer's $layout over 3 data-parallel ranks" "$PY" "$DIST" \
        "$WORK/do.$layout" $SHAPE --names core --tp 2 --pp 2 --dtype bf16 --distributed-optimizer $layout --optimizer-dp 3
    expect_ok "$layout: every tensor equals the legacy checkpoint's (non-distributed optimizer), bit for bit" \
        "$CK" diff "$WORK/gpt.legacy" "$WORK/do.$layout"
    check "$layout: 208 tensors compared, the Adam state and the fp32 masters included" \
        grep -q "^equal: 208 tensors" "$WORK/.out"
    expect_ok "info $layout" "$CK" info "$WORK/do.$layout"
    check "info names the distributed optimizer's layout ($layout)" \
        grep -q "^optimizer    Adam state of the distributed optimizer, $layout, read" "$WORK/.out"
done
# --true-vocab-size (200 tokens in 224 rows, padded for tp2): the tables of
# every layout, the optimizer's state of them included, read without the
# padding, as the legacy checkpoint's are (each chunk, cell or bucket run
# cut at the last token's row).
expect_ok "the legacy checkpoint at its 200 tokens" "$RS" "$WORK/gpt.legacy" --format tp --to tp1 --true-vocab-size 200 \
    -o "$WORK/gpt.true"
expect_ok "its info" "$CK" info "$WORK/gpt.true"
check "its tables hold the 200 tokens' rows" grep -Eq "^optim/exp_avg/embedding.word_embeddings.weight +fp32 +\[200, 64\]" \
    "$WORK/.out"
for source in gpt.dist do.dp_reshardable do.fully_reshardable do.fully_sharded_model_space; do
    expect_ok "$source at its 200 tokens" "$RS" "$WORK/$source" --format tp --to tp1 --true-vocab-size 200 \
        -o "$WORK/$source.true" --verify
    expect_ok "$source: equal to the legacy checkpoint's, bit for bit" "$CK" diff "$WORK/gpt.true" "$WORK/$source.true"
done
# 32 tokens, a multiple of make_vocab_size_divisible_by 16, in 64 rows at
# tp4: a torch_dist output padded from a torch_dist source has zero padding
# rows, as its reader leaves the stored padding out (they were token 31's
# row repeated: the last row read at 32 rows is a token's).
expect_ok "torch_dist fixture: 32 tokens in 64 rows at tp4" "$PY" "$DIST" "$WORK/v32.dist" --layers 2 --hidden 64 \
    --heads 8 --ffn 128 --vocab 32 --make-vocab-size-divisible-by 16 --names core --tp 4 --optimizer
expect_ok "torch_dist at tp4 again with --true-vocab-size 32, verified" "$RS" "$WORK/v32.dist" --to tp4 \
    --true-vocab-size 32 -o "$WORK/v32.td" --verify
for out in v32.dist v32.td; do
    expect_ok "$out as one HDF5 file" "$CK" export "$WORK/$out" --format hdf5 -o "$WORK/$out.h5"
done
expect_ok "the tokens' rows kept, the padding rows zero (the source's were not)" "$PY" -c 'import sys, h5py, numpy as np
a = np.asarray(h5py.File(sys.argv[1])["embedding.word_embeddings.weight"][()])
b = np.asarray(h5py.File(sys.argv[2])["embedding.word_embeddings.weight"][()])
assert a.shape == b.shape == (64, 64), (a.shape, b.shape)
assert (a[:32] == b[:32]).all(), "the tokens rows differ"
assert a[32:].any(), "the source has no padding values to tell apart"
assert not b[32:].any(), "padding rows %s are not zero" % sorted(set(np.nonzero(b[32:])[0] + 32))[:8]' \
    "$WORK/v32.dist.h5" "$WORK/v32.td.h5"
expect_ok "info --json" "$CK" info "$WORK/do.dp_reshardable" --json
check_all "info --json: the layout read, 208 tensors" \
    '"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"optimizer_layout\"]==\"dp_reshardable\" and len(d[\"tensors\"])==208, d.get(\"optimizer_layout\")" "$WORK/.out"'
expect_ok "legacy fixture with the distributed optimizer (distrib_optim.pt)" "$PY" "$LEGACY" "$WORK/gpt.legacy_do" $SHAPE \
    --names core --tp 2 --pp 2 --dtype bf16 --dist-opt
expect_ok "dp_reshardable equals the legacy distributed optimizer's state too" "$CK" diff "$WORK/gpt.legacy_do" \
    "$WORK/do.dp_reshardable"
# The flat layouts do not depend on the data-parallel size: 1 and 3 ranks read alike.
expect_ok "dp_reshardable over 1 data-parallel rank" "$PY" "$DIST" "$WORK/do.dp1" $SHAPE --names core --tp 2 --pp 2 \
    --dtype bf16 --distributed-optimizer dp_reshardable
expect_ok "dp_reshardable over 1 and over 3 data-parallel ranks: equal" "$CK" diff "$WORK/do.dp1" "$WORK/do.dp_reshardable"

# do_case NAME "MODEL OPTIONS" "DISTRIBUTED OPTIONS": each layout of one model against its legacy checkpoint.
do_case() {
    name=$1 model=$2 extra=$3
    expect_ok "legacy fixture $name" "$PY" "$LEGACY" "$WORK/$name.legacy" $SHAPE $model --optimizer
    for layout in dp_reshardable fully_reshardable fully_sharded_model_space; do
        expect_ok "$name: torch_dist fixture, $layout $extra" "$PY" "$DIST" "$WORK/$name.$layout" $SHAPE $model $extra \
            --distributed-optimizer $layout
        expect_ok "$name: $layout equals the legacy checkpoint, bit for bit" "$CK" diff "$WORK/$name.legacy" \
            "$WORK/$name.$layout"
    done
}
# SwiGLU, grouped queries, untied, RMSNorm, no biases; buckets cut at 5000 elements (--overlap-grad-reduce).
do_case dollama "--names core --tp 2 --swiglu --query-groups 2 --untied --rope --rmsnorm --no-bias --dtype bf16" \
    "--optimizer-dp 4 --bucket-size 5000"
# Megatron-Core's local modules (their parameters in another order) under Transformer Engine's keys, as
# Megatron-Core saves them; two model chunks per stage, fp16.
do_case dolocal "--names core --tp 2 --pp 2 --vpp 2 --untied --dtype fp16" "--optimizer-dp 2 --transformer-impl local"
# Numbered layers, fp32 (the main copies are the parameters), tp 4 with two query groups (replicated key/value rows).
do_case donum "--names core-local --tp 4 --query-groups 2 --dtype fp32" "--numbered --optimizer-dp 2"
# bf16 weights with fp32 norms: a buffer per dtype; judged by the model-space form of the same model.
expect_ok "mixed dtypes: the non-distributed optimizer's model space" "$PY" "$DIST" "$WORK/mixed.model" $SHAPE --names core \
    --tp 2 --pp 2 --dtype bf16 --fp32-norms --optimizer
for layout in dp_reshardable fully_sharded_model_space; do
    expect_ok "mixed dtypes: $layout, local modules, buckets of 4000" "$PY" "$DIST" "$WORK/mixed.$layout" $SHAPE --names core \
        --tp 2 --pp 2 --dtype bf16 --fp32-norms --distributed-optimizer $layout --optimizer-dp 2 --transformer-impl local \
        --bucket-size 4000
    expect_ok "mixed dtypes: $layout equals the model-space form, bit for bit" "$CK" diff "$WORK/mixed.model" \
        "$WORK/mixed.$layout"
done
check "mixed dtypes: a buffer of fp32 norms beside the bf16 one" \
    grep -aq "gbuf_idx_1.dtype_(torch.float32, torch.float32)" "$WORK/mixed.dp_reshardable/iter_0001000/.metadata"
# More tensors than the reader's list first holds (256: 100 parameters and
# 300 states at 8 layers): the walk of the buckets looked parameters up by
# names pointing into the list, which its states' pushes moved; tp-ckpt
# info, diff and tp-reshard then crashed (SIGSEGV) or read freed memory.
expect_ok "legacy fixture of 8 layers" "$PY" "$LEGACY" "$WORK/deep.legacy" --layers 8 --hidden 64 --heads 8 --ffn 128 \
    --vocab 200 --make-vocab-size-divisible-by 16 --names core --tp 2 --pp 2 --vpp 2 --dtype bf16 --optimizer
expect_ok "torch_dist fixture of 8 layers, dp_reshardable" "$PY" "$DIST" "$WORK/deep.dp_reshardable" --layers 8 --hidden 64 \
    --heads 8 --ffn 128 --vocab 200 --make-vocab-size-divisible-by 16 --names core --tp 2 --pp 2 --vpp 2 --dtype bf16 \
    --distributed-optimizer dp_reshardable --optimizer-dp 2
expect_ok "8 layers: dp_reshardable equals the legacy checkpoint, bit for bit" "$CK" diff "$WORK/deep.legacy" \
    "$WORK/deep.dp_reshardable"
check "8 layers: 400 tensors compared" grep -q "^equal: 400 tensors" "$WORK/.out"

# Resharded at another TP, PP and DP, the optimizer's state carried.
expect_ok "dp_reshardable -> this toolkit's format tp4pp1, verified" "$RS" "$WORK/do.dp_reshardable" --format tp --to tp4pp1 \
    -o "$WORK/do.tp" --verify
check "verified 208 tensors" grep -q "^verified: 208 tensors equal to the source" "$WORK/.out"
expect_ok "its output equals the legacy checkpoint" "$CK" diff "$WORK/gpt.legacy" "$WORK/do.tp"
DIALECT=$("$PY" -c 'import torch.distributed.checkpoint' 2>/dev/null && echo 2 || echo 1.13)
expect_ok "fully_sharded_model_space -> DCP tp1pp4 over 3 data-parallel ranks, verified" "$RS" \
    "$WORK/do.fully_sharded_model_space" --format dcp --dcp-torch "$DIALECT" --to tp1pp4 --dcp-dp 3 -o "$WORK/do.dcp" --verify
expect_ok "its output equals the legacy checkpoint" "$CK" diff "$WORK/gpt.legacy" "$WORK/do.dcp"
expect_ok "PyTorch's DCP loads it as this toolkit reads the tp4pp1 output" "$PY" "$ROOT/tests/formats/dcp_torch.py" \
    compare-ckpt "$WORK/do.dcp" "$WORK/do.tp"
expect_ok "dollama dp_reshardable -> DCP tp1pp2, verified" "$RS" "$WORK/dollama.dp_reshardable" --format dcp --to tp1pp2 \
    -o "$WORK/dollama.dcp" --verify
expect_ok "its output equals the legacy checkpoint" "$CK" diff "$WORK/dollama.legacy" "$WORK/dollama.dcp"
expect_ok "dolocal dp_reshardable -> this toolkit's format tp1pp4" "$RS" "$WORK/dolocal.dp_reshardable" --format tp \
    --to tp1pp4 -o "$WORK/dolocal.tp" --verify
expect_ok "its output equals the legacy checkpoint" "$CK" diff "$WORK/dolocal.legacy" "$WORK/dolocal.tp"
expect_ok "dp_reshardable -> legacy Megatron tp1pp4, the weights" "$RS" "$WORK/do.dp_reshardable" --format megatron \
    --weights-only --to tp1pp4 -o "$WORK/do.meg" --verify
expect_error "dp_reshardable -> legacy Megatron with the optimizer: refused, saying why" 1 \
    "not written as a legacy Megatron optimizer.*--weights-only" "$RS" "$WORK/do.dp_reshardable" --format megatron --to tp2 \
    -o "$WORK/x"

# What is not read is said, and not dropped unsaid.
expect_ok "the deprecated dp_zero_gather_scatter layout" "$PY" "$DIST" "$WORK/do.zero" $SHAPE --names core --tp 2 --pp 2 \
    --dtype bf16 --distributed-optimizer dp_zero_gather_scatter --optimizer-dp 2
expect_ok "info on it" "$CK" info "$WORK/do.zero"
check "info says its optimizer is not read, naming the layout" \
    grep -q "^optimizer    not read: .*param_state/shard_0_1: the distributed optimizer's dp_zero_gather_scatter layout" \
    "$WORK/.out"
expect_error "tp-reshard does not leave an optimizer out unsaid" 1 \
    "the optimizer's state is not read: .*dp_zero_gather_scatter.*--weights-only converts the weights alone" \
    "$RS" "$WORK/do.zero" --format dcp --to tp1 -o "$WORK/x"
for format in tp torch_dist; do # refused once for every output (formats/registry_write.c)
    expect_error "nor as $format" 1 "the optimizer's state is not read: .*dp_zero_gather_scatter" \
        "$RS" "$WORK/do.zero" --format $format --to tp1 -o "$WORK/x"
done
check "nothing written by the refusals" [ ! -e "$WORK/x" ]
expect_ok "--weights-only converts its weights" "$RS" "$WORK/do.zero" --format tp --weights-only --to tp1 -o "$WORK/zero.tp"
expect_ok "equal to the legacy checkpoint's weights" "$CK" diff "$WORK/gpt.legacy" "$WORK/zero.tp" --weights-only
# Args naming other modules than those whose order the buffers follow: the layout does not fit, said.
cp -r "$WORK/mixed.dp_reshardable" "$WORK/do.swapped"
"$PY" - "$WORK/do.swapped/iter_0001000/common.pt" "$ROOT/tests/support" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[2])
import megatron_fixture as mf
import torch
mf.install_megatron_stubs()
state = torch.load(sys.argv[1], weights_only=False)
state['args'].transformer_impl = 'transformer_engine'
torch.save(state, sys.argv[1])
PYEOF
expect_error "modules in another order than the buffers': refused, naming the buffer" 1 \
    "dp_group_idx_2.gbuf_idx_0 \(tp rank 0, pp rank 1, model chunk 0\): .* names parameters of float32, the model's are bf16" \
    "$CK" info "$WORK/do.swapped"
cp -r "$WORK/do.dp_reshardable" "$WORK/do.bucket"
"$PY" - "$WORK/do.bucket/iter_0001000/common.pt" "$ROOT/tests/support" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[2])
import megatron_fixture as mf
import torch
mf.install_megatron_stubs()
state = torch.load(sys.argv[1], weights_only=False)
state['args'].transformer_impl = 'local'
torch.save(state, sys.argv[1])
PYEOF
expect_error "the local modules' order over Transformer Engine's buffers (the same bucket sizes): the main copies found are not the weights, said" 1 \
    "the main copy of .* where the order of Megatron-Core's local modules \(args.transformer_impl\) puts it .* is not its weight" \
    "$CK" info "$WORK/do.bucket"
cp -r "$WORK/do.fully_reshardable" "$WORK/do.recorded"
"$PY" - "$WORK/do.recorded/iter_0001000/common.pt" "$ROOT/tests/support" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[2])
import megatron_fixture as mf
import torch
mf.install_megatron_stubs()
state = torch.load(sys.argv[1], weights_only=False)
state['content_metadata']['distrib_optim_sharding_type'] = 'dp_reshardable'
torch.save(state, sys.argv[1])
PYEOF
expect_error "a layout other than the common state records: refused" 1 \
    "laid out as fully_reshardable, the common state records dp_reshardable" "$CK" info "$WORK/do.recorded"
finish
