#!/bin/sh
# make bench-reshard: tp8pp1 -> tp4pp2 of a GPT checkpoint of about 1B
# parameters with Adam state (bf16 weights, fp32 master and moments: ~15 GB),
# side by side in one run with copying the same files (cp -r, the I/O limit)
# and a straightforward h5py+numpy resharder (bench/reshard_baseline.py),
# cold and warm page cache. Writes docs/BENCHMARKS.md (section bench-reshard).
#   BENCH_PARAMS_B (default 1): model size in billions of parameters
#   BENCH_MEMORY (default 1G): tp-reshard --memory-limit
#   BENCH_REPS (default 3): repetitions; the table gives medians
#   BENCH_DIM, BENCH_VOCAB, and where it writes: scripts/bench-lib.sh (a tiny
#   run: BENCH_PARAMS_B=0 BENCH_DIM=64 BENCH_VOCAB=256, 2 layers)
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
PARAMS=${BENCH_PARAMS_B:-1}
MEMORY=${BENCH_MEMORY:-1G}
REPS=${BENCH_REPS:-3}
DIR="$SCRATCH_ROOT/reshard"
mkdir -p "$DIR"

LAYERS=$(gpt_layers "$PARAMS")
MODEL="--layers $LAYERS --dim $DIM --heads 16 --vocab $VOCAB --seq 2048 --optim --dtype bf16 --seed 1"
if ! same_shape "$DIR/src" "$LAYERS"; then
    rm -rf "$DIR/src"
    "$BUILD/bin/tp-ckpt" synth -o "$DIR/src" --tp 8 --pp 1 $MODEL --progress
fi
BYTES=$("$BUILD/bin/tp-ckpt" info "$DIR/src" --json | $PY -c 'import json,sys; print(sum(t["bytes"] for t in json.load(sys.stdin)["tensors"]))')

warm_source() { cat "$DIR"/src/*.h5 >/dev/null; }
clean_outputs() { rm -rf "$DIR/out" "$DIR/copy" "$DIR/py"; sync; }

RESULTS="$DIR/results.txt"
run_tool() {
    case $1 in
    reshard) measure "$BUILD/bin/tp-reshard" "$DIR/src" --from tp8pp1 --to tp4pp2 -o "$DIR/out" --memory-limit "$MEMORY" ;;
    cp) measure sh -c "cp -r '$DIR/src' '$DIR/copy' && sync" ;;
    python) measure sh -c "$PY bench/reshard_baseline.py '$DIR/src' '$DIR/py' 4 2 && sync" ;;
    esac
}
rounds "$REPS" "$RESULTS" "$DIR" reshard cp python
# Bounded memory at a quarter of the default limit.
clean_outputs
cold_cache "$DIR"
m=$(measure "$BUILD/bin/tp-reshard" "$DIR/src" --to tp4pp2 -o "$DIR/out" --memory-limit 256M)
echo "cold reshard-256M $m" >>"$RESULTS"
echo "cold reshard-256M: $m"
# The output the benchmark produced is right.
"$BUILD/bin/tp-reshard" "$DIR/src" --to tp4pp2 -o "$DIR/out" --force --memory-limit "$MEMORY" --verify >/dev/null
clean_outputs

GPU_NOTE="No GPU on this machine: the CUDA path was not measured."
if [ "$("$BUILD/bin/tp-reshard" "$DIR/src" --to tp4pp2 -o "$DIR/gpu" --dry-run --device cuda 2>/dev/null | grep -c cuda)" -gt 0 ]; then
    cold_cache "$DIR"
    m=$(measure "$BUILD/bin/tp-reshard" "$DIR/src" --to tp4pp2 -o "$DIR/gpu" --memory-limit "$MEMORY" --device cuda)
    echo "cold cuda $m" >>"$RESULTS"
    rm -rf "$DIR/gpu"
    GPU_NOTE="CUDA path measured: see the 'cuda' row."
fi

TABLE=$($PY bench/ratio_table.py "$RESULTS" "$BYTES" 1 "reshard=tp-reshard tp8pp1 -> tp4pp2" "cp=cp -r (same bytes)" \
    "python=h5py+numpy resharder" "cuda=tp-reshard --device cuda" "reshard-256M=tp-reshard --memory-limit 256M")
echo "$TABLE"
SIZE=$(size_text "$BYTES" 1)
doc_section bench-reshard "Resharding (bench-reshard)" <<DOC
Command: \`make bench-reshard\` (BENCH_PARAMS_B=$PARAMS, BENCH_MEMORY=$MEMORY, BENCH_REPS=$REPS).
Checkpoint: GPT, dim $DIM, $LAYERS layers, 16 heads, vocabulary $VOCAB, bf16 weights with fp32 master weights
and Adam moments, tp8pp1: $SIZE of tensors. Each tool starts from a dropped page cache (cold) or a source read
just before (warm); its time includes making the output durable (fsync or \`sync\`). The tools take turns going
first; figures are medians over the runs, peak RSS the largest. GB/s counts the tensor bytes. $GPU_NOTE
Targets: at least 0.9x \`cp\`, at least 3x the Python baseline, peak RSS within \`--memory-limit\`.

$TABLE
DOC
