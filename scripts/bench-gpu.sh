#!/bin/sh
# make bench-gpu: tp-train on one GPU (--device cuda) against PyTorch on the
# same GPU, GPT-2 124M and 350M at sequence 1024, micro-batch 4 and 16:
# tokens/s (the median step after the warm-up) and MFU for every row, and
# each row's ratio to the PyTorch loop of the same model, micro-batch and
# dtype. The rows of each model and micro-batch:
#   tp-train bf16 (and fp32, at BENCH_FP32_MICRO_BATCH)
#   PyTorch reference (bench/train_baseline.py: the GPT-2 the tests check
#     tp-train against; attention materialized, AdamW unfused), bf16 autocast
#   PyTorch loop (bench/train_torch_loop.py: the loop a user writes; SDPA,
#     AdamW(fused=True), bf16 autocast, eager; and fp32, TF32 off, beside
#     tp-train's fp32 rows)
#   the same loop under torch.compile, where it compiles within the limit
#     (BENCH_COMPILE_LIMIT) and the budget left; else the row says why not
# then the training stall per checkpoint, asynchronous against --sync-save;
# then make bench-reshard, whose table gains tp-reshard --device cuda beside
# the CPU. MFU: 6N + 12 L d T FLOPs per token against the GPU's dense bf16
# peak; tp-train computes it (model/gpt.c, kernels/cpu/device.c), the PyTorch
# scripts and this table with bench/mfu.py, the peak table's twin for the
# scripts (a tp-train row whose MFU disagrees with it is flagged). Writes
# docs/BENCHMARKS.md (section bench-gpu) with the GPU, driver and CUDA
# version. Without a GPU it measures nothing and says so (exit 1).
#   BENCH_STEPS (default 6): tp-train's steps per run; the first 2 are warm-up
#   BENCH_TORCH_STEPS (default 8): PyTorch's measured steps, after 2 warm-up
#     steps (3 under torch.compile, whose compiling they include)
#   BENCH_MICRO_BATCH (default "4 16"): the micro-batches (sequences per step)
#   BENCH_FP32_MICRO_BATCH (default 4): those of them with fp32 rows too
#     (empty: none; so too BENCH_REFERENCE_DTYPES and BENCH_COMPILE)
#   BENCH_MODELS (default "124M 350M"): the models, of 124M, 350M and tiny
#     (tp-train --model tiny's shape); the checkpoint stall is measured on
#     the first, at the first micro-batch
#   BENCH_SEQ (default 1024): sequence length
#   BENCH_VARIANTS (default "TP_CUDA_EPILOGUE=off TP_CUDA_ATTENTION=tiled
#     TP_CUDA_DETERMINISTIC=1"): settings of tp-train's environment, each a
#     bf16 row of its own at the first model and micro-batch: what the code
#     each one sets aside bought, or what repeating bit for bit costs,
#     measured in the same run (empty: none)
#   BENCH_FP32_VARIANTS (default "TP_CUDA_TILED_FORWARD_ROWS=2
#     TP_CUDA_TILED_FORWARD_ROWS=3 TP_CUDA_TILED_BACKWARD_ROWS=1
#     TP_CUDA_ATTENTION=tf32x3"): the same for fp32 rows (where the first
#     micro-batch has them): which of the tiled forward's shapes, and of the
#     backward's, runs fastest (the two are separate kernels: the best of
#     each go together), and the tensor cores' attention in 3xTF32 against
#     them (empty: none)
#   BENCH_REFERENCE_DTYPES (default bf16): the reference's dtypes (fp32 bf16)
#   BENCH_COMPILE (default "124M:16 124M:4 350M:16 350M:4"): the
#     model:micro-batch rows tried under torch.compile, in this order
#   BENCH_COMPILE_LIMIT (default 90): the seconds one compilation may take
#   BENCH_BUDGET (default 230): the seconds this script may run; a
#     compilation gets at most what is left less 15 s, and none under 20 s;
#     a row not started before the budget is spent says so (gpu-check's
#     bench phase gives what its --limit leaves after the kernel times,
#     less 30 s). Stopped by a signal (TERM,
#     INT), it writes the rows it has.
#   (a tiny run: BENCH_MODELS=tiny BENCH_SEQ=32 BENCH_STEPS=3
#   BENCH_MICRO_BATCH=1, and bench-reshard's tiny settings)
#   Where it writes: scripts/bench-lib.sh.
#
# Time (estimated, not yet measured: this table was built without a GPU).
# On an H100, from docs/BENCHMARKS.md and docs/GPU.md (tokens/s: tp-train
# bf16 124M 23k at micro-batch 4 and 24.7k at 16, fp32 17.9k; 350M 9.0k and
# 6.8k; the reference bf16 94k (124M) and 38k (350M); the loop 142k and 302k
# (124M), 350M scaled by its FLOPs per token (x2.83): 50k and 107k; fp32 about
# 40k and 14k), with about 3 s of start for tp-train (5 s at 350M) and 5 s for
# each PyTorch process:
#   tp-train, 6 steps: 124M bf16 mb 4 4 s, mb 16 7 s, fp32 mb 4 4.5 s;
#     350M 7.5 s, 15 s, 8.5 s                                      47 s
#   the variants, 124M bf16 mb 4: epilogues off 4 s, tiled 5 s,
#     deterministic 4 s; 124M fp32 mb 4: the tiled forward's 2 and 3
#     rows a thread, the backward's 1, tf32x3's attention, 4.5 s each 31.5 s
#   reference bf16, 10 steps: 124M 5.5 s, 6.5 s; 350M 6 s, 9 s     27 s
#   loop, one process a model, 11 steps a row: 124M 7 s, 350M 11 s 18 s
#   checkpoint stall, 124M mb 4, 12 steps sync and async, then
#     async spaced (3 saves, 1.5 sync saves apart: about 5 s more)   30 s
#   the GPU and PyTorch checks at the start                         5 s
#   without compiling                                           about 154 s
# which leaves about 76 s of BENCH_BUDGET's 230 for torch.compile: 124M at
# micro-batch 16 first (it compiled in 21 s on the H200); what is left goes
# to the next. Under gpu-check --phase lease the bench's limit is what the
# lease's 550 s leave after the tests and sanitize, 220 s at least (about
# 370 s where they take 3 minutes), less the kernel times and the
# repeatability runs before it (about 65 s); a slower machine loses compile
# rows first, then the last rows.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
. scripts/bench-lib.sh
START=$(date +%s)
STEPS=${BENCH_STEPS:-6}
TORCH_STEPS=${BENCH_TORCH_STEPS:-8}
MBS=${BENCH_MICRO_BATCH:-4 16}
FP32_MBS=${BENCH_FP32_MICRO_BATCH-4}
MODELS=${BENCH_MODELS:-124M 350M}
SEQ=${BENCH_SEQ:-1024}
VARIANTS=${BENCH_VARIANTS-TP_CUDA_EPILOGUE=off TP_CUDA_ATTENTION=tiled TP_CUDA_DETERMINISTIC=1}
TILED_ROWS_CHOICES="TP_CUDA_TILED_FORWARD_ROWS=2 TP_CUDA_TILED_FORWARD_ROWS=3 TP_CUDA_TILED_BACKWARD_ROWS=1"
FP32_VARIANTS=${BENCH_FP32_VARIANTS-$TILED_ROWS_CHOICES TP_CUDA_ATTENTION=tf32x3}
for variant in $VARIANTS $FP32_VARIANTS; do
    case $variant in
    [A-Za-z_]*=*) ;;
    *) echo "bench-gpu: BENCH_VARIANTS or BENCH_FP32_VARIANTS: '$variant' is not NAME=VALUE" >&2; exit 2 ;;
    esac
