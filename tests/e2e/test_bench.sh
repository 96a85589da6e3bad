#!/bin/sh
# End-to-end test of the benchmark scripts (scripts/bench-*.sh): each runs
# at a tiny size and must finish and write its section, with a table of
# numbers, into a scratch copy of the benchmarks document, so that a change
# of a program's logs or options cannot break a benchmark silently. The
# figures mean nothing at these sizes. docs/BENCHMARKS.md and bench/scratch
# are left alone, and nothing is left running, in BENCH_TMPFS or registered as
# a git worktree. bench-gpu without a GPU: its refusal is checked, and the
# test says SKIP for it.
# takes: about 115 s beside two other tests on 2 cores (scripts/run-tests.py orders by it)
# waits: mostly for the benchmarks' fixed schedules and their PyTorch baselines (about a third of a core over its run)
# tier: full
. "$(dirname "$0")/lib.sh"

use_open_mpi
export BUILD=${BUILD:-build}
# Where every benchmark writes (scripts/bench-lib.sh), and no pauses or
# whole-cache drops: other tests run beside this one.
export BENCH_DOC="$WORK/BENCHMARKS.md" BENCH_SCRATCH="$WORK/scratch"
# What the benchmarks keep in memory, in a tmpfs directory of this test's own
# (another suite may be running its benchmarks beside this one).
BENCH_TMPFS="$WORK/shm"
if [ -d /dev/shm ] && [ -w /dev/shm ]; then BENCH_TMPFS=$(mktemp -d /dev/shm/tp-e2e-bench-XXXXXX); fi
mkdir -p "$BENCH_TMPFS"
export BENCH_TMPFS
trap 'rm -rf "$WORK" "$BENCH_TMPFS"' EXIT
export BENCH_SETTLE=0 BENCH_DROP=files BENCH_REPS=1
# bench-ckpt, bench-reshard, bench-export: a GPT of dim 64, vocabulary 256,
# and the fewest layers (about 2 MB of tensors).
export BENCH_DIM=64 BENCH_VOCAB=256 BENCH_GB=0.002 BENCH_PARAMS_B=0
# bench-train, bench-gpu and bench-parallel: tp-train --model tiny's shape, 3 steps.
export BENCH_STEPS=3 BENCH_SHAPE="--layers 2 --dim 64 --heads 4 --vocab 256 --seq 32" BENCH_PEAK_SIZE=128
# bench-parallel's interleaved schedule: the tiny shape with 8 layers, V 1 and 2, 2 micro-batches.
export BENCH_PIPELINE_SHAPE="--layers 8 --dim 64 --heads 4 --vocab 256 --seq 32" BENCH_PIPELINE_M=2 BENCH_PIPELINE_V="1 2"
# bench-parallel's ZeRO-1 and ZeRO-3 runs: dp 1 and 2.
export BENCH_DPS="1 2"
export BENCH_MODELS=tiny BENCH_SEQ=32 BENCH_MICRO_BATCH=1
# bench-llama: llama-tiny's shape, trained and resharded.
export BENCH_LLAMA_MODEL=llama-tiny BENCH_LLAMA_SHAPE="--layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 --seq 32"
# bench-elastic: one row per launcher, the tiny model, 8 steps.
export BENCH_ROWS="tiny-shrink tiny-node-down" BENCH_TINY_STEPS="8 2 5" BENCH_LARGE="--model tiny"
# bench-remote: a checkpoint of the tiny model; tp-train's per-rank saves at 1 and 2 ranks.
# bench-s3-md5: the same checkpoint, with this build as the base (BENCH_BASE_BIN below).
export BENCH_MODEL="--model tiny" BENCH_RANKS="1 2"
# bench-dcp-strided: a [256, 256] tensor transposed and contiguous (BENCH_BASE_BIN below: this build as before).
export BENCH_DCP_STRIDED_N=256
# bench-scale: the index of a 4-layer Llama of dim 64 at tp8 pp2, dp 2 and 4, and 16 layers at pp2 and pp16.
export BENCH_SCALE_MODEL="--layers 4 --dim 64 --ffn 128 --heads 8 --kv-heads 8 --vocab 256" BENCH_SCALE_PP=2
export BENCH_SCALE_DPS="2 4" BENCH_SCALE_DEEP=16
# bench-revisions: the current build as both revisions (building two takes
# half a minute here); a tiny checkpoint and training cases.
export BENCH_BASE_BIN="$BUILD/bin" BENCH_CURRENT_BIN="$BUILD/bin"
export BENCH_CKPT="--layers 2 --dim 64 --heads 16 --vocab 256 --seq 64"
export BENCH_TRAIN="--model tiny --steps 4" BENCH_TRAIN_LONG="--model tiny --seq 256 --micro-batch 2 --steps 2"

