#!/bin/sh
# Megatron Llamas with fewer query groups (key/value heads) than the target's
# tensor-parallel ranks, both ways: imported into this toolkit's format at
# tp4 from 2 groups (legacy and Core names, torch_dist), the key and value
# heads replicated as tp-train writes them (format 1.4,
# replicate_small_segments), verified, bit for bit the tp1 import, computing
# Megatron's loss (tests/support/megatron_fixture.py --loss, from Megatron's
# code) in tp-train eval at tp4 and training on at tp4 with tp1's first loss;
# a tp4 checkpoint with 2 key/value heads written as Megatron-Core's rank
# files at tp4 (each group's rows cut between 2 ranks) that Megatron's loss
# and an import take back bit for bit, and as Megatron-LM legacy at tp2 whose
# import is the original's. Groups and tp that neither divide the other are refused,
# naming both. Skipped without python3-torch.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
FIXTURE="$ROOT/tests/support/megatron_fixture.py"
DIST="$ROOT/tests/support/megatron_dist_fixture.py"

skip_without_python 'torch, numpy' "python3-torch is not installed"
use_open_mpi

tokens "$WORK/tokens.bin" 4200

# first_loss LOG: the loss of the first step a tp-train log records.
first_loss() {
    "$PY" -c 'import json, sys
print(json.dumps({"loss": [json.loads(l) for l in open(sys.argv[1]) if "loss" in l][0]["loss"]}))' "$1"
}

SHAPE="--layers 2 --hidden 64 --heads 4 --query-groups 2 --ffn 128 --vocab 90 --make-vocab-size-divisible-by 16 --swiglu
    --untied --rope --rmsnorm --no-bias --dtype fp32 --optimizer"
TRAIN="--arch llama --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 90 --seq 32 --vocab-pad-multiple 16
    --micro-batch 2 --data $WORK/tokens.bin --quiet"

# --- Megatron-LM legacy, 2 query groups at tp2 -> ours at tp4 (and tp1).
expect_ok "fixture: a Megatron Llama with 2 query groups, tp2, Adam" "$PY" "$FIXTURE" "$WORK/m" --tp 2 --pp 1 $SHAPE
mkdir -p "$WORK/run1" "$WORK/run4"
expect_ok "imported at tp1" "$CK" import "$WORK/m" --tp 1 --pp 1 --true-vocab-size 90 -o "$WORK/run1/step_00001000"
expect_ok "imported at tp4: 2 query groups over 4 ranks" "$CK" import "$WORK/m" --tp 4 --pp 1 --true-vocab-size 90 \
    -o "$WORK/run4/step_00001000"
check "weights and Adam state at tp4" grep -q ": 45 tensors at tp=4 pp=1" "$WORK/.out"
expect_ok "tp-ckpt verify of the tp4 import" "$CK" verify "$WORK/run4/step_00001000"
check "its QKV replicates the key/value heads (format 1.4)" "$PY" -c 'import json, sys
t = {t["name"]: t for t in json.load(open(sys.argv[1]))["tensors"]}
p = t["model/layers.0.attn.qkv.weight"]["partition"]
sys.exit(not (p.get("replicate_small_segments") is True and
              t["optim/exp_avg/layers.0.attn.qkv.weight"]["partition"].get("replicate_small_segments") is True))' \
    "$WORK/run4/step_00001000/index.json"
expect_ok "the tp4 import is the tp1 import, bit for bit" "$CK" diff "$WORK/run4/step_00001000" "$WORK/run1/step_00001000"
expect_ok "tp-reshard --verify: tp4 -> tp1" "$RS" "$WORK/run4/step_00001000" --to tp1 -o "$WORK/back1" --verify
expect_ok "and that is the tp1 import" "$CK" diff "$WORK/back1" "$WORK/run1/step_00001000"
expect_ok "tp-reshard --verify: the tp1 import -> tp4, as the trainer lays it out" "$RS" "$WORK/run1/step_00001000" \
    --to tp4 -o "$WORK/re4" --verify
