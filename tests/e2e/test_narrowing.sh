#!/bin/sh
# End-to-end: --dtype fp16 (and bf16) never turns a finite value into an
# infinity. A checkpoint whose values lie beyond fp16's range (1e6, -7e4,
# 3e38 in a transposed tensor, 7e4 in another), imported, resharded and
# exported at fp16: each command fails naming the tensor, the count and
# the largest magnitude, and leaves nothing at its output; bf16 refuses
# only what rounds past its own largest value (3.4e38). Values already
# infinite or NaN (imported with --allow-nonfinite), and 65519 (which rounds
# to fp16's 65504), convert: the outputs, read by h5py, equal numpy's
# float16 of the source.
# tier: check
. "$(dirname "$0")/lib.sh"

CKPT="$BIN/tp-ckpt"
expect_ok "synth" "$CKPT" synth -o "$WORK/ck" --model tiny --tp 1 --pp 1
expect_ok "export safetensors" "$CKPT" export "$WORK/ck" --format safetensors -o "$WORK/hf"

# edit OUT_DIR NAME:ROW:COL:VALUE...: the export with those values set (header kept).
edit() {
    out=$1
    shift
    mkdir -p "$out" && cp "$WORK/hf/config.json" "$out/" &&
        "$PY" - "$WORK/hf/model.safetensors" "$out/model.safetensors" "$@" <<'PYEOF'
import json, struct, sys
import numpy as np
src, dst, changes = sys.argv[1], sys.argv[2], sys.argv[3:]
b = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
header = json.loads(b[8:8 + n])
for change in changes:
    name, row, col, value = change.split(":")
    s, e = header[name]["data_offsets"]
    a = np.frombuffer(b, dtype="<f4", count=(e - s) // 4, offset=8 + n + s).copy().reshape(header[name]["shape"])
    a[int(row), int(col)] = float(value)
    b[8 + n + s:8 + n + e] = a.tobytes()
open(dst, "wb").write(b)
PYEOF
}

QKV=transformer.h.0.attn.c_attn.weight
expect_ok "large values" edit "$WORK/big_hf" "$QKV:0:0:1e6" "$QKV:1:1:-7e4" "$QKV:2:2:3e38" \
    transformer.wpe.weight:0:0:7e4 transformer.wpe.weight:0:1:inf transformer.wpe.weight:0:2:65519
expect_ok "import fp32" "$CKPT" import "$WORK/big_hf" -o "$WORK/big" --tp 1 --pp 1 --allow-nonfinite

POS_SAID="model/pos_embed.weight: 1 value beyond fp16's range \(largest \|x\| 70000\) would become infinite: keep fp32 or bf16 \(--dtype\); 1 more tensor as well"
expect_error "import --dtype fp16: the first tensor that overflowed, and how many more" 1 "$POS_SAID" "$CKPT" import "$WORK/big_hf" -o "$WORK/big16" --tp 1 --pp 1 --dtype fp16 \
    --allow-nonfinite
check "import left nothing" test ! -e "$WORK/big16"
expect_error "reshard --dtype fp16 --verify" 1 "$POS_SAID" \
    "$BIN/tp-reshard" "$WORK/big" --to tp2 --dtype fp16 -o "$WORK/v" --verify
check "reshard left nothing" test ! -e "$WORK/v"
for format in hdf5 safetensors gguf; do
    expect_error "export $format --dtype fp16" 1 "$POS_SAID" \
        "$CKPT" export "$WORK/big" --format $format --dtype fp16 -o "$WORK/x.$format"
    check "export $format left nothing" test ! -e "$WORK/x.$format"
done
check_all "nothing else appeared" '[ "$(ls "$WORK")" = "$(printf "big\nbig_hf\nck\nhf")" ]'

# bf16 holds 3e38; past 0x7f7f8000 (3.3961e38) it does not.
expect_ok "reshard --dtype bf16" "$BIN/tp-reshard" "$WORK/big" --to tp2 --dtype bf16 -o "$WORK/b16" --verify
expect_ok "beyond bf16" edit "$WORK/huge_hf" "$QKV:3:3:3.4e38"
expect_error "import --dtype bf16" 1 \
    "model/layers.0.attn.qkv.weight: 1 value beyond bf16's range \(largest \|x\| 3.4e\+38\) would become infinite: keep fp32 \(--dtype\)$" \
    "$CKPT" import "$WORK/huge_hf" -o "$WORK/huge16" --tp 1 --pp 1 --dtype bf16
check "bf16 import left nothing" test ! -e "$WORK/huge16"

# Infinities and NaNs of the source stay what they are; 65519 becomes 65504.
expect_ok "non-finite values" edit "$WORK/odd_hf" transformer.wpe.weight:0:0:inf transformer.wpe.weight:0:1:-inf \
    transformer.wpe.weight:0:2:nan transformer.wpe.weight:0:3:65519 "$QKV:0:0:-inf"
expect_ok "import non-finite fp32" "$CKPT" import "$WORK/odd_hf" -o "$WORK/odd" --tp 1 --pp 1 --allow-nonfinite
expect_ok "import non-finite fp16" "$CKPT" import "$WORK/odd_hf" -o "$WORK/odd16" --tp 1 --pp 1 --dtype fp16 \
    --allow-nonfinite
expect_ok "reshard non-finite fp16" "$BIN/tp-reshard" "$WORK/odd" --to tp2 --dtype fp16 -o "$WORK/odd_tp2" --verify
expect_ok "export non-finite fp16" "$CKPT" export "$WORK/odd" --format hdf5 --dtype fp16 -o "$WORK/odd.h5"
expect_ok "export fp32 for the judge" "$CKPT" export "$WORK/odd" --format hdf5 -o "$WORK/odd32.h5"
expect_ok "fp16 export equals numpy's float16" "$PY" - "$WORK/odd32.h5" "$WORK/odd.h5" <<'PYEOF'
import sys
import h5py
import numpy as np
with h5py.File(sys.argv[1], "r") as wide, h5py.File(sys.argv[2], "r") as half:
    names = []
    wide.visit(lambda n: names.append(n) if isinstance(wide[n], h5py.Dataset) else None)
    assert names, "no datasets"
    for n in names:
        want, got = wide[n][()].astype(np.float16), half[n][()]
        assert got.dtype == np.float16, (n, got.dtype)
        assert np.array_equal(want, got, equal_nan=True), n
    w = half["model/pos_embed.weight"][()]
    assert np.isposinf(w[0, 0]) and np.isneginf(w[0, 1]) and np.isnan(w[0, 2]) and w[0, 3] == 65504, w[0, :4]
    assert np.isinf(half["model/layers.0.attn.qkv.weight"][()]).sum() == 1
PYEOF

finish
