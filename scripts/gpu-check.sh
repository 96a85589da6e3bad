#!/bin/sh
# gpu-check.sh: checks and measures the CUDA path on a GPU machine, from the
# GPU pack (make gpu-pack; docs/GPU.md). Run from the repository root, with
# the pack beside it:
#
#   scripts/gpu-check.sh [--phase PHASE] [--pack FILE] [--limit SECONDS] OUTDIR
#
# PHASE (default tests), each made to fit in 10 minutes:
#   tests    tests/gpu/test_gpu.sh from the pack: the unit tests (no CUDA
#            case may skip), tp-train --device cuda against PyTorch in fp32,
#            against the CPU, layouts on the GPUs there are, resume GPU <->
#            CPU, tp-reshard on the GPU against the CPU
#   bench    tp-train --kernel-times first (at most 60 s; its table in
#            bench.log), then whether bf16 training repeats (200 steps of
#            124M twice, and in fp32: at most 60 s, the losses side by side
#            in the summary), then scripts/bench-gpu.sh in what is left: tokens/s
#            and MFU of GPT-2 124M and 350M, micro-batch 4 and 16, against
#            PyTorch's loop (SDPA, fused AdamW, torch.compile in time) on the
#            same GPU; the checkpoint stall
#   reshard  scripts/bench-reshard.sh at 1B parameters, once: tp-reshard on
#            the GPU beside the CPU, cp and the h5py baseline
#   profile  GPT-2 124M bf16 steps with tp-train --kernel-times (each
#            operation's host and device time, and the trainer's own; at
#            most 60 s: times.log), then in what is left of the limit
#            training steps under Nsight Compute (ncu): per kernel, time,
#            DRAM bytes, FP32 operations, throughput against the GPU's
#            peaks: what to speed up first (PROFILE_LAUNCHES="SKIP
#            COUNT": a window of launches; PROFILE_KERNELS: a regex)
#   sanitize compute-sanitizer over a few steps of small models, each
#            path of a step once (cuDNN's attention and cuBLASLt's epilogues,
#            a checkpoint saved and resumed, Llama, unaligned widths, fp32's
#            tiled attention and the tensor cores' past their last block's
#            sequence):
#            memcheck, then initcheck, racecheck and synccheck, in what the
#            limit leaves; sanitize.log
#   all      the four phases tests to profile in turn (where a command may run long enough)
#   lease    what one short lease should run, in under 9 minutes and a
#            half: tests, sanitize, then bench, with dcp and judges beside
#            them on the CPU (limits: 220 s for tests, 55 s for sanitize, 385
#            s for the others, which see no GPU, and for the bench what is
#            left of 550 s since the start, 220 s at least: the time the
#            tests do not take goes to the bench's rows; --limit L gives L,
#            L / 4, 7 L / 4 and 5 L / 2); at most eight files
#   dcp      PyTorch distributed checkpoints judged by this machine's PyTorch
#            (2.x; Debian's 1.13 judges them elsewhere): fixtures it writes
#            (kept as dcp-fixtures.tar.gz, for tests/data/dcp-torch2), then
#            tests/e2e/test_dcp.sh with its torch, judging those fixtures
#            among the rest (DCP_FIXTURES_ONLY=1: those alone; docs/DCP.md);
#            CPU only; the fixtures are kept when the phase runs alone
#   judges   the outside judges this machine's Python has and Debian's lacks:
#            tests/e2e/test_export.sh and test_llama_export.sh with its
#            transformers (our GPT-2 and Llama exports loaded by
#            from_pretrained, their loss against tp-train eval); CPU only
# --pack FILE (default build/gpu-pack.tar.xz); --limit (default 560, lease 220): the
# seconds each phase may take before it is stopped, so that its logs and the
# summary are still written.
#
# OUTDIR receives at most eight files (what the device tool brings back):
# info.txt (GPU, driver, CUDA, PyTorch, the pack, whether the pack is this
# repository's, the attention a bf16 step runs), one log per phase run
# (PHASE.log), benchmarks.md (the docs/BENCHMARKS.md sections the
# benchmarks rewrote), times.log (profile), profile.csv and profile.md, and
# summary.txt, whose table is also printed last; the dcp phase, run on its
# own, dcp.log and dcp-fixtures.tar.gz; the judges phase judges.log. (all:
# nine.)
set -u
PHASE=tests
PACK=build/gpu-pack.tar.xz
LIMIT=
usage() {
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" # the header, however long
    exit "$1"
}
while [ $# -gt 0 ]; do
    case $1 in
    --phase) PHASE=${2:?--phase needs a value}; shift 2 ;;
    --pack) PACK=${2:?--pack needs a file}; shift 2 ;;
    --limit) LIMIT=${2:?--limit needs seconds}; shift 2 ;;
    -h | --help) usage 0 ;;
    -*) echo "gpu-check: unknown option $1" >&2; usage 2 >&2 ;;
    *) break ;;
    esac
