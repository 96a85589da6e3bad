#!/bin/sh
# make bench-llama: Llama-family models, two measures side by side in one run.
# 1. Training throughput of tp-train --arch llama on CPU against the PyTorch
#    Llama the test suite checks it against (tests/trainer/llama_ref.py,
#    driven by bench/train_baseline.py), same shape, batch and threads, and
#    the GPT-2 of the same dimensions beside it (ours and PyTorch's).
# 2. Resharding a TinyLlama-1.1B-shaped checkpoint with Adam state (bf16
#    weights, fp32 master and moments) tp4 -> tp2pp2 against copying the same
#    files (cp -r), cold and warm page cache.
# Writes docs/BENCHMARKS.md (section bench-llama).
#   BENCH_STEPS (default 10): training steps per run; the first 2 are warm-up
#   BENCH_REPS (default 3): repetitions; the tables give medians
#   BENCH_LLAMA_SHAPE (default "--layers 6 --dim 512 --heads 8 --kv-heads 4
#   --ffn 1408 --vocab 256 --seq 256", about 18M parameters): the trained
#   Llama; the GPT-2 beside it has its layers, dim, heads, vocabulary and
#   sequence (a tiny run: llama-tiny's "--layers 2 --dim 64 --heads 4
#   --kv-heads 2 --ffn 128 --vocab 256 --seq 32")
#   BENCH_LLAMA_MODEL (default tinyllama-1.1b): the preset of the resharded
#   checkpoint (a tiny run: llama-tiny)
#   BENCH_MEMORY (default 1G): tp-reshard --memory-limit
#   Where it writes: scripts/bench-lib.sh.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
STEPS=${BENCH_STEPS:-10}
REPS=${BENCH_REPS:-3}
MEMORY=${BENCH_MEMORY:-1G}
PRESET=${BENCH_LLAMA_MODEL:-tinyllama-1.1b}
SHAPE=${BENCH_LLAMA_SHAPE:-"--layers 6 --dim 512 --heads 8 --kv-heads 4 --ffn 1408 --vocab 256 --seq 256"}
DIR="$SCRATCH_ROOT/llama"
BATCH=4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$DIR"

# shape_value OPTION: its value in SHAPE.
shape_value() { echo " $SHAPE " | sed -n "s/.* $1 \([^ ]*\) .*/\1/p"; }
# The GPT-2 of the same dimensions: no key/value grouping, its own MLP width (4 dim).
GPT_SHAPE="--layers $(shape_value --layers) --dim $(shape_value --dim) --heads $(shape_value --heads) \
--vocab $(shape_value --vocab) --seq $(shape_value --seq)"
LLAMA_ARGS="--arch llama $SHAPE --untied-embeddings"
TORCH_LLAMA="--arch llama $SHAPE --untied-embeddings"

STEP_LINES='[r for r in map(json.loads, open(sys.argv[1])) if "event" not in r and "ms" in r]'
median_ms() { $PY -c "import json,statistics,sys; print(statistics.median([r['ms'] for r in $STEP_LINES][2:]))" "$1"; }

ours() { # THREADS MODEL-ARGS...
    threads=$1
    shift
    "$BUILD/bin/tp-train" "$@" --micro-batch $BATCH --steps "$STEPS" --threads "$threads" --quiet --log "$DIR/log.jsonl"
    median_ms "$DIR/log.jsonl"
}

# PyTorch: element-wise work on OpenMP threads, matrix products on OpenBLAS
# threads; each split of the thread count is tried and the best kept.
theirs() { # THREADS MODEL-ARGS...
    threads=$1
    shift
    best=""
    for split in "$threads 1" "1 $threads" "$threads $threads"; do
        omp=${split% *} blas=${split#* }
        ms=$(OPENBLAS_NUM_THREADS=$blas OMP_NUM_THREADS=$omp $PY bench/train_baseline.py "$@" --batch $BATCH \
            --threads "$omp" --steps $((STEPS - 2)) | $PY -c 'import json,sys; print(json.load(sys.stdin)["ms"])')
        best=$($PY -c 'import sys; print(min(float(x) for x in sys.argv[1:] if x))' "$ms" $best)
        [ "$threads" = 1 ] && break
    done
    echo "$best"
}

TRAIN="$DIR/train.txt"
: >"$TRAIN"
THREADS="1"
[ "$(nproc)" -ge 2 ] && THREADS="1 2"
for rep in $(seq 1 "$REPS"); do
    for t in $THREADS; do
        order="llama-ours llama-torch gpt-ours gpt-torch"
        [ $((rep % 2)) = 0 ] && order="gpt-torch gpt-ours llama-torch llama-ours"
        for run in $order; do
            # shellcheck disable=SC2086
            case $run in
            llama-ours) ms=$(ours "$t" $LLAMA_ARGS) ;;
            llama-torch) ms=$(theirs "$t" $TORCH_LLAMA) ;;
            gpt-ours) ms=$(ours "$t" $GPT_SHAPE) ;;
            gpt-torch) ms=$(theirs "$t" $GPT_SHAPE) ;;
            esac
            echo "$t $run $ms" >>"$TRAIN"
            echo "rep $rep, $t thread(s), $run: $ms ms/step"
        done
    done
