#!/bin/sh
# make bench-train: training throughput of tp-train on CPU against the PyTorch
# GPT-2 the test suite checks it against (tests/trainer/gpt2_ref.py, driven by
# bench/train_baseline.py), same model, batch and thread count, side by side
# in one run; and the training stall per checkpoint, asynchronous against
# --sync-save. Writes docs/BENCHMARKS.md (section bench-train).
#   BENCH_STEPS (default 10): steps per run; the first 2 are warm-up, not counted
#   BENCH_REPS (default 3): repetitions; the table gives medians
#   BENCH_SHAPE (default "--layers 6 --dim 384 --heads 6 --vocab 256 --seq 256",
#   the shape of tp-train --model small): the model, as both trainers take it
#   (a tiny run: tp-train --model tiny's "--layers 2 --dim 64 --heads 4
#   --vocab 256 --seq 32", BENCH_STEPS=3, BENCH_REPS=1)
#   BENCH_DTYPE (default fp32): bf16 trains tp-train --dtype bf16 against
#   PyTorch under bf16 autocast, with a row more for tp-train's bf16 products
#   emulated with sgemm (TP_NO_ONEDNN=1), into its own section
#   (bench-train-bf16), with no checkpoint rows
#   BENCH_PEAK_SIZE (default 2048): the square products whose best rate is
#   the peak of the "CPU MFU" column (bench/product_peak)
#   Where it writes: scripts/bench-lib.sh.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
STEPS=${BENCH_STEPS:-10}
REPS=${BENCH_REPS:-3}
DTYPE=${BENCH_DTYPE:-fp32}
case $DTYPE in fp32 | bf16) ;; *) echo "bench-train: BENCH_DTYPE is fp32 or bf16, not $DTYPE" >&2; exit 2 ;; esac
DIR="$SCRATCH_ROOT/train"
CORES=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$DIR"

# The model: GPT-2's architecture at 6 layers, dim 384, 6 heads, sequence 256,
# byte vocabulary (tp-train --model small); 4 sequences per step.
SMALL="--layers 6 --dim 384 --heads 6 --vocab 256 --seq 256"
SHAPE=${BENCH_SHAPE:-$SMALL}
BATCH=4
# shape_value OPTION: its value in SHAPE.
shape_value() { echo " $SHAPE " | sed -n "s/.* $1 \([^ ]*\) .*/\1/p"; }
RESULTS="$DIR/results.txt"
: >"$RESULTS"

# Python: the step lines of the tp-train log sys.argv[1]. The log also has
# event lines (start, save, stop: an "event" key), which have no step time.
STEP_LINES='[r for r in map(json.loads, open(sys.argv[1])) if "event" not in r and "ms" in r]'

# Median milliseconds per step of a tp-train log, warm-up steps left out.
median_ms() { $PY -c "import json,statistics,sys; print(statistics.median([r['ms'] for r in $STEP_LINES][2:]))" "$1"; }

tp_train() { # THREADS RANKS
    if [ "$2" -eq 1 ]; then
        "$BUILD/bin/tp-train" $SHAPE --micro-batch $BATCH --steps "$STEPS" --threads "$1" --dtype "$DTYPE" --quiet \
            --log "$DIR/log.jsonl"
    else
        mpirun --oversubscribe -np "$2" "$BUILD/bin/tp-train" $SHAPE --tp "$2" --micro-batch $BATCH --steps "$STEPS" \
            --threads "$1" --dtype "$DTYPE" --quiet --log "$DIR/log.jsonl" </dev/null
    fi
    median_ms "$DIR/log.jsonl"
}

# PyTorch runs element-wise work on OpenMP threads and matrix products on
# OpenBLAS threads: each split of the thread count is tried, the best kept.
torch_best() { # THREADS
    best=""
    for split in "$1 1" "1 $1" "$1 $1"; do
        set -- $split
        ms=$(OPENBLAS_NUM_THREADS=$2 OMP_NUM_THREADS=$1 $PY bench/train_baseline.py $SHAPE --batch $BATCH \
            --threads "$1" --steps $((STEPS - 2)) --dtype "$DTYPE" | $PY -c 'import json,sys; print(json.load(sys.stdin)["ms"])')
        echo "  torch (OpenMP $1, OpenBLAS $2): $ms ms" >&2
        best=$($PY -c 'import sys; a = sys.argv[1:]; print(min(float(x) for x in a if x))' "$ms" $best)
        [ "$1" = 1 ] && [ "$2" = 1 ] && break
    done
    echo "$best"
}

THREADS="1"
[ "$CORES" -ge 2 ] && THREADS="1 2"
# The peak of the products at each thread count: sgemm's for fp32, oneDNN's
# bf16 matmul's for bf16 (the denominators of the CPU MFU column).
for t in $THREADS; do
    peak=$("$BUILD/bench/product_peak" "$t" "${BENCH_PEAK_SIZE:-2048}")
    echo "peak $t $peak" >>"$RESULTS"
    echo "peak of the products at $t thread(s): $peak"
