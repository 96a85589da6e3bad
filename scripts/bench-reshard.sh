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
#   BENCH_CASE=issue28: instead, issue 28's case (docs/BENCHMARKS.md, "Resharding
#   (bench-reshard)"): the GPT in fp32 with Adam state (BENCH_PARAMS_B=0.15
#   BENCH_DIM=1024: 12 layers, 2.46 GB), tp8 -> tp4pp2 within BENCH_MEMORY
#   against cp -r + sync, BENCH_REPS rounds (default 5) cold and warm, medians
#   and ranges, into section bench-reshard-issue28; BENCH_BEFORE=DIR adds the
#   tp-reshard of DIR (an earlier build's bin/) to the same rounds
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
PARAMS=${BENCH_PARAMS_B:-1}
MEMORY=${BENCH_MEMORY:-1G}
REPS=${BENCH_REPS:-3}
DIR="$SCRATCH_ROOT/reshard"
mkdir -p "$DIR"

if [ "${BENCH_CASE:-}" = issue28 ]; then
    REPS=${BENCH_REPS:-5}
    DIR="$SCRATCH_ROOT/reshard-issue28"
    mkdir -p "$DIR"
    LAYERS=$(gpt_layers "$PARAMS")
    MODEL="--layers $LAYERS --dim $DIM --heads 16 --vocab $VOCAB --seq 2048 --optim"
    # This directory holds only this case's checkpoint: kept when of the same shape.
    if ! same_shape "$DIR/src" "$LAYERS"; then
        rm -rf "$DIR/src"
        "$BUILD/bin/tp-ckpt" synth -o "$DIR/src" --tp 8 --pp 1 $MODEL
    fi
    BYTES=$(tensor_bytes "$DIR/src")
    warm_source() { cat "$DIR"/src/*.h5 >/dev/null; }
    clean_outputs() { rm -rf "$DIR/out" "$DIR/copy"; sync; }
    run_tool() {
        case $1 in
        after) measure "$BUILD/bin/tp-reshard" "$DIR/src" --to tp4pp2 -o "$DIR/out" --memory-limit "$MEMORY" ;;
        before) measure "$BENCH_BEFORE/tp-reshard" "$DIR/src" --to tp4pp2 -o "$DIR/out" --memory-limit "$MEMORY" ;;
        cp) measure sh -c "cp -r '$DIR/src' '$DIR/copy' && sync" ;;
        esac
    }
    RESULTS="$DIR/results.txt"
    if [ -n "${BENCH_BEFORE:-}" ]; then rounds "$REPS" "$RESULTS" "$DIR" before after cp
    else rounds "$REPS" "$RESULTS" "$DIR" after cp; fi
    clean_outputs
    TABLE=$($PY - "$RESULTS" "$BYTES" <<'PYEOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    cache, tool, m = line.split(" ", 2)
    m = json.loads(m)
    if m["status"] != 0: # a failure's seconds are no result
        sys.exit("bench-reshard: %s (%s cache) failed with status %s" % (tool, cache, m["status"]))
    runs.setdefault((cache, tool), []).append(m)
size = int(sys.argv[2])
label = {"before": "tp-reshard before", "after": "tp-reshard", "cp": "cp -r + sync"}
print("| cache | tool | runs | seconds: median (range) | GB/s | peak RSS | vs cp (medians) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for cache in ("cold", "warm"):
    cp = statistics.median(m["seconds"] for m in runs[(cache, "cp")])
    for tool in ("before", "after", "cp"):
        ms = runs.get((cache, tool))
        if not ms:
            continue
        s = [m["seconds"] for m in ms]
        med = statistics.median(s)
        print("| %s | %s | %d | %.2f (%.2f-%.2f) | %.2f | %.0f MiB | %.2fx |" % (
            cache, label[tool], len(s), med, min(s), max(s), size / med / 1e9,
            max(m["max_rss_bytes"] for m in ms) / 2**20, cp / med))
PYEOF
)
    echo "$TABLE"
    SIZE=$(size_text "$BYTES" 2)
    BEFORE_NOTE=" \"tp-reshard\" is this checkout's ($(git rev-parse --short HEAD 2>/dev/null || echo "no git"))."
    if [ -n "${BENCH_BEFORE:-}" ]; then
        # Named by its revision where it was built in a git checkout (no local paths in the document).
        REV=$(git -C "$BENCH_BEFORE" rev-parse --short HEAD 2>/dev/null || echo "an earlier build")
        BEFORE_NOTE="$BEFORE_NOTE \"tp-reshard before\" is the tp-reshard of $REV, in the same rounds."
    fi
    doc_section bench-reshard-issue28 "Resharding, issue 28's case" <<DOC
Command: \`BENCH_CASE=issue28 make bench-reshard\` (BENCH_PARAMS_B=$PARAMS, BENCH_DIM=$DIM, BENCH_MEMORY=$MEMORY,
BENCH_REPS=$REPS). Checkpoint: \`tp-ckpt synth --tp 8 $MODEL\`, fp32 weights and Adam moments: $SIZE of tensors.
\`tp-reshard SRC --to tp4pp2 -o OUT --memory-limit $MEMORY\` against \`cp -r SRC COPY && sync\`; outputs removed (and
synced) before every run, the tools taking turns going first, each round cold (page cache dropped, a pause) then warm
(the source read just before).$BEFORE_NOTE

$TABLE
DOC
    exit 0
fi

LAYERS=$(gpt_layers "$PARAMS")
MODEL="--layers $LAYERS --dim $DIM --heads 16 --vocab $VOCAB --seq 2048 --optim --dtype bf16 --seed 1"
if ! same_shape "$DIR/src" "$LAYERS"; then
    rm -rf "$DIR/src"
    "$BUILD/bin/tp-ckpt" synth -o "$DIR/src" --tp 8 --pp 1 $MODEL --progress
fi
BYTES=$(tensor_bytes "$DIR/src")

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
