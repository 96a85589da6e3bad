#!/bin/sh
# The GPU pack (scripts/gpu-pack.sh) is self-contained: unpacked into an
# empty root that holds only glibc (the libc6 package's libraries and its
# loader) and the kernel's /proc, /dev and /sys, its programs run: tp-ckpt
# synth, tp-reshard --verify, tp-train --device cpu at tp2 under the pack's
# launcher (tp-mpirun), and its unit tests; every program run directly (no
# tp-mpirun, no LD_LIBRARY_PATH), and with LD_LIBRARY_PATH naming a decoy of
# every bundled library; and every ELF file of the pack (programs, libraries,
# plugins) resolves all it needs in the root. Also: the archive stays under
# its size limit, and the CUDA library search names where it looked when
# neither cuBLAS nor NCCL is there. Needs a CUDA build, dpkg, and the right
# to make a mount namespace and change root (root, or an unprivileged user
# namespace); skipped, saying why, without them.
# takes: about 180 s alone on 2 cores, 400-700 s beside two other tests (scripts/run-tests.py orders by it)
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"

B="$ROOT/${BUILD:-build}"
skip() {
    echo "[$NAME] SKIP: $1; nothing run"
    exit 0
}
grep -q '^CUDA=1 ' "$B/config" 2>/dev/null || skip "${BUILD:-build} is not a CUDA build"
command -v dpkg >/dev/null || skip "no dpkg: glibc's files cannot be told apart"
# How to enter a root of our own: as root, a mount namespace; otherwise a
# user namespace that maps us to root in it.
if unshare --mount --propagation private true 2>/dev/null; then ISOLATE="unshare --mount --propagation private"
elif unshare --user --map-root-user --mount true 2>/dev/null; then ISOLATE="unshare --user --map-root-user --mount"
else skip "no mount namespace can be made here (not root, no user namespaces)"; fi

PACK="$WORK/gpu-pack.tar.xz"
# gpu-check.sh unpacks into $TMPDIR/tp-gpu-check by default, a name every
# run on the machine shares: two suites side by side would remove each
# other's unpacked pack mid-run.
export GPU_CHECK_DIR="$WORK/gpu-check"
# The pack as make gpu-pack makes it (one compression: the archive checked
# is the one a GPU machine gets), under the bound gpu-pack enforces.
LIMIT_BYTES=$((48 * 1048576))
expect_ok "make the pack" env BUILD="${BUILD:-build}" PACK="$PACK" "$ROOT/scripts/gpu-pack.sh"
size=$(stat -c %s "$PACK" 2>/dev/null || echo 0)
check_all "the pack is at most 48 MiB ($size bytes)" '[ "$size" -gt 0 ] && [ "$size" -le "$LIMIT_BYTES" ]'

# The root: the pack, glibc, and mount points.
R="$WORK/root"
mkdir -p "$R/proc" "$R/dev" "$R/sys" "$R/tmp" "$R/out"
expect_ok "unpack the pack" tar -C "$R" -xJf "$PACK"
P=/tp-gpu-pack
dpkg -L libc6 | while read -r f; do
    case $f in
    *.so | *.so.* | */ld-linux*) [ -f "$f" ] && mkdir -p "$R$(dirname "$f")" && cp -L "$f" "$R$f" ;;
    esac
done
check "the root holds the loader" [ -f "$R/lib64/ld-linux-x86-64.so.2" ]
check "the root has no shell" [ ! -e "$R/bin/sh" ]
# Decoys: a file named as each bundled library, which no loader can load (it
# stops at the first it opens), in a directory for LD_LIBRARY_PATH: a GPU
# machine's LD_LIBRARY_PATH may name another Open MPI (NVIDIA's containers
# name HPC-X's, libmpi.so.40 too), and the bundled libraries must find their
# siblings before it.
mkdir -p "$R/decoy"
for lib in "$R$P"/build/lib/*; do echo "not a library" >"$R/decoy/${lib##*/}"; done

# in_root NAME [VAR=VALUE...] CMD...: CMD in the root, from the pack's top
# directory, with the environment given and the variables named; its output
# and exit status land in $R/out/NAME.*.
# Every step runs in one namespace (the mounts are made once).
STEPS="$WORK/steps"
: >"$STEPS"
in_root() {
    name=$1
    shift
    echo "$name $*" >>"$STEPS"
}
in_root synth $P/build/bin/tp-ckpt synth -o /tmp/c --tp 2 --model tiny --optim
in_root reshard $P/build/bin/tp-reshard /tmp/c --to tp1 -o /tmp/r --verify
in_root train $P/build/bin/tp-mpirun -np 2 $P/build/bin/tp-train --model tiny --tp 2 --micro-batch 2 --steps 3 \
    --device cpu --ckpt-dir /tmp/run --ckpt-every 3 --log /tmp/train.jsonl --quiet
