#!/bin/sh
# make bench-megatron: Megatron-LM tp8 -> tp4 of a legacy checkpoint of about
# 1B parameters (bf16 weights, written by PyTorch in Megatron's structure by
# tests/support/megatron_fixture.py), side by side in one run with copying
# the same files (cp -r) and the Python route users run today
# (bench/megatron_reshard_baseline.py: torch.load, torch.cat/chunk,
# torch.save), cold and warm page cache. Writes docs/BENCHMARKS.md (section
# bench-megatron).
#   BENCH_PARAMS_B (default 1): model size in billions of parameters
#   BENCH_OPTIM (default 1): the rank files hold the optimizer state (Adam
#   moments, fp32 masters: 7x the bf16 weights' bytes); 0: weights only
#   BENCH_REPS (default 3): repetitions; the table gives medians
#   BENCH_DIM, BENCH_VOCAB, and where it writes: scripts/bench-lib.sh (a tiny
#   run: BENCH_PARAMS_B=0 BENCH_DIM=64 BENCH_VOCAB=256, 2 layers)
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
PARAMS=${BENCH_PARAMS_B:-1}
REPS=${BENCH_REPS:-3}
OPTIM=${BENCH_OPTIM:-1}
DIR="$SCRATCH_ROOT/megatron"
mkdir -p "$DIR"

LAYERS=$(gpt_layers "$PARAMS")
SHAPE="--tp 8 --pp 1 --layers $LAYERS --hidden $DIM --heads 16 --ffn $((4 * DIM)) --vocab $VOCAB --dtype bf16 --seed 1"
if [ "$OPTIM" = 1 ]; then
    SHAPE="$SHAPE --optimizer"
    CONTENT="weights and the non-distributed optimizer's state (Adam moments and fp32 masters, resharded with the weights)"
else
    CONTENT="weights only"
fi
if [ "$(cat "$DIR/src.shape" 2>/dev/null)" != "$SHAPE" ]; then
    rm -rf "$DIR/src" "$DIR/src.shape"
    $PY tests/support/megatron_fixture.py "$DIR/src" $SHAPE >/dev/null
    echo "$SHAPE" >"$DIR/src.shape"
fi
BYTES=$(du -sb "$DIR/src" | cut -f1)

warm_source() { find "$DIR/src" -type f -exec cat {} + >/dev/null; }
clean_outputs() { rm -rf "$DIR/out" "$DIR/copy" "$DIR/py"; sync; }

RESULTS="$DIR/results.txt"
run_tool() {
    case $1 in
    reshard) measure "$BUILD/bin/tp-reshard" "$DIR/src" --from tp8 --to tp4 -o "$DIR/out" ;;
    cp) measure sh -c "cp -r '$DIR/src' '$DIR/copy' && sync" ;;
    python) measure sh -c "$PY bench/megatron_reshard_baseline.py '$DIR/src' '$DIR/py' 4 && sync" ;;
    esac
}
rounds "$REPS" "$RESULTS" "$DIR" reshard cp python
# The outputs the benchmark produced are right: ours by digests against the
# source, the baseline's by the same tool's diff against ours.
clean_outputs
"$BUILD/bin/tp-reshard" "$DIR/src" --to tp4 -o "$DIR/out" --verify >/dev/null
$PY bench/megatron_reshard_baseline.py "$DIR/src" "$DIR/py" 4
"$BUILD/bin/tp-ckpt" diff "$DIR/out" "$DIR/py" >/dev/null
clean_outputs

TABLE=$($PY bench/ratio_table.py "$RESULTS" "$BYTES" 1 "reshard=tp-reshard tp8 -> tp4 (Megatron out)" \
    "cp=cp -r (same bytes)" "python=torch.load / cat / chunk / torch.save")
echo "$TABLE"
SIZE=$(size_text "$BYTES" 2)
# Weights only and with the optimizer state are sections of their own.
if [ "$OPTIM" = 1 ]; then SECTION=bench-megatron TITLE="Megatron-LM resharding with optimizer state (bench-megatron)"
else SECTION=bench-megatron-weights TITLE="Megatron-LM resharding, weights only (bench-megatron, BENCH_OPTIM=0)"; fi
# Another size than the issue's 1B is a section of its own (a checkpoint
# whose source and output fit the page cache together, or not); the tiny
# run of the tests (0) writes the usual one into the tests' document.
if [ "$PARAMS" != 1 ] && [ "$PARAMS" != 0 ]; then SECTION="$SECTION-${PARAMS}b" TITLE="$TITLE, BENCH_PARAMS_B=$PARAMS"; fi
doc_section "$SECTION" "$TITLE" <<DOC
Command: \`make bench-megatron\` (BENCH_PARAMS_B=$PARAMS, BENCH_OPTIM=$OPTIM, BENCH_REPS=$REPS).
Checkpoint: a Megatron-LM legacy checkpoint written by PyTorch (tests/support/megatron_fixture.py: GPT, hidden
$DIM, $LAYERS layers, 16 heads, ffn $((4 * DIM)), vocabulary $VOCAB, bf16, legacy names), tp8: $SIZE of rank
files, $CONTENT. tp-reshard writes Megatron-LM
tp4 rank files; the Python baseline (bench/megatron_reshard_baseline.py) does what users do by hand. Each tool
starts from a dropped page cache (cold) or a source read just before (warm); its time includes making the output
durable (fsync or \`sync\`). The tools take turns going first; figures are medians, peak RSS the largest. The
outputs are checked after: ours by --verify, the baseline's equal to ours (tp-ckpt diff).
Targets (issue): at least 0.9x \`cp\`, at least 5x the Python route, memory within \`--memory-limit\` (default
1 GiB; the Megatron writer streams each piece through a 256 KiB block per thread).

$TABLE
DOC