# What must be the same after the run as before it.
state() {
    md5sum "$ROOT/docs/BENCHMARKS.md"
    if [ -d "$ROOT/bench/scratch" ]; then tree_digest "$ROOT/bench/scratch"; fi
    ls -A "$BENCH_TMPFS"
    git -C "$ROOT" worktree list --porcelain | grep '^worktree '
}
state >"$WORK/state.before"

# has_table NAME: the section NAME of $BENCH_DOC holds a Markdown table
# with at least one row of numbers.
has_table() {
    "$PY" - "$BENCH_DOC" "$1" <<'PYEOF'
import os, re, sys
doc, name = sys.argv[1:3]
text = open(doc).read() if os.path.exists(doc) else ""
begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
if begin not in text or end not in text:
    sys.exit(f"no section {name} in {doc}")
lines = text[text.index(begin):text.index(end)].splitlines()
rows, in_table = [], False
for line in lines:
    if re.fullmatch(r"\|( *:?-+:? *\|)+", line.strip()):
        in_table = True  # the separator under a header
    elif in_table and line.startswith("|"):
        rows.append([c.strip(" *") for c in line.strip().strip("|").split("|")])
    else:
        in_table = False
if not any(re.match(r"-?\d+(\.\d+)?", cell) for row in rows for cell in row):
    sys.exit(f"section {name}: no table row with a number")
PYEOF
}

# bench NAME: scripts/NAME.sh at the tiny size: exit 0, its section written.
bench() {
    start=$(date +%s)
    expect_ok "$1" "$ROOT/scripts/$1.sh"
    echo "[$NAME] $1: $(($(date +%s) - start)) s"
    check "$1: its section in BENCH_DOC, with a table of numbers" has_table "$1"
}

total=$(date +%s)
bench bench-ckpt
check "bench-ckpt: its checkpoints and the copy's source removed, its results kept" \
    sh -c 'cd "$1" && [ ! -e c0 ] && [ ! -e c3 ] && [ ! -e src.bin ] && [ -s results.txt ]' sh "$BENCH_SCRATCH/ckpt"
bench bench-reshard
# A measured run that failed is no result: the benchmark stops naming it and
# its section stays as it was (a tp-reshard refusing the memory limit was
# tabled as 0.74x cp).
cp "$BENCH_DOC" "$WORK/doc.before-failure"
run env BENCH_CASE=issue28 BENCH_MEMORY=1K "$ROOT/scripts/bench-reshard.sh"
check_all "bench-reshard issue 28 with a tp-reshard that fails: stopped, naming the failed run (exit $RC)" \
    '[ "$RC" -ne 0 ] && grep -q "^tp-reshard: error: memory limit of 1.00 KiB is too small" "$WORK/.err" &&
     grep -q "^bench-reshard: after (cold cache) failed with status 2$" "$WORK/.err"'
check "and its section unchanged" cmp "$BENCH_DOC" "$WORK/doc.before-failure"
# The tables of the other benchmarks alike (bench/ratio_table.py).
printf '%s\n' 'cold reshard {"seconds": 1.0, "max_rss_bytes": 1, "status": 0}' \
    'cold cp {"seconds": 0.5, "max_rss_bytes": 1, "status": 2}' >"$WORK/failed-results.txt"
run "$PY" "$ROOT/bench/ratio_table.py" "$WORK/failed-results.txt" 1000 2 reshard=tp-reshard "cp=cp -r"
check_all "ratio_table.py of a failed run: no table, the run named (exit $RC)" \
    '[ "$RC" -eq 1 ] && ! grep -q "|" "$WORK/.out" &&
     grep -q "^ratio_table.py: cp -r (cp, cold cache) failed with status 2: no table" "$WORK/.err"'
start=$(date +%s)
expect_ok "bench-reshard, issue 28's case, this build before and after" env BENCH_CASE=issue28 BENCH_BEFORE="$BUILD/bin" \
    "$ROOT/scripts/bench-reshard.sh"
