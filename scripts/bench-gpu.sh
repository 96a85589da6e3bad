#!/bin/sh
# make bench-gpu: tp-train on one GPU (--device cuda): tokens/s and MFU for
# GPT-2 124M and 350M at sequence 1024, in fp32 and bf16, each with the
# attention kernels of a warp per row and the tiled ones, against PyTorch on
# the same GPU (bench/train_baseline.py, fp32 and bf16 autocast) when this machine's
# PyTorch has CUDA; the training stall per checkpoint, asynchronous against
# --sync-save; then make bench-reshard, whose table gains tp-reshard
# --device cuda beside the CPU. Writes docs/BENCHMARKS.md (section
# bench-gpu) with the GPU, driver and CUDA version. Without a GPU it
# measures nothing and says so (exit 1).
#   BENCH_STEPS (default 12): steps per run; the first 2 are warm-up
#   BENCH_MICRO_BATCH (default 4): sequences per step
#   BENCH_MODELS (default "124M 350M"): the models, of 124M, 350M and tiny
#   (tp-train --model tiny's shape); the checkpoint stall is measured on the
#   first
#   BENCH_SEQ (default 1024): sequence length
#   (a tiny run: BENCH_MODELS=tiny BENCH_SEQ=32 BENCH_STEPS=3
#   BENCH_MICRO_BATCH=1, and bench-reshard's tiny settings)
#   Where it writes: scripts/bench-lib.sh.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
. scripts/bench-lib.sh
STEPS=${BENCH_STEPS:-12}
MB=${BENCH_MICRO_BATCH:-4}
MODELS=${BENCH_MODELS:-124M 350M}
SEQ=${BENCH_SEQ:-1024}
DIR="$SCRATCH_ROOT/gpu"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "bench-gpu: no GPU on this machine (nvidia-smi): nothing measured" >&2
    exit 1
fi
if ! "$BUILD/bin/tp-train" --model tiny --steps 1 --quiet --device cuda >/dev/null 2>&1; then
    echo "bench-gpu: tp-train --device cuda fails here (a build without CUDA?): nothing measured" >&2
    "$BUILD/bin/tp-train" --model tiny --steps 1 --quiet --device cuda >&2 || true
    exit 1
fi
GPU=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)
CUDA_VERSION=$( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | sed -n 's/.*release \([0-9.]*\).*/\1/p')
TORCH_CUDA=no
$PY -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null && TORCH_CUDA=yes
mkdir -p "$DIR"
RESULTS="$DIR/results.txt"
: >"$RESULTS"

# Median tokens/s and MFU of a tp-train log, warm-up steps left out.
log_rates() {
    $PY -c '
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])]
r = [x for x in r if "event" not in x][2:]
print(json.dumps({"tokens_per_s": statistics.median(x["tokens_per_s"] for x in r),
                  "mfu": statistics.median(x.get("mfu", 0) for x in r)}))' "$1"
}

