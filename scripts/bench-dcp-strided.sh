#!/bin/sh
# make bench-dcp-strided: a DCP chunk torch saved transposed against the same
# tensor saved contiguous (docs/DCP.md, "strided chunks"). PyTorch saves one
# fp32 [N, N] tensor `w` twice with FileSystemWriter: as w.t() (strides
# (1, N): a chunk dense in another order, read in slabs and permuted in
# memory) and as w.t().contiguous(); each is resharded with
# `tp-reshard SRC --to tp2 --threads 2`, warm page cache, the sources taking
# turns, by this build and, side by side where BENCH_BASE_BIN names one, by
# an older build's bin/ (the "before" of a change). The table gives medians
# and each transposed source's time against the contiguous one of the same
# build. The outputs of the transposed source are checked equal to the
# contiguous one's (tp-ckpt diff).
# Writes docs/BENCHMARKS.md (section bench-dcp-strided).
#   BENCH_DCP_STRIDED_N (default 4096): the tensor's side (test_bench: 256)
#   BENCH_REPS (default 3): repetitions
#   BENCH_BASE_BIN: the bin/ directory of another build to compare with
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
N=${BENCH_DCP_STRIDED_N:-4096}
REPS=${BENCH_REPS:-3}
BASE=${BENCH_BASE_BIN:-}
DIR="$SCRATCH_ROOT/dcp-strided"
mkdir -p "$DIR"
if [ "$(cat "$DIR/n" 2>/dev/null)" != "$N" ]; then
    rm -rf "$DIR/contiguous" "$DIR/transposed"
    $PY - tests/formats/dcp_torch.py "$DIR" "$N" <<'PYEOF'
import runpy, sys, torch
judge = runpy.run_path(sys.argv[1])
n = int(sys.argv[3])
w = torch.randn(n, n, generator=torch.Generator().manual_seed(0))
assert not w.t().is_contiguous()
judge["alone"](lambda rank, ranks: judge["save"]({"w": w.t()}, sys.argv[2] + "/transposed"))
judge["alone"](lambda rank, ranks: judge["save"]({"w": w.t().contiguous()}, sys.argv[2] + "/contiguous"))
PYEOF
    echo "$N" >"$DIR/n"
fi
BUILDS="after=$BUILD/bin"
[ -n "$BASE" ] && BUILDS="before=$BASE $BUILDS"
RESULTS="$DIR/results.txt"
: >"$RESULTS"
for rep in $(seq 1 "$REPS"); do
    for build in $BUILDS; do
        sources="contiguous transposed"
        [ $((rep % 2)) = 0 ] && sources="transposed contiguous"
        for source in $sources; do
            rm -rf "$DIR/out"
            find "$DIR/$source" -type f -exec cat {} + >/dev/null
            m=$(measure "${build#*=}/tp-reshard" "$DIR/$source" --to tp2 --threads 2 -o "$DIR/out" 2>/dev/null)
            echo "${build%%=*} $source $m" >>"$RESULTS"
            echo "rep $rep ${build%%=*} $source: $m"
        done
    done
done
# The transposed source reads as the contiguous one: bit-exact.
for build in $BUILDS; do
    rm -rf "$DIR/out" "$DIR/out.c"
    "${build#*=}/tp-reshard" "$DIR/transposed" --to tp2 -o "$DIR/out" >/dev/null
    "${build#*=}/tp-reshard" "$DIR/contiguous" --to tp2 -o "$DIR/out.c" >/dev/null
    "$BUILD/bin/tp-ckpt" diff "$DIR/out" "$DIR/out.c" >/dev/null
done
rm -rf "$DIR/out" "$DIR/out.c"
TABLE=$($PY - "$RESULTS" <<'PYEOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    build, source, m = line.split(" ", 2)
    m = json.loads(m)
    if m["status"] != 0:
        sys.exit("bench-dcp-strided: %s %s failed with status %s" % (build, source, m["status"]))
    runs.setdefault((build, source), []).append(m)
print("| build | source | runs (s) | median | against its contiguous | peak RSS |")
print("| --- | --- | --- | --- | --- | --- |")
for build in ("before", "after"):
    if (build, "contiguous") not in runs:
        continue
    base = statistics.median(m["seconds"] for m in runs[(build, "contiguous")])
    for source in ("contiguous", "transposed"):
        ms = runs[(build, source)]
        med = statistics.median(m["seconds"] for m in ms)
        print("| %s | %s | %s | %.2f s | %.1fx | %.0f MB |" % (build, source, ", ".join("%.2f" % m["seconds"] for m in ms), med,
              med / base if base > 0 else 0.0, max(m["max_rss_bytes"] for m in ms) / 1e6))
PYEOF
)
echo "$TABLE"
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
BASE_NOTE=""
[ -n "$BASE" ] && BASE_NOTE=", BENCH_BASE_BIN=DIR: the bin/ of the build before"
doc_section bench-dcp-strided "A DCP chunk stored transposed (bench-dcp-strided)" <<DOC
Command: \`scripts/bench-dcp-strided.sh\` (BENCH_DCP_STRIDED_N=$N, BENCH_REPS=$REPS$BASE_NOTE). CPU: $CPU; $(openblas_kernel).
PyTorch saved one fp32 [$N, $N] tensor \`w\` with \`FileSystemWriter\`, once as \`w.t()\` (strides (1, $N)) and once
as \`w.t().contiguous()\`; each resharded with \`tp-reshard SRC --to tp2 --threads 2\`, warm page cache, the sources
taking turns; medians. The transposed source's output equals the contiguous one's (tp-ckpt diff).

$TABLE
DOC
