#!/bin/sh
# NaN and infinite values in another tool's checkpoint converted into this
# toolkit's format (docs/TOOLS.md import, tp-reshard): a Megatron-LM legacy
# checkpoint written by PyTorch (tests/support/megatron_fixture.py) with a
# NaN in tensor-parallel rank 1's piece of a fused QKV and an infinity in an
# Adam moment, the same model and values as a Megatron-Core torch_dist
# checkpoint (tests/support/megatron_dist_fixture.py: layers stacked,
# chunks cut again over two data-parallel ranks), and a PyTorch distributed
# checkpoint written by torch's own DCP (tests/formats/dcp_torch.py's
# fixture helpers) with a NaN and an infinity. `tp-ckpt import` and
# `tp-reshard --format tp` refuse them (exit 1, one line: the file holding
# the first, the tensor, its shape, the counts, the first's index in the
# source's own shape, how many tensors in all), leaving nothing behind; with
# --allow-nonfinite they carry the exact bits, judged by torch.load (the
# legacy sources) or torch's DCP load (torch_dist and DCP) against h5py's
# reading of the output (tests/ckpt/check_h5py.py). This toolkit's own
# checkpoints are not counted (the flag is a usage error with them).
# Skipped without python3-torch.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
FIXTURE="$ROOT/tests/support/megatron_fixture.py"
H5="$ROOT/tests/ckpt/check_h5py.py"
DCP_JUDGE="$ROOT/tests/formats/dcp_torch.py"
DIST="$ROOT/tests/support/megatron_dist_fixture.py"

skip_without_python 'torch, numpy, h5py' "python3-torch is not installed"

# refused SRC FILE WHAT: import and tp-reshard --format tp of SRC (a
# legacy or torch_dist checkpoint of the model below: the NaN at layer 1's
# QKV [101, 3], an infinity in an Adam moment) refuse it in one line naming
# FILE, the tensor, its counts, the first's index and the total, leaving
# nothing in $WORK/out.
refused() {
    expect_error "import refuses $3 holding NaN: the file, tensor, counts, first index, total" 1 \
        "$2: tensor layers.1.attention.qkv.weight \[192, 64\] holds 1 NaN and 0 infinite values, the first at \[101, 3\]; 2 tensors in all hold NaN or infinite values \(2 values\): nothing imported \(--allow-nonfinite imports them as they are\)$" \
        "$CK" import "$WORK/$1" --tp 2 --pp 1 -o "$WORK/out/$1_import"
    check "the refused import left nothing behind" sh -c '! ls -A "$1" 2>/dev/null | grep -q .' sh "$WORK/out"
    expect_error "tp-reshard --format tp refuses it the same way" 1 \
        "$2: tensor layers.1.attention.qkv.weight \[192, 64\] holds 1 NaN and 0 infinite values, the first at \[101, 3\]; 2 tensors in all hold NaN or infinite values \(2 values\): nothing written \(--allow-nonfinite carries them as they are\)$" \
        "$RS" "$WORK/$1" --to tp1 --format tp -o "$WORK/out/$1_tp"
    check "the refused reshard left nothing behind" sh -c '! ls -A "$1" 2>/dev/null | grep -q .' sh "$WORK/out"
}

# carried SRC FILE OUT: with --allow-nonfinite, import (to OUT_import) and
# tp-reshard --format tp (to OUT_tp) write them, the refusal's sentence
# said as a warning.
carried() {
    expect_ok "import --allow-nonfinite carries them" "$CK" import "$WORK/$1" --tp 2 --pp 1 --allow-nonfinite \
        -o "$WORK/$3_import"
    check "with the refusal's sentence as a warning" grep -Eq \
        "^tp-ckpt: warning: imported with NaN or infinite values \(--allow-nonfinite\): .*$2: tensor layers.1.attention.qkv.weight \[192, 64\] holds 1 NaN" \
        "$WORK/.err"
    expect_ok "tp-reshard --allow-nonfinite carries them" "$RS" "$WORK/$1" --to tp1 --format tp --allow-nonfinite \
        -o "$WORK/$3_tp"
    check "with a warning" grep -q "^tp-reshard: warning: written with NaN or infinite values (--allow-nonfinite): " "$WORK/.err"
}

