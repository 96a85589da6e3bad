#!/bin/sh
# Llama-shaped Megatron-LM checkpoints (rotary positions, RMSNorm, SwiGLU,
# grouped-query attention, no biases, tied or untied output) both ways, judged
# by the loss that Megatron's modules compute from the rank files
# (tests/support/megatron_fixture.py --loss, written from Megatron's code, not
# ours): a Megatron Llama imported as this trainer's Llama computes it
# (tp-train eval), Llama 3's frequency scaling included, and training goes on;
# a Llama tp-train wrote, written as Megatron's (legacy and Core names),
# computes tp-train's loss there and comes back bit for bit. Skipped without
# python3-torch.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
FIXTURE="$ROOT/tests/support/megatron_fixture.py"

skip_without_python 'torch, numpy' "python3-torch is not installed"
use_open_mpi

tokens "$WORK/tokens.bin" 4200


# --- Megatron -> ours: a Llama with 2 query groups, untied, Adam state, tp2pp2.
expect_ok "fixture: a Megatron Llama (rope, RMSNorm, SwiGLU, 2 query groups, untied), tp2pp2, fp32, Adam" \
    "$PY" "$FIXTURE" "$WORK/m" --tp 2 --pp 2 --layers 4 --hidden 64 --heads 4 --query-groups 2 --ffn 128 --vocab 90 \
    --make-vocab-size-divisible-by 16 --swiglu --untied --rope --rmsnorm --no-bias --dtype fp32 --optimizer
mkdir -p "$WORK/run"
expect_ok "imported as this trainer's checkpoint at tp2pp1" "$CK" import "$WORK/m" --tp 2 --pp 1 --true-vocab-size 90 \
    -o "$WORK/run/step_00001000"
check "weights and Adam state of a Llama" grep -q ": 81 tensors at tp=2 pp=1" "$WORK/.out"
expect_ok "tp-ckpt info" "$CK" info "$WORK/run/step_00001000" --json
check "a Llama, untied, 2 key/value heads" "$PY" -c 'import json, sys
m = json.load(open(sys.argv[1]))["model"]
sys.exit(not (m["arch"] == "llama" and m["kv_heads"] == 2 and m["tied_embeddings"] is False and m["rope_theta"] == 10000))' \
    "$WORK/.out"
expect_ok "Megatron's loss of the rank files" "$PY" "$FIXTURE" --loss "$WORK/m" "$WORK/tokens.bin" 32 8 90
cp "$WORK/.out" "$WORK/m.loss"
expect_ok "tp-train eval of the import at tp2" mpirun --oversubscribe -np 2 "$BIN/tp-train" eval \
    --ckpt "$WORK/run/step_00001000" --data "$WORK/tokens.bin" --tp 2 --windows 8 --seq 32 --json
check "the same loss (1e-6)" same_loss "$WORK/.out" "$WORK/m.loss" 1e-6
expect_ok "tp-train goes on training it at tp1pp2" mpirun --oversubscribe -np 2 "$BIN/tp-train" --arch llama --layers 4 \
    --dim 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 90 --seq 32 --vocab-pad-multiple 16 --pp 2 --micro-batch 2 \
    --steps 1003 --data "$WORK/tokens.bin" --ckpt-dir "$WORK/run" --resume --log "$WORK/run.jsonl" --quiet
check "from step 1000, 3 steps" "$PY" -c 'import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
start = [l for l in lines if l.get("event") == "start"][0]
steps = [l for l in lines if "loss" in l]
sys.exit(not (start["step"] == 1000 and [l["step"] for l in steps] == [1001, 1002, 1003] and
              all(math.isfinite(l["loss"]) for l in steps)))' "$WORK/run.jsonl"

# --- Llama 3's frequency scaling and a tied output, Core names, bf16. At
# 1024 positions the scaling moves this loss by 1.6e-6 of itself: the
# tolerance is well below that.
expect_ok "fixture: a Megatron Llama 3 (theta 500000, rope scaling 32), tied, Core names, bf16" "$PY" "$FIXTURE" \
    "$WORK/m3" --tp 2 --pp 1 --layers 2 --hidden 64 --heads 4 --query-groups 2 --ffn 128 --vocab 90 \
    --make-vocab-size-divisible-by 16 --swiglu --rope --rmsnorm --no-bias --dtype bf16 --rotary-base 500000 \
    --rope-scaling 32 --seq 2048 --names core