done
[ $# -eq 1 ] || { echo "gpu-check: one output folder expected" >&2; usage 2 >&2; }
OUTDIR=$1
BESIDE=""
case $PHASE in
tests | bench | reshard | profile | sanitize | dcp | judges) PHASES=$PHASE ;;
all) PHASES="tests bench reshard profile" ;;
lease) PHASES="tests sanitize bench" BESIDE="dcp judges" LIMIT=${LIMIT:-220} ;;
*) echo "gpu-check: unknown phase $PHASE (tests, bench, reshard, profile, sanitize, all, dcp, judges, lease)" >&2; exit 2 ;;
esac
LIMIT=${LIMIT:-560}
BESIDE_LIMIT=$((LIMIT * 7 / 4))
CHECK_START=$(date +%s)
LEASE_DEADLINE=$((LIMIT * 5 / 2)) # a lease's seconds from the start to the bench's end
[ -f "$PACK" ] || { echo "gpu-check: no pack at $PACK (make gpu-pack builds build/gpu-pack.tar.xz)" >&2; exit 2; }
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
SUMMARY="$OUTDIR/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

# The pack, unpacked afresh (a pack from another revision must not mix in).
DEST=${GPU_CHECK_DIR:-${TMPDIR:-/tmp}/tp-gpu-check}
rm -rf "$DEST" && mkdir -p "$DEST" && tar -C "$DEST" -xJf "$PACK" ||
    { echo "gpu-check: cannot unpack $PACK into $DEST" >&2; exit 1; }
P="$DEST/tp-gpu-pack"
PYTHON=$(command -v python3)
export TP_PYTHON="$PYTHON" PATH="$P/build/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Whether the pack was made from this repository as it is: its tracked
# files' checksums (PACK-MANIFEST, gpu-pack.sh) against the files here. The
# phases run the pack's scripts and programs, not these.
# GPU_CHECK_REPO: the repository to compare with (this script's).
REPO=${GPU_CHECK_REPO:-$(cd "$(dirname "$0")/.." && pwd)}
if [ -f "$P/PACK-MANIFEST" ]; then
    DIFFERING=$(cd "$REPO" && sha256sum -c "$P/PACK-MANIFEST" 2>/dev/null | grep -v ': OK$' | sed 's/: .*//')
    if [ -z "$DIFFERING" ]; then STALE="the same files"
    else STALE="STALE PACK: $(echo "$DIFFERING" | wc -l) files differ (first: $(echo "$DIFFERING" | head -n 3 | tr '\n' ' ')); make gpu-pack"
    fi
else
    STALE="unknown (a pack without PACK-MANIFEST)"
fi

NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
{
    if [ "$GPUS" -gt 0 ]; then
        echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1) ($GPUS)"
    else
        echo "GPU: none (nvidia-smi finds none): every phase will fail"
    fi
    echo "CUDA toolkit: $("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo "CUDA driver API: $(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"
    echo "PyTorch: $(timeout -k 5 60 "$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "available:", torch.cuda.is_available())' 2>&1 | tail -n 1)"
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(uname -sr)"
    sed -n '1,3p' "$P/PACK-INFO" | sed 's/^/pack /'
    echo "pack against this repository: $STALE"
    # Where the CUDA libraries were found, or why not (a one-step run); and
    # which attention a bf16 step of GPT-2's shape runs (cuDNN, or why not).
    echo "tp-train --device cuda, one tiny step: $(timeout -k 5 60 "$P/build/bin/tp-train" --model tiny --steps 1 --device cuda 2>&1 | tail -n 1 || true)"
    echo "tp-train --device cuda --dtype bf16, GPT-2 124M at sequence 256, one step: $(timeout -k 5 60 "$P/build/bin/tp-train" \
        --model gpt2-124m --seq 256 --micro-batch 1 --steps 1 --device cuda --dtype bf16 2>&1 | grep -m1 -E '^attention:|rror' || true)"
} >"$OUTDIR/info.txt" 2>&1
cat "$OUTDIR/info.txt"
{
    echo "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ), phases: $PHASES${BESIDE:+ (beside: $BESIDE)}"
    sed -n '1,3p' "$OUTDIR/info.txt"
    grep -E '^pack against|^tp-train --device cuda --dtype bf16' "$OUTDIR/info.txt"
} >>"$SUMMARY"

# in_pack LOG CMD...: CMD from the pack's top directory within the time
# limit, its output in OUTDIR/LOG; returns its exit status (124: stopped).
# A command still running at 90% of its limit has the machine's processes
# (the CPU each last ran on) and the CPUs each of our programs may use
# appended to its log: what a hang or a crawl looked like.
in_pack() {
    log=$1
    shift
    snapshot="$DEST/$log.running"
    rm -f "$snapshot"
    (
        sleep $((LIMIT * 9 / 10))
        echo "== gpu-check: still running after $((LIMIT * 9 / 10)) s"
        ps -eo pid,ppid,etime,pcpu,psr,args | awk '$6 !~ /^\[/' # not the kernel's threads
        for pid in $(ps -eo pid,args | awk '/build\/bin\/tp-/ && !/awk/ {print $1}'); do
            echo "$pid: $(grep -E '^(Threads|Cpus_allowed_list|State)' "/proc/$pid/status" 2>/dev/null | tr '\n' ' ')"
        done
    ) >"$snapshot" 2>&1 &
    watch=$!
    (cd "$P" && timeout --kill-after=20 "$LIMIT" "$@") >"$OUTDIR/$log" 2>&1
    status=$?
    kill "$watch" 2>/dev/null
    wait "$watch" 2>/dev/null
    [ -s "$snapshot" ] && cat "$snapshot" >>"$OUTDIR/$log"
    return "$status"
}

FAILED_PHASES=""
phase_tests() {
    in_pack tests.log env BUILD=build GPU_REQUIRED=1 TEST_JOBS="${TEST_JOBS:-8}" sh tests/gpu/test_gpu.sh
    rc=$?
    say "tests: exit $rc; $(grep -E '^\[test_gpu\] [0-9]+ passed' "$OUTDIR/tests.log" | tail -n 1)"
    grep -E '^FAIL|SKIP' "$OUTDIR/tests.log" | head -n 20 | sed 's/^/  /' | tee -a "$SUMMARY"
}

# The benchmarks write their sections into the pack's docs/BENCHMARKS.md;
# benchmarks.md collects those sections, when the file changed since
# `before` (its checksum before the benchmark): else the sections are the
# repository's old figures, not this run's.
collect_sections() {
    [ "$(cksum <"$P/docs/BENCHMARKS.md")" != "$before" ] || { say "   (no section rewritten: nothing collected)"; return; }
    "$PYTHON" - "$P/docs/BENCHMARKS.md" "$OUTDIR/benchmarks.md" "$@" <<'EOF'
import os, sys
doc, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
text = open(doc).read()
have = open(out).read() if os.path.exists(out) else ""
for name in names:
    begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
    if begin in text and end in text:
        section = text[text.index(begin):text.index(end) + len(end)]
        if begin in have:
            have = have[:have.index(begin)] + section + have[have.index(end) + len(end):]
        else:
            have += section + "\n\n"
open(out, "w").write(have)
EOF
}