echo "[$NAME] bench-reshard issue 28: $(($(date +%s) - start)) s"
check "bench-reshard issue 28: its section in BENCH_DOC, with a table of numbers" has_table bench-reshard-issue28
check "bench-reshard issue 28: before and after side by side" grep -q "| warm | tp-reshard before |" "$BENCH_DOC"
bench bench-export
if "$PY" -c 'import torch' 2>/dev/null; then
    bench bench-megatron
else
    echo "[$NAME] SKIP: bench-megatron: python3-torch is not installed"
fi
bench bench-dcp
if "$PY" -c 'import torch' 2>/dev/null; then
    bench bench-dcp-strided
else
    echo "[$NAME] SKIP: bench-dcp-strided: python3-torch is not installed"
fi
bench bench-train
start=$(date +%s)
expect_ok "bench-train, bf16" env BENCH_DTYPE=bf16 "$ROOT/scripts/bench-train.sh"
echo "[$NAME] bench-train bf16: $(($(date +%s) - start)) s"
check "bench-train bf16: its section in BENCH_DOC, with a table of numbers" has_table bench-train-bf16
check "bench-train bf16: a row of the emulated products" grep -q "emulated with sgemm" "$BENCH_DOC"
check "bench-train bf16: the peak its MFU is over named, with oneDNN's ISA" \
    grep -Eq "(over the peak of oneDNN's bf16 matmul at the same threads|over sgemm's peak).*oneDNN ISA [a-z0-9_]+|oneDNN ISA [a-z0-9_]+.*over sgemm's peak" "$BENCH_DOC"
# Where the CPU does not multiply bf16 (oneDNN capped at AVX2, as on an AVX2
# machine), the peak says so: no bf16 rate, the ISA named, for the note above.
run env ONEDNN_MAX_CPU_ISA=AVX2 "$BUILD/bench/product_peak" 1 16
check_all "product_peak under AVX2: no bf16 peak, oneDNN's ISA avx2 (exit $RC)" \
    '[ "$RC" -eq 0 ] && grep -q "\"onednn_isa\": \"avx2\"" "$WORK/.out" && grep -q "\"bf16_gflops\": 0.0}" "$WORK/.out"'
check "bench-train: the CPU MFU of each row against the measured peak" grep -q "| CPU MFU |" "$BENCH_DOC"
check "bench-train: the OpenBLAS kernel in use named" grep -q "OpenBLAS kernel: [A-Za-z]" "$BENCH_DOC"
if "$PY" -c 'import torch' 2>/dev/null; then
    bench bench-llama
else
    echo "[$NAME] SKIP: bench-llama: python3-torch is not installed"
fi
bench bench-elastic
check "bench-elastic: its rows name their launcher" grep -q "^| tiny-shrink | mpirun |" "$BENCH_DOC"
# Stopped mid-run (SIGTERM to the script alone, as a job scheduler's kill
# sends it), it stops its launcher and the ranks with it: before, the shell
# ran its trap only when the whole recovery run had ended.
rm -rf "$BENCH_SCRATCH/elastic"
BENCH_ROWS=tiny-shrink BENCH_TINY_STEPS="4000 50 3000" "$ROOT/scripts/bench-elastic.sh" >"$WORK/.out" 2>"$WORK/.err" &
bench_pid=$!
run_log="$BENCH_SCRATCH/elastic/tiny-shrink/elastic/train.jsonl"
waited=0
until grep -q '"step":1,' "$run_log" 2>/dev/null || [ $waited -ge 600 ]; do sleep 0.1; waited=$((waited + 1)); done
kill -TERM "$bench_pid"
RC=0
wait "$bench_pid" || RC=$?
check_all "bench-elastic stopped by SIGTERM mid-run: exit 1, its run stopped before its last step, no rank left" \
    '[ "$RC" -eq 1 ] && ! grep -q "\"step\":4000," "$run_log" &&
     ! ps -eo args | grep -v grep | grep -q "$BENCH_SCRATCH/elastic"'
bench bench-parallel
check "bench-parallel: the interleaved schedule's section, with a table of numbers" has_table bench-pipeline
check "bench-parallel: the ZeRO section, with a table of numbers" has_table bench-zero
check "bench-parallel's and bench-llama's sections name the OpenBLAS kernel in use, not only the variable" \
    sh -c '[ "$(grep -c "OpenBLAS kernel: [A-Za-z]" "$1")" -ge 4 ] && ! grep -q "OPENBLAS_CORETYPE=unset" "$1"' sh \
    "$BENCH_DOC"
