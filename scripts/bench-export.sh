#!/bin/sh
# make bench-export: the weights of a GPT checkpoint of about 0.5B parameters
# (fp32, tp4pp2, weights only: ~2 GB) exported to safetensors, GGUF and one
# HDF5 file, and the safetensors imported back at tp4pp2, side by side in one
# run with copying the same bytes (cp -r, the I/O limit) and a Python
# converter that loads the whole state dict (bench/export_baseline.py), cold
# and warm page cache. Writes docs/BENCHMARKS.md (section bench-export).
#   BENCH_PARAMS_B (default 0.5): model size in billions of parameters
#   BENCH_MEMORY (default 1G): --memory-limit of the exports
#   BENCH_REPS (default 3): repetitions; the table gives medians
#   BENCH_DIM, BENCH_VOCAB, and where it writes: scripts/bench-lib.sh (a tiny
#   run: BENCH_PARAMS_B=0 BENCH_DIM=64 BENCH_VOCAB=256, 2 layers)
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
PARAMS=${BENCH_PARAMS_B:-0.5}
MEMORY=${BENCH_MEMORY:-1G}
REPS=${BENCH_REPS:-3}
DIR="$SCRATCH_ROOT/export"
CKPT="$BUILD/bin/tp-ckpt"
mkdir -p "$DIR"

LAYERS=$(gpt_layers "$PARAMS")
MODEL="--layers $LAYERS --dim $DIM --heads 16 --vocab $VOCAB --seq 2048 --dtype fp32 --seed 1"
if ! same_shape "$DIR/src" "$LAYERS"; then
    rm -rf "$DIR/src"
    "$CKPT" synth -o "$DIR/src" --tp 4 --pp 2 $MODEL --progress
fi
BYTES=$(tensor_bytes "$DIR/src")

warm() { cat "$1"/*.* >/dev/null; }
clean_outputs() { rm -rf "$DIR/hf" "$DIR/model.gguf" "$DIR/model.h5" "$DIR/copy" "$DIR/py.safetensors" "$DIR/imported"; sync; }

# The safetensors the import reads, made once.
"$CKPT" export "$DIR/src" --format safetensors -o "$DIR/import-src" --force >/dev/null

RESULTS="$DIR/results.txt"
: >"$RESULTS"
for rep in $(seq 1 "$REPS"); do
    # The tools take turns going first, so that none always follows the same one.
    tools="safetensors gguf hdf5 cp python import"
    shift_by=$(( (rep - 1) % 6 ))
    order=$(echo $tools | tr ' ' '\n' | awk -v s="$shift_by" '{a[NR]=$0} END {for (i = 0; i < NR; i++) print a[(i + s) % NR + 1]}')
    for cache in cold warm; do
        for tool in $order; do
            clean_outputs
            source="$DIR/src"
            [ $tool = import ] && source="$DIR/import-src"
            if [ $cache = cold ]; then cold_cache "$DIR"; else warm "$source"; fi
            case $tool in
            safetensors|gguf|hdf5)
                out="$DIR/hf"
                [ $tool = gguf ] && out="$DIR/model.gguf"
                [ $tool = hdf5 ] && out="$DIR/model.h5"
                m=$(measure "$CKPT" export "$DIR/src" --format $tool -o "$out" --memory-limit "$MEMORY") ;;
            cp) m=$(measure sh -c "cp -r '$DIR/src' '$DIR/copy' && sync") ;;
            python) m=$(measure $PY bench/export_baseline.py "$DIR/src" "$DIR/py.safetensors") ;;
            import) m=$(measure "$CKPT" import "$DIR/import-src" -o "$DIR/imported" --tp 4 --pp 2) ;;
            esac
            echo "$cache $tool $m" >>"$RESULTS"
            echo "rep $rep $cache $tool: $m"
        done
    done
done
# Bounded memory: a tight limit for every format.
for tool in safetensors gguf; do
    clean_outputs
    cold_cache "$DIR"
    out="$DIR/hf"
    [ $tool = gguf ] && out="$DIR/model.gguf"
    m=$(measure "$CKPT" export "$DIR/src" --format $tool -o "$out" --memory-limit 128M)
    echo "cold $tool-128M $m" >>"$RESULTS"
    echo "cold $tool-128M: $m"
done
# What the benchmark wrote is right: the baseline's file equals the export,
# and the import equals its source.
clean_outputs
"$CKPT" export "$DIR/src" --format safetensors -o "$DIR/hf" >/dev/null
$PY bench/export_baseline.py "$DIR/src" "$DIR/py.safetensors"
cmp -s "$DIR/hf/model.safetensors" "$DIR/py.safetensors" && echo "baseline output equals the export (but its metadata)" ||
    $PY -c '
import json, struct, sys
a, b = (open(p, "rb").read() for p in sys.argv[1:3])
ha, hb = (json.loads(x[8:8 + struct.unpack("<Q", x[:8])[0]]) for x in (a, b))
ha.pop("__metadata__"); hb.pop("__metadata__")
da, db = a[8 + struct.unpack("<Q", a[:8])[0]:], b[8 + struct.unpack("<Q", b[:8])[0]:]
sys.exit(0 if ha == hb and da == db else "the baseline and the export differ")' "$DIR/hf/model.safetensors" "$DIR/py.safetensors"
"$CKPT" import "$DIR/hf" -o "$DIR/imported" --tp 4 --pp 2 >/dev/null
"$CKPT" diff "$DIR/imported" "$DIR/src" >/dev/null
clean_outputs

TABLE=$($PY bench/ratio_table.py "$RESULTS" "$BYTES" 2 "safetensors=export --format safetensors" \
    "gguf=export --format gguf" "hdf5=export --format hdf5" "cp=cp -r (same bytes)" "python=h5py+numpy converter" \
    "import=import (safetensors -> tp4pp2)" "safetensors-128M=export safetensors, --memory-limit 128M" \
    "gguf-128M=export gguf, --memory-limit 128M")
echo "$TABLE"
SIZE=$(size_text "$BYTES" 2)
doc_section bench-export "Export and import (bench-export)" <<DOC
Command: \`make bench-export\` (BENCH_PARAMS_B=$PARAMS, BENCH_MEMORY=$MEMORY, BENCH_REPS=$REPS).
Checkpoint: GPT, dim $DIM, $LAYERS layers, 16 heads, vocabulary $VOCAB, fp32 weights only, tp4pp2: $SIZE of
tensors. Exports merge it (Conv1D weights transposed for safetensors) and write the same number of bytes; the
import reads the safetensors export and writes tp4pp2. Each tool starts from a dropped page cache (cold) or a
source read just before (warm); its time includes making the output durable (fsync or \`sync\`). The tools take
turns going first; figures are medians over the runs, peak RSS the largest. GB/s counts the tensor bytes. The
Python converter holds the whole model in memory, as most converters do; its output is checked equal to the
export's, and the import equal to the checkpoint.

$TABLE
DOC