in_root verify $P/build/bin/tp-ckpt verify /tmp/run/step_00000003
in_root cuda $P/build/bin/tp-train --model tiny --steps 1 --device cuda --quiet
# Every program run directly, as a user runs it: no tp-mpirun, and no
# LD_LIBRARY_PATH (the environment below has none). The bundled libraries
# find each other through run paths of their own: Debian's libmpi.so.40
# carries DT_RUNPATH /usr/lib/x86_64-linux-gnu/openmpi/lib, which hid the
# programs' run path for libmpi's own dependencies (issue 53).
for prog in tp-train tp-ckpt tp-reshard tp-elastic tp-mpirun; do
    in_root "help-$prog" $P/build/bin/$prog --help
done
in_root direct-train $P/build/bin/tp-train --layers 2 --dim 64 --heads 4 --vocab 256 --seq 32 --steps 3 \
    --device cpu --ckpt-dir /tmp/direct --ckpt-every 3 --quiet
in_root direct-verify $P/build/bin/tp-ckpt verify /tmp/direct/step_00000003
in_root direct-plan $P/build/bin/tp-elastic plan --world 2 --model tiny --global-batch 8
in_root decoy-train LD_LIBRARY_PATH=/decoy $P/build/bin/tp-train --layers 2 --dim 64 --heads 4 --vocab 256 \
    --seq 32 --steps 1 --device cpu --quiet
in_root decoy-mpirun LD_LIBRARY_PATH=/decoy $P/build/bin/tp-mpirun -np 2 $P/build/bin/tp-train --model tiny --tp 2 \
    --micro-batch 2 --steps 1 --device cpu --quiet
# What the loader makes of every ELF file of the pack (the programs, unit
# tests, benchmarks, bundled libraries, Open MPI's and PMIx's plugins,
# mpirun and orted), each on its own: a library or plugin as the first
# object loaded, so that only its own run path serves its dependencies.
(cd "$R$P" && find build -type f \( -perm -u+x -o -name '*.so*' \) | sort) | while read -r f; do
    [ "$(head -c 4 "$R$P/$f" | od -An -c | tr -d ' ')" = "177ELF" ] || continue
    echo "$f"
done >"$WORK/elf"
n=0
while read -r f; do
    n=$((n + 1))
    in_root "list-$n" /lib64/ld-linux-x86-64.so.2 --list "$P/$f"
done <"$WORK/elf"
# The unit tests, but two that start programs through a shell, which this
# root lacks and a GPU machine has: test_layers (mpirun) and test_elastic
# (the orchestrator's process handling); and but the longest numerical
# property tests (the planner at every world up to 64; the trainer's ZeRO,
# interleaved and sequence-parallel runs), which load nothing the binaries'
# other tests do not, and run in the suite's own unit tests (run-tests.py):
# 35 s of the root's 70.
HEAVY='*_up_to_64|zero1_trains_as_without_it|zero3_trains_as_without_it|the_interleaved_schedule_trains_as_1f1b|sequence_parallelism_trains_as_without_it'
for t in $(cd "$R$P" && ls build/tests/*/test_*); do
    case $t in */test_layers | */test_elastic) continue ;; esac
    in_root "unit-$(basename "$t")" "$P/$t" --jobs 2 "--filter=*/!($HEAVY)"
done

# A clean environment: what Open MPI needs as root on a small machine.
run env -i PATH="$PATH" HOME=/tmp TMPDIR=/tmp OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none \
    $ISOLATE sh -c '