# Where a step's time goes without a profiler: GPT-2 124M steps with
# tp-train --kernel-times (each operation's host issue and device tail, and
# the trainer's own time around them), in bf16, then in fp32 (0.89x
# PyTorch's fp32 on the H200, 2026-11-28, with no table of its own), then
# in fp32 with the tensor cores' attention (TP_CUDA_ATTENTION=tf32x3: its
# kernels beside the tiled ones), into LOG, the tables in the summary. About
# 35 s, at most 90: first in the bench and profile phases.
kernel_times() {
    # A run that fails is said and the next still runs (each answers its own question).
    (LIMIT=90 && in_pack "$1" sh -c 'failed=0
        for run in bf16 fp32 fp32:tf32x3; do
            dtype=${run%%:*} attention=${run#"$dtype"}
            attention=${attention#:}
            echo "== --dtype $dtype${attention:+ TP_CUDA_ATTENTION=$attention}"
            TP_CUDA_ATTENTION=$attention build/bin/tp-train --model gpt2-124m --seq 1024 --micro-batch 4 --steps 4 \
                --device cuda --dtype $dtype --kernel-times || { echo "== $run: exit $?"; failed=1; }
        done
        exit $failed')
    say "kernel times: exit $?"
    sed -n '/^== --dtype/p; /^kernel times on/,/^  step /p' "$OUTDIR/$1" | tee -a "$SUMMARY"
}

# Whether bf16 training on the GPU repeats: GPT-2 124M, micro-batch 4, 200
# steps, the same seed and data: twice in bf16 with TP_CUDA_DETERMINISTIC=1
# (every line must be the same: a difference is a defect), once with cuDNN's
# default backward (how far its run-to-run differences carry), once in fp32
# (TF32 off); the loss and gradient norm every 25 steps side by side, and
# whether the deterministic runs agree at every step, into LOG and the
# summary. On the H200 (2026-11-28) two bf16 runs differed from step 2 on,
# and two 200-step runs (one saving synchronously) ended at losses 10.41
# and 10.66, gradient norms 0.85 and 14.7: nondeterminism amplified, or a
# defect? About 30 s, at most 80.
repeatability() {
    (LIMIT=80 && in_pack "$1" sh -c 'failed=0
        for run in bf16-a bf16-b bf16 fp32; do
            dtype=bf16; [ $run = fp32 ] && dtype=fp32
            deterministic=0; [ $run = bf16-a ] || [ $run = bf16-b ] && deterministic=1
            TP_CUDA_DETERMINISTIC=$deterministic build/bin/tp-train --model gpt2-124m --seq 1024 --micro-batch 4 \
                --steps 200 --device cuda --dtype $dtype --quiet --log "$0/$run.jsonl" || { echo "== $run: exit $?"; failed=1; }
        done
        exit $failed' "$DEST")
    say "repeatability: exit $?"
    "$PYTHON" - "$DEST" <<'EOF2' | tee -a "$OUTDIR/$1" "$SUMMARY"
import json, os, sys
runs = ["bf16-a", "bf16-b", "bf16", "fp32"]
steps = {}
for run in runs:
    path = os.path.join(sys.argv[1], run + ".jsonl")
    if os.path.exists(path):
        steps[run] = {x["step"]: x for x in map(json.loads, open(path)) if "event" not in x}
print("  bf16-a, bf16-b: TP_CUDA_DETERMINISTIC=1; bf16: cuDNN's default backward")
print("  step | " + " | ".join("%s loss, norm" % r for r in runs))
def value(x, places):
    return "nan" if x is None else "%.*f" % (places, x)  # tp-train logs a NaN as null
for step in (1, 2, 25, 50, 75, 100, 125, 150, 175, 200):
    cells = ["%s, %s" % (value(steps[r][step]["loss"], 6), value(steps[r][step]["grad_norm"], 3))
             if step in steps.get(r, {}) else "-" for r in runs]
    print("  %4d | %s" % (step, " | ".join(cells)))
a, b = steps.get("bf16-a", {}), steps.get("bf16-b", {})
same = [s for s in a if s in b and (a[s]["loss"], a[s]["grad_norm"]) == (b[s]["loss"], b[s]["grad_norm"])]
first = min((s for s in a if s in b and s not in same), default=None)
print("  deterministic runs: %d of %d steps the same%s" % (len(same), len(a), "" if first is None else
      ", the first difference at step %d" % first))
EOF2
    rm -f "$DEST"/bf16-a.jsonl "$DEST"/bf16-b.jsonl "$DEST"/bf16.jsonl "$DEST"/fp32.jsonl
}

phase_bench() {
    # The kernel times first (the measurement a first run needs most), into
    # bench.log's start; then the bench with what the phase's limit leaves,
    # less 30 s: it ends in time with every row it had time for (a
    # compilation that would not fit is not started).
    started=$(date +%s)
    kernel_times times.tmp
    mv "$OUTDIR/times.tmp" "$DEST/times.log"
    repeatability repeat.tmp
    mv "$OUTDIR/repeat.tmp" "$DEST/repeat.log"
    before=$(cksum <"$P/docs/BENCHMARKS.md")
    budget=$((LIMIT - ($(date +%s) - started) - 30))
    in_pack bench.log env BUILD=build BENCH_GPU_RESHARD=0 BENCH_BUDGET="${BENCH_BUDGET:-$budget}" \
        scripts/bench-gpu.sh
    rc=$?
    { echo "== tp-train --kernel-times, before the bench"; cat "$DEST/times.log"
      echo "== repeatability, before the bench"; cat "$DEST/repeat.log"; } >>"$OUTDIR/bench.log"
    say "bench: exit $rc"
    sed -n '/^| model /,/^$/p; /^| saving /,/^$/p' "$OUTDIR/bench.log" | tee -a "$SUMMARY"
    collect_sections bench-gpu
}

phase_reshard() {
    if [ "$GPUS" -eq 0 ]; then
        say "reshard: no GPU: nothing measured"
        rc=1
        return
    fi
    before=$(cksum <"$P/docs/BENCHMARKS.md")
    in_pack reshard.log env BUILD=build BENCH_REPS=1 scripts/bench-reshard.sh
    rc=$?
    say "reshard: exit $rc"
    grep -E '^\|' "$OUTDIR/reshard.log" | tail -n 12 | tee -a "$SUMMARY"
    collect_sections bench-reshard
}

phase_profile() {
    started=$(date +%s)
    kernel_times times.log
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    if [ -z "$NCU" ]; then
        say "profile: no Nsight Compute (ncu) on this machine: nothing profiled"
        rc=1
        return
    fi
    # Two steps (PROFILE_STEPS) of GPT-2 124M in bf16, micro-batch 4 x 1024: every kernel
    # of a step (the first step's too), with the metrics of a roofline:
    # those this ncu knows (an unknown name would stop it).
    WANTED="gpu__time_duration.sum dram__bytes_read.sum dram__bytes_write.sum
        smsp__sass_thread_inst_executed_op_ffma_pred_on.sum smsp__sass_thread_inst_executed_op_fadd_pred_on.sum
        smsp__sass_thread_inst_executed_op_fmul_pred_on.sum sm__ops_path_tensor_src_bf16_dst_fp32.sum
        sm__throughput.avg.pct_of_peak_sustained_elapsed gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
    KNOWN=$("$NCU" --query-metrics 2>/dev/null | awk '{print $1}')
    METRICS="" DROPPED=""
    for m in $WANTED; do
        if echo "$KNOWN" | grep -qx "${m%%.*}"; then METRICS="$METRICS${METRICS:+,}$m"
        else DROPPED="$DROPPED ${m%%.*}"; fi
    done
    if [ -z "$METRICS" ]; then # a listing of another shape: ask for them all
        METRICS=$(echo $WANTED | tr ' ' ',')
    elif [ -n "$DROPPED" ]; then
        say "profile: this ncu does not list$DROPPED: left out"
    fi
    # profile.csv also holds ncu's and the program's own lines, which
    # gpu-profile.py skips.
    # PROFILE_KERNELS: a regular expression of the kernels to profile (all by default).
    # PROFILE_LAUNCHES="SKIP COUNT": only COUNT launches after the first SKIP
    # (a whole step did not finish within 130 s on the H200, 2026-11-28;
    # "600 80" then "680 200" of 3 steps ran in 30 and 69 s).
    LIMIT=$((LIMIT - ($(date +%s) - started))) # what the kernel times left
    in_pack profile.csv "$NCU" --csv --page raw --clock-control none --metrics "$METRICS" \
        ${PROFILE_KERNELS:+--kernel-name "regex:$PROFILE_KERNELS"} \
        ${PROFILE_LAUNCHES:+--launch-skip "${PROFILE_LAUNCHES% *}" --launch-count "${PROFILE_LAUNCHES#* }"} \
        build/bin/tp-train --model gpt2-124m --seq 1024 --micro-batch 4 --steps "${PROFILE_STEPS:-2}" --device cuda --dtype bf16 --quiet
    rc=$?
    say "profile: exit $rc"
    "$PYTHON" "$P/scripts/gpu-profile.py" "$OUTDIR/profile.csv" >"$OUTDIR/profile.md" 2>&1 || rc=1
    head -n 16 "$OUTDIR/profile.md" | tee -a "$SUMMARY"
}

# compute-sanitizer over a few steps of tp-train on the GPU: out-of-bounds
# and misaligned accesses (memcheck), reads of memory never written
# (initcheck), shared-memory races (racecheck) and barrier misuse
# (synccheck) in every kernel a step runs, ours and the libraries'. Small
# shapes chosen for their paths: head size 64 (cuDNN's attention) with
# widths a multiple of 8 (cuBLASLt's epilogues), a checkpoint saved and
# resumed; Llama with a shared key/value head; widths of no alignment
# (head size 24: the rows attention; GELU apart from the product, an odd
# vocabulary); and fp32's tiled attention at head size 64 over 100
# positions, whose last block's rows and warps lie partly past the
# sequence (the kernels' bounds; 128 positions fill their blocks), and the
# same through the tensor cores' attention (TP_CUDA_ATTENTION=tf32x3: its
# blocks of 64 rows, the last past the sequence; racecheck for its shared
# tiles). A run's arguments may start with VARIABLE=VALUE words: its
# environment. In
# order of worth (what changed since the last GPU run first: a lease gives
# the phase 55 s, and the H200's did not reach synccheck), each in what the
# limit leaves; one not started for want of time says so. SANITIZER: the
# program (else compute-sanitizer on PATH or in the CUDA toolkit).
# initcheck runs in fp32: in bf16 it reports every read of what cuBLAS's
# and cuBLASLt's bf16 kernels (nvjet, bulk tensor stores) wrote as never
# written (H200, 2026-11-28: 311,296 reports in one step, all reads of
# products' outputs that the tests check value by value; with the
# epilogues off too; fp32, whose kernels store plainly: none).
SANITIZE_GPT="--layers 2 --dim 128 --heads 2 --vocab 256 --seq 128 --micro-batch 2"
SANITIZE_LLAMA="--arch llama --layers 2 --dim 128 --heads 2 --kv-heads 1 --vocab 256 --seq 128 --micro-batch 2"
SANITIZE_ODD="--layers 2 --dim 72 --heads 3 --ffn 100 --vocab 250 --seq 40 --micro-batch 3"
SANITIZE_TILED="--layers 1 --dim 128 --heads 2 --vocab 256 --seq 100 --micro-batch 2"
phase_sanitize() {
    started=$(date +%s)
    : >"$OUTDIR/sanitize.log"
    SANITIZER=${SANITIZER:-$(command -v compute-sanitizer ||
        ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer 2>/dev/null |
        head -n 1)}
    if [ -z "$SANITIZER" ]; then
        say "sanitize: no compute-sanitizer on this machine (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin): nothing checked"
        rc=1
        return
    fi
    ckpt="$DEST/sanitize-ckpt"
    rm -rf "$ckpt"
    rc=0
    # NAME TOOL [VARIABLE=VALUE...] tp-train's arguments (split into words as they are)
    while read -r name tool args; do
        settings=""
        while :; do
            # the first word a setting, with more after it (the last is tp-train's)
            case ${args%% *} in
            "$args") break ;;
            [A-Z_]*=*) settings="$settings ${args%% *}" args=${args#* } ;;
            *) break ;;
            esac
        done
        left=$((LIMIT - ($(date +%s) - started)))
        [ "$left" -gt 0 ] || left=0
        if [ "$left" -lt 10 ]; then
            say "sanitize: $name: not started, $left s of the limit left"
            rc=1
            continue
        fi
        echo "== $name:$settings $SANITIZER --tool $tool tp-train $args (at most $left s)" >>"$OUTDIR/sanitize.log"
        run_start=$(date +%s)
        # Into OUTDIR/sanitize.run, moved to DEST once appended to the log;
        # stdin from /dev/null: the runs' list is this loop's.
        # TP_CUDA_ATTENTION only where the run sets it (not this shell's).
        # shellcheck disable=SC2086
        (LIMIT=$left && in_pack sanitize.run env -u TP_CUDA_ATTENTION $settings "$SANITIZER" --tool "$tool" \
            --error-exitcode 99 \
            build/bin/tp-train --device cuda $args) </dev/null
        status=$?
        mv "$OUTDIR/sanitize.run" "$DEST/sanitize.run"
        cat "$DEST/sanitize.run" >>"$OUTDIR/sanitize.log"
        verdict=$(grep -E '^========= [A-Z]+ SUMMARY:' "$DEST/sanitize.run" | tail -n 1 | sed 's/^========= //')
        case $status in
        0) ;;
        99) rc=1 ;;
        124 | 137) rc=1 verdict="stopped at the limit${verdict:+; $verdict}" ;;
        *) rc=1 verdict="exit $status${verdict:+; $verdict}: $(grep -v '^=========' "$DEST/sanitize.run" | tail -n 1)" ;;
        esac
        say "sanitize: $name ($tool, $(($(date +%s) - run_start)) s): ${verdict:-no summary line}"
        # The first report: what, then where (the kernel, or the call).
        grep -m 1 -A 2 -E '^========= (Invalid|Misaligned|Uninitialized|Program hit|Error|Race|Barrier|Warning|Potential|Out-of-range|Malloc|Cuda API)' \
            "$DEST/sanitize.run" | sed 's/^/  /' | tee -a "$SUMMARY"
        # A machine where the tool cannot attach (gVisor: "Device not
        # supported", KINDS.md) fails every run alike: the rest not tried.
        if grep -q 'Device not supported' "$DEST/sanitize.run"; then
            say "sanitize: compute-sanitizer does not support this device here: the other runs not tried"
            break
        fi
    done <<RUNS