done
# The parameter counts the table names.
PARAMS=$("$BUILD/bin/tp-ckpt" synth -o "$DIR/shape-llama" --tp 1 --pp 1 $LLAMA_ARGS --force | sed -n 's/.*tensors.*, \([0-9.]* [KMG]iB\).*/\1/p')
rm -rf "$DIR/shape-llama"
TRAIN_TABLE=$($PY - "$TRAIN" "$BATCH" "$(shape_value --seq)" <<'PY'
import statistics, sys
tokens = int(sys.argv[2]) * int(sys.argv[3])
runs = {}
for line in open(sys.argv[1]):
    threads, run, ms = line.split()
    runs.setdefault((int(threads), run), []).append(float(ms))
out = ["| threads | model | tp-train ms/step | tokens/s | PyTorch ms/step | tokens/s | tp-train vs PyTorch |",
       "| --- | --- | --- | --- | --- | --- | --- |"]
for threads in sorted({t for t, _ in runs}):
    for arch, name in (("llama", "Llama"), ("gpt", "GPT-2, same dimensions")):
        ours = statistics.median(runs[(threads, arch + "-ours")])
        theirs = statistics.median(runs[(threads, arch + "-torch")])
        out.append("| %d | %s | %.1f | %.0f | %.1f | %.0f | %.2fx |" % (
            threads, name, ours, tokens / ours * 1e3, theirs, tokens / theirs * 1e3, theirs / ours))
print("\n".join(out))
PY
)
echo "$TRAIN_TABLE"

# --- Resharding a TinyLlama-shaped checkpoint with Adam state, tp4 -> tp2pp2.
MODEL="--model $PRESET --optim --dtype bf16 --seed 1"
# An earlier run's source of the same preset is kept.
if [ "$(cat "$DIR/src.preset" 2>/dev/null)" != "$PRESET" ]; then
    rm -rf "$DIR/src" "$DIR/src.preset"
    "$BUILD/bin/tp-ckpt" synth -o "$DIR/src" --tp 4 --pp 1 $MODEL --progress
    echo "$PRESET" >"$DIR/src.preset"
fi
BYTES=$(tensor_bytes "$DIR/src")
warm_source() { cat "$DIR"/src/*.h5 >/dev/null; }
clean_outputs() { rm -rf "$DIR/out" "$DIR/copy"; sync; }
run_tool() {
    case $1 in
    reshard) measure "$BUILD/bin/tp-reshard" "$DIR/src" --to tp2pp2 -o "$DIR/out" --memory-limit "$MEMORY" ;;
    cp) measure sh -c "cp -r '$DIR/src' '$DIR/copy' && sync" ;;
    esac
}
RESULTS="$DIR/reshard.txt"
rounds "$REPS" "$RESULTS" "$DIR" reshard cp
# The output the benchmark produced is right.
"$BUILD/bin/tp-reshard" "$DIR/src" --to tp2pp2 -o "$DIR/out" --force --memory-limit "$MEMORY" --verify >/dev/null
clean_outputs
RESHARD_TABLE=$($PY bench/ratio_table.py "$RESULTS" "$BYTES" 1 "reshard=tp-reshard tp4 -> tp2pp2" "cp=cp -r (same bytes)")
echo "$RESHARD_TABLE"
SIZE=$(size_text "$BYTES" 1)

doc_section bench-llama "Llama: training and resharding (bench-llama)" <<DOC
Command: \`make bench-llama\` (BENCH_STEPS=$STEPS, BENCH_REPS=$REPS, BENCH_LLAMA_MODEL=$PRESET, BENCH_MEMORY=$MEMORY).

Training: a Llama of $(shape_value --layers) layers, dim $(shape_value --dim), $(shape_value --heads) heads and \
$(shape_value --kv-heads) key/value heads, SwiGLU width $(shape_value --ffn), vocabulary $(shape_value --vocab), untied \
output ($PARAMS of fp32 parameters), sequence $(shape_value --seq), $BATCH sequences per step, fp32, AdamW with
clipping; PyTorch is the Llama of tests/trainer/llama_ref.py (the model tp-train is checked against; its q/k/v and
gate/up products fused as ours are) on the same shape, batch and threads, each split of its threads between OpenMP and
OpenBLAS tried and the best kept. Beside it, the GPT-2 of the same layers, dim, heads, vocabulary and sequence (MLP
width 4 dim). Each run's first 2 steps are warm-up; figures are medians. $(openblas_kernel), for both trainers. Target: at least PyTorch's throughput.

$TRAIN_TABLE

Resharding: \`tp-ckpt synth --model $PRESET --optim --dtype bf16\` at tp4 ($SIZE of tensors: bf16 weights, fp32
master weights and Adam moments) to tp2pp2, against \`cp -r\` of the same files; cold (page cache dropped) and warm
(source read just before); times include making the output durable. Target: at least 0.9x \`cp\`.

$RESHARD_TABLE
DOC