done
REFERENCE_DTYPES=${BENCH_REFERENCE_DTYPES-bf16}
COMPILE=${BENCH_COMPILE-124M:16 124M:4 350M:16 350M:4}
COMPILE_LIMIT=${BENCH_COMPILE_LIMIT:-90}
BUDGET=${BENCH_BUDGET:-230}
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
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
CUDA_VERSION=$( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | sed -n 's/.*release \([0-9.]*\).*/\1/p')
TORCH_CUDA=no
$PY -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null && TORCH_CUDA=yes
mkdir -p "$DIR"
RESULTS="$DIR/results.txt"
: >"$RESULTS"

# Seconds of BENCH_BUDGET left.
left() { echo $((BUDGET - ($(date +%s) - START))); }

# row MODEL MB KEY JSON: a row of the table, also on the standard output (a
# caller's log then keeps every row measured, should this script be killed
# before it writes the table).
row() { echo "train $1 $2 $3 $4" | tee -a "$RESULTS"; }

# failed STATUS ERRFILE: the JSON of a run that failed: its exit status and
# the last line of its standard error.
failed() {
    $PY -c 'import json, sys
lines = [l.strip() for l in open(sys.argv[2], errors="replace") if l.strip()]
print(json.dumps({"error": "exit %s: %s" % (sys.argv[1], lines[-1][:160] if lines else "no message")}))' "$1" "$2"
}
not_run() { echo "{\"error\": \"not run: BENCH_BUDGET=$BUDGET s spent\"}"; }

