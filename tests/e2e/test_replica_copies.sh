#!/bin/sh
# Every copy of a tensor stored more than once is compared wherever a tool
# makes an output from the copy it reads: a Megatron-LM legacy checkpoint's
# replicated tensors (norms, biases of row-parallel layers, and their Adam
# state) are in every tensor-parallel rank's file, and tp-ckpt export and
# import take rank 0's. A copy that differs (a bug or a flipped bit on one
# rank, its file's CRC-32 intact) is refused, naming the tensor, both files,
# the element and both values, nothing written; the intact checkpoint
# exports and imports. Skipped without python3-torch.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
FIXTURE="$ROOT/tests/support/megatron_fixture.py"

if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    echo "[SKIP] [$NAME] python3-torch is not installed"
    finish
fi

# ------------------------------------------------- Megatron-LM legacy
expect_ok "fixture: a GPT-2 with --openai-gelu and Adam state, tp2, fp32" "$PY" "$FIXTURE" "$WORK/t" --tp 2 --pp 1 \
    --layers 2 --hidden 32 --heads 4 --ffn 64 --vocab 50 --dtype fp32 --optimizer --openai-gelu
cp -r "$WORK/t" "$WORK/t_rep"
# Tensor-parallel rank 1's copy of the final norm's weight, element 3, set to 5
# (torch.save writes the file's CRC-32s anew); prints the bits rank 0's has.
BITS=$("$PY" - "$WORK/t_rep/iter_0001000/mp_rank_01/model_optim_rng.pt" "$ROOT/tests/support" <<'PYEOF'
import sys, torch
sys.path.insert(0, sys.argv[2])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
sd = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
def find(node):
    for k, v in node.items():
        if isinstance(v, dict):
            found = find(v)
            if found is not None:
                return found
        elif k.endswith("final_norm.weight"):
            return v
t = find(sd["model"])
print("0x%08x" % (t[3:4].view(torch.int32).item() & 0xffffffff))
t[3] = 5.0
torch.save(sd, sys.argv[1])
PYEOF
)
check "the copy edited where torch.load finds it" [ -n "$BITS" ]
DIFFER="final_norm.weight \(language_model.encoder.final_norm.weight\) is replicated over the tensor-parallel ranks and its copies differ: element \[3\] is 5 \(0x40a00000\) in [^ ]*t_rep/iter_0001000/mp_rank_01/model_optim_rng.pt \(tensor-parallel rank 1's copy\), [^ ]+ \($BITS\) in [^ ]*t_rep/iter_0001000/mp_rank_00/model_optim_rng.pt \(rank 0's, the one read\)"
for format in hdf5 safetensors gguf; do
    expect_error "export --format $format refuses the copies that differ, naming both" 1 "$DIFFER" \
        "$CK" export "$WORK/t_rep" --format $format -o "$WORK/t_rep.$format"
    check "export --format $format wrote nothing" test ! -e "$WORK/t_rep.$format"
    expect_ok "export --format $format of the intact checkpoint" "$CK" export "$WORK/t" --format $format \
        -o "$WORK/t.$format"
done
expect_error "import refuses the copies that differ, naming both" 1 "$DIFFER" \
    "$CK" import "$WORK/t_rep" --tp 1 --pp 1 -o "$WORK/t_rep.tp"
check "import wrote nothing" test ! -e "$WORK/t_rep.tp"
expect_ok "import of the intact checkpoint" "$CK" import "$WORK/t" --tp 1 --pp 1 -o "$WORK/t.tp"

finish