set -f # the words of each step as they are: a criterion filter is a pattern
R=$1 STEPS=$2
mount -t proc proc "$R/proc" && mount --rbind /dev "$R/dev" && mount --rbind /sys "$R/sys" || exit 1
while read -r name cmd; do
    # shellcheck disable=SC2086
    set -- $cmd
    vars=
    while [ $# -gt 0 ] && [ "${1%%=*}" != "$1" ]; do
        vars="$vars $1"
        shift
    done
    # shellcheck disable=SC2086
    env $vars unshare --root="$R" --wd=/tp-gpu-pack "$@" >"$R/out/$name.out" 2>"$R/out/$name.err" </dev/null
    echo $? >"$R/out/$name.rc"
done <"$STEPS"' sh "$R" "$STEPS"
check "the root was entered, its file systems mounted (exit $RC)" [ "$RC" -eq 0 ]

# step_ok NAME WHAT: the step exited 0; else its output is shown.
step_ok() {
    rc=$(cat "$R/out/$1.rc" 2>/dev/null || echo none)
    if [ "$rc" = 0 ]; then pass
    else
        cp "$R/out/$1.out" "$WORK/.out" 2>/dev/null
        cp "$R/out/$1.err" "$WORK/.err" 2>/dev/null
        failed "in the root: $2 (exit $rc)"
    fi
}
step_ok synth "tp-ckpt synth"
step_ok reshard "tp-reshard --verify"
step_ok train "tp-train at tp2 under tp-mpirun"
step_ok verify "tp-ckpt verify of the trained checkpoint"
check "in the root: 3 steps logged" [ "$(grep -c '"step"' "$R/tmp/train.jsonl" 2>/dev/null)" -ge 3 ]
check_all "in the root: tp-train --device cuda fails (no GPU), in one line" \
    '[ "$(cat "$R/out/cuda.rc")" != 0 ] && [ "$(wc -l <"$R/out/cuda.err")" -eq 1 ]'
for prog in tp-train tp-ckpt tp-reshard tp-elastic tp-mpirun; do
    step_ok "help-$prog" "$prog --help, run directly"
done
step_ok direct-train "tp-train --device cpu, run directly (no tp-mpirun, no LD_LIBRARY_PATH)"
step_ok direct-verify "tp-ckpt verify of the directly trained checkpoint"
step_ok direct-plan "tp-elastic plan, run directly"
step_ok decoy-train "tp-train run directly, LD_LIBRARY_PATH naming a decoy of every bundled library"
step_ok decoy-mpirun "tp-train at tp2 under tp-mpirun, LD_LIBRARY_PATH naming the decoys"
check_all "in the root: the pack's ELF files found ($(wc -l <"$WORK/elf"): programs, libraries, plugins)" \
    '[ "$(grep -c "^build/lib/lib" "$WORK/elf")" -ge 10 ] && grep -q "^build/mpi/lib/openmpi/mca_" "$WORK/elf" &&
     grep -q "^build/mpi/bin/orted$" "$WORK/elf" && grep -q "^build/bin/tp-train$" "$WORK/elf"'
# Each resolves every dependency in the root, in the pack or glibc: the
# loader's error names the first library it could not find.
n=0
while read -r f; do
    n=$((n + 1))
    if [ "$(cat "$R/out/list-$n.rc" 2>/dev/null)" != 0 ] || grep -q "not found" "$R/out/list-$n.out"; then
        echo "$f ($(sed -n 's/.*error while loading shared libraries: \([^:]*\):.*/\1/p' "$R/out/list-$n.err" |
            head -n 1)$(grep "not found" "$R/out/list-$n.out" | awk '{printf " %s", $1}'))"
    fi
done <"$WORK/elf" >"$WORK/unresolved"
check_all "in the root: every ELF file of the pack loads all it needs ($(wc -l <"$WORK/unresolved") do not, \
first: $(head -n 3 "$WORK/unresolved" | tr '\n' ' '))" '[ ! -s "$WORK/unresolved" ]'
for rc in "$R"/out/unit-*.rc; do
    step=$(basename "$rc" .rc)
    step_ok "$step" "${step#unit-}"
done
# Every binary ran tests there (the filter leaves each some).
none=$(for f in "$R"/out/unit-*.err; do grep -q "Synthesis: Tested: [1-9]" "$f" || basename "$f" .err; done)
check_all "in the root: every unit test binary ran tests (none: ${none:-none})" '[ -z "$none" ]'
# --- gpu-check.sh here, without a GPU: it unpacks the pack, reports the
# machine and whether the pack is this repository's, and every phase fails
# saying why; at most nine files (--phase all: times.log since the profile
# phase runs tp-train --kernel-times).
C="$WORK/check"
run "$ROOT/scripts/gpu-check.sh" --phase all --pack "$PACK" --limit 60 "$C"
check "gpu-check without a GPU fails" [ "$RC" -ne 0 ]
check "gpu-check: info.txt names the pack's revision" grep -q '^pack revision: ' "$C/info.txt"
check "gpu-check: the summary says there is no GPU" grep -q '^GPU: none' "$C/summary.txt"
check "gpu-check: the summary names the failed phases" grep -qx 'failed phases: tests bench reshard profile' \
    "$C/summary.txt"
