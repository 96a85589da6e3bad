#!/bin/sh
# make bench-dcp: PyTorch distributed checkpoints (docs/DCP.md) of about 1B
# parameters with Adam state (fp32 weights and moments), chunked on two axes
# as tensor parallelism with FSDP writes them (tp4, each piece cut again over
# 2 data-parallel ranks: --dcp-dp 2), converted side by side in one run with
# copying the same files (cp -r) and PyTorch's own route (load every entry
# whole, save it again: bench/dcp_reshard_baseline.py), cold and warm page
# cache:
#   dcp2dcp  the DCP checkpoint -> DCP tp2pp2 (every chunk boundary moves)
#   dcp2tp   the DCP checkpoint -> this toolkit's format tp8
#   tp2dcp   this toolkit's tp8 -> DCP tp4 x dp2 (what the source was made by)
# Writes docs/BENCHMARKS.md (section bench-dcp).
#   BENCH_PARAMS_B (default 1): model size in billions of parameters
#   BENCH_REPS (default 3): repetitions; the table gives medians
#   BENCH_MEMORY (default 1G): tp-reshard's --memory-limit
#   BENCH_TORCH (default 1): run PyTorch's route (it holds the whole
#   checkpoint in memory); 0 leaves it out
#   BENCH_DIM, BENCH_VOCAB, and where it writes: scripts/bench-lib.sh (a tiny
#   run: BENCH_PARAMS_B=0 BENCH_DIM=64 BENCH_VOCAB=256, 2 layers)
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
PARAMS=${BENCH_PARAMS_B:-1}
REPS=${BENCH_REPS:-3}
MEMORY=${BENCH_MEMORY:-1G}
TORCH=${BENCH_TORCH:-1}
DIR="$SCRATCH_ROOT/dcp"
mkdir -p "$DIR"
RS="$BUILD/bin/tp-reshard"
if ! $PY -c 'import torch' 2>/dev/null; then TORCH=0; fi
# The class paths of the PyTorch at hand, so that its route reads the source.
DIALECT=$($PY -c 'import torch.distributed.checkpoint' 2>/dev/null && echo 2 || echo 1.13)
[ "$TORCH" = 1 ] || DIALECT=2

LAYERS=$(gpt_layers "$PARAMS")
if ! same_shape "$DIR/src.tp" "$LAYERS"; then
    rm -rf "$DIR/src.tp" "$DIR/src.dcp" "$DIR/src.dcp.torch"
    "$BUILD/bin/tp-ckpt" synth -o "$DIR/src.tp" --tp 8 --pp 1 --layers "$LAYERS" --dim "$DIM" --heads 16 \
        --vocab "$VOCAB" --seq 1024 --optim >/dev/null
fi
if [ "$(cat "$DIR/src.dcp.torch" 2>/dev/null)" != "$DIALECT" ] || [ ! -f "$DIR/src.dcp/.metadata" ]; then
    rm -rf "$DIR/src.dcp"
    "$RS" "$DIR/src.tp" --format dcp --dcp-torch "$DIALECT" --to tp4 --dcp-dp 2 -o "$DIR/src.dcp" >/dev/null
    echo "$DIALECT" >"$DIR/src.dcp.torch"
fi
BYTES=$(du -sb "$DIR/src.dcp" | cut -f1)
CHUNKS=$("$RS" "$DIR/src.tp" --format dcp --to tp4 --dcp-dp 2 -o "$DIR/plan" --dry-run --json |
    $PY -c 'import json, sys; print(json.load(sys.stdin)["chunks"])')

warm_source() { find "$DIR/src.dcp" "$DIR/src.tp" -type f -exec cat {} + >/dev/null; }
clean_outputs() { rm -rf "$DIR/out" "$DIR/copy" "$DIR/py"; sync; }

