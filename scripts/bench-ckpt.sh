#!/bin/sh
# make bench-ckpt: checkpoint write and read throughput against cp of the
# same bytes, side by side in one run, cold and warm page cache, uncompressed
# and zstd. Writes the table into docs/BENCHMARKS.md (section bench-ckpt).
#   BENCH_GB (default 4): checkpoint size; BENCH_REPS (default 5): repetitions.
#   BENCH_DIM, BENCH_VOCAB, and where it writes: scripts/bench-lib.sh (a tiny
#   run: BENCH_GB=0.002 BENCH_DIM=64 BENCH_VOCAB=256, one layer, 2.4 MB)
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
GB=${BENCH_GB:-4}
REPS=${BENCH_REPS:-5}
DIR="$SCRATCH_ROOT/ckpt"
BENCH="$BUILD/bench/bench_ckpt"
mkdir -p "$DIR"
rm -rf "$DIR"/*

field() { /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
timed() {
    /usr/bin/python3 -c 'import subprocess, sys, time
t = time.monotonic(); subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); print(time.monotonic() - t)' "$@"
}

RESULTS="$DIR/results.txt"
: >"$RESULTS"
for rep in $(seq 1 "$REPS"); do
    for level in 0 3; do
        rm -rf "$DIR/c$level" "$DIR/copy.bin"
        drop_cache "$DIR"
        out=$("$BENCH" write "$DIR/c$level" --gb "$GB" --compress $level --dim "$DIM" --vocab "$VOCAB")
        bytes=$(field "$out" bytes)
        write=$(field "$out" seconds)
        if [ ! -f "$DIR/src.bin" ]; then cat "$DIR"/c0/*.h5 >"$DIR/src.bin"; fi
        cat "$DIR/src.bin" >/dev/null # the copy's source is in memory, as the writer's is
        cp_write=$(timed sh -c "cp '$DIR/src.bin' '$DIR/copy.bin' && sync '$DIR/copy.bin'")
        # Cold: the two readers take turns going first; each starts from a settled,
        # dropped cache.
        settle() { cold_cache "$DIR"; }
        if [ $((rep % 2)) -eq 1 ]; then
            settle; read_cold=$(field "$("$BENCH" read "$DIR/c$level")" seconds)
            settle; cp_cold=$(timed cp "$DIR/src.bin" /dev/null)
        else
            settle; cp_cold=$(timed cp "$DIR/src.bin" /dev/null)
            settle; read_cold=$(field "$("$BENCH" read "$DIR/c$level")" seconds)
        fi
        # Warm: best of three, interleaved, so a noisy neighbour hurts both alike.
        cat "$DIR"/c$level/*.h5 "$DIR/src.bin" >/dev/null
        read_warm=999999 cp_warm=999999
        for i in 1 2 3; do
            t=$(field "$("$BENCH" read "$DIR/c$level")" seconds)
            read_warm=$(/usr/bin/python3 -c "print(min($read_warm, $t))")
            t=$(timed cp "$DIR/src.bin" /dev/null)
            cp_warm=$(/usr/bin/python3 -c "print(min($cp_warm, $t))")
        done
        src_bytes=$(stat -c %s "$DIR/src.bin")
        echo "$level $bytes $src_bytes $write $cp_write $read_cold $cp_cold $read_warm $cp_warm" >>"$RESULTS"
        echo "rep $rep zstd=$level: write ${write}s (cp ${cp_write}s), read cold ${read_cold}s (cp ${cp_cold}s), warm ${read_warm}s (cp ${cp_warm}s)"
    done
done
# The checkpoints and the copy's source (about 3 x BENCH_GB) go: the next run
# writes them anew whatever it finds; the results stay.
rm -rf "$DIR/copy.bin" "$DIR/c0" "$DIR/c3" "$DIR/src.bin"

SIZE=$(size_text "$bytes" 1)
TABLE=$(/usr/bin/python3 - "$RESULTS" "$GB" "$REPS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
out = []
out.append("| case | checkpoint | cp of the same bytes | ratio (median of %s) |" % sys.argv[3])
out.append("| --- | --- | --- | --- |")
for level in ("0", "3"):
    sel = [list(map(float, r[1:])) for r in rows if r[0] == level]
    name = "uncompressed" if level == "0" else "zstd level 3"
    for label, ours, theirs in (("write (fsynced)", 2, 3), ("read, cold cache", 4, 5), ("read, warm cache", 6, 7)):
        # throughput in logical bytes for the checkpoint, file bytes for cp
        ratios = [(r[0] / r[ours]) / (r[1] / r[theirs]) for r in sel]
        a = statistics.median(r[0] / r[ours] for r in sel) / 1e9
        b = statistics.median(r[1] / r[theirs] for r in sel) / 1e9
        out.append("| %s, %s | %.2f GB/s | %.2f GB/s | %.2fx |" % (name, label, a, b, statistics.median(ratios)))
print("\n".join(out))
PY
)
echo "$TABLE"
doc_section bench-ckpt "Checkpoint write and read (bench-ckpt)" <<DOC
Command: \`make bench-ckpt\` (BENCH_GB=$GB, BENCH_REPS=$REPS).
The checkpoint holds weights and Adam moments (fp32) of a GPT with dim $DIM and vocabulary $VOCAB ($SIZE of
tensors); its writer takes data from memory and commits (fsync); its reader streams every piece through an 8 MiB
buffer per thread and checks every block checksum. \`cp\` copies the concatenated shard files: for writing,
from a warm source to a new file then \`sync\`; for reading, to /dev/null. Cold runs start after dropping the page
cache and a pause, the two readers taking turns to go first; warm figures are the best of three interleaved runs.
Ratios are medians over the repetitions of per-repetition ratios. Throughput counts tensor bytes (uncompressed) for
the checkpoint and file bytes for cp.

$TABLE
DOC