# bit_for_bit PREFIX: h5py's reading (tests/ckpt/check_h5py.py) of
# PREFIX_import's and PREFIX_tp's layer-1 QKV and word-embedding Adam
# moment against the source's as its own tool read them ($WORK/want_qkv.npy,
# want_moment.npy, written by the judge just before), bit for bit, NaN
# payloads included. The import regroups Megatron's QKV rows per group
# ([q_h, k_h, v_h] for each head h: a GPT-2 has a group a head) into this
# model's [q; k; v].
bit_for_bit() {
    for what in "$1_import model/layers.1.attn.qkv.weight optim/exp_avg/tok_embed.weight" \
        "$1_tp layers.1.attention.qkv.weight optim/exp_avg/embedding.word_embeddings.weight"; do
        set -- $what
        check "$1: the NaN and the infinity carried bit for bit (the source's own tool against h5py)" sh -c '
"$1" "$2" "$3/$4" --dump "$5" "$3/qkv.npy" >/dev/null && "$1" "$2" "$3/$4" --dump "$6" "$3/moment.npy" >/dev/null &&
"$1" - "$3" "$4" <<"PYEOF"
import sys, numpy as np
work, output = sys.argv[1], sys.argv[2]
qkv, moment = np.load(work + "/want_qkv.npy"), np.load(work + "/want_moment.npy")
if output.endswith("_import"):  # per head [q, k, v] blocks of 16 rows -> [q heads; k heads; v heads]
    qkv = qkv.reshape(4, 3, 16, 64).transpose(1, 0, 2, 3).reshape(192, 64)
for name, want in (("qkv", qkv), ("moment", moment)):
    got = np.load("%s/%s.npy" % (work, name))
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
    assert np.isnan(got).sum() + np.isinf(got).sum() == 1, name
PYEOF' sh "$PY" "$H5" "$WORK" "$1" "$2" "$3"
    done
}

# ------------------------------------------------------- Megatron-LM legacy
expect_ok "fixture: a GPT-2 with --openai-gelu and Adam state, tp2pp1, fp32" "$PY" "$FIXTURE" "$WORK/m" --tp 2 --pp 1 \
    --layers 2 --hidden 64 --heads 4 --ffn 128 --vocab 90 --make-vocab-size-divisible-by 16 --dtype fp32 --optimizer \
    --openai-gelu
expect_ok "imported as it is, finite" "$CK" import "$WORK/m" --tp 1 --pp 1 -o "$WORK/m_clean"
mkdir "$WORK/out"
cp -r "$WORK/m" "$WORK/m_nan"
# Rank 1's QKV of layer 1, local [5, 3]: Megatron's row 96 + 5 of the whole
# [192, 64] (each rank holds two of the four query groups' rows); rank 1's
# Adam exp_avg of the word embeddings ([48, 64] of the padded [96, 64]),
# local [2, 5]: row 50. torch.load finds them; it prints their old bits.
expect_ok "NaN and -inf put in rank 1's file by torch" "$PY" - "$WORK/m_nan/iter_0001000/mp_rank_01/model_optim_rng.pt" \
    "$ROOT/tests/support" <<'PYEOF'
import sys, torch
sys.path.insert(0, sys.argv[2])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
sd = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
sd["model"]["language_model"]["encoder"]["layers.1.self_attention.query_key_value.weight"][5, 3] = float("nan")
moments = [s["exp_avg"] for s in sd["optimizer"]["state"].values() if tuple(s["exp_avg"].shape) == (48, 64)]
assert len(moments) == 1, len(moments)
moments[0][2, 5] = float("-inf")
torch.save(sd, sys.argv[1])
PYEOF
MEGATRON_FILE="m_nan/iter_0001000/mp_rank_01/model_optim_rng.pt"
refused m_nan "$MEGATRON_FILE" "a Megatron checkpoint"
# The Adam moment alone: optimizer state is counted as the weights are.
cp -r "$WORK/m" "$WORK/m_inf"
"$PY" - "$WORK/m_inf/iter_0001000/mp_rank_01/model_optim_rng.pt" "$ROOT/tests/support" <<'PYEOF'
import sys, torch
sys.path.insert(0, sys.argv[2])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
sd = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
next(s["exp_avg"] for s in sd["optimizer"]["state"].values() if tuple(s["exp_avg"].shape) == (48, 64))[2, 5] = float("inf")
torch.save(sd, sys.argv[1])
PYEOF
expect_error "an infinite Adam moment alone is refused, named as Megatron's optimizer state" 1 \
    "m_inf/iter_0001000/mp_rank_01/model_optim_rng.pt: tensor optim/exp_avg/embedding.word_embeddings.weight \[96, 64\] holds 0 NaNs and 1 infinite value, the first at \[50, 5\]: nothing imported" \
    "$CK" import "$WORK/m_inf" --tp 1 --pp 1 -o "$WORK/out/m_inf"