expect_ok "imported at tp1" "$CK" import "$WORK/m3" --tp 1 --pp 1 --true-vocab-size 90 -o "$WORK/m3_ours"
expect_ok "tp-ckpt info" "$CK" info "$WORK/m3_ours" --json
check "its rope scaling and tied output" "$PY" -c 'import json, sys
m = json.load(open(sys.argv[1]))["model"]
sys.exit(not (m["rope_theta"] == 500000 and m["tied_embeddings"] is True and m["rope_scaling"] == {"factor": 32,
    "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}))' "$WORK/.out"
expect_ok "Megatron's loss over 4 windows of 1024" "$PY" "$FIXTURE" --loss "$WORK/m3" "$WORK/tokens.bin" 1024 4 90
cp "$WORK/.out" "$WORK/m3.loss"
expect_ok "tp-train eval of the import" "$BIN/tp-train" eval --ckpt "$WORK/m3_ours" --data "$WORK/tokens.bin" \
    --windows 4 --seq 1024 --json
check "the same loss (1e-7)" same_loss "$WORK/.out" "$WORK/m3.loss" 1e-7

# --- Ours -> Megatron: a Llama tp-train wrote, with 2 key/value heads, untied.
expect_ok "tp-train: 3 steps of a Llama at tp2, checkpointed" mpirun --oversubscribe -np 2 "$BIN/tp-train" --arch llama \
    --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 90 --seq 32 --vocab-pad-multiple 16 --tp 2 \
    --micro-batch 2 --steps 3 --data "$WORK/tokens.bin" --ckpt-dir "$WORK/own" --quiet
expect_ok "tp-train eval of it" "$BIN/tp-train" eval --ckpt "$WORK/own" --data "$WORK/tokens.bin" --windows 8 --seq 32 --json
cp "$WORK/.out" "$WORK/own.loss"
expect_ok "written as Megatron-LM's at tp2pp2" "$RS" "$WORK/own/step_00000003" --format megatron --to tp2pp2 \
    -o "$WORK/own_megatron"
expect_ok "tp-ckpt info of the Megatron files" "$CK" info "$WORK/own_megatron"
check "rotary, no biases, untied, 2 query groups" grep -q "4 heads in 2 query groups .*no position embeddings, no biases, untied" \
    "$WORK/.out"
expect_ok "Megatron's loss of the written rank files" "$PY" "$FIXTURE" --loss "$WORK/own_megatron" "$WORK/tokens.bin" 32 8 90
check "is tp-train's (1e-6)" same_loss "$WORK/own.loss" "$WORK/.out" 1e-6
expect_ok "imported back at tp1pp2" "$CK" import "$WORK/own_megatron" --tp 1 --pp 2 --true-vocab-size 90 -o "$WORK/own_back"
expect_ok "the round trip equals the trainer's weights bit for bit" "$CK" diff --weights-only "$WORK/own/step_00000003" \
    "$WORK/own_back"
expect_ok "Megatron-Core names too, tp1pp2" "$RS" "$WORK/own/step_00000003" --format megatron --to tp1pp2 \
    --megatron-names core -o "$WORK/own_core"
expect_ok "Megatron's loss of the Core files" "$PY" "$FIXTURE" --loss "$WORK/own_core" "$WORK/tokens.bin" 32 8 90
check "is tp-train's (1e-6)" same_loss "$WORK/own.loss" "$WORK/.out" 1e-6

# --- What this Llama cannot compute is refused, naming it.
expect_ok "fixture: rope and RMSNorm with biases" "$PY" "$FIXTURE" "$WORK/biased" --tp 1 --pp 1 --layers 2 --hidden 32 \
    --heads 4 --ffn 64 --vocab 50 --swiglu --rope --rmsnorm --dtype fp32
expect_error "biased linears are refused" 1 "biased linears beside rotary positions and RMSNorm" "$CK" import \
    "$WORK/biased" --tp 1 --pp 1 -o "$WORK/never"
expect_ok "fixture: rope and RMSNorm with a GELU MLP" "$PY" "$FIXTURE" "$WORK/gelu" --tp 1 --pp 1 --layers 2 --hidden 32 \
    --heads 4 --ffn 64 --vocab 50 --rope --rmsnorm --no-bias --dtype fp32
expect_error "a GELU MLP is refused" 1 "without a SwiGLU MLP" "$CK" import "$WORK/gelu" --tp 1 --pp 1 -o "$WORK/never"
check "nothing was written for refused imports" test ! -e "$WORK/never"
finish