check "gpu-check: the summary is printed last" [ "$(tail -n 1 "$WORK/.out")" = "$(tail -n 1 "$C/summary.txt")" ]
check_all "gpu-check: at most 9 files ($(ls "$C" | wc -l))" '[ "$(ls "$C" | wc -l)" -le 9 ]'
check "gpu-check: the kernel times tried, and failed without a GPU" grep -q '^kernel times: exit [1-9]' "$C/summary.txt"
check "gpu-check: the pack is this repository's" grep -qx 'pack against this repository: the same files' "$C/info.txt"
check "gpu-check: no benchmark section collected where none was rewritten" [ ! -e "$C/benchmarks.md" ]
# A lease brings back at most the 8 files the device tool returns (dcp's
# fixtures stay behind); compared with another tree (here an empty one), the
# pack is said to be stale, naming files.
L="$WORK/check-lease"
mkdir -p "$WORK/empty-repo"
# compute-sanitizer's stand-in (the CUDA toolkit here has none, and no GPU
# would run under it): it logs what it was asked to run, which must be the
# pack's tp-train, with the attention chosen where a run sets it, and
# answers as compute-sanitizer does: no error, a race
# check's summary, or for Llama an invalid read in a kernel (exit with the
# code asked for).
cat >"$WORK/fake-sanitizer" <<'EOF'
#!/bin/sh
[ "$1" = --tool ] && [ "$3" = --error-exitcode ] || { echo "unexpected: $*"; exit 2; }
tool=$2 code=$4
shift 4
echo "$tool ${TP_CUDA_ATTENTION:+TP_CUDA_ATTENTION=$TP_CUDA_ATTENTION }$*" >>"$FAKE_SANITIZER_LOG"
[ -x "$1" ] || { echo "no program $1 in $(pwd)"; exit 1; }
case "$tool $*" in
*"--arch llama"*)
    printf '%s\n' "========= Invalid __global__ read of size 4 bytes" "=========     at rope_forward_kernel+0x90" \
        "=========     by thread (3,0,0) in block (1,0,0)" "=========" "========= ERROR SUMMARY: 1 error"
    exit "$code" ;;
racecheck*) echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" ;;
*) echo "========= ERROR SUMMARY: 0 errors" ;;
esac
EOF
chmod +x "$WORK/fake-sanitizer"
export FAKE_SANITIZER_LOG="$WORK/fake-sanitizer.log"
# A limit of 2 s (3 s for the phases beside, none for sanitize): what is
# checked here is the files and the order, and dcp and judges would
# otherwise run their 14 s for nothing.
run env GPU_CHECK_REPO="$WORK/empty-repo" SANITIZER="$WORK/fake-sanitizer" "$ROOT/scripts/gpu-check.sh" \
    --phase lease --pack "$PACK" --limit 2 "$L"
check_all "gpu-check --phase lease: tests, sanitize, then bench" \
    '[ "$(grep -E -o "^(tests|sanitize|bench): " "$L/summary.txt" | uniq | tr -d "\n")" = "tests: sanitize: bench: " ]'
check_all "gpu-check --phase lease: sanitize has a quarter of the limit (none of 2 s: no run started)" \
    'grep -qx "sanitize: memcheck-gpt-bf16: not started, 0 s of the limit left" "$L/summary.txt" &&
     grep -qx "sanitize: synccheck-odd-bf16: not started, 0 s of the limit left" "$L/summary.txt" &&
     [ ! -e "$FAKE_SANITIZER_LOG" ]'
check_all "gpu-check --phase lease: the tests' limit is the limit, the bench's the lease's 5 s less what went before, 2 at least" \
    'grep -qx "   (tests: [0-9]* s of at most 2)" "$L/summary.txt" &&
     grep -qx "   (bench: [0-9]* s of at most [2-5])" "$L/summary.txt"'