# Median tokens/s and MFU of a tp-train log, warm-up steps left out.
log_rates() {
    $PY -c '
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])]
r = [x for x in r if "event" not in x][2:]
print(json.dumps({"tokens_per_s": statistics.median(x["tokens_per_s"] for x in r),
                  "mfu": statistics.median(x.get("mfu", 0) for x in r)}))' "$1"
}

# torch_rows OUT MODEL KEY: each JSON line of a PyTorch script (OUT) as the
# row KEY-DTYPE of its micro-batch.
torch_rows() {
    $PY - "$@" >>"$RESULTS" <<'PY'
import json, sys
out, model, key = sys.argv[1:4]
for line in open(out):
    if line.startswith("{"):
        r = json.loads(line)
        print("train %s %d %s-%s %s" % (model, r["micro_batch"], key, r["dtype"], json.dumps(r)))
PY
}

# model NAME: tp-train's options for the model NAME, then PyTorch's shape
# (layers, dim, heads, vocabulary, its padding multiple) after a "|".
model() {
    case $1 in
    124M) echo "--model gpt2-124m | 12 768 12 50257 128" ;;
    350M) echo "--model gpt2-124m --layers 24 --dim 1024 --heads 16 | 24 1024 16 50257 128" ;;
    tiny) echo "--model tiny | 2 64 4 256 1" ;;
    *) echo "bench-gpu: unknown model $1 in BENCH_MODELS (124M, 350M, tiny)" >&2; exit 1 ;;
    esac
}