memcheck-gpt-bf16 memcheck $SANITIZE_GPT --dtype bf16 --steps 2 --ckpt-dir $ckpt --ckpt-every 2
memcheck-tiled-fp32 memcheck $SANITIZE_TILED --steps 1
memcheck-tf32x3-fp32 memcheck TP_CUDA_ATTENTION=tf32x3 $SANITIZE_TILED --steps 1
memcheck-odd-bf16 memcheck $SANITIZE_ODD --dtype bf16 --steps 2
memcheck-llama-bf16 memcheck $SANITIZE_LLAMA --dtype bf16 --steps 2
memcheck-gpt-bf16-resumed memcheck $SANITIZE_GPT --dtype bf16 --steps 3 --ckpt-dir $ckpt --resume
racecheck-tf32x3-fp32 racecheck TP_CUDA_ATTENTION=tf32x3 $SANITIZE_TILED --steps 1
memcheck-odd-fp32 memcheck $SANITIZE_ODD --steps 2
initcheck-gpt-fp32 initcheck $SANITIZE_GPT --steps 1
racecheck-gpt-fp32 racecheck $SANITIZE_GPT --steps 1
racecheck-odd-bf16 racecheck $SANITIZE_ODD --dtype bf16 --steps 1
synccheck-odd-bf16 synccheck $SANITIZE_ODD --dtype bf16 --steps 1
RUNS
    rm -rf "$ckpt" "$DEST/sanitize.run"
}