bench bench-remote
check "bench-remote: the per-rank saves' section, with a table of numbers" has_table bench-remote-ranks
# bench-s3-md5: this build as both (BENCH_BASE_BIN), the tiny checkpoint;
# where s3rver cannot start, its section says so (skipped, not passed).
bench_start=$(date +%s)
expect_ok "bench-s3-md5" "$ROOT/scripts/bench-s3-md5.sh"
echo "[$NAME] bench-s3-md5: $(($(date +%s) - bench_start)) s"
if grep -q "Skipped on this machine: s3rver could not start" "$BENCH_DOC"; then
    echo "[SKIP] [$NAME] bench-s3-md5: s3rver could not start"
else
    check "bench-s3-md5: its section in BENCH_DOC, with a table of numbers" has_table bench-s3-md5
fi
bench bench-scale
# Real figures, not zeros: each case's index has a size, its serializing and
# parsing took time and heap, and a save makes requests; the deep model at
# 128 files has as many pieces as at 16.
scale_figures() {
    "$PY" - "$BENCH_SCRATCH/scale/results.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
if len(rows) != 5:
    sys.exit(f"{len(rows)} cases, expected 5")
for r in rows:
    for key in ("index_bytes", "serialize_s", "serialize_heap_bytes", "parse_s", "parse_heap_bytes", "save_put",
                "piece_gets_per_copy"):
        if not r[key] > 0:
            sys.exit(f"{r['case']}: {key} is {r[key]}")
    if r["files"] != 8 * r["pp"] or r["ranks"] != r["files"] * r["dp"]:
        sys.exit(f"{r['case']}: {r['files']} files, {r['ranks']} ranks")
    # Opening an index holds the index it builds and, beside it, less than
    # the text's size: its tensors are parsed one at a time (cJSON's tree of
    # the whole text took 5.9 times the text).
    if not r["parse_heap_bytes"] < r["parsed_kept_bytes"] + r["index_bytes"]:
        sys.exit(f"{r['case']}: parsing {r['index_bytes']} bytes of index held {r['parse_heap_bytes']} bytes of heap "
                 f"at its peak to keep {r['parsed_kept_bytes']}")
    # A resume reads one copy of the pieces whatever dp is, and only rank 0
    # opens anything (a few requests, not some per rank).
    if not (r["piece_gets_per_copy"] < r["resume_get"] <= r["piece_gets_per_copy"] + 10
            and 0 < r["resume_head"] < 50 and 0 < r["resume_list"] < 10):
        sys.exit(f"{r['case']}: a resume makes {r['resume_head']} HEAD, {r['resume_get']} GET, "
                 f"{r['resume_list']} LIST for {r['piece_gets_per_copy']} piece GETs")
if rows[3]["pieces"] != rows[4]["pieces"] or rows[3]["files"] == rows[4]["files"]:
    sys.exit("the deep cases differ in more than their files")
if not rows[1]["index_bytes"] > rows[0]["index_bytes"]:
    sys.exit("a larger world did not make a larger index (one rng entry per rank)")
PYEOF
}
check "bench-scale: real figures for every case" scale_figures
bench bench-revisions
if nvidia-smi -L >/dev/null 2>&1; then
    bench bench-gpu
else
    expect_error "bench-gpu without a GPU: exit 1, saying so" 1 "no GPU" "$ROOT/scripts/bench-gpu.sh"
    echo "[$NAME] SKIP: bench-gpu: no GPU"
fi

