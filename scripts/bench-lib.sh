# bench-lib.sh: what the benchmark scripts share. Sourced, from the repository root.
# The Python of the cross-checks: Debian's, with torch, h5py and numpy;
# TP_PYTHON names another (a GPU machine's, scripts/gpu-check.sh).
PY=${TP_PYTHON:-/usr/bin/python3}

# Settings every benchmark takes, here so that they mean the same everywhere
# (tests/e2e/test_bench.sh runs each benchmark tiny with them):
#   BENCH_DOC (default docs/BENCHMARKS.md): the Markdown file whose section
#     the benchmark rewrites (bench-elastic and bench-remote: only one given)
#   BENCH_SCRATCH (default bench/scratch): the scratch root; each benchmark
#     keeps a directory of its own under it
#   BENCH_TMPFS (default /dev/shm): where a benchmark keeps what must be in
#     memory (bench-remote's stores, bench-revisions' outputs), each in a
#     directory of its own made there
#   BENCH_SETTLE (default 2): seconds of pause after dropping the page cache,
#     for the writeback it started to settle before a cold run (bench-revisions:
#     the pause before every run, 1 there)
#   BENCH_DROP (default all): all drops the whole page cache where allowed;
#     files evicts only the benchmark's own files (a test, so as not to slow
#     the tests running beside it)
# and the GPT shape of the checkpoint benchmarks (bench-ckpt, -reshard,
# -export), whose size knob then sets the number of layers:
#   BENCH_DIM (default 2048), BENCH_VOCAB (default 50257); 16 heads
DOC=${BENCH_DOC:-docs/BENCHMARKS.md}
SCRATCH_ROOT=${BENCH_SCRATCH:-bench/scratch}
TMPFS_ROOT=${BENCH_TMPFS:-/dev/shm}
SETTLE=${BENCH_SETTLE:-2}
DROP=${BENCH_DROP:-all}
DIM=${BENCH_DIM:-2048}
VOCAB=${BENCH_VOCAB:-50257}

# doc_section NAME TITLE <BODY: writes the benchmark's section of $DOC.
doc_section() { $PY bench/doc_section.py "$DOC" "$@"; }

# drop_cache DIR...: a cold page cache. Drops the whole cache when allowed
# (root outside a container) and asked for (BENCH_DROP=all), else evicts the
# files under the given directories, which is what a benchmark then reads.
drop_cache() {
    sync
    if [ "$DROP" = all ] && [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches
    else $PY - "$@" <<'PYEOF'
import os, sys
for root in sys.argv[1:]:
    for d, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
PYEOF
    fi
}

# cold_cache DIR...: drop_cache, then the pause before a cold run.
cold_cache() { drop_cache "$@"; sleep "$SETTLE"; }

# measure CMD...: one JSON line of wall seconds, peak RSS and exit status.
measure() { $PY bench/measure.py "$@"; }
# openblas_kernel: "OpenBLAS kernel: NAME (OPENBLAS_CORETYPE=X, or unset)", the kernel
# OpenBLAS itself chose or was told (bench/product_peak asks it), for a
# section's notes: the variable alone says nothing where it is unset.
openblas_kernel() {
    core=$("${BUILD:-build}/bench/product_peak" 1 16 | $PY -c 'import json, sys; print(json.load(sys.stdin)["openblas_core"])')
    told=" unset"
    [ -n "${OPENBLAS_CORETYPE:-}" ] && told="=$OPENBLAS_CORETYPE"
    echo "OpenBLAS kernel: $core (OPENBLAS_CORETYPE$told)"
}
# measured_seconds: measure's JSON (stdin) as its seconds (%.2f); a run that
# failed stops the benchmark, naming it, rather than be a result.
measured_seconds() {
    $PY -c 'import json, sys
d = json.loads(sys.stdin.read())
if d["status"] != 0:
    sys.exit("bench: a measured run failed (status %s): no result of a failure (its output: above)" % d["status"])
print("%.2f" % d["seconds"])'
}

# gpt_layers BILLIONS: layers of a dim-$DIM GPT of about that many parameters
# (12 * dim^2 per layer), even so that it splits over two pipeline stages;
# at least 2 (BILLIONS 0: the smallest).
gpt_layers() {
    $PY -c "import sys; print(max(2, round(float(sys.argv[1]) * 1e9 / (12 * int(sys.argv[2]) ** 2) / 2) * 2))" "$1" "$DIM"
}

# same_shape CKPT LAYERS: whether CKPT, an earlier run's checkpoint, is a GPT
# of LAYERS layers, dim $DIM and vocabulary $VOCAB (then kept, not written
# again); false when there is none.
same_shape() {
    "${BUILD:-build}/bin/tp-ckpt" info "$1" --json 2>/dev/null | $PY -c '
import json, sys
try:
    m = json.load(sys.stdin)["model"]
except ValueError:
    sys.exit(1)
sys.exit([m["layers"], m["dim"], m["vocab"]] != list(map(int, sys.argv[1:])))' "$2" "$DIM" "$VOCAB"
}

# tensor_bytes CKPT: the bytes of CKPT's tensors (tp-ckpt info), what the
# benchmarks' GB/s count.
tensor_bytes() {
    "${BUILD:-build}/bin/tp-ckpt" info "$1" --json |
        $PY -c 'import json,sys; print(sum(t["bytes"] for t in json.load(sys.stdin)["tensors"]))'
}

# size_text BYTES DIGITS: "N GB" with DIGITS decimals, or "N MB" below 0.1 GB,
# so that a tiny run's text says its real size.
size_text() {
    $PY -c 'import sys; b, d = float(sys.argv[1]), int(sys.argv[2]); print("%.*f GB" % (d, b / 1e9) if b >= 1e8 else "%.1f MB" % (b / 1e6))' "$1" "$2"
}

# rounds REPS RESULTS DIR TOOL...: REPS rounds; in each, every tool runs from
# a cold page cache (cold_cache DIR), then from a warm one (warm_source), the
# tools taking turns going first so that none always follows the same one.
# Before each run clean_outputs; the run is the caller's `run_tool TOOL`,
# which prints measure's JSON line; "CACHE TOOL JSON" goes to RESULTS.
rounds() {
    reps=$1 results=$2 dir=$3
    shift 3
    : >"$results"
    for rep in $(seq 1 "$reps"); do
        order="$*"
        for _ in $(seq 2 "$rep"); do order="${order#* } ${order%% *}"; done
        for cache in cold warm; do
            for tool in $order; do
                clean_outputs
                if [ $cache = cold ]; then cold_cache "$dir"; else warm_source; fi
                m=$(run_tool "$tool")
                echo "$cache $tool $m" >>"$results"
                echo "rep $rep $cache $tool: $m"
            done
        done
    done
}