# model NAME: tp-train's options for the model NAME, then PyTorch's shape
# (layers, dim, heads, vocabulary) after a "|".
model() {
    case $1 in
    124M) echo "--model gpt2-124m | 12 768 12 50304" ;;
    350M) echo "--model gpt2-124m --layers 24 --dim 1024 --heads 16 | 24 1024 16 50304" ;;
    tiny) echo "--model tiny | 2 64 4 256" ;;
    *) echo "bench-gpu: unknown model $1 in BENCH_MODELS (124M, 350M, tiny)" >&2; exit 1 ;;
    esac
}
for name in $MODELS; do
    spec=$(model "$name")
    args=${spec%%|*}
    # Each dtype with the attention kernels of a warp per row (TP_CUDA_ATTENTION=rows)
    # and the tiled ones (the default, kernels/cuda/attention_tiled.h).
    for variant in rows tiled; do
        for dtype in fp32 bf16; do
            TP_CUDA_ATTENTION=$variant "$BUILD/bin/tp-train" $args --seq "$SEQ" --micro-batch "$MB" --steps "$STEPS" \
                --device cuda --dtype $dtype --quiet --log "$DIR/$name-$dtype-$variant.jsonl"
            echo "train $name tp-train-$dtype-$variant $(log_rates "$DIR/$name-$dtype-$variant.jsonl")" >>"$RESULTS"
        done
    done
    if [ $TORCH_CUDA = yes ]; then
        set -- ${spec#*|}
        layers=$1 dim=$2 heads=$3 vocab=$4
        for dtype in fp32 bf16; do
            m=$($PY bench/train_baseline.py --layers $layers --dim $dim --heads $heads --vocab $vocab --seq "$SEQ" \
                --batch "$MB" --threads 1 --steps $((STEPS - 2)) --device cuda --dtype $dtype)
            echo "train $name torch-$dtype $m" >>"$RESULTS"
        done
    fi
done

# Checkpoints every 4 steps of 12 of the first model (GPT-2 124M): the stall per save.
set -- $MODELS
CKPT_NAME=$1
spec=$(model "$CKPT_NAME")
for mode in async sync; do
    rm -rf "$DIR/ckpt"
    flag=""
    [ $mode = sync ] && flag=--sync-save
    "$BUILD/bin/tp-train" ${spec%%|*} --seq "$SEQ" --micro-batch "$MB" --steps 12 --device cuda --quiet \
        --ckpt-dir "$DIR/ckpt" --ckpt-every 4 $flag --log "$DIR/ckpt.jsonl"
    m=$($PY -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "\"event\"" not in l]
print(json.dumps({"stall_ms_per_save": sum(x["ckpt_stall_ms"] for x in r) / 3, "total_ms": sum(x["ms"] for x in r)}))' \
        "$DIR/ckpt.jsonl")
    echo "checkpoint $mode $m" >>"$RESULTS"
done
rm -rf "$DIR/ckpt"

TABLE=$($PY - "$RESULTS" "$MB" "$CKPT_NAME" <<'PY'
import json, sys
rows, ckpt = [], {}
for line in open(sys.argv[1]):
    kind, a, b = line.split(" ", 2)
    if kind == "train":
        tool, value = b.split(" ", 1)
        rows.append((a, tool, json.loads(value)))
    else:
        ckpt[a] = json.loads(b)
out = ["| model | trainer | tokens/s (median) | MFU (bf16 peak) |", "| --- | --- | --- | --- |"]
for model, tool, m in rows:
    mfu = "%.1f%%" % (100 * m["mfu"]) if m.get("mfu") else "-"
    out.append("| GPT-2 %s | %s | %.0f | %s |" % (model, tool, m["tokens_per_s"], mfu))
out += ["", "| saving (GPT-2 %s) | stall per save | 12 steps, total | stall vs synchronous |" % sys.argv[3],
        "| --- | --- | --- | --- |"]
for mode in ("async", "sync"):
    m = ckpt[mode]
    out.append("| %s | %.1f ms | %.0f ms | %.1f%% |" % (mode, m["stall_ms_per_save"], m["total_ms"],
                                                       100 * m["stall_ms_per_save"] / ckpt["sync"]["stall_ms_per_save"]))
print("\n".join(out))
PY
)
echo "$TABLE"
doc_section bench-gpu "tp-train on a GPU" <<EOF
GPU: $GPU; CUDA $CUDA_VERSION. One process, tp1, micro-batch $MB x $SEQ tokens, fp32 and bf16 (tp-train
--dtype bf16: bf16 operands, fp32 sums; PyTorch: bf16 autocast); PyTorch with CUDA here: $TORCH_CUDA. MFU counts
6N + 12 L d T FLOPs per token against the GPU's dense bf16 peak.

$TABLE

Command: \`make bench-gpu\` (BENCH_STEPS=$STEPS, BENCH_MICRO_BATCH=$MB, BENCH_MODELS="$MODELS", BENCH_SEQ=$SEQ).
EOF
# BENCH_GPU_RESHARD=0: without it (gpu-check.sh runs it as a phase of its own).
[ "${BENCH_GPU_RESHARD:-1}" = 0 ] || BUILD=$BUILD scripts/bench-reshard.sh