check "nothing left behind" test ! -e "$WORK/out/m_inf"

carried m_nan "$MEGATRON_FILE" m
# The judge: torch.load of the rank files, the pieces joined.
expect_ok "torch.load reads the source's NaN and infinity" "$PY" - "$WORK" "$ROOT/tests/support" <<'PYEOF'
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[2])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
work = sys.argv[1]
ranks = [torch.load("%s/m_nan/iter_0001000/mp_rank_%02d/model_optim_rng.pt" % (work, r), map_location="cpu",
                    weights_only=False) for r in (0, 1)]
qkv = torch.cat([sd["model"]["language_model"]["encoder"]["layers.1.self_attention.query_key_value.weight"]
                 for sd in ranks])
moment = torch.cat([next(s["exp_avg"] for s in sd["optimizer"]["state"].values() if tuple(s["exp_avg"].shape) == (48, 64))
                    for sd in ranks])
np.save(work + "/want_qkv.npy", qkv.numpy())
np.save(work + "/want_moment.npy", moment.numpy())
PYEOF
bit_for_bit m
expect_ok "tp-reshard --verify proves the carried output equal to the source (logical digests)" "$RS" "$WORK/m_nan" \
    --to tp2 --format tp --allow-nonfinite --verify -o "$WORK/m_tp2"

# Where the flag would promise a count that is not made: a usage error.
expect_error "--allow-nonfinite with this toolkit's own checkpoint" 2 \
    "allow-nonfinite applies to another tool's checkpoint .*this toolkit's own checkpoints are not counted" \
    "$RS" "$WORK/m_clean" --to tp2 --allow-nonfinite -o "$WORK/never"
expect_error "--allow-nonfinite with another format's output" 2 \
    "allow-nonfinite applies to another tool's checkpoint .*other outputs carry NaN and infinite values as they are" \
    "$RS" "$WORK/m_nan" --to tp1 --allow-nonfinite -o "$WORK/never"
expect_ok "this toolkit's own checkpoint holding NaN reshards as it is (trusted, not counted)" "$RS" "$WORK/m_import" \
    --to tp1 -o "$WORK/m_import_tp1"
check "and says nothing of it" test ! -s "$WORK/.err"
check "nothing written for usage errors" test ! -e "$WORK/never"

# ------------------------------------------------- Megatron-Core torch_dist
# The model of the legacy case with the same NaN (layer 1's QKV, Megatron's
# row 101 of [192, 64], column 3) and an infinity in the word embeddings'
# Adam exp_avg at [50, 5], put in megatron_fixture.make_full's tensors
# before megatron_dist_fixture.py writes them: one process holds every
# chunk (__0_0.distcp), the layers stacked under decoder.layers.*, each
# tensor-parallel chunk cut again over 2 data-parallel ranks.
expect_ok "fixture: a torch_dist checkpoint with a NaN and an infinity, tp2pp1 dp2, fp32" "$PY" - "$DIST" "$WORK/td" \
    --names core --tp 2 --pp 1 --dp 2 --layers 2 --hidden 64 --heads 4 --ffn 128 --vocab 90 \
    --make-vocab-size-divisible-by 16 --dtype fp32 --optimizer --openai-gelu <<'PYEOF'
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import megatron_dist_fixture as dist
make_full = dist.mf.make_full

def poisoned(cfg):
    full, unfused, opt = make_full(cfg)
    full["layers.1.attention.qkv.weight"][101, 3] = float("nan")
    opt["embedding.word_embeddings.weight"]["exp_avg"][50, 5] = float("-inf")
    return full, unfused, opt