done
for rep in $(seq 1 "$REPS"); do
    for t in $THREADS; do
        # Take turns going first.
        if [ $((rep % 2)) = 1 ]; then order="ours torch"; else order="torch ours"; fi
        for tool in $order; do
            if [ $tool = ours ]; then ms=$(tp_train "$t" 1); else ms=$(torch_best "$t"); fi
            echo "throughput $t $tool $ms" >>"$RESULTS"
            echo "rep $rep, $t thread(s), $tool: $ms ms/step"
        done
        if [ "$DTYPE" = bf16 ]; then
            ms=$(TP_NO_ONEDNN=1 tp_train "$t" 1)
            echo "throughput $t ours-emulated $ms" >>"$RESULTS"
            echo "rep $rep, $t thread(s), tp-train with emulated bf16 products: $ms ms/step"
        fi
        if [ "$t" -gt 1 ]; then
            ms=$(tp_train 1 "$t")
            echo "throughput $t ours-tp $ms" >>"$RESULTS"
            echo "rep $rep, $t thread(s), tp-train --tp $t: $ms ms/step"
        fi
    done
    # Checkpoints every 4 steps of 12, asynchronous and synchronous: the stall per save.
    [ "$DTYPE" = fp32 ] || continue
    for mode in async sync; do
        rm -rf "$DIR/ckpt"
        flag=""
        [ $mode = sync ] && flag=--sync-save
        "$BUILD/bin/tp-train" $SHAPE --micro-batch $BATCH --steps 12 --threads "$CORES" --quiet --ckpt-dir "$DIR/ckpt" \
            --ckpt-every 4 $flag --log "$DIR/ckpt.jsonl"
        m=$($PY -c "import json, sys; r = $STEP_LINES"'
print(json.dumps({"stall_ms_per_save": sum(x["ckpt_stall_ms"] for x in r) / 3, "total_ms": sum(x["ms"] for x in r)}))' \
            "$DIR/ckpt.jsonl")
        echo "checkpoint $mode $m" >>"$RESULTS"
        echo "rep $rep, checkpoints $mode: $m"
    done
done
if [ "$DTYPE" = fp32 ]; then
    "$BUILD/bin/tp-ckpt" verify "$DIR/ckpt" >/dev/null
    SAVE_MB=$(du -sm "$DIR/ckpt/step_00000012" | cut -f1)
    rm -rf "$DIR/ckpt"
fi

TABLE=$($PY - "$RESULTS" "$BATCH" "$(shape_value --seq)" "$(shape_value --layers)" "$(shape_value --dim)" \
    "$(shape_value --vocab)" "$DTYPE" "${BENCH_PEAK_SIZE:-2048}" <<'PY'
import json, statistics, sys
batch, seq, layers, dim, vocab = (int(x) for x in sys.argv[2:7])
dtype = sys.argv[7]
tokens = batch * seq
# The products of a step (forward and backward, 3x the forward's): the
# layers' 12 D^2 and the head's D V per token, and the causal attention's
# two products of T^2/2 x D per layer and sequence.
flops = 6 * tokens * (12 * layers * dim * dim + dim * vocab) + 6 * layers * batch * seq * seq * dim
through, ckpt, peak = {}, {}, {}
for line in open(sys.argv[1]):
    kind, a, b = line.split(" ", 2)
    if kind == "throughput":
        tool, ms = b.split()
        through.setdefault((int(a), tool), []).append(float(ms))
    elif kind == "peak":
        p = json.loads(b)
        peak[int(a)] = p["bf16_gflops"] if dtype == "bf16" and p["bf16_gflops"] > 0 else p["sgemm_gflops"]
    else:
        ckpt.setdefault(a, []).append(json.loads(b))
out = ["| threads | trainer | ms/step (median) | tokens/s | vs PyTorch | GFLOP/s | CPU MFU |",
       "| --- | --- | --- | --- | --- | --- | --- |"]
names = {"ours": "tp-train (1 process)", "ours-tp": "tp-train --tp %d (%d processes x 1 thread)",
         "torch": "PyTorch (best thread split)",
         "ours-emulated": "tp-train, bf16 products emulated with sgemm (TP_NO_ONEDNN=1)"}
for (threads, tool), values in sorted(through.items()):
    ms, torch = statistics.median(values), statistics.median(through[(threads, "torch")])
    name = names[tool] % (threads, threads) if tool == "ours-tp" else names[tool]
    rate = flops / ms / 1e6
    out.append("| %d | %s | %.0f | %.0f | %.2fx | %.1f | %.0f%% |" % (threads, name, ms, tokens / ms * 1e3, torch / ms,
                                                                  rate, 100 * rate / peak[threads]))
out += ["", "Peak of the products (bench/product_peak, square products of %s): " % sys.argv[8] + "; ".join(
    "%d thread(s) %.0f GFLOP/s" % (t, peak[t]) for t in sorted(peak)) + "."]
if ckpt:
    out += ["", "| saving | stall per save (median) | 12 steps, total (median) | stall vs synchronous |",
            "| --- | --- | --- | --- |"]
for mode in ("async", "sync") if ckpt else ():
    sync = statistics.median(m["stall_ms_per_save"] for m in ckpt["sync"])
    stall = statistics.median(m["stall_ms_per_save"] for m in ckpt[mode])
    total = statistics.median(m["total_ms"] for m in ckpt[mode])
    out.append("| %s | %.1f ms | %.0f ms | %.1f%% |" % (mode, stall, total, 100 * stall / sync))
print("\n".join(out))
PY
)
echo "$TABLE"
KERNEL_NOTE="$(openblas_kernel). \
CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1)."
MODEL_NOTE=""
[ "$SHAPE" = "$SMALL" ] && MODEL_NOTE=" (\`tp-train --model small\`)"
# The denominator of bf16's CPU MFU: oneDNN's bf16 matmul where the CPU
# multiplies bf16 itself; elsewhere (AVX2 only, say) tp-train emulates its
# products with sgemm, and so does the peak (the table takes sgemm's).
PEAK_NOTE=$(grep '^peak ' "$RESULTS" | tail -n 1 | cut -d' ' -f3- | $PY -c 'import json, sys
p = json.load(sys.stdin)
if p["bf16_gflops"] > 0:
    print("CPU MFU is that rate over the peak of oneDNN\x27s bf16 matmul at the same threads (oneDNN ISA %s)." % p["onednn_isa"])
else:
    print("This CPU has no bf16 products of its own (oneDNN ISA %s): tp-train emulates them with sgemm on rounded "
          "operands, so its two rows are one code, and CPU MFU is that rate over sgemm\x27s peak." % p["onednn_isa"])')
if [ "$DTYPE" = bf16 ]; then
    doc_section bench-train-bf16 "Training throughput in bf16 mixed precision (bench-train, BENCH_DTYPE=bf16)" <<DOC
Command: \`BENCH_DTYPE=bf16 make bench-train\` (BENCH_STEPS=$STEPS, BENCH_REPS=$REPS). $KERNEL_NOTE
Model: GPT-2's architecture, $(shape_value --layers) layers, dim $(shape_value --dim), $(shape_value --heads) heads, \
sequence $(shape_value --seq), vocabulary $(shape_value --vocab)$MODEL_NOTE,
$BATCH sequences per step, AdamW with clipping, fp32 weights; tp-train --dtype bf16 (every product's operands
rounded to bf16, fp32 sums: oneDNN's bf16 matmul where the CPU has AVX512_BF16 or AMX) against PyTorch's
\`torch.autocast("cpu", torch.bfloat16)\` on the GPT-2 of tests/trainer/gpt2_ref.py, best of its thread splits,
and against tp-train's own products emulated with sgemm on the rounded operands (TP_NO_ONEDNN=1). Each run's
first 2 steps are warm-up and not counted; figures are medians over the runs. GFLOP/s counts the products of a step
(6 x tokens x (12 L D^2 + D V) + 6 L B T^2 D, the causal attention's half). $PEAK_NOTE Target: at least 1.3x
PyTorch.

$TABLE
DOC
    exit 0
fi
doc_section bench-train "Training throughput and checkpoint stall (bench-train)" <<DOC
Command: \`make bench-train\` (BENCH_STEPS=$STEPS, BENCH_REPS=$REPS). $KERNEL_NOTE
Model: GPT-2's architecture, $(shape_value --layers) layers, dim $(shape_value --dim), $(shape_value --heads) heads, \
sequence $(shape_value --seq), vocabulary $(shape_value --vocab)$MODEL_NOTE,
fp32, $BATCH sequences per step, AdamW with clipping; each run's first 2 steps are warm-up and not counted, figures
are medians over the runs. PyTorch is the GPT-2 of tests/trainer/gpt2_ref.py (the model tp-train is checked against)
on the same shape, batch and thread count; its element-wise work runs on OpenMP threads and its matrix products on
OpenBLAS threads, so each split of the thread count is tried and the fastest kept. Checkpoints: $SAVE_MB MB each
(weights and Adam moments), every 4 of 12 steps, on $CORES threads; the stall is the time the training loop spends
in saving (\`ckpt_stall_ms\` in the log), the total the sum of the step times. GFLOP/s counts the products of a
step (6 x tokens x (12 L D^2 + D V) + 6 L B T^2 D, the causal attention's half); CPU MFU is that rate over the
peak of OpenBLAS's sgemm at the same threads.
On this shared machine the speed of both trainers varies between runs by up to 1.5x, so only the ratios
within one run mean much. Targets: at least 1.3x PyTorch's throughput at every thread count; asynchronous stall
under 10% of the synchronous one.

$TABLE
DOC