# bench-gpu's PyTorch loop (bench/train_torch_loop.py) at the tiny shape on
# this machine's CPU, so that it cannot rot where there is no GPU: its rows
# have a rate, their labels say what ran (Debian's torch 1.13: the attention
# written out, not SDPA; AdamW not fused; no torch.compile), and their MFU is
# the project's count (6N + 12 L d T, N from a tp-train checkpoint of the same
# shape) over the given peak. Then bench/mfu.py, the count and peak table
# the GPU table uses: the peaks are kernels/cpu/device.c's, the count at
# GPT-2's sizes Hugging Face's (gpt2: 124,439,808; gpt2-medium: 354,823,168).
if "$PY" -c 'import torch' 2>/dev/null; then
    start=$(date +%s)
    TINY="--layers 2 --dim 64 --heads 4 --vocab 256 --seq 32 --device cpu --threads 1 --steps 2 --warmup-steps 1"
    expect_ok "train_torch_loop: the tiny GPT-2 on the CPU, bf16 and fp32, micro-batches 1 and 2" \
        "$PY" "$ROOT/bench/train_torch_loop.py" $TINY --batch 1 2 --dtype bf16 fp32 --peak-tflops 2
    cp "$WORK/.out" "$WORK/loop.jsonl"
    expect_ok "train_torch_loop --mode compile: a row whatever this PyTorch has" \
        "$PY" "$ROOT/bench/train_torch_loop.py" $TINY --batch 1 --mode compile --compile-limit 60
    cp "$WORK/.out" "$WORK/loop-compile.jsonl"
    # A compiler that cannot run here (a GPU machine without a C compiler for
    # Triton, say): torch.compile stood in for by one that fails when the
    # model is first called; the first row says why, the next were not tried.
    failing_compiler() {
        "$PY" - "$ROOT/bench/train_torch_loop.py" $TINY --batch 1 2 --mode compile --compile-limit 60 <<'PYEOF'
import runpy, sys
import torch
def compile_that_fails(model, *args, **kwargs):
    def step(*a, **k):
        raise RuntimeError("backend compiler failed\nno C compiler here (the test's stand-in)")
    return step
torch.compile = compile_that_fails
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PYEOF
    }
    expect_ok "train_torch_loop --mode compile with a compiler that fails: exit 0" failing_compiler
    compile_failure_rows() {
        "$PY" - "$WORK/.out" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
if [r["micro_batch"] for r in rows] != [1, 2]:
    sys.exit(f"rows {rows}")
if rows[0]["note"] != "not compiled: RuntimeError: backend compiler failed":
    sys.exit(f"first row's note: {rows[0]}")
if rows[1]["note"] != "not tried: an earlier compilation failed":
    sys.exit(f"second row's note: {rows[1]}")
if not all(r["compiled"] is False and r["tokens_per_s"] is None for r in rows):
    sys.exit(f"a rate claimed: {rows}")
PYEOF
    }
    check "train_torch_loop --mode compile with a compiler that fails: the first row says why, the next not tried" \
        compile_failure_rows
    expect_ok "tp-train --model tiny: a checkpoint whose parameters are N" \
        "$BIN/tp-train" --model tiny --steps 1 --quiet --device cpu --ckpt-dir "$WORK/tiny-ckpt"
    "$BIN/tp-ckpt" info "$WORK/tiny-ckpt" --json >"$WORK/tiny-info.json"
    echo "[$NAME] train_torch_loop: $(($(date +%s) - start)) s"
    loop_rows() {
        "$PY" - "$WORK/loop.jsonl" "$WORK/loop-compile.jsonl" "$WORK/tiny-info.json" <<'PYEOF'
import inspect, json, math, sys
import torch
import torch.nn.functional as F
eager, compiled, info = sys.argv[1:4]
rows = [json.loads(line) for line in open(eager) if line.startswith("{")]
got = [(r["dtype"], r["micro_batch"]) for r in rows]
if got != [("bf16", 1), ("bf16", 2), ("fp32", 1), ("fp32", 2)]:
    sys.exit(f"rows {got}")
n = sum(math.prod(t["shape"]) for t in json.load(open(info))["tensors"] if t["role"] == "param")
flops = 6 * n + 12 * 2 * 64 * 32  # 6N + 12 L d T
has_sdpa = hasattr(F, "scaled_dot_product_attention")
has_fused = "fused" in inspect.signature(torch.optim.AdamW).parameters
for r in rows:
    where = f"{r['dtype']}, micro-batch {r['micro_batch']}"
    if not (isinstance(r["tokens_per_s"], float) and r["tokens_per_s"] > 0 and r["ms"] > 0):
        sys.exit(f"{where}: tokens/s {r['tokens_per_s']}")
    if r["count_parameters"] != n or r["parameters"] != n or r["flops_per_token"] != flops:
        sys.exit(f"{where}: N {r['count_parameters']} ({r['parameters']} trained), {r['flops_per_token']} "
                 f"FLOPs per token; tp-train's N {n}, so {flops}")
    if r["peak_from"] != "--peak-tflops" or not math.isclose(r["mfu"], r["tokens_per_s"] * flops / 2e12, rel_tol=1e-12):
        sys.exit(f"{where}: MFU {r['mfu']} of {r['peak_from']}, expected {r['tokens_per_s'] * flops / 2e12}")
    # The labels: what ran, never a piece this PyTorch lacks.
    if r["attention"].startswith("sdpa") != has_sdpa or (not has_sdpa and not r["attention"].startswith("math")):
        sys.exit(f"{where}: attention {r['attention']!r} with SDPA {'in' if has_sdpa else 'not in'} torch {torch.__version__}")
    if r["optimizer"] == "AdamW(fused=True)" and not has_fused:
        sys.exit(f"{where}: optimizer {r['optimizer']!r} where torch {torch.__version__} has no fused AdamW")
    if not r["optimizer"].startswith("AdamW"):
        sys.exit(f"{where}: optimizer {r['optimizer']!r}")
    amp = "bf16 autocast" if r["dtype"] == "bf16" else "fp32 (TF32 off)"
    for part in (amp, r["attention"], r["optimizer"], "eager"):
        if part not in r["label"]:
            sys.exit(f"{where}: label {r['label']!r} lacks {part!r}")
c = [json.loads(line) for line in open(compiled) if line.startswith("{")]
if len(c) != 1 or c[0]["mode"] != "compile" or "torch.compile" not in c[0]["label"]:
    sys.exit(f"compile: {c}")
c = c[0]
if not hasattr(torch, "compile"):
    if c["compiled"] is not False or c["tokens_per_s"] is not None or "no torch.compile" not in c["note"]:
        sys.exit(f"compile without torch.compile: {c}")
elif not (c["compiled"] is True and c["tokens_per_s"] > 0 or c["compiled"] is False and c["note"].startswith("not compiled in")):
    sys.exit(f"compile: {c}")
PYEOF
    }
    check "train_torch_loop: rates, labels of what ran, MFU by the project's count" loop_rows