dist.mf.make_full = poisoned
sys.exit(dist.main(sys.argv[2:]))
PYEOF
DIST_FILE="td/iter_0001000/__0_0.distcp"
refused td "$DIST_FILE" "a torch_dist checkpoint"
carried td "$DIST_FILE" td
# The judge: torch's DCP load of the source's two entries (the stacked
# QKV's layer 1, the moment).
expect_ok "torch's DCP load reads the source's NaN and infinity" "$PY" - "$WORK" "$ROOT/tests/formats" <<'PYEOF'
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[2])
import dcp_torch
work = sys.argv[1]
path = work + "/td/iter_0001000"
tensors, _ = dcp_torch.tensor_entries(path)
keys = ("decoder.layers.self_attention.linear_qkv.weight", "optimizer.state.exp_avg.embedding.word_embeddings.weight")
state = {k: torch.empty(tensors[k][0], dtype=tensors[k][1]) for k in keys}
dcp_torch.alone(lambda rank, ranks: dcp_torch.load(state, path))
np.save(work + "/want_qkv.npy", state[keys[0]][1].numpy())  # [layers, 192, 64]: layer 1
np.save(work + "/want_moment.npy", state[keys[1]].numpy())
PYEOF
bit_for_bit td
expect_ok "tp-reshard --verify proves the carried output equal to the source (logical digests)" "$RS" "$WORK/td" \
    --to tp2 --format tp --allow-nonfinite --verify -o "$WORK/td_tp2"

# -------------------------------------------- PyTorch distributed checkpoint
# Two ranks, one data file each: an fp32 [6, 8] cut along dimension 1 (rank
# 1 holds columns 4..7) with a NaN at [2, 5], a bf16 [10, 4] in four chunks
# of 3, 3, 3, 1 rows (rank 0 holds rows 6..8) with +inf at [7, 1].
expect_ok "fixture: a DCP checkpoint written by torch with a NaN and an infinity" "$PY" - "$WORK/d" "$DCP_JUDGE" <<'PYEOF'
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[2]))
import dcp_torch as d

def poisoned(rank, ranks, out):
    w, emb = d.fixture_values("cols2", "model.w"), d.fixture_values("cols2", "model.emb")
    w[2, 5] = float("nan")
    emb[7, 1] = float("inf")
    if d.TORCH2:
        mesh = d.init_device_mesh("cpu", (ranks,))
        sd = {"model.w": d.distribute_tensor(w, mesh, [d.DShard(1)]),
              "model.emb": d.distribute_tensor(emb, mesh, [d.DShard(0)])}
    else:
        sd = {"model.w": d.boxes_tensor(rank, ranks, w, d.chunked(w, 1, 2, ranks)),
              "model.emb": d.boxes_tensor(rank, ranks, emb, d.chunked(emb, 0, 4, ranks))}
    sd["model.norm"] = d.fixture_values("cols2", "model.norm")
    d.save(sd, out, single_file_per_rank=True)

d.spawn(poisoned, 2, sys.argv[1])
PYEOF
expect_error "tp-reshard --format tp refuses a DCP checkpoint holding NaN: the data file of the first" 1 \
    "d/__1_0.distcp: tensor model.w \[6, 8\] holds 1 NaN and 0 infinite values, the first at \[2, 5\]; 2 tensors in all hold NaN or infinite values \(2 values\): nothing written \(--allow-nonfinite carries them as they are\)$" \
    "$RS" "$WORK/d" --to tp1 --format tp -o "$WORK/out/d_tp"
check "the refused reshard left nothing behind" sh -c '! ls -A "$1" 2>/dev/null | grep -q .' sh "$WORK/out"
expect_ok "tp-reshard --allow-nonfinite carries them" "$RS" "$WORK/d" --to tp1 --format tp --allow-nonfinite -o "$WORK/d_tp"
check "with a warning" grep -q "^tp-reshard: warning: written with NaN or infinite values (--allow-nonfinite): " "$WORK/.err"
expect_ok "torch's DCP load of the source equals the output bit for bit" "$PY" "$DCP_JUDGE" compare-ckpt "$WORK/d" \
    "$WORK/d_tp"
check "whose NaN and infinity are there (h5py)" sh -c '
"$1" "$2" "$3/d_tp" --dump model.w "$3/w.npy" >/dev/null && "$1" - "$3/w.npy" <<"PYEOF"
import sys, numpy as np
w = np.load(sys.argv[1])
assert np.isnan(w[2, 5]) and np.isnan(w).sum() == 1, w
PYEOF' sh "$PY" "$H5" "$WORK"
expect_ok "a DCP output of it carries them as they are (not this toolkit's format: not counted)" "$RS" "$WORK/d" --to tp1 \
    -o "$WORK/d_dcp"
check "and says nothing of them" test ! -s "$WORK/.err"
expect_ok "this toolkit's checkpoint written as DCP" "$RS" "$WORK/m_clean" --to tp1 --format dcp -o "$WORK/m_clean_dcp"
check "says nothing of values it did not count" test ! -s "$WORK/.err"

finish
