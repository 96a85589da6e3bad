#!/bin/sh
# End-to-end tests of tp-train on GPUs (--device cuda): against the PyTorch
# GPT-2 and Llama in fp32 (logits, loss, every gradient, 10 AdamW steps),
# against the CPU trainer, layout invariance at every layout (one process per
# GPU where there are enough, else --share-gpus: several on one GPU, their
# messages through host copies), resumes at another layout, and checkpoints
# moving between GPU and CPU. Without
# a GPU (nvidia-smi finds none) or a CUDA build, every test here reports
# itself skipped: `make test` runs this file so that the skip shows;
# `make test-gpu` sets GPU_REQUIRED=1, and then a missing GPU is a failure.
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"

use_open_mpi
TRAIN="$BIN/tp-train"
TINY="--model tiny --micro-batch 2 --quiet"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "$gpus" -eq 0 ] || ! "$TRAIN" $TINY --steps 1 --device cuda >/dev/null 2>&1; then
    why="no GPU on this machine"
    [ "$gpus" -gt 0 ] && why="$gpus GPU(s), but tp-train --device cuda fails: $("$TRAIN" $TINY --steps 1 --device cuda 2>&1 | tail -n 1)"
    echo "[$NAME] SKIP: $why; nothing run"
    if [ "${GPU_REQUIRED:-0}" = 1 ]; then
        echo "[$NAME] FAIL: make test-gpu needs a GPU and a CUDA build" >&2
        exit 1
    fi
    exit 0
fi
echo "[$NAME] $gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"

# section NAME: a line where each part starts, and, should a time limit stop
# this script (TERM: its children end first, then this trap runs), the part
# it was in and the counts so far.
SECTION="the start"
section() {
    SECTION=$1
    echo "[$NAME] -- $1 ($PASSED passed, $FAILED failed so far)"
}
trap 'echo "[$NAME] stopped (a time limit?) during: $SECTION; $PASSED passed, $FAILED failed"; exit 143' TERM

# gpu_train RANKS ARGS...: tp-train on RANKS ranks, one GPU each, or where
# the machine has fewer, sharing them (--share-gpus: NCCL is then not used).
gpu_train() {
    ranks=$1
    shift
    share=""
    [ "$ranks" -gt "$gpus" ] && share=--share-gpus
    mpirun --oversubscribe -np "$ranks" "$TRAIN" --device cuda $share "$@" </dev/null
}

# --- Against PyTorch (tests/trainer/check_torch.py), as test_train.sh and
# test_train_llama.sh do on the CPU, at each layout: GPT-2 (tiny) and Llama
# (llama-tiny: RMSNorm, rotary embeddings, SwiGLU, 2 KV heads, replicated at
# tp4). Those with no more ranks than GPUs here; the others, sharing GPUs,
# at the end (torch_layouts shared), with the rest of what shares them.
section "against PyTorch"
TORCH_LAYOUTS="tp1:1:tiny:--tp=1 tp2:2:tiny:--tp=2 tp2pp2:4:tiny:--tp=2,--pp=2 llama-tp1:1:llama-tiny:--tp=1
    llama-tp2:2:llama-tiny:--tp=2 llama-tp4:4:llama-tiny:--tp=4 tp2-sp:2:tiny:--tp=2,--sequence-parallel"
