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
# format and to DCP; wrong inputs refused in one line. Skipped without
# python3-torch.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
LEGACY="$ROOT/tests/support/megatron_fixture.py"
DIST="$ROOT/tests/support/megatron_dist_fixture.py"

if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    echo "[SKIP] [$NAME] python3-torch is not installed"
    finish
fi

SHAPE="--layers 4 --hidden 64 --heads 8 --ffn 128 --vocab 200 --make-vocab-size-divisible-by 16"
# case NAME OPTIONS: the torch_dist fixture (OPTIONS with --numbered and --dp)
# and the legacy one (without them), the same model.
case_pair() {
    name=$1
    shift
    expect_ok "torch_dist fixture $name: $*" "$PY" "$DIST" "$WORK/$name.dist" $SHAPE "$@" --full "$WORK/$name.full.pt"
    legacy_options=$(echo "$*" | sed 's/--numbered//; s/--dp [0-9]*//')
    expect_ok "legacy fixture $name" "$PY" "$LEGACY" "$WORK/$name.legacy" $SHAPE $legacy_options
    expect_ok "$name: every tensor of the torch_dist checkpoint equals the legacy one's, bit for bit" \
        "$CK" diff "$WORK/$name.legacy" "$WORK/$name.dist"
}
case_pair gpt --names core --tp 2 --pp 2 --dtype bf16 --optimizer
check "diff compared the weights and the Adam state with fp32 masters" grep -q "^equal: 208 tensors" "$WORK/.out"
case_pair llama --names core --tp 2 --swiglu --query-groups 2 --untied --rope --rmsnorm --no-bias --dtype bf16 \
    --optimizer --dp 2
case_pair local --names core-local --tp 4 --numbered --dtype fp32 --optimizer

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
check_all "info --json: format, names, 108 tensors (27 parameters, each with 3 states)" \
    '"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"format\"]==\"megatron-torch-dist\" and d[\"names\"]==\"core\" and len(d[\"tensors\"])==108, (d[\"format\"], len(d[\"tensors\"]))" "$WORK/.out"'
expect_ok "verify: every item's CRC-32s, every tensor read" "$CK" verify "$WORK/gpt.dist"

# --------------------------------------------------------------- conversions
expect_error "a torch_dist source needs --format" 2 "needs --format tp, megatron or dcp" "$RS" "$WORK/gpt.dist" --to tp4
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
expect_error "no common.pt" 1 "neither common.pt nor a bytes entry common_state/shard_0_1: the model's args are not known" \
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
check_all "a flipped bit: nothing written" '[ ! -e "$WORK/flip.tp" ] && [ ! -e "$WORK/flip.meg" ]'
finish
