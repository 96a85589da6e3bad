#!/bin/sh
# Every copy of a tensor stored more than once is compared wherever a tool
# makes an output from the copy it reads: a Megatron-LM legacy checkpoint's
# replicated tensors (norms, biases of row-parallel layers, and their Adam
# state) are in every tensor-parallel rank's file, and tp-ckpt export and
# import take rank 0's. A copy that differs (a bug or a flipped bit on one
# rank, its file's CRC-32 intact) is refused, naming the tensor, both files,
# the element and both values, nothing written; the intact checkpoint
# exports and imports. A Megatron-Core torch_dist checkpoint's distributed
# optimizer (dp_reshardable) stores a replicated parameter's state in each
# tensor-parallel rank's buckets: verify, diff, tp-reshard --verify, export
# and import compare those copies the same way. Skipped without python3-torch.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
FIXTURE="$ROOT/tests/support/megatron_fixture.py"

skip_without_python 'torch, numpy' "python3-torch is not installed"

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

# ------------------------------- Megatron-Core torch_dist, dp_reshardable
# The distributed optimizer's buckets hold each replicated parameter's state
# once per tensor-parallel rank (and the tied embeddings' on the first and
# last stage); the reader takes rank 0's. tp rank 1's copy of the Adam
# moment of stage 0's first replicated parameter (the position embeddings),
# element 3, differs: verify, diff, tp-reshard --verify, export and import
# name it; the intact checkpoint passes all of them.
RS="$BIN/tp-reshard"
DIST="$ROOT/tests/support/megatron_dist_fixture.py"
DSHAPE="--layers 4 --hidden 32 --heads 4 --ffn 64 --vocab 50 --names core --tp 2 --pp 2 --dtype bf16 --openai-gelu
    --distributed-optimizer dp_reshardable --optimizer-dp 2"
expect_ok "torch_dist fixture: dp_reshardable over 2 data-parallel ranks, tp2 pp2, tied" "$PY" "$DIST" "$WORK/d" $DSHAPE
expect_ok "the same, tensor-parallel rank 1's copy of a replicated exp_avg changed" "$PY" "$DIST" "$WORK/d_rep" $DSHAPE \
    --replica-differs exp_avg
BUCKET="optimizer.distributed.dp_group_idx_%d.gbuf_idx_0.dtype_\(torch.bfloat16, torch.float32\).bucket_idx_0.exp_avg"
DDIFFER="optim/exp_avg/embedding.position_embeddings.weight's copies differ over the tensor-parallel ranks \(the parameter is replicated\) in the distributed optimizer's buckets: element \[0, 3\] is 5 \(0x40a00000\) in [^ ]*d_rep/iter_0001000/__[0-9]+_0.distcp \($(printf "$BUCKET" 1), tensor-parallel rank 1's copy\), [^ ]+ \(0x[0-9a-f]{8}\) in [^ ]*d_rep/iter_0001000/__[0-9]+_0.distcp \($(printf "$BUCKET" 0), rank 0's, the one read\)"
expect_ok "verify of the intact checkpoint" "$CK" verify "$WORK/d"
check "verify compares the buckets' copies" \
    grep -Eq "every other copy \([0-9]+\) of the state of the [0-9]+ parameters the distributed optimizer's buckets store more than once equals the copy read" \
    "$WORK/.out"
expect_error "verify names the copy that differs" 1 "d_rep/iter_0001000: 1 of [0-9]+ parameters whose optimizer state is stored more than once differ .*$DDIFFER" \
    "$CK" verify "$WORK/d_rep"
run "$CK" diff "$WORK/d" "$WORK/d_rep"
check_all "diff: not equal (exit $RC), the copy named" \
    '[ $RC -eq 1 ] && ! grep -q "^equal" "$WORK/.out" && grep -Eq "^tp-ckpt: error: B \(.*d_rep/iter_0001000\): 1 of" "$WORK/.err"'
expect_error "tp-reshard --verify refuses it" 1 "d_rep/iter_0001000: $DDIFFER" \
    "$RS" "$WORK/d_rep" --to tp1 --format tp -o "$WORK/d_rep.tp" --verify
check "tp-reshard --verify wrote nothing" test ! -e "$WORK/d_rep.tp"
expect_ok "tp-reshard --verify of the intact checkpoint" "$RS" "$WORK/d" --to tp1 --format tp -o "$WORK/d.tp" --verify
expect_error "export refuses it" 1 "$DDIFFER" "$CK" export "$WORK/d_rep" --format hdf5 -o "$WORK/d_rep.h5"
expect_error "import refuses it" 1 "$DDIFFER" "$CK" import "$WORK/d_rep" --tp 1 --pp 1 -o "$WORK/d_rep.imp"
check "export and import wrote nothing" test ! -e "$WORK/d_rep.h5" -a ! -e "$WORK/d_rep.imp"
expect_ok "export of the intact checkpoint" "$CK" export "$WORK/d" --format hdf5 -o "$WORK/d.h5"
expect_ok "import of the intact checkpoint" "$CK" import "$WORK/d" --tp 1 --pp 1 -o "$WORK/d.imp"

finish