phase_dcp() {
    rm -rf "$DEST/fx"
    in_pack dcp.log sh -c "\"$PYTHON\" tests/formats/dcp_torch.py fixtures \"$DEST/fx\" &&
        env BUILD=build DCP_FIXTURES=\"$DEST/fx\" sh tests/e2e/test_dcp.sh"
    rc=$?
    # The fixtures come back when the phase ran alone (tests/data/dcp-torch2
    # holds a machine's already; a lease has no file to spare for them).
    [ "$PHASE" = dcp ] && [ -d "$DEST/fx" ] && tar -C "$DEST/fx" -czf "$OUTDIR/dcp-fixtures.tar.gz" .
    rm -rf "$DEST/fx"
    say "dcp: exit $rc; $(grep -E '^\[test_dcp\] [0-9]+ passed' "$OUTDIR/dcp.log" | tail -n 1)"
    grep -E '^FAIL|SKIP|Error' "$OUTDIR/dcp.log" | head -n 20 | sed 's/^/  /' | tee -a "$SUMMARY"
}

phase_judges() {
    in_pack judges.log sh -c 'fail=0
        for t in test_export test_llama_export; do env BUILD=build sh tests/e2e/$t.sh || fail=1; done
        exit $fail'
    rc=$?
    say "judges: exit $rc; $(grep -E '^\[test_(llama_)?export\] [0-9]+ passed' "$OUTDIR/judges.log" | tr '\n' ' ')"
    grep -E "^FAIL|SKIP|transformers" "$OUTDIR/judges.log" | head -n 20 | sed 's/^/  /' | tee -a "$SUMMARY"
}

