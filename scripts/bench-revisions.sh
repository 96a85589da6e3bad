#!/bin/sh
# make bench-revisions BENCH_BASE=REV: the programs of this tree against those
# of revision REV, side by side in one run, for a change that should cost
# nothing (a restructuring): both built the same way (CPU only, -O2), then,
# taking turns going first, a reshard of a 2 GiB checkpoint (bf16 weights,
# fp32 master and Adam state, tp4pp2 -> tp2pp1, 512M memory limit), its
# verification, a GGUF export, 12 training steps of the small GPT and 4 of a
# GPT at sequence 1024 (time and peak memory: attention's activations). The
# source is read into the page cache before each run and outputs go to a
# tmpfs where there is one (/dev/shm): what is compared is the programs'
# own work, not the disk's, whose speed on a shared machine varies by 3x from
# run to run. Writes docs/BENCHMARKS.md (section bench-revisions).
#   BENCH_BASE (default HEAD~1): the revision to compare with
#   BENCH_REPS (default 4, even): repetitions
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BASE=${BENCH_BASE:-HEAD~1}
REPS=${BENCH_REPS:-4}
REPS=$(( (REPS + 1) / 2 * 2 )) # even: each version goes first as often as second
DIR=bench/scratch/revisions
BASE_SHA=$(git rev-parse --short "$BASE")
mkdir -p "$DIR"
OUT="$DIR/out"
if [ -d /dev/shm ] && [ -w /dev/shm ]; then OUT=/dev/shm/tp-bench-revisions; fi

# Both builds: the base in a worktree of its own, this tree as it is.
rm -rf "$DIR/base"
git worktree prune
git worktree add -f --detach "$DIR/base" "$BASE" >/dev/null
make -C "$DIR/base" -s -j2 CUDA=0 BUILD=build programs >/dev/null
make -s -j2 CUDA=0 BUILD="$DIR/current" programs >/dev/null
BASE_BIN="$DIR/base/build/bin" CURRENT_BIN="$DIR/current/bin"

"$CURRENT_BIN/tp-ckpt" synth -o "$DIR/src" --tp 4 --pp 2 --layers 8 --dim 1024 --heads 16 --vocab 50257 \
    --seq 1024 --optim --dtype bf16 --seed 1 --force >/dev/null

RESULTS="$DIR/results.txt"
: >"$RESULTS"
run_case() { # VERSION CASE BIN
    version=$1 case=$2 bin=$3
    rm -rf "$OUT" "$OUT.gguf"
    cat "$DIR"/src/*.h5 >/dev/null
    sleep 1
    case $case in
    reshard) line=$(measure "$bin/tp-reshard" "$DIR/src" --to tp2pp1 -o "$OUT" --memory-limit 512M 2>/dev/null) ;;
    verify) line=$(measure "$bin/tp-ckpt" verify "$DIR/src" 2>/dev/null) ;;
    export) line=$(measure "$bin/tp-ckpt" export "$DIR/src" --format gguf -o "$OUT.gguf" 2>/dev/null) ;;
    train)
        tokens=$("$bin/tp-train" --model small --steps 12 --micro-batch 2 --threads 2 | sed -n 's/^done.*(\([0-9]*\) tokens\/s).*/\1/p')
        line="{\"tokens_per_s\": $tokens, \"status\": 0}" ;;
    train1024) line=$(measure "$bin/tp-train" --layers 4 --dim 256 --heads 4 --vocab 256 --seq 1024 --micro-batch 4 \
        --steps 4 --threads 2 --quiet 2>/dev/null) ;;
    esac
    echo "$version $case $line" >>"$RESULTS"
}
for rep in $(seq 1 "$REPS"); do
    if [ $((rep % 2)) = 1 ]; then order="base current"; else order="current base"; fi
    for case in reshard verify export train train1024; do
        for version in $order; do
            if [ $version = base ]; then run_case base $case "$BASE_BIN"; else run_case current $case "$CURRENT_BIN"; fi
        done
    done
done
git worktree remove --force "$DIR/base"
rm -rf "$OUT" "$OUT.gguf"
OUT_NOTE=$( [ "$OUT" = "$DIR/out" ] && echo "on disk" || echo "on tmpfs")

$PY - "$RESULTS" "$BASE_SHA" "$REPS" "$OUT_NOTE" <<'PYEOF' | $PY bench/doc_section.py docs/BENCHMARKS.md bench-revisions "Against an earlier revision (bench-revisions)"
import json, statistics, sys
path, base, reps, out_note = sys.argv[1:5]
runs = {}
for line in open(path):
    version, case, data = line.split(" ", 2)
    r = json.loads(data)
    if r["status"] != 0:
        sys.exit(f"{version} {case} failed")
    runs.setdefault((case, version), []).append(r)


def ratio(case, key):
    """Geometric mean of this tree's figure over the base's, repetition by
    repetition: the versions swap places every repetition, so what the
    position alone does cancels out."""
    pairs = zip(runs[(case, "current")], runs[(case, "base")])
    return statistics.geometric_mean(c[key] / b[key] for c, b in pairs)


print(f"Command: `make bench-revisions` (BENCH_BASE={base}, BENCH_REPS={reps}).")
print("Both revisions built with CUDA=0 and -O2. Checkpoint: GPT, dim 1024, 8 layers, vocabulary 50257, bf16 weights")
print("with fp32 master weights and Adam moments, tp4pp2 (2.0 GiB), in the page cache before every run; outputs")
print(f"{out_note}. The versions swap places every repetition (on this machine a run right after another is often")
print("up to 2.5x slower, whichever it is); figures are means, the ratio the geometric mean of the repetitions' ratios.")
print()
print("| case | base | this tree | this tree / base |")
print("| --- | --- | --- | --- |")
names = {"reshard": "reshard tp4pp2 -> tp2pp1, 512M", "verify": "tp-ckpt verify", "export": "export GGUF",
         "train1024": "tp-train 4 layers, dim 256, seq 1024, batch 4, 4 steps"}
for case in ("reshard", "verify", "export", "train1024"):
    b = statistics.mean(r["seconds"] for r in runs[(case, "base")])
    c = statistics.mean(r["seconds"] for r in runs[(case, "current")])
    rb = max(r["max_rss_bytes"] for r in runs[(case, "base")]) / 2**20
    rc = max(r["max_rss_bytes"] for r in runs[(case, "current")]) / 2**20
    print(f"| {names[case]} | {b:.2f} s, {rb:.0f} MiB | {c:.2f} s, {rc:.0f} MiB | {ratio(case, 'seconds'):.2f}x time |")
b = statistics.mean(r["tokens_per_s"] for r in runs[("train", "base")])
c = statistics.mean(r["tokens_per_s"] for r in runs[("train", "current")])
print(f"| tp-train small, 12 steps, 2 threads | {b:.0f} tokens/s | {c:.0f} tokens/s | "
      f"{ratio('train', 'tokens_per_s'):.2f}x throughput |")
PYEOF
echo "bench-revisions: written to docs/BENCHMARKS.md"