check "the tp4 import's shard files hold those pieces" "$PY" - "$WORK/re4" "$WORK/run4/step_00001000" <<'PYEOF'
import sys, h5py, numpy as np
a, b = (h5py.File(d + "/shard_pp00_tp%02d.h5" % r, "r") for d in sys.argv[1:3] for r in (3,))
found = []
a.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) else None)
sys.exit(not (found and all(np.array_equal(a[n][()], b[n][()]) for n in found)))
PYEOF

# The loss: Megatron's of the rank files, tp-train eval's of the tp4 import.
expect_ok "Megatron's loss of the rank files" "$PY" "$FIXTURE" --loss "$WORK/m" "$WORK/tokens.bin" 32 8 90
cp "$WORK/.out" "$WORK/m.loss"
expect_ok "tp-train eval of the tp4 import at tp4" mpirun --oversubscribe -np 4 "$BIN/tp-train" eval \
    --ckpt "$WORK/run4/step_00001000" --data "$WORK/tokens.bin" --tp 4 --windows 8 --seq 32 --json
check "Megatron's loss (1e-6)" same_loss "$WORK/.out" "$WORK/m.loss" 1e-6
# Training goes on at tp4 from the tp4 import, as at tp1 from the tp1 import.
expect_ok "tp-train --resume at tp1" "$BIN/tp-train" $TRAIN --steps 1002 --ckpt-dir "$WORK/run1" --resume \
    --log "$WORK/run1.jsonl"
expect_ok "tp-train --resume at tp4" mpirun --oversubscribe -np 4 "$BIN/tp-train" $TRAIN --tp 4 --steps 1002 \
    --ckpt-dir "$WORK/run4" --resume --log "$WORK/run4.jsonl"
first_loss "$WORK/run1.jsonl" >"$WORK/run1.loss"
first_loss "$WORK/run4.jsonl" >"$WORK/run4.loss"
check "step 1001's loss at tp4 is tp1's (1e-6)" same_loss "$WORK/run4.loss" "$WORK/run1.loss" 1e-6
check "from step 1000, 2 steps" "$PY" -c 'import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(not ([l for l in lines if l.get("event") == "start"][0]["step"] == 1000 and
              [l["step"] for l in lines if "loss" in l] == [1001, 1002]))' "$WORK/run4.jsonl"

# --- Megatron-Core names at tp4 (a group cut between 2 ranks), torch_dist.
expect_ok "fixture: the same Llama under Core names at tp4" "$PY" "$FIXTURE" "$WORK/c4" --tp 4 --pp 1 $SHAPE --names core
expect_ok "imported at tp1" "$CK" import "$WORK/c4" --tp 1 --pp 1 --true-vocab-size 90 -o "$WORK/c4_1"
expect_ok "imported at tp4" "$CK" import "$WORK/c4" --tp 4 --pp 1 --true-vocab-size 90 -o "$WORK/c4_4"
expect_ok "verify" "$CK" verify "$WORK/c4_4"
expect_ok "tp4 import = tp1 import" "$CK" diff "$WORK/c4_4" "$WORK/c4_1"
expect_ok "fixture: torch_dist, 2 query groups at tp2" "$PY" "$DIST" "$WORK/d" --tp 2 --pp 1 $SHAPE --names core
expect_ok "imported at tp1" "$CK" import "$WORK/d" --tp 1 --pp 1 -o "$WORK/d_1"
expect_ok "imported at tp4" "$CK" import "$WORK/d" --tp 4 --pp 1 -o "$WORK/d_4"
expect_ok "verify" "$CK" verify "$WORK/d_4"
expect_ok "tp4 import = tp1 import" "$CK" diff "$WORK/d_4" "$WORK/d_1"

# --- Ours at tp4 with 2 key/value heads -> Megatron.
SRC="$WORK/run4/step_00001000"
expect_ok "tp-reshard to Megatron-Core names at tp4" "$RS" "$SRC" --format megatron --megatron-names core --to tp4 \
    -o "$WORK/own_c4"