check "gpu-check --phase lease without a GPU fails" [ "$RC" -ne 0 ]
check_all "gpu-check --phase lease: at most 8 files ($(ls "$L" | tr '\n' ' '))" '[ "$(ls "$L" | wc -l)" -le 8 ]'
check "gpu-check --phase lease: no DCP fixtures" [ ! -e "$L/dcp-fixtures.tar.gz" ]
check "gpu-check: a pack from another tree is stale, in the summary" grep -q '^pack against this repository: STALE PACK: [0-9]* files differ (first: [^)]' "$L/summary.txt"
expect_error "gpu-check: an unknown phase" 2 "unknown phase fast" "$ROOT/scripts/gpu-check.sh" --phase fast "$C"
# The sanitize phase, through the stand-in: every run, in order, on the
# pack's tp-train; each run's verdict, and the first report's what and where.
S="$WORK/check-sanitize"
run env SANITIZER="$WORK/fake-sanitizer" TP_CUDA_ATTENTION=rows "$ROOT/scripts/gpu-check.sh" --phase sanitize \
    --pack "$PACK" --limit 120 "$S"
check "gpu-check --phase sanitize: an error found fails the phase" [ "$RC" -ne 0 ]
check_all "gpu-check --phase sanitize: twelve runs, in order ($(awk '{print $1}' "$FAKE_SANITIZER_LOG" 2>/dev/null | tr '\n' ' '))" \
    '[ "$(awk "{print \$1}" "$FAKE_SANITIZER_LOG" | tr "\n" " ")" = "memcheck memcheck memcheck memcheck memcheck memcheck racecheck memcheck initcheck racecheck racecheck synccheck " ]'
check_all "gpu-check --phase sanitize: a bf16 step on the GPU saving a checkpoint, then resuming it" \
    'sed -n 1p "$FAKE_SANITIZER_LOG" | grep -q "^memcheck build/bin/tp-train --device cuda .* --dtype bf16 --steps 2 --ckpt-dir .* --ckpt-every 2$" &&
     sed -n 6p "$FAKE_SANITIZER_LOG" | grep -q "^memcheck build/bin/tp-train --device cuda .* --dtype bf16 --steps 3 --ckpt-dir .* --resume$"'
check_all "gpu-check --phase sanitize: fp32's tiled attention over 100 positions (blocks partly past them)" \
    'sed -n 2p "$FAKE_SANITIZER_LOG" | grep -q "^memcheck build/bin/tp-train --device cuda --layers 1 --dim 128 --heads 2 .*--seq 100 "'
check_all "gpu-check --phase sanitize: the same through the tensor cores' attention, memcheck and racecheck" \
    'sed -n 3p "$FAKE_SANITIZER_LOG" | grep -q "^memcheck TP_CUDA_ATTENTION=tf32x3 build/bin/tp-train --device cuda --layers 1 --dim 128 --heads 2 .*--seq 100 " &&
     sed -n 7p "$FAKE_SANITIZER_LOG" | grep -q "^racecheck TP_CUDA_ATTENTION=tf32x3 build/bin/tp-train --device cuda --layers 1 .*--seq 100 " &&
     ! sed -n 2p "$FAKE_SANITIZER_LOG" | grep -q TP_CUDA_ATTENTION'
check "gpu-check --phase sanitize: the other runs get no TP_CUDA_ATTENTION (this shell's rows set aside)" \
    [ "$(grep -c TP_CUDA_ATTENTION "$FAKE_SANITIZER_LOG")" -eq 2 ]
check "gpu-check --phase sanitize: a clean run's verdict" \
    grep -Eq '^sanitize: memcheck-gpt-bf16 \(memcheck, [0-9]+ s\): ERROR SUMMARY: 0 errors$' "$S/summary.txt"
check "gpu-check --phase sanitize: a race check's verdict" \
    grep -Eq '^sanitize: racecheck-gpt-fp32 \(racecheck, [0-9]+ s\): RACECHECK SUMMARY: 0 hazards' "$S/summary.txt"
check_all "gpu-check --phase sanitize: the error, what and where" \
    'grep -A 2 -E "^sanitize: memcheck-llama-bf16 \(memcheck, [0-9]+ s\): ERROR SUMMARY: 1 error$" "$S/summary.txt" |
     tr "\n" "|" | grep -q "|  ========= Invalid __global__ read of size 4 bytes|  =========     at rope_forward_kernel"'
check "gpu-check --phase sanitize: the tools' output in sanitize.log" grep -q 'at rope_forward_kernel' "$S/sanitize.log"
# A device the tool cannot attach to: the first run says so, no other is tried.
: >"$FAKE_SANITIZER_LOG"
cat >"$WORK/unsupported-sanitizer" <<'EOF'
#!/bin/sh
echo "$2" >>"$FAKE_SANITIZER_LOG"
printf '%s\n' "========= Error: Device not supported" "========= ERROR SUMMARY: 0 errors"
exit 1
EOF
chmod +x "$WORK/unsupported-sanitizer"
run env SANITIZER="$WORK/unsupported-sanitizer" "$ROOT/scripts/gpu-check.sh" --phase sanitize --pack "$PACK" --limit 120 \
    "$WORK/check-unsupported"