else
    echo "[$NAME] SKIP: train_torch_loop: python3-torch is not installed"
fi
mfu_count() {
    "$PY" - "$ROOT/bench" "$ROOT/kernels/cpu/device.c" <<'PYEOF'
import re, sys
sys.path.insert(0, sys.argv[1])
import mfu
source = open(sys.argv[2]).read()
table = source[source.index("table[] = {"):]
table = [(m, float(t)) for m, t in re.findall(r'\{"([^"]+)", *([0-9.]+)\}', table[:table.index("};")])]
if table != list(mfu.PEAK_BF16_TFLOPS):
    sys.exit(f"bench/mfu.py's peaks {list(mfu.PEAK_BF16_TFLOPS)}, kernels/cpu/device.c's {table}")
for name, peak in (("NVIDIA H100 80GB HBM3", 989.4e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA L40S", 362.05e12),
                   ("NVIDIA L4", 121e12), ("Some Other GPU", 0)):
    if mfu.peak_bf16_flops(name) != peak:
        sys.exit(f"peak of {name}: {mfu.peak_bf16_flops(name)}, expected {peak}")
for shape, n in (((12, 768, 50257, 1024), 124439808), ((24, 1024, 50257, 1024), 354823168)):
    if mfu.gpt2_parameters(*shape) != n:
        sys.exit(f"parameters of {shape}: {mfu.gpt2_parameters(*shape)}, expected {n}")
    layers, dim, _, seq = shape
    if mfu.gpt2_flops_per_token(*shape) != 6 * n + 12 * layers * dim * seq:
        sys.exit(f"FLOPs per token of {shape}: {mfu.gpt2_flops_per_token(*shape)}")
PYEOF
}
check "bench/mfu.py: kernels/cpu/device.c's peaks, GPT-2's parameters" mfu_count
echo "[$NAME] all: $(($(date +%s) - total)) s"

# Nothing the benchmarks started is left running: no process whose
# environment holds this run's scratch root (a few seconds' grace for
# servers that are ending). Only grep runs while it looks, without it: any
# other command started here would carry it.
leftovers() {
    for f in $(env -u BENCH_SCRATCH grep -lzxF "BENCH_SCRATCH=$BENCH_SCRATCH" /proc/[0-9]*/environ 2>/dev/null); do
        f=${f#/proc/}
        printf '%s ' "${f%/environ}"
    done
}
i=0
while [ -n "$(leftovers)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
left=$(leftovers)
check_all "nothing left running (pids: ${left:-none})" '[ -z "$left" ]'
state >"$WORK/state.after"
check_all "docs/BENCHMARKS.md, bench/scratch, BENCH_TMPFS and git worktrees as before" \
    'cmp -s "$WORK/state.before" "$WORK/state.after" || diff "$WORK/state.before" "$WORK/state.after" >&2'
finish