check "its QKV pieces are Megatron's cut: 2 heads' rows of 16" "$PY" - "$WORK/own_c4" "$ROOT/tests/support" <<'PYEOF'
import sys, torch
sys.path.insert(0, sys.argv[2])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
for r in range(4):
    sd = torch.load(sys.argv[1] + "/iter_0001000/mp_rank_%02d/model_optim_rng.pt" % r, map_location="cpu",
                    weights_only=False)
    w = sd["model"]["decoder.layers.0.self_attention.linear_qkv.weight"]
    if list(w.shape) != [32, 64]:
        sys.exit("rank %d: %s" % (r, list(w.shape)))
PYEOF
expect_ok "Megatron's loss of those rank files" "$PY" "$FIXTURE" --loss "$WORK/own_c4" "$WORK/tokens.bin" 32 8 90
check "is the original's (1e-6)" same_loss "$WORK/.out" "$WORK/m.loss" 1e-6
expect_ok "imported back at tp4" "$CK" import "$WORK/own_c4" --tp 4 --pp 1 --true-vocab-size 90 -o "$WORK/own_c4_4"
expect_ok "bit for bit the weights" "$CK" diff "$WORK/own_c4_4" "$SRC" --weights-only
expect_ok "tp-reshard to Megatron-LM legacy at tp2" "$RS" "$SRC" --format megatron --to tp2 -o "$WORK/own_l2"
# (The fixture's padding rows are random, a written one's zero: the
# vocabulary compares at its true size, through an import.)
expect_ok "imported at tp1" "$CK" import "$WORK/own_l2" --tp 1 --pp 1 --true-vocab-size 90 -o "$WORK/own_l2_1"
expect_ok "bit for bit the original's weights" "$CK" diff "$WORK/own_l2_1" "$WORK/run1/step_00001000" --weights-only
expect_error "legacy names at tp4 stay refused" 1 "2 query groups do not divide over tp 4 \(Megatron's legacy model" \
    "$RS" "$SRC" --format megatron --to tp4 -o "$WORK/own_l4"
# This toolkit's format from a legacy-named Megatron checkpoint at tp4: its
# names and layout kept, whole groups a rank, refused, saying so and what
# converts it (it said only "2 granules ... not divisible by tp=4").
expect_error "tp-reshard --format tp at tp4 from legacy names: refused, naming the groups and tp-ckpt import" 1 \
    "2 query groups do not divide over tp 4, and under Megatron's legacy names each rank keeps whole groups \(tp-ckpt import --tp 4 converts it" \
    "$RS" "$WORK/m" --format tp --to tp4 -o "$WORK/m_tp4"

# --- Groups and tp that neither divide the other.
expect_ok "fixture: 6 heads in 2 query groups, tp2" "$PY" "$FIXTURE" "$WORK/m6" --tp 2 --pp 1 --layers 2 --hidden 96 \
    --heads 6 --query-groups 2 --ffn 96 --vocab 90 --make-vocab-size-divisible-by 16 --swiglu --untied --rope --rmsnorm \
    --no-bias --dtype fp32
expect_error "import at tp3 refused, naming groups and tp" 1 \
    "m6/iter_0001000: 6 heads in 2 query groups at tp 3 pp 1: kv_heads 2 over tp 3: neither divides the other" \
    "$CK" import "$WORK/m6" --tp 3 --pp 1 --true-vocab-size 90 -o "$WORK/m6_3"
check "nothing written" test ! -e "$WORK/m6_3"
expect_ok "and at tp6 (3 ranks per group) imported" "$CK" import "$WORK/m6" --tp 6 --pp 1 --true-vocab-size 90 \
    -o "$WORK/m6_6"
expect_ok "equal to tp1's" sh -c "'$CK' import '$WORK/m6' --tp 1 --pp 1 --true-vocab-size 90 -o '$WORK/m6_1' >/dev/null &&
    '$CK' diff '$WORK/m6_6' '$WORK/m6_1'"

finish