# The table from the rows so far, into $DOC (bench-lib.sh) and onto stdout.
# STOPPED: why the rows end early, if they do.
STOPPED=""
write_table() {
    TABLE=$($PY - "$RESULTS" "$GPU_NAME" "$CKPT_NAME" "$STOPPED" <<'PY'
import json, os, sys
sys.path.insert(0, "bench")
import mfu as count

results, gpu, ckpt_name, stopped = sys.argv[1:5]
peak = count.peak_bf16_flops(gpu)
rows, ckpt, shapes = [], {}, {}
for line in open(results):
    kind, rest = line.rstrip("\n").split(" ", 1)
    if kind == "shape":
        name, layers, dim, vocab, seq = rest.split()
        shapes[name] = count.gpt2_flops_per_token(int(layers), int(dim), int(vocab), int(seq))
    elif kind == "train":
        model, mb, key, value = rest.split(" ", 3)
        rows.append((model, int(mb), key, json.loads(value)))
    else:
        mode, value = rest.split(" ", 1)
        ckpt[mode] = json.loads(value)

def trainer(key, m):
    """The row's trainer, in words: what ran, from its own labels."""
    dtype = key.rsplit("-", 1)[1]
    if key.startswith("tp-train"):
        variant = key[len("tp-train-"):-len(dtype) - 1]
        return "tp-train %s%s" % (dtype, " (%s)" % variant if variant else "")
    if key.startswith("reference"):
        return "PyTorch reference %s (tests' GPT-2: attention materialized, AdamW unfused)" % dtype
    what = "%s, %s" % (m.get("attention", "?"), m.get("optimizer", "?"))
    if key.startswith("compile"):
        return "PyTorch loop %s, torch.compile (%s)" % (dtype, what)
    return "PyTorch loop %s (%s, eager)" % (dtype, what)

def rate(m):
    return m.get("tokens_per_s") if not m.get("error") else None

loop = {(model, mb, key.rsplit("-", 1)[1]): rate(m) for model, mb, key, m in rows if key.startswith("loop-")}
# Each model and micro-batch together, bf16 before fp32, in the order the rows ran otherwise.
models = list(dict.fromkeys(model for model, _, _, _ in rows))
rows.sort(key=lambda r: (models.index(r[0]), r[1], r[2].endswith("-fp32")))
out = ["| model | micro-batch | trainer | tokens/s (median) | MFU (bf16 peak) | vs the PyTorch loop |",
       "| --- | --- | --- | --- | --- | --- |"]
warnings = []
for model, mb, key, m in rows:
    r = rate(m)
    if r is None:
        why = m.get("error") or m.get("note") or "no rate"
        out.append("| GPT-2 %s | %d | %s | %s | - | - |" % (model, mb, trainer(key, m), why))
        continue
    ours = count.mfu(r, shapes[model], peak) if model in shapes else None
    mfu = m.get("mfu") or ours
    if key.startswith("tp-train") and ours and m.get("mfu") and abs(m["mfu"] - ours) > 0.002 + 0.01 * ours:
        warnings.append("tp-train's MFU %.4f (GPT-2 %s, micro-batch %d) differs from bench/mfu.py's %.4f: "
                        "the peak tables or the counts disagree" % (m["mfu"], model, mb, ours))
    base = loop.get((model, mb, key.rsplit("-", 1)[1]))
    note = " (compiled in %.0f s)" % m["compile_s"] if m.get("compile_s") else ""
    out.append("| GPT-2 %s | %d | %s%s | %.0f | %s | %s |" % (
        model, mb, trainer(key, m), note, r, ("%.1f%%" if mfu >= 1e-3 else "%.2g%%") % (100 * mfu) if mfu else "-",
        "%.2fx" % (r / base) if base else "-"))
if "sync" in ckpt and not ckpt["sync"].get("error"):
    out += ["", "| saving (GPT-2 %s) | saves every | stall per save | waits for the save before | run, total | "
            "stall vs synchronous |" % ckpt_name, "| --- | --- | --- | --- | --- | --- |"]
    words = {"sync": "synchronous", "async": "asynchronous", "async-spaced": "asynchronous, spaced"}
    for mode in ("sync", "async", "async-spaced"):
        c = ckpt.get(mode, {"error": "not run"})
        if c.get("error"):
            out.append("| %s | - | %s | - | - | - |" % (words[mode], c["error"]))
            continue
        out.append("| %s | %d steps (%.0f ms a step) | %.1f ms | %d | %.0f ms | %.1f%% |" % (
            words[mode], c["every"], c["step_ms"], c["stall_ms_per_save"], c["waits"], c["total_ms"],
            100 * c["stall_ms_per_save"] / ckpt["sync"]["stall_ms_per_save"]))
elif ckpt:
    out += ["", "Checkpoint stall: " + "; ".join("%s %s" % (k, v.get("error", "")) for k, v in ckpt.items())]
if stopped:
    out += ["", "Stopped early: %s." % stopped]
for w in warnings:
    print("bench-gpu: warning: " + w, file=sys.stderr)
    out += ["", "Warning: " + w + "."]
print("\n".join(out))
PY
)
    echo "$TABLE"
    doc_section bench-gpu "tp-train on a GPU" <<EOF
GPU: $GPU; CUDA $CUDA_VERSION; PyTorch with CUDA here: $TORCH_CUDA. One process, tp1, sequence $SEQ, micro-batches
$MBS (fp32 rows at $FP32_MBS). tp-train --dtype bf16: bf16 operands, fp32 sums; PyTorch: bf16 autocast, fp32
weights; fp32 with TF32 off on both sides. The PyTorch loop (bench/train_torch_loop.py) is the loop a user writes:
\`scaled_dot_product_attention\` (the kernel it took, as profiled), \`AdamW(fused=True)\`, clipping, eager, and
under \`torch.compile\` where it compiled within BENCH_COMPILE_LIMIT=$COMPILE_LIMIT s and the budget left; the
reference (bench/train_baseline.py) is the GPT-2 the tests check tp-train against. "vs the PyTorch loop": the
row's tokens/s over the loop's at the same model, micro-batch and dtype. MFU counts 6N + 12 L d T FLOPs per token
(N: tp-train's parameters, the true vocabulary) against the GPU's dense bf16 peak (bench/mfu.py).

$TABLE

Command: \`make bench-gpu\` (BENCH_STEPS=$STEPS, BENCH_TORCH_STEPS=$TORCH_STEPS, BENCH_MICRO_BATCH="$MBS",
BENCH_FP32_MICRO_BATCH="$FP32_MBS", BENCH_MODELS="$MODELS", BENCH_SEQ=$SEQ, BENCH_COMPILE="$COMPILE",
BENCH_COMPILE_LIMIT=$COMPILE_LIMIT, BENCH_BUDGET=$BUDGET, BENCH_VARIANTS="$VARIANTS",
BENCH_FP32_VARIANTS="$FP32_VARIANTS").
EOF
}
set -- $MODELS
CKPT_NAME=$1
on_signal() {
    STOPPED="stopped by a signal after $(($(date +%s) - START)) s (the caller's time limit?)"
    trap - TERM INT
    write_table
    exit 1
}
trap on_signal TERM INT

for name in $MODELS; do
    spec=$(model "$name") || exit 1
    args=${spec%%|*}
    set -- ${spec#*|}
    layers=$1 dim=$2 heads=$3 vocab=$4 pad=$5
    echo "shape $name $layers $dim $vocab $SEQ" >>"$RESULTS"
    for mb in $MBS; do
        dtypes=bf16
        case " $FP32_MBS " in *" $mb "*) dtypes="bf16 fp32" ;; esac
        for dtype in $dtypes; do
            variants=""
            if [ "$name" = "$CKPT_NAME" ] && [ "$mb" = "${MBS%% *}" ]; then
                if [ "$dtype" = bf16 ]; then variants=$VARIANTS; else variants=$FP32_VARIANTS; fi
            fi
            for variant in "" $variants; do
                key=tp-train-${variant:+$variant-}$dtype
                log="$DIR/$name-$mb-$(printf %s "$key" | tr -c 'A-Za-z0-9_=.-' _).jsonl"
                if [ "$(left)" -le 0 ]; then row "$name" "$mb" "$key" "$(not_run)"; continue; fi
                if env $variant "$BUILD/bin/tp-train" $args --seq "$SEQ" \
                    --micro-batch "$mb" --steps "$STEPS" --device cuda --dtype "$dtype" --quiet --log "$log" \
                    2>"$DIR/err.txt"; then
                    row "$name" "$mb" "$key" "$(log_rates "$log")"
                else
                    row "$name" "$mb" "$key" "$(failed $? "$DIR/err.txt")"
                fi
            done
        done
    done
    [ $TORCH_CUDA = yes ] || continue
    shape="--layers $layers --dim $dim --heads $heads --vocab $vocab --vocab-pad-multiple $pad --seq $SEQ"
    for mb in $MBS; do
        for dtype in $REFERENCE_DTYPES; do
            if [ "$(left)" -le 0 ]; then row "$name" "$mb" "reference-$dtype" "$(not_run)"; continue; fi
            if $PY bench/train_baseline.py $shape --batch "$mb" --threads 1 --steps "$TORCH_STEPS" --warmup-steps 2 \
                --device cuda --dtype "$dtype" >"$DIR/out.txt" 2>"$DIR/err.txt"; then
                row "$name" "$mb" "reference-$dtype" "$(tail -n 1 "$DIR/out.txt")"
            else
                row "$name" "$mb" "reference-$dtype" "$(failed $? "$DIR/err.txt")"
            fi
        done
    done
    # The loop, one process: every micro-batch in bf16, those of BENCH_FP32_MICRO_BATCH in fp32 too.
    runs=$(for mb in $MBS; do printf 'bf16:%s ' "$mb"; done
        for mb in $MBS; do case " $FP32_MBS " in *" $mb "*) printf 'fp32:%s ' "$mb" ;; esac; done)
    if [ "$(left)" -le 0 ]; then
        for mb in $MBS; do row "$name" "$mb" loop-bf16 "$(not_run)"; done
        continue
    fi
    $PY bench/train_torch_loop.py $shape --runs $runs --steps "$TORCH_STEPS" --warmup-steps 2 --device cuda \
        >"$DIR/out.txt" 2>"$DIR/err.txt" || row "$name" "${MBS%% *}" loop-bf16 "$(failed $? "$DIR/err.txt")"
    torch_rows "$DIR/out.txt" "$name" loop
done

# The stall per save, on the first model at the first micro-batch, three
# saves a run: synchronous every 4 steps (what a save costs whole), then
# asynchronous every 4 steps, where each save but the first waits for the
# one before to be written (it measures the storage, as the synchronous
# row does), then asynchronous every k steps, k steps lasting 1.5 times a
# synchronous save (at most 300): the stall a run pays where its saves
# are no more frequent than the storage can take them (issue 53's target).
spec=$(model "$CKPT_NAME")
every=4
for mode in sync async async-spaced; do
    rm -rf "$DIR/ckpt"
    flag=""
    [ $mode = sync ] && flag=--sync-save
    if [ "$(left)" -le 0 ]; then echo "checkpoint $mode $(not_run)" >>"$RESULTS"; continue; fi
    if [ $mode = async-spaced ]; then
        every=$($PY -c '
import json, math, sys
c = json.loads(sys.argv[1])
print(min(300, max(4, math.ceil(1.5 * c["stall_ms_per_save"] / max(c["step_ms"], 1e-3)))) if "step_ms" in c else 0)' \
            "$(sed -n 's/^checkpoint sync //p' "$RESULTS")")
        if [ "$every" -eq 0 ]; then echo "checkpoint $mode {\"error\": \"no synchronous row to space the saves by\"}" >>"$RESULTS"; continue; fi
    fi
    if "$BUILD/bin/tp-train" ${spec%%|*} --seq "$SEQ" --micro-batch "${MBS%% *}" --steps $((3 * every)) --device cuda \
        --quiet --ckpt-dir "$DIR/ckpt" --ckpt-every "$every" $flag --log "$DIR/ckpt.jsonl" 2>"$DIR/err.txt"; then
        m=$($PY -c '
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [x for x in lines if "event" not in x]
every = int(sys.argv[2])
plain = [x["ms"] for x in steps if x["step"] % every and x["step"] > 2] or [x["ms"] for x in steps]
print(json.dumps({"stall_ms_per_save": sum(x["ckpt_stall_ms"] for x in steps) / 3,
                  "total_ms": sum(x["ms"] for x in steps), "step_ms": statistics.median(plain), "every": every,
                  "waits": sum(1 for x in lines if x.get("event") == "save_wait")}))' "$DIR/ckpt.jsonl" "$every")
    else
        m=$(failed $? "$DIR/err.txt")
    fi
    echo "checkpoint $mode $m" >>"$RESULTS"
done
rm -rf "$DIR/ckpt"

# torch.compile, last: each row within BENCH_COMPILE_LIMIT and what is left of the budget.
if [ $TORCH_CUDA = yes ]; then
    for entry in $COMPILE; do
        name=${entry%%:*} mb=${entry#*:}
        case " $MODELS " in *" $name "*) ;; *) continue ;; esac
        case " $MBS " in *" $mb "*) ;; *) continue ;; esac
        spec=$(model "$name")
        set -- ${spec#*|}
        limit=$(($(left) - 15))
        [ "$limit" -gt "$COMPILE_LIMIT" ] && limit=$COMPILE_LIMIT
        if [ "$limit" -lt 20 ]; then
            row "$name" "$mb" compile-bf16 "{\"error\": \"not tried: $(left) s of BENCH_BUDGET=$BUDGET s left\"}"
            continue
        fi
        # timeout: a compilation the script's own timer cannot interrupt; at
        # most 10 s past the budget (the command runs in a process group of
        # its own: a caller's signal to this script waits for it).
        stop=$((limit + 60))
        [ "$stop" -gt $(($(left) + 10)) ] && stop=$(($(left) + 10))
        if timeout --kill-after=5 "$stop" $PY bench/train_torch_loop.py --layers "$1" --dim "$2" --heads "$3" \
            --vocab "$4" --vocab-pad-multiple "$5" --seq "$SEQ" --batch "$mb" --dtype bf16 --mode compile \
            --compile-limit "$limit" --steps "$TORCH_STEPS" --warmup-steps 3 --device cuda >"$DIR/out.txt" 2>"$DIR/err.txt"; then
            torch_rows "$DIR/out.txt" "$name" compile
        else
            row "$name" "$mb" compile-bf16 "$(failed $? "$DIR/err.txt")"
        fi
    done
fi

trap - TERM INT
write_table
# BENCH_GPU_RESHARD=0: without it (gpu-check.sh runs it as a phase of its own).
[ "${BENCH_GPU_RESHARD:-1}" = 0 ] || BUILD=$BUILD scripts/bench-reshard.sh
