#!/bin/sh
# End-to-end tests of tp-train's Llama (--model llama-tiny: 2 layers, dim 64,
# 4 heads, 2 KV heads, SwiGLU, untied output): the cross-check against the
# independent PyTorch Llama (tests/trainer/llama_ref.py, itself checked by
# test_llama_ref.sh) at tp1, tp2 (one KV head per rank), tp2 with one KV
# head (replicated on both ranks), tp2pp2, tp4 (KV heads replicated: 2 < tp
# 4), and in bf16 at tp1 and tp2pp2; ZeRO-3 beside tp with a shared key/value
# head (fp32 and bf16), tied embeddings interleaved, sequence parallelism
# splitting rows inside a sequence; and layout
# invariance (the same 20 losses at tp1 and tp2pp2).
# Resume at a new layout: written at tp2pp2, resumed at tp1dp2 and at tp4
# (KV heads replicated), the straight run's losses to 1e-6.
# tier: full
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/train_lib.sh"

use_open_mpi
TRAIN="$BIN/tp-train"
LLAMA="--model llama-tiny --micro-batch 2 --quiet"

skip_without_python 'torch, numpy, h5py' "python3-torch (or h5py) is not installed"


# --- The cross-check against the PyTorch Llama (torch_check in
# train_lib.sh): logits, loss, every gradient, 10 AdamW steps.
TORCH_MODEL=llama-tiny
torch_check tp1 1 --tp 1
torch_check tp2 2 --tp 2
torch_check tp2-kv1 2 --tp 2 --kv-heads 1
torch_check tp2pp2 4 --tp 2 --pp 2
torch_check tp4 4 --tp 4
torch_check tp2-kv1-sp 2 --tp 2 --kv-heads 1 --sequence-parallel
# Combinations the layout tests leave out: ZeRO-3 beside tensor parallelism
# with a key/value head shared by both ranks (its gradient summed per use);
# tied embeddings on the interleaved schedule (the last stage's copy);
# sequence parallelism whose rows split inside a sequence (seq 6 x
# micro-batch 2 = 12 rows, 3 a rank at tp4: the rotary positions of each
# rank's rows); and ZeRO-3 with a shared head in bf16.
torch_check tp2dp2-kv1-sp-zero3 4 --tp 2 --dp 2 --kv-heads 1 --sequence-parallel --zero 3
torch_check tp2pp2v2-tied 4 --tp 2 --pp 2 --virtual-stages 2 --layers 4 --tied-embeddings
torch_check tp4-kv1-sp-seq6 4 --tp 4 --kv-heads 1 --sequence-parallel --seq 6
BF16=1 torch_check tp2dp2-kv1-zero3-bf16 4 --tp 2 --dp 2 --kv-heads 1 --zero 3
BF16=1 torch_check tp1-bf16 1 --tp 1
BF16=1 torch_check tp2pp2-bf16 4 --tp 2 --pp 2
torch_check_fails_bf16 tp1-fp32-as-bf16 tp1

# --- Layout invariance: 20 steps of 4-sequence batches at tp1 (micro-batch
# 4) and at tp2pp2 (micro-batch 2 x accumulation 2) have the same losses.
expect_ok "20 steps at tp1" "$TRAIN" $LLAMA --micro-batch 4 --steps 20 --log "$WORK/tp1.jsonl"
expect_ok "20 steps at tp2pp2" mpi_train 4 $LLAMA --tp 2 --pp 2 --grad-accum 2 --steps 20 --log "$WORK/tp2pp2.jsonl"
check "tp2pp2 has the losses of tp1 (1e-4)" losses_match "$WORK/tp2pp2.jsonl" "$WORK/tp1.jsonl" 1e-4
check "the loss falls on synthetic data" "$PY" -c '
import json, sys
r = [x["loss"] for x in map(json.loads, open(sys.argv[1])) if "event" not in x]
sys.exit(not r[-1] < r[0] - 0.05)' "$WORK/tp1.jsonl"

# --- Resume at a new layout: 10 steps at tp2pp2, then tp1dp2; and at tp4,
# where the 2 key/value heads are replicated over the ranks sharing them.
expect_ok "20 straight steps at tp1" "$TRAIN" $LLAMA --steps 20 --log "$WORK/straight.jsonl"
expect_ok "10 steps at tp2pp2 then stop" mpi_train 4 $LLAMA --tp 2 --pp 2 --steps 20 --stop-at 10 \
    --ckpt-dir "$WORK/relayout" --log "$WORK/relayout.jsonl"
expect_ok "resume at tp1dp2" mpi_train 2 $LLAMA --dp 2 --micro-batch 1 --steps 20 --ckpt-dir "$WORK/relayout" --resume \
    --log "$WORK/relayout.jsonl"
check "tp2pp2 -> tp1dp2 has the straight losses (1e-6)" losses_match "$WORK/relayout.jsonl" "$WORK/straight.jsonl" 1e-6
expect_ok "10 steps at tp2 then stop" mpi_train 2 $LLAMA --tp 2 --steps 20 --stop-at 10 --ckpt-dir "$WORK/to-tp4" \
    --log "$WORK/to-tp4.jsonl"
expect_ok "resume at tp4 (K < TP)" mpi_train 4 $LLAMA --tp 4 --steps 20 --ckpt-dir "$WORK/to-tp4" --resume \
    --log "$WORK/to-tp4.jsonl"
check "tp2 -> tp4 has the straight losses (1e-6)" losses_match "$WORK/to-tp4.jsonl" "$WORK/straight.jsonl" 1e-6
expect_ok "and back from tp4 to tp2pp2" mpi_train 4 $LLAMA --tp 2 --pp 2 --steps 25 --ckpt-dir "$WORK/to-tp4" --resume \
    --log "$WORK/back.jsonl"
expect_ok "tp-ckpt verify of the tp4 checkpoint" "$BIN/tp-ckpt" verify "$WORK/to-tp4/step_00000020"

finish