RESULTS="$DIR/results.txt"
run_tool() {
    case $1 in
    dcp2dcp) measure "$RS" "$DIR/src.dcp" --to tp2pp2 --memory-limit "$MEMORY" -o "$DIR/out" ;;
    dcp2tp) measure "$RS" "$DIR/src.dcp" --format tp --to tp8 --memory-limit "$MEMORY" -o "$DIR/out" ;;
    tp2dcp) measure "$RS" "$DIR/src.tp" --format dcp --dcp-torch "$DIALECT" --to tp4 --dcp-dp 2 --memory-limit "$MEMORY" \
        -o "$DIR/out" ;;
    cp) measure sh -c "cp -r '$DIR/src.dcp' '$DIR/copy' && sync" ;;
    python) measure sh -c "$PY bench/dcp_reshard_baseline.py '$DIR/src.dcp' '$DIR/py' && sync" ;;
    esac
}
TOOLS="dcp2dcp dcp2tp tp2dcp cp"
[ "$TORCH" = 1 ] && TOOLS="$TOOLS python"
rounds "$REPS" "$RESULTS" "$DIR" $TOOLS
# The outputs are right: each proved equal to its source by digests, and
# PyTorch's equal to ours.
clean_outputs
"$RS" "$DIR/src.dcp" --to tp2pp2 -o "$DIR/out" --verify >/dev/null
if [ "$TORCH" = 1 ]; then
    $PY bench/dcp_reshard_baseline.py "$DIR/src.dcp" "$DIR/py"
    "$BUILD/bin/tp-ckpt" diff "$DIR/out" "$DIR/py" >/dev/null
fi
clean_outputs
"$RS" "$DIR/src.dcp" --format tp --to tp8 -o "$DIR/out" --verify >/dev/null
clean_outputs
"$RS" "$DIR/src.tp" --format dcp --to tp4 --dcp-dp 2 -o "$DIR/out" --verify >/dev/null
clean_outputs

TABLE=$($PY bench/ratio_table.py "$RESULTS" "$BYTES" 1 "dcp2dcp=tp-reshard DCP -> DCP tp2pp2" \
    "dcp2tp=tp-reshard DCP -> tp8 (this toolkit's)" "tp2dcp=tp-reshard tp8 -> DCP tp4 x dp2" \
    "cp=cp -r (same bytes)" "python=PyTorch: load whole, save")
echo "$TABLE"
SIZE=$(size_text "$BYTES" 2)
TORCH_VERSION=$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "none")
SECTION=bench-dcp TITLE="PyTorch distributed checkpoints (bench-dcp)"
if [ "$PARAMS" != 1 ] && [ "$PARAMS" != 0 ]; then SECTION="$SECTION-${PARAMS}b" TITLE="$TITLE, BENCH_PARAMS_B=$PARAMS"; fi
doc_section "$SECTION" "$TITLE" <<DOC
Command: \`make bench-dcp\` (BENCH_PARAMS_B=$PARAMS, BENCH_MEMORY=$MEMORY, BENCH_REPS=$REPS, BENCH_TORCH=$TORCH).
Checkpoint: \`tp-ckpt synth\` GPT (dim $DIM, $LAYERS layers, 16 heads, vocabulary $VOCAB, fp32, Adam moments) at
tp8, written as DCP by tp-reshard at tp4 with every piece cut again over 2 data-parallel ranks (\`--dcp-dp 2\`, as
FSDP with tensor parallelism writes): $SIZE in 8 data files, $CHUNKS chunks, the row-parallel weights cut along two
axes. The tools: tp-reshard DCP -> DCP tp2pp2 (no chunk boundary stays), DCP -> this toolkit's tp8, tp8 -> DCP
tp4 x dp2; \`cp -r\` of the DCP checkpoint; PyTorch $TORCH_VERSION's own route (bench/dcp_reshard_baseline.py: every
entry loaded whole with its distributed checkpoint, saved again). Each tool starts from a dropped page cache (cold)
or a source read just before (warm); its time includes making the output durable. The tools take turns going first;
figures are medians, peak RSS the largest. The outputs are checked after: ours by --verify, PyTorch's equal to ours
(tp-ckpt diff).
Targets (issue 26): at least 0.9x \`cp\`; memory within \`--memory-limit\` where PyTorch's route holds the whole
checkpoint.

$TABLE
DOC