check_all "gpu-check --phase sanitize: a device the tool does not support stops the phase at its first run" \
    '[ "$RC" -ne 0 ] && [ "$(wc -l <"$FAKE_SANITIZER_LOG")" -eq 1 ] &&
     grep -q "^sanitize: compute-sanitizer does not support this device here" "$WORK/check-unsupported/summary.txt"'
# The dcp phase needs no GPU: here with Debian's PyTorch (first on PATH, as
# the GPU image's is there), PyTorch's fixtures kept for the repository.
if "$PY" -c 'import torch, h5py' 2>/dev/null; then
    D="$WORK/check-dcp"
    # The phase runs test_dcp (about 100 s alone, 260-320 s beside another
    # suite): 300 s was outlived beside make asan; the bound is for hangs.
    # Its test_dcp judges the fixtures the phase wrote, only those: with the
    # suite's torch, the rest would repeat test_dcp.sh as the suite runs it.
    run env PATH="$(dirname "$PY_INTERPRETER"):$PATH" DCP_FIXTURES_ONLY=1 "$ROOT/scripts/gpu-check.sh" --phase dcp \
        --pack "$PACK" --limit 600 "$D"
    check "gpu-check --phase dcp passes with this machine's PyTorch" [ "$RC" -eq 0 ]
    check "gpu-check --phase dcp: the test's summary in the summary" grep -q '^dcp: exit 0; \[test_dcp\] [0-9]* passed, 0 failed' \
        "$D/summary.txt"
    check_all "gpu-check --phase dcp: PyTorch's fixtures kept, a DCP checkpoint each" \
        'tar -tzf "$D/dcp-fixtures.tar.gz" | grep -q "cols2/.metadata" && tar -tzf "$D/dcp-fixtures.tar.gz" | grep -q "grid4/.metadata"'
    check_all "gpu-check --phase dcp: at most 8 files ($(ls "$D" | wc -l))" '[ "$(ls "$D" | wc -l)" -le 8 ]'
else
    echo "[SKIP] [$NAME] gpu-check --phase dcp: python3-torch is not installed"
fi

# --- gpu-profile.py on an Nsight Compute CSV made for it: kernel A, 2 ms,
# memory-bound at 90% (nothing to gain at 80%); kernel B<float>, two
# launches of 1000 us at 20% SM, 2 GFLOP/s of FP32 and 2 Gop/s of bf16
# tensor work: compute-bound, 0.5 ms at 80%, saving 1.5.
cat >"$WORK/ncu.csv" <<'EOF'
==PROF== Connected to process 1
"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","smsp__sass_thread_inst_executed_op_ffma_pred_on.sum","smsp__sass_thread_inst_executed_op_fadd_pred_on.sum","smsp__sass_thread_inst_executed_op_fmul_pred_on.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","sm__ops_path_tensor_src_bf16_dst_fp32.sum"
"","","usecond","Mbyte","Mbyte","inst","inst","inst","%","%",""
"0","A(float*, int)","2,000","3,000","1,000","0","0","0","40","90","0"
the program's own line
"1","void B<float, 4>(float const*)","1,000","10","0","1000000","0","0","20","10","2,000,000"
"2","void B<float, 4>(float const*)","1,000","10","0","1000000","0","0","20","10","2,000,000"
EOF
run "$PY" "$ROOT/scripts/gpu-profile.py" "$WORK/ncu.csv"
check "gpu-profile: kernel A, memory-bound, nothing to save" \
    grep -q '^| A | 1 | 2.000 | 50.0% | 4000.0 | 2000 | 0 | 0 | 40 | 90 | memory | 2.250 | 0.000 |$' "$WORK/.out"
check "gpu-profile: kernel B, compute-bound, 1.5 ms to save" \
    grep -q '^| B | 2 | 2.000 | 50.0% | 20.0 | 10 | 2 | 2 | 20 | 10 | compute | 0.500 | 1.500 |$' "$WORK/.out"
check "gpu-profile: the totals" \
    grep -q '^2 kernels, 3 launches, 4.000 ms on the GPU; at 80% of each kernel.s bound: 1.500 ms less (38%)$' "$WORK/.out"
finish