# run_phase PHASE [NOTE]: the phase within $LIMIT, its time in the summary;
# its exit status is rc's, and also lands in DEST/PHASE.rc.
run_phase() {
    echo "== $1 (at most $LIMIT s)"
    start=$(date +%s)
    rc=0
    "phase_$1"
    say "   ($1: $(($(date +%s) - start)) s of at most $LIMIT${2:+, $2})"
    echo "$rc" >"$DEST/$1.rc"
    return "$rc"
}

# Phases beside the others (lease): CPU work, each in a subshell with its
# own limit.
for phase in $BESIDE; do # CPU phases: no GPU for them, so that they never hold the measured one
    (LIMIT=$BESIDE_LIMIT && export CUDA_VISIBLE_DEVICES= && run_phase "$phase" beside) &
done
for phase in $PHASES; do
    if [ "$PHASE" = lease ] && [ "$phase" = sanitize ]; then # a quarter of the limit: its first runs
        (LIMIT=$((LIMIT / 4)) && run_phase "$phase") || FAILED_PHASES="$FAILED_PHASES $phase"
    elif [ "$PHASE" = lease ] && [ "$phase" = bench ]; then # what the lease's deadline leaves, the limit at least
        left=$((LEASE_DEADLINE - ($(date +%s) - CHECK_START)))
        (LIMIT=$((left > LIMIT ? left : LIMIT)) && run_phase "$phase") || FAILED_PHASES="$FAILED_PHASES $phase"
    else
        run_phase "$phase" || FAILED_PHASES="$FAILED_PHASES $phase"
    fi
done
wait
for phase in $BESIDE; do
    [ "$(cat "$DEST/$phase.rc" 2>/dev/null)" = 0 ] || FAILED_PHASES="$FAILED_PHASES $phase"
done
say "failed phases:${FAILED_PHASES:- none}"
echo
echo "== summary ($OUTDIR)"
cat "$SUMMARY"
[ -z "$FAILED_PHASES" ]