# torch_layouts own|shared: the layouts of TORCH_LAYOUTS whose ranks fit the GPUs (own) or not (shared).
torch_layouts() {
    for layout in $TORCH_LAYOUTS; do
        name=${layout%%:*} rest=${layout#*:}
        ranks=${rest%%:*} rest=${rest#*:}
        model=${rest%%:*} flags=$(echo "${rest#*:}" | tr ',' ' ')
        if [ "$ranks" -gt "$gpus" ] && [ "$1" = own ]; then continue; fi
        if [ "$ranks" -le "$gpus" ] && [ "$1" = shared ]; then continue; fi
        dir="$WORK/torch-$name"
        opts="--micro-batch 2 --grad-accum 2 --steps 10 --lr 1e-3 --warmup 2"
        # shellcheck disable=SC2086
        expect_ok "GPU $name with --dump" gpu_train "$ranks" --model "$model" --vocab 250 $flags $opts --dump "$dir" \
            --log "$dir.jsonl" --quiet
        # shellcheck disable=SC2086
        run "$PY" "$ROOT/tests/trainer/check_torch.py" "$dir" "$dir.jsonl" $opts
        # Five checks, four where this Python lacks xxhash (the initial values' check is then said to be skipped).
        checks=5
        grep -q "initial values: skipped" "$WORK/.out" && checks=4
        if [ "$RC" -eq 0 ] && [ "$(grep -c ' ok$' "$WORK/.out")" -eq $checks ]; then pass
        else failed "GPU $name against PyTorch (exit $RC)"; fi
    done
}
torch_layouts own

# --- The GPU trainer against the CPU trainer: 20 steps of the small model
# (cuBLAS and OpenBLAS sum in other orders: 1e-4 relative), with a
# vocabulary of 1000: rows of logits longer than a block of 256 threads, so
# that the cross-entropy's one-pass statistics rescale each thread's sum.
section "the GPU trainer against the CPU trainer"
expect_ok "small on the CPU" "$TRAIN" --model small --vocab 1000 --micro-batch 2 --quiet --steps 20 --device cpu \
    --log "$WORK/small-cpu.jsonl"
expect_ok "small on a GPU" gpu_train 1 --model small --vocab 1000 --micro-batch 2 --quiet --steps 20 \
    --log "$WORK/small-gpu.jsonl"
check "small: the GPU's losses are the CPU's (1e-4)" losses_match "$WORK/small-gpu.jsonl" "$WORK/small-cpu.jsonl" 1e-4
check "small: the start line names the GPU" grep -q '"device":"cuda:0 ' "$WORK/small-gpu.jsonl"
check "small: the step lines give the MFU" grep -q '"mfu":' "$WORK/small-gpu.jsonl"
# The attention kernels of a warp per row (the tiled ones,
# kernels/cuda/attention_tiled.h, are the default; small's heads have 64
# dimensions): the same losses.
export TP_CUDA_ATTENTION=rows
expect_ok "small on a GPU, attention by rows" gpu_train 1 --model small --vocab 1000 --micro-batch 2 --quiet \
    --steps 20 --log "$WORK/small-gpu-rows.jsonl"
unset TP_CUDA_ATTENTION
check "small, attention by rows: the CPU's losses (1e-4)" losses_match "$WORK/small-gpu-rows.jsonl" \
    "$WORK/small-cpu.jsonl" 1e-4
# The tiled forward at 2 rows a thread (TP_CUDA_TILED_FORWARD_ROWS; 4 by
# default, 3 the other choice): the same losses, and the start line says so.
export TP_CUDA_TILED_FORWARD_ROWS=2
expect_ok "small on a GPU, the tiled forward at 2 rows a thread" gpu_train 1 --model small --vocab 1000 \
    --micro-batch 2 --quiet --steps 20 --log "$WORK/small-gpu-rows2.jsonl"
unset TP_CUDA_TILED_FORWARD_ROWS
check "small, the tiled forward at 2 rows a thread: the CPU's losses (1e-4)" losses_match \
    "$WORK/small-gpu-rows2.jsonl" "$WORK/small-cpu.jsonl" 1e-4
check "small, the tiled forward at 2 rows a thread: the start line says so" \
    grep -q '"attention":"CUDA tiled kernels (forward: 2 rows a thread, TP_CUDA_TILED_FORWARD_ROWS=2), fp32' \
    "$WORK/small-gpu-rows2.jsonl"
# The tiled backward at 1 row a thread (TP_CUDA_TILED_BACKWARD_ROWS; 2 by
# default), with the forward at 3: the same losses, and the start line names
# both choices.
export TP_CUDA_TILED_FORWARD_ROWS=3 TP_CUDA_TILED_BACKWARD_ROWS=1
expect_ok "small on a GPU, the tiled backward at 1 row a thread" gpu_train 1 --model small --vocab 1000 \
    --micro-batch 2 --quiet --steps 20 --log "$WORK/small-gpu-backward1.jsonl"
unset TP_CUDA_TILED_FORWARD_ROWS TP_CUDA_TILED_BACKWARD_ROWS
check "small, the tiled backward at 1 row a thread: the CPU's losses (1e-4)" losses_match \
    "$WORK/small-gpu-backward1.jsonl" "$WORK/small-cpu.jsonl" 1e-4
check "small, the tiled backward at 1 row a thread: the start line names both choices" grep -q \
    '"attention":"CUDA tiled kernels (forward: 3 rows a thread, TP_CUDA_TILED_FORWARD_ROWS=3; backward: 1 row a thread, TP_CUDA_TILED_BACKWARD_ROWS=1), fp32' \
    "$WORK/small-gpu-backward1.jsonl"
# The tensor cores' attention in 3xTF32 (TP_CUDA_ATTENTION=tf32x3,
# kernels/cuda/attention_tf32x3.h): fp32's losses within the same 1e-4,
# and the start line names it.
export TP_CUDA_ATTENTION=tf32x3
expect_ok "small on a GPU, the tensor cores' attention" gpu_train 1 --model small --vocab 1000 --micro-batch 2 \
    --quiet --steps 20 --log "$WORK/small-gpu-tf32x3.jsonl"
unset TP_CUDA_ATTENTION
check "small, the tensor cores' attention: the CPU's losses (1e-4)" losses_match "$WORK/small-gpu-tf32x3.jsonl" \
    "$WORK/small-cpu.jsonl" 1e-4
check "small, the tensor cores' attention: the start line says so" grep -q \
    "\"attention\":\"CUDA tensor cores' 3xTF32 kernels, fp32 (TP_CUDA_ATTENTION=tf32x3)" "$WORK/small-gpu-tf32x3.jsonl"

expect_ok "llama-tiny on the CPU" "$TRAIN" --model llama-tiny --micro-batch 2 --quiet --steps 20 --device cpu \
    --log "$WORK/llama-cpu.jsonl"
expect_ok "llama-tiny on a GPU" gpu_train 1 --model llama-tiny --micro-batch 2 --quiet --steps 20 \
    --log "$WORK/llama-gpu.jsonl"
check "llama-tiny: the GPU's losses are the CPU's (1e-4)" losses_match "$WORK/llama-gpu.jsonl" "$WORK/llama-cpu.jsonl" 1e-4

# --- --device auto is one verdict for the job: GPUs when every rank has its
# own, else the CPU for all (more ranks than GPUs once hung: rank 0 alone
# took the GPU and waited in NCCL's setup for ranks that never came).
section "--device auto"
expect_ok "auto, one rank per GPU" mpirun --oversubscribe -np "$gpus" "$TRAIN" $TINY --steps 2 \
    --log "$WORK/auto-fits.jsonl" </dev/null
check "auto, one rank per GPU: every rank on a GPU" grep -q '"device":"cuda:0 ' "$WORK/auto-fits.jsonl"
over=$((gpus * 2))
expect_ok "auto, $over ranks on $gpus GPU(s): ends" timeout 120 mpirun --oversubscribe -np "$over" "$TRAIN" $TINY \
    --steps 2 --log "$WORK/auto-over.jsonl" </dev/null
check "auto, $over ranks on $gpus GPU(s): all on the CPU" grep -q '"device":"cpu"' "$WORK/auto-over.jsonl"

# --- Checkpoints between GPU and CPU: 10 steps on one, 10 resumed on the
# other, against 20 straight on the first (1e-4).
section "checkpoints between GPU and CPU"
expect_ok "20 straight steps on the CPU" "$TRAIN" $TINY --steps 20 --device cpu --log "$WORK/straight.jsonl"
for way in "cuda cpu" "cpu cuda"; do
    set -- $way
    dir="$WORK/$1-to-$2"
    expect_ok "$1 to $2: 10 steps on $1" "$TRAIN" $TINY --steps 20 --stop-at 10 --device "$1" --ckpt-dir "$dir" \
        --log "$dir.jsonl"
    expect_ok "$1 to $2: resumed on $2" "$TRAIN" $TINY --steps 20 --device "$2" --ckpt-dir "$dir" --resume \
        --log "$dir.jsonl"
    check "$1 to $2: the losses of 20 straight steps (1e-4)" losses_match "$dir.jsonl" "$WORK/straight.jsonl" 1e-4
done
expect_ok "a GPU checkpoint verifies" "$BIN/tp-ckpt" verify "$WORK/cuda-to-cpu"
# Asynchronous snapshots (copied on a side stream after the saved step's
# mark, beside the next step) hold what a synchronous save writes, in bf16
# too (the weights' bf16 copy is remade after the step they save).
for dtype in fp32 bf16; do
    for mode in async sync; do
        flag=""
        [ $mode = sync ] && flag=--sync-save
        expect_ok "$dtype, a checkpoint every 2 steps, $mode" gpu_train 1 $TINY --dtype $dtype --steps 6 \
            --ckpt-every 2 $flag --ckpt-dir "$WORK/snapshots-$dtype-$mode"
    done
    for step in 2 4 6; do
        expect_ok "$dtype, step $step: the asynchronous save equals the synchronous one" "$BIN/tp-ckpt" diff \
            "$WORK/snapshots-$dtype-async/step_0000000$step" "$WORK/snapshots-$dtype-sync/step_0000000$step"
    done
done

# --- Repeatable: the same job twice gives the same bits, every weight and
# Adam moment of the checkpoints (tp-ckpt diff: bit-exact) and every loss, in
# fp32 and in bf16 with TP_CUDA_DETERMINISTIC=1 (cuDNN's deterministic
# backward: small's heads of 64 go through cuDNN in bf16, where it is
# installed). The embedding's gradient adds a token's rows in order (no
# atomics), and the rest has one writer an element or sums in a fixed order.
section "repeatable runs"
export TP_CUDA_DETERMINISTIC=1
for dtype in fp32 bf16; do
    for run in a b; do
        expect_ok "$dtype, TP_CUDA_DETERMINISTIC=1, run $run" gpu_train 1 --model small --vocab 1000 --micro-batch 2 \
            --quiet --steps 10 --dtype $dtype --ckpt-every 10 --ckpt-dir "$WORK/repeat-$dtype-$run" \
            --log "$WORK/repeat-$dtype-$run.jsonl"
    done
    check "$dtype: both runs have the same losses, bit for bit" losses_match "$WORK/repeat-$dtype-a.jsonl" \
        "$WORK/repeat-$dtype-b.jsonl" 0
    expect_ok "$dtype: both runs have the same checkpoint, bit for bit" "$BIN/tp-ckpt" diff \
        "$WORK/repeat-$dtype-a/step_00000010" "$WORK/repeat-$dtype-b/step_00000010"
done
unset TP_CUDA_DETERMINISTIC
check "bf16: the start line says the backward is deterministic (or that cuDNN is not used)" \
    grep -Eq '"attention":"[^"]*(deterministic|not used)' "$WORK/repeat-bf16-a.jsonl"

# --- tp-reshard --device auto: the GPU for a plan that converts dtypes, the
# CPU for plain copies (a GPU would only add copies to and from it).
# device_is DEVICE REASON: the --json plan in .out chose DEVICE for REASON.
section "tp-reshard on the GPU"
device_is() {
    "$PY" -c 'import json, sys
plan = json.load(open(sys.argv[1]))
sys.exit(not (plan["device"] == sys.argv[2] and plan["device_reason"].startswith(sys.argv[3])))' "$WORK/.out" "$1" "$2"
}
expect_ok "a tp2 checkpoint to reshard" "$BIN/tp-ckpt" synth -o "$WORK/rs" --tp 2 --model tiny --optim
expect_ok "auto, plain copies: a plan" "$BIN/tp-reshard" "$WORK/rs" --to tp1 --dry-run --json
check "auto, plain copies: the CPU, saying why" device_is cpu "no dtype to convert"
expect_ok "auto, fp32 to bf16: a plan" "$BIN/tp-reshard" "$WORK/rs" --to tp1 --dtype bf16 --dry-run --json
check "auto, fp32 to bf16: the GPU, saying why" device_is cuda "the plan converts"
expect_ok "auto, fp32 to bf16, on the GPU" "$BIN/tp-reshard" "$WORK/rs" --to tp1 --dtype bf16 -o "$WORK/rs-gpu"
expect_ok "the same on the CPU" "$BIN/tp-reshard" "$WORK/rs" --to tp1 --dtype bf16 -o "$WORK/rs-cpu" --device cpu
expect_ok "GPU and CPU outputs equal bit for bit" "$BIN/tp-ckpt" diff "$WORK/rs-gpu" "$WORK/rs-cpu"

# --- The unit tests, GPU cases included: on a GPU none may skip for want of
# one (the CUDA kernels against the CPU, the trainer on the GPU at tp1,
# tp2pp2 and pp2dp2 on threads sharing it, checkpoints both ways). TEST_JOBS
# (default 2): each binary's tests run at once, more on a GPU machine's cores.
section "the unit tests"
for t in "$ROOT/${BUILD:-build}"/tests/*/test_*; do
    [ -x "$t" ] || continue
    # The GPU tests rehearsed on the CPU (make test runs it): its skips of what needs CUDA are its own.
    case $t in */test_cuda_rehearsal) continue ;; esac
    run "$t" --verbose --jobs "${TEST_JOBS:-2}"
    check_all "$(basename "$t"): passed, no GPU case skipped" \
        '[ "$RC" -eq 0 ] && ! grep -q "^\[SKIP\].*CUDA" "$WORK/.err" "$WORK/.out"'
done
# The kernels again with cuBLASLt's epilogues set aside: the separate ways
# (the bias kernel, GELU's kernels, the bits product's fp32 route rounded
# after), which run on their own only where cuBLASLt refuses a product.
run env TP_CUDA_EPILOGUE=off "$ROOT/${BUILD:-build}/tests/kernels/test_cuda_backend" --verbose --jobs "${TEST_JOBS:-2}"
check_all "test_cuda_backend with TP_CUDA_EPILOGUE=off: passed, no GPU case skipped" \
    '[ "$RC" -eq 0 ] && ! grep -q "^\[SKIP\].*CUDA" "$WORK/.err" "$WORK/.out"'

# --- Last, the slowest part: what needs more ranks than GPUs where there
# are fewer (--share-gpus: several ranks on a GPU, their messages through
# host copies), so that a phase stopped at its time limit has run the rest.
section "against PyTorch, layouts sharing GPUs"
torch_layouts shared

# --- Layout invariance on as many GPUs as there are, or shared (global batch
# 4 sequences everywhere: the reference at tp1 too, which had 2 while no
# machine had the GPUs for the other layouts).
section "layout invariance"
expect_ok "20 steps at tp1 on a GPU" gpu_train 1 $TINY --micro-batch 4 --steps 20 --log "$WORK/gpu-tp1.jsonl"
# Fields: ranks tp pp dp micro-batch grad-accum, then options (_ for none).
for layout in "2 2 1 1 4 1 _" "2 1 2 1 2 2 _" "2 1 1 2 2 1 _" "4 2 2 1 2 2 _" "4 4 1 1 4 1 _" \
    "2 2 1 1 4 1 --sequence-parallel" "4 2 2 1 2 2 --sequence-parallel" \
    "2 1 1 2 2 1 --zero=1" "4 2 1 2 2 1 --zero=1" "2 1 1 2 2 1 --zero=3" "4 2 1 2 2 1 --zero=3"; do
    set -- $layout
    extra=$7
    [ "$extra" = _ ] && extra=""
    name="tp$2pp$3dp$4$(echo "$extra" | sed 's/[-=]//g')"
    # shellcheck disable=SC2086
    expect_ok "20 steps at $name on GPUs" gpu_train "$1" $TINY --tp "$2" --pp "$3" --dp "$4" --micro-batch "$5" \
        --grad-accum "$6" --steps 20 $extra --log "$WORK/gpu-$name.jsonl"
    check "$name on GPUs has the losses of tp1 (1e-4)" losses_match "$WORK/gpu-$name.jsonl" "$WORK/gpu-tp1.jsonl" 1e-4
done
if [ "$gpus" -lt 4 ]; then
    check "ranks sharing a GPU: the start line says so" grep -q '"device":"cuda:0 .*(shared by the ranks)' \
        "$WORK/gpu-tp2pp2dp1.jsonl"
fi
# The interleaved schedule: 8 layers, 8 micro-batches of 2 sequences, on one
# rank and at pp 2 with 2 chunks a stage (and with ZeRO-1 over 2 replicas).
IL="$TINY --layers 8 --grad-accum 8 --steps 10"
expect_ok "8 layers on one GPU" gpu_train 1 $IL --log "$WORK/gpu-il-one.jsonl"
expect_ok "8 layers at pp2 V2 on GPUs" gpu_train 2 $IL --pp 2 --virtual-stages 2 --log "$WORK/gpu-il-pp2v2.jsonl"
check "pp2 V2 on GPUs has the losses of one rank (1e-4)" losses_match "$WORK/gpu-il-pp2v2.jsonl" \
    "$WORK/gpu-il-one.jsonl" 1e-4
expect_ok "8 layers at pp2 V2 dp2 with ZeRO-1 on GPUs" gpu_train 4 $TINY --layers 8 --grad-accum 4 --steps 10 \
    --pp 2 --dp 2 --virtual-stages 2 --zero 1 --log "$WORK/gpu-il-pp2v2dp2.jsonl"
check "pp2 V2 dp2 ZeRO-1 on GPUs has the losses of one rank (1e-4)" losses_match "$WORK/gpu-il-pp2v2dp2.jsonl" \
    "$WORK/gpu-il-one.jsonl" 1e-4
# Resumed at another layout on the GPU(s): 10 steps at tp2pp2, 10 at tp1 dp2
# with ZeRO-1 (resharded at load), against 20 straight at tp1.
expect_ok "tp2pp2 on GPUs, stopped at step 10" gpu_train 4 $TINY --tp 2 --pp 2 --micro-batch 2 --grad-accum 2 \
    --steps 20 --stop-at 10 --ckpt-dir "$WORK/gpu-move" --log "$WORK/gpu-move.jsonl"
expect_ok "resumed at tp1dp2 with ZeRO-1 on GPUs" gpu_train 2 $TINY --tp 1 --dp 2 --micro-batch 2 --zero 1 \
    --steps 20 --ckpt-dir "$WORK/gpu-move" --resume --log "$WORK/gpu-move.jsonl"
check "the resumed run has the losses of 20 straight steps at tp1 (1e-4)" losses_match "$WORK/gpu-move.jsonl" \
    "$WORK/gpu-tp1.jsonl" 1e-4

finish
